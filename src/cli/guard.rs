//! `redlock-operator guard`: runs a Job pod's work only while the Job's grant is current, and stops it on its
//! own clock before the validity it was shown ends.
//!
//! The operator fences a Job by suspending it, which needs the operator active and the API server answering:
//! during a failover between replicas, an API-server outage or a lost lock the Job's pods would run on past the
//! validity. The guard makes the pod fence itself, as `elect` does for leaders. Its grant comes from the pod's
//! own annotations (the token the operator wrote into the Job's pod template, read through the downward API), so
//! a pod created under an old grant never starts its work under a new one.
//!
//! The validity is learnt from the active replica (`stop_time`: counted on the pod's own clock), never from the
//! masters: the pods would need the masters' addresses and credentials, and the key's remaining time on a
//! majority does not say whose value it is (the value is derived from the installation secret, which pods must
//! not have). The replica tells no more than status shows, so an API-server outage longer than the validity
//! shown stops the work even while the operator still extends the lock in Redis: the pod
//! ends with exit status 76, which a `podFailurePolicy` rule ignores, and the Job controller starts a new pod
//! that waits for the grant to show current again.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use tokio::signal::unix::{SignalKind, signal};

use super::exit_code;
use super::report::{Reporter, report_stopped_unless_signalled};
use super::stop_time::{DEFAULT_MAX_CLOCK_SKEW, HolderClock, Stopping, over_the_channel};
use super::supervise::Ended;
use super::term::{Term, current_term, follow_lock, run_in_term, term_of};
use crate::api::DistributedLock;
use crate::api::holder_contract::REPORT_TOKEN_PATH;

/// `--fence-margin` unless given: a second covers a loaded node's scheduling delays and the child's exit
/// between the guard's SIGTERM and the validity's end (the product checker runs Job locks at a 3 s TTL with it).
pub const DEFAULT_FENCE_MARGIN: &str = "1s";

#[derive(Debug, Args)]
#[command(after_help = concat!(durations_help!(), "

In a Job's pod template, pass JOB_NAME from the label batch.kubernetes.io/job-name, REDLOCK_GRANTED_TOKEN from
the annotation redlock.io/fencing-token and, for a semaphore, REDLOCK_GRANTED_PERMIT from redlock.io/permit,
through the downward API. The command gets REDLOCK_LOCK (namespace/name), REDLOCK_JOB, REDLOCK_FENCING_TOKEN,
REDLOCK_VALID_UNTIL and, for a semaphore, REDLOCK_PERMIT. It needs get, list and watch on
distributedlocks.redlock.io in the lock's namespace. Exit status: the command's own when it ends by itself; 76
when the grant ended and the command was stopped, or the pod was stopped before its grant was current (a Job's
podFailurePolicy can ignore it); 64 bad usage; 69 no Kubernetes configuration; 126/127 the command cannot be
run.

The command is stopped at the latest --fence-margin before the grant's validity ends, counted on this pod's own
clock from the moment the guard asked the operator how long the grant stays valid (POST /v1/validity on the origin
of status.handOverUrl, to the certificate status pins), never by comparing this node's wall clock with the
operator's: a grant the operator does not tell is not started, and an ask without an answer never gives a later
stop. Only where status offers no channel (no handOverUrl or no certificate pin: an older operator) is the stop
validUntil less the margin and --max-clock-skew, on this node's wall clock.

With REDLOCK_FENCING_TOKEN_FILE set to a path, the guard also keeps the current grant's token in that file
(digits, no newline): written before each command it starts under a new grant, removed once that command has
ended. The command inherits the variable, so processes that outlive one grant can re-read the current token
before each write.

