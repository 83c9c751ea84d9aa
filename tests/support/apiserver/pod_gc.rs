//! The pod garbage collector of kube-controller-manager, the part of it that removes orphaned pods: pods bound
//! (`spec.nodeName`) to a node that does not exist. A test that binds its pods to a node nobody registered
//! loses them on a real cluster at the collector's next pass after the quarantine; this model makes the test
//! server do the same, sooner and in every run, so the mistake fails in CI instead of once in a while on a
//! real cluster.
//!
//! What it follows (`pkg/controller/podgc`, `gcOrphaned`, Kubernetes 1.27 and later):
//! - A pass every `period` (`gcCheckPeriod`, 20 s). Each pass puts the name of every node that some pod is
//!   bound to and that does not exist into quarantine (a delaying queue, `quarantineTime`, 40 s): an entry
//!   already waiting keeps the earlier of its two due times.
//! - The same pass takes the entries whose quarantine is over out of the queue; a node that still does not
//!   exist is gone, one that exists now is forgotten.
//! - Every pod bound to a gone node, terminating or not, is first marked `Failed` with the condition
//!   `DisruptionTarget` (reason `DeletionByPodGC`, message `PodGC: node no longer exists`) unless it has
//!   already finished, then deleted with a grace period of 0 (its finalizers, if any, still hold it).
//!
//! Left out: the collector's other passes (terminated pods over `--terminated-pod-gc-threshold`, terminating
//! pods on out-of-service nodes, unscheduled terminating pods; the test server deletes those at once), its
//! informers' lag (a pass sees the store as it is) and its metrics. Node objects are served as stored: nothing
//! here reads their conditions or leases, and there is no node lifecycle controller.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::time::Instant;

use super::Shared;
use super::kinds::{self, Kind, Special, kind_of};
use super::lifecycle::{DeleteOptions, delete};
use super::meta::{name_of, namespace_of, now, pod_finished};
use super::selectors::Filter;
use super::store::State;
use super::write::update;

/// Where the test server's pod garbage collector is configured from: `off`, or its quarantine in seconds.
pub const POD_GC_ENV: &str = "REDLOCK_E2E_POD_GC_QUARANTINE";

/// How often an idle (turned off) collector looks whether it was turned on.
const IDLE_CHECK: Duration = Duration::from_millis(100);

/// The collector's timing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PodGc {
    /// Between passes.
    pub period: Duration,
    /// How long a missing node is given to appear before its pods are deleted.
    pub quarantine: Duration,
}

impl PodGc {
    /// kube-controller-manager's own timing: a pass every 20 s, 40 s of quarantine (an orphaned pod goes 40 to
    /// 60 s after the first pass that sees it).
    pub const REAL: PodGc = PodGc {
        period: Duration::from_secs(20),
        quarantine: Duration::from_secs(40),
    };

    /// The test server's default: the same steps 80 times sooner (a pass every 250 ms, 500 ms of quarantine),
    /// so that a pod bound to a node nobody registered is gone within about a second, well inside any test
    /// that uses it.
    pub const QUICK: PodGc = PodGc {
        period: Duration::from_millis(250),
        quarantine: Duration::from_millis(500),
    };

    /// `quarantine`, with a pass every half of it (the real ratio).
    pub fn with_quarantine(quarantine: Duration) -> Self {
        PodGc {
            period: (quarantine / 2).max(Duration::from_millis(1)),
            quarantine,
        }
    }

    /// From `REDLOCK_E2E_POD_GC_QUARANTINE`: `off` turns the collector off, a number of seconds sets its
    /// quarantine; [`PodGc::QUICK`] when unset or empty.
    ///
    /// # Panics
    /// On any other value: a typo must not silently run the tests without the collector.
    pub fn from_env() -> Option<Self> {
        let value = std::env::var(POD_GC_ENV).unwrap_or_default();
        match value.trim() {
            "" => Some(Self::QUICK),
            "off" => None,
            seconds => {
                let quarantine = seconds
                    .parse::<f64>()
                    .ok()
                    .and_then(|seconds| Duration::try_from_secs_f64(seconds).ok())
                    .unwrap_or_else(|| {
                        panic!("{POD_GC_ENV} must be `off` or a number of seconds, not {seconds:?}")
                    });
                Some(Self::with_quarantine(quarantine))
            }
        }
    }
}

