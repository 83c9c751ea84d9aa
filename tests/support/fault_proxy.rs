//! A TCP proxy in front of one Redis master that injects network faults, one direction at a time:
//! added latency, held traffic (a partition that delays packets indefinitely: nothing is read, so nothing is
//! lost or reordered, and it all flows once released), stranded requests delivered late (a partition during which
//! the client gives up on its connection and opens another, while what it had sent is still in the network),
//! cut connections and refused connections.

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::tcp::OwnedWriteHalf;
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
    /// Client→server bytes are read and kept, not forwarded (see [`FaultProxy::strand`]).
    strand: bool,
    /// How long a new connection waits before anything passes (see [`FaultProxy::set_accept_delay`]).
    accept_delay: Duration,
}

/// One relayed connection's switches.
#[derive(Clone)]
struct Switches {
    /// Closes both sides.
    cut: CancellationToken,
    /// Closes the client side only; what the client sent while stranded goes to the server later.
    abandon: CancellationToken,
}

/// The server side of a connection whose client was abandoned, with what that client sent while stranded.
struct Orphan {
    bytes: Vec<u8>,
    server: OwnedWriteHalf,
    /// Its proxy's count of bytes delivered late.
    delivered: Arc<AtomicUsize>,
}

/// What stranding shares between the connections of one proxy, or of a group of proxies (see
/// [`FaultProxy::start_group`]).
struct Strands {
    /// How many proxies the group has.
    members: usize,
    /// Abandoned connections waiting for their stranded bytes to be delivered.
    orphans: Mutex<Vec<Orphan>>,
    /// Delivered orphans' server sides, kept open (a close could make the server drop what it has not read yet).
    delivered: Mutex<Vec<OwnedWriteHalf>>,
    /// The request whose answer, on a connection opened since the abandonment, the orphans are delivered before.
    trigger: Mutex<Option<Vec<u8>>>,
    /// The members whose newer connection has an answer to the trigger request to pass on.
    arrived: Mutex<std::collections::HashSet<usize>>,
    /// Whether the orphans were delivered: the answers waiting for it may pass.
    released: watch::Sender<bool>,
}

fn locked<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Strands {
    fn new(members: usize) -> Self {
        Self {
            members,
            orphans: Mutex::default(),
            delivered: Mutex::default(),
            trigger: Mutex::default(),
            arrived: Mutex::default(),
            released: watch::Sender::new(false),
        }
    }

    fn trigger_in(&self, bytes: &[u8]) -> bool {
        locked(&self.trigger)
            .as_deref()
            .is_some_and(|trigger| bytes.windows(trigger.len()).any(|window| window == trigger))
    }

    /// `member` has an answer to the trigger request to pass on: it waits until every member of the group has one,
    /// and the last to arrive first writes every orphan's stranded bytes to its server.
    async fn arrive(&self, member: usize) {
        let mut released = self.released.subscribe();
        let completes = {
            let mut arrived = locked(&self.arrived);
            arrived.insert(member) && arrived.len() == self.members
        };
        if completes {
            self.deliver().await;
            self.released.send_replace(true);
        }
        while !*released.borrow_and_update() {
            if released.changed().await.is_err() {
                return;
            }
        }
    }

    /// Writes every orphan's stranded bytes to its server, and waits until they are written.
    async fn deliver(&self) {
        let orphans = std::mem::take(&mut *locked(&self.orphans));
        for Orphan {
            bytes,
            mut server,
            delivered,
        } in orphans
        {
            if server.write_all(&bytes).await.is_ok() && server.flush().await.is_ok() {
                delivered.fetch_add(bytes.len(), Ordering::SeqCst);
            }
            locked(&self.delivered).push(server);
        }
    }
}

pub struct FaultProxy {
    addr: SocketAddr,
    faults: watch::Sender<Faults>,
    connections: Arc<Mutex<Vec<Switches>>>,
    strands: Arc<Strands>,
    delivered_late: Arc<AtomicUsize>,
    shutdown: CancellationToken,
}

impl FaultProxy {
    pub async fn start(upstream: SocketAddr) -> io::Result<Self> {
        Self::start_member(upstream, Arc::new(Strands::new(1)), 0).await
    }

