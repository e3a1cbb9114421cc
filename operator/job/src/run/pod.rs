//! `ebbflow pod`: the process of one runtime pod the operator creates
//! (`controller::plan::build_pod`), configured entirely by the pod's environment.
//!
//! - `EBBFLOW_ROLE=coordinator` (reliable pod 0): serves the job's admin API (`/join`, `/status`,
//!   `/notice`, `/stop`) on `EBBFLOW_ADMIN_PORT`, trains the job elastically over the nodes that
//!   join, and runs one reliable node itself; its metrics (the coordinator's and its node's,
//!   `process="node"`) are on `EBBFLOW_METRICS_PORT` too. When training ends it keeps serving the final
//!   status (`done`, or `stopped` after `/stop`, with the result) until SIGTERM, so the operator
//!   reads the outcome before it deletes the job's pods; then it prints the run's report as one
//!   JSON line and exits.
//! - `EBBFLOW_ROLE=reliable` / `transient`: one elastic node. It binds its data plane on
//!   `EBBFLOW_POD_IP:EBBFLOW_DATA_PORT`, joins the coordinator at `EBBFLOW_COORDINATOR`, and
//!   treats SIGTERM as a notice with the pod's termination grace period, and serves its metrics
//!   (`/metrics`) on `EBBFLOW_METRICS_PORT`. Released at the job's
//!   end, it waits for SIGTERM (a pod that exited would be replaced before the operator saw the
//!   end); one that left on a notice has had its SIGTERM and exits.
//!
//! Every process of a job reads the same spec (`EBBFLOW_JOB_SPEC`, JSON: the spec pinned in the
//! job's Secret while any of its pods exist, `controller::plan::pinned_spec`) and job name
//! (`EBBFLOW_JOB_NAME`), validates it as a manifest would be, and derives the same job id from
//! them; the job secret is `EBBFLOW_TOKEN` (the job's Secret); datasets are read under
//! `EBBFLOW_DATA_DIR` (default `/data`, where the plan mounts `spec.app.dataset.claimName`).
//! `EBBFLOW_METADATA_ENDPOINT`, if set, is the EC2 instance metadata service a node polls for
//! interruption notices. `EBBFLOW_CHECKPOINT` (with `EBBFLOW_CHECKPOINT_INTERVAL_SECONDS`,
//! default 60), on the coordinator pod, is its checkpoint file: written as training goes, and
//! resumed from when the pod is replaced (`spec.runtime.checkpoint`).

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use ebbflow_crds::TrainingJob;
use ebbflow_runtime::elastic_coordinator::{CheckpointSettings, ElasticJob, run_elastic_job};
use ebbflow_runtime::elastic_node::{ElasticNodeSettings, NoticeSources, run_elastic_node};
use ebbflow_runtime::metrics::RuntimeMetrics;
use ebbflow_runtime::tls::TransportSecurity;
use prometheus::Registry;

use super::{DataDir, JobApp, RunError, build_app, elastic_config, job_id, with_job_app};

/// Port of a runtime pod's Prometheus `/metrics`, and nothing else (the operator's per-job
/// NetworkPolicy opens it to any scraper); where pods created before `EBBFLOW_METRICS_PORT`
/// existed serve.
pub const METRICS_PORT: u16 = 7072;

/// Time between checkpoint writes when `spec.runtime.checkpoint.interval` is not set.
pub const DEFAULT_CHECKPOINT_INTERVAL: std::time::Duration = std::time::Duration::from_secs(60);

/// Termination grace period when the spec sets none: EC2's spot notice.
pub const DEFAULT_GRACE_SECONDS: i64 = crate::EC2_NOTICE.as_secs() as i64;

/// What a runtime pod does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PodRole {
    /// Reliable pod 0: the coordinator and a reliable node.
    Coordinator,
    /// Another reliable (on-demand) node.
    Reliable,
    /// A transient (spot) node.
    Transient,
}

