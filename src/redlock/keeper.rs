use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::client::Redlock;
use super::error::ExtendError;
use super::lease::Lease;
use super::outcome::OperationReport;
pub use super::schedule::KeepPolicy;
use super::schedule::{KeepAction, fence_time, next_keep_action};

/// Why a kept lock stopped being safe to act on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LossReason {
    /// A majority of masters hold another value: someone else has the lock.
    TakenOver { holder: Option<String> },
    /// No extension reached a majority before the fence time (validity end minus the fence margin).
    NotExtended { last_report: Option<OperationReport> },
    /// The keeper itself ran too late (the process was paused past the fence time).
    Expired,
}

impl std::fmt::Display for LossReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::TakenOver { holder: Some(holder) } => write!(f, "taken over by {holder}"),
            Self::TakenOver { holder: None } => f.write_str("taken over by another holder"),
            Self::NotExtended { .. } => f.write_str("could not be extended on a majority of masters in time"),
            Self::Expired => f.write_str("validity ran out before it could be extended"),
        }
    }
}

/// What the keeper knows now; watch it with [`KeptLock::subscribe`].
#[derive(Clone, Debug)]
pub struct KeepState {
    pub lease: Lease,
    pub extensions: u64,
    pub failed_extensions: u64,
    pub last_failure: Option<OperationReport>,
    pub lost: Option<LossReason>,
}

/// A lease kept alive in the background. The loss signal ([`KeptLock::lost_token`]) fires the moment the lock
/// is known to be lost, and at the latest `fence_margin` before its validity ends — never after.
pub struct KeptLock {
    engine: Redlock,
    state: watch::Receiver<KeepState>,
    lost: CancellationToken,
    stop: CancellationToken,
    task: Option<JoinHandle<()>>,
    policy: KeepPolicy,
}

impl KeptLock {
    pub(crate) fn start(engine: Redlock, lease: Lease, policy: KeepPolicy) -> Self {
        let (sender, state) = watch::channel(KeepState {
            lease,
            extensions: 0,
            failed_extensions: 0,
            last_failure: None,
            lost: None,
        });
        let lost = CancellationToken::new();
        let stop = CancellationToken::new();
        let task = tokio::spawn(keep(engine.clone(), sender, policy, lost.clone(), stop.clone()));
        Self {
            engine,
            state,
            lost,
            stop,
            task: Some(task),
            policy,
        }
    }

    /// Cancelled when the lock is lost or about to expire.
    pub fn lost_token(&self) -> CancellationToken {
        self.lost.clone()
    }

    /// Waits for the loss signal and says why.
    pub async fn lost(&self) -> LossReason {
        self.lost.cancelled().await;
        self.state.borrow().lost.clone().unwrap_or(LossReason::Expired)
    }

    pub fn state(&self) -> KeepState {
        self.state.borrow().clone()
    }

    pub fn subscribe(&self) -> watch::Receiver<KeepState> {
        self.state.clone()
    }

    pub fn policy(&self) -> &KeepPolicy {
        &self.policy
    }

    /// Stops extending and deletes the key on every master where it is still ours.
    pub async fn release(mut self) -> OperationReport {
        self.stop.cancel();
        if let Some(task) = self.task.take() {
            // The keeper only ends on its own; a join error means it panicked, and the lease it published last is
            // still the right one to release.
            let _ = task.await;
        }
        let lease = self.state.borrow().lease.clone();
        self.engine.release(&lease).await
    }
}

impl Drop for KeptLock {
    fn drop(&mut self) {
        // Dropped without release: stop extending and let the key expire by its TTL.
        self.stop.cancel();
    }
}

async fn keep(
    engine: Redlock,
    state: watch::Sender<KeepState>,
    policy: KeepPolicy,
    lost: CancellationToken,
    stop: CancellationToken,
) {
    let signal = |reason: LossReason| {
        tracing::warn!(resource = %state.borrow().lease.resource(), %reason, "lock lost");
        state.send_modify(|current| current.lost = Some(reason));
        lost.cancel();
    };
    let mut retrying = false;
    loop {
        let lease = state.borrow().lease.clone();
        let fence_at = fence_time(lease.valid_until(), &policy);
        let extend_at = match next_keep_action(
            Instant::now(),
            lease.valid_until(),
            lease.validity(),
            retrying,
            &policy,
        ) {
            KeepAction::SignalLost => {
                let last_report = state.borrow().last_failure.clone();
                signal(if retrying || last_report.is_some() {
                    LossReason::NotExtended { last_report }
                } else {
                    LossReason::Expired
                });
                return;
            }
            KeepAction::ExtendAt(at) => at,
        };
        tokio::select! {
            biased;
            () = stop.cancelled() => return,
            () = tokio::time::sleep_until(extend_at) => {}
        }
        let result = tokio::select! {
            biased;
            () = stop.cancelled() => return,
            // The deadline wins over a slow extension: the owner must hear before the validity ends.
            () = tokio::time::sleep_until(fence_at) => {
                state.send_modify(|current| current.failed_extensions += 1);
                retrying = true;
                continue;
            }
            result = engine.extend(&lease) => result,
        };
        match result {
            Ok(extended) => {
                retrying = false;
                state.send_modify(|current| {
                    current.lease = extended;
                    current.extensions += 1;
                    current.last_failure = None;
                });
            }
            Err(ExtendError::Lost { holder, .. }) => {
                signal(LossReason::TakenOver { holder });
                return;
            }
            Err(ExtendError::Config(_)) => {
                // The lease passed the same checks when it was granted; unreachable, but never keep a lock blindly.
                signal(LossReason::Expired);
                return;
            }
            Err(ExtendError::Expired { report }) => {
                signal(match report {
                    Some(report) => LossReason::NotExtended {
                        last_report: Some(report),
                    },
                    None => LossReason::Expired,
                });
                return;
            }
            Err(ExtendError::NoQuorum { report }) => {
                tracing::debug!(resource = %lease.resource(), %report, "extension failed, retrying");
                retrying = true;
                state.send_modify(|current| {
                    current.lease = current.lease.after_failed_extension(&report);
                    current.failed_extensions += 1;
                    current.last_failure = Some(report);
                });
            }
        }
    }
}

/// How much of the fence margin the `lock` command gives a command between SIGTERM and SIGKILL.
pub fn kill_grace(policy: &KeepPolicy) -> Duration {
    policy.fence_margin / 2
}
