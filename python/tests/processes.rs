//! The Python exact app across real node processes: `python -m ebbflow runtime elastic-node
//! --app python` processes (the wheel built by `pip install ./python`) join a coordinator that
//! runs in this process, leave on SIGTERM (a notice), die on SIGKILL (a failure: rollback), leave
//! on a SIGTERM with no grace in stage 2 (a notice too late: rollback), and a bulk add switches
//! in while training. The final table must be exact.

mod common;

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use ebbflow_python::PyApp;
use ebbflow_runtime::elastic::{ElasticConfig, LiveFeed, StageThresholds};
use ebbflow_runtime::elastic_coordinator::{ElasticJob, run_elastic_job_with};
use ebbflow_runtime::heartbeat::HeartbeatConfig;
use ebbflow_runtime::metrics::RuntimeMetrics;
use ebbflow_runtime::worker::JobConfig;
use ebbflow_runtime_api::StatusResponse;

const SECRET: &str = "python-processes-secret";

#[path = "../../runtime/tests/support/processes.rs"]
mod processes;

use processes::{clock, signal, transient, wait_exit};

fn status(url: &str) -> Option<StatusResponse> {
    processes::status(url, SECRET)
}

fn wait_for(url: &str, what: &str, ready: impl Fn(&StatusResponse) -> bool) -> StatusResponse {
    processes::wait_for(url, SECRET, Duration::from_secs(120), what, ready)
}
const CLOCKS: u64 = 300;
const STALENESS: u64 = 1;
const PARTITIONS: u32 = 8;
const WORKERS: usize = 4;
const APP_ARGS: &str = r#"{"clocks": 300, "staleness": 1, "clock_ms": 15}"#;

