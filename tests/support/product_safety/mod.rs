//! The product-level safety checker (issue 22): the real operator (replicas as processes of the real binary),
//! one or two clusters sharing one quorum of five real `redis-server` masters behind fault proxies, holders
//! that act on a fencing-aware protected resource while they believe they hold a key, a seeded nemesis on every
//! part, and a check of the history: no two beliefs of one permit overlap, no key has more beliefs at once than
//! its permits (1 for a plain lock; N for the semaphore mode's Job locks and `lock --permits N`), tokens rise per
//! permit, and the protected resource (one per permit) never accepted an older token after a newer one.
//!
//! Not part of `tests/support/mod.rs` (every test binary compiles that): the binaries that use it include it with
//! `#[path]`, next to `tests/e2e/mod.rs`.

pub mod checker;
pub mod cluster;
pub mod controls;
pub mod fenced;
pub mod fences;
#[allow(dead_code)] // Run by the test (tests/operator_safety.rs) only; the bench includes this module too.
pub mod findings;
pub mod follow;
pub mod guard;
pub mod guard_controls;
pub mod holder_cut;
pub mod identity;
pub mod jobs;
pub mod leaders;
pub mod nemesis;
pub mod outside;
pub mod permits;
pub mod protected;
pub mod recorder;
pub mod replica;
pub mod rules;
pub mod semaphore;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, PostParams};
use rand::SeedableRng;
use rand::rngs::StdRng;
use redlock_operator::api::RedisQuorum;
use redlock_operator::cli::stop_time::HolderClock;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use self::checker::Report;
use self::cluster::Cluster;
use self::identity::IdentityLock;
use self::jobs::JobLock;
use self::leaders::LeaderSet;
use self::nemesis::Forced;
use self::permits::Bounds;
use self::recorder::Recorder;
use self::replica::Replica;
use crate::support::fault_proxy::FaultProxy;
use crate::support::job_controller::FakeJobRuntime;
use crate::support::redis_server::RedisCluster;

/// The leader and identity locks' TTL, and the default of the others' (`Scenario::ttl`).
pub const TTL: &str = "3s";
pub const DEFAULT_TTL: Duration = Duration::from_secs(3);

/// How long a master restarted with `max_ttl` as the quorum's `maxTtl` stays quarantined: `max_ttl` × (1 + the
/// default drift factor, 0.01) + 2 ms, rounded up to a tenth of a second (3.1 s for 3 s). A master in quarantine
/// neither votes for a grant nor is written by it.
pub fn quarantine(max_ttl: Duration) -> Duration {
    let millis = max_ttl.as_millis() * 101 / 100 + 2;
    Duration::from_millis(u64::try_from(millis.div_ceil(100) * 100).unwrap_or(u64::MAX))
}

/// The guard's `--fence-margin` unless given.
pub fn guard_default_margin() -> Duration {
    redlock_operator::duration::parse(redlock_operator::cli::guard::DEFAULT_FENCE_MARGIN)
        .expect("the guard's default margin")
}

/// A duration as the API and the `lock` command take it.
pub fn duration_text(duration: Duration) -> String {
    redlock_operator::duration::format(duration)
}

const MASTERS: usize = 5;

