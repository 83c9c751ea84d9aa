//! The asks this replica answered, per permit: the grant's token, when its holder was first seen able to ask,
//! and when it last asked. Kept in memory only, for the active replica's own view (a successor starts afresh and
//! gives every holder the first ask's grace again).
//!
//! Bounded by the permits held: an ask is recorded only when it was answered with a validity, which needs the
//! lock's uid and the token of a grant this replica keeps (nothing a client without that knowledge sends adds an
//! entry), and one entry per permit is kept, replaced when the grant's token changes.

use std::collections::HashMap;
use std::sync::Mutex;

use tokio::time::Instant;

use crate::controller::keeper::{LockRef, PermitRef};

/// What is known of the asks of one grant's holder.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AskRecord {
    /// The grant's fencing token: a new grant starts a new record.
    pub token: i64,
    /// When its holder was first seen able to ask (its pod running); `None`: not yet.
    pub since: Option<Instant>,
    /// When it last asked and was answered.
    pub last_ask: Option<Instant>,
}

impl AskRecord {
    fn new(token: i64) -> Self {
        Self {
            token,
            since: None,
            last_ask: None,
        }
    }
}

#[derive(Default)]
pub struct HolderAsks {
    records: Mutex<HashMap<PermitRef, AskRecord>>,
}

impl HolderAsks {
    /// The holder of `permit`'s grant with `token` asked at `now` and was told its validity.
    pub fn asked(&self, permit: PermitRef, token: i64, now: Instant) {
        let mut records = self.lock();
        let record = records.entry(permit).or_insert_with(|| AskRecord::new(token));
        if record.token != token {
            *record = AskRecord::new(token);
        }
        record.since.get_or_insert(now);
        record.last_ask = Some(now);
    }

    /// The record of `permit`'s grant with `token`, started at `now` when its holder is `started` (its pod
    /// running) and no ask of this grant is known yet.
    pub fn look(&self, permit: &PermitRef, token: i64, started: bool, now: Instant) -> AskRecord {
        let mut records = self.lock();
        let record = records
            .entry(permit.clone())
            .or_insert_with(|| AskRecord::new(token));
        if record.token != token {
            *record = AskRecord::new(token);
        }
        if started {
            record.since.get_or_insert(now);
        }
        *record
    }

    /// Every record of `lock` whose permit is not in `held` (its grant ended, or the lock went).
    pub fn keep_only(&self, lock: &LockRef, held: &[u32]) {
        self.lock()
            .retain(|permit, _| permit.lock != *lock || held.contains(&permit.permit));
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<PermitRef, AskRecord>> {
        self.records
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

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
        let seen = asks.look(&permit("web", 0), 7, false, start);
        assert_eq!(seen.since, None, "not started: no grace counts yet");
        let seen = asks.look(&permit("web", 0), 7, true, later);
        assert_eq!(seen.since, Some(later));
        asks.asked(permit("web", 0), 7, later + Duration::from_secs(1));
        let seen = asks.look(&permit("web", 0), 7, true, later + Duration::from_secs(2));
        assert_eq!(seen.since, Some(later), "the start stays");
        assert_eq!(seen.last_ask, Some(later + Duration::from_secs(1)));
        // A new grant starts afresh.
        let seen = asks.look(&permit("web", 0), 8, false, later + Duration::from_secs(3));
        assert_eq!(seen, AskRecord::new(8));
    }

    #[test]
    fn an_ask_for_a_new_grant_replaces_the_old_one_and_records_are_dropped_with_their_grants() {
        let asks = HolderAsks::default();
        let now = Instant::now();
        asks.asked(permit("web", 0), 7, now);
        asks.asked(permit("web", 0), 9, now + Duration::from_secs(1));
        asks.asked(permit("web", 1), 3, now);
        asks.asked(permit("db", 0), 1, now);
        let seen = asks.look(&permit("web", 0), 9, true, now + Duration::from_secs(2));
        assert_eq!(seen.last_ask, Some(now + Duration::from_secs(1)));
        asks.keep_only(&ObjectRef::new("web").within("shop"), &[1]);
        assert_eq!(asks.look(&permit("web", 0), 9, false, now), AskRecord::new(9));
        assert_eq!(
            asks.look(&permit("web", 1), 3, false, now).last_ask,
            Some(now),
            "kept: still held"
        );
        assert_eq!(
            asks.look(&permit("db", 0), 1, false, now).last_ask,
            Some(now),
            "another lock's records stay"
        );
    }
}
