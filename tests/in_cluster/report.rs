//! What the suite says while it runs, and what it found: steps and notes on stderr as they happen (written to the
//! stream itself, so that libtest's capture does not hold them back until the end of a six-minute test), and every
//! check with its outcome, listed again at the end. A failed check does not stop the suite: the later phases still
//! run and the test fails at the end with every failed check.

use std::io::Write;
use std::sync::Mutex;
use std::time::{Duration, Instant};

pub struct Report {
    start: Instant,
    checks: Mutex<Vec<Check>>,
}

struct Check {
    name: String,
    passed: bool,
    detail: String,
}

impl Report {
    pub fn new() -> Self {
        Self {
            start: Instant::now(),
            checks: Mutex::new(Vec::new()),
        }
    }

    pub fn start(&self) -> Instant {
        self.start
    }

    /// Seconds since the suite started, as every line shows them.
    pub fn at(&self, instant: Instant) -> f64 {
        instant.saturating_duration_since(self.start).as_secs_f64()
    }

    fn line(&self, text: &str) {
        let stamp = self.at(Instant::now());
        let mut err = std::io::stderr().lock();
        for (i, line) in text.lines().enumerate() {
            let _ = if i == 0 {
                writeln!(err, "[{stamp:7.1}s] {line}")
            } else {
                writeln!(err, "           {line}")
            };
        }
    }

    /// A phase of the suite.
    pub fn step(&self, what: &str) {
        self.line(&format!("=== {what}"));
    }

    /// Something worth knowing, not a check.
    pub fn note(&self, what: &str) {
        self.line(&format!("    {what}"));
    }

    /// Records a check and says at once whether it passed. Returns `passed`.
    pub fn check(&self, name: &str, passed: bool, detail: impl Into<String>) -> bool {
        let detail = detail.into();
        let verdict = if passed { "PASS" } else { "FAIL" };
        self.line(&format!("{verdict} {name}{}", suffix(&detail)));
        self.checks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(Check {
                name: name.to_owned(),
                passed,
                detail,
            });
        passed
    }

    /// [`Report::check`] of a result: `Err` carries what went wrong.
    pub fn check_result(&self, name: &str, result: Result<String, String>) -> bool {
        match result {
            Ok(detail) => self.check(name, true, detail),
            Err(detail) => self.check(name, false, detail),
        }
    }

    /// Every check again, and the names of those that failed.
    pub fn summary(&self) -> Vec<String> {
        let checks = self
            .checks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let failed: Vec<String> = checks
            .iter()
            .filter(|check| !check.passed)
            .map(|check| format!("{}{}", check.name, suffix(&check.detail)))
            .collect();
        let mut text = format!(
            "summary after {:.0} s: {} checks, {} passed, {} failed\n",
            self.at(Instant::now()),
            checks.len(),
            checks.len() - failed.len(),
            failed.len()
        );
        for check in checks.iter() {
            let verdict = if check.passed { "PASS" } else { "FAIL" };
            text.push_str(&format!("  {verdict} {}\n", check.name));
        }
        self.line(&text);
        failed
    }
}

fn suffix(detail: &str) -> String {
    if detail.is_empty() {
        String::new()
    } else {
        format!(": {detail}")
    }
}

/// Polls `probe` every 100 ms until it yields a value, or says what it waited for once `patience` has passed.
pub async fn wait_for<T, F, Fut>(what: &str, patience: Duration, mut probe: F) -> Result<T, String>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    crate::poll::until(patience, Duration::from_millis(100), async || probe().await)
        .await
        .map_err(|_| format!("{what}: not within {} s", patience.as_secs()))
}
