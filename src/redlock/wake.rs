//! Waiters are woken, not polled: the release and leave scripts announce on a channel derived from the key
//! (`scripts::released_channel`), and a process that waits listens there, so that its waiters ask again at
//! once instead of at their next poll. Announcements only ever trigger attempts: every grant still goes through
//! the acquire script on a majority, so a spurious, late or lost one changes nothing but when a waiter asks.
//!
//! One listening connection per master and process, whatever the number of keys it waits for, opened when the
//! first waiter listens and closed when the last one stops; each key's channel is subscribed while a waiter of
//! this process waits for it, so only waiters subscribe. It is a dedicated RESP2 pub/sub connection
//! (`Client::get_async_pubsub`), not RESP3 push messages on the multiplexed connection the votes go through
//! (redis-rs 1.x has both, and the masters here are Redis 7): the voting connection keeps its protocol, its
//! replies and its restart check untouched, needs no re-subscription in the reconnect path that guards the
//! votes, and a listener that is cut (`CLIENT KILL TYPE pubsub`, a master restarted) costs a notification,
//! never a vote. Masters older than Redis 6 (no RESP3) listen alike.
//!
//! A waiter wakes once a majority of masters announced since its last attempt began (their counts per master
//! below): a release is decided at a majority, so by then the key is free where it must be, and the several
//! masters' announcements of one release make one attempt, not five. A waiter further back (place p, beyond
//! the permits) waits for as many announcements as there are waiters ahead of it to be served, so that one
//! release wakes the head, not the whole queue; counting wrong only makes it ask early, or at its fallback. A listener that (re)subscribes counts as
//! an announcement from its master (anything may have happened while it was not listening), so that a waiter
//! whose first attempt raced its subscription asks once more, and one whose listeners were all cut asks once
//! they are back. Fewer than a majority listening, or an expiry (never announced): the waiter's fallback pace.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard, Once};
use std::time::Duration;

use futures::StreamExt;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::node::Node;

/// How often an idle listening connection is checked (a master that hangs or a path that silently drops
/// packets closes nothing), bounded by the connect timeout.
const PING_EVERY: Duration = Duration::from_secs(5);
const RETRY_MIN: Duration = Duration::from_millis(50);
const RETRY_MAX: Duration = Duration::from_secs(2);

/// The channels this process listens on, and what each master announced on them.
pub(super) struct Wakes {
    quorum: usize,
    masters: usize,
    channels: Mutex<HashMap<String, Channel>>,
    /// Bumped whenever a channel is added or removed: the listeners (re)subscribe.
    changed: watch::Sender<u64>,
    started: Once,
}

struct Channel {
    /// Waiters of this process that listen on it.
    listeners: usize,
    /// Per master, how many announcements (or subscriptions) it made on the channel.
    heard: watch::Sender<Vec<u64>>,
}

impl Wakes {
    pub(super) fn new(masters: usize, quorum: usize) -> Self {
        Self {
            quorum,
            masters,
            channels: Mutex::new(HashMap::new()),
            changed: watch::Sender::new(0),
            started: Once::new(),
        }
    }

    fn channels(&self) -> MutexGuard<'_, HashMap<String, Channel>> {
        self.channels
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// What the masters announced on `channel` so far, if anyone here listens on it: taken before an attempt,
    /// so that announcements made during it count for the wait that follows.
    pub(super) fn heard(&self, channel: &str) -> Option<Vec<u64>> {
        self.channels()
            .get(channel)
            .map(|entry| entry.heard.borrow().clone())
    }

    /// Listens on `channel` until the returned interest is dropped; `since` is what the masters had announced
    /// when the waiter's last attempt began (from [`Wakes::heard`]; `None`: nothing, a channel new here). The
    /// listeners (one per master of `nodes`, started with the first interest) subscribe to it.
    pub(super) fn listen(
        self: &Arc<Self>,
        nodes: &[Arc<Node>],
        shutdown: &CancellationToken,
        channel: &str,
        since: Option<Vec<u64>>,
    ) -> Interest {
        self.started.call_once(|| {
            for (index, node) in nodes.iter().enumerate() {
                tokio::spawn(listener(self.clone(), index, node.clone(), shutdown.clone()));
            }
        });
        let receiver = {
            let mut channels = self.channels();
            let added = !channels.contains_key(channel);
            let entry = channels.entry(channel.to_owned()).or_insert_with(|| Channel {
                listeners: 0,
                heard: watch::Sender::new(vec![0; self.masters]),
            });
            entry.listeners += 1;
            let receiver = entry.heard.subscribe();
            if added {
                self.changed
                    .send_modify(|generation| *generation = generation.wrapping_add(1));
            }
            receiver
        };
        Interest {
            wakes: self.clone(),
            channel: channel.to_owned(),
            since: since.unwrap_or_else(|| vec![0; self.masters]),
            receiver,
        }
    }

    /// Master `index` announced on (or subscribed to) these channels.
    fn announced<'a>(&self, index: usize, channels: impl IntoIterator<Item = &'a str>) {
        let map = self.channels();
        for channel in channels {
            if let Some(entry) = map.get(channel) {
                entry.heard.send_modify(|heard| {
                    if let Some(count) = heard.get_mut(index) {
                        *count = count.wrapping_add(1);
                    }
                });
            }
        }
    }

    fn wanted(&self) -> HashSet<String> {
        self.channels().keys().cloned().collect()
    }
}

/// One waiter's listening on its key's channel; dropped, the channel is left once no other waiter of this
/// process listens on it.
pub(super) struct Interest {
    wakes: Arc<Wakes>,
    channel: String,
    since: Vec<u64>,
    receiver: watch::Receiver<Vec<u64>>,
}

