//! Counting semaphores: one of N permits, each a Redlock key of its own (see [`scripts::permit_key`]) with its
//! own fencing counter, taken in one round trip where a single key takes one.
//!
//! Every master gets the same list of permit keys, rotated to start at a random permit so that contenders do
//! not all collide on permit 0, and takes the first one that is free (one script call). Masters in the same
//! state take the same permit; a permit granted by a majority is held exactly as a lock is, and the permits
//! the other masters took instead are given back. Extending and releasing a permit is extending and releasing
//! its key: the lease names it.

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::stream::{FuturesUnordered, StreamExt};
use rand::Rng;
use redis::Value;
use tokio::time::Instant;

use super::client::Redlock;
use super::config::ConfigError;
use super::error::AcquireError;
use super::fan_out::Tail;
use super::lease::Lease;
use super::lease::{Holding, next_token, validity_left};
use super::node::{Node, Purpose, Reach, Ready};
use super::operations::AcquireOptions;
use super::outcome::{NodeOutcome, NodeReport, OperationReport};
use super::queue::Waiter;
use super::rules::PROPOSAL_ROUNDS;
use super::rules::{failed_attempt, holder_named, reported_counter};
use super::scripts::{self, MAX_PERMITS, counter_key, millis, permit_key, queue_keys};
use super::value::LockValue;

/// What one master answered an attempt on several permits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Answer {
    /// It took this candidate (an index into the attempt's candidates).
    Granted(usize),
    /// This candidate was free, but its counter is not below the proposal.
    Refused { candidate: usize, counter: i64 },
    /// Every candidate is held by another value (the first one's holder); `counters` as for `Queued`.
    AllHeld {
        holder: Option<String>,
        counters: Vec<(usize, i64)>,
    },
    /// The semaphore's fair queue comes first (see [`NodeOutcome::Queued`]); `counters` are the candidates whose
    /// counters on this master are not below their proposals, with those counters.
    Queued {
        place: u64,
        ticket: i64,
        holder: Option<String>,
        counters: Vec<(usize, i64)>,
    },
    /// No answer that says anything about the permits.
    Failed(NodeOutcome),
}

impl Answer {
    /// The counters, not below their proposals, that this answer reports, by candidate.
    fn known_counters(&self) -> Vec<(usize, i64)> {
        match self {
            Self::Refused { candidate, counter } => vec![(*candidate, *counter)],
            Self::AllHeld { counters, .. } | Self::Queued { counters, .. } => counters.clone(),
            Self::Granted(_) | Self::Failed(_) => Vec::new(),
        }
    }
}

type AnswerFuture = BoxFuture<'static, (usize, Answer)>;

/// The permits one attempt tries, in order, with the token proposed for each.
struct Candidates {
    /// The semaphore's fair queue and its waiters' deadlines.
    queue: (Arc<str>, Arc<str>),
    permits: Vec<u32>,
    /// Per candidate: the permit's key and its counter's key.
    keys: Vec<(Arc<str>, Arc<str>)>,
    tokens: Vec<i64>,
}

impl Candidates {
    /// All `permits` permits of `key`, starting at `start` and wrapping around; the first proposal for each is
    /// one above its floor (`floors[permit]`, 0 where absent).
    fn new(key: &str, permits: u32, start: u32, floors: &[i64]) -> Result<Self, AcquireError> {
        let order: Vec<u32> = (0..permits).map(|offset| (start + offset) % permits).collect();
        let mut keys = Vec::with_capacity(order.len());
        let mut tokens = Vec::with_capacity(order.len());
        for &permit in &order {
            let permit_key = permit_key(key, permit);
            let floor = floors.get(permit as usize).copied().unwrap_or(0).max(0);
            tokens.push(next_token(&permit_key, floor)?);
            let counter: Arc<str> = counter_key(&permit_key).into();
            keys.push((Arc::from(permit_key), counter));
        }
        let (queue, waiting) = queue_keys(key);
        Ok(Self {
            queue: (queue.into(), waiting.into()),
            permits: order,
            keys,
            tokens,
        })
    }

