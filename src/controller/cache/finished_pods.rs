//! The pods whose deletion the pod watch showed after their kubelet had reported them finished (phase
//! `Succeeded` or `Failed`). A Pod object gone is no proof that its containers stopped: a force deletion
//! (`kubectl delete --force --grace-period=0`, or one after a graceful deletion that hangs on a node cut off) removes
//! it while they run on, and Kubernetes says so. Since 1.27 the kubelet moves a deleted pod to a terminal phase
//! once its containers have stopped, before it removes the object, so the last state the watch shows of a pod
//! that really stopped is a finished one; of a pod force-deleted while running, it is not. Kept per name, for the
//! uid that finished; a pod created again under the name replaces the record, and the record is bounded.

use std::collections::{HashMap, VecDeque};

use k8s_openapi::api::core::v1::Pod;

/// How many deletions are remembered: a hand-over asks about a pod within a TTL or so of its deletion, and a
/// cluster deletes far fewer pods than this in that time.
pub const REMEMBERED: usize = 4_096;

/// Whether `pod` shows that its containers have stopped for good.
pub fn is_finished(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|status| status.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

/// The record, in the order the deletions came (the oldest is forgotten first).
#[derive(Debug, Default)]
pub struct FinishedPods {
    /// (namespace, name) → the uid that finished before its object was deleted, and the deletion's number.
    uids: HashMap<(String, String), (String, u64)>,
    /// The deletions recorded, oldest first, by number; one whose name was recorded again or forgotten since is
    /// skipped when its turn comes.
    order: VecDeque<((String, String), u64)>,
    next: u64,
}

impl FinishedPods {
    /// The watch showed `pod` deleted: remembered when its last state was a finished one, forgotten otherwise
    /// (its name may have been recorded for an earlier pod).
    pub fn deleted(&mut self, pod: &Pod) {
        let Some(key) = key_of(pod) else {
            return;
        };
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        if !is_finished(pod) || uid.is_empty() {
            self.uids.remove(&key);
            return;
        }
        let number = self.next;
        self.next = self.next.wrapping_add(1);
        self.uids.insert(key.clone(), (uid, number));
        self.order.push_back((key, number));
        while self.uids.len() > REMEMBERED {
            let Some((oldest, number)) = self.order.pop_front() else {
                break;
            };
            if self
                .uids
                .get(&oldest)
                .is_some_and(|(_, recorded)| *recorded == number)
            {
                self.uids.remove(&oldest);
            }
        }
        // Entries of names recorded again or forgotten since are dropped once they are as many as the live ones.
        if self.order.len() > REMEMBERED.saturating_mul(2) {
            let uids = &self.uids;
            self.order
                .retain(|(key, number)| uids.get(key).is_some_and(|(_, recorded)| recorded == number));
        }
    }

    /// The watch shows `pod` (created, changed or listed): a new pod under a name recorded for another uid takes
    /// the name, and the record of the old one goes.
    pub fn seen(&mut self, pod: &Pod) {
        if self.uids.is_empty() {
            return;
        }
        let Some(key) = key_of(pod) else {
            return;
        };
        if self.uids.get(&key).map(|(uid, _)| uid) != pod.metadata.uid.as_ref() {
            self.uids.remove(&key);
        }
    }

    /// Whether the pod last deleted under `namespace`/`name` had finished before its deletion.
    pub fn finished(&self, namespace: &str, name: &str) -> bool {
        self.uids.contains_key(&(namespace.to_owned(), name.to_owned()))
    }
}

fn key_of(pod: &Pod) -> Option<(String, String)> {
    Some((pod.metadata.namespace.clone()?, pod.metadata.name.clone()?))
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::PodStatus;

    use super::*;

    fn pod(name: &str, uid: &str, phase: &str) -> Pod {
        let mut pod = Pod::default();
        pod.metadata.namespace = Some("shop".into());
        pod.metadata.name = Some(name.into());
        pod.metadata.uid = Some(uid.into());
        pod.status = Some(PodStatus {
            phase: Some(phase.into()),
            ..PodStatus::default()
        });
        pod
    }

    #[test]
    fn only_a_pod_deleted_after_it_finished_counts_as_stopped() {
        let mut record = FinishedPods::default();
        record.deleted(&pod("web-0", "a", "Failed"));
        record.deleted(&pod("web-1", "b", "Succeeded"));
        record.deleted(&pod("web-2", "c", "Running"));
        assert!(record.finished("shop", "web-0"));
        assert!(record.finished("shop", "web-1"));
        assert!(!record.finished("shop", "web-2"), "force-deleted while running");
        assert!(!record.finished("shop", "web-9"), "never seen deleted");
        assert!(!record.finished("other", "web-0"), "another namespace");
    }

    #[test]
    fn a_pod_created_again_under_the_name_takes_the_record_away() {
        let mut record = FinishedPods::default();
        record.deleted(&pod("web-0", "a", "Failed"));
        record.seen(&pod("web-0", "a", "Failed"));
        assert!(record.finished("shop", "web-0"), "the same pod, seen late");
        record.seen(&pod("web-0", "b", "Running"));
        assert!(!record.finished("shop", "web-0"));
        record.deleted(&pod("web-0", "b", "Running"));
        assert!(!record.finished("shop", "web-0"), "the new pod was force-deleted");
        record.deleted(&pod("web-0", "c", "Failed"));
        record.deleted(&pod("web-0", "d", "Running"));
        assert!(!record.finished("shop", "web-0"), "the last deletion decides");
    }

    #[test]
    fn the_record_is_bounded_and_forgets_the_oldest_first() {
        let mut record = FinishedPods::default();
        for index in 0..REMEMBERED + 10 {
            record.deleted(&pod(&format!("job-{index}"), "u", "Succeeded"));
        }
        assert!(!record.finished("shop", "job-0"));
        assert!(!record.finished("shop", "job-9"));
        assert!(record.finished("shop", "job-10"));
        assert!(record.finished("shop", &format!("job-{}", REMEMBERED + 9)));
        assert_eq!(record.uids.len(), REMEMBERED);
        // Names recorded, forgotten and recorded again do not grow the order without a bound.
        for _ in 0..3 * REMEMBERED {
            record.deleted(&pod("web-0", "x", "Failed"));
            record.deleted(&pod("web-0", "y", "Running"));
        }
        assert!(record.order.len() <= 2 * REMEMBERED + 1, "{}", record.order.len());
        assert!(record.uids.len() <= REMEMBERED);
    }
}
