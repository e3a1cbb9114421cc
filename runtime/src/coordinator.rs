//! The coordinator: static membership, the partition map, the admin HTTP API and the final
//! evaluation of a multi-process job.
//!
//! Nodes join (`POST /join`) with the job secret; once the expected number joined, partitions are
//! spread round-robin over them (epoch 1) and global worker ids assigned in join order. Nodes fetch
//! the plan (`GET /plan`), train, and report (`POST /report`). When every node reported, the
//! coordinator copies the final parameters over the data plane, evaluates them and publishes the
//! result in `GET /status`. Notices are validated and recorded; an elastic job's coordinator
//! (`elastic_coordinator`) acts on them.
//! Every call but `/metrics` carries the job secret: `join` and `report` in their bodies, the
//! others (`status`, `plan`, `notice`, `stop`) as `Authorization: Bearer <secret>`. `status` and
//! `plan` list the nodes' data-plane addresses and the partition owners, which are nobody's
//! business outside the job.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::Arc;

use axum::Json;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use ebbflow_runtime_api::{
    Ack, ApiError, FailureReason, JobPhase, JobResult, JoinRequest, JoinResponse, NodeInfo,
    NoticeRequest, NoticeResponse, PartitionOwner, PlanResponse, ReportRequest, StatusResponse,
};
use parking_lot::Mutex;
use prometheus::Registry;
use serde::Deserialize;
use thiserror::Error;

use crate::app::{EvalReport, TableSpec};
use crate::client::{ClientConfig, NodeAddrs, fetch_snapshot};
use crate::local::RunReport;
use crate::message::secrets_match;
use crate::partition::{PartitionEntry, PartitionMap};
use crate::snapshot::ParamSnapshot;
use crate::worker::WorkerReport;

/// Checks the `Authorization: Bearer <job secret>` of a call that changes the job.
pub fn check_bearer(
    headers: &axum::http::HeaderMap,
    secret: &str,
    call: &str,
) -> Result<(), AdminError> {
    let token = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "))
        .unwrap_or("");
    if secrets_match(secret.as_bytes(), token.as_bytes()) {
        Ok(())
    } else {
        tracing::warn!(call, "admin call without the job secret refused");
        Err(AdminError::CheckSecret)
    }
}

/// Errors answered by the admin API.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum AdminError {
    /// The request did not carry the job secret.
    #[error("the job secret does not match")]
    CheckSecret,
    /// The node or name is not part of the job.
    #[error("unknown node {0}")]
    LookupNode(String),
    /// Membership is static once training started.
    #[error("the job already started; node {0} cannot join")]
    JoinStarted(String),
    /// A request field is invalid.
    #[error("invalid request: {0}")]
    Validate(String),
    /// Valid, but not now: the same request succeeds later (a replacement node whose
    /// predecessor the run has not let go yet).
    #[error("try again: {0}")]
    Retry(String),
}

impl AdminError {
    /// Static label for metrics and the error body.
    pub fn category(&self) -> &'static str {
        match self {
            AdminError::CheckSecret => "bad_secret",
            AdminError::LookupNode(_) => "unknown_node",
            AdminError::JoinStarted(_) => "job_started",
            AdminError::Validate(_) => "invalid_request",
            AdminError::Retry(_) => "retry",
        }
    }

    fn status(&self) -> StatusCode {
        match self {
            AdminError::CheckSecret => StatusCode::UNAUTHORIZED,
            AdminError::LookupNode(_) => StatusCode::NOT_FOUND,
            AdminError::JoinStarted(_) => StatusCode::CONFLICT,
            AdminError::Validate(_) => StatusCode::BAD_REQUEST,
            AdminError::Retry(_) => StatusCode::SERVICE_UNAVAILABLE,
        }
    }
}

impl IntoResponse for AdminError {
    fn into_response(self) -> Response {
        let body = ApiError {
            category: self.category().to_owned(),
            message: self.to_string(),
        };
        (self.status(), Json(body)).into_response()
    }
}

/// Evaluates the final parameters given the job's total worker count (the app's `evaluate`,
/// type-erased).
pub type Evaluator = Arc<dyn Fn(&ParamSnapshot, usize) -> EvalReport + Send + Sync>;

