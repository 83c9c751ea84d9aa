//! End-to-end leader election: the operator labels one pod of a set as the leader, moves the label when the
//! leader goes, removes it before the lock's validity ends when the lock is lost, and the `elect` helper runs
//! a command only on the leader. The tests play the kubelet: pods are bound to the test's own node, registered
//! and kept Ready with no kubelet behind it (`crate::support::node`), and their status is set through the status
//! subresource — the same on the test server and on a real cluster.
//!
//! Here the election itself and what the topics share; `elect` runs the helper as a pod's process, `hand_over`
//! the reports of stopped work and the keys given up, `semaphore` leader semaphores.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::e2e::*;
use crate::support::redis_server::RedisCluster;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use redlock_operator::api::LockPhase;
use redlock_operator::controller::run::Running;
use tokio::time::Instant;

#[path = "leader/elect.rs"]
mod elect;
#[path = "leader/hand_over.rs"]
mod hand_over;
#[path = "leader/semaphore.rs"]
mod semaphore;
#[path = "leader/silent.rs"]
mod silent;

const LABEL: &str = "redlock.io/leader";

async fn labelled(env: &Env) -> Vec<String> {
    pods(env)
        .list(&ListParams::default().labels(LABEL))
        .await
        .expect("pods")
        .items
        .into_iter()
        .filter_map(|pod| pod.metadata.name)
        .collect()
}

async fn annotations(env: &Env, pod: &str) -> BTreeMap<String, String> {
    pods(env)
        .get(pod)
        .await
        .expect("pod")
        .metadata
        .annotations
        .unwrap_or_default()
}

/// The validity `pod` was shown as the leader.
async fn valid_until(env: &Env, pod: &str) -> k8s_openapi::jiff::Timestamp {
    annotations(env, pod)
        .await
        .get("redlock.io/valid-until")
        .and_then(|text| text.parse().ok())
        .expect("the leader shows its validity")
}

async fn web_lock(env: &Env, quorum: &str, ttl: &str, key: Option<&str>) {
    web_semaphore(env, quorum, ttl, key, 1).await;
}

/// The web pods' lock with `permits` leaders (1: a plain lock).
async fn web_semaphore(env: &Env, quorum: &str, ttl: &str, key: Option<&str>, permits: i32) {
    let mut spec = serde_json::json!({
        "permits": permits,
        "quorum": quorum, "ttl": ttl,
        "holder": { "leaderElection": { "selector": { "matchLabels": { "app": "web" } } } }
    });
    if let Some(key) = key {
        spec["resourceKey"] = serde_json::json!(key);
    }
    env.create_lock_from(serde_json::json!({
        "apiVersion": "redlock.io/v1beta1", "kind": "DistributedLock",
        "metadata": { "name": "web" }, "spec": spec
    }))
    .await;
}

/// Waits until exactly `pod` carries the label, asserting on the way that two pods never do; returns when.
async fn wait_for_leader(env: &Env, pod: &str) -> Instant {
    eventually(&format!("{pod} to be the only labelled pod"), || async {
        let now = labelled(env).await;
        assert!(now.len() <= 1, "two pods carry the leader label: {now:?}");
        (now == [pod]).then(Instant::now)
    })
    .await
}

async fn setup(
    masters: &RedisCluster,
    env: &Env,
    seed: u8,
) -> (String, Running, tokio_util::sync::CancellationToken) {
    let quorum = env.unique("q");
    env.create_quorum(&quorum, &masters.urls(), "3s").await;
    start_on(env, seed, quorum).await
}

/// [`setup`] for locks of up to a minute: the masters were started for the test, so no restart is waited out
/// (a restarted master sits out its quorum's maxTtl).
async fn setup_long_ttl(
    masters: &RedisCluster,
    env: &Env,
    seed: u8,
) -> (String, Running, tokio_util::sync::CancellationToken) {
    let quorum = env.unique("q");
    create_long_ttl_quorum(masters, env, &quorum).await;
    start_on(env, seed, quorum).await
}

/// The quorum of [`setup_long_ttl`].
async fn create_long_ttl_quorum(masters: &RedisCluster, env: &Env, quorum: &str) {
    env.create_quorum_from(serde_json::json!({
        "apiVersion": "redlock.io/v1beta1", "kind": "RedisQuorum", "metadata": { "name": quorum },
        "spec": { "endpoints": masters.urls(), "maxTtl": "60s", "nodeTimeout": "100ms", "assumeDurable": true }
    }))
    .await;
}

async fn start_on(
    env: &Env,
    seed: u8,
    quorum: String,
) -> (String, Running, tokio_util::sync::CancellationToken) {
    let (running, shutdown) = operator(env, &installation_secret(seed), None).await;
    quorum_available(env, &quorum).await;
    (quorum, running, shutdown)
}

