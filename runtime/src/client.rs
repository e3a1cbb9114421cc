//! Blocking data-plane client used by worker threads (plain `std::net`: workers are compute
//! threads, not async tasks), and the worker transport over it.
//!
//! Requests to one server are pipelined: a worker writes the pushes (or pulls) of every partition
//! a server holds, flushes once, then reads the replies in order.

use std::io::{BufReader, BufWriter, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use thiserror::Error;

use crate::app::{TableId, TableSpec};
use crate::frame::{FrameError, HEADER_BYTES, body_len};
use crate::handshake;
use crate::message::{Message, Values};
use crate::partition::{PartitionId, PartitionMap};
use crate::snapshot::ParamSnapshot;
use crate::tls::JobTls;
use crate::worker::{PartitionView, RegisterBatch, Transport, WorkerError};

/// Errors of the data-plane client.
#[derive(Debug, Error)]
pub enum ClientError {
    /// Connecting to a server failed.
    #[error("connecting to {addr} failed: {source}")]
    Connect {
        /// The server address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// Reading or writing a connection failed (includes the server closing it).
    #[error("exchanging frames with {addr} failed: {source}")]
    Exchange {
        /// The server address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// The server sent bytes that are not a valid frame.
    #[error("decoding a frame from {addr} failed: {source}")]
    Decode {
        /// The server address.
        addr: SocketAddr,
        /// Why.
        source: FrameError,
    },
    /// The server answered a request with an error.
    #[error("server {addr} refused the request ({category}): {message}")]
    Refused {
        /// The server address.
        addr: SocketAddr,
        /// The error's category.
        category: String,
        /// The error's description.
        message: String,
    },
    /// The server answered with an unexpected message.
    #[error("server {addr} answered {got} where {expected} was expected")]
    Unexpected {
        /// The server address.
        addr: SocketAddr,
        /// The message kind received.
        got: &'static str,
        /// The message kind expected.
        expected: &'static str,
    },
    /// The server did not prove it holds the job key ([`crate::handshake`]).
    #[error(
        "server {addr} did not prove it holds the job key (unauthenticated: a wrong or stale \
         secret on one side, or not this job's server)"
    )]
    Unauthenticated {
        /// The server address.
        addr: SocketAddr,
    },
    /// The TLS handshake with the server failed ([`crate::tls`]).
    #[error("TLS with server {addr} failed: {reason}")]
    Tls {
        /// The server address.
        addr: SocketAddr,
        /// Why, in words (never the key).
        reason: String,
    },
    /// The partition map names a node whose address is unknown.
    #[error("no address for node {node}")]
    LookupNode {
        /// The node.
        node: u32,
    },
}

impl ClientError {
    /// Static label for metrics.
    pub fn category(&self) -> &'static str {
        match self {
            ClientError::Connect { .. } => "connect",
            ClientError::Exchange { .. } => "exchange",
            ClientError::Decode { .. } => "decode",
            ClientError::Refused { .. } => "refused",
            ClientError::Unexpected { .. } => "unexpected",
            ClientError::Unauthenticated { .. } => "unauthenticated",
            ClientError::Tls { .. } => "tls",
            ClientError::LookupNode { .. } => "lookup_node",
        }
    }
}

/// What a client needs to answer the server's challenge ([`crate::handshake`]).
#[derive(Debug)]
struct Challenged {
    key: Vec<u8>,
    node: u32,
    nonce: [u8; handshake::NONCE_BYTES],
}

/// An authenticated connection to one data-plane server.
#[derive(Debug)]
pub struct Connection {
    addr: SocketAddr,
    /// The socket itself (a duplicate), to probe and to cut it whatever runs over it.
    socket: TcpStream,
    reader: BufReader<Half>,
    writer: BufWriter<Half>,
    out: Vec<u8>,
    body: Vec<u8>,
    max_frame_bytes: usize,
    /// The hello is out and the server's challenge not answered yet: the next send or read
    /// answers it first ([`Connection::prove`]).
    challenge: Option<Challenged>,
    /// The proof is out and its welcome not read yet: the next read takes it first, so a
    /// request can follow the proof without waiting a round trip for the welcome.
    welcome_pending: bool,
    /// The [`Severance`] that can cut this connection, while it is open.
    watched: Option<Watch>,
}

impl Connection {
    /// Connects to `addr` as `config` says (over TLS when it has a [`JobTls`]) and proves the
    /// job key; `config.timeout` bounds every read.
    pub fn connect(addr: SocketAddr, config: &ClientConfig) -> Result<Self, ClientError> {
        Self::open(addr, config)?.welcomed()
    }

