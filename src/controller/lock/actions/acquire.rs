//! Acquiring a lock, taking over a predecessor's acquisition, and keeping status fresh while it is held.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use rand::Rng;
use tokio::time::Instant;

use super::holding::{keep, show_held, take_back};
use super::wait::not_ready;
use crate::api::{DistributedLock, DistributedLockStatus, LockPhase};
use crate::controller::error::Error;
use crate::controller::keeper::HeldView;
use crate::controller::lock::RESYNC;
use crate::controller::lock::acquisition::{Acquisition, Outcome, Record, Step, Then};
use crate::controller::lock::controller_state::LockContext;
use crate::controller::lock::decide::{contended_retry, resume_still_possible};
use crate::controller::lock::fair_queue::tickets::queued_retry;
use crate::controller::lock::handover::give_up::give_up_kept;
use crate::controller::lock::handover::release::release_held;
use crate::controller::lock::status::permits::status_of;
use crate::controller::lock::status::write::stamp_now;
use crate::controller::lock::target::Target;
use crate::controller::lock::tokens::earlier_values::{EarlierValue, blocking_labels, deletable};
use crate::controller::lock::tokens::floor_record;

use crate::controller::lock::status::write::write_permit_status;
use crate::controller::lock::status::{self, Blocked, Showing};
use crate::controller::lock::tokens::exhausted::{EXHAUSTED_REASON, Exhausted, Places, exhausted_message};
use crate::controller::lock::tokens::floor::record_name;
use crate::negative_controls::{self, Baseline, Control};
use crate::redlock::{
    AcquireError, ExtendError, FailureKind, Lease, NodeOutcome, OperationReport, ReleaseMark, Waiter,
};
use crate::telemetry::metrics::OutcomeLabels;

/// How often a lock whose token cannot advance, or whose floor record makes no sense, is looked at again.
const REPAIR_RETRY: Duration = Duration::from_secs(60);

/// How long the masters keep a lock that leaves a check until its key is won first in the key's queue without
/// hearing from it: three times [`QUEUE_KEEP`].
const STAYING_KEEP: Duration = Duration::from_secs(6);

/// Reason of `Ready=False` while the key's floor record makes no sense.
const INVALID_FLOOR: &str = "InvalidFencingFloor";

/// How soon an acquisition handed back to the reconciler comes again.
const AGAIN: Duration = Duration::from_millis(10);

/// Acquires the lock for `holder` with a fencing token above `floor` and above what the masters' counters
/// know; records the token in the key's floor record (giving the grant back and asking above the record when
/// the masters forgot), shows it, and hands the lock to the keeper. The record is read only after a grant: a
/// contended lock's retries cost the API nothing. What comes next is decided by [`Acquisition`]; this carries
/// its steps out.
pub async fn acquire(
    target: &Target<'_>,
    ctx: &LockContext,
    holder: &str,
    floor: i64,
) -> Result<Action, Error> {
    ctx.ensure_leader()?;
    let (quorum, key) = (&target.settings.quorum, &target.settings.key);
    // Above what the masters showed while refusing, too: a grant above the proposal would be given back, and
    // the give-back lets the waiter behind this lock take the key first.
    let floor = floor.max(ctx.lock_controller.queue_tickets.counter(key));
    let mut acquisition = Acquisition::new(floor, target.policy.checks_once_won());
    let stays_queued = acquisition.stays_queued();
    // What the last answer of the masters brought, for the steps that follow it ([`Acquisition`] takes those only
    // after such an answer; were one missing, the lock would be handed back to come again).
    let mut lease: Option<Lease> = None;
    let mut refusal: Option<OperationReport> = None;
    let mut step = acquisition.start();
    loop {
        let outcome = match step {
            Step::Ask { token, floor } => {
                match grant(target, ctx, holder, token, floor, stays_queued).await {
                    Ok(granted) => {
                        let token = granted.fencing_token();
                        lease = Some(granted);
                        Outcome::Granted { token }
                    }
                    Err(AcquireError::NotAcquired { kind, report, .. }) => {
                        refusal = Some(report);
                        Outcome::Refused { kind }
                    }
                    Err(AcquireError::TokenExhausted { counter, .. }) => {
                        Outcome::CounterExhausted { counter }
                    }
                    Err(AcquireError::Config(err)) => {
                        return not_ready(
                            target.lock,
                            ctx,
                            LockPhase::Invalid,
                            "InvalidTtl",
                            err.to_string(),
                            None,
                        )
                        .await;
                    }
                    Err(AcquireError::Value(err)) => return Err(Error::Value(err)),
                }
            }
            Step::Exhausted(exhausted) => return token_exhausted(target, ctx, &exhausted).await,
            Step::DeleteEarlierValues => {
                let any = match &refusal {
                    Some(report) => delete_earlier_values(target, ctx, report).await?,
                    None => false,
                };
                Outcome::EarlierValuesDeleted { any }
            }
            Step::Wait(kind) => {
                return match &refusal {
                    Some(report) => waiting(target, ctx, kind, report).await,
                    None => Ok(Action::requeue(AGAIN)),
                };
            }
            Step::KeepAndRecord { forget_ticket } => match &lease {
                Some(lease) => keep_and_record(target, ctx, lease, forget_ticket).await,
                None => return Ok(Action::requeue(AGAIN)),
            },
            Step::Recheck => recheck(target, ctx, holder, lease.as_ref()).await,
            Step::Hold { leave_queue } => {
                let Some(lease) = &lease else {
                    return Ok(Action::requeue(AGAIN));
                };
                if leave_queue {
                    target.engine.engine.leave_won(key, waiter_of(target, ctx));
                    ctx.lock_controller.queue_tickets.forget(key);
                }
                return hold(target, ctx, holder, lease).await;
            }
            Step::GiveBack(give) => {
                if give.stay_first {
                    ctx.lock_controller.queue_tickets.gave_back(key);
                }
                if give.kept {
                    release_held(ctx, target.permit_ref(), Some(quorum)).await;
                } else if let Some(lease) = lease.take() {
                    target.engine.engine.release(&lease).await;
                }
                match give.then {
                    Then::AskAgain => Outcome::GivenBack,
                    Then::Requeue => return Ok(Action::requeue(AGAIN)),
                    Then::Fail(err) => return Err(err),
                }
            }
            Step::InvalidFloor(message) => return invalid_floor(target, ctx, message).await,
            Step::AskLater => return Ok(Action::requeue(AGAIN)),
        };
        step = acquisition.next(outcome);
    }
}

