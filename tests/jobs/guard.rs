//! The Job guard on its own: a Job pod's work stops on the guard's clock, whatever the operator does (issue 29).

use super::*;

/// A `redlock-operator guard` process standing in for a Job pod's container: the grant's token as the downward
/// API would pass it from the pod's annotation, and `script` as the work, with `$OUT` to write to.
pub(super) fn guard(
    env: &Env,
    job: &str,
    token: &str,
    out: &std::path::Path,
    script: &str,
) -> tokio::process::Child {
    spawn_helper(
        env,
        &["guard", "--lock", "batch"],
        script,
        &[
            ("JOB_NAME", job.as_ref()),
            ("REDLOCK_GRANTED_TOKEN", token.as_ref()),
            ("OUT", out.as_os_str()),
        ],
    )
}

pub(super) async fn exit_status(child: &mut tokio::process::Child) -> Option<i32> {
    tokio::time::timeout(PATIENCE, child.wait())
        .await
        .expect("guard exits")
        .expect("status")
        .code()
}

/// Issue 29: a Job pod's work run under `guard` stops on the guard's own clock, before the validity it was
/// shown ends, when no operator replica extends the lock any more (a failover, a stopped operator): nothing
/// in the lock changes to tell it. It ends with exit status 76 (which a `podFailurePolicy` ignores). A pod
/// created under another grant never starts its work, and work that ends by itself gives its own status.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guarded_job_pod_stops_its_work_on_its_own_clock_when_no_operator_extends_the_lock() {
    let masters = RedisCluster::start(3).expect("masters");
    let env = Env::new().await;
    let _runtime = job_runtime(&env);
    create_job(&env, "report", None, true, 0, Work::Seconds(600)).await;
    let (quorum, running, shutdown) = setup(&masters, &env, 38, "3s", None).await;
    wait_for_grant(&env, "report", 1).await;

    let dir = tempfile::tempdir().expect("dir");
    let read = |path: &std::path::Path| std::fs::read_to_string(path).unwrap_or_default();
    let forever = "echo \"start $REDLOCK_JOB $REDLOCK_FENCING_TOKEN\" >> \"$OUT\"; trap 'echo stop >> \"$OUT\"; exit 0' TERM; while true; do sleep 0.05; done";
    let (stale_out, held_out) = (dir.path().join("stale"), dir.path().join("held"));
    let mut stale = guard(&env, "report", "2", &stale_out, forever);
    let mut held = guard(&env, "report", "1", &held_out, forever);
    eventually("the granted pod's work to start", || async {
        (read(&held_out) == "start report 1\n").then_some(())
    })
    .await;
    let mut finishing = guard(&env, "report", "1", &dir.path().join("done"), "exit 3");
    assert_eq!(
        exit_status(&mut finishing).await,
        Some(3),
        "work that ends by itself gives its own status"
    );

    // No replica extends the lock from here on; the API server still answers, and shows the last validity.
    stop(running, shutdown).await;
    let shown = env.locks().get("batch").await.expect("lock");
    assert_eq!(
        exit_status(&mut held).await,
        Some(76),
        "the guard stops the work when the grant runs out"
    );
    assert_eq!(read(&held_out), "start report 1\nstop\n");
    let after = env.locks().get("batch").await.expect("lock");
    assert_eq!(
        after.metadata.resource_version, shown.metadata.resource_version,
        "nothing in the lock told the guard: it stopped on its own clock"
    );

    assert_eq!(read(&stale_out), "", "a pod of another grant started its work");
    let pid = nix::unistd::Pid::from_raw(i32::try_from(stale.id().expect("pid")).expect("pid"));
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).expect("SIGTERM");
    assert_eq!(
        exit_status(&mut stale).await,
        Some(76),
        "a pod stopped before its grant was current did not succeed"
    );
    env.cleanup(&[&quorum]).await;
}
