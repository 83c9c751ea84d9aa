//! Phase 2: the tutorials, with the examples applied as written (the application replaced, see `manifests`): the
//! README's first lock, a leader for a Deployment, a Job queue and a Job semaphore.

use std::time::{Duration, Instant};

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Secret;
use kube::{Api, ResourceExt};
use redlock_operator::api::holder_contract::INSTALLATION_ANNOTATION;
use redlock_operator::api::{DistributedLock, LockPhase};

use super::cluster::{Cluster, FULLNAME, rolled_out};
use super::holder_phases::{apply_in, check_hand_over, installation, jobs_complete};
use super::manifests::{Manifest, job_work, job_work_stamped};
use super::observe::Observer;
use super::report::{Report, wait_for};

pub const IDENTITY_LOCK: &str = "nightly-report";
pub const LEADER_LOCK: &str = "web-leader";
pub const JOB_LOCK: &str = "nightly-migration";
pub const SEMAPHORE_LOCK: &str = "warehouse-reports";
/// A Job of the queue's lock that runs through the drills.
pub const DRILL_JOB: &str = "migrate-orders-drill";

/// The locks the drills find held.
pub struct Held {
    pub identity: bool,
    pub leader: bool,
    pub job: bool,
}

pub async fn run(cluster: &Cluster, report: &Report, observer: &Observer) -> Held {
    let identity = first_lock(cluster, report).await;
    let leader = leader_election(cluster, report, observer).await;
    job_queue_and_semaphore(cluster, report, observer).await;
    leader_semaphore(cluster, report).await;
    lock_command_semaphore(cluster, report).await;
    let job = drill_job(cluster, report, observer).await;
    Held {
        identity,
        leader,
        job,
    }
}

/// `kubectl apply -n <the tutorials' namespace> -f -`, the locks annotated as kept by this installation.
pub async fn apply(cluster: &Cluster, manifest: Manifest) -> Result<String, String> {
    apply_in(
        cluster,
        &cluster.app_ns,
        &manifest.kept_by(&installation(cluster)),
    )
    .await
}

/// Waits until `name` is Held, and checks that this installation keeps it: other tests' operators on the same
/// cluster watch every namespace, and the first installation to look at a lock keeps it.
pub async fn wait_held(cluster: &Cluster, name: &str, patience: Duration) -> Result<String, String> {
    let locks: Api<DistributedLock> = Api::namespaced(cluster.client.clone(), &cluster.app_ns);
    let lock = wait_for(&format!("{name} Held"), patience, || {
        let locks = locks.clone();
        async move {
            let lock = locks.get(name).await.ok()?;
            let held = lock.status.as_ref()?.phase == Some(LockPhase::Held);
            let keeper = lock.annotations().get(INSTALLATION_ANNOTATION).cloned();
            (held
                || keeper
                    .as_deref()
                    .is_some_and(|keeper| keeper != installation(cluster)))
            .then_some(lock)
        }
    })
    .await?;
    let keeper = lock
        .annotations()
        .get(INSTALLATION_ANNOTATION)
        .cloned()
        .unwrap_or_default();
    if keeper != installation(cluster) {
        return Err(format!(
            "{name} is kept by the installation {keeper:?}, not this one ({}): another test's operator on this \
             cluster claimed it first; run the suite again when no other operator watches every namespace",
            installation(cluster)
        ));
    }
    let status = lock.status.unwrap_or_default();
    Ok(format!(
        "holder {}, token {}",
        status.holder.unwrap_or_default(),
        status.fencing_token.unwrap_or_default()
    ))
}

/// The README's "A first lock" (examples/identity-lock.yaml).
async fn first_lock(cluster: &Cluster, report: &Report) -> bool {
    report.step("2a. the README's first lock (examples/identity-lock.yaml)");
    let manifest = Manifest::example(&cluster.root, "identity-lock.yaml");
    if let Err(err) = apply(cluster, manifest).await {
        return report.check("the first lock is applied", false, err);
    }
    let held = wait_held(cluster, IDENTITY_LOCK, Duration::from_secs(30)).await;
    report.check_result("the first lock is Held", held)
}

