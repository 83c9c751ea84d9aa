//! Status follows the cluster: what the holder policy makes of the pods or Jobs the lock selects (`status.queue`,
//! `candidates`, `FencingMayBeLate`) is written when it differs from what status shows, at every look at the lock,
//! not only with the next write for another reason. A Job created, started, finished or deleted wakes the lock (its
//! watch event routes to it), and the queue shown then is current within that look.

use crate::api::DistributedLock;
use crate::controller::error::Error;
use crate::controller::lock::controller_state::LockContext;
use crate::controller::lock::policy::Policy;
use crate::controller::lock::status;
use crate::controller::lock::status::write::stamp_now;
use crate::controller::lock::status::write::write_latest_status;

/// Writes what `policy` shows of the cluster where status shows something else; nothing (and no request) when it
/// already shows it. Called after the permits' steps, from the status their writes left: the queue then leaves out
/// every Job granted in this look. Only the active replica writes (checked at the write).
pub async fn follow(
    ctx: &LockContext,
    lock: &DistributedLock,
    policy: &Policy,
    fence_margin: std::time::Duration,
) -> Result<(), Error> {
    if matches!(policy, Policy::Identity(_)) {
        return Ok(());
    }
    let decoration = policy.decoration(None, fence_margin);
    let stamp = stamp_now(lock);
    write_latest_status(ctx, lock, |current| {
        Some(status::decorated(current, &decoration, fence_margin, stamp))
    })
    .await?;
    Ok(())
}
