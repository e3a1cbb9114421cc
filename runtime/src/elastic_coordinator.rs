//! The admin HTTP API of an elastic job's coordinator (node processes joining and leaving).
//!
//! - `POST /join`: a node process announces itself (name, tier, data-plane address, job secret and
//!   the job it was started for). Reliable nodes are awaited before training starts; after that
//!   a reliable name joins again only as the replacement of the member that held it, once the
//!   run let that one go (503 "try again" until then). Transient nodes may join at any time
//!   under a new name and are switched in at the next clock boundary.
//! - `POST /notice` (`Authorization: Bearer <secret>`): "node X leaves at T" — the partitions it
//!   hosts move at the next boundary if T is still ahead, else the run rolls back.
//! - `POST /stop` (bearer): stop at the next boundary, keeping what was trained.
//! - `POST /heartbeat` (bearer): a node is alive. A node silent for the heartbeat timeout is
//!   declared failed ([`crate::heartbeat`]): the fleet treats it like a broken connection and its
//!   later heartbeats are answered `fenced`.
//! - `GET /status` (bearer): phase, members with their data-plane addresses, partition owners,
//!   notices and progress; only for the job (its nodes and the operator hold the secret).
//! - `GET /metrics`: open, as a Prometheus scrape is (counts and gauges, no addresses).
//!
//! Handlers only validate and turn requests into [`ElasticEvent`]s on the controller's
//! [`LiveFeed`]; the controller's loop (`elastic::run_elastic_on` over a
//! [`crate::control::ProcessFleet`]) decides everything at clock boundaries.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::routing::{get, post};
use ebbflow_runtime_api::{
    Ack, ElasticProgress, FailureReason, HeartbeatRequest, HeartbeatResponse, JobPhase, JobResult,
    JoinRequest, JoinResponse, NodeInfo, NoticeRequest, NoticeResponse, PartitionOwner,
    StatusResponse,
};
use parking_lot::Mutex;
use prometheus::Registry;

use crate::coordinator::{AdminError, check_bearer};
use crate::elastic::ElasticEvent;
use crate::heartbeat::{Beat, Heartbeats};
use crate::message::secrets_match;

#[derive(Debug, Default)]
struct Members {
    phase: Option<JobPhase>,
    /// Every node that joined, in join order: (name, reliable, data address).
    nodes: Vec<(String, bool, SocketAddr)>,
    /// Names that left or were told to leave (by notice time).
    notices: BTreeMap<String, u64>,
    result: Option<JobResult>,
    error: Option<String>,
    failure_reason: Option<FailureReason>,
}

impl Members {
    /// Names of the nodes of one tier, in join order.
    fn names(&self, reliable: bool) -> Vec<String> {
        self.nodes
            .iter()
            .filter(|n| n.1 == reliable)
            .map(|n| n.0.clone())
            .collect()
    }
}

/// Shared state of the elastic admin API.
pub struct ElasticService {
    secret: String,
    job: String,
    reliable_expected: u32,
    /// Name → data-plane address, read by the fleet when it admits a node.
    directory: Arc<Mutex<BTreeMap<String, SocketAddr>>>,
    members: Mutex<Members>,
    events: Mutex<Option<std::sync::mpsc::Sender<ElasticEvent>>>,
    started: tokio::sync::Notify,
    registry: Registry,
    metrics: crate::metrics::RuntimeMetrics,
    heartbeats: Arc<Heartbeats>,
    /// Where the running segment's partitions and workers are, published by the fleet.
    placement: Arc<Mutex<crate::control::Placement>>,
}

impl ElasticService {
    /// A service for the job described by `job` (nodes must present the same description),
    /// waiting for `reliable_expected` reliable nodes; every node that joins is watched by
    /// `heartbeats`.
    pub fn new(
        secret: String,
        job: String,
        reliable_expected: u32,
        directory: Arc<Mutex<BTreeMap<String, SocketAddr>>>,
        registry: Registry,
        metrics: crate::metrics::RuntimeMetrics,
        heartbeats: Arc<Heartbeats>,
    ) -> Arc<Self> {
        Arc::new(Self {
            secret,
            job,
            reliable_expected,
            directory,
            members: Mutex::new(Members::default()),
            events: Mutex::new(None),
            started: tokio::sync::Notify::new(),
            registry,
            metrics,
            heartbeats,
            placement: Arc::default(),
        })
    }

    /// Where the fleet publishes the running segment's placement for [`Self::status`].
    pub fn placement(&self) -> Arc<Mutex<crate::control::Placement>> {
        self.placement.clone()
    }

    /// Handles a heartbeat: a member that was declared failed is told it is fenced.
    pub fn heartbeat(&self, request: HeartbeatRequest) -> Result<HeartbeatResponse, AdminError> {
        let m = self.members.lock();
        if !m.nodes.iter().any(|n| n.0 == request.name) {
            return Err(AdminError::LookupNode(request.name));
        }
        let fenced = match self
            .heartbeats
            .beat(&request.name, std::time::Instant::now())
        {
            Beat::Fenced => {
                tracing::warn!(name = %request.name, "heartbeat of a node declared failed: fenced");
                true
            }
            Beat::Alive | Beat::Untracked => false,
        };
        Ok(HeartbeatResponse {
            phase: m.phase.unwrap_or(JobPhase::Joining),
            fenced,
        })
    }

