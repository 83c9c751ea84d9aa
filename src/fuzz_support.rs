//! What the property-based tests of the parsers share (`src/redlock/fuzz.rs`, and `tests/fuzz.rs`, which
//! includes this file by its path): the case count and the hang detector. Compiled for tests only.

use std::time::{Duration, Instant};

use proptest::test_runner::Config;

/// A hang detector, not a performance bound: no input takes anywhere near this to parse.
const HANG: Duration = Duration::from_secs(1);

/// `default_cases` cases per property, or as many as `PROPTEST_CASES` says; failures are not written to files.
pub fn config(default_cases: u32) -> Config {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|cases| cases.parse().ok())
        .unwrap_or(default_cases);
    Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    }
}

/// Runs `run`, failing if it took longer than [`HANG`].
pub fn timed<T>(what: &str, run: impl FnOnce() -> T) -> T {
    let started = Instant::now();
    let out = run();
    let took = started.elapsed();
    assert!(took < HANG, "{what} took {took:?}");
    out
}
