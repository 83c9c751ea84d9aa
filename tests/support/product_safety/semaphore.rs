//! The semaphore mode's runs (issue 23): Job locks and leader-election locks of `PERMITS` permits on keys the two
//! clusters share, with `lock --permits` processes on the same keys, under the nemesis and two faults forced at
//! fixed points; and its negative control, an outside client that counts permits wrongly.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use tokio::time::Instant;

use super::checker::Report;
use super::controls::{Outcome, base};
use super::nemesis::Forced;
use super::permits::excess_holders;
use super::{Scenario, World};

/// The semaphore's permits.
pub const PERMITS: usize = 3;
/// The Jobs queued at once on each cluster's Job lock at the start.
pub const FIRST_QUEUE: usize = 10;
/// The Job locks' and `lock` processes' TTL, with the operator's default `fenceMargin` (a fifth of it) and the
/// guard's default `--fence-margin`: a failover longer than what is left of a validity (the replicas' 2 s lease,
/// then the standby's takeover) lets the lock lapse while nobody can suspend its Job, and the Job's pods stop
/// on their guards' clocks. (Before the guard, this mode ran at 6 s with a 2 s margin to stay green.)
pub const TTL: Duration = super::DEFAULT_TTL;

/// Two clusters of two replicas, each with a Job lock of `PERMITS` permits on one shared key and a first queue
/// of `FIRST_QUEUE` Jobs (then a few more kept queued) and a leader-election lock of `PERMITS` permits over one
/// pod more on another, and two `lock --permits` processes on both keys, under the nemesis for `duration`; one
/// master SIGKILLed at a sixth of it and the active replica of a cluster at a third, whatever the nemesis does.
pub fn scenario(seed: u64, duration: Duration) -> Scenario {
    Scenario {
        seed,
        duration,
        clusters: 2,
        replicas: 2,
        leader_locks: 1,
        pods_per_lock: PERMITS + 1,
        leader_permits: PERMITS,
        identity_locks: 0,
        job_locks: 1,
        ttl: TTL,
        first_jobs: FIRST_QUEUE,
        queue: PERMITS + 1,
        outside_clients: 2,
        outside_on_cluster_keys: true,
        churn_keys: 1,
        job_seconds: 2.0..5.0,
        real_clusters: true,
        nemesis: true,
        forced: vec![
            (duration / 6, Forced::KillMaster),
            (duration / 3, Forced::KillActiveReplica),
        ],
        permits: PERMITS,
        miscounting_outside: false,
        controls: String::new(),
        progress: Some(Duration::from_secs(30)),
        ..Scenario::default()
    }
}

/// The negative control: a `lock` client that runs with `--permits 4` on the Job semaphore's key (of 3 permits)
/// and believes it holds its permit modulo 3, run until it was caught (or long after the Jobs held every permit),
/// and its clean twin (`--permits 3`, its own permit).
pub async fn miscounting_client(seed: u64) -> Outcome {
    Outcome {
        name: "miscounting-client",
        broken: miscounting_run(seed, true).await,
        clean: Some(miscounting_run(seed, false).await),
    }
}

/// One cluster's Job lock of `PERMITS` permits whose Jobs run long, and one outside client on its key. Once the
/// Jobs hold every permit, the client can only run on a permit above them: the miscounting one does, as the
/// fourth holder of the key, believing it holds permit 0 beside the Job holding it.
async fn miscounting_run(seed: u64, miscounting: bool) -> Report {
    let world = World::start(Scenario {
        job_locks: 1,
        ttl: TTL,
        queue: PERMITS + 1,
        job_seconds: 15.0..20.0,
        outside_clients: 1,
        churn_keys: 1,
        permits: PERMITS,
        miscounting_outside: miscounting,
        ..base(seed, None)
    })
    .await;
    let from = Instant::now();
    // The Jobs hold every permit a few seconds after the start, however slow the machine; then the client has
    // many tries (a `lock` run at most every few seconds) while they do.
    let deadline = from + Duration::from_secs(120);
    let mut full_since: Option<Instant> = None;
    while Instant::now() < deadline {
        if !excess_holders(&world.recorder.beliefs(), &world.bounds()).is_empty() {
            break;
        }
        if running_jobs(&world).await >= PERMITS {
            full_since.get_or_insert_with(Instant::now);
        }
        if full_since.is_some_and(|since| since.elapsed() > Duration::from_secs(10)) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    world.finish(from).await
}

/// How many Jobs' pods run now, in every cluster.
async fn running_jobs(world: &World) -> usize {
    let mut running = 0;
    for side in &world.sides {
        let pods: Api<Pod> = Api::namespaced(side.cluster.client.clone(), &side.cluster.namespace);
        if let Ok(list) = pods
            .list(&ListParams::default().labels("safety.redlock.io/role=job"))
            .await
        {
            running += list
                .items
                .iter()
                .filter(|pod| {
                    pod.status.as_ref().and_then(|status| status.phase.as_deref()) == Some("Running")
                })
                .count();
        }
    }
    running
}
