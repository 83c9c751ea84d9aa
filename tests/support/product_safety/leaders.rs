//! Leader-election locks and their pods. The harness plays the kubelet (pods bound to a node no kubelet
//! serves, status set through the status subresource, as `tests/leader.rs` does) and each pod's process.
//!
//! A pod's process believes it leads as the `elect` helper would, from what it sees of its own pod: from the
//! moment it sees the leader label on its pod with a fencing token and a `valid-until` annotation, until it sees
//! the label gone (or another token), or until `valid-until` minus its fence margin, whichever comes first —
//! whether or not its watch delivers anything. The pods of one cluster are followed through one watch (one
//! stream, delivered in the API server's order), through a proxy the nemesis cuts with the cluster's outages.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use redlock_operator::cli::elect::{Term, fence_instant};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::cluster::Cluster;
use super::recorder::{ACT_INTERVAL, Belief, Recorder};

pub const LEADER_LABEL: &str = "redlock.io/leader";
const TOKEN_ANNOTATION: &str = "redlock.io/fencing-token";
const VALID_UNTIL_ANNOTATION: &str = "redlock.io/valid-until";
/// Which key a pod's lock takes (the harness's own annotation, so that a pod's process knows what it protects).
const KEY_ANNOTATION: &str = "safety.redlock.io/key";
const ROLE_LABEL: &str = "safety.redlock.io/role";

/// How long before the `valid-until` shown a pod's process stops acting (the `elect` helper's `--fence-margin`).
pub const POD_FENCE_MARGIN: Duration = Duration::from_millis(500);

/// The pods of one leader-election lock in one cluster, as the harness (their ReplicaSet and kubelet) keeps them.
pub struct LeaderSet {
    pub lock: String,
    pub key: String,
    pods: Vec<String>,
    created: usize,
}

impl LeaderSet {
    /// Creates the lock (`resourceKey` = its name, on the quorum's shared keys) and `pods` ready pods.
    pub async fn create(cluster: &Cluster, quorum: &str, lock: &str, ttl: &str, pods: usize) -> Self {
        let mut set = Self {
            lock: lock.to_owned(),
            key: format!("shared:{lock}"),
            pods: Vec::new(),
            created: 0,
        };
        for _ in 0..pods {
            set.add_pod(cluster).await;
        }
        let object = serde_json::json!({
            "apiVersion": "redlock.io/v1alpha1", "kind": "DistributedLock",
            "metadata": { "name": lock },
            "spec": { "quorum": quorum, "ttl": ttl, "resourceKey": lock,
                      "holder": { "leaderElection": { "selector": { "matchLabels": { "app": lock } } } } }
        });
        cluster
            .locks()
            .create(
                &PostParams::default(),
                &serde_json::from_value(object).expect("lock"),
            )
            .await
            .expect("create the leader lock");
        set
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
                "terminationGracePeriodSeconds": 1,
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

    /// Deletes `pod` as a node drain would (graceful, then gone after its grace period, which the harness's
    /// kubelet confirms) and creates its replacement.
    pub async fn replace(&mut self, cluster: &Cluster, pod: &str) {
        self.pods.retain(|name| name != pod);
        let _ = pods(cluster).delete(pod, &DeleteParams::default()).await;
        let api = pods(cluster);
        let name = pod.to_owned();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let _ = api.delete(&name, &DeleteParams::default().grace_period(0)).await;
        });
        self.add_pod(cluster).await;
    }
}

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

/// What a pod's process sees of its own pod: leading with a token until a fence time, or not leading.
fn leading(pod: &Pod, now: Instant) -> Option<(String, Term, Instant)> {
    let labels = pod.metadata.labels.as_ref()?;
    if labels.get(LEADER_LABEL).map(String::as_str) != Some("true")
        || pod.metadata.deletion_timestamp.is_some()
    {
        return None;
    }
    let annotations = pod.metadata.annotations.as_ref()?;
    let term = Term {
        token: annotations.get(TOKEN_ANNOTATION)?.parse().ok()?,
        valid_until: annotations.get(VALID_UNTIL_ANNOTATION)?.parse().ok()?,
    };
    let fence_at = fence_instant(&term, POD_FENCE_MARGIN, now, Timestamp::now());
    Some((annotations.get(KEY_ANNOTATION)?.clone(), term, fence_at))
}

