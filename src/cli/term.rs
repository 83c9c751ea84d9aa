//! A holder's term as the `DistributedLock`'s status shows it, followed through a watch, and the instant the
//! holder must stop acting on it: shared by `elect` (leaders) and `guard` (a Job's pods).
//!
//! Labels and annotations reach a downward-API volume only after a kubelet sync (up to minutes), so the helpers
//! watch the lock through the API instead. A term is stopped at the latest its margin before the validity
//! status showed, on this process's monotonic clock, whether or not a watch event comes: a holder's safety does
//! not rest on the operator or the API server answering.

use std::ffi::OsString;
use std::sync::Arc;
use std::time::Duration;

use futures::TryStreamExt;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::runtime::watcher;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, DropGuard};

use super::supervise::{Child, Ended};
use crate::api::{DistributedLock, LockPhase};

/// A holder's term as status shows it: what `elect` and the Job guard run their command under.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Term {
    /// The permit this pod holds, of a semaphore (spec.permits above 1).
    pub permit: Option<u32>,
    pub token: i64,
    pub valid_until: Timestamp,
}

/// A leader's term: [`term_of`], but none once the lock is being deleted. The operator then gives its keys up
/// (status lists them in `releasing`) while status may still show the grant, and nothing else would stop the
/// leader's work before its fence time (a Job's pods, by contrast, are stopped by the Job's suspension); a leader
/// that stops now reports at once (found on a real node: deleting a leader lock waited out most of its TTL).
pub fn leader_term_of(lock: &DistributedLock, pod: &str) -> Option<Term> {
    if lock.metadata.deletion_timestamp.is_some() {
        return None;
    }
    term_of(lock, pod)
}

/// Whether status makes `holder` (a pod, or a Job) hold the lock, and in which term: the holder of a plain lock,
/// or of one of a semaphore's permits (`status.holders`).
pub fn term_of(lock: &DistributedLock, holder: &str) -> Option<Term> {
    let status = lock.status.as_ref()?;
    if status.phase != Some(LockPhase::Held) {
        return None;
    }
    if !status.holders.is_empty() {
        let held = status.holders.iter().find(|held| held.holder == holder)?;
        return Some(Term {
            permit: Some(u32::try_from(held.permit).ok()?),
            token: held.fencing_token,
            valid_until: held.valid_until.as_ref()?.0,
        });
    }
    if status.holder.as_deref() != Some(holder) {
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

/// Waits for a term with time left before its fence instant; `None` once the watch has ended.
pub async fn current_term(terms: &mut watch::Receiver<Option<Term>>, margin: Duration) -> Option<Term> {
    loop {
        let candidate = terms.borrow_and_update().clone();
        if let Some(current) = candidate
            && fence_instant(&current, margin, Instant::now(), Timestamp::now()) > Instant::now()
        {
            return Some(current);
        }
        tokio::select! {
            changed = terms.changed() => if changed.is_err() { return None },
            // A term that is only short of time now may have been refreshed by then.
            () = tokio::time::sleep(Duration::from_millis(200)) => {}
        }
    }
}

/// A lock followed through a watch: the terms a holder finds in it as they change, and the lock as last seen
/// (where a holder that stopped learns that its grant was given up, and where to report it). The watch stops
/// when this is dropped.
pub(crate) struct Followed {
    pub namespace: String,
    pub terms: watch::Receiver<Option<Term>>,
    pub latest: watch::Receiver<Option<Arc<DistributedLock>>>,
    /// Stops the watch when this is dropped.
    _watching: DropGuard,
}

/// The lock `lock` followed in `namespace` (the client's default when `None`), its terms found by `term_of`.
/// `Err`: no Kubernetes configuration (an exit status and a message).
pub(crate) async fn follow_lock(
    namespace: Option<String>,
    lock: &str,
    term_of: impl Fn(&DistributedLock) -> Option<Term> + Send + 'static,
) -> Result<Followed, (i32, String)> {
    let client = super::kube_client().await?;
    let namespace = namespace.unwrap_or_else(|| client.default_namespace().to_owned());
    let api: Api<DistributedLock> = Api::namespaced(client, &namespace);
    let (terms, term) = watch::channel(None::<Term>);
    let (seen, latest) = watch::channel(None);
    let stop = CancellationToken::new();
    let sinks = Sinks { terms, seen };
    tokio::spawn(follow(api, lock.to_owned(), term_of, sinks, stop.clone()));
    Ok(Followed {
        namespace,
        terms: term,
        latest,
        _watching: stop.drop_guard(),
    })
}

/// Runs `command` in `current`: with the term in its environment (`REDLOCK_LOCK` = `lock`,
/// `REDLOCK_FENCING_TOKEN`, `REDLOCK_VALID_UNTIL`, a semaphore's `REDLOCK_PERMIT`) and the holder's own variable,
/// stopped (SIGTERM, then SIGKILL half a margin later) when `terms` stops showing the term or at its fence time.
/// `Err`: it could not be started (an exit status and a message).
pub(crate) async fn run_in_term(
    command: &[OsString],
    lock: String,
    holder: (&'static str, String),
    current: &Term,
    terms: &watch::Receiver<Option<Term>>,
    margin: Duration,
) -> Result<Ended, (i32, String)> {
    let mut env = vec![
        ("REDLOCK_LOCK", lock),
        holder,
        ("REDLOCK_FENCING_TOKEN", current.token.to_string()),
        ("REDLOCK_VALID_UNTIL", current.valid_until.to_string()),
    ];
    if let Some(permit) = current.permit {
        env.push(("REDLOCK_PERMIT", permit.to_string()));
    }
    let mut child = Child::spawn(command, &env)?;
    let lost = CancellationToken::new();
    let watching = tokio::spawn(watch_term(terms.clone(), current.clone(), margin, lost.clone()));
    let ended = child.supervise(lost, margin / 2).await;
    watching.abort();
    Ok(ended)
}

/// Fires `lost` when status stops naming this term, or at its fence time if no refresh extends it.
pub async fn watch_term(
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

/// Where [`follow`] puts what it sees.
pub struct Sinks {
    pub terms: watch::Sender<Option<Term>>,
    pub seen: watch::Sender<Option<Arc<DistributedLock>>>,
}

/// Keeps `sinks` current from a watch on the lock; on watch errors the last term stays, and its fence time
/// protects the command.
pub async fn follow(
    api: Api<DistributedLock>,
    lock: String,
    term_of: impl Fn(&DistributedLock) -> Option<Term>,
    sinks: Sinks,
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
                let next = term_of(&object);
                // The lock first: whoever a term wakes finds the lock that showed it (a report reads it).
                sinks.seen.send_replace(Some(Arc::new(object)));
                sinks.terms.send_if_modified(|current| {
                    let changed = *current != next;
                    *current = next;
                    changed
                });
            }
            Ok(Some(watcher::Event::Delete(_))) => {
                sinks.seen.send_replace(None);
                sinks.terms.send_replace(None);
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
    fn a_lock_being_deleted_is_no_leaders_term_though_status_still_shows_it() {
        let at = Timestamp::from_second(1_000).unwrap();
        let mut deleting = lock(LockPhase::Held, "web-0", 3, at);
        assert!(leader_term_of(&deleting, "web-0").is_some());
        deleting.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(at));
        assert_eq!(leader_term_of(&deleting, "web-0"), None);
        assert!(
            term_of(&deleting, "web-0").is_some(),
            "what status shows is unchanged"
        );
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
