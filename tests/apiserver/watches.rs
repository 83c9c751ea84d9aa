//! Watches: raw watch events in order, kube's watcher and reflector over them, bookmarks and timeouts.

use super::*;

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
        std::env::var(crate::support::apiserver::realism::SEED_ENV)
            .ok()
            .as_deref(),
    );
    let (server, client) = started_with(Realism::typical(seed)).await;
    reflector_converges(server, client).await;
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