    /// One proxy per upstream, whose stranded requests reach their masters together (see
    /// [`FaultProxy::abandon_stranded`]): as one partition cutting a client off from several masters.
    pub async fn start_group(upstreams: &[SocketAddr]) -> io::Result<Vec<Self>> {
        let strands = Arc::new(Strands::new(upstreams.len()));
        let mut proxies = Vec::with_capacity(upstreams.len());
        for (member, upstream) in upstreams.iter().enumerate() {
            proxies.push(Self::start_member(*upstream, strands.clone(), member).await?);
        }
        Ok(proxies)
    }

    async fn start_member(upstream: SocketAddr, strands: Arc<Strands>, member: usize) -> io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (faults, _) = watch::channel(Faults::default());
        let connections: Arc<Mutex<Vec<Switches>>> = Arc::default();
        let delivered_late: Arc<AtomicUsize> = Arc::default();
        let shutdown = CancellationToken::new();
        let member = Member {
            strands: strands.clone(),
            index: member,
            delivered: delivered_late.clone(),
        };
        tokio::spawn(accept(
            listener,
            upstream,
            faults.subscribe(),
            connections.clone(),
            member,
            shutdown.clone(),
        ));
        Ok(Self {
            addr,
            faults,
            connections,
            strands,
            delivered_late,
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

    /// Strands what clients send while `on`: read (so the client's writes complete) and kept in order, never
    /// forwarded, so requests get no answer. Turned off, what was kept flows on first; see
    /// [`FaultProxy::abandon_stranded`] for it to arrive after something newer instead.
    pub fn strand(&self, on: bool) {
        self.faults.send_modify(|faults| faults.strand = on);
    }

    /// Closes the client side of every current connection (the client sees it dropped and opens a new one) and
    /// stops stranding for the connections opened from now on. What each abandoned client sent while stranded
    /// still reaches the server, on its old connection, late: once a newer connection has an answer to a request
    /// containing `deliver_before_reply_to` to pass on (on every proxy of the group, which wait for each other),
    /// just before that answer is passed on. So each server runs those old requests right after it answered a
    /// newer one, and before the client can act on the answers: as TCP delivers segments still in flight from a
    /// connection their client has already given up.
    /// Abandon every proxy of a group together, before the client opens new connections.
    pub fn abandon_stranded(&self, deliver_before_reply_to: &[u8]) {
        *locked(&self.strands.trigger) = Some(deliver_before_reply_to.to_vec());
        if self.strands.released.send_replace(false) {
            locked(&self.strands.arrived).clear();
        }
        for switches in std::mem::take(&mut *locked(&self.connections)) {
            switches.abandon.cancel();
        }
        self.faults.send_modify(|faults| faults.strand = false);
    }

    /// How many stranded bytes reached the server late (see [`FaultProxy::abandon_stranded`]).
    pub fn delivered_late(&self) -> usize {
        self.delivered_late.load(Ordering::SeqCst)
    }

    /// Accepts and immediately closes new connections while `on`.
    /// Makes every new connection take `delay` to open: nothing passes either way until then (a master behind a
    /// slow DNS answer or a TLS handshake across regions). Open connections are not affected.
    pub fn set_accept_delay(&self, delay: Duration) {
        self.faults.send_modify(|faults| faults.accept_delay = delay);
    }

    pub fn refuse(&self, on: bool) {
        self.faults.send_modify(|faults| faults.refuse = on);
    }

    /// Closes every current connection, both sides, at once.
    pub fn cut_all(&self) {
        for switches in std::mem::take(&mut *locked(&self.connections)) {
            switches.cut.cancel();
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

/// A proxy's place in its group.
#[derive(Clone)]
struct Member {
    strands: Arc<Strands>,
    index: usize,
    delivered: Arc<AtomicUsize>,
}

async fn accept(
    listener: TcpListener,
    upstream: SocketAddr,
    faults: watch::Receiver<Faults>,
    connections: Arc<Mutex<Vec<Switches>>>,
    member: Member,
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
        let switches = Switches {
            cut: shutdown.child_token(),
            abandon: CancellationToken::new(),
        };
        {
            let mut live = locked(&connections);
            live.retain(|switches| !switches.cut.is_cancelled() && !switches.abandon.is_cancelled());
            live.push(switches.clone());
        }
        tokio::spawn(relay(client, upstream, faults.clone(), switches, member.clone()));
    }
}

async fn relay(
    client: TcpStream,
    upstream: SocketAddr,
    faults: watch::Receiver<Faults>,
    switches: Switches,
    member: Member,
) {
    let accept_delay = faults.borrow().accept_delay;
    if !accept_delay.is_zero() {
        tokio::select! {
            () = tokio::time::sleep(accept_delay) => {}
            () = switches.cut.cancelled() => return,
        }
    }
    let server = tokio::select! {
        connected = TcpStream::connect(upstream) => match connected {
            Ok(server) => server,
            Err(_) => return,
        },
        () = switches.cut.cancelled() => return,
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (client_read, client_write) = client.into_split();
    let (server_read, mut server_write) = server.into_split();
    let stranded = Arc::new(Mutex::new(Vec::new()));
    // Whether this connection sent the request whose answer the orphans are delivered before.
    let sent_trigger = Arc::new(AtomicBool::new(false));
    let upstream_side = Side::Upstream {
        stranded: stranded.clone(),
        abandoned: switches.abandon.clone(),
        sent_trigger: sent_trigger.clone(),
        strands: member.strands.clone(),
    };
    let downstream_side = Side::Downstream {
        sent_trigger,
        member: member.clone(),
    };
    let abandoned = {
        let upstream_pump = pump(client_read, &mut server_write, 0, faults.clone(), upstream_side);
        let downstream_pump = pump(server_read, client_write, 1, faults, downstream_side);
        // Either side closing, or a cut, ends the whole connection: both sockets are dropped here. An abandonment
        // drops the client's side only (its halves go with the pumps).
        tokio::select! {
            () = upstream_pump => false,
            () = downstream_pump => false,
            () = switches.cut.cancelled() => false,
            () = switches.abandon.cancelled() => true,
        }
    };
    if !abandoned {
        switches.cut.cancel();
        return;
    }
    let bytes = std::mem::take(&mut *locked(&stranded));
    locked(&member.strands.orphans).push(Orphan {
        bytes,
        server: server_write,
        delivered: member.delivered,
    });
}

/// What a pump does besides relaying, by direction.
enum Side {
    /// Client to server: keeps what arrives while stranded, and notes the trigger request passing.
    Upstream {
        stranded: Arc<Mutex<Vec<u8>>>,
        abandoned: CancellationToken,
        sent_trigger: Arc<AtomicBool>,
        strands: Arc<Strands>,
    },
    /// Server to client: delivers the orphans before the answer to the trigger request.
    Downstream {
        sent_trigger: Arc<AtomicBool>,
        member: Member,
    },
}

async fn pump<R, W>(mut from: R, mut to: W, direction: usize, mut faults: watch::Receiver<Faults>, side: Side)
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let (queue, mut due) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let side = &side;
    let reader = async {
        let mut buffer = vec![0u8; 16 * 1024];
        loop {
            if let Side::Upstream {
                stranded, abandoned, ..
            } = side
                && !faults.borrow().strand
                && !abandoned.is_cancelled()
            {
                // Stranding ended without an abandonment: what was kept flows on first.
                let kept = std::mem::take(&mut *locked(stranded));
                if !kept.is_empty() && queue.send((Instant::now(), kept)).is_err() {
                    return;
                }
            }
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
                    let mut bytes = buffer[..count].to_vec();
                    if let Side::Upstream {
                        stranded,
                        abandoned,
                        sent_trigger,
                        strands,
                    } = side
                    {
                        if faults.borrow().strand {
                            locked(stranded).extend_from_slice(&bytes);
                            continue;
                        }
                        if abandoned.is_cancelled() {
                            // Its stranded bytes are the orphan's now, delivered late.
                            return;
                        }
                        // Stranding ended without an abandonment: what was kept goes first.
                        let kept = std::mem::take(&mut *locked(stranded));
                        if !kept.is_empty() {
                            bytes = [kept, bytes].concat();
                        }
                        if strands.trigger_in(&bytes) {
                            sent_trigger.store(true, Ordering::SeqCst);
                        }
                    }
                    let latency = faults.borrow().latency[direction];
                    if queue.send((Instant::now() + latency, bytes)).is_err() {
                        return;
                    }
                }
            }
        }
    };
    let writer = async {
        while let Some((at, bytes)) = due.recv().await {
            tokio::time::sleep_until(at).await;
            if let Side::Downstream { sent_trigger, member } = side
                && sent_trigger.load(Ordering::SeqCst)
            {
                member.strands.arrive(member.index).await;
            }
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