/// docs/tutorials/leader-for-a-deployment.md, the long form (examples/leader-election-long-form.yaml as written:
/// busybox, the binary copied in by an init container of the operator's image, no admission policy involved; the
/// injected form is `injected`'s).
async fn leader_election(cluster: &Cluster, report: &Report, observer: &Observer) -> bool {
    report.step("2b. a leader for a Deployment, long form (examples/leader-election-long-form.yaml)");
    let manifest = Manifest::example(&cluster.root, "leader-election-long-form.yaml")
        .with_operator_image(&cluster.operator_image.reference);
    if let Err(err) = apply(cluster, manifest).await {
        return report.check("the leader-election example is applied", false, err);
    }
    let started = Instant::now();
    // Pods start in seconds here (local images): 25 s is plenty for a leader, if one can be elected at all.
    let elected = wait_for("a pod labelled leader", Duration::from_secs(25), || async {
        observer.state().leader()
    })
    .await;
    let as_written = report.check_result(
        "the leader-election example as written elects a leader",
        elected
            .as_ref()
            .map(|(pod, token)| format!("{pod}, token {token:?}"))
            .map_err(|err| err.clone()),
    );
    if !as_written {
        let pods = cluster
            .kubectl(&[
                "get",
                "pods",
                "-n",
                &cluster.app_ns,
                "-l",
                "app=web",
                "-o",
                "wide",
            ])
            .await;
        let lock = cluster
            .kubectl(&[
                "get",
                "dlock",
                LEADER_LOCK,
                "-n",
                &cluster.app_ns,
                "-o",
                "jsonpath={.status}",
            ])
            .await;
        report.note(&format!(
            "no leader {:.0} s after apply. The example's readinessProbe (httpGet :8080/healthz) can only be \
             answered by the leader-only process, which elect runs only once the pod leads, while only Ready pods \
             are candidates.\n{}\nstatus: {}",
            started.elapsed().as_secs_f64(),
            pods.text(),
            lock.text()
        ));
        report.note("removing the readinessProbe from the Deployment to go on with the tutorial");
        let patched = cluster
            .kubectl(&[
                "patch",
                "deployment",
                "web",
                "-n",
                &cluster.app_ns,
                "--type=json",
                "-p",
                r#"[{"op":"remove","path":"/spec/template/spec/containers/0/readinessProbe"}]"#,
            ])
            .await;
        if !patched.ok {
            return report.check("the Deployment is patched", false, patched.text());
        }
    }
    let rolled = rolled_out(cluster, "deployment/web", &cluster.app_ns, 120).await;
    let leader = wait_for("one leader", Duration::from_secs(40), || async {
        observer.state().leader()
    })
    .await;
    let ok = report.check_result(
        "one pod of the Deployment leads (label, token and valid-until annotations)",
        match (&leader, rolled.ok) {
            (Ok((pod, Some(token))), true) => Ok(format!("{pod}, token {token}")),
            (Ok((pod, None)), true) => Err(format!("{pod} carries the label without a token annotation")),
            (Ok(_), false) => Err(format!("the Deployment did not roll out: {}", rolled.text())),
            (Err(err), _) => Err(err.clone()),
        },
    );
    if !ok {
        return false;
    }
    report.check_result(
        "the lock is Held by this installation",
        wait_held(cluster, LEADER_LOCK, Duration::from_secs(10)).await,
    );
    service_reaches_the_leader(cluster, report, observer).await;
    reports_port_shows_the_pinned_certificate(cluster, report).await;
    hand_over(cluster, report, observer).await;
    true
}

