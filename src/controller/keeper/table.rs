//! The keeper's state: every held lock, when it is next extended, and whether it is lost. Pure: every function
//! takes the time it acts at, so the schedule, the application of extension results and the fence-time signal
//! are tested with a paused clock and no master.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::time::Duration;

use tokio::time::Instant;

pub use super::refs::{LockRef, PermitRef};
use super::waiting::{Slot, Waiting, earliest};
use crate::negative_controls::{self, Control};
use crate::redlock::{
    ExtendError, KeepAction, KeepPolicy, Lease, LossReason, OperationReport, fence_time, next_keep_action,
};

/// One held lock.
pub struct HeldLock {
    lease: Lease,
    quorum: String,
    key: String,
    token: i64,
    policy: KeepPolicy,
    /// When the validity last written to status ends (status is refreshed before it runs out).
    status_valid_until: Option<Instant>,
    next_at: Instant,
    retrying: bool,
    in_flight: bool,
    last_failure: Option<OperationReport>,
    lost: Option<LossReason>,
    /// The reconciler was woken for the current state (status due or loss) and has not written since.
    notified: bool,
    /// Unique to this entry: keeps apart, in [`Waiting`], entries due at the same instant.
    seq: u64,
}

impl HeldLock {
    /// Waiting for its next extension: in [`Waiting`] under [`Self::slot`], and nowhere else.
    fn is_waiting(&self) -> bool {
        self.lost.is_none() && !self.in_flight
    }

    fn slot(&self) -> Slot {
        Slot {
            at: self.next_at,
            seq: self.seq,
        }
    }

    fn fence_at(&self) -> Instant {
        fence_time(fencing_valid_until(&self.lease, &self.policy), &self.policy)
    }

    /// Call after every change of the fields [`Self::is_waiting`] and [`Self::slot`] read.
    fn enter(&self, lock: &PermitRef, waiting: &mut Waiting) {
        if self.is_waiting() {
            waiting.add(&self.quorum, self.slot(), self.fence_at(), lock.clone());
        }
    }

    /// Call before every change of the fields [`Self::is_waiting`] and [`Self::slot`] read.
    fn leave(&self, waiting: &mut Waiting) {
        if self.is_waiting() {
            waiting.remove(&self.quorum, self.slot());
        }
    }
}

/// What the reconciler sees of a held lock.
#[derive(Clone, Debug)]
pub struct HeldView {
    pub lease: Lease,
    pub quorum: String,
    pub key: String,
    pub token: i64,
    pub lost: Option<LossReason>,
    pub status_due: bool,
    pub last_failure: Option<OperationReport>,
}

/// What a holder asking how long its grant stays valid may be told (`lock::reports::validity`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeldValidity {
    pub token: i64,
    /// The lease's own validity, on this process's monotonic clock.
    pub valid_until: Instant,
    /// The validity last written to status (`None`: not written by this replica yet).
    pub status_valid_until: Option<Instant>,
    pub lost: bool,
}

/// Leases due for extension on one quorum, in the order of `locks`.
pub struct DueBatch {
    pub quorum: String,
    pub locks: Vec<PermitRef>,
    pub leases: Vec<Lease>,
}

/// What applying a batch's results changed.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Applied {
    pub extended: u64,
    /// Locks lost by this batch.
    pub lost: u64,
    /// Locks whose reconciler must look now: lost, or status due.
    pub wake: Vec<PermitRef>,
}

/// Taking a lock out of the table.
pub enum Removal {
    Absent,
    /// An extension of it is in flight: wait for the batch to finish (an extension landing after a release would
    /// re-create the key).
    InFlight,
    Removed(Lease),
}

/// The validity the keeper fences by: the lease's own, or, with the negative control, two fence margins
/// too late (so that the loss is signalled a margin after the validity ended).
fn fencing_valid_until(lease: &Lease, policy: &KeepPolicy) -> Instant {
    if negative_controls::active(Control::FenceAfterValidity) {
        lease.valid_until() + policy.fence_margin * 2
    } else {
        lease.valid_until()
    }
}

