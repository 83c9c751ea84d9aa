//! What to do with a lock once its policy named the holder: a pure function of what this replica keeps, what
//! status says and the highest token known, so every branch is tested without a cluster.

use std::time::Duration;

use k8s_openapi::jiff::{SignedDuration, Timestamp};

use crate::api::{DistributedLockStatus, LockPhase};
use crate::controller::keeper::HeldView;
use crate::redlock::{LossReason, NodeOutcome, OperationReport};

/// Who should hold the lock, where.
#[derive(Clone, Copy, Debug)]
pub struct Wanted<'a> {
    pub holder: &'a str,
    pub key: &'a str,
    pub quorum: &'a str,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LockAction {
    /// Held and extended by this replica; refresh status when it is due or out of date.
    Keep { write_status: bool },
    /// The keeper gave up on the lock: report it (the fence time is before `validUntil`), then re-acquire.
    ReportLost { reason: LossReason },
    /// This replica holds a lock that no longer matches the spec (holder, key or quorum changed).
    ReleaseHeld,
    /// Status names a holder other than the wanted one, held by a predecessor of this replica: release that
    /// acquisition (its value can be rebuilt from the token) before acquiring for the new holder.
    ReleasePrevious { token: i64, holder: String },
    /// Status says the wanted holder has the lock, but this replica does not hold it: a predecessor
    /// (restarted or failed-over replica) did. Take it over without a new token.
    Resume { token: i64 },
    /// Acquire with a token above `floor`, the highest this replica knows was granted for the lock (the masters'
    /// counters and the cluster's floor record may raise it further).
    Acquire { floor: i64 },
}

pub fn decide(
    wanted: Wanted<'_>,
    held: Option<&HeldView>,
    status: &DistributedLockStatus,
    highest_token_written: i64,
) -> LockAction {
    if let Some(held) = held {
        if let Some(reason) = &held.lost {
            return LockAction::ReportLost {
                reason: reason.clone(),
            };
        }
        if held.lease.holder() != wanted.holder || held.key != wanted.key || held.quorum != wanted.quorum {
            return LockAction::ReleaseHeld;
        }
        let shown = status.phase == Some(LockPhase::Held)
            && status.fencing_token == Some(held.token)
            && status.holder.as_deref() == Some(wanted.holder);
        return LockAction::Keep {
            write_status: held.status_due || !shown,
        };
    }
    if status.phase == Some(LockPhase::Held)
        && let (Some(holder), Some(token)) = (&status.holder, status.fencing_token)
    {
        if holder == wanted.holder {
            return LockAction::Resume { token };
        }
        return LockAction::ReleasePrevious {
            token,
            holder: holder.clone(),
        };
    }
    LockAction::Acquire {
        floor: known_floor(status, highest_token_written),
    }
}

/// The highest token known to have been granted for the lock: status (written by anyone allowed to, so a negative
/// value counts as none) or this replica's own writes, which the status cache may not show yet.
pub fn known_floor(status: &DistributedLockStatus, highest_token_written: i64) -> i64 {
    status
        .fencing_token
        .unwrap_or(0)
        .max(highest_token_written)
        .max(0)
}

/// Who holds the lock as far as this replica can tell: the holder of a lease it keeps (and has not lost), else
/// the holder status shows for a `Held` lock (a predecessor's, right after a restart or failover).
pub fn current_holder(held: Option<&HeldView>, status: &DistributedLockStatus) -> Option<String> {
    held.filter(|held| held.lost.is_none())
        .map(|held| held.lease.holder().to_owned())
        .or_else(|| {
            status
                .holder
                .clone()
                .filter(|_| status.phase == Some(LockPhase::Held))
        })
}

/// The acquisition status names (held, or lost and perhaps still on the masters): its holder and token, from which
/// its value is rebuilt to release it.
pub fn acquisition_in_status(status: &DistributedLockStatus) -> Option<(&str, i64)> {
    match (status.phase, &status.holder, status.fencing_token) {
        (Some(LockPhase::Held | LockPhase::Lost), Some(holder), Some(token)) => Some((holder, token)),
        _ => None,
    }
}

/// After a resume attempt could not reach a majority: keep trying while the validity status shows leaves
/// room for the fence margin; after that the lock counts as lost (reported before `validUntil`).
pub fn resume_still_possible(status: &DistributedLockStatus, fence_margin: Duration, now: Timestamp) -> bool {
    let Some(valid_until) = &status.valid_until else {
        return false;
    };
    // Exact to the nanosecond: a margin cut to whole milliseconds would leave room that is not there.
    let margin = SignedDuration::try_from(fence_margin).unwrap_or(SignedDuration::MAX);
    // `validUntil` is whatever status says, written by anyone allowed to: an out-of-range subtraction means
    // the margin reaches before any time a timestamp can show, so no room is left.
    valid_until
        .0
        .checked_sub(margin)
        .is_ok_and(|fence_at| now < fence_at)
}

