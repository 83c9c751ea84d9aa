//! The lock's `status.queue` follows the Jobs: queued Jobs show at once, a running one never.

use super::*;

/// A quorum on `endpoints` whose masters vote from the start (`assumeDurable`) and whose locks may hold for up to
/// five minutes: for tests whose lock's status must not be refreshed while they look at it.
pub(super) async fn durable_quorum(env: &Env, endpoints: &[String]) -> String {
    let quorum = env.unique("q");
    env.create_quorum_from(serde_json::json!({
        "apiVersion": "redlock.io/v1beta1", "kind": "RedisQuorum", "metadata": { "name": quorum },
        "spec": { "endpoints": endpoints, "maxTtl": "5m", "nodeTimeout": "100ms", "assumeDurable": true }
    }))
    .await;
    quorum
}

/// The lock's `status.queue`, read after the Jobs that run: no Job that ran before the read may be in it (a Job is
/// unsuspended only once status shows it holding, without it in the queue). Returns the queue and the lock.
async fn queue_without_running_jobs(env: &Env) -> (Vec<String>, redlock_operator::api::DistributedLock) {
    let running = running_jobs(env).await;
    let lock = env.locks().get("batch").await.expect("lock");
    let queue = lock
        .status
        .as_ref()
        .map(|status| status.queue.clone())
        .unwrap_or_default();
    let listed: Vec<&String> = queue.iter().filter(|job| running.contains(job)).collect();
    assert!(
        listed.is_empty(),
        "status.queue {queue:?} lists Jobs that already run: {listed:?}"
    );
    (queue, lock)
}

/// Waits until `status.queue` is `wanted`, checking at every look that it lists no running Job and, when
/// `renewed_at` is given, that the lock was not written for another reason (its grant or extension shown is the
/// same).
async fn wait_for_queue(env: &Env, wanted: &[&str], renewed_at: Option<&str>) {
    eventually(&format!("status.queue to be {wanted:?}"), || async {
        let (queue, lock) = queue_without_running_jobs(env).await;
        if let Some(renewed_at) = renewed_at {
            let shown = lock
                .status
                .as_ref()
                .and_then(|status| status.renewed_at.as_ref())
                .map(|at| at.0.to_string());
            assert_eq!(
                shown.as_deref(),
                Some(renewed_at),
                "the lock's grant was shown again (a status refresh) while its queue was awaited"
            );
        }
        (queue == wanted).then_some(())
    })
    .await;
}

/// Status follows the Jobs: Jobs queued after a grant show in `status.queue` at once, in queue order, without any
/// other change to the lock (its TTL of two minutes refreshes status a minute after the grant), and a deleted one
/// leaves it. Before the fix the queue changed only with the next status write for another reason: the first
/// refresh, a minute later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_queued_after_a_grant_show_in_the_status_queue_without_another_change_to_the_lock() {
    let masters = RedisCluster::start(3).expect("masters");
    let env = Env::new().await;
    let _runtime = job_runtime(&env);
    create_job(&env, "first", None, true, 0, Work::Seconds(600)).await;
    let quorum = durable_quorum(&env, &masters.urls()).await;
    let (quorum, running, shutdown) = start_with_lock(&env, 49, quorum, "2m", None).await;
    wait_for_grant(&env, "first", 1).await;
    let lock = lock_where(&env, "batch", "held by first", |lock| {
        phase(lock) == Some(LockPhase::Held)
            && lock.status.as_ref().and_then(|s| s.holder.as_deref()) == Some("first")
    })
    .await;
    let status = lock.status.expect("status");
    assert!(status.queue.is_empty(), "{:?}", status.queue);
    let renewed_at = status.renewed_at.expect("renewedAt").0.to_string();

    create_job(&env, "second", None, true, 0, Work::Seconds(600)).await;
    wait_for_queue(&env, &["second"], Some(&renewed_at)).await;
    create_job(&env, "urgent", Some(5), true, 0, Work::Seconds(600)).await;
    create_job(&env, "third", None, true, 0, Work::Seconds(600)).await;
    wait_for_queue(&env, &["urgent", "second", "third"], Some(&renewed_at)).await;
    jobs(&env)
        .delete("urgent", &DeleteParams::background())
        .await
        .expect("delete a waiting Job");
    wait_for_queue(&env, &["second", "third"], Some(&renewed_at)).await;
    assert_eq!(running_jobs(&env).await, ["first"]);
    stop(running, shutdown).await;
    env.cleanup(&[&quorum]).await;
}

/// A Job semaphore's `status.queue` is the semaphore's waiting Jobs, whichever permit was written last: it never
/// lists a Job that runs, not even one granted another permit in the same look, and Jobs queued while every
/// permit is held show at once. Before the fix each permit's write showed the queue less its own holder (two
/// permits granted together left the first one's Job listed), and a held semaphore's queue changed only with
/// its next status refresh.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_semaphores_queue_lists_its_waiting_jobs_and_never_a_running_one() {
    let masters = RedisCluster::start(3).expect("masters");
    let env = Env::new().await;
    let _runtime = job_runtime(&env);
    for name in ["job-0", "job-1", "job-2", "job-3"] {
        create_job(&env, name, None, true, 0, Work::Seconds(600)).await;
    }
    let quorum = durable_quorum(&env, &masters.urls()).await;
    let (running, shutdown) = operator(&env, &installation_secret(50), None).await;
    quorum_available(&env, &quorum).await;
    env.create_lock_from(serde_json::json!({
        "apiVersion": "redlock.io/v1beta1", "kind": "DistributedLock",
        "metadata": { "name": "batch" },
        "spec": { "quorum": quorum, "ttl": "2m", "permits": 2, "holder": { "jobs": {} } }
    }))
    .await;
    eventually("job-0 and job-1 running, the others queued", || async {
        let (queue, lock) = queue_without_running_jobs(&env).await;
        let held = lock.status.as_ref().and_then(|status| status.held.clone());
        let running = running_jobs(&env).await;
        (held.as_deref() == Some("2/2") && running.len() == 2 && queue == ["job-2", "job-3"]).then_some(())
    })
    .await;
    let mut running_first = running_jobs(&env).await;
    running_first.sort();
    assert_eq!(running_first, ["job-0", "job-1"]);
    for name in ["job-4", "job-5"] {
        create_job(&env, name, None, true, 0, Work::Seconds(600)).await;
    }
    wait_for_queue(&env, &["job-2", "job-3", "job-4", "job-5"], None).await;
    jobs(&env)
        .delete("job-0", &DeleteParams::background())
        .await
        .expect("delete a running Job");
    wait_for_queue(&env, &["job-3", "job-4", "job-5"], None).await;
    eventually("job-2 running in job-0's place", || async {
        let mut running = running_jobs(&env).await;
        running.sort();
        (running == ["job-1", "job-2"]).then_some(())
    })
    .await;
    queue_without_running_jobs(&env).await;
    stop(running, shutdown).await;
    env.cleanup(&[&quorum]).await;
}
