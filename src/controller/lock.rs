//! The `DistributedLock` reconciler: validate → decide ([`super::lock_decide`]) → act on Redis and write
//! status. Extension itself is the keeper's job ([`super::holdings`]); it wakes this reconciler when a lock is
//! lost or its status is due.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::finalizer::{self, Event as FinalizerEvent, finalizer};
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use rand::Rng;
use tokio::time::Instant;

use super::context::{Context, Error};
use super::engines::{QuorumEngine, QuorumLookup};
use super::holdings::LockRef;
use super::job_queue::JobStep;
use super::jobs::JobQueue;
use super::leader::Election;
use super::lock_decide::{LockAction, Wanted, contended_retry, decide, resume_still_possible};
use super::lock_holder::{Chosen, Holder, holder_for};
use super::lock_settings::{LockSettings, lock_settings};
use super::lock_status::{masters, not_held, show_released, show_slow_jobs, write_held, write_status};
use crate::api::conditions;
use crate::api::{DistributedLock, DistributedLockStatus, LockPhase};
use crate::redlock::{AcquireError, ExtendError, FailureKind, KeepPolicy, Lease, OperationReport};
use crate::telemetry::metrics::OutcomeLabels;

/// Present while the operator may still hold the lock's key: deletion waits for the release.
pub const FINALIZER: &str = "redlock.io/release";

/// A held lock is looked at again at least this often even when nothing wakes it.
pub(super) const RESYNC: Duration = Duration::from_secs(300);

pub async fn reconcile(lock: Arc<DistributedLock>, ctx: Arc<Context>) -> Result<Action, Error> {
    let lref = ObjectRef::from_obj(&*lock);
    if !ctx.leadership.is_leader() {
        tracing::debug!(lock = %lref, "standby: not reconciling");
        return Ok(Action::await_change());
    }
    let namespace = lock.namespace().unwrap_or_default();
    let api: Api<DistributedLock> = Api::namespaced(ctx.client.clone(), &namespace);
    let result = finalizer(&api, FINALIZER, lock, |event| async {
        match event {
            FinalizerEvent::Apply(lock) => apply(&lock, &ctx).await,
            FinalizerEvent::Cleanup(lock) => cleanup(&lock, &ctx).await,
        }
    })
    .await;
    match result {
        Ok(action) => {
            ctx.succeeded(&lref);
            Ok(action)
        }
        Err(finalizer::Error::ApplyFailed(err) | finalizer::Error::CleanupFailed(err)) => Err(err),
        Err(other) => Err(Error::Finalizer(other.to_string())),
    }
}

pub fn error_policy(lock: Arc<DistributedLock>, error: &Error, ctx: Arc<Context>) -> Action {
    ctx.backoff(&ObjectRef::from_obj(&*lock), error, "distributedlock")
}

/// What the reconciler works with once the spec and the quorum are known to be usable.
pub(super) struct Target<'a> {
    pub(super) lock: &'a DistributedLock,
    pub(super) lref: LockRef,
    pub(super) settings: LockSettings,
    pub(super) holder: String,
    pub(super) engine: Arc<QuorumEngine>,
    pub(super) policy: KeepPolicy,
    /// Leader election: the pods, and the label and annotations to keep on the leader.
    pub(super) election: Option<Election>,
    /// Job fencing: the Jobs queued for the lock.
    pub(super) jobs: Option<JobQueue>,
}

