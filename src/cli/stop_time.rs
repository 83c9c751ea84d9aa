//! When a holder (`elect`, the Job guard) stops its work, on its own clock only.
//!
//! The holder asks the active replica how long its grant stays valid (`POST /v1/validity` on the origin of
//! `status.handOverUrl`, over the channel whose certificate status pins) and counts the answer from the moment
//! it sent the question, on its monotonic clock, less the drift its clock may have against the operator's and its
//! fence margin: the answer is at most the replica's lease left when it answered, which came after the question
//! left, so the holder stops before the validity ends whatever the two wall clocks say (Gray and Cheriton's
//! leases; client-go's leader election likewise never compares clocks across machines).
//!
//! An answer "unknown" (a standby, a replica status does not name yet after a failover) or an ask that failed
//! (refused, timed out, a flood of the port, another certificate) never gives a later stop time, and never sends
//! the holder back to status's wall-clock time: the stop time of the last good answer stands. Only where status
//! offers no channel at all (no `handOverUrl` or no pin: an operator older than this helper) is the stop time
//! `validUntil` less the margin and a stated bound on how far this node's wall clock may be behind the operator's.

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use k8s_openapi::jiff::Timestamp;
use tokio::time::Instant;

use super::held_term::{Term, fence_instant};
use crate::api::DistributedLock;
use crate::api::holder_contract::{VALIDITY_PATH, ValidityAnswer, ValidityQuestion};
use crate::report_channel::client::{Caller, PostError};

/// How much faster than the operator's this holder's clock may run: the masters' drift factor bound
/// (`RedisQuorum` `driftFactor`'s default, which the engine subtracts from every validity). An answer of `r` is
/// counted as `r × (1 − DRIFT_FACTOR)`.
pub const DRIFT_FACTOR: f64 = 0.01;
/// `--max-clock-skew` unless given.
pub const DEFAULT_MAX_CLOCK_SKEW: &str = "1s";
/// One ask's bound: the replica answers from memory.
const ASK_TIMEOUT: Duration = Duration::from_secs(2);
/// Between asks that got no answer, unless the replica asked for longer (`Retry-After`): doubled after each
/// further one, up to [`MAX_RETRY_PAUSE`], so that every holder of a replica that is gone or not yet resumed (a
/// failover with 10,000 of them) does not ask four times a second. A change of status asks at once meanwhile.
const RETRY_PAUSE: Duration = Duration::from_millis(250);
const MAX_RETRY_PAUSE: Duration = Duration::from_secs(2);

/// Where a holder asks: the validity URL on the origin of `status.handOverUrl`, and the pin status shows beside
/// it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Channel {
    pub url: String,
    pub pin: String,
}

/// How a term's stop time is found, from what status offers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Basis {
    /// Asked over the channel, counted on this holder's clock.
    Ask(Channel),
    /// Status offers no channel (an older operator): `validUntil` on this node's wall clock, its margin widened by
    /// the skew bound.
    WallClock,
}

/// What status offers. A URL that is not one, with a pin, is still a channel (asks to it fail, and the work stops
/// at its stop time): only an operator that shows no channel at all is trusted for the wall-clock path.
pub fn basis_of(lock: Option<&DistributedLock>) -> Basis {
    let status = lock.and_then(|lock| lock.status.as_ref());
    let (Some(url), Some(pin)) = (
        status.and_then(|status| status.hand_over_url.as_deref()),
        status.and_then(|status| status.hand_over_certificate_sha256.as_deref()),
    ) else {
        return Basis::WallClock;
    };
    let url = match url::Url::parse(url) {
        Ok(mut parsed) => {
            parsed.set_path(VALIDITY_PATH);
            parsed.set_query(None);
            parsed.to_string()
        }
        Err(_) => url.to_owned(),
    };
    Basis::Ask(Channel {
        url,
        pin: pin.to_owned(),
    })
}

/// What an ask came to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Asked {
    /// The grant stays valid `remaining` after the replica answered a question sent at `sent_at`.
    Valid { sent_at: Instant, remaining: Duration },
    /// The replica answered, but not with a validity (its reason).
    Unknown(String),
    /// No answer (why), and when the replica asked to be asked again.
    Failed {
        message: String,
        retry_after: Option<Duration>,
    },
}

