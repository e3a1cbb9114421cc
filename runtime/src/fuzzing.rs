//! What the coverage-guided fuzzer drives (`fuzz/`: cargo-afl, AFL++ on stable Rust) and the
//! regression tests replay (`runtime/tests/fuzz_regressions.rs`): each entry point takes
//! arbitrary bytes, as a hostile peer would send them, and panics only on a bug (a crash, a peer
//! let in without the job key, a state changed by a request without it, a message that does not
//! survive its own encoding), never on bad input.
//!
//! - [`frames`]: the frame decoder and every message decoder, as a server reads a stream.
//! - [`connection`]: a whole data-plane connection served over an in-memory stream, by a peer
//!   that does not know the job key or by one that does (the harness proves it, then sends the
//!   fuzzed bytes as frames after the handshake): the handshake, then every request handler.
//! - [`admin`]: the elastic coordinator's admin API (`/join`, `/status`, `/notice`, `/stop`,
//!   `/heartbeat`, `/metrics`), each route with or without the key, the body fuzzed.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tower::ServiceExt as _;

use crate::app::{RowInit, TableSpec};
use crate::elastic_coordinator::{ElasticService, router};
use crate::frame::{HEADER_BYTES, check};
use crate::handshake;
use crate::heartbeat::Heartbeats;
use crate::message::Message;
use crate::metrics::RuntimeMetrics;
use crate::optimizer::Optimizer;
use crate::server::{ServerConfig, serve_stream};
use crate::store::ServerState;

/// The frame cap of the fuzzed server: small, so a warm-up or a large registration a fuzzed
/// frame asks for stays cheap (the cap bounds both).
pub const MAX_FRAME_BYTES: usize = 64 << 10;

/// The job key of the fuzzed server and coordinator. A fuzzed peer never sees it; the harness
/// proves it for the peers of the "keyed" kind.
pub const KEY: &str = "fuzzing-job-key-0123456789abcdef";

/// In a keyed admin request's body, this is replaced by [`KEY`] (so a fuzzed join can carry
/// the right secret without the fuzzer knowing it).
pub const KEY_PLACEHOLDER: &[u8] = b"@KEY@";

/// The runtime the [`connection`] and [`admin`] targets run on: one thread, built once per
/// fuzzing process.
///
/// # Panics
/// If tokio cannot start (no thread, no timer), which no input can cause.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

/// Decodes `data` as a stream of frames, as a server reads one: each complete frame's message
/// is decoded, and one that decodes must encode to bytes that decode and encode to the same
/// bytes again.
///
/// # Panics
/// When a decoded message does not survive its own encoding.
pub fn frames(data: &[u8]) {
    let mut at = 0;
    while at < data.len() {
        let Ok(total) = check(&data[at..], MAX_FRAME_BYTES) else {
            return;
        };
        if let Ok(message) = Message::decode(&data[at + HEADER_BYTES..at + total]) {
            let mut once = Vec::new();
            message.encode(&mut once);
            let again = Message::decode(&once[HEADER_BYTES..]).unwrap_or_else(|error| {
                panic!("{message:?} encodes to bytes that do not decode: {error}")
            });
            let mut twice = Vec::new();
            again.encode(&mut twice);
            assert_eq!(once, twice, "{message:?} changes through its encoding");
        }
        at += total;
    }
}

/// A server state of one partition (epoch 1) of one width-2 table, as the data-plane tests and
/// the harness use; `strict`: BSP reads.
pub fn one_table(strict: bool) -> Arc<ServerState> {
    let specs = vec![TableSpec {
        id: 0,
        name: "t".into(),
        width: 2,
        init: RowInit::Zeros,
    }];
    Arc::new(ServerState::new(
        &[(0, 1)],
        1,
        &specs,
        1,
        Optimizer::Add,
        strict,
    ))
}

/// The frames at the start of `bytes` that decode.
fn decoded(bytes: &[u8]) -> Vec<Message<'_>> {
    let mut out = Vec::new();
    let mut at = 0;
    while let Ok(total) = check(&bytes[at..], usize::MAX >> 1) {
        match Message::decode(&bytes[at + HEADER_BYTES..at + total]) {
            Ok(message) => out.push(message),
            Err(_) => break,
        }
        at += total;
    }
    out
}

