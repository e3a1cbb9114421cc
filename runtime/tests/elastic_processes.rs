//! Elasticity across real node processes (issue 4): `ebbflow-runtime elastic-node` processes join
//! a coordinator on 127.0.0.1, leave on SIGTERM (a notice with their grace period) and die on
//! SIGKILL (a failure without notice) or hang on SIGSTOP (found by heartbeat, fenced when it
//! resumes), while the integer-exact app trains. The final table must be exactly the expected
//! one: no update lost, none applied twice.
//!
//! The coordinator runs in the test process (`run_elastic_job`, the same code the
//! `elastic-coordinator` subcommand runs) so the test can read its report; every node is a
//! separate process, so a kill really takes its partitions and workers with it.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ebbflow_runtime::elastic::{ElasticConfig, ElasticReport, ShardLoads, StageThresholds};
use ebbflow_runtime::elastic_coordinator::{ElasticJob, ElasticJobError, run_elastic_job_with};
use ebbflow_runtime::exact::{ExactApp, ExactConfig};
use ebbflow_runtime::heartbeat::HeartbeatConfig;
use ebbflow_runtime::metrics::RuntimeMetrics;
use ebbflow_runtime::worker::JobConfig;
use ebbflow_runtime_api::StatusResponse;

const SECRET: &str = "elastic-processes-secret";

#[path = "support/processes.rs"]
mod processes;

use processes::{clock, signal, transient, wait_exit};

fn status(url: &str) -> Option<StatusResponse> {
    processes::status(url, SECRET)
}

fn wait_for(url: &str, what: &str, ready: impl Fn(&StatusResponse) -> bool) -> StatusResponse {
    processes::wait_for(url, SECRET, Duration::from_secs(90), what, ready)
}
const CLOCK_MS: u64 = 15;

struct Job {
    clocks: u64,
    staleness: u64,
    partitions: u32,
    workers: usize,
    /// A row changes every this many clocks (`ExactConfig::update_period`).
    update_period: u64,
}

impl Job {
    /// A job of `clocks` whose every row changes every clock: SSP staleness 1, 6 partitions,
    /// 3 workers.
    fn dense(clocks: u64) -> Self {
        Self {
            clocks,
            staleness: 1,
            partitions: 6,
            workers: 3,
            update_period: 1,
        }
    }

    /// The flags every process of the job shares (they make up its job id).
    fn flags(&self) -> Vec<String> {
        [
            "--app",
            "exact",
            "--exact-clock-ms",
            &CLOCK_MS.to_string(),
            "--clocks",
            &self.clocks.to_string(),
            "--staleness",
            &self.staleness.to_string(),
            "--partitions",
            &self.partitions.to_string(),
            "--job-workers",
            &self.workers.to_string(),
            "--exact-update-period",
            &self.update_period.to_string(),
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect()
    }

    /// The id `ebbflow-runtime` derives from [`Job::flags`] (exact app defaults).
    fn id(&self) -> String {
        let id = format!(
            "exact clocks={} staleness={} partitions={} workers={} optimizer=Add rows=64 width=4 tables=2 shared=4 clock_ms={CLOCK_MS}",
            self.clocks, self.staleness, self.partitions, self.workers
        );
        match self.update_period {
            1 => id,
            period => format!("{id} update_period={period}"),
        }
    }

    fn app(&self) -> ExactApp {
        ExactApp::new(ExactConfig {
            rows: 64,
            width: 4,
            tables: 2,
            shared_rows: 4,
            clocks: self.clocks,
            staleness: self.staleness,
            clock_delay: Duration::from_millis(CLOCK_MS),
            update_period: self.update_period,
        })
    }
}

type CoordinatorThread = std::thread::JoinHandle<Result<ElasticReport, ElasticJobError>>;

/// A coordinator running `job` on a thread of this process; returns its URL and the thread.
fn coordinator(job: &Job, reliable: u32, backup_every: u64) -> (String, CoordinatorThread) {
    let registry = prometheus::Registry::new();
    let timeout = HeartbeatConfig::default().timeout;
    coordinator_with(job, reliable, backup_every, timeout, registry)
}

/// As [`coordinator_with`], the copies capped at `backup_bandwidth` bytes per second.
fn coordinator_capped(
    job: &Job,
    backup_bandwidth: f64,
    registry: prometheus::Registry,
) -> (String, CoordinatorThread) {
    let timeout = HeartbeatConfig::default().timeout;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    coordinator_configured(
        listener,
        job,
        (1, 5),
        timeout,
        registry,
        Some(backup_bandwidth),
    )
}

/// As [`coordinator`], declaring nodes failed after `heartbeat_timeout` of silence, with its
/// metrics on `registry`.
fn coordinator_with(
    job: &Job,
    reliable: u32,
    backup_every: u64,
    heartbeat_timeout: Duration,
    registry: prometheus::Registry,
) -> (String, CoordinatorThread) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    coordinator_configured(
        listener,
        job,
        (reliable, backup_every),
        heartbeat_timeout,
        registry,
        None,
    )
}

/// A coordinator of `job` serving on `listener`, waiting for `reliable` nodes and copying every
/// `backup_every` clocks.
fn coordinator_configured(
    listener: std::net::TcpListener,
    job: &Job,
    (reliable, backup_every): (u32, u64),
    heartbeat_timeout: Duration,
    registry: prometheus::Registry,
    backup_bandwidth: Option<f64>,
) -> (String, CoordinatorThread) {
    let url = format!("https://{}", listener.local_addr().unwrap());
    let app = job.app();
    let settings = ElasticJob {
        config: ElasticConfig {
            job: JobConfig {
                clocks: job.clocks,
                staleness: job.staleness,
                partitions: job.partitions,
                workers: job.workers,
                wait_timeout: Duration::from_secs(60),
                ..JobConfig::default()
            },
            thresholds: StageThresholds::default(),
            backup_every,
            backup_interval: None,
            backup_bandwidth,
            start: None,
            checkpoint: None,
            reliable: Vec::new(),
            transient: Vec::new(),
        },
        secret: SECRET.into(),
        job: job.id(),
        reliable_nodes: reliable,
        join_timeout: Duration::from_secs(60),
        background_copies: true,
        linger: None,
        stop: None,
        checkpoint: None,
    };
    let metrics = RuntimeMetrics::register(&registry).unwrap();
    let handle = std::thread::spawn(move || {
        run_elastic_job_with(
            &app,
            settings,
            heartbeat_timeout,
            listener,
            registry,
            &metrics,
            ebbflow_runtime::elastic::LiveFeed::new(),
        )
    });
    (url, handle)
}

