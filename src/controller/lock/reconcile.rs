//! The `DistributedLock` reconciler's entry point: the finalizer, then validate → observe the policy → decide →
//! dispatch to the actions.

use std::sync::Arc;
use std::time::Duration;

use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::finalizer::{Event as FinalizerEvent, finalizer};
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};

use super::actions;
use super::actions::holding::{DueRefresh, refresh_permits};
use super::claim::{self, ClaimStep, Custody, QuorumSeen, custody_of};
use super::decide::{LockAction, acquisition_in_status, current_holder, known_floor};
use super::handover::rule::Release;
use super::handover::{give_up, release};
use super::permit_count::{is_semaphore, permits_of};
use super::permit_plan::{PermitStep, plan_permit};
use super::policy::{Policy, Turn};
use super::settings::{LockSettings, QuorumRules, lock_settings};
use super::status::permits::status_of;
use super::status::write::forget_written;
use super::target::Target;
use super::{FINALIZER, RESYNC};
use crate::api::{DistributedLock, DistributedLockStatus};
use crate::controller::engines::{QuorumEngine, QuorumLookup};
use crate::controller::error::Error;
use crate::controller::keeper::{HeldView, PermitRef};
use crate::controller::lock::controller_state::LockContext;
use crate::redlock::{KeepPolicy, permit_key};

/// How soon a Job semaphore with a permit that has something to do is looked at again.
const SEMAPHORE_RETRY: Duration = Duration::from_millis(500);

/// How soon a lock is looked at again while its quorum's engine is being built (the quorum reconciler also wakes
/// it then).
const QUORUM_ENGINE_RETRY: Duration = Duration::from_secs(1);

/// How soon a lock whose claim met a newer version is looked at again (its watch event usually comes first).
const CLAIM_RETRY: Duration = Duration::from_millis(200);

/// How soon a lock is looked at again while the watch caches are still receiving their first lists.
const CACHE_SYNC_RETRY: Duration = Duration::from_millis(100);

pub async fn reconcile(lock: Arc<DistributedLock>, ctx: Arc<LockContext>) -> Result<Action, Error> {
    let lref = ObjectRef::from_obj(&*lock);
    if !ctx.leadership.is_leader() {
        tracing::debug!(lock = %lref, "standby: not reconciling");
        return Ok(Action::await_change());
    }
    tracing::debug!(lock = %lref, "reconciling");
    if !ctx.caches_synced() {
        // A Job or pod missing from a cache that has not received its first list is not gone: deciding on it
        // would release a running Job's lock and suspend the Job (seen on a real cluster after a restart).
        tracing::debug!(lock = %lref, "watch caches not synced yet: waiting");
        return Ok(Action::requeue(CACHE_SYNC_RETRY));
    }
    match custody_of(&lock, &ctx.installation) {
        Custody::Ours => {}
        Custody::Unclaimed => {
            if lock.meta().deletion_timestamp.is_none() {
                match claim_step_for(&lock, &ctx) {
                    ClaimStep::Claim => {}
                    ClaimStep::WaitForQuorum => return Ok(Action::requeue(QUORUM_ENGINE_RETRY)),
                    ClaimStep::LeaveUnclaimed(note) => {
                        claim::leave_unclaimed(&lock, &ctx, note).await;
                        // The quorum reconciler wakes the lock when the quorum's engine changes.
                        return Ok(Action::requeue(RESYNC));
                    }
                }
            }
            if !claim::claim(&lock, &ctx).await? {
                // Changed since it was read: its next version (another installation's claim, perhaps) decides.
                return Ok(Action::requeue(CLAIM_RETRY));
            }
            if lock.meta().deletion_timestamp.is_none()
                && !lock.finalizers().iter().any(|name| name == FINALIZER)
            {
                // The claim added the finalizer too: the claimed version, which the watch brings (a finalizer
                // change wakes the lock), goes on; the finalizer helper would add it again to the version read.
                return Ok(Action::await_change());
            }
        }
        Custody::Other(other) => {
            claim::leave_alone(&lock, &ctx, other).await;
            return Ok(Action::await_change());
        }
    }
    if lock.meta().deletion_timestamp.is_some()
        && lock.finalizers().iter().any(|name| name == FINALIZER)
        && let Some(wait) = hand_over_before_deletion(&lock, &ctx).await?
    {
        // The finalizer stays until the validity shown to the holder has ended (a `Cleanup` that returns
        // removes it).
        return Ok(Action::requeue(wait));
    }
    let api: Api<DistributedLock> =
        Api::namespaced(ctx.client.clone(), &lock.namespace().unwrap_or_default());
    let result = finalizer(&api, FINALIZER, lock, |event| async {
        match event {
            FinalizerEvent::Apply(lock) => apply(&lock, &ctx).await,
            FinalizerEvent::Cleanup(lock) => release::cleanup(&lock, &ctx).await,
        }
    })
    .await;
    match result {
        Ok(action) => {
            ctx.succeeded(&lref);
            Ok(action)
        }
        Err(err) => Err(Error::of_finalizer(err)),
    }
}

