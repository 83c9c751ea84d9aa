//! Passes on the watch events a controller must react to: objects whose relevant state changed, and every
//! deletion. kube-runtime's `predicate_filter` compares a deleted object with its last state and drops the
//! deletion when nothing relevant changed in between; a pod that goes without a last status change (force
//! deleted, or never scheduled) would then wake nobody.

use std::collections::HashMap;

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
