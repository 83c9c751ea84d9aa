//! A `DistributedLock`'s status, all of it here. This module: the status edits, named pure functions of (current
//! status, facts, stamp), each returning the next status, so every edit is tested without a cluster; `permits`
//! (pure): a semaphore's status seen one permit at a time; `write`: the one function that writes them, and the
//! stamp of an edit made now.

pub mod permits;
pub mod write;

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, Time};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use tokio::time::Instant;

use super::policy::{Decoration, Waiting};
use crate::api::conditions::{self, Stamp, Update};
use crate::api::holder_contract::TOKEN_ANNOTATION;
use crate::api::lock::MasterOutcome;
use crate::api::{DistributedLockStatus, LockPhase};
use crate::redlock::OperationReport;

/// What a `Held` write shows, and so what status must show before it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Showing {
    /// A new acquisition: needs a higher token than status shows.
    NewToken,
    /// The same acquisition, extended or resumed after a restart: needs no newer token, and never brings back a
    /// token status shows lost — its holder was told, and the next holding gets a new token (a status cache
    /// that lagged behind the loss made a resume take the old one back). A refresh over an older token counts
    /// as the acquisition: that acquisition's own write did not land.
    Refresh,
    /// A fenced Job's lock taken back with its own token, once its pods are confirmed stopped.
    TakeBackFenced,
}

/// A grant or extension to show.
pub struct HeldFacts<'a> {
    pub holder: &'a str,
    pub token: i64,
    pub showing: Showing,
    pub renewed_at: Timestamp,
    pub valid_until: Timestamp,
    pub report: &'a OperationReport,
}

/// Not acquired now, and why.
pub struct Blocked<'a> {
    pub phase: LockPhase,
    pub reason: &'static str,
    pub message: &'a str,
    pub report: &'a OperationReport,
}

/// `Held` with the grant's token and validity; `None` when status shows a token that makes this write stale
/// (the token in status never goes back: a new acquisition needs a higher one, a refresh the same).
pub fn held(
    current: &DistributedLockStatus,
    facts: &HeldFacts<'_>,
    decoration: &Decoration,
    fence_margin: Duration,
    stamp: Stamp,
) -> Option<DistributedLockStatus> {
    let shown = current.fencing_token.unwrap_or(0);
    let stale = match facts.showing {
        Showing::NewToken => shown >= facts.token,
        Showing::Refresh => {
            shown > facts.token || (shown == facts.token && current.phase == Some(LockPhase::Lost))
        }
        Showing::TakeBackFenced => shown > facts.token,
    };
    if stale {
        return None;
    }
    let mut next = current.clone();
    if shown < facts.token {
        next.transitions = next.transitions.saturating_add(1);
        next.acquired_at = Some(Time(stamp.now));
    }
    next.phase = Some(LockPhase::Held);
    next.holder = Some(facts.holder.to_owned());
    next.fencing_token = Some(facts.token);
    next.renewed_at = Some(MicroTime(facts.renewed_at));
    next.valid_until = Some(MicroTime(facts.valid_until));
    next.quorum = Some(votes(facts.report));
    next.masters = masters(facts.report);
    next.blocked_by = None;
    next.queue_place = None;
    next.observed_generation = stamp.generation;
    decorate(&mut next, decoration, fence_margin, stamp);
    conditions::set(&mut next.conditions, ready(), stamp);
    conditions::set(&mut next.conditions, held_by(facts.holder, facts.token), stamp);
    Some(next)
}

/// Not acquired: contended, too few masters, or too slow; says who or what blocks it.
pub fn waiting(
    current: &DistributedLockStatus,
    blocked: &Blocked<'_>,
    decoration: &Decoration,
    fence_margin: Duration,
    stamp: Stamp,
) -> DistributedLockStatus {
    let mut next = current.clone();
    next.phase = Some(blocked.phase);
    next.holder = None;
    next.blocked_by = blocked.report.blocking_holder();
    next.queue_place = blocked
        .report
        .queue_place()
        .and_then(|place| i64::try_from(place.place).ok());
    next.masters = masters(blocked.report);
    next.quorum = Some(votes(blocked.report));
    next.observed_generation = stamp.generation;
    decorate(&mut next, decoration, fence_margin, stamp);
    conditions::set(&mut next.conditions, ready(), stamp);
    conditions::set(
        &mut next.conditions,
        not_held(blocked.reason, blocked.message),
        stamp,
    );
    next
}

