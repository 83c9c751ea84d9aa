//! Prometheus metrics of the controller, served on `/metrics`.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Mutex, PoisonError};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::redlock::quorum_of;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    /// `acquired`, `contended`, `unavailable` or `error`.
    pub outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MasterLabels {
    pub quorum: String,
    pub endpoint: String,
    /// `up`, `quarantined` or `down`; the gauge is 1 for the current state, 0 for the others.
    pub state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct QuorumLabels {
    pub quorum: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReconcileErrorLabels {
    /// `distributedlock` or `redisquorum`.
    pub resource: String,
    /// What failed: `kube_api`, `conflict`, `finalizer`, `lock_value` or `encode`.
    pub error: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReportLabels {
    /// `taken`, or why it was refused (`NotGivenUp`, `StillShown`, `NotTheHolder`, `NotThePod`, `Unauthorized`,
    /// `NotActive`, ...).
    pub outcome: String,
}

/// The values of `LocalRefusalLabels::reason`.
pub const LOCAL_REFUSAL_REASONS: [&str; 8] = [
    "not_a_jwt",
    "wrong_audience",
    "expired",
    "not_yet_valid",
    "not_pod_bound",
    "refused_lately",
    "reviews_in_flight",
    "review_rate",
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LocalRefusalLabels {
    /// Why a report was refused without a TokenReview: the token cannot be one (`not_a_jwt`, `wrong_audience`,
    /// `expired`, `not_yet_valid`, `not_pod_bound`), the API server refused it lately (`refused_lately`), or
    /// reviews are at their bound (`reviews_in_flight`, `review_rate`).
    pub reason: String,
}

/// The values of `MasterLabels::state`.
const MASTER_STATES: [&str; 3] = ["up", "quarantined", "down"];

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

pub struct Metrics {
    registry: Registry,
    pub acquire_seconds: HistogramFamily<OutcomeLabels>,
    pub extend_batch_seconds: Histogram,
    pub extend_lag_seconds: Histogram,
    pub extensions: Counter,
    pub locks_held: Gauge,
    pub locks_lost: Counter,
    /// How much of a lost lock's validity was left when its holder's fence was written.
    pub fence_validity_left_seconds: Histogram,
    /// Locks left alone because another installation keeps them, each counted once per process.
    pub foreign_locks: Counter,
    pub master_state: Family<MasterLabels, Gauge>,
    pub quorum_masters_configured: Family<QuorumLabels, Gauge>,
    pub quorum_masters_eligible: Family<QuorumLabels, Gauge>,
    pub quorum_masters_required: Family<QuorumLabels, Gauge>,
    pub reconcile_errors: Family<ReconcileErrorLabels, Counter>,
    pub leader: Gauge,
    pub leader_elected: Counter,
    /// Holders' reports that their work stopped, by outcome.
    pub stopped_reports: Family<ReportLabels, Counter>,
    /// Reports refused before any API call, by reason.
    pub stopped_reports_refused_locally: Family<LocalRefusalLabels, Counter>,
    /// The endpoints each quorum's `master_state` series were set for, so that a deleted quorum's series can be
    /// removed (a `Family` cannot list its label sets).
    master_endpoints: Mutex<HashMap<String, BTreeSet<String>>>,
}

fn latency_histogram() -> Histogram {
    // 100 µs to ~3.3 s.
    Histogram::new(exponential_buckets(0.0001, 2.0, 16))
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("redlock");
        let acquire_seconds: HistogramFamily<OutcomeLabels> = Family::new_with_constructor(latency_histogram);
        let extend_batch_seconds = latency_histogram();
        let extend_lag_seconds = latency_histogram();
        let extensions = Counter::default();
        let locks_held = Gauge::default();
        let locks_lost = Counter::default();
        // 0 counts the fences written after the validity ended; the fence margin is a fifth of the TTL by default.
        let fence_validity_left_seconds =
            Histogram::new([0.0, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0]);
        let foreign_locks = Counter::default();
        let master_state = Family::<MasterLabels, Gauge>::default();
        let quorum_masters_configured = Family::<QuorumLabels, Gauge>::default();
        let quorum_masters_eligible = Family::<QuorumLabels, Gauge>::default();
        let quorum_masters_required = Family::<QuorumLabels, Gauge>::default();
        let reconcile_errors = Family::<ReconcileErrorLabels, Counter>::default();
        let leader = Gauge::default();
        let leader_elected = Counter::default();
        let stopped_reports = Family::<ReportLabels, Counter>::default();
        let stopped_reports_refused_locally = Family::<LocalRefusalLabels, Counter>::default();
        registry.register(
            "acquire_duration_seconds",
            "Time of one Redlock acquisition attempt, by outcome",
            acquire_seconds.clone(),
        );
        registry.register(
            "extend_batch_duration_seconds",
            "Time of one batched extension round (one pipeline per master)",
            extend_batch_seconds.clone(),
        );
        registry.register(
            "extend_lag_seconds",
            "How late extensions started against their schedule",
            extend_lag_seconds.clone(),
        );
        registry.register(
            "extensions",
            "Lock extensions that reached a majority",
            extensions.clone(),
        );
        registry.register("locks_held", "Locks this replica holds now", locks_held.clone());
        registry.register(
            "locks_lost",
            "Locks that could not be extended in time or were taken over",
            locks_lost.clone(),
        );
        registry.register(
            "fence_validity_left_seconds",
            "How much of a lost lock's validity was left when the operator's fence of its holder was written (its Job suspended, its leader label removed); 0 when it was written after the validity ended. Holders that run under elect or guard stop on their own clock, margin before the validity they were shown ends",
            fence_validity_left_seconds.clone(),
        );
        registry.register(
            "foreign_locks",
            "Locks this installation leaves alone because another installation keeps them (each counted once per process)",
            foreign_locks.clone(),
        );
        registry.register(
            "master_state",
            "State of each Redis master (1 for the current state)",
            master_state.clone(),
        );
        registry.register(
            "quorum_masters_configured",
            "Masters each quorum names (its endpoints)",
            quorum_masters_configured.clone(),
        );
        registry.register(
            "quorum_masters_eligible",
            "Masters of each quorum that can vote now (up and not quarantined)",
            quorum_masters_eligible.clone(),
        );
        registry.register(
            "quorum_masters_required",
            "Votes each quorum needs: a majority of its configured masters",
            quorum_masters_required.clone(),
        );
        registry.register(
            "reconcile_errors",
            "Reconciliations that failed and were retried with backoff",
            reconcile_errors.clone(),
        );
        registry.register("leader", "1 while this replica is the active one", leader.clone());
        registry.register(
            "leader_elected",
            "Times this replica became the active one",
            leader_elected.clone(),
        );
        registry.register(
            "stopped_reports",
            "Reports from elect or the Job guard that a holder's work stopped under a given-up grant, by outcome (taken: its key released at once)",
            stopped_reports.clone(),
        );
        registry.register(
            "stopped_reports_refused_locally",
            "Reports of stopped work refused without asking the API server (no TokenReview, no read), by reason",
            stopped_reports_refused_locally.clone(),
        );
        // Present at zero from the start, so that the dashboard shows no reports rather than no data.
        stopped_reports
            .get_or_create(&ReportLabels {
                outcome: "taken".to_owned(),
            })
            .inc_by(0);
        for reason in LOCAL_REFUSAL_REASONS {
            stopped_reports_refused_locally
                .get_or_create(&LocalRefusalLabels {
                    reason: reason.to_owned(),
                })
                .inc_by(0);
        }
        // Present at zero from the start, so that alerts on their rate work before the first error.
        for resource in ["distributedlock", "redisquorum"] {
            reconcile_errors
                .get_or_create(&ReconcileErrorLabels {
                    resource: resource.to_owned(),
                    error: "kube_api".to_owned(),
                })
                .inc_by(0);
        }
        Self {
            registry,
            acquire_seconds,
            extend_batch_seconds,
            extend_lag_seconds,
            extensions,
            locks_held,
            locks_lost,
            fence_validity_left_seconds,
            foreign_locks,
            master_state,
            quorum_masters_configured,
            quorum_masters_eligible,
            quorum_masters_required,
            reconcile_errors,
            leader,
            leader_elected,
            stopped_reports,
            stopped_reports_refused_locally,
            master_endpoints: Mutex::default(),
        }
    }
}

impl Metrics {
    pub fn encode(&self) -> String {
        let mut text = String::new();
        if let Err(err) = prometheus_client::encoding::text::encode(&mut text, &self.registry) {
            tracing::warn!(error = %err, "cannot encode metrics");
        }
        text
    }

    pub fn set_master_state(&self, quorum: &str, endpoint: &str, current: &str) {
        self.master_endpoints
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(quorum.to_owned())
            .or_default()
            .insert(endpoint.to_owned());
        for state in MASTER_STATES {
            let labels = MasterLabels {
                quorum: quorum.to_owned(),
                endpoint: endpoint.to_owned(),
                state: state.to_owned(),
            };
            self.master_state
                .get_or_create(&labels)
                .set(i64::from(state == current));
        }
    }

    /// The quorum's configured, eligible and required masters (the majority of the configured ones, as the
    /// engine counts it), set on every health check and when the quorum cannot be used at all (eligible 0).
    pub fn set_quorum_masters(&self, quorum: &str, configured: usize, eligible: i32) {
        let labels = QuorumLabels {
            quorum: quorum.to_owned(),
        };
        let gauge = |count: usize| i64::try_from(count).unwrap_or(i64::MAX);
        self.quorum_masters_configured
            .get_or_create(&labels)
            .set(gauge(configured));
        self.quorum_masters_eligible
            .get_or_create(&labels)
            .set(i64::from(eligible));
        self.quorum_masters_required
            .get_or_create(&labels)
            .set(gauge(quorum_of(configured)));
    }

    /// Removes a deleted quorum's series, so that its last figures do not keep an alert firing.
    pub fn forget_quorum(&self, quorum: &str) {
        let labels = QuorumLabels {
            quorum: quorum.to_owned(),
        };
        self.quorum_masters_configured.remove(&labels);
        self.quorum_masters_eligible.remove(&labels);
        self.quorum_masters_required.remove(&labels);
        let endpoints = self
            .master_endpoints
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(quorum)
            .unwrap_or_default();
        for endpoint in endpoints {
            for state in MASTER_STATES {
                self.master_state.remove(&MasterLabels {
                    quorum: quorum.to_owned(),
                    endpoint: endpoint.clone(),
                    state: state.to_owned(),
                });
            }
        }
    }

    /// Sets the leader gauge, and counts the moments this replica becomes the active one: a counter sees a
    /// leadership that came and went between two scrapes, which the gauge alone would hide.
    pub fn set_leader(&self, active: bool) {
        let before = self.leader.set(i64::from(active));
        if active && before == 0 {
            self.leader_elected.inc();
        }
    }

    pub fn stopped_report(&self, outcome: &str) {
        self.stopped_reports
            .get_or_create(&ReportLabels {
                outcome: outcome.to_owned(),
            })
            .inc();
    }

    pub fn stopped_report_refused_locally(&self, reason: &str) {
        self.stopped_reports_refused_locally
            .get_or_create(&LocalRefusalLabels {
                reason: reason.to_owned(),
            })
            .inc();
    }

    pub fn reconcile_error(&self, resource: &str, error: &str) {
        self.reconcile_errors
            .get_or_create(&ReconcileErrorLabels {
                resource: resource.to_owned(),
                error: error.to_owned(),
            })
            .inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn samples(metrics: &Metrics, name: &str) -> Vec<String> {
        metrics
            .encode()
            .lines()
            .filter(|line| line.starts_with(&format!("{name}{{")) || line.starts_with(&format!("{name} ")))
            .map(str::to_owned)
            .collect()
    }

    #[test]
    fn leader_elections_count_each_rise_only() {
        let metrics = Metrics::default();
        for active in [false, true, true, false, false, true] {
            metrics.set_leader(active);
        }
        assert_eq!(metrics.leader.get(), 1);
        assert_eq!(metrics.leader_elected.get(), 2);
    }

    #[test]
    fn quorum_figures_use_the_engines_majority() {
        let metrics = Metrics::default();
        metrics.set_quorum_masters("default", 5, 2);
        assert_eq!(
            samples(&metrics, "redlock_quorum_masters_required"),
            ["redlock_quorum_masters_required{quorum=\"default\"} 3"]
        );
        assert_eq!(
            samples(&metrics, "redlock_quorum_masters_eligible"),
            ["redlock_quorum_masters_eligible{quorum=\"default\"} 2"]
        );
    }

    #[test]
    fn a_forgotten_quorum_leaves_no_series_and_others_stay() {
        let metrics = Metrics::default();
        for quorum in ["gone", "kept"] {
            metrics.set_quorum_masters(quorum, 3, 3);
            metrics.set_master_state(quorum, "redis://a:6379", "up");
        }
        metrics.forget_quorum("gone");
        let text = metrics.encode();
        assert!(!text.contains("quorum=\"gone\""), "{text}");
        assert_eq!(text.matches("quorum=\"kept\"").count(), 3 + 3, "{text}");
    }
}