    /// Connects and sends the hello without waiting for the welcome ([`Connection::welcomed`]),
    /// so several connections can be opened in one round trip (plus the TLS handshake's).
    fn open(addr: SocketAddr, config: &ClientConfig) -> Result<Self, ClientError> {
        let timeout = config.timeout;
        let stream = TcpStream::connect_timeout(&addr, timeout.min(Duration::from_secs(30)))
            .map_err(|source| ClientError::Connect { addr, source })?;
        let exchange = |source| ClientError::Exchange { addr, source };
        stream.set_nodelay(true).map_err(exchange)?;
        stream.set_read_timeout(Some(timeout)).map_err(exchange)?;
        // A server whose instance vanished (no FIN, no RST) while the worker waited for its
        // answer fails the request within a minute, not at the read timeout (10 minutes by
        // default).
        crate::server::probe_idle_peer(&stream, crate::server::DEFAULT_DEAD_PEER_AFTER)
            .map_err(exchange)?;
        let socket = stream.try_clone().map_err(exchange)?;
        let (reader, writer) = match &config.tls {
            None => (
                Half::Plain(stream.try_clone().map_err(exchange)?),
                Half::Plain(stream),
            ),
            Some(tls) => {
                let session = tls_handshake(addr, tls, stream)?;
                let shared = Arc::new(parking_lot::Mutex::new(session));
                (Half::Tls(shared.clone()), Half::Tls(shared))
            }
        };
        let mut connection = Self {
            addr,
            socket,
            reader: BufReader::with_capacity(1 << 16, reader),
            writer: BufWriter::with_capacity(1 << 16, writer),
            out: Vec::new(),
            body: Vec::new(),
            max_frame_bytes: config.max_frame_bytes,
            challenge: None,
            welcome_pending: true,
            watched: None,
        };
        let nonce = handshake::nonce();
        connection.queue(&Message::Hello {
            node: config.node,
            nonce: &nonce,
        })?;
        connection.flush()?;
        connection.challenge = Some(Challenged {
            key: config.secret.clone(),
            node: config.node,
            nonce,
        });
        Ok(connection)
    }

    /// Answers the server's challenge and waits for its welcome to the hello
    /// [`Connection::open`] sent.
    fn welcomed(mut self) -> Result<Self, ClientError> {
        self.prove()?;
        self.await_welcome()?;
        Ok(self)
    }

    /// Reads the server's challenge to the hello, if not yet answered: checks the server's
    /// proof (a server that does not hold the job key is refused before any request reaches
    /// it) and sends the client's. The welcome is read later ([`Connection::await_welcome`]).
    fn prove(&mut self) -> Result<(), ClientError> {
        let Some(challenged) = self.challenge.take() else {
            return Ok(());
        };
        let addr = self.addr;
        self.read_body()?;
        let proof = match Message::decode(&self.body)
            .map_err(|source| ClientError::Decode { addr, source })?
        {
            Message::Challenge { nonce, proof }
                if handshake::verify_server(
                    &challenged.key,
                    challenged.node,
                    &challenged.nonce,
                    nonce,
                    proof,
                ) =>
            {
                handshake::client_proof(&challenged.key, challenged.node, &challenged.nonce, nonce)
            }
            Message::Challenge { .. } => return Err(ClientError::Unauthenticated { addr }),
            Message::Error { category, message } => {
                return Err(ClientError::Refused {
                    addr,
                    category: category.to_owned(),
                    message: message.to_owned(),
                });
            }
            other => return Err(unexpected(addr, &other, "challenge")),
        };
        self.queue(&Message::Proof { proof: &proof })?;
        self.flush()
    }

    /// Reads the welcome to the hello if it is still pending (a refused hello is an error here).
    fn await_welcome(&mut self) -> Result<(), ClientError> {
        if !std::mem::replace(&mut self.welcome_pending, false) {
            return Ok(());
        }
        let addr = self.addr;
        match self.recv()? {
            Message::Welcome => Ok(()),
            other => Err(unexpected(addr, &other, "welcome")),
        }
    }

    /// Queues a message (sent on [`Connection::flush`] or when the buffer fills), after the
    /// answer to the server's challenge if that is still due.
    pub fn send(&mut self, message: &Message<'_>) -> Result<(), ClientError> {
        self.prove()?;
        self.queue(message)
    }

    /// Queues a message as it is.
    fn queue(&mut self, message: &Message<'_>) -> Result<(), ClientError> {
        self.out.clear();
        message.encode(&mut self.out);
        self.writer
            .write_all(&self.out)
            .map_err(|source| ClientError::Exchange {
                addr: self.addr,
                source,
            })
    }

    /// Sends everything queued.
    pub fn flush(&mut self) -> Result<(), ClientError> {
        self.writer.flush().map_err(|source| ClientError::Exchange {
            addr: self.addr,
            source,
        })
    }

