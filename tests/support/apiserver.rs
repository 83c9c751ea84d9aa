//! An in-process Kubernetes API server for integration tests.
//!
//! [`TestApiServer`] serves the resources the operator uses over plain HTTP/1.1 on loopback, so the real
//! controller (`kube::Client`, `kube_runtime` watcher, reflector and `Controller`, the events `Recorder`) runs
//! with no cluster. The same end-to-end tests also run against a real cluster, so everything it does follows
//! the real API server (kube-apiserver 1.33 and the generic registry); where it cannot, it says so below rather
//! than invent behaviour.
//!
//! # What it models
//!
//! - Resources (a fixed table, see `KINDS`): core/v1 pods, secrets, configmaps, namespaces, events;
//!   events.k8s.io/v1 events (the same storage as core/v1 events, two views with renamed fields, as on a real
//!   server); coordination.k8s.io/v1 leases; batch/v1 jobs; redlock.io/v1alpha1 distributedlocks and
//!   redisquorums; apiextensions.k8s.io/v1 customresourcedefinitions.
//! - Metadata: random uid, creationTimestamp, one global resourceVersion counter, generation (kinds that track
//!   it: bumped when anything outside metadata and status changes, and when deletion starts), generateName,
//!   empty metadata fields dropped as Go's `omitempty` does. No-op writes store nothing and send no event.
//! - GET, LIST (label selectors with `=`, `==`, `!=`, `in`, `notin`, exists, `!key`; field selectors on
//!   metadata.name, metadata.namespace and the kind's own field labels; `limit`/`continue` over a consistent
//!   snapshot), WATCH (resourceVersion with a bounded per-resource history and 410 Expired when it is too old,
//!   synthetic ADDED events for `resourceVersion` ""/"0", streaming lists with `sendInitialEvents` and the
//!   `k8s.io/initial-events-end` bookmark, periodic bookmarks, `timeoutSeconds`, objects leaving a selector sent
//!   as DELETED), CREATE, REPLACE, PATCH (merge, JSON patch with the Go library's `test` semantics, strategic
//!   merge for built-in kinds, server-side apply), DELETE and DELETECOLLECTION.
//! - Optimistic concurrency: resourceVersion and uid preconditions in bodies, patches and DeleteOptions; PUT
//!   without resourceVersion only where the real strategy allows an unconditional update (not for custom
//!   resources, CRDs or leases: 422 there, as on a real server).
//! - Status subresources: the main resource keeps the stored status; `/status` changes only status for custom
//!   resources and CRDs, and status plus metadata for built-in kinds (as their strategies do).
//! - Finalizers and deletionTimestamp; no new finalizers once deletion started (422). Pods are deleted
//!   gracefully when scheduled (`spec.nodeName` set) and not finished, exactly as the pod strategy decides;
//!   a background sweep plays the kubelet's final `gracePeriodSeconds=0` delete when the grace period
//!   (`terminationGracePeriodSeconds`, 30 when unset) has elapsed, so tests can observe terminating pods.
//! - Custom resources are served only while their CRD exists; deleting a CRD deletes its instances and the
//!   CRD goes once they are gone (the `customresourcecleanup` finalizer).
//! - Discovery (`/api`, `/apis`, `/api/v1`, `/apis/{group}/{version}`, `/version`).
//! - Test controls: [`TestApiServer::fail_next`], [`TestApiServer::set_down`],
//!   [`TestApiServer::request_count`].
//!
//! # What it leaves out
//!
//! - Authentication, authorization, admission (no webhooks and no built-in admission plugins such as
//!   ServiceAccount or LimitRanger), API priority and fairness, TLS, protobuf and CBOR, `as=Table`, aggregated
//!   discovery, `dryRun` (rejected with 400 so a test cannot silently depend on it), `fieldValidation`.
//! - Validation: no OpenAPI schema or CEL validation of custom resources, no validation of built-in kinds (but
//!   one rule: a Job's pod template is immutable, except its labels, annotations and scheduling directives
//!   while the Job is suspended and never started), no name format checks, no pruning of unknown fields (they
//!   are stored as sent).
//! - Defaulting: none from CRD schemas or for built-in kinds, except what the strategies do at creation:
//!   pod status (Pending and qosClass), job selector and template labels, namespace finalizer and name label,
//!   CRD status (NamesAccepted and Established at once), Secret type Opaque; a Secret's `stringData` is
//!   folded into `data` on every write. Built-in kinds drop JSON nulls as typed decoding does.
//! - The custom resource kinds are fixed in the table; a CRD's schema, versions, subresources and printer
//!   columns are not read.
//! - Server-side apply merges the applied configuration into the live object (maps merged recursively, lists
//!   replaced as a whole). `fieldManager` is required and `force` accepted, but field ownership,
//!   `managedFields`, conflicts between managers and removal of fields a manager stops applying are not
//!   modelled. `managedFields` and `selfLink` are never stored.
//! - Strategic merge patch knows the merge keys of a fixed list of fields (finalizers, ownerReferences,
//!   containers, env, ports, volumes, volumeMounts, conditions, …); other lists are replaced;
//!   `$setElementOrder` is ignored.
//! - No controllers: no garbage collector (ownerReferences are stored, `propagationPolicy` is accepted and
//!   ignored, no `orphan`/`foregroundDeletion` finalizers are added, so a Job is removed at once and its pods
//!   stay), no scheduler, kubelet (beyond the grace-period sweep), job controller or namespace controller.
//!   Objects can be created in namespaces that do not exist, and deleting a Namespace is refused (405).
//! - Pods track `metadata.generation` as from Kubernetes 1.34 (PodObservedGenerationTracking); a 1.33 server
//!   without that feature leaves it unset.
//! - Watches: a resourceVersion newer than the server's is served as "now" (a real server waits, then answers
//!   504); bookmarks come every second rather than about every minute. LIST with `resourceVersionMatch=Exact`
//!   only works for the current resourceVersion (410 otherwise). A watcher more than `WATCH_BUFFER` events
//!   behind is ended, as a real server ends slow watchers.
//! - `set_down` answers 503 to every request and ends open watches; a restarting real server refuses
//!   connections instead. kube's default client retries 429, 503 and 504 (15 times, backoff doubling from
//!   5 ms), so a call made while down waits for `set_down(false)` rather than failing, and injected faults
//!   with those codes are retried the same way; each retry is counted.
//! - Requests are counted and faults injected per resource plural, so `events` covers both event groups.

use std::borrow::Cow;
use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State as AxumState};
use axum::http::{Method, header};
use axum::response::Response;
use json_patch::PatchOperation;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use serde::Serialize;
use serde::ser::{SerializeMap, Serializer};
use serde_json::{Map, Value, json};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

/// Watch events kept per resource for watches that resume from a resourceVersion.
const HISTORY_LIMIT: usize = 10_000;
/// Events a watcher may fall behind before the server ends its watch.
const WATCH_BUFFER: usize = 4_096;
const BOOKMARK_INTERVAL: Duration = Duration::from_secs(1);
/// The real server's default watch timeout is `--min-request-timeout` (1800 s) times a random factor.
const DEFAULT_WATCH_TIMEOUT: Duration = Duration::from_secs(1800);
const SWEEP_INTERVAL: Duration = Duration::from_millis(100);
/// Paginated list snapshots kept for `continue` tokens.
const LIST_SNAPSHOTS: usize = 64;
const MAX_BODY: usize = 16 << 20;
const CRD_CLEANUP_FINALIZER: &str = "customresourcecleanup.apiextensions.k8s.io";
const INITIAL_EVENTS_END: &str = "k8s.io/initial-events-end";
const OPTIMISTIC_LOCK: &str =
    "the object has been modified; please apply your changes to the latest version and try again";

// ------------------------------------------------------------------------------------------------------------
// Public API
// ------------------------------------------------------------------------------------------------------------

/// An API server on 127.0.0.1 with its own runtime thread; it shuts down when dropped.
pub struct TestApiServer {
    shared: Arc<Shared>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl TestApiServer {
    /// Binds 127.0.0.1 on a free port and starts serving.
    pub async fn start() -> TestApiServer {
        let listener = std::net::TcpListener::bind(("127.0.0.1", 0)).expect("bind the test API server");
        listener.set_nonblocking(true).expect("non-blocking listener");
        let addr = listener.local_addr().expect("listener address");
        let shared = Arc::new(Shared::new(addr));
        let (stop, stopped) = oneshot::channel();
        let server = shared.clone();
        // Its own runtime, so the server keeps answering whatever the test's runtime is doing (blocked in a
        // sync call, current-thread, shutting down between tests).
        let thread = std::thread::Builder::new()
            .name("test-apiserver".into())
            .spawn(move || run_server(listener, server, stopped))
            .expect("spawn the test API server thread");
        TestApiServer {
            shared,
            stop: Some(stop),
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
        self.shared.control().faults.push(Fault {
            verb: verb.to_owned(),
            resource: plural.to_owned(),
            code,
            remaining: count,
        });
    }

    /// While down, every request gets 503 and every open watch is ended (like an API server restart).
    pub fn set_down(&self, down: bool) {
        self.shared.down.store(down, Ordering::SeqCst);
        if down {
            let mut state = self.shared.lock();
            for bucket in state.buckets.values_mut() {
                bucket.watchers.clear();
            }
        }
    }

    /// Requests received so far for `verb` on `plural` ("*" matches any; `plural` includes its status
    /// subresource, `plural/status` is the subresource alone). Failed requests count too (refused while
    /// down, injected faults), and so does each retry kube's client makes of a 429, 503 or 504.
    pub fn request_count(&self, verb: &str, plural: &str) -> u64 {
        self.shared
            .control()
            .counts
            .iter()
            .filter(|((v, resource), _)| (verb == "*" || verb == *v) && resource_matches(plural, resource))
            .map(|(_, count)| count)
            .sum()
    }
}

impl Drop for TestApiServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn run_server(listener: std::net::TcpListener, shared: Arc<Shared>, stopped: oneshot::Receiver<()>) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("test-apiserver")
        .enable_all()
        .build()
        .expect("test API server runtime");
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::from_std(listener).expect("tokio listener");
        let sweeper = tokio::spawn(sweep_loop(shared.clone()));
        let app = Router::new().fallback(handle).with_state(shared);
        tokio::select! {
            result = axum::serve(listener, app).into_future() => result.expect("test API server"),
            _ = stopped => {}
        }
        sweeper.abort();
    });
    // Open watches are tasks of this runtime: dropping them closes their connections.
    runtime.shutdown_timeout(Duration::from_secs(1));
}

// ------------------------------------------------------------------------------------------------------------
// Resource table
// ------------------------------------------------------------------------------------------------------------

/// Behaviour that belongs to one kind's registry strategy rather than to the generic store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Special {
    Plain,
    Secret,
    Pod,
    Job,
    Namespace,
    CoreEvent,
    EventsV1,
    Crd,
    /// A custom resource: served only while its CRD exists, no strategic merge patch.
    Custom,
}

#[derive(Debug)]
struct Kind {
    group: &'static str,
    version: &'static str,
    plural: &'static str,
    kind: &'static str,
    namespaced: bool,
    /// Has a `/status` subresource: writes to the main resource keep the stored status.
    status: bool,
    /// Tracks `metadata.generation`.
    generation: bool,
    /// PUT without metadata.resourceVersion is accepted (the strategy's AllowUnconditionalUpdate).
    unconditional_update: bool,
    /// PUT may create a missing object (AllowCreateOnUpdate).
    create_on_update: bool,
    /// DELETE answers with the deleted object instead of a Status (the store's ReturnDeletedObject).
    returns_deleted: bool,
    /// Field selector labels beyond metadata.name and metadata.namespace (in storage field names).
    fields: &'static [&'static str],
    special: Special,
}

const BASE: Kind = Kind {
    group: "",
    version: "v1",
    plural: "",
    kind: "",
    namespaced: true,
    status: false,
    generation: false,
    unconditional_update: true,
    create_on_update: false,
    returns_deleted: false,
    fields: &[],
    special: Special::Plain,
};

const EVENT_FIELDS: &[&str] = &[
    "involvedObject.kind",
    "involvedObject.namespace",
    "involvedObject.name",
    "involvedObject.uid",
    "involvedObject.apiVersion",
    "involvedObject.resourceVersion",
    "involvedObject.fieldPath",
    "reason",
    "reportingComponent",
    "source",
    "type",
];

