//! One active replica, chosen with a `coordination.k8s.io` Lease.
//!
//! Written here rather than taken from kube-lease-manager because the operator needs one thing those crates do
//! not give: a gate that every Redis and API write checks synchronously at the moment of the call
//! ([`Leadership::is_leader`]), backed by a deadline on this process's monotonic clock that always ends
//! *before* a standby may take over. Like client-go, a standby judges expiry by how long it has itself seen
//! the Lease unchanged, never by comparing its wall clock with the holder's `renewTime`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{ObjectMeta, PostParams};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

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
    /// Short enough that a standby resumes 10 s locks before they lapse (see the README's HA section).
    pub fn for_lease_duration(lease_duration: Duration) -> Self {
        Self {
            lease_duration,
            renew_deadline: lease_duration.mul_f64(0.7),
            retry_period: lease_duration / 4,
        }
    }
}

/// Whether this replica may write, right now.
pub struct Leadership {
    base: Instant,
    /// Milliseconds after `base` until which this replica may write; 0 = not leader.
    deadline_ms: AtomicU64,
    changes: watch::Sender<bool>,
}

impl Leadership {
    fn new() -> Arc<Self> {
        let (changes, _) = watch::channel(false);
        Arc::new(Self {
            base: Instant::now(),
            deadline_ms: AtomicU64::new(0),
            changes,
        })
    }

    /// For a single replica with no Lease (tests, `--no-leader-election`): always leader.
    pub fn always() -> Arc<Self> {
        let leadership = Self::new();
        leadership.deadline_ms.store(u64::MAX, Ordering::SeqCst);
        leadership.changes.send_replace(true);
        leadership
    }

    pub fn is_leader(&self) -> bool {
        let deadline = self.deadline_ms.load(Ordering::SeqCst);
        deadline != 0 && self.millis(Instant::now()) < deadline
    }

    /// Becomes true when this replica becomes the leader, false when it stops.
    pub fn subscribe(&self) -> watch::Receiver<bool> {
        self.changes.subscribe()
    }

