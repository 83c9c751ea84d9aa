//! An in-process Kubernetes API server for integration tests.
//!
//! [`TestApiServer`] serves the resources the operator and the test harnesses use over plain HTTP/1.1 on
//! loopback, so the real controller (`kube::Client`, `kube_runtime` watcher, reflector and `Controller`, the
//! events `Recorder`, the finalizer helper) runs with no cluster. The same end-to-end tests also run against a
//! real cluster, so everything it does follows the real API server (kube-apiserver 1.33 and the generic
//! registry); where it cannot, it says so below rather than invent behaviour. It serves what those users need
//! and nothing more: a request for anything else is refused rather than half-served.
//!
//! # What it models
//!
//! - Resources (a fixed table, `kinds.rs`): core/v1 pods, secrets, configmaps, namespaces, nodes;
//!   events.k8s.io/v1 events; coordination.k8s.io/v1 leases; batch/v1 jobs; redlock.io/v1beta1
//!   distributedlocks and redisquorums; apiextensions.k8s.io/v1 customresourcedefinitions.
//! - Metadata (`meta.rs`, `write.rs`): random uid, creationTimestamp, one global resourceVersion counter,
//!   generation (kinds that track it: bumped when anything outside metadata and status changes, and when
//!   deletion starts), generateName, empty metadata fields dropped as Go's `omitempty` does. No-op writes store
//!   nothing and send no event.
//! - GET, LIST (`routes.rs`; label selectors with `=`, `==`, `!=`, `in`, `notin`, exists, `!key`; field
//!   selectors on metadata.name and metadata.namespace; `limit`/`continue` over a consistent snapshot), WATCH
//!   (`watch.rs`; resourceVersion with a bounded per-resource history and 410 Expired when it is too old,
//!   synthetic ADDED events for `resourceVersion` ""/"0", periodic bookmarks, `timeoutSeconds`, objects leaving
//!   a selector sent as DELETED), CREATE, REPLACE, PATCH (`patch.rs`: merge, JSON patch with the Go library's
//!   `test` semantics, server-side apply), DELETE and DELETECOLLECTION.
//! - Optimistic concurrency: resourceVersion and uid preconditions in bodies and patches; PUT without
//!   resourceVersion only where the real strategy allows an unconditional update (not for custom resources,
//!   CRDs or leases: 422 there, as on a real server).
//! - Status subresources (`strategy.rs`): the main resource keeps the stored status; `/status` changes only
//!   status for custom resources and CRDs, and status plus metadata for built-in kinds.
//! - Finalizers and deletionTimestamp (`lifecycle.rs`); no new finalizers once deletion started (422). Pods are
//!   deleted gracefully when scheduled (`spec.nodeName` set) and not finished, exactly as the pod strategy
//!   decides; a background sweep plays the kubelet's final `gracePeriodSeconds=0` delete when the grace period
//!   (`terminationGracePeriodSeconds`, 30 when unset) has elapsed, so tests can observe terminating pods.
//! - Custom resources are served only while their CRD exists.
//! - What `kubectl` needs (`apply`, `get`, `wait`, `delete`): discovery of the served resources with their short
//!   names and categories (`discovery.rs`), OpenAPI v3 documents listing their operations and parameters, with
//!   the CRDs' schemas (`openapi.rs`), `fieldValidation=Strict` for custom resources (`field_validation.rs`),
//!   and the Table format of custom resources from their CRDs' printer columns (`table.rs`). Each file's header
//!   says what of the real behaviour it leaves out.
//! - The pod garbage collector's removal of orphaned pods (`pod_gc.rs`): pods bound to a node that does not
//!   exist are marked Failed and force-deleted after a quarantine, as kube-controller-manager does, on a
//!   quicker clock ([`PodGc::QUICK`]; [`TestApiServer::set_pod_gc`], `REDLOCK_E2E_POD_GC_QUARANTINE`). Pods
//!   must be bound to a registered node (`support::node`), as on a real cluster.
//! - Service-account tokens bound to pods (`tokens.rs`): TokenRequest and TokenReview, with the real server's
//!   binding, audience, expiry and pod-deletion rules.
//! - ValidatingAdmissionPolicies and their bindings (`admission.rs`): stored, and evaluated on every create and
//!   update with their params (`paramKind`, `paramRef`), variables, match conditions and message expressions;
//!   the refusal worded as the real server words it.
//! - Test controls (`controls.rs`): [`TestApiServer::fail_next`], [`TestApiServer::set_down`],
//!   [`TestApiServer::request_count`]; [`TestApiServer::set_pod_gc`], [`TestApiServer::pod_gc_passes`].
//!
//! # What it leaves out
//!
//! - Authentication, authorization, admission but ValidatingAdmissionPolicies (no webhooks, no
//!   MutatingAdmissionPolicies and no built-in admission plugins such as ServiceAccount or LimitRanger), API
//!   priority and fairness, TLS, protobuf and CBOR, aggregated discovery,
//!   `/version`, OpenAPI v2, Tables of built-in kinds and of watches, `fieldValidation` beyond `Strict` on
//!   custom resources. Refused with 400 so that a test cannot silently depend on them: `dryRun`, DeleteOptions preconditions, streaming lists (`sendInitialEvents`,
//!   `resourceVersionMatch` on a watch) and LIST with `resourceVersionMatch=Exact`.
//! - Kinds: only those in the table (no core/v1 view of events); field selectors on a kind's
//!   own field labels (`spec.nodeName`, `involvedObject.name`, …) are refused with 400. Strategic merge patch
//!   is refused with 415 for every kind (a real server accepts it for built-in kinds).
//! - Validation: no OpenAPI value validation of custom resources (types, patterns, lengths, required fields), no
//!   validation of built-in kinds (but one rule: a Job's pod template is immutable, except its labels,
//!   annotations and scheduling directives while the Job is suspended and never started), no name format
//!   checks, no pruning of unknown fields (they are stored as sent; `fieldValidation=Strict` refuses them). A custom resource's CEL rules
//!   (`x-kubernetes-validations`) are evaluated on every write, after defaulting, from the schema of its stored
//!   CRD, with transition rules and ratcheting (`custom_schema.rs`, `validation_rules.rs`).
//! - Defaulting: a custom resource's schema defaults (and its nulls in fields that are not nullable dropped) on
//!   every write; none for built-in kinds, except what the strategies do at creation: pod status phase
//!   Pending, job selector and template labels, CRD status (NamesAccepted and Established at once); a Secret's
//!   `stringData` is folded into `data` on every write. Built-in kinds drop JSON nulls as typed decoding does.
//! - The custom resource kinds are fixed in the table; of a CRD, only the schema of the served version is read
//!   (its other versions and subresources are not);
//!   `table.rs` reads its printer columns.
//! - Server-side apply merges the applied configuration into the live object (maps merged recursively, lists
//!   replaced as a whole). `fieldManager` is required and `force` accepted, but field ownership,
//!   `managedFields`, conflicts between managers and removal of fields a manager stops applying are not
//!   modelled. `managedFields` and `selfLink` are never stored.
//! - PUT never creates (no AllowCreateOnUpdate for events or leases).
//! - No controllers but the pod garbage collector's orphan pass: no garbage collector (ownerReferences are
//!   stored, `propagationPolicy` is accepted and ignored, no `orphan`/`foregroundDeletion` finalizers are
//!   added, so a Job is removed at once and its pods stay), no scheduler, kubelet (beyond the grace-period
//!   sweep), job controller, node lifecycle controller (a node's conditions and Lease are stored, never
//!   judged), namespace controller or CRD cleanup. Objects can be created in namespaces that do not exist, and
//!   deleting a Namespace or a CRD is refused (405).
//! - Pods track `metadata.generation` as from Kubernetes 1.34 (PodObservedGenerationTracking); a 1.33 server
//!   without that feature leaves it unset.
//! - Watches: a resourceVersion newer than the server's is served as "now" (a real server waits, then answers
//!   504); bookmarks come every second rather than about every minute. A watcher more than `WATCH_BUFFER`
//!   events behind is ended, as a real server ends slow watchers.
//! - `set_down` answers 503 to every request and ends open watches; a restarting real server refuses
//!   connections instead. kube's default client retries 429, 503 and 504 (15 times, backoff doubling from
//!   5 ms), so a call made while down waits for `set_down(false)` rather than failing, and injected faults
//!   with those codes are retried the same way; each retry is counted.
//! - Requests are counted and faults injected per resource plural.