    /// Reads the next message (after the welcome, if that is still pending); a server `Error`
    /// becomes [`ClientError::Refused`].
    pub fn recv(&mut self) -> Result<Message<'_>, ClientError> {
        self.prove()?;
        self.await_welcome()?;
        let addr = self.addr;
        self.read_body()?;
        match Message::decode(&self.body).map_err(|source| ClientError::Decode { addr, source })? {
            Message::Error { category, message } => Err(ClientError::Refused {
                addr,
                category: category.to_owned(),
                message: message.to_owned(),
            }),
            message => Ok(message),
        }
    }

    /// Reads the next frame's body into `self.body`.
    fn read_body(&mut self) -> Result<(), ClientError> {
        let addr = self.addr;
        let mut header = [0u8; HEADER_BYTES];
        self.reader
            .read_exact(&mut header)
            .map_err(|source| ClientError::Exchange { addr, source })?;
        let len = body_len(&header, self.max_frame_bytes)
            .map_err(|source| ClientError::Decode { addr, source })?;
        self.body.resize(len, 0);
        self.reader
            .read_exact(&mut self.body)
            .map_err(|source| ClientError::Exchange { addr, source })
    }

    /// The server's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Fails a request whose answer is awaited once the server's kernel has not answered
    /// keepalive probes for about `after` ([`crate::server::probe_idle_peer`]; connections
    /// start with [`crate::server::DEFAULT_DEAD_PEER_AFTER`]).
    pub fn probe_idle_peer(&self, after: Duration) -> Result<(), ClientError> {
        crate::server::probe_idle_peer(&self.socket, after).map_err(|source| {
            ClientError::Exchange {
                addr: self.addr,
                source,
            }
        })
    }

    /// Sizes both ends' buffers for frames of `bytes` and touches them once ([`Message::Warm`]
    /// to the server, then this side's), so the first large exchange does not page in fresh
    /// memory. Paced: blocks the thread for about 4 ms per MiB on each side.
    pub fn warm(&mut self, bytes: usize) -> Result<(), ClientError> {
        self.send(&Message::Warm {
            bytes: bytes as u64,
        })?;
        self.flush()?;
        let addr = self.addr;
        match self.recv()? {
            Message::Warmed => {}
            other => return Err(unexpected(addr, &other, "warmed")),
        }
        let bytes = HEADER_BYTES + crate::server::warm_limit(bytes as u64, self.max_frame_bytes);
        crate::server::warm_vec(&mut self.out, bytes);
        crate::server::warm_vec(&mut self.body, bytes);
        Ok(())
    }
}

/// A client's TLS session over its socket.
type TlsSession = rustls::StreamOwned<rustls::ClientConnection, TcpStream>;

/// One direction of a connection's byte stream: a duplicate of the socket, or the TLS session
/// both directions share (a connection is used by one thread at a time, so the lock is never
/// contended).
#[derive(Debug)]
enum Half {
    Plain(TcpStream),
    Tls(Arc<parking_lot::Mutex<TlsSession>>),
}

impl Read for Half {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Half::Plain(stream) => stream.read(buf),
            Half::Tls(session) => session.lock().read(buf),
        }
    }
}

impl Write for Half {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Half::Plain(stream) => stream.write(buf),
            Half::Tls(session) => session.lock().write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Half::Plain(stream) => stream.flush(),
            Half::Tls(session) => session.lock().flush(),
        }
    }
}

/// Runs the TLS handshake with the server at `addr` to its end, so a server that is not the
/// job's, or that does not speak TLS, fails the connect with a reason rather than a later read.
fn tls_handshake(
    addr: SocketAddr,
    tls: &JobTls,
    mut stream: TcpStream,
) -> Result<TlsSession, ClientError> {
    let mut session = rustls::ClientConnection::new(tls.client.clone(), JobTls::server_name())
        .map_err(|error| ClientError::Tls {
            addr,
            reason: error.to_string(),
        })?;
    while session.is_handshaking() {
        if let Err(source) = session.complete_io(&mut stream) {
            return Err(tls_error(addr, source));
        }
    }
    Ok(rustls::StreamOwned::new(session, stream))
}

/// The error of a failed TLS handshake: a server without the job's key is unauthenticated; one
/// that answers with something other than TLS is most likely a plaintext server.
fn tls_error(addr: SocketAddr, source: std::io::Error) -> ClientError {
    use std::io::ErrorKind;
    let Some(error) = source
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
    else {
        return match source.kind() {
            // A plaintext server closes on the first byte of a TLS client.
            ErrorKind::UnexpectedEof
            | ErrorKind::ConnectionReset
            | ErrorKind::ConnectionAborted => ClientError::Tls {
                addr,
                reason: format!(
                    "the server closed the connection in the handshake ({source}): is its \
                         transport security \"none\" where this side's is \"tls\"?"
                ),
            },
            _ => ClientError::Exchange { addr, source },
        };
    };
    match error {
        rustls::Error::InvalidCertificate(_) => ClientError::Unauthenticated { addr },
        rustls::Error::InvalidMessage(_) | rustls::Error::InappropriateMessage { .. } => {
            ClientError::Tls {
                addr,
                reason: format!(
                    "{error} (the server does not speak TLS: is its transport security \"none\" \
                     where this side's is \"tls\"?)"
                ),
            }
        }
        other => ClientError::Tls {
            addr,
            reason: other.to_string(),
        },
    }
}

/// Connections that can be cut from another thread: a worker blocked on a request to a peer
/// that hangs (a stopped process, a frozen VM: its kernel keeps the connection open and answers
/// nothing) waits out its read timeout, and nothing else reaches it. [`Severance::sever`] shuts
/// down every connection watched, so such a read fails at once; connections watched afterwards
/// are cut as they are watched. A worker pool's transports are watched by the pool's severance,
/// which an abandoned segment's node severs when its workers do not stop
/// (`control::Agent`, [`ControlRequest::Abandon`](crate::control::ControlRequest::Abandon)).
#[derive(Debug, Default)]
pub struct Severance {
    watched: parking_lot::Mutex<Watched>,
}

