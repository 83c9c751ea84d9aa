//! Whether a holder's report that its work has stopped is taken: a pure function of who the API server says sent
//! it, what the lock's status records and what the reporting pod is now, so every refusal is tested without a
//! cluster.
//!
//! A report lets a given-up key go at once instead of at the end of the validity shown to its holder, so a false
//! one would let two holders overlap. It is taken only when all of this holds:
//! - the sender is a pod (a service-account token bound to a pod, for our audience: `TokenReview`), and the lock
//!   is in that pod's namespace;
//! - status records the key of that permit as given up with that token (`status.releasing`): a current grant is
//!   never ended by a report, and a stale or unknown token is refused;
//! - the pod is the holder of that grant: the leader pod of that name, or a pod of the Job that held it created
//!   under that token and permit (its annotations) — a pod reports only for itself;
//! - the pod is the one the token was issued to (same uid), not a namesake created since;
//! - the work cannot start again under that token in that pod: status no longer shows the grant to its holder
//!   (`elect` and the guard start work only under a grant status shows, and a grant given up is never shown
//!   again), or the pod is terminating (the kubelet restarts no container of a pod being deleted).
//!
//! What is left to trust is the holder's own process: that `elect` or the guard reports only once the work it
//! supervised has exited (they do; a pod that lies about itself harms only its own lock, as a holder ignoring
//! its fence time would).

use k8s_openapi::api::authentication::v1::TokenReviewStatus;
use k8s_openapi::api::core::v1::Pod;

use crate::api::holder_contract::StoppedReport;
use crate::api::{DistributedLock, LockPhase};
use crate::controller::lock::handover::releasing;
use crate::controller::lock::policy::jobs::queue::GrantedPod;
use crate::controller::lock::status::permits::status_of;

/// The extra fields the API server puts into a pod-bound service-account token's user info.
const POD_NAME_EXTRA: &str = "authentication.kubernetes.io/pod-name";
const POD_UID_EXTRA: &str = "authentication.kubernetes.io/pod-uid";

/// The pod a report came from, as the API server vouches for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reporter {
    pub namespace: String,
    pub pod: String,
    pub uid: String,
}

/// A report taken: the permit's key given up with `token` may be released once its holder has stopped, and
/// `pod` (of that holder) has.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Taken {
    pub permit: u32,
    pub token: i64,
    /// The holder status records: the leader pod, or the Job.
    pub holder: String,
    pub pod: String,
}

/// A report refused: the HTTP status and why, for the reporter's log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refused {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
}

impl Refused {
    pub fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason,
            message: message.into(),
        }
    }
}

/// The pod a `TokenReview` answer names. Refused unless the token was authenticated for `audience` and is bound
/// to a pod.
pub fn reporter_of(review: Option<&TokenReviewStatus>, audience: &str) -> Result<Reporter, Refused> {
    let unauthorized = |message: &str| Refused::new(401, "Unauthorized", message);
    let review = review.ok_or_else(|| unauthorized("the API server did not review the token"))?;
    if review.authenticated != Some(true) {
        let why = review.error.as_deref().unwrap_or("not authenticated");
        return Err(unauthorized(&format!("the token was refused: {why}")));
    }
    if !review
        .audiences
        .iter()
        .flatten()
        .any(|granted| granted == audience)
    {
        return Err(unauthorized(&format!(
            "the token is not for the audience {audience}"
        )));
    }
    let user = review
        .user
        .as_ref()
        .ok_or_else(|| unauthorized("the review names no user"))?;
    let namespace = user
        .username
        .as_deref()
        .and_then(|name| name.strip_prefix("system:serviceaccount:"))
        .and_then(|rest| rest.split_once(':'))
        .map(|(namespace, _)| namespace.to_owned())
        .ok_or_else(|| unauthorized("the token is not a service account's"))?;
    let extra = |key: &str| {
        user.extra
            .as_ref()
            .and_then(|extra| extra.get(key))
            .and_then(|values| values.first())
            .filter(|value| !value.is_empty())
            .cloned()
    };
    let (Some(pod), Some(uid)) = (extra(POD_NAME_EXTRA), extra(POD_UID_EXTRA)) else {
        return Err(unauthorized(
            "the token is not bound to a pod (use a projected serviceAccountToken volume)",
        ));
    };
    Ok(Reporter { namespace, pod, uid })
}

