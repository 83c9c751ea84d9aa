//! The one function that writes a `DistributedLock`'s status.

use std::borrow::Cow;
use std::sync::Arc;

use kube::api::{Api, PostParams};
use kube::core::Request;
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use serde::Serialize;

use super::permits::fold_permits;
use crate::api::conditions::Stamp;
use crate::api::{DistributedLock, DistributedLockStatus, LockPhase};
use crate::controller::error::{Error, is_conflict};
use crate::controller::lock::controller_state::LockContext;
use crate::controller::lock::permit_count::is_semaphore;
use k8s_openapi::jiff::Timestamp;

/// Replaces the status with what `edit` makes of the current one, with the resourceVersion it was read at as a
/// precondition; on a conflict it reads the object again and asks `edit` again. `status.held` and
/// `status.handOverUrl` are set here. `edit` returning `None` means the
/// write no longer applies: `Ok(false)`. An edit that changes nothing writes nothing: `Ok(true)`.
///
/// A held lock's status is refreshed every other extension: with 10,000 held locks, encoding the whole object
/// and decoding the API server's answer were most of the operator's CPU. So the body is only what a status
/// write reads (the status, and the name and resourceVersion it applies to; the API server takes nothing else
/// from a custom resource's status write), and the answer is not decoded (the watch brings the new object).
pub async fn write_status(
    ctx: &LockContext,
    lock: &DistributedLock,
    edit: impl FnMut(&DistributedLockStatus) -> Option<DistributedLockStatus>,
) -> Result<bool, Error> {
    Ok(write_status_from(ctx, lock, edit).await?.is_some())
}

/// [`write_status`], returning the lock as the write left it (`None`: the edit no longer applied), its
/// resourceVersion read from the answer: a write that follows in the same reconciliation starts from it rather
/// than conflict with it.
async fn write_status_from(
    ctx: &LockContext,
    lock: &DistributedLock,
    mut edit: impl FnMut(&DistributedLockStatus) -> Option<DistributedLockStatus>,
) -> Result<Option<DistributedLock>, Error> {
    let name = lock.name_any();
    let namespace = lock.namespace().unwrap_or_default();
    let api: Api<DistributedLock> = Api::namespaced(ctx.client.clone(), &namespace);
    let requests = Request::new(DistributedLock::url_path(&(), Some(&namespace)));
    let mut current = Cow::Borrowed(lock);
    for _ in 0..4 {
        let before = current.status.as_ref().unwrap_or(DistributedLockStatus::none());
        let Some(mut next) = edit(before) else {
            return Ok(None);
        };
        // Every write shows the `Held` column's count, whichever edit made it. A lock that is plain again (its
        // permits above 1 given up after spec.permits was lowered to 1) shows its holder at the top only.
        if !is_semaphore(&current) {
            next.holders.clear();
        }
        next.held = Some(held_count(&next, current.spec.permits));
        // Where the holders shown here report that their work stopped: this replica, which wrote what they see.
        next.hand_over_url.clone_from(&ctx.lock_controller.hand_over_url);
        next.hand_over_certificate_sha256
            .clone_from(&ctx.lock_controller.hand_over_pin);
        if &next == before {
            return Ok(Some(current.into_owned()));
        }
        let Some(resource_version) = current.metadata.resource_version.as_deref() else {
            // Not an object the API server gave us: read it, so the write has a precondition.
            current = Cow::Owned(api.get(&name).await?);
            continue;
        };
        let body = serde_json::to_vec(&StatusWrite {
            api_version: DistributedLock::api_version(&()),
            kind: DistributedLock::kind(&()),
            metadata: Metadata {
                name: &name,
                namespace: &namespace,
                resource_version,
            },
            status: &next,
        })?;
        let request = requests
            .replace_subresource("status", &name, &PostParams::default(), body)
            .map_err(kube::Error::BuildRequest)?;
        match ctx.client.request_text(request).await {
            Ok(answer) => {
                let mut written = current.into_owned();
                written.metadata.resource_version = resource_version_of(&answer);
                written.status = Some(next);
                return Ok(Some(written));
            }
            Err(err) if is_conflict(&err) => current = Cow::Owned(api.get(&name).await?),
            Err(err) => return Err(Error::status_write(err)),
        }
    }
    Err(Error::Conflict)
}

/// [`write_status`] for one permit: `edit` sees and makes that permit's status as a plain lock's (see
/// `status::permits`). A plain lock's status is its permit 0's, as it is.
pub async fn write_permit_status(
    ctx: &LockContext,
    lock: &DistributedLock,
    permit: u32,
    mut edit: impl FnMut(&DistributedLockStatus) -> Option<DistributedLockStatus>,
) -> Result<bool, Error> {
    if !is_semaphore(lock) {
        return write_latest_status(ctx, lock, edit).await;
    }
    Ok(!write_permits_status(ctx, lock, &[permit], |_, view| edit(view))
        .await?
        .is_empty())
}