/// What a run does.
#[derive(Clone, Debug)]
pub struct Scenario {
    /// Seeds every random choice of the harness and the nemesis (and the test API servers' realistic mode).
    pub seed: u64,
    /// How long the workload runs under the nemesis, after setup.
    pub duration: Duration,
    /// 1 or 2 clusters on the one quorum, sharing the keys.
    pub clusters: usize,
    /// Operator replicas per cluster (one active, the others standby).
    pub replicas: usize,
    /// Leader-election locks per cluster, on keys `key-0`, `key-1`, … (shared by the clusters).
    pub leader_locks: usize,
    pub pods_per_lock: usize,
    /// The leader-election locks' `spec.permits` (1: one leader; N: up to N pods lead at once, each with its
    /// permit), and the `lock` processes' `--permits` on their keys.
    pub leader_permits: usize,
    /// Identity locks per cluster, on the same keys as the leader locks.
    pub identity_locks: usize,
    /// The identity locks' TTL (at most `ttl`, the quorum's `maxTtl`).
    pub identity_ttl: Duration,
    /// Job-fencing locks per cluster, on keys `churn-0`, `churn-1`, … (shared by the clusters).
    pub job_locks: usize,
    /// The Job locks' and `lock` processes' TTL, and the quorum's `maxTtl` (so at least `TTL`, the leader and
    /// identity locks'): a failover must fit in it for a lock to be resumed without a lapse.
    pub ttl: Duration,
    /// The Job locks' `fenceMargin` (the operator's default, a fifth of the TTL, when `None`).
    pub job_fence_margin: Option<Duration>,
    /// The `--fence-margin` of the guard the Jobs' pods run their work under (the guard's default unless a run
    /// says otherwise); `None`: the pods run their work without it, and only the operator fences them.
    pub job_guard: Option<Duration>,
    /// When the Jobs' guards report their work stopped (after it stopped, as `guard` does, unless a run says
    /// otherwise).
    pub guard_reports: guard::Reports,
    /// How long a Job's work takes to exit once its guard passed SIGTERM on (0: at once, as `sleep` does).
    pub work_stop_delay: Duration,
    /// The negative control `holder-keeps-working-when-cut`: a Job pod's guard cut off from the API server and the
    /// operator lets its work run on (`holder_cut.rs`).
    pub guard_keeps_working_when_cut: bool,
    /// The guards' wall clock: shifted from the operator's (issue 48's skewed clocks), and whether they trust
    /// status's `validUntil` on it even where a channel is offered (the negative control `holders-trust-wall-clock`).
    pub guard_clock: HolderClock,
    /// Whether a guard's belief that outlasts every validity it was shown (by status, or told by the active replica),
    /// or an unguarded Job pod's that outlasts the latest validity status showed for its grant, is a violation of
    /// its own, so that a guard stopping late is caught whether or not a `lock` process happened
    /// to take the key in that gap.
    pub beliefs_within_shown_validity: bool,
    /// The Jobs' pods' `terminationGracePeriodSeconds`.
    pub job_grace_seconds: u32,
    /// Jobs queued on each Job lock at the start, all at once (`<lock>-first-NN`, none failing): the report
    /// counts how many completed.
    pub first_jobs: usize,
    /// Jobs the feeder keeps waiting or running on each Job lock afterwards.
    pub queue: usize,
    /// `lock` processes outside Kubernetes, on the churn keys (and on the clusters' leader and identity keys).
    pub outside_clients: usize,
    /// Whether the `lock` processes also take the leader and identity locks' keys, where they race the open
    /// hand-over finding of the README (a leader learns of its label's removal after its key was released).
    pub outside_on_cluster_keys: bool,
    /// Keys the Job locks and the outside clients share (at least `job_locks`).
    pub churn_keys: usize,
    /// How long each Job works, in seconds.
    pub job_seconds: std::ops::Range<f64>,
    /// Whether the clusters are the real ones of `REDLOCK_E2E_KUBECONFIG` (and `…_B`) when set.
    pub real_clusters: bool,
    pub nemesis: bool,
    /// Faults at fixed points of the run (from its start), whatever the random nemesis does.
    pub forced: Vec<(Duration, Forced)>,
    /// The churn keys' permits: the Job locks' `spec.permits` and the outside clients' `--permits` on them (1: plain
    /// locks; N: the semaphore mode, at most N holders of a key at once, one per permit).
    pub permits: usize,
    /// Whether the outside clients miscount permits (the semaphore mode's negative control): `--permits N+1`,
    /// believing they hold their permit modulo N.
    pub miscounting_outside: bool,
    /// Negative controls the operator replicas run with (comma-separated names; empty: none).
    pub controls: String,
    /// Print a line of progress this often.
    pub progress: Option<Duration>,
    /// The fenced mode (`fenced.rs`): the churn keys' protected resource is a ConfigMap of the first cluster
    /// that the `lock` processes' children write themselves, behind the chart's policy or (the negative
    /// control) without it.
    pub fenced: Option<fenced::Policy>,
    /// Whether every fence the operator logs must be written before the validity it showed ended: its promise for
    /// holders without the guard, wherever it keeps running and reaches the API server (only the masters are cut).
    /// A fence written after it is then a violation of its own, so a control that delays the fence is caught
    /// whether or not an outside process happened to take the key in that gap.
    pub fences_before_validity: bool,
    /// Whether a holding that began while a majority of the masters were still in their restart quarantine is a
    /// violation of its own (no majority can vote then): a run whose masters restart only while its key is held
    /// elsewhere, so that no grant can precede the restart and be seen after it.
    pub grants_after_quarantine: bool,
    /// Whether the feeders queue, now and then, a Job that fails at once (not in the negative controls' runs: a
    /// control's fault is thrown once a Job works under its grant, and one that fails at once would be over
    /// before the fault, with nothing left for the control to break).
    pub failing_jobs: bool,
}

