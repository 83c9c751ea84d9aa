//! The in-process test API server, through kube's own client and runtime only: what the end-to-end tests
//! rely on must behave as on a real API server.

mod support;

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::ByteString;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, PodSpec, Secret};
use k8s_openapi::api::events::v1::Event as EventsV1Event;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use kube::core::ObjectMeta;
use kube::core::{ApiResource, DynamicObject};
use kube::runtime::reflector;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, CustomResourceExt, Resource, ResourceExt};
use redlock_operator::api::{DistributedLock, RedisQuorum};
use redlock_operator::telemetry::events::{Event as RecorderEvent, EventType, Recorder, Reporter};
use serde_json::json;
use support::apiserver::realism::{Jitter, Realism, seed_from};
use support::apiserver::{PodGc, TestApiServer};
use support::fixtures::{identity_lock as lock, install_crds};
use tokio::time::Instant;

const UPPER_BOUND: Duration = Duration::from_secs(10);

/// A Secret: the plain built-in kind here (no status, no generation, unconditional PUT allowed).
fn secret(name: &str, labels: &[(&str, &str)]) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(
                labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            ..ObjectMeta::default()
        },
        string_data: Some(BTreeMap::from([("key".to_string(), "value".to_string())])),
        ..Secret::default()
    }
}

/// A suspended Job that never started, with one container.
fn suspended_job(name: &str) -> Job {
    serde_json::from_value(json!({
        "metadata": { "name": name },
        "spec": { "suspend": true, "template": { "spec": {
            "restartPolicy": "Never", "containers": [{ "name": "main", "image": "busybox:1.36" }]
        } } }
    }))
    .expect("a Job")
}

async fn started() -> (TestApiServer, Client) {
    with_crds(TestApiServer::start().await).await
}

async fn started_with(realism: Realism) -> (TestApiServer, Client) {
    with_crds(TestApiServer::start_with(realism).await).await
}

async fn with_crds(server: TestApiServer) -> (TestApiServer, Client) {
    let client = server.client();
    install_crds(&client).await;
    (server, client)
}

/// A client that does not retry, to see what the server answers.
fn no_retry_client(server: &TestApiServer) -> Client {
    let mut config = kube::Config::new(server.url().parse().unwrap());
    config.default_retry = false;
    Client::try_from(config).unwrap()
}

fn api_error(result: Result<impl std::fmt::Debug, kube::Error>) -> (u16, String) {
    match result {
        Err(kube::Error::Api(status)) => (status.code, status.reason.clone()),
        other => panic!("expected an API error, got {other:?}"),
    }
}

/// Polls `check` until it holds; the timeout is only an upper bound.
async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + UPPER_BOUND;
    while !check().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A node to bind pods to: the server's pod garbage collector deletes pods bound to a node that does not exist.
async fn register_node(client: &Client, name: &str) {
    let node: Node = serde_json::from_value(json!({ "metadata": { "name": name } })).unwrap();
    Api::<Node>::all(client.clone())
        .create(&PostParams::default(), &node)
        .await
        .unwrap();
}

fn names<K: ResourceExt>(items: impl IntoIterator<Item = K>) -> Vec<String> {
    let mut names: Vec<String> = items.into_iter().map(|o| o.name_any()).collect();
    names.sort();
    names
}

#[tokio::test]
async fn create_get_list_with_selectors() {
    let (_server, client) = started().await;
    let default: Api<Secret> = Api::default_namespaced(client.clone());
    let other: Api<Secret> = Api::namespaced(client.clone(), "other");
    let pp = PostParams::default();
    default
        .create(&pp, &secret("a", &[("app", "x"), ("tier", "web")]))
        .await
        .unwrap();
    default.create(&pp, &secret("b", &[("app", "y")])).await.unwrap();
    default.create(&pp, &secret("c", &[])).await.unwrap();
    other.create(&pp, &secret("a", &[("app", "x")])).await.unwrap();

    let got = default.get("a").await.unwrap();
    assert_eq!(got.metadata.namespace.as_deref(), Some("default"));
    assert!(got.metadata.uid.is_some() && got.metadata.creation_timestamp.is_some());
    assert!(
        got.metadata.generation.is_none(),
        "Secrets do not track generation"
    );

    let list = |api: Api<Secret>, lp: ListParams| async move { names(api.list(&lp).await.unwrap()) };
    let labels = |s: &str| ListParams::default().labels(s);
    assert_eq!(list(default.clone(), labels("app=x")).await, ["a"]);
    assert_eq!(list(default.clone(), labels("app!=x")).await, ["b", "c"]);
    assert_eq!(list(default.clone(), labels("app in (x,y),tier")).await, ["a"]);
    assert_eq!(list(default.clone(), labels("app notin (x)")).await, ["b", "c"]);
    assert_eq!(list(default.clone(), labels("app")).await, ["a", "b"]);
    assert_eq!(list(default.clone(), labels("!app")).await, ["c"]);
    let all: Api<Secret> = Api::all(client.clone());
    assert_eq!(list(all.clone(), labels("app=x")).await, ["a", "a"]);
    let fields = |s: &str| ListParams::default().fields(s);
    assert_eq!(list(all.clone(), fields("metadata.namespace=other")).await, ["a"]);
    assert_eq!(list(all.clone(), fields("metadata.name!=a")).await, ["b", "c"]);
    let (code, _) = api_error(all.list(&fields("data.key=value")).await);
    assert_eq!(code, 400, "unsupported field labels are refused");

    // limit/continue pages through one consistent snapshot.
    let first = default.list(&ListParams::default().limit(2)).await.unwrap();
    assert_eq!(first.items.len(), 2);
    assert_eq!(first.metadata.remaining_item_count, Some(1));
    let token = first.metadata.continue_.clone().expect("a continue token");
    let rest = default
        .list(&ListParams::default().limit(2).continue_token(&token))
        .await
        .unwrap();
    assert_eq!(names(first.items.into_iter().chain(rest.items)), ["a", "b", "c"]);
    assert!(rest.metadata.continue_.is_none_or(|c| c.is_empty()));
    assert!(rest.metadata.resource_version.is_some());
    let (code, _) = api_error(default.list(&ListParams::default().continue_token("99:1")).await);
    assert_eq!(code, 410, "an unknown continue token has expired");

    let (code, reason) = api_error(default.create(&pp, &secret("a", &[])).await);
    assert_eq!((code, reason.as_str()), (409, "AlreadyExists"));
    let (code, reason) = api_error(default.get("missing").await);
    assert_eq!((code, reason.as_str()), (404, "NotFound"));
    assert!(default.get_opt("missing").await.unwrap().is_none());

    let generated = Secret {
        metadata: ObjectMeta {
            generate_name: Some("gen-".into()),
            ..ObjectMeta::default()
        },
        ..Secret::default()
    };
    let created = default.create(&pp, &generated).await.unwrap();
    assert!(created.name_any().starts_with("gen-") && created.name_any().len() == 9);

    // stringData is write-only: folded into data.
    let stored = default.get("a").await.unwrap();
    assert!(stored.string_data.is_none());
    assert_eq!(
        stored.data.unwrap().get("key"),
        Some(&ByteString(b"value".to_vec()))
    );

    let mut versioned = secret("versioned", &[]);
    versioned.metadata.resource_version = Some("1".into());
    let (code, _) = api_error(default.create(&pp, &versioned).await);
    assert_eq!(
        code, 500,
        "a resourceVersion on create is the storage layer's error"
    );
}

