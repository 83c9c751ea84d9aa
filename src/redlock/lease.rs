//! A granted lock ([`Lease`]) and the rules every grant and extension goes by, written once: the validity an
//! operation leaves, the lease it makes, and the next fencing token to propose. Acquire, extend (single and
//! batched) and semaphore permits all come here; the product's safety rests on [`validity_left`].

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::error::AcquireError;
use super::outcome::{NodeOutcome, OperationReport};
use super::value::LockValue;

/// The validity an operation leaves: the TTL less the time from the operation's start (before any write was sent)
/// to its decision, less the clock-drift allowance, all on the monotonic clock. A master's key set or extended by
/// the operation lives at least the TTL from when that master received it, which is after `started`, so no other
/// holder can exist before `started + validity` on a majority, as long as the masters' clocks do not run faster
/// than the drift allows. `None` when nothing is left: the operation failed however many masters agreed.
pub fn validity_left(
    ttl: Duration,
    started: Instant,
    decided_at: Instant,
    drift: Duration,
) -> Option<Duration> {
    ttl.checked_sub(decided_at.saturating_duration_since(started))
        .and_then(|left| left.checked_sub(drift))
        .filter(|validity| !validity.is_zero())
}

/// The proposal after `token`, or why there is none.
pub(super) fn next_token(resource: &str, token: i64) -> Result<i64, AcquireError> {
    token.checked_add(1).ok_or_else(|| AcquireError::TokenExhausted {
        resource: resource.to_owned(),
        counter: token,
    })
}

/// What a lease holds, whatever operation granted it: the key, the value on it, its TTL, token and permit.
pub(super) struct Holding {
    pub resource: Arc<str>,
    pub value: LockValue,
    pub ttl: Duration,
    pub token: i64,
    pub permit: u32,
}

/// A granted lock: who holds it and until when it is safe to act on it.
#[derive(Clone, Debug)]
pub struct Lease {
    pub(super) resource: Arc<str>,
    pub(super) value: LockValue,
    pub(super) ttl: Duration,
    pub(super) granted_at: Instant,
    pub(super) valid_until: Instant,
    /// The fencing token this lock was granted with (0: unknown, for a lock taken over without one).
    pub(super) token: i64,
    /// Shared, so that a copy of a lease (the keeper hands one to every extension batch) costs no allocation.
    pub(super) report: Arc<OperationReport>,
    /// Masters where this lease's extensions re-created the key in a round that failed (see
    /// [`Lease::after_failed_extension`]); they do not vote for it until an extension succeeds without them.
    /// `None`, the usual case, costs nothing to copy.
    pub(super) unconfirmed: Option<Arc<[usize]>>,
    /// Which permit of a semaphore this lease holds (0 for a plain lock: its key is the semaphore's key).
    pub(super) permit: u32,
}

impl Lease {
    /// The lease an operation that started at `started` gives `holding` with `validity` (from
    /// [`validity_left`]): every master of its majority confirmed it, so none is unconfirmed.
    pub(super) fn granted(
        holding: Holding,
        started: Instant,
        validity: Duration,
        report: OperationReport,
    ) -> Self {
        Self {
            resource: holding.resource,
            value: holding.value,
            ttl: holding.ttl,
            granted_at: started,
            valid_until: started + validity,
            token: holding.token,
            report: Arc::new(report),
            unconfirmed: None,
            permit: holding.permit,
        }
    }

    /// What this lease holds, for the lease an extension makes of it.
    pub(super) fn holding(&self) -> Holding {
        Holding {
            resource: self.resource.clone(),
            value: self.value.clone(),
            ttl: self.ttl,
            token: self.token,
            permit: self.permit,
        }
    }

    pub fn resource(&self) -> &str {
        &self.resource
    }

    /// A lease that no engine granted, for tests of code that only reads leases.
    #[doc(hidden)]
    pub fn for_tests(resource: &str, value: LockValue, ttl: Duration, granted_at: Instant) -> Self {
        Self::unproven(resource, value, ttl, granted_at, 1)
    }

    /// A lease no operation granted: `value` on `resource` for `ttl` from `at`, token 0 (unknown), on masters
    /// whose majority is `quorum`. What a takeover ([`Redlock::reclaim`]) sends to be extended, and what tests
    /// of code that only reads leases hold.
    pub(super) fn unproven(
        resource: &str,
        value: LockValue,
        ttl: Duration,
        at: Instant,
        quorum: usize,
    ) -> Self {
        Self {
            resource: resource.into(),
            value,
            ttl,
            granted_at: at,
            valid_until: at + ttl,
            token: 0,
            report: Arc::new(OperationReport {
                nodes: Vec::new(),
                elapsed: Duration::ZERO,
                quorum,
            }),
            unconfirmed: None,
            permit: 0,
        }
    }

    /// This lease with fencing token `token`: what a takeover makes of its extended [`Lease::unproven`] probe
    /// once a majority confirmed the predecessor's value.
    pub(super) fn with_token(self, token: i64) -> Self {
        Self { token, ..self }
    }