/// Whether to claim unclaimed `lock` now, by what this installation knows of its quorum.
fn claim_step_for(lock: &DistributedLock, ctx: &LockContext) -> ClaimStep {
    let quorum = &lock.spec.quorum;
    let lookup = ctx.engines.lookup(quorum);
    let seen = match &lookup {
        QuorumLookup::Ready(_) => QuorumSeen::Ready,
        QuorumLookup::Missing if ctx.quorum_exists(quorum) != Some(false) => QuorumSeen::Building,
        QuorumLookup::Missing => QuorumSeen::Missing,
        QuorumLookup::Unusable(problem) => QuorumSeen::Unusable(problem),
    };
    claim::claim_step(quorum, seen)
}

pub fn error_policy(lock: Arc<DistributedLock>, error: &Error, ctx: Arc<LockContext>) -> Action {
    ctx.backoff(&ObjectRef::from_obj(&*lock), error, "distributedlock")
}

/// What the lock's quorum decides for its settings.
fn rules_of(engine: &QuorumEngine) -> QuorumRules<'_> {
    let config = engine.engine.config();
    QuorumRules {
        max_ttl: config.max_ttl,
        node_timeout: config.node_timeout,
        shared_keys: engine.shared_keys.as_ref(),
    }
}

/// A lock being deleted gives its keys up as on a move, after fencing its holders: a leader loses the label first
/// (so that no pod keeps the label of a lock that is gone while another holder takes the key), a running Job is
/// suspended. Then the keys are not extended any more and are released once the validity shown to each holder
/// has ended, or sooner once the holder is known to have stopped (its pod deleted once finished; the Job's pods gone) — a holder
/// learns of the deletion only through its watch, or not at all when cut off from the API server (found by the
/// product safety checker; released at once, a Job's key went to a `lock` process 43 ms after `kubectl delete`
/// while the Job's pod still ran). `Some(wait)`: the finalizer stays that much longer.
async fn hand_over_before_deletion(
    lock: &DistributedLock,
    ctx: &LockContext,
) -> Result<Option<Duration>, Error> {
    if matches!(ctx.engines.lookup(&lock.spec.quorum), QuorumLookup::Missing)
        && ctx.quorum_exists(&lock.spec.quorum) != Some(false)
    {
        // Right after a start the quorum's engine is not built yet: without it nothing can be released, and the
        // finalizer removed now would leave the keys to expire, shown to no one as releasing. The quorum
        // reconciler wakes the lock when the engine is there.
        return Ok(Some(QUORUM_ENGINE_RETRY));
    }
    let permits: Vec<PermitRef> = permits_of(lock).collect();
    let observed = observe_for_deletion(lock, ctx);
    let policy = observed.as_ref().and_then(|(_, policy)| policy.as_ref());
    let mut waits = Vec::new();
    for permit in &permits {
        if let Some(at) = give_up::settle(ctx, lock, permit, policy).await? {
            waits.push(at);
        }
    }
    if let Some(at) = waits.into_iter().max() {
        return Ok(Some(give_up::until(at)));
    }
    let Some((settings, policy)) = observed else {
        return Ok(None);
    };
    let mut notes = Vec::new();
    match &policy {
        Some(Policy::Leader(election)) => election.unlabel_all_but(&[]).await?,
        Some(Policy::Jobs(queue)) => {
            for permit in &permits {
                let status = status_of(lock, permit.permit);
                let kept = ctx
                    .keeper
                    .view(permit)
                    .map(|held| (held.lease.holder().to_owned(), held.token));
                let shown = acquisition_in_status(&status).map(|(job, token)| (job.to_owned(), token));
                if let Some((job, token)) = kept.or(shown)
                    && queue.fence_for_deletion(ctx, &job, token).await?
                {
                    notes.push(format!("Job {job} suspended"));
                }
            }
        }
        Some(Policy::Identity(_)) | None => {}
    }
    let mut release_at = None;
    for permit in &permits {
        let key = permit_key(&settings.key, permit.permit);
        let gave_up = match give_up::give_up_kept(ctx, lock, permit, policy.as_ref()).await? {
            Some(gave_up) => Some(gave_up),
            None => match give_up::shown_in_status(ctx, lock, permit.permit, &settings.quorum, &key)? {
                Some(given) => Some(give_up::give_up(ctx, lock, permit, policy.as_ref(), given).await?),
                None => None,
            },
        };
        if let Some(gave_up) = gave_up
            && let Release::At(at) = gave_up.release
        {
            release_at = release_at.max(Some(at));
            notes.push(if permits.len() > 1 {
                format!("permit {}: {}", permit.permit, gave_up.note())
            } else {
                gave_up.note()
            });
        }
    }
    let Some(at) = release_at else {
        return Ok(None);
    };
    let note = format!("deleted: {}; the finalizer stays until then", notes.join("; "));
    ctx.publish(lock, EventType::Normal, "Releasing", note).await;
    Ok(Some(give_up::until(at)))
}