/// Settings of a coordinator.
#[derive(Clone)]
pub struct CoordinatorConfig {
    /// Nodes to wait for before training starts.
    pub expected_nodes: u32,
    /// Partitions of the key space.
    pub partitions: u32,
    /// Clocks to run.
    pub clocks: u64,
    /// SSP staleness.
    pub staleness: u64,
    /// The job secret.
    pub secret: String,
    /// The app's tables (to copy the final parameters).
    pub specs: Vec<TableSpec>,
    /// The app's evaluation.
    pub evaluator: Evaluator,
    /// TLS of the data plane ([`crate::tls`]), to fetch the final parameters from the nodes.
    pub tls: Option<Arc<crate::tls::JobTls>>,
}

#[derive(Debug, Default)]
struct Membership {
    phase: Option<JobPhase>,
    nodes: Vec<NodeInfo>,
    map: Option<PartitionMap>,
    notices: BTreeMap<u32, u64>,
    reports: BTreeMap<u32, ReportRequest>,
    report: Option<RunReport>,
    error: Option<String>,
    error_reason: Option<FailureReason>,
    /// Nodes that have seen a terminal phase (the coordinator may exit once all did).
    released: BTreeSet<u32>,
}

/// Shared state of the coordinator's handlers.
pub struct Coordinator {
    config: CoordinatorConfig,
    state: Mutex<Membership>,
    registry: Registry,
    changed: tokio::sync::Notify,
}

fn phase(m: &Membership) -> JobPhase {
    m.phase.unwrap_or(JobPhase::Joining)
}

fn is_terminal(phase: JobPhase) -> bool {
    matches!(phase, JobPhase::Done | JobPhase::Stopped | JobPhase::Failed)
}

impl Coordinator {
    /// A coordinator waiting for its nodes; metrics are served from `registry`.
    pub fn new(config: CoordinatorConfig, registry: Registry) -> Arc<Self> {
        Arc::new(Self {
            config,
            state: Mutex::new(Membership::default()),
            registry,
            changed: tokio::sync::Notify::new(),
        })
    }

    fn check_secret(&self, secret: &str) -> Result<(), AdminError> {
        if secrets_match(self.config.secret.as_bytes(), secret.as_bytes()) {
            Ok(())
        } else {
            Err(AdminError::CheckSecret)
        }
    }

    /// Checks the `Authorization: Bearer <job secret>` of a call that changes the job.
    pub fn authorize(&self, headers: &axum::http::HeaderMap, call: &str) -> Result<(), AdminError> {
        check_bearer(headers, &self.config.secret, call)
    }

    /// Handles a join.
    pub fn join(&self, request: JoinRequest) -> Result<JoinResponse, AdminError> {
        if let Err(error) = self.check_secret(&request.secret) {
            tracing::warn!(name = %request.name, "join with a wrong job secret refused");
            return Err(error);
        }
        if request.workers == 0 && !request.serves {
            return Err(AdminError::Validate(
                "a node must run workers or serve partitions".into(),
            ));
        }
        if request.data_addr.parse::<SocketAddr>().is_err() {
            return Err(AdminError::Validate(format!(
                "data_addr {:?} is not host:port",
                request.data_addr
            )));
        }
        let mut m = self.state.lock();
        if let Some(existing) = m.nodes.iter().find(|n| n.name == request.name) {
            return Ok(JoinResponse {
                node: existing.node,
            });
        }
        if phase(&m) != JobPhase::Joining {
            return Err(AdminError::JoinStarted(request.name));
        }
        let node = m.nodes.len() as u32;
        let worker_base = m.nodes.iter().map(|n| n.workers).sum();
        m.nodes.push(NodeInfo {
            node,
            name: request.name.clone(),
            data_addr: request.data_addr,
            workers: request.workers,
            worker_base,
            finished: false,
            serves: request.serves,
        });
        tracing::info!(node, name = %request.name, "node joined");
        if m.nodes.len() as u32 == self.config.expected_nodes {
            let owners: Vec<u32> = m
                .nodes
                .iter()
                .filter(|n| n.serves)
                .map(|n| n.node)
                .collect();
            let workers: u32 = m.nodes.iter().map(|n| n.workers).sum();
            match PartitionMap::round_robin(self.config.partitions, &owners) {
                Ok(map) if workers > 0 => {
                    m.map = Some(map);
                    m.phase = Some(JobPhase::Training);
                    tracing::info!(
                        nodes = m.nodes.len(),
                        servers = owners.len(),
                        partitions = self.config.partitions,
                        "all nodes joined, training"
                    );
                }
                Ok(_) => self.fail(&mut m, "no node runs workers".into()),
                Err(error) => self.fail(&mut m, format!("cannot place partitions: {error}")),
            }
        }
        Ok(JoinResponse { node })
    }

