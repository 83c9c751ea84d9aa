//! A holder's side of the channel: POSTs over TLS to the URL status shows, to a server whose certificate has the
//! pin status shows beside it, and to no other. Nothing (not the token, not the report) is sent before the server
//! has shown that certificate and proved it holds its key.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::http::{HeaderValue, Request, header};
use http_body_util::{BodyExt, Full, Limited};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, ClientConfig, DigitallySignedStruct, SignatureScheme};
use tokio::net::{TcpSocket, TcpStream};
use tokio_rustls::TlsConnector;
use tokio_util::task::AbortOnDropHandle;

/// The most of an answer that is read (the operator's are a few hundred bytes).
const ANSWER_LIMIT: usize = 64 * 1024;

/// The server's answer: its HTTP status and body.
#[derive(Debug)]
pub struct Answer {
    pub code: u16,
    pub body: Bytes,
    /// `Retry-After`, in seconds, when the answer has one.
    pub retry_after: Option<Duration>,
}

impl Answer {
    /// The answer's `reason` and `message` (the operator answers with a Kubernetes `Status`), or its status code.
    pub fn reason_and_message(&self) -> (String, String) {
        let status: serde_json::Value = serde_json::from_slice(&self.body).unwrap_or_default();
        let text = |field: &str| status[field].as_str().unwrap_or_default().to_owned();
        (text("reason"), text("message"))
    }

