//! Who should hold a lock, by its holder policy: a fixed identity, the elected pod, or the Job whose turn it is.
//! A policy is observed from the watch caches, makes the writes that must come before the lock moves
//! ([`Policy::prepare`]: stray leader labels removed, stray Jobs suspended), then says whose turn it is
//! ([`Policy::turn`]). It decorates the lock's status and acts on its holder once the lock is held
//! ([`Policy::after_held`]) and before it is given up as lost ([`Policy::before_lost`]).

pub mod jobs;
pub mod leader;

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::ResourceExt;

use self::jobs::{JobQueue, JobStep};
use self::leader::Election;
use super::permit_count::is_semaphore;
use super::settings::{HolderKind, LockSettings};
use crate::api::DistributedLock;
use crate::api::holder_contract::LOCK_LABEL;
use crate::controller::error::Error;
use crate::controller::lock::controller_state::LockContext;

/// A lock's holder policy, as observed for one reconciliation.
pub enum Policy {
    Identity(String),
    Leader(Box<Election>),
    Jobs(Box<JobQueue>),
}

/// Whose turn it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Turn {
    /// This holder should have the lock.
    Hold(String),
    /// Job fencing: a fenced Job's pods are gone and its token is still the latest: take the lock back with that
    /// token and let it run again.
    ResumeFenced { job: String, token: i64 },
    /// The holder (a Job) finished or is gone: release, then look again.
    ReleaseFinished(String),
    /// A fenced Job's token can no longer be used: queue it again for a new one.
    Requeue { job: String, token: i64 },
    /// Nobody may hold the lock now.
    Wait(Waiting),
}

/// Why nobody may hold the lock now, for the `Held` condition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Waiting {
    pub reason: &'static str,
    pub message: String,
    /// A `Lost` phase stays until the lock is held again (Job fencing: the fenced Job is still being stopped).
    pub keep_lost: bool,
    /// Whatever this replica still keeps is given up (a leader nobody may be), and released once the validity
    /// shown to its holder has ended. Job fencing leaves the keys of a fenced Job to expire instead: if the masters come back before they do, the Job resumes with its token.
    pub release_kept: bool,
    /// A Warning Event when the lock was held until now.
    pub warn_if_was_held: bool,
    pub retry: Duration,
}

/// What the policy adds to status: candidates, the queue, Jobs that may outlive the fence margin.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Decoration {
    pub candidates: Option<Vec<String>>,
    pub queue: Option<Vec<String>>,
    /// Jobs whose pods may take longer to stop than the fence margin, with that time.
    pub slow_jobs: Option<Vec<(String, Duration)>>,
    /// Jobs whose pods are not handed their grant, so cannot run under the guard.
    pub unguarded_jobs: Option<Vec<String>>,
}

/// What happens to the keys of a lost lock once its holder is fenced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeysAfterLoss {
    /// Released once the validity shown to the holder has ended (at once if its pod was deleted once finished): the holder was
    /// fenced in a way it sees (its label is gone), but it sees that late through its watch, or never when it is
    /// cut off from the API server.
    ReleaseAfterShownValidity,
    /// Left to expire: the holder may act until the validity it was shown, which the keys outlive. If the
    /// masters come back before they expire, a fenced Job resumes with its own token.
    LeaveToExpire,
}

impl Policy {
    /// Observes the holder policy of a lock of `permits.len()` permits (one for a plain lock): `permits[i]` is
    /// permit i's holder and highest known token. `Err`: a selector that cannot be evaluated, or an identity given
    /// more than one permit (refused before this, by the settings).
    pub fn observe(
        ctx: &LockContext,
        lock: &DistributedLock,
        settings: &LockSettings,
        permits: Vec<(Option<String>, i64)>,
    ) -> Result<Self, String> {
        Ok(match &settings.holder {
            HolderKind::Identity(_) if permits.len() > 1 => {
                return Err("one holder.identity holds one permit: set spec.permits to 1".to_owned());
            }
            HolderKind::Identity(holder) => Self::Identity(holder.clone()),
            HolderKind::LeaderElection(election) => {
                let silent = leader::unready::unready_leaders(ctx, lock, settings.ttl, &permits);
                let current = permits.into_iter().map(|(holder, _)| holder).collect();
                Self::Leader(Box::new(Election::observe(ctx, lock, election, current, silent)?))
            }
            HolderKind::Jobs => {
                // A plain lock's refused attempt left a ticket in its key's queue: it waits behind another holder.
                let queued = permits.len() == 1
                    && ctx
                        .lock_controller
                        .queue_tickets
                        .may_check_once_won(&settings.key);
                Self::Jobs(Box::new(JobQueue::observe_permits(ctx, lock, permits, queued)))
            }
        })
    }