    /// Handles a join.
    pub fn join(&self, request: JoinRequest) -> Result<JoinResponse, AdminError> {
        if !secrets_match(self.secret.as_bytes(), request.secret.as_bytes()) {
            tracing::warn!(name = %request.name, "join with a wrong job secret refused");
            return Err(AdminError::CheckSecret);
        }
        if !request.job.is_empty() && request.job != self.job {
            return Err(AdminError::Validate(format!(
                "node {} was started for another job ({}); this job is {}",
                request.name, request.job, self.job
            )));
        }
        let addr: SocketAddr = request.data_addr.parse().map_err(|_| {
            AdminError::Validate(format!(
                "data_addr {:?} is not host:port",
                request.data_addr
            ))
        })?;
        if request.name.is_empty() || request.name.len() > 253 {
            return Err(AdminError::Validate(
                "a node name must have 1 to 253 characters".into(),
            ));
        }
        let mut m = self.members.lock();
        let training = m.phase.is_some();
        let existing = m.nodes.iter().position(|n| n.0 == request.name);
        // A reliable node is a fixed slot of the job (an on-demand pod recreated under its
        // name when it crashed or its node was drained). Once the run let the member that held
        // the name go (the fleet dropped it from the directory), a reliable node joining under
        // it while training is that member's replacement.
        let replaces = existing.filter(|&index| {
            training
                && request.reliable
                && m.nodes[index].1
                && !self.directory.lock().contains_key(&request.name)
        });
        if let Some(index) = existing.filter(|_| replaces.is_none()) {
            let reliable_slot = training && request.reliable && m.nodes[index].1;
            if self
                .heartbeats
                .has_failed(&request.name, std::time::Instant::now())
            {
                if reliable_slot {
                    return Err(AdminError::Retry(format!(
                        "reliable node {} was declared failed; its replacement can join once \
                         the run let it go, at the next clock boundary",
                        request.name
                    )));
                }
                return Err(AdminError::Validate(format!(
                    "node {} was declared failed (no heartbeat); join under a new name",
                    request.name
                )));
            }
            // A name the run let go (it left, or its admission failed) is used once: joining
            // again, even from the same address, would be a process no one ever admits.
            if !self.directory.lock().contains_key(&request.name) {
                return Err(AdminError::Validate(format!(
                    "node {} already left the job; join under a new name",
                    request.name
                )));
            }
            if m.nodes[index].2 == addr {
                return Ok(JoinResponse { node: index as u32 });
            }
            if reliable_slot {
                return Err(AdminError::Retry(format!(
                    "reliable node {} is still a member of the run from {}; its replacement can \
                     join once the run let it go",
                    request.name, m.nodes[index].2
                )));
            }
            return Err(AdminError::Validate(format!(
                "node {} already joined from another address",
                request.name
            )));
        }
        let reliable_now = m.nodes.iter().filter(|n| n.1).count() as u32;
        if replaces.is_none()
            && request.reliable
            && (training || reliable_now >= self.reliable_expected)
        {
            return Err(AdminError::JoinStarted(request.name));
        }
        // The address is in the directory before the controller hears of the join, so the
        // fleet finds it when it admits the node.
        self.directory.lock().insert(request.name.clone(), addr);
        if training {
            let event = if request.reliable {
                ElasticEvent::JoinReliable {
                    names: vec![request.name.clone()],
                }
            } else {
                ElasticEvent::Join {
                    names: vec![request.name.clone()],
                }
            };
            let sent = self
                .events
                .lock()
                .as_ref()
                .is_some_and(|events| events.send(event).is_ok());
            if !sent {
                self.directory.lock().remove(&request.name);
                return Err(AdminError::JoinStarted(request.name));
            }
        }
        let now = std::time::Instant::now();
        if let Some(index) = replaces {
            self.heartbeats.rejoin(&request.name, now);
            m.nodes[index].2 = addr;
            m.notices.remove(&request.name);
            tracing::info!(name = %request.name, %addr, "reliable node replaced");
            return Ok(JoinResponse { node: index as u32 });
        }
        self.heartbeats.track(&request.name, now);
        m.nodes.push((request.name.clone(), request.reliable, addr));
        tracing::info!(name = %request.name, reliable = request.reliable, %addr, "node joined");
        if !training && reliable_now + u32::from(request.reliable) == self.reliable_expected {
            self.started.notify_waiters();
            self.started.notify_one();
        }
        Ok(JoinResponse {
            node: (m.nodes.len() - 1) as u32,
        })
    }

