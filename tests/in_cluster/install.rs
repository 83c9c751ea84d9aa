//! Phase 1: the chart installed as README.md and docs/how-to/install.md say, waited for as they say (`kubectl get
//! rq default` until ELIGIBLE reaches REQUIRED), and `helm test`.

use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::rbac::v1::ClusterRole;
use kube::Api;
use redlock_operator::api::RedisQuorum;

use super::cluster::{Cluster, FULLNAME, RELEASE};
use super::report::{Report, wait_for};

/// Installs, waits for the quorum and the operator, runs `helm test`. False when there is no usable installation
/// to go on with.
pub async fn install(cluster: &Cluster, report: &Report) -> bool {
    report.step("1. helm install, as the docs say");
    report.note(&format!(
        "chart {} (REDLOCK_E2E_CHART: the test command's is scripts/release.sh's .tgz), operator image {}",
        cluster.chart(),
        cluster.operator_image.reference
    ));
    let created = cluster.kubectl(&["create", "namespace", &cluster.app_ns]).await;
    if !report.check("the tutorials' namespace is created", created.ok, created.text()) {
        return false;
    }
    let started = Instant::now();
    let installed = cluster.helm_release("install", &["--create-namespace"]).await;
    report.note(&format!(
        "helm install took {:.1} s",
        started.elapsed().as_secs_f64()
    ));
    if !report.check("helm install succeeds", installed.ok, installed.brief()) {
        return false;
    }
    share_the_cluster(cluster, report, true).await;

    let quorum = wait_for_quorum(cluster, report, started).await;
    let operator = wait_for_operator(cluster, started).await;
    report.check_result(
        "the operator's two replicas are Ready and one holds the Lease",
        operator,
    );
    let shown = cluster.kubectl(&["get", "rq", "default"]).await;
    report.note(&format!("kubectl get rq default:\n{}", shown.text()));
    if !quorum {
        return false;
    }
    helm_test(cluster, report).await;
    true
}

/// Two of the chart's cluster-wide objects reach beyond `operator.lockNamespaces`, and other tests run their own
/// operators on the shared cluster meanwhile (both reported as defects of the chart):
/// - the ValidatingAdmissionPolicy binding applies to every namespace: no other installation can unsuspend a Job
///   labelled `redlock.io/lock` (only this release's ServiceAccount may); narrowed to the suite's namespace;
/// - the operator reconciles every RedisQuorum of the cluster and writes its status and Events (other tests'
///   quorums on their machine's loopback show `Down` from a pod, and flap against their own operators' writes);
///   the ClusterRole's `redisquorums/status` rule is narrowed to the quorum `default` while the suite runs
///   ([`share_the_cluster`] with `false` gives the rule back as the chart has it, before `helm upgrade`).
///
/// These are the suite's only deviations from the chart as installed.
pub async fn share_the_cluster(cluster: &Cluster, report: &Report, narrow: bool) {
    if narrow {
        let binding = format!("{FULLNAME}-suspended-jobs");
        let patch = serde_json::json!({
            "spec": { "matchResources": { "namespaceSelector": { "matchExpressions": [
                { "key": "kubernetes.io/metadata.name", "operator": "In", "values": [cluster.app_ns] }
            ] } } }
        })
        .to_string();
        let patched = cluster
            .kubectl(&[
                "patch",
                "validatingadmissionpolicybinding",
                &binding,
                "--type=merge",
                "-p",
                &patch,
            ])
            .await;
        report.note(&format!(
            "the Job admission policy binding {binding} narrowed to {} (it applies cluster-wide): {}",
            cluster.app_ns,
            if patched.ok {
                "done".to_owned()
            } else {
                patched.text()
            }
        ));
    }
    let roles: Api<ClusterRole> = Api::all(cluster.client.clone());
    let rules = roles
        .get(FULLNAME)
        .await
        .ok()
        .and_then(|role| role.rules)
        .unwrap_or_default();
    let Some(at) = rules
        .iter()
        .position(|rule| rule.resources.as_deref() == Some(&["redisquorums/status".to_owned()][..]))
    else {
        report.note("the ClusterRole has no rule for redisquorums/status to narrow");
        return;
    };
    let narrowed = rules[at].resource_names.is_some();
    let patch = match (narrow, narrowed) {
        (true, false) => {
            serde_json::json!([{ "op": "add", "path": format!("/rules/{at}/resourceNames"), "value": ["default"] }])
        }
        (false, true) => {
            serde_json::json!([{ "op": "remove", "path": format!("/rules/{at}/resourceNames") }])
        }
        _ => return,
    };
    let patched = cluster
        .kubectl(&[
            "patch",
            "clusterrole",
            FULLNAME,
            "--type=json",
            "-p",
            &patch.to_string(),
        ])
        .await;
    report.note(&format!(
        "the ClusterRole's redisquorums/status rule {}: {}",
        if narrow {
            "narrowed to the quorum default (the operator writes every quorum's status)"
        } else {
            "given back as the chart has it"
        },
        if patched.ok {
            "done".to_owned()
        } else {
            patched.text()
        }
    ));
}

