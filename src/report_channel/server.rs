//! The reports port: TLS with the replica's own certificate, one request per connection, and a bound on what a
//! client without credentials can hold (connections at once, per source address and in all, each connection's
//! life and buffers), whatever it sends. A connection beyond a bound is closed at once, so that a holder fails
//! fast and tries again rather than waiting in the backlog.

use std::net::SocketAddr;
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

use super::sources::Sources;
use crate::telemetry::server::Bound;

/// Connections served at once; more are closed as they come. Each holds a task, a TLS session and buffers (at
/// most [`MAX_BUFFER`] each way).
const MAX_CONNECTIONS: usize = 256;
/// Connections served at once from one source address (a pod).
const PER_SOURCE: usize = 8;
/// The most of a request buffered (hyper's least is 8 KiB): a report's headers take 1–2 KiB, and its body is
/// limited to 4 KiB before it is read.
const MAX_BUFFER: usize = 16 * 1024;
/// A client that has not finished its handshake by then is dropped (a slow handshake holds a connection slot).
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(3);
/// The request's headers must have come by then.
const HEADER_TIMEOUT: Duration = Duration::from_secs(3);
/// The most a connection lives, handshake to answer: a report takes two reads and a token review, which the
/// budgets answer within a few seconds or refuse.
const CONNECTION_LIFETIME: Duration = Duration::from_secs(10);

/// The reports port, bound at start as the metrics port is (so a port in use fails at once), and served once the
/// routes exist.
pub struct ReportsPort {
    bound: Bound,
    pub local_addr: SocketAddr,
}

pub async fn bind(addr: SocketAddr) -> std::io::Result<ReportsPort> {
    let bound = crate::telemetry::server::bind(addr).await?;
    Ok(ReportsPort {
        local_addr: bound.local_addr,
        bound,
    })
}

impl ReportsPort {
    /// Serves `routes` over TLS with `tls` until `shutdown`.
    pub fn serve_reports(
        self,
        tls: Arc<ServerConfig>,
        routes: Router,
        shutdown: CancellationToken,
    ) -> tokio::task::JoinHandle<()> {
        let acceptor = TlsAcceptor::from(tls);
        let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
        let sources = Sources::new(PER_SOURCE);
        let listener = self.bound.into_listener();
        tokio::spawn(async move {
            loop {
                let accepted = tokio::select! {
                    () = shutdown.cancelled() => return,
                    accepted = listener.accept() => accepted,
                };
                let (stream, peer) = match accepted {
                    Ok(accepted) => accepted,
                    Err(err) => {
                        // Out of file descriptors, most likely: pause rather than spin.
                        tracing::warn!(error = %err, "the reports port cannot accept a connection");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                // Beyond a bound the connection is dropped, which closes it.
                let Some(source) = sources.enter(peer.ip()) else {
                    continue;
                };
                let Ok(slot) = slots.clone().try_acquire_owned() else {
                    continue;
                };
                let (acceptor, routes, stop) = (acceptor.clone(), routes.clone(), shutdown.clone());
                tokio::spawn(async move {
                    let _slots = (slot, source);
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
        .max_buf_size(MAX_BUFFER)
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .serve_connection(TokioIo::new(tls), TowerToHyperService::new(routes));
    tokio::select! {
        _ = connection => {}
        () = stop.cancelled() => {}
    }
}
