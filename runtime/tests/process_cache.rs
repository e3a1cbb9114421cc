//! The per-process read cache: the worker threads of one process fetch shared rows once per clock
//! and push one coalesced batch per partition, in process and over TCP, and a worker pool keeps the
//! cache across segments, re-pulling only partitions that moved.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Instant;

use ebbflow_runtime::app::{App, AppWorker, TableReader};
use ebbflow_runtime::apps::{MfApp, MfConfig};
use ebbflow_runtime::client::{ClientConfig, NodeAddrs, fetch_snapshot};
use ebbflow_runtime::data;
use ebbflow_runtime::exact::{ExactApp, ExactConfig};
use ebbflow_runtime::local::{RunReport, run_single_process};
use ebbflow_runtime::metrics::RuntimeMetrics;
use ebbflow_runtime::node::{SegmentPlan, ServerHandle, WorkerPool, run_loopback};
use ebbflow_runtime::partition::{PartitionEntry, PartitionMap, partition_of};
use ebbflow_runtime::store::ServerState;
use ebbflow_runtime::tls::JobTls;
use ebbflow_runtime::worker::{ClockGate, DivergenceStop, JobConfig};

const PARTITIONS: u32 = 4;

fn exact_app(clocks: u64, staleness: u64) -> ExactApp {
    ExactApp::new(ExactConfig {
        rows: 40,
        width: 3,
        tables: 2,
        shared_rows: 12,
        clocks,
        staleness,
        clock_delay: std::time::Duration::ZERO,
        update_period: 1,
    })
}

fn job(workers: usize, clocks: u64, staleness: u64, process_cache: bool) -> JobConfig {
    JobConfig {
        clocks,
        staleness,
        workers,
        partitions: PARTITIONS,
        keep_params: true,
        process_cache,
        ..JobConfig::default()
    }
}

/// Rows of every worker's working set per partition: (union over workers, sum over workers).
fn rows_per_partition<A: App>(app: &A, workers: usize) -> Vec<(u64, u64)> {
    rows_of_shards(app, workers, 0..workers)
}

/// As [`rows_per_partition`] over the shards `shards` of `workers`.
fn rows_of_shards<A: App>(
    app: &A,
    workers: usize,
    shards: std::ops::Range<usize>,
) -> Vec<(u64, u64)> {
    let mut union: Vec<BTreeSet<(u32, u64)>> = vec![BTreeSet::new(); PARTITIONS as usize];
    let mut sum = vec![0u64; PARTITIONS as usize];
    for shard in shards {
        let set = app.worker(shard, workers).working_set();
        for (table, keys) in set.tables() {
            for &key in keys {
                let p = partition_of(key, PARTITIONS) as usize;
                union[p].insert((table, key));
                sum[p] += 1;
            }
        }
    }
    union
        .iter()
        .zip(sum)
        .map(|(u, s)| (u.len() as u64, s))
        .collect()
}

fn moved(metrics: &RuntimeMetrics, direction: &str) -> (u64, u64) {
    (
        metrics.rows_moved.with_label_values(&[direction]).get(),
        metrics.bytes_moved.with_label_values(&[direction]).get(),
    )
}

fn assert_exact(report: &RunReport, what: &str) {
    assert_eq!(
        report.eval.metric("wrong_values"),
        Some(0.0),
        "{what}: {:?}",
        report.eval
    );
    assert_eq!(
        report.total_stats().loss_sum,
        0.0,
        "{what}: ssp bound broken"
    );
}

#[test]
fn two_threads_fetch_shared_rows_once_per_process_per_clock() {
    let (workers, clocks) = (2, 8);
    let app = exact_app(clocks, 0);
    let rows = rows_per_partition(&app, workers);
    let union: u64 = rows.iter().map(|r| r.0).sum();
    let sum: u64 = rows.iter().map(|r| r.1).sum();
    assert!(union < sum, "the workers share rows ({union} < {sum})");
    let row_bytes = 3 * 4;
    for process_cache in [true, false] {
        let metrics = RuntimeMetrics::unregistered();
        let report =
            run_single_process(&app, &job(workers, clocks, 0, process_cache), &metrics).unwrap();
        assert_exact(&report, &format!("process cache {process_cache}"));
        // BSP refreshes every partition once before each clock.
        let per_clock = if process_cache { union } else { sum };
        assert_eq!(
            moved(&metrics, "pull"),
            (per_clock * clocks, per_clock * clocks * row_bytes),
            "process cache {process_cache}: rows and bytes pulled"
        );
        assert_eq!(
            moved(&metrics, "push"),
            (per_clock * clocks, per_clock * clocks * row_bytes),
            "process cache {process_cache}: rows and bytes pushed"
        );
    }
}