    /// The fencing token: higher than every token granted before for this key on these masters (see the
    /// README's guarantees for what can break that), to be passed to whatever the holder writes to.
    pub fn fencing_token(&self) -> i64 {
        self.token
    }

    pub fn holder(&self) -> &str {
        self.value.holder()
    }

    /// The value this lease holds the key with, for releasing it later without the lease.
    pub fn value(&self) -> &LockValue {
        &self.value
    }

    /// The permit this lease holds, of a semaphore (see [`Redlock::acquire_permit`]); 0 for a plain lock.
    pub fn permit(&self) -> u32 {
        self.permit
    }

    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// When the operation that granted (or last extended) this lease started.
    pub fn granted_at(&self) -> Instant {
        self.granted_at
    }

    /// The end of the window in which no other holder can exist (TTL minus elapsed time minus drift).
    pub fn valid_until(&self) -> Instant {
        self.valid_until
    }

    pub fn validity(&self) -> Duration {
        self.valid_until - self.granted_at
    }

    pub fn remaining(&self, now: Instant) -> Duration {
        self.valid_until.saturating_duration_since(now)
    }

    /// Per-master outcomes of the operation that granted or last extended this lease.
    pub fn report(&self) -> &OperationReport {
        &self.report
    }

    /// The lease to retry with after an extension that failed but did not lose the lock (`NoQuorum`): masters
    /// where that round re-created the key no longer vote for it until an extension succeeds. A re-created key
    /// shows that the master lost ours (FLUSHALL, eviction, a restart), and says nothing about who could have
    /// held that master meanwhile; counted in the next round, it would hide a loss on a majority that the
    /// round itself caught.
    pub fn after_failed_extension(&self, report: &OperationReport) -> Lease {
        let mut unconfirmed: Vec<usize> = self.unconfirmed.as_deref().unwrap_or_default().to_vec();
        for (index, node) in report.nodes.iter().enumerate() {
            if node.outcome == NodeOutcome::Recreated && !unconfirmed.contains(&index) {
                unconfirmed.push(index);
            }
        }
        Lease {
            unconfirmed: (!unconfirmed.is_empty()).then(|| unconfirmed.into()),
            ..self.clone()
        }
    }

    /// The masters (by index) that do not vote for this lease until an extension succeeds.
    pub fn unconfirmed(&self) -> &[usize] {
        self.unconfirmed.as_deref().unwrap_or_default()
    }

    /// What master `index` answered an extension of this lease, as a vote counts it: a key this lease
    /// re-created in a failed round is extended as repair, not as a vote.
    pub(super) fn counted(&self, index: usize, outcome: NodeOutcome) -> NodeOutcome {
        match outcome {
            NodeOutcome::Granted
                if self
                    .unconfirmed
                    .as_deref()
                    .is_some_and(|masters| masters.contains(&index)) =>
            {
                NodeOutcome::Recreated
            }
            other => other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: Duration = Duration::from_millis(10_000);
    const DRIFT: Duration = Duration::from_millis(102);

    #[tokio::test(start_paused = true)]
    async fn the_validity_is_the_ttl_less_the_time_taken_less_the_drift() {
        let started = Instant::now();
        assert_eq!(
            validity_left(TTL, started, started, DRIFT),
            Some(Duration::from_millis(9_898))
        );
        let later = started + Duration::from_millis(400);
        assert_eq!(
            validity_left(TTL, started, later, DRIFT),
            Some(Duration::from_millis(9_498))
        );
    }

    #[tokio::test(start_paused = true)]
    async fn no_validity_is_left_at_the_boundary_or_past_it() {
        let started = Instant::now();
        let boundary = started + (TTL - DRIFT);
        assert_eq!(
            validity_left(TTL, started, boundary - Duration::from_nanos(1), DRIFT),
            Some(Duration::from_nanos(1)),
            "a nanosecond before the boundary, a nanosecond is left"
        );
        assert_eq!(validity_left(TTL, started, boundary, DRIFT), None, "zero is none");
        assert_eq!(validity_left(TTL, started, started + TTL, DRIFT), None);
        assert_eq!(
            validity_left(TTL, started, started + TTL * 2, DRIFT),
            None,
            "no underflow"
        );
        assert_eq!(validity_left(DRIFT, started, started, DRIFT), None, "all drift");
        assert_eq!(
            validity_left(Duration::ZERO, started, started, Duration::ZERO),
            None
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_decision_before_the_start_counts_as_none_taken() {
        let started = Instant::now() + Duration::from_secs(1);
        assert_eq!(
            validity_left(TTL, started, Instant::now(), DRIFT),
            Some(TTL - DRIFT)
        );
    }

    #[test]
    fn the_next_token_is_one_more_until_there_is_none() {
        assert_eq!(next_token("k", 4).ok(), Some(5));
        assert!(matches!(
            next_token("k", i64::MAX),
            Err(AcquireError::TokenExhausted {
                counter: i64::MAX,
                ..
            })
        ));
    }
}
