//! The client and the lifecycle of its masters' connections: connecting to every master at once (returning
//! when each first attempt ended, or as soon as a majority is verified), the background task per master that
//! reconnects and re-runs the restart check, pings that refresh latency and notice dead connections, and what
//! the masters look like now. Operations take the connections from here as `node.rs` verified them.

use std::sync::Arc;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::config::{ConfigError, RedlockConfig};
use super::node::{Node, Ready, maintain};
use super::node::{NodeHealth, NodeStatus};
use super::scripts::millis;
use super::wake::Wakes;

/// A Redlock client over N independent masters. Cheap to clone; every clone shares the connections.
#[derive(Clone)]
pub struct Redlock {
    pub(super) inner: Arc<Inner>,
}

pub(super) struct Inner {
    pub(super) config: RedlockConfig,
    pub(super) nodes: Vec<Arc<Node>>,
    /// The fencing counters' retention, as the scripts take it.
    pub(super) retention_ms: u64,
    /// Work that outlives the call that started it: the deletes of a release decided at a majority.
    pub(super) background: TaskTracker,
    /// What fair waiters listen on (`wake.rs`).
    pub(super) wakes: Arc<Wakes>,
    pub(super) shutdown: CancellationToken,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum ConnectWait {
    Majority,
    Every,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

impl Redlock {
    /// Validates the configuration and connects to every master at once; returns once every master's first
    /// attempt has ended (each bounded by the connect timeout), so that [`Redlock::masters`] describes them
    /// all. For long-lived users that report on every master (the operator's quorum status). Unreachable
    /// masters are not an error here: operations report them, and they keep being retried in the background.
    pub async fn connect(config: RedlockConfig) -> Result<Self, ConfigError> {
        Self::start(config, ConnectWait::Every).await
    }

    /// Like [`Redlock::connect`], but returns as soon as a majority of masters is connected, verified (the
    /// restart check); the others keep connecting in the background and join when verified. For
    /// short-lived users such as the `lock` command, which would otherwise wait out the connect timeout of
    /// every hung master. A master counts once verified, even if quarantined (operations report that); the
    /// operations wait for masters still connecting (an acquisition up to the connect timeout, within a tenth of
    /// its TTL: `node::connecting_wait`), so that the first one does not count voting masters out because
    /// quarantined ones were verified first. Without a majority it waits for
    /// every first attempt, so that failures are explained.
    pub async fn connect_majority(config: RedlockConfig) -> Result<Self, ConfigError> {
        Self::start(config, ConnectWait::Majority).await
    }

    async fn start(config: RedlockConfig, wait: ConnectWait) -> Result<Self, ConfigError> {
        config.validate()?;
        let nodes = config
            .endpoints
            .iter()
            .map(|endpoint| Node::new(endpoint.clone(), &config).map(Arc::new))
            .collect::<Result<Vec<_>, _>>()?;
        let shutdown = CancellationToken::new();
        let (attempted, mut attempts) = tokio::sync::mpsc::unbounded_channel();
        for node in &nodes {
            let (node, shutdown, attempted) = (node.clone(), shutdown.clone(), attempted.clone());
            tokio::spawn(async move {
                tokio::select! {
                    _ = node.connect() => {}
                    () = shutdown.cancelled() => return,
                }
                // The receiver is gone once `start` returned: nobody waits for this attempt any more.
                let _ = attempted.send(());
                drop(attempted);
                maintain(node, shutdown).await;
            });
        }
        drop(attempted);
        let engine = Self {
            inner: Arc::new(Inner {
                retention_ms: millis(config.token_retention),
                wakes: Arc::new(Wakes::new(nodes.len(), config.quorum())),
                config,
                nodes,
                background: TaskTracker::new(),
                shutdown,
            }),
        };
        let quorum = engine.quorum();
        loop {
            // Verified, not necessarily voting: a quarantined master is reported as such by the operations,
            // and waiting for the hung ones would not end its quarantine any sooner.
            if wait == ConnectWait::Majority && engine.verified() >= quorum {
                break;
            }
            if attempts.recv().await.is_none() {
                break;
            }
        }
        Ok(engine)
    }

    pub fn config(&self) -> &RedlockConfig {
        &self.inner.config
    }

    pub fn quorum(&self) -> usize {
        self.inner.config.quorum()
    }

    pub fn masters(&self) -> Vec<NodeStatus> {
        let now = Instant::now();
        self.inner.nodes.iter().map(|node| node.status(now)).collect()
    }

    /// Masters that can vote right now (connected, verified and not quarantined).
    pub fn eligible(&self) -> usize {
        let now = Instant::now();
        self.inner
            .nodes
            .iter()
            .filter(|node| node.ready(now).is_ok())
            .count()
    }

    /// Masters connected and verified by the restart check, whether quarantined or not.
    fn verified(&self) -> usize {
        let now = Instant::now();
        self.inner
            .nodes
            .iter()
            .filter(|node| node.status(now).health != NodeHealth::Down)
            .count()
    }

    /// Pings every connected master once (bounded by the per-node timeout), refreshing latency and noticing
    /// dead connections, which are then re-verified by the restart check.
    pub async fn check_masters(&self) -> Vec<NodeStatus> {
        let pings = self.inner.nodes.iter().map(|node| async move {
            if let Ok(Ready {
                mut conn, generation, ..
            }) = node.connected()
            {
                let started = Instant::now();
                let ping = redis::cmd("PING");
                match tokio::time::timeout(node.node_timeout(), ping.query_async::<()>(&mut conn)).await {
                    Ok(Ok(())) => node.record_latency(started.elapsed()),
                    Ok(Err(err)) => {
                        node.record_error(generation, &err);
                    }
                    Err(_) => {}
                }
            }
        });
        futures::future::join_all(pings).await;
        self.masters()
    }
}
