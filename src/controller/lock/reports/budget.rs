//! What reports may cost the API server: a `TokenReview` (and, for a token it accepts, the direct reads of the
//! lock and the pod) is spent only within a bound on how many are in flight and how many start per second, and a
//! token the API server refused is remembered for a while and refused again without asking. Beyond the bounds a
//! report is answered `429 Too Many Requests` with `Retry-After`, at no cost to the API server.
//!
//! Reviews go through two lanes: one for reports the operator's own cache finds plausible (the token claims the
//! namespace of a lock whose status records that permit's key as given up with that fencing token, which is
//! when `elect` and the guard report), and one for every other report. A flood of tokens that claim nothing
//! real then leaves a holder's genuine report its own budget; it is a priority, not a check (the cache may lag
//! the holder's watch, and such a report goes through the other lane).
//!
//! The decisions (the bucket, the memory of refusals) take the time as an argument, so they are tested with a
//! clock the test moves.

use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use lru::LruCache;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Reviews in flight at once, and started per second (with as many at once after a quiet second), for reports
/// the cache does not find plausible: a genuine report lands here only when the cache lags the holder's watch.
pub const OTHER_IN_FLIGHT: usize = 4;
pub const OTHER_PER_SECOND: u32 = 5;
/// The same for plausible reports: a hand-over makes one per holder, seldom more than a few at once. Both lanes
/// together: at most 6 reviews in flight and 15 per second (after a quiet second, a burst of 15).
pub const PLAUSIBLE_IN_FLIGHT: usize = 2;
pub const PLAUSIBLE_PER_SECOND: u32 = 10;
/// How long, and for how many tokens at most, a token the API server refused is refused again without asking.
pub const REFUSAL_MEMORY: Duration = Duration::from_secs(60);
pub const REFUSALS_KEPT: usize = 4096;

/// A token bucket: `capacity` tokens, refilled at `per_second`. Written out rather than taken from a crate
/// (governor) because it is these few lines, is driven by the instant it is given (tested with a fake clock),
/// and sits behind a mutex held for no more than the arithmetic.
#[derive(Debug)]
pub struct Bucket {
    capacity: f64,
    per_second: f64,
    tokens: f64,
    last: Instant,
}

impl Bucket {
    /// Full at `now`.
    pub fn new(capacity: u32, per_second: u32, now: Instant) -> Self {
        Self {
            capacity: f64::from(capacity.max(1)),
            per_second: f64::from(per_second.max(1)),
            tokens: f64::from(capacity.max(1)),
            last: now,
        }
    }

    /// Takes a token at `now`; if there is none, how long until there is one.
    pub fn take(&mut self, now: Instant) -> Result<(), Duration> {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.per_second).min(self.capacity);
        self.last = self.last.max(now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - self.tokens) / self.per_second))
        }
    }
}

/// Tokens the API server refused lately, by their SHA-256 digest (the token itself is not kept). At most
/// `capacity`, the least recently seen forgotten first; each for `ttl` after its refusal.
pub struct Refusals {
    ttl: Duration,
    entries: LruCache<[u8; 32], Instant>,
}

impl Refusals {
    pub fn new(ttl: Duration, capacity: usize) -> Self {
        Self {
            ttl,
            entries: LruCache::new(NonZeroUsize::new(capacity).unwrap_or(NonZeroUsize::MIN)),
        }
    }

    /// The digest a token is remembered by.
    pub fn digest(token: &str) -> [u8; 32] {
        let digest = ring::digest::digest(&ring::digest::SHA256, token.as_bytes());
        let mut out = [0; 32];
        out.copy_from_slice(digest.as_ref());
        out
    }

    /// Remembers that the token of `digest` was refused at `now`.
    pub fn remember(&mut self, digest: [u8; 32], now: Instant) {
        self.entries.put(digest, now);
    }

