//! `redlock-operator lock`: acquire, run a command under the lock, stop it if the lock is lost, release.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;
use tokio::time::Instant;

use super::exit_code;
use super::supervise::{Child, Ended};
use super::wait_progress::WaitProgress;
use crate::redlock::{
    AcquireError, AcquireOptions, Endpoint, FailureKind, KeepPolicy, MAX_PERMITS, OperationReport, Redlock,
    RedlockConfig, kill_grace, shortest_ttl, with_credentials,
};

/// Added to the quarantine's end in the `--wait` an error suggests: the next run measures the masters' uptime
/// again, to the second.
const QUARANTINE_WAIT_MARGIN_SECS: u64 = 5;

#[derive(Debug, Args)]
#[command(after_help = concat!(durations_help!(), "

Exit status: the command's own, or 64 bad usage, 69 too few masters reachable, 75 not acquired within --wait,
76 lock lost while the command ran (it was stopped before the lock's validity ended), 126/127 command not runnable.

The command gets REDLOCK_RESOURCE, REDLOCK_HOLDER, REDLOCK_VALIDITY_MS, REDLOCK_FENCING_TOKEN (from the masters'
counter for the key) and REDLOCK_PERMIT (0 to N-1 with --permits N; 0 without) in its environment, not REDLOCK_REDIS
(the masters' passwords), and runs in its own process group, so that on loss of the lock every process of the group
is stopped.

With REDLOCK_FENCING_TOKEN_FILE set to a path, lock also keeps the grant's token in that file (digits, no
newline): written before the command starts, removed once it has ended. The command inherits the variable, so
it and processes it leaves behind can re-read the current token before each write."))]
pub struct LockArgs {
    /// A Redis master, as redis://[user:password@]host:port or rediss://… for TLS; repeat for each master.
    #[arg(
        long = "redis",
        value_name = "URL",
        env = "REDLOCK_REDIS",
        value_delimiter = ',',
        required = true
    )]
    pub redis: Vec<String>,
    /// Lock time to live; the lock is extended while the command runs.
    #[arg(long, default_value = "10s", value_name = "DURATION", value_parser = crate::duration::parse)]
    pub ttl: Duration,
    /// How long to keep trying to acquire; 0 = a single attempt. A waiting command joins the key's fair queue:
    /// the key goes to the waiters in the order they asked (docs/reference/lock-command.md, "The fair queue"); a
    /// single attempt is refused while anyone waits.
    #[arg(long, default_value = "0s", value_name = "DURATION", value_parser = crate::duration::parse)]
    pub wait: Duration,
    /// The longest TTL any client of these masters uses; a master restarted less than this ago does not vote.
    #[arg(long, default_value = "60s", value_name = "DURATION", value_parser = crate::duration::parse)]
    pub max_ttl: Duration,
    /// How long one master may take to answer. A master whose connection is still being opened is waited for
    /// longer by an attempt: up to the connect timeout (1s), but at most a tenth of --ttl.
    #[arg(long, default_value = "50ms", value_name = "DURATION", value_parser = crate::duration::parse)]
    pub node_timeout: Duration,
    /// Tell the command the lock is lost this long before its validity ends (default: ttl/5, at most 5s).
    #[arg(long, value_name = "DURATION", value_parser = crate::duration::parse)]
    pub fence_margin: Option<Duration>,
    /// Holder name stored with the lock and shown to contenders (default: HOSTNAME/PID).
    #[arg(long)]
    pub holder: Option<String>,
    /// File holding the masters' password (a mounted Secret key, for example), for --redis URLs that carry
    /// none: no URL encoding needed. One trailing newline is ignored.
    #[arg(long, value_name = "FILE")]
    pub redis_password_file: Option<PathBuf>,
    /// File holding the masters' ACL user name, with --redis-password-file.
    #[arg(long, value_name = "FILE", requires = "redis_password_file")]
    pub redis_username_file: Option<PathBuf>,
    /// PEM file with the CA that signed the masters' TLS certificates (rediss:// URLs).
    #[arg(long, value_name = "FILE")]
    pub redis_ca: Option<PathBuf>,
    /// Skip the restart quarantine: only for masters that fsync every write.
    #[arg(long)]
    pub assume_durable: bool,
    /// A counting semaphore: at most this many commands hold the lock at once, across every machine that uses
    /// the same name and the same number (each holds one permit, with a fencing token of its own).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_PERMITS)))]
    pub permits: u32,
    /// Print per-master outcomes on stderr.
    #[arg(short, long)]
    pub verbose: bool,
    /// Print nothing on stderr while waiting (by default: the place in the queue and the holder, at a steady
    /// pace).
    #[arg(short, long)]
    pub quiet: bool,
    /// The lock's name, the same for every process that must not run at the same time.
    pub resource: String,
    /// The command to run, after `--`.
    #[arg(last = true, required = true, value_name = "COMMAND")]
    pub command: Vec<OsString>,
}

