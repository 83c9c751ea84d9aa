//! What callers ask of a [`Redlock`]: acquire (the retry loop with its random pauses, and within one attempt the
//! proposal rounds above the counters the masters report), extend, reclaim, release and keep. Each sends its
//! script through the fan-out of `fan_out.rs` and decides by the rules of `rules.rs`; the lease it makes comes
//! from `lease.rs`.

use std::sync::Arc;
use std::time::Duration;

use rand::Rng;
use tokio::time::Instant;

use super::client::Redlock;
use super::error::{AcquireError, ExtendError};
use super::fan_out::{FanOut, Tail};
use super::keeper::KeptLock;
use super::lease::{Holding, Lease, next_token, validity_left};
use super::outcome::{NodeOutcome, OperationReport};
use super::queue::{Waiter, keep_for};
use super::rules::{Op, PROPOSAL_ROUNDS, could_grant, extend_outcome, failed_attempt};
use super::schedule::KeepPolicy;
use super::scripts::{millis, released_channel};
use super::value::LockValue;
use super::wake::Interest;

/// How long and how often [`Redlock::acquire`] tries, and above which fencing token.
#[derive(Clone, Copy, Debug, Default)]
pub struct AcquireOptions {
    /// Attempts in all; `None` takes the configured retry policy, or unlimited when a deadline is set.
    pub attempts: Option<u32>,
    /// Keep trying until this instant; the last attempt starts at it at the latest.
    pub deadline: Option<Instant>,
    /// The highest fencing token the caller knows was granted for this key (0 if none): the first proposal
    /// is the next one. The masters' counters raise it further where they know better.
    pub token_floor: i64,
    /// Wait in the key's fair queue: while the key is held, the attempts ask again as soon as a majority of
    /// masters announce a release (or a leave at the queue's head), and every
    /// [`QUEUE_FALLBACK`](super::QUEUE_FALLBACK) when they announce nothing; the key goes to the waiters in the
    /// order the masters saw them arrive (see `scripts.rs` and `wake.rs`). Without it an acquisition never joins
    /// the queue, and is refused while anyone waits in it (it does not jump the queue).
    pub fair: bool,
}

impl Redlock {
    /// Acquires `resource` for `holder`, retrying with random pauses as `options` allow.
    pub async fn acquire(
        &self,
        resource: &str,
        ttl: Duration,
        holder: &str,
        options: AcquireOptions,
    ) -> Result<Lease, AcquireError> {
        self.acquire_reporting(resource, ttl, holder, options, |_| {})
            .await
    }

    /// [`Redlock::acquire`], telling `waiting` what each failed attempt found (a fair waiter's place in the queue
    /// and the holder are in its report) before the pause that follows it.
    pub async fn acquire_reporting(
        &self,
        resource: &str,
        ttl: Duration,
        holder: &str,
        options: AcquireOptions,
        waiting: impl FnMut(&AcquireError),
    ) -> Result<Lease, AcquireError> {
        self.inner.config.check_ttl(ttl)?;
        self.retrying(resource, 1, holder, options, waiting, |value, floor, waiter| {
            self.try_acquire_waiting(resource, ttl, value, floor, waiter)
        })
        .await
    }