    /// `message (reason)`, for a log line.
    pub fn summary(&self) -> String {
        match self.reason_and_message() {
            (reason, message) if !reason.is_empty() || !message.is_empty() => format!("{message} ({reason})"),
            _ => format!("HTTP {}", self.code),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum PostError {
    #[error("{0:?} is not an https URL with a host")]
    NotHttps(String),
    #[error("{0:?} is not a certificate pin (64 hex digits)")]
    NotAPin(String),
    #[error("the server at {url} shows another certificate than the one status pins: nothing was sent to it")]
    PinMismatch { url: String },
    #[error("cannot reach {url}: {reason}")]
    Unreachable {
        url: String,
        #[source]
        reason: Cause,
    },
}

/// Why a server could not be reached (a connection, TLS or HTTP error), kept whole for the error's source.
pub type Cause = Box<dyn std::error::Error + Send + Sync>;

/// POSTs `body` (JSON) with `bearer` as its credentials to `url`, over TLS to a server whose certificate has `pin`.
pub async fn post(url: &str, pin: &str, bearer: Option<&str>, body: Vec<u8>) -> Result<Answer, PostError> {
    Caller::default().post(url, pin, bearer, body).await
}

/// A holder's end of the channel kept across requests: its connection stays open between asks (HTTP/1.1 kept
/// alive: an ask on it costs no handshake at all), and when the server has closed it (idle, or its slot given to
/// a newcomer), the TLS session the server gave is resumed on the next one. Kept for one pin and one address at a
/// time: a new pin (a failover) starts afresh, and no session of another server is offered to it.
#[derive(Default)]
pub struct Caller {
    /// The address connections are made from, where the system's choice will not do (a bench's many holders on
    /// one machine, each from its own loopback address as pods have their own).
    source: Option<IpAddr>,
    /// Closes each connection after its answer, as holders did before they kept theirs (a bench's baseline).
    one_per_request: bool,
    kept: std::sync::Mutex<Kept>,
}

#[derive(Default)]
struct Kept {
    connector: Option<(String, TlsConnector)>,
    connection: Option<KeptConnection>,
}

/// An open connection, with what it was opened to.
struct KeptConnection {
    pin: String,
    server: (String, u16),
    sender: SendRequest<Full<Bytes>>,
    /// Ends the connection when dropped: when a timeout drops an ask midway, its connection goes with it (the
    /// server's slot is freed at once).
    _driver: AbortOnDropHandle<()>,
}

impl Caller {
    /// A caller whose connections are made from `source`.
    pub fn from_source(source: IpAddr) -> Self {
        Self {
            source: Some(source),
            ..Self::default()
        }
    }

    /// A caller from `source` that opens a connection per request (its TLS session still resumed): what an ask
    /// cost before holders kept their connection, for a bench to measure against.
    pub fn from_source_one_connection_per_request(source: IpAddr) -> Self {
        Self {
            source: Some(source),
            one_per_request: true,
            ..Self::default()
        }
    }

    fn kept(&self) -> std::sync::MutexGuard<'_, Kept> {
        self.kept.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn connector_for(&self, pin: &str) -> Result<TlsConnector, rustls::Error> {
        let mut kept = self.kept();
        if let Some((kept_pin, connector)) = kept.connector.as_ref()
            && kept_pin == pin
        {
            return Ok(connector.clone());
        }
        let made = connector(pin)?;
        kept.connector = Some((pin.to_owned(), made.clone()));
        Ok(made)
    }

    /// The open connection to `server` with `pin`, taken out while a request uses it (a request dropped midway
    /// drops it), if the server has not closed it.
    fn take_connection(&self, pin: &str, server: &(String, u16)) -> Option<KeptConnection> {
        let kept = self.kept().connection.take()?;
        (kept.pin == pin && &kept.server == server && !kept.sender.is_closed()).then_some(kept)
    }

    fn keep(&self, connection: KeptConnection) {
        if !self.one_per_request && !connection.sender.is_closed() {
            self.kept().connection = Some(connection);
        }
    }

    /// Whether a connection is kept open now.
    pub fn has_connection(&self) -> bool {
        self.kept()
            .connection
            .as_ref()
            .is_some_and(|kept| !kept.sender.is_closed())
    }

    /// [`post`], on this caller's open connection to the server when there is one.
    pub async fn post(
        &self,
        url: &str,
        pin: &str,
        bearer: Option<&str>,
        body: Vec<u8>,
    ) -> Result<Answer, PostError> {
        post_with(self, url, pin, bearer, body).await
    }

    async fn connect(&self, url: &str, target: &Target) -> Result<KeptConnection, PostError> {
        let unreachable = |reason: Cause| PostError::Unreachable {
            url: url.to_owned(),
            reason,
        };
        let (host, port) = &target.server;
        let server_name = ServerName::try_from(host.clone()).map_err(|err| unreachable(err.into()))?;
        let tcp = match self.source {
            None => TcpStream::connect((host.as_str(), *port)).await,
            Some(source) => connect_from(source, host, *port).await,
        }
        .map_err(|err| unreachable(err.into()))?;
        let _ = tcp.set_nodelay(true);
        let tls = self
            .connector_for(&target.pin)
            .map_err(|err| unreachable(err.into()))?
            .connect(server_name, tcp)
            .await
            .map_err(|err| {
                if is_pin_mismatch(&err) {
                    PostError::PinMismatch { url: url.to_owned() }
                } else {
                    unreachable(err.into())
                }
            })?;
        let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .map_err(|err| unreachable(err.into()))?;
        let driver = AbortOnDropHandle::new(tokio::spawn(async move {
            let _ = connection.await;
        }));
        Ok(KeptConnection {
            pin: target.pin.clone(),
            server: target.server.clone(),
            sender,
            _driver: driver,
        })
    }
}

/// Where a request goes: the server's address and the pin it must show.
struct Target {
    server: (String, u16),
    pin: String,
}

/// A connection from `source` (a port of the system's choice) to `host:port`.
async fn connect_from(source: IpAddr, host: &str, port: u16) -> std::io::Result<TcpStream> {
    let server = tokio::net::lookup_host((host, port))
        .await?
        .find(|server| server.is_ipv4() == source.is_ipv4())
        .ok_or_else(|| std::io::Error::other(format!("{host} has no address of {source}'s family")))?;
    let socket = if source.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.bind(SocketAddr::new(source, 0))?;
    socket.connect(server).await
}

async fn post_with(
    caller: &Caller,
    url: &str,
    pin: &str,
    bearer: Option<&str>,
    body: Vec<u8>,
) -> Result<Answer, PostError> {
    let parsed = url::Url::parse(url).map_err(|_| PostError::NotHttps(url.to_owned()))?;
    let (Some(host), Some(port)) = (bare_host(&parsed), parsed.port_or_known_default()) else {
        return Err(PostError::NotHttps(url.to_owned()));
    };
    if parsed.scheme() != "https" {
        return Err(PostError::NotHttps(url.to_owned()));
    }
    let pin = super::pin::parse(pin).ok_or_else(|| PostError::NotAPin(pin.to_owned()))?;
    let target = Target {
        server: (host, port),
        pin,
    };
    let unreachable = |reason: Cause| PostError::Unreachable {
        url: url.to_owned(),
        reason,
    };
    let request = || {
        let mut request = Request::post(parsed.path()).header(header::CONTENT_TYPE, "application/json");
        // `host[:port]` as the URL writes it (an IPv6 host bracketed).
        let authority = &parsed[url::Position::BeforeHost..url::Position::AfterPort];
        if let Ok(authority) = HeaderValue::from_str(authority) {
            request = request.header(header::HOST, authority);
        }
        if let Some(bearer) = bearer {
            request = request.header(header::AUTHORIZATION, format!("Bearer {bearer}"));
        }
        request
            .body(Full::new(Bytes::from(body.clone())))
            .map_err(|err| unreachable(err.into()))
    };
    // A kept connection the server closed just as this was sent fails before any answer: the question is asked
    // again on a new one (asking twice is harmless: an answer is counted from before the first was sent, and a
    // report taken twice releases what the first released).
    if let Some(mut kept) = caller.take_connection(&target.pin, &target.server)
        && let Ok(response) = kept.sender.send_request(request()?).await
    {
        let answer = read_answer(response).await.map_err(unreachable)?;
        caller.keep(kept);
        return Ok(answer);
    }
    let mut fresh = caller.connect(url, &target).await?;
    let response = fresh
        .sender
        .send_request(request()?)
        .await
        .map_err(|err| unreachable(err.into()))?;
    let answer = read_answer(response).await.map_err(unreachable)?;
    caller.keep(fresh);
    Ok(answer)
}

async fn read_answer(response: hyper::Response<hyper::body::Incoming>) -> Result<Answer, Cause> {
    let code = response.status().as_u16();
    let retry_after = response
        .headers()
        .get(header::RETRY_AFTER)
        .and_then(|value| value.to_str().ok()?.trim().parse::<u64>().ok())
        .map(Duration::from_secs);
    let body = Limited::new(response.into_body(), ANSWER_LIMIT).collect().await?;
    Ok(Answer {
        code,
        body: body.to_bytes(),
        retry_after,
    })
}

/// The host of `url` as a name or an address to connect to: an IPv6 address without the brackets URLs write.
pub fn bare_host(url: &url::Url) -> Option<String> {
    match url.host()? {
        url::Host::Domain(name) => Some(name.to_owned()),
        url::Host::Ipv4(address) => Some(address.to_string()),
        url::Host::Ipv6(address) => Some(address.to_string()),
    }
}

fn connector(pin: &str) -> Result<TlsConnector, rustls::Error> {
    let provider = super::crypto_provider();
    let mut config = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(PinnedCertificate {
            pin: pin.to_owned(),
            provider,
        }))
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsConnector::from(Arc::new(config)))
}

fn is_pin_mismatch(err: &std::io::Error) -> bool {
    err.get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        .is_some_and(|err| {
            matches!(
                err,
                rustls::Error::InvalidCertificate(CertificateError::ApplicationVerificationFailure)
            )
        })
}

/// Trusts the one certificate with the pin, whatever names and dates it carries: the pin came with the URL in the
/// lock's status, which only the operator writes and the holder reads through the API server's authentication,
/// so a name check would add nothing, and the replica's own certificate names no CA. The handshake's signature is
/// still verified, so the server must hold the certificate's key.
#[derive(Debug)]
struct PinnedCertificate {
    pin: String,
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for PinnedCertificate {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        if super::pin::of(end_entity) == self.pin {
            Ok(ServerCertVerified::assertion())
        } else {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::ApplicationVerificationFailure,
            ))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use tokio_util::sync::CancellationToken;

