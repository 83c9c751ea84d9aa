//! What is sent for an occurrence: a new `events.k8s.io/v1` Event, or a merge patch of its series.

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::{Event as K8sEvent, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::runtime::events::{Event, EventType, Reporter};

/// The namespace an Event about `regarding` lives in: the object's own, `default` for a cluster-scoped one.
pub fn namespace(regarding: &ObjectReference) -> &str {
    regarding.namespace.as_deref().unwrap_or("default")
}

/// `<object name>.<nanoseconds since the epoch, hex>`, as kube-runtime names its Events.
pub fn event_name(regarding: &ObjectReference, reporter: &Reporter, now: Timestamp) -> String {
    let object = regarding.name.as_deref().unwrap_or(&reporter.controller);
    format!("{object}.{:x}", now.as_nanosecond())
}

/// A new Event, field for field what kube-runtime's recorder creates.
pub fn new_event(
    event: &Event,
    regarding: &ObjectReference,
    reporter: &Reporter,
    name: String,
    now: Timestamp,
) -> K8sEvent {
    K8sEvent {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: regarding.namespace.clone(),
            ..ObjectMeta::default()
        },
        action: Some(event.action.clone()),
        reason: Some(event.reason.clone()),
        note: event.note.clone(),
        type_: Some(
            match event.type_ {
                EventType::Normal => "Normal",
                EventType::Warning => "Warning",
            }
            .to_owned(),
        ),
        event_time: Some(MicroTime(now)),
        regarding: Some(regarding.clone()),
        related: event.secondary.clone(),
        reporting_controller: Some(reporter.controller.clone()),
        reporting_instance: Some(
            reporter
                .instance
                .clone()
                .unwrap_or_else(|| reporter.controller.clone()),
        ),
        series: None,
        deprecated_count: None,
        deprecated_first_timestamp: None,
        deprecated_last_timestamp: None,
        deprecated_source: None,
    }
}

/// The merge patch that makes an Event's series `count` occurrences, the last at `now`. Only the series
/// changes (client-go's recorder patches the same); kube-runtime's sends the whole first Event again, which
/// leaves every other field as it was.
pub fn series_patch(count: i32, now: Timestamp) -> serde_json::Value {
    serde_json::json!({
        "series": EventSeries {
            count,
            last_observed_time: MicroTime(now),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reporter(instance: Option<&str>) -> Reporter {
        Reporter {
            controller: "redlock-operator".into(),
            instance: instance.map(str::to_owned),
        }
    }

    fn quorum() -> ObjectReference {
        ObjectReference {
            api_version: Some("redlock.io/v1beta1".into()),
            kind: Some("RedisQuorum".into()),
            name: Some("default".into()),
            uid: Some("u1".into()),
            ..Default::default()
        }
    }

    fn lost() -> Event {
        Event {
            type_: EventType::Warning,
            reason: "Lost".into(),
            note: Some("the lock was lost".into()),
            action: "Lost".into(),
            secondary: None,
        }
    }

    #[test]
    fn a_new_event_says_who_reports_what_about_which_object() {
        let now = Timestamp::from_second(1_800_000_000).unwrap();
        let lock = ObjectReference {
            namespace: Some("team".into()),
            kind: Some("DistributedLock".into()),
            name: Some("a".into()),
            ..Default::default()
        };
        let body = new_event(&lost(), &lock, &reporter(Some("pod-1")), "a.1".into(), now);
        let json = serde_json::to_value(&body).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "apiVersion": "events.k8s.io/v1", "kind": "Event",
                "metadata": { "name": "a.1", "namespace": "team" },
                "action": "Lost", "reason": "Lost", "note": "the lock was lost", "type": "Warning",
                "eventTime": "2027-01-15T08:00:00.000000Z",
                "regarding": { "kind": "DistributedLock", "name": "a", "namespace": "team" },
                "reportingController": "redlock-operator", "reportingInstance": "pod-1",
            })
        );
    }

    #[test]
    fn a_cluster_scoped_object_s_events_live_in_default_and_the_instance_defaults_to_the_controller() {
        let now = Timestamp::from_second(1_800_000_000).unwrap();
        let body = new_event(&lost(), &quorum(), &reporter(None), "default.1".into(), now);
        assert_eq!(namespace(&quorum()), "default");
        // Left out of the body: the API server takes the namespace from the path.
        assert_eq!(body.metadata.namespace, None);
        assert_eq!(body.reporting_instance.as_deref(), Some("redlock-operator"));
        assert_eq!(body.related, None);
    }

    #[test]
    fn names_are_the_object_s_and_the_time_in_hex_nanoseconds() {
        let now = Timestamp::from_nanosecond(0x1234_5678_9abc).unwrap();
        assert_eq!(
            event_name(&quorum(), &reporter(None), now),
            "default.123456789abc"
        );
        let unnamed = ObjectReference::default();
        assert_eq!(
            event_name(&unnamed, &reporter(None), now),
            "redlock-operator.123456789abc"
        );
    }

    #[test]
    fn the_series_patch_carries_the_count_and_the_last_occurrence_alone() {
        let now = Timestamp::from_second(1_800_000_000).unwrap();
        assert_eq!(
            series_patch(3, now),
            serde_json::json!({
                "series": { "count": 3, "lastObservedTime": "2027-01-15T08:00:00.000000Z" }
            })
        );
    }
}