#[tokio::test]
async fn stale_resource_versions_conflict() {
    let (_server, client) = started().await;
    let secrets: Api<Secret> = Api::default_namespaced(client.clone());
    let created = secrets
        .create(&PostParams::default(), &secret("s", &[]))
        .await
        .unwrap();
    let mut fresh = created.clone();
    fresh.data = Some(BTreeMap::from([("key".into(), ByteString(b"v2".to_vec()))]));
    let updated = secrets
        .replace("s", &PostParams::default(), &fresh)
        .await
        .unwrap();
    assert_ne!(updated.resource_version(), created.resource_version());

    // `created` is now stale.
    let (code, reason) = api_error(secrets.replace("s", &PostParams::default(), &created).await);
    assert_eq!((code, reason.as_str()), (409, "Conflict"));
    let stale =
        json!({"metadata": {"resourceVersion": created.resource_version()}, "stringData": {"key": "v3"}});
    let (code, _) = api_error(
        secrets
            .patch("s", &PatchParams::default(), &Patch::Merge(&stale))
            .await,
    );
    assert_eq!(code, 409, "a resourceVersion in a patch is a precondition");
    let current =
        json!({"metadata": {"resourceVersion": updated.resource_version()}, "stringData": {"key": "v3"}});
    secrets
        .patch("s", &PatchParams::default(), &Patch::Merge(&current))
        .await
        .unwrap();

    // Secrets allow an unconditional PUT; custom resources do not.
    let mut unconditional = secrets.get("s").await.unwrap();
    unconditional.metadata.resource_version = None;
    secrets
        .replace("s", &PostParams::default(), &unconditional)
        .await
        .unwrap();
    let mut other_uid = secrets.get("s").await.unwrap();
    other_uid.metadata.uid = Some("00000000-0000-4000-8000-000000000000".into());
    let (code, reason) = api_error(secrets.replace("s", &PostParams::default(), &other_uid).await);
    assert_eq!(
        (code, reason.as_str()),
        (409, "Conflict"),
        "a uid in the body is a precondition"
    );
    let leases: Api<Lease> = Api::default_namespaced(client.clone());
    let mut lease = leases
        .create(
            &PostParams::default(),
            &Lease {
                metadata: ObjectMeta {
                    name: Some("lease".into()),
                    ..ObjectMeta::default()
                },
                ..Lease::default()
            },
        )
        .await
        .unwrap();
    lease.metadata.resource_version = None;
    let (code, _) = api_error(leases.replace("lease", &PostParams::default(), &lease).await);
    assert_eq!(code, 422, "leases need a resourceVersion to be replaced");
    let locks: Api<DistributedLock> = Api::default_namespaced(client);
    let mut dl = locks.create(&PostParams::default(), &lock("l")).await.unwrap();
    dl.metadata.resource_version = None;
    let (code, reason) = api_error(locks.replace("l", &PostParams::default(), &dl).await);
    assert_eq!((code, reason.as_str()), (422, "Invalid"));
}

#[tokio::test]
async fn status_subresource_and_generation() {
    let (_server, client) = started().await;
    let locks: Api<DistributedLock> = Api::default_namespaced(client);
    let mut with_status = lock("l");
    with_status.status = Some(serde_json::from_value(json!({"holder": "sneaky"})).unwrap());
    let created = locks.create(&PostParams::default(), &with_status).await.unwrap();
    assert!(
        created.status.is_none(),
        "create drops the status of a resource with a status subresource"
    );
    assert_eq!(created.metadata.generation, Some(1));

    let pp = PatchParams::default();
    let status = json!({"status": {"holder": "me", "fencingToken": 7}});
    let written = locks
        .patch_status("l", &pp, &Patch::Merge(&status))
        .await
        .unwrap();
    assert_eq!(
        written.status.as_ref().and_then(|s| s.holder.as_deref()),
        Some("me")
    );
    assert_eq!(
        written.metadata.generation,
        Some(1),
        "status writes leave generation alone"
    );
    assert!(written.resource_version() != created.resource_version());

    // The main resource ignores status; metadata changes do not bump generation; spec changes do.
    let labelled = json!({"metadata": {"labels": {"a": "b"}}, "status": {"holder": "other"}});
    let after = locks.patch("l", &pp, &Patch::Merge(&labelled)).await.unwrap();
    assert_eq!(
        after.status.as_ref().and_then(|s| s.holder.as_deref()),
        Some("me")
    );
    assert_eq!(after.metadata.generation, Some(1));
    let spec = json!({"spec": {"ttl": "20s"}});
    let after = locks.patch("l", &pp, &Patch::Merge(&spec)).await.unwrap();
    assert_eq!(after.metadata.generation, Some(2));

    // /status of a custom resource changes nothing but status.
    let sneaky =
        json!({"metadata": {"labels": {"c": "d"}}, "spec": {"ttl": "30s"}, "status": {"holder": "you"}});
    let after = locks
        .patch_status("l", &pp, &Patch::Merge(&sneaky))
        .await
        .unwrap();
    assert_eq!(after.spec.ttl, "20s");
    assert!(!after.labels().contains_key("c"));
    assert_eq!(
        after.status.as_ref().and_then(|s| s.holder.as_deref()),
        Some("you")
    );

    // A write that changes nothing stores nothing.
    let again = locks
        .patch_status("l", &pp, &Patch::Merge(&sneaky))
        .await
        .unwrap();
    assert_eq!(again.resource_version(), after.resource_version());
}

#[tokio::test]
async fn finalizers_hold_deletion() {
    let (_server, client) = started().await;
    let secrets: Api<Secret> = Api::default_namespaced(client);
    let mut object = secret("s", &[]);
    object.metadata.finalizers = Some(vec!["test/one".into()]);
    secrets.create(&PostParams::default(), &object).await.unwrap();

    let pending = secrets.delete("s", &DeleteParams::default()).await.unwrap();
    let pending = pending.left().expect("the object while finalizers are pending");
    assert!(pending.metadata.deletion_timestamp.is_some());
    assert_eq!(pending.metadata.deletion_grace_period_seconds, Some(0));

    let add = json!({"metadata": {"finalizers": ["test/one", "test/two"]}});
    let (code, _) = api_error(
        secrets
            .patch("s", &PatchParams::default(), &Patch::Merge(&add))
            .await,
    );
    assert_eq!(code, 422, "no new finalizers once deletion started");

    // The way kube_runtime's finalizer helper removes its finalizer.
    let remove: json_patch::Patch = serde_json::from_value(json!([
        {"op": "test", "path": "/metadata/finalizers/0", "value": "test/one"},
        {"op": "remove", "path": "/metadata/finalizers/0"},
    ]))
    .unwrap();
    secrets
        .patch("s", &PatchParams::default(), &Patch::Json::<()>(remove))
        .await
        .unwrap();
    assert!(
        secrets.get_opt("s").await.unwrap().is_none(),
        "gone with its last finalizer"
    );

    // Without finalizers, a delete removes at once and answers with a Status.
    secrets
        .create(&PostParams::default(), &secret("plain", &[]))
        .await
        .unwrap();
    let status = secrets.delete("plain", &DeleteParams::default()).await.unwrap();
    assert!(status.right().is_some());
    assert!(secrets.get_opt("plain").await.unwrap().is_none());
}