    use super::*;
    use crate::report_channel::identity::{Identity, KeySource};
    use crate::report_channel::server;

    /// A reports server answering every request with 200, counting them.
    async fn counting_server() -> (String, String, Arc<AtomicUsize>, CancellationToken) {
        let server = server_within(server::Bounds::default()).await;
        (server.url, server.pin, server.requests, server.stop)
    }

    struct TestServer {
        url: String,
        pin: String,
        requests: Arc<AtomicUsize>,
        /// The client ports requests came from: one per connection.
        peers: Arc<std::sync::Mutex<std::collections::BTreeSet<u16>>>,
        /// Requests to `/slow` say they came, then wait for `release`.
        entered: Arc<tokio::sync::Notify>,
        release: Arc<tokio::sync::Notify>,
        stop: CancellationToken,
    }

    async fn server_within(bounds: server::Bounds) -> TestServer {
        use axum::extract::ConnectInfo;
        let bound = server::bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let url = format!("https://{}/v1/stopped", bound.local_addr);
        let identity = Identity::new(&KeySource::Generated, &["127.0.0.1".into()]).unwrap();
        let requests = Arc::new(AtomicUsize::new(0));
        let peers = Arc::new(std::sync::Mutex::new(std::collections::BTreeSet::new()));
        let (entered, release) = (
            Arc::new(tokio::sync::Notify::new()),
            Arc::new(tokio::sync::Notify::new()),
        );
        let (counted, seen) = (requests.clone(), peers.clone());
        let (came, released) = (entered.clone(), release.clone());
        let routes = axum::Router::new()
            .route(
                "/slow",
                axum::routing::post(move || {
                    let (came, released) = (came.clone(), released.clone());
                    async move {
                        came.notify_one();
                        released.notified().await;
                        "slow"
                    }
                }),
            )
            .fallback(move |ConnectInfo(peer): ConnectInfo<SocketAddr>| async move {
                counted.fetch_add(1, Ordering::SeqCst);
                seen.lock().unwrap().insert(peer.port());
                "taken"
            });
        let stop = CancellationToken::new();
        bound.serve_reports_within(bounds, identity.server_config, routes, stop.clone());
        TestServer {
            url,
            pin: identity.pin,
            requests,
            peers,
            entered,
            release,
            stop,
        }
    }

