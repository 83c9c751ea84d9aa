//! End-to-end: fencing tokens strictly increase per (quorum, key) — across re-creation of a lock, a second
//! object naming the key, an operator restart, two clusters and the `lock` command sharing the key, and masters
//! that forgot their counters — and a token that cannot advance is a condition and a Warning Event, not a stall.
//! On the in-process test API server, or a real cluster with `REDLOCK_E2E_KUBECONFIG`. Assertions are on order
//! and outcomes only, never on timing.

use std::time::Duration;

use crate::e2e::*;
use crate::support::redis_server::RedisCluster;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use redlock_operator::api::LockPhase;

const TTL: &str = "2s";
const MAX_TTL: &str = "2s";

/// A lock on the shared key `key` of `quorum`, held by `identity`.
async fn create_keyed_lock(env: &Env, name: &str, quorum: &str, key: &str, identity: &str) {
    env.create_lock_from(serde_json::json!({
        "apiVersion": "redlock.io/v1beta1", "kind": "DistributedLock",
        "metadata": { "name": name },
        "spec": { "quorum": quorum, "ttl": TTL, "resourceKey": key, "holder": { "identity": identity } }
    }))
    .await;
}

/// Waits until `name` is held, and returns its token.
async fn held_token(env: &Env, name: &str) -> i64 {
    let lock = lock_where(env, name, "the lock to be held", |lock| {
        phase(lock) == Some(LockPhase::Held)
    })
    .await;
    token(&lock).expect("a held lock shows its token")
}

/// Deletes `name` and waits until it is gone (its key released by the operator's finalizer).
async fn delete_lock(env: &Env, name: &str) {
    env.locks()
        .delete(name, &DeleteParams::default())
        .await
        .expect("delete");
    eventually("the object to go", || async {
        env.locks().get_opt(name).await.ok()?.is_none().then_some(())
    })
    .await;
}

/// Every master forgets everything, counters included, as a restart without persistence would (without the
/// restart: no quarantine, so the next acquisition meets the empty masters at once).
async fn flush_all(masters: &RedisCluster) {
    for url in masters.urls() {
        let client = redis::Client::open(url.as_str()).expect("url");
        let mut conn = client.get_multiplexed_async_connection().await.expect("connect");
        redis::cmd("FLUSHALL")
            .query_async::<()>(&mut conn)
            .await
            .expect("FLUSHALL");
    }
}

