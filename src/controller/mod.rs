//! Reconcilers for the custom resources. Each is split into pure steps (validate, decide) that are tested
//! with a fake clock, and a thin layer that talks to the API server and Redis.

pub mod lock_settings;
pub mod quorum_config;