#[derive(Default)]
pub struct Table {
    held: HashMap<PermitRef, HeldLock>,
    /// Quorums with a batch in flight: each quorum has at most one, so a quorum whose masters hang (up to its
    /// node timeout per command) delays only its own locks, never another quorum's.
    busy: HashSet<String>,
    /// The entries waiting for their next extension, indexed: a tick visits only what is due.
    waiting: Waiting,
    /// The permits held of each lock above permit 0 (a semaphore's), to extend them together.
    semaphores: HashMap<LockRef, BTreeSet<u32>>,
    next_seq: u64,
}

impl Table {
    /// Keeps `lease` from `now`; `true` when the lock was not held before.
    pub fn insert(&mut self, lock: PermitRef, lease: Lease, held: Holding, now: Instant) -> bool {
        let valid_until = fencing_valid_until(&lease, &held.policy);
        let next_at = match next_keep_action(now, valid_until, lease.validity(), false, &held.policy) {
            KeepAction::ExtendAt(at) => at,
            KeepAction::SignalLost => now,
        };
        let entry = HeldLock {
            lease,
            quorum: held.quorum,
            key: held.key,
            token: held.token,
            policy: held.policy,
            status_valid_until: None,
            next_at,
            retrying: false,
            in_flight: false,
            last_failure: None,
            lost: None,
            notified: false,
            seq: self.next_seq,
        };
        // Wrapping: a number comes back after 2^64 insertions, long after its first holder was removed.
        self.next_seq = self.next_seq.wrapping_add(1);
        entry.enter(&lock, &mut self.waiting);
        if lock.permit > 0 {
            self.semaphores
                .entry(lock.lock.clone())
                .or_default()
                .insert(lock.permit);
        }
        match self.held.insert(lock, entry) {
            None => true,
            Some(replaced) => {
                replaced.leave(&mut self.waiting);
                false
            }
        }
    }

    pub fn view(&self, lock: &PermitRef, now: Instant) -> Option<HeldView> {
        self.held.get(lock).map(|held| HeldView {
            lease: held.lease.clone(),
            quorum: held.quorum.clone(),
            key: held.key.clone(),
            token: held.token,
            lost: held.lost.clone(),
            status_due: status_due(held, now),
            last_failure: held.last_failure.clone(),
        })
    }

    /// What a holder may be told of the grant kept for `lock`, without copying anything.
    pub fn validity(&self, lock: &PermitRef) -> Option<HeldValidity> {
        self.held.get(lock).map(|held| HeldValidity {
            token: held.token,
            valid_until: held.lease.valid_until(),
            status_valid_until: held.status_valid_until,
            lost: held.lost.is_some(),
        })
    }

    pub fn is_lost(&self, lock: &PermitRef) -> bool {
        self.held.get(lock).is_some_and(|held| held.lost.is_some())
    }

    /// Records that status now shows the validity ending at `valid_until`.
    pub fn status_written(&mut self, lock: &PermitRef, valid_until: Instant) {
        if let Some(held) = self.held.get_mut(lock) {
            held.status_valid_until = Some(valid_until);
            held.notified = false;
        }
    }

    pub fn remove(&mut self, lock: &PermitRef) -> Removal {
        match self.held.get(lock) {
            None => Removal::Absent,
            Some(held) if held.in_flight => Removal::InFlight,
            Some(_) => self.held.remove(lock).map_or(Removal::Absent, |held| {
                held.leave(&mut self.waiting);
                if let Some(permits) = self.semaphores.get_mut(&lock.lock) {
                    permits.remove(&lock.permit);
                    if permits.is_empty() {
                        self.semaphores.remove(&lock.lock);
                    }
                }
                Removal::Removed(held.lease)
            }),
        }
    }

