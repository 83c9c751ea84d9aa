//! The lock controller's context: what every reconciler shares (`Context`), and what this controller alone keeps
//! between reconciles. Lost with the replica, nothing of its own is lost for good (the masters, status and the pods
//! say it again). Built in `run/`, so the shared context imports no controller.

use std::collections::{HashMap, HashSet};
use std::ops::Deref;
use std::sync::{Arc, Mutex};

use super::fair_queue::tickets::QueueTickets;
use super::fair_queue::wakes::ReleaseWakes;
use super::holder_liveness::asks::HolderAsks;
use crate::api::DistributedLock;
use crate::controller::cache::stopped_pods::StoppedPods;
use crate::controller::context::Context;

/// What the lock reconciler and the reports endpoint are handed. It reads as the shared context (`Deref`), since
/// every step of the lock controller uses both: the client, caches and keeper everyone uses, and its own state.
pub struct LockContext {
    pub shared: Arc<Context>,
    pub lock_controller: LockControllerState,
}

impl Deref for LockContext {
    type Target = Context;

    fn deref(&self) -> &Context {
        &self.shared
    }
}

#[derive(Default)]
pub struct LockControllerState {
    /// Where holders report that their work stopped (shown in every lock's status); `None`: not taken.
    pub hand_over_url: Option<String>,
    /// The pin of the reports port's certificate, shown beside `hand_over_url`.
    pub hand_over_pin: Option<String>,
    /// The pods that reported so, per given-up grant.
    pub stopped: StoppedPods,
    /// The asks of grants' holders this replica answered: whether each holder still reaches it.
    pub asks: HolderAsks,
    /// The tickets of locks waiting in their keys' fair queues.
    pub queue_tickets: QueueTickets,
    /// Locks waiting in their keys' fair queues, woken when the key is released.
    pub release_wakes: ReleaseWakes,
    /// A lock as this replica's last status write left it, while one reconciliation writes its status several times
    /// in a row (a semaphore's permits, then what its policy shows: see `status::write::write_permit_status`).
    pub(crate) written: Mutex<HashMap<String, Arc<DistributedLock>>>,
    /// Locks claimed by another installation that this process has said it leaves alone (once each).
    pub(crate) left_alone: Mutex<HashSet<String>>,
}

impl LockControllerState {
    /// `hand_over_url` and its certificate's `hand_over_pin`: where holders report (`None`: nowhere).
    pub fn new(hand_over_url: Option<String>, hand_over_pin: Option<String>) -> Self {
        Self {
            hand_over_url,
            hand_over_pin,
            ..Self::default()
        }
    }
}