/// Keeps a grant at the token proposed (from this moment: the floor and status writes that follow take API round
/// trips of the validity) and records its token in the key's floor record; `forget_ticket`: the lock leaves the
/// key's queue now.
async fn keep_and_record(
    target: &Target<'_>,
    ctx: &LockContext,
    lease: &Lease,
    forget_ticket: bool,
) -> Outcome<Error> {
    let (quorum, key) = (&target.settings.quorum, &target.settings.key);
    let token = lease.fencing_token();
    keep(target, ctx, lease, token);
    if forget_ticket {
        ctx.lock_controller.queue_tickets.forget(key);
    }
    match record_floor(ctx, quorum, key, token).await {
        Ok(Record::Above { floor: record }) => {
            tracing::warn!(
                token,
                floor = record,
                "the masters granted a token the cluster's floor record already holds (they forgot): acquiring above it"
            );
            Outcome::Recorded(Record::Above { floor: record })
        }
        Ok(record) => Outcome::Recorded(record),
        Err(err) => Outcome::RecordFailed(err),
    }
}

/// Nothing shows the grant yet: the policy's check left until the key was won (the recount of an earlier grant's
/// pods), which gives the grant back if it forbids it.
async fn recheck(
    target: &Target<'_>,
    ctx: &LockContext,
    holder: &str,
    lease: Option<&Lease>,
) -> Outcome<Error> {
    let clear = target.policy.grant_still_clear(ctx, target.permit, holder).await;
    if let (Ok(false), Some(lease)) = (&clear, lease) {
        tracing::info!(
            token = lease.fencing_token(),
            %holder,
            "pods of an earlier grant still run (the pod cache had not shown them yet): the key is given back until they are gone, and the lock stays first in its queue"
        );
    }
    Outcome::Rechecked(clear)
}

