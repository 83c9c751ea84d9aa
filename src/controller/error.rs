//! The one error type of the reconcilers: what failed, and the label it is counted under in
//! `redlock_reconcile_errors_total`.

use kube::runtime::finalizer;

use super::replica_lease::write_guard::refused_as_standby;

use crate::redlock::ValueError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A read, or a write of no step below, failed.
    #[error("Kubernetes API: {0}")]
    Kube(#[source] kube::Error),
    #[error("writing the lock's status: {0}")]
    StatusWrite(#[source] kube::Error),
    /// Granting, suspending, resuming or requeueing a Job.
    #[error("writing a Job: {0}")]
    JobWrite(#[source] kube::Error),
    /// Labelling a leader pod, or removing its label.
    #[error("writing a pod's leader label: {0}")]
    PodWrite(#[source] kube::Error),
    #[error("writing the fencing-token floor record: {0}")]
    FloorRecord(#[source] kube::Error),
    /// Not an error of the object: this replica may not write. Handled without backoff.
    #[error("not the active replica")]
    NotLeader,
    #[error("status kept changing under us; retrying")]
    Conflict,
    /// Adding or removing the finalizer failed; kept whole so its cause (an API error) is not lost.
    #[error("finalizer: {0}")]
    Finalizer(#[source] Box<finalizer::Error<Error>>),
    #[error("lock value: {0}")]
    Value(#[from] ValueError),
    #[error("cannot encode: {0}")]
    Encode(#[from] serde_json::Error),
}

/// What a failed request of no named step is: the write guard's refusal is this replica's standing, not an error of
/// the object (`?` on a read or a write lands here).
impl From<kube::Error> for Error {
    fn from(err: kube::Error) -> Self {
        Self::of_step(err, Self::Kube)
    }
}

impl Error {
    /// A status write that failed: `NotLeader` when the write guard refused it.
    pub fn status_write(err: kube::Error) -> Self {
        Self::of_step(err, Self::StatusWrite)
    }

    /// A Job write that failed: `NotLeader` when the write guard refused it.
    pub fn job_write(err: kube::Error) -> Self {
        Self::of_step(err, Self::JobWrite)
    }

    /// A pod's label write that failed: `NotLeader` when the write guard refused it.
    pub fn pod_write(err: kube::Error) -> Self {
        Self::of_step(err, Self::PodWrite)
    }

    /// A floor record's write that failed: `NotLeader` when the write guard refused it.
    pub fn floor_record(err: kube::Error) -> Self {
        Self::of_step(err, Self::FloorRecord)
    }

    /// The finalizer helper's failure: its patch refused by the write guard is `NotLeader`, a step's error is
    /// that error.
    pub fn of_finalizer(err: finalizer::Error<Error>) -> Self {
        match err {
            finalizer::Error::ApplyFailed(err) | finalizer::Error::CleanupFailed(err) => err,
            finalizer::Error::AddFinalizer(err) | finalizer::Error::RemoveFinalizer(err)
                if refused_as_standby(&err) =>
            {
                Self::NotLeader
            }
            other => Self::Finalizer(Box::new(other)),
        }
    }

    fn of_step(err: kube::Error, step: fn(kube::Error) -> Self) -> Self {
        if refused_as_standby(&err) {
            Self::NotLeader
        } else {
            step(err)
        }
    }

    /// A request whose answer never came (the connection failed): it may or may not have been carried out.
    pub fn outcome_unknown(&self) -> bool {
        self.kube_error()
            .is_some_and(|err| !matches!(err, kube::Error::Api(_)))
    }

    fn kube_error(&self) -> Option<&kube::Error> {
        match self {
            Self::Kube(err)
            | Self::StatusWrite(err)
            | Self::JobWrite(err)
            | Self::PodWrite(err)
            | Self::FloorRecord(err) => Some(err),
            _ => None,
        }
    }

    /// The `error` label of `redlock_reconcile_errors_total`: which step failed, so that the alert's runbook can
    /// say where to look.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Self::Kube(_) => "kube_api",
            Self::StatusWrite(_) => "status_write",
            Self::JobWrite(_) => "job_write",
            Self::PodWrite(_) => "pod_write",
            Self::FloorRecord(_) => "token_floor",
            Self::NotLeader => "not_leader",
            Self::Conflict => "conflict",
            Self::Finalizer(_) => "finalizer",
            Self::Value(_) => "lock_value",
            Self::Encode(_) => "encode",
        }
    }
}

/// Whether a call failed because the object is gone (HTTP 404): a write to something deleted is no error.
pub fn is_not_found(err: &kube::Error) -> bool {
    matches!(err, kube::Error::Api(status) if status.is_not_found())
}

/// Whether a write failed its resourceVersion precondition (HTTP 409).
pub fn is_conflict(err: &kube::Error) -> bool {
    matches!(err, kube::Error::Api(status) if status.is_conflict())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_error_has_a_distinct_metric_label() {
        let errors = [
            Error::Kube(kube::Error::LinesCodecMaxLineLengthExceeded),
            Error::StatusWrite(kube::Error::LinesCodecMaxLineLengthExceeded),
            Error::JobWrite(kube::Error::LinesCodecMaxLineLengthExceeded),
            Error::PodWrite(kube::Error::LinesCodecMaxLineLengthExceeded),
            Error::FloorRecord(kube::Error::LinesCodecMaxLineLengthExceeded),
            Error::NotLeader,
            Error::Conflict,
            Error::Finalizer(Box::new(finalizer::Error::UnnamedObject)),
            Error::Value(ValueError::Random("x".into())),
            Error::Encode(serde_json::from_str::<u8>("x").unwrap_err()),
        ];
        let mut labels: Vec<&str> = errors.iter().map(Error::metric_label).collect();
        labels.sort_unstable();
        labels.dedup();
        assert_eq!(labels.len(), errors.len());
    }
}