mod admission;
mod apply;
mod controls;
mod custom_schema;
#[allow(unused_imports)] // only the test binaries with end-to-end tests use it
pub use controls::OPERATOR_HEADER;
mod discovery;
mod encode;
mod errors;
mod field_validation;
mod kinds;
mod lifecycle;
mod meta;
mod openapi;
mod patch;
pub mod pod_gc;
pub mod realism;
mod routes;
mod selectors;
mod store;
mod strategy;
mod table;
mod tokens;
mod validation_rules;
mod watch;
mod write;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use axum::Router;
use tokio::sync::{mpsc, oneshot};

use controls::Control;
pub use pod_gc::PodGc;
use realism::{Dice, Realism, SEED_ENV};
use store::State;

/// How often the sweep looks for pods whose grace period is over.
const SWEEP_INTERVAL: Duration = Duration::from_millis(100);
/// How long to keep trying to listen on the same port again after an outage.
const REBIND_PATIENCE: Duration = Duration::from_secs(10);

/// An API server on 127.0.0.1 with its own runtime thread; it shuts down when dropped.
pub struct TestApiServer {
    shared: Arc<Shared>,
    commands: mpsc::UnboundedSender<Command>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// What the test asks of the server thread.
enum Command {
    Stop,
    /// Stop listening and end every connection (true), or listen again on the same port (false); answered once
    /// done.
    Unreachable(bool, oneshot::Sender<()>),
}

impl TestApiServer {
    /// The quick mode: binds 127.0.0.1 on a free port and answers every request at once.
    pub async fn start() -> TestApiServer {
        Self::launch(Realism::quick())
    }

