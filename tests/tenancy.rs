//! End-to-end: what one tenant's resource can do to the operator and to other tenants — an out-of-range quorum,
//! a leader label naming a selector key, a Secret in another namespace, a lock squatting another namespace's
//! key — against the in-process test API server, or a real cluster when `REDLOCK_E2E_KUBECONFIG` is set.

use crate::e2e::*;
use crate::support::redis_server::RedisCluster;
use k8s_openapi::api::core::v1::{Namespace, Pod, Secret};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use redlock_operator::api::{DistributedLock, LockPhase, RedisQuorum};

const TTL: &str = "2s";
const MAX_TTL: &str = "2s";

fn available_condition(quorum: &RedisQuorum) -> Option<(String, String, String)> {
    let status = quorum.status.as_ref()?;
    let available = condition(&status.conditions, "Available")?;
    Some((
        available.status.clone(),
        available.reason.clone(),
        available.message.clone(),
    ))
}

/// The CRD's rule refuses a quorum whose maxTtl is out of range; one admitted before the bounds existed becomes
/// `Available=False`, and the operator keeps other quorums' locks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_out_of_range_quorum_is_unavailable_and_the_operator_keeps_the_others() {
    let masters = RedisCluster::start(3).expect("masters");
    let env = Env::new().await;
    let good = env.unique("good");
    let huge = env.unique("huge");
    env.create_quorum(&good, &masters.urls(), MAX_TTL).await;
    // Out of range, but a duration the API server can evaluate: one it cannot (say 100000000h, past Go's
    // 2562047h) fails its rule with an evaluation error, which ratcheting does not forgive, so not even the
    // operator's status writes to such a quorum would be admitted.
    let huge_quorum: RedisQuorum = serde_json::from_value(env.own_quorum(serde_json::json!({
        "apiVersion": "redlock.io/v1beta1",
        "kind": "RedisQuorum",
        "metadata": { "name": huge },
        "spec": { "endpoints": masters.urls(), "maxTtl": "48h" }
    })))
    .expect("object");
    let refused = env.quorums().create(&PostParams::default(), &huge_quorum).await;
    let status = invalid(&refused).expect("maxTtl out of range is refused at admission");
    let cause = &status.details.as_ref().expect("details").causes[0];
    assert_eq!(cause.field, "spec.maxTtl");
    assert!(
        cause.message.contains("maxTtl must be between 100ms and 24h"),
        "{status:?}"
    );
    let (running, shutdown) = operator(&env, &installation_secret(1), None).await;
    quorum_available(&env, &good).await;
    env.create_lock("kept", &good, "batch", TTL).await;
    let held = lock_where(&env, "kept", "the lock on the good quorum to be held", |lock| {
        phase(lock) == Some(LockPhase::Held)
    })
    .await;

    create_admitted_before_rules(&env, &env.quorums(), &[huge_quorum]).await;
    env.create_lock("on-huge", &huge, "batch", TTL).await;
    let unavailable = object_where(
        &env.quorums(),
        &huge,
        "the huge quorum to be unavailable",
        |quorum| available_condition(quorum).is_some_and(|(status, _, _)| status == "False"),
    )
    .await;
    let (_, reason, message) = available_condition(&unavailable).expect("condition");
    assert_eq!(reason, "InvalidSpec");
    assert_eq!(message, "spec.maxTtl must be between 100ms and 24h, got 48h");
    lock_where(&env, "on-huge", "the lock on the huge quorum to wait", |lock| {
        phase(lock) == Some(LockPhase::Pending)
            && lock.status.as_ref().is_some_and(|status| {
                condition(&status.conditions, "Ready").is_some_and(|ready| ready.message.contains("maxTtl"))
            })
    })
    .await;

    // Several health intervals later the operator still runs and still extends the other lock.
    let renewed = held
        .status
        .and_then(|status| status.renewed_at)
        .expect("renewed_at");
    lock_where(&env, "kept", "the other lock to be extended", |lock| {
        phase(lock) == Some(LockPhase::Held)
            && token(lock) == Some(1)
            && lock
                .status
                .as_ref()
                .and_then(|status| status.renewed_at.as_ref())
                .is_some_and(|at| at.0 > renewed.0)
    })
    .await;
    assert!(!running.task.is_finished(), "the operator stopped");
    stop(running, shutdown).await;
    env.cleanup(&[&good, &huge]).await;
}

