//! The Redlock algorithm over N independent Redis masters.
//!
//! This module knows nothing of Kubernetes: the operator, the `lock` command and the safety checker all drive
//! it through [`Redlock`], [`Lease`] and [`KeptLock`].

mod batch;
mod client;
mod config;
mod error;
mod fan_out;
#[cfg(test)]
mod fuzz;
mod info;
mod keeper;
mod lease;
mod node;
mod operations;
mod outcome;
mod permits;
mod quarantine;
mod queue;
mod quorum;
mod release_watch;
mod rules;
mod schedule;
mod script_call;
mod scripts;
mod value;
mod wake;

pub use batch::MAX_BATCH;
pub use client::Redlock;
pub use config::{
    ConfigError, DEFAULT_TOKEN_RETENTION, Endpoint, RedlockConfig, RetryPolicy, TlsOptions, with_credentials,
};
pub use error::{AcquireError, ExtendError, FailureKind, rounded_wait};
pub use keeper::{KeepPolicy, KeepState, KeptLock, LossReason, kill_grace};
pub use lease::Lease;
pub use node::{NodeHealth, NodeStatus};
pub use operations::AcquireOptions;
pub use outcome::{NodeOutcome, NodeReport, OperationReport, QuarantineOutlook, QueuePlace};
pub use quarantine::quarantine_until;
pub use queue::{QUEUE_FALLBACK, QUEUE_KEEP, QUEUE_POLL, Waiter, keep_for};
pub use quorum::quorum_of;
pub use release_watch::{ReleaseMark, ReleaseWatch};
pub(crate) use schedule::fence_time;
pub use schedule::{KeepAction, next_keep_action, shortest_ttl};
pub use scripts::{MAX_PERMITS, PERMIT_KEY_PREFIX, counter_key, permit_key, queue_keys, released_channel};

/// The acquire script, for the engine benchmark's raw baseline of the same script without the engine.
#[doc(hidden)]
pub fn acquire_script() -> &'static redis::Script {
    &scripts::ACQUIRE
}

/// The acquire and extend scripts as they run on the masters (`modern`: Redis 7 and later), for the tests that
/// check both branches decide alike. Arguments as the engine passes them (see `scripts.rs`).
#[doc(hidden)]
pub fn token_scripts(modern: bool) -> (redis::Script, redis::Script) {
    if modern {
        (scripts::ACQUIRE.clone(), scripts::EXTEND.clone())
    } else {
        scripts::legacy_scripts()
    }
}
pub use value::{LockValue, ValueError};
