//! Phase 2d: holders injected by the chart's admission policies, in an image with no redlock binary (the suite's
//! `busybox:1.36`, `REDLOCK_E2E_JOB_IMAGE` as in tests/jobs.rs): examples/leader-election.yaml and
//! examples/job-fencing.yaml as written (the label-only form), in a namespace of their own whose watches are
//! apart from the tutorials'. A pod labelled without `command` is refused with the message; the Deployment has
//! one leader, handed over at once when its pod is deleted, with the report taken; the Jobs run one at a time with
//! rising tokens; a Job whose lock is lost (the operator stopped, three masters deleted) is stopped by its guard
//! alone (exit 76) before the validity shown, the exit ignored, and the Job runs again under a new grant.

use std::time::{Duration, Instant};

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::api::ListParams;
use kube::{Api, ResourceExt};
use redlock_operator::api::{DistributedLock, LockPhase, RedisQuorum};
use serde_yaml_ng::Value;

use super::cluster::{Cluster, FULLNAME, rolled_out};
use super::holder_phases::{FollowedLog, apply_in, check_hand_over, installation, jobs_complete};
use super::manifests::{Manifest, job_work};
use super::observe::{Ev, LATE_FENCE, Observer, PROMISES};
use super::report::{Report, wait_for};

const LEADER_LOCK: &str = "web-leader";
const JOB_LOCK: &str = "nightly-migration";
const JOBS: [&str; 3] = ["migrate-orders", "migrate-orders-2", "migrate-orders-3"];
/// The Job that holds its lock when the masters go.
const LOST_JOB: &str = "migrate-orders-lost";

fn busybox() -> String {
    std::env::var("REDLOCK_E2E_JOB_IMAGE")
        .ok()
        .filter(|image| !image.is_empty())
        .unwrap_or_else(|| "busybox:1.36".to_owned())
}

pub async fn run(cluster: &Cluster, report: &Report) {
    report.step(&format!(
        "2d. holders injected (examples/leader-election.yaml, examples/job-fencing.yaml) in {}, image {}",
        cluster.holders_ns,
        busybox()
    ));
    let observer = Observer::start(&cluster.client, &cluster.holders_ns);
    observer.set_permits(JOB_LOCK, 1);
    refused_without_command(cluster, report).await;
    if leader(cluster, report, &observer).await {
        let leading = observer.state().leader();
        if let Some((pod, _)) = leading {
            super::cut_off::leader_cut_off(cluster, report, &observer, LEADER_LOCK, &pod).await;
        }
        // The leader pod deleted: its injected `elect` stops the work and reports, and the next pod leads at once.
        check_hand_over(cluster, report, &observer, &cluster.holders_ns, "injected").await;
    }
    if jobs(cluster, report, &observer).await {
        let cut = super::cut_off::cut_job_manifest(example(cluster, "job-fencing.yaml", &job_work(600)));
        super::cut_off::job_cut_off(cluster, report, &observer, cut).await;
        // The leader goes first: with the operator stopped for the drill, nobody would remove its label.
        let removed = cluster
            .kubectl(&[
                "delete",
                "deployment,statefulset",
                "--all",
                "--cascade=foreground",
                "-n",
                &cluster.holders_ns,
                "--wait=true",
                "--timeout=90s",
            ])
            .await;
        let lock = cluster
            .kubectl(&[
                "delete",
                "dlock",
                LEADER_LOCK,
                "-n",
                &cluster.holders_ns,
                "--wait=true",
                "--timeout=60s",
            ])
            .await;
        report.note(&format!(
            "before the lost-lock drill: {} {}",
            removed.text(),
            lock.text()
        ));
        lost_lock(cluster, report, &observer).await;
    }
    {
        let state = observer.state();
        for promise in PROMISES {
            // The operator was stopped on purpose while LOST_JOB held its lock: once back, it shows that lock
            // Lost and suspends the Job after the validity; the guard's stop before it is what `lost_lock` checks.
            let broken: Vec<String> = state
                .violations(promise)
                .into_iter()
                .filter(|what| {
                    promise != LATE_FENCE
                        || !(what.contains(&format!("Job {LOST_JOB} suspended"))
                            || what.starts_with(&format!("{JOB_LOCK} shown Lost")))
                })
                .collect();
            report.check(
                &format!("injected holders, throughout: {promise}"),
                broken.is_empty(),
                format!("{broken:?}"),
            );
        }
    }
    let removed = cluster
        .kubectl(&[
            "delete",
            "deployment,statefulset,jobs,dlock",
            "--all",
            "-n",
            &cluster.holders_ns,
            "--wait=true",
            "--timeout=60s",
        ])
        .await;
    report.check(
        "the injected holders' objects are removed",
        removed.ok,
        removed.text(),
    );
}