    /// Waits until the reliable nodes joined.
    pub async fn wait_for_reliable(&self) {
        loop {
            let notified = self.started.notified();
            if self.members.lock().names(true).len() as u32 >= self.reliable_expected {
                return;
            }
            notified.await;
        }
    }

    /// Training starts: later joins and notices go to `events`. Returns the members at the start
    /// (reliable, transient), atomically with the switch so no join is missed.
    pub fn start(
        &self,
        events: std::sync::mpsc::Sender<ElasticEvent>,
    ) -> (Vec<String>, Vec<String>) {
        let mut m = self.members.lock();
        m.phase = Some(JobPhase::Training);
        // Notices that came before training started (a node told to leave while it joined)
        // apply at its first boundary.
        for (name, deadline) in &m.notices {
            let _ = events.send(ElasticEvent::Notice {
                names: vec![name.clone()],
                lead: time_left(deadline.saturating_mul(1000)),
            });
        }
        *self.events.lock() = Some(events);
        (m.names(true), m.names(false))
    }

    /// Handles a notice.
    pub fn notice(&self, request: NoticeRequest) -> Result<NoticeResponse, AdminError> {
        let mut m = self.members.lock();
        let Some(index) = m.nodes.iter().position(|n| n.0 == request.name) else {
            return Err(AdminError::LookupNode(request.name));
        };
        if m.notices.contains_key(&request.name) {
            return Ok(NoticeResponse {
                node: index as u32,
                new: false,
            });
        }
        if m.nodes[index].1 {
            // A reliable node may leave (its on-demand node drained) while another one stays:
            // every layout needs one. Its partitions move to the others.
            let directory = self.directory.lock();
            let others = m
                .nodes
                .iter()
                .filter(|n| {
                    n.1 && n.0 != request.name
                        && directory.contains_key(&n.0)
                        && !m.notices.contains_key(&n.0)
                })
                .count();
            if others == 0 {
                return Err(AdminError::Validate(format!(
                    "node {} is the last reliable node of the job; it cannot leave while the \
                     job runs",
                    request.name
                )));
            }
        }
        let lead = time_left(
            request
                .deadline_unix_ms
                .unwrap_or(request.deadline_unix.saturating_mul(1000)),
        );
        let event = ElasticEvent::Notice {
            names: vec![request.name.clone()],
            lead,
        };
        if let Some(events) = self.events.lock().as_ref() {
            let _ = events.send(event);
        }
        m.notices
            .insert(request.name.clone(), request.deadline_unix);
        tracing::info!(name = %request.name, lead_ms = lead.as_millis() as u64, "notice");
        Ok(NoticeResponse {
            node: index as u32,
            new: true,
        })
    }

    /// Handles a stop.
    pub fn stop(&self) -> Ack {
        if let Some(events) = self.events.lock().as_ref() {
            let _ = events.send(ElasticEvent::Stop);
        }
        Ack { ok: true }
    }

    /// Records the end of the job.
    pub fn finish(
        &self,
        phase: JobPhase,
        result: Option<JobResult>,
        error: Option<String>,
        failure_reason: Option<FailureReason>,
    ) {
        let mut m = self.members.lock();
        m.phase = Some(phase);
        m.result = result;
        m.error = error;
        m.failure_reason = failure_reason;
        *self.events.lock() = None;
    }

    /// The job's status.
    pub fn status(&self) -> StatusResponse {
        let m = self.members.lock();
        let directory = self.directory.lock();
        let placement = self.placement.lock().clone();
        // Names are unique: a reliable slot's replacement takes over its member's entry.
        let index_of = |name: &str| m.nodes.iter().position(|n| n.0 == name);
        StatusResponse {
            phase: m.phase.unwrap_or(JobPhase::Joining),
            expected_nodes: self.reliable_expected,
            nodes: m
                .nodes
                .iter()
                .enumerate()
                .map(|(index, (name, _, addr))| NodeInfo {
                    node: index as u32,
                    name: name.clone(),
                    data_addr: addr.to_string(),
                    workers: placement.workers.get(name).copied().unwrap_or(0),
                    worker_base: 0,
                    finished: !directory.contains_key(name),
                    serves: placement.partitions.iter().any(|(owner, _)| owner == name),
                })
                .collect(),
            // Every member stays listed once it joined, so each owner is found; were one not,
            // no owner is shown rather than a list out of partition order.
            partitions: placement
                .partitions
                .iter()
                .map(|(owner, epoch)| {
                    index_of(owner).map(|index| PartitionOwner {
                        owner: index as u32,
                        epoch: *epoch,
                    })
                })
                .collect::<Option<Vec<_>>>()
                .unwrap_or_default(),
            notices: m
                .notices
                .iter()
                .filter_map(|(name, deadline)| {
                    m.nodes
                        .iter()
                        .position(|n| &n.0 == name)
                        .map(|i| (i as u32, *deadline))
                })
                .collect(),
            result: m.result.clone(),
            error: m.error.clone(),
            failure_reason: m.failure_reason,
            progress: m.phase.map(|_| ElasticProgress {
                clock: self.metrics.consistent_clock.get().max(0) as u64,
                stage: self.metrics.stage.get().clamp(0, 3) as u8,
                reliable_nodes: self
                    .metrics
                    .nodes
                    .with_label_values(&["reliable"])
                    .get()
                    .max(0) as u32,
                transient_nodes: self
                    .metrics
                    .nodes
                    .with_label_values(&["transient"])
                    .get()
                    .max(0) as u32,
                transient_nodes_added: self.metrics.transient_nodes_added.get(),
                partitions_migrated: self.metrics.partitions_migrated.get(),
                rollbacks: self.metrics.rollbacks.get(),
                heartbeat_failures: self.heartbeats.failures(),
                loss: Some(self.metrics.loss.get())
                    .filter(|loss| loss.is_finite() && self.metrics.iterations.get() > 0),
            }),
        }
    }
}

