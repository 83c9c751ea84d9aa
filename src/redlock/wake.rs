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
    loop {
        if !until_wanted(&wakes, &mut changes, &shutdown).await {
            return;
        }
        let pubsub = match open(&node, &shutdown).await {
            Opened::Connection(pubsub) => pubsub,
            Opened::Failed => {
                wait_or_end(&shutdown, &mut retry).await;
                continue;
            }
            Opened::Ended => return,
        };
        let listening = Listening {
            wakes: &wakes,
            index,
            timeout: node.connect_timeout(),
            shutdown: &shutdown,
        };
        match listening.run(pubsub, &mut changes, &mut retry).await {
            Ended::Idle => {}
            Ended::Lost => {
                tracing::debug!(master = %node.endpoint(), "listening connection lost; waiters fall back to polling until it is back");
                wait_or_end(&shutdown, &mut retry).await;
            }
            Ended::Engine => return,
        }
    }
}

/// Waits until a waiter of this process listens on some channel; `false`: the engine ended first.
async fn until_wanted(
    wakes: &Wakes,
    changes: &mut watch::Receiver<u64>,
    shutdown: &CancellationToken,
) -> bool {
    changes.borrow_and_update();
    while wakes.channels().is_empty() {
        tokio::select! {
            changed = changes.changed() => if changed.is_err() { return false },
            () = shutdown.cancelled() => return false,
        }
    }
    true
}

enum Opened {
    Connection(redis::aio::PubSub),
    /// Refused or timed out: tried again after a pause.
    Failed,
    /// The engine ended meanwhile.
    Ended,
}

/// Opens master's listening connection, within its connect timeout.
async fn open(node: &Node, shutdown: &CancellationToken) -> Opened {
    let opened = tokio::select! {
        opened = tokio::time::timeout(node.connect_timeout(), node.client().get_async_pubsub()) => opened,
        () = shutdown.cancelled() => return Opened::Ended,
    };
    match opened {
        Ok(Ok(pubsub)) => Opened::Connection(pubsub),
        Ok(Err(err)) => {
            tracing::debug!(master = %node.endpoint(), error = %err, "listening connection failed");
            Opened::Failed
        }
        Err(_) => Opened::Failed,
    }
}

/// How one listening connection ended.
#[derive(Debug, PartialEq, Eq)]
enum Ended {
    /// Nobody here waits any more: the connection closes until someone does.
    Idle,
    /// Cut, silent, or a (un)subscription failed: reopened after a pause.
    Lost,
    Engine,
}

/// One open listening connection of master `index`.
struct Listening<'a> {
    wakes: &'a Wakes,
    index: usize,
    timeout: Duration,
    shutdown: &'a CancellationToken,
}

impl Listening<'_> {
    /// Subscribes to the channels wanted (again whenever they change) and counts what the master announces, until
    /// the connection ends.
    async fn run(
        &self,
        pubsub: redis::aio::PubSub,
        changes: &mut watch::Receiver<u64>,
        retry: &mut Duration,
    ) -> Ended {
        let (mut sink, mut stream) = pubsub.split();
        let mut subscribed: HashSet<String> = HashSet::new();
        let mut resync = true;
        loop {
            if resync {
                changes.borrow_and_update();
                if let Err(ended) = self.subscribe_wanted(&mut sink, &mut subscribed).await {
                    return ended;
                }
                *retry = RETRY_MIN;
            }
            resync = false;
            tokio::select! {
                message = stream.next() => match message {
                    Some(message) => self.wakes.announced(self.index, [message.get_channel_name()]),
                    None => return Ended::Lost,
                },
                changed = changes.changed() => {
                    if changed.is_err() {
                        return Ended::Engine;
                    }
                    resync = true;
                }
                () = tokio::time::sleep(PING_EVERY) => {
                    if !matches!(tokio::time::timeout(self.timeout, sink.ping::<redis::Value>()).await, Ok(Ok(_))) {
                        return Ended::Lost;
                    }
                }
                () = self.shutdown.cancelled() => return Ended::Engine,
            }
        }
    }

    /// Brings the connection's subscriptions to the channels wanted now.
    async fn subscribe_wanted(
        &self,
        sink: &mut redis::aio::PubSubSink,
        subscribed: &mut HashSet<String>,
    ) -> Result<(), Ended> {
        let wanted = self.wakes.wanted();
        if wanted.is_empty() {
            return Err(Ended::Idle);
        }
        let (add, remove) = subscription_changes(subscribed, &wanted);
        if !remove.is_empty()
            && !matches!(
                tokio::time::timeout(self.timeout, sink.unsubscribe(&remove)).await,
                Ok(Ok(()))
            )
        {
            return Err(Ended::Lost);
        }
        if !add.is_empty() {
            if !matches!(
                tokio::time::timeout(self.timeout, sink.subscribe(&add)).await,
                Ok(Ok(()))
            ) {
                return Err(Ended::Lost);
            }
            // Subscribed only now: what was announced before is unknown, so it counts as announced.
            self.wakes
                .announced(self.index, add.iter().map(|channel| channel.as_str()));
        }
        *subscribed = wanted;
        Ok(())
    }
}

