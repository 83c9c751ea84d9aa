//! End-to-end Job fencing: one Job at a time per lock, in queue order, granted with its fencing token,
//! handed over on completion or deletion, suspended before the lock's validity ends when the lock is lost,
//! and never run with a stale token. The tests play the Job controller by setting Job status, so they run on the
//! in-process API server only: on a real cluster the Job controller would overwrite what they set.

mod e2e;
mod support;

use std::time::Duration;

use e2e::*;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use redlock_operator::api::LockPhase;
use redlock_operator::controller::run::Running;
use support::redis_server::RedisCluster;
use tokio_util::sync::CancellationToken;

fn jobs(env: &Env) -> Api<Job> {
    Api::namespaced(env.client.clone(), &env.namespace)
}

async fn create_job(env: &Env, name: &str, priority: Option<i64>, suspend: bool, grace: i64) {
    let mut metadata = serde_json::json!({ "name": name, "labels": { "redlock.io/lock": "batch" } });
    if let Some(priority) = priority {
        metadata["annotations"] = serde_json::json!({ "redlock.io/priority": priority.to_string() });
    }
    let job: Job = serde_json::from_value(serde_json::json!({
        "apiVersion": "batch/v1", "kind": "Job", "metadata": metadata,
        "spec": {
            "suspend": suspend,
            "template": { "spec": {
                "restartPolicy": "Never",
                "terminationGracePeriodSeconds": grace,
                "containers": [{ "name": "main", "image": "registry.invalid/job:1" }]
            } }
        }
    }))
    .expect("job");
    jobs(env)
        .create(&PostParams::default(), &job)
        .await
        .expect("create job");
    // Creation times have a resolution of one second: keep the Jobs' ages distinct.
    tokio::time::sleep(Duration::from_millis(1_050)).await;
}

/// Plays the Job controller.
async fn set_job_status(env: &Env, name: &str, status: serde_json::Value) {
    jobs(env)
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({ "status": status })),
        )
        .await
        .expect("job status");
}

async fn complete(env: &Env, name: &str) {
    set_job_status(
        env,
        name,
        serde_json::json!({ "active": 0, "succeeded": 1,
            "conditions": [{ "type": "Complete", "status": "True" }] }),
    )
    .await;
}

/// Whether the Job may run (unsuspended), and the token in its pod template.
async fn job_state(env: &Env, name: &str) -> (bool, Option<String>) {
    let job = jobs(env).get(name).await.expect("job");
    let spec = job.spec.expect("spec");
    let token = spec
        .template
        .metadata
        .and_then(|meta| meta.annotations)
        .and_then(|annotations| annotations.get("redlock.io/fencing-token").cloned());
    (!spec.suspend.unwrap_or(false), token)
}

/// Jobs that may run now: unsuspended and not complete.
async fn running_jobs(env: &Env) -> Vec<String> {
    let mut names = Vec::new();
    for job in jobs(env).list(&ListParams::default()).await.expect("jobs").items {
        let name = job.metadata.name.clone().unwrap_or_default();
        let finished = job
            .status
            .as_ref()
            .and_then(|status| status.conditions.as_ref())
            .is_some_and(|conditions| {
                conditions
                    .iter()
                    .any(|c| c.type_ == "Complete" && c.status == "True")
            });
        if !finished && !job.spec.and_then(|spec| spec.suspend).unwrap_or(false) {
            names.push(name);
        }
    }
    names
}

/// Waits until `job` is the only running Job, granted with `token`.
async fn wait_for_grant(env: &Env, job: &str, token: i64) {
    eventually(&format!("{job} granted with token {token}"), || async {
        let now = running_jobs(env).await;
        assert!(now.len() <= 1, "two Jobs run at once: {now:?}");
        let (runs, shown) = job_state(env, job).await;
        (runs && shown == Some(token.to_string())).then_some(())
    })
    .await;
}

async fn job_events(env: &Env, name: &str) -> Vec<String> {
    let api: Api<Event> = Api::namespaced(env.client.clone(), &env.namespace);
    api.list(&ListParams::default())
        .await
        .map(|list| {
            list.items
                .into_iter()
                .filter(|event| {
                    let regarding = event.regarding.as_ref();
                    regarding.and_then(|r| r.kind.as_deref()) == Some("Job")
                        && regarding.and_then(|r| r.name.as_deref()) == Some(name)
                })
                .filter_map(|event| event.reason)
                .collect()
        })
        .unwrap_or_default()
}

