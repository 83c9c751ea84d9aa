//! When a kept lock is extended and when its owner is told it is lost: pure functions of the clock.

use std::time::Duration;

use tokio::time::Instant;

/// How a [`super::KeptLock`] keeps its lease alive.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct KeepPolicy {
    /// Extend once this fraction of the granted validity has passed. The default, 1/3, leaves two thirds of the
    /// validity for retries, well inside "at the latest when half is left".
    pub extend_after: f64,
    /// Pause between attempts after a failed extension.
    pub retry_interval: Duration,
    /// The owner is told the lock is lost this long before its validity ends, so it can stop acting on it in
    /// time (the `lock` command uses it for SIGTERM, then SIGKILL half-way).
    pub fence_margin: Duration,
}

/// The shortest TTL a lock may have on masters given `node_timeout` per command. The default fence margin is at
/// least three node timeouts and must stay under a third of the TTL, when the first extension is planned;
/// otherwise the owner is told the lock is lost before anything could extend it, and the lock flaps.
pub fn shortest_ttl(node_timeout: Duration) -> Duration {
    node_timeout.saturating_mul(SHORTEST_TTL_IN_NODE_TIMEOUTS)
}

/// Nine node timeouts, rounded up.
const SHORTEST_TTL_IN_NODE_TIMEOUTS: u32 = 10;

impl KeepPolicy {
    /// Defaults scaled to the lock's TTL: a margin of a fifth of the TTL (at least three per-node timeouts, at
    /// most 5 s) and retries every twentieth of the TTL (at least two per-node timeouts, at most 1 s).
    pub fn for_ttl(ttl: Duration, node_timeout: Duration) -> Self {
        let clamp = |value: Duration, low: Duration, high: Duration| value.max(low).min(high.max(low));
        Self {
            extend_after: 1.0 / 3.0,
            retry_interval: clamp(ttl / 20, node_timeout * 2, Duration::from_secs(1)),
            fence_margin: clamp(ttl / 5, node_timeout * 3, Duration::from_secs(5)),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeepAction {
    /// Wait until then, then try to extend (unless the fence time comes first).
    ExtendAt(Instant),
    /// The fence time has come: tell the owner now.
    SignalLost,
}

/// `validity` is what the last grant gave, `valid_until` when it ends; `retrying` after a failed extension.
pub fn next_keep_action(
    now: Instant,
    valid_until: Instant,
    validity: Duration,
    retrying: bool,
    policy: &KeepPolicy,
) -> KeepAction {
    let fence_at = fence_time(valid_until, policy);
    if now >= fence_at {
        return KeepAction::SignalLost;
    }
    let planned = if retrying {
        now + policy.retry_interval
    } else {
        let granted_at = valid_until.checked_sub(validity).unwrap_or(now);
        let after_fraction = granted_at + validity.mul_f64(policy.extend_after.clamp(0.0, 1.0));
        // A fence margin of more than two thirds of the validity would put the first attempt at the fence time
        // itself, where the loss is signalled before anything is tried: attempt half-way to it at the latest, so
        // that the other half is left for retries.
        let half_way_to_fence = granted_at + fence_at.saturating_duration_since(granted_at) / 2;
        after_fraction.min(half_way_to_fence)
    };
    KeepAction::ExtendAt(planned.max(now).min(fence_at))
}

pub(crate) fn fence_time(valid_until: Instant, policy: &KeepPolicy) -> Instant {
    valid_until
        .checked_sub(policy.fence_margin)
        .unwrap_or(valid_until)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_shortest_ttl_leaves_room_for_the_fence_margin() {
        for node_timeout in [
            Duration::from_millis(1),
            Duration::from_millis(50),
            Duration::from_secs(10),
        ] {
            let ttl = shortest_ttl(node_timeout);
            let policy = KeepPolicy::for_ttl(ttl, node_timeout);
            assert!(policy.fence_margin < ttl / 3, "{node_timeout:?}: {policy:?}");
        }
        assert_eq!(shortest_ttl(Duration::MAX), Duration::MAX, "saturates");
    }

    use super::*;

    fn policy() -> KeepPolicy {
        KeepPolicy::for_ttl(Duration::from_secs(10), Duration::from_millis(50))
    }

    #[test]
    fn defaults_scale_with_the_ttl() {
        let policy = policy();
        assert_eq!(policy.fence_margin, Duration::from_secs(2));
        assert_eq!(policy.retry_interval, Duration::from_millis(500));
        let tiny = KeepPolicy::for_ttl(Duration::from_millis(100), Duration::from_millis(50));
        assert_eq!(tiny.fence_margin, Duration::from_millis(150));
        assert_eq!(tiny.retry_interval, Duration::from_millis(100));
    }

    #[test]
    fn extends_after_a_third_of_the_validity() {
        let start = Instant::now();
        let validity = Duration::from_millis(9_900);
        let action = next_keep_action(start, start + validity, validity, false, &policy());
        assert_eq!(action, KeepAction::ExtendAt(start + Duration::from_millis(3_300)));
    }

    #[test]
    fn a_wide_fence_margin_brings_the_first_attempt_forward_to_half_way_to_the_fence() {
        let start = Instant::now();
        let validity = Duration::from_secs(6);
        let wide = KeepPolicy {
            fence_margin: Duration::from_secs(4),
            ..KeepPolicy::for_ttl(validity, Duration::from_millis(50))
        };
        assert_eq!(
            next_keep_action(start, start + validity, validity, false, &wide),
            KeepAction::ExtendAt(start + Duration::from_secs(1)),
            "the fence is 2 s after the grant: tried at 1 s, retried until 2 s"
        );
    }

    #[test]
    fn retries_quickly_but_never_past_the_fence_time() {
        let start = Instant::now();
        let validity = Duration::from_millis(9_900);
        let valid_until = start + validity;
        let now = start + Duration::from_secs(4);
        let action = next_keep_action(now, valid_until, validity, true, &policy());
        assert_eq!(action, KeepAction::ExtendAt(now + Duration::from_millis(500)));
        let late = valid_until - Duration::from_millis(2_200);
        let action = next_keep_action(late, valid_until, validity, true, &policy());
        assert_eq!(action, KeepAction::ExtendAt(valid_until - Duration::from_secs(2)));
    }

    #[test]
    fn signals_loss_at_the_fence_time_not_at_expiry() {
        let start = Instant::now();
        let validity = Duration::from_millis(9_900);
        let valid_until = start + validity;
        let fence = valid_until - Duration::from_secs(2);
        assert_eq!(
            next_keep_action(fence, valid_until, validity, true, &policy()),
            KeepAction::SignalLost
        );
        assert_eq!(
            next_keep_action(
                valid_until + Duration::from_secs(1),
                valid_until,
                validity,
                false,
                &policy()
            ),
            KeepAction::SignalLost,
            "a holder that wakes up after its validity learns at once that it is lost"
        );
    }
}
