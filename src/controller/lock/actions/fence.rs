//! A lost lock: its holder fenced before `validUntil`, and for Job fencing, the fenced Job taken back with its
//! own token or queued again for a new one.

use std::time::Duration;

use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use rand::Rng;
use tokio::time::Instant;

use super::holding::{show_held, take_back};
use crate::controller::error::Error;
use crate::controller::lock::RESYNC;
use crate::controller::lock::controller_state::LockContext;
use crate::controller::lock::decide::{contended_retry, take_back_still_possible};
use crate::controller::lock::handover::give_up::{give_up, give_up_kept, rebuilt};
use crate::controller::lock::handover::release::release_held;
use crate::controller::lock::policy::{KeysAfterLoss, Policy};
use crate::controller::lock::status::write::stamp_now;
use crate::controller::lock::status::write::write_permit_status;
use crate::controller::lock::status::{self, Showing};
use crate::controller::lock::target::Target;
use crate::redlock::ExtendError;

/// Fences the holder, then gives up the keys (released once the validity shown to the holder ended) or leaves them
/// to expire, and shows `Lost`. `unkept` is the token of an acquisition this replica does not keep (a
/// predecessor's, whose takeover failed): where the policy gives the keys up, or nobody may act on them any more,
/// its keys go too, instead of blocking the next holder until their TTL ends where a takeover refreshed them or
/// a late master re-created them.
pub async fn report_lost(
    target: &Target<'_>,
    ctx: &LockContext,
    holder: &str,
    reason: &str,
    unkept: Option<i64>,
) -> Result<Action, Error> {
    // The holder of the lease this replica keeps, if any: the one to fence, even if the spec wants another now.
    // A Job is fenced by the name its turn gives.
    let kept = ctx.keeper.view(target.permit_ref());
    let token = kept.as_ref().map_or(0, |held| held.token);
    let timing = kept
        .as_ref()
        .map(|held| FenceTiming::start(held.lease.valid_until(), target.keep.fence_margin));
    let fenced = match (target.policy, &kept) {
        (Policy::Jobs(_), _) | (_, None) => holder.to_owned(),
        (_, Some(held)) => held.lease.holder().to_owned(),
    };
    let mut gave_up = None;
    let keys_after = target.policy.before_lost(ctx, &fenced, token, reason).await?;
    // The holder is fenced (its Job suspended, its label removed): how much of its validity was left then is
    // what the fence margin is for.
    let timing = timing.map(|timing| timing.fenced(Instant::now()));
    if let Some(timing) = &timing {
        ctx.metrics
            .fence_validity_left_seconds
            .observe(timing.validity_left.as_secs_f64());
    }
    match keys_after {
        KeysAfterLoss::ReleaseAfterShownValidity => {
            let policy = Some(target.policy);
            gave_up = give_up_kept(ctx, target.lock, target.permit_ref(), policy).await?;
            if let (None, Some(token)) = (&gave_up, unkept) {
                let given = rebuilt(target, ctx, holder, token)?;
                gave_up = Some(give_up(ctx, target.lock, target.permit_ref(), policy, given).await?);
            }
        }
        KeysAfterLoss::LeaveToExpire => {
            ctx.keeper.remove(target.permit_ref()).await;
            // A predecessor's identity lock: released once the validity status showed its holder has ended,
            // rather than blocking the next holder for the whole TTL a takeover refreshed. (A fenced Job's keys
            // stay: if a majority still holds them, the Job resumes with its own token.)
            if let (Some(token), Policy::Identity(_)) = (unkept, target.policy)
                && ctx.leadership.is_leader()
            {
                let given = rebuilt(target, ctx, holder, token)?;
                gave_up = Some(give_up(ctx, target.lock, target.permit_ref(), None, given).await?);
            }
        }
    }
    let message = match &gave_up {
        Some(gave_up) => format!("lock lost: {reason}; {}; re-acquiring then", gave_up.note()),
        None => format!("lock lost: {reason}; re-acquiring"),
    };
    let stamp = stamp_now(target.lock);
    let written = write_permit_status(ctx, target.lock, target.permit, |current| {
        Some(status::lost(current, &message, stamp))
    })
    .await?;
    if written {
        match timing {
            Some(timing) => tracing::warn!(
                %reason,
                looked_at_after_fence_time_ms = timing.looked_at_after_fence_time_ms,
                fence_write_ms = timing.fence_write_ms,
                validity_left_ms = timing.validity_left_ms,
                "lock lost"
            ),
            None => tracing::warn!(%reason, "lock lost"),
        }
        target.publish(ctx, EventType::Warning, "Lost", message).await;
    }
    Ok(Action::requeue(contended_retry(
        target.settings.ttl,
        rand::rng().random(),
    )))
}

