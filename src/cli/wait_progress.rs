//! What `lock --wait` tells a waiting user on stderr: their place in the key's fair queue and who holds the key,
//! at a steady pace. On a terminal one line is rewritten in place; elsewhere (a CI log) a line is written when
//! the place or the holder changes, and at least every [`LOG_EVERY`] while nothing does.

use std::io::{IsTerminal, Write};
use std::time::Duration;

use tokio::time::Instant;

use crate::redlock::{AcquireError, OperationReport};

/// How often a terminal's line is rewritten while waiting (the elapsed time moves).
const TERMINAL_EVERY: Duration = Duration::from_secs(1);

/// How often a log gets a line while nothing changes.
const LOG_EVERY: Duration = Duration::from_secs(10);

/// Where a waiter stands after one refused attempt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Standing {
    /// 1: next once the holder lets go; `None` when no master answered with the queue (its first attempt met
    /// masters still connecting, say).
    pub place: Option<u64>,
    pub holder: Option<String>,
}

impl Standing {
    pub fn of(report: &OperationReport) -> Self {
        Self {
            place: report.queue_place().map(|place| place.place),
            holder: report.blocking_holder(),
        }
    }
}

/// The text of one progress line (without the program's prefix).
pub fn describe(resource: &str, standing: &Standing, waited: Duration) -> String {
    let place = match standing.place {
        Some(1) => "next in the queue".to_owned(),
        Some(place) => format!("place {place} in the queue ({} ahead)", place.saturating_sub(1)),
        None => "no place in a queue yet".to_owned(),
    };
    let holder = match &standing.holder {
        Some(holder) => format!("held by {holder}"),
        None => "holder unknown".to_owned(),
    };
    format!(
        "waiting for `{resource}`: {place}, {holder} ({} waited)",
        crate::duration::format(Duration::from_secs(waited.as_secs()))
    )
}

/// Prints the progress of one acquisition; silent when quiet.
pub struct WaitProgress {
    resource: String,
    quiet: bool,
    terminal: bool,
    started: Instant,
    last: Option<(Instant, Standing)>,
    line_open: bool,
}

impl WaitProgress {
    pub fn new(resource: &str, quiet: bool) -> Self {
        Self {
            resource: resource.to_owned(),
            quiet,
            terminal: std::io::stderr().is_terminal(),
            started: Instant::now(),
            last: None,
            line_open: false,
        }
    }

    /// After a refused attempt that another follows.
    pub fn refused(&mut self, error: &AcquireError) {
        let Some(report) = error.report() else { return };
        let standing = Standing::of(report);
        let now = Instant::now();
        if self.quiet || !due(self.last.as_ref(), &standing, now, self.terminal) {
            return;
        }
        let text = describe(&self.resource, &standing, now.duration_since(self.started));
        let mut stderr = std::io::stderr().lock();
        // A failed write to stderr is no reason to stop waiting.
        let _ = if self.terminal {
            write!(stderr, "\r\x1b[Kredlock-operator lock: {text}")
        } else {
            writeln!(stderr, "redlock-operator lock: {text}")
        };
        self.line_open = self.terminal;
        self.last = Some((now, standing));
    }

    /// Ends a line left open on a terminal, before anything else is printed.
    pub fn finish(&mut self) {
        if self.line_open {
            let _ = writeln!(std::io::stderr());
            self.line_open = false;
        }
    }
}

/// Whether a line is due: the first, a change of place or holder, or the pace's interval since the last one.
fn due(last: Option<&(Instant, Standing)>, standing: &Standing, now: Instant, terminal: bool) -> bool {
    let Some((at, shown)) = last else { return true };
    let every = if terminal { TERMINAL_EVERY } else { LOG_EVERY };
    shown != standing || now.duration_since(*at) >= every
}

#[cfg(test)]
mod tests {
    use super::*;

    fn standing(place: Option<u64>, holder: Option<&str>) -> Standing {
        Standing {
            place,
            holder: holder.map(str::to_owned),
        }
    }

    #[test]
    fn a_line_says_the_place_and_the_holder() {
        let waited = Duration::from_millis(3_400);
        assert_eq!(
            describe("deploy", &standing(Some(3), Some("ci-7")), waited),
            "waiting for `deploy`: place 3 in the queue (2 ahead), held by ci-7 (3s waited)"
        );
        assert_eq!(
            describe("deploy", &standing(Some(1), None), waited),
            "waiting for `deploy`: next in the queue, holder unknown (3s waited)"
        );
        assert_eq!(
            describe("deploy", &standing(None, Some("ci-7")), Duration::ZERO),
            "waiting for `deploy`: no place in a queue yet, held by ci-7 (0s waited)"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn lines_come_on_a_change_or_at_the_pace() {
        let start = Instant::now();
        let shown = (start, standing(Some(2), Some("a")));
        let same = standing(Some(2), Some("a"));
        assert!(due(None, &same, start, false), "the first line");
        let soon = start + Duration::from_millis(300);
        assert!(!due(Some(&shown), &same, soon, false));
        assert!(!due(Some(&shown), &same, soon, true));
        assert!(
            due(Some(&shown), &standing(Some(1), Some("a")), soon, false),
            "moved up"
        );
        assert!(
            due(Some(&shown), &standing(Some(2), Some("b")), soon, false),
            "new holder"
        );
        assert!(due(Some(&shown), &same, start + TERMINAL_EVERY, true));
        assert!(!due(Some(&shown), &same, start + TERMINAL_EVERY, false));
        assert!(due(Some(&shown), &same, start + LOG_EVERY, false));
    }
}
