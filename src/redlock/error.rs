use std::fmt;
use std::time::Duration;

use super::config::ConfigError;
use super::outcome::{NodeOutcome, OperationReport, QuarantineOutlook};
use super::value::ValueError;

/// Why an acquisition failed, in the terms a caller acts on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailureKind {
    /// Another holder has the key on too many masters, or others wait for it in its fair queue ahead of the
    /// caller.
    Contended,
    /// Too few masters were reachable (down, timing out or quarantined) to form a majority.
    TooFewMasters,
    /// A majority granted, but so slowly that no validity was left.
    ValidityExhausted,
}

impl fmt::Display for FailureKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Contended => "taken by others",
            Self::TooFewMasters => "too few masters reachable for a majority",
            Self::ValidityExhausted => "the majority answered too late to leave any validity",
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AcquireError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Value(#[from] ValueError),
    #[error(
        "lock `{resource}` not acquired after {attempts} attempt(s): {kind}{}",
        blocker(*kind, report)
    )]
    NotAcquired {
        resource: String,
        attempts: u32,
        kind: FailureKind,
        report: OperationReport,
    },
    #[error(
        "lock `{resource}` not acquired: its fencing counter is at {counter}, the largest token there is; \
         delete the counter key on every master to start again, once no protected resource remembers a token"
    )]
    TokenExhausted { resource: String, counter: i64 },
}

fn blocker(kind: FailureKind, report: &OperationReport) -> String {
    if kind == FailureKind::TooFewMasters
        && let Some(outlook) = report.quarantine_outlook()
    {
        return quarantine_blocker(report, &outlook);
    }
    let unreachable = report.unreachable_summary();
    let ahead = report
        .queue_place()
        .map_or(0, |place| place.place.saturating_sub(1));
    let queue = match ahead {
        0 => String::new(),
        1 => "; 1 waiter ahead in its fair queue".to_owned(),
        ahead => format!("; {ahead} waiters ahead in its fair queue"),
    };
    match report.blocking_holder() {
        Some(holder) => format!(" (held by {holder}{queue})"),
        None if ahead > 0 => format!(" (free, but {}; a single attempt does not jump it)", &queue[2..]),
        None if !unreachable.is_empty() => format!(
            " ({unreachable} of {}{})",
            report.nodes.len(),
            first_error(report)
                .map(|error| format!("; {error}"))
                .unwrap_or_default()
        ),
        None => String::new(),
    }
}

/// The first master's error, which says what the masters refused (an ACL user's "NoPerm", a wrong password)
/// without `-v`'s line per master. Its text never holds a password: connection URLs are not in it.
fn first_error(report: &OperationReport) -> Option<&str> {
    report.nodes.iter().find_map(|node| match &node.outcome {
        NodeOutcome::Error(error) => Some(error.as_str()),
        _ => None,
    })
}

/// ": 3 of 5 masters are still in their restart quarantine …; 3 of 5 can vote in about 42 s": what a fresh
/// installation shows for its first minute, said so that nobody takes it for a failure.
fn quarantine_blocker(report: &OperationReport, outlook: &QuarantineOutlook) -> String {
    let total = report.nodes.len();
    let others = report.unreachable_summary_but_quarantined();
    let others = if others.is_empty() {
        String::new()
    } else {
        format!(", {others}")
    };
    let outlook_text = match outlook.majority_in {
        Some(wait) => format!(
            "{} of {total} can vote in about {}, if the others stay up",
            report.quorum,
            rounded_wait(wait)
        ),
        None => format!(
            "even once it is over only {} of the {} needed could vote",
            outlook.can_vote_after, report.quorum
        ),
    };
    format!(
        ": {} of {total} masters are still in their restart quarantine (started less than max-ttl ago, they may \
         have forgotten locks){others}; {outlook_text}",
        outlook.quarantined
    )
}

/// A wait in whole seconds, rounded up ("about 42 s"), or minutes from two minutes on.
pub fn rounded_wait(wait: Duration) -> String {
    let seconds = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
    if seconds < 120 {
        format!("{} s", seconds.max(1))
    } else {
        format!("{} min", seconds.div_ceil(60))
    }
}