/// What a [`Severance`] holds, under one lock.
#[derive(Debug, Default)]
struct Watched {
    /// A duplicate of each watched connection's socket, by watch id.
    streams: std::collections::BTreeMap<u64, TcpStream>,
    /// The next watch id.
    next: u64,
    /// Set once severed: connections watched from then on are cut as they are watched.
    severed: bool,
}

/// A connection's entry in a [`Severance`]: dropped with the connection, which closes the
/// duplicate socket (so the connection really closes).
#[derive(Debug)]
struct Watch {
    set: Arc<Severance>,
    id: u64,
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.set.watched.lock().streams.remove(&self.id);
    }
}

impl Severance {
    /// Watches `connection` (once; a connection watched by another severance moves here).
    pub fn watch(self: &Arc<Self>, connection: &mut Connection) -> Result<(), ClientError> {
        if connection
            .watched
            .as_ref()
            .is_some_and(|w| Arc::ptr_eq(&w.set, self))
        {
            return Ok(());
        }
        let addr = connection.addr;
        let duplicate = connection
            .socket
            .try_clone()
            .map_err(|source| ClientError::Exchange { addr, source })?;
        let mut watched = self.watched.lock();
        if watched.severed {
            let _ = duplicate.shutdown(std::net::Shutdown::Both);
        }
        let id = watched.next;
        watched.next += 1;
        watched.streams.insert(id, duplicate);
        drop(watched);
        connection.watched = Some(Watch {
            set: self.clone(),
            id,
        });
        Ok(())
    }

    /// Shuts down every connection watched (and every one watched from now on); returns how
    /// many were open.
    pub fn sever(&self) -> usize {
        let mut watched = self.watched.lock();
        watched.severed = true;
        for stream in watched.streams.values() {
            let _ = stream.shutdown(std::net::Shutdown::Both);
        }
        watched.streams.len()
    }

    /// How many connections are watched now.
    pub fn len(&self) -> usize {
        self.watched.lock().streams.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Closes `connections` on a thread of their own: freeing a connection whose buffers grew to
/// large frames takes 0.3-1.6 ms, which a worker switching servers at a boundary would wait.
fn close_in_background(connections: Vec<Connection>) {
    if connections.is_empty() {
        return;
    }
    // Without a thread the closure, and with it the connections, is dropped here instead.
    let _ = std::thread::Builder::new()
        .name("close-connections".into())
        .spawn(move || drop(connections));
}

/// Connections opened ahead of the segment that uses them: a joining node's server is started
/// and every worker's connection to it opened, authenticated and warmed while the others train
/// (`elastic::LocalFleet::prepare`). At the switch a worker's transport takes its connection
/// from here instead of connecting.
#[derive(Debug, Default)]
pub struct PreOpened {
    connections: parking_lot::Mutex<Vec<(u32, Connection)>>,
    /// `ebbflow_runtime_pre_opened_connections_total`, when counted.
    counter: Option<prometheus::IntCounterVec>,
}

impl PreOpened {
    /// An empty stash that counts its connections on `metrics`.
    pub fn counted(metrics: &crate::metrics::RuntimeMetrics) -> Self {
        Self {
            connections: parking_lot::Mutex::new(Vec::new()),
            counter: Some(metrics.pre_opened_connections.clone()),
        }
    }

    /// How many connections workers took from stashes counted on the same metrics (0 when not
    /// counted).
    pub fn taken(&self) -> u64 {
        self.counter
            .as_ref()
            .map_or(0, |counter| counter.with_label_values(&["taken"]).get())
    }

    fn count(&self, outcome: &str, n: usize) {
        if let Some(counter) = &self.counter {
            counter.with_label_values(&[outcome]).inc_by(n as u64);
        }
    }

    /// Opens worker `worker`'s connection to `addr` (waiting for the welcome) and warms it for
    /// frames of `frame_bytes`; it waits here until that worker's transport needs `addr`.
    pub fn open(
        &self,
        worker: u32,
        addr: SocketAddr,
        config: &ClientConfig,
        frame_bytes: usize,
    ) -> Result<(), ClientError> {
        let mut connection = Connection::connect(addr, config)?;
        connection.warm(frame_bytes)?;
        self.connections.lock().push((worker, connection));
        self.count("opened", 1);
        Ok(())
    }

    /// Worker `worker`'s pre-opened connection to `addr`, if there is one.
    fn take(&self, worker: u32, addr: SocketAddr) -> Option<Connection> {
        let mut connections = self.connections.lock();
        let index = connections
            .iter()
            .position(|(w, c)| *w == worker && c.addr() == addr)?;
        let connection = connections.swap_remove(index).1;
        self.count("taken", 1);
        Some(connection)
    }

    /// Closes every pre-opened connection to `addr` (its node left before the switch).
    pub fn forget(&self, addr: SocketAddr) {
        self.forget_unless(|to| to != addr);
    }

    /// Closes every pre-opened connection to an address `keep` refuses (nodes that are no
    /// longer members of the job).
    pub fn forget_unless(&self, keep: impl Fn(SocketAddr) -> bool) {
        let mut connections = self.connections.lock();
        let before = connections.len();
        connections.retain(|(_, c)| keep(c.addr()));
        self.count("closed", before - connections.len());
    }

    /// How many connections wait to be taken.
    pub fn len(&self) -> usize {
        self.connections.lock().len()
    }

    /// Whether none waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn unexpected(addr: SocketAddr, got: &Message<'_>, expected: &'static str) -> ClientError {
    ClientError::Unexpected {
        addr,
        got: got.kind(),
        expected,
    }
}

/// Where to find each node's data-plane server.
pub type NodeAddrs = std::collections::BTreeMap<u32, SocketAddr>;

/// Connection settings shared by a process's clients.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// The job's shared secret.
    pub secret: Vec<u8>,
    /// This node's id (for the server's logs).
    pub node: u32,
    /// Frame cap.
    pub max_frame_bytes: usize,
    /// Read timeout (must exceed the longest SSP wait).
    pub timeout: Duration,
    /// TLS keyed by the job key ([`crate::tls`]); `None`: plain TCP.
    pub tls: Option<Arc<JobTls>>,
}

/// Worker transport over TCP: one connection per server node, routes by the partition map.
#[derive(Debug)]
pub(crate) struct RemoteTransport {
    connections: Vec<Connection>,
    /// Per partition: (connection index, epoch).
    routes: Vec<(usize, u64)>,
    config: ClientConfig,
    /// The worker this transport serves and where its pre-opened connections wait.
    pre_opened: Option<(u32, Arc<PreOpened>)>,
    /// Watches every connection the transport holds (its worker pool's).
    severance: Option<Arc<Severance>>,
    /// The frame buffers (encoding, body) every connection uses for pushes and pulls
    /// ([`RemoteTransport::on_connection`]).
    buffers: (Vec<u8>, Vec<u8>),
}

impl RemoteTransport {
    /// Connects to every server in `map`.
    pub(crate) fn connect(
        map: &PartitionMap,
        addrs: &NodeAddrs,
        config: &ClientConfig,
    ) -> Result<Self, ClientError> {
        Self::connect_as(map, addrs, config, None, None)
    }

