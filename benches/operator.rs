//! Operator scale benchmark: the real `redlock-operator run` binary holds N `DistributedLock`s (default
//! 10,000, ttl 10s) on five local masters, against the in-process test API server. Run with
//! `cargo bench --bench operator` (`OPERATOR_BENCH_LOCKS`, `OPERATOR_BENCH_SECONDS`, `OPERATOR_BENCH_PODS` to
//! change the size, the measuring window and the pods of other applications in the cluster). Memory is the
//! operator's resident set (VmRSS): idle, with the pods, and with the pods and the held locks.
//!
//! The operator runs as a child process, so its CPU time (from /proc) is its own, not the API server's or the
//! masters'. The baseline, measured in the same run, is the same binary idle with no lock. The last line is
//! `SUMMARY locks=N pods=N cpu_cores_avg=X lost=N extend_lag_p99_ms=X create_to_held_p50_ms=X rss_mib_idle=X
//! rss_mib_pods=X rss_mib_held=X`.

#[path = "../tests/support/mod.rs"]
mod support;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::PostParams;
use kube::runtime::watcher;
use kube::{Api, CustomResourceExt};
use redlock_operator::api::{DistributedLock, LockPhase, RedisQuorum};
use support::apiserver::TestApiServer;
use support::redis_server::RedisCluster;
use tokio::time::Instant;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

fn main() -> Result<(), BoxError> {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(bench())
}

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(default)
}

/// utime + stime of a process, in seconds.
fn cpu_seconds(pid: u32) -> Result<f64, BoxError> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // The command name may contain spaces; fields are counted after its closing parenthesis.
    let rest = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .ok_or("bad /proc stat")?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = fields.get(11).ok_or("no utime")?.parse::<f64>()?
        + fields.get(12).ok_or("no stime")?.parse::<f64>()?;
    let per_second = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)?.unwrap_or(100) as f64;
    Ok(ticks / per_second)
}

/// Resident memory of a process, in MiB.
fn rss_mib(pid: u32) -> Result<f64, BoxError> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kib: f64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next())
        .ok_or("no VmRSS")?
        .parse()?;
    Ok(kib / 1024.0)
}

/// `count` pods of a realistic size (a container with an environment, a status with conditions and container
/// statuses), in a namespace of their own: what a cluster-wide pod watch caches besides the locks' own pods.
async fn create_pods(client: &kube::Client, count: usize) -> Result<(), BoxError> {
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), "other-apps");
    futures::stream::iter(0..count)
        .map(|index| {
            let pods = pods.clone();
            async move {
                let env: Vec<serde_json::Value> = (0..20)
                    .map(|n| serde_json::json!({ "name": format!("SETTING_{n}"), "value": "x".repeat(64) }))
                    .collect();
                let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
                    "metadata": { "name": format!("app-{index:05}"), "namespace": "other-apps",
                                  "labels": { "app": "shop", "tier": "web" } },
                    "spec": { "containers": [{ "name": "app", "image": "registry.invalid/shop:1.2.3", "env": env,
                              "resources": { "requests": { "cpu": "100m", "memory": "128Mi" } } }] },
                    "status": { "phase": "Running", "podIP": "10.0.0.1",
                                "conditions": [{ "type": "Ready", "status": "True" }, { "type": "Initialized", "status": "True" }],
                                "containerStatuses": [{ "name": "app", "image": "shop:1.2.3", "imageID": "sha256:0", "ready": true, "restartCount": 0 }] }
                }))?;
                pods.create(&PostParams::default(), &pod).await?;
                Ok::<(), BoxError>(())
            }
        })
        .buffer_unordered(32)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(())
}

async fn cores_over(pid: u32, window: Duration) -> Result<f64, BoxError> {
    let cpu_before = cpu_seconds(pid)?;
    let started = Instant::now();
    tokio::time::sleep(window).await;
    Ok((cpu_seconds(pid)? - cpu_before) / started.elapsed().as_secs_f64())
}

async fn metrics_text(port: u16) -> Result<String, BoxError> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    stream
        .write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .await?;
    let mut text = String::new();
    stream.read_to_string(&mut text).await?;
    Ok(text)
}

fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find(|line| line.starts_with(name) && line[name.len()..].starts_with(' '))
        .and_then(|line| line.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0.0)
}

