//! A stand-in for a real cluster, for running the end-to-end tests in their real-cluster mode
//! (`REDLOCK_E2E_KUBECONFIG`) where no cluster is reachable: the in-process test API server on a loopback port,
//! with the simulated Job controller and kubelet running the Jobs of every namespace (on a node of their own),
//! and the model of the pod garbage collector deleting pods bound to a node that does not exist. It exercises the
//! tests' real-cluster code paths (one shared API, their own namespaces and nodes, cleanup, no test-server
//! controls); it says nothing about Kubernetes itself.
//!
//! `cargo run --example stand-in-cluster -- KUBECONFIG_PATH` serves until SIGTERM or Ctrl-C; with
//! `REDLOCK_E2E_REALISTIC=1`, in the test server's realistic mode; `REDLOCK_E2E_POD_GC_QUARANTINE` (`off`, or
//! seconds) sets the pod garbage collector's quarantine.

#[path = "mod.rs"]
mod support;

use std::path::PathBuf;

use support::apiserver::TestApiServer;
use support::job_controller::FakeJobRuntime;
use tokio::signal::unix::{SignalKind, signal};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path: PathBuf = std::env::args_os()
        .nth(1)
        .ok_or("usage: stand-in-cluster KUBECONFIG_PATH")?
        .into();
    let server = TestApiServer::start_from_env().await;
    let _runtime = FakeJobRuntime::start(server.controller_client(), None);
    // Written last, so a reader that sees the file can connect.
    let partial = path.with_extension("partial");
    server.write_kubeconfig(&partial)?;
    std::fs::rename(&partial, &path)?;
    eprintln!(
        "stand-in cluster at {}, kubeconfig {}",
        server.url(),
        path.display()
    );
    let mut terminate = signal(SignalKind::terminate())?;
    tokio::select! {
        _ = terminate.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    Ok(())
}