    /// The realistic mode `realism` describes; prints its seed, so that a failing run can be repeated.
    pub async fn start_with(realism: Realism) -> TestApiServer {
        let server = Self::launch(realism);
        eprintln!(
            "test API server at {} in realistic mode, seed {} (set {SEED_ENV}={} to repeat it)",
            server.url(),
            server.shared.realism.seed,
            server.shared.realism.seed,
        );
        server
    }

    /// The realistic mode ([`Realism::typical`]) when `REDLOCK_E2E_REALISTIC=1`, the quick one otherwise; the
    /// pod garbage collector as `REDLOCK_E2E_POD_GC_QUARANTINE` says ([`PodGc::from_env`]).
    pub async fn start_from_env() -> TestApiServer {
        let server = match Realism::from_env() {
            Some(realism) => Self::start_with(realism).await,
            None => Self::start().await,
        };
        server.set_pod_gc(PodGc::from_env());
        server
    }

    fn launch(realism: Realism) -> TestApiServer {
        let listener = std::net::TcpListener::bind(("127.0.0.1", 0)).expect("bind the test API server");
        let addr = listener.local_addr().expect("listener address");
        let shared = Arc::new(Shared::new(addr, realism));
        let (commands, received) = mpsc::unbounded_channel();
        let server = shared.clone();
        // Its own runtime, so the server keeps answering whatever the test's runtime is doing (blocked in a
        // sync call, current-thread, shutting down between tests).
        let thread = std::thread::Builder::new()
            .name("test-apiserver".into())
            .spawn(move || run_server(listener, server, received))
            .expect("spawn the test API server thread");
        TestApiServer {
            shared,
            commands,
            thread: Some(thread),
        }
    }

    /// `http://127.0.0.1:PORT`
    pub fn url(&self) -> String {
        format!("http://{}", self.shared.addr)
    }

    /// A client with no authentication and the default namespace `default` (call it inside a tokio runtime:
    /// kube's client spawns its request buffer there).
    pub fn client(&self) -> kube::Client {
        let uri = self.url().parse().expect("server URL");
        kube::Client::try_from(kube::Config::new(uri)).expect("kube client")
    }