/// Serves one data-plane connection whose peer is described by `data`. Its first byte picks
/// the peer: even, one that does not know the job key, and all the rest is what it sends; odd,
/// one that does: the harness sends its hello, checks the server's proof, sends the client's,
/// and the rest follows as what the peer sends after the handshake. The peer then closes its
/// side and reads until the server closes. Returns what the server sent after the challenge
/// (for a keyed peer) or all it sent.
///
/// # Panics
/// When the handler panics, when a peer without the key is welcomed or answered anything but
/// a challenge and a refusal, or when the server does not prove the key to a keyed peer.
pub fn connection(rt: &tokio::runtime::Runtime, data: &[u8]) -> Vec<u8> {
    let Some((&mode, rest)) = data.split_first() else {
        return Vec::new();
    };
    let keyed = mode & 1 == 1;
    let config = ServerConfig {
        max_frame_bytes: MAX_FRAME_BYTES,
        handshake_timeout: Duration::from_millis(500),
        wait_timeout: Duration::from_millis(1),
        ..ServerConfig::with_secret(KEY.as_bytes().to_vec())
    };
    let state = one_table(false);
    rt.block_on(async move {
        let (client, server) = tokio::io::duplex(1 << 16);
        let serving = tokio::spawn(async move { serve_stream(server, &state, &config).await });
        let (mut from_server, mut to_server) = tokio::io::split(client);
        let mut answer = Vec::new();
        if keyed {
            let nonce = [7u8; handshake::NONCE_BYTES];
            let mut out = Vec::new();
            Message::Hello {
                node: 9,
                nonce: &nonce,
            }
            .encode(&mut out);
            to_server
                .write_all(&out)
                .await
                .expect("the server reads a hello");
            let mut challenge = Vec::new();
            let total = loop {
                if let Ok(total) = check(&challenge, MAX_FRAME_BYTES) {
                    break total;
                }
                let mut chunk = [0u8; 256];
                let read = from_server
                    .read(&mut chunk)
                    .await
                    .expect("the server answers a hello");
                assert!(read > 0, "the server closed instead of answering a hello");
                challenge.extend_from_slice(&chunk[..read]);
            };
            let Ok(Message::Challenge {
                nonce: server_nonce,
                proof,
            }) = Message::decode(&challenge[HEADER_BYTES..total])
            else {
                panic!("the server's answer to a hello is not a challenge");
            };
            assert!(
                handshake::verify_server(KEY.as_bytes(), 9, &nonce, server_nonce, proof),
                "the server did not prove the job key"
            );
            out.clear();
            Message::Proof {
                proof: &handshake::client_proof(KEY.as_bytes(), 9, &nonce, server_nonce),
            }
            .encode(&mut out);
            let _ = to_server.write_all(&out).await;
            answer.extend_from_slice(&challenge[total..]);
        }
        // The peer's bytes and the server's answers at once: a server answering while the peer
        // still sends must not stall it.
        let send = async {
            let _ = to_server.write_all(rest).await;
            let _ = to_server.shutdown().await;
        };
        let receive = async {
            let _ = from_server.read_to_end(&mut answer).await;
        };
        tokio::join!(send, receive);
        let result = serving.await;
        let result =
            result.unwrap_or_else(|panic| panic!("the connection handler panicked: {panic}"));
        if !keyed {
            let messages = decoded(&answer);
            assert!(
                !messages.iter().any(|m| matches!(m, Message::Welcome)),
                "a peer without the key was welcomed: {messages:?} ({result:?})"
            );
            assert!(
                messages
                    .iter()
                    .all(|m| matches!(m, Message::Challenge { .. } | Message::Error { .. })),
                "a peer without the key was answered {messages:?}"
            );
        }
        answer
    })
}

/// The admin routes the fuzzer picks from (the last is no route).
const ROUTES: [(&str, &str); 7] = [
    ("GET", "/status"),
    ("POST", "/join"),
    ("POST", "/notice"),
    ("POST", "/stop"),
    ("POST", "/heartbeat"),
    ("GET", "/metrics"),
    ("POST", "/no-such-route"),
];