    /// Whether the token of `digest` was refused less than the memory's time before `now`.
    pub fn refused(&mut self, digest: &[u8; 32], now: Instant) -> bool {
        match self.entries.get(digest) {
            Some(at) if now.saturating_duration_since(*at) < self.ttl => true,
            Some(_) => {
                self.entries.pop(digest);
                false
            }
            None => false,
        }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// Why a review cannot be spent now, and when to try again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Busy {
    /// As many reports as allowed are being reviewed or read.
    InFlight,
    /// The reviews of this second were spent; the next one is possible after this long.
    Rate(Duration),
}

impl Busy {
    /// For `Retry-After`: whole seconds, at least one.
    pub fn retry_after_secs(self) -> u64 {
        match self {
            Self::InFlight => 1,
            Self::Rate(wait) => wait.as_secs_f64().ceil().max(1.0) as u64,
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Self::InFlight => "reviews_in_flight",
            Self::Rate(_) => "review_rate",
        }
    }
}

/// One lane: reviews in flight (held until the report is decided, the reads after the review included) and a
/// bucket of reviews per second.
pub struct Lane {
    in_flight: Arc<Semaphore>,
    bucket: Mutex<Bucket>,
}

impl Lane {
    pub fn new(in_flight: usize, per_second: u32, now: Instant) -> Self {
        Self {
            in_flight: Arc::new(Semaphore::new(in_flight)),
            bucket: Mutex::new(Bucket::new(per_second, per_second, now)),
        }
    }

    /// A place for one report's review and reads, or why there is none. A report refused for the number in
    /// flight takes no token from the bucket.
    pub fn admit(&self, now: Instant) -> Result<OwnedSemaphorePermit, Busy> {
        let permit = self
            .in_flight
            .clone()
            .try_acquire_owned()
            .map_err(|_| Busy::InFlight)?;
        self.bucket
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take(now)
            .map_err(Busy::Rate)?;
        Ok(permit)
    }
}

/// Everything the endpoint keeps between reports.
pub struct Budget {
    pub plausible: Lane,
    pub other: Lane,
    pub refusals: Mutex<Refusals>,
}

impl Default for Budget {
    fn default() -> Self {
        let now = Instant::now();
        Self {
            plausible: Lane::new(PLAUSIBLE_IN_FLIGHT, PLAUSIBLE_PER_SECOND, now),
            other: Lane::new(OTHER_IN_FLIGHT, OTHER_PER_SECOND, now),
            refusals: Mutex::new(Refusals::new(REFUSAL_MEMORY, REFUSALS_KEPT)),
        }
    }
}

impl Budget {
    pub fn refused(&self, digest: &[u8; 32], now: Instant) -> bool {
        self.refusals
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .refused(digest, now)
    }

