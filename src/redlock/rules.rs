//! The pure rules that turn what the masters answered into results, shared by the single-key operations
//! (`operations.rs`), batched extensions (`batch.rs`) and semaphore permits (`permits.rs`): what a script's reply
//! means, which answers count towards a majority, and what a decided acquisition or extension attempt comes to.
//! No I/O and no clock of their own (the callers pass the instants), so that one rule serves every path.

use std::time::Duration;

use redis::Value;
use tokio::time::Instant;

use super::error::{AcquireError, ExtendError, FailureKind};
use super::lease::{Lease, validity_left};
use super::outcome::{NodeOutcome, OperationReport};
use super::queue::Waiter;
use super::value::LockValue;

/// An operation on one key, as the scripts take it.
/// Proposal rounds in one acquisition attempt: the first, and re-proposals above the counters masters reported.
/// One re-proposal is enough unless contenders raise the counters at the same time.
pub(super) const PROPOSAL_ROUNDS: u32 = 4;

#[derive(Clone, Copy, Debug)]
pub(super) enum Op {
    Acquire {
        ttl_ms: u64,
        token: i64,
        waiter: Option<Waiter>,
    },
    Extend {
        ttl_ms: u64,
        token: i64,
    },
    Release,
    /// Takes a waiter out of the key's fair queue (it got the key, or gave up).
    LeaveQueue {
        waiter: Waiter,
        /// How many places at the head of the queue let a waiter through (its leave from one of them is
        /// announced to the key's waiters); 0: a leave nobody needs to hear of (a lock's winner, which holds it).
        wake: u32,
    },
}

impl Op {
    /// Whether this answer counts towards the majority that decides the operation. A release is done on a
    /// master that answered at all: it deleted our value, or the value was not there (expired, or never set).
    pub(super) fn counts(self, outcome: &NodeOutcome) -> bool {
        match self {
            Self::Release | Self::LeaveQueue { .. } => {
                matches!(outcome, NodeOutcome::Granted | NodeOutcome::NotHeld)
            }
            Self::Acquire { .. } | Self::Extend { .. } => outcome.is_vote(),
        }
    }
}

/// Why one acquisition attempt, undone, failed: `granted` says a majority granted it too late to leave any
/// validity.
pub(super) fn failed_attempt(resource: &str, granted: bool, report: OperationReport) -> AcquireError {
    if report.highest_counter() == Some(i64::MAX) {
        return AcquireError::TokenExhausted {
            resource: resource.to_owned(),
            counter: i64::MAX,
        };
    }
    let kind = if granted {
        FailureKind::ValidityExhausted
    } else if report.nodes.len() - report.unreachable() < report.quorum {
        FailureKind::TooFewMasters
    } else {
        FailureKind::Contended
    };
    AcquireError::NotAcquired {
        resource: resource.to_owned(),
        attempts: 1,
        kind,
        report,
    }
}

/// The one rule for every extension, single or batched: a majority confirmed our value before the current
/// validity ended, and time is left after the drift allowance.
pub(super) fn extend_outcome(
    lease: &Lease,
    started: Instant,
    decided_at: Instant,
    report: OperationReport,
    extended: bool,
    drift: Duration,
) -> Result<Lease, ExtendError> {
    if decided_at >= lease.valid_until {
        return Err(ExtendError::Expired { report: Some(report) });
    }
    if let (true, Some(validity)) = (extended, validity_left(lease.ttl, started, decided_at, drift)) {
        // The majority that voted held the key throughout, so every key this lease re-created since is its own:
        // the new lease has no unconfirmed masters.
        return Ok(Lease::granted(lease.holding(), started, validity, report));
    }
    let taken = report
        .nodes
        .iter()
        .filter(|node| matches!(node.outcome, NodeOutcome::HeldByOther { .. }))
        .count();
    if report.nodes.len() - taken < report.quorum {
        Err(ExtendError::Lost {
            holder: report.blocking_holder(),
            report,
        })
    } else {
        Err(ExtendError::NoQuorum { report })
    }
}