/// An example as written (busybox, a non-root user), its work replaced by `work` (the suite's, shorter).
fn example(cluster: &Cluster, name: &str, work: &str) -> Manifest {
    Manifest::example(&cluster.root, name)
        .with_work(work)
        .kept_by(&installation(cluster))
}

/// A pod labelled `redlock.io/elect` whose container sets no command is refused, saying what to add.
async fn refused_without_command(cluster: &Cluster, report: &Report) {
    let pod = format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: no-command
  labels:
    redlock.io/elect: {LEADER_LOCK}
spec:
  containers:
    - name: app
      image: {}
      args: ["sleep", "3600"]
"#,
        busybox()
    );
    let created = cluster
        .kubectl_stdin(&["create", "-n", &cluster.holders_ns, "-f", "-"], &pod)
        .await;
    let said = created.text();
    report.check(
        "a pod labelled redlock.io/elect whose container sets no command is refused, saying what to add",
        !created.ok && said.contains("sets no command") && said.contains("add command:"),
        said,
    );
}

/// examples/leader-election.yaml: the Deployment's pods wrapped, one of them leading.
async fn leader(cluster: &Cluster, report: &Report, observer: &Observer) -> bool {
    // As written: busybox, its own command and user (the lock kept by this installation, for shared clusters).
    let manifest = Manifest::example(&cluster.root, "leader-election.yaml").kept_by(&installation(cluster));
    // The example's workload (a Deployment or a StatefulSet), as `kubectl rollout status` names it.
    let workload = manifest
        .docs
        .iter()
        .find(|doc| matches!(doc["kind"].as_str(), Some("Deployment" | "StatefulSet")))
        .map(|doc| {
            format!(
                "{}/{}",
                doc["kind"].as_str().unwrap_or_default().to_lowercase(),
                doc["metadata"]["name"].as_str().unwrap_or_default()
            )
        })
        .unwrap_or_default();
    if let Err(err) = apply_in(cluster, &cluster.holders_ns, &manifest).await {
        return report.check("the injected leader-election example is applied", false, err);
    }
    let rolled = rolled_out(cluster, &workload, &cluster.holders_ns, 120).await;
    if !report.check(
        &format!("the labelled {workload} of busybox rolls out"),
        rolled.ok,
        rolled.text(),
    ) {
        let shown = cluster
            .kubectl(&["get", "pods,events", "-n", &cluster.holders_ns])
            .await;
        report.note(&shown.text());
        return false;
    }
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), &cluster.holders_ns);
    let listed = pods.list(&ListParams::default().labels("app=web")).await;
    let injected = listed.map_err(|err| err.to_string()).and_then(|list| {
        let pod = list.items.first().ok_or("no pod")?;
        let spec = pod.spec.as_ref().ok_or("no spec")?;
        let command = spec.containers[0].command.clone().unwrap_or_default();
        let init: Vec<(String, Option<String>)> = spec
            .init_containers
            .iter()
            .flatten()
            .map(|c| (c.name.clone(), c.image.clone()))
            .collect();
        let ok = command.first().map(String::as_str) == Some("/redlock/redlock-operator")
            && command[1..5] == ["elect", "--lock", LEADER_LOCK, "--"]
            && init
                == [(
                    "redlock-binary".to_owned(),
                    Some(cluster.operator_image.reference.clone()),
                )];
        let shown = format!(
            "{}: command {command:?}, init containers {init:?}",
            pod.name_any()
        );
        if ok { Ok(shown) } else { Err(shown) }
    });
    report.check_result(
        "the pods run their command under elect, copied by an init container of the operator's image",
        injected,
    );
    let leader = wait_for("one leader", Duration::from_secs(40), || async {
        observer.state().leader()
    })
    .await;
    let held = report.check_result(
        "one pod of the busybox Deployment leads (label and token)",
        match &leader {
            Ok((pod, Some(token))) => Ok(format!("{pod}, token {token}")),
            Ok((pod, None)) => Err(format!("{pod} carries the label without a token annotation")),
            Err(err) => Err(err.clone()),
        },
    );
    if held {
        // Its elect starts the work once the active replica has told it the grant's validity: a moment after the
        // label, which the observer saw first. Waited for, so that the cut-off drill cuts a leader at work.
        let pod = leader.map(|(pod, _)| pod).unwrap_or_default();
        let started = wait_for("the leader's work started", Duration::from_secs(30), || async {
            let logs = cluster.kubectl(&["logs", &pod, "-n", &cluster.holders_ns]).await;
            logs.stdout
                .contains("leader work started under fencing token")
                .then_some(logs.text())
        })
        .await;
        return report.check_result("the leader's work runs under its fencing token", started);
    }
    held
}

