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
use super::node::Ready;
use super::outcome::NodeOutcome;
use super::rules::{Op, interpret};
use super::scripts;
use super::value::LockValue;

/// The keys one operation touches on every master; the counter's name is made once, not per master.
#[derive(Clone)]
pub(super) struct Keys {
    resource: Arc<str>,
    /// Empty for a release, which leaves the counter alone.
    counter: Arc<str>,
}

impl Keys {
    pub(super) fn of(op: Op, resource: &Arc<str>) -> Self {
        let counter = match op {
            Op::Release => Arc::from(""),
            Op::Acquire { .. } | Op::Extend { .. } => scripts::counter_key(resource).into(),
        };
        Self {
            resource: resource.clone(),
            counter,
        }
    }
}

/// One master's answer: its index, its outcome, and the round trip when it answered.
pub(super) type NodeFuture = BoxFuture<'static, (usize, NodeOutcome, Option<Duration>)>;

impl Redlock {
    /// Runs `op` on master `index` over its verified connection `ready`, bounded by the per-node timeout.
    pub(super) fn run_on_node(
        &self,
        index: usize,
        ready: Ready,
        op: Op,
        Keys { resource, counter }: Keys,
        value: LockValue,
    ) -> NodeFuture {
        let node = self.inner.nodes[index].clone();
        let Ready {
            mut conn, generation, ..
        } = ready;
        let retention_ms = self.inner.retention_ms;
        Box::pin(async move {
            let started = Instant::now();
            let command = async {
                match op {
                    Op::Acquire { ttl_ms, token } | Op::Extend { ttl_ms, token } => {
                        let script = match op {
                            Op::Acquire { .. } => &*scripts::ACQUIRE,
                            _ => &*scripts::EXTEND,
                        };
                        // EVALSHA built once, straight into the command (the script's invocation helper
                        // copies every argument twice); the text goes out only after a NOSCRIPT.
                        let mut evalsha = redis::cmd("EVALSHA");
                        evalsha
                            .arg(script.get_hash())
                            .arg(2)
                            .arg(&*resource)
                            .arg(&*counter)
                            .arg(value.as_str())
                            .arg(ttl_ms)
                            .arg(token)
                            .arg(retention_ms);
                        match evalsha.query_async::<Value>(&mut conn).await {
                            Err(err) if err.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                                // The master lost its script cache (SCRIPT FLUSH, or a restart not noticed
                                // yet): load the script and run it.
                                script
                                    .key(&*resource)
                                    .key(&*counter)
                                    .arg(value.as_str())
                                    .arg(ttl_ms)
                                    .arg(token)
                                    .arg(retention_ms)
                                    .invoke_async::<Value>(&mut conn)
                                    .await
                            }
                            other => other,
                        }
                    }
                    Op::Release => {
                        scripts::RELEASE_SCRIPT
                            .key(&*resource)
                            .arg(value.as_str())
                            .invoke_async::<Value>(&mut conn)
                            .await
                    }
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