/// The stop time an answer gives: counted from the moment the question was sent, less the drift and the margin
/// (then, if nothing is left).
pub fn stop_after_answer(sent_at: Instant, remaining: Duration, margin: Duration) -> Instant {
    let counted = remaining.mul_f64(1.0 - DRIFT_FACTOR);
    (sent_at + counted)
        .checked_sub(margin)
        .map_or(sent_at, |at| at.max(sent_at))
}

/// The stop time where status offers no channel: the validity status shows, on this node's wall clock, less the
/// margin and the bound on this clock's skew.
pub fn stop_by_wall_clock(
    term: &Term,
    margin: Duration,
    max_skew: Duration,
    now: Instant,
    wall_now: Timestamp,
) -> Instant {
    fence_instant(term, margin.saturating_add(max_skew), now, wall_now)
}

/// After an ask answered at `now`: the stop time (`stop_at`, the last good answer's, if any) and when to ask next.
/// Only a validity sets a stop time; anything else keeps the one there is. Pure.
pub fn after_ask(
    stop_at: Option<Instant>,
    asked: &Asked,
    margin: Duration,
    now: Instant,
) -> (Option<Instant>, Instant) {
    after_asks(stop_at, asked, margin, now, 0)
}

/// [`after_ask`] after `misses` asks in a row that got no validity before this one: a further miss waits
/// [`retry_pause`] of them.
pub fn after_asks(
    stop_at: Option<Instant>,
    asked: &Asked,
    margin: Duration,
    now: Instant,
    misses: u32,
) -> (Option<Instant>, Instant) {
    let pause = retry_pause(misses);
    match asked {
        Asked::Valid { sent_at, remaining } => {
            let stop = stop_after_answer(*sent_at, *remaining, margin);
            // Asked again when half of the time left has passed: room for retries before the stop, and no more
            // often than that (an extension in status alone sends no ask).
            let next = now + stop.saturating_duration_since(now) / 2;
            (Some(stop), next.max(now + RETRY_PAUSE))
        }
        Asked::Unknown(_) => (stop_at, now + pause),
        Asked::Failed { retry_after, .. } => (stop_at, now + retry_after.unwrap_or_default().max(pause)),
    }
}

/// The pause after the answer that follows `misses` answers without a validity: [`RETRY_PAUSE`] doubled that many
/// times, at most [`MAX_RETRY_PAUSE`]. Pure.
pub fn retry_pause(misses: u32) -> Duration {
    RETRY_PAUSE
        .checked_mul(2u32.saturating_pow(misses.min(16)))
        .map_or(MAX_RETRY_PAUSE, |pause| pause.min(MAX_RETRY_PAUSE))
}

/// Asks over a channel: the function `elect` and the guard use, or a test's.
pub type Ask = Arc<dyn Fn(Channel, ValidityQuestion) -> BoxFuture<'static, Asked> + Send + Sync>;

/// Asks over the pinned channel, on the connection this holder keeps to the replica (resuming its TLS session
/// when it must open a new one).
pub fn over_the_channel() -> Ask {
    asking_with(Caller::default())
}

/// [`over_the_channel`] through `caller` (a bench's holders, each from an address of its own as pods are).
pub fn asking_with(caller: Caller) -> Ask {
    let caller = Arc::new(caller);
    Arc::new(move |channel, question| {
        let caller = caller.clone();
        Box::pin(async move { ask(&caller, &channel, &question).await })
    })
}

