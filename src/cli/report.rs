//! Telling the operator that the work under a grant has stopped, so that the key given up goes to the next holder
//! at once instead of when the validity shown to this one ends (most of a TTL).
//!
//! Sent only once the supervised command has exited, and only for a grant the lock's status records as given up
//! (`status.releasing`): the operator takes the word only then, and only from this pod (it asks the API server
//! who sent the projected service-account token, `lock::reports::rule`). A report that cannot be made changes
//! nothing but the wait: the key is released at the end of the validity, as for a holder that never reports.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use tokio::sync::watch;
use tokio::time::Instant;

use super::term::Term;
use crate::api::DistributedLock;
use crate::api::holder_contract::StoppedReport;
use crate::api::lock::ReleasingKey;
use crate::report_channel::client::{self, PostError};

/// One attempt's bound: the operator answers after two reads and a token review.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(2);
/// Between attempts that did not reach the operator.
const RETRY_PAUSE: Duration = Duration::from_millis(250);

/// What a holder reports, and with which credentials.
pub struct Reporter<'a> {
    /// Who status names as the holder: the pod (`elect`) or its Job (the guard).
    pub holder: &'a str,
    /// The lock's name (its namespace is the pod's).
    pub lock: &'a str,
    /// The projected service-account token, read at each attempt (the kubelet rotates it).
    pub token_file: &'a Path,
    /// What is logged as the sender: `elect` or `guard`.
    pub tool: &'static str,
}

/// Reports that the work under `term` has stopped, once status shows its key given up; gives up when the
/// validity shown for the grant has ended (the operator releases the key then anyway), the lock is gone, or the
/// operator refuses the report for good.
///
/// That validity is the latest one status showed for the grant when the work stopped, or the release time status
/// records for its key, not the one `term` was started with: a grant extended for longer than a TTL had long
/// outlived that one, and its report was given up at once (the first deletion of a leader pod on a real node went
/// unreported so). Later extensions do not prolong the wait: a container restarted in its pod (a failed liveness
/// probe) waits at most for the validity it was shown.
pub async fn report_stopped(
    reporter: &Reporter<'_>,
    term: &Term,
    mut latest: watch::Receiver<Option<Arc<DistributedLock>>>,
) {
    let permit = term.permit.unwrap_or(0);
    let report = StoppedReport {
        lock: reporter.lock.to_owned(),
        permit,
        fencing_token: term.token,
    };
    let stopped_with = latest.borrow().clone();
    let shown = shown_until(stopped_with.as_deref(), reporter.holder, term);
    let mut announced = false;
    let mut warned_wrong_server = false;
    loop {
        let seen = latest.borrow_and_update().clone();
        let Some(lock) = seen else {
            eprintln!(
                "redlock-operator {}: the lock is gone: the work under fencing token {} is not reported",
                reporter.tool, term.token
            );
            return;
        };
        let deadline = instant_at(release_time(&lock, reporter.holder, permit, term.token).max(Some(shown)));
        match given_up(&lock, reporter.holder, permit, term.token) {
            GivenUp::Released => {
                eprintln!(
                    "redlock-operator {}: status no longer shows or records the grant of fencing token {}: its key was released already, nothing to report",
                    reporter.tool, term.token
                );
                return;
            }
            GivenUp::NotYet => {
                if !announced {
                    eprintln!(
                        "redlock-operator {}: the work under fencing token {} stopped; it is reported once status records the key as given up",
                        reporter.tool, term.token
                    );
                    announced = true;
                }
            }
            GivenUp::ReportTo(None) => {
                eprintln!(
                    "redlock-operator {}: the operator takes no reports (no status.handOverUrl): the key goes when the validity shown ends",
                    reporter.tool
                );
                return;
            }
            GivenUp::ReportTo(Some(Destination { pin: None, .. })) => {
                eprintln!(
                    "redlock-operator {}: status shows no certificate pin beside handOverUrl (an operator older than this holder): nothing is sent, and the key goes when the validity shown ends",
                    reporter.tool
                );
                return;
            }
            GivenUp::ReportTo(Some(Destination { url, pin: Some(pin) })) => {
                match send(reporter, &url, &pin, &report).await {
                    Sent::Taken => {
                        eprintln!(
                            "redlock-operator {}: reported the work under fencing token {} stopped: the key is handed over now",
                            reporter.tool, term.token
                        );
                        return;
                    }
                    // Status has not caught up yet (the grant is still shown to a pod whose container could be
                    // restarted): the next status change may allow it.
                    Sent::NotYet => {}
                    Sent::Refused(message) => {
                        eprintln!("redlock-operator {}: report refused: {message}", reporter.tool);
                        return;
                    }
                    Sent::Unreachable {
                        message,
                        wrong_server,
                        retry_after,
                    } => {
                        if wrong_server && !warned_wrong_server {
                            eprintln!("redlock-operator {}: {message}; trying again", reporter.tool);
                            warned_wrong_server = true;
                        }
                        tracing::debug!(%message, "the operator could not be reached; trying again");
                        // As long as the operator asks (its budgets of token reviews), never past the deadline.
                        let pause = retry_after.unwrap_or_default().max(RETRY_PAUSE);
                        tokio::select! {
                            () = tokio::time::sleep(pause) => continue,
                            () = tokio::time::sleep_until(deadline) => return gave_up(reporter, term),
                        }
                    }
                }
            }
        }
        tokio::select! {
            changed = latest.changed() => if changed.is_err() { return },
            () = tokio::time::sleep_until(deadline) => return gave_up(reporter, term),
        }
    }
}

