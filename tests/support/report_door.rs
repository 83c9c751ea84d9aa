//! Doors in front of a reports port, for tests: one that holds reports in flight until it is opened, and a
//! server with a key of its own (an impostor at the address status names) behind one.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use redlock_operator::report_channel::identity::{Identity, KeySource};
use redlock_operator::report_channel::server;
use tokio_util::sync::CancellationToken;

/// A door in front of the operator's report endpoint, for a test to hold reports in flight: connections are
/// accepted (and counted) at once, and relayed once the door is opened; holding it silences the connections it
/// relays as well.
pub struct ReportDoor {
    addr: std::net::SocketAddr,
    accepted: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    to: tokio::sync::watch::Sender<Option<std::net::SocketAddr>>,
}

impl ReportDoor {
    pub async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("door");
        let addr = listener.local_addr().expect("door address");
        let accepted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (to, opened) = tokio::sync::watch::channel(None::<std::net::SocketAddr>);
        let count = accepted.clone();
        tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let mut opened = opened.clone();
                tokio::spawn(async move {
                    let Ok(Some(upstream)) = opened.wait_for(Option::is_some).await.map(|to| *to) else {
                        return;
                    };
                    if let Ok(mut server) = tokio::net::TcpStream::connect(upstream).await {
                        tokio::select! {
                            _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                            // Held: a connection under way (a holder's kept one) goes silent both ways, as
                            // through a cut route, until the door opens again; then it is closed.
                            _ = async { opened.wait_for(Option::is_none).await.is_ok() } => {
                                let _ = opened.wait_for(Option::is_some).await.is_ok();
                            }
                        }
                    }
                });
            }
        });
        Self { addr, accepted, to }
    }

    pub fn url(&self) -> String {
        format!("https://{}/v1/stopped", self.addr)
    }

    pub fn accepted(&self) -> usize {
        self.accepted.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Relays what is held, and all that comes, to `upstream`.
    pub fn open_to(&self, upstream: std::net::SocketAddr) {
        self.to.send_replace(Some(upstream));
    }

    /// Holds what comes from now on (until opened again), and silences the connections relayed so far (closed
    /// once it opens again).
    pub fn hold(&self) {
        self.to.send_replace(None);
    }
}

/// A reports server with a certificate of its own that answers every request, behind a door that counts the
/// connections made to it.
pub struct Impostor {
    door: ReportDoor,
    requests: Arc<AtomicUsize>,
    stop: CancellationToken,
    _server: tokio::task::JoinHandle<()>,
}

impl Impostor {
    pub async fn start() -> Self {
        let bound = server::bind("127.0.0.1:0".parse().expect("addr"))
            .await
            .expect("bind");
        let addr = bound.local_addr;
        let requests = Arc::new(AtomicUsize::new(0));
        let counted = requests.clone();
        let routes = axum::Router::new().fallback(move || async move {
            counted.fetch_add(1, Ordering::SeqCst);
            "taken"
        });
        let own_key = Identity::new(&KeySource::Generated, &[]).expect("a key");
        let stop = CancellationToken::new();
        let server = bound.serve_reports(own_key.server_config, routes, stop.clone());
        let door = ReportDoor::start().await;
        door.open_to(addr);
        Self {
            door,
            requests,
            stop,
            _server: server,
        }
    }

    /// Its address, as status would show it.
    pub fn url(&self) -> String {
        self.door.url()
    }

    /// Connections made to it.
    pub fn connections(&self) -> usize {
        self.door.accepted()
    }

    /// Requests that reached it over TLS.
    pub fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }
}

impl Drop for Impostor {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}