/// Both event views are one storage (plural `events`); core/v1 field names are the stored form.
static KINDS: [Kind; 11] = [
    Kind {
        plural: "pods",
        kind: "Pod",
        status: true,
        generation: true,
        returns_deleted: true,
        fields: &[
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "status.phase",
            "status.podIP",
            "status.nominatedNodeName",
        ],
        special: Special::Pod,
        ..BASE
    },
    Kind {
        plural: "secrets",
        kind: "Secret",
        fields: &["type"],
        special: Special::Secret,
        ..BASE
    },
    Kind {
        plural: "configmaps",
        kind: "ConfigMap",
        ..BASE
    },
    Kind {
        plural: "namespaces",
        kind: "Namespace",
        namespaced: false,
        status: true,
        fields: &["status.phase"],
        special: Special::Namespace,
        ..BASE
    },
    Kind {
        plural: "events",
        kind: "Event",
        create_on_update: true,
        fields: EVENT_FIELDS,
        special: Special::CoreEvent,
        ..BASE
    },
    Kind {
        group: "events.k8s.io",
        plural: "events",
        kind: "Event",
        create_on_update: true,
        fields: EVENT_FIELDS,
        special: Special::EventsV1,
        ..BASE
    },
    Kind {
        group: "coordination.k8s.io",
        plural: "leases",
        kind: "Lease",
        unconditional_update: false,
        create_on_update: true,
        ..BASE
    },
    Kind {
        group: "batch",
        plural: "jobs",
        kind: "Job",
        status: true,
        generation: true,
        fields: &["status.successful"],
        special: Special::Job,
        ..BASE
    },
    Kind {
        group: "redlock.io",
        version: "v1alpha1",
        plural: "distributedlocks",
        kind: "DistributedLock",
        status: true,
        generation: true,
        unconditional_update: false,
        special: Special::Custom,
        ..BASE
    },
    Kind {
        group: "redlock.io",
        version: "v1alpha1",
        plural: "redisquorums",
        kind: "RedisQuorum",
        namespaced: false,
        status: true,
        generation: true,
        unconditional_update: false,
        special: Special::Custom,
        ..BASE
    },
    Kind {
        group: "apiextensions.k8s.io",
        plural: "customresourcedefinitions",
        kind: "CustomResourceDefinition",
        namespaced: false,
        status: true,
        generation: true,
        unconditional_update: false,
        special: Special::Crd,
        ..BASE
    },
];

impl Kind {
    fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_owned()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// `plural.group`, as error messages name the resource.
    fn qualified(&self) -> String {
        if self.group.is_empty() {
            self.plural.to_owned()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }

    fn qualified_kind(&self) -> String {
        if self.group.is_empty() {
            self.kind.to_owned()
        } else {
            format!("{}.{}", self.kind, self.group)
        }
    }

    fn is_custom(&self) -> bool {
        self.special == Special::Custom
    }

    /// Status writes change nothing but status (custom resources and CRDs reset all metadata too).
    fn status_only_status(&self) -> bool {
        matches!(self.special, Special::Custom | Special::Crd)
    }

    fn crd_name(&self) -> String {
        format!("{}.{}", self.plural, self.group)
    }
}

fn kind_of(special: Special) -> &'static Kind {
    KINDS
        .iter()
        .find(|k| k.special == special)
        .expect("kind in the table")
}

// ------------------------------------------------------------------------------------------------------------
// Errors as metav1.Status
// ------------------------------------------------------------------------------------------------------------

#[derive(Debug)]
struct ApiError {
    code: u16,
    /// Empty for StatusReasonUnknown.
    reason: &'static str,
    message: String,
    details: Option<Value>,
}

type ApiResult<T> = Result<T, ApiError>;

impl ApiError {
    fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            code,
            reason,
            message: message.into(),
            details: None,
        }
    }

    fn with_details(mut self, details: Value) -> Self {
        self.details = Some(details);
        self
    }

    fn details(kind: &Kind, name: &str, kind_field: &str) -> Map<String, Value> {
        let mut details = Map::new();
        details.insert("name".into(), name.into());
        if !kind.group.is_empty() {
            details.insert("group".into(), kind.group.into());
        }
        details.insert("kind".into(), kind_field.into());
        details
    }

    fn not_found(kind: &Kind, name: &str) -> Self {
        let message = format!("{} \"{name}\" not found", kind.qualified());
        Self::new(404, "NotFound", message).with_details(Self::details(kind, name, kind.plural).into())
    }

    fn already_exists(kind: &Kind, name: &str) -> Self {
        let message = format!("{} \"{name}\" already exists", kind.qualified());
        Self::new(409, "AlreadyExists", message).with_details(Self::details(kind, name, kind.plural).into())
    }

    fn conflict(kind: &Kind, name: &str, why: &str) -> Self {
        let message = format!(
            "Operation cannot be fulfilled on {} \"{name}\": {why}",
            kind.qualified()
        );
        Self::new(409, "Conflict", message).with_details(Self::details(kind, name, kind.plural).into())
    }

    /// A field error: `cause` is the metav1.CauseType (FieldValueInvalid, FieldValueForbidden, …).
    fn invalid(kind: &Kind, name: &str, field: &str, cause: &str, detail: &str) -> Self {
        let message = format!(
            "{} \"{name}\" is invalid: {field}: {detail}",
            kind.qualified_kind()
        );
        let mut details = Self::details(kind, name, kind.kind);
        details.insert(
            "causes".into(),
            json!([{"reason": cause, "message": detail, "field": field}]),
        );
        Self::new(422, "Invalid", message).with_details(details.into())
    }

    /// A 422 the way the patch handler reports a patch it cannot apply.
    fn unprocessable(detail: impl Into<String>) -> Self {
        let message = "the server rejected our request due to an error in our request";
        Self::new(422, "Invalid", message).with_details(json!({"causes": [{"message": detail.into()}]}))
    }

    fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    fn method_not_allowed(message: impl Into<String>) -> Self {
        Self::new(405, "MethodNotAllowed", message)
    }

    fn no_such_resource() -> Self {
        Self::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        )
        .with_details(json!({}))
    }

    fn expired(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }

    fn injected(code: u16, verb: &str, route: &Route) -> Self {
        let reason = match code {
            400 => "BadRequest",
            401 => "Unauthorized",
            403 => "Forbidden",
            404 => "NotFound",
            405 => "MethodNotAllowed",
            409 => "Conflict",
            410 => "Expired",
            415 => "UnsupportedMediaType",
            422 => "Invalid",
            429 => "TooManyRequests",
            500 => "InternalError",
            503 => "ServiceUnavailable",
            504 => "Timeout",
            _ => "",
        };
        let message = format!("injected fault: {verb} {} answers {code}", route.resource());
        Self::new(code, reason, message)
    }

    fn status(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "code": self.code,
        });
        if !self.reason.is_empty() {
            status["reason"] = self.reason.into();
        }
        if let Some(details) = &self.details {
            status["details"] = details.clone();
        }
        status
    }
}

fn bad_json(error: serde_json::Error) -> ApiError {
    ApiError::bad_request(format!("the request body is not valid JSON: {error}"))
}

// ------------------------------------------------------------------------------------------------------------
// Storage
// ------------------------------------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum EventType {
    Added,
    Modified,
    Deleted,
}

/// One committed write, as watchers see it. `object` carries the write's resourceVersion (for a deletion:
/// the last stored content with the deletion's resourceVersion, like the real server's DELETED events).
struct Change {
    event: EventType,
    rv: u64,
    object: Arc<Value>,
    previous: Option<Arc<Value>>,
}

/// The objects of one storage (one resource, or both event views), keyed `namespace/name`.
#[derive(Default)]
struct Bucket {
    objects: std::collections::BTreeMap<String, Arc<Value>>,
    history: VecDeque<Arc<Change>>,
    /// The resourceVersion of the newest change dropped from `history`.
    compacted: u64,
    watchers: Vec<mpsc::Sender<Arc<Change>>>,
}

/// A list result kept for its `continue` tokens, so later pages are consistent with the first.
struct Page {
    rv: u64,
    items: Vec<Arc<Value>>,
    filtered: bool,
}

struct GracefulPod {
    deadline: Instant,
    namespace: String,
    name: String,
    uid: String,
}

#[derive(Default)]
struct State {
    rv: u64,
    buckets: HashMap<&'static str, Bucket>,
    pages: VecDeque<(u64, Arc<Page>)>,
    next_page: u64,
    graceful: Vec<GracefulPod>,
}

