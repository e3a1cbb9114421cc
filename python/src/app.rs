//! [`PyApp`]: a Python model as one more [`App`] of the runtime.
//!
//! The user's class (found by an entry `package.module:Class`) implements the same hooks as a
//! Rust app: `tables()`, `worker(shard, num_shards)`, `evaluate(reader)` and optionally
//! `clocks_per_pass(workers)`; its workers implement `working_set()` and `clock(tables, clock)`.
//! The runtime keeps the loop: it calls `clock` once per clock, turns the rows the worker changed
//! into deltas, and moves, copies and rolls back the tables between clocks, in Rust, with the
//! interpreter released. Python sees only `clock` called again, possibly in another process, or
//! with an earlier clock after a rollback.
//!
//! Every hook runs with the interpreter attached; nothing else does. A hook that raises or returns
//! the wrong thing fails the run with a message naming the app, the hook and the clock
//! ([`AppWorker::failure`]); the failed clock's partial writes are discarded.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use ebbflow_runtime::app::{
    App, AppWorker, ClockStats, EvalReport, RowCache, RowInit, TableId, TableReader, TableSpec,
    WorkingSet, validate_tables,
};
use numpy::{PyReadonlyArray1, PyUntypedArrayMethods};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};
use thiserror::Error;

use crate::tables::{Reader, Tables};

/// Errors loading a Python app.
#[derive(Debug, Error)]
pub enum PyAppError {
    /// The entry is not `module:Class`.
    #[error("app entry {entry:?} must be `module:Class` (e.g. `mf_numpy:App`)")]
    Entry {
        /// The entry given.
        entry: String,
    },
    /// The app's arguments are not a JSON object.
    #[error("app {entry}: the arguments must be one JSON object: {reason}")]
    Args {
        /// The app.
        entry: String,
        /// What was wrong.
        reason: String,
    },
    /// Importing, constructing or asking the app for its tables failed.
    #[error("app {entry}: {step} failed: {reason}")]
    Load {
        /// The app.
        entry: String,
        /// What was being done (`import`, `App(**args)`, `tables()`).
        step: &'static str,
        /// The Python error or what was wrong with the result.
        reason: String,
    },
}

impl PyAppError {
    /// Static label for metrics.
    pub fn category(&self) -> &'static str {
        match self {
            PyAppError::Entry { .. } => "entry",
            PyAppError::Args { .. } => "args",
            PyAppError::Load { .. } => "load",
        }
    }
}

/// Hooks every app class must have.
const APP_HOOKS: [&str; 3] = ["tables", "worker", "evaluate"];
/// Hooks every worker must have.
const WORKER_HOOKS: [&str; 2] = ["working_set", "clock"];

/// A Python app (see the module docs). Cheap to clone: clones share the Python object.
#[derive(Debug, Clone)]
pub struct PyApp {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    entry: String,
    object: Py<PyAny>,
    specs: Vec<TableSpec>,
    /// Result of the optional `clocks_per_pass` hook, by worker count (asked once each).
    clocks_per_pass: Mutex<Vec<(usize, usize)>>,
}

/// Formats a Python exception with its traceback's last line.
pub(crate) fn describe(py: Python<'_>, error: &PyErr) -> String {
    let mut text = error.to_string();
    if let Some(traceback) = error.traceback(py)
        && let Ok(formatted) = traceback.format()
        && let Some(last) = formatted
            .lines()
            .rev()
            .find(|l| l.trim_start().starts_with("File"))
    {
        text.push_str(&format!(" ({})", last.trim()));
    }
    text
}

