//! `redlock-operator run`: the controller.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;

use super::exit_code;
use crate::controller::installation_secret::InstallationSecret;
use crate::controller::replica_lease::LeaseTiming;
use crate::controller::run::{ElectionOptions, LockScope, RunOptions, hand_over_url_at, start};
use crate::report_channel::identity::KeySource;

#[derive(Debug, Args)]
#[command(after_help = durations_help!())]
pub struct RunArgs {
    /// Where /metrics, /healthz and /readyz are served.
    #[arg(long, env = "REDLOCK_METRICS_ADDR", default_value = "0.0.0.0:8080")]
    pub metrics_addr: SocketAddr,
    /// Where holders' reports that their work stopped are taken, over TLS (a port of its own, so that a
    /// NetworkPolicy can open metrics to the scraper and this to holder pods).
    #[arg(long, env = "REDLOCK_REPORTS_ADDR", default_value = "0.0.0.0:8443")]
    pub reports_addr: SocketAddr,
    /// Connections the reports port keeps open at once (holders keep theirs between asks, about 30 KiB each);
    /// past it the one idle longest is closed for a newcomer, whose holder then reconnects at its next ask. Set
    /// it to the number of holders (and the memory limit up by 30 KiB for each) where more than this ask.
    #[arg(long, env = "REDLOCK_REPORTS_MAX_CONNECTIONS", default_value_t = crate::report_channel::server::MAX_CONNECTIONS, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub reports_max_connections: u32,
    /// Open no reports port at all (the chart's `handOver.reports: false`): holders find no channel in status,
    /// so `elect` and the guard stop by validUntil on their own wall clock less --max-clock-skew, and every key
    /// given up waits for the validity shown to its holder.
    #[arg(long, env = "REDLOCK_NO_REPORTS", conflicts_with_all = ["hand_over_url", "reports_tls_cert"])]
    pub no_reports: bool,
    /// PEM certificate for the reports port (a mounted kubernetes.io/tls Secret's tls.crt), with
    /// --reports-tls-key. Default: each replica makes its own key and self-signed certificate at start; status
    /// shows the certificate's SHA-256 beside handOverUrl either way, and holders check it.
    #[arg(
        long,
        env = "REDLOCK_REPORTS_TLS_CERT",
        value_name = "PATH",
        requires = "reports_tls_key"
    )]
    pub reports_tls_cert: Option<PathBuf>,
    /// The PEM private key of --reports-tls-cert.
    #[arg(
        long,
        env = "REDLOCK_REPORTS_TLS_KEY",
        value_name = "PATH",
        requires = "reports_tls_cert"
    )]
    pub reports_tls_key: Option<PathBuf>,
    /// Namespace of the Lease that picks the active replica (default: the kubeconfig's or the pod's namespace).
    #[arg(long, env = "POD_NAMESPACE")]
    pub namespace: Option<String>,
    /// Name of that Lease.
    #[arg(long, env = "REDLOCK_LEASE_NAME", default_value = "redlock-operator")]
    pub lease_name: String,
    /// This replica's name in the Lease (default: the host name).
    #[arg(long, env = "POD_NAME")]
    pub identity: Option<String>,
    /// A standby takes over after the Lease has not been renewed for this long. Keep it well below the
    /// shortest lock TTL, or locks lapse (and get a new token) on failover.
    #[arg(long, env = "REDLOCK_LEASE_DURATION", default_value = "4s", value_name = "DURATION", value_parser = crate::duration::parse)]
    pub lease_duration: Duration,
    /// Run as the only replica, without a Lease.
    #[arg(long)]
    pub no_leader_election: bool,
    /// File with at least 32 bytes of secret shared by the replicas of one installation; lock values are derived
    /// from it so that a restarted or standby replica can resume held locks.
    #[arg(long, env = "REDLOCK_INSTALLATION_SECRET_FILE", value_name = "PATH")]
    pub installation_secret_file: Option<PathBuf>,
    /// The one namespace RedisQuorum Secrets (auth, CA) are read from (default: the operator's own namespace,
    /// like --namespace). The operator needs `get` on Secrets there, and nowhere else.
    #[arg(long, env = "REDLOCK_SECRETS_NAMESPACE")]
    pub secrets_namespace: Option<String>,
    /// This installation's name, recorded on the locks it keeps (annotation redlock.io/installation); locks
    /// another installation keeps are left alone (default: the Lease's namespace/name, or with
    /// --no-leader-election the secrets namespace and the host name).
    #[arg(long, env = "REDLOCK_INSTALLATION", value_name = "NAME")]
    pub installation: Option<String>,
    /// Look only at the DistributedLocks in these namespaces (comma-separated; default: every namespace).
    #[arg(
        long,
        env = "REDLOCK_LOCK_NAMESPACES",
        value_name = "NS,…",
        value_delimiter = ','
    )]
    pub lock_namespaces: Vec<String>,
    /// Look only at the DistributedLocks this label selector matches (default: all), for example `team=payments`.
    #[arg(long, env = "REDLOCK_LOCK_SELECTOR", value_name = "SELECTOR")]
    pub lock_selector: Option<String>,
    /// Look only at the RedisQuorums this label selector matches (default: all), for example `team=payments`: this
    /// installation writes the status and Events of the quorums it looks at, and its locks can use only those.
    #[arg(long, env = "REDLOCK_QUORUM_SELECTOR", value_name = "SELECTOR")]
    pub quorum_selector: Option<String>,
    /// Where holders (`elect`, the Job guard) reach this replica to report that their work stopped, so that a key
    /// given up is released at once on their word: shown in each lock's status.handOverUrl, an https URL that
    /// reaches the reports port. Default: from --pod-ip; else the reports address when it names one IP; none when
    /// it is 0.0.0.0 (given-up keys then wait for the validity shown).
    #[arg(long, env = "REDLOCK_HAND_OVER_URL", value_name = "URL")]
    pub hand_over_url: Option<String>,
    /// This replica's pod IP (the chart passes it through the downward API): the default --hand-over-url is
    /// `https://<it>:<reports port>/v1/stopped`.
    #[arg(long, env = "POD_IP", value_name = "IP")]
    pub pod_ip: Option<std::net::IpAddr>,
    /// How often each RedisQuorum's masters are checked and its status written.
    #[arg(long, default_value = "5s", value_name = "DURATION", value_parser = crate::duration::parse)]
    pub health_interval: Duration,
}

