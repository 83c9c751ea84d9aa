//! What the end-to-end tests share: a Kubernetes API (the in-process test server, or a real cluster named by
//! `REDLOCK_E2E_KUBECONFIG`), real Redis masters, and the real operator (`controller::run::start`) or binary.
#![allow(dead_code)]

mod admission;
#[allow(unused_imports)] // only the binaries that meet objects older than a rule use it
pub use admission::{create_admitted_before_rules, create_admitted_before_rules_of, invalid, rule_wording};
mod operators;
#[allow(unused_imports)] // a bench includes this module and starts no operator
pub use operators::{
    installation_secret, operator, operator_of_installation, operator_reading_secrets_in,
    operator_reporting_to, operator_scoped, operator_with_client,
};

use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, Secret};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config, ResourceExt};
use redlock_operator::api::{DistributedLock, RedisQuorum};
use redlock_operator::controller::installation_secret::InstallationSecret;
use redlock_operator::controller::replica_lease::LeaseTiming;
pub use redlock_operator::controller::run::LockScope;
use redlock_operator::controller::run::{ElectionOptions, RunOptions, Running, start};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::support::apiserver::{OPERATOR_HEADER, TestApiServer};
use crate::support::fault_proxy::FaultProxy;
use crate::support::node::{self, FakeNode};
use crate::support::redis_server::raw_get;

/// Long enough for anything the operator does in a test, short enough that a hang fails the test quickly.
pub const PATIENCE: Duration = Duration::from_secs(30);

/// A fake node whose Lease went unrenewed this long was left by a run that crashed.
const STALE_NODE: Duration = Duration::from_secs(300);

/// On a real cluster, the label that marks a RedisQuorum (cluster-scoped) as one test's: its value is the test's
/// namespace, and the test's operators look only at the quorums it marks.
pub const E2E_QUORUM_LABEL: &str = "redlock-e2e/test";

/// One Kubernetes API to run against, with a namespace of the test's own.
pub struct Env {
    pub client: Client,
    /// What `client` was made from: a second client (through a fault proxy, say) is made from it.
    config: Config,
    pub namespace: String,
    pub server: Option<TestApiServer>,
    /// A kubeconfig file for a subprocess (the binary) talking to the same API.
    pub kubeconfig: PathBuf,
    /// The node this test's pods are bound to ([`Env::node_name`]): registered and kept Ready, so that neither
    /// the pod garbage collector nor the node lifecycle controller takes the pods away mid-test; on a real
    /// cluster removed when the Env is dropped, a failed test's included.
    node: FakeNode,
    _dir: tempfile::TempDir,
    /// The namespaces this test made (its own and [`Env::made_namespace`]'s): on a real cluster its operators
    /// look only there, so that they never claim a lock of anyone else's on a cluster shared with other work.
    namespaces: std::sync::Mutex<Vec<String>>,
    /// On a real cluster, this test's turn: every operator watches every namespace, so the tests of one binary
    /// take turns instead of reconciling each other's locks.
    _turn: Option<tokio::sync::OwnedMutexGuard<()>>,
}

static REAL_CLUSTER_TURN: std::sync::LazyLock<std::sync::Arc<tokio::sync::Mutex<()>>> =
    std::sync::LazyLock::new(Default::default);

fn suffix() -> String {
    let mut bytes = [0u8; 4];
    getrandom::fill(&mut bytes).expect("random");
    hex::encode(bytes)
}

impl Env {
    /// The real cluster when `REDLOCK_E2E_KUBECONFIG` is set, the in-process test API server otherwise (see
    /// [`Env::test_server`]).
    pub async fn new() -> Self {
        match std::env::var_os("REDLOCK_E2E_KUBECONFIG") {
            Some(path) => Self::real_cluster(Path::new(&path)).await,
            None => Self::test_server().await,
        }
    }

