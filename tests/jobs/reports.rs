//! The Job guard's reports that its work stopped: taken at once (issue 29), and sent, with the pod's token, only to
//! the server whose certificate status pins (issue 39).

use super::guard::exit_status;
use super::*;
use crate::support::report_door::Impostor;

/// Issue 29: a guarded Job pod that reports its work stopped lets its key go at once. Deleting the lock
/// suspends the Job; its pod is deleted (the test plays the kubelet and sends the guard SIGTERM), the guard stops
/// the work and reports it with the pod's projected token, and the key is released and the lock gone long before
/// the 60 s validity shown to the Job ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guarded_job_pod_that_reports_its_work_stopped_lets_a_deleted_lock_go_at_once() {
    let masters = RedisCluster::start(3).expect("masters");
    let env = Env::new().await;
    let _runtime = job_runtime(&env);
    create_job(&env, "report", None, true, 30, Work::Seconds(600)).await;
    let quorum = env.unique("q");
    // Masters started for this test: no restart to sit out, whatever the longest TTL.
    env.create_quorum_from(serde_json::json!({
        "apiVersion": "redlock.io/v1beta1", "kind": "RedisQuorum", "metadata": { "name": quorum },
        "spec": { "endpoints": masters.urls(), "maxTtl": "60s", "nodeTimeout": "100ms", "assumeDurable": true }
    }))
    .await;
    let (quorum, running, shutdown) = start_with_lock(&env, 40, quorum, "60s", None).await;
    let dir = tempfile::tempdir().expect("dir");
    let (pod, token_file) = granted_pod_with_its_token(&env, dir.path()).await;
    let out = dir.path().join("out");
    let mut guarded = spawn_guard(&env, &token_file, &out, std::process::Stdio::null()).await;
    let read = || std::fs::read_to_string(&out).unwrap_or_default();
    let shown = env
        .locks()
        .get("batch")
        .await
        .expect("lock")
        .status
        .and_then(|status| status.valid_until)
        .expect("a validity shown")
        .0;

    delete_the_lock_and_stop_the_pod(&env, &pod, &guarded).await;
    let key = format!("{}/batch", env.namespace);
    eventually("the lock to be gone and its key released", || async {
        let gone = env.locks().get_opt("batch").await.ok()?.is_none();
        (gone && key_on(&masters.urls(), &key).await.0 == 0).then_some(())
    })
    .await;
    assert!(
        k8s_openapi::jiff::Timestamp::now() < shown,
        "the key waited for the validity shown ({shown}): the report was not taken"
    );
    assert_eq!(read(), "start\nstop\n", "the work stopped before the report");
    assert_eq!(
        exit_status(&mut guarded).await,
        Some(0),
        "the work's own status after SIGTERM"
    );
    stop(running, shutdown).await;
    env.cleanup(&[&quorum]).await;
}

/// Status names another server (a TLS server with a key of its own, behind a door that counts connections)
/// beside the operator's pin. The guard connects to that server to ask how long its grant stays valid, completes
/// no handshake, says why, sends nothing, and never starts the work (#48: no answer, no start; never the wall
/// clock instead); the lock is deleted and the pod gets SIGTERM: it exits with 76 (nothing ran), and the operator
/// takes no report.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guard_sends_nothing_to_a_server_with_another_certificate() {
    let masters = RedisCluster::start(3).expect("masters");
    let env = Env::new().await;
    let _runtime = job_runtime(&env);
    let impostor = Impostor::start().await;
    create_job(&env, "report", None, true, 30, Work::Seconds(600)).await;
    let quorum = env.unique("q");
    env.create_quorum_from(serde_json::json!({
        "apiVersion": "redlock.io/v1beta1", "kind": "RedisQuorum", "metadata": { "name": quorum },
        "spec": { "endpoints": masters.urls(), "maxTtl": "20s", "nodeTimeout": "100ms", "assumeDurable": true }
    }))
    .await;
    let (running, shutdown) = operator_reporting_to(&env, &installation_secret(43), &impostor.url()).await;
    quorum_available(&env, &quorum).await;
    env.create_lock_from(serde_json::json!({
        "apiVersion": "redlock.io/v1beta1", "kind": "DistributedLock",
        "metadata": { "name": "batch" },
        "spec": { "quorum": quorum, "ttl": "20s", "holder": { "jobs": {} } }
    }))
    .await;
    let dir = tempfile::tempdir().expect("dir");
    let (pod, token_file) = granted_pod_with_its_token(&env, dir.path()).await;
    let (out, log) = (dir.path().join("out"), dir.path().join("guard.log"));
    let stderr = std::fs::File::create(&log).expect("the guard's log");
    let mut guarded = spawn_guard_unstarted(&env, &token_file, &out, stderr.into());
    let said = || std::fs::read_to_string(&log).unwrap_or_default();
    eventually("the guard to say why it does not start", || async {
        said()
            .contains("shows another certificate than the one status pins: nothing was sent to it")
            .then_some(())
    })
    .await;
    delete_the_lock_and_stop_the_pod(&env, &pod, &guarded).await;

    let exited = tokio::time::timeout(Duration::from_secs(90), guarded.wait())
        .await
        .expect("the guard exits on SIGTERM")
        .expect("its status");
    assert_eq!(exited.code(), Some(76), "stopped before its grant was told valid");
    assert_eq!(
        std::fs::read_to_string(&out).unwrap_or_default(),
        "",
        "the work started without an answer"
    );
    assert!(impostor.connections() > 0, "the guard never connected");
    assert_eq!(
        impostor.requests(),
        0,
        "a request reached the server with another certificate"
    );
    assert_eq!(
        metric(running.metrics_addr, "redlock_stopped_reports_total")
            .await
            .unwrap_or(0.0),
        0.0,
        "the operator took a report"
    );
    stop(running, shutdown).await;
    env.cleanup(&[&quorum]).await;
}

