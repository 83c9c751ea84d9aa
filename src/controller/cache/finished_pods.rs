//! The pods whose deletion the pod watch showed after their kubelet had reported them finished (phase
//! `Succeeded` or `Failed`). A Pod object gone is no proof that its containers stopped: a force deletion
//! (`kubectl delete --force --grace-period=0`, or one after a graceful deletion that hangs on a node cut off) removes
//! it while they run on, and Kubernetes says so. Since 1.27 the kubelet moves a deleted pod to a terminal phase
//! once its containers have stopped, before it removes the object, so the last state the watch shows of a pod
//! that really stopped is a finished one; of a pod force-deleted while running, it is not. Kept per name, for the
//! uid that finished; a pod created again under the name replaces the record, and the record is bounded. Of a
//! Job's grant nothing but its pods' annotations names them, so the pods of grants deleted while they ran are
//! kept apart ([`RunningWhenDeleted`]): their grant has not stopped for sure, whatever the API server lists.

use std::collections::{HashMap, VecDeque};

use k8s_openapi::api::core::v1::Pod;

use crate::api::holder_contract::{LOCK_LABEL, TOKEN_ANNOTATION};

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

/// A pod of a Job lock's grant that the watch showed deleted while it ran (not finished): force-deleted, or
/// removed without its kubelet reporting it finished (a grace period of 0), so its containers may run on.
#[derive(Clone, Debug, PartialEq, Eq)]
struct GrantPod {
    namespace: String,
    name: String,
    lock: String,
    job: Option<String>,
    token: Option<i64>,
}

/// The pods of grants deleted while they ran, the latest [`REMEMBERED`] of them.
#[derive(Debug, Default)]
pub struct RunningWhenDeleted {
    pods: VecDeque<GrantPod>,
}

impl RunningWhenDeleted {
    /// The watch showed `pod` deleted: remembered when it belongs to a Job lock's grant and had not finished.
    pub fn deleted(&mut self, pod: &Pod) {
        if is_finished(pod) {
            return;
        }
        let Some(annotations) = pod.metadata.annotations.as_ref() else {
            return;
        };
        let (Some(namespace), Some(name), Some(lock)) = (
            pod.metadata.namespace.clone(),
            pod.metadata.name.clone(),
            annotations.get(LOCK_LABEL),
        ) else {
            return;
        };
        let job = owning_job(pod);
        let token = annotations
            .get(TOKEN_ANNOTATION)
            .and_then(|token| token.parse().ok());
        self.pods.push_back(GrantPod {
            namespace,
            name,
            lock: lock.clone(),
            job,
            token,
        });
        while self.pods.len() > REMEMBERED {
            self.pods.pop_front();
        }
    }

    /// Whether a pod of `lock`'s grant of `job` with `token` (owned by the Job, or carrying the token) was
    /// deleted while it ran, but those named in `reported` (they reported their work stopped).
    pub fn of_grant(
        &self,
        (namespace, lock): (&str, &str),
        job: &str,
        token: i64,
        reported: &[String],
    ) -> bool {
        self.pods.iter().any(|pod| {
            pod.namespace == namespace
                && pod.lock == lock
                && !reported.contains(&pod.name)
                && (pod.job.as_deref() == Some(job) || pod.token == Some(token))
        })
    }
}

/// The Job that owns `pod`, if one does.
pub fn owning_job(pod: &Pod) -> Option<String> {
    pod.metadata
        .owner_references
        .iter()
        .flatten()
        .find(|owner| owner.kind == "Job")
        .map(|owner| owner.name.clone())
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

    fn granted(name: &str, job: &str, token: &str, phase: &str) -> Pod {
        let mut pod = pod(name, "u", phase);
        pod.metadata.annotations = Some(
            [
                (LOCK_LABEL.to_owned(), "batch".to_owned()),
                (TOKEN_ANNOTATION.to_owned(), token.to_owned()),
            ]
            .into(),
        );
        pod.metadata.owner_references = Some(vec![
            k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                kind: "Job".into(),
                name: job.into(),
                ..Default::default()
            },
        ]);
        pod
    }

    #[test]
    fn a_grants_pod_deleted_while_it_ran_is_remembered_by_job_and_token() {
        let mut record = RunningWhenDeleted::default();
        record.deleted(&granted("first-a", "first", "3", "Succeeded"));
        record.deleted(&granted("other", "other", "x", "Running"));
        assert!(
            !record.of_grant(("shop", "batch"), "first", 3, &[]),
            "it finished"
        );
        record.deleted(&granted("first-b", "first", "4", "Running"));
        assert!(
            record.of_grant(("shop", "batch"), "first", 9, &[]),
            "owned by the Job"
        );
        assert!(
            record.of_grant(("shop", "batch"), "second", 4, &[]),
            "carrying the token"
        );
        assert!(!record.of_grant(("shop", "batch"), "second", 5, &[]));
        assert!(
            !record.of_grant(("shop", "batch"), "first", 4, &["first-b".to_owned()]),
            "it reported its work stopped"
        );
        assert!(!record.of_grant(("shop", "other-lock"), "first", 4, &[]));
        assert!(!record.of_grant(("elsewhere", "batch"), "first", 4, &[]));
        record.deleted(&pod("plain", "p", "Running"));
        assert_eq!(record.pods.len(), 2, "a pod of no grant is not remembered");
        for index in 0..REMEMBERED {
            record.deleted(&granted(&format!("p-{index}"), "filler", "1", "Running"));
        }
        assert!(
            !record.of_grant(("shop", "batch"), "first", 9, &[]),
            "forgotten, oldest first"
        );
        assert_eq!(record.pods.len(), REMEMBERED);
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
