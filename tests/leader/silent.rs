//! Issue 55: a leader that goes silent (cut off from the operator, its pod still Running and Ready) does not keep
//! the lock for good. `elect` stops the work on its own clock by the validity it was last told; the operator,
//! which told it that validity, moves the lock once it has ended unanswered, without waiting for the validity
//! status shows, and the lock says why meanwhile.

use super::elect::ReportingLeader;
use super::*;
use crate::support::report_door::ReportDoor;

/// web-0's asks are held at a door from a moment on (as a NetworkPolicy or a cut route would): its command stops,
/// then web-1 leads; web-0's command had stopped by the time status showed web-1, and the condition named web-0
/// while it was silent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_that_stops_asking_is_moved_off_once_the_validity_told_to_it_has_ended() {
    let masters = RedisCluster::start(3).expect("masters");
    let env = Env::new().await;
    let door = ReportDoor::start().await;
    let quorum = env.unique("q");
    create_long_ttl_quorum(&masters, &env, &quorum).await;
    let (running, shutdown) = operator_reporting_to(&env, &installation_secret(55), &door.url()).await;
    quorum_available(&env, &quorum).await;
    door.open_to(running.reports_addr.expect("the reports port is open"));
    // A TTL of 12 s: the condition shows after 6 s of silence, the lock moves after the validity told (~12 s).
    let mut web0 = ReportingLeader::start(&env, &quorum, "12s").await;
    door.hold();
    let silent = eventually("HolderReachesOperator=False naming web-0", || async {
        let lock = env.locks().get("web").await.ok()?;
        lock.status?
            .conditions
            .into_iter()
            .find(|c| {
                c.type_ == "HolderReachesOperator" && c.status == "False" && c.message.contains("web-0")
            })
            .map(|c| c.message)
    })
    .await;
    assert!(silent.contains("has stopped asking"), "{silent}");
    wait_for_leader(&env, "web-1").await;
    assert!(
        web0.said().ends_with("stop\n"),
        "web-1 leads while web-0's command has not stopped: {}",
        web0.said()
    );
    let _ = web0.elect.kill().await;
    stop(running, shutdown).await;
    env.cleanup(&[&quorum]).await;
}

/// The same for a semaphore's permit (issue 55: "or a semaphore permit's holder"): web-0 and web-1 lead on the
/// lock's two permits, web-0 under its elect; once web-0's asks are held, its command stops and its permit goes to
/// web-2, while web-1 (which never asks: a holder of its own, not judged) keeps its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_holder_that_stops_asking_loses_its_permit_and_the_other_permit_stays() {
    let masters = RedisCluster::start(3).expect("masters");
    let env = Env::new().await;
    let door = ReportDoor::start().await;
    let quorum = env.unique("q");
    create_long_ttl_quorum(&masters, &env, &quorum).await;
    let (running, shutdown) = operator_reporting_to(&env, &installation_secret(56), &door.url()).await;
    quorum_available(&env, &quorum).await;
    door.open_to(running.reports_addr.expect("the reports port is open"));
    ready_pods(&env, &["web-0", "web-1"]).await;
    web_semaphore(&env, &quorum, "12s", None, 2).await;
    let before = super::semaphore::wait_for_leaders(&env, &["web-0", "web-1"], 2).await;
    ready_pods(&env, &["web-2"]).await;
    let mut web0 = ReportingLeader::start_on_web_0(&env).await;
    door.hold();
    let after = super::semaphore::wait_for_leaders(&env, &["web-1", "web-2"], 2).await;
    assert!(
        web0.said().ends_with("stop\n"),
        "web-2 leads while web-0's command has not stopped: {}",
        web0.said()
    );
    assert_eq!(
        after.get("web-1"),
        before.get("web-1"),
        "web-1 kept its permit and token"
    );
    assert_eq!(
        after.get("web-2").map(|(permit, _)| *permit),
        before.get("web-0").map(|(permit, _)| *permit),
        "web-2 has web-0's permit"
    );
    let _ = web0.elect.kill().await;
    stop(running, shutdown).await;
    env.cleanup(&[&quorum]).await;
}