/// One cluster, one replica, no workload, no nemesis: plain locks (one permit) of the default TTL, the Job locks'
/// queue kept at two Jobs, nothing forced. Scenarios name what they add.
impl Default for Scenario {
    fn default() -> Self {
        Self {
            seed: 0,
            duration: Duration::ZERO,
            clusters: 1,
            replicas: 1,
            leader_locks: 0,
            pods_per_lock: 0,
            leader_permits: 1,
            identity_locks: 0,
            identity_ttl: DEFAULT_TTL,
            job_locks: 0,
            ttl: DEFAULT_TTL,
            job_fence_margin: None,
            job_guard: Some(guard_default_margin()),
            guard_reports: guard::Reports::AfterTheWorkStopped,
            work_stop_delay: Duration::ZERO,
            guard_keeps_working_when_cut: false,
            guard_clock: HolderClock::default(),
            beliefs_within_shown_validity: false,
            job_grace_seconds: 0,
            first_jobs: 0,
            queue: 2,
            outside_clients: 0,
            outside_on_cluster_keys: false,
            churn_keys: 0,
            job_seconds: 1.0..2.0,
            real_clusters: false,
            nemesis: false,
            forced: Vec::new(),
            permits: 1,
            miscounting_outside: false,
            controls: String::new(),
            progress: None,
            fenced: None,
            fences_before_validity: false,
            grants_after_quarantine: false,
            failing_jobs: true,
        }
    }
}

impl Scenario {
    /// The seed from `REDLOCK_SAFETY_SEED`, or a fresh one; printed either way, so that a run can be repeated.
    pub fn seed_from_env() -> u64 {
        let seed = std::env::var("REDLOCK_SAFETY_SEED")
            .ok()
            .and_then(|value| value.parse().ok())
            .unwrap_or_else(rand::random);
        println!(
            "product safety checker: seed {seed} (REDLOCK_SAFETY_SEED={seed} repeats its random choices)"
        );
        seed
    }
}

/// One cluster's side of a run: its API, its operator replicas, its links to the masters, its holders.
pub struct Side {
    pub cluster: Cluster,
    pub quorum: String,
    pub replicas: Vec<Replica>,
    /// This cluster's links to the masters, one proxy per master (cut one cluster off a majority, not the other).
    pub links: Vec<FaultProxy>,
    /// The holders' link to the API server (cut with the cluster's outages).
    pub holders_link: FaultProxy,
    /// The Job pods cut off one by one (`holder_cut.rs`); `None` where the Jobs run without the guard.
    pub cuts: Option<Arc<holder_cut::HolderCuts>>,
    pub leaders: Vec<LeaderSet>,
    /// The harness's kubelet for the leader pods: kills a pod's process before it finalizes its deletion.
    pub kubelet: leaders::Kubelet,
    pub identities: Vec<IdentityLock>,
    pub jobs: Vec<JobLock>,
    /// The Job controller and kubelet next to a test API server (a real cluster has its own).
    _job_runtime: Option<FakeJobRuntime>,
    _secret_dir: tempfile::TempDir,
}