/// The lock's status names the active replica's reports port (https, on its pod IP) and pins its certificate; the
/// port shows that certificate (a POST without a token, over the pinned channel, is answered 401), and a client
/// with another pin is refused before it sends anything. Needs the pod network reachable from where the suite
/// runs (a single node is); elsewhere it says so and moves on.
async fn reports_port_shows_the_pinned_certificate(cluster: &Cluster, report: &Report) {
    use redlock_operator::report_channel::client::{PostError, post};
    let locks: Api<DistributedLock> = Api::namespaced(cluster.client.clone(), &cluster.app_ns);
    let status = locks.get(LEADER_LOCK).await.ok().and_then(|lock| lock.status);
    let shown = status.as_ref().and_then(|status| {
        Some((
            status.hand_over_url.clone()?,
            status.hand_over_certificate_sha256.clone()?,
        ))
    });
    let Some((url, pin)) = shown else {
        report.check(
            "the lock's status shows handOverUrl and handOverCertificateSha256",
            false,
            format!("{status:?}"),
        );
        return;
    };
    report.check(
        "the lock's status shows an https handOverUrl and a certificate pin",
        url.starts_with("https://") && url.ends_with(":8443/v1/stopped"),
        format!("{url} {pin}"),
    );
    match post(&url, &pin, None, b"{}".to_vec()).await {
        Ok(answer) => {
            report.check(
                "the reports port shows the pinned certificate and refuses a report without a token (401)",
                answer.code == 401,
                answer.summary(),
            );
        }
        Err(PostError::Unreachable { reason, .. }) => {
            report.note(&format!(
                "the reports port at {url} is not reachable from here ({reason}): the pin is not checked"
            ));
            return;
        }
        Err(err) => {
            report.check(
                "the reports port shows the pinned certificate",
                false,
                err.to_string(),
            );
            return;
        }
    }
    let other = "0".repeat(64);
    let refused = post(&url, &other, None, b"{}".to_vec()).await;
    report.check(
        "a client with another pin completes no handshake with the reports port",
        matches!(refused, Err(PostError::PinMismatch { .. })),
        format!("{refused:?}"),
    );
}

/// The Service `web-leader` selects the leader label: its endpoints are the leader alone.
async fn service_reaches_the_leader(cluster: &Cluster, report: &Report, observer: &Observer) {
    let endpoints = wait_for(
        "the Service's endpoints to be the leader",
        Duration::from_secs(15),
        || async {
            let leader = observer.state().leader()?.0;
            let shown = cluster
                .kubectl(&[
                    "get",
                    "endpointslices",
                    "-n",
                    &cluster.app_ns,
                    "-l",
                    "kubernetes.io/service-name=web-leader",
                    "-o",
                    "jsonpath={.items[*].endpoints[*].targetRef.name}",
                ])
                .await;
            (shown.stdout.split_whitespace().collect::<Vec<_>>() == [leader.as_str()]).then_some(leader)
        },
    )
    .await;
    report.check_result("the Service web-leader reaches only the leader", endpoints);
}

/// Deletes the leader pod: its `elect` stops the leader-only process and reports, and the next pod is labelled
/// "milliseconds later" (the tutorial's words).
async fn hand_over(cluster: &Cluster, report: &Report, observer: &Observer) {
    if !check_hand_over(cluster, report, observer, &cluster.app_ns, "cooperating").await {
        return;
    }
    let rolled = rolled_out(cluster, "deployment/web", &cluster.app_ns, 60).await;
    report.check("the Deployment is back to three pods", rolled.ok, rolled.text());
}