When the command was stopped (the grant ended, or the pod got SIGTERM), the guard reports it to the operator
(status.handOverUrl) with the pod's projected service-account token for the audience redlock-operator, so the key
goes to the next holder at once instead of when the validity shown ends."))]
pub struct GuardArgs {
    /// The DistributedLock (with holder.jobs) the Job is queued on.
    #[arg(long, value_name = "NAME")]
    pub lock: String,
    /// The lock's namespace (default: the pod's).
    #[arg(long, env = "POD_NAMESPACE")]
    pub namespace: Option<String>,
    /// This pod's Job, as the operator writes it into the lock's status.
    #[arg(long, env = "JOB_NAME", value_name = "NAME")]
    pub job: String,
    /// The fencing token this pod was created under (its redlock.io/fencing-token annotation); empty when the
    /// pod carries no grant, and then the command is never started.
    #[arg(long, env = "REDLOCK_GRANTED_TOKEN", value_name = "TOKEN", default_value = "")]
    pub token: String,
    /// The semaphore permit this pod was created under (its redlock.io/permit annotation); empty for a plain
    /// lock.
    #[arg(
        long,
        env = "REDLOCK_GRANTED_PERMIT",
        value_name = "PERMIT",
        default_value = ""
    )]
    pub permit: String,
    /// Stop the command this long before the grant's validity ends (as the active replica tells it, counted on
    /// this pod's clock; or as status shows it, where status offers no channel).
    #[arg(long, default_value = DEFAULT_FENCE_MARGIN, value_name = "DURATION", value_parser = crate::duration::parse)]
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
    /// The command to run while the grant is current, after `--`.
    #[arg(last = true, required = true, value_name = "COMMAND")]
    pub command: Vec<OsString>,
}

/// What the pod was granted, from its annotations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grant {
    pub token: i64,
    /// A semaphore's permit; `None` for a plain lock.
    pub permit: Option<u32>,
}

/// The grant named by the pod's annotations: `Ok(None)` when it carries none (a Job that runs without holding
/// the lock, which the operator suspends), `Err` for text no operator writes.
pub fn grant_of(token: &str, permit: &str) -> Result<Option<Grant>, String> {
    let token = token.trim();
    if token.is_empty() {
        return Ok(None);
    }
    let token = token
        .parse::<i64>()
        .ok()
        .filter(|token| *token > 0)
        .ok_or_else(|| format!("--token {token:?} is not a fencing token (a positive whole number)"))?;
    let permit = permit.trim();
    let permit = if permit.is_empty() {
        None
    } else {
        Some(
            permit
                .parse::<u32>()
                .map_err(|_| format!("--permit {permit:?} is not a permit number"))?,
        )
    };
    Ok(Some(Grant { token, permit }))
}

/// The Job's term in status if it is the one the pod was granted: a later grant (a new token, after the Job
/// was fenced and queued again) belongs to the Job's later pods, not to this one.
pub fn granted_term(lock: &DistributedLock, job: &str, grant: Grant) -> Option<Term> {
    term_of(lock, job)
        .filter(|term| term.token == grant.token && (grant.permit.is_none() || term.permit == grant.permit))
}

