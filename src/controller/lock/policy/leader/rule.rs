//! Leader election among pods: who may lead, and who should. Pure, so it is tested without a cluster.

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;

/// The annotation the leader pod carries next to the leader label and the token.
pub const VALID_UNTIL_ANNOTATION: &str = "redlock.io/valid-until";

/// What the election needs to know of a pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodView {
    pub name: String,
    pub created: Option<Timestamp>,
    /// Running, Ready and not terminating.
    pub candidate: bool,
    /// Carries the leader label now.
    pub labelled: bool,
}

impl PodView {
    pub fn of(pod: &Pod, leader_label: &str) -> Self {
        let status = pod.status.as_ref();
        let running = status.and_then(|status| status.phase.as_deref()) == Some("Running");
        let ready = status
            .and_then(|status| status.conditions.as_ref())
            .is_some_and(|conditions| {
                conditions
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.status == "True")
            });
        let terminating = pod.metadata.deletion_timestamp.is_some();
        Self {
            name: pod.metadata.name.clone().unwrap_or_default(),
            created: pod.metadata.creation_timestamp.as_ref().map(|time| time.0),
            candidate: running && ready && !terminating,
            labelled: pod
                .metadata
                .labels
                .as_ref()
                .is_some_and(|labels| labels.contains_key(leader_label)),
        }
    }
}

/// The candidates in election order: preferred names first (in their order), then the oldest, then by name.
pub fn candidates<'a>(pods: &'a [PodView], preference: &[String]) -> Vec<&'a PodView> {
    let mut candidates: Vec<&PodView> = pods.iter().filter(|pod| pod.candidate).collect();
    candidates.sort_by(|a, b| {
        let rank = |pod: &PodView| {
            preference
                .iter()
                .position(|name| *name == pod.name)
                .unwrap_or(usize::MAX)
        };
        rank(a)
            .cmp(&rank(b))
            .then_with(|| a.created.cmp(&b.created))
            .then_with(|| a.name.cmp(&b.name))
    });
    candidates
}

/// The pod that should lead: the current leader while it is a candidate (a leader is never moved for
/// preference alone), otherwise the first candidate.
pub fn choose_leader(pods: &[PodView], current: Option<&str>, preference: &[String]) -> Option<String> {
    let ordered = candidates(pods, preference);
    current
        .and_then(|current| ordered.iter().find(|pod| pod.name == current))
        .or_else(|| ordered.first())
        .map(|pod| pod.name.clone())
}

/// Pods that carry the leader label but must not: all but `keep` (the leader whose lock is held).
pub fn labels_to_remove(pods: &[PodView], keep: Option<&str>) -> Vec<String> {
    pods.iter()
        .filter(|pod| pod.labelled && Some(pod.name.as_str()) != keep)
        .map(|pod| pod.name.clone())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, created: i64, candidate: bool, labelled: bool) -> PodView {
        PodView {
            name: name.into(),
            created: Timestamp::from_second(created).ok(),
            candidate,
            labelled,
        }
    }

    #[test]
    fn the_oldest_ready_pod_leads_and_keeps_leading() {
        let pods = [
            pod("web-b", 20, true, false),
            pod("web-a", 10, true, false),
            pod("web-c", 5, false, false),
        ];
        assert_eq!(
            choose_leader(&pods, None, &[]).as_deref(),
            Some("web-a"),
            "web-c is not ready"
        );
        assert_eq!(
            choose_leader(&pods, Some("web-b"), &[]).as_deref(),
            Some("web-b"),
            "a candidate leader is kept, older pods notwithstanding"
        );
        assert_eq!(choose_leader(&pods, Some("web-c"), &[]).as_deref(), Some("web-a"));
        let twins = [pod("web-2", 10, true, false), pod("web-1", 10, true, false)];
        assert_eq!(
            choose_leader(&twins, None, &[]).as_deref(),
            Some("web-1"),
            "name breaks ties"
        );
        assert_eq!(choose_leader(&[pod("x", 1, false, false)], None, &[]), None);
    }

    #[test]
    fn preference_orders_new_elections_only() {
        let pods = [
            pod("a", 1, true, false),
            pod("b", 2, true, false),
            pod("c", 3, true, false),
        ];
        let preference = vec!["c".to_owned(), "b".to_owned()];
        assert_eq!(choose_leader(&pods, None, &preference).as_deref(), Some("c"));
        assert_eq!(choose_leader(&pods, Some("a"), &preference).as_deref(), Some("a"));
        let names: Vec<&str> = candidates(&pods, &preference)
            .iter()
            .map(|pod| pod.name.as_str())
            .collect();
        assert_eq!(names, ["c", "b", "a"]);
    }

    #[test]
    fn only_the_held_leader_may_keep_the_label() {
        let pods = [
            pod("a", 1, true, true),
            pod("b", 2, false, true),
            pod("c", 3, true, false),
        ];
        assert_eq!(labels_to_remove(&pods, Some("a")), ["b"]);
        assert_eq!(labels_to_remove(&pods, None), ["a", "b"]);
    }
}
