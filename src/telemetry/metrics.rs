//! Prometheus metrics of the controller, served on `/metrics`.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

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
pub struct ReconcileErrorLabels {
    /// `distributedlock` or `redisquorum`.
    pub resource: String,
    /// What failed: `kube_api`, `conflict`, `finalizer`, `lock_value` or `encode`.
    pub error: String,
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

pub struct Metrics {
    registry: Registry,
    pub acquire_seconds: HistogramFamily<OutcomeLabels>,
    pub extend_batch_seconds: Histogram,
    pub extend_lag_seconds: Histogram,
    pub extensions: Counter,
    pub locks_held: Gauge,
    pub locks_lost: Counter,
    pub master_state: Family<MasterLabels, Gauge>,
    pub reconcile_errors: Family<ReconcileErrorLabels, Counter>,
    pub leader: Gauge,
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
        let master_state = Family::<MasterLabels, Gauge>::default();
        let reconcile_errors = Family::<ReconcileErrorLabels, Counter>::default();
        let leader = Gauge::default();
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
            "master_state",
            "State of each Redis master (1 for the current state)",
            master_state.clone(),
        );
        registry.register(
            "reconcile_errors",
            "Reconciliations that failed and were retried with backoff",
            reconcile_errors.clone(),
        );
        registry.register("leader", "1 while this replica is the active one", leader.clone());
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
            master_state,
            reconcile_errors,
            leader,
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
        for state in ["up", "quarantined", "down"] {
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

    pub fn reconcile_error(&self, resource: &str, error: &str) {
        self.reconcile_errors
            .get_or_create(&ReconcileErrorLabels {
                resource: resource.to_owned(),
                error: error.to_owned(),
            })
            .inc();
    }
}