    /// The retry loop of an acquisition: `attempt` with a fresh value, the floor known so far and, for a fair
    /// acquisition, the waiter it is in the key's queue, then a pause (random, or while queued until a majority
    /// of masters announce a release, at the latest the fallback pace), as often and as long as `options` and
    /// the retry policy allow. `permits` is the semaphore's (1: a lock). `waiting` hears of each failed attempt
    /// that is followed by another.
    pub(super) async fn retrying<F, Fut>(
        &self,
        resource: &str,
        permits: u32,
        holder: &str,
        options: AcquireOptions,
        mut waiting: impl FnMut(&AcquireError),
        mut attempt: F,
    ) -> Result<Lease, AcquireError>
    where
        F: FnMut(LockValue, i64, Option<Waiter>) -> Fut,
        Fut: std::future::Future<Output = Result<Lease, AcquireError>>,
    {
        let retry = self.inner.config.retry;
        let max_attempts = options
            .attempts
            .unwrap_or(if options.deadline.is_some() {
                u32::MAX
            } else {
                retry.attempts
            })
            .max(1);
        let mut attempts: u32 = 0;
        let mut floor = options.token_floor;
        let (listens, pace) = self.inner.config.waiting_pace();
        let mut waiter = (options.fair && max_attempts > 1).then(|| Waiter {
            id: rand::rng().random(),
            ticket: 0,
            // Asked at the fallback pace when nothing is announced, it must be kept that long with room.
            keep_ms: millis(keep_for(pace)),
            stays_after_grant: false,
        });
        // Listening starts with the first refusal (an acquisition granted at once never subscribes), and ends
        // when the loop does.
        let channel = released_channel(resource);
        let mut interest: Option<Interest> = None;
        // A waiter whose masters gave it different tickets asks again at once, once, with the highest: from then
        // on every master that queued it orders it alike, and anyone arriving later queues behind it.
        let mut settled_at_once = false;
        loop {
            attempts = attempts.saturating_add(1);
            let value = LockValue::random(holder)?;
            // What was announced before this attempt does not wake the pause after it.
            let heard_before = match &mut interest {
                Some(interest) => {
                    interest.attempting();
                    None
                }
                None if listens && waiter.is_some() => self.inner.wakes.heard(&channel),
                None => None,
            };
            let error = match attempt(value.clone(), floor, waiter).await {
                Ok(lease) => return Ok(lease),
                Err(AcquireError::NotAcquired { kind, report, .. }) => AcquireError::NotAcquired {
                    resource: resource.to_owned(),
                    attempts,
                    kind,
                    report,
                },
                Err(other) => return Err(other),
            };
            if attempts >= max_attempts {
                self.leave_queue(resource, waiter, value, permits).await;
                return Err(error);
            }
            // What the masters said their counters are saves the next attempt a refused round.
            if let Some(counter) = error.report().and_then(OperationReport::highest_counter) {
                floor = floor.max(counter);
            }
            let place = error.report().and_then(OperationReport::queue_place);
            // Announcements to wait for: one per hand-over the waiter needs before it can be let through.
            let bursts: u64;
            let pause = match (&mut waiter, place) {
                (Some(waiter), Some(place)) => {
                    waiter.ticket = waiter.ticket.max(place.ticket);
                    // Those ahead may include one that already holds (granted, not yet out of the queue):
                    // one announcement fewer than waiters ahead, so that it never sleeps through its turn.
                    bursts = place.place.saturating_sub(u64::from(permits.max(1))).max(1);
                    settled_at_once = !place.settled && !settled_at_once;
                    if settled_at_once { Duration::ZERO } else { pace }
                }
                (waiter, _) => {
                    settled_at_once = false;
                    bursts = 1;
                    let pause = if retry.delay_max > retry.delay_min {
                        rand::rng().random_range(retry.delay_min..=retry.delay_max)
                    } else {
                        retry.delay_min
                    };
                    // A waiter that pauses longer than the masters keep it loses its place.
                    if waiter.is_some() { pause.min(pace) } else { pause }
                }
            };
            let now = Instant::now();
            let wake = match options.deadline {
                // Waiting means trying until the deadline: the last pause ends on it, for one last attempt.
                Some(deadline) if now >= deadline => {
                    self.leave_queue(resource, waiter, value, permits).await;
                    return Err(error);
                }
                Some(deadline) => (now + pause).min(deadline),
                None => now + pause,
            };
            if listens && waiter.is_some() && interest.is_none() {
                let inner = &self.inner;
                interest = Some(
                    inner
                        .wakes
                        .listen(&inner.nodes, &inner.shutdown, &channel, heard_before),
                );
            }
            waiting(&error);
            match &mut interest {
                Some(interest) if !pause.is_zero() => {
                    tokio::select! {
                        () = tokio::time::sleep_until(wake) => {}
                        () = interest.woken(bursts) => {}
                    }
                }
                _ => tokio::time::sleep_until(wake).await,
            }
        }
    }

    /// Takes `waiter` out of `resource`'s queue on every master, in the background: a waiter that got the key
    /// would otherwise hold up the ones behind it, once it lets go, until the masters stop keeping it
    /// ([`QUEUE_KEEP`](super::QUEUE_KEEP) or longer). `wake`: how many places at the queue's head let a waiter
    /// through, whose leave is announced to the key's waiters (0 for a lock's winner: the key is its own now,
    /// and waking the others would only cost them a refused attempt).
    pub(super) fn leave_queue_in_background(
        &self,
        resource: &str,
        waiter: Option<Waiter>,
        value: LockValue,
        wake: u32,
    ) {
        if waiter.is_none() {
            return;
        }
        let engine = self.clone();
        let resource = resource.to_owned();
        tokio::spawn(async move { engine.leave_queue(&resource, waiter, value, wake).await });
    }

    /// Takes a waiter granted [`Waiter::staying_after_grant`] out of `resource`'s queue, in the background, once
    /// its caller keeps the key: unannounced, as the engine's own leave after a grant is.
    pub fn leave_won(&self, resource: &str, waiter: Waiter) {
        match LockValue::random("leaving") {
            Ok(value) => self.leave_queue_in_background(resource, Some(waiter), value, 0),
            Err(err) => {
                tracing::debug!(%err, "no value to leave the queue with; the masters drop the waiter in time")
            }
        }
    }