impl Side {
    /// The replica the operator's Lease names, if any.
    pub async fn active(&self) -> Option<usize> {
        let leases: Api<Lease> = Api::namespaced(self.cluster.client.clone(), &self.cluster.namespace);
        let holder = leases.get("redlock-operator").await.ok()?.spec?.holder_identity?;
        self.replicas
            .iter()
            .position(|replica| replica.identity == holder)
    }
}

impl Side {
    /// Cluster `index` of the scenario (`east`, `west`): its API, its links to `masters`, its quorum, its
    /// operator replicas and the Job runtime next to a test API server; and the tasks that follow its holders'
    /// beliefs into `recorder` until `holders_stop`.
    async fn start(
        index: usize,
        scenario: &Scenario,
        masters: &RedisCluster,
        recorder: &Arc<Recorder>,
        holders_stop: &CancellationToken,
    ) -> (Self, Vec<JoinHandle<()>>) {
        let name = ["east", "west"][index % 2];
        let kubeconfig = kubeconfig_of(index).filter(|_| scenario.real_clusters);
        let cluster = Cluster::start(
            name,
            kubeconfig.as_deref(),
            scenario.seed.wrapping_add(index as u64),
        )
        .await;
        let links = links_to(masters).await;
        let quorum = create_quorum(&cluster, &links, scenario.ttl).await;
        let (secret_dir, secret_file) = write_installation_secret(name);
        let mut replicas = Vec::new();
        for replica in 0..scenario.replicas {
            replicas.push(Replica::start(&cluster, replica, &secret_file, &scenario.controls).await);
        }
        let (_, holders_client, holders_link) = cluster.behind_proxy("holders").await;
        let token_dir = Arc::new(tempfile::tempdir().expect("a directory for the pods' report tokens"));
        let guarding = scenario.job_guard.map(|margin| guard::Guarding {
            client: holders_client.clone(),
            margin,
            reports: scenario.guard_reports,
            work_stop_delay: scenario.work_stop_delay,
            clock: scenario.guard_clock,
            within_shown_validity: scenario.beliefs_within_shown_validity,
            ends_pods: cluster.server.is_some(),
            token_dir,
            cuts: Arc::new(holder_cut::HolderCuts::default()),
            keeps_working_when_cut: scenario.guard_keeps_working_when_cut,
        });
        let cuts = guarding.as_ref().map(|guarding| guarding.cuts.clone());
        let within = scenario.beliefs_within_shown_validity;
        let (kubelet, kills) = tokio::sync::mpsc::unbounded_channel();
        let followers = follow_holders(
            name,
            &cluster,
            (holders_client, guarding, within, kills),
            recorder,
            holders_stop,
        );
        let job_runtime = cluster
            .server
            .as_ref()
            .map(|server| FakeJobRuntime::start(server.controller_client(), Some(&cluster.namespace)));
        let side = Self {
            cluster,
            quorum,
            replicas,
            links,
            holders_link,
            cuts,
            leaders: Vec::new(),
            kubelet,
            identities: Vec::new(),
            jobs: Vec::new(),
            _job_runtime: job_runtime,
            _secret_dir: secret_dir,
        };
        (side, followers)
    }

    /// The scenario's leader-election locks (`leader-N` on `key-N`) with their pods, and its identity locks
    /// (`ident-N`, on the leader locks' keys).
    async fn create_leader_and_identity_locks(&mut self, scenario: &Scenario) {
        for index in 0..scenario.leader_locks {
            let set = LeaderSet::create(
                &self.cluster,
                &self.quorum,
                (&format!("leader-{index}"), &format!("key-{index}")),
                scenario.pods_per_lock,
                scenario.leader_permits,
            )
            .await;
            self.leaders.push(set);
        }
        for index in 0..scenario.identity_locks {
            let key = format!("key-{}", index % scenario.leader_locks.max(1));
            let name = format!("ident-{index}");
            let lock =
                IdentityLock::create(&self.cluster, &self.quorum, (&name, &key), scenario.identity_ttl).await;
            self.identities.push(lock);
        }
    }