/// docs/tutorials/semaphore.md's leader semaphore (examples/leader-semaphore.yaml as written: five busybox workers
/// of a StatefulSet, three permits), in the injected holders' namespace, apart from the tutorials' observer (which
/// promises one leader per lock): `kubectl get dlock` shows HELD 3/3, three pods carry the leader label with the
/// permits 0, 1 and 2, and each runs its work. Removed afterwards.
async fn leader_semaphore(cluster: &Cluster, report: &Report) {
    report.step("2e. a leader semaphore (examples/leader-semaphore.yaml as written)");
    let ns = &cluster.holders_ns;
    let manifest = Manifest::example(&cluster.root, "leader-semaphore.yaml")
        .with_operator_image(&cluster.operator_image.reference)
        .kept_by(&installation(cluster));
    if let Err(err) = apply_in(cluster, ns, &manifest).await {
        report.check("the leader-semaphore example is applied", false, err);
        return;
    }
    let locks: Api<DistributedLock> = Api::namespaced(cluster.client.clone(), ns);
    let held = wait_for("shard-owners HELD 3/3", Duration::from_secs(120), || {
        let locks = locks.clone();
        async move {
            let status = locks.get("shard-owners").await.ok()?.status?;
            (status.held.as_deref() == Some("3/3")).then(|| {
                status
                    .holders
                    .iter()
                    .map(|held| {
                        format!(
                            "permit {} {} token {}",
                            held.permit, held.holder, held.fencing_token
                        )
                    })
                    .collect::<Vec<_>>()
                    .join(", ")
            })
        }
    })
    .await;
    report.check_result("the leader semaphore shows HELD 3/3", held);
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(cluster.client.clone(), ns);
    let leaders = wait_for(
        "three labelled pods with permits 0-2",
        Duration::from_secs(30),
        || {
            let pods = pods.clone();
            async move {
                let listed = pods
                    .list(&kube::api::ListParams::default().labels("app=shard-worker,redlock.io/leader"))
                    .await
                    .ok()?;
                let mut permits: Vec<(String, String)> = listed
                    .items
                    .iter()
                    .map(|pod| {
                        let permit = pod
                            .annotations()
                            .get("redlock.io/permit")
                            .cloned()
                            .unwrap_or_default();
                        (permit, pod.name_any())
                    })
                    .collect();
                permits.sort();
                let numbers: Vec<&str> = permits.iter().map(|(permit, _)| permit.as_str()).collect();
                (numbers == ["0", "1", "2"]).then_some(permits)
            }
        },
    )
    .await;
    let working = match &leaders {
        Ok(leaders) => {
            let mut all = true;
            for (_, pod) in leaders {
                let logs = cluster.kubectl(&["logs", pod, "-n", ns]).await;
                all &= logs.stdout.contains("leader work started under fencing token");
            }
            all
        }
        Err(_) => false,
    };
    report.check(
        "three pods lead, one per permit (0, 1, 2), and each runs its shard's work",
        working,
        format!("{leaders:?}"),
    );
    let removed = cluster
        .kubectl(&[
            "delete",
            "-n",
            ns,
            "--wait=true",
            "--timeout=90s",
            "statefulset/shard-worker",
            "dlock/shard-owners",
            "serviceaccount/shard-worker",
            "role/shard-worker-elect",
            "rolebinding/shard-worker-elect",
        ])
        .await;
    report.check(
        "the leader semaphore's objects are removed",
        removed.ok,
        removed.text(),
    );
}

