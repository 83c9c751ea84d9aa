//! Job-fencing locks with a queue of Jobs. A feeder queues a first batch of Jobs on each lock (when the scenario
//! asks for one), then keeps a few Jobs queued (created suspended, as the README asks; now and then one that
//! fails at once), and removes finished ones. The Job controller and kubelet are the simulated ones next to the
//! test server (`job_controller.rs`), or the real ones.
//!
//! A Job's pod runs its work under the guard (`guard.rs`, as the README's examples do): from when the grant it
//! was created under shows current until its guard stops it or the pod stops running. Without the guard (a
//! negative control's run), its work runs as long as the pod does, with no fence time of its own: the operator
//! must suspend its Job (and the kubelet stop it) before its permit's validity ends, and the pod's kubelet, not
//! its view of the API server, ends it; such a pod is followed through the harness's own client, which the
//! nemesis never cuts.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use redlock_operator::api::DistributedLock;
use redlock_operator::cli::exit_code;
use redlock_operator::cli::guard::{Grant, grant_of, granted_term};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::cluster::Cluster;
use super::guard::{GuardedPod, Guarding, instant_of};
use super::permits::permit_resource;
use super::recorder::{ACT_INTERVAL, Belief, Recorder};
use crate::support::job_controller::{has_condition, job_finished};

const ROLE_LABEL: &str = "safety.redlock.io/role";
const KEY_ANNOTATION: &str = "safety.redlock.io/key";
/// The lock a Job's pod was queued on (its guard's `--lock`).
const LOCK_ANNOTATION: &str = "safety.redlock.io/lock";
const TOKEN_ANNOTATION: &str = "redlock.io/fencing-token";
/// The permit a semaphore's grant names (none for a plain lock's: permit 0).
const PERMIT_ANNOTATION: &str = "redlock.io/permit";

/// The image of the Jobs' pods on a real cluster: it needs `sleep` and `false`.
fn job_image() -> String {
    std::env::var("REDLOCK_E2E_JOB_IMAGE").unwrap_or_else(|_| "busybox:1.36".to_owned())
}

/// What a Job lock is, besides its name and key.
pub struct JobSpec {
    /// 1: a plain lock.
    pub permits: usize,
    pub ttl: Duration,
    /// The operator's default (a fifth of the TTL) when `None`.
    pub fence_margin: Option<Duration>,
}

pub struct JobLock {
    pub lock: String,
    pub key: String,
    failing: usize,
    object: serde_json::Value,
}

impl JobLock {
    /// A Job lock as `spec` says on the quorum's shared key `resource_key`.
    pub async fn create(
        cluster: &Cluster,
        quorum: &str,
        lock: &str,
        resource_key: &str,
        spec: &JobSpec,
    ) -> Self {
        let mut jobs = serde_json::json!({});
        if let Some(margin) = spec.fence_margin {
            jobs["fenceMargin"] = super::duration_text(margin).into();
        }
        let object = serde_json::json!({
            "apiVersion": "redlock.io/v1beta1", "kind": "DistributedLock",
            "metadata": { "name": lock },
            "spec": { "quorum": quorum, "ttl": super::duration_text(spec.ttl), "resourceKey": resource_key,
                      "permits": spec.permits, "holder": { "jobs": jobs } }
        });
        let job_lock = Self {
            lock: lock.to_owned(),
            key: format!("shared:{resource_key}"),
            failing: 0,
            object,
        };
        job_lock.create_object(cluster).await;
        job_lock
    }

    async fn create_object(&self, cluster: &Cluster) {
        cluster
            .locks()
            .create(
                &PostParams::default(),
                &serde_json::from_value(self.object.clone()).expect("lock"),
            )
            .await
            .expect("create the Job lock");
    }

    /// Deletes the lock while its Jobs run (it goes once they are fenced: suspended and their pods gone, or the
    /// validity shown to them ended), then, `pause` after it went, creates it again: its Jobs queue on it anew.
    pub async fn recreate(&self, cluster: &Cluster, pause: Duration) {
        let _ = cluster.locks().delete(&self.lock, &DeleteParams::default()).await;
        let deadline = Instant::now() + Duration::from_secs(60);
        while cluster.locks().get_opt(&self.lock).await.ok().flatten().is_some() && Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        tokio::time::sleep(pause).await;
        self.create_object(cluster).await;
    }

    /// Queues a Job that fails at once, ahead of the others (a higher priority): the next grant goes to it.
    pub async fn queue_failing_job(&mut self, cluster: &Cluster) {
        let mut failing = job(
            &format!("{}-fails-{}", self.lock, self.failing),
            (&self.lock, &self.key),
            true,
            (0.0, 0),
        );
        self.failing += 1;
        failing
            .metadata
            .annotations
            .get_or_insert_default()
            .insert("redlock.io/priority".into(), "10".into());
        let jobs: Api<Job> = Api::namespaced(cluster.client.clone(), &cluster.namespace);
        let _ = jobs.create(&PostParams::default(), &failing).await;
    }
}

