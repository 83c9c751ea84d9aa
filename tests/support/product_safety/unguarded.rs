//! The guard's negative control (issue 29): Job pods that run their work without the guard, through a failover
//! longer than the TTL. No replica can suspend the Job while its lock lapses, so its pod runs on past the
//! validity it was shown, and a `lock` process outside Kubernetes takes the key beside it. Its clean twin runs
//! the same with the guard, which stops the work on its own clock before that validity ends.

use std::time::Duration;

use tokio::time::Instant;

use super::checker::Report;
use super::controls::{Outcome, base, held, overlapped};
use super::nemesis::{Forced, force};
use super::{Scenario, World, guard_default_margin};

/// Both twins: without the guard (caught) and with it (passes).
#[allow(dead_code)] // Only the bench (benches/operator_safety.rs) runs both twins; the test runs them apart.
pub async fn unguarded_jobs(seed: u64) -> Outcome {
    Outcome {
        name: "unguarded-jobs",
        broken: failover_run(seed, false).await,
        clean: Some(failover_run(seed, true).await),
    }
}

/// One cluster of two replicas, a Job lock whose Jobs run long and a `lock` process on its key; while a Job
/// holds it, no replica is active for twice the TTL (the active one killed, the other stopped). Repeated (at
/// most three times) until the checker has an overlap to show.
pub async fn failover_run(seed: u64, guarded: bool) -> Report {
    let mut world = World::start(Scenario {
        replicas: 2,
        job_locks: 1,
        job_guard: guarded.then(guard_default_margin),
        outside_clients: 1,
        churn_keys: 1,
        ..base(seed, None)
    })
    .await;
    let from = Instant::now();
    for _ in 0..3 {
        held(&world, 0, "jobs-0").await;
        // The Job's pod runs by then, however slow the machine: it was created when the Job was granted.
        tokio::time::sleep(Duration::from_secs(1)).await;
        force(&mut world, Forced::LongFailover).await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        if overlapped(&world) {
            break;
        }
    }
    world.finish(from).await
}
