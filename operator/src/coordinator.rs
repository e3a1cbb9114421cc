//! Client side of the runtime coordinator's admin HTTP API (types from
//! `ebbflow-runtime-api`): `GET /status`, `POST /notice`, `POST /stop`.

use std::time::Duration;

use ebbflow_runtime_api::{JobPhase, NoticeRequest, StatusResponse};
use k8s_openapi::jiff::Timestamp;
use serde::Serialize;

/// Port of the coordinator's admin HTTP API inside a runtime pod.
pub const ADMIN_PORT: u16 = 7070;

/// Port of the runtime's TCP data plane inside a runtime pod.
pub const DATA_PORT: u16 = 7071;

/// Port of a runtime pod's Prometheus `/metrics`, and nothing else (the per-job
/// NetworkPolicy opens it to any scraper, the other two to the job and the operator only).
pub use ebbflow_job::run::pod::METRICS_PORT;

/// What the operator takes from a coordinator's status.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CoordinatorStatus {
    /// AgileML stage (1, 2 or 3), when the coordinator reports one.
    pub stage: Option<u8>,
    /// Completed iterations (clocks), when reported.
    pub iteration: Option<u64>,
    /// Training loss: the last clock's while training, the final evaluation's once done.
    pub loss: Option<f64>,
    /// True once training finished (a stop criterion was met).
    pub finished: bool,
    /// True once the job stopped on request (`/stop`) with its final evaluation.
    pub stopped: bool,
    /// Why training ended, when `finished` (CamelCase, e.g. IterationsReached).
    pub reason: Option<String>,
    /// Set when training failed, with the coordinator's description.
    pub failed: Option<String>,
    /// The condition reason of a failure the runtime names (`Diverged`), when `failed`.
    pub failed_reason: Option<String>,
    /// Runtime nodes (pod names) that joined.
    pub members: Vec<String>,
    /// Partition migrations done so far.
    pub migrations: u64,
    /// Rollbacks to the last consistent clock so far.
    pub rollbacks: u64,
    /// Reliable member nodes the runtime counts, when an elastic coordinator reports them.
    pub reliable_nodes: Option<u32>,
    /// Transient member nodes the runtime counts (joined and not gone), when reported.
    pub transient_nodes: Option<u32>,
    /// Transient nodes the runtime switched in so far, when reported.
    pub transient_nodes_added: Option<u64>,
}

impl CoordinatorStatus {
    /// Whether the run is over: finished, stopped on request or failed.
    pub fn ended(&self) -> bool {
        self.finished || self.stopped || self.failed.is_some()
    }
}

impl From<StatusResponse> for CoordinatorStatus {
    /// An elastic coordinator's `progress` gives the stage, the iteration (its consistent
    /// clock: every partition holds it, and it falls back on a rollback), the migration and
    /// rollback counts and the member nodes per tier; a static coordinator reports none of them.
    fn from(response: StatusResponse) -> Self {
        let progress = response.progress.as_ref();
        Self {
            // stage 0: no segment has started yet (a coordinator resuming from its
            // checkpoint reports its clock first); the job's status takes 1 to 3 only
            stage: progress.map(|p| p.stage).filter(|s| (1..=3).contains(s)),
            iteration: progress.map(|p| p.clock),
            loss: response
                .result
                .as_ref()
                .map(|result| result.loss)
                .or(progress.and_then(|p| p.loss)),
            finished: response.phase == JobPhase::Done,
            stopped: response.phase == JobPhase::Stopped,
            reason: (response.phase == JobPhase::Done).then(|| "StopCriterionMet".to_owned()),
            failed: (response.phase == JobPhase::Failed).then(|| {
                response
                    .error
                    .clone()
                    .unwrap_or_else(|| "training failed".to_owned())
            }),
            failed_reason: (response.phase == JobPhase::Failed)
                .then_some(response.failure_reason)
                .flatten()
                .map(|reason| reason.as_str().to_owned()),
            members: response
                .nodes
                .iter()
                .map(|node| node.name.clone())
                .collect(),
            migrations: progress.map_or(0, |p| p.partitions_migrated),
            rollbacks: progress.map_or(0, |p| p.rollbacks),
            reliable_nodes: progress.map(|p| p.reliable_nodes),
            transient_nodes: progress.map(|p| p.transient_nodes),
            transient_nodes_added: progress.map(|p| p.transient_nodes_added),
        }
    }
}

