//! Engine benchmark: our acquire/release against the physical limit measured in the same run on the same five
//! local masters — a raw parallel `SET NX PX` fan-out and a raw parallel compare-and-delete on the same kind of
//! multiplexed connections. Run with `cargo bench --bench engine`; the last line is the SUMMARY.
//!
//! Sequential acquire/release is measured on a current-thread and on a multi-thread runtime, each against the
//! raw fan-out on the same runtime; then the figures with two of five masters paused, an acquisition within an
//! hour of the masters' restart (which waits for every master's fencing counter, issue 39) beside one decided at
//! the first majority, the whole `lock` process, and throughput: sequential acquire+release pairs on both runtimes (SUMMARY's
//! `sequential_pairs_per_s` is the better of the two), concurrent pairs on the multi-thread one.
//! `ENGINE_BENCH_SCALE=0.2` makes a quick run.
//!
//! With `NODE_REDLOCK_DIR` naming a directory where `benches/compare/node-redlock` is installed (the script
//! `scripts/bench-vs-node-redlock.sh` does it), node-redlock v5 runs the same sequential pairs on the same
//! masters in the same run, and its figures are printed beside ours.

#[path = "../tests/support/mod.rs"]
mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::stream::{FuturesUnordered, StreamExt};
use redis::aio::MultiplexedConnection;
use redlock_operator::redlock::{
    AcquireOptions, DEFAULT_TOKEN_RETENTION, KeepPolicy, LockValue, Redlock, RedlockConfig, acquire_script,
    counter_key,
};
use support::redis_server::RedisCluster;
use tokio::time::Instant;

const TTL: Duration = Duration::from_secs(10);
const RELEASE_SCRIPT: &str =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0";

type BoxError = Box<dyn std::error::Error>;

/// `ENGINE_BENCH_SCALE` (default 1) scales every sample count and duration, for quick runs on a busy machine.
fn scale() -> f64 {
    std::env::var("ENGINE_BENCH_SCALE")
        .ok()
        .and_then(|value| value.parse::<f64>().ok())
        .filter(|scale| *scale > 0.0)
        .unwrap_or(1.0)
}

/// How long each throughput figure is measured.
fn throughput_window() -> Duration {
    Duration::from_secs_f64(2.0 * scale())
}

fn scaled(count: usize) -> usize {
    ((count as f64 * scale()).round() as usize).max(1)
}

#[derive(Clone, Copy, PartialEq)]
enum Flavor {
    CurrentThread,
    MultiThread,
}

impl Flavor {
    fn name(self) -> &'static str {
        match self {
            Self::CurrentThread => "current-thread",
            Self::MultiThread => "multi-thread",
        }
    }

    fn runtime(self) -> std::io::Result<tokio::runtime::Runtime> {
        match self {
            Self::CurrentThread => tokio::runtime::Builder::new_current_thread(),
            Self::MultiThread => tokio::runtime::Builder::new_multi_thread(),
        }
        .enable_all()
        .build()
    }
}

/// Sequential acquire/release against the raw fan-outs on one runtime.
struct Core {
    raw_quorum: Vec<Duration>,
    raw_all: Vec<Duration>,
    raw_release: Vec<Duration>,
    /// The acquire script fanned out raw (no engine): time to the 3rd reply.
    raw_script_quorum: Vec<Duration>,
    acquire: Vec<Duration>,
    release: Vec<Duration>,
    /// A key used before, proposing above the last token (the operator's path: its floor is in status).
    reused_with_floor: Vec<Duration>,
    /// A key used before, proposing token 1 (the `lock` command's path: refused, then proposed again).
    reused_memoryless: Vec<Duration>,
    /// A free permit of a semaphore of 16 with 8 held, proposing above each permit's last token (issue 23).
    permit: Vec<Duration>,
    /// A fair waiter's acquisition of a free key with an empty queue (issue 31: at most 1.1x one before the
    /// queue existed).
    fair: Vec<Duration>,
    /// A plain acquisition as it was before keys had a fair queue.
    before_the_queue: Vec<Duration>,
}

/// The semaphore measured beside plain acquisitions: this many permits, half of them held throughout.
const SEMAPHORE_PERMITS: u32 = 16;

