//! The operator's tests: end to end against the in-process test API server (or a real cluster with
//! `REDLOCK_E2E_KUBECONFIG`), the product safety checker, the test API server itself, and the pure checks of
//! extreme values and of the monitoring rules.
//!
//! One test binary per area, so that the shared support is compiled once for each (issue 57); each former
//! test file is a module of it, and a test's name starts with that module (`jobs::...`).

#[path = "../apiserver.rs"]
mod apiserver;
#[path = "../apiserver_kubectl.rs"]
mod apiserver_kubectl;
#[path = "../cel_cases.rs"]
mod cel_cases;
#[path = "../e2e/mod.rs"]
mod e2e;
#[path = "../extreme_values.rs"]
mod extreme_values;
#[path = "../fenced_objects.rs"]
mod fenced_objects;
#[path = "../fencing_tokens.rs"]
mod fencing_tokens;
#[path = "../jobs.rs"]
mod jobs;
#[path = "../leader.rs"]
mod leader;
#[path = "../monitoring.rs"]
mod monitoring;
#[path = "../operator.rs"]
mod operator;
#[path = "../operator_faults.rs"]
mod operator_faults;
#[path = "../operator_safety.rs"]
mod operator_safety;
#[path = "../support/product_safety/mod.rs"]
mod product_safety;
#[path = "../report_flood.rs"]
mod report_flood;
#[path = "../support/mod.rs"]
mod support;
#[path = "../tenancy.rs"]
mod tenancy;