/// What a lock's feeder does.
pub struct Feed {
    pub client: Client,
    pub namespace: String,
    /// The cluster's name, to name the first queue's Jobs as the checker names holders.
    pub cluster: String,
    pub lock: String,
    pub key: String,
    /// How long each Job works, in seconds.
    pub seconds: std::ops::Range<f64>,
    pub seed: u64,
    /// Jobs queued at the start, all at once, none failing: `<lock>-first-NN`.
    pub first: usize,
    /// Jobs kept waiting or running afterwards, at least.
    pub queue: usize,
    /// The pods' `terminationGracePeriodSeconds`.
    pub grace_seconds: u32,
    /// Whether now and then a Job fails at once.
    pub failing: bool,
    pub recorder: Arc<Recorder>,
}

/// Queues the first batch of `feed.lock` (on `feed.key`), then keeps its queue filled until `stop`: Jobs that
/// work for `feed.seconds`, and now and then one that fails at once. Records which of the first queue complete.
pub async fn feed(feed: Feed, stop: CancellationToken) {
    let Feed {
        client,
        namespace,
        cluster,
        lock,
        key,
        seconds,
        seed,
        first,
        queue,
        grace_seconds,
        failing,
        recorder,
    } = feed;
    let jobs: Api<Job> = Api::namespaced(client, &namespace);
    let mut rng = StdRng::seed_from_u64(seed);
    // Created until the API server took each (a realistic test server refuses some requests).
    let mut first_queue: Vec<String> = (0..first)
        .map(|index| format!("{lock}-first-{index:02}"))
        .collect();
    for name in &first_queue {
        recorder.queued_first(format!("{cluster}/{name}"));
    }
    let mut created = 0usize;
    while !stop.is_cancelled() {
        let mut unqueued = Vec::new();
        for name in first_queue.drain(..) {
            let seconds = rng.random_range(seconds.clone());
            match jobs
                .create(
                    &PostParams::default(),
                    &job(&name, (&lock, &key), false, (seconds, grace_seconds)),
                )
                .await
            {
                Ok(_) => {}
                Err(kube::Error::Api(status)) if status.code == 409 => {}
                Err(_) => unqueued.push(name),
            }
        }
        first_queue = unqueued;
        let selector = format!("redlock.io/lock={lock}");
        if let Ok(list) = jobs.list(&ListParams::default().labels(&selector)).await {
            let (finished, waiting): (Vec<&Job>, Vec<&Job>) =
                list.items.iter().partition(|job| job_finished(job));
            for job in finished {
                if completed(job) {
                    recorder.job_completed(&format!("{cluster}/{}", job.name_any()));
                }
                let _ = jobs.delete(&job.name_any(), &DeleteParams::background()).await;
            }
            for _ in waiting.len()..queue {
                // Drawn either way, so that a seed makes the same other choices.
                let fails = rng.random_bool(0.15) && failing;
                let seconds = rng.random_range(seconds.clone());
                let name = format!("{lock}-{created}");
                created += 1;
                let _ = jobs
                    .create(
                        &PostParams::default(),
                        &job(&name, (&lock, &key), fails, (seconds, grace_seconds)),
                    )
                    .await;
            }
        }
        tokio::select! {
            () = tokio::time::sleep(Duration::from_millis(200)) => {}
            () = stop.cancelled() => {}
        }
    }
}

/// A Job of `lock` on `key` whose pods work for `seconds` (or fail at once) and have `grace` seconds to stop.
fn job(name: &str, (lock, key): (&str, &str), fails: bool, (seconds, grace): (f64, u32)) -> Job {
    let command = if fails {
        serde_json::json!(["false"])
    } else {
        serde_json::json!(["sleep", format!("{seconds:.2}")])
    };
    serde_json::from_value(serde_json::json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": { "name": name, "labels": { "redlock.io/lock": lock } },
        "spec": {
            "suspend": true,
            "backoffLimit": 0,
            // As the README's examples: a pod whose guard stopped its work does not count as the Job's failure.
            "podFailurePolicy": { "rules": [{
                "action": "Ignore",
                "onExitCodes": { "containerName": "main", "operator": "In", "values": [exit_code::LOCK_LOST] },
            }] },
            "template": {
                "metadata": {
                    "labels": { ROLE_LABEL: "job" },
                    "annotations": { KEY_ANNOTATION: key, LOCK_ANNOTATION: lock },
                },
                "spec": {
                    "restartPolicy": "Never",
                    "terminationGracePeriodSeconds": grace,
                    "containers": [{ "name": "main", "image": job_image(), "command": command }]
                }
            }
        }
    }))
    .expect("job")
}

