//! The one function that writes a `DistributedLock`'s status.

use std::borrow::Cow;

use kube::api::{Api, Patch, PatchParams};
use kube::core::Request;
use kube::{Resource, ResourceExt};

use super::status_patch::status_patch;
use crate::api::{DistributedLock, DistributedLockStatus};
use crate::controller::context::Context;
use crate::controller::error::{Error, is_conflict};

/// Sets the status to what `edit` makes of the current one, with the resourceVersion it was read at as a
/// precondition; on a conflict it reads the object again and asks `edit` again. `edit` returning `None` means the
/// write no longer applies: `Ok(false)`. An edit that changes nothing writes nothing: `Ok(true)`.
///
/// Sent as a merge patch of what changed, and the answer is not decoded: a held lock's status is refreshed every
/// other extension, and encoding the whole object and decoding the API server's copy of it was most of the
/// operator's CPU with 10,000 held locks (the watch brings the new object anyway).
pub async fn write_status(
    ctx: &Context,
    lock: &DistributedLock,
    mut edit: impl FnMut(&DistributedLockStatus) -> Option<DistributedLockStatus>,
) -> Result<bool, Error> {
    let name = lock.name_any();
    let namespace = lock.namespace().unwrap_or_default();
    let api: Api<DistributedLock> = Api::namespaced(ctx.client.clone(), &namespace);
    let url = DistributedLock::url_path(&(), Some(&namespace));
    let mut current = Cow::Borrowed(lock);
    for _ in 0..4 {
        let before = current.status.as_ref().unwrap_or(DistributedLockStatus::none());
        let Some(next) = edit(before) else {
            return Ok(false);
        };
        let Some(resource_version) = current.resource_version() else {
            // Not an object the API server gave us: read it, so the write has a precondition.
            current = Cow::Owned(api.get(&name).await?);
            continue;
        };
        let Some(patch) = status_patch(&resource_version, before, &next)? else {
            return Ok(true);
        };
        ctx.ensure_leader()?;
        let request = Request::new(&url)
            .patch_subresource("status", &name, &PatchParams::default(), &Patch::Merge(&patch))
            .map_err(kube::Error::BuildRequest)?;
        match ctx.client.request_text(request).await {
            Ok(_) => return Ok(true),
            Err(err) if is_conflict(&err) => current = Cow::Owned(api.get(&name).await?),
            Err(err) => return Err(err.into()),
        }
    }
    Err(Error::Conflict)
}