fn node(job: &Job, url: &str, name: &str, transient: bool, grace_seconds: u64) -> Child {
    node_with(job, url, name, transient, grace_seconds, &[])
}

/// As [`node`] with further flags.
fn node_with(
    job: &Job,
    url: &str,
    name: &str,
    transient: bool,
    grace_seconds: u64,
    extra: &[&str],
) -> Child {
    let mut command = Command::new(env!("CARGO_BIN_EXE_ebbflow-runtime"));
    command
        .arg("elastic-node")
        .args(job.flags())
        .args(extra)
        .args(["--coordinator", url, "--name", name])
        .args(["--grace-seconds", &grace_seconds.to_string()])
        .env("EBBFLOW_JOB_SECRET", SECRET)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    if transient {
        command.arg("--transient");
    }
    command.spawn().expect("starting an elastic node")
}

/// The HTTP status `GET /status` answers with `bearer` (or without one).
fn status_code(url: &str, bearer: Option<&str>) -> u16 {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut request = ebbflow_runtime::admin::client_for_url(url, SECRET.as_bytes())
            .build()
            .unwrap()
            .get(format!("{url}/status"));
        if let Some(bearer) = bearer {
            request = request.bearer_auth(bearer);
        }
        request.send().await.unwrap().status().as_u16()
    })
}

/// Waits for the surviving nodes to exit successfully. A survivor whose workers were blocked on
/// a lost node that hangs left them behind at the abandon; their connections were severed, so
/// they stopped then, not at the read timeout (10 minutes, long after these jobs end).
fn survivors_exit(children: &mut [&mut Child]) {
    let mut left_behind = 0;
    for child in children.iter_mut() {
        let (exit, stderr) = wait_exit(child, Duration::from_secs(10));
        assert!(exit.success(), "{exit:?} {stderr}");
        if stderr.contains("left behind") {
            left_behind += 1;
            assert!(
                stderr.contains("connections severed")
                    && stderr.contains("the left-behind segment stopped"),
                "{stderr}"
            );
            for line in stderr
                .lines()
                .filter(|l| l.contains("left-behind segment stopped"))
            {
                eprintln!("{line}");
            }
        }
    }
    eprintln!(
        "survivors that left workers behind: {left_behind} of {}",
        children.len()
    );
}

fn assert_exact(report: &ElasticReport) {
    let wrong = report
        .run
        .eval
        .metrics
        .iter()
        .find(|(name, _)| name == "wrong_values")
        .map(|(_, v)| *v);
    assert_eq!(
        wrong,
        Some(0.0),
        "the final table differs: {:?}",
        report.run.eval
    );
    assert_eq!(report.run.eval.loss, 0.0);
}

#[test]
fn node_processes_join_leave_and_die_and_the_table_is_exact() {
    let job = Job {
        clocks: 400,
        staleness: 1,
        partitions: 8,
        workers: 4,
        update_period: 1,
    };
    let (url, coordinator) = coordinator(&job, 1, 5);
    let mut r0 = node(&job, &url, "r0", false, 30);
    let mut t0 = node(&job, &url, "t0", true, 30);
    let mut t1 = node(&job, &url, "t1", true, 30);
    wait_for(&url, "training", |s| clock(s) >= 10);
    // The status (members and their data-plane addresses) is for the job only.
    for bearer in [None, Some("wrong")] {
        assert_eq!(status_code(&url, bearer), 401, "bearer {bearer:?}");
    }
    assert_eq!(status_code(&url, Some(SECRET)), 200);

    // Bulk add while training: two more transient nodes switch in at a boundary (stage 2).
    let mut t2 = node(&job, &url, "t2", true, 30);
    let mut t3 = node(&job, &url, "t3", true, 30);
    let before = wait_for(&url, "the bulk add", |s| transient(s) == 4)
        .progress
        .unwrap();
    assert_eq!(before.stage, 2, "4 transient : 1 reliable is stage 2");
    // The status shows who serves what: in stage 2 the ActivePSs on transient nodes serve
    // every partition, and the job's logical workers are all placed.
    let placed = wait_for(&url, "the stage-2 placement in the status", |s| {
        let transient_ids: Vec<u32> = s
            .nodes
            .iter()
            .filter(|n| n.name.starts_with('t'))
            .map(|n| n.node)
            .collect();
        s.partitions.len() == job.partitions as usize
            && s.partitions
                .iter()
                .all(|p| transient_ids.contains(&p.owner))
            && s.nodes.iter().map(|n| n.workers as usize).sum::<usize>() == job.workers
    });
    let serving = placed.nodes.iter().filter(|n| n.serves).count();
    assert!((1..=4).contains(&serving), "{:?}", placed.nodes);
    assert!(!placed.nodes.iter().any(|n| n.name == "r0" && n.serves));

    // Partial eviction with notice: SIGTERM gives t0 30 s; its partitions move to survivors and
    // the coordinator lets it go long before its deadline.
    signal(&t0, "TERM");
    let (exit, stderr) = wait_exit(&mut t0, Duration::from_secs(20));
    assert!(exit.success(), "t0 released cleanly: {exit:?} {stderr}");
    wait_for(&url, "the partial eviction", |s| transient(s) == 3);
    let t0_id = placed.nodes.iter().find(|n| n.name == "t0").unwrap().node;
    wait_for(&url, "t0's partitions served by the survivors", |s| {
        s.partitions.len() == job.partitions as usize
            && s.partitions.iter().all(|p| p.owner != t0_id)
    });

    // Failure without notice: t1 dies; the run rolls back to the BackupPS copy.
    let at = clock(&status(&url).unwrap());
    wait_for(&url, "another boundary", |s| clock(s) > at + 5);
    signal(&t1, "KILL");
    let (exit, _) = wait_exit(&mut t1, Duration::from_secs(5));
    assert!(!exit.success());
    wait_for(&url, "the rollback", |s| {
        s.progress.as_ref().is_some_and(|p| p.rollbacks >= 1) && transient(s) == 2
    });

    // Full eviction with notice: the last transient nodes leave; partitions flush to the
    // reliable tier, which then serves them (stage 1).
    signal(&t2, "TERM");
    signal(&t3, "TERM");
    for child in [&mut t2, &mut t3] {
        let (exit, stderr) = wait_exit(child, Duration::from_secs(20));
        assert!(exit.success(), "released cleanly: {exit:?} {stderr}");
    }
    let after = wait_for(&url, "the full eviction", |s| transient(s) == 0)
        .progress
        .unwrap();
    assert_eq!(after.stage, 1);

    let report = coordinator.join().unwrap().expect("the job finishes");
    assert_exact(&report);
    // t2 and t3 joined while training; t0 and t1 too if they came after the reliable node.
    let joins = report.events.get("join").copied().unwrap_or(0);
    assert!((2..=4).contains(&joins), "{:?}", report.events);
    assert_eq!(report.events.get("notice"), Some(&3), "{:?}", report.events);
    assert_eq!(report.events.get("fail"), Some(&1), "{:?}", report.events);
    assert_eq!(
        report.rollbacks, 1,
        "one loss, one rollback: {:?}",
        report.segments
    );
    assert!(report.partitions_migrated >= 8);
    assert!(
        !report.notice_to_safe_seconds.is_empty(),
        "{:?}",
        report.segments
    );
    assert!(
        report.notice_to_safe_seconds.iter().all(|s| *s < 5.0),
        "{:?}",
        report.notice_to_safe_seconds
    );
    let (exit, stderr) = wait_exit(&mut r0, Duration::from_secs(10));
    assert!(exit.success(), "r0 released at the end: {exit:?} {stderr}");
}