    /// Confirms with direct reads what the caches say is gone or changed, then makes the writes that must come
    /// before the lock (or one of its permits) moves.
    pub async fn prepare(&mut self, ctx: &LockContext) -> Result<(), Error> {
        match self {
            Self::Identity(_) => Ok(()),
            // The label stays only on the leaders that hold their permits and are still the ones to lead; every
            // other pod loses it before a permit moves. A leader a predecessor replica held for keeps it while it is
            // resumed.
            Self::Leader(election) => {
                election.confirm_current().await?;
                election.unlabel_all_but_kept().await
            }
            Self::Jobs(jobs) => {
                let started = tokio::time::Instant::now();
                jobs.confirm().await?;
                let confirmed = started.elapsed();
                jobs.suspend_strays(ctx).await?;
                let suspended = started.elapsed();
                let result = jobs.recheck_pods(ctx).await;
                tracing::debug!(?confirmed, ?suspended, rechecked = ?started.elapsed(), "prepared");
                result
            }
        }
    }

    /// Once the key of `permit` is won for `holder`, before anything shows it: whether the grant still stands on
    /// what the preparation left to this moment (a queued Job lock's recount of its pods).
    pub async fn grant_still_clear(
        &self,
        ctx: &LockContext,
        permit: u32,
        holder: &str,
    ) -> Result<bool, Error> {
        match self {
            Self::Jobs(jobs) => jobs.grant_still_clear(ctx, permit, holder).await,
            Self::Identity(_) | Self::Leader(_) => Ok(true),
        }
    }

    /// Whether the preparation left a check of the grant until the key is won ([`Self::grant_still_clear`]): the
    /// attempt then keeps the lock's place in the key's queue until the check has passed.
    pub fn checks_once_won(&self) -> bool {
        match self {
            Self::Jobs(jobs) => jobs.recount_deferred(),
            Self::Identity(_) | Self::Leader(_) => false,
        }
    }

    /// Whose turn it is on `permit` (of a semaphore, or permit 0 of a plain lock).
    pub fn permit_turn(&self, lock: &DistributedLock, permit: u32) -> Turn {
        match self {
            Self::Identity(holder) => Turn::Hold(holder.clone()),
            Self::Leader(election) => match election.chosen_for(permit) {
                Some(chosen) => Turn::Hold(chosen.to_owned()),
                None if election.is_closing(permit) => Turn::Wait(Waiting {
                    reason: "PermitsLowered",
                    message: format!(
                        "permit {permit} is above spec.permits ({}): its leader loses the label and the permit is released once its validity has ended",
                        lock.spec.permits
                    ),
                    keep_lost: false,
                    release_kept: true,
                    warn_if_was_held: false,
                    retry: super::RESYNC,
                }),
                None => Turn::Wait(Waiting {
                    reason: "NoCandidates",
                    message: if election.candidates.is_empty() {
                        "no pod matching spec.holder.leaderElection.selector is running and ready".to_owned()
                    } else {
                        format!(
                            "no pod is free to hold permit {permit}: every running and ready pod matching spec.holder.leaderElection.selector holds another"
                        )
                    },
                    keep_lost: false,
                    release_kept: true,
                    warn_if_was_held: true,
                    retry: super::RESYNC,
                }),
            },
            Self::Jobs(jobs) => {
                let step = usize::try_from(permit)
                    .ok()
                    .and_then(|index| jobs.steps.get(index))
                    .unwrap_or(&JobStep::Idle);
                jobs_turn(step, &lock.name_any())
            }
        }
    }

    /// What status shows of the policy while `holder` (if any) is shown holding the lock (or the permit written):
    /// derived from the pods or Jobs the lock selects, the same whichever permit's write shows it.
    pub fn decoration(&self, holder: Option<&str>, fence_margin: Duration) -> Decoration {
        match self {
            Self::Identity(_) => Decoration::default(),
            Self::Leader(election) => Decoration {
                candidates: Some(election.candidates.clone()),
                ..Decoration::default()
            },
            Self::Jobs(jobs) => Decoration {
                queue: Some(jobs.queue_shown(holder)),
                slow_jobs: Some(jobs.slow(fence_margin)),
                unguarded_jobs: Some(jobs.unguarded()),
                ..Decoration::default()
            },
        }
    }