/// examples/job-fencing.yaml and two copies: labelled only, they run one at a time with rising tokens.
async fn jobs(cluster: &Cluster, report: &Report, observer: &Observer) -> bool {
    let manifest = example(cluster, "job-fencing.yaml", &job_work(4)).with_job_copies(&JOBS[1..]);
    let applied_at = Instant::now();
    if let Err(err) = apply_in(cluster, &cluster.holders_ns, &manifest).await {
        return report.check("the injected Job example is applied", false, err);
    }
    let jobs: Api<Job> = Api::namespaced(cluster.client.clone(), &cluster.holders_ns);
    let mutated = jobs
        .get(JOBS[0])
        .await
        .map_err(|err| err.to_string())
        .and_then(|job| {
            let lock = job.labels().get("redlock.io/lock").cloned();
            let spec = job.spec.clone().unwrap_or_default();
            let rules = spec
                .pod_failure_policy
                .map(|policy| policy.rules)
                .unwrap_or_default();
            let ignores_76 = rules.iter().any(|rule| {
                rule.action == "Ignore"
                    && rule.on_exit_codes.as_ref().is_some_and(|codes| {
                        codes.values == [76] && codes.container_name.as_deref() == Some("migrate")
                    })
            });
            let command = spec
                .template
                .spec
                .map(|pod| pod.containers[0].command.clone())
                .unwrap_or_default();
            let shown =
                format!("label redlock.io/lock {lock:?}, exit 76 ignored {ignores_76}, command {command:?}");
            if lock.as_deref() == Some(JOB_LOCK) && ignores_76 {
                Ok(shown)
            } else {
                Err(shown)
            }
        });
    report.check_result(
        "a Job labelled redlock.io/guard gets the lock's label, its suspension, the exit-76 rule and the guard",
        mutated,
    );
    let done = jobs_complete(&jobs, &JOBS, Duration::from_secs(150)).await;
    let ok = report.check_result(
        "the three labelled busybox Jobs complete",
        done.map(|()| format!("{:.0} s after apply", applied_at.elapsed().as_secs_f64())),
    );
    if !ok {
        let shown = cluster
            .kubectl(&["get", "jobs,pods,dlock", "-n", &cluster.holders_ns])
            .await;
        report.note(&shown.text());
    }
    let state = observer.state();
    let grants = state
        .grants
        .get(&(JOB_LOCK.to_owned(), 0))
        .cloned()
        .unwrap_or_default();
    let rising = grants.windows(2).all(|pair| pair[0].1 < pair[1].1);
    report.check(
        "the injected Jobs run one at a time, with rising tokens",
        state.max_running.get(JOB_LOCK) == Some(&1) && grants.len() == 3 && rising,
        format!(
            "most at once {:?}, grants (job, token) {grants:?}",
            state.max_running.get(JOB_LOCK)
        ),
    );
    ok
}

