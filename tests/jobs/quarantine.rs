//! Masters that come back out of their restart quarantine one by one while a Job lock is lost (issue 48 item 3).

use std::time::Instant;

use super::*;

/// Issue 48, found on a real node (the chart's five masters, three deleted one after another, so that they come
/// back out of their restart quarantine one by one): the identity and leader locks were held again within 2 s of
/// the quorum being back, the Job lock 30 s later, when the last restarted master left its quarantine. The fenced
/// Job's lock could not be taken back with its token (the masters that kept its value are a minority), yet every
/// attempt counted the quarantined masters as masters that might still hold it, and waited for them; a restarted
/// master is empty and no extension writes to it while it is quarantined, so it never votes for that value. Here
/// two of three masters restart 6 s apart: the Job is queued again and granted a new token once the first of them
/// votes again, while the second still sits out its quarantine. Before the fix the lock waited for the second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_job_runs_again_once_a_majority_votes_not_when_the_last_restarted_master_does() {
    // A restarted master does not vote for the quorum's maxTtl (the fresh masters neither, at the start).
    const MAX_TTL: Duration = Duration::from_secs(14);
    const APART: Duration = Duration::from_secs(6);
    let mut masters = RedisCluster::start(3).expect("masters");
    let env = Env::new().await;
    let _runtime = job_runtime(&env);
    create_job(&env, "first", None, true, 0, Work::Seconds(600)).await;
    let quorum = env.unique("q");
    env.create_quorum(&quorum, &masters.urls(), &format!("{}s", MAX_TTL.as_secs()))
        .await;
    let (quorum, running, shutdown) = start_with_lock(&env, 49, quorum, "2s", None).await;
    wait_for_grant(&env, "first", 1).await;
    wait_for_pod_running(&env, 1).await;

    // With master 0 quarantined, masters 1 and 2 keep the lock; once master 1 restarts too, master 2 alone holds
    // the grant's value, and the lock is lost.
    masters[0].restart().expect("restart master 0");
    let first_back = Instant::now() + MAX_TTL;
    tokio::time::sleep(APART).await;
    masters[1].restart().expect("restart master 1");
    // Master 1 votes again no sooner than a maxTtl after it started (its uptime says when).
    let second_back = Instant::now() + MAX_TTL;
    // Fenced (status shows `Lost` only until the Job is queued again, which may be too brief to see).
    wait_for_suspension(&env, "first").await;
    assert!(
        Instant::now() < first_back,
        "fenced only after master 0 could vote again: the test did not make the fault it is about"
    );

    let (granted, held_at) = eventually_within(
        "first running again under a new token status shows",
        MAX_TTL + APART + Duration::from_secs(10),
        || async {
            assert_one_grant_running(&env).await;
            let (runs, shown) = job_state(&env, "first").await;
            let lock = env.locks().get("batch").await.ok()?;
            let held = phase(&lock) == Some(LockPhase::Held)
                && lock.status.as_ref().and_then(|s| s.holder.as_deref()) == Some("first");
            let granted: i64 = shown?.parse().ok()?;
            (runs && held && granted > 1 && token(&lock) == Some(granted)).then(|| (granted, Instant::now()))
        },
    )
    .await;
    assert!(
        held_at < second_back,
        "first held the lock again (token {granted}) only {:.1} s after master 0 could vote again, once master 1 \
         left its quarantine too",
        held_at.saturating_duration_since(first_back).as_secs_f64()
    );
    events_seen(&env.events(), Some("Job"), "first", &["Fenced", "Requeued"]).await;
    stop(running, shutdown).await;
    env.cleanup(&[&quorum]).await;
}
