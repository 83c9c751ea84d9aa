//! The reports port: TLS with the replica's own certificate, one request per connection, and a bound on what a
//! client without credentials can hold (connections at once, and each connection's life), whatever it sends.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use rustls::ServerConfig;
use tokio::net::TcpStream;
use tokio::sync::Semaphore;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

/// Connections served at once; more wait in the kernel's backlog. Each holds a task, a TLS session and buffers.
const MAX_CONNECTIONS: usize = 256;
/// A client that has not finished its handshake by then is dropped (a slow handshake holds a connection slot).
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(3);
/// The request's headers must have come by then.
const HEADER_TIMEOUT: Duration = Duration::from_secs(3);
/// The most a connection lives, handshake to answer: a report takes two reads and a token review, which the
/// budgets answer within a few seconds or refuse.
const CONNECTION_LIFETIME: Duration = Duration::from_secs(10);

/// A port is bound at start as the metrics port is (so a port in use fails at once), and served once the routes
/// exist.
pub use crate::telemetry::server::{Bound, bind};

impl Bound {
    /// Serves `routes` over TLS with `tls` until `shutdown`.
    pub fn serve_reports(
        self,
        tls: Arc<ServerConfig>,
        routes: Router,
        shutdown: CancellationToken,
    ) -> tokio::task::JoinHandle<()> {
        let acceptor = TlsAcceptor::from(tls);
        let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
        let listener = self.listener;
        tokio::spawn(async move {
            loop {
                let slot = tokio::select! {
                    () = shutdown.cancelled() => return,
                    slot = slots.clone().acquire_owned() => slot,
                };
                let Ok(slot) = slot else { return };
                let stream = tokio::select! {
                    () = shutdown.cancelled() => return,
                    accepted = listener.accept() => accepted,
                };
                let stream = match stream {
                    Ok((stream, _peer)) => stream,
                    Err(err) => {
                        // Out of file descriptors, most likely: pause rather than spin.
                        tracing::warn!(error = %err, "the reports port cannot accept a connection");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                let (acceptor, routes, stop) = (acceptor.clone(), routes.clone(), shutdown.clone());
                tokio::spawn(async move {
                    let _slot = slot;
                    let _ =
                        tokio::time::timeout(CONNECTION_LIFETIME, serve_one(acceptor, stream, routes, stop))
                            .await;
                });
            }
        })
    }
}

async fn serve_one(acceptor: TlsAcceptor, stream: TcpStream, routes: Router, stop: CancellationToken) {
    let _ = stream.set_nodelay(true);
    let Ok(Ok(tls)) = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await else {
        return;
    };
    let connection = hyper::server::conn::http1::Builder::new()
        .keep_alive(false)
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .serve_connection(TokioIo::new(tls), TowerToHyperService::new(routes));
    tokio::select! {
        _ = connection => {}
        () = stop.cancelled() => {}
    }
}