    fn all_keys(&self) -> Vec<Arc<str>> {
        self.keys.iter().map(|(key, _)| key.clone()).collect()
    }
}

fn check_permits(permits: u32) -> Result<(), AcquireError> {
    if (1..=MAX_PERMITS).contains(&permits) {
        Ok(())
    } else {
        Err(AcquireError::Config(ConfigError::Invalid(format!(
            "permits must be between 1 and {MAX_PERMITS}, not {permits}"
        ))))
    }
}

/// Per-candidate grant counts as answers arrive; decided once a candidate has a majority or none can get one.
struct PermitTally {
    quorum: usize,
    grants: Vec<usize>,
    waiting: usize,
}

impl PermitTally {
    fn winner(&self) -> Option<usize> {
        self.grants.iter().position(|grants| *grants >= self.quorum)
    }

    fn decided(&self) -> bool {
        let best = self.grants.iter().copied().max().unwrap_or(0);
        best >= self.quorum || best + self.waiting < self.quorum
    }
}

impl Redlock {
    /// Acquires one of `permits` permits of the semaphore on `key` for `holder`, retrying as
    /// [`Redlock::acquire`] does. `permits` 1 is [`Redlock::acquire`] itself (permit 0 is `key`). The lease
    /// names the permit's key; [`Lease::permit`] says which permit it is. `options.token_floor` is the floor of
    /// every permit; [`Redlock::try_acquire_permit`] takes one per permit.
    pub async fn acquire_permit(
        &self,
        key: &str,
        permits: u32,
        ttl: Duration,
        holder: &str,
        options: AcquireOptions,
    ) -> Result<Lease, AcquireError> {
        self.acquire_permit_reporting(key, permits, ttl, holder, options, |_| {})
            .await
    }

    /// [`Redlock::acquire_permit`], telling `waiting` what each failed attempt found, as
    /// [`Redlock::acquire_reporting`] does. A fair waiter waits in the semaphore's queue (the key's own): it is let
    /// through while its place is within the free permits.
    pub async fn acquire_permit_reporting(
        &self,
        key: &str,
        permits: u32,
        ttl: Duration,
        holder: &str,
        options: AcquireOptions,
        waiting: impl FnMut(&AcquireError),
    ) -> Result<Lease, AcquireError> {
        check_permits(permits)?;
        if permits == 1 {
            return self.acquire_reporting(key, ttl, holder, options, waiting).await;
        }
        let floors = vec![options.token_floor; permits as usize];
        // The retry loop's floor (raised by the counters a failed attempt heard of) is one key's; each permit's
        // own counters raise its proposals within an attempt instead.
        self.retrying(key, permits, holder, options, waiting, |value, _, waiter| {
            let start = rand::rng().random_range(0..permits);
            let floors = &floors;
            async move {
                self.try_acquire_permit_waiting(key, permits, ttl, value, floors, start, waiter)
                    .await
            }
        })
        .await
    }

    /// One attempt on the permits of `key`, tried from permit `start` on; `floors[i]` is the highest token known
    /// for permit i. See the module's documentation.
    pub async fn try_acquire_permit(
        &self,
        key: &str,
        permits: u32,
        ttl: Duration,
        value: LockValue,
        floors: &[i64],
        start: u32,
    ) -> Result<Lease, AcquireError> {
        self.try_acquire_permit_waiting(key, permits, ttl, value, floors, start, None)
            .await
    }

