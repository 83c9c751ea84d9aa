//! `redlock-operator run`, as a library function: the metrics/health server, the reports port, the Lease election, the keeper
//! of held locks and the two controllers, stopped together by one token. Tests run exactly this in-process.

pub mod routing;
pub mod watch_filter;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt, TryStreamExt};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::runtime::controller::{Config as ControllerConfig, Controller};
use kube::runtime::reflector;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use self::routing::{lock_of_job, lock_trigger, locks_of_pod, pod_trigger};
use self::watch_filter::{changed_or_deleted, watch_backoff, without_errors};
use super::cache::pod_cache::trim_pod;
use super::cache::pod_index::PodIndex;
use super::context::Context;
use super::engines::Engines;
use super::installation_secret::InstallationSecret;
use super::keeper::{Keeper, LockRef};
use super::lock::controller_state::{LockContext, LockControllerState};
use super::replica_lease::write_guard::writes_only_while_active;
use super::replica_lease::{Elector, Leadership, LeaseTiming};
use super::{lock, quorum};
use crate::api::holder_contract::{LOCK_LABEL, STOPPED_REPORT_PATH};
use crate::api::{DistributedLock, RedisQuorum};
use crate::report_channel;
use crate::report_channel::identity::{Identity, IdentityError, KeySource};
use crate::telemetry::events::{Recorder, Reporter};
use crate::telemetry::health::Health;
use crate::telemetry::metrics::Metrics;
use crate::telemetry::server;

/// Reconciliations running at once per controller: enough to acquire thousands of new locks quickly without
/// flooding the API server.
const CONCURRENCY: u16 = 64;

pub struct ElectionOptions {
    pub namespace: String,
    pub lease_name: String,
    pub identity: String,
    pub timing: LeaseTiming,
}

pub struct RunOptions {
    pub metrics_addr: SocketAddr,
    /// Where holders' reports are taken, over TLS; `None`: no reports port is opened.
    pub reports_addr: Option<SocketAddr>,
    /// Connections the reports port keeps open at once.
    pub reports_max_connections: usize,
    /// The reports port's key: made at start, or read from files.
    pub reports_key: KeySource,
    /// `None`: this process is the only replica and always active.
    pub election: Option<ElectionOptions>,
    pub secret: InstallationSecret,
    pub health_interval: Duration,
    /// The one namespace quorum Secrets are read from.
    pub secrets_namespace: String,
    /// Name shown as the reporting instance of Events.
    pub instance: String,
    /// This installation's name, recorded on the locks it keeps; `None`: its Lease's `<namespace>/<name>`, or
    /// with no election `<secrets namespace>/<instance>`.
    pub installation: Option<String>,
    /// Which locks this installation looks at: those in these namespaces (all when empty) matching this label
    /// selector (all when `None`). Others never enter its cache.
    pub scope: LockScope,
    /// Where holders reach this replica to report their work stopped (`https://<pod IP>:<port>/v1/stopped`),
    /// shown in each lock's status with the pin of the reports port's certificate. `None`: the reports address
    /// when it is a specific loopback or IP address, else no reports are taken and a given-up key waits for the
    /// validity shown to its holder.
    pub hand_over_url: Option<String>,
}

/// The locks (and quorums) an installation looks at, for teams that run their own (as cert-manager and ingress
/// controllers scope theirs).
#[derive(Clone, Debug, Default)]
pub struct LockScope {
    pub namespaces: Vec<String>,
    pub selector: Option<String>,
    /// The RedisQuorums this installation looks at (a label selector; all when `None`). Quorums are cluster-scoped
    /// and an installation writes the status and Events of every quorum it looks at: two installations whose
    /// Secrets namespaces differ would each write their own verdict on the other's quorum (one of them "the Secret
    /// is in a namespace not allowed"), so that its status flapped. Selecting keeps each installation to its own.
    pub quorum_selector: Option<String>,
}

impl LockScope {
    /// Whether a lock in `namespace` is in scope (the selector is the API server's to apply). Pure.
    pub fn covers(&self, namespace: Option<&str>) -> bool {
        self.namespaces.is_empty()
            || namespace.is_some_and(|namespace| self.namespaces.iter().any(|scoped| scoped == namespace))
    }
}

impl RunOptions {
    /// The installation's name: what every replica of one installation shares, and two installations do not.
    pub fn installation_name(&self) -> String {
        if let Some(name) = &self.installation {
            return name.clone();
        }
        match &self.election {
            Some(election) => format!("{}/{}", election.namespace, election.lease_name),
            None => format!("{}/{}", self.secrets_namespace, self.instance),
        }
    }
}

