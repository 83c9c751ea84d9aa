//! The keeper's state: every held lock, when it is next extended, and whether it is lost. Pure: every function
//! takes the time it acts at, so the schedule, the application of extension results and the fence-time signal
//! are tested with a paused clock and no master.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use kube::runtime::reflector::ObjectRef;
use tokio::time::Instant;

use crate::api::DistributedLock;
use crate::redlock::{
    ExtendError, KeepAction, KeepPolicy, Lease, LossReason, OperationReport, next_keep_action,
};

pub type LockRef = ObjectRef<DistributedLock>;

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
    pub locks: Vec<LockRef>,
    pub leases: Vec<Lease>,
}

/// What applying a batch's results changed.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Applied {
    pub extended: u64,
    /// Locks lost by this batch.
    pub lost: u64,
    /// Locks whose reconciler must look now: lost, or status due.
    pub wake: Vec<LockRef>,
}

/// Taking a lock out of the table.
pub enum Removal {
    Absent,
    /// An extension of it is in flight: wait for the batch to finish (an extension landing after a release would
    /// re-create the key).
    InFlight,
    Removed(Lease),
}

#[derive(Default)]
pub struct Table {
    held: HashMap<LockRef, HeldLock>,
    /// Quorums with a batch in flight: each quorum has at most one, so a quorum whose masters hang (up to its
    /// node timeout per command) delays only its own locks, never another quorum's.
    busy: HashSet<String>,
}

impl Table {
    /// Keeps `lease` from `now`; `true` when the lock was not held before.
    pub fn insert(&mut self, lock: LockRef, lease: Lease, held: Holding, now: Instant) -> bool {
        let next_at = match next_keep_action(now, lease.valid_until(), lease.validity(), false, &held.policy)
        {
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
        };
        self.held.insert(lock, entry).is_none()
    }

    pub fn view(&self, lock: &LockRef, now: Instant) -> Option<HeldView> {
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

    /// Records that status now shows the validity ending at `valid_until`.
    pub fn status_written(&mut self, lock: &LockRef, valid_until: Instant) {
        if let Some(held) = self.held.get_mut(lock) {
            held.status_valid_until = Some(valid_until);
            held.notified = false;
        }
    }

    pub fn remove(&mut self, lock: &LockRef) -> Removal {
        match self.held.get(lock) {
            None => Removal::Absent,
            Some(held) if held.in_flight => Removal::InFlight,
            Some(_) => self
                .held
                .remove(lock)
                .map_or(Removal::Absent, |held| Removal::Removed(held.lease)),
        }
    }

    pub fn clear(&mut self) -> usize {
        let count = self.held.len();
        self.held.clear();
        count
    }

    pub fn len(&self) -> usize {
        self.held.len()
    }

    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    /// Leases due at `now` on quorums with no batch in flight, grouped by quorum and marked in flight (and their
    /// quorums busy until [`Self::batch_finished`]), with how late each one is.
    pub fn take_due(&mut self, now: Instant) -> (Vec<DueBatch>, Vec<Duration>) {
        let mut groups: HashMap<&str, DueBatch> = HashMap::new();
        let mut lags = Vec::new();
        let busy = &self.busy;
        for (lock, held) in &mut self.held {
            if held.lost.is_none() && !held.in_flight && held.next_at <= now && !busy.contains(&held.quorum) {
                held.in_flight = true;
                lags.push(now.saturating_duration_since(held.next_at));
                let batch = groups.entry(&held.quorum).or_insert_with(|| DueBatch {
                    quorum: held.quorum.clone(),
                    locks: Vec::new(),
                    leases: Vec::new(),
                });
                batch.locks.push(lock.clone());
                batch.leases.push(held.lease.clone());
            }
        }
        let batches: Vec<DueBatch> = groups.into_values().collect();
        self.busy.extend(batches.iter().map(|batch| batch.quorum.clone()));
        (batches, lags)
    }

    /// Applies the results of one batch on `quorum`, in the order of its locks; the quorum's next due leases may
    /// then go.
    pub fn apply(
        &mut self,
        quorum: &str,
        locks: Vec<LockRef>,
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
                    held.lease.valid_until(),
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
    /// than a tick): their owner hears now, not when an extension finally gives up.
    pub fn signal_fenced(&mut self, now: Instant) -> Vec<LockRef> {
        let mut fenced = Vec::new();
        for (lock, held) in &mut self.held {
            let due = next_keep_action(
                now,
                held.lease.valid_until(),
                held.lease.validity(),
                true,
                &held.policy,
            );
            if held.lost.is_none() && !held.in_flight && due == KeepAction::SignalLost {
                held.lost = Some(LossReason::NotExtended {
                    last_report: held.last_failure.clone(),
                });
                held.notified = true;
                fenced.push(lock.clone());
            }
        }
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

/// Status is refreshed when less than half a TTL is left of the validity it shows.
fn status_due(held: &HeldLock, now: Instant) -> bool {
    held.status_valid_until
        .is_none_or(|until| until.saturating_duration_since(now) < held.lease.ttl() / 2)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::redlock::LockValue;

    const TTL: Duration = Duration::from_secs(10);

    fn policy() -> KeepPolicy {
        // Extension a third into the validity, retries every 500 ms, fence 2 s before the validity ends.
        KeepPolicy::for_ttl(TTL, Duration::from_millis(50))
    }

    fn lease(granted_at: Instant) -> Lease {
        Lease::for_tests("ns/a", LockValue::random("holder").unwrap(), TTL, granted_at)
    }

    fn lock() -> LockRef {
        ObjectRef::new("a").within("ns")
    }

    fn table_holding(now: Instant) -> Table {
        let mut table = Table::default();
        let holding = Holding {
            quorum: "default".into(),
            key: "ns/a".into(),
            token: 3,
            policy: policy(),
        };
        assert!(table.insert(lock(), lease(now), holding, now));
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
    fn take_one(table: &mut Table, now: Instant) -> Option<Vec<LockRef>> {
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
    async fn a_quorum_with_a_batch_in_flight_holds_up_no_other_quorum() {
        let start = Instant::now();
        let mut table = table_holding(start);
        let slow = ObjectRef::new("b").within("ns");
        let holding = Holding {
            quorum: "slow".into(),
            key: "ns/b".into(),
            token: 1,
            policy: policy(),
        };
        assert!(table.insert(slow.clone(), lease(start), holding, start));
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
}
