//! Fairness benchmark (issue 31): waiters that arrive on one key in a known order are served in that order.
//! Run with `cargo bench --bench fairness`; the last line is the SUMMARY.
//!
//! Each round: a holder takes the key, eight waiters (each on an engine of its own) arrive one after another —
//! the next starts once a majority of masters has queued the one before — and the holder lets go; each waiter
//! holds the key for 5 to 30 ms. Measured per round:
//!
//! - the **Kendall distance** between arrival and service order (pairs served out of arrival order); the promise
//!   is 0 without faults;
//! - each waiter's **excess wait**: from the holder's release to its grant, less the holds of the waiters served
//!   before it. That is the hand-overs' cost: the bound stated is [`QUEUE_POLL`] + 50 ms per hand-over (the
//!   next waiter notices the key free at its next attempt), and under faults also the time faults were under
//!   way during the wait plus [`QUEUE_KEEP`] (a waiter dropped while cut off).
//!
//! - each **hand-over**: from the moment the waiter (or holder) before lets go to the next waiter's grant, p50
//!   and p99; and, in one more round whose holder keeps the key 5 s, the **attempts per waiter per second**
//!   while it waits (each one script call per master).
//!
//! First without faults (`FAIRNESS_ROUNDS`, default 20), twice: waiters that poll only (every [`QUEUE_POLL`],
//! how every waiter waited before releases were announced) and waiters that listen (woken by the release's
//! announcement, polling every [`QUEUE_FALLBACK`] only as a fallback), on the same five masters in the same
//! run. Then as many rounds of listening waiters as fit in `FAIRNESS_SECONDS` (default 60) under the engine
//! safety checker's nemesis (restarts, pauses, held traffic, latency, cut connections on five masters behind
//! fault proxies), where the bound per hand-over is [`QUEUE_FALLBACK`] + 50 ms: an announcement lost to a
//! fault costs at most the fallback.

#[path = "../tests/support/mod.rs"]
mod support;

use std::sync::Arc;
use std::time::Duration;

use redlock_operator::redlock::{
    AcquireOptions, QUEUE_FALLBACK, QUEUE_POLL, Redlock, RedlockConfig, keep_for,
};
use support::redis_server::RedisCluster;
use support::safety::{Nemesis, Recorder, queued_at_a_majority};
use tokio::sync::oneshot;
use tokio::time::Instant;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const WAITERS: usize = 8;
const TTL: Duration = Duration::from_secs(2);
const NODE_TIMEOUT: Duration = Duration::from_millis(50);
/// What one hand-over may cost beyond the waiter's next attempt.
const HANDOVER_SLACK: Duration = Duration::from_millis(50);

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(default)
}

/// One waiter's round.
#[derive(Clone, Copy, Debug)]
struct Served {
    arrived: usize,
    asked: Instant,
    attempts: u32,
    granted: Instant,
    released: Instant,
}

/// One round's figures.
struct Round {
    kendall: usize,
    /// Per waiter: excess wait, and hand-overs before its grant (its place in service order, from 1).
    excess: Vec<(Duration, u32)>,
    /// Waiters that gave up (under faults, the majority may be out of reach for longer than they wait).
    gave_up: usize,
    /// Each hand-over: from the release before (the holder's, or the waiter's served before) to the grant.
    handovers: Vec<Duration>,
    /// Per waiter: attempts per second while it waited.
    attempt_rates: Vec<f64>,
    started: Instant,
    ended: Instant,
}

/// The `q`-quantile of `values` (sorted here).
fn quantile(values: &mut [Duration], q: f64) -> Duration {
    values.sort();
    if values.is_empty() {
        return Duration::ZERO;
    }
    let index = ((values.len() - 1) as f64 * q).round() as usize;
    values[index.min(values.len() - 1)]
}

