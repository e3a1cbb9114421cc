//! An elastic job's node process: serves its data plane with an [`Agent`], joins the
//! coordinator, turns SIGTERM and instance-metadata interruptions into notices, sends the
//! coordinator a heartbeat every interval, and lives until the coordinator lets it go (it exits
//! 0), its grace period ends (exit 143), the job is over, or the coordinator answers a heartbeat
//! with "fenced" (the node was silent too long and was declared failed: it drops its state and
//! fails).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ebbflow_runtime_api::{
    HeartbeatRequest, HeartbeatResponse, JobPhase, JoinRequest, JoinResponse,
};
use prometheus::Registry;

use crate::app::App;
use crate::client::ClientConfig;
use crate::control::Agent;
use crate::metrics::RuntimeMetrics;
use crate::node::ServerHandle;
use crate::server::ServerConfig;
use crate::store::ServerState;
use crate::worker::JobConfig;

/// How long a node keeps trying to reach a coordinator that does not accept connections yet.
const JOIN_RETRY_FOR: Duration = Duration::from_secs(120);

/// Errors of a node process.
#[derive(Debug, thiserror::Error)]
pub enum ElasticNodeError {
    /// An address could not be bound, or a signal handler installed.
    #[error("{what}: {source}")]
    Setup {
        /// What was being set up.
        what: String,
        /// Why it failed.
        source: std::io::Error,
    },
    /// The coordinator refused the node or could not be reached.
    #[error("{0}")]
    Coordinator(String),
    /// The coordinator declared this node failed (its heartbeats stopped): it was fenced.
    #[error(
        "fenced: the coordinator declared node {name} failed (no heartbeat in time); its state is dropped"
    )]
    Fenced {
        /// The node.
        name: String,
    },
}

impl ElasticNodeError {
    /// Static label for metrics.
    pub fn category(&self) -> &'static str {
        match self {
            ElasticNodeError::Setup { .. } => "setup",
            ElasticNodeError::Coordinator(_) => "coordinator",
            ElasticNodeError::Fenced { .. } => "fenced",
        }
    }
}

fn setup(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> ElasticNodeError {
    let what = what.into();
    move |source| ElasticNodeError::Setup { what, source }
}

/// Where a node's notices go and where they come from.
#[derive(Debug, Clone)]
pub struct NoticeSources {
    /// Coordinator base URL.
    pub coordinator: String,
    /// The job secret.
    pub secret: String,
    /// The node's name.
    pub name: String,
    /// Time between SIGTERM and the node's end (the pod's termination grace period).
    pub grace: Duration,
    /// EC2 instance metadata endpoint to poll (off when `None`).
    pub metadata_endpoint: Option<String>,
    /// Time between metadata polls.
    pub metadata_poll: Duration,
}

/// Starts the node's notice sources on `rt`: SIGTERM (the node leaves after its grace period:
/// the coordinator is told at once, the process exits 143 then) and, when configured, the
/// instance metadata service.
pub fn watch_for_notices(
    rt: &tokio::runtime::Runtime,
    sources: &NoticeSources,
    http: &reqwest::Client,
) -> Result<(), ElasticNodeError> {
    let terminate = listen_for_sigterm(rt)?;
    watch_for_notices_from(rt, terminate, sources, http, None)
}

/// Called once the coordinator knows of a SIGTERM (after [`UNADMITTED_WAIT`]): lets the node go
/// at once when nothing has to move off it first; true if it did.
pub type LeaveEarly = Box<dyn FnOnce() -> bool + Send>;

/// How long a SIGTERMed node that the coordinator has not admitted waits for its admission
/// (which a notice applied first never lets come) before it leaves: a joined node is admitted
/// at the next boundary, well within this on a loaded machine, and a pod's grace period (30 s
/// by default) is far longer.
const UNADMITTED_WAIT: Duration = Duration::from_secs(5);

/// A SIGTERM listener on `rt`: a signal that arrives once it exists is kept for its first
/// `recv`, so a node listens before it joins and acts on a SIGTERM of that time after.
fn listen_for_sigterm(
    rt: &tokio::runtime::Runtime,
) -> Result<tokio::signal::unix::Signal, ElasticNodeError> {
    let _guard = rt.enter();
    tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(setup("installing the SIGTERM handler"))
}

/// As [`watch_for_notices`] with SIGTERM from `terminate`.
fn watch_for_notices_from(
    rt: &tokio::runtime::Runtime,
    mut terminate: tokio::signal::unix::Signal,
    sources: &NoticeSources,
    http: &reqwest::Client,
    leave_early: Option<LeaveEarly>,
) -> Result<(), ElasticNodeError> {
    let (base, secret, name, grace, client) = (
        sources.coordinator.clone(),
        sources.secret.clone(),
        sources.name.clone(),
        sources.grace,
        http.clone(),
    );
    rt.spawn(async move {
        if terminate.recv().await.is_none() {
            return;
        }
        let deadline = std::time::SystemTime::now() + grace;
        match crate::notices::send_notice_at(&client, &base, &secret, &name, deadline).await {
            Ok(_) => {
                tracing::info!(
                    grace_ms = grace.as_millis() as u64,
                    "SIGTERM: the coordinator knows this node leaves"
                );
                // A node whose notice the coordinator applied before admitting it is never
                // admitted, so never released: unadmitted after `UNADMITTED_WAIT`, it leaves.
                if let Some(leave) = leave_early {
                    tokio::spawn(async move {
                        tokio::time::sleep(UNADMITTED_WAIT).await;
                        if leave() {
                            tracing::info!(
                                "SIGTERM and still not admitted by the coordinator: leaving now"
                            );
                        }
                    });
                }
            }
            Err(error) => {
                tracing::warn!(%error, "SIGTERM: the notice did not reach the coordinator")
            }
        }
        tokio::time::sleep(grace).await;
        tracing::info!("grace period over, exiting");
        std::process::exit(143);
    });
    if let Some(endpoint) = &sources.metadata_endpoint {
        let metadata = crate::notices::MetadataClient::new(endpoint)
            .map_err(|e| ElasticNodeError::Coordinator(e.to_string()))?;
        rt.spawn(crate::notices::watch_metadata(
            metadata,
            http.clone(),
            sources.coordinator.clone(),
            sources.secret.clone(),
            sources.name.clone(),
            sources.metadata_poll,
        ));
        tracing::info!(%endpoint, "watching the instance metadata service for interruptions");
    }
    Ok(())
}

/// Settings of an elastic node process.
#[derive(Debug, Clone)]
pub struct ElasticNodeSettings {
    /// The job (the same on every process of it).
    pub job: JobConfig,
    /// The job description the coordinator checks.
    pub job_id: String,
    /// On reliable (on-demand) capacity.
    pub reliable: bool,
    /// Data-plane address to bind.
    pub listen: SocketAddr,
    /// Data-plane address peers use (default: the bound one).
    pub advertise: Option<SocketAddr>,
    /// Serve `/metrics` here.
    pub metrics_listen: Option<SocketAddr>,
    /// Register the node's metrics here (default: a registry of its own). The coordinator pod
    /// passes one that its admin API serves too ([`crate::metrics::Nested`]).
    pub registry: Option<Registry>,
    /// Coordinator, name, secret and notice sources.
    pub notices: NoticeSources,
}

/// How a node process talks to the network beyond its job settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NodeOptions {
    /// Time between heartbeats to the coordinator.
    pub heartbeat_interval: Duration,
    /// The node's data-plane bandwidth in Mbit/s each way (0: unlimited).
    pub bandwidth_limit_mbps: f64,
}

