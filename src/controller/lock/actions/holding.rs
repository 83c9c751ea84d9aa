//! The steps every way of holding a lock ends with, shared by acquiring (`acquire`), resuming after a
//! controller restart (`acquire::resume`) and taking a fenced Job's lock back (`fence`): handing a lease to the
//! keeper, taking an acquisition back with its own token, and showing the lock held in status.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use tokio::time::Instant;

use super::{Target, stamp_now};
use crate::api::conditions::Stamp;
use crate::controller::context::Context;
use crate::controller::error::Error;
use crate::controller::keeper::Holding;
use crate::controller::lock::status::{self, HeldFacts, Showing, wall_at};
use crate::controller::lock::status_write::write_permit_status;
use crate::redlock::{ExtendError, Lease};

/// Takes over the acquisition with `token` for `holder` (its value rebuilt from the installation secret) and
/// keeps it from now on; the inner error says why it could not be taken back.
pub async fn take_back(
    target: &Target<'_>,
    ctx: &Context,
    token: i64,
    holder: &str,
) -> Result<Result<Lease, ExtendError>, Error> {
    let uid = target.lock.uid().unwrap_or_default();
    let value = ctx.secret.lock_value(&target.settings.key, &uid, token, holder)?;
    let result = target
        .engine
        .engine
        .reclaim(&target.settings.key, target.settings.ttl, value, token)
        .await;
    if let Ok(lease) = &result {
        keep(target, ctx, lease, token);
    }
    Ok(result)
}

/// Writes the `Held` status for `lease`, then lets the policy act on the holder (label, grant), if status allows
/// what `showing` needs (see [`Showing`]) — the resourceVersion precondition makes check and write one atomic
/// step. `Ok(false)`: status shows a newer token, or this one lost.
pub async fn show_held(
    target: &Target<'_>,
    ctx: &Context,
    holder: &str,
    lease: &Lease,
    token: i64,
    showing: Showing,
) -> Result<bool, Error> {
    let now = Instant::now();
    let wall_now = Timestamp::now();
    let facts = HeldFacts {
        holder,
        token,
        showing,
        renewed_at: wall_at(lease.granted_at(), now, wall_now),
        valid_until: wall_at(lease.valid_until(), now, wall_now),
        report: lease.report(),
    };
    let margin = target.keep.fence_margin;
    let decoration = target.policy.decoration(Some(holder), margin);
    let stamp = Stamp {
        now: wall_now,
        ..stamp_now(target.lock)
    };
    let written = write_permit_status(ctx, target.lock, target.permit, |current| {
        status::held(current, &facts, &decoration, margin, stamp)
    })
    .await?;
    if written {
        ctx.keeper.note_token(target.permit_ref(), token);
        ctx.keeper
            .status_written(target.permit_ref(), lease.valid_until());
        let valid_until = MicroTime(facts.valid_until);
        target
            .policy
            .after_held(
                ctx,
                target.lock,
                target.permit,
                holder,
                token,
                &valid_until,
                margin,
            )
            .await?;
    }
    Ok(written)
}

/// Hands `lease` to the keeper, which extends it from now on.
pub fn keep(target: &Target<'_>, ctx: &Context, lease: &Lease, token: i64) {
    let settings = &target.settings;
    ctx.keeper.insert(
        target.permit_ref(),
        lease.clone(),
        Holding {
            quorum: settings.quorum.clone(),
            key: settings.key.clone(),
            token,
            policy: target.keep,
        },
    );
}
