use std::time::Duration;

use tokio::time::Instant;

/// Until when a master must stay out of the quorum, given what `INFO server` said.
///
/// A master that restarted without persistence forgot every lock it held, so it may only vote once every lock
/// that existed at its restart has expired: `period` (max TTL plus drift) after the restart. The restart time
/// is bounded by the reply: the server measured its uptime at some moment before `answered_at`, and
/// `uptime_in_seconds` is rounded down, so `answered_at - uptime` is never earlier than the real restart and
/// the quarantine never ends early. A client that never saw the master before applies the same rule, which is
/// what makes it hold for freshly started processes too.
pub fn quarantine_until(
    answered_at: Instant,
    uptime: Duration,
    period: Duration,
    assume_durable: bool,
) -> Option<Instant> {
    if assume_durable || uptime >= period {
        None
    } else {
        Some(answered_at + (period - uptime))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fresh_master_waits_out_the_period_minus_its_uptime() {
        let now = Instant::now();
        let period = Duration::from_millis(60_602);
        let until = quarantine_until(now, Duration::from_secs(10), period, false);
        assert_eq!(until, Some(now + Duration::from_millis(50_602)));
    }

    #[test]
    fn an_old_or_durable_master_votes_at_once() {
        let now = Instant::now();
        let period = Duration::from_secs(60);
        assert_eq!(
            quarantine_until(now, Duration::from_secs(60), period, false),
            None
        );
        assert_eq!(quarantine_until(now, Duration::ZERO, period, true), None);
    }
}