/// Sends one admin request described by `data` to a fresh coordinator: the first byte picks
/// the route (its low bits) and whether the request carries the job key (bit 3: as its bearer
/// token, and in place of [`KEY_PLACEHOLDER`] in the body); the rest is the body.
///
/// # Panics
/// When a handler panics, or when a request without the key is answered with success on any
/// route but `/metrics`, or changes what `/status` reports.
pub fn admin(rt: &tokio::runtime::Runtime, data: &[u8]) -> Option<axum::http::StatusCode> {
    let (&pick, body) = data.split_first()?;
    let (method, path) = ROUTES[usize::from(pick & 7) % ROUTES.len()];
    let keyed = pick & 8 != 0;
    let registry = prometheus::Registry::new();
    let heartbeats = Arc::new(
        Heartbeats::new(Duration::from_secs(60), &registry)
            .expect("heartbeat metrics register on a fresh registry"),
    );
    let service = ElasticService::new(
        KEY.to_owned(),
        String::new(),
        1,
        Arc::default(),
        registry,
        RuntimeMetrics::unregistered(),
        heartbeats,
    );
    let body = if keyed {
        replace_all(body, KEY_PLACEHOLDER, KEY.as_bytes())
    } else {
        body.to_vec()
    };
    let bearer = if keyed { KEY } else { "not-the-key" };
    let before = serde_json::to_string(&service.status()).expect("a status serializes");
    let request = axum::http::Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", "application/json")
        .header("authorization", format!("Bearer {bearer}"))
        .body(axum::body::Body::from(body))
        .expect("a request of a known method and path builds");
    let app = router(service.clone());
    let status = rt.block_on(async move {
        let response = app
            .oneshot(request)
            .await
            .unwrap_or_else(|never| match never {});
        let status = response.status();
        // The body is read as a client would (an error's message included).
        let _ = axum::body::to_bytes(response.into_body(), 1 << 20).await;
        status
    });
    if !keyed {
        assert!(
            !status.is_success() || path == "/metrics",
            "{method} {path} without the key answered {status}"
        );
        let after = serde_json::to_string(&service.status()).expect("a status serializes");
        assert_eq!(
            before, after,
            "{method} {path} without the key changed the coordinator"
        );
    }
    Some(status)
}