fn gave_up(reporter: &Reporter<'_>, term: &Term) {
    eprintln!(
        "redlock-operator {}: the validity shown for fencing token {} ended before a report was taken: not reported (the key is released now anyway)",
        reporter.tool, term.token
    );
}

/// The end of the latest validity `lock`'s status shows `holder` for the grant `term` was started under (its
/// extensions since included), and never before `term`'s own. Pure.
fn shown_until(lock: Option<&DistributedLock>, holder: &str, term: &Term) -> Timestamp {
    lock.and_then(|lock| super::term::term_of(lock, holder))
        .filter(|shown| shown.token == term.token && shown.permit == term.permit)
        .map_or(term.valid_until, |shown| shown.valid_until.max(term.valid_until))
}

/// When status says the key of `permit` given up by `holder` with `token` is released. Pure.
fn release_time(lock: &DistributedLock, holder: &str, permit: u32, token: i64) -> Option<Timestamp> {
    recorded(lock, holder, permit, token).map(|entry| entry.release_at.0)
}

/// The instant on this process's monotonic clock when the wall clock shows `at` (now, if it has passed).
fn instant_at(at: Option<Timestamp>) -> Instant {
    let left = at.map(|at| at.duration_since(Timestamp::now()));
    Instant::now()
        + left
            .and_then(|left| Duration::try_from(left).ok())
            .unwrap_or_default()
}

/// [`report_stopped`], cut short by a SIGTERM or SIGINT that comes while it waits (one that came before, and was
/// passed on to the command, does not count: the listeners are new).
pub(crate) async fn report_stopped_unless_signalled(
    reporter: &Reporter<'_>,
    term: &Term,
    latest: watch::Receiver<Option<Arc<DistributedLock>>>,
) {
    unless_signalled(report_stopped(reporter, term, latest)).await;
}

/// Runs `work` until it ends or a SIGTERM or SIGINT comes meanwhile (one that came before does not count: the
/// listeners are new).
pub(crate) async fn unless_signalled(work: impl Future<Output = ()>) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut sigterm), Ok(mut sigint)) =
        (signal(SignalKind::terminate()), signal(SignalKind::interrupt()))
    else {
        return work.await;
    };
    tokio::select! {
        () = work => {}
        _ = sigterm.recv() => {}
        _ = sigint.recv() => {}
    }
}