async fn join_handler(
    State(s): State<Arc<ElasticService>>,
    Json(request): Json<JoinRequest>,
) -> Result<Json<JoinResponse>, AdminError> {
    s.join(request).map(Json)
}

async fn notice_handler(
    State(s): State<Arc<ElasticService>>,
    headers: HeaderMap,
    Json(request): Json<NoticeRequest>,
) -> Result<Json<NoticeResponse>, AdminError> {
    check_bearer(&headers, &s.secret, "notice")?;
    s.notice(request).map(Json)
}

async fn stop_handler(
    State(s): State<Arc<ElasticService>>,
    headers: HeaderMap,
) -> Result<Json<Ack>, AdminError> {
    check_bearer(&headers, &s.secret, "stop")?;
    Ok(Json(s.stop()))
}

async fn heartbeat_handler(
    State(s): State<Arc<ElasticService>>,
    headers: HeaderMap,
    Json(request): Json<HeartbeatRequest>,
) -> Result<Json<HeartbeatResponse>, AdminError> {
    check_bearer(&headers, &s.secret, "heartbeat")?;
    s.heartbeat(request).map(Json)
}

async fn status_handler(
    State(s): State<Arc<ElasticService>>,
    headers: HeaderMap,
) -> Result<Json<StatusResponse>, AdminError> {
    check_bearer(&headers, &s.secret, "status")?;
    Ok(Json(s.status()))
}

async fn metrics_handler(State(s): State<Arc<ElasticService>>) -> String {
    crate::metrics::render(&s.registry)
}

/// The elastic admin HTTP API router.
pub fn router(service: Arc<ElasticService>) -> axum::Router {
    axum::Router::new()
        .route("/status", get(status_handler))
        .route("/join", post(join_handler))
        .route("/notice", post(notice_handler))
        .route("/stop", post(stop_handler))
        .route("/heartbeat", post(heartbeat_handler))
        .route("/metrics", get(metrics_handler))
        .with_state(service)
}

/// Refuses an empty job secret ([`ElasticJobError::EmptySecret`]): the secret checks of the
/// data plane and the admin API compare against it, and an empty one matches a request that
/// presents none.
pub fn check_secret(secret: &str) -> Result<(), ElasticJobError> {
    if secret.is_empty() {
        return Err(ElasticJobError::EmptySecret);
    }
    Ok(())
}

/// Errors of an elastic job's coordinator.
#[derive(Debug, thiserror::Error)]
pub enum ElasticJobError {
    /// The job's secret is empty: every peer and every admin request would be let in.
    #[error(
        "the job secret is empty: every peer and admin request would be let in; set \
         EBBFLOW_JOB_SECRET (or --secret) to the job's token"
    )]
    EmptySecret,
    /// The admin API could not be served.
    #[error("serving the admin API failed: {0}")]
    Serve(std::io::Error),
    /// Not enough reliable nodes joined in time.
    #[error("{joined} of {expected} reliable nodes joined within {waited:?}")]
    JoinTimeout {
        /// Reliable nodes that joined.
        joined: usize,
        /// Reliable nodes awaited.
        expected: u32,
        /// How long the coordinator waited.
        waited: Duration,
    },
    /// Told to stop before training started.
    #[error(
        "told to stop before training started ({joined} of {expected} reliable nodes had joined)"
    )]
    Stopped {
        /// Reliable nodes that joined.
        joined: usize,
        /// Reliable nodes awaited.
        expected: u32,
    },
    /// The run failed.
    #[error(transparent)]
    Run(#[from] crate::elastic::ElasticError),
    /// The checkpoint to resume from could not be read (named in the message).
    #[error(transparent)]
    Checkpoint(#[from] crate::checkpoint::CheckpointError),
}

impl ElasticJobError {
    /// The divergence that ended the run, if that is why it failed.
    pub fn divergence(&self) -> Option<&crate::divergence::Divergence> {
        match self {
            ElasticJobError::Run(error) => error.divergence(),
            _ => None,
        }
    }

    /// Static label for metrics.
    pub fn category(&self) -> &'static str {
        match self {
            ElasticJobError::EmptySecret => "empty_secret",
            ElasticJobError::Serve(_) => "serve",
            ElasticJobError::JoinTimeout { .. } => "join_timeout",
            ElasticJobError::Stopped { .. } => "stopped",
            ElasticJobError::Run(e) => e.category(),
            ElasticJobError::Checkpoint(_) => "checkpoint",
        }
    }
}