impl PyApp {
    /// Imports `entry` (`module:Class`, with `path` put in front of `sys.path`), builds
    /// `Class(**args)` and reads its tables.
    pub fn load(entry: &str, args: Option<&str>, path: &[PathBuf]) -> Result<Self, PyAppError> {
        let Some((module, class)) = entry
            .split_once(':')
            .filter(|(m, c)| !m.is_empty() && !c.is_empty())
        else {
            return Err(PyAppError::Entry {
                entry: entry.into(),
            });
        };
        let args_json: serde_json::Value = match args {
            None => serde_json::Value::Object(Default::default()),
            Some(text) => serde_json::from_str(text).map_err(|e| PyAppError::Args {
                entry: entry.into(),
                reason: e.to_string(),
            })?,
        };
        if !args_json.is_object() {
            return Err(PyAppError::Args {
                entry: entry.into(),
                reason: format!("got {args_json}"),
            });
        }
        let load = |step: &'static str, reason: String| PyAppError::Load {
            entry: entry.into(),
            step,
            reason,
        };
        Python::attach(|py| {
            let sys_path = py
                .import("sys")
                .and_then(|sys| sys.getattr("path"))
                .map_err(|e| load("import", describe(py, &e)))?;
            let sys_path = sys_path
                .cast_into::<PyList>()
                .map_err(|e| load("import", e.to_string()))?;
            for dir in path.iter().rev() {
                let dir = dir.display().to_string();
                if !sys_path
                    .iter()
                    .any(|p| p.extract::<String>().ok() == Some(dir.clone()))
                {
                    sys_path
                        .insert(0, dir)
                        .map_err(|e| load("import", describe(py, &e)))?;
                }
            }
            let module = py
                .import(module)
                .map_err(|e| load("import", describe(py, &e)))?;
            let class = module
                .getattr(class)
                .map_err(|e| load("import", describe(py, &e)))?;
            let kwargs = py
                .import("json")
                .and_then(|json| json.call_method1("loads", (args_json.to_string(),)))
                .and_then(|value| value.cast_into::<PyDict>().map_err(PyErr::from))
                .map_err(|e| load("App(**args)", describe(py, &e)))?;
            let object = class
                .call((), Some(&kwargs))
                .map_err(|e| load("App(**args)", describe(py, &e)))?;
            for hook in APP_HOOKS {
                if !object.hasattr(hook).unwrap_or(false) {
                    return Err(load(
                        "App(**args)",
                        format!("the app has no `{hook}` method (an app needs {APP_HOOKS:?})"),
                    ));
                }
            }
            let declared = object
                .call_method0("tables")
                .map_err(|e| load("tables()", describe(py, &e)))?;
            let specs = table_specs(&declared).map_err(|reason| load("tables()", reason))?;
            validate_tables(&specs).map_err(|e| load("tables()", e.to_string()))?;
            if specs.is_empty() {
                return Err(load("tables()", "the app declares no table".into()));
            }
            Ok(Self {
                inner: Arc::new(Inner {
                    entry: entry.to_owned(),
                    object: object.unbind(),
                    specs,
                    clocks_per_pass: Mutex::new(Vec::new()),
                }),
            })
        })
    }

    /// The entry it was loaded from.
    pub fn entry(&self) -> &str {
        &self.inner.entry
    }
}

/// Reads the list `tables()` returned: objects with `id`, `name`, `width` and `init` (an object
/// with `kind` = `zeros`, `uniform` (`low`, `high`, `seed`) or `normal` (`std`, `seed`)).
fn table_specs(declared: &Bound<'_, PyAny>) -> Result<Vec<TableSpec>, String> {
    let mut specs = Vec::new();
    let items = declared
        .try_iter()
        .map_err(|_| "tables() must return a list of ebbflow.Table".to_string())?;
    for (index, item) in items.enumerate() {
        let item = item.map_err(|e| e.to_string())?;
        let field = |name: &str| {
            item.getattr(name)
                .map_err(|_| format!("table {index}: no `{name}` (use ebbflow.Table)"))
        };
        let id: TableId = field("id")?
            .extract()
            .map_err(|_| format!("table {index}: `id` must be an integer from 0 to 2^32-1"))?;
        let name: String = field("name")?
            .extract()
            .map_err(|_| format!("table {id}: `name` must be a string"))?;
        let width: usize = field("width")?
            .extract()
            .map_err(|_| format!("table {id}: `width` must be a positive integer"))?;
        let init = field("init")?;
        let kind: String = init
            .getattr("kind")
            .and_then(|k| k.extract())
            .map_err(|_| format!("table {id}: `init` must be ebbflow.Zeros, Uniform or Normal"))?;
        let number = |name: &str| -> Result<f64, String> {
            init.getattr(name)
                .and_then(|v| v.extract::<f64>())
                .ok()
                .filter(|v| v.is_finite())
                .ok_or_else(|| format!("table {id}: init `{name}` must be a finite number"))
        };
        let seed = || -> Result<u64, String> {
            init.getattr("seed")
                .and_then(|v| v.extract::<u64>())
                .map_err(|_| format!("table {id}: init `seed` must be a non-negative integer"))
        };
        let init = match kind.as_str() {
            "zeros" => RowInit::Zeros,
            "uniform" => RowInit::Uniform {
                low: number("low")? as f32,
                high: number("high")? as f32,
                seed: seed()?,
            },
            "normal" => RowInit::Normal {
                std: number("std")? as f32,
                seed: seed()?,
            },
            other => {
                return Err(format!(
                    "table {id}: unknown init kind {other:?} (zeros, uniform or normal)"
                ));
            }
        };
        specs.push(TableSpec {
            id,
            name,
            width,
            init,
        });
    }
    Ok(specs)
}

