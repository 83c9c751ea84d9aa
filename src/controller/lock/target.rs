//! The lock and permit an action acts on, with what it was decided on: shared by the actions and the hand-over's
//! steps.

use std::sync::Arc;

use kube::runtime::events::EventType;

use super::permit_count::is_semaphore;
use super::permit_plan::PermitSeen;
use super::policy::Policy;
use super::settings::LockSettings;
use crate::api::{DistributedLock, DistributedLockStatus};
use crate::controller::engines::QuorumEngine;
use crate::controller::keeper::{HeldView, LockRef, PermitRef};
use crate::controller::lock::controller_state::LockContext;
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

    /// What the permit's step is decided on besides the policy's turn (`permit_plan`): what this replica keeps of
    /// it, its status and the latest token known, on its key and quorum.
    pub fn seen<'s>(
        &'s self,
        held: Option<&'s HeldView>,
        status: &'s DistributedLockStatus,
        latest_token: i64,
        semaphore: bool,
    ) -> PermitSeen<'s> {
        PermitSeen {
            held,
            status,
            latest_token,
            semaphore,
            key: &self.settings.key,
            quorum: &self.settings.quorum,
        }
    }

    /// Publishes an Event on the lock about the permit acted on. A semaphore's name their permit, in the note
    /// and the action (`Acquired.permit-2`), so that each permit's Events form series of their own and
    /// `kubectl describe` tells one permit's story from another's.
    pub async fn publish(&self, ctx: &LockContext, type_: EventType, reason: &str, note: String) {
        if is_semaphore(self.lock) {
            let action = format!("{reason}.permit-{}", self.permit);
            let note = format!("permit {}: {note}", self.permit);
            ctx.publish_action(self.lock, type_, reason, action, note).await;
        } else {
            ctx.publish(self.lock, type_, reason, note).await;
        }
    }
}
