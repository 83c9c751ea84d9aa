//! The `DistributedLock` controller: validate the spec (`settings`, pure) → observe the holder policy (`policy`)
//! → plan each permit's step (`permit_plan`, pure: the policy's turn, then `decide`) → act on Redis and the API (`actions`, on a `target`; an acquisition's next step:
//! `acquisition`, pure) → status (`status/`: pure edits, a semaphore's permits, the one write). `reconcile` is the
//! entry point and the dispatch. A concept per folder: the hand-over and release (`handover/`), fencing tokens
//! (`tokens/`), this replica's part in the fair queues (`fair_queue/`), the holders' reports (`reports/`) and
//! their silence (`holder_liveness/`). Extension itself is the keeper's job; it wakes this reconciler when a lock
//! is lost or its status is due.
use std::time::Duration;

pub mod acquisition;
pub mod actions;
pub mod claim;
pub mod controller_state;
pub mod decide;
pub mod fair_queue;
pub mod handover;
pub mod holder_liveness;
pub mod permit_count;
pub mod permit_plan;
pub mod policy;
pub mod reconcile;
pub mod reports;
pub mod settings;
pub mod status;
pub mod target;
pub mod tokens;

pub use crate::api::holder_contract::FINALIZER;

/// A held lock is looked at again at least this often even when nothing wakes it.
pub const RESYNC: Duration = Duration::from_secs(300);
