//! Client side of the runtime coordinator's admin HTTP API: status, eviction notices, stop.
//!
//! `ebbflow-runtime-api` does not define these messages yet, so the operator defines the wire
//! format it speaks here (JSON, camelCase):
//!
//! - `GET  /v1/status` → [`CoordinatorStatus`]
//! - `POST /v1/notices` with [`NoticeRequest`] → 2xx
//! - `POST /v1/stop` with [`StopRequest`] → 2xx

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Port of the coordinator's admin HTTP API inside a runtime pod.
pub const ADMIN_PORT: u16 = 7070;

/// Port of the runtime's TCP data plane inside a runtime pod.
pub const DATA_PORT: u16 = 7071;

/// What the coordinator reports about training.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CoordinatorStatus {
    /// AgileML stage (1, 2 or 3).
    #[serde(default)]
    pub stage: Option<u8>,
    /// Completed iterations (clocks).
    #[serde(default)]
    pub iteration: u64,
    /// Training loss at the last completed iteration.
    #[serde(default)]
    pub loss: Option<f64>,
    /// True once a stop criterion was met and training ended.
    #[serde(default)]
    pub finished: bool,
    /// Why training ended, when `finished` (e.g. IterationsReached, TargetLossReached).
    #[serde(default)]
    pub reason: Option<String>,
    /// Runtime nodes (pod names) that joined and are serving.
    #[serde(default)]
    pub members: Vec<String>,
    /// Partition migrations done so far.
    #[serde(default)]
    pub migrations: u64,
    /// Rollbacks to the last consistent clock so far.
    #[serde(default)]
    pub rollbacks: u64,
}

/// "Instance X leaves at T", sent once per instance and deadline.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NoticeRequest {
    /// The runtime node (pod name) that goes away.
    pub instance: String,
    /// When it goes away (RFC 3339); in the past when it is already gone.
    pub leaves_at: String,
    /// Where the notice came from (e.g. AwsNodeTerminationHandler, NodeGone).
    pub source: String,
}

/// Asks the coordinator to stop training (suspend or job deletion).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StopRequest {
    /// Why (Suspended, Deleted).
    pub reason: String,
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
    /// The answer was not the expected JSON.
    #[error("coordinator at {url} sent an unreadable answer: {source}")]
    Decode {
        /// The URL called.
        url: String,
        /// The decoding error.
        source: reqwest::Error,
    },
}

/// HTTP client for coordinators of any job; cheap to clone.
#[derive(Clone, Debug)]
pub struct CoordinatorClient {
    http: reqwest::Client,
}

impl CoordinatorClient {
    /// A client whose every request times out after `timeout`.
    pub fn new(timeout: Duration) -> Result<Self, reqwest::Error> {
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout)
            .build()?;
        Ok(Self { http })
    }

    /// `GET {base}/v1/status`.
    pub async fn status(&self, base: &str) -> Result<CoordinatorStatus, CoordinatorError> {
        let url = format!("{}/v1/status", base.trim_end_matches('/'));
        let response =
            self.http
                .get(&url)
                .send()
                .await
                .map_err(|source| CoordinatorError::Unreachable {
                    url: url.clone(),
                    source,
                })?;
        let response = check_status(&url, response)?;
        response
            .json()
            .await
            .map_err(|source| CoordinatorError::Decode { url, source })
    }

    /// `POST {base}/v1/notices`.
    pub async fn notice(&self, base: &str, notice: &NoticeRequest) -> Result<(), CoordinatorError> {
        self.post(base, "/v1/notices", notice).await
    }

    /// `POST {base}/v1/stop`.
    pub async fn stop(&self, base: &str, request: &StopRequest) -> Result<(), CoordinatorError> {
        self.post(base, "/v1/stop", request).await
    }

    async fn post<T: Serialize>(
        &self,
        base: &str,
        path: &str,
        body: &T,
    ) -> Result<(), CoordinatorError> {
        let url = format!("{}{path}", base.trim_end_matches('/'));
        let response = self
            .http
            .post(&url)
            .json(body)
            .send()
            .await
            .map_err(|source| CoordinatorError::Unreachable {
                url: url.clone(),
                source,
            })?;
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

/// Base URL of the coordinator of job `name` in `namespace`, reached through the job's headless
/// coordinator Service, unless `override_url` points every job elsewhere (tests, port-forwards).
pub fn coordinator_url(name: &str, namespace: &str, override_url: Option<&str>) -> String {
    match override_url {
        Some(url) => url.trim_end_matches('/').to_owned(),
        None => format!(
            "http://{}.{namespace}.svc:{ADMIN_PORT}",
            crate::controller::plan::coordinator_service_name(name)
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_uses_the_service_unless_overridden() {
        assert_eq!(
            coordinator_url("mf", "ml", None),
            "http://mf-coordinator.ml.svc:7070"
        );
        assert_eq!(
            coordinator_url("mf", "ml", Some("http://127.0.0.1:9000/")),
            "http://127.0.0.1:9000"
        );
    }

    #[test]
    fn status_tolerates_missing_fields() {
        let status: CoordinatorStatus =
            serde_json::from_str(r#"{"stage":2,"iteration":7}"#).unwrap();
        assert_eq!(status.stage, Some(2));
        assert_eq!(status.iteration, 7);
        assert!(!status.finished);
    }

    #[tokio::test]
    async fn unreachable_coordinator_is_reported_with_its_url() {
        // Bind then drop a listener so the port is known to refuse connections.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        drop(listener);
        let client = CoordinatorClient::new(Duration::from_secs(2)).unwrap();
        let error = client
            .status(&format!("http://{address}"))
            .await
            .unwrap_err();
        assert!(
            matches!(error, CoordinatorError::Unreachable { .. }),
            "{error}"
        );
        assert!(error.to_string().contains(&address.to_string()));
    }
}
