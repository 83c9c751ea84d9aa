//! Leader semaphores (issue 23): a pod labelled per permit, each keeping its permit number and token; shared
//! by two clusters; spec.permits lowered and raised under the leaders; a plain lock turned into one and back;
//! every permit resumed by a restarted operator.

use super::*;

/// Each labelled pod's permit and token, as its annotations show them.
async fn leaders_shown(env: &Env) -> BTreeMap<String, (u32, i64)> {
    let mut shown = BTreeMap::new();
    for pod in labelled(env).await {
        let annotations = annotations(env, &pod).await;
        let permit = annotations
            .get("redlock.io/permit")
            .and_then(|text| text.parse().ok());
        let token = annotations
            .get("redlock.io/fencing-token")
            .and_then(|text| text.parse().ok());
        if let (Some(permit), Some(token)) = (permit, token) {
            shown.insert(pod, (permit, token));
        }
    }
    shown
}

/// Waits until exactly `pods` carry the label, each with a permit and token, asserting on every look that no
/// more than `permits` pods do and that no permit is shown on two pods.
pub(super) async fn wait_for_leaders(
    env: &Env,
    pods: &[&str],
    permits: usize,
) -> BTreeMap<String, (u32, i64)> {
    eventually(&format!("{pods:?} to be the labelled pods"), || async {
        let now = labelled(env).await;
        assert!(now.len() <= permits, "more leaders than permits: {now:?}");
        let shown = leaders_shown(env).await;
        let mut numbers: Vec<u32> = shown.values().map(|(permit, _)| *permit).collect();
        numbers.sort_unstable();
        numbers.dedup();
        assert_eq!(
            numbers.len(),
            shown.len(),
            "a permit shown on two pods: {shown:?}"
        );
        let wanted: Vec<String> = pods.iter().map(|pod| (*pod).to_owned()).collect();
        (shown.keys().cloned().collect::<Vec<_>>() == wanted).then_some(shown)
    })
    .await
}

/// Issue 23: a leader semaphore of three labels three pods, each with its own permit number and token; a leader
/// that goes gives its permit, after its validity, to the next pod, with a higher token of that permit, and
/// the other leaders keep theirs untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_semaphore_labels_a_pod_per_permit_and_each_keeps_its_number() {
    let masters = RedisCluster::start(3).expect("masters");
    let env = Env::new().await;
    let (quorum, running, shutdown) = setup(&masters, &env, 27).await;
    ready_pods(&env, &["web-0", "web-1", "web-2", "web-3"]).await;
    web_semaphore(&env, &quorum, "3s", None, 3).await;
    let first = wait_for_leaders(&env, &["web-0", "web-1", "web-2"], 3).await;
    let lock = lock_where(&env, "web", "3/3 held", |lock| {
        lock.status.as_ref().and_then(|status| status.held.as_deref()) == Some("3/3")
    })
    .await;
    let holders = lock.status.map(|status| status.holders).unwrap_or_default();
    let mut listed: Vec<(String, u32, i64)> = holders
        .iter()
        .map(|held| {
            (
                held.holder.clone(),
                u32::try_from(held.permit).expect("permit"),
                held.fencing_token,
            )
        })
        .collect();
    listed.sort();
    let expected: Vec<(String, u32, i64)> = first
        .iter()
        .map(|(pod, (permit, token))| (pod.clone(), *permit, *token))
        .collect();
    assert_eq!(listed, expected, "status lists what the pods show");
    // Each permit's Events name it.
    for (permit, (holder, token)) in first.values().zip(first.keys()).map(|((p, t), h)| (*p, (h, *t))) {
        let wanted = format!("permit {permit}: {holder} holds the lock with fencing token {token}");
        eventually(&format!("the Event {wanted:?}"), || async {
            let events = env.events().list(&ListParams::default()).await.ok()?;
            events
                .items
                .iter()
                .any(|event| {
                    event.reason.as_deref() == Some("Acquired")
                        && event
                            .note
                            .as_deref()
                            .is_some_and(|note| note.starts_with(&wanted))
                })
                .then_some(())
        })
        .await;
    }

    set_ready(&env, "web-1", false).await;
    let second = wait_for_leaders(&env, &["web-0", "web-2", "web-3"], 3).await;
    let (moved_permit, old_token) = first["web-1"];
    let (permit, token) = second["web-3"];
    assert_eq!(permit, moved_permit, "web-3 took the permit web-1 gave up");
    assert!(
        token > old_token,
        "permit {permit}: token {token} after {old_token}"
    );
    for pod in ["web-0", "web-2"] {
        assert_eq!(second[pod], first[pod], "{pod} kept its permit and term");
    }
    stop(running, shutdown).await;
    env.cleanup(&[&quorum]).await;
}