/// A second namespace of the test, with its own locks; removed (finalizers first) on a real cluster.
struct OtherNamespace {
    name: String,
}

impl OtherNamespace {
    async fn create(env: &Env, base: &str) -> Self {
        let name = format!("{}-{base}", env.namespace);
        let api: Api<Namespace> = Api::all(env.client.clone());
        let namespace: Namespace =
            serde_json::from_value(serde_json::json!({ "metadata": { "name": name } })).expect("namespace");
        api.create(&PostParams::default(), &namespace)
            .await
            .expect("create namespace");
        env.made_namespace(&name);
        Self { name }
    }

    fn locks(&self, env: &Env) -> Api<DistributedLock> {
        Api::namespaced(env.client.clone(), &self.name)
    }

    async fn cleanup(&self, env: &Env) {
        if env.is_test_server() {
            return;
        }
        if let Ok(locks) = self.locks(env).list(&Default::default()).await {
            let unfinalize = Patch::Merge(serde_json::json!({ "metadata": { "finalizers": null } }));
            for lock in locks.items {
                let name = lock.name_any();
                let _ = self
                    .locks(env)
                    .patch(&name, &PatchParams::default(), &unfinalize)
                    .await;
                let _ = self.locks(env).delete(&name, &DeleteParams::default()).await;
            }
        }
        let api: Api<Namespace> = Api::all(env.client.clone());
        let _ = api.delete(&self.name, &DeleteParams::default()).await;
    }
}

fn identity_lock(name: &str, quorum: &str, identity: &str, key: Option<&str>) -> DistributedLock {
    let mut spec = serde_json::json!({ "quorum": quorum, "ttl": TTL, "holder": { "identity": identity } });
    if let Some(key) = key {
        spec["resourceKey"] = serde_json::json!(key);
    }
    serde_json::from_value(serde_json::json!({
        "apiVersion": "redlock.io/v1beta1", "kind": "DistributedLock",
        "metadata": { "name": name }, "spec": spec
    }))
    .expect("lock object")
}

/// A quorum on `masters` whose keys under `global:` the `namespaces` share.
async fn sharing_quorum(env: &Env, masters: &RedisCluster, namespaces: &[&str]) -> String {
    let quorum = env.unique("q");
    env.create_quorum_from(serde_json::json!({
        "apiVersion": "redlock.io/v1beta1", "kind": "RedisQuorum", "metadata": { "name": quorum },
        "spec": { "endpoints": masters.urls(), "maxTtl": MAX_TTL, "nodeTimeout": "100ms",
                  "sharedKeys": { "namespaces": namespaces, "prefix": "global:" } }
    }))
    .await;
    quorum
}

/// Our `report` lock on the shared `key`, held, then the partner namespace's `report` lock on it.
async fn ours_held_then_theirs(env: &Env, partner: &OtherNamespace, quorum: &str, key: &str) {
    env.locks()
        .create(
            &PostParams::default(),
            &identity_lock("report", quorum, "ours", Some(key)),
        )
        .await
        .expect("our lock");
    held_lock(&env.locks(), "report").await;
    partner
        .locks(env)
        .create(
            &PostParams::default(),
            &identity_lock("report", quorum, "theirs", Some(key)),
        )
        .await
        .expect("partner lock");
}

