//! The data-plane server: accepts worker connections and serves the partitions a node hosts.
//!
//! Modelled on mini-redis: [`run`] takes an already-bound listener and a shutdown future; a
//! semaphore caps open connections; on shutdown it stops accepting, tells handlers to finish and
//! waits for them. Each connection must start with the handshake of [`crate::handshake`]: both
//! ends prove they hold the job key (HMAC over fresh nonces, checked in constant time), and the
//! key never crosses the wire. A peer that cannot, or one sending a malformed, truncated or oversized frame, is
//! told why in an `Error` frame, logged and disconnected; every other connection keeps being
//! served. A registration of more values than one frame carries is refused before any row is
//! materialised. Request-level failures
//! (wrong epoch, unknown partition) are answered with an `Error` message instead.
//!
//! Store operations that touch many values run on the blocking pool, so the async workers never
//! stall on a large batch. With a bandwidth limit ([`ServerConfig::bandwidth`]) every byte read
//! and written waits for its tokens, as if the node sat behind a NIC of that speed.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use thiserror::Error;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;

use crate::bandwidth::{Link, NodeBandwidth, WorkerPlacement};
use crate::control::{ControlRequest, NodeAgent};
use crate::frame::{FrameError, HEADER_BYTES, body_len, check, put_f32s};
use crate::handshake;
use crate::message::{Message, Values};
use crate::metrics::RuntimeMetrics;
use crate::store::{PushOutcome, ServerState, StoreError};
use crate::tls::{JobTls, TLS_HANDSHAKE_RECORD};

/// Settings of a data-plane server.
#[derive(Clone)]
pub struct ServerConfig {
    /// The job's shared secret every peer must present.
    pub secret: Vec<u8>,
    /// Largest frame body accepted (nothing larger is ever allocated).
    pub max_frame_bytes: usize,
    /// Most connections served at once; further peers wait to be accepted.
    pub max_connections: usize,
    /// How long a pull may wait for its clock.
    pub wait_timeout: Duration,
    /// How long a new peer has to present its hello.
    pub handshake_timeout: Duration,
    /// How soon a peer that vanished without closing its connection (an instance taken back:
    /// no FIN, no RST) is let go: TCP keepalive probes an idle connection and TCP_USER_TIMEOUT
    /// bounds unacknowledged answers ([`detect_dead_peer`]). A peer that is alive but silent,
    /// a worker between segments, answers the probes and stays connected.
    pub dead_peer_after: Duration,
    /// Answers `Control` frames (a node process of an elastic run); without one they are
    /// refused.
    pub agent: Option<Arc<dyn NodeAgent>>,
    /// The node's data-plane bandwidth, shared by all its connections (`None`: unlimited).
    pub bandwidth: Option<Arc<NodeBandwidth>>,
    /// This server's node and where the job's workers run, when they live in this process: a
    /// worker's exchange is then charged to its node's bandwidth too, or to none within a node.
    pub placement: Option<(u32, Arc<WorkerPlacement>)>,
    /// TLS keyed by the job key ([`crate::tls`]): every peer must open with a TLS handshake,
    /// and one that speaks plaintext is refused. `None`: plain TCP only, and a TLS client is
    /// refused.
    pub tls: Option<Arc<JobTls>>,
}

impl std::fmt::Debug for ServerConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerConfig")
            .field("max_frame_bytes", &self.max_frame_bytes)
            .field("max_connections", &self.max_connections)
            .field("wait_timeout", &self.wait_timeout)
            .field("handshake_timeout", &self.handshake_timeout)
            .field("dead_peer_after", &self.dead_peer_after)
            .field("agent", &self.agent.is_some())
            .field("bandwidth_mbps", &self.bandwidth.as_ref().map(|b| b.mbps))
            .field("tls", &self.tls.is_some())
            .finish_non_exhaustive()
    }
}