/// After an attempt to take a fenced Job's lock back with its own token reached no majority: whether trying again
/// could still bring it back, that is whether the masters that kept the value, with those whose answer is unknown
/// (unreachable, or not waited for), could make a majority. A master sitting out its restart quarantine is not one
/// of those: it restarted empty, and nothing but a vote writes the value (an extension or a take-back), which a
/// quarantined master is never asked for, so it never holds the value when it votes again. Counted, it kept a Job
/// lock `Lost` while its quorum was back, until the last restarted master left its quarantine, its take-back
/// refreshing the old value meanwhile (issue 48: 30 s after the other locks, the chart's five masters with three
/// restarted one after another).
pub fn take_back_still_possible(report: &OperationReport) -> bool {
    let unknown = report
        .nodes
        .iter()
        .filter(|node| match &node.outcome {
            NodeOutcome::Quarantined { .. } => false,
            outcome => outcome.is_unreachable() || *outcome == NodeOutcome::Pending,
        })
        .count();
    report.votes().saturating_add(unknown) >= report.quorum
}

/// Pause before the next attempt on a contended lock: a fraction of the TTL, so a freed lock is taken soon
/// without hammering the masters; random so that contenders do not retry in lockstep.
pub fn contended_retry(ttl: Duration, random_unit: f64) -> Duration {
    let base = (ttl / 4).clamp(Duration::from_millis(200), Duration::from_secs(5));
    base.mul_f64(1.0 + random_unit.clamp(0.0, 1.0))
}

/// What the tests of the lock's decisions look at: a `Held` status and what this replica keeps of a lock `ns/lock`
/// on the quorum `default`.
#[cfg(test)]
pub mod fixtures {
    use std::time::Duration;

    use tokio::time::Instant;

    use crate::api::{DistributedLockStatus, LockPhase};
    use crate::controller::keeper::HeldView;
    use crate::redlock::{Lease, LockValue};

    pub fn held_status(holder: &str, token: i64) -> DistributedLockStatus {
        DistributedLockStatus {
            phase: Some(LockPhase::Held),
            holder: Some(holder.into()),
            fencing_token: Some(token),
            ..DistributedLockStatus::default()
        }
    }

