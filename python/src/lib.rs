//! The ebbflow Python SDK: a Python model is one more app of the AgileML runtime.
//!
//! - [`PyApp`] adapts a user's class (`package.module:Class`) to the runtime's [`App`] contract,
//!   so every runner (one process, node processes, the elastic controller with its migrations
//!   and rollbacks) runs it unchanged.
//! - [`PythonApps`] adds `--app python --entry … --app-args …` to the runtime's command line
//!   ([`ebbflow_runtime::cli`]).
//! - The `ebbflow._core` extension module (built by maturin from this crate, `pip install
//!   ./python`) runs that command line inside the Python process, the interpreter released while
//!   Rust works: `python -m ebbflow runtime elastic-node --app python --entry mymodel:App …`.
//!
//! Rust programs that host Python themselves (the tests) call [`embed`] first.
//!
//! [`App`]: ebbflow_runtime::app::App

use std::ffi::OsString;
use std::path::PathBuf;

use ebbflow_runtime::cli::{AppTask, ExternalAppArgs, ExternalApps};
use ebbflow_runtime::local::run_single_process;
use ebbflow_runtime::metrics::RuntimeMetrics;
use ebbflow_runtime::worker::JobConfig;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;

mod app;
mod tables;

pub use app::{PyApp, PyAppError, PyWorker};
pub use tables::{Reader, Tables};

/// The `--app` name of Python apps.
pub const APP_NAME: &str = "python";

/// Directories put in front of Python's module path, from `EBBFLOW_PYTHON_PATH` (`:`-separated):
/// where a job's code lives when it is not installed.
pub fn python_path() -> Vec<PathBuf> {
    std::env::var_os("EBBFLOW_PYTHON_PATH")
        .map(|paths| std::env::split_paths(&paths).collect())
        .unwrap_or_default()
}

/// The runtime's command line with Python apps: `--app python --entry module:Class
/// [--app-args JSON]`.
#[derive(Debug, Clone, Copy, Default)]
pub struct PythonApps;

impl ExternalApps for PythonApps {
    fn has(&self, app: &str) -> bool {
        app == APP_NAME
    }

    fn run<T: AppTask>(&self, args: ExternalAppArgs<'_>, task: T) -> anyhow::Result<()> {
        let entry = args
            .entry
            .ok_or_else(|| anyhow::anyhow!("--app python needs --entry module:Class"))?;
        let app = PyApp::load(entry, args.args, &python_path())?;
        task.run(app)
    }
}

/// Starts an interpreter in this process (a Rust program hosting Python apps), once, and makes
/// this crate's module importable as `ebbflow._core` as the wheel does; a no-op inside Python.
pub fn embed() -> PyResult<()> {
    Python::initialize();
    Python::attach(|py| {
        let modules = py.import("sys")?.getattr("modules")?;
        if modules.contains("ebbflow._core")? {
            return Ok(());
        }
        // A host started inside a virtualenv (VIRTUAL_ENV) sees its packages, as `python` would.
        if let Some(venv) = std::env::var_os("VIRTUAL_ENV") {
            let site = py.import("site")?;
            let version = py.version_info();
            let dir = std::path::Path::new(&venv).join(format!(
                "lib/python{}.{}/site-packages",
                version.major, version.minor
            ));
            site.call_method1("addsitedir", (dir.display().to_string(),))?;
        }
        let module = PyModule::new(py, "_core")?;
        _core(&module)?;
        modules.set_item("ebbflow._core", module)
    })
}

/// Sets `name` in Python's `os.environ` (and so in the process environment its children see):
/// how a host hands an app settings such as `EBBFLOW_DATASET` without touching the environment
/// from Rust while threads run.
pub fn set_env(name: &str, value: &str) -> PyResult<()> {
    Python::attach(|py| py.import("os")?.getattr("environ")?.set_item(name, value))
}

/// `_core.main(argv)`: the runtime's command line (`argv[0]` is the program name).
#[pyfunction]
fn main(py: Python<'_>, argv: Vec<String>) -> PyResult<()> {
    let argv: Vec<OsString> = argv.into_iter().map(OsString::from).collect();
    py.detach(|| ebbflow_runtime::cli::main_with(argv, &PythonApps))
        .map_err(|e| PyRuntimeError::new_err(format!("{e:#}")))
}

/// `_core.run_local(entry, app_args=None, workers=1, clocks=10, staleness=0, partitions=4,
/// optimizer="add")`: trains the app in this process (server and worker threads, no TCP) and
/// returns the run report as JSON.
#[pyfunction]
#[pyo3(signature = (entry, app_args=None, workers=1, clocks=10, staleness=0, partitions=4, optimizer="add"))]
#[allow(clippy::too_many_arguments)]
fn run_local(
    py: Python<'_>,
    entry: &str,
    app_args: Option<&str>,
    workers: usize,
    clocks: u64,
    staleness: u64,
    partitions: u32,
    optimizer: &str,
) -> PyResult<String> {
    let optimizer =
        ebbflow_runtime::cli::parse_optimizer(optimizer).map_err(PyValueError::new_err)?;
    let app = PyApp::load(entry, app_args, &python_path())
        .map_err(|e| PyValueError::new_err(e.to_string()))?;
    let config = JobConfig {
        clocks,
        staleness,
        workers,
        partitions,
        optimizer,
        ..JobConfig::default()
    };
    let report = py
        .detach(|| run_single_process(&app, &config, &RuntimeMetrics::unregistered()))
        .map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
    serde_json::to_string(&report).map_err(|e| PyRuntimeError::new_err(e.to_string()))
}

/// The `ebbflow._core` extension module.
#[pymodule]
fn _core(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_function(wrap_pyfunction!(main, module)?)?;
    module.add_function(wrap_pyfunction!(run_local, module)?)?;
    module.add_class::<Tables>()?;
    module.add_class::<Reader>()?;
    Ok(())
}
