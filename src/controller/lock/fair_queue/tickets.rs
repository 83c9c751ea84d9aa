//! The tickets this replica's locks hold in their keys' fair queues, between reconciles: a lock that waits for a
//! key others hold or wait for is a waiter there (the masters keep its place while its reconciles keep asking),
//! and brings its ticket back to a master that restarted empty or dropped it while cut off. Lost with the
//! replica, nothing is lost for good: the masters remember the place while the next replica keeps asking.
//!
//! Beside the ticket, the highest fencing counter the masters reported while refusing: the lock's value is
//! derived from the token it proposes, so a grant at a token above the proposal is given back and asked again,
//! and that give-back frees the key and leaves the queue, letting the waiter behind take the key first (seen
//! with a lock new to a shared key, whose status knows no token, behind a `lock --wait` command). Proposing
//! above the counter the refusals showed makes the grant the one that was asked for.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use crate::controller::lock::decide::contended_retry;
use crate::redlock::{QUEUE_KEEP, QueuePlace};

/// Per permit key: the highest ticket its masters gave the lock waiting for it, and the highest fencing counter
/// they reported.
#[derive(Default)]
pub struct QueueTickets {
    waits: Mutex<HashMap<String, QueueWait>>,
}

/// The lock's wait in one key's queue, as the masters' refusals showed it.
#[derive(Clone, Copy, Default)]
struct QueueWait {
    ticket: i64,
    counter: i64,
    /// A key won while the lock waited was given back, for a check left until the key was won: the lock's next
    /// attempts make their checks first, until it keeps the key.
    gave_back: bool,
}

impl QueueTickets {
    /// The ticket to bring for `key` (0 before any).
    pub fn ticket(&self, key: &str) -> i64 {
        self.wait_in(key).ticket
    }

    /// The highest fencing counter the masters reported for `key` while refusing this replica's lock (0 before
    /// any): the next proposal goes above it.
    pub fn counter(&self, key: &str) -> i64 {
        self.wait_in(key).counter
    }

    /// Whether the lock waits in `key`'s queue (a refused attempt gave it a ticket) and may leave the checks of a
    /// grant until the key is won: not once it gave a won key back for them (see [`Self::gave_back`]).
    pub fn may_check_once_won(&self, key: &str) -> bool {
        let wait = self.wait_in(key);
        wait.ticket > 0 && !wait.gave_back
    }

    /// A key won for a check left until then was given back (the check forbade the grant). Its ticket stays, and
    /// the masters keep the lock first in the queue (it was granted as a waiter that stays,
    /// [`crate::redlock::Waiter::staying_after_grant`]), so that its next attempt, checked first, wins again.
    pub fn gave_back(&self, key: &str) {
        let mut waits = self.waits.lock().unwrap_or_else(|e| e.into_inner());
        waits.entry(key.to_owned()).or_default().gave_back = true;
    }

    /// After a refused attempt: the ticket its masters gave, and the highest counter they reported.
    pub fn remember(&self, key: &str, place: Option<&QueuePlace>, counter: Option<i64>) {
        let ticket = place.map_or(0, |place| place.ticket);
        let counter = counter.unwrap_or(0);
        if ticket <= 0 && counter <= 0 {
            return;
        }
        let mut waits = self.waits.lock().unwrap_or_else(|e| e.into_inner());
        let wait = waits.entry(key.to_owned()).or_default();
        // No longer first (the masters dropped it, or others were let through): a grant is far again, and the
        // check can wait for it again.
        if place.is_some_and(|place| place.place > 1) {
            wait.gave_back = false;
        }
        wait.ticket = wait.ticket.max(ticket);
        wait.counter = wait.counter.max(counter);
    }

    fn wait_in(&self, key: &str) -> QueueWait {
        let waits = self.waits.lock().unwrap_or_else(|e| e.into_inner());
        waits.get(key).copied().unwrap_or_default()
    }

    /// The key is the lock's: its next wait is a new arrival, at the back.
    pub fn forget(&self, key: &str) {
        self.waits.lock().unwrap_or_else(|e| e.into_inner()).remove(key);
    }
}

