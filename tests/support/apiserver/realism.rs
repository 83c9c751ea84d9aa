//! The realistic mode: a server that behaves like a real one under time. Requests and watch events arrive
//! late (jittered), some resources' lists arrive well after other resources' events, watch streams end after a
//! random lifetime, and watches are sometimes answered `410 Expired` so that clients must relist. Every random
//! choice comes from one seeded generator, so the seed printed at start repeats a run's choices (not its
//! timing: which request draws which number still depends on the order requests arrive in).

use std::sync::Mutex;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Where the end-to-end tests read whether to run in realistic mode (`1`).
pub const REALISTIC_ENV: &str = "REDLOCK_E2E_REALISTIC";
/// Where the realistic mode's seed is read from, to repeat a failing run.
pub const SEED_ENV: &str = "REDLOCK_E2E_SEED";

/// A delay drawn uniformly from `min..=max`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Jitter {
    pub min: Duration,
    pub max: Duration,
}

impl Jitter {
    pub const NONE: Jitter = Jitter {
        min: Duration::ZERO,
        max: Duration::ZERO,
    };

    /// Between `a` and `b`, in either order.
    pub fn between(a: Duration, b: Duration) -> Self {
        Jitter {
            min: a.min(b),
            max: a.max(b),
        }
    }

    pub fn fixed(delay: Duration) -> Self {
        Self::between(delay, delay)
    }

    pub fn millis(a: u64, b: u64) -> Self {
        Self::between(Duration::from_millis(a), Duration::from_millis(b))
    }
}

/// How the server departs from answering at once. [`Realism::quick`] departs in nothing.
#[derive(Debug, Clone)]
pub struct Realism {
    /// Seeds every random choice.
    pub seed: u64,
    /// Before each request is handled.
    pub request_latency: Jitter,
    /// Between a change and its watch event. Events of one watch keep their order: an event is never sent
    /// before the one ahead of it, so a late one delays those behind it.
    pub watch_latency: Jitter,
    /// LIST answers of these resources (plural), and the initial ADDED events of their watches from
    /// resourceVersion ""/"0", come this much later, showing the state as of the request: a watcher's initial
    /// list arrives after the events other watchers got meanwhile. Every list of the resource is delayed, a
    /// controller's direct lists too, as on a server slow to list a large resource.
    pub list_delays: Vec<(&'static str, Duration)>,
    /// A watch ends after a lifetime drawn from this range (or at the client's `timeoutSeconds`, if sooner).
    pub watch_lifetime: Option<Jitter>,
    /// The chance (0 to 1) that a watch ending at its lifetime ends with an `410 Expired` event, and that a
    /// watch resuming from a resourceVersion older than the resource's latest change is answered with one:
    /// either way the client must list again.
    pub expiry_chance: f64,
    /// Changes kept per resource for watches that resume; a resourceVersion older than those is `410 Expired`.
    pub history: usize,
}

impl Realism {
    /// No latency, no delays, watches that last until `timeoutSeconds`, and a long history.
    pub fn quick() -> Self {
        Realism {
            seed: 0,
            request_latency: Jitter::NONE,
            watch_latency: Jitter::NONE,
            list_delays: Vec::new(),
            watch_lifetime: None,
            expiry_chance: 0.0,
            history: 10_000,
        }
    }

    /// What the end-to-end tests run with in realistic mode: 2–30 ms on every request and every watch event;
    /// Jobs listed 1.5 s and pods 1 s late (after DistributedLock events, as on a real cluster where the
    /// operator's lock watch is small and its pod and Job watches are not); watches ending after 5–20 s, one
    /// in five with `410 Expired`.
    pub fn typical(seed: u64) -> Self {
        Realism {
            seed,
            request_latency: Jitter::millis(2, 30),
            watch_latency: Jitter::millis(2, 30),
            list_delays: vec![
                ("jobs", Duration::from_millis(1_500)),
                ("pods", Duration::from_millis(1_000)),
            ],
            watch_lifetime: Some(Jitter::millis(5_000, 20_000)),
            expiry_chance: 0.2,
            ..Self::quick()
        }
    }

    /// [`Realism::typical`] when `REDLOCK_E2E_REALISTIC=1`, with the seed from `REDLOCK_E2E_SEED` or a random
    /// one; `None` otherwise.
    pub fn from_env() -> Option<Self> {
        let realistic = std::env::var(REALISTIC_ENV).is_ok_and(|v| v == "1");
        realistic.then(|| Self::typical(seed_from(std::env::var(SEED_ENV).ok().as_deref())))
    }

    /// How late `plural`'s lists are.
    pub(super) fn list_delay(&self, plural: &str) -> Duration {
        self.list_delays
            .iter()
            .find(|(p, _)| *p == plural)
            .map_or(Duration::ZERO, |(_, delay)| *delay)
    }
}

/// The seed `value` names, or a fresh random one when it is missing or not a number.
pub fn seed_from(value: Option<&str>) -> u64 {
    value
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(rand::random)
}

/// The server's seeded source of random choices.
pub(super) struct Dice(Mutex<StdRng>);

impl Dice {
    pub fn new(seed: u64) -> Self {
        Dice(Mutex::new(StdRng::seed_from_u64(seed)))
    }

    fn rng(&self) -> std::sync::MutexGuard<'_, StdRng> {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub fn delay(&self, jitter: Jitter) -> Duration {
        if jitter.max.is_zero() {
            return Duration::ZERO;
        }
        self.rng().random_range(jitter.min..=jitter.max)
    }

    pub fn chance(&self, probability: f64) -> bool {
        probability > 0.0 && self.rng().random_bool(probability.min(1.0))
    }
}
