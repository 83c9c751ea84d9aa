//! `redlock-operator elect`: runs a command only while this pod is the leader of a leader-election lock.
//!
//! Labels reach a downward-API volume only after a kubelet sync (up to minutes), so the helper watches the
//! `DistributedLock` through the API instead: this pod leads while status says `Held` by this pod's name and
//! the validity shown has not ended. The command is stopped (SIGTERM, then SIGKILL) when that stops being
//! true — at the latest `--fence-margin` before the validity shown, whether or not a watch event came.

use std::ffi::OsString;
use std::time::Duration;

use clap::Args;
use futures::TryStreamExt;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::runtime::watcher;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::exit_code;
use super::supervise::{Child, Ended};
use crate::api::{DistributedLock, LockPhase};

#[derive(Debug, Args)]
#[command(after_help = concat!(durations_help!(), "

The command gets REDLOCK_LOCK (namespace/name), REDLOCK_LEADER (this pod), REDLOCK_FENCING_TOKEN and
REDLOCK_VALID_UNTIL in its environment, and REDLOCK_PERMIT (this pod's permit) with spec.permits above 1. It needs get, list and watch on distributedlocks.redlock.io in the
lock's namespace (a Role bound to the pod's service account). Exit status: the command's own when it ends by
itself; 64 bad usage; 69 no Kubernetes configuration; 0 after SIGTERM/SIGINT while not leading."))]
pub struct ElectArgs {
    /// The DistributedLock (with holder.leaderElection) whose leader runs the command.
    #[arg(long, value_name = "NAME")]
    pub lock: String,
    /// The lock's namespace (default: the pod's).
    #[arg(long, env = "POD_NAMESPACE")]
    pub namespace: Option<String>,
    /// This pod's name, as the operator writes it into status.holder.
    #[arg(long, env = "POD_NAME")]
    pub pod: String,
    /// Stop the command this long before the validity shown in status ends.
    #[arg(long, default_value = "1s", value_name = "DURATION", value_parser = crate::duration::parse)]
    pub fence_margin: Duration,
    /// The command to run while leading, after `--`.
    #[arg(last = true, required = true, value_name = "COMMAND")]
    pub command: Vec<OsString>,
}

/// This pod's leadership as status shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Term {
    /// The permit this pod holds, of a semaphore (spec.permits above 1).
    pub permit: Option<u32>,
    pub token: i64,
    pub valid_until: Timestamp,
}

/// Whether status makes `pod` a leader, and of which term: the holder of a plain lock, or of one of a
/// semaphore's permits (`status.holders`).
pub fn term_of(lock: &DistributedLock, pod: &str) -> Option<Term> {
    let status = lock.status.as_ref()?;
    if status.phase != Some(LockPhase::Held) {
        return None;
    }
    if !status.holders.is_empty() {
        let held = status.holders.iter().find(|held| held.holder == pod)?;
        return Some(Term {
            permit: Some(u32::try_from(held.permit).ok()?),
            token: held.fencing_token,
            valid_until: held.valid_until.as_ref()?.0,
        });
    }
    if status.holder.as_deref() != Some(pod) {
        return None;
    }
    Some(Term {
        permit: None,
        token: status.fencing_token?,
        valid_until: status.valid_until.as_ref()?.0,
    })
}

/// When to stop acting on `term`, on this process's monotonic clock.
pub fn fence_instant(term: &Term, margin: Duration, now: Instant, wall_now: Timestamp) -> Instant {
    let left = term.valid_until.duration_since(wall_now);
    let left = Duration::try_from(left).unwrap_or(Duration::ZERO);
    (now + left).checked_sub(margin).map_or(now, |at| at.max(now))
}

