//! End-to-end, bad input and faults: every one ends in a condition or Event a user can act on, with backoff
//! instead of a hot loop, and no panic.

use std::time::Duration;

use crate::e2e::*;
use crate::support::redis_server::{Options, RedisCluster};
use kube::api::{Patch, PatchParams, PostParams};
use redlock_operator::api::{DistributedLock, LockPhase, RedisQuorum};
use tokio::time::Instant;

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

/// A leader lock whose fenceMargin (2s) is not shorter than its ttl (1s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_lock_specs_are_reported_as_conditions() {
    let masters = RedisCluster::start(3).expect("masters");
    let env = Env::new().await;
    let quorum = env.unique("q");
    env.create_quorum(&quorum, &masters.urls(), "2s").await;
    let (running, shutdown) = operator(&env, &installation_secret(11), None).await;
    quorum_available(&env, &quorum).await;

    // What only the operator can judge (admission sees one object, not the quorum it names): always admitted,
    // always reported as conditions.
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
        "apiVersion": "redlock.io/v1beta1", "kind": "DistributedLock",
        "metadata": { "name": "batch" },
        "spec": { "quorum": quorum, "ttl": "1s", "holder": { "jobs": {} } }
    }))
    .await;
    lock_where(&env, "batch", "QueueEmpty: a Job lock with no Job", |lock| {
        reason(lock, "Held").as_deref() == Some("QueueEmpty")
    })
    .await;

    // A fence margin as long as the ttl: the CRD's rule refuses it at admission; one admitted before the rule
    // existed is reported by the operator.
    let tight: DistributedLock = serde_json::from_value(serde_json::json!({
        "apiVersion": "redlock.io/v1beta1", "kind": "DistributedLock",
        "metadata": { "name": "tight" },
        "spec": { "quorum": quorum, "ttl": "1s", "holder": { "leaderElection": {
            "selector": { "matchLabels": { "app": "x" } }, "fenceMargin": "2s" } } }
    }))
    .expect("lock");
    let refused = env.locks().create(&PostParams::default(), &tight).await;
    let status = invalid(&refused).expect("refused at admission");
    assert!(
        rule_wording(&status.message)
            .contains("spec: Invalid value: holder.leaderElection.fenceMargin must be shorter than ttl"),
        "{status:?}"
    );
    create_admitted_before_rules(&env, &env.locks(), &[tight]).await;
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
        "apiVersion": "redlock.io/v1beta1", "kind": "RedisQuorum", "metadata": { "name": missing },
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
    // Its first attempt meets the fresh masters quarantined (issue 30: its Event said so, and went on saying it
    // after two masters were shut down).
    env.create_lock("first-cause", &quorum, "x", "2s").await;
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
        let all = kube::Api::all(env.client.clone());
        events_seen(&all, None, &quorum, &["MasterDown", "MasterQuarantined"]).await;
    }
    // Two masters gone (whatever the restarted one's quarantine does meanwhile): the lock cannot be kept, and its
    // Event tells the cause now — masters not answering — not the first one's words. Events mark a change of
    // phase: the lock must have been held first (on a loaded machine its first hold can come after the waits
    // above, and a lock still pending since the quarantine publishes nothing new).
    lock_where(&env, "first-cause", "held once every master voted", |lock| {
        phase(lock) == Some(LockPhase::Held)
    })
    .await;
    masters[1].kill();
    masters[2].kill();
    eventually("the lock's Event to say masters do not answer", || async {
        let events = env.events().list(&Default::default()).await.ok()?;
        events
            .items
            .iter()
            .any(|event| {
                event.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("first-cause")
                    && event.reason.as_deref() == Some("QuorumUnavailable")
                    && event.note.as_deref().is_some_and(|note| {
                        ["not connected", "failed", "timed out"]
                            .iter()
                            .any(|cause| note.contains(cause))
                    })
            })
            .then_some(())
    })
    .await;
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

/// The holder part of each master's value of `key` (values are `holder|secret`).
async fn holders_on(masters: &RedisCluster, key: &str) -> Vec<Option<String>> {
    let mut holders = Vec::new();
    for url in masters.urls() {
        let value = crate::support::redis_server::raw_get(&url, key).await;
        holders.push(value.and_then(|value| value.split('|').next().map(str::to_owned)));
    }
    holders
}