/// Reads a 1-D array (or sequence) of non-negative integer keys.
pub(crate) fn keys_from(value: &Bound<'_, PyAny>) -> Result<Vec<u64>, String> {
    if let Ok(array) = value.extract::<PyReadonlyArray1<'_, u64>>() {
        return Ok(array.as_array().to_vec());
    }
    if let Ok(array) = value.extract::<PyReadonlyArray1<'_, i64>>() {
        return array
            .as_array()
            .iter()
            .map(|&k| u64::try_from(k).map_err(|_| format!("key {k} is negative")))
            .collect();
    }
    if let Ok(array) = value.cast::<numpy::PyUntypedArray>() {
        return Err(format!(
            "keys must be a 1-D array of integers (uint64 or int64), got {}-D {}",
            array.ndim(),
            array.dtype()
        ));
    }
    value
        .extract::<Vec<u64>>()
        .map_err(|_| "keys must be a 1-D array or list of non-negative integers".to_string())
}

/// Reads what `clock` returned: an object with `updates`, `loss_sum`, `loss_count` (such as
/// `ebbflow.ClockStats`), or a 3-tuple of them.
fn clock_stats(value: &Bound<'_, PyAny>) -> Result<ClockStats, String> {
    let wrong = || {
        format!(
            "clock() must return ebbflow.ClockStats(updates, loss_sum, loss_count), got {}",
            value
                .get_type()
                .name()
                .map_or_else(|_| "?".into(), |n| n.to_string())
        )
    };
    if let Ok(tuple) = value.cast::<PyTuple>() {
        let (updates, loss_sum, loss_count): (u64, f64, u64) =
            tuple.extract().map_err(|_| wrong())?;
        return Ok(ClockStats {
            updates,
            loss_sum,
            loss_count,
        });
    }
    let field = |name: &str| value.getattr(name).map_err(|_| wrong());
    Ok(ClockStats {
        updates: field("updates")?.extract().map_err(|_| wrong())?,
        loss_sum: field("loss_sum")?.extract().map_err(|_| wrong())?,
        loss_count: field("loss_count")?.extract().map_err(|_| wrong())?,
    })
}

impl App for PyApp {
    type Worker = PyWorker;

    fn tables(&self) -> Vec<TableSpec> {
        self.inner.specs.clone()
    }

    fn worker(&self, shard: usize, num_shards: usize) -> PyWorker {
        let mut worker = PyWorker {
            entry: self.inner.entry.clone(),
            shard,
            object: None,
            specs: self.inner.specs.clone(),
            working_set: WorkingSet::new(),
            failure: None,
            reported: false,
            checked: false,
        };
        Python::attach(|py| {
            let built = self
                .inner
                .object
                .call_method1(py, "worker", (shard, num_shards))
                .map_err(|e| describe(py, &e))
                .and_then(|object| {
                    let bound = object.bind(py);
                    match WORKER_HOOKS
                        .iter()
                        .find(|h| !bound.hasattr(**h).unwrap_or(false))
                    {
                        Some(hook) => Err(format!(
                            "the worker has no `{hook}` method (a worker needs {WORKER_HOOKS:?})"
                        )),
                        None => Ok(object),
                    }
                });
            match built {
                Ok(object) => {
                    // Asked once, here: `AppWorker::working_set` cannot fail, so a failure is
                    // kept and reported at the first clock.
                    match read_working_set(py, &object, &worker.specs) {
                        Ok(sets) => {
                            for (table, keys) in sets {
                                worker.working_set.add_keys(table, keys);
                            }
                        }
                        Err(reason) => worker.fail("working_set()", reason),
                    }
                    worker.object = Some(object);
                }
                Err(reason) => {
                    worker.failure = Some(format!(
                        "app {}: hook worker({shard}, {num_shards}) failed: {reason}",
                        worker.entry
                    ));
                }
            }
        });
        worker
    }

