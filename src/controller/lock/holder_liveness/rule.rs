//! Pure: from what is known of a grant holder's asks, whether it asks, never did, or stopped; and the condition
//! `HolderReachesOperator` the lock shows for its holders.
//!
//! `elect` asks again when half of the time to the stop time it was told has passed (less than half the TTL,
//! since no answer is more than the TTL), so a holder that asks is heard at least every half TTL; one not heard for
//! [`Bounds::between_asks`] has stopped. A holder gets [`Bounds::first_ask`] from the moment its pod runs for its
//! first ask (the watch must bring it the grant first). Only holders expected to ask are judged before they ever
//! asked: those the chart's injection wraps (labelled `redlock.io/elect` or `redlock.io/guard`); another holder
//! (a custom one, an older helper) is judged only once it has asked during its grant.

use std::time::Duration;

use tokio::time::Instant;

use super::asks::AskRecord;
use crate::api::conditions::Update;

/// The condition's type.
pub const CONDITION: &str = "HolderReachesOperator";
/// Its reason while a holder is not heard (`False`), and the Warning Event's.
pub const NOT_ASKING: &str = "HolderNotAsking";
/// Its reason while every judged holder asks (`True`), and the Normal Event's when one is heard again.
pub const ASKING: &str = "HolderAsking";

/// How long a holder may go unheard.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bounds {
    /// Between two asks of a holder that asks.
    pub between_asks: Duration,
    /// From its pod running to its first ask.
    pub first_ask: Duration,
}

impl Bounds {
    /// For a lock of `ttl`: half of it, and no less than 5 s (a loaded node or API server delays a watch event
    /// and so an ask by a few seconds); the first ask 5 s more (the pod's watch is new).
    pub fn for_ttl(ttl: Duration) -> Self {
        let between_asks = (ttl / 2).max(Duration::from_secs(5));
        Self {
            between_asks,
            first_ask: between_asks.saturating_add(Duration::from_secs(5)),
        }
    }
}

/// What a grant's holder is, to the rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grant {
    /// How status and Events name it: `the leader pod shop/web-1`, `the Job data/migrate (its pod)`.
    pub who: String,
    pub token: i64,
    /// The helper that asks for it: `elect` or `guard`.
    pub helper: &'static str,
    /// Injected by the chart (labelled), so it asks from the start.
    pub expected: bool,
}

/// A holder's asks, judged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Silence {
    /// Heard lately; judged again in `check_in` at the latest.
    Asking { check_in: Duration },
    /// Not judged yet: its pod is not running (`None`), or its first ask's grace has `Some` time left.
    Waiting { check_in: Option<Duration> },
    /// Not expected to ask and never did during this grant: not judged.
    NotExpected,
    /// Never heard during this grant, past the first ask's grace.
    NeverAsked,
    /// Heard during this grant, not for longer than the bound.
    StoppedAsking,
}

impl Silence {
    /// When the lock must be looked at again for the verdict to change by time alone.
    pub fn check_in(self) -> Option<Duration> {
        match self {
            Silence::Asking { check_in } => Some(check_in),
            Silence::Waiting { check_in } => check_in,
            Silence::NotExpected | Silence::NeverAsked | Silence::StoppedAsking => None,
        }
    }

    fn silent(self) -> bool {
        matches!(self, Silence::NeverAsked | Silence::StoppedAsking)
    }
}

/// Judges `record` at `now`.
pub fn judge(record: &AskRecord, expected: bool, bounds: Bounds, now: Instant) -> Silence {
    // Just past the bound, so that the look it asks for finds it passed.
    let after = |left: Duration| left.saturating_add(Duration::from_millis(100));
    if let Some(asked) = record.last_ask {
        let ago = now.saturating_duration_since(asked);
        return match bounds.between_asks.checked_sub(ago) {
            Some(left) => Silence::Asking {
                check_in: after(left),
            },
            None => Silence::StoppedAsking,
        };
    }
    if !expected {
        return Silence::NotExpected;
    }
    let Some(since) = record.since else {
        return Silence::Waiting { check_in: None };
    };
    match bounds.first_ask.checked_sub(now.saturating_duration_since(since)) {
        Some(left) => Silence::Waiting {
            check_in: Some(after(left)),
        },
        None => Silence::NeverAsked,
    }
}

/// Whether the holder of `record`'s grant has stopped its work for want of answers: it asked during the grant
/// (so it stops by the validities it is told), and the latest of them has ended. Leadership may then move at
/// once, as on a report of stopped work: the holder stopped on its own clock before it.
pub fn stopped_by_silence(record: &AskRecord, now: Instant) -> bool {
    record.last_ask.is_some() && record.told_until.is_some_and(|until| now >= until)
}

/// Whether the election must treat the holder of `record`'s grant as unready, though its pod is Running and
/// Ready: it stopped for want of answers ([`stopped_by_silence`]), or it is a holder that asks (`asks`: injected,
/// or seen asking before) and has never been answered during this grant past the first ask's grace, so it has
/// started no work and will not. Its key then goes at once in the first case, after the validity status showed
/// it in the second (another replica may have answered it before a failover).
pub fn unready(record: &AskRecord, asks: bool, bounds: Bounds, now: Instant) -> bool {
    stopped_by_silence(record, now) || judge(record, asks, bounds, now) == Silence::NeverAsked
}