async fn wait_for_quorum(cluster: &Cluster, report: &Report, started: Instant) -> bool {
    let quorums: Api<RedisQuorum> = Api::all(cluster.client.clone());
    let available = wait_for("RedisQuorum default Available", Duration::from_secs(180), || {
        let quorums = quorums.clone();
        async move {
            let quorum = quorums.get("default").await.ok()?;
            let status = quorum.status?;
            let available = status
                .conditions
                .iter()
                .any(|condition| condition.type_ == "Available" && condition.status == "True");
            let (eligible, required) = (status.eligible?, status.required?);
            (available && eligible >= required).then(|| format!("{eligible}/{required} masters eligible"))
        }
    })
    .await
    .map(|seen| {
        format!(
            "{seen}, {:.0} s after helm install",
            started.elapsed().as_secs_f64()
        )
    });
    report.check_result(
        "the RedisQuorum default becomes Available (ELIGIBLE reaches REQUIRED)",
        available,
    )
}

async fn wait_for_operator(cluster: &Cluster, started: Instant) -> Result<String, String> {
    let deployments: Api<Deployment> = Api::namespaced(cluster.client.clone(), &cluster.release_ns);
    wait_for(
        "the operator Deployment 2/2 Ready",
        Duration::from_secs(120),
        || {
            let deployments = deployments.clone();
            async move {
                let deployment = deployments.get(FULLNAME).await.ok()?;
                let ready = deployment.status?.ready_replicas?;
                (ready == 2).then_some(())
            }
        },
    )
    .await?;
    let active = active_replica(cluster)
        .await
        .ok_or("no replica holds the operator's Lease")?;
    Ok(format!(
        "active replica {active}, {:.0} s after helm install",
        started.elapsed().as_secs_f64()
    ))
}

/// The replica holding the operator's Lease.
pub async fn active_replica(cluster: &Cluster) -> Option<String> {
    let leases: Api<Lease> = Api::namespaced(cluster.client.clone(), &cluster.release_ns);
    wait_for("a replica holding the Lease", Duration::from_secs(30), || {
        let leases = leases.clone();
        async move { leases.get(FULLNAME).await.ok()?.spec?.holder_identity }
    })
    .await
    .ok()
}

/// `helm test RELEASE -n NS --logs`, as the chart's README says, and its output against the format it shows:
/// `acquire: N/5 votes (quorum 3)`, a line per master, the fencing token, the version.
async fn helm_test(cluster: &Cluster, report: &Report) {
    report.step("1b. helm test");
    let tested = cluster
        .helm(
            &["test", RELEASE, "-n", &cluster.release_ns, "--logs"],
            Duration::from_secs(180),
        )
        .await;
    let text = tested.text();
    report.note(&format!("helm test --logs printed:\n{text}"));
    report.check(
        "helm test passes",
        tested.ok,
        if tested.ok { String::new() } else { text.clone() },
    );
    if !tested.ok {
        let logs = cluster
            .kubectl(&[
                "logs",
                "-n",
                &cluster.release_ns,
                &format!("{FULLNAME}-test-lock"),
            ])
            .await;
        report.note(&format!(
            "the test Pod's log (kept when it fails):\n{}",
            logs.text()
        ));
        return;
    }
    // The acquisition's lines: `acquire: N/5 votes (quorum 3) in …`, then one line per master.
    let acquire: Vec<&str> = text
        .lines()
        .skip_while(|line| !line.starts_with("redlock-operator lock: acquire: "))
        .take(6)
        .collect();
    let version = format!("redlock-operator {}", env!("CARGO_PKG_VERSION"));
    let shape = acquire.len() == 6
        && acquire[0].contains(" votes (quorum 3) in ")
        && acquire.iter().skip(1).all(|line| line.starts_with("  redis://"))
        && text.contains("redlock-operator lock: fencing token ")
        && text.contains(&version);
    report.check(
        "helm test prints the acquisition (votes, a line per master), the token and the version",
        shape,
        acquire.join("\n"),
    );
    // The chart README's sample, read from it: its first per-master line up to the master's ordinal
    // (`  redis://***@redlock-redlock-operator-redis-`), the release being `redlock` there as here.
    let readme = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/charts/redlock-operator/README.md"
    ))
    .unwrap_or_default();
    let sample = readme
        .lines()
        .find(|line| line.starts_with("  redis://") && line.contains("-redis-0."))
        .unwrap_or_default()
        .to_owned();
    let prefix = sample.split("-redis-0.").next().unwrap_or_default().to_owned() + "-redis-";
    let sample_like = !sample.is_empty() && acquire.iter().skip(1).all(|line| line.starts_with(&prefix));
    report.check(
        "helm test's per-master lines look as the chart's README shows them",
        acquire.len() == 6 && sample_like,
        format!(
            "README: `{sample}`; printed: `{}`",
            acquire.get(1).copied().unwrap_or_default()
        ),
    );
    let unconnected: Vec<&&str> = acquire
        .iter()
        .skip(1)
        .filter(|line| line.contains("connecting") || line.ends_with(": pending"))
        .collect();
    if !unconnected.is_empty() {
        report.note(&format!(
            "helm test ran while masters were still connecting (the quorum was Available): {unconnected:?}"
        ));
    }
}