fn main() -> Result<(), BoxError> {
    let cluster = RedisCluster::start(5)?;
    let mut cores = Vec::new();
    for flavor in [Flavor::CurrentThread, Flavor::MultiThread] {
        let core = flavor.runtime()?.block_on(core(&cluster, flavor.name()))?;
        cores.push((flavor, core));
    }
    let (sequential_multi, concurrent, raw_concurrent) =
        Flavor::MultiThread.runtime()?.block_on(throughput(&cluster))?;
    // Sequential pairs are latency-bound: the current-thread runtime (the `lock` command's) is measured too.
    let sequential_current = Flavor::CurrentThread.runtime()?.block_on(async {
        let engine = engine_on(&cluster).await?;
        sequential_pairs(&engine, "seq-current", throughput_window()).await
    })?;
    let (sequential_flavor, sequential) = if sequential_current >= sequential_multi {
        (Flavor::CurrentThread, sequential_current)
    } else {
        (Flavor::MultiThread, sequential_multi)
    };
    let (mut paused_acquire, mut paused_release) =
        Flavor::CurrentThread.runtime()?.block_on(paused(&cluster))?;
    let (mut restarted, mut steady) = Flavor::CurrentThread
        .runtime()?
        .block_on(after_restart(&cluster))?;
    let (mut lock_up, mut lock_paused) = lock_processes(&cluster)?;
    let node_redlock = node_redlock(&cluster)?;

    let p = |samples: &mut Vec<Duration>, q: f64| percentile(samples, q);
    let mut best: Option<(Flavor, f64)> = None;
    let mut raw_current_thread = Duration::ZERO;
    let mut release_ratio = 0.0;
    let mut best_permit: Option<f64> = None;
    let mut best_fair: Option<f64> = None;
    for (flavor, core) in &mut cores {
        let raw_q50 = p(&mut core.raw_quorum, 0.5);
        let acq50 = p(&mut core.acquire, 0.5);
        let raw_rel50 = p(&mut core.raw_release, 0.5);
        let rel50 = p(&mut core.release, 0.5);
        println!("{} runtime:", flavor.name());
        println!(
            "  raw SET NX PX fan-out: 3rd reply p50 {} p99 {}, 5th reply p50 {} p99 {}",
            ms(raw_q50),
            ms(p(&mut core.raw_quorum, 0.99)),
            ms(p(&mut core.raw_all, 0.5)),
            ms(p(&mut core.raw_all, 0.99))
        );
        println!(
            "  raw compare-and-delete fan-out (all replies): p50 {} p99 {}",
            ms(raw_rel50),
            ms(p(&mut core.raw_release, 0.99))
        );
        println!(
            "  acquire: p50 {} p99 {} ({:.2}x the raw 3rd reply)",
            ms(acq50),
            ms(p(&mut core.acquire, 0.99)),
            acq50.as_secs_f64() / raw_q50.as_secs_f64()
        );
        println!(
            "  release: p50 {} p99 {} ({:.2}x the raw delete fan-out)",
            ms(rel50),
            ms(p(&mut core.release, 0.99)),
            rel50.as_secs_f64() / raw_rel50.as_secs_f64()
        );
        let script50 = p(&mut core.raw_script_quorum, 0.5);
        println!(
            "  raw acquire-script fan-out: 3rd reply p50 {} ({:.2}x the raw SET's); ours {:.2}x the raw script's",
            ms(script50),
            script50.as_secs_f64() / raw_q50.as_secs_f64(),
            acq50.as_secs_f64() / script50.as_secs_f64()
        );
        let floor50 = p(&mut core.reused_with_floor, 0.5);
        let memoryless50 = p(&mut core.reused_memoryless, 0.5);
        println!(
            "  acquire of a key used before: above the caller's floor p50 {} ({:.2}x), proposing 1 (refused, then above the counters) p50 {} ({:.2}x)",
            ms(floor50),
            floor50.as_secs_f64() / raw_q50.as_secs_f64(),
            ms(memoryless50),
            memoryless50.as_secs_f64() / raw_q50.as_secs_f64()
        );
        let permit50 = p(&mut core.permit, 0.5);
        let permit_vs_plain = permit50.as_secs_f64() / acq50.as_secs_f64();
        println!(
            "  acquire of a free permit ({SEMAPHORE_PERMITS} permits, half held): p50 {} p99 {} ({permit_vs_plain:.2}x a plain acquisition)",
            ms(permit50),
            ms(p(&mut core.permit, 0.99)),
        );
        let fair50 = p(&mut core.fair, 0.5);
        let before50 = p(&mut core.before_the_queue, 0.5);
        let fair_vs_before = fair50.as_secs_f64() / before50.as_secs_f64();
        println!(
            "  uncontended fair acquire (a waiter, queue empty): p50 {} p99 {} ({fair_vs_before:.2}x an acquisition before the queue existed, p50 {}; {:.2}x a plain one today)",
            ms(fair50),
            ms(p(&mut core.fair, 0.99)),
            ms(before50),
            fair50.as_secs_f64() / acq50.as_secs_f64()
        );
        if best_fair.is_none_or(|best| fair_vs_before < best) {
            best_fair = Some(fair_vs_before);
        }
        if best_permit.is_none_or(|best| permit_vs_plain < best) {
            best_permit = Some(permit_vs_plain);
        }
        if *flavor == Flavor::CurrentThread {
            raw_current_thread = raw_q50;
            release_ratio = rel50.as_secs_f64() / raw_rel50.as_secs_f64();
        }
        if best.is_none_or(|(_, best)| acq50.as_secs_f64() < best) {
            best = Some((*flavor, acq50.as_secs_f64()));
        }
    }
    let (best_flavor, best_acquire) = best.unwrap_or((Flavor::CurrentThread, 0.0));
    let best_ratio = best_acquire / raw_current_thread.as_secs_f64();
    println!(
        "best acquire p50: {} runtime, {:.2}x the raw current-thread fan-out's 3rd reply",
        best_flavor.name(),
        best_ratio
    );
    println!(
        "with 2 of 5 masters paused (current-thread): acquire p50 {} p99 {}, release p50 {} p99 {}",
        ms(p(&mut paused_acquire, 0.5)),
        ms(p(&mut paused_acquire, 0.99)),
        ms(p(&mut paused_release, 0.5)),
        ms(p(&mut paused_release, 0.99))
    );
    let (up50, paused50) = (p(&mut lock_up, 0.5), p(&mut lock_paused, 0.5));
    println!(
        "`lock -- true`, whole process: all masters up p50 {} p99 {}, 2 of 5 paused p50 {} p99 {} (+{})",
        ms(up50),
        ms(p(&mut lock_up, 0.99)),
        ms(paused50),
        ms(p(&mut lock_paused, 0.99)),
        ms(paused50.saturating_sub(up50))
    );
    println!(
        "acquire+release pairs/s: sequential {sequential_current:.0} (current-thread), {sequential_multi:.0} (multi-thread); 64 concurrent tasks {concurrent:.0} (multi-thread)"
    );
    println!(
        "raw SET+delete fan-out pairs/s with 64 concurrent tasks: {raw_concurrent:.0} (ours {:.2}x of it)",
        concurrent / raw_concurrent
    );
    if let Some(line) = &node_redlock {
        println!(
            "node-redlock v5, same masters, {} sequential pairs: {line}",
            scaled(2_000)
        );
        println!(
            "ours beside it: best acquire p50 {} ({} runtime), sequential pairs/s {sequential:.0} ({} runtime)",
            ms(Duration::from_secs_f64(best_acquire)),
            best_flavor.name(),
            sequential_flavor.name()
        );
    }
    let restarted_vs_steady = p(&mut restarted, 0.5).as_secs_f64() / p(&mut steady, 0.5).as_secs_f64();
    println!(
        "acquire within an hour of the masters' restart (waits for all five counters): p50 {} p99 {}; decided at the first majority (masters up longer, or durable: every other figure's path): p50 {} p99 {}; {restarted_vs_steady:.2}x",
        ms(p(&mut restarted, 0.5)),
        ms(p(&mut restarted, 0.99)),
        ms(p(&mut steady, 0.5)),
        ms(p(&mut steady, 0.99)),
    );
    println!(
        "SUMMARY best_acquire_p50_vs_raw_current_thread={best_ratio:.2} release_p50_vs_raw={release_ratio:.2} paused2_acquire_p50_ms={:.3} paused2_release_p50_ms={:.3} lock_process_p50_ms_up={:.1} lock_process_p50_ms_paused2={:.1} concurrent_pairs_per_s={concurrent:.0} sequential_pairs_per_s={sequential:.0} permit_acquire_p50_vs_plain={:.2} fair_acquire_p50_vs_before_the_queue={:.2} restarted_acquire_p50_vs_steady={restarted_vs_steady:.2}",
        p(&mut paused_acquire, 0.5).as_secs_f64() * 1e3,
        p(&mut paused_release, 0.5).as_secs_f64() * 1e3,
        up50.as_secs_f64() * 1e3,
        paused50.as_secs_f64() * 1e3,
        best_permit.unwrap_or(0.0),
        best_fair.unwrap_or(0.0),
    );
    Ok(())
}

