//! The realistic mode: request and watch latency, delayed lists, watch lifetimes, expired resumes, outages.

use super::*;

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
