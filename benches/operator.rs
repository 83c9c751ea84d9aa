//! Operator scale benchmark: the real `redlock-operator run` binary holds N `DistributedLock`s (default
//! 10,000, ttl 10s) on five local masters, against the in-process test API server; then, in the same run, a
//! fresh binary on fresh masters and a fresh API server holds M semaphores of P permits each (default 1,000
//! of 10: as many permits as single locks). Run with `cargo bench --bench operator` (`OPERATOR_BENCH_LOCKS`,
//! `OPERATOR_BENCH_SECONDS`, `OPERATOR_BENCH_PODS` to change the size, the measuring window and the pods of
//! other applications in the cluster; `OPERATOR_BENCH_SEMAPHORES` and `OPERATOR_BENCH_PERMITS` the semaphore
//! run's size; either count set to 0 leaves that run out; `OPERATOR_BENCH_WAIT_SECONDS`, default 600, how
//! long a run waits for all its locks to be held). Memory is the operator's resident set (VmRSS): idle, with
//! the pods, and with the pods and the held locks.
//!
//! The operator runs as a child process, so its CPU time (from /proc) is its own, not the API server's or the
//! masters'. The baseline, measured in the same run, is the same binary idle with no lock. The single-lock
//! run ends with `SUMMARY locks=N pods=N cpu_cores_avg=X lost=N extend_lag_p99_ms=X create_to_held_p50_ms=X
//! idle_create_to_held_p50_ms=X rss_mib_idle=X rss_mib_pods=X rss_mib_held=X events_per_s_idle=X events_per_s_after=X
//! event_cpu_s_per_1000_idle=X event_cpu_s_per_1000_after=X recorder_{kube,ours}_per_s_{idle,after}=X
//! recorder_{kube,ours}_cpu_s_per_1000_{idle,after}=X`.
//!
//! Semaphores (`operator/semaphores.rs`) are leader semaphores: each has `permits: P` and
//! `holder.leaderElection` over P pods of its own, Running and Ready, so every permit is held by a pod that
//! carries the leader label, the permit number, the token and the validity. The pods of other applications
//! are there too, as in the single-lock run. That run ends with `SUMMARY_SEMAPHORES semaphores=M
//! semaphores_held=M permits=P leader_pods=N pods=N cpu_cores_idle=X cpu_cores_avg=X lost=N
//! extend_lag_p99_ms=X all_held_s=X create_to_held_p50_ms=X extensions_per_s=X pod_writes_per_s=X
//! lock_writes_per_s=X rss_mib_idle=X rss_mib_pods=X rss_mib_held=X`: the extension lag is per permit (each
//! permit is extended on its own), a lock counts as held when all its permits are (`status.held` `P/P`); if
//! not all are in time, the steady holding of those that are is measured anyway, `semaphores_held` says how
//! many and `all_held_s` is `inf`. Lost counts permits lost plus the times a lock was seen with fewer than
//! all its permits after holding them all. The writes per second are the API server's count of creates,
//! updates and patches of pods and of locks (status included) over the window (nothing but the operator
//! writes then). The last lines set the two runs side by side, and `RATIO semaphores/single cpu_cores_avg=X
//! extend_lag_p99_ms=X all_held_s=X` divides the semaphores' figures by the single locks'.
//!
//! First, unless `OPERATOR_BENCH_HANDOVERS` is 0 (default 30 rounds), the hand-over to a queued lock at a
//! release, woken and polled only (`operator/handovers.rs`).
//!
//! Then, unless `OPERATOR_BENCH_JOB_QUEUE` is 0 (default 30 Jobs), the hand-over along a Job queue: previous
//! Job complete → next Job unsuspended (`operator/job_queue.rs`).
//!
//! Then, unless `OPERATOR_BENCH_FLOOD_LOCKS` is 0 (default 200 held locks, `OPERATOR_BENCH_FLOOD_SECONDS` 20 per
//! window), a flood of forged reports beside them, against the same window idle (`operator/flood.rs`).
//!
//! Then, for each size in `OPERATOR_BENCH_ASK_LOCKS` (default `200,10000`; `0` leaves it out), the cost of the
//! holders' asks (`POST /v1/validity`, issue 48): the operator's CPU with that many held locks, nobody asking
//! (as before issue 48) and every lock's holder asking on the holders' own schedule through their own client
//! (`operator/asks.rs`; `OPERATOR_BENCH_ASK_SECONDS`, 20 per window), each holder on a connection it keeps and,
//! as the baseline in the same run, on a connection per ask.
//!
//! Then, for each size in `OPERATOR_BENCH_FAILOVER_ASK_LOCKS` (default `10000`; `0` leaves it out), a failover of
//! two replicas with every holder asking (`operator/asks_failover.rs`).
//!
//! `OPERATOR_BENCH_OPERATOR_CPUS` (a `taskset --cpu-list`, say `1`) runs the operator on those cores only; run the
//! bench itself on the others (`taskset --cpu-list 0 cargo bench --bench operator`) so that neither side takes
//! the other's core.
//!
//! Events: `OPERATOR_BENCH_EVENTS` (default 3,000: about a second of acquisitions, long enough for the steady
//! holding's waves of extensions and status writes to average out) more locks are created once with the
//! operator idle (the baseline) and once just after the N acquisitions (whose `Acquired` Events an event
//! recorder may still be keeping for its series); each acquisition publishes one `Acquired` Event. For each
//! it prints the Events published per second (counted by the API server) and the operator's CPU-seconds per
//! 1,000 of them (the acquisitions with their Events, less the background CPU of the idle operator or of the
//! steady holding measured below). Before the operator starts, the two Event recorders are measured alone
//! (see `operator/recorders.rs`). The semaphore run measures no Events. `OPERATOR_BENCH_BINARY` runs another
//! build of the operator (an older one, to compare in the same session).

