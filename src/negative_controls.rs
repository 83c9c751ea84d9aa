//! Switches that each break one safeguard of the operator, for the negative controls of the product safety
//! checker (`tests/support/product_safety/`): a checker that never fails proves nothing, so each of these must be
//! caught by it. And [`Baseline`]s: switches that take a speed-up away, safety untouched, so that a benchmark
//! measures the figure without it in the same run.
//!
//! They exist only in builds with the `negative-controls` feature, which only the tests and benchmarks enable
//! (through the package's dev-dependency on itself); a release build has none of them, [`active`] is then a
//! constant `false`. Even where compiled in, each is off unless the environment variable
//! `REDLOCK_NEGATIVE_CONTROLS` (comma-separated names) names it.

/// The environment variable that turns controls on (in builds with the feature only).
pub const ENV: &str = "REDLOCK_NEGATIVE_CONTROLS";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Control {
    /// The keeper fences a lock that cannot be extended two fence margins after its validity ends instead of
    /// one before it.
    FenceAfterValidity,
    /// Restarted masters vote at once: every quorum is treated as `assumeDurable`.
    NoQuarantine,
    /// The cluster's fencing-token floor record is neither read nor written.
    NoFloorRecord,
    /// A key given up (lost, moved, deleted) is released at once instead of once the validity shown to its holder
    /// has ended.
    ReleaseAtOnce,
    /// `elect` and the guard stop at status's `validUntil` on their own wall clock, less their margin, even where
    /// status offers a channel to ask the active replica (as holders did before issue 48).
    HoldersTrustWallClock,
}

impl Control {
    pub const ALL: [Control; 5] = [
        Control::FenceAfterValidity,
        Control::NoQuarantine,
        Control::NoFloorRecord,
        Control::ReleaseAtOnce,
        Control::HoldersTrustWallClock,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Control::FenceAfterValidity => "fence-after-validity",
            Control::NoQuarantine => "no-quarantine",
            Control::NoFloorRecord => "no-floor-record",
            Control::ReleaseAtOnce => "release-at-once",
            Control::HoldersTrustWallClock => "holders-trust-wall-clock",
        }
    }
}

/// Whether `control` is on in this process.
#[cfg(feature = "negative-controls")]
pub fn active(control: Control) -> bool {
    static ON: std::sync::LazyLock<Vec<Control>> = std::sync::LazyLock::new(|| {
        let named = std::env::var(ENV).unwrap_or_default();
        let on: Vec<Control> = Control::ALL
            .into_iter()
            .filter(|control| named.split(',').any(|name| name.trim() == control.name()))
            .collect();
        if !on.is_empty() {
            tracing::warn!(controls = ?on, "NEGATIVE CONTROLS ON: safeguards are broken on purpose");
        }
        on
    });
    ON.contains(&control)
}

/// Whether `control` is on in this process: never, in a build without the `negative-controls` feature.
#[cfg(not(feature = "negative-controls"))]
#[inline]
pub fn active(_control: Control) -> bool {
    false
}

/// A speed-up taken away for a benchmark's baseline (named in `REDLOCK_NEGATIVE_CONTROLS` like the controls).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Baseline {
    /// A lock queued for a key is not woken when the key is released: it asks again at its poll only.
    NoReleaseWakes,
}

impl Baseline {
    pub fn name(self) -> &'static str {
        match self {
            Baseline::NoReleaseWakes => "no-release-wakes",
        }
    }
}

/// Whether `baseline` is on in this process.
#[cfg(feature = "negative-controls")]
pub fn baseline(baseline: Baseline) -> bool {
    static NAMED: std::sync::LazyLock<String> =
        std::sync::LazyLock::new(|| std::env::var(ENV).unwrap_or_default());
    NAMED.split(',').any(|name| name.trim() == baseline.name())
}

/// Whether `baseline` is on in this process: never, in a build without the `negative-controls` feature.
#[cfg(not(feature = "negative-controls"))]
#[inline]
pub fn baseline(_baseline: Baseline) -> bool {
    false
}

/// The environment variable that shifts the wall clock of `elect` and the Job guard by this many milliseconds
/// (negative: behind), for the tests that prove their stop time does not rest on it (in builds with the feature
/// only).
pub const WALL_CLOCK_OFFSET_ENV: &str = "REDLOCK_TEST_WALL_CLOCK_OFFSET_MS";

/// How far the holders' wall clock is shifted in this process (`WALL_CLOCK_OFFSET_ENV`).
#[cfg(feature = "negative-controls")]
pub fn wall_clock_offset() -> k8s_openapi::jiff::SignedDuration {
    static OFFSET: std::sync::LazyLock<i64> = std::sync::LazyLock::new(|| {
        let offset = std::env::var(WALL_CLOCK_OFFSET_ENV)
            .ok()
            .and_then(|millis| millis.trim().parse().ok())
            .unwrap_or(0);
        if offset != 0 {
            tracing::warn!(
                offset_ms = offset,
                "TEST WALL CLOCK OFFSET: this holder's wall clock is shifted on purpose"
            );
        }
        offset
    });
    k8s_openapi::jiff::SignedDuration::from_millis(*OFFSET)
}

/// How far the holders' wall clock is shifted: never, in a build without the `negative-controls` feature.
#[cfg(not(feature = "negative-controls"))]
#[inline]
pub fn wall_clock_offset() -> k8s_openapi::jiff::SignedDuration {
    k8s_openapi::jiff::SignedDuration::ZERO
}
