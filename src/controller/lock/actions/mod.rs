//! What the lock reconciler does on Redis and the API once it has decided: acquire, resume and refresh
//! (`acquire`, recording each new token in the key's floor record: `super::tokens::floor_record`), fence and take
//! back (`fence`), the steps all ways of holding end with (`holding`: keep the lease, take an
//! acquisition back, show it held), the statuses of a lock nobody may hold now (`wait`), and what the policy shows
//! of the cluster, kept current (`policy_status`). Releasing and giving a key up are the hand-over's
//! (`super::handover`). Every status they write is one of the pure edits in `super::status`.

pub mod acquire;
pub mod fence;
pub mod holder_liveness;
pub mod holding;
pub mod policy_status;
pub mod wait;