#[test]
fn over_tcp_bsp_results_and_traffic_follow_the_process_cache() {
    // MF: float updates, users disjoint between workers, items shared.
    let ratings = data::synthetic_ratings(60, 40, 3, 3_000, 0.1, 5)
        .unwrap()
        .ratings;
    let (train, test) = ratings.split(0.2, 42).unwrap();
    let app = MfApp::new(train, test, MfConfig::default()).unwrap();
    let (workers, clocks) = (2, 6);
    let rows = rows_per_partition(&app, workers);
    let union: u64 = rows.iter().map(|r| r.0).sum();
    let sum: u64 = rows.iter().map(|r| r.1).sum();
    let mut results = Vec::new();
    for process_cache in [true, false] {
        let metrics = RuntimeMetrics::unregistered();
        let report =
            run_loopback(&app, &job(workers, clocks, 0, process_cache), 2, &metrics).unwrap();
        let per_clock = if process_cache { union } else { sum };
        assert_eq!(moved(&metrics, "pull").0, per_clock * clocks);
        assert_eq!(moved(&metrics, "push").0, per_clock * clocks);
        results.push(report);
    }
    let (shared, alone) = (&results[0], &results[1]);
    assert!(
        (shared.eval.loss - alone.eval.loss).abs() < 1e-5,
        "test rmse {} vs {}",
        shared.eval.loss,
        alone.eval.loss
    );
    let (a, b) = (
        shared.params.as_ref().unwrap(),
        alone.params.as_ref().unwrap(),
    );
    for spec in app.tables() {
        let (table, mut row_a) = (spec.id, vec![0.0f32; spec.width]);
        let mut row_b = row_a.clone();
        for key in a.keys(table) {
            assert!(a.read_row(table, key, &mut row_a) && b.read_row(table, key, &mut row_b));
            for (x, y) in row_a.iter().zip(&row_b) {
                assert!(
                    (x - y).abs() <= 1e-4 * (1.0 + x.abs()),
                    "{table}/{key}: {x} vs {y}"
                );
            }
        }
    }
}

#[test]
fn ssp_threads_sharing_a_process_cache_stay_exact_and_within_bounds() {
    for staleness in [1, 2] {
        let app = exact_app(12, staleness);
        let metrics = RuntimeMetrics::unregistered();
        let report = run_single_process(&app, &job(3, 12, staleness, true), &metrics).unwrap();
        assert_exact(&report, &format!("staleness {staleness}"));
        let tcp = run_loopback(&app, &job(3, 12, staleness, true), 2, &metrics).unwrap();
        assert_exact(&tcp, &format!("staleness {staleness} over tcp"));
    }
}

/// Serves `partitions` of a job on a fresh loopback server.
fn serve(
    runtime: &tokio::runtime::Runtime,
    app: &ExactApp,
    config: &JobConfig,
    hosted: &[(u32, u64)],
    secret: &[u8],
) -> ServerHandle {
    let state = Arc::new(ServerState::new(
        hosted,
        config.partitions,
        &app.tables(),
        config.workers as u32,
        config.optimizer,
        config.staleness == 0,
    ));
    ServerHandle::loopback(
        runtime.handle(),
        state,
        secret,
        JobTls::for_security(config.transport_security, secret),
        config.wait_timeout,
        &RuntimeMetrics::unregistered(),
    )
    .unwrap()
}

/// Two loopback servers (partitions 0 and 2 on node 0, 1 and 3 on node 1) and a worker pool.
struct PoolFixture {
    runtime: tokio::runtime::Runtime,
    servers: [ServerHandle; 2],
    map: PartitionMap,
    addrs: NodeAddrs,
    client: ClientConfig,
    metrics: RuntimeMetrics,
    pool: WorkerPool,
}