    fn evaluate(&self, tables: &dyn TableReader) -> EvalReport {
        let reader = Reader::snapshot(&self.inner.specs, tables);
        Python::attach(|py| {
            let result = Py::new(py, reader)
                .and_then(|reader| self.inner.object.call_method1(py, "evaluate", (reader,)));
            let failed = |reason: String| {
                tracing::error!(app = %self.inner.entry, %reason, "hook evaluate() failed");
                EvalReport {
                    loss: f64::NAN,
                    metrics: vec![("evaluate_failed".into(), f64::NAN)],
                }
            };
            match result {
                Err(error) => failed(describe(py, &error)),
                Ok(value) => match eval_report(value.bind(py)) {
                    Ok(report) => report,
                    Err(reason) => failed(reason),
                },
            }
        })
    }

    fn set_num_workers(&self, num_workers: usize) {
        Python::attach(|py| {
            let object = self.inner.object.bind(py);
            if object.hasattr("set_num_workers").unwrap_or(false)
                && let Err(error) = object.call_method1("set_num_workers", (num_workers,))
            {
                let reason = describe(py, &error);
                tracing::error!(app = %self.inner.entry, %reason, "hook set_num_workers() failed");
            }
        });
    }

    fn clocks_per_pass(&self, workers: usize) -> usize {
        let mut known = self
            .inner
            .clocks_per_pass
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some((_, clocks)) = known.iter().find(|(w, _)| *w == workers) {
            return *clocks;
        }
        let clocks = Python::attach(|py| {
            let object = self.inner.object.bind(py);
            if !object.hasattr("clocks_per_pass").unwrap_or(false) {
                return 1;
            }
            object
                .call_method1("clocks_per_pass", (workers,))
                .and_then(|v| v.extract::<usize>())
                .map_or(1, |c| c.max(1))
        });
        known.push((workers, clocks));
        clocks
    }
}

/// Reads what `evaluate` returned: a dict with a float `loss` and any further float metrics.
fn eval_report(value: &Bound<'_, PyAny>) -> Result<EvalReport, String> {
    let dict = value
        .cast::<PyDict>()
        .map_err(|_| "evaluate() must return a dict such as {\"loss\": 0.9}".to_string())?;
    let mut loss = None;
    let mut metrics = Vec::new();
    for (key, value) in dict.iter() {
        let name: String = key
            .extract()
            .map_err(|_| "evaluate(): metric names must be strings".to_string())?;
        let value: f64 = value
            .extract()
            .map_err(|_| format!("evaluate(): metric {name:?} must be a number"))?;
        if name == "loss" {
            loss = Some(value);
        } else {
            metrics.push((name, value));
        }
    }
    let loss = loss.ok_or_else(|| "evaluate() must return a \"loss\"".to_string())?;
    Ok(EvalReport { loss, metrics })
}

/// One worker of a [`PyApp`]: the Python worker object for one shard.
#[derive(Debug)]
pub struct PyWorker {
    entry: String,
    shard: usize,
    /// `None` when building it failed (`failure` says why).
    object: Option<Py<PyAny>>,
    specs: Vec<TableSpec>,
    /// What `working_set()` returned, read once when the worker was built.
    working_set: WorkingSet,
    failure: Option<String>,
    /// Whether the runtime has been told of `failure` (it is reported once, at its clock; the
    /// worker then does nothing until the run stops).
    reported: bool,
    /// Whether the first clock ran twice to check the rule (see [`AppWorker::clock`]).
    checked: bool,
}

impl PyWorker {
    fn fail(&mut self, hook: &str, reason: String) {
        if self.failure.is_none() {
            self.failure = Some(format!(
                "app {}: hook {hook} of shard {} failed: {reason}",
                self.entry, self.shard
            ));
        }
    }
}

impl AppWorker for PyWorker {
    fn working_set(&self) -> WorkingSet {
        self.working_set.clone()
    }

    fn bind(&mut self, cache: &RowCache) {
        let Some(object) = &self.object else {
            return;
        };
        // The optional `bind(tables)` hook: where a worker looks its slots up once. It gets a
        // copy of the cache, so it cannot change what the first clock reads.
        let bound = Python::attach(|py| -> Result<(), String> {
            let worker = object.bind(py);
            if !worker.hasattr("bind").unwrap_or(false) {
                return Ok(());
            }
            let tables = Py::new(py, Tables::lend(cache.clone(), &self.specs))
                .map_err(|e| describe(py, &e))?;
            let result = worker
                .call_method1("bind", (tables.clone_ref(py),))
                .map(|_| ())
                .map_err(|e| describe(py, &e));
            let _ = tables.borrow_mut(py).take_back(py);
            result
        });
        if let Err(reason) = bound {
            self.fail("bind(tables)", reason);
        }
    }