    /// Always the in-process test API server: a second, independent "cluster". In its realistic mode when
    /// `REDLOCK_E2E_REALISTIC=1` (seed from `REDLOCK_E2E_SEED`, printed otherwise).
    pub async fn test_server() -> Self {
        let server = TestApiServer::start_from_env().await;
        let dir = tempfile::tempdir().expect("tempdir");
        let kubeconfig = dir.path().join("kubeconfig");
        server.write_kubeconfig(&kubeconfig).expect("kubeconfig");
        let config = Config::new(server.url().parse().expect("server URL"));
        let client = Client::try_from(config.clone()).expect("client");
        let namespace = format!("e2e-{}", suffix());
        // The test server goes away with its nodes: nothing to remove.
        let node = FakeNode::register(client.clone(), &format!("{namespace}-node"))
            .await
            .expect("register the test's node");
        let env = Self {
            client,
            config,
            namespace,
            server: Some(server),
            kubeconfig,
            node,
            _dir: dir,
            namespaces: Default::default(),
            _turn: None,
        };
        env.apply_crds().await;
        env.create_namespace().await;
        env
    }

    async fn real_cluster(path: &Path) -> Self {
        let turn = REAL_CLUSTER_TURN.clone().lock_owned().await;
        let kubeconfig =
            Kubeconfig::read_from(path).expect("REDLOCK_E2E_KUBECONFIG must name a readable kubeconfig");
        let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .expect("kubeconfig");
        let client = Client::try_from(config.clone()).expect("client");
        let dir = tempfile::tempdir().expect("tempdir");
        let namespace = format!("redlock-e2e-{}", suffix());
        node::remove_stale(&client, STALE_NODE).await;
        let node = FakeNode::register(client.clone(), &format!("{namespace}-node"))
            .await
            .expect("register the test's node")
            .removed_on_drop(config.clone());
        let env = Self {
            client,
            config,
            namespace,
            server: None,
            kubeconfig: path.to_owned(),
            node,
            _dir: dir,
            namespaces: Default::default(),
            _turn: Some(turn),
        };
        env.apply_crds().await;
        env.create_namespace().await;
        env
    }

    /// A client of the same API with the same credentials whose traffic goes through a fault proxy: cutting the
    /// proxy cuts off only what uses this client (one operator replica), on the test server and on a real cluster.
    pub async fn client_behind_proxy(&self) -> (Client, FaultProxy) {
        let url = &self.config.cluster_url;
        let host = url.host().expect("API server host").to_owned();
        let https = url.scheme_str() == Some("https");
        let port = url.port_u16().unwrap_or(if https { 443 } else { 80 });
        let upstream = tokio::net::lookup_host((host.as_str(), port))
            .await
            .expect("resolve the API server")
            .next()
            .expect("an API server address");
        let proxy = FaultProxy::start(upstream).await.expect("fault proxy");
        let mut config = self.operator_config();
        let scheme = if https { "https" } else { "http" };
        config.cluster_url = format!("{scheme}://{}{}", proxy.addr(), url.path())
            .parse()
            .expect("proxied URL");
        if https {
            // The server's certificate names the API server, not the proxy on loopback.
            config.tls_server_name = Some(host);
        }
        (Client::try_from(config).expect("proxied client"), proxy)
    }

    /// The operator's own client: same API and credentials, with a header by which the test API server records
    /// what the operator asks for (for the RBAC check; a real API server ignores it).
    pub fn operator_client(&self) -> Client {
        Client::try_from(self.operator_config()).expect("operator client")
    }

    fn operator_config(&self) -> Config {
        let mut config = self.config.clone();
        config.headers.push((
            axum::http::HeaderName::from_static(OPERATOR_HEADER),
            axum::http::HeaderValue::from_static("true"),
        ));
        config
    }

    /// The node to bind this test's pods to (`spec.nodeName`), as a kubelet-less node the test plays.
    pub fn node_name(&self) -> &str {
        self.node.name()
    }

    pub fn is_test_server(&self) -> bool {
        self.server.is_some()
    }

