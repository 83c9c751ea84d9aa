//! Phase 3: failure drills while the tutorials' locks are held (the first lock, the leader, the drills' Job): the
//! active operator pod force-deleted; one, two, then three masters deleted (each comes back empty and sits out its
//! restart quarantine); `helm upgrade`. What must hold: a drill that leaves a majority of masters and a replica
//! loses no lock and changes no token; three masters down fence every holder before its validity, and everything
//! comes back afterwards with higher tokens.

use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use kube::{Api, ResourceExt};
use redlock_operator::api::RedisQuorum;

use super::cluster::{Cluster, FULLNAME, RELEASE, rolled_out};
use super::install::active_replica;
use super::observe::{Ev, Observer};
use super::report::{Report, wait_for};
use super::tutorials::{DRILL_JOB, Held, IDENTITY_LOCK, JOB_LOCK, LEADER_LOCK, wait_held};

pub async fn run(cluster: &Cluster, report: &Report, observer: &Observer, held: &Held) {
    if !(held.identity || held.leader || held.job) {
        report.check(
            "the drills have held locks to watch",
            false,
            "no tutorial lock is held",
        );
        return;
    }
    operator_failover(cluster, report, observer, held).await;
    masters_down(cluster, report, observer, held).await;
    helm_upgrade(cluster, report, observer, held).await;
    super::masters_restart::run(cluster, report, observer, held).await;
}

/// The holds the drills watch, as they are now.
fn holds(observer: &Observer, held: &Held) -> String {
    let state = observer.state();
    let token = |lock: &str| state.token(lock);
    let mut shown = Vec::new();
    if held.identity {
        shown.push(format!("{IDENTITY_LOCK} token {:?}", token(IDENTITY_LOCK)));
    }
    if held.leader {
        shown.push(format!("leader {:?}", state.leader()));
    }
    if held.job {
        shown.push(format!("{JOB_LOCK} ({DRILL_JOB}) token {:?}", token(JOB_LOCK)));
    }
    shown.join(", ")
}

/// Waits until every lock the drills watch is held again and the drills' Job runs.
async fn settled(
    cluster: &Cluster,
    observer: &Observer,
    held: &Held,
    patience: Duration,
) -> Result<String, String> {
    let locks = [
        (held.identity, IDENTITY_LOCK),
        (held.leader, LEADER_LOCK),
        (held.job, JOB_LOCK),
    ];
    for (watched, lock) in locks {
        if watched {
            wait_held(cluster, lock, patience).await?;
        }
    }
    if held.leader {
        wait_for("a leader pod", patience, || async { observer.state().leader() }).await?;
    }
    Ok(holds(observer, held))
}

/// Anything since `since` that a kept hold must not show: a leader label moved, a lock that changed phase,
/// holder or token, the drills' Job suspended or its pod stopped.
fn changes_since(observer: &Observer, held: &Held, since: Instant, origin: Instant) -> Vec<String> {
    let state = observer.state();
    state
        .since(since)
        .filter(|(_, ev)| match ev {
            Ev::Labelled { .. } | Ev::Unlabelled { .. } => held.leader,
            Ev::Lock { lock, .. } => {
                (held.identity && lock == IDENTITY_LOCK)
                    || (held.leader && lock == LEADER_LOCK)
                    || (held.job && lock == JOB_LOCK)
            }
            Ev::Suspended { job } | Ev::JobPodStopped { job, .. } => held.job && job == DRILL_JOB,
            Ev::Violation(..) => true,
            _ => false,
        })
        .map(|(at, ev)| {
            format!(
                "{:.1}s {ev:?}",
                at.saturating_duration_since(origin).as_secs_f64()
            )
        })
        .collect()
}

pub(super) fn check_kept(report: &Report, observer: &Observer, held: &Held, name: &str, since: Instant) {
    let changes = changes_since(observer, held, since, report.start());
    report.check(
        name,
        changes.is_empty(),
        if changes.is_empty() {
            holds(observer, held)
        } else {
            format!("changes: {changes:#?}")
        },
    );
}

