//! The fenced mode (issue 40): the protected resource is a real object behind the chart's fenced-objects policy.
//! For each churn key, ConfigMap `protected-<key>` of the first cluster is labelled `redlock.io/fenced-by` with a
//! DistributedLock on that key (a Job lock without Jobs: it never holds, it only names the key's lock). The
//! `lock` processes' children write it themselves, with the kube-rs example client and their grant's token (see
//! `outside.rs`); the API server judges each write, and the checker checks what it accepted, in its order.
//!
//! The run this mode is for: a holder paused past its validity. The nemesis SIGSTOPs a `lock` process and its
//! child while the child holds and writes, waits until another holder has written with a higher token, then
//! continues the child alone (its `lock` still stopped, as a supervisor descheduled longer than its work would
//! be), waits for its next write, and only then continues its `lock`, which stops the child. That write carries
//! the paused grant's token: behind the policy the API server refuses it; without the policy (the negative
//! control, `Policy::Absent`) it is accepted, and the checker finds a stale write.

use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::core::ObjectMeta;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use redlock_operator::api::DistributedLock;
use tokio::time::Instant;

use super::checker::Report;
use super::controls::{Outcome, base};
use super::outside::{FencedWriter, Running};
use super::protected::Write;
use super::{Scenario, World};
use crate::support::fenced_policy::{PolicyGuard, example_binary};

const FENCED_BY: &str = "redlock.io/fenced-by";

/// Whether the chart's policy guards the protected objects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    Installed,
    /// The negative control: the same objects and writes, nothing judging them.
    Absent,
}

/// The fenced object of `key` (`shared:churn-0` → `protected-churn-0`).
pub fn object_name(key: &str) -> String {
    format!("protected-{}", resource_key(key))
}

/// The lock's `resourceKey` of a shared key (`shared:churn-0` → `churn-0`).
fn resource_key(key: &str) -> &str {
    key.rsplit(':').next().unwrap_or(key)
}

/// The lock the object of `key` is fenced by.
fn lock_name(key: &str) -> String {
    format!("fenced-{}", resource_key(key))
}

/// What the fenced mode set up on the first cluster: how the children write, and the policy (removed when
/// dropped).
pub struct Setup {
    pub writer: FencedWriter,
    pub policy: Option<PolicyGuard>,
}

/// The policy (unless `policy` is absent), one lock and one labelled ConfigMap per key, and the writer; waits
/// until the API server enforces the policy (a real one takes a moment).
pub async fn set_up(
    cluster: &super::cluster::Cluster,
    quorum: &str,
    keys: &[String],
    policy: Policy,
) -> Setup {
    // Built first: a build that fails leaves nothing installed behind.
    let binary = tokio::task::block_in_place(|| example_binary("fenced_write"));
    let client = cluster.client.clone();
    let namespace = cluster.namespace.clone();
    let installed = match policy {
        Policy::Installed => Some(PolicyGuard::install(&client, &namespace).await),
        Policy::Absent => None,
    };
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
    for key in keys {
        let resource_key = resource_key(key);
        let lock = serde_json::json!({
            "apiVersion": "redlock.io/v1beta1", "kind": "DistributedLock",
            "metadata": { "name": lock_name(key) },
            "spec": { "quorum": quorum, "ttl": super::TTL, "resourceKey": resource_key,
                      "holder": { "jobs": {} } }
        });
        let lock: DistributedLock = serde_json::from_value(lock).expect("lock");
        cluster
            .locks()
            .create(&PostParams::default(), &lock)
            .await
            .expect("create the fenced object's lock");
        let object = ConfigMap {
            metadata: ObjectMeta {
                name: Some(object_name(key)),
                labels: Some([(FENCED_BY.to_owned(), lock_name(key))].into()),
                ..ObjectMeta::default()
            },
            data: Some([("token".to_owned(), "none".to_owned())].into()),
            ..ConfigMap::default()
        };
        config_maps
            .create(&PostParams::default(), &object)
            .await
            .expect("create the fenced object");
    }
    if policy == Policy::Installed
        && let Some(key) = keys.first()
    {
        let name = object_name(key);
        crate::e2e::eventually("the fenced-objects policy to be in force", || async {
            let unannotated = Patch::Merge(serde_json::json!({ "data": { "probe": "unannotated" } }));
            match config_maps
                .patch(&name, &PatchParams::default(), &unannotated)
                .await
            {
                Err(kube::Error::Api(status)) if status.code == 403 => Some(()),
                _ => None,
            }
        })
        .await;
    }
    let kubeconfig = cluster.kubeconfig_file("writers");
    Setup {
        writer: FencedWriter {
            binary,
            kubeconfig,
            namespace,
        },
        policy: installed,
    }
}

/// One pause of a holder, as it went.
#[derive(Clone, Debug)]
pub struct Pause {
    pub holder: String,
    pub key: String,
    pub token: i64,
    /// The highest token another holder wrote with, accepted, while it was paused (none: nobody did in time).
    pub successor: Option<i64>,
    /// Its first write once continued (none: it made none in time).
    pub write_after: Option<Write>,
}

