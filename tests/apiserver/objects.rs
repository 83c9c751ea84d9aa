//! Objects through the API: selectors, resourceVersion conflicts, the status subresource and generation,
//! finalizers, patches and server-side apply, deletion, what the server refuses, and Events written by the recorder.

use super::*;

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
        "apiVersion": "redlock.io/v1beta1", "kind": "RedisQuorum",
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
        "apiVersion": "redlock.io/v1beta1", "kind": "RedisQuorum",
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
        "apiVersion": "redlock.io/v1beta1", "kind": "RedisQuorum",
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
