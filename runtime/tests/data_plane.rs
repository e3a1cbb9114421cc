//! The TCP data plane: loopback runs match single-process runs; bad peers are refused while
//! good ones keep being served; a peer that vanishes is let go.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ebbflow_runtime::client::{ClientConfig, Connection};
use ebbflow_runtime::exact::{ExactApp, ExactConfig};
use ebbflow_runtime::frame::{HEADER_BYTES, check};
use ebbflow_runtime::handshake;
use ebbflow_runtime::local::run_single_process;
use ebbflow_runtime::message::{Message, Values};
use ebbflow_runtime::metrics::RuntimeMetrics;
use ebbflow_runtime::node::{ServerHandle, run_loopback};
use ebbflow_runtime::partition::partition_of;
use ebbflow_runtime::server::ServerConfig;
use ebbflow_runtime::worker::JobConfig;

fn exact_job(workers: usize, staleness: u64) -> (ExactApp, JobConfig) {
    let clocks = 8;
    let app = ExactApp::new(ExactConfig {
        rows: 61,
        width: 2,
        tables: 2,
        shared_rows: 3,
        clocks,
        staleness,
        clock_delay: std::time::Duration::ZERO,
        update_period: 1,
    });
    let config = JobConfig {
        clocks,
        staleness,
        workers,
        partitions: 6,
        keep_params: true,
        ..JobConfig::default()
    };
    (app, config)
}

#[test]
fn loopback_runs_are_exact_and_equal_single_process_runs() {
    for staleness in [0, 2] {
        let (app, config) = exact_job(3, staleness);
        let tcp = run_loopback(&app, &config, 2, &RuntimeMetrics::unregistered()).unwrap();
        assert_eq!(tcp.eval.loss, 0.0, "staleness {staleness}: {:?}", tcp.eval);
        assert_eq!(
            tcp.total_stats().loss_sum,
            0.0,
            "staleness {staleness}: ssp bound violated over tcp"
        );
        let (app, config) = exact_job(3, staleness);
        let local = run_single_process(&app, &config, &RuntimeMetrics::unregistered()).unwrap();
        assert_eq!(tcp.params, local.params);
        assert_eq!(tcp.param_sum, local.param_sum);
    }
}

const SECRET: &[u8] = b"job-secret";

/// A plaintext client of node `node` holding `key`, with a read timeout of `timeout`.
fn plain_client(key: &[u8], node: u32, timeout: Duration) -> ClientConfig {
    ClientConfig {
        secret: key.to_vec(),
        node,
        max_frame_bytes: 1 << 20,
        timeout,
        tls: None,
    }
}

fn start_server(runtime: &tokio::runtime::Runtime, metrics: &RuntimeMetrics) -> ServerHandle {
    let config = ServerConfig {
        max_frame_bytes: 1 << 20,
        handshake_timeout: Duration::from_secs(2),
        ..ServerConfig::with_secret(SECRET.to_vec())
    };
    serve_one_table(runtime, metrics, ([127, 0, 0, 1], 0).into(), config)
}

/// A server of one partition holding one row of a width-2 table, on `addr`.
fn serve_one_table(
    runtime: &tokio::runtime::Runtime,
    metrics: &RuntimeMetrics,
    addr: std::net::SocketAddr,
    config: ServerConfig,
) -> ServerHandle {
    let state = ebbflow_runtime::fuzzing::one_table(false);
    ServerHandle::start(runtime.handle(), addr, state, config, metrics.clone()).unwrap()
}

/// A raw connection to `addr` that went through the handshake with `key` (as node 9), the
/// server's welcome not read yet; `None`: no handshake at all.
fn raw_connection(addr: SocketAddr, key: Option<&[u8]>) -> TcpStream {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    if let Some(key) = key {
        let (_, proof) = hello_and_challenge(&mut stream, key);
        stream.write_all(&proof).unwrap();
    }
    stream
}

/// Sends a hello as node 9, reads the server's challenge: the challenge's frame, and the proof
/// frame `key` answers it with.
fn hello_and_challenge(stream: &mut TcpStream, key: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let nonce = handshake::nonce();
    let mut out = Vec::new();
    Message::Hello {
        node: 9,
        nonce: &nonce,
    }
    .encode(&mut out);
    stream.write_all(&out).unwrap();
    let mut header = [0u8; HEADER_BYTES];
    stream.read_exact(&mut header).unwrap();
    let mut challenge = header.to_vec();
    challenge.resize(HEADER_BYTES + u32::from_le_bytes(header) as usize, 0);
    stream.read_exact(&mut challenge[HEADER_BYTES..]).unwrap();
    let Message::Challenge {
        nonce: server,
        proof,
    } = Message::decode(&challenge[HEADER_BYTES..]).unwrap()
    else {
        panic!("no challenge to a hello");
    };
    assert!(handshake::verify_server(SECRET, 9, &nonce, server, proof));
    let mut answer = Vec::new();
    Message::Proof {
        proof: &handshake::client_proof(key, 9, &nonce, server),
    }
    .encode(&mut answer);
    (challenge, answer)
}