    fn fail(&self, m: &mut Membership, error: String) {
        tracing::warn!(%error, "job failed");
        m.error = Some(error);
        m.phase = Some(JobPhase::Failed);
    }

    /// The plan for a node (not ready while joining).
    pub fn plan(&self, node: u32) -> Result<PlanResponse, AdminError> {
        let m = self.state.lock();
        if node as usize >= m.nodes.len() {
            return Err(AdminError::LookupNode(node.to_string()));
        }
        let partitions = m
            .map
            .as_ref()
            .map(|map| {
                map.entries()
                    .iter()
                    .map(|e| PartitionOwner {
                        owner: e.owner,
                        epoch: e.epoch,
                    })
                    .collect()
            })
            .unwrap_or_default();
        Ok(PlanResponse {
            ready: m.map.is_some(),
            partitions,
            nodes: m.nodes.clone(),
            total_workers: m.nodes.iter().map(|n| n.workers).sum(),
            clocks: self.config.clocks,
            staleness: self.config.staleness,
        })
    }

    /// Records a node's worker reports; evaluates once every node reported.
    pub fn report(self: &Arc<Self>, request: ReportRequest) -> Result<Ack, AdminError> {
        self.check_secret(&request.secret)?;
        let mut m = self.state.lock();
        let node = request.node;
        let Some(info) = m.nodes.get_mut(node as usize) else {
            return Err(AdminError::LookupNode(node.to_string()));
        };
        info.finished = true;
        if let Some(error) = &request.error {
            tracing::warn!(node, %error, "node reported failed workers");
            m.error = Some(format!("node {node}: {error}"));
            m.phase = Some(JobPhase::Failed);
        }
        m.reports.insert(node, request);
        if phase(&m) == JobPhase::Training && m.reports.len() == m.nodes.len() {
            m.phase = Some(JobPhase::Evaluating);
            let coordinator = self.clone();
            tokio::task::spawn_blocking(move || coordinator.evaluate());
        }
        drop(m);
        self.changed.notify_waiters();
        Ok(Ack { ok: true })
    }

    /// Copies the final parameters from the nodes and evaluates them.
    fn evaluate(&self) {
        let (map, addrs, reports, total_workers) = {
            let m = self.state.lock();
            let addrs: NodeAddrs = m
                .nodes
                .iter()
                .filter_map(|n| Some((n.node, n.data_addr.parse().ok()?)))
                .collect();
            let total_workers = m.nodes.iter().map(|n| n.workers as usize).sum();
            (m.map.clone(), addrs, m.reports.clone(), total_workers)
        };
        let workers: Vec<WorkerReport> = reports
            .values()
            .flat_map(|r| {
                r.workers
                    .iter()
                    .zip(&r.wait_seconds)
                    .map(|(clocks, wait)| WorkerReport {
                        first_clock: 0,
                        stats: clocks
                            .iter()
                            .map(|c| crate::app::ClockStats {
                                updates: c.updates,
                                loss_sum: c.loss_sum,
                                loss_count: c.loss_count,
                            })
                            .collect(),
                        clock_end: clocks.iter().map(|c| c.end_seconds).collect(),
                        wait_seconds: *wait,
                        diverged: None,
                    })
            })
            .collect();
        let client = ClientConfig {
            secret: self.config.secret.clone().into_bytes(),
            node: u32::MAX,
            max_frame_bytes: crate::frame::DEFAULT_MAX_FRAME_BYTES,
            timeout: std::time::Duration::from_secs(600),
            tls: self.config.tls.clone(),
        };
        let outcome = map
            .ok_or_else(|| "no partition map".to_owned())
            .and_then(|map| {
                fetch_snapshot(&map, &addrs, &self.config.specs, &client).map_err(|e| e.to_string())
            });
        let mut m = self.state.lock();
        match outcome {
            Ok(snapshot) => {
                let mut report = RunReport::from_workers(self.config.clocks, &workers);
                report.parameter_bytes = snapshot.parameter_bytes();
                report.node_peak_rss_bytes = reports.values().map(|r| r.peak_rss_bytes).collect();
                report.finish_with(
                    (self.config.evaluator)(&snapshot, total_workers),
                    snapshot,
                    false,
                );
                if let Some(divergence) = report.divergence(&workers) {
                    tracing::error!(%divergence, "the job failed");
                    m.error = Some(divergence.to_string());
                    m.error_reason = Some(divergence.reason());
                    m.phase = Some(JobPhase::Failed);
                } else {
                    tracing::info!(
                        loss = report.eval.loss,
                        updates_per_second = report.updates_per_second,
                        "job done"
                    );
                    m.report = Some(report);
                    m.phase = Some(JobPhase::Done);
                }
            }
            Err(error) => {
                tracing::warn!(%error, "final evaluation failed");
                m.error = Some(format!("final evaluation failed: {error}"));
                m.phase = Some(JobPhase::Failed);
            }
        }
        drop(m);
        self.changed.notify_waiters();
    }