/// The wire notice for `instance` leaving at `leaves_at` (whole seconds, rounded down so the
/// coordinator never plans with more time than there is).
pub fn notice_request(instance: &str, leaves_at: Timestamp) -> NoticeRequest {
    NoticeRequest {
        name: instance.to_owned(),
        deadline_unix: u64::try_from(leaves_at.as_second()).unwrap_or(0),
        deadline_unix_ms: None,
    }
}

/// Errors talking to a coordinator.
#[derive(Debug, thiserror::Error)]
pub enum CoordinatorError {
    /// The request did not complete (connection refused, timeout, DNS).
    #[error("coordinator at {url} unreachable: {source}")]
    Unreachable {
        /// The URL called.
        url: String,
        /// The transport error.
        source: reqwest::Error,
    },
    /// The coordinator answered with a non-success status.
    #[error("coordinator at {url} answered {status}")]
    Rejected {
        /// The URL called.
        url: String,
        /// HTTP status code.
        status: u16,
    },
    /// The job's coordinator is served over TLS, and the job's token (its key) is not known.
    #[error("coordinator at {url} is served over TLS, and the job's token is not known")]
    NoKey {
        /// The URL called.
        url: String,
    },
    /// The answer was not the expected JSON.
    #[error("coordinator at {url} sent an unreadable answer: {source}")]
    Decode {
        /// The URL called.
        url: String,
        /// The decoding error.
        source: reqwest::Error,
    },
}

/// Sends `request` to `url`, authenticated with the job's token when there is one (the job's
/// data-plane token is also its admin secret).
async fn send(
    mut request: reqwest::RequestBuilder,
    url: &str,
    token: Option<&str>,
) -> Result<reqwest::Response, CoordinatorError> {
    if let Some(token) = token {
        request = request.header(
            reqwest::header::AUTHORIZATION,
            ebbflow_runtime_api::bearer(token),
        );
    }
    request
        .send()
        .await
        .map_err(|source| CoordinatorError::Unreachable {
            url: url.to_owned(),
            source,
        })
}

/// HTTP client for coordinators of any job; cheap to clone.
///
/// A job with TLS (an `https://` base URL) is reached by a client that accepts only a
/// coordinator holding that job's key (derived from its token, as the runtime derives it), built
/// for the call: one key per job, and a call every few seconds per job at most, so a cache would
/// save about a millisecond per call and hold every job's key.
#[derive(Clone, Debug)]
pub struct CoordinatorClient {
    http: reqwest::Client,
    timeout: Duration,
}

impl CoordinatorClient {
    /// A client whose every request times out after `timeout`.
    pub fn new(timeout: Duration) -> Result<Self, reqwest::Error> {
        let http = ebbflow_runtime::admin::client(None)
            .timeout(timeout)
            .connect_timeout(timeout)
            .build()?;
        Ok(Self { http, timeout })
    }

    /// The client for the coordinator at `url`: pinned to the job's key for `https://`.
    fn http_for(
        &self,
        url: &str,
        token: Option<&str>,
    ) -> Result<reqwest::Client, CoordinatorError> {
        if !url.starts_with("https://") {
            return Ok(self.http.clone());
        }
        let token = token.ok_or_else(|| CoordinatorError::NoKey {
            url: url.to_owned(),
        })?;
        let tls = ebbflow_runtime::tls::JobTls::new(token.as_bytes());
        ebbflow_runtime::admin::client(Some(&tls))
            .timeout(self.timeout)
            .connect_timeout(self.timeout)
            .build()
            .map_err(|source| CoordinatorError::Unreachable {
                url: url.to_owned(),
                source,
            })
    }

    /// `GET {base}/status`, authenticated with the job's token.
    pub async fn status(
        &self,
        base: &str,
        token: Option<&str>,
    ) -> Result<CoordinatorStatus, CoordinatorError> {
        let url = format!("{}/status", base.trim_end_matches('/'));
        let response = send(self.http_for(&url, token)?.get(&url), &url, token).await?;
        let response = check_status(&url, response)?;
        response
            .json::<StatusResponse>()
            .await
            .map(CoordinatorStatus::from)
            .map_err(|source| CoordinatorError::Decode { url, source })
    }

    /// `POST {base}/notice`, authenticated with the job's token.
    pub async fn notice(
        &self,
        base: &str,
        token: Option<&str>,
        notice: &NoticeRequest,
    ) -> Result<(), CoordinatorError> {
        self.post(base, "/notice", token, Some(notice)).await
    }

