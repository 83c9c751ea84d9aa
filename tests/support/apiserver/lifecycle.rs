//! Deletion: finalizers and deletionTimestamp, graceful pod deletion and the sweep that plays the kubelet's
//! final delete when a pod's grace period is over.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use serde_json::{Value, json};
use tokio::time::Instant;

use super::errors::{ApiError, ApiResult, bad_json};
use super::kinds::{Kind, Special, kind_of};
use super::meta::{
    finalizers, generation, grace_period, is_deleting, meta_mut, name_of, namespace_of, next_generation, now,
    pod_finished, timestamp, uid_of,
};
use super::routes::Query;
use super::store::{EventType, GracefulPod, State};
use super::write::update;

/// A year: longer grace periods are stored as requested but finish after this.
const LONGEST_GRACE_PERIOD: i64 = 365 * 86_400;

#[derive(Debug, Default)]
pub(super) struct DeleteOptions {
    grace_period: Option<i64>,
}

impl DeleteOptions {
    /// `gracePeriodSeconds=0`: the kubelet's final delete, and the force delete of controllers.
    pub fn immediate() -> Self {
        DeleteOptions {
            grace_period: Some(0),
        }
    }

    pub fn parse(query: &Query, body: &[u8]) -> ApiResult<Self> {
        let mut options = DeleteOptions::default();
        if !body.is_empty() {
            let body: Value = serde_json::from_slice(body).map_err(bad_json)?;
            if body
                .get("dryRun")
                .and_then(Value::as_array)
                .is_some_and(|d| !d.is_empty())
            {
                return Err(ApiError::unsupported("dryRun"));
            }
            if body.get("preconditions").is_some_and(|p| !p.is_null()) {
                return Err(ApiError::unsupported("DeleteOptions.preconditions"));
            }
            options.grace_period = body.get("gracePeriodSeconds").and_then(Value::as_i64);
        }
        if let Some(grace) = query.number("gracePeriodSeconds")? {
            options.grace_period = Some(grace);
        }
        Ok(options)
    }
}

pub(super) enum Deleted {
    /// Still there: deletion pending on finalizers or a grace period.
    Kept(Arc<Value>),
    /// Gone; the last stored content.
    Removed(Arc<Value>),
}

impl Deleted {
    pub fn into_object(self) -> Arc<Value> {
        match self {
            Deleted::Kept(object) | Deleted::Removed(object) => object,
        }
    }
}

/// The answer to a DELETE: the object while it stays, else the object or a Status, as the kind's store does.
pub(super) fn delete_reply(kind: &Kind, outcome: &Deleted) -> Value {
    match outcome {
        Deleted::Kept(object) => (**object).clone(),
        Deleted::Removed(object) if kind.returns_deleted => (**object).clone(),
        Deleted::Removed(object) => {
            // The generic store's answer; `kind` carries the resource, as in the real server.
            let mut details = ApiError::details(kind, name_of(object), kind.plural);
            details.insert("uid".into(), uid_of(object).into());
            json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "details": details})
        }
    }
}

pub(super) fn delete(
    state: &mut State,
    kind: &'static Kind,
    namespace: &str,
    name: &str,
    options: &DeleteOptions,
) -> ApiResult<Deleted> {
    // Both need a controller the test server does not run (namespace lifecycle, CRD instance cleanup).
    if matches!(kind.special, Special::Namespace | Special::Crd) {
        return Err(ApiError::method_not_allowed(format!(
            "deleting {} is not supported by the test API server",
            kind.plural
        )));
    }
    let old = state
        .get(kind, namespace, name)
        .ok_or_else(|| ApiError::not_found(kind, name))?;
    if kind.special == Special::Pod {
        let period = pod_grace_period(&old, options.grace_period);
        if period > 0 {
            return Ok(Deleted::Kept(delete_gracefully(state, kind, &old, period)));
        }
    }
    if !finalizers(&old).is_empty() {
        return Ok(Deleted::Kept(mark_deleting(state, kind, &old)));
    }
    state.commit(kind, EventType::Deleted, (*old).clone(), Some(old.clone()));
    Ok(Deleted::Removed(old))
}