/// The active replica's pod force-deleted: the standby takes the Lease over and keeps every lock.
async fn operator_failover(cluster: &Cluster, report: &Report, observer: &Observer, held: &Held) {
    report.step("3a. the active operator pod force-deleted");
    let before = settled(cluster, observer, held, Duration::from_secs(30)).await;
    report.note(&format!("before: {before:?}"));
    let Some(active) = active_replica(cluster).await else {
        report.check("a replica holds the Lease", false, "");
        return;
    };
    let since = Instant::now();
    let deleted = cluster
        .kubectl(&[
            "delete",
            "pod",
            &active,
            "-n",
            &cluster.release_ns,
            "--grace-period=0",
            "--force",
        ])
        .await;
    if !report.check(
        "the active replica's pod is force-deleted",
        deleted.ok,
        deleted.text(),
    ) {
        return;
    }
    let taken = wait_for(
        "the standby to take the Lease over",
        Duration::from_secs(30),
        || async { active_replica(cluster).await.filter(|holder| *holder != active) },
    )
    .await;
    report.check_result(
        "the standby takes the Lease over",
        taken.map(|holder| {
            format!(
                "{holder}, {:.1} s after the deletion",
                since.elapsed().as_secs_f64()
            )
        }),
    );
    // Longer than the leader lock's TTL (10 s): a lapse would show.
    tokio::time::sleep(Duration::from_secs(15).saturating_sub(since.elapsed())).await;
    check_kept(
        report,
        observer,
        held,
        "operator failover: no lock lost, no token changed",
        since,
    );
    let deployments: Api<Deployment> = Api::namespaced(cluster.client.clone(), &cluster.release_ns);
    let ready = wait_for(
        "the operator back to 2/2 Ready",
        Duration::from_secs(90),
        || async { (deployments.get(FULLNAME).await.ok()?.status?.ready_replicas? == 2).then_some(()) },
    )
    .await;
    report.check_result(
        "the operator is back to two Ready replicas",
        ready.map(|()| String::new()),
    );
}

fn master(i: usize) -> String {
    format!("{FULLNAME}-redis-{i}")
}

async fn delete_master(cluster: &Cluster, report: &Report, i: usize) -> bool {
    let deleted = cluster
        .kubectl(&[
            "delete",
            "pod",
            &master(i),
            "-n",
            &cluster.release_ns,
            "--wait=false",
        ])
        .await;
    report.note(&format!("master {} deleted", master(i)));
    report.check(&format!("master {i} is deleted"), deleted.ok, deleted.text())
}

/// The leader's token and the first lock's, as they are now.
fn leader_and_identity_tokens(observer: &Observer) -> (Option<i64>, Option<i64>) {
    let state = observer.state();
    (
        state.leader().and_then(|(_, token)| token),
        state.token(IDENTITY_LOCK),
    )
}

