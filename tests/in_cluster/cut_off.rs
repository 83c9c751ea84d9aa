//! Phase 2d's drill of a leader cut off from the network: every packet its pod sends but on loopback dropped by
//! iptables in the pod's own network namespace (its node, its kubelet and the other pods run on; the pod stays
//! Running and Ready, as with a NetworkPolicy that forgets the reports port, a broken route or a failed CNI):
//!
//! - the lock shows `HolderReachesOperator=False` naming the pod and the fix within 15 s, with a Warning Event;
//! - the cut pod's `elect` stops the work on its own clock, and once every validity told to it has ended the lock
//!   moves to another pod, whose work starts within the lock's TTL + 5 s of the cut (DESIGN's bound), after the
//!   cut pod's work stopped, by the kubelet's own log timestamps (one clock, the node's);
//! - once the path is back, the lock stays with the new leader (one leader), and the condition is `True`.
//!
//! A guarded Job's pod cut off the same way (`job_cut_off`): its guard stops the work and ends the pod (exit 76,
//! ignored), and the Job's next pod works under the lock within the TTL, the Job controller's backoff and a pod start.
//!
//! Only where the cluster's node is this machine (the project's single-node Kubernetes): elsewhere the pod's
//! network namespace cannot be entered, and the drill says so instead.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use redlock_operator::api::DistributedLock;
use tokio::process::Command;

use serde_yaml_ng::Value;

use super::cluster::Cluster;
use super::holder_phases::apply_in;
use super::manifests::Manifest;
use super::observe::{Ev, Observer};
use super::report::{Report, wait_for};

/// What the issue asks of the condition: shown within this long of the cut.
const SHOWN_WITHIN: Duration = Duration::from_secs(15);
/// Beside the lock's TTL, how long the next leader's work may take to start after the cut.
const MOVED_WITHIN_TTL_PLUS: Duration = Duration::from_secs(5);

pub async fn leader_cut_off(cluster: &Cluster, report: &Report, observer: &Observer, lock: &str, pod: &str) {
    report.step(&format!(
        "2d'. the leader {pod} cut off from the network (iptables in its network namespace: all but loopback dropped)"
    ));
    let ns = &cluster.holders_ns;
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), ns);
    let locks: Api<DistributedLock> = Api::namespaced(cluster.client.clone(), ns);
    let ip = pods.get(pod).await.ok().and_then(|pod| pod.status?.pod_ip);
    let ttl = locks
        .get(lock)
        .await
        .ok()
        .and_then(|lock| redlock_operator::duration::parse(&lock.spec.ttl).ok());
    let (Some(ip), Some(ttl)) = (ip, ttl) else {
        report.check(
            "the leader pod's IP and the lock's TTL are known",
            false,
            "no pod IP, or no TTL",
        );
        return;
    };
    let rule = CUT_RULE;
    let Some((netns, cut_at)) = cut(report, &format!("the leader pod {pod}"), &ip).await else {
        return;
    };
    let at = Instant::now();
    let shown = wait_for("HolderReachesOperator=False", Duration::from_secs(45), || {
        condition(&locks, lock, "False")
    })
    .await;
    let took = at.elapsed();
    report.check_result(
        &format!(
            "the lock shows HolderReachesOperator=False naming the pod and the fix within {} s of the cut",
            SHOWN_WITHIN.as_secs()
        ),
        shown.and_then(|message| {
            let named = message.contains(pod) && message.contains("NetworkPolicy egress rule");
            let detail = format!("after {:.1} s: {message}", took.as_secs_f64());
            if named && took <= SHOWN_WITHIN {
                Ok(detail)
            } else {
                Err(detail)
            }
        }),
    );
    let warned = cluster
        .kubectl(&[
            "get",
            "events",
            "-n",
            ns,
            "--field-selector",
            "reason=HolderNotAsking",
            "-o",
            "name",
        ])
        .await;
    report.check(
        "a Warning Event HolderNotAsking is on the lock",
        warned.ok && !warned.stdout.trim().is_empty(),
        warned.text(),
    );
    let bound = ttl.saturating_add(MOVED_WITHIN_TTL_PLUS);
    let moved = wait_for(
        "another pod leading",
        bound.saturating_add(Duration::from_secs(30)),
        || async { observer.state().leader().filter(|(leader, _)| leader != pod) },
    )
    .await;
    let next = match moved {
        Ok((next, _)) => next,
        Err(err) => {
            report.check("the lock moves to another pod", false, err);
            heal(cluster, report, &netns, &rule).await;
            return;
        }
    };
    let started = logged_at(
        cluster,
        &next,
        "leader work started under fencing token",
        cut_at,
        30,
    )
    .await;
    let stopped = logged_at(cluster, pod, "the command was stopped", cut_at, 5).await;
    report.check_result(
        &format!(
            "another pod ({next}) leads and its work starts within the TTL + {} s of the cut ({} s)",
            MOVED_WITHIN_TTL_PLUS.as_secs(),
            bound.as_secs()
        ),
        started.clone().and_then(|started| {
            let after = Duration::try_from(started.duration_since(cut_at)).unwrap_or_default();
            let detail = format!("its work started {:.1} s after the cut", after.as_secs_f64());
            if after <= bound { Ok(detail) } else { Err(detail) }
        }),
    );
    report.check_result(
        "the cut pod's work stopped before the next leader's started (the kubelet's log timestamps)",
        match (stopped, started) {
            (Ok(stopped), Ok(started)) if stopped < started => Ok(format!(
                "stopped {:.1} s after the cut, the next started {:.1} s after",
                seconds_since(cut_at, stopped),
                seconds_since(cut_at, started)
            )),
            (Ok(stopped), Ok(started)) => Err(format!("stopped at {stopped}, the next started at {started}")),
            (stopped, started) => Err(format!("stopped: {stopped:?}; started: {started:?}")),
        },
    );
    // What the cut pod's elect says once, with the fix: it asks for its grant again and cannot reach the port.
    let said = logged_at(
        cluster,
        pod,
        "cannot reach the active replica's reports port",
        cut_at,
        30,
    )
    .await;
    report.check_result(
        "the cut pod's elect says once that it cannot reach the reports port, with the NetworkPolicy fix",
        said.map(|at| format!("{:.1} s after the cut", seconds_since(cut_at, at))),
    );
    heal(cluster, report, &netns, &rule).await;
    let back = wait_for("HolderReachesOperator=True", Duration::from_secs(60), || {
        condition(&locks, lock, "True")
    })
    .await;
    report.check_result(
        "once the path is back, the lock shows HolderReachesOperator=True (the leader asks)",
        back,
    );
    // The cut pod follows: a stretch of seconds in which it never leads again (the observer checks "never two").
    tokio::time::sleep(ttl).await;
    let leader = observer.state().leader();
    report.check(
        &format!("after the path is back, {next} still leads and {pod} follows"),
        leader.as_ref().is_some_and(|(leader, _)| *leader == next),
        format!("{leader:?}"),
    );
}

