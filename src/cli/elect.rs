//! `redlock-operator elect`: runs a command only while this pod is the leader of a leader-election lock.
//!
//! This pod leads while the lock's status says `Held` by this pod's name and the validity shown has not ended
//! (`term`). The command is stopped (SIGTERM, then SIGKILL) when that stops being true — at the latest
//! `--fence-margin` before the validity ends, counted on this pod's clock (`stop_time`), whether or not a watch
//! event came.

use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::watch;
use tokio::task::JoinSet;

use super::exit_code;
use super::report::{Reporter, report_stopped, unless_signalled};
use super::stop_time::{DEFAULT_MAX_CLOCK_SKEW, HolderClock, Stopping, over_the_channel};
use super::supervise::Ended;
use super::term::{Term, current_term, follow_lock, leader_term_of, run_in_term};
use crate::api::DistributedLock;
use crate::api::holder_contract::REPORT_TOKEN_PATH;

#[derive(Debug, Args)]
#[command(after_help = concat!(durations_help!(), "

The command gets REDLOCK_LOCK (namespace/name), REDLOCK_LEADER (this pod), REDLOCK_FENCING_TOKEN and
REDLOCK_VALID_UNTIL in its environment, and REDLOCK_PERMIT (this pod's permit) with spec.permits above 1. It
needs get, list and watch on distributedlocks.redlock.io in the lock's namespace (a Role bound to the pod's
service account). Exit status: the command's own when it ends by itself; 64 bad usage; 69 no Kubernetes
configuration; 0 after SIGTERM/SIGINT while not leading.

The command is stopped at the latest --fence-margin before the grant's validity ends, counted on this pod's own
clock from the moment elect asked the operator how long the grant stays valid (POST /v1/validity on the origin
of status.handOverUrl, to the certificate status pins), never by comparing this node's wall clock with the
operator's: a grant the operator does not tell is not started, and an ask without an answer never gives a later
stop. Only where status offers no channel (no handOverUrl or no certificate pin: an older operator) is the stop
validUntil less the margin and --max-clock-skew, on this node's wall clock.

With REDLOCK_FENCING_TOKEN_FILE set to a path, elect also keeps the current grant's token in that file (digits,
no newline): written before each command it starts under a new grant, removed once that command has ended. The
command inherits the variable, so processes that outlive one grant can re-read the current token before each
write.

When the command has stopped for a move, a loss or a SIGTERM, elect reports it to the operator (status.handOverUrl)
with the pod's projected service-account token for the audience redlock-operator, so the next leader gets the lock
at once instead of when the validity shown ends."))]
pub struct ElectArgs {
    /// The DistributedLock (with holder.leaderElection) whose leader runs the command.
    #[arg(long, value_name = "NAME")]
    pub lock: String,
    /// The lock's namespace (default: the pod's).
    #[arg(long, env = "POD_NAMESPACE")]
    pub namespace: Option<String>,
    /// This pod's name, as the operator writes it into status.holder.
    #[arg(long, env = "POD_NAME")]
    pub pod: String,
    /// Stop the command this long before the grant's validity ends (as the active replica tells it, counted on
    /// this pod's clock; or as status shows it, where status offers no channel).
    #[arg(long, default_value = "1s", value_name = "DURATION", value_parser = crate::duration::parse)]
    pub fence_margin: Duration,
    /// Where the lock's status offers no channel to ask the operator how long the grant stays valid (no
    /// handOverUrl or no certificate pin: an operator older than this helper), the stop time is the validity shown
    /// less the margin and this bound on how far this node's wall clock may be behind the operator's.
    #[arg(long, default_value = DEFAULT_MAX_CLOCK_SKEW, value_name = "DURATION", value_parser = crate::duration::parse)]
    pub max_clock_skew: Duration,
    /// The projected service-account token (audience redlock-operator) that proves this pod's reports that its
    /// command stopped; without it, a hand-over waits for the validity shown.
    #[arg(long, env = "REDLOCK_REPORT_TOKEN_FILE", value_name = "PATH", default_value = REPORT_TOKEN_PATH)]
    pub report_token_file: PathBuf,
    /// The command to run while leading, after `--`.
    #[arg(last = true, required = true, value_name = "COMMAND")]
    pub command: Vec<OsString>,
}

