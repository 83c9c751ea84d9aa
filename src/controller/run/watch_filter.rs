//! What of the watches reaches the controllers, and how soon a failed watch is retried.
//!
//! - `changed_or_deleted`: objects whose relevant state changed, and every deletion. kube-runtime's
//!   `predicate_filter` compares a deleted object with its last state and drops the deletion when nothing
//!   relevant changed in between; a pod that goes without a last status change (force deleted, or never
//!   scheduled) would then wake nobody.
//! - `without_errors`: a watch error never reaches a controller (see there).
//! - `watch_backoff`: each watch's own retry pace.

use std::collections::HashMap;
use std::time::Duration;

use futures::{Stream, StreamExt, future};
use kube::Resource;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;

pub fn changed_or_deleted<K, S>(
    events: S,
    relevant: impl Fn(&K) -> u64,
) -> impl Stream<Item = Result<K, watcher::Error>>
where
    K: Resource + Clone,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
    S: Stream<Item = Result<watcher::Event<K>, watcher::Error>>,
{
    let mut seen: HashMap<ObjectRef<K>, u64> = HashMap::new();
    events.filter_map(move |event| {
        let passed = match event {
            Ok(watcher::Event::Apply(object) | watcher::Event::InitApply(object)) => {
                let state = relevant(&object);
                let before = seen.insert(ObjectRef::from_obj(&object), state);
                (before != Some(state)).then_some(Ok(object))
            }
            Ok(watcher::Event::Delete(object)) => {
                seen.remove(&ObjectRef::from_obj(&object));
                Some(Ok(object))
            }
            Ok(watcher::Event::Init | watcher::Event::InitDone) => None,
            Err(err) => Some(Err(err)),
        };
        future::ready(passed)
    })
}

/// Drops watch errors; they are recorded (health, logs) before this point, and each watch retries on its own
/// backoff. kube-runtime's `Controller` puts its whole merged trigger stream into one backoff on any error it
/// sees (client-go's pace: up to 30 s), and that stream also carries the bulk reconcile on becoming the active
/// replica and the keeper's wakes. Measured with 1,000 locks: after a one-minute API-server outage, the errors of
/// the failing watches held every status write for 9–87 s after the API server answered again.
pub fn without_errors<K>(
    events: impl Stream<Item = Result<K, watcher::Error>>,
) -> impl Stream<Item = Result<K, watcher::Error>> {
    events.filter(|event| future::ready(event.is_ok()))
}

/// How a failed watch is retried: from 200 ms doubling to 2 s, jittered, back to the start after two quiet
/// minutes. Quicker than client-go's 0.8–30 s, so the caches are current within seconds of an API server
/// answering again; at four watches per replica the retries cost the API server nothing worth saving.
pub fn watch_backoff() -> impl kube::runtime::utils::Backoff {
    let builder = backon::ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(200))
        .with_max_delay(Duration::from_secs(2))
        .with_factor(2.0)
        .with_jitter()
        .without_max_times();
    kube::runtime::utils::ResetTimerBackoff::new(
        watcher::ExponentialBackoff::from(builder),
        Duration::from_secs(120),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;

    fn map(name: &str, value: &str) -> ConfigMap {
        let mut map = ConfigMap::default();
        map.metadata.name = Some(name.into());
        map.data = Some([("v".to_owned(), value.to_owned())].into());
        map
    }

    #[tokio::test]
    async fn errors_never_reach_a_controller() {
        let events = futures::stream::iter(vec![
            Ok(map("a", "x")),
            Err(watcher::Error::NoResourceVersion),
            Ok(map("b", "x")),
        ]);
        let passed: Vec<Result<ConfigMap, watcher::Error>> = without_errors(events).collect().await;
        assert_eq!(passed.len(), 2);
        assert!(passed.iter().all(Result::is_ok));
    }

    #[test]
    fn a_failed_watch_is_retried_within_two_seconds() {
        let mut backoff = watch_backoff();
        for _ in 0..20 {
            let delay = backoff.next().unwrap_or_default();
            // Jitter adds up to one delay on top.
            assert!(delay <= Duration::from_secs(4), "{delay:?}");
        }
    }

    #[tokio::test]
    async fn unchanged_updates_are_dropped_and_deletions_always_pass() {
        let value = |map: &ConfigMap| map.data.as_ref().map_or(0, |data| data["v"].len() as u64);
        let events = futures::stream::iter(vec![
            Ok(watcher::Event::Init),
            Ok(watcher::Event::InitApply(map("a", "x"))),
            Ok(watcher::Event::InitDone),
            Ok(watcher::Event::Apply(map("a", "y"))),
            Ok(watcher::Event::Apply(map("a", "yy"))),
            Ok(watcher::Event::Delete(map("a", "yy"))),
            Ok(watcher::Event::Apply(map("a", "yy"))),
        ]);
        let passed: Vec<String> = changed_or_deleted(events, value)
            .map(|event| {
                event
                    .map(|map| map.data.unwrap_or_default()["v"].clone())
                    .unwrap_or_default()
            })
            .collect()
            .await;
        assert_eq!(
            passed,
            ["x", "yy", "yy", "yy"],
            "y has the length of x; a recreated object passes"
        );
    }
}
