//! Releasing a lock's key: when the spec wants another holder, when a Job finished, when the lock is deleted.

use std::sync::Arc;
use std::time::Duration;

use kube::ResourceExt;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;

use super::give_up::{give_up, give_up_kept, rebuilt};
use crate::api::DistributedLock;
use crate::controller::engines::{QuorumEngine, QuorumLookup};
use crate::controller::error::Error;
use crate::controller::keeper::{HeldView, PermitRef};
use crate::controller::lock::controller_state::LockContext;
use crate::controller::lock::decide::acquisition_in_status;
use crate::controller::lock::permit_count::permit_span;
use crate::controller::lock::settings::redis_key;
use crate::controller::lock::status;
use crate::controller::lock::status::permits::status_of;
use crate::controller::lock::status::write::stamp_now;
use crate::controller::lock::status::write::write_permit_status;
use crate::controller::lock::target::Target;
use crate::redlock::{OperationReport, Waiter, permit_key};

/// Stops keeping the lock and deletes its key where it is still ours. Only the active replica releases: one that
/// lost its leadership leaves the lock to the keeper (which may still extend it) and to its successor.
pub async fn release_held(
    ctx: &LockContext,
    lref: impl Into<PermitRef>,
    quorum: Option<&str>,
) -> Option<OperationReport> {
    if !ctx.leadership.is_leader() {
        return None;
    }
    let lease = ctx.keeper.remove(lref).await?;
    match ctx.engines.lookup(quorum?) {
        QuorumLookup::Ready(engine) => Some(engine.engine.release(&lease).await),
        _ => None,
    }
}

/// This replica holds a lock that no longer matches the spec (holder, key or quorum changed): give it up first. Its
/// holder was told (its label is gone, or status shows the change) but may act up to the validity it was shown:
/// the key is released, and the next holder acquires, only once that has ended.
pub async fn release_for_change(
    target: &Target<'_>,
    ctx: &LockContext,
    held: Option<HeldView>,
    wanted: &str,
) -> Result<Action, Error> {
    let previous = held
        .as_ref()
        .map(|held| held.lease.holder().to_owned())
        .unwrap_or_default();
    let gave_up = give_up_kept(ctx, target.lock, target.permit_ref(), Some(target.policy)).await?;
    let note = format!(
        "released for {previous}: the spec now wants {wanted} on `{}`{}",
        target.settings.key,
        gave_up
            .map(|gave_up| format!("; {}", gave_up.note()))
            .unwrap_or_default()
    );
    target
        .publish(ctx, EventType::Normal, "Released", note.clone())
        .await;
    show_released(ctx, target, &note).await?;
    Ok(Action::requeue(Duration::from_millis(10)))
}

/// Status names a holder other than the wanted one, held by a predecessor of this replica: give that acquisition
/// up (its value is rebuilt from the token; released once the validity status shows has ended) before acquiring
/// for the new holder.
pub async fn release_previous(
    target: &Target<'_>,
    ctx: &LockContext,
    wanted: &str,
    token: i64,
    previous: &str,
) -> Result<Action, Error> {
    ctx.ensure_leader()?;
    let given = rebuilt(target, ctx, previous, token)?;
    let gave_up = give_up(ctx, target.lock, target.permit_ref(), Some(target.policy), given).await?;
    let message = format!(
        "released for {previous}: the holder changed to {wanted}; {}",
        gave_up.note()
    );
    show_released(ctx, target, &message).await?;
    target.publish(ctx, EventType::Normal, "Released", message).await;
    Ok(Action::requeue(Duration::from_millis(10)))
}

/// Job fencing: the holding Job completed, failed or is gone.
pub async fn release_finished(
    target: &Target<'_>,
    ctx: &LockContext,
    held: Option<&HeldView>,
    job: &str,
) -> Result<Action, Error> {
    let quorum = held.map(|held| held.quorum.as_str());
    if release_held(ctx, target.permit_ref(), quorum).await.is_none() {
        release_from_status(target.lock, target.permit, ctx).await?;
    }
    let note = format!("released: Job {job} finished or is gone");
    target
        .publish(ctx, EventType::Normal, "Released", note.clone())
        .await;
    show_released(ctx, target, &note).await?;
    Ok(Action::requeue(Duration::from_millis(10)))
}