#[test]
fn a_notice_too_late_rolls_back_and_stays_exact() {
    let job = Job {
        clocks: 250,
        staleness: 0,
        partitions: 6,
        workers: 3,
        update_period: 1,
    };
    let (url, coordinator) = coordinator(&job, 1, 4);
    let mut r0 = node(&job, &url, "r0", false, 30);
    let mut t0 = node(&job, &url, "t0", true, 0);
    let mut t1 = node(&job, &url, "t1", true, 30);
    let mut t2 = node(&job, &url, "t2", true, 30);
    wait_for(&url, "stage 2", |s| {
        s.progress.as_ref().is_some_and(|p| p.stage == 2) && clock(s) >= 20
    });
    // A zero grace period: the node says it leaves now and exits at once, so nothing it hosted
    // can move first.
    signal(&t0, "TERM");
    let (exit, _) = wait_exit(&mut t0, Duration::from_secs(10));
    assert_eq!(exit.code(), Some(143));
    wait_for(&url, "the rollback", |s| {
        s.progress.as_ref().is_some_and(|p| p.rollbacks >= 1)
    });
    let report = coordinator.join().unwrap().expect("the job finishes");
    assert_exact(&report);
    assert_eq!(
        report.rollbacks, 1,
        "one loss, one rollback: {:?}",
        report.segments
    );
    survivors_exit(&mut [&mut r0, &mut t1, &mut t2]);
}

#[test]
fn a_node_started_for_another_job_is_refused() {
    let job = Job {
        clocks: 50,
        staleness: 0,
        partitions: 2,
        workers: 1,
        update_period: 1,
    };
    let (url, coordinator) = coordinator(&job, 1, 5);
    let other = Job { clocks: 60, ..job };
    let mut stranger = node(&other, &url, "x", false, 30);
    let (exit, stderr) = wait_exit(&mut stranger, Duration::from_secs(20));
    assert!(!exit.success());
    assert!(stderr.contains("another job"), "{stderr}");
    // The job itself still runs with the right node.
    let mut r0 = node(&job, &url, "r0", false, 30);
    let report = coordinator.join().unwrap().expect("the job finishes");
    assert_exact(&report);
    let (exit, _) = wait_exit(&mut r0, Duration::from_secs(10));
    assert!(exit.success());
}

fn heartbeat_failures(status: &StatusResponse) -> u64 {
    status.progress.as_ref().map_or(0, |p| p.heartbeat_failures)
}

#[test]
fn a_hung_serving_node_is_found_by_heartbeat_rolled_back_and_fenced_when_it_resumes() {
    let job = Job {
        clocks: 300,
        staleness: 0,
        partitions: 6,
        workers: 3,
        update_period: 1,
    };
    let registry = prometheus::Registry::new();
    let (url, coordinator) =
        coordinator_with(&job, 1, 4, Duration::from_millis(2000), registry.clone());
    let beat_fast = ["--heartbeat-interval-ms", "200"];
    let mut r0 = node_with(&job, &url, "r0", false, 30, &beat_fast);
    // t0 joins first of the transient nodes, so it is the longest-lived: an ActivePS.
    let mut t0 = node_with(&job, &url, "t0", true, 30, &beat_fast);
    wait_for(&url, "t0 to join", |s| {
        s.nodes.iter().any(|n| n.name == "t0")
    });
    let mut t1 = node_with(&job, &url, "t1", true, 30, &beat_fast);
    let mut t2 = node_with(&job, &url, "t2", true, 30, &beat_fast);
    let before = wait_for(&url, "stage 2 with every node", |s| {
        s.progress.as_ref().is_some_and(|p| p.stage == 2) && transient(s) == 3 && clock(s) >= 20
    });
    assert_eq!(
        heartbeat_failures(&before),
        0,
        "no false alarm before the hang"
    );

    // The process hangs with its sockets open: nothing breaks, only its heartbeats stop.
    signal(&t0, "STOP");
    let declared = wait_for(&url, "the heartbeat timeout", |s| {
        heartbeat_failures(s) >= 1
    });
    assert_eq!(heartbeat_failures(&declared), 1);
    // The run goes on without it while it is still stopped: rolled back to the BackupPS copy,
    // training again on the survivors.
    let rolled_back = wait_for(&url, "the rollback", |s| {
        s.progress.as_ref().is_some_and(|p| p.rollbacks >= 1) && transient(s) == 2
    });
    wait_for(&url, "progress after the rollback", |s| {
        clock(s) > clock(&rolled_back)
    });
    // It resumes after being declared failed: the coordinator fences it, it drops its state
    // and exits with an error; what it still sent belongs to an abandoned epoch.
    signal(&t0, "CONT");
    let (exit, stderr) = wait_exit(&mut t0, Duration::from_secs(30));
    assert!(!exit.success(), "a fenced node fails: {exit:?}");
    assert!(stderr.contains("fenced"), "{stderr}");

    let report = coordinator.join().unwrap().expect("the job finishes");
    assert_exact(&report);
    assert_eq!(
        report.rollbacks, 1,
        "one loss, one rollback: {:?}",
        report.segments
    );
    assert_eq!(report.events.get("fail"), Some(&1), "{:?}", report.events);
    let exported = registry
        .gather()
        .iter()
        .find(|f| f.name() == "ebbflow_runtime_heartbeat_failures_total")
        .map(|f| f.get_metric()[0].get_counter().get_value());
    assert_eq!(exported, Some(1.0));
    survivors_exit(&mut [&mut r0, &mut t1, &mut t2]);
}

