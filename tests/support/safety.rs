//! A Jepsen-style safety checker for the engine: many clients (separate engines, separate connections, one
//! process so that one monotonic clock orders every event) contend for a few resources while a nemesis breaks
//! masters and the network; every grant's window is recorded and checked for overlaps.
//!
//! A window is what a holder claimed: from the moment it learned it holds the lock to the moment it stopped
//! claiming it (released, was told the lock is lost) or to the validity end the engine gave it, whichever comes
//! first. A paused holder claims until its validity end and, when it wakes after that, must not act.
//!
//! Every grant's fencing token is recorded too, and checked to strictly increase per resource in grant order.
//! Clients propose above a per-resource *durable floor* (what the operator keeps in a lock's status), written a
//! little after each grant as a status write would be, so proposals are often stale and the masters' counters
//! must correct them.

use std::collections::HashMap;
use std::fmt;
use std::ops::Range;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rand::Rng;
use redlock_operator::redlock::{
    AcquireOptions, KeepPolicy, Lease, NodeOutcome, OperationReport, PERMIT_KEY_PREFIX, QUEUE_KEEP, Redlock,
    RedlockConfig, permit_key,
};
use tokio::time::Instant;

use super::fair_order::{Arrival, Inversion, find_order_inversions};
use super::fault_proxy::{Direction, FaultProxy};
use super::redis_server::{Options, RedisCluster};

/// A grant's window: from the moment its holder learned it holds the lock to the moment it stopped claiming it.
pub use super::history::Interval as Grant;
use super::history::{self, Repeats};
pub use super::history::{Overlap, TokenRegression, longest_unavailable};

pub mod scripted;

/// Every pair of windows on one resource that overlaps.
pub fn find_overlaps(grants: &[Grant]) -> Vec<Overlap> {
    history::find_overlaps(grants, 1)
}

/// Every grant, per resource in grant order, whose token does not exceed the highest granted before it.
pub fn find_token_regressions(grants: &[Grant]) -> Vec<TokenRegression> {
    history::find_token_regressions(grants, Repeats::Forbidden)
}

/// The resource a key belongs to: a semaphore's for a permit's key (`permit:<i>:<resource>`), the key itself
/// otherwise.
fn resource_of(key: &str) -> &str {
    key.strip_prefix(PERMIT_KEY_PREFIX)
        .and_then(|rest| rest.split_once(':'))
        .filter(|(permit, _)| !permit.is_empty() && permit.bytes().all(|b| b.is_ascii_digit()))
        .map_or(key, |(_, resource)| resource)
}

/// Per resource, the highest token a client has written as its durable floor (the operator's status token).
#[derive(Default)]
pub struct Floors {
    tokens: Mutex<HashMap<String, i64>>,
}

impl Floors {
    pub fn get(&self, resource: &str) -> i64 {
        let tokens = self.tokens.lock().unwrap_or_else(|e| e.into_inner());
        tokens.get(resource).copied().unwrap_or(0)
    }

    pub fn raise(&self, resource: &str, token: i64) {
        let mut tokens = self.tokens.lock().unwrap_or_else(|e| e.into_inner());
        let floor = tokens.entry(resource.to_owned()).or_default();
        *floor = (*floor).max(token);
    }
}

#[derive(Default)]
pub struct Recorder {
    grants: Mutex<Vec<Grant>>,
    arrivals: Mutex<Vec<Arrival>>,
    /// When each fault was thrown and healed.
    faults: Mutex<Vec<(Instant, Instant)>>,
    failed_attempts: AtomicU64,
    lost_signals: AtomicU64,
    stale_wakes: AtomicU64,
    acts: AtomicU64,
    nemesis_events: AtomicU64,
    /// Masters the nemesis restarted empty, and when.
    restarts: Mutex<Vec<(usize, Instant)>>,
}

impl Recorder {
    fn master_restarted(&self, index: usize) {
        self.restarts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((index, Instant::now()));
    }

