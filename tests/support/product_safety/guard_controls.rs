//! The guard's negative controls (issue 29), each with its clean twin:
//! - `unguarded-jobs`: Job pods that run their work without the guard, through a failover longer than the TTL.
//!   No replica can suspend the Job while its lock lapses, so its pod runs on past the validity it was shown,
//!   and a `lock` process outside Kubernetes takes the key beside it. The twin runs the same with the guard,
//!   which stops the work on its own clock before that validity ends.
//! - `report-before-stop`: a guard that reports its work stopped as soon as it passes the stop on, while the work
//!   still runs. The operator releases the key on the word, and a `lock` process takes it beside the work. The
//!   twin reports once the work has exited, as `guard` does.
//! - `holders-trust-wall-clock` (issue 48): guards whose wall clock is behind the operator's by more than their
//!   margin and its skew bound together, which stop at status's `validUntil` on it as guards did before, through a
//!   failover longer than the TTL: their work runs on past the validity they were shown, counted as a violation
//!   by construction (`Scenario::beliefs_within_shown_validity`). The twins, behind and ahead, are today's guards,
//!   which count the validity the active replica tells them on their own clock and never read the wall clock
//!   while it offers a channel.

use std::time::Duration;

use tokio::time::Instant;

use super::checker::Report;
use super::controls::{Outcome, acting, base, caught, held};
use super::guard::Reports;
use super::nemesis::{Forced, force};
use redlock_operator::cli::stop_time::HolderClock;

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
        // Without the guard the pod runs on past the validity it was shown, counted as a violation by
        // construction, whether or not the `lock` process takes the key in that gap; with it, it stops before.
        beliefs_within_shown_validity: true,
        ..base(seed, None)
    })
    .await;
    let from = Instant::now();
    let key = world.sides[0].jobs[0].key.clone();
    for _ in 0..3 {
        let token = held(&world, 0, "jobs-0").await;
        // The Job's pod works under the grant before the failover, however slow the machine.
        acting(&world, &key, token).await;
        force(&mut world, Forced::LongFailover).await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        if caught(&world) {
            break;
        }
    }
    world.finish(from).await
}

/// Both twins of `report-before-stop`: reported before the work exited (caught) and after (passes).
#[allow(dead_code)] // Only the bench (benches/operator_safety.rs) runs both twins; the test runs them apart.
pub async fn report_before_stop(seed: u64) -> Outcome {
    Outcome {
        name: "report-before-stop",
        broken: deletion_run(seed, Reports::BeforeTheWorkStopped).await,
        clean: Some(deletion_run(seed, Reports::AfterTheWorkStopped).await),
    }
}

/// The TTL of [`deletion_run`]'s lock: long enough that what status shows of the validity (at least 4 s) stays
/// above the guard's margin below.
const DELETION_TTL: Duration = Duration::from_secs(12);
/// Its guards' margin: once status stops showing the grant they SIGKILL the work half of it later, which bounds
/// how long a report sent too early can leave the work running beside the next holder.
const DELETION_GUARD_MARGIN: Duration = Duration::from_secs(3);

/// One cluster, a Job lock whose Jobs run long (their work takes 8 s to exit after SIGTERM, their pods have 20 s
/// of grace) and two `lock` processes on its key. While a Job holds the lock, the lock is deleted: the operator
/// suspends the Job and gives its grant up, and the pod's guard stops the work and reports, as `reports` says;
/// the `lock` processes take the key once it is released.
/// Repeated (at most four times) until the checker has an overlap to show.
pub async fn deletion_run(seed: u64, reports: Reports) -> Report {
    let world = World::start(Scenario {
        job_locks: 1,
        ttl: DELETION_TTL,
        job_guard: Some(DELETION_GUARD_MARGIN),
        guard_reports: reports,
        work_stop_delay: Duration::from_secs(8),
        job_grace_seconds: 20,
        outside_clients: 2,
        churn_keys: 1,
        ..base(seed, None)
    })
    .await;
    let from = Instant::now();
    let key = world.sides[0].jobs[0].key.clone();
    for _ in 0..4 {
        let token = held(&world, 0, "jobs-0").await;
        // The pod's guard has started the work before the lock goes, however slow the machine.
        acting(&world, &key, token).await;
        // Created again only a while after it went: the `lock` processes, not its next Job, take the key.
        world
            .recorder
            .nemesis("jobs-0 deleted while its Job runs, created again 10s after it went".into());
        let side = &world.sides[0];
        side.jobs[0]
            .recreate(&side.cluster, Duration::from_secs(10))
            .await;
        // A report sent before the work exited is counted when the work exits (8 s after the SIGTERM), by then.
        if caught(&world) {
            break;
        }
    }
    world.finish(from).await
}

/// How far the guards' wall clock is off the operator's in [`skewed_run`]: more than their margin (1 s) and
/// their skew bound (1 s) together.
pub const SKEW: Duration = Duration::from_secs(4);

/// Which way the guards' wall clock is off.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Skew {
    Behind,
    Ahead,
}

/// [`failover_run`] with guarded Job pods whose wall clock is `skew` [`SKEW`] off the operator's, trusting
/// status's `validUntil` on it (`trust_status_times`, the negative control) or not (today's guards); every belief
/// must end before the validity its guard was shown. Repeated (at most three times) until the checker has a
/// violation to show, and at least twice.
pub async fn skewed_run(seed: u64, skew: Skew, trust_status_times: bool) -> Report {
    let offset = k8s_openapi::jiff::SignedDuration::try_from(SKEW).unwrap_or_default();
    let mut world = World::start(Scenario {
        replicas: 2,
        job_locks: 1,
        job_guard: Some(guard_default_margin()),
        guard_clock: HolderClock {
            offset: if skew == Skew::Behind { -offset } else { offset },
            trust_status_times,
        },
        beliefs_within_shown_validity: true,
        outside_clients: 1,
        churn_keys: 1,
        ..base(seed, None)
    })
    .await;
    let from = Instant::now();
    let key = world.sides[0].jobs[0].key.clone();
    for round in 0..3 {
        let token = held(&world, 0, "jobs-0").await;
        // The pod's guard has started the work before the failover, however slow the machine.
        acting(&world, &key, token).await;
        force(&mut world, Forced::LongFailover).await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        if round >= 1 && caught(&world) {
            break;
        }
    }
    world.finish(from).await
}