fn reliable(status: &StatusResponse) -> u32 {
    status.progress.as_ref().map_or(0, |p| p.reliable_nodes)
}

/// A reliable node process dies (a crashed on-demand pod): the run rolls back and goes on with
/// the other reliable node, and a new process under the dead one's name (the pod recreated)
/// joins the next layout. Then the other reliable node is drained (SIGTERM, a notice): its
/// partitions move to the replacement, and the table comes out exact.
#[test]
fn a_dead_reliable_node_is_replaced_under_its_name_and_a_drained_one_hands_over() {
    let job = Job {
        clocks: 400,
        staleness: 1,
        partitions: 6,
        workers: 3,
        update_period: 1,
    };
    let (url, coordinator) = coordinator(&job, 2, 5);
    let mut r0 = node(&job, &url, "r0", false, 30);
    let mut r1 = node(&job, &url, "r1", false, 30);
    let mut t0 = node(&job, &url, "t0", true, 30);
    wait_for(&url, "training on both reliable nodes", |s| {
        reliable(s) == 2 && transient(s) == 1 && clock(s) >= 20
    });

    signal(&r1, "KILL");
    let (exit, _) = wait_exit(&mut r1, Duration::from_secs(5));
    assert!(!exit.success());
    let rolled_back = wait_for(&url, "the rollback without r1", |s| {
        s.progress.as_ref().is_some_and(|p| p.rollbacks >= 1) && reliable(s) == 1
    });
    wait_for(&url, "progress on r0 alone", |s| {
        clock(s) > clock(&rolled_back) + 5
    });

    // The pod is recreated: a new process under the same name.
    let mut r1 = node(&job, &url, "r1", false, 30);
    let replaced = wait_for(&url, "the replacement in the layout", |s| reliable(s) == 2);
    wait_for(&url, "progress with the replacement", |s| {
        clock(s) > clock(&replaced) + 5
    });

    // r0's node is drained: a notice, and r1 takes over its partitions.
    signal(&r0, "TERM");
    let (exit, stderr) = wait_exit(&mut r0, Duration::from_secs(20));
    assert!(exit.success(), "r0 released cleanly: {exit:?} {stderr}");
    let drained = wait_for(&url, "the drain", |s| reliable(s) == 1);
    assert_eq!(
        drained.progress.as_ref().map(|p| p.rollbacks),
        Some(1),
        "a notice moves partitions without a rollback"
    );

    let report = coordinator.join().unwrap().expect("the job finishes");
    assert_exact(&report);
    assert_eq!(report.rollbacks, 1);
    assert_eq!(report.events.get("fail"), Some(&1), "{:?}", report.events);
    assert_eq!(report.events.get("notice"), Some(&1), "{:?}", report.events);
    assert!(
        report.events.get("join").is_some_and(|j| *j >= 1),
        "{:?}",
        report.events
    );
    assert!(report.rejected.is_empty(), "{:?}", report.rejected);
    assert_eq!(report.segments.last().unwrap().reliable_nodes, 1);
    for child in [&mut r1, &mut t0] {
        let (exit, stderr) = wait_exit(child, Duration::from_secs(10));
        assert!(exit.success(), "{exit:?} {stderr}");
    }
}

/// Counter `name` on `registry`, summed over the series with a label valued `value`.
fn counter(registry: &prometheus::Registry, name: &str, value: &str) -> f64 {
    registry
        .gather()
        .iter()
        .filter(|f| f.name() == name)
        .flat_map(|f| f.get_metric().iter())
        .filter(|m| m.get_label().iter().any(|l| l.value() == value))
        .map(|m| m.get_counter().get_value())
        .sum()
}

/// `ebbflow_runtime_partition_bytes_total{path}` on `registry`.
fn partition_bytes(registry: &prometheus::Registry, path: &str) -> f64 {
    counter(registry, "ebbflow_runtime_partition_bytes_total", path)
}

/// `ebbflow_runtime_shard_loads_total{source}` on `registry`.
fn shard_loads(registry: &prometheus::Registry, source: &str) -> f64 {
    counter(registry, "ebbflow_runtime_shard_loads_total", source)
}

fn pre_opened(registry: &prometheus::Registry, outcome: &str) -> f64 {
    counter(
        registry,
        "ebbflow_runtime_pre_opened_connections_total",
        outcome,
    )
}

