//! Phase 4: uninstalling as docs/how-to/install.md#uninstall says (the chart's README points there): 1. delete
//! this installation's locks while the operator runs (by name: other installations share the cluster), then the
//! workloads that ran under them; 2. `helm uninstall`, which leaves what the page's table lists and nothing else;
//! 3. remove what is left (the page's commands; the CRDs stay, as other installations use them). Then the
//! namespaces are deleted, and must go completely within a bound.

use std::time::{Duration, Instant};

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::ListParams;
use kube::{Api, ResourceExt};
use redlock_operator::api::holder_contract::FENCED_ANNOTATION;

use super::cluster::{Cluster, FULLNAME, RELEASE};
use super::observe::{Ev, Observer};
use super::report::{Report, wait_for};
use super::tutorials::{DRILL_JOB, JOB_LOCK, LEADER_LOCK, SEMAPHORE_LOCK};

/// How long a namespace may take to go once deleted.
const NAMESPACE_GONE_WITHIN: Duration = Duration::from_secs(60);
/// The longest `ttl` among the tutorials' locks: "kubectl delete waits … usually no longer than the longest ttl".
const LONGEST_TTL: Duration = Duration::from_secs(30);

pub async fn run(cluster: &Cluster, report: &Report, observer: &Observer) {
    report
        .step("4. uninstall: 1. delete the locks while the operator runs (docs/how-to/install.md#uninstall)");
    delete_locks(cluster, report, observer).await;
    report.step("4. uninstall: 2. helm uninstall");
    let started = Instant::now();
    let uninstalled = cluster
        .helm(
            &["uninstall", RELEASE, "-n", &cluster.release_ns],
            Duration::from_secs(180),
        )
        .await;
    report.check(
        "helm uninstall succeeds",
        uninstalled.ok,
        format!(
            "{:.1} s: {}",
            started.elapsed().as_secs_f64(),
            uninstalled.brief()
        ),
    );
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), &cluster.release_ns);
    // A failed `helm test` leaves its Pod, as the page's table says.
    let test_pod = format!("{FULLNAME}-test-lock");
    let stopped = wait_for("the release's pods gone", Duration::from_secs(60), || async {
        let pods = pods.list(&ListParams::default()).await.ok()?.items;
        pods.iter().all(|pod| pod.name_any() == test_pod).then_some(())
    })
    .await;
    report.check_result(
        "the operator and the masters are gone",
        stopped.map(|()| String::new()),
    );
    left_behind(cluster, report).await;
    report.step("4. uninstall: 3. remove what is left, then the namespaces");
    remove_the_rest(cluster, report).await;
}

