//! What the lock reconciler does on Redis and the API once it has decided: acquire, resume and refresh
//! (`acquire`, recording each new token in the key's floor record: `floor_record`), release (`release`; a key
//! shown to a holder waits for the validity it was shown: `give_up`), fence
//! and take back (`fence`), the steps all ways of holding end with (`holding`: keep the lease, take an
//! acquisition back, show it held), the statuses of a lock nobody may hold now (`wait`), and what the policy shows
//! of the cluster, kept current (`policy_status`). Every status they write is one of the pure edits in
//! `super::status`.

pub mod acquire;
pub mod fence;
pub mod floor_record;
pub mod give_up;
pub mod holder_liveness;
pub mod holding;
pub mod policy_status;
pub mod release;
pub mod wait;

use std::sync::Arc;

use kube::runtime::events::EventType;

use super::permit_count::is_semaphore;
use super::policy::Policy;
use super::settings::LockSettings;
use crate::api::DistributedLock;
use crate::controller::context::Context;
use crate::controller::engines::QuorumEngine;
use crate::controller::keeper::{LockRef, PermitRef};
use crate::redlock::KeepPolicy;

/// A lock whose spec and quorum can be acted on, with its policy observed; the actions act on one permit of it
/// (`permit`, whose key `settings.key` is: a plain lock's is its permit 0, the lock's own key).
pub struct Target<'a> {
    pub lock: &'a DistributedLock,
    pub lref: LockRef,
    pub permit: u32,
    pub settings: LockSettings,
    pub engine: Arc<QuorumEngine>,
    pub keep: KeepPolicy,
    pub policy: &'a Policy,
}

impl Target<'_> {
    /// What the keeper keeps of the permit acted on.
    pub fn permit_ref(&self) -> PermitRef {
        PermitRef::new(self.lref.clone(), self.permit)
    }

    /// Publishes an Event on the lock about the permit acted on. A semaphore's name their permit, in the note
    /// and the action (`Acquired.permit-2`), so that each permit's Events form series of their own and
    /// `kubectl describe` tells one permit's story from another's.
    pub async fn publish(&self, ctx: &Context, type_: EventType, reason: &str, note: String) {
        if is_semaphore(self.lock) {
            let action = format!("{reason}.permit-{}", self.permit);
            let note = format!("permit {}: {note}", self.permit);
            ctx.publish_action(self.lock, type_, reason, action, note).await;
        } else {
            ctx.publish(self.lock, type_, reason, note).await;
        }
    }
}
