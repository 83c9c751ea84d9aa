//! Kubernetes Events, published as kube-runtime's `Recorder` publishes them (the same Events, names, series
//! and verbs: `create` and `patch` on `events.k8s.io` events) but with a series cache whose cost per Event
//! does not grow with the Events of the last six minutes (see [`series`]).

mod body;
pub mod series;

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event as K8sEvent;
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
pub use kube::runtime::events::{Event, EventType, Reporter};

use series::{NoteDigest, Publication, SERIES_CAPACITY, SERIES_TTL, SeriesCache, SeriesKey};

/// Publishes Events about any object; clones share the series cache.
#[derive(Clone)]
pub struct Recorder {
    client: Client,
    reporter: Reporter,
    series: Arc<Mutex<SeriesCache>>,
}

impl Recorder {
    pub fn new(client: Client, reporter: Reporter) -> Self {
        Self {
            client,
            reporter,
            series: Arc::new(Mutex::new(SeriesCache::new(SERIES_CAPACITY, SERIES_TTL))),
        }
    }

    /// Publishes an occurrence of `event` about `regarding`: a new Event, or the next count of its series.
    pub async fn publish(&self, event: &Event, regarding: &ObjectReference) -> Result<(), kube::Error> {
        let key = SeriesKey::new(event, regarding);
        let note = NoteDigest::of(event);
        let now = Timestamp::now();
        let api: Api<K8sEvent> = Api::namespaced(self.client.clone(), body::namespace(regarding));
        let publication = self.series().observe(&key, note, Instant::now(), || {
            body::event_name(regarding, &self.reporter, now)
        });
        let name = match publication {
            Publication::Create { name } => name,
            Publication::Patch { name, count } => {
                let patch = Patch::Merge(body::series_patch(count, now));
                match api.patch(&name, &PatchParams::default(), &patch).await {
                    // The Event is gone (deleted, or expired on the API server): the series starts again.
                    Err(kube::Error::Api(status)) if status.code == 404 => {
                        let new_name = body::event_name(regarding, &self.reporter, now);
                        self.series().start(&key, note, new_name.clone(), Instant::now());
                        new_name
                    }
                    other => return other.map(drop),
                }
            }
        };
        let new_event = body::new_event(event, regarding, &self.reporter, name.clone(), now);
        let created = api.create(&PostParams::default(), &new_event).await;
        if created.is_err() {
            // Nothing carries the series: the next occurrence tries a new Event again.
            self.series().forget(&key, &name);
        }
        created.map(drop)
    }

    fn series(&self) -> MutexGuard<'_, SeriesCache> {
        self.series
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}