async fn apply(lock: &DistributedLock, ctx: &Context) -> Result<Action, Error> {
    let lref = ObjectRef::from_obj(lock);
    let namespace = lock.namespace().unwrap_or_default();
    let engine = match ctx.engines.lookup(&lock.spec.quorum) {
        QuorumLookup::Ready(engine) => engine,
        QuorumLookup::Missing if ctx.quorum_exists(&lock.spec.quorum) != Some(false) => {
            // The quorum exists (or the cache is still syncing) but its engine is not built yet, as right after
            // a start: status is left alone — it may show a lock a predecessor holds — and the quorum
            // reconciler wakes this lock when the engine is there.
            return Ok(Action::requeue(Duration::from_secs(1)));
        }
        QuorumLookup::Missing => {
            let message = format!(
                "RedisQuorum `{}` does not exist: create it, or set spec.quorum to an existing one",
                lock.spec.quorum
            );
            return quorum_not_ready(lock, ctx, "QuorumNotFound", message).await;
        }
        QuorumLookup::Unusable { reason, message } => {
            let message = format!(
                "RedisQuorum `{}` cannot be used ({reason}): {message}",
                lock.spec.quorum
            );
            return quorum_not_ready(lock, ctx, "QuorumNotReady", message).await;
        }
    };
    let max_ttl = engine.engine.config().max_ttl;
    let settings = match lock_settings(&lock.spec, &namespace, &lock.name_any(), max_ttl) {
        Ok(settings) => settings,
        Err(invalid) => {
            return not_ready(
                lock,
                ctx,
                LockPhase::Invalid,
                invalid.reason,
                invalid.message,
                None,
            )
            .await;
        }
    };
    let status = lock.status.clone().unwrap_or_default();
    let held = ctx.holdings.view(&lref);
    let Chosen {
        holder,
        election,
        jobs,
    } = match holder_for(lock, ctx, &settings, held.as_ref(), &status).await? {
        Holder::Chosen(chosen) => *chosen,
        Holder::Done(action) => return Ok(action),
    };
    let mut policy = KeepPolicy::for_ttl(settings.ttl, engine.engine.config().node_timeout);
    if let Some(margin) = settings.fence_margin {
        policy.fence_margin = margin;
    }
    let target = Target {
        lock,
        lref: lref.clone(),
        settings,
        holder,
        engine,
        policy,
        election,
        jobs,
    };
    if let Some(JobStep::ResumeFenced { job, token }) = target.jobs.as_ref().map(|jobs| jobs.step.clone()) {
        return resume_fenced(&target, ctx, &job, token).await;
    }
    let wanted = Wanted {
        holder: &target.holder,
        key: &target.settings.key,
        quorum: &target.settings.quorum,
    };
    let action = decide(wanted, held.as_ref(), &status, ctx.holdings.highest_token(&lref));
    tracing::debug!(lock = %lref, ?action, "decided");
    match action {
        LockAction::Keep { write_status } => {
            if write_status
                && let Some(held) = held
                && !write_held(&target, ctx, &held.lease, held.token, false).await?
            {
                // Status shows a newer token than ours: this acquisition is stale for everyone who fences on
                // the token. Give it up and acquire above that token.
                tracing::warn!(lock = %lref, token = held.token, "a newer fencing token is in status: re-acquiring above it");
                release_held(ctx, &lref, Some(held.quorum)).await;
                return Ok(Action::requeue(Duration::from_millis(10)));
            }
            Ok(Action::requeue(RESYNC))
        }
        LockAction::ReportLost { reason } => report_lost(&target, ctx, &reason.to_string()).await,
        LockAction::ReleaseHeld => {
            let previous = held
                .as_ref()
                .map(|held| held.lease.holder().to_owned())
                .unwrap_or_default();
            release_held(ctx, &lref, held.map(|held| held.quorum)).await;
            let note = format!(
                "released for {previous}: the spec now wants {} on `{}`",
                target.holder, target.settings.key
            );
            ctx.publish(lock, EventType::Normal, "Released", note.clone())
                .await;
            show_released(ctx, lock, &note).await?;
            Ok(Action::requeue(Duration::from_millis(10)))
        }
        LockAction::ReleasePrevious { token, holder } => release_previous(&target, ctx, token, &holder).await,
        LockAction::Resume { token } => resume(&target, ctx, token, &status).await,
        LockAction::Acquire { token } => acquire(&target, ctx, token).await,
    }
}

async fn acquire(target: &Target<'_>, ctx: &Context, token: i64) -> Result<Action, Error> {
    ctx.ensure_leader()?;
    let uid = target.lock.uid().unwrap_or_default();
    let value = ctx
        .secret
        .lock_value(&target.settings.key, &uid, token, &target.holder)?;
    let started = Instant::now();
    let result = target
        .engine
        .engine
        .try_acquire(&target.settings.key, target.settings.ttl, value)
        .await;
    let outcome = match &result {
        Ok(_) => "acquired",
        Err(AcquireError::NotAcquired {
            kind: FailureKind::Contended,
            ..
        }) => "contended",
        Err(AcquireError::NotAcquired { .. }) => "unavailable",
        Err(_) => "error",
    };
    ctx.metrics
        .acquire_seconds
        .get_or_create(&OutcomeLabels {
            outcome: outcome.to_owned(),
        })
        .observe(started.elapsed().as_secs_f64());
    match result {
        Ok(lease) => {
            // Kept from this moment: the status write below takes an API round trip of the validity.
            keep(target, ctx, &lease, token);
            match write_held(target, ctx, &lease, token, true).await {
                Ok(true) => {
                    let note = format!(
                        "{} holds the lock with fencing token {token} ({} of {} masters)",
                        target.holder,
                        lease.report().votes(),
                        lease.report().nodes.len()
                    );
                    tracing::info!(lock = %target.lref, token, holder = %target.holder, "acquired");
                    ctx.publish(target.lock, EventType::Normal, "Acquired", note)
                        .await;
                    Ok(Action::requeue(RESYNC))
                }
                Ok(false) => {
                    // Another writer advanced the token first: this acquisition is not the lock's.
                    release_held(ctx, &target.lref, Some(target.settings.quorum.clone())).await;
                    Ok(Action::requeue(Duration::from_secs(1)))
                }
                Err(err) => {
                    release_held(ctx, &target.lref, Some(target.settings.quorum.clone())).await;
                    Err(err)
                }
            }
        }
        Err(AcquireError::NotAcquired { kind, report, .. }) => waiting(target, ctx, kind, &report).await,
        Err(AcquireError::Config(err)) => {
            not_ready(
                target.lock,
                ctx,
                LockPhase::Invalid,
                "InvalidTtl",
                err.to_string(),
                None,
            )
            .await
        }
        Err(AcquireError::Value(err)) => Err(Error::Value(err)),
    }
}