fn object_key(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

impl State {
    fn bucket(&mut self, kind: &Kind) -> &mut Bucket {
        self.buckets.entry(kind.plural).or_default()
    }

    fn get(&self, kind: &Kind, namespace: &str, name: &str) -> Option<Arc<Value>> {
        self.buckets
            .get(kind.plural)?
            .objects
            .get(&object_key(namespace, name))
            .cloned()
    }

    /// Objects in `namespace` (all when None) that pass `filter`; a namespace is a range of the key order.
    fn select(&self, kind: &Kind, namespace: Option<&str>, filter: &Filter) -> Vec<Arc<Value>> {
        let Some(bucket) = self.buckets.get(kind.plural) else {
            return Vec::new();
        };
        let matching = |object: &&Arc<Value>| filter.matches(object);
        match namespace {
            Some(namespace) => {
                let prefix = format!("{namespace}/");
                bucket
                    .objects
                    .range(prefix.clone()..)
                    .take_while(|(key, _)| key.starts_with(&prefix))
                    .map(|(_, object)| object)
                    .filter(matching)
                    .cloned()
                    .collect()
            }
            None => bucket.objects.values().filter(matching).cloned().collect(),
        }
    }

    /// Stores a write under a new resourceVersion, records it and hands it to the watchers.
    fn commit(
        &mut self,
        kind: &Kind,
        event: EventType,
        mut object: Value,
        previous: Option<Arc<Value>>,
    ) -> Arc<Value> {
        self.rv += 1;
        let rv = self.rv;
        meta_mut(&mut object).insert("resourceVersion".into(), rv.to_string().into());
        let key = object_key(namespace_of(&object), name_of(&object));
        let object = Arc::new(object);
        let bucket = self.bucket(kind);
        if event == EventType::Deleted {
            bucket.objects.remove(&key);
        } else {
            bucket.objects.insert(key, object.clone());
        }
        let change = Arc::new(Change {
            event,
            rv,
            object: object.clone(),
            previous,
        });
        bucket.history.push_back(change.clone());
        if bucket.history.len() > HISTORY_LIMIT
            && let Some(dropped) = bucket.history.pop_front()
        {
            bucket.compacted = dropped.rv;
        }
        // A full channel means a watcher too far behind: dropping its sender ends its watch.
        bucket
            .watchers
            .retain(|watcher| watcher.try_send(change.clone()).is_ok());
        object
    }

    fn save_page(&mut self, page: Arc<Page>) -> u64 {
        self.next_page += 1;
        self.pages.push_back((self.next_page, page));
        if self.pages.len() > LIST_SNAPSHOTS {
            self.pages.pop_front();
        }
        self.next_page
    }

    fn crd_of(&self, kind: &Kind) -> Option<Arc<Value>> {
        self.get(kind_of(Special::Crd), "", &kind.crd_name())
    }

    /// Custom resources exist only while their CRD does.
    fn served(&self, kind: &Kind) -> bool {
        !kind.is_custom() || self.crd_of(kind).is_some()
    }
}

struct Fault {
    verb: String,
    resource: String,
    code: u16,
    remaining: usize,
}

#[derive(Default)]
struct Control {
    faults: Vec<Fault>,
    counts: HashMap<(&'static str, String), u64>,
}

/// `pattern` is "*", a plural (which includes its status subresource) or `plural/status`.
fn resource_matches(pattern: &str, resource: &str) -> bool {
    pattern == "*" || pattern == resource || resource.strip_suffix("/status") == Some(pattern)
}

struct Shared {
    addr: SocketAddr,
    state: Mutex<State>,
    control: Mutex<Control>,
    down: AtomicBool,
}

impl Shared {
    fn new(addr: SocketAddr) -> Self {
        Shared {
            addr,
            state: Mutex::default(),
            control: Mutex::default(),
            down: AtomicBool::new(false),
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

    fn count(&self, verb: &'static str, route: &Route) {
        *self.control().counts.entry((verb, route.resource())).or_default() += 1;
    }

    /// Takes the first injected fault matching the request.
    fn take_fault(&self, verb: &'static str, route: &Route) -> Option<ApiError> {
        let mut control = self.control();
        let fault = control.faults.iter_mut().find(|fault| {
            fault.remaining > 0
                && (fault.verb == "*" || fault.verb == verb)
                && resource_matches(&fault.resource, &route.resource())
        })?;
        fault.remaining -= 1;
        let code = fault.code;
        control.faults.retain(|fault| fault.remaining > 0);
        Some(ApiError::injected(code, verb, route))
    }
}

// ------------------------------------------------------------------------------------------------------------
// JSON helpers
// ------------------------------------------------------------------------------------------------------------

fn meta(object: &Value) -> Option<&Map<String, Value>> {
    object.get("metadata")?.as_object()
}

fn meta_str<'a>(object: &'a Value, field: &str) -> Option<&'a str> {
    meta(object)?.get(field)?.as_str()
}

fn meta_mut(object: &mut Value) -> &mut Map<String, Value> {
    let root = object.as_object_mut().expect("stored objects are JSON objects");
    let metadata = root.entry("metadata").or_insert_with(|| Map::new().into());
    if !metadata.is_object() {
        *metadata = Map::new().into();
    }
    metadata.as_object_mut().expect("metadata is an object")
}

fn name_of(object: &Value) -> &str {
    meta_str(object, "name").unwrap_or("")
}

fn namespace_of(object: &Value) -> &str {
    meta_str(object, "namespace").unwrap_or("")
}

fn uid_of(object: &Value) -> &str {
    meta_str(object, "uid").unwrap_or("")
}

fn finalizers(object: &Value) -> Vec<&str> {
    meta(object)
        .and_then(|m| m.get("finalizers"))
        .and_then(Value::as_array)
        .map(|list| list.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

fn is_deleting(object: &Value) -> bool {
    meta(object)
        .and_then(|m| m.get("deletionTimestamp"))
        .is_some_and(|t| !t.is_null())
}

fn grace_period(object: &Value) -> Option<i64> {
    meta(object)?.get("deletionGracePeriodSeconds")?.as_i64()
}

fn generation(object: &Value) -> i64 {
    meta(object)
        .and_then(|m| m.get("generation"))
        .and_then(Value::as_i64)
        .unwrap_or(0)
}

fn timestamp(at: Timestamp) -> String {
    at.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

fn now() -> String {
    timestamp(Timestamp::now())
}

fn new_uid() -> String {
    // A version 4 UUID, as the real server generates.
    let mut bits: u128 = rand::random();
    bits = (bits & !(0xf << 76)) | (0x4 << 76);
    bits = (bits & !(0x3 << 62)) | (0x2 << 62);
    let hex = format!("{bits:032x}");
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

/// The suffix `generateName` gets: five characters from the real name generator's alphabet.
fn name_suffix() -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    (0..5)
        .map(|_| ALPHABET[rand::random_range(0..ALPHABET.len())] as char)
        .collect()
}

fn strip_nulls(value: &mut Value) {
    match value {
        Value::Object(map) => {
            map.retain(|_, v| !v.is_null());
            map.values_mut().for_each(strip_nulls);
        }
        Value::Array(items) => items.iter_mut().for_each(strip_nulls),
        _ => {}
    }
}

/// What a round trip through the Go types leaves: metadata fields are all `omitempty`, and built-in kinds
/// cannot hold JSON nulls. (Custom resources keep nulls: their schemas mark optional fields nullable.)
fn normalize(kind: &Kind, object: &mut Value) {
    if kind.special == Special::Secret {
        fold_string_data(object);
    }
    if !kind.is_custom() {
        strip_nulls(object);
    }
    meta_mut(object).retain(|field, value| {
        let empty = match value {
            Value::Null => true,
            Value::String(s) => s.is_empty(),
            Value::Array(a) => a.is_empty(),
            Value::Object(o) => o.is_empty(),
            _ => false,
        };
        let zero_generation = field == "generation" && value.as_i64() == Some(0);
        !(empty || zero_generation)
    });
}

/// A Secret's write-only `stringData` is merged into `data` (base64) on every write and never stored.
fn fold_string_data(secret: &mut Value) {
    let Some(map) = secret.as_object_mut() else {
        return;
    };
    let Some(Value::Object(strings)) = map.remove("stringData") else {
        return;
    };
    let data = map.entry("data").or_insert_with(|| json!({}));
    if !data.is_object() {
        *data = json!({});
    }
    if let Some(data) = data.as_object_mut() {
        for (key, value) in strings {
            if let Some(text) = value.as_str() {
                let bytes = k8s_openapi::ByteString(text.as_bytes().to_vec());
                data.insert(
                    key,
                    serde_json::to_value(bytes).expect("bytes serialize as base64"),
                );
            }
        }
    }
}

/// Compares everything but metadata (and status, for kinds whose status is a subresource).
fn same_spec(a: &Value, b: &Value, skip_status: bool) -> bool {
    let relevant = |key: &String| key != "metadata" && !(skip_status && key == "status");
    let (Some(a), Some(b)) = (a.as_object(), b.as_object()) else {
        return a == b;
    };
    let a_fields: Vec<_> = a.iter().filter(|(k, _)| relevant(k)).collect();
    let b_fields: Vec<_> = b.iter().filter(|(k, _)| relevant(k)).collect();
    a_fields.len() == b_fields.len() && a_fields.iter().all(|(k, v)| b.get(k.as_str()) == Some(v))
}

// ------------------------------------------------------------------------------------------------------------
// Event views: one storage (core/v1 field names), converted for events.k8s.io/v1
// ------------------------------------------------------------------------------------------------------------

/// (core/v1, events.k8s.io/v1) field names; everything else has the same name in both.
const EVENT_RENAMES: [(&str, &str); 7] = [
    ("message", "note"),
    ("involvedObject", "regarding"),
    ("reportingComponent", "reportingController"),
    ("source", "deprecatedSource"),
    ("firstTimestamp", "deprecatedFirstTimestamp"),
    ("lastTimestamp", "deprecatedLastTimestamp"),
    ("count", "deprecatedCount"),
];

fn convert_event(mut event: Value, to_events_v1: bool) -> Value {
    if let Some(map) = event.as_object_mut() {
        for (core, v1) in EVENT_RENAMES {
            let (from, to) = if to_events_v1 { (core, v1) } else { (v1, core) };
            if let Some(value) = map.remove(from) {
                map.insert(to.into(), value);
            }
        }
        let api_version = if to_events_v1 { "events.k8s.io/v1" } else { "v1" };
        map.insert("apiVersion".into(), api_version.into());
    }
    event
}

/// The stored object as `kind`'s endpoint shows it.
fn render<'a>(kind: &Kind, stored: &'a Value) -> Cow<'a, Value> {
    if kind.special == Special::EventsV1 {
        Cow::Owned(convert_event(stored.clone(), true))
    } else {
        Cow::Borrowed(stored)
    }
}

/// An object as sent to `kind`'s endpoint, in stored form.
fn to_storage(kind: &Kind, object: Value) -> Value {
    if kind.special == Special::EventsV1 {
        convert_event(object, false)
    } else {
        object
    }
}

/// Serializes an object for a response: list items of built-in kinds carry no apiVersion/kind (typed lists
/// do not), custom resource items and watch event objects do.
struct View<'a> {
    kind: &'static Kind,
    object: &'a Value,
    list_item: bool,
}

impl Serialize for View<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let object = render(self.kind, self.object);
        match object.as_object() {
            Some(map) if self.list_item && !self.kind.is_custom() => {
                let mut out = serializer.serialize_map(None)?;
                for (key, value) in map.iter().filter(|(k, _)| *k != "apiVersion" && *k != "kind") {
                    out.serialize_entry(key, value)?;
                }
                out.end()
            }
            _ => object.serialize(serializer),
        }
    }
}

fn list_body(
    kind: &'static Kind,
    items: &[Arc<Value>],
    rv: u64,
    continue_token: Option<String>,
    remaining: Option<usize>,
) -> Vec<u8> {
    #[derive(Serialize)]
    struct List<'a> {
        kind: String,
        #[serde(rename = "apiVersion")]
        api_version: String,
        metadata: Value,
        items: Vec<View<'a>>,
    }
    let mut metadata = json!({"resourceVersion": rv.to_string()});
    if let Some(token) = continue_token {
        metadata["continue"] = token.into();
    }
    if let Some(remaining) = remaining {
        metadata["remainingItemCount"] = remaining.into();
    }
    let list = List {
        kind: format!("{}List", kind.kind),
        api_version: kind.api_version(),
        metadata,
        items: items
            .iter()
            .map(|object| View {
                kind,
                object,
                list_item: true,
            })
            .collect(),
    };
    serde_json::to_vec(&list).expect("lists serialize")
}

// ------------------------------------------------------------------------------------------------------------
// Selectors
// ------------------------------------------------------------------------------------------------------------

#[derive(Debug)]
enum LabelReq {
    Eq(String, String),
    NotEq(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

#[derive(Debug)]
struct FieldReq {
    label: String,
    value: String,
    negate: bool,
}

#[derive(Debug, Default)]
struct Filter {
    labels: Vec<LabelReq>,
    fields: Vec<FieldReq>,
}

impl Filter {
    fn parse(kind: &Kind, query: &Query) -> ApiResult<Self> {
        let labels = match query.get("labelSelector") {
            Some(selector) => parse_label_selector(selector)
                .map_err(|e| ApiError::bad_request(format!("unable to parse requirement: {e}")))?,
            None => Vec::new(),
        };
        let fields = match query.get("fieldSelector") {
            Some(selector) => parse_field_selector(kind, selector)?,
            None => Vec::new(),
        };
        Ok(Filter { labels, fields })
    }

    fn is_empty(&self) -> bool {
        self.labels.is_empty() && self.fields.is_empty()
    }

    fn matches(&self, object: &Value) -> bool {
        let labels = meta(object)
            .and_then(|m| m.get("labels"))
            .and_then(Value::as_object);
        let label = |key: &str| labels.and_then(|l| l.get(key)).and_then(Value::as_str);
        let labels_match = self.labels.iter().all(|req| match req {
            LabelReq::Eq(k, v) => label(k) == Some(v.as_str()),
            LabelReq::NotEq(k, v) => label(k) != Some(v.as_str()),
            LabelReq::In(k, values) => label(k).is_some_and(|l| values.iter().any(|v| v == l)),
            LabelReq::NotIn(k, values) => !label(k).is_some_and(|l| values.iter().any(|v| v == l)),
            LabelReq::Exists(k) => label(k).is_some(),
            LabelReq::NotExists(k) => label(k).is_none(),
        });
        labels_match
            && self
                .fields
                .iter()
                .all(|req| (field_value(object, &req.label) == req.value) != req.negate)
    }
}

/// Splits at commas outside parentheses (`a in (x,y),b` is two requirements).
fn split_requirements(selector: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0usize, 0);
    for (i, c) in selector.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                parts.push(&selector[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&selector[start..]);
    parts
}

fn label_key(key: &str) -> Result<String, String> {
    let valid = !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | '/'));
    if valid {
        Ok(key.to_owned())
    } else {
        Err(format!("invalid label key {key:?}"))
    }
}

fn label_value(value: &str) -> Result<String, String> {
    let valid = value
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'));
    if valid {
        Ok(value.to_owned())
    } else {
        Err(format!("invalid label value {value:?}"))
    }
}

fn parse_label_selector(selector: &str) -> Result<Vec<LabelReq>, String> {
    if selector.trim().is_empty() {
        return Ok(Vec::new());
    }
    split_requirements(selector)
        .into_iter()
        .map(|part| parse_requirement(part.trim()))
        .collect()
}

fn parse_requirement(part: &str) -> Result<LabelReq, String> {
    if let Some(key) = part.strip_prefix('!') {
        return Ok(LabelReq::NotExists(label_key(key.trim())?));
    }
    if let Some(open) = part.find('(') {
        let inner = part[open + 1..]
            .strip_suffix(')')
            .ok_or_else(|| format!("{part:?}: missing closing parenthesis"))?;
        let values = inner
            .split(',')
            .map(|v| label_value(v.trim()))
            .collect::<Result<Vec<_>, _>>()?;
        let head: Vec<&str> = part[..open].split_whitespace().collect();
        return match head[..] {
            [key, "in"] => Ok(LabelReq::In(label_key(key)?, values)),
            [key, "notin"] => Ok(LabelReq::NotIn(label_key(key)?, values)),
            _ => Err(format!("{part:?}: expected `key in (…)` or `key notin (…)`")),
        };
    }
    let split = |op: &str| part.split_once(op).map(|(k, v)| (k.trim(), v.trim()));
    if let Some((key, value)) = split("!=") {
        Ok(LabelReq::NotEq(label_key(key)?, label_value(value)?))
    } else if let Some((key, value)) = split("==").or_else(|| split("=")) {
        Ok(LabelReq::Eq(label_key(key)?, label_value(value)?))
    } else {
        Ok(LabelReq::Exists(label_key(part)?))
    }
}

fn parse_field_selector(kind: &Kind, selector: &str) -> ApiResult<Vec<FieldReq>> {
    let mut requirements = Vec::new();
    for part in selector.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (label, value, negate) = if let Some((l, v)) = part.split_once("!=") {
            (l, v, true)
        } else if let Some((l, v)) = part.split_once("==").or_else(|| part.split_once('=')) {
            (l, v, false)
        } else {
            return Err(ApiError::bad_request(format!(
                "invalid selector: '{part}'; can't understand '{part}'"
            )));
        };
        let label = field_label(kind, label.trim())
            .ok_or_else(|| ApiError::bad_request(format!("field label not supported: {}", label.trim())))?;
        requirements.push(FieldReq {
            label,
            value: value.trim().to_owned(),
            negate,
        });
    }
    Ok(requirements)
}

