//! Leader-election locks and their pods. The harness plays the kubelet (pods bound to a node no kubelet
//! serves, status set through the status subresource, as `tests/leader.rs` does) and each pod's process.
//!
//! A pod's process believes it leads as the `elect` helper would, from what it sees of its own pod: from the
//! moment it sees the leader label on its pod with a fencing token and a `valid-until` annotation (and, of a
//! semaphore, the permit it holds: `redlock.io/permit`), until it sees the label gone (or another token or
//! permit), or until `valid-until` minus its fence margin, whichever comes first —
//! whether or not its watch delivers anything. The pods of one cluster are followed through one watch (one
//! stream, delivered in the API server's order), through a proxy the nemesis cuts with the cluster's outages.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use redlock_operator::api::DistributedLock;
use redlock_operator::cli::term::{Term, fence_instant};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::cluster::Cluster;
use super::follow::{Kill, Seen, follow};
use super::permits::permit_resource;
use super::recorder::Recorder;

pub const LEADER_LABEL: &str = "redlock.io/leader";
const TOKEN_ANNOTATION: &str = "redlock.io/fencing-token";
const VALID_UNTIL_ANNOTATION: &str = "redlock.io/valid-until";
/// The permit a leader of a semaphore holds (none on a plain lock's leader: permit 0).
const PERMIT_ANNOTATION: &str = "redlock.io/permit";
/// Which key a pod's lock takes (the harness's own annotation, so that a pod's process knows what it protects).
const KEY_ANNOTATION: &str = "safety.redlock.io/key";
const ROLE_LABEL: &str = "safety.redlock.io/role";

/// How long before the `valid-until` shown a pod's process stops acting (the `elect` helper's `--fence-margin`).
pub const POD_FENCE_MARGIN: Duration = Duration::from_millis(500);

/// The pods of one leader-election lock in one cluster, as the harness (their ReplicaSet and kubelet) keeps them.
pub struct LeaderSet {
    pub lock: String,
    pub key: String,
    resource_key: String,
    quorum: String,
    /// The lock's `spec.permits`: up to this many pods lead at once, each holding a permit.
    permits: usize,
    pods: Vec<String>,
    created: usize,
}

impl LeaderSet {
    /// Creates the lock of `permits` permits (on the quorum's shared key `resource_key`) and `pods` ready pods.
    pub async fn create(
        cluster: &Cluster,
        quorum: &str,
        (lock, resource_key): (&str, &str),
        pods: usize,
        permits: usize,
    ) -> Self {
        let mut set = Self {
            lock: lock.to_owned(),
            key: format!("shared:{resource_key}"),
            resource_key: resource_key.to_owned(),
            quorum: quorum.to_owned(),
            permits,
            pods: Vec::new(),
            created: 0,
        };
        for _ in 0..pods {
            set.add_pod(cluster).await;
        }
        set.create_lock(cluster).await;
        set
    }

    pub async fn create_lock(&self, cluster: &Cluster) {
        let object = serde_json::json!({
            "apiVersion": "redlock.io/v1beta1", "kind": "DistributedLock",
            "metadata": { "name": self.lock },
            "spec": { "quorum": self.quorum, "ttl": super::TTL, "resourceKey": self.resource_key,
                      "permits": self.permits, "holder": { "leaderElection": { "selector": { "matchLabels": { "app": self.lock } } } } }
        });
        let lock: DistributedLock = serde_json::from_value(object).expect("lock");
        let _ = cluster.locks().create(&PostParams::default(), &lock).await;
    }

    /// Deletes the lock (its finalizer releases the key), waits until it is gone, and creates it again. Gives up
    /// waiting after a while (an operator cut off cannot remove the finalizer).
    pub async fn recreate(&mut self, cluster: &Cluster) {
        self.delete(cluster).await;
        self.create_lock(cluster).await;
    }

