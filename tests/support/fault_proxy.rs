//! A TCP proxy in front of one Redis master that injects network faults, one direction at a time:
//! added latency, held traffic (a partition that delays packets indefinitely: nothing is read, so nothing is
//! lost or reordered, and it all flows once released), cut connections and refused connections.

use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    ClientToServer,
    ServerToClient,
    Both,
}

impl Direction {
    fn covers(self, index: usize) -> bool {
        matches!(
            (self, index),
            (Self::Both, _) | (Self::ClientToServer, 0) | (Self::ServerToClient, 1)
        )
    }
}

#[derive(Clone, Copy, Debug, Default)]
struct Faults {
    /// Indexed by direction: 0 client→server, 1 server→client.
    latency: [Duration; 2],
    hold: [bool; 2],
    refuse: bool,
}

pub struct FaultProxy {
    addr: SocketAddr,
    faults: watch::Sender<Faults>,
    connections: Arc<Mutex<Vec<CancellationToken>>>,
    shutdown: CancellationToken,
}

impl FaultProxy {
    pub async fn start(upstream: SocketAddr) -> io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (faults, _) = watch::channel(Faults::default());
        let connections: Arc<Mutex<Vec<CancellationToken>>> = Arc::default();
        let shutdown = CancellationToken::new();
        tokio::spawn(accept(
            listener,
            upstream,
            faults.subscribe(),
            connections.clone(),
            shutdown.clone(),
        ));
        Ok(Self {
            addr,
            faults,
            connections,
            shutdown,
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn url(&self) -> String {
        format!("redis://{}", self.addr)
    }

    /// Delays every byte in `direction` by `latency` (order is kept; delays do not add up).
    pub fn set_latency(&self, direction: Direction, latency: Duration) {
        self.faults.send_modify(|faults| {
            for index in 0..2 {
                if direction.covers(index) {
                    faults.latency[index] = latency;
                }
            }
        });
    }

    /// Holds traffic in `direction` while `on`: connections stay open, nothing passes.
    pub fn hold(&self, direction: Direction, on: bool) {
        self.faults.send_modify(|faults| {
            for index in 0..2 {
                if direction.covers(index) {
                    faults.hold[index] = on;
                }
            }
        });
    }

    /// Accepts and immediately closes new connections while `on`.
    pub fn refuse(&self, on: bool) {
        self.faults.send_modify(|faults| faults.refuse = on);
    }

    /// Closes every current connection, both sides, at once.
    pub fn cut_all(&self) {
        let connections = std::mem::take(&mut *self.connections.lock().unwrap_or_else(|e| e.into_inner()));
        for connection in connections {
            connection.cancel();
        }
    }

    /// Removes every fault (but does not reopen cut connections).
    pub fn heal(&self) {
        self.faults.send_replace(Faults::default());
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

async fn accept(
    listener: TcpListener,
    upstream: SocketAddr,
    faults: watch::Receiver<Faults>,
    connections: Arc<Mutex<Vec<CancellationToken>>>,
    shutdown: CancellationToken,
) {
    loop {
        let client = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((client, _)) => client,
                Err(_) => continue,
            },
            () = shutdown.cancelled() => return,
        };
        if faults.borrow().refuse {
            drop(client);
            continue;
        }
        let connection = shutdown.child_token();
        {
            let mut live = connections.lock().unwrap_or_else(|e| e.into_inner());
            live.retain(|token| !token.is_cancelled());
            live.push(connection.clone());
        }
        tokio::spawn(relay(client, upstream, faults.clone(), connection));
    }
}

async fn relay(
    client: TcpStream,
    upstream: SocketAddr,
    faults: watch::Receiver<Faults>,
    stop: CancellationToken,
) {
    let server = tokio::select! {
        connected = TcpStream::connect(upstream) => match connected {
            Ok(server) => server,
            Err(_) => return,
        },
        () = stop.cancelled() => return,
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    let upstream_pump = pump(client_read, server_write, 0, faults.clone());
    let downstream_pump = pump(server_read, client_write, 1, faults);
    // Either side closing, or a cut, ends the whole connection: both sockets are dropped here.
    tokio::select! {
        () = upstream_pump => {}
        () = downstream_pump => {}
        () = stop.cancelled() => {}
    }
    stop.cancel();
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    direction: usize,
    mut faults: watch::Receiver<Faults>,
) {
    let (queue, mut due) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let reader = async move {
        let mut buffer = vec![0u8; 16 * 1024];
        loop {
            if faults.borrow_and_update().hold[direction] {
                // Held: read nothing, so the bytes wait in the kernel and flow in order once released.
                if faults.changed().await.is_err() {
                    return;
                }
                continue;
            }
            let read = tokio::select! {
                // A hold that arrives with the bytes wins: they must not slip through it.
                biased;
                changed = faults.changed() => {
                    if changed.is_err() { return; }
                    continue;
                }
                read = from.read(&mut buffer) => read,
            };
            match read {
                Ok(0) | Err(_) => return,
                Ok(count) => {
                    // Held while these bytes were read: they wait here, in order, until released.
                    while faults.borrow_and_update().hold[direction] {
                        if faults.changed().await.is_err() {
                            return;
                        }
                    }
                    let latency = faults.borrow().latency[direction];
                    if queue
                        .send((Instant::now() + latency, buffer[..count].to_vec()))
                        .is_err()
                    {
                        return;
                    }
                }
            }
        }
    };
    let writer = async move {
        while let Some((at, bytes)) = due.recv().await {
            tokio::time::sleep_until(at).await;
            if to.write_all(&bytes).await.is_err() {
                return;
            }
        }
    };
    tokio::select! {
        () = reader => {}
        () = writer => {}
    }
}
