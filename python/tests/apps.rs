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

/// A module of broken apps, written for the tests below.
const BROKEN: &str = r#"
import numpy as np
import ebbflow as ef

class NoHooks:
    def tables(self):
        return [ef.Table(0, "w", 2)]

class BadTables(ef.App):
    def tables(self):
        return [ef.Table(0, "w", 0)]
    def worker(self, shard, num_shards): pass
    def evaluate(self, reader): return {"loss": 0.0}

class App(ef.App):
    def __init__(self, fault="none", at=3):
        self.fault, self.at = fault, at
    def tables(self):
        return [ef.Table(0, "w", 2)]
    def worker(self, shard, num_shards):
        if self.fault == "worker":
            raise ValueError("cannot open my shard")
        return Worker(self.fault, self.at)
    def evaluate(self, reader):
        rows = reader.get(0, np.arange(8))
        return {"loss": float(np.abs(rows).sum())}

class Worker(ef.Worker):
    def __init__(self, fault, at):
        self.fault, self.at = fault, at
        self.calls = 0
    def working_set(self):
        return {0: np.arange(8)}
    def clock(self, tables, clock):
        keys = np.arange(8, dtype=np.uint64)
        if self.fault == "impure":
            self.calls += 1  # learned state outside the tables: a rollback could not redo it
            tables.inc(0, keys, np.full((8, 2), self.calls, dtype=np.float32))
            return ef.ClockStats(8, 0.0, 0)
        if clock == self.at:
            if self.fault == "raise":
                tables.inc(0, keys, np.ones((8, 2), dtype=np.float32))
                raise RuntimeError("boom")
            if self.fault == "dtype":
                tables.inc(0, keys, np.ones((8, 2), dtype=np.float64))
            if self.fault == "shape":
                tables.inc(0, keys, np.ones((8, 3), dtype=np.float32))
            if self.fault == "key":
                tables.get(0, np.array([99], dtype=np.uint64))
            if self.fault == "nan":
                d = np.zeros((8, 2), dtype=np.float32); d[5, 1] = np.nan
                tables.inc(0, keys, d)
            if self.fault == "stats":
                return 42
        tables.inc(0, keys, np.ones((8, 2), dtype=np.float32))
        return ef.ClockStats(8, 0.0, 0)
"#;

fn write_broken() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("ebbflow-broken-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("broken_app.py"), BROKEN).unwrap();
    dir
}

#[test]
fn bad_apps_fail_to_load_with_a_message_that_names_what_is_wrong() {
    need_python!();
    let dir = write_broken();
    let path = [dir];
    let cases = [
        ("broken_app", None, "must be `module:Class`"),
        ("no_such_module:App", None, "no_such_module"),
        ("broken_app:Missing", None, "Missing"),
        ("broken_app:NoHooks", None, "no `worker` method"),
        ("broken_app:BadTables", None, "width 0"),
        ("broken_app:App", Some("[1, 2]"), "one JSON object"),
        ("broken_app:App", Some(r#"{"colour": 1}"#), "colour"),
    ];
    for (entry, args, expected) in cases {
        let error = PyApp::load(entry, args, &path).unwrap_err().to_string();
        assert!(error.contains(expected), "{entry}: {error}");
        if entry.contains(':') {
            assert!(error.contains(entry), "names the app: {error}");
        }
    }
}

#[test]
fn a_failing_hook_fails_the_run_naming_the_app_the_hook_and_the_clock() {
    need_python!();
    let dir = write_broken();
    let path = [dir];
    let cases = [
        ("raise", "RuntimeError: boom"),
        ("dtype", "float32"),
        ("shape", "shape (8, 2)"),
        ("key", "key 99 of table 0"),
        ("nan", "key 5 column 1 is NaN"),
        ("stats", "must return ebbflow.ClockStats"),
        ("worker", "cannot open my shard"),
        ("impure", "not a pure function of (shard, clock, rows read)"),
    ];
    for (fault, expected) in cases {
        let args = format!(r#"{{"fault": "{fault}", "at": 3}}"#);
        let app = PyApp::load("broken_app:App", Some(&args), &path).unwrap();
        let error = run_single_process(&app, &config(2, 10, 0), &RuntimeMetrics::unregistered())
            .unwrap_err();
        let RunError::Diverged(halt) = &error else {
            panic!("{fault}: not halted by the app: {error}");
        };
        assert_eq!(
            halt.cause,
            ebbflow_runtime::divergence::HaltCause::AppFailed,
            "{fault}"
        );
        let message = error.to_string();
        assert!(message.contains(expected), "{fault}: {message}");
        assert!(message.contains("app broken_app:App"), "{fault}: {message}");
        let clock = if ["worker", "impure"].contains(&fault) {
            0
        } else {
            3
        };
        assert!(
            message.contains(&format!("clock {clock}")),
            "{fault}: {message}"
        );
        assert_eq!(halt.clock, clock, "{fault}");
    }
    // A clean run of the same app: 10 clocks x 2 workers x 1.0 on every value.
    let app = PyApp::load("broken_app:App", None, &path).unwrap();
    let report =
        run_single_process(&app, &config(2, 10, 0), &RuntimeMetrics::unregistered()).unwrap();
    assert_eq!(report.eval.loss, 8.0 * 2.0 * 20.0);
}