/// The token the cluster's floor record holds for `key`.
async fn floor_record_token(env: &Env, key: &str) -> Option<i64> {
    let api: Api<ConfigMap> = Api::namespaced(env.client.clone(), &env.namespace);
    let records = api
        .list(&ListParams::default().labels("app.kubernetes.io/managed-by=redlock-operator"))
        .await
        .expect("list ConfigMaps");
    records
        .items
        .into_iter()
        .filter_map(|record| record.data)
        .find(|data| data.get("key").map(String::as_str) == Some(key))
        .and_then(|data| data.get("token")?.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_increase_across_re_creation_a_second_object_and_an_operator_restart() {
    let masters = RedisCluster::start(3).expect("masters");
    let env = Env::new().await;
    let quorum = env.unique("q");
    env.create_sharing_quorum(&quorum, &masters.urls(), MAX_TTL).await;
    let (running, shutdown) = operator(&env, &installation_secret(41), None).await;
    quorum_available(&env, &quorum).await;
    let key = format!("orders-{}", env.namespace);

    create_keyed_lock(&env, "first", &quorum, &key, "alpha").await;
    let first = held_token(&env, "first").await;

    // (a) Deleted and re-created: a new object (new uid, empty status) with the same name.
    delete_lock(&env, "first").await;
    create_keyed_lock(&env, "first", &quorum, &key, "alpha").await;
    let recreated = held_token(&env, "first").await;
    assert!(recreated > first, "re-created: {recreated} after {first}");

    // (b) A second object naming the same key waits for it, then gets a higher token.
    create_keyed_lock(&env, "second", &quorum, &key, "beta").await;
    lock_where(&env, "second", "the second lock to wait for the key", |lock| {
        phase(lock) == Some(LockPhase::Contended)
    })
    .await;
    delete_lock(&env, "first").await;
    let second = held_token(&env, "second").await;
    assert!(second > recreated, "second object: {second} after {recreated}");

    // (c) A fresh operator (no memory of any token) and a re-created object (no status).
    delete_lock(&env, "second").await;
    stop(running, shutdown).await;
    let (running, shutdown) = operator(&env, &installation_secret(41), None).await;
    create_keyed_lock(&env, "second", &quorum, &key, "beta").await;
    let restarted = held_token(&env, "second").await;
    assert!(restarted > second, "after a restart: {restarted} after {second}");
    assert_eq!(
        floor_record_token(&env, &format!("shared:{key}")).await,
        Some(restarted),
        "the cluster's floor record holds the last token granted"
    );
    stop(running, shutdown).await;
    env.cleanup(&[&quorum]).await;
}

/// The `lock` command takes `key` on `masters` (waiting while another holder has it or a master is still in its
/// restart quarantine) and returns the fencing token its child was given.
async fn lock_command_token(masters: &RedisCluster, key: &str) -> i64 {
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_redlock-operator"))
        .arg("lock")
        .env("REDLOCK_REDIS", masters.urls().join(","))
        .env_remove("RUST_LOG")
        .args(["--ttl", TTL, "--max-ttl", MAX_TTL, "--wait", "60s", key])
        .args(["--", "sh", "-c", "echo $REDLOCK_FENCING_TOKEN"])
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .expect("run redlock-operator lock");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "lock: {stderr}");
    String::from_utf8_lossy(&output.stdout)
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("a token in the child's environment; lock said: {stderr}"))
}