fn completed(job: &Job) -> bool {
    has_condition(job, "Complete")
}

/// What a Job's pod was created under: its grant's permit of its key (that permit's resource), with the permit's
/// token. The holder is its Job: a Job resumed with its own token (a new pod, the same grant) holds again what
/// it held.
struct Granted {
    resource: String,
    holder: String,
    lock: String,
    job: String,
    token: i64,
    permit: Option<u32>,
}

fn granted(cluster: &str, pod: &Pod) -> Option<Granted> {
    let annotations = pod.metadata.annotations.as_ref()?;
    let token = annotations.get(TOKEN_ANNOTATION).map_or("", String::as_str);
    let permit = annotations.get(PERMIT_ANNOTATION).map_or("", String::as_str);
    // A grant the pod cannot read holds nothing it knows (the guard would not start its work).
    let grant = grant_of(token, permit).ok()??;
    let job = pod
        .owner_references()
        .iter()
        .find(|owner| owner.kind == "Job")?
        .name
        .clone();
    Some(Granted {
        // A grant of a plain lock names no permit: permit 0.
        resource: permit_resource(annotations.get(KEY_ANNOTATION)?, grant.permit.unwrap_or(0)),
        holder: format!("{cluster}/{job}"),
        lock: annotations.get(LOCK_ANNOTATION)?.clone(),
        job,
        token: grant.token,
        permit: grant.permit,
    })
}

fn is_running(pod: &Pod) -> bool {
    pod.status.as_ref().and_then(|status| status.phase.as_deref()) == Some("Running")
}

/// What an unguarded Job's pod holds while it runs.
fn running(cluster: &str, pod: &Pod) -> Option<(String, String, i64)> {
    if !is_running(pod) {
        return None;
    }
    let granted = granted(cluster, pod)?;
    Some((granted.resource, granted.holder, granted.token))
}

