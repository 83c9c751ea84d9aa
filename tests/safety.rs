//! The safety checker, short version (the long one is `cargo bench --bench safety`): no two holders' windows
//! overlap and tokens strictly increase under random faults, and the checker is shown able to fail by negative
//! controls.

use std::time::Duration;

use crate::support::safety::scripted::{
    fast_clocks, majority_restart_tokens, restart_majority_while_held, run_without_faults,
    slow_rememberers_tokens,
};
use crate::support::safety::{Grant, Workload, find_overlaps, find_token_regressions, random_run};
use tokio::time::Instant;

#[test]
fn the_checker_finds_overlaps_and_only_overlaps() {
    let t0 = Instant::now();
    let at = |ms: u64| t0 + Duration::from_millis(ms);
    let grant = |resource: &str, client: &str, start: u64, end: u64| Grant {
        resource: resource.into(),
        client: client.into(),
        start: at(start),
        end: at(end),
        token: i64::try_from(start).expect("small"),
        evidence: String::new(),
    };
    let clean = [
        grant("a", "x", 0, 10),
        grant("a", "y", 10, 20),
        grant("b", "z", 5, 15),
        grant("a", "x", 25, 30),
    ];
    assert!(find_overlaps(&clean).is_empty());
    // A long window followed by two short ones: both overlap the long one, not just the first.
    let dirty = [
        grant("a", "x", 0, 100),
        grant("a", "y", 10, 20),
        grant("a", "z", 30, 40),
    ];
    let overlaps = find_overlaps(&dirty);
    assert_eq!(overlaps.len(), 2);
    assert!(overlaps.iter().all(|overlap| overlap.first.client == "x"));
}

