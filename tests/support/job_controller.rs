//! The cluster side of Job fencing for the in-process test API server: the Job controller, the scheduler,
//! the kubelet and the garbage collector, each reduced to what a Job of one pod does. On a real cluster
//! (`REDLOCK_E2E_KUBECONFIG`) the real ones do this, and the same tests run unchanged.
//!
//! What it follows (kube-controller-manager 1.33, `parallelism` and `completions` of 1):
//! - An unsuspended, unfinished Job with no active pod gets one, made from its template and owned by it;
//!   `status.startTime` is set when it first runs and reset when it is resumed.
//! - A suspended Job's active pods are deleted (gracefully: their termination grace period applies), and
//!   `status` counts them as `terminating` until they are gone (JobPodReplacementPolicy, on by default).
//! - A Succeeded pod completes the Job (`Complete`); Failed pods past `backoffLimit` fail it (`Failed`). A
//!   `podFailurePolicy` rule `Ignore` on a container's exit code (`onExitCodes`, `In` or `NotIn`) keeps a failed
//!   pod from counting, and the Job gets a new pod (the guard's exit 76 in the README's examples); the first
//!   matching rule decides, as in the real controller.
//! - Pods are bound to a node at once, one registered and kept Ready first (`support::node`: the test server's
//!   pod garbage collector deletes pods bound to a node that does not exist, as a real one does); the kubelet
//!   runs `sleep N` for N seconds and `false` fails at once.
//!   Deleted pods go when their grace period ends (the test server's own sweep), whatever they run: the
//!   command is PID 1 in its container and ignores SIGTERM, as a real `sleep` there does.
//! - Pods whose owner Job is gone are deleted (background propagation).
//!
//! Left out: parallelism, indexed Jobs, `podFailurePolicy` actions other than `Ignore` (`FailJob`, `FailIndex`) and
//! rules on pod conditions, backoff delays, `activeDeadlineSeconds`,
//! readiness, the `job-tracking` finalizer and finished-pod counting beyond one pod.

use std::collections::HashSet;
use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use tokio::task::JoinHandle;

use super::node::FakeNode;

/// The node every pod is bound to.
pub const NODE: &str = "e2e-node";
/// Between attempts to register the node while the API does not answer.
const REGISTER_RETRY: Duration = Duration::from_millis(200);
const SYNC_PERIOD: Duration = Duration::from_millis(50);

/// Runs until dropped.
pub struct FakeJobRuntime {
    task: JoinHandle<()>,
}

impl FakeJobRuntime {
    /// Runs the Jobs of one namespace, or of all (`None`).
    pub fn start(client: Client, namespace: Option<&str>) -> Self {
        let namespace = namespace.map(str::to_owned);
        let task = tokio::spawn(async move {
            // Kept Ready as long as this task runs; its heartbeat stops when the task is aborted.
            let _node = loop {
                match FakeNode::register(client.clone(), NODE).await {
                    Ok(node) => break node,
                    Err(_) => tokio::time::sleep(REGISTER_RETRY).await,
                }
            };
            loop {
                // The API may be down on purpose in a test: try again on the next round.
                let _ = sync(&client, namespace.as_deref()).await;
                tokio::time::sleep(SYNC_PERIOD).await;
            }
        });
        Self { task }
    }
}

impl Drop for FakeJobRuntime {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn api<K>(client: &Client, namespace: Option<&str>) -> Api<K>
where
    K: kube::Resource<Scope = kube::core::NamespaceResourceScope>,
    K::DynamicType: Default,
{
    match namespace {
        Some(namespace) => Api::namespaced(client.clone(), namespace),
        None => Api::all(client.clone()),
    }
}

async fn sync(client: &Client, namespace: Option<&str>) -> kube::Result<()> {
    // Only the pods of Jobs: the tests play the kubelet of their own pods.
    let all_pods: Vec<Pod> = api::<Pod>(client, namespace)
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|pod| job_owner(pod).is_some())
        .collect();
    for pod in &all_pods {
        run_pod(&api(client, pod.namespace().as_deref()), pod).await?;
    }
    let all_jobs = api::<Job>(client, namespace)
        .list(&ListParams::default())
        .await?
        .items;
    let uids: HashSet<String> = all_jobs.iter().filter_map(|job| job.uid()).collect();
    for pod in &all_pods {
        if let Some(owner) = job_owner(pod)
            && !uids.contains(&owner)
            && pod.metadata.deletion_timestamp.is_none()
        {
            delete_pod(&api(client, pod.namespace().as_deref()), pod).await?;
        }
    }
    for job in all_jobs
        .iter()
        .filter(|job| job.metadata.deletion_timestamp.is_none())
    {
        let namespace = job.namespace();
        let jobs = api(client, namespace.as_deref());
        let pods = api(client, namespace.as_deref());
        sync_job(&jobs, &pods, job, &all_pods).await?;
    }
    Ok(())
}