async fn ask(caller: &Caller, channel: &Channel, question: &ValidityQuestion) -> Asked {
    let failed = |message: String| Asked::Failed {
        message,
        retry_after: None,
    };
    let body = match serde_json::to_vec(question) {
        Ok(body) => body,
        Err(err) => return failed(err.to_string()),
    };
    // Before the connection is opened: the answer is counted from no later than this.
    let sent_at = Instant::now();
    let posted = caller.post(&channel.url, &channel.pin, None, body);
    let answer = match tokio::time::timeout(ASK_TIMEOUT, posted).await {
        Ok(Ok(answer)) => answer,
        Ok(Err(err @ PostError::PinMismatch { .. })) => return failed(err.to_string()),
        Ok(Err(err)) => return failed(err.to_string()),
        Err(_) => return failed("no answer in time".into()),
    };
    if answer.code != 200 {
        return Asked::Failed {
            message: answer.summary(),
            retry_after: answer.retry_after,
        };
    }
    match serde_json::from_slice::<ValidityAnswer>(&answer.body) {
        Ok(ValidityAnswer {
            remaining_millis: Some(millis),
            ..
        }) => Asked::Valid {
            sent_at,
            remaining: Duration::from_millis(millis),
        },
        Ok(ValidityAnswer { unknown, .. }) => {
            Asked::Unknown(unknown.unwrap_or_else(|| "no reason given".into()))
        }
        Err(err) => failed(format!("not an answer: {err}")),
    }
}

/// What a holder stops by: its margin, the skew bound of the wall-clock path, and how it asks.
#[derive(Clone)]
pub struct Stopping {
    pub margin: Duration,
    pub max_clock_skew: Duration,
    /// The lock's namespace and name, as questions name them.
    pub namespace: String,
    pub lock: String,
    pub ask: Ask,
    /// What its log lines name as the speaker: `elect` or `guard`.
    pub tool: &'static str,
    /// The holder's wall clock, as [`HolderClock::of_this_process`] reads it.
    pub clock: HolderClock,
}

/// The holder's wall clock, read only on the wall-clock path. In the binary, the system's: test builds shift it
/// (`REDLOCK_TEST_WALL_CLOCK_OFFSET_MS`) and may turn on the negative control that trusts it even where status
/// offers a channel, as holders did before (`holders-trust-wall-clock`); a release build has neither. The product
/// checker, which plays guards in its own process, sets both per run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HolderClock {
    pub offset: k8s_openapi::jiff::SignedDuration,
    /// The negative control: status's `validUntil` on this clock, even where a channel is offered.
    pub trust_status_times: bool,
}

impl HolderClock {
    pub fn of_this_process() -> Self {
        use crate::negative_controls::{Control, active, wall_clock_offset};
        Self {
            offset: wall_clock_offset(),
            trust_status_times: active(Control::HoldersTrustWallClock),
        }
    }

    pub fn now(&self) -> Timestamp {
        let now = Timestamp::now();
        now.checked_add(self.offset).unwrap_or(now)
    }
}

impl Stopping {
    /// How this holder finds its stop time from what `lock`'s status offers ([`basis_of`]).
    pub fn basis(&self, lock: Option<&DistributedLock>) -> Basis {
        if self.clock.trust_status_times {
            return Basis::WallClock;
        }
        basis_of(lock)
    }

