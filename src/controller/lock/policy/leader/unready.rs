//! The pods the election treats as unready for want of answers, though they are Running and Ready (cut off from
//! the network): a leader that stopped by the validity it was last told, or one that asks and was never
//! answered during its grant (`holder_liveness::rule::unready`). Each is set aside for the lock a while
//! (`set_aside_for`), so that the election does not hand the lock straight back to it once its key is released.

use std::time::Duration;

use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;
use tokio::time::Instant;

use crate::api::DistributedLock;
use crate::controller::keeper::PermitRef;
use crate::controller::lock::controller_state::LockContext;
use crate::controller::lock::holder_liveness::rule::{Bounds, set_aside_for, unready};

/// The label the chart's injection wraps a leader pod by: its `elect` asks from the start.
const ELECT_LABEL: &str = "redlock.io/elect";

/// The pods of `lock` (of `ttl`) to leave out of its election now; `permits[i]` is permit i's holder and token.
pub fn unready_leaders(
    ctx: &LockContext,
    lock: &DistributedLock,
    ttl: Duration,
    permits: &[(Option<String>, i64)],
) -> Vec<String> {
    let asks = &ctx.lock_controller.asks;
    let lref = ObjectRef::from_obj(lock);
    let namespace = lock.namespace().unwrap_or_default();
    let now = Instant::now();
    let bounds = Bounds::for_ttl(ttl);
    let term = ctx.leadership.term();
    let mut left_out = asks.set_aside_of(&lref, now);
    for ((holder, token), permit) in permits.iter().zip(0u32..) {
        let Some(holder) = holder else { continue };
        let Some(record) = asks.get(&PermitRef::new(lref.clone(), permit), (*token, term)) else {
            continue;
        };
        let asking = left_out.contains(holder)
            || ctx
                .pods
                .get(&ObjectRef::new(holder).within(&namespace))
                .is_some_and(|pod| pod.labels().contains_key(ELECT_LABEL));
        if unready(&record, asking, bounds, now) {
            tracing::info!(lock = %lref, pod = %holder, token, "the leader does not reach the operator: the election leaves it out");
            asks.set_aside(&lref, holder, now.checked_add(set_aside_for(ttl)).unwrap_or(now));
            if !left_out.contains(holder) {
                left_out.push(holder.clone());
            }
        }
    }
    left_out
}
