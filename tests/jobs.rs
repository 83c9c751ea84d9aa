//! End-to-end Job fencing: one Job at a time per lock, in queue order, granted with its fencing token,
//! handed over on completion or deletion, suspended before the lock's validity ends when the lock is lost,
//! and never run with a stale token. On the in-process API server a simulated Job controller and kubelet run the
//! Jobs (`crate::support::job_controller`); with `REDLOCK_E2E_KUBECONFIG` the same tests run on a real cluster, whose
//! Job controller and kubelets run them (their pods need the image `REDLOCK_E2E_JOB_IMAGE`, `busybox:1.36` by
//! default). Throughout, the tests check on the pods themselves that no two grants ever run at once.

use std::time::Duration;

use crate::e2e::*;
use crate::support::fault_proxy::FaultProxy;
use crate::support::job_controller::{FakeJobRuntime, job_finished};
use crate::support::redis_server::{RedisCluster, raw_command, raw_get};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use redlock_operator::api::LockPhase;
use redlock_operator::controller::run::Running;
use tokio_util::sync::CancellationToken;

fn jobs(env: &Env) -> Api<Job> {
    Api::namespaced(env.client.clone(), &env.namespace)
}

/// The image of the test Jobs' pods on a real cluster: it needs `sleep` and `false`.
fn job_image() -> String {
    std::env::var("REDLOCK_E2E_JOB_IMAGE").unwrap_or_else(|_| "busybox:1.36".to_owned())
}

/// The cluster's side of Jobs: simulated next to the test server, the real controllers on a real cluster.
fn job_runtime(env: &Env) -> Option<FakeJobRuntime> {
    env.server
        .as_ref()
        .map(|server| FakeJobRuntime::start(server.controller_client(), Some(&env.namespace)))
}

#[path = "jobs/deletion.rs"]
mod deletion;
#[path = "jobs/guard.rs"]
mod guard;
#[path = "jobs/masters.rs"]
mod masters;
#[path = "jobs/probes.rs"]
mod probes;
#[path = "jobs/quarantine.rs"]
mod quarantine;
#[path = "jobs/reports.rs"]
mod reports;
#[path = "jobs/semaphore.rs"]
mod semaphore;
#[path = "jobs/shared_key.rs"]
mod shared_key;
#[path = "jobs/status_queue.rs"]
mod status_queue;
use masters::{keep_key, let_in, lock_out, redis_connection};
use probes::*;
use semaphore::{semaphore_grants, start_semaphore};
use status_queue::durable_quorum;

/// What a test Job's one pod does.
#[derive(Clone, Copy)]
enum Work {
    /// Runs for this many seconds, then succeeds.
    Seconds(u32),
    /// Fails at once.
    Fails,
}