/// The pod of the Job `report` granted token 1, once it runs, and a file in `dir` holding its projected token for
/// the audience `redlock-operator`.
async fn granted_pod_with_its_token(env: &Env, dir: &std::path::Path) -> (String, std::path::PathBuf) {
    wait_for_grant(env, "report", 1).await;
    wait_for_pod_running(env, 1).await;
    let pod = live_granted_pods(env)
        .await
        .into_iter()
        .map(|(pod, _)| pod)
        .next()
        .expect("the granted pod");
    let token_file = dir.join("token");
    std::fs::write(&token_file, pod_token(env, &pod, "redlock-operator").await).expect("token file");
    (pod, token_file)
}

/// The work of the Job `report` under `guard --lock batch` with token 1, as its pod runs it (the pod's token in
/// `token_file`): it writes `start` to `out`, and `stop` on SIGTERM. Returns once it has started.
async fn spawn_guard(
    env: &Env,
    token_file: &std::path::Path,
    out: &std::path::Path,
    stderr: std::process::Stdio,
) -> tokio::process::Child {
    let guarded = spawn_guard_unstarted(env, token_file, out, stderr);
    eventually("the guarded work to start", || async {
        (std::fs::read_to_string(out).unwrap_or_default() == "start\n").then_some(())
    })
    .await;
    guarded
}

/// [`spawn_guard`], not waiting for the work to start.
fn spawn_guard_unstarted(
    env: &Env,
    token_file: &std::path::Path,
    out: &std::path::Path,
    stderr: std::process::Stdio,
) -> tokio::process::Child {
    let forever =
        "echo start >> \"$OUT\"; trap 'echo stop >> \"$OUT\"; exit 0' TERM; while true; do sleep 0.05; done";
    spawn_helper_logging(
        env,
        &["guard", "--lock", "batch"],
        forever,
        &[
            ("JOB_NAME", "report".as_ref()),
            ("REDLOCK_GRANTED_TOKEN", "1".as_ref()),
            ("REDLOCK_REPORT_TOKEN_FILE", token_file.as_os_str()),
            ("OUT", out.as_os_str()),
        ],
        stderr,
    )
}

/// Deletes the lock `batch`; once its Job's pod `pod` is being deleted, plays the kubelet: SIGTERM to the pod's
/// container, `guarded`.
async fn delete_the_lock_and_stop_the_pod(env: &Env, pod: &str, guarded: &tokio::process::Child) {
    env.locks()
        .delete("batch", &DeleteParams::default())
        .await
        .expect("delete the lock");
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), &env.namespace);
    eventually("the Job's pod to be deleted", || async {
        let current = pods.get_opt(pod).await.ok()?;
        current
            .is_none_or(|current| current.metadata.deletion_timestamp.is_some())
            .then_some(())
    })
    .await;
    let pid = nix::unistd::Pid::from_raw(i32::try_from(guarded.id().expect("pid")).expect("pid"));
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).expect("SIGTERM");
}
