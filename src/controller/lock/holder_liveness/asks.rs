//! The asks this replica answered, per permit: the grant's token, when its holder was first seen able to ask,
//! when it last asked and until when it was told its grant stays valid. Kept in memory only, for the active
//! replica's own view (a successor starts afresh and gives every holder the first ask's grace again, and moves no
//! lock for a silence it did not see).
//!
//! Bounded by the permits held: an ask is recorded only when it was answered with a validity, which needs the
//! lock's uid and the token of a grant this replica keeps (nothing a client without that knowledge sends adds an
//! entry), and one entry per permit is kept, replaced when the grant's token changes. Kept by lock, so that each
//! look at a lock costs its own permits, not every lock's.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

use crate::controller::keeper::{LockRef, PermitRef};

/// Beside the drift allowance: timers and scheduling on a loaded node.
const CLOCK_ROOM: Duration = Duration::from_millis(200);

/// What is known of the asks of one grant's holder.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AskRecord {
    /// The grant's fencing token: a new grant starts a new record.
    pub token: i64,
    /// This replica's term as the leader when the record was made (`Leadership::term`): another replica may have
    /// answered the holder between two terms, so a new term starts a new record.
    pub term: u64,
    /// When its holder was first seen able to ask (its pod running); `None`: not yet.
    pub since: Option<Instant>,
    /// When it last asked and was answered.
    pub last_ask: Option<Instant>,
    /// The end of the latest validity told to it, on this replica's clock, with room for the holder's clock
    /// running slow: the holder counts each validity from before it asked and stops before it ends, so once this
    /// has passed without another answer it has stopped its work (`rule::stopped_by_silence`).
    pub told_until: Option<Instant>,
}

impl AskRecord {
    fn new(token: i64, term: u64) -> Self {
        Self {
            token,
            term,
            since: None,
            last_ask: None,
            told_until: None,
        }
    }
}

/// The records of one lock's grants, by permit.
type LockRecords = BTreeMap<u32, AskRecord>;

#[derive(Default)]
pub struct HolderAsks {
    /// By lock, so that a look at one lock touches its own permits only, whatever the number of locks.
    records: Mutex<HashMap<LockRef, LockRecords>>,
    /// Pods moved off a lock for their silence, per lock, until when the election leaves them out. An entry is
    /// made only for a holder this replica granted and judged, so they are bounded by the pods holding locks.
    set_aside: Mutex<HashMap<LockRef, Vec<(String, Instant)>>>,
}

impl HolderAsks {
    /// The holder of `permit`'s grant with `token` asked at `now` and was told `told` of validity left.
    pub fn asked(&self, permit: PermitRef, (token, term): (i64, u64), now: Instant, told: Duration) {
        let mut records = self.records();
        let record = record_of(&mut records, &permit, token, term);
        record.since.get_or_insert(now);
        record.last_ask = Some(now);
        // A holder's clock may run up to 1 % slow (the engine's drift factor) and its timers fire a little late.
        let room = told.saturating_add(told / 100).saturating_add(CLOCK_ROOM);
        let until = now.checked_add(room).unwrap_or(now);
        record.told_until = record.told_until.max(Some(until));
    }

    /// The record of `permit`'s grant with `token` made in `term`, if any, unchanged.
    pub fn get(&self, permit: &PermitRef, (token, term): (i64, u64)) -> Option<AskRecord> {
        self.records()
            .get(&permit.lock)?
            .get(&permit.permit)
            .filter(|record| record.token == token && record.term == term)
            .copied()
    }

    /// The record of `permit`'s grant with `token`, started at `now` when its holder is `started` (its pod
    /// running) and no ask of this grant is known yet.
    pub fn look(
        &self,
        permit: &PermitRef,
        (token, term): (i64, u64),
        started: bool,
        now: Instant,
    ) -> AskRecord {
        let mut records = self.records();
        let record = record_of(&mut records, permit, token, term);
        if started {
            record.since.get_or_insert(now);
        }
        *record
    }

    /// Every record of `lock` whose permit is not in `held` (its grant ended, or the lock went).
    pub fn keep_only(&self, lock: &LockRef, held: &[u32]) {
        let mut records = self.records();
        if let Some(of_lock) = records.get_mut(lock) {
            of_lock.retain(|permit, _| held.contains(permit));
            if of_lock.is_empty() {
                records.remove(lock);
            }
        }
    }

    /// Leaves `pod` out of `lock`'s election until `until` (and counts it among the holders that ask).
    pub fn set_aside(&self, lock: &LockRef, pod: &str, until: Instant) {
        let mut set_aside = self.set_aside_entries();
        // Rare (a holder found silent): the ended entries of every lock go here, deleted locks' included.
        let now = Instant::now();
        set_aside.retain(|_, pods| {
            pods.retain(|(_, ends)| *ends > now);
            !pods.is_empty()
        });
        let pods = set_aside.entry(lock.clone()).or_default();
        match pods.iter_mut().find(|(name, _)| name == pod) {
            Some((_, ends)) => *ends = (*ends).max(until),
            None => pods.push((pod.to_owned(), until)),
        }
    }

    /// The pods of `lock` left out of its election at `now`.
    pub fn set_aside_of(&self, lock: &LockRef, now: Instant) -> Vec<String> {
        self.set_aside_entries()
            .get(lock)
            .map(|pods| {
                pods.iter()
                    .filter(|(_, ends)| *ends > now)
                    .map(|(pod, _)| pod.clone())
                    .collect()
            })
            .unwrap_or_default()
    }

