//! The locks this replica holds, kept extended: every tick one task takes the leases that are due from the
//! [`table`] and starts one batch per quorum (one pipeline per master, see `Redlock::extend_many`), at most one
//! in flight per quorum, so a quorum with hung masters delays only its own locks; and it wakes the lock
//! reconciler at once when a lock is lost — at the latest at its fence time, before its validity ends.

mod refs;
mod retiring;
pub mod table;
mod waiting;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{Notify, mpsc};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

pub use self::retiring::Retiring;
use self::table::{Applied, DueBatch, Removal, Table};
pub use self::table::{HeldValidity, HeldView, Holding, LockRef, PermitRef};
use super::engines::{Engines, QuorumLookup};
use super::replica_lease::Leadership;
use crate::redlock::{ExtendError, Lease, OperationReport};
use crate::telemetry::metrics::Metrics;

/// How often the keeper looks for due leases; extensions are planned a third into the validity, so a tick
/// of delay is harmless.
const TICK: Duration = Duration::from_millis(50);

pub struct Keeper {
    table: Mutex<Table>,
    /// Highest token this replica wrote per lock and permit: the status cache may lag behind our own writes.
    tokens: Mutex<HashMap<LockRef, HashMap<u32, i64>>>,
    /// Keys given up and waiting for the validity shown to their holder to end before they are released.
    retiring: Mutex<HashMap<PermitRef, Retiring>>,
    batch_done: Notify,
    /// Notified whenever a held lock is found lost, so that a reconcile busy reading the API server can stop and
    /// fence first.
    losses: Notify,
    wake_reconciler: mpsc::UnboundedSender<LockRef>,
    metrics: Arc<Metrics>,
    /// Lock values are shared with the other replicas: a successor can stop this replica's extensions by
    /// releasing or re-granting, so extending while leadership is unconfirmed is safe.
    extend_when_unconfirmed: bool,
}

/// How the keeper may extend in one round.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// The active replica: extensions repair masters that lost a key.
    Active,
    /// Leadership lapsed without a successor in sight (the API server does not answer): compare-and-extend only.
    Unconfirmed,
}

impl Keeper {
    /// `extend_when_unconfirmed`: whether lock values are shared by the replicas (an installation secret).
    pub fn new(
        metrics: Arc<Metrics>,
        extend_when_unconfirmed: bool,
    ) -> (Arc<Self>, mpsc::UnboundedReceiver<LockRef>) {
        let (wake_reconciler, wakes) = mpsc::unbounded_channel();
        let keeper = Arc::new(Self {
            table: Mutex::new(Table::default()),
            tokens: Mutex::new(HashMap::new()),
            retiring: Mutex::new(HashMap::new()),
            batch_done: Notify::new(),
            losses: Notify::new(),
            wake_reconciler,
            metrics,
            extend_when_unconfirmed,
        });
        (keeper, wakes)
    }

    fn table(&self) -> MutexGuard<'_, Table> {
        // Entries are replaced whole; a poisoned table is still consistent.
        self.table.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn tokens(&self) -> MutexGuard<'_, HashMap<LockRef, HashMap<u32, i64>>> {
        self.tokens
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn retiring_table(&self) -> MutexGuard<'_, HashMap<PermitRef, Retiring>> {
        self.retiring
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Remembers a key to release at its `release_at` (replacing an earlier one of the same permit: that one's
    /// holder was shown no later validity, and the reconciler settles it first).
    pub fn retire(&self, lock: impl Into<PermitRef>, retiring: Retiring) {
        self.retiring_table().insert(lock.into(), retiring);
    }

    /// The key of `lock` (a permit of it) waiting to be released, if any.
    pub fn retiring(&self, lock: impl Into<PermitRef>) -> Option<Retiring> {
        self.retiring_table().get(&lock.into()).cloned()
    }

    /// Takes the key waiting to be released out, to release it now.
    pub fn take_retiring(&self, lock: impl Into<PermitRef>) -> Option<Retiring> {
        self.retiring_table().remove(&lock.into())
    }

    /// Keeps `lease` extended from now on. Every method naming a lock takes a permit of it, or a bare
    /// [`LockRef`] for its permit 0 (a plain lock): each permit is kept, extended and fenced on its own.
    pub fn insert(&self, lock: impl Into<PermitRef>, lease: Lease, holding: Holding) {
        let permit = lock.into();
        self.note_token(&permit, holding.token);
        if self.table().insert(permit, lease, holding, Instant::now()) {
            self.metrics.locks_held.inc();
        }
    }

    pub fn view(&self, lock: impl Into<PermitRef>) -> Option<HeldView> {
        self.table().view(&lock.into(), Instant::now())
    }

    /// What a holder may be told of the grant kept for `lock`: a lookup, nothing copied but four numbers.
    pub fn validity(&self, lock: &PermitRef) -> Option<HeldValidity> {
        self.table().validity(lock)
    }

    /// Whether the lock is held here and found lost (taken over, or not extended in time).
    pub fn is_lost(&self, lock: &PermitRef) -> bool {
        self.table().is_lost(lock)
    }

    /// Completes at the next loss of any held lock found after this call (its creation, not its first poll,
    /// starts the watch: take it before looking at `is_lost`, so that a loss in between is not missed).
    pub fn loss_found(&self) -> tokio::sync::futures::Notified<'_> {
        self.losses.notified()
    }

    /// Records that status now shows the validity ending at `valid_until`.
    pub fn status_written(&self, lock: impl Into<PermitRef>, valid_until: Instant) {
        self.table().status_written(&lock.into(), valid_until);
    }