/// The stored-form field label for `label` if `kind` supports selecting on it.
fn field_label(kind: &Kind, label: &str) -> Option<String> {
    let label = if kind.special == Special::EventsV1 {
        EVENT_RENAMES
            .iter()
            .find_map(|(core, v1)| {
                if label == *v1 {
                    Some((*core).to_owned())
                } else {
                    label
                        .strip_prefix(&format!("{v1}."))
                        .map(|rest| format!("{core}.{rest}"))
                }
            })
            .unwrap_or_else(|| label.to_owned())
    } else {
        label.to_owned()
    };
    let supported = label == "metadata.name"
        || (kind.namespaced && label == "metadata.namespace")
        || kind.fields.contains(&label.as_str());
    supported.then_some(label)
}

fn field_value(object: &Value, label: &str) -> String {
    // An event's `source` field label selects on source.component.
    let path = if label == "source" {
        "source.component"
    } else {
        label
    };
    let mut current = object;
    for segment in path.split('.') {
        match current.get(segment) {
            Some(next) => current = next,
            None => return String::new(),
        }
    }
    match current {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

// ------------------------------------------------------------------------------------------------------------
// Requests
// ------------------------------------------------------------------------------------------------------------

struct Query(Vec<(String, String)>);

impl Query {
    fn parse(raw: Option<&str>) -> Self {
        let pairs = raw
            .map(|q| url::form_urlencoded::parse(q.as_bytes()).into_owned().collect())
            .unwrap_or_default();
        Query(pairs)
    }

    fn get(&self, key: &str) -> Option<&str> {
        self.0.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }

    fn flag(&self, key: &str) -> bool {
        matches!(self.get(key), Some("true" | "1"))
    }

    fn number<T: std::str::FromStr>(&self, key: &str) -> ApiResult<Option<T>> {
        self.get(key)
            .filter(|v| !v.is_empty())
            .map(|v| {
                v.parse()
                    .map_err(|_| ApiError::bad_request(format!("invalid {key}: {v:?}")))
            })
            .transpose()
    }
}

struct Route {
    kind: &'static Kind,
    namespace: Option<String>,
    name: Option<String>,
    status: bool,
}

impl Route {
    fn namespace(&self) -> &str {
        self.namespace.as_deref().unwrap_or("")
    }

    fn name(&self) -> &str {
        self.name.as_deref().unwrap_or("")
    }

    /// The resource as counted and matched by fault injection.
    fn resource(&self) -> String {
        if self.status {
            format!("{}/status", self.kind.plural)
        } else {
            self.kind.plural.to_owned()
        }
    }
}

/// `/api/v1/...` or `/apis/{group}/{version}/...`, then `[namespaces/{ns}/]{plural}[/{name}[/status]]`.
fn parse_route(path: &str) -> Option<Route> {
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let (group, version, rest) = match segments.as_slice() {
        ["api", version, rest @ ..] => ("", *version, rest),
        ["apis", group, version, rest @ ..] => (*group, *version, rest),
        _ => return None,
    };
    // `namespaces/{name}/status` is the Namespace's own subresource, not a namespaced resource.
    let namespace_subresource = rest.len() == 3 && matches!(rest[2], "status" | "finalize");
    let (namespace, rest) = if rest.len() >= 3 && rest[0] == "namespaces" && !namespace_subresource {
        (Some(rest[1].to_owned()), &rest[2..])
    } else {
        (None, rest)
    };
    let (plural, name, subresource) = match rest {
        [plural] => (*plural, None, None),
        [plural, name] => (*plural, Some(*name), None),
        [plural, name, subresource] => (*plural, Some(*name), Some(*subresource)),
        _ => return None,
    };
    let kind = KINDS
        .iter()
        .find(|k| k.group == group && k.version == version && k.plural == plural)?;
    let scoped_right = if kind.namespaced {
        namespace.is_some() || name.is_none()
    } else {
        namespace.is_none()
    };
    let status = match subresource {
        None => false,
        Some("status") if kind.status => true,
        Some(_) => return None,
    };
    scoped_right.then(|| Route {
        kind,
        namespace,
        name: name.map(str::to_owned),
        status,
    })
}

fn request_verb(method: &Method, route: &Route, query: &Query) -> ApiResult<&'static str> {
    let named = route.name.is_some();
    let verb = match *method {
        Method::GET if query.flag("watch") => "watch",
        Method::GET if named => "get",
        Method::GET => "list",
        Method::POST if !named => "create",
        Method::PUT if named => "update",
        Method::PATCH if named => "patch",
        Method::DELETE if named => "delete",
        Method::DELETE => "deletecollection",
        _ => {
            return Err(ApiError::method_not_allowed(
                "the server does not allow this method on the requested resource",
            ));
        }
    };
    let subresource_ok = !route.status || matches!(verb, "get" | "update" | "patch");
    let scope_ok =
        !matches!(verb, "create" | "deletecollection") || !route.kind.namespaced || route.namespace.is_some();
    if subresource_ok && scope_ok {
        Ok(verb)
    } else {
        Err(ApiError::method_not_allowed(
            "the server does not allow this method on the requested resource",
        ))
    }
}

enum Reply {
    Object(u16, Value),
    Raw(u16, Vec<u8>),
}

fn json_response(code: u16, body: Vec<u8>) -> Response {
    Response::builder()
        .status(code)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body))
        .expect("valid response")
}

fn error_response(error: &ApiError) -> Response {
    json_response(error.code, error.status().to_string().into_bytes())
}

async fn handle(AxumState(shared): AxumState<Arc<Shared>>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let path = parts.uri.path();
    let query = Query::parse(parts.uri.query());
    let route = parse_route(path).filter(|route| !route.kind.is_custom() || shared.lock().served(route.kind));
    let verb = route
        .as_ref()
        .map(|route| request_verb(&parts.method, route, &query));
    // Counted even while down: a client hammering an unavailable server is what tests look for.
    if let (Some(route), Some(Ok(verb))) = (&route, &verb) {
        shared.count(verb, route);
    }
    if shared.is_down() {
        return error_response(&ApiError::new(
            503,
            "ServiceUnavailable",
            "the API server is down (set_down)",
        ));
    }
    if let Some(response) = shared.discovery(path) {
        return response;
    }
    let (Some(route), Some(verb)) = (route, verb) else {
        return error_response(&ApiError::no_such_resource());
    };
    let verb = match verb {
        Ok(verb) => verb,
        Err(error) => return error_response(&error),
    };
    if let Some(fault) = shared.take_fault(verb, &route) {
        return error_response(&fault);
    }
    if verb == "watch" {
        return match shared.start_watch(&route, &query) {
            Ok(session) => session.into_response(),
            Err(error) => error_response(&error),
        };
    }
    let body = match axum::body::to_bytes(body, MAX_BODY).await {
        Ok(body) => body,
        Err(error) => return error_response(&ApiError::bad_request(error.to_string())),
    };
    let content_type = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .unwrap_or("")
        .trim();
    match shared.serve(verb, &route, &query, content_type, &body) {
        Ok(Reply::Object(code, object)) => json_response(code, object.to_string().into_bytes()),
        Ok(Reply::Raw(code, bytes)) => json_response(code, bytes),
        Err(error) => error_response(&error),
    }
}

impl Shared {
    fn serve(
        &self,
        verb: &str,
        route: &Route,
        query: &Query,
        content_type: &str,
        body: &[u8],
    ) -> ApiResult<Reply> {
        if query.get("dryRun").is_some_and(|v| !v.is_empty()) {
            return Err(ApiError::bad_request(
                "dryRun is not supported by the test API server",
            ));
        }
        let kind = route.kind;
        match verb {
            "get" => {
                let object = self.lock().get(kind, route.namespace(), route.name());
                let object = object.ok_or_else(|| ApiError::not_found(kind, route.name()))?;
                Ok(Reply::Object(200, render(kind, &object).into_owned()))
            }
            "list" => self.list(route, query),
            "create" => {
                let object = incoming(kind, body)?;
                let created = create(&mut self.lock(), kind, route.namespace(), object)?;
                Ok(Reply::Object(201, render(kind, &created).into_owned()))
            }
            "update" => {
                let object = incoming(kind, body)?;
                let (code, stored) = replace(&mut self.lock(), route, object)?;
                Ok(Reply::Object(code, render(kind, &stored).into_owned()))
            }
            "patch" => {
                let (code, stored) = patch(&mut self.lock(), route, query, content_type, body)?;
                Ok(Reply::Object(code, render(kind, &stored).into_owned()))
            }
            "delete" => {
                let options = DeleteOptions::parse(query, body)?;
                let outcome = delete(&mut self.lock(), kind, route.namespace(), route.name(), &options)?;
                Ok(Reply::Object(200, delete_reply(kind, &outcome)))
            }
            "deletecollection" => self.delete_collection(route, query, body),
            _ => Err(ApiError::method_not_allowed(format!("{verb} is not supported"))),
        }
    }

    fn list(&self, route: &Route, query: &Query) -> ApiResult<Reply> {
        let kind = route.kind;
        let limit = query.number::<usize>("limit")?.unwrap_or(0);
        let mut state = self.lock();
        let (id, page, offset) = match query.get("continue").filter(|c| !c.is_empty()) {
            Some(token) => find_page(&state, token)?,
            None => {
                let filter = Filter::parse(kind, query)?;
                let exact = query.get("resourceVersionMatch") == Some("Exact");
                if let Some(rv) = query
                    .get("resourceVersion")
                    .filter(|rv| exact && *rv != state.rv.to_string())
                {
                    return Err(ApiError::expired(format!(
                        "too old resource version: {rv} ({})",
                        state.rv
                    )));
                }
                let items = state.select(kind, route.namespace.as_deref(), &filter);
                let page = Page {
                    rv: state.rv,
                    items,
                    filtered: !filter.is_empty(),
                };
                (None, Arc::new(page), 0)
            }
        };
        let end = if limit == 0 {
            page.items.len()
        } else {
            (offset + limit).min(page.items.len())
        };
        let continue_token = (end < page.items.len()).then(|| {
            let id = id.unwrap_or_else(|| state.save_page(page.clone()));
            format!("{id}:{end}")
        });
        drop(state);
        // Like the real server: a remaining count only for unfiltered lists.
        let remaining = (continue_token.is_some() && !page.filtered).then(|| page.items.len() - end);
        let body = list_body(kind, &page.items[offset..end], page.rv, continue_token, remaining);
        Ok(Reply::Raw(200, body))
    }

    fn delete_collection(&self, route: &Route, query: &Query, body: &[u8]) -> ApiResult<Reply> {
        let kind = route.kind;
        let options = DeleteOptions::parse(query, body)?;
        let filter = Filter::parse(kind, query)?;
        let mut state = self.lock();
        let targets = state.select(kind, route.namespace.as_deref(), &filter);
        let mut items = Vec::new();
        for target in targets {
            let outcome = delete(
                &mut state,
                kind,
                namespace_of(&target),
                name_of(&target),
                &options,
            )?;
            items.push(match outcome {
                Deleted::Kept(object) | Deleted::Removed(object) => object,
            });
        }
        let rv = state.rv;
        drop(state);
        Ok(Reply::Raw(200, list_body(kind, &items, rv, None, None)))
    }
}

fn find_page(state: &State, token: &str) -> ApiResult<(Option<u64>, Arc<Page>, usize)> {
    let expired = || {
        ApiError::expired(
            "The provided continue parameter is too old to display a consistent list result. You can start a new \
             list without the continue parameter.",
        )
    };
    let (id, offset) = token.split_once(':').ok_or_else(expired)?;
    let (id, offset): (u64, usize) = (
        id.parse().map_err(|_| expired())?,
        offset.parse().map_err(|_| expired())?,
    );
    let page = state
        .pages
        .iter()
        .find(|(i, _)| *i == id)
        .ok_or_else(expired)?
        .1
        .clone();
    if offset > page.items.len() {
        return Err(expired());
    }
    Ok((Some(id), page, offset))
}

/// Parses a request body and checks it is `kind`'s object (filling a missing apiVersion/kind).
fn incoming(kind: &Kind, body: &[u8]) -> ApiResult<Value> {
    let mut object: Value = serde_json::from_slice(body).map_err(bad_json)?;
    check_type_meta(kind, &mut object)?;
    Ok(to_storage(kind, object))
}

fn check_type_meta(kind: &Kind, object: &mut Value) -> ApiResult<()> {
    let map = object
        .as_object_mut()
        .ok_or_else(|| ApiError::bad_request("the request body must be a JSON object"))?;
    let expected = [("apiVersion", kind.api_version()), ("kind", kind.kind.to_owned())];
    for (field, expected) in expected {
        match map.get(field).and_then(Value::as_str) {
            Some(actual) if actual != expected => {
                return Err(ApiError::bad_request(format!(
                    "the {field} in the data ({actual}) does not match the expected {field} ({expected})"
                )));
            }
            Some(_) => {}
            None => {
                map.insert(field.into(), expected.into());
            }
        }
    }
    Ok(())
}

