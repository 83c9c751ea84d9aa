//! Locks waiting in a key's fair queue are woken when the key is released, not at their next poll: after a
//! refused attempt that queued a lock's permit, a task waits for the masters to announce the releases ahead of
//! it (the engine's [`ReleaseWatch`]) and then asks the reconciler to look at the lock at once. The poll stays,
//! at the queued pace, for expiries (never announced) and announcements lost with a listening connection; a
//! wake only ever brings an attempt forward, every grant still goes through the masters.
//!
//! A permit's watch is kept from one refused attempt to the next (a channel subscribed anew counts as announced,
//! which would wake the lock at once every time) and dropped once the permit is granted, its lock deleted, or no
//! refusal renewed it for [`STALE_AFTER`] (a lock that stopped waiting for a reason this module does not hear of:
//! its spec changed, its quorum went).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::task::AbortHandle;
use tokio::time::Instant;

use crate::controller::keeper::{Keeper, LockRef, PermitRef};
use crate::redlock::{QueuePlace, Redlock, ReleaseMark, ReleaseWatch};

/// How long a watch that no refusal renewed is kept: far beyond the queued pace (at most a second), so that only
/// locks that stopped waiting lose theirs.
const STALE_AFTER: Duration = Duration::from_secs(30);

#[derive(Default)]
pub struct ReleaseWakes {
    waiting: Mutex<HashMap<PermitRef, Waiting>>,
}

struct Waiting {
    watch: ReleaseWatch,
    /// The task that wakes the lock, while one waits.
    task: Option<AbortHandle>,
    renewed: Instant,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// How many releases a waiter at `place` sleeps through: one fewer than the waiters ahead of it, since the
/// first of those may already hold the key (granted, not yet out of the queue), so that it never sleeps through
/// its own turn.
pub fn releases_before_turn(place: &QueuePlace) -> u64 {
    place.place.saturating_sub(1).max(1)
}

impl ReleaseWakes {
    fn waiting(&self) -> MutexGuard<'_, HashMap<PermitRef, Waiting>> {
        self.waiting
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// An attempt for `permit` on `key` begins: a wait still running is no longer needed, and only releases
    /// announced from now on end the next one. Returns what was announced so far where this permit has no watch
    /// yet, for [`ReleaseWakes::queued`] after a refusal.
    pub fn attempting(&self, permit: &PermitRef, engine: &Redlock, key: &str) -> Option<ReleaseMark> {
        let mut waiting = self.waiting();
        match waiting.get_mut(permit) {
            Some(entry) if entry.watch.watches(engine, key) => {
                if let Some(task) = entry.task.take() {
                    task.abort();
                }
                entry.watch.attempting();
                None
            }
            _ => {
                waiting.remove(permit);
                drop(waiting);
                engine.releases_heard(key)
            }
        }
    }

    /// The attempt was refused and `permit` waits at `place` in `key`'s queue: wakes its lock through `keeper`
    /// once the releases ahead of it were announced. `heard` is what [`ReleaseWakes::attempting`] returned.
    pub fn queued(
        &self,
        permit: &PermitRef,
        engine: &Redlock,
        key: &str,
        heard: Option<ReleaseMark>,
        place: &QueuePlace,
        keeper: &Arc<Keeper>,
    ) {
        let now = Instant::now();
        let mut waiting = self.waiting();
        waiting.retain(|_, entry| now.duration_since(entry.renewed) < STALE_AFTER);
        let mut entry = match waiting.remove(permit) {
            Some(entry) if entry.watch.watches(engine, key) => entry,
            _ => {
                let Some(watch) = engine.watch_releases(key, heard) else {
                    return;
                };
                Waiting {
                    watch,
                    task: None,
                    renewed: now,
                }
            }
        };
        let released = entry.watch.released(releases_before_turn(place));
        let (keeper, lock): (Arc<Keeper>, LockRef) = (keeper.clone(), permit.lock.clone());
        let task = tokio::spawn(async move {
            released.await;
            tracing::debug!(lock = %lock, "the key was released: asking again now");
            keeper.wake(lock);
        });
        if let Some(previous) = entry.task.replace(task.abort_handle()) {
            previous.abort();
        }
        entry.renewed = now;
        waiting.insert(permit.clone(), entry);
    }

    /// `permit` no longer waits (granted, or refused without a place in the queue).
    pub fn forget(&self, permit: &PermitRef) {
        self.waiting().remove(permit);
    }

    /// Every permit of `lock` (deleted) no longer waits.
    pub fn forget_lock(&self, lock: &LockRef) {
        self.waiting().retain(|permit, _| &permit.lock != lock);
    }

    /// How many permits wait with a watch (for tests and metrics).
    pub fn len(&self) -> usize {
        self.waiting().len()
    }

    pub fn is_empty(&self) -> bool {
        self.waiting().is_empty()
    }
}
