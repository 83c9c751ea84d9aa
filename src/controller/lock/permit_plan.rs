//! A permit's step in one reconcile, decided without I/O in one place: first the policy's turn for it (who should
//! hold it, or what a Job queue asks for a fenced or finished Job), then, for a holder, what this replica keeps and
//! status shows (`decide`). `reconcile` carries the step out; what a step then meets on the masters is decided
//! where it is met, by the acquisition's state machine (`acquisition`) and the hand-over rule (`handover::rule`).

use super::decide::{LockAction, Wanted, acquisition_in_status, decide};
use super::policy::{Turn, Waiting};
use crate::api::DistributedLockStatus;
use crate::controller::keeper::HeldView;

/// What one permit does in this reconcile.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PermitStep {
    /// A free permit of a semaphore with nothing to do: nothing is written (its status shows the permits held; a
    /// plain lock's says why it waits).
    Idle,
    /// Nobody may hold the permit now: whatever is kept or shown of it is given up, and status says why.
    Wait(Waiting),
    /// A fenced Job's pods are gone and its token is still the latest: take the lock back with that token.
    ResumeFenced { job: String, token: i64 },
    /// The Job holding the permit finished or is gone: release it.
    ReleaseFinished { job: String },
    /// A fenced Job's token can no longer be used: queue it again for a new one.
    Requeue { job: String, token: i64 },
    /// `holder` should hold the permit: `action` is what that takes from what is kept and shown.
    Hold { holder: String, action: LockAction },
}

impl PermitStep {
    /// A held permit whose step is only to refresh its status: a semaphore writes those of all its permits at once.
    pub fn is_status_refresh(&self) -> bool {
        matches!(
            self,
            Self::Hold {
                action: LockAction::Keep { write_status: true },
                ..
            }
        )
    }
}

/// What a permit's step is decided on, besides the policy's turn.
#[derive(Clone, Copy)]
pub struct PermitSeen<'a> {
    /// What this replica keeps of the permit, if anything.
    pub held: Option<&'a HeldView>,
    /// The permit's status, as a plain lock's.
    pub status: &'a DistributedLockStatus,
    /// The highest token known to have been granted for the permit.
    pub latest_token: i64,
    /// The lock is a semaphore (spec.permits above 1, or permits above a lowered count still given up).
    pub semaphore: bool,
    /// The permit's key and quorum, where its holder should hold it.
    pub key: &'a str,
    pub quorum: &'a str,
}

