//! The locks this replica holds, kept extended by ONE task: every tick it gathers the leases that are due,
//! extends them per quorum as one batch (one pipeline per master, see `Redlock::extend_many`), and tells the
//! lock reconciler at once when a lock is lost — at the latest at its fence time, before its validity ends.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use kube::runtime::reflector::ObjectRef;
use tokio::sync::{Notify, mpsc};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::engines::{Engines, QuorumLookup};
use super::leadership::Leadership;
use crate::api::DistributedLock;
use crate::redlock::{
    ExtendError, KeepAction, KeepPolicy, Lease, LossReason, OperationReport, next_keep_action,
};
use crate::telemetry::metrics::Metrics;

pub type LockRef = ObjectRef<DistributedLock>;

/// How often the keeper looks for due leases; extensions are planned a third into the validity, so a tick
/// of delay is harmless.
const TICK: Duration = Duration::from_millis(50);

pub struct HeldLock {
    pub lease: Lease,
    pub quorum: String,
    pub key: String,
    pub token: i64,
    pub policy: KeepPolicy,
    /// When the validity last written to status ends (status is refreshed before it runs out).
    pub status_valid_until: Option<Instant>,
    next_at: Instant,
    retrying: bool,
    in_flight: bool,
    last_failure: Option<OperationReport>,
    lost: Option<LossReason>,
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

pub struct Holdings {
    table: Mutex<HashMap<LockRef, HeldLock>>,
    /// Highest token this replica wrote per lock: the status cache may lag behind our own writes.
    tokens: Mutex<HashMap<LockRef, i64>>,
    batch_done: Notify,
    wake_reconciler: mpsc::UnboundedSender<LockRef>,
    metrics: Arc<Metrics>,
}

impl Holdings {
    pub fn new(metrics: Arc<Metrics>) -> (Arc<Self>, mpsc::UnboundedReceiver<LockRef>) {
        let (wake_reconciler, wakes) = mpsc::unbounded_channel();
        let holdings = Arc::new(Self {
            table: Mutex::new(HashMap::new()),
            tokens: Mutex::new(HashMap::new()),
            batch_done: Notify::new(),
            wake_reconciler,
            metrics,
        });
        (holdings, wakes)
    }

    fn table(&self) -> MutexGuard<'_, HashMap<LockRef, HeldLock>> {
        // Entries are replaced whole; a poisoned table is still consistent.
        self.table.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub fn insert(
        &self,
        lock: LockRef,
        lease: Lease,
        quorum: &str,
        key: &str,
        token: i64,
        policy: KeepPolicy,
    ) {
        self.note_token(&lock, token);
        let now = Instant::now();
        let next_at = match next_keep_action(now, lease.valid_until(), lease.validity(), false, &policy) {
            KeepAction::ExtendAt(at) => at,
            KeepAction::SignalLost => now,
        };
        let held = HeldLock {
            lease,
            quorum: quorum.to_owned(),
            key: key.to_owned(),
            token,
            policy,
            status_valid_until: None,
            next_at,
            retrying: false,
            in_flight: false,
            last_failure: None,
            lost: None,
            notified: false,
        };
        if self.table().insert(lock, held).is_none() {
            self.metrics.locks_held.inc();
        }
    }

    pub fn view(&self, lock: &LockRef) -> Option<HeldView> {
        let now = Instant::now();
        self.table().get(lock).map(|held| HeldView {
            lease: held.lease.clone(),
            quorum: held.quorum.clone(),
            key: held.key.clone(),
            token: held.token,
            lost: held.lost.clone(),
            status_due: status_due(held, now),
            last_failure: held.last_failure.clone(),
        })
    }

    /// Records that status now shows the validity of `lease`.
    pub fn status_written(&self, lock: &LockRef, valid_until: Instant) {
        if let Some(held) = self.table().get_mut(lock) {
            held.status_valid_until = Some(valid_until);
            held.notified = false;
        }
    }

    /// Takes the lock out of the table, once no extension of it is in flight (an extension landing after a
    /// release would re-create the key). The caller releases or forgets the returned lease.
    pub async fn remove(&self, lock: &LockRef) -> Option<Lease> {
        loop {
            let done = self.batch_done.notified();
            {
                let mut table = self.table();
                match table.get(lock) {
                    None => return None,
                    Some(held) if !held.in_flight => {
                        let held = table.remove(lock)?;
                        self.metrics.locks_held.dec();
                        return Some(held.lease);
                    }
                    Some(_) => {}
                }
            }
            done.await;
        }
    }

    /// Forgets every lock without releasing it (this replica stopped being the leader; the next one resumes).
    pub fn forget_all(&self) -> usize {
        let mut table = self.table();
        let count = table.len();
        table.clear();
        self.metrics.locks_held.set(0);
        count
    }

