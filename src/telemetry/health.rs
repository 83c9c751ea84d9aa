//! What `/healthz` and `/readyz` answer.

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// A watch that has failed for longer than this makes the replica unready.
const WATCH_GRACE: Duration = Duration::from_secs(30);

/// Readiness means every watch has synced once and none has been failing for long.
pub struct Health {
    watches: Mutex<Vec<WatchState>>,
}

struct WatchState {
    name: &'static str,
    synced: bool,
    failing_since: Option<Instant>,
}

impl Health {
    pub fn new(watches: &[&'static str]) -> Self {
        Self {
            watches: Mutex::new(
                watches
                    .iter()
                    .map(|name| WatchState {
                        name,
                        synced: false,
                        failing_since: None,
                    })
                    .collect(),
            ),
        }
    }

    /// The watch delivered its whole initial list: the cache it fills can be acted on.
    pub fn watch_synced(&self, name: &str) {
        self.update(name, |watch| {
            watch.synced = true;
            watch.failing_since = None;
        });
    }

    /// The watch delivered an event: it works (whether or not its first list is complete).
    pub fn watch_ok(&self, name: &str) {
        self.update(name, |watch| watch.failing_since = None);
    }

    pub fn watch_failed(&self, name: &str) {
        self.update(name, |watch| {
            watch.failing_since.get_or_insert_with(Instant::now);
        });
    }

    /// `Ok` when ready, otherwise what is not.
    pub fn ready(&self) -> Result<(), String> {
        let now = Instant::now();
        let watches = self
            .watches
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let problems: Vec<String> = watches
            .iter()
            .filter_map(|watch| {
                if !watch.synced {
                    Some(format!("{}: not synced yet", watch.name))
                } else {
                    watch
                        .failing_since
                        .filter(|since| now.saturating_duration_since(*since) > WATCH_GRACE)
                        .map(|since| {
                            format!(
                                "{}: failing for {}s",
                                watch.name,
                                now.saturating_duration_since(since).as_secs()
                            )
                        })
                }
            })
            .collect();
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems.join("; "))
        }
    }

    fn update(&self, name: &str, change: impl FnOnce(&mut WatchState)) {
        let mut watches = self
            .watches
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(watch) = watches.iter_mut().find(|watch| watch.name == name) {
            change(watch);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn ready_once_synced_and_unready_only_after_a_grace() {
        let health = Health::new(&["locks", "quorums"]);
        assert!(health.ready().is_err());
        health.watch_ok("locks");
        health.watch_ok("quorums");
        assert!(
            health.ready().unwrap_err().contains("not synced"),
            "events of a list that has not ended are no sync"
        );
        health.watch_synced("locks");
        health.watch_synced("quorums");
        assert_eq!(health.ready(), Ok(()));
        health.watch_failed("locks");
        tokio::time::advance(Duration::from_secs(10)).await;
        assert_eq!(health.ready(), Ok(()), "a watch restart is not an outage");
        tokio::time::advance(Duration::from_secs(25)).await;
        assert!(health.ready().unwrap_err().contains("locks: failing"));
        health.watch_ok("locks");
        assert_eq!(health.ready(), Ok(()));
    }
}
