//! Which locks a watch event wakes, and which changes of an object count at all. Pure, so the routing is tested
//! without a cluster.

use std::collections::BTreeMap;
use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::ResourceExt;
use kube::core::{Selector, SelectorExt};
use kube::runtime::reflector::ObjectRef;

use crate::api::DistributedLock;
use crate::api::holder_contract::LOCK_LABEL;
use crate::controller::keeper::LockRef;
use crate::controller::lock::policy::leader::rule::PodView;

/// What of a lock wakes its reconciler: spec (generation), deletion and finalizers. Status writes must not:
/// extension and status refreshes are driven by the keeper.
pub fn lock_trigger(lock: &DistributedLock) -> Option<u64> {
    let mut hasher = DefaultHasher::new();
    lock.metadata.generation.hash(&mut hasher);
    lock.metadata.deletion_timestamp.is_some().hash(&mut hasher);
    lock.finalizers().hash(&mut hasher);
    Some(hasher.finish())
}

/// What of a pod matters to locks: whether it can be a candidate, whether it is terminating, its labels (a
/// selector may start or stop matching) and its phase (a granted Job pod starting or stopping).
pub fn pod_trigger(pod: &Pod) -> u64 {
    let mut hasher = DefaultHasher::new();
    let view = PodView::of(pod, "");
    (view.candidate, pod.metadata.deletion_timestamp.is_some()).hash(&mut hasher);
    pod.metadata.labels.hash(&mut hasher);
    pod.status
        .as_ref()
        .and_then(|status| status.phase.as_deref())
        .hash(&mut hasher);
    hasher.finish()
}

/// The locks a pod event concerns: in the pod's namespace, the leader-election locks whose selector matches it
/// or whose status names it as a holder, and the Job locks whose grant started it.
///
/// Called for every pod change that matters, with every lock: nothing is allocated per lock that does not match.
pub fn locks_of_pod(locks: &[Arc<DistributedLock>], pod: &Pod) -> Vec<LockRef> {
    let namespace = pod.metadata.namespace.as_deref();
    let name = pod.metadata.name.as_deref();
    let empty = BTreeMap::new();
    let labels = pod.metadata.labels.as_ref().unwrap_or(&empty);
    let granted_by = pod.annotations().get(LOCK_LABEL).map(String::as_str);
    locks
        .iter()
        .filter(|lock| lock.metadata.namespace.as_deref() == namespace)
        .filter(|lock| {
            if lock.spec.holder.jobs.is_some() {
                return granted_by.is_some() && granted_by == lock.metadata.name.as_deref();
            }
            let Some(policy) = &lock.spec.holder.leader_election else {
                return false;
            };
            // A semaphore's leaders are its permits' holders, each of which hears that it left the selector.
            let holds = lock.status.as_ref().is_some_and(|status| {
                status
                    .holder
                    .as_deref()
                    .is_some_and(|holder| Some(holder) == name)
                    || status
                        .holders
                        .iter()
                        .any(|held| Some(held.holder.as_str()) == name)
            });
            holds || selects(&policy.selector, labels)
        })
        .map(|lock| ObjectRef::from_obj(&**lock))
        .collect()
}

/// Whether `selector` selects `labels`: its `matchLabels` are compared in place, and only a selector with
/// expressions is converted to match them (an invalid one selects nothing).
fn selects(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    let required = selector
        .match_labels
        .iter()
        .flatten()
        .all(|(key, value)| labels.get(key) == Some(value));
    required
        && (selector.match_expressions.as_ref().is_none_or(Vec::is_empty)
            || Selector::try_from(selector.clone()).is_ok_and(|selector| selector.matches(labels)))
}

