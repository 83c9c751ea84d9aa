//! The pure election rule and the timing it follows. Like client-go, a standby judges expiry by how long it has
//! itself seen the Lease unchanged, never by comparing its wall clock with the holder's `renewTime`.

use std::time::Duration;

use tokio::time::Instant;

/// How the Lease is held.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseTiming {
    /// A standby takes over after seeing the Lease unchanged this long.
    pub lease_duration: Duration,
    /// The holder stops acting this long after the start of its last successful renewal; shorter than
    /// `lease_duration`, so it has stopped before anyone else can start.
    pub renew_deadline: Duration,
    /// Pause between renewals (holder) and checks (standby).
    pub retry_period: Duration,
}

impl LeaseTiming {
    /// Short enough that a standby resumes 10 s locks before they lapse (docs/explanation/guarantees-and-limits.md: failover).
    pub fn for_lease_duration(lease_duration: Duration) -> Self {
        Self {
            lease_duration,
            renew_deadline: lease_duration.mul_f64(0.7),
            retry_period: lease_duration / 4,
        }
    }
}

/// What a replica knows about the Lease record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Observed {
    pub holder: Option<String>,
    pub resource_version: Option<String>,
    /// When this replica first saw the record in this exact form (its own monotonic clock).
    pub since: Instant,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ElectAction {
    Create,
    Renew,
    TakeOver,
    Wait,
}

/// The pure election rule.
pub fn elect_step(
    observed: Option<&Observed>,
    identity: &str,
    now: Instant,
    timing: &LeaseTiming,
) -> ElectAction {
    match observed {
        None => ElectAction::Create,
        Some(record) => match record.holder.as_deref() {
            Some(holder) if holder == identity => ElectAction::Renew,
            None | Some("") => ElectAction::TakeOver,
            Some(_) if now.saturating_duration_since(record.since) >= timing.lease_duration => {
                ElectAction::TakeOver
            }
            Some(_) => ElectAction::Wait,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timing() -> LeaseTiming {
        LeaseTiming::for_lease_duration(Duration::from_secs(4))
    }

    #[test]
    fn the_holder_stops_before_a_standby_may_start() {
        let timing = timing();
        assert!(timing.renew_deadline < timing.lease_duration);
        assert!(timing.retry_period < timing.renew_deadline);
    }

    #[test]
    fn standby_waits_for_a_full_lease_duration_of_silence() {
        let start = Instant::now();
        let record = Observed {
            holder: Some("a".into()),
            resource_version: Some("7".into()),
            since: start,
        };
        let timing = timing();
        assert_eq!(
            elect_step(Some(&record), "b", start + Duration::from_secs(3), &timing),
            ElectAction::Wait
        );
        assert_eq!(
            elect_step(Some(&record), "b", start + Duration::from_secs(4), &timing),
            ElectAction::TakeOver
        );
        assert_eq!(elect_step(Some(&record), "a", start, &timing), ElectAction::Renew);
        assert_eq!(elect_step(None, "b", start, &timing), ElectAction::Create);
        let released = Observed {
            holder: None,
            ..record
        };
        assert_eq!(
            elect_step(Some(&released), "b", start, &timing),
            ElectAction::TakeOver
        );
    }
}
