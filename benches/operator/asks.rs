//! What the holders' asks cost the operator (issue 48, item 1): since then `elect` and the Job guard ask the
//! active replica how long their grant stays valid (`POST /v1/validity` on the reports port) instead of
//! reading status's `validUntil` on their wall clock. For each size N (`OPERATOR_BENCH_ASK_LOCKS`,
//! comma-separated, default `200,10000`), on a fresh operator, masters and API server, the real binary holds
//! N identity locks (ttl 10s), and two windows of `OPERATOR_BENCH_ASK_SECONDS` (20) are measured:
//! - base: nobody asks (the holders as before issue 48 cost the operator nothing);
//! - asking: a holder per lock runs the holders' own code, `cli::term::current_term` then
//!   `cli::term::watch_term` (`elect`'s loop), which asks when it starts a term, at each status change of the
//!   term and at the latest when half of the time left has passed (`cli::stop_time::after_ask`), through
//!   `stop_time::over_the_channel`, one per holder as each holder process has its own: a connection per ask
//!   (the port serves one request per connection), the holder's TLS session resumed. The terms come from one
//!   watch on the locks, fanned out to the holders as `cli::term::follow` would give them, so that the
//!   bench's API server is not loaded by N watches. The holders start spread over a TTL, then a status cycle
//!   or two passes before the window.
//!
//! All the holders share the bench's one source address (127.0.0.1: the library's client has no source
//! address to choose), and the reports port serves at most 8 connections at once from one address, so at most
//! [`IN_FLIGHT`] asks are under way at once; the time an ask waits for its turn is shown apart from its
//! latency.
//!
//! Per size it prints the asks the replica answered in the window (each counted as it was answered: valid,
//! unknown, or failed with no answer), per second in all and per held lock, beside the rate the holders'
//! schedule gives on paper ([`scheduled_per_lock`]); the operator's CPU (utime + stime from /proc, in % of
//! one core) in each window and their ratio; the asks' latency p50/p99 (the ask, TLS handshake included, not
//! its wait for a turn); the operator's CPU per ask; the holders that stopped their work though status still
//! showed their term (an ask answered too late, or one that waited too long for its turn here); the locks
//! lost in each window; and the bench process's own cores (the holders' side of every ask, the API server and
//! the watches share the machine with the operator). Where the bench could not ask as often as the schedule
//! says, it says so, with the operator's CPU at the schedule's rate worked out from its CPU per ask where the
//! schedule was kept (not measured). It ends with a table and `SUMMARY_ASKS locks=N …` per size.

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
    Ask, Asked, DRIFT_FACTOR, HolderClock, Stopping, after_ask, over_the_channel,
};
use redlock_operator::cli::term::{Term, current_term, term_of, watch_term};
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{
    BoxError, cores_over, cpu_seconds, metric, metrics_text, patience, settled_identity_locks, single_lock,
};

/// Asks under way at once from the bench's one source address: the port's bound is 8 per address, and a
/// connection's slot is given back only when the server's task for it ends, a moment after the answer reached the
/// holder, so two are left spare rather than have asks refused for it.
const IN_FLIGHT: usize = 6;
/// The locks' TTL, as in the rest of the operator bench.
const TTL: Duration = Duration::from_secs(10);
/// `elect`'s and the guard's default `--fence-margin` and `--max-clock-skew`.
const MARGIN: Duration = Duration::from_secs(1);
const MAX_CLOCK_SKEW: Duration = Duration::from_secs(1);
/// The holders start over this long.
const START_SPREAD: Duration = TTL;

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
struct Sample {
    answered_at: Instant,
    waited_ms: f64,
    latency_ms: f64,
    kind: Kind,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Valid,
    Unknown,
    Failed,
}

#[derive(Default)]
struct Tally {
    samples: Mutex<Vec<Sample>>,
    /// Terms the holders started (their first ask answered with a validity).
    started: AtomicU64,
    /// Terms a holder stopped at its stop time while status still showed them.
    stopped_early: AtomicU64,
}