/// The policy lets nobody hold the lock now (no candidate, an empty queue, a fenced Job still stopping).
pub fn policy_waiting(
    current: &DistributedLockStatus,
    waiting: &Waiting,
    decoration: &Decoration,
    stamp: Stamp,
) -> DistributedLockStatus {
    let mut next = current.clone();
    if !(waiting.keep_lost && next.phase == Some(LockPhase::Lost)) {
        next.phase = Some(LockPhase::Pending);
    }
    next.holder = None;
    next.queue_place = None;
    next.observed_generation = stamp.generation;
    if let Some(candidates) = &decoration.candidates {
        next.candidates = candidates.clone();
    }
    if let Some(queue) = &decoration.queue {
        next.queue = queue.clone();
    }
    conditions::set(&mut next.conditions, ready(), stamp);
    conditions::set(
        &mut next.conditions,
        not_held(waiting.reason, &waiting.message),
        stamp,
    );
    next
}

/// What the policy makes of the pods or Jobs the lock selects, shown as it is now (`status.queue`, `candidates`,
/// `FencingMayBeLate`), everything else as it was: a status that already shows it is returned unchanged, so the
/// caller writes only when the cluster changed what status shows.
pub fn decorated(
    current: &DistributedLockStatus,
    decoration: &Decoration,
    fence_margin: Duration,
    stamp: Stamp,
) -> DistributedLockStatus {
    let mut next = current.clone();
    decorate(&mut next, decoration, fence_margin, stamp);
    next
}

/// Could not be extended, or taken over: the holder was fenced; the lock is acquired again.
pub fn lost(current: &DistributedLockStatus, message: &str, stamp: Stamp) -> DistributedLockStatus {
    let mut next = current.clone();
    next.phase = Some(LockPhase::Lost);
    next.transitions = next.transitions.saturating_add(1);
    next.observed_generation = stamp.generation;
    conditions::set(&mut next.conditions, not_held("Lost", message), stamp);
    next
}

/// The spec or its quorum cannot be acted on.
pub fn not_ready(
    current: &DistributedLockStatus,
    phase: LockPhase,
    reason: &'static str,
    message: &str,
    stamp: Stamp,
) -> DistributedLockStatus {
    let mut next = current.clone();
    next.phase = Some(phase);
    next.holder = None;
    next.blocked_by = None;
    next.queue_place = None;
    next.observed_generation = stamp.generation;
    conditions::set(
        &mut next.conditions,
        Update::new("Ready", false, reason, message),
        stamp,
    );
    conditions::set(&mut next.conditions, not_held(reason, message), stamp);
    next
}

/// The spec was edited into one the operator cannot act on while this replica holds the lock: the holding stays
/// as it is (kept extended, its holder neither moved nor fenced) and `Ready` says why, until the spec is fixed or
/// the lock deleted. Giving the key up instead would leave a running Job or a labelled leader acting after its
/// validity without the policy that fences it, since an invalid spec names no policy to act through.
pub fn invalid_while_held(
    current: &DistributedLockStatus,
    reason: &'static str,
    message: &str,
    stamp: Stamp,
) -> DistributedLockStatus {
    let mut next = current.clone();
    next.observed_generation = stamp.generation;
    let message = format!(
        "{message}; the lock stays with its holder under the last valid spec (kept extended, the holder neither moved nor fenced) until the spec is fixed or the lock deleted"
    );
    conditions::set(
        &mut next.conditions,
        Update::new("Ready", false, reason, &message),
        stamp,
    );
    next
}

/// Released for a holder the spec no longer wants (or a Job that finished): nobody holds it until the next
/// acquisition.
pub fn released(current: &DistributedLockStatus, message: &str, stamp: Stamp) -> DistributedLockStatus {
    let mut next = current.clone();
    next.phase = Some(LockPhase::Pending);
    next.holder = None;
    next.observed_generation = stamp.generation;
    conditions::set(&mut next.conditions, not_held("HolderChanged", message), stamp);
    next
}

