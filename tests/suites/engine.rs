//! The engine's tests: the Redlock client against real masters (locking, masters, tokens), the safety checkers
//! and their negative controls, semaphores, the fair queue, the test harness itself and the fuzzers.
//!
//! One test binary per area, so that the shared support is compiled once for each (issue 57); each former
//! test file is a module of it, and a test's name starts with that module (`jobs::...`).

#[path = "../engine.rs"]
mod engine;
#[path = "../fair_queue.rs"]
mod fair_queue;
#[path = "../fuzz.rs"]
mod fuzz;
#[path = "../harness.rs"]
mod harness;
#[path = "../safety.rs"]
mod safety;
#[path = "../semaphore.rs"]
mod semaphore;
#[path = "../support/mod.rs"]
mod support;
