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