    /// Earlier grants of `permit` whose holders are known to have stopped for good, each with its token: Job
    /// fencing's finished, requeued and stale Jobs. Their values may be deleted where late writes put them back.
    pub fn stopped_grants(&self, permit: u32) -> Vec<(String, i64)> {
        match self {
            Self::Jobs(jobs) => jobs.stopped_grants(permit),
            Self::Identity(_) | Self::Leader(_) => Vec::new(),
        }
    }

    /// Status shows `holder` with `token` on `permit`: label the leader, or grant the Job (a semaphore's grant
    /// names its permit).
    #[allow(clippy::too_many_arguments)] // the facts of one grant, each used once
    pub async fn after_held(
        &self,
        ctx: &LockContext,
        lock: &DistributedLock,
        permit: u32,
        holder: &str,
        token: i64,
        valid_until: &MicroTime,
        fence_margin: Duration,
    ) -> Result<(), Error> {
        match self {
            Self::Identity(_) => Ok(()),
            // Labelled only once status shows the new token, so what the pod reads agrees with status.
            Self::Leader(election) => election.label(ctx, holder, permit, token, valid_until).await,
            // Granted only once status shows the token the Job is given.
            Self::Jobs(jobs) => {
                let permit = is_semaphore(lock).then_some(permit);
                jobs.grant(ctx, holder, token, &lock.name_any(), permit, fence_margin)
                    .await
            }
        }
    }

    /// The lock is lost: fence its holder first (the Service stops reaching the leader; the Job is suspended).
    pub async fn before_lost(
        &self,
        ctx: &LockContext,
        holder: &str,
        token: i64,
        reason: &str,
    ) -> Result<KeysAfterLoss, Error> {
        match self {
            // Nothing fences an identity's holder: it learns of the loss from status, and until then may act up
            // to the `validUntil` it was shown. Released at once, the keys went to a `lock` process while the
            // holder still saw `Held` (found by the product safety checker).
            Self::Identity(_) => Ok(KeysAfterLoss::LeaveToExpire),
            Self::Leader(election) => {
                election.unlabel(holder).await?;
                Ok(KeysAfterLoss::ReleaseAfterShownValidity)
            }
            Self::Jobs(jobs) => {
                jobs.fence(ctx, holder, token, reason).await?;
                Ok(KeysAfterLoss::LeaveToExpire)
            }
        }
    }
}

/// Job fencing's step as a turn.
fn jobs_turn(step: &JobStep, lock: &str) -> Turn {
    let wait = |reason, message| {
        Turn::Wait(Waiting {
            reason,
            message,
            keep_lost: true,
            release_kept: false,
            warn_if_was_held: false,
            retry: Duration::from_secs(5),
        })
    };
    match step.clone() {
        JobStep::Hold(job) | JobStep::Grant(job) => Turn::Hold(job),
        JobStep::ResumeFenced { job, token } => Turn::ResumeFenced { job, token },
        JobStep::ReleaseFinished(job) => Turn::ReleaseFinished(job),
        JobStep::Requeue { job, token } => Turn::Requeue { job, token },
        JobStep::WaitForFenced(job) => wait(
            "WaitingForFencedJob",
            format!("waiting for the pods of fenced Job {job} to stop before the next Job runs"),
        ),
        JobStep::WaitForPods(pods) => wait(
            "WaitingForEarlierPods",
            format!(
                "waiting for pods of an earlier grant to stop before the next Job runs: {}; a Job deleted with propagationPolicy Orphan leaves its pods running",
                pods.join(", ")
            ),
        ),
        JobStep::Idle => wait(
            "QueueEmpty",
            format!("no Job labelled {LOCK_LABEL}={lock} is waiting"),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_steps_become_turns_with_the_reasons_status_shows() {
        assert_eq!(
            jobs_turn(&JobStep::Grant("a".into()), "l"),
            Turn::Hold("a".into())
        );
        let Turn::Wait(idle) = jobs_turn(&JobStep::Idle, "batch") else {
            panic!("an empty queue waits");
        };
        assert_eq!(idle.reason, "QueueEmpty");
        assert!(idle.message.contains("redlock.io/lock=batch"), "{}", idle.message);
        assert!(idle.keep_lost, "a lost Job lock stays Lost while it waits");
        let Turn::Wait(pods) = jobs_turn(&JobStep::WaitForPods(vec!["p (Job j, token 3)".into()]), "l")
        else {
            panic!("earlier pods hold the queue");
        };
        assert_eq!(pods.reason, "WaitingForEarlierPods");
        assert!(pods.message.contains("p (Job j, token 3)"));
    }
}