/// Quiet rounds on `urls` with waiters that listen, or poll only: (p50, p99 hand-over, mean attempts per
/// waiter per second in a round whose holder keeps the key [`IDLE_HOLD`], worst excess per hand-over, Kendall
/// distance).
async fn quiet_rounds(
    urls: &[String],
    rounds: u64,
    poll_only: bool,
) -> Result<(Duration, Duration, f64, Duration, usize), BoxError> {
    let engines = engines_configured(urls, poll_only).await?;
    let mut quiet = Vec::new();
    let mode = if poll_only { "poll" } else { "listen" };
    for round in 0..rounds {
        quiet.push(one_round(&engines, &format!("quiet-{mode}-{round}"), Duration::ZERO).await?);
    }
    // Attempts per waiter per second while the key stays held: what waiting costs when nothing is let go.
    let idle = one_round(&engines, &format!("idle-{mode}"), IDLE_HOLD).await?;
    let idle_rate = idle.attempt_rates.iter().sum::<f64>() / idle.attempt_rates.len().max(1) as f64;
    let kendall: usize = quiet.iter().map(|round| round.kendall).sum();
    let mut handovers: Vec<Duration> = quiet.iter().flat_map(|round| round.handovers.clone()).collect();
    Ok((
        quantile(&mut handovers, 0.5),
        quantile(&mut handovers, 0.99),
        idle_rate,
        worst_per_handover(&quiet),
        kendall,
    ))
}

fn main() -> Result<(), BoxError> {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(run())
}