/// The report address when none is given: the reports port's, when it is bound to an address holders can reach
/// by that name (a loopback or a pod IP), not to every interface.
fn default_hand_over_url(reports_addr: SocketAddr) -> Option<String> {
    (!reports_addr.ip().is_unspecified()).then(|| hand_over_url_at(reports_addr))
}

/// `https://<addr>/v1/stopped`.
pub fn hand_over_url_at(addr: SocketAddr) -> String {
    format!("https://{addr}{STOPPED_REPORT_PATH}")
}

/// A started operator.
pub struct Running {
    pub metrics_addr: SocketAddr,
    /// Where the reports port listens (TLS); `None`: it is not opened.
    pub reports_addr: Option<SocketAddr>,
    /// The pin of its certificate.
    pub reports_pin: String,
    pub leadership: Arc<Leadership>,
    pub keeper: Arc<Keeper>,
    pub task: JoinHandle<()>,
}

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error(transparent)]
    ReportsKey(#[from] IdentityError),
}

/// Starts everything and returns once the metrics port is bound. Cancelling `shutdown` stops the controllers,
/// stops extending (without releasing: holders are alive, the next replica resumes), then hands the Lease back.
pub async fn start(
    client: Client,
    options: RunOptions,
    shutdown: CancellationToken,
) -> Result<Running, RunError> {
    let metrics = Arc::new(Metrics::default());
    let health = Arc::new(Health::new(&["distributedlocks", "redisquorums", "pods", "jobs"]));
    let server_stop = CancellationToken::new();
    let listener = server::bind(options.metrics_addr)
        .await
        .map_err(|source| RunError::Listen {
            addr: options.metrics_addr,
            source,
        })?;
    let metrics_addr = listener.local_addr;
    let reports_listener = match options.reports_addr {
        Some(addr) => Some(
            report_channel::server::bind(addr)
                .await
                .map_err(|source| RunError::Listen { addr, source })?,
        ),
        None => None,
    };
    let reports_addr = reports_listener.as_ref().map(|listener| listener.local_addr);
    let hand_over_url = match reports_addr {
        Some(addr) => options
            .hand_over_url
            .clone()
            .or_else(|| default_hand_over_url(addr)),
        None => None,
    };
    let reports_identity = Identity::new(&options.reports_key, &certificate_names(hand_over_url.as_deref()))?;
    match &hand_over_url {
        Some(url) => {
            tracing::info!(%url, certificate_sha256 = %reports_identity.pin, "holders report their work stopped here, over TLS to this certificate (status shows its pin): a key given up is released at once on their word")
        }
        None => tracing::warn!(
            "no --hand-over-url: holders cannot report their work stopped, so every key given up waits for the validity shown to its holder"
        ),
    }

    let installation = options.installation_name();
    let election_stop = CancellationToken::new();
    let (leadership, elector_task) = match options.election {
        Some(election) => {
            let api = Api::namespaced(client.clone(), &election.namespace);
            let (elector, leadership) =
                Elector::new(api, &election.lease_name, &election.identity, election.timing);
            (leadership, Some(tokio::spawn(elector.run(election_stop.clone()))))
        }
        None => (Leadership::always(), None),
    };

    let engines = Arc::new(Engines::default());
    let (keeper, wakes) = Keeper::new(metrics.clone(), options.secret.is_shared());
    let keeper_stop = CancellationToken::new();
    let keeper_task = tokio::spawn(keeper.clone().keep(
        engines.clone(),
        leadership.clone(),
        keeper_stop.clone(),
    ));

    let locks_api: Api<DistributedLock> = Api::all(client.clone());
    let quorums_api: Api<RedisQuorum> = Api::all(client.clone());
    let (lock_store, lock_writer) = reflector::store::<DistributedLock>();
    let (quorum_store, quorum_writer) = reflector::store::<RedisQuorum>();
    let (pod_store, pod_writer) = reflector::store::<Pod>();
    let (job_store, job_writer) = reflector::store::<Job>();
    let pod_index = Arc::new(PodIndex::default());

    // What the reconcilers, the reports endpoint and the Event recorder call the API server with: it sends no
    // write while this replica is not the active one. The watches read through the client itself.
    let writer = writes_only_while_active(client.clone(), leadership.clone());
    let recorder = Recorder::new(
        writer.clone(),
        Reporter {
            controller: "redlock-operator".into(),
            instance: Some(options.instance.clone()),
        },
    );
    tracing::info!(%installation, "this installation keeps the locks that carry its name in the annotation redlock.io/installation (and claims unclaimed ones); locks another installation keeps are left alone");
    let ctx = Arc::new(Context {
        client: writer,
        engines: engines.clone(),
        keeper: keeper.clone(),
        leadership: leadership.clone(),
        metrics: metrics.clone(),
        recorder,
        secret: options.secret,
        health_interval: options.health_interval,
        secrets_namespace: options.secrets_namespace,
        installation,
        quorum_selector: options.scope.quorum_selector.clone(),
        locks: lock_store.clone(),
        quorums: quorum_store.clone(),
        pods: pod_store.clone(),
        pod_index: pod_index.clone(),
        jobs: job_store.clone(),
        failures: Default::default(),
    });
    let lock_ctx = Arc::new(LockContext {
        shared: ctx.clone(),
        lock_controller: LockControllerState::new(
            hand_over_url.clone(),
            hand_over_url.as_ref().map(|_| reports_identity.pin.clone()),
        ),
    });
    let server_task = listener.serve(metrics.clone(), health.clone(), server_stop.clone());
    // With no address shown in status, nobody is told where to report: the port is closed rather than served.
    let reports_task = match reports_listener.filter(|_| hand_over_url.is_some()) {
        Some(reports_listener) => {
            let addr = reports_listener.local_addr;
            Some(
                reports_listener
                    .serve_reports_apart(
                        report_channel::server::Bounds::with_connections(options.reports_max_connections),
                        reports_identity.server_config.clone(),
                        lock::reports::endpoint::router(lock_ctx.clone()),
                        server_stop.clone(),
                    )
                    .map_err(|source| RunError::Listen { addr, source })?,
            )
        }
        None => None,
    };

    let lock_health = health.clone();
    let mut lock_watch = watcher::Config::default();
    if let Some(selector) = &options.scope.selector {
        lock_watch = lock_watch.labels(selector);
    }
    tracing::info!(namespaces = ?options.scope.namespaces, selector = ?options.scope.selector, quorum_selector = ?options.scope.quorum_selector, "locks and quorums looked at (all when empty)");
    let scope = options.scope.clone();
    let lock_events = without_errors(
        watcher(locks_api, lock_watch)
            .try_filter(move |event| {
                let in_scope = match event {
                    watcher::Event::Apply(lock)
                    | watcher::Event::InitApply(lock)
                    | watcher::Event::Delete(lock) => scope.covers(lock.metadata.namespace.as_deref()),
                    watcher::Event::Init | watcher::Event::InitDone => true,
                };
                std::future::ready(in_scope)
            })
            .backoff(watch_backoff())
            // Nothing reads them, and the status is written as a patch: every status refresh's watch event would
            // otherwise keep a copy of the managers' bookkeeping per lock.
            .modify(|lock| lock.metadata.managed_fields = None)
            .reflect(lock_writer)
            .inspect(move |event| record_watch(&lock_health, "distributedlocks", event))
            .touched_objects()
            .predicate_filter(lock_trigger, Default::default()),
    );
    let quorum_health = health.clone();
    let quorum_engines = engines.clone();
    let deleted_ctx = ctx.clone();
    let mut quorum_watch = watcher::Config::default();
    if let Some(selector) = &options.scope.quorum_selector {
        quorum_watch = quorum_watch.labels(selector);
    }
    let quorum_events = watcher(quorums_api, quorum_watch)
        .backoff(watch_backoff())
        .reflect(quorum_writer)
        .inspect(move |event| {
            record_watch(&quorum_health, "redisquorums", event);
            if let Ok(watcher::Event::Delete(quorum)) = event {
                // The locks on it learn at once that it is gone, instead of being extended on a stale engine.
                quorum_engines.remove(&quorum.name_any());
                deleted_ctx.wake_locks_on(&quorum.name_any());
                deleted_ctx.metrics.forget_quorum(&quorum.name_any());
                deleted_ctx.succeeded(&kube::runtime::reflector::ObjectRef::from_obj(quorum));
            }
        })
        .touched_objects()
        .predicate_filter(kube::runtime::predicates::generation, Default::default());
    let quorum_events = without_errors(quorum_events);

    let pod_health = health.clone();
    let pod_events = without_errors(changed_or_deleted(
        watcher(Api::<Pod>::all(client.clone()), watcher::Config::default())
            .backoff(watch_backoff())
            .modify(trim_pod)
            .reflect(pod_writer)
            .inspect(move |event| {
                if let Ok(event) = event {
                    pod_index.apply(event);
                }
                record_watch(&pod_health, "pods", event);
            }),
        pod_trigger,
    ));
    let pod_locks = lock_store.clone();
    let locks_of_pod = move |pod: Pod| locks_of_pod(&pod_locks.state(), &pod);

    // Only Jobs that queue for a lock are watched.
    let job_health = health.clone();
    let job_events = without_errors(
        watcher(
            Api::<Job>::all(client.clone()),
            watcher::Config::default().labels(LOCK_LABEL),
        )
        .backoff(watch_backoff())
        .reflect(job_writer)
        .inspect(move |event| record_watch(&job_health, "jobs", event))
        .touched_objects(),
    );

    let became_leader = leader_edges(&leadership);
    let lock_controller = Controller::for_stream(lock_events, lock_store)
        .with_config(ControllerConfig::default().concurrency(CONCURRENCY))
        .reconcile_on(receiver_stream(wakes))
        .watches_stream(pod_events, locks_of_pod)
        .watches_stream(job_events, |job: Job| lock_of_job(&job))
        .reconcile_all_on(became_leader)
        .graceful_shutdown_on(shutdown.clone().cancelled_owned())
        .run(
            lock::reconcile::reconcile,
            lock::reconcile::error_policy,
            lock_ctx,
        )
        .for_each(|_| async {});
    let quorum_controller = Controller::for_stream(quorum_events, quorum_store)
        .with_config(ControllerConfig::default().concurrency(CONCURRENCY))
        .reconcile_all_on(leader_edges(&leadership))
        .graceful_shutdown_on(shutdown.clone().cancelled_owned())
        .run(
            quorum::reconcile::reconcile,
            quorum::reconcile::error_policy,
            ctx.clone(),
        )
        .for_each(|_| async {});

    let leader_gauge = metrics.clone();
    let mut leader_changes = leadership.subscribe();
    let gauge_stop = shutdown.clone();
    let gauge_task = tokio::spawn(async move {
        loop {
            leader_gauge.set_leader(*leader_changes.borrow_and_update());
            tokio::select! {
                changed = leader_changes.changed() => if changed.is_err() { return },
                () = gauge_stop.cancelled() => return,
            }
        }
    });

    let task = tokio::spawn(async move {
        tokio::join!(lock_controller, quorum_controller);
        keeper_stop.cancel();
        let _ = keeper_task.await;
        let held = ctx.keeper.len();
        if held > 0 {
            tracing::info!(
                locks = held,
                "stopped without releasing held locks: the next active replica resumes them"
            );
        }
        election_stop.cancel();
        if let Some(elector) = elector_task {
            let _ = elector.await;
        }
        gauge_task.abort();
        server_stop.cancel();
        let _ = server_task.await;
        if let Some(reports_task) = reports_task {
            let _ = reports_task.await;
        }
    });
    Ok(Running {
        metrics_addr,
        reports_addr,
        reports_pin: reports_identity.pin,
        leadership,
        keeper,
        task,
    })
}

