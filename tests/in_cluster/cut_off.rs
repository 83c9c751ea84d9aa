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
//! Only where the cluster's node is this machine (the project's single-node Kubernetes): elsewhere the pod's
//! network namespace cannot be entered, and the drill says so instead.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use redlock_operator::api::DistributedLock;
use tokio::process::Command;

use super::cluster::Cluster;
use super::observe::Observer;
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
    let Some(netns) = network_namespace_of(&ip).await else {
        report.note(&format!(
            "skipped: no network namespace on this machine holds {ip} (the cluster's node is elsewhere)"
        ));
        return;
    };
    let rule = ["OUTPUT", "!", "-o", "lo", "-j", "DROP"];
    let cut_at = Timestamp::now();
    let cut = iptables(&netns, "-I", &rule).await;
    if !report.check(
        &format!("everything the pod sends but on loopback is dropped (network namespace {netns})"),
        cut.is_ok(),
        cut.err().unwrap_or_default(),
    ) {
        return;
    }
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