#[test]
fn a_partial_eviction_moves_partitions_straight_between_nodes() {
    let job = Job {
        clocks: 1500,
        staleness: 1,
        partitions: 8,
        workers: 4,
        update_period: 1,
    };
    let registry = prometheus::Registry::new();
    let (url, coordinator) = coordinator_with(
        &job,
        1,
        5,
        HeartbeatConfig::default().timeout,
        registry.clone(),
    );
    let mut r0 = node(&job, &url, "r0", false, 30);
    // t0 is admitted first, so it is the longest-lived transient node: an ActivePS in stage 2.
    let mut t0 = node(&job, &url, "t0", true, 30);
    wait_for(&url, "t0 switched in", |s| transient(s) == 1);
    let mut others: Vec<Child> = ["t1", "t2", "t3"]
        .iter()
        .map(|name| node(&job, &url, name, true, 30))
        .collect();
    let before = wait_for(&url, "stage 2", |s| {
        // The migration counter grows once the boundary's partitions are placed.
        transient(s) == 4
            && s.progress
                .as_ref()
                .is_some_and(|p| p.stage == 2 && p.partitions_migrated > 0)
    })
    .progress
    .unwrap();
    // Stage 1 -> 2 moved partitions from r0 to the ActivePSs, node to node.
    let direct_before = partition_bytes(&registry, "direct");
    assert!(direct_before > 0.0, "stage 2 moved partitions directly");

    // Partial eviction with notice: t0's partitions go straight to surviving ActivePSs.
    signal(&t0, "TERM");
    let (exit, stderr) = wait_exit(&mut t0, Duration::from_secs(20));
    assert!(exit.success(), "t0 released cleanly: {exit:?} {stderr}");
    let after = wait_for(&url, "the partial eviction", |s| transient(s) == 3)
        .progress
        .unwrap();
    assert_eq!(after.stage, 2, "3 transient : 1 reliable stays stage 2");
    assert!(after.partitions_migrated > before.partitions_migrated);
    assert!(
        partition_bytes(&registry, "direct") > direct_before,
        "t0's partitions moved directly"
    );
    assert_eq!(
        partition_bytes(&registry, "relayed"),
        0.0,
        "no image went through the coordinator"
    );

    let report = coordinator.join().unwrap().expect("the job finishes");
    assert_exact(&report);
    assert_eq!(report.rollbacks, 0);
    assert_eq!(report.events.get("notice"), Some(&1), "{:?}", report.events);
    // t0's worker went to its second holder, which had preloaded its shard: the first segment
    // after the eviction started one worker, from a preloaded shard.
    let evicted = report
        .segments
        .iter()
        .position(|s| s.transient_nodes == 3)
        .expect("a segment after the eviction");
    assert_eq!(report.segments[evicted - 1].transient_nodes, 4);
    assert_eq!(
        report.segments[evicted].shards,
        ShardLoads {
            built: 0,
            preloaded: 1,
            connections_pre_opened: 0,
        },
        "the segments around the eviction: {:?}",
        &report.segments[evicted - 1..=evicted]
    );
    // t1..t3 were prepared before they were switched in: the workers they took started from
    // shards they had preloaded, and their connections to the servers (and the other nodes'
    // workers' connections to those of them that became ActivePSs) were opened while they were
    // prepared and taken at the switch, as the coordinator's metric counts.
    let switched_in = &report.segments[evicted - 1];
    assert_eq!(switched_in.shards.built, 0, "{switched_in:?}");
    assert!(switched_in.shards.preloaded > 0, "{switched_in:?}");
    assert!(
        switched_in.shards.connections_pre_opened > 0,
        "{:?}",
        report.segments
    );
    let taken: u32 = report
        .segments
        .iter()
        .map(|s| s.shards.connections_pre_opened)
        .sum();
    assert_eq!(pre_opened(&registry, "taken"), f64::from(taken));
    let started = |source: fn(&ShardLoads) -> u32| {
        report
            .segments
            .iter()
            .map(|s| f64::from(source(&s.shards)))
            .sum::<f64>()
    };
    assert_eq!(shard_loads(&registry, "built"), started(|s| s.built));
    assert_eq!(
        shard_loads(&registry, "preloaded"),
        started(|s| s.preloaded)
    );
    assert!(!report.notice_to_safe_seconds.is_empty());
    assert_eq!(partition_bytes(&registry, "relayed"), 0.0);
    for child in std::iter::once(&mut r0).chain(others.iter_mut()) {
        let (exit, stderr) = wait_exit(child, Duration::from_secs(10));
        assert!(exit.success(), "{exit:?} {stderr}");
    }
}

#[test]
fn background_copies_keep_training_and_a_failure_rolls_back_only_to_the_last_copy() {
    copies_keep_training_and_a_failure_rolls_back_only_to_the_last_copy(2, 2, 1);
}

/// A sparse job (each row changes every 20th clock, copies every 5): the ActivePSs send
/// coalesced deltas, about a quarter of each partition, and the coordinator rebuilds whole
/// copies from them, which the rollback then restores exactly.
#[test]
fn background_copies_of_a_sparse_job_are_deltas_and_a_rollback_to_them_is_exact() {
    copies_keep_training_and_a_failure_rolls_back_only_to_the_last_copy(2, 2, 20);
}

/// Stage 1 (one reliable, one transient node: every partition on the reliable node) copies in
/// the background too: the job's consistent clock moves within a segment, and losing the
/// transient node's workers rolls back only to the last copy, not to the segment's start.
#[test]
fn stage_one_reports_progress_within_a_segment_and_a_failure_rolls_back_only_to_the_last_copy() {
    copies_keep_training_and_a_failure_rolls_back_only_to_the_last_copy(1, 1, 1);
}