/// The holders' ask ([`over_the_channel`], a caller of its own per holder), taking its turn among [`IN_FLIGHT`]
/// and timed.
fn counted_ask(turns: Arc<Semaphore>, tally: Arc<Tally>) -> Ask {
    let inner = over_the_channel();
    Arc::new(move |channel, question| {
        let (inner, turns, tally) = (inner.clone(), turns.clone(), tally.clone());
        Box::pin(async move {
            let queued = Instant::now();
            // The semaphore is never closed; if it were, the ask goes ahead unbounded rather than not at all.
            let _turn = turns.acquire_owned().await.ok();
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
                    answered_at,
                    waited_ms: (started - queued).as_secs_f64() * 1000.0,
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
    while let Some((term, stop_at)) = current_term(&mut terms, &latest, &stopping).await {
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

/// The asks per second of one held lock on paper: the holders' schedule (`after_ask`, and an ask at each status
/// change) against the operator's at [`TTL`] (an extension every third of the TTL, giving the TTL less the drift;
/// status refreshed when it shows less than `max(TTL/2, TTL/3 + 2 s)` left: every other extension at 10 s),
/// asks answered at once. At 10 s: each status refresh (every 6.67 s) is asked at once, then again when half of
/// the time to the stop time has passed (4.4 s later), and once more (2.2 s later), some 50 ms before the next
/// refresh: three asks every 6.67 s, 0.45 a second. That third ask is due so close to the refresh that a holder
/// whose asks are answered late (the next is counted from the answer) may see the refresh first, and then asks once
/// for both: two asks every 6.67 s, 0.30 a second, is the other end.
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
                next_ask = ask(now, lease_until, shown, &mut stop_at);
            }
        } else {
            next_ask = ask(next_ask, lease_until, shown, &mut stop_at);
        }
    }
    asks as f64 / (end - counted_from).as_secs_f64()
}

/// One size's figures.
struct Figures {
    locks: usize,
    seconds: f64,
    answered: usize,
    failed: usize,
    unknown: usize,
    cores_base: f64,
    cores_asking: f64,
    p50_ms: f64,
    p99_ms: f64,
    waited_p99_ms: f64,
    waited_max_ms: f64,
    stopped_early: u64,
    /// Locks the operator lost during each window.
    lost_base: f64,
    lost_asking: f64,
    /// The bench process's cores (the holders' side, the API server, the watches) in each window.
    bench_cores_base: f64,
    bench_cores_asking: f64,
}

impl Figures {
    /// Whether the bench asked at least 90 % as often as the holders' schedule says.
    fn on_schedule(&self) -> bool {
        self.per_lock() >= 0.9 * scheduled_per_lock(TTL)
    }

    fn asks_per_s(&self) -> f64 {
        self.answered as f64 / self.seconds.max(1e-9)
    }

    fn per_lock(&self) -> f64 {
        self.asks_per_s() / self.locks.max(1) as f64
    }

    fn ratio(&self) -> f64 {
        self.cores_asking / self.cores_base.max(1e-9)
    }

    /// The operator's CPU-milliseconds per answered ask, less the base window's.
    fn cpu_ms_per_ask(&self) -> f64 {
        (self.cores_asking - self.cores_base).max(0.0) * 1000.0 / self.asks_per_s().max(1e-9)
    }
}

pub async fn run(sizes: &[usize], window: Duration) -> Result<(), BoxError> {
    let scheduled = scheduled_per_lock(TTL);
    println!(
        "the holders' asks (POST /v1/validity): held locks {sizes:?}, ttl {}s, {}s windows, base (nobody asks) then asking; the holders' schedule gives {scheduled:.3} asks/s per held lock",
        TTL.as_secs(),
        window.as_secs()
    );
    let mut all = Vec::new();
    for &locks in sizes {
        all.push(one_size(locks, window).await?);
    }
    println!(
        "  {:>6} | {:>7} | {:>11} | {:>9} | {:>11} | {:>11} | {:>7} | {:>7} | {:>10} | {:>11}",
        "locks",
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
        println!(
            "  {:>6} | {:>7.0} | {:>11.3} | {:>9.1} | {:>11.1} | {:>11.2} | {:>7.2} | {:>7.2} | {:>10.3} | {:>11}",
            figures.locks,
            figures.asks_per_s(),
            figures.per_lock(),
            figures.cores_base * 100.0,
            figures.cores_asking * 100.0,
            figures.ratio(),
            figures.p50_ms,
            figures.p99_ms,
            figures.cpu_ms_per_ask(),
            figures.stopped_early
        );
    }
    // The bench's side (one source address, its share of the cores, the holders' side of every handshake on the same
    // machine) may not ask as often as the schedule says at the larger sizes: what the operator's CPU per ask,
    // measured where the schedule was kept, makes of the schedule's rate there. Worked out, not measured.
    let kept = all.iter().rfind(|figures| figures.on_schedule());
    for short in all.iter().filter(|figures| !figures.on_schedule()) {
        let scheduled = scheduled_per_lock(TTL) * short.locks as f64;
        print!(
            "  {} locks: asked {:.0}/s, short of the schedule's {scheduled:.0}/s",
            short.locks,
            short.asks_per_s()
        );
        match kept {
            Some(kept) => println!(
                "; at the {:.3} CPU-ms per ask measured with {} locks, that rate would take the operator about {:.0} % of a core beside its {:.1} % (worked out, not measured)",
                kept.cpu_ms_per_ask(),
                kept.locks,
                scheduled * kept.cpu_ms_per_ask() / 10.0,
                short.cores_base * 100.0
            ),
            None => println!(),
        }
    }
    for figures in &all {
        println!(
            "SUMMARY_ASKS locks={} asks_per_s={:.0} asks_per_s_per_lock={:.3} scheduled_per_lock={scheduled:.3} answered={} unknown={} failed={} cpu_pct_base={:.1} cpu_pct_asking={:.1} ratio_asking_base={:.2} cpu_ms_per_ask={:.3} latency_p50_ms={:.2} latency_p99_ms={:.2} waited_p99_ms={:.1} waited_max_ms={:.1} stopped_early={} lost_base={:.0} lost_asking={:.0} bench_cpu_pct_base={:.1} bench_cpu_pct_asking={:.1}",
            figures.locks,
            figures.asks_per_s(),
            figures.per_lock(),
            figures.answered,
            figures.unknown,
            figures.failed,
            figures.cores_base * 100.0,
            figures.cores_asking * 100.0,
            figures.ratio(),
            figures.cpu_ms_per_ask(),
            figures.p50_ms,
            figures.p99_ms,
            figures.waited_p99_ms,
            figures.waited_max_ms,
            figures.stopped_early,
            figures.lost_base,
            figures.lost_asking,
            figures.bench_cores_base * 100.0,
            figures.bench_cores_asking * 100.0
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

    let tally = Arc::new(Tally::default());
    let turns = Arc::new(Semaphore::new(IN_FLIGHT));
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
            ask: counted_ask(turns.clone(), tally.clone()),
            tool: "guard",
            clock: HolderClock::default(),
        };
        // Started spread over a TTL, as pods start at moments of their own, rather than N first asks (each a
        // full handshake: no session to resume yet) at one instant.
        let start = Instant::now() + START_SPREAD.mul_f64(index as f64 / locks as f64);
        let tally = tally.clone();
        holders.spawn(async move {
            tokio::time::sleep_until(start).await;
            hold(term, latest, stopping, tally).await;
        });
        sinks.insert(name, Sinks { holder, terms, seen });
    }
    let fanning = tokio::spawn(fan_out(api.clone(), sinks));
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
    // The first asks' burst behind, and a status cycle or two for the holders' schedules to spread as they will.
    tokio::time::sleep(Duration::from_secs(14)).await;
    let lost_before = lost(operator.port).await?;
    let bench_before = cpu_seconds(std::process::id())?;
    let started = Instant::now();
    let cores_asking = cores_over(operator.pid, window).await?;
    let ended = Instant::now();
    let bench_cores_asking =
        (cpu_seconds(std::process::id())? - bench_before) / (ended - started).as_secs_f64();
    let lost_asking = lost(operator.port).await? - lost_before;
    holders.abort_all();
    fanning.abort();
    operator.stop().await?;

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
    let mut waits: Vec<f64> = in_window.iter().map(|sample| sample.waited_ms).collect();
    waits.sort_by(f64::total_cmp);
    let figures = Figures {
        locks,
        seconds: (ended - started).as_secs_f64(),
        answered: valid + unknown,
        failed,
        unknown,
        cores_base,
        cores_asking,
        p50_ms: quantile(&latencies, 0.5),
        p99_ms: quantile(&latencies, 0.99),
        waited_p99_ms: quantile(&waits, 0.99),
        waited_max_ms: waits.last().copied().unwrap_or(0.0),
        stopped_early: tally.stopped_early.load(Ordering::Relaxed),
        lost_base,
        lost_asking,
        bench_cores_base,
        bench_cores_asking,
    };
    println!(
        "    asking: {:.1} % of a core ({:.2}x base); {} asks answered ({:.0}/s, {:.3}/s per held lock; {unknown} unknown), {failed} failed; latency p50 {:.2} ms, p99 {:.2} ms; waited for a turn p99 {:.1} ms, max {:.1} ms; {} terms stopped while still shown; {:.0} locks lost; the bench process {:.1} %",
        cores_asking * 100.0,
        figures.ratio(),
        figures.answered,
        figures.asks_per_s(),
        figures.per_lock(),
        figures.p50_ms,
        figures.p99_ms,
        figures.waited_p99_ms,
        figures.waited_max_ms,
        figures.stopped_early,
        figures.lost_asking,
        figures.bench_cores_asking * 100.0
    );
    Ok(figures)
}

async fn lost(port: u16) -> Result<f64, BoxError> {
    Ok(metric(&metrics_text(port).await?, "redlock_locks_lost_total"))
}

/// The `q` quantile of sorted values (0 when there are none).
fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let index = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[index.min(sorted.len() - 1)]
}