pub async fn run(args: GuardArgs) -> i32 {
    let fail = |code: i32, message: String| {
        eprintln!("redlock-operator guard: {message}");
        code
    };
    if args.lock.is_empty() || args.job.is_empty() {
        return fail(
            exit_code::USAGE,
            "--lock and --job (or JOB_NAME) must not be empty".into(),
        );
    }
    let grant = match grant_of(&args.token, &args.permit) {
        Ok(grant) => grant,
        Err(message) => return fail(exit_code::USAGE, message),
    };
    let (Ok(mut sigterm), Ok(mut sigint)) =
        (signal(SignalKind::terminate()), signal(SignalKind::interrupt()))
    else {
        return fail(exit_code::SOFTWARE, "cannot install signal handlers".into());
    };
    let Some(grant) = grant else {
        eprintln!(
            "redlock-operator guard: this pod of Job {} carries no grant of lock {} (no fencing token): the command is not started",
            args.job, args.lock
        );
        // Exit 0 would count as the Job's success: the pod did no work.
        tokio::select! {
            _ = sigterm.recv() => {}
            _ = sigint.recv() => {}
        }
        return exit_code::LOCK_LOST;
    };
    let job = args.job.clone();
    let followed = follow_lock(args.namespace.clone(), &args.lock, move |lock| {
        granted_term(lock, &job, grant)
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
        tool: "guard",
        clock: HolderClock::of_this_process(),
    };
    let (current, stop_at) = tokio::select! {
        current = current_term(&mut followed.terms, &followed.latest, &stopping) => match current {
            Some(current) => current,
            None => return fail(exit_code::SOFTWARE, "the watch ended".into()),
        },
        // Stopped (the Job suspended, the pod deleted) before the grant was current: the work did not run,
        // which must not count as the Job's success.
        _ = sigterm.recv() => return exit_code::LOCK_LOST,
        _ = sigint.recv() => return exit_code::LOCK_LOST,
    };
    eprintln!(
        "redlock-operator guard: Job {} holds {namespace}/{} with fencing token {}: starting the command",
        args.job, args.lock, current.token
    );
    let lock = format!("{namespace}/{}", args.lock);
    let job = ("REDLOCK_JOB", args.job.clone());
    let ended = match run_in_term(
        &args.command,
        lock,
        job,
        (&current, stop_at),
        (&followed.terms, &followed.latest),
        &stopping,
    )
    .await
    {
        Ok(ended) => ended,
        Err((code, message)) => return fail(code, message),
    };
    let reporter = Reporter {
        holder: &args.job,
        lock: &args.lock,
        token_file: &args.report_token_file,
        tool: "guard",
    };
    match ended {
        // Not reported: with restartPolicy OnFailure the container may start again in this pod.
        Ended::Exited(code) => code,
        Ended::Signalled(code) => {
            // The pod is being deleted (the Job suspended, as when its lock is being deleted): the report lets the
            // key go once the operator has recorded it as given up. A second signal ends the wait.
            report_stopped_unless_signalled(&reporter, &current, followed.latest.clone()).await;
            code
        }
        Ended::StoppedOnLoss => {
            eprintln!(
                "redlock-operator guard: the grant of {namespace}/{} to Job {} (token {}) ended or was not shown current in time; the command was stopped",
                args.lock, args.job, current.token
            );
            report_stopped_unless_signalled(&reporter, &current, followed.latest.clone()).await;
            exit_code::LOCK_LOST
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
    use k8s_openapi::jiff::Timestamp;

    use super::*;
    use crate::api::{DistributedLockStatus, LockPhase};

    #[test]
    fn the_grant_comes_from_the_annotations_or_is_absent() {
        assert_eq!(grant_of("", ""), Ok(None));
        assert_eq!(
            grant_of("7", ""),
            Ok(Some(Grant {
                token: 7,
                permit: None
            }))
        );
        assert_eq!(
            grant_of(" 7 ", "2"),
            Ok(Some(Grant {
                token: 7,
                permit: Some(2)
            }))
        );
        assert!(grant_of("seven", "").is_err());
        assert!(grant_of("0", "").is_err(), "tokens start at 1");
        assert!(grant_of("-3", "").is_err());
        assert!(grant_of("99999999999999999999", "").is_err());
        assert!(grant_of("7", "-1").is_err());
    }

    fn held_by(job: &str, token: i64) -> DistributedLock {
        let mut lock: DistributedLock = serde_json::from_value(serde_json::json!({
            "apiVersion": "redlock.io/v1beta1", "kind": "DistributedLock", "metadata": {"name": "batch"},
            "spec": {"holder": {"jobs": {"selector": {}}}}
        }))
        .unwrap();
        lock.status = Some(DistributedLockStatus {
            phase: Some(LockPhase::Held),
            holder: Some(job.into()),
            fencing_token: Some(token),
            valid_until: Some(MicroTime(Timestamp::from_second(1_000).unwrap())),
            ..DistributedLockStatus::default()
        });
        lock
    }

    #[test]
    fn only_the_grant_the_pod_was_created_under_is_its_term() {
        let grant = Grant {
            token: 4,
            permit: None,
        };
        assert!(granted_term(&held_by("report", 4), "report", grant).is_some());
        assert!(
            granted_term(&held_by("report", 5), "report", grant).is_none(),
            "a later grant of the same Job belongs to its later pods"
        );
        assert!(granted_term(&held_by("other", 4), "report", grant).is_none());
        let semaphore_grant = Grant {
            token: 4,
            permit: Some(1),
        };
        assert!(
            granted_term(&held_by("report", 4), "report", semaphore_grant).is_none(),
            "a permit's grant is not the plain lock's"
        );
    }
}