    fn clock(&mut self, cache: &mut RowCache, clock: u64) -> ClockStats {
        if self.failure.is_some() || self.object.is_none() {
            return ClockStats::default();
        }
        if !self.checked {
            // The rule, checked on the worker's first clock: the same clock on the same rows
            // must write the same values (a worker that keeps learned state, counts its calls
            // or draws unseeded randomness does not), or rollback and migration would not
            // redo it exactly.
            self.checked = true;
            let mut twin = cache.clone();
            let first = self.call_clock(&mut twin, clock);
            let second = self.call_clock(cache, clock);
            return match (first, second) {
                (Ok(_), Ok(stats)) => match first_difference(&twin, cache) {
                    None => stats,
                    Some((table, key, a, b)) => {
                        cache.discard_changes();
                        self.fail(
                            &format!("clock(tables, {clock})"),
                            format!(
                                "it is not a pure function of (shard, clock, rows read): called \
                                 twice on the same rows it wrote {a} then {b} to table {table} \
                                 key {key}; keep learned state in tables and seed randomness \
                                 from (shard, clock) (docs/python.md)"
                            ),
                        );
                        ClockStats::default()
                    }
                },
                (Err(reason), _) | (_, Err(reason)) => {
                    cache.discard_changes();
                    self.fail(&format!("clock(tables, {clock})"), reason);
                    ClockStats::default()
                }
            };
        }
        match self.call_clock(cache, clock) {
            Ok(stats) => stats,
            Err(reason) => {
                cache.discard_changes();
                self.fail(&format!("clock(tables, {clock})"), reason);
                ClockStats::default()
            }
        }
    }

    fn failure(&mut self) -> Option<String> {
        if self.reported {
            return None;
        }
        self.reported = self.failure.is_some();
        self.failure.clone()
    }
}

impl PyWorker {
    /// Lends `cache` to Python's `clock` and takes it back with what the clock wrote.
    fn call_clock(&self, cache: &mut RowCache, clock: u64) -> Result<ClockStats, String> {
        let Some(object) = &self.object else {
            return Ok(ClockStats::default());
        };
        let lent = std::mem::replace(cache, RowCache::empty());
        let (returned, result) = Python::attach(|py| {
            let tables = match Py::new(py, Tables::lend(lent, &self.specs)) {
                Ok(tables) => tables,
                Err(error) => unreachable!("allocating the tables object failed: {error}"),
            };
            let result = object
                .call_method1(py, "clock", (tables.clone_ref(py), clock))
                .map_err(|e| describe(py, &e))
                .and_then(|value| clock_stats(value.bind(py)));
            let (cache, copied) = tables.borrow_mut(py).take_back(py);
            (cache, result.and_then(|stats| copied.map(|()| stats)))
        });
        *cache = returned;
        result
    }
}

/// The first value two caches of the same rows disagree on, beyond float noise (a GPU's
/// reductions may round differently from one call to the next): table, key, the two values.
fn first_difference(a: &RowCache, b: &RowCache) -> Option<(TableId, u64, f32, f32)> {
    for table in a.table_ids() {
        for slot in 0..a.len(table) as u32 {
            let (x, y) = (a.row(table, slot), b.row(table, slot));
            for (&u, &v) in x.iter().zip(y) {
                let same = u.to_bits() == v.to_bits()
                    || (u - v).abs() <= 1e-5 * u.abs().max(v.abs()).max(1.0);
                if !same {
                    return Some((table, a.key(table, slot), u, v));
                }
            }
        }
    }
    None
}

/// Calls `working_set()` and checks its tables and keys.
fn read_working_set(
    py: Python<'_>,
    object: &Py<PyAny>,
    specs: &[TableSpec],
) -> Result<Vec<(TableId, Vec<u64>)>, String> {
    let value = object
        .call_method0(py, "working_set")
        .map_err(|e| describe(py, &e))?;
    let dict = value
        .bind(py)
        .cast::<PyDict>()
        .map_err(|_| "working_set() must return a dict {table id: keys}".to_string())?
        .clone();
    let mut sets = Vec::new();
    for (table, keys) in dict.iter() {
        let table: TableId = table
            .extract()
            .map_err(|_| "working_set(): table ids must be integers".to_string())?;
        if !specs.iter().any(|s| s.id == table) {
            return Err(format!(
                "working_set() names table {table}, which tables() does not declare"
            ));
        }
        let keys = keys_from(&keys).map_err(|e| format!("working_set() table {table}: {e}"))?;
        sets.push((table, keys));
    }
    Ok(sets)
}