async fn setup(
    masters: &RedisCluster,
    env: &Env,
    seed: u8,
    ttl: &str,
    margin: Option<&str>,
) -> (String, Running, CancellationToken) {
    let quorum = env.unique("q");
    env.create_quorum(&quorum, &masters.urls(), "6s").await;
    let (running, shutdown) = operator(env, &installation_secret(seed), None).await;
    quorum_available(env, &quorum).await;
    let mut policy = serde_json::json!({});
    if let Some(margin) = margin {
        policy["fenceMargin"] = serde_json::json!(margin);
    }
    env.create_lock_from(serde_json::json!({
        "apiVersion": "redlock.io/v1alpha1", "kind": "DistributedLock",
        "metadata": { "name": "batch" },
        "spec": { "quorum": quorum, "ttl": ttl, "holder": { "jobs": policy } }
    }))
    .await;
    (quorum, running, shutdown)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_run_one_at_a_time_in_queue_order_and_hand_over() {
    let masters = RedisCluster::start(3).expect("masters");
    let env = Env::test_server().await;
    create_job(&env, "low", None, true, 30).await;
    create_job(&env, "high", Some(10), true, 0).await;
    create_job(&env, "mid", Some(5), true, 0).await;
    let (quorum, running, shutdown) = setup(&masters, &env, 31, "3s", None).await;

    wait_for_grant(&env, "high", 1).await;
    let lock = lock_where(&env, "batch", "held by high", |lock| {
        phase(lock) == Some(LockPhase::Held)
            && lock.status.as_ref().and_then(|s| s.holder.as_deref()) == Some("high")
    })
    .await;
    let status = lock.status.expect("status");
    assert_eq!(status.queue, ["mid", "low"]);
    let late = condition(&status.conditions, "FencingMayBeLate").expect("FencingMayBeLate");
    assert_eq!(
        late.status, "True",
        "`low` keeps the default 30 s grace period: {}",
        late.message
    );
    assert!(late.message.contains("low (30s)"), "{}", late.message);
    assert!(job_events(&env, "high").await.contains(&"Granted".to_owned()));
    assert!(
        !job_events(&env, "high")
            .await
            .contains(&"GracePeriodTooLong".to_owned())
    );

    complete(&env, "high").await;
    wait_for_grant(&env, "mid", 2).await;
    jobs(&env)
        .delete("mid", &DeleteParams::default())
        .await
        .expect("delete");
    wait_for_grant(&env, "low", 3).await;
    eventually("a grace-period warning on `low`", || async {
        job_events(&env, "low")
            .await
            .contains(&"GracePeriodTooLong".to_owned())
            .then_some(())
    })
    .await;
    complete(&env, "low").await;
    lock_where(&env, "batch", "an empty queue", |lock| {
        lock.status
            .as_ref()
            .and_then(|s| condition(&s.conditions, "Held"))
            .is_some_and(|c| c.reason == "QueueEmpty")
    })
    .await;
    stop(running, shutdown).await;
    env.cleanup(&[&quorum]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_created_unsuspended_is_suspended_with_a_warning() {
    let masters = RedisCluster::start(3).expect("masters");
    let env = Env::test_server().await;
    create_job(&env, "first", None, true, 0).await;
    let (quorum, running, shutdown) = setup(&masters, &env, 32, "3s", None).await;
    wait_for_grant(&env, "first", 1).await;
    create_job(&env, "sneaky", None, false, 0).await;
    eventually("sneaky to be suspended", || async {
        (!job_state(&env, "sneaky").await.0).then_some(())
    })
    .await;
    assert!(job_events(&env, "sneaky").await.contains(&"Suspended".to_owned()));
    assert_eq!(running_jobs(&env).await, ["first"]);
    stop(running, shutdown).await;
    env.cleanup(&[&quorum]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_lock_suspends_the_job_before_valid_until_and_a_stale_job_never_runs_again() {
    let masters = RedisCluster::start(3).expect("masters");
    let env = Env::test_server().await;
    create_job(&env, "first", None, true, 0).await;
    create_job(&env, "second", None, true, 0).await;
    let (quorum, running, shutdown) = setup(&masters, &env, 33, "3s", None).await;
    wait_for_grant(&env, "first", 1).await;
    set_job_status(&env, "first", serde_json::json!({ "active": 1 })).await;

    masters[0].stop();
    masters[1].stop();
    let mut valid_until = None;
    let suspended_at = loop {
        let lock = env.locks().get("batch").await.expect("lock");
        if phase(&lock) == Some(LockPhase::Held) {
            valid_until = lock.status.and_then(|s| s.valid_until).map(|t| t.0);
        }
        let now = k8s_openapi::jiff::Timestamp::now();
        if !job_state(&env, "first").await.0 {
            break now;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let valid_until = valid_until.expect("a validity was shown");
    assert!(
        suspended_at < valid_until,
        "suspended at {suspended_at}, after the validity {valid_until}"
    );
    lock_where(&env, "batch", "Lost", |lock| phase(lock) == Some(LockPhase::Lost)).await;
    assert!(job_events(&env, "first").await.contains(&"Fenced".to_owned()));

    // The masters stay away for longer than the TTL.
    tokio::time::sleep(Duration::from_secs(4)).await;
    masters[0].cont();
    masters[1].cont();
    // Its pods are still there: nobody else runs.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        running_jobs(&env).await.is_empty(),
        "a Job ran while the fenced Job still had pods"
    );
    lock_where(&env, "batch", "waiting for the fenced Job", |lock| {
        lock.status
            .as_ref()
            .and_then(|s| condition(&s.conditions, "Held"))
            .is_some_and(|c| c.reason == "WaitingForFencedJob")
    })
    .await;

    // Extensions queued on the stopped masters ran when they resumed and re-created the keys (as repair,
    // never as votes); they expire a TTL later, and with them the chance to take the first Job's token back.
    tokio::time::sleep(Duration::from_secs(3)).await;
    set_job_status(&env, "first", serde_json::json!({ "active": 0 })).await;
    wait_for_grant(&env, "second", 2).await;
    assert!(job_events(&env, "first").await.contains(&"StaleToken".to_owned()));
    assert!(!job_state(&env, "first").await.0, "the stale Job stays suspended");
    stop(running, shutdown).await;
    env.cleanup(&[&quorum]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_job_resumes_with_its_own_token_when_the_lock_comes_back_in_time() {
    let masters = RedisCluster::start(3).expect("masters");
    let env = Env::test_server().await;
    create_job(&env, "first", None, true, 0).await;
    create_job(&env, "second", None, true, 0).await;
    // Fenced 4 s before the validity ends: the keys outlive the fencing by that much.
    let (quorum, running, shutdown) = setup(&masters, &env, 34, "6s", Some("4s")).await;
    wait_for_grant(&env, "first", 1).await;

    masters[0].stop();
    masters[1].stop();
    eventually("first to be fenced", || async {
        (!job_state(&env, "first").await.0).then_some(())
    })
    .await;
    masters[0].cont();
    masters[1].cont();
    wait_for_grant(&env, "first", 1).await;
    eventually("a Resumed event on the Job", || async {
        job_events(&env, "first")
            .await
            .contains(&"Resumed".to_owned())
            .then_some(())
    })
    .await;
    let lock = lock_where(&env, "batch", "held again", |lock| {
        phase(lock) == Some(LockPhase::Held)
    })
    .await;
    assert_eq!(
        token(&lock),
        Some(1),
        "resumed with its own token, still the latest"
    );
    assert_eq!(running_jobs(&env).await, ["first"]);
    stop(running, shutdown).await;
    env.cleanup(&[&quorum]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_operator_keeps_the_grant_of_a_running_job() {
    let masters = RedisCluster::start(3).expect("masters");
    let env = Env::test_server().await;
    create_job(&env, "first", None, true, 0).await;
    create_job(&env, "second", None, true, 0).await;
    let (quorum, running, shutdown) = setup(&masters, &env, 35, "3s", None).await;
    wait_for_grant(&env, "first", 1).await;
    stop(running, shutdown).await;
    let (running, shutdown) = operator(&env, &installation_secret(35), None).await;
    for _ in 0..60 {
        assert_eq!(
            running_jobs(&env).await,
            ["first"],
            "the grant moved or went during the restart"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_first_hold_kept(&env, "batch").await;
    assert!(!job_events(&env, "first").await.contains(&"Fenced".to_owned()));
    stop(running, shutdown).await;
    env.cleanup(&[&quorum]).await;
}