/// Not acquired: say who or what blocks it, and try again after a pause.
async fn waiting(
    target: &Target<'_>,
    ctx: &Context,
    kind: FailureKind,
    report: &OperationReport,
) -> Result<Action, Error> {
    let ttl = target.settings.ttl;
    let (phase, reason, message, retry) = match kind {
        FailureKind::Contended => {
            let blocker = report
                .blocking_holder()
                .unwrap_or_else(|| "another holder".into());
            (
                LockPhase::Contended,
                "Contended",
                format!("key `{}` is held by {blocker}; retrying", target.settings.key),
                contended_retry(ttl, rand::rng().random()),
            )
        }
        FailureKind::TooFewMasters => (
            LockPhase::Pending,
            "QuorumUnavailable",
            format!(
                "too few masters of RedisQuorum `{}` can vote ({}); {} are needed; retrying",
                target.settings.quorum,
                report.unreachable_summary(),
                report.quorum
            ),
            Duration::from_secs(2),
        ),
        FailureKind::ValidityExhausted => (
            LockPhase::Pending,
            "SlowMasters",
            "a majority granted the lock too slowly to leave any validity; retrying".to_owned(),
            Duration::from_millis(200),
        ),
    };
    let blocked_by = report.blocking_holder();
    let before = target.lock.status.as_ref().and_then(|status| status.phase);
    let generation = target.lock.meta().generation;
    let written = write_status(ctx, target.lock, |current| {
        let mut next = current.clone();
        next.phase = Some(phase);
        next.holder = None;
        next.blocked_by = blocked_by.clone();
        next.masters = masters(report);
        next.quorum = Some(format!("{}/{}", report.votes(), report.nodes.len()));
        next.observed_generation = generation;
        if let Some(election) = &target.election {
            next.candidates = election.candidates.clone();
        }
        if let Some(jobs) = &target.jobs {
            next.queue = jobs.queue.clone();
            show_slow_jobs(&mut next, jobs, target.policy.fence_margin, generation);
        }
        not_held(&mut next, reason, &message, generation);
        Some(next)
    })
    .await?;
    if written && before != Some(phase) {
        let type_ = if phase == LockPhase::Contended {
            EventType::Normal
        } else {
            EventType::Warning
        };
        ctx.publish(target.lock, type_, reason, message).await;
    }
    Ok(Action::requeue(retry))
}

async fn resume(
    target: &Target<'_>,
    ctx: &Context,
    token: i64,
    status: &DistributedLockStatus,
) -> Result<Action, Error> {
    ctx.ensure_leader()?;
    match take_back(target, ctx, token, &target.holder).await? {
        Ok(lease) => {
            tracing::info!(lock = %target.lref, token, "resumed a lock held by a previous replica");
            write_held(target, ctx, &lease, token, false).await?;
            Ok(Action::requeue(RESYNC))
        }
        Err(ExtendError::NoQuorum { .. } | ExtendError::Expired { .. })
            if resume_still_possible(status, target.policy.fence_margin, Timestamp::now()) =>
        {
            Ok(Action::requeue(target.policy.retry_interval))
        }
        Err(ExtendError::Lost { holder, .. }) => {
            let by = holder.unwrap_or_else(|| "another holder".into());
            report_lost(
                target,
                ctx,
                &format!("taken over by {by} while no replica was extending it"),
            )
            .await
        }
        Err(err) => {
            report_lost(
                target,
                ctx,
                &format!("could not be resumed after a controller restart: {err}"),
            )
            .await
        }
    }
}