/// How long a pod moved off for its silence is not elected again for the same lock: long enough for another
/// candidate to take the lock (it then keeps it), short enough that a lone candidate whose path came back leads
/// again. Two TTLs, and no less than 30 s.
pub fn set_aside_for(ttl: Duration) -> Duration {
    ttl.saturating_mul(2).max(Duration::from_secs(30))
}

/// When a holder that asked falls [`stopped_by_silence`] if it does not ask again: the lock is looked at then.
pub fn silence_ends_in(record: &AskRecord, now: Instant) -> Option<Duration> {
    record.last_ask?;
    let until = record.told_until?;
    (until > now).then(|| {
        until
            .saturating_duration_since(now)
            .saturating_add(Duration::from_millis(100))
    })
}

/// The condition for the judged holders of a lock; `None`: none is judged (the condition is left out). The
/// messages change only with who is silent, never with time, so a look writes nothing while nothing changed.
/// `reports_at`: the reports port's `host:port`, where holders ask.
pub fn condition(judged: &[(Grant, Silence)], reports_at: Option<&str>) -> Option<Update> {
    let silent: Vec<&(Grant, Silence)> = judged.iter().filter(|(_, silence)| silence.silent()).collect();
    if silent.is_empty() {
        return judged
            .iter()
            .any(|(_, silence)| matches!(silence, Silence::Asking { .. }))
            .then(|| {
                Update::new(
                    CONDITION,
                    true,
                    ASKING,
                    "the holder asks the active replica how long its grant stays valid, over the reports port",
                )
            });
    }
    const NAMED: usize = 3;
    let mut parts: Vec<String> = silent
        .iter()
        .take(NAMED)
        .map(|(grant, silence)| match silence {
            Silence::StoppedAsking => format!(
                "{} (fencing token {}) has stopped asking the operator how long its grant stays valid: its redlock-operator {} stops the work on its own clock before the validity it was told ends",
                grant.who, grant.token, grant.helper
            ),
            _ => format!(
                "{} (fencing token {}) has not asked the operator how long its grant stays valid, so its redlock-operator {} has started no work",
                grant.who, grant.token, grant.helper
            ),
        })
        .collect();
    if silent.len() > NAMED {
        parts.push(format!("and {} more holders", silent.len() - NAMED));
    }
    let port = reports_at
        .and_then(|at| at.rsplit_once(':'))
        .map_or("the reports port", |(_, port)| port);
    let fix = match reports_at {
        Some(at) => format!(
            "it cannot reach the active replica at {at} (status.handOverUrl): let the holder's pods reach the operator's pods on TCP port {port} (a NetworkPolicy egress rule: docs/how-to/install.md#networkpolicies), or look for a pod cut off from the network"
        ),
        None => "it cannot reach the active replica's reports port (status.handOverUrl)".to_owned(),
    };
    Some(Update::new(
        CONDITION,
        false,
        NOT_ASKING,
        format!("{}; {fix}", parts.join("; ")),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    const BOUNDS: Bounds = Bounds {
        between_asks: Duration::from_secs(5),
        first_ask: Duration::from_secs(10),
    };

    fn record(since: Option<u64>, last_ask: Option<u64>, start: Instant) -> AskRecord {
        AskRecord {
            token: 4,
            term: 1,
            since: since.map(|at| start + Duration::from_secs(at)),
            last_ask: last_ask.map(|at| start + Duration::from_secs(at)),
            told_until: last_ask.map(|at| start + Duration::from_secs(at + 8)),
        }
    }

    #[test]
    fn a_holder_that_asks_and_is_never_answered_is_unready_after_the_grace_and_one_that_went_silent_too() {
        let start = Instant::now();
        let never = record(Some(0), None, start);
        assert!(!unready(&never, true, BOUNDS, start + Duration::from_secs(10)));
        assert!(unready(&never, true, BOUNDS, start + Duration::from_secs(11)));
        assert!(
            !unready(&never, false, BOUNDS, start + Duration::from_secs(600)),
            "a custom holder is left as it is"
        );
        let silent = record(Some(0), Some(10), start);
        assert!(!unready(&silent, false, BOUNDS, start + Duration::from_secs(17)));
        assert!(unready(&silent, false, BOUNDS, start + Duration::from_secs(18)));
        assert_eq!(set_aside_for(Duration::from_secs(10)), Duration::from_secs(30));
        assert_eq!(set_aside_for(Duration::from_secs(60)), Duration::from_secs(120));
    }

    #[test]
    fn a_holder_that_asked_has_stopped_once_the_validity_told_to_it_has_ended() {
        let start = Instant::now();
        let asked = record(Some(0), Some(10), start);
        let before = start + Duration::from_secs(17);
        assert!(!stopped_by_silence(&asked, before));
        assert_eq!(
            silence_ends_in(&asked, before),
            Some(Duration::from_millis(1_100))
        );
        let after = start + Duration::from_secs(18);
        assert!(
            stopped_by_silence(&asked, after),
            "told until 18 s: stopped by then"
        );
        assert_eq!(silence_ends_in(&asked, after), None);
        let never = record(Some(0), None, start);
        assert!(
            !stopped_by_silence(&never, start + Duration::from_secs(600)),
            "a holder that never asked may stop by status: its silence proves nothing"
        );
        assert_eq!(silence_ends_in(&never, start), None);
    }

    fn grant(expected: bool) -> Grant {
        Grant {
            who: "the leader pod shop/web-1".into(),
            token: 4,
            helper: "elect",
            expected,
        }
    }

    #[test]
    fn the_bounds_are_half_a_ttl_and_never_under_five_seconds() {
        assert_eq!(Bounds::for_ttl(Duration::from_secs(10)), BOUNDS);
        let long = Bounds::for_ttl(Duration::from_secs(60));
        assert_eq!(long.between_asks, Duration::from_secs(30));
        assert_eq!(long.first_ask, Duration::from_secs(35));
    }

    #[test]
    fn a_holder_heard_lately_asks_and_is_looked_at_again_when_it_would_be_late() {
        let start = Instant::now();
        let now = start + Duration::from_secs(12);
        let seen = judge(&record(Some(0), Some(10), start), true, BOUNDS, now);
        assert_eq!(
            seen,
            Silence::Asking {
                check_in: Duration::from_millis(3_100)
            }
        );
        // Exactly at the bound it still asks; past it, it stopped.
        let at_bound = start + Duration::from_secs(15);
        assert!(matches!(
            judge(&record(Some(0), Some(10), start), true, BOUNDS, at_bound),
            Silence::Asking { .. }
        ));
        let past = at_bound + Duration::from_millis(1);
        assert_eq!(
            judge(&record(Some(0), Some(10), start), false, BOUNDS, past),
            Silence::StoppedAsking,
            "a holder that asked is judged whether or not it was expected to"
        );
    }

    #[test]
    fn a_new_holder_gets_the_first_asks_grace_from_when_its_pod_runs() {
        let start = Instant::now();
        let not_running = judge(
            &record(None, None, start),
            true,
            BOUNDS,
            start + Duration::from_secs(60),
        );
        assert_eq!(not_running, Silence::Waiting { check_in: None });
        let early = judge(
            &record(Some(0), None, start),
            true,
            BOUNDS,
            start + Duration::from_secs(4),
        );
        assert_eq!(
            early,
            Silence::Waiting {
                check_in: Some(Duration::from_millis(6_100))
            }
        );
        let late = judge(
            &record(Some(0), None, start),
            true,
            BOUNDS,
            start + Duration::from_secs(11),
        );
        assert_eq!(late, Silence::NeverAsked);
        let custom = judge(
            &record(Some(0), None, start),
            false,
            BOUNDS,
            start + Duration::from_secs(60),
        );
        assert_eq!(
            custom,
            Silence::NotExpected,
            "a custom holder that never asks is left as it is"
        );
    }

    #[test]
    fn the_condition_names_the_silent_holders_and_the_fix_and_does_not_change_with_time() {
        let asking = Silence::Asking {
            check_in: Duration::from_secs(1),
        };
        let yes = condition(&[(grant(true), asking)], Some("10.0.0.5:8443")).unwrap();
        assert!(yes.status);
        assert_eq!(yes.reason, ASKING);
        let again = condition(
            &[(
                grant(true),
                Silence::Asking {
                    check_in: Duration::from_secs(4),
                },
            )],
            Some("10.0.0.5:8443"),
        );
        assert_eq!(again.as_ref(), Some(&yes), "no write while nothing changed");

        let no = condition(&[(grant(true), Silence::NeverAsked)], Some("10.0.0.5:8443")).unwrap();
        assert!(!no.status);
        assert_eq!(no.reason, NOT_ASKING);
        for part in [
            "the leader pod shop/web-1 (fencing token 4) has not asked",
            "has started no work",
            "10.0.0.5:8443",
            "TCP port 8443",
            "NetworkPolicy egress rule",
        ] {
            assert!(no.message.contains(part), "{part:?} missing from {}", no.message);
        }
        let stopped = condition(&[(grant(true), Silence::StoppedAsking)], None).unwrap();
        assert!(stopped.message.contains("has stopped asking"));
        assert!(stopped.message.contains("stops the work on its own clock"));

        let many: Vec<(Grant, Silence)> = (0..5).map(|_| (grant(true), Silence::NeverAsked)).collect();
        assert!(
            condition(&many, None)
                .unwrap()
                .message
                .contains("and 2 more holders")
        );
    }

    #[test]
    fn no_condition_while_nobody_is_judged() {
        assert_eq!(condition(&[], None), None);
        assert_eq!(
            condition(
                &[
                    (grant(false), Silence::NotExpected),
                    (grant(true), Silence::Waiting { check_in: None })
                ],
                None
            ),
            None
        );
    }
}
