//! Keys this replica gave up but may not release yet: their holder was told (its label removed, or status shows
//! the loss or the change), but may believe it holds until the validity it was last shown ends. Not extended;
//! released by the lock reconciler at `release_at` (see `lock::handover`). Kept in memory only: a successor that
//! does not know of one leaves the key to expire on its own, which is never earlier.

use k8s_openapi::jiff::Timestamp;

use crate::redlock::LockValue;

#[derive(Clone, Debug)]
pub struct Retiring {
    pub quorum: String,
    pub key: String,
    pub value: LockValue,
    pub holder: String,
    pub token: i64,
    pub release_at: Timestamp,
}