    /// [`RemoteTransport::connect`] for worker `worker`, taking the connections pre-opened for
    /// it from `pre_opened` (now and at every retarget) instead of connecting, every
    /// connection it holds watched by `severance`.
    pub(crate) fn connect_as(
        map: &PartitionMap,
        addrs: &NodeAddrs,
        config: &ClientConfig,
        pre_opened: Option<(u32, Arc<PreOpened>)>,
        severance: Option<Arc<Severance>>,
    ) -> Result<Self, ClientError> {
        let mut transport = Self {
            connections: Vec::new(),
            routes: Vec::new(),
            config: config.clone(),
            pre_opened,
            severance,
            buffers: (Vec::new(), Vec::new()),
        };
        transport.retarget(map, addrs)?;
        Ok(transport)
    }

    /// Re-routes to `map`: keeps the connections to servers still in use, opens the new ones,
    /// closes the rest. Returns the partitions whose server address or epoch changed.
    pub(crate) fn retarget(
        &mut self,
        map: &PartitionMap,
        addrs: &NodeAddrs,
    ) -> Result<Vec<PartitionId>, ClientError> {
        let before: Vec<(SocketAddr, u64)> = self
            .routes
            .iter()
            .map(|&(index, epoch)| (self.connections[index].addr(), epoch))
            .collect();
        let mut old: Vec<Option<Connection>> = std::mem::take(&mut self.connections)
            .into_iter()
            .map(Some)
            .collect();
        let owners = map.owners();
        let mut connections = Vec::with_capacity(owners.len());
        let mut opened = Vec::new();
        for owner in &owners {
            let addr = *addrs
                .get(owner)
                .ok_or(ClientError::LookupNode { node: *owner })?;
            let kept = old
                .iter_mut()
                .find(|c| c.as_ref().is_some_and(|c| c.addr() == addr))
                .and_then(Option::take);
            let pre_opened = || {
                let (worker, stash) = self.pre_opened.as_ref()?;
                stash.take(*worker, addr)
            };
            let mut connection = match kept.or_else(pre_opened) {
                Some(connection) => connection,
                None => {
                    opened.push(connections.len());
                    Connection::open(addr, &self.config)?
                }
            };
            if let Some(severance) = &self.severance {
                severance.watch(&mut connection)?;
            }
            connections.push(connection);
        }
        // Every new connection's hello is out: its proof goes now, all of them after all the
        // hellos. A proof left for the first request would not go until that request: a worker
        // of a shared process cache may not use a connection for many clocks, and its server
        // closes a connection whose handshake takes longer than the handshake timeout (then the
        // request fails with a broken pipe). The welcome is read before the first answer, so
        // the requests that follow (registrations) go out without waiting a round trip for it.
        for &index in &opened {
            connections[index].prove()?;
        }
        self.routes = map
            .entries()
            .iter()
            .map(|entry| {
                (
                    owners.iter().position(|o| *o == entry.owner).unwrap_or(0),
                    entry.epoch,
                )
            })
            .collect();
        self.connections = connections;
        close_in_background(old.into_iter().flatten().collect());
        Ok(self
            .routes
            .iter()
            .enumerate()
            .filter(|&(p, &(index, epoch))| {
                before.get(p) != Some(&(self.connections[index].addr(), epoch))
            })
            .map(|(p, _)| p as PartitionId)
            .collect())
    }
}

impl RemoteTransport {
    /// Runs `exchange` on connection `index` with the transport's frame buffers in place of
    /// the connection's own. A buffer keeps the capacity of the largest frame it held: a
    /// partition's rows, MiBs each at scale, so per-connection buffers would hold that once per
    /// server for the whole run where one pair suffices (a worker does one exchange at a time).
    fn on_connection<T>(&mut self, index: usize, exchange: impl FnOnce(&mut Connection) -> T) -> T {
        let connection = &mut self.connections[index];
        std::mem::swap(&mut connection.out, &mut self.buffers.0);
        std::mem::swap(&mut connection.body, &mut self.buffers.1);
        let result = exchange(connection);
        std::mem::swap(&mut connection.out, &mut self.buffers.0);
        std::mem::swap(&mut connection.body, &mut self.buffers.1);
        result
    }
}

impl Transport for RemoteTransport {
    fn register_all(
        &mut self,
        worker: u32,
        batches: &[RegisterBatch],
    ) -> Result<Vec<usize>, WorkerError> {
        // All requests first, one flush per connection, then the answers in order (each
        // connection answers in the order it was asked).
        let mut used = vec![false; self.connections.len()];
        for (partition, tables, read_through) in batches {
            let (index, epoch) = self.routes[*partition as usize];
            used[index] = true;
            self.connections[index].send(&Message::Register {
                worker,
                partition: *partition,
                epoch,
                tables: tables.clone(),
                read_through: *read_through,
            })?;
        }
        for (connection, used) in self.connections.iter_mut().zip(used) {
            if used {
                connection.flush()?;
            }
        }
        batches
            .iter()
            .map(|(partition, _, _)| {
                let connection = &mut self.connections[self.routes[*partition as usize].0];
                let addr = connection.addr();
                match connection.recv()? {
                    Message::Registered { partition: p, len } if p == *partition => {
                        Ok(len as usize)
                    }
                    other => Err(unexpected(addr, &other, "registered").into()),
                }
            })
            .collect()
    }

