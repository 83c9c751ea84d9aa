//! A holder's term as status shows it, and the stop time its wall-clock `validUntil` gives: shared by the watch
//! of the lock (`term`) and the stop time counted from the replica's answers (`stop_time`), which falls back to
//! it where status offers no channel.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use tokio::time::Instant;

/// A holder's term as status shows it: what `elect` and the Job guard run their command under.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Term {
    /// The permit this pod holds, of a semaphore (spec.permits above 1).
    pub permit: Option<u32>,
    pub token: i64,
    pub valid_until: Timestamp,
}

/// When to stop acting on `term`, on this process's monotonic clock.
pub fn fence_instant(term: &Term, margin: Duration, now: Instant, wall_now: Timestamp) -> Instant {
    let left = term.valid_until.duration_since(wall_now);
    let left = Duration::try_from(left).unwrap_or(Duration::ZERO);
    (now + left).checked_sub(margin).map_or(now, |at| at.max(now))
}