    fn master_restarts(&self) -> Vec<(usize, Instant)> {
        self.restarts.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn grant(&self, grant: Grant) {
        self.grants.lock().unwrap_or_else(|e| e.into_inner()).push(grant);
    }

    pub fn grants(&self) -> Vec<Grant> {
        self.grants.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn arrival(&self, arrival: Arrival) {
        self.arrivals
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(arrival);
    }

    /// When each fault the nemesis threw began and ended.
    pub fn faults(&self) -> Vec<(Instant, Instant)> {
        self.faults.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn fault(&self, began: Instant, ended: Instant) {
        self.faults
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((began, ended));
    }

    /// The checks over every grant so far; `permits` holders of one resource may overlap (a semaphore's, each on
    /// a permit of its own), and tokens rise per permit.
    pub fn report(&self, resources: &[String], permits: u32, from: Instant, to: Instant) -> Report {
        let grants = self.grants();
        // Grants are recorded per key (a permit's, for a semaphore): tokens are checked per key, holders per
        // resource.
        let per_resource: Vec<Grant> = grants
            .iter()
            .map(|grant| Grant {
                resource: resource_of(&grant.resource).to_owned(),
                ..grant.clone()
            })
            .collect();
        let arrivals = self.arrivals.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let faults = self.faults.lock().unwrap_or_else(|e| e.into_inner()).clone();
        // A fault's effect on the queue lasts until the waiters it dropped have joined again.
        let (order_inversions, excused_inversions) =
            find_order_inversions(&arrivals, &faults, QUEUE_KEEP + Duration::from_secs(1));
        Report {
            fair_acquisitions: arrivals.len(),
            order_inversions,
            excused_inversions,
            overlaps: history::find_overlaps(&per_resource, permits.max(1) as usize),
            token_regressions: find_token_regressions(&grants),
            forgotten_token_regressions: Vec::new(),
            longest_unavailable: longest_unavailable(&per_resource, resources, from, to),
            grants: grants.len(),
            failed_attempts: self.failed_attempts.load(Ordering::Relaxed),
            lost_signals: self.lost_signals.load(Ordering::Relaxed),
            stale_wakes: self.stale_wakes.load(Ordering::Relaxed),
            acts: self.acts.load(Ordering::Relaxed),
            nemesis_events: self.nemesis_events.load(Ordering::Relaxed),
        }
    }
}

#[derive(Debug)]
pub struct Report {
    pub grants: usize,
    pub overlaps: Vec<Overlap>,
    pub token_regressions: Vec<TokenRegression>,
    /// Regressions the guarantees leave open (`forgotten`): reported, not failed.
    pub forgotten_token_regressions: Vec<TokenRegression>,
    pub failed_attempts: u64,
    pub lost_signals: u64,
    pub stale_wakes: u64,
    pub acts: u64,
    pub nemesis_events: u64,
    pub longest_unavailable: Duration,
    /// Fair mode: acquisitions made, waiters served after one that arrived later with no fault to excuse it,
    /// and such pairs a fault excused.
    pub fair_acquisitions: usize,
    pub order_inversions: Vec<Inversion>,
    pub excused_inversions: usize,
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "grants={} overlaps={} token_regressions={} failed_attempts={} lost_signals={} paused_holders_woken_late={} acts={} nemesis_events={} longest_unavailable_ms={}",
            self.grants,
            self.overlaps.len(),
            self.token_regressions.len(),
            self.failed_attempts,
            self.lost_signals,
            self.stale_wakes,
            self.acts,
            self.nemesis_events,
            self.longest_unavailable.as_millis()
        )?;
        for overlap in self.overlaps.iter().take(5) {
            write!(f, "\n  overlap: {overlap}")?;
        }
        if self.fair_acquisitions > 0 {
            write!(
                f,
                " fair_acquisitions={} order_inversions={} excused_by_faults={}",
                self.fair_acquisitions,
                self.order_inversions.len(),
                self.excused_inversions
            )?;
        }
        for regression in self.token_regressions.iter().take(5) {
            write!(f, "\n  token regression: {regression}")?;
        }
        for regression in self.forgotten_token_regressions.iter().take(3) {
            write!(
                f,
                "\n  token regression after a majority of masters restarted empty (a documented limit): {regression}"
            )?;
        }
        for inversion in self.order_inversions.iter().take(5) {
            write!(f, "\n  order inversion: {inversion}")?;
        }
        Ok(())
    }
}

/// What the clients do.
#[derive(Clone, Debug)]
pub struct Workload {
    pub clients: usize,
    pub resources: Vec<String>,
    pub ttl: Duration,
    /// How long a holder keeps the lock (kept alive by the engine's keeper when longer than a third of the TTL).
    pub hold: Range<Duration>,
    /// Share of grants whose holder is "paused" (stops, keeper included) for half a TTL to two TTLs.
    pub pause_probability: f64,
    /// Share of grants held for up to two TTLs, so that extensions happen under faults.
    pub long_hold_probability: f64,
    /// How long after a grant its token reaches the durable floor (`None`: clients keep no floor at all).
    pub floor_lag: Option<Range<Duration>>,
    /// Permits per resource: 1, a lock; N, a counting semaphore whose permits are each a key of their own.
    pub permits: u32,
    /// The negative control of semaphore mode: client 0 counts this many permits instead of `permits`.
    pub miscounted_permits: Option<u32>,
    /// Fair mode (issue 31): clients wait in the key's fair queue for up to this long instead of making a single
    /// attempt, and the order they are served in is checked.
    pub fair_wait: Option<Duration>,
    /// The negative control of fair mode: client 0 skips the queue.
    pub queue_skipper: bool,
}

impl Workload {
    pub fn resources(count: usize) -> Vec<String> {
        (0..count).map(|index| format!("resource-{index}")).collect()
    }