    /// [`Redlock::try_acquire_permit`] for `waiter` in the semaphore's fair queue (`None`: a caller that does not
    /// wait, refused while anyone waits).
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn try_acquire_permit_waiting(
        &self,
        key: &str,
        permits: u32,
        ttl: Duration,
        value: LockValue,
        floors: &[i64],
        start: u32,
        waiter: Option<Waiter>,
    ) -> Result<Lease, AcquireError> {
        let config = &self.inner.config;
        config.check_ttl(ttl)?;
        check_permits(permits)?;
        let mut candidates = Candidates::new(key, permits, start % permits, floors)?;
        let nodes = self.inner.nodes.len();
        // Per master: whether it may hold our value on some permit other than the one that wins (it granted
        // one, it timed out, or a round was decided before it answered), so that it is given back.
        let mut granted: Vec<Vec<usize>> = vec![Vec::new(); nodes];
        let mut uncertain = vec![false; nodes];
        let started = Instant::now();
        let mut round = 1;
        let (answers, pending, winner, outbid, exhausted) = loop {
            let (answers, pending, winner) = self.permit_round(&candidates, &value, ttl, waiter).await;
            let mut raised = false;
            let mut exhausted = None;
            for (index, answer) in answers.iter().enumerate() {
                match answer {
                    Some(Answer::Granted(candidate)) if !granted[index].contains(candidate) => {
                        granted[index].push(*candidate);
                    }
                    Some(Answer::Failed(NodeOutcome::Timeout)) => uncertain[index] = true,
                    _ => {}
                }
                // As for one key: a refusal means a master knows a higher token for that permit; propose
                // above it while rounds are left, also for a permit a majority already granted.
                for (candidate, counter) in answer.iter().flat_map(Answer::known_counters) {
                    if winner.is_none_or(|winner| winner == candidate) {
                        let proposal = &mut candidates.tokens[candidate];
                        if counter >= *proposal {
                            match next_token(&candidates.keys[candidate].0, counter) {
                                Ok(next) => {
                                    *proposal = next;
                                    raised = true;
                                }
                                // A permit at the largest token can never be granted again, but the others
                                // still can: only a winner at it fails the attempt (given back as any).
                                Err(error) => {
                                    if winner == Some(candidate) {
                                        exhausted = Some(error);
                                    }
                                }
                            }
                        }
                    }
                }
            }
            let could_grant = answers
                .iter()
                .filter(|answer| {
                    !matches!(
                        answer,
                        Some(Answer::AllHeld { .. } | Answer::Failed(_) | Answer::Queued { .. })
                    )
                })
                .count()
                >= self.quorum();
            if raised && could_grant && round < PROPOSAL_ROUNDS {
                for (index, answer) in answers.iter().enumerate() {
                    uncertain[index] |= answer.is_none();
                }
                round += 1;
                continue;
            }
            // Out of rounds with the winner's token outbid: as for one key, the attempt fails.
            let outbid = (raised || exhausted.is_some()) && winner.is_some();
            break (answers, pending, winner, outbid, exhausted);
        };
        let decided_at = Instant::now();
        let report = self.permit_report(&answers, winner, started);
        let validity = validity_left(ttl, started, decided_at, config.drift(ttl));
        let keys = candidates.all_keys();
        match (winner.filter(|_| !outbid), validity) {
            (Some(winner), Some(validity)) => {
                let others = (0..nodes)
                    .filter(|index| uncertain[*index] || granted[*index].iter().any(|c| *c != winner))
                    .collect();
                self.give_back_in_background(&keys, &value, others, winner, pending);
                // As for one key: masters that queued the waiter would keep it first for QUEUE_KEEP.
                let queued = waiter.is_some_and(|waiter| waiter.ticket() > 0)
                    || answers
                        .iter()
                        .any(|answer| matches!(answer, Some(Answer::Queued { .. })));
                if queued {
                    // Its leave lets the next waiter through where permits are left: announced.
                    self.leave_queue_in_background(key, waiter, value.clone(), permits);
                }
                let (resource, _) = candidates.keys[winner].clone();
                let holding = Holding {
                    resource,
                    value,
                    ttl,
                    token: candidates.tokens[winner],
                    permit: candidates.permits[winner],
                };
                Ok(Lease::granted(holding, started, validity, report))
            }
            (winner, _) => {
                let holding = (0..nodes)
                    .filter(|index| uncertain[*index] || !granted[*index].is_empty())
                    .collect();
                self.give_back(&keys, &value, holding, pending).await;
                Err(exhausted.unwrap_or_else(|| failed_attempt(key, winner.is_some(), report)))
            }
        }
    }