/// Writes raw bytes on `stream` and waits for the server to close the connection; returns the
/// category of the `Error` frame it sent first, if any (after a welcome, for peers that got one).
fn expect_closed(mut stream: TcpStream, bytes: &[u8], close_write: bool) -> Option<String> {
    stream.write_all(bytes).unwrap();
    if close_write {
        stream.shutdown(std::net::Shutdown::Write).unwrap();
    }
    let mut rest = Vec::new();
    let _ = stream.read_to_end(&mut rest);
    let mut refusal = None;
    let mut at = 0;
    while at < rest.len() {
        let total = check(&rest[at..], 1 << 20).expect("the server sent a whole frame");
        match Message::decode(&rest[at + HEADER_BYTES..at + total]).unwrap() {
            Message::Welcome if at == 0 => {}
            Message::Error { category, message } if refusal.is_none() => {
                assert!(!message.is_empty());
                refusal = Some(category.to_owned());
            }
            other => panic!("server kept talking: {other:?}"),
        }
        at += total;
    }
    refusal
}

fn wait_for_count(metrics: &RuntimeMetrics, reason: &str, count: u64) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while metrics
        .connections_refused
        .with_label_values(&[reason])
        .get()
        < count
    {
        assert!(Instant::now() < deadline, "no {reason} refusal recorded");
        std::thread::yield_now();
    }
}