/// Whether `report`, sent by `reporter`, is taken, given `lock` (read directly, in the reporter's namespace) and
/// the pod of that name as the API server has it now (`None`: gone).
pub fn judge(
    report: &StoppedReport,
    reporter: &Reporter,
    lock: &DistributedLock,
    pod: Option<&Pod>,
) -> Result<Taken, Refused> {
    let status = lock.status.as_ref();
    let entry = status
        .and_then(|status| releasing::recorded(status, report.permit))
        .filter(|entry| entry.fencing_token == report.fencing_token)
        .ok_or_else(|| {
            Refused::new(
                409,
                "NotGivenUp",
                format!(
                    "permit {} of {} is not waiting to be released with fencing token {}: the grant is current, \
                     stale or unknown",
                    report.permit, report.lock, report.fencing_token
                ),
            )
        })?;
    let pod = pod
        .filter(|pod| pod.metadata.uid.as_deref() == Some(reporter.uid.as_str()))
        .ok_or_else(|| {
            Refused::new(
                403,
                "NotThePod",
                format!("pod {} is not the pod the token was issued to", reporter.pod),
            )
        })?;
    let of_holder = if lock.spec.holder.leader_election.is_some() {
        entry.holder == reporter.pod
    } else if lock.spec.holder.jobs.is_some() {
        GrantedPod::of(pod, &report.lock).is_some_and(|granted| {
            granted.job.as_deref() == Some(entry.holder.as_str())
                && granted.token == Some(report.fencing_token)
                && granted.permit == report.permit
        })
    } else {
        return Err(Refused::new(
            422,
            "NoPodHolder",
            format!("{} is not held by pods: nothing can report for it", report.lock),
        ));
    };
    if !of_holder {
        return Err(Refused::new(
            403,
            "NotTheHolder",
            format!(
                "pod {} is not {} of permit {} with fencing token {}: a pod reports only for itself",
                reporter.pod, entry.holder, report.permit, report.fencing_token
            ),
        ));
    }
    let permit_status = status_of(lock, report.permit);
    let still_shown = permit_status.phase == Some(LockPhase::Held)
        && permit_status.holder.as_deref() == Some(entry.holder.as_str())
        && permit_status.fencing_token == Some(report.fencing_token);
    let terminating = pod.metadata.deletion_timestamp.is_some();
    // A lock being deleted is no holder's term any more (`elect` and the guard stop at its deletion and never
    // start again under it), so its status still showing the grant cannot start the work again.
    let lock_deleted = lock.metadata.deletion_timestamp.is_some();
    if still_shown && !terminating && !lock_deleted {
        return Err(Refused::new(
            409,
            "StillShown",
            format!(
                "status still shows fencing token {} to {}: the work could start again under it",
                report.fencing_token, entry.holder
            ),
        ));
    }
    Ok(Taken {
        permit: report.permit,
        token: report.fencing_token,
        holder: entry.holder.clone(),
        pod: reporter.pod.clone(),
    })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::api::authentication::v1::UserInfo;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, Time};
    use k8s_openapi::jiff::Timestamp;

    use super::*;
    use crate::api::DistributedLockStatus;
    use crate::api::lock::ReleasingKey;

    fn at(second: i64) -> MicroTime {
        MicroTime(Timestamp::from_second(second).unwrap())
    }

    fn lock(holder_kind: &str, shown: Option<(&str, i64)>, given_up: Option<(&str, i64)>) -> DistributedLock {
        let mut lock: DistributedLock = serde_json::from_value(serde_json::json!({
            "apiVersion": "redlock.io/v1beta1", "kind": "DistributedLock",
            "metadata": {"name": "web", "namespace": "shop"},
            "spec": {"holder": {holder_kind: {"selector": {}}}}
        }))
        .unwrap();
        lock.status = Some(DistributedLockStatus {
            phase: Some(if shown.is_some() {
                LockPhase::Held
            } else {
                LockPhase::Pending
            }),
            holder: shown.map(|(holder, _)| holder.to_owned()),
            fencing_token: shown.map(|(_, token)| token),
            valid_until: shown.map(|_| at(1_000)),
            releasing: given_up
                .map(|(holder, token)| ReleasingKey {
                    permit: 0,
                    holder: holder.into(),
                    fencing_token: token,
                    quorum: "default".into(),
                    key: "shop/web".into(),
                    release_at: at(1_000),
                })
                .into_iter()
                .collect(),
            ..DistributedLockStatus::default()
        });
        lock
    }

    fn pod(name: &str, uid: &str, terminating: bool, grant: Option<(&str, i64)>) -> Pod {
        let mut pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "shop", "uid": uid}
        }))
        .unwrap();
        if terminating {
            pod.metadata.deletion_timestamp = Some(Time(Timestamp::from_second(900).unwrap()));
        }
        if let Some((job, token)) = grant {
            pod.metadata.annotations = Some(BTreeMap::from([
                ("redlock.io/lock".to_owned(), "web".to_owned()),
                ("redlock.io/fencing-token".to_owned(), token.to_string()),
            ]));
            pod.metadata.owner_references = Some(vec![
                serde_json::from_value(serde_json::json!({
                    "apiVersion": "batch/v1", "kind": "Job", "name": job, "uid": "job-uid"
                }))
                .unwrap(),
            ]);
        }
        pod
    }

    fn reporter(pod: &str, uid: &str) -> Reporter {
        Reporter {
            namespace: "shop".into(),
            pod: pod.into(),
            uid: uid.into(),
        }
    }

    fn report(token: i64) -> StoppedReport {
        StoppedReport {
            lock: "web".into(),
            permit: 0,
            fencing_token: token,
        }
    }

    #[test]
    fn a_leader_that_stopped_after_its_key_was_given_up_is_taken() {
        let given_up = lock("leaderElection", Some(("web-1", 8)), Some(("web-0", 7)));
        let taken = judge(
            &report(7),
            &reporter("web-0", "u0"),
            &given_up,
            Some(&pod("web-0", "u0", false, None)),
        );
        assert_eq!(
            taken,
            Ok(Taken {
                permit: 0,
                token: 7,
                holder: "web-0".into(),
                pod: "web-0".into()
            })
        );
    }

    #[test]
    fn a_report_for_another_pod_or_another_token_is_refused() {
        let given_up = lock("leaderElection", None, Some(("web-0", 7)));
        let from_other = judge(
            &report(7),
            &reporter("web-1", "u1"),
            &given_up,
            Some(&pod("web-1", "u1", false, None)),
        );
        assert_eq!(from_other.map_err(|refused| refused.reason), Err("NotTheHolder"));
        let stale = judge(
            &report(6),
            &reporter("web-0", "u0"),
            &given_up,
            Some(&pod("web-0", "u0", false, None)),
        );
        assert_eq!(stale.map_err(|refused| refused.code), Err(409));
        let other_permit = StoppedReport {
            permit: 1,
            ..report(7)
        };
        let refused = judge(
            &other_permit,
            &reporter("web-0", "u0"),
            &given_up,
            Some(&pod("web-0", "u0", false, None)),
        );
        assert_eq!(refused.map_err(|refused| refused.reason), Err("NotGivenUp"));
    }

    #[test]
    fn a_current_grant_is_never_ended_by_a_report() {
        let held = lock("leaderElection", Some(("web-0", 7)), None);
        let refused = judge(
            &report(7),
            &reporter("web-0", "u0"),
            &held,
            Some(&pod("web-0", "u0", false, None)),
        );
        assert_eq!(refused.map_err(|refused| refused.reason), Err("NotGivenUp"));
    }

    #[test]
    fn a_grant_still_shown_is_taken_only_from_a_terminating_pod_or_for_a_lock_being_deleted() {
        // Given up, with the status write that stops showing it still to come: a container restarted now would
        // start the work again under the token, unless the pod is being deleted.
        let between_writes = lock("leaderElection", Some(("web-0", 7)), Some(("web-0", 7)));
        let running = judge(
            &report(7),
            &reporter("web-0", "u0"),
            &between_writes,
            Some(&pod("web-0", "u0", false, None)),
        );
        assert_eq!(running.map_err(|refused| refused.reason), Err("StillShown"));
        let terminating = judge(
            &report(7),
            &reporter("web-0", "u0"),
            &between_writes,
            Some(&pod("web-0", "u0", true, None)),
        );
        assert!(terminating.is_ok());
        let mut deleting = between_writes.clone();
        deleting.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
        ));
        let lock_deleted = judge(
            &report(7),
            &reporter("web-0", "u0"),
            &deleting,
            Some(&pod("web-0", "u0", false, None)),
        );
        assert!(lock_deleted.is_ok(), "a lock being deleted shows no term");
    }

    #[test]
    fn a_namesake_pod_or_a_gone_one_cannot_report() {
        let given_up = lock("leaderElection", None, Some(("web-0", 7)));
        let namesake = judge(
            &report(7),
            &reporter("web-0", "old-uid"),
            &given_up,
            Some(&pod("web-0", "new-uid", false, None)),
        );
        assert_eq!(namesake.map_err(|refused| refused.reason), Err("NotThePod"));
        let gone = judge(&report(7), &reporter("web-0", "u0"), &given_up, None);
        assert_eq!(gone.map_err(|refused| refused.reason), Err("NotThePod"));
    }

    #[test]
    fn a_job_pod_reports_only_for_its_own_grant() {
        let given_up = lock("jobs", None, Some(("report", 4)));
        let own = judge(
            &report(4),
            &reporter("report-abc", "u"),
            &given_up,
            Some(&pod("report-abc", "u", true, Some(("report", 4)))),
        );
        assert_eq!(own.map(|taken| taken.holder), Ok("report".to_owned()));
        let earlier_grant = judge(
            &report(4),
            &reporter("report-old", "u"),
            &given_up,
            Some(&pod("report-old", "u", true, Some(("report", 3)))),
        );
        assert_eq!(
            earlier_grant.map_err(|refused| refused.reason),
            Err("NotTheHolder")
        );
        let other_job = judge(
            &report(4),
            &reporter("other-abc", "u"),
            &given_up,
            Some(&pod("other-abc", "u", true, Some(("other", 4)))),
        );
        assert_eq!(other_job.map_err(|refused| refused.reason), Err("NotTheHolder"));
    }

    fn review(authenticated: bool, audience: &str, user: &str, extra: &[(&str, &str)]) -> TokenReviewStatus {
        TokenReviewStatus {
            authenticated: Some(authenticated),
            audiences: Some(vec![audience.into()]),
            user: Some(UserInfo {
                username: Some(user.into()),
                extra: Some(
                    extra
                        .iter()
                        .map(|(key, value)| ((*key).to_owned(), vec![(*value).to_owned()]))
                        .collect(),
                ),
                ..UserInfo::default()
            }),
            error: None,
        }
    }

    #[test]
    fn only_a_pod_bound_token_for_our_audience_names_a_reporter() {
        let bound = [(POD_NAME_EXTRA, "web-0"), (POD_UID_EXTRA, "u0")];
        let user = "system:serviceaccount:shop:web";
        assert_eq!(
            reporter_of(
                Some(&review(true, "redlock-operator", user, &bound)),
                "redlock-operator"
            ),
            Ok(reporter("web-0", "u0"))
        );
        for (status, why) in [
            (
                review(false, "redlock-operator", user, &bound),
                "not authenticated",
            ),
            (
                review(true, "https://kubernetes.default.svc", user, &bound),
                "the API server's audience",
            ),
            (review(true, "redlock-operator", user, &[]), "not bound to a pod"),
            (
                review(true, "redlock-operator", "alice", &bound),
                "not a service account",
            ),
        ] {
            assert_eq!(
                reporter_of(Some(&status), "redlock-operator").map_err(|refused| refused.code),
                Err(401),
                "{why}"
            );
        }
        assert!(reporter_of(None, "redlock-operator").is_err());
    }
}
