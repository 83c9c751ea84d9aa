//! WATCH: a resourceVersion to resume from (replayed from the resource's history, or `410 Expired` as the
//! stream's only event when it is too old), synthetic ADDED events when there is none, selectors applied to
//! both sides of a change, periodic bookmarks and `timeoutSeconds`. In realistic mode: events late by the watch
//! latency (in order), initial events late by the resource's list delay, and an end after a random lifetime,
//! sometimes with `410 Expired`.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::header;
use axum::response::Response;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::Shared;
use super::encode::{View, watch_line};
use super::errors::{ApiError, ApiResult};
use super::kinds::Kind;
use super::meta::{meta_mut, namespace_of};
use super::routes::{Query, Route};
use super::selectors::Filter;
use super::store::{Change, EventType};

/// Events a watcher may fall behind before the server ends its watch.
const WATCH_BUFFER: usize = 4_096;
const BOOKMARK_INTERVAL: Duration = Duration::from_secs(1);
/// The real server's default watch timeout is `--min-request-timeout` (1800 s) times a random factor.
const DEFAULT_WATCH_TIMEOUT: Duration = Duration::from_secs(1800);

enum Pending {
    /// A synthetic ADDED event for an object that existed when the watch started.
    Added(Arc<Value>),
    Change(Arc<Change>),
    Bookmark(u64),
    Error(Value),
}

pub(super) struct WatchSession {
    shared: Arc<Shared>,
    kind: &'static Kind,
    namespace: Option<String>,
    filter: Filter,
    /// What is to be sent, each with the time it may be sent at (never before the one ahead of it).
    pending: VecDeque<(Instant, Pending)>,
    /// When the last queued item may be sent.
    last_due: Instant,
    /// None for a watch that only reports an error, or that has ended with one.
    changes: Option<mpsc::Receiver<Arc<Change>>>,
    /// The newest resourceVersion this watch has passed on or filtered out.
    seen: u64,
    bookmarks: bool,
    next_bookmark: Instant,
    /// The end of the watch: `timeoutSeconds`, or its lifetime in realistic mode.
    deadline: Instant,
    /// Whether the watch ends with `410 Expired` at its deadline.
    expires_at_deadline: bool,
}

enum Wake {
    Change(Option<Arc<Change>>),
    Due,
    Deadline,
    Bookmark,
}

