use std::time::Duration;

use tokio::time::Instant;

/// How much `uptime_in_seconds` may exceed a master's real uptime. Redis reports the difference of two
/// whole-second clock readings (now and its start), so a master started at 9.999 s reports 1 s of uptime at
/// 10.001 s: the real uptime is only known to be more than the reported one minus a second.
pub const UPTIME_UNCERTAINTY: Duration = Duration::from_secs(1);

/// How long after a master's quarantine (counted from its latest possible start) an acquisition it helps decide
/// waits for the other masters' counters. A master restarted without persistence forgot every key's fencing
/// counter, and learns a key's again only from a grant or repair of that key once it votes; a majority made of
/// such masters and of masters that missed the last grants could fix a token below one already granted while the
/// masters that remember are merely slow. An hour covers the keys granted often enough to matter here; past it
/// the wait would cost every acquisition the slowest master's latency for good.
pub const RECENT_RESTART: Duration = Duration::from_secs(3600);

/// Until when a master must stay out of the quorum, given the uptime `INFO server` reported.
///
/// A master that restarted without persistence forgot every lock it held, so it may only vote once every lock
/// that existed at its restart has expired: `period` (max TTL plus drift) after the restart. The restart is at
/// most `uptime - 1 s` before the reply (see [`UPTIME_UNCERTAINTY`]; the server measured its uptime before
/// `answered_at`), so the quarantine computed from that never ends early. A client that never saw the master
/// before applies the same rule, which is what makes it hold for freshly started processes too.
pub fn quarantine_until(
    answered_at: Instant,
    reported_uptime: Duration,
    period: Duration,
    assume_durable: bool,
) -> Option<Instant> {
    if assume_durable {
        return None;
    }
    let known_uptime = reported_uptime.saturating_sub(UPTIME_UNCERTAINTY);
    (known_uptime < period).then(|| answered_at + (period - known_uptime))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fresh_master_waits_out_the_period_minus_its_certain_uptime() {
        let now = Instant::now();
        let period = Duration::from_millis(60_602);
        let until = quarantine_until(now, Duration::from_secs(10), period, false);
        assert_eq!(until, Some(now + Duration::from_millis(51_602)));
    }

    #[test]
    fn a_reported_second_may_be_a_millisecond() {
        // Started at x.999, asked at (x+1).001: reports 1 s. The whole period must still be waited out.
        let now = Instant::now();
        let period = Duration::from_millis(1_012);
        assert_eq!(
            quarantine_until(now, Duration::from_secs(1), period, false),
            Some(now + period)
        );
        assert_eq!(
            quarantine_until(now, Duration::ZERO, period, false),
            Some(now + period)
        );
    }

    #[test]
    fn an_old_or_durable_master_votes_at_once() {
        let now = Instant::now();
        let period = Duration::from_secs(60);
        assert_eq!(
            quarantine_until(now, Duration::from_secs(61), period, false),
            None
        );
        assert_eq!(
            quarantine_until(now, Duration::from_secs(60), period, false),
            Some(now + Duration::from_secs(1))
        );
        assert_eq!(quarantine_until(now, Duration::ZERO, period, true), None);
    }
}
