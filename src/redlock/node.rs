//! One Redis master: its connection, the restart check that guards every (re)connection, and its health.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Client, RedisError};
use tokio::sync::{Notify, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::config::{ConfigError, Endpoint, RedlockConfig};
use super::info::{ServerInfo, parse_server_info};
use super::outcome::NodeOutcome;
use super::quarantine::{RECENT_RESTART, UPTIME_UNCERTAINTY, quarantine_until};
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

/// What an operation uses a master for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Purpose {
    /// Writes whose answers are votes: a verified connection to a master out of its quarantine.
    Vote,
    /// Deleting our own entries, harmless anywhere: any verified connection, quarantined or not.
    Cleanup,
}

/// How an operation gets to a master: over its verified connection now, or over the one being set up (connection
/// and restart check) once it is verified, if that is by `deadline` (the operation's start plus the node timeout).
pub(crate) enum Reach {
    Now(Ready),
    By {
        deadline: Instant,
        purpose: Purpose,
        /// How long the operation waits for the connection in all (said when it gives up).
        wait: Duration,
    },
}

/// An acquisition waits for a master still connecting up to the connect timeout, but for no more than this
/// fraction of the lock's TTL: the wait comes out of the validity the grant is left with.
pub(crate) const CONNECTING_WAIT_TTL_FRACTION: u32 = 10;

/// How long an operation waits for a master whose connection is still being set up. Opening a connection (a
/// slow DNS answer, a TLS handshake across regions) is not answering: an acquisition of `ttl` waits up to the
/// connect timeout, capped at a tenth of the TTL; every other operation (extensions, which must end within the
/// validity they extend; releases, finished in the background anyway) waits the node timeout, as for an answer.
/// Never less than the node timeout (a TTL is at least ten node timeouts, so the cap keeps that).
pub(crate) fn connecting_wait(
    node_timeout: Duration,
    connect_timeout: Duration,
    ttl: Option<Duration>,
) -> Duration {
    match ttl {
        None => node_timeout,
        Some(ttl) => connect_timeout
            .min(ttl / CONNECTING_WAIT_TTL_FRACTION)
            .max(node_timeout),
    }
}

