//! The steps every way of holding a lock ends with, shared by acquiring (`acquire`), resuming after a
//! controller restart (`acquire::resume`) and taking a fenced Job's lock back (`fence`): handing a lease to the
//! keeper, taking an acquisition back with its own token, and showing the lock held in status.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use tokio::time::Instant;

use crate::api::DistributedLock;
use crate::api::conditions::Stamp;
use crate::controller::error::Error;
use crate::controller::keeper::{HeldView, Holding};
use crate::controller::lock::controller_state::LockContext;
use crate::controller::lock::status::write::stamp_now;
use crate::controller::lock::status::write::{write_permit_status, write_permits_status};
use crate::controller::lock::status::{self, HeldFacts, Showing, wall_at};
use crate::controller::lock::target::Target;
use crate::redlock::{ExtendError, Lease};

/// Takes over the acquisition with `token` for `holder` (its value rebuilt from the installation secret) and
/// keeps it from now on; the inner error says why it could not be taken back.
pub async fn take_back(
    target: &Target<'_>,
    ctx: &LockContext,
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
    ctx: &LockContext,
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
        shown_held(target, ctx, holder, lease, token, facts.valid_until).await?;
    }
    Ok(written)
}

/// A held permit whose status refresh is due, for [`refresh_permits`].
pub struct DueRefresh<'a> {
    pub target: Target<'a>,
    pub holder: String,
    pub held: HeldView,
}

/// [`show_held`] for the due refreshes of several permits of one semaphore, in one status write. Returns the
/// refreshes whose status no longer allows it (status shows a newer token, or the permit lost), for the caller
/// to handle one by one.
pub async fn refresh_permits<'a>(
    ctx: &LockContext,
    lock: &DistributedLock,
    due: Vec<DueRefresh<'a>>,
) -> Result<Vec<DueRefresh<'a>>, Error> {
    let now = Instant::now();
    let wall_now = Timestamp::now();
    let stamp = Stamp {
        now: wall_now,
        ..stamp_now(lock)
    };
    let shown: Vec<_> = due
        .iter()
        .map(|refresh| {
            let margin = refresh.target.keep.fence_margin;
            let facts = HeldFacts {
                holder: &refresh.holder,
                token: refresh.held.token,
                showing: Showing::Refresh,
                renewed_at: wall_at(refresh.held.lease.granted_at(), now, wall_now),
                valid_until: wall_at(refresh.held.lease.valid_until(), now, wall_now),
                report: refresh.held.lease.report(),
            };
            let decoration = refresh.target.policy.decoration(Some(&refresh.holder), margin);
            (refresh.target.permit, facts, decoration, margin)
        })
        .collect();
    let permits: Vec<u32> = shown.iter().map(|(permit, ..)| *permit).collect();
    let written = write_permits_status(ctx, lock, &permits, |permit, current| {
        let (_, facts, decoration, margin) = shown.iter().find(|(number, ..)| *number == permit)?;
        status::held(current, facts, decoration, *margin, stamp)
    })
    .await?;
    let valid_until: Vec<Timestamp> = shown.iter().map(|(_, facts, ..)| facts.valid_until).collect();
    drop(shown);
    let mut refused = Vec::new();
    for (refresh, valid_until) in due.into_iter().zip(valid_until) {
        if written.contains(&refresh.target.permit) {
            let DueRefresh { target, holder, held } = &refresh;
            shown_held(target, ctx, holder, &held.lease, held.token, valid_until).await?;
        } else {
            refused.push(refresh);
        }
    }
    Ok(refused)
}

/// What follows a `Held` status written for `lease`: the keeper learns the token and that status shows its
/// validity, and the policy acts on the holder (label, grant).
async fn shown_held(
    target: &Target<'_>,
    ctx: &LockContext,
    holder: &str,
    lease: &Lease,
    token: i64,
    valid_until: Timestamp,
) -> Result<(), Error> {
    ctx.keeper.note_token(target.permit_ref(), token);
    ctx.keeper
        .status_written(target.permit_ref(), lease.valid_until());
    target
        .policy
        .after_held(
            ctx,
            target.lock,
            target.permit,
            holder,
            token,
            &MicroTime(valid_until),
            target.keep.fence_margin,
        )
        .await
}

/// Hands `lease` to the keeper, which extends it from now on.
pub fn keep(target: &Target<'_>, ctx: &LockContext, lease: &Lease, token: i64) {
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
