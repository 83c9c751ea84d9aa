//! redlock-operator: the Redlock algorithm ([`redlock`]), made declarative for Kubernetes and usable from the
//! shell ([`cli`]).

pub mod api;
pub mod cli;
pub mod controller;
pub mod duration;
#[cfg(test)]
mod fuzz_support;
pub mod negative_controls;
pub mod redlock;
pub mod report_channel;
pub mod telemetry;
