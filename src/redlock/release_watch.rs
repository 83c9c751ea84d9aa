//! Releases of a key, for a caller that waits across calls of its own instead of in the engine's retry loop: the
//! operator, whose reconciles of a lock are its attempts. The listening is the engine's own waiters' (`wake.rs`):
//! one connection per master and process, a key's channel subscribed while anyone here watches it, a release
//! counted once a majority of masters announced it. Announcements only ever trigger attempts.

use std::future::Future;

use super::client::Redlock;
use super::scripts::released_channel;
use super::wake::Interest;

/// What the masters had announced on a key's channel when an attempt began: the releases a wait after that
/// attempt counts are the later ones.
#[derive(Clone, Debug)]
pub struct ReleaseMark(Vec<u64>);

/// Listening for releases of one key, kept from one refused attempt to the next (dropped, the key's channel is
/// left once nothing else here listens on it). Kept rather than opened per attempt: a channel subscribed anew
/// counts as announced (what happened before is unknown), which would wake the wait at once, every time.
pub struct ReleaseWatch {
    interest: Interest,
    resource: String,
}

impl Redlock {
    /// What was announced on `resource`'s channel so far, when anything in this process listens there (`None`:
    /// nothing does, and a watch opened after the attempt counts from its subscription). Taken before the attempt.
    pub fn releases_heard(&self, resource: &str) -> Option<ReleaseMark> {
        self.inner
            .wakes
            .heard(&released_channel(resource))
            .map(ReleaseMark)
    }

    /// Starts listening for releases of `resource`, counting those after `since` (from
    /// [`Redlock::releases_heard`] before the refused attempt). `None` where waiters do not listen (the
    /// poll-only control of tests and benchmarks).
    pub fn watch_releases(&self, resource: &str, since: Option<ReleaseMark>) -> Option<ReleaseWatch> {
        let (listens, _) = self.inner.config.waiting_pace();
        if !listens {
            return None;
        }
        let inner = &self.inner;
        let interest = inner.wakes.listen(
            &inner.nodes,
            &inner.shutdown,
            &released_channel(resource),
            since.map(|mark| mark.0),
        );
        Some(ReleaseWatch {
            interest,
            resource: resource.to_owned(),
        })
    }
}

impl ReleaseWatch {
    /// An attempt begins: only releases announced from now on end the wait that follows it.
    pub fn attempting(&mut self) {
        self.interest.attempting();
    }

    /// Resolves once a majority of masters announced `releases` releases of the key since the last attempt began
    /// (a waiter at place p needs p - 1 hand-overs ahead of it before its turn); never, if they do not. The
    /// future owns what it needs: a task waits on it while the watch stays with its owner.
    pub fn released(&self, releases: u64) -> impl Future<Output = ()> + Send + 'static {
        self.interest.wait(releases)
    }

    /// Whether this watches `resource` through `engine`'s masters.
    pub fn watches(&self, engine: &Redlock, resource: &str) -> bool {
        self.resource == resource && self.interest.is_from(&engine.inner.wakes)
    }
}
