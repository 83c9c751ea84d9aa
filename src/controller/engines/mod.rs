//! One Redlock engine per `RedisQuorum`, shared by every lock on it; rebuilt when the quorum's spec or
//! Secrets change.

pub mod problem;

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use self::problem::QuorumProblem;
use crate::api::SharedKeys;
use crate::redlock::Redlock;

/// A connected engine and what it was built from.
pub struct QuorumEngine {
    pub engine: Redlock,
    /// Hash of the spec and Secret contents it was built from: a change means a rebuild.
    pub fingerprint: u64,
    /// The quorum's `sharedKeys`: which namespaces' locks share keys (part of the fingerprint).
    pub shared_keys: Option<SharedKeys>,
}

/// What a lock finds when it looks up its quorum.
#[derive(Clone)]
pub enum QuorumLookup {
    /// No `RedisQuorum` of that name (yet).
    Missing,
    /// It exists but cannot be used; the problem says what to fix.
    Unusable(QuorumProblem),
    Ready(Arc<QuorumEngine>),
}

#[derive(Default)]
pub struct Engines {
    quorums: RwLock<HashMap<String, QuorumLookup>>,
}

impl Engines {
    pub fn lookup(&self, name: &str) -> QuorumLookup {
        self.read().get(name).cloned().unwrap_or(QuorumLookup::Missing)
    }

    pub fn fingerprint(&self, name: &str) -> Option<u64> {
        match self.read().get(name) {
            Some(QuorumLookup::Ready(engine)) => Some(engine.fingerprint),
            _ => None,
        }
    }

    pub fn set(&self, name: &str, state: QuorumLookup) {
        self.write().insert(name.to_owned(), state);
    }

    pub fn remove(&self, name: &str) {
        self.write().remove(name);
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, HashMap<String, QuorumLookup>> {
        // Every write replaces a whole entry, so a poisoned map is still consistent.
        self.quorums
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<String, QuorumLookup>> {
        self.quorums
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}