async fn run() -> Result<(), BoxError> {
    let rounds = env_number("FAIRNESS_ROUNDS", 20);
    let faulty_for = Duration::from_secs(env_number("FAIRNESS_SECONDS", 60));

    let cluster = RedisCluster::start(5)?;
    let (poll_p50, poll_p99, poll_rate, poll_worst, poll_kendall) =
        quiet_rounds(&cluster.urls(), rounds, true).await?;
    let (p50, p99, rate, worst_per_handover, kendall) = quiet_rounds(&cluster.urls(), rounds, false).await?;
    println!(
        "no faults, polling only (every {}): {rounds} rounds of {WAITERS} waiters: Kendall distance {poll_kendall}; hand-over p50 {} p99 {}; {poll_rate:.2} attempts per waiter per second while the key stays held; excess wait per hand-over: worst {} (bound {})",
        ms(QUEUE_POLL),
        ms(poll_p50),
        ms(poll_p99),
        ms(poll_worst),
        ms(QUEUE_POLL + HANDOVER_SLACK)
    );
    println!(
        "no faults, listening (fallback every {}): {rounds} rounds of {WAITERS} waiters: Kendall distance {kendall} in all (0 promised); hand-over p50 {} p99 {}; {rate:.2} attempts per waiter per second while the key stays held; excess wait per hand-over: worst {} (bound {})",
        ms(QUEUE_FALLBACK),
        ms(p50),
        ms(p99),
        ms(worst_per_handover),
        ms(QUEUE_FALLBACK + HANDOVER_SLACK)
    );

    let mut nemesis = Nemesis::start(5).await?;
    let engines = engines_on(&nemesis.urls()).await?;
    let recorder = Recorder::default();
    let started = Instant::now();
    let (done_sender, done) = tokio::sync::watch::channel(false);
    let faulty_rounds = {
        let engines = engines.clone();
        tokio::spawn(async move {
            let mut rounds = Vec::new();
            let mut round = 0;
            while started.elapsed() < faulty_for {
                round += 1;
                match one_round(&engines, &format!("faulty-{round}"), Duration::ZERO).await {
                    Ok(figures) => rounds.push(figures),
                    Err(err) => eprintln!("round {round}: {err}"),
                }
            }
            let _ = done_sender.send(true);
            rounds
        })
    };
    nemesis
        .run(&recorder, Duration::from_millis(1_500), None, || *done.borrow())
        .await;
    let faulty = faulty_rounds.await?;
    let faults = recorder.faults();
    let faulty_kendall: usize = faulty.iter().map(|round| round.kendall).sum();
    let gave_up: usize = faulty.iter().map(|round| round.gave_up).sum();
    let mut worst_unexplained = Duration::ZERO;
    let mut worst_excess = Duration::ZERO;
    let mut over_bound = 0;
    for round in &faulty {
        let faulted: Duration = faults
            .iter()
            .map(|(began, ended)| {
                let from = (*began).max(round.started);
                let to = (*ended).min(round.ended);
                to.saturating_duration_since(from)
            })
            .sum();
        for (excess, handovers) in &round.excess {
            worst_excess = worst_excess.max(*excess);
            // A waiter at the fallback pace is kept for keep_for(QUEUE_FALLBACK), not QUEUE_KEEP.
            let keep = keep_for(QUEUE_FALLBACK);
            let bound = (QUEUE_FALLBACK + HANDOVER_SLACK) * *handovers + faulted + keep;
            if *excess > bound {
                over_bound += 1;
            }
            let unexplained = excess.saturating_sub(faulted + keep);
            worst_unexplained = worst_unexplained.max(unexplained / (*handovers).max(1));
        }
    }
    let faulted_rounds = faulty
        .iter()
        .filter(|round| {
            faults
                .iter()
                .any(|(began, ended)| *began <= round.ended && *ended >= round.started)
        })
        .count();
    println!(
        "under the nemesis: {} rounds ({faulted_rounds} with a fault under way), {} faults: Kendall distance {faulty_kendall} in all, {gave_up} waiters gave up; worst excess wait {}, waiters over the bound {over_bound}; worst excess per hand-over beyond the faults and the masters' keep {}",
        faulty.len(),
        faults.len(),
        ms(worst_excess),
        ms(worst_unexplained)
    );
    println!(
        "SUMMARY quiet_rounds={rounds} quiet_kendall={kendall} quiet_worst_excess_per_handover_ms={:.1} bound_per_handover_ms={:.1} handover_p50_ms={:.1} handover_p99_ms={:.1} attempts_per_waiter_s={rate:.2} poll_only_handover_p50_ms={:.1} poll_only_handover_p99_ms={:.1} poll_only_attempts_per_waiter_s={poll_rate:.2} faulty_rounds={} faulty_kendall={faulty_kendall} faulty_gave_up={gave_up} faulty_worst_excess_ms={:.1} faulty_over_bound={over_bound}",
        worst_per_handover.as_secs_f64() * 1e3,
        (QUEUE_FALLBACK + HANDOVER_SLACK).as_secs_f64() * 1e3,
        p50.as_secs_f64() * 1e3,
        p99.as_secs_f64() * 1e3,
        poll_p50.as_secs_f64() * 1e3,
        poll_p99.as_secs_f64() * 1e3,
        faulty.len(),
        worst_excess.as_secs_f64() * 1e3,
    );
    drop(cluster);
    Ok(())
}

async fn engines_on(urls: &[String]) -> Result<Vec<Redlock>, BoxError> {
    engines_configured(urls, false).await
}

