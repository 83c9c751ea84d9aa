//! Values of a permit's earlier grants that reach the masters after their holders stopped. A write of a grant (an
//! extension, which re-creates the key where it vanished, or an acquisition's write finished in the background)
//! held up in the network on a connection the operator had already given up lands after the grant's validity
//! ended, and puts the old value back for a whole TTL. The next acquisition of the permit then finds the key held
//! by its own earlier value — for a Job lock usually by the very Job it grants again — on a majority, and would
//! wait that TTL out. Which of those values the acquisition may delete (compare-and-delete: only that exact value,
//! which this installation derived for this lock, its key and token) instead is decided here. Pure, so the rule is
//! tested with a fake clock.
//!
//! Deleting a value is safe once nobody can act on the grant it belongs to: its holder is known to have stopped
//! for good (a Job that finished, or that was queued again or marked stale once its pods were confirmed gone: what
//! the policy says in `stopped`), or the validity shown for it has ended (holders stop by the `validUntil` they
//! were shown, and the operator fences them before it).

use k8s_openapi::jiff::Timestamp;

use crate::api::{DistributedLockStatus, LockPhase};
use crate::redlock::{NodeOutcome, OperationReport};

/// One earlier grant's value: the holder (its label on the masters) and the token it was derived for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EarlierValue {
    pub holder: String,
    pub token: i64,
}

/// The holders named by the values that hold the key where an acquisition was refused (held by another value, or
/// queued behind one), each once.
pub fn blocking_labels(report: &OperationReport) -> Vec<String> {
    let mut labels: Vec<String> = Vec::new();
    for node in &report.nodes {
        if let NodeOutcome::HeldByOther {
            holder: Some(holder), ..
        }
        | NodeOutcome::Queued {
            holder: Some(holder), ..
        } = &node.outcome
            && !labels.contains(holder)
        {
            labels.push(holder.clone());
        }
    }
    labels
}

/// The earlier values of a permit's key that an acquisition refused by values labelled `blockers` may delete at
/// `now`:
///
/// - a grant in `stopped` (holder, token) whose holder blocks: its holder stopped for good;
/// - the token `status` shows (the permit's as a plain lock's status), for every holder that blocks, once the
///   validity status shows for it has ended and status does not show it held: it was shown to one holder only,
///   who stopped by then, and that token's value for any other holder was never shown to anyone.
///
/// Nothing else: a value of a token status shows held, of a validity not yet over, or of a token only the masters'
/// counters report (a grant status has not caught up with, or another replica's) is waited for.
pub fn deletable(
    blockers: &[String],
    stopped: &[(String, i64)],
    status: &DistributedLockStatus,
    now: Timestamp,
) -> Vec<EarlierValue> {
    let mut values: Vec<EarlierValue> = Vec::new();
    let mut add = |holder: &str, token: i64| {
        let value = EarlierValue {
            holder: holder.to_owned(),
            token,
        };
        if token > 0 && !values.contains(&value) {
            values.push(value);
        }
    };
    for (holder, token) in stopped {
        if blockers.contains(holder) {
            add(holder, *token);
        }
    }
    let shown_over = status.phase != Some(LockPhase::Held)
        && status
            .valid_until
            .as_ref()
            .is_some_and(|valid_until| valid_until.0 <= now);
    if let (true, Some(token)) = (shown_over, status.fencing_token) {
        for holder in blockers {
            add(holder, token);
        }
    }
    values
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;

    use super::*;
    use crate::controller::lock::status::tests::report;

    fn at(second: i64) -> Timestamp {
        Timestamp::from_second(second).unwrap()
    }

    fn value(holder: &str, token: i64) -> EarlierValue {
        EarlierValue {
            holder: holder.into(),
            token,
        }
    }

    /// A lost (or released) grant of `token` to `holder`, shown valid until `until`.
    fn shown(phase: LockPhase, holder: Option<&str>, token: i64, until: i64) -> DistributedLockStatus {
        DistributedLockStatus {
            phase: Some(phase),
            holder: holder.map(Into::into),
            fencing_token: Some(token),
            valid_until: Some(MicroTime(at(until))),
            ..DistributedLockStatus::default()
        }
    }

    #[test]
    fn the_blockers_are_the_labels_of_the_values_holding_the_key_or_queued_behind() {
        let refused = report(vec![
            NodeOutcome::Queued {
                place: 1,
                ticket: 3,
                holder: Some("first".into()),
                counter: None,
            },
            NodeOutcome::HeldByOther {
                holder: Some("first".into()),
                counter: Some(1),
            },
            NodeOutcome::HeldByOther {
                holder: Some("lock-cli".into()),
                counter: None,
            },
            NodeOutcome::HeldByOther {
                holder: None,
                counter: None,
            },
            NodeOutcome::Granted,
            NodeOutcome::Timeout,
        ]);
        assert_eq!(blocking_labels(&refused), ["first", "lock-cli"]);
        assert!(blocking_labels(&report(vec![NodeOutcome::Timeout, NodeOutcome::Granted])).is_empty());
    }

    #[test]
    fn a_grant_whose_job_stopped_for_good_is_deleted_whenever_it_blocks() {
        let stopped = [("first".to_owned(), 1), ("gone".to_owned(), 4)];
        // The Job was fenced before its validity ended and queued again once its pods were gone: its validity
        // need not have ended yet.
        let lost = shown(LockPhase::Lost, Some("first"), 1, 100);
        assert_eq!(
            deletable(&["first".into()], &stopped, &lost, at(90)),
            [value("first", 1)]
        );
        assert!(
            deletable(&["someone".into()], &stopped, &lost, at(90)).is_empty(),
            "only the blocking holders' values are looked for"
        );
        assert_eq!(
            deletable(&["gone".into(), "first".into()], &stopped, &lost, at(90)),
            [value("first", 1), value("gone", 4)]
        );
    }

    #[test]
    fn the_token_status_shows_is_deleted_once_the_validity_shown_has_ended() {
        let lost = shown(LockPhase::Lost, Some("app-1"), 7, 100);
        let blockers = ["app-1".to_owned()];
        assert!(
            deletable(&blockers, &[], &lost, at(99)).is_empty(),
            "its holder may act until the validity it was shown"
        );
        assert_eq!(deletable(&blockers, &[], &lost, at(100)), [value("app-1", 7)]);
        // Status no longer names the holder (a contended attempt since): the token and the labels suffice.
        let contended = shown(LockPhase::Contended, None, 7, 100);
        assert_eq!(
            deletable(&["app-1".into(), "web-0".into()], &[], &contended, at(130)),
            [value("app-1", 7), value("web-0", 7)]
        );
    }

    #[test]
    fn nothing_held_or_unknown_is_deleted() {
        let blockers = ["first".to_owned()];
        assert!(
            deletable(
                &blockers,
                &[],
                &shown(LockPhase::Held, Some("first"), 3, 100),
                at(500)
            )
            .is_empty(),
            "a token status shows held is its holder's, whatever the clock says"
        );
        assert!(deletable(&blockers, &[], &DistributedLockStatus::default(), at(500)).is_empty());
        let no_validity = DistributedLockStatus {
            valid_until: None,
            ..shown(LockPhase::Pending, None, 3, 0)
        };
        assert!(
            deletable(&blockers, &[], &no_validity, at(500)).is_empty(),
            "a permit whose status shows no validity (a semaphore's free permit)"
        );
        assert!(
            deletable(&blockers, &[("first".into(), 0)], &no_validity, at(500)).is_empty(),
            "a Job never granted has no value"
        );
        assert!(deletable(&[], &[("first".into(), 2)], &no_validity, at(500)).is_empty());
    }
}
