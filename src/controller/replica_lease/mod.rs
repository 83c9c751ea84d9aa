//! One active replica, chosen with a `coordination.k8s.io` Lease.
//!
//! Written here rather than taken from kube-lease-manager because the operator needs one thing those crates do
//! not give: a gate that every Redis and API write checks synchronously at the moment of the call
//! ([`Leadership::is_leader`]; for API writes, the client of [`write_guard`] checks it), backed by a deadline on this process's monotonic clock that always ends
//! *before* a standby may take over. Like client-go, a standby judges expiry by how long it has itself seen
//! the Lease unchanged, never by comparing its wall clock with the holder's `renewTime`.

pub mod elector;
pub mod gate;
pub mod rule;
pub mod write_guard;

pub use elector::Elector;
pub use gate::Leadership;
pub use rule::LeaseTiming;
