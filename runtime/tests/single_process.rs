//! Single-process mode with the integer-exact app: exact final tables and SSP bounds.

use ebbflow_runtime::app::TableReader;
use ebbflow_runtime::exact::{ExactApp, ExactConfig};
use ebbflow_runtime::local::run_single_process;
use ebbflow_runtime::metrics::RuntimeMetrics;
use ebbflow_runtime::optimizer::Optimizer;
use ebbflow_runtime::worker::JobConfig;

fn job(workers: usize, staleness: u64, clocks: u64) -> (ExactApp, JobConfig) {
    let app = ExactApp::new(ExactConfig {
        rows: 97,
        width: 3,
        tables: 2,
        shared_rows: 5,
        clocks,
        staleness,
        clock_delay: std::time::Duration::ZERO,
        update_period: 1,
    });
    let config = JobConfig {
        clocks,
        staleness,
        workers,
        partitions: 5,
        keep_params: true,
        ..JobConfig::default()
    };
    (app, config)
}

#[test]
fn bsp_run_ends_with_the_exact_table_and_honours_bounds() {
    let (app, config) = job(3, 0, 12);
    let metrics = RuntimeMetrics::unregistered();
    let report = run_single_process(&app, &config, &metrics).unwrap();
    assert_eq!(
        report.eval.metric("wrong_values"),
        Some(0.0),
        "{:?}",
        report.eval
    );
    let totals = report.total_stats();
    assert_eq!(totals.loss_sum, 0.0, "ssp checks failed");
    assert!(totals.loss_count > 0);
    assert_eq!(report.clocks, 12);
    assert_eq!(report.clock_seconds.len(), 12);
    assert_eq!(metrics.iterations.get(), 36);
    assert!(metrics.rows_moved.with_label_values(&["push"]).get() > 0);
    // The report's copy agrees with the closed form too.
    let params = report.params.unwrap();
    let mut row = [0.0f32; 3];
    assert!(params.read_row(1, 0, &mut row));
    assert_eq!(row[2] as u64, app.expected(3, 1, 0, 2));
}

#[test]
fn ssp_runs_are_exact_and_never_read_too_stale_values() {
    for staleness in [1, 3] {
        let (app, config) = job(4, staleness, 15);
        let report = run_single_process(&app, &config, &RuntimeMetrics::unregistered()).unwrap();
        assert_eq!(
            report.eval.loss, 0.0,
            "staleness {staleness}: {:?}",
            report.eval
        );
        let totals = report.total_stats();
        assert_eq!(
            totals.loss_sum, 0.0,
            "staleness {staleness}: ssp bound violated"
        );
        assert!(totals.loss_count > 0);
    }
}

#[test]
fn bsp_is_deterministic_across_runs() {
    let (app, config) = job(3, 0, 6);
    let first = run_single_process(&app, &config, &RuntimeMetrics::unregistered()).unwrap();
    let (app, config) = job(3, 0, 6);
    let second = run_single_process(&app, &config, &RuntimeMetrics::unregistered()).unwrap();
    assert_eq!(first.params, second.params);
}

#[test]
fn server_side_sgd_scales_every_update() {
    let (app, mut config) = job(2, 0, 4);
    config.optimizer = Optimizer::Sgd { lr: 0.5 };
    let report = run_single_process(&app, &config, &RuntimeMetrics::unregistered()).unwrap();
    let params = report.params.unwrap();
    let mut row = [0.0f32; 3];
    assert!(params.read_row(0, 7, &mut row));
    assert_eq!(f64::from(row[1]), app.expected(2, 0, 7, 1) as f64 * 0.5);
}

#[test]
fn invalid_configurations_are_refused() {
    let (app, mut config) = job(0, 0, 4);
    let error = run_single_process(&app, &config, &RuntimeMetrics::unregistered()).unwrap_err();
    assert_eq!(error.category(), "validate_config");
    assert!(error.to_string().contains("workers"));
    config.workers = 1;
    config.partitions = 0;
    assert!(run_single_process(&app, &config, &RuntimeMetrics::unregistered()).is_err());
}
