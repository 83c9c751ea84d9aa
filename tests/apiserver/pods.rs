//! Pods: graceful deletion once scheduled, the sweep that finishes it, and the pod garbage collector.

use super::*;

/// A node to bind pods to: the server's pod garbage collector deletes pods bound to a node that does not exist.
async fn register_node(client: &Client, name: &str) {
    let node: Node = serde_json::from_value(json!({ "metadata": { "name": name } })).unwrap();
    Api::<Node>::all(client.clone())
        .create(&PostParams::default(), &node)
        .await
        .unwrap();
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
