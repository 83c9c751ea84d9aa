//! The gate every Redis and API write checks synchronously at the moment of the call: whether this replica is
//! the active one, by a deadline on this process's monotonic clock; and, when it can no longer confirm that, whether
//! it may still extend the locks it holds (no other replica seen active since its last term).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use tokio::sync::watch;
use tokio::time::Instant;

/// Whether this replica may write, right now.
pub struct Leadership {
    base: Instant,
    /// Milliseconds after `base` until which this replica may write; 0 = not leader.
    deadline_ms: AtomicU64,
    /// This replica was active and has seen no other replica take over since: it may keep extending what it holds.
    no_successor_seen: AtomicBool,
    /// How many times this replica became the leader: what it learnt in an earlier term (another replica may have
    /// been active in between) is not taken for this one's.
    terms: AtomicU64,
    changes: watch::Sender<bool>,
}

impl Leadership {
    pub(super) fn new() -> Arc<Self> {
        let (changes, _) = watch::channel(false);
        Arc::new(Self {
            base: Instant::now(),
            deadline_ms: AtomicU64::new(0),
            no_successor_seen: AtomicBool::new(false),
            terms: AtomicU64::new(0),
            changes,
        })
    }

    /// For a single replica with no Lease (tests, `--no-leader-election`): always leader.
    pub fn always() -> Arc<Self> {
        let leadership = Self::new();
        leadership.deadline_ms.store(u64::MAX, Ordering::SeqCst);
        leadership.no_successor_seen.store(true, Ordering::SeqCst);
        leadership.terms.store(1, Ordering::SeqCst);
        leadership.changes.send_replace(true);
        leadership
    }

    pub fn is_leader(&self) -> bool {
        let deadline = self.deadline_ms.load(Ordering::SeqCst);
        deadline != 0 && self.millis(Instant::now()) < deadline
    }

    /// Whether this replica may keep extending the locks it already holds (compare-and-extend only): while it is
    /// the leader, and after its leadership lapsed without confirmation (the API server does not answer) for as
    /// long as it has seen no other replica active. Lock values are derived, so a successor holds the same values:
    /// when it releases or re-grants a lock, the compare fails and this replica stops extending it.
    pub fn may_extend_held(&self) -> bool {
        self.is_leader() || self.no_successor_seen.load(Ordering::SeqCst)
    }

    /// Leadership lapsed, but no other replica has been seen active: only extensions of held locks may go on.
    pub fn is_unconfirmed(&self) -> bool {
        !self.is_leader() && self.no_successor_seen.load(Ordering::SeqCst)
    }

    /// This replica's current (or last) term as the leader, counted from 1; 0 before the first.
    pub fn term(&self) -> u64 {
        self.terms.load(Ordering::SeqCst)
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
        if lapsed {
            // Before the deadline moves: whoever sees this replica leading sees the new term.
            self.terms.fetch_add(1, Ordering::SeqCst);
        }
        self.deadline_ms
            .store(self.millis(until).max(1), Ordering::SeqCst);
        self.no_successor_seen.store(true, Ordering::SeqCst);
        if lapsed {
            // Always an edge, even when the lapse was never published: whoever resumes locks on becoming the
            // leader must hear of every new term.
            tracing::debug!("leadership (re)gained");
            self.changes.send_replace(true);
        }
    }

    /// Another replica is active (or this one handed the Lease back): stop everything, extensions included.
    pub(super) fn step_down(&self) {
        self.no_successor_seen.store(false, Ordering::SeqCst);
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

    #[tokio::test(start_paused = true)]
    async fn each_time_leadership_is_gained_a_new_term_begins_and_renewals_keep_it() {
        let leadership = Leadership::new();
        assert_eq!(leadership.term(), 0);
        leadership.extend_until(Instant::now() + Duration::from_secs(3));
        leadership.extend_until(Instant::now() + Duration::from_secs(6));
        assert_eq!(leadership.term(), 1, "a renewal is the same term");
        leadership.step_down();
        leadership.extend_until(Instant::now() + Duration::from_secs(3));
        assert_eq!(leadership.term(), 2);
        tokio::time::advance(Duration::from_secs(4)).await;
        leadership.extend_until(Instant::now() + Duration::from_secs(3));
        assert_eq!(
            leadership.term(),
            3,
            "after a lapse too: another replica may have led meanwhile"
        );
        assert_eq!(Leadership::always().term(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn an_unconfirmed_leader_may_only_extend_until_it_sees_a_successor() {
        let leadership = Leadership::new();
        assert!(
            !leadership.may_extend_held(),
            "a replica that never led holds nothing"
        );
        leadership.extend_until(Instant::now() + Duration::from_secs(3));
        tokio::time::advance(Duration::from_secs(60)).await;
        assert!(!leadership.is_leader(), "no writes without a renewal");
        assert!(leadership.is_unconfirmed() && leadership.may_extend_held());
        leadership.step_down();
        assert!(
            !leadership.may_extend_held(),
            "another replica is active: nothing at all"
        );
        leadership.extend_until(Instant::now() + Duration::from_secs(3));
        assert!(leadership.is_leader() && !leadership.is_unconfirmed());
    }
}