/// Every change of the pods from now on, watched rather than sampled: a label removed and put back a few
/// milliseconds later is seen too.
async fn pod_changes(
    env: &Env,
) -> futures::stream::BoxStream<'static, kube::Result<kube::api::WatchEvent<Pod>>> {
    let from = pods(env)
        .list(&ListParams::default())
        .await
        .expect("pods")
        .metadata
        .resource_version
        .expect("a list resourceVersion");
    pods(env)
        .watch(&kube::api::WatchParams::default(), &from)
        .await
        .expect("watch pods")
        .boxed()
}

/// Watches `changes` for seven seconds (two extensions of a 3s lock, whatever the restart's timing) and asserts
/// that only `leaders` ever carry the label.
async fn assert_labels_stay(
    mut changes: futures::stream::BoxStream<'static, kube::Result<kube::api::WatchEvent<Pod>>>,
    leaders: &[&str],
) {
    let _ = tokio::time::timeout(Duration::from_secs(7), async {
        while let Some(event) = changes.next().await {
            if let Ok(kube::api::WatchEvent::Modified(pod) | kube::api::WatchEvent::Added(pod)) = event {
                let name = pod.metadata.name.clone().unwrap_or_default();
                let has_label = pod.metadata.labels.unwrap_or_default().contains_key(LABEL);
                assert_eq!(
                    has_label,
                    leaders.contains(&name.as_str()),
                    "a leader label moved or went during the restart ({name})"
                );
            }
        }
    })
    .await;
}

