//! Leader election among pods: the election rule (`rule`, pure), the leader label on pods (`pod_writes`), and the
//! pods left out for want of answers (`unready`).

pub mod pod_writes;
pub mod rule;
pub mod unready;

pub use pod_writes::Election;