#[path = "operator/asks.rs"]
mod asks;
#[path = "operator/asks_failover.rs"]
mod asks_failover;
#[path = "operator/flood.rs"]
mod flood;
#[path = "operator/handovers.rs"]
mod handovers;
#[path = "operator/job_queue.rs"]
mod job_queue;
#[path = "operator/recorders.rs"]
mod recorders;
#[path = "operator/semaphores.rs"]
mod semaphores;
#[path = "../tests/support/mod.rs"]
mod support;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use kube::api::PostParams;
use kube::runtime::watcher;
use redlock_operator::api::{DistributedLock, LockPhase, RedisQuorum};
use support::apiserver::TestApiServer;
use support::redis_server::RedisCluster;
use tokio::time::Instant;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

fn main() -> Result<(), BoxError> {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(bench())
}

/// How long a run waits for all its locks to be held: `OPERATOR_BENCH_WAIT_SECONDS`, ten minutes by default.
fn patience() -> Duration {
    Duration::from_secs(env_number("OPERATOR_BENCH_WAIT_SECONDS", 600))
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

/// A pod of a realistic size (a container with an environment, a status with conditions and container
/// statuses), as the API server stores it: what the operator's cluster-wide pod watch caches.
fn realistic_pod(
    name: &str,
    namespace: &str,
    labels: serde_json::Value,
) -> Result<k8s_openapi::api::core::v1::Pod, BoxError> {
    let env: Vec<serde_json::Value> = (0..20)
        .map(|n| serde_json::json!({ "name": format!("SETTING_{n}"), "value": "x".repeat(64) }))
        .collect();
    Ok(serde_json::from_value(serde_json::json!({
        "metadata": { "name": name, "namespace": namespace, "labels": labels },
        "spec": { "containers": [{ "name": "app", "image": "registry.invalid/shop:1.2.3", "env": env,
                  "resources": { "requests": { "cpu": "100m", "memory": "128Mi" } } }] },
        "status": { "phase": "Running", "podIP": "10.0.0.1",
                    "conditions": [{ "type": "Ready", "status": "True" }, { "type": "Initialized", "status": "True" }],
                    "containerStatuses": [{ "name": "app", "image": "shop:1.2.3", "imageID": "sha256:0", "ready": true, "restartCount": 0 }] }
    }))?)
}

/// `count` realistic pods in a namespace of their own: what a cluster-wide pod watch caches besides the locks'
/// own pods.
async fn create_pods(client: &kube::Client, count: usize) -> Result<(), BoxError> {
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), "other-apps");
    futures::stream::iter(0..count)
        .map(|index| {
            let pods = pods.clone();
            async move {
                let labels = serde_json::json!({ "app": "shop", "tier": "web" });
                let pod = realistic_pod(&format!("app-{index:05}"), "other-apps", labels)?;
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
    create_locks(&api, count, None, single_lock).await?;
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

/// A fresh cluster (test API server, masters) and operator holding `locks` identity locks ([`single_lock`], ttl
/// 10 s), once every lock is held and its first status writes are behind it, so that what is measured next sees
/// the steady holding only.
async fn settled_identity_locks(locks: usize) -> Result<(Cluster, Operator, Api<DistributedLock>), BoxError> {
    let cluster = Cluster::start().await?;
    cluster.install().await?;
    let operator = Operator::start(&cluster).await?;
    let api: Api<DistributedLock> = Api::default_namespaced(cluster.client.clone());
    hold_identity_locks(&api, locks).await?;
    Ok((cluster, operator, api))
}

/// Creates `locks` identity locks ([`single_lock`]) and waits until every one is held and its first status
/// writes are behind it.
async fn hold_identity_locks(api: &Api<DistributedLock>, locks: usize) -> Result<(), BoxError> {
    let held = HeldWatch::start(api.clone(), 1);
    create_locks(api, locks, None, single_lock).await?;
    let seen = held.wait_for(locks, patience()).await;
    if seen < locks {
        return Err(format!("only {seen} of {locks} locks held").into());
    }
    tokio::time::sleep(Duration::from_secs(12)).await;
    Ok(())
}

/// A plain lock `lock-00000` … (ttl 10s) held by an identity: the single-lock run's.
fn single_lock(index: usize) -> (String, serde_json::Value) {
    let spec = serde_json::json!({ "ttl": "10s", "holder": { "identity": format!("holder-{index}") } });
    (format!("lock-{index:05}"), spec)
}

/// Creates `count` single locks one after another, each once the one before is seen held (the operator has
/// nothing else to do); returns the median create → held, in ms, seen through a watch as a client would.
async fn one_at_a_time(api: &Api<DistributedLock>, count: usize) -> Result<f64, BoxError> {
    let watch = HeldWatch::start(api.clone(), 1);
    let created: Mutex<HashMap<String, Instant>> = Mutex::default();
    for index in 0..count {
        create_locks(api, 1, Some(&created), |_| {
            let (_, spec) = single_lock(index);
            (format!("idle-{index:03}"), spec)
        })
        .await?;
        if watch.wait_for(index + 1, Duration::from_secs(30)).await <= index {
            return Err(format!("idle-{index:03} not held within 30s").into());
        }
    }
    Ok(watch.create_to_held_p50_ms(&created))
}

/// Creates `count` locks in the API's namespace, 32 at a time, noting when each was sent; `lock(index)` gives
/// each its name and spec.
async fn create_locks(
    api: &Api<DistributedLock>,
    count: usize,
    created: Option<&Mutex<HashMap<String, Instant>>>,
    lock: impl Fn(usize) -> (String, serde_json::Value),
) -> Result<(), BoxError> {
    let lock = &lock;
    futures::stream::iter(0..count)
        .map(|index| async move {
            let (name, spec) = lock(index);
            let lock: DistributedLock = serde_json::from_value(serde_json::json!({
                "apiVersion": "redlock.io/v1beta1", "kind": "DistributedLock",
                "metadata": { "name": name }, "spec": spec
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

/// A Prometheus histogram's buckets: each upper bound with its cumulative count.
fn histogram_buckets(text: &str, name: &str) -> Vec<(f64, f64)> {
    let prefix = format!("{name}_bucket{{le=\"");
    text.lines()
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
        .collect()
}

/// The p-th quantile of a Prometheus histogram, as the upper bound of the bucket it falls in.
fn histogram_quantile(text: &str, name: &str, quantile: f64) -> f64 {
    let buckets = histogram_buckets(text, name);
    let total = buckets.last().map_or(0.0, |(_, count)| *count);
    buckets
        .iter()
        .find(|(_, count)| *count >= total * quantile)
        .map_or(0.0, |(bound, _)| *bound)
}

/// Five fresh masters and a fresh API server, with a kubeconfig and an installation secret for the operator.
struct Cluster {
    masters: RedisCluster,
    server: TestApiServer,
    client: kube::Client,
    kubeconfig: PathBuf,
    secret: PathBuf,
    _dir: tempfile::TempDir,
}

impl Cluster {
    async fn start() -> Result<Self, BoxError> {
        let masters = RedisCluster::start(5)?;
        let server = TestApiServer::start().await;
        let client = server.client();
        let dir = tempfile::tempdir()?;
        let kubeconfig = dir.path().join("kubeconfig");
        server.write_kubeconfig(&kubeconfig)?;
        let secret = dir.path().join("secret");
        std::fs::write(&secret, [42u8; 48])?;
        Ok(Self {
            masters,
            server,
            client,
            kubeconfig,
            secret,
            _dir: dir,
        })
    }

    /// The CRDs and the `default` quorum of the five masters.
    async fn install(&self) -> Result<(), BoxError> {
        let crds: Api<CustomResourceDefinition> = Api::all(self.client.clone());
        for crd in [
            redlock_operator::api::served_crd::<RedisQuorum>(),
            redlock_operator::api::served_crd::<DistributedLock>(),
        ] {
            crds.create(&PostParams::default(), &crd).await?;
        }
        let quorum: RedisQuorum = serde_json::from_value(serde_json::json!({
            "apiVersion": "redlock.io/v1beta1", "kind": "RedisQuorum", "metadata": { "name": "default" },
            // Fresh masters: skip the restart quarantine, it is not what is measured here.
            "spec": { "endpoints": self.masters.urls(), "maxTtl": "10s", "assumeDurable": true }
        }))?;
        Api::<RedisQuorum>::all(self.client.clone())
            .create(&PostParams::default(), &quorum)
            .await?;
        Ok(())
    }
}

/// The operator binary running as a child process, with its metrics on `port` and its reports port (TLS) on
/// `reports_port`.
struct Operator {
    child: tokio::process::Child,
    pid: u32,
    port: u16,
    reports_port: u16,
}

impl Operator {
    /// Starts the binary against `cluster` and waits until it sees the quorum available.
    async fn start(cluster: &Cluster) -> Result<Self, BoxError> {
        Self::start_with_controls(cluster, "").await
    }

    /// [`Operator::start`] with the negative controls `controls` (comma-separated names; `""`: none).
    async fn start_with_controls(cluster: &Cluster, controls: &str) -> Result<Self, BoxError> {
        Self::start_as(cluster, controls, None).await
    }

    /// A replica named `identity` of an installation of two, electing the active one through the Lease
    /// `default/redlock-operator` (4 s, the default), as the chart runs them.
    async fn start_replica(cluster: &Cluster, identity: &str) -> Result<Self, BoxError> {
        Self::start_as(cluster, "", Some(identity)).await
    }

    async fn start_as(cluster: &Cluster, controls: &str, replica: Option<&str>) -> Result<Self, BoxError> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let reports_port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let binary = std::env::var_os("OPERATOR_BENCH_BINARY")
            .unwrap_or_else(|| env!("CARGO_BIN_EXE_redlock-operator").into());
        // An older build (`OPERATOR_BENCH_BINARY`) may predate the reports port: it serves reports beside metrics.
        let help = std::process::Command::new(&binary)
            .args(["run", "--help"])
            .output()?;
        let help = String::from_utf8_lossy(&help.stdout);
        let reports_addr = help
            .contains("--reports-addr")
            .then(|| ["--reports-addr".to_owned(), format!("127.0.0.1:{reports_port}")]);
        // Room for every holder of the largest size to keep its connection (a build that keeps none has no flag).
        let connections = help
            .contains("--reports-max-connections")
            .then(|| ["--reports-max-connections".to_owned(), "20000".to_owned()]);
        // The operator on cores of its own (`OPERATOR_BENCH_OPERATOR_CPUS`, a taskset list), so that the bench's
        // side (holders, API server, masters) cannot hide the operator's cost by taking its core.
        let mut command = match std::env::var("OPERATOR_BENCH_OPERATOR_CPUS") {
            Ok(cpus) if !cpus.is_empty() => {
                let mut taskset = tokio::process::Command::new("taskset");
                taskset.args(["--cpu-list", &cpus]).arg(&binary);
                taskset
            }
            _ => tokio::process::Command::new(&binary),
        };
        let election: Vec<String> = match replica {
            None => vec!["--no-leader-election".into()],
            Some(identity) => [
                "--namespace",
                "default",
                "--identity",
                identity,
                "--installation",
                "default/bench",
            ]
            .map(str::to_owned)
            .into(),
        };
        let child = command
            .arg("run")
            .args(election)
            .arg("--metrics-addr")
            .arg(format!("127.0.0.1:{port}"))
            .args(reports_addr.into_iter().flatten())
            .args(connections.into_iter().flatten())
            .arg("--installation-secret-file")
            .arg(&cluster.secret)
            .env("KUBECONFIG", &cluster.kubeconfig)
            .env("RUST_LOG", "error")
            .env(redlock_operator::negative_controls::ENV, controls)
            .kill_on_drop(true)
            .spawn()?;
        let pid = child.id().ok_or("operator exited")?;
        let quorums: Api<RedisQuorum> = Api::all(cluster.client.clone());
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
        Ok(Self {
            child,
            pid,
            port,
            reports_port,
        })
    }

    /// Installs the CRDs and the quorum on `cluster`, starts the binary and measures it idle with no lock (the
    /// baseline): its cores and resident MiB.
    async fn start_idle(cluster: &Cluster) -> Result<(Self, f64, f64), BoxError> {
        cluster.install().await?;
        let operator = Self::start(cluster).await?;
        let idle = cores_over(operator.pid, Duration::from_secs(5)).await?;
        let rss_idle = rss_mib(operator.pid)?;
        println!("baseline: the operator idle with no lock uses {idle:.4} cores and {rss_idle:.1} MiB");
        Ok((operator, idle, rss_idle))
    }

    /// Fails if the operator exited during the run; otherwise stops it and waits until it is gone, so that the
    /// next run has the cores to itself.
    async fn stop(mut self) -> Result<(), BoxError> {
        if let Ok(Some(status)) = self.child.try_wait() {
            return Err(format!("the operator exited during the run: {status}").into());
        }
        self.child.start_kill()?;
        self.child.wait().await?;
        Ok(())
    }
}

/// Whether `lock` holds all its `permits` (a plain lock: is `Held`).
fn all_held(lock: &DistributedLock, permits: usize) -> bool {
    let status = lock.status.as_ref();
    if permits <= 1 {
        return status.and_then(|s| s.phase) == Some(LockPhase::Held);
    }
    status.and_then(|s| s.held.as_deref()) == Some(format!("{permits}/{permits}").as_str())
}

/// When each lock was first seen holding all its permits, through a watch like any client's, and how many
/// times a lock was seen with fewer after that.
#[derive(Clone, Default)]
struct HeldWatch {
    held: Arc<Mutex<HashMap<String, Instant>>>,
    dropped: Arc<Mutex<usize>>,
}

impl HeldWatch {
    fn start(api: Api<DistributedLock>, permits: usize) -> Self {
        let watch = Self::default();
        let seen = watch.clone();
        let stream = watcher(api, watcher::Config::default());
        tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            while let Ok(Some(event)) = stream.try_next().await {
                let lock = match event {
                    watcher::Event::Apply(lock) | watcher::Event::InitApply(lock) => lock,
                    _ => continue,
                };
                let name = lock.metadata.name.clone().unwrap_or_default();
                let mut held = seen.held.lock().unwrap_or_else(|p| p.into_inner());
                if all_held(&lock, permits) {
                    held.entry(name).or_insert_with(Instant::now);
                } else if held.contains_key(&name) {
                    *seen.dropped.lock().unwrap_or_else(|p| p.into_inner()) += 1;
                }
            }
        });
        watch
    }

    fn dropped(&self) -> usize {
        *self.dropped.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits until `count` locks have been seen holding all their permits, or `patience` has passed; returns
    /// how many were.
    async fn wait_for(&self, count: usize, patience: Duration) -> usize {
        let deadline = Instant::now() + patience;
        let mut last_report = Instant::now();
        loop {
            let held = self.held.lock().unwrap_or_else(|p| p.into_inner()).len();
            if held >= count || Instant::now() > deadline {
                return held;
            }
            if last_report.elapsed() > Duration::from_secs(5) {
                println!("  {held} of {count} held");
                last_report = Instant::now();
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The median time from a lock's create request to its being seen with all its permits held, in ms.
    fn create_to_held_p50_ms(&self, created: &Mutex<HashMap<String, Instant>>) -> f64 {
        let created = created.lock().unwrap_or_else(|p| p.into_inner());
        let held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        let mut times: Vec<f64> = created
            .iter()
            .filter_map(|(name, at)| {
                Some(held.get(name)?.saturating_duration_since(*at).as_secs_f64() * 1000.0)
            })
            .collect();
        times.sort_by(f64::total_cmp);
        times.get(times.len() / 2).copied().unwrap_or(0.0)
    }
}

/// Creates, updates and patches of pods and of locks (their status included) the API server has counted.
fn api_writes(server: &TestApiServer) -> (u64, u64) {
    let writes = |plural: &str| {
        ["create", "update", "patch"]
            .iter()
            .map(|verb| server.request_count(verb, plural))
            .sum::<u64>()
    };
    (writes("pods"), writes("distributedlocks"))
}

/// What the operator did over the window of steady holding.
struct Steady {
    cores: f64,
    /// Locks (or permits) lost since the operator started, and during the window.
    lost: u64,
    lost_in_window: f64,
    /// Upper bound of the histogram bucket of the 99th percentile, since the operator started.
    lag_p99_ms: f64,
    extensions: f64,
    extensions_per_s: f64,
    /// `redlock_locks_held`: the permits held (a plain lock is one).
    held: f64,
    pod_writes_per_s: f64,
    lock_writes_per_s: f64,
}

async fn steady_holding(
    server: &TestApiServer,
    operator: &Operator,
    window: Duration,
) -> Result<Steady, BoxError> {
    let before = metrics_text(operator.port).await?;
    let (pod_writes, lock_writes) = api_writes(server);
    let started = Instant::now();
    let cores = cores_over(operator.pid, window).await?;
    let seconds = started.elapsed().as_secs_f64();
    let (pod_writes_after, lock_writes_after) = api_writes(server);
    let text = metrics_text(operator.port).await?;
    let lost = metric(&text, "redlock_locks_lost_total");
    let extensions = metric(&text, "redlock_extensions_total");
    Ok(Steady {
        cores,
        lost: lost as u64,
        lost_in_window: lost - metric(&before, "redlock_locks_lost_total"),
        lag_p99_ms: histogram_quantile(&text, "redlock_extend_lag_seconds", 0.99) * 1000.0,
        extensions,
        extensions_per_s: (extensions - metric(&before, "redlock_extensions_total")) / seconds,
        held: metric(&text, "redlock_locks_held"),
        pod_writes_per_s: (pod_writes_after - pod_writes) as f64 / seconds,
        lock_writes_per_s: (lock_writes_after - lock_writes) as f64 / seconds,
    })
}

/// A line of the side-by-side table: its name and how to show one run's figure.
type Row = (&'static str, fn(&Compared) -> String);

/// One run's figures, for setting the single locks and the semaphores side by side.
struct Compared {
    permits_held: usize,
    steady: Steady,
    lost: u64,
    all_held_s: f64,
    create_to_held_p50_ms: f64,
    rss_mib_held: f64,
}

async fn bench() -> Result<(), BoxError> {
    let locks = env_number("OPERATOR_BENCH_LOCKS", 10_000) as usize;
    let window = Duration::from_secs(env_number("OPERATOR_BENCH_SECONDS", 60));
    let pods = env_number("OPERATOR_BENCH_PODS", 10_000) as usize;
    let semaphores = env_number("OPERATOR_BENCH_SEMAPHORES", 1_000) as usize;
    let permits = env_number("OPERATOR_BENCH_PERMITS", 10).max(2) as usize;
    let handovers = env_number("OPERATOR_BENCH_HANDOVERS", 30) as usize;
    if handovers > 0 {
        handovers::run(handovers).await?;
        println!();
    }
    let queued_jobs = env_number("OPERATOR_BENCH_JOB_QUEUE", 30) as usize;
    if queued_jobs > 1 {
        job_queue::run(queued_jobs).await?;
        println!();
    }
    let flood_locks = env_number("OPERATOR_BENCH_FLOOD_LOCKS", 200) as usize;
    if flood_locks > 0 {
        let flood_window = Duration::from_secs(env_number("OPERATOR_BENCH_FLOOD_SECONDS", 20));
        flood::run(flood_locks, flood_window).await?;
        println!();
    }
    let ask_sizes = asks::sizes();
    if !ask_sizes.is_empty() {
        let ask_window = Duration::from_secs(env_number("OPERATOR_BENCH_ASK_SECONDS", 20));
        asks::run(&ask_sizes, ask_window).await?;
        println!();
    }
    let failover_sizes = asks_failover::sizes();
    if !failover_sizes.is_empty() {
        asks_failover::run(&failover_sizes).await?;
        println!();
    }
    // Either run can be left out (its count set to 0), to explore the other's sizes quickly.
    let single = if locks > 0 {
        println!("single locks: {locks}, ttl 10s, with {pods} pods of other applications");
        Some(single_locks(locks, window, pods).await?)
    } else {
        None
    };
    if semaphores == 0 {
        return Ok(());
    }
    println!();
    println!(
        "semaphores: {semaphores} of {permits} permits, ttl 10s, leader election over {permits} ready pods each, with {pods} pods of other applications"
    );
    let semaphore = semaphores::run(semaphores, permits, window, pods).await?;
    let Some(single) = single else {
        return Ok(());
    };
    println!();
    println!("{locks} single locks | {semaphores} semaphores of {permits} permits:");
    let rows: [Row; 10] = [
        ("permits (held: redlock_locks_held)", |run| {
            format!("{} ({:.0})", run.permits_held, run.steady.held)
        }),
        ("operator CPU, cores avg", |run| {
            format!("{:.3}", run.steady.cores)
        }),
        ("extension lag p99 per permit, ms", |run| {
            format!("{:.1}", run.steady.lag_p99_ms)
        }),
        ("time to all held, s", |run| format!("{:.1}", run.all_held_s)),
        ("create -> all permits held p50, ms", |run| {
            format!("{:.0}", run.create_to_held_p50_ms)
        }),
        ("extensions per second", |run| {
            format!("{:.0}", run.steady.extensions_per_s)
        }),
        ("pod writes per second", |run| {
            format!("{:.1}", run.steady.pod_writes_per_s)
        }),
        ("lock writes per second", |run| {
            format!("{:.1}", run.steady.lock_writes_per_s)
        }),
        ("lost", |run| run.lost.to_string()),
        ("memory held, MiB", |run| format!("{:.1}", run.rss_mib_held)),
    ];
    for (name, value) in rows {
        println!("  {name:<36} {:>12} | {}", value(&single), value(&semaphore));
    }
    let ratio = |of: fn(&Compared) -> f64| of(&semaphore) / of(&single).max(1e-9);
    println!(
        "RATIO semaphores/single cpu_cores_avg={:.2} extend_lag_p99_ms={:.2} all_held_s={:.2}",
        ratio(|run| run.steady.cores),
        ratio(|run| run.steady.lag_p99_ms),
        ratio(|run| run.all_held_s),
    );
    Ok(())
}

/// The single-lock run: `locks` plain locks held by identities, with the Event measurements.
async fn single_locks(locks: usize, window: Duration, pods: usize) -> Result<Compared, BoxError> {
    let event_count = env_number("OPERATOR_BENCH_EVENTS", 3_000) as usize;
    let cluster = Cluster::start().await?;
    let (server, client) = (&cluster.server, &cluster.client);

    println!(
        "the Event recorders alone (three rounds each, alternating, summed; 32 publishes at a time; CPU of the publishing thread):"
    );
    let [kube_recorder, our_recorder] = recorders::measure(server, event_count, locks).await?;
    println!("  {}", recorders::describe("kube-runtime's", &kube_recorder));
    println!("  {}", recorders::describe("the operator's", &our_recorder));

    let (operator, idle, rss_idle) = Operator::start_idle(&cluster).await?;
    let pid = operator.pid;
    let events_idle = event_burst(server, client, pid, "events-idle", event_count).await?;
    let event_cpu_idle = events_idle.cpu_per_thousand(idle);
    println!(
        "Events with the operator idle (baseline): {} in {:.1}s, {:.0} per second, {event_cpu_idle:.3} CPU-s per 1,000",
        events_idle.events,
        events_idle.seconds,
        events_idle.per_second()
    );
    if pods > 0 {
        println!("creating {pods} pods of other applications …");
        create_pods(client, pods).await?;
        // Let the pod watch take them all in.
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
    let rss_pods = rss_mib(pid)?;
    println!("with {pods} pods in the cluster: {rss_pods:.1} MiB");

    let lock_api: Api<DistributedLock> = Api::namespaced(client.clone(), "bench");
    let idle_locks = env_number("OPERATOR_BENCH_IDLE_LOCKS", 20) as usize;
    let idle_p50 = one_at_a_time(&lock_api, idle_locks).await?;
    println!(
        "create→held of a single lock on the idle operator, one at a time: p50 {idle_p50:.1} ms ({idle_locks} locks, still held below)"
    );

    let created: Mutex<HashMap<String, Instant>> = Mutex::default();
    let watch = HeldWatch::start(lock_api.clone(), 1);

    println!("creating {locks} locks (ttl 10s) …");
    let creating = Instant::now();
    create_locks(&lock_api, locks, Some(&created), single_lock).await?;
    println!(
        "created in {:.1}s; waiting for every lock to be held …",
        creating.elapsed().as_secs_f64()
    );
    let held = watch
        .wait_for(locks + idle_locks, patience())
        .await
        .saturating_sub(idle_locks);
    if held < locks {
        return Err(format!(
            "only {held} of {locks} locks held after {}s",
            patience().as_secs()
        )
        .into());
    }
    let all_held_after = creating.elapsed();
    let p50 = watch.create_to_held_p50_ms(&created);
    println!(
        "all {locks} held {:.1}s after the first create; create→held p50 {p50:.0} ms",
        all_held_after.as_secs_f64()
    );

    // Let the initial burst of acquisitions and Events settle, publish more, then measure steady holding.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let events_after = event_burst(server, client, pid, "events-after", event_count).await?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    println!("measuring {}s of steady holding …", window.as_secs());
    let steady = steady_holding(server, &operator, window).await?;
    let cores = steady.cores;
    let dropped = watch.dropped();
    let rss_held = rss_mib(pid)?;
    println!(
        "steady state: {cores:.3} cores (idle {:.4}; a ratio to it would mostly measure the clock tick), {:.0} extensions in all, locks held {:.0}, lost during the window {}, status left Held {dropped} times",
        idle, steady.extensions, steady.held, steady.lost_in_window
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
    operator.stop().await?;
    println!(
        "memory: {rss_idle:.1} MiB idle, {rss_pods:.1} MiB with {pods} pods, {rss_held:.1} MiB with them and {locks} held locks"
    );
    let lost = steady.lost + dropped as u64;
    println!(
        "SUMMARY locks={locks} pods={pods} cpu_cores_avg={cores:.3} lost={lost} extend_lag_p99_ms={:.1} create_to_held_p50_ms={p50:.0} idle_create_to_held_p50_ms={idle_p50:.1} rss_mib_idle={rss_idle:.1} rss_mib_pods={rss_pods:.1} rss_mib_held={rss_held:.1} events_per_s_idle={:.0} events_per_s_after={:.0} event_cpu_s_per_1000_idle={event_cpu_idle:.3} event_cpu_s_per_1000_after={event_cpu_after:.3} recorder_kube_per_s_idle={:.0} recorder_kube_per_s_after={:.0} recorder_kube_cpu_s_per_1000_idle={:.3} recorder_kube_cpu_s_per_1000_after={:.3} recorder_ours_per_s_idle={:.0} recorder_ours_per_s_after={:.0} recorder_ours_cpu_s_per_1000_idle={:.3} recorder_ours_cpu_s_per_1000_after={:.3}",
        steady.lag_p99_ms,
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
    Ok(Compared {
        permits_held: locks,
        steady,
        lost,
        all_held_s: all_held_after.as_secs_f64(),
        create_to_held_p50_ms: p50,
        rss_mib_held: rss_held,
    })
}
