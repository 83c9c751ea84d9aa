//! What the holders' asks cost the operator (issues 48 and 55): `elect` and the Job guard ask the active replica
//! how long their grant stays valid (`POST /v1/validity` on the reports port) instead of reading status's
//! `validUntil` on their wall clock. For each size N (`OPERATOR_BENCH_ASK_LOCKS`, comma-separated, default
//! `200,10000`), on a fresh operator, masters and API server, the real binary holds N identity locks (ttl 10s), and
//! three windows of `OPERATOR_BENCH_ASK_SECONDS` (20) are measured:
//! - base: nobody asks (the holders as before issue 48 cost the operator nothing);
//! - kept: a holder per lock runs the holders' own code, `cli::term::current_term` then `cli::term::watch_term`
//!   (`elect`'s loop), which asks when it starts a term and again when half of the time left to its stop time
//!   has passed (`cli::stop_time::after_ask`), through `stop_time::asking_with` and a `Caller` of its own, as each
//!   holder process has its own: the connection kept between asks (HTTP/1.1 kept alive);
//! - per ask, the baseline in the same run: the same holders, a connection per ask (their TLS session resumed),
//!   as holders asked before they kept their connection.
//!
//! Each holder connects from a loopback address of its own (127.10.x.y), as each pod has its own IP: the port's
//! bound of 8 connections per source address applies per holder, as in a cluster. The terms come from one watch
//! on the locks, fanned out to the holders as `cli::term::follow` would give them, so that the bench's API server
//! is not loaded by N watches. The holders start spread over a TTL, then a status cycle or two passes before the
//! window. `OPERATOR_BENCH_OPERATOR_CPUS` puts the operator on cores of its own (see the operator bench's header).
//!
//! Per size and window it prints the asks the replica answered (each counted as it was answered: valid, unknown,
//! or failed with no answer), per second in all and per held lock, beside the rate the holders' schedule gives on
//! paper ([`scheduled_per_lock`]); the operator's CPU (utime + stime from /proc, in % of one core) and its ratio to
//! the base window; the asks' latency p50/p99 (a reconnection's handshake included); the operator's CPU per ask;
//! the holders that stopped their work though status still showed their term (an ask answered too late); the
//! locks lost in each window; and the bench process's own cores (the holders' side of every ask, the API server
//! and the watches). Where the bench could not ask as often as the schedule says, it says so. It ends with a
//! table, `SUMMARY_ASKS locks=N …` per size for the kept connections (the fields as before; `waited_*` are 0
//! since no holder waits for a turn any more), `SUMMARY_ASKS_PER_ASK` with the same fields for the baseline, and
//! `RATIO_ASKS locks=N cpu_kept_over_per_ask=X cpu_ms_per_ask_kept=X cpu_ms_per_ask_per_ask=X`.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::TryStreamExt;
use kube::Api;
use kube::runtime::watcher;
use redlock_operator::api::DistributedLock;
use redlock_operator::cli::stop_time::{
    Ask, Asked, DRIFT_FACTOR, HolderClock, Stopping, after_ask, asking_with,
};
use redlock_operator::cli::term::{Term, current_term, term_of, watch_term};
use redlock_operator::report_channel::client::Caller;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{
    BoxError, cores_over, cpu_seconds, metric, metrics_text, patience, settled_identity_locks, single_lock,
};

/// The locks' TTL, as in the rest of the operator bench.
pub(super) const TTL: Duration = Duration::from_secs(10);
/// `elect`'s and the guard's default `--fence-margin` and `--max-clock-skew`.
const MARGIN: Duration = Duration::from_secs(1);
const MAX_CLOCK_SKEW: Duration = Duration::from_secs(1);
/// The holders start over this long.
pub(super) const START_SPREAD: Duration = TTL;

/// The sizes to run: `OPERATOR_BENCH_ASK_LOCKS`, comma-separated (`0` or empty: none).
pub fn sizes() -> Vec<usize> {
    std::env::var("OPERATOR_BENCH_ASK_LOCKS")
        .unwrap_or_else(|_| "200,10000".to_owned())
        .split(',')
        .filter_map(|size| size.trim().parse().ok())
        .filter(|&size| size > 0)
        .collect()
}

/// One answered (or failed) ask.
pub(super) struct Sample {
    /// The holder's index (its lock's).
    pub holder: usize,
    pub sent_at: Instant,
    pub answered_at: Instant,
    latency_ms: f64,
    pub kind: Kind,
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Valid,
    Unknown,
    Failed,
}