    /// Records an eviction notice (idempotent; acting on it is issue 4's elasticity).
    pub fn notice(&self, request: NoticeRequest) -> Result<NoticeResponse, AdminError> {
        let mut m = self.state.lock();
        let node = m
            .nodes
            .iter()
            .find(|n| n.name == request.name)
            .map(|n| n.node)
            .ok_or(AdminError::LookupNode(request.name.clone()))?;
        let new = m.notices.insert(node, request.deadline_unix) != Some(request.deadline_unix);
        tracing::info!(
            node,
            deadline = request.deadline_unix,
            new,
            "eviction notice recorded"
        );
        Ok(NoticeResponse { node, new })
    }

    /// Stops the job.
    pub fn stop(&self) -> Ack {
        let mut m = self.state.lock();
        if !is_terminal(phase(&m)) {
            m.phase = Some(JobPhase::Stopped);
            tracing::info!("job stopped on request");
        }
        drop(m);
        self.changed.notify_waiters();
        Ack { ok: true }
    }

    /// Current status; `seen_by` marks that node as having seen a terminal phase.
    pub fn status(&self, seen_by: Option<u32>) -> StatusResponse {
        let mut m = self.state.lock();
        let phase = phase(&m);
        if let Some(node) = seen_by.filter(|_| is_terminal(phase)) {
            m.released.insert(node);
        }
        StatusResponse {
            phase,
            expected_nodes: self.config.expected_nodes,
            nodes: m.nodes.clone(),
            partitions: m
                .map
                .as_ref()
                .map(|map| {
                    map.entries()
                        .iter()
                        .map(|e: &PartitionEntry| PartitionOwner {
                            owner: e.owner,
                            epoch: e.epoch,
                        })
                        .collect()
                })
                .unwrap_or_default(),
            notices: m.notices.iter().map(|(n, d)| (*n, *d)).collect(),
            result: m.report.as_ref().map(|r| JobResult {
                loss: r.eval.loss,
                metrics: r.eval.metrics.clone(),
                updates_per_second: r.updates_per_second,
            }),
            error: m.error.clone(),
            failure_reason: m.error_reason,
            progress: None,
        }
    }

    /// The final report, once done.
    pub fn run_report(&self) -> Option<RunReport> {
        self.state.lock().report.clone()
    }

    /// True once the job is terminal and every node has seen it (the coordinator may exit).
    pub fn finished(&self) -> bool {
        let m = self.state.lock();
        is_terminal(phase(&m)) && m.nodes.iter().all(|n| m.released.contains(&n.node))
    }

    /// Waits until the state changes (join, report, evaluation, stop).
    pub async fn changed(&self) {
        self.changed.notified().await;
    }
}

#[derive(Debug, Deserialize)]
struct NodeQuery {
    node: Option<u32>,
}

#[tracing::instrument(skip_all)]
async fn status_handler(
    State(c): State<Arc<Coordinator>>,
    headers: axum::http::HeaderMap,
    Query(q): Query<NodeQuery>,
) -> Result<Json<StatusResponse>, AdminError> {
    c.authorize(&headers, "status")?;
    Ok(Json(c.status(q.node)))
}

#[tracing::instrument(skip_all)]
async fn join_handler(
    State(c): State<Arc<Coordinator>>,
    Json(request): Json<JoinRequest>,
) -> Result<Json<JoinResponse>, AdminError> {
    let response = c.join(request).map(Json);
    c.changed.notify_waiters();
    response
}

#[tracing::instrument(skip_all)]
async fn plan_handler(
    State(c): State<Arc<Coordinator>>,
    headers: axum::http::HeaderMap,
    Query(q): Query<NodeQuery>,
) -> Result<Json<PlanResponse>, AdminError> {
    c.authorize(&headers, "plan")?;
    let node = q
        .node
        .ok_or_else(|| AdminError::Validate("missing ?node=".into()))?;
    c.plan(node).map(Json)
}

