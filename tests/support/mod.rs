//! Test harnesses shared by the integration tests and the benchmarks. Each test binary uses part of it.
#![allow(dead_code)]

pub mod apiserver;
pub mod fair_order;
pub mod fault_proxy;
pub mod fenced_policy;
pub mod fixtures;
pub mod forged_reports;
pub mod forgotten_tokens;
pub mod history;
pub mod job_controller;
pub mod node;
pub mod pod_token;
pub mod poll;
pub mod redis_server;
pub mod report_door;
pub mod safety;
