//! A holder's term as the `DistributedLock`'s status shows it, followed through a watch, and the instant the
//! holder must stop acting on it: shared by `elect` (leaders) and `guard` (a Job's pods).
//!
//! Labels and annotations reach a downward-API volume only after a kubelet sync (up to minutes), so the helpers
//! watch the lock through the API instead. A term is stopped at its stop time on this process's monotonic clock
//! (`stop_time`: counted from the holder's questions to the active replica, or, where status offers no channel,
//! from the validity status shows less the margin and a skew bound), whether or not a watch event comes: a
//! holder's safety does not rest on the operator or the API server answering.

use std::ffi::OsString;
use std::sync::Arc;
use std::time::Duration;

use futures::TryStreamExt;
use kube::Api;
use kube::runtime::watcher;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, DropGuard};

use futures::future::BoxFuture;

pub use super::held_term::{Term, fence_instant};
use super::stop_time::{Asked, Basis, Stopping, after_asks, stop_by_wall_clock};
use super::supervise::{Child, Ended};
use crate::api::holder_contract::INSTALLATION_ANNOTATION;
use crate::api::{DistributedLock, LockPhase};

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

/// Waits for a term with time left before its stop time, and returns it with that stop time (on this process's
/// monotonic clock, `stop_time`); `None` once the watch has ended. Where status offers a channel, a term whose
/// validity the active replica does not tell (unknown, or no answer) is not started: it is asked again.
pub async fn current_term(
    terms: &mut watch::Receiver<Option<Term>>,
    latest: &watch::Receiver<Option<Arc<DistributedLock>>>,
    stopping: &Stopping,
) -> Option<(Term, Instant)> {
    let mut told = None;
    // Asks in a row the replica told no validity: each further one waits longer.
    let mut misses = 0u32;
    let waiting_since = Instant::now();
    let mut said_unkept = false;
    loop {
        let candidate = terms.borrow_and_update().clone();
        if candidate.is_none() && !said_unkept && waiting_since.elapsed() >= UNKEPT_AFTER {
            // A lock nobody keeps is a silent wait otherwise: said once, with where to look.
            if let Some(note) = unkept_note(latest.borrow().as_deref()) {
                eprintln!("redlock-operator {}: {note}", stopping.tool);
                said_unkept = true;
            }
        }
        // A term that is only short of time now may have been refreshed by then.
        let mut pause = Duration::from_millis(200);
        if let Some(current) = candidate {
            let lock = latest.borrow().clone();
            match first_stop(&current, lock.as_deref(), stopping, misses).await {
                Ok(stop_at) if stop_at > Instant::now() => return Some((current, stop_at)),
                Ok(_) => {}
                Err((why, retry)) => {
                    misses = misses.saturating_add(1);
                    if told != Some(current.token) {
                        eprintln!(
                            "redlock-operator {}: the operator does not tell how long the grant of fencing token {} stays valid ({why}): not started yet; asking again",
                            stopping.tool, current.token
                        );
                        told = Some(current.token);
                    }
                    pause = retry;
                }
            }
        }
        tokio::select! {
            changed = terms.changed() => if changed.is_err() { return None },
            () = tokio::time::sleep(pause) => {}
        }
    }
}

/// How long a holder waits for its lock to show any status before it says why it may never.
const UNKEPT_AFTER: Duration = Duration::from_secs(15);

/// What a holder that has waited [`UNKEPT_AFTER`] without a term says of its lock: nothing while an installation
/// keeps it (another holder has it, or it is being acquired).
fn unkept_note(lock: Option<&DistributedLock>) -> Option<String> {
    let Some(lock) = lock else {
        return Some(format!(
            "the lock is not seen after {} s: it does not exist in this namespace, or this pod's ServiceAccount may not read it",
            UNKEPT_AFTER.as_secs()
        ));
    };
    let claimed = lock
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|annotations| annotations.contains_key(INSTALLATION_ANNOTATION));
    (lock.status.is_none() || !claimed).then(|| {
        format!(
            "the lock has no status after {} s: no installation of redlock-operator keeps it (its namespace is not in any installation's operator.lockNamespaces, or it matches no operator.lockSelector); nothing starts until one does",
            UNKEPT_AFTER.as_secs()
        )
    })
}