    /// The CRDs, applied the way an installation applies them; both kinds of API serve the resources only then.
    pub async fn apply_crds(&self) {
        let api: Api<CustomResourceDefinition> = Api::all(self.client.clone());
        let params = PatchParams::apply("redlock-e2e").force();
        for crd in [
            redlock_operator::api::served_crd::<RedisQuorum>(),
            redlock_operator::api::served_crd::<DistributedLock>(),
        ] {
            api.patch(&crd.name_any(), &params, &Patch::Apply(&crd))
                .await
                .expect("apply CRD");
        }
        let crds = api.clone();
        eventually("CRDs established", || async {
            let mut established = 0;
            for name in ["redisquorums.redlock.io", "distributedlocks.redlock.io"] {
                let crd = crds.get(name).await.ok()?;
                let ok = crd
                    .status
                    .and_then(|status| status.conditions)
                    .is_some_and(|conditions| {
                        conditions
                            .iter()
                            .any(|c| c.type_ == "Established" && c.status == "True")
                    });
                established += usize::from(ok);
            }
            (established == 2).then_some(())
        })
        .await;
    }

    /// Records `name` as a namespace of this test's, for the scope of the operators it starts afterwards.
    pub fn made_namespace(&self, name: &str) {
        if let Ok(mut namespaces) = self.namespaces.lock() {
            namespaces.push(name.to_owned());
        }
    }

    /// What an operator started without a scope of its own looks at: everything on the test server, which only
    /// this test uses; this test's namespaces and quorums on a real cluster.
    pub fn default_scope(&self) -> LockScope {
        if self.is_test_server() {
            return LockScope::default();
        }
        let mut namespaces = vec![self.namespace.clone()];
        if let Ok(made) = self.namespaces.lock() {
            namespaces.extend(made.iter().cloned());
        }
        LockScope {
            namespaces,
            selector: None,
            quorum_selector: self.quorum_selector(None),
        }
    }

    /// The RedisQuorums an operator of this test looks at: on a real cluster only this test's (labelled by
    /// [`Env::create_quorum_from`]), so that tests run side by side never write each other's quorums' status;
    /// `also` narrows it further (`team=a`, say).
    pub fn quorum_selector(&self, also: Option<&str>) -> Option<String> {
        let own = (!self.is_test_server()).then(|| format!("{E2E_QUORUM_LABEL}={}", self.namespace));
        match (own, also) {
            (Some(own), Some(also)) => Some(format!("{own},{also}")),
            (own, also) => own.or(also.map(str::to_owned)),
        }
    }

    /// The flags that give the binary (`redlock-operator run`) the scope [`Env::default_scope`] gives an operator
    /// started in-process: none on the test server, this test's namespaces and quorums on a real cluster.
    pub fn scope_args(&self) -> Vec<String> {
        let scope = self.default_scope();
        let mut args = Vec::new();
        if !scope.namespaces.is_empty() {
            args.push(format!("--lock-namespaces={}", scope.namespaces.join(",")));
        }
        if let Some(selector) = scope.quorum_selector {
            args.push(format!("--quorum-selector={selector}"));
        }
        args
    }

    /// `quorum` (a RedisQuorum object) labelled as this test's on a real cluster (see [`Env::quorum_selector`]).
    pub fn own_quorum(&self, mut quorum: serde_json::Value) -> serde_json::Value {
        if !self.is_test_server() {
            quorum["metadata"]["labels"][E2E_QUORUM_LABEL] =
                serde_json::Value::String(self.namespace.clone());
        }
        quorum
    }

    async fn create_namespace(&self) {
        let api: Api<Namespace> = Api::all(self.client.clone());
        let namespace = Namespace {
            metadata: ObjectMeta {
                name: Some(self.namespace.clone()),
                ..ObjectMeta::default()
            },
            ..Namespace::default()
        };
        api.create(&PostParams::default(), &namespace)
            .await
            .expect("namespace");
    }

