//! Extending many leases at once: one pipeline per master per batch instead of one round trip per lease, so
//! that a controller holding thousands of locks spends its CPU on locks, not on request overhead.

use std::sync::Arc;
use std::time::Duration;

use futures::stream::{FuturesUnordered, StreamExt};
use redis::Value;
use tokio::time::Instant;

use super::client::Redlock;
use super::error::ExtendError;
use super::fan_out::Tail;
use super::lease::Lease;
use super::node::{Purpose, Reach, Ready};
use super::outcome::{NodeOutcome, NodeReport, OperationReport};
use super::quorum::Tally;
use super::rules::{Op, extend_outcome, interpret};
use super::scripts;
use super::scripts::millis;

/// Commands one pipeline may carry before it is split: keeps a single master's reply time, and so the time the
/// whole batch takes to decide, small against the validity being extended.
pub const MAX_BATCH: usize = 512;

/// Whether an extension re-creates the key on a master that lost it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Repair {
    Recreate,
    Never,
}

/// Pipelines take longer to answer than one command; this much per command is added to the per-node timeout.
const PER_COMMAND_ALLOWANCE: Duration = Duration::from_micros(20);

impl Redlock {
    /// Extends every lease in `leases` (at most [`MAX_BATCH`] are sent per pipeline; longer slices are split).
    /// Each result follows exactly the rule of [`Redlock::extend`]: a majority confirmed before the lease's
    /// validity ended. The batch is timed as a whole, so every lease gets the validity of the slowest master
    /// needed for the decision — conservative, never longer than a single extension would give.
    pub async fn extend_many(&self, leases: &[Lease]) -> Vec<Result<Lease, ExtendError>> {
        self.extend_chunks(leases, Repair::Recreate).await
    }

    /// Like [`Redlock::extend_many`], but a master that lost a key does not get it back: compare-and-extend only.
    /// For a holder that cannot confirm it is still the one entitled to the locks (a controller replica that lost
    /// sight of its lease): whoever took over can release or re-grant a lock, and the next extension then fails
    /// instead of re-creating the old holder's key.
    pub async fn extend_many_without_repair(&self, leases: &[Lease]) -> Vec<Result<Lease, ExtendError>> {
        self.extend_chunks(leases, Repair::Never).await
    }

    async fn extend_chunks(&self, leases: &[Lease], repair: Repair) -> Vec<Result<Lease, ExtendError>> {
        let mut results = Vec::with_capacity(leases.len());
        for chunk in leases.chunks(MAX_BATCH) {
            results.extend(self.extend_chunk(chunk, repair).await);
        }
        results
    }

    async fn extend_chunk(&self, leases: &[Lease], repair: Repair) -> Vec<Result<Lease, ExtendError>> {
        let started = Instant::now();
        let nodes = &self.inner.nodes;
        let quorum = self.quorum();
        let mut outcomes: Vec<Vec<NodeOutcome>> = vec![vec![NodeOutcome::Pending; nodes.len()]; leases.len()];
        let mut latencies: Vec<Option<Duration>> = vec![None; nodes.len()];
        // Leases whose validity already ended are not sent; they fail as a single extension would.
        let live: Vec<bool> = leases.iter().map(|lease| started < lease.valid_until).collect();
        let mut pending = FuturesUnordered::new();
        let mut answered = vec![true; nodes.len()];
        for (index, node) in nodes.iter().enumerate() {
            match node.reach(started, Purpose::Vote, None) {
                Ok(reach) => {
                    answered[index] = false;
                    pending.push(self.pipeline_on_node(index, reach, leases, &live, repair));
                }
                Err(outcome) => {
                    for per_lease in &mut outcomes {
                        per_lease[index] = outcome.clone();
                    }
                }
            }
        }
        let all_decided = |outcomes: &[Vec<NodeOutcome>]| {
            outcomes.iter().zip(&live).all(|(per_lease, live)| {
                !live || {
                    let mut tally = Tally::new(per_lease.len());
                    for outcome in per_lease.iter().filter(|o| **o != NodeOutcome::Pending) {
                        tally.record(outcome.is_vote());
                    }
                    tally.decided().is_some()
                }
            })
        };
        while !all_decided(&outcomes) {
            let Some((index, replies, latency)) = pending.next().await else {
                break;
            };
            answered[index] = true;
            latencies[index] = latency;
            for ((per_lease, outcome), lease) in outcomes.iter_mut().zip(replies).zip(leases) {
                per_lease[index] = lease.counted(index, outcome);
            }
        }
        let decided_at = Instant::now();
        for (index, _) in answered.iter().enumerate().filter(|(_, answered)| !**answered) {
            let undecided = nodes[index].undecided();
            for (per_lease, live) in outcomes.iter_mut().zip(&live) {
                if *live {
                    per_lease[index] = undecided.clone();
                }
            }
        }
        // Masters that had not answered when every lease was decided still get their pipeline (the repair of
        // keys they lost among it): dropped, one not sent yet never would be.
        self.finish_tail_in_background(
            Arc::from("extension batch"),
            Tail::Writes,
            pending,
            |(_, answers, _)| answers.len(),
        );
        let elapsed = decided_at - started;
        leases
            .iter()
            .zip(outcomes)
            .zip(&live)
            .map(|((lease, per_lease), live)| {
                if !live {
                    return Err(ExtendError::Expired { report: None });
                }
                let votes = per_lease.iter().filter(|outcome| outcome.is_vote()).count();
                let report = OperationReport {
                    nodes: per_lease
                        .into_iter()
                        .enumerate()
                        .map(|(index, outcome)| NodeReport {
                            endpoint: nodes[index].endpoint().display().to_owned(),
                            outcome,
                            latency: latencies[index],
                        })
                        .collect(),
                    elapsed,
                    quorum,
                };
                let drift = self.inner.config.drift(lease.ttl);
                extend_outcome(lease, started, decided_at, report, votes >= quorum, drift)
            })
            .collect()
    }