/// Nodes some pod is bound to that did not exist, and when their quarantine ends: the collector's delaying
/// queue. It lives as long as one period of listening, as the queue of a controller-manager lives as long as
/// its process.
#[derive(Default)]
struct Quarantine {
    due: HashMap<String, Instant>,
}

/// Runs the collector's passes while the server listens (while it is down, the controller-manager's requests
/// fail too: no pass).
pub(super) async fn run(shared: Arc<Shared>) {
    let mut quarantine = Quarantine::default();
    loop {
        let Some(timing) = shared.pod_gc() else {
            quarantine.due.clear();
            tokio::time::sleep(IDLE_CHECK).await;
            continue;
        };
        tokio::time::sleep(timing.period).await;
        if shared.is_down() {
            continue;
        }
        // Under the store's lock, which a change of timing takes too: once it is turned off, no pass starts.
        let mut state = shared.lock();
        let Some(timing) = shared.pod_gc() else {
            continue;
        };
        quarantine.pass(&mut state, timing.quarantine, Instant::now());
        shared.pod_gc_passes.fetch_add(1, Ordering::SeqCst);
    }
}

fn nodes_kind() -> &'static Kind {
    kinds::find("", "v1", "nodes").expect("nodes are in the table")
}

fn node_of(pod: &Value) -> Option<&str> {
    pod.pointer("/spec/nodeName")
        .and_then(Value::as_str)
        .filter(|node| !node.is_empty())
}

impl Quarantine {
    /// One pass of `gcOrphaned` at `now`.
    fn pass(&mut self, state: &mut State, quarantine: Duration, now: Instant) {
        let everything = Filter::default();
        let existing: HashSet<String> = state
            .select(nodes_kind(), None, &everything)
            .iter()
            .map(|node| name_of(node).to_owned())
            .collect();
        let pods = kind_of(Special::Pod);
        let bound = state.select(pods, None, &everything);
        for pod in &bound {
            if let Some(node) = node_of(pod).filter(|node| !existing.contains(*node)) {
                let due = now + quarantine;
                self.due
                    .entry(node.to_owned())
                    .and_modify(|current| *current = (*current).min(due))
                    .or_insert(due);
            }
        }
        let (ready, waiting): (HashMap<_, _>, HashMap<_, _>) = std::mem::take(&mut self.due)
            .into_iter()
            .partition(|(_, due)| *due <= now);
        self.due = waiting;
        // Still missing at the end of its quarantine (the controller asks the server itself, not its cache).
        let gone: HashSet<String> = ready
            .into_keys()
            .filter(|node| state.get(nodes_kind(), "", node).is_none())
            .collect();
        for pod in bound
            .iter()
            .filter(|pod| node_of(pod).is_some_and(|node| gone.contains(node)))
        {
            delete_orphan(state, pods, namespace_of(pod), name_of(pod));
        }
    }
}

/// `markFailedAndDeletePodWithCondition`: Failed with the collector's condition, then a delete with no grace
/// period. A pod that changed or went meanwhile is taken as it is now.
fn delete_orphan(state: &mut State, pods: &'static Kind, namespace: &str, name: &str) {
    let Some(current) = state.get(pods, namespace, name) else {
        return;
    };
    if !pod_finished(&current) {
        let mut failed = (*current).clone();
        mark_failed(&mut failed);
        // A status write, as the collector's patch of pods/status: nothing but status changes.
        if update(state, pods, true, &current, failed).is_err() {
            return;
        }
    }
    let _ = delete(state, pods, namespace, name, &DeleteOptions::immediate());
}

fn mark_failed(pod: &mut Value) {
    let condition = json!({
        "type": "DisruptionTarget", "status": "True", "reason": "DeletionByPodGC",
        "message": "PodGC: node no longer exists", "lastTransitionTime": now(),
    });
    let status = pod
        .as_object_mut()
        .map(|pod| pod.entry("status").or_insert_with(|| json!({})));
    let Some(Value::Object(status)) = status else {
        return;
    };
    status.insert("phase".into(), "Failed".into());
    let conditions = status.entry("conditions").or_insert_with(|| json!([]));
    if !conditions.is_array() {
        *conditions = json!([]);
    }
    if let Value::Array(conditions) = conditions {
        conditions.retain(|c| c.get("type").and_then(Value::as_str) != Some("DisruptionTarget"));
        conditions.push(condition);
    }
}