async fn held_lock(api: &Api<DistributedLock>, name: &str) -> DistributedLock {
    object_where(api, name, "the lock to be held", |lock| {
        phase(lock) == Some(LockPhase::Held)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quorum_naming_a_secret_in_another_namespace_is_refused_without_reading_it() {
    let masters = RedisCluster::start(1).expect("masters");
    let env = Env::new().await;
    let other = OtherNamespace::create(&env, "team-b").await;
    // A Secret the operator could read (the test server and the e2e RBAC allow it): the refusal must come before.
    let secrets: Api<Secret> = Api::namespaced(env.client.clone(), &other.name);
    let secret: Secret = serde_json::from_value(serde_json::json!({
        "metadata": { "name": "their-redis" }, "stringData": { "password": "theirs", "username": "their-user" }
    }))
    .expect("secret");
    secrets
        .create(&PostParams::default(), &secret)
        .await
        .expect("secret");
    let quorum = env.unique("q");
    env.create_quorum_from(serde_json::json!({
        "apiVersion": "redlock.io/v1beta1", "kind": "RedisQuorum", "metadata": { "name": quorum },
        "spec": { "endpoints": masters.urls(), "maxTtl": MAX_TTL,
                  "auth": { "secretNamespace": other.name, "secretName": "their-redis", "usernameKey": "username" } }
    }))
    .await;
    let (running, shutdown) = operator(&env, &installation_secret(2), None).await;
    let refused = object_where(&env.quorums(), &quorum, "the quorum to be refused", |quorum| {
        available_condition(quorum).is_some_and(|(status, _, _)| status == "False")
    })
    .await;
    let (_, reason, message) = available_condition(&refused).expect("condition");
    assert_eq!(reason, "SecretNamespaceNotAllowed");
    assert!(message.contains(&format!("`{}`", other.name)), "{message}");
    assert!(message.contains(&format!("`{}`", env.namespace)), "{message}");
    let shown = serde_json::to_string(&refused).expect("json");
    assert!(
        !shown.contains("their-user") && !shown.contains("theirs"),
        "{shown}"
    );
    let reasons = event_reasons(&env.events(), Some("RedisQuorum"), &quorum).await;
    assert!(
        reasons.iter().all(|reason| reason == "SecretNamespaceNotAllowed"),
        "{reasons:?}"
    );
    stop(running, shutdown).await;
    other.cleanup(&env).await;
    env.cleanup(&[&quorum]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_naming_another_namespaces_key_does_not_block_it() {
    let masters = RedisCluster::start(3).expect("masters");
    let env = Env::new().await;
    let victim = OtherNamespace::create(&env, "payments").await;
    let quorum = env.unique("q");
    env.create_quorum(&quorum, &masters.urls(), MAX_TTL).await;
    let (running, shutdown) = operator(&env, &installation_secret(3), None).await;
    quorum_available(&env, &quorum).await;

    // The squatter first, naming the victim's default key `<victim namespace>/payments`.
    let squatted = format!("{}/payments", victim.name);
    env.locks()
        .create(
            &PostParams::default(),
            &identity_lock("squatter", &quorum, "squatter-holder", Some(&squatted)),
        )
        .await
        .expect("squatter");
    held_lock(&env.locks(), "squatter").await;
    victim
        .locks(&env)
        .create(
            &PostParams::default(),
            &identity_lock("payments", &quorum, "payments-holder", None),
        )
        .await
        .expect("victim lock");
    let theirs = held_lock(&victim.locks(&env), "payments").await;
    let status = theirs.status.expect("status");
    assert_eq!(status.holder.as_deref(), Some("payments-holder"));
    assert_eq!(status.blocked_by, None);

    let (count, values) = key_on(&masters.urls(), &squatted).await;
    assert!(
        count >= 2 && values.iter().all(|value| value.starts_with("payments-holder|")),
        "{values:?}"
    );
    let scoped = format!("{}/{squatted}", env.namespace);
    let (count, values) = key_on(&masters.urls(), &scoped).await;
    assert!(
        count >= 2 && values.iter().all(|value| value.starts_with("squatter-holder|")),
        "{values:?}"
    );
    stop(running, shutdown).await;
    victim.cleanup(&env).await;
    env.cleanup(&[&quorum]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespaces_the_quorum_lets_share_keys_contend_for_one_lock() {
    let masters = RedisCluster::start(3).expect("masters");
    let env = Env::new().await;
    let partner = OtherNamespace::create(&env, "partner").await;
    let outsider = OtherNamespace::create(&env, "outsider").await;
    let quorum = sharing_quorum(&env, &masters, &[&env.namespace, &partner.name]).await;
    let (running, shutdown) = operator(&env, &installation_secret(4), None).await;
    quorum_available(&env, &quorum).await;
    let key = "reports";
    ours_held_then_theirs(&env, &partner, &quorum, key).await;
    outsider
        .locks(&env)
        .create(
            &PostParams::default(),
            &identity_lock("report", &quorum, "outside", Some(key)),
        )
        .await
        .expect("outsider lock");
    let contended = object_where(&partner.locks(&env), "report", "the partner to wait", |lock| {
        phase(lock) == Some(LockPhase::Contended)
    })
    .await;
    assert_eq!(
        contended.status.and_then(|status| status.blocked_by).as_deref(),
        Some("ours"),
        "a shared key shows its holder"
    );
    // Not listed: its key stays its own.
    held_lock(&outsider.locks(&env), "report").await;
    let (count, values) = key_on(&masters.urls(), &format!("global:{key}")).await;
    assert!(
        count >= 2 && values.iter().all(|value| value.starts_with("ours|")),
        "{values:?}"
    );
    stop(running, shutdown).await;
    partner.cleanup(&env).await;
    outsider.cleanup(&env).await;
    env.cleanup(&[&quorum]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_label_naming_a_selector_key_is_refused_and_no_pod_is_touched() {
    let masters = RedisCluster::start(1).expect("masters");
    let env = Env::new().await;
    let quorum = env.unique("q");
    env.create_quorum(&quorum, &masters.urls(), MAX_TTL).await;
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), &env.namespace);
    let lock: DistributedLock = serde_json::from_value(serde_json::json!({
        "apiVersion": "redlock.io/v1beta1", "kind": "DistributedLock", "metadata": { "name": "web" },
        "spec": { "quorum": quorum, "ttl": TTL, "holder": { "leaderElection": {
            "selector": { "matchLabels": { "app": "web" } }, "leaderLabel": "app" } } }
    }))
    .expect("lock");
    let refused = env.locks().create(&PostParams::default(), &lock).await;
    let status = invalid(&refused).expect("refused at admission");
    assert!(
        status
            .message
            .contains("leaderLabel must not be a key of selector.matchLabels"),
        "{status:?}"
    );
    // One admitted before the rule existed: the operator refuses it too, and touches no pod.
    for name in ["web-0", "web-1"] {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": { "name": name, "labels": { "app": "web" } },
            "spec": { "nodeName": env.node_name(),
                      "containers": [{ "name": "app", "image": "registry.invalid/app:1" }] }
        }))
        .expect("pod");
        pods.create(&PostParams::default(), &pod).await.expect("pod");
        let ready = serde_json::json!({ "status": { "phase": "Running",
            "conditions": [{ "type": "Ready", "status": "True" }] } });
        pods.patch_status(name, &PatchParams::default(), &Patch::Merge(&ready))
            .await
            .expect("ready");
    }
    let (running, shutdown) = operator(&env, &installation_secret(5), None).await;
    create_admitted_before_rules(&env, &env.locks(), &[lock]).await;
    let invalid = lock_where(&env, "web", "the lock to be invalid", |lock| {
        phase(lock) == Some(LockPhase::Invalid)
    })
    .await;
    let ready = condition(&invalid.status.as_ref().expect("status").conditions, "Ready")
        .expect("Ready")
        .clone();
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("False", "InvalidLeaderLabel")
    );
    assert!(
        ready.message.contains("is a key of the selector"),
        "{}",
        ready.message
    );
    for name in ["web-0", "web-1"] {
        let pod = pods.get(name).await.expect("pod");
        assert_eq!(
            pod.labels().get("app").map(String::as_str),
            Some("web"),
            "{name} lost its label"
        );
    }
    stop(running, shutdown).await;
    env.cleanup(&[&quorum]).await;
}

/// Issue 29: a lock on a shared key (`resourceKey` under the quorum's `sharedKeys` prefix) deleted while no
/// operator ran is released by the next one on the key every acquisition makes — not on a key built by hand,
/// which would leave the real one to expire. The key is pinned for ten minutes first, so only a release frees it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_lock_on_a_shared_key_is_released_by_the_next_operator_on_that_key() {
    let masters = RedisCluster::start(3).expect("masters");
    let env = Env::new().await;
    let quorum = env.unique("q");
    env.create_quorum_from(serde_json::json!({
        "apiVersion": "redlock.io/v1beta1", "kind": "RedisQuorum", "metadata": { "name": quorum },
        "spec": { "endpoints": masters.urls(), "maxTtl": MAX_TTL, "nodeTimeout": "100ms",
                  "sharedKeys": { "namespaces": [env.namespace], "prefix": "global:" } }
    }))
    .await;
    let secret = installation_secret(5);
    let (running, shutdown) = operator(&env, &secret, None).await;
    quorum_available(&env, &quorum).await;
    env.locks()
        .create(
            &PostParams::default(),
            &identity_lock("report", &quorum, "ours", Some("reports")),
        )
        .await
        .expect("lock");
    held_lock(&env.locks(), "report").await;
    stop(running, shutdown).await;
    let key = "global:reports";
    for url in masters.urls() {
        let mut conn = redis::Client::open(url.as_str())
            .expect("url")
            .get_multiplexed_async_connection()
            .await
            .expect("connect");
        let _: i64 = redis::cmd("PEXPIRE")
            .arg(key)
            .arg(600_000)
            .query_async(&mut conn)
            .await
            .expect("PEXPIRE");
    }
    let (count, _) = key_on(&masters.urls(), key).await;
    assert!(count >= 2, "the lock's key is held on a majority");
    env.locks()
        .delete("report", &DeleteParams::default())
        .await
        .expect("delete");

    let (running, shutdown) = operator(&env, &secret, None).await;
    eventually("the lock to be gone and its shared key released", || async {
        let gone = env.locks().get_opt("report").await.ok()?.is_none();
        let (count, _) = key_on(&masters.urls(), key).await;
        (gone && count == 0).then_some(())
    })
    .await;
    stop(running, shutdown).await;
    env.cleanup(&[&quorum]).await;
}

/// Issue 31: a lock waiting for a shared key waits in the key's fair queue, beside `lock --wait` commands (an
/// engine waiting fairly here): its status shows its place (the `Place` column), and it gets the key before a
/// waiter that asked after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_waiting_for_a_shared_key_keeps_its_place_in_the_fair_queue() {
    let masters = RedisCluster::start(3).expect("masters");
    let env = Env::new().await;
    let partner = OtherNamespace::create(&env, "queue").await;
    let quorum = sharing_quorum(&env, &masters, &[&env.namespace, &partner.name]).await;
    let (running, shutdown) = operator(&env, &installation_secret(6), None).await;
    quorum_available(&env, &quorum).await;
    ours_held_then_theirs(&env, &partner, &quorum, "reports").await;
    let next = |lock: &DistributedLock| {
        phase(lock) == Some(LockPhase::Contended)
            && lock.status.as_ref().and_then(|status| status.queue_place) == Some(1)
    };
    object_where(
        &partner.locks(&env),
        "report",
        "the partner lock next in the queue",
        next,
    )
    .await;

    // A `lock --wait` command asks after it.
    let key = "global:reports";
    let mut config = redlock_operator::redlock::RedlockConfig::from_urls(&masters.urls()).expect("config");
    config.assume_durable = true;
    config.node_timeout = std::time::Duration::from_millis(100);
    let engine = redlock_operator::redlock::Redlock::connect(config)
        .await
        .expect("engine");
    let command = tokio::spawn(async move {
        let options = redlock_operator::redlock::AcquireOptions {
            deadline: Some(tokio::time::Instant::now() + std::time::Duration::from_secs(300)),
            fair: true,
            ..Default::default()
        };
        let lease = engine
            .acquire(key, std::time::Duration::from_secs(2), "command", options)
            .await
            .expect("the command gets the key in the end");
        engine.release(&lease).await;
    });
    eventually("the command queued behind the partner lock", || async {
        (masters_queueing(&masters, key, 2).await >= 2).then_some(())
    })
    .await;

    // Our lock goes: the partner lock, first in the queue, gets the key and keeps it; the command waits on.
    env.locks()
        .delete("report", &DeleteParams::default())
        .await
        .expect("delete");
    let held = held_lock(&partner.locks(&env), "report").await;
    assert_eq!(held.status.as_ref().and_then(|status| status.queue_place), None);
    assert!(
        !command.is_finished(),
        "the command got the key before the lock that asked first"
    );
    partner
        .locks(&env)
        .delete("report", &DeleteParams::default())
        .await
        .expect("delete partner lock");
    command.await.expect("the command");
    stop(running, shutdown).await;
    partner.cleanup(&env).await;
    env.cleanup(&[&quorum]).await;
}

/// How many masters hold `waiters` waiters in `key`'s fair queue.
async fn masters_queueing(masters: &RedisCluster, key: &str, waiters: usize) -> usize {
    let (queue, _) = redlock_operator::redlock::queue_keys(key);
    let mut count = 0;
    for url in masters.urls() {
        let Ok(client) = redis::Client::open(url.as_str()) else {
            continue;
        };
        let Ok(mut conn) = client.get_multiplexed_async_connection().await else {
            continue;
        };
        let queued: redis::RedisResult<usize> = redis::cmd("ZCARD").arg(&queue).query_async(&mut conn).await;
        count += usize::from(queued.is_ok_and(|queued| queued == waiters));
    }
    count
}

/// A lock deleted while it waits in its key's queue leaves the queue before its deletion completes (and says so
/// to the waiters behind it), instead of holding them up until the masters stop keeping it. Read as soon as the
/// object is gone: a majority no longer queues it. (Were the leave missing, a read later than the masters' keep
/// would pass too; none can fail for timing.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_deleted_while_it_waits_leaves_the_keys_queue() {
    let masters = RedisCluster::start(3).expect("masters");
    let env = Env::new().await;
    let quorum = env.unique("q");
    env.create_durable_quorum(&quorum, &masters.urls(), "60s").await;
    let (running, shutdown) = operator(&env, &installation_secret(7), None).await;
    quorum_available(&env, &quorum).await;

    // An outside holder has the lock's key (a plain lock's: namespace/name) for longer than the test.
    let key = format!("{}/report", env.namespace);
    let mut config = redlock_operator::redlock::RedlockConfig::from_urls(&masters.urls()).expect("config");
    config.assume_durable = true;
    config.max_ttl = std::time::Duration::from_secs(60);
    config.node_timeout = std::time::Duration::from_millis(100);
    let engine = redlock_operator::redlock::Redlock::connect(config)
        .await
        .expect("engine");
    let holder = eventually("the outside holder takes the key", || async {
        let once = redlock_operator::redlock::AcquireOptions {
            attempts: Some(1),
            ..Default::default()
        };
        engine
            .acquire(&key, std::time::Duration::from_secs(60), "outside", once)
            .await
            .ok()
    })
    .await;
    env.locks()
        .create(
            &PostParams::default(),
            &identity_lock("report", &quorum, "ours", None),
        )
        .await
        .expect("lock");
    object_where(&env.locks(), "report", "the lock queued first", |lock| {
        phase(lock) == Some(LockPhase::Contended)
            && lock.status.as_ref().and_then(|status| status.queue_place) == Some(1)
    })
    .await;
    eventually("a majority queueing the lock", || async {
        (masters_queueing(&masters, &key, 1).await >= 2).then_some(())
    })
    .await;

    env.locks()
        .delete("report", &DeleteParams::default())
        .await
        .expect("delete");
    eventually("the lock gone", || async {
        env.locks().get_opt("report").await.ok()?.is_none().then_some(())
    })
    .await;
    assert!(
        masters_queueing(&masters, &key, 0).await >= 2,
        "the deleted lock is still queued on a majority"
    );
    engine.release(&holder).await;
    stop(running, shutdown).await;
    env.cleanup(&[&quorum]).await;
}