    /// The fair mode's workload: every client waits in the key's fair queue, on two keys so that queues form;
    /// with `queue_skipper`, client 0 skips the queue (the negative control).
    pub fn fair(queue_skipper: bool) -> Self {
        Self {
            clients: 8,
            resources: Self::resources(2),
            ttl: Duration::from_secs(1),
            hold: Duration::from_millis(1)..Duration::from_millis(30),
            pause_probability: 0.02,
            long_hold_probability: 0.05,
            floor_lag: Some(Duration::ZERO..Duration::from_millis(20)),
            permits: 1,
            miscounted_permits: None,
            fair_wait: Some(Duration::from_secs(10)),
            queue_skipper,
        }
    }
}

/// Runs `workload` against `urls` until `stop` says so. Each client has its own engine.
pub async fn run_clients(
    config: &RedlockConfig,
    workload: &Workload,
    recorder: Arc<Recorder>,
    stop: impl Fn(&Recorder) -> bool + Send + Sync + 'static,
) {
    let stop = Arc::new(stop);
    let floors = Arc::new(Floors::default());
    let mut tasks = Vec::new();
    for client in 0..workload.clients {
        let mut config = config.clone();
        config.skip_queue = workload.queue_skipper && client == 0;
        let engine = match Redlock::connect(config).await {
            Ok(engine) => engine,
            Err(err) => panic!("client {client}: {err}"),
        };
        let workload = workload.clone();
        let recorder = recorder.clone();
        let stop = stop.clone();
        let floors = floors.clone();
        tasks.push(tokio::spawn(async move {
            let name = format!("client-{client}");
            while !stop(&recorder) {
                one_turn(&engine, &name, &workload, &recorder, &floors).await;
            }
        }));
    }
    for task in tasks {
        if let Err(err) = task.await {
            panic!("client task failed: {err}");
        }
    }
}

async fn one_turn(
    engine: &Redlock,
    name: &str,
    workload: &Workload,
    recorder: &Recorder,
    floors: &Arc<Floors>,
) {
    let (resource, hold, pause, long) = {
        let mut rng = rand::rng();
        let resource = workload.resources[rng.random_range(0..workload.resources.len())].clone();
        let hold = if workload.hold.is_empty() {
            workload.hold.start
        } else {
            rng.random_range(workload.hold.clone())
        };
        (
            resource,
            hold,
            rng.random_bool(workload.pause_probability),
            rng.random_bool(workload.long_hold_probability),
        )
    };
    // A client that miscounts acts on a semaphore of more permits than the others: the control the checker
    // must catch.
    let permits = match workload.miscounted_permits {
        Some(wrong) if name == "client-0" => wrong,
        _ => workload.permits,
    };
    // One floor for every permit (the engine's semaphore takes one): the highest of their floors, so that each
    // permit's proposal is above its own.
    let floor = (0..permits.max(1))
        .map(|permit| floors.get(&permit_key(&resource, permit)))
        .max()
        .unwrap_or(0);
    let once = AcquireOptions {
        attempts: Some(1),
        deadline: None,
        token_floor: workload.floor_lag.as_ref().map_or(0, |_| floor),
        fair: false,
    };
    let acquired = if permits > 1 {
        engine
            .acquire_permit(&resource, permits, workload.ttl, name, once)
            .await
    } else if let Some(wait) = workload.fair_wait {
        wait_fairly(
            engine,
            &resource,
            name,
            workload.ttl,
            once.token_floor,
            wait,
            recorder,
        )
        .await
    } else {
        engine.acquire(&resource, workload.ttl, name, once).await
    };
    let lease = match acquired {
        Ok(lease) => lease,
        Err(_) => {
            recorder.failed_attempts.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(rand::random_range(1..20))).await;
            return;
        }
    };
    let start = Instant::now();
    let token = lease.fencing_token();
    // The key held: the resource's own, or one of its permits' (whose tokens are its own sequence).
    let resource = lease.resource().to_owned();
    if let Some(lag) = &workload.floor_lag {
        let lag = if lag.is_empty() {
            lag.start
        } else {
            rand::rng().random_range(lag.clone())
        };
        let (floors, resource) = (floors.clone(), resource.clone());
        tokio::spawn(async move {
            tokio::time::sleep(lag).await;
            floors.raise(&resource, token);
        });
    }
    let acquired = format!("acquired token {token}: {}", lease.report());
    if pause {
        // A stopped process: no keeper, no checks. It claims the lock until its validity ends.
        let claimed_until = lease.valid_until();
        let nap = workload.ttl.mul_f64(rand::random_range(0.5..2.0));
        tokio::time::sleep(nap).await;
        let woke = Instant::now();
        let end = if woke < claimed_until {
            recorder.acts.fetch_add(1, Ordering::Relaxed);
            woke
        } else {
            // Woke after its validity: it must not act, and does not.
            recorder.stale_wakes.fetch_add(1, Ordering::Relaxed);
            claimed_until
        };
        recorder.grant(Grant {
            resource,
            client: name.to_owned(),
            start,
            end: end.min(claimed_until),
            token,
            evidence: format!("paused; {acquired}"),
        });
        engine.release(&lease).await;
        return;
    }
    let hold = if long {
        workload.ttl.mul_f64(rand::random_range(0.5..2.0))
    } else {
        hold
    };
    let kept = engine.keep(
        lease,
        KeepPolicy::for_ttl(workload.ttl, engine.config().node_timeout),
    );
    let lost = kept.lost_token();
    let until = start + hold;
    let mut end;
    loop {
        // Act only while the lock is ours and valid; the act itself is instantaneous here.
        let now = Instant::now();
        let valid_until = kept.state().lease.valid_until();
        end = now.min(valid_until);
        if lost.is_cancelled() || now >= valid_until {
            recorder.lost_signals.fetch_add(1, Ordering::Relaxed);
            break;
        }
        recorder.acts.fetch_add(1, Ordering::Relaxed);
        if now >= until {
            break;
        }
        tokio::select! {
            () = tokio::time::sleep(Duration::from_millis(rand::random_range(1..10))) => {}
            () = lost.cancelled() => {}
        }
    }
    let state = kept.state();
    let last = if state.extensions > 0 {
        format!(
            "; {} extensions, the last granted at {:?} valid until {:?}: {}",
            state.extensions,
            state.lease.granted_at(),
            state.lease.valid_until(),
            state.lease.report()
        )
    } else {
        String::new()
    };
    recorder.grant(Grant {
        resource,
        client: name.to_owned(),
        start,
        end,
        token,
        evidence: format!("{acquired}{last}"),
    });
    kept.release().await;
}

