//! What the keeper keeps apart: a lock, and each permit of it.

use kube::runtime::reflector::ObjectRef;

use crate::api::DistributedLock;

pub type LockRef = ObjectRef<DistributedLock>;

/// One permit of a lock: what the keeper holds, extends and fences on its own (each permit is a key of its own
/// with its own lease and token). Permit 0 is the lock itself, so a plain lock is its permit 0 and a bare
/// [`LockRef`] converts to it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PermitRef {
    pub lock: LockRef,
    pub permit: u32,
}

impl PermitRef {
    pub fn new(lock: LockRef, permit: u32) -> Self {
        Self { lock, permit }
    }
}

/// A lock's name for permit 0 (a plain lock's), the lock's name and the permit otherwise: what logs show.
impl std::fmt::Display for PermitRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.permit {
            0 => write!(f, "{}", self.lock),
            permit => write!(f, "{} permit {permit}", self.lock),
        }
    }
}

impl From<LockRef> for PermitRef {
    fn from(lock: LockRef) -> Self {
        Self::new(lock, 0)
    }
}

impl From<&LockRef> for PermitRef {
    fn from(lock: &LockRef) -> Self {
        Self::new(lock.clone(), 0)
    }
}

impl From<&PermitRef> for PermitRef {
    fn from(permit: &PermitRef) -> Self {
        permit.clone()
    }
}
