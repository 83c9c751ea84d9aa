//! The `redlock-operator` command line.

/// The duration syntax, for the help of every subcommand with duration flags (a macro: `after_help` texts are
/// put together with `concat!`, which takes literals only).
macro_rules! durations_help {
    () => {
        "Durations are written as in Go and Kubernetes: 0, 300us, 250ms, 1.5s, 10s, 1m30s, 2h45m
(units ns, us, ms, s, m and h; every number but 0 needs one)."
    };
}

pub mod copy_binary;
pub mod crd;
pub mod elect;
pub mod exit_code;
pub mod guard;
mod held_term;
pub mod lock;
pub mod report;
pub mod run;
pub mod stop_time;
mod supervise;
pub mod term;
mod wait_progress;

use clap::{Parser, Subcommand};

use crate::telemetry::LogFormat;

#[derive(Debug, Parser)]
#[command(
    name = "redlock-operator",
    version,
    about = "Redlock distributed locks, declarative and from the shell"
)]
pub struct Cli {
    /// Log format on stderr.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text, env = "REDLOCK_LOG_FORMAT")]
    pub log_format: LogFormat,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the operator: the DistributedLock and RedisQuorum controllers.
    Run(run::RunArgs),
    /// Run a command while holding a Redlock lock; stop it if the lock is lost.
    Lock(lock::LockArgs),
    /// Run a command only while this pod is the leader of a leader-election DistributedLock.
    Elect(elect::ElectArgs),
    /// Run a Job pod's command only while its Job's grant of a job-fencing DistributedLock is current.
    Guard(guard::GuardArgs),
    /// Print the CustomResourceDefinitions (or write them with --write DIR).
    Crd(crd::CrdArgs),
    /// Copy this binary to a path (what the chart's init container does to inject `elect` and the guard).
    CopyBinary(copy_binary::CopyBinaryArgs),
}

/// What `--version` prints after the name: the crate's version and the commit it was built from.
///
/// The commit comes from the binary crate (`REDLOCK_COMMIT` at build time, which scripts/release.sh and the
/// Dockerfile set) so that a new commit relinks the binary only, not the library.
pub fn version(commit: Option<&str>) -> String {
    let version = env!("CARGO_PKG_VERSION");
    match commit.map(str::trim).filter(|commit| !commit.is_empty()) {
        Some(commit) => format!("{version} (commit {commit})"),
        None => format!("{version} (commit unknown: built without REDLOCK_COMMIT)"),
    }
}

/// Parses the arguments; usage errors become one line on stderr and exit status 64. `version` is what
/// `--version` prints after the name ([`version`]).
pub fn parse(version: &'static str) -> Result<Cli, i32> {
    use clap::{CommandFactory, FromArgMatches};
    let parsed = Cli::command()
        .version(version)
        .try_get_matches()
        .and_then(|matches| Cli::from_arg_matches(&matches));
    match parsed {
        Ok(cli) => Ok(cli),
        Err(err) => {
            use clap::error::ErrorKind;
            if matches!(err.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion)
                || err.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
            {
                let code = if err.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
                    exit_code::USAGE
                } else {
                    0
                };
                let _ = err.print();
                return Err(code);
            }
            let rendered = err.render().to_string();
            let first = rendered
                .lines()
                .find(|line| !line.trim().is_empty())
                .unwrap_or("invalid usage");
            eprintln!(
                "redlock-operator: {} (see --help)",
                first.trim_start_matches("error: ")
            );
            Err(exit_code::USAGE)
        }
    }
}

/// The Kubernetes client from the kubeconfig or the pod's service account, or the exit status and message.
pub(crate) async fn kube_client() -> Result<kube::Client, (i32, String)> {
    kube::Client::try_default().await.map_err(|err| {
        (
            exit_code::UNAVAILABLE,
            format!("no Kubernetes configuration: {err}"),
        )
    })
}
