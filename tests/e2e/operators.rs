//! The operator as the end-to-end tests start it: in-process, by the same code path as `redlock-operator run`,
//! one replica at a time, each with the options a test needs (its client, installation, scope, report URL).

use super::*;

/// The shared secret of one installation (all its replicas).
pub fn installation_secret(seed: u8) -> Vec<u8> {
    format!("test-installation-secret-{seed:03}-0123456789abcdef").into_bytes()
}

/// Starts the operator in-process, the same code path as `redlock-operator run`.
pub async fn operator(env: &Env, secret: &[u8], identity: Option<&str>) -> (Running, CancellationToken) {
    operator_with_client(env, env.operator_client(), secret, identity).await
}

/// An operator replica talking to the API through `client` (one behind a fault proxy, say).
pub async fn operator_with_client(
    env: &Env,
    client: Client,
    secret: &[u8],
    identity: Option<&str>,
) -> (Running, CancellationToken) {
    operator_of(env, client, secret, identity, None, None, None).await
}

/// [`operator`] showing `hand_over_url` in status as where holders report their work stopped (a door in front of
/// its own endpoint, say), instead of its metrics address.
pub async fn operator_reporting_to(
    env: &Env,
    secret: &[u8],
    hand_over_url: &str,
) -> (Running, CancellationToken) {
    operator_of(
        env,
        env.operator_client(),
        secret,
        None,
        None,
        Some(hand_over_url.to_owned()),
        None,
    )
    .await
}

/// An operator of the installation `installation` (another than the tests' usual one, for tests of two
/// installations in one cluster).
pub async fn operator_of_installation(
    env: &Env,
    secret: &[u8],
    installation: &str,
) -> (Running, CancellationToken) {
    operator_of(
        env,
        env.operator_client(),
        secret,
        None,
        Some((installation, env.default_scope())),
        None,
        None,
    )
    .await
}

/// [`operator_of_installation`] looking only at the locks `scope` covers.
pub async fn operator_scoped(
    env: &Env,
    secret: &[u8],
    installation: &str,
    scope: LockScope,
) -> (Running, CancellationToken) {
    operator_of(
        env,
        env.operator_client(),
        secret,
        None,
        Some((installation, scope)),
        None,
        None,
    )
    .await
}

/// [`operator_scoped`] reading quorum Secrets from `secrets_namespace` (another than the test's namespace): a
/// second release's operator, whose quorums' Secrets are in its own namespace.
pub async fn operator_reading_secrets_in(
    env: &Env,
    secret: &[u8],
    installation: &str,
    scope: LockScope,
    secrets_namespace: &str,
) -> (Running, CancellationToken) {
    operator_of(
        env,
        env.operator_client(),
        secret,
        None,
        Some((installation, scope)),
        None,
        Some(secrets_namespace),
    )
    .await
}

async fn operator_of(
    env: &Env,
    client: Client,
    secret: &[u8],
    identity: Option<&str>,
    installation: Option<(&str, LockScope)>,
    hand_over_url: Option<String>,
    secrets_namespace: Option<&str>,
) -> (Running, CancellationToken) {
    let (installation, scope) = match installation {
        Some((name, scope)) => (Some(name.to_owned()), scope),
        None => (None, env.default_scope()),
    };
    if std::env::var_os("RUST_LOG").is_some() {
        redlock_operator::telemetry::init(redlock_operator::telemetry::LogFormat::Text, "warn");
    }
    let shutdown = CancellationToken::new();
    let options = RunOptions {
        metrics_addr: "127.0.0.1:0".parse().expect("addr"),
        reports_addr: Some("127.0.0.1:0".parse().expect("addr")),
        reports_max_connections: redlock_operator::report_channel::server::MAX_CONNECTIONS as usize,
        reports_key: Default::default(),
        election: identity.map(|identity| ElectionOptions {
            namespace: env.namespace.clone(),
            lease_name: "redlock-operator".into(),
            identity: identity.to_owned(),
            timing: LeaseTiming::for_lease_duration(Duration::from_secs(2)),
        }),
        secret: InstallationSecret::from_bytes(secret).expect("secret"),
        health_interval: Duration::from_millis(500),
        secrets_namespace: secrets_namespace.map_or_else(|| env.namespace.clone(), str::to_owned),
        instance: identity.unwrap_or("single").to_owned(),
        installation,
        scope,
        hand_over_url,
    };
    let running = start(client, options, shutdown.clone())
        .await
        .expect("operator starts");
    (running, shutdown)
}
