//! Job fencing: the queue and its rules (`queue`, pure) and the patches that grant, fence, resume and requeue
//! Jobs (`job_writes`).

pub mod job_writes;
pub mod queue;

pub use job_writes::JobQueue;
pub use queue::{JobStep, LOCK_LABEL};