    fn millis(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.base).as_millis()).unwrap_or(u64::MAX)
    }

    fn extend_until(&self, until: Instant) {
        let lapsed = !self.is_leader();
        self.deadline_ms
            .store(self.millis(until).max(1), Ordering::SeqCst);
        if lapsed {
            // Always an edge, even when the lapse was never published: whoever resumes locks on becoming the
            // leader must hear of every new term.
            tracing::debug!("leadership (re)gained");
            self.changes.send_replace(true);
        }
    }

    fn step_down(&self) {
        self.deadline_ms.store(0, Ordering::SeqCst);
        self.changes
            .send_if_modified(|leader| std::mem::replace(leader, false));
    }

    /// Publishes a lapse noticed by the clock alone (the renewal loop may be stuck on a slow API server).
    fn refresh(&self) {
        let leader = self.is_leader();
        self.changes
            .send_if_modified(|current| std::mem::replace(current, leader) != leader);
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

pub struct Elector {
    api: Api<Lease>,
    name: String,
    identity: String,
    timing: LeaseTiming,
    leadership: Arc<Leadership>,
    observed: Option<Observed>,
}

impl Elector {
    pub fn new(api: Api<Lease>, name: &str, identity: &str, timing: LeaseTiming) -> (Self, Arc<Leadership>) {
        let leadership = Leadership::new();
        let elector = Self {
            api,
            name: name.to_owned(),
            identity: identity.to_owned(),
            timing,
            leadership: leadership.clone(),
            observed: None,
        };
        (elector, leadership)
    }

    /// Campaigns and renews until `shutdown`; then, if leader, stops writing first and hands the Lease back so a
    /// standby takes over at once instead of after the lease duration.
    pub async fn run(mut self, shutdown: CancellationToken) {
        loop {
            let attempt_started = Instant::now();
            match tokio::time::timeout(self.timing.renew_deadline, self.try_once(attempt_started)).await {
                Ok(Ok(())) => {}
                Ok(Err(err)) => {
                    tracing::warn!(lease = %self.name, error = %err, "leader election attempt failed")
                }
                Err(_) => tracing::warn!(lease = %self.name, "leader election attempt timed out"),
            }
            self.leadership.refresh();
            tokio::select! {
                () = shutdown.cancelled() => break,
                () = tokio::time::sleep(self.timing.retry_period) => {}
            }
        }
        self.release().await;
    }

    async fn try_once(&mut self, attempt_started: Instant) -> Result<(), kube::Error> {
        let current = self.api.get_opt(&self.name).await?;
        let now = Instant::now();
        self.observe(current.as_ref(), now);
        let action = elect_step(self.observed.as_ref(), &self.identity, now, &self.timing);
        let written = match (action, current) {
            (ElectAction::Wait, _) => {
                if self.leadership.is_leader() {
                    tracing::warn!(lease = %self.name, "another replica holds the lease: stepping down");
                }
                self.leadership.step_down();
                return Ok(());
            }
            (ElectAction::Create, _) | (_, None) => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.name.clone()),
                        ..ObjectMeta::default()
                    },
                    spec: Some(self.spec(None, 0)),
                };
                self.api.create(&PostParams::default(), &lease).await
            }
            (ElectAction::Renew | ElectAction::TakeOver, Some(mut lease)) => {
                let previous = lease.spec.take().unwrap_or_default();
                let taking_over = action == ElectAction::TakeOver;
                let transitions = previous.lease_transitions.unwrap_or(0) + i32::from(taking_over);
                let acquired = if taking_over { None } else { previous.acquire_time };
                lease.spec = Some(self.spec(acquired, transitions));
                // Carries the resourceVersion read above: a concurrent writer makes this fail with 409.
                self.api.replace(&self.name, &PostParams::default(), &lease).await
            }
        };
        match written {
            Ok(lease) => {
                if !self.leadership.is_leader() {
                    tracing::info!(lease = %self.name, identity = %self.identity, "became the active replica");
                }
                self.leadership
                    .extend_until(attempt_started + self.timing.renew_deadline);
                self.observe(Some(&lease), Instant::now());
                Ok(())
            }
            Err(kube::Error::Api(status)) if status.code == 409 => {
                // Someone else wrote first; what they wrote is read on the next round.
                Ok(())
            }
            Err(err) => Err(err),
        }
    }

    fn spec(&self, acquired: Option<MicroTime>, transitions: i32) -> LeaseSpec {
        let now = MicroTime(Timestamp::now());
        LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: Some(
                i32::try_from(self.timing.lease_duration.as_secs().max(1)).unwrap_or(i32::MAX),
            ),
            acquire_time: Some(acquired.unwrap_or_else(|| now.clone())),
            renew_time: Some(now),
            lease_transitions: Some(transitions),
            ..LeaseSpec::default()
        }
    }

    fn observe(&mut self, lease: Option<&Lease>, now: Instant) {
        let Some(lease) = lease else {
            self.observed = None;
            return;
        };
        let holder = lease.spec.as_ref().and_then(|spec| spec.holder_identity.clone());
        let resource_version = lease.metadata.resource_version.clone();
        let unchanged = self
            .observed
            .as_ref()
            .is_some_and(|seen| seen.holder == holder && seen.resource_version == resource_version);
        if !unchanged {
            self.observed = Some(Observed {
                holder,
                resource_version,
                since: now,
            });
        }
    }

    async fn release(&mut self) {
        if !self.leadership.is_leader() {
            return;
        }
        self.leadership.step_down();
        let Ok(Some(mut lease)) = self.api.get_opt(&self.name).await else {
            return;
        };
        let ours = lease
            .spec
            .as_ref()
            .and_then(|spec| spec.holder_identity.as_deref())
            .is_some_and(|holder| holder == self.identity);
        if !ours {
            return;
        }
        if let Some(spec) = lease.spec.as_mut() {
            spec.holder_identity = None;
            spec.lease_duration_seconds = Some(1);
        }
        match self.api.replace(&self.name, &PostParams::default(), &lease).await {
            Ok(_) => tracing::info!(lease = %self.name, "handed the lease back"),
            Err(err) => {
                tracing::warn!(lease = %self.name, error = %err, "could not hand the lease back; a standby takes over when it expires")
            }
        }
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

    #[tokio::test(start_paused = true)]
    async fn leadership_lapses_by_the_clock_alone() {
        let leadership = Leadership::new();
        assert!(!leadership.is_leader());
        leadership.extend_until(Instant::now() + Duration::from_secs(3));
        assert!(leadership.is_leader());
        tokio::time::advance(Duration::from_secs(3)).await;
        assert!(
            !leadership.is_leader(),
            "no renewal: no writes, without waiting for any task"
        );
        assert!(Leadership::always().is_leader());
    }
}
