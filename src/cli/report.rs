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

// The `http` types of kube's client (axum re-exports the same crate).
use axum::http::{Request, Uri, header};
use k8s_openapi::jiff::Timestamp;
use tokio::sync::watch;
use tokio::time::Instant;

use super::term::Term;
use crate::api::DistributedLock;
use crate::api::holder_contract::StoppedReport;

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
/// validity shown has ended (the operator releases the key then anyway), the lock is gone, or the operator
/// refuses the report for good.
pub async fn report_stopped(
    reporter: &Reporter<'_>,
    term: &Term,
    mut latest: watch::Receiver<Option<Arc<DistributedLock>>>,
) {
    let permit = term.permit.unwrap_or(0);
    let left = Duration::try_from(term.valid_until.duration_since(Timestamp::now())).unwrap_or_default();
    let deadline = Instant::now() + left;
    let report = StoppedReport {
        lock: reporter.lock.to_owned(),
        permit,
        fencing_token: term.token,
    };
    loop {
        let seen = latest.borrow_and_update().clone();
        let Some(lock) = seen else {
            return;
        };
        match given_up(&lock, reporter.holder, permit, term.token) {
            GivenUp::Released => return,
            GivenUp::NotYet => {}
            GivenUp::ReportTo(None) => {
                eprintln!(
                    "redlock-operator {}: the operator takes no reports (no status.handOverUrl): the key goes when the validity shown ends",
                    reporter.tool
                );
                return;
            }
            GivenUp::ReportTo(Some(url)) => match send(reporter, &url, &report).await {
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
                Sent::Unreachable(message) => {
                    tracing::debug!(%message, "the operator could not be reached; trying again");
                    tokio::select! {
                        () = tokio::time::sleep(RETRY_PAUSE) => continue,
                        () = tokio::time::sleep_until(deadline) => return,
                    }
                }
            },
        }
        tokio::select! {
            changed = latest.changed() => if changed.is_err() { return },
            () = tokio::time::sleep_until(deadline) => return,
        }
    }
}

/// [`report_stopped`], cut short by a SIGTERM or SIGINT that comes while it waits (one that came before, and was
/// passed on to the command, does not count: the listeners are new).
pub(crate) async fn report_stopped_unless_signalled(
    reporter: &Reporter<'_>,
    term: &Term,
    latest: watch::Receiver<Option<Arc<DistributedLock>>>,
) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut sigterm), Ok(mut sigint)) =
        (signal(SignalKind::terminate()), signal(SignalKind::interrupt()))
    else {
        return report_stopped(reporter, term, latest).await;
    };
    tokio::select! {
        () = report_stopped(reporter, term, latest) => {}
        _ = sigterm.recv() => {}
        _ = sigint.recv() => {}
    }
}

#[derive(Debug, PartialEq, Eq)]
enum GivenUp {
    /// Status records the key as given up: report to this address (`None`: the operator takes no reports).
    ReportTo(Option<String>),
    /// Still shown as the grant, or not recorded yet.
    NotYet,
    /// Neither shown nor waiting: the key was released already (or taken over).
    Released,
}

/// Whether `lock`'s status records the key of `permit` given up by `holder` with `token`. Pure.
fn given_up(lock: &DistributedLock, holder: &str, permit: u32, token: i64) -> GivenUp {
    let Some(status) = lock.status.as_ref() else {
        return GivenUp::NotYet;
    };
    let waiting = status.releasing.iter().any(|entry| {
        u32::try_from(entry.permit).ok() == Some(permit)
            && entry.holder == holder
            && entry.fencing_token == token
    });
    if waiting {
        return GivenUp::ReportTo(status.hand_over_url.clone());
    }
    let shown = super::term::term_of(lock, holder)
        .is_some_and(|term| term.token == token && term.permit.unwrap_or(0) == permit);
    if shown { GivenUp::NotYet } else { GivenUp::Released }
}

enum Sent {
    Taken,
    NotYet,
    Refused(String),
    Unreachable(String),
}

async fn send(reporter: &Reporter<'_>, url: &str, report: &StoppedReport) -> Sent {
    let token = match std::fs::read_to_string(reporter.token_file) {
        Ok(token) => token.trim().to_owned(),
        Err(err) => {
            return Sent::Refused(format!(
                "no service-account token at {} ({err}): mount a projected serviceAccountToken with audience redlock-operator there",
                reporter.token_file.display()
            ));
        }
    };
    let Some((base, path)) = split_url(url) else {
        return Sent::Refused(format!("status.handOverUrl {url:?} is not an http(s) URL"));
    };
    // kube's client is a plain HTTP(S) client once it has no credentials of its own: no second one is built in.
    let client = match kube::Client::try_from(kube::Config::new(base)) {
        Ok(client) => client,
        Err(err) => return Sent::Unreachable(err.to_string()),
    };
    let body = match serde_json::to_vec(report) {
        Ok(body) => body,
        Err(err) => return Sent::Refused(err.to_string()),
    };
    let request = Request::post(path)
        .header(header::AUTHORIZATION, format!("Bearer {token}"))
        .header(header::CONTENT_TYPE, "application/json")
        .body(body);
    let request = match request {
        Ok(request) => request,
        Err(err) => return Sent::Refused(err.to_string()),
    };
    match tokio::time::timeout(ATTEMPT_TIMEOUT, client.request_text(request)).await {
        Ok(Ok(_)) => Sent::Taken,
        Ok(Err(kube::Error::Api(status))) => match (status.code, status.reason.as_str()) {
            (409, _) => Sent::NotYet,
            (503, _) => Sent::Unreachable(status.message.clone()),
            _ => Sent::Refused(format!("{} ({})", status.message, status.reason)),
        },
        Ok(Err(err)) => Sent::Unreachable(err.to_string()),
        Err(_) => Sent::Unreachable("no answer in time".into()),
    }
}

/// `http://host:port/v1/stopped` as kube's client takes it: the base (scheme and authority) and the path.
fn split_url(url: &str) -> Option<(Uri, String)> {
    let parsed = url::Url::parse(url).ok()?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return None;
    }
    let base: Uri = parsed.origin().ascii_serialization().parse().ok()?;
    Some((base, parsed.path().to_owned()))
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;

    use super::*;
    use crate::api::lock::ReleasingKey;
    use crate::api::{DistributedLockStatus, LockPhase};

    fn lock(shown: Option<i64>, releasing: Option<i64>) -> DistributedLock {
        let mut lock: DistributedLock = serde_json::from_value(serde_json::json!({
            "apiVersion": "redlock.io/v1alpha1", "kind": "DistributedLock", "metadata": {"name": "web"},
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
            hand_over_url: Some("http://10.0.0.5:8080/v1/stopped".into()),
            ..DistributedLockStatus::default()
        });
        lock
    }

    #[test]
    fn a_report_goes_only_for_a_grant_recorded_as_given_up() {
        assert_eq!(
            given_up(&lock(None, Some(7)), "web-0", 0, 7),
            GivenUp::ReportTo(Some("http://10.0.0.5:8080/v1/stopped".into()))
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

    #[test]
    fn the_address_splits_into_what_kubes_client_takes() {
        let (base, path) = split_url("http://10.0.0.5:8080/v1/stopped").unwrap();
        assert_eq!(base.to_string(), "http://10.0.0.5:8080/");
        assert_eq!(path, "/v1/stopped");
        assert!(split_url("ftp://10.0.0.5/v1/stopped").is_none());
        assert!(split_url("not a url").is_none());
    }
}