/// The settings of a lock being deleted, where they can still be had (its quorum usable, its spec valid), and its
/// holder policy unless its selector cannot be evaluated. Only who is to be fenced and whether each holder has
/// stopped are asked of the policy: who would hold next does not matter.
fn observe_for_deletion(lock: &DistributedLock, ctx: &LockContext) -> Option<(LockSettings, Option<Policy>)> {
    let QuorumLookup::Ready(engine) = ctx.engines.lookup(&lock.spec.quorum) else {
        return None;
    };
    let namespace = lock.namespace().unwrap_or_default();
    let settings = lock_settings(&lock.spec, &namespace, &lock.name_any(), &rules_of(&engine)).ok()?;
    let policy = Policy::observe(ctx, lock, &settings, vec![(None, 0)]).ok();
    Some((settings, policy))
}

async fn apply(lock: &DistributedLock, ctx: &LockContext) -> Result<Action, Error> {
    let lref = ObjectRef::from_obj(lock);
    let engine = match ctx.engines.lookup(&lock.spec.quorum) {
        QuorumLookup::Ready(engine) => engine,
        QuorumLookup::Missing if ctx.quorum_exists(&lock.spec.quorum) != Some(false) => {
            // The quorum exists (or the cache is still syncing) but its engine is not built yet, as right after
            // a start: status is left alone — it may show a lock a predecessor holds — and the quorum
            // reconciler wakes this lock when the engine is there.
            return Ok(Action::requeue(QUORUM_ENGINE_RETRY));
        }
        QuorumLookup::Missing => {
            let message = quorum_not_found(&lock.spec.quorum, ctx.quorum_selector.as_deref());
            return actions::wait::quorum_not_ready(lock, ctx, "QuorumNotFound", message).await;
        }
        QuorumLookup::Unusable(problem) => {
            let message = format!(
                "RedisQuorum `{}` cannot be used ({}): {problem}",
                lock.spec.quorum,
                problem.reason()
            );
            return actions::wait::quorum_not_ready(lock, ctx, "QuorumNotReady", message).await;
        }
    };
    let namespace = lock.namespace().unwrap_or_default();
    let config = engine.engine.config();
    let settings = match lock_settings(&lock.spec, &namespace, &lock.name_any(), &rules_of(&engine)) {
        Ok(settings) => settings,
        Err(invalid) => {
            return actions::wait::invalid_spec(lock, ctx, invalid.reason, invalid.message).await;
        }
    };
    let mut keep = KeepPolicy::for_ttl(settings.ttl, config.node_timeout);
    if let Some(margin) = settings.fence_margin {
        keep.fence_margin = margin;
    }
    apply_permits(lock, ctx, lref, settings, engine, keep).await
}