pub async fn run(args: ElectArgs) -> i32 {
    let fail = |code: i32, message: String| {
        eprintln!("redlock-operator elect: {message}");
        code
    };
    if args.lock.is_empty() || args.pod.is_empty() {
        return fail(
            exit_code::USAGE,
            "--lock and --pod (or POD_NAME) must not be empty".into(),
        );
    }
    let client = match super::kube_client().await {
        Ok(client) => client,
        Err((code, message)) => return fail(code, message),
    };
    let namespace = args
        .namespace
        .clone()
        .unwrap_or_else(|| client.default_namespace().to_owned());
    let api: Api<DistributedLock> = Api::namespaced(client, &namespace);
    let (terms, mut term) = watch::channel(None::<Term>);
    let stop_watch = CancellationToken::new();
    tokio::spawn(follow(
        api,
        args.lock.clone(),
        args.pod.clone(),
        terms,
        stop_watch.clone(),
    ));
    let _stop_on_exit = stop_watch.drop_guard();
    let (Ok(mut sigterm), Ok(mut sigint)) =
        (signal(SignalKind::terminate()), signal(SignalKind::interrupt()))
    else {
        return fail(exit_code::SOFTWARE, "cannot install signal handlers".into());
    };
    loop {
        // Wait for a term with time left.
        let current = loop {
            let candidate = term.borrow_and_update().clone();
            if let Some(current) = candidate
                && fence_instant(&current, args.fence_margin, Instant::now(), Timestamp::now())
                    > Instant::now()
            {
                break current;
            }
            tokio::select! {
                changed = term.changed() => if changed.is_err() { return fail(exit_code::SOFTWARE, "the watch ended".into()) },
                // A term that is only short of time now may have been refreshed by then.
                () = tokio::time::sleep(Duration::from_millis(200)) => {}
                _ = sigterm.recv() => return 0,
                _ = sigint.recv() => return 0,
            }
        };
        eprintln!(
            "redlock-operator elect: {} leads {namespace}/{} with fencing token {}",
            args.pod, args.lock, current.token
        );
        let mut env = vec![
            ("REDLOCK_LOCK", format!("{namespace}/{}", args.lock)),
            ("REDLOCK_LEADER", args.pod.clone()),
            ("REDLOCK_FENCING_TOKEN", current.token.to_string()),
            ("REDLOCK_VALID_UNTIL", current.valid_until.to_string()),
        ];
        if let Some(permit) = current.permit {
            env.push(("REDLOCK_PERMIT", permit.to_string()));
        }
        let mut child = match Child::spawn(&args.command, &env) {
            Ok(child) => child,
            Err((code, message)) => return fail(code, message),
        };
        let lost = CancellationToken::new();
        let guard = tokio::spawn(watch_term(
            term.clone(),
            current.clone(),
            args.fence_margin,
            lost.clone(),
        ));
        let ended = child.supervise(lost, args.fence_margin / 2).await;
        guard.abort();
        match ended {
            Ended::Exited(code) => return code,
            Ended::StoppedOnLoss => eprintln!(
                "redlock-operator elect: leadership of {namespace}/{} ended (token {}); the command was stopped",
                args.lock, current.token
            ),
        }
    }
}

/// Fires `lost` when status stops naming this term, or at its fence time if no refresh extends it.
async fn watch_term(
    mut terms: watch::Receiver<Option<Term>>,
    mut current: Term,
    margin: Duration,
    lost: CancellationToken,
) {
    loop {
        let fence_at = fence_instant(&current, margin, Instant::now(), Timestamp::now());
        tokio::select! {
            () = tokio::time::sleep_until(fence_at) => break,
            changed = terms.changed() => {
                if changed.is_err() {
                    break;
                }
                match terms.borrow_and_update().clone() {
                    // The same term, refreshed: a later fence time.
                    Some(next) if next.token == current.token && next.permit == current.permit => current = next,
                    // Another term (a new token) or none: what the command was started with is stale.
                    _ => break,
                }
            }
        }
    }
    lost.cancel();
}

