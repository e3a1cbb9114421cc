//! The integer-exact app written in Python, driven through the same seeded chaos schedules as the
//! Rust exact app (`runtime/tests/elastic.rs`): bulk adds, partial and full evictions with
//! notice, failures and late notices, in one process (the elastic controller over an in-process
//! fleet). Every run must end with the exact table, and the runs together must have rolled back,
//! migrated and changed stage.

mod common;

use std::time::Duration;

use ebbflow_python::PyApp;
use ebbflow_runtime::chaos::random_schedule;
use ebbflow_runtime::elastic::{ElasticConfig, StageThresholds, run_elastic};
use ebbflow_runtime::metrics::RuntimeMetrics;
use ebbflow_runtime::worker::JobConfig;

fn config(staleness: u64, clocks: u64, transient: &[&str]) -> ElasticConfig {
    ElasticConfig {
        job: JobConfig {
            clocks,
            staleness,
            workers: 4,
            partitions: 8,
            wait_timeout: Duration::from_secs(60),
            ..JobConfig::default()
        },
        thresholds: StageThresholds::default(),
        backup_every: 3,
        backup_interval: None,
        backup_bandwidth: None,
        start: None,
        checkpoint: None,
        reliable: vec!["od-0".into()],
        transient: transient.iter().map(|s| s.to_string()).collect(),
    }
}

#[test]
fn the_python_exact_app_is_exact_through_seeded_chaos_in_process() {
    need_python!();
    let clocks = 40;
    let initial = ["s-0", "s-1", "s-2"];
    let (mut rollbacks, mut migrated) = (0, 0);
    let mut stages = std::collections::BTreeSet::new();
    for seed in [7, 1, 2] {
        let events = random_schedule(seed, 60, clocks, &initial);
        for staleness in [0, 1] {
            let args = format!(
                r#"{{"rows": 97, "width": 3, "tables": 2, "shared_rows": 5, "clocks": {clocks}, "staleness": {staleness}}}"#
            );
            let app = PyApp::load("exact:App", Some(&args), &[]).unwrap();
            let report = run_elastic(
                &app,
                &config(staleness, clocks, &initial),
                &events,
                &RuntimeMetrics::unregistered(),
            )
            .unwrap();
            assert_eq!(
                report.run.eval.metric("wrong_values"),
                Some(0.0),
                "seed {seed}, staleness {staleness}: lost or doubled updates: {:?}; segments {:?}",
                report.run.eval,
                report.segments
            );
            assert_eq!(
                report.run.total_stats().loss_sum,
                0.0,
                "seed {seed}, staleness {staleness}: a read broke the SSP bound"
            );
            let applied: u64 = report.events.values().sum();
            assert!(applied >= 50, "events applied: {:?}", report.events);
            rollbacks += report.rollbacks;
            migrated += report.partitions_migrated;
            stages.extend(report.segments.iter().map(|s| s.stage));
        }
    }
    println!(
        "python exact app: {rollbacks} rollbacks, {migrated} partitions moved, stages {stages:?}"
    );
    assert!(
        rollbacks > 0 && migrated > 0,
        "{rollbacks} rollbacks, {migrated} moved"
    );
    assert!(stages.len() >= 2, "stages seen: {stages:?}");
}