    /// Takes `waiter` out of `resource`'s queue for good (a `DistributedLock` deleted while it waited), announced
    /// when it was at the head: the waiter behind asks at once, instead of once the masters stop keeping this one
    /// (an expiry is never announced).
    pub async fn leave_waiting(&self, resource: &str, waiter: Waiter) {
        match LockValue::random("leaving") {
            Ok(value) => self.leave_queue(resource, Some(waiter), value, 1).await,
            Err(err) => {
                tracing::debug!(%err, "no value to leave the queue with; the masters drop the waiter in time")
            }
        }
    }

    /// Takes `waiter` out of `resource`'s queue, decided at a majority (a waiter that gives up, before its
    /// caller moves on or exits); the masters still on their way finish in the background, as a release's do.
    /// A leave from one of the first `wake` places is announced.
    async fn leave_queue(&self, resource: &str, waiter: Option<Waiter>, value: LockValue, wake: u32) {
        let Some(waiter) = waiter else { return };
        let resource: Arc<str> = resource.into();
        let FanOut { pending, .. } = self
            .fan_out(
                Op::LeaveQueue { waiter, wake },
                &resource,
                &value,
                true,
                None,
                None,
            )
            .await;
        self.finish_in_background(resource, Tail::Deletes, pending);
    }

    /// One Redlock acquisition with the given value: an atomic check-and-set script on every eligible master
    /// at once, decided as soon as a majority granted or can no longer grant. The script grants only if the
    /// key is free *and* the master's fencing counter for it is below the proposed token, and then sets the
    /// counter to the token. The first proposal is `token_floor + 1`; masters whose counter is not below it
    /// refuse and report it, and the proposal is raised above the highest reported at once (no pause: this is
    /// not contention), at most [`PROPOSAL_ROUNDS`] rounds in all. On failure the key is removed from every
    /// master.
    pub async fn try_acquire(
        &self,
        resource: &str,
        ttl: Duration,
        value: LockValue,
        token_floor: i64,
    ) -> Result<Lease, AcquireError> {
        self.try_acquire_waiting(resource, ttl, value, token_floor, None)
            .await
    }

    /// [`Redlock::try_acquire`] for `waiter` in the key's fair queue (`None`: a caller that does not wait, which
    /// the queue refuses while anyone waits in it). Granted, a waiter that any master queued leaves the queue on
    /// every master, in the background. Refused, the report's [`OperationReport::queue_place`] says where it
    /// stands and the ticket to bring next time.
    pub async fn try_acquire_waiting(
        &self,
        resource: &str,
        ttl: Duration,
        value: LockValue,
        token_floor: i64,
        waiter: Option<Waiter>,
    ) -> Result<Lease, AcquireError> {
        let config = &self.inner.config;
        config.check_ttl(ttl)?;
        let resource: Arc<str> = resource.into();
        let ttl_ms = millis(ttl);
        // Validity counts from the first round: keys written then are the oldest this attempt may rely on.
        let started = Instant::now();
        let mut token = next_token(&resource, token_floor.max(0))?;
        let mut round = 1;
        let fan_out = loop {
            let fan_out = self
                .fan_out(
                    Op::Acquire {
                        ttl_ms,
                        token,
                        waiter,
                    },
                    &resource,
                    &value,
                    true,
                    None,
                    None,
                )
                .await;
            // Even with a majority granted, a refusal means some master knows a higher token: propose above it
            // while rounds are left, so that masters that forgot their counters cannot send tokens back.
            match fan_out.report.highest_counter() {
                Some(counter) if round < PROPOSAL_ROUNDS && could_grant(&fan_out.report) => {
                    match next_token(&resource, counter.max(token)) {
                        Ok(next) => token = next,
                        Err(exhausted) => {
                            self.undo_acquire(&resource, &value, fan_out).await;
                            return Err(exhausted);
                        }
                    }
                    round += 1;
                }
                _ => break fan_out,
            }
        };
        let decided_at = Instant::now();
        // Out of rounds with a master that knows a token at or above ours: granting it could send tokens back
        // (the masters that granted may have forgotten theirs), so the attempt fails and the next proposes above.
        let outbid = fan_out
            .report
            .highest_counter()
            .is_some_and(|counter| counter >= token);
        let granted = fan_out.majority && !outbid;
        let validity = validity_left(ttl, started, decided_at, config.drift(ttl));
        match (granted, validity) {
            (true, Some(validity)) => {
                let FanOut { report, pending, .. } = fan_out;
                // Decided at a majority, the rest still get the key (each write bounded by the per-node
                // timeout, so within the validity): dropped, a write not sent yet would never be sent, and the
                // lock would sit on a bare majority until its first extension.
                self.finish_in_background(resource.clone(), Tail::Writes, pending);
                // Masters that queued the waiter but did not grant it would keep it first for QUEUE_KEEP. A waiter
                // granted at its first attempt by every master that answered was never queued: nothing to leave,
                // and an uncontended fair acquisition costs no more round trips than a plain one.
                let queued = waiter.is_some_and(|waiter| waiter.ticket > 0)
                    || report
                        .nodes
                        .iter()
                        .any(|node| matches!(node.outcome, NodeOutcome::Queued { .. }));
                if queued && !waiter.is_some_and(|waiter| waiter.stays_after_grant) {
                    self.leave_queue_in_background(&resource, waiter, value.clone(), 0);
                }
                let holding = Holding {
                    resource,
                    value,
                    ttl,
                    token,
                    permit: 0,
                };
                Ok(Lease::granted(holding, started, validity, report))
            }
            (granted, _) => {
                let report = fan_out.report.clone();
                self.undo_acquire(&resource, &value, fan_out).await;
                Err(failed_attempt(&resource, granted, report))
            }
        }
    }