    /// Takes the lock out of the table, once no extension of it is in flight (an extension landing after a
    /// release would re-create the key). The caller releases or forgets the returned lease.
    pub async fn remove(&self, lock: impl Into<PermitRef>) -> Option<Lease> {
        let permit = lock.into();
        loop {
            let done = self.batch_done.notified();
            match self.table().remove(&permit) {
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
        // Not released by this replica either: their keys expire on their own, never before the validity shown.
        self.retiring_table().clear();
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

    pub fn highest_token(&self, lock: impl Into<PermitRef>) -> i64 {
        let permit = lock.into();
        self.tokens()
            .get(&permit.lock)
            .and_then(|permits| permits.get(&permit.permit))
            .copied()
            .unwrap_or(0)
    }

    /// The lock is gone: the highest token of each of its permits lives on in that permit key's floor record,
    /// not here.
    pub fn forget_token(&self, lock: &LockRef) {
        self.tokens().remove(lock);
    }

    pub fn note_token(&self, lock: impl Into<PermitRef>, token: i64) {
        let permit = lock.into();
        let mut tokens = self.tokens();
        let entry = tokens
            .entry(permit.lock)
            .or_default()
            .entry(permit.permit)
            .or_insert(token);
        *entry = (*entry).max(token);
    }

    /// Extends due leases until `stop`. Never releases anything: on shutdown or lost leadership the locks are
    /// left to the next active replica, which resumes them. While leadership cannot be confirmed and no other
    /// replica is seen active, the locks already held are extended on (compare-and-extend only): they live in
    /// Redis and must not lapse with the API server.
    pub async fn keep(
        self: Arc<Self>,
        engines: Arc<Engines>,
        leadership: Arc<Leadership>,
        stop: CancellationToken,
    ) {
        let mut last_mode = None;
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(TICK) => {}
            }
            let mode = self.mode(&leadership);
            if mode != last_mode {
                self.log_mode(mode);
                last_mode = mode;
            }
            match mode {
                Some(mode) => self.tick(&engines, &leadership, mode),
                None if !self.is_empty() => {
                    self.forget_all();
                }
                None => {}
            }
        }
    }

    fn mode(&self, leadership: &Leadership) -> Option<Mode> {
        if leadership.is_leader() {
            Some(Mode::Active)
        } else if self.extend_when_unconfirmed && leadership.may_extend_held() {
            Some(Mode::Unconfirmed)
        } else {
            None
        }
    }

    fn log_mode(&self, mode: Option<Mode>) {
        let held = self.len();
        match mode {
            Some(Mode::Active) => tracing::info!(locks = held, "active replica: extending held locks"),
            Some(Mode::Unconfirmed) => tracing::warn!(
                locks = held,
                "cannot confirm leadership and no other replica is seen active: extending the locks already held (compare-and-extend only: no repair, no new acquisition, release or API write) until the API server answers again, an extension fails or another replica takes over"
            ),
            None if held > 0 => tracing::warn!(
                locks = held,
                "not the active replica any more: stopped extending locks; the active replica resumes them"
            ),
            None => {}
        }
    }

    /// One round: signal what reached its fence time, then start one batch per quorum that has none in flight.
    /// The batches run on their own: a quorum whose masters hang holds up neither the next round nor another
    /// quorum's extensions and loss signals.
    fn tick(self: &Arc<Self>, engines: &Arc<Engines>, leadership: &Arc<Leadership>, mode: Mode) {
        let now = Instant::now();
        let fenced = self.table().signal_fenced(now);
        self.metrics.locks_lost.inc_by(fenced.len() as u64);
        if !fenced.is_empty() {
            self.losses.notify_waiters();
        }
        for permit in fenced {
            tracing::debug!(lock = %permit.lock, permit = permit.permit, "fence time reached: the reconciler is woken");
            self.wake(permit.lock);
        }
        let (due, lags) = self.table().take_due(now);
        for lag in lags {
            self.metrics.extend_lag_seconds.observe(lag.as_secs_f64());
        }
        for batch in due {
            let keeper = Arc::clone(self);
            let engines = Arc::clone(engines);
            let leadership = Arc::clone(leadership);
            // Every line a batch logs (a lost lock, a failed round) says which quorum's batch it came from.
            let span =
                tracing::info_span!("extend_batch", quorum = %batch.quorum, leases = batch.leases.len());
            tokio::spawn(tracing::Instrument::instrument(
                async move {
                    let quorum = batch.quorum.clone();
                    let (locks, results) = keeper
                        .extend(engines.lookup(&quorum), batch, &leadership, mode)
                        .await;
                    let applied = keeper.table().apply(&quorum, locks, results, Instant::now());
                    keeper.report(applied);
                    keeper.batch_done.notify_waiters();
                },
                span,
            ));
        }
    }

    async fn extend(
        &self,
        lookup: QuorumLookup,
        batch: DueBatch,
        leadership: &Leadership,
        mode: Mode,
    ) -> (Vec<PermitRef>, Vec<Result<Lease, ExtendError>>) {
        // Checked at the moment of the write: a replica that saw a successor sends nothing, one that cannot confirm
        // its leadership only compares and extends.
        let repair = mode == Mode::Active && leadership.is_leader();
        let results = match lookup {
            QuorumLookup::Ready(engine) if repair || leadership.may_extend_held() => {
                let started = Instant::now();
                let results = if repair {
                    engine.engine.extend_many(&batch.leases).await
                } else {
                    engine.engine.extend_many_without_repair(&batch.leases).await
                };
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
        if applied.lost > 0 {
            self.losses.notify_waiters();
        }
        for permit in applied.wake {
            tracing::debug!(lock = %permit.lock, permit = permit.permit, "after an extension round: the reconciler is woken");
            self.wake(permit.lock);
        }
    }
}
