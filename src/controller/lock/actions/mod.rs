//! What the lock reconciler does on Redis and the API once it has decided: acquire, resume and refresh
//! (`acquire`, recording each new token in the key's floor record: `token_floor`), release (`release`; a key
//! shown to a holder waits for the validity it was shown: `handover`), fence
//! and take back (`fence`), the steps all ways of holding end with (`holding`: keep the lease, take an
//! acquisition back, show it held), and the statuses of a lock nobody may hold now (`wait`). Every status they
//! write is one of the pure edits in `super::status`.

pub mod acquire;
pub mod fence;
pub mod handover;
pub mod holding;
pub mod release;
pub mod token_floor;
pub mod wait;

use std::sync::Arc;

use k8s_openapi::jiff::Timestamp;
use kube::Resource;

use super::policy::Policy;
use super::settings::LockSettings;
use crate::api::DistributedLock;
use crate::api::conditions::Stamp;
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
}

/// The stamp of a status edit made now.
pub fn stamp_now(lock: &DistributedLock) -> Stamp {
    Stamp {
        generation: lock.meta().generation,
        now: Timestamp::now(),
    }
}