fn majority_holds(holders: &[Option<String>], holder: &str) -> bool {
    holders.iter().filter(|h| h.as_deref() == Some(holder)).count() > holders.len() / 2
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_cut_off_from_the_api_keeps_its_locks_and_shows_them_fresh_when_it_answers_again() {
    let masters = RedisCluster::start(3).expect("masters");
    let env = Env::new().await;
    let quorum = env.unique("q");
    env.create_quorum(&quorum, &masters.urls(), "10s").await;
    let (client, proxy) = env.client_behind_proxy().await;
    let (running, shutdown) =
        operator_with_client(&env, client, &installation_secret(15), Some("solo")).await;
    eventually("the replica to lead", || async {
        running.leadership.is_leader().then_some(())
    })
    .await;
    all_masters_voting(&env, &quorum, 3).await;
    let names = ["a", "b", "c"];
    for name in names {
        env.create_lock(name, &quorum, &format!("app-{name}"), "2s").await;
    }
    for name in names {
        lock_where(&env, name, "held", |lock| phase(lock) == Some(LockPhase::Held)).await;
    }

    // The whole control plane is gone for this operator: connections refused, open ones cut.
    proxy.refuse(true);
    proxy.cut_all();
    eventually("leadership to lapse", || async {
        running.leadership.is_unconfirmed().then_some(())
    })
    .await;
    // Three TTLs: without extensions every key would have expired twice over.
    let outage = Instant::now();
    while outage.elapsed() < Duration::from_secs(6) {
        for name in names {
            let holders = holders_on(&masters, &format!("{}/{name}", env.namespace)).await;
            assert!(
                majority_holds(&holders, &format!("app-{name}")),
                "lock {name} lapsed in Redis during the outage: {holders:?}"
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(!running.leadership.is_leader(), "no API write while cut off");

    proxy.heal();
    let now = k8s_openapi::jiff::Timestamp::now();
    for name in names {
        let lock = lock_where(&env, name, "fresh again", |lock| {
            let valid_until = lock.status.as_ref().and_then(|status| status.valid_until.clone());
            phase(lock) == Some(LockPhase::Held) && valid_until.is_some_and(|until| until.0 > now)
        })
        .await;
        let status = lock.status.unwrap_or_default();
        assert_eq!(
            (status.fencing_token, status.transitions),
            (Some(1), 1),
            "lock {name}: no new token, no transition"
        );
        assert!(
            !event_reasons(&env.events(), Some("DistributedLock"), name)
                .await
                .contains(&"Lost".to_owned())
        );
    }
    stop(running, shutdown).await;
    env.cleanup(&[&quorum]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_cut_off_while_a_standby_takes_over_stops_once_the_standby_hands_the_lock_over() {
    let masters = RedisCluster::start(3).expect("masters");
    let env = Env::new().await;
    let quorum = env.unique("q");
    env.create_quorum(&quorum, &masters.urls(), "10s").await;
    let secret = installation_secret(16);
    let (client, proxy) = env.client_behind_proxy().await;
    let (first, first_stop) = operator_with_client(&env, client, &secret, Some("first")).await;
    eventually("first to lead", || async {
        first.leadership.is_leader().then_some(())
    })
    .await;
    let (second, second_stop) = operator(&env, &secret, Some("second")).await;
    all_masters_voting(&env, &quorum, 3).await;
    env.create_lock("ha", &quorum, "app", "2s").await;
    lock_where(&env, "ha", "held", |lock| phase(lock) == Some(LockPhase::Held)).await;
    let key = format!("{}/ha", env.namespace);

    proxy.refuse(true);
    proxy.cut_all();
    eventually("the standby to take over and resume the lock", || async {
        (second.leadership.is_leader() && !second.keeper.is_empty()).then_some(())
    })
    .await;
    assert!(
        first.leadership.is_unconfirmed(),
        "the cut-off replica has not seen its successor"
    );
    assert!(!first.keeper.is_empty(), "and still extends what it holds");
    let lock = env.locks().get("ha").await.expect("lock");
    assert_eq!(token(&lock), Some(1), "resumed, not acquired anew");

    // The successor hands the lock over: it releases the old value (the same derived value the cut-off replica
    // extends) and acquires for the new holder. The cut-off replica's compare-and-extend now fails, and it never
    // re-creates the old holder's key.
    env.locks()
        .patch(
            "ha",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({ "spec": { "holder": { "identity": "app-2" } } })),
        )
        .await
        .expect("change the holder");
    lock_where(&env, "ha", "held by app-2", |lock| {
        phase(lock) == Some(LockPhase::Held)
            && lock.status.as_ref().and_then(|s| s.holder.as_deref()) == Some("app-2")
    })
    .await;
    let handed_over = Instant::now();
    while handed_over.elapsed() < Duration::from_secs(4) {
        let holders = holders_on(&masters, &key).await;
        assert!(
            !holders.iter().any(|holder| holder.as_deref() == Some("app")),
            "the old holder's key came back: {holders:?}"
        );
        assert!(majority_holds(&holders, "app-2"), "{holders:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Back in touch, the cut-off replica sees the successor and drops everything.
    proxy.heal();
    eventually("the old replica to see its successor and let go", || async {
        (!first.leadership.may_extend_held() && first.keeper.is_empty()).then_some(())
    })
    .await;
    assert!(second.leadership.is_leader());
    stop(first, first_stop).await;
    stop(second, second_stop).await;
    env.cleanup(&[&quorum]).await;
}

/// Issue 22: a takeover that fails gives up what is left of its predecessor's keys once the holder is fenced.
/// Left alone, the two masters that still hold the key (and that the failed takeover just extended) would keep
/// it for a whole TTL, and with one more master down nobody could get a majority until then: a minute here,
/// longer than the test waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_takeover_gives_up_the_predecessors_keys_once_its_holder_is_fenced() {
    let masters = RedisCluster::start(5).expect("masters");
    let env = Env::new().await;
    let quorum = env.unique("q");
    let urls = masters.urls();
    env.create_quorum_from(serde_json::json!({
        "apiVersion": "redlock.io/v1beta1",
        "kind": "RedisQuorum",
        "metadata": { "name": quorum },
        // Durable masters: no quarantine to wait out before a one-minute lock.
        "spec": { "endpoints": urls, "maxTtl": "60s", "assumeDurable": true },
    }))
    .await;
    let secret = installation_secret(18);
    let (first, first_stop) = operator(&env, &secret, Some("first")).await;
    all_masters_voting(&env, &quorum, 5).await;
    env.create_lock("orphan", &quorum, "app", "60s").await;
    lock_where(&env, "orphan", "held", |lock| {
        phase(lock) == Some(LockPhase::Held)
    })
    .await;
    let key = format!("{}/orphan", env.namespace);
    let (_, values) = key_on(&urls, &key).await;
    let value = values.first().expect("the key on a majority").clone();
    stop(first, first_stop).await;

    // What the predecessor left: its key on two masters only, one master hung, and a status whose validity has
    // run out, so that the successor's takeover fails at once and the lock counts as lost.
    for url in &urls[2..] {
        let client = redis::Client::open(url.as_str()).expect("url");
        let mut conn = client.get_multiplexed_async_connection().await.expect("connect");
        redis::cmd("DEL")
            .arg(&key)
            .query_async::<()>(&mut conn)
            .await
            .expect("DEL");
    }
    masters[4].stop();
    let mut lock = env.locks().get("orphan").await.expect("lock");
    if let Some(status) = lock.status.as_mut() {
        status.valid_until = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
            k8s_openapi::jiff::Timestamp::now(),
        ));
    }
    env.locks()
        .replace_status("orphan", &Default::default(), &lock)
        .await
        .expect("status");

    let (second, second_stop) = operator(&env, &secret, Some("second")).await;
    let lock = lock_where(&env, "orphan", "held again with a new token", |lock| {
        phase(lock) == Some(LockPhase::Held) && token(lock).is_some_and(|token| token > 1)
    })
    .await;
    let (_, values) = key_on(&urls[..4], &key).await;
    assert!(
        !values.contains(&value),
        "the predecessor's key is still there: {values:?} ({:?})",
        lock.status
    );
    masters[4].cont();
    stop(second, second_stop).await;
    env.cleanup(&[&quorum]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quorum_with_hung_masters_delays_no_other_quorums_locks() {
    let fast_masters = RedisCluster::start(3).expect("masters");
    let slow_masters = RedisCluster::start(3).expect("masters");
    let env = Env::new().await;
    let fast = env.unique("fast");
    let slow = env.unique("slow");
    env.create_quorum(&fast, &fast_masters.urls(), "3s").await;
    // Three-second node timeouts: every extension on it waits that long for the hung masters, longer than the
    // fast lock can go without one (extended a second in, reported lost 2.4 s in).
    env.create_quorum_from(serde_json::json!({
        "apiVersion": "redlock.io/v1beta1",
        "kind": "RedisQuorum",
        "metadata": { "name": slow },
        "spec": { "endpoints": slow_masters.urls(), "maxTtl": "30s", "nodeTimeout": "3s", "assumeDurable": true }
    }))
    .await;
    let (running, shutdown) = operator(&env, &installation_secret(17), None).await;
    all_masters_voting(&env, &fast, 3).await;
    all_masters_voting(&env, &slow, 3).await;
    env.create_lock("on-fast", &fast, "app-fast", "3s").await;
    env.create_lock("on-slow", &slow, "app-slow", "30s").await;
    let held = lock_where(&env, "on-fast", "held", |lock| {
        phase(lock) == Some(LockPhase::Held)
    })
    .await;
    let first_token = token(&held);
    lock_where(&env, "on-slow", "held", |lock| {
        phase(lock) == Some(LockPhase::Held)
    })
    .await;

    // A majority of the slow quorum hangs: its extensions each wait the full node timeout, then fail, until its
    // lock is reported lost. All that time, the fast quorum's lock is extended on its own schedule.
    slow_masters[0].stop();
    slow_masters[1].stop();
    let locks = env.locks();
    eventually_within(
        "the slow quorum's lock to be reported lost",
        Duration::from_secs(90),
        || {
            let locks = locks.clone();
            async move {
                let fast_lock = locks.get("on-fast").await.ok()?;
                assert_eq!(
                    (phase(&fast_lock), token(&fast_lock)),
                    (Some(LockPhase::Held), first_token),
                    "the fast quorum's lock was lost while the slow quorum's masters hung"
                );
                let slow_lock = locks.get("on-slow").await.ok()?;
                (phase(&slow_lock) != Some(LockPhase::Held)).then_some(())
            }
        },
    )
    .await;
    assert!(
        !event_reasons(&env.events(), Some("DistributedLock"), "on-fast")
            .await
            .contains(&"Lost".to_owned()),
        "no loss of the fast lock, even between two looks"
    );
    slow_masters[0].cont();
    slow_masters[1].cont();
    stop(running, shutdown).await;
    env.cleanup(&[&fast, &slow]).await;
}