// ------------------------------------------------------------------------------------------------------------
// Create
// ------------------------------------------------------------------------------------------------------------

fn create(
    state: &mut State,
    kind: &'static Kind,
    namespace: &str,
    mut object: Value,
) -> ApiResult<Arc<Value>> {
    place_in_namespace(kind, namespace, &mut object)?;
    let had_resource_version = meta_str(&object, "resourceVersion").is_some_and(|rv| !rv.is_empty());
    let name = choose_name(kind, &mut object)?;
    let metadata = meta_mut(&mut object);
    metadata.insert("uid".into(), new_uid().into());
    metadata.insert("creationTimestamp".into(), now().into());
    for field in [
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "resourceVersion",
        "selfLink",
        "managedFields",
    ] {
        metadata.remove(field);
    }
    if kind.generation {
        metadata.insert("generation".into(), 1.into());
    } else {
        metadata.remove("generation");
    }
    prepare_create(kind, &mut object)?;
    if had_resource_version {
        // The storage layer's error, which the real server reports as a 500 with an unknown reason.
        return Err(ApiError::new(
            500,
            "",
            "resourceVersion should not be set on objects to be created",
        ));
    }
    if kind.is_custom() && state.crd_of(kind).is_some_and(|crd| is_deleting(&crd)) {
        return Err(ApiError::method_not_allowed(
            "create not allowed while custom resource definition is terminating",
        ));
    }
    if state.get(kind, namespace, &name).is_some() {
        return Err(ApiError::already_exists(kind, &name));
    }
    normalize(kind, &mut object);
    Ok(state.commit(kind, EventType::Added, object, None))
}

/// The namespace comes from the path; a different one in the body is an error, none is filled in, and
/// cluster-scoped objects lose theirs (as EnsureObjectNamespaceMatchesRequestNamespace does).
fn place_in_namespace(kind: &Kind, namespace: &str, object: &mut Value) -> ApiResult<()> {
    let metadata = meta_mut(object);
    if !kind.namespaced {
        metadata.remove("namespace");
        return Ok(());
    }
    match metadata.get("namespace").and_then(Value::as_str) {
        Some(ns) if !ns.is_empty() && ns != namespace => Err(ApiError::bad_request(
            "the namespace of the provided object does not match the namespace sent on the request",
        )),
        _ => {
            metadata.insert("namespace".into(), namespace.into());
            Ok(())
        }
    }
}

fn choose_name(kind: &Kind, object: &mut Value) -> ApiResult<String> {
    if let Some(name) = meta_str(object, "name").filter(|n| !n.is_empty()) {
        return Ok(name.to_owned());
    }
    let Some(prefix) = meta_str(object, "generateName").filter(|p| !p.is_empty()) else {
        return Err(ApiError::invalid(
            kind,
            "",
            "metadata.name",
            "FieldValueRequired",
            "Required value: name or generateName is required",
        ));
    };
    let name = format!("{prefix}{}", name_suffix());
    meta_mut(object).insert("name".into(), name.clone().into());
    Ok(name)
}

/// The create half of each kind's strategy (PrepareForCreate and the validation that matters here).
fn prepare_create(kind: &Kind, object: &mut Value) -> ApiResult<()> {
    let name = name_of(object).to_owned();
    let uid = uid_of(object).to_owned();
    let map = object.as_object_mut().expect("objects are JSON objects");
    match kind.special {
        Special::Custom => {
            map.remove("status");
        }
        Special::Pod => {
            let qos = pod_qos(map.get("spec"));
            map.insert("status".into(), json!({"phase": "Pending", "qosClass": qos}));
        }
        Special::Job => {
            map.insert("status".into(), json!({}));
            generate_job_selector(map, &name, &uid);
        }
        Special::Namespace => {
            map.insert("status".into(), json!({"phase": "Active"}));
            let spec = map.entry("spec").or_insert_with(|| json!({}));
            let finalizers = spec
                .as_object_mut()
                .map(|s| s.entry("finalizers").or_insert_with(|| json!([])));
            if let Some(Value::Array(finalizers)) = finalizers
                && !finalizers.iter().any(|f| f == "kubernetes")
            {
                finalizers.push("kubernetes".into());
            }
            let metadata = meta_mut(object);
            let labels = metadata.entry("labels").or_insert_with(|| json!({}));
            if let Some(labels) = labels.as_object_mut() {
                labels.insert("kubernetes.io/metadata.name".into(), name.into());
            }
        }
        Special::Crd => prepare_crd(kind, &name, map)?,
        Special::Secret => {
            // Defaulting of the Secret type.
            let type_ = map.entry("type").or_insert_with(|| "Opaque".into());
            if type_.as_str().is_none_or(str::is_empty) {
                *type_ = "Opaque".into();
            }
        }
        Special::Plain | Special::CoreEvent | Special::EventsV1 => {}
    }
    Ok(())
}

/// The pod's QoS class from its containers' cpu and memory requests and limits.
fn pod_qos(spec: Option<&Value>) -> &'static str {
    let containers = ["containers", "initContainers"]
        .into_iter()
        .filter_map(|field| spec?.get(field)?.as_array())
        .flatten();
    let (mut any, mut guaranteed) = (false, true);
    for container in containers {
        for resource in ["cpu", "memory"] {
            let request = container.pointer(&format!("/resources/requests/{resource}"));
            let limit = container.pointer(&format!("/resources/limits/{resource}"));
            any |= request.is_some() || limit.is_some();
            guaranteed &= limit.is_some() && (request.is_none() || request == limit);
        }
    }
    match (any, guaranteed) {
        (false, _) => "BestEffort",
        (true, true) => "Guaranteed",
        (true, false) => "Burstable",
    }
}

/// The job strategy's generated selector: the template is labelled with the job's uid and name, and the
/// selector matches the uid, unless `spec.manualSelector` is true.
fn generate_job_selector(job: &mut Map<String, Value>, name: &str, uid: &str) {
    let Some(spec) = job.get_mut("spec").and_then(Value::as_object_mut) else {
        return;
    };
    if spec.get("manualSelector") == Some(&Value::Bool(true)) {
        return;
    }
    let template = spec.entry("template").or_insert_with(|| json!({}));
    if let Some(labels) = meta_mut(template)
        .entry("labels")
        .or_insert_with(|| json!({}))
        .as_object_mut()
    {
        for (key, value) in [
            ("batch.kubernetes.io/controller-uid", uid),
            ("batch.kubernetes.io/job-name", name),
            ("controller-uid", uid),
            ("job-name", name),
        ] {
            labels.entry(key).or_insert_with(|| value.into());
        }
    }
    let selector = spec.entry("selector").or_insert_with(|| json!({}));
    if let Some(match_labels) = selector
        .as_object_mut()
        .map(|s| s.entry("matchLabels").or_insert_with(|| json!({})))
        .and_then(Value::as_object_mut)
    {
        match_labels
            .entry("batch.kubernetes.io/controller-uid")
            .or_insert_with(|| uid.into());
    }
}

/// A CRD must be named `plural.group`; its conditions are set at once (a real server sets them within
/// moments of creation).
fn prepare_crd(kind: &Kind, name: &str, crd: &mut Map<String, Value>) -> ApiResult<()> {
    let spec = crd.get("spec").cloned().unwrap_or_default();
    let plural = spec
        .pointer("/names/plural")
        .and_then(Value::as_str)
        .unwrap_or("");
    let group = spec.get("group").and_then(Value::as_str).unwrap_or("");
    if name != format!("{plural}.{group}") {
        return Err(ApiError::invalid(
            kind,
            name,
            "metadata.name",
            "FieldValueInvalid",
            &format!("Invalid value: \"{name}\": must be spec.names.plural+\".\"+spec.group"),
        ));
    }
    let stored: Vec<Value> = spec
        .get("versions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|v| v.get("storage") == Some(&Value::Bool(true)))
        .filter_map(|v| v.get("name").cloned())
        .collect();
    let now = now();
    crd.insert(
        "status".into(),
        json!({
            "conditions": [
                {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts",
                 "message": "no conflicts found", "lastTransitionTime": now},
                {"type": "Established", "status": "True", "reason": "InitialNamesAccepted",
                 "message": "the initial names have been accepted", "lastTransitionTime": now},
            ],
            "acceptedNames": spec.get("names").cloned().unwrap_or_default(),
            "storedVersions": stored,
        }),
    );
    Ok(())
}

// ------------------------------------------------------------------------------------------------------------
// Update (PUT, PATCH, apply)
// ------------------------------------------------------------------------------------------------------------

fn replace(state: &mut State, route: &Route, object: Value) -> ApiResult<(u16, Arc<Value>)> {
    let kind = route.kind;
    let name = route.name();
    let body_name = name_of(&object);
    if body_name != name {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({body_name}) does not match the name on the URL ({name})"
        )));
    }
    let body_namespace = namespace_of(&object);
    if kind.namespaced && !body_namespace.is_empty() && body_namespace != route.namespace() {
        return Err(ApiError::bad_request(
            "the namespace of the provided object does not match the namespace sent on the request",
        ));
    }
    match state.get(kind, route.namespace(), name) {
        None if kind.create_on_update && !route.status => {
            Ok((201, create(state, kind, route.namespace(), object)?))
        }
        None => Err(ApiError::not_found(kind, name)),
        Some(old) => {
            check_preconditions(kind, &old, &object, true)?;
            Ok((200, update(state, kind, route.status, &old, object)?))
        }
    }
}

/// A uid in the new object is a precondition (409 when it differs), so is a resourceVersion; a PUT without
/// resourceVersion is an unconditional update, which only some kinds allow.
fn check_preconditions(kind: &Kind, old: &Value, new: &Value, put: bool) -> ApiResult<()> {
    let name = name_of(old);
    if let Some(uid) = meta_str(new, "uid").filter(|u| !u.is_empty())
        && uid != uid_of(old)
    {
        let why = format!(
            "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
            uid_of(old)
        );
        return Err(ApiError::conflict(kind, name, &why));
    }
    match meta_str(new, "resourceVersion").filter(|rv| !rv.is_empty()) {
        Some(rv) if Some(rv) != meta_str(old, "resourceVersion") => {
            Err(ApiError::conflict(kind, name, OPTIMISTIC_LOCK))
        }
        Some(_) => Ok(()),
        None if put && !kind.unconditional_update => Err(ApiError::invalid(
            kind,
            name,
            "metadata.resourceVersion",
            "FieldValueInvalid",
            "Invalid value: 0x0: must be specified for an update",
        )),
        None => Ok(()),
    }
}

/// The server's half of every update: the strategy, system fields, finalizer rules, generation; then store
/// (nothing when nothing changed) or delete (when the last finalizer of a deleted object went).
fn update(
    state: &mut State,
    kind: &'static Kind,
    status: bool,
    old: &Arc<Value>,
    mut new: Value,
) -> ApiResult<Arc<Value>> {
    isolate_status(kind, status, old, &mut new);
    keep_system_fields(kind, old, &mut new)?;
    if kind.special == Special::Job && !status {
        check_job_template_update(kind, old, &new)?;
    }
    if is_deleting(old) {
        let before = finalizers(old);
        let added: Vec<&str> = finalizers(&new)
            .into_iter()
            .filter(|f| !before.contains(f))
            .collect();
        if !added.is_empty() {
            let detail = format!(
                "Forbidden: no new finalizers can be added if the object is being deleted, found new finalizers {added:?}"
            );
            return Err(ApiError::invalid(
                kind,
                name_of(old),
                "metadata.finalizers",
                "FieldValueForbidden",
                &detail,
            ));
        }
    }
    if kind.generation && !same_spec(old, &new, kind.status) {
        meta_mut(&mut new).insert("generation".into(), (generation(old) + 1).into());
    }
    normalize(kind, &mut new);
    if new == **old {
        return Ok(old.clone());
    }
    if is_deleting(&new) && finalizers(&new).is_empty() && grace_period(&new) == Some(0) {
        // The store deletes instead of updating; the deleted object is the stored one.
        state.commit(kind, EventType::Deleted, (**old).clone(), Some(old.clone()));
        return Ok(old.clone());
    }
    Ok(state.commit(kind, EventType::Modified, new, Some(old.clone())))
}

