//! The one function that writes a `DistributedLock`'s status.

use kube::ResourceExt;
use kube::api::{Api, PostParams};

use crate::api::{DistributedLock, DistributedLockStatus};
use crate::controller::context::Context;
use crate::controller::error::{Error, is_conflict};

/// Replaces the status with what `edit` makes of the current one, with the resourceVersion it was read at as a
/// precondition; on a conflict it reads the object again and asks `edit` again. `edit` returning `None` means the
/// write no longer applies: `Ok(false)`. An edit that changes nothing writes nothing: `Ok(true)`.
pub async fn write_status(
    ctx: &Context,
    lock: &DistributedLock,
    mut edit: impl FnMut(&DistributedLockStatus) -> Option<DistributedLockStatus>,
) -> Result<bool, Error> {
    let api: Api<DistributedLock> =
        Api::namespaced(ctx.client.clone(), &lock.namespace().unwrap_or_default());
    let mut current = lock.clone();
    for _ in 0..4 {
        let before = current.status.clone().unwrap_or_default();
        let Some(next) = edit(&before) else {
            return Ok(false);
        };
        if next == before {
            return Ok(true);
        }
        ctx.ensure_leader()?;
        current.status = Some(next);
        match api
            .replace_status(&lock.name_any(), &PostParams::default(), &current)
            .await
        {
            Ok(_) => return Ok(true),
            Err(err) if is_conflict(&err) => current = api.get(&lock.name_any()).await?,
            Err(err) => return Err(err.into()),
        }
    }
    Err(Error::Conflict)
}