/// The acquisition was refused by values holding the permit's key: deletes those of them that are this lock's own
/// earlier values and that [`deletable`] allows (their holder stopped for good, or the validity shown for them has
/// ended), on every master, comparing the whole value (this installation derived it for this lock's uid, the key
/// and the token). `true` when a master deleted one: the acquisition is asked again.
///
/// Decided from the caches, so the lock is read again first (a newer status the cache has not shown yet could show
/// that token held): only what both allow is deleted.
async fn delete_earlier_values(
    target: &Target<'_>,
    ctx: &LockContext,
    report: &OperationReport,
) -> Result<bool, Error> {
    let blockers = blocking_labels(report);
    if blockers.is_empty() {
        return Ok(false);
    }
    let stopped = target.policy.stopped_grants(target.permit);
    let lock = target.lock;
    let cached = deletable(
        &blockers,
        &stopped,
        &status_of(lock, target.permit),
        Timestamp::now(),
    );
    if cached.is_empty() {
        return Ok(false);
    }
    let api: Api<DistributedLock> =
        Api::namespaced(ctx.client.clone(), &lock.namespace().unwrap_or_default());
    let Some(fresh) = api.get_opt(&lock.name_any()).await? else {
        return Ok(false);
    };
    let uid = lock.uid().unwrap_or_default();
    if fresh.uid().as_deref() != Some(uid.as_str()) {
        return Ok(false);
    }
    let values: Vec<EarlierValue> = deletable(
        &blockers,
        &stopped,
        &status_of(&fresh, target.permit),
        Timestamp::now(),
    )
    .into_iter()
    .filter(|value| cached.contains(value))
    .collect();
    if values.is_empty() {
        return Ok(false);
    }
    let key = &target.settings.key;
    let mut releases = Vec::with_capacity(values.len());
    for earlier in &values {
        let value = ctx.secret.lock_value(key, &uid, earlier.token, &earlier.holder)?;
        releases.push(async move { target.engine.engine.release_value(key, value).await });
    }
    ctx.ensure_leader()?;
    let reports = futures::future::join_all(releases).await;
    let mut deleted_any = false;
    for (earlier, released) in values.iter().zip(&reports) {
        let masters = released
            .nodes
            .iter()
            .filter(|node| node.outcome == NodeOutcome::Granted)
            .count();
        if masters > 0 {
            deleted_any = true;
            tracing::info!(
                holder = %earlier.holder,
                token = earlier.token,
                masters,
                "deleted this lock's earlier value, put back on masters after its holder stopped (a late write); acquiring again"
            );
        }
    }
    Ok(deleted_any)
}

/// Reads the key's floor record and records `token` in it unless it already holds as much.
async fn record_floor(ctx: &LockContext, quorum: &str, key: &str, token: i64) -> Result<Record, Error> {
    if negative_controls::active(Control::NoFloorRecord) {
        return Ok(Record::Written);
    }
    match floor_record::read(ctx, quorum, key).await? {
        Ok(seen) => floor_record::record(ctx, quorum, key, seen, token).await,
        Err(message) => Ok(Record::Invalid(message)),
    }
}

/// No token can be granted above the largest one: say where it is and what to do, and look again later.
async fn token_exhausted(
    target: &Target<'_>,
    ctx: &LockContext,
    exhausted: &Exhausted,
) -> Result<Action, Error> {
    let floor_record = format!(
        "{}/{}",
        ctx.secrets_namespace,
        record_name(&target.settings.quorum, &target.settings.key)
    );
    let places = Places {
        quorum: &target.settings.quorum,
        key: &target.settings.key,
        floor_record: &floor_record,
    };
    let message = exhausted_message(exhausted, &places);
    tracing::warn!(?exhausted, "fencing token exhausted");
    not_ready(
        target.lock,
        ctx,
        LockPhase::Pending,
        EXHAUSTED_REASON,
        message,
        Some(REPAIR_RETRY),
    )
    .await
}

/// The key's floor record makes no sense: nothing is acquired until it is repaired.
async fn invalid_floor(target: &Target<'_>, ctx: &LockContext, message: String) -> Result<Action, Error> {
    tracing::warn!(%message, "invalid fencing-token floor record");
    not_ready(
        target.lock,
        ctx,
        LockPhase::Pending,
        INVALID_FLOOR,
        message,
        Some(REPAIR_RETRY),
    )
    .await
}

/// The lock's waiter in its key's fair queue, on behalf of whoever its policy lets hold it (the Job queue's head,
/// the elected candidate): one waiter per lock and permit, whoever that is.
fn waiter_of(target: &Target<'_>, ctx: &LockContext) -> Waiter {
    let key = &target.settings.key;
    let uid = target.lock.uid().unwrap_or_default();
    Waiter::new(
        ctx.secret.waiter_id(key, &uid, target.permit),
        ctx.lock_controller.queue_tickets.ticket(key),
    )
}