/// A long Job holds the lock; three masters deleted: its guard stops the work before the validity shown (exit
/// 76), the exit does not fail the Job, and the Job runs again under a new grant once the masters are back.
async fn lost_lock(cluster: &Cluster, report: &Report, observer: &Observer) {
    let mut manifest = example(cluster, "job-fencing.yaml", &job_work(3600));
    manifest.docs.retain(|doc| doc["kind"].as_str() == Some("Job"));
    manifest.docs[0]["metadata"]["name"] = Value::from(LOST_JOB);
    let applied_at = Instant::now();
    if let Err(err) = apply_in(cluster, &cluster.holders_ns, &manifest).await {
        report.check("the long injected Job is applied", false, err);
        return;
    }
    let running = wait_for("the long Job running", Duration::from_secs(60), || async {
        observer.state().job_running_since(LOST_JOB, applied_at)
    })
    .await;
    let Ok(first_token) = running else {
        report.check_result(
            "the long injected Job runs under its grant",
            running.map(|_| String::new()),
        );
        return;
    };
    // Let the guard start the work before the masters go.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let locks: Api<DistributedLock> = Api::namespaced(cluster.client.clone(), &cluster.holders_ns);
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), &cluster.holders_ns);
    // Its log, followed from now: the pod may be gone (its Job suspended) by the time it has stopped.
    let selector = format!("batch.kubernetes.io/job-name={LOST_JOB}");
    let running_pod = pods
        .list(&ListParams::default().labels(&selector))
        .await
        .ok()
        .and_then(|list| list.items.into_iter().next())
        .map(|pod| pod.name_any())
        .unwrap_or_default();
    let log = FollowedLog::start(cluster, &running_pod, &cluster.holders_ns).await;
    // The operator stopped first: otherwise it suspends the Job as soon as it finds the lock lost, and the guard,
    // told by the same status, races the pod's deletion (exit 76 or SIGTERM's 143). Stopped, it neither extends
    // nor suspends: what fences the work is the guard alone, on the pod's clock.
    let scaled = scale_operator(cluster, 0).await;
    report.check(
        "the operator is scaled to 0 replicas",
        scaled.is_ok(),
        format!("{scaled:?}"),
    );
    let deleted_at = Instant::now();
    for i in 0..3 {
        let master = format!("{FULLNAME}-redis-{i}");
        let deleted = cluster
            .kubectl(&[
                "delete",
                "pod",
                &master,
                "-n",
                &cluster.release_ns,
                "--wait=false",
            ])
            .await;
        report.check(&format!("master {i} is deleted"), deleted.ok, deleted.text());
    }
    // The latest validity the lock showed, read until the first pod's container has ended.
    let shown: std::sync::Mutex<Option<Timestamp>> = std::sync::Mutex::new(None);
    let ended = wait_for("the long Job's pod stopped", Duration::from_secs(60), || {
        let (locks, pods, selector, shown) = (locks.clone(), pods.clone(), selector.clone(), &shown);
        async move {
            if let Some(status) = locks.get(JOB_LOCK).await.ok().and_then(|lock| lock.status)
                && status.phase == Some(LockPhase::Held)
                && let Some(valid) = status.valid_until
                && let Ok(mut shown) = shown.lock()
            {
                *shown = Some(shown.map_or(valid.0, |was: Timestamp| was.max(valid.0)));
            }
            pods.list(&ListParams::default().labels(&selector))
                .await
                .ok()?
                .items
                .into_iter()
                .find_map(|pod| {
                    let terminated = pod
                        .status
                        .as_ref()?
                        .container_statuses
                        .as_ref()?
                        .iter()
                        .find(|c| c.name == "migrate")?
                        .state
                        .as_ref()?
                        .terminated
                        .clone()?;
                    Some((pod.name_any(), terminated))
                })
        }
    })
    .await;
    let shown = shown.lock().ok().and_then(|shown| *shown);
    match ended {
        Ok((pod, terminated)) => {
            let finished = terminated.finished_at.map(|time| time.0);
            let said = log.said(Duration::from_secs(20)).await;
            // When the work stopped, by the kubelet's timestamp of the guard's line saying so (nanoseconds): the
            // container itself exits only when the validity shown has ended (the guard tries to report the stop
            // until then), and its finishedAt has whole seconds, so it cannot tell before from after.
            let stamped = cluster
                .kubectl(&["logs", &pod, "-n", &cluster.holders_ns, "--timestamps"])
                .await;
            let stopped = stamped
                .stdout
                .lines()
                .find(|line| line.contains("the command was stopped"))
                .and_then(|line| line.split_whitespace().next())
                .and_then(|stamp| stamp.parse::<Timestamp>().ok());
            report.check(
                "the lost lock's Job is stopped by its guard alone (exit 76), its work before the validity shown",
                terminated.exit_code == 76
                    && said.contains("the command was stopped")
                    && matches!((stopped, shown), (Some(stopped), Some(shown)) if stopped < shown),
                format!(
                    "{pod}: work stopped at {stopped:?}, exit {} at {finished:?} ({:.1} s after the masters went), validity shown {shown:?}; log:\n{}",
                    terminated.exit_code,
                    deleted_at.elapsed().as_secs_f64(),
                    said.trim_end()
                ),
            );
        }
        Err(err) => {
            report.check("the lost lock's Job is stopped by its guard", false, err);
        }
    }
    let scaled = scale_operator(cluster, 2).await;
    report.check(
        "the operator is back to 2 replicas",
        scaled.is_ok(),
        format!("{scaled:?}"),
    );
    let jobs: Api<Job> = Api::namespaced(cluster.client.clone(), &cluster.holders_ns);
    let again = wait_for("the Job running again", Duration::from_secs(120), || async {
        let token = observer.state().since(deleted_at).find_map(|(_, ev)| match ev {
            Ev::JobPodRunning { job, token, .. } if job == LOST_JOB => Some(*token),
            _ => None,
        })?;
        Some(token)
    })
    .await;
    let job = jobs.get(LOST_JOB).await.ok();
    let status = job
        .as_ref()
        .and_then(|job| job.status.clone())
        .unwrap_or_default();
    let failed = status
        .conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == "Failed" && c.status == "True");
    report.check(
        "its exit 76 is ignored (backoffLimit 0, the Job not Failed) and it runs again under a higher token",
        !failed && matches!((&again, first_token), (Ok(Some(new)), Some(old)) if *new > old),
        format!(
            "first token {first_token:?}, again {again:?}, failed {:?}, Failed condition {failed}",
            status.failed
        ),
    );
    let quorums: Api<RedisQuorum> = Api::all(cluster.client.clone());
    let all = wait_for("all five masters voting", Duration::from_secs(90), || async {
        (quorums.get("default").await.ok()?.status?.eligible? == 5).then_some(())
    })
    .await;
    report.check_result(
        "all five masters vote again after the injected Job's drill",
        all.map(|()| format!("{:.0} s after they went", deleted_at.elapsed().as_secs_f64())),
    );
}

