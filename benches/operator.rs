//! Operator scale benchmark: the real `redlock-operator run` binary holds N `DistributedLock`s (default
//! 10,000, ttl 10s) on five local masters, against the in-process test API server. Run with
//! `cargo bench --bench operator` (`OPERATOR_BENCH_LOCKS`, `OPERATOR_BENCH_SECONDS`, `OPERATOR_BENCH_PODS` to
//! change the size, the measuring window and the pods of other applications in the cluster). Memory is the
//! operator's resident set (VmRSS): idle, with the pods, and with the pods and the held locks.
//!
//! The operator runs as a child process, so its CPU time (from /proc) is its own, not the API server's or the
//! masters'. The baseline, measured in the same run, is the same binary idle with no lock. The last line is
//! `SUMMARY locks=N pods=N cpu_cores_avg=X lost=N extend_lag_p99_ms=X create_to_held_p50_ms=X rss_mib_idle=X
//! rss_mib_pods=X rss_mib_held=X events_per_s_idle=X events_per_s_after=X event_cpu_s_per_1000_idle=X
//! event_cpu_s_per_1000_after=X recorder_{kube,ours}_per_s_{idle,after}=X
//! recorder_{kube,ours}_cpu_s_per_1000_{idle,after}=X`.
//!
//! Events: `OPERATOR_BENCH_EVENTS` (default 3,000: about a second of acquisitions, long enough for the steady
//! holding's waves of extensions and status writes to average out) more locks are created once with the
//! operator idle (the baseline) and once just after the N acquisitions (whose `Acquired` Events an event
//! recorder may still be keeping for its series); each acquisition publishes one `Acquired` Event. For each
//! it prints the Events published per second (counted by the API server) and the operator's CPU-seconds per
//! 1,000 of them (the acquisitions with their Events, less the background CPU of the idle operator or of the
//! steady holding measured below). Before the operator starts, the two Event recorders are measured alone
//! (see `operator/recorders.rs`). `OPERATOR_BENCH_BINARY` runs another build of the operator (an older one,
//! to compare in the same session).

#[path = "operator/recorders.rs"]
mod recorders;
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

/// Operator CPU and wall time spent on one batch of acquisitions and their Events.
struct EventBurst {
    events: u64,
    seconds: f64,
    cpu_seconds: f64,
}

impl EventBurst {
    fn per_second(&self) -> f64 {
        self.events as f64 / self.seconds.max(1e-9)
    }

    /// CPU-seconds per 1,000 Events, less `background_cores` over the burst's duration.
    fn cpu_per_thousand(&self, background_cores: f64) -> f64 {
        let own = (self.cpu_seconds - background_cores * self.seconds).max(0.0);
        own * 1000.0 / (self.events.max(1) as f64)
    }
}

fn events_published(server: &TestApiServer) -> u64 {
    server.request_count("create", "events") + server.request_count("patch", "events")
}

