//! The admin API's transport: HTTP/1.1 over TLS 1.3 keyed by the job key when the job's
//! transport security is `tls` (the default), plain HTTP when it is `none`.
//!
//! Servers ([`serve`]) present the job's admin certificate ([`JobTls::admin_server`]) and answer
//! a plaintext client with a 400 that says to use `https://` (counted as `plaintext` in
//! `ebbflow_runtime_admin_connections_refused_total{reason}`); a client that opens a connection
//! and never finishes its handshake is cut after [`HANDSHAKE_TIMEOUT`] and does not hold up
//! others, because handshakes run beside the accept loop. Clients ([`client`]) accept only a
//! server that proves the job's key, and refuse `http://` URLs for such a job
//! ([`base_url`]), so the bearer token never crosses the network in clear.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use prometheus::IntCounterVec;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

use crate::tls::{JobTls, TLS_HANDSHAKE_RECORD};

/// How long a client has to finish its TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Handshakes in progress at once; further connections wait in the kernel's backlog.
const MAX_HANDSHAKES: usize = 256;

/// What a plaintext client of a TLS admin API is told before the connection closes.
const PLAINTEXT_ANSWER: &str =
    "this admin API is served over TLS (the job's transport security is tls): use https://\n";

/// The URL scheme of an admin API served with `tls` (or without).
pub fn scheme(tls: bool) -> &'static str {
    if tls { "https" } else { "http" }
}

/// `url` (an admin API's base URL, without its trailing `/`) checked against the job's
/// transport security: a job with TLS is only reached over `https://`, and a job without it only
/// over `http://` (its server speaks no TLS, so the client would fail with a less clear error).
pub fn base_url(url: &str, tls: bool) -> Result<String, String> {
    let url = url.trim_end_matches('/');
    let wanted = scheme(tls);
    match url.split_once("://") {
        Some((given, _)) if given.eq_ignore_ascii_case(wanted) => Ok(url.to_owned()),
        Some((given, _)) => Err(format!(
            "the coordinator URL {url:?} is {given}://, but the job's transport security is {}: \
             use {wanted}://",
            if tls { "tls" } else { "none" }
        )),
        None => Err(format!(
            "the coordinator URL {url:?} names no scheme: use {wanted}://"
        )),
    }
}

/// A builder of HTTP clients: for an admin API served with `tls`, one that accepts only a
/// server holding the job's key and only `https://`; otherwise a plain one.
///
/// Every HTTP client of the workspace is built here. reqwest is built with rustls but without a
/// crypto provider of its own (its default would be aws-lc, a second C build), so this installs
/// rustls's `ring` provider for the process first: a client built otherwise would panic.
pub fn client(tls: Option<&JobTls>) -> reqwest::ClientBuilder {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Losing a race to another thread installing it is fine: one is installed.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
    let builder = reqwest::Client::builder();
    match tls {
        Some(tls) => builder
            .tls_backend_preconfigured((*tls.admin_client).clone())
            .https_only(true),
        None => builder,
    }
}

/// A builder of clients for the admin API at `url` of the job whose key is `key`: pinned to the
/// job's key when `url` is `https://`, plain otherwise (tools and tests that are handed a URL).
pub fn client_for_url(url: &str, key: &[u8]) -> reqwest::ClientBuilder {
    if url
        .get(..8)
        .is_some_and(|s| s.eq_ignore_ascii_case("https://"))
    {
        client(Some(&JobTls::new(key)))
    } else {
        client(None)
    }
}

/// Serves `router` on `listener` until `shutdown` completes: over TLS with the job's admin
/// certificate when `tls` is set, plain HTTP otherwise. Refused TLS connections are counted on
/// `refused` by reason.
pub async fn serve(
    listener: TcpListener,
    router: axum::Router,
    tls: Option<&JobTls>,
    refused: IntCounterVec,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    match tls {
        None => {
            axum::serve(listener, router)
                .with_graceful_shutdown(shutdown)
                .await
        }
        Some(tls) => {
            let listener = TlsListener::new(listener, tls.admin_server.clone(), refused)?;
            axum::serve(listener, router)
                .with_graceful_shutdown(shutdown)
                .await
        }
    }
}