    /// A client for the cluster's own controllers played next to this server (the Job controller and kubelet):
    /// their informers are long synced on a real cluster, so the realistic mode's late lists, which model the
    /// operator's informers starting up, do not apply to them. Request latency still does.
    pub fn controller_client(&self) -> kube::Client {
        let mut config = kube::Config::new(self.url().parse().expect("server URL"));
        config.headers.push((
            axum::http::HeaderName::from_static(routes::SYNCED_CONTROLLER_HEADER),
            axum::http::HeaderValue::from_static("true"),
        ));
        kube::Client::try_from(config).expect("kube client")
    }

    /// Writes a kubeconfig pointing at this server (context `test-apiserver`, namespace `default`).
    pub fn write_kubeconfig(&self, path: &Path) -> std::io::Result<()> {
        let kubeconfig = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: test-apiserver\n  cluster:\n    server: {}\n\
             contexts:\n- name: test-apiserver\n  context:\n    cluster: test-apiserver\n    user: test-apiserver\n    \
             namespace: default\ncurrent-context: test-apiserver\nusers:\n- name: test-apiserver\n  user: {{}}\n",
            self.url()
        );
        std::fs::write(path, kubeconfig)
    }

    /// Fault injection: the next `count` requests matching `verb` ("create", "update", "patch", "delete",
    /// "deletecollection", "get", "list", "watch" or "*") on `plural` ("*" for any, `plural/status` for the
    /// status subresource only) fail with HTTP `code` and a metav1.Status body.
    pub fn fail_next(&self, verb: &str, plural: &str, code: u16, count: usize) {
        self.shared.control().add_fault(verb, plural, code, count);
    }

    /// From now on, lists of `plural` (other than the simulated controllers') are answered `delay` later, showing
    /// the state as of the request: an API server slow to list a large resource.
    pub fn slow_lists(&self, plural: &str, delay: Duration) {
        self.shared.control().slow_lists(plural, delay);
    }

    /// While down, every request gets 503 and every open watch is ended (an API server that answers but
    /// cannot serve: its storage is unavailable).
    pub fn set_down(&self, down: bool) {
        self.shared.down.store(down, Ordering::SeqCst);
        if down {
            self.shared.lock().end_watches();
        }
    }

    /// While unreachable, nothing listens on the server's port (connections are refused) and every open
    /// connection and watch has been ended, as when an API server restarts; afterwards it listens on the same
    /// port again, with its state kept. Returns once the switch is done.
    pub async fn set_unreachable(&self, unreachable: bool) {
        let (done, switched) = oneshot::channel();
        if self
            .commands
            .send(Command::Unreachable(unreachable, done))
            .is_ok()
        {
            let _ = switched.await;
        }
    }

    /// The pod garbage collector's timing from its next pass on, or `None` to turn it off ([`PodGc::QUICK`]
    /// from the start). Turning it off forgets the nodes in quarantine, as a restarted controller-manager does.
    pub fn set_pod_gc(&self, timing: Option<PodGc>) {
        // Between passes: a pass runs under the store's lock.
        let _between_passes = self.shared.lock();
        *self.shared.pod_gc.lock().unwrap_or_else(PoisonError::into_inner) = timing;
    }

    /// How many passes the pod garbage collector has made: a test waits for passes rather than for time.
    pub fn pod_gc_passes(&self) -> u64 {
        self.shared.pod_gc_passes.load(Ordering::SeqCst)
    }

    /// Requests received so far for `verb` on `plural` ("*" matches any; `plural` includes its status
    /// subresource, `plural/status` is the subresource alone). Failed requests count too (refused while
    /// down, injected faults), and so does each retry kube's client makes of a 429, 503 or 504.
    pub fn request_count(&self, verb: &str, plural: &str) -> u64 {
        self.shared.control().count_of(verb, plural)
    }

    /// Lists of `plural` by the operator's own client (the end-to-end tests' operator) whose label selector
    /// starts with `selector`: its direct reads, apart from its caches' relists.
    pub fn operator_lists_selecting(&self, plural: &str, selector: &str) -> u64 {
        self.shared.control().operator_lists_selecting(plural, selector)
    }
}