/// Issue 23: two clusters on one quorum sharing a leader semaphore of two have two leaders between them, never
/// three, on two different permits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_clusters_sharing_a_leader_semaphore_of_two_have_two_leaders_between_them() {
    let masters = RedisCluster::start(3).expect("masters");
    let east = Env::new().await;
    let west = Env::test_server().await;
    let key = format!("leaders/{}", east.namespace);
    let mut running = Vec::new();
    for (env, seed) in [(&east, 28u8), (&west, 29u8)] {
        let quorum = env.unique("q");
        env.create_sharing_quorum(&quorum, &masters.urls(), "3s").await;
        ready_pods(env, &["web-0", "web-1"]).await;
        web_semaphore(env, &quorum, "3s", Some(&key), 2).await;
        running.push((operator(env, &installation_secret(seed), None).await, quorum));
    }
    let permits_shown = || async {
        let mut permits: Vec<u32> = leaders_shown(&east)
            .await
            .into_values()
            .chain(leaders_shown(&west).await.into_values())
            .map(|(permit, _)| permit)
            .collect();
        permits.sort_unstable();
        permits
    };
    eventually("two leaders across both clusters", || async {
        let count = labelled(&east).await.len() + labelled(&west).await.len();
        assert!(count <= 2, "more leaders than permits across clusters");
        (permits_shown().await == [0, 1]).then_some(())
    })
    .await;
    throughout(Duration::from_secs(2), Duration::from_millis(100), || async {
        let count = labelled(&east).await.len() + labelled(&west).await.len();
        assert!(count <= 2, "more leaders than permits across clusters");
    })
    .await;
    assert_eq!(permits_shown().await, [0, 1], "each permit on one pod");
    let quorum_name = running[0].1.clone();
    for ((running, shutdown), _) in running {
        stop(running, shutdown).await;
    }
    east.cleanup(&[&quorum_name]).await;
}

/// Sets the web lock's spec.permits.
async fn set_permits(env: &Env, permits: i32) {
    let patch = serde_json::json!({ "spec": { "permits": permits } });
    env.locks()
        .patch("web", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("change spec.permits");
}

/// Issue 23: spec.permits changes on a held leader semaphore. Lowered, the leader of the permit above the new
/// count loses its label before that permit is released (status never shows it released while its pod is
/// still labelled), the others keep their permits and terms, and `HELD` comes back to `2/2`; raised, the new
/// permits go to free pods, the reused permit with a token above its last.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_semaphore_can_be_lowered_and_raised_under_its_leaders() {
    let masters = RedisCluster::start(3).expect("masters");
    let env = Env::new().await;
    let (quorum, running, shutdown) = setup(&masters, &env, 30).await;
    ready_pods(&env, &["web-0", "web-1", "web-2", "web-3"]).await;
    web_semaphore(&env, &quorum, "3s", None, 3).await;
    let first = wait_for_leaders(&env, &["web-0", "web-1", "web-2"], 3).await;
    let (permit_2_pod, (_, permit_2_token)) = first
        .iter()
        .find(|(_, (permit, _))| *permit == 2)
        .map(|(pod, shown)| (pod.clone(), *shown))
        .expect("a pod holds permit 2");

    set_permits(&env, 2).await;
    eventually("permit 2 given up after its leader lost the label", || async {
        // Status first, then the pod: the label comes off before the permit is released and never comes back,
        // so a permit shown released with its pod labelled afterwards would be a release before the fence.
        let lock = env.locks().get("web").await.expect("lock");
        let status = lock.status.unwrap_or_default();
        let listed = status.holders.iter().any(|held| held.permit == 2);
        let still_labelled = labelled(&env).await.contains(&permit_2_pod);
        assert!(
            listed || !still_labelled,
            "permit 2 released while {permit_2_pod} still carries the label"
        );
        (!listed && status.held.as_deref() == Some("2/2")).then_some(())
    })
    .await;
    let kept: Vec<&str> = first
        .keys()
        .map(String::as_str)
        .filter(|pod| *pod != permit_2_pod)
        .collect();
    let lowered = wait_for_leaders(&env, &kept, 3).await;
    for pod in &kept {
        assert_eq!(lowered[*pod], first[*pod], "{pod} kept its permit and term");
    }

    set_permits(&env, 4).await;
    let raised = wait_for_leaders(&env, &["web-0", "web-1", "web-2", "web-3"], 4).await;
    for pod in &kept {
        assert_eq!(raised[*pod], first[*pod], "{pod} kept its permit and term");
    }
    let mut permits: Vec<u32> = raised.values().map(|(permit, _)| *permit).collect();
    permits.sort_unstable();
    assert_eq!(permits, [0, 1, 2, 3]);
    let reused = raised
        .values()
        .find(|(permit, _)| *permit == 2)
        .map(|(_, token)| *token)
        .expect("permit 2 held again");
    assert!(
        reused > permit_2_token,
        "permit 2: token {reused} after {permit_2_token}"
    );
    lock_where(&env, "web", "4/4 held", |lock| {
        lock.status.as_ref().and_then(|status| status.held.as_deref()) == Some("4/4")
    })
    .await;
    stop(running, shutdown).await;
    env.cleanup(&[&quorum]).await;
}

