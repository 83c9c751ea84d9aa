//! Engine benchmark: our acquire/release against the physical limit measured in the same run on the same five
//! local masters — a raw parallel `SET NX PX` fan-out and a raw parallel compare-and-delete on the same kind of
//! multiplexed connections. Run with `cargo bench --bench engine`; the last line is the SUMMARY.
//!
//! Raw and engine measurements alternate in small blocks, so that machine noise hits both alike.

#[path = "../tests/support/mod.rs"]
mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::stream::{FuturesUnordered, StreamExt};
use redis::aio::MultiplexedConnection;
use redlock_operator::redlock::{AcquireOptions, Redlock, RedlockConfig};
use support::redis_server::RedisCluster;
use tokio::time::Instant;

const TTL: Duration = Duration::from_secs(10);
const BLOCKS: usize = 20;
const PER_BLOCK: usize = 100;
const RELEASE_SCRIPT: &str =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0";

type BoxError = Box<dyn std::error::Error>;

fn main() -> Result<(), BoxError> {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(bench())
}

async fn bench() -> Result<(), BoxError> {
    let cluster = RedisCluster::start(5)?;
    let mut config = RedlockConfig::from_urls(&cluster.urls())?;
    config.max_ttl = TTL;
    config.assume_durable = true; // fresh masters: skip the quarantine wait, it is not what we measure
    config.retry.attempts = 1;
    let engine = Redlock::connect(config).await?;
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
    let release_sha = redis::Script::new(RELEASE_SCRIPT).get_hash().to_owned();
    for conn in &mut raw {
        redis::Script::new(RELEASE_SCRIPT)
            .prepare_invoke()
            .load_async(conn)
            .await?;
    }

    // Warm-up, not recorded.
    for i in 0..200 {
        raw_fan_out(&raw, &format!("warm-raw-{i}"), &release_sha).await?;
        let lease = engine
            .acquire(&format!("warm-{i}"), TTL, "bench", AcquireOptions::default())
            .await?;
        engine.release(&lease).await;
    }

    let (mut raw_quorum, mut raw_all, mut raw_release) = (Vec::new(), Vec::new(), Vec::new());
    let (mut acquire, mut release) = (Vec::new(), Vec::new());
    let mut key = 0u64;
    for _ in 0..BLOCKS {
        for _ in 0..PER_BLOCK {
            key += 1;
            let (quorum, all, release_time) = raw_fan_out(&raw, &format!("raw-{key}"), &release_sha).await?;
            raw_quorum.push(quorum);
            raw_all.push(all);
            raw_release.push(release_time);
        }
        for _ in 0..PER_BLOCK {
            key += 1;
            let started = Instant::now();
            let lease = engine
                .acquire(&format!("ours-{key}"), TTL, "bench", AcquireOptions::default())
                .await?;
            acquire.push(started.elapsed());
            let started = Instant::now();
            engine.release(&lease).await;
            release.push(started.elapsed());
        }
    }

    let sequential = sequential_pairs(&engine, Duration::from_secs(2)).await?;
    let concurrent = concurrent_pairs(&engine, 64, Duration::from_secs(2)).await;
    let raw_concurrent = raw_concurrent_pairs(&raw, &release_sha, 64, Duration::from_secs(2)).await;

    cluster[3].stop();
    cluster[4].stop();
    let mut paused = Vec::new();
    for i in 0..500 {
        let started = Instant::now();
        let lease = engine
            .acquire(&format!("paused-{i}"), TTL, "bench", AcquireOptions::default())
            .await?;
        paused.push(started.elapsed());
        engine.release(&lease).await;
    }
    cluster[3].cont();
    cluster[4].cont();

    let p = |samples: &mut Vec<Duration>, q: f64| percentile(samples, q);
    let raw_q50 = p(&mut raw_quorum, 0.5);
    let raw_rel50 = p(&mut raw_release, 0.5);
    let acq50 = p(&mut acquire, 0.5);
    let rel50 = p(&mut release, 0.5);
    println!(
        "raw SET NX PX fan-out: 3rd reply p50 {} p99 {}, 5th reply p50 {} p99 {}",
        ms(raw_q50),
        ms(p(&mut raw_quorum, 0.99)),
        ms(p(&mut raw_all, 0.5)),
        ms(p(&mut raw_all, 0.99))
    );
    println!(
        "raw compare-and-delete fan-out: p50 {} p99 {}",
        ms(raw_rel50),
        ms(p(&mut raw_release, 0.99))
    );
    println!("acquire: p50 {} p99 {}", ms(acq50), ms(p(&mut acquire, 0.99)));
    println!("release: p50 {} p99 {}", ms(rel50), ms(p(&mut release, 0.99)));
    println!(
        "acquire with 2 of 5 masters paused: p50 {} p99 {}",
        ms(p(&mut paused, 0.5)),
        ms(p(&mut paused, 0.99))
    );
    println!("acquire+release pairs/s: sequential {sequential:.0}, 64 concurrent tasks {concurrent:.0}");
    println!(
        "raw SET+delete fan-out pairs/s with 64 concurrent tasks: {raw_concurrent:.0} (ours {:.2}x of it)",
        concurrent / raw_concurrent
    );
    println!(
        "SUMMARY acquire_p50_vs_raw_quorum={:.2} release_p50_vs_raw={:.2} paused2_acquire_p50_ms={:.3} concurrent_pairs_per_s={:.0} sequential_pairs_per_s={:.0}",
        acq50.as_secs_f64() / raw_q50.as_secs_f64(),
        rel50.as_secs_f64() / raw_rel50.as_secs_f64(),
        p(&mut paused, 0.5).as_secs_f64() * 1e3,
        concurrent,
        sequential
    );
    Ok(())
}

/// One raw fan-out of `SET NX PX` to all masters: time to the 3rd and the 5th reply; then a raw
/// compare-and-delete fan-out, timed to the last reply (as our release waits for all).
async fn raw_fan_out(
    conns: &[MultiplexedConnection],
    key: &str,
    release_sha: &str,
) -> Result<(Duration, Duration, Duration), BoxError> {
    let value = "bench|0123456789abcdef0123456789abcdef0123456789abcdef";
    let started = Instant::now();
    let mut replies: FuturesUnordered<_> = conns
        .iter()
        .map(|conn| {
            let mut conn = conn.clone();
            let key = key.to_owned();
            async move {
                redis::cmd("SET")
                    .arg(&key)
                    .arg(value)
                    .arg("NX")
                    .arg("PX")
                    .arg(TTL.as_millis() as u64)
                    .query_async::<redis::Value>(&mut conn)
                    .await
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

async fn sequential_pairs(engine: &Redlock, duration: Duration) -> Result<f64, BoxError> {
    let started = Instant::now();
    let mut pairs = 0u64;
    while started.elapsed() < duration {
        let lease = engine
            .acquire(&format!("seq-{pairs}"), TTL, "bench", AcquireOptions::default())
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
                    if raw_fan_out(&conns, &format!("rawc-{task}-{n}"), &sha)
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