/// Status subresource rules: the main resource keeps the stored status; `/status` keeps everything else
/// (custom resources and CRDs: also all metadata; built-in kinds: metadata may change, ownerReferences of
/// pods may not).
fn isolate_status(kind: &Kind, status: bool, old: &Value, new: &mut Value) {
    if !kind.status {
        return;
    }
    let new_map = new.as_object_mut().expect("objects are JSON objects");
    let old_map = old.as_object().expect("objects are JSON objects");
    if !status {
        match old_map.get("status") {
            Some(stored) => new_map.insert("status".into(), stored.clone()),
            None => new_map.remove("status"),
        };
        return;
    }
    let written = new_map.remove("status");
    if kind.status_only_status() {
        *new_map = old_map.clone();
    } else {
        new_map.retain(|key, _| key == "metadata");
        for (key, value) in old_map.iter().filter(|(k, _)| *k != "metadata" && *k != "status") {
            new_map.insert(key.clone(), value.clone());
        }
        if kind.special == Special::Pod {
            let owners = meta(old).and_then(|m| m.get("ownerReferences")).cloned();
            let metadata = meta_mut(new);
            match owners {
                Some(owners) => metadata.insert("ownerReferences".into(), owners),
                None => metadata.remove("ownerReferences"),
            };
        }
    }
    let new_map = new.as_object_mut().expect("objects are JSON objects");
    match written {
        Some(written) => new_map.insert("status".into(), written),
        None => new_map.remove("status"),
    };
}

/// A Job's pod template is immutable, except (ValidateJobUpdate) its scheduling directives and its labels and
/// annotations while the Job is suspended and has never started: the exception Job fencing's grant relies on.
fn check_job_template_update(kind: &Kind, old: &Value, new: &Value) -> ApiResult<()> {
    let template = |job: &Value| job.pointer("/spec/template").cloned().unwrap_or(Value::Null);
    let (before, after) = (template(old), template(new));
    if before == after {
        return Ok(());
    }
    let never_started = old.pointer("/spec/suspend") == Some(&Value::Bool(true))
        && old.pointer("/status/startTime").is_none_or(Value::is_null);
    let without_mutable = |mut template: Value| {
        if let Some(meta) = template.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.remove("labels");
            meta.remove("annotations");
        }
        if let Some(spec) = template.get_mut("spec").and_then(Value::as_object_mut) {
            for field in ["nodeSelector", "tolerations", "schedulingGates"] {
                spec.remove(field);
            }
            // Of the affinity, only node affinity is a scheduling directive.
            if let Some(affinity) = spec.get_mut("affinity").and_then(Value::as_object_mut) {
                affinity.remove("nodeAffinity");
            }
        }
        template
    };
    if never_started && without_mutable(before) == without_mutable(after) {
        return Ok(());
    }
    Err(ApiError::invalid(
        kind,
        name_of(old),
        "spec.template",
        "FieldValueInvalid",
        "Invalid value: field is immutable",
    ))
}

/// Fields only the server sets (rest.BeforeUpdate and ValidateObjectMetaUpdate).
fn keep_system_fields(kind: &Kind, old: &Value, new: &mut Value) -> ApiResult<()> {
    let name = name_of(old).to_owned();
    let immutable = |field: &str, value: &Value| {
        let detail = format!("Invalid value: {value}: field is immutable");
        Err(ApiError::invalid(
            kind,
            &name,
            &format!("metadata.{field}"),
            "FieldValueInvalid",
            &detail,
        ))
    };
    let old_meta = meta(old).cloned().unwrap_or_default();
    let new_meta = meta_mut(new);
    // A missing or empty name or namespace takes the stored one; a cluster-scoped object has none.
    let identity: &[&str] = if kind.namespaced {
        &["name", "namespace"]
    } else {
        &["name"]
    };
    for field in identity {
        match new_meta.get(*field) {
            Some(after) if !after.is_null() && after != "" && Some(after) != old_meta.get(*field) => {
                return immutable(field, after);
            }
            _ => {}
        }
    }
    match (
        old_meta.get("deletionTimestamp"),
        new_meta.get("deletionTimestamp"),
    ) {
        (None, Some(after)) if !after.is_null() => return immutable("deletionTimestamp", after),
        _ => {}
    }
    let grace_before = old_meta.get("deletionGracePeriodSeconds");
    if let Some(after) = new_meta
        .get("deletionGracePeriodSeconds")
        .filter(|g| !g.is_null())
        && Some(after) != grace_before
    {
        return immutable("deletionGracePeriodSeconds", after);
    }
    for field in [
        "name",
        "namespace",
        "uid",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "generation",
        "resourceVersion",
    ] {
        match old_meta.get(field) {
            Some(value) => new_meta.insert(field.into(), value.clone()),
            None => new_meta.remove(field),
        };
    }
    new_meta.remove("managedFields");
    new_meta.remove("selfLink");
    Ok(())
}

// ------------------------------------------------------------------------------------------------------------
// Patch
// ------------------------------------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PatchType {
    Merge,
    Json,
    Strategic,
    Apply,
}

fn patch_type(kind: &Kind, content_type: &str) -> ApiResult<PatchType> {
    let patch = match content_type {
        "application/merge-patch+json" => Some(PatchType::Merge),
        "application/json-patch+json" => Some(PatchType::Json),
        "application/strategic-merge-patch+json" if !kind.is_custom() => Some(PatchType::Strategic),
        "application/apply-patch+yaml" => Some(PatchType::Apply),
        _ => None,
    };
    patch.ok_or_else(|| {
        let accepted = if kind.is_custom() {
            "application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml"
        } else {
            "application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml, \
             application/strategic-merge-patch+json"
        };
        ApiError::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: {accepted}"
            ),
        )
    })
}

fn patch(
    state: &mut State,
    route: &Route,
    query: &Query,
    content_type: &str,
    body: &[u8],
) -> ApiResult<(u16, Arc<Value>)> {
    let kind = route.kind;
    let name = route.name();
    let patch_type = patch_type(kind, content_type)?;
    let options_invalid = |field: &str, detail: &str| {
        let message = format!("PatchOptions.meta.k8s.io \"\" is invalid: {field}: {detail}");
        Err(ApiError::new(422, "Invalid", message))
    };
    if patch_type == PatchType::Apply && query.get("fieldManager").is_none_or(str::is_empty) {
        return options_invalid("fieldManager", "Required value: is required for apply patch");
    }
    if patch_type != PatchType::Apply && query.flag("force") {
        return options_invalid("force", "Forbidden: may not be specified for non-apply patch");
    }
    let Some(old) = state.get(kind, route.namespace(), name) else {
        if patch_type == PatchType::Apply && !route.status {
            // Server-side apply creates what does not exist.
            let applied = applied_object(route, body)?;
            return Ok((
                201,
                create(state, kind, route.namespace(), to_storage(kind, applied))?,
            ));
        }
        return Err(ApiError::not_found(kind, name));
    };
    let mut document = render(kind, &old).into_owned();
    match patch_type {
        PatchType::Merge => {
            json_patch::merge(&mut document, &serde_json::from_slice(body).map_err(bad_json)?)
        }
        PatchType::Json => apply_json_patch(&mut document, body)?,
        PatchType::Strategic => {
            let patch: Value = serde_json::from_slice(body).map_err(bad_json)?;
            strategic_merge(kind, &mut document, &patch).map_err(ApiError::unprocessable)?;
        }
        PatchType::Apply => json_patch::merge(&mut document, &applied_object(route, body)?),
    }
    if !document.is_object() {
        return Err(ApiError::unprocessable("the patched object is not a JSON object"));
    }
    // The patched object is an object of this kind whatever the patch did to its type fields.
    document["apiVersion"] = kind.api_version().into();
    document["kind"] = kind.kind.into();
    let new = to_storage(kind, document);
    check_preconditions(kind, &old, &new, false)?;
    Ok((200, update(state, kind, route.status, &old, new)?))
}

/// The applied configuration of a server-side apply: YAML or JSON, naming this kind and this object.
fn applied_object(route: &Route, body: &[u8]) -> ApiResult<Value> {
    let mut applied: Value = match serde_json::from_slice(body) {
        Ok(value) => value,
        Err(_) => serde_yaml_ng::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))?,
    };
    if !applied.is_object() {
        return Err(ApiError::bad_request(
            "the applied configuration must be an object",
        ));
    }
    for field in ["apiVersion", "kind"] {
        if applied
            .get(field)
            .and_then(Value::as_str)
            .is_none_or(str::is_empty)
        {
            return Err(ApiError::bad_request(format!(
                "invalid object: {field} must be set"
            )));
        }
    }
    check_type_meta(route.kind, &mut applied)?;
    let name = name_of(&applied);
    if !name.is_empty() && name != route.name() {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({name}) does not match the name on the URL ({})",
            route.name()
        )));
    }
    meta_mut(&mut applied).insert("name".into(), route.name().into());
    Ok(applied)
}

/// RFC 6902 with the Go library's `test`: a missing member tests equal to null, as it does for the real
/// server (kube_runtime's finalizer helper relies on that).
fn apply_json_patch(document: &mut Value, body: &[u8]) -> ApiResult<()> {
    let patch: json_patch::Patch = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("invalid JSON patch: {e}")))?;
    for operation in &patch.0 {
        match operation {
            PatchOperation::Test(test) => {
                let path = test.path.as_str();
                let actual = match document.pointer(path) {
                    Some(actual) => actual,
                    None => {
                        let parent = path.rsplit_once('/').map_or("", |(parent, _)| parent);
                        if document.pointer(parent).is_none() {
                            let detail = format!("test operation does not apply: is missing path: {path}");
                            return Err(ApiError::unprocessable(detail));
                        }
                        &Value::Null
                    }
                };
                if *actual != test.value {
                    return Err(ApiError::unprocessable(format!(
                        "testing value {path} failed: test failed"
                    )));
                }
            }
            other => json_patch::patch(document, std::slice::from_ref(other))
                .map_err(|e| ApiError::unprocessable(e.to_string()))?,
        }
    }
    Ok(())
}

