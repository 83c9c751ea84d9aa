//! The hand-over along a Job queue (issue 41): one Job lock and `jobs` Jobs queued on it at once (created
//! suspended, each working 0.3 s), run by the test API server's Job controller and kubelet
//! (`tests/support/job_controller.rs`). For each Job after the first: from its predecessor seen `Complete` to it
//! seen unsuspended, both through a watch like any client's. That chain stays inside the operator (the lock
//! gives its grant up and takes it again for the next Job), so it is what a queue of short Jobs pays per Job.
//! Ends with `SUMMARY_JOB_QUEUE jobs=N handovers=N p50_ms=X max_ms=X` (the maximum: too few hand-overs for a p99).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::TryStreamExt;
use k8s_openapi::api::batch::v1::Job;
use kube::Api;
use kube::api::PostParams;
use kube::runtime::watcher;
use redlock_operator::api::DistributedLock;
use tokio::time::Instant;

use super::support::job_controller::FakeJobRuntime;
use super::{BoxError, Cluster, Operator, patience};

const LOCK: &str = "queue";

/// When each Job was first seen complete, and first seen unsuspended.
#[derive(Default)]
struct Seen {
    complete: HashMap<String, Instant>,
    unsuspended: HashMap<String, Instant>,
}

pub async fn run(jobs: usize) -> Result<(), BoxError> {
    println!("hand-over along a Job queue: {jobs} Jobs of 0.3 s queued at once on one lock, ttl 10s");
    let cluster = Cluster::start().await?;
    cluster.install().await?;
    let operator = Operator::start(&cluster).await?;
    let _runtime = FakeJobRuntime::start(cluster.server.controller_client(), Some("default"));
    let job_api: Api<Job> = Api::default_namespaced(cluster.client.clone());
    let seen = Arc::new(Mutex::new(Seen::default()));
    let follower = tokio::spawn(follow(job_api.clone(), seen.clone()));
    let lock: DistributedLock = serde_json::from_value(serde_json::json!({
        "apiVersion": "redlock.io/v1beta1", "kind": "DistributedLock",
        "metadata": { "name": LOCK }, "spec": { "ttl": "10s", "holder": { "jobs": {} } }
    }))?;
    Api::<DistributedLock>::default_namespaced(cluster.client.clone())
        .create(&PostParams::default(), &lock)
        .await?;
    let names: Vec<String> = (0..jobs).map(|index| format!("job-{index:03}")).collect();
    for name in &names {
        job_api.create(&PostParams::default(), &job(name)?).await?;
    }
    let deadline = Instant::now() + patience();
    let mut last_report = Instant::now();
    loop {
        let complete = seen.lock().unwrap_or_else(|p| p.into_inner()).complete.len();
        if complete >= jobs {
            break;
        }
        if Instant::now() > deadline {
            return Err(format!("only {complete} of {jobs} Jobs completed").into());
        }
        if last_report.elapsed() > Duration::from_secs(10) {
            println!("  {complete} of {jobs} Jobs complete");
            last_report = Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    follower.abort();
    operator.stop().await?;
    let seen = seen.lock().unwrap_or_else(|p| p.into_inner());
    // The queue's order is the Jobs' creation order; the chain is each predecessor's completion to the next start.
    let mut by_start: Vec<(&String, Instant)> = names
        .iter()
        .filter_map(|name| Some((name, *seen.unsuspended.get(name)?)))
        .collect();
    by_start.sort_by_key(|(_, at)| *at);
    let mut samples: Vec<f64> = by_start
        .windows(2)
        .filter_map(|pair| {
            let done = seen.complete.get(pair[0].0)?;
            Some(pair[1].1.saturating_duration_since(*done).as_secs_f64() * 1000.0)
        })
        .collect();
    samples.sort_by(f64::total_cmp);
    let quantile = |q: f64| {
        let index = ((samples.len() as f64 - 1.0) * q).round() as usize;
        samples.get(index).copied().unwrap_or(0.0)
    };
    let (p50, max) = (quantile(0.5), quantile(1.0));
    println!(
        "  previous Job complete → next Job unsuspended: p50 {p50:.1} ms, max {max:.1} ms ({} hand-overs)",
        samples.len()
    );
    println!(
        "SUMMARY_JOB_QUEUE jobs={jobs} handovers={} p50_ms={p50:.1} max_ms={max:.1}",
        samples.len()
    );
    Ok(())
}

/// Records when each Job is first seen complete and first seen unsuspended.
async fn follow(api: Api<Job>, seen: Arc<Mutex<Seen>>) {
    let stream = watcher(api, watcher::Config::default());
    let mut stream = std::pin::pin!(stream);
    while let Ok(Some(event)) = stream.try_next().await {
        let job = match event {
            watcher::Event::Apply(job) | watcher::Event::InitApply(job) => job,
            _ => continue,
        };
        let now = Instant::now();
        let name = job.metadata.name.clone().unwrap_or_default();
        let mut seen = seen.lock().unwrap_or_else(|p| p.into_inner());
        if job.spec.as_ref().and_then(|spec| spec.suspend) == Some(false) {
            seen.unsuspended.entry(name.clone()).or_insert(now);
        }
        let complete = job
            .status
            .as_ref()
            .and_then(|status| status.conditions.as_ref())
            .is_some_and(|conditions| {
                conditions
                    .iter()
                    .any(|condition| condition.type_ == "Complete" && condition.status == "True")
            });
        if complete {
            seen.complete.entry(name).or_insert(now);
        }
    }
}

/// A Job of the queue: suspended, labelled for the lock, one pod working 0.3 s.
fn job(name: &str) -> Result<Job, BoxError> {
    Ok(serde_json::from_value(serde_json::json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": { "name": name, "labels": { "redlock.io/lock": LOCK } },
        "spec": {
            "suspend": true,
            "backoffLimit": 0,
            "template": { "spec": {
                "restartPolicy": "Never",
                "containers": [{ "name": "main", "image": "busybox", "command": ["sleep", "0.3"] }]
            } }
        }
    }))?)
}