/// A fair acquisition of `resource`, waiting up to `wait`, recorded as an [`Arrival`]: queued once a majority of
/// masters answered with the queue and one ticket.
async fn wait_fairly(
    engine: &Redlock,
    resource: &str,
    name: &str,
    ttl: Duration,
    token_floor: i64,
    wait: Duration,
    recorder: &Recorder,
) -> Result<Lease, redlock_operator::redlock::AcquireError> {
    let asked = Instant::now();
    let mut queued = None;
    let options = AcquireOptions {
        attempts: None,
        deadline: Some(asked + wait),
        token_floor,
        fair: true,
    };
    let acquired = engine
        .acquire_reporting(resource, ttl, name, options, |refused| {
            if queued.is_none() && refused.report().is_some_and(queued_at_a_majority) {
                queued = Some(Instant::now());
            }
        })
        .await;
    recorder.arrival(Arrival {
        resource: resource.to_owned(),
        client: name.to_owned(),
        asked,
        queued,
        granted: acquired.as_ref().ok().map(|_| Instant::now()),
    });
    acquired
}

/// Whether a majority of masters answered with the queue, all with the ticket the waiter keeps.
pub fn queued_at_a_majority(report: &OperationReport) -> bool {
    let queued = report
        .nodes
        .iter()
        .filter(|node| matches!(node.outcome, NodeOutcome::Queued { .. }))
        .count();
    queued >= report.quorum && report.queue_place().is_some_and(|place| place.settled)
}