/// Time from now until the Unix time `deadline_ms` (milliseconds; zero once past).
fn time_left(deadline_ms: u64) -> Duration {
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    Duration::from_millis(deadline_ms.saturating_sub(now_ms))
}

/// Settings of an elastic job's coordinator.
#[derive(Debug, Clone)]
pub struct ElasticJob {
    /// The run (its `reliable` and `transient` lists are filled from the nodes that join).
    pub config: crate::elastic::ElasticConfig,
    /// The job secret.
    pub secret: String,
    /// What nodes must present as their job.
    pub job: String,
    /// Reliable nodes to wait for.
    pub reliable_nodes: u32,
    /// How long to wait for them.
    pub join_timeout: Duration,
    /// Copy the ActivePSs' partitions to the BackupPS copy in the background while workers run
    /// (else segments end every `backup_every` clocks for a copy at the boundary).
    pub background_copies: bool,
    /// After the job ends, keep serving its final status (phase, result) until this turns
    /// true or its sender is dropped: a pod's coordinator lingers so that its operator reads
    /// the outcome before it deletes the job's pods. `None`: stop serving at once.
    pub linger: Option<tokio::sync::watch::Receiver<bool>>,
    /// Turns true when the process is told to stop (SIGTERM): while the coordinator still waits
    /// for its reliable nodes it stops waiting ([`ElasticJobError::Stopped`]); once training
    /// runs, the caller's `POST /stop`-like event on the feed is what stops it.
    pub stop: Option<tokio::sync::watch::Receiver<bool>>,
    /// Checkpoint the newest consistent copy to disk, and resume from the checkpoint there.
    pub checkpoint: Option<CheckpointSettings>,
}

/// Where and how often a coordinator checkpoints ([`crate::checkpoint`]).
#[derive(Debug, Clone)]
pub struct CheckpointSettings {
    /// The checkpoint file (its directory must exist).
    pub path: std::path::PathBuf,
    /// At most one write per this long.
    pub interval: Duration,
}

/// The events a job's controller acts on: the sender (joins and notices from the admin API,
/// a stop from the caller) and the controller's end.
pub type JobFeed = (
    std::sync::mpsc::Sender<ElasticEvent>,
    crate::elastic::LiveFeed,
);

/// Serves the admin API on `listener` and runs the job over the node processes that join:
/// waits for the reliable nodes, then trains elastically, switching transient nodes in and out
/// as they join and leave. Every node is released (its process exits) at the end. Joins and
/// notices reach the controller through `feed`; the caller may send more events on its sender
/// (a stop on Ctrl-C or at a wall-clock limit). Nodes silent for the default heartbeat timeout
/// ([`crate::heartbeat::HeartbeatConfig`]) are declared failed.
pub fn run_elastic_job<A: crate::app::App>(
    app: &A,
    job: ElasticJob,
    listener: std::net::TcpListener,
    registry: Registry,
    metrics: &crate::metrics::RuntimeMetrics,
    feed: JobFeed,
) -> Result<crate::elastic::ElasticReport, ElasticJobError> {
    let timeout = crate::heartbeat::HeartbeatConfig::default().timeout;
    run_elastic_job_with(app, job, timeout, listener, registry, metrics, feed)
}