/// Every permit of the lock: one for a plain lock (its permit 0, on the lock's own key and status), spec.permits
/// for a semaphore. The policy is observed for every permit at once (Job fencing plans the queue over the
/// permits, leader election elects a pod per permit), then each permit goes through the one-permit steps on its
/// own key with its own holder, token and status entry (`status::permits`), so one permit's loss, hand-over or
/// wait touches no other.
async fn apply_permits(
    lock: &DistributedLock,
    ctx: &LockContext,
    lref: ObjectRef<DistributedLock>,
    settings: LockSettings,
    engine: Arc<QuorumEngine>,
    keep: KeepPolicy,
) -> Result<Action, Error> {
    let semaphore = is_semaphore(lock);
    // What an earlier reconciliation wrote (one that ended early, on an error) is no base for this one's writes.
    forget_written(ctx, lock);
    // Permits above spec.permits, left from a higher count, are looked after until their holders are fenced
    // and their keys released: the policy hands them to nobody.
    let permits: Vec<PermitRef> = permits_of(lock).collect();
    let states: Vec<(Option<String>, i64)> = permits
        .iter()
        .map(|permit| {
            let status = status_of(lock, permit.permit);
            let held = ctx.keeper.view(permit);
            let current = current_holder(held.as_ref(), &status);
            (current, known_floor(&status, ctx.keeper.highest_token(permit)))
        })
        .collect();
    let mut policy = match Policy::observe(ctx, lock, &settings, states) {
        Ok(policy) => policy,
        Err(message) => {
            return actions::wait::invalid_spec(lock, ctx, "InvalidSelector", message).await;
        }
    };
    let mut actions = Vec::with_capacity(permits.len());
    let shared = Shared {
        lock,
        lref,
        settings,
        engine,
        keep,
    };
    // Lost permits are fenced before the policy prepares (reads the API server for) the others' steps, and a loss
    // found while it does interrupts it: the fence goes first, then the preparation starts again.
    let mut pending = permits;
    loop {
        let mut lost_left = Vec::new();
        let mut rest = Vec::with_capacity(pending.len());
        for permit in pending {
            match fence_before_preparing(ctx, &shared, &policy, &permit).await? {
                Some(action) => actions.push(action),
                None => {
                    if ctx.keeper.is_lost(&permit) {
                        lost_left.push(permit.permit);
                    }
                    rest.push(permit);
                }
            }
        }
        pending = rest;
        let newly_lost = || {
            pending
                .iter()
                .any(|permit| !lost_left.contains(&permit.permit) && ctx.keeper.is_lost(permit))
        };
        if prepare_unless_lost(&mut policy, ctx, newly_lost).await? {
            break;
        }
    }
    // The keeper wakes a lock when one permit's status is due, and each permit falls due on its own schedule: a
    // semaphore would be looked at once per permit per refresh, each look reading its whole pod or Job cache.
    // When one is due, every held permit's status is refreshed with it (showing a validity early is always
    // true), so their schedules line up and one look serves them all.
    let refresh_all = semaphore
        && pending
            .iter()
            .any(|permit| ctx.keeper.view(permit).is_some_and(|held| held.status_due));
    let mut due = Vec::new();
    while let Some(permit) = next_permit(&mut pending, |permit| ctx.keeper.is_lost(permit)) {
        if let Some(at) = give_up::settle(ctx, lock, &permit, Some(&policy)).await? {
            // A key given up waits for the validity shown to its holder to end: nobody takes the permit
            // meanwhile, and status says until when (written when it was given up).
            actions.push(Action::requeue(give_up::until(at)));
            continue;
        }
        let status = status_of(lock, permit.permit);
        let held = ctx.keeper.view(&permit).map(|mut held| {
            held.status_due |= refresh_all;
            held
        });
        let latest_token = known_floor(&status, ctx.keeper.highest_token(&permit));
        let target = shared.target(&policy, permit.permit);
        let step = plan_permit(
            policy.permit_turn(lock, permit.permit),
            target.seen(held.as_ref(), &status, latest_token, semaphore),
        );
        tracing::debug!(permit = permit.permit, ?step, "planned");
        // A semaphore's held permits whose step is only a status refresh go in one status write, below.
        let batched = semaphore && step.is_status_refresh();
        let step = match step {
            PermitStep::Idle => continue,
            PermitStep::Hold { holder, .. } if batched => {
                if let Some(held) = held {
                    due.push(DueRefresh { target, holder, held });
                }
                continue;
            }
            step => step,
        };
        let steps = carry_out(&target, ctx, step, held, &status);
        let action = if semaphore {
            // The reconcile's span names the lock; this one the permit, for every line its steps log.
            let span = tracing::info_span!("permit", permit = permit.permit);
            tracing::Instrument::instrument(steps, span).await?
        } else {
            steps.await?
        };
        actions.push(action);
    }
    // The held permits' refreshes go in one status write; a permit whose status no longer allows it goes through
    // the one-permit steps (it is given up and acquired again).
    if !due.is_empty() {
        actions.extend(due.iter().map(|_| Action::requeue(RESYNC)));
        for refused in refresh_permits(ctx, lock, due).await? {
            let action =
                actions::acquire::refresh_status(&refused.target, ctx, &refused.holder, &refused.held)
                    .await?;
            actions.push(action);
        }
    }
    // Status follows the Jobs or pods the lock selects: the queue or candidates the steps above left shown are
    // written again where they changed since (a Job queued while the lock was held, say).
    actions::policy_status::follow(ctx, lock, &policy, shared.keep.fence_margin).await?;
    // Whether the holders shown still ask the operator: a holder that cannot reach it runs nothing (or has
    // stopped), which the lock says, and the verdict may change by time alone.
    let recheck = actions::holder_liveness::follow(ctx, lock, &policy, shared.settings.ttl).await?;
    forget_written(ctx, lock);
    if let Some(recheck) = recheck {
        let idle = |action: &Action| *action == Action::requeue(RESYNC) || *action == Action::await_change();
        if actions.iter().all(idle) {
            return Ok(Action::requeue(recheck));
        }
    }
    if !semaphore && let [only] = actions.as_slice() {
        // A plain lock's one permit says when it is looked at again.
        return Ok(only.clone());
    }
    // What each permit asked for is not readable from an `Action`: a permit with something to do soon is looked
    // at again soon (a lost permit, a due status and every Job or pod change wake the lock anyway).
    let settled = actions
        .iter()
        .all(|action| *action == Action::requeue(RESYNC) || *action == Action::await_change());
    Ok(if settled {
        Action::requeue(RESYNC)
    } else {
        Action::requeue(SEMAPHORE_RETRY)
    })
}