fn job_owner(pod: &Pod) -> Option<String> {
    pod.owner_references()
        .iter()
        .find(|owner| owner.kind == "Job")
        .map(|owner| owner.uid.clone())
}

fn phase(pod: &Pod) -> Option<&str> {
    pod.status.as_ref().and_then(|status| status.phase.as_deref())
}

fn finished(pod: &Pod) -> bool {
    matches!(phase(pod), Some("Succeeded" | "Failed"))
}

/// The kubelet: start a pod, and end it when its command ends.
async fn run_pod(pods: &Api<Pod>, pod: &Pod) -> kube::Result<()> {
    let bound_here = pod.spec.as_ref().and_then(|spec| spec.node_name.as_deref()) == Some(NODE);
    if !bound_here || pod.metadata.deletion_timestamp.is_some() || finished(pod) {
        return Ok(());
    }
    let now = Timestamp::now();
    let status = match phase(pod) {
        Some("Running") => {
            let started = pod
                .status
                .as_ref()
                .and_then(|status| status.start_time.as_ref())
                .map_or(now, |time| time.0);
            match command(pod).as_slice() {
                [false_] if false_ == "false" => json!({ "phase": "Failed", "reason": "Error" }),
                [sleep, seconds] if sleep == "sleep" => {
                    let seconds: f64 = seconds.parse().unwrap_or(f64::INFINITY);
                    let ran = now.duration_since(started).as_secs_f64();
                    if ran < seconds {
                        return Ok(());
                    }
                    json!({ "phase": "Succeeded" })
                }
                _ => return Ok(()),
            }
        }
        _ => json!({ "phase": "Running", "startTime": now.to_string() }),
    };
    let patched = pods
        .patch_status(
            &pod.name_any(),
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": status })),
        )
        .await;
    ignore_gone(patched.map(drop))
}

fn command(pod: &Pod) -> Vec<String> {
    pod.spec
        .as_ref()
        .and_then(|spec| spec.containers.first())
        .map(|container| {
            let mut words = container.command.clone().unwrap_or_default();
            words.extend(container.args.clone().unwrap_or_default());
            words
        })
        .unwrap_or_default()
}

async fn delete_pod(pods: &Api<Pod>, pod: &Pod) -> kube::Result<()> {
    ignore_gone(
        pods.delete(&pod.name_any(), &DeleteParams::default())
            .await
            .map(drop),
    )
}

fn ignore_gone(result: kube::Result<()>) -> kube::Result<()> {
    match result {
        Err(kube::Error::Api(status)) if status.code == 404 || status.code == 409 => Ok(()),
        other => other,
    }
}

/// Whether `job` has the condition `type_` True.
pub fn has_condition(job: &Job, type_: &str) -> bool {
    job.status
        .as_ref()
        .and_then(|status| status.conditions.as_ref())
        .is_some_and(|conditions| conditions.iter().any(|c| c.type_ == type_ && c.status == "True"))
}

/// Whether `job` has finished: `Complete` or `Failed`.
pub fn job_finished(job: &Job) -> bool {
    has_condition(job, "Complete") || has_condition(job, "Failed")
}

fn condition(type_: &str, status: bool, reason: &str, now: Timestamp) -> Value {
    json!({
        "type": type_, "status": if status { "True" } else { "False" }, "reason": reason,
        "message": "", "lastProbeTime": now.to_string(), "lastTransitionTime": now.to_string(),
    })
}

