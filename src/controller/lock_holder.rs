//! Who should hold a lock now, by its holder policy: the fixed identity, the elected pod (after every other
//! pod lost the leader label), or the Job whose turn it is (after strays are suspended). Some policy states end
//! the reconciliation here with a status of their own (no candidate, an empty queue, a finished Job).

use std::time::Duration;

use kube::Resource;
use kube::ResourceExt;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;

use super::context::{Context, Error};
use super::holdings::HeldView;
use super::job_queue::{JobStep, LOCK_LABEL};
use super::jobs::JobQueue;
use super::leader::Election;
use super::lock::{RESYNC, not_ready, release_from_status, release_held};
use super::lock_decide::current_holder;
use super::lock_settings::{HolderKind, LockSettings};
use super::lock_status::{not_held, show_released, write_status};
use crate::api::{DistributedLock, DistributedLockStatus, LockPhase};

/// The holder chosen for this reconciliation, with what its policy needs to act on it.
pub(super) struct Chosen {
    pub(super) holder: String,
    pub(super) election: Option<Election>,
    pub(super) jobs: Option<JobQueue>,
}

/// A lock's holder for this reconciliation, or the action that already ended it.
pub(super) enum Holder {
    Chosen(Box<Chosen>),
    Done(Action),
}

pub(super) async fn holder_for(
    lock: &DistributedLock,
    ctx: &Context,
    settings: &LockSettings,
    held: Option<&HeldView>,
    status: &DistributedLockStatus,
) -> Result<Holder, Error> {
    let lref = ObjectRef::from_obj(lock);
    Ok(match &settings.holder {
        HolderKind::Identity(holder) => Holder::Chosen(Box::new(Chosen {
            holder: holder.clone(),
            election: None,
            jobs: None,
        })),
        HolderKind::LeaderElection => {
            let Some(policy) = &lock.spec.holder.leader_election else {
                return Ok(Holder::Done(Action::await_change()));
            };
            let current = current_holder(held, status);
            let election = match Election::observe(ctx, lock, policy, current.as_deref()) {
                Ok(election) => election,
                Err(message) => {
                    return Ok(Holder::Done(
                        not_ready(lock, ctx, LockPhase::Invalid, "InvalidSelector", message, None).await?,
                    ));
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
                Some(chosen) => Holder::Chosen(Box::new(Chosen {
                    holder: chosen,
                    election: Some(election),
                    jobs: None,
                })),
                None => Holder::Done(no_candidates(lock, ctx, &election).await?),
            }
        }
        HolderKind::Jobs => {
            let current = current_holder(held, status);
            let latest = status
                .fencing_token
                .unwrap_or(0)
                .max(ctx.holdings.highest_token(&lref));
            let mut jobs = JobQueue::observe(ctx, lock, current.as_deref(), latest);
            jobs.suspend_strays(ctx, current.as_deref()).await?;
            jobs.recheck_pods(ctx).await?;
            match jobs.step.clone() {
                JobStep::Hold(job) | JobStep::Grant(job) | JobStep::ResumeFenced { job, .. } => {
                    Holder::Chosen(Box::new(Chosen {
                        holder: job,
                        election: None,
                        jobs: Some(jobs),
                    }))
                }
                JobStep::ReleaseFinished(job) => {
                    if release_held(ctx, &lref, held.map(|held| held.quorum.clone()))
                        .await
                        .is_none()
                    {
                        release_from_status(lock, ctx).await?;
                    }
                    let note = format!("released: Job {job} finished or is gone");
                    ctx.publish(lock, EventType::Normal, "Released", note.clone())
                        .await;
                    show_released(ctx, lock, &note).await?;
                    return Ok(Holder::Done(Action::requeue(Duration::from_millis(10))));
                }
                JobStep::WaitForFenced(job) => {
                    let message =
                        format!("waiting for the pods of fenced Job {job} to stop before the next Job runs");
                    return Ok(Holder::Done(
                        waiting_for_jobs(lock, ctx, &jobs, "WaitingForFencedJob", message).await?,
                    ));
                }
                JobStep::WaitForPods(pods) => {
                    let message = format!(
                        "waiting for pods of an earlier grant to stop before the next Job runs: {}; a Job deleted with propagationPolicy Orphan leaves its pods running",
                        pods.join(", ")
                    );
                    return Ok(Holder::Done(
                        waiting_for_jobs(lock, ctx, &jobs, "WaitingForEarlierPods", message).await?,
                    ));
                }
                JobStep::Requeue { job, token } => {
                    jobs.requeue_or_mark_stale(ctx, &job, token).await?;
                    return Ok(Holder::Done(Action::requeue(Duration::from_millis(10))));
                }
                JobStep::Idle => {
                    let message = format!("no Job labelled {LOCK_LABEL}={} is waiting", lock.name_any());
                    return Ok(Holder::Done(
                        waiting_for_jobs(lock, ctx, &jobs, "QueueEmpty", message).await?,
                    ));
                }
            }
        }
    })
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