/// The pod strategy's CheckGracefulDelete: the requested period, else terminationGracePeriodSeconds (30 by
/// defaulting); 0 for pods never scheduled or already finished, and for pods whose grace period is over.
fn pod_grace_period(pod: &Value, requested: Option<i64>) -> i64 {
    if is_deleting(pod) && grace_period(pod) == Some(0) {
        return 0;
    }
    let default = pod
        .pointer("/spec/terminationGracePeriodSeconds")
        .and_then(Value::as_i64)
        .unwrap_or(30);
    let scheduled = pod
        .pointer("/spec/nodeName")
        .and_then(Value::as_str)
        .is_some_and(|n| !n.is_empty());
    let finished = pod_finished(pod);
    match requested.unwrap_or(default) {
        _ if !scheduled || finished => 0,
        period if period < 0 => 1,
        period => period,
    }
}

/// Sets deletionTimestamp `period` seconds ahead; only a shorter period changes a deletion in progress. The
/// sweep finishes the deletion when the period is over, as the kubelet would.
fn delete_gracefully(state: &mut State, kind: &'static Kind, old: &Arc<Value>, period: i64) -> Arc<Value> {
    if is_deleting(old) && grace_period(old).is_some_and(|current| current <= period) {
        return old.clone();
    }
    let mut new = (**old).clone();
    let first = !is_deleting(old);
    let metadata = meta_mut(&mut new);
    // A period is any i64 a client sends; the timers need a bounded one.
    let wait = period.clamp(0, LONGEST_GRACE_PERIOD);
    let deadline = Timestamp::now() + SignedDuration::from_secs(wait);
    metadata.insert("deletionTimestamp".into(), timestamp(deadline).into());
    metadata.insert("deletionGracePeriodSeconds".into(), period.into());
    if first && generation(old) > 0 {
        metadata.insert("generation".into(), next_generation(old).into());
    }
    let stored = state.commit(kind, EventType::Modified, new, Some(old.clone()));
    state.graceful.push(GracefulPod {
        deadline: Instant::now() + Duration::from_secs(wait.unsigned_abs()),
        namespace: namespace_of(old).to_owned(),
        name: name_of(old).to_owned(),
        uid: uid_of(old).to_owned(),
    });
    stored
}

/// The store's markAsDeleting: deletionTimestamp now (or earlier), grace period 0, generation bumped once.
fn mark_deleting(state: &mut State, kind: &'static Kind, old: &Arc<Value>) -> Arc<Value> {
    let mut new = (**old).clone();
    let now = now();
    let metadata = meta_mut(&mut new);
    if !is_deleting(old) && generation(old) > 0 {
        metadata.insert("generation".into(), next_generation(old).into());
    }
    // RFC 3339 in UTC with whole seconds: comparing the strings compares the times.
    let later = metadata
        .get("deletionTimestamp")
        .and_then(Value::as_str)
        .is_none_or(|current| current > now.as_str());
    if later {
        metadata.insert("deletionTimestamp".into(), now.into());
    }
    metadata.insert("deletionGracePeriodSeconds".into(), 0.into());
    if new == **old {
        return old.clone();
    }
    state.commit(kind, EventType::Modified, new, Some(old.clone()))
}

/// The kubelet's final deletion of the pods whose grace period is over.
pub(super) fn sweep(state: &mut State) {
    let now = Instant::now();
    let (due, pending): (Vec<_>, Vec<_>) = std::mem::take(&mut state.graceful)
        .into_iter()
        .partition(|pod| pod.deadline <= now);
    state.graceful = pending;
    let pods = kind_of(Special::Pod);
    for pod in due {
        let Some(current) = state
            .get(pods, &pod.namespace, &pod.name)
            .filter(|current| uid_of(current) == pod.uid && is_deleting(current))
        else {
            continue;
        };
        // Since 1.27 the kubelet moves a deleted pod to a terminal phase once its containers have stopped, before
        // its final delete: the last state a watch shows of a pod that stopped is a finished one.
        if !pod_finished(&current) {
            let mut ended = (*current).clone();
            if let Some(status) = ended
                .as_object_mut()
                .map(|object| object.entry("status").or_insert_with(|| json!({})))
                .and_then(Value::as_object_mut)
            {
                status.insert("phase".into(), "Failed".into());
            }
            // A status write, as the kubelet's: nothing but status changes.
            if update(state, pods, true, &current, ended).is_err() {
                continue;
            }
        }
        let _ = delete(
            state,
            pods,
            &pod.namespace,
            &pod.name,
            &DeleteOptions::immediate(),
        );
    }
}