/// The flags every node shares (they make up the job id).
fn flags() -> Vec<String> {
    [
        "--app",
        "python",
        "--entry",
        "exact:App",
        "--app-args",
        APP_ARGS,
        "--clocks",
        &CLOCKS.to_string(),
        "--staleness",
        &STALENESS.to_string(),
        "--partitions",
        &PARTITIONS.to_string(),
        "--job-workers",
        &WORKERS.to_string(),
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect()
}

/// The id `ebbflow runtime` derives from [`flags`].
fn job_id() -> String {
    format!(
        "python clocks={CLOCKS} staleness={STALENESS} partitions={PARTITIONS} workers={WORKERS} optimizer=Add entry=exact:App args={APP_ARGS}"
    )
}

/// Whether the venv's Python has the SDK's wheel installed.
fn wheel_installed(python: &std::path::Path) -> bool {
    Command::new(python)
        .args(["-c", "import ebbflow._core"])
        .current_dir(std::env::temp_dir())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn node(python: &std::path::Path, url: &str, name: &str, transient: bool) -> Child {
    node_with_grace(python, url, name, transient, 30)
}

/// As [`node`], leaving within `grace_seconds` of a SIGTERM (0: at once, a notice too late for
/// anything it hosts to move first).
fn node_with_grace(
    python: &std::path::Path,
    url: &str,
    name: &str,
    transient: bool,
    grace_seconds: u64,
) -> Child {
    let mut command = Command::new(python);
    // Not from python/, whose ebbflow/ sources (without the built module) would shadow the wheel.
    command
        .current_dir(std::env::temp_dir())
        .args(["-m", "ebbflow", "runtime", "elastic-node"])
        .args(flags())
        .args([
            "--coordinator",
            url,
            "--name",
            name,
            "--grace-seconds",
            &grace_seconds.to_string(),
        ])
        .env("EBBFLOW_JOB_SECRET", SECRET)
        .env(
            "EBBFLOW_PYTHON_PATH",
            common::repo().join("examples/python"),
        )
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    if transient {
        command.arg("--transient");
    }
    command.spawn().expect("starting a Python elastic node")
}

/// The job's coordinator, in this process, copying to its backups every `backup_every` clocks:
/// its admin URL and the thread that returns the run's report.
fn start_coordinator(
    backup_every: u64,
) -> (
    String,
    std::thread::JoinHandle<
        Result<
            ebbflow_runtime::elastic::ElasticReport,
            ebbflow_runtime::elastic_coordinator::ElasticJobError,
        >,
    >,
) {
    let app = PyApp::load("exact:App", Some(APP_ARGS), &[]).unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("https://{}", listener.local_addr().unwrap());
    let settings = ElasticJob {
        config: ElasticConfig {
            job: JobConfig {
                clocks: CLOCKS,
                staleness: STALENESS,
                partitions: PARTITIONS,
                workers: WORKERS,
                wait_timeout: Duration::from_secs(60),
                ..JobConfig::default()
            },
            thresholds: StageThresholds::default(),
            backup_every,
            backup_interval: None,
            backup_bandwidth: None,
            start: None,
            checkpoint: None,
            reliable: Vec::new(),
            transient: Vec::new(),
        },
        secret: SECRET.into(),
        job: job_id(),
        reliable_nodes: 1,
        join_timeout: Duration::from_secs(60),
        background_copies: true,
        linger: None,
        stop: None,
        checkpoint: None,
    };
    let registry = prometheus::Registry::new();
    let metrics = RuntimeMetrics::register(&registry).unwrap();
    let coordinator = std::thread::spawn(move || {
        run_elastic_job_with(
            &app,
            settings,
            HeartbeatConfig::default().timeout,
            listener,
            registry,
            &metrics,
            LiveFeed::new(),
        )
    });
    (url, coordinator)
}

/// The test venv's python if the SDK's wheel is installed in it; else `None`, saying so.
fn venv_with_wheel() -> Option<std::path::PathBuf> {
    let python = common::venv_python().unwrap();
    if !wheel_installed(&python) {
        println!(
            "skipped: the SDK's wheel is not installed in {} (pip install ./python)",
            python.display()
        );
        return None;
    }
    Some(python)
}

/// No lost or doubled update in the final table.
fn assert_no_wrong_values(report: &ebbflow_runtime::elastic::ElasticReport) {
    assert_eq!(
        report.run.eval.metric("wrong_values"),
        Some(0.0),
        "lost or doubled updates: {:?}",
        report.run.eval
    );
}

#[test]
fn python_node_processes_join_leave_and_die_and_the_table_is_exact() {
    need_python!();
    let Some(python) = venv_with_wheel() else {
        return;
    };
    let (url, coordinator) = start_coordinator(5);
    let mut r0 = node(&python, &url, "r0", false);
    let mut t0 = node(&python, &url, "t0", true);
    let mut t1 = node(&python, &url, "t1", true);
    wait_for(&url, "training", |s| clock(s) >= 10);

    // Bulk add while training.
    let mut t2 = node(&python, &url, "t2", true);
    wait_for(&url, "the bulk add", |s| transient(s) == 3);

    // Partial eviction with notice.
    signal(&t0, "TERM");
    let (exit, stderr) = wait_exit(&mut t0, Duration::from_secs(30));
    assert!(exit.success(), "t0 released cleanly: {exit:?} {stderr}");
    wait_for(&url, "the partial eviction", |s| transient(s) == 2);

    // Failure without notice: a rollback to the BackupPS copy.
    let at = clock(&status(&url).unwrap());
    wait_for(&url, "another boundary", |s| clock(s) > at + 5);
    signal(&t1, "KILL");
    let _ = wait_exit(&mut t1, Duration::from_secs(10));
    wait_for(&url, "the rollback", |s| {
        s.progress.as_ref().is_some_and(|p| p.rollbacks >= 1) && transient(s) == 1
    });

    // Full eviction with notice.
    signal(&t2, "TERM");
    let (exit, stderr) = wait_exit(&mut t2, Duration::from_secs(30));
    assert!(exit.success(), "t2 released cleanly: {exit:?} {stderr}");

    let report = coordinator.join().unwrap().expect("the job finishes");
    assert_no_wrong_values(&report);
    assert_eq!(
        report.run.total_stats().loss_sum,
        0.0,
        "an SSP read bound broke"
    );
    assert!(report.rollbacks >= 1, "{:?}", report.segments);
    assert!(report.partitions_migrated > 0);
    println!(
        "python nodes: {} rollbacks, {} partitions moved, events {:?}",
        report.rollbacks, report.partitions_migrated, report.events
    );
    let (exit, stderr) = wait_exit(&mut r0, Duration::from_secs(20));
    assert!(exit.success(), "r0 released at the end: {exit:?} {stderr}");
}

/// A late notice across Python node processes: a transient node whose grace period is zero
/// says it leaves and exits at once, in stage 2 (transient nodes serve partitions), so what it
/// served cannot move first: the job rolls back to the backups and the table stays exact.
#[test]
fn a_python_notice_too_late_rolls_back_and_stays_exact() {
    need_python!();
    let Some(python) = venv_with_wheel() else {
        return;
    };
    let (url, coordinator) = start_coordinator(1);
    let mut r0 = node(&python, &url, "r0", false);
    let mut t0 = node_with_grace(&python, &url, "t0", true, 0);
    let mut t1 = node(&python, &url, "t1", true);
    let mut t2 = node(&python, &url, "t2", true);
    wait_for(&url, "stage 2", |s| {
        s.progress.as_ref().is_some_and(|p| p.stage == 2) && clock(s) >= 10
    });
    signal(&t0, "TERM");
    let (exit, _) = wait_exit(&mut t0, Duration::from_secs(10));
    assert_eq!(exit.code(), Some(143), "t0 left at once");
    wait_for(&url, "the rollback", |s| {
        s.progress.as_ref().is_some_and(|p| p.rollbacks >= 1)
    });
    let report = coordinator.join().unwrap().expect("the job finishes");
    assert_no_wrong_values(&report);
    assert_eq!(
        report.rollbacks, 1,
        "one loss, one rollback: {:?}",
        report.segments
    );
    println!(
        "python late notice: {} rollback, events {:?}",
        report.rollbacks, report.events
    );
    for node in [&mut r0, &mut t1, &mut t2] {
        let (exit, stderr) = wait_exit(node, Duration::from_secs(20));
        assert!(
            exit.success(),
            "a survivor released at the end: {exit:?} {stderr}"
        );
    }
}