impl Default for NodeOptions {
    fn default() -> Self {
        Self {
            heartbeat_interval: crate::heartbeat::HeartbeatConfig::default().interval,
            bandwidth_limit_mbps: 0.0,
        }
    }
}

/// Runs a node of an elastic job until the coordinator releases it (see the module docs), with
/// the default [`NodeOptions`].
pub fn run_elastic_node<A: App>(
    app: A,
    settings: ElasticNodeSettings,
) -> Result<(), ElasticNodeError> {
    run_elastic_node_with(app, settings, NodeOptions::default())
}

/// As [`run_elastic_node`] with `options`.
pub fn run_elastic_node_with<A: App>(
    app: A,
    settings: ElasticNodeSettings,
    options: NodeOptions,
) -> Result<(), ElasticNodeError> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(setup("starting the tokio runtime"))?;
    // Listening before the join: a SIGTERM while joining is a notice once joined (it was lost
    // when the listener started after the join, and the node ran until it was killed).
    let terminate = listen_for_sigterm(&rt)?;
    let registry = settings.registry.clone().unwrap_or_default();
    let metrics = RuntimeMetrics::register(&registry)
        .map_err(|e| ElasticNodeError::Coordinator(format!("registering metrics: {e}")))?;
    let listener = rt
        .block_on(tokio::net::TcpListener::bind(settings.listen))
        .map_err(setup(format!(
            "binding the data plane on {}",
            settings.listen
        )))?;
    let bound = listener
        .local_addr()
        .map_err(setup("reading the data-plane address"))?;
    let advertise = settings.advertise.unwrap_or(bound);
    if let Some(addr) = settings.metrics_listen {
        let metrics_listener = rt
            .block_on(tokio::net::TcpListener::bind(addr))
            .map_err(setup(format!("binding metrics on {addr}")))?;
        let router = crate::coordinator::metrics_router(registry.clone());
        rt.spawn(async move { axum::serve(metrics_listener, router).await });
    }
    let config = settings.job;
    let specs = app.tables();
    let state = Arc::new(ServerState::new(
        &[],
        config.partitions,
        &specs,
        config.workers as u32,
        config.optimizer,
        config.staleness == 0,
    ));
    let secret = settings.notices.secret.clone();
    let tls = crate::tls::JobTls::for_security(config.transport_security, secret.as_bytes());
    let client = ClientConfig {
        secret: secret.clone().into_bytes(),
        node: 0,
        max_frame_bytes: crate::frame::DEFAULT_MAX_FRAME_BYTES,
        timeout: config.wait_timeout,
        tls: tls.clone(),
    };
    let (shutdown, released) = std::sync::mpsc::channel();
    let agent = Arc::new(Agent::new(
        app,
        state.clone(),
        config.clone(),
        client,
        metrics.clone(),
        shutdown,
    ));
    let server_config = ServerConfig {
        wait_timeout: config.wait_timeout,
        agent: Some(agent.clone()),
        bandwidth: crate::bandwidth::NodeBandwidth::from_mbps(options.bandwidth_limit_mbps),
        tls: tls.clone(),
        ..ServerConfig::with_secret(secret.clone().into_bytes())
    };
    let server = ServerHandle::serve(rt.handle(), listener, state.clone(), server_config, metrics)
        .map_err(setup("serving the data plane"))?;
    let http = crate::admin::client(tls.as_deref())
        .timeout(Duration::from_secs(60))
        .build()
        .map_err(|e| ElasticNodeError::Coordinator(format!("building the HTTP client: {e}")))?;
    let base = crate::admin::base_url(&settings.notices.coordinator, tls.is_some())
        .map_err(ElasticNodeError::Coordinator)?;
    let join = JoinRequest {
        name: settings.notices.name.clone(),
        data_addr: advertise.to_string(),
        workers: 0,
        secret,
        reliable: settings.reliable,
        serves: true,
        job: settings.job_id,
    };
    let joined = rt.block_on(async {
        // The coordinator may not listen yet (pods and processes start in any order): a
        // connection that fails is tried again for a while, and so is a join answered "try
        // again" (503: a reliable node's replacement whose predecessor the run has not let go
        // yet); any other answer is final.
        let give_up = tokio::time::Instant::now() + JOIN_RETRY_FOR;
        let mut pause = Duration::from_millis(50);
        let (status, body) = loop {
            match http.post(format!("{base}/join")).json(&join).send().await {
                Ok(response) => {
                    let status = response.status();
                    let body = response.text().await.unwrap_or_default();
                    if status != reqwest::StatusCode::SERVICE_UNAVAILABLE
                        || tokio::time::Instant::now() >= give_up
                    {
                        break (status, body);
                    }
                    tracing::info!(%body, "the coordinator asks to join again later");
                }
                Err(error) if error.is_connect() && tokio::time::Instant::now() < give_up => {
                    tracing::debug!(%error, "the coordinator is not reachable yet");
                }
                Err(error) => return Err(format!("joining {base}: {error}")),
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(2));
        };
        if !status.is_success() {
            return Err(format!("{base} refused the join ({status}): {body}"));
        }
        serde_json::from_str::<JoinResponse>(&body)
            .map_err(|e| format!("{base} answered the join with {body:?}: {e}"))
    });
    if let Err(message) = joined {
        server.stop(rt.handle());
        return Err(ElasticNodeError::Coordinator(message));
    }
    tracing::info!(name = %settings.notices.name, %advertise, reliable = settings.reliable, "joined");
    let admitted_check = agent.clone();
    watch_for_notices_from(
        &rt,
        terminate,
        &settings.notices,
        &http,
        Some(Box::new(move || admitted_check.leave_if_never_admitted())),
    )?;
    // Serve until the coordinator lets this node go, or the job is over without it; a heartbeat
    // every interval tells the coordinator this process still runs.
    let name = settings.notices.name.clone();
    let beat = HeartbeatRequest { name: name.clone() };
    let bearer = ebbflow_runtime_api::bearer(&settings.notices.secret);
    let heartbeat_wait = (options.heartbeat_interval * 4).max(Duration::from_secs(2));
    let mut unreachable_since: Option<Instant> = None;
    let outcome = loop {
        match released.recv_timeout(options.heartbeat_interval) {
            Ok(()) | Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                tracing::info!("released by the coordinator");
                break Ok(());
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
        }
        let answer = rt.block_on(async {
            http.post(format!("{base}/heartbeat"))
                .header("authorization", &bearer)
                .timeout(heartbeat_wait)
                .json(&beat)
                .send()
                .await?
                .error_for_status()?
                .json::<HeartbeatResponse>()
                .await
        });
        match answer {
            Ok(answer) if answer.fenced => {
                // Declared failed while silent: whatever this node holds is of an abandoned
                // timeline. Drop it before anything else is served, then leave.
                let dropped = state.abandon();
                tracing::error!(dropped, "fenced by the coordinator: state dropped, exiting");
                break Err(ElasticNodeError::Fenced { name });
            }
            Ok(answer)
                if matches!(
                    answer.phase,
                    JobPhase::Done | JobPhase::Stopped | JobPhase::Failed
                ) =>
            {
                tracing::info!(phase = ?answer.phase, "the job is over");
                break Ok(());
            }
            Ok(_) => unreachable_since = None,
            Err(error) => {
                let since = *unreachable_since.get_or_insert_with(Instant::now);
                if since.elapsed() > Duration::from_secs(30) {
                    break Err(ElasticNodeError::Coordinator(format!(
                        "the coordinator has been unreachable for 30 s: {error}"
                    )));
                }
            }
        }
    };
    server.stop(rt.handle());
    outcome
}
