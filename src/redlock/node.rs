//! One Redis master: its connection, the restart check that guards every (re)connection, and its health.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Client, RedisError};
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::config::{ConfigError, Endpoint, RedlockConfig};
use super::info::{ServerInfo, parse_server_info};
use super::outcome::NodeOutcome;
use super::quarantine::quarantine_until;
use super::scripts;

/// Large enough that bursts of pipelined operations never wait for room in redis-rs's request queue.
const PIPELINE_BUFFER: usize = 8192;
const RECONNECT_BACKOFF_MIN: Duration = Duration::from_millis(50);
const RECONNECT_BACKOFF_MAX: Duration = Duration::from_secs(2);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeHealth {
    /// Connected, verified and voting.
    Up,
    /// Connected and verified, but restarted too recently to vote.
    Quarantined,
    /// Not connected; reconnecting in the background.
    Down,
}

#[derive(Clone, Debug)]
pub struct NodeStatus {
    pub endpoint: String,
    pub health: NodeHealth,
    pub run_id: Option<String>,
    pub quarantined_until: Option<Instant>,
    pub last_error: Option<String>,
    pub latency: Option<Duration>,
    /// Restarts noticed by this client (run id changed between two connections).
    pub restarts_seen: u64,
}

/// A connection that passed the restart check, with what the caller needs to use it.
pub(crate) struct Ready {
    pub conn: MultiplexedConnection,
    pub generation: u64,
}

#[derive(Clone, Copy)]
struct Settings {
    node_timeout: Duration,
    connect_timeout: Duration,
    quarantine_period: Duration,
    assume_durable: bool,
}

#[derive(Default)]
struct State {
    conn: Option<MultiplexedConnection>,
    /// Bumped on every new connection, so an error seen on an old one cannot drop a newer one.
    generation: u64,
    info: Option<ServerInfo>,
    quarantined_until: Option<Instant>,
    last_error: Option<String>,
    latency: Option<Duration>,
    restarts_seen: u64,
}

pub(crate) struct Node {
    endpoint: Endpoint,
    client: Client,
    settings: Settings,
    state: Mutex<State>,
    reconnect: Notify,
}

impl Node {
    pub(crate) fn new(endpoint: Endpoint, config: &RedlockConfig) -> Result<Self, ConfigError> {
        let invalid = |err: RedisError| ConfigError::InvalidEndpoint {
            endpoint: endpoint.display().to_owned(),
            reason: err.to_string(),
        };
        let tls = &config.tls;
        let client = if endpoint.is_tls() && (tls.ca_pem.is_some() || tls.client_cert_pem.is_some()) {
            let client_tls = match (&tls.client_cert_pem, &tls.client_key_pem) {
                (Some(cert), Some(key)) => Some(redis::ClientTlsConfig {
                    client_cert: cert.clone(),
                    client_key: key.clone(),
                }),
                (None, None) => None,
                _ => {
                    return Err(ConfigError::Invalid(
                        "a TLS client certificate needs its key, and a key its certificate".into(),
                    ));
                }
            };
            let certificates = redis::TlsCertificates {
                client_tls,
                root_cert: tls.ca_pem.clone(),
            };
            Client::build_with_tls(endpoint.url(), certificates).map_err(invalid)?
        } else {
            Client::open(endpoint.url()).map_err(invalid)?
        };
        Ok(Self {
            endpoint,
            client,
            settings: Settings {
                node_timeout: config.node_timeout,
                connect_timeout: config.connect_timeout,
                quarantine_period: config.quarantine_period(),
                assume_durable: config.assume_durable,
            },
            state: Mutex::new(State::default()),
            reconnect: Notify::new(),
        })
    }

    pub(crate) fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A panic while holding this lock cannot leave the state half-written in a harmful way: every field is
        // overwritten whole, so a poisoned lock is still safe to use.
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A verified connection that may be written to and whose vote counts, or why not.
    pub(crate) fn ready(&self, now: Instant) -> Result<Ready, NodeOutcome> {
        let state = self.state();
        let Some(conn) = state.conn.clone() else {
            let reason = state.last_error.clone().unwrap_or_else(|| "connecting".into());
            drop(state);
            self.reconnect.notify_one();
            return Err(NodeOutcome::Unavailable(reason));
        };
        if let Some(until) = state.quarantined_until.filter(|until| *until > now) {
            return Err(NodeOutcome::Quarantined {
                remaining: until - now,
            });
        }
        Ok(Ready {
            conn,
            generation: state.generation,
        })
    }

    /// Any verified connection, quarantined or not: deleting our own key is harmless anywhere.
    pub(crate) fn connected(&self) -> Result<Ready, NodeOutcome> {
        let state = self.state();
        match state.conn.clone() {
            Some(conn) => Ok(Ready {
                conn,
                generation: state.generation,
            }),
            None => Err(NodeOutcome::Unavailable(
                state.last_error.clone().unwrap_or_else(|| "connecting".into()),
            )),
        }
    }

    pub(crate) fn record_latency(&self, latency: Duration) {
        self.state().latency = Some(latency);
    }

    /// Turns a command error into an outcome. Errors that mean the connection is gone drop it, so that the
    /// master is verified again (restart check) before it is used.
    pub(crate) fn record_error(&self, generation: u64, err: &RedisError) -> NodeOutcome {
        let broken = err.is_io_error() || err.is_connection_dropped() || err.is_unrecoverable_error();
        self.record(generation, err, broken)
    }

