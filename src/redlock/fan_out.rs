//! One operation on every master at once: sent concurrently (a master still connecting gets up to the node
//! timeout to be verified, an acquisition's up to the connect timeout within a tenth of its TTL), decided as soon as a majority voted or can no longer vote, and the masters that had
//! not answered by then finished in the background (within the per-node timeout, and one more for a master still
//! connecting) instead of dropped, so that a decided acquisition does not sit on a bare majority and a release
//! reaches every master. A failed acquisition is undone here too, each unlock ordered behind its master's SET.

use std::sync::Arc;
use std::time::Duration;

use futures::stream::{FuturesUnordered, StreamExt};
use tokio::time::Instant;

use super::client::Redlock;
use super::lease::Lease;
use super::node::{Purpose, Reach};
use super::outcome::{NodeOutcome, NodeReport, OperationReport};
use super::quorum::{Tally, quorum_of};
use super::rules::{Op, PROPOSAL_ROUNDS};
use super::script_call::{Keys, NodeFuture};
use super::value::LockValue;

/// What a fan-out decided, and the masters that had not answered yet.
pub(super) struct FanOut {
    pub(super) report: OperationReport,
    pub(super) majority: bool,
    pub(super) pending: FuturesUnordered<NodeFuture>,
}

/// What the masters that had not answered when an operation was decided are still being sent.
#[derive(Clone, Copy, Debug)]
pub(super) enum Tail {
    /// An acquisition's or extension's writes: without them a lock sits on a bare majority, and one more lost
    /// master loses it.
    Writes,
    /// A release's deletes: without them those masters keep the key until it expires.
    Deletes,
}

/// The unanswered part of one operation, finished in the background; says so if it is dropped unfinished (the
/// runtime shut down before [`Redlock::settle`]).
struct Straggler {
    resource: Arc<str>,
    tail: Tail,
    left: usize,
}

impl Drop for Straggler {
    fn drop(&mut self) {
        if self.left == 0 {
            return;
        }
        match self.tail {
            Tail::Deletes => tracing::warn!(
                resource = %self.resource,
                masters = self.left,
                "release abandoned before every master answered; the key expires there by its TTL"
            ),
            Tail::Writes => tracing::debug!(
                resource = %self.resource,
                masters = self.left,
                "writes abandoned before every master answered; the next extension repairs them"
            ),
        }
    }
}

impl Redlock {
    /// Waits until the work left to the background (the writes and deletes of operations decided at a
    /// majority) is done: at most one per-node timeout after the last operation. A process that exits right
    /// after releasing calls this first, so that a slow master still gets its delete instead of keeping the key
    /// until it expires.
    pub async fn settle(&self) {
        let background = &self.inner.background;
        background.close();
        background.wait().await;
        background.reopen();
    }

    /// Keeps the requests of a decided operation going until each master answered or timed out. Requests
    /// already written to a connection run either way; the point is the ones not written yet, which the client
    /// discards once nobody waits for them.
    pub(super) fn finish_in_background(
        &self,
        resource: Arc<str>,
        tail: Tail,
        pending: FuturesUnordered<NodeFuture>,
    ) {
        self.finish_tail_in_background(resource, tail, pending, |(_, outcome, _)| outcome);
    }

    /// [`Redlock::finish_in_background`] for any per-master future; `outcome` says what one master answered.
    pub(super) fn finish_tail_in_background<F, O>(
        &self,
        resource: Arc<str>,
        tail: Tail,
        mut pending: FuturesUnordered<F>,
        outcome: fn(F::Output) -> O,
    ) where
        F: std::future::Future + Send + 'static,
        F::Output: Send,
        O: std::fmt::Debug + 'static,
    {
        if pending.is_empty() {
            return;
        }
        let mut straggler = Straggler {
            resource,
            tail,
            left: pending.len(),
        };
        // Runs on its own clones of the connections: dropping the engine does not cut it short.
        self.inner.background.spawn(async move {
            while let Some(answer) = pending.next().await {
                straggler.left = straggler.left.saturating_sub(1);
                let answer = outcome(answer);
                tracing::debug!(resource = %straggler.resource, ?straggler.tail, ?answer, "late answer");
            }
        });
    }

