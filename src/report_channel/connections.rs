//! The reports port's open connections, bounded in all and per source address, where an idle one gives way.
//!
//! Holders keep their connection between asks (a resumed TLS handshake costs the replica more than the answer),
//! so a full port is mostly idle connections: a newcomer takes the slot of the one idle longest (of its own
//! source when that source is at its bound, of anyone's otherwise) rather than being refused, and the holder
//! whose connection went reconnects at its next ask, as it does after a failover. Only connections with a request
//! in flight are never closed for a newcomer: when every slot is busy, the newcomer is closed at once, so that it
//! fails fast and tries again rather than waiting in the backlog.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard};

use lru::LruCache;
use tokio_util::sync::CancellationToken;

/// Connections open at most, in all and from one source address (a pod).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    pub total: usize,
    pub per_source: usize,
}

/// The open connections: each one's source and whether a request of it is in flight.
pub struct Connections {
    limits: Limits,
    state: Mutex<State>,
}

struct State {
    next_id: u64,
    /// Counts the times a connection went idle: a source's connection idle longest has the lowest mark.
    idle_marks: u64,
    open: HashMap<u64, Open>,
    by_source: HashMap<IpAddr, Vec<u64>>,
    /// The idle connections, the one idle longest least recently used.
    idle: LruCache<u64, ()>,
}

struct Open {
    source: IpAddr,
    close: CancellationToken,
    /// The mark it went idle with; `None` while a request of it is in flight.
    idle_since: Option<u64>,
}

/// One connection's slot, given back when dropped. `closed` fires when the connection is to close: a newcomer
/// took its slot (or its server gave up on a request that took too long).
pub struct Slot {
    connections: Arc<Connections>,
    id: u64,
    pub closed: CancellationToken,
}

/// A request in flight on a connection: it is not closed for a newcomer until this is dropped.
pub struct Busy<'a> {
    slot: &'a Slot,
}

impl Connections {
    pub fn new(limits: Limits) -> Arc<Self> {
        Arc::new(Self {
            limits,
            state: Mutex::new(State {
                next_id: 0,
                idle_marks: 0,
                open: HashMap::new(),
                by_source: HashMap::new(),
                idle: LruCache::unbounded(),
            }),
        })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A slot for a new connection from `source` (idle until its first request), closing an idle one to make
    /// room where a bound is reached; `None` when only busy connections hold the slots it needs.
    pub fn admit(self: &Arc<Self>, source: IpAddr) -> Option<Slot> {
        let mut state = self.state();
        let of_source = state.by_source.get(&source).map_or(0, Vec::len);
        if of_source >= self.limits.per_source {
            // At most `per_source` to look at.
            let idle_of_source = state
                .by_source
                .get(&source)
                .into_iter()
                .flatten()
                .filter_map(|id| Some((state.open.get(id)?.idle_since?, *id)))
                .min()
                .map(|(_, id)| id);
            state.evict(idle_of_source?);
        }
        if state.open.len() >= self.limits.total {
            let (oldest, ()) = state.idle.peek_lru()?;
            let oldest = *oldest;
            state.evict(oldest);
        }
        let id = state.next_id;
        state.next_id = state.next_id.wrapping_add(1);
        let closed = CancellationToken::new();
        state.open.insert(
            id,
            Open {
                source,
                close: closed.clone(),
                idle_since: None,
            },
        );
        state.by_source.entry(source).or_default().push(id);
        state.mark_idle(id);
        drop(state);
        Some(Slot {
            connections: self.clone(),
            id,
            closed,
        })
    }

    /// Connections open now.
    pub fn open(&self) -> usize {
        self.state().open.len()
    }
}

impl State {
    fn mark_idle(&mut self, id: u64) {
        let mark = self.idle_marks;
        self.idle_marks = self.idle_marks.wrapping_add(1);
        if let Some(open) = self.open.get_mut(&id) {
            open.idle_since = Some(mark);
            self.idle.put(id, ());
        }
    }

    /// Closes `id` for a newcomer: its slot is free at once, its task ends when it sees `close`.
    fn evict(&mut self, id: u64) {
        if let Some(open) = self.remove(id) {
            open.close.cancel();
        }
    }

    fn remove(&mut self, id: u64) -> Option<Open> {
        let open = self.open.remove(&id)?;
        self.idle.pop(&id);
        if let Some(ids) = self.by_source.get_mut(&open.source) {
            ids.retain(|kept| *kept != id);
            if ids.is_empty() {
                self.by_source.remove(&open.source);
            }
        }
        Some(open)
    }
}

impl Slot {
    /// Marks a request in flight until the guard is dropped (then the connection is the most recently idle).
    pub fn busy(&self) -> Busy<'_> {
        let mut state = self.connections.state();
        state.idle.pop(&self.id);
        if let Some(open) = state.open.get_mut(&self.id) {
            open.idle_since = None;
        }
        drop(state);
        Busy { slot: self }
    }
}

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        self.slot.connections.state().mark_idle(self.slot.id);
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.connections.state().remove(self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const POD: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 7));
    const OTHER: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 8));

    fn limits(total: usize, per_source: usize) -> Arc<Connections> {
        Connections::new(Limits { total, per_source })
    }

    #[test]
    fn a_source_at_its_bound_gives_up_its_own_connection_idle_longest() {
        let connections = limits(10, 2);
        let first = connections.admit(POD).expect("a first slot");
        let second = connections.admit(POD).expect("a second slot");
        // The first is used after the second: the second is now the one idle longest.
        drop(first.busy());
        let third = connections.admit(POD).expect("a third, for the second's slot");
        assert!(second.closed.is_cancelled(), "the one idle longest was closed");
        assert!(!first.closed.is_cancelled() && !third.closed.is_cancelled());
        assert_eq!(connections.open(), 2);
        let other = connections
            .admit(OTHER)
            .expect("another pod has slots of its own");
        assert!(!other.closed.is_cancelled() && !first.closed.is_cancelled());
    }

    #[test]
    fn a_connection_with_a_request_in_flight_is_never_closed_for_a_newcomer() {
        let connections = limits(2, 2);
        let first = connections.admit(POD).expect("first");
        let second = connections.admit(OTHER).expect("second");
        let (_one, _two) = (first.busy(), second.busy());
        assert!(connections.admit(POD).is_none(), "every slot is busy");
        assert!(connections.admit(OTHER).is_none());
        assert!(!first.closed.is_cancelled() && !second.closed.is_cancelled());
    }

    #[test]
    fn a_full_port_gives_the_slot_idle_longest_whoever_holds_it() {
        let connections = limits(2, 8);
        let first = connections.admit(POD).expect("first");
        let second = connections.admit(OTHER).expect("second");
        let busy = second.busy();
        let third = connections.admit(OTHER).expect("the idle one's slot");
        assert!(first.closed.is_cancelled());
        drop(busy);
        // The second's request ended after the third came (idle since): the third is the one idle longest.
        let _fourth = connections.admit(POD).expect("the third's slot");
        assert!(third.closed.is_cancelled() && !second.closed.is_cancelled());
    }

    #[test]
    fn slots_come_back_when_connections_close() {
        let connections = limits(1, 1);
        let first = connections.admit(POD).expect("first");
        let busy = first.busy();
        assert!(connections.admit(POD).is_none());
        drop(busy);
        drop(first);
        assert_eq!(connections.open(), 0);
        let again = connections.admit(POD).expect("the closed one's slot");
        assert!(!again.closed.is_cancelled());
        drop(again);
        let state = connections.state();
        assert!(state.by_source.is_empty() && state.idle.is_empty() && state.open.is_empty());
    }
}