fn record_watch<K>(health: &Health, name: &str, event: &Result<watcher::Event<K>, watcher::Error>) {
    match event {
        Ok(watcher::Event::InitDone) => health.watch_synced(name),
        Ok(_) => health.watch_ok(name),
        Err(_) => health.watch_failed(name),
    }
}

/// Fires each time this replica becomes the active one, so that it resumes every lock at once.
fn leader_edges(leadership: &Leadership) -> impl Stream<Item = ()> + Send + 'static {
    futures::stream::unfold(leadership.subscribe(), |mut changes| async move {
        loop {
            changes.changed().await.ok()?;
            if *changes.borrow_and_update() {
                return Some(((), changes));
            }
        }
    })
}

fn receiver_stream(
    receiver: tokio::sync::mpsc::UnboundedReceiver<LockRef>,
) -> impl Stream<Item = LockRef> + Send + 'static {
    futures::stream::unfold(receiver, |mut receiver| async move {
        receiver.recv().await.map(|lock| (lock, receiver))
    })
}

/// The names the generated certificate carries: the host of the hand-over URL, for people who look at it (holders
/// check its pin, not its names).
fn certificate_names(hand_over_url: Option<&str>) -> Vec<String> {
    hand_over_url
        .and_then(|url| url::Url::parse(url).ok())
        .and_then(|url| report_channel::client::bare_host(&url))
        .into_iter()
        .collect()
}