/// A runtime pod's settings, read from its environment.
#[derive(Clone, Debug)]
pub struct PodEnv {
    /// The job, as every pod of it reads it.
    pub job: TrainingJob,
    /// What this pod does.
    pub role: PodRole,
    /// The pod's name (the node's name in the job).
    pub pod_name: String,
    /// The pod's IP: where its data plane listens and what peers connect to.
    pub pod_ip: IpAddr,
    /// The coordinator's admin API (`host:port`).
    pub coordinator: String,
    /// The coordinator's admin port (the coordinator pod binds it).
    pub admin_port: u16,
    /// The data-plane port.
    pub data_port: u16,
    /// The port of this pod's `/metrics` (`EBBFLOW_METRICS_PORT`; pods created before it
    /// existed serve on [`METRICS_PORT`]).
    pub metrics_port: u16,
    /// The job secret.
    pub token: String,
    /// Where dataset paths start.
    pub data_dir: PathBuf,
    /// EC2 instance metadata endpoint to poll for interruptions, if any.
    pub metadata_endpoint: Option<String>,
    /// The coordinator's checkpoint file and the time between writes, if it keeps one.
    pub checkpoint: Option<(PathBuf, Duration)>,
}

impl PodEnv {
    /// Reads the settings through `var` (the process environment in `ebbflow pod`); a missing
    /// or malformed variable is an error that names it.
    pub fn read(var: impl Fn(&str) -> Option<String>) -> Result<Self, RunError> {
        let need = |name: &str| {
            var(name)
                .filter(|v| !v.is_empty())
                .ok_or_else(|| RunError::Pod(format!("{name} is not set")))
        };
        let parse = |name: &str, what: &str| -> Result<String, RunError> {
            need(name).map_err(|e| RunError::Pod(format!("{e} ({what})")))
        };
        let port = |name: &str| -> Result<u16, RunError> {
            let text = parse(name, "a TCP port")?;
            text.parse()
                .map_err(|_| RunError::Pod(format!("{name}={text:?} is not a TCP port")))
        };
        let role = match need("EBBFLOW_ROLE")?.as_str() {
            "coordinator" => PodRole::Coordinator,
            "reliable" => PodRole::Reliable,
            "transient" => PodRole::Transient,
            other => {
                return Err(RunError::Pod(format!(
                    "EBBFLOW_ROLE={other:?}: expected coordinator, reliable or transient"
                )));
            }
        };
        let name = need("EBBFLOW_JOB_NAME")?;
        let spec = need("EBBFLOW_JOB_SPEC")?;
        // Validated as `kubectl apply` and `ebbflow run` validate a manifest (JSON is YAML).
        let manifest = format!(
            "{{\"apiVersion\":\"ebbflow.dev/v1alpha1\",\"kind\":\"TrainingJob\",\
             \"metadata\":{{\"name\":{}}},\"spec\":{spec}}}",
            serde_json::Value::String(name)
        );
        let job = ebbflow_crds::parse_manifest(&manifest)
            .map_err(|e| RunError::Pod(format!("EBBFLOW_JOB_SPEC: {e}")))?;
        let pod_ip = parse("EBBFLOW_POD_IP", "the pod's IP")?;
        Ok(Self {
            job,
            role,
            pod_name: need("EBBFLOW_POD_NAME")?,
            pod_ip: pod_ip
                .parse()
                .map_err(|_| RunError::Pod(format!("EBBFLOW_POD_IP={pod_ip:?} is not an IP")))?,
            coordinator: need("EBBFLOW_COORDINATOR")?,
            admin_port: port("EBBFLOW_ADMIN_PORT")?,
            data_port: port("EBBFLOW_DATA_PORT")?,
            metrics_port: match var("EBBFLOW_METRICS_PORT").filter(|v| !v.is_empty()) {
                None => METRICS_PORT,
                Some(_) => port("EBBFLOW_METRICS_PORT")?,
            },
            token: need("EBBFLOW_TOKEN")?,
            data_dir: var("EBBFLOW_DATA_DIR")
                .filter(|v| !v.is_empty())
                .map_or_else(|| PathBuf::from("/data"), PathBuf::from),
            metadata_endpoint: var("EBBFLOW_METADATA_ENDPOINT").filter(|v| !v.is_empty()),
            checkpoint: match var("EBBFLOW_CHECKPOINT").filter(|v| !v.is_empty()) {
                None => None,
                Some(path) => {
                    let name = "EBBFLOW_CHECKPOINT_INTERVAL_SECONDS";
                    let seconds = match var(name).filter(|v| !v.is_empty()) {
                        None => DEFAULT_CHECKPOINT_INTERVAL.as_secs(),
                        Some(text) => text.parse::<u64>().map_err(|_| {
                            RunError::Pod(format!("{name}={text:?} is not a number of seconds"))
                        })?,
                    };
                    Some((PathBuf::from(path), Duration::from_secs(seconds)))
                }
            },
        })
    }