/// As [`run_elastic_job`], declaring a node failed after `heartbeat_timeout` without a heartbeat
/// (zero: only a broken connection loses a node).
pub fn run_elastic_job_with<A: crate::app::App>(
    app: &A,
    job: ElasticJob,
    heartbeat_timeout: Duration,
    listener: std::net::TcpListener,
    registry: Registry,
    metrics: &crate::metrics::RuntimeMetrics,
    feed: JobFeed,
) -> Result<crate::elastic::ElasticReport, ElasticJobError> {
    check_secret(&job.secret)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(ElasticJobError::Serve)?;
    let linger = job.linger.clone();
    // A checkpoint of this job's on disk is where it resumes.
    let (start, writer) = match &job.checkpoint {
        Some(settings) => {
            let start = crate::checkpoint::Checkpoint::read(&settings.path, &job.job)?;
            match &start {
                Some(start) => tracing::info!(
                    clock = start.clock,
                    path = %settings.path.display(),
                    "resuming from this job's checkpoint"
                ),
                None => tracing::info!(
                    path = %settings.path.display(),
                    "no checkpoint of this job yet: training starts at clock 0"
                ),
            }
            let writer = crate::checkpoint::CheckpointWriter::start(
                settings.path.clone(),
                &job.job,
                settings.interval,
                start.as_ref().map_or(0, |start| start.clock),
                (
                    metrics.checkpoint_clock.clone(),
                    metrics.checkpoint_failures.clone(),
                ),
            );
            (start.map(Arc::new), Some(writer))
        }
        None => (None, None),
    };
    // Told to stop (a pod's SIGTERM) while training: the next consistent copy goes to disk at
    // once, whatever the checkpoint interval.
    if let (Some(writer), Some(linger)) = (&writer, &linger) {
        let (writer, mut linger) = (writer.clone(), linger.clone());
        rt.spawn(async move {
            if linger.wait_for(|stop| *stop).await.is_ok() {
                tracing::info!("told to stop: the next consistent copy is checkpointed at once");
                writer.write_next_now();
            }
        });
    }
    let directory = Arc::new(Mutex::new(BTreeMap::new()));
    let heartbeats = Arc::new(
        Heartbeats::new(heartbeat_timeout, &registry).unwrap_or_else(|error| {
            tracing::warn!(%error, "heartbeat failures are not exported");
            Heartbeats::unregistered(heartbeat_timeout)
        }),
    );
    if !heartbeat_timeout.is_zero() {
        // Declares silent nodes even while nobody asks about them (the metric, the logs).
        let watched = heartbeats.clone();
        let every = (heartbeat_timeout / 4).max(Duration::from_millis(10));
        rt.spawn(async move {
            let mut tick = tokio::time::interval(every);
            loop {
                tick.tick().await;
                watched.sweep(std::time::Instant::now());
            }
        });
    }
    let partition_bytes = crate::control::PartitionBytes::new(&registry).unwrap_or_else(|error| {
        tracing::warn!(%error, "partition bytes are not exported");
        crate::control::PartitionBytes::unregistered()
    });
    let service = ElasticService::new(
        job.secret.clone(),
        job.job.clone(),
        job.reliable_nodes,
        directory.clone(),
        registry,
        metrics.clone(),
        heartbeats.clone(),
    );
    listener
        .set_nonblocking(true)
        .map_err(ElasticJobError::Serve)?;
    let listener = {
        let _guard = rt.enter();
        tokio::net::TcpListener::from_std(listener).map_err(ElasticJobError::Serve)?
    };
    let (stop_serving, stopped) = tokio::sync::oneshot::channel::<()>();
    let served = service.clone();
    let tls =
        crate::tls::JobTls::for_security(job.config.job.transport_security, job.secret.as_bytes());
    let refused = metrics.admin_connections_refused.clone();
    let server = rt.spawn(async move {
        let stopped = async move {
            let _ = stopped.await;
        };
        crate::admin::serve(listener, router(served), tls.as_deref(), refused, stopped).await
    });
    let stop = job.stop.clone();
    let told_to_stop = async move {
        let told = match stop {
            Some(mut stop) => stop.wait_for(|stop| *stop).await.is_ok(),
            None => false,
        };
        if !told {
            // no stop signal, or its sender gone: wait for the nodes alone
            std::future::pending::<()>().await;
        }
    };
    let waited = rt.block_on(async {
        tokio::select! {
            waited = tokio::time::timeout(job.join_timeout, service.wait_for_reliable()) => Some(waited),
            () = told_to_stop => None,
        }
    });
    let Some(waited) = waited else {
        let joined = service.status().nodes.len();
        let _ = stop_serving.send(());
        return Err(ElasticJobError::Stopped {
            joined,
            expected: job.reliable_nodes,
        });
    };
    if waited.is_err() {
        let joined = service.status().nodes.len();
        let _ = stop_serving.send(());
        return Err(ElasticJobError::JoinTimeout {
            joined,
            expected: job.reliable_nodes,
            waited: job.join_timeout,
        });
    }
    let (events, feed) = feed;
    let (reliable, transient) = service.start(events);
    let config = crate::elastic::ElasticConfig {
        reliable,
        transient,
        start,
        checkpoint: writer.clone(),
        ..job.config
    };
    tracing::info!(
        reliable = config.reliable.len(),
        transient = config.transient.len(),
        "training starts"
    );
    let tls =
        crate::tls::JobTls::for_security(config.job.transport_security, job.secret.as_bytes());
    let mut fleet = crate::control::ProcessFleet::new(
        directory,
        job.secret.as_bytes(),
        tls,
        config.job.workers as u32,
        config.job.wait_timeout,
        metrics.clone(),
    )
    .with_heartbeats(heartbeats)
    .with_partition_bytes(partition_bytes)
    .with_background_copies(job.background_copies)
    .with_checkpoint(writer.clone())
    .with_placement(service.placement());
    let outcome =
        crate::elastic::run_elastic_on(app, &config, &[], Some(&feed), &mut fleet, metrics);
    match &outcome {
        Ok(report) => {
            let phase = if report.stopped_at.is_some() {
                JobPhase::Stopped
            } else {
                JobPhase::Done
            };
            let result = JobResult {
                loss: report.run.eval.loss,
                metrics: report.run.eval.metrics.clone(),
                updates_per_second: report.run.updates_per_second,
            };
            service.finish(phase, Some(result), None, None);
        }
        Err(error) => {
            let reason = error.divergence().map(|d| d.reason());
            service.finish(JobPhase::Failed, None, Some(error.to_string()), reason);
        }
    }
    if let Some(writer) = &writer {
        // the process may exit right after: the last copy handed over is written first
        writer.flush(Duration::from_secs(60));
    }
    if let Some(mut linger) = linger {
        tracing::info!("the job ended; serving its final status until told to stop");
        rt.block_on(async {
            let _ = linger.wait_for(|done| *done).await;
        });
    }
    let _ = stop_serving.send(());
    let _ = rt.block_on(server);
    Ok(outcome?)
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_empty_job_secret_is_refused() {
        let error = check_secret("").unwrap_err();
        assert!(error.to_string().contains("EBBFLOW_JOB_SECRET"), "{error}");
        assert!(check_secret("token").is_ok());
    }

    use super::*;

    fn join(name: &str, reliable: bool, port: u16) -> JoinRequest {
        JoinRequest {
            name: name.into(),
            data_addr: format!("127.0.0.1:{port}"),
            workers: 1,
            secret: "s".into(),
            reliable,
            serves: true,
            job: "exact/10".into(),
        }
    }

    /// A service of job "exact/10" with secret "s", awaiting `reliable` nodes, declaring nodes
    /// failed after `timeout`; and its directory.
    fn service(
        reliable: u32,
        timeout: Duration,
    ) -> (
        Arc<ElasticService>,
        Arc<Mutex<BTreeMap<String, SocketAddr>>>,
    ) {
        let directory = Arc::new(Mutex::new(BTreeMap::new()));
        let service = ElasticService::new(
            "s".into(),
            "exact/10".into(),
            reliable,
            directory.clone(),
            Registry::new(),
            crate::metrics::RuntimeMetrics::unregistered(),
            Arc::new(Heartbeats::unregistered(timeout)),
        );
        (service, directory)
    }

    /// A notice for `name` with a deadline far ahead.
    fn notice(name: &str) -> NoticeRequest {
        NoticeRequest {
            name: name.into(),
            deadline_unix: u64::MAX,
            deadline_unix_ms: None,
        }
    }

    /// The status shows the fleet's placement: each partition's owner (by member index) and
    /// epoch, each member's workers and whether it serves; a reliable slot's replacement takes
    /// its member's entry, so it is shown there.
    #[test]
    fn the_status_shows_who_serves_and_trains() {
        let (service, directory) = service(1, Duration::from_secs(60));
        service.join(join("r0", true, 1)).unwrap();
        service.join(join("t0", false, 2)).unwrap();
        let (events, _feed) = std::sync::mpsc::channel();
        service.start(events);
        let status = service.status();
        assert!(status.partitions.is_empty(), "nothing placed yet");
        assert!(status.nodes.iter().all(|n| !n.serves && n.workers == 0));

        // r0 failed and was let go; its replacement joins under the same name.
        directory.lock().remove("r0");
        let replacement = service.join(join("r0", true, 3)).unwrap();
        assert_eq!(replacement.node, 0);
        *service.placement().lock() = crate::control::Placement {
            partitions: vec![("t0".into(), 3), ("r0".into(), 2)],
            workers: [("r0".to_owned(), 1), ("t0".to_owned(), 2)].into(),
        };
        let status = service.status();
        let owners: Vec<(u32, u64)> = status
            .partitions
            .iter()
            .map(|p| (p.owner, p.epoch))
            .collect();
        assert_eq!(owners, [(1, 3), (0, 2)]);
        let shown: Vec<(&str, u32, bool)> = status
            .nodes
            .iter()
            .map(|n| (n.name.as_str(), n.workers, n.serves))
            .collect();
        assert_eq!(shown, [("r0", 1, true), ("t0", 2, true)]);
        assert_eq!(status.nodes[0].data_addr, "127.0.0.1:3");
        // Cleared (a rollback, the end of the run): no owner shown.
        *service.placement().lock() = crate::control::Placement::default();
        assert!(service.status().partitions.is_empty());
    }

    #[test]
    fn heartbeats_keep_a_node_alive_and_a_silent_one_is_fenced() {
        let (service, _) = service(1, Duration::from_millis(1));
        let beat = |name: &str| {
            service.heartbeat(HeartbeatRequest {
                name: name.to_owned(),
            })
        };
        assert!(matches!(beat("zz"), Err(AdminError::LookupNode(_))));
        service.join(join("a", true, 1)).unwrap();
        let answer = beat("a").unwrap();
        assert_eq!(answer.phase, JobPhase::Joining);
        assert!(!answer.fenced);
        // Silent past the (1 ms) timeout: declared failed, fenced, and cannot join again.
        let silent_until = std::time::Instant::now() + Duration::from_millis(5);
        while std::time::Instant::now() < silent_until {
            std::hint::spin_loop();
        }
        assert!(beat("a").unwrap().fenced);
        assert!(
            matches!(service.join(join("a", true, 1)), Err(AdminError::Validate(m)) if m.contains("declared failed"))
        );
        assert_eq!(service.status().nodes.len(), 1);
    }

    #[test]
    fn joins_are_checked_and_become_events_once_training() {
        let (service, directory) = service(1, Duration::from_secs(60));
        let mut wrong = join("a", true, 1);
        wrong.secret = "x".into();
        assert_eq!(service.join(wrong), Err(AdminError::CheckSecret));
        let mut other = join("a", true, 1);
        other.job = "mf/3".into();
        assert!(
            matches!(service.join(other), Err(AdminError::Validate(m)) if m.contains("another job"))
        );
        service.join(join("a", true, 1)).unwrap();
        assert_eq!(
            service.join(join("a", true, 1)).unwrap().node,
            0,
            "idempotent"
        );
        assert!(
            service.join(join("a", true, 2)).is_err(),
            "same name, other address"
        );
        assert!(matches!(
            service.join(join("b", true, 3)),
            Err(AdminError::JoinStarted(_))
        ));
        service.join(join("t0", false, 4)).unwrap();
        let (events, feed) = std::sync::mpsc::channel();
        let (reliable, transient) = service.start(events);
        assert_eq!(
            (reliable, transient),
            (vec!["a".to_owned()], vec!["t0".to_owned()])
        );
        service.join(join("t1", false, 5)).unwrap();
        assert_eq!(
            feed.try_recv().unwrap(),
            ElasticEvent::Join {
                names: vec!["t1".into()]
            }
        );
        assert!(directory.lock().contains_key("t1"));
        assert!(matches!(
            service.notice(notice("zz")),
            Err(AdminError::LookupNode(_))
        ));
        assert!(
            matches!(service.notice(notice("a")), Err(AdminError::Validate(m)) if m.contains("last reliable node")),
        );
        assert!(service.notice(notice("t1")).unwrap().new);
        assert!(
            !service.notice(notice("t1")).unwrap().new,
            "duplicates are harmless"
        );
        assert!(matches!(
            feed.try_recv().unwrap(),
            ElasticEvent::Notice { .. }
        ));
        assert!(feed.try_recv().is_err());
    }

    /// A reliable node is a slot: its replacement joins under its name once the run let the
    /// member that held it go, and is asked to try again until then.
    #[test]
    fn a_reliable_node_is_replaced_under_its_name_once_the_run_let_it_go() {
        let (service, directory) = service(2, Duration::from_secs(60));
        service.join(join("r0", true, 1)).unwrap();
        service.join(join("r1", true, 2)).unwrap();
        // Before training a reliable name is not a slot to fill again.
        assert!(service.join(join("r1", true, 3)).is_err());
        let (events, feed) = std::sync::mpsc::channel();
        service.start(events);
        // r1 crashed; its replacement comes while the run still has it as a member.
        assert!(matches!(
            service.join(join("r1", true, 3)),
            Err(AdminError::Retry(m)) if m.contains("still a member")
        ));
        assert!(feed.try_recv().is_err(), "no event for a refused join");
        // The run let r1 go (the fleet released it): the replacement is a new member.
        directory.lock().remove("r1");
        assert_eq!(service.join(join("r1", true, 3)).unwrap().node, 1);
        assert_eq!(
            feed.try_recv().unwrap(),
            ElasticEvent::JoinReliable {
                names: vec!["r1".into()]
            }
        );
        assert_eq!(directory.lock()["r1"].port(), 3);
        assert_eq!(
            service.join(join("r1", true, 3)).unwrap().node,
            1,
            "idempotent"
        );
        assert!(feed.try_recv().is_err());
        let status = service.status();
        assert_eq!(status.nodes.len(), 2);
        assert_eq!(status.nodes[1].data_addr, "127.0.0.1:3");
        // A reliable name the job never had cannot join once training.
        assert!(matches!(
            service.join(join("r2", true, 4)),
            Err(AdminError::JoinStarted(_))
        ));
        // A transient name is never a slot.
        service.join(join("t0", false, 5)).unwrap();
        feed.try_recv().unwrap();
        directory.lock().remove("t0");
        for port in [5, 6] {
            assert!(matches!(
                service.join(join("t0", false, port)),
                Err(AdminError::Validate(m)) if m.contains("already left")
            ));
        }
        assert!(feed.try_recv().is_err());
        // A reliable node may leave while another stays; then the other is the last one.
        assert!(service.notice(notice("r0")).unwrap().new);
        assert!(matches!(
            feed.try_recv().unwrap(),
            ElasticEvent::Notice { .. }
        ));
        assert!(matches!(
            service.notice(notice("r1")),
            Err(AdminError::Validate(m)) if m.contains("last reliable node")
        ));
        // r0's replacement, once the run let r0 go, may be told to leave again.
        directory.lock().remove("r0");
        service.join(join("r0", true, 7)).unwrap();
        feed.try_recv().unwrap();
        assert!(
            service.notice(notice("r0")).unwrap().new,
            "a new member's notice is new"
        );
    }
}