    /// The scenario's Job locks (`jobs-N` on `churn-N`) of this side (`side_index`, for the feeders' seeds), and
    /// the tasks that keep their queues fed until `holders_stop`.
    async fn create_job_locks(
        &mut self,
        side_index: usize,
        scenario: &Scenario,
        recorder: &Arc<Recorder>,
        holders_stop: &CancellationToken,
    ) -> Vec<JoinHandle<()>> {
        let mut feeders = Vec::new();
        for index in 0..scenario.job_locks {
            let lock = format!("jobs-{index}");
            let key = format!("churn-{index}");
            let spec = jobs::JobSpec {
                permits: scenario.permits,
                ttl: scenario.ttl,
                fence_margin: scenario.job_fence_margin,
            };
            let job_lock = JobLock::create(&self.cluster, &self.quorum, &lock, &key, &spec).await;
            let feed = jobs::Feed {
                client: self.cluster.client.clone(),
                namespace: self.cluster.namespace.clone(),
                cluster: self.cluster.name.clone(),
                lock,
                key: job_lock.key.clone(),
                seconds: scenario.job_seconds.clone(),
                seed: scenario.seed.wrapping_add(200 + (side_index * 10 + index) as u64),
                first: scenario.first_jobs,
                queue: scenario.queue,
                grace_seconds: scenario.job_grace_seconds,
                failing: scenario.failing_jobs,
                recorder: recorder.clone(),
            };
            feeders.push(tokio::spawn(jobs::feed(feed, holders_stop.clone())));
            self.jobs.push(job_lock);
        }
        feeders
    }
}

/// One link per master, each through its own fault proxy (so that one cluster can be cut off a majority, not
/// the other).
async fn links_to(masters: &RedisCluster) -> Vec<FaultProxy> {
    let mut links = Vec::new();
    for server in masters.servers() {
        links.push(FaultProxy::start(server.addr()).await.expect("link to a master"));
    }
    links
}

/// Creates the cluster's RedisQuorum on `links` (the locks' longest TTL, `ttl`, as its `maxTtl`; its namespace
/// may share keys) and returns its name.
async fn create_quorum(cluster: &Cluster, links: &[FaultProxy], ttl: Duration) -> String {
    let quorum = format!("safety-{}", cluster.namespace);
    let urls: Vec<String> = links.iter().map(FaultProxy::url).collect();
    let object = serde_json::json!({
        "apiVersion": "redlock.io/v1beta1", "kind": "RedisQuorum", "metadata": { "name": quorum },
        "spec": { "endpoints": urls, "maxTtl": duration_text(ttl), "nodeTimeout": "100ms",
                  "sharedKeys": { "namespaces": [cluster.namespace] } }
    });
    let quorum_object: RedisQuorum = serde_json::from_value(object).expect("quorum");
    cluster
        .quorums()
        .create(&PostParams::default(), &quorum_object)
        .await
        .expect("create the quorum");
    quorum
}

/// The cluster's installation secret, in a file of a directory that lives as long as the side.
fn write_installation_secret(cluster: &str) -> (tempfile::TempDir, PathBuf) {
    let secret_dir = tempfile::tempdir().expect("tempdir");
    let secret_file = secret_dir.path().join("installation-secret");
    std::fs::write(
        &secret_file,
        format!("safety-installation-secret-{cluster}-0123456789abcdef"),
    )
    .expect("secret file");
    (secret_dir, secret_file)
}

