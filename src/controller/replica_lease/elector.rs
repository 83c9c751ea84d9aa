//! Campaigns for and renews the `coordination.k8s.io` Lease, opening and closing the gate.

use std::sync::Arc;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{ObjectMeta, PostParams};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::gate::Leadership;
use super::rule::{ElectAction, LeaseTiming, Observed, elect_step};
use crate::controller::error::is_conflict;

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
            let succeeded = match tokio::time::timeout(
                self.timing.renew_deadline,
                self.try_once(attempt_started),
            )
            .await
            {
                Ok(Ok(())) => true,
                Ok(Err(err)) => {
                    tracing::warn!(lease = %self.name, error = %err, "leader election attempt failed");
                    false
                }
                Err(_) => {
                    tracing::warn!(lease = %self.name, "leader election attempt timed out");
                    false
                }
            };
            self.leadership.refresh();
            // A replica that lost sight of its Lease while still extending its locks asks again sooner: the
            // moment the API server answers, it renews and writes every lock's status afresh.
            let pause = if !succeeded && self.leadership.is_unconfirmed() {
                self.timing.retry_period / 4
            } else {
                self.timing.retry_period
            };
            tokio::select! {
                () = shutdown.cancelled() => break,
                () = tokio::time::sleep(pause) => {}
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
                // Anyone who may write the Lease can set this counter: it saturates rather than overflow.
                let transitions = previous
                    .lease_transitions
                    .unwrap_or(0)
                    .saturating_add(i32::from(taking_over));
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
            Err(err) if is_conflict(&err) => {
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
