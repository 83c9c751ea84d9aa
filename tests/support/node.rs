//! A node with no kubelet behind it, for tests that bind pods to a node by name (`spec.nodeName`) and play the
//! kubelet themselves (status through the status subresource).
//!
//! On a real cluster such a node has to exist and look alive: the pod garbage collector force-deletes pods bound
//! to a node that does not exist (after 40 s of quarantine, at its next pass), and the node lifecycle controller
//! marks a node whose kubelet stops reporting `Unknown`, taints it `unreachable:NoExecute` and so has its pods
//! evicted. A [`FakeNode`] is registered before any pod is bound to it and kept Ready the way a kubelet keeps
//! its node: its `Ready` condition posted and its Lease in `kube-node-lease` renewed every 10 s (the kubelet's
//! lease lasts 40 s; the controller waits 40 to 50 s without news before it acts).
//!
//! Nothing runs there, and nothing is placed there: it is tainted `NoSchedule` ([`TAINT`]) and has room for no
//! pod, so the scheduler (a DaemonSet's pods included) never binds a pod to it; only pods bound by name land
//! there. Every fake node carries the label [`LABEL`]: a run that crashed leaves its node behind with a Lease
//! nobody renews, and [`remove_stale`] removes those.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, Time};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, Config, ResourceExt};
use serde_json::json;
use tokio::task::JoinHandle;

/// Marks the nodes the tests register.
pub const LABEL: &str = "redlock.io/e2e-fake-node";
/// Keeps the scheduler from placing pods there: only pods bound by name run "there".
pub const TAINT: &str = "redlock.io/e2e-no-kubelet";
/// Where kubelets keep their leases.
const LEASE_NAMESPACE: &str = "kube-node-lease";
/// The kubelet's defaults: a 40 s lease renewed every quarter of it, and the node status posted as often.
const LEASE_SECONDS: i32 = 40;
const HEARTBEAT: Duration = Duration::from_secs(10);
/// How long removing a node may take when the test ends.
const REMOVAL_PATIENCE: Duration = Duration::from_secs(15);

/// A registered node, kept Ready until dropped; removed then, when asked ([`FakeNode::removed_on_drop`]).
pub struct FakeNode {
    name: String,
    heartbeat: JoinHandle<()>,
    removal: Option<Config>,
}

impl FakeNode {
    /// Registers the node `name` (taking over a node of that name left by an earlier registration), Ready,
    /// with its Lease, and keeps it so from a task of the current runtime until dropped.
    pub async fn register(client: Client, name: &str) -> kube::Result<Self> {
        let nodes: Api<Node> = Api::all(client.clone());
        let created = nodes.create(&PostParams::default(), &node_object(name)).await;
        let node = match created {
            Err(kube::Error::Api(status)) if status.code == 409 => {
                post_status(&nodes, name).await?;
                nodes.get(name).await?
            }
            other => other?,
        };
        let leases: Api<Lease> = Api::namespaced(client.clone(), LEASE_NAMESPACE);
        renew_lease(&leases, &node).await?;
        let heartbeat = tokio::spawn(keep_ready(nodes, leases, node));
        Ok(FakeNode {
            name: name.to_owned(),
            heartbeat,
            removal: None,
        })
    }

    /// Deletes the node and its Lease when dropped, with a client made from `config` on a thread of its own:
    /// that works whatever the test's runtime is doing, a panic unwinding through it included. Blocks the
    /// dropping thread until done (at most 15 s).
    pub fn removed_on_drop(mut self, config: Config) -> Self {
        self.removal = Some(config);
        self
    }

    pub fn name(&self) -> &str {
        &self.name
    }
}

impl Drop for FakeNode {
    fn drop(&mut self) {
        self.heartbeat.abort();
        let Some(config) = self.removal.take() else {
            return;
        };
        let name = self.name.clone();
        let removal = std::thread::spawn(move || {
            let Ok(runtime) = tokio::runtime::Builder::new_current_thread().enable_all().build() else {
                return;
            };
            runtime.block_on(async {
                if let Ok(client) = Client::try_from(config) {
                    let _ = tokio::time::timeout(REMOVAL_PATIENCE, remove(&client, &name)).await;
                }
            });
        });
        let _ = removal.join();
    }
}

fn node_object(name: &str) -> Node {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": { "name": name, "labels": { LABEL: "true", "kubernetes.io/hostname": name } },
        "spec": { "taints": [{ "key": TAINT, "value": "true", "effect": "NoSchedule" }] },
        "status": status_of(Timestamp::now()),
    }))
    .expect("a node object")
}