/// Masters behind fault proxies, and the faults to throw at them.
pub struct Nemesis {
    pub cluster: RedisCluster,
    pub proxies: Vec<FaultProxy>,
}

impl Nemesis {
    pub async fn start(masters: usize) -> std::io::Result<Self> {
        let cluster = RedisCluster::start(masters)?;
        let mut proxies = Vec::new();
        for server in cluster.servers() {
            proxies.push(FaultProxy::start(server.addr()).await?);
        }
        Ok(Self { cluster, proxies })
    }

    pub fn urls(&self) -> Vec<String> {
        self.proxies.iter().map(FaultProxy::url).collect()
    }

    /// Throws random faults until `stop`, one at a time, each lasting up to `longest`; heals everything at the
    /// end. Counts every fault in `recorder`.
    pub async fn run(
        &mut self,
        recorder: &Recorder,
        longest: Duration,
        progress: Option<Duration>,
        stop: impl Fn() -> bool,
    ) {
        let count = self.cluster.len();
        let started = Instant::now();
        let mut next_progress = progress.map(|every| started + every);
        while !stop() {
            if let (Some(due), Some(every)) = (next_progress, progress)
                && Instant::now() >= due
            {
                let grants = recorder.grants();
                println!(
                    "  … {:.0}s: {} grants, {} overlaps so far, {} nemesis events",
                    started.elapsed().as_secs_f64(),
                    grants.len(),
                    find_overlaps(&grants).len(),
                    recorder.nemesis_events.load(Ordering::Relaxed)
                );
                next_progress = Some(due + every);
            }
            let (kind, targets, duration, direction) = {
                let mut rng = rand::rng();
                let kind = rng.random_range(0..8);
                let how_many = if rng.random_bool(0.25) {
                    count / 2 + 1
                } else {
                    rng.random_range(1..=count / 2)
                };
                let mut targets: Vec<usize> = (0..count).collect();
                for index in (1..targets.len()).rev() {
                    targets.swap(index, rng.random_range(0..=index));
                }
                targets.truncate(how_many);
                let direction = match rng.random_range(0..3) {
                    0 => Direction::ClientToServer,
                    1 => Direction::ServerToClient,
                    _ => Direction::Both,
                };
                let duration = longest.mul_f64(rng.random_range(0.1..1.0));
                (kind, targets, duration, direction)
            };
            recorder.nemesis_events.fetch_add(1, Ordering::Relaxed);
            let began = Instant::now();
            if std::env::var_os("SAFETY_LOG").is_some() {
                eprintln!(
                    "{:?} nemesis kind={kind} targets={targets:?} for {duration:?} {direction:?}",
                    Instant::now()
                );
            }
            match kind {
                0 | 1 => {
                    for &index in &targets {
                        // Restarted empty: every lock it held is forgotten.
                        let _ = self.cluster[index].restart();
                        recorder.master_restarted(index);
                    }
                }
                2 | 3 => {
                    for &index in &targets {
                        self.cluster[index].stop();
                    }
                    tokio::time::sleep(duration).await;
                    for &index in &targets {
                        self.cluster[index].cont();
                    }
                }
                4 | 5 => {
                    for &index in &targets {
                        self.proxies[index].hold(direction, true);
                    }
                    tokio::time::sleep(duration).await;
                    for &index in &targets {
                        self.proxies[index].hold(direction, false);
                    }
                }
                6 => {
                    let latency = Duration::from_millis(rand::random_range(5..60));
                    for &index in &targets {
                        self.proxies[index].set_latency(direction, latency);
                    }
                    tokio::time::sleep(duration).await;
                    for &index in &targets {
                        self.proxies[index].set_latency(Direction::Both, Duration::ZERO);
                    }
                }
                _ => {
                    for &index in &targets {
                        self.proxies[index].cut_all();
                    }
                }
            }
            recorder.fault(began, Instant::now());
            tokio::time::sleep(Duration::from_millis(rand::random_range(50..400))).await;
        }
        for index in 0..count {
            self.cluster[index].cont();
            self.proxies[index].heal();
        }
    }
}