/// Where status says to report: the URL and the pin of the certificate the server there must show.
#[derive(Debug, PartialEq, Eq)]
struct Destination {
    url: String,
    pin: Option<String>,
}

#[derive(Debug, PartialEq, Eq)]
enum GivenUp {
    /// Status records the key as given up: report to this address (`None`: the operator takes no reports).
    ReportTo(Option<Destination>),
    /// Still shown as the grant, or not recorded yet.
    NotYet,
    /// Neither shown nor waiting: the key was released already (or taken over).
    Released,
}

/// The key of `permit` given up by `holder` with `token`, as `lock`'s status records it. Pure.
fn recorded<'a>(
    lock: &'a DistributedLock,
    holder: &str,
    permit: u32,
    token: i64,
) -> Option<&'a ReleasingKey> {
    lock.status.as_ref()?.releasing.iter().find(|entry| {
        u32::try_from(entry.permit).ok() == Some(permit)
            && entry.holder == holder
            && entry.fencing_token == token
    })
}

/// Whether `lock`'s status records the key of `permit` given up by `holder` with `token`. Pure.
fn given_up(lock: &DistributedLock, holder: &str, permit: u32, token: i64) -> GivenUp {
    let Some(status) = lock.status.as_ref() else {
        return GivenUp::NotYet;
    };
    if recorded(lock, holder, permit, token).is_some() {
        return GivenUp::ReportTo(status.hand_over_url.clone().map(|url| Destination {
            url,
            pin: status.hand_over_certificate_sha256.clone(),
        }));
    }
    let shown = super::term::term_of(lock, holder)
        .is_some_and(|term| term.token == token && term.permit.unwrap_or(0) == permit);
    if shown { GivenUp::NotYet } else { GivenUp::Released }
}

enum Sent {
    Taken,
    NotYet,
    Refused(String),
    /// Not taken, worth another try (after `retry_after` when the operator said so); `wrong_server`: the server
    /// showed another certificate than the pinned one, and nothing was sent to it.
    Unreachable {
        message: String,
        wrong_server: bool,
        retry_after: Option<Duration>,
    },
}

impl Sent {
    fn unreachable(message: impl Into<String>) -> Self {
        Self::Unreachable {
            message: message.into(),
            retry_after: None,
            wrong_server: false,
        }
    }
}