    /// The node this pod runs.
    fn node_settings(&self, coordinator: String) -> ElasticNodeSettings {
        let grace = self
            .job
            .spec
            .runtime
            .termination_grace_period_seconds
            .unwrap_or(DEFAULT_GRACE_SECONDS);
        ElasticNodeSettings {
            job: elastic_config(&self.job).job,
            job_id: job_id(&self.job),
            reliable: self.role != PodRole::Transient,
            listen: SocketAddr::new(self.pod_ip, self.data_port),
            advertise: None,
            // The chart's PodMonitor scrapes `metrics` on every runtime pod. The coordinator
            // pod's own node registers on the coordinator's registry, served there.
            metrics_listen: (self.role != PodRole::Coordinator)
                .then(|| SocketAddr::new(IpAddr::from([0, 0, 0, 0]), self.metrics_port)),
            // The coordinator pod's node registers on a registry of its own that the
            // coordinator's admin port serves too (`process="node"`, [`pod`]).
            registry: None,
            notices: NoticeSources {
                coordinator,
                secret: self.token.clone(),
                name: self.pod_name.clone(),
                grace: Duration::from_secs(u64::try_from(grace).unwrap_or(0)),
                metadata_endpoint: self.metadata_endpoint.clone(),
                metadata_poll: Duration::from_secs(2),
            },
        }
    }
}