/// The tasks that follow the beliefs of the cluster's holders into `recorder` until `stop`: its leader pods,
/// identity locks and Job pods' guards through `holders_client` (cut with the cluster's outages), its Jobs' pods
/// through the harness's own client.
fn follow_holders(
    name: &str,
    cluster: &Cluster,
    (holders_client, guarding, within_shown_validity, kills): (
        kube::Client,
        Option<guard::Guarding>,
        bool,
        tokio::sync::mpsc::UnboundedReceiver<follow::Kill>,
    ),
    recorder: &Arc<Recorder>,
    stop: &CancellationToken,
) -> Vec<JoinHandle<()>> {
    vec![
        tokio::spawn(leaders::follow_pods(
            name.to_owned(),
            holders_client.clone(),
            cluster.namespace.clone(),
            (recorder.clone(), kills),
            stop.clone(),
        )),
        tokio::spawn(identity::follow_locks(
            name.to_owned(),
            holders_client,
            cluster.namespace.clone(),
            recorder.clone(),
            stop.clone(),
        )),
        // A Job's pod runs until its kubelet stops it, whatever its own view of the API server: it is followed
        // on the harness's own client, which outages do not cut; its guard's watch goes through the holders'.
        tokio::spawn(jobs::follow_pods(
            name.to_owned(),
            cluster.client.clone(),
            cluster.namespace.clone(),
            (guarding, within_shown_validity),
            recorder.clone(),
            stop.clone(),
        )),
    ]
}

/// The keys the outside clients take, each with its permits: the churn keys, and first the clusters' leader and
/// identity keys when the scenario puts the clients on them (a leader lock's key has its permits; an identity
/// lock's key beyond them, one).
fn outside_keys(scenario: &Scenario) -> Vec<(String, usize)> {
    let cluster_keys = if scenario.outside_on_cluster_keys {
        scenario.leader_locks.max(scenario.identity_locks)
    } else {
        0
    };
    let mut keys: Vec<(String, usize)> = (0..cluster_keys)
        .map(|index| {
            let permits = if index < scenario.leader_locks {
                scenario.leader_permits
            } else {
                1
            };
            (format!("shared:key-{index}"), permits)
        })
        .collect();
    let churn_keys = scenario.churn_keys.max(scenario.job_locks);
    keys.extend((0..churn_keys).map(|index| (format!("shared:churn-{index}"), scenario.permits)));
    keys
}

/// The scenario's outside clients, if it has any and keys for them: the FIFO their children write to, its
/// reader (until `outside_stop`), and one task per client (until `holders_stop`).
fn start_outside_clients(
    (scenario, fenced): (&Scenario, Option<&outside::FencedWriter>),
    masters: &RedisCluster,
    recorder: &Arc<Recorder>,
    outside_stop: &CancellationToken,
    holders_stop: &CancellationToken,
) -> Option<(outside::Outside, JoinHandle<()>, Vec<JoinHandle<()>>)> {
    let keys = outside_keys(scenario);
    if scenario.outside_clients == 0 || keys.is_empty() {
        return None;
    }
    let (outside, follower) =
        outside::Outside::start(recorder.clone(), fenced.is_some(), outside_stop.clone());
    let clients = (0..scenario.outside_clients)
        .map(|index| {
            outside.client(
                outside::Client {
                    index,
                    masters: masters.urls(),
                    keys: keys.clone(),
                    seed: scenario.seed.wrapping_add(100 + index as u64),
                    miscounting: scenario.miscounting_outside,
                    ttl: scenario.ttl,
                    fenced: fenced.cloned(),
                },
                holders_stop.clone(),
            )
        })
        .collect();
    Some((outside, follower, clients))
}

/// Everything a run has.
pub struct World {
    pub scenario: Scenario,
    pub masters: RedisCluster,
    pub sides: Vec<Side>,
    pub recorder: Arc<Recorder>,
    pub rng: StdRng,
    holders_stop: CancellationToken,
    holder_tasks: Vec<JoinHandle<()>>,
    /// The FIFO the outside clients' children write to, and its reader, stopped after every client.
    pub outside: Option<outside::Outside>,
    /// The fenced mode's policy, removed at the end (it is cluster-wide), or when the run panics.
    fenced_policy: Option<crate::support::fenced_policy::PolicyGuard>,
    outside_stop: CancellationToken,
    outside_follower: Option<JoinHandle<()>>,
}