/// examples/job-semaphore.yaml: ten Jobs' pods, five at a time, under `redlock-operator lock --permits 3` on the
/// embedded masters, as its header says to run it (the masters' password copied into the namespace's Secret
/// `redis-password`; the masters' addresses those of this release's namespace, which the header says to change;
/// each pod's work shortened). By the node's uptime each work writes with its lines, never more than three work at
/// once, each under a permit 0-2, and all ten complete. Removed afterwards.
async fn lock_command_semaphore(cluster: &Cluster, report: &Report) {
    report.step("2f. a Job semaphore of the lock command (examples/job-semaphore.yaml)");
    let ns = &cluster.holders_ns;
    let secrets: Api<Secret> = Api::namespaced(cluster.client.clone(), &cluster.release_ns);
    let password = secrets
        .get(&format!("{FULLNAME}-redis-auth"))
        .await
        .ok()
        .and_then(|secret| secret.data?.get("password").cloned());
    let Some(password) = password else {
        report.check("the masters' password Secret is read", false, "no data.password");
        return;
    };
    let copy = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some("redis-password".to_owned()),
            ..Default::default()
        },
        data: Some([("password".to_owned(), password)].into()),
        ..Default::default()
    };
    let copied = Api::<Secret>::namespaced(cluster.client.clone(), ns)
        .create(&kube::api::PostParams::default(), &copy)
        .await;
    if !report.check(
        "the masters' password is copied into the Secret redis-password, as the header says",
        copied.is_ok(),
        copied.err().map(|err| err.to_string()).unwrap_or_default(),
    ) {
        return;
    }
    let manifest = Manifest::example(&cluster.root, "job-semaphore.yaml")
        .with_work(&job_work_stamped(3))
        .with_operator_image(&cluster.operator_image.reference)
        .with_env_replaced(".redlock-system.svc", &format!(".{}.svc", cluster.release_ns));
    if let Err(err) = apply_in(cluster, ns, &manifest).await {
        report.check("the lock-command semaphore example is applied", false, err);
        return;
    }
    let done = cluster
        .kubectl(&[
            "wait",
            "--for=condition=complete",
            "job/warehouse-reports",
            "-n",
            ns,
            "--timeout=180s",
        ])
        .await;
    report.check("its ten pods complete", done.ok, done.text());
    let logs = cluster
        .kubectl(&[
            "logs",
            "-n",
            ns,
            "-l",
            "batch.kubernetes.io/job-name=warehouse-reports",
            "--prefix",
            "--tail=-1",
            "--max-log-requests=20",
        ])
        .await;
    report.check_result(
        "never more than three work at once, each under a permit 0-2",
        at_most_three(&logs.stdout),
    );
    let removed = cluster
        .kubectl(&[
            "delete",
            "-n",
            ns,
            "--wait=true",
            "--timeout=90s",
            "job/warehouse-reports",
            "secret/redis-password",
        ])
        .await;
    report.check(
        "the lock-command semaphore's objects are removed",
        removed.ok,
        removed.text(),
    );
}

/// From `kubectl logs --prefix` of the semaphore's pods: the most that worked at once (between a pod's `work
/// started` and its `work done`, by the node's uptime each line carries: read by the work as it writes, on one
/// clock), which must be 3 at most, and the permits.
fn at_most_three(logs: &str) -> Result<String, String> {
    let mut edges: Vec<(u64, i32)> = Vec::new();
    let mut permits = std::collections::BTreeSet::new();
    for line in logs.lines() {
        // `[pod/<name>/<container>] <text> at <seconds since boot>`
        let Some(at) = line
            .rsplit_once(" at ")
            .and_then(|(_, uptime)| uptime.trim().parse::<f64>().ok())
            .map(|seconds| (seconds * 100.0).round() as u64)
        else {
            continue;
        };
        if line.contains("work started:") {
            edges.push((at, 1));
            if let Some(permit) = line
                .split(" permit ")
                .nth(1)
                .and_then(|rest| rest.split_whitespace().next())
            {
                permits.insert(permit.to_owned());
            }
        } else if line.contains("work done") {
            edges.push((at, -1));
        }
    }
    let started = edges.iter().filter(|(_, edge)| *edge == 1).count();
    // At one instant, ends before starts: a permit handed over is not two at once.
    edges.sort();
    let (mut now, mut most) = (0, 0);
    for (_, edge) in &edges {
        now += edge;
        most = most.max(now);
    }
    let detail = format!("{started} works started, at most {most} at once, permits {permits:?}");
    let permits_ok = permits
        .iter()
        .all(|permit| ["0", "1", "2"].contains(&permit.as_str()));
    if started >= 10 && most <= 3 && permits_ok {
        Ok(detail)
    } else {
        Err(detail)
    }
}

