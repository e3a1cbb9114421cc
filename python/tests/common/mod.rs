//! Shared set-up of the Python SDK's tests: an interpreter embedded in the test process that
//! imports the SDK (`python/ebbflow`), the examples (`examples/python`) and the test venv's
//! packages (numpy, torch: `EBBFLOW_PYTHON`, set by scripts/test.sh).

#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

use pyo3::prelude::*;

/// The repository root.
pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The test venv's Python: `EBBFLOW_PYTHON`, else the cached venv scripts/setup-python.sh makes.
pub fn venv_python() -> Option<PathBuf> {
    if let Some(python) = std::env::var_os("EBBFLOW_PYTHON") {
        return Some(PathBuf::from(python));
    }
    let home = std::env::var_os("HOME")?;
    let cached = PathBuf::from(home).join(".cache/ebbflow/venv/bin/python");
    cached.exists().then_some(cached)
}

/// Starts the interpreter with the SDK, the examples and the venv's packages importable; `Err`
/// says why Python tests cannot run here (no venv with numpy).
pub fn python() -> Result<(), String> {
    static READY: OnceLock<Result<(), String>> = OnceLock::new();
    READY
        .get_or_init(|| {
            let venv = venv_python().ok_or(
                "no Python venv: run scripts/setup-python.sh or set EBBFLOW_PYTHON".to_string(),
            )?;
            let output = Command::new(&venv)
                .args(["-c", "import site; print(site.getsitepackages()[0])"])
                .output()
                .map_err(|e| format!("{}: {e}", venv.display()))?;
            let site = String::from_utf8_lossy(&output.stdout).trim().to_owned();
            ebbflow_python::embed().map_err(|e| e.to_string())?;
            Python::attach(|py| -> PyResult<()> {
                let path = py.import("sys")?.getattr("path")?;
                for dir in [
                    repo().join("python"),
                    repo().join("examples/python"),
                    PathBuf::from(&site),
                ] {
                    path.call_method1("insert", (0, dir.display().to_string()))?;
                }
                py.import("numpy")?;
                Ok(())
            })
            .map_err(|e| format!("the embedded interpreter cannot import numpy: {e}"))
        })
        .clone()
}

/// Skips the calling test (prints why) when Python is not set up.
#[macro_export]
macro_rules! need_python {
    () => {
        if let Err(why) = common::python() {
            println!("skipped: {why}");
            return;
        }
    };
}
