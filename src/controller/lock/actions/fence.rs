//! A lost lock: its holder fenced before `validUntil`, and for Job fencing, the fenced Job taken back with its
//! own token or queued again for a new one.

use std::time::Duration;

use kube::ResourceExt;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use rand::Rng;

use super::holding::{show_held, take_back};
use super::release::release_held;
use super::{Target, stamp_now};
use crate::controller::context::Context;
use crate::controller::error::Error;
use crate::controller::lock::RESYNC;
use crate::controller::lock::decide::contended_retry;
use crate::controller::lock::policy::{KeysAfterLoss, Policy};
use crate::controller::lock::status;
use crate::controller::lock::status_write::write_status;
use crate::redlock::ExtendError;

/// Fences the holder, then gives up the keys (or leaves them to expire) and shows `Lost`. `unkept` is the token
/// of an acquisition this replica does not keep (a predecessor's, whose takeover failed): where the policy gives
/// the keys up, or nobody may act on them any more, its keys go too, instead of blocking the next holder until
/// their TTL ends where a takeover refreshed them or a late master re-created them.
pub async fn report_lost(
    target: &Target<'_>,
    ctx: &Context,
    holder: &str,
    reason: &str,
    unkept: Option<i64>,
) -> Result<Action, Error> {
    // The holder of the lease this replica keeps, if any: the one to fence, even if the spec wants another now.
    // A Job is fenced by the name its turn gives.
    let kept = ctx.keeper.view(&target.lref);
    let token = kept.as_ref().map_or(0, |held| held.token);
    let fenced = match (&target.policy, &kept) {
        (Policy::Jobs(_), _) | (_, None) => holder.to_owned(),
        (_, Some(held)) => held.lease.holder().to_owned(),
    };
    match target.policy.before_lost(ctx, &fenced, token, reason).await? {
        KeysAfterLoss::Release => {
            let released = release_held(ctx, &target.lref, Some(&target.settings.quorum)).await;
            if let (None, Some(token)) = (released, unkept) {
                release_unkept(target, ctx, holder, token).await?;
            }
        }
        KeysAfterLoss::LeaveToExpire => {
            ctx.keeper.remove(&target.lref).await;
            // A predecessor's identity lock whose validity, as status showed it, is over: its holder may no
            // longer act, so its keys need not block the next holder for their whole TTL. (A fenced Job's keys
            // stay: if a majority still holds them, the Job resumes with its own token.)
            if let (Some(token), Policy::Identity(_)) = (unkept, &target.policy)
                && shown_validity_over(target.lock)
            {
                release_unkept(target, ctx, holder, token).await?;
            }
        }
    }
    let message = format!("lock lost: {reason}; re-acquiring");
    let stamp = stamp_now(target.lock);
    let written = write_status(ctx, target.lock, |current| {
        Some(status::lost(current, &message, stamp))
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

/// Job fencing: the Job whose lock was lost had its pods stopped and its token is still the latest — take the
/// lock back with that same token and let the Job run again. If the keys are gone, it is queued again to run
/// with a new token (or marked stale where that is refused).
pub async fn resume_fenced(
    target: &Target<'_>,
    ctx: &Context,
    job: &str,
    token: i64,
) -> Result<Action, Error> {
    ctx.ensure_leader()?;
    let Policy::Jobs(jobs) = &target.policy else {
        return Ok(Action::await_change());
    };
    match take_back(target, ctx, token, job).await? {
        Ok(lease) => {
            if !show_held(target, ctx, job, &lease, token, false).await? {
                release_held(ctx, &target.lref, Some(&target.settings.quorum)).await;
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

/// Job fencing: a fenced Job's token can no longer be used: queue it again for a new one.
pub async fn requeue(target: &Target<'_>, ctx: &Context, job: &str, token: i64) -> Result<Action, Error> {
    if let Policy::Jobs(jobs) = &target.policy {
        jobs.requeue_or_mark_stale(ctx, job, token).await?;
    }
    Ok(Action::requeue(Duration::from_millis(10)))
}

/// Deletes a predecessor's acquisition (its value rebuilt from `token` and `holder`) wherever it is still the
/// value. Only after its holder was fenced: the keys are all that kept a contender out meanwhile.
async fn release_unkept(target: &Target<'_>, ctx: &Context, holder: &str, token: i64) -> Result<(), Error> {
    if !ctx.leadership.is_leader() {
        return Ok(());
    }
    let uid = target.lock.uid().unwrap_or_default();
    let value = ctx.secret.lock_value(&target.settings.key, &uid, token, holder)?;
    target
        .engine
        .engine
        .release_value(&target.settings.key, value)
        .await;
    Ok(())
}

/// Whether the `validUntil` status shows has passed (or there is none): no holder acts on the lock any more.
fn shown_validity_over(lock: &crate::api::DistributedLock) -> bool {
    lock.status
        .as_ref()
        .and_then(|status| status.valid_until.as_ref())
        .is_none_or(|until| until.0 <= k8s_openapi::jiff::Timestamp::now())
}