/// The lock a Job queues for, from its label.
pub fn lock_of_job(job: &Job) -> Option<LockRef> {
    let name = job.labels().get(LOCK_LABEL)?;
    let namespace = job.metadata.namespace.as_deref()?;
    Some(ObjectRef::new(name).within(namespace))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lock(
        namespace: &str,
        name: &str,
        holder: serde_json::Value,
        status_holder: Option<&str>,
    ) -> Arc<DistributedLock> {
        Arc::new(
            serde_json::from_value(serde_json::json!({
                "apiVersion": "redlock.io/v1beta1",
                "kind": "DistributedLock",
                "metadata": { "name": name, "namespace": namespace, "generation": 1 },
                "spec": { "holder": holder },
                "status": { "holder": status_holder },
            }))
            .expect("lock"),
        )
    }

    fn pod(namespace: &str, name: &str, labels: serde_json::Value, annotations: serde_json::Value) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": { "name": name, "namespace": namespace, "labels": labels, "annotations": annotations },
            "status": { "phase": "Running", "conditions": [{ "type": "Ready", "status": "True" }] },
        }))
        .expect("pod")
    }

    fn names(refs: Vec<LockRef>) -> Vec<String> {
        refs.into_iter().map(|lock| lock.name).collect()
    }

    #[test]
    fn a_pod_wakes_the_elections_that_select_it_or_name_it_and_the_job_lock_that_granted_it() {
        let election =
            serde_json::json!({ "leaderElection": { "selector": { "matchLabels": { "app": "web" } } } });
        let locks = [
            lock("a", "web", election.clone(), None),
            lock("a", "was-web", election.clone(), Some("web-0")),
            lock("b", "web-elsewhere", election, None),
            lock("a", "batch", serde_json::json!({ "jobs": {} }), None),
            lock("a", "fixed", serde_json::json!({ "identity": "x" }), None),
        ];
        let web = pod(
            "a",
            "web-0",
            serde_json::json!({ "app": "web" }),
            serde_json::json!({}),
        );
        assert_eq!(names(locks_of_pod(&locks, &web)), ["web", "was-web"]);

        let relabelled = pod(
            "a",
            "web-0",
            serde_json::json!({ "app": "api" }),
            serde_json::json!({}),
        );
        assert_eq!(
            names(locks_of_pod(&locks, &relabelled)),
            ["was-web"],
            "the leader named in status hears that it left the selector"
        );

        let granted = pod(
            "a",
            "batch-x",
            serde_json::json!({}),
            serde_json::json!({ LOCK_LABEL: "batch" }),
        );
        assert_eq!(names(locks_of_pod(&locks, &granted)), ["batch"]);
        let elsewhere = pod(
            "c",
            "web-0",
            serde_json::json!({ "app": "web" }),
            serde_json::json!({}),
        );
        assert!(locks_of_pod(&locks, &elsewhere).is_empty());
    }

    #[test]
    fn a_semaphore_leader_that_leaves_the_selector_wakes_its_lock_and_expressions_still_select() {
        let semaphore: Arc<DistributedLock> = Arc::new(
            serde_json::from_value(serde_json::json!({
                "apiVersion": "redlock.io/v1beta1",
                "kind": "DistributedLock",
                "metadata": { "name": "shards", "namespace": "a", "generation": 1 },
                "spec": { "permits": 3, "holder": { "leaderElection": { "selector": { "matchLabels": { "app": "worker" } } } } },
                "status": { "holder": "worker-0", "holders": [
                    { "permit": 0, "holder": "worker-0", "fencingToken": 4 },
                    { "permit": 2, "holder": "worker-5", "fencingToken": 9 },
                ] },
            }))
            .expect("lock"),
        );
        let by_expression = lock(
            "a",
            "tiered",
            serde_json::json!({ "leaderElection": { "selector": {
                "matchLabels": { "app": "worker" },
                "matchExpressions": [{ "key": "tier", "operator": "In", "values": ["batch"] }],
            } } }),
            None,
        );
        let locks = [semaphore, by_expression];
        let relabelled = pod(
            "a",
            "worker-5",
            serde_json::json!({ "app": "retired" }),
            serde_json::json!({}),
        );
        assert_eq!(names(locks_of_pod(&locks, &relabelled)), ["shards"]);
        let batch = pod(
            "a",
            "worker-7",
            serde_json::json!({ "app": "worker", "tier": "batch" }),
            serde_json::json!({}),
        );
        assert_eq!(names(locks_of_pod(&locks, &batch)), ["shards", "tiered"]);
        let front = pod(
            "a",
            "worker-8",
            serde_json::json!({ "app": "worker", "tier": "front" }),
            serde_json::json!({}),
        );
        assert_eq!(names(locks_of_pod(&locks, &front)), ["shards"]);
    }

    #[test]
    fn a_job_wakes_the_lock_its_label_names() {
        let job: Job = serde_json::from_value(serde_json::json!({
            "metadata": { "name": "j", "namespace": "a", "labels": { LOCK_LABEL: "batch" } },
        }))
        .expect("job");
        assert_eq!(lock_of_job(&job), Some(ObjectRef::new("batch").within("a")));
        let unlabelled: Job =
            serde_json::from_value(serde_json::json!({ "metadata": { "name": "j", "namespace": "a" } }))
                .expect("job");
        assert_eq!(lock_of_job(&unlabelled), None);
    }

    #[test]
    fn status_writes_do_not_trigger_a_lock_but_spec_and_deletion_do() {
        let before = lock("a", "l", serde_json::json!({ "identity": "x" }), None);
        let mut status_only = (*before).clone();
        status_only.status = Some(crate::api::DistributedLockStatus {
            holder: Some("x".into()),
            ..Default::default()
        });
        assert_eq!(lock_trigger(&before), lock_trigger(&status_only));
        let mut respecced = (*before).clone();
        respecced.metadata.generation = Some(2);
        assert_ne!(lock_trigger(&before), lock_trigger(&respecced));
        let mut deleted = (*before).clone();
        deleted.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
        ));
        assert_ne!(lock_trigger(&before), lock_trigger(&deleted));
    }

    #[test]
    fn readiness_and_labels_trigger_a_pod_but_annotations_do_not() {
        let ready = pod(
            "a",
            "p",
            serde_json::json!({ "app": "web" }),
            serde_json::json!({}),
        );
        let annotated = pod(
            "a",
            "p",
            serde_json::json!({ "app": "web" }),
            serde_json::json!({ "note": "x" }),
        );
        assert_eq!(pod_trigger(&ready), pod_trigger(&annotated));
        let mut unready = ready.clone();
        if let Some(status) = unready.status.as_mut() {
            status.conditions = None;
        }
        assert_ne!(pod_trigger(&ready), pod_trigger(&unready));
        let relabelled = pod(
            "a",
            "p",
            serde_json::json!({ "app": "api" }),
            serde_json::json!({}),
        );
        assert_ne!(pod_trigger(&ready), pod_trigger(&relabelled));
    }
}

