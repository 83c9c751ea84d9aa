//! The gate every Redis and API write checks synchronously at the moment of the call: whether this replica is
//! the active one, by a deadline on this process's monotonic clock.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::watch;
use tokio::time::Instant;

/// Whether this replica may write, right now.
pub struct Leadership {
    base: Instant,
    /// Milliseconds after `base` until which this replica may write; 0 = not leader.
    deadline_ms: AtomicU64,
    changes: watch::Sender<bool>,
}

impl Leadership {
    pub(super) fn new() -> Arc<Self> {
        let (changes, _) = watch::channel(false);
        Arc::new(Self {
            base: Instant::now(),
            deadline_ms: AtomicU64::new(0),
            changes,
        })
    }

    /// For a single replica with no Lease (tests, `--no-leader-election`): always leader.
    pub fn always() -> Arc<Self> {
        let leadership = Self::new();
        leadership.deadline_ms.store(u64::MAX, Ordering::SeqCst);
        leadership.changes.send_replace(true);
        leadership
    }

    pub fn is_leader(&self) -> bool {
        let deadline = self.deadline_ms.load(Ordering::SeqCst);
        deadline != 0 && self.millis(Instant::now()) < deadline
    }

    /// Becomes true when this replica becomes the leader, false when it stops.
    pub fn subscribe(&self) -> watch::Receiver<bool> {
        self.changes.subscribe()
    }

    fn millis(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.base).as_millis()).unwrap_or(u64::MAX)
    }

    pub(super) fn extend_until(&self, until: Instant) {
        let lapsed = !self.is_leader();
        self.deadline_ms
            .store(self.millis(until).max(1), Ordering::SeqCst);
        if lapsed {
            // Always an edge, even when the lapse was never published: whoever resumes locks on becoming the
            // leader must hear of every new term.
            tracing::debug!("leadership (re)gained");
            self.changes.send_replace(true);
        }
    }

    pub(super) fn step_down(&self) {
        self.deadline_ms.store(0, Ordering::SeqCst);
        self.changes
            .send_if_modified(|leader| std::mem::replace(leader, false));
    }

    /// Publishes a lapse noticed by the clock alone (the renewal loop may be stuck on a slow API server).
    pub(super) fn refresh(&self) {
        let leader = self.is_leader();
        self.changes
            .send_if_modified(|current| std::mem::replace(current, leader) != leader);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn leadership_lapses_by_the_clock_alone() {
        let leadership = Leadership::new();
        assert!(!leadership.is_leader());
        leadership.extend_until(Instant::now() + Duration::from_secs(3));
        assert!(leadership.is_leader());
        tokio::time::advance(Duration::from_secs(3)).await;
        assert!(
            !leadership.is_leader(),
            "no renewal: no writes, without waiting for any task"
        );
        assert!(Leadership::always().is_leader());
    }
}
