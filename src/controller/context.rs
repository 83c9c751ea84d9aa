//! What every reconciler shares: the API client, the caches, the engines, the keeper and the leadership gate. What
//! one controller alone keeps is in its own context, built around this one in `run/` (`lock::controller_state`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::Resource;
use kube::runtime::controller::Action;
use kube::runtime::reflector::{ObjectRef, Store};

use super::cache::pod_index::PodIndex;
use super::engines::Engines;
use super::error::Error;
use super::installation_secret::InstallationSecret;
use super::keeper::Keeper;
use super::replica_lease::Leadership;
use crate::api::{DistributedLock, RedisQuorum};
use crate::telemetry::events::{Event, EventType, Recorder};
use crate::telemetry::metrics::Metrics;

pub struct Context {
    /// Sends no write while this replica is not the active one (`replica_lease::write_guard`).
    pub client: Client,
    pub engines: Arc<Engines>,
    pub keeper: Arc<Keeper>,
    pub leadership: Arc<Leadership>,
    pub metrics: Arc<Metrics>,
    pub recorder: Recorder,
    pub secret: InstallationSecret,
    /// The one namespace quorum Secrets are read from.
    pub secrets_namespace: String,
    /// This installation's name: the locks it keeps carry it (`lock::claim`).
    pub installation: String,
    /// The label selector that limits the RedisQuorums this installation looks at (`--quorum-selector`), if any:
    /// a lock naming a quorum outside it is told so, not only that the quorum does not exist.
    pub quorum_selector: Option<String>,
    /// How often quorum health is checked and written.
    pub health_interval: Duration,
    pub locks: Store<DistributedLock>,
    pub quorums: Store<RedisQuorum>,
    /// Pods, for leader election and Job fencing.
    pub pods: Store<Pod>,
    /// `pods` by namespace and label.
    pub pod_index: Arc<PodIndex>,
    /// Jobs labelled `redlock.io/lock`, for Job fencing.
    pub jobs: Store<Job>,
    /// Consecutive failures per object, for the error backoff.
    pub(super) failures: Mutex<HashMap<String, u32>>,
}

impl Context {
    /// Asks the lock reconciler to look at every lock on `quorum` now (its engine appeared, changed or went).
    pub fn wake_locks_on(&self, quorum: &str) {
        for lock in self
            .locks
            .state()
            .iter()
            .filter(|lock| lock.spec.quorum == quorum)
        {
            self.keeper.wake(ObjectRef::from_obj(&**lock));
        }
    }

    /// Whether a `RedisQuorum` of this name exists, or `None` while the quorum cache has not synced yet.
    pub fn quorum_exists(&self, name: &str) -> Option<bool> {
        synced(&self.quorums).then(|| self.quorums.get(&ObjectRef::new(name)).is_some())
    }

    /// Whether every watch cache a lock's reconciliation reads has received its whole initial list. Before that, a
    /// Job or pod missing from a cache may only be not listed yet: nothing is decided on it.
    pub fn caches_synced(&self) -> bool {
        synced(&self.locks)
            && synced(&self.quorums)
            && synced(&self.pods)
            && self.pod_index.is_synced()
            && synced(&self.jobs)
    }

    /// The check before a step that writes to the masters (an acquisition, a resume, a release). API writes need
    /// none: `client` refuses them itself while this replica is not active (`replica_lease::write_guard`).
    pub fn ensure_leader(&self) -> Result<(), Error> {
        if self.leadership.is_leader() {
            Ok(())
        } else {
            Err(Error::NotLeader)
        }
    }

    /// Publishes an Event; failures are logged, never fatal (an Event is a courtesy, not state).
    pub async fn publish<K: Resource<DynamicType = ()>>(
        &self,
        object: &K,
        type_: EventType,
        reason: &str,
        note: String,
    ) {
        self.publish_action(object, type_, reason, reason.to_owned(), note)
            .await;
    }

    /// [`Context::publish`] with an action of its own: Events of one reason, action and note about one object
    /// form a series (a count rises), so what must stay apart, one permit's story from
    /// another's, is told under actions of its own.
    pub async fn publish_action<K: Resource<DynamicType = ()>>(
        &self,
        object: &K,
        type_: EventType,
        reason: &str,
        action: String,
        note: String,
    ) {
        if !self.leadership.is_leader() {
            return;
        }
        let event = Event {
            type_,
            reason: reason.to_owned(),
            note: Some(truncate(note, 1000)),
            action,
            secondary: None,
        };
        if let Err(err) = self.recorder.publish(&event, &object.object_ref(&())).await {
            tracing::debug!(error = %err, reason, "could not publish an event");
        }
    }

    /// The error policy: exponential backoff per object (1 s doubling to 5 min), never a hot loop.
    pub fn backoff<K: Resource<DynamicType = ()>>(
        &self,
        object: &ObjectRef<K>,
        error: &Error,
        resource: &str,
    ) -> Action {
        if matches!(error, Error::NotLeader) {
            return Action::await_change();
        }
        self.metrics.reconcile_error(resource, error.metric_label());
        let mut failures = self
            .failures
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let count = failures.entry(object.to_string()).or_insert(0);
        *count = count.saturating_add(1);
        let delay = Duration::from_secs(1u64 << (*count - 1).min(8)).min(Duration::from_secs(300));
        tracing::warn!(object = %object, error = %error, retry_in_s = delay.as_secs(), "reconcile failed");
        Action::requeue(delay)
    }

    /// Forgets the object's failures: it reconciled, or it is gone.
    pub fn succeeded<K: Resource<DynamicType = ()>>(&self, object: &ObjectRef<K>) {
        let mut failures = self
            .failures
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if !failures.is_empty() {
            failures.remove(&object.to_string());
        }
    }
}

/// Whether a reflector's store has received its watch's whole initial list.
fn synced<K>(store: &Store<K>) -> bool
where
    K: Resource + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    use futures::FutureExt;
    store
        .wait_until_ready()
        .now_or_never()
        .is_some_and(|ready| ready.is_ok())
}

fn truncate(mut text: String, max: usize) -> String {
    if text.len() > max {
        let mut end = max;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    text
}