pub async fn run(args: LockArgs) -> i32 {
    match run_inner(args).await {
        Ok(code) => code,
        Err((code, message)) => {
            eprintln!("redlock-operator lock: {message}");
            code
        }
    }
}

type Failure = (i32, String);

fn config_from(args: &LockArgs) -> Result<RedlockConfig, Failure> {
    let usage = |message: String| (exit_code::USAGE, message);
    if args.resource.is_empty() {
        return Err(usage("the resource name must not be empty".into()));
    }
    let username = read_secret_file(args.redis_username_file.as_deref()).map_err(usage)?;
    let password = read_secret_file(args.redis_password_file.as_deref()).map_err(usage)?;
    let endpoints = args
        .redis
        .iter()
        .filter(|url| !url.trim().is_empty())
        .map(|url| {
            let endpoint = Endpoint::parse(url).map_err(|err| usage(err.to_string()))?;
            if password.is_none() {
                return Ok(endpoint);
            }
            if endpoint.display() != url.trim() {
                return Err(usage(format!(
                    "{endpoint}: give the password in the URL or with --redis-password-file, not both"
                )));
            }
            let url =
                with_credentials(url.trim(), username.as_deref(), password.as_deref()).map_err(usage)?;
            Endpoint::parse(&url).map_err(|err| usage(err.to_string()))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut config = RedlockConfig::new(endpoints);
    config.max_ttl = args.max_ttl;
    config.node_timeout = args.node_timeout;
    config.assume_durable = args.assume_durable;
    if let Some(path) = &args.redis_ca {
        let pem =
            std::fs::read(path).map_err(|err| usage(format!("cannot read {}: {err}", path.display())))?;
        config.tls.ca_pem = Some(pem);
    }
    config.validate().map_err(|err| usage(err.to_string()))?;
    config.check_ttl(args.ttl).map_err(|err| usage(err.to_string()))?;
    if args.ttl < shortest_ttl(args.node_timeout) {
        return Err(usage(format!(
            "--ttl {} is too short for --node-timeout {}: at least ten node timeouts ({}), or the lock is reported lost before it can be extended",
            crate::duration::format(args.ttl),
            crate::duration::format(args.node_timeout),
            crate::duration::format(shortest_ttl(args.node_timeout))
        )));
    }
    Ok(config)
}

async fn run_inner(args: LockArgs) -> Result<i32, Failure> {
    let config = config_from(&args)?;
    let holder = args.holder.clone().unwrap_or_else(default_holder);
    let node_timeout = config.node_timeout;
    // Work starts once a majority is verified: a hung master must not hold the command up for the connect
    // timeout. The others join in the background.
    let engine = Redlock::connect_majority(config)
        .await
        .map_err(|err| (exit_code::USAGE, err.to_string()))?;
    let result = hold(&engine, &args, &holder, node_timeout).await;
    // Releases are decided at a majority; the deletes still on their way to slower masters are waited for
    // (at most a node timeout), or those masters would keep the key until it expires.
    engine.settle().await;
    result
}

async fn hold(
    engine: &Redlock,
    args: &LockArgs,
    holder: &str,
    node_timeout: Duration,
) -> Result<i32, Failure> {
    // No memory between runs: the first proposal is token 1, and masters that know the key answer with their
    // counter, which the engine proposes above at once (one more round trip, only for keys used before).
    let deadline = Instant::now()
        .checked_add(args.wait)
        .ok_or_else(|| (exit_code::USAGE, "--wait is too long".to_owned()))?;
    let options = AcquireOptions {
        attempts: (args.wait.is_zero()).then_some(1),
        deadline: Some(deadline),
        token_floor: 0,
        fair: !args.wait.is_zero(),
    };
    let mut progress = WaitProgress::new(&args.resource, args.quiet);
    let acquired = engine
        .acquire_permit_reporting(
            &args.resource,
            args.permits,
            args.ttl,
            holder,
            options,
            |refused| progress.refused(refused),
        )
        .await;
    progress.finish();
    let lease = match acquired {
        Ok(lease) => lease,
        Err(err) => {
            if args.verbose
                && let Some(report) = err.report()
            {
                print_report("acquire", report);
            }
            return Err(acquire_failure(&err));
        }
    };
    if args.verbose {
        print_report("acquire", lease.report());
        eprintln!("redlock-operator lock: fencing token {}", lease.fencing_token());
        if args.permits > 1 {
            eprintln!(
                "redlock-operator lock: permit {} of {} (key `{}`)",
                lease.permit(),
                args.permits,
                lease.resource()
            );
        }
    }
    let validity_ms = lease.remaining(Instant::now()).as_millis().to_string();
    let mut policy = KeepPolicy::for_ttl(args.ttl, node_timeout);
    if let Some(margin) = args.fence_margin {
        policy.fence_margin = margin;
    }
    let env = [
        ("REDLOCK_RESOURCE", args.resource.clone()),
        ("REDLOCK_HOLDER", holder.to_owned()),
        ("REDLOCK_VALIDITY_MS", validity_ms),
        ("REDLOCK_FENCING_TOKEN", lease.fencing_token().to_string()),
        ("REDLOCK_PERMIT", lease.permit().to_string()),
    ];
    let kept = engine.keep(lease, policy);
    let mut child = match Child::spawn(&args.command, &env) {
        Ok(child) => child,
        Err((code, message)) => {
            let report = kept.release().await;
            if args.verbose {
                print_report("release", &report);
            }
            return Err((code, message));
        }
    };
    let lost = kept.lost_token();
    let ended = child.supervise(lost, kill_grace(&policy)).await;
    let code = match &ended {
        Ended::Exited(code) | Ended::Signalled(code) => *code,
        Ended::StoppedOnLoss => {
            let reason = kept
                .state()
                .lost
                .map(|reason| reason.to_string())
                .unwrap_or_default();
            eprintln!(
                "redlock-operator lock: lock `{}` lost ({reason}); the command was stopped before the lock expired",
                args.resource
            );
            exit_code::LOCK_LOST
        }
    };
    if args.verbose
        && let Some(report) = kept.state().last_failure
    {
        print_report("last failed extension", &report);
    }
    let report = kept.release().await;
    if args.verbose {
        print_report("release", &report);
    }
    Ok(code)
}

/// A credential from a file, without the one trailing newline editors and `echo` add.
fn read_secret_file(path: Option<&Path>) -> Result<Option<String>, String> {
    let Some(path) = path else {
        return Ok(None);
    };
    let text =
        std::fs::read_to_string(path).map_err(|err| format!("cannot read {}: {err}", path.display()))?;
    let text = text
        .strip_suffix('\n')
        .map(|line| line.strip_suffix('\r').unwrap_or(line))
        .unwrap_or(&text);
    Ok(Some(text.to_owned()))
}

fn acquire_failure(err: &AcquireError) -> Failure {
    match err {
        AcquireError::NotAcquired {
            kind: FailureKind::TooFewMasters,
            report,
            ..
        } => {
            let mut message = err.to_string();
            // Quarantined masters are a matter of time: say how to wait for them instead of failing.
            if let Some(wait) = report
                .quarantine_outlook()
                .and_then(|outlook| outlook.majority_in)
            {
                let seconds = wait.as_secs().saturating_add(QUARANTINE_WAIT_MARGIN_SECS);
                message.push_str(&format!(" (`--wait {seconds}s` waits for them)"));
            }
            (exit_code::UNAVAILABLE, message)
        }
        AcquireError::NotAcquired { .. } => (exit_code::TEMPFAIL, err.to_string()),
        AcquireError::Config(_) => (exit_code::USAGE, err.to_string()),
        AcquireError::Value(_) => (exit_code::SOFTWARE, err.to_string()),
        AcquireError::TokenExhausted { .. } => (exit_code::UNAVAILABLE, err.to_string()),
    }
}

fn print_report(what: &str, report: &OperationReport) {
    eprintln!("redlock-operator lock: {what}: {report}");
}

fn default_holder() -> String {
    let host = nix::unistd::gethostname()
        .ok()
        .and_then(|name| name.into_string().ok())
        .unwrap_or_else(|| "unknown-host".into());
    format!("{host}/{}", std::process::id())
}