/// The drill's Job lock: examples/job-fencing.yaml's, at the leader example's TTL (the bound is the TTL's).
const CUT_JOB_LOCK: &str = "cut-migration";
const CUT_JOB: &str = "migrate-cut";
const CUT_JOB_TTL: Duration = Duration::from_secs(10);
/// Beside the TTL, how long a Job's next pod may take to work after the cut: the Job controller creates the pod
/// that replaces a failed one only after its backoff (10 s after the first failure, kube-controller-manager's
/// default; ignored exits count), then the pod starts (its init container copies the binary) and its guard asks.
const JOB_MOVED_WITHIN_TTL_PLUS: Duration = Duration::from_secs(20);

/// Phase 2d's drill of a guarded Job's pod cut off as the leader's was: the pod's guard stops the work on its own
/// clock and ends the pod with exit 76 (the Job's `podFailurePolicy` ignores it), and the Job's next pod, its path
/// intact, works under the lock within the TTL + [`JOB_MOVED_WITHIN_TTL_PLUS`] of the cut, after the cut pod's
/// work stopped by the kubelet's log timestamps. `job` is examples/job-fencing.yaml's Job (labelled only, its work long), renamed.
pub async fn job_cut_off(cluster: &Cluster, report: &Report, observer: &Observer, manifest: Manifest) {
    report.step(&format!(
        "2d''. a guarded Job's pod cut off from the network (lock {CUT_JOB_LOCK}, TTL {} s)",
        CUT_JOB_TTL.as_secs()
    ));
    let ns = &cluster.holders_ns;
    observer.set_permits(CUT_JOB_LOCK, 1);
    let started_at = std::time::Instant::now();
    if let Err(err) = apply_in(cluster, ns, &manifest).await {
        report.check("the cut drill's Job and lock are applied", false, err);
        return;
    }
    let first = wait_for("the cut drill's Job running", Duration::from_secs(60), || async {
        observer.state().since(started_at).find_map(|(_, ev)| match ev {
            Ev::JobPodRunning { job, pod, .. } if job == CUT_JOB => Some(pod.clone()),
            _ => None,
        })
    })
    .await;
    let pod = match first {
        Ok(pod) => pod,
        Err(err) => {
            report.check("the cut drill's Job runs", false, err);
            return;
        }
    };
    // Cut only once its guard has started the work.
    let before = Timestamp::now()
        .checked_sub(k8s_openapi::jiff::SignedDuration::from_secs(120))
        .unwrap_or(Timestamp::UNIX_EPOCH);
    let working = logged_at(cluster, &pod, "work started", before, 60).await;
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), ns);
    let ip = pods.get(&pod).await.ok().and_then(|pod| pod.status?.pod_ip);
    let (Ok(_), Some(ip)) = (&working, ip) else {
        report.check(
            "the cut drill's Job works and its pod's IP is known",
            false,
            format!("{working:?}"),
        );
        return;
    };
    let rule = CUT_RULE;
    let Some((netns, cut_at)) = cut(report, &format!("the Job's pod {pod}"), &ip).await else {
        return;
    };
    let cut_since = std::time::Instant::now();
    let bound = CUT_JOB_TTL.saturating_add(JOB_MOVED_WITHIN_TTL_PLUS);
    let next = wait_for(
        "the Job's next pod running",
        bound.saturating_add(Duration::from_secs(30)),
        || async {
            observer.state().since(cut_since).find_map(|(_, ev)| match ev {
                Ev::JobPodRunning { job, pod: next, .. } if job == CUT_JOB && *next != pod => {
                    Some(next.clone())
                }
                _ => None,
            })
        },
    )
    .await;
    match next {
        Ok(next) => {
            let started = logged_at(cluster, &next, "work started", cut_at, 30).await;
            let stopped = logged_at(cluster, &pod, "the command was stopped", cut_at, 5).await;
            let ended = pods.get(&pod).await.ok().and_then(|pod| {
                pod.status?
                    .container_statuses?
                    .into_iter()
                    .find_map(|status| status.state?.terminated?.finished_at)
            });
            let created = pods
                .get(&next)
                .await
                .ok()
                .and_then(|pod| pod.metadata.creation_timestamp);
            let timeline = format!(
                "the cut pod ended {}, the next pod was created {}",
                ended.map_or("at an unknown time".into(), |at| format!(
                    "{:.0} s after the cut",
                    seconds_since(cut_at, at.0)
                )),
                created.map_or("at an unknown time".into(), |at| format!(
                    "{:.0} s after",
                    seconds_since(cut_at, at.0)
                )),
            );
            report.check_result(
                &format!(
                    "the Job's next pod ({next}) works under the lock within the TTL + {} s of the cut ({} s)",
                    JOB_MOVED_WITHIN_TTL_PLUS.as_secs(),
                    bound.as_secs()
                ),
                started.clone().and_then(|started| {
                    let after = Duration::try_from(started.duration_since(cut_at)).unwrap_or_default();
                    let detail = format!(
                        "its work started {:.1} s after the cut ({timeline})",
                        after.as_secs_f64()
                    );
                    if after <= bound { Ok(detail) } else { Err(detail) }
                }),
            );
            report.check_result(
                "the cut pod's work stopped before the next pod's started (the kubelet's log timestamps)",
                match (stopped, started) {
                    (Ok(stopped), Ok(started)) if stopped < started => Ok(format!(
                        "stopped {:.1} s after the cut, the next started {:.1} s after",
                        seconds_since(cut_at, stopped),
                        seconds_since(cut_at, started)
                    )),
                    (stopped, started) => Err(format!("stopped: {stopped:?}; started: {started:?}")),
                },
            );
        }
        Err(err) => {
            report.check(
                "the Job's next pod runs once the cut pod's guard stopped",
                false,
                err,
            );
        }
    }
    let exit = pods.get(&pod).await.ok().and_then(|pod| {
        pod.status?
            .container_statuses?
            .into_iter()
            .find_map(|status| status.state?.terminated)
            .map(|terminated| terminated.exit_code)
    });
    report.check(
        "the cut pod ended with the guard's exit 76 (ignored by the Job's podFailurePolicy)",
        exit == Some(76),
        format!("exit {exit:?}"),
    );
    // The pod has ended: its network namespace may be gone with it.
    if let Err(err) = iptables(&netns, "-D", &rule).await {
        report.note(&format!(
            "the cut pod's rule was not removed ({err}): its pod has ended"
        ));
    }
    let removed = cluster
        .kubectl(&[
            "delete",
            &format!("job/{CUT_JOB}"),
            &format!("dlock/{CUT_JOB_LOCK}"),
            "-n",
            ns,
            "--wait=true",
            "--timeout=60s",
        ])
        .await;
    report.check(
        "the cut drill's Job and lock are removed",
        removed.ok,
        removed.text(),
    );
}

