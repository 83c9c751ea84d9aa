//! The stored objects, one global resourceVersion counter, and each resource's history of changes for watches.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;

use serde_json::Value;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::kinds::{Kind, Special, kind_of};
use super::meta::{meta_mut, name_of, namespace_of};
use super::selectors::Filter;

/// Paginated list snapshots kept for `continue` tokens.
const LIST_SNAPSHOTS: usize = 64;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum EventType {
    Added,
    Modified,
    Deleted,
}

/// One committed write, as watchers see it. `object` carries the write's resourceVersion (for a deletion:
/// the last stored content with the deletion's resourceVersion, like the real server's DELETED events).
pub(super) struct Change {
    pub event: EventType,
    pub rv: u64,
    pub object: Arc<Value>,
    pub previous: Option<Arc<Value>>,
}

/// The objects of one resource, keyed `namespace/name`.
#[derive(Default)]
pub(super) struct Bucket {
    pub objects: BTreeMap<String, Arc<Value>>,
    pub history: VecDeque<Arc<Change>>,
    /// The resourceVersion of the newest change dropped from `history`.
    pub compacted: u64,
    pub watchers: Vec<mpsc::Sender<Arc<Change>>>,
}

/// A list result kept for its `continue` tokens, so later pages are consistent with the first.
pub(super) struct Page {
    pub rv: u64,
    pub items: Vec<Arc<Value>>,
    pub filtered: bool,
}

/// A pod deleted gracefully, whose final deletion the sweep makes when its grace period is over.
pub(super) struct GracefulPod {
    pub deadline: Instant,
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

pub(super) struct State {
    pub rv: u64,
    /// Changes kept per resource for watches that resume from a resourceVersion.
    history_limit: usize,
    pub buckets: HashMap<&'static str, Bucket>,
    pub pages: VecDeque<(u64, Arc<Page>)>,
    next_page: u64,
    pub graceful: Vec<GracefulPod>,
}

fn object_key(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

impl State {
    pub fn new(history_limit: usize) -> Self {
        State {
            rv: 0,
            history_limit,
            buckets: HashMap::new(),
            pages: VecDeque::new(),
            next_page: 0,
            graceful: Vec::new(),
        }
    }

    pub fn bucket(&mut self, kind: &Kind) -> &mut Bucket {
        self.buckets.entry(kind.plural).or_default()
    }

    pub fn get(&self, kind: &Kind, namespace: &str, name: &str) -> Option<Arc<Value>> {
        self.buckets
            .get(kind.plural)?
            .objects
            .get(&object_key(namespace, name))
            .cloned()
    }

    /// Objects in `namespace` (all when None) that pass `filter`; a namespace is a range of the key order.
    pub fn select(&self, kind: &Kind, namespace: Option<&str>, filter: &Filter) -> Vec<Arc<Value>> {
        let Some(bucket) = self.buckets.get(kind.plural) else {
            return Vec::new();
        };
        let matching = |object: &&Arc<Value>| filter.matches(object);
        match namespace {
            Some(namespace) => {
                let prefix = format!("{namespace}/");
                bucket
                    .objects
                    .range(prefix.clone()..)
                    .take_while(|(key, _)| key.starts_with(&prefix))
                    .map(|(_, object)| object)
                    .filter(matching)
                    .cloned()
                    .collect()
            }
            None => bucket.objects.values().filter(matching).cloned().collect(),
        }
    }

    /// Stores a write under a new resourceVersion, records it and hands it to the watchers.
    pub fn commit(
        &mut self,
        kind: &Kind,
        event: EventType,
        mut object: Value,
        previous: Option<Arc<Value>>,
    ) -> Arc<Value> {
        self.rv += 1;
        let rv = self.rv;
        meta_mut(&mut object).insert("resourceVersion".into(), rv.to_string().into());
        let key = object_key(namespace_of(&object), name_of(&object));
        let object = Arc::new(object);
        let history_limit = self.history_limit;
        let bucket = self.bucket(kind);
        if event == EventType::Deleted {
            bucket.objects.remove(&key);
        } else {
            bucket.objects.insert(key, object.clone());
        }
        let change = Arc::new(Change {
            event,
            rv,
            object: object.clone(),
            previous,
        });
        bucket.history.push_back(change.clone());
        if bucket.history.len() > history_limit
            && let Some(dropped) = bucket.history.pop_front()
        {
            bucket.compacted = dropped.rv;
        }
        // A full channel means a watcher too far behind: dropping its sender ends its watch.
        bucket
            .watchers
            .retain(|watcher| watcher.try_send(change.clone()).is_ok());
        object
    }

    /// Ends every open watch (their channels close).
    pub fn end_watches(&mut self) {
        for bucket in self.buckets.values_mut() {
            bucket.watchers.clear();
        }
    }

    pub fn save_page(&mut self, page: Arc<Page>) -> u64 {
        self.next_page += 1;
        self.pages.push_back((self.next_page, page));
        if self.pages.len() > LIST_SNAPSHOTS {
            self.pages.pop_front();
        }
        self.next_page
    }

    /// Custom resources exist only while their CRD does.
    pub fn served(&self, kind: &Kind) -> bool {
        !kind.is_custom() || self.get(kind_of(Special::Crd), "", &kind.crd_name()).is_some()
    }
}