#[test]
fn the_checker_finds_tokens_that_do_not_increase() {
    let t0 = Instant::now();
    let grant = |resource: &str, start: u64, token: i64| Grant {
        resource: resource.into(),
        client: format!("c{start}"),
        start: t0 + Duration::from_millis(start),
        end: t0 + Duration::from_millis(start + 1),
        token,
        evidence: String::new(),
    };
    let clean = [
        grant("a", 0, 1),
        grant("a", 5, 7),
        grant("b", 2, 1),
        grant("a", 9, 8),
    ];
    assert!(find_token_regressions(&clean).is_empty());
    // A repeated token and one below an earlier (not just the previous) grant's.
    let dirty = [
        grant("a", 0, 5),
        grant("a", 5, 5),
        grant("a", 9, 3),
        grant("a", 12, 6),
    ];
    let regressions = find_token_regressions(&dirty);
    assert_eq!(regressions.len(), 2);
    assert!(regressions.iter().all(|regression| regression.earlier.token == 5));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_faults_never_produce_two_holders() {
    let workload = Workload {
        clients: 8,
        resources: Workload::resources(3),
        ttl: Duration::from_secs(1),
        hold: Duration::from_millis(1)..Duration::from_millis(60),
        pause_probability: 0.03,
        long_hold_probability: 0.1,
        floor_lag: Some(Duration::ZERO..Duration::from_millis(20)),
        permits: 1,
        miscounted_permits: None,
        fair_wait: None,
        queue_skipper: false,
    };
    let report = random_run(
        workload,
        Duration::from_millis(50),
        Duration::from_millis(1_500),
        None,
        |_, elapsed| elapsed >= Duration::from_secs(45),
    )
    .await;
    println!("random faults: {report}");
    assert!(report.overlaps.is_empty(), "{report}");
    assert!(report.token_regressions.is_empty(), "{report}");
    assert!(
        report.grants >= 100,
        "too little progress to mean anything: {report}"
    );
    assert!(report.nemesis_events >= 20, "{report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarting_a_majority_breaks_safety_without_quarantine_only() {
    let without = restart_majority_while_held(false).await;
    println!("quarantine off: {without}");
    assert!(
        !without.overlaps.is_empty(),
        "the negative control must fail the check: {without}"
    );
    let with = restart_majority_while_held(true).await;
    println!("quarantine on: {with}");
    assert!(with.overlaps.is_empty(), "{with}");
    assert!(with.token_regressions.is_empty(), "{with}");
    assert_eq!(
        with.grants, 2,
        "the contender gets the lock once the quarantine is over: {with}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clocks_faster_than_the_drift_allowance_break_safety() {
    let fast = fast_clocks(1.5).await;
    println!("clock 50% fast: {fast}");
    assert!(
        !fast.overlaps.is_empty(),
        "the negative control must fail the check: {fast}"
    );
    let within = fast_clocks(1.005).await;
    println!("clock 0.5% fast (allowance 1% + 2ms): {within}");
    assert!(within.overlaps.is_empty(), "{within}");
    assert_eq!(
        within.grants, 2,
        "the contender gets the lock once it expired: {within}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_majority_restart_sends_tokens_back_without_the_durable_floor_only() {
    let without = majority_restart_tokens(false).await;
    println!("counters only: {without}");
    assert!(
        !without.token_regressions.is_empty(),
        "the negative control must fail the check: {without}"
    );
    let with = majority_restart_tokens(true).await;
    println!("counters and the durable floor: {with}");
    assert!(with.token_regressions.is_empty(), "{with}");
    assert!(with.overlaps.is_empty(), "{with}");
    assert_eq!(with.grants, 6, "five grants and the contender's: {with}");
}

/// Issue 39, item 4: after a majority of masters restarted empty, the masters that remember the key's last
/// token are slow (not hung); the engine waits for their counters because a restarted master is in the deciding
/// majority, and the token does not go back. Its negative control decides at the first majority and is caught.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_masters_that_remember_are_heard_before_a_restarted_majority_fixes_the_token() {
    let without = slow_rememberers_tokens(false).await;
    println!("decided at the first majority: {without}");
    assert!(
        !without.token_regressions.is_empty(),
        "the negative control must fail the check: {without}"
    );
    let with = slow_rememberers_tokens(true).await;
    println!("waiting for the slow masters' counters: {with}");
    assert!(with.token_regressions.is_empty(), "{with}");
    assert!(with.overlaps.is_empty(), "{with}");
    assert_eq!(with.grants, 6, "five grants and the contender's: {with}");
}

/// Issue 23: a counting semaphore under the same nemesis never has more holders than permits, and each permit's
/// tokens rise; a client that counts one permit too many (the negative control) is caught.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_semaphore_never_has_more_holders_than_permits_and_a_miscounting_client_is_caught() {
    let workload = |miscounted_permits| Workload {
        clients: 6,
        resources: Workload::resources(1),
        ttl: Duration::from_secs(1),
        hold: Duration::from_millis(20)..Duration::from_millis(80),
        pause_probability: 0.02,
        long_hold_probability: 0.1,
        floor_lag: Some(Duration::ZERO..Duration::from_millis(20)),
        permits: 2,
        miscounted_permits,
        fair_wait: None,
        queue_skipper: false,
    };
    let report = random_run(
        workload(None),
        Duration::from_millis(50),
        Duration::from_millis(1_500),
        None,
        |_, elapsed| elapsed >= Duration::from_secs(25),
    )
    .await;
    println!("semaphore of 2: {report}");
    assert!(report.overlaps.is_empty(), "{report}");
    assert!(report.token_regressions.is_empty(), "{report}");
    assert!(
        report.grants >= 50,
        "too little progress to mean anything: {report}"
    );

    // Client 0 counts three permits: it takes the third while the two others are held.
    let miscounted = random_run(
        workload(Some(3)),
        Duration::from_millis(50),
        Duration::from_millis(500),
        None,
        |_, elapsed| elapsed >= Duration::from_secs(15),
    )
    .await;
    println!("one client counting three permits: {miscounted}");
    assert!(
        !miscounted.overlaps.is_empty(),
        "the negative control must fail the check: {miscounted}"
    );
}

/// Issue 31: waiters in a fair queue never overlap, tokens rise, and without faults every waiter a majority had
/// queued before another asked is served first; a client that skips the queue (the negative control) is caught.
/// Under the nemesis, inversions a fault excuses are counted, not failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_waiters_are_served_in_arrival_order_and_a_queue_skipper_is_caught() {
    let node_timeout = Duration::from_millis(50);
    let clean = run_without_faults(Workload::fair(false), node_timeout, Duration::from_secs(12)).await;
    println!("fair, no faults: {clean}");
    assert!(clean.overlaps.is_empty(), "{clean}");
    assert!(clean.token_regressions.is_empty(), "{clean}");
    assert!(clean.order_inversions.is_empty(), "{clean}");
    assert!(
        clean.fair_acquisitions >= 50,
        "too little progress to mean anything: {clean}"
    );

    let skipped = run_without_faults(Workload::fair(true), node_timeout, Duration::from_secs(12)).await;
    println!("fair, client 0 skips the queue: {skipped}");
    assert!(
        !skipped.order_inversions.is_empty(),
        "the negative control must fail the check: {skipped}"
    );

    let faults = random_run(
        Workload::fair(false),
        node_timeout,
        Duration::from_millis(1_500),
        None,
        |_, elapsed| elapsed >= Duration::from_secs(20),
    )
    .await;
    println!("fair, random faults: {faults}");
    assert!(faults.overlaps.is_empty(), "{faults}");
    assert!(faults.token_regressions.is_empty(), "{faults}");
    assert!(faults.order_inversions.is_empty(), "{faults}");
}