    /// One pipeline of compare-and-pexpire scripts on one master; per lease, what it answered.
    fn pipeline_on_node(
        &self,
        index: usize,
        reach: Reach,
        leases: &[Lease],
        live: &[bool],
        repair: Repair,
    ) -> futures::future::BoxFuture<'static, (usize, Vec<NodeOutcome>, Option<Duration>)> {
        let node = self.inner.nodes[index].clone();
        let hash = match repair {
            Repair::Recreate => scripts::EXTEND.get_hash(),
            Repair::Never => scripts::EXTEND_ONLY_SCRIPT.get_hash(),
        };
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        let mut sent = Vec::with_capacity(leases.len());
        for (lease, live) in leases.iter().zip(live) {
            sent.push(*live);
            if *live {
                pipe.cmd("EVALSHA")
                    .arg(hash)
                    .arg(2)
                    .arg(&*lease.resource)
                    .arg(scripts::counter_key(&lease.resource))
                    .arg(lease.value.as_str())
                    .arg(millis(lease.ttl))
                    .arg(lease.token)
                    .arg(self.inner.retention_ms);
            }
        }
        let count = sent.iter().filter(|live| **live).count();
        let timeout = node.node_timeout() + PER_COMMAND_ALLOWANCE * u32::try_from(count).unwrap_or(u32::MAX);
        Box::pin(async move {
            let per_lease =
                |outcome: &dyn Fn() -> NodeOutcome| sent.iter().map(|_| outcome()).collect::<Vec<_>>();
            let Ready {
                mut conn, generation, ..
            } = match node.connection(reach).await {
                Ok(ready) => ready,
                Err(outcome) => return (index, per_lease(&|| outcome.clone()), None),
            };
            let started = Instant::now();
            let reply = tokio::time::timeout(timeout, pipe.query_async::<Vec<Value>>(&mut conn)).await;
            match reply {
                Err(_) => (index, per_lease(&|| NodeOutcome::Timeout), None),
                Ok(Err(err)) => {
                    let outcome = node.record_error(generation, &err);
                    (index, per_lease(&|| outcome.clone()), None)
                }
                Ok(Ok(values)) => {
                    let latency = started.elapsed();
                    node.record_latency(latency);
                    let mut values = values.into_iter();
                    let outcomes = sent
                        .iter()
                        .map(|live| match (live, values.next()) {
                            (false, _) => NodeOutcome::Pending,
                            (true, Some(Value::ServerError(err))) => {
                                // NOSCRIPT means the master lost its script cache (SCRIPT FLUSH or a restart we
                                // have not noticed yet): reconnecting reloads the scripts and re-runs the
                                // restart check. Other errors concern one key only.
                                let noscript = err.code() == "NOSCRIPT";
                                let redis_err: redis::RedisError = err.into();
                                if noscript {
                                    node.record_error_forcing_reconnect(generation, &redis_err)
                                } else {
                                    node.record_error(generation, &redis_err)
                                }
                            }
                            (true, Some(value)) => interpret(Op::Extend { ttl_ms: 0, token: 0 }, value),
                            (true, None) => NodeOutcome::Error("pipeline reply too short".into()),
                        })
                        .collect();
                    (index, outcomes, Some(latency))
                }
            }
        })
    }
}