/// One acquisition on the masters with the value for `token`, proposing `token` (= `floor + 1`) first;
/// `stays_queued`: granted, the lock stays first in the key's queue until it leaves ([`Redlock::leave_won`]).
///
/// [`Redlock::leave_won`]: crate::redlock::Redlock::leave_won
async fn grant(
    target: &Target<'_>,
    ctx: &LockContext,
    holder: &str,
    token: i64,
    floor: i64,
    stays_queued: bool,
) -> Result<Lease, AcquireError> {
    let uid = target.lock.uid().unwrap_or_default();
    let key = &target.settings.key;
    let value = ctx.secret.lock_value(key, &uid, token, holder)?;
    let waiter = grant_waiter(target, ctx, stays_queued);
    let engine = &target.engine.engine;
    let heard = ctx
        .lock_controller
        .release_wakes
        .attempting(&target.permit_ref(), engine, key);
    let started = Instant::now();
    let result = engine
        .try_acquire_waiting(key, target.settings.ttl, value, floor, Some(waiter))
        .await;
    after_attempt(target, ctx, &result, heard);
    ctx.metrics
        .acquire_seconds
        .get_or_create(&OutcomeLabels {
            outcome: attempt_outcome(&result).to_owned(),
        })
        .observe(started.elapsed().as_secs_f64());
    result
}

/// The lock's waiter for an attempt; `stays_queued`: granted, it stays first in the key's queue.
fn grant_waiter(target: &Target<'_>, ctx: &LockContext, stays_queued: bool) -> Waiter {
    let waiter = waiter_of(target, ctx);
    // Given back, its next attempt comes after a pod list, the release and a pod list again: API round trips that
    // take a second each on a slow server. Kept that much longer (a replica that dies while it waits holds up the
    // waiters behind it as long).
    if stays_queued {
        waiter.staying_after_grant().keeping(STAYING_KEEP)
    } else {
        waiter
    }
}

/// What an attempt leaves for the next: the ticket and counter of a refusal, and a watch for the key's release
/// while the lock waits in its queue (`heard`: where the watch stood before the attempt).
fn after_attempt(
    target: &Target<'_>,
    ctx: &LockContext,
    result: &Result<Lease, AcquireError>,
    heard: Option<ReleaseMark>,
) {
    let (key, permit, engine) = (&target.settings.key, target.permit_ref(), &target.engine.engine);
    let Err(AcquireError::NotAcquired { report, .. }) = result else {
        ctx.lock_controller.release_wakes.forget(&permit);
        return;
    };
    let place = report.queue_place();
    ctx.lock_controller
        .queue_tickets
        .remember(key, place.as_ref(), report.highest_counter());
    match &place {
        Some(place) if !negative_controls::baseline(Baseline::NoReleaseWakes) => ctx
            .lock_controller
            .release_wakes
            .queued(&permit, engine, key, heard, place, &ctx.keeper),
        _ => ctx.lock_controller.release_wakes.forget(&permit),
    }
}

/// The `outcome` label of an attempt's duration.
fn attempt_outcome(result: &Result<Lease, AcquireError>) -> &'static str {
    match result {
        Ok(_) => "acquired",
        Err(AcquireError::NotAcquired {
            kind: FailureKind::Contended,
            ..
        }) => "contended",
        Err(AcquireError::NotAcquired { .. }) => "unavailable",
        Err(_) => "error",
    }
}

/// Granted, kept, and its token recorded as the key's floor: show it.
async fn hold(target: &Target<'_>, ctx: &LockContext, holder: &str, lease: &Lease) -> Result<Action, Error> {
    let token = lease.fencing_token();
    match show_held(target, ctx, holder, lease, token, Showing::NewToken).await {
        Ok(true) => {
            let note = format!(
                "{holder} holds the lock with fencing token {token} ({} of {} masters)",
                lease.report().votes(),
                lease.report().nodes.len()
            );
            tracing::info!(token, %holder, "acquired");
            target.publish(ctx, EventType::Normal, "Acquired", note).await;
            Ok(Action::requeue(RESYNC))
        }
        Ok(false) => {
            // Another writer advanced the token first: this acquisition is not the lock's.
            release_held(ctx, target.permit_ref(), Some(&target.settings.quorum)).await;
            Ok(Action::requeue(Duration::from_secs(1)))
        }
        Err(err) if err.outcome_unknown() => {
            // The write may have landed (the connection broke before its answer): keep the lock; the
            // next look at status settles it, and releasing could empty a lock status shows as held.
            tracing::warn!(token, error = %err, "the status write's outcome is unknown: keeping the lock");
            Err(err)
        }
        Err(err) => {
            release_held(ctx, target.permit_ref(), Some(&target.settings.quorum)).await;
            Err(err)
        }
    }
}