    pub fn held_view(holder: &str, token: i64) -> HeldView {
        HeldView {
            lease: Lease::for_tests(
                "ns/lock",
                LockValue::random(holder).unwrap_or_else(|err| panic!("a lock value: {err}")),
                Duration::from_secs(10),
                Instant::now(),
            ),
            quorum: "default".into(),
            key: "ns/lock".into(),
            token,
            lost: None,
            status_due: false,
            last_failure: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;

    use super::fixtures::{held_status, held_view};
    use super::*;

    const WANTED: Wanted<'static> = Wanted {
        holder: "batch",
        key: "ns/lock",
        quorum: "default",
    };

    #[tokio::test]
    async fn a_lock_not_held_is_acquired_above_the_highest_token_known() {
        let status = DistributedLockStatus::default();
        assert_eq!(decide(WANTED, None, &status, 0), LockAction::Acquire { floor: 0 });
        let lost = DistributedLockStatus {
            phase: Some(LockPhase::Lost),
            fencing_token: Some(7),
            ..DistributedLockStatus::default()
        };
        assert_eq!(decide(WANTED, None, &lost, 0), LockAction::Acquire { floor: 7 });
        assert_eq!(
            decide(WANTED, None, &lost, 9),
            LockAction::Acquire { floor: 9 },
            "a token this replica wrote wins over a status cache that lags behind"
        );
    }

    #[tokio::test]
    async fn status_tokens_out_of_range_are_no_arithmetic_but_a_floor() {
        let forged = |token| DistributedLockStatus {
            phase: Some(LockPhase::Pending),
            fencing_token: Some(token),
            ..DistributedLockStatus::default()
        };
        assert_eq!(
            decide(WANTED, None, &forged(i64::MAX), 0),
            LockAction::Acquire { floor: i64::MAX },
            "the largest token is passed on, for the acquisition to say it cannot go above it"
        );
        assert_eq!(
            decide(WANTED, None, &forged(-5), 0),
            LockAction::Acquire { floor: 0 }
        );
        assert_eq!(
            decide(WANTED, None, &forged(i64::MIN), 3),
            LockAction::Acquire { floor: 3 }
        );
    }

    #[tokio::test]
    async fn a_held_lock_is_kept_and_status_written_when_out_of_date() {
        let held = held_view("batch", 3);
        assert_eq!(
            decide(WANTED, Some(&held), &held_status("batch", 3), 3),
            LockAction::Keep { write_status: false }
        );
        assert_eq!(
            decide(WANTED, Some(&held), &DistributedLockStatus::default(), 3),
            LockAction::Keep { write_status: true }
        );
        let due = HeldView {
            status_due: true,
            ..held.clone()
        };
        assert_eq!(
            decide(WANTED, Some(&due), &held_status("batch", 3), 3),
            LockAction::Keep { write_status: true }
        );
    }

    #[tokio::test]
    async fn loss_is_reported_before_anything_else() {
        let lost = HeldView {
            lost: Some(LossReason::TakenOver { holder: None }),
            ..held_view("batch", 3)
        };
        assert!(matches!(
            decide(WANTED, Some(&lost), &held_status("batch", 3), 3),
            LockAction::ReportLost { .. }
        ));
    }

    #[tokio::test]
    async fn a_changed_holder_releases_first() {
        let held = held_view("old", 3);
        assert_eq!(
            decide(WANTED, Some(&held), &held_status("old", 3), 3),
            LockAction::ReleaseHeld
        );
        assert_eq!(
            decide(WANTED, None, &held_status("old", 3), 0),
            LockAction::ReleasePrevious {
                token: 3,
                holder: "old".into()
            }
        );
    }

    #[tokio::test]
    async fn a_restarted_replica_resumes_without_a_new_token() {
        assert_eq!(
            decide(WANTED, None, &held_status("batch", 4), 0),
            LockAction::Resume { token: 4 }
        );
    }

    #[tokio::test]
    async fn the_current_holder_is_the_kept_lease_then_status() {
        let kept = held_view("web-1", 2);
        assert_eq!(
            current_holder(Some(&kept), &held_status("web-0", 1)).as_deref(),
            Some("web-1")
        );
        let lost = HeldView {
            lost: Some(LossReason::Expired),
            ..kept
        };
        assert_eq!(
            current_holder(Some(&lost), &held_status("web-0", 1)).as_deref(),
            Some("web-0")
        );
        let mut not_held = held_status("web-0", 1);
        not_held.phase = Some(LockPhase::Lost);
        assert_eq!(current_holder(None, &not_held), None);
    }

    #[test]
    fn the_acquisition_to_release_is_the_one_status_shows_held_or_lost() {
        let held = held_status("web-0", 4);
        assert_eq!(acquisition_in_status(&held), Some(("web-0", 4)));
        let lost = DistributedLockStatus {
            phase: Some(LockPhase::Lost),
            ..held.clone()
        };
        assert_eq!(acquisition_in_status(&lost), Some(("web-0", 4)));
        let released = DistributedLockStatus {
            phase: Some(LockPhase::Pending),
            ..held.clone()
        };
        assert_eq!(
            acquisition_in_status(&released),
            None,
            "released: nothing to give up"
        );
        let unnamed = DistributedLockStatus { holder: None, ..held };
        assert_eq!(acquisition_in_status(&unnamed), None);
    }

    #[test]
    fn resume_gives_up_a_fence_margin_before_the_validity_shown() {
        let now = Timestamp::from_second(1_000).unwrap();
        let mut status = held_status("batch", 4);
        status.valid_until = Some(MicroTime(now + SignedDuration::from_secs(3)));
        assert!(resume_still_possible(&status, Duration::from_secs(2), now));
        assert!(!resume_still_possible(
            &status,
            Duration::from_secs(2),
            now + SignedDuration::from_secs(1)
        ));
        status.valid_until = None;
        assert!(!resume_still_possible(&status, Duration::from_secs(2), now));
    }

    #[test]
    fn a_fenced_jobs_lock_is_not_waited_for_on_masters_in_their_restart_quarantine() {
        use crate::controller::lock::status::tests::report;
        use NodeOutcome::{Granted, NotHeld, Pending, Timeout};
        let quarantined = || NodeOutcome::Quarantined {
            remaining: Duration::from_secs(20),
        };
        let unavailable = || NodeOutcome::Unavailable("connecting".into());
        let five = |outcomes: Vec<NodeOutcome>| OperationReport {
            quorum: 3,
            ..report(outcomes)
        };
        // The drill of issue 48: two masters keep the value, three restarted; the first is back and empty.
        assert!(!take_back_still_possible(&five(vec![
            NotHeld,
            quarantined(),
            quarantined(),
            Granted,
            Granted
        ])));
        assert!(!take_back_still_possible(&five(vec![
            quarantined(),
            quarantined(),
            quarantined(),
            Granted,
            Granted
        ])));
        // Masters not heard from may still hold it: a take-back may yet succeed.
        assert!(take_back_still_possible(&five(vec![
            NotHeld,
            Timeout,
            quarantined(),
            Granted,
            Granted
        ])));
        assert!(take_back_still_possible(&five(vec![
            unavailable(),
            quarantined(),
            Pending,
            Granted,
            NotHeld
        ])));
        assert!(!take_back_still_possible(&five(vec![
            NotHeld, NotHeld, Timeout, Granted, NotHeld
        ])));
    }

    #[test]
    fn contended_retries_scale_with_the_ttl_and_are_bounded() {
        assert_eq!(
            contended_retry(Duration::from_secs(10), 0.0),
            Duration::from_millis(2500)
        );
        assert_eq!(
            contended_retry(Duration::from_secs(10), 1.0),
            Duration::from_secs(5)
        );
        assert_eq!(
            contended_retry(Duration::from_millis(100), 0.0),
            Duration::from_millis(200)
        );
        assert_eq!(
            contended_retry(Duration::from_secs(3600), 0.5),
            Duration::from_millis(7500)
        );
    }
}