/// Why an admin connection was closed before HTTP.
#[derive(Debug, thiserror::Error)]
enum Refusal {
    #[error("it spoke plaintext to a TLS admin API")]
    Plaintext,
    #[error("its TLS handshake failed: {0}")]
    Tls(io::Error),
    #[error("it did not finish its TLS handshake in {HANDSHAKE_TIMEOUT:?}")]
    Timeout,
    /// Not counted: a TCP check (a readiness probe) connects and closes.
    #[error("it closed the connection before its handshake")]
    Closed,
}

impl Refusal {
    fn category(&self) -> &'static str {
        match self {
            Refusal::Plaintext => "plaintext",
            Refusal::Tls(_) => "tls",
            Refusal::Timeout => "handshake_timeout",
            Refusal::Closed => "closed",
        }
    }
}

/// A listener of TLS connections for axum: a task accepts TCP connections and runs each
/// handshake in its own task, so [`axum::serve::Listener::accept`] only hands over finished
/// ones. Dropping it stops the task and closes the socket.
pub struct TlsListener {
    handshaken: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
    accepting: tokio::task::JoinHandle<()>,
}

impl TlsListener {
    /// Accepts on `listener` with `config`; must be called within a tokio runtime.
    pub fn new(
        listener: TcpListener,
        config: Arc<rustls::ServerConfig>,
        refused: IntCounterVec,
    ) -> io::Result<Self> {
        let local = listener.local_addr()?;
        let (done, handshaken) = mpsc::channel(64);
        let acceptor = TlsAcceptor::from(config);
        let permits = Arc::new(Semaphore::new(MAX_HANDSHAKES));
        let accepting = tokio::spawn(async move {
            loop {
                let Some((permit, stream, peer)) =
                    crate::server::accept_permitted(&listener, &permits, "admin API: ").await
                else {
                    return;
                };
                let (acceptor, done, refused) = (acceptor.clone(), done.clone(), refused.clone());
                tokio::spawn(async move {
                    let result =
                        tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake(&acceptor, stream))
                            .await
                            .unwrap_or(Err(Refusal::Timeout));
                    drop(permit);
                    match result {
                        Ok(stream) => {
                            let _ = done.send((stream, peer)).await;
                        }
                        // A TCP check (the kubelet's readiness probe): connected, sent nothing.
                        Err(Refusal::Closed) => {
                            tracing::debug!(%peer, "admin API: closed before a byte (a TCP check)");
                        }
                        Err(refusal) => {
                            refused.with_label_values(&[refusal.category()]).inc();
                            tracing::warn!(%peer, reason = refusal.category(), %refusal, "admin API: connection refused");
                        }
                    }
                });
            }
        });
        Ok(Self {
            handshaken,
            local,
            accepting,
        })
    }
}