async fn engine_on(cluster: &RedisCluster) -> Result<Redlock, BoxError> {
    let mut config = RedlockConfig::from_urls(&cluster.urls())?;
    config.max_ttl = TTL;
    config.assume_durable = true; // fresh masters: skip the quarantine wait, it is not what we measure
    config.retry.attempts = 1;
    Ok(Redlock::connect(config).await?)
}

/// The engine as it acquired before keys had a fair queue: the same code, its acquisitions sent without the
/// queue's keys, so that the script decides as it did then (the negative control `skip_queue`, compiled into
/// benchmarks only).
async fn engine_before_the_queue(cluster: &RedisCluster) -> Result<Redlock, BoxError> {
    let mut config = RedlockConfig::from_urls(&cluster.urls())?;
    config.max_ttl = TTL;
    config.assume_durable = true;
    config.retry.attempts = 1;
    config.skip_queue = true;
    Ok(Redlock::connect(config).await?)
}

/// Raw and engine measurements alternate in small blocks, so that machine noise hits both alike.
/// Keys are prefixed by `run`: fencing counters outlive their keys, and a key a previous run used would cost
/// this one a refused proposal.
async fn core(cluster: &RedisCluster, run: &str) -> Result<Core, BoxError> {
    let engine = engine_on(cluster).await?;
    let before_the_queue = engine_before_the_queue(cluster).await?;
    let mut raw = Vec::new();
    for url in cluster.urls() {
        let client = redis::Client::open(url.as_str())?;
        let config = redis::AsyncConnectionConfig::new().set_response_timeout(None);
        raw.push(
            client
                .get_multiplexed_async_connection_with_config(&config)
                .await?,
        );
    }
    let acquire_sha = acquire_script().get_hash().to_owned();
    let release_sha = redis::Script::new(RELEASE_SCRIPT).get_hash().to_owned();
    for conn in &mut raw {
        redis::Script::new(RELEASE_SCRIPT)
            .prepare_invoke()
            .load_async(conn)
            .await?;
    }

    // Warm-up, not recorded.
    for i in 0..scaled(200) {
        raw_fan_out(&raw, &format!("{run}-warm-raw-{i}"), &release_sha, None).await?;
        raw_fan_out(
            &raw,
            &format!("{run}-warm-script-{i}"),
            &release_sha,
            Some(&acquire_sha),
        )
        .await?;
        let lease = engine
            .acquire(
                &format!("{run}-warm-{i}"),
                TTL,
                "bench",
                AcquireOptions::default(),
            )
            .await?;
        engine.release(&lease).await;
    }

    let mut core = Core {
        raw_quorum: Vec::new(),
        raw_all: Vec::new(),
        raw_release: Vec::new(),
        raw_script_quorum: Vec::new(),
        acquire: Vec::new(),
        release: Vec::new(),
        reused_with_floor: Vec::new(),
        reused_memoryless: Vec::new(),
        permit: Vec::new(),
        fair: Vec::new(),
        before_the_queue: Vec::new(),
    };
    // Half the permits are held by another holder for the whole run; the measured holder takes one of the
    // others each time, proposing above what that permit was last granted with (as the operator, whose status
    // keeps each permit's token, does).
    let semaphore = format!("{run}-semaphore");
    let mut permit_floors = vec![0i64; SEMAPHORE_PERMITS as usize];
    let mut held = Vec::new();
    while held.len() < (SEMAPHORE_PERMITS / 2) as usize {
        let lease = engine
            .acquire_permit(
                &semaphore,
                SEMAPHORE_PERMITS,
                TTL,
                "other",
                AcquireOptions::default(),
            )
            .await?;
        permit_floors[lease.permit() as usize] = lease.fencing_token();
        held.push(engine.keep(lease, KeepPolicy::for_ttl(TTL, Duration::from_millis(50))));
    }
    let mut last_token = 0;
    let mut key = 0u64;
    for _ in 0..scaled(20) {
        for _ in 0..100 {
            key += 1;
            let (quorum, all, release_time) =
                raw_fan_out(&raw, &format!("{run}-raw-{key}"), &release_sha, None).await?;
            core.raw_quorum.push(quorum);
            core.raw_all.push(all);
            core.raw_release.push(release_time);
            key += 1;
            let (quorum, ..) = raw_fan_out(
                &raw,
                &format!("{run}-script-{key}"),
                &release_sha,
                Some(&acquire_sha),
            )
            .await?;
            core.raw_script_quorum.push(quorum);
        }
        // Plain, fair and pre-queue acquisitions take turns, so that machine noise hits them alike.
        for round in 0..300 {
            key += 1;
            let fair = round % 3 == 1;
            let before = round % 3 == 2;
            let options = AcquireOptions {
                deadline: fair.then(|| Instant::now() + TTL),
                fair,
                ..AcquireOptions::default()
            };
            let acquirer = if before { &before_the_queue } else { &engine };
            let started = Instant::now();
            let lease = acquirer
                .acquire(&format!("{run}-ours-{key}"), TTL, "bench", options)
                .await?;
            if fair || before {
                let samples = if fair {
                    &mut core.fair
                } else {
                    &mut core.before_the_queue
                };
                samples.push(started.elapsed());
                acquirer.release(&lease).await;
                continue;
            }
            core.acquire.push(started.elapsed());
            let started = Instant::now();
            engine.release(&lease).await;
            core.release.push(started.elapsed());
        }
        for _ in 0..100 {
            let start = rand::random_range(0..SEMAPHORE_PERMITS);
            let value = LockValue::random("bench")?;
            let started = Instant::now();
            let lease = engine
                .try_acquire_permit(&semaphore, SEMAPHORE_PERMITS, TTL, value, &permit_floors, start)
                .await?;
            core.permit.push(started.elapsed());
            permit_floors[lease.permit() as usize] = lease.fencing_token();
            engine.release(&lease).await;
        }
        for round in 0..100 {
            let floor = if round % 2 == 0 { last_token } else { 0 };
            let options = AcquireOptions {
                token_floor: floor,
                fair: false,
                ..AcquireOptions::default()
            };
            let started = Instant::now();
            let lease = engine
                .acquire(&format!("{run}-reused"), TTL, "bench", options)
                .await?;
            let elapsed = started.elapsed();
            if floor == 0 {
                core.reused_memoryless.push(elapsed);
            } else {
                core.reused_with_floor.push(elapsed);
            }
            last_token = lease.fencing_token();
            engine.release(&lease).await;
        }
    }
    for kept in held {
        kept.release().await;
    }
    engine.settle().await;
    Ok(core)
}