/// The fuzzer's starting inputs, as (target, name, bytes): one of each message a peer sends,
/// for each kind of peer, and one request per admin route with and without the key. The
/// regression tests replay them too.
pub fn seeds() -> Vec<(&'static str, String, Vec<u8>)> {
    let nonce = [3u8; handshake::NONCE_BYTES];
    let values = [1.0f32, -2.5];
    let messages: Vec<(&str, Message<'_>)> = vec![
        (
            "hello",
            Message::Hello {
                node: 1,
                nonce: &nonce,
            },
        ),
        (
            "proof",
            Message::Proof {
                proof: &[5; handshake::PROOF_BYTES],
            },
        ),
        (
            "register",
            Message::Register {
                worker: 0,
                partition: 0,
                epoch: 1,
                tables: vec![(0, vec![1, 2])],
                read_through: Some(0),
            },
        ),
        (
            "push",
            Message::Push {
                worker: 0,
                clock: 0,
                partition: 0,
                epoch: 1,
                values: crate::message::Values::F32(&values),
            },
        ),
        (
            "pull",
            Message::Pull {
                worker: 0,
                partition: 0,
                epoch: 1,
                min_clock: 0,
            },
        ),
        (
            "dump",
            Message::Dump {
                partition: 0,
                epoch: 1,
            },
        ),
        ("warm", Message::Warm { bytes: 4096 }),
        (
            "control",
            Message::Control {
                json: "{}",
                blob: b"",
            },
        ),
        (
            "error",
            Message::Error {
                category: "unauthenticated",
                message: "no",
            },
        ),
    ];
    let encoded = |message: &Message<'_>| {
        let mut out = Vec::new();
        message.encode(&mut out);
        out
    };
    let mut out = Vec::new();
    let mut all = Vec::new();
    for (name, message) in &messages {
        let bytes = encoded(message);
        all.extend_from_slice(&bytes);
        out.push(("frames", (*name).to_owned(), bytes.clone()));
        // After a proven handshake: the request alone.
        out.push((
            "connection",
            format!("keyed-{name}"),
            [&[1u8][..], &bytes].concat(),
        ));
    }
    out.push(("frames", "all".to_owned(), all.clone()));
    out.push((
        "connection",
        "keyed-all".to_owned(),
        [&[1u8][..], &all].concat(),
    ));
    // A peer without the key: a hello, a wrong proof, then a request.
    let unkeyed = [
        &[0u8][..],
        &encoded(&messages[0].1),
        &encoded(&messages[1].1),
        &encoded(&messages[4].1),
    ]
    .concat();
    out.push(("connection", "unkeyed-hello-proof-pull".to_owned(), unkeyed));
    let bodies: [&[u8]; 7] = [
        b"",
        br#"{"name":"n","data_addr":"127.0.0.1:7071","workers":2,"secret":"@KEY@","reliable":true,"serves":true,"job":""}"#,
        br#"{"name":"n","deadline_unix":1,"deadline_unix_ms":1000}"#,
        b"",
        br#"{"name":"n"}"#,
        b"",
        b"{}",
    ];
    for (route, body) in bodies.iter().enumerate() {
        let name = ROUTES[route].1.trim_start_matches('/');
        for (keyed, flag) in [("keyed", 8u8), ("unkeyed", 0)] {
            let pick = u8::try_from(route).unwrap_or(0) | flag;
            out.push((
                "admin",
                format!("{keyed}-{name}"),
                [&[pick][..], body].concat(),
            ));
        }
    }
    out
}

/// `haystack` with every `needle` replaced by `with`.
fn replace_all(haystack: &[u8], needle: &[u8], with: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(haystack.len());
    let mut at = 0;
    while at < haystack.len() {
        if haystack[at..].starts_with(needle) {
            out.extend_from_slice(with);
            at += needle.len();
        } else {
            out.push(haystack[at]);
            at += 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The harness itself: a keyed peer gets through the handshake and is served; an unkeyed
    /// peer's proof is refused; a keyed join is admitted and an unkeyed one is not.
    #[test]
    fn the_harness_reaches_the_handlers_with_the_key_only() {
        let rt = runtime();
        let mut pull = vec![1u8];
        // The one partition is at epoch 1.
        Message::Dump {
            partition: 0,
            epoch: 1,
        }
        .encode(&mut pull);
        let answer = connection(&rt, &pull);
        let answered = decoded(&answer);
        assert!(
            matches!(
                answered.as_slice(),
                [Message::Welcome, Message::DumpRows { .. }]
            ),
            "a keyed peer's dump: {answered:?}"
        );
        let mut unkeyed = vec![0u8];
        Message::Hello {
            node: 1,
            nonce: &[1; handshake::NONCE_BYTES],
        }
        .encode(&mut unkeyed);
        Message::Proof { proof: &[0; 32] }.encode(&mut unkeyed);
        let answered = connection(&rt, &unkeyed);
        let answered = decoded(&answered);
        assert!(
            matches!(
                answered.as_slice(),
                [
                    Message::Challenge { .. },
                    Message::Error {
                        category: "unauthenticated",
                        ..
                    }
                ]
            ),
            "a peer without the key: {answered:?}"
        );
        let join = br#"{"name":"n","data_addr":"127.0.0.1:1","workers":1,"secret":"@KEY@"}"#;
        let admitted = admin(&rt, &[&[1u8 | 8][..], join].concat()).unwrap();
        assert!(admitted.is_success(), "a keyed join: {admitted}");
        let refused = admin(&rt, &[&[1u8][..], join].concat()).unwrap();
        assert!(refused.is_client_error(), "an unkeyed join: {refused}");
        frames(&pull[1..]);
        assert_eq!(replace_all(b"a@KEY@b", KEY_PLACEHOLDER, b"k"), b"akb");
    }
}