/// Step 1: `kubectl get dlock -A` with the installation column, this installation's locks deleted by name; each
/// holder fenced (the leader's label off, the running Job suspended and marked), the deletions done within the
/// longest TTL; then the workloads deleted.
async fn delete_locks(cluster: &Cluster, report: &Report, observer: &Observer) {
    let listed = cluster
        .kubectl(&[
            "get",
            "dlock",
            "-A",
            "-o",
            r"custom-columns=NAMESPACE:.metadata.namespace,NAME:.metadata.name,INSTALLATION:.metadata.annotations.redlock\.io/installation",
        ])
        .await;
    let ours = format!("{}/{FULLNAME}", cluster.release_ns);
    let mine: Vec<(String, String)> = listed
        .stdout
        .lines()
        .skip(1)
        .filter_map(|line| {
            let columns: Vec<&str> = line.split_whitespace().collect();
            (columns.len() == 3 && columns[2] == ours).then(|| (columns[0].to_owned(), columns[1].to_owned()))
        })
        .collect();
    report.note(&format!("this installation ({ours}) keeps {mine:?}"));
    let leader = observer.state().leader();
    let since = Instant::now();
    let mut deletions = Vec::new();
    for (namespace, name) in &mine {
        deletions.push(async move {
            let started = Instant::now();
            let deleted = cluster
                .kubectl(&["-n", namespace, "delete", "dlock", name, "--timeout=90s"])
                .await;
            (name.clone(), deleted, started.elapsed())
        });
    }
    let results = futures::future::join_all(deletions).await;
    let slowest = results.iter().map(|(_, _, took)| *took).max().unwrap_or_default();
    let failed: Vec<String> = results
        .iter()
        .filter(|(_, deleted, _)| !deleted.ok)
        .map(|(name, deleted, _)| format!("{name}: {}", deleted.text()))
        .collect();
    let took: Vec<String> = results
        .iter()
        .map(|(name, _, took)| format!("{name} {:.1} s", took.as_secs_f64()))
        .collect();
    report.check(
        &format!(
            "kubectl delete dlock returns for each of this installation's locks within the longest ttl ({} s)",
            LONGEST_TTL.as_secs()
        ),
        failed.is_empty() && !mine.is_empty() && slowest <= LONGEST_TTL,
        format!("{took:?}; failed: {failed:?}"),
    );
    let leader_took = results
        .iter()
        .find(|(name, ..)| name == LEADER_LOCK)
        .map(|(_, _, took)| *took)
        .unwrap_or_default();
    let said = match &leader {
        Some((pod, _)) => cluster
            .kubectl(&["logs", pod, "-n", &cluster.app_ns])
            .await
            .text(),
        None => "(no leader before the deletion)".to_owned(),
    };
    let wanted = format!(
        "reported the work under fencing token {} stopped",
        leader.as_ref().and_then(|(_, token)| *token).unwrap_or_default()
    );
    report.check(
        "deleting the leader's lock does not wait for the validity: its elect reports the work stopped",
        leader_took < Duration::from_secs(3) && said.contains(&wanted),
        format!(
            "kubectl delete took {:.1} s; wanted `{wanted}` in the leader's log:\n{}",
            leader_took.as_secs_f64(),
            said.trim_end()
        ),
    );
    if leader_took >= Duration::from_secs(3) {
        report.note(&format!(
            "the operator's report outcomes (redlock_stopped_reports_total):\n{}",
            stopped_reports(cluster).await
        ));
    }
    let (unlabelled, suspended) = {
        let state = observer.state();
        let unlabelled = state
            .since(since)
            .any(|(_, ev)| matches!(ev, Ev::Unlabelled { .. }));
        let suspended = state
            .since(since)
            .any(|(_, ev)| matches!(ev, Ev::Suspended { job } if job == DRILL_JOB));
        (unlabelled && state.leaders.is_empty(), suspended)
    };
    report.check(
        "deleting the leader's lock takes the leader label off first",
        unlabelled,
        format!("pods still labelled: {:?}", observer.state().leaders),
    );
    let jobs: Api<Job> = Api::namespaced(cluster.client.clone(), &cluster.app_ns);
    let marked = jobs
        .get(DRILL_JOB)
        .await
        .ok()
        .and_then(|job| job.annotations().get(FENCED_ANNOTATION).cloned());
    report.check(
        "deleting the Job lock suspends its running Job, marked redlock.io/fenced-token",
        suspended && marked.is_some(),
        format!("suspended {suspended}, {FENCED_ANNOTATION}: {marked:?}"),
    );
    let gone = cluster
        .kubectl(&["get", "dlock", "-n", &cluster.app_ns, "-o", "name"])
        .await;
    report.check(
        "none of this installation's locks is left",
        gone.ok && gone.stdout.trim().is_empty(),
        gone.text(),
    );
    // What the page says to do with the holders: scale down or delete the workloads, delete the Jobs.
    let ns = cluster.app_ns.as_str();
    let (jobs_of, semaphore_jobs) = (
        format!("redlock.io/lock={JOB_LOCK}"),
        format!("redlock.io/lock={SEMAPHORE_LOCK}"),
    );
    let removed = cluster
        .kubectl_each(&[
            vec!["-n", ns, "delete", "deployment", "web", "--wait=false"],
            vec!["-n", ns, "delete", "job", "-l", &jobs_of, "--wait=false"],
            vec!["-n", ns, "delete", "job", "-l", &semaphore_jobs, "--wait=false"],
        ])
        .await;
    report.check(
        "the workloads that ran under the locks are deleted",
        removed.ok,
        removed.text(),
    );
}