    fn records(&self) -> MutexGuard<'_, HashMap<LockRef, LockRecords>> {
        self.records
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn set_aside_entries(&self) -> MutexGuard<'_, HashMap<LockRef, Vec<(String, Instant)>>> {
        self.set_aside
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// `permit`'s record in `records`, a new one where none is kept for the grant with `token` in `term`.
fn record_of<'a>(
    records: &'a mut HashMap<LockRef, LockRecords>,
    permit: &PermitRef,
    token: i64,
    term: u64,
) -> &'a mut AskRecord {
    let record = records
        .entry(permit.lock.clone())
        .or_default()
        .entry(permit.permit)
        .or_insert_with(|| AskRecord::new(token, term));
    if record.token != token || record.term != term {
        *record = AskRecord::new(token, term);
    }
    record
}

#[cfg(test)]
mod tests {
    use kube::runtime::reflector::ObjectRef;

    use super::*;

    fn permit(name: &str, permit: u32) -> PermitRef {
        PermitRef::new(ObjectRef::new(name).within("shop"), permit)
    }

    #[test]
    fn a_record_follows_the_grant_and_starts_with_the_holder() {
        let asks = HolderAsks::default();
        let start = Instant::now();
        let later = start + Duration::from_secs(3);
        let seen = asks.look(&permit("web", 0), (7, 1), false, start);
        assert_eq!(seen.since, None, "not started: no grace counts yet");
        let seen = asks.look(&permit("web", 0), (7, 1), true, later);
        assert_eq!(seen.since, Some(later));
        asks.asked(
            permit("web", 0),
            (7, 1),
            later + Duration::from_secs(1),
            Duration::from_secs(9),
        );
        let seen = asks.look(&permit("web", 0), (7, 1), true, later + Duration::from_secs(2));
        assert_eq!(seen.since, Some(later), "the start stays");
        assert_eq!(seen.last_ask, Some(later + Duration::from_secs(1)));
        // A new grant starts afresh.
        let seen = asks.look(&permit("web", 0), (8, 1), false, later + Duration::from_secs(3));
        assert_eq!(seen, AskRecord::new(8, 1));
    }

    #[test]
    fn an_ask_for_a_new_grant_replaces_the_old_one_and_records_are_dropped_with_their_grants() {
        let asks = HolderAsks::default();
        let now = Instant::now();
        asks.asked(permit("web", 0), (7, 1), now, Duration::ZERO);
        asks.asked(
            permit("web", 0),
            (9, 1),
            now + Duration::from_secs(1),
            Duration::ZERO,
        );
        asks.asked(permit("web", 1), (3, 1), now, Duration::ZERO);
        asks.asked(permit("db", 0), (1, 1), now, Duration::ZERO);
        let seen = asks.look(&permit("web", 0), (9, 1), true, now + Duration::from_secs(2));
        assert_eq!(seen.last_ask, Some(now + Duration::from_secs(1)));
        asks.keep_only(&ObjectRef::new("web").within("shop"), &[1]);
        assert_eq!(
            asks.look(&permit("web", 0), (9, 1), false, now),
            AskRecord::new(9, 1)
        );
        assert_eq!(
            asks.look(&permit("web", 1), (3, 1), false, now).last_ask,
            Some(now),
            "kept: still held"
        );
        assert_eq!(
            asks.look(&permit("db", 0), (1, 1), false, now).last_ask,
            Some(now),
            "another lock's records stay"
        );
    }

    #[test]
    fn the_validity_told_is_kept_with_room_for_a_slow_clock_and_never_shrinks() {
        let asks = HolderAsks::default();
        let now = Instant::now();
        asks.asked(permit("web", 0), (7, 1), now, Duration::from_secs(10));
        let until = asks
            .get(&permit("web", 0), (7, 1))
            .and_then(|record| record.told_until);
        assert_eq!(until, Some(now + Duration::from_millis(10_300)));
        // A later ask told less (the validity ran down) leaves the later end.
        asks.asked(
            permit("web", 0),
            (7, 1),
            now + Duration::from_secs(1),
            Duration::from_secs(2),
        );
        let kept = asks
            .get(&permit("web", 0), (7, 1))
            .and_then(|record| record.told_until);
        assert_eq!(kept, Some(now + Duration::from_millis(10_300)));
        assert_eq!(
            asks.get(&permit("web", 0), (8, 1)),
            None,
            "another grant's record is not this one's"
        );
    }

    #[test]
    fn a_record_of_an_earlier_term_is_not_this_terms() {
        let asks = HolderAsks::default();
        let now = Instant::now();
        asks.asked(permit("web", 0), (7, 1), now, Duration::from_secs(10));
        assert!(asks.get(&permit("web", 0), (7, 1)).is_some());
        assert_eq!(
            asks.get(&permit("web", 0), (7, 2)),
            None,
            "another replica may have answered in between"
        );
        let fresh = asks.look(&permit("web", 0), (7, 2), false, now);
        assert_eq!(fresh, AskRecord::new(7, 2));
    }

    #[test]
    fn a_pod_set_aside_is_left_out_until_its_time_and_only_for_its_lock() {
        let asks = HolderAsks::default();
        let now = Instant::now();
        let web = ObjectRef::new("web").within("shop");
        asks.set_aside(&web, "web-0", now + Duration::from_secs(30));
        assert_eq!(asks.set_aside_of(&web, now), ["web-0"]);
        assert!(
            asks.set_aside_of(&ObjectRef::new("db").within("shop"), now)
                .is_empty()
        );
        assert!(
            asks.set_aside_of(&web, now + Duration::from_secs(30)).is_empty(),
            "ended"
        );
    }
}
