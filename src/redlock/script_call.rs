//! One operation's script on one master: the command as sent (EVALSHA built once, straight into the command),
//! the NOSCRIPT fallback that loads the script text and runs it, the per-node timeout, and the reply read by
//! the rules of `rules.rs`. The connection comes verified (the restart check) from `node.rs`; the fan-out sends
//! this to every master at once.

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use redis::{ErrorKind, ServerErrorKind, Value};
use tokio::time::Instant;

use super::client::Redlock;
use super::node::{Reach, Ready};
use super::outcome::NodeOutcome;
use super::rules::{Op, interpret};
use super::scripts;
use super::value::LockValue;

/// The keys one operation touches on every master; their names are made once, not per master.
#[derive(Clone)]
pub(super) struct Keys {
    resource: Arc<str>,
    /// Empty for a release, which leaves the counter alone.
    counter: Arc<str>,
    /// The key's fair queue and its waiters' deadlines: an acquisition's only (empty otherwise).
    queue: Arc<str>,
    waiting: Arc<str>,
    /// Where a release or a leave is announced (`scripts::released_channel`); empty otherwise.
    channel: Arc<str>,
}

impl Keys {
    pub(super) fn of(op: Op, resource: &Arc<str>) -> Self {
        let empty = || Arc::<str>::from("");
        let counter = match op {
            Op::Release | Op::LeaveQueue { .. } => empty(),
            Op::Acquire { .. } | Op::Extend { .. } => scripts::counter_key(resource).into(),
        };
        let (queue, waiting) = match op {
            Op::Acquire { .. } | Op::LeaveQueue { .. } => {
                let (queue, waiting) = scripts::queue_keys(resource);
                (queue.into(), waiting.into())
            }
            Op::Extend { .. } | Op::Release => (empty(), empty()),
        };
        let channel = match op {
            Op::Release | Op::LeaveQueue { .. } => scripts::released_channel(resource).into(),
            Op::Acquire { .. } | Op::Extend { .. } => empty(),
        };
        Self {
            resource: resource.clone(),
            counter,
            queue,
            waiting,
            channel,
        }
    }
}

/// One master's answer: its index, its outcome, and the round trip when it answered.
pub(super) type NodeFuture = BoxFuture<'static, (usize, NodeOutcome, Option<Duration>)>;

impl Redlock {
    /// Runs `op` on master `index` over the verified connection `reach` leads to (waiting for one being set up
    /// until its deadline), bounded by the per-node timeout.
    pub(super) fn run_on_node(
        &self,
        index: usize,
        reach: Reach,
        op: Op,
        Keys {
            resource,
            counter,
            queue,
            waiting,
            channel,
        }: Keys,
        value: LockValue,
    ) -> NodeFuture {
        let node = self.inner.nodes[index].clone();
        let retention_ms = self.inner.retention_ms;
        let skip_queue = self.inner.config.skips_queue();
        Box::pin(async move {
            let Ready {
                mut conn, generation, ..
            } = match node.connection(reach).await {
                Ok(ready) => ready,
                Err(outcome) => return (index, outcome, None),
            };
            let started = Instant::now();
            let command = async {
                let script = match op {
                    Op::Acquire { .. } => &*scripts::ACQUIRE,
                    Op::Extend { .. } => &*scripts::EXTEND,
                    Op::Release => &*scripts::RELEASE_SCRIPT,
                    Op::LeaveQueue { .. } => &*scripts::LEAVE_QUEUE_SCRIPT,
                };
                // EVALSHA built once, straight into the command (the script's invocation helper copies every
                // argument twice); the text goes out only after a NOSCRIPT.
                let mut evalsha = redis::cmd("EVALSHA");
                evalsha.arg(script.get_hash());
                match op {
                    Op::Acquire { ttl_ms, token, .. } if skip_queue => {
                        evalsha
                            .arg(2)
                            .arg(&*resource)
                            .arg(&*counter)
                            .arg(value.as_str())
                            .arg(ttl_ms)
                            .arg(token)
                            .arg(retention_ms);
                    }
                    Op::Acquire {
                        ttl_ms,
                        token,
                        waiter,
                    } => {
                        evalsha
                            .arg(4)
                            .arg(&*resource)
                            .arg(&*counter)
                            .arg(&*queue)
                            .arg(&*waiting)
                            .arg(value.as_str())
                            .arg(ttl_ms)
                            .arg(token)
                            .arg(retention_ms);
                        match waiter {
                            Some(waiter) => evalsha.arg(waiter.name()).arg(waiter.ticket).arg(waiter.keep_ms),
                            None => evalsha.arg("").arg(0).arg(0),
                        };
                    }
                    Op::Extend { ttl_ms, token } => {
                        evalsha
                            .arg(2)
                            .arg(&*resource)
                            .arg(&*counter)
                            .arg(value.as_str())
                            .arg(ttl_ms)
                            .arg(token)
                            .arg(retention_ms);
                    }
                    Op::Release => {
                        evalsha.arg(1).arg(&*resource).arg(value.as_str()).arg(&*channel);
                    }
                    Op::LeaveQueue { waiter, wake } => {
                        evalsha
                            .arg(2)
                            .arg(&*queue)
                            .arg(&*waiting)
                            .arg(waiter.name())
                            .arg(wake)
                            .arg(&*channel);
                    }
                }
                match evalsha.query_async::<Value>(&mut conn).await {
                    Err(err) if err.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                        // The master lost its script cache (SCRIPT FLUSH, or a restart not noticed yet): load
                        // the script and run it again.
                        script.load_async(&mut conn).await?;
                        evalsha.query_async::<Value>(&mut conn).await
                    }
                    other => other,
                }
            };
            let outcome = match tokio::time::timeout(node.node_timeout(), command).await {
                Err(_) => return (index, NodeOutcome::Timeout, None),
                Ok(Err(err)) => node.record_error(generation, &err),
                Ok(Ok(reply)) => interpret(op, reply),
            };
            let latency = started.elapsed();
            node.record_latency(latency);
            (index, outcome, Some(latency))
        })
    }
}
