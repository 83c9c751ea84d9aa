//! What of a pod the operator keeps in its cache: only the fields elections and Job fencing read. The pod watch
//! is cluster-wide, and a pod's spec and most of its status are many times the size of what is read; trimmed
//! before caching, the cache holds a few hundred bytes per pod instead of several kilobytes.

use k8s_openapi::api::core::v1::{Pod, PodCondition, PodStatus};

/// Keeps the metadata read by the policies and routing (name, namespace, labels, annotations, owners, creation
/// and deletion times, resourceVersion, uid), the phase and the conditions' type and status; drops the rest.
pub fn trim_pod(pod: &mut Pod) {
    pod.spec = None;
    pod.metadata.managed_fields = None;
    pod.status = pod.status.take().map(|status| PodStatus {
        phase: status.phase,
        conditions: status.conditions.map(|conditions| {
            conditions
                .into_iter()
                .map(|condition| PodCondition {
                    type_: condition.type_,
                    status: condition.status,
                    ..PodCondition::default()
                })
                .collect()
        }),
        ..PodStatus::default()
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::lock::policy::jobs::queue::GrantedPod;
    use crate::controller::lock::policy::leader::rule::PodView;
    use crate::controller::run::routing::pod_trigger;

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