/// The processes of every leader pod of `cluster`, through `client` (cut with the cluster's outages), until
/// `stop`; their beliefs go to `recorder`, their acts to its protected resource.
pub async fn follow_pods(
    cluster: String,
    client: Client,
    namespace: String,
    recorder: Arc<Recorder>,
    stop: CancellationToken,
) {
    let api: Api<Pod> = Api::namespaced(client, &namespace);
    let config = watcher::Config::default().labels(&format!("{ROLE_LABEL}=leader"));
    let stream = watcher::watcher(api, config).default_backoff();
    let mut stream = std::pin::pin!(stream);
    let mut believing: BTreeMap<String, Belief> = BTreeMap::new();
    // The pods of a relist in progress: a pod missing from it is gone.
    let mut relisted: Option<HashSet<String>> = None;
    let mut next_act = Instant::now() + ACT_INTERVAL;
    loop {
        let next_fence = believing.values().map(|belief| belief.fence_at).min();
        let wake = next_fence.map_or(next_act, |fence| fence.min(next_act));
        tokio::select! {
            () = stop.cancelled() => break,
            () = tokio::time::sleep_until(wake) => {
                let now = Instant::now();
                let fenced: Vec<String> = believing
                    .iter()
                    .filter(|(_, belief)| belief.fence_at <= now)
                    .map(|(pod, _)| pod.clone())
                    .collect();
                for pod in fenced {
                    if let Some(belief) = believing.remove(&pod) {
                        belief.end(&recorder, now, "its fence time came");
                    }
                }
                if now >= next_act {
                    for belief in believing.values() {
                        belief.act(&recorder);
                    }
                    next_act = now + ACT_INTERVAL;
                }
            }
            event = stream.next() => {
                let now = Instant::now();
                match event {
                    Some(Ok(watcher::Event::Apply(pod) | watcher::Event::InitApply(pod))) => {
                        if let Some(seen) = relisted.as_mut() {
                            seen.insert(pod.name_any());
                        }
                        see(&cluster, &pod, &mut believing, &recorder, now);
                    }
                    Some(Ok(watcher::Event::Delete(pod))) => {
                        if let Some(belief) = believing.remove(&pod.name_any()) {
                            belief.end(&recorder, now, "its pod is gone");
                        }
                    }
                    Some(Ok(watcher::Event::Init)) => relisted = Some(HashSet::new()),
                    Some(Ok(watcher::Event::InitDone)) => {
                        let seen = relisted.take().unwrap_or_default();
                        let gone: Vec<String> = believing.keys().filter(|pod| !seen.contains(*pod)).cloned().collect();
                        for pod in gone {
                            if let Some(belief) = believing.remove(&pod) {
                                belief.end(&recorder, now, "its pod was not in a relist");
                            }
                        }
                    }
                    Some(Err(_)) => {}
                    None => break,
                }
            }
        }
    }
    let now = Instant::now();
    for (_, belief) in std::mem::take(&mut believing) {
        belief.end(&recorder, now, "the run ended");
    }
}

/// One pod as its process sees it now: a belief starts, goes on (a later fence time), or ends.
fn see(
    cluster: &str,
    pod: &Pod,
    believing: &mut BTreeMap<String, Belief>,
    recorder: &Recorder,
    now: Instant,
) {
    let name = pod.name_any();
    let view = leading(pod, now).filter(|(_, _, fence_at)| *fence_at > now);
    match (believing.remove(&name), view) {
        (Some(mut belief), Some((_, term, fence_at))) if term.token == belief.token => {
            belief.fence_at = fence_at;
            believing.insert(name, belief);
        }
        (previous, view) => {
            if let Some(belief) = previous {
                let why = if view.is_some() {
                    "it saw another token"
                } else {
                    "it saw its label gone"
                };
                belief.end(recorder, now, why);
            }
            if let Some((key, term, fence_at)) = view {
                let belief = Belief {
                    key,
                    holder: format!("{cluster}/{name}"),
                    token: term.token,
                    start: now,
                    fence_at,
                    evidence: format!(
                        "leader pod saw token {} valid until {}",
                        term.token, term.valid_until
                    ),
                };
                belief.act(recorder);
                believing.insert(name, belief);
            }
        }
    }
}
