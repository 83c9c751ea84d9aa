//! Giving a key up once its holder was told (label removed, status changed): released now if the holder is known
//! to have stopped or was shown no validity, else not extended any more and released by [`settle`] once the
//! validity last shown to it has ended (the rule and why: `super::rule`).

use k8s_openapi::jiff::Timestamp;
use tokio::time::Instant;

use kube::ResourceExt;

use crate::api::DistributedLock;
use crate::controller::engines::QuorumLookup;
use crate::controller::error::Error;
use crate::controller::keeper::{PermitRef, Retiring};
use crate::controller::lock::controller_state::LockContext;
use crate::controller::lock::decide::acquisition_in_status;
use crate::controller::lock::handover::releasing::{self, Recorded};
use crate::controller::lock::handover::rule::{
    Release, release_note, shown_until, wait_until, when_to_release,
};
use crate::controller::lock::holder_liveness::rule::stopped_by_silence;
use crate::controller::lock::policy::Policy;
use crate::controller::lock::status::permits::status_of;
use crate::controller::lock::status::wall_at;
use crate::controller::lock::status::write::write_status;
use crate::controller::lock::target::Target;
use crate::negative_controls::{self, Control};
use crate::redlock::LockValue;

/// A key to give up, and what its holder was shown.
pub struct GivenUp {
    pub quorum: String,
    pub key: String,
    pub value: LockValue,
    pub holder: String,
    pub token: i64,
    /// The latest validity that can have been shown to the holder.
    pub shown_until: Option<Timestamp>,
}

/// What became of a key given up: who held it and when it is released, for status and Events.
pub struct GaveUp {
    pub holder: String,
    pub release: Release,
}

impl GaveUp {
    pub fn note(&self) -> String {
        release_note(&self.holder, self.release)
    }
}

/// Gives `given` up: released now, or remembered to be released when the validity shown has ended. `policy`
/// tells whether the holder is known to have stopped (a leader pod deleted once finished).
pub async fn give_up(
    ctx: &LockContext,
    lock: &DistributedLock,
    lref: impl Into<PermitRef>,
    policy: Option<&Policy>,
    given: GivenUp,
) -> Result<GaveUp, Error> {
    let lref = lref.into();
    let stopped = holder_stopped(ctx, policy, &lref, &given.holder, given.token).await?;
    let release = if negative_controls::active(Control::ReleaseAtOnce) {
        Release::Now
    } else {
        when_to_release(given.shown_until, stopped, Timestamp::now())
    };
    match release {
        Release::Now => {
            release_value(ctx, &given.quorum, &given.key, given.value).await;
            forget_recorded(ctx, lock, lref.permit, given.token).await?;
        }
        Release::At(release_at) => {
            tracing::info!(lock = %lref, holder = %given.holder, token = given.token, %release_at, "key given up: released when the validity shown to its holder ends");
            let recorded = Recorded {
                permit: lref.permit,
                holder: &given.holder,
                token: given.token,
                quorum: &given.quorum,
                key: &given.key,
                release_at,
            };
            write_status(ctx, lock, |current| releasing::with_entry(current, &recorded)).await?;
            ctx.keeper.retire(
                lref,
                Retiring {
                    quorum: given.quorum,
                    key: given.key,
                    value: given.value,
                    holder: given.holder.clone(),
                    token: given.token,
                    release_at,
                },
            );
        }
    }
    Ok(GaveUp {
        holder: given.holder,
        release,
    })
}

/// Gives up the lease this replica keeps for the lock, if any: not extended from now on. `lock`'s status may show
/// a later validity than the lease (written by a predecessor).
pub async fn give_up_kept(
    ctx: &LockContext,
    lock: &DistributedLock,
    lref: impl Into<PermitRef>,
    policy: Option<&Policy>,
) -> Result<Option<GaveUp>, Error> {
    let lref = lref.into();
    if !ctx.leadership.is_leader() {
        // Left to the keeper and the successor, as `release_held` does.
        return Ok(None);
    }
    let Some(view) = ctx.keeper.view(&lref) else {
        return Ok(None);
    };
    let Some(lease) = ctx.keeper.remove(&lref).await else {
        return Ok(None);
    };
    let kept_until = wall_at(lease.valid_until(), Instant::now(), Timestamp::now());
    let given = GivenUp {
        quorum: view.quorum,
        key: lease.resource().to_owned(),
        value: lease.value().clone(),
        holder: lease.holder().to_owned(),
        token: view.token,
        shown_until: shown_until(status_valid_until(lock, lref.permit), Some(kept_until)),
    };
    give_up(ctx, lock, &lref, policy, given).await.map(Some)
}

