//! Phase 3d: a second release of the chart beside the first, as docs/how-to/two-installations.md says a team runs
//! one: its own namespace, its own quorum (`quorum.name`), its locks' namespace (`operator.lockNamespaces`), and
//! otherwise the chart's defaults. Its Job queue (examples/job-fencing-long-form.yaml on its quorum) runs its
//! Jobs while a Job of the first release's queue runs too: each release's admission policies let the other's
//! operator unsuspend the Jobs of the locks it keeps, and the first release, which looks at every namespace,
//! leaves the second's lock and quorum to it. Then the second release is uninstalled.

use std::time::{Duration, Instant};

use k8s_openapi::api::batch::v1::Job;
use kube::{Api, ResourceExt};
use redlock_operator::api::{DistributedLock, RedisQuorum};

use super::cluster::Cluster;
use super::holder_phases::{apply_in, installation, jobs_complete};
use super::install::wait_for_quorum;
use super::manifests::{Manifest, job_work};
use super::report::Report;
use super::tutorials::JOB_LOCK;

/// The second release's name (its objects are `team2-redlock-operator-…`) and its quorum's.
pub const RELEASE: &str = "team2";
const QUORUM: &str = "team2";

pub async fn run(cluster: &Cluster, report: &Report) {
    report.step("3d. a second release beside the first, with a Job queue of its own (docs/how-to/two-installations.md)");
    let release_ns = format!("{}-team2", cluster.release_ns);
    let apps = format!("{}-team2-apps", cluster.release_ns);
    let created = cluster.kubectl(&["create", "namespace", &apps]).await;
    if !report.check(
        "the second release's locks' namespace is created",
        created.ok,
        created.text(),
    ) {
        return;
    }
    let chart = cluster.chart();
    let lock_namespaces = format!("operator.lockNamespaces={{{apps}}}");
    let quorum_name = format!("quorum.name={QUORUM}");
    let mut args = vec![
        "install",
        RELEASE,
        chart.as_str(),
        "-n",
        release_ns.as_str(),
        "--create-namespace",
    ];
    let values = cluster.values();
    args.extend(values.iter().map(String::as_str));
    args.extend(["--set", lock_namespaces.as_str(), "--set", quorum_name.as_str()]);
    let started = Instant::now();
    let installed = cluster.helm(&args, Duration::from_secs(180)).await;
    if report.check(
        "helm install of a second release succeeds",
        installed.ok,
        installed.brief(),
    ) && wait_for_quorum(cluster, report, QUORUM, started).await
    {
        both_queues_run(cluster, report, &apps, &release_ns).await;
    }
    let uninstalled = cluster
        .helm(
            &["uninstall", RELEASE, "-n", &release_ns, "--wait"],
            Duration::from_secs(180),
        )
        .await;
    report.check(
        "helm uninstall of the second release succeeds",
        uninstalled.ok,
        uninstalled.brief(),
    );
    cluster.clear_lock_finalizers(&apps);
    for namespace in [&apps, &release_ns] {
        let _ = cluster
            .kubectl(&[
                "delete",
                "namespace",
                namespace,
                "--wait=false",
                "--ignore-not-found",
            ])
            .await;
    }
    let _ = cluster
        .kubectl(&[
            "delete",
            "redisquorum",
            QUORUM,
            "--ignore-not-found",
            "--wait=false",
        ])
        .await;
}

/// The holder and token `JOB_LOCK` in `namespace` shows, and whether that Job runs (not suspended).
async fn job_lock_grant(cluster: &Cluster, namespace: &str) -> Option<(String, i64, bool)> {
    let status = Api::<DistributedLock>::namespaced(cluster.client.clone(), namespace)
        .get(JOB_LOCK)
        .await
        .ok()?
        .status?;
    let holder = status.holder?;
    let job = Api::<Job>::namespaced(cluster.client.clone(), namespace)
        .get(&holder)
        .await
        .ok()?;
    let running = job.spec.and_then(|spec| spec.suspend) == Some(false);
    Some((holder, status.fencing_token?, running))
}

async fn both_queues_run(cluster: &Cluster, report: &Report, apps: &str, release_ns: &str) {
    let theirs = Manifest::example(&cluster.root, "job-fencing-long-form.yaml")
        .on_quorum(QUORUM)
        .with_work(&job_work(3))
        .with_operator_image(&cluster.operator_image.reference)
        .with_job_copies(&["migrate-orders-2"]);
    // The first release's queue is held by the drills' long Job: it must run on, under the same grant.
    let ours_before = job_lock_grant(cluster, &cluster.app_ns).await;
    let applied_at = Instant::now();
    let applied = apply_in(cluster, apps, &theirs).await;
    if !report.check(
        "the second release's Job queue is applied",
        applied.is_ok(),
        applied.err().unwrap_or_default(),
    ) {
        return;
    }
    let their_jobs: Api<Job> = Api::namespaced(cluster.client.clone(), apps);
    let theirs_done = jobs_complete(&their_jobs, &theirs.names_of("Job"), Duration::from_secs(150)).await;
    let shown = cluster.kubectl(&["get", "jobs,dlock", "-n", apps]).await;
    report.note(&shown.text());
    report.check_result(
        "the second release's Jobs complete, granted by its operator past both releases' Job admission policies",
        theirs_done.map(|()| format!("{:.0} s after apply", applied_at.elapsed().as_secs_f64())),
    );
    let ours_after = job_lock_grant(cluster, &cluster.app_ns).await;
    report.check(
        "the first release's Job runs on meanwhile, under the same grant",
        ours_before.as_ref().is_some_and(|(_, _, running)| *running) && ours_before == ours_after,
        format!("{JOB_LOCK} (holder, token, its Job running) before: {ours_before:?}, after: {ours_after:?}"),
    );
    let locks: Api<DistributedLock> = Api::namespaced(cluster.client.clone(), apps);
    let keeper = locks
        .get(JOB_LOCK)
        .await
        .ok()
        .and_then(|lock| lock.annotations().get("redlock.io/installation").cloned());
    let second = format!("{release_ns}/{RELEASE}-redlock-operator");
    report.check(
        "the second release keeps its lock (the first, looking at every namespace, left it unclaimed)",
        keeper.as_deref() == Some(second.as_str()),
        format!("redlock.io/installation: {keeper:?}, the second release is {second}"),
    );
    let ours_kept = Api::<DistributedLock>::namespaced(cluster.client.clone(), &cluster.app_ns)
        .get(JOB_LOCK)
        .await
        .ok()
        .and_then(|lock| lock.annotations().get("redlock.io/installation").cloned());
    report.check(
        "the first release still keeps its own Job lock",
        ours_kept == Some(installation(cluster)),
        format!("{ours_kept:?}"),
    );
    // Both quorums Available, each shown by the release that uses it: neither writes its verdict over the
    // other's (the first cannot read the second's Secrets).
    let quorums: Api<RedisQuorum> = Api::all(cluster.client.clone());
    for name in ["default", QUORUM] {
        let available = quorums.get(name).await.ok().and_then(|quorum| {
            quorum
                .status?
                .conditions
                .into_iter()
                .find(|condition| condition.type_ == "Available")
                .map(|condition| format!("{} {}", condition.status, condition.reason))
        });
        report.check(
            &format!("RedisQuorum {name} stays Available beside the other release"),
            available
                .as_deref()
                .is_some_and(|shown| shown.starts_with("True")),
            format!("{available:?}"),
        );
    }
}