/// With `transient` transient nodes beside one reliable one, the job reaches `stage`; its
/// consistent clock moves while that segment runs; a SIGKILL of the last transient node rolls
/// back to the last copy taken before it, and the table is exact.
fn copies_keep_training_and_a_failure_rolls_back_only_to_the_last_copy(
    transient_nodes: usize,
    stage: u8,
    update_period: u64,
) {
    let job = Job {
        clocks: 400,
        staleness: 1,
        partitions: 6,
        workers: 3,
        update_period,
    };
    let registry = prometheus::Registry::new();
    let timeout = HeartbeatConfig::default().timeout;
    let (url, coordinator) = coordinator_with(&job, 1, 5, timeout, registry.clone());
    let mut r0 = node(&job, &url, "r0", false, 30);
    let mut survivors = vec![];
    for t in 0..transient_nodes {
        survivors.push(node(&job, &url, &format!("t{t}"), true, 30));
    }
    let mut victim = survivors.pop().expect("at least one transient node");
    let at = wait_for(&url, &format!("stage {stage}"), |s| {
        s.progress.as_ref().is_some_and(|p| p.stage == stage)
            && transient(s) == transient_nodes as u32
    });
    // The consistent clock moves while the segment runs: every node sends its part of each
    // copy (partitions at the clock, workers' reports below it) in the background.
    let copied = clock(&wait_for(&url, "background copies", |s| {
        clock(s) >= clock(&at) + 15
    }));
    signal(&victim, "KILL");
    let (exit, _) = wait_exit(&mut victim, Duration::from_secs(5));
    assert!(!exit.success());
    wait_for(&url, "the rollback", |s| {
        s.progress.as_ref().is_some_and(|p| p.rollbacks >= 1)
    });
    let report = coordinator.join().unwrap().expect("the job finishes");
    assert_exact(&report);
    assert_eq!(report.rollbacks, 1, "{:?}", report.segments);
    // The failed segment is not in the report; the one after it starts where its last
    // complete copy was, past where the failed segment started, not back at or before it.
    let ends = std::iter::once(0).chain(report.segments.iter().map(|s| s.end_clock));
    let resumed = report
        .segments
        .iter()
        .zip(ends)
        .find(|(segment, before)| segment.first_clock > *before)
        .map(|(segment, _)| segment.first_clock)
        .unwrap_or_else(|| panic!("no segment resumed past a failure: {:?}", report.segments));
    assert!(
        resumed >= copied,
        "resumed at {resumed} but clock {copied} was copied before the kill: {:?}",
        report.segments
    );
    // Every clock has every worker's results, the kept ones included.
    let missing: Vec<usize> = (0..report.run.clock_stats.len())
        .filter(|&c| report.run.clock_stats[c].updates == 0)
        .collect();
    assert!(missing.is_empty(), "clocks without results: {missing:?}");
    // Copies since the copy the coordinator holds are deltas of the rows changed since; a
    // partition placed after it (the first layout, a migration, a restore) comes whole.
    let copy = |name: &str, kind: &str| counter(&registry, name, kind);
    let bytes = "ebbflow_runtime_backup_copy_bytes_total";
    let images = "ebbflow_runtime_backup_copy_images_total";
    let deltas = copy(images, "delta");
    assert!(deltas > 0.0, "no delta copies");
    // A whole partition: 64 rows x 4 values x 4 bytes x 2 tables over 6 partitions.
    let whole = 64.0 * 4.0 * 4.0 * 2.0 / 6.0;
    let per_delta = copy(bytes, "delta") / deltas;
    eprintln!(
        "update period {update_period}: {deltas} delta images of {per_delta:.0} bytes on average, \
         {} whole images of {:.0}, for {whole:.0}-byte partitions",
        copy(images, "whole"),
        copy(bytes, "whole") / copy(images, "whole").max(1.0)
    );
    if update_period == 20 {
        // Between copies 5 clocks apart a quarter of the rows change.
        assert!(
            per_delta < 0.35 * whole,
            "{per_delta} bytes per delta of a {whole}-byte partition"
        );
    } else {
        // Every row changes every clock: a delta is the whole partition.
        assert!(
            per_delta > 0.9 * whole,
            "{per_delta} bytes per delta of a {whole}-byte partition"
        );
    }
    for child in std::iter::once(&mut r0).chain(&mut survivors) {
        let (exit, stderr) = wait_exit(child, Duration::from_secs(10));
        assert!(exit.success(), "{exit:?} {stderr}");
    }
}

/// A cap on the copies' bandwidth spaces them out: a dense job (every row changes every clock)
/// whose copies every 5 clocks would send about 2 KB per 75 ms sends at about the cap's rate
/// instead, each delta coalescing more clocks, and its table is still exact.
#[test]
fn a_copy_bandwidth_cap_spaces_the_copies_and_keeps_the_table_exact() {
    let job = Job::dense(400);
    let cap = 8_000.0; // bytes per second
    let registry = prometheus::Registry::new();
    let (url, coordinator) = coordinator_capped(&job, cap, registry.clone());
    let started = Instant::now();
    let mut nodes = vec![node(&job, &url, "r0", false, 30)];
    for t in 0..2 {
        nodes.push(node(&job, &url, &format!("t{t}"), true, 30));
    }
    let report = coordinator.join().unwrap().expect("the job finishes");
    let seconds = started.elapsed().as_secs_f64();
    assert_exact(&report);
    let copy = |name: &str, kind: &str| counter(&registry, name, kind);
    let bytes = copy("ebbflow_runtime_backup_copy_bytes_total", "delta")
        + copy("ebbflow_runtime_backup_copy_bytes_total", "whole");
    let images = copy("ebbflow_runtime_backup_copy_images_total", "delta")
        + copy("ebbflow_runtime_backup_copy_images_total", "whole");
    let copies = images / f64::from(job.partitions);
    let uncapped = job.clocks as f64 / 5.0;
    let rate = bytes / seconds;
    eprintln!(
        "capped at {cap} B/s: {copies:.0} copies ({uncapped:.0} every 5 clocks), {bytes:.0} bytes \
         in {seconds:.1} s = {rate:.0} B/s; segments {}",
        report.segments.len()
    );
    assert!(copies > 2.0, "copies still happen: {copies}");
    assert!(
        copies < uncapped / 2.0,
        "{copies} copies where every 5 clocks would take {uncapped}"
    );
    // The first copies, before any was measured, go at backup_every.
    assert!(rate < 1.5 * cap, "{rate} B/s over a {cap} B/s cap");
    for mut child in nodes {
        let (exit, stderr) = wait_exit(&mut child, Duration::from_secs(10));
        assert!(exit.success(), "{exit:?} {stderr}");
    }
}

/// `ebbflow-runtime elastic-coordinator` as a process, checkpointing to `checkpoint` every
/// 100 ms at most and writing its report to `report`; returns it and its admin URL.
fn coordinator_process(
    job: &Job,
    checkpoint: &std::path::Path,
    report: &std::path::Path,
) -> (Child, String) {
    coordinator_process_every(job, checkpoint, report, 100)
}

/// As [`coordinator_process`], checkpointing every `interval_ms` at most.
fn coordinator_process_every(
    job: &Job,
    checkpoint: &std::path::Path,
    report: &std::path::Path,
    interval_ms: u64,
) -> (Child, String) {
    let interval = interval_ms.to_string();
    let mut child = Command::new(env!("CARGO_BIN_EXE_ebbflow-runtime"))
        .arg("elastic-coordinator")
        .args(job.flags())
        .args(["--listen", "127.0.0.1:0", "--reliable-nodes", "1"])
        .args(["--backup-every", "5", "--checkpoint-interval-ms", &interval])
        .arg("--checkpoint")
        .arg(checkpoint)
        .arg("--report-out")
        .arg(report)
        .env("EBBFLOW_JOB_SECRET", SECRET)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting an elastic coordinator");
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.take().expect("piped")),
        &mut line,
    )
    .unwrap();
    let addr = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("the coordinator's first line: {line:?}"));
    (child, format!("https://{addr}"))
}

