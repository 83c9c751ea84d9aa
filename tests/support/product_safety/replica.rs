//! One operator replica: the real binary (`redlock-operator run`) in a process of its own, so that the nemesis
//! can SIGKILL and SIGSTOP it, talking to its cluster's API server through a fault proxy of its own.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use super::cluster::Cluster;
use crate::support::fault_proxy::FaultProxy;

/// The replicas' Lease: a standby takes over after it went unrenewed this long.
pub const LEASE_DURATION: &str = "2s";

pub struct Replica {
    /// "east-0": cluster and index.
    pub identity: String,
    pub proxy: FaultProxy,
    kubeconfig: PathBuf,
    secret_file: PathBuf,
    namespace: String,
    log: PathBuf,
    /// Negative controls the process is started with (`REDLOCK_NEGATIVE_CONTROLS`).
    controls: String,
    child: Option<Child>,
    stopped: bool,
}

impl Replica {
    /// Starts replica `index` of `cluster`, with the installation secret in `secret_file`.
    pub async fn start(cluster: &Cluster, index: usize, secret_file: &Path, controls: &str) -> Self {
        let identity = format!("{}-{index}", cluster.name);
        let (kubeconfig, _, proxy) = cluster.behind_proxy(&identity).await;
        let log = kubeconfig.with_file_name(format!("{identity}.log"));
        let mut replica = Self {
            identity,
            proxy,
            kubeconfig,
            secret_file: secret_file.to_owned(),
            namespace: cluster.namespace.clone(),
            log,
            controls: controls.to_owned(),
            child: None,
            stopped: false,
        };
        replica.spawn();
        replica
    }

    fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("replica log");
        let child = Command::new(env!("CARGO_BIN_EXE_redlock-operator"))
            .args([
                "run",
                "--metrics-addr",
                "127.0.0.1:0",
                "--reports-addr",
                "127.0.0.1:0",
                "--health-interval",
                "500ms",
            ])
            .args(["--lease-duration", LEASE_DURATION, "--identity", &self.identity])
            .arg("--namespace")
            .arg(&self.namespace)
            .arg("--secrets-namespace")
            .arg(&self.namespace)
            .arg("--installation-secret-file")
            .arg(&self.secret_file)
            .env("KUBECONFIG", &self.kubeconfig)
            .env(
                "RUST_LOG",
                std::env::var("REDLOCK_SAFETY_OPERATOR_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .env("REDLOCK_NEGATIVE_CONTROLS", &self.controls)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start the operator binary");
        self.child = Some(child);
        self.stopped = false;
    }

    fn pid(&self) -> Option<Pid> {
        let child = self.child.as_ref()?;
        Some(Pid::from_raw(i32::try_from(child.id()).ok()?))
    }

    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    pub fn is_stopped(&self) -> bool {
        self.stopped
    }

    /// SIGKILL: no release, no hand-over; the standby must take over from the Lease.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.stopped = false;
    }

    /// A new process in place of a killed one.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// SIGSTOP: the process keeps its connections and its Lease record, and does nothing until [`Replica::cont`].
    pub fn stop(&mut self) {
        if let Some(pid) = self.pid() {
            let _ = kill(pid, Signal::SIGSTOP);
            self.stopped = true;
        }
    }

    pub fn cont(&mut self) {
        if let Some(pid) = self.pid() {
            let _ = kill(pid, Signal::SIGCONT);
        }
        self.stopped = false;
    }

    /// The replica's whole log (empty when it cannot be read).
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The end of the replica's log, to explain a finding.
    pub fn log_tail(&self, lines: usize) -> String {
        let text = self.log();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        self.cont();
        self.kill();
    }
}

/// How long after a replica's death its standby may take over and resume every lock.
pub fn takeover_allowance() -> Duration {
    Duration::from_secs(4)
}