/// `Ready=True`: the spec is valid and its quorum can be used.
fn ready() -> Update {
    Update::new("Ready", true, "Valid", "spec is valid and the quorum exists")
}

/// `Held=True`.
fn held_by(holder: &str, token: i64) -> Update {
    Update::new(
        "Held",
        true,
        "Held",
        format!("held by {holder} with fencing token {token}"),
    )
}

/// `Held=False`, for `reason`.
fn not_held(reason: &'static str, message: &str) -> Update {
    Update::new("Held", false, reason, message)
}

/// `FencingMayBeLate`: whether a queued Job's pods may outlive the validity shown to them: they are not handed
/// their grant (so they cannot run under the guard, and only the operator stops them), or they may take longer
/// to stop than the fence margin leaves.
fn fencing_may_be_late(slow: &[(String, Duration)], unguarded: &[String], margin: Duration) -> Update {
    let slow_message = (!slow.is_empty()).then(|| {
        let names: Vec<String> = slow
            .iter()
            .map(|(job, grace)| format!("{job} ({}s)", grace.as_secs()))
            .collect();
        format!(
            "the termination grace period of {} exceeds the fence margin ({}): their pods may outlive the lock's validity; lower terminationGracePeriodSeconds or raise spec.holder.jobs.fenceMargin",
            names.join(", "),
            crate::duration::format(margin)
        )
    });
    if !unguarded.is_empty() {
        let mut message = format!(
            "the pods of {} are not handed their grant (no container gets the annotation {TOKEN_ANNOTATION} through the downward API), so they cannot run their work under `redlock-operator guard` and only the operator stops them: a failover between replicas or an API-server outage can leave them running past the lock's validity; run the work under the guard (examples/job-fencing.yaml)",
            unguarded.join(", ")
        );
        if let Some(slow) = slow_message {
            message = format!("{message}; and {slow}");
        }
        return Update::new("FencingMayBeLate", true, "GrantNotPassedToPods", message);
    }
    match slow_message {
        None => Update::new(
            "FencingMayBeLate",
            false,
            "GracePeriodsFit",
            "every queued Job's pods are handed their grant and stop within the fence margin",
        ),
        Some(message) => Update::new("FencingMayBeLate", true, "GracePeriodTooLong", message),
    }
}

fn decorate(status: &mut DistributedLockStatus, decoration: &Decoration, margin: Duration, stamp: Stamp) {
    if let Some(candidates) = &decoration.candidates {
        status.candidates = candidates.clone();
    }
    if let Some(queue) = &decoration.queue {
        status.queue = queue.clone();
    }
    if let Some(slow) = &decoration.slow_jobs {
        let unguarded = decoration.unguarded_jobs.as_deref().unwrap_or_default();
        conditions::set(
            &mut status.conditions,
            fencing_may_be_late(slow, unguarded, margin),
            stamp,
        );
    }
}

fn votes(report: &OperationReport) -> String {
    format!("{}/{}", report.votes(), report.nodes.len())
}