/// How soon a lock waiting in a key's fair queue asks again: at a contended lock's pace (`random_unit` in 0..1),
/// but often enough that the masters keep its place ([`QUEUE_KEEP`], with one attempt to spare). Not at a `lock`
/// command's 200 ms: an attempt of a Job lock that may not leave its pods' recount until the key is won (its
/// first, or the one after it gave a won key back) lists them first, and a waiting lock would cost the API server
/// five lists a second.
pub fn queued_retry(ttl: Duration, random_unit: f64) -> Duration {
    contended_retry(ttl, random_unit).min(QUEUE_KEEP / 2)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn place(place: u64, ticket: i64) -> QueuePlace {
        QueuePlace {
            place,
            ticket,
            settled: true,
        }
    }

    #[test]
    fn tickets_only_rise_until_the_key_is_granted() {
        let tickets = QueueTickets::default();
        assert_eq!(tickets.ticket("k"), 0);
        tickets.remember("k", Some(&place(3, 7)), None);
        tickets.remember("k", Some(&place(2, 5)), None);
        assert_eq!(tickets.ticket("k"), 7);
        tickets.remember("k", Some(&place(1, 0)), None);
        assert_eq!(
            tickets.ticket("k"),
            7,
            "a caller that was not queued learns nothing"
        );
        tickets.forget("k");
        assert_eq!(tickets.ticket("k"), 0);
    }

    #[test]
    fn the_highest_counter_refusals_reported_is_kept_until_the_key_is_granted() {
        let tickets = QueueTickets::default();
        assert_eq!(tickets.counter("k"), 0);
        tickets.remember("k", Some(&place(1, 3)), Some(41));
        tickets.remember("k", None, Some(40));
        assert_eq!(tickets.counter("k"), 41, "counters only rise");
        assert_eq!(
            tickets.ticket("k"),
            3,
            "a refusal without a place keeps the ticket"
        );
        tickets.remember("k", None, Some(42));
        assert_eq!(tickets.counter("k"), 42);
        assert_eq!(tickets.counter("other"), 0);
        tickets.forget("k");
        assert_eq!((tickets.ticket("k"), tickets.counter("k")), (0, 0));
    }

    #[test]
    fn a_lock_that_gave_a_won_key_back_checks_first_until_it_keeps_the_key() {
        let tickets = QueueTickets::default();
        assert!(!tickets.may_check_once_won("k"), "not queued: checks first");
        tickets.remember("k", Some(&place(1, 3)), None);
        assert!(tickets.may_check_once_won("k"));
        tickets.gave_back("k");
        assert!(!tickets.may_check_once_won("k"));
        assert_eq!(
            tickets.ticket("k"),
            3,
            "the ticket stays: the lock is still first"
        );
        tickets.remember("k", Some(&place(1, 4)), None);
        assert!(
            !tickets.may_check_once_won("k"),
            "still first, waiting for the same grant"
        );
        tickets.remember("k", Some(&place(2, 4)), None);
        assert!(
            tickets.may_check_once_won("k"),
            "behind another again: the grant is far"
        );
        tickets.forget("k");
        tickets.remember("k", Some(&place(2, 9)), None);
        assert!(tickets.may_check_once_won("k"), "a new wait after a kept key");
    }

    #[test]
    fn a_queued_lock_asks_again_before_the_masters_drop_it() {
        for ttl in [1, 3, 10, 600] {
            for unit in [0.0, 0.5, 1.0] {
                let retry = queued_retry(Duration::from_secs(ttl), unit);
                assert!(retry <= QUEUE_KEEP / 2, "{ttl}s, {unit}: {retry:?}");
                assert!(retry >= Duration::from_millis(200), "{ttl}s, {unit}: {retry:?}");
            }
        }
        // Short TTLs keep a contended lock's pace.
        assert_eq!(
            queued_retry(Duration::from_secs(3), 0.0),
            contended_retry(Duration::from_secs(3), 0.0)
        );
    }
}
