//! Test harnesses shared by the integration tests and the benchmarks. Each test binary uses part of it.
#![allow(dead_code)]

pub mod redis_server;
