//! The locks this replica holds, kept extended by ONE task: every tick it takes the leases that are due from the
//! [`table`], extends them per quorum as one batch (one pipeline per master, see `Redlock::extend_many`), and
//! wakes the lock reconciler at once when a lock is lost — at the latest at its fence time, before its validity
//! ends.

pub mod table;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{Notify, mpsc};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use self::table::{Applied, DueBatch, Removal, Table};
pub use self::table::{HeldView, Holding, LockRef};
use super::engines::{Engines, QuorumLookup};
use super::replica_lease::Leadership;
use crate::redlock::{ExtendError, Lease, OperationReport};
use crate::telemetry::metrics::Metrics;

/// How often the keeper looks for due leases; extensions are planned a third into the validity, so a tick
/// of delay is harmless.
const TICK: Duration = Duration::from_millis(50);

pub struct Keeper {
    table: Mutex<Table>,
    /// Highest token this replica wrote per lock: the status cache may lag behind our own writes.
    tokens: Mutex<HashMap<LockRef, i64>>,
    batch_done: Notify,
    wake_reconciler: mpsc::UnboundedSender<LockRef>,
    metrics: Arc<Metrics>,
}

impl Keeper {
    pub fn new(metrics: Arc<Metrics>) -> (Arc<Self>, mpsc::UnboundedReceiver<LockRef>) {
        let (wake_reconciler, wakes) = mpsc::unbounded_channel();
        let keeper = Arc::new(Self {
            table: Mutex::new(Table::default()),
            tokens: Mutex::new(HashMap::new()),
            batch_done: Notify::new(),
            wake_reconciler,
            metrics,
        });
        (keeper, wakes)
    }

    fn table(&self) -> MutexGuard<'_, Table> {
        // Entries are replaced whole; a poisoned table is still consistent.
        self.table.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn tokens(&self) -> MutexGuard<'_, HashMap<LockRef, i64>> {
        self.tokens
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Keeps `lease` extended from now on.
    pub fn insert(&self, lock: LockRef, lease: Lease, holding: Holding) {
        self.note_token(&lock, holding.token);
        if self.table().insert(lock, lease, holding, Instant::now()) {
            self.metrics.locks_held.inc();
        }
    }

    pub fn view(&self, lock: &LockRef) -> Option<HeldView> {
        self.table().view(lock, Instant::now())
    }

    /// Records that status now shows the validity ending at `valid_until`.
    pub fn status_written(&self, lock: &LockRef, valid_until: Instant) {
        self.table().status_written(lock, valid_until);
    }

    /// Takes the lock out of the table, once no extension of it is in flight (an extension landing after a
    /// release would re-create the key). The caller releases or forgets the returned lease.
    pub async fn remove(&self, lock: &LockRef) -> Option<Lease> {
        loop {
            let done = self.batch_done.notified();
            match self.table().remove(lock) {
                Removal::Absent => return None,
                Removal::Removed(lease) => {
                    self.metrics.locks_held.dec();
                    return Some(lease);
                }
                Removal::InFlight => {}
            }
            done.await;
        }
    }

    /// Forgets every lock without releasing it (this replica stopped being the leader; the next one resumes).
    pub fn forget_all(&self) -> usize {
        let count = self.table().clear();
        self.metrics.locks_held.set(0);
        count
    }

    pub fn len(&self) -> usize {
        self.table().len()
    }

    pub fn is_empty(&self) -> bool {
        self.table().is_empty()
    }

    /// Asks the lock reconciler to look at `lock` now.
    pub fn wake(&self, lock: LockRef) {
        let _ = self.wake_reconciler.send(lock);
    }

    pub fn highest_token(&self, lock: &LockRef) -> i64 {
        self.tokens().get(lock).copied().unwrap_or(0)
    }

    pub fn note_token(&self, lock: &LockRef, token: i64) {
        let mut tokens = self.tokens();
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
            self.tick(&engines, &leadership).await;
        }
    }

    /// One round: signal what reached its fence time, then extend what is due, one batch per quorum at once.
    async fn tick(&self, engines: &Engines, leadership: &Leadership) {
        let now = Instant::now();
        let fenced = self.table().signal_fenced(now);
        self.metrics.locks_lost.inc_by(fenced.len() as u64);
        for lock in fenced {
            self.wake(lock);
        }
        let (due, lags) = self.table().take_due(now);
        for lag in lags {
            self.metrics.extend_lag_seconds.observe(lag.as_secs_f64());
        }
        if due.is_empty() {
            return;
        }
        let batches = due
            .into_iter()
            .map(|batch| self.extend(engines.lookup(&batch.quorum), batch, leadership));
        for (locks, results) in futures::future::join_all(batches).await {
            let applied = self.table().apply(locks, results, Instant::now());
            self.report(applied);
        }
        self.batch_done.notify_waiters();
    }

    async fn extend(
        &self,
        lookup: QuorumLookup,
        batch: DueBatch,
        leadership: &Leadership,
    ) -> (Vec<LockRef>, Vec<Result<Lease, ExtendError>>) {
        let results = match lookup {
            // Checked at the moment of the write: a replica that lost its lease sends nothing.
            QuorumLookup::Ready(engine) if leadership.is_leader() => {
                let started = Instant::now();
                let results = engine.engine.extend_many(&batch.leases).await;
                self.metrics
                    .extend_batch_seconds
                    .observe(started.elapsed().as_secs_f64());
                results
            }
            _ => batch
                .leases
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
        (batch.locks, results)
    }

    fn report(&self, applied: Applied) {
        self.metrics.extensions.inc_by(applied.extended);
        self.metrics.locks_lost.inc_by(applied.lost);
        for lock in applied.wake {
            self.wake(lock);
        }
    }
}