impl std::fmt::Display for Pause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} paused holding {} with token {}",
            self.holder, self.key, self.token
        )?;
        match self.successor {
            Some(token) => write!(f, ", succeeded by token {token}")?,
            None => write!(f, ", no successor wrote while it was paused")?,
        }
        match &self.write_after {
            Some(write) if write.accepted => write!(f, "; its write once continued was ACCEPTED"),
            Some(_) => write!(f, "; its write once continued was refused"),
            None => write!(f, "; it wrote nothing once continued"),
        }
    }
}

/// How long a pause step waits for what it needs (a successor's write, the paused child's next write).
const STEP_PATIENCE: Duration = Duration::from_secs(30);

/// Pauses a holder that is writing (see the module's comment) and returns how it went; `None` when no holder was
/// found writing in time.
pub async fn pause_a_holder(world: &World) -> Option<Pause> {
    let outside = world.outside.as_ref()?;
    let recorder = &world.recorder;
    let (run, running) = until(STEP_PATIENCE, || {
        let mut runs = outside.running.lock().unwrap_or_else(|e| e.into_inner());
        let (run, running) = runs
            .iter_mut()
            .find(|(_, running)| !running.paused && is_writing(running, recorder))?;
        running.paused = true;
        Some((*run, running.clone()))
    })
    .await?;
    let (Some(lock), Some(child)) = (running.lock, running.child_group) else {
        return None;
    };
    let (lock, child) = (Pid::from_raw(lock), Pid::from_raw(child));
    let _ = killpg(lock, Signal::SIGSTOP);
    let _ = killpg(child, Signal::SIGSTOP);
    let paused_at = Instant::now();
    outside.paused(run, paused_at);
    recorder.nemesis(format!(
        "{}: holder paused (SIGSTOP of its `lock` process and its child) holding {} with token {}",
        running.holder, running.key, running.token
    ));
    let successor = until(STEP_PATIENCE, || {
        recorder
            .resource
            .writes()
            .iter()
            .filter(|write| write.accepted && write.key == running.key && write.token > running.token)
            .map(|write| write.token)
            .max()
    })
    .await;
    let _ = killpg(child, Signal::SIGCONT);
    let continued = Instant::now();
    recorder.nemesis(format!(
        "{}: its child continued (SIGCONT), its `lock` process still stopped",
        running.holder
    ));
    let write_after = until(STEP_PATIENCE, || {
        let writes = recorder.resource.writes();
        // A write in flight when the holder was stopped may be answered only now, yet have been taken before the
        // successor's: that one was not stale, and is not the write this step waits for.
        let successor_first = writes
            .iter()
            .filter(|write| write.accepted && write.key == running.key && write.token > running.token)
            .map(|write| write.order)
            .min();
        writes.into_iter().find(|write| {
            write.holder == running.holder
                && write.token == running.token
                && write.at > continued
                && !(write.accepted && successor_first.is_some_and(|first| write.order < first))
        })
    })
    .await;
    let _ = killpg(lock, Signal::SIGCONT);
    recorder.nemesis(format!(
        "{}: its `lock` process continued (SIGCONT)",
        running.holder
    ));
    // The key had no holder it could see from the pause until the key expired and the next holder's wait ended.
    recorder.excuse(paused_at, Instant::now() + world.scenario.ttl * 2);
    Some(Pause {
        holder: running.holder,
        key: running.key,
        token: running.token,
        successor,
        write_after,
    })
}

/// The run holds, has written, accepted, with its token, and has writes left to make after the pause: it is
/// acting on the object now.
fn is_writing(running: &Running, recorder: &super::recorder::Recorder) -> bool {
    running.lock.is_some()
        && running.child_group.is_some()
        && running.writes_left >= 2
        && recorder
            .resource
            .writes()
            .iter()
            .any(|write| write.accepted && write.holder == running.holder && write.token == running.token)
}

/// Polls `probe` until it gives something, for at most `patience`.
async fn until<T>(patience: Duration, mut probe: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + patience;
    loop {
        if let Some(found) = probe() {
            return Some(found);
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// One cluster with one replica, two `lock` processes taking one key in turn and writing its fenced object, and
/// `pauses` pauses of a writing holder; with the chart's policy or without it (the negative control).
pub async fn paused_holder_run(seed: u64, policy: Policy, pauses: usize) -> (Report, Vec<Pause>) {
    let world = World::start(Scenario {
        outside_clients: 2,
        churn_keys: 1,
        fenced: Some(policy),
        // With `REDLOCK_E2E_KUBECONFIG`, the real API server judges the writes.
        real_clusters: true,
        ..base(seed, None)
    })
    .await;
    let from = Instant::now();
    let mut done = Vec::new();
    for _ in 0..pauses {
        if let Some(pause) = pause_a_holder(&world).await {
            println!("fenced mode ({policy:?}): {pause}");
            done.push(pause);
        }
    }
    (world.finish(from).await, done)
}

/// Both twins of the `no-fenced-objects-policy` control: without the policy (caught) and behind it (passes).
#[allow(dead_code)] // Only the bench (benches/operator_safety.rs) runs both twins; the test runs them apart.
pub async fn paused_holder(seed: u64) -> Outcome {
    Outcome {
        name: "no-fenced-objects-policy",
        broken: paused_holder_run(seed, Policy::Absent, 2).await.0,
        clean: Some(paused_holder_run(seed, Policy::Installed, 2).await.0),
    }
}