/// The fencing counter a master reported when it refused a proposal. The scripts answer only canonical
/// decimals: one that does not parse is beyond the largest token, and the acquisition then says the token is
/// exhausted instead of failing obscurely.
pub(super) fn reported_counter(raw: &[u8]) -> i64 {
    std::str::from_utf8(raw)
        .ok()
        .and_then(|counter| counter.parse().ok())
        .unwrap_or(i64::MAX)
}

/// The counter a refusal for another holder or for the queue reports alongside (nil: none at or above the
/// proposal).
pub(super) fn known_counter(value: &Value) -> Option<i64> {
    match value {
        Value::BulkString(raw) => Some(reported_counter(raw)),
        _ => None,
    }
}

/// The holder a refusal names: the label of a value one of our clients wrote (nil or foreign: none).
pub(super) fn holder_named(value: &Value) -> Option<String> {
    match value {
        Value::BulkString(raw) => LockValue::holder_of(raw),
        _ => None,
    }
}

pub(super) fn interpret(op: Op, reply: Value) -> NodeOutcome {
    let other = |raw: &[u8], counter: Option<i64>| NodeOutcome::HeldByOther {
        holder: LockValue::holder_of(raw),
        counter,
    };
    match (op, reply) {
        (Op::Acquire { .. }, Value::Int(1)) => NodeOutcome::Granted,
        (Op::Acquire { .. }, Value::Array(items)) => match items.as_slice() {
            [Value::Int(0), Value::BulkString(counter)] => NodeOutcome::TokenTooLow {
                counter: reported_counter(counter),
            },
            [Value::Int(2), Value::BulkString(raw), known @ ..] if known.len() <= 1 => {
                other(raw, known.first().and_then(known_counter))
            }
            [
                Value::Int(3),
                Value::Int(place),
                holder,
                Value::BulkString(ticket),
                known @ ..,
            ] if known.len() <= 1 => NodeOutcome::Queued {
                place: u64::try_from(*place).unwrap_or(0),
                ticket: reported_counter(ticket),
                holder: holder_named(holder),
                counter: known.first().and_then(known_counter),
            },
            unexpected => NodeOutcome::Error(format!("unexpected reply {unexpected:?}")),
        },
        (Op::Extend { .. }, Value::BulkString(raw)) => other(&raw, None),
        (Op::Extend { .. }, Value::Int(1)) | (Op::Release, Value::Int(1)) => NodeOutcome::Granted,
        (Op::Extend { .. }, Value::Int(2)) => NodeOutcome::Recreated,
        (Op::Release | Op::Extend { .. }, Value::Int(0)) => NodeOutcome::NotHeld,
        (Op::LeaveQueue { .. }, Value::Int(_)) => NodeOutcome::Granted,
        (_, unexpected) => NodeOutcome::Error(format!("unexpected reply {unexpected:?}")),
    }
}