pub async fn run(args: RunArgs) -> i32 {
    let fail = |code: i32, message: String| {
        eprintln!("redlock-operator run: {message}");
        code
    };
    if args.lease_duration < Duration::from_secs(1) {
        return fail(exit_code::USAGE, "--lease-duration must be at least 1s".into());
    }
    if args.health_interval.is_zero() {
        return fail(
            exit_code::USAGE,
            "--health-interval must be greater than 0".into(),
        );
    }
    if let Some(url) = &args.hand_over_url
        && !matches!(url::Url::parse(url), Ok(parsed) if parsed.scheme() == "https" && parsed.host().is_some())
    {
        return fail(
            exit_code::USAGE,
            format!(
                "--hand-over-url {url:?} is not an https URL: holders send reports only over TLS, to the reports port"
            ),
        );
    }
    let secret = match &args.installation_secret_file {
        Some(path) => match InstallationSecret::read(path) {
            Ok(secret) => secret,
            Err(err) => return fail(exit_code::USAGE, err),
        },
        None => {
            tracing::warn!(
                "no --installation-secret-file: lock values are random per process, so a restarted or standby replica cannot resume held locks (they lapse and are re-acquired with a new token)"
            );
            match InstallationSecret::ephemeral() {
                Ok(secret) => secret,
                Err(err) => return fail(exit_code::SOFTWARE, err.to_string()),
            }
        }
    };
    let client = match super::kube_client().await {
        Ok(client) => client,
        Err((code, message)) => return fail(code, message),
    };
    let identity = args.identity.clone().unwrap_or_else(|| {
        nix::unistd::gethostname()
            .ok()
            .and_then(|name| name.into_string().ok())
            .unwrap_or_else(|| format!("redlock-operator-{}", std::process::id()))
    });
    let own_namespace = args
        .namespace
        .clone()
        .unwrap_or_else(|| client.default_namespace().to_owned());
    let secrets_namespace = args
        .secrets_namespace
        .clone()
        .unwrap_or_else(|| own_namespace.clone());
    tracing::info!(%secrets_namespace, "RedisQuorum Secrets are read from this namespace only");
    let election = (!args.no_leader_election).then(|| ElectionOptions {
        namespace: own_namespace,
        lease_name: args.lease_name.clone(),
        identity: identity.clone(),
        timing: LeaseTiming::for_lease_duration(args.lease_duration),
    });
    let lock_selector = args.lock_selector.clone().filter(|selector| !selector.is_empty());
    let quorum_selector = args
        .quorum_selector
        .clone()
        .filter(|selector| !selector.is_empty());
    // A selector the API server cannot parse would fail every watch of the locks or quorums, quietly: refuse it now.
    if let Some(selector) = &lock_selector {
        let locks: kube::Api<crate::api::DistributedLock> = kube::Api::all(client.clone());
        if let Some(message) = unparsable_selector(&locks, selector).await {
            return fail(
                exit_code::USAGE,
                format!("--lock-selector {selector:?}: {message}"),
            );
        }
    }
    if let Some(selector) = &quorum_selector {
        let quorums: kube::Api<crate::api::RedisQuorum> = kube::Api::all(client.clone());
        if let Some(message) = unparsable_selector(&quorums, selector).await {
            return fail(
                exit_code::USAGE,
                format!("--quorum-selector {selector:?}: {message}"),
            );
        }
    }
    let shutdown = CancellationToken::new();
    let options = RunOptions {
        metrics_addr: args.metrics_addr,
        reports_addr: (!args.no_reports).then_some(args.reports_addr),
        reports_max_connections: args.reports_max_connections as usize,
        reports_key: match (&args.reports_tls_cert, &args.reports_tls_key) {
            (Some(certificate), Some(key)) => KeySource::Files {
                certificate: certificate.clone(),
                key: key.clone(),
            },
            _ => KeySource::Generated,
        },
        election,
        secret,
        health_interval: args.health_interval,
        secrets_namespace,
        instance: identity,
        installation: args.installation.clone(),
        scope: LockScope {
            namespaces: args.lock_namespaces.clone(),
            selector: lock_selector,
            quorum_selector,
        },
        hand_over_url: args
            .hand_over_url
            .clone()
            .filter(|url| !url.is_empty())
            .or_else(|| {
                if args.no_reports {
                    return None;
                }
                let reachable = SocketAddr::new(args.pod_ip?, args.reports_addr.port());
                Some(hand_over_url_at(reachable))
            }),
    };
    let running = match start(client, options, shutdown.clone()).await {
        Ok(running) => running,
        Err(err) => return fail(exit_code::UNAVAILABLE, err.to_string()),
    };
    tracing::info!(metrics = %running.metrics_addr, "redlock-operator running");
    let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt()))
    else {
        return fail(exit_code::SOFTWARE, "cannot install signal handlers".into());
    };
    let mut task = running.task;
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM: stopping without releasing held locks"),
        _ = int.recv() => tracing::info!("SIGINT: stopping without releasing held locks"),
        _ = &mut task => return fail(exit_code::SOFTWARE, "the controllers stopped unexpectedly".into()),
    }
    shutdown.cancel();
    let _ = task.await;
    0
}

/// The API server's words when it refuses `selector` (400), asked with a one-item list; `None` when it takes it
/// (or when the list fails otherwise: the watch then retries and says why).
async fn unparsable_selector<K>(api: &kube::Api<K>, selector: &str) -> Option<String>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let probe = kube::api::ListParams::default().labels(selector).limit(1);
    match api.list_metadata(&probe).await {
        Err(kube::Error::Api(status)) if status.code == 400 => Some(status.message),
        _ => None,
    }
}
