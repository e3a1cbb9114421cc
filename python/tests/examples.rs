//! The Python examples reach their quality bars at several worker counts, on the real data sets
//! (`EBBFLOW_DATA_DIR`, scripts/fetch-data.sh): numpy MF on MovieLens 100K (test RMSE <= 0.95,
//! the Rust MF's bar) and a PyTorch MLP on digits (test accuracy >= 0.95).

mod common;

use ebbflow_python::PyApp;
use ebbflow_runtime::local::{RunReport, run_single_process};
use ebbflow_runtime::metrics::RuntimeMetrics;
use ebbflow_runtime::worker::JobConfig;
use pyo3::prelude::*;

fn run(entry: &str, args: &str, workers: usize, clocks: u64, staleness: u64) -> RunReport {
    let app = PyApp::load(entry, Some(args), &[]).unwrap();
    let config = JobConfig {
        clocks,
        staleness,
        workers,
        partitions: 4,
        ..JobConfig::default()
    };
    run_single_process(&app, &config, &RuntimeMetrics::unregistered()).unwrap()
}

fn data_dir() -> Option<std::path::PathBuf> {
    ebbflow_runtime::data::data_dir()
}

#[test]
fn numpy_mf_reaches_the_rust_mf_bar_at_any_worker_count() {
    need_python!();
    if data_dir().is_none() {
        println!("skipped: set EBBFLOW_DATA_DIR (scripts/fetch-data.sh)");
        return;
    }
    // 40 clocks a pass (batches of 2,000 ratings): 6 passes.
    for (workers, staleness) in [(1, 0), (2, 0), (4, 2)] {
        let report = run("mf_numpy:App", "{}", workers, 240, staleness);
        let rmse = report.eval.metric("rmse").unwrap();
        println!(
            "mf_numpy: {workers} workers, staleness {staleness}: rmse {rmse:.4}, {:.0} updates/s",
            report.updates_per_second
        );
        assert!(rmse <= 0.95, "{workers} workers: test RMSE {rmse}");
    }
}

#[test]
fn numpy_mf_by_key_and_by_slot_train_the_same_model() {
    need_python!();
    if data_dir().is_none() {
        println!("skipped: set EBBFLOW_DATA_DIR (scripts/fetch-data.sh)");
        return;
    }
    let by_slot = run("mf_numpy:App", "{}", 2, 40, 0).eval.loss;
    let by_key = run("mf_numpy:App", r#"{"by_key": true}"#, 2, 40, 0)
        .eval
        .loss;
    assert!(
        (by_slot - by_key).abs() < 1e-4,
        "rows/slots {by_slot} vs get/inc {by_key}"
    );
}

#[test]
fn the_pytorch_mlp_reaches_its_bar() {
    need_python!();
    if data_dir().is_none() {
        println!("skipped: set EBBFLOW_DATA_DIR (scripts/fetch-data.sh)");
        return;
    }
    let has_torch = Python::attach(|py| py.import("torch").is_ok());
    if !has_torch {
        println!("skipped: torch is not installed in the test venv (scripts/setup-python.sh)");
        return;
    }
    // 23 clocks a pass (global batches of 64): 400 clocks is 17 passes.
    for workers in [1, 3] {
        let report = run("mlp_torch:App", "{}", workers, 400, 1);
        let accuracy = report.eval.metric("accuracy").unwrap();
        println!("mlp_torch: {workers} workers: test accuracy {accuracy:.4}");
        assert!(accuracy >= 0.95, "{workers} workers: accuracy {accuracy}");
    }
}
