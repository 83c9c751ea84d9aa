//! Reports of stopped work as a client without a genuine token sends them: a made-up bearer token or a JWT that
//! reads as a projected token for our audience with a signature nobody issued, POSTed over a connection of its
//! own, over TLS to whatever certificate the port shows (an attacker has no reason to check the pin). Used by the
//! flood test (tests/report_flood.rs) and the operator bench's flood phase.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::Instant;

/// A JWT that reads as a projected token for our audience, bound to a made-up pod, with a signature nobody
/// issued.
pub fn forged_jwt(namespace: &str, salt: u64) -> String {
    let now = k8s_openapi::jiff::Timestamp::now().as_second();
    let claims = serde_json::json!({
        "aud": ["redlock-operator"], "exp": now + 3600, "iat": now, "nbf": now,
        "iss": "https://kubernetes.default.svc.cluster.local", "jti": format!("{salt:x}"),
        "kubernetes.io": { "namespace": namespace, "pod": { "name": "web-0", "uid": format!("forged-{salt}") },
                           "serviceaccount": { "name": "default" } },
        "sub": format!("system:serviceaccount:{namespace}:default"),
    });
    format!(
        "{}.{}.{}",
        URL_SAFE_NO_PAD.encode(r#"{"alg":"RS256","kid":"x"}"#),
        URL_SAFE_NO_PAD.encode(claims.to_string()),
        URL_SAFE_NO_PAD.encode(salt.to_be_bytes().repeat(32))
    )
}

/// One answer: the HTTP status, and `Retry-After` if any.
pub struct Answer {
    pub code: u16,
    pub retry_after: Option<u64>,
}

/// POSTs `body` to the report path on `addr` over a connection of its own, declaring `declared` bytes
/// (`None`: the body's length) and sending only `body`; reads the answer's status line and headers.
pub async fn post(addr: SocketAddr, bearer: &str, body: &[u8], declared: Option<usize>) -> Answer {
    post_from(None, addr, bearer, body, declared)
        .await
        .unwrap_or_else(|err| panic!("no answer: {err}"))
}

/// [`post`] from the source address `source` (a loopback address of its own per client: the reports port bounds
/// the connections of one source); `Err` when the connection is closed before an answer (a bound met).
pub async fn post_from(
    source: Option<std::net::IpAddr>,
    addr: SocketAddr,
    bearer: &str,
    body: &[u8],
    declared: Option<usize>,
) -> Result<Answer, String> {
    let socket = tokio::net::TcpSocket::new_v4().map_err(|err| err.to_string())?;
    if let Some(source) = source {
        socket
            .bind(SocketAddr::new(source, 0))
            .map_err(|err| err.to_string())?;
    }
    let tcp = socket.connect(addr).await.map_err(|err| err.to_string())?;
    let server_name = rustls::pki_types::ServerName::from(addr.ip());
    let mut stream = any_certificate()
        .connect(server_name, tcp)
        .await
        .map_err(|err| format!("TLS handshake: {err}"))?;
    let head = format!(
        "POST /v1/stopped HTTP/1.1\r\nHost: operator\r\nAuthorization: Bearer {bearer}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        declared.unwrap_or(body.len())
    );
    stream
        .write_all(head.as_bytes())
        .await
        .map_err(|err| err.to_string())?;
    // The server may answer, and close, before reading a body it refuses: that is not an error here.
    let _ = stream.write_all(body).await;
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    while !answer.windows(4).any(|w| w == b"\r\n\r\n") {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => answer.extend_from_slice(&buf[..n]),
        }
    }
    let text = String::from_utf8_lossy(&answer);
    let code = text
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| format!("no HTTP answer: {text:?}"))?;
    let retry_after = text.lines().find_map(|line| {
        let (name, value) = line.split_once(':')?;
        name.eq_ignore_ascii_case("retry-after")
            .then(|| value.trim().parse().ok())
            .flatten()
    });
    Ok(Answer { code, retry_after })
}

/// What a flood sent and how it was answered.
#[derive(Default)]
pub struct Tally {
    pub sent: AtomicU64,
    pub refused: AtomicU64,
    pub too_many: AtomicU64,
    pub too_many_without_retry_after: AtomicU64,
    pub taken: AtomicU64,
    /// Connections closed before an answer (the reports port's bounds on connections).
    pub closed: AtomicU64,
}

/// One flooding client (number `client`) until `end`: reports of lock `web` in `namespace` with made-up tokens
/// (8 in 10), one forged JWT of its own repeated (1 in 10) and fresh forged JWTs (1 in 10), one connection each,
/// from a loopback address of its own (`127.0.0.<client + 2>`, as each pod has its own), when `addr` is one.
pub async fn flood(addr: SocketAddr, namespace: String, client: usize, end: Instant, tally: Arc<Tally>) {
    let source = match addr.ip() {
        std::net::IpAddr::V4(ip) if ip.is_loopback() => u8::try_from(client + 2)
            .ok()
            .map(|last| std::net::IpAddr::from([127, 0, 0, last])),
        _ => None,
    };
    let repeated = forged_jwt(&namespace, 1_000_000 + client as u64);
    let mut n: u64 = 0;
    while Instant::now() < end {
        n += 1;
        let fresh;
        let bearer = match n % 10 {
            8 => repeated.as_str(),
            9 => {
                fresh = forged_jwt(&namespace, (client as u64) << 40 | n);
                fresh.as_str()
            }
            _ => "made-up-token",
        };
        // Not the grant status records: these go through the lane of reports nothing vouches for.
        let body = format!(r#"{{"lock":"web","permit":0,"fencingToken":{}}}"#, 1000 + n);
        let answer = post_from(source, addr, bearer, body.as_bytes(), None).await;
        tally.sent.fetch_add(1, Ordering::Relaxed);
        let Ok(answer) = answer else {
            tally.closed.fetch_add(1, Ordering::Relaxed);
            continue;
        };
        match answer.code {
            200 => {
                tally.taken.fetch_add(1, Ordering::Relaxed);
            }
            code => {
                tally.refused.fetch_add(1, Ordering::Relaxed);
                if code == 429 {
                    tally.too_many.fetch_add(1, Ordering::Relaxed);
                    if answer.retry_after.is_none_or(|seconds| seconds == 0) {
                        tally.too_many_without_retry_after.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }
    }
}

/// A TLS client that takes any certificate (and checks that the server holds its key, as rustls always does).
fn any_certificate() -> tokio_rustls::TlsConnector {
    static CONNECTOR: std::sync::OnceLock<tokio_rustls::TlsConnector> = std::sync::OnceLock::new();
    CONNECTOR
        .get_or_init(|| {
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            let config = rustls::ClientConfig::builder_with_provider(provider.clone())
                .with_safe_default_protocol_versions()
                .expect("TLS versions")
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider)))
                .with_no_client_auth();
            tokio_rustls::TlsConnector::from(Arc::new(config))
        })
        .clone()
}

#[derive(Debug)]
struct AnyCertificate(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &rustls::pki_types::CertificateDer<'_>,
        _intermediates: &[rustls::pki_types::CertificateDer<'_>],
        _server_name: &rustls::pki_types::ServerName<'_>,
        _ocsp_response: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