/// A holder's engine and one per waiter (each a process of its own, as far as the masters can tell: its own
/// connections, its own listeners); `poll_only` waiters do not listen.
async fn engines_configured(urls: &[String], poll_only: bool) -> Result<Vec<Redlock>, BoxError> {
    let mut engines = Vec::new();
    for _ in 0..=WAITERS {
        let mut config = RedlockConfig::from_urls(urls)?;
        config.max_ttl = TTL;
        config.node_timeout = NODE_TIMEOUT;
        config.assume_durable = true;
        config.poll_only = poll_only;
        engines.push(Redlock::connect(config).await?);
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while engines.iter().any(|engine| engine.eligible() < urls.len()) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(engines)
}

/// How long the holder keeps the key once every waiter queued, in the round that measures what waiting costs
/// the masters while nothing is let go.
const IDLE_HOLD: Duration = Duration::from_secs(5);

/// One round; the holder lets go `hold` after the last waiter queued.
async fn one_round(engines: &[Redlock], key: &str, hold: Duration) -> Result<Round, BoxError> {
    let started = Instant::now();
    let (holder_engine, waiter_engines) = engines.split_first().ok_or("no engines")?;
    let holder = holder_engine
        .acquire(
            key,
            TTL,
            "holder",
            AcquireOptions {
                deadline: Some(Instant::now() + Duration::from_secs(10)),
                ..AcquireOptions::default()
            },
        )
        .await?;
    let served = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for (arrived, engine) in waiter_engines.iter().enumerate() {
        let (queued_sender, queued) = oneshot::channel::<()>();
        let (engine, key, served) = (engine.clone(), key.to_owned(), served.clone());
        tasks.push(tokio::spawn(async move {
            let mut queued_sender = Some(queued_sender);
            let asked = Instant::now();
            let mut attempts = 1;
            let options = AcquireOptions {
                deadline: Some(Instant::now() + Duration::from_secs(20)),
                fair: true,
                ..AcquireOptions::default()
            };
            let acquired = engine
                .acquire_reporting(&key, TTL, &format!("w{arrived}"), options, |refused| {
                    attempts += 1;
                    if refused.report().is_some_and(queued_at_a_majority)
                        && let Some(sender) = queued_sender.take()
                    {
                        let _ = sender.send(());
                    }
                })
                .await;
            let Ok(lease) = acquired else { return false };
            let granted = Instant::now();
            tokio::time::sleep(Duration::from_millis(rand::random_range(5..30))).await;
            let released = Instant::now();
            served.lock().unwrap_or_else(|e| e.into_inner()).push(Served {
                arrived,
                asked,
                attempts,
                granted,
                released,
            });
            engine.release(&lease).await;
            true
        }));
        // The next waiter arrives once this one is queued at a majority (or gave up trying, under faults).
        let _ = tokio::time::timeout(Duration::from_secs(10), queued).await;
    }
    tokio::time::sleep(hold).await;
    let release = Instant::now();
    holder_engine.release(&holder).await;
    let mut gave_up = 0;
    for task in tasks {
        if !task.await? {
            gave_up += 1;
        }
    }
    let mut served = served.lock().unwrap_or_else(|e| e.into_inner()).clone();
    served.sort_by_key(|waiter| waiter.granted);
    let mut kendall = 0;
    for (index, waiter) in served.iter().enumerate() {
        kendall += served[index + 1..]
            .iter()
            .filter(|later| later.arrived < waiter.arrived)
            .count();
    }
    let mut held_before = Duration::ZERO;
    let mut excess = Vec::new();
    let mut handovers = Vec::new();
    let mut attempt_rates = Vec::new();
    let mut let_go = release;
    for waiter in &served {
        handovers.push(waiter.granted.saturating_duration_since(let_go));
        let_go = waiter.released;
        let waited = waiter
            .granted
            .saturating_duration_since(waiter.asked)
            .as_secs_f64();
        if waited > 0.0 {
            attempt_rates.push(f64::from(waiter.attempts) / waited);
        }
    }
    for (place, waiter) in served.iter().enumerate() {
        let wait = waiter.granted.saturating_duration_since(release);
        excess.push((
            wait.saturating_sub(held_before),
            u32::try_from(place + 1).unwrap_or(u32::MAX),
        ));
        held_before += waiter.released.saturating_duration_since(waiter.granted);
    }
    Ok(Round {
        kendall,
        excess,
        gave_up,
        handovers,
        attempt_rates,
        started,
        ended: Instant::now(),
    })
}

fn worst_per_handover(rounds: &[Round]) -> Duration {
    rounds
        .iter()
        .flat_map(|round| round.excess.iter())
        .map(|(excess, handovers)| *excess / (*handovers).max(1))
        .max()
        .unwrap_or_default()
}

fn ms(duration: Duration) -> String {
    format!("{:.1} ms", duration.as_secs_f64() * 1e3)
}