/// Step 2's table: the release's namespace keeps the two Secrets, the token-floor ConfigMaps and the Lease, and
/// nothing else of the chart; its cluster-scoped objects are gone.
async fn left_behind(cluster: &Cluster, report: &Report) {
    let listed = cluster
        .kubectl(&[
            "get",
            "all,configmaps,secrets,leases,serviceaccounts,roles,rolebindings,pods",
            "-n",
            &cluster.release_ns,
            "-o",
            "name",
        ])
        .await;
    let documented = |name: &&str| {
        [
            format!("secret/{FULLNAME}-installation"),
            format!("secret/{FULLNAME}-redis-auth"),
            format!("lease.coordination.k8s.io/{FULLNAME}"),
        ]
        .iter()
        .any(|kept| kept == name)
            || name.starts_with("configmap/redlock-token-floor-")
            || *name == format!("pod/{FULLNAME}-test-lock")
            // Every namespace has these (the second on OpenShift-derived clusters).
            || name.starts_with("configmap/kube-root-ca.crt")
            || name.starts_with("configmap/openshift-service-ca.crt")
            || *name == "serviceaccount/default"
    };
    let extra: Vec<&str> = listed.stdout.lines().filter(|name| !documented(name)).collect();
    report.note(&format!("left in the release's namespace:\n{}", listed.text()));
    report.check(
        "helm uninstall leaves in the release's namespace only what the Uninstall page's table lists",
        listed.ok && extra.is_empty(),
        format!("also left: {extra:?}"),
    );
    let cluster_wide = cluster
        .kubectl(&[
            "get",
            "redisquorums,clusterroles,clusterrolebindings,validatingadmissionpolicies,validatingadmissionpolicybindings,flowschemas,prioritylevelconfigurations",
            "-l",
            &format!("app.kubernetes.io/instance={RELEASE}"),
            "-o",
            "name",
        ])
        .await;
    report.check(
        "helm uninstall removes the chart's cluster-scoped objects",
        cluster_wide.ok && cluster_wide.stdout.trim().is_empty(),
        cluster_wide.text(),
    );
}

/// Step 3: the page's commands (the CRDs stay: other installations use them), then both namespaces deleted.
async fn remove_the_rest(cluster: &Cluster, report: &Report) {
    let ns = cluster.release_ns.as_str();
    let (test_pod, installation, redis_auth) = (
        format!("{FULLNAME}-test-lock"),
        format!("{FULLNAME}-installation"),
        format!("{FULLNAME}-redis-auth"),
    );
    let commands: [Vec<&str>; 4] = [
        vec![
            "-n",
            ns,
            "delete",
            "configmap",
            "-l",
            "app.kubernetes.io/managed-by=redlock-operator",
        ],
        vec!["-n", ns, "delete", "lease", FULLNAME, "--ignore-not-found"],
        vec!["-n", ns, "delete", "pod", &test_pod, "--ignore-not-found"],
        vec![
            "-n",
            ns,
            "delete",
            "secret",
            &installation,
            &redis_auth,
            "--ignore-not-found",
        ],
    ];
    let removed = cluster.kubectl_each(&commands).await;
    report.check(
        "the page's commands remove what helm uninstall left",
        removed.ok,
        removed.text(),
    );
    let deleted_at = Instant::now();
    for namespace in [&cluster.app_ns, &cluster.release_ns] {
        let _ = cluster
            .kubectl(&["delete", "namespace", namespace, "--wait=false"])
            .await;
    }
    let namespaces: Api<Namespace> = Api::all(cluster.client.clone());
    for namespace in [&cluster.release_ns, &cluster.app_ns] {
        let patience = NAMESPACE_GONE_WITHIN.saturating_sub(deleted_at.elapsed());
        let gone = wait_for(&format!("namespace {namespace} gone"), patience, || async {
            matches!(namespaces.get_opt(namespace).await, Ok(None)).then_some(())
        })
        .await;
        let detail = match &gone {
            Ok(()) => format!(
                "gone {:.0} s after its deletion",
                deleted_at.elapsed().as_secs_f64()
            ),
            Err(err) => {
                let conditions = cluster
                    .kubectl(&[
                        "get",
                        "namespace",
                        namespace,
                        "-o",
                        "jsonpath={.status.conditions}",
                    ])
                    .await;
                format!("{err}\nconditions: {}", conditions.text())
            }
        };
        report.check(
            &format!(
                "the namespace {} deletes completely within {} s",
                if namespace == &cluster.app_ns {
                    "of the tutorials"
                } else {
                    "of the release"
                },
                NAMESPACE_GONE_WITHIN.as_secs()
            ),
            gone.is_ok(),
            detail,
        );
    }
}

/// The active replica's `redlock_stopped_reports_total` samples, through the API server's pod proxy.
async fn stopped_reports(cluster: &Cluster) -> String {
    let Some(active) = super::install::active_replica(cluster).await else {
        return "(no active replica)".to_owned();
    };
    let path = format!(
        "/api/v1/namespaces/{}/pods/{active}:8080/proxy/metrics",
        cluster.release_ns
    );
    let metrics = cluster.kubectl(&["get", "--raw", &path]).await;
    if !metrics.ok {
        return metrics.text();
    }
    metrics
        .stdout
        .lines()
        .filter(|line| line.starts_with("redlock_stopped_reports_total"))
        .collect::<Vec<_>>()
        .join("\n")
}