/// The channels to subscribe to and to leave, to go from `subscribed` to `wanted`.
fn subscription_changes<'a>(
    subscribed: &'a HashSet<String>,
    wanted: &'a HashSet<String>,
) -> (Vec<&'a String>, Vec<&'a String>) {
    (
        wanted.difference(subscribed).collect(),
        subscribed.difference(wanted).collect(),
    )
}

async fn wait_or_end(shutdown: &CancellationToken, retry: &mut Duration) {
    tokio::select! {
        () = tokio::time::sleep(*retry) => {}
        () = shutdown.cancelled() => {}
    }
    *retry = (*retry * 2).min(RETRY_MAX);
}

#[cfg(test)]
mod tests {
    use futures::FutureExt;

    use super::*;

    /// Three masters, a majority of two, and no listening connections (the counts are what is tested).
    fn wakes() -> Arc<Wakes> {
        Arc::new(Wakes::new(3, 2))
    }

    fn listen(wakes: &Arc<Wakes>, channel: &str, since: Option<Vec<u64>>) -> Interest {
        wakes.listen(&[], &CancellationToken::new(), channel, since)
    }

    fn woken(interest: &Interest, bursts: u64) -> bool {
        interest.wait(bursts).now_or_never().is_some()
    }

    #[test]
    fn a_waiter_wakes_once_a_majority_announced_since_its_attempt_began() {
        let wakes = wakes();
        let mut interest = listen(&wakes, "k", None);
        interest.attempting();
        assert!(!woken(&interest, 1), "nothing announced yet");
        wakes.announced(0, ["k"]);
        wakes.announced(0, ["k"]);
        assert!(
            !woken(&interest, 1),
            "one master is no majority, however often it speaks"
        );
        wakes.announced(2, ["k"]);
        assert!(woken(&interest, 1));
        interest.attempting();
        assert!(
            !woken(&interest, 1),
            "a new attempt waits for announcements after it began"
        );
    }

    #[test]
    fn a_waiter_further_back_waits_for_as_many_releases_as_are_ahead() {
        let wakes = wakes();
        let interest = listen(&wakes, "k", None);
        for master in [0, 1] {
            wakes.announced(master, ["k"]);
        }
        assert!(woken(&interest, 1));
        assert!(!woken(&interest, 2), "place 2 waits for a second release");
        wakes.announced(2, ["k"]);
        assert!(!woken(&interest, 2), "two each from no majority yet");
        wakes.announced(1, ["k"]);
        assert!(!woken(&interest, 2), "master 2 made one");
        wakes.announced(2, ["k"]);
        assert!(woken(&interest, 2), "masters 1 and 2 made two each");
        assert!(woken(&interest, 0), "no bursts counts as one");
    }

    #[test]
    fn announcements_count_from_what_the_waiter_had_heard() {
        let wakes = wakes();
        let first = listen(&wakes, "k", None);
        for master in 0..3 {
            wakes.announced(master, ["k"]);
        }
        let since = wakes.heard("k");
        assert_eq!(since, Some(vec![1, 1, 1]));
        let second = listen(&wakes, "k", since);
        assert!(woken(&first, 1));
        assert!(
            !woken(&second, 1),
            "what was heard before its attempt does not wake it"
        );
        wakes.announced(1, ["k"]);
        wakes.announced(2, ["k"]);
        assert!(woken(&second, 1));
    }

    #[test]
    fn announcements_elsewhere_or_from_unknown_masters_change_nothing() {
        let wakes = wakes();
        let interest = listen(&wakes, "k", None);
        wakes.announced(0, ["other"]);
        wakes.announced(1, ["other"]);
        wakes.announced(7, ["k"]);
        assert_eq!(wakes.heard("k"), Some(vec![0, 0, 0]));
        assert_eq!(wakes.heard("other"), None, "nobody here listens there");
        assert!(!woken(&interest, 1));
    }

    #[test]
    fn a_channel_is_left_once_its_last_waiter_here_stops() {
        let wakes = wakes();
        let generation = || *wakes.changed.borrow();
        let one = listen(&wakes, "k", None);
        assert_eq!(generation(), 1, "a new channel: the listeners subscribe");
        let two = listen(&wakes, "k", None);
        assert_eq!(
            generation(),
            1,
            "a channel listened on already: nothing to subscribe"
        );
        assert_eq!(wakes.wanted(), HashSet::from(["k".to_owned()]));
        assert!(one.is_from(&wakes) && !one.is_from(&self::wakes()));
        drop(one);
        assert!(wakes.heard("k").is_some(), "another waiter still listens");
        assert_eq!(generation(), 1);
        drop(two);
        assert_eq!(wakes.heard("k"), None);
        assert!(wakes.wanted().is_empty());
        assert_eq!(generation(), 2, "left: the listeners unsubscribe");
    }

    #[test]
    fn subscriptions_follow_the_channels_wanted() {
        let set = |names: &[&str]| {
            names
                .iter()
                .map(|name| (*name).to_owned())
                .collect::<HashSet<_>>()
        };
        let (subscribed, wanted) = (set(&["a", "b"]), set(&["b", "c"]));
        let (add, remove) = subscription_changes(&subscribed, &wanted);
        assert_eq!(add, vec!["c"]);
        assert_eq!(remove, vec!["a"]);
        let (add, remove) = subscription_changes(&wanted, &wanted);
        assert!(add.is_empty() && remove.is_empty());
    }
}