/// The lock is being deleted: release its keys (every permit's) before the finalizer goes. A key shown to a
/// holder was given up before (`reconcile::hand_over_before_deletion`: the holder fenced, then released once the
/// validity shown to it ended or it stopped) and is released by now; what is left here is a key nothing showed.
pub async fn cleanup(lock: &DistributedLock, ctx: &LockContext) -> Result<Action, Error> {
    ctx.ensure_leader()?;
    let lref = ObjectRef::from_obj(lock);
    let permits = permit_span(lock);
    for permit in 0..permits {
        let held = PermitRef::new(lref.clone(), permit);
        let released = match ctx.keeper.view(&held) {
            Some(view) => release_held(ctx, &held, Some(&view.quorum)).await,
            None => {
                leave_queue(lock, permit, ctx).await;
                release_from_status(lock, permit, ctx).await?
            }
        };
        // Nothing to say where the key was released already (after the validity shown to its holder) or expired.
        if let Some(report) = released.filter(|report| report.votes() > 0) {
            let key = if permits > 1 {
                format!("permit {permit}'s key")
            } else {
                "the key".to_owned()
            };
            let note = format!(
                "released on deletion ({} of {} masters deleted {key})",
                report.votes(),
                report.nodes.len()
            );
            ctx.publish(lock, EventType::Normal, "Released", note).await;
        }
    }
    // A lock re-created under the same name starts from the key's floor record (and status), which every
    // grant updates before anything shows it: this replica's memory of the old object is not needed.
    ctx.keeper.forget_token(&lref);
    ctx.lock_controller.release_wakes.forget_lock(&lref);
    Ok(Action::await_change())
}

/// A predecessor's acquisition of `permit` named in status: rebuild its value and delete it from that permit's
/// key.
pub async fn release_from_status(
    lock: &DistributedLock,
    permit: u32,
    ctx: &LockContext,
) -> Result<Option<OperationReport>, Error> {
    ctx.ensure_leader()?;
    let status = status_of(lock, permit);
    let Some((holder, token)) = acquisition_in_status(&status) else {
        return Ok(None);
    };
    let Some((engine, key)) = engine_and_key(lock, permit, ctx) else {
        return Ok(None);
    };
    let value = ctx
        .secret
        .lock_value(&key, &lock.uid().unwrap_or_default(), token, holder)?;
    Ok(Some(engine.engine.release_value(&key, value).await))
}

/// The engine of the lock's quorum and `permit`'s key as every acquisition makes it (scoped by the namespace, or
/// under the quorum's shared prefix); `None` without an engine, or for a spec that no longer makes a key (it was
/// not acted on, and its key expires on its own).
fn engine_and_key(
    lock: &DistributedLock,
    permit: u32,
    ctx: &LockContext,
) -> Option<(Arc<QuorumEngine>, String)> {
    let QuorumLookup::Ready(engine) = ctx.engines.lookup(&lock.spec.quorum) else {
        return None;
    };
    let namespace = lock.namespace().unwrap_or_default();
    let lock_key = redis_key(
        &lock.spec,
        &namespace,
        &lock.name_any(),
        engine.shared_keys.as_ref(),
    )
    .ok()?;
    let key = permit_key(&lock_key, permit);
    Some((engine, key))
}

/// A permit this replica saw waiting in its key's queue leaves it, so that the waiter behind is let through at
/// once rather than once the masters stop keeping this one.
async fn leave_queue(lock: &DistributedLock, permit: u32, ctx: &LockContext) {
    let Some((engine, key)) = engine_and_key(lock, permit, ctx) else {
        return;
    };
    // Forgotten whether it waited or not: a refusal without a place leaves the counter it reported, and a deleted
    // lock's entry would otherwise stay for the life of the process.
    let ticket = ctx.lock_controller.queue_tickets.ticket(&key);
    ctx.lock_controller.queue_tickets.forget(&key);
    if ticket <= 0 {
        return;
    }
    let waiter = Waiter::new(
        ctx.secret
            .waiter_id(&key, &lock.uid().unwrap_or_default(), permit),
        ticket,
    );
    engine.engine.leave_waiting(&key, waiter).await;
}

async fn show_released(ctx: &LockContext, target: &Target<'_>, message: &str) -> Result<bool, Error> {
    let stamp = stamp_now(target.lock);
    write_permit_status(ctx, target.lock, target.permit, |current| {
        Some(status::released(current, message, stamp))
    })
    .await
}