/// The Job controller, for one Job.
async fn sync_job(jobs: &Api<Job>, pods: &Api<Pod>, job: &Job, all_pods: &[Pod]) -> kube::Result<()> {
    if job_finished(job) {
        return Ok(());
    }
    let uid = job.uid().unwrap_or_default();
    let owned: Vec<&Pod> = all_pods
        .iter()
        .filter(|pod| pod.namespace() == job.namespace())
        .filter(|pod| job_owner(pod).as_deref() == Some(uid.as_str()))
        .collect();
    let succeeded = owned.iter().filter(|pod| phase(pod) == Some("Succeeded")).count();
    let failed = owned
        .iter()
        .filter(|pod| phase(pod) == Some("Failed") && !ignored_by_policy(job, pod))
        .count();
    let mut terminating = owned
        .iter()
        .filter(|pod| pod.metadata.deletion_timestamp.is_some() && !finished(pod))
        .count();
    let active: Vec<&&Pod> = owned
        .iter()
        .filter(|pod| pod.metadata.deletion_timestamp.is_none() && !finished(pod))
        .collect();
    let spec = job.spec.clone().unwrap_or_default();
    let suspended = spec.suspend.unwrap_or(false);
    let backoff_limit = usize::try_from(spec.backoff_limit.unwrap_or(6)).unwrap_or(0);
    let now = Timestamp::now();
    let status = job.status.clone().unwrap_or_default();
    let was_suspended = has_condition(job, "Suspended");
    let mut start_time = status.start_time.as_ref().map(|time| time.0.to_string());
    let mut conditions: Vec<Value> = status
        .conditions
        .iter()
        .flatten()
        .filter(|c| c.type_ != "Suspended")
        .filter_map(|c| serde_json::to_value(c).ok())
        .collect();
    let mut active_count = active.len();

    let finish = if succeeded > 0 {
        Some(("Complete", "Completed"))
    } else if failed > backoff_limit {
        Some(("Failed", "BackoffLimitExceeded"))
    } else {
        None
    };
    if let Some((type_, reason)) = finish {
        for pod in &active {
            delete_pod(pods, pod).await?;
        }
        terminating += active_count;
        active_count = 0;
        conditions.push(condition(type_, true, reason, now));
    } else if suspended {
        for pod in &active {
            delete_pod(pods, pod).await?;
        }
        terminating += active_count;
        active_count = 0;
        conditions.push(condition("Suspended", true, "JobSuspended", now));
    } else {
        if was_suspended {
            conditions.push(condition("Suspended", false, "JobResumed", now));
            start_time = Some(now.to_string());
        }
        start_time.get_or_insert_with(|| now.to_string());
        if active.is_empty() {
            create_pod(pods, job).await?;
            active_count = 1;
        }
    }
    let next = json!({ "status": {
        "active": active_count, "terminating": terminating, "succeeded": succeeded, "failed": failed,
        "startTime": start_time, "conditions": conditions,
        "completionTime": (succeeded > 0).then(|| now.to_string()),
    } });
    let current = serde_json::to_value(&status).unwrap_or_default();
    if same_counts(&current, &next["status"]) {
        return Ok(());
    }
    // A replace (verb "update"), as the real controller does: tests inject faults into the operator's status
    // patches without hitting these writes.
    let mut updated = job.clone();
    updated.status = Some(serde_json::from_value(next["status"].clone()).map_err(kube::Error::SerdeError)?);
    let replaced = jobs
        .replace_status(&job.name_any(), &PostParams::default(), &updated)
        .await;
    ignore_gone(replaced.map(drop))
}

/// Whether the Job's `podFailurePolicy` ignores this failed pod: the first rule matching one of its containers'
/// exit codes says `Ignore`.
fn ignored_by_policy(job: &Job, pod: &Pod) -> bool {
    let rules = job
        .spec
        .as_ref()
        .and_then(|spec| spec.pod_failure_policy.as_ref())
        .map(|policy| policy.rules.as_slice())
        .unwrap_or_default();
    let exits: Vec<(String, i32)> = pod
        .status
        .as_ref()
        .and_then(|status| status.container_statuses.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|container| {
            let code = container.state.as_ref()?.terminated.as_ref()?.exit_code;
            (code != 0).then(|| (container.name.clone(), code))
        })
        .collect();
    let matches = |rule: &k8s_openapi::api::batch::v1::PodFailurePolicyRule| {
        let Some(on) = rule.on_exit_codes.as_ref() else {
            return false;
        };
        exits.iter().any(|(name, code)| {
            on.container_name.as_ref().is_none_or(|wanted| wanted == name)
                && match on.operator.as_str() {
                    "In" => on.values.contains(code),
                    "NotIn" => !on.values.contains(code),
                    _ => false,
                }
        })
    };
    rules
        .iter()
        .find(|rule| matches(rule))
        .is_some_and(|rule| rule.action == "Ignore")
}

/// Whether a status write would change nothing but times.
fn same_counts(current: &Value, next: &Value) -> bool {
    let count = |status: &Value, field: &str| status.get(field).and_then(Value::as_u64).unwrap_or(0);
    let kinds = |status: &Value| -> Vec<(String, String)> {
        status
            .get("conditions")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .map(|c| (c["type"].to_string(), c["status"].to_string()))
            .collect()
    };
    ["active", "terminating", "succeeded", "failed"]
        .iter()
        .all(|field| count(current, field) == count(next, field))
        && kinds(current) == kinds(next)
        && current.get("startTime").is_some() == next.get("startTime").is_some_and(|t| !t.is_null())
}

async fn create_pod(pods: &Api<Pod>, job: &Job) -> kube::Result<()> {
    let template = job
        .spec
        .as_ref()
        .map(|spec| spec.template.clone())
        .unwrap_or_default();
    let meta = template.metadata.unwrap_or_default();
    let mut spec = serde_json::to_value(template.spec.unwrap_or_default()).unwrap_or_default();
    spec["nodeName"] = json!(NODE);
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {
            "generateName": format!("{}-", job.name_any()),
            "labels": meta.labels, "annotations": meta.annotations,
            "ownerReferences": [{
                "apiVersion": "batch/v1", "kind": "Job", "name": job.name_any(),
                "uid": job.uid().unwrap_or_default(), "controller": true, "blockOwnerDeletion": true,
            }],
        },
        "spec": spec,
    }))
    .map_err(kube::Error::SerdeError)?;
    pods.create(&PostParams::default(), &pod).await.map(drop)
}
