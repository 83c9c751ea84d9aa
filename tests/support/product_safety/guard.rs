//! A Job pod's `redlock-operator guard`, as the harness plays it: the guard's own functions (`term::follow`,
//! `guard::granted_term`, `term::current_term`, `term::watch_term`), composed as `guard::run` composes them, on
//! a watch of the lock through the holders' link to the API server (which the nemesis cuts with the cluster's
//! outages). The guard's command is the pod's work: it starts once the pod runs and the grant the pod was created
//! under shows current, and stops when the guard's watch fires (the grant gone, or its fence time come, whatever
//! the API server or the operator do) or when the pod stops running, whichever comes first.
//!
//! Played in the harness, not run as a process in the pod, so that the same run works on a real cluster, whose
//! Job pods run an image without the binary; the functions are the binary's. What the harness cannot play there
//! is the pod's exit: on a test API server, a pod whose guard stopped its work fails with exit status 76 (the
//! harness is its kubelet), as a real guarded pod does, and the Job's `podFailurePolicy` ignores it; on a real
//! cluster its container runs on, idle, until it ends by itself.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use redlock_operator::api::DistributedLock;
use redlock_operator::cli::exit_code;
use redlock_operator::cli::guard::{Grant, granted_term};
use redlock_operator::cli::term::{Sinks, Term, current_term, follow, watch_term};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::recorder::{ACT_INTERVAL, Belief, Recorder};

/// How the harness plays the guards of one cluster's Job pods.
#[derive(Clone)]
pub struct Guarding {
    /// The guards' link to the API server (cut with the cluster's outages).
    pub client: Client,
    /// The guards' `--fence-margin`.
    pub margin: Duration,
    /// Whether the harness is the Job pods' kubelet (a test API server's), and ends a pod whose guard stopped
    /// its work with exit status 76.
    pub ends_pods: bool,
}

/// The pod a guard runs in, and what it was created under.
pub struct GuardedPod {
    pub name: String,
    pub namespace: String,
    pub lock: String,
    pub job: String,
    pub grant: Grant,
    /// The resource its work acts on (the grant's permit of its key), and its holder name in the history.
    pub resource: String,
    pub holder: String,
}

/// Runs the pod's guard until the pod stops running, its guard stopped the work, or `stop`; records the work's
/// interval (if it ever started). `pods` reads the pod directly (the harness's own client).
pub async fn run(
    pod: GuardedPod,
    guarding: Guarding,
    pods: Api<Pod>,
    recorder: Arc<Recorder>,
    stop: CancellationToken,
) {
    let locks: Api<DistributedLock> = Api::namespaced(guarding.client.clone(), &pod.namespace);
    let (terms_sender, mut terms) = watch::channel(None::<Term>);
    let (seen, _latest) = watch::channel(None);
    let watching = CancellationToken::new();
    let _stop_watching = watching.clone().drop_guard();
    let (job, grant) = (pod.job.clone(), pod.grant);
    tokio::spawn(follow(
        locks,
        pod.lock.clone(),
        move |lock| granted_term(lock, &job, grant),
        Sinks {
            terms: terms_sender,
            seen,
        },
        watching.clone(),
    ));

    // The command starts once the grant shows current, if the pod still runs then.
    let current = {
        let waiting = current_term(&mut terms, guarding.margin);
        let mut waiting = std::pin::pin!(waiting);
        loop {
            tokio::select! {
                current = &mut waiting => match current {
                    Some(current) => break current,
                    None => return,
                },
                () = stop.cancelled() => return,
                () = tokio::time::sleep(ACT_INTERVAL) => {
                    if !still_running(&pods, &pod).await {
                        return;
                    }
                }
            }
        }
    };
    let lost = CancellationToken::new();
    let fence = tokio::spawn(watch_term(
        terms.clone(),
        current.clone(),
        guarding.margin,
        lost.clone(),
    ));
    let belief = Belief {
        key: pod.resource.clone(),
        holder: pod.holder.clone(),
        token: current.token,
        start: Instant::now(),
        // The guard's watch ends the work; it has no fence time of its own beside it.
        fence_at: Instant::now() + Duration::from_secs(24 * 3600),
        evidence: format!(
            "Job pod {}'s guard started its work with token {}",
            pod.name, current.token
        ),
    };
    let mut last_running = belief.start;
    let (end, why) = loop {
        belief.act(&recorder);
        tokio::select! {
            () = lost.cancelled() => break (Instant::now(), "its guard stopped it"),
            () = stop.cancelled() => break (Instant::now(), "the run ended"),
            () = tokio::time::sleep(ACT_INTERVAL) => {}
        }
        let asked = Instant::now();
        if !still_running(&pods, &pod).await {
            break (last_running, "the last read that showed its pod running");
        }
        last_running = asked;
    };
    fence.abort();
    belief.end(&recorder, end, why);
    if lost.is_cancelled() && guarding.ends_pods {
        fail_with_lock_lost(&pods, &pod.name).await;
    }
}

/// Whether the pod still runs (a direct read; an error counts as running, as a kubelet's container goes on). A
/// pod being deleted does not: its kubelet sent the guard SIGTERM, which stops the work at once.
async fn still_running(pods: &Api<Pod>, pod: &GuardedPod) -> bool {
    match pods.get_opt(&pod.name).await {
        Ok(Some(seen)) => {
            seen.metadata.deletion_timestamp.is_none()
                && seen.status.and_then(|status| status.phase).as_deref() == Some("Running")
        }
        Ok(None) => false,
        Err(_) => true,
    }
}

/// The pod's container exited with the guard's status for a grant that ended: the Job's `podFailurePolicy`
/// ignores it, and the Job controller starts a new pod that waits for its grant again.
async fn fail_with_lock_lost(pods: &Api<Pod>, name: &str) {
    let status = serde_json::json!({ "status": {
        "phase": "Failed",
        "containerStatuses": [{
            "name": "main", "image": "", "imageID": "", "ready": false, "restartCount": 0,
            "state": { "terminated": { "exitCode": exit_code::LOCK_LOST, "reason": "Error" } },
        }],
    }});
    let _ = pods
        .patch_status(name, &PatchParams::default(), &Patch::Merge(status))
        .await;
}