async fn throughput(cluster: &RedisCluster) -> Result<(f64, f64, f64), BoxError> {
    let engine = engine_on(cluster).await?;
    let mut raw = Vec::new();
    for url in cluster.urls() {
        raw.push(
            redis::Client::open(url.as_str())?
                .get_multiplexed_async_connection()
                .await?,
        );
    }
    let release_sha = redis::Script::new(RELEASE_SCRIPT).get_hash().to_owned();
    let seconds = throughput_window();
    let sequential = sequential_pairs(&engine, "seq-multi", seconds).await?;
    let concurrent = concurrent_pairs(&engine, 64, seconds).await;
    let raw_concurrent = raw_concurrent_pairs(&raw, &release_sha, 64, seconds).await;
    Ok((sequential, concurrent, raw_concurrent))
}

/// Acquire and release on an engine connected before two masters were paused: their requests are sent and
/// never answered while paused.
async fn paused(cluster: &RedisCluster) -> Result<(Vec<Duration>, Vec<Duration>), BoxError> {
    let engine = engine_on(cluster).await?;
    cluster[3].stop();
    cluster[4].stop();
    let (mut acquire, mut release) = (Vec::new(), Vec::new());
    for i in 0..scaled(500) {
        let started = Instant::now();
        let lease = engine
            .acquire(&format!("paused-{i}"), TTL, "bench", AcquireOptions::default())
            .await?;
        acquire.push(started.elapsed());
        let started = Instant::now();
        engine.release(&lease).await;
        release.push(started.elapsed());
    }
    cluster[3].cont();
    cluster[4].cont();
    engine.settle().await;
    Ok((acquire, release))
}

