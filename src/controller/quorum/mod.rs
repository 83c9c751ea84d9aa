//! The `RedisQuorum` controller: dereference its Secrets (`secret_reads`) → validate (`config`, pure) → (re)build
//! the engine when what it is built from changed → check the masters → status (`status`, pure) and Events
//! (`reconcile`).

pub mod config;
pub mod reconcile;
pub mod secret_reads;
pub mod status;