#[tokio::test]
async fn json_patch_test_operations() {
    let (_server, client) = started().await;
    let locks: Api<DistributedLock> = Api::default_namespaced(client);
    locks.create(&PostParams::default(), &lock("l")).await.unwrap();
    let patch = |ops: serde_json::Value| Patch::Json::<()>(serde_json::from_value(ops).unwrap());
    let pp = PatchParams::default();

    let failing = patch(json!([
        {"op": "test", "path": "/spec/ttl", "value": "99s"},
        {"op": "replace", "path": "/spec/ttl", "value": "1s"},
    ]));
    let (code, _) = api_error(locks.patch("l", &pp, &failing).await);
    assert_eq!(code, 422);
    assert_eq!(locks.get("l").await.unwrap().spec.ttl, "10s");

    // As with the Go library the real server uses, a missing member tests equal to null: this is how
    // kube_runtime's finalizer helper adds the first finalizer.
    let add_first = patch(json!([
        {"op": "test", "path": "/metadata/finalizers", "value": null},
        {"op": "add", "path": "/metadata/finalizers", "value": ["redlock.io/cleanup"]},
    ]));
    let after = locks.patch("l", &pp, &add_first).await.unwrap();
    assert_eq!(after.finalizers(), ["redlock.io/cleanup"]);
}

#[tokio::test]
async fn server_side_apply_creates_and_updates() {
    let (_server, client) = started().await;
    let quorums: Api<RedisQuorum> = Api::all(client);
    let applied = json!({
        "apiVersion": "redlock.io/v1alpha1", "kind": "RedisQuorum",
        "metadata": {"name": "default", "labels": {"a": "1"}},
        "spec": {"endpoints": ["redis://r1:6379", "redis://r2:6379", "redis://r3:6379"]},
    });
    let (code, _) = api_error(
        quorums
            .patch("default", &PatchParams::default(), &Patch::Apply(&applied))
            .await,
    );
    assert_eq!(code, 422, "server-side apply needs a field manager");

    let ssa = PatchParams::apply("test").force();
    let created = quorums
        .patch("default", &ssa, &Patch::Apply(&applied))
        .await
        .unwrap();
    assert_eq!(created.spec.endpoints.len(), 3);
    assert_eq!(created.metadata.generation, Some(1));

    let changed = json!({
        "apiVersion": "redlock.io/v1alpha1", "kind": "RedisQuorum",
        "metadata": {"name": "default", "labels": {"b": "2"}},
        "spec": {"endpoints": ["redis://r1:6379"]},
    });
    let updated = quorums
        .patch("default", &ssa, &Patch::Apply(&changed))
        .await
        .unwrap();
    assert_eq!(updated.spec.endpoints, ["redis://r1:6379"]);
    assert_eq!(updated.labels().get("b").map(String::as_str), Some("2"));
    assert_eq!(updated.metadata.generation, Some(2));

    let status = json!({
        "apiVersion": "redlock.io/v1alpha1", "kind": "RedisQuorum",
        "status": {"eligible": 1, "required": 1},
    });
    let with_status = quorums
        .patch_status("default", &ssa, &Patch::Apply(&status))
        .await
        .unwrap();
    assert_eq!(with_status.status.and_then(|s| s.eligible), Some(1));
}

#[tokio::test]
async fn recorder_publishes_events_as_series_and_starts_again_when_one_is_gone() {
    let (_server, client) = started().await;
    let secrets: Api<Secret> = Api::default_namespaced(client.clone());
    let object = secrets
        .create(&PostParams::default(), &secret("s", &[]))
        .await
        .unwrap();
    let reporter = Reporter {
        controller: "redlock-operator".into(),
        instance: None,
    };
    let recorder = Recorder::new(client.clone(), reporter);
    let event = |note: &str| RecorderEvent {
        type_: EventType::Normal,
        reason: "Acquired".into(),
        note: Some(note.into()),
        action: "Acquire".into(),
        secondary: None,
    };
    let reference = object.object_ref(&());
    let events: Api<EventsV1Event> = Api::default_namespaced(client.clone());
    recorder
        .publish(&event("lock acquired"), &reference)
        .await
        .unwrap();
    // The same event again becomes a series, sent as a merge patch.
    recorder
        .publish(&event("lock acquired"), &reference)
        .await
        .unwrap();
    let published = events.list(&ListParams::default()).await.unwrap().items;
    assert_eq!(published.len(), 1);
    let first = &published[0];
    assert_eq!(first.note.as_deref(), Some("lock acquired"));
    assert_eq!(first.series.as_ref().map(|s| s.count), Some(2));
    assert_eq!(first.reporting_controller.as_deref(), Some("redlock-operator"));
    assert_eq!(first.reporting_instance.as_deref(), Some("redlock-operator"));
    assert_eq!(first.type_.as_deref(), Some("Normal"));
    assert_eq!(
        first.regarding.as_ref().and_then(|r| r.uid.as_deref()),
        object.metadata.uid.as_deref()
    );
    // Another note is another cause: a new Event says it, instead of a third count under the first one's words.
    recorder
        .publish(&event("acquired again"), &reference)
        .await
        .unwrap();
    let published = events.list(&ListParams::default()).await.unwrap().items;
    assert_eq!(published.len(), 2);
    let latest = published
        .iter()
        .find(|event| event.name_any() != first.name_any())
        .expect("a second Event");
    assert_eq!(latest.note.as_deref(), Some("acquired again"));
    assert_eq!(latest.series, None);
    let unchanged = events.get(&first.name_any()).await.unwrap();
    assert_eq!(unchanged.series.map(|s| s.count), Some(2));

    // Gone from the API server (deleted, or expired there): the next occurrence is a new Event.
    events
        .delete(&latest.name_any(), &DeleteParams::default())
        .await
        .unwrap();
    recorder
        .publish(&event("acquired again"), &reference)
        .await
        .unwrap();
    let published = events.list(&ListParams::default()).await.unwrap().items;
    assert_eq!(published.len(), 2);
    let renewed = published
        .iter()
        .find(|event| event.name_any() != first.name_any())
        .expect("a new Event");
    assert_ne!(renewed.name_any(), latest.name_any());
    assert_eq!(renewed.note.as_deref(), Some("acquired again"));
    assert_eq!(renewed.series, None);
    recorder
        .publish(&event("acquired again"), &reference)
        .await
        .unwrap();
    let again = events.get(&renewed.name_any()).await.unwrap();
    assert_eq!(again.series.map(|s| s.count), Some(2));
}