/// docs/tutorials/job-queue.md, the long form (examples/job-fencing-long-form.yaml, three Jobs) and
/// docs/tutorials/semaphore.md (examples/job-semaphore-queue.yaml, five Jobs through three permits), at once.
async fn job_queue_and_semaphore(cluster: &Cluster, report: &Report, observer: &Observer) {
    report.step(
        "2c. a Job queue, long form (examples/job-fencing-long-form.yaml) and a Job semaphore \
         (examples/job-semaphore-queue.yaml)",
    );
    let queue = Manifest::example(&cluster.root, "job-fencing-long-form.yaml")
        .with_work(&job_work(4))
        .with_operator_image(&cluster.operator_image.reference)
        .with_job_copies(&["migrate-orders-2", "migrate-orders-3"]);
    let semaphore = Manifest::example(&cluster.root, "job-semaphore-queue.yaml")
        .with_work(&job_work(6))
        .with_operator_image(&cluster.operator_image.reference)
        .with_job_copies(&["report-amer", "report-apac", "report-emea-2", "report-amer-2"]);
    observer.set_permits(JOB_LOCK, 1);
    observer.set_permits(SEMAPHORE_LOCK, 3);
    let names: Vec<String> = [queue.names_of("Job"), semaphore.names_of("Job")].concat();
    let applied_at = Instant::now();
    for manifest in [queue, semaphore] {
        if let Err(err) = apply(cluster, manifest).await {
            report.check("the Job examples are applied", false, err);
            return;
        }
    }
    let shown = cluster
        .kubectl(&[
            "get",
            "dlock",
            JOB_LOCK,
            "-n",
            &cluster.app_ns,
            "-o",
            "jsonpath={.status.holder} {.status.queue}",
        ])
        .await;
    report.note(&format!(
        "right after apply, {JOB_LOCK}: holder and queue `{}`",
        shown.text()
    ));
    // The waiting Jobs (suspended: not granted yet) in the documented queue order (redlock.io/priority, then
    // creation time, then name), as the API server recorded them: Jobs applied together share a creation second,
    // so their names decide. Which Jobs wait depends on which were granted while the others were still being
    // created, so the expectation is read from the Jobs, not computed from the manifests.
    let waiting_jobs = |lock: &'static str| async move {
        let jobs: Api<Job> = Api::namespaced(cluster.client.clone(), &cluster.app_ns);
        let params = kube::api::ListParams::default().labels(&format!("redlock.io/lock={lock}"));
        let mut waiting: Vec<(i64, Option<k8s_openapi::jiff::Timestamp>, String)> = jobs
            .list(&params)
            .await
            .ok()?
            .items
            .iter()
            .filter(|job| job.spec.as_ref().and_then(|spec| spec.suspend) == Some(true))
            .map(|job| {
                let priority = job
                    .annotations()
                    .get("redlock.io/priority")
                    .and_then(|value| value.parse::<i64>().ok())
                    .unwrap_or(0);
                let created = job.metadata.creation_timestamp.as_ref().map(|time| time.0);
                (-priority, created, job.name_any())
            })
            .collect();
        waiting.sort();
        Some(
            waiting
                .into_iter()
                .map(|(_, _, name)| name)
                .collect::<Vec<String>>(),
        )
    };
    // Status and the Jobs read together: the Jobs twice, around the lock, so that a grant between the reads is
    // seen as such and read again, not taken for a wrong queue.
    let queue_shown = |lock: &'static str| async move {
        let locks: Api<DistributedLock> = Api::namespaced(cluster.client.clone(), &cluster.app_ns);
        let seen = wait_for(
            &format!("{lock}'s status.queue showing the suspended Jobs in order"),
            Duration::from_secs(15),
            || async {
                let waiting = waiting_jobs(lock).await?;
                let shown = locks.get(lock).await.ok()?.status?.queue;
                let again = waiting_jobs(lock).await?;
                (!waiting.is_empty() && waiting == again && shown == waiting).then(|| {
                    format!(
                        "{waiting:?}, {:.1} s after apply",
                        applied_at.elapsed().as_secs_f64()
                    )
                })
            },
        )
        .await;
        report.check_result(
            &format!("{lock}: .status.queue shows the waiting Jobs in order right after apply"),
            seen,
        );
    };
    tokio::join!(queue_shown(JOB_LOCK), queue_shown(SEMAPHORE_LOCK));
    let jobs: Api<Job> = Api::namespaced(cluster.client.clone(), &cluster.app_ns);
    let done = jobs_complete(&jobs, &names, Duration::from_secs(150)).await;
    let shown = cluster
        .kubectl(&["get", "jobs,dlock", "-n", &cluster.app_ns])
        .await;
    report.note(&shown.text());
    report.check_result(
        "every Job of the queue and of the semaphore completes",
        done.map(|()| format!("{:.0} s after apply", applied_at.elapsed().as_secs_f64())),
    );
    let state = observer.state();
    let order: Vec<String> = state
        .grants
        .get(&(JOB_LOCK.to_owned(), 0))
        .map(|grants| grants.iter().map(|(job, _)| job.clone()).collect())
        .unwrap_or_default();
    report.check(
        "the Job queue runs its Jobs one at a time, in queue order",
        state.max_running.get(JOB_LOCK) == Some(&1)
            && order == ["migrate-orders", "migrate-orders-2", "migrate-orders-3"],
        format!(
            "most at once {:?}, granted {order:?}",
            state.max_running.get(JOB_LOCK)
        ),
    );
    report.check(
        "the Job semaphore runs three Jobs at once, never more",
        state.max_running.get(SEMAPHORE_LOCK) == Some(&3),
        format!("most at once {:?}", state.max_running.get(SEMAPHORE_LOCK)),
    );
}