    /// Events in the test's namespace.
    pub fn events(&self) -> Api<Event> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    pub fn locks(&self) -> Api<DistributedLock> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    pub fn quorums(&self) -> Api<RedisQuorum> {
        Api::all(self.client.clone())
    }

    /// A unique cluster-scoped name (RedisQuorum) for this test.
    pub fn unique(&self, base: &str) -> String {
        format!("{base}-{}", self.namespace)
    }

    pub async fn create_quorum(&self, name: &str, urls: &[String], max_ttl: &str) -> RedisQuorum {
        self.create_quorum_from(serde_json::json!({
            "apiVersion": "redlock.io/v1beta1",
            "kind": "RedisQuorum",
            "metadata": { "name": name },
            "spec": { "endpoints": urls, "maxTtl": max_ttl, "nodeTimeout": "100ms" }
        }))
        .await
    }

    /// A quorum of fresh masters that vote at once (`assumeDurable`: no restart quarantine, which would last
    /// `max_ttl`), for tests whose holders need a long TTL.
    pub async fn create_durable_quorum(&self, name: &str, urls: &[String], max_ttl: &str) -> RedisQuorum {
        self.create_quorum_from(serde_json::json!({
            "apiVersion": "redlock.io/v1beta1", "kind": "RedisQuorum", "metadata": { "name": name },
            "spec": { "endpoints": urls, "maxTtl": max_ttl, "nodeTimeout": "100ms", "assumeDurable": true }
        }))
        .await
    }

    /// A quorum whose locks in every namespace share keys (`sharedKeys`): what locks sharing a key across
    /// namespaces or clusters need.
    pub async fn create_sharing_quorum(&self, name: &str, urls: &[String], max_ttl: &str) -> RedisQuorum {
        self.create_quorum_from(serde_json::json!({
            "apiVersion": "redlock.io/v1beta1",
            "kind": "RedisQuorum",
            "metadata": { "name": name },
            "spec": { "endpoints": urls, "maxTtl": max_ttl, "nodeTimeout": "100ms",
                      "sharedKeys": { "namespaces": ["*"] } }
        }))
        .await
    }

    /// Creates a RedisQuorum, labelled as this test's on a real cluster (see [`Env::own_quorum`]).
    pub async fn create_quorum_from(&self, object: serde_json::Value) -> RedisQuorum {
        let quorum: RedisQuorum = serde_json::from_value(self.own_quorum(object)).expect("quorum object");
        self.quorums()
            .create(&PostParams::default(), &quorum)
            .await
            .expect("create quorum")
    }

    pub async fn create_lock(&self, name: &str, quorum: &str, identity: &str, ttl: &str) -> DistributedLock {
        self.create_lock_from(serde_json::json!({
            "apiVersion": "redlock.io/v1beta1",
            "kind": "DistributedLock",
            "metadata": { "name": name },
            "spec": { "quorum": quorum, "ttl": ttl, "holder": { "identity": identity } }
        }))
        .await
    }

    pub async fn create_lock_from(&self, object: serde_json::Value) -> DistributedLock {
        let lock: DistributedLock = serde_json::from_value(object).expect("lock object");
        self.locks()
            .create(&PostParams::default(), &lock)
            .await
            .expect("create lock")
    }

