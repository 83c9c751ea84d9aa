//! The pod cache indexed by namespace and label. kube-runtime's `Store` has no index: an election would read
//! every pod of the cluster to find the few its selector picks, on every look at every leader lock. With 1,000
//! leader semaphores over 20,000 pods that scan was most of the operator's work and kept new locks from ever
//! being looked at. The index holds names and labels only; the pods themselves are read from the `Store`, which
//! stays the one source of truth (a name the index still lists but the store no longer has is skipped, and every
//! pod read is matched against the whole selector again).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use k8s_openapi::api::core::v1::Pod;
use kube::core::{Selector, SelectorExt};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;

use super::finished_pods::{FinishedPods, RunningWhenDeleted};

type Labels = BTreeMap<String, String>;

/// The pods of one namespace: each pod's labels as last indexed, and for each label key and value the pods
/// that carry it.
#[derive(Default)]
struct Namespace {
    labels_of: HashMap<String, Labels>,
    by_label: HashMap<String, HashMap<String, BTreeSet<String>>>,
}

impl Namespace {
    fn insert(&mut self, name: &str, labels: Labels) {
        self.remove(name);
        for (key, value) in &labels {
            self.by_label
                .entry(key.clone())
                .or_default()
                .entry(value.clone())
                .or_default()
                .insert(name.to_owned());
        }
        self.labels_of.insert(name.to_owned(), labels);
    }

    fn remove(&mut self, name: &str) {
        let Some(labels) = self.labels_of.remove(name) else {
            return;
        };
        for (key, value) in labels {
            let Some(values) = self.by_label.get_mut(&key) else {
                continue;
            };
            if let Some(names) = values.get_mut(&value) {
                names.remove(name);
                if names.is_empty() {
                    values.remove(&value);
                }
            }
            if values.is_empty() {
                self.by_label.remove(&key);
            }
        }
    }

    /// The pods carrying every label of `required`, by the smallest of their lists; every pod when it is empty.
    fn carrying(&self, required: &Labels) -> Vec<String> {
        let mut smallest: Option<&BTreeSet<String>> = None;
        for (key, value) in required {
            let Some(names) = self.by_label.get(key).and_then(|values| values.get(value)) else {
                return Vec::new();
            };
            if smallest.is_none_or(|current| names.len() < current.len()) {
                smallest = Some(names);
            }
        }
        match smallest {
            Some(names) => names.iter().cloned().collect(),
            None => self.labels_of.keys().cloned().collect(),
        }
    }
}

#[derive(Default)]
struct State {
    /// A whole list has been indexed: before that, a pod missing from the index may only not be listed yet.
    synced: bool,
    namespaces: HashMap<String, Namespace>,
    /// Filled during a (re)list and swapped in when it is done, as the reflector does with its store.
    relisting: Option<HashMap<String, Namespace>>,
    /// The pods deleted after they had finished: stopped for sure, where a pod merely gone may run on.
    finished: FinishedPods,
    /// The pods of Job grants deleted while they ran.
    running_when_deleted: RunningWhenDeleted,
}

/// Kept up to date from the pod watch, next to the reflector's store.
#[derive(Default)]
pub struct PodIndex {
    state: RwLock<State>,
}

impl PodIndex {
    /// Indexes what a watch event says of a pod. Called after the reflector has applied the same event.
    pub fn apply(&self, event: &watcher::Event<Pod>) {
        let mut state = self.write();
        match event {
            watcher::Event::Init => state.relisting = Some(HashMap::new()),
            watcher::Event::InitApply(pod) => {
                state.finished.seen(pod);
                if let Some(relisting) = state.relisting.as_mut() {
                    insert(relisting, pod);
                }
            }
            watcher::Event::InitDone => {
                if let Some(listed) = state.relisting.take() {
                    state.namespaces = listed;
                    state.synced = true;
                }
            }
            watcher::Event::Apply(pod) => {
                state.finished.seen(pod);
                insert(&mut state.namespaces, pod);
            }
            watcher::Event::Delete(pod) => {
                state.finished.deleted(pod);
                state.running_when_deleted.deleted(pod);
                if let (Some(namespace), Some(name)) = (&pod.metadata.namespace, &pod.metadata.name)
                    && let Some(pods) = state.namespaces.get_mut(namespace)
                {
                    pods.remove(name);
                }
            }
        }
    }

    /// Whether a whole list has been indexed. The reflector's store is ready a moment before (it sees each event
    /// first), so the caches count as synced only once both are.
    pub fn is_synced(&self) -> bool {
        self.read().synced
    }

    /// Whether the pod last deleted as `namespace`/`name` had finished (its kubelet reported its containers
    /// stopped) before the watch showed it deleted.
    pub fn deleted_finished(&self, namespace: &str, name: &str) -> bool {
        self.read().finished.finished(namespace, name)
    }

    /// Whether a pod of the grant of `job` with `token` by the lock `namespace`/`lock` was deleted while it ran,
    /// but those in `reported` (they reported their work stopped).
    pub fn grant_pod_deleted_running(
        &self,
        namespace_and_lock: (&str, &str),
        job: &str,
        token: i64,
        reported: &[String],
    ) -> bool {
        self.read()
            .running_when_deleted
            .of_grant(namespace_and_lock, job, token, reported)
    }

