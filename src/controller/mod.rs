//! The controllers, one folder each: `lock` (the `DistributedLock` reconciler and its holder policies), `quorum`
//! (the `RedisQuorum` reconciler), `keeper` (extends held locks), `replica_lease` (which replica is active), `cache`
//! (the pod caches the reconcilers read) and `run` (the wiring). Files named for a rule, a decision, settings, config, status or routing are pure and tested
//! with a fake clock; `reconcile`, `actions`, `*_writes`, `*_reads`, `status::write`, `elector` and the keeper's
//! task talk to the API server or Redis.

pub mod cache;
pub mod context;
pub mod engines;
pub mod error;
pub mod installation_secret;
pub mod keeper;
pub mod lock;
pub mod quorum;
pub mod replica_lease;
pub mod run;