#[derive(Debug, Clone, Copy)]
enum ListMerge {
    /// A set of scalars (finalizers): the patch's items are added.
    Primitive,
    /// Maps merged by this key.
    Key(&'static str),
}

/// The `patchStrategy:"merge"` lists of the built-in kinds served here, by field path (list indexes left out).
fn list_merge(kind: &Kind, path: &[String]) -> Option<ListMerge> {
    let joined = path.join(".");
    // A job's pod template has the pod's lists.
    let pod_path = match kind.special {
        Special::Job => joined.strip_prefix("spec.template."),
        Special::Pod => Some(joined.as_str()),
        _ => None,
    };
    let by_name = ["containers", "initContainers", "ephemeralContainers"];
    let pod_list = pod_path.and_then(|p| match p.split('.').collect::<Vec<_>>()[..] {
        [
            "spec",
            "volumes" | "imagePullSecrets" | "resourceClaims" | "schedulingGates",
        ] => Some(ListMerge::Key("name")),
        ["spec", "hostAliases"] => Some(ListMerge::Key("ip")),
        ["spec", c] if by_name.contains(&c) => Some(ListMerge::Key("name")),
        ["spec", c, "env"] if by_name.contains(&c) => Some(ListMerge::Key("name")),
        ["spec", c, "ports"] if by_name.contains(&c) => Some(ListMerge::Key("containerPort")),
        ["spec", c, "volumeMounts"] if by_name.contains(&c) => Some(ListMerge::Key("mountPath")),
        ["spec", c, "volumeDevices"] if by_name.contains(&c) => Some(ListMerge::Key("devicePath")),
        _ => None,
    });
    pod_list.or(match (kind.special, joined.as_str()) {
        (_, "metadata.finalizers") => Some(ListMerge::Primitive),
        (_, "metadata.ownerReferences") => Some(ListMerge::Key("uid")),
        (Special::Pod | Special::Job | Special::Namespace, "status.conditions") => {
            Some(ListMerge::Key("type"))
        }
        (Special::Pod, "status.podIPs" | "status.hostIPs") => Some(ListMerge::Key("ip")),
        _ => None,
    })
}

fn strip_directives(value: &Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.iter()
                .filter(|(k, _)| !k.starts_with('$'))
                .map(|(k, v)| (k.clone(), strip_directives(v)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(strip_directives).collect()),
        other => other.clone(),
    }
}

fn directive(value: &Value) -> Option<&str> {
    value.get("$patch")?.as_str()
}

fn strategic_merge(kind: &Kind, document: &mut Value, patch: &Value) -> Result<(), String> {
    let (Some(document), Some(patch)) = (document.as_object_mut(), patch.as_object()) else {
        return Err("a strategic merge patch must be a JSON object".into());
    };
    smp_map(kind, document, patch, &mut Vec::new())
}

fn smp_map(
    kind: &Kind,
    document: &mut Map<String, Value>,
    patch: &Map<String, Value>,
    path: &mut Vec<String>,
) -> Result<(), String> {
    if patch.get("$patch").and_then(Value::as_str) == Some("replace") {
        if let Value::Object(replacement) = strip_directives(&Value::Object(patch.clone())) {
            *document = replacement;
        }
        return Ok(());
    }
    // Deletions from primitive lists come before the merge of the same list.
    for (key, value) in patch {
        if let Some(field) = key.strip_prefix("$deleteFromPrimitiveList/")
            && let (Some(Value::Array(list)), Some(remove)) = (document.get_mut(field), value.as_array())
        {
            list.retain(|item| !remove.contains(item));
        }
    }
    for (key, value) in patch {
        if key.starts_with('$') {
            let known = key == "$patch"
                || key == "$retainKeys"
                || key.starts_with("$setElementOrder/")
                || key.starts_with("$deleteFromPrimitiveList/");
            if known {
                continue;
            }
            return Err(format!("unknown patch directive {key}"));
        }
        path.push(key.clone());
        let result = smp_field(kind, document, key, value, path);
        path.pop();
        result?;
    }
    if let Some(Value::Array(keep)) = patch.get("$retainKeys") {
        document.retain(|key, _| keep.iter().any(|k| k == key));
    }
    Ok(())
}

fn smp_field(
    kind: &Kind,
    document: &mut Map<String, Value>,
    key: &str,
    value: &Value,
    path: &mut Vec<String>,
) -> Result<(), String> {
    if value.is_null() || directive(value) == Some("delete") {
        document.remove(key);
        return Ok(());
    }
    match (document.get_mut(key), value) {
        (Some(Value::Object(current)), Value::Object(patch)) => smp_map(kind, current, patch, path),
        (Some(Value::Array(current)), Value::Array(patch)) => match list_merge(kind, path) {
            Some(strategy) => smp_list(kind, current, patch, strategy, path),
            None => {
                *current = patch.iter().map(strip_directives).collect();
                Ok(())
            }
        },
        _ => {
            document.insert(key.to_owned(), strip_directives(value));
            Ok(())
        }
    }
}

fn smp_list(
    kind: &Kind,
    current: &mut Vec<Value>,
    patch: &[Value],
    strategy: ListMerge,
    path: &mut Vec<String>,
) -> Result<(), String> {
    let key = match strategy {
        ListMerge::Primitive => {
            for item in patch {
                if !current.contains(item) {
                    current.push(item.clone());
                }
            }
            return Ok(());
        }
        ListMerge::Key(key) => key,
    };
    if patch.iter().any(|item| directive(item) == Some("replace")) {
        *current = patch
            .iter()
            .filter(|item| directive(item).is_none())
            .map(strip_directives)
            .collect();
        return Ok(());
    }
    for item in patch {
        let Some(fields) = item.as_object() else {
            return Err(format!("{}: list items must be objects", path.join(".")));
        };
        let id = fields
            .get(key)
            .ok_or_else(|| format!("map: {item} does not contain declared merge key: {key}"))?;
        let position = current.iter().position(|existing| existing.get(key) == Some(id));
        match (position, directive(item)) {
            (Some(i), Some("delete")) => {
                current.remove(i);
            }
            (None, Some("delete")) => {}
            (Some(i), _) => {
                if let Some(existing) = current[i].as_object_mut() {
                    smp_map(kind, existing, fields, path)?;
                }
            }
            (None, _) => current.push(strip_directives(item)),
        }
    }
    Ok(())
}

// ------------------------------------------------------------------------------------------------------------
// Delete
// ------------------------------------------------------------------------------------------------------------

#[derive(Debug, Default)]
struct DeleteOptions {
    grace_period: Option<i64>,
    uid: Option<String>,
    resource_version: Option<String>,
}

impl DeleteOptions {
    fn parse(query: &Query, body: &[u8]) -> ApiResult<Self> {
        let mut options = DeleteOptions::default();
        if !body.is_empty() {
            let body: Value = serde_json::from_slice(body).map_err(bad_json)?;
            if body
                .get("dryRun")
                .and_then(Value::as_array)
                .is_some_and(|d| !d.is_empty())
            {
                return Err(ApiError::bad_request(
                    "dryRun is not supported by the test API server",
                ));
            }
            options.grace_period = body.get("gracePeriodSeconds").and_then(Value::as_i64);
            let precondition = |field: &str| {
                body.pointer(&format!("/preconditions/{field}"))
                    .and_then(Value::as_str)
                    .map(str::to_owned)
            };
            options.uid = precondition("uid");
            options.resource_version = precondition("resourceVersion");
        }
        if let Some(grace) = query.number("gracePeriodSeconds")? {
            options.grace_period = Some(grace);
        }
        Ok(options)
    }
}

enum Deleted {
    /// Still there: deletion pending on finalizers or a grace period.
    Kept(Arc<Value>),
    /// Gone; the last stored content.
    Removed(Arc<Value>),
}

fn delete_reply(kind: &Kind, outcome: &Deleted) -> Value {
    match outcome {
        Deleted::Kept(object) => render(kind, object).into_owned(),
        Deleted::Removed(object) if kind.returns_deleted => render(kind, object).into_owned(),
        Deleted::Removed(object) => {
            // The generic store's answer; `kind` carries the resource, as in the real server.
            let mut details = ApiError::details(kind, name_of(object), kind.plural);
            details.insert("uid".into(), uid_of(object).into());
            json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "details": details})
        }
    }
}

fn delete(
    state: &mut State,
    kind: &'static Kind,
    namespace: &str,
    name: &str,
    options: &DeleteOptions,
) -> ApiResult<Deleted> {
    if kind.special == Special::Namespace {
        return Err(ApiError::method_not_allowed(
            "deleting namespaces is not supported by the test API server (no namespace controller)",
        ));
    }
    let old = state
        .get(kind, namespace, name)
        .ok_or_else(|| ApiError::not_found(kind, name))?;
    let precondition_failed = |what: &str, wanted: &str, actual: &str| {
        let why =
            format!("Precondition failed: {what} in precondition: {wanted}, {what} in object meta: {actual}");
        Err(ApiError::conflict(kind, name, &why))
    };
    if let Some(uid) = &options.uid
        && uid != uid_of(&old)
    {
        return precondition_failed("UID", uid, uid_of(&old));
    }
    if let Some(rv) = &options.resource_version {
        let actual = meta_str(&old, "resourceVersion").unwrap_or("");
        if rv != actual {
            return precondition_failed("ResourceVersion", rv, actual);
        }
    }
    if kind.special == Special::Crd {
        return Ok(Deleted::Kept(delete_crd(state, &old)));
    }
    if kind.special == Special::Pod {
        let period = pod_grace_period(&old, options.grace_period);
        if period > 0 {
            return Ok(Deleted::Kept(delete_gracefully(state, kind, &old, period)));
        }
    }
    if !finalizers(&old).is_empty() {
        return Ok(Deleted::Kept(mark_deleting(state, kind, &old)?));
    }
    state.commit(kind, EventType::Deleted, (*old).clone(), Some(old.clone()));
    Ok(Deleted::Removed(old))
}

/// The pod strategy's CheckGracefulDelete: the requested period, else terminationGracePeriodSeconds (30 by
/// defaulting); 0 for pods never scheduled or already finished, and for pods whose grace period is over.
fn pod_grace_period(pod: &Value, requested: Option<i64>) -> i64 {
    if is_deleting(pod) && grace_period(pod) == Some(0) {
        return 0;
    }
    let default = pod
        .pointer("/spec/terminationGracePeriodSeconds")
        .and_then(Value::as_i64)
        .unwrap_or(30);
    let scheduled = pod
        .pointer("/spec/nodeName")
        .and_then(Value::as_str)
        .is_some_and(|n| !n.is_empty());
    let finished = matches!(
        pod.pointer("/status/phase").and_then(Value::as_str),
        Some("Succeeded" | "Failed")
    );
    match requested.unwrap_or(default) {
        _ if !scheduled || finished => 0,
        period if period < 0 => 1,
        period => period,
    }
}

/// Sets deletionTimestamp `period` seconds ahead; only a shorter period changes a deletion in progress. The
/// sweep finishes the deletion when the period is over, as the kubelet would.
fn delete_gracefully(state: &mut State, kind: &'static Kind, old: &Arc<Value>, period: i64) -> Arc<Value> {
    if is_deleting(old) && grace_period(old).is_some_and(|current| current <= period) {
        return old.clone();
    }
    let mut new = (**old).clone();
    let first = !is_deleting(old);
    let metadata = meta_mut(&mut new);
    let deadline = Timestamp::now() + SignedDuration::from_secs(period);
    metadata.insert("deletionTimestamp".into(), timestamp(deadline).into());
    metadata.insert("deletionGracePeriodSeconds".into(), period.into());
    if first && generation(old) > 0 {
        metadata.insert("generation".into(), (generation(old) + 1).into());
    }
    let stored = state.commit(kind, EventType::Modified, new, Some(old.clone()));
    state.graceful.push(GracefulPod {
        deadline: Instant::now() + Duration::from_secs(period.unsigned_abs()),
        namespace: namespace_of(old).to_owned(),
        name: name_of(old).to_owned(),
        uid: uid_of(old).to_owned(),
    });
    stored
}

/// The store's markAsDeleting: deletionTimestamp now (or earlier), grace period 0, generation bumped once.
fn mark_deleting(state: &mut State, kind: &'static Kind, old: &Arc<Value>) -> ApiResult<Arc<Value>> {
    let mut new = (**old).clone();
    let now = now();
    let metadata = meta_mut(&mut new);
    if !is_deleting(old) && generation(old) > 0 {
        metadata.insert("generation".into(), (generation(old) + 1).into());
    }
    // RFC 3339 in UTC with whole seconds: comparing the strings compares the times.
    let later = metadata
        .get("deletionTimestamp")
        .and_then(Value::as_str)
        .is_none_or(|current| current > now.as_str());
    if later {
        metadata.insert("deletionTimestamp".into(), now.into());
    }
    metadata.insert("deletionGracePeriodSeconds".into(), 0.into());
    if new == **old {
        return Ok(old.clone());
    }
    Ok(state.commit(kind, EventType::Modified, new, Some(old.clone())))
}

/// A CRD is deleted behind the cleanup finalizer: its instances are deleted, and the CRD goes once they
/// are all gone (see `finish_crd_deletions`).
fn delete_crd(state: &mut State, crd: &Arc<Value>) -> Arc<Value> {
    let crd_kind = kind_of(Special::Crd);
    let mut current = crd.clone();
    if !is_deleting(crd) {
        let mut new = (**crd).clone();
        let metadata = meta_mut(&mut new);
        let list = metadata.entry("finalizers").or_insert_with(|| json!([]));
        if let Some(list) = list.as_array_mut()
            && !list.iter().any(|f| f == CRD_CLEANUP_FINALIZER)
        {
            list.push(CRD_CLEANUP_FINALIZER.into());
        }
        metadata.insert("deletionTimestamp".into(), now().into());
        metadata.insert("deletionGracePeriodSeconds".into(), 0.into());
        metadata.insert("generation".into(), (generation(crd) + 1).into());
        if let Some(conditions) = new
            .pointer_mut("/status/conditions")
            .and_then(Value::as_array_mut)
        {
            conditions.push(json!({
                "type": "Terminating", "status": "True", "reason": "InstanceDeletionPending",
                "message": "CustomResourceDefinition marked for deletion; CustomResource deletion will begin soon",
                "lastTransitionTime": now(),
            }));
        }
        current = state.commit(crd_kind, EventType::Modified, new, Some(crd.clone()));
        for kind in KINDS
            .iter()
            .filter(|k| k.is_custom() && k.crd_name() == name_of(crd))
        {
            let instances: Vec<(String, String)> = state
                .bucket(kind)
                .objects
                .values()
                .map(|o| (namespace_of(o).to_owned(), name_of(o).to_owned()))
                .collect();
            for (namespace, name) in instances {
                let _ = delete(state, kind, &namespace, &name, &DeleteOptions::default());
            }
        }
    }
    finish_crd_deletions(state);
    current
}

fn finish_crd_deletions(state: &mut State) {
    let crd_kind = kind_of(Special::Crd);
    let terminating: Vec<Arc<Value>> = state
        .bucket(crd_kind)
        .objects
        .values()
        .filter(|crd| is_deleting(crd) && finalizers(crd).contains(&CRD_CLEANUP_FINALIZER))
        .cloned()
        .collect();
    for crd in terminating {
        let instances_left = KINDS
            .iter()
            .filter(|k| k.is_custom() && k.crd_name() == name_of(&crd))
            .any(|k| state.buckets.get(k.plural).is_some_and(|b| !b.objects.is_empty()));
        if instances_left {
            continue;
        }
        let mut new = (*crd).clone();
        if let Some(list) = meta_mut(&mut new)
            .get_mut("finalizers")
            .and_then(Value::as_array_mut)
        {
            list.retain(|f| f != CRD_CLEANUP_FINALIZER);
        }
        let _ = update(state, crd_kind, false, &crd, new);
    }
}

// ------------------------------------------------------------------------------------------------------------
// Background sweep: the kubelet's final pod deletion, the CRD finalizer
// ------------------------------------------------------------------------------------------------------------

async fn sweep_loop(shared: Arc<Shared>) {
    let mut interval = tokio::time::interval(SWEEP_INTERVAL);
    loop {
        interval.tick().await;
        if !shared.is_down() {
            sweep(&mut shared.lock());
        }
    }
}

