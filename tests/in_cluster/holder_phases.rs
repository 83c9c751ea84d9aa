//! What the two phases that run holders, the tutorials' and the injected holders', both do: apply an example in
//! their namespace, wait for Jobs to complete, follow a pod's log while it goes, and delete the leader pod to check
//! the hand-over and what its `elect` said.

use std::process::Stdio;
use std::time::{Duration, Instant};

use k8s_openapi::api::batch::v1::Job;
use kube::{Api, ResourceExt};

use super::cluster::{Cluster, FULLNAME};
use super::manifests::Manifest;
use super::observe::{Ev, Observer};
use super::report::{Report, wait_for};

/// This installation's name, as it records it on the locks it keeps.
pub fn installation(cluster: &Cluster) -> String {
    format!("{}/{FULLNAME}", cluster.release_ns)
}

/// `kubectl apply -n <ns> -f -` of `manifest`; what kubectl said, or why it failed.
pub async fn apply_in(cluster: &Cluster, ns: &str, manifest: &Manifest) -> Result<String, String> {
    let applied = cluster
        .kubectl_stdin(&["apply", "-n", ns, "-f", "-"], &manifest.yaml())
        .await;
    if applied.ok {
        Ok(applied.stdout)
    } else {
        Err(applied.text())
    }
}

/// Waits up to `patience` until every Job of `names` has succeeded.
pub async fn jobs_complete(
    jobs: &Api<Job>,
    names: &[impl AsRef<str>],
    patience: Duration,
) -> Result<(), String> {
    wait_for("every Job Complete", patience, || async {
        let list = jobs.list(&Default::default()).await.ok()?;
        let complete = |job: &Job| job.status.as_ref().and_then(|s| s.succeeded).unwrap_or(0) >= 1;
        names
            .iter()
            .all(|name| {
                list.items
                    .iter()
                    .any(|job| job.name_any() == name.as_ref() && complete(job))
            })
            .then_some(())
    })
    .await
}

/// `kubectl logs -f` of a pod, followed from when it was started: the pod may be gone by the time its log is read.
pub struct FollowedLog(std::io::Result<tokio::process::Child>);

impl FollowedLog {
    /// Starts following `pod` in `ns`, and gives kubectl half a second to attach before anything happens to it.
    pub async fn start(cluster: &Cluster, pod: &str, ns: &str) -> Self {
        let child = tokio::process::Command::new(cluster.kubectl_path())
            .args(["logs", "-f", pod, "-n", ns])
            .env("KUBECONFIG", &cluster.kubeconfig)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn();
        tokio::time::sleep(Duration::from_millis(500)).await;
        Self(child)
    }

    /// What the pod wrote, once its log ends within `patience`; otherwise why there is nothing to read.
    pub async fn said(self, patience: Duration) -> String {
        match self.0 {
            Ok(child) => match tokio::time::timeout(patience, child.wait_with_output()).await {
                Ok(Ok(output)) => {
                    String::from_utf8_lossy(&output.stdout).into_owned()
                        + &String::from_utf8_lossy(&output.stderr)
                }
                _ => "(kubectl logs -f did not end)".to_owned(),
            },
            Err(err) => format!("(kubectl logs did not start: {err})"),
        }
    }
}

/// Deletes the leader pod the observer sees in `ns`, and checks that the next pod leads within a second and that
/// the old leader's `elect` logged its report of the work stopped as taken. `holders` names the kind of leader in
/// the checks (`injected`, `cooperating`). Returns whether a leader pod was deleted (none may lead).
pub async fn check_hand_over(
    cluster: &Cluster,
    report: &Report,
    observer: &Observer,
    ns: &str,
    holders: &str,
) -> bool {
    let Some((old, old_token)) = observer.state().leader() else {
        return false;
    };
    // The validity shown to the old leader: a hand-over that waits for nothing but the report comes well before.
    let shown = observer
        .state()
        .leaders
        .get(&old)
        .and_then(|(_, valid_until)| *valid_until);
    let log = FollowedLog::start(cluster, &old, ns).await;
    let deleted_at = Instant::now();
    let deleted_wall = k8s_openapi::jiff::Timestamp::now();
    let deleted = cluster
        .kubectl(&["delete", "pod", &old, "-n", ns, "--wait=false"])
        .await;
    if !report.check(
        &format!("the {holders} leader pod is deleted"),
        deleted.ok,
        deleted.text(),
    ) {
        return false;
    }
    let next = wait_for("the next leader", Duration::from_secs(40), || async {
        observer.state().since(deleted_at).find_map(|(at, ev)| match ev {
            Ev::Labelled { pod, token } if *pod != old => Some((*at, pod.clone(), *token)),
            _ => None,
        })
    })
    .await;
    match next {
        Ok((at, pod, token)) => {
            let took = at.duration_since(deleted_at);
            let labelled_wall = deleted_wall
                .checked_add(k8s_openapi::jiff::SignedDuration::try_from(took).unwrap_or_default())
                .unwrap_or(deleted_wall);
            // On the report, not at the end of the validity shown (most of a TTL): what holds under any timing,
            // the milliseconds it took said beside it.
            report.check(
                &format!(
                    "the {holders} leader's hand-over (leader pod deleted) comes on its report, before the validity shown to it ends"
                ),
                shown.is_some_and(|shown| labelled_wall < shown),
                format!(
                    "{old} (token {old_token:?}, shown valid until {shown:?}) deleted, {pod} labelled with token {token:?} {:.0} ms later",
                    took.as_secs_f64() * 1000.0
                ),
            );
        }
        Err(err) => {
            report.check(
                &format!("the next pod leads after the {holders} leader's deletion"),
                false,
                err,
            );
        }
    }
    let said = log.said(Duration::from_secs(40)).await;
    let wanted = format!(
        "reported the work under fencing token {} stopped",
        old_token.unwrap_or_default()
    );
    report.check(
        &format!("the old {holders} leader's elect reported its work stopped (the report taken)"),
        said.contains(&wanted),
        format!("wanted `{wanted}` in its log:\n{}", said.trim_end()),
    );
    true
}