    /// `POST {base}/stop`, authenticated with the job's token.
    pub async fn stop(&self, base: &str, token: Option<&str>) -> Result<(), CoordinatorError> {
        self.post::<()>(base, "/stop", token, None).await
    }

    async fn post<T: Serialize>(
        &self,
        base: &str,
        path: &str,
        token: Option<&str>,
        body: Option<&T>,
    ) -> Result<(), CoordinatorError> {
        let url = format!("{}{path}", base.trim_end_matches('/'));
        let mut request = self.http_for(&url, token)?.post(&url);
        if let Some(body) = body {
            request = request.json(body);
        }
        let response = send(request, &url, token).await?;
        check_status(&url, response).map(drop)
    }
}

fn check_status(
    url: &str,
    response: reqwest::Response,
) -> Result<reqwest::Response, CoordinatorError> {
    if response.status().is_success() {
        Ok(response)
    } else {
        Err(CoordinatorError::Rejected {
            url: url.to_owned(),
            status: response.status().as_u16(),
        })
    }
}

/// Name of the job's headless coordinator Service.
pub fn coordinator_service_name(job: &str) -> String {
    format!("{job}-coordinator")
}

/// Base URL of the coordinator of job `name` in `namespace`, reached through the job's headless
/// coordinator Service (`https://` when the job's transport security is `tls`), unless
/// `override_url` points every job elsewhere (tests, port-forwards).
pub fn coordinator_url(
    name: &str,
    namespace: &str,
    tls: bool,
    override_url: Option<&str>,
) -> String {
    match override_url {
        Some(url) => url.trim_end_matches('/').to_owned(),
        None => format!(
            "{}://{}.{namespace}.svc:{ADMIN_PORT}",
            ebbflow_runtime::admin::scheme(tls),
            coordinator_service_name(name)
        ),
    }
}