#[derive(Default)]
pub(super) struct Tally {
    pub samples: Mutex<Vec<Sample>>,
    /// Terms the holders started (their first ask answered with a validity).
    pub started: AtomicU64,
    /// Terms a holder stopped at its stop time while status still showed them.
    pub stopped_early: AtomicU64,
    /// When each holder started its first term.
    first_terms: Mutex<Vec<Instant>>,
}

/// How a window's holders reach the replica.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Connection {
    /// Kept between asks.
    Kept,
    /// One per ask, the TLS session resumed (the baseline).
    PerAsk,
}

impl Connection {
    fn name(self) -> &'static str {
        match self {
            Self::Kept => "kept",
            Self::PerAsk => "per ask",
        }
    }
}

/// Holder `index`'s own loopback address, as a pod has its own IP.
fn holder_source(index: usize) -> std::net::IpAddr {
    let offset = u32::try_from(index).unwrap_or(u32::MAX).saturating_add(1);
    std::net::IpAddr::V4(std::net::Ipv4Addr::from(0x7F0A_0000u32.saturating_add(offset)))
}

/// The holders' ask ([`asking_with`] a caller of the holder's own, from its own address), timed.
fn counted_ask(index: usize, connection: Connection, tally: Arc<Tally>) -> Ask {
    let source = holder_source(index);
    let inner = asking_with(match connection {
        Connection::Kept => Caller::from_source(source),
        Connection::PerAsk => Caller::from_source_one_connection_per_request(source),
    });
    Arc::new(move |channel, question| {
        let (inner, tally) = (inner.clone(), tally.clone());
        Box::pin(async move {
            let started = Instant::now();
            let asked = inner(channel, question).await;
            let answered_at = Instant::now();
            let kind = match asked {
                Asked::Valid { .. } => Kind::Valid,
                Asked::Unknown(_) => Kind::Unknown,
                Asked::Failed { .. } => Kind::Failed,
            };
            tally
                .samples
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(Sample {
                    holder: index,
                    sent_at: started,
                    answered_at,
                    latency_ms: (answered_at - started).as_secs_f64() * 1000.0,
                    kind,
                });
            asked
        })
    })
}