/// Ready since `since`, as of now, with room for no pod.
fn status_of(since: Timestamp) -> serde_json::Value {
    json!({
        "capacity": { "pods": "0" },
        "allocatable": { "pods": "0" },
        "conditions": [{
            "type": "Ready", "status": "True", "reason": "KubeletReady",
            "message": "a node of the end-to-end tests: no kubelet, the tests play it for the pods bound here",
            "lastHeartbeatTime": Time(Timestamp::now()), "lastTransitionTime": Time(since),
        }],
    })
}

async fn post_status(nodes: &Api<Node>, name: &str) -> kube::Result<Node> {
    let status = json!({ "status": status_of(Timestamp::now()) });
    nodes
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
}

/// Renews the node's Lease, or creates it (owned by the node, so that the garbage collector removes it with
/// the node), as the kubelet's lease controller does.
async fn renew_lease(leases: &Api<Lease>, node: &Node) -> kube::Result<()> {
    let name = node.name_any();
    let renew = json!({ "spec": { "renewTime": MicroTime(Timestamp::now()) } });
    match leases
        .patch(&name, &PatchParams::default(), &Patch::Merge(&renew))
        .await
    {
        Err(kube::Error::Api(status)) if status.code == 404 => {}
        other => return other.map(drop),
    }
    let lease: Lease = serde_json::from_value(json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": { "name": name, "namespace": LEASE_NAMESPACE, "ownerReferences": [{
            "apiVersion": "v1", "kind": "Node", "name": name, "uid": node.uid().unwrap_or_default(),
        }] },
        "spec": { "holderIdentity": name, "leaseDurationSeconds": LEASE_SECONDS,
                  "renewTime": MicroTime(Timestamp::now()) },
    }))
    .expect("a lease object");
    leases.create(&PostParams::default(), &lease).await.map(drop)
}

/// The kubelet's heartbeats, until the task is aborted or the node is gone (then there is nothing to keep: a
/// node is never registered again from here, so a removal cannot be undone by a late heartbeat). A failed
/// heartbeat (the API down on purpose in a test) is tried again at the next one.
async fn keep_ready(nodes: Api<Node>, leases: Api<Lease>, node: Node) {
    let name = node.name_any();
    let since = node
        .status
        .as_ref()
        .and_then(|status| status.conditions.as_ref())
        .and_then(|conditions| conditions.iter().find(|c| c.type_ == "Ready"))
        .and_then(|ready| ready.last_transition_time.as_ref())
        .map_or_else(Timestamp::now, |time| time.0);
    loop {
        tokio::time::sleep(HEARTBEAT).await;
        let status = json!({ "status": status_of(since) });
        match nodes
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
            .await
        {
            Err(kube::Error::Api(status)) if status.code == 404 => return,
            Err(_) => continue,
            Ok(_) => {}
        }
        let _ = renew_lease(&leases, &node).await;
    }
}

async fn remove(client: &Client, name: &str) {
    let leases: Api<Lease> = Api::namespaced(client.clone(), LEASE_NAMESPACE);
    let nodes: Api<Node> = Api::all(client.clone());
    let _ = leases.delete(name, &DeleteParams::default()).await;
    let _ = nodes.delete(name, &DeleteParams::default()).await;
}

/// Removes the fake nodes (of any run) whose Lease nobody has renewed for `quiet`: their run ended without
/// removing them. A live run renews every 10 s, so a few minutes of silence cannot be one.
pub async fn remove_stale(client: &Client, quiet: Duration) {
    let nodes: Api<Node> = Api::all(client.clone());
    let leases: Api<Lease> = Api::namespaced(client.clone(), LEASE_NAMESPACE);
    let Ok(list) = nodes.list(&ListParams::default().labels(LABEL)).await else {
        return;
    };
    let quiet = SignedDuration::try_from(quiet).unwrap_or(SignedDuration::MAX);
    let before = Timestamp::now().checked_sub(quiet).unwrap_or(Timestamp::MIN);
    for node in list.items {
        let name = node.name_any();
        let created_before = node
            .metadata
            .creation_timestamp
            .as_ref()
            .is_some_and(|created| created.0 < before);
        let Ok(lease) = leases.get_opt(&name).await else {
            continue;
        };
        let renewed = lease
            .and_then(|lease| lease.spec?.renew_time)
            .map(|renewed| renewed.0);
        if created_before && renewed.is_none_or(|renewed| renewed < before) {
            remove(client, &name).await;
        }
    }
}