    /// One round on every eligible master at once (one still connecting is waited for up to the node timeout, as
    /// in every fan-out), decided as soon as a candidate has a majority or none can get one; the masters still
    /// answering are handed back.
    async fn permit_round(
        &self,
        candidates: &Candidates,
        value: &LockValue,
        ttl: Duration,
        waiter: Option<Waiter>,
    ) -> (Vec<Option<Answer>>, FuturesUnordered<AnswerFuture>, Option<usize>) {
        let now = Instant::now();
        let nodes = &self.inner.nodes;
        let mut answers: Vec<Option<Answer>> = vec![None; nodes.len()];
        let mut pending = FuturesUnordered::new();
        for (index, node) in nodes.iter().enumerate() {
            match node.reach(now, Purpose::Vote, Some(ttl)) {
                Ok(reach) => {
                    pending.push(self.acquire_any_on_node(index, reach, candidates, value, ttl, waiter))
                }
                Err(outcome) => answers[index] = Some(Answer::Failed(outcome)),
            }
        }
        let mut tally = PermitTally {
            quorum: self.quorum(),
            grants: vec![0; candidates.keys.len()],
            waiting: pending.len(),
        };
        // As a plain acquisition: once a master that restarted recently granted the winner, the others' answers
        // (their counters) are waited for, a bounded while, before the round is taken as decided.
        let counters_wait = self.counters_wait(ttl);
        let mut heard_a_restarted_master = false;
        let mut counters_deadline: Option<Instant> = None;
        loop {
            let next = if !tally.decided() {
                pending.next().await
            } else {
                let (Some(wait), true, Some(_)) = (counters_wait, heard_a_restarted_master, tally.winner())
                else {
                    break;
                };
                let deadline = *counters_deadline.get_or_insert_with(|| Instant::now() + wait);
                match tokio::time::timeout_at(deadline, pending.next()).await {
                    Ok(next) => next,
                    Err(_) => break,
                }
            };
            let Some((index, answer)) = next else {
                break;
            };
            tally.waiting = tally.waiting.saturating_sub(1);
            if let Answer::Granted(candidate) = answer
                && let Some(grants) = tally.grants.get_mut(candidate)
            {
                *grants += 1;
                heard_a_restarted_master |= nodes[index].counters_suspect(Instant::now());
            }
            answers[index] = Some(answer);
        }
        (answers, pending, tally.winner())
    }

    fn acquire_any_on_node(
        &self,
        index: usize,
        reach: Reach,
        candidates: &Candidates,
        value: &LockValue,
        ttl: Duration,
        waiter: Option<Waiter>,
    ) -> AnswerFuture {
        let node = self.inner.nodes[index].clone();
        let mut invocation = scripts::ACQUIRE_ANY.prepare_invoke();
        invocation.key(&*candidates.queue.0).key(&*candidates.queue.1);
        for (key, counter) in &candidates.keys {
            invocation.key(&**key).key(&**counter);
        }
        invocation
            .arg(value.as_str())
            .arg(millis(ttl))
            .arg(self.inner.retention_ms);
        match waiter {
            Some(waiter) => invocation
                .arg(waiter.name())
                .arg(waiter.ticket())
                .arg(waiter.keep_ms),
            None => invocation.arg("").arg(0).arg(0),
        };
        for token in &candidates.tokens {
            invocation.arg(*token);
        }
        let count = candidates.keys.len();
        Box::pin(async move {
            let Ready {
                mut conn, generation, ..
            } = match node.connection(reach).await {
                Ok(ready) => ready,
                Err(outcome) => return (index, Answer::Failed(outcome)),
            };
            let started = Instant::now();
            let reply =
                tokio::time::timeout(node.node_timeout(), invocation.invoke_async::<Value>(&mut conn)).await;
            let answer = match reply {
                Err(_) => Answer::Failed(NodeOutcome::Timeout),
                Ok(Err(err)) => Answer::Failed(node.record_error(generation, &err)),
                Ok(Ok(reply)) => {
                    node.record_latency(started.elapsed());
                    interpret_any(reply, count)
                }
            };
            (index, answer)
        })
    }