/// Creates `count` locks in `namespace` and measures until the operator has published an Event for each (its
/// `Acquired`); then deletes them and waits until they are gone (not measured).
async fn event_burst(
    server: &TestApiServer,
    client: &kube::Client,
    pid: u32,
    namespace: &str,
    count: usize,
) -> Result<EventBurst, BoxError> {
    let api: Api<DistributedLock> = Api::namespaced(client.clone(), namespace);
    let events_before = events_published(server);
    let cpu_before = cpu_seconds(pid)?;
    let started = Instant::now();
    create_locks(&api, count, None).await?;
    let deadline = Instant::now() + Duration::from_secs(600);
    let events = loop {
        let events = events_published(server) - events_before;
        if events >= count as u64 {
            break events;
        }
        if Instant::now() > deadline {
            return Err(format!("only {events} of {count} Events after 10 minutes").into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let burst = EventBurst {
        events,
        seconds: started.elapsed().as_secs_f64(),
        cpu_seconds: cpu_seconds(pid)? - cpu_before,
    };
    api.delete_collection(&Default::default(), &Default::default())
        .await?;
    let deadline = Instant::now() + Duration::from_secs(600);
    while !api.list(&Default::default()).await?.items.is_empty() {
        if Instant::now() > deadline {
            return Err(format!("the locks in {namespace} were not deleted after 10 minutes").into());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(burst)
}

/// Creates locks `lock-00000` … in the API's namespace (ttl 10s), 32 at a time, noting when each was sent.
async fn create_locks(
    api: &Api<DistributedLock>,
    count: usize,
    created: Option<&Mutex<HashMap<String, Instant>>>,
) -> Result<(), BoxError> {
    futures::stream::iter(0..count)
        .map(|index| async move {
            let name = format!("lock-{index:05}");
            let lock: DistributedLock = serde_json::from_value(serde_json::json!({
                "apiVersion": "redlock.io/v1alpha1", "kind": "DistributedLock",
                "metadata": { "name": name },
                "spec": { "ttl": "10s", "holder": { "identity": format!("holder-{index}") } }
            }))?;
            if let Some(created) = created {
                created
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(name, Instant::now());
            }
            api.create(&PostParams::default(), &lock).await?;
            Ok::<(), BoxError>(())
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
    let event_count = env_number("OPERATOR_BENCH_EVENTS", 3_000) as usize;
    let masters = RedisCluster::start(5)?;
    let server = TestApiServer::start().await;
    let client = server.client();
    let dir = tempfile::tempdir()?;
    let kubeconfig = dir.path().join("kubeconfig");
    server.write_kubeconfig(&kubeconfig)?;
    let secret = dir.path().join("secret");
    std::fs::write(&secret, [42u8; 48])?;

    println!(
        "the Event recorders alone (three rounds each, alternating, summed; 32 publishes at a time; CPU of the publishing thread):"
    );
    let [kube_recorder, our_recorder] = recorders::measure(&server, event_count, locks).await?;
    println!("  {}", recorders::describe("kube-runtime's", &kube_recorder));
    println!("  {}", recorders::describe("the operator's", &our_recorder));

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
    let binary = std::env::var_os("OPERATOR_BENCH_BINARY")
        .unwrap_or_else(|| env!("CARGO_BIN_EXE_redlock-operator").into());
    let mut operator = tokio::process::Command::new(binary)
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
    let events_idle = event_burst(&server, &client, pid, "events-idle", event_count).await?;
    let event_cpu_idle = events_idle.cpu_per_thousand(idle);
    println!(
        "Events with the operator idle (baseline): {} in {:.1}s, {:.0} per second, {event_cpu_idle:.3} CPU-s per 1,000",
        events_idle.events,
        events_idle.seconds,
        events_idle.per_second()
    );
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
    create_locks(&lock_api, locks, Some(&created)).await?;
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

    // Let the initial burst of acquisitions and Events settle, publish more, then measure steady holding.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let events_after = event_burst(&server, &client, pid, "events-after", event_count).await?;
    tokio::time::sleep(Duration::from_secs(5)).await;
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
    let event_cpu_after = events_after.cpu_per_thousand(cores);
    println!(
        "Events just after {locks} acquisitions: {} in {:.1}s, {:.0} per second ({:.2}x the baseline), {event_cpu_after:.3} CPU-s per 1,000 ({:.2}x the baseline)",
        events_after.events,
        events_after.seconds,
        events_after.per_second(),
        events_after.per_second() / events_idle.per_second().max(1e-9),
        event_cpu_after / event_cpu_idle.max(1e-9),
    );
    if let Ok(Some(status)) = operator.try_wait() {
        return Err(format!("the operator exited during the run: {status}").into());
    }
    operator.start_kill()?;
    println!(
        "memory: {rss_idle:.1} MiB idle, {rss_pods:.1} MiB with {pods} pods, {rss_held:.1} MiB with them and {locks} held locks"
    );
    println!(
        "SUMMARY locks={locks} pods={pods} cpu_cores_avg={cores:.3} lost={} extend_lag_p99_ms={lag_p99_ms:.1} create_to_held_p50_ms={p50:.0} rss_mib_idle={rss_idle:.1} rss_mib_pods={rss_pods:.1} rss_mib_held={rss_held:.1} events_per_s_idle={:.0} events_per_s_after={:.0} event_cpu_s_per_1000_idle={event_cpu_idle:.3} event_cpu_s_per_1000_after={event_cpu_after:.3} recorder_kube_per_s_idle={:.0} recorder_kube_per_s_after={:.0} recorder_kube_cpu_s_per_1000_idle={:.3} recorder_kube_cpu_s_per_1000_after={:.3} recorder_ours_per_s_idle={:.0} recorder_ours_per_s_after={:.0} recorder_ours_cpu_s_per_1000_idle={:.3} recorder_ours_cpu_s_per_1000_after={:.3}",
        lost + dropped as u64,
        events_idle.per_second(),
        events_after.per_second(),
        kube_recorder.idle.per_second(),
        kube_recorder.after.per_second(),
        kube_recorder.idle.cpu_per_thousand(),
        kube_recorder.after.cpu_per_thousand(),
        our_recorder.idle.per_second(),
        our_recorder.after.per_second(),
        our_recorder.idle.cpu_per_thousand(),
        our_recorder.after.cpu_per_thousand(),
    );
    Ok(())
}
