//! Issue 55's partition: one Job pod cut off from the API server and from the operator while it stays Running
//! (a NetworkPolicy that forgets the reports port, a broken route): nothing its guard watches arrives, no ask is
//! answered, no report gets through. Its guard stops the work on its own clock before the validity it was last
//! told ends, the pod ends with exit 76 (the harness is its kubelet), the Job's `podFailurePolicy` ignores it, and
//! the Job's next pod (its path intact) asks and works under the lock: the lock moves off the cut pod, counted in
//! the summary (`holders cut off`).
//!
//! The negative control `holder-keeps-working-when-cut`: a guard that keeps its work running once its asks go
//! unanswered. The operator keeps extending the Job's grant (the Job runs), so no other holder need take the key
//! for it to be caught: its work outlasts every validity it was told, a violation by construction
//! (`Scenario::beliefs_within_shown_validity`).

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use tokio::sync::watch;
use tokio::time::Instant;

use super::checker::Report;
use super::controls::{acting, base, caught, held};
use super::{Scenario, World};

/// The pods whose links are cut, by name; guards watch it to see a cut come and go.
pub struct HolderCuts {
    cut: watch::Sender<BTreeSet<String>>,
}

impl Default for HolderCuts {
    fn default() -> Self {
        Self {
            cut: watch::Sender::new(BTreeSet::new()),
        }
    }
}

impl HolderCuts {
    pub fn cut(&self, pod: &str) {
        self.cut.send_modify(|cut| {
            cut.insert(pod.to_owned());
        });
    }

    pub fn heal(&self, pod: &str) {
        self.cut.send_modify(|cut| {
            cut.remove(pod);
        });
    }

    pub fn heal_all(&self) {
        self.cut.send_modify(BTreeSet::clear);
    }

    pub fn is_cut(&self, pod: &str) -> bool {
        self.cut.borrow().contains(pod)
    }

    pub fn changes(&self) -> watch::Receiver<BTreeSet<String>> {
        self.cut.subscribe()
    }
}

/// What one cut came to, for the summary.
#[derive(Clone, Debug)]
pub struct CutOutcome {
    /// Whether another pod worked under the lock after the cut pod's work stopped, while the cut lasted.
    pub moved: bool,
    pub what: String,
}

/// The cuts of a run, as the summary counts them.
#[derive(Default)]
pub struct CutRecord(Mutex<Vec<CutOutcome>>);

impl CutRecord {
    pub fn push(&self, outcome: CutOutcome) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).push(outcome);
    }

    pub fn all(&self) -> Vec<CutOutcome> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// How long a cut lasts: long enough for the cut pod's guard to stop (a TTL at most), its pod to end and the
/// Job's next pod to work, on a loaded machine.
const CUT_FOR: Duration = Duration::from_secs(25);
/// Rounds of a run: a cut pod each.
const ROUNDS: usize = 2;

/// One cluster of one replica, a Job lock whose Jobs run long under the guard and a `lock` process on its key;
/// while a Job's pod works, that pod alone is cut off for [`CUT_FOR`]. The guards keep working when cut in the
/// control (`keeps_working`), and stop as `guard` does otherwise.
pub async fn partition_run(seed: u64, keeps_working: bool) -> Report {
    let world = World::start(Scenario {
        job_locks: 1,
        outside_clients: 1,
        churn_keys: 1,
        guard_keeps_working_when_cut: keeps_working,
        beliefs_within_shown_validity: true,
        ..base(seed, None)
    })
    .await;
    let from = Instant::now();
    let key = world.sides[0].jobs[0].key.clone();
    for _ in 0..ROUNDS {
        let token = held(&world, 0, "jobs-0").await;
        // The Job's pod works under the grant before it is cut, however slow the machine.
        if !acting(&world, &key, token).await {
            continue;
        }
        let Some(pod) = working_pod(&world).await else {
            continue;
        };
        cut_one(&world, &key, &pod).await;
        if keeps_working && caught(&world) {
            break;
        }
    }
    world.finish(from).await
}

/// The running pod of the Job that holds `jobs-0`, read directly.
async fn working_pod(world: &World) -> Option<String> {
    let side = &world.sides[0];
    let job = side.cluster.locks().get("jobs-0").await.ok()?.status?.holder?;
    let pods: Api<Pod> = Api::namespaced(side.cluster.client.clone(), &side.cluster.namespace);
    let selector = format!("batch.kubernetes.io/job-name={job}");
    pods.list(&ListParams::default().labels(&selector))
        .await
        .ok()?
        .items
        .into_iter()
        .find(|pod| {
            pod.metadata.deletion_timestamp.is_none()
                && pod.status.as_ref().and_then(|status| status.phase.as_deref()) == Some("Running")
        })
        .map(|pod| pod.name_any())
}

/// Cuts `pod` off for [`CUT_FOR`], then heals it; records whether the lock moved off it meanwhile: the cut pod's
/// work ended and a write under the lock's key came from another pod's work after it.
async fn cut_one(world: &World, key: &str, pod: &str) {
    let side = &world.sides[0];
    let Some(cuts) = side.cuts.clone() else {
        return;
    };
    let recorder = world.recorder.clone();
    recorder.nemesis(format!(
        "Job pod {pod} cut off from the API server and the operator for {CUT_FOR:?} (Running and Ready)"
    ));
    let cut_at = Instant::now();
    cuts.cut(pod);
    let mut moved_at = None;
    let mut stopped_at = None;
    while cut_at.elapsed() < CUT_FOR {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if stopped_at.is_none() {
            stopped_at = recorder
                .beliefs()
                .into_iter()
                .filter(|belief| belief.resource == key && belief.evidence.contains(&format!("pod {pod}'s")))
                .map(|belief| belief.end)
                .find(|end| *end >= cut_at);
        }
        if moved_at.is_none()
            && let Some(stopped) = stopped_at
        {
            // The writes carry the Job's name, not the pod's: any write after the cut pod's work ended is
            // another pod's (the next pod of the Job, or another holder of the key).
            moved_at = recorder
                .resource
                .writes()
                .into_iter()
                .filter(|write| write.key == key && write.accepted && write.at > stopped)
                .map(|write| write.at)
                .next();
        }
    }
    cuts.heal(pod);
    let since = |at: Option<Instant>| {
        at.map_or_else(
            || "not while it was cut".to_owned(),
            |at| format!("{:.1} s after the cut", (at - cut_at).as_secs_f64()),
        )
    };
    let what = format!(
        "{pod}: its work stopped {}, the next work under the lock started {}",
        since(stopped_at),
        since(moved_at),
    );
    recorder.nemesis(format!("Job pod {pod}'s links given back ({what})"));
    recorder.cuts.push(CutOutcome {
        moved: moved_at.is_some(),
        what,
    });
    // Cut and recovery excuse the key having no holder.
    recorder.excuse(cut_at, Instant::now() + Duration::from_secs(5));
}

/// Both twins of `holder-keeps-working-when-cut`: the work run on (caught) and stopped as `guard` does (passes).
#[allow(dead_code)] // Only the bench (benches/operator_safety.rs) runs both twins; the tests run them apart.
pub async fn keeps_working_when_cut(seed: u64) -> super::controls::Outcome {
    super::controls::Outcome {
        name: "holder-keeps-working-when-cut",
        broken: partition_run(seed, true).await,
        clean: Some(partition_run(seed, false).await),
    }
}
