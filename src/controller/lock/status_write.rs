//! The one function that writes a `DistributedLock`'s status.

use std::borrow::Cow;

use kube::api::{Api, PostParams};
use kube::core::Request;
use kube::{Resource, ResourceExt};
use serde::Serialize;

use super::permit_status::{fold_permit, is_semaphore, permit_view};
use super::status::held_count;
use crate::api::conditions::Stamp;
use crate::api::{DistributedLock, DistributedLockStatus};
use crate::controller::context::Context;
use crate::controller::error::{Error, is_conflict};
use k8s_openapi::jiff::Timestamp;

/// Replaces the status with what `edit` makes of the current one, with the resourceVersion it was read at as a
/// precondition; on a conflict it reads the object again and asks `edit` again. `status.held` is set here. `edit` returning `None` means the
/// write no longer applies: `Ok(false)`. An edit that changes nothing writes nothing: `Ok(true)`.
///
/// A held lock's status is refreshed every other extension: with 10,000 held locks, encoding the whole object
/// and decoding the API server's answer were most of the operator's CPU. So the body is only what a status
/// write reads (the status, and the name and resourceVersion it applies to; the API server takes nothing else
/// from a custom resource's status write), and the answer is not decoded (the watch brings the new object).
pub async fn write_status(
    ctx: &Context,
    lock: &DistributedLock,
    mut edit: impl FnMut(&DistributedLockStatus) -> Option<DistributedLockStatus>,
) -> Result<bool, Error> {
    let name = lock.name_any();
    let namespace = lock.namespace().unwrap_or_default();
    let api: Api<DistributedLock> = Api::namespaced(ctx.client.clone(), &namespace);
    let requests = Request::new(DistributedLock::url_path(&(), Some(&namespace)));
    let mut current = Cow::Borrowed(lock);
    for _ in 0..4 {
        let before = current.status.as_ref().unwrap_or(DistributedLockStatus::none());
        let Some(mut next) = edit(before) else {
            return Ok(false);
        };
        // Every write shows the `Held` column's count, whichever edit made it. A lock that is plain again (its
        // permits above 1 given up after spec.permits was lowered to 1) shows its holder at the top only.
        if !is_semaphore(&current) {
            next.holders.clear();
        }
        next.held = Some(held_count(&next, current.spec.permits));
        if &next == before {
            return Ok(true);
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
        ctx.ensure_leader()?;
        let request = requests
            .replace_subresource("status", &name, &PostParams::default(), body)
            .map_err(kube::Error::BuildRequest)?;
        match ctx.client.request_text(request).await {
            Ok(_) => return Ok(true),
            Err(err) if is_conflict(&err) => current = Cow::Owned(api.get(&name).await?),
            Err(err) => return Err(err.into()),
        }
    }
    Err(Error::Conflict)
}

/// [`write_status`] for one permit: `edit` sees and makes that permit's status as a plain lock's (see
/// `permit_status`). A plain lock's status is its permit 0's, as it is.
pub async fn write_permit_status(
    ctx: &Context,
    lock: &DistributedLock,
    permit: u32,
    mut edit: impl FnMut(&DistributedLockStatus) -> Option<DistributedLockStatus>,
) -> Result<bool, Error> {
    if !is_semaphore(lock) {
        return write_status(ctx, lock, edit).await;
    }
    let stamp = Stamp {
        generation: lock.meta().generation,
        now: Timestamp::now(),
    };
    write_status(ctx, lock, |whole| {
        edit(&permit_view(whole, permit)).map(|edited| fold_permit(whole, permit, &edited, stamp))
    })
    .await
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