/// Random faults against `workload` until `done` says so; returns the checked history.
pub async fn random_run(
    workload: Workload,
    node_timeout: Duration,
    longest_fault: Duration,
    progress: Option<Duration>,
    done: impl Fn(&Recorder, Duration) -> bool + Send + Sync + Clone + 'static,
) -> Report {
    let mut nemesis = Nemesis::start(5).await.expect("masters and proxies");
    let mut config = RedlockConfig::from_urls(&nemesis.urls()).expect("config");
    config.max_ttl = workload.ttl;
    config.node_timeout = node_timeout;
    // Fresh masters are in quarantine for max-ttl (uptime is reported in whole seconds).
    tokio::time::sleep(workload.ttl + Duration::from_secs(1)).await;
    let recorder = Arc::new(Recorder::default());
    let started = Instant::now();
    let clients = {
        let recorder = recorder.clone();
        let done = done.clone();
        let workload = workload.clone();
        tokio::spawn(async move {
            run_clients(&config, &workload, recorder, move |recorder| {
                done(recorder, started.elapsed())
            })
            .await
        })
    };
    let stop = || done(&recorder, started.elapsed());
    nemesis.run(&recorder, longest_fault, progress, stop).await;
    clients.await.expect("clients");
    let mut report = recorder.report(&workload.resources, workload.permits, started, Instant::now());
    // A restarted master sits out its quarantine (max-ttl, counted in whole seconds of uptime) before it votes.
    let quarantine = workload.ttl + Duration::from_secs(1);
    let (restarts, faults) = (recorder.master_restarts(), recorder.faults());
    let (forgotten_ones, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut report.token_regressions)
        .into_iter()
        .partition(|regression| forgotten(regression, (&restarts, &faults), (5, quarantine)));
    report.token_regressions = kept;
    report.forgotten_token_regressions = forgotten_ones;
    report
}

/// A master restarted empty, and when.
type Restart = (usize, Instant);
/// When a fault was thrown and healed.
type FaultWindow = (Instant, Instant);

/// How long before a grant a fault counts as one its acquisition met: its counter wait and a retry's.
const ACQUISITION_WINDOW: Duration = Duration::from_secs(1);

/// Whether a regression is the one the guarantees leave open for the engine, which keeps no floor (the `lock`
/// command's case, docs/explanation/guarantees-and-limits.md): a majority of the `masters` restarted empty after
/// the earlier grant, or shortly before it (still quarantined when it was granted, so never written by it), and
/// before the later one; and the later acquisition met a fault (the nemesis throws one at a time: the masters that
/// remember hung, cut off or slowed through its counter wait). (A master quarantined at the grant may have learned
/// the token from an extension's repair since: counting it as forgetful can excuse a regression the guarantees
/// would not, never the other way; the product checker's rule is the same.)
fn forgotten(
    regression: &TokenRegression,
    (restarts, faults): (&[Restart], &[FaultWindow]),
    (masters, quarantine): (usize, Duration),
) -> bool {
    let (earlier, later) = (&regression.earlier, &regression.later);
    let since = earlier.start.checked_sub(quarantine).unwrap_or(earlier.start);
    let forgetful: std::collections::BTreeSet<usize> = restarts
        .iter()
        .filter(|(_, at)| *at >= since && *at <= later.start)
        .map(|(master, _)| *master)
        .collect();
    let acquiring_from = later.start.checked_sub(ACQUISITION_WINDOW).unwrap_or(later.start);
    let met_a_fault = faults
        .iter()
        .any(|(began, ended)| *began <= later.start && *ended >= acquiring_from);
    forgetful.len() > masters / 2 && met_a_fault
}