impl PoolFixture {
    fn start(app: &ExactApp, config: &JobConfig) -> Self {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let secret = b"pool-secret".to_vec();
        let map = PartitionMap::round_robin(PARTITIONS, &[0, 1]).unwrap();
        let servers = [
            serve(&runtime, app, config, &[(0, 1), (2, 1)], &secret),
            serve(&runtime, app, config, &[(1, 1), (3, 1)], &secret),
        ];
        let addrs: NodeAddrs = [(0, servers[0].addr), (1, servers[1].addr)].into();
        let client = ClientConfig {
            tls: JobTls::for_security(config.transport_security, &secret),
            secret,
            node: 0,
            max_frame_bytes: ebbflow_runtime::frame::DEFAULT_MAX_FRAME_BYTES,
            timeout: config.wait_timeout,
        };
        let metrics = RuntimeMetrics::unregistered();
        let pool = WorkerPool::start(
            app,
            &app.tables(),
            &client,
            config,
            &metrics,
            Instant::now(),
            None,
        )
        .unwrap();
        Self {
            runtime,
            servers,
            map,
            addrs,
            client,
            metrics,
            pool,
        }
    }

    fn segment(&self, map: &PartitionMap, first: u64, end: u64) {
        self.pool
            .run_segment(&SegmentPlan {
                gate: Arc::new(ClockGate::range(first, end)),
                map: map.clone(),
                addrs: self.addrs.clone(),
                carried: false,
                progress: None,
                divergence_stop: DivergenceStop::EndGate,
            })
            .unwrap();
    }

    /// Stops everything; the exact app's count of wrong values in the final table.
    fn finish(self, app: &ExactApp, map: &PartitionMap) -> Option<f64> {
        self.pool.stop();
        let snapshot = fetch_snapshot(map, &self.addrs, &app.tables(), &self.client).unwrap();
        for server in self.servers {
            server.stop(self.runtime.handle());
        }
        app.evaluate(&snapshot).metric("wrong_values")
    }
}

#[test]
fn a_pool_standing_for_two_nodes_keeps_one_process_cache_per_node() {
    let (workers, clocks) = (4, 4);
    let app = exact_app(clocks, 0);
    let config = job(workers, clocks, 0, true);
    let fixture = PoolFixture::start(&app, &config);
    fixture
        .pool
        .set_nodes([(0, 5), (1, 5), (2, 6), (3, 6)].into());
    fixture.segment(&fixture.map, 0, clocks);
    let per_node: u64 = [0..2, 2..4]
        .into_iter()
        .map(|shards| {
            rows_of_shards(&app, workers, shards)
                .iter()
                .map(|r| r.0)
                .sum::<u64>()
        })
        .sum();
    assert!(per_node > rows_per_partition(&app, workers).iter().map(|r| r.0).sum());
    assert_eq!(moved(&fixture.metrics, "pull").0, per_node * clocks);
    let map = fixture.map.clone();
    assert_eq!(fixture.finish(&app, &map), Some(0.0));
}

#[test]
fn a_pool_keeps_its_process_cache_across_segments_and_repulls_only_moved_partitions() {
    let (workers, clocks) = (2, 6);
    let app = exact_app(clocks, 0);
    let config = job(workers, clocks, 0, true);
    let rows = rows_per_partition(&app, workers);
    let union: u64 = rows.iter().map(|r| r.0).sum();
    let fixture = PoolFixture::start(&app, &config);
    fixture.segment(&fixture.map, 0, 3);
    // The first segment pulls everything at its start and after each of its clocks.
    assert_eq!(moved(&fixture.metrics, "pull").0, 4 * union);

    // Partition 1 moves from server 1 to server 0 at the boundary.
    let image = fixture.servers[1].state.take(1).unwrap();
    fixture.servers[0]
        .state
        .install(image, 2, &app.tables(), config.optimizer, true)
        .unwrap();
    let mut entries = fixture.map.entries().to_vec();
    entries[1] = PartitionEntry { owner: 0, epoch: 2 };
    let moved_map = PartitionMap::from_entries(entries).unwrap();
    fixture.segment(&moved_map, 3, clocks);
    // The second: only the moved partition at its start, then everything after clocks 3 and 4.
    assert_eq!(
        moved(&fixture.metrics, "pull").0,
        4 * union + rows[1].0 + 2 * union
    );
    assert_eq!(fixture.finish(&app, &moved_map), Some(0.0));
}

/// Two workers whose writes of a clock cancel: at every clock worker 0 adds `+a` and worker 1
/// `-a` to each shared row, and worker 0 alone adds 1 to a row of its own. Every clock each
/// worker checks that the shared rows hold 0 and its own row its clock count.
mod cancelling {
    use ebbflow_runtime::app::{
        App, AppWorker, ClockStats, EvalReport, RowCache, RowInit, TableReader, TableSpec,
        WorkingSet,
    };

    pub const SHARED: u64 = 24;