impl Drop for TestApiServer {
    fn drop(&mut self) {
        let _ = self.commands.send(Command::Stop);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// What the request handlers share: the store, the test controls, the down switch and the realistic mode.
struct Shared {
    addr: SocketAddr,
    state: Mutex<State>,
    control: Mutex<Control>,
    down: AtomicBool,
    realism: Realism,
    dice: Dice,
    pod_gc: Mutex<Option<PodGc>>,
    pod_gc_passes: AtomicU64,
    tokens: tokens::Tokens,
}

impl Shared {
    fn new(addr: SocketAddr, realism: Realism) -> Self {
        Shared {
            addr,
            state: Mutex::new(State::new(realism.history)),
            control: Mutex::default(),
            down: AtomicBool::new(false),
            dice: Dice::new(realism.seed),
            realism,
            pod_gc: Mutex::new(Some(PodGc::QUICK)),
            pod_gc_passes: AtomicU64::new(0),
            tokens: tokens::Tokens::default(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn control(&self) -> MutexGuard<'_, Control> {
        self.control.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn is_down(&self) -> bool {
        self.down.load(Ordering::SeqCst)
    }

    fn pod_gc(&self) -> Option<PodGc> {
        *self.pod_gc.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Serves until stopped. Each period of listening has a runtime of its own: shutting it down ends every
/// connection and watch at once, which is how an outage begins.
fn run_server(
    listener: std::net::TcpListener,
    shared: Arc<Shared>,
    mut commands: mpsc::UnboundedReceiver<Command>,
) {
    let mut listener = listener;
    loop {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("test-apiserver")
            .enable_all()
            .build()
            .expect("test API server runtime");
        let command = runtime.block_on(serve(listener, shared.clone(), &mut commands));
        // Open connections and watches are tasks of this runtime: dropping them closes their sockets.
        runtime.shutdown_timeout(Duration::from_secs(1));
        let Some(Command::Unreachable(true, done)) = command else {
            return;
        };
        let _ = done.send(());
        listener = loop {
            match commands.blocking_recv() {
                Some(Command::Unreachable(true, done)) => {
                    let _ = done.send(());
                }
                Some(Command::Unreachable(false, done)) => {
                    let listener = bind_again(shared.addr);
                    let _ = done.send(());
                    break listener;
                }
                Some(Command::Stop) | None => return,
            }
        };
    }
}

/// Serves on `listener` until a command ends this period of listening (stop, or an outage).
async fn serve(
    listener: std::net::TcpListener,
    shared: Arc<Shared>,
    commands: &mut mpsc::UnboundedReceiver<Command>,
) -> Option<Command> {
    listener.set_nonblocking(true).expect("non-blocking listener");
    let listener = tokio::net::TcpListener::from_std(listener).expect("tokio listener");
    tokio::spawn(sweep_loop(shared.clone()));
    tokio::spawn(pod_gc::run(shared.clone()));
    let app = Router::new().fallback(routes::handle).with_state(shared);
    let server = axum::serve(listener, app).into_future();
    tokio::pin!(server);
    loop {
        tokio::select! {
            result = &mut server => {
                result.expect("test API server");
                return None;
            }
            command = commands.recv() => match command {
                Some(Command::Unreachable(false, done)) => {
                    let _ = done.send(());
                }
                other => return other,
            },
        }
    }
}

/// The same port again; a moment may pass before the old socket lets go of it.
fn bind_again(addr: SocketAddr) -> std::net::TcpListener {
    let deadline = std::time::Instant::now() + REBIND_PATIENCE;
    loop {
        match std::net::TcpListener::bind(addr) {
            Ok(listener) => return listener,
            Err(error) if std::time::Instant::now() >= deadline => {
                panic!("the test API server cannot listen on {addr} again: {error}")
            }
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

async fn sweep_loop(shared: Arc<Shared>) {
    let mut interval = tokio::time::interval(SWEEP_INTERVAL);
    loop {
        interval.tick().await;
        if !shared.is_down() {
            lifecycle::sweep(&mut shared.lock());
        }
    }
}