/// One more Job of the queue, whose work runs for an hour: it holds the queue's lock through the drills.
async fn drill_job(cluster: &Cluster, report: &Report, observer: &Observer) -> bool {
    let manifest = Manifest::example(&cluster.root, "job-fencing-long-form.yaml")
        .with_work(&job_work(3600))
        .with_operator_image(&cluster.operator_image.reference)
        .only_job_named(DRILL_JOB);
    let applied_at = Instant::now();
    if let Err(err) = apply(cluster, manifest).await {
        return report.check("the drills' Job is applied", false, err);
    }
    let running = wait_for("the drills' Job running", Duration::from_secs(60), || async {
        observer.state().job_running_since(DRILL_JOB, applied_at)
    })
    .await;
    report.check_result(
        "a long Job of the queue runs under its grant (for the drills)",
        running.map(|token| format!("token {token:?}")),
    )
}

#[cfg(test)]
mod tests {
    use super::at_most_three;

    #[test]
    fn works_are_counted_by_the_uptime_they_wrote_and_a_handover_at_one_instant_is_no_overlap() {
        let line = |pod: &str, text: &str, at: f64| format!("[pod/{pod}/work] {text} at {at:.2}\n");
        let mut logs = String::new();
        // Four rounds of three works, each taking its permit at the hundredth the last round's work gave it up.
        for round in 0..4 {
            for permit in 0..3 {
                let start = 10.0 + 3.0 * f64::from(round) + 0.01 * f64::from(permit);
                let pod = format!("w-{round}-{permit}");
                logs += &line(
                    &pod,
                    &format!("work started: job w permit {permit} token {round}"),
                    start,
                );
                logs += &line(&pod, "work done", start + 3.0);
            }
        }
        assert!(at_most_three(&logs).is_ok(), "{:?}", at_most_three(&logs));
        logs += &line("late", "work started: job w permit 1 token 9", 12.0);
        assert!(at_most_three(&logs).is_err(), "a fourth starts while three work");
    }
}
