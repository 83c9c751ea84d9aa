//! Reconcilers for the custom resources. Each is split into pure steps (validate, decide) that are tested
//! with a fake clock, and a thin layer that talks to the API server and Redis.

pub mod context;
pub mod election;
pub mod engines;
pub mod holdings;
pub mod job_queue;
pub mod jobs;
pub mod leader;
pub mod leadership;
pub mod lock;
pub mod lock_decide;
pub mod lock_holder;
pub mod lock_settings;
pub mod lock_status;
pub mod lock_value;
pub mod quorum;
pub mod quorum_config;
pub mod quorum_status;
pub mod run;
pub mod watch_filter;
