//! Which Events are repeats: the series cache, bounded in size, each publish O(1) (amortised: expiry drops
//! what earlier publishes added).
//!
//! An occurrence with the same type, action, reason, regarding and related object as one published less than
//! [`SERIES_TTL`] ago is the next count of that Event's series (a patch of its `series`), not a new Event;
//! this is kube-runtime's rule — with one change: only while its note is the same. A series shows its first
//! occurrence's note, so kube-runtime's rule told a user the first cause of a later, different one (a lock whose
//! masters were first quarantined, then shut down, showed "x2" of "3 quarantined" while status said "2 not
//! connected"). An occurrence with another note starts a new Event, which then carries the series. kube-runtime's own recorder keeps every Event of the last six minutes and
//! scans them all on every publish, so after a burst of 10,000 acquisitions each Event costs 10,000 steps for
//! six minutes. Here the series are kept in least-recently-observed order: expiry looks only at the oldest,
//! and the cache holds at most [`SERIES_CAPACITY`] (past it the oldest series ends early, and its next
//! occurrence is a new Event).

use std::hash::{DefaultHasher, Hash, Hasher};
use std::num::NonZeroUsize;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType};
use lru::LruCache;

/// How long after its last occurrence a series can still grow (kube-runtime's and client-go's six minutes).
pub const SERIES_TTL: Duration = Duration::from_secs(6 * 60);

/// Series kept at most: a few per lock at the scale the operator is measured at (10,000 locks), a few MiB.
pub const SERIES_CAPACITY: usize = 16_384;

/// What makes two occurrences one series (the reporter is the recorder's own, the same for all).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SeriesKey {
    type_: EventType,
    action: String,
    reason: String,
    regarding: ObjectIdentity,
    related: Option<ObjectIdentity>,
}

impl SeriesKey {
    pub fn new(event: &Event, regarding: &ObjectReference) -> Self {
        Self {
            type_: event.type_,
            action: event.action.clone(),
            reason: event.reason.clone(),
            regarding: ObjectIdentity::from(regarding),
            related: event.secondary.as_ref().map(ObjectIdentity::from),
        }
    }
}

/// The fields of an object reference that name the object (kube-runtime's `Reference` hashes the same ones).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct ObjectIdentity {
    api_version: Option<String>,
    kind: Option<String>,
    namespace: Option<String>,
    name: Option<String>,
    uid: Option<String>,
}

impl From<&ObjectReference> for ObjectIdentity {
    fn from(reference: &ObjectReference) -> Self {
        Self {
            api_version: reference.api_version.clone(),
            kind: reference.kind.clone(),
            namespace: reference.namespace.clone(),
            name: reference.name.clone(),
            uid: reference.uid.clone(),
        }
    }
}

/// What an occurrence says, as the series compares it: a hash of its note (the series keeps no copy of it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NoteDigest(u64);

impl NoteDigest {
    pub fn of(event: &Event) -> Self {
        let mut hasher = DefaultHasher::new();
        event.note.hash(&mut hasher);
        Self(hasher.finish())
    }
}

/// How an occurrence is published.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Publication {
    /// A new Event of this name.
    Create { name: String },
    /// The Event of this name gets `series.count = count`.
    Patch { name: String, count: i32 },
}

struct Series {
    /// The name of the Event that carries the series.
    name: String,
    count: i32,
    last_observed: Instant,
    /// What the Event carrying the series says.
    note: NoteDigest,
}

pub struct SeriesCache {
    series: LruCache<SeriesKey, Series>,
    ttl: Duration,
}

impl SeriesCache {
    pub fn new(capacity: usize, ttl: Duration) -> Self {
        Self {
            series: LruCache::new(NonZeroUsize::new(capacity).unwrap_or(NonZeroUsize::MIN)),
            ttl,
        }
    }

    /// Counts an occurrence at `now` that says `note`: the next count of its live series if that says the same,
    /// or a new Event named by `new_name` (called only then), whose series starts here.
    pub fn observe(
        &mut self,
        key: &SeriesKey,
        note: NoteDigest,
        now: Instant,
        new_name: impl FnOnce() -> String,
    ) -> Publication {
        self.expire(now);
        let ttl = self.ttl;
        // Promoted to most recently observed; its time is set to `now` below, which keeps the order by time.
        if let Some(series) = self.series.get_mut(key)
            && !is_expired(series, now, ttl)
            && series.note == note
        {
            series.count = series.count.saturating_add(1);
            series.last_observed = now;
            return Publication::Patch {
                name: series.name.clone(),
                count: series.count,
            };
        }
        let name = new_name();
        self.start(key, note, name.clone(), now);
        Publication::Create { name }
    }

    /// Starts a new series under `name` in place of any other (its Event is gone from the API server, or says
    /// something else).
    pub fn start(&mut self, key: &SeriesKey, note: NoteDigest, name: String, now: Instant) {
        self.series.push(
            key.clone(),
            Series {
                name,
                count: 1,
                last_observed: now,
                note,
            },
        );
    }