/// Acquisitions on masters started less than an hour ago (all of them here), not durable: granted by a restarted
/// master, each waits for every master's fencing counter (issue 39); beside them, alternating, the same engine
/// deciding at the first majority, as it does on masters up longer (the switch `decide_before_counters`, compiled
/// into benchmarks only) and as every other figure here does (`assume_durable`). Keys are used once.
async fn after_restart(cluster: &RedisCluster) -> Result<(Vec<Duration>, Vec<Duration>), BoxError> {
    let ttl = Duration::from_secs(1);
    let engine = |decide_early: bool| {
        let mut config = RedlockConfig::from_urls(&cluster.urls())?;
        config.max_ttl = ttl;
        config.retry.attempts = 1;
        config.decide_before_counters = decide_early;
        Ok::<_, BoxError>(config)
    };
    let waiting = Redlock::connect(engine(false)?).await?;
    let deciding = Redlock::connect(engine(true)?).await?;
    // The masters have been up longer than this quarantine by now; a fresh one would sit it out first.
    let deadline = Instant::now() + Duration::from_secs(30);
    while (waiting.eligible() < 5 || deciding.eligible() < 5) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (mut restarted, mut steady) = (Vec::new(), Vec::new());
    for i in 0..scaled(500) {
        for (engine, samples, name) in [
            (&waiting, &mut restarted, "restarted"),
            (&deciding, &mut steady, "steady"),
        ] {
            let started = Instant::now();
            let lease = engine
                .acquire(&format!("{name}-{i}"), ttl, "bench", AcquireOptions::default())
                .await?;
            samples.push(started.elapsed());
            engine.release(&lease).await;
        }
    }
    waiting.settle().await;
    deciding.settle().await;
    Ok((restarted, steady))
}