    /// The names of the pods of `namespace` that carry every label of `required` (all of them when it is empty).
    pub fn carrying(&self, namespace: &str, required: &Labels) -> Vec<String> {
        self.read()
            .namespaces
            .get(namespace)
            .map(|pods| pods.carrying(required))
            .unwrap_or_default()
    }

    fn read(&self) -> RwLockReadGuard<'_, State> {
        self.state.read().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, State> {
        self.state
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

fn insert(namespaces: &mut HashMap<String, Namespace>, pod: &Pod) {
    if let (Some(namespace), Some(name)) = (&pod.metadata.namespace, &pod.metadata.name) {
        let labels = pod.metadata.labels.clone().unwrap_or_default();
        namespaces
            .entry(namespace.clone())
            .or_default()
            .insert(name, labels);
    }
}

/// The pods of `namespace` in `store` that `selector` selects, looked up by `required` (labels the selector
/// requires, its `matchLabels`) in `index`. Each is read from the store and matched against the whole selector.
pub fn pods_selected(
    store: &Store<Pod>,
    index: &PodIndex,
    namespace: &str,
    required: &Labels,
    selector: &Selector,
) -> Vec<Arc<Pod>> {
    let empty = Labels::new();
    index
        .carrying(namespace, required)
        .into_iter()
        .filter_map(|name| store.get(&ObjectRef::new(&name).within(namespace)))
        .filter(|pod| selector.matches(pod.metadata.labels.as_ref().unwrap_or(&empty)))
        .collect()
}

/// The pods of `namespace` in `store`.
pub fn pods_in(store: &Store<Pod>, index: &PodIndex, namespace: &str) -> Vec<Arc<Pod>> {
    pods_selected(store, index, namespace, &Labels::new(), &Selector::default())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(namespace: &str, name: &str, labels: &[(&str, &str)]) -> Pod {
        let labels: Labels = labels
            .iter()
            .map(|(key, value)| ((*key).to_owned(), (*value).to_owned()))
            .collect();
        let mut pod = Pod::default();
        pod.metadata.namespace = Some(namespace.to_owned());
        pod.metadata.name = Some(name.to_owned());
        pod.metadata.labels = Some(labels);
        pod
    }

    fn required(labels: &[(&str, &str)]) -> Labels {
        labels
            .iter()
            .map(|(key, value)| ((*key).to_owned(), (*value).to_owned()))
            .collect()
    }

    #[test]
    fn pods_are_found_by_namespace_and_every_required_label() {
        let index = PodIndex::default();
        index.apply(&watcher::Event::Init);
        for pod in [
            pod("a", "web-0", &[("app", "web"), ("tier", "front")]),
            pod("a", "web-1", &[("app", "web")]),
            pod("a", "db-0", &[("app", "db")]),
            pod("b", "web-0", &[("app", "web")]),
        ] {
            index.apply(&watcher::Event::InitApply(pod));
        }
        assert!(
            index.carrying("a", &required(&[("app", "web")])).is_empty(),
            "nothing is shown before the list is done"
        );
        assert!(!index.is_synced());
        index.apply(&watcher::Event::InitDone);
        assert!(index.is_synced());
        assert_eq!(
            index.carrying("a", &required(&[("app", "web")])),
            ["web-0", "web-1"]
        );
        assert_eq!(
            index.carrying("a", &required(&[("app", "web"), ("tier", "front")])),
            ["web-0"]
        );
        assert!(index.carrying("a", &required(&[("app", "cache")])).is_empty());
        assert!(index.carrying("c", &Labels::new()).is_empty());
        let mut everyone = index.carrying("a", &Labels::new());
        everyone.sort();
        assert_eq!(everyone, ["db-0", "web-0", "web-1"]);
    }

    #[test]
    fn a_relabelled_or_deleted_pod_leaves_its_old_labels_lists() {
        let index = PodIndex::default();
        index.apply(&watcher::Event::Apply(pod("a", "web-0", &[("app", "web")])));
        index.apply(&watcher::Event::Apply(pod("a", "web-0", &[("app", "api")])));
        assert!(index.carrying("a", &required(&[("app", "web")])).is_empty());
        assert_eq!(index.carrying("a", &required(&[("app", "api")])), ["web-0"]);
        index.apply(&watcher::Event::Delete(pod("a", "web-0", &[("app", "api")])));
        assert!(index.carrying("a", &Labels::new()).is_empty());
        assert!(
            index
                .read()
                .namespaces
                .get("a")
                .is_some_and(|pods| pods.by_label.is_empty()),
            "no empty lists are left behind"
        );
    }

    #[test]
    fn a_relist_forgets_the_pods_deleted_while_the_watch_was_down() {
        let index = PodIndex::default();
        index.apply(&watcher::Event::Apply(pod("a", "gone", &[("app", "web")])));
        index.apply(&watcher::Event::Init);
        index.apply(&watcher::Event::InitApply(pod("a", "web-1", &[("app", "web")])));
        assert_eq!(
            index.carrying("a", &required(&[("app", "web")])),
            ["gone"],
            "the old index serves until the list is done"
        );
        index.apply(&watcher::Event::InitDone);
        assert_eq!(index.carrying("a", &required(&[("app", "web")])), ["web-1"]);
    }
}