pub fn masters(report: &OperationReport) -> Vec<MasterOutcome> {
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
pub fn wall_at(at: Instant, now: Instant, wall_now: Timestamp) -> Timestamp {
    let millis = |duration: Duration| i64::try_from(duration.as_millis()).unwrap_or(i64::MAX);
    let offset = if at >= now {
        SignedDuration::from_millis(millis(at - now))
    } else {
        -SignedDuration::from_millis(millis(now - at))
    };
    wall_now.checked_add(offset).unwrap_or(wall_now)
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::redlock::{NodeOutcome, NodeReport};

    fn stamp(second: i64) -> Stamp {
        Stamp {
            generation: Some(2),
            now: Timestamp::from_second(second).unwrap(),
        }
    }

    /// A report of `outcomes`, one master each, decided at a quorum of 2.
    pub(in crate::controller::lock) fn report(outcomes: Vec<NodeOutcome>) -> OperationReport {
        OperationReport {
            nodes: outcomes
                .into_iter()
                .enumerate()
                .map(|(i, outcome)| NodeReport {
                    endpoint: format!("redis://m{i}"),
                    outcome,
                    latency: None,
                })
                .collect(),
            elapsed: Duration::ZERO,
            quorum: 2,
        }
    }

    fn condition<'a>(
        status: &'a DistributedLockStatus,
        type_: &str,
    ) -> &'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
        status
            .conditions
            .iter()
            .find(|condition| condition.type_ == type_)
            .unwrap_or_else(|| panic!("no {type_} condition"))
    }

    fn facts<'a>(token: i64, new_token: bool, report: &'a OperationReport) -> HeldFacts<'a> {
        HeldFacts {
            holder: "web-0",
            token,
            showing: if new_token {
                Showing::NewToken
            } else {
                Showing::Refresh
            },
            renewed_at: Timestamp::from_second(100).unwrap(),
            valid_until: Timestamp::from_second(110).unwrap(),
            report,
        }
    }

    #[test]
    fn a_new_token_must_be_higher_and_a_refresh_must_not_be_older() {
        let granted = report(vec![
            NodeOutcome::Granted,
            NodeOutcome::Granted,
            NodeOutcome::Timeout,
        ]);
        let none = Decoration::default();
        let margin = Duration::from_secs(2);
        let first = held(
            &DistributedLockStatus::default(),
            &facts(1, true, &granted),
            &none,
            margin,
            stamp(100),
        )
        .expect("a first acquisition");
        assert_eq!(first.phase, Some(LockPhase::Held));
        assert_eq!((first.fencing_token, first.transitions), (Some(1), 1));
        assert_eq!(first.quorum.as_deref(), Some("2/3"));
        assert_eq!(first.acquired_at, Some(Time(stamp(100).now)));
        assert_eq!(
            condition(&first, "Held").message,
            "held by web-0 with fencing token 1"
        );
        assert_eq!(condition(&first, "Ready").status, "True");
        assert_eq!(first.observed_generation, Some(2));

        assert!(
            held(&first, &facts(1, true, &granted), &none, margin, stamp(101)).is_none(),
            "not twice"
        );
        assert!(
            held(&first, &facts(0, false, &granted), &none, margin, stamp(101)).is_none(),
            "never back"
        );
        let unrecorded = held(
            &DistributedLockStatus::default(),
            &facts(1, false, &granted),
            &none,
            margin,
            stamp(100),
        )
        .expect("a refresh over an older token");
        assert_eq!(
            unrecorded.transitions, 1,
            "counts the acquisition whose own write did not land"
        );
        let refreshed =
            held(&first, &facts(1, false, &granted), &none, margin, stamp(105)).expect("a refresh");
        assert_eq!(refreshed.transitions, 1, "a refresh is no transition");
        assert_eq!(refreshed.acquired_at, first.acquired_at);
        assert_eq!(
            condition(&refreshed, "Held").last_transition_time,
            Time(stamp(100).now)
        );
    }

    #[test]
    fn a_token_shown_lost_is_never_shown_held_again_except_a_fenced_job_taken_back() {
        let granted = report(vec![NodeOutcome::Granted, NodeOutcome::Granted]);
        let none = Decoration::default();
        let margin = Duration::from_secs(2);
        let first = held(
            &DistributedLockStatus::default(),
            &facts(3, true, &granted),
            &none,
            margin,
            stamp(100),
        )
        .expect("held");
        let lost = super::lost(&first, "lock lost", stamp(101));
        assert!(
            held(&lost, &facts(3, false, &granted), &none, margin, stamp(102)).is_none(),
            "a resume from a status cache that lagged behind the loss brings the old token back"
        );
        let taken_back = HeldFacts {
            showing: Showing::TakeBackFenced,
            ..facts(3, false, &granted)
        };
        let job = held(&lost, &taken_back, &none, margin, stamp(102)).expect("a fenced Job resumes");
        assert_eq!(job.phase, Some(LockPhase::Held));
        assert_eq!(job.fencing_token, Some(3));
        let next = held(&lost, &facts(4, true, &granted), &none, margin, stamp(102)).expect("a new token");
        assert_eq!(next.fencing_token, Some(4));
    }

    /// Status of a Job lock held with `decoration`, at a 10 s fence margin.
    fn held_with(decoration: &Decoration) -> DistributedLockStatus {
        let granted = report(vec![NodeOutcome::Granted, NodeOutcome::Granted]);
        held(
            &DistributedLockStatus::default(),
            &facts(4, true, &granted),
            decoration,
            Duration::from_secs(10),
            stamp(100),
        )
        .expect("held")
    }

    #[test]
    fn job_fencing_shows_the_queue_without_the_holder_and_warns_of_slow_jobs() {
        let status = held_with(&Decoration {
            queue: Some(vec!["next".into()]),
            slow_jobs: Some(vec![("slow".into(), Duration::from_secs(30))]),
            ..Decoration::default()
        });
        assert_eq!(status.queue, ["next"]);
        let late = condition(&status, "FencingMayBeLate");
        assert_eq!(
            (late.status.as_str(), late.reason.as_str()),
            ("True", "GracePeriodTooLong")
        );
        assert!(
            late.message.contains("slow (30s)") && late.message.contains("(10s)"),
            "{}",
            late.message
        );
    }

    #[test]
    fn what_the_jobs_and_pods_make_of_status_follows_them_and_is_unchanged_while_they_are() {
        let decoration = |queue: &[&str], slow: Vec<(String, Duration)>| Decoration {
            queue: Some(queue.iter().map(|job| (*job).to_owned()).collect()),
            slow_jobs: Some(slow),
            unguarded_jobs: Some(Vec::new()),
            ..Decoration::default()
        };
        let margin = Duration::from_secs(10);
        let shown = held_with(&decoration(&["next"], Vec::new()));
        assert_eq!(
            decorated(&shown, &decoration(&["next"], Vec::new()), margin, stamp(200)),
            shown,
            "nothing changed: nothing to write, however much later"
        );
        let queued = decorated(
            &shown,
            &decoration(&["next", "later"], Vec::new()),
            margin,
            stamp(200),
        );
        assert_eq!(queued.queue, ["next", "later"]);
        assert_eq!(
            DistributedLockStatus {
                queue: shown.queue.clone(),
                ..queued.clone()
            },
            shown,
            "only the queue changed: the grant, its validity and the conditions are as they were"
        );
        let slow = decorated(
            &queued,
            &decoration(
                &["next", "later"],
                vec![("later".into(), Duration::from_secs(30))],
            ),
            margin,
            stamp(201),
        );
        let late = condition(&slow, "FencingMayBeLate");
        assert_eq!(
            (late.status.as_str(), late.reason.as_str()),
            ("True", "GracePeriodTooLong")
        );
        let leader = DistributedLockStatus {
            candidates: vec!["web-0".into()],
            ..DistributedLockStatus::default()
        };
        let candidates = Decoration {
            candidates: Some(vec!["web-1".into(), "web-0".into()]),
            ..Decoration::default()
        };
        assert_eq!(
            decorated(&leader, &candidates, margin, stamp(200)).candidates,
            ["web-1", "web-0"]
        );
        assert_eq!(
            decorated(&leader, &Decoration::default(), margin, stamp(200)),
            leader,
            "an identity lock's policy shows nothing"
        );
    }

    #[test]
    fn job_fencing_warns_of_jobs_whose_pods_are_not_handed_their_grant() {
        let with = |unguarded: Vec<String>, slow: Vec<(String, Duration)>| {
            let status = held_with(&Decoration {
                queue: Some(Vec::new()),
                slow_jobs: Some(slow),
                unguarded_jobs: Some(unguarded),
                ..Decoration::default()
            });
            condition(&status, "FencingMayBeLate").clone()
        };
        let fine = with(Vec::new(), Vec::new());
        assert_eq!(
            (fine.status.as_str(), fine.reason.as_str()),
            ("False", "GracePeriodsFit")
        );
        let bare = with(
            vec!["report".into()],
            vec![("slow".into(), Duration::from_secs(30))],
        );
        assert_eq!(
            (bare.status.as_str(), bare.reason.as_str()),
            ("True", "GrantNotPassedToPods")
        );
        assert!(
            bare.message.contains("report") && bare.message.contains("slow (30s)"),
            "both are told: {}",
            bare.message
        );
    }

    #[test]
    fn a_contended_lock_names_who_blocks_it() {
        let other = || NodeOutcome::HeldByOther {
            holder: Some("batch-7".into()),
            counter: None,
        };
        let contended = report(vec![other(), other(), NodeOutcome::Granted]);
        let blocked = Blocked {
            phase: LockPhase::Contended,
            reason: "Contended",
            message: "key `k` is held by batch-7; retrying",
            report: &contended,
        };
        let before = DistributedLockStatus {
            holder: Some("stale".into()),
            ..DistributedLockStatus::default()
        };
        let next = waiting(
            &before,
            &blocked,
            &Decoration::default(),
            Duration::from_secs(2),
            stamp(100),
        );
        assert_eq!(next.phase, Some(LockPhase::Contended));
        assert_eq!(next.holder, None);
        assert_eq!(next.blocked_by.as_deref(), Some("batch-7"));
        assert_eq!(next.masters.len(), 3);
        assert_eq!(condition(&next, "Held").reason, "Contended");
        assert_eq!(condition(&next, "Ready").status, "True");
    }

    #[test]
    fn policy_waits_keep_a_lost_phase_only_where_asked() {
        let lost_before = lost(&DistributedLockStatus::default(), "lock lost: x", stamp(100));
        assert_eq!(
            (lost_before.phase, lost_before.transitions),
            (Some(LockPhase::Lost), 1)
        );
        let waiting = |keep_lost| Waiting {
            reason: "QueueEmpty",
            message: "no Job".into(),
            keep_lost,
            release_kept: false,
            warn_if_was_held: false,
            retry: Duration::from_secs(5),
        };
        let decoration = Decoration {
            candidates: Some(vec!["web-1".into()]),
            ..Decoration::default()
        };
        let kept = policy_waiting(&lost_before, &waiting(true), &decoration, stamp(101));
        assert_eq!(kept.phase, Some(LockPhase::Lost));
        assert_eq!(kept.candidates, ["web-1"]);
        let pending = policy_waiting(&lost_before, &waiting(false), &decoration, stamp(101));
        assert_eq!(pending.phase, Some(LockPhase::Pending));
        assert_eq!(condition(&pending, "Held").reason, "QueueEmpty");
    }

    #[test]
    fn counters_saturate_instead_of_wrapping() {
        let status = DistributedLockStatus {
            transitions: i64::MAX,
            ..DistributedLockStatus::default()
        };
        assert_eq!(lost(&status, "x", stamp(1)).transitions, i64::MAX);
    }

    #[test]
    fn not_ready_and_released_say_why_nobody_holds_the_lock() {
        let invalid = not_ready(
            &DistributedLockStatus::default(),
            LockPhase::Invalid,
            "TtlAboveMaxTtl",
            "spec.ttl exceeds maxTtl",
            stamp(1),
        );
        assert_eq!(condition(&invalid, "Ready").status, "False");
        assert_eq!(condition(&invalid, "Held").reason, "TtlAboveMaxTtl");
        let held = DistributedLockStatus {
            phase: Some(LockPhase::Held),
            holder: Some("job-a".into()),
            fencing_token: Some(4),
            ..DistributedLockStatus::default()
        };
        let kept = invalid_while_held(&held, "TtlAboveMaxTtl", "spec.ttl exceeds maxTtl", stamp(1));
        assert_eq!(
            (kept.phase, kept.holder.as_deref(), kept.fencing_token),
            (Some(LockPhase::Held), Some("job-a"), Some(4)),
            "an invalid edit moves nothing"
        );
        let ready = condition(&kept, "Ready");
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", "TtlAboveMaxTtl")
        );
        assert!(ready.message.contains("last valid spec"), "{}", ready.message);
        let released = released(&invalid, "released for a", stamp(2));
        assert_eq!(released.phase, Some(LockPhase::Pending));
        assert_eq!(condition(&released, "Held").reason, "HolderChanged");
    }

    #[tokio::test(start_paused = true)]
    async fn wall_times_of_far_instants_do_not_overflow() {
        let now = Instant::now();
        let wall = Timestamp::from_second(1_000).unwrap();
        assert_eq!(
            wall_at(now + Duration::from_millis(1500), now, wall),
            Timestamp::from_millisecond(1_001_500).unwrap()
        );
        assert_eq!(
            wall_at(now + Duration::from_secs(u64::MAX / 4), now, wall),
            wall,
            "out of range: now, the conservative end, never a panic"
        );
    }
}