    pub fn len(&self) -> usize {
        self.table().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Asks the lock reconciler to look at `lock` now.
    pub fn wake(&self, lock: LockRef) {
        let _ = self.wake_reconciler.send(lock);
    }

    pub fn highest_token(&self, lock: &LockRef) -> i64 {
        let tokens = self
            .tokens
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        tokens.get(lock).copied().unwrap_or(0)
    }

    pub fn note_token(&self, lock: &LockRef, token: i64) {
        let mut tokens = self
            .tokens
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let entry = tokens.entry(lock.clone()).or_insert(token);
        *entry = (*entry).max(token);
    }

    /// Extends due leases until `stop`. Never releases anything: on shutdown or lost leadership the locks are
    /// left to the next active replica, which resumes them.
    pub async fn keep(
        self: Arc<Self>,
        engines: Arc<Engines>,
        leadership: Arc<Leadership>,
        stop: CancellationToken,
    ) {
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(TICK) => {}
            }
            if !leadership.is_leader() {
                if !self.is_empty() {
                    let dropped = self.forget_all();
                    tracing::warn!(
                        locks = dropped,
                        "not the active replica any more: stopped extending locks"
                    );
                }
                continue;
            }
            self.signal_fenced();
            let due = self.take_due();
            if due.is_empty() {
                continue;
            }
            let batches = due.into_iter().map(|(quorum, refs, leases)| {
                let lookup = engines.lookup(&quorum);
                let leadership = leadership.clone();
                let metrics = self.metrics.clone();
                async move {
                    let results = match lookup {
                        // Checked at the moment of the write: a replica that lost its lease sends nothing.
                        QuorumLookup::Ready(engine) if leadership.is_leader() => {
                            let started = Instant::now();
                            let results = engine.engine.extend_many(&leases).await;
                            metrics
                                .extend_batch_seconds
                                .observe(started.elapsed().as_secs_f64());
                            results
                        }
                        _ => leases
                            .iter()
                            .map(|_| {
                                Err(ExtendError::NoQuorum {
                                    report: OperationReport {
                                        nodes: Vec::new(),
                                        elapsed: Duration::ZERO,
                                        quorum: 0,
                                    },
                                })
                            })
                            .collect(),
                    };
                    (refs, results)
                }
            });
            let outcomes = futures::future::join_all(batches).await;
            for (refs, results) in outcomes {
                self.apply(refs, results);
            }
            self.batch_done.notify_waiters();
        }
    }

    /// Due leases grouped by quorum, marked in flight.
    fn take_due(&self) -> Vec<(String, Vec<LockRef>, Vec<Lease>)> {
        let now = Instant::now();
        let mut groups: HashMap<String, (Vec<LockRef>, Vec<Lease>)> = HashMap::new();
        for (lock, held) in self.table().iter_mut() {
            if held.lost.is_none() && held.next_at <= now {
                held.in_flight = true;
                self.metrics
                    .extend_lag_seconds
                    .observe(now.saturating_duration_since(held.next_at).as_secs_f64());
                let group = groups.entry(held.quorum.clone()).or_default();
                group.0.push(lock.clone());
                group.1.push(held.lease.clone());
            }
        }
        groups
            .into_iter()
            .map(|(quorum, (refs, leases))| (quorum, refs, leases))
            .collect()
    }

    fn apply(&self, refs: Vec<LockRef>, results: Vec<Result<Lease, ExtendError>>) {
        let now = Instant::now();
        let mut wake = Vec::new();
        {
            let mut table = self.table();
            for (lock, result) in refs.into_iter().zip(results) {
                // Removed while in flight: the reconciler is waiting to release it.
                let Some(held) = table.get_mut(&lock) else {
                    continue;
                };
                held.in_flight = false;
                match result {
                    Ok(lease) => {
                        self.metrics.extensions.inc();
                        held.lease = lease;
                        held.retrying = false;
                        held.last_failure = None;
                    }
                    Err(ExtendError::NoQuorum { report }) => {
                        held.retrying = true;
                        held.last_failure = Some(report);
                    }
                    Err(ExtendError::Lost { holder, .. }) => {
                        held.lost = Some(LossReason::TakenOver { holder })
                    }
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
                if held.lost.is_some() || (!held.notified && status_due(held, now)) {
                    if held.lost.is_some() {
                        self.metrics.locks_lost.inc();
                    }
                    held.notified = true;
                    wake.push(lock);
                }
            }
        }
        for lock in wake {
            let _ = self.wake_reconciler.send(lock);
        }
    }

    /// Locks whose fence time came while no extension succeeded (for instance every master timing out longer
    /// than a tick): their owner hears now, not when an extension finally gives up.
    fn signal_fenced(&self) {
        let now = Instant::now();
        let mut wake = Vec::new();
        for (lock, held) in self.table().iter_mut() {
            if held.lost.is_none()
                && !held.in_flight
                && next_keep_action(
                    now,
                    held.lease.valid_until(),
                    held.lease.validity(),
                    true,
                    &held.policy,
                ) == KeepAction::SignalLost
            {
                held.lost = Some(LossReason::NotExtended {
                    last_report: held.last_failure.clone(),
                });
                self.metrics.locks_lost.inc();
                held.notified = true;
                wake.push(lock.clone());
            }
        }
        for lock in wake {
            let _ = self.wake_reconciler.send(lock);
        }
    }
}

/// Status is refreshed when less than half a TTL is left of the validity it shows.
fn status_due(held: &HeldLock, now: Instant) -> bool {
    held.status_valid_until
        .is_none_or(|until| until.saturating_duration_since(now) < held.lease.ttl() / 2)
}