/// Whether a higher proposal could still win: enough masters answered neither "held by another" nor not at all.
pub(super) fn could_grant(report: &OperationReport) -> bool {
    let held = report
        .nodes
        .iter()
        .filter(|node| {
            matches!(
                node.outcome,
                NodeOutcome::HeldByOther { .. } | NodeOutcome::Queued { .. }
            )
        })
        .count();
    report
        .nodes
        .len()
        .saturating_sub(held)
        .saturating_sub(report.unreachable())
        >= report.quorum
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reported_counter_that_does_not_parse_is_beyond_the_largest_token() {
        assert_eq!(reported_counter(b"41"), 41);
        assert_eq!(reported_counter(b"9223372036854775807"), i64::MAX);
        assert_eq!(reported_counter(b"9223372036854775808"), i64::MAX);
        assert_eq!(reported_counter(b"x"), i64::MAX);
    }

    #[test]
    fn a_refusal_reports_the_counter_it_has() {
        let refused = Value::Array(vec![Value::Int(0), Value::BulkString(b"41".to_vec())]);
        assert_eq!(
            interpret(
                Op::Acquire {
                    ttl_ms: 1,
                    token: 1,
                    waiter: None
                },
                refused
            ),
            NodeOutcome::TokenTooLow { counter: 41 }
        );
    }

    /// The engine checker's fair mode found it: a master restarted empty and two that missed the last grants
    /// made a majority for a token below the one the two refusing masters had given (they answered with their
    /// queue, not their counter). Every refusal now carries the counter that is not below the proposal.
    #[test]
    fn a_refusal_for_another_holder_or_the_queue_carries_a_higher_counter() {
        let acquire = Op::Acquire {
            ttl_ms: 1,
            token: 74,
            waiter: None,
        };
        let held = interpret(
            acquire,
            Value::Array(vec![
                Value::Int(2),
                Value::BulkString(b"other".to_vec()),
                Value::BulkString(b"78".to_vec()),
            ]),
        );
        assert_eq!(
            held,
            NodeOutcome::HeldByOther {
                holder: None,
                counter: Some(78)
            }
        );
        let queued_above = interpret(
            acquire,
            Value::Array(vec![
                Value::Int(3),
                Value::Int(3),
                Value::Nil,
                Value::BulkString(b"9".to_vec()),
                Value::BulkString(b"78".to_vec()),
            ]),
        );
        assert_eq!(
            queued_above,
            NodeOutcome::Queued {
                place: 3,
                ticket: 9,
                holder: None,
                counter: Some(78)
            }
        );
        let below = Value::Array(vec![
            Value::Int(2),
            Value::BulkString(b"other".to_vec()),
            Value::Nil,
        ]);
        assert_eq!(
            interpret(acquire, below),
            NodeOutcome::HeldByOther {
                holder: None,
                counter: None
            }
        );
        let answers = report(vec![
            NodeOutcome::Granted,
            NodeOutcome::Granted,
            NodeOutcome::Granted,
            held,
            queued_above,
        ]);
        assert_eq!(answers.highest_counter(), Some(78));
    }

    fn report(outcomes: Vec<NodeOutcome>) -> OperationReport {
        OperationReport {
            quorum: outcomes.len() / 2 + 1,
            nodes: outcomes
                .into_iter()
                .map(|outcome| super::super::outcome::NodeReport {
                    endpoint: String::new(),
                    outcome,
                    latency: None,
                })
                .collect(),
            elapsed: Duration::ZERO,
        }
    }

    fn queued(place: u64, ticket: i64) -> NodeOutcome {
        NodeOutcome::Queued {
            place,
            ticket,
            holder: None,
            counter: None,
        }
    }

    #[test]
    fn a_queued_answer_says_place_ticket_and_holder() {
        let acquire = Op::Acquire {
            ttl_ms: 1,
            token: 1,
            waiter: None,
        };
        let reply = |holder: Value| {
            Value::Array(vec![
                Value::Int(3),
                Value::Int(2),
                holder,
                Value::BulkString(b"7".to_vec()),
            ])
        };
        assert_eq!(interpret(acquire, reply(Value::Nil)), queued(2, 7));
        let held = LockValue::random("ci-7").expect("value");
        assert_eq!(
            interpret(
                acquire,
                reply(Value::BulkString(held.as_str().as_bytes().to_vec()))
            ),
            NodeOutcome::Queued {
                place: 2,
                ticket: 7,
                holder: Some("ci-7".to_owned()),
                counter: None,
            }
        );
    }

    #[test]
    fn the_place_is_the_one_a_majority_gives_or_better_and_the_ticket_the_highest() {
        // Five masters: the third smallest place is the one a majority gives.
        let place = report(vec![
            queued(4, 9),
            queued(2, 9),
            queued(3, 9),
            NodeOutcome::Timeout,
            queued(1, 9),
        ])
        .queue_place()
        .expect("queued");
        assert_eq!((place.place, place.ticket, place.settled), (3, 9, true));
        // Masters that gave different tickets: the highest, and not settled yet.
        let place = report(vec![queued(1, 3), queued(1, 4), NodeOutcome::Pending])
            .queue_place()
            .expect("queued");
        assert_eq!((place.place, place.ticket, place.settled), (1, 4, false));
        // Decided before a majority answered: the largest place heard.
        let place = report(vec![queued(5, 0), NodeOutcome::Pending, NodeOutcome::Pending])
            .queue_place()
            .expect("queued");
        assert_eq!(place.place, 5);
        assert_eq!(report(vec![NodeOutcome::Timeout; 3]).queue_place(), None);
        // A queue counts as contention: no further proposal round is made.
        assert!(!could_grant(&report(vec![
            queued(2, 1),
            queued(2, 1),
            NodeOutcome::Granted
        ])));
    }
}