/// Job fencing: the Job whose lock was lost had its pods stopped and its token is still the latest — take the
/// lock back with that same token and let the Job run again. If the keys are gone, it is queued again to run
/// with a new token (or marked stale where that is refused).
pub async fn resume_fenced(
    target: &Target<'_>,
    ctx: &LockContext,
    job: &str,
    token: i64,
) -> Result<Action, Error> {
    ctx.ensure_leader()?;
    let Policy::Jobs(jobs) = target.policy else {
        return Ok(Action::await_change());
    };
    match take_back(target, ctx, token, job).await? {
        Ok(lease) => {
            if !show_held(target, ctx, job, &lease, token, Showing::TakeBackFenced).await? {
                release_held(ctx, target.permit_ref(), Some(&target.settings.quorum)).await;
                return Ok(Action::requeue(Duration::from_millis(10)));
            }
            jobs.resume(ctx, job, token).await?;
            Ok(Action::requeue(RESYNC))
        }
        // Too few masters answered to tell: the masters that hold the value or did not answer (unreachable, or
        // not waited for once the take-back was decided) could still make a majority. Nobody else can take the
        // lock meanwhile either, so try again rather than give the token up. Masters in their restart quarantine
        // never vote for the value (see `take_back_still_possible`): waiting for them only delays the Job's new
        // grant once a majority votes again.
        Err(ExtendError::NoQuorum { report }) if take_back_still_possible(&report) => {
            tracing::info!(job, token, %report, "the fenced Job's lock cannot be taken back yet");
            Ok(Action::requeue(Duration::from_secs(1)))
        }
        Err(err) => {
            tracing::info!(job, token, error = %err, "the fenced Job's lock cannot be taken back");
            jobs.requeue_or_mark_stale(ctx, job, token).await?;
            Ok(Action::requeue(Duration::from_millis(10)))
        }
    }
}

/// Job fencing: a fenced Job's token can no longer be used: queue it again for a new one.
pub async fn requeue(target: &Target<'_>, ctx: &LockContext, job: &str, token: i64) -> Result<Action, Error> {
    if let Policy::Jobs(jobs) = target.policy {
        jobs.requeue_or_mark_stale(ctx, job, token).await?;
    }
    Ok(Action::requeue(Duration::from_millis(10)))
}

/// Where the time between a lost lock's fence time and its holder's fence went: the keeper's signal and the wait
/// for the reconciler, then the fence's own writes. Logged with the loss and the remaining validity measured, so
/// that a fence that used up its margin says which step took it.
struct FenceTiming {
    valid_until: Instant,
    fence_time: Instant,
    looked_at: Instant,
}

/// A fence as measured once written; the millisecond figures are signed (negative: before the fence time, or
/// after the validity ended).
struct Fenced {
    looked_at_after_fence_time_ms: i64,
    fence_write_ms: i64,
    validity_left_ms: i64,
    /// Zero when the fence was written after the validity ended.
    validity_left: Duration,
}

impl FenceTiming {
    fn start(valid_until: Instant, fence_margin: Duration) -> Self {
        Self {
            valid_until,
            fence_time: valid_until.checked_sub(fence_margin).unwrap_or(valid_until),
            looked_at: Instant::now(),
        }
    }

    fn fenced(&self, at: Instant) -> Fenced {
        Fenced {
            looked_at_after_fence_time_ms: signed_millis(self.fence_time, self.looked_at),
            fence_write_ms: signed_millis(self.looked_at, at),
            validity_left_ms: signed_millis(at, self.valid_until),
            validity_left: self.valid_until.saturating_duration_since(at),
        }
    }
}

/// `to - from` in milliseconds, negative when `to` comes first; saturating far beyond any lease.
fn signed_millis(from: Instant, to: Instant) -> i64 {
    let millis = |duration: Duration| i64::try_from(duration.as_millis()).unwrap_or(i64::MAX);
    if to >= from {
        millis(to - from)
    } else {
        -millis(from - to)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_fence_says_how_late_it_was_looked_at_how_long_its_writes_took_and_what_validity_was_left() {
        let valid_until = Instant::now() + Duration::from_secs(3);
        let margin = Duration::from_millis(600);
        // Looked at 100 ms after the fence time; the writes take 300 ms.
        tokio::time::advance(Duration::from_millis(2_500)).await;
        let timing = FenceTiming::start(valid_until, margin);
        let fenced = timing.fenced(Instant::now() + Duration::from_millis(300));
        assert_eq!(fenced.looked_at_after_fence_time_ms, 100);
        assert_eq!(fenced.fence_write_ms, 300);
        assert_eq!(fenced.validity_left_ms, 200);
        assert_eq!(fenced.validity_left, Duration::from_millis(200));
    }

    #[tokio::test(start_paused = true)]
    async fn a_fence_written_after_the_validity_shows_a_negative_lead_and_no_validity_left() {
        let valid_until = Instant::now() + Duration::from_secs(1);
        // Found lost early (taken over), fenced late: before the fence time, written after the validity.
        let timing = FenceTiming::start(valid_until, Duration::from_millis(200));
        let fenced = timing.fenced(valid_until + Duration::from_millis(70));
        assert_eq!(fenced.looked_at_after_fence_time_ms, -800);
        assert_eq!(fenced.validity_left_ms, -70);
        assert_eq!(fenced.validity_left, Duration::ZERO);
    }

    #[test]
    fn a_margin_longer_than_the_validity_fences_at_once() {
        let valid_until = Instant::now();
        let timing = FenceTiming::start(valid_until, Duration::from_secs(u64::MAX / 4));
        assert!(timing.fence_time <= valid_until);
    }
}