/// examples/job-fencing.yaml as the drill runs it: its lock renamed to [`CUT_JOB_LOCK`] at [`CUT_JOB_TTL`] (and
/// a fence margin below it), its Job to [`CUT_JOB`], labelled for that lock.
pub fn cut_job_manifest(mut manifest: Manifest) -> Manifest {
    for doc in &mut manifest.docs {
        match doc["kind"].as_str() {
            Some("DistributedLock") => {
                doc["metadata"]["name"] = Value::from(CUT_JOB_LOCK);
                doc["spec"]["ttl"] = Value::from(format!("{}s", CUT_JOB_TTL.as_secs()));
                doc["spec"]["holder"]["jobs"]["fenceMargin"] = Value::from("6s");
            }
            Some("Job") => {
                doc["metadata"]["name"] = Value::from(CUT_JOB);
                doc["metadata"]["labels"]["redlock.io/guard"] = Value::from(CUT_JOB_LOCK);
            }
            _ => {}
        }
    }
    manifest
}

/// The rule a cut inserts in the pod's network namespace: everything it sends but on loopback dropped.
const CUT_RULE: [&str; 6] = ["OUTPUT", "!", "-o", "lo", "-j", "DROP"];

/// Cuts the pod of `ip` (`who`) off with [`CUT_RULE`]: its network namespace and when the cut began; `None`
/// (noted, or failed) where it cannot be.
async fn cut(report: &Report, who: &str, ip: &str) -> Option<(String, Timestamp)> {
    let Some(netns) = network_namespace_of(ip).await else {
        report.note(&format!(
            "skipped: no network namespace on this machine holds {ip} (the cluster's node is elsewhere)"
        ));
        return None;
    };
    let cut_at = Timestamp::now();
    let cut = iptables(&netns, "-I", &CUT_RULE).await;
    report
        .check(
            &format!("everything {who} sends but on loopback is dropped (network namespace {netns})"),
            cut.is_ok(),
            cut.err().unwrap_or_default(),
        )
        .then_some((netns, cut_at))
}

