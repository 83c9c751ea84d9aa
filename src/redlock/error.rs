use std::fmt;

use super::{ConfigError, OperationReport, ValueError};

/// Why an acquisition failed, in the terms a caller acts on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailureKind {
    /// Another holder has the key on too many masters.
    Contended,
    /// Too few masters were reachable (down, timing out or quarantined) to form a majority.
    TooFewMasters,
    /// A majority granted, but so slowly that no validity was left.
    ValidityExhausted,
}

impl fmt::Display for FailureKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Contended => "held by another holder",
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
        blocker(report)
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

fn blocker(report: &OperationReport) -> String {
    let unreachable = report.unreachable_summary();
    match report.blocking_holder() {
        Some(holder) => format!(" (held by {holder})"),
        None if !unreachable.is_empty() => format!(" ({unreachable} of {})", report.nodes.len()),
        None => String::new(),
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
