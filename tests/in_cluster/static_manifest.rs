//! Phase 5: the release's static manifest (`redlock-operator-<version>.yaml`, beside the chart's `.tgz` that
//! scripts/release.sh wrote) installed without Helm, as its header says: the commands there run as written (the
//! namespace, the two Secrets of this installation's own, `kubectl apply --server-side`), then the operator Ready,
//! the quorum Available and examples/identity-lock.yaml held; then the lock deleted and `kubectl delete -f` of the
//! manifest, as docs/how-to/install.md#without-helm says. After the uninstall phase: the manifest is the chart's
//! default installation (quorum `default`, namespace `redlock-system`), which no other release may share.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use kube::Api;
use redlock_operator::api::{DistributedLock, LockPhase};

use super::cluster::{Cluster, rolled_out};
use super::holder_phases::apply_in;
use super::install::wait_for_quorum;
use super::manifests::Manifest;
use super::report::{Report, wait_for};

/// The namespace and the Deployment the manifest installs (the chart's defaults, release `redlock`).
const NAMESPACE: &str = "redlock-system";
const DEPLOYMENT: &str = "deployment/redlock-redlock-operator";

/// The static manifest beside the chart the suite installed, if that is a release's `.tgz`.
fn manifest_of(chart: &str) -> Option<PathBuf> {
    let stem = chart.strip_suffix(".tgz")?;
    Some(PathBuf::from(format!("{stem}.yaml"))).filter(|path| path.exists())
}

/// The commands of the manifest's header, from `kubectl create namespace` to `kubectl apply`, as a script.
pub fn header_commands(manifest: &str) -> Option<String> {
    let lines: Vec<&str> = manifest
        .lines()
        .take_while(|line| line.starts_with('#'))
        .filter_map(|line| line.strip_prefix("#   "))
        .collect();
    let first = lines
        .iter()
        .position(|line| line.starts_with("kubectl create namespace"))?;
    let last = lines.iter().position(|line| line.starts_with("kubectl apply"))?;
    (first < last).then(|| lines[first..=last].join("\n"))
}

pub async fn run(cluster: &Cluster, report: &Report) {
    report.step("5. the release's static manifest applied as its header says (no Helm)");
    let Some(path) = manifest_of(&cluster.chart()) else {
        report.note("skipped: the chart installed is no release .tgz with its static manifest beside it");
        return;
    };
    let taken = cluster.kubectl(&["get", "namespace", NAMESPACE]).await;
    if taken.ok {
        report.note(&format!(
            "skipped: namespace {NAMESPACE} exists on this cluster already"
        ));
        return;
    }
    let text = std::fs::read_to_string(&path).unwrap_or_default();
    let Some(script) = header_commands(&text) else {
        report.check(
            "the static manifest's header gives the commands",
            false,
            path.display().to_string(),
        );
        return;
    };
    let dir = path.parent().unwrap_or(Path::new("."));
    let started = Instant::now();
    let applied = cluster.shell_in(dir, &script).await;
    if report.check(
        &format!(
            "the header's commands run as written ({} lines), kubectl apply --server-side included",
            script.lines().count()
        ),
        applied.ok,
        applied.text().lines().last().unwrap_or_default().to_owned(),
    ) {
        works(cluster, report, started).await;
    }
    remove(cluster, report, &path).await;
}

/// The installation works: its operator Ready, its quorum Available, the README's first lock held.
async fn works(cluster: &Cluster, report: &Report, started: Instant) {
    let rolled = rolled_out(cluster, DEPLOYMENT, NAMESPACE, 180).await;
    report.check(
        "the manifest's operator Deployment is Ready",
        rolled.ok,
        rolled.text(),
    );
    if !wait_for_quorum(cluster, report, "default", started).await {
        return;
    }
    let apps = format!("{}-static", cluster.release_ns);
    let created = cluster.kubectl(&["create", "namespace", &apps]).await;
    let manifest = Manifest::example(&cluster.root, "identity-lock.yaml");
    let applied = if created.ok {
        apply_in(cluster, &apps, &manifest).await
    } else {
        Err(created.text())
    };
    if !report.check(
        "examples/identity-lock.yaml is applied as written",
        applied.is_ok(),
        applied.err().unwrap_or_default(),
    ) {
        return;
    }
    let locks: Api<DistributedLock> = Api::namespaced(cluster.client.clone(), &apps);
    let held = wait_for("nightly-report held", Duration::from_secs(60), || async {
        let status = locks.get("nightly-report").await.ok()?.status?;
        (status.phase == Some(LockPhase::Held)).then_some(status.fencing_token?)
    })
    .await;
    report.check_result(
        "the manifest's operator holds the lock (a working installation without Helm)",
        held.map(|token| {
            format!(
                "token {token}, {:.0} s after the apply began",
                started.elapsed().as_secs_f64()
            )
        }),
    );
    let deleted = cluster
        .kubectl(&[
            "delete",
            "dlock",
            "--all",
            "-n",
            &apps,
            "--wait=true",
            "--timeout=60s",
        ])
        .await;
    report.check(
        "its lock is deleted while the operator runs",
        deleted.ok,
        deleted.text(),
    );
    let _ = cluster
        .kubectl(&["delete", "namespace", &apps, "--wait=false"])
        .await;
}

/// `kubectl delete -f` of the manifest (everything it made, the CRDs too), and the namespace with the Secrets.
async fn remove(cluster: &Cluster, report: &Report, manifest: &Path) {
    let manifest = manifest.display().to_string();
    let deleted = cluster
        .kubectl(&["delete", "-f", &manifest, "--ignore-not-found", "--wait=false"])
        .await;
    report.check(
        "kubectl delete -f of the static manifest removes it",
        deleted.ok,
        deleted.text(),
    );
    let _ = cluster
        .kubectl(&[
            "delete",
            "namespace",
            NAMESPACE,
            "--ignore-not-found",
            "--wait=false",
        ])
        .await;
}

#[cfg(test)]
mod tests {
    use super::header_commands;

    #[test]
    fn the_header_commands_run_from_the_namespace_to_the_apply() {
        let manifest = "# intro\n#\n#   kubectl create namespace ns\n#   kubectl -n ns create secret generic a \\\n#     --from-literal=k=v\n#   kubectl apply --server-side -f m.yaml\n#\n# Keep it.\n---\nkind: Namespace\n";
        assert_eq!(
            header_commands(manifest).as_deref(),
            Some(
                "kubectl create namespace ns\nkubectl -n ns create secret generic a \\\n  --from-literal=k=v\nkubectl apply --server-side -f m.yaml"
            )
        );
        assert_eq!(header_commands("---\nkind: Namespace\n"), None);
    }
}