/// What every permit of one lock shares in a reconcile.
struct Shared<'a> {
    lock: &'a DistributedLock,
    lref: ObjectRef<DistributedLock>,
    settings: LockSettings,
    engine: Arc<QuorumEngine>,
    keep: KeepPolicy,
}

impl<'a> Shared<'a> {
    /// The target of `permit`'s steps: the lock's settings on the permit's own key.
    fn target(&self, policy: &'a Policy, permit: u32) -> Target<'a> {
        let mut settings = self.settings.clone();
        settings.key = permit_key(&self.settings.key, permit);
        Target {
            lock: self.lock,
            lref: self.lref.clone(),
            permit,
            settings,
            engine: self.engine.clone(),
            keep: self.keep,
            policy,
        }
    }
}

/// A permit the keeper found lost, whose holder the policy names without reading anything again (its turn is to
/// hold it), is fenced before the policy prepares the other permits' steps: a fence needs no fresh read, and the
/// preparation re-lists the lock's pods whenever a Job is about to be let run, which took a second on the test
/// API server in realistic mode — a Job lock of three permits, its pods without the guard, then ran up to 0.6 s
/// past its validity (issue 29's late fence). `None`: the permit goes through the usual steps.
async fn fence_before_preparing(
    ctx: &LockContext,
    shared: &Shared<'_>,
    policy: &Policy,
    permit: &PermitRef,
) -> Result<Option<Action>, Error> {
    let lock = shared.lock;
    let Some(held) = ctx.keeper.view(permit).filter(|held| held.lost.is_some()) else {
        return Ok(None);
    };
    let turn = policy.permit_turn(lock, permit.permit);
    if !matches!(turn, Turn::Hold(_)) {
        return Ok(None);
    }
    if let Some(at) = give_up::settle(ctx, lock, permit, Some(policy)).await? {
        return Ok(Some(Action::requeue(give_up::until(at))));
    }
    let status = status_of(lock, permit.permit);
    let latest_token = known_floor(&status, ctx.keeper.highest_token(permit));
    let target = shared.target(policy, permit.permit);
    let step = plan_permit(
        turn,
        target.seen(Some(&held), &status, latest_token, is_semaphore(lock)),
    );
    let steps = carry_out(&target, ctx, step, Some(held), &status);
    Ok(Some(if is_semaphore(lock) {
        let span = tracing::info_span!("permit", permit = permit.permit);
        tracing::Instrument::instrument(steps, span).await?
    } else {
        steps.await?
    }))
}

/// Prepares the policy's steps (`true`), unless `lost` finds a permit of the lock lost meanwhile (`false`): the
/// preparation's reads are dropped, to be made again once that permit's holder is fenced. Its writes (suspending
/// stray Jobs, removing stray labels) are made again too if dropped in flight; each is idempotent.
async fn prepare_unless_lost(
    policy: &mut Policy,
    ctx: &LockContext,
    lost: impl Fn() -> bool,
) -> Result<bool, Error> {
    let prepare = policy.prepare(ctx);
    tokio::pin!(prepare);
    loop {
        let found = ctx.keeper.loss_found();
        if lost() {
            return Ok(false);
        }
        tokio::select! {
            biased;
            prepared = &mut prepare => return prepared.map(|()| true),
            () = found => {}
        }
    }
}

/// The next permit to look at: one the keeper has found lost, before any other, so that its holder is fenced
/// without waiting for the other permits' work (an acquisition waiting on a master, a write on a busy API
/// server); else the next in order. Asked again before each permit: a loss found meanwhile goes next.
fn next_permit(pending: &mut Vec<PermitRef>, is_lost: impl Fn(&PermitRef) -> bool) -> Option<PermitRef> {
    if pending.is_empty() {
        return None;
    }
    let lost = pending.iter().position(is_lost);
    Some(pending.remove(lost.unwrap_or(0)))
}

/// Carries out `step` for `target`'s permit, on what this replica keeps of it (`held`) and its `status`.
async fn carry_out(
    target: &Target<'_>,
    ctx: &LockContext,
    step: PermitStep,
    held: Option<HeldView>,
    status: &DistributedLockStatus,
) -> Result<Action, Error> {
    let (holder, action) = match step {
        PermitStep::Idle => return Ok(Action::requeue(RESYNC)),
        PermitStep::Wait(waiting) => return actions::wait::wait_for_policy(target, ctx, &waiting).await,
        PermitStep::ResumeFenced { job, token } => {
            return actions::fence::resume_fenced(target, ctx, &job, token).await;
        }
        PermitStep::ReleaseFinished { job } => {
            return release::release_finished(target, ctx, held.as_ref(), &job).await;
        }
        PermitStep::Requeue { job, token } => return actions::fence::requeue(target, ctx, &job, token).await,
        PermitStep::Hold { holder, action } => (holder, action),
    };
    match action {
        LockAction::Keep { write_status } => match held {
            Some(held) if write_status => actions::acquire::refresh_status(target, ctx, &holder, &held).await,
            _ => Ok(Action::requeue(RESYNC)),
        },
        LockAction::ReportLost { reason } => {
            actions::fence::report_lost(target, ctx, &holder, &reason.to_string(), None).await
        }
        LockAction::ReleaseHeld => release::release_for_change(target, ctx, held, &holder).await,
        LockAction::ReleasePrevious {
            token,
            holder: previous,
        } => release::release_previous(target, ctx, &holder, token, &previous).await,
        LockAction::Resume { token } => actions::acquire::resume(target, ctx, &holder, token, status).await,
        LockAction::Acquire { floor } => actions::acquire::acquire(target, ctx, &holder, floor).await,
    }
}

/// Why a lock's quorum is not there: it does not exist, or (with `--quorum-selector`) this installation does not look
/// at it. Pure.
fn quorum_not_found(quorum: &str, selector: Option<&str>) -> String {
    match selector {
        None => {
            format!("RedisQuorum `{quorum}` does not exist: create it, or set spec.quorum to an existing one")
        }
        Some(selector) => format!(
            "RedisQuorum `{quorum}` does not exist or is not one this installation looks at (--quorum-selector \
             `{selector}`): label it so, or set spec.quorum to one that is"
        ),
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;

    use kube::runtime::reflector::ObjectRef;

    use super::*;

    #[test]
    fn a_lost_permit_is_looked_at_first_even_when_found_lost_midway() {
        let lock: ObjectRef<DistributedLock> = ObjectRef::new("shards").within("a");
        let mut pending: Vec<PermitRef> = (0..4)
            .map(|permit| PermitRef::new(lock.clone(), permit))
            .collect();
        let lost = RefCell::new(vec![2]);
        let mut order = Vec::new();
        while let Some(permit) = next_permit(&mut pending, |permit| lost.borrow().contains(&permit.permit)) {
            order.push(permit.permit);
            lost.borrow_mut().retain(|number| *number != permit.permit);
            if permit.permit == 0 {
                // Permit 3's holder is found lost while permit 0 is being looked at.
                lost.borrow_mut().push(3);
            }
        }
        assert_eq!(order, [2, 0, 3, 1]);
    }

    #[test]
    fn a_missing_quorum_is_explained_by_the_quorum_selector_when_there_is_one() {
        let plain = super::quorum_not_found("q", None);
        assert!(plain.contains("does not exist: create it"), "{plain}");
        let scoped = super::quorum_not_found("q", Some("team=a"));
        assert!(
            scoped.contains("is not one this installation looks at"),
            "{scoped}"
        );
        assert!(scoped.contains("--quorum-selector `team=a`"), "{scoped}");
    }
}
