//! End-to-end, bad input and faults: every one ends in a condition or Event a user can act on, with backoff
//! instead of a hot loop, and no panic.

mod e2e;
mod support;

use std::time::Duration;

use e2e::*;
use kube::api::{Patch, PatchParams};
use redlock_operator::api::{DistributedLock, LockPhase, RedisQuorum};
use support::redis_server::{Options, RedisCluster};

fn reason(lock: &DistributedLock, type_: &str) -> Option<String> {
    lock.status
        .as_ref()
        .and_then(|status| condition(&status.conditions, type_))
        .map(|condition| condition.reason.clone())
}

fn quorum_condition(quorum: &RedisQuorum, type_: &str) -> Option<(String, String, String)> {
    quorum
        .status
        .as_ref()
        .and_then(|status| condition(&status.conditions, type_))
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

async fn quorum_where(
    env: &Env,
    name: &str,
    what: &str,
    check: impl Fn(&RedisQuorum) -> bool,
) -> RedisQuorum {
    object_where(&env.quorums(), name, what, check).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_lock_specs_are_reported_as_conditions() {
    let masters = RedisCluster::start(3).expect("masters");
    let env = Env::new().await;
    let quorum = env.unique("q");
    env.create_quorum(&quorum, &masters.urls(), "2s").await;
    let (running, shutdown) = operator(&env, &installation_secret(11), None).await;
    quorum_available(&env, &quorum).await;

    env.create_lock("orphan", "no-such-quorum", "x", "1s").await;
    let orphan = lock_where(&env, "orphan", "QuorumNotFound", |lock| {
        reason(lock, "Ready").as_deref() == Some("QuorumNotFound")
    })
    .await;
    assert_eq!(phase(&orphan), Some(LockPhase::Pending));

    env.create_lock("greedy", &quorum, "x", "10s").await;
    let greedy = lock_where(&env, "greedy", "TtlAboveMaxTtl", |lock| {
        reason(lock, "Ready").as_deref() == Some("TtlAboveMaxTtl")
    })
    .await;
    assert_eq!(phase(&greedy), Some(LockPhase::Invalid));
    let greedy_status = greedy.status.expect("status");
    let message = &condition(&greedy_status.conditions, "Ready")
        .expect("Ready")
        .message;
    assert!(
        message.contains("lower the ttl or raise the quorum's maxTtl"),
        "{message}"
    );

    env.create_lock_from(serde_json::json!({
        "apiVersion": "redlock.io/v1alpha1", "kind": "DistributedLock",
        "metadata": { "name": "batch" },
        "spec": { "quorum": quorum, "ttl": "1s", "holder": { "jobs": {} } }
    }))
    .await;
    lock_where(&env, "batch", "QueueEmpty: a Job lock with no Job", |lock| {
        reason(lock, "Held").as_deref() == Some("QueueEmpty")
    })
    .await;

    env.create_lock_from(serde_json::json!({
        "apiVersion": "redlock.io/v1alpha1", "kind": "DistributedLock",
        "metadata": { "name": "tight" },
        "spec": { "quorum": quorum, "ttl": "1s", "holder": { "leaderElection": {
            "selector": { "matchLabels": { "app": "x" } }, "fenceMargin": "2s" } } }
    }))
    .await;
    lock_where(&env, "tight", "InvalidFenceMargin", |lock| {
        reason(lock, "Ready").as_deref() == Some("InvalidFenceMargin")
    })
    .await;

    // Fixing the spec is picked up: the invalid lock becomes held.
    env.locks()
        .patch(
            "greedy",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({ "spec": { "ttl": "1s" } })),
        )
        .await
        .expect("patch");
    lock_where(&env, "greedy", "held after the fix", |lock| {
        phase(lock) == Some(LockPhase::Held)
    })
    .await;
    stop(running, shutdown).await;
    env.cleanup(&[&quorum]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quorum_problems_are_reported_on_the_quorum_and_its_locks() {
    let masters = RedisCluster::start_with(3, |_| Options {
        password: Some("right-password".into()),
        ..Options::default()
    })
    .expect("masters");
    let env = Env::new().await;
    let (running, shutdown) = operator(&env, &installation_secret(12), None).await;
    let plain: Vec<String> = masters
        .servers()
        .iter()
        .map(|server| format!("redis://127.0.0.1:{}", server.port()))
        .collect();

    // Missing Secret.
    let missing = env.unique("missing");
    env.create_quorum_from(serde_json::json!({
        "apiVersion": "redlock.io/v1alpha1", "kind": "RedisQuorum", "metadata": { "name": missing },
        "spec": { "endpoints": plain, "maxTtl": "2s", "auth": { "secretNamespace": env.namespace, "secretName": "redis-auth" } }
    }))
    .await;
    let quorum = quorum_where(&env, &missing, "SecretNotFound", |q| {
        quorum_condition(q, "Available").is_some_and(|(_, reason, _)| reason == "SecretNotFound")
    })
    .await;
    let (_, _, message) = quorum_condition(&quorum, "Available").expect("Available");
    assert!(
        message.contains(&format!("Secret {}/redis-auth does not exist", env.namespace)),
        "{message}"
    );
    env.create_lock("waits", &missing, "x", "1s").await;
    lock_where(&env, "waits", "QuorumNotReady on the lock", |lock| {
        reason(lock, "Ready").as_deref() == Some("QuorumNotReady")
    })
    .await;

    // Wrong password: masters refuse; the message says so.
    env.create_secret("redis-auth", &[("password", "wrong-password")])
        .await;
    let quorum = quorum_where(&env, &missing, "TooFewMasters with an auth error", |q| {
        quorum_condition(q, "Available")
            .is_some_and(|(status, reason, _)| status == "False" && reason == "TooFewMasters")
    })
    .await;
    let (_, _, message) = quorum_condition(&quorum, "Available").expect("Available");
    assert!(
        message.to_lowercase().contains("pass") || message.contains("AUTH"),
        "{message}"
    );

    // The right password (a Secret change) is picked up without touching the quorum.
    let secrets: kube::Api<k8s_openapi::api::core::v1::Secret> =
        kube::Api::namespaced(env.client.clone(), &env.namespace);
    secrets
        .patch(
            "redis-auth",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({ "stringData": { "password": "right-password" } })),
        )
        .await
        .expect("patch secret");
    quorum_available(&env, &missing).await;
    lock_where(&env, "waits", "held once the quorum works", |lock| {
        phase(lock) == Some(LockPhase::Held)
    })
    .await;

    // TLS failure: rediss:// against masters that speak plain TCP.
    let tls = env.unique("tls");
    let tls_urls: Vec<String> = plain
        .iter()
        .map(|url| url.replace("redis://", "rediss://"))
        .collect();
    env.create_quorum(&tls, &tls_urls, "2s").await;
    let quorum = quorum_where(&env, &tls, "TLS failure reported", |q| {
        quorum_condition(q, "Available")
            .is_some_and(|(status, _, message)| status == "False" && message.contains("down"))
    })
    .await;
    assert_eq!(quorum.status.expect("status").eligible, Some(0));

    // Unreachable masters: a lock on them waits with a reason.
    let dead_ports: Vec<String> = (0..3)
        .map(|_| {
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .expect("port")
                .local_addr()
                .expect("addr")
                .port();
            format!("redis://127.0.0.1:{port}")
        })
        .collect();
    let dead = env.unique("dead");
    env.create_quorum(&dead, &dead_ports, "2s").await;
    env.create_lock("stranded", &dead, "x", "1s").await;
    let stranded = lock_where(&env, "stranded", "QuorumUnavailable", |lock| {
        reason(lock, "Held").as_deref() == Some("QuorumUnavailable")
    })
    .await;
    assert_eq!(phase(&stranded), Some(LockPhase::Pending));
    stop(running, shutdown).await;
    env.cleanup(&[&missing, &tls, &dead]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quorum_status_follows_quarantine_and_master_failures() {
    // The masters must be fresh when the operator first sees them: on a real cluster, tests wait for their turn.
    let env = Env::new().await;
    let mut masters = RedisCluster::start(3).expect("masters");
    let quorum = env.unique("q");
    env.create_quorum(&quorum, &masters.urls(), "3s").await;
    let (running, shutdown) = operator(&env, &installation_secret(13), None).await;
    let quarantined = quorum_where(&env, &quorum, "fresh masters quarantined", |q| {
        q.status.as_ref().is_some_and(|s| {
            s.masters
                .iter()
                .any(|m| m.state == "Quarantined" && m.quarantined_until.is_some())
        })
    })
    .await;
    assert_eq!(quarantined.status.as_ref().and_then(|s| s.required), Some(2));
    all_masters_voting(&env, &quorum, 3).await;
    masters[2].kill();
    let degraded = quorum_where(&env, &quorum, "one master down", |q| {
        quorum_condition(q, "Degraded").is_some_and(|(status, _, _)| status == "True")
            && q.status
                .as_ref()
                .is_some_and(|s| s.masters.iter().any(|m| m.state == "Down"))
    })
    .await;
    assert_eq!(
        quorum_condition(&degraded, "Available").map(|c| c.0).as_deref(),
        Some("True")
    );
    let down = degraded
        .status
        .expect("status")
        .masters
        .into_iter()
        .find(|m| m.state == "Down")
        .expect("a Down master");
    assert!(down.last_error.is_some());
    masters[2].restart().expect("restart");
    quorum_where(&env, &quorum, "the restarted master quarantined", |q| {
        q.status
            .as_ref()
            .is_some_and(|s| s.masters.iter().any(|m| m.state == "Quarantined"))
    })
    .await;
    if env.is_test_server() {
        // The quorum is cluster-scoped: its Events may be in any namespace.
        let reasons = event_reasons(&kube::Api::all(env.client.clone()), None, &quorum).await;
        assert!(reasons.contains(&"MasterDown".to_owned()), "{reasons:?}");
        assert!(reasons.contains(&"MasterQuarantined".to_owned()), "{reasons:?}");
    }
    assert!(
        metric(running.metrics_addr, "redlock_master_state")
            .await
            .is_some(),
        "master states are exported"
    );
    stop(running, shutdown).await;
    env.cleanup(&[&quorum]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_errors_and_conflicts_are_retried_with_backoff_and_tokens_stay_monotonic() {
    let masters = RedisCluster::start(3).expect("masters");
    let env = Env::test_server().await;
    let server = env.server.as_ref().expect("test server");
    let quorum = env.unique("q");
    env.create_quorum(&quorum, &masters.urls(), "2s").await;
    let (running, shutdown) = operator(&env, &installation_secret(14), None).await;
    quorum_available(&env, &quorum).await;

    // The first status writes fail with 500: the operator backs off and gets there.
    server.fail_next("update", "distributedlocks", 500, 3);
    env.create_lock("flaky", &quorum, "x", "2s").await;
    lock_where(&env, "flaky", "held despite API errors", |lock| {
        phase(lock) == Some(LockPhase::Held)
    })
    .await;
    assert!(
        metric(running.metrics_addr, "redlock_reconcile_errors_total")
            .await
            .unwrap_or(0.0)
            >= 1.0
    );
    let writes = server.request_count("update", "distributedlocks");
    assert!(
        writes < 20,
        "{writes} status writes for one acquisition: a hot loop"
    );

    // Somebody else writes a higher token (another controller that should not exist): ours never goes back.
    let current = env.locks().get("flaky").await.expect("lock");
    let mut forged = current.clone();
    if let Some(status) = forged.status.as_mut() {
        status.fencing_token = Some(40);
        status.phase = Some(LockPhase::Lost);
    }
    env.locks()
        .replace_status("flaky", &Default::default(), &forged)
        .await
        .expect("forge");
    let next = lock_where(&env, "flaky", "held again above the forged token", |lock| {
        phase(lock) == Some(LockPhase::Held) && token(lock).is_some_and(|token| token > 40)
    })
    .await;
    assert_eq!(token(&next), Some(41));
    stop(running, shutdown).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_that_cannot_renew_its_lease_stops_writing_and_another_resumes() {
    let masters = RedisCluster::start(3).expect("masters");
    let env = Env::test_server().await;
    let server = env.server.as_ref().expect("test server");
    let quorum = env.unique("q");
    env.create_quorum(&quorum, &masters.urls(), "10s").await;
    let secret = installation_secret(15);
    let (first, first_stop) = operator(&env, &secret, Some("first")).await;
    eventually("first to lead", || async {
        first.leadership.is_leader().then_some(())
    })
    .await;
    all_masters_voting(&env, &quorum, 3).await;
    env.create_lock("ha", &quorum, "app", "8s").await;
    lock_where(&env, "ha", "held", |lock| phase(lock) == Some(LockPhase::Held)).await;
    assert!(!first.keeper.is_empty());

    server.set_down(true);
    let down_at = tokio::time::Instant::now();
    eventually("the leader to stop writing", || async {
        (!first.leadership.is_leader()).then_some(())
    })
    .await;
    assert!(
        down_at.elapsed() < Duration::from_secs(3),
        "stopped after {:?}",
        down_at.elapsed()
    );
    eventually("held locks forgotten", || async {
        first.keeper.is_empty().then_some(())
    })
    .await;
    server.set_down(false);

    // Either replica may win the Lease now; whichever does resumes the same acquisition.
    let (second, second_stop) = operator(&env, &secret, Some("second")).await;
    eventually("someone resumes the lock", || async {
        (!first.keeper.is_empty() || !second.keeper.is_empty()).then_some(())
    })
    .await;
    let lock = env.locks().get("ha").await.expect("lock");
    assert_eq!((phase(&lock), token(&lock)), (Some(LockPhase::Held), Some(1)));
    stop(first, first_stop).await;
    stop(second, second_stop).await;
}