/// Whether the job's admin API and data plane use TLS (`spec.runtime.transportSecurity`,
/// `tls` when unset).
pub fn uses_tls(job: &ebbflow_crds::TrainingJob) -> bool {
    !matches!(
        job.spec.runtime.transport_security,
        Some(ebbflow_crds::TransportSecurity::None)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_uses_the_service_unless_overridden() {
        assert_eq!(
            coordinator_url("mf", "ml", true, None),
            "https://mf-coordinator.ml.svc:7070"
        );
        assert_eq!(
            coordinator_url("mf", "ml", false, None),
            "http://mf-coordinator.ml.svc:7070"
        );
        assert_eq!(
            coordinator_url("mf", "ml", true, Some("http://127.0.0.1:9000/")),
            "http://127.0.0.1:9000"
        );
    }

    #[test]
    fn wire_status_maps_to_what_the_operator_uses() {
        let wire: StatusResponse = serde_json::from_str(
            r#"{"phase":"done","expected_nodes":1,
                "nodes":[{"node":0,"name":"mf-r-0","data_addr":"10.0.0.1:7071","workers":2,"worker_base":0,"finished":true}],
                "partitions":[],"notices":[],
                "result":{"loss":0.25,"metrics":[],"updates_per_second":10.0},"error":null}"#,
        )
        .unwrap();
        let status = CoordinatorStatus::from(wire.clone());
        assert!(status.finished);
        assert_eq!(status.loss, Some(0.25));
        assert_eq!(status.members, ["mf-r-0"]);
        assert!(status.failed.is_none());
        assert_eq!(
            (status.stage, status.iteration),
            (None, None),
            "a static job"
        );

        let elastic: StatusResponse = serde_json::from_str(
            r#"{"phase":"training","expected_nodes":1,"nodes":[],"partitions":[],"notices":[],
                "result":null,"error":null,
                "progress":{"clock":40,"stage":2,"reliable_nodes":1,"transient_nodes":6,
                            "transient_nodes_added":7,"partitions_migrated":16,"rollbacks":1}}"#,
        )
        .unwrap();
        let status = CoordinatorStatus::from(elastic);
        assert_eq!(status.stage, Some(2));
        assert_eq!(status.iteration, Some(40));
        assert_eq!((status.migrations, status.rollbacks), (16, 1));
        assert_eq!(
            (status.reliable_nodes, status.transient_nodes),
            (Some(1), Some(6))
        );
        assert_eq!(status.transient_nodes_added, Some(7));
        assert!(!status.finished);
        // Before its first segment a coordinator reports stage 0, which the job's status (1 to
        // 3) refuses: a resumed coordinator's first answer failed every status update.
        let starting: StatusResponse = serde_json::from_str(
            r#"{"phase":"training","expected_nodes":1,"nodes":[],"partitions":[],"notices":[],
                "result":null,"error":null,
                "progress":{"clock":20040,"stage":0,"reliable_nodes":0,"transient_nodes":0,
                            "transient_nodes_added":0,"partitions_migrated":0,"rollbacks":0}}"#,
        )
        .unwrap();
        let status = CoordinatorStatus::from(starting);
        assert_eq!((status.stage, status.iteration), (None, Some(20040)));

        let failed = StatusResponse {
            phase: JobPhase::Failed,
            error: Some("worker 3 diverged".into()),
            progress: None,
            result: None,
            ..wire
        };
        let status = CoordinatorStatus::from(failed.clone());
        assert!(!status.finished);
        assert_eq!(status.failed.as_deref(), Some("worker 3 diverged"));
        assert_eq!(status.failed_reason, None);
        let diverged = StatusResponse {
            failure_reason: Some(ebbflow_runtime_api::FailureReason::Diverged),
            ..failed
        };
        let status = CoordinatorStatus::from(diverged);
        assert_eq!(status.failed_reason.as_deref(), Some("Diverged"));
    }

    #[test]
    fn notice_deadlines_round_down_to_seconds() {
        let leaves_at: Timestamp = "2026-01-01T00:02:00.900Z".parse().unwrap();
        let request = notice_request("mf-t-0", leaves_at);
        assert_eq!(request.name, "mf-t-0");
        assert_eq!(request.deadline_unix, 1_767_225_720);
    }

    #[tokio::test]
    async fn unreachable_coordinator_is_reported_with_its_url() {
        // Bind then drop a listener so the port is known to refuse connections.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        drop(listener);
        let client = CoordinatorClient::new(Duration::from_secs(2)).unwrap();
        let error = client
            .status(&format!("http://{address}"), None)
            .await
            .unwrap_err();
        assert!(
            matches!(error, CoordinatorError::Unreachable { .. }),
            "{error}"
        );
        assert!(error.to_string().contains(&address.to_string()));
        // A TLS job's coordinator is not called without the job's key.
        let error = client
            .status(&format!("https://{address}"), None)
            .await
            .unwrap_err();
        assert!(matches!(error, CoordinatorError::NoKey { .. }), "{error}");
    }

    /// The operator reaches a TLS job's coordinator (the real admin API, served as a pod
    /// serves it) with the job's token, and a coordinator holding another key not at all.
    #[tokio::test]
    async fn a_tls_coordinator_is_reached_with_its_jobs_token_only() {
        use ebbflow_runtime::elastic_coordinator::{ElasticService, router};
        let service = ElasticService::new(
            "job token".into(),
            "exact/1".into(),
            1,
            std::sync::Arc::default(),
            prometheus::Registry::new(),
            ebbflow_runtime::metrics::RuntimeMetrics::unregistered(),
            std::sync::Arc::new(ebbflow_runtime::heartbeat::Heartbeats::unregistered(
                Duration::from_secs(60),
            )),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let tls = ebbflow_runtime::tls::JobTls::new(b"job token");
        let refused =
            ebbflow_runtime::metrics::RuntimeMetrics::unregistered().admin_connections_refused;
        tokio::spawn(async move {
            ebbflow_runtime::admin::serve(
                listener,
                router(service),
                Some(&tls),
                refused,
                std::future::pending(),
            )
            .await
        });
        let client = CoordinatorClient::new(Duration::from_secs(5)).unwrap();
        let base = format!("https://{address}");
        let status = client.status(&base, Some("job token")).await.unwrap();
        assert!(!status.ended(), "{status:?}");
        let error = client.status(&base, Some("other token")).await.unwrap_err();
        assert!(
            matches!(error, CoordinatorError::Unreachable { .. }),
            "{error}"
        );
        let error = client
            .status(&format!("http://{address}"), Some("job token"))
            .await
            .unwrap_err();
        assert!(
            matches!(error, CoordinatorError::Rejected { status: 400, .. }),
            "{error}"
        );
    }
}