#[test]
fn bad_peers_are_refused_while_a_good_client_keeps_working() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let metrics = RuntimeMetrics::unregistered();
    let server = start_server(&runtime, &metrics);
    let timeout = Duration::from_secs(60);
    // A worker with the wrong secret learns why it was refused.
    let refused =
        Connection::connect(server.addr, &plain_client(b"stale", 1, timeout)).unwrap_err();
    assert!(refused.to_string().contains("unauthenticated"), "{refused}");
    let mut good = Connection::connect(server.addr, &plain_client(SECRET, 1, timeout)).unwrap();
    let key = (0..).find(|&k| partition_of(k, 1) == 0).unwrap();
    // A claim to hold rows of a clock the partition has not reached is refused.
    good.send(&Message::Register {
        worker: 0,
        partition: 0,
        epoch: 1,
        tables: vec![(0, vec![key])],
        read_through: Some(3),
    })
    .unwrap();
    good.flush().unwrap();
    let refused = good.recv().unwrap_err();
    assert_eq!(refused.category(), "refused");
    assert!(refused.to_string().contains("clock 3"), "{refused}");
    good.send(&Message::Register {
        worker: 0,
        partition: 0,
        epoch: 1,
        tables: vec![(0, vec![key])],
        read_through: None,
    })
    .unwrap();
    good.flush().unwrap();
    assert!(matches!(
        good.recv().unwrap(),
        Message::Registered { len: 2, .. }
    ));

    // A wrong key, a replayed proof, a hello without a proper nonce, the old hello that
    // carried the secret (a downgrade), and no hello at all (a request as first frame). Each is
    // told why before the server hangs up.
    let addr = server.addr;
    assert_eq!(
        expect_closed(raw_connection(addr, Some(b"wrong")), &[], false).as_deref(),
        Some("unauthenticated")
    );
    let mut recorded = TcpStream::connect(addr).unwrap();
    let (_, proof) = hello_and_challenge(&mut recorded, SECRET);
    drop(recorded);
    let mut replay = raw_connection(addr, None);
    let (_, _) = hello_and_challenge(&mut replay, SECRET);
    assert_eq!(
        expect_closed(replay, &proof, false).as_deref(),
        Some("unauthenticated"),
        "a proof recorded on another connection answers the wrong challenge"
    );
    let mut short = Vec::new();
    Message::Hello {
        node: 9,
        nonce: b"short",
    }
    .encode(&mut short);
    assert_eq!(
        expect_closed(raw_connection(addr, None), &short, false).as_deref(),
        Some("unauthenticated")
    );
    // the hello of the plaintext protocol: kind 1, the secret, the node
    let mut plaintext = vec![0u8; HEADER_BYTES];
    plaintext.push(1);
    plaintext.extend_from_slice(&(SECRET.len() as u32).to_le_bytes());
    plaintext.extend_from_slice(SECRET);
    plaintext.extend_from_slice(&9u32.to_le_bytes());
    let len = (plaintext.len() - HEADER_BYTES) as u32;
    plaintext[..HEADER_BYTES].copy_from_slice(&len.to_le_bytes());
    assert!(
        matches!(
            expect_closed(raw_connection(addr, None), &plaintext, false).as_deref(),
            Some("unauthenticated" | "invalid")
        ),
        "the plaintext hello is refused"
    );
    let mut pull = Vec::new();
    Message::Pull {
        worker: 0,
        partition: 0,
        epoch: 1,
        min_clock: 0,
    }
    .encode(&mut pull);
    assert_eq!(
        expect_closed(raw_connection(addr, None), &pull, false).as_deref(),
        Some("unauthenticated")
    );
    // A half-open handshake: a hello, then nothing, until the handshake timeout.
    let mut half_open = raw_connection(addr, None);
    let _ = hello_and_challenge(&mut half_open, SECRET);
    assert_eq!(
        expect_closed(half_open, &[], false).as_deref(),
        Some("handshake_timeout")
    );
    wait_for_count(&metrics, "handshake_timeout", 1);
    // stale client, wrong key, replay, short nonce, pull (the plaintext hello may read as
    // either)
    wait_for_count(&metrics, "unauthenticated", 5);
    // Oversized: a header announcing 1 GiB is refused without reading (or allocating) it.
    assert_eq!(
        expect_closed(
            raw_connection(addr, Some(SECRET)),
            &(1u32 << 30).to_le_bytes(),
            false
        )
        .as_deref(),
        Some("too_large")
    );
    wait_for_count(&metrics, "too_large", 1);
    // Before the key is proven only a hello-sized frame is read: a first frame announcing
    // 512 KiB (within the cap for authenticated peers) is refused at once, not buffered.
    assert_eq!(
        expect_closed(
            raw_connection(addr, None),
            &(512u32 << 10).to_le_bytes(),
            false
        )
        .as_deref(),
        Some("too_large")
    );
    wait_for_count(&metrics, "too_large", 2);
    // Truncated: half a frame, then the peer goes away.
    // (A peer that went away mid-frame is not written to.)
    assert_eq!(
        expect_closed(
            raw_connection(addr, Some(SECRET)),
            &pull[..pull.len() / 2],
            true
        ),
        None
    );
    wait_for_count(&metrics, "truncated", 1);
    // Garbage body.
    assert_eq!(
        expect_closed(
            raw_connection(addr, Some(SECRET)),
            &[3, 0, 0, 0, 250, 1, 2],
            false
        )
        .as_deref(),
        Some("invalid")
    );
    // A server-to-client message from a client.
    let mut welcome = Vec::new();
    Message::Welcome.encode(&mut welcome);
    assert_eq!(
        expect_closed(raw_connection(addr, Some(SECRET)), &welcome, false).as_deref(),
        Some("unexpected")
    );
    wait_for_count(&metrics, "invalid", 1);

    // The good client is still served, and request-level errors keep its connection open.
    good.send(&Message::Push {
        worker: 0,
        clock: 0,
        partition: 0,
        epoch: 7,
        values: Values::F32(&[1.0, 2.0]),
    })
    .unwrap();
    good.flush().unwrap();
    let refused = good.recv().unwrap_err();
    assert_eq!(refused.category(), "refused");
    assert!(refused.to_string().contains("epoch"), "{refused}");
    good.send(&Message::Push {
        worker: 0,
        clock: 0,
        partition: 0,
        epoch: 1,
        values: Values::F32(&[1.0, 2.0]),
    })
    .unwrap();
    good.send(&Message::Push {
        worker: 0,
        clock: 0,
        partition: 0,
        epoch: 1,
        values: Values::F32(&[1.0, 2.0]),
    })
    .unwrap();
    good.send(&Message::Pull {
        worker: 0,
        partition: 0,
        epoch: 1,
        min_clock: 1,
    })
    .unwrap();
    good.flush().unwrap();
    assert!(matches!(
        good.recv().unwrap(),
        Message::Pushed {
            duplicate: false,
            ..
        }
    ));
    assert!(matches!(
        good.recv().unwrap(),
        Message::Pushed {
            duplicate: true,
            ..
        }
    ));
    match good.recv().unwrap() {
        Message::Rows {
            visible, values, ..
        } => {
            assert_eq!(visible, 1);
            assert_eq!(values.to_vec(), vec![1.0, 2.0]);
        }
        other => panic!("expected rows, got {other:?}"),
    }
    assert_eq!(metrics.connections_open.get(), 1);
    drop(good);
    server.stop(runtime.handle());
}