/// A Job of one pod. The command runs as PID 1 in its container, which ignores SIGTERM:
/// a deleted pod takes its whole grace period to stop, the worst case fencing has to wait for.
async fn create_job(env: &Env, name: &str, priority: Option<i64>, suspend: bool, grace: i64, work: Work) {
    let mut metadata = serde_json::json!({ "name": name, "labels": { "redlock.io/lock": "batch" } });
    if let Some(priority) = priority {
        metadata["annotations"] = serde_json::json!({ "redlock.io/priority": priority.to_string() });
    }
    // Pods the Job controller deletes (on suspension) do not count as failures; a Job that fails fails at once.
    let (command, backoff_limit) = match work {
        Work::Seconds(seconds) => (serde_json::json!(["sleep", seconds.to_string()]), 6),
        Work::Fails => (serde_json::json!(["false"]), 0),
    };
    let job: Job = serde_json::from_value(serde_json::json!({
        "apiVersion": "batch/v1", "kind": "Job", "metadata": metadata,
        "spec": {
            "suspend": suspend,
            "backoffLimit": backoff_limit,
            "template": { "spec": {
                "restartPolicy": "Never",
                "terminationGracePeriodSeconds": grace,
                "containers": [{ "name": "main", "image": job_image(), "command": command }]
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

async fn setup(
    masters: &RedisCluster,
    env: &Env,
    seed: u8,
    ttl: &str,
    margin: Option<&str>,
) -> (String, Running, CancellationToken) {
    let quorum = env.unique("q");
    env.create_quorum(&quorum, &masters.urls(), "6s").await;
    start_with_lock(env, seed, quorum, ttl, margin).await
}

/// The operator, and the `batch` lock on `quorum` with `ttl` (and the Job policy's fence margin).
async fn start_with_lock(
    env: &Env,
    seed: u8,
    quorum: String,
    ttl: &str,
    margin: Option<&str>,
) -> (String, Running, CancellationToken) {
    let (running, shutdown) = operator(env, &installation_secret(seed), None).await;
    quorum_available(env, &quorum).await;
    let mut policy = serde_json::json!({});
    if let Some(margin) = margin {
        policy["fenceMargin"] = serde_json::json!(margin);
    }
    env.create_lock_from(serde_json::json!({
        "apiVersion": "redlock.io/v1beta1", "kind": "DistributedLock",
        "metadata": { "name": "batch" },
        "spec": { "quorum": quorum, "ttl": ttl, "holder": { "jobs": policy } }
    }))
    .await;
    (quorum, running, shutdown)
}

/// Two Jobs queued, `first` and `second`; `first` granted with token 1 and its pod running.
async fn first_running(
    masters: &RedisCluster,
    env: &Env,
    seed: u8,
    first_grace: i64,
    ttl: &str,
    margin: Option<&str>,
) -> (String, Running, CancellationToken, i64) {
    create_job(env, "first", None, true, first_grace, Work::Seconds(600)).await;
    create_job(env, "second", None, true, 0, Work::Seconds(600)).await;
    let (quorum, running, shutdown) = setup(masters, env, seed, ttl, margin).await;
    // Tokens only promise to grow: a first attempt that timed out on a loaded machine may have raised counters.
    let token = wait_for_grant_after(env, "first", 0).await;
    wait_for_pod_running(env, token).await;
    (quorum, running, shutdown, token)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_run_one_at_a_time_in_queue_order_and_hand_over() {
    let masters = RedisCluster::start(3).expect("masters");
    let env = Env::new().await;
    let _runtime = job_runtime(&env);
    create_job(&env, "low", None, true, 30, Work::Seconds(3)).await;
    create_job(&env, "high", Some(10), true, 0, Work::Seconds(3)).await;
    // `mid`'s pods would take ten minutes to stop once deleted: the test ends them, once status has said so.
    create_job(&env, "mid", Some(5), true, 600, Work::Seconds(600)).await;
    create_job(&env, "broken", Some(3), true, 0, Work::Fails).await;
    let (quorum, running, shutdown) = setup(&masters, &env, 31, "3s", None).await;

    let high = wait_for_grant_after(&env, "high", 0).await;
    let lock = lock_where(&env, "batch", "held by high", |lock| {
        phase(lock) == Some(LockPhase::Held)
            && lock.status.as_ref().and_then(|s| s.holder.as_deref()) == Some("high")
    })
    .await;
    let status = lock.status.expect("status");
    assert_eq!(status.queue, ["mid", "broken", "low"]);
    let late = condition(&status.conditions, "FencingMayBeLate").expect("FencingMayBeLate");
    assert_eq!(
        late.status, "True",
        "`low` has a 30 s grace period: {}",
        late.message
    );
    assert!(late.message.contains("low (30s)"), "{}", late.message);
    // Issue 29: these Jobs' pods are not handed their grant (no downward API), so none can run the guard.
    assert_eq!(late.reason, "GrantNotPassedToPods", "{}", late.message);
    assert!(late.message.contains("high"), "{}", late.message);
    assert!(job_events(&env, "high").await.contains(&"Granted".to_owned()));
    eventually("a warning that `high` cannot run under the guard", || async {
        job_events(&env, "high")
            .await
            .contains(&"GrantNotPassedToPods".to_owned())
            .then_some(())
    })
    .await;
    assert!(
        !job_events(&env, "high")
            .await
            .contains(&"GracePeriodTooLong".to_owned())
    );

    // `high` completes by itself; `mid` is deleted while it runs, and the next Job waits for its pods however
    // long they take to stop (the key given up waits for the validity shown, then the pods): a grace period of a
    // few seconds left a window for status to show it that a loaded machine could miss. Once it is shown, the
    // test ends the pods' deletion.
    let mid = wait_for_grant_after(&env, "mid", high).await;
    wait_for_pod_running(&env, mid).await;
    jobs(&env)
        .delete("mid", &DeleteParams::background())
        .await
        .expect("delete");
    wait_for_reason(&env, "WaitingForEarlierPods").await;
    assert!(
        running_jobs(&env).await.is_empty(),
        "nobody runs while mid's pods stop"
    );
    force_delete_pods_of_grant(&env, mid).await;
    // `broken` fails at once, which hands over too.
    let broken = wait_for_grant_after(&env, "broken", mid).await;
    wait_for_grant_after(&env, "low", broken).await;
    eventually("a grace-period warning on `low`", || async {
        job_events(&env, "low")
            .await
            .contains(&"GracePeriodTooLong".to_owned())
            .then_some(())
    })
    .await;
    wait_for_reason(&env, "QueueEmpty").await;
    let events = job_events(&env, "broken").await;
    assert!(events.contains(&"Granted".to_owned()), "{events:?}");
    stop(running, shutdown).await;
    env.cleanup(&[&quorum]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_created_unsuspended_is_suspended_with_a_warning() {
    let masters = RedisCluster::start(3).expect("masters");
    let env = Env::new().await;
    let _runtime = job_runtime(&env);
    create_job(&env, "first", None, true, 0, Work::Seconds(600)).await;
    let (quorum, running, shutdown) = setup(&masters, &env, 32, "3s", None).await;
    wait_for_grant(&env, "first", 1).await;
    create_job(&env, "sneaky", None, false, 0, Work::Seconds(600)).await;
    wait_for_suspension(&env, "sneaky").await;
    assert!(job_events(&env, "sneaky").await.contains(&"Suspended".to_owned()));
    assert_eq!(running_jobs(&env).await, ["first"]);
    stop(running, shutdown).await;
    env.cleanup(&[&quorum]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_lock_suspends_the_job_before_valid_until_and_it_runs_again_with_a_new_token() {
    let masters = RedisCluster::start(3).expect("masters");
    let env = Env::new().await;
    let _runtime = job_runtime(&env);
    // `first`'s pod takes 12 s to stop once deleted: the queue must wait for it.
    let (quorum, running, shutdown, first_token) = first_running(&masters, &env, 33, 12, "3s", None).await;

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
    // The fenced Job's pod is still stopping: nobody else runs.
    wait_for_reason(&env, "WaitingForFencedJob").await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        running_jobs(&env).await.is_empty(),
        "a Job ran while the fenced Job still had pods"
    );
    assert!(
        !live_granted_pods(&env).await.is_empty(),
        "the fenced pod should still be stopping"
    );

    // Extensions queued on the stopped masters ran when they resumed and re-created the keys (as repair,
    // never as votes); they expired a TTL later, and with them the chance to take the first Job's token back.
    // Once its pod is gone, it is queued again and, first in the queue, runs again with a new token.
    let token_again = wait_for_grant_after(&env, "first", first_token).await;
    assert!(job_events(&env, "first").await.contains(&"Requeued".to_owned()));
    wait_for_pod_running(&env, token_again).await;
    let lock = lock_where(&env, "batch", "held by first again", |lock| {
        phase(lock) == Some(LockPhase::Held)
            && lock.status.as_ref().and_then(|s| s.holder.as_deref()) == Some("first")
    })
    .await;
    assert_eq!(token(&lock), Some(token_again));
    assert_eq!(lock.status.expect("status").queue, ["second"]);
    stop(running, shutdown).await;
    env.cleanup(&[&quorum]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_job_that_cannot_take_a_new_token_stays_suspended_as_stale() {
    let mut masters = RedisCluster::start(3).expect("masters");
    // Fault injection needs the in-process server.
    let env = Env::test_server().await;
    // The operator may not clear a Job's status.startTime, as with a role without patch on jobs/status.
    if let Some(server) = &env.server {
        server.fail_next("patch", "jobs/status", 403, 1_000);
    }
    let _runtime = job_runtime(&env);
    let (quorum, running, shutdown, first_token) = first_running(&masters, &env, 36, 0, "3s", None).await;

    masters[0].stop();
    masters[1].stop();
    wait_for_suspension(&env, "first").await;
    // They come back empty: the first Job's token cannot be taken back.
    for master in [0, 1] {
        masters[master].restart().expect("restart");
    }
    wait_for_grant_after(&env, "second", first_token).await;
    let events = job_events(&env, "first").await;
    assert!(events.contains(&"StaleToken".to_owned()), "{events:?}");
    assert!(!events.contains(&"Requeued".to_owned()), "{events:?}");
    assert!(!job_state(&env, "first").await.0, "the stale Job stays suspended");
    stop(running, shutdown).await;
    env.cleanup(&[&quorum]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_job_resumes_with_its_own_token_when_the_lock_comes_back_in_time() {
    let masters = RedisCluster::start(3).expect("masters");
    let env = Env::new().await;
    let _runtime = job_runtime(&env);
    // Fenced 4 s before the validity ends: the keys outlive the fencing by that much.
    let (quorum, running, shutdown, first_token) =
        first_running(&masters, &env, 34, 0, "6s", Some("4s")).await;

    // The operator is locked out of two masters (they stay up; its connections are closed and new ones need a
    // password), so it cannot extend and fences the Job. The keys are then made to outlive the wait for the
    // fenced pod however long a loaded machine takes: this test is about the resume rule, not a race between
    // stopping a pod and a key's expiry.
    let key = format!("{}/batch", env.namespace);
    lock_out(&masters[0].url()).await;
    lock_out(&masters[1].url()).await;
    for master in 0..3 {
        keep_key(&masters[master].url(), &key).await;
    }
    wait_for_suspension(&env, "first").await;
    let_in(&masters[0].url()).await;
    let_in(&masters[1].url()).await;
    wait_for_grant(&env, "first", first_token).await;
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
        Some(first_token),
        "resumed with its own token, still the latest"
    );
    // The Job controller starts a new pod, with the same token.
    wait_for_pod_running(&env, first_token).await;
    assert_eq!(running_jobs(&env).await, ["first"]);
    stop(running, shutdown).await;
    env.cleanup(&[&quorum]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_operator_keeps_the_grant_of_a_running_job() {
    let masters = RedisCluster::start(3).expect("masters");
    let env = Env::new().await;
    let _runtime = job_runtime(&env);
    let (quorum, running, shutdown, _) = first_running(&masters, &env, 35, 0, "3s", None).await;
    let pods_before = live_granted_pods(&env).await;
    stop(running, shutdown).await;
    let (running, shutdown) = operator(&env, &installation_secret(35), None).await;
    throughout(Duration::from_secs(6), Duration::from_millis(100), || async {
        assert_eq!(
            running_jobs(&env).await,
            ["first"],
            "the grant moved or went during the restart"
        );
    })
    .await;
    assert_first_hold_kept(&env, "batch").await;
    assert!(!job_events(&env, "first").await.contains(&"Fenced".to_owned()));
    assert_eq!(
        live_granted_pods(&env).await,
        pods_before,
        "the Job's pod ran on untouched"
    );
    stop(running, shutdown).await;
    env.cleanup(&[&quorum]).await;
}

/// A careless edit that makes a held lock's spec invalid (a TTL above the quorum's `maxTtl`, which no schema can
/// see) must not free the key under the running Job: the holding stays under the last valid spec, extended,
/// until the spec is fixed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_edit_keeps_the_running_job_holding_under_the_last_valid_spec() {
    let masters = RedisCluster::start(3).expect("masters");
    let env = Env::new().await;
    let _runtime = job_runtime(&env);
    let (quorum, running, shutdown, first_token) = first_running(&masters, &env, 37, 0, "3s", None).await;

    let patch = |ttl: &str| serde_json::json!({ "spec": { "ttl": ttl } });
    env.locks()
        .patch("batch", &PatchParams::default(), &Patch::Merge(patch("10s")))
        .await
        .expect("patch");
    let refused = lock_where(&env, "batch", "Ready=False TtlAboveMaxTtl", |lock| {
        lock.status
            .as_ref()
            .and_then(|s| condition(&s.conditions, "Ready"))
            .is_some_and(|ready| ready.status == "False" && ready.reason == "TtlAboveMaxTtl")
    })
    .await;
    assert_eq!(
        phase(&refused),
        Some(LockPhase::Held),
        "an invalid edit moves nothing"
    );
    let shown = refused
        .status
        .as_ref()
        .and_then(|s| s.valid_until.as_ref())
        .map(|t| t.0)
        .expect("validUntil");
    // Past the validity shown when the edit came: had the key been given up, it would be gone by now and the
    // second Job granted.
    let left = shown.duration_since(k8s_openapi::jiff::Timestamp::now());
    tokio::time::sleep(Duration::try_from(left).unwrap_or_default() + Duration::from_secs(1)).await;
    assert_one_grant_running(&env).await;
    assert!(job_state(&env, "first").await.0, "the first Job still runs");
    let key = format!("{}/batch", env.namespace);
    let (count, values) = key_on(&masters.urls(), &key).await;
    assert!(count >= 2, "the key is still held on a majority: {values:?}");

    env.locks()
        .patch("batch", &PatchParams::default(), &Patch::Merge(patch("3s")))
        .await
        .expect("patch back");
    let fixed = lock_where(&env, "batch", "Ready again", |lock| {
        lock.status
            .as_ref()
            .and_then(|s| condition(&s.conditions, "Ready"))
            .is_some_and(|ready| ready.status == "True")
    })
    .await;
    assert_eq!(
        (
            phase(&fixed),
            fixed.status.as_ref().and_then(|s| s.holder.as_deref()),
            token(&fixed)
        ),
        (Some(LockPhase::Held), Some("first"), Some(first_token))
    );
    stop(running, shutdown).await;
    env.cleanup(&[&quorum]).await;
}

/// Issue 29's late fence: a Job semaphore's lost permit is fenced without waiting for the reconcile's re-list of
/// the lock's pods, which it makes whenever a Job is about to be let run (here always: permit 1's key is held
/// outside Kubernetes, so the second Job's grant is tried again and again). Pod lists are made slower than the
/// TTL (the test server's `slow_lists`; a real API server listing a large resource); the cluster is then cut
/// from a majority of masters, and the Job on permit 0 must be suspended before the validity status showed it
/// ends. Before the fix the fence waited for the list in flight, and then for its own. Needs the test server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_permit_is_fenced_without_waiting_for_a_slow_pod_list() {
    const SLOW_LIST: Duration = Duration::from_secs(15);
    let masters = RedisCluster::start(3).expect("masters");
    let env = Env::new().await;
    let Some(server) = env.server.as_ref() else {
        eprintln!("skipped on a real cluster: its pod lists cannot be slowed down on demand");
        return;
    };
    let _runtime = job_runtime(&env);
    create_job(&env, "a", None, true, 0, Work::Seconds(600)).await;
    create_job(&env, "c", None, true, 0, Work::Seconds(600)).await;
    let outsider = format!("permit:1:{}/batch", env.namespace);
    for master in masters.urls() {
        let mut conn = redis_connection(&master).await;
        let _: () = redis::cmd("SET")
            .arg(&outsider)
            .arg("held-outside-kubernetes")
            .arg("PX")
            .arg(600_000)
            .query_async(&mut conn)
            .await
            .expect("hold permit 1's key");
    }
    let (quorum, running, shutdown) = start_semaphore((&masters, "10s"), &env, 47, "10s", 2).await;
    let holder = eventually("a Job running on permit 0", || async {
        semaphore_grants(&env)
            .await
            .into_iter()
            .find(|(_, done, runs, grant)| *runs && !done && matches!(grant, Some((0, _))))
            .map(|(job, ..)| job)
    })
    .await;

    let lists_before = server.request_count("list", "pods");
    server.slow_lists("pods", SLOW_LIST);
    eventually("a reconcile re-listing the lock's pods", || async {
        (server.request_count("list", "pods") > lists_before).then_some(())
    })
    .await;
    let urls = masters.urls();
    lock_out(&urls[0]).await;
    lock_out(&urls[1]).await;
    let mut valid_until = None;
    let suspended_at = loop {
        let lock = env.locks().get("batch").await.expect("lock");
        let shown = lock
            .status
            .as_ref()
            .and_then(|status| {
                status
                    .holders
                    .iter()
                    .find(|held| held.permit == 0 && held.holder == holder)
            })
            .and_then(|held| held.valid_until.clone())
            .map(|until| until.0);
        if shown.is_some() {
            valid_until = shown;
        }
        let now = k8s_openapi::jiff::Timestamp::now();
        if !job_state(&env, &holder).await.0 {
            break now;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let valid_until = valid_until.expect("a validity was shown");
    assert!(
        suspended_at < valid_until,
        "{holder} suspended at {suspended_at}, after the validity shown to it ({valid_until})"
    );
    server.slow_lists("pods", Duration::ZERO);
    let_in(&urls[0]).await;
    let_in(&urls[1]).await;
    stop(running, shutdown).await;
    env.cleanup(&[&quorum]).await;
}

/// Found on a real cluster: a Job lock recovered a TTL late. Two masters are cut off while the Job holds the lock: what the operator
/// sends them (the extensions, then its attempts to take the fenced Job's lock back) is stranded in the network,
/// and the Job is fenced. Once the key has expired there, the operator's connections to those masters are given up
/// and opened anew; the stranded writes reach the masters just after they told the operator, on the new
/// connections, that the key is gone. Those late extensions re-create the key with the old grant's value for a
/// whole TTL, on a majority. The fenced Job, whose lock could not be taken back, is queued again; its new grant
/// must not wait for those keys to expire: the lock is held by its Job again before a marker, written on the two
/// masters just before the late writes arrived with the same TTL, has expired. Before the fix the lock stayed
/// `Contended`, blocked by its own Job, until the late keys expired.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_lock_is_held_again_before_late_writes_of_its_lost_grant_expire() {
    const TTL_MS: u64 = 20_000;
    let masters = RedisCluster::start(3).expect("masters");
    let env = Env::new().await;
    let _runtime = job_runtime(&env);
    // One partition cuts the operator off from masters 0 and 1: what it sent them while cut off reaches both late.
    let proxies = FaultProxy::start_group(&[masters[0].addr(), masters[1].addr()])
        .await
        .expect("proxies");
    let quorum = durable_quorum(&env, &[proxies[0].url(), proxies[1].url(), masters[2].url()]).await;
    create_job(&env, "first", None, true, 0, Work::Seconds(600)).await;
    let (quorum, running, shutdown) = start_with_lock(&env, 48, quorum, "20s", None).await;
    wait_for_grant(&env, "first", 1).await;
    wait_for_pod_running(&env, 1).await;

    for proxy in &proxies {
        proxy.strand(true);
    }
    // The master the operator still reaches keeps the old grant's key throughout (its attempts to take the fenced
    // Job's lock back extend it there anyway): every attempt made while cut off waits for the two masters.
    let key = format!("{}/batch", env.namespace);
    assert_eq!(
        raw_command(&masters[2].url(), &["PEXPIRE", &key, "600000"]).await,
        redis::Value::Int(1),
        "the grant's key is on the master the operator still reaches"
    );
    wait_for_suspension(&env, "first").await;
    lock_where(&env, "batch", "Lost", |lock| phase(lock) == Some(LockPhase::Lost)).await;
    eventually("the key expired on the two masters cut off", || async {
        for master in 0..2 {
            if raw_get(&masters[master].url(), &key).await.is_some() {
                return None;
            }
        }
        Some(())
    })
    .await;
    // Every key the late writes make lives a TTL from when it lands, after this marker was written.
    let marker = format!("{}/marker", env.namespace);
    for master in 0..2 {
        raw_command(
            &masters[master].url(),
            &["SET", &marker, "1", "PX", &TTL_MS.to_string()],
        )
        .await;
    }
    for proxy in &proxies {
        proxy.abandon_stranded(b"EVALSHA");
    }

    // Held by its Job again: taken back with its own token (had the late writes come first) or, as they come after
    // the masters said the key was gone, granted anew.
    let granted = eventually("first running again under a grant status shows", || async {
        assert_one_grant_running(&env).await;
        let (runs, shown) = job_state(&env, "first").await;
        let lock = env.locks().get("batch").await.ok()?;
        let held = phase(&lock) == Some(LockPhase::Held)
            && lock.status.as_ref().and_then(|s| s.holder.as_deref()) == Some("first");
        let granted: i64 = shown?.parse().ok()?;
        (runs && held && token(&lock) == Some(granted)).then_some(granted)
    })
    .await;
    for master in 0..2 {
        let left = raw_command(&masters[master].url(), &["PTTL", &marker]).await;
        assert!(
            matches!(left, redis::Value::Int(left) if left > 0),
            "first holds the lock again only after the late writes of its lost grant expired (token {granted}; the marker's PTTL on master {master}: {left:?})"
        );
    }
    for (master, proxy) in proxies.iter().enumerate() {
        assert!(
            proxy.delivered_late() > 0,
            "nothing stranded reached master {master} late: the test did not make the fault it is about"
        );
    }
    stop(running, shutdown).await;
    env.cleanup(&[&quorum]).await;
}