async fn report_lost(target: &Target<'_>, ctx: &Context, reason: &str) -> Result<Action, Error> {
    if let Some(election) = &target.election {
        // Fenced first: the Service stops reaching the pod before anything else happens.
        let holder = ctx
            .holdings
            .view(&target.lref)
            .map(|held| held.lease.holder().to_owned());
        election
            .unlabel(ctx, holder.as_deref().unwrap_or(&target.holder))
            .await?;
    }
    match &target.jobs {
        Some(jobs) => {
            // Suspended first. The keys are left to expire rather than released: if the masters come back
            // before they do, the Job resumes with its own token instead of going stale.
            let token = ctx.holdings.view(&target.lref).map_or(0, |held| held.token);
            jobs.fence(ctx, &target.holder, token, reason).await?;
            ctx.holdings.remove(&target.lref).await;
        }
        None => {
            release_held(ctx, &target.lref, Some(target.settings.quorum.clone())).await;
        }
    }
    let generation = target.lock.meta().generation;
    let message = format!("lock lost: {reason}; re-acquiring");
    let written = write_status(ctx, target.lock, |current| {
        let mut next = current.clone();
        next.phase = Some(LockPhase::Lost);
        next.transitions += 1;
        next.observed_generation = generation;
        conditions::set(
            &mut next.conditions,
            "Held",
            false,
            "Lost",
            message.clone(),
            generation,
            Timestamp::now(),
        );
        Some(next)
    })
    .await?;
    if written {
        tracing::warn!(lock = %target.lref, %reason, "lock lost");
        ctx.publish(target.lock, EventType::Warning, "Lost", message)
            .await;
    }
    Ok(Action::requeue(contended_retry(
        target.settings.ttl,
        rand::rng().random(),
    )))
}

async fn release_previous(
    target: &Target<'_>,
    ctx: &Context,
    token: i64,
    holder: &str,
) -> Result<Action, Error> {
    ctx.ensure_leader()?;
    let uid = target.lock.uid().unwrap_or_default();
    let value = ctx.secret.lock_value(&target.settings.key, &uid, token, holder)?;
    target
        .engine
        .engine
        .release_value(&target.settings.key, value)
        .await;
    let message = format!("released for {holder}: the holder changed to {}", target.holder);
    show_released(ctx, target.lock, &message).await?;
    ctx.publish(target.lock, EventType::Normal, "Released", message)
        .await;
    Ok(Action::requeue(Duration::from_millis(10)))
}

async fn cleanup(lock: &DistributedLock, ctx: &Context) -> Result<Action, Error> {
    ctx.ensure_leader()?;
    let lref = ObjectRef::from_obj(lock);
    let held_quorum = ctx.holdings.view(&lref).map(|held| held.quorum);
    let released = match held_quorum {
        Some(quorum) => release_held(ctx, &lref, Some(quorum)).await,
        None => release_from_status(lock, ctx).await?,
    };
    if let Some(report) = released {
        let note = format!(
            "released on deletion ({} of {} masters deleted the key)",
            report.votes(),
            report.nodes.len()
        );
        ctx.publish(lock, EventType::Normal, "Released", note).await;
    }
    Ok(Action::await_change())
}

/// A predecessor's acquisition named in status: rebuild its value and delete it.
pub(super) async fn release_from_status(
    lock: &DistributedLock,
    ctx: &Context,
) -> Result<Option<OperationReport>, Error> {
    let Some(status) = &lock.status else {
        return Ok(None);
    };
    let (Some(LockPhase::Held | LockPhase::Lost), Some(holder), Some(token)) =
        (status.phase, &status.holder, status.fencing_token)
    else {
        return Ok(None);
    };
    let QuorumLookup::Ready(engine) = ctx.engines.lookup(&lock.spec.quorum) else {
        return Ok(None);
    };
    let namespace = lock.namespace().unwrap_or_default();
    let key = lock
        .spec
        .resource_key
        .clone()
        .unwrap_or_else(|| format!("{namespace}/{}", lock.name_any()));
    let value = ctx
        .secret
        .lock_value(&key, &lock.uid().unwrap_or_default(), token, holder)?;
    Ok(Some(engine.engine.release_value(&key, value).await))
}

/// The lock's quorum cannot be used: waits (looked at again every 30 s, and at once when the quorum changes).
async fn quorum_not_ready(
    lock: &DistributedLock,
    ctx: &Context,
    reason: &str,
    message: String,
) -> Result<Action, Error> {
    not_ready(
        lock,
        ctx,
        LockPhase::Pending,
        reason,
        message,
        Some(Duration::from_secs(30)),
    )
    .await
}

