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
mod tests {
    use kube::runtime::reflector::ObjectRef;

    use super::*;
    use crate::redlock::{LockValue, NodeOutcome, NodeReport};

    const TTL: Duration = Duration::from_secs(10);

    fn policy() -> KeepPolicy {
        // Extension a third into the validity, retries every 500 ms, fence 2 s before the validity ends.
        KeepPolicy::for_ttl(TTL, Duration::from_millis(50))
    }

    fn lease(granted_at: Instant) -> Lease {
        Lease::for_tests("ns/a", LockValue::random("holder").unwrap(), TTL, granted_at)
    }

    fn lock() -> PermitRef {
        PermitRef::from(ObjectRef::new("a").within("ns"))
    }

    fn holding(quorum: &str, key: &str, token: i64) -> Holding {
        Holding {
            quorum: quorum.into(),
            key: key.into(),
            token,
            policy: policy(),
        }
    }

    fn table_holding(now: Instant) -> Table {
        let mut table = Table::default();
        assert!(table.insert(lock(), lease(now), holding("default", "ns/a", 3), now));
        table
    }

    fn no_quorum() -> ExtendError {
        ExtendError::NoQuorum {
            report: OperationReport {
                nodes: Vec::new(),
                elapsed: Duration::ZERO,
                quorum: 2,
            },
        }
    }

    /// Takes the one due lease, failing the test if none or several are due.
    fn take_one(table: &mut Table, now: Instant) -> Option<Vec<PermitRef>> {
        let (mut due, lags) = table.take_due(now);
        assert_eq!(due.len(), lags.len().min(1));
        due.pop().map(|batch| {
            assert_eq!(batch.quorum, "default");
            batch.locks
        })
    }