/// The pods of every Job of `cluster`, through `client`, until `stop`: each runs its work under its guard when
/// `guarding` says how (see `guard.rs`), or else for as long as it runs. An unguarded pod's belief starts when it
/// is seen running (late, never early) and ends at the last moment it is known to have been running: the start
/// of the last direct read (every 25 ms, when it also acts) that still showed it running. A pod cannot run again
/// once it stopped, so it ran at least that long: the interval is never longer than the pod's run, and an
/// overlap it shows is one the pod really had, however late a watch tells of the pod's end.
///
/// With `within_shown_validity`, an unguarded pod that runs past the latest validity status showed for its grant
/// (read with the pod, every fourth read) is counted as a late belief: the guard's promise, which such a pod
/// lacks, broken whether or not a `lock` process took the key in time to overlap.
pub async fn follow_pods(
    cluster: String,
    client: Client,
    namespace: String,
    (guarding, within_shown_validity): (Option<Guarding>, bool),
    recorder: Arc<Recorder>,
    stop: CancellationToken,
) {
    let locks: Api<DistributedLock> = Api::namespaced(client.clone(), &namespace);
    let api: Api<Pod> = Api::namespaced(client, &namespace);
    let config = watcher::Config::default().labels(&format!("{ROLE_LABEL}=job"));
    let stream = watcher::watcher(api.clone(), config).default_backoff();
    let mut stream = std::pin::pin!(stream);
    let mut followed: HashSet<String> = HashSet::new();
    let mut probes = Vec::new();
    loop {
        let event = tokio::select! {
            () = stop.cancelled() => break,
            event = stream.next() => event,
        };
        let pod = match event {
            Some(Ok(watcher::Event::Apply(pod) | watcher::Event::InitApply(pod))) => pod,
            Some(_) => continue,
            None => break,
        };
        if !is_running(&pod) {
            continue;
        }
        let Some(granted) = granted(&cluster, &pod) else {
            continue;
        };
        if !followed.insert(pod.uid().unwrap_or_default()) {
            continue;
        }
        let (api, recorder, stop) = (api.clone(), recorder.clone(), stop.clone());
        if let Some(guarding) = &guarding {
            let guarded = GuardedPod {
                name: pod.name_any(),
                namespace: namespace.clone(),
                lock: granted.lock,
                job: granted.job,
                grant: Grant {
                    token: granted.token,
                    permit: granted.permit,
                },
                resource: granted.resource,
                holder: granted.holder,
            };
            probes.push(tokio::spawn(super::guard::run(
                guarded,
                guarding.clone(),
                api,
                recorder,
                stop,
            )));
            continue;
        }
        let Granted {
            resource: key,
            holder,
            token,
            lock,
            job,
            permit,
        } = granted;
        let (cluster, locks) = (cluster.clone(), locks.clone());
        probes.push(tokio::spawn(async move {
            let start = Instant::now();
            let name = pod.name_any();
            let mut last_running = start;
            let grant = Grant { token, permit };
            let mut shown_until: Option<Instant> = None;
            // How far the pod first ran past every validity shown by then (a later one does not cover the lapse).
            let mut past_shown: Option<Duration> = None;
            let mut reads = 0_u32;
            let mut ended = "the run ended".to_owned();
            let belief = Belief {
                key,
                holder,
                token,
                start,
                fence_at: start + Duration::from_secs(24 * 3600),
                evidence: format!("Job pod {name} running with token {token}"),
            };
            while !stop.is_cancelled() {
                let asked = Instant::now();
                // A read the API server failed says nothing of the pod: it neither ends the belief (the pod would
                // never be followed again, and its run past the validity would go unseen) nor extends it.
                let Ok(read) = api.get_opt(&name).await else {
                    tokio::time::sleep(ACT_INTERVAL).await;
                    continue;
                };
                let phase = read
                    .as_ref()
                    .and_then(|pod| pod.status.as_ref()?.phase.clone());
                let still = read.and_then(|pod| running(&cluster, &pod));
                if still
                    .as_ref()
                    .is_none_or(|(resource, _, seen)| *seen != token || *resource != belief.key)
                {
                    ended = format!("the last read that showed it running (then: phase {phase:?}, grant {still:?})");
                    break;
                }
                last_running = asked;
                belief.act(&recorder);
                if within_shown_validity && reads.is_multiple_of(4)
                    && let Ok(lock) = locks.get(&lock).await
                    && let Some(term) = granted_term(&lock, &job, grant)
                {
                    let until = instant_of(term.valid_until);
                    shown_until = Some(shown_until.map_or(until, |earlier| earlier.max(until)));
                }
                if let Some(known) = shown_until
                    && asked > known
                    && past_shown.is_none()
                {
                    past_shown = Some(asked - known);
                }
                reads = reads.wrapping_add(1);
                tokio::time::sleep(ACT_INTERVAL).await;
            }
            let past_latest = shown_until
                .filter(|known| last_running > *known)
                .map(|known| last_running - known);
            if let Some(past) = past_latest.or(past_shown) {
                recorder.late_belief(format!(
                    "Job pod {name}'s work under token {token}, without the guard, ran {} ms past the validity status showed for its grant",
                    past.as_millis()
                ));
            }
            belief.end(&recorder, last_running, &ended);
        }));
    }
    for probe in probes {
        let _ = probe.await;
    }
}

/// What a Job that did not complete shows: its status, its pods (phase, grant, exit) and its lock's status, for
/// the report of a run whose first queue did not run through.
pub async fn describe(cluster: &Cluster, job: &str) -> String {
    let jobs: Api<Job> = Api::namespaced(cluster.client.clone(), &cluster.namespace);
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), &cluster.namespace);
    let mut lines = vec![format!("Job {}/{job} did not complete:", cluster.name)];
    let Ok(object) = jobs.get(job).await else {
        lines.push("  (gone)".into());
        return lines.join("\n");
    };
    let spec = object.spec.as_ref();
    lines.push(format!(
        "  suspend={:?} template annotations={:?} status={}",
        spec.and_then(|spec| spec.suspend),
        spec.and_then(|spec| spec.template.metadata.as_ref())
            .and_then(|meta| meta.annotations.as_ref()),
        serde_json::to_string(&object.status).unwrap_or_default()
    ));
    if let Ok(list) = pods
        .list(&ListParams::default().labels(&format!("{ROLE_LABEL}=job")))
        .await
    {
        for pod in list
            .items
            .iter()
            .filter(|pod| pod.owner_references().iter().any(|owner| owner.name == job))
        {
            let status = pod.status.as_ref();
            lines.push(format!(
                "  pod {} deleting={} phase={:?} annotations={:?} containers={}",
                pod.name_any(),
                pod.metadata.deletion_timestamp.is_some(),
                status.and_then(|status| status.phase.as_deref()),
                pod.metadata.annotations,
                serde_json::to_string(&status.and_then(|status| status.container_statuses.as_ref()))
                    .unwrap_or_default()
            ));
        }
    }
    if let Some(lock) = object.labels().get("redlock.io/lock")
        && let Ok(lock) = cluster.locks().get(lock).await
    {
        lines.push(format!(
            "  lock {}: {}",
            lock.name_any(),
            serde_json::to_string(&lock.status).unwrap_or_default()
        ));
    }
    lines.join("\n")
}