    pub fn clear(&mut self) -> usize {
        let count = self.held.len();
        self.held.clear();
        self.waiting.clear();
        self.semaphores.clear();
        count
    }

    pub fn len(&self) -> usize {
        self.held.len()
    }

    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    /// Leases due at `now` on quorums with no batch in flight, grouped by quorum (earliest due first) and marked
    /// in flight (and their quorums busy until [`Self::apply`]), with how late each one is. Visits only what is
    /// due on the quorums that are free.
    pub fn take_due(&mut self, now: Instant) -> (Vec<DueBatch>, Vec<Duration>) {
        let mut lags = Vec::new();
        let mut batches = Vec::new();
        for (quorum, due) in self.waiting.take_due(now, &self.busy) {
            let mut batch = DueBatch {
                quorum,
                locks: Vec::with_capacity(due.len()),
                leases: Vec::with_capacity(due.len()),
            };
            for (slot, lock) in due {
                // The index holds waiting entries only, under their own slot; anything else would be stale.
                let Some(held) = self
                    .held
                    .get_mut(&lock)
                    .filter(|held| held.is_waiting() && held.slot() == slot)
                else {
                    continue;
                };
                held.in_flight = true;
                lags.push(now.saturating_duration_since(slot.at));
                batch.leases.push(held.lease.clone());
                let siblings = self.siblings(&lock);
                batch.locks.push(lock);
                // A semaphore's other permits go with it (early, which only lengthens their validity): their
                // schedules line up after one round, so one status refresh and one look at the lock serve all of
                // them, at every other extension as for a single lock, instead of a look at each permit's own.
                for sibling in siblings {
                    let Some(held) = self
                        .held
                        .get_mut(&sibling)
                        .filter(|held| held.is_waiting() && held.quorum == batch.quorum)
                    else {
                        continue;
                    };
                    held.leave(&mut self.waiting);
                    held.in_flight = true;
                    if held.next_at <= now {
                        // Due anyway: its lateness is measured as any other's.
                        lags.push(now.saturating_duration_since(held.next_at));
                    }
                    batch.leases.push(held.lease.clone());
                    batch.locks.push(sibling);
                }
            }
            if !batch.locks.is_empty() {
                batches.push(batch);
            }
        }
        self.busy.extend(batches.iter().map(|batch| batch.quorum.clone()));
        (batches, lags)
    }

    /// The other permits held of `lock`'s lock.
    fn siblings(&self, lock: &PermitRef) -> Vec<PermitRef> {
        let above_0 = self.semaphores.get(&lock.lock).into_iter().flatten();
        let first =
            (lock.permit != 0 && self.held.contains_key(&PermitRef::new(lock.lock.clone(), 0))).then_some(0);
        first
            .into_iter()
            .chain(above_0.copied())
            .filter(|permit| *permit != lock.permit)
            .map(|permit| PermitRef::new(lock.lock.clone(), permit))
            .collect()
    }

