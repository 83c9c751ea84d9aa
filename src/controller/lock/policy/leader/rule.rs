//! Leader election among pods: who may lead, and who should. Pure, so it is tested without a cluster.

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;

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

/// The pods that should hold each permit of a semaphore, in permit order (`current[i]`: permit i's holder now).
/// A holder keeps its permit while it is a candidate, so a pod keeps its permit number; the free permits go,
/// lowest first, to the first candidates in election order that hold no permit. A pod never gets two permits
/// (a cache or status naming one pod twice leaves it the lowest). Only the first `open` permits (spec.permits)
/// are held: the permits above, left from a higher count, are nobody's, so their leaders lose the label and
/// the permits are released once their validity has run out.
pub fn choose_leaders(
    pods: &[PodView],
    current: &[Option<&str>],
    preference: &[String],
    open: usize,
) -> Vec<Option<String>> {
    let ordered = candidates(pods, preference);
    let is_candidate = |name: &str| ordered.iter().any(|pod| pod.name == name);
    let mut taken: Vec<&str> = Vec::with_capacity(current.len());
    let mut chosen: Vec<Option<String>> = (0..open)
        .map(|permit| {
            let holder = current.get(permit).copied().flatten();
            let keep = holder.filter(|name| is_candidate(name) && !taken.contains(name))?;
            taken.push(keep);
            Some(keep.to_owned())
        })
        .collect();
    // A pod holding a permit, even one being given up, is not free: it gets another once it has let go of it.
    let mut free = ordered
        .iter()
        .map(|pod| pod.name.as_str())
        .filter(|name| !current.contains(&Some(*name)));
    for slot in chosen.iter_mut().filter(|slot| slot.is_none()) {
        *slot = free.next().map(str::to_owned);
    }
    chosen.resize(current.len().max(open), None);
    chosen
}

/// Pods that carry the leader label but must not: all but `keep` (the leaders whose permits are held).
pub fn labels_to_remove(pods: &[PodView], keep: &[&str]) -> Vec<String> {
    pods.iter()
        .filter(|pod| pod.labelled && !keep.contains(&pod.name.as_str()))
        .map(|pod| pod.name.clone())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A lock of one permit: the semaphore of one.
    fn choose_leader(pods: &[PodView], current: Option<&str>, preference: &[String]) -> Option<String> {
        choose_leaders(pods, &[current], preference, 1).pop().flatten()
    }

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
        assert_eq!(labels_to_remove(&pods, &["a"]), ["b"]);
        assert_eq!(labels_to_remove(&pods, &[]), ["a", "b"]);
        assert_eq!(labels_to_remove(&pods, &["a", "b"]), Vec::<String>::new());
    }

    fn names(chosen: &[Option<String>]) -> Vec<Option<&str>> {
        chosen.iter().map(Option::as_deref).collect()
    }

    #[test]
    fn each_permit_goes_to_its_own_pod_in_election_order() {
        let pods = [
            pod("w-0", 1, true, false),
            pod("w-1", 2, true, false),
            pod("w-2", 3, true, false),
            pod("w-3", 4, true, false),
        ];
        assert_eq!(
            names(&choose_leaders(&pods, &[None, None, None], &[], 3)),
            [Some("w-0"), Some("w-1"), Some("w-2")]
        );
        let few = &pods[..2];
        assert_eq!(
            names(&choose_leaders(few, &[None, None, None], &[], 3)),
            [Some("w-0"), Some("w-1"), None],
            "a permit nobody can take stays free"
        );
        let preference = vec!["w-3".to_owned()];
        assert_eq!(
            names(&choose_leaders(&pods, &[None, None], &preference, 2)),
            [Some("w-3"), Some("w-0")]
        );
    }

    #[test]
    fn holders_keep_their_permit_numbers_and_a_freed_permit_goes_to_the_next_candidate() {
        let mut pods = vec![
            pod("w-0", 1, true, true),
            pod("w-1", 2, true, true),
            pod("w-2", 3, true, true),
            pod("w-3", 4, true, false),
        ];
        let current = [Some("w-2"), Some("w-0"), Some("w-1")];
        assert_eq!(
            names(&choose_leaders(&pods, &current, &[], current.len())),
            current,
            "older pods notwithstanding, every holder keeps its own permit"
        );
        pods[0].candidate = false;
        assert_eq!(
            names(&choose_leaders(&pods, &current, &[], current.len())),
            [Some("w-2"), Some("w-3"), Some("w-1")],
            "only permit 1, whose pod went, moves"
        );
        assert_eq!(
            names(&choose_leaders(&pods, &[Some("w-1"), Some("w-1"), None], &[], 3)),
            [Some("w-1"), Some("w-2"), Some("w-3")],
            "a pod named twice keeps its lowest permit only"
        );
    }

    #[test]
    fn a_pod_whose_permit_is_still_shown_gets_no_other() {
        let pods = [pod("w-0", 1, true, true), pod("w-1", 2, true, false)];
        // Permit 1 is w-0's (status still shows it while its key waits to be released): w-0 is not free for
        // permit 0.
        assert_eq!(
            names(&choose_leaders(&pods, &[None, Some("w-0")], &[], 2)),
            [Some("w-1"), Some("w-0")]
        );
    }

    #[test]
    fn permits_above_the_count_lose_their_leaders_and_new_ones_go_to_free_pods() {
        let pods = [
            pod("w-0", 1, true, true),
            pod("w-1", 2, true, true),
            pod("w-2", 3, true, true),
            pod("w-3", 4, true, false),
        ];
        let current = [Some("w-0"), Some("w-1"), Some("w-2")];
        assert_eq!(
            names(&choose_leaders(&pods, &current, &[], 2)),
            [Some("w-0"), Some("w-1"), None],
            "shrunk to two: permit 2 is nobody's, and w-3 does not take it"
        );
        assert_eq!(
            names(&choose_leaders(&pods, &[Some("w-0"), None, Some("w-2")], &[], 2)),
            [Some("w-0"), Some("w-1"), None],
            "w-2 still holds permit 2 being given up: the free permit 1 goes to w-1, not to it"
        );
        assert_eq!(
            names(&choose_leaders(&pods, &[Some("w-0"), Some("w-1")], &[], 4)),
            [Some("w-0"), Some("w-1"), Some("w-2"), Some("w-3")],
            "grown to four: the new permits go to free pods, the holders keep theirs"
        );
    }
}