/// A holder's loop, as `elect` runs it without a command: a term with its stop time, followed until status stops
/// showing it or its stop time comes; then the next.
async fn hold(
    mut terms: watch::Receiver<Option<Term>>,
    latest: watch::Receiver<Option<Arc<DistributedLock>>>,
    stopping: Stopping,
    tally: Arc<Tally>,
) {
    let mut first = true;
    while let Some((term, stop_at)) = current_term(&mut terms, &latest, &stopping).await {
        if std::mem::take(&mut first) {
            tally
                .first_terms
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(Instant::now());
        }
        tally.started.fetch_add(1, Ordering::Relaxed);
        let followed = (terms.clone(), latest.clone());
        watch_term(
            followed,
            term.clone(),
            stop_at,
            stopping.clone(),
            CancellationToken::new(),
        )
        .await;
        if terms
            .borrow()
            .as_ref()
            .is_some_and(|now| now.token == term.token && now.permit == term.permit)
        {
            tally.stopped_early.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// What `cli::term::follow` keeps for one holder.
struct Sinks {
    holder: String,
    terms: watch::Sender<Option<Term>>,
    seen: watch::Sender<Option<Arc<DistributedLock>>>,
}

/// One watch on all the locks, each event given to its lock's holder as `follow` gives it (the lock first, then the
/// term if it changed).
async fn fan_out(api: Api<DistributedLock>, sinks: HashMap<String, Sinks>) {
    let stream = watcher::watcher(api, watcher::Config::default());
    let mut stream = std::pin::pin!(stream);
    loop {
        match stream.try_next().await {
            Ok(Some(watcher::Event::Apply(lock) | watcher::Event::InitApply(lock))) => {
                let Some(sinks) = lock.metadata.name.as_deref().and_then(|name| sinks.get(name)) else {
                    continue;
                };
                let next = term_of(&lock, &sinks.holder);
                sinks.seen.send_replace(Some(Arc::new(lock)));
                sinks.terms.send_if_modified(|current| {
                    let changed = *current != next;
                    *current = next;
                    changed
                });
            }
            Ok(Some(watcher::Event::Delete(lock))) => {
                if let Some(sinks) = lock.metadata.name.as_deref().and_then(|name| sinks.get(name)) {
                    sinks.seen.send_replace(None);
                    sinks.terms.send_replace(None);
                }
            }
            Ok(Some(_)) => {}
            Ok(None) => return,
            Err(_) => tokio::time::sleep(Duration::from_secs(1)).await,
        }
    }
}

/// The asks per second of one held lock on paper: the holders' schedule (`after_ask`: again when half of the time
/// left to the stop time has passed) against the operator's at [`TTL`] (an extension every third of the TTL,
/// giving the TTL less the drift; status refreshed when it shows less than `max(TTL/2, TTL/3 + 2 s)` left: every
/// other extension at 10 s; the replica tells no more than status shows), asks answered at once.
pub fn scheduled_per_lock(ttl: Duration) -> f64 {
    let validity = ttl.mul_f64(1.0 - DRIFT_FACTOR);
    let extend_every = ttl / 3;
    let refresh_below = (ttl / 2).max(ttl / 3 + Duration::from_secs(2));
    let origin = Instant::now();
    // Counted after a few status cycles, over many.
    let (counted_from, end) = (origin + ttl * 3, origin + ttl * 60);
    let (mut lease_until, mut shown) = (origin + validity, origin + validity);
    let mut next_extension = origin + extend_every;
    let mut stop_at = None;
    let mut asks = 0u64;
    let mut ask = |at: Instant, lease_until: Instant, shown: Instant, stop_at: &mut Option<Instant>| {
        let remaining = lease_until.min(shown).saturating_duration_since(at);
        let valid = Asked::Valid {
            sent_at: at,
            remaining,
        };
        let (stop, next) = after_ask(*stop_at, &valid, MARGIN, at);
        *stop_at = stop;
        if at >= counted_from {
            asks += 1;
        }
        next
    };
    let mut next_ask = ask(origin, lease_until, shown, &mut stop_at);
    while next_extension.min(next_ask) < end {
        if next_extension <= next_ask {
            let now = next_extension;
            lease_until = now + validity;
            next_extension = now + extend_every;
            if shown.saturating_duration_since(now) < refresh_below {
                shown = lease_until;
            }
        } else {
            next_ask = ask(next_ask, lease_until, shown, &mut stop_at);
        }
    }
    asks as f64 / (end - counted_from).as_secs_f64()
}

/// The herd is run this many times per size.
const HERD_ROUNDS: usize = 2;
/// Clients flooding forged reports during the herd, as in the flood bench (issue 39).
const FLOOD_CLIENTS: usize = 8;
/// The flood's length, from the herd's start.
const FLOOD_LENGTH: Duration = Duration::from_secs(30);

/// The herd after a failover (issue 55, item 3): every holder starts at once, each first ask on a new
/// connection (a full handshake), with the flood of forged reports on top; measured until every holder has its
/// first answer, and the locks lost until a TTL after that.
async fn herd(
    api: &Api<DistributedLock>,
    operator: &super::Operator,
    locks: usize,
    round: usize,
) -> Result<(), BoxError> {
    let lost_before = lost(operator.port).await?;
    let cpu_before = cpu_seconds(operator.pid)?;
    let tally = Arc::new(Tally::default());
    let started = Instant::now();
    let flood_tally = Arc::new(super::support::forged_reports::Tally::default());
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], operator.reports_port));
    let flooding: Vec<_> = (0..FLOOD_CLIENTS)
        .map(|client| {
            tokio::spawn(super::support::forged_reports::flood(
                addr,
                "default".to_owned(),
                client,
                started + FLOOD_LENGTH,
                flood_tally.clone(),
            ))
        })
        .collect();
    let (mut holders, fanning) = spawn_holders(api, locks, Connection::Kept, &tally, Duration::ZERO);
    let deadline = started + patience();
    while tally.first_terms.lock().unwrap_or_else(|p| p.into_inner()).len() < locks {
        if Instant::now() > deadline {
            return Err(format!(
                "herd {round}: only {} of {locks} holders were answered",
                tally.first_terms.lock().unwrap_or_else(|p| p.into_inner()).len()
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let all_answered = started.elapsed();
    let cores = (cpu_seconds(operator.pid)? - cpu_before) / all_answered.as_secs_f64().max(1e-9);
    // A lock the herd cost shows lost within a TTL of it.
    tokio::time::sleep(TTL).await;
    let lost_herd = lost(operator.port).await? - lost_before;
    let mut firsts: Vec<f64> = tally
        .first_terms
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .map(|at| (*at - started).as_secs_f64())
        .collect();
    firsts.sort_by(f64::total_cmp);
    holders.abort_all();
    fanning.abort();
    while holders.join_next().await.is_some() {}
    for client in flooding {
        client.await?;
    }
    let taken = flood_tally.taken.load(Ordering::Relaxed);
    if taken > 0 {
        return Err(format!("herd {round}: {taken} forged reports were taken").into());
    }
    println!(
        "    herd {round}: {locks} holders at once, {} forged reports beside: every holder answered after {:.1} s (first answers p99 {:.1} s), the operator at {:.2} cores meanwhile; {lost_herd:.0} locks lost",
        flood_tally.sent.load(Ordering::Relaxed),
        all_answered.as_secs_f64(),
        quantile(&firsts, 0.99),
        cores
    );
    println!(
        "SUMMARY_HERD locks={locks} lost={lost_herd:.0} first_answer_p99_s={:.2} all_answered_s={:.2} cpu_cores={cores:.2}",
        quantile(&firsts, 0.99),
        all_answered.as_secs_f64()
    );
    Ok(())
}

/// One window of asking holders.
struct Window {
    connection: Connection,
    seconds: f64,
    answered: usize,
    failed: usize,
    unknown: usize,
    cores: f64,
    p50_ms: f64,
    p99_ms: f64,
    stopped_early: u64,
    /// Locks the operator lost during the window.
    lost: f64,
    /// The bench process's cores (the holders' side, the API server, the watches).
    bench_cores: f64,
}

/// One size's figures: the base window (nobody asks), and the holders asking on kept connections and on a
/// connection per ask.
struct Figures {
    locks: usize,
    cores_base: f64,
    lost_base: f64,
    bench_cores_base: f64,
    kept: Window,
    per_ask: Window,
}

impl Window {
    /// Whether the bench asked at least 90 % as often as the holders' schedule says.
    fn on_schedule(&self, locks: usize) -> bool {
        self.per_lock(locks) >= 0.9 * scheduled_per_lock(TTL)
    }

    fn asks_per_s(&self) -> f64 {
        self.answered as f64 / self.seconds.max(1e-9)
    }

    fn per_lock(&self, locks: usize) -> f64 {
        self.asks_per_s() / locks.max(1) as f64
    }

    /// The operator's CPU-milliseconds per answered ask, less the base window's.
    fn cpu_ms_per_ask(&self, base: f64) -> f64 {
        (self.cores - base).max(0.0) * 1000.0 / self.asks_per_s().max(1e-9)
    }
}

pub async fn run(sizes: &[usize], window: Duration) -> Result<(), BoxError> {
    let scheduled = scheduled_per_lock(TTL);
    println!(
        "the holders' asks (POST /v1/validity): held locks {sizes:?}, ttl {}s, {}s windows: base (nobody asks), then asking on kept connections, then on a connection per ask; the holders' schedule gives {scheduled:.3} asks/s per held lock",
        TTL.as_secs(),
        window.as_secs()
    );
    let mut all = Vec::new();
    for &locks in sizes {
        all.push(one_size(locks, window).await?);
    }
    println!(
        "  {:>6} | {:>10} | {:>7} | {:>11} | {:>9} | {:>11} | {:>11} | {:>7} | {:>7} | {:>10} | {:>11}",
        "locks",
        "connection",
        "asks/s",
        "asks/s/lock",
        "CPU% base",
        "CPU% asking",
        "asking/base",
        "p50 ms",
        "p99 ms",
        "CPU-ms/ask",
        "early stops"
    );
    for figures in &all {
        for window in [&figures.kept, &figures.per_ask] {
            println!(
                "  {:>6} | {:>10} | {:>7.0} | {:>11.3} | {:>9.1} | {:>11.1} | {:>11.2} | {:>7.2} | {:>7.2} | {:>10.3} | {:>11}",
                figures.locks,
                window.connection.name(),
                window.asks_per_s(),
                window.per_lock(figures.locks),
                figures.cores_base * 100.0,
                window.cores * 100.0,
                window.cores / figures.cores_base.max(1e-9),
                window.p50_ms,
                window.p99_ms,
                window.cpu_ms_per_ask(figures.cores_base),
                window.stopped_early
            );
        }
    }
    for figures in &all {
        for window in [&figures.kept, &figures.per_ask] {
            if !window.on_schedule(figures.locks) {
                println!(
                    "  {} locks, {}: asked {:.0}/s, short of the schedule's {:.0}/s (the bench's side could not keep up)",
                    figures.locks,
                    window.connection.name(),
                    window.asks_per_s(),
                    scheduled * figures.locks as f64
                );
            }
        }
    }
    for figures in &all {
        for (label, window) in [
            ("SUMMARY_ASKS", &figures.kept),
            ("SUMMARY_ASKS_PER_ASK", &figures.per_ask),
        ] {
            println!(
                "{label} locks={} asks_per_s={:.0} asks_per_s_per_lock={:.3} scheduled_per_lock={scheduled:.3} answered={} unknown={} failed={} cpu_pct_base={:.1} cpu_pct_asking={:.1} ratio_asking_base={:.2} cpu_ms_per_ask={:.3} latency_p50_ms={:.2} latency_p99_ms={:.2} waited_p99_ms=0.0 waited_max_ms=0.0 stopped_early={} lost_base={:.0} lost_asking={:.0} bench_cpu_pct_base={:.1} bench_cpu_pct_asking={:.1}",
                figures.locks,
                window.asks_per_s(),
                window.per_lock(figures.locks),
                window.answered,
                window.unknown,
                window.failed,
                figures.cores_base * 100.0,
                window.cores * 100.0,
                window.cores / figures.cores_base.max(1e-9),
                window.cpu_ms_per_ask(figures.cores_base),
                window.p50_ms,
                window.p99_ms,
                window.stopped_early,
                figures.lost_base,
                window.lost,
                figures.bench_cores_base * 100.0,
                window.bench_cores * 100.0
            );
        }
        println!(
            "RATIO_ASKS locks={} cpu_kept_over_per_ask={:.2} cpu_ms_per_ask_kept={:.3} cpu_ms_per_ask_per_ask={:.3}",
            figures.locks,
            figures.kept.cores / figures.per_ask.cores.max(1e-9),
            figures.kept.cpu_ms_per_ask(figures.cores_base),
            figures.per_ask.cpu_ms_per_ask(figures.cores_base)
        );
    }
    Ok(())
}

async fn one_size(locks: usize, window: Duration) -> Result<Figures, BoxError> {
    println!("  {locks} held locks:");
    // The cluster is kept (not used) until the windows are measured: dropped, its API server and masters stop.
    let (_cluster, operator, api) = settled_identity_locks(locks).await?;

    let lost_before = lost(operator.port).await?;
    let bench_before = cpu_seconds(std::process::id())?;
    let base_started = Instant::now();
    let cores_base = cores_over(operator.pid, window).await?;
    let bench_cores_base =
        (cpu_seconds(std::process::id())? - bench_before) / base_started.elapsed().as_secs_f64();
    let lost_base = lost(operator.port).await? - lost_before;
    println!(
        "    base: {:.1} % of a core ({:.0} locks lost; the bench process {:.1} %)",
        cores_base * 100.0,
        lost_base,
        bench_cores_base * 100.0
    );
    let kept = asking(&api, &operator, locks, window, Connection::Kept, cores_base).await?;
    let per_ask = asking(&api, &operator, locks, window, Connection::PerAsk, cores_base).await?;
    for round in 1..=HERD_ROUNDS {
        herd(&api, &operator, locks, round).await?;
    }
    operator.stop().await?;
    Ok(Figures {
        locks,
        cores_base,
        lost_base,
        bench_cores_base,
        kept,
        per_ask,
    })
}

/// A holder per lock asking through `connection`, started spread over a TTL and settled, then one window.
async fn asking(
    api: &Api<DistributedLock>,
    operator: &super::Operator,
    locks: usize,
    window: Duration,
    connection: Connection,
    cores_base: f64,
) -> Result<Window, BoxError> {
    let tally = Arc::new(Tally::default());
    // Started spread over a TTL, as pods start at moments of their own (the herd, all at once, is measured
    // apart).
    let (mut holders, fanning) = spawn_holders(api, locks, connection, &tally, START_SPREAD);
    settled_holders(&tally, locks).await?;
    let lost_before = lost(operator.port).await?;
    let bench_before = cpu_seconds(std::process::id())?;
    let stopped_before = tally.stopped_early.load(Ordering::Relaxed);
    let started = Instant::now();
    let cores = cores_over(operator.pid, window).await?;
    let ended = Instant::now();
    let bench_cores = (cpu_seconds(std::process::id())? - bench_before) / (ended - started).as_secs_f64();
    let lost_asking = lost(operator.port).await? - lost_before;
    let stopped_early = tally.stopped_early.load(Ordering::Relaxed) - stopped_before;
    holders.abort_all();
    fanning.abort();
    // The holders' connections close as their tasks go: the next window starts on an idle port.
    while holders.join_next().await.is_some() {}

    let samples = tally.samples.lock().unwrap_or_else(|p| p.into_inner());
    let in_window: Vec<&Sample> = samples
        .iter()
        .filter(|sample| sample.answered_at >= started && sample.answered_at < ended)
        .collect();
    let count = |kind: Kind| in_window.iter().filter(|sample| sample.kind == kind).count();
    let (valid, unknown, failed) = (count(Kind::Valid), count(Kind::Unknown), count(Kind::Failed));
    let mut latencies: Vec<f64> = in_window
        .iter()
        .filter(|sample| sample.kind != Kind::Failed)
        .map(|sample| sample.latency_ms)
        .collect();
    latencies.sort_by(f64::total_cmp);
    let figures = Window {
        connection,
        seconds: (ended - started).as_secs_f64(),
        answered: valid + unknown,
        failed,
        unknown,
        cores,
        p50_ms: quantile(&latencies, 0.5),
        p99_ms: quantile(&latencies, 0.99),
        stopped_early,
        lost: lost_asking,
        bench_cores,
    };
    println!(
        "    asking, connection {}: {:.1} % of a core ({:.2}x base); {} asks answered ({:.0}/s, {:.3}/s per held lock; {unknown} unknown), {failed} failed; latency p50 {:.2} ms, p99 {:.2} ms; {} terms stopped while still shown; {:.0} locks lost; the bench process {:.1} %",
        connection.name(),
        cores * 100.0,
        cores / cores_base.max(1e-9),
        figures.answered,
        figures.asks_per_s(),
        figures.per_lock(locks),
        figures.p50_ms,
        figures.p99_ms,
        figures.stopped_early,
        figures.lost,
        figures.bench_cores * 100.0
    );
    Ok(figures)
}

/// A holder per lock asking through `connection`, each started at a moment of its own within `spread` (zero: all
/// at once), and the one watch that feeds them all.
pub(super) fn spawn_holders(
    api: &Api<DistributedLock>,
    locks: usize,
    connection: Connection,
    tally: &Arc<Tally>,
    spread: Duration,
) -> (JoinSet<()>, tokio::task::JoinHandle<()>) {
    let mut holders = JoinSet::new();
    let mut sinks = HashMap::new();
    for index in 0..locks {
        let (name, spec) = single_lock(index);
        let holder = spec["holder"]["identity"].as_str().unwrap_or_default().to_owned();
        let (terms, term) = watch::channel(None::<Term>);
        let (seen, latest) = watch::channel(None);
        let stopping = Stopping {
            margin: MARGIN,
            max_clock_skew: MAX_CLOCK_SKEW,
            namespace: "default".to_owned(),
            lock: name.clone(),
            ask: counted_ask(index, connection, tally.clone()),
            tool: "guard",
            clock: HolderClock::default(),
        };
        let start = Instant::now() + spread.mul_f64(index as f64 / locks as f64);
        let tally = tally.clone();
        holders.spawn(async move {
            tokio::time::sleep_until(start).await;
            hold(term, latest, stopping, tally).await;
        });
        sinks.insert(name, Sinks { holder, terms, seen });
    }
    (holders, tokio::spawn(fan_out(api.clone(), sinks)))
}

/// Waits until all `locks` holders have started a term, then for the first asks' burst to pass and a status
/// cycle or two for the holders' schedules to spread as they will.
pub(super) async fn settled_holders(tally: &Tally, locks: usize) -> Result<(), BoxError> {
    let deadline = Instant::now() + patience();
    while (tally.started.load(Ordering::Relaxed) as usize) < locks {
        if Instant::now() > deadline {
            return Err(format!(
                "only {} of {locks} holders started",
                tally.started.load(Ordering::Relaxed)
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(14)).await;
    Ok(())
}

pub(super) async fn lost(port: u16) -> Result<f64, BoxError> {
    Ok(metric(&metrics_text(port).await?, "redlock_locks_lost_total"))
}

/// The `q` quantile of sorted values (0 when there are none).
pub(super) fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let index = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[index.min(sorted.len() - 1)]
}