    /// The per-master outcomes of an attempt, as the winning permit's key saw them (all masters' answers
    /// about the permits when none won).
    fn permit_report(
        &self,
        answers: &[Option<Answer>],
        winner: Option<usize>,
        started: Instant,
    ) -> OperationReport {
        let nodes = answers
            .iter()
            .zip(self.inner.nodes.iter())
            .map(|(answer, node)| {
                let outcome = match answer {
                    None => node.undecided(),
                    Some(Answer::Granted(candidate)) if Some(*candidate) == winner => NodeOutcome::Granted,
                    Some(Answer::Granted(_)) => NodeOutcome::HeldByOther {
                        holder: None,
                        counter: None,
                    },
                    Some(Answer::Refused { counter, .. }) => NodeOutcome::TokenTooLow { counter: *counter },
                    // The counters these refusals report raise each permit's proposal within the attempt; the
                    // report (one key's outcomes) leaves them out, so that one permit at the largest token does
                    // not read as the whole semaphore's being exhausted.
                    Some(Answer::AllHeld { holder, .. }) => NodeOutcome::HeldByOther {
                        holder: holder.clone(),
                        counter: None,
                    },
                    Some(Answer::Queued {
                        place,
                        ticket,
                        holder,
                        ..
                    }) => NodeOutcome::Queued {
                        place: *place,
                        ticket: *ticket,
                        holder: holder.clone(),
                        counter: None,
                    },
                    Some(Answer::Failed(outcome)) => outcome.clone(),
                };
                NodeReport {
                    endpoint: node.endpoint().display().to_owned(),
                    outcome,
                    latency: None,
                }
            })
            .collect();
        OperationReport {
            nodes,
            elapsed: started.elapsed(),
            quorum: self.quorum(),
        }
    }

    /// After a failed attempt: our value off every permit on the masters in `holding`, and on those that had
    /// not answered once they have (so the delete cannot overtake their grant on the connection).
    async fn give_back(
        &self,
        keys: &[Arc<str>],
        value: &LockValue,
        holding: Vec<usize>,
        mut pending: FuturesUnordered<AnswerFuture>,
    ) {
        let release =
            |index: usize| release_any(self.inner.nodes[index].clone(), keys.to_vec(), value.clone());
        let mut deletes: FuturesUnordered<_> = holding.into_iter().map(release).collect();
        loop {
            tokio::select! {
                Some((index, answer)) = pending.next() => {
                    if matches!(answer, Answer::Granted(_) | Answer::Failed(NodeOutcome::Timeout)) {
                        deletes.push(release(index));
                    }
                }
                Some(()) = deletes.next() => {}
                else => break,
            }
        }
    }

    /// After a won attempt: the permits other than the winner are given back on the masters in `others`, and
    /// on those that had not answered once they have (keeping the winner where that is what they took), all in
    /// the background.
    fn give_back_in_background(
        &self,
        keys: &[Arc<str>],
        value: &LockValue,
        others: Vec<usize>,
        winner: usize,
        pending: FuturesUnordered<AnswerFuture>,
    ) {
        let losers: Vec<Arc<str>> = keys
            .iter()
            .enumerate()
            .filter(|(candidate, _)| *candidate != winner)
            .map(|(_, key)| key.clone())
            .collect();
        let nodes = self.inner.nodes.clone();
        let release = {
            let losers = losers.clone();
            let value = value.clone();
            move |index: usize| release_any(nodes[index].clone(), losers.clone(), value.clone())
        };
        let work: FuturesUnordered<BoxFuture<'static, ()>> = others.into_iter().map(&release).collect();
        let late = pending.for_each_concurrent(None, move |(index, answer)| {
            let wrong = match answer {
                Answer::Granted(candidate) => candidate != winner,
                Answer::Failed(NodeOutcome::Timeout) => true,
                _ => false,
            };
            let delete = wrong.then(|| release(index));
            async move {
                if let Some(delete) = delete {
                    delete.await;
                }
            }
        });
        work.push(Box::pin(late));
        let resource = keys.get(winner).cloned().unwrap_or_else(|| Arc::from(""));
        self.finish_tail_in_background(resource, Tail::Writes, work, |()| ());
    }
}

