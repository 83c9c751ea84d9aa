//! The reports port: TLS with the replica's own certificate, HTTP/1.1 kept alive between a holder's asks, and a
//! bound on what a client without credentials can hold (connections at once, per source address and in all, how
//! long one may sit idle, how long a request may take, each connection's buffers), whatever it sends. A full port
//! closes the connection idle longest for a newcomer ([`Connections`]); when every slot has a request in flight,
//! the newcomer is closed at once, so that a holder fails fast and tries again rather than waiting in the backlog.

use std::net::SocketAddr;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::ConnectInfo;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use hyper_util::rt::{TokioIo, TokioTimer};
use rustls::ServerConfig;
use tokio::net::TcpStream;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

use super::connections::{Connections, Limits, Slot};
use crate::telemetry::server::Bound;

/// Connections open at once unless configured (`--reports-max-connections`); past it an idle one is closed for a
/// newcomer. Each holds a task, a TLS session and buffers (at most [`MAX_BUFFER`] each way): about 30 KiB idle
/// (58 KiB for both ends, `kept_connection_memory`), so 1,024 take some 30 MiB at most.
pub const MAX_CONNECTIONS: u32 = 1024;
/// Connections open at once from one source address (a pod).
const PER_SOURCE: usize = 8;
/// The most of a request buffered (hyper's least is 8 KiB): a report's headers take 1–2 KiB, and its body is
/// limited to 4 KiB before it is read.
const MAX_BUFFER: usize = 16 * 1024;
/// A client that has not finished its handshake by then is dropped (a slow handshake holds a connection slot).
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(3);
/// How long a connection may wait for its next request's headers to have come, the time after the last answer
/// included: a holder asks at least every few seconds while it holds (at half the time left), so one idle longer
/// than this has nothing to ask. Until then the slot is still given up to a newcomer when the port is full.
const IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// The most a request takes, headers read to answer: a report takes two reads and a token review, which the
/// budgets answer within a few seconds or refuse. Past it the connection is closed.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a connection closed for a newcomer or at shutdown may take to finish an answer it is writing.
const CLOSE_GRACE: Duration = Duration::from_secs(1);

/// What the port lets its clients hold.
#[derive(Clone, Copy, Debug)]
pub struct Bounds {
    pub connections: Limits,
    /// How long a connection may wait for its next request's headers to have come.
    pub idle: Duration,
}

impl Bounds {
    /// The default bounds with `total` connections at most in all.
    pub fn with_connections(total: usize) -> Self {
        let mut bounds = Self::default();
        bounds.connections.total = total.max(1);
        bounds
    }
}

impl Default for Bounds {
    fn default() -> Self {
        Self {
            connections: Limits {
                total: MAX_CONNECTIONS as usize,
                per_source: PER_SOURCE,
            },
            idle: IDLE_TIMEOUT,
        }
    }
}

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
        self.serve_reports_within(Bounds::default(), tls, routes, shutdown)
    }

    /// [`Self::serve_reports`] within other bounds (tests).
    pub fn serve_reports_within(
        self,
        bounds: Bounds,
        tls: Arc<ServerConfig>,
        routes: Router,
        shutdown: CancellationToken,
    ) -> tokio::task::JoinHandle<()> {
        tokio::spawn(accept(self.bound.into_listener(), bounds, tls, routes, shutdown))
    }

    /// Serves `routes` on a runtime of its own, one thread named `reports-port`, until `shutdown`: what holders
    /// and anyone else send (handshakes above all: 10,000 holders asking at once after a failover) is worked off
    /// on that thread alone, and never queues before the keeper's extensions, which run on the main runtime's
    /// threads. The returned task ends when the thread has stopped.
    pub fn serve_reports_apart(
        self,
        bounds: Bounds,
        tls: Arc<ServerConfig>,
        routes: Router,
        shutdown: CancellationToken,
    ) -> std::io::Result<tokio::task::JoinHandle<()>> {
        // Registered again with the new runtime's reactor, so that no event of the port goes through the main one.
        let listener = self.bound.into_listener().into_std()?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let (stopped, ended) = tokio::sync::oneshot::channel::<()>();
        std::thread::Builder::new()
            .name("reports-port".to_owned())
            .spawn(move || {
                runtime.block_on(async move {
                    match tokio::net::TcpListener::from_std(listener) {
                        Ok(listener) => accept(listener, bounds, tls, routes, shutdown).await,
                        Err(err) => tracing::error!(error = %err, "the reports port cannot be served"),
                    }
                });
                // Its connections' tasks go with the runtime, here, outside any async context.
                drop(runtime);
                let _ = stopped.send(());
            })?;
        Ok(tokio::spawn(async move {
            let _ = ended.await;
        }))
    }
}

/// Accepts connections within `bounds` and serves each on a task of its own, until `shutdown`.
async fn accept(
    listener: tokio::net::TcpListener,
    bounds: Bounds,
    tls: Arc<ServerConfig>,
    routes: Router,
    shutdown: CancellationToken,
) {
    let acceptor = TlsAcceptor::from(tls);
    let connections = Connections::new(bounds.connections);
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
        // Beyond a bound with no idle connection to close, the connection is dropped, which closes it.
        let Some(slot) = connections.admit(peer.ip()) else {
            continue;
        };
        let (acceptor, routes, stop) = (acceptor.clone(), routes.clone(), shutdown.clone());
        tokio::spawn(serve_one(
            acceptor,
            stream,
            (peer, slot, bounds.idle),
            routes,
            stop,
        ));
    }
}

async fn serve_one(
    acceptor: TlsAcceptor,
    stream: TcpStream,
    (peer, slot, idle): (SocketAddr, Slot, Duration),
    routes: Router,
    stop: CancellationToken,
) {
    let _ = stream.set_nodelay(true);
    let handshake = tokio::select! {
        handshake = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)) => handshake,
        () = slot.closed.cancelled() => return,
        () = stop.cancelled() => return,
    };
    let Ok(Ok(tls)) = handshake else {
        return;
    };
    let slot = Arc::new(slot);
    let serving = slot.clone();
    let service = hyper::service::service_fn(move |mut request: hyper::Request<hyper::body::Incoming>| {
        let (routes, slot) = (routes.clone(), serving.clone());
        request.extensions_mut().insert(ConnectInfo(peer));
        async move {
            let _busy = slot.busy();
            match tokio::time::timeout(
                REQUEST_TIMEOUT,
                routes.oneshot(request.map(axum::body::Body::new)),
            )
            .await
            {
                Ok(answered) => answered,
                Err(_) => {
                    // The connection goes with its request: what the client sent next is not read.
                    slot.closed.cancel();
                    Ok((StatusCode::SERVICE_UNAVAILABLE, "the request took too long").into_response())
                }
            }
        }
    });
    let mut connection = pin!(
        hyper::server::conn::http1::Builder::new()
            .keep_alive(true)
            .max_buf_size(MAX_BUFFER)
            .timer(TokioTimer::new())
            // Runs from the last answer to the next request's end of headers: the idle bound as well.
            .header_read_timeout(idle)
            .serve_connection(TokioIo::new(tls), service)
    );
    tokio::select! {
        _ = connection.as_mut() => return,
        () = slot.closed.cancelled() => {}
        () = stop.cancelled() => {}
    }
    // Closed for a newcomer (idle), after a request too long, or at shutdown: an answer being written is finished.
    connection.as_mut().graceful_shutdown();
    let _ = tokio::time::timeout(CLOSE_GRACE, connection).await;
}