#[tracing::instrument(skip_all)]
async fn report_handler(
    State(c): State<Arc<Coordinator>>,
    Json(request): Json<ReportRequest>,
) -> Result<Json<Ack>, AdminError> {
    c.report(request).map(Json)
}

#[tracing::instrument(skip_all)]
async fn notice_handler(
    State(c): State<Arc<Coordinator>>,
    headers: axum::http::HeaderMap,
    Json(request): Json<NoticeRequest>,
) -> Result<Json<NoticeResponse>, AdminError> {
    c.authorize(&headers, "notice")?;
    c.notice(request).map(Json)
}

#[tracing::instrument(skip_all)]
async fn stop_handler(
    State(c): State<Arc<Coordinator>>,
    headers: axum::http::HeaderMap,
) -> Result<Json<Ack>, AdminError> {
    c.authorize(&headers, "stop")?;
    Ok(Json(c.stop()))
}

async fn metrics_handler(State(c): State<Arc<Coordinator>>) -> String {
    crate::metrics::render(&c.registry)
}

/// The admin HTTP API router.
pub fn router(coordinator: Arc<Coordinator>) -> axum::Router {
    axum::Router::new()
        .route("/status", get(status_handler))
        .route("/join", post(join_handler))
        .route("/plan", get(plan_handler))
        .route("/report", post(report_handler))
        .route("/notice", post(notice_handler))
        .route("/stop", post(stop_handler))
        .route("/metrics", get(metrics_handler))
        .with_state(coordinator)
}