/// The p-th quantile of a Prometheus histogram, as the upper bound of the bucket it falls in.
fn histogram_quantile(text: &str, name: &str, quantile: f64) -> f64 {
    let prefix = format!("{name}_bucket{{le=\"");
    let buckets: Vec<(f64, f64)> = text
        .lines()
        .filter_map(|line| {
            let rest = line.strip_prefix(&prefix)?;
            let (bound, count) = rest.split_once("\"} ")?;
            let bound = if bound == "+Inf" {
                f64::INFINITY
            } else {
                bound.parse().ok()?
            };
            Some((bound, count.split_whitespace().next()?.parse().ok()?))
        })
        .collect();
    let total = buckets.last().map_or(0.0, |(_, count)| *count);
    buckets
        .iter()
        .find(|(_, count)| *count >= total * quantile)
        .map_or(0.0, |(bound, _)| *bound)
}

async fn bench() -> Result<(), BoxError> {
    let locks = env_number("OPERATOR_BENCH_LOCKS", 10_000) as usize;
    let window = Duration::from_secs(env_number("OPERATOR_BENCH_SECONDS", 60));
    let pods = env_number("OPERATOR_BENCH_PODS", 10_000) as usize;
    let masters = RedisCluster::start(5)?;
    let server = TestApiServer::start().await;
    let client = server.client();
    let dir = tempfile::tempdir()?;
    let kubeconfig = dir.path().join("kubeconfig");
    server.write_kubeconfig(&kubeconfig)?;
    let secret = dir.path().join("secret");
    std::fs::write(&secret, [42u8; 48])?;

    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in [RedisQuorum::crd(), DistributedLock::crd()] {
        crds.create(&PostParams::default(), &crd).await?;
    }
    let quorum: RedisQuorum = serde_json::from_value(serde_json::json!({
        "apiVersion": "redlock.io/v1alpha1", "kind": "RedisQuorum", "metadata": { "name": "default" },
        // Fresh masters: skip the restart quarantine, it is not what is measured here.
        "spec": { "endpoints": masters.urls(), "maxTtl": "10s", "assumeDurable": true }
    }))?;
    Api::<RedisQuorum>::all(client.clone())
        .create(&PostParams::default(), &quorum)
        .await?;

    let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let mut operator = tokio::process::Command::new(env!("CARGO_BIN_EXE_redlock-operator"))
        .args(["run", "--no-leader-election"])
        .arg("--metrics-addr")
        .arg(format!("127.0.0.1:{port}"))
        .arg("--installation-secret-file")
        .arg(&secret)
        .env("KUBECONFIG", &kubeconfig)
        .env("RUST_LOG", "error")
        .kill_on_drop(true)
        .spawn()?;
    let pid = operator.id().ok_or("operator exited")?;

    let quorums: Api<RedisQuorum> = Api::all(client.clone());
    let deadline = Instant::now() + Duration::from_secs(60);
    while quorums
        .get("default")
        .await?
        .status
        .and_then(|status| status.eligible)
        != Some(5)
    {
        if Instant::now() > deadline {
            return Err("the quorum never became available".into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let idle = cores_over(pid, Duration::from_secs(5)).await?;
    let rss_idle = rss_mib(pid)?;
    println!("baseline: the operator idle with no lock uses {idle:.4} cores and {rss_idle:.1} MiB");
    if pods > 0 {
        println!("creating {pods} pods of other applications …");
        create_pods(&client, pods).await?;
        // Let the pod watch take them all in.
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
    let rss_pods = rss_mib(pid)?;
    println!("with {pods} pods in the cluster: {rss_pods:.1} MiB");

    // Held instants, seen through a watch like any client would.
    let created: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let held: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let left_held = Arc::new(Mutex::new(0usize));
    let lock_api: Api<DistributedLock> = Api::namespaced(client.clone(), "bench");
    {
        let held = held.clone();
        let left_held = left_held.clone();
        let stream = watcher(lock_api.clone(), watcher::Config::default());
        tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            while let Ok(Some(event)) = stream.try_next().await {
                let objects = match event {
                    watcher::Event::Apply(lock) | watcher::Event::InitApply(lock) => vec![lock],
                    _ => continue,
                };
                for lock in objects {
                    let name = lock.metadata.name.clone().unwrap_or_default();
                    let is_held = lock.status.as_ref().and_then(|s| s.phase) == Some(LockPhase::Held);
                    let mut held = held.lock().unwrap_or_else(|p| p.into_inner());
                    if is_held {
                        held.entry(name).or_insert_with(Instant::now);
                    } else if held.contains_key(&name) {
                        *left_held.lock().unwrap_or_else(|p| p.into_inner()) += 1;
                    }
                }
            }
        });
    }

    println!("creating {locks} locks (ttl 10s) …");
    let creating = Instant::now();
    futures::stream::iter(0..locks)
        .map(|index| {
            let api = lock_api.clone();
            let created = created.clone();
            async move {
                let name = format!("lock-{index:05}");
                let lock: DistributedLock = serde_json::from_value(serde_json::json!({
                    "apiVersion": "redlock.io/v1alpha1", "kind": "DistributedLock",
                    "metadata": { "name": name, "namespace": "bench" },
                    "spec": { "ttl": "10s", "holder": { "identity": format!("holder-{index}") } }
                }))?;
                created
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(name, Instant::now());
                api.create(&PostParams::default(), &lock).await?;
                Ok::<(), BoxError>(())
            }
        })
        .buffer_unordered(32)
        .try_collect::<Vec<()>>()
        .await?;
    println!(
        "created in {:.1}s; waiting for every lock to be held …",
        creating.elapsed().as_secs_f64()
    );
    let deadline = Instant::now() + Duration::from_secs(600);
    let mut last_report = Instant::now();
    loop {
        let count = held.lock().unwrap_or_else(|p| p.into_inner()).len();
        if count >= locks {
            break;
        }
        if Instant::now() > deadline {
            return Err(format!("only {count} of {locks} locks held after 10 minutes").into());
        }
        if last_report.elapsed() > Duration::from_secs(5) {
            println!("  {count} of {locks} held");
            last_report = Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let all_held_after = creating.elapsed();
    let mut create_to_held: Vec<f64> = {
        let created = created.lock().unwrap_or_else(|p| p.into_inner());
        let held = held.lock().unwrap_or_else(|p| p.into_inner());
        created
            .iter()
            .filter_map(|(name, at)| {
                Some(held.get(name)?.saturating_duration_since(*at).as_secs_f64() * 1000.0)
            })
            .collect()
    };
    create_to_held.sort_by(f64::total_cmp);
    let p50 = create_to_held
        .get(create_to_held.len() / 2)
        .copied()
        .unwrap_or(0.0);
    println!(
        "all {locks} held {:.1}s after the first create; create→held p50 {p50:.0} ms",
        all_held_after.as_secs_f64()
    );

    // Let the initial burst of acquisitions and Events settle, then measure steady holding.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let lost_before = metric(&metrics_text(port).await?, "redlock_locks_lost_total");
    println!("measuring {}s of steady holding …", window.as_secs());
    let cores = cores_over(pid, window).await?;
    let text = metrics_text(port).await?;
    let lost = metric(&text, "redlock_locks_lost_total") as u64;
    let dropped = *left_held.lock().unwrap_or_else(|p| p.into_inner());
    let lag_p99_ms = histogram_quantile(&text, "redlock_extend_lag_seconds", 0.99) * 1000.0;
    let extensions = metric(&text, "redlock_extensions_total");
    let still_held = metric(&text, "redlock_locks_held");
    let rss_held = rss_mib(pid)?;
    println!(
        "steady state: {cores:.3} cores ({:.1}x idle), {extensions:.0} extensions in all, locks held {still_held:.0}, lost during the window {}, status left Held {dropped} times",
        cores / idle.max(1e-6),
        lost as f64 - lost_before
    );
    if let Ok(Some(status)) = operator.try_wait() {
        return Err(format!("the operator exited during the run: {status}").into());
    }
    operator.start_kill()?;
    println!(
        "memory: {rss_idle:.1} MiB idle, {rss_pods:.1} MiB with {pods} pods, {rss_held:.1} MiB with them and {locks} held locks"
    );
    println!(
        "SUMMARY locks={locks} pods={pods} cpu_cores_avg={cores:.3} lost={} extend_lag_p99_ms={lag_p99_ms:.1} create_to_held_p50_ms={p50:.0} rss_mib_idle={rss_idle:.1} rss_mib_pods={rss_pods:.1} rss_mib_held={rss_held:.1}",
        lost + dropped as u64
    );
    Ok(())
}