    /// Waits until `done` holds, with no bound of its own (the test runner's is the bound).
    async fn until<F: std::future::Future<Output = bool>>(mut done: impl FnMut() -> F) {
        while !done().await {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn bounds(total: usize, per_source: usize, idle: Duration) -> server::Bounds {
        server::Bounds {
            connections: crate::report_channel::connections::Limits { total, per_source },
            idle,
        }
    }

    #[tokio::test]
    async fn a_caller_asks_again_on_the_connection_it_kept() {
        let server = server_within(server::Bounds::default()).await;
        let caller = Caller::default();
        for _ in 0..3 {
            let answer = caller
                .post(&server.url, &server.pin, None, b"{}".to_vec())
                .await
                .unwrap();
            assert_eq!(answer.code, 200);
        }
        assert_eq!(server.requests.load(Ordering::SeqCst), 3);
        assert_eq!(
            server.peers.lock().unwrap().len(),
            1,
            "one connection for three asks"
        );
        assert!(caller.has_connection());
        server.stop.cancel();
    }

    #[tokio::test]
    async fn a_caller_whose_connection_was_given_to_a_newcomer_asks_on_a_new_one() {
        // One connection per source: a second caller from the same address takes the first one's idle slot.
        let server = server_within(bounds(8, 1, Duration::from_secs(30))).await;
        let (first, second) = (Caller::default(), Caller::default());
        for caller in [&first, &second, &first, &second] {
            let answer = caller
                .post(&server.url, &server.pin, None, b"{}".to_vec())
                .await
                .unwrap();
            assert_eq!(answer.code, 200);
        }
        assert_eq!(server.requests.load(Ordering::SeqCst), 4);
        assert_eq!(
            server.peers.lock().unwrap().len(),
            4,
            "each ask found its connection closed"
        );
        server.stop.cancel();
    }

    #[tokio::test]
    async fn a_port_whose_every_slot_is_busy_closes_a_newcomer_at_once() {
        let server = server_within(bounds(1, 8, Duration::from_secs(30))).await;
        let slow_url = server.url.replace("/v1/stopped", "/slow");
        let busy = Arc::new(Caller::default());
        let (asking, url, pin) = (busy.clone(), slow_url.clone(), server.pin.clone());
        let in_flight = tokio::spawn(async move { asking.post(&url, &pin, None, Vec::new()).await });
        server.entered.notified().await;
        let refused = Caller::default()
            .post(&server.url, &server.pin, None, b"{}".to_vec())
            .await;
        assert!(
            matches!(refused, Err(PostError::Unreachable { .. })),
            "{refused:?}"
        );
        assert_eq!(
            server.requests.load(Ordering::SeqCst),
            0,
            "the newcomer was not served"
        );
        server.release.notify_one();
        let answer = in_flight.await.unwrap().unwrap();
        assert_eq!(&answer.body[..], b"slow", "the request in flight was answered");
        server.stop.cancel();
    }

    #[tokio::test]
    async fn a_connection_idle_past_the_bound_is_closed_and_the_next_ask_opens_one() {
        let server = server_within(bounds(8, 8, Duration::from_millis(200))).await;
        let caller = Caller::default();
        caller
            .post(&server.url, &server.pin, None, b"{}".to_vec())
            .await
            .unwrap();
        until(|| async { !caller.has_connection() }).await;
        caller
            .post(&server.url, &server.pin, None, b"{}".to_vec())
            .await
            .unwrap();
        assert_eq!(server.peers.lock().unwrap().len(), 2);
        server.stop.cancel();
    }

    #[tokio::test]
    async fn a_post_reaches_the_pinned_server_and_no_other() {
        let (url, pin, requests, stop) = counting_server().await;
        let answer = post(&url, &pin, Some("token"), b"{}".to_vec()).await.unwrap();
        assert_eq!((answer.code, &answer.body[..]), (200, &b"taken"[..]));
        assert_eq!(requests.load(Ordering::SeqCst), 1);

        let other = "ab".repeat(32);
        let err = post(&url, &other, Some("token"), b"{}".to_vec())
            .await
            .unwrap_err();
        assert!(matches!(err, PostError::PinMismatch { .. }), "{err}");
        assert_eq!(
            requests.load(Ordering::SeqCst),
            1,
            "a request reached the wrong server"
        );
        stop.cancel();
    }

    /// This thread's CPU time (a current-thread runtime runs both ends here).
    fn thread_cpu() -> Duration {
        let stat = std::fs::read_to_string("/proc/thread-self/schedstat").unwrap_or_default();
        Duration::from_nanos(
            stat.split_whitespace()
                .next()
                .and_then(|ns| ns.parse().ok())
                .unwrap_or(0),
        )
    }

    #[tokio::test]
    async fn a_caller_resumes_its_session_with_the_server() {
        let (url, pin, _requests, stop) = counting_server().await;
        let caller = Caller::default();
        let host = url::Url::parse(&url).unwrap();
        let addr = format!("{}:{}", bare_host(&host).unwrap(), host.port().unwrap());
        let mut kinds = Vec::new();
        for _ in 0..2 {
            let tcp = TcpStream::connect(&addr).await.unwrap();
            let name = ServerName::try_from("127.0.0.1").unwrap();
            let mut tls = caller
                .connector_for(&pin)
                .unwrap()
                .connect(name, tcp)
                .await
                .unwrap();
            // TLS 1.3 sends its tickets after the handshake: read until the server closes (it answers nothing).
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            tls.write_all(b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
                .await
                .unwrap();
            let mut answer = Vec::new();
            let _ = tls.read_to_end(&mut answer).await;
            kinds.push(tls.get_ref().1.handshake_kind());
        }
        assert_eq!(
            kinds,
            [
                Some(rustls::HandshakeKind::Full),
                Some(rustls::HandshakeKind::Resumed)
            ]
        );
        stop.cancel();
    }

    /// What an ask costs in CPU (client and server together, on this thread), a full handshake each time against
    /// a resumed one: `cargo test --lib handshake_cost -- --ignored --nocapture`.
    #[tokio::test]
    #[ignore = "a measurement"]
    async fn handshake_cost() {
        let (url, pin, _requests, stop) = counting_server().await;
        const ASKS: u32 = 300;
        for resumed in [false, true] {
            let kept = Caller::default();
            let _ = kept.post(&url, &pin, None, b"{}".to_vec()).await.unwrap();
            let (cpu, wall) = (thread_cpu(), std::time::Instant::now());
            for _ in 0..ASKS {
                let fresh = Caller::default();
                let caller = if resumed { &kept } else { &fresh };
                let answer = caller.post(&url, &pin, None, b"{}".to_vec()).await.unwrap();
                assert_eq!(answer.code, 200);
            }
            let (cpu, wall) = (thread_cpu() - cpu, wall.elapsed());
            println!(
                "{}: {:?} CPU and {:?} wall per ask (client and server)",
                if resumed { "resumed" } else { "full handshake" },
                cpu / ASKS,
                wall / ASKS
            );
        }
        stop.cancel();
    }

    /// What a kept connection costs in memory, both ends together (RSS before and after `CONNECTIONS` callers
    /// each asked once and kept their connection): `cargo test --lib kept_connection_memory -- --ignored
    /// --nocapture`.
    #[tokio::test]
    #[ignore = "a measurement"]
    async fn kept_connection_memory() {
        const CONNECTIONS: usize = 2000;
        let rss = || {
            std::fs::read_to_string("/proc/self/statm")
                .ok()
                .and_then(|statm| statm.split_whitespace().nth(1)?.parse::<usize>().ok())
                .unwrap_or(0)
                * 4096
        };
        let server = server_within(bounds(
            CONNECTIONS + 10,
            CONNECTIONS + 10,
            Duration::from_secs(300),
        ))
        .await;
        let warm = Caller::default();
        warm.post(&server.url, &server.pin, None, b"{}".to_vec())
            .await
            .unwrap();
        let before = rss();
        let mut callers = Vec::new();
        for _ in 0..CONNECTIONS {
            let caller = Caller::default();
            caller
                .post(&server.url, &server.pin, None, b"{}".to_vec())
                .await
                .unwrap();
            callers.push(caller);
        }
        let after = rss();
        println!(
            "{} KiB per kept connection, client and server together",
            (after - before) / CONNECTIONS / 1024
        );
        server.stop.cancel();
    }

    #[test]
    fn a_urls_host_is_given_bare() {
        let host = |url: &str| bare_host(&url::Url::parse(url).unwrap());
        assert_eq!(host("https://[::1]:8443/v1/stopped").as_deref(), Some("::1"));
        assert_eq!(
            host("https://10.0.0.5:8443/v1/stopped").as_deref(),
            Some("10.0.0.5")
        );
        assert_eq!(
            host("https://operator.example:8443/").as_deref(),
            Some("operator.example")
        );
    }

    #[tokio::test]
    async fn nothing_goes_over_plain_http_or_without_a_pin() {
        let pin = "ab".repeat(32);
        let err = post("http://127.0.0.1:1/v1/stopped", &pin, None, Vec::new())
            .await
            .unwrap_err();
        assert!(matches!(err, PostError::NotHttps(_)), "{err}");
        let err = post("https://127.0.0.1:1/v1/stopped", "nope", None, Vec::new())
            .await
            .unwrap_err();
        assert!(matches!(err, PostError::NotAPin(_)), "{err}");
        let err = post("not a url", &pin, None, Vec::new()).await.unwrap_err();
        assert!(matches!(err, PostError::NotHttps(_)), "{err}");
    }
}