/// A coordinator process checkpointing every `interval_ms` at most, with a reliable and a
/// transient node joined to it.
struct Checkpointed {
    dir: tempfile::TempDir,
    checkpoint: std::path::PathBuf,
    report: std::path::PathBuf,
    coordinator: Child,
    url: String,
    nodes: Vec<Child>,
}

fn checkpointed(job: &Job, interval_ms: u64) -> Checkpointed {
    let dir = tempfile::tempdir().unwrap();
    let checkpoint = dir.path().join("job.ckpt");
    let report = dir.path().join("report.json");
    let (coordinator, url) = coordinator_process_every(job, &checkpoint, &report, interval_ms);
    let nodes = vec![
        node(job, &url, "r0", false, 30),
        node(job, &url, "t0", true, 30),
    ];
    Checkpointed {
        dir,
        checkpoint,
        report,
        coordinator,
        url,
        nodes,
    }
}

/// The clock of `job`'s checkpoint at `path`, if one is there.
fn checkpoint_clock(path: &std::path::Path, job: &Job) -> Option<u64> {
    ebbflow_runtime::checkpoint::Checkpoint::read(path, &job.id())
        .ok()
        .flatten()
        .map(|c| c.clock)
}

/// A coordinator lost mid-run (SIGKILL, with its nodes: its reliable pod drained, say) and
/// started again on its checkpoint resumes at the checkpoint's clock, not at 0, with new nodes,
/// and the table comes out exact; a checkpoint of another job is refused by name.
#[test]
fn a_coordinator_restarted_on_its_checkpoint_resumes_and_the_table_is_exact() {
    let job = Job::dense(400);
    let Checkpointed {
        dir: _dir,
        checkpoint,
        report,
        coordinator: mut first,
        url,
        mut nodes,
    } = checkpointed(&job, 100);
    let read = || checkpoint_clock(&checkpoint, &job);
    // Training went on past a checkpoint or two (each wait is on the job's progress).
    let mut at = 100;
    while read().is_none_or(|clock| clock < 60) {
        assert!(
            at < job.clocks - 50,
            "no checkpoint at clock 60 or later by clock {at}"
        );
        wait_for(&url, &format!("clock {at}"), |s| clock(s) >= at);
        at += 10;
    }
    signal(&first, "KILL");
    for child in &nodes {
        signal(child, "KILL");
    }
    let _ = wait_exit(&mut first, Duration::from_secs(10));
    for child in &mut nodes {
        let _ = wait_exit(child, Duration::from_secs(10));
    }
    let saved = read().expect("a checkpoint");
    assert!((60..job.clocks).contains(&saved), "{saved}");

    // Another job's coordinator refuses the file, naming it.
    let other = Job { clocks: 300, ..job };
    let refused = Command::new(env!("CARGO_BIN_EXE_ebbflow-runtime"))
        .arg("elastic-coordinator")
        .args(other.flags())
        .args(["--listen", "127.0.0.1:0", "--reliable-nodes", "1"])
        .arg("--checkpoint")
        .arg(&checkpoint)
        .args(["--join-timeout-seconds", "5"])
        .env("EBBFLOW_JOB_SECRET", SECRET)
        .stdout(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success());
    assert!(
        stderr.contains("job.ckpt") && stderr.contains("belongs to job"),
        "{stderr}"
    );

    // The restarted coordinator and new nodes go on from the checkpoint.
    let (mut second, url) = coordinator_process(&job, &checkpoint, &report);
    let mut nodes = vec![
        node(&job, &url, "r1", false, 30),
        node(&job, &url, "t1", true, 30),
    ];
    let (exit, stderr) = wait_exit(&mut second, Duration::from_secs(120));
    assert!(exit.success(), "{exit:?} {stderr}");
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    let wrong = summary["run"]["eval"]["metrics"]
        .as_array()
        .and_then(|metrics| {
            metrics
                .iter()
                .find(|m| m[0] == "wrong_values")
                .and_then(|m| m[1].as_f64())
        });
    assert_eq!(
        wrong,
        Some(0.0),
        "the final table differs: {}",
        summary["run"]["eval"]
    );
    let first_clock = summary["segments"][0]["first_clock"].as_u64().unwrap();
    assert_eq!(first_clock, saved, "resumed at the checkpoint's clock");
    eprintln!(
        "checkpoint at clock {saved} of {}; the restarted coordinator's first segment started there",
        job.clocks
    );
    for child in &mut nodes {
        let (exit, stderr) = wait_exit(child, Duration::from_secs(10));
        assert!(exit.success(), "{exit:?} {stderr}");
    }
}

/// `ebbflow-runtime elastic-coordinator` told to stop by SIGTERM (Ctrl-C is SIGINT, the same)
/// stops at the next clock boundary, keeping what was trained: the last consistent copy goes to
/// its checkpoint at once, though the checkpoint interval (an hour here) has not passed, the
/// report says where it stopped, its nodes are released, and it exits 0. Before, SIGTERM
/// killed it: no report, and the checkpoint was whatever the interval last allowed.
#[test]
fn a_coordinator_told_to_stop_by_sigterm_checkpoints_what_it_trained_and_exits() {
    let job = Job::dense(2000);
    let Checkpointed {
        dir: _dir,
        checkpoint,
        report,
        mut coordinator,
        url,
        mut nodes,
    } = checkpointed(&job, 3_600_000);
    let read = || checkpoint_clock(&checkpoint, &job);
    // the first copy is written at once; the next not for an hour
    wait_for(&url, "clock 100", |s| clock(s) >= 100);
    let first = read().expect("the first copy is on disk");
    assert!(first < 100, "{first}");
    signal(&coordinator, "TERM");
    let (exit, stderr) = wait_exit(&mut coordinator, Duration::from_secs(60));
    assert!(exit.success(), "{exit:?} {stderr}");
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&report).expect("the report")).unwrap();
    let stopped = summary["stopped_at"]
        .as_u64()
        .unwrap_or_else(|| panic!("no stopped_at: {summary}"));
    assert!((100..job.clocks).contains(&stopped), "{stopped}");
    let saved = read().expect("a checkpoint");
    assert!(
        saved > first && saved <= stopped,
        "checkpoint at {saved}: first {first}, stopped at {stopped}"
    );
    eprintln!("stopped at clock {stopped}; checkpoint at {saved} (first {first})");
    for child in &mut nodes {
        let (exit, stderr) = wait_exit(child, Duration::from_secs(10));
        assert!(exit.success(), "{exit:?} {stderr}");
    }
}