/// Whether the holder is known to have stopped: a leader that reported so for this grant (`lock::reports`), that
/// asked during it and was silent until every validity told to it ended (`holder_liveness`), or whose pod was
/// deleted once finished (a force-deleted one may run on); a Job gone, suspended or finished with no pod of its
/// grant (`token`) left running or stopping but those that reported their work stopped. Read directly, not from
/// the caches.
async fn holder_stopped(
    ctx: &LockContext,
    policy: Option<&Policy>,
    lref: &PermitRef,
    holder: &str,
    token: i64,
) -> Result<bool, Error> {
    match policy {
        Some(Policy::Leader(_)) if ctx.lock_controller.stopped.has(lref, token, holder) => Ok(true),
        // It asked during its grant and every validity told to it has ended unanswered: it stopped by then.
        Some(Policy::Leader(_))
            if ctx
                .lock_controller
                .asks
                .get(lref, (token, ctx.leadership.term()))
                .is_some_and(|record| stopped_by_silence(&record, Instant::now())) =>
        {
            tracing::info!(lock = %lref.lock, pod = holder, token, "the leader stopped asking and the validity told to it has ended: it has stopped, the key goes now");
            Ok(true)
        }
        Some(Policy::Leader(election)) => election.pod_stopped(ctx, holder).await,
        Some(Policy::Jobs(queue)) => {
            let reported = ctx.lock_controller.stopped.pods(lref, token);
            // A pod of the grant force-deleted while it ran is listed nowhere, and may run on.
            let namespace = lref.lock.namespace.as_deref().unwrap_or_default();
            if ctx
                .pod_index
                .grant_pod_deleted_running((namespace, &lref.lock.name), holder, token, &reported)
            {
                return Ok(false);
            }
            queue.grant_stopped(holder, token, &reported).await
        }
        _ => Ok(false),
    }
}

/// Releases the key waiting for the lock once the validity shown has ended, or its holder is known to have
/// stopped since (a leader pod deleted once its kubelet reported it finished, a suspended Job's last pod: their deletion wakes
/// the lock). `Some(at)`: it
/// still waits until then, and nobody may take the lock meanwhile.
pub async fn settle(
    ctx: &LockContext,
    lock: &DistributedLock,
    lref: impl Into<PermitRef>,
    policy: Option<&Policy>,
) -> Result<Option<Timestamp>, Error> {
    let lref = lref.into();
    let retiring = match ctx.keeper.retiring(&lref) {
        Some(retiring) => retiring,
        None => match adopt_recorded(ctx, lock, &lref)? {
            Some(retiring) => retiring,
            None => return Ok(None),
        },
    };
    let now = Timestamp::now();
    if let Release::At(at) = when_to_release(Some(retiring.release_at), false, now)
        && !holder_stopped(ctx, policy, &lref, &retiring.holder, retiring.token).await?
    {
        return Ok(Some(at));
    }
    if let Some(retiring) = ctx.keeper.take_retiring(&lref) {
        tracing::info!(lock = %lref, holder = %retiring.holder, token = retiring.token, "the validity shown to the holder ended, or it stopped: key released");
        release_value(ctx, &retiring.quorum, &retiring.key, retiring.value).await;
        forget_recorded(ctx, lock, lref.permit, retiring.token).await?;
    }
    Ok(None)
}