    /// For errors that mean the connection's state can no longer be trusted although it still works (a
    /// flushed script cache): the master is verified again, restart check included.
    pub(crate) fn record_error_forcing_reconnect(&self, generation: u64, err: &RedisError) -> NodeOutcome {
        self.record(generation, err, true)
    }

    fn record(&self, generation: u64, err: &RedisError, broken: bool) -> NodeOutcome {
        let message = describe(err);
        {
            let mut state = self.state();
            state.last_error = Some(message.clone());
            if broken && state.generation == generation && state.conn.is_some() {
                state.conn = None;
                tracing::warn!(master = %self.endpoint, error = %message, "lost connection to Redis master");
            }
        }
        if broken {
            self.reconnect.notify_one();
        }
        NodeOutcome::Error(message)
    }

    pub(crate) fn status(&self, now: Instant) -> NodeStatus {
        let state = self.state();
        let quarantined_until = state.quarantined_until.filter(|until| *until > now);
        let health = match (&state.conn, quarantined_until) {
            (None, _) => NodeHealth::Down,
            (Some(_), Some(_)) => NodeHealth::Quarantined,
            (Some(_), None) => NodeHealth::Up,
        };
        NodeStatus {
            endpoint: self.endpoint.display().to_owned(),
            health,
            run_id: state.info.as_ref().map(|info| info.run_id.clone()),
            quarantined_until,
            last_error: state.last_error.clone(),
            latency: state.latency,
            restarts_seen: state.restarts_seen,
        }
    }

    /// Opens a connection, reads `INFO server` for the restart check, loads the scripts, and only then makes
    /// the connection usable. The whole sequence is bounded by the connect timeout.
    pub(crate) async fn connect(&self) -> Result<(), String> {
        let result = tokio::time::timeout(self.settings.connect_timeout, self.open_and_verify()).await;
        let outcome = match result {
            Ok(Ok(())) => return Ok(()),
            Ok(Err(message)) => message,
            Err(_) => format!(
                "no answer within the connect timeout ({})",
                crate::duration::format(self.settings.connect_timeout)
            ),
        };
        self.state().last_error = Some(outcome.clone());
        Err(outcome)
    }

    async fn open_and_verify(&self) -> Result<(), String> {
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.settings.connect_timeout))
            // Per-command deadlines are ours (the per-node timeout); redis-rs's own would cut them differently.
            .set_response_timeout(None)
            .set_pipeline_buffer_size(PIPELINE_BUFFER);
        let mut conn = self
            .client
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .map_err(|err| describe(&err))?;
        let asked_at = Instant::now();
        let text: String = redis::cmd("INFO")
            .arg("server")
            .query_async(&mut conn)
            .await
            .map_err(|err| describe(&err))?;
        let answered_at = Instant::now();
        let info = parse_server_info(&text)?;
        for script in scripts::all() {
            script
                .prepare_invoke()
                .load_async(&mut conn)
                .await
                .map_err(|err| describe(&err))?;
        }
        let quarantined_until = quarantine_until(
            answered_at,
            info.uptime,
            self.settings.quarantine_period,
            self.settings.assume_durable,
        );
        let mut state = self.state();
        if let Some(previous) = &state.info
            && previous.run_id != info.run_id
        {
            state.restarts_seen += 1;
            tracing::warn!(master = %self.endpoint, uptime_s = info.uptime.as_secs(), "Redis master restarted");
        }
        if let Some(until) = quarantined_until {
            tracing::warn!(
                master = %self.endpoint,
                quarantine_s = (until - answered_at).as_secs_f64(),
                "Redis master started recently: quarantined, it may have forgotten live locks"
            );
        }
        tracing::debug!(
            master = %self.endpoint,
            run_id = %info.run_id,
            uptime_s = info.uptime.as_secs(),
            quarantined = quarantined_until.is_some(),
            at = ?answered_at,
            "connected and verified"
        );
        state.generation += 1;
        state.conn = Some(conn);
        state.info = Some(info);
        state.quarantined_until = quarantined_until;
        state.latency = Some(answered_at - asked_at);
        state.last_error = None;
        Ok(())
    }

    pub(crate) fn node_timeout(&self) -> Duration {
        self.settings.node_timeout
    }
}

/// Keeps a master connected: reconnects with capped exponential backoff whenever the connection is dropped.
/// Ends when `shutdown` is cancelled (the engine was dropped).
pub(crate) async fn maintain(node: Arc<Node>, shutdown: CancellationToken) {
    let mut backoff = RECONNECT_BACKOFF_MIN;
    loop {
        let connected = node.state().conn.is_some();
        if connected {
            backoff = RECONNECT_BACKOFF_MIN;
            tokio::select! {
                () = node.reconnect.notified() => continue,
                () = shutdown.cancelled() => return,
            }
        }
        let attempt = tokio::select! {
            result = node.connect() => result,
            () = shutdown.cancelled() => return,
        };
        if let Err(message) = attempt {
            tracing::debug!(master = %node.endpoint, error = %message, "reconnect failed");
            tokio::select! {
                () = tokio::time::sleep(backoff) => {}
                () = shutdown.cancelled() => return,
            }
            backoff = (backoff * 2).min(RECONNECT_BACKOFF_MAX);
        }
    }
}

/// A one-line description of a Redis error that never contains the URL (and so never a password).
fn describe(err: &RedisError) -> String {
    let text = err.to_string();
    if err.is_connection_refusal() {
        format!("connection refused ({text})")
    } else {
        text
    }
}