/// What a master without a verified connection is reported as while its connection is being set up.
const CONNECTING: &str = "connecting";

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
    /// A connection is being set up (or is about to be: a new master, or one whose connection was just
    /// dropped): operations wait for it, up to the node timeout, before counting the master out.
    connecting: bool,
    /// Bumped on every new connection, so an error seen on an old one cannot drop a newer one.
    generation: u64,
    info: Option<ServerInfo>,
    quarantined_until: Option<Instant>,
    /// The latest moment the master can have started, from the uptime it reported at verification.
    started_by: Option<Instant>,
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
    /// Counts the connection attempts that ended, verified or not: what operations waiting for one watch.
    attempts: watch::Sender<u64>,
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
            // Its first attempt starts with the engine.
            state: Mutex::new(State {
                connecting: true,
                ..State::default()
            }),
            reconnect: Notify::new(),
            attempts: watch::Sender::new(0),
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
        self.usable(now, Purpose::Vote)?
            .ok_or_else(|| NodeOutcome::Unavailable(CONNECTING.into()))
    }

    /// Any verified connection, quarantined or not: deleting our own key is harmless anywhere.
    pub(crate) fn connected(&self) -> Result<Ready, NodeOutcome> {
        self.usable(Instant::now(), Purpose::Cleanup)?
            .ok_or_else(|| NodeOutcome::Unavailable(CONNECTING.into()))
    }

    /// How an operation that starts at `now` gets to this master for `purpose`: its verified connection, or the
    /// one being set up, which the operation waits for ([`connecting_wait`]: an acquisition passes its `ttl`);
    /// `Err` when the master is out at once (quarantined for a vote, or not connected and no connection being
    /// set up: down, between retries).
    pub(crate) fn reach(
        &self,
        now: Instant,
        purpose: Purpose,
        ttl: Option<Duration>,
    ) -> Result<Reach, NodeOutcome> {
        Ok(match self.usable(now, purpose)? {
            Some(ready) => Reach::Now(ready),
            None => {
                let wait = connecting_wait(self.settings.node_timeout, self.settings.connect_timeout, ttl);
                Reach::By {
                    deadline: now.checked_add(wait).unwrap_or(now),
                    purpose,
                    wait,
                }
            }
        })
    }

    /// The verified connection `reach` leads to. A connection being set up is waited for until its deadline,
    /// and is then checked for its purpose (the quarantine for a vote) as one found at once would be.
    pub(crate) async fn connection(&self, reach: Reach) -> Result<Ready, NodeOutcome> {
        let (deadline, purpose, wait) = match reach {
            Reach::Now(ready) => return Ok(ready),
            Reach::By {
                deadline,
                purpose,
                wait,
            } => (deadline, purpose, wait),
        };
        // Subscribed before looking, so that an attempt ending in between is not missed.
        let mut attempts = self.attempts.subscribe();
        loop {
            if let Some(ready) = self.usable(Instant::now(), purpose)? {
                return Ok(ready);
            }
            if !matches!(
                tokio::time::timeout_at(deadline, attempts.changed()).await,
                Ok(Ok(()))
            ) {
                return Err(NodeOutcome::Unavailable(format!(
                    "{CONNECTING}, not verified within {}",
                    crate::duration::format(wait)
                )));
            }
        }
    }

    /// How a master that had not answered when an operation was decided is reported: still connecting (it got
    /// no request yet), or pending.
    pub(crate) fn undecided(&self) -> NodeOutcome {
        let state = self.state();
        if state.conn.is_none() && state.connecting {
            NodeOutcome::Unavailable(CONNECTING.into())
        } else {
            NodeOutcome::Pending
        }
    }

    /// The verified connection `purpose` may use at `now`; `Ok(None)` while one is being set up.
    fn usable(&self, now: Instant, purpose: Purpose) -> Result<Option<Ready>, NodeOutcome> {
        let state = self.state();
        let Some(conn) = state.conn.clone() else {
            if state.connecting {
                return Ok(None);
            }
            let reason = state.last_error.clone().unwrap_or_else(|| "not connected".into());
            drop(state);
            self.reconnect.notify_one();
            return Err(NodeOutcome::Unavailable(reason));
        };
        if purpose == Purpose::Vote
            && let Some(until) = state.quarantined_until.filter(|until| *until > now)
        {
            return Err(NodeOutcome::Quarantined {
                remaining: until - now,
            });
        }
        Ok(Some(Ready {
            conn,
            generation: state.generation,
        }))
    }

    /// Whether the master's fencing counters may still be missing keys it knew before a restart: it may have
    /// started less than its quarantine plus [`RECENT_RESTART`] before `now`, that is, it has been voting for
    /// less than that hour (a master never verified has not voted, and does not count).
    pub(crate) fn counters_suspect(&self, now: Instant) -> bool {
        let window = self.settings.quarantine_period.saturating_add(RECENT_RESTART);
        self.state()
            .started_by
            .is_some_and(|started| now.saturating_duration_since(started) < window)
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
                // Told below, the background task reconnects at once.
                state.connecting = true;
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
        self.state().connecting = true;
        let result = tokio::time::timeout(self.settings.connect_timeout, self.open_and_verify()).await;
        let outcome = match result {
            Ok(Ok(())) => Ok(()),
            Ok(Err(message)) => Err(message),
            Err(_) => Err(format!(
                "no answer within the connect timeout ({})",
                crate::duration::format(self.settings.connect_timeout)
            )),
        };
        {
            let mut state = self.state();
            state.connecting = false;
            if let Err(message) = &outcome {
                state.last_error = Some(message.clone());
            }
        }
        self.attempts.send_modify(|ended| *ended = ended.wrapping_add(1));
        outcome
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
        let known_uptime = info.uptime.saturating_sub(UPTIME_UNCERTAINTY);
        let started_by = answered_at.checked_sub(known_uptime).unwrap_or(answered_at);
        state.generation += 1;
        state.conn = Some(conn);
        state.info = Some(info);
        state.quarantined_until = quarantined_until;
        state.started_by = Some(started_by);
        state.latency = Some(answered_at - asked_at);
        state.last_error = None;
        Ok(())
    }

    pub(crate) fn node_timeout(&self) -> Duration {
        self.settings.node_timeout
    }

    /// The client the listening connection (`wake.rs`) is opened with: same address, TLS and credentials.
    pub(crate) fn client(&self) -> &Client {
        &self.client
    }

    pub(crate) fn connect_timeout(&self) -> Duration {
        self.settings.connect_timeout
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

#[cfg(test)]
mod tests {
    use super::*;

    const MS: fn(u64) -> Duration = Duration::from_millis;

    #[test]
    fn an_acquisition_waits_for_a_connection_up_to_the_connect_timeout_within_a_tenth_of_its_ttl() {
        // The defaults (node timeout 50 ms, connect timeout 1 s): a 5 s lock waits 500 ms, a 30 s lock 1 s.
        assert_eq!(connecting_wait(MS(50), MS(1000), Some(MS(5000))), MS(500));
        assert_eq!(connecting_wait(MS(50), MS(1000), Some(MS(30_000))), MS(1000));
        // Never less than the node timeout, even with a connect timeout below it.
        assert_eq!(connecting_wait(MS(50), MS(20), Some(MS(30_000))), MS(50));
        assert_eq!(connecting_wait(MS(50), MS(1000), Some(MS(100))), MS(50));
    }

    #[test]
    fn other_operations_wait_the_node_timeout() {
        assert_eq!(connecting_wait(MS(50), MS(1000), None), MS(50));
    }
}