    fn register(
        &mut self,
        worker: u32,
        partition: PartitionId,
        tables: &[(TableId, Vec<u64>)],
        read_through: Option<u64>,
    ) -> Result<usize, WorkerError> {
        let lens = self.register_all(worker, &[(partition, tables.to_vec(), read_through)])?;
        Ok(lens[0])
    }

    fn push(
        &mut self,
        worker: u32,
        clock: u64,
        views: &[PartitionView],
    ) -> Result<(), WorkerError> {
        for view in views {
            let (index, epoch) = self.routes[view.partition as usize];
            let values = Values::F32(&view.delta);
            self.on_connection(index, |connection| {
                connection.send(&Message::Push {
                    worker,
                    clock,
                    partition: view.partition,
                    epoch,
                    values,
                })
            })?;
        }
        for connection in &mut self.connections {
            connection.flush()?;
        }
        for view in views {
            let connection = &mut self.connections[self.routes[view.partition as usize].0];
            let addr = connection.addr();
            match connection.recv()? {
                Message::Pushed { partition, .. } if partition == view.partition => {}
                other => return Err(unexpected(addr, &other, "pushed").into()),
            }
        }
        Ok(())
    }

    fn pull(
        &mut self,
        worker: u32,
        min_clock: u64,
        views: &mut [PartitionView],
    ) -> Result<(), WorkerError> {
        for view in views.iter().filter(|v| v.needs_pull) {
            let (index, epoch) = self.routes[view.partition as usize];
            self.connections[index].send(&Message::Pull {
                worker,
                partition: view.partition,
                epoch,
                min_clock,
            })?;
        }
        for connection in &mut self.connections {
            connection.flush()?;
        }
        for view in views.iter_mut().filter(|v| v.needs_pull) {
            let index = self.routes[view.partition as usize].0;
            self.on_connection(index, |connection| {
                let addr = connection.addr();
                match connection.recv()? {
                    Message::Rows {
                        partition,
                        visible,
                        values,
                    } if partition == view.partition && values.len() == view.len => {
                        values.copy_to(&mut view.incoming);
                        view.visible = visible;
                        // Over the wire every row comes back.
                        view.fresh = None;
                        Ok(())
                    }
                    other => Err(WorkerError::from(unexpected(addr, &other, "rows"))),
                }
            })?;
        }
        Ok(())
    }
}

/// Copies every partition of a job from its servers into a snapshot.
pub fn fetch_snapshot(
    map: &PartitionMap,
    addrs: &NodeAddrs,
    specs: &[TableSpec],
    config: &ClientConfig,
) -> Result<ParamSnapshot, ClientError> {
    let mut transport = RemoteTransport::connect(map, addrs, config)?;
    let mut snapshot = ParamSnapshot::new(specs.to_vec());
    for partition in 0..map.num_partitions() {
        let (index, epoch) = transport.routes[partition as usize];
        let connection = &mut transport.connections[index];
        connection.send(&Message::Dump { partition, epoch })?;
        connection.flush()?;
        let addr = connection.addr();
        match connection.recv()? {
            Message::DumpRows {
                partition: p,
                tables,
                ..
            } if p == partition => {
                for (table, keys, values) in tables {
                    snapshot.add_rows(table, &keys, &values.to_vec());
                }
            }
            other => return Err(unexpected(addr, &other, "dump_rows")),
        }
    }
    snapshot.finish();
    Ok(snapshot)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::RuntimeMetrics;
    use crate::node::ServerHandle;
    use crate::partition::partition_of;
    use crate::worker::Transport;

    fn serve(runtime: &tokio::runtime::Runtime, secret: &[u8]) -> ServerHandle {
        let state = crate::fuzzing::one_table(true);
        ServerHandle::loopback(
            runtime.handle(),
            state,
            secret,
            None,
            Duration::from_secs(5),
            &RuntimeMetrics::unregistered(),
        )
        .unwrap()
    }

    fn client_config(secret: &[u8]) -> ClientConfig {
        ClientConfig {
            secret: secret.to_vec(),
            node: 7,
            max_frame_bytes: crate::frame::DEFAULT_MAX_FRAME_BYTES,
            timeout: Duration::from_secs(5),
            tls: None,
        }
    }

    fn transport_to(server: &ServerHandle, secret: &[u8]) -> Result<RemoteTransport, ClientError> {
        let map = PartitionMap::round_robin(1, &[0]).unwrap();
        let addrs: NodeAddrs = [(0, server.addr)].into_iter().collect();
        RemoteTransport::connect(&map, &addrs, &client_config(secret))
    }

    #[test]
    fn a_pre_opened_connection_is_warmed_within_the_frame_limit_and_taken_by_its_worker_only() {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let server = serve(&runtime, b"job");
        let config = client_config(b"job");
        let keys: Vec<u64> = (0..4).filter(|&k| partition_of(k, 1) == 0).collect();
        let batch = vec![(0, vec![(0, keys.clone())], None)];

        // The server sizes its buffers within its limits, however much is asked, and answers.
        let mut raw = Connection::connect(server.addr, &config).unwrap();
        raw.send(&Message::Warm { bytes: u64::MAX }).unwrap();
        raw.flush().unwrap();
        assert!(matches!(raw.recv().unwrap(), Message::Warmed));
        assert_eq!(
            crate::server::warm_limit(u64::MAX, 1 << 20),
            1 << 20,
            "capped at the frame limit"
        );

        // Worker 0's connection waits in the stash, warmed on this side too.
        let stash = Arc::new(PreOpened::default());
        stash.open(0, server.addr, &config, 256 << 10).unwrap();
        assert_eq!(stash.len(), 1);
        let map = PartitionMap::round_robin(1, &[0]).unwrap();
        let addrs: NodeAddrs = [(0, server.addr)].into_iter().collect();

        // Another worker's transport does not take it.
        let other =
            RemoteTransport::connect_as(&map, &addrs, &config, Some((1, stash.clone())), None)
                .unwrap();
        assert_eq!(stash.len(), 1);
        assert!(other.connections[0].welcome_pending, "connected on its own");

        // Worker 0's does, and it serves at once (welcomed, buffers sized).
        let mut own =
            RemoteTransport::connect_as(&map, &addrs, &config, Some((0, stash.clone())), None)
                .unwrap();
        assert!(stash.is_empty());
        let connection = &own.connections[0];
        assert!(!connection.welcome_pending);
        assert!(connection.body.capacity() >= 256 << 10);
        assert!(connection.out.capacity() >= 256 << 10);
        assert_eq!(own.register_all(0, &batch).unwrap(), vec![keys.len() * 2]);

        // A node that leaves before its switch takes its waiting connections with it: by
        // address, or as a node that is no longer a member.
        stash.open(5, server.addr, &config, 0).unwrap();
        stash.forget(server.addr);
        assert!(stash.is_empty());
        stash.open(5, server.addr, &config, 0).unwrap();
        stash.forget_unless(|addr| addr == server.addr);
        assert_eq!(stash.len(), 1, "still a member");
        stash.forget_unless(|_| false);
        assert!(stash.is_empty());
        server.stop(runtime.handle());
    }

    #[test]
    fn registrations_follow_the_hello_without_waiting_for_the_welcome() {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let keys: Vec<u64> = (0..4).filter(|&k| partition_of(k, 1) == 0).collect();
        let batch = vec![(0, vec![(0, keys.clone())], None)];

        // The welcome is read before the registration's answer.
        let server = serve(&runtime, b"job");
        let mut transport = transport_to(&server, b"job").unwrap();
        assert!(transport.connections[0].welcome_pending);
        assert_eq!(
            transport.register_all(0, &batch).unwrap(),
            vec![keys.len() * 2]
        );
        assert!(!transport.connections[0].welcome_pending);

        // A server that does not hold the job key is refused at the connection, named.
        let error = transport_to(&server, b"not the job")
            .unwrap_err()
            .to_string();
        assert!(error.contains(&server.addr.to_string()), "{error}");
        server.stop(runtime.handle());
    }

    /// A connection the transport opens finishes its handshake there, not at its first
    /// request: a worker of a shared process cache may not use one for many clocks, and the
    /// server closes a connection still in its handshake after the handshake timeout (the
    /// request then failed with a broken pipe: issue 39's 272 workers in one process).
    #[test]
    fn a_connection_left_unused_past_the_handshake_timeout_still_serves() {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let timeout = Duration::from_millis(200);
        let config = crate::server::ServerConfig {
            handshake_timeout: timeout,
            ..crate::server::ServerConfig::with_secret(b"job".to_vec())
        };
        let server = ServerHandle::start(
            runtime.handle(),
            ([127, 0, 0, 1], 0).into(),
            crate::fuzzing::one_table(true),
            config,
            RuntimeMetrics::unregistered(),
        )
        .unwrap();
        let mut transport = transport_to(&server, b"job").unwrap();
        std::thread::sleep(timeout * 3);
        let keys: Vec<u64> = (0..4).filter(|&k| partition_of(k, 1) == 0).collect();
        let batch = vec![(0, vec![(0, keys.clone())], None)];
        assert_eq!(
            transport.register_all(0, &batch).unwrap(),
            vec![keys.len() * 2]
        );
        server.stop(runtime.handle());
    }
}

#[cfg(test)]
mod severance_tests {
    use std::io::Read;
    use std::net::TcpListener;
    use std::time::Instant;