pub async fn run(args: ElectArgs) -> i32 {
    let fail = |code: i32, message: String| {
        eprintln!("redlock-operator elect: {message}");
        code
    };
    if args.lock.is_empty() || args.pod.is_empty() {
        return fail(
            exit_code::USAGE,
            "--lock and --pod (or POD_NAME) must not be empty".into(),
        );
    }
    let pod = args.pod.clone();
    let followed = follow_lock(args.namespace.clone(), &args.lock, move |lock| {
        leader_term_of(lock, &pod)
    })
    .await;
    let mut followed = match followed {
        Ok(followed) => followed,
        Err((code, message)) => return fail(code, message),
    };
    let namespace = followed.namespace.clone();
    let stopping = Stopping {
        margin: args.fence_margin,
        max_clock_skew: args.max_clock_skew,
        namespace: namespace.clone(),
        lock: args.lock.clone(),
        ask: over_the_channel(),
        tool: "elect",
        clock: HolderClock::of_this_process(),
    };
    let (Ok(mut sigterm), Ok(mut sigint)) =
        (signal(SignalKind::terminate()), signal(SignalKind::interrupt()))
    else {
        return fail(exit_code::SOFTWARE, "cannot install signal handlers".into());
    };
    // Reports under way for terms stopped on a move or a loss: a SIGTERM that comes meanwhile (the pod deleted: the
    // operator's status write often reaches us before the kubelet's signal) waits for them before exiting.
    let mut reports = JoinSet::new();
    loop {
        let (current, stop_at) = tokio::select! {
            // A signal that came while the command was being stopped goes first: no new term after it.
            biased;
            _ = sigterm.recv() => return finish_reports(&mut reports).await,
            _ = sigint.recv() => return finish_reports(&mut reports).await,
            current = current_term(&mut followed.terms, &followed.latest, &stopping) => match current {
                Some(current) => current,
                None => return fail(exit_code::SOFTWARE, "the watch ended".into()),
            },
        };
        eprintln!(
            "redlock-operator elect: {} leads {namespace}/{} with fencing token {}",
            args.pod, args.lock, current.token
        );
        let lock = format!("{namespace}/{}", args.lock);
        let leader = ("REDLOCK_LEADER", args.pod.clone());
        let ended = match run_in_term(
            &args.command,
            lock,
            leader,
            (&current, stop_at),
            (&followed.terms, &followed.latest),
            &stopping,
        )
        .await
        {
            Ok(ended) => ended,
            Err((code, message)) => return fail(code, message),
        };
        match ended {
            // Not reported: the container may be restarted in this pod while status still shows the grant.
            Ended::Exited(code) => return code,
            Ended::Signalled(code) => {
                // The pod is being stopped (a rolling update): the operator moves the lock, and the report
                // lets the next leader have it as soon as that is recorded. A second signal ends the wait.
                spawn_report(&mut reports, &args, current, followed.latest.clone());
                unless_signalled(join_all(&mut reports)).await;
                return code;
            }
            Ended::StoppedOnLoss => {
                eprintln!(
                    "redlock-operator elect: leadership of {namespace}/{} ended (token {}); the command was stopped",
                    args.lock, current.token
                );
                // Reported while this pod waits to lead again: the grant it stopped is never shown again, so
                // the work cannot start under it (`lock::reports::rule`).
                spawn_report(&mut reports, &args, current, followed.latest.clone());
            }
        }
    }
}

/// Reports in the background that the work under `current` stopped.
fn spawn_report(
    reports: &mut JoinSet<()>,
    args: &ElectArgs,
    current: Term,
    latest: watch::Receiver<Option<Arc<DistributedLock>>>,
) {
    while reports.try_join_next().is_some() {}
    let holder = args.pod.clone();
    let lock = args.lock.clone();
    let token_file = args.report_token_file.clone();
    reports.spawn(async move {
        let reporter = Reporter {
            holder: &holder,
            lock: &lock,
            token_file: &token_file,
            tool: "elect",
        };
        report_stopped(&reporter, &current, latest).await;
    });
}

/// After a SIGTERM or SIGINT while not leading: the reports under way are finished first (each ends at the latest
/// when the validity shown for its grant ends), unless a second signal comes. Exit status 0.
async fn finish_reports(reports: &mut JoinSet<()>) -> i32 {
    while reports.try_join_next().is_some() {}
    if !reports.is_empty() {
        eprintln!(
            "redlock-operator elect: finishing the report that the work stopped before exiting (a second SIGTERM or SIGINT ends the wait)"
        );
        unless_signalled(join_all(reports)).await;
    }
    0
}

async fn join_all(reports: &mut JoinSet<()>) {
    while reports.join_next().await.is_some() {}
}