/// The step for a permit whose policy gave it `turn`. Pure.
pub fn plan_permit(turn: Turn, seen: PermitSeen<'_>) -> PermitStep {
    match turn {
        Turn::Wait(_)
            if seen.semaphore && seen.held.is_none() && acquisition_in_status(seen.status).is_none() =>
        {
            PermitStep::Idle
        }
        Turn::Wait(waiting) => PermitStep::Wait(waiting),
        Turn::ResumeFenced { job, token } => PermitStep::ResumeFenced { job, token },
        Turn::ReleaseFinished(job) => PermitStep::ReleaseFinished { job },
        Turn::Requeue { job, token } => PermitStep::Requeue { job, token },
        Turn::Hold(holder) => {
            let wanted = Wanted {
                holder: &holder,
                key: seen.key,
                quorum: seen.quorum,
            };
            let action = decide(wanted, seen.held, seen.status, seen.latest_token);
            PermitStep::Hold { holder, action }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::controller::lock::decide::fixtures::{held_status, held_view};
    use crate::redlock::LossReason;

    fn waiting() -> Waiting {
        Waiting {
            reason: "NoCandidates",
            message: "no pod is ready".into(),
            keep_lost: false,
            release_kept: true,
            warn_if_was_held: true,
            retry: Duration::from_secs(30),
        }
    }

    fn seen<'a>(
        held: Option<&'a HeldView>,
        status: &'a DistributedLockStatus,
        semaphore: bool,
    ) -> PermitSeen<'a> {
        PermitSeen {
            held,
            status,
            latest_token: 4,
            semaphore,
            key: "ns/lock",
            quorum: "default",
        }
    }

    #[tokio::test]
    async fn a_free_permit_of_a_semaphore_writes_nothing_but_a_plain_lock_says_why_it_waits() {
        let nothing = DistributedLockStatus::default();
        assert_eq!(
            plan_permit(Turn::Wait(waiting()), seen(None, &nothing, true)),
            PermitStep::Idle
        );
        assert_eq!(
            plan_permit(Turn::Wait(waiting()), seen(None, &nothing, false)),
            PermitStep::Wait(waiting())
        );
    }

    #[tokio::test]
    async fn a_permit_that_must_wait_gives_up_what_is_kept_or_shown_of_it() {
        let shown = held_status("web-0", 3);
        assert_eq!(
            plan_permit(Turn::Wait(waiting()), seen(None, &shown, true)),
            PermitStep::Wait(waiting()),
            "status still shows an acquisition: waiting gives it up"
        );
        let held = held_view("web-0", 3);
        let nothing = DistributedLockStatus::default();
        assert_eq!(
            plan_permit(Turn::Wait(waiting()), seen(Some(&held), &nothing, true)),
            PermitStep::Wait(waiting()),
            "this replica keeps the key: waiting gives it up"
        );
    }

    #[tokio::test]
    async fn the_queues_steps_for_fenced_and_finished_jobs_come_before_what_is_kept() {
        let held = held_view("job-a", 3);
        let status = held_status("job-a", 3);
        assert_eq!(
            plan_permit(
                Turn::ResumeFenced {
                    job: "job-a".into(),
                    token: 3
                },
                seen(Some(&held), &status, false)
            ),
            PermitStep::ResumeFenced {
                job: "job-a".into(),
                token: 3
            }
        );
        assert_eq!(
            plan_permit(
                Turn::ReleaseFinished("job-a".into()),
                seen(Some(&held), &status, true)
            ),
            PermitStep::ReleaseFinished { job: "job-a".into() }
        );
        assert_eq!(
            plan_permit(
                Turn::Requeue {
                    job: "job-a".into(),
                    token: 3
                },
                seen(None, &status, true)
            ),
            PermitStep::Requeue {
                job: "job-a".into(),
                token: 3
            }
        );
    }

    #[tokio::test]
    async fn a_holder_is_given_what_decide_finds_for_it() {
        let nothing = DistributedLockStatus::default();
        assert_eq!(
            plan_permit(Turn::Hold("batch".into()), seen(None, &nothing, true)),
            PermitStep::Hold {
                holder: "batch".into(),
                action: LockAction::Acquire { floor: 4 }
            },
            "acquired above the latest token known"
        );
        let shown = held_status("batch", 3);
        assert_eq!(
            plan_permit(Turn::Hold("batch".into()), seen(None, &shown, false)),
            PermitStep::Hold {
                holder: "batch".into(),
                action: LockAction::Resume { token: 3 }
            },
            "a predecessor's grant is taken over"
        );
        let lost = HeldView {
            lost: Some(LossReason::TakenOver { holder: None }),
            ..held_view("batch", 3)
        };
        assert!(matches!(
            plan_permit(Turn::Hold("batch".into()), seen(Some(&lost), &shown, false)),
            PermitStep::Hold {
                action: LockAction::ReportLost { .. },
                ..
            }
        ));
    }

    #[tokio::test]
    async fn only_a_held_permit_due_for_its_status_is_a_refresh_to_batch() {
        let due = HeldView {
            status_due: true,
            ..held_view("batch", 3)
        };
        let shown = held_status("batch", 3);
        let refresh = plan_permit(Turn::Hold("batch".into()), seen(Some(&due), &shown, true));
        assert!(refresh.is_status_refresh(), "{refresh:?}");
        let kept = held_view("batch", 3);
        let settled = plan_permit(Turn::Hold("batch".into()), seen(Some(&kept), &shown, true));
        assert_eq!(
            settled,
            PermitStep::Hold {
                holder: "batch".into(),
                action: LockAction::Keep { write_status: false }
            }
        );
        assert!(!settled.is_status_refresh());
        let other = plan_permit(Turn::Hold("other".into()), seen(Some(&due), &shown, true));
        assert!(
            !other.is_status_refresh(),
            "a holder changed is released, not refreshed: {other:?}"
        );
    }
}
