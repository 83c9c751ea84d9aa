//! Hand-over to a queued lock (issue 41): a holder outside the operator (a `lock`-style engine in this process)
//! holds a lock's key while the `DistributedLock` waits in the key's queue; the holder releases, and the time
//! until the lock's status shows it held is measured, through a watch like any client's. Once with the operator
//! as built (woken at release) and once with the same binary polling only (`no-release-wakes`): the baseline,
//! in the same run. The release comes at a random moment of the lock's poll, as a real one would. Ends with
//! `SUMMARY_HANDOVER rounds=N woken_p50_ms=X woken_p99_ms=X polled_p50_ms=X polled_p99_ms=X` and
//! `RATIO woken/polled p50=X p99=X`.

use std::time::Duration;

use futures::TryStreamExt;
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use kube::runtime::watcher;
use rand::Rng;
use redlock_operator::api::{DistributedLock, LockPhase};
use redlock_operator::redlock::{AcquireOptions, Redlock, RedlockConfig};
use tokio::time::Instant;

use super::{BoxError, Cluster, Operator};

const NAMESPACE: &str = "handover";
const TTL: Duration = Duration::from_secs(10);

pub async fn run(rounds: usize) -> Result<(), BoxError> {
    println!("hand-over to a queued lock: {rounds} rounds, ttl 10s, five masters");
    let woken = measure(rounds, "").await?;
    let polled = measure(rounds, "no-release-wakes").await?;
    let (woken_p50, woken_p99) = (quantile(&woken, 0.5), quantile(&woken, 0.99));
    let (polled_p50, polled_p99) = (quantile(&polled, 0.5), quantile(&polled, 0.99));
    println!("  woken at release: p50 {woken_p50:.1} ms, p99 {woken_p99:.1} ms");
    println!("  polled only:      p50 {polled_p50:.1} ms, p99 {polled_p99:.1} ms");
    println!(
        "SUMMARY_HANDOVER rounds={rounds} woken_p50_ms={woken_p50:.1} woken_p99_ms={woken_p99:.1} polled_p50_ms={polled_p50:.1} polled_p99_ms={polled_p99:.1}"
    );
    println!(
        "RATIO woken/polled p50={:.3} p99={:.3}",
        woken_p50 / polled_p50.max(1e-9),
        woken_p99 / polled_p99.max(1e-9)
    );
    Ok(())
}

/// `rounds` hand-overs with the operator started with `controls`: release → status held, in ms.
async fn measure(rounds: usize, controls: &str) -> Result<Vec<f64>, BoxError> {
    let cluster = Cluster::start().await?;
    cluster.install().await?;
    let operator = Operator::start_with_controls(&cluster, controls).await?;
    let mut config = RedlockConfig::from_urls(&cluster.masters.urls())?;
    config.assume_durable = true;
    config.max_ttl = TTL;
    let engine = Redlock::connect(config).await?;
    let api: Api<DistributedLock> = Api::namespaced(cluster.client.clone(), NAMESPACE);
    let mut samples = Vec::with_capacity(rounds);
    for round in 0..rounds {
        let name = format!("queued-{round:03}");
        // The operator's key of a plain lock: namespace/name.
        let key = format!("{NAMESPACE}/{name}");
        let once = AcquireOptions {
            attempts: Some(1),
            ..AcquireOptions::default()
        };
        let lease = engine.acquire(&key, TTL, "outside", once).await?;
        let lock: DistributedLock = serde_json::from_value(serde_json::json!({
            "apiVersion": "redlock.io/v1beta1", "kind": "DistributedLock",
            "metadata": { "name": name },
            "spec": { "ttl": "10s", "holder": { "identity": "bench" } }
        }))?;
        api.create(&PostParams::default(), &lock).await?;
        let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
        let mut events = std::pin::pin!(watcher(api.clone(), config));
        wait_until(&mut events, |lock| {
            phase(lock) == Some(LockPhase::Contended)
                && lock.status.as_ref().and_then(|status| status.queue_place) == Some(1)
        })
        .await?;
        // At a random moment of the lock's poll (at most a second apart).
        let pause = rand::rng().random_range(0..1_000);
        tokio::time::sleep(Duration::from_millis(pause)).await;
        let released = Instant::now();
        engine.release(&lease).await;
        wait_until(&mut events, |lock| phase(lock) == Some(LockPhase::Held)).await?;
        samples.push(released.elapsed().as_secs_f64() * 1000.0);
        api.delete(&name, &DeleteParams::default()).await?;
    }
    operator.stop().await?;
    Ok(samples)
}

fn phase(lock: &DistributedLock) -> Option<LockPhase> {
    lock.status.as_ref().and_then(|status| status.phase)
}

async fn wait_until<S>(events: &mut S, done: impl Fn(&DistributedLock) -> bool) -> Result<(), BoxError>
where
    S: futures::Stream<Item = Result<watcher::Event<DistributedLock>, watcher::Error>> + Unpin,
{
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let event = tokio::time::timeout_at(deadline, events.try_next())
            .await
            .map_err(|_| "the lock never reached the expected state in 60 s")??;
        match event {
            Some(watcher::Event::Apply(lock) | watcher::Event::InitApply(lock)) if done(&lock) => {
                return Ok(());
            }
            Some(_) => {}
            None => return Err("the watch ended".into()),
        }
    }
}

fn quantile(samples: &[f64], quantile: f64) -> f64 {
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    let index = ((sorted.len() as f64 - 1.0) * quantile).round() as usize;
    sorted.get(index).copied().unwrap_or(f64::NAN)
}