/// Deletes our value from `keys` on one master, bounded by the per-node timeout.
fn release_any(node: Arc<Node>, keys: Vec<Arc<str>>, value: LockValue) -> BoxFuture<'static, ()> {
    Box::pin(async move {
        let Ok(Ready {
            mut conn, generation, ..
        }) = node.connected()
        else {
            return;
        };
        let mut invocation = scripts::RELEASE_ANY_SCRIPT.prepare_invoke();
        for key in &keys {
            invocation.key(&**key);
        }
        // Permits given back are announced, as a release is: a waiter may have been refused for them.
        let channel = keys
            .first()
            .map(|key| scripts::released_channel(key))
            .unwrap_or_default();
        invocation.arg(value.as_str()).arg(channel);
        let reply =
            tokio::time::timeout(node.node_timeout(), invocation.invoke_async::<i64>(&mut conn)).await;
        if let Ok(Err(err)) = reply {
            node.record_error(generation, &err);
        }
    })
}

/// What the acquire-any script answered, for an attempt with `count` candidates.
pub(super) fn interpret_any(reply: Value, count: usize) -> Answer {
    let candidate = |value: &Value| match value {
        Value::Int(position) => usize::try_from(*position)
            .ok()
            .and_then(|position| position.checked_sub(1))
            .filter(|candidate| *candidate < count),
        _ => None,
    };
    let unexpected =
        |reply: &[Value]| Answer::Failed(NodeOutcome::Error(format!("unexpected reply {reply:?}")));
    let Value::Array(items) = reply else {
        return Answer::Failed(NodeOutcome::Error(format!("unexpected reply {reply:?}")));
    };
    match items.as_slice() {
        [Value::Int(1), position] => candidate(position).map_or_else(|| unexpected(&items), Answer::Granted),
        [Value::Int(0), position, Value::BulkString(counter)] => match candidate(position) {
            Some(candidate) => Answer::Refused {
                candidate,
                counter: reported_counter(counter),
            },
            None => unexpected(&items),
        },
        [Value::Int(2)] => Answer::AllHeld {
            holder: None,
            counters: Vec::new(),
        },
        [Value::Int(2), holder, known @ ..] if known.len() <= 1 => Answer::AllHeld {
            holder: holder_named(holder),
            counters: known_counters(known.first(), count),
        },
        [
            Value::Int(3),
            Value::Int(place),
            holder,
            Value::BulkString(ticket),
            known @ ..,
        ] if known.len() <= 1 => Answer::Queued {
            place: u64::try_from(*place).unwrap_or(0),
            ticket: reported_counter(ticket),
            holder: holder_named(holder),
            counters: known_counters(known.first(), count),
        },
        _ => unexpected(&items),
    }
}