impl Drop for TlsListener {
    fn drop(&mut self) {
        self.accepting.abort();
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.handshaken.recv().await {
            Some(accepted) => accepted,
            // The accepting task ended (it does not, short of a panic): nothing more comes.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        Ok(self.local)
    }
}

/// The TLS handshake of one connection, or a plaintext client told to use `https://`.
async fn handshake(
    acceptor: &TlsAcceptor,
    mut stream: TcpStream,
) -> Result<TlsStream<TcpStream>, Refusal> {
    let _ = stream.set_nodelay(true);
    let mut first = [0u8; 1];
    match stream.peek(&mut first).await {
        Ok(0) | Err(_) => return Err(Refusal::Closed),
        Ok(_) => {}
    }
    if first[0] != TLS_HANDSHAKE_RECORD {
        answer_plaintext(&mut stream).await;
        return Err(Refusal::Plaintext);
    }
    acceptor.accept(stream).await.map_err(Refusal::Tls)
}

/// Reads what a plaintext client sent (up to its headers' end, 8 KiB or a second: closing a
/// socket with unread bytes resets it, and the client would not see the answer), then answers
/// 400 with [`PLAINTEXT_ANSWER`].
async fn answer_plaintext(stream: &mut TcpStream) {
    let mut request = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        while request.len() < 8192 && !request.windows(4).any(|w| w == b"\r\n\r\n") {
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => request.extend_from_slice(&chunk[..n]),
            }
        }
    })
    .await;
    let answer = format!(
        "HTTP/1.1 400 Bad Request\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{PLAINTEXT_ANSWER}",
        PLAINTEXT_ANSWER.len()
    );
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        let _ = stream.write_all(answer.as_bytes()).await;
        let _ = stream.shutdown().await;
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::RuntimeMetrics;

    #[test]
    fn a_base_url_must_name_the_jobs_scheme() {
        assert_eq!(
            base_url("https://c.ml.svc:7070/", true).unwrap(),
            "https://c.ml.svc:7070"
        );
        assert_eq!(
            base_url("http://127.0.0.1:1", false).unwrap(),
            "http://127.0.0.1:1"
        );
        let downgrade = base_url("http://c.ml.svc:7070", true).unwrap_err();
        assert!(
            downgrade.contains("\"http://c.ml.svc:7070\"") && downgrade.contains("use https://"),
            "{downgrade}"
        );
        let bare = base_url("c.ml.svc:7070", false).unwrap_err();
        assert!(
            bare.contains("no scheme") && bare.contains("http://"),
            "{bare}"
        );
    }

    /// A TLS admin API on port 0 serving `/status`, the job's TLS, and its metrics.
    async fn tls_admin(key: &[u8]) -> (SocketAddr, JobTls, RuntimeMetrics) {
        let tls = JobTls::new(key);
        let metrics = RuntimeMetrics::unregistered();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let router = axum::Router::new().route("/status", axum::routing::get(|| async { "ok" }));
        let (served, refused) = (tls.clone(), metrics.admin_connections_refused.clone());
        tokio::spawn(async move {
            serve(
                listener,
                router,
                Some(&served),
                refused,
                std::future::pending(),
            )
            .await
        });
        (addr, tls, metrics)
    }

    #[tokio::test]
    async fn the_jobs_client_is_served_and_every_other_is_refused() {
        let (addr, tls, metrics) = tls_admin(b"job key").await;
        let url = format!("https://{addr}/status");
        let ours = client(Some(&tls)).build().unwrap();
        let answer = ours.get(&url).send().await.unwrap();
        assert_eq!(answer.text().await.unwrap(), "ok");

        // A client pinned to another job's key refuses the server.
        let theirs = client(Some(&JobTls::new(b"another job"))).build().unwrap();
        assert!(theirs.get(&url).send().await.is_err());

        // A plaintext client is told to use https://, and counted.
        let plain = client(None).build().unwrap();
        let told = plain
            .get(format!("http://{addr}/status"))
            .send()
            .await
            .unwrap();
        assert_eq!(told.status(), reqwest::StatusCode::BAD_REQUEST);
        assert!(told.text().await.unwrap().contains("use https://"));
        let refused = |reason: &str| {
            metrics
                .admin_connections_refused
                .with_label_values(&[reason])
                .get()
        };
        assert_eq!(refused("plaintext"), 1);

        // The job's client will not send its token in clear.
        assert!(
            ours.get(format!("http://{addr}/status"))
                .send()
                .await
                .is_err()
        );
    }

    #[tokio::test]
    async fn a_stalled_handshake_holds_up_no_one() {
        let (addr, tls, _metrics) = tls_admin(b"job key").await;
        // Opens a connection and sends one byte of a TLS record, then nothing.
        let mut stalled = TcpStream::connect(addr).await.unwrap();
        stalled.write_all(&[TLS_HANDSHAKE_RECORD]).await.unwrap();
        let ours = client(Some(&tls))
            .timeout(Duration::from_secs(5))
            .build()
            .unwrap();
        let answer = ours
            .get(format!("https://{addr}/status"))
            .send()
            .await
            .unwrap();
        assert_eq!(answer.text().await.unwrap(), "ok");
        drop(stalled);
    }

    #[test]
    fn the_admin_certificate_is_the_keys_and_pins_its_key() {
        let (a, b) = (JobTls::new(b"job a"), JobTls::new(b"job a"));
        assert_eq!(a.admin_certificate_pem(), b.admin_certificate_pem());
        assert_ne!(
            a.admin_certificate_pem(),
            JobTls::new(b"job b").admin_certificate_pem()
        );
        let pem = a.admin_certificate_pem();
        assert!(pem.starts_with("-----BEGIN CERTIFICATE-----\n"), "{pem}");
        assert!(pem.ends_with("-----END CERTIFICATE-----\n"), "{pem}");
        assert!(pem.lines().all(|line| line.len() <= 64));
        let pin = a.admin_public_key_pin();
        assert!(pin.starts_with("sha256//") && pin.len() == 8 + 44, "{pin}");
        assert_ne!(pin, JobTls::new(b"job b").admin_public_key_pin());
    }
}
