//! The `DistributedLock` controller: validate the spec (`settings`, pure) → observe the holder policy (`policy`)
//! → decide (`decide`, pure) → act on Redis and the API (`actions`; an acquisition's next step: `acquisition`,
//! pure) → status (`status/`: pure edits, a semaphore's permits, the one write). `reconcile` is the entry point and the dispatch. `earlier_values` (pure): which
//! values of a permit's earlier grants, put back on the masters by late writes, an acquisition may delete.
//! Extension itself is the keeper's job; it wakes this reconciler when a lock is lost or its status is due.

use std::time::Duration;

pub mod acquisition;
pub mod actions;
pub mod claim;
pub mod controller_state;
pub mod decide;
pub mod earlier_values;
pub mod handover;
pub mod holder_liveness;
pub mod permit_count;
pub mod policy;
pub mod queue_tickets;
pub mod reconcile;
pub mod release_wakes;
pub mod releasing;
pub mod reports;
pub mod settings;
pub mod status;
pub mod token;
pub mod token_floor;

pub use crate::api::holder_contract::FINALIZER;

/// A held lock is looked at again at least this often even when nothing wakes it.
pub const RESYNC: Duration = Duration::from_secs(300);