/// The {i, counter, ...} a refusal reports: candidates (1-based, as the script numbers them) whose counters are
/// not below their proposals. Pairs that name no candidate of this attempt are dropped.
fn known_counters(reply: Option<&Value>, count: usize) -> Vec<(usize, i64)> {
    let Some(Value::Array(items)) = reply else {
        return Vec::new();
    };
    items
        .chunks_exact(2)
        .filter_map(|pair| match pair {
            [Value::Int(position), Value::BulkString(counter)] => usize::try_from(*position)
                .ok()
                .and_then(|position| position.checked_sub(1))
                .filter(|candidate| *candidate < count)
                .map(|candidate| (candidate, reported_counter(counter))),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidates_wrap_around_from_the_start_and_propose_above_each_floor() {
        let candidates = Candidates::new("k", 4, 2, &[0, 5, 7]).unwrap();
        assert_eq!(candidates.permits, vec![2, 3, 0, 1]);
        assert_eq!(candidates.tokens, vec![8, 1, 1, 6]);
        assert_eq!(&*candidates.keys[2].0, "k");
        assert_eq!(&*candidates.keys[0].0, "permit:2:k");
        assert_eq!(&*candidates.keys[0].1, &counter_key("permit:2:k"));
    }

    #[test]
    fn a_floor_at_the_largest_token_is_an_error_not_a_wrap() {
        assert!(matches!(
            Candidates::new("k", 2, 0, &[i64::MAX]),
            Err(AcquireError::TokenExhausted { .. })
        ));
    }

    #[test]
    fn the_tally_decides_on_a_majority_for_one_permit_or_when_none_can_get_one() {
        let mut tally = PermitTally {
            quorum: 3,
            grants: vec![2, 1, 0],
            waiting: 2,
        };
        assert!(!tally.decided(), "permit 0 can still get a majority");
        tally.grants[0] = 3;
        tally.waiting = 1;
        assert!(tally.decided());
        assert_eq!(tally.winner(), Some(0));
        let split = PermitTally {
            quorum: 3,
            grants: vec![2, 2, 1],
            waiting: 0,
        };
        assert!(split.decided());
        assert_eq!(split.winner(), None, "masters that disagree grant nothing");
    }

    #[test]
    fn script_replies_are_read_strictly() {
        assert_eq!(
            interpret_any(Value::Array(vec![Value::Int(1), Value::Int(2)]), 3),
            Answer::Granted(1)
        );
        assert_eq!(
            interpret_any(
                Value::Array(vec![
                    Value::Int(0),
                    Value::Int(1),
                    Value::BulkString(b"41".to_vec())
                ]),
                3
            ),
            Answer::Refused {
                candidate: 0,
                counter: 41
            }
        );
        assert!(matches!(
            interpret_any(Value::Array(vec![Value::Int(1), Value::Int(4)]), 3),
            Answer::Failed(NodeOutcome::Error(_))
        ));
        assert!(matches!(
            interpret_any(Value::Array(vec![Value::Int(1), Value::Int(0)]), 3),
            Answer::Failed(NodeOutcome::Error(_))
        ));
        assert_eq!(
            interpret_any(
                Value::Array(vec![Value::Int(2), Value::BulkString(b"bob|ab12".to_vec())]),
                3
            ),
            Answer::AllHeld {
                holder: Some("bob".into()),
                counters: Vec::new()
            }
        );
        // A refusal names the candidates (1-based) whose counters are not below their proposals; a pair that
        // names no candidate of this attempt is dropped.
        let counters = Value::Array(vec![
            Value::Int(2),
            Value::BulkString(b"78".to_vec()),
            Value::Int(9),
            Value::BulkString(b"5".to_vec()),
        ]);
        assert_eq!(
            interpret_any(
                Value::Array(vec![
                    Value::Int(2),
                    Value::BulkString(b"bob|ab12".to_vec()),
                    counters.clone()
                ]),
                3
            ),
            Answer::AllHeld {
                holder: Some("bob".into()),
                counters: vec![(1, 78)]
            }
        );
        assert_eq!(
            interpret_any(
                Value::Array(vec![
                    Value::Int(3),
                    Value::Int(2),
                    Value::Nil,
                    Value::BulkString(b"4".to_vec()),
                    counters
                ]),
                3
            ),
            Answer::Queued {
                place: 2,
                ticket: 4,
                holder: None,
                counters: vec![(1, 78)]
            }
        );
    }
}
