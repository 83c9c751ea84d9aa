//! Waiting for a condition, the one way the tests, the in-cluster suite and the benches do it: poll a probe every
//! `every` until it yields a value, or give up once `patience` has passed (an upper bound for a loaded machine,
//! never what a test asserts about timing).

use std::time::{Duration, Instant};

/// Polls `probe` until it yields a value; `Err(waited)` once `patience` has passed without one. The probe runs
/// at least once, and once more after the deadline, so that a slow last poll is not lost.
pub async fn until<T>(
    patience: Duration,
    every: Duration,
    mut probe: impl AsyncFnMut() -> Option<T>,
) -> Result<T, Duration> {
    let started = Instant::now();
    loop {
        let late = started.elapsed() >= patience;
        if let Some(value) = probe().await {
            return Ok(value);
        }
        if late {
            return Err(started.elapsed());
        }
        tokio::time::sleep(every).await;
    }
}

/// [`until`] for a blocking probe (a test that drives processes from a plain thread).
pub fn until_blocking<T>(
    patience: Duration,
    every: Duration,
    mut probe: impl FnMut() -> Option<T>,
) -> Result<T, Duration> {
    let started = Instant::now();
    loop {
        let late = started.elapsed() >= patience;
        if let Some(value) = probe() {
            return Ok(value);
        }
        if late {
            return Err(started.elapsed());
        }
        std::thread::sleep(every);
    }
}