    pub struct Cancelling;

    pub struct Worker {
        shard: usize,
        slots: Vec<u32>,
        own: u32,
    }

    impl App for Cancelling {
        type Worker = Worker;

        fn tables(&self) -> Vec<TableSpec> {
            vec![TableSpec {
                id: 0,
                name: "cancelling".into(),
                width: 3,
                init: RowInit::Zeros,
            }]
        }

        fn worker(&self, shard: usize, _num_shards: usize) -> Worker {
            Worker {
                shard,
                slots: Vec::new(),
                own: 0,
            }
        }

        fn evaluate(&self, tables: &dyn TableReader) -> EvalReport {
            let mut row = [0.0f32; 3];
            let wrong = (0..SHARED)
                .filter(|&key| {
                    tables.read_row(0, key, &mut row);
                    row != [0.0; 3]
                })
                .count();
            EvalReport {
                loss: wrong as f64,
                metrics: vec![("wrong_values".into(), wrong as f64)],
            }
        }
    }

    impl AppWorker for Worker {
        fn working_set(&self) -> WorkingSet {
            let mut set = WorkingSet::new();
            set.add_keys(0, (0..SHARED).chain([SHARED + self.shard as u64]));
            set
        }

        fn bind(&mut self, cache: &RowCache) {
            self.slots = (0..SHARED).map(|key| cache.slot(0, key).unwrap()).collect();
            self.own = cache.slot(0, SHARED + self.shard as u64).unwrap();
        }

        fn clock(&mut self, cache: &mut RowCache, clock: u64) -> ClockStats {
            let mut failed = 0;
            for &slot in &self.slots {
                failed += u64::from(cache.row(0, slot) != [0.0; 3]);
            }
            let own = if self.shard == 0 { clock as f32 } else { 0.0 };
            failed += u64::from(cache.row(0, self.own)[0] != own);
            let sign = if self.shard == 0 { 1.0 } else { -1.0 };
            for &slot in &self.slots {
                for value in cache.row_mut(0, slot) {
                    *value += sign * (1 + clock % 3) as f32;
                }
            }
            if self.shard == 0 {
                cache.row_mut(0, self.own)[0] += 1.0;
            }
            ClockStats {
                updates: self.slots.len() as u64,
                loss_sum: failed as f64,
                loss_count: self.slots.len() as u64 + 1,
            }
        }
    }
}

/// The pull metrics count what a read moved: after the first, whole read, only the rows changed
/// since (here each row changes at every fourth clock), with or without a process cache.
#[test]
fn a_read_counts_only_the_rows_it_moved() {
    let (workers, clocks) = (2, 8);
    let app = ExactApp::new(ExactConfig {
        update_period: 4,
        ..*exact_app(clocks, 0).config()
    });
    let rows = rows_per_partition(&app, workers);
    for process_cache in [true, false] {
        let metrics = RuntimeMetrics::unregistered();
        let report =
            run_single_process(&app, &job(workers, clocks, 0, process_cache), &metrics).unwrap();
        assert_exact(&report, &format!("process cache {process_cache}"));
        let per_clock: u64 = rows
            .iter()
            .map(|r| if process_cache { r.0 } else { r.1 })
            .sum();
        let (pulled, bytes) = moved(&metrics, "pull");
        assert_eq!(bytes, pulled * 3 * 4, "process cache {process_cache}");
        assert!(
            pulled >= per_clock && pulled < per_clock * clocks / 2,
            "process cache {process_cache}: {pulled} rows pulled, {per_clock} a whole read"
        );
    }
}

/// A read brings only the rows changed since the copy held, yet a row the two threads of a
/// process wrote in a clock is read again even where their writes cancel in the group's sum
/// (which the servers do not count as a change): each thread holds its own write of it.
#[test]
fn writes_that_cancel_in_the_group_sum_are_read_again() {
    for (process_cache, staleness) in [(true, 0), (false, 0), (true, 1)] {
        let metrics = RuntimeMetrics::unregistered();
        let report = run_single_process(
            &cancelling::Cancelling,
            &job(2, 12, staleness, process_cache),
            &metrics,
        )
        .unwrap();
        let what = format!("process cache {process_cache}, staleness {staleness}");
        assert_eq!(report.eval.metric("wrong_values"), Some(0.0), "{what}");
        if staleness == 0 {
            assert_eq!(
                report.total_stats().loss_sum,
                0.0,
                "{what}: a read was wrong"
            );
        }
    }
}
