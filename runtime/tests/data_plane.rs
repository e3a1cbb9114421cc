//! The TCP data plane: loopback runs match single-process runs; bad peers are refused while
//! good ones keep being served.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ebbflow_runtime::app::{RowInit, TableSpec};
use ebbflow_runtime::client::Connection;
use ebbflow_runtime::exact::{ExactApp, ExactConfig};
use ebbflow_runtime::frame::{HEADER_BYTES, check};
use ebbflow_runtime::local::run_single_process;
use ebbflow_runtime::message::{Message, Values};
use ebbflow_runtime::metrics::RuntimeMetrics;
use ebbflow_runtime::node::{ServerHandle, run_loopback};
use ebbflow_runtime::optimizer::Optimizer;
use ebbflow_runtime::partition::partition_of;
use ebbflow_runtime::server::ServerConfig;
use ebbflow_runtime::store::ServerState;
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

fn start_server(runtime: &tokio::runtime::Runtime, metrics: &RuntimeMetrics) -> ServerHandle {
    let specs = vec![TableSpec {
        id: 0,
        name: "t".into(),
        width: 2,
        init: RowInit::Zeros,
    }];
    let state = Arc::new(ServerState::new(
        &[(0, 1)],
        1,
        &specs,
        1,
        Optimizer::Add,
        false,
    ));
    let config = ServerConfig {
        max_frame_bytes: 1 << 20,
        ..ServerConfig::with_secret(SECRET.to_vec())
    };
    ServerHandle::start(
        runtime.handle(),
        ([127, 0, 0, 1], 0).into(),
        state,
        config,
        metrics.clone(),
    )
    .unwrap()
}

/// Writes raw bytes and waits for the server to close the connection; returns the category of
/// the `Error` frame it sent first, if any (after a welcome, for peers that got one).
fn expect_closed(addr: std::net::SocketAddr, bytes: &[u8], close_write: bool) -> Option<String> {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
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

fn hello(secret: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    Message::Hello { secret, node: 9 }.encode(&mut out);
    out
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
    let refused = Connection::connect(server.addr, b"stale", 1, 1 << 20, timeout).unwrap_err();
    assert!(refused.to_string().contains("unauthenticated"), "{refused}");
    let mut good = Connection::connect(server.addr, SECRET, 1, 1 << 20, timeout).unwrap();
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

    // Wrong secret, then no secret at all (a request as first frame).
    // Each is told why before the server hangs up.
    assert_eq!(
        expect_closed(server.addr, &hello(b"wrong"), false).as_deref(),
        Some("unauthenticated")
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
        expect_closed(server.addr, &pull, false).as_deref(),
        Some("unauthenticated")
    );
    wait_for_count(&metrics, "unauthenticated", 3);
    // Oversized: a header announcing 1 GiB is refused without reading (or allocating) it.
    let mut oversized = hello(SECRET);
    oversized.extend_from_slice(&(1u32 << 30).to_le_bytes());
    assert_eq!(
        expect_closed(server.addr, &oversized, false).as_deref(),
        Some("too_large")
    );
    wait_for_count(&metrics, "too_large", 1);
    // Before the secret is checked only a hello-sized frame is read: a first frame announcing
    // 512 KiB (within the cap for authenticated peers) is refused at once, not buffered.
    assert_eq!(
        expect_closed(server.addr, &(512u32 << 10).to_le_bytes(), false).as_deref(),
        Some("too_large")
    );
    wait_for_count(&metrics, "too_large", 2);
    // Truncated: half a frame, then the peer goes away.
    let mut truncated = hello(SECRET);
    truncated.extend_from_slice(&pull[..pull.len() / 2]);
    // (A peer that went away mid-frame is not written to.)
    assert_eq!(expect_closed(server.addr, &truncated, true), None);
    wait_for_count(&metrics, "truncated", 1);
    // Garbage body.
    let mut garbage = hello(SECRET);
    garbage.extend_from_slice(&[3, 0, 0, 0, 250, 1, 2]);
    assert_eq!(
        expect_closed(server.addr, &garbage, false).as_deref(),
        Some("invalid")
    );
    // A server-to-client message from a client.
    let mut welcome = hello(SECRET);
    Message::Welcome.encode(&mut welcome);
    assert_eq!(
        expect_closed(server.addr, &welcome, false).as_deref(),
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
