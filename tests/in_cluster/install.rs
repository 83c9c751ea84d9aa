//! Phase 1: the chart installed as README.md and docs/how-to/install.md say, waited for as they say (`kubectl get
//! rq default` until ELIGIBLE reaches REQUIRED), and `helm test`.

use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
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
    let quorum = wait_for_quorum(cluster, report, "default", started).await;
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

/// Waits for the RedisQuorum `name` to be Available with ELIGIBLE reaching REQUIRED, as the install page says.
pub async fn wait_for_quorum(cluster: &Cluster, report: &Report, name: &str, started: Instant) -> bool {
    let quorums: Api<RedisQuorum> = Api::all(cluster.client.clone());
    let available = wait_for(
        &format!("RedisQuorum {name} Available"),
        Duration::from_secs(180),
        || {
            let quorums = quorums.clone();
            async move {
                let quorum = quorums.get(name).await.ok()?;
                let status = quorum.status?;
                let available = status
                    .conditions
                    .iter()
                    .any(|condition| condition.type_ == "Available" && condition.status == "True");
                let (eligible, required) = (status.eligible?, status.required?);
                (available && eligible >= required).then(|| format!("{eligible}/{required} masters eligible"))
            }
        },
    )
    .await
    .map(|seen| {
        format!(
            "{seen}, {:.0} s after the install began",
            started.elapsed().as_secs_f64()
        )
    });
    report.check_result(
        &format!("the RedisQuorum {name} becomes Available (ELIGIBLE reaches REQUIRED)"),
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