impl Shared {
    pub(super) fn start_watch(self: &Arc<Self>, route: &Route, query: &Query) -> ApiResult<WatchSession> {
        let kind = route.kind;
        let filter = query.filter(kind)?;
        for unsupported in ["sendInitialEvents", "resourceVersionMatch"] {
            if query.get(unsupported).is_some_and(|v| !v.is_empty()) {
                return Err(ApiError::unsupported(&format!("{unsupported} (streaming lists)")));
            }
        }
        let from = match query
            .get("resourceVersion")
            .filter(|rv| !rv.is_empty() && *rv != "0")
        {
            Some(rv) => Some(
                rv.parse::<u64>()
                    .map_err(|_| ApiError::bad_request(format!("invalid resource version: {rv}")))?,
            ),
            None => None,
        };
        let timeout = query
            .number::<u64>("timeoutSeconds")?
            .map_or(DEFAULT_WATCH_TIMEOUT, Duration::from_secs)
            .min(DEFAULT_WATCH_TIMEOUT);
        let realism = &self.realism;
        let (lifetime, expires_at_deadline) = match realism.watch_lifetime {
            Some(lifetime) => {
                let lifetime = self.dice.delay(lifetime);
                let expires = lifetime < timeout && self.dice.chance(realism.expiry_chance);
                (lifetime.min(timeout), expires)
            }
            None => (timeout, false),
        };

        let (sender, changes) = mpsc::channel(WATCH_BUFFER);
        let mut state = self.lock();
        if self.is_down() {
            return Err(ApiError::unavailable("set_down"));
        }
        let start_rv = state.rv;
        let objects = match from {
            None => state.select(kind, route.namespace.as_deref(), &filter),
            Some(_) => Vec::new(),
        };
        let bucket = state.bucket(kind);
        let now = Instant::now();
        // A watch from "now" starts with the objects, late when the resource's lists are.
        let initial_due = match from {
            None => now + realism.list_delay(kind.plural),
            Some(_) => now,
        };
        let mut pending: VecDeque<(Instant, Pending)> = objects
            .into_iter()
            .map(|object| (initial_due, Pending::Added(object)))
            .collect();
        let mut changes = Some(changes);
        let newest = bucket.history.back().map_or(0, |c| c.rv);
        match from {
            Some(rv) if rv < bucket.compacted || (rv < newest && self.dice.chance(realism.expiry_chance)) => {
                // The real server answers 200 and reports the expiry as the stream's only event.
                let oldest = bucket.history.front().map_or(start_rv, |c| c.rv);
                let error = ApiError::expired(format!("too old resource version: {rv} ({oldest})"));
                pending.push_back((now, Pending::Error(error.status())));
                changes = None;
            }
            Some(rv) => pending.extend(
                bucket
                    .history
                    .iter()
                    .filter(|c| c.rv > rv)
                    .map(|c| (now, Pending::Change(c.clone()))),
            ),
            None => {}
        }
        if changes.is_some() {
            bucket.watchers.push(sender);
        }
        drop(state);
        Ok(WatchSession {
            shared: self.clone(),
            kind,
            namespace: route.namespace.clone(),
            filter,
            pending,
            last_due: initial_due,
            changes,
            seen: start_rv,
            bookmarks: query.flag("allowWatchBookmarks"),
            next_bookmark: now + BOOKMARK_INTERVAL,
            deadline: now + lifetime,
            expires_at_deadline,
        })
    }
}

/// The next change, or never when there is no channel.
async fn next_change(changes: Option<&mut mpsc::Receiver<Arc<Change>>>) -> Option<Arc<Change>> {
    match changes {
        Some(changes) => changes.recv().await,
        None => std::future::pending().await,
    }
}

