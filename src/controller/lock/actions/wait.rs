//! A lock nobody may hold now: its spec or quorum cannot be acted on, or its policy lets nobody hold it yet.

use std::time::Duration;

use kube::runtime::controller::Action;
use kube::runtime::events::EventType;

use crate::api::{DistributedLock, LockPhase};
use crate::controller::error::Error;
use crate::controller::lock::controller_state::LockContext;
use crate::controller::lock::handover::give_up::{give_up_kept, until};
use crate::controller::lock::handover::rule::Release;
use crate::controller::lock::permit_count::{is_closing, open_permits, permits_of};
use crate::controller::lock::policy::Waiting;
use crate::controller::lock::status;
use crate::controller::lock::status::permits::status_of;
use crate::controller::lock::status::write::stamp_now;
use crate::controller::lock::status::write::{write_permit_status, write_status};
use crate::controller::lock::target::Target;

/// The spec or the quorum cannot be acted on: give up whatever is held (released once the validity shown to its
/// holder has ended) and say why.
pub async fn not_ready(
    lock: &DistributedLock,
    ctx: &LockContext,
    phase: LockPhase,
    reason: &'static str,
    message: String,
    retry: Option<Duration>,
) -> Result<Action, Error> {
    for permit in permits_of(lock) {
        give_up_kept(ctx, lock, permit, None).await?;
    }
    let before = lock.status.as_ref().and_then(|status| status.phase);
    // A new reason in the same phase (a lock Pending for one reason, then for another) is news too.
    let reason_before = not_ready_reason(lock);
    let stamp = stamp_now(lock);
    let written = write_status(ctx, lock, |current| {
        Some(status::not_ready(current, phase, reason, &message, stamp))
    })
    .await?;
    if written && (before != Some(phase) || reason_before.as_deref() != Some(reason)) {
        ctx.publish(lock, EventType::Warning, reason, message).await;
    }
    Ok(retry.map_or_else(Action::await_change, Action::requeue))
}

/// The spec cannot be acted on. A lock this replica holds keeps its holder under the last valid spec (see
/// [`status::invalid_while_held`]); any other is not ready.
pub async fn invalid_spec(
    lock: &DistributedLock,
    ctx: &LockContext,
    reason: &'static str,
    message: String,
) -> Result<Action, Error> {
    if !permits_of(lock).any(|permit| ctx.keeper.view(permit).is_some()) {
        return not_ready(lock, ctx, LockPhase::Invalid, reason, message, None).await;
    }
    let reason_before = not_ready_reason(lock);
    let stamp = stamp_now(lock);
    let written = write_status(ctx, lock, |current| {
        Some(status::invalid_while_held(current, reason, &message, stamp))
    })
    .await?;
    if written && reason_before.as_deref() != Some(reason) {
        let note =
            format!("{message}; the holder keeps the lock under the last valid spec until this is fixed");
        ctx.publish(lock, EventType::Warning, reason, note).await;
    }
    Ok(Action::await_change())
}

/// Why status shows the lock not ready, if it does.
fn not_ready_reason(lock: &DistributedLock) -> Option<String> {
    lock.status.as_ref().and_then(|status| {
        status
            .conditions
            .iter()
            .find(|condition| condition.type_ == "Ready" && condition.status == "False")
            .map(|ready| ready.reason.clone())
    })
}

/// The lock's quorum cannot be used: waits (looked at again every 30 s, and at once when the quorum changes).
pub async fn quorum_not_ready(
    lock: &DistributedLock,
    ctx: &LockContext,
    reason: &'static str,
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

/// The policy lets nobody hold the lock now: say why. A change of the pods or Jobs wakes the lock.
pub async fn wait_for_policy(
    target: &Target<'_>,
    ctx: &LockContext,
    waiting: &Waiting,
) -> Result<Action, Error> {
    let gave_up = if waiting.release_kept {
        give_up_kept(ctx, target.lock, target.permit_ref(), Some(target.policy)).await?
    } else {
        None
    };
    let message = match &gave_up {
        Some(gave_up) => format!("{}; {}", waiting.message, gave_up.note()),
        None => waiting.message.clone(),
    };
    let waiting = &Waiting {
        message,
        ..waiting.clone()
    };
    let decoration = target.policy.decoration(None, target.keep.fence_margin);
    let before = status_of(target.lock, target.permit).phase;
    let stamp = stamp_now(target.lock);
    let written = write_permit_status(ctx, target.lock, target.permit, |current| {
        Some(status::policy_waiting(current, waiting, &decoration, stamp))
    })
    .await?;
    let closing =
        usize::try_from(open_permits(target.lock)).is_ok_and(|open| is_closing(target.permit, open));
    if written
        && before == Some(LockPhase::Held)
        && let Some(type_) = event_if_was_held(waiting, closing)
    {
        target
            .publish(ctx, type_, waiting.reason, waiting.message.clone())
            .await;
    }
    // A key given up is released by the look at its release time.
    let retry = match gave_up.map(|gave_up| gave_up.release) {
        Some(Release::At(at)) => waiting.retry.min(until(at)),
        _ => waiting.retry,
    };
    Ok(Action::requeue(retry))
}

/// The Event a wait publishes when the lock (or the permit) was held until now: a Warning where the policy asks
/// for one; a Normal one when a permit above a lowered spec.permits (`closing`) is given up, as the only place its
/// reason shows (a semaphore's `Held` condition tells of every permit, so it overwrites the given-up permit's
/// reason in the same write). `None`: no Event.
fn event_if_was_held(waiting: &Waiting, closing: bool) -> Option<EventType> {
    if waiting.warn_if_was_held {
        Some(EventType::Warning)
    } else if closing && waiting.release_kept {
        Some(EventType::Normal)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn waiting(reason: &'static str, release_kept: bool, warn_if_was_held: bool) -> Waiting {
        Waiting {
            reason,
            message: String::new(),
            keep_lost: false,
            release_kept,
            warn_if_was_held,
            retry: Duration::from_secs(30),
        }
    }

    #[test]
    fn a_permit_given_up_above_a_lowered_count_says_so_in_an_event() {
        let lowered = waiting("PermitsLowered", true, false);
        assert_eq!(
            event_if_was_held(&lowered, true),
            Some(EventType::Normal),
            "the status write overwrites its reason with the semaphore's Held condition: the Event shows it"
        );
        assert_eq!(event_if_was_held(&lowered, false), None);
        let no_candidates = waiting("NoCandidates", true, true);
        assert_eq!(event_if_was_held(&no_candidates, false), Some(EventType::Warning));
        assert_eq!(event_if_was_held(&no_candidates, true), Some(EventType::Warning));
        let job_stopping = waiting("WaitingForFencedJob", false, false);
        assert_eq!(
            event_if_was_held(&job_stopping, true),
            None,
            "a Job on a permit above the count keeps its keys until they expire: not given up"
        );
    }
}