/// `kubectl scale` of the operator's Deployment, then waits until that many of its pods are Ready (none left,
/// for 0).
async fn scale_operator(cluster: &Cluster, replicas: usize) -> Result<String, String> {
    let count = format!("--replicas={replicas}");
    let scaled = cluster
        .kubectl(&[
            "scale",
            &format!("deployment/{FULLNAME}"),
            "-n",
            &cluster.release_ns,
            &count,
        ])
        .await;
    if !scaled.ok {
        return Err(scaled.text());
    }
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), &cluster.release_ns);
    let selector = "app.kubernetes.io/component=operator";
    let started = Instant::now();
    wait_for("the operator's pods", Duration::from_secs(90), || async {
        let list = pods.list(&ListParams::default().labels(selector)).await.ok()?;
        let ready = |pod: &Pod| {
            pod.metadata.deletion_timestamp.is_none()
                && pod
                    .status
                    .as_ref()
                    .and_then(|status| status.conditions.as_ref())
                    .is_some_and(|conditions| {
                        conditions
                            .iter()
                            .any(|c| c.type_ == "Ready" && c.status == "True")
                    })
        };
        let settled = if replicas == 0 {
            list.items.is_empty()
        } else {
            list.items.iter().filter(|pod| ready(pod)).count() == replicas
        };
        settled.then(|| format!("{:.1} s", started.elapsed().as_secs_f64()))
    })
    .await
}
