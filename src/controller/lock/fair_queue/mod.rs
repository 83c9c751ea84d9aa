//! This replica's part in the keys' fair queues, between reconciles: the tickets its locks hold (`tickets`) and the
//! tasks that wake a queued lock when the masters announce a release ahead of it (`wakes`). The queue itself is
//! the masters' (`crate::redlock`).

pub mod tickets;
pub mod wakes;
