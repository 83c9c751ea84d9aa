//! Connections per source address on the reports port: one pod cannot take every slot, and a holder's report,
//! from an address of its own, still finds one.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

/// Counts the open connections of each source address, up to `limit` each.
pub struct Sources {
    limit: usize,
    open: Mutex<HashMap<IpAddr, usize>>,
}

/// One connection counted against its source until dropped.
pub struct SourceSlot {
    sources: Arc<Sources>,
    address: IpAddr,
}

impl Sources {
    pub fn new(limit: usize) -> Arc<Self> {
        Arc::new(Self {
            limit,
            open: Mutex::default(),
        })
    }

    /// A slot for a connection from `address`, unless it has `limit` open already.
    pub fn enter(self: &Arc<Self>, address: IpAddr) -> Option<SourceSlot> {
        let mut open = self.open.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let count = open.entry(address).or_default();
        if *count >= self.limit {
            return None;
        }
        *count += 1;
        Some(SourceSlot {
            sources: self.clone(),
            address,
        })
    }

    /// Source addresses with a connection open (each gone with its last connection).
    #[cfg(test)]
    fn addresses(&self) -> usize {
        self.open
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .len()
    }
}

impl Drop for SourceSlot {
    fn drop(&mut self) {
        let mut open = self
            .sources
            .open
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(count) = open.get_mut(&self.address) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                open.remove(&self.address);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_source_gets_its_limit_and_its_slots_back_when_they_close() {
        let sources = Sources::new(2);
        let (pod, holder): (IpAddr, IpAddr) = ("10.0.0.7".parse().unwrap(), "10.0.0.8".parse().unwrap());
        let first = sources.enter(pod).expect("a first slot");
        let second = sources.enter(pod).expect("a second slot");
        assert!(sources.enter(pod).is_none(), "a third from the same pod");
        let other = sources.enter(holder).expect("another pod still gets one");
        drop(first);
        let again = sources.enter(pod).expect("a slot freed by a close");
        drop((second, again, other));
        assert_eq!(
            sources.addresses(),
            0,
            "nothing kept once every connection closed"
        );
    }
}
