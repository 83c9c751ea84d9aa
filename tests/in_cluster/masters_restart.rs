//! Phase 3c': a change the masters must restart for (their image: the same redis-server under another name, the
//! kit's `localhost/redlock-redis:e2e` for the chart's default `redis:7.4`), by `helm upgrade` while the locks are
//! held, then `helm rollback` once that roll has ended (as the upgrade page says: a change made mid-roll takes a
//! second master while the first is still quarantined, which this drill found). Each time every master is replaced
//! once, one at a time (a master is Ready only once its restart quarantine is over, and the StatefulSet rolls on
//! only then): the quorum never has fewer than four of five eligible (three required), no lock is lost and no token
//! changes.
//!
//! Each roll takes five quarantines (about three minutes at the suite's 30 s `maxTtl`), both about six: more than
//! the test command's time allows, so the phase runs only with `REDLOCK_E2E_MASTERS_RESTART=1`.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use kube::{Api, ResourceExt};

use super::cluster::{Cluster, FULLNAME, RELEASE, rolled_out};
use super::drills::{QuorumWatch, check_kept, restarts};
use super::observe::Observer;
use super::report::Report;
use super::tutorials::Held;

/// The masters' other image name: the kit's own tag of the same image.
const OTHER_REPOSITORY: &str = "localhost/redlock-redis";
const OTHER_TAG: &str = "e2e";
/// How long one roll of five masters may take.
const ROLL_PATIENCE_SECONDS: u64 = 600;

pub async fn run(cluster: &Cluster, report: &Report, observer: &Observer, held: &Held) {
    report
        .step("3c'. the masters' image changed by helm upgrade while the locks are held, then helm rollback");
    if std::env::var("REDLOCK_E2E_MASTERS_RESTART").ok().as_deref() != Some("1") {
        report.note(
            "skipped: REDLOCK_E2E_MASTERS_RESTART=1 runs it (two rolls of five quarantines, about 6 minutes)",
        );
        return;
    }
    if cluster.redis_image.is_some() {
        report.note("skipped: REDLOCK_E2E_REDIS_IMAGE names the masters' image; the drill changes the chart's default");
        return;
    }
    let revision = current_revision(cluster).await;
    let repository = format!("redis.image.repository={OTHER_REPOSITORY}");
    let tag = format!("redis.image.tag={OTHER_TAG}");
    let chart = cluster.chart();
    let upgrade = ["--set", repository.as_str(), "--set", tag.as_str()];
    let change = cluster.helm_release_of("upgrade", &chart, &upgrade);
    roll(
        cluster,
        report,
        (observer, held),
        "helm upgrade (the masters' image)",
        change,
    )
    .await;
    let Some(revision) = revision else {
        report.check(
            "the release's revision before the upgrade is known",
            false,
            "helm history",
        );
        return;
    };
    let revision = revision.to_string();
    let rollback = [
        "rollback",
        RELEASE,
        revision.as_str(),
        "-n",
        cluster.release_ns.as_str(),
    ];
    let change = cluster.helm(&rollback, Duration::from_secs(180));
    roll(
        cluster,
        report,
        (observer, held),
        "helm rollback (the masters' image back)",
        change,
    )
    .await;
}

/// Runs `change`, waits until the masters' StatefulSet has rolled, and checks the roll: every master replaced
/// once, the quorum never below four eligible, no lock lost, no token changed.
async fn roll(
    cluster: &Cluster,
    report: &Report,
    (observer, held): (&Observer, &Held),
    what: &str,
    change: impl std::future::Future<Output = super::cluster::Output>,
) {
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), &cluster.release_ns);
    let masters = ListParams::default().labels("app.kubernetes.io/component=redis");
    let before = uids(&pods, &masters).await;
    let watch = QuorumWatch::start(cluster);
    let since = Instant::now();
    let changed = change.await;
    if !report.check(&format!("{what} succeeds"), changed.ok, changed.brief()) {
        watch.stop().await;
        return;
    }
    let rolled = rolled_out(
        cluster,
        &format!("statefulset/{FULLNAME}-redis"),
        &cluster.release_ns,
        ROLL_PATIENCE_SECONDS,
    )
    .await;
    let took = since.elapsed();
    let lowest = watch.stop().await;
    let after = uids(&pods, &masters).await;
    let replaced = after.iter().filter(|uid| !before.contains(uid)).count();
    report.check(
        &format!("{what}: every master restarted once, one at a time (never fewer than 4 of 5 eligible, 3 required)"),
        rolled.ok && replaced == before.len() && before.len() == 5 && lowest.is_some_and(|lowest| lowest >= 4),
        format!(
            "{replaced} of {} masters replaced in {:.0} s, container restarts {:?}, lowest eligible seen {lowest:?}; {}",
            before.len(),
            took.as_secs_f64(),
            restarts(&pods, &masters).await,
            rolled.text()
        ),
    );
    check_kept(
        report,
        observer,
        held,
        &format!("{what}: no lock lost, no token changed"),
        since,
    );
}

async fn uids(pods: &Api<Pod>, masters: &ListParams) -> Vec<String> {
    let list = pods
        .list(masters)
        .await
        .map(|list| list.items)
        .unwrap_or_default();
    list.iter().filter_map(|pod| pod.uid()).collect()
}

/// The release's current revision (`helm history`, the last line's first column).
async fn current_revision(cluster: &Cluster) -> Option<u32> {
    let history = cluster
        .helm(
            &["history", RELEASE, "-n", &cluster.release_ns, "--max", "1"],
            Duration::from_secs(30),
        )
        .await;
    history
        .stdout
        .lines()
        .last()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}
