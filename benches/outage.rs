//! API-server outage benchmark (issue: "locks that survive the control plane"): the operator holds many locks, its
//! API traffic is cut at a TCP proxy for a long outage, and the benchmark checks Redis throughout and status after.
//! Target: a one-minute outage with 1,000 locks held loses no key in Redis, hands out no new token, and every
//! lock's status is fresh (Held, `validUntil` in the future) within 2 s after the API server answers again. The
//! baseline, measured in the same run, is the floor of refreshing that many statuses: as many writes to the
//! same API server from a plain client, 64 at a time. Run with `cargo bench --bench outage`
//! (`OUTAGE_BENCH_LOCKS`, `OUTAGE_BENCH_SECONDS`); the last line is
//! `SUMMARY locks=N outage_s=S keys_lost=N new_tokens=N fresh_after_ms=X baseline_writes_ms=X ratio=R`.

#[path = "../tests/support/mod.rs"]
mod support;

mod common;

use std::time::Duration;

use common::{BoxError, create, install_with_default_quorum};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::Timestamp;
use kube::api::ListParams;
use kube::{Api, Client};
use redlock_operator::api::{DistributedLock, LockPhase};
use redlock_operator::controller::installation_secret::InstallationSecret;
use redlock_operator::controller::replica_lease::LeaseTiming;
use redlock_operator::controller::run::{ElectionOptions, RunOptions, start};
use support::apiserver::TestApiServer;
use support::fault_proxy::FaultProxy;
use support::redis_server::RedisCluster;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

const NAMESPACE: &str = "bench";

fn main() -> Result<(), BoxError> {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(bench())
}

fn setting(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(default)
}