#[tokio::test]
async fn fail_next_fails_exactly_n_requests() {
    let (server, client) = started().await;
    let secrets: Api<Secret> = Api::default_namespaced(client);
    secrets
        .create(&PostParams::default(), &secret("s", &[]))
        .await
        .unwrap();
    server.fail_next("get", "secrets", 500, 2);
    server.fail_next("patch", "secrets/status", 409, 1);
    let before = server.request_count("get", "secrets");
    assert_eq!(api_error(secrets.get("s").await).0, 500);
    assert_eq!(api_error(secrets.get("s").await).0, 500);
    secrets.get("s").await.expect("the third get succeeds");
    secrets
        .list(&ListParams::default())
        .await
        .expect("other verbs are unaffected");
    assert_eq!(server.request_count("get", "secrets") - before, 3);
    assert_eq!(server.request_count("list", "secrets"), 1);
    assert!(server.request_count("*", "*") >= 6);
}

#[tokio::test]
async fn pod_deletion_is_graceful_once_scheduled() {
    let (_server, client) = started().await;
    register_node(&client, "node-1").await;
    let pods: Api<Pod> = Api::default_namespaced(client);
    let pod = |name: &str, node: Option<&str>| Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            node_name: node.map(str::to_owned),
            ..PodSpec::default()
        }),
        ..Pod::default()
    };
    let created = pods
        .create(&PostParams::default(), &pod("scheduled", Some("node-1")))
        .await
        .unwrap();
    assert_eq!(created.status.and_then(|s| s.phase).as_deref(), Some("Pending"));

    let terminating = pods.delete("scheduled", &DeleteParams::default()).await.unwrap();
    let terminating = terminating.left().expect("pods answer with the pod");
    assert!(terminating.metadata.deletion_timestamp.is_some());
    assert_eq!(terminating.metadata.deletion_grace_period_seconds, Some(30));
    let still_there = pods.get("scheduled").await.unwrap();
    assert!(
        still_there.metadata.deletion_timestamp.is_some(),
        "terminating until the kubelet is done"
    );

    pods.delete("scheduled", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    assert!(pods.get_opt("scheduled").await.unwrap().is_none());

    // A pod never scheduled has no kubelet to wait for: it goes at once, as on a real server.
    pods.create(&PostParams::default(), &pod("unscheduled", None))
        .await
        .unwrap();
    pods.delete("unscheduled", &DeleteParams::default())
        .await
        .unwrap();
    assert!(pods.get_opt("unscheduled").await.unwrap().is_none());
}

#[tokio::test]
async fn a_started_jobs_template_is_immutable() {
    let (_server, client) = started().await;
    let jobs: Api<Job> = Api::default_namespaced(client);
    jobs.create(&PostParams::default(), &suspended_job("work"))
        .await
        .unwrap();
    let merge = |patch: serde_json::Value| Patch::Merge(patch);
    let annotate = |value: &str| {
        merge(json!({ "spec": { "template": { "metadata": { "annotations": { "a": value } } } } }))
    };
    let params = PatchParams::default();

    // Suspended and never started: labels, annotations and scheduling directives may change, nothing else.
    jobs.patch("work", &params, &annotate("1")).await.unwrap();
    let image = merge(
        json!({ "spec": { "template": { "spec": { "containers": [{ "name": "main", "image": "other" }] } } } }),
    );
    let refused = jobs.patch("work", &params, &image).await.unwrap_err();
    assert!(matches!(refused, kube::Error::Api(status) if status.code == 422));

    // Once started, nothing in the template may change, even while suspended again.
    jobs.patch_status(
        "work",
        &params,
        &merge(json!({ "status": { "startTime": "2026-01-01T00:00:00Z" } })),
    )
    .await
    .unwrap();
    let refused = jobs.patch("work", &params, &annotate("2")).await.unwrap_err();
    assert!(matches!(refused, kube::Error::Api(status) if status.code == 422));
    jobs.patch("work", &params, &merge(json!({ "spec": { "suspend": false } })))
        .await
        .unwrap();
}

#[tokio::test]
async fn raw_watch_sends_events_in_order() {
    let (_server, client) = started().await;
    let secrets: Api<Secret> = Api::default_namespaced(client);
    let list = secrets.list(&ListParams::default()).await.unwrap();
    let rv = list.metadata.resource_version.unwrap();
    let wp = WatchParams::default().labels("app=x").timeout(5);
    let mut stream = secrets.watch(&wp, &rv).await.unwrap().boxed();

    let pp = PostParams::default();
    secrets.create(&pp, &secret("a", &[("app", "x")])).await.unwrap();
    secrets
        .create(&pp, &secret("ignored", &[("app", "y")]))
        .await
        .unwrap();
    let relabel = json!({"metadata": {"labels": {"app": "y"}}});
    secrets
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(&json!({"stringData": {"k": "v"}})),
        )
        .await
        .unwrap();
    secrets
        .patch("a", &PatchParams::default(), &Patch::Merge(&relabel))
        .await
        .unwrap();

    let mut seen = Vec::new();
    while seen.len() < 3 {
        let event = tokio::time::timeout(UPPER_BOUND, stream.try_next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        match event {
            WatchEvent::Added(s) => seen.push(("ADDED", s.name_any())),
            WatchEvent::Modified(s) => seen.push(("MODIFIED", s.name_any())),
            WatchEvent::Deleted(s) => seen.push(("DELETED", s.name_any())),
            WatchEvent::Bookmark(_) => {}
            WatchEvent::Error(e) => panic!("watch error {e:?}"),
        }
    }
    let expected = [("ADDED", "a"), ("MODIFIED", "a"), ("DELETED", "a")];
    assert_eq!(
        seen,
        expected.map(|(t, n)| (t, n.to_string())),
        "leaving the selector is a DELETED event"
    );
}