/// Issue 14: one key shared by two clusters (each with its own operator, installation secret and floor record)
/// and a process outside Kubernetes: whoever holds it next gets a higher token, although neither cluster's
/// status, memory or floor record saw the other holders' grants — the masters' counters carry them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_increase_across_two_clusters_and_the_lock_command_on_one_key() {
    let masters = RedisCluster::start(3).expect("masters");
    let east = Env::new().await;
    let west = Env::test_server().await;
    let key = format!("ledger-{}", east.namespace);
    let mut quorums = Vec::new();
    for (env, seed) in [(&east, 44u8), (&west, 45u8)] {
        let quorum = env.unique("q");
        env.create_sharing_quorum(&quorum, &masters.urls(), MAX_TTL).await;
        let operator = operator(env, &installation_secret(seed), None).await;
        quorum_available(env, &quorum).await;
        quorums.push((operator, quorum));
    }
    let (east_quorum, west_quorum) = (quorums[0].1.clone(), quorums[1].1.clone());

    create_keyed_lock(&east, "ledger", &east_quorum, &key, "east").await;
    let first = held_token(&east, "ledger").await;
    delete_lock(&east, "ledger").await;

    create_keyed_lock(&west, "ledger", &west_quorum, &key, "west").await;
    let second = held_token(&west, "ledger").await;
    assert!(second > first, "the other cluster: {second} after {first}");
    delete_lock(&west, "ledger").await;

    let third = lock_command_token(&masters, &format!("shared:{key}")).await;
    assert!(third > second, "the lock command: {third} after {second}");

    create_keyed_lock(&east, "ledger", &east_quorum, &key, "east").await;
    let fourth = held_token(&east, "ledger").await;
    assert!(
        fourth > third,
        "back in the first cluster, whose floor record holds {first}: {fourth} after {third}"
    );

    delete_lock(&east, "ledger").await;
    for ((running, shutdown), _) in quorums {
        stop(running, shutdown).await;
    }
    east.cleanup(&[&east_quorum]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cluster_floor_keeps_tokens_rising_when_every_master_forgets() {
    let masters = RedisCluster::start(3).expect("masters");
    let env = Env::new().await;
    let quorum = env.unique("q");
    env.create_quorum(&quorum, &masters.urls(), MAX_TTL).await;
    let secret = installation_secret(42);
    let (running, shutdown) = operator(&env, &secret, None).await;
    quorum_available(&env, &quorum).await;
    let key = format!("{}/ledger", env.namespace);

    env.create_lock("ledger", &quorum, "writer-a", TTL).await;
    let before = held_token(&env, "ledger").await;
    // A holder change, so that the counters are above 1 and a restart from nothing would show.
    env.locks()
        .patch(
            "ledger",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({ "spec": { "holder": { "identity": "writer-b" } } })),
        )
        .await
        .expect("patch");
    let before = lock_where(&env, "ledger", "held by writer-b", |lock| {
        phase(lock) == Some(LockPhase::Held)
            && lock.status.as_ref().and_then(|s| s.holder.as_deref()) == Some("writer-b")
            && token(lock) > Some(before)
    })
    .await;
    let before = token(&before).expect("token");
    delete_lock(&env, "ledger").await;
    // Only the floor record remembers now: a fresh operator, a new object, masters without counters.
    stop(running, shutdown).await;
    flush_all(&masters).await;
    let (running, shutdown) = operator(&env, &secret, None).await;
    env.create_lock("ledger", &quorum, "writer-a", TTL).await;
    let after = held_token(&env, "ledger").await;
    assert!(
        after > before,
        "every master forgot, the floor record did not: {after} after {before}"
    );
    assert_eq!(floor_record_token(&env, &key).await, Some(after));
    stop(running, shutdown).await;
    env.cleanup(&[&quorum]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_largest_token_is_a_condition_and_a_warning_not_a_stall() {
    let masters = RedisCluster::start(3).expect("masters");
    let env = Env::new().await;
    let quorum = env.unique("q");
    env.create_quorum(&quorum, &masters.urls(), MAX_TTL).await;
    let (running, shutdown) = operator(&env, &installation_secret(43), None).await;
    quorum_available(&env, &quorum).await;
    env.create_lock("forged", &quorum, "holder", TTL).await;
    let granted = held_token(&env, "forged").await;

    // Someone allowed to write the status sets the largest token there is.
    env.locks()
        .patch_status(
            "forged",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({ "status": { "fencingToken": i64::MAX } })),
        )
        .await
        .expect("forge the status");
    let stuck = lock_where(&env, "forged", "Ready=False FencingTokenExhausted", |lock| {
        lock.status.as_ref().is_some_and(|status| {
            condition(&status.conditions, "Ready")
                .is_some_and(|ready| ready.status == "False" && ready.reason == "FencingTokenExhausted")
        })
    })
    .await;
    let status = stuck.status.expect("status");
    assert_ne!(
        status.phase,
        Some(LockPhase::Held),
        "no holder above the largest token"
    );
    let message = &condition(&status.conditions, "Ready").expect("Ready").message;
    assert!(
        message.contains(&i64::MAX.to_string()) && message.contains("status.fencingToken"),
        "says what is at the limit and what to reset: {message}"
    );
    events_seen(&env.events(), None, "forged", &["FencingTokenExhausted"]).await;

    // Repaired as the message says (the status reset; the masters and the floor record were never at the
    // limit): held again, above every token granted before. Looked at again within the repair retry.
    env.locks()
        .patch_status(
            "forged",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({ "status": { "fencingToken": 0 } })),
        )
        .await
        .expect("repair the status");
    let repaired = eventually_within(
        "held again after the repair",
        Duration::from_secs(120),
        || async {
            let lock = env.locks().get("forged").await.ok()?;
            (phase(&lock) == Some(LockPhase::Held)).then(|| token(&lock))?
        },
    )
    .await;
    assert!(repaired > granted, "{repaired} after {granted}");
    stop(running, shutdown).await;
    env.cleanup(&[&quorum]).await;
}