    pub async fn create_secret(&self, name: &str, data: &[(&str, &str)]) {
        let api: Api<Secret> = Api::namespaced(self.client.clone(), &self.namespace);
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                ..ObjectMeta::default()
            },
            string_data: Some(
                data.iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
            ),
            ..Secret::default()
        };
        api.create(&PostParams::default(), &secret).await.expect("secret");
    }

    /// Removes what a test created on a real cluster (the test server goes away by itself).
    pub async fn cleanup(&self, quorums: &[&str]) {
        if self.is_test_server() {
            return;
        }
        // The operator is stopped: nobody else removes the locks' finalizers, and a namespace with a lock
        // still holding one would stay Terminating.
        if let Ok(locks) = self.locks().list(&Default::default()).await {
            let unfinalize = Patch::Merge(serde_json::json!({ "metadata": { "finalizers": null } }));
            for lock in locks.items {
                let name = lock.name_any();
                let _ = self
                    .locks()
                    .patch(&name, &PatchParams::default(), &unfinalize)
                    .await;
                let _ = self.locks().delete(&name, &DeleteParams::default()).await;
            }
        }
        let jobs: Api<k8s_openapi::api::batch::v1::Job> =
            Api::namespaced(self.client.clone(), &self.namespace);
        let _ = jobs
            .delete_collection(&DeleteParams::background(), &Default::default())
            .await;
        for quorum in quorums {
            let _ = self.quorums().delete(quorum, &DeleteParams::default()).await;
        }
        let namespaces: Api<Namespace> = Api::all(self.client.clone());
        let _ = namespaces.delete(&self.namespace, &DeleteParams::default()).await;
    }
}

/// The test's pods, which the leader tests and the report tests play the kubelet of.
pub fn pods(env: &Env) -> Api<k8s_openapi::api::core::v1::Pod> {
    Api::namespaced(env.client.clone(), &env.namespace)
}

/// A candidate pod `app: web` bound to the test's node, not yet running.
pub async fn create_pod(env: &Env, name: &str) {
    let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": { "name": name, "labels": { "app": "web" } },
        "spec": {
            "nodeName": env.node_name(),
            "terminationGracePeriodSeconds": 30,
            "containers": [{ "name": "app", "image": "registry.invalid/app:1" }]
        }
    }))
    .expect("pod");
    pods(env)
        .create(&PostParams::default(), &pod)
        .await
        .expect("create pod");
    // Creation times have a resolution of one second: keep the pods' ages distinct.
    tokio::time::sleep(Duration::from_millis(1_050)).await;
}

/// Pods `names`, created in this order (oldest first), all running and ready.
pub async fn ready_pods(env: &Env, names: &[&str]) {
    for name in names {
        create_pod(env, name).await;
        set_ready(env, name, true).await;
    }
}

/// Plays the kubelet: Running, and Ready or not.
pub async fn set_ready(env: &Env, name: &str, ready: bool) {
    let status = serde_json::json!({ "status": {
        "phase": "Running",
        "conditions": [{ "type": "Ready", "status": if ready { "True" } else { "False" } }]
    }});
    pods(env)
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .expect("pod status");
}

/// Stops an in-process operator the way SIGTERM does.
pub async fn stop(running: Running, shutdown: CancellationToken) {
    shutdown.cancel();
    tokio::time::timeout(PATIENCE, running.task)
        .await
        .expect("operator stops in time")
        .expect("operator task");
}

/// The reasons of the Events that `events` lists about the object named `name` (and of `kind`, when given).
pub async fn event_reasons(events: &Api<Event>, kind: Option<&str>, name: &str) -> Vec<String> {
    events
        .list(&ListParams::default())
        .await
        .map(|list| {
            list.items
                .into_iter()
                .filter(|event| {
                    let regarding = event.regarding.as_ref();
                    kind.is_none_or(|kind| regarding.and_then(|r| r.kind.as_deref()) == Some(kind))
                        && regarding.and_then(|r| r.name.as_deref()) == Some(name)
                })
                .filter_map(|event| event.reason)
                .collect()
        })
        .unwrap_or_default()
}

/// Polls `probe` every 20 ms until it yields a value, failing the test after [`PATIENCE`].
/// Waits until the Events regarding `name` (of `kind`, if given) include every one of `wanted` reasons, and
/// returns every reason seen. Events are published after the writes they tell of, so a test that has seen a
/// status waits for its Event rather than racing it.
pub async fn events_seen(
    events: &Api<Event>,
    kind: Option<&str>,
    name: &str,
    wanted: &[&str],
) -> Vec<String> {
    let what = format!("the Events {wanted:?} regarding {name}");
    eventually(&what, || async {
        let reasons = event_reasons(events, kind, name).await;
        wanted
            .iter()
            .all(|reason| reasons.iter().any(|seen| seen == reason))
            .then_some(reasons)
    })
    .await
}

