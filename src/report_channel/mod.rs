//! The channel holders report their stopped work on: HTTPS to the active replica, whose certificate the lock's
//! status pins (its SHA-256 beside `status.handOverUrl`). Status is written only by the operator and read through
//! the API server's authentication, so a holder that checks the pin knows it talks to a holder of the pinned
//! key (the replica that wrote it, or with a shared Secret, any replica of the installation): a listener on the
//! pod network sees neither the report nor the holder's token, and cannot replay them.
//!
//! No certificate authority is involved: the active replica makes its own key at start (or reads one a Secret
//! mounts), and the pin is the whole of the trust.

pub mod client;
pub mod connections;
pub mod identity;
pub mod pin;
pub mod server;

/// One rustls provider for both ends: `ring`, the one the tree already builds (for the masters' TLS).
fn crypto_provider() -> std::sync::Arc<rustls::crypto::CryptoProvider> {
    std::sync::Arc::new(rustls::crypto::ring::default_provider())
}