impl AcquireError {
    pub fn report(&self) -> Option<&OperationReport> {
        match self {
            Self::NotAcquired { report, .. } => Some(report),
            _ => None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ExtendError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("the lock's validity ended before the extension succeeded")]
    Expired { report: Option<OperationReport> },
    #[error("the lock was taken over{}", holder.as_ref().map(|h| format!(" by {h}")).unwrap_or_default())]
    Lost {
        holder: Option<String>,
        report: OperationReport,
    },
    #[error("extension reached no majority: {report}")]
    NoQuorum { report: OperationReport },
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::redlock::outcome::NodeReport;

    fn report(outcomes: Vec<NodeOutcome>) -> OperationReport {
        let quorum = outcomes.len() / 2 + 1;
        OperationReport {
            nodes: outcomes
                .into_iter()
                .enumerate()
                .map(|(i, outcome)| NodeReport {
                    endpoint: format!("redis://m{i}:6379"),
                    outcome,
                    latency: None,
                })
                .collect(),
            elapsed: Duration::from_millis(1),
            quorum,
        }
    }

    fn not_acquired(report: OperationReport) -> String {
        AcquireError::NotAcquired {
            resource: "r".into(),
            attempts: 1,
            kind: FailureKind::TooFewMasters,
            report,
        }
        .to_string()
    }

    fn quarantined(seconds: f64) -> NodeOutcome {
        NodeOutcome::Quarantined {
            remaining: Duration::from_secs_f64(seconds),
        }
    }

    #[test]
    fn a_fresh_quorum_says_when_a_majority_can_vote() {
        // Two answered; one more is needed: the earliest quarantine to end completes the majority.
        let message = not_acquired(report(vec![
            NodeOutcome::Granted,
            NodeOutcome::Granted,
            quarantined(50.0),
            quarantined(41.2),
            quarantined(59.0),
        ]));
        assert!(
            message.ends_with(
                ": 3 of 5 masters are still in their restart quarantine (started less than max-ttl ago, they may \
                 have forgotten locks); 3 of 5 can vote in about 42 s, if the others stay up"
            ),
            "{message}"
        );
        // All quarantined, one down: the third quarantine to end makes three.
        let message = not_acquired(report(vec![
            quarantined(30.0),
            quarantined(10.0),
            quarantined(20.0),
            quarantined(40.0),
            NodeOutcome::Unavailable("connection refused".into()),
        ]));
        assert!(
            message.contains("4 of 5 masters are still in their restart quarantine")
                && message.contains("), 1 not connected; 3 of 5 can vote in about 30 s"),
            "{message}"
        );
    }

    #[test]
    fn a_quarantine_that_cannot_make_a_majority_says_so() {
        let message = not_acquired(report(vec![
            quarantined(30.0),
            NodeOutcome::Timeout,
            NodeOutcome::Unavailable("connection refused".into()),
        ]));
        assert!(
            message.contains(
                "1 of 3 masters are still in their restart quarantine (started less than max-ttl ago, they may \
                 have forgotten locks), 1 timed out, 1 not connected; even once it is over only 1 of the 2 needed \
                 could vote"
            ),
            "{message}"
        );
    }

    #[test]
    fn without_quarantine_the_message_is_unchanged() {
        let message = not_acquired(report(vec![
            NodeOutcome::Granted,
            NodeOutcome::Timeout,
            NodeOutcome::Unavailable("refused".into()),
        ]));
        assert!(
            message.ends_with("too few masters reachable for a majority (1 timed out, 1 not connected of 3)"),
            "{message}"
        );
    }

    #[test]
    fn a_refusal_says_what_the_first_master_refused() {
        let message = not_acquired(report(vec![
            NodeOutcome::Error("NoPerm: this user has no permissions to access one of the keys".into()),
            NodeOutcome::Error("NoPerm: this user has no permissions to access one of the keys".into()),
            NodeOutcome::Granted,
        ]));
        assert!(
            message
                .ends_with("(2 failed of 3; NoPerm: this user has no permissions to access one of the keys)"),
            "{message}"
        );
    }

    #[test]
    fn waits_are_rounded_up() {
        assert_eq!(rounded_wait(Duration::from_millis(1)), "1 s");
        assert_eq!(rounded_wait(Duration::from_millis(41_001)), "42 s");
        assert_eq!(rounded_wait(Duration::from_secs(119)), "119 s");
        assert_eq!(rounded_wait(Duration::from_secs(121)), "3 min");
    }
}