pub async fn eventually<T, F, Fut>(what: &str, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    eventually_within(what, PATIENCE, &mut probe).await
}

pub async fn eventually_within<T, F, Fut>(what: &str, patience: Duration, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    crate::support::poll::until(patience, Duration::from_millis(20), async || probe().await)
        .await
        .unwrap_or_else(|waited| panic!("timed out waiting for {what} ({waited:?})"))
}

/// Runs `check` (which asserts) every `every` until `window` has passed, and at least twice: for what must hold
/// throughout a stretch (never two holders). The window is time, not a count of checks: where one check is slow
/// (the realistic server lists pods 1 s and Jobs 1.5 s late) a count would stretch a 2 s window to 40 s
/// without looking at anything the window does not.
pub async fn throughout<F, Fut>(window: Duration, every: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let end = Instant::now() + window;
    let mut checks = 0u32;
    loop {
        check().await;
        checks = checks.saturating_add(1);
        if checks >= 2 && Instant::now() >= end {
            return;
        }
        tokio::time::sleep(every).await;
    }
}

/// Waits until the object `name` satisfies `check`, and returns it.
pub async fn object_where<K>(api: &Api<K>, name: &str, what: &str, check: impl Fn(&K) -> bool) -> K
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    eventually(what, || {
        let check = &check;
        async move { api.get(name).await.ok().filter(|object| check(object)) }
    })
    .await
}

/// Waits until the lock's status satisfies `check`, and returns that lock.
pub async fn lock_where(
    env: &Env,
    name: &str,
    what: &str,
    check: impl Fn(&DistributedLock) -> bool,
) -> DistributedLock {
    object_where(&env.locks(), name, what, check).await
}

/// Waits until every one of `masters` masters of the quorum can vote (fresh masters are quarantined for the
/// quorum's maxTtl first).
pub async fn all_masters_voting(env: &Env, quorum: &str, masters: i32) {
    let api = env.quorums();
    eventually_within("every master out of quarantine", Duration::from_secs(90), || {
        let api = api.clone();
        async move {
            let quorum = api.get(quorum).await.ok()?;
            (quorum.status?.eligible? == masters).then_some(())
        }
    })
    .await;
}

/// The lock is still held with its first token, and nothing happened to it in between (no loss, no
/// re-acquisition): what a restart or failover must leave behind.
pub async fn assert_first_hold_kept(env: &Env, name: &str) {
    let lock = env.locks().get(name).await.expect("lock");
    let status = lock.status.expect("status");
    assert_eq!(
        (status.phase, status.fencing_token, status.transitions),
        (Some(redlock_operator::api::LockPhase::Held), Some(1), 1),
        "the hold of {name} changed"
    );
}

pub fn phase(lock: &DistributedLock) -> Option<redlock_operator::api::LockPhase> {
    lock.status.as_ref().and_then(|status| status.phase)
}

pub fn token(lock: &DistributedLock) -> Option<i64> {
    lock.status.as_ref().and_then(|status| status.fencing_token)
}

pub fn condition<'a>(
    lock_conditions: &'a [k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition],
    type_: &str,
) -> Option<&'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    lock_conditions.iter().find(|condition| condition.type_ == type_)
}

/// How many masters hold `key`, and the distinct values they hold.
pub async fn key_on(urls: &[String], key: &str) -> (usize, Vec<String>) {
    let mut values = Vec::new();
    let mut count = 0;
    for url in urls {
        if let Some(value) = raw_get(url, key).await {
            count += 1;
            if !values.contains(&value) {
                values.push(value);
            }
        }
    }
    (count, values)
}

