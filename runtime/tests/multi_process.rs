//! Multi-process mode: a coordinator and node processes of the real binary on 127.0.0.1.

use std::path::PathBuf;
use std::time::Duration;

use ebbflow_runtime::cluster::{ClusterSpec, NodeSpec, run_cluster};
use ebbflow_runtime::exact::{ExactApp, ExactConfig};
use ebbflow_runtime::local::run_single_process;
use ebbflow_runtime::metrics::RuntimeMetrics;
use ebbflow_runtime::worker::JobConfig;

fn app_args() -> Vec<String> {
    [
        "--app",
        "exact",
        "--exact-rows",
        "53",
        "--exact-width",
        "3",
        "--exact-tables",
        "2",
        "--exact-shared",
        "4",
    ]
    .map(String::from)
    .to_vec()
}

#[test]
fn exact_app_over_node_processes_matches_single_process() {
    let dir = tempfile::tempdir().unwrap();
    for staleness in [0, 2] {
        let config = JobConfig {
            clocks: 6,
            staleness,
            workers: 4,
            partitions: 5,
            ..JobConfig::default()
        };
        let spec = ClusterSpec {
            binary: PathBuf::from(env!("CARGO_BIN_EXE_ebbflow-runtime")),
            nodes: NodeSpec::uniform(2, 2),
            app_args: app_args(),
            work_dir: dir.path().to_path_buf(),
            timeout: Duration::from_secs(300),
        };
        let cluster = run_cluster(&spec, &config).unwrap();
        assert_eq!(
            cluster.eval.metric("wrong_values"),
            Some(0.0),
            "staleness {staleness}: {:?}",
            cluster.eval
        );
        assert_eq!(cluster.workers, 4);
        assert_eq!(
            cluster.total_stats().loss_sum,
            0.0,
            "staleness {staleness}: ssp bound violated"
        );
        assert!(cluster.total_stats().loss_count > 0);
        let app = ExactApp::new(ExactConfig {
            rows: 53,
            width: 3,
            tables: 2,
            shared_rows: 4,
            clocks: 6,
            staleness,
            clock_delay: std::time::Duration::ZERO,
            update_period: 1,
        });
        let local = run_single_process(&app, &config, &RuntimeMetrics::unregistered()).unwrap();
        assert_eq!(cluster.param_sum, local.param_sum);
        assert_eq!(cluster.param_abs_sum, local.param_abs_sum);
        assert_eq!(cluster.updates, local.updates);
    }
}

#[test]
fn server_only_and_worker_only_nodes_train_exactly_and_report_memory() {
    let dir = tempfile::tempdir().unwrap();
    let config = JobConfig {
        clocks: 5,
        staleness: 1,
        workers: 2,
        partitions: 3,
        ..JobConfig::default()
    };
    let spec = ClusterSpec {
        binary: PathBuf::from(env!("CARGO_BIN_EXE_ebbflow-runtime")),
        nodes: NodeSpec::split(2),
        app_args: [
            "--app",
            "exact",
            "--exact-rows",
            "40",
            "--exact-width",
            "2",
            "--exact-tables",
            "1",
            "--exact-shared",
            "3",
        ]
        .map(String::from)
        .to_vec(),
        work_dir: dir.path().to_path_buf(),
        timeout: Duration::from_secs(300),
    };
    let report = run_cluster(&spec, &config).unwrap();
    assert_eq!(report.eval.loss, 0.0, "{:?}", report.eval);
    assert_eq!(report.total_stats().loss_sum, 0.0);
    assert_eq!(report.workers, 2);
    // 40 rows of 2 values, all hosted by the server-only node.
    assert_eq!(report.parameter_bytes, 40 * 2 * 4);
    assert_eq!(report.node_peak_rss_bytes.len(), 2);
    assert!(
        report.node_peak_rss_bytes.iter().all(|&rss| rss > 0),
        "{:?}",
        report.node_peak_rss_bytes
    );
}

#[test]
fn a_node_with_the_wrong_secret_fails_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_ebbflow-runtime"))
        .args([
            "node",
            "--coordinator",
            "https://127.0.0.1:9",
            "--name",
            "n",
            "--workers",
            "1",
        ])
        .env("EBBFLOW_JOB_SECRET", "x")
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("/join"), "{stderr}");
}

/// A node of a TLS job (the default) given an `http://` coordinator URL refuses to send its
/// token in clear, and says which scheme to use.
#[test]
fn a_node_of_a_tls_job_refuses_a_plaintext_coordinator_url() {
    let dir = tempfile::tempdir().unwrap();
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_ebbflow-runtime"))
        .args(["node", "--coordinator", "http://127.0.0.1:9", "--name", "n"])
        .env("EBBFLOW_JOB_SECRET", "x")
        .env_remove("EBBFLOW_TRANSPORT_SECURITY")
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("\"http://127.0.0.1:9\"") && stderr.contains("use https://"),
        "{stderr}"
    );
}

/// Matrix factorization (the synthetic variant, no download) over two node processes ends where a
/// single-process BSP run ends, up to float summation order.
#[test]
fn mf_over_node_processes_agrees_with_single_process_under_bsp() {
    let dir = tempfile::tempdir().unwrap();
    let config = JobConfig {
        clocks: 4,
        staleness: 0,
        workers: 2,
        partitions: 4,
        ..JobConfig::default()
    };
    let spec = ClusterSpec {
        binary: PathBuf::from(env!("CARGO_BIN_EXE_ebbflow-runtime")),
        nodes: NodeSpec::uniform(2, 1),
        app_args: ["--app", "mf-synthetic"].map(String::from).to_vec(),
        work_dir: dir.path().to_path_buf(),
        timeout: Duration::from_secs(300),
    };
    let cluster = run_cluster(&spec, &config).unwrap();
    let app = match ebbflow_runtime::apps::build_named_app("mf-synthetic", None, 0).unwrap() {
        ebbflow_runtime::apps::NamedApp::Mf(app) => app,
        _ => panic!("mf-synthetic is not MF"),
    };
    let local = run_single_process(&app, &config, &RuntimeMetrics::unregistered()).unwrap();
    assert!(
        (cluster.eval.loss - local.eval.loss).abs() <= 1e-4,
        "rmse {} vs {}",
        cluster.eval.loss,
        local.eval.loss
    );
    let relative = (cluster.param_sum - local.param_sum).abs() / local.param_abs_sum;
    assert!(
        relative <= 1e-5,
        "parameter sums {} vs {}",
        cluster.param_sum,
        local.param_sum
    );
    assert_eq!(cluster.updates, local.updates);
}
