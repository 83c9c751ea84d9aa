//! The protected resource: what holders write to while they believe they hold a key, fencing-aware as the
//! README asks users to make theirs. It accepts a write only with a token at least the highest it accepted for
//! the key, and keeps every write, accepted or refused, for the checker (which does not trust the store's own
//! rule: it checks the accepted writes again).
//!
//! In the fenced mode (`fenced.rs`) the resource is a real object instead: a ConfigMap behind the chart's
//! fenced-objects policy, which the holders' own processes write through the API server. They report each write
//! and its answer, and the log here keeps them in the API server's order (the object's resourceVersion).

use std::collections::HashMap;
use std::sync::Mutex;

use tokio::time::Instant;

#[derive(Clone, Debug)]
pub struct Write {
    pub key: String,
    pub token: i64,
    pub holder: String,
    pub at: Instant,
    pub accepted: bool,
    /// The order the resource took it in: its place in this log, or, for a fenced object, the resourceVersion
    /// the API server gave the object with it (etcd's revision, rising with every write; 0 for a refusal).
    pub order: u64,
}

#[derive(Default)]
pub struct ProtectedResource {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    highest: HashMap<String, i64>,
    writes: Vec<Write>,
}

impl ProtectedResource {
    /// Writes `(key, token, holder)`; whether the resource accepted it.
    pub fn write(&self, key: &str, token: i64, holder: &str) -> bool {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let highest = state.highest.get(key).copied().unwrap_or(i64::MIN);
        let accepted = token >= highest;
        if accepted {
            state.highest.insert(key.to_owned(), token);
        }
        let order = state.writes.len() as u64;
        state.writes.push(Write {
            key: key.to_owned(),
            token,
            holder: holder.to_owned(),
            at: Instant::now(),
            accepted,
            order,
        });
        accepted
    }

    /// A write a holder made to a fenced object itself, as it reported it.
    pub fn record(&self, write: Write) {
        self.state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .writes
            .push(write);
    }

    pub fn writes(&self) -> Vec<Write> {
        self.state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .writes
            .clone()
    }
}

/// A write the resource accepted with a token below one it had accepted before for the key.
#[derive(Clone, Debug)]
pub struct StaleWrite {
    pub earlier: Write,
    pub later: Write,
}

impl std::fmt::Display for StaleWrite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: {} wrote with token {} at {:?}, accepted after {} had written with token {} at {:?}",
            self.later.key,
            self.later.holder,
            self.later.token,
            self.later.at,
            self.earlier.holder,
            self.earlier.token,
            self.earlier.at
        )
    }
}

/// Every accepted write, in the order the resource took them, whose token is below an accepted one before it.
pub fn stale_writes_accepted(writes: &[Write]) -> Vec<StaleWrite> {
    let mut accepted: Vec<&Write> = writes.iter().filter(|write| write.accepted).collect();
    // Reports of writes to a fenced object reach the log in the order their processes made them, not
    // necessarily the order the API server took them in.
    accepted.sort_by_key(|write| write.order);
    let mut highest: HashMap<&str, &Write> = HashMap::new();
    let mut stale = Vec::new();
    for write in accepted {
        match highest.get(write.key.as_str()) {
            Some(top) if write.token < top.token => stale.push(StaleWrite {
                earlier: (*top).clone(),
                later: write.clone(),
            }),
            Some(top) if write.token == top.token => {}
            _ => {
                highest.insert(&write.key, write);
            }
        }
    }
    stale
}
