//! The keeper's indexes of the locks waiting for their next extension (neither in flight nor lost), so that a
//! tick costs what is due, not what is held: each quorum's locks ordered by when they are due, and a lower bound
//! of their fence times, before which no lock can need its loss signalled.

use std::collections::{BTreeMap, HashMap, HashSet};

use tokio::time::Instant;

use super::refs::PermitRef;

/// Where a waiting lock stands in its quorum's order: when it is due, then a number unique to its table entry
/// (locks due at the same instant are taken in the order they were inserted).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Slot {
    pub at: Instant,
    pub seq: u64,
}

#[derive(Default)]
pub struct Waiting {
    /// Per quorum: a quorum with a batch in flight is passed over whole, however many of its locks are due.
    due: HashMap<String, BTreeMap<Slot, PermitRef>>,
    /// At or before the fence time of every waiting lock; `None` while none has been added since the last look.
    /// Locks that stop waiting do not raise it: the next look at every lock does.
    fence_floor: Option<Instant>,
}

impl Waiting {
    pub fn add(&mut self, quorum: &str, slot: Slot, fence_at: Instant, lock: PermitRef) {
        match self.due.get_mut(quorum) {
            Some(schedule) => {
                schedule.insert(slot, lock);
            }
            None => {
                self.due.insert(quorum.to_owned(), BTreeMap::from([(slot, lock)]));
            }
        }
        self.fence_floor = Some(earliest(self.fence_floor, fence_at));
    }

    pub fn remove(&mut self, quorum: &str, slot: Slot) {
        if let Some(schedule) = self.due.get_mut(quorum) {
            schedule.remove(&slot);
            if schedule.is_empty() {
                self.due.remove(quorum);
            }
        }
    }

    /// Takes out the locks due at `now` on the quorums not in `busy`: per quorum, earliest first.
    pub fn take_due(
        &mut self,
        now: Instant,
        busy: &HashSet<String>,
    ) -> Vec<(String, Vec<(Slot, PermitRef)>)> {
        let mut taken = Vec::new();
        self.due.retain(|quorum, schedule| {
            if busy.contains(quorum) {
                return true;
            }
            let mut due = Vec::new();
            while let Some(first) = schedule.first_entry()
                && first.key().at <= now
            {
                due.push(first.remove_entry());
            }
            if !due.is_empty() {
                taken.push((quorum.clone(), due));
            }
            !schedule.is_empty()
        });
        taken
    }

    /// Whether a waiting lock may have reached its fence time at `now`.
    pub fn fence_may_have_come(&self, now: Instant) -> bool {
        self.fence_floor.is_some_and(|floor| floor <= now)
    }

    /// After a look at every lock: `earliest` is the earliest fence time of those still waiting.
    pub fn set_fence_floor(&mut self, earliest: Option<Instant>) {
        self.fence_floor = earliest;
    }

    pub fn clear(&mut self) {
        self.due.clear();
        self.fence_floor = None;
    }

    /// Every waiting lock with its quorum and slot, for tests that hold the indexes against the table.
    #[cfg(test)]
    pub fn entries(&self) -> impl Iterator<Item = (&str, Slot, &PermitRef)> {
        self.due.iter().flat_map(|(quorum, schedule)| {
            schedule
                .iter()
                .map(move |(slot, lock)| (quorum.as_str(), *slot, lock))
        })
    }

    #[cfg(test)]
    pub fn fence_floor(&self) -> Option<Instant> {
        self.fence_floor
    }
}

/// The earlier of `floor` (none: no bound yet) and `at`.
pub fn earliest(floor: Option<Instant>, at: Instant) -> Instant {
    floor.map_or(at, |floor| floor.min(at))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use kube::runtime::reflector::ObjectRef;

    use super::*;

    fn lock(name: &str) -> PermitRef {
        PermitRef::from(ObjectRef::new(name).within("ns"))
    }

    fn slot(start: Instant, after_ms: u64, seq: u64) -> Slot {
        Slot {
            at: start + Duration::from_millis(after_ms),
            seq,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_busy_quorum_is_passed_over_and_its_due_locks_wait_for_the_next_take() {
        let start = Instant::now();
        let ms = Duration::from_millis;
        let mut waiting = Waiting::default();
        waiting.add("a", slot(start, 2, 0), start + ms(9), lock("a2"));
        waiting.add("a", slot(start, 1, 1), start + ms(9), lock("a1"));
        waiting.add("a", slot(start, 1, 2), start + ms(9), lock("a1b"));
        waiting.add("a", slot(start, 5, 3), start + ms(9), lock("a5"));
        waiting.add("b", slot(start, 0, 4), start + ms(9), lock("b0"));
        let busy = HashSet::from(["b".to_owned()]);

        let taken = waiting.take_due(start + ms(2), &busy);
        let names: Vec<(&str, Vec<&str>)> = taken
            .iter()
            .map(|(quorum, due)| {
                (
                    quorum.as_str(),
                    due.iter().map(|(_, lock)| lock.lock.name.as_str()).collect(),
                )
            })
            .collect();
        assert_eq!(
            names,
            [("a", vec!["a1", "a1b", "a2"])],
            "earliest first, ties in insertion order"
        );

        let taken = waiting.take_due(start + ms(2), &HashSet::new());
        assert_eq!(taken.len(), 1);
        assert_eq!(taken[0].0, "b", "taken once its quorum is free");
        let left: Vec<&str> = waiting
            .entries()
            .map(|(_, _, lock)| lock.lock.name.as_str())
            .collect();
        assert_eq!(left, ["a5"]);

        waiting.remove("a", slot(start, 5, 3));
        assert_eq!(waiting.entries().count(), 0);
        assert!(waiting.take_due(start + ms(100), &HashSet::new()).is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn the_fence_floor_is_the_earliest_fence_time_added_until_a_look_sets_it() {
        let start = Instant::now();
        let ms = Duration::from_millis;
        let mut waiting = Waiting::default();
        assert!(!waiting.fence_may_have_come(start + ms(1_000)), "nothing waits");
        waiting.add("a", slot(start, 0, 0), start + ms(8), lock("late"));
        waiting.add("a", slot(start, 0, 1), start + ms(5), lock("early"));
        waiting.add("a", slot(start, 0, 2), start + ms(7), lock("middle"));
        assert!(!waiting.fence_may_have_come(start + ms(4)));
        assert!(waiting.fence_may_have_come(start + ms(5)));

        waiting.set_fence_floor(Some(start + ms(7)));
        assert!(!waiting.fence_may_have_come(start + ms(6)));
        waiting.add("a", slot(start, 0, 3), start + ms(6), lock("back"));
        assert!(
            waiting.fence_may_have_come(start + ms(6)),
            "lowered by what comes back"
        );

        waiting.clear();
        assert_eq!(waiting.fence_floor(), None);
        assert_eq!(waiting.entries().count(), 0);
    }
}