/// A key status records as waiting that this replica does not know of (a predecessor gave it up): waited for and
/// released as the predecessor would have. Its value is rebuilt from the installation secret, the key, the
/// lock's uid, the token and the holder, as every replica builds it. An acquisition this replica keeps for the
/// permit is not waiting to be released: the record is older than the grant.
fn adopt_recorded(
    ctx: &LockContext,
    lock: &DistributedLock,
    lref: &PermitRef,
) -> Result<Option<Retiring>, Error> {
    let Some(entry) = lock
        .status
        .as_ref()
        .and_then(|status| releasing::recorded(status, lref.permit))
    else {
        return Ok(None);
    };
    if ctx.keeper.view(lref).is_some() || !ctx.leadership.is_leader() {
        return Ok(None);
    }
    let uid = lock.uid().unwrap_or_default();
    let retiring = Retiring {
        quorum: entry.quorum.clone(),
        key: entry.key.clone(),
        value: ctx
            .secret
            .lock_value(&entry.key, &uid, entry.fencing_token, &entry.holder)?,
        holder: entry.holder.clone(),
        token: entry.fencing_token,
        release_at: entry.release_at.0,
    };
    tracing::info!(lock = %lref, holder = %retiring.holder, token = retiring.token, release_at = %retiring.release_at, "a key given up by a predecessor: released when status says");
    ctx.keeper.retire(lref.clone(), retiring.clone());
    Ok(Some(retiring))
}

/// Drops status's record of the key of `permit` given up with `token`, once released.
async fn forget_recorded(
    ctx: &LockContext,
    lock: &DistributedLock,
    permit: u32,
    token: i64,
) -> Result<(), Error> {
    write_status(ctx, lock, |current| {
        releasing::without_entry(current, permit, token)
    })
    .await?;
    Ok(())
}

/// A predecessor's acquisition (its value rebuilt from `token` and `holder`), shown to its holder up to the
/// `validUntil` status shows. Given up only after its holder was fenced: the keys are all that kept a contender
/// out meanwhile.
pub fn rebuilt(target: &Target<'_>, ctx: &LockContext, holder: &str, token: i64) -> Result<GivenUp, Error> {
    let settings = &target.settings;
    rebuilt_on(
        ctx,
        target.lock,
        target.permit,
        &settings.quorum,
        &settings.key,
        holder,
        token,
    )
}

/// The acquisition status shows held (or lost) for `permit` on `key` (that permit's key), rebuilt as in
/// [`rebuilt`]: what a replica that keeps nothing of the lock gives up.
pub fn shown_in_status(
    ctx: &LockContext,
    lock: &DistributedLock,
    permit: u32,
    quorum: &str,
    key: &str,
) -> Result<Option<GivenUp>, Error> {
    let status = status_of(lock, permit);
    let Some((holder, token)) = acquisition_in_status(&status) else {
        return Ok(None);
    };
    rebuilt_on(ctx, lock, permit, quorum, key, holder, token).map(Some)
}

fn rebuilt_on(
    ctx: &LockContext,
    lock: &DistributedLock,
    permit: u32,
    quorum: &str,
    key: &str,
    holder: &str,
    token: i64,
) -> Result<GivenUp, Error> {
    let uid = lock.uid().unwrap_or_default();
    Ok(GivenUp {
        quorum: quorum.to_owned(),
        key: key.to_owned(),
        value: ctx.secret.lock_value(key, &uid, token, holder)?,
        holder: holder.to_owned(),
        token,
        shown_until: status_valid_until(lock, permit),
    })
}

/// How long from now to wait for `at`.
pub fn until(at: Timestamp) -> std::time::Duration {
    wait_until(at, Timestamp::now())
}

/// The `validUntil` status shows for `permit`.
pub fn status_valid_until(lock: &DistributedLock, permit: u32) -> Option<Timestamp> {
    status_of(lock, permit).valid_until.as_ref().map(|until| until.0)
}

/// Deletes `value` from `key` wherever it is still the value. Only the active replica releases.
async fn release_value(ctx: &LockContext, quorum: &str, key: &str, value: LockValue) {
    if !ctx.leadership.is_leader() {
        return;
    }
    if let QuorumLookup::Ready(engine) = ctx.engines.lookup(quorum) {
        engine.engine.release_value(key, value).await;
    }
}