/// Issue 23: a plain leader lock raised to a semaphore keeps its leader, with its term, as permit 0's holder
/// and labels a second pod for permit 1; lowered back to one, the second leader loses its label before its
/// permit is released and the status is a plain lock's again (its holder at the top, no `holders`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_leader_lock_becomes_a_semaphore_and_back_keeping_its_leader() {
    let masters = RedisCluster::start(3).expect("masters");
    let env = Env::new().await;
    let (quorum, running, shutdown) = setup_long_ttl(&masters, &env, 31).await;
    ready_pods(&env, &["web-0", "web-1", "web-2"]).await;
    web_semaphore(&env, &quorum, "3s", None, 1).await;
    let plain = lock_where(&env, "web", "held by web-0", |lock| {
        lock.status.as_ref().and_then(|status| status.holder.as_deref()) == Some("web-0")
    })
    .await;
    let token = plain
        .status
        .and_then(|status| status.fencing_token)
        .expect("a token");
    eventually("web-0 alone labelled", || async {
        (labelled(&env).await == ["web-0"]).then_some(())
    })
    .await;

    set_permits(&env, 2).await;
    let raised = wait_for_leaders(&env, &["web-0", "web-1"], 2).await;
    assert_eq!(
        raised["web-0"],
        (0, token),
        "web-0 leads on, as permit 0, in the same term"
    );
    assert_eq!(raised["web-1"].0, 1);

    set_permits(&env, 1).await;
    eventually("a plain lock again, held by web-0", || async {
        let lock = env.locks().get("web").await.expect("lock");
        let status = lock.status.unwrap_or_default();
        let listed = status.holders.iter().any(|held| held.permit == 1);
        assert!(
            listed || !labelled(&env).await.contains(&"web-1".to_owned()),
            "permit 1 released while web-1 still carries the label"
        );
        (status.holders.is_empty()
            && status.held.as_deref() == Some("1/1")
            && status.holder.as_deref() == Some("web-0")
            && status.fencing_token == Some(token))
        .then_some(())
    })
    .await;
    eventually("web-0 alone labelled again", || async {
        (labelled(&env).await == ["web-0"]).then_some(())
    })
    .await;
    stop(running, shutdown).await;
    env.cleanup(&[&quorum]).await;
}

/// Each listed permit's holder, token and validity, by permit.
async fn permits_listed(env: &Env) -> BTreeMap<i32, (String, i64, Option<k8s_openapi::jiff::Timestamp>)> {
    let lock = env.locks().get("web").await.expect("lock");
    lock.status
        .unwrap_or_default()
        .holders
        .into_iter()
        .map(|held| {
            (
                held.permit,
                (held.holder, held.fencing_token, held.valid_until.map(|at| at.0)),
            )
        })
        .collect()
}

/// Issue 23: the operator's promise per permit across a restart: every leader of a semaphore keeps its label,
/// permit and term through it (no label is removed or moved, watched rather than sampled), and each permit is
/// extended again by the new process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_operator_resumes_every_permit_of_a_leader_semaphore() {
    let masters = RedisCluster::start(3).expect("masters");
    let env = Env::new().await;
    let (quorum, running, shutdown) = setup(&masters, &env, 32).await;
    ready_pods(&env, &["web-0", "web-1", "web-2", "web-3"]).await;
    web_semaphore(&env, &quorum, "3s", None, 3).await;
    let before = wait_for_leaders(&env, &["web-0", "web-1", "web-2"], 3).await;
    lock_where(&env, "web", "3/3 held", |lock| {
        lock.status.as_ref().and_then(|status| status.held.as_deref()) == Some("3/3")
    })
    .await;
    let changes = pod_changes(&env).await;
    stop(running, shutdown).await;
    let stopped_at = permits_listed(&env).await;
    let (running, shutdown) = operator(&env, &installation_secret(32), None).await;
    let leaders: Vec<&str> = before.keys().map(String::as_str).collect();
    assert_labels_stay(changes, &leaders).await;
    eventually("every permit extended by the new process", || async {
        let now = permits_listed(&env).await;
        let extended = now.iter().all(|(permit, (holder, token, valid_until))| {
            let (old_holder, old_token, old_until) = &stopped_at[permit];
            assert_eq!(
                (holder, token),
                (old_holder, old_token),
                "permit {permit} changed hands"
            );
            valid_until > old_until
        });
        (now.len() == 3 && extended).then_some(())
    })
    .await;
    assert_eq!(
        leaders_shown(&env).await,
        before,
        "every leader kept its permit and term"
    );
    stop(running, shutdown).await;
    env.cleanup(&[&quorum]).await;
}
