//! A local moto EC2 server for integration tests of this crate and its callers: `moto/launch.py`
//! (moto 5.2.5 from the test venv) serving spot prices from a trace file, since moto's own
//! price history is a constant.
//!
//! The launcher prints its endpoint (`http://127.0.0.1:<port>`, bound to port 0) on its first
//! stdout line and exits when its stdin closes, so a server never outlives the process that
//! started it; dropping a [`MotoServer`] kills it at once.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use crate::{Ec2Config, SdkEc2};

/// How long moto may take to start (imports are slow on a busy 2-core machine).
pub const START_DEADLINE: Duration = Duration::from_secs(120);

/// The launcher script shipped with this crate.
pub fn launcher() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("moto/launch.py")
}

/// File name of the shared p3.2xlarge 9-zone availability and price trace.
pub const P3_TRACE: &str = "aws_p3.2xlarge_availability_price_9az_2023-02-15_to_03-09.csv";

/// The shared spot data: `EBBFLOW_SPOT_DATA`, else `../shared/data/spot` beside the repository.
pub fn spot_data_dir() -> PathBuf {
    std::env::var_os("EBBFLOW_SPOT_DATA").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/data/spot"),
        PathBuf::from,
    )
}

/// The shared p3.2xlarge trace ([`P3_TRACE`] in [`spot_data_dir`]).
pub fn p3_trace() -> PathBuf {
    spot_data_dir().join(P3_TRACE)
}

/// A running moto server, killed on drop.
pub struct MotoServer {
    child: Child,
    /// Held open: the launcher exits when its stdin closes.
    _stdin: ChildStdin,
    endpoint: String,
}

impl MotoServer {
    /// For tests: a server serving `trace` with the Python in `EBBFLOW_PYTHON`, or `None` after
    /// saying on stderr that `test` is skipped when that is unset. Panics if the server does not
    /// start: a configured Python that cannot serve is a failure, not a skip.
    pub fn for_test(test: &str, trace: &Path) -> Option<Self> {
        let Some(python) = std::env::var_os("EBBFLOW_PYTHON") else {
            eprintln!("{test}: skipped: set EBBFLOW_PYTHON (scripts/setup-python.sh)");
            return None;
        };
        Some(Self::start(Path::new(&python), trace).unwrap_or_else(|e| panic!("{test}: {e}")))
    }

    /// Starts the launcher with `python` (a Python with `moto[server,ec2]`), serving `trace`.
    /// Waits for the endpoint with [`START_DEADLINE`], never a fixed sleep.
    pub fn start(python: &Path, trace: &Path) -> Result<Self, String> {
        if !trace.is_file() {
            return Err(format!("spot trace missing: {}", trace.display()));
        }
        let mut child = Command::new(python)
            .arg(launcher())
            .arg("--trace")
            .arg(trace)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("start moto launcher with {}: {e}", python.display()))?;
        let stdin = child.stdin.take().ok_or("launcher stdin")?;
        let stdout = child.stdout.take().ok_or("launcher stdout")?;
        let (sender, receiver) = mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let read = BufReader::new(stdout).read_line(&mut line).map(|_| line);
            let _ = sender.send(read);
        });
        match receiver.recv_timeout(START_DEADLINE) {
            Ok(Ok(line)) if line.starts_with("http://") => Ok(Self {
                child,
                _stdin: stdin,
                endpoint: line.trim().to_owned(),
            }),
            other => {
                let _ = child.kill();
                let status = child.wait();
                Err(format!(
                    "moto launcher did not report an endpoint: {other:?}, exit {status:?}"
                ))
            }
        }
    }

    /// `http://127.0.0.1:<port>`.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Connection settings for this server in `region`: dummy credentials, one attempt per call.
    pub fn config(&self, region: &str) -> Ec2Config {
        let mut config = Ec2Config::emulator(region, &self.endpoint);
        config.max_attempts = 1;
        config.operation_timeout = Duration::from_secs(30);
        config
    }

    /// A client of this server in `region`.
    pub async fn client(&self, region: &str) -> SdkEc2 {
        SdkEc2::connect(&self.config(region)).await
    }
}

impl Drop for MotoServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