    pub fn remember_refusal(&self, digest: [u8; 32], now: Instant) {
        self.refusals
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remember(digest, now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn the_bucket_allows_a_burst_then_its_rate() {
        let start = Instant::now();
        let mut bucket = Bucket::new(20, 20, start);
        for _ in 0..20 {
            assert_eq!(bucket.take(start), Ok(()));
        }
        // Empty: the next token comes in 1/20 s.
        assert_eq!(bucket.take(start), Err(50 * MS));
        assert_eq!(bucket.take(start + 25 * MS), Err(25 * MS));
        assert_eq!(bucket.take(start + 50 * MS), Ok(()));
        assert!(bucket.take(start + 50 * MS).is_err());
        // Over ten seconds of asking every millisecond, 20 per second and no more.
        let mut taken = 0;
        for ms in 51..10_051 {
            if bucket.take(start + ms * MS).is_ok() {
                taken += 1;
            }
        }
        assert!((199..=201).contains(&taken), "{taken} taken in 10 s");
        // A quiet minute refills it to its capacity, not beyond.
        let later = start + Duration::from_secs(70);
        for _ in 0..20 {
            assert_eq!(bucket.take(later), Ok(()));
        }
        assert!(bucket.take(later).is_err());
    }

    #[test]
    fn the_bucket_does_not_go_back_in_time() {
        let start = Instant::now() + Duration::from_secs(1);
        let mut bucket = Bucket::new(1, 1, start);
        assert_eq!(bucket.take(start), Ok(()));
        // An instant taken before the last one (two threads) adds nothing.
        assert!(bucket.take(start - 500 * MS).is_err());
        assert_eq!(bucket.take(start + Duration::from_secs(1)), Ok(()));
    }

    #[test]
    fn refusals_are_remembered_for_a_while() {
        let start = Instant::now();
        let mut refusals = Refusals::new(Duration::from_secs(60), 4096);
        let forged = Refusals::digest("forged");
        assert!(!refusals.refused(&forged, start));
        refusals.remember(forged, start);
        assert!(refusals.refused(&forged, start + Duration::from_secs(59)));
        assert!(!refusals.refused(&Refusals::digest("another"), start));
        // Forgotten after the memory's time, and no longer kept.
        assert!(!refusals.refused(&forged, start + Duration::from_secs(60)));
        assert!(refusals.is_empty());
    }

    #[test]
    fn refusals_kept_are_bounded_the_oldest_forgotten_first() {
        let start = Instant::now();
        let mut refusals = Refusals::new(Duration::from_secs(60), 3);
        for token in ["a", "b", "c"] {
            refusals.remember(Refusals::digest(token), start);
        }
        // "a" seen again: "b" is now the least recently seen.
        assert!(refusals.refused(&Refusals::digest("a"), start));
        refusals.remember(Refusals::digest("d"), start);
        assert_eq!(refusals.len(), 3);
        assert!(!refusals.refused(&Refusals::digest("b"), start));
        for kept in ["a", "c", "d"] {
            assert!(refusals.refused(&Refusals::digest(kept), start), "{kept}");
        }
    }

    #[test]
    fn a_lane_bounds_what_is_in_flight_and_per_second() {
        let start = Instant::now();
        let lane = Lane::new(2, 3, start);
        let first = lane.admit(start).expect("first");
        let second = lane.admit(start).expect("second");
        assert_eq!(lane.admit(start).err(), Some(Busy::InFlight));
        drop(first);
        let third = lane.admit(start).expect("third, once one ended");
        drop((second, third));
        // Three per second: the fourth waits a third of a second.
        let refused = lane.admit(start).expect_err("the bucket is empty");
        assert!(matches!(refused, Busy::Rate(wait) if wait > 300 * MS && wait <= 334 * MS));
        assert_eq!(refused.retry_after_secs(), 1);
        assert!(lane.admit(start + 334 * MS).is_ok());
        // Refused for the number in flight, a report takes no token.
        let lane = Lane::new(1, 1, start);
        let held = lane.admit(start).expect("held");
        assert_eq!(
            lane.admit(start + Duration::from_secs(5)).err(),
            Some(Busy::InFlight)
        );
        drop(held);
        assert!(lane.admit(start + Duration::from_secs(5)).is_ok());
    }

    #[test]
    fn every_local_refusal_has_its_series() {
        use crate::controller::lock::reports::token_shape::NotAToken;
        use crate::telemetry::metrics::LOCAL_REFUSAL_REASONS;
        let labels = [
            NotAToken::Shape.label(),
            NotAToken::Audience.label(),
            NotAToken::Expired.label(),
            NotAToken::NotYetValid.label(),
            NotAToken::NotPodBound.label(),
            super::super::endpoint::REFUSED_LATELY,
            Busy::InFlight.label(),
            Busy::Rate(MS).label(),
        ];
        assert_eq!(labels, LOCAL_REFUSAL_REASONS);
    }

    #[test]
    fn retry_after_is_whole_seconds_at_least_one() {
        assert_eq!(Busy::Rate(MS).retry_after_secs(), 1);
        assert_eq!(Busy::Rate(1001 * MS).retry_after_secs(), 2);
        assert_eq!(Busy::InFlight.retry_after_secs(), 1);
    }
}
