//! The rollback race of docs/elasticity.md: after a rollback a node process's workers must
//! register again with every partition restored from the BackupPS copy, even one that comes
//! back on the same server at the same epoch (the first layout's segment failed: no layout was
//! adopted yet, so the next one starts again at epoch 1). A worker that kept its connections
//! (its segment ended between two clocks) used to skip such a partition, whose restored copy
//! has no registration: every BSP push to it waited for that worker's read, which never came.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ebbflow_runtime::app::App;
use ebbflow_runtime::client::ClientConfig;
use ebbflow_runtime::control::{
    Agent, ControlRequest, ControlResponse, NodeAgent, SegmentOrder, encode_images,
};
use ebbflow_runtime::exact::{ExactApp, ExactConfig};
use ebbflow_runtime::metrics::RuntimeMetrics;
use ebbflow_runtime::node::ServerHandle;
use ebbflow_runtime::store::ServerState;
use ebbflow_runtime::worker::JobConfig;

const SECRET: &[u8] = b"rollback-race-secret";
const NODE: u32 = 7;
const PARTITIONS: u32 = 2;
const WORKERS: usize = 2;
const CLOCKS: u64 = 8;
/// How long a push or a read may wait: the hang shows as a failed segment after this.
const WAIT: Duration = Duration::from_secs(3);

fn await_segment(agent: &dyn NodeAgent, within: Duration) -> ControlResponse {
    let deadline = Instant::now() + within;
    loop {
        let (answer, _) = agent.control(ControlRequest::Await { wait_ms: 200 }, &[]);
        match answer {
            ControlResponse::Running if Instant::now() < deadline => continue,
            answer => return answer,
        }
    }
}

#[test]
fn a_partition_restored_at_its_old_epoch_is_registered_again() {
    let app = ExactApp::new(ExactConfig {
        clocks: CLOCKS,
        ..ExactConfig::default()
    });
    let specs = app.tables();
    let job = JobConfig {
        clocks: CLOCKS,
        staleness: 0,
        workers: WORKERS,
        partitions: PARTITIONS,
        wait_timeout: WAIT,
        ..JobConfig::default()
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let metrics = RuntimeMetrics::unregistered();
    // The first layout: both partitions on this node at epoch 1.
    let hosted: Vec<(u32, u64)> = (0..PARTITIONS).map(|p| (p, 1)).collect();
    let state = Arc::new(ServerState::new(
        &hosted,
        PARTITIONS,
        &specs,
        WORKERS as u32,
        job.optimizer,
        true,
    ));
    let server = ServerHandle::loopback(
        runtime.handle(),
        state.clone(),
        SECRET,
        None,
        WAIT,
        &metrics,
    )
    .unwrap();
    let client = ClientConfig {
        secret: SECRET.to_vec(),
        node: NODE,
        max_frame_bytes: ebbflow_runtime::frame::DEFAULT_MAX_FRAME_BYTES,
        timeout: WAIT,
        tls: None,
    };
    let (shutdown, _stopped) = std::sync::mpsc::channel();
    let agent = Agent::new(
        app.clone(),
        state.clone(),
        job.clone(),
        client,
        metrics.clone(),
        shutdown,
    );
    let order = |first: u64, end: u64| SegmentOrder {
        first,
        end,
        workers: (0..WORKERS as u32).collect(),
        owners: vec![(NODE, 1); PARTITIONS as usize],
        addrs: vec![(NODE, server.addr)],
        run_start_unix: 0.0,
        standby: Vec::new(),
        // After a rollback nothing is carried.
        carried: false,
        backup_clocks: Vec::new(),
    };

    let (answer, _) = agent.control(ControlRequest::Segment(order(0, 4)), &[]);
    assert!(matches!(answer, ControlResponse::Done), "{answer:?}");
    let answer = await_segment(&agent, Duration::from_secs(30));
    assert!(
        matches!(answer, ControlResponse::Finished { end: 4, .. }),
        "{answer:?}"
    );
    // The workers ended between two clocks: they keep their connections. The BackupPS copy is
    // the state at clock 4; the node's state is abandoned and the copy restored at the same
    // epoch on the same node (as after a failed first layout).
    let backup = state.images();
    assert!(backup.iter().all(|image| image.visible_clock() == 4));
    let (answer, _) = agent.control(ControlRequest::Abandon, &[]);
    assert!(matches!(answer, ControlResponse::Done), "{answer:?}");
    let mut payload = Vec::new();
    encode_images(&backup, &mut payload);
    let install = ControlRequest::Install {
        epochs: vec![1; PARTITIONS as usize],
    };
    let (answer, _) = agent.control(install, &payload);
    assert!(matches!(answer, ControlResponse::Done), "{answer:?}");

    let (answer, _) = agent.control(ControlRequest::Segment(order(4, CLOCKS)), &[]);
    assert!(matches!(answer, ControlResponse::Done), "{answer:?}");
    let answer = await_segment(&agent, Duration::from_secs(30));
    assert!(
        matches!(answer, ControlResponse::Finished { end: CLOCKS, .. }),
        "the segment after the rollback did not finish (its first pushes waited for a read \
         that never came): {answer:?}"
    );
    // Exactly once across the rollback: every clock of every worker is in, once.
    for image in state.images() {
        assert_eq!(image.visible_clock(), CLOCKS);
        for table in &image.tables {
            let width = table.data.len() / table.keys.len().max(1);
            for (row, &key) in table.keys.iter().enumerate() {
                for column in 0..width {
                    let expected = app.expected(WORKERS, table.table, key, column);
                    assert_eq!(
                        table.data[row * width + column] as u64,
                        expected,
                        "table {} key {key} column {column}",
                        table.table
                    );
                }
            }
        }
    }
    agent.control(ControlRequest::Shutdown, &[]);
    server.stop(runtime.handle());
}