/// Keeps `terms` current from a watch on the lock; on watch errors the last term stays, and its fence time
/// protects the command.
async fn follow(
    api: Api<DistributedLock>,
    lock: String,
    pod: String,
    terms: watch::Sender<Option<Term>>,
    stop: CancellationToken,
) {
    let config = watcher::Config::default().fields(&format!("metadata.name={lock}"));
    let stream = watcher::watcher(api, config);
    let mut stream = std::pin::pin!(stream);
    loop {
        let event = tokio::select! {
            () = stop.cancelled() => return,
            event = stream.try_next() => event,
        };
        match event {
            Ok(Some(watcher::Event::Apply(object) | watcher::Event::InitApply(object))) => {
                terms.send_if_modified(|current| {
                    let next = term_of(&object, &pod);
                    let changed = *current != next;
                    *current = next;
                    changed
                });
            }
            Ok(Some(watcher::Event::Delete(_))) => {
                terms.send_replace(None);
            }
            Ok(Some(_)) => {}
            Ok(None) => return,
            Err(err) => {
                tracing::warn!(error = %err, "watching the lock failed; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
    use k8s_openapi::jiff::SignedDuration;

    use super::*;
    use crate::api::DistributedLockStatus;

    fn lock(phase: LockPhase, holder: &str, token: i64, valid_until: Timestamp) -> DistributedLock {
        let mut lock: DistributedLock = serde_json::from_value(serde_json::json!({
            "apiVersion": "redlock.io/v1alpha1", "kind": "DistributedLock", "metadata": {"name": "l"},
            "spec": {"holder": {"leaderElection": {"selector": {}}}}
        }))
        .unwrap();
        lock.status = Some(DistributedLockStatus {
            phase: Some(phase),
            holder: Some(holder.into()),
            fencing_token: Some(token),
            valid_until: Some(MicroTime(valid_until)),
            ..DistributedLockStatus::default()
        });
        lock
    }

    #[test]
    fn only_a_held_lock_naming_this_pod_is_a_term() {
        let at = Timestamp::from_second(1_000).unwrap();
        assert_eq!(
            term_of(&lock(LockPhase::Held, "web-0", 3, at), "web-0"),
            Some(Term {
                permit: None,
                token: 3,
                valid_until: at
            })
        );
        assert_eq!(term_of(&lock(LockPhase::Held, "web-1", 3, at), "web-0"), None);
        assert_eq!(term_of(&lock(LockPhase::Lost, "web-0", 3, at), "web-0"), None);
    }

    #[test]
    fn a_semaphore_makes_each_listed_pod_a_leader_of_its_own_permit() {
        let at = Timestamp::from_second(1_000).unwrap();
        let mut semaphore = lock(LockPhase::Held, "web-0", 3, at);
        if let Some(status) = semaphore.status.as_mut() {
            status.holders = [("web-0", 0, 3), ("web-2", 1, 7)]
                .into_iter()
                .map(|(holder, permit, token)| crate::api::lock::PermitHolder {
                    permit,
                    holder: holder.into(),
                    fencing_token: token,
                    acquired_at: None,
                    valid_until: Some(MicroTime(at)),
                })
                .collect();
        }
        assert_eq!(
            term_of(&semaphore, "web-2"),
            Some(Term {
                permit: Some(1),
                token: 7,
                valid_until: at
            })
        );
        assert_eq!(term_of(&semaphore, "web-0").and_then(|term| term.permit), Some(0));
        assert_eq!(
            term_of(&semaphore, "web-1"),
            None,
            "a pod holding no permit does not lead"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_fence_time_is_the_validity_shown_minus_the_margin() {
        let wall = Timestamp::from_second(1_000).unwrap();
        let now = Instant::now();
        let term = Term {
            permit: None,
            token: 1,
            valid_until: wall + SignedDuration::from_secs(5),
        };
        assert_eq!(
            fence_instant(&term, Duration::from_secs(1), now, wall),
            now + Duration::from_secs(4)
        );
        let late = wall + SignedDuration::from_secs(6);
        assert_eq!(
            fence_instant(&term, Duration::from_secs(1), now, late),
            now,
            "already past: stop now"
        );
    }
}