/// One, then two, then three masters deleted; back after their quarantine.
async fn masters_down(cluster: &Cluster, report: &Report, observer: &Observer, held: &Held) {
    report.step("3b. masters stopped: one, two, then three (each comes back empty, quarantined for maxTtl)");
    let before = settled(cluster, observer, held, Duration::from_secs(60)).await;
    report.note(&format!("before: {before:?}"));
    let (old_leader_token, old_identity_token) = leader_and_identity_tokens(observer);
    let since = Instant::now();
    if !delete_master(cluster, report, 0).await {
        return;
    }
    tokio::time::sleep(Duration::from_secs(6)).await;
    check_kept(
        report,
        observer,
        held,
        "one master down: every lock stays held, no token changes",
        since,
    );
    if !delete_master(cluster, report, 1).await {
        return;
    }
    // Longer than the leader lock's TTL: its extensions go on with three masters voting.
    tokio::time::sleep(Duration::from_secs(12)).await;
    check_kept(
        report,
        observer,
        held,
        "two masters down: every lock stays held, no token changes",
        since,
    );
    let three_down = Instant::now();
    if !delete_master(cluster, report, 2).await {
        return;
    }
    let fenced = wait_for("every holder fenced", Duration::from_secs(45), || async {
        let state = observer.state();
        let mut waiting = Vec::new();
        let seen = |wanted: &dyn Fn(&Ev) -> bool| state.since(three_down).any(|(_, ev)| wanted(ev));
        if held.leader && !seen(&|ev| matches!(ev, Ev::Unlabelled { .. })) {
            waiting.push("leader label");
        }
        if held.identity
            && !seen(
                &|ev| matches!(ev, Ev::Lock { lock, phase, .. } if lock == IDENTITY_LOCK && phase == "Lost"),
            )
        {
            waiting.push(IDENTITY_LOCK);
        }
        if held.job && !seen(&|ev| matches!(ev, Ev::Suspended { job } if job == DRILL_JOB)) {
            waiting.push(DRILL_JOB);
        }
        waiting.is_empty().then_some(())
    })
    .await;
    let late: Vec<String> = observer
        .state()
        .since(three_down)
        .filter_map(|(_, ev)| match ev {
            Ev::Violation(_, what) => Some(what.clone()),
            _ => None,
        })
        .collect();
    report.note(&format!(
        "timeline since the third master went:\n{}",
        observer.timeline(report.start(), three_down)
    ));
    report.check_result(
        "three masters down: the leader's label removed, the first lock Lost, the Job suspended, each before its validity",
        fenced.and_then(|()| if late.is_empty() { Ok(String::new()) } else { Err(format!("{late:?}")) }),
    );
    let recovered = settled(cluster, observer, held, Duration::from_secs(90)).await;
    let (new_leader_token, new_identity_token) = leader_and_identity_tokens(observer);
    let rose = (!held.leader || new_leader_token > old_leader_token)
        && (!held.identity || new_identity_token > old_identity_token);
    report.check_result(
        "after the masters' quarantine every lock is held again, with higher tokens",
        recovered.and_then(|holds| {
            if rose {
                Ok(format!(
                    "{holds}, {:.0} s after the third master went",
                    three_down.elapsed().as_secs_f64()
                ))
            } else {
                Err(format!(
                    "tokens: leader {old_leader_token:?} -> {new_leader_token:?}, {IDENTITY_LOCK} \
                     {old_identity_token:?} -> {new_identity_token:?}"
                ))
            }
        }),
    );
    let job_back = wait_for(
        "the drills' Job running again",
        Duration::from_secs(60),
        || async { observer.state().job_running_since(DRILL_JOB, three_down) },
    )
    .await;
    report.check_result(
        "the suspended Job runs again once its lock is back (resumed or requeued)",
        job_back.map(|token| format!("token {token:?}")),
    );
    let quorums: Api<RedisQuorum> = Api::all(cluster.client.clone());
    let all = wait_for("all five masters voting", Duration::from_secs(90), || async {
        (quorums.get("default").await.ok()?.status?.eligible? == 5).then_some(())
    })
    .await;
    report.check_result(
        "all five masters vote again",
        all.map(|()| {
            format!(
                "{:.0} s after the first master went",
                since.elapsed().as_secs_f64()
            )
        }),
    );
}

/// docs/how-to/upgrading.md#apply-the-crds-first: the release's CRDs file (beside the chart's .tgz the suite
/// installs; the repository's `crds/` for a chart folder) applied server-side over the CRDs Helm installed. First
/// without `--force-conflicts`, to see whether Helm's field manager conflicts (reported, not required: it does when
/// a field's value changed since the install), then as the page says, which must succeed.
async fn apply_crds_as_the_upgrade_page_says(cluster: &Cluster, report: &Report) {
    let chart = std::path::PathBuf::from(cluster.chart());
    let release_file = chart
        .to_str()
        .and_then(|path| path.strip_suffix(".tgz"))
        .map(|stem| std::path::PathBuf::from(format!("{stem}-crds.yaml")))
        .filter(|file| file.exists());
    let crds = release_file.unwrap_or_else(|| cluster.root.join("crds"));
    let crds = crds.display().to_string();
    let plain = cluster.kubectl(&["apply", "--server-side", "-f", &crds]).await;
    report.note(&format!(
        "kubectl apply --server-side -f {crds} (without --force-conflicts): {}",
        if plain.ok {
            "applied, no conflict".to_owned()
        } else {
            plain.text()
        }
    ));
    let forced = cluster
        .kubectl(&["apply", "--server-side", "--force-conflicts", "-f", &crds])
        .await;
    report.check(
        "the release's CRDs apply over Helm's as the upgrade page says (kubectl apply --server-side --force-conflicts)",
        forced.ok,
        forced.text(),
    );
}