/// Reports the operator took (`redlock_stopped_reports_total{outcome="taken"}`).
async fn reports_taken(running: &Running) -> f64 {
    let (_, text) = http_get(running.metrics_addr, "/metrics")
        .await
        .expect("/metrics");
    text.lines()
        .find(|line| line.starts_with("redlock_stopped_reports_total{") && line.contains("outcome=\"taken\""))
        .and_then(|line| line.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_oldest_ready_pod_leads_and_failover_moves_the_label() {
    let masters = RedisCluster::start(3).expect("masters");
    let env = Env::new().await;
    let (quorum, running, shutdown) = setup(&masters, &env, 21).await;
    for name in ["web-0", "web-1", "web-2"] {
        create_pod(&env, name).await;
    }
    set_ready(&env, "web-0", true).await;
    set_ready(&env, "web-1", true).await;
    set_ready(&env, "web-2", false).await;
    web_lock(&env, &quorum, "3s", None).await;

    wait_for_leader(&env, "web-0").await;
    // The candidates shown follow the pod watch, which may bring web-1's readiness after the first grant: the
    // list settles on the two ready pods, and never shows web-2.
    lock_where(
        &env,
        "web",
        "held by web-0 with both ready pods as candidates",
        |lock| {
            let status = lock.status.as_ref();
            assert!(
                !status.is_some_and(|s| s.candidates.iter().any(|c| c == "web-2")),
                "web-2 is not ready"
            );
            phase(lock) == Some(LockPhase::Held)
                && status.and_then(|s| s.holder.as_deref()) == Some("web-0")
                && status.is_some_and(|s| s.candidates == ["web-0", "web-1"])
        },
    )
    .await;
    let shown = annotations(&env, "web-0").await;
    assert_eq!(
        shown.get("redlock.io/fencing-token").map(String::as_str),
        Some("1")
    );
    assert!(shown.contains_key("redlock.io/valid-until"));

    // The leader becomes unready: label off it first, then — once the validity it was shown has ended, for it
    // may act until then — the next oldest leads with a new token.
    let shown = valid_until(&env, "web-0").await;
    let started = Instant::now();
    set_ready(&env, "web-0", false).await;
    let moved = wait_for_leader(&env, "web-1").await;
    let moved_at = k8s_openapi::jiff::Timestamp::now();
    println!(
        "failover after the leader became unready: {} ms",
        (moved - started).as_millis()
    );
    assert!(
        moved_at >= shown,
        "web-1 led at {moved_at}, before the validity {shown} shown to web-0 ended"
    );
    let lock = lock_where(&env, "web", "held by web-1", |lock| token(lock) == Some(2)).await;
    assert_eq!(
        lock.status.as_ref().and_then(|s| s.holder.as_deref()),
        Some("web-1")
    );
    assert!(
        !annotations(&env, "web-0")
            .await
            .contains_key("redlock.io/fencing-token")
    );

    // The leader is deleted (it starts terminating): the same, to web-2 once it is ready.
    set_ready(&env, "web-2", true).await;
    let started = Instant::now();
    pods(&env)
        .delete("web-1", &DeleteParams::default())
        .await
        .expect("delete");
    let moved = wait_for_leader(&env, "web-2").await;
    println!(
        "failover after the leader was deleted: {} ms",
        (moved - started).as_millis()
    );
    lock_where(&env, "web", "token 3", |lock| token(lock) == Some(3)).await;

    // No candidate at all: nobody leads, and status says why.
    set_ready(&env, "web-2", false).await;
    eventually("no labelled pod", || async {
        labelled(&env).await.is_empty().then_some(())
    })
    .await;
    lock_where(&env, "web", "NoCandidates", |lock| {
        lock.status
            .as_ref()
            .and_then(|s| condition(&s.conditions, "Held"))
            .is_some_and(|c| c.reason == "NoCandidates")
    })
    .await;
    stop(running, shutdown).await;
    let _ = pods(&env)
        .delete("web-1", &DeleteParams::default().grace_period(0))
        .await;
    env.cleanup(&[&quorum]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_the_quorum_removes_the_label_before_valid_until_and_the_leader_comes_back() {
    let masters = RedisCluster::start(3).expect("masters");
    let env = Env::new().await;
    let (quorum, running, shutdown) = setup(&masters, &env, 22).await;
    ready_pods(&env, &["web-0"]).await;
    web_lock(&env, &quorum, "3s", None).await;
    wait_for_leader(&env, "web-0").await;

    masters[0].stop();
    masters[1].stop();
    let mut valid_until = None;
    let unlabelled_at = loop {
        let pod = pods(&env).get("web-0").await.expect("pod");
        let now = k8s_openapi::jiff::Timestamp::now();
        let labels = pod.metadata.labels.unwrap_or_default();
        if !labels.contains_key(LABEL) {
            break now;
        }
        let shown = pod.metadata.annotations.unwrap_or_default();
        if let Some(text) = shown.get("redlock.io/valid-until") {
            valid_until = text.parse::<k8s_openapi::jiff::Timestamp>().ok();
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let valid_until = valid_until.expect("the leader showed its validity");
    assert!(
        unlabelled_at < valid_until,
        "label removed at {unlabelled_at}, after the validity {valid_until}"
    );
    let lost = lock_where(&env, "web", "Lost", |lock| phase(lock) == Some(LockPhase::Lost)).await;
    let message = lost
        .status
        .as_ref()
        .and_then(|status| condition(&status.conditions, "Held"))
        .map(|held| held.message.clone())
        .unwrap_or_default();
    assert!(
        message.contains("the key is released") && message.contains("web-0"),
        "{message}"
    );
    // The leader may act until the validity it was shown (it learns of the loss through its watch, or never when
    // cut off from the API server): the key stays on the master still reached until then. Checked only when the
    // read is known to have come before that time.
    let key = format!("{}/web", env.namespace);
    let (present, _) = key_on(&masters.urls()[2..], &key).await;
    if k8s_openapi::jiff::Timestamp::now() < valid_until {
        assert_eq!(
            present, 1,
            "the key was released before the validity shown to web-0 ended"
        );
    } else {
        println!("the key was read after the validity shown ended: nothing to check");
    }

    masters[0].cont();
    masters[1].cont();
    wait_for_leader(&env, "web-0").await;
    let lock = lock_where(&env, "web", "held again", |lock| {
        phase(lock) == Some(LockPhase::Held)
    })
    .await;
    assert_eq!(token(&lock), Some(2));
    stop(running, shutdown).await;
    env.cleanup(&[&quorum]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_operator_keeps_the_leader_without_a_transition() {
    let masters = RedisCluster::start(3).expect("masters");
    let env = Env::new().await;
    let (quorum, running, shutdown) = setup(&masters, &env, 23).await;
    ready_pods(&env, &["web-0", "web-1"]).await;
    web_lock(&env, &quorum, "3s", None).await;
    wait_for_leader(&env, "web-0").await;
    lock_where(&env, "web", "held", |lock| phase(lock) == Some(LockPhase::Held)).await;

    let changes = pod_changes(&env).await;
    stop(running, shutdown).await;
    let (running, shutdown) = operator(&env, &installation_secret(23), None).await;
    assert_eq!(labelled(&env).await, ["web-0"]);
    assert_labels_stay(changes, &["web-0"]).await;
    assert_eq!(labelled(&env).await, ["web-0"]);
    assert_first_hold_kept(&env, "web").await;
    stop(running, shutdown).await;
    env.cleanup(&[&quorum]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_clusters_on_one_quorum_have_one_leader_between_them() {
    let masters = RedisCluster::start(3).expect("masters");
    let east = Env::new().await;
    let west = Env::test_server().await;
    let key = format!("leader/{}", east.namespace);
    let mut running = Vec::new();
    for (env, seed) in [(&east, 24u8), (&west, 25u8)] {
        let quorum = env.unique("q");
        env.create_sharing_quorum(&quorum, &masters.urls(), "3s").await;
        ready_pods(env, &["web-0"]).await;
        web_lock(env, &quorum, "3s", Some(&key)).await;
        running.push((operator(env, &installation_secret(seed), None).await, quorum));
    }
    eventually("one leader across both clusters", || async {
        let count = labelled(&east).await.len() + labelled(&west).await.len();
        (count == 1).then_some(())
    })
    .await;
    throughout(Duration::from_secs(2), Duration::from_millis(100), || async {
        let count = labelled(&east).await.len() + labelled(&west).await.len();
        assert!(count <= 1, "two leaders across clusters");
    })
    .await;
    let quorum_name = running[0].1.clone();
    for ((running, shutdown), _) in running {
        stop(running, shutdown).await;
    }
    east.cleanup(&[&quorum_name]).await;
}