/// Runs the pod: see the module docs. Returns the run's report as JSON for the coordinator pod
/// (`None` for a node, which returns when the coordinator lets it go).
pub fn pod(env: &PodEnv) -> Result<Option<serde_json::Value>, RunError> {
    let hint = format!(
        "in a pod, relative paths resolve against {} (EBBFLOW_DATA_DIR), where the job's \
         spec.app.dataset.claimName is mounted",
        env.data_dir.display()
    );
    let app = build_app(
        &env.job,
        DataDir {
            path: &env.data_dir,
            hint: &hint,
        },
    )?;
    // Listening from the start: a SIGTERM that makes a node leave also ends its linger.
    let terminated = Terminated::listen()?;
    let scheme = ebbflow_runtime::admin::scheme(
        elastic_config(&env.job).job.transport_security == TransportSecurity::Tls,
    );
    if env.role != PodRole::Coordinator {
        let coordinator = format!("{scheme}://{}", env.coordinator);
        run_node(app, env.node_settings(coordinator), &env.pod_name)?;
        // Released: the job ended, or this node left on a notice. Exiting now would make the
        // pod Succeeded, and the operator would replace it before it saw the job's end.
        terminated.wait();
        return Ok(None);
    }
    let admin = SocketAddr::new(IpAddr::from([0, 0, 0, 0]), env.admin_port);
    let listener = std::net::TcpListener::bind(admin).map_err(|source| RunError::BindMetrics {
        addr: admin,
        source,
    })?;
    let bound = listener
        .local_addr()
        .map_err(|source| RunError::BindMetrics {
            addr: admin,
            source,
        })?;
    let config = elastic_config(&env.job);
    let settings = ElasticJob {
        config: ebbflow_runtime::elastic::ElasticConfig {
            reliable: Vec::new(),
            transient: Vec::new(),
            ..config.clone()
        },
        secret: env.token.clone(),
        job: job_id(&env.job),
        reliable_nodes: env.job.spec.reliable.count.max(1),
        join_timeout: Duration::from_secs(600),
        background_copies: true,
        linger: Some(terminated.receiver()),
        stop: Some(terminated.receiver()),
        checkpoint: env
            .checkpoint
            .clone()
            .map(|(path, interval)| CheckpointSettings { path, interval }),
    };
    let registry = Registry::new();
    let metrics = RuntimeMetrics::register(&registry)
        .map_err(|e| RunError::Pod(format!("registering the runtime metrics: {e}")))?;
    // This pod's own reliable node joins over loopback; its data-plane and worker metrics are
    // served on the coordinator's admin port with `process="node"`.
    let node_registry = Registry::new();
    registry
        .register(Box::new(ebbflow_runtime::metrics::Nested::new(
            node_registry.clone(),
            "process",
            "node",
        )))
        .map_err(|e| RunError::Pod(format!("registering the node's metrics: {e}")))?;
    // The coordinator's and its node's metrics on the metrics port (the admin port is for the
    // job and the operator only), served as `ebbflow run` serves its own, until this returns.
    let metrics_addr = SocketAddr::new(IpAddr::from([0, 0, 0, 0]), env.metrics_port);
    let metrics_listener =
        std::net::TcpListener::bind(metrics_addr).map_err(|source| RunError::BindMetrics {
            addr: metrics_addr,
            source,
        })?;
    let _serving = super::serve_metrics(metrics_listener, registry.clone())
        .ok_or_else(|| RunError::Pod("starting the metrics server failed".into()))?;
    let own_node = ElasticNodeSettings {
        registry: Some(node_registry),
        ..env.node_settings(format!("{scheme}://127.0.0.1:{}", bound.port()))
    };
    // The apps hold their data behind `Arc`s: the node shares the coordinator's, loaded once.
    let node_app = app.clone();
    let node_name = env.pod_name.clone();
    let node = std::thread::spawn(move || run_node(node_app, own_node, &node_name));
    let feed = ebbflow_runtime::elastic::LiveFeed::new();
    let report = with_job_app!(&app, app => run_elastic_job(app, settings, listener, registry, &metrics, feed))
    .map_err(|e| RunError::Pod(format!("the job's coordinator failed: {e}")))?;
    match node.join() {
        Ok(outcome) => outcome?,
        Err(_) => return Err(RunError::Pod("the coordinator pod's node panicked".into())),
    }
    Ok(Some(serde_json::json!({
        "job": env.job.metadata.name,
        "clocks": report.run.clock_stats.len(),
        "quality": report.run.eval.metrics.iter().cloned().collect::<std::collections::BTreeMap<_, _>>(),
        "loss": report.run.eval.loss,
        "events": report.events,
        "rollbacks": report.rollbacks,
        "partitions_migrated": report.partitions_migrated,
    })))
}

/// Runs `app`'s elastic node `name` until the coordinator lets it go.
pub(super) fn run_node(
    app: JobApp,
    settings: ElasticNodeSettings,
    name: &str,
) -> Result<(), RunError> {
    with_job_app!(app, app => run_elastic_node(app, settings)).map_err(|e| RunError::Node {
        name: name.to_owned(),
        reason: e.to_string(),
    })
}

/// SIGTERM to this process, seen from the moment [`Terminated::listen`] is called (a listener
/// thread; the node's own SIGTERM handler is independent of it).
struct Terminated {
    received: tokio::sync::watch::Receiver<bool>,
}

impl Terminated {
    fn listen() -> Result<Self, RunError> {
        let (send, received) = tokio::sync::watch::channel(false);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| RunError::Pod(format!("starting the SIGTERM listener: {e}")))?;
        let mut signal = {
            let _guard = rt.enter();
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                .map_err(|e| RunError::Pod(format!("installing the SIGTERM listener: {e}")))?
        };
        std::thread::spawn(move || {
            rt.block_on(signal.recv());
            let _ = send.send(true);
        });
        Ok(Self { received })
    }

    /// A receiver that turns true on SIGTERM.
    fn receiver(&self) -> tokio::sync::watch::Receiver<bool> {
        self.received.clone()
    }

    /// Blocks until SIGTERM (at once if it already came).
    fn wait(&self) {
        let mut received = self.received.clone();
        let _ = futures::executor::block_on(received.wait_for(|done| *done));
    }
}