/// Sets everything up, runs the workload under the nemesis for the scenario's duration, heals, and checks.
pub async fn run(scenario: Scenario) -> Report {
    let mut world = World::start(scenario).await;
    let from = Instant::now();
    let until = from + world.scenario.duration;
    if world.scenario.nemesis {
        nemesis::run(&mut world, until).await;
    } else {
        nemesis::watch_only(&world, until).await;
    }
    if world.scenario.first_jobs > 0 {
        first_queues_done(&world).await;
    }
    world.finish(from).await
}

/// Waits, healed, until every Job of the first queues completed (at most 5 minutes: the report says how many
/// did), so that a run shows the whole first queue through.
async fn first_queues_done(world: &World) {
    let deadline = Instant::now() + Duration::from_secs(300);
    let recorder = &world.recorder;
    while recorder.first_queue_completed().len() < recorder.first_queue().len() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let completed = recorder.first_queue_completed();
    for waiting in recorder.first_queue().difference(&completed) {
        if let Some((cluster, job)) = waiting.split_once('/')
            && let Some(side) = world.sides.iter().find(|side| side.cluster.name == cluster)
        {
            eprintln!("{}", jobs::describe(&side.cluster, job).await);
        }
    }
}

impl World {
    /// Starts the masters and every cluster's side, waits until every master votes, then creates the locks and
    /// starts their holders and the outside clients.
    async fn start(scenario: Scenario) -> Self {
        let masters = tokio::task::block_in_place(|| RedisCluster::start(MASTERS)).expect("masters");
        let recorder = Arc::new(Recorder::default());
        let holders_stop = CancellationToken::new();
        let mut sides = Vec::new();
        let mut holder_tasks = Vec::new();
        for index in 0..scenario.clusters {
            let (side, followers) = Side::start(index, &scenario, &masters, &recorder, &holders_stop).await;
            sides.push(side);
            holder_tasks.extend(followers);
        }
        for side in &sides {
            all_masters_voting(side).await;
        }
        for side in &mut sides {
            side.create_leader_and_identity_locks(&scenario).await;
        }
        for (side_index, side) in sides.iter_mut().enumerate() {
            let feeders = side
                .create_job_locks(side_index, &scenario, &recorder, &holders_stop)
                .await;
            holder_tasks.extend(feeders);
        }
        let fenced = match scenario.fenced {
            Some(policy) => {
                let keys: Vec<String> = outside_keys(&scenario).into_iter().map(|(key, _)| key).collect();
                let side = &sides[0];
                Some(fenced::set_up(&side.cluster, &side.quorum, &keys, policy).await)
            }
            None => None,
        };
        let writer = fenced.as_ref().map(|setup| &setup.writer);
        // The FIFO's reader outlives the clients: a child that writes its last line to a FIFO nobody reads
        // would wait forever, and its `lock` process with it.
        let outside_stop = CancellationToken::new();
        let started = start_outside_clients(
            (&scenario, writer),
            &masters,
            &recorder,
            &outside_stop,
            &holders_stop,
        );
        let (outside, outside_follower) = match started {
            Some((outside, follower, clients)) => {
                holder_tasks.extend(clients);
                (Some(outside), Some(follower))
            }
            None => (None, None),
        };
        let rng = StdRng::seed_from_u64(scenario.seed);
        Self {
            outside,
            fenced_policy: fenced.and_then(|setup| setup.policy),
            outside_stop,
            outside_follower,
            scenario,
            masters,
            sides,
            recorder,
            rng,
            holders_stop,
            holder_tasks,
        }
    }