impl ServerConfig {
    /// Defaults with the given secret.
    pub fn with_secret(secret: Vec<u8>) -> Self {
        Self {
            secret,
            max_frame_bytes: crate::frame::DEFAULT_MAX_FRAME_BYTES,
            max_connections: 1024,
            wait_timeout: Duration::from_secs(600),
            handshake_timeout: Duration::from_secs(10),
            dead_peer_after: DEFAULT_DEAD_PEER_AFTER,
            agent: None,
            bandwidth: None,
            placement: None,
            tls: None,
        }
    }
}

/// Default of [`ServerConfig::dead_peer_after`]. Without it a vanished peer's connection held
/// its task, its buffers (sized for the largest partition once warmed) and one of the
/// `max_connections` permits until the kernel gave up: never while idle (Linux sends no
/// keepalive unless asked), about 15 minutes of retransmissions while an answer was in flight.
pub const DEFAULT_DEAD_PEER_AFTER: Duration = Duration::from_secs(60);

/// Makes the kernel close the server's `stream` once its peer has not answered for about
/// `after`: an idle connection by keepalive ([`probe_idle_peer`]), and one whose answer the peer
/// has not acknowledged for `after` (TCP_USER_TIMEOUT) too. A read or write then fails
/// (`ETIMEDOUT`), and the connection is closed as for any failed read.
pub fn detect_dead_peer(stream: &impl std::os::fd::AsFd, after: Duration) -> std::io::Result<()> {
    probe_idle_peer(stream, after)?;
    socket2::SockRef::from(stream).set_tcp_user_timeout(Some(after))
}

/// TCP keepalive on `stream`: probes from `after / 2` of silence, every `after / 8` (at least
/// 1 s), the connection closed once 4 go unanswered. A live peer's kernel answers them however
/// long its process is silent. A worker's [`crate::client::Connection`] sets only this: its
/// request to a server that vanished while answering fails within `after` instead of at the
/// read timeout. It sets no TCP_USER_TIMEOUT, which also ends a connection whose receiver
/// keeps its window closed that long, and a server waiting at a BSP gate for a straggler may
/// leave a worker's next frames unread for up to the wait timeout.
pub fn probe_idle_peer(stream: &impl std::os::fd::AsFd, after: Duration) -> std::io::Result<()> {
    let idle = (after / 2).max(Duration::from_secs(1));
    let interval = (after / 8).max(Duration::from_secs(1));
    socket2::SockRef::from(stream).set_tcp_keepalive(
        &socket2::TcpKeepalive::new()
            .with_time(idle)
            .with_interval(interval)
            .with_retries(4),
    )
}