/// Issue 56: a second release beside the first, its quorum's Secrets in its own namespace. The first release
/// looks at the second's namespace too (as one without `lockNamespaces` looks at every namespace), but cannot
/// read that quorum's Secrets: it leaves the second's lock unclaimed (an Event says why), and once the second
/// release keeps the quorum available it leaves the quorum's status alone. Before, the first claimed the lock at
/// first sight and kept it `QuorumNotReady` for ever, and the quorum's status flapped between the two verdicts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_on_another_releases_quorum_is_left_to_that_release_and_so_is_the_quorums_status() {
    let password = "team2-password";
    let theirs = RedisCluster::start_with(3, |_| crate::support::redis_server::Options {
        password: Some(password.to_owned()),
        ..Default::default()
    })
    .expect("masters");
    let ours = RedisCluster::start(3).expect("masters");
    let env = Env::new().await;
    let team2 = OtherNamespace::create(&env, "team2").await;
    let secret: Secret = serde_json::from_value(serde_json::json!({
        "metadata": { "name": "team2-redis" }, "stringData": { "password": password }
    }))
    .expect("secret");
    Api::<Secret>::namespaced(env.client.clone(), &team2.name)
        .create(&PostParams::default(), &secret)
        .await
        .expect("secret");
    let their_quorum = env.unique("team2");
    let endpoints: Vec<String> = theirs
        .urls()
        .iter()
        .map(|url| url.replace(&format!(":{password}@"), ""))
        .collect();
    env.create_quorum_from(serde_json::json!({
        "apiVersion": "redlock.io/v1beta1", "kind": "RedisQuorum", "metadata": { "name": their_quorum },
        "spec": { "endpoints": endpoints, "maxTtl": MAX_TTL,
                  "auth": { "secretNamespace": team2.name, "secretName": "team2-redis" } }
    }))
    .await;
    let our_quorum = env.unique("q");
    env.create_quorum(&our_quorum, &ours.urls(), MAX_TTL).await;
    team2
        .locks(&env)
        .create(
            &PostParams::default(),
            &identity_lock("theirs", &their_quorum, "team2-batch", None),
        )
        .await
        .expect("their lock");
    env.create_lock("ours", &our_quorum, "batch", TTL).await;

    // The first release alone: its own lock held, the second's left unclaimed, and the quorum it cannot use shown
    // so (no other installation keeps it available).
    let (first, first_shutdown) = operator_of_installation(&env, &installation_secret(51), "ops/first").await;
    lock_where(&env, "ours", "the first release's lock held", |lock| {
        phase(lock) == Some(LockPhase::Held)
    })
    .await;
    object_where(
        &env.quorums(),
        &their_quorum,
        "the quorum refused by the first release",
        |quorum| {
            available_condition(quorum).is_some_and(|(_, reason, _)| reason == "SecretNamespaceNotAllowed")
        },
    )
    .await;
    let note = eventually("the first release's Event on the lock it leaves", || async {
        let events = Api::<k8s_openapi::api::events::v1::Event>::namespaced(env.client.clone(), &team2.name)
            .list(&Default::default())
            .await
            .ok()?;
        events.items.into_iter().find_map(|event| {
            (event.reason.as_deref() == Some("LeftForAnotherInstallation")).then_some(event.note)?
        })
    })
    .await;
    assert!(note.contains(&format!("`{}`", team2.name)), "{note}");
    let left = team2.locks(&env).get("theirs").await.expect("their lock");
    assert_eq!(
        left.annotations().get("redlock.io/installation"),
        None,
        "claimed by the first release"
    );
    assert!(
        left.status.is_none(),
        "the first release wrote the status of a lock it does not keep"
    );

    // The second release: it reads its namespace's Secrets, claims and holds its lock.
    let scope = LockScope {
        namespaces: vec![team2.name.clone()],
        selector: None,
        quorum_selector: env.quorum_selector(None),
    };
    let (second, second_shutdown) =
        operator_reading_secrets_in(&env, &installation_secret(52), "team2/second", scope, &team2.name).await;
    let held = held_lock(&team2.locks(&env), "theirs").await;
    assert_eq!(
        held.annotations()
            .get("redlock.io/installation")
            .map(String::as_str),
        Some("team2/second")
    );
    object_where(
        &env.quorums(),
        &their_quorum,
        "the quorum available by the second release",
        |quorum| available_condition(quorum).is_some_and(|(status, _, _)| status == "True"),
    )
    .await;
    // Several health checks of both (every 500 ms): the first release no longer writes its verdict over the
    // second's, and neither lock moves.
    let token = held.status.as_ref().and_then(|status| status.fencing_token);
    throughout(
        std::time::Duration::from_secs(4),
        std::time::Duration::from_millis(200),
        || async {
            let quorum = env.quorums().get(&their_quorum).await.expect("quorum");
            let shown = available_condition(&quorum);
            assert!(
                shown.as_ref().is_some_and(|(status, _, _)| status == "True"),
                "{shown:?}"
            );
            let lock = team2.locks(&env).get("theirs").await.expect("lock");
            assert_eq!(phase(&lock), Some(LockPhase::Held), "{:?}", lock.status);
            assert_eq!(
                lock.status.as_ref().and_then(|status| status.fencing_token),
                token
            );
        },
    )
    .await;
    assert!(
        second.keeper.len() == 1 && first.keeper.len() == 1,
        "each release keeps its own lock"
    );
    stop(first, first_shutdown).await;
    stop(second, second_shutdown).await;
    team2.cleanup(&env).await;
    env.cleanup(&[&their_quorum, &our_quorum]).await;
}