async fn heal(cluster: &Cluster, report: &Report, netns: &str, rule: &[&str]) {
    let healed = iptables(netns, "-D", rule).await;
    report.check(
        "the path is given back",
        healed.is_ok(),
        healed.err().unwrap_or_default(),
    );
    let _ = cluster;
}

fn seconds_since(from: Timestamp, to: Timestamp) -> f64 {
    to.duration_since(from).as_secs_f64()
}

/// When the kubelet logged the first line of `pod` containing `text` after `after` (`kubectl logs
/// --timestamps`), waiting up to `patience_secs` for it.
async fn logged_at(
    cluster: &Cluster,
    pod: &str,
    text: &str,
    after: Timestamp,
    patience_secs: u64,
) -> Result<Timestamp, String> {
    wait_for(
        &format!("{pod} logging {text:?}"),
        Duration::from_secs(patience_secs),
        || async {
            let logs = cluster
                .kubectl(&["logs", "--timestamps", pod, "-n", &cluster.holders_ns])
                .await;
            logs.stdout
                .lines()
                .filter(|line| line.contains(text))
                .filter_map(|line| line.split_whitespace().next()?.parse::<Timestamp>().ok())
                .find(|stamp| *stamp > after)
        },
    )
    .await
}

/// The message of the lock's `HolderReachesOperator` condition, once it has `status`.
async fn condition(locks: &Api<DistributedLock>, lock: &str, status: &str) -> Option<String> {
    let lock = locks.get(lock).await.ok()?;
    lock.status?
        .conditions
        .into_iter()
        .find(|condition| condition.type_ == "HolderReachesOperator" && condition.status == status)
        .map(|condition| condition.message)
}

/// The named network namespace (`ip netns`, where the container runtime keeps pods') whose interfaces hold `ip`.
async fn network_namespace_of(ip: &str) -> Option<String> {
    let listed = Command::new("ip").args(["netns", "list"]).output().await.ok()?;
    let names: Vec<String> = String::from_utf8_lossy(&listed.stdout)
        .lines()
        .filter_map(|line| line.split_whitespace().next().map(str::to_owned))
        .collect();
    let wanted = format!("inet {ip}/");
    for name in names {
        let shown = Command::new("ip")
            .args(["netns", "exec", &name, "ip", "-o", "-4", "addr", "show"])
            .output()
            .await
            .ok()?;
        if String::from_utf8_lossy(&shown.stdout).contains(&wanted) {
            return Some(name);
        }
    }
    None
}

async fn iptables(netns: &str, verb: &str, rule: &[&str]) -> Result<(), String> {
    let mut args = vec!["netns", "exec", netns, "iptables", "-w", verb];
    args.extend_from_slice(rule);
    let done = Command::new("ip")
        .args(&args)
        .output()
        .await
        .map_err(|err| format!("ip {}: {err}", args.join(" ")))?;
    if done.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&done.stderr).trim()
        ))
    }
}
