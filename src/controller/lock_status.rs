//! Writing a `DistributedLock`'s status: every write carries the resourceVersion it was computed from, the
//! fencing token never goes back, and the policy hooks (leader label, Job grant) follow a successful write.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, Time};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, PostParams};
use kube::{Resource, ResourceExt};
use tokio::time::Instant;

use super::context::{Context, Error};
use super::jobs::JobQueue;
use super::lock::Target;
use crate::api::conditions;
use crate::api::lock::MasterOutcome;
use crate::api::{DistributedLock, DistributedLockStatus, LockPhase};
use crate::redlock::{Lease, OperationReport};

/// Writes the Held status for `lease`. With `new_token`, only if status still shows an older token; without,
/// only if it shows no newer one — the resourceVersion precondition makes check and write one atomic step.
/// `Ok(false)`: a newer token is already there.
pub(super) async fn write_held(
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
pub(super) async fn write_status(
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

/// Status after a release for a holder the spec no longer wants: nobody holds it, the next reconcile acquires.
pub(super) async fn show_released(
    ctx: &Context,
    lock: &DistributedLock,
    message: &str,
) -> Result<bool, Error> {
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
pub(super) fn not_held(
    status: &mut DistributedLockStatus,
    reason: &str,
    message: &str,
    generation: Option<i64>,
) {
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

/// A Job whose pods may take longer to stop than the fence margin leaves: its fencing may come too late.
pub(super) fn show_slow_jobs(
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

pub(super) fn masters(report: &OperationReport) -> Vec<MasterOutcome> {
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
pub(super) fn wall_at(at: Instant, now: Instant, wall_now: Timestamp) -> Timestamp {
    let offset = if at >= now {
        SignedDuration::from_millis(i64::try_from((at - now).as_millis()).unwrap_or(i64::MAX))
    } else {
        -SignedDuration::from_millis(i64::try_from((now - at).as_millis()).unwrap_or(i64::MAX))
    };
    wall_now + offset
}
