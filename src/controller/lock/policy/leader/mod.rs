//! Leader election among pods: the election rule (`rule`, pure) and the leader label on pods (`pod_writes`).

pub mod pod_writes;
pub mod rule;

pub use pod_writes::Election;
