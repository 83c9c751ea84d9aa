//! `/metrics`, `/healthz` and `/readyz` on one port. Holders' reports have a port of their own
//! (`crate::report_channel`), so that a NetworkPolicy can open this one to the scraper and that one to holders.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::http::header::CONTENT_TYPE;
use axum::response::IntoResponse;
use axum::routing::get;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::health::Health;
use super::metrics::Metrics;

#[derive(Clone)]
struct Shared {
    metrics: Arc<Metrics>,
    health: Arc<Health>,
}

/// The port, bound at start (so a port in use fails at once), served once the controllers' routes exist.
pub struct Bound {
    listener: TcpListener,
    pub local_addr: SocketAddr,
}

pub async fn bind(addr: SocketAddr) -> std::io::Result<Bound> {
    let listener = TcpListener::bind(addr).await?;
    let local_addr = listener.local_addr()?;
    Ok(Bound { listener, local_addr })
}

impl Bound {
    /// The bound socket, for a server of another kind (the reports port's TLS).
    pub fn into_listener(self) -> TcpListener {
        self.listener
    }

    /// Serves metrics and health until `shutdown`.
    pub fn serve(
        self,
        metrics: Arc<Metrics>,
        health: Arc<Health>,
        shutdown: CancellationToken,
    ) -> tokio::task::JoinHandle<()> {
        let app = Router::new()
            .route("/metrics", get(metrics_text))
            .route("/healthz", get(|| async { "ok\n" }))
            .route("/readyz", get(ready))
            .with_state(Shared { metrics, health });
        let listener = self.listener;
        tokio::spawn(async move {
            let served = axum::serve(listener, app)
                .with_graceful_shutdown(async move { shutdown.cancelled().await })
                .await;
            if let Err(err) = served {
                tracing::error!(error = %err, "metrics and health server failed");
            }
        })
    }
}

async fn metrics_text(State(shared): State<Shared>) -> impl IntoResponse {
    (
        [(
            CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        shared.metrics.encode(),
    )
}

async fn ready(State(shared): State<Shared>) -> impl IntoResponse {
    match shared.health.ready() {
        Ok(()) => (StatusCode::OK, "ok\n".to_owned()),
        Err(problem) => (StatusCode::SERVICE_UNAVAILABLE, format!("{problem}\n")),
    }
}
