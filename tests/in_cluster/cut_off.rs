//! Phase 2d's drill of a holder cut off from the operator: the leader pod's egress to the reports port dropped by
//! iptables in the pod's own network namespace (its node, its kubelet and the other pods run on), as a
//! NetworkPolicy that forgets the port or a broken route would. The lock shows `HolderReachesOperator=False`
//! naming the pod and the fix within 15 s (the rule's bound at TTL 10 s is 5 s without an ask, plus a look at the
//! lock, which the keeper wakes every extension), and `True` again once the path is back.
//!
//! Only where the cluster's node is this machine (the project's single-node Kubernetes): elsewhere the pod's
//! network namespace cannot be entered, and the drill says so instead.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use redlock_operator::api::DistributedLock;
use tokio::process::Command;

use super::cluster::Cluster;
use super::report::{Report, wait_for};

/// What the issue asks of the condition: shown within this long of the cut.
const SHOWN_WITHIN: Duration = Duration::from_secs(15);

pub async fn leader_cut_from_operator(cluster: &Cluster, report: &Report, lock: &str, pod: &str) {
    report.step(&format!(
        "2d'. the leader {pod}'s path to the operator's reports port cut (iptables in its network namespace)"
    ));
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), &cluster.holders_ns);
    let locks: Api<DistributedLock> = Api::namespaced(cluster.client.clone(), &cluster.holders_ns);
    let ip = pods.get(pod).await.ok().and_then(|pod| pod.status?.pod_ip);
    let port = locks
        .get(lock)
        .await
        .ok()
        .and_then(|lock| lock.status?.hand_over_url)
        .and_then(|url| reports_port(&url));
    let (Some(ip), Some(port)) = (ip, port) else {
        report.check(
            "the leader pod's IP and the reports port are known",
            false,
            "no pod IP, or no status.handOverUrl",
        );
        return;
    };
    let Some(netns) = network_namespace_of(&ip).await else {
        report.note(&format!(
            "skipped: no network namespace on this machine holds {ip} (the cluster's node is elsewhere)"
        ));
        return;
    };
    let rule = ["OUTPUT", "-p", "tcp", "--dport", port.as_str(), "-j", "DROP"];
    let cut = iptables(&netns, "-I", &rule).await;
    if !report.check(
        &format!("the pod's egress to TCP {port} is dropped in its network namespace {netns}"),
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
            &cluster.holders_ns,
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
    let healed = iptables(&netns, "-D", &rule).await;
    report.check(
        "the path is given back",
        healed.is_ok(),
        healed.err().unwrap_or_default(),
    );
    let back = wait_for("HolderReachesOperator=True", Duration::from_secs(60), || {
        condition(&locks, lock, "True")
    })
    .await;
    report.check_result(
        "once the path is back, the lock shows HolderReachesOperator=True again",
        back.map(|message| format!("after {:.1} s: {message}", at.elapsed().as_secs_f64())),
    );
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

/// The port of `https://host:port/...`.
fn reports_port(url: &str) -> Option<String> {
    let authority = url.strip_prefix("https://")?.split('/').next()?;
    let (_, port) = authority.rsplit_once(':')?;
    Some(port.to_owned())
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