/// BSP makes a read see exactly every update of earlier clocks, so matrix factorization over TCP
/// ends with the same parameters as in one process up to float summation order.
#[test]
fn mf_under_bsp_agrees_over_tcp_and_in_process() {
    use ebbflow_runtime::apps::{MfApp, MfConfig};
    let data = ebbflow_runtime::data::synthetic_ratings(120, 80, 4, 6_000, 0.3, 3).unwrap();
    let (train, test) = data.ratings.split(0.2, 5).unwrap();
    let config = MfConfig {
        rank: 6,
        learning_rate: 0.01,
        ..MfConfig::default()
    };
    let app = MfApp::new(train, test, config).unwrap();
    let job = JobConfig {
        clocks: 6,
        staleness: 0,
        workers: 3,
        partitions: 4,
        keep_params: true,
        ..JobConfig::default()
    };
    let local = run_single_process(&app, &job, &RuntimeMetrics::unregistered()).unwrap();
    let tcp = run_loopback(&app, &job, 2, &RuntimeMetrics::unregistered()).unwrap();
    assert!(
        (local.eval.loss - tcp.eval.loss).abs() <= 1e-4,
        "rmse {} vs {}",
        local.eval.loss,
        tcp.eval.loss
    );
    let relative = (local.param_sum - tcp.param_sum).abs() / local.param_abs_sum;
    assert!(
        relative <= 1e-5,
        "parameter sums {} vs {}",
        local.param_sum,
        tcp.param_sum
    );
    assert!(local.param_abs_sum > 0.0);
}

// A peer that vanishes without closing its connection (a spot instance taken back: its address
// goes away, no FIN, no RST) is let go by the server within `dead_peer_after`, not held for
// ever. The peer is a real TCP client in a network namespace of its own, joined to this one by a
// veth pair; taking its link down makes it vanish. Needs root and `ip` (iproute2); without them
// the test says so and passes (`scripts/test.sh` runs it as root).

/// Runs `ip` with `args`; the error names the command and what it printed.
fn ip(args: &[&str]) -> Result<(), String> {
    let output = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("ip {}: {e}", args.join(" ")))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}

/// A network namespace and the veth pair to it, removed on drop.
struct Namespace {
    name: String,
    host_link: String,
    peer_link: String,
    host: Ipv4Addr,
    peer: Ipv4Addr,
}