/// [`write_permit_status`] for several permits of a semaphore in one write: `edit(permit, view)` sees and makes
/// each permit's status as a plain lock's. A permit whose edit no longer applies is left out of the write; the
/// permits written are returned. One write per semaphore instead of one per permit is what keeps a held
/// semaphore's refreshes at a single lock's cost to the API server.
pub async fn write_permits_status(
    ctx: &LockContext,
    lock: &DistributedLock,
    permits: &[u32],
    mut edit: impl FnMut(u32, &DistributedLockStatus) -> Option<DistributedLockStatus>,
) -> Result<Vec<u32>, Error> {
    let stamp = Stamp {
        generation: lock.meta().generation,
        now: Timestamp::now(),
    };
    // Permits written one after another in one reconciliation: each write starts from the lock as the one before
    // left it, not from the reconciliation's copy, which every write after the first would conflict with.
    let key = ObjectRef::from_obj(lock).to_string();
    let latest = written_of(ctx).get(&key).cloned();
    let base = latest.as_deref().unwrap_or(lock);
    let mut applied = Vec::new();
    let written = write_status_from(ctx, base, |whole| {
        let (next, edited) = fold_permits(whole, permits, stamp, &mut edit);
        applied = edited;
        (!applied.is_empty()).then_some(next)
    })
    .await?;
    let Some(written) = written else {
        return Ok(Vec::new());
    };
    written_of(ctx).insert(key, Arc::new(written));
    Ok(applied)
}

/// [`write_status`] of the whole status, starting from the lock as this reconciliation's last write left it (see
/// [`write_permits_status`]), and kept for the writes that follow.
pub async fn write_latest_status(
    ctx: &LockContext,
    lock: &DistributedLock,
    edit: impl FnMut(&DistributedLockStatus) -> Option<DistributedLockStatus>,
) -> Result<bool, Error> {
    let key = ObjectRef::from_obj(lock).to_string();
    let latest = written_of(ctx).get(&key).cloned();
    let base = latest.as_deref().unwrap_or(lock);
    let Some(written) = write_status_from(ctx, base, edit).await? else {
        return Ok(false);
    };
    written_of(ctx).insert(key, Arc::new(written));
    Ok(true)
}

/// Forgets what [`write_permit_status`] kept of `lock` for the writes that follow it: called when its
/// reconciliation starts and ends.
pub fn forget_written(ctx: &LockContext, lock: &DistributedLock) {
    written_of(ctx).remove(&ObjectRef::from_obj(lock).to_string());
}

fn written_of(
    ctx: &LockContext,
) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, Arc<DistributedLock>>> {
    ctx.lock_controller
        .written
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The resourceVersion in a status write's answer, read without decoding the rest of the object. `None` when
/// it cannot be read: the next write then conflicts and reads the object again.
fn resource_version_of(answer: &str) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Answer {
        metadata: AnswerMetadata,
    }
    #[derive(serde::Deserialize)]
    struct AnswerMetadata {
        #[serde(rename = "resourceVersion")]
        resource_version: Option<String>,
    }
    serde_json::from_str::<Answer>(answer)
        .ok()?
        .metadata
        .resource_version
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct StatusWrite<'a> {
    api_version: Cow<'a, str>,
    kind: Cow<'a, str>,
    metadata: Metadata<'a>,
    status: &'a DistributedLockStatus,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Metadata<'a> {
    name: &'a str,
    namespace: &'a str,
    resource_version: &'a str,
}

/// `status.held`, the `Held` column: permits held of `permits`. A plain lock is held when its phase says so; a
/// semaphore's holders are listed per permit.
pub fn held_count(status: &DistributedLockStatus, permits: i32) -> String {
    // A semaphore lists its permits (more than spec.permits while those above a lowered count are given up); a
    // plain lock shows its one holder at the top.
    let held = if status.holders.is_empty() {
        usize::from(status.phase == Some(LockPhase::Held))
    } else {
        status.holders.len()
    };
    format!("{held}/{}", permits.max(1))
}

/// The stamp of a status edit made now.
pub fn stamp_now(lock: &DistributedLock) -> Stamp {
    Stamp {
        generation: lock.meta().generation,
        now: Timestamp::now(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_held_column_counts_permits() {
        use crate::api::lock::PermitHolder;
        let mut status = DistributedLockStatus::default();
        assert_eq!(held_count(&status, 1), "0/1");
        status.phase = Some(LockPhase::Held);
        assert_eq!(held_count(&status, 1), "1/1");
        let holder = |permit| PermitHolder {
            permit,
            holder: format!("job-{permit}"),
            fencing_token: 1,
            acquired_at: None,
            valid_until: None,
        };
        status.holders = vec![holder(0), holder(2)];
        assert_eq!(held_count(&status, 3), "2/3");
        assert_eq!(
            held_count(&status, 1),
            "2/1",
            "lowered to one under two held permits: both shown until permit 2 is given up"
        );
        assert_eq!(
            held_count(&status, 0),
            "2/1",
            "a stored object below the schema's bound"
        );
    }

    #[test]
    fn the_resource_version_is_read_from_the_answer_alone() {
        let answer = r#"{"apiVersion":"redlock.io/v1beta1","kind":"DistributedLock","metadata":{"name":"a","resourceVersion":"4711","generation":2},"spec":{"ttl":"10s"},"status":{"phase":"Held"}}"#;
        assert_eq!(resource_version_of(answer).as_deref(), Some("4711"));
        assert_eq!(resource_version_of(r#"{"metadata":{}}"#), None);
        assert_eq!(
            resource_version_of("not json"),
            None,
            "the next write conflicts and reads again"
        );
    }
}