/// Why a connection was closed by the server.
#[derive(Debug, Error)]
pub enum ConnectionError {
    /// Reading from the peer failed.
    #[error("reading from the peer failed: {0}")]
    Read(std::io::Error),
    /// Writing to the peer failed.
    #[error("writing to the peer failed: {0}")]
    Write(std::io::Error),
    /// The peer sent a malformed or oversized frame.
    #[error("bad frame: {0}")]
    Decode(#[from] FrameError),
    /// The peer closed the connection in the middle of a frame.
    #[error("peer closed the connection mid-frame")]
    Truncate,
    /// The peer did not prove it holds the job key (no hello, a wrong or replayed proof).
    #[error("peer did not authenticate")]
    Authenticate,
    /// The peer did not finish the handshake in time.
    #[error("peer did not finish the handshake in time")]
    Handshake,
    /// The peer sent a message a client must not send.
    #[error("peer sent an unexpected {0} message")]
    Unexpected(&'static str),
    /// The peer spoke plaintext to a server that requires TLS (a downgrade attempt, or a node
    /// whose transport security is "none").
    #[error("this server requires TLS (transport security \"tls\") and the peer spoke plaintext")]
    Plaintext,
    /// The peer opened a TLS handshake with a server whose transport security is "none".
    #[error("the peer opened TLS with a server whose transport security is \"none\"")]
    TlsUnexpected,
    /// The TLS handshake failed (the peer refused this server's key, or sent a malformed or
    /// unacceptable handshake).
    #[error("TLS handshake failed: {0}")]
    Tls(String),
}

impl ConnectionError {
    /// Static label for metrics: `dead_peer` for a peer that stopped answering TCP
    /// ([`detect_dead_peer`]), else what failed.
    pub fn category(&self) -> &'static str {
        match self {
            ConnectionError::Read(e) | ConnectionError::Write(e)
                if e.kind() == std::io::ErrorKind::TimedOut =>
            {
                "dead_peer"
            }
            ConnectionError::Read(_) => "read",
            ConnectionError::Write(_) => "write",
            ConnectionError::Decode(e) => e.category(),
            ConnectionError::Truncate => "truncated",
            ConnectionError::Authenticate => "unauthenticated",
            ConnectionError::Handshake => "handshake_timeout",
            ConnectionError::Unexpected(_) => "unexpected",
            ConnectionError::Plaintext => "plaintext",
            ConnectionError::TlsUnexpected => "tls_unexpected",
            ConnectionError::Tls(_) => "tls",
        }
    }
}

/// The next connection on `listener`, with a permit of `permits` held for its life: waits for a
/// permit first (a full server leaves further connections in the kernel's backlog), and tries a
/// failed accept (out of file descriptors, say) again after 50 ms. `None` once `permits` is
/// closed. `what` prefixes the log line of a failed accept.
pub(crate) async fn accept_permitted(
    listener: &TcpListener,
    permits: &Arc<Semaphore>,
    what: &str,
) -> Option<(
    tokio::sync::OwnedSemaphorePermit,
    tokio::net::TcpStream,
    std::net::SocketAddr,
)> {
    let permit = permits.clone().acquire_owned().await.ok()?;
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => return Some((permit, stream, peer)),
            Err(error) => {
                tracing::warn!(%error, "{what}accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// Serves `state` on `listener` until `shutdown` completes, then waits for open connections.
pub async fn run(
    listener: TcpListener,
    state: Arc<ServerState>,
    config: Arc<ServerConfig>,
    metrics: RuntimeMetrics,
    shutdown: impl Future<Output = ()>,
) {
    let permits = Arc::new(Semaphore::new(config.max_connections.max(1)));
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut handlers = JoinSet::new();
    let accept = async {
        loop {
            let Some((permit, stream, peer)) = accept_permitted(&listener, &permits, "").await
            else {
                return;
            };
            let (state, config, metrics, stop) = (
                state.clone(),
                config.clone(),
                metrics.clone(),
                stop_rx.clone(),
            );
            let _ = stream.set_nodelay(true);
            if let Err(error) = detect_dead_peer(&stream, config.dead_peer_after) {
                tracing::warn!(%peer, %error, "setting TCP keepalive failed: a peer that vanishes keeps its connection");
            }
            handlers.spawn(async move {
                metrics.connections_open.inc();
                let result = serve_socket(stream, &state, &config, stop).await;
                metrics.connections_open.dec();
                if let Err(error) = result {
                    metrics
                        .connections_refused
                        .with_label_values(&[error.category()])
                        .inc();
                    tracing::warn!(%peer, reason = error.category(), %error, "connection closed");
                }
                drop(permit);
            });
            while handlers.try_join_next().is_some() {}
        }
    };
    tokio::select! {
        () = accept => {}
        () = shutdown => tracing::info!("data-plane server shutting down"),
    }
    let _ = stop_tx.send(true);
    // Connections end at their next frame; one inside a request (a read waiting for its clock,
    // which a released node's partitions will never reach) gets `SHUTDOWN_DRAIN`, then is cut.
    // Without the bound a node the coordinator let go outlived its pod's grace period and was
    // SIGKILLed by the kubelet (tests/tests/real_pods.rs).
    let drained = tokio::time::timeout(SHUTDOWN_DRAIN, async {
        while handlers.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::info!(
            busy = handlers.len(),
            "connections still inside a request at shutdown: closed"
        );
        handlers.shutdown().await;
    }
}

/// How long a stopping server waits for connections inside a request before it closes them.
const SHUTDOWN_DRAIN: Duration = Duration::from_secs(2);

/// Reads one frame into `buf`; `Ok(None)` at a clean end of stream.
async fn read_frame(
    stream: &mut (impl AsyncRead + Unpin),
    buf: &mut BytesMut,
    max: usize,
) -> Result<Option<Bytes>, ConnectionError> {
    loop {
        match check(buf, max) {
            Ok(total) => return Ok(Some(buf.split_to(total).freeze())),
            Err(FrameError::Incomplete) => {
                if let Ok(len) = body_len(buf, max) {
                    buf.reserve(HEADER_BYTES + len - buf.len());
                } else if buf.capacity() == buf.len() {
                    buf.reserve(4096);
                }
                let read = match stream.read_buf(buf).await {
                    Ok(read) => read,
                    // A TLS peer that closed its socket without a close_notify: the same end of
                    // stream as a plaintext peer's close (the framing catches a truncation).
                    Err(error) if error.kind() == std::io::ErrorKind::UnexpectedEof => 0,
                    Err(error) => return Err(ConnectionError::Read(error)),
                };
                if read == 0 {
                    return if buf.is_empty() {
                        Ok(None)
                    } else {
                        Err(ConnectionError::Truncate)
                    };
                }
            }
            Err(error) => return Err(error.into()),
        }
    }
}

/// Buffers are warmed (paged in) this many bytes at a time, with [`WARM_PAUSE`] between: about
/// 256 MB/s, a sixth of one core on the project's VM, so the training that goes on meanwhile
/// hardly notices.
const WARM_CHUNK_BYTES: usize = 256 << 10;
/// The pause between two chunks of a warm-up.
const WARM_PAUSE: Duration = Duration::from_millis(1);
/// Most bytes one buffer is warmed for, whatever is asked.
const MAX_WARM_BYTES: usize = 64 << 20;

/// The frame body size a warm-up asking for `bytes` prepares for, with frames of at most
/// `max_frame_bytes`.
pub(crate) fn warm_limit(bytes: u64, max_frame_bytes: usize) -> usize {
    usize::try_from(bytes)
        .unwrap_or(usize::MAX)
        .min(max_frame_bytes)
        .min(MAX_WARM_BYTES)
}

/// A byte buffer a warm-up can grow.
trait Grow {
    fn len(&self) -> usize;
    fn grow_to(&mut self, len: usize);
}

impl Grow for Vec<u8> {
    fn len(&self) -> usize {
        Vec::len(self)
    }
    fn grow_to(&mut self, len: usize) {
        self.resize(len, 0);
    }
}

impl Grow for BytesMut {
    fn len(&self) -> usize {
        BytesMut::len(self)
    }
    fn grow_to(&mut self, len: usize) {
        self.resize(len, 0);
    }
}

/// Grows `buf` to `len` bytes by chunks, pausing between them (blocks the thread).
fn grow_paced(buf: &mut impl Grow, len: usize) {
    let mut first = true;
    while buf.len() < len {
        if !std::mem::take(&mut first) {
            std::thread::sleep(WARM_PAUSE);
        }
        buf.grow_to((buf.len() + WARM_CHUNK_BYTES).min(len));
    }
}

/// Makes room for `bytes` more in `buf` and touches it, keeping what `buf` holds (blocks the
/// thread for about 4 ms per MiB).
fn warm_bytes(buf: &mut BytesMut, bytes: usize) {
    let held = buf.len();
    buf.reserve(bytes);
    grow_paced(buf, held + bytes);
    buf.truncate(held);
}

/// Gives `out` room for `bytes` and touches it; `out` is left empty (blocks the thread for
/// about 4 ms per MiB).
pub(crate) fn warm_vec(out: &mut Vec<u8>, bytes: usize) {
    out.clear();
    out.reserve(bytes);
    grow_paced(out, bytes);
    out.clear();
}

/// Writes `out` to the peer once `link` grants its bytes.
async fn write_frame(
    stream: &mut (impl AsyncWrite + Unpin),
    out: &[u8],
    link: &Link,
) -> Result<(), ConnectionError> {
    link.send(out.len()).await;
    stream
        .write_all(out)
        .await
        .map_err(ConnectionError::Write)?;
    // A TLS stream keeps the records it could not write when the socket filled: without the
    // flush the end of a large answer waited for the next frame, which a client waiting for
    // that answer never sends (a plain socket's flush does nothing).
    stream.flush().await.map_err(ConnectionError::Write)
}

/// The largest frame a peer may send before it has proven the job key: its hello (a node id
/// and a nonce) and its proof. Anything larger is refused before it is read, so a peer that does
/// not know the key cannot make the server set memory aside (a header may announce up to
/// `max_frame_bytes`, 256 MiB by default).
const HELLO_MAX_BYTES: usize = 4096;

/// How long a refused peer's socket is given to take the reason (it may not be reading).
const REFUSAL_WRITE_TIMEOUT: Duration = Duration::from_secs(1);

/// Serves one peer; when the server closes the connection for a reason the peer caused (no or
/// a wrong hello, a malformed, oversized or client-illegal frame), it first tells the peer why
/// with an `Error` frame, so a misconfigured worker reports "refused: unauthenticated" rather
/// than a bare end of stream.
async fn serve_connection(
    mut stream: impl AsyncRead + AsyncWrite + Unpin,
    state: &Arc<ServerState>,
    config: &ServerConfig,
    stop: watch::Receiver<bool>,
) -> Result<(), ConnectionError> {
    let result = serve(&mut stream, state, config, stop).await;
    if let Err(error) = &result {
        if !matches!(
            error,
            ConnectionError::Read(_) | ConnectionError::Write(_) | ConnectionError::Truncate
        ) {
            tell_refused(&mut stream, error).await;
        }
    }
    result
}

/// Tells a refused peer why in an `Error` frame (bounded by [`REFUSAL_WRITE_TIMEOUT`]) and
/// closes the stream.
async fn tell_refused(stream: &mut (impl AsyncWrite + Unpin), error: &ConnectionError) {
    let mut out = Vec::new();
    Message::Error {
        category: error.category(),
        message: &error.to_string(),
    }
    .encode(&mut out);
    let _ = tokio::time::timeout(REFUSAL_WRITE_TIMEOUT, async {
        stream.write_all(&out).await?;
        stream.shutdown().await
    })
    .await;
}

/// Serves one accepted socket: looks at its first byte (within the handshake timeout) to tell a
/// TLS client from a plaintext one, refuses the kind this server does not speak, runs the TLS
/// handshake when it does ([`crate::tls`]) and then serves the connection.
async fn serve_socket(
    mut stream: TcpStream,
    state: &Arc<ServerState>,
    config: &ServerConfig,
    stop: watch::Receiver<bool>,
) -> Result<(), ConnectionError> {
    let mut first = [0u8; 1];
    let opened_with_tls =
        match tokio::time::timeout(config.handshake_timeout, stream.peek(&mut first)).await {
            Err(_) => return Err(ConnectionError::Handshake),
            Ok(Err(error)) => return Err(ConnectionError::Read(error)),
            // Closed before a byte: the plaintext path reports it as before.
            Ok(Ok(0)) => false,
            Ok(Ok(_)) => first[0] == TLS_HANDSHAKE_RECORD,
        };
    match (&config.tls, opened_with_tls) {
        (None, false) => serve_connection(stream, state, config, stop).await,
        // A TLS client cannot read a plaintext refusal: it sees the connection close.
        (None, true) => Err(ConnectionError::TlsUnexpected),
        (Some(_), false) => {
            // Plaintext in, plaintext refusal out: a node misconfigured with "none" reads why.
            let error = ConnectionError::Plaintext;
            tell_refused(&mut stream, &error).await;
            Err(error)
        }
        (Some(tls), true) => {
            let acceptor = tokio_rustls::TlsAcceptor::from(tls.server.clone());
            let stream = tokio::time::timeout(config.handshake_timeout, acceptor.accept(stream))
                .await
                .map_err(|_| ConnectionError::Handshake)?
                .map_err(|error| ConnectionError::Tls(error.to_string()))?;
            serve_connection(stream, state, config, stop).await
        }
    }
}

/// Serves one connection over any byte stream, as [`run`] serves each accepted socket, until
/// the peer closes it or the server refuses it (why: the error, counted by [`run`] as
/// `ebbflow_runtime_connections_refused_total{reason}`). For the fuzzing harness
/// ([`crate::fuzzing`]) and tests.
pub async fn serve_stream(
    stream: impl AsyncRead + AsyncWrite + Unpin,
    state: &Arc<ServerState>,
    config: &ServerConfig,
) -> Result<(), ConnectionError> {
    let (_running, stop) = watch::channel(false);
    serve_connection(stream, state, config, stop).await
}

/// The server's side of the handshake ([`crate::handshake`]): reads the hello, answers with
/// its nonce and proof, and checks the client's proof. Frames before it succeeds are read up
/// to [`HELLO_MAX_BYTES`] only. Returns the bytes read.
async fn handshake(
    stream: &mut (impl AsyncRead + AsyncWrite + Unpin),
    buf: &mut BytesMut,
    config: &ServerConfig,
    own: &Link,
) -> Result<usize, ConnectionError> {
    let limit = HELLO_MAX_BYTES.min(config.max_frame_bytes);
    let hello = read_frame(stream, buf, limit)
        .await?
        .ok_or(ConnectionError::Authenticate)?;
    let (node, client_nonce) = match Message::decode(&hello[HEADER_BYTES..])? {
        Message::Hello { node, nonce } if nonce.len() == handshake::NONCE_BYTES => {
            (node, nonce.to_vec())
        }
        _ => return Err(ConnectionError::Authenticate),
    };
    let mut read = hello.len();
    drop(hello);
    let server_nonce = handshake::nonce();
    let mut out = Vec::with_capacity(128);
    Message::Challenge {
        nonce: &server_nonce,
        proof: &handshake::server_proof(&config.secret, node, &client_nonce, &server_nonce),
    }
    .encode(&mut out);
    write_frame(stream, &out, own).await?;
    let proof = read_frame(stream, buf, limit)
        .await?
        .ok_or(ConnectionError::Authenticate)?;
    match Message::decode(&proof[HEADER_BYTES..])? {
        Message::Proof { proof }
            if handshake::verify_client(
                &config.secret,
                node,
                &client_nonce,
                &server_nonce,
                proof,
            ) => {}
        _ => return Err(ConnectionError::Authenticate),
    }
    read += proof.len();
    tracing::debug!(node, "peer authenticated");
    Ok(read)
}

async fn serve(
    stream: &mut (impl AsyncRead + AsyncWrite + Unpin),
    state: &Arc<ServerState>,
    config: &ServerConfig,
    mut stop: watch::Receiver<bool>,
) -> Result<(), ConnectionError> {
    // Frames that are not a worker's (hello, control) cross this node's NIC only.
    let own = Link::between(config.bandwidth.as_ref(), None, None);
    let mut buf = BytesMut::with_capacity(1 << 16);
    // The handshake (crate::handshake), all of it within the handshake timeout: a peer that
    // stops half-way is dropped like one that never said hello.
    let handshake_bytes = tokio::time::timeout(
        config.handshake_timeout,
        handshake(stream, &mut buf, config, &own),
    )
    .await
    .map_err(|_| ConnectionError::Handshake)??;
    let mut out = Vec::with_capacity(1 << 16);
    Message::Welcome.encode(&mut out);
    own.receive(handshake_bytes).await;
    write_frame(stream, &out, &own).await?;
    loop {
        let frame = tokio::select! {
            frame = read_frame(stream, &mut buf, config.max_frame_bytes) => frame?,
            _ = stop.wait_for(|stopped| *stopped) => return Ok(()),
        };
        let Some(frame) = frame else { return Ok(()) };
        // Headers only: cheap, and rejects client-illegal kinds before any work.
        let (wait, worker) = match Message::decode(&frame[HEADER_BYTES..])? {
            Message::Pull {
                partition,
                min_clock,
                worker,
                ..
            } => (Some((partition, None, min_clock)), Some(worker)),
            Message::Push {
                partition,
                worker,
                clock,
                ..
            } => (Some((partition, Some(worker), clock)), Some(worker)),
            Message::Register { worker, .. } => (None, Some(worker)),
            Message::Dump { .. } => (None, None),
            Message::Warm { bytes } => {
                own.receive(frame.len()).await;
                // Room for one frame read and one answer, never past the frame limit nor
                // `MAX_WARM_BYTES` (a peer cannot make the server hold more than it could with
                // frames it sends).
                let bytes = HEADER_BYTES + warm_limit(bytes, config.max_frame_bytes);
                drop(frame);
                (buf, out) = tokio::task::spawn_blocking(move || {
                    warm_bytes(&mut buf, bytes);
                    warm_vec(&mut out, bytes);
                    (buf, out)
                })
                .await
                .map_err(|_| ConnectionError::Unexpected("panicking"))?;
                Message::Warmed.encode(&mut out);
                write_frame(stream, &out, &own).await?;
                continue;
            }
            Message::Control { .. } => {
                own.receive(frame.len()).await;
                out.clear();
                out = control(config.agent.clone(), frame, out).await?;
                write_frame(stream, &out, &own).await?;
                continue;
            }
            other => return Err(ConnectionError::Unexpected(other.kind())),
        };
        let link = Link::between(config.bandwidth.as_ref(), config.placement.as_ref(), worker);
        link.receive(frame.len()).await;
        out.clear();
        // Reads wait for their clock; BSP pushes wait for their gate (the frame stays unread
        // behind this one in the socket meanwhile, so waiting costs no server memory).
        let mut waited = match wait {
            Some((partition, None, min_clock)) => {
                state
                    .wait_clock(partition, min_clock, config.wait_timeout)
                    .await
            }
            Some((partition, Some(worker), clock)) => {
                state
                    .wait_push_gate(partition, worker, clock, config.wait_timeout)
                    .await
            }
            None => Ok(()),
        };
        out = loop {
            match waited {
                Err(error) => {
                    encode_error(&error, &mut out);
                    break out;
                }
                Ok(()) => {
                    let (shared, frame) = (state.clone(), frame.clone());
                    let max_frame_bytes = config.max_frame_bytes;
                    let early;
                    (out, early) = tokio::task::spawn_blocking(move || {
                        let early =
                            process(&shared, &frame[HEADER_BYTES..], &mut out, max_frame_bytes);
                        (out, early)
                    })
                    .await
                    .map_err(|_| ConnectionError::Unexpected("panicking"))?;
                    // The gate closed again between the wait and the push: a worker
                    // (re-)registered meanwhile and has not read this clock yet (a joined node's
                    // workers at a switch). Wait for it again rather than refuse the push.
                    let Some((partition, Some(worker), clock)) = wait.filter(|_| early) else {
                        break out;
                    };
                    out.clear();
                    waited = state
                        .wait_push_gate(partition, worker, clock, config.wait_timeout)
                        .await;
                }
            }
        };
        write_frame(stream, &out, &link).await?;
    }
}

/// Room a push or pull answer's fields take in its frame besides the values (kind, ids, clock,
/// epoch, length prefix: 34 bytes; the rest is slack).
const PUSH_HEADER_BYTES: usize = 64;

/// Answers a `Control` frame through the node's agent (on a blocking thread: agents copy
/// partitions and wait for segments).
async fn control(
    agent: Option<Arc<dyn NodeAgent>>,
    frame: Bytes,
    mut out: Vec<u8>,
) -> Result<Vec<u8>, ConnectionError> {
    let Some(agent) = agent else {
        Message::Error {
            category: "no_agent",
            message: "this server takes no control requests",
        }
        .encode(&mut out);
        return Ok(out);
    };
    tokio::task::spawn_blocking(move || {
        let Ok(Message::Control { json, blob }) = Message::decode(&frame[HEADER_BYTES..]) else {
            return out;
        };
        match serde_json::from_str::<ControlRequest>(json) {
            Err(error) => Message::Error {
                category: "control_decode",
                message: &format!("undecodable control request: {error}"),
            }
            .encode(&mut out),
            Ok(request) => {
                let (answer, payload) = agent.control(request, blob);
                let json = serde_json::to_string(&answer).unwrap_or_default();
                Message::ControlReply {
                    json: &json,
                    blob: &payload,
                }
                .encode(&mut out);
            }
        }
        out
    })
    .await
    .map_err(|_| ConnectionError::Unexpected("panicking"))
}

fn encode_error(error: &StoreError, out: &mut Vec<u8>) {
    Message::Error {
        category: error.category(),
        message: &error.to_string(),
    }
    .encode(out);
}

/// Serves one decoded request into `out` (the reply frame). Returns whether it was a BSP push
/// that arrived before its gate opened ([`StoreError::PushEarly`], answered in `out`), which
/// the caller may wait for and retry.
fn process(state: &ServerState, body: &[u8], out: &mut Vec<u8>, max_frame_bytes: usize) -> bool {
    // A batch's push or pull carries all its values in one frame, beside a small header.
    let max_values = max_frame_bytes.saturating_sub(PUSH_HEADER_BYTES) / 4;
    let Ok(message) = Message::decode(body) else {
        return false;
    };
    let result = match message {
        Message::Register {
            worker,
            partition,
            epoch,
            tables,
            read_through,
        } => state
            .with_partition(partition, epoch, |store| {
                store.register_read(worker, &tables, read_through, max_values)
            })
            .map(|len| {
                Message::Registered {
                    partition,
                    len: len as u64,
                }
                .encode(out)
            }),
        Message::Push {
            worker,
            clock,
            partition,
            epoch,
            values,
        } => {
            let Values::Le(bytes) = values else {
                return false;
            };
            state
                .with_partition(partition, epoch, |store| {
                    store.push_le(worker, clock, bytes)
                })
                .map(|(outcome, _)| {
                    Message::Pushed {
                        partition,
                        duplicate: outcome == PushOutcome::Duplicate,
                    }
                    .encode(out)
                })
        }
        Message::Pull {
            worker,
            partition,
            epoch,
            min_clock,
        } => state.with_partition(partition, epoch, |store| {
            let len = store.batch_len(worker)?;
            let visible = store.visible_clock();
            // Rows frame written by hand so the values go straight from the table into the frame.
            let start = crate::frame::begin_frame(out);
            out.push(crate::message::ROWS);
            out.extend_from_slice(&partition.to_le_bytes());
            out.extend_from_slice(&visible.to_le_bytes());
            out.extend_from_slice(&(len as u32).to_le_bytes());
            store.pull_rows(worker, min_clock, |row| put_f32s(out, row))?;
            crate::frame::end_frame(out, start);
            Ok(())
        }),
        Message::Dump { partition, epoch } => state.with_partition(partition, epoch, |store| {
            let tables = store
                .table_ids()
                .into_iter()
                .filter_map(|id| {
                    store
                        .table_rows(id)
                        .map(|(keys, data, _)| (id, keys.to_vec(), Values::F32(data)))
                })
                .collect();
            Message::DumpRows {
                partition,
                visible: store.visible_clock(),
                tables,
            }
            .encode(out);
            Ok(())
        }),
        _ => return false,
    };
    match result {
        Ok(()) => false,
        Err(error) => {
            out.clear();
            encode_error(&error, out);
            matches!(error, StoreError::PushEarly { .. })
        }
    }
}

/// Binds `addr` and returns the listener and its actual address (port 0 picks a free port).
pub async fn bind(addr: SocketAddr) -> std::io::Result<(TcpListener, SocketAddr)> {
    let listener = TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    Ok((listener, local))
}