impl Namespace {
    /// Namespace `tag` (0-9) of this test process: tests running at once use different tags.
    fn create(tag: u8) -> Result<Self, String> {
        let id = std::process::id() % 100_000;
        let subnet = (id % 250) as u8 + 1;
        let ns = Namespace {
            name: format!("ebbflow-dp-{id}-{tag}"),
            host_link: format!("ebbh{id}{tag}"),
            peer_link: format!("ebbp{id}{tag}"),
            host: Ipv4Addr::new(10, 213, subnet, 4 * tag + 1),
            peer: Ipv4Addr::new(10, 213, subnet, 4 * tag + 2),
        };
        // a namespace left by a killed earlier run of the same pid
        let _ = ip(&["netns", "del", &ns.name]);
        let _ = ip(&["link", "del", &ns.host_link]);
        ip(&["netns", "add", &ns.name])?;
        let (host, peer) = (format!("{}/30", ns.host), format!("{}/30", ns.peer));
        ip(&[
            "link",
            "add",
            &ns.host_link,
            "type",
            "veth",
            "peer",
            "name",
            &ns.peer_link,
        ])?;
        ip(&["link", "set", &ns.peer_link, "netns", &ns.name])?;
        ip(&["addr", "add", &host, "dev", &ns.host_link])?;
        ip(&["link", "set", &ns.host_link, "up"])?;
        ns.exec(&["addr", "add", &peer, "dev", &ns.peer_link])?;
        ns.exec(&["link", "set", &ns.peer_link, "up"])?;
        ns.exec(&["link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// `ip` inside the namespace.
    fn exec(&self, args: &[&str]) -> Result<(), String> {
        let mut all = vec!["netns", "exec", &self.name, "ip"];
        all.extend_from_slice(args);
        ip(&all)
    }
}

impl Drop for Namespace {
    fn drop(&mut self) {
        let _ = ip(&["link", "del", &self.host_link]);
        let _ = ip(&["netns", "del", &self.name]);
    }
}

/// The peer's process, killed on drop (a failed assertion included).
struct Peer(Child);

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs the Python `script` with `args` inside the namespace; its stdout is piped.
fn run_in(ns: &Namespace, script: &str, args: &[String]) -> Peer {
    let script = format!("{HANDSHAKE_PY}{script}");
    Command::new("ip")
        .args(["netns", "exec", &ns.name, "python3", "-c", &script])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map(Peer)
        .expect("starting a process in the namespace")
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The peer's next line of output.
fn line_of(peer: &mut Peer, out: &mut Option<BufReader<std::process::ChildStdout>>) -> String {
    let reader = out.get_or_insert_with(|| BufReader::new(peer.0.stdout.take().unwrap()));
    let mut line = String::new();
    reader.read_line(&mut line).unwrap();
    line.trim().to_owned()
}

/// The namespace for a test, or why there is none (the test then says so and passes).
fn namespace_for(test: &str, tag: u8) -> Option<Namespace> {
    match Namespace::create(tag) {
        Ok(ns) => Some(ns),
        Err(reason) => {
            eprintln!("{test}: skipped, no network namespace could be made: {reason}");
            None
        }
    }
}

/// A client: connects from the namespace, sends `hello`, reads the server's welcome, says
/// "welcomed" and then stays silent.
/// The handshake of `ebbflow_runtime::handshake` in Python (stdlib `hmac`), for the scripts
/// below: frames are a little-endian u32 length and a body.
const HANDSHAKE_PY: &str = r#"
import hashlib, hmac, os, socket, struct, sys, time
def exact(s, n):
    got = b""
    while len(got) < n:
        chunk = s.recv(n - len(got))
        if not chunk:
            sys.exit("the peer closed the connection during the handshake")
        got += chunk
    return got
def read_frame(s):
    (n,) = struct.unpack("<I", exact(s, 4))
    return exact(s, n)
def frame(body):
    return struct.pack("<I", len(body)) + body
def blob(b):
    return struct.pack("<I", len(b)) + b
def blobs(body, at, count):
    out = []
    for _ in range(count):
        (n,) = struct.unpack_from("<I", body, at)
        out.append(body[at + 4:at + 4 + n])
        at += 4 + n
    return out
def mac(key, role, node, client, server):
    label = b"ebbflow/1 " + role
    return hmac.new(key, label + struct.pack("<I", node) + client + server, hashlib.sha256).digest()
"#;

/// A client: connects as node 9 with the key (hex), goes through the handshake, says
/// "welcomed" and then sends and answers nothing.
const SILENT_CLIENT: &str = r#"
host, port, key = sys.argv[1], int(sys.argv[2]), bytes.fromhex(sys.argv[3])
s = socket.create_connection((host, port), timeout=30)
client = os.urandom(32)
s.sendall(frame(bytes([1]) + struct.pack("<I", 9) + blob(client)))
challenge = read_frame(s)
assert challenge[0] == 16, challenge[:1]
server, proof = blobs(challenge, 1, 2)
assert hmac.compare_digest(proof, mac(key, b"server", 9, client, server)), "the server's proof"
s.sendall(frame(bytes([17]) + blob(mac(key, b"client", 9, client, server))))
welcome = read_frame(s)
if welcome != bytes([2]):
    sys.exit("no welcome: %r" % welcome[:1])
print("welcomed", flush=True)
time.sleep(600)
"#;

/// A server: listens in the namespace (prints its port), welcomes one client (the handshake
/// with the key in hex), says "request" once the client's next bytes arrived (and were
/// acknowledged), and never answers.
const SILENT_SERVER: &str = r#"
host, key = sys.argv[1], bytes.fromhex(sys.argv[2])
listener = socket.create_server((host, 0))
print(listener.getsockname()[1], flush=True)
conn, _ = listener.accept()
hello = read_frame(conn)
assert hello[0] == 1, hello[:1]
(node,) = struct.unpack_from("<I", hello, 1)
(client,) = blobs(hello, 5, 1)
server = os.urandom(32)
conn.sendall(frame(bytes([16]) + blob(server) + blob(mac(key, b"server", node, client, server))))
proof = read_frame(conn)
assert proof[0] == 17 and blobs(proof, 1, 1)[0] == mac(key, b"client", node, client, server)
conn.sendall(frame(bytes([2])))
# acknowledge the request at once (no delayed ACK), so it is not in flight when the link goes
conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)
conn.recv(4096)
print("request", flush=True)
time.sleep(600)
"#;

fn wait_until_within(what: &str, within: Duration, done: impl Fn() -> bool) -> Duration {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < within, "{what}: not within {within:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
    start.elapsed()
}

#[test]
fn a_vanished_peer_is_let_go() {
    let Some(ns) = namespace_for("a_vanished_peer_is_let_go", 0) else {
        return;
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let metrics = RuntimeMetrics::unregistered();
    let after = Duration::from_secs(2);
    let config = ServerConfig {
        dead_peer_after: after,
        ..ServerConfig::with_secret(SECRET.to_vec())
    };
    let server = serve_one_table(
        &runtime,
        &metrics,
        SocketAddr::new(IpAddr::V4(ns.host), 0),
        config,
    );
    let args = [
        ns.host.to_string(),
        server.addr.port().to_string(),
        hex(SECRET),
    ];
    let mut peer = run_in(&ns, SILENT_CLIENT, &args);
    let welcomed = line_of(&mut peer, &mut None);
    assert_eq!(welcomed, "welcomed", "the peer was not served");
    assert_eq!(metrics.connections_open.get(), 1);

    // A silent peer that is alive answers the keepalive probes: still connected after more
    // than `after` of silence.
    let silent = Instant::now();
    while silent.elapsed() < after * 2 {
        assert_eq!(
            metrics.connections_open.get(),
            1,
            "a live, silent peer was let go"
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    // The peer vanishes: its link goes down, nothing it sends or answers arrives any more.
    ns.exec(&["link", "set", &ns.peer_link, "down"]).unwrap();
    let took = wait_until_within(
        "the vanished peer's connection closed",
        Duration::from_secs(30),
        || metrics.connections_open.get() == 0,
    );
    eprintln!(
        "a_vanished_peer_is_let_go: let go {took:?} after it vanished (dead_peer_after {after:?})"
    );
    assert!(
        took < after * 4,
        "let go after {took:?}, dead_peer_after is {after:?}"
    );
    assert_eq!(
        metrics
            .connections_refused
            .with_label_values(&["dead_peer"])
            .get(),
        1,
        "the connection is counted as a dead peer's"
    );
    drop(peer);
    server.stop(runtime.handle());
}

/// The other end: a worker waiting for the answer of a server whose instance vanishes fails
/// the request within its keepalive window, not at its read timeout (10 minutes here).
#[test]
fn a_request_to_a_vanished_server_fails() {
    let Some(ns) = namespace_for("a_request_to_a_vanished_server_fails", 1) else {
        return;
    };
    let mut server = run_in(&ns, SILENT_SERVER, &[ns.peer.to_string(), hex(SECRET)]);
    let mut out = None;
    let port: u16 = line_of(&mut server, &mut out).parse().unwrap();
    let mut connection = Connection::connect(
        SocketAddr::new(IpAddr::V4(ns.peer), port),
        &plain_client(SECRET, 3, Duration::from_secs(600)),
    )
    .unwrap();
    let after = Duration::from_secs(2);
    connection.probe_idle_peer(after).unwrap();
    connection
        .send(&Message::Pull {
            worker: 0,
            partition: 0,
            epoch: 1,
            min_clock: 0,
        })
        .unwrap();
    connection.flush().unwrap();
    // the server's kernel acknowledged the request: the worker now only waits for the answer
    assert_eq!(line_of(&mut server, &mut out), "request");
    ns.exec(&["link", "set", &ns.peer_link, "down"]).unwrap();
    let (done, failed) = std::sync::mpsc::channel();
    let start = Instant::now();
    std::thread::spawn(move || {
        let outcome = connection.recv().map(|m| format!("{m:?}"));
        let _ = done.send(outcome.map_err(|e| e.to_string()));
    });
    let outcome = failed
        .recv_timeout(Duration::from_secs(30))
        .expect("the request to the vanished server still waits after 30 s");
    let took = start.elapsed();
    eprintln!(
        "a_request_to_a_vanished_server_fails: failed {took:?} after the server vanished ({outcome:?})"
    );
    let error = outcome.expect_err("a vanished server answered");
    assert!(error.contains("timed out"), "{error}");
    assert!(
        took < after * 4,
        "failed after {took:?}, probing after {after:?}"
    );
    drop(server);
}