/// Held and kept by this replica, and status is due (or out of date): show the current validity.
pub async fn refresh_status(
    target: &Target<'_>,
    ctx: &LockContext,
    holder: &str,
    held: &HeldView,
) -> Result<Action, Error> {
    if show_held(target, ctx, holder, &held.lease, held.token, Showing::Refresh).await? {
        return Ok(Action::requeue(RESYNC));
    }
    // Status shows a newer token than ours, or ours lost: this acquisition is stale for everyone who fences on the
    // token. Give it up (its holder may have been shown it: released when that validity ends) and acquire above.
    tracing::warn!(
        token = held.token,
        "a newer fencing token, or this one lost, is in status: re-acquiring"
    );
    give_up_kept(ctx, target.lock, target.permit_ref(), Some(target.policy)).await?;
    Ok(Action::requeue(Duration::from_millis(10)))
}

/// Not acquired: say who or what blocks it, and try again after a pause.
async fn waiting(
    target: &Target<'_>,
    ctx: &LockContext,
    kind: FailureKind,
    report: &OperationReport,
) -> Result<Action, Error> {
    let ttl = target.settings.ttl;
    let (phase, reason, message, retry) = match kind {
        FailureKind::Contended => {
            let key = &target.settings.key;
            let holder = report
                .blocking_holder()
                .unwrap_or_else(|| "another holder".into());
            match report.queue_place() {
                Some(place) => (
                    LockPhase::Contended,
                    "Contended",
                    queued_message(key, report.blocking_holder().as_deref(), place.place),
                    queued_retry(ttl, rand::rng().random()),
                ),
                None => (
                    LockPhase::Contended,
                    "Contended",
                    format!("key `{key}` is held by {holder}; retrying"),
                    contended_retry(ttl, rand::rng().random()),
                ),
            }
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
    let blocked = Blocked {
        phase,
        reason,
        message: &message,
        report,
    };
    let decoration = target.policy.decoration(None, target.keep.fence_margin);
    let before = status_of(target.lock, target.permit).phase;
    let stamp = stamp_now(target.lock);
    let written = write_permit_status(ctx, target.lock, target.permit, |current| {
        Some(status::waiting(
            current,
            &blocked,
            &decoration,
            target.keep.fence_margin,
            stamp,
        ))
    })
    .await?;
    if written && before != Some(phase) {
        let type_ = if phase == LockPhase::Contended {
            EventType::Normal
        } else {
            EventType::Warning
        };
        target.publish(ctx, type_, reason, message).await;
    }
    Ok(Action::requeue(retry))
}

/// What a lock waiting in its key's fair queue says: who holds the key, and its place among the waiters
/// (`lock --wait` commands, other clusters' locks on a shared key).
fn queued_message(key: &str, holder: Option<&str>, place: u64) -> String {
    let holder = match holder {
        Some(holder) => format!("held by {holder}"),
        None => "not held".to_owned(),
    };
    match place {
        0 | 1 => format!("key `{key}` is {holder}; this lock is next in its fair queue; retrying"),
        place => format!(
            "key `{key}` is {holder}; this lock is waiting in its fair queue, place {place} ({} ahead); retrying",
            place - 1
        ),
    }
}

/// Status says `holder` has the lock with `token`, but this replica does not keep it: a predecessor (restarted or
/// failed-over replica) did. Take it over without a new token.
pub async fn resume(
    target: &Target<'_>,
    ctx: &LockContext,
    holder: &str,
    token: i64,
    status: &DistributedLockStatus,
) -> Result<Action, Error> {
    ctx.ensure_leader()?;
    match take_back(target, ctx, token, holder).await? {
        Ok(lease) => {
            if show_held(target, ctx, holder, &lease, token, Showing::Refresh).await? {
                tracing::info!(token, "resumed a lock held by a previous replica");
                return Ok(Action::requeue(RESYNC));
            }
            // Status (newer than the cache that showed it held) shows the token lost or a newer one: it is never
            // brought back. Its holder may have been shown the validity the takeover refreshed: released after.
            tracing::info!(token, "not resumed: status shows this token lost or a newer one");
            give_up_kept(ctx, target.lock, target.permit_ref(), Some(target.policy)).await?;
            Ok(Action::requeue(Duration::from_millis(10)))
        }
        Err(ExtendError::NoQuorum { .. } | ExtendError::Expired { .. })
            if resume_still_possible(status, target.keep.fence_margin, Timestamp::now()) =>
        {
            Ok(Action::requeue(target.keep.retry_interval))
        }
        Err(ExtendError::Lost { holder: by, .. }) => {
            let by = by.unwrap_or_else(|| "another holder".into());
            let reason = format!("taken over by {by} while no replica was extending it");
            super::fence::report_lost(target, ctx, holder, &reason, Some(token)).await
        }
        Err(err) => {
            let reason = format!("could not be resumed after a controller restart: {err}");
            super::fence::report_lost(target, ctx, holder, &reason, Some(token)).await
        }
    }
}