/// SIGTERM while the command-line coordinator still waits for its nodes ends the wait at once
/// with a line saying so; before, nothing read the stop until training started, so the signal
/// did nothing for up to the join timeout (10 minutes by default).
#[test]
fn a_coordinator_told_to_stop_while_waiting_for_nodes_exits_at_once() {
    let job = Job::dense(100);
    let dir = tempfile::tempdir().unwrap();
    let (mut coordinator, url) = coordinator_process_every(
        &job,
        &dir.path().join("job.ckpt"),
        &dir.path().join("report.json"),
        100,
    );
    // serving, no node joined
    wait_for(&url, "the admin API", |_| true);
    signal(&coordinator, "TERM");
    let (exit, stderr) = wait_exit(&mut coordinator, Duration::from_secs(10));
    assert!(!exit.success(), "{exit:?} {stderr}");
    assert!(
        stderr.contains("told to stop before training started (0 of 1 reliable nodes had joined)"),
        "{stderr}"
    );
}

/// A node that gets SIGTERM while it is still joining (its coordinator not serving yet) gives
/// notice once it has joined, instead of training on until it is killed: the coordinator records
/// the notice, the node goes, and the table is exact.
#[test]
fn a_sigterm_while_joining_is_a_notice_once_joined() {
    let job = Job::dense(300);
    // Bound, not yet served: the node's join waits in the listener's backlog.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("https://{}", listener.local_addr().unwrap());
    let metrics = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let mut t0 = node_with(
        &job,
        &url,
        "t0",
        true,
        30,
        &["--metrics-listen", &metrics.to_string()],
    );
    // The node listens for SIGTERM before it binds its metrics port.
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(metrics).is_err() {
        assert!(
            Instant::now() < deadline,
            "the node never bound its metrics port"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    signal(&t0, "TERM");
    let (_, coordinator) = coordinator_configured(
        listener,
        &job,
        (1, 5),
        HeartbeatConfig::default().timeout,
        prometheus::Registry::new(),
        None,
    );
    let mut r0 = node(&job, &url, "r0", false, 30);
    let report = coordinator.join().unwrap().expect("the job finishes");
    assert_exact(&report);
    assert_eq!(
        report.events.get("notice").copied(),
        Some(1),
        "{:?}",
        report.events
    );
    let _ = wait_exit(&mut t0, Duration::from_secs(60));
    let (exit, stderr) = wait_exit(&mut r0, Duration::from_secs(10));
    assert!(exit.success(), "{exit:?} {stderr}");
}

/// A joined node still being prepared serves nothing and runs no worker: killed at the moment
/// another node's notice ends the segment (a bulk eviction), it fails without a rollback, and
/// the notice hands over as it would alone. Before, the segment's pause reached the dead node,
/// every node abandoned its state, and the run rolled back to its last copy.
#[test]
fn a_node_lost_while_being_prepared_costs_no_rollback() {
    let job = Job::dense(700);
    let registry = prometheus::Registry::new();
    // Copies every 100 clocks: a segment with a node being prepared runs 1.5 s, and the node is
    // switched in only at its end.
    let (url, coordinator) = coordinator_with(
        &job,
        1,
        100,
        HeartbeatConfig::default().timeout,
        registry.clone(),
    );
    let joins = || counter(&registry, "ebbflow_runtime_elastic_events_total", "join");
    let mut r0 = node(&job, &url, "r0", false, 30);
    let mut t0 = node(&job, &url, "t0", true, 30);
    wait_for(&url, "t0 switched in", |s| {
        transient(s) == 1 && clock(s) > 0
    });
    let joined_before = joins();
    let mut t1 = node(&job, &url, "t1", true, 30);
    let deadline = Instant::now() + Duration::from_secs(60);
    while joins() == joined_before {
        assert!(Instant::now() < deadline, "t1's join was never applied");
        std::thread::sleep(Duration::from_millis(5));
    }
    // t1 is admitted and being prepared; its cohort is switched in only at the segment's end.
    signal(&t1, "KILL");
    signal(&t0, "TERM");
    let (exit, _) = wait_exit(&mut t1, Duration::from_secs(5));
    assert!(!exit.success());
    let (exit, stderr) = wait_exit(&mut t0, Duration::from_secs(20));
    assert!(exit.success(), "t0 released cleanly: {exit:?} {stderr}");

    let report = coordinator.join().unwrap().expect("the job finishes");
    assert_exact(&report);
    assert_eq!(
        report.rollbacks, 0,
        "{:?} {:?}",
        report.events, report.rejected
    );
    assert_eq!(report.clocks_redone, 0);
    assert_eq!(report.events.get("fail"), Some(&1), "{:?}", report.events);
    assert_eq!(report.events.get("notice"), Some(&1), "{:?}", report.events);
    assert!(
        report.segments.iter().all(|s| s.transient_nodes <= 1),
        "t1 was never switched in: {:?}",
        report.segments
    );
    let (exit, stderr) = wait_exit(&mut r0, Duration::from_secs(10));
    assert!(exit.success(), "{exit:?} {stderr}");
}

/// `scripts/bench-notice-to-safe.sh`'s rounds (`bench/notice_to_safe.py`) drive a coordinator
/// and 4 node processes of this build through a partial and then a full eviction with notice,
/// reading `/status` to pick the transient node that serves the most partitions; the script fails
/// unless both notices were acted on and the table came out exact. Run small here, so the
/// benchmark cannot silently break (its figures are not checked: they are the benchmark's).
#[test]
fn the_notice_to_safe_benchmark_runs_against_this_build() {
    let python = std::env::var("EBBFLOW_PYTHON").unwrap_or_else(|_| "python3".into());
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../bench/notice_to_safe.py");
    let output = Command::new(python)
        .args([
            script,
            env!("CARGO_BIN_EXE_ebbflow-runtime"),
            "--mib",
            "1",
            "--rounds",
            "1",
            "--clocks",
            "600",
            "--clock-ms",
            "10",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    // One round: the partial eviction took a transient node that served partitions, and the
    // table was exact.
    let row = stdout
        .lines()
        .find(|line| line.starts_with("| 1 | t"))
        .unwrap_or_else(|| panic!("no round in {stdout}"));
    assert!(row.contains(" | yes | "), "{row}");
    assert!(!row.contains("(0)"), "{row}");
}
