//! The lock shows whether its holders reach the operator (`holder_liveness::rule`): at every look at a held
//! leader or Job lock, each grant status shows is judged from the asks this replica answered, the condition
//! `HolderReachesOperator` written where it changed, and an Event published when a holder falls silent or is
//! heard again. Only the active replica writes (checked at the write) and only it is asked.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::core::Selector;
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use tokio::time::Instant;

use crate::api::conditions::{self, Update};
use crate::api::{DistributedLock, DistributedLockStatus, LockPhase};
use crate::controller::cache::pod_index::pods_selected;
use crate::controller::error::Error;
use crate::controller::keeper::PermitRef;
use crate::controller::lock::controller_state::LockContext;
use crate::controller::lock::holder_liveness::rule::{self, Bounds, Grant, Silence};
use crate::controller::lock::policy::Policy;
use crate::controller::lock::status::write::{stamp_now, write_latest_status};

/// The label the chart's injection wraps a leader pod by (`elect`).
const ELECT_LABEL: &str = "redlock.io/elect";
/// The label the chart's injection wraps a Job by (the guard).
const GUARD_LABEL: &str = "redlock.io/guard";
/// The label the Job controller puts on a Job's pods.
const JOB_NAME_LABEL: &str = "batch.kubernetes.io/job-name";

/// Judges the holders status shows and writes what changed; `Some(wait)`: look at the lock again that soon for
/// the verdict to change by time alone.
pub async fn follow(
    ctx: &LockContext,
    lock: &DistributedLock,
    policy: &Policy,
    ttl: Duration,
) -> Result<Option<Duration>, Error> {
    let lref = ObjectRef::from_obj(lock);
    let asks = &ctx.lock_controller.asks;
    let leader = match policy {
        Policy::Leader(_) => true,
        Policy::Jobs(_) => false,
        Policy::Identity(_) => {
            asks.keep_only(&lref, &[]);
            return Ok(None);
        }
    };
    // Without a reports port holders have nobody to ask (they stop by the wall clock): nothing to judge.
    let Some(reports_at) = ctx.lock_controller.hand_over_url.as_deref().and_then(authority) else {
        asks.keep_only(&lref, &[]);
        return Ok(None);
    };
    let namespace = lock.namespace().unwrap_or_default();
    let bounds = Bounds::for_ttl(ttl);
    let stamp = stamp_now(lock);
    let term = ctx.leadership.term();
    let mut outcome = None;
    write_latest_status(ctx, lock, |current| {
        let now = Instant::now();
        let grants = shown_grants(current);
        let permits: Vec<u32> = grants.iter().map(|(permit, _, _)| *permit).collect();
        asks.keep_only(&lref, &permits);
        let judged: Vec<(Grant, Silence, Option<Duration>)> = grants
            .iter()
            .map(|(permit, holder, token)| {
                let (grant, running) = if leader {
                    leader_grant(ctx, &namespace, holder, *token)
                } else {
                    job_grant(ctx, &namespace, holder, *token)
                };
                let record = asks.look(
                    &PermitRef::new(lref.clone(), *permit),
                    (*token, term),
                    running,
                    now,
                );
                // A holder whose pod is not running is not asked of: the policy deals with a pod gone.
                let silence = if running {
                    rule::judge(&record, grant.expected, bounds, now)
                } else {
                    Silence::Waiting { check_in: None }
                };
                // A leader silent until the validity told to it ends is moved off then (the election skips it).
                let moves_in = if leader && running {
                    rule::silence_ends_in(&record, now)
                } else {
                    None
                };
                (grant, silence, moves_in)
            })
            .collect();
        let check_in = judged
            .iter()
            .filter_map(|(_, silence, moves_in)| silence.check_in().into_iter().chain(*moves_in).min())
            .min();
        let judged: Vec<(Grant, Silence)> = judged
            .into_iter()
            .map(|(grant, silence, _)| (grant, silence))
            .collect();
        let update = rule::condition(&judged, Some(reports_at));
        let before = current
            .conditions
            .iter()
            .find(|condition| condition.type_ == rule::CONDITION)
            .map(|condition| (condition.status == "True", condition.message.clone()));
        let mut next = current.clone();
        match &update {
            Some(update) => conditions::set(&mut next.conditions, update.clone(), stamp),
            None => next
                .conditions
                .retain(|condition| condition.type_ != rule::CONDITION),
        }
        outcome = Some((update, before, check_in));
        Some(next)
    })
    .await?;
    let Some((update, before, check_in)) = outcome else {
        return Ok(None);
    };
    if let Some(update) = update {
        publish_change(ctx, lock, &update, before).await;
    }
    Ok(check_in)
}

