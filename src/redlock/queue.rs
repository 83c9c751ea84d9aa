//! A waiter in a key's fair queue, as the engine tells the masters about it, and the queue's pace: how often a
//! waiter asks, and how long a master keeps one it no longer hears from. The queue itself lives on the masters
//! (`scripts.rs`); what wakes a waiter before its pace is up is `wake.rs`.

use std::time::Duration;

use super::scripts::millis;

/// How often a waiter that is not told of releases asks again (the poll-only pace: before waiters listened,
/// every waiter's), which is also how soon it notices the key let go.
pub const QUEUE_POLL: Duration = Duration::from_millis(200);

/// How often a waiter that listens for releases (`wake.rs`) asks again when it hears nothing: the fallback for
/// a key that expired (nobody announces an expiry) and for an announcement lost with a listening connection.
pub const QUEUE_FALLBACK: Duration = Duration::from_secs(1);

/// How long a master keeps a waiter at the poll pace queued without hearing from it (the operator's waiters, and
/// the shortest any waiter is kept): the longest a waiter that died or was cut off holds up the ones behind it.
/// Ten times [`QUEUE_POLL`], so that a waiter on a busy machine or behind a slow master does not lose its place.
pub const QUEUE_KEEP: Duration = Duration::from_secs(2);

/// How long the masters keep a waiter that asks every `pace` when it hears nothing: five paces, and at least
/// [`QUEUE_KEEP`] (5 s at [`QUEUE_FALLBACK`]), so that a waiter misses four attempts in a row (a slow master,
/// a busy machine) before it loses its place; which is also how long a waiter that died holds up the ones
/// behind it.
pub fn keep_for(pace: Duration) -> Duration {
    pace.saturating_mul(5).max(QUEUE_KEEP)
}

/// A caller waiting in a key's fair queue, as one attempt tells the masters: who it is (the same in every
/// attempt of one acquisition), the ticket it holds so far (0 before its first), and how long a master keeps it
/// queued without hearing from it again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Waiter {
    pub(super) id: u64,
    pub(super) ticket: i64,
    pub(super) keep_ms: u64,
    /// Granted, it stays first in the queue until it leaves on its own ([`Redlock::leave_won`]): a caller that may
    /// still give the key back (a check it leaves until the key is won) keeps its place for the attempt after.
    ///
    /// [`Redlock::leave_won`]: super::Redlock::leave_won
    pub(super) stays_after_grant: bool,
}

impl Waiter {
    /// A waiter known by `id` (the same in every attempt of one acquisition, and across processes that wait on
    /// behalf of one holder), bringing the highest `ticket` its masters gave it so far (0 before any).
    pub fn new(id: u64, ticket: i64) -> Self {
        Self {
            id,
            ticket: ticket.max(0),
            keep_ms: millis(QUEUE_KEEP),
            stays_after_grant: false,
        }
    }

    /// The same waiter, left first in the queue when granted, until it calls [`Redlock::leave_won`]; given back
    /// meanwhile, the key goes to nobody behind it while the masters keep it (its next attempt within its keep,
    /// [`QUEUE_KEEP`] unless [`Self::keeping`] says otherwise, wins again). For a single key's waiter that brings
    /// a ticket: one granted at its first attempt (ticket 0) leaves with the grant, as a semaphore's waiter does.
    ///
    /// [`Redlock::leave_won`]: super::Redlock::leave_won
    pub fn staying_after_grant(self) -> Self {
        Self {
            stays_after_grant: true,
            ..self
        }
    }

    /// The same waiter, kept queued for `keep` without asking again instead of [`QUEUE_KEEP`] (for a caller that
    /// asks less often, or a test that looks at the queue at its own pace).
    pub fn keeping(self, keep: Duration) -> Self {
        Self {
            keep_ms: millis(keep),
            ..self
        }
    }

    /// The ticket this waiter brings.
    pub fn ticket(&self) -> i64 {
        self.ticket
    }

    /// The waiter's name in the queue: fixed width, so that the queue's tie-break (by name, bytewise) is by
    /// number.
    pub(super) fn name(&self) -> String {
        format!("{:016x}", self.id)
    }
}