/// A router serving only `/metrics` from `registry` (node processes).
pub fn metrics_router(registry: Registry) -> axum::Router {
    axum::Router::new().route(
        "/metrics",
        get(move || async move { crate::metrics::render(&registry) }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn coordinator(nodes: u32) -> Arc<Coordinator> {
        let config = CoordinatorConfig {
            expected_nodes: nodes,
            partitions: 4,
            clocks: 3,
            staleness: 0,
            secret: "s3cret".into(),
            specs: vec![],
            evaluator: Arc::new(|_, _| EvalReport::default()),
            tls: None,
        };
        Coordinator::new(config, Registry::new())
    }

    fn join(name: &str, secret: &str) -> JoinRequest {
        JoinRequest {
            name: name.into(),
            data_addr: "127.0.0.1:9".into(),
            workers: 2,
            secret: secret.into(),
            reliable: true,
            serves: true,
            job: String::new(),
        }
    }

    #[test]
    fn membership_is_static_and_bad_requests_are_clear_errors() {
        let c = coordinator(2);
        assert_eq!(c.join(join("a", "wrong")), Err(AdminError::CheckSecret));
        assert_eq!(c.join(join("a", "s3cret")).unwrap().node, 0);
        assert!(!c.plan(0).unwrap().ready);
        assert_eq!(
            c.join(join("a", "s3cret")).unwrap().node,
            0,
            "rejoining is idempotent"
        );
        assert_eq!(c.join(join("b", "s3cret")).unwrap().node, 1);
        let plan = c.plan(1).unwrap();
        assert!(plan.ready);
        assert_eq!(
            (
                plan.total_workers,
                plan.nodes[1].worker_base,
                plan.partitions.len()
            ),
            (4, 2, 4)
        );
        assert_eq!(
            c.join(join("c", "s3cret")).unwrap_err().category(),
            "job_started"
        );
        assert_eq!(c.plan(7).unwrap_err().category(), "unknown_node");
        let mut bad = join("d", "s3cret");
        bad.data_addr = "nowhere".into();
        assert_eq!(c.join(bad).unwrap_err().category(), "invalid_request");
        assert_eq!(
            c.notice(NoticeRequest {
                name: "x".into(),
                deadline_unix: 5,
                deadline_unix_ms: None,
            })
            .unwrap_err()
            .category(),
            "unknown_node"
        );
        assert!(
            c.notice(NoticeRequest {
                name: "b".into(),
                deadline_unix: 5,
                deadline_unix_ms: None,
            })
            .unwrap()
            .new
        );
        assert!(
            !c.notice(NoticeRequest {
                name: "b".into(),
                deadline_unix: 5,
                deadline_unix_ms: None,
            })
            .unwrap()
            .new
        );
        assert_eq!(c.status(None).notices, vec![(1, 5)]);
        c.stop();
        assert_eq!(c.status(Some(0)).phase, JobPhase::Stopped);
        assert!(!c.finished());
        c.status(Some(1));
        assert!(c.finished());
    }
}

#[cfg(test)]
mod http_tests {
    use super::*;

    /// The admin API over real HTTP on port 0: status, errors with categories, metrics text.
    #[tokio::test]
    async fn admin_api_answers_json_and_metrics() {
        let registry = Registry::new();
        let metrics = crate::metrics::RuntimeMetrics::register(&registry).unwrap();
        metrics.iterations.inc_by(3);
        let config = CoordinatorConfig {
            expected_nodes: 1,
            partitions: 2,
            clocks: 1,
            staleness: 0,
            secret: "k".into(),
            specs: vec![],
            evaluator: Arc::new(|_, _| EvalReport::default()),
            tls: None,
        };
        let coordinator = Coordinator::new(config, registry);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let server = tokio::spawn(async move { axum::serve(listener, router(coordinator)).await });
        let http = crate::admin::client(None).build().unwrap();
        // status and plan name the nodes' addresses: the secret is required
        for path in ["/status", "/plan?node=0"] {
            let open = http.get(format!("{base}{path}")).send().await.unwrap();
            assert_eq!(open.status(), StatusCode::UNAUTHORIZED, "{path}");
            let wrong = http
                .get(format!("{base}{path}"))
                .header("authorization", ebbflow_runtime_api::bearer("nope"))
                .send()
                .await
                .unwrap();
            assert_eq!(wrong.status(), StatusCode::UNAUTHORIZED, "{path}");
            let body: ApiError = wrong.json().await.unwrap();
            assert_eq!(body.category, "bad_secret");
        }
        let status: StatusResponse = http
            .get(format!("{base}/status"))
            .header("authorization", ebbflow_runtime_api::bearer("k"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(
            (status.phase, status.expected_nodes),
            (JobPhase::Joining, 1)
        );
        let join = JoinRequest {
            name: "n".into(),
            data_addr: "127.0.0.1:1".into(),
            workers: 1,
            secret: "nope".into(),
            reliable: true,
            serves: true,
            job: String::new(),
        };
        let refused = http
            .post(format!("{base}/join"))
            .json(&join)
            .send()
            .await
            .unwrap();
        assert_eq!(refused.status(), StatusCode::UNAUTHORIZED);
        let body: ApiError = refused.json().await.unwrap();
        assert_eq!(body.category, "bad_secret");
        let joined: JoinResponse = http
            .post(format!("{base}/join"))
            .json(&JoinRequest {
                secret: "k".into(),
                ..join
            })
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(joined.node, 0);
        let plan: PlanResponse = http
            .get(format!("{base}/plan?node=0"))
            .header("authorization", ebbflow_runtime_api::bearer("k"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert!(plan.ready);
        let missing = http
            .get(format!("{base}/plan"))
            .header("authorization", ebbflow_runtime_api::bearer("k"))
            .send()
            .await
            .unwrap();
        assert_eq!(missing.status(), StatusCode::BAD_REQUEST);
        let ghost = NoticeRequest {
            name: "ghost".into(),
            deadline_unix: 1,
            deadline_unix_ms: None,
        };
        let unauthenticated = http
            .post(format!("{base}/notice"))
            .json(&ghost)
            .send()
            .await
            .unwrap();
        assert_eq!(unauthenticated.status(), StatusCode::UNAUTHORIZED);
        let notice = http
            .post(format!("{base}/notice"))
            .header("authorization", ebbflow_runtime_api::bearer("k"))
            .json(&ghost)
            .send()
            .await
            .unwrap();
        assert_eq!(notice.status(), StatusCode::NOT_FOUND);
        let text = http
            .get(format!("{base}/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert!(
            text.contains("ebbflow_runtime_iterations_total 3"),
            "{text}"
        );
        let refused = http.post(format!("{base}/stop")).send().await.unwrap();
        assert_eq!(refused.status(), StatusCode::UNAUTHORIZED);
        let stopped: Ack = http
            .post(format!("{base}/stop"))
            .header("authorization", ebbflow_runtime_api::bearer("k"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert!(stopped.ok);
        let status: StatusResponse = http
            .get(format!("{base}/status"))
            .header("authorization", ebbflow_runtime_api::bearer("k"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(status.phase, JobPhase::Stopped);
        server.abort();
    }
}