/// Stops keeping the lock and deletes its key where it is still ours.
pub(super) async fn release_held(
    ctx: &Context,
    lref: &LockRef,
    quorum: Option<String>,
) -> Option<OperationReport> {
    let lease = ctx.holdings.remove(lref).await?;
    let quorum = quorum?;
    match ctx.engines.lookup(&quorum) {
        QuorumLookup::Ready(engine) => Some(engine.engine.release(&lease).await),
        _ => None,
    }
}

/// Hands `lease` to the keeper, which extends it from now on.
fn keep(target: &Target<'_>, ctx: &Context, lease: &Lease, token: i64) {
    let settings = &target.settings;
    ctx.holdings.insert(
        target.lref.clone(),
        lease.clone(),
        &settings.quorum,
        &settings.key,
        token,
        target.policy,
    );
}

/// Takes over the acquisition with `token` for `holder` (its value rebuilt from the installation secret) and
/// keeps it from now on; the inner error says why it could not be taken back.
async fn take_back(
    target: &Target<'_>,
    ctx: &Context,
    token: i64,
    holder: &str,
) -> Result<Result<Lease, ExtendError>, Error> {
    let uid = target.lock.uid().unwrap_or_default();
    let value = ctx.secret.lock_value(&target.settings.key, &uid, token, holder)?;
    let result = target
        .engine
        .engine
        .reclaim(&target.settings.key, target.settings.ttl, value)
        .await;
    if let Ok(lease) = &result {
        keep(target, ctx, lease, token);
    }
    Ok(result)
}

/// Job fencing: the Job whose lock was lost had its pods stopped and its token is still the latest — take the
/// lock back with that same token and let the Job run again. If the keys are gone, it is queued again to run
/// with a new token (or marked stale where that is refused).
async fn resume_fenced(target: &Target<'_>, ctx: &Context, job: &str, token: i64) -> Result<Action, Error> {
    ctx.ensure_leader()?;
    let Some(jobs) = &target.jobs else {
        return Ok(Action::await_change());
    };
    match take_back(target, ctx, token, job).await? {
        Ok(lease) => {
            if !write_held(target, ctx, &lease, token, false).await? {
                release_held(ctx, &target.lref, Some(target.settings.quorum.clone())).await;
                return Ok(Action::requeue(Duration::from_millis(10)));
            }
            jobs.resume(ctx, job, token).await?;
            Ok(Action::requeue(RESYNC))
        }
        // Too few masters answered to tell: the masters that hold the value or did not answer could still make
        // a majority. Nobody else can take the lock meanwhile either, so try again rather than give the token up.
        Err(ExtendError::NoQuorum { report }) if report.votes() + report.unreachable() >= report.quorum => {
            tracing::info!(lock = %target.lref, job, token, %report, "the fenced Job's lock cannot be taken back yet");
            Ok(Action::requeue(Duration::from_secs(1)))
        }
        Err(err) => {
            tracing::info!(lock = %target.lref, job, token, error = %err, "the fenced Job's lock cannot be taken back");
            jobs.requeue_or_mark_stale(ctx, job, token).await?;
            Ok(Action::requeue(Duration::from_millis(10)))
        }
    }
}

/// The spec or the quorum cannot be acted on: release whatever is held and say why.
pub(super) async fn not_ready(
    lock: &DistributedLock,
    ctx: &Context,
    phase: LockPhase,
    reason: &str,
    message: String,
    retry: Option<Duration>,
) -> Result<Action, Error> {
    let lref = ObjectRef::from_obj(lock);
    let held_quorum = ctx.holdings.view(&lref).map(|held| held.quorum);
    if held_quorum.is_some() {
        release_held(ctx, &lref, held_quorum).await;
    }
    let generation = lock.meta().generation;
    let before = lock.status.as_ref().and_then(|status| status.phase);
    let written = write_status(ctx, lock, |current| {
        let mut next = current.clone();
        next.phase = Some(phase);
        next.holder = None;
        next.blocked_by = None;
        next.observed_generation = generation;
        let now = Timestamp::now();
        conditions::set(
            &mut next.conditions,
            "Ready",
            false,
            reason,
            message.clone(),
            generation,
            now,
        );
        conditions::set(
            &mut next.conditions,
            "Held",
            false,
            reason,
            message.clone(),
            generation,
            now,
        );
        Some(next)
    })
    .await?;
    if written && before != Some(phase) {
        ctx.publish(lock, EventType::Warning, reason, message).await;
    }
    Ok(retry.map_or_else(Action::await_change, Action::requeue))
}