fn sweep(state: &mut State) {
    let now = Instant::now();
    let (due, pending): (Vec<_>, Vec<_>) = std::mem::take(&mut state.graceful)
        .into_iter()
        .partition(|pod| pod.deadline <= now);
    state.graceful = pending;
    let pods = kind_of(Special::Pod);
    for pod in due {
        let still_terminating = state
            .get(pods, &pod.namespace, &pod.name)
            .is_some_and(|current| uid_of(&current) == pod.uid && is_deleting(&current));
        if still_terminating {
            let final_delete = DeleteOptions {
                grace_period: Some(0),
                ..DeleteOptions::default()
            };
            let _ = delete(state, pods, &pod.namespace, &pod.name, &final_delete);
        }
    }
    finish_crd_deletions(state);
}

// ------------------------------------------------------------------------------------------------------------
// Watch
// ------------------------------------------------------------------------------------------------------------

enum Pending {
    /// A synthetic ADDED event for an object that existed when the watch started.
    Added(Arc<Value>),
    Change(Arc<Change>),
    Bookmark {
        rv: u64,
        initial_events_end: bool,
    },
    Error(Value),
}

struct WatchSession {
    shared: Arc<Shared>,
    kind: &'static Kind,
    namespace: Option<String>,
    filter: Filter,
    pending: VecDeque<Pending>,
    /// None for a watch that only reports an error.
    changes: Option<mpsc::Receiver<Arc<Change>>>,
    /// The newest resourceVersion this watch has passed on or filtered out.
    seen: u64,
    bookmarks: bool,
    next_bookmark: Instant,
    deadline: Instant,
}

enum Wake {
    Change(Option<Arc<Change>>),
    Timeout,
    Bookmark,
}

impl Shared {
    fn start_watch(self: &Arc<Self>, route: &Route, query: &Query) -> ApiResult<WatchSession> {
        let kind = route.kind;
        let mut filter = Filter::parse(kind, query)?;
        if let Some(name) = &route.name {
            filter.fields.push(FieldReq {
                label: "metadata.name".into(),
                value: name.clone(),
                negate: false,
            });
        }
        let send_initial_events = query.get("sendInitialEvents");
        let bookmarks = query.flag("allowWatchBookmarks");
        let invalid = |detail: &str| {
            Err(ApiError::new(
                422,
                "Invalid",
                format!("ListOptions.meta.k8s.io \"\" is invalid: {detail}"),
            ))
        };
        match send_initial_events {
            Some(_) if query.get("resourceVersionMatch") != Some("NotOlderThan") => {
                return invalid(
                    "resourceVersionMatch: Forbidden: sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
                );
            }
            Some("true") if !bookmarks => {
                return invalid(
                    "allowWatchBookmarks: Forbidden: sendInitialEvents requires setting allowWatchBookmarks to true",
                );
            }
            None if query.get("resourceVersionMatch").is_some_and(|m| !m.is_empty()) => {
                return invalid(
                    "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided",
                );
            }
            _ => {}
        }
        let streaming = send_initial_events == Some("true");
        let from = match query
            .get("resourceVersion")
            .filter(|rv| !rv.is_empty() && *rv != "0")
        {
            Some(rv) if !streaming => Some(
                rv.parse::<u64>()
                    .map_err(|_| ApiError::bad_request(format!("invalid resource version: {rv}")))?,
            ),
            _ => None,
        };
        let timeout = query
            .number::<u64>("timeoutSeconds")?
            .map_or(DEFAULT_WATCH_TIMEOUT, Duration::from_secs);

        let (sender, changes) = mpsc::channel(WATCH_BUFFER);
        let mut state = self.lock();
        if self.is_down() {
            return Err(ApiError::new(
                503,
                "ServiceUnavailable",
                "the API server is down (set_down)",
            ));
        }
        let start_rv = state.rv;
        let objects = match from {
            None if send_initial_events != Some("false") => {
                state.select(kind, route.namespace.as_deref(), &filter)
            }
            _ => Vec::new(),
        };
        let bucket = state.bucket(kind);
        let mut pending: VecDeque<Pending> = objects.into_iter().map(Pending::Added).collect();
        let mut changes = Some(changes);
        match from {
            Some(rv) if rv < bucket.compacted => {
                // The real server answers 200 and reports the expiry as the stream's only event.
                let oldest = bucket.history.front().map_or(start_rv, |c| c.rv);
                let error = ApiError::expired(format!("too old resource version: {rv} ({oldest})"));
                pending.push_back(Pending::Error(error.status()));
                changes = None;
            }
            Some(rv) => pending.extend(
                bucket
                    .history
                    .iter()
                    .filter(|c| c.rv > rv)
                    .cloned()
                    .map(Pending::Change),
            ),
            None if streaming => pending.push_back(Pending::Bookmark {
                rv: start_rv,
                initial_events_end: true,
            }),
            None => {}
        }
        if changes.is_some() {
            bucket.watchers.push(sender);
        }
        drop(state);
        let now = Instant::now();
        Ok(WatchSession {
            shared: self.clone(),
            kind,
            namespace: route.namespace.clone(),
            filter,
            pending,
            changes,
            seen: start_rv,
            bookmarks,
            next_bookmark: now + BOOKMARK_INTERVAL,
            deadline: now + timeout,
        })
    }
}

impl WatchSession {
    fn into_response(self) -> Response {
        let lines = futures::stream::unfold(self, |mut session| async move {
            let line = session.next_line().await?;
            Some((Ok::<Bytes, Infallible>(line), session))
        });
        Response::builder()
            .status(200)
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from_stream(lines))
            .expect("valid response")
    }

    async fn next_line(&mut self) -> Option<Bytes> {
        loop {
            // A closed channel means set_down or a watcher too far behind: the watch ends now.
            if self.changes.as_ref().is_some_and(mpsc::Receiver::is_closed) {
                return None;
            }
            if let Some(pending) = self.pending.pop_front() {
                match self.encode(pending) {
                    Some(line) => return Some(line),
                    None => continue,
                }
            }
            let changes = self.changes.as_mut()?;
            let wake = tokio::select! {
                change = changes.recv() => Wake::Change(change),
                () = tokio::time::sleep_until(self.deadline) => Wake::Timeout,
                () = tokio::time::sleep_until(self.next_bookmark), if self.bookmarks => Wake::Bookmark,
            };
            match wake {
                Wake::Change(Some(change)) => {
                    self.seen = self.seen.max(change.rv);
                    self.pending.push_back(Pending::Change(change));
                }
                Wake::Change(None) | Wake::Timeout => return None,
                Wake::Bookmark => self.queue_bookmark(),
            }
        }
    }

    /// A bookmark promises every change up to its resourceVersion was sent. Changes are handed to watchers
    /// under the state lock, so all those up to the current resourceVersion are in the channel by now.
    fn queue_bookmark(&mut self) {
        self.next_bookmark = Instant::now() + BOOKMARK_INTERVAL;
        let current = self.shared.lock().rv;
        let Some(changes) = self.changes.as_mut() else {
            return;
        };
        while let Ok(change) = changes.try_recv() {
            self.seen = self.seen.max(change.rv);
            self.pending.push_back(Pending::Change(change));
        }
        self.pending.push_back(Pending::Bookmark {
            rv: current.max(self.seen),
            initial_events_end: false,
        });
    }

    fn in_scope(&self, object: &Value) -> bool {
        self.namespace
            .as_deref()
            .is_none_or(|ns| namespace_of(object) == ns)
            && self.filter.matches(object)
    }

    fn encode(&self, pending: Pending) -> Option<Bytes> {
        match pending {
            Pending::Added(object) => self.in_scope(&object).then(|| self.line("ADDED", &object)),
            Pending::Change(change) => self.encode_change(&change),
            Pending::Bookmark {
                rv,
                initial_events_end,
            } => {
                let mut metadata = json!({"resourceVersion": rv.to_string()});
                if initial_events_end {
                    metadata["annotations"] = json!({INITIAL_EVENTS_END: "true"});
                }
                let object = json!({"kind": self.kind.kind, "apiVersion": self.kind.api_version(), "metadata": metadata});
                Some(raw_line("BOOKMARK", &object))
            }
            Pending::Error(status) => Some(raw_line("ERROR", &status)),
        }
    }

    /// Selectors apply to both sides of a change: an object entering the selection is ADDED, one leaving
    /// it is DELETED (with its previous content and the change's resourceVersion), like the real server.
    fn encode_change(&self, change: &Change) -> Option<Bytes> {
        let now_in = change.event != EventType::Deleted && self.in_scope(&change.object);
        let was_in = match change.event {
            EventType::Added => false,
            EventType::Modified => change.previous.as_ref().is_some_and(|p| self.in_scope(p)),
            EventType::Deleted => self.in_scope(&change.object),
        };
        match (was_in, now_in) {
            (false, true) => Some(self.line("ADDED", &change.object)),
            (true, true) => Some(self.line("MODIFIED", &change.object)),
            (true, false) if change.event == EventType::Deleted => Some(self.line("DELETED", &change.object)),
            (true, false) => {
                let mut previous = (**change.previous.as_ref()?).clone();
                meta_mut(&mut previous).insert("resourceVersion".into(), change.rv.to_string().into());
                Some(self.line("DELETED", &previous))
            }
            (false, false) => None,
        }
    }

    fn line(&self, event: &'static str, object: &Value) -> Bytes {
        let view = View {
            kind: self.kind,
            object,
            list_item: false,
        };
        raw_line(event, &view)
    }
}

fn raw_line(event: &str, object: &impl Serialize) -> Bytes {
    #[derive(Serialize)]
    struct Line<'a, T: Serialize> {
        #[serde(rename = "type")]
        event: &'a str,
        object: &'a T,
    }
    let mut bytes = serde_json::to_vec(&Line { event, object }).expect("watch events serialize");
    bytes.push(b'\n');
    Bytes::from(bytes)
}

// ------------------------------------------------------------------------------------------------------------
// Discovery
// ------------------------------------------------------------------------------------------------------------

impl Shared {
    fn discovery(&self, path: &str) -> Option<Response> {
        let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
        let document = match segments.as_slice() {
            ["version"] => json!({
                "major": "1", "minor": "33", "gitVersion": "v1.33.0", "gitCommit": "test-apiserver",
                "gitTreeState": "clean", "buildDate": "2025-04-23T00:00:00Z", "goVersion": "go1.24.2",
                "compiler": "gc", "platform": "linux/amd64",
            }),
            ["healthz" | "livez" | "readyz"] => {
                return Some(
                    Response::builder()
                        .status(200)
                        .body(Body::from("ok"))
                        .expect("valid response"),
                );
            }
            ["api"] => json!({
                "kind": "APIVersions", "versions": ["v1"],
                "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": self.addr.to_string()}],
            }),
            ["apis"] => {
                let groups: Vec<Value> = self
                    .served_group_versions()
                    .into_iter()
                    .map(|(g, v)| group_document(g, v))
                    .collect();
                json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
            }
            ["apis", group] => {
                let (group, version) = self
                    .served_group_versions()
                    .into_iter()
                    .find(|(g, _)| g == group)?;
                group_document(group, version)
            }
            ["api", version] => self.resource_list("", version)?,
            ["apis", group, version] => self.resource_list(group, version)?,
            _ => return None,
        };
        Some(json_response(200, document.to_string().into_bytes()))
    }

    fn served_group_versions(&self) -> Vec<(&'static str, &'static str)> {
        let state = self.lock();
        let mut groups: Vec<(&'static str, &'static str)> = Vec::new();
        for kind in KINDS.iter().filter(|k| !k.group.is_empty() && state.served(k)) {
            if !groups.contains(&(kind.group, kind.version)) {
                groups.push((kind.group, kind.version));
            }
        }
        groups
    }

    fn resource_list(&self, group: &str, version: &str) -> Option<Value> {
        let state = self.lock();
        let kinds: Vec<&Kind> = KINDS
            .iter()
            .filter(|k| k.group == group && k.version == version && state.served(k))
            .collect();
        if kinds.is_empty() {
            return None;
        }
        let mut resources = Vec::new();
        for kind in kinds {
            resources.push(json!({
                "name": kind.plural, "singularName": kind.kind.to_lowercase(), "namespaced": kind.namespaced,
                "kind": kind.kind,
                "verbs": ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"],
            }));
            if kind.status {
                resources.push(json!({
                    "name": format!("{}/status", kind.plural), "singularName": "", "namespaced": kind.namespaced,
                    "kind": kind.kind, "verbs": ["get", "patch", "update"],
                }));
            }
        }
        let group_version = if group.is_empty() {
            version.to_owned()
        } else {
            format!("{group}/{version}")
        };
        Some(
            json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version, "resources": resources}),
        )
    }
}

fn group_document(group: &str, version: &str) -> Value {
    let version = json!({"groupVersion": format!("{group}/{version}"), "version": version});
    json!({"kind": "APIGroup", "apiVersion": "v1", "name": group, "versions": [version], "preferredVersion": version})
}
