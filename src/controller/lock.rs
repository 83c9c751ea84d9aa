//! The `DistributedLock` reconciler: validate → decide ([`super::lock_decide`]) → act on Redis and write
//! status. Extension itself is the keeper's job ([`super::holdings`]); it wakes this reconciler when a lock is
//! lost or its status is due.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, Time};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, PostParams};
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
use super::job_queue::{JobStep, LOCK_LABEL};
use super::jobs::JobQueue;
use super::leader::Election;
use super::lock_decide::{
    LockAction, Wanted, contended_retry, current_holder, decide, resume_still_possible,
};
use super::lock_settings::{HolderKind, LockSettings, lock_settings};
use crate::api::conditions;
use crate::api::lock::MasterOutcome;
use crate::api::{DistributedLock, DistributedLockStatus, LockPhase};
use crate::redlock::{AcquireError, ExtendError, FailureKind, KeepPolicy, Lease, OperationReport};
use crate::telemetry::metrics::OutcomeLabels;

/// Present while the operator may still hold the lock's key: deletion waits for the release.
pub const FINALIZER: &str = "redlock.io/release";

/// A held lock is looked at again at least this often even when nothing wakes it.
const RESYNC: Duration = Duration::from_secs(300);

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
struct Target<'a> {
    lock: &'a DistributedLock,
    lref: LockRef,
    settings: LockSettings,
    holder: String,
    engine: Arc<QuorumEngine>,
    policy: KeepPolicy,
    /// Leader election: the pods, and the label and annotations to keep on the leader.
    election: Option<Election>,
    /// Job fencing: the Jobs queued for the lock.
    jobs: Option<JobQueue>,
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
            return not_ready(
                lock,
                ctx,
                LockPhase::Pending,
                "QuorumNotFound",
                message,
                Some(Duration::from_secs(30)),
            )
            .await;
        }
        QuorumLookup::Unusable { reason, message } => {
            let message = format!(
                "RedisQuorum `{}` cannot be used ({reason}): {message}",
                lock.spec.quorum
            );
            return not_ready(
                lock,
                ctx,
                LockPhase::Pending,
                "QuorumNotReady",
                message,
                Some(Duration::from_secs(30)),
            )
            .await;
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
    let (holder, election, jobs) = match &settings.holder {
        HolderKind::Identity(holder) => (holder.clone(), None, None),
        HolderKind::LeaderElection => {
            let Some(policy) = &lock.spec.holder.leader_election else {
                return Ok(Action::await_change());
            };
            let current = current_holder(held.as_ref(), &status);
            let election = match Election::observe(ctx, lock, policy, current.as_deref()) {
                Ok(election) => election,
                Err(message) => {
                    return not_ready(lock, ctx, LockPhase::Invalid, "InvalidSelector", message, None).await;
                }
            };
            // The label stays only on a leader whose lock is held and who is still the one to lead; every
            // other pod loses it before the lock moves.
            let keep = held
                .as_ref()
                .filter(|held| held.lost.is_none())
                .map(|held| held.lease.holder().to_owned())
                .filter(|holder| election.chosen.as_deref() == Some(holder.as_str()));
            election.unlabel_all_but(ctx, keep.as_deref()).await?;
            match election.chosen.clone() {
                Some(chosen) => (chosen, Some(election), None),
                None => return no_candidates(lock, ctx, &election).await,
            }
        }
        HolderKind::Jobs => {
            let current = current_holder(held.as_ref(), &status);
            let latest = status
                .fencing_token
                .unwrap_or(0)
                .max(ctx.holdings.highest_token(&lref));
            let jobs = JobQueue::observe(ctx, lock, current.as_deref(), latest);
            jobs.suspend_strays(ctx, current.as_deref()).await?;
            match jobs.step.clone() {
                JobStep::Hold(job) | JobStep::Grant(job) => (job, None, Some(jobs)),
                JobStep::ResumeFenced { job, .. } => (job, None, Some(jobs)),
                JobStep::ReleaseFinished(job) => {
                    if release_held(ctx, &lref, held.map(|held| held.quorum))
                        .await
                        .is_none()
                    {
                        release_from_status(lock, ctx).await?;
                    }
                    let note = format!("released: Job {job} finished or is gone");
                    ctx.publish(lock, EventType::Normal, "Released", note.clone())
                        .await;
                    show_released(ctx, lock, &note).await?;
                    return Ok(Action::requeue(Duration::from_millis(10)));
                }
                JobStep::WaitForFenced(job) => {
                    let message =
                        format!("waiting for the pods of fenced Job {job} to stop before the next Job runs");
                    return waiting_for_jobs(lock, ctx, &jobs, "WaitingForFencedJob", message).await;
                }
                JobStep::MarkStale { job, token } => {
                    jobs.mark_stale(ctx, &job, token).await?;
                    return Ok(Action::requeue(Duration::from_millis(10)));
                }
                JobStep::Idle => {
                    let message = format!("no Job labelled {LOCK_LABEL}={} is waiting", lock.name_any());
                    return waiting_for_jobs(lock, ctx, &jobs, "QueueEmpty", message).await;
                }
            }
        }
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
async fn release_from_status(
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

/// Status after a release for a holder the spec no longer wants: nobody holds it, the next reconcile acquires.
async fn show_released(ctx: &Context, lock: &DistributedLock, message: &str) -> Result<bool, Error> {
    let generation = lock.meta().generation;
    write_status(ctx, lock, |current| {
        let mut next = current.clone();
        next.phase = Some(LockPhase::Pending);
        next.holder = None;
        next.observed_generation = generation;
        conditions::set(
            &mut next.conditions,
            "Held",
            false,
            "HolderChanged",
            message,
            generation,
            Timestamp::now(),
        );
        Some(next)
    })
    .await
}

/// The spec can be acted on, but the lock is not held, for `reason`.
fn not_held(status: &mut DistributedLockStatus, reason: &str, message: &str, generation: Option<i64>) {
    let now = Timestamp::now();
    let conditions = &mut status.conditions;
    conditions::set(
        conditions,
        "Ready",
        true,
        "Valid",
        "spec is valid and the quorum exists",
        generation,
        now,
    );
    conditions::set(conditions, "Held", false, reason, message, generation, now);
}

/// Stops keeping the lock and deletes its key where it is still ours.
async fn release_held(ctx: &Context, lref: &LockRef, quorum: Option<String>) -> Option<OperationReport> {
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
/// lock back with that same token and let the Job run again. If the keys are gone, it is marked stale.
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
        Err(err) => {
            tracing::info!(lock = %target.lref, job, token, error = %err, "the fenced Job's lock cannot be taken back");
            jobs.mark_stale(ctx, job, token).await?;
            Ok(Action::requeue(Duration::from_millis(10)))
        }
    }
}

/// Job fencing with no Job to grant now: status says why; a Job change wakes the lock.
async fn waiting_for_jobs(
    lock: &DistributedLock,
    ctx: &Context,
    jobs: &JobQueue,
    reason: &str,
    message: String,
) -> Result<Action, Error> {
    let generation = lock.meta().generation;
    write_status(ctx, lock, |current| {
        let mut next = current.clone();
        if next.phase != Some(LockPhase::Lost) {
            next.phase = Some(LockPhase::Pending);
        }
        next.holder = None;
        next.queue = jobs.queue.clone();
        next.observed_generation = generation;
        not_held(&mut next, reason, &message, generation);
        Some(next)
    })
    .await?;
    Ok(Action::requeue(Duration::from_secs(5)))
}

/// A Job whose pods may take longer to stop than the fence margin leaves: its fencing may come too late.
fn show_slow_jobs(
    status: &mut DistributedLockStatus,
    jobs: &JobQueue,
    margin: Duration,
    generation: Option<i64>,
) {
    let slow = jobs.slow(margin);
    let now = Timestamp::now();
    if slow.is_empty() {
        conditions::set(
            &mut status.conditions,
            "FencingMayBeLate",
            false,
            "GracePeriodsFit",
            "every queued Job's pods stop within the fence margin",
            generation,
            now,
        );
    } else {
        let names: Vec<String> = slow
            .iter()
            .map(|(job, grace)| format!("{job} ({}s)", grace.as_secs()))
            .collect();
        let message = format!(
            "the termination grace period of {} exceeds the fence margin ({}): their pods may outlive the lock's validity; lower terminationGracePeriodSeconds or raise spec.holder.jobs.fenceMargin",
            names.join(", "),
            humantime::format_duration(margin)
        );
        conditions::set(
            &mut status.conditions,
            "FencingMayBeLate",
            true,
            "GracePeriodTooLong",
            message,
            generation,
            now,
        );
    }
}

/// Leader election with no pod able to lead: nothing is held, and status says why. A pod becoming ready wakes
/// the lock.
async fn no_candidates(lock: &DistributedLock, ctx: &Context, election: &Election) -> Result<Action, Error> {
    let lref = ObjectRef::from_obj(lock);
    let held_quorum = ctx.holdings.view(&lref).map(|held| held.quorum);
    if held_quorum.is_some() {
        release_held(ctx, &lref, held_quorum).await;
    }
    let generation = lock.meta().generation;
    let message = "no pod matching spec.holder.leaderElection.selector is running and ready".to_owned();
    let before = lock.status.as_ref().and_then(|status| status.phase);
    let written = write_status(ctx, lock, |current| {
        let mut next = current.clone();
        next.phase = Some(LockPhase::Pending);
        next.holder = None;
        next.candidates = election.candidates.clone();
        next.observed_generation = generation;
        not_held(&mut next, "NoCandidates", &message, generation);
        Some(next)
    })
    .await?;
    if written && before == Some(LockPhase::Held) {
        ctx.publish(lock, EventType::Warning, "NoCandidates", message)
            .await;
    }
    Ok(Action::requeue(RESYNC))
}

/// The spec or the quorum cannot be acted on: release whatever is held and say why.
async fn not_ready(
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

/// Writes the Held status for `lease`. With `new_token`, only if status still shows an older token; without,
/// only if it shows no newer one — the resourceVersion precondition makes check and write one atomic step.
/// `Ok(false)`: a newer token is already there.
async fn write_held(
    target: &Target<'_>,
    ctx: &Context,
    lease: &Lease,
    token: i64,
    new_token: bool,
) -> Result<bool, Error> {
    let now = Instant::now();
    let wall_now = Timestamp::now();
    let valid_until = wall_at(lease.valid_until(), now, wall_now);
    let renewed_at = wall_at(lease.granted_at(), now, wall_now);
    let generation = target.lock.meta().generation;
    let holder = target.holder.clone();
    let holder_name = target.holder.clone();
    let written = write_status(ctx, target.lock, |current| {
        // The token in status never goes back: a new acquisition needs a higher one, a refresh the same.
        let shown = current.fencing_token.unwrap_or(0);
        if (new_token && shown >= token) || shown > token {
            return None;
        }
        let mut next = current.clone();
        if new_token {
            next.transitions += 1;
            next.acquired_at = Some(Time(wall_now));
        }
        next.phase = Some(LockPhase::Held);
        next.holder = Some(holder.clone());
        next.fencing_token = Some(token);
        next.renewed_at = Some(MicroTime(renewed_at));
        next.valid_until = Some(MicroTime(valid_until));
        next.quorum = Some(format!(
            "{}/{}",
            lease.report().votes(),
            lease.report().nodes.len()
        ));
        next.masters = masters(lease.report());
        next.blocked_by = None;
        next.observed_generation = generation;
        if let Some(election) = &target.election {
            next.candidates = election.candidates.clone();
        }
        if let Some(jobs) = &target.jobs {
            next.queue = jobs.queue.iter().filter(|job| **job != holder).cloned().collect();
            show_slow_jobs(&mut next, jobs, target.policy.fence_margin, generation);
        }
        conditions::set(
            &mut next.conditions,
            "Ready",
            true,
            "Valid",
            "spec is valid and the quorum exists",
            generation,
            wall_now,
        );
        conditions::set(
            &mut next.conditions,
            "Held",
            true,
            "Held",
            format!("held by {holder} with fencing token {token}"),
            generation,
            wall_now,
        );
        Some(next)
    })
    .await?;
    if written {
        ctx.holdings.note_token(&target.lref, token);
        ctx.holdings.status_written(&target.lref, lease.valid_until());
        if let Some(election) = &target.election {
            // Labelled only once status shows the new token, so what the pod reads agrees with status.
            election
                .label(ctx, &holder_name, token, &MicroTime(valid_until))
                .await?;
        }
        if let Some(jobs) = &target.jobs {
            // Granted only once status shows the token the Job is given.
            jobs.grant(
                ctx,
                &holder_name,
                token,
                &target.lock.name_any(),
                target.policy.fence_margin,
            )
            .await?;
        }
    }
    Ok(written)
}

/// Replaces the status with what `edit` makes of the current one, with the resourceVersion it was read at
/// as a precondition; on a conflict it reads the object again and asks `edit` again. `edit` returning `None`
/// means the write no longer applies: `Ok(false)`.
async fn write_status(
    ctx: &Context,
    lock: &DistributedLock,
    mut edit: impl FnMut(&DistributedLockStatus) -> Option<DistributedLockStatus>,
) -> Result<bool, Error> {
    let api: Api<DistributedLock> =
        Api::namespaced(ctx.client.clone(), &lock.namespace().unwrap_or_default());
    let mut current = lock.clone();
    for _ in 0..4 {
        let before = current.status.clone().unwrap_or_default();
        let Some(next) = edit(&before) else {
            return Ok(false);
        };
        if next == before {
            return Ok(true);
        }
        ctx.ensure_leader()?;
        current.status = Some(next);
        match api
            .replace_status(&lock.name_any(), &PostParams::default(), &current)
            .await
        {
            Ok(_) => return Ok(true),
            Err(kube::Error::Api(status)) if status.code == 409 => {
                current = api.get(&lock.name_any()).await?;
            }
            Err(err) => return Err(err.into()),
        }
    }
    Err(Error::Conflict)
}

fn masters(report: &OperationReport) -> Vec<MasterOutcome> {
    report
        .nodes
        .iter()
        .map(|node| MasterOutcome {
            endpoint: node.endpoint.clone(),
            outcome: node.outcome.label().to_owned(),
            message: match node.outcome.to_string() {
                text if text == node.outcome.label() => None,
                text => Some(text),
            },
        })
        .collect()
}

/// The wall-clock time of a monotonic instant, rounded to the millisecond towards `now` (conservative for ends).
fn wall_at(at: Instant, now: Instant, wall_now: Timestamp) -> Timestamp {
    let offset = if at >= now {
        SignedDuration::from_millis(i64::try_from((at - now).as_millis()).unwrap_or(i64::MAX))
    } else {
        -SignedDuration::from_millis(i64::try_from((now - at).as_millis()).unwrap_or(i64::MAX))
    };
    wall_now + offset
}