/// `count` writes, 64 at a time, from a plain client: the floor of refreshing that many statuses.
async fn baseline_writes(client: &Client, count: u64) -> Result<Duration, BoxError> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), "baseline");
    let started = Instant::now();
    futures::stream::iter(0..count)
        .map(|index| {
            let leases = leases.clone();
            async move {
                create(
                    &leases,
                    serde_json::json!({ "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                        "metadata": { "name": format!("l-{index}") }, "spec": { "holderIdentity": "x" } }),
                )
                .await
            }
        })
        .buffer_unordered(64)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(started.elapsed())
}

/// Per lock name, whether a majority of masters hold exactly the value they held when the outage began.
async fn keys_intact(
    masters: &RedisCluster,
    names: &[String],
    before: &[Vec<Option<String>>],
) -> Result<usize, BoxError> {
    let keys: Vec<String> = names.iter().map(|name| format!("{NAMESPACE}/{name}")).collect();
    let now = values(masters, &keys).await?;
    let lost = (0..keys.len())
        .filter(|&key| {
            let same = (0..now.len())
                .filter(|&master| now[master][key].is_some() && now[master][key] == before[master][key])
                .count();
            same <= now.len() / 2
        })
        .count();
    Ok(lost)
}

/// Every master's value of every key (MGET per master).
async fn values(masters: &RedisCluster, keys: &[String]) -> Result<Vec<Vec<Option<String>>>, BoxError> {
    let mut all = Vec::new();
    for url in masters.urls() {
        let mut conn = redis::Client::open(url.as_str())?
            .get_multiplexed_async_connection()
            .await?;
        let mut per_master = Vec::with_capacity(keys.len());
        for chunk in keys.chunks(500) {
            let got: Vec<Option<String>> = redis::cmd("MGET").arg(chunk).query_async(&mut conn).await?;
            per_master.extend(got);
        }
        all.push(per_master);
    }
    Ok(all)
}

async fn bench() -> Result<(), BoxError> {
    if std::env::var_os("RUST_LOG").is_some() {
        redlock_operator::telemetry::init(redlock_operator::telemetry::LogFormat::Text, "warn");
    }
    let count = setting("OUTAGE_BENCH_LOCKS", 1_000);
    let outage = Duration::from_secs(setting("OUTAGE_BENCH_SECONDS", 60));
    let masters = RedisCluster::start(3)?;
    let server = TestApiServer::start().await;
    let client: Client = server.client();
    let baseline = baseline_writes(&client, count).await?;
    install_with_default_quorum(&client, &masters).await?;

    let upstream = server.url().trim_start_matches("http://").parse()?;
    let proxy = FaultProxy::start(upstream).await?;
    let proxied = Client::try_from(kube::Config::new(format!("http://{}", proxy.addr()).parse()?))?;
    let shutdown = CancellationToken::new();
    let running = start(
        proxied,
        RunOptions {
            metrics_addr: "127.0.0.1:0".parse()?,
            reports_addr: Some("127.0.0.1:0".parse()?),
            reports_max_connections: redlock_operator::report_channel::server::MAX_CONNECTIONS as usize,
            reports_key: Default::default(),
            election: Some(ElectionOptions {
                namespace: NAMESPACE.into(),
                lease_name: "redlock-operator".into(),
                identity: "bench".into(),
                timing: LeaseTiming::for_lease_duration(Duration::from_secs(4)),
            }),
            secret: InstallationSecret::from_bytes(&[b'k'; 48])?,
            secrets_namespace: NAMESPACE.into(),
            health_interval: Duration::from_secs(5),
            instance: "bench".into(),
            installation: None,
            scope: Default::default(),
            hand_over_url: None,
        },
        shutdown.clone(),
    )
    .await?;
    let locks: Api<DistributedLock> = Api::namespaced(client.clone(), NAMESPACE);
    let names: Vec<String> = (0..count).map(|index| format!("lock-{index}")).collect();
    futures::stream::iter(names.clone())
        .map(|name| {
            let locks = locks.clone();
            async move {
                create(
                    &locks,
                    serde_json::json!({ "apiVersion": "redlock.io/v1beta1", "kind": "DistributedLock",
                        "metadata": { "name": name }, "spec": { "ttl": "10s", "holder": { "identity": format!("holder-{name}") } } }),
                )
                .await
            }
        })
        .buffer_unordered(64)
        .try_collect::<Vec<()>>()
        .await?;
    let held = |list: &[DistributedLock], after: Timestamp| {
        list.iter()
            .filter(|lock| {
                let status = lock.status.clone().unwrap_or_default();
                status.phase == Some(LockPhase::Held)
                    && status.valid_until.is_some_and(|until| until.0 > after)
            })
            .count()
    };
    let deadline = Instant::now() + Duration::from_secs(300);
    while held(&locks.list(&ListParams::default()).await?.items, Timestamp::now()) < names.len() {
        if Instant::now() > deadline {
            return Err("the locks were not all held within 5 minutes".into());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let keys: Vec<String> = names.iter().map(|name| format!("{NAMESPACE}/{name}")).collect();
    let before = values(&masters, &keys).await?;
    println!(
        "{count} locks held; cutting the operator off the API server for {}s",
        outage.as_secs()
    );

    proxy.refuse(true);
    proxy.cut_all();
    let cut_at = Instant::now();
    let mut keys_lost = 0;
    while cut_at.elapsed() < outage {
        keys_lost = keys_lost.max(keys_intact(&masters, &names, &before).await?);
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    proxy.heal();
    let healed_at = Instant::now();
    let healed_wall = Timestamp::now();
    let fresh_after = loop {
        let list = locks.list(&ListParams::default()).await?.items;
        if held(&list, healed_wall) == names.len() {
            break healed_at.elapsed();
        }
        if healed_at.elapsed() > Duration::from_secs(120) {
            return Err("statuses were not fresh within 2 minutes of the API server answering".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    keys_lost = keys_lost.max(keys_intact(&masters, &names, &before).await?);
    let new_tokens = locks
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .filter(|lock| lock.status.as_ref().and_then(|status| status.fencing_token) != Some(1))
        .count();
    shutdown.cancel();
    let _ = running.task.await;
    let fresh_ms = fresh_after.as_secs_f64() * 1000.0;
    let baseline_ms = baseline.as_secs_f64() * 1000.0;
    println!(
        "outage of {}s: {keys_lost} keys lost, {new_tokens} new tokens; every status fresh {fresh_ms:.0} ms after the API server answered; {count} plain writes: {baseline_ms:.0} ms",
        outage.as_secs()
    );
    println!(
        "SUMMARY locks={count} outage_s={} keys_lost={keys_lost} new_tokens={new_tokens} fresh_after_ms={fresh_ms:.0} baseline_writes_ms={baseline_ms:.0} ratio={:.1}",
        outage.as_secs(),
        fresh_ms / baseline_ms.max(1e-3)
    );
    Ok(())
}