    /// Extends the lease by its TTL from now. Succeeds only if a majority extended it before the current
    /// validity ended; masters that lost the key get it back with NX, but only as repair, not as votes.
    pub async fn extend(&self, lease: &Lease) -> Result<Lease, ExtendError> {
        let started = Instant::now();
        if started >= lease.valid_until {
            return Err(ExtendError::Expired { report: None });
        }
        let ttl = lease.ttl;
        let FanOut {
            report,
            majority: extended,
            pending,
        } = self
            .fan_out(
                Op::Extend {
                    ttl_ms: millis(ttl),
                    token: lease.token,
                },
                &lease.resource,
                &lease.value,
                true,
                None,
                Some(lease),
            )
            .await;
        self.finish_in_background(lease.resource.clone(), Tail::Writes, pending);
        extend_outcome(
            lease,
            started,
            Instant::now(),
            report,
            extended,
            self.inner.config.drift(ttl),
        )
    }

    /// Takes over a lock whose value this process can rebuild but whose validity it does not know — a
    /// restarted or standby controller resuming a lock its predecessor held. It succeeds only where a majority
    /// of masters still hold `value`: such keys have been present continuously since the predecessor last wrote
    /// them, which it only did while holding the lock, so nobody else can have held a majority in between.
    /// The attempt compares and extends only, never re-creating a key: a key it re-created would be counted by
    /// the next attempt as the predecessor's, and a master that did not answer in time still runs the request
    /// when it wakes (so undoing what the attempt reported cannot catch them all). Extensions repair the
    /// minority once the lock is taken back.
    /// `token` is the predecessor's fencing token: once reclaimed, extensions raise counters that lost it back
    /// to it. The attempt itself raises no counter: `token` comes from a status anyone allowed to may have
    /// written, and only a majority holding `value` (derived from the token) shows it is the acquisition's.
    pub async fn reclaim(
        &self,
        resource: &str,
        ttl: Duration,
        value: LockValue,
        token: i64,
    ) -> Result<Lease, ExtendError> {
        self.inner.config.check_ttl(ttl)?;
        // Its TTL only bounds how long the attempt may take; the validity that counts is the one it returns.
        let probe = Lease::unproven(resource, value, ttl, Instant::now(), self.quorum());
        let result = self
            .extend_many_without_repair(std::slice::from_ref(&probe))
            .await
            .pop()
            .unwrap_or(Err(ExtendError::Expired { report: None }));
        result.map(|lease| lease.with_token(token))
    }

    /// Deletes the key on every connected master where it still holds this lease's value, all at once. Returns
    /// as soon as a majority answered — from then on no majority holds the value, and a contender can acquire —
    /// while the deletes still on their way finish in the background, each bounded by the per-node timeout
    /// (their outcomes show as `Pending`). Short-lived processes call [`Redlock::settle`] before they exit.
    pub async fn release(&self, lease: &Lease) -> OperationReport {
        self.release_value(&lease.resource, lease.value.clone()).await
    }

    /// Deletes `value` from `resource` wherever it is still the value, as [`Redlock::release`] does: for a lock
    /// whose lease this process never had (a predecessor's acquisition, rebuilt from a derived value).
    pub async fn release_value(&self, resource: &str, value: LockValue) -> OperationReport {
        let resource: Arc<str> = resource.into();
        let FanOut { report, pending, .. } = self
            .fan_out(Op::Release, &resource, &value, true, None, None)
            .await;
        self.finish_in_background(resource, Tail::Deletes, pending);
        report
    }

    /// Keeps `lease` extended in the background and tells the owner at once when it is lost.
    pub fn keep(&self, lease: Lease, policy: KeepPolicy) -> KeptLock {
        KeptLock::start(self.clone(), lease, policy)
    }
}
