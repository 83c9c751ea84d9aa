//! Job fencing: the queue and its rules (`queue`, pure), the same rules per permit of a semaphore (`permits`,
//! pure; what the reconciler plans with) and the patches that grant, fence, resume and requeue Jobs
//! (`job_writes`).

pub mod job_writes;
pub mod permits;
pub mod queue;

pub use job_writes::JobQueue;
pub use queue::JobStep;
