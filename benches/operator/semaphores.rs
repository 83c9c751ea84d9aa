//! The semaphore run: `OPERATOR_BENCH_SEMAPHORES` leader semaphores (default 1,000) of
//! `OPERATOR_BENCH_PERMITS` permits (default 10) each, held, on a fresh operator, masters and API server, so
//! that nothing of the single-lock run is left in them.
//!
//! Leader semaphores rather than Job semaphores: a permit held for a pod is held as long as the pod is ready,
//! which is steady holding, like the single locks' identities. A Job's permit is also held while its Job runs,
//! but Jobs need the Job controller and kubelet played beside the server (`tests/support/job_controller.rs`),
//! whose own work would share the two cores with the operator. The 10,000 pods the leaders need cost the API
//! server memory and the operator's pod cache as many entries, which is part of what a leader semaphore costs.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use redlock_operator::api::DistributedLock;
use tokio::time::Instant;

use super::{
    BoxError, Cluster, Compared, HeldWatch, Operator, create_locks, create_pods, realistic_pod, rss_mib,
    steady_holding,
};

/// The namespace of the semaphores and their pods (a leader election looks in its lock's namespace).
const NAMESPACE: &str = "bench";

fn semaphore_name(index: usize) -> String {
    format!("sem-{index:05}")
}

/// Semaphore `sem-00000` … (ttl 10s, `permits` permits), electing its leaders among the pods labelled with its
/// name.
fn semaphore(index: usize, permits: usize) -> (String, serde_json::Value) {
    let name = semaphore_name(index);
    let spec = serde_json::json!({
        "ttl": "10s", "permits": permits,
        "holder": { "leaderElection": { "selector": { "matchLabels": { "semaphore": name } } } }
    });
    (name, spec)
}

/// `permits` pods for each of the `semaphores`, Running and Ready (the server makes every new pod Pending,
/// so the kubelet's status write is played after the create), 32 at a time.
async fn create_ready_pods(client: &kube::Client, semaphores: usize, permits: usize) -> Result<(), BoxError> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let ready = serde_json::json!({ "status": {
        "phase": "Running",
        "conditions": [{ "type": "Ready", "status": "True" }, { "type": "Initialized", "status": "True" }]
    }});
    let (pods, ready) = (&pods, &ready);
    futures::stream::iter(0..semaphores * permits)
        .map(|index| async move {
            let semaphore = semaphore_name(index / permits);
            let name = format!("{semaphore}-{}", index % permits);
            let labels = serde_json::json!({ "semaphore": semaphore });
            pods.create(&PostParams::default(), &realistic_pod(&name, NAMESPACE, labels)?)
                .await?;
            pods.patch_status(&name, &PatchParams::default(), &Patch::Merge(ready))
                .await?;
            Ok::<(), BoxError>(())
        })
        .buffer_unordered(32)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(())
}

pub async fn run(
    semaphores: usize,
    permits: usize,
    window: Duration,
    other_pods: usize,
) -> Result<Compared, BoxError> {
    let cluster = Cluster::start().await?;
    let (operator, idle, rss_idle) = Operator::start_idle(&cluster).await?;
    let pid = operator.pid;
    if other_pods > 0 {
        println!("creating {other_pods} pods of other applications …");
        create_pods(&cluster.client, other_pods).await?;
    }
    let leader_pods = semaphores * permits;
    println!("creating {leader_pods} pods, {permits} per semaphore, Running and Ready …");
    create_ready_pods(&cluster.client, semaphores, permits).await?;
    // Let the pod watch take them all in.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let rss_pods = rss_mib(pid)?;
    println!("with {other_pods} + {leader_pods} pods in the cluster: {rss_pods:.1} MiB");

    let created: Mutex<HashMap<String, Instant>> = Mutex::default();
    let api: Api<DistributedLock> = Api::namespaced(cluster.client.clone(), NAMESPACE);
    let watch = HeldWatch::start(api.clone(), permits);
    println!("creating {semaphores} semaphores of {permits} permits (ttl 10s) …");
    let creating = Instant::now();
    create_locks(&api, semaphores, Some(&created), |index| {
        semaphore(index, permits)
    })
    .await?;
    println!(
        "created in {:.1}s; waiting for every permit to be held …",
        creating.elapsed().as_secs_f64()
    );
    // Not all held in time is a result too: the steady holding of those that are is still measured, and the
    // summary says how many.
    let held = watch.wait_for(semaphores, super::patience()).await;
    let all_held_after = if held == semaphores {
        creating.elapsed().as_secs_f64()
    } else {
        f64::INFINITY
    };
    let p50 = watch.create_to_held_p50_ms(&created);
    println!(
        "{held} of {semaphores} semaphores held {permits}/{permits} {:.1}s after the first create; create→all held p50 {p50:.0} ms (of those held)",
        creating.elapsed().as_secs_f64()
    );

    // The single-lock run waits 10 s and publishes a burst of Events (a few seconds) before it measures: the
    // same pause here lets the acquisitions' status and pod writes settle.
    tokio::time::sleep(Duration::from_secs(15)).await;
    println!("measuring {}s of steady holding …", window.as_secs());
    let steady = steady_holding(&cluster.server, &operator, window).await?;
    let dropped = watch.dropped();
    let rss_held = rss_mib(pid)?;
    println!(
        "steady state: {:.3} cores (idle {:.4}; a ratio to it would mostly measure the clock tick), {:.0} extensions in all, permits held {:.0}, lost during the window {}, a semaphore seen below {permits}/{permits} {dropped} times; {:.1} pod and {:.1} lock writes per second",
        steady.cores,
        idle,
        steady.extensions,
        steady.held,
        steady.lost_in_window,
        steady.pod_writes_per_s,
        steady.lock_writes_per_s,
    );
    operator.stop().await?;
    println!(
        "memory: {rss_idle:.1} MiB idle, {rss_pods:.1} MiB with {} pods, {rss_held:.1} MiB with them and {semaphores} held semaphores",
        other_pods + leader_pods
    );
    let lost = steady.lost + dropped as u64;
    println!(
        "SUMMARY_SEMAPHORES semaphores={semaphores} semaphores_held={held} permits={permits} leader_pods={leader_pods} pods={other_pods} cpu_cores_idle={idle:.4} cpu_cores_avg={:.3} lost={lost} extend_lag_p99_ms={:.1} all_held_s={all_held_after:.1} create_to_held_p50_ms={p50:.0} extensions_per_s={:.0} pod_writes_per_s={:.1} lock_writes_per_s={:.1} rss_mib_idle={rss_idle:.1} rss_mib_pods={rss_pods:.1} rss_mib_held={rss_held:.1}",
        steady.cores,
        steady.lag_p99_ms,
        steady.extensions_per_s,
        steady.pod_writes_per_s,
        steady.lock_writes_per_s,
    );
    Ok(Compared {
        permits_held: leader_pods,
        steady,
        lost,
        all_held_s: all_held_after,
        create_to_held_p50_ms: p50,
        rss_mib_held: rss_held,
    })
}