    /// Applies the results of one batch on `quorum`, in the order of its locks; the quorum's next due leases may
    /// then go.
    pub fn apply(
        &mut self,
        quorum: &str,
        locks: Vec<PermitRef>,
        results: Vec<Result<Lease, ExtendError>>,
        now: Instant,
    ) -> Applied {
        self.busy.remove(quorum);
        let mut applied = Applied::default();
        for (lock, result) in locks.into_iter().zip(results) {
            // Removed while in flight: the reconciler is waiting to release it.
            let Some(held) = self.held.get_mut(&lock) else {
                continue;
            };
            // Normally in flight, so not waiting; waiting only if it was inserted anew meanwhile.
            held.leave(&mut self.waiting);
            held.in_flight = false;
            match result {
                Ok(lease) => {
                    applied.extended += 1;
                    held.lease = lease;
                    held.retrying = false;
                    held.last_failure = None;
                }
                Err(ExtendError::NoQuorum { report }) => {
                    held.retrying = true;
                    held.lease = held.lease.after_failed_extension(&report);
                    held.last_failure = Some(report);
                }
                Err(ExtendError::Lost { holder, .. }) => held.lost = Some(LossReason::TakenOver { holder }),
                Err(ExtendError::Expired { report }) => {
                    held.lost = Some(LossReason::NotExtended {
                        last_report: report.or_else(|| held.last_failure.clone()),
                    });
                }
                Err(ExtendError::Config(_)) => held.lost = Some(LossReason::Expired),
            }
            if held.lost.is_none() {
                match next_keep_action(
                    now,
                    fencing_valid_until(&held.lease, &held.policy),
                    held.lease.validity(),
                    held.retrying,
                    &held.policy,
                ) {
                    KeepAction::ExtendAt(at) => held.next_at = at,
                    KeepAction::SignalLost => {
                        held.lost = Some(LossReason::NotExtended {
                            last_report: held.last_failure.clone(),
                        });
                    }
                }
            }
            // Back to waiting lowers the fence floor to this lease's fence time: a lock whose extension failed
            // is still signalled at its fence time at the latest.
            held.enter(&lock, &mut self.waiting);
            if held.lost.is_some() {
                applied.lost += 1;
            }
            if held.lost.is_some() || (!held.notified && status_due(held, now)) {
                held.notified = true;
                applied.wake.push(lock);
            }
        }
        applied
    }

    /// Locks whose fence time came while no extension succeeded (for instance every master timing out longer
    /// than a tick): their owner hears now, not when an extension finally gives up. Looks at every lock only once
    /// `now` reached the fence floor, which it then raises to the earliest fence time still waiting.
    pub fn signal_fenced(&mut self, now: Instant) -> Vec<PermitRef> {
        if !self.waiting.fence_may_have_come(now) {
            return Vec::new();
        }
        let mut fenced = Vec::new();
        let mut floor = None;
        for (lock, held) in &mut self.held {
            if !held.is_waiting() {
                continue;
            }
            let fence_at = held.fence_at();
            if now < fence_at {
                floor = Some(earliest(floor, fence_at));
                continue;
            }
            held.leave(&mut self.waiting);
            held.lost = Some(LossReason::NotExtended {
                last_report: held.last_failure.clone(),
            });
            held.notified = true;
            fenced.push(lock.clone());
        }
        self.waiting.set_fence_floor(floor);
        fenced
    }
}

/// What a lock is held as, besides its lease.
pub struct Holding {
    pub quorum: String,
    pub key: String,
    pub token: i64,
    pub policy: KeepPolicy,
}

/// What status shows of a validity is never left to run below this while extensions succeed (short TTLs
/// excepted, where two thirds of the TTL is all an extension gives): the holders' own fence margin (`elect`'s
/// and the guard's default, 1 s) and a second for the status write and the holders' watch to reach them. Less
/// made a guarded Job at a 3 s TTL stop its work on every other extension, though the lock was kept.
const SHOWN_VALIDITY_FLOOR: Duration = Duration::from_secs(2);

/// Status is refreshed when less than half a TTL is left of the validity it shows, or when what it shows would
/// fall below [`SHOWN_VALIDITY_FLOOR`] before the next extension (a third of the TTL later). At the default 10 s
/// TTL the first rule decides (one write every two extensions); below 9 s the second makes it more often, at
/// 3 s every extension.
fn status_due(held: &HeldLock, now: Instant) -> bool {
    let refresh_below = status_refresh_below(held.lease.ttl());
    held.status_valid_until
        .is_none_or(|until| until.saturating_duration_since(now) < refresh_below)
}

fn status_refresh_below(ttl: Duration) -> Duration {
    (ttl / 2).max((ttl / 3).saturating_add(SHOWN_VALIDITY_FLOOR))
}

#[cfg(test)]
mod tests;