    /// Forgets the series carried by the Event `name` (its creation failed), unless another Event carries the
    /// key's series by now.
    pub fn forget(&mut self, key: &SeriesKey, name: &str) {
        if self.series.peek(key).is_some_and(|series| series.name == name) {
            self.series.pop(key);
        }
    }

    pub fn len(&self) -> usize {
        self.series.len()
    }

    pub fn is_empty(&self) -> bool {
        self.series.is_empty()
    }

    /// Drops the series that can no longer grow, oldest first: the work is the number dropped.
    fn expire(&mut self, now: Instant) {
        while let Some((_, oldest)) = self.series.peek_lru()
            && is_expired(oldest, now, self.ttl)
        {
            self.series.pop_lru();
        }
    }
}

fn is_expired(series: &Series, now: Instant, ttl: Duration) -> bool {
    now.saturating_duration_since(series.last_observed) >= ttl
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(reason: &str) -> Event {
        Event {
            type_: EventType::Normal,
            reason: reason.into(),
            note: Some("a note".into()),
            action: reason.into(),
            secondary: None,
        }
    }

    fn lock(name: &str) -> ObjectReference {
        ObjectReference {
            api_version: Some("redlock.io/v1beta1".into()),
            kind: Some("DistributedLock".into()),
            namespace: Some("team".into()),
            name: Some(name.into()),
            uid: Some(format!("uid-{name}")),
            ..Default::default()
        }
    }

    /// The note of every occurrence in the tests that are not about notes.
    const NOTE: NoteDigest = NoteDigest(0);

    fn key(reason: &str, name: &str) -> SeriesKey {
        SeriesKey::new(&event(reason), &lock(name))
    }

    /// Names Events `e1`, `e2`, … in the order they are asked for.
    struct Names(u32);

    impl Names {
        fn next(&mut self) -> impl FnOnce() -> String + '_ {
            move || {
                self.0 += 1;
                format!("e{}", self.0)
            }
        }
    }

    fn create(name: &str) -> Publication {
        Publication::Create { name: name.into() }
    }

    fn patch(name: &str, count: i32) -> Publication {
        Publication::Patch {
            name: name.into(),
            count,
        }
    }

    #[test]
    fn repeats_within_the_ttl_count_up_one_series() {
        let start = Instant::now();
        let mut cache = SeriesCache::new(10, SERIES_TTL);
        let mut names = Names(0);
        let acquired = key("Acquired", "a");
        assert_eq!(cache.observe(&acquired, NOTE, start, names.next()), create("e1"));
        assert_eq!(
            cache.observe(&acquired, NOTE, start + Duration::from_secs(1), names.next()),
            patch("e1", 2)
        );
        // Each occurrence extends the series: five minutes after the last one it still counts up.
        assert_eq!(
            cache.observe(&acquired, NOTE, start + Duration::from_secs(301), names.next()),
            patch("e1", 3)
        );
        assert_eq!(cache.len(), 1);
    }

    #[test]
    fn a_series_ends_six_minutes_after_its_last_occurrence() {
        let start = Instant::now();
        let mut cache = SeriesCache::new(10, SERIES_TTL);
        let mut names = Names(0);
        let acquired = key("Acquired", "a");
        cache.observe(&acquired, NOTE, start, names.next());
        let just_before = start + SERIES_TTL - Duration::from_millis(1);
        assert_eq!(
            cache.observe(&acquired, NOTE, just_before, names.next()),
            patch("e1", 2)
        );
        assert_eq!(
            cache.observe(&acquired, NOTE, just_before + SERIES_TTL, names.next()),
            create("e2")
        );
    }

    #[test]
    fn what_differs_in_type_reason_object_or_related_object_is_another_series() {
        let start = Instant::now();
        let mut cache = SeriesCache::new(10, SERIES_TTL);
        let mut names = Names(0);
        let base = event("Released");
        let warning = Event {
            type_: EventType::Warning,
            ..event("Released")
        };
        let related = Event {
            secondary: Some(lock("job")),
            ..event("Released")
        };
        let other_uid = ObjectReference {
            uid: Some("recreated".into()),
            ..lock("a")
        };
        let keys = [
            SeriesKey::new(&base, &lock("a")),
            SeriesKey::new(&warning, &lock("a")),
            SeriesKey::new(&related, &lock("a")),
            SeriesKey::new(&event("Acquired"), &lock("a")),
            SeriesKey::new(&base, &lock("b")),
            SeriesKey::new(&base, &other_uid),
        ];
        for (index, key) in keys.iter().enumerate() {
            assert_eq!(
                cache.observe(key, NOTE, start, names.next()),
                create(&format!("e{}", index + 1))
            );
        }
    }

    #[test]
    fn another_note_starts_a_new_event_which_then_carries_the_series() {
        let start = Instant::now();
        let mut cache = SeriesCache::new(10, SERIES_TTL);
        let mut names = Names(0);
        let says = |note: &str| {
            NoteDigest::of(&Event {
                note: Some(note.into()),
                ..event("QuorumUnavailable")
            })
        };
        let (quarantined, down) = (says("3 quarantined"), says("2 not connected"));
        let unavailable = key("QuorumUnavailable", "a");
        assert_eq!(
            cache.observe(&unavailable, quarantined, start, names.next()),
            create("e1")
        );
        assert_eq!(
            cache.observe(&unavailable, quarantined, start, names.next()),
            patch("e1", 2)
        );
        // The cause changed: its Event says so, instead of a third count of "3 quarantined".
        assert_eq!(
            cache.observe(&unavailable, down, start, names.next()),
            create("e2")
        );
        assert_eq!(
            cache.observe(&unavailable, down, start, names.next()),
            patch("e2", 2)
        );
        // Back to the first cause: a new Event again, not a count of the first one's.
        assert_eq!(
            cache.observe(&unavailable, quarantined, start, names.next()),
            create("e3")
        );
        assert_eq!(cache.len(), 1, "one series per key");
    }

    #[test]
    fn a_series_not_observed_for_six_minutes_ends_and_a_repeat_keeps_one_alive() {
        let start = Instant::now();
        let mut cache = SeriesCache::new(100, SERIES_TTL);
        let mut names = Names(0);
        for index in 0..10u64 {
            let at = start + Duration::from_secs(index * 30);
            cache.observe(&key("Acquired", &format!("lock-{index}")), NOTE, at, names.next());
        }
        // At 6 min 45 s the series last observed at 0 s and at 30 s have ended.
        let later = start + SERIES_TTL + Duration::from_secs(45);
        cache.observe(&key("Released", "other"), NOTE, later, names.next());
        assert_eq!(cache.len(), 10 - 2 + 1);
        // A series observed again moves to the young end: it outlives the ones first observed after it.
        let renewed = key("Acquired", "lock-2");
        assert_eq!(cache.observe(&renewed, NOTE, later, names.next()), patch("e3", 2));
        let much_later = later + Duration::from_secs(5 * 60);
        assert_eq!(
            cache.observe(&renewed, NOTE, much_later, names.next()),
            patch("e3", 3)
        );
        // Five minutes on, every series observed last before 5 min 45 s has ended: left are lock-2, renewed
        // at 6 min 45 s, and the Released one.
        assert_eq!(cache.len(), 2);
    }

    #[test]
    fn past_its_capacity_the_least_recently_observed_series_ends() {
        let start = Instant::now();
        let mut cache = SeriesCache::new(3, SERIES_TTL);
        let mut names = Names(0);
        for name in ["a", "b", "c"] {
            cache.observe(&key("Acquired", name), NOTE, start, names.next());
        }
        let a = key("Acquired", "a");
        assert_eq!(cache.observe(&a, NOTE, start, names.next()), patch("e1", 2));
        cache.observe(&key("Acquired", "d"), NOTE, start, names.next());
        assert_eq!(cache.len(), 3);
        // "b" was the least recently observed: its next occurrence is a new Event; "a" still counts up.
        assert_eq!(
            cache.observe(&key("Acquired", "b"), NOTE, start, names.next()),
            create("e5")
        );
        assert_eq!(cache.observe(&a, NOTE, start, names.next()), patch("e1", 3));
    }

    #[test]
    fn a_forgotten_series_starts_again_and_a_newer_one_is_not_forgotten() {
        let start = Instant::now();
        let mut cache = SeriesCache::new(10, SERIES_TTL);
        let mut names = Names(0);
        let acquired = key("Acquired", "a");
        cache.observe(&acquired, NOTE, start, names.next());
        cache.forget(&acquired, "e1");
        assert!(cache.is_empty());
        assert_eq!(cache.observe(&acquired, NOTE, start, names.next()), create("e2"));
        // The Event e2 carried the series and vanished from the API server: e3 replaces it.
        cache.start(&acquired, NOTE, "e3".into(), start);
        cache.forget(&acquired, "e2");
        assert_eq!(
            cache.observe(&acquired, NOTE, start, names.next()),
            patch("e3", 2)
        );
    }

    #[test]
    fn the_count_saturates() {
        let start = Instant::now();
        let mut cache = SeriesCache::new(10, SERIES_TTL);
        let mut names = Names(0);
        let acquired = key("Acquired", "a");
        cache.observe(&acquired, NOTE, start, names.next());
        if let Some(series) = cache.series.get_mut(&acquired) {
            series.count = i32::MAX - 1;
        }
        assert_eq!(
            cache.observe(&acquired, NOTE, start, names.next()),
            patch("e1", i32::MAX)
        );
        assert_eq!(
            cache.observe(&acquired, NOTE, start, names.next()),
            patch("e1", i32::MAX)
        );
    }
}