impl WatchSession {
    pub(super) fn into_response(self) -> Response {
        let lines = futures::stream::unfold(self, |mut session| async move {
            let line = session.next_line().await?;
            Some((Ok::<Bytes, Infallible>(line), session))
        });
        Response::builder()
            .status(200)
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from_stream(lines))
            .expect("a fixed status and header")
    }

    async fn next_line(&mut self) -> Option<Bytes> {
        loop {
            // A closed channel means the watch was ended (set_down, or a watcher too far behind).
            if self.changes.as_ref().is_some_and(mpsc::Receiver::is_closed) {
                return None;
            }
            let next_due = self.pending.front().map(|(due, _)| *due);
            if next_due.is_some_and(|due| due <= Instant::now()) {
                let (_, pending) = self.pending.pop_front()?;
                match self.encode(pending) {
                    Some(line) => return Some(line),
                    None => continue,
                }
            }
            if self.changes.is_none() && next_due.is_none() {
                return None;
            }
            let (deadline, next_bookmark) = (self.deadline, self.next_bookmark);
            let bookmarks = self.bookmarks && self.changes.is_some();
            let wake = tokio::select! {
                change = next_change(self.changes.as_mut()) => Wake::Change(change),
                () = tokio::time::sleep_until(next_due.unwrap_or(deadline)), if next_due.is_some() => Wake::Due,
                () = tokio::time::sleep_until(deadline), if self.changes.is_some() => Wake::Deadline,
                () = tokio::time::sleep_until(next_bookmark), if bookmarks => Wake::Bookmark,
            };
            match wake {
                Wake::Change(Some(change)) => {
                    self.seen = self.seen.max(change.rv);
                    self.schedule(Pending::Change(change));
                }
                Wake::Change(None) => return None,
                Wake::Due => {}
                Wake::Deadline if self.expires_at_deadline => self.expire(),
                Wake::Deadline => return None,
                Wake::Bookmark => self.queue_bookmark(),
            }
        }
    }

    /// Queues `pending` behind everything queued, late by the watch latency.
    fn schedule(&mut self, pending: Pending) {
        let latency = self.shared.dice.delay(self.shared.realism.watch_latency);
        let due = self.last_due.max(Instant::now() + latency);
        self.last_due = due;
        self.pending.push_back((due, pending));
    }

    /// Ends the watch with `410 Expired`, as a real server does when its history no longer reaches back to
    /// where this watch is: what was not sent yet is lost, and the client must list again.
    fn expire(&mut self) {
        self.changes = None;
        self.pending.clear();
        let error = ApiError::expired(format!("too old resource version: {}", self.seen));
        self.pending
            .push_back((Instant::now(), Pending::Error(error.status())));
    }

    /// A bookmark promises every change up to its resourceVersion was sent. Changes are handed to watchers
    /// under the state lock, so all those up to the current resourceVersion are in the channel by now; the
    /// bookmark goes behind them.
    fn queue_bookmark(&mut self) {
        self.next_bookmark = Instant::now() + BOOKMARK_INTERVAL;
        let current = self.shared.lock().rv;
        let Some(changes) = self.changes.as_mut() else {
            return;
        };
        let mut drained = Vec::new();
        while let Ok(change) = changes.try_recv() {
            drained.push(change);
        }
        for change in drained {
            self.seen = self.seen.max(change.rv);
            self.schedule(Pending::Change(change));
        }
        let due = self.last_due.max(Instant::now());
        self.last_due = due;
        self.pending
            .push_back((due, Pending::Bookmark(current.max(self.seen))));
    }

    fn in_scope(&self, object: &Value) -> bool {
        self.namespace
            .as_deref()
            .is_none_or(|ns| namespace_of(object) == ns)
            && self.filter.matches(object)
    }

    fn encode(&self, pending: Pending) -> Option<Bytes> {
        match pending {
            Pending::Added(object) => self.in_scope(&object).then(|| self.line("ADDED", &object)),
            Pending::Change(change) => self.encode_change(&change),
            Pending::Bookmark(rv) => {
                let object = json!({
                    "kind": self.kind.kind,
                    "apiVersion": self.kind.api_version(),
                    "metadata": {"resourceVersion": rv.to_string()},
                });
                Some(watch_line("BOOKMARK", &object))
            }
            Pending::Error(status) => Some(watch_line("ERROR", &status)),
        }
    }

    /// Selectors apply to both sides of a change: an object entering the selection is ADDED, one leaving
    /// it is DELETED (with its previous content and the change's resourceVersion), like the real server.
    fn encode_change(&self, change: &Change) -> Option<Bytes> {
        let now_in = change.event != EventType::Deleted && self.in_scope(&change.object);
        let was_in = match change.event {
            EventType::Added => false,
            EventType::Modified => change.previous.as_ref().is_some_and(|p| self.in_scope(p)),
            EventType::Deleted => self.in_scope(&change.object),
        };
        match (was_in, now_in) {
            (false, true) => Some(self.line("ADDED", &change.object)),
            (true, true) => Some(self.line("MODIFIED", &change.object)),
            (true, false) if change.event == EventType::Deleted => Some(self.line("DELETED", &change.object)),
            (true, false) => {
                let mut previous = (**change.previous.as_ref()?).clone();
                meta_mut(&mut previous).insert("resourceVersion".into(), change.rv.to_string().into());
                Some(self.line("DELETED", &previous))
            }
            (false, false) => None,
        }
    }

    fn line(&self, event: &'static str, object: &Value) -> Bytes {
        let view = View {
            kind: self.kind,
            object,
            list_item: false,
        };
        watch_line(event, &view)
    }
}