    /// Heals everything, lets the holders see the last of it, stops them, and checks the history.
    async fn finish(mut self, from: Instant) -> Report {
        nemesis::heal(&mut self);
        // Beliefs that the last faults left open end by their fence time at the latest.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let to = Instant::now();
        self.holders_stop.cancel();
        for task in std::mem::take(&mut self.holder_tasks) {
            let _ = task.await;
        }
        self.outside_stop.cancel();
        if let Some(follower) = self.outside_follower.take() {
            let _ = follower.await;
        }
        let report = checker::check(
            &self.recorder,
            &self.keys(),
            (from, to),
            &self.bounds(),
            (self.masters.len(), quarantine(self.scenario.ttl)),
        );
        let mut report = report;
        report.fences = fences::Fences(
            self.sides
                .iter()
                .flat_map(|side| &side.replicas)
                .flat_map(|replica| fences::parse(&replica.log()))
                .collect(),
        );
        if self.scenario.fences_before_validity {
            report.late_fences = report.fences.late();
        }
        report.late_beliefs = self.recorder.late_beliefs();
        report.holder_cuts = self.recorder.cuts.all();
        report.broken_promises = self.recorder.broken_promises();
        if self.scenario.grants_after_quarantine {
            report.broken_promises.extend(controls::grants_in_quarantine(
                &self.recorder,
                self.masters.len(),
                quarantine(self.scenario.ttl),
            ));
        }
        let verbose = std::env::var_os("REDLOCK_SAFETY_LOG").is_some();
        if !report.is_safe() || verbose {
            for event in self.recorder.nemesis_events() {
                eprintln!("{:?} nemesis: {}", event.at, event.what);
            }
            for side in &self.sides {
                for replica in &side.replicas {
                    eprintln!(
                        "--- log of {} (last lines) ---\n{}",
                        replica.identity,
                        replica.log_tail(if verbose { 400 } else { 40 })
                    );
                }
            }
        }
        drop(self.fenced_policy.take());
        for side in &mut self.sides {
            for replica in &mut side.replicas {
                replica.kill();
            }
            side.cluster.cleanup(&side.quorum).await;
        }
        report
    }

    /// How many holders each key admits at once: the churn keys' and the leader locks' permits, one elsewhere.
    pub fn bounds(&self) -> Bounds {
        let mut bounds = Bounds::default();
        for index in 0..self.scenario.leader_locks {
            bounds.set(&format!("shared:key-{index}"), self.scenario.leader_permits);
        }
        let churn_keys = self.scenario.churn_keys.max(self.scenario.job_locks);
        for index in 0..churn_keys {
            bounds.set(&format!("shared:churn-{index}"), self.scenario.permits);
        }
        bounds
    }

    /// Every key the workloads use.
    pub fn keys(&self) -> Vec<String> {
        let mut keys: Vec<String> = self
            .sides
            .iter()
            .flat_map(|side| {
                let leaders = side.leaders.iter().map(|set| set.key.clone());
                let identities = side.identities.iter().map(|lock| lock.key.clone());
                leaders
                    .chain(identities)
                    .chain(side.jobs.iter().map(|lock| lock.key.clone()))
            })
            .collect();
        if self.scenario.outside_clients > 0 {
            keys.extend((0..self.scenario.churn_keys).map(|index| format!("shared:churn-{index}")));
        }
        keys.sort();
        keys.dedup();
        keys
    }
}

/// The first cluster is the real one of `REDLOCK_E2E_KUBECONFIG` when set, the second that of
/// `REDLOCK_E2E_KUBECONFIG_B`; a test API server otherwise.
fn kubeconfig_of(index: usize) -> Option<PathBuf> {
    let variable = if index == 0 {
        "REDLOCK_E2E_KUBECONFIG"
    } else {
        "REDLOCK_E2E_KUBECONFIG_B"
    };
    std::env::var_os(variable).map(PathBuf::from)
}

/// Waits until every master of the side's quorum can vote (fresh masters are quarantined for maxTtl first).
async fn all_masters_voting(side: &Side) {
    let api = side.cluster.quorums();
    crate::e2e::eventually_within("every master out of quarantine", Duration::from_secs(120), || {
        let api = api.clone();
        async move {
            let quorum = api.get(&side.quorum).await.ok()?;
            (i64::from(quorum.status?.eligible?) == MASTERS as i64).then_some(())
        }
    })
    .await;
}
