//! Deleting a Job lock, or its Job's pod: the key goes only once nobody can be acting on it. A Job pod
//! force-deleted while it runs is listed nowhere any more, but its containers may run on (on a node cut off,
//! until it comes back), so its grant has not stopped for sure and the key waits for the validity shown.

use super::*;

/// Issue 29: deleting a Job-fencing lock fences first. The running Job is suspended (Event `Fenced`), and its key
/// is released only once the Job's pods are gone or the validity shown to them has ended; the finalizer keeps
/// the lock until then. Released at once, the key was free 43 ms after `kubectl delete` while the pod still ran.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_job_lock_suspends_its_running_job_before_the_key_is_released() {
    let masters = RedisCluster::start(3).expect("masters");
    let env = Env::new().await;
    let _runtime = job_runtime(&env);
    let (quorum, running, shutdown, _) = first_running(&masters, &env, 39, 0, "3s", None).await;
    let key = format!("{}/batch", env.namespace);
    env.locks()
        .delete("batch", &DeleteParams::default())
        .await
        .expect("delete the lock");
    // Pods of a suspended Job never come back, so one seen live after the key was seen free was live then.
    wait_for_release(&env, &masters, &key, |live| !live.is_empty()).await;
    assert!(!job_state(&env, "first").await.0, "the running Job was suspended");
    events_seen(&env.events(), Some("Job"), "first", &["Fenced"]).await;
    assert!(
        !job_state(&env, "second").await.0,
        "a waiting Job stays suspended"
    );
    stop(running, shutdown).await;
    env.cleanup(&[&quorum]).await;
}

/// Deleting the lock suspends the running Job; its pod, Terminating (a 30 s grace period), is then force-deleted
/// (`--grace-period=0`). No pod of the grant is listed and the Job is suspended, which counted as stopped; the key
/// must stay on a majority of masters until the validity shown to the Job has ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_pod_force_deleted_while_it_runs_keeps_the_key_until_its_validity_ends() {
    let masters = RedisCluster::start(3).expect("masters");
    let env = Env::new().await;
    let _runtime = job_runtime(&env);
    let (quorum, running, shutdown, _) = first_running(&masters, &env, 41, 30, "3s", None).await;
    let key = format!("{}/batch", env.namespace);
    env.locks()
        .delete("batch", &DeleteParams::default())
        .await
        .expect("delete the lock");
    wait_for_suspension(&env, "first").await;
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), &env.namespace);
    let granted = live_granted_pods(&env).await;
    for (pod, _) in &granted {
        let _ = pods.delete(pod, &DeleteParams::default().grace_period(0)).await;
    }
    assert!(!granted.is_empty(), "the grant's pod was there to force-delete");
    // Nothing lists the force-deleted pod: it may be acting until the validity shown, whatever is listed.
    let shown = wait_for_release(&env, &masters, &key, |_| true).await;
    assert!(
        shown.is_some(),
        "the lock showed a validity to check the release against"
    );
    stop(running, shutdown).await;
    env.cleanup(&[&quorum]).await;
}

/// Waits until the lock `batch` is gone and `key` released on every master, and asserts that the key was never
/// off a majority before the latest validity the lock had shown had ended, while `may_act` (given the grant's
/// pods listed then) says a holder could still be acting. Returns that validity.
async fn wait_for_release(
    env: &Env,
    masters: &RedisCluster,
    key: &str,
    may_act: impl Fn(&[(String, String)]) -> bool,
) -> Option<k8s_openapi::jiff::Timestamp> {
    let latest = std::sync::Mutex::new(None);
    eventually("the lock to be gone and its key released", || async {
        // Read in this order: a validity shown later than this read only widens what the key must wait for.
        let lock = env.locks().get_opt("batch").await.ok()?;
        let until = lock
            .as_ref()
            .and_then(|lock| lock.status.as_ref())
            .and_then(|status| status.valid_until.as_ref())
            .map(|until| until.0);
        let shown = {
            let mut latest = latest.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            *latest = (*latest).max(until);
            *latest
        };
        let (count, _) = key_on(&masters.urls(), key).await;
        let live = live_granted_pods(env).await;
        let now = k8s_openapi::jiff::Timestamp::now();
        if count < 2 && may_act(&live) {
            assert!(
                shown.is_none_or(|shown| now >= shown),
                "the key was released at {now} while a holder could act (pods of the grant listed: {live:?}), before the validity {shown:?} shown to it ended"
            );
        }
        (lock.is_none() && count == 0).then_some(())
    })
    .await;
    latest
        .into_inner()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
