//! Python apps on the runtime in one process: the exact app is exact, bad apps fail with
//! messages that name the app, the hook and the clock.

mod common;

use ebbflow_python::PyApp;
use ebbflow_runtime::local::{RunError, run_single_process};
use ebbflow_runtime::metrics::RuntimeMetrics;
use ebbflow_runtime::worker::JobConfig;

fn config(workers: usize, clocks: u64, staleness: u64) -> JobConfig {
    JobConfig {
        clocks,
        staleness,
        workers,
        partitions: 4,
        ..JobConfig::default()
    }
}

#[test]
fn the_python_exact_app_is_exact_in_one_process() {
    need_python!();
    for (workers, staleness) in [(1, 0), (3, 0), (4, 2)] {
        let args = format!(r#"{{"clocks": 12, "staleness": {staleness}}}"#);
        let app = PyApp::load("exact:App", Some(&args), &[]).unwrap();
        let report = run_single_process(
            &app,
            &config(workers, 12, staleness),
            &RuntimeMetrics::unregistered(),
        )
        .unwrap();
        assert_eq!(
            report.eval.metric("wrong_values"),
            Some(0.0),
            "{workers} workers, staleness {staleness}: {:?}",
            report.eval
        );
        assert_eq!(
            report.total_stats().loss_sum,
            0.0,
            "an SSP read bound broke"
        );
        assert!(report.total_stats().updates > 0);
    }
}