/// The pod cache keeps a trimmed copy of each pod: everything its readers (the routing here, the election and Job
/// fencing) decide must come out the same from it. Tested here, where all of them are in view.
#[cfg(test)]
mod trimmed_pods {
    use k8s_openapi::api::core::v1::Pod;

    use super::pod_trigger;

    use crate::controller::cache::pod_cache::trim_pod;
    use crate::controller::lock::policy::jobs::queue::GrantedPod;
    use crate::controller::lock::policy::leader::rule::PodView;

    fn full_pod() -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": "web-1", "namespace": "shop", "uid": "u1", "resourceVersion": "7",
                "creationTimestamp": "2026-01-01T00:00:00Z",
                "labels": { "app": "web", "leader": "true" },
                "annotations": { "redlock.io/lock": "batch", "redlock.io/fencing-token": "4" },
                "ownerReferences": [{ "apiVersion": "batch/v1", "kind": "Job", "name": "nightly", "uid": "j" }],
                "managedFields": [{ "manager": "kubelet", "operation": "Update" }]
            },
            "spec": { "containers": [{ "name": "app", "image": "shop:1", "env": [{ "name": "A", "value": "x".repeat(4000) }] }] },
            "status": {
                "phase": "Running",
                "podIP": "10.0.0.1",
                "conditions": [{ "type": "Ready", "status": "True", "message": "m".repeat(500) }],
                "containerStatuses": [{ "name": "app", "image": "shop:1", "imageID": "x", "ready": true, "restartCount": 0 }]
            }
        }))
        .unwrap()
    }

    #[test]
    fn a_trimmed_pod_decides_everything_as_the_full_one_in_a_fraction_of_the_size() {
        let full = full_pod();
        let mut trimmed = full.clone();
        trim_pod(&mut trimmed);
        let size = |pod: &Pod| serde_json::to_vec(pod).unwrap().len();
        assert!(
            size(&trimmed) * 5 < size(&full),
            "{} vs {}",
            size(&trimmed),
            size(&full)
        );
        assert_eq!(PodView::of(&trimmed, "leader"), PodView::of(&full, "leader"));
        assert_eq!(pod_trigger(&trimmed), pod_trigger(&full));
        assert_eq!(
            GrantedPod::of(&trimmed, "batch").map(|pod| (pod.name, pod.job, pod.token)),
            GrantedPod::of(&full, "batch").map(|pod| (pod.name, pod.job, pod.token))
        );
        assert!(GrantedPod::of(&trimmed, "batch").is_some());
        assert!(PodView::of(&trimmed, "leader").candidate);
        assert_eq!(trimmed.metadata.owner_references, full.metadata.owner_references);
    }
}