#[tokio::test]
async fn watcher_sees_changes_in_order() {
    let (_server, client) = started().await;
    let locks: Api<DistributedLock> = Api::default_namespaced(client);
    let mut events = watcher(locks.clone(), watcher::Config::default()).boxed();
    let next = async |events: &mut futures::stream::BoxStream<
        'static,
        watcher::Result<watcher::Event<DistributedLock>>,
    >| {
        tokio::time::timeout(UPPER_BOUND, events.try_next())
            .await
            .unwrap()
            .unwrap()
            .unwrap()
    };
    assert!(matches!(next(&mut events).await, watcher::Event::Init));
    assert!(matches!(next(&mut events).await, watcher::Event::InitDone));

    locks.create(&PostParams::default(), &lock("l")).await.unwrap();
    let ttl = json!({"spec": {"ttl": "20s"}});
    locks
        .patch("l", &PatchParams::default(), &Patch::Merge(&ttl))
        .await
        .unwrap();
    locks.delete("l", &DeleteParams::default()).await.unwrap();

    let mut seen = Vec::new();
    while seen.len() < 3 {
        match next(&mut events).await {
            watcher::Event::Apply(l) => seen.push(format!(
                "apply {} gen {}",
                l.name_any(),
                l.metadata.generation.unwrap()
            )),
            watcher::Event::Delete(l) => seen.push(format!("delete {}", l.name_any())),
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(seen, ["apply l gen 1", "apply l gen 2", "delete l"]);
}

/// A reflector's store converges on the server's state, across an API server outage.
async fn reflector_converges(server: TestApiServer, client: Client) {
    let secrets: Api<Secret> = Api::default_namespaced(client);
    let pp = PostParams::default();
    secrets.create(&pp, &secret("before", &[])).await.unwrap();

    let (store, task) = reflect(&secrets).await;
    secrets.create(&pp, &secret("during", &[])).await.unwrap();
    eventually("the store to see both", || async {
        stored(&store) == ["before", "during"]
    })
    .await;

    let watches = server.request_count("watch", "secrets");
    server.set_down(true);
    // kube's default client retries 503 with a growing backoff, so look at the answer without retries.
    let raw: Api<Secret> = Api::default_namespaced(no_retry_client(&server));
    assert_eq!(api_error(raw.get("before").await).0, 503);
    server.set_down(false);
    secrets.delete("before", &DeleteParams::default()).await.unwrap();
    secrets.create(&pp, &secret("after", &[])).await.unwrap();
    let data = json!({"stringData": {"key": "changed"}});
    secrets
        .patch("during", &PatchParams::default(), &Patch::Merge(&data))
        .await
        .unwrap();
    eventually("the store to converge", || async {
        let changed = store.find(|s| s.name_any() == "during").is_some_and(|s| {
            s.data.as_ref().and_then(|d| d.get("key")) == Some(&ByteString(b"changed".to_vec()))
        });
        stored(&store) == ["after", "during"] && changed
    })
    .await;
    assert!(
        server.request_count("watch", "secrets") > watches,
        "the outage ended the watch"
    );
    task.abort();
}

#[tokio::test]
async fn reflector_converges_with_list_watch() {
    let (server, client) = started().await;
    reflector_converges(server, client).await;
}

#[tokio::test]
async fn reflector_converges_in_the_typical_realistic_mode() {
    let seed = seed_from(
        std::env::var(support::apiserver::realism::SEED_ENV)
            .ok()
            .as_deref(),
    );
    let (server, client) = started_with(Realism::typical(seed)).await;
    reflector_converges(server, client).await;
}

#[tokio::test]
async fn custom_resources_need_their_crd() {
    let server = TestApiServer::start().await;
    let client = server.client();
    let locks: Api<DistributedLock> = Api::default_namespaced(client.clone());
    assert_eq!(api_error(locks.list(&ListParams::default()).await).0, 404);
    install_crds(&client).await;
    locks.create(&PostParams::default(), &lock("l")).await.unwrap();
    let kubeconfig = tempfile::NamedTempFile::new().unwrap();
    server.write_kubeconfig(kubeconfig.path()).unwrap();
    let loaded = kube::config::Kubeconfig::read_from(kubeconfig.path()).unwrap();
    assert_eq!(
        loaded.clusters[0].cluster.as_ref().unwrap().server.as_deref(),
        Some(server.url().as_str())
    );
}

#[tokio::test]
async fn deletion_start_bumps_generation_once() {
    let (_server, client) = started().await;
    let locks: Api<DistributedLock> = Api::default_namespaced(client);
    let mut finalized = lock("l");
    finalized.metadata.finalizers = Some(vec!["test/hold".into()]);
    locks.create(&PostParams::default(), &finalized).await.unwrap();
    let deleting = locks.delete("l", &DeleteParams::default()).await.unwrap();
    let deleting = deleting.left().expect("held by its finalizer");
    assert_eq!(deleting.metadata.generation, Some(2));
    let again = locks.delete("l", &DeleteParams::default()).await.unwrap();
    let again = again.left().expect("still held");
    assert_eq!(again.metadata.generation, Some(2));
    assert_eq!(again.resource_version(), deleting.resource_version());
}

#[tokio::test]
async fn built_in_status_writes_change_status_and_metadata_only() {
    let (_server, client) = started().await;
    let jobs: Api<Job> = Api::default_namespaced(client);
    let created = jobs
        .create(&PostParams::default(), &suspended_job("work"))
        .await
        .unwrap();
    // The job strategy's generated selector and template labels.
    let uid = created.uid().unwrap();
    let spec = created.spec.as_ref().unwrap();
    let selector = spec
        .selector
        .as_ref()
        .and_then(|s| s.match_labels.as_ref())
        .unwrap();
    assert_eq!(selector.get("batch.kubernetes.io/controller-uid"), Some(&uid));
    let template_labels = spec
        .template
        .metadata
        .as_ref()
        .and_then(|m| m.labels.as_ref())
        .unwrap();
    assert_eq!(template_labels.get("job-name").map(String::as_str), Some("work"));
    assert_eq!(template_labels.get("controller-uid"), Some(&uid));

    let params = PatchParams::default();
    let status_write = json!({
        "metadata": { "labels": { "seen": "yes" } },
        "spec": { "suspend": false },
        "status": { "active": 1 },
    });
    let after = jobs
        .patch_status("work", &params, &Patch::Merge(&status_write))
        .await
        .unwrap();
    assert_eq!(after.status.as_ref().and_then(|s| s.active), Some(1));
    assert_eq!(after.labels().get("seen").map(String::as_str), Some("yes"));
    assert_eq!(
        after.spec.as_ref().and_then(|s| s.suspend),
        Some(true),
        "spec is not status"
    );
    assert_eq!(after.metadata.generation, Some(1));

    let main_write = json!({ "spec": { "suspend": false }, "status": { "active": 5 } });
    let after = jobs
        .patch("work", &params, &Patch::Merge(&main_write))
        .await
        .unwrap();
    assert_eq!(after.spec.as_ref().and_then(|s| s.suspend), Some(false));
    assert_eq!(
        after.status.as_ref().and_then(|s| s.active),
        Some(1),
        "status is not spec"
    );
    assert_eq!(after.metadata.generation, Some(2));
}

#[tokio::test]
async fn the_sweep_finishes_a_graceful_pod_deletion() {
    let (_server, client) = started().await;
    register_node(&client, "node-1").await;
    let pods: Api<Pod> = Api::default_namespaced(client);
    let pod: Pod = serde_json::from_value(json!({
        "metadata": { "name": "p" },
        "spec": { "nodeName": "node-1", "terminationGracePeriodSeconds": 1,
                  "containers": [{ "name": "main", "image": "busybox:1.36" }] }
    }))
    .unwrap();
    let created = pods.create(&PostParams::default(), &pod).await.unwrap();
    assert_eq!(created.metadata.generation, Some(1));
    let terminating = pods.delete("p", &DeleteParams::default()).await.unwrap();
    let terminating = terminating.left().expect("the pod while it terminates");
    assert_eq!(terminating.metadata.deletion_grace_period_seconds, Some(1));
    assert_eq!(terminating.metadata.generation, Some(2));
    eventually("the kubelet's final delete", || async {
        pods.get_opt("p").await.unwrap().is_none()
    })
    .await;
}

fn pod_on(name: &str, node: Option<&str>) -> Pod {
    serde_json::from_value(json!({
        "metadata": { "name": name },
        "spec": { "nodeName": node, "containers": [{ "name": "main", "image": "busybox:1.36" }] }
    }))
    .unwrap()
}

/// Waits until the pod garbage collector has made `passes` more passes.
async fn gc_passes(server: &TestApiServer, passes: u64) {
    let target = server.pod_gc_passes() + passes;
    eventually("the pod garbage collector's passes", || async {
        server.pod_gc_passes() >= target
    })
    .await;
}

#[tokio::test]
async fn pods_on_a_node_that_does_not_exist_are_failed_and_force_deleted_after_the_quarantine() {
    let (server, client) = started().await;
    // An hour of quarantine first: the orphan must outlive passes that see it.
    server.set_pod_gc(Some(PodGc {
        period: Duration::from_millis(20),
        quarantine: Duration::from_secs(3_600),
    }));
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    register_node(&client, "node-1").await;
    // Created before the orphan: every pass that sees the orphan sees them too.
    for (name, node) in [
        ("bound", Some("node-1")),
        ("unscheduled", None),
        ("late", Some("late-node")),
    ] {
        pods.create(&PostParams::default(), &pod_on(name, node))
            .await
            .unwrap();
    }
    let orphan = pods
        .create(&PostParams::default(), &pod_on("orphan", Some("gone-node")))
        .await
        .unwrap();
    let running = json!({ "status": { "phase": "Running" } });
    pods.patch_status("orphan", &PatchParams::default(), &Patch::Merge(&running))
        .await
        .unwrap();
    let mut events = pods
        .watch(&WatchParams::default(), &orphan.resource_version().unwrap())
        .await
        .unwrap()
        .boxed();
    gc_passes(&server, 3).await;
    let waiting = pods.get("orphan").await.unwrap();
    assert_eq!(
        waiting.status.and_then(|s| s.phase).as_deref(),
        Some("Running"),
        "still in quarantine"
    );
    // The late node appears within its quarantine; the quarantine then ends (each pass keeps the earlier due
    // time, so the shorter one takes over for the node still missing).
    register_node(&client, "late-node").await;
    server.set_pod_gc(Some(PodGc::QUICK));

    let mut seen = Vec::new();
    while let Some(event) = events.next().await {
        match event.unwrap() {
            WatchEvent::Modified(pod) if pod.name_any() == "orphan" => {
                let status = pod.status.unwrap_or_default();
                let disruption = status
                    .conditions
                    .unwrap_or_default()
                    .into_iter()
                    .find(|c| c.type_ == "DisruptionTarget")
                    .map(|c| (c.status, c.reason, c.message));
                seen.push(format!("{:?} {disruption:?}", status.phase));
            }
            WatchEvent::Deleted(pod) if pod.name_any() == "orphan" => {
                seen.push("deleted".into());
                break;
            }
            _ => {}
        }
    }
    assert_eq!(
        seen.first().map(String::as_str),
        Some(r#"Some("Running") None"#),
        "{seen:?}"
    );
    assert_eq!(
        seen[1..],
        [
            r#"Some("Failed") Some(("True", Some("DeletionByPodGC"), Some("PodGC: node no longer exists")))"#
                .to_owned(),
            "deleted".to_owned()
        ],
        "marked Failed, then deleted at once (no grace period)"
    );
    assert_eq!(
        names(pods.list(&ListParams::default()).await.unwrap()),
        ["bound", "late", "unscheduled"],
        "pods on a registered node or on none are kept"
    );
}

#[tokio::test]
async fn the_pod_garbage_collector_can_be_turned_off() {
    let (server, client) = started().await;
    server.set_pod_gc(None);
    let pods: Api<Pod> = Api::default_namespaced(client);
    pods.create(&PostParams::default(), &pod_on("orphan", Some("gone-node")))
        .await
        .unwrap();
    let passes = server.pod_gc_passes();
    tokio::time::sleep(PodGc::QUICK.quarantine * 4).await;
    assert_eq!(server.pod_gc_passes(), passes, "no pass while off");
    assert!(pods.get_opt("orphan").await.unwrap().is_some());
}

#[tokio::test]
async fn deletecollection_deletes_what_the_selector_selects() {
    let (_server, client) = started().await;
    let secrets: Api<Secret> = Api::default_namespaced(client);
    let pp = PostParams::default();
    secrets.create(&pp, &secret("a", &[("app", "x")])).await.unwrap();
    secrets.create(&pp, &secret("b", &[("app", "x")])).await.unwrap();
    secrets.create(&pp, &secret("c", &[("app", "y")])).await.unwrap();
    let deleted = secrets
        .delete_collection(
            &DeleteParams::background(),
            &ListParams::default().labels("app=x"),
        )
        .await
        .unwrap();
    let deleted = deleted.left().expect("the deleted objects");
    assert_eq!(names(deleted.items), ["a", "b"]);
    assert_eq!(names(secrets.list(&ListParams::default()).await.unwrap()), ["c"]);
}

#[tokio::test]
async fn built_in_kinds_drop_nulls_custom_resources_keep_them() {
    let (_server, client) = started().await;
    let secrets: Api<Secret> = Api::default_namespaced(client.clone());
    secrets
        .create(&PostParams::default(), &secret("s", &[]))
        .await
        .unwrap();
    let add_null = |path: &str| {
        Patch::Json::<()>(
            serde_json::from_value(json!([{"op": "add", "path": path, "value": null}])).unwrap(),
        )
    };
    let params = PatchParams::default();
    secrets.patch("s", &params, &add_null("/type")).await.unwrap();
    let raw: Api<DynamicObject> =
        Api::default_namespaced_with(client.clone(), &ApiResource::erase::<Secret>(&()));
    assert!(
        !raw.get("s")
            .await
            .unwrap()
            .data
            .as_object()
            .unwrap()
            .contains_key("type")
    );

    let locks: Api<DistributedLock> = Api::default_namespaced(client.clone());
    locks.create(&PostParams::default(), &lock("l")).await.unwrap();
    locks.patch("l", &params, &add_null("/spec/extra")).await.unwrap();
    let raw: Api<DynamicObject> =
        Api::default_namespaced_with(client, &ApiResource::erase::<DistributedLock>(&()));
    let stored = raw.get("l").await.unwrap();
    assert!(stored.data["spec"].as_object().unwrap().contains_key("extra"));
}

#[tokio::test]
async fn what_the_server_does_not_model_is_refused() {
    let (_server, client) = started().await;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let namespace = Namespace {
        metadata: ObjectMeta {
            name: Some("ns".into()),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
    namespaces
        .create(&PostParams::default(), &namespace)
        .await
        .unwrap();
    assert_eq!(
        api_error(namespaces.delete("ns", &DeleteParams::default()).await).0,
        405
    );
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    assert_eq!(
        api_error(
            crds.delete("distributedlocks.redlock.io", &DeleteParams::default())
                .await
        )
        .0,
        405
    );
    let mut misnamed = DistributedLock::crd();
    misnamed.metadata.name = Some("locks.redlock.io".into());
    assert_eq!(
        api_error(crds.create(&PostParams::default(), &misnamed).await).0,
        422
    );

    let secrets: Api<Secret> = Api::default_namespaced(client.clone());
    secrets
        .create(&PostParams::default(), &secret("s", &[]))
        .await
        .unwrap();
    let label = json!({"metadata": {"labels": {"a": "b"}}});
    let (code, _) = api_error(
        secrets
            .patch("s", &PatchParams::default(), &Patch::Strategic(&label))
            .await,
    );
    assert_eq!(code, 415, "strategic merge patch is not served");
    let (code, _) = api_error(
        secrets
            .patch("s", &PatchParams::default().dry_run(), &Patch::Merge(&label))
            .await,
    );
    assert_eq!(code, 400, "dryRun");
    let preconditions = DeleteParams {
        preconditions: Some(kube::api::Preconditions {
            uid: Some("x".into()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    assert_eq!(api_error(secrets.delete("s", &preconditions).await).0, 400);
    let streaming = WatchParams::streaming_lists();
    assert_eq!(api_error(secrets.watch(&streaming, "0").await.map(drop)).0, 400);
    let exact = ListParams::default()
        .at("1")
        .matching(kube::api::VersionMatch::Exact);
    assert_eq!(api_error(secrets.list(&exact).await).0, 400);
    let services: Api<k8s_openapi::api::core::v1::Service> = Api::default_namespaced(client);
    assert_eq!(api_error(services.list(&ListParams::default()).await).0, 404);
}

#[tokio::test]
async fn a_watch_from_zero_starts_with_the_objects_and_bookmarks() {
    let (_server, client) = started().await;
    let secrets: Api<Secret> = Api::default_namespaced(client);
    let created = secrets
        .create(&PostParams::default(), &secret("s", &[]))
        .await
        .unwrap();
    let created_rv: u64 = created.resource_version().unwrap().parse().unwrap();
    let params = WatchParams::default().timeout(60);
    let mut stream = secrets.watch(&params, "0").await.unwrap().boxed();
    let mut next = async || {
        tokio::time::timeout(UPPER_BOUND, stream.try_next())
            .await
            .unwrap()
            .unwrap()
            .unwrap()
    };
    assert!(matches!(next().await, WatchEvent::Added(s) if s.name_any() == "s"));
    match next().await {
        WatchEvent::Bookmark(bookmark) => {
            let rv: u64 = bookmark.metadata.resource_version.parse().unwrap();
            assert!(rv >= created_rv, "a bookmark covers what was sent");
        }
        other => panic!("expected a bookmark, got {other:?}"),
    }
}

#[tokio::test]
async fn a_watch_ends_after_its_timeout() {
    let (_server, client) = started().await;
    let secrets: Api<Secret> = Api::default_namespaced(client);
    let params = WatchParams::default().disable_bookmarks().timeout(1);
    let mut stream = secrets.watch(&params, "0").await.unwrap().boxed();
    let end = tokio::time::timeout(UPPER_BOUND, stream.try_next())
        .await
        .unwrap();
    assert!(matches!(end, Ok(None)), "the stream ends, got {end:?}");
}

// ------------------------------------------------------------------------------------------------------------
// The realistic mode
// ------------------------------------------------------------------------------------------------------------

/// The quick mode's settings with a fresh seed, for a test to change what it looks at.
fn realism() -> Realism {
    Realism {
        seed: seed_from(None),
        ..Realism::quick()
    }
}

/// A server in `realism`'s mode and its Secrets in `default`.
async fn secrets_with(realism: Realism) -> (TestApiServer, Api<Secret>) {
    let (server, client) = started_with(realism).await;
    (server, Api::default_namespaced(client))
}

async fn create_secrets(secrets: &Api<Secret>, names: &[&str]) {
    for name in names {
        secrets
            .create(&PostParams::default(), &secret(name, &[]))
            .await
            .unwrap();
    }
}

/// A reflector over `secrets` running in the background, once its store is ready.
async fn reflect(secrets: &Api<Secret>) -> (reflector::Store<Secret>, tokio::task::JoinHandle<()>) {
    let (store, writer) = reflector::store();
    let stream = reflector::reflector(
        writer,
        watcher(secrets.clone(), watcher::Config::default()).default_backoff(),
    );
    let task = tokio::spawn(stream.for_each(|_| async {}));
    store.wait_until_ready().await.unwrap();
    (store, task)
}

fn stored(store: &reflector::Store<Secret>) -> Vec<String> {
    names(store.state().iter().map(|s| (**s).clone()))
}

type RawWatch<T> = futures::stream::BoxStream<'static, kube::Result<WatchEvent<T>>>;

/// A raw watch from `rv`, without bookmarks (so every item is a change, an error or the end).
async fn watch_from(secrets: &Api<Secret>, rv: &str) -> RawWatch<Secret> {
    let params = WatchParams::default().disable_bookmarks();
    secrets.watch(&params, rv).await.unwrap().boxed()
}

/// The next item of a watch stream, within the upper bound.
async fn next_event<T>(stream: &mut RawWatch<T>) -> Option<WatchEvent<T>> {
    tokio::time::timeout(UPPER_BOUND, stream.try_next())
        .await
        .expect("a watch event or the end of the stream in time")
        .expect("a watch event")
}

fn is_expiry<T>(event: Option<WatchEvent<T>>) -> bool {
    matches!(event, Some(WatchEvent::Error(error)) if error.code == 410)
}

fn is_added<T: ResourceExt>(event: Option<WatchEvent<T>>, name: &str) -> bool {
    matches!(event, Some(WatchEvent::Added(object)) if object.name_any() == name)
}

async fn resource_version(secrets: &Api<Secret>) -> String {
    let list = secrets.list(&ListParams::default()).await.unwrap();
    list.metadata.resource_version.unwrap()
}

#[tokio::test]
async fn requests_are_late_by_the_request_latency() {
    let (_server, secrets) = secrets_with(Realism {
        request_latency: Jitter::millis(200, 300),
        ..realism()
    })
    .await;
    let before = Instant::now();
    assert!(secrets.get_opt("missing").await.unwrap().is_none());
    assert!(before.elapsed() >= Duration::from_millis(200));
}

#[tokio::test]
async fn watch_events_are_late_and_in_order() {
    let (_server, secrets) = secrets_with(Realism {
        watch_latency: Jitter::millis(100, 200),
        ..realism()
    })
    .await;
    let mut stream = watch_from(&secrets, &resource_version(&secrets).await).await;
    let before = Instant::now();
    let created: Vec<String> = (0..20).map(|i| format!("s{i:02}")).collect();
    let created_refs: Vec<&str> = created.iter().map(String::as_str).collect();
    create_secrets(&secrets, &created_refs).await;
    let mut seen = Vec::new();
    let mut versions = Vec::new();
    while seen.len() < created.len() {
        match next_event(&mut stream).await {
            Some(WatchEvent::Added(s)) => {
                if seen.is_empty() {
                    assert!(
                        before.elapsed() >= Duration::from_millis(100),
                        "no event before the least latency"
                    );
                }
                versions.push(s.resource_version().unwrap().parse::<u64>().unwrap());
                seen.push(s.name_any());
            }
            other => panic!("expected ADDED, got {other:?}"),
        }
    }
    assert_eq!(seen, created, "jitter does not reorder one watch");
    assert!(versions.windows(2).all(|pair| pair[0] < pair[1]));
}

#[tokio::test]
async fn a_delayed_list_comes_after_its_delay_while_other_resources_flow() {
    let delay = Duration::from_secs(2);
    let (_server, client) = started_with(Realism {
        list_delays: vec![("pods", delay)],
        ..realism()
    })
    .await;
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    let early = Pod {
        metadata: ObjectMeta {
            name: Some("early".into()),
            ..ObjectMeta::default()
        },
        ..Pod::default()
    };
    pods.create(&PostParams::default(), &early).await.unwrap();

    let requested = Instant::now();
    let pod_list = tokio::spawn(async move {
        let mut events = watcher(pods, watcher::Config::default()).boxed();
        let mut listed = Vec::new();
        loop {
            match events.try_next().await.unwrap().unwrap() {
                watcher::Event::InitApply(pod) => listed.push(pod.name_any()),
                watcher::Event::InitDone => return (Instant::now(), listed),
                _ => {}
            }
        }
    });
    // DistributedLocks are not delayed: their list and a new lock's event come through meanwhile.
    let locks: Api<DistributedLock> = Api::default_namespaced(client);
    let mut lock_events = watcher(locks.clone(), watcher::Config::default()).boxed();
    let mut next_lock = async || {
        tokio::time::timeout(UPPER_BOUND, lock_events.try_next())
            .await
            .unwrap()
            .unwrap()
            .unwrap()
    };
    assert!(matches!(next_lock().await, watcher::Event::Init));
    assert!(matches!(next_lock().await, watcher::Event::InitDone));
    locks.create(&PostParams::default(), &lock("l")).await.unwrap();
    assert!(matches!(next_lock().await, watcher::Event::Apply(l) if l.name_any() == "l"));

    let (listed_at, listed) = tokio::time::timeout(UPPER_BOUND, pod_list)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(listed, ["early"]);
    assert!(
        listed_at - requested >= delay,
        "the pods list cannot come before its delay"
    );
}

#[tokio::test]
async fn watches_end_after_their_lifetime_and_resume_without_a_relist() {
    let (server, secrets) = secrets_with(Realism {
        watch_lifetime: Some(Jitter::millis(100, 200)),
        ..realism()
    })
    .await;
    let (store, task) = reflect(&secrets).await;
    let watches = server.request_count("watch", "secrets");
    eventually("three watches to end and resume", || async {
        server.request_count("watch", "secrets") >= watches + 3
    })
    .await;
    create_secrets(&secrets, &["later"]).await;
    eventually("the store to see it", || async { stored(&store) == ["later"] }).await;
    assert_eq!(
        server.request_count("list", "secrets"),
        1,
        "a watch that ends is resumed, not relisted"
    );
    task.abort();
}

#[tokio::test]
async fn an_expired_watch_forces_a_relist_and_the_store_converges() {
    let (server, secrets) = secrets_with(Realism {
        watch_lifetime: Some(Jitter::millis(100, 200)),
        expiry_chance: 1.0,
        ..realism()
    })
    .await;
    create_secrets(&secrets, &["before"]).await;

    // The stream's last event is the expiry.
    let mut raw = watch_from(&secrets, &resource_version(&secrets).await).await;
    assert!(is_expiry(next_event(&mut raw).await));
    assert!(next_event(&mut raw).await.is_none(), "and then it ends");

    let (store, task) = reflect(&secrets).await;
    let lists = server.request_count("list", "secrets");
    create_secrets(&secrets, &["after"]).await;
    secrets.delete("before", &DeleteParams::default()).await.unwrap();
    eventually("a relist", || async {
        server.request_count("list", "secrets") > lists
    })
    .await;
    eventually("the store to converge", || async { stored(&store) == ["after"] }).await;
    task.abort();
}

#[tokio::test]
async fn a_resume_from_beyond_the_history_is_expired() {
    let (_server, secrets) = secrets_with(Realism {
        history: 2,
        ..realism()
    })
    .await;
    let old = resource_version(&secrets).await;
    create_secrets(&secrets, &["a", "b", "c", "d"]).await;
    assert!(is_expiry(next_event(&mut watch_from(&secrets, &old).await).await));

    // Within the history, a resume replays what it missed.
    let b = secrets.get("b").await.unwrap();
    let mut resumed = watch_from(&secrets, &b.resource_version().unwrap()).await;
    assert!(is_added(next_event(&mut resumed).await, "c"));
    assert!(is_added(next_event(&mut resumed).await, "d"));
}

#[tokio::test]
async fn a_resume_is_expired_by_chance_when_it_missed_changes() {
    let (_server, secrets) = secrets_with(Realism {
        expiry_chance: 1.0,
        ..realism()
    })
    .await;
    let old = resource_version(&secrets).await;
    create_secrets(&secrets, &["a"]).await;
    assert!(is_expiry(next_event(&mut watch_from(&secrets, &old).await).await));

    // Nothing missed, nothing to expire.
    let mut current = watch_from(&secrets, &resource_version(&secrets).await).await;
    create_secrets(&secrets, &["b"]).await;
    assert!(is_added(next_event(&mut current).await, "b"));
}

#[tokio::test]
async fn an_outage_refuses_connections_then_listens_on_the_same_port() {
    let (server, secrets) = secrets_with(realism()).await;
    create_secrets(&secrets, &["before"]).await;
    let (store, task) = reflect(&secrets).await;
    let mut open = watch_from(&secrets, &resource_version(&secrets).await).await;
    let addr = server.url().trim_start_matches("http://").to_owned();

    server.set_unreachable(true).await;
    let refused = tokio::net::TcpStream::connect(&addr).await;
    assert_eq!(
        refused.map(drop).unwrap_err().kind(),
        std::io::ErrorKind::ConnectionRefused
    );
    let ended = tokio::time::timeout(UPPER_BOUND, open.try_next())
        .await
        .expect("the open watch ends");
    assert!(
        !matches!(ended, Ok(Some(_))),
        "the open watch ends, got {ended:?}"
    );
    let raw: Api<Secret> = Api::default_namespaced(no_retry_client(&server));
    let failed = raw.get("before").await;
    assert!(
        matches!(failed, Err(ref error) if !matches!(error, kube::Error::Api(_))),
        "no answer at all while unreachable, got {failed:?}"
    );

    server.set_unreachable(false).await;
    tokio::net::TcpStream::connect(&addr)
        .await
        .expect("listening again on the same port");
    create_secrets(&secrets, &["after"]).await;
    eventually("the store to converge after the outage", || async {
        stored(&store) == ["after", "before"]
    })
    .await;
    task.abort();
}

#[test]
fn a_seed_is_taken_from_its_variable() {
    assert_eq!(seed_from(Some("42")), 42);
    assert_eq!(Realism::typical(7).seed, 7);
}