    /// Deletes the lock and waits until it is gone (at most 20 s).
    pub async fn delete(&self, cluster: &Cluster) {
        let _ = cluster.locks().delete(&self.lock, &DeleteParams::default()).await;
        let deadline = Instant::now() + Duration::from_secs(20);
        while cluster.locks().get_opt(&self.lock).await.ok().flatten().is_some() && Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// A new pod (as a ReplicaSet replaces one), running and ready.
    pub async fn add_pod(&mut self, cluster: &Cluster) {
        let name = format!("{}-{}", self.lock, self.created);
        self.created += 1;
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": { "name": name, "labels": { "app": self.lock, ROLE_LABEL: "leader" },
                          "annotations": { KEY_ANNOTATION: self.key } },
            "spec": {
                "nodeName": cluster.pod_node(),
                // The harness's kubelet (`replace`) ends a deletion after a second; the test API server's own
                // sweep would end it when the grace period is over, without stopping the process.
                "terminationGracePeriodSeconds": 30,
                "containers": [{ "name": "app", "image": "registry.invalid/app:1" }]
            }
        }))
        .expect("pod");
        pods(cluster)
            .create(&PostParams::default(), &pod)
            .await
            .expect("create pod");
        set_ready(cluster, &name, true).await;
        self.pods.push(name);
    }

    /// The pods carrying the leader label now (a direct list).
    pub async fn labelled(&self, cluster: &Cluster) -> Vec<String> {
        pods(cluster)
            .list(&ListParams::default().labels(&format!("app={},{LEADER_LABEL}", self.lock)))
            .await
            .map(|list| list.items.iter().map(ResourceExt::name_any).collect())
            .unwrap_or_default()
    }

    /// Deletes `pod` and creates its replacement. `Removal::Drain`: as a node drain does (graceful; the pod's
    /// process sees it through its watch, if that delivers), and after a second the harness's kubelet kills the
    /// process, reports the pod `Failed` and finalizes the deletion, as a real one does. `Removal::Force`: the
    /// same deletion, and after a second a force delete (`--grace-period=0`) while the process runs on: nothing
    /// stops it but its watch showing the pod gone, or its fence time.
    pub async fn replace(&mut self, cluster: &Cluster, kubelet: &Kubelet, pod: &str, removal: Removal) {
        self.pods.retain(|name| name != pod);
        let _ = pods(cluster).delete(pod, &DeleteParams::default()).await;
        let api = pods(cluster);
        let name = pod.to_owned();
        let kubelet = kubelet.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(1)).await;
            if removal == Removal::Drain {
                let (done, killed) = tokio::sync::oneshot::channel();
                if kubelet.send((name.clone(), done)).is_ok() {
                    let _ = killed.await;
                }
                let status = serde_json::json!({ "status": { "phase": "Failed" } });
                let _ = api
                    .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
                    .await;
            }
            let _ = api.delete(&name, &DeleteParams::default().grace_period(0)).await;
        });
        self.add_pod(cluster).await;
    }
}

/// How a leader pod is removed ([`LeaderSet::replace`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Removal {
    Drain,
    Force,
}

/// What the harness's kubelet uses to kill a leader pod's process (`follow::Kill`).
pub type Kubelet = mpsc::UnboundedSender<Kill>;

fn pods(cluster: &Cluster) -> Api<Pod> {
    Api::namespaced(cluster.client.clone(), &cluster.namespace)
}

/// Plays the kubelet: Running, and Ready or not.
pub async fn set_ready(cluster: &Cluster, pod: &str, ready: bool) {
    let status = serde_json::json!({ "status": {
        "phase": "Running",
        "conditions": [{ "type": "Ready", "status": if ready { "True" } else { "False" } }]
    }});
    let _ = pods(cluster)
        .patch_status(pod, &PatchParams::default(), &Patch::Merge(&status))
        .await;
}

/// What a pod's process sees of its own pod: leading (holding its permit of the key: that permit's resource)
/// with a token until a fence time, or not leading.
fn leading(cluster: &str, pod: &Pod, now: Instant) -> Option<Seen> {
    let labels = pod.metadata.labels.as_ref()?;
    if labels.get(LEADER_LABEL).map(String::as_str) != Some("true")
        || pod.metadata.deletion_timestamp.is_some()
    {
        return None;
    }
    let annotations = pod.metadata.annotations.as_ref()?;
    // A plain lock's leader is shown no permit: permit 0. One it cannot read, it does not lead with.
    let permit = match annotations.get(PERMIT_ANNOTATION) {
        None => None,
        Some(permit) => Some(permit.parse().ok()?),
    };
    let term = Term {
        permit,
        token: annotations.get(TOKEN_ANNOTATION)?.parse().ok()?,
        valid_until: annotations.get(VALID_UNTIL_ANNOTATION)?.parse().ok()?,
    };
    Some(Seen {
        key: permit_resource(annotations.get(KEY_ANNOTATION)?, permit.unwrap_or(0)),
        holder: format!("{cluster}/{}", pod.name_any()),
        token: term.token,
        fence_at: fence_instant(&term, POD_FENCE_MARGIN, now, Timestamp::now()),
        evidence: format!(
            "leader pod saw permit {} token {} valid until {}",
            permit.unwrap_or(0),
            term.token,
            term.valid_until
        ),
    })
}

/// The processes of every leader pod of `cluster`, through `client` (cut with the cluster's outages), until
/// `stop`; their beliefs go to `recorder`, their acts to its protected resource; `kills`: the harness's kubelet.
pub async fn follow_pods(
    cluster: String,
    client: Client,
    namespace: String,
    (recorder, kills): (Arc<Recorder>, mpsc::UnboundedReceiver<Kill>),
    stop: CancellationToken,
) {
    let api: Api<Pod> = Api::namespaced(client, &namespace);
    let config = watcher::Config::default().labels(&format!("{ROLE_LABEL}=leader"));
    follow(
        api,
        config,
        move |pod, now| leading(&cluster, pod, now),
        (recorder, Some(kills)),
        stop,
    )
    .await;
}