/// A new term's stop time: asked (`Err`: why not, and when to ask again), or from the wall clock where status
/// offers no channel.
async fn first_stop(
    term: &Term,
    lock: Option<&DistributedLock>,
    stopping: &Stopping,
    misses: u32,
) -> Result<Instant, (String, Duration)> {
    let Some(lock) = lock else {
        return Err(("the lock is not seen".into(), Duration::from_millis(200)));
    };
    match stopping.basis(Some(lock)) {
        Basis::Ask(channel) => {
            let asked = (stopping.ask)(channel, stopping.question(lock, term)).await;
            let now = Instant::now();
            match after_asks(None, &asked, stopping.margin, now, misses) {
                (Some(stop_at), _) => Ok(stop_at),
                (None, next) => Err((describe(&asked), next.saturating_duration_since(now))),
            }
        }
        Basis::WallClock => Ok(stop_by_wall_clock(
            term,
            stopping.margin,
            stopping.max_clock_skew,
            Instant::now(),
            stopping.clock.now(),
        )),
    }
}

fn describe(asked: &Asked) -> String {
    match asked {
        Asked::Valid { .. } => "valid".into(),
        Asked::Unknown(reason) => format!("unknown: {reason}"),
        // Said once per grant: what the user must change, not only that it failed.
        Asked::Failed { message, .. } => format!(
            "{message}; this pod cannot reach the active replica's reports port (status.handOverUrl): a NetworkPolicy must let it reach the operator's pods on that port (docs/how-to/install.md#networkpolicies), and the lock shows HolderReachesOperator=False meanwhile"
        ),
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
/// stopped (SIGTERM, then SIGKILL half a margin later) when `terms` stops showing the term or at its stop time
/// (`stop_at` from [`current_term`], moved only by the replica's later answers, `stop_time`).
/// `Err`: it could not be started (an exit status and a message).
pub(crate) async fn run_in_term(
    command: &[OsString],
    lock: String,
    holder: (&'static str, String),
    (current, stop_at): (&Term, Instant),
    followed: (
        &watch::Receiver<Option<Term>>,
        &watch::Receiver<Option<Arc<DistributedLock>>>,
    ),
    stopping: &Stopping,
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
    let (terms, latest) = followed;
    let watching = tokio::spawn(watch_term(
        (terms.clone(), latest.clone()),
        current.clone(),
        stop_at,
        stopping.clone(),
        lost.clone(),
    ));
    let ended = child.supervise(lost, stopping.margin / 2).await;
    watching.abort();
    Ok(ended)
}

/// Fires `lost` when status stops naming this term, or at its stop time. Where status offers a channel, the
/// replica is asked again when half of the time left has passed (as often as the stop time needs, not at each
/// extension); only its answers move the stop time, and an ask that gets none leaves it where it is, to be asked
/// again after a pause that grows with each miss, or at once on the next change of status.
/// Where it offers none, each refresh of status gives the stop time on the wall clock, as before.
pub async fn watch_term(
    (mut terms, latest): (
        watch::Receiver<Option<Term>>,
        watch::Receiver<Option<Arc<DistributedLock>>>,
    ),
    mut current: Term,
    mut stop_at: Instant,
    stopping: Stopping,
    lost: CancellationToken,
) {
    let asks = |lock: Option<&DistributedLock>| matches!(stopping.basis(lock), Basis::Ask(_));
    let mut next_ask = asks(latest.borrow().as_deref())
        .then(|| Instant::now() + stop_at.saturating_duration_since(Instant::now()) / 2);
    let mut asking: Option<BoxFuture<'static, Asked>> = None;
    // Asks in a row the replica told no validity (gone, or not yet resumed after a failover): each further one
    // waits longer, and a change of status asks at once (the new replica shows its pin once it has resumed).
    let mut misses = 0u32;
    let mut ask_again = false;
    loop {
        tokio::select! {
            () = tokio::time::sleep_until(stop_at) => break,
            changed = terms.changed() => {
                if changed.is_err() {
                    break;
                }
                match terms.borrow_and_update().clone() {
                    // The same term, refreshed (an extension): where the replica is asked, the ask already due at
                    // half the time left stands (an extension tells nothing an answer then will not, and asking
                    // at each one cost the replica an ask per extension per holder), unless the last ask got no
                    // validity (the refresh may be the new replica showing it can answer); otherwise its new
                    // validity on the wall clock.
                    Some(next) if next.token == current.token && next.permit == current.permit => {
                        current = next;
                        if asks(latest.borrow().as_deref()) {
                            if asking.is_some() {
                                ask_again = misses > 0;
                            } else if next_ask.is_none() || misses > 0 {
                                next_ask = Some(Instant::now());
                            }
                        } else {
                            stop_at = stop_by_wall_clock(&current, stopping.margin, stopping.max_clock_skew, Instant::now(), stopping.clock.now());
                            next_ask = None;
                        }
                    }
                    // Another term (a new token) or none: what the command was started with is stale.
                    _ => break,
                }
            }
            () = tokio::time::sleep_until(next_ask.unwrap_or(stop_at)), if asking.is_none() && next_ask.is_some() => {
                let lock = latest.borrow().clone();
                match (lock.as_deref(), stopping.basis(lock.as_deref())) {
                    (Some(lock), Basis::Ask(channel)) => {
                        asking = Some((stopping.ask)(channel, stopping.question(lock, &current)));
                    }
                    _ => next_ask = None,
                }
            }
            asked = async {
                match asking.as_mut() {
                    Some(asking) => asking.await,
                    None => std::future::pending().await,
                }
            }, if asking.is_some() => {
                asking = None;
                let now = Instant::now();
                if !matches!(asked, Asked::Valid { .. }) {
                    tracing::debug!(answer = %describe(&asked), "no validity told: the stop time stands");
                }
                let (stop, next) = after_asks(Some(stop_at), &asked, stopping.margin, now, misses);
                misses = if matches!(asked, Asked::Valid { .. }) { 0 } else { misses.saturating_add(1) };
                stop_at = stop.unwrap_or(stop_at);
                next_ask = Some(if std::mem::take(&mut ask_again) && misses > 0 { now } else { next });
            }
        }
    }
    lost.cancel();
}

/// Whether the API server refused the watch for RBAC (403).
fn forbidden(err: &watcher::Error) -> bool {
    let api = match err {
        watcher::Error::InitialListFailed(kube::Error::Api(status))
        | watcher::Error::WatchStartFailed(kube::Error::Api(status))
        | watcher::Error::WatchFailed(kube::Error::Api(status)) => Some(status),
        watcher::Error::WatchError(status) => Some(status),
        _ => None,
    };
    api.is_some_and(|status| status.code == 403)
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
    let mut told_forbidden = false;
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
                if forbidden(&err) {
                    if !told_forbidden {
                        // Only RBAC changes this: said once, with the fix, not a retry loop only.
                        eprintln!(
                            "redlock-operator: this pod's ServiceAccount may not watch the DistributedLock {lock} ({err}): no work starts until it may; the chart binds its holder ClusterRole wherever its installation keeps locks (holders.namespaces, docs/how-to/install.md), or bind it to this ServiceAccount yourself"
                        );
                        told_forbidden = true;
                    }
                } else {
                    tracing::warn!(error = %err, "watching the lock failed; retrying");
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
    use k8s_openapi::jiff::{SignedDuration, Timestamp};

    use super::*;
    use crate::api::DistributedLockStatus;

    fn lock(phase: LockPhase, holder: &str, token: i64, valid_until: Timestamp) -> DistributedLock {
        let mut lock: DistributedLock = serde_json::from_value(serde_json::json!({
            "apiVersion": "redlock.io/v1beta1", "kind": "DistributedLock", "metadata": {"name": "l"},
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
    fn a_lock_no_installation_keeps_is_said_so_and_a_kept_one_is_not() {
        assert!(unkept_note(None).is_some_and(|note| note.contains("does not exist")));
        let mut lock = DistributedLock::new(
            "web",
            serde_json::from_value(serde_json::json!({
                "holder": { "identity": "x" }
            }))
            .unwrap(),
        );
        assert!(unkept_note(Some(&lock)).is_some_and(|note| note.contains("no installation")));
        lock.metadata.annotations =
            Some([(INSTALLATION_ANNOTATION.to_owned(), "redlock/redlock".to_owned())].into());
        lock.status = Some(crate::api::DistributedLockStatus::default());
        assert_eq!(unkept_note(Some(&lock)), None);
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

    fn stopping(ask: crate::cli::stop_time::Ask) -> Stopping {
        Stopping {
            margin: Duration::from_secs(1),
            max_clock_skew: Duration::from_secs(1),
            namespace: "shop".into(),
            lock: "l".into(),
            ask,
            tool: "elect",
            clock: crate::cli::stop_time::HolderClock::default(),
        }
    }

    /// Status with a channel: a term of token 1 (valid until `valid_until`, never read on this path).
    fn offered(valid_until: Timestamp) -> Arc<DistributedLock> {
        let mut lock = lock(LockPhase::Held, "web-0", 1, valid_until);
        if let Some(status) = lock.status.as_mut() {
            status.hand_over_url = Some("https://127.0.0.1:1/v1/stopped".into());
            status.hand_over_certificate_sha256 = Some("ab".repeat(32));
        }
        Arc::new(lock)
    }

    fn term_1(valid_until: Timestamp) -> Term {
        Term {
            permit: None,
            token: 1,
            valid_until,
        }
    }

    /// Answers `Valid(10 s)` counted from the moment of each question to the first `valid` asks, then fails.
    fn answering(valid: usize) -> (crate::cli::stop_time::Ask, Arc<std::sync::atomic::AtomicUsize>) {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let asked = Arc::new(AtomicUsize::new(0));
        let count = asked.clone();
        let ask: crate::cli::stop_time::Ask = Arc::new(move |channel, question| {
            assert_eq!(channel.url, "https://127.0.0.1:1/v1/validity");
            assert_eq!((question.lock.as_str(), question.fencing_token), ("l", 1));
            let n = count.fetch_add(1, Ordering::SeqCst);
            let sent_at = Instant::now();
            Box::pin(async move {
                if n < valid {
                    Asked::Valid {
                        sent_at,
                        remaining: Duration::from_secs(10),
                    }
                } else {
                    Asked::Failed {
                        message: "refused".into(),
                        retry_after: None,
                    }
                }
            })
        });
        (ask, asked)
    }

    /// A holder watching its term of token 1, first told to stop 4 s from now, with status offering a channel
    /// that `ask` answers: the sender of the terms status shows, the token cancelled when the work must stop,
    /// and when the watch started.
    fn watching(
        at: Timestamp,
        ask: crate::cli::stop_time::Ask,
    ) -> (watch::Sender<Option<Term>>, CancellationToken, Instant) {
        let (shown, terms) = watch::channel(Some(term_1(at)));
        let (seen, latest) = watch::channel(Some(offered(at)));
        let start = Instant::now();
        let lost = CancellationToken::new();
        let watched = watch_term(
            (terms, latest),
            term_1(at),
            start + Duration::from_secs(4),
            stopping(ask),
            lost.clone(),
        );
        tokio::spawn(async move {
            // Kept open while the watch runs, as a running holder's informer keeps it.
            let _seen = seen;
            watched.await
        });
        (shown, lost, start)
    }

    #[tokio::test(start_paused = true)]
    async fn refreshed_status_never_moves_the_stop_time_without_an_answer() {
        let at = Timestamp::now();
        let (ask, asked) = answering(0);
        let (shown, lost, start) = watching(at, ask);
        for _ in 0..2 {
            tokio::time::sleep(Duration::from_secs(1)).await;
            // Extended, by status: far later, on any wall clock.
            shown.send_replace(Some(term_1(
                at + k8s_openapi::jiff::SignedDuration::from_secs(100),
            )));
        }
        lost.cancelled().await;
        assert_eq!(
            start.elapsed(),
            Duration::from_secs(4),
            "the first stop time stood"
        );
        assert!(
            asked.load(std::sync::atomic::Ordering::SeqCst) >= 2,
            "asked again after each failed ask"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn after_an_ask_without_an_answer_a_change_of_status_asks_at_once() {
        use std::sync::atomic::Ordering;
        let at = Timestamp::now();
        let (ask, asked) = answering(0);
        let (shown, _lost, start) = watching(at, ask);
        // The ask at 2 s (half of the 4 s left) fails; the next would be 250 ms later.
        tokio::time::sleep_until(start + Duration::from_millis(2_050)).await;
        assert_eq!(asked.load(Ordering::SeqCst), 1);
        shown.send_replace(Some(term_1(
            at + k8s_openapi::jiff::SignedDuration::from_secs(10),
        )));
        tokio::time::sleep_until(start + Duration::from_millis(2_100)).await;
        assert_eq!(asked.load(Ordering::SeqCst), 2, "asked on the change of status");
    }

    #[tokio::test(start_paused = true)]
    async fn extensions_alone_send_no_ask_before_half_the_time_left() {
        use std::sync::atomic::Ordering;
        let at = Timestamp::now();
        let (ask, asked) = answering(usize::MAX);
        let (shown, _lost, start) = watching(at, ask);
        for _ in 0..3 {
            tokio::time::sleep(Duration::from_millis(500)).await;
            shown.send_replace(Some(term_1(
                at + k8s_openapi::jiff::SignedDuration::from_secs(10),
            )));
        }
        tokio::time::sleep_until(start + Duration::from_millis(1_999)).await;
        assert_eq!(asked.load(Ordering::SeqCst), 0, "asked at an extension");
        tokio::time::sleep_until(start + Duration::from_millis(2_001)).await;
        assert_eq!(asked.load(Ordering::SeqCst), 1, "asked at half of the 4 s left");
    }

    #[tokio::test(start_paused = true)]
    async fn each_answer_counts_from_its_question_and_the_last_good_one_stands() {
        let at = Timestamp::now();
        let (ask, _) = answering(2);
        let (_shown, lost, start) = watching(at, ask);
        lost.cancelled().await;
        // Asked at 2 s (half of 4 s): stop at 2 + 9.9 − 1 = 10.9 s; again at 6.45 s: stop at 15.35 s; every ask
        // after that fails, and the work stops then.
        assert_eq!(start.elapsed(), Duration::from_millis(15_350));
    }

    #[tokio::test(start_paused = true)]
    async fn a_term_the_replica_does_not_tell_is_not_started() {
        let at = Timestamp::now();
        let (ask, asked) = answering(0);
        let (_shown, mut terms) = watch::channel(Some(term_1(at)));
        let (_seen, latest) = watch::channel(Some(offered(at)));
        let waited = tokio::time::timeout(
            Duration::from_secs(30),
            current_term(&mut terms, &latest, &stopping(ask)),
        )
        .await;
        assert!(waited.is_err(), "started without an answer");
        assert!(
            asked.load(std::sync::atomic::Ordering::SeqCst) > 10,
            "asked again and again"
        );

        let (ask, _) = answering(1);
        let start = Instant::now();
        let started = current_term(&mut terms, &latest, &stopping(ask)).await;
        assert_eq!(
            started,
            Some((term_1(at), start + Duration::from_millis(8_900))),
            "10 s × 0.99 − 1 s from the question"
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