/// `helm upgrade` to the next version of the chart (the same tree packaged as the next patch version, as a
/// release of it would be: every object's `helm.sh/chart` label changes) with a harmless value changed (the
/// operator's log format) and the holder binding narrowed to the tutorials' namespace (`holders.namespaces`, as
/// the security page suggests): the operator pods roll, the masters stay (not one restarted, all five voting
/// throughout), no lock is lost and no token changes; a labelled pod in the namespace left out is refused at
/// admission by the API server's authorizer, with the `helm upgrade` that lets it in. Then `helm rollback` to the
/// installed revision, the same checks.
async fn helm_upgrade(cluster: &Cluster, report: &Report, observer: &Observer, held: &Held) {
    report.step(
        "3c. helm upgrade to the next chart version (operator.logFormat=text, holders.namespaces narrowed to the \
         tutorials') while the locks are held, then helm rollback",
    );
    let Some(next_chart) = next_version_chart(cluster, report).await else {
        return;
    };
    let earlier = super::api_versions::create(cluster, report).await;
    let before = settled(cluster, observer, held, Duration::from_secs(60)).await;
    report.note(&format!("before: {before:?}"));
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), &cluster.release_ns);
    let masters = ListParams::default().labels("app.kubernetes.io/component=redis");
    let uids = |list: Vec<Pod>| {
        let mut uids: Vec<String> = list.iter().filter_map(|pod| pod.uid()).collect();
        uids.sort();
        uids
    };
    let masters_before = uids(
        pods.list(&masters)
            .await
            .map(|list| list.items)
            .unwrap_or_default(),
    );
    apply_crds_as_the_upgrade_page_says(cluster, report).await;
    let since = Instant::now();
    let narrowed = format!("holders.namespaces={{{}}}", cluster.app_ns);
    let watch = QuorumWatch::start(cluster);
    let upgraded = cluster
        .helm_release_of(
            "upgrade",
            &next_chart,
            &["--set", "operator.logFormat=text", "--set", &narrowed],
        )
        .await;
    if !report.check(
        "helm upgrade to the next chart version succeeds",
        upgraded.ok,
        upgraded.brief(),
    ) {
        return;
    }
    let rolled = rolled_out(
        cluster,
        &format!("deployment/{FULLNAME}"),
        &cluster.release_ns,
        180,
    )
    .await;
    report.check(
        "the operator Deployment rolls out the upgrade",
        rolled.ok,
        format!(
            "{:.0} s after helm upgrade began; {}",
            since.elapsed().as_secs_f64(),
            rolled.text()
        ),
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    check_kept(
        report,
        observer,
        held,
        "helm upgrade: no lock lost, no token changed",
        since,
    );
    let masters_after = uids(
        pods.list(&masters)
            .await
            .map(|list| list.items)
            .unwrap_or_default(),
    );
    report.check(
        "helm upgrade restarts no master",
        masters_before == masters_after && restarts(&pods, &masters).await == Some(0),
        format!(
            "{} masters before, {} after, same pods: {}, containers restarted: {:?}",
            masters_before.len(),
            masters_after.len(),
            masters_before == masters_after,
            restarts(&pods, &masters).await
        ),
    );
    if let Some(earlier) = &earlier {
        earlier.check(cluster, report, "after helm upgrade").await;
    }
    refused_where_holders_cannot_read(cluster, report).await;

    let since = Instant::now();
    let rolled_back = cluster
        .helm(
            &["rollback", RELEASE, "1", "-n", &cluster.release_ns, "--wait"],
            Duration::from_secs(180),
        )
        .await;
    report.check(
        "helm rollback to the installed revision succeeds",
        rolled_back.ok,
        rolled_back.brief(),
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    check_kept(
        report,
        observer,
        held,
        "helm rollback: no lock lost, no token changed",
        since,
    );
    if let Some(earlier) = &earlier {
        earlier.check(cluster, report, "after helm rollback").await;
    }
    let masters_back = uids(
        pods.list(&masters)
            .await
            .map(|list| list.items)
            .unwrap_or_default(),
    );
    let lowest = watch.stop().await;
    report.check(
        "helm rollback restarts no master, and all five vote throughout the upgrade and the rollback",
        masters_before == masters_back && restarts(&pods, &masters).await == Some(0) && lowest == Some(5),
        format!(
            "same pods: {}, containers restarted: {:?}, lowest eligible seen: {lowest:?} (of 5, 3 required)",
            masters_before == masters_back,
            restarts(&pods, &masters).await
        ),
    );
}

/// The container restarts of the masters' pods, summed.
pub(super) async fn restarts(pods: &Api<Pod>, masters: &ListParams) -> Option<i32> {
    let list = pods.list(masters).await.ok()?;
    Some(
        list.items
            .iter()
            .flat_map(|pod| {
                pod.status
                    .iter()
                    .flat_map(|status| status.container_statuses.iter().flatten())
            })
            .map(|container| container.restart_count)
            .sum(),
    )
}

/// The chart the suite installed, packaged as the next patch version (`helm package --version`): what an upgrade
/// to the next release changes in every object (its `helm.sh/chart` label), with the image the suite loaded.
async fn next_version_chart(cluster: &Cluster, report: &Report) -> Option<String> {
    let version = env!("CARGO_PKG_VERSION");
    let mut parts: Vec<u64> = version.split('.').filter_map(|part| part.parse().ok()).collect();
    if let Some(patch) = parts.last_mut() {
        *patch += 1;
    }
    let next = parts.iter().map(u64::to_string).collect::<Vec<_>>().join(".");
    let work = cluster.root.join("target/in-cluster-next-chart");
    let _ = std::fs::remove_dir_all(&work);
    let source = std::path::PathBuf::from(cluster.chart());
    let folder = if source.is_dir() {
        source
    } else {
        let unpacked = std::fs::create_dir_all(&work).is_ok()
            && std::process::Command::new("tar")
                .arg("-xzf")
                .arg(&source)
                .arg("-C")
                .arg(&work)
                .status()
                .is_ok_and(|status| status.success());
        if !unpacked {
            report.check("the installed chart unpacks", false, source.display().to_string());
            return None;
        }
        work.join("redlock-operator")
    };
    let destination = work.join("next");
    let packaged = cluster
        .helm(
            &[
                "package",
                &folder.display().to_string(),
                "--version",
                &next,
                "--destination",
                &destination.display().to_string(),
            ],
            Duration::from_secs(60),
        )
        .await;
    let chart = destination.join(format!("redlock-operator-{next}.tgz"));
    report
        .check(
            &format!("the chart packaged as the next version, {next}"),
            packaged.ok && chart.exists(),
            packaged.brief(),
        )
        .then(|| chart.display().to_string())
}

/// The lowest `eligible` the quorum `default` showed while it ran, read every half second.
pub(super) struct QuorumWatch {
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<Option<i32>>,
}

impl QuorumWatch {
    pub(super) fn start(cluster: &Cluster) -> Self {
        let quorums: Api<RedisQuorum> = Api::all(cluster.client.clone());
        let (stop, mut stopped) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(async move {
            let mut lowest: Option<i32> = None;
            while !*stopped.borrow() {
                if let Some(eligible) = quorums
                    .get("default")
                    .await
                    .ok()
                    .and_then(|quorum| quorum.status?.eligible)
                {
                    lowest = Some(lowest.map_or(eligible, |lowest| lowest.min(eligible)));
                }
                let _ = tokio::time::timeout(Duration::from_millis(500), stopped.changed()).await;
            }
            lowest
        });
        Self { stop, task }
    }

    pub(super) async fn stop(self) -> Option<i32> {
        let _ = self.stop.send(true);
        self.task.await.ok().flatten()
    }
}

/// After the narrowing, a pod labelled `redlock.io/elect` in the namespace left out cannot read its lock: refused,
/// naming the value that lets it in (the chart's holder-validation policy asks the API server's authorizer).
async fn refused_where_holders_cannot_read(cluster: &Cluster, report: &Report) {
    let pod = r#"apiVersion: v1
kind: Pod
metadata:
  name: cannot-read-its-lock
  labels:
    redlock.io/elect: web-leader
spec:
  containers:
    - name: app
      image: busybox:1.36
      command: ["sh", "-c", "sleep 3600"]
      securityContext:
        runAsUser: 65532
"#;
    let created = cluster
        .kubectl_stdin(&["create", "-n", &cluster.holders_ns, "-f", "-"], pod)
        .await;
    let said = created.text();
    let fix = format!(
        "--set holders.namespaces={{{},{}}}",
        cluster.app_ns, cluster.holders_ns
    );
    report.check(
        "a labelled pod whose ServiceAccount may not watch its locks is refused, naming the helm upgrade that fixes it",
        !created.ok && said.contains("may not watch the DistributedLocks of namespace") && said.contains(&fix),
        said,
    );
}