    /// Sends `op` to the masters selected by `only` (all when `None`) concurrently. A master whose connection
    /// is still being set up (a fresh client, a reconnection) is waited for (`node::connecting_wait`), so that it
    /// is not counted out while it might still vote. With `decide_early`, returns as soon as a majority voted
    /// yes or can no longer do so; the masters still answering are handed back in `pending` (their outcome
    /// shows as `Pending`, or as unavailable while still connecting). An extension passes its lease as
    /// `extended`, whose unconfirmed masters do not vote.
    pub(super) async fn fan_out(
        &self,
        op: Op,
        resource: &Arc<str>,
        value: &LockValue,
        decide_early: bool,
        only: Option<&[usize]>,
        extended: Option<&Lease>,
    ) -> FanOut {
        let started = Instant::now();
        let nodes = &self.inner.nodes;
        let mut tally = Tally::new(nodes.len());
        let mut reports: Vec<NodeReport> = nodes
            .iter()
            .map(|node| NodeReport {
                endpoint: node.endpoint().display().to_owned(),
                outcome: NodeOutcome::Pending,
                latency: None,
            })
            .collect();
        let mut pending = FuturesUnordered::new();
        let keys = Keys::of(op, resource);
        for (index, node) in nodes.iter().enumerate() {
            if only.is_some_and(|only| !only.contains(&index)) {
                continue;
            }
            let purpose = match op {
                Op::Release | Op::LeaveQueue { .. } => Purpose::Cleanup,
                Op::Acquire { .. } | Op::Extend { .. } => Purpose::Vote,
            };
            let ttl = match op {
                Op::Acquire { ttl_ms, .. } => Some(Duration::from_millis(ttl_ms)),
                Op::Extend { .. } | Op::Release | Op::LeaveQueue { .. } => None,
            };
            match node.reach(started, purpose, ttl) {
                Ok(reach) => pending.push(self.run_on_node(index, reach, op, keys.clone(), value.clone())),
                Err(outcome) => {
                    tally.record(false);
                    reports[index].outcome = outcome;
                }
            }
        }
        let mut decision = tally.decided();
        // An acquisition granted by a master that restarted recently waits for the other masters' answers: that
        // master forgot the key's counter, and a slow master that remembers a higher one must be heard before the
        // token is fixed (the caller proposes above it).
        let mut heard_a_restarted_master = false;
        let counters_wait = match op {
            Op::Acquire { ttl_ms, .. } => self.counters_wait(Duration::from_millis(ttl_ms)),
            Op::Extend { .. } | Op::Release | Op::LeaveQueue { .. } => None,
        };
        let mut counters_deadline: Option<Instant> = None;
        while decision.is_none() || !decide_early || (heard_a_restarted_master && decision == Some(true)) {
            let next = match counters_deadline {
                Some(deadline) => match tokio::time::timeout_at(deadline, pending.next()).await {
                    Ok(next) => next,
                    Err(_) => break,
                },
                None => pending.next().await,
            };
            let Some((index, outcome, latency)) = next else {
                break;
            };
            let outcome = match extended {
                Some(lease) => lease.counted(index, outcome),
                None => outcome,
            };
            let vote = op.counts(&outcome);
            tally.record(vote);
            heard_a_restarted_master |=
                counters_wait.is_some() && vote && nodes[index].counters_suspect(Instant::now());
            reports[index].outcome = outcome;
            reports[index].latency = latency;
            decision = tally.decided();
            if let Some(wait) = counters_wait
                && decide_early
                && heard_a_restarted_master
                && decision == Some(true)
                && counters_deadline.is_none()
            {
                counters_deadline = Some(Instant::now() + wait);
            }
        }
        if heard_a_restarted_master && decide_early {
            tracing::debug!(
                %resource,
                "a master restarted recently granted: waited for the other masters' fencing counters"
            );
        }
        for (index, report) in reports.iter_mut().enumerate() {
            if report.outcome == NodeOutcome::Pending && only.is_none_or(|only| only.contains(&index)) {
                report.outcome = nodes[index].undecided();
            }
        }
        FanOut {
            report: OperationReport {
                nodes: reports,
                elapsed: started.elapsed(),
                quorum: quorum_of(nodes.len()),
            },
            majority: decision == Some(true),
            pending,
        }
    }

    /// How long a round of an acquisition (of `ttl`) decided with a recently restarted master's grant waits for the
    /// other masters' counters: the node timeout, but at most a sixteenth of the TTL, so that the attempt's rounds
    /// ([`PROPOSAL_ROUNDS`], four) never wait away more than a quarter of its validity together. `None`: no wait
    /// (durable masters keep their counters across a restart, or the negative control).
    pub(super) fn counters_wait(&self, ttl: Duration) -> Option<Duration> {
        let config = &self.inner.config;
        if config.assume_durable || !config.waits_for_counters() {
            return None;
        }
        Some(config.node_timeout.min(ttl / (4 * PROPOSAL_ROUNDS)))
    }

    /// Removes a failed acquisition's key everywhere. A master whose SET is still unanswered gets its unlock
    /// only once that SET has been answered or timed out: by then the SET is queued ahead of the unlock on the
    /// same ordered connection, whatever order the futures happened to be polled in, so a late SET can never
    /// land after its unlock. Bounded by two per-node timeouts.
    pub(super) async fn undo_acquire(&self, resource: &Arc<str>, value: &LockValue, fan_out: FanOut) {
        let FanOut {
            report, mut pending, ..
        } = fan_out;
        let answered: Vec<usize> = report
            .nodes
            .iter()
            .enumerate()
            .filter(|(_, node)| node.outcome != NodeOutcome::Pending)
            .map(|(index, _)| index)
            .collect();
        let unlock_answered = self.fan_out(Op::Release, resource, value, false, Some(&answered), None);
        let unlock_late = async {
            let mut unlocks = FuturesUnordered::new();
            loop {
                tokio::select! {
                    Some((index, _, _)) = pending.next() => {
                        if let Ok(ready) = self.inner.nodes[index].connected() {
                            unlocks.push(self.run_on_node(
                            index,
                            Reach::Now(ready),
                            Op::Release,
                            Keys::of(Op::Release, resource),
                            value.clone(),
                        ));
                        }
                    }
                    Some(_) = unlocks.next() => {}
                    else => break,
                }
            }
        };
        tokio::join!(unlock_answered, unlock_late);
    }
}