async fn send(reporter: &Reporter<'_>, url: &str, pin: &str, report: &StoppedReport) -> Sent {
    let token = match std::fs::read_to_string(reporter.token_file) {
        Ok(token) => token.trim().to_owned(),
        Err(err) => {
            return Sent::Refused(format!(
                "no service-account token at {} ({err}): mount a projected serviceAccountToken with audience redlock-operator there",
                reporter.token_file.display()
            ));
        }
    };
    let body = match serde_json::to_vec(report) {
        Ok(body) => body,
        Err(err) => return Sent::Refused(err.to_string()),
    };
    let posted = client::post(url, pin, Some(&token), body);
    match tokio::time::timeout(ATTEMPT_TIMEOUT, posted).await {
        Ok(Ok(answer)) => match answer.code {
            200..=299 => Sent::Taken,
            409 => Sent::NotYet,
            // Busy (the budgets of token reviews) or not the active replica yet: worth another try.
            429 | 503 => Sent::Unreachable {
                message: answer.summary(),
                wrong_server: false,
                retry_after: answer.retry_after,
            },
            _ => Sent::Refused(answer.summary()),
        },
        Ok(Err(err @ (PostError::NotHttps(_) | PostError::NotAPin(_)))) => Sent::Refused(err.to_string()),
        // A server with another certificate (a standby that took the old active's address, or somebody else's):
        // nothing was sent to it, and the next status may name the right one.
        Ok(Err(err @ PostError::PinMismatch { .. })) => Sent::Unreachable {
            message: err.to_string(),
            wrong_server: true,
            retry_after: None,
        },
        Ok(Err(err)) => Sent::unreachable(err.to_string()),
        Err(_) => Sent::unreachable("no answer in time"),
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;

    use super::*;
    use crate::api::lock::ReleasingKey;
    use crate::api::{DistributedLockStatus, LockPhase};

    fn lock(shown: Option<i64>, releasing: Option<i64>) -> DistributedLock {
        let mut lock: DistributedLock = serde_json::from_value(serde_json::json!({
            "apiVersion": "redlock.io/v1beta1", "kind": "DistributedLock", "metadata": {"name": "web"},
            "spec": {"holder": {"leaderElection": {"selector": {}}}}
        }))
        .unwrap();
        let until = MicroTime(Timestamp::from_second(1_000).unwrap());
        lock.status = Some(DistributedLockStatus {
            phase: Some(if shown.is_some() {
                LockPhase::Held
            } else {
                LockPhase::Pending
            }),
            holder: shown.map(|_| "web-0".to_owned()),
            fencing_token: shown,
            valid_until: shown.map(|_| until.clone()),
            releasing: releasing
                .map(|token| ReleasingKey {
                    permit: 0,
                    holder: "web-0".into(),
                    fencing_token: token,
                    quorum: "default".into(),
                    key: "shop/web".into(),
                    release_at: until.clone(),
                })
                .into_iter()
                .collect(),
            hand_over_url: Some("https://10.0.0.5:8443/v1/stopped".into()),
            hand_over_certificate_sha256: Some("ab".repeat(32)),
            ..DistributedLockStatus::default()
        });
        lock
    }

    #[test]
    fn a_report_goes_only_for_a_grant_recorded_as_given_up() {
        assert_eq!(
            given_up(&lock(None, Some(7)), "web-0", 0, 7),
            GivenUp::ReportTo(Some(Destination {
                url: "https://10.0.0.5:8443/v1/stopped".into(),
                pin: Some("ab".repeat(32)),
            }))
        );
        assert_eq!(
            given_up(&lock(Some(7), None), "web-0", 0, 7),
            GivenUp::NotYet,
            "still the grant"
        );
        assert_eq!(given_up(&lock(None, None), "web-0", 0, 7), GivenUp::Released);
        assert_eq!(
            given_up(&lock(None, Some(8)), "web-0", 0, 7),
            GivenUp::Released,
            "a later grant's key waits, not this one's"
        );
        assert_eq!(
            given_up(&lock(None, Some(7)), "web-1", 0, 7),
            GivenUp::Released,
            "another pod's"
        );
    }

    fn term(token: i64, second: i64) -> Term {
        Term {
            permit: None,
            token,
            valid_until: Timestamp::from_second(second).unwrap(),
        }
    }

    #[test]
    fn a_report_is_tried_until_the_latest_validity_shown_for_its_grant_ends() {
        let at = |second| Timestamp::from_second(second).unwrap();
        // Status shows the grant until 1000: extended since it started with a validity ending at 990.
        let extended = lock(Some(7), None);
        assert_eq!(shown_until(Some(&extended), "web-0", &term(7, 990)), at(1_000));
        assert_eq!(
            shown_until(Some(&extended), "web-0", &term(6, 990)),
            at(990),
            "another grant's validity"
        );
        assert_eq!(
            shown_until(Some(&extended), "web-1", &term(7, 990)),
            at(990),
            "another holder's"
        );
        assert_eq!(shown_until(None, "web-0", &term(7, 990)), at(990));
        assert_eq!(
            shown_until(Some(&extended), "web-0", &term(7, 1_005)),
            at(1_005),
            "never before the grant's own"
        );
        let recorded = lock(None, Some(7));
        assert_eq!(release_time(&recorded, "web-0", 0, 7), Some(at(1_000)));
        assert_eq!(release_time(&recorded, "web-0", 0, 6), None);
        assert_eq!(release_time(&extended, "web-0", 0, 7), None);
    }
}