    #[tokio::test(start_paused = true)]
    async fn a_lease_is_extended_a_third_into_its_validity_and_once_at_a_time() {
        let start = Instant::now();
        let mut table = table_holding(start);
        assert!(take_one(&mut table, start + Duration::from_secs(3)).is_none());
        let third = start + TTL / 3;
        let locks = take_one(&mut table, third).expect("due a third in");
        assert_eq!(locks, [lock()]);
        assert!(
            take_one(&mut table, third + Duration::from_secs(1)).is_none(),
            "in flight: not sent twice"
        );
        assert!(
            matches!(table.remove(&lock()), Removal::InFlight),
            "not removed under a running extension"
        );

        let applied = table.apply("default", locks, vec![Ok(lease(third))], third);
        assert_eq!(applied.extended, 1);
        assert_eq!(
            applied.wake,
            [lock()],
            "status was never written: the reconciler is woken once"
        );
        let view = table.view(&lock(), third).expect("held");
        assert_eq!(
            view.lease.valid_until(),
            third + TTL,
            "the new lease replaced the old one"
        );
        assert!(
            take_one(&mut table, third + TTL / 3 - Duration::from_millis(1)).is_none(),
            "the next extension is planned from the new lease"
        );
        assert!(take_one(&mut table, third + TTL / 3).is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn keys_a_failed_extension_re_created_do_not_vote_until_one_succeeds() {
        let start = Instant::now();
        let mut table = table_holding(start);
        let third = start + TTL / 3;
        let locks = take_one(&mut table, third).expect("due");
        let node = |outcome| NodeReport {
            endpoint: "redis://127.0.0.1:1".into(),
            outcome,
            latency: None,
        };
        let failed = ExtendError::NoQuorum {
            report: OperationReport {
                nodes: vec![
                    node(NodeOutcome::Granted),
                    node(NodeOutcome::Recreated),
                    node(NodeOutcome::Timeout),
                ],
                elapsed: Duration::ZERO,
                quorum: 2,
            },
        };
        table.apply("default", locks, vec![Err(failed)], third);
        let view = table.view(&lock(), third).expect("held");
        assert_eq!(view.lease.unconfirmed(), [1]);
        assert_eq!(view.lease.valid_until(), start + TTL, "the validity is unchanged");

        let retry = third + Duration::from_millis(500);
        let locks = take_one(&mut table, retry).expect("retried");
        table.apply("default", locks, vec![Ok(lease(retry))], retry);
        let view = table.view(&lock(), retry).expect("held");
        assert!(view.lease.unconfirmed().is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_quorum_with_a_batch_in_flight_holds_up_no_other_quorum() {
        let start = Instant::now();
        let mut table = table_holding(start);
        let slow = PermitRef::from(ObjectRef::new("b").within("ns"));
        assert!(table.insert(slow.clone(), lease(start), holding("slow", "ns/b", 1), start));
        let third = start + TTL / 3;
        let (due, _) = table.take_due(third);
        assert_eq!(due.len(), 2, "one batch per quorum");
        let fast = due
            .into_iter()
            .find(|batch| batch.quorum == "default")
            .expect("default's batch");
        // The slow quorum's batch never comes back; the default quorum's goes on extending on schedule.
        let mut now = third;
        let mut locks = fast.locks;
        for _ in 0..5 {
            let applied = table.apply("default", locks, vec![Ok(lease(now))], now);
            assert_eq!(applied.extended, 1);
            now += TTL / 3;
            locks = take_one(&mut table, now).expect("default's next extension, on time");
        }
        let (due, _) = table.take_due(now + TTL);
        assert!(
            due.iter().all(|batch| batch.quorum != "slow"),
            "at most one batch in flight per quorum"
        );
        let applied = table.apply("slow", vec![slow], vec![Err(no_quorum())], now);
        assert_eq!(applied.extended, 0);
    }

    /// Extensions come a third of the TTL apart, each when two thirds are left; status shows what the last write
    /// gave. Whatever the TTL, what it shows never runs below the floor (or, where the TTL is too short for that,
    /// below what one extension leaves) before the extension that refreshes it.
    #[test]
    fn what_status_shows_stays_above_the_holders_margin_at_every_ttl() {
        for millis in (300..=60_000).step_by(100) {
            let ttl = Duration::from_millis(millis);
            // Just written: status shows a whole TTL.
            let mut shown_left = ttl;
            let mut lowest = shown_left;
            for _ in 0..10 {
                // The next extension, a third of the TTL later.
                shown_left = shown_left.saturating_sub(ttl / 3);
                lowest = lowest.min(shown_left);
                if shown_left < status_refresh_below(ttl) {
                    shown_left = ttl;
                }
            }
            let floor = SHOWN_VALIDITY_FLOOR.min(ttl * 2 / 3);
            assert!(lowest + Duration::from_millis(1) >= floor, "{ttl:?}: {lowest:?}");
        }
        assert_eq!(
            status_refresh_below(Duration::from_secs(10)),
            Duration::from_secs(2) + Duration::from_secs(10) / 3,
            "at the default TTL, one write every two extensions, as before"
        );
        assert_eq!(
            status_refresh_below(Duration::from_secs(3)),
            Duration::from_secs(3)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_reconciler_is_woken_when_status_is_due_and_not_again_until_it_writes() {
        let start = Instant::now();
        let mut table = table_holding(start);
        table.status_written(&lock(), start + TTL);
        let third = start + TTL / 3;
        let locks = take_one(&mut table, third).expect("due");
        let applied = table.apply("default", locks, vec![Ok(lease(third))], third);
        assert!(applied.wake.is_empty(), "status still shows two thirds of a TTL");

        let later = start + TTL * 2 / 3;
        let locks = take_one(&mut table, later).expect("due");
        let applied = table.apply("default", locks, vec![Ok(lease(later))], later);
        assert_eq!(
            applied.wake,
            [lock()],
            "less than half a TTL left of what status shows"
        );
        assert!(table.view(&lock(), later).expect("held").status_due);
    }

    #[tokio::test(start_paused = true)]
    async fn failed_extensions_are_retried_and_the_loss_is_signalled_at_the_fence_time_before_the_validity_ends()
     {
        let start = Instant::now();
        let mut table = table_holding(start);
        let fence_time = start + TTL - policy().fence_margin;
        let step = Duration::from_millis(100);
        let mut now = start + TTL / 3;
        let mut attempts = 0;
        let lost_at = loop {
            let mut lost = table.signal_fenced(now).len();
            if let Some(locks) = take_one(&mut table, now) {
                attempts += 1;
                let applied = table.apply("default", locks, vec![Err(no_quorum())], now);
                assert_eq!(applied.extended, 0);
                lost += usize::try_from(applied.lost).unwrap_or(usize::MAX);
            }
            if lost > 0 {
                break now;
            }
            assert!(
                now < fence_time,
                "the loss is signalled at the first look after the fence time"
            );
            now += step;
        };
        assert!(attempts > 1, "retried every retry interval");
        assert!(lost_at >= fence_time, "never before the fence time");
        assert!(
            fence_time < start + TTL,
            "the fence time is before the validity ends"
        );
        let view = table
            .view(&lock(), now)
            .expect("still in the table until released");
        assert!(matches!(view.lost, Some(LossReason::NotExtended { .. })));
        assert!(
            take_one(&mut table, now + TTL).is_none(),
            "a lost lock is not extended"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_keeper_that_ran_late_signals_the_loss_at_its_first_look_after_the_fence_time() {
        let start = Instant::now();
        let mut table = table_holding(start);
        let fence_time = start + TTL - policy().fence_margin;
        assert!(
            table
                .signal_fenced(fence_time - Duration::from_millis(1))
                .is_empty()
        );
        assert_eq!(table.signal_fenced(fence_time), [lock()]);
        assert!(table.signal_fenced(fence_time).is_empty(), "signalled once");
    }

    #[tokio::test(start_paused = true)]
    async fn a_takeover_is_a_loss_at_once_and_a_removed_lock_ignores_late_results() {
        let start = Instant::now();
        let mut table = table_holding(start);
        let third = start + TTL / 3;
        let locks = take_one(&mut table, third).expect("due");
        let taken = ExtendError::Lost {
            holder: Some("other".into()),
            report: OperationReport {
                nodes: Vec::new(),
                elapsed: Duration::ZERO,
                quorum: 2,
            },
        };
        let applied = table.apply("default", locks.clone(), vec![Err(taken)], third);
        assert_eq!((applied.lost, applied.wake.len()), (1, 1));
        let view = table.view(&lock(), third).expect("held");
        assert!(matches!(view.lost, Some(LossReason::TakenOver { holder: Some(ref h) }) if h == "other"));

        assert!(matches!(table.remove(&lock()), Removal::Removed(_)));
        let applied = table.apply("default", locks, vec![Ok(lease(third))], third);
        assert_eq!(
            applied,
            Applied::default(),
            "released meanwhile: nothing to apply"
        );
        assert!(table.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn the_permits_of_one_lock_are_kept_extended_and_lost_each_on_its_own() {
        let start = Instant::now();
        let mut table = table_holding(start);
        let second = PermitRef::new(lock().lock, 1);
        let permit_1 = holding("default", "permit:1:ns/a", 1);
        assert!(table.insert(second.clone(), lease(start), permit_1, start));
        assert_eq!(table.len(), 2, "permit 1 does not replace permit 0");
        // Status shows permit 0's validity, so only a loss wakes the lock for it.
        table.status_written(&lock(), start + TTL);
        let third = start + TTL / 3;
        let locks = take_one(&mut table, third).expect("both due");
        assert_eq!(locks, [lock(), second.clone()]);
        let taken = ExtendError::Lost {
            holder: None,
            report: OperationReport {
                nodes: Vec::new(),
                elapsed: Duration::ZERO,
                quorum: 2,
            },
        };
        let applied = table.apply("default", locks, vec![Ok(lease(third)), Err(taken)], third);
        assert_eq!((applied.extended, applied.lost), (1, 1));
        assert_eq!(
            applied.wake,
            std::slice::from_ref(&second),
            "only the lost permit wakes its lock"
        );
        let first = table.view(&lock(), third).expect("permit 0 held");
        assert!(first.lost.is_none(), "permit 1's loss is not permit 0's");
        assert_eq!(first.token, 3);
        let lost = table.view(&second, third).expect("permit 1 kept until removed");
        assert!(lost.lost.is_some());
        assert!(matches!(table.remove(&second), Removal::Removed(_)));
        assert!(
            table.view(&lock(), third).is_some(),
            "removing permit 1 leaves permit 0"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_semaphores_permits_are_extended_together_from_the_first_one_due() {
        let start = Instant::now();
        let mut table = table_holding(start);
        let permit = |number| PermitRef::new(lock().lock, number);
        let later = start + Duration::from_secs(2);
        assert!(table.insert(
            permit(1),
            lease(later),
            holding("default", "permit:1:ns/a", 1),
            later
        ));
        assert!(table.insert(
            permit(2),
            lease(later),
            holding("moved", "permit:2:ns/a", 1),
            later
        ));
        let third = start + TTL / 3;
        let (mut due, lags) = table.take_due(third);
        assert_eq!(lags.len(), 1, "only permit 0 was due");
        let batch = take_batch(&mut due, "default");
        assert_eq!(
            batch.locks,
            [lock(), permit(1)],
            "permit 1 goes early with permit 0; permit 2, on another quorum, does not"
        );
        let (again, _) = table.take_due(third);
        assert!(again.is_empty(), "nothing is taken twice");
        let results = succeeded(&batch, third);
        let applied = table.apply("default", batch.locks, results, third);
        assert_eq!(applied.extended, 2);
        let (mut moved, _) = table.take_due(later + TTL / 3);
        assert_eq!(moved.len(), 1);
        assert_eq!(take_batch(&mut moved, "moved").locks, [permit(2)]);
        // From now on they are due at the same moment.
        let (mut due, lags) = table.take_due(third + TTL / 3);
        assert_eq!(lags.len(), 2, "permits 0 and 1 both due");
        assert_eq!(take_batch(&mut due, "default").locks, [lock(), permit(1)]);
        assert!(matches!(table.remove(&permit(1)), Removal::InFlight));
        assert_eq!(table.siblings(&permit(2)), [lock(), permit(1)]);
    }

    // The indexes of waiting entries: what they give must be what a look at every entry would give.

    fn ms(millis: u64) -> Duration {
        Duration::from_millis(millis)
    }

    fn named(name: &str) -> PermitRef {
        PermitRef::from(ObjectRef::new(name).within("ns"))
    }

    fn names(locks: &[PermitRef]) -> Vec<&str> {
        locks.iter().map(|lock| lock.lock.name.as_str()).collect()
    }

    /// Holds `name` on `quorum` with a lease granted at `granted_at`, inserted at that moment.
    fn hold(table: &mut Table, quorum: &str, name: &str, granted_at: Instant) -> bool {
        let holding = Holding {
            quorum: quorum.into(),
            key: format!("ns/{name}"),
            token: 1,
            policy: policy(),
        };
        table.insert(named(name), lease(granted_at), holding, granted_at)
    }

    /// When a lease granted at `granted_at` is first due for extension, by the schedule's own rule.
    fn due_at(granted_at: Instant) -> Instant {
        match next_keep_action(granted_at, granted_at + TTL, TTL, false, &policy()) {
            KeepAction::ExtendAt(at) => at,
            KeepAction::SignalLost => panic!("a fresh lease is not fenced"),
        }
    }

    fn fence_of(granted_at: Instant) -> Instant {
        granted_at + TTL - policy().fence_margin
    }

    /// Takes the batch of `quorum` out of `batches`.
    fn take_batch(batches: &mut Vec<DueBatch>, quorum: &str) -> DueBatch {
        let index = batches
            .iter()
            .position(|batch| batch.quorum == quorum)
            .unwrap_or_else(|| panic!("no batch for {quorum}"));
        batches.swap_remove(index)
    }

    fn succeeded(batch: &DueBatch, now: Instant) -> Vec<Result<Lease, ExtendError>> {
        batch.locks.iter().map(|_| Ok(lease(now))).collect()
    }

    fn failed(batch: &DueBatch) -> Vec<Result<Lease, ExtendError>> {
        batch.locks.iter().map(|_| Err(no_quorum())).collect()
    }

    fn lock_names(prefix: &str, range: std::ops::Range<u64>) -> Vec<String> {
        range.map(|i| format!("{prefix}{i:02}")).collect()
    }

    /// The indexes agree with the entries: every waiting entry is indexed once, under its quorum and slot, and
    /// nothing else is; the fence floor is at or before every waiting entry's fence time.
    fn assert_indexed(table: &Table) {
        let mut expected: Vec<(String, Slot, PermitRef)> = table
            .held
            .iter()
            .filter(|(_, held)| held.is_waiting())
            .map(|(lock, held)| (held.quorum.clone(), held.slot(), lock.clone()))
            .collect();
        let mut indexed: Vec<(String, Slot, PermitRef)> = table
            .waiting
            .entries()
            .map(|(quorum, slot, lock)| (quorum.to_owned(), slot, lock.clone()))
            .collect();
        expected.sort_by_key(|(_, slot, _)| *slot);
        indexed.sort_by_key(|(_, slot, _)| *slot);
        assert_eq!(indexed, expected);
        let first_fence = table
            .held
            .values()
            .filter(|held| held.is_waiting())
            .map(HeldLock::fence_at)
            .min();
        if let Some(first_fence) = first_fence {
            let floor = table.waiting.fence_floor();
            assert!(
                floor.is_some_and(|floor| floor <= first_fence),
                "floor {floor:?} after the first fence {first_fence:?}"
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn many_locks_on_two_quorums_go_in_due_order_and_a_busy_quorums_due_locks_wait_for_it() {
        let start = Instant::now();
        let mut table = Table::default();
        let granted = |i: u64| start + ms(10 * i);
        for i in 0..100 {
            assert!(hold(&mut table, "fast", &format!("f{i:02}"), granted(i)));
            assert!(hold(&mut table, "slow", &format!("s{i:02}"), granted(i)));
        }
        assert_indexed(&table);

        let now = due_at(granted(49));
        let (mut batches, mut lags) = table.take_due(now);
        assert_eq!(batches.len(), 2);
        let fast = take_batch(&mut batches, "fast");
        let slow = take_batch(&mut batches, "slow");
        assert_eq!(names(&fast.locks), lock_names("f", 0..50));
        assert_eq!(names(&slow.locks), lock_names("s", 0..50));
        let granted_at: Vec<Instant> = fast.leases.iter().map(Lease::granted_at).collect();
        assert_eq!(
            granted_at,
            (0..50).map(granted).collect::<Vec<_>>(),
            "leases in the order of the locks"
        );
        lags.sort_unstable();
        let mut expected: Vec<Duration> = (0..50).flat_map(|i| [now - due_at(granted(i)); 2]).collect();
        expected.sort_unstable();
        assert_eq!(lags, expected, "how late each one is");
        assert_indexed(&table);

        let applied = table.apply("fast", fast.locks.clone(), succeeded(&fast, now), now);
        assert_eq!(applied.extended, 50);
        assert_indexed(&table);

        // Every lock left is due now; the slow quorum's batch is still in flight.
        let later = due_at(granted(99));
        let (batches, _) = table.take_due(later);
        assert_eq!(batches.len(), 1);
        assert_eq!(batches[0].quorum, "fast");
        assert_eq!(names(&batches[0].locks), lock_names("f", 50..100));
        let mut still_waiting: Vec<&str> = table
            .waiting
            .entries()
            .filter(|(quorum, _, _)| *quorum == "slow")
            .map(|(_, _, lock)| lock.lock.name.as_str())
            .collect();
        still_waiting.sort_unstable();
        assert_eq!(
            still_waiting,
            lock_names("s", 50..100),
            "left in the index, not taken"
        );
        assert_indexed(&table);

        // The slow batch fails: its quorum is free, and its due locks go at once, earliest first.
        let applied = table.apply("slow", slow.locks.clone(), failed(&slow), later);
        assert_eq!((applied.extended, applied.lost), (0, 0));
        let (batches, lags) = table.take_due(later);
        assert_eq!(batches.len(), 1);
        assert_eq!(batches[0].quorum, "slow");
        assert_eq!(names(&batches[0].locks), lock_names("s", 50..100));
        let expected: Vec<Duration> = (50..100).map(|i| later - due_at(granted(i))).collect();
        assert_eq!(lags, expected);
        let applied = table.apply(
            "slow",
            batches[0].locks.clone(),
            succeeded(&batches[0], later),
            later,
        );
        assert_eq!(applied.extended, 50);

        // The failed ones are retried a retry interval later; the fast quorum still waits for its batch.
        let retry = later + policy().retry_interval;
        assert!(table.take_due(retry - ms(1)).0.is_empty());
        let (batches, _) = table.take_due(retry);
        assert_eq!(batches.len(), 1);
        assert_eq!(batches[0].quorum, "slow");
        assert_eq!(names(&batches[0].locks), lock_names("s", 0..50));
        assert_indexed(&table);
    }

    #[tokio::test(start_paused = true)]
    async fn within_a_batch_the_earliest_due_goes_first_and_ties_in_insertion_order() {
        let start = Instant::now();
        let mut table = Table::default();
        for (name, offset) in [("c", 30), ("a", 10), ("b", 20), ("d", 10), ("e", 40)] {
            assert!(hold(&mut table, "default", name, start + ms(offset)));
        }
        let now = due_at(start + ms(30));
        let (batches, lags) = table.take_due(now);
        assert_eq!(batches.len(), 1);
        assert_eq!(names(&batches[0].locks), ["a", "d", "b", "c"]);
        let expected: Vec<Duration> = [10, 10, 20, 30]
            .into_iter()
            .map(|offset| now - due_at(start + ms(offset)))
            .collect();
        assert_eq!(lags, expected);
        assert_indexed(&table);
    }

    #[tokio::test(start_paused = true)]
    async fn a_lock_removed_or_replaced_while_waiting_leaves_the_index() {
        let start = Instant::now();
        let mut table = Table::default();
        for name in ["a", "b", "c"] {
            assert!(hold(&mut table, "default", name, start));
        }
        assert!(matches!(table.remove(&named("b")), Removal::Removed(_)));
        assert!(matches!(table.remove(&named("b")), Removal::Absent));
        let renewed = start + ms(1_000);
        assert!(
            !hold(&mut table, "default", "c", renewed),
            "held before: replaced"
        );
        assert_indexed(&table);

        let (batches, _) = table.take_due(due_at(start));
        assert_eq!(batches.len(), 1);
        assert_eq!(names(&batches[0].locks), ["a"], "b is gone, c is due later");
        let applied = table.apply(
            "default",
            batches[0].locks.clone(),
            succeeded(&batches[0], due_at(start)),
            due_at(start),
        );
        assert_eq!(applied.extended, 1);
        assert!(matches!(table.remove(&named("a")), Removal::Removed(_)));
        assert_indexed(&table);

        assert!(table.take_due(due_at(renewed) - ms(1)).0.is_empty());
        let (batches, _) = table.take_due(due_at(renewed));
        assert_eq!(names(&batches[0].locks), ["c"]);
        assert!(
            table.take_due(start + TTL * 10).0.is_empty(),
            "a removed lock never comes back"
        );
        assert_indexed(&table);
    }

    #[tokio::test(start_paused = true)]
    async fn a_lost_lock_is_never_scheduled_again() {
        let start = Instant::now();
        let mut table = Table::default();
        for (quorum, name) in [("default", "taken"), ("default", "expired"), ("other", "fenced")] {
            assert!(hold(&mut table, quorum, name, start));
        }
        let now = due_at(start);
        let (mut batches, _) = table.take_due(now);
        let default = take_batch(&mut batches, "default");
        let other = take_batch(&mut batches, "other");
        assert_eq!(names(&default.locks), ["taken", "expired"]);
        let results = vec![
            Err(ExtendError::Lost {
                holder: Some("someone".into()),
                report: OperationReport {
                    nodes: Vec::new(),
                    elapsed: Duration::ZERO,
                    quorum: 2,
                },
            }),
            Err(ExtendError::Expired { report: None }),
        ];
        let applied = table.apply("default", default.locks, results, now);
        assert_eq!((applied.lost, applied.wake.len()), (2, 2));
        let applied = table.apply("other", other.locks.clone(), failed(&other), now);
        assert_eq!(applied.lost, 0, "retrying");
        assert_indexed(&table);

        assert_eq!(table.signal_fenced(fence_of(start)), [named("fenced")]);
        assert_indexed(&table);
        assert_eq!(table.waiting.entries().count(), 0, "nothing left to extend");
        let far = start + TTL * 10;
        assert!(table.take_due(far).0.is_empty());
        assert!(table.signal_fenced(far).is_empty(), "each loss signalled once");
        assert_eq!(table.len(), 3, "lost locks stay until released");
    }

    #[tokio::test(start_paused = true)]
    async fn a_lock_back_from_a_failed_batch_is_signalled_at_its_fence_time_though_a_look_passed_it_in_flight()
     {
        // Late enough that leases granted seconds before it exist.
        let start = Instant::now() + TTL;
        let mut table = Table::default();
        let flying_granted = start - ms(3_400);
        assert!(hold(&mut table, "default", "flying", flying_granted));
        let (batches, _) = table.take_due(start);
        assert_eq!(names(&batches[0].locks), ["flying"]);

        // While it is in flight, another lock's fence time comes: the look at every lock does not see it.
        let early_granted = start - ms(7_000);
        assert!(hold(&mut table, "default", "early", early_granted));
        assert!(hold(&mut table, "default", "late", start));
        assert_eq!(table.signal_fenced(fence_of(early_granted)), [named("early")]);
        assert_indexed(&table);

        // Its extension fails: waiting again, its fence time comes before the late lock's.
        let applied = table.apply(
            "default",
            batches[0].locks.clone(),
            failed(&batches[0]),
            start + ms(1_500),
        );
        assert_eq!((applied.extended, applied.lost), (0, 0));
        assert_indexed(&table);
        let flying_fence = fence_of(flying_granted);
        assert!(flying_fence < fence_of(start));
        assert!(table.signal_fenced(flying_fence - ms(1)).is_empty());
        assert_eq!(table.signal_fenced(flying_fence), [named("flying")]);
        assert!(table.signal_fenced(fence_of(start) - ms(1)).is_empty());
        assert_eq!(table.signal_fenced(fence_of(start)), [named("late")]);
        assert_indexed(&table);
    }

    #[tokio::test(start_paused = true)]
    async fn under_failing_extensions_every_lock_is_signalled_at_the_first_tick_after_its_fence_time() {
        let start = Instant::now();
        let tick = ms(50);
        let mut table = Table::default();
        let granted = |i: u64| start + ms(37 * i);
        for i in 0..20 {
            assert!(hold(
                &mut table,
                if i % 2 == 0 { "even" } else { "odd" },
                &format!("l{i:02}"),
                granted(i)
            ));
        }
        let mut lost_at: HashMap<String, Instant> = HashMap::new();
        let mut now = start;
        while lost_at.len() < 20 {
            assert!(
                now < start + TTL * 2,
                "every lock is signalled before its validity ends"
            );
            for lock in table.signal_fenced(now) {
                assert!(
                    lost_at.insert(lock.lock.name.clone(), now).is_none(),
                    "signalled once"
                );
            }
            let (batches, _) = table.take_due(now);
            for batch in batches {
                let applied = table.apply(&batch.quorum, batch.locks.clone(), failed(&batch), now);
                assert_eq!(applied.lost, 0, "signalled by the fence look first");
            }
            assert_indexed(&table);
            now += tick;
        }
        for i in 0..20 {
            let fence = fence_of(granted(i));
            let ticks = (fence - start).as_nanos().div_ceil(tick.as_nanos());
            let first_tick_after = start + tick * u32::try_from(ticks).expect("few ticks");
            assert_eq!(lost_at[&format!("l{i:02}")], first_tick_after, "l{i:02}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn clear_empties_the_index() {
        let start = Instant::now();
        let mut table = Table::default();
        for i in 0..10 {
            assert!(hold(
                &mut table,
                if i < 5 { "a" } else { "b" },
                &format!("l{i}"),
                start + ms(i)
            ));
        }
        let (batches, _) = table.take_due(due_at(start + ms(9)));
        assert_eq!(batches.len(), 2);
        assert_eq!(table.clear(), 10);
        assert_eq!(table.waiting.entries().count(), 0);
        assert_eq!(table.waiting.fence_floor(), None);
        assert!(table.signal_fenced(start + TTL * 2).is_empty());
        assert!(table.take_due(start + TTL * 2).0.is_empty());
        for batch in batches {
            let now = start + TTL;
            let applied = table.apply(&batch.quorum, batch.locks.clone(), succeeded(&batch, now), now);
            assert_eq!(applied, Applied::default(), "forgotten meanwhile");
        }
        assert!(hold(&mut table, "a", "again", start + TTL));
        let (batches, _) = table.take_due(due_at(start + TTL));
        assert_eq!(names(&batches[0].locks), ["again"], "the quorum is free again");
        assert_indexed(&table);
    }

    /// Random operations in random order; after each, the indexes agree with the entries, and every take and
    /// fence look gives exactly what a look at every entry gives.
    #[tokio::test(start_paused = true)]
    async fn the_indexes_take_and_signal_exactly_what_a_look_at_every_lock_would() {
        use rand::{Rng, SeedableRng, rngs::StdRng};

        let mut rng = StdRng::seed_from_u64(16);
        let start = Instant::now() + TTL;
        let mut now = start;
        let mut table = Table::default();
        let mut in_flight: Vec<DueBatch> = Vec::new();
        let (mut taken, mut fenced) = (0, 0);
        for _ in 0..4_000 {
            match rng.random_range(0..100) {
                0..30 => now += ms(rng.random_range(0..300)),
                30..42 => {
                    let name = format!("l{}", rng.random_range(0..40));
                    let quorum = ["q0", "q1", "q2"][rng.random_range(0..3)];
                    let granted_at = now - ms(rng.random_range(0..9_000));
                    let holding = Holding {
                        quorum: quorum.into(),
                        key: name.clone(),
                        token: 1,
                        policy: policy(),
                    };
                    table.insert(named(&name), lease(granted_at), holding, now);
                }
                42..47 => {
                    table.remove(&named(&format!("l{}", rng.random_range(0..40))));
                }
                47..67 => {
                    let mut expected: Vec<(Slot, PermitRef, String, Duration)> = table
                        .held
                        .iter()
                        .filter(|(_, held)| {
                            held.is_waiting() && held.next_at <= now && !table.busy.contains(&held.quorum)
                        })
                        .map(|(lock, held)| {
                            (held.slot(), lock.clone(), held.quorum.clone(), now - held.next_at)
                        })
                        .collect();
                    expected.sort_by_key(|(slot, ..)| *slot);
                    let (batches, mut lags) = table.take_due(now);
                    let mut got: Vec<(String, Vec<PermitRef>)> = batches
                        .iter()
                        .map(|batch| (batch.quorum.clone(), batch.locks.clone()))
                        .collect();
                    got.sort_by(|a, b| a.0.cmp(&b.0));
                    let mut want: Vec<(String, Vec<PermitRef>)> = Vec::new();
                    for quorum in ["q0", "q1", "q2"] {
                        let locks: Vec<PermitRef> = expected
                            .iter()
                            .filter(|(_, _, q, _)| q == quorum)
                            .map(|(_, lock, ..)| lock.clone())
                            .collect();
                        if !locks.is_empty() {
                            want.push((quorum.to_owned(), locks));
                        }
                    }
                    assert_eq!(got, want);
                    let mut want_lags: Vec<Duration> = expected.iter().map(|(.., lag)| *lag).collect();
                    want_lags.sort_unstable();
                    lags.sort_unstable();
                    assert_eq!(lags, want_lags);
                    assert!(batches.iter().all(|batch| table.busy.contains(&batch.quorum)));
                    taken += expected.len();
                    in_flight.extend(batches);
                }
                67..80 if !in_flight.is_empty() => {
                    let batch = in_flight.swap_remove(rng.random_range(0..in_flight.len()));
                    let results = batch
                        .locks
                        .iter()
                        .map(|_| match rng.random_range(0..10) {
                            0..5 => Ok(lease(now)),
                            5..8 => Err(no_quorum()),
                            8 => Err(ExtendError::Expired { report: None }),
                            _ => Err(ExtendError::Lost {
                                holder: None,
                                report: OperationReport {
                                    nodes: Vec::new(),
                                    elapsed: Duration::ZERO,
                                    quorum: 2,
                                },
                            }),
                        })
                        .collect();
                    table.apply(&batch.quorum, batch.locks, results, now);
                }
                80..99 => {
                    let mut want: Vec<PermitRef> = table
                        .held
                        .iter()
                        .filter(|(_, held)| held.is_waiting() && held.fence_at() <= now)
                        .map(|(lock, _)| lock.clone())
                        .collect();
                    let mut got = table.signal_fenced(now);
                    want.sort_by(|a, b| a.lock.name.cmp(&b.lock.name));
                    got.sort_by(|a, b| a.lock.name.cmp(&b.lock.name));
                    assert_eq!(got, want);
                    fenced += got.len();
                }
                _ => {
                    table.clear();
                }
            }
            assert_indexed(&table);
        }
        assert!(
            taken > 200 && fenced > 20,
            "the run exercised both: {taken} taken, {fenced} fenced"
        );
    }
}