/// The whole `redlock-operator lock -- true` process, with every master up and with two of five paused before
/// it starts (it never connected to them), alternating.
fn lock_processes(cluster: &RedisCluster) -> Result<(Vec<Duration>, Vec<Duration>), BoxError> {
    let run = |key: &str| -> Result<Duration, BoxError> {
        let started = std::time::Instant::now();
        let status = std::process::Command::new(env!("CARGO_BIN_EXE_redlock-operator"))
            .args([
                "lock",
                "--ttl",
                "1s",
                "--max-ttl",
                "1s",
                "--assume-durable",
                key,
                "--",
                "true",
            ])
            .env("REDLOCK_REDIS", cluster.urls().join(","))
            .env_remove("RUST_LOG")
            .stdin(std::process::Stdio::null())
            .status()?;
        let elapsed = started.elapsed();
        if !status.success() {
            return Err(format!("lock exited with {status}").into());
        }
        Ok(elapsed)
    };
    let (mut up, mut paused) = (Vec::new(), Vec::new());
    for i in 0..scaled(60) {
        up.push(run(&format!("process-up-{i}"))?);
        cluster[3].stop();
        cluster[4].stop();
        let result = run(&format!("process-paused-{i}"));
        cluster[3].cont();
        cluster[4].cont();
        paused.push(result?);
    }
    Ok((up, paused))
}

/// node-redlock v5's own figures on these masters, when it is installed (see the module's doc).
fn node_redlock(cluster: &RedisCluster) -> Result<Option<String>, BoxError> {
    let Some(dir) = std::env::var_os("NODE_REDLOCK_DIR") else {
        return Ok(None);
    };
    let output = std::process::Command::new("node")
        .arg("bench.mjs")
        .arg(scaled(2_000).to_string())
        .args(cluster.urls())
        .current_dir(dir)
        .output()?;
    if !output.status.success() {
        return Err(format!(
            "node-redlock benchmark failed: {}",
            String::from_utf8_lossy(&output.stderr)
        )
        .into());
    }
    Ok(String::from_utf8_lossy(&output.stdout)
        .lines()
        .find_map(|line| line.strip_prefix("NODE_REDLOCK "))
        .map(str::to_owned))
}