    use super::*;

    /// A peer that accepts and then answers nothing, like a stopped process whose kernel keeps
    /// the connection: each accepted socket is sent back for the test to watch.
    fn silent_peer() -> (SocketAddr, std::sync::mpsc::Receiver<TcpStream>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let (send, accepted) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                if send.send(stream.unwrap()).is_err() {
                    return;
                }
            }
        });
        (addr, accepted)
    }

    fn open(addr: SocketAddr) -> Connection {
        let config = ClientConfig {
            secret: b"s".to_vec(),
            node: 1,
            max_frame_bytes: 1 << 20,
            timeout: Duration::from_secs(60),
            tls: None,
        };
        Connection::open(addr, &config).unwrap()
    }

    /// Reads from the peer's side until the client's socket closes (EOF or a reset).
    fn closed_by_client(mut peer: TcpStream) -> bool {
        peer.set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let mut buf = [0u8; 256];
        loop {
            match peer.read(&mut buf) {
                Ok(0) => return true,
                Ok(_) => continue, // the hello
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
                Err(_) => return false,
            }
        }
    }

    #[test]
    fn a_read_blocked_on_a_silent_peer_fails_once_severed() {
        let (addr, accepted) = silent_peer();
        let severance = Arc::new(Severance::default());
        let mut connection = open(addr);
        severance.watch(&mut connection).unwrap();
        severance.watch(&mut connection).unwrap();
        assert_eq!(severance.len(), 1, "watched once");
        let _peer = accepted.recv().unwrap();
        let (done, result) = std::sync::mpsc::channel();
        let started = Instant::now();
        std::thread::spawn(move || {
            // the welcome never comes: blocked for the 60 s read timeout unless severed
            let outcome = connection.recv().map(|_| ()).map_err(|e| e.to_string());
            let after = started.elapsed();
            drop(connection);
            let _ = done.send((outcome, after));
        });
        assert_eq!(severance.sever(), 1);
        let (outcome, after) = result
            .recv_timeout(Duration::from_secs(20))
            .expect("the blocked read ended");
        let error = outcome.expect_err("a severed read fails");
        assert!(error.contains("exchanging frames"), "{error}");
        assert!(after < Duration::from_secs(20), "{after:?}");
        // the connection is gone with its thread, and so is its entry
        assert!(severance.is_empty());

        // a connection watched after the sever is cut as it is watched
        let mut late = open(addr);
        severance.watch(&mut late).unwrap();
        assert!(late.recv().is_err());
    }

    #[test]
    fn a_watched_connection_dropped_really_closes() {
        let (addr, accepted) = silent_peer();
        let severance = Arc::new(Severance::default());
        let mut connection = open(addr);
        severance.watch(&mut connection).unwrap();
        let peer = accepted.recv().unwrap();
        drop(connection);
        // the severance's duplicate went with it: the peer sees the close
        assert!(severance.is_empty());
        assert!(closed_by_client(peer), "the socket stayed open");
        assert_eq!(severance.sever(), 0);
    }
}
