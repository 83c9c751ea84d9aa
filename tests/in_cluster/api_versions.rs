//! Phase 3c's API versions: a lock written as `redlock.io/v1alpha1` (the version before `v1beta1`, still served)
//! before the upgrade, reconciled and held, then read as both versions after the upgrade and after the rollback:
//! the same holder and token, `Held`, each read naming the version it was asked for
//! (docs/reference/api-versions.md).

use std::time::Duration;

use redlock_operator::api::holder_contract::INSTALLATION_ANNOTATION;
use serde_json::Value;

use super::cluster::Cluster;
use super::holder_phases::installation;
use super::report::{Report, wait_for};

const LOCK: &str = "written-as-v1alpha1";

/// The lock written as `v1alpha1`, once held: its token.
pub struct EarlierLock {
    token: i64,
}

/// Creates [`LOCK`] in the tutorials' namespace as `redlock.io/v1alpha1` (kubectl warns that it is deprecated) and
/// waits until it is held, read as that version.
pub async fn create(cluster: &Cluster, report: &Report) -> Option<EarlierLock> {
    let lock = serde_json::json!({
        "apiVersion": "redlock.io/v1alpha1",
        "kind": "DistributedLock",
        "metadata": {"name": LOCK, "annotations": {INSTALLATION_ANNOTATION: installation(cluster)}},
        "spec": {"ttl": "10s", "holder": {"identity": "v1alpha1-client"}},
    });
    let created = cluster
        .kubectl_stdin(&["apply", "-n", &cluster.app_ns, "-f", "-"], &lock.to_string())
        .await;
    if !report.check(
        "a lock written as redlock.io/v1alpha1 is accepted (kubectl warns it is deprecated)",
        created.ok,
        created.text(),
    ) {
        return None;
    }
    let held = wait_for("the v1alpha1 lock held", Duration::from_secs(60), || async {
        let (version, phase, token) = read(cluster, "v1alpha1").await?;
        (version == "redlock.io/v1alpha1" && phase == "Held").then_some(token?)
    })
    .await;
    let shown = held.clone().map(|token| format!("token {token}"));
    if !report.check_result("the lock written as v1alpha1 is reconciled and held", shown) {
        return None;
    }
    Some(EarlierLock { token: held.ok()? })
}

impl EarlierLock {
    /// Reads the lock as `v1alpha1` and as `v1beta1` (`when`: after what): held by its holder, its token unchanged.
    pub async fn check(&self, cluster: &Cluster, report: &Report, when: &str) {
        let alpha = read(cluster, "v1alpha1").await;
        let beta = read(cluster, "v1beta1").await;
        let token = Some(self.token);
        let held = |read: &Option<(String, String, Option<i64>)>, version: &str| {
            read.as_ref().is_some_and(|(api_version, phase, shown)| {
                *api_version == format!("redlock.io/{version}") && phase == "Held" && *shown == token
            })
        };
        report.check(
            &format!(
                "{when}: the lock written as v1alpha1 reads as v1alpha1 and v1beta1, held with its token"
            ),
            held(&alpha, "v1alpha1") && held(&beta, "v1beta1"),
            format!("token {}; as v1alpha1 {alpha:?}; as v1beta1 {beta:?}", self.token),
        );
    }
}

/// The lock read as `version` (`kubectl get distributedlocks.<version>.redlock.io`): its apiVersion, phase and
/// token.
async fn read(cluster: &Cluster, version: &str) -> Option<(String, String, Option<i64>)> {
    let resource = format!("distributedlocks.{version}.redlock.io");
    let got = cluster
        .kubectl(&["get", &resource, LOCK, "-n", &cluster.app_ns, "-o", "json"])
        .await;
    let lock: Value = serde_json::from_str(&got.stdout).ok()?;
    Some((
        lock["apiVersion"].as_str()?.to_owned(),
        lock["status"]["phase"].as_str().unwrap_or_default().to_owned(),
        lock["status"]["fencingToken"].as_i64(),
    ))
}