/// One raw fan-out of `SET NX PX` to all masters: time to the 3rd and the 5th reply; then a raw
/// compare-and-delete fan-out, timed to the last reply (as our release waits for all).
/// With `script`, the acquire script (EVALSHA, proposing token 1 on a fresh key) instead of `SET NX PX`: the
/// floor of an acquisition with fencing tokens.
async fn raw_fan_out(
    conns: &[MultiplexedConnection],
    key: &str,
    release_sha: &str,
    script: Option<&str>,
) -> Result<(Duration, Duration, Duration), BoxError> {
    let value = "bench|0123456789abcdef0123456789abcdef0123456789abcdef";
    let started = Instant::now();
    let mut replies: FuturesUnordered<_> = conns
        .iter()
        .map(|conn| {
            let mut conn = conn.clone();
            let key = key.to_owned();
            async move {
                let cmd = match script {
                    Some(sha) => {
                        let mut cmd = redis::cmd("EVALSHA");
                        cmd.arg(sha)
                            .arg(2)
                            .arg(&key)
                            .arg(counter_key(&key))
                            .arg(value)
                            .arg(TTL.as_millis() as u64)
                            .arg(1)
                            .arg(DEFAULT_TOKEN_RETENTION.as_millis() as u64);
                        cmd
                    }
                    None => {
                        let mut cmd = redis::cmd("SET");
                        cmd.arg(&key)
                            .arg(value)
                            .arg("NX")
                            .arg("PX")
                            .arg(TTL.as_millis() as u64);
                        cmd
                    }
                };
                cmd.query_async::<redis::Value>(&mut conn).await
            }
        })
        .collect();
    let mut quorum = Duration::ZERO;
    let mut count = 0;
    while let Some(reply) = replies.next().await {
        reply?;
        count += 1;
        if count == 3 {
            quorum = started.elapsed();
        }
    }
    let all = started.elapsed();
    let started = Instant::now();
    let deletes = conns.iter().map(|conn| {
        let mut conn = conn.clone();
        let key = key.to_owned();
        async move {
            redis::cmd("EVALSHA")
                .arg(release_sha)
                .arg(1)
                .arg(&key)
                .arg(value)
                .query_async::<i64>(&mut conn)
                .await
        }
    });
    for reply in futures::future::join_all(deletes).await {
        reply?;
    }
    Ok((quorum, all, started.elapsed()))
}

/// Each pair on a key never used before (`prefix` apart from other runs): a used key's fencing counter would make
/// the first proposal fail and measure the refused-then-granted path instead.
async fn sequential_pairs(engine: &Redlock, prefix: &str, duration: Duration) -> Result<f64, BoxError> {
    let started = Instant::now();
    let mut pairs = 0u64;
    while started.elapsed() < duration {
        let lease = engine
            .acquire(
                &format!("{prefix}-{pairs}"),
                TTL,
                "bench",
                AcquireOptions::default(),
            )
            .await?;
        engine.release(&lease).await;
        pairs += 1;
    }
    Ok(pairs as f64 / started.elapsed().as_secs_f64())
}

async fn concurrent_pairs(engine: &Redlock, tasks: usize, duration: Duration) -> f64 {
    let pairs = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let handles: Vec<_> = (0..tasks)
        .map(|task| {
            let engine = engine.clone();
            let pairs = pairs.clone();
            tokio::spawn(async move {
                let mut n = 0u64;
                while started.elapsed() < duration {
                    n += 1;
                    let key = format!("conc-{task}-{n}");
                    if let Ok(lease) = engine
                        .acquire(&key, TTL, "bench", AcquireOptions::default())
                        .await
                    {
                        engine.release(&lease).await;
                        pairs.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    for handle in handles {
        let _ = handle.await;
    }
    pairs.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64()
}

/// The physical limit for the concurrent figure: the same raw fan-outs as above from 64 tasks at once.
async fn raw_concurrent_pairs(
    conns: &[MultiplexedConnection],
    release_sha: &str,
    tasks: usize,
    duration: Duration,
) -> f64 {
    let pairs = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let handles: Vec<_> = (0..tasks)
        .map(|task| {
            let conns = conns.to_vec();
            let sha = release_sha.to_owned();
            let pairs = pairs.clone();
            tokio::spawn(async move {
                let mut n = 0u64;
                while started.elapsed() < duration {
                    n += 1;
                    if raw_fan_out(&conns, &format!("rawc-{task}-{n}"), &sha, None)
                        .await
                        .is_ok()
                    {
                        pairs.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    for handle in handles {
        let _ = handle.await;
    }
    pairs.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64()
}

fn percentile(samples: &mut [Duration], q: f64) -> Duration {
    if samples.is_empty() {
        return Duration::ZERO;
    }
    samples.sort_unstable();
    let index = ((samples.len() as f64 - 1.0) * q).round() as usize;
    samples[index]
}

fn ms(duration: Duration) -> String {
    format!("{:.3}ms", duration.as_secs_f64() * 1e3)
}
