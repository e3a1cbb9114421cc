//! Launches a coordinator and node processes of the `ebbflow-runtime` binary on 127.0.0.1 and
//! collects the coordinator's run report (tests and benchmarks of multi-process mode).

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::local::{RunError, RunReport, validate_config};
use crate::worker::JobConfig;

/// What to launch.
#[derive(Debug, Clone)]
pub struct ClusterSpec {
    /// Path of the `ebbflow-runtime` binary.
    pub binary: PathBuf,
    /// Node processes.
    pub nodes: Vec<NodeSpec>,
    /// App selection arguments passed to every process (e.g. `--app exact --exact-rows 64`).
    pub app_args: Vec<String>,
    /// Directory for the report file.
    pub work_dir: PathBuf,
    /// Kill everything if the job takes longer than this.
    pub timeout: Duration,
}

/// One node process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeSpec {
    /// Worker threads (0: a server-only node).
    pub workers: usize,
    /// Whether it hosts partitions (false: a worker-only node).
    pub serves: bool,
}

impl NodeSpec {
    /// `count` nodes that each serve partitions and run `workers` threads.
    pub fn uniform(count: usize, workers: usize) -> Vec<NodeSpec> {
        vec![
            NodeSpec {
                workers,
                serves: true
            };
            count
        ]
    }

    /// One server-only node and one worker-only node with `workers` threads (the topology of the
    /// "1 server process + 1 worker process" benchmark).
    pub fn split(workers: usize) -> Vec<NodeSpec> {
        vec![
            NodeSpec {
                workers: 0,
                serves: true,
            },
            NodeSpec {
                workers,
                serves: false,
            },
        ]
    }
}

/// Kills still-running children on drop (a failed launch leaves no strays).
struct Children(Vec<(String, Child)>);

impl Drop for Children {
    fn drop(&mut self) {
        for (_, child) in &mut self.0 {
            if matches!(child.try_wait(), Ok(None)) {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

fn failed(reason: String) -> RunError {
    RunError::RunCluster { reason }
}

/// Runs a job as one coordinator plus `spec.nodes` node processes; returns the coordinator's report.
pub fn run_cluster(spec: &ClusterSpec, config: &JobConfig) -> Result<RunReport, RunError> {
    validate_config(config)?;
    let secret = crate::node::random_secret();
    let report_path = spec.work_dir.join("run-report.json");
    let job_args = [
        "--clocks".to_owned(),
        config.clocks.to_string(),
        "--staleness".to_owned(),
        config.staleness.to_string(),
        "--partitions".to_owned(),
        config.partitions.to_string(),
        "--transport-security".to_owned(),
        config.transport_security.to_string(),
    ];
    let tls = config.transport_security == crate::tls::TransportSecurity::Tls;
    let mut coordinator = Command::new(&spec.binary)
        .arg("coordinator")
        .args(&job_args)
        .args(["--nodes", &spec.nodes.len().to_string(), "--report-out"])
        .arg(&report_path)
        .args(&spec.app_args)
        .env("EBBFLOW_JOB_SECRET", &secret)
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| {
            failed(format!(
                "spawning the coordinator {} failed: {e}",
                spec.binary.display()
            ))
        })?;
    let stdout = coordinator
        .stdout
        .take()
        .ok_or_else(|| failed("coordinator stdout missing".into()))?;
    let mut children = Children(vec![("coordinator".into(), coordinator)]);
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .map_err(|e| failed(format!("reading the coordinator address failed: {e}")))?;
    let addr = line
        .trim()
        .strip_prefix("listening on ")
        .ok_or_else(|| failed(format!("coordinator printed {line:?}")))?
        .to_owned();
    for (node, node_spec) in spec.nodes.iter().enumerate() {
        let mut command = Command::new(&spec.binary);
        command
            .arg("node")
            .args([
                "--coordinator",
                &format!("{}://{addr}", crate::admin::scheme(tls)),
                "--name",
                &format!("node-{node}"),
            ])
            .args([
                "--transport-security",
                &config.transport_security.to_string(),
            ])
            .args([
                "--workers",
                &node_spec.workers.to_string(),
                "--optimizer",
                &optimizer_arg(config),
            ]);
        if !node_spec.serves {
            command.arg("--no-serve");
        }
        let child = command
            .args(&spec.app_args)
            .env("EBBFLOW_JOB_SECRET", &secret)
            .spawn()
            .map_err(|e| failed(format!("spawning node {node} failed: {e}")))?;
        children.0.push((format!("node-{node}"), child));
    }
    let deadline = Instant::now() + spec.timeout;
    loop {
        let mut running = 0;
        for (name, child) in &mut children.0 {
            match child.try_wait() {
                Ok(Some(status)) if !status.success() => {
                    return Err(failed(format!("{name} exited with {status}")));
                }
                Ok(Some(_)) => {}
                Ok(None) => running += 1,
                Err(e) => return Err(failed(format!("waiting for {name} failed: {e}"))),
            }
        }
        if running == 0 {
            break;
        }
        if Instant::now() > deadline {
            return Err(failed(format!(
                "job did not finish within {:?}",
                spec.timeout
            )));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let bytes = std::fs::read(&report_path)
        .map_err(|e| failed(format!("reading {} failed: {e}", report_path.display())))?;
    serde_json::from_slice(&bytes)
        .map_err(|e| failed(format!("parsing {} failed: {e}", report_path.display())))
}

fn optimizer_arg(config: &JobConfig) -> String {
    use crate::optimizer::Optimizer;
    match config.optimizer {
        Optimizer::Add => "add".into(),
        Optimizer::Sgd { lr } => format!("sgd:{lr}"),
        Optimizer::Momentum { lr, momentum } => format!("momentum:{lr}:{momentum}"),
        Optimizer::AdaGrad { lr, eps } => format!("adagrad:{lr}:{eps}"),
    }
}