/// Masters started by a test have just started, so they are quarantined for maxTtl; tests use a short maxTtl
/// and wait it out once, through the quorum's own status.
pub async fn quorum_available(env: &Env, name: &str) -> RedisQuorum {
    let api = env.quorums();
    eventually("the quorum to become Available", || {
        let api = api.clone();
        async move {
            let quorum = api.get(name).await.ok()?;
            let available = quorum
                .status
                .as_ref()
                .and_then(|status| condition(&status.conditions, "Available"))
                .is_some_and(|condition| condition.status == "True");
            available.then_some(quorum)
        }
    })
    .await
}

/// Reads a metric from the operator's /metrics: the sum over its labelled samples.
pub async fn metric(addr: std::net::SocketAddr, name: &str) -> Option<f64> {
    let text = http_get(addr, "/metrics").await?.1;
    let samples: Vec<f64> = text
        .lines()
        .filter(|line| line.starts_with(name) && line[name.len()..].starts_with([' ', '{']))
        .filter_map(|line| line.rsplit(' ').next()?.parse().ok())
        .collect();
    (!samples.is_empty()).then(|| samples.iter().sum())
}

/// A minimal HTTP/1.0 GET (status code and body), enough for our own endpoints.
pub async fn http_get(addr: std::net::SocketAddr, path: &str) -> Option<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").as_bytes())
        .await
        .ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await.ok()?;
    let code = response.split_whitespace().nth(1)?.parse().ok()?;
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_owned())
        .unwrap_or_default();
    Some((code, body))
}

/// A service-account token of `pod` for `audience`, bound to the pod, as the kubelet mounts one.
pub async fn pod_token(env: &Env, pod: &str, audience: &str) -> String {
    crate::support::pod_token::pod_token(&env.client, &env.namespace, pod, audience)
        .await
        .expect("a token for the pod")
}

/// Sends a report that a holder's work stopped to `url` (a lock's `status.handOverUrl`), as `elect` does: over
/// TLS to the server whose certificate has `pin` (`status.handOverCertificateSha256`), with `bearer` as the token.
/// Tries again, as `elect` does, while the answer is 429 or 503, after its `Retry-After` (for at most ten seconds). The answer's HTTP
/// status and reason.
pub async fn send_stopped_report(
    url: &str,
    pin: &str,
    bearer: Option<&str>,
    body: serde_json::Value,
) -> (u16, String) {
    let body = serde_json::to_vec(&body).expect("JSON");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let answer = redlock_operator::report_channel::client::post(url, pin, bearer, body.clone())
            .await
            .unwrap_or_else(|err| panic!("the operator did not answer the report: {err}"));
        if !matches!(answer.code, 429 | 503) || tokio::time::Instant::now() > deadline {
            return (answer.code, answer.reason_and_message().0);
        }
        let pause = answer.retry_after.unwrap_or_default();
        tokio::time::sleep(pause.max(Duration::from_millis(250))).await;
    }
}

/// A holder's helper process standing in for a pod's container: `redlock-operator <args> --namespace <the
/// test's> -- sh -c <script>`, with the test's kubeconfig and `vars` in its environment.
pub fn spawn_helper(
    env: &Env,
    args: &[&str],
    script: &str,
    vars: &[(&str, &std::ffi::OsStr)],
) -> tokio::process::Child {
    spawn_helper_logging(env, args, script, vars, std::process::Stdio::null())
}

/// [`spawn_helper`] with the helper's own log (its stderr) going to `stderr`.
pub fn spawn_helper_logging(
    env: &Env,
    args: &[&str],
    script: &str,
    vars: &[(&str, &std::ffi::OsStr)],
    stderr: std::process::Stdio,
) -> tokio::process::Child {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_redlock-operator"))
        .args(args)
        .args(["--namespace", &env.namespace, "--", "sh", "-c", script])
        .env("KUBECONFIG", &env.kubeconfig)
        .envs(vars.iter().map(|(key, value)| (*key, *value)))
        .stdout(std::process::Stdio::null())
        .stderr(stderr)
        .kill_on_drop(true)
        .spawn()
        .expect("the helper starts")
}