/// A Warning when a holder falls silent (or another one does), a Normal Event when every holder is heard again.
async fn publish_change(
    ctx: &LockContext,
    lock: &DistributedLock,
    update: &Update,
    before: Option<(bool, String)>,
) {
    match (update.status, before) {
        (false, Some((false, message))) if message == update.message => {}
        (false, _) => {
            tracing::warn!(lock = %ObjectRef::from_obj(lock), message = %update.message, "a holder does not reach the operator");
            ctx.publish(lock, EventType::Warning, rule::NOT_ASKING, update.message.clone())
                .await;
        }
        (true, Some((false, _))) => {
            ctx.publish(
                lock,
                EventType::Normal,
                rule::ASKING,
                "every holder shown asks the active replica again".to_owned(),
            )
            .await;
        }
        (true, _) => {}
    }
}

/// `(permit, holder, token)` of each grant status shows held.
fn shown_grants(status: &DistributedLockStatus) -> Vec<(u32, String, i64)> {
    if status.phase != Some(LockPhase::Held) {
        return Vec::new();
    }
    if !status.holders.is_empty() {
        return status
            .holders
            .iter()
            .filter_map(|held| {
                Some((
                    u32::try_from(held.permit).ok()?,
                    held.holder.clone(),
                    held.fencing_token,
                ))
            })
            .collect();
    }
    match (&status.holder, status.fencing_token) {
        (Some(holder), Some(token)) => vec![(0, holder.clone(), token)],
        _ => Vec::new(),
    }
}

/// The leader pod as the rule sees it, and whether it runs.
fn leader_grant(ctx: &LockContext, namespace: &str, pod: &str, token: i64) -> (Grant, bool) {
    let found = ctx.pods.get(&ObjectRef::new(pod).within(namespace));
    let expected = found
        .as_deref()
        .is_some_and(|pod| pod.labels().contains_key(ELECT_LABEL));
    let running = found.as_deref().is_some_and(is_running);
    let grant = Grant {
        who: format!("the leader pod {namespace}/{pod}"),
        token,
        helper: "elect",
        expected,
    };
    (grant, running)
}

/// The granted Job as the rule sees it, and whether a pod of it runs.
fn job_grant(ctx: &LockContext, namespace: &str, job: &str, token: i64) -> (Grant, bool) {
    let expected = ctx
        .jobs
        .get(&ObjectRef::new(job).within(namespace))
        .is_some_and(|job| job.labels().contains_key(GUARD_LABEL));
    let required = [(JOB_NAME_LABEL.to_owned(), job.to_owned())]
        .into_iter()
        .collect();
    let running = pods_selected(
        &ctx.pods,
        &ctx.pod_index,
        namespace,
        &required,
        &Selector::default(),
    )
    .iter()
    .any(|pod| is_running(pod));
    let grant = Grant {
        who: format!("the pod of Job {namespace}/{job}"),
        token,
        helper: "guard",
        expected,
    };
    (grant, running)
}

fn is_running(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_none()
        && pod.status.as_ref().and_then(|status| status.phase.as_deref()) == Some("Running")
}

/// `host:port` of an https URL.
fn authority(url: &str) -> Option<&str> {
    let rest = url.strip_prefix("https://")?;
    let end = rest.find('/').unwrap_or(rest.len());
    Some(&rest[..end]).filter(|authority| !authority.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reports_address_is_the_urls_authority() {
        assert_eq!(
            authority("https://10.0.0.5:8443/v1/stopped"),
            Some("10.0.0.5:8443")
        );
        assert_eq!(authority("https://[::1]:8443/v1/stopped"), Some("[::1]:8443"));
        assert_eq!(authority("http://10.0.0.5:8443/"), None);
        assert_eq!(authority("https:///x"), None);
    }
}