    /// The question about `term` of `lock` (whose uid it names).
    pub fn question(&self, lock: &DistributedLock, term: &Term) -> ValidityQuestion {
        ValidityQuestion {
            namespace: self.namespace.clone(),
            lock: self.lock.clone(),
            uid: lock.metadata.uid.clone().unwrap_or_default(),
            permit: term.permit.unwrap_or(0),
            fencing_token: term.token,
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
    use k8s_openapi::jiff::SignedDuration;

    use super::*;
    use crate::api::DistributedLockStatus;

    #[tokio::test(start_paused = true)]
    async fn an_answer_counts_from_the_question_less_drift_and_margin() {
        let sent = Instant::now();
        assert_eq!(
            stop_after_answer(sent, Duration::from_secs(10), Duration::from_secs(1)),
            sent + Duration::from_millis(8_900),
            "10 s × 0.99 − 1 s"
        );
        assert_eq!(
            stop_after_answer(sent, Duration::from_millis(900), Duration::from_secs(1)),
            sent,
            "less than the margin left: stop at once"
        );
        // Answered 3 s after it was asked (a slow replica): still counted from the question.
        let answered = sent + Duration::from_secs(3);
        let valid = Asked::Valid {
            sent_at: sent,
            remaining: Duration::from_secs(10),
        };
        let (stop, next) = after_ask(None, &valid, Duration::from_secs(1), answered);
        assert_eq!(stop, Some(sent + Duration::from_millis(8_900)));
        assert_eq!(
            next,
            answered + Duration::from_millis(2_950),
            "half of what is left"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_unknown_or_failed_ask_never_moves_the_stop_time() {
        let now = Instant::now();
        let stop = Some(now + Duration::from_secs(4));
        let margin = Duration::from_secs(1);
        for asked in [
            Asked::Unknown("NotShown".into()),
            Asked::Failed {
                message: "refused".into(),
                retry_after: None,
            },
            Asked::Failed {
                message: "too many".into(),
                retry_after: Some(Duration::from_secs(2)),
            },
        ] {
            let (kept, next) = after_ask(stop, &asked, margin, now);
            assert_eq!(kept, stop, "{asked:?}");
            assert!(next > now, "asked again later: {asked:?}");
            assert_eq!(
                after_ask(None, &asked, margin, now).0,
                None,
                "no start on {asked:?}"
            );
        }
        let (_, next) = after_ask(
            stop,
            &Asked::Failed {
                message: "too many".into(),
                retry_after: Some(Duration::from_secs(2)),
            },
            margin,
            now,
        );
        assert_eq!(next, now + Duration::from_secs(2), "as Retry-After asks");
    }

    #[tokio::test(start_paused = true)]
    async fn asks_without_an_answer_back_off_to_two_seconds() {
        let now = Instant::now();
        let refused = Asked::Failed {
            message: "refused".into(),
            retry_after: None,
        };
        let pauses: Vec<Duration> = (0..6)
            .map(|misses| after_asks(None, &refused, Duration::from_secs(1), now, misses).1 - now)
            .collect();
        assert_eq!(
            pauses,
            [250, 500, 1000, 2000, 2000, 2000].map(Duration::from_millis),
            "doubled, then capped"
        );
        assert_eq!(retry_pause(u32::MAX), Duration::from_secs(2));
        let valid = Asked::Valid {
            sent_at: now,
            remaining: Duration::from_secs(10),
        };
        assert_eq!(
            after_asks(None, &valid, Duration::from_secs(1), now, 5).1,
            now + Duration::from_millis(4_450),
            "a validity's next ask is not slowed by the misses before it"
        );
    }

    fn lock(url: Option<&str>, pin: Option<&str>) -> DistributedLock {
        let mut lock: DistributedLock = serde_json::from_value(serde_json::json!({
            "apiVersion": "redlock.io/v1beta1", "kind": "DistributedLock", "metadata": {"name": "l", "uid": "u"},
            "spec": {"holder": {"leaderElection": {"selector": {}}}}
        }))
        .unwrap();
        lock.status = Some(DistributedLockStatus {
            hand_over_url: url.map(Into::into),
            hand_over_certificate_sha256: pin.map(Into::into),
            ..DistributedLockStatus::default()
        });
        lock
    }

    #[test]
    fn the_wall_clock_is_trusted_only_where_status_offers_no_channel() {
        let pin = "ab".repeat(32);
        assert_eq!(
            basis_of(Some(&lock(Some("https://10.0.0.5:8443/v1/stopped"), Some(&pin)))),
            Basis::Ask(Channel {
                url: "https://10.0.0.5:8443/v1/validity".into(),
                pin: pin.clone()
            })
        );
        assert_eq!(
            basis_of(Some(&lock(Some("https://10.0.0.5:8443/v1/stopped"), None))),
            Basis::WallClock,
            "no pin: an older operator"
        );
        assert_eq!(
            basis_of(Some(&lock(None, Some(&pin)))),
            Basis::WallClock,
            "no URL"
        );
        assert_eq!(basis_of(None), Basis::WallClock);
        assert!(
            matches!(
                basis_of(Some(&lock(Some("not a url"), Some(&pin)))),
                Basis::Ask(_)
            ),
            "a channel that cannot be asked is still no licence to trust the wall clock"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_wall_clock_path_widens_the_margin_by_the_skew_bound() {
        let wall = Timestamp::from_second(1_000).unwrap();
        let now = Instant::now();
        let term = Term {
            permit: None,
            token: 1,
            valid_until: wall + SignedDuration::from_secs(5),
        };
        assert_eq!(
            stop_by_wall_clock(&term, Duration::from_secs(1), Duration::from_secs(1), now, wall),
            now + Duration::from_secs(3)
        );
        let _ = MicroTime(wall);
    }
}