impl Interest {
    /// An attempt begins: only announcements from now on wake the wait that follows it.
    pub(super) fn attempting(&mut self) {
        self.since = self.receiver.borrow_and_update().clone();
    }

    /// Returns once a majority of masters made `bursts` announcements each since the last attempt began (never,
    /// if they do not): a waiter at place p of a lock's queue needs p releases before it can be let through, and
    /// sleeps through the others' hand-overs instead of asking at each.
    pub(super) async fn woken(&mut self, bursts: u64) {
        self.wait(bursts).await;
    }

    /// [`Interest::woken`] as a future that owns what it needs, so that a task can wait while the interest (and
    /// with it the subscription) stays with its owner, across several waits.
    pub(super) fn wait(&self, bursts: u64) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut receiver = self.receiver.clone();
        let since = self.since.clone();
        let quorum = self.wakes.quorum;
        async move {
            loop {
                let heard_by_a_majority = {
                    let heard = receiver.borrow_and_update();
                    let mut fresh: Vec<u64> = heard
                        .iter()
                        .zip(&since)
                        .map(|(now, then)| now.wrapping_sub(*then))
                        .collect();
                    fresh.sort_unstable_by(|a, b| b.cmp(a));
                    fresh.get(quorum.saturating_sub(1)).copied().unwrap_or(0)
                };
                if heard_by_a_majority >= bursts.max(1) {
                    return;
                }
                if receiver.changed().await.is_err() {
                    return std::future::pending().await;
                }
            }
        }
    }

    /// Whether this interest listens through `wakes` (an engine's).
    pub(super) fn is_from(&self, wakes: &Arc<Wakes>) -> bool {
        Arc::ptr_eq(&self.wakes, wakes)
    }
}

impl Drop for Interest {
    fn drop(&mut self) {
        let mut channels = self.wakes.channels();
        let Some(entry) = channels.get_mut(&self.channel) else {
            return;
        };
        entry.listeners = entry.listeners.saturating_sub(1);
        if entry.listeners == 0 {
            channels.remove(&self.channel);
            drop(channels);
            self.wakes
                .changed
                .send_modify(|generation| *generation = generation.wrapping_add(1));
        }
    }
}

/// Master `index`'s listening connection: opened while this process listens on any channel, subscribed to
/// exactly those, reopened (with a capped backoff) when it is lost; ends with the engine.
async fn listener(wakes: Arc<Wakes>, index: usize, node: Arc<Node>, shutdown: CancellationToken) {
    let mut changes = wakes.changed.subscribe();
    let mut retry = RETRY_MIN;
    let timeout = node.connect_timeout();
    loop {
        changes.borrow_and_update();
        while wakes.channels().is_empty() {
            tokio::select! {
                changed = changes.changed() => if changed.is_err() { return },
                () = shutdown.cancelled() => return,
            }
        }
        let opened = tokio::select! {
            opened = tokio::time::timeout(timeout, node.client().get_async_pubsub()) => opened,
            () = shutdown.cancelled() => return,
        };
        let (mut sink, mut stream) = match opened {
            Ok(Ok(pubsub)) => pubsub.split(),
            Ok(Err(err)) => {
                tracing::debug!(master = %node.endpoint(), error = %err, "listening connection failed");
                wait_or_end(&shutdown, &mut retry).await;
                continue;
            }
            Err(_) => {
                wait_or_end(&shutdown, &mut retry).await;
                continue;
            }
        };
        let mut subscribed: HashSet<String> = HashSet::new();
        let mut resync = true;
        let lost = loop {
            if resync {
                changes.borrow_and_update();
                let wanted = wakes.wanted();
                if wanted.is_empty() {
                    // Nobody here waits any more: the connection closes until someone does.
                    break false;
                }
                let add: Vec<&String> = wanted.difference(&subscribed).collect();
                let remove: Vec<&String> = subscribed.difference(&wanted).collect();
                if !remove.is_empty()
                    && !matches!(
                        tokio::time::timeout(timeout, sink.unsubscribe(&remove)).await,
                        Ok(Ok(()))
                    )
                {
                    break true;
                }
                if !add.is_empty() {
                    if !matches!(
                        tokio::time::timeout(timeout, sink.subscribe(&add)).await,
                        Ok(Ok(()))
                    ) {
                        break true;
                    }
                    // Subscribed only now: what was announced before is unknown, so it counts as announced.
                    wakes.announced(index, add.iter().map(|channel| channel.as_str()));
                }
                subscribed = wanted;
                retry = RETRY_MIN;
            }
            resync = false;
            tokio::select! {
                message = stream.next() => match message {
                    Some(message) => wakes.announced(index, [message.get_channel_name()]),
                    None => break true,
                },
                changed = changes.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    resync = true;
                }
                () = tokio::time::sleep(PING_EVERY) => {
                    if !matches!(tokio::time::timeout(timeout, sink.ping::<redis::Value>()).await, Ok(Ok(_))) {
                        break true;
                    }
                }
                () = shutdown.cancelled() => return,
            }
        };
        if lost {
            tracing::debug!(master = %node.endpoint(), "listening connection lost; waiters fall back to polling until it is back");
            wait_or_end(&shutdown, &mut retry).await;
        }
    }
}

async fn wait_or_end(shutdown: &CancellationToken, retry: &mut Duration) {
    tokio::select! {
        () = tokio::time::sleep(*retry) => {}
        () = shutdown.cancelled() => {}
    }
    *retry = (*retry * 2).min(RETRY_MAX);
}
