//! Admin HTTP API types shared by the runtime coordinator and the operator.
//!
//! Endpoints (JSON bodies, served by `ebbflow-runtime coordinator`):
//!
//! | method & path | request | response |
//! |---|---|---|
//! | `GET /status` | | [`StatusResponse`] |
//! | `POST /join` | [`JoinRequest`] | [`JoinResponse`] |
//! | `GET /plan?node=N` | | [`PlanResponse`] (`ready: false` until every node joined) |
//! | `POST /report` | [`ReportRequest`] | [`Ack`] |
//! | `POST /notice` | [`NoticeRequest`] | [`NoticeResponse`] |
//! | `POST /stop` | | [`Ack`] |
//! | `GET /metrics` | | Prometheus text |
//!
//! `join` and `report` carry the job secret in their bodies; every other call but `/metrics`
//! carries it as `Authorization: Bearer <secret>` ([`bearer`]), and one without it is answered
//! 401 (`bad_secret`). The elastic coordinator's API (`ebbflow-runtime elastic-coordinator`)
//! follows the same rule.
//!
//! Errors are returned with a 4xx/5xx status and an [`ApiError`] body.

use serde::{Deserialize, Serialize};

/// Lifecycle stage of a job as the coordinator sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobPhase {
    /// Waiting for nodes to join.
    Joining,
    /// Every node joined; workers are training.
    Training,
    /// Training finished; the final evaluation is being computed.
    Evaluating,
    /// Finished; `result` in the status holds the outcome.
    Done,
    /// Stopped on request before finishing.
    Stopped,
    /// Failed; `error` in the status says why.
    Failed,
}

/// A node asks to take part in the job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JoinRequest {
    /// Stable name of the node (pod or instance name).
    pub name: String,
    /// Address of the node's data-plane server (`host:port`).
    pub data_addr: String,
    /// Worker threads the node runs.
    pub workers: u32,
    /// The job's shared secret (proves the node belongs to the job).
    pub secret: String,
    /// Whether the node is on reliable (on-demand) capacity.
    #[serde(default = "default_true")]
    pub reliable: bool,
    /// Whether the node hosts partitions (false: a worker-only node).
    #[serde(default = "default_true")]
    pub serves: bool,
    /// The job the node was started for (app, clocks, partitions, ...): an elastic coordinator
    /// refuses a node built for another job. Empty: not checked.
    #[serde(default)]
    pub job: String,
}

fn default_true() -> bool {
    true
}

/// The coordinator accepted a node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JoinResponse {
    /// The node's id within the job.
    pub node: u32,
}

/// Owner and epoch of one partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionOwner {
    /// Node serving the partition.
    pub owner: u32,
    /// Incremented on every ownership change.
    pub epoch: u64,
}

/// A node of the job as listed in plans and status.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeInfo {
    /// Node id.
    pub node: u32,
    /// Node name.
    pub name: String,
    /// Data-plane address.
    pub data_addr: String,
    /// Worker threads.
    pub workers: u32,
    /// First global worker id of the node's threads.
    pub worker_base: u32,
    /// Whether the node reported its workers finished.
    pub finished: bool,
    /// Whether the node hosts partitions.
    #[serde(default = "default_true")]
    pub serves: bool,
}

/// Everything a node needs to start training.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlanResponse {
    /// False while nodes are still joining (poll again).
    pub ready: bool,
    /// Partition owners, indexed by partition.
    pub partitions: Vec<PartitionOwner>,
    /// Every node of the job.
    pub nodes: Vec<NodeInfo>,
    /// Worker threads over all nodes.
    pub total_workers: u32,
    /// Clocks to run.
    pub clocks: u64,
    /// SSP staleness.
    pub staleness: u64,
}

/// Per-clock stats of one worker thread.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct ClockRecord {
    /// Units of work.
    pub updates: u64,
    /// Sum of loss terms.
    pub loss_sum: f64,
    /// Number of loss terms.
    pub loss_count: u64,
    /// Seconds since the node's start of training when the clock ended.
    pub end_seconds: f64,
}

/// A node reports its worker threads finished (or failed).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReportRequest {
    /// The reporting node.
    pub node: u32,
    /// The job's shared secret.
    pub secret: String,
    /// Per worker thread: per clock records.
    pub workers: Vec<Vec<ClockRecord>>,
    /// Seconds each worker spent pulling (SSP waits included).
    pub wait_seconds: Vec<f64>,
    /// Set if the node's workers failed.
    pub error: Option<String>,
    /// Peak resident memory of the node process (bytes; 0 if unknown).
    #[serde(default)]
    pub peak_rss_bytes: u64,
    /// Bytes of parameter values the node hosts.
    #[serde(default)]
    pub parameter_bytes: u64,
}

/// The `Authorization` value that carries the job secret on the admin API's calls without a body
/// secret (`POST /notice`, `POST /stop`): the coordinator refuses them without it.
pub fn bearer(secret: &str) -> String {
    format!("Bearer {secret}")
}

/// "Instance X goes away at T" (issue 4 acts on it; static membership records it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NoticeRequest {
    /// Name of the node (as in [`JoinRequest::name`]).
    pub name: String,
    /// Deadline, seconds since the Unix epoch.
    pub deadline_unix: u64,
    /// The deadline in Unix milliseconds, when known that precisely (wins over `deadline_unix`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline_unix_ms: Option<u64>,
}

/// What the coordinator did with a notice.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NoticeResponse {
    /// The node the notice is for.
    pub node: u32,
    /// False if an identical notice was already recorded.
    pub new: bool,
}

/// A node process's heartbeat (`POST /heartbeat`, bearer job secret): it is alive.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeartbeatRequest {
    /// Name of the node (as in [`JoinRequest::name`]).
    pub name: String,
}

/// The coordinator's answer to a heartbeat.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeartbeatResponse {
    /// Job phase (a node exits once the job is over).
    pub phase: JobPhase,
    /// The node was declared failed (silent too long): it must drop its state and exit, and
    /// nothing it sends is applied.
    pub fenced: bool,
}

/// Plain acknowledgement.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ack {
    /// Always true.
    pub ok: bool,
}

/// Final outcome of a job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobResult {
    /// Headline loss of the final evaluation.
    pub loss: f64,
    /// Further evaluation metrics.
    pub metrics: Vec<(String, f64)>,
    /// Units of work per second over all workers.
    pub updates_per_second: f64,
}

/// A failure the runtime can name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum FailureReason {
    /// The training loss became NaN or infinite or grew without bound, or the final evaluation
    /// is not finite: the hyperparameters cannot train this model.
    Diverged,
    /// The app's own code failed (a Python hook raised or returned bad data).
    AppFailed,
}

impl FailureReason {
    /// The CamelCase name (a TrainingJob condition reason).
    pub fn as_str(self) -> &'static str {
        match self {
            FailureReason::Diverged => "Diverged",
            FailureReason::AppFailed => "AppFailed",
        }
    }
}

/// Coordinator status.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StatusResponse {
    /// Job phase.
    pub phase: JobPhase,
    /// Nodes expected before training starts.
    pub expected_nodes: u32,
    /// Nodes joined so far.
    pub nodes: Vec<NodeInfo>,
    /// Partition owners.
    pub partitions: Vec<PartitionOwner>,
    /// Recorded notices: (node, deadline).
    pub notices: Vec<(u32, u64)>,
    /// Outcome once done.
    pub result: Option<JobResult>,
    /// Failure description once failed.
    pub error: Option<String>,
    /// Why it failed, where the runtime knows more than the description says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_reason: Option<FailureReason>,
    /// Progress of an elastic job (absent for a static one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<ElasticProgress>,
}

/// Where an elastic job is.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ElasticProgress {
    /// Clocks every partition holds at the last segment boundary.
    pub clock: u64,
    /// AgileML stage (1, 2 or 3).
    pub stage: u8,
    /// Reliable member nodes.
    pub reliable_nodes: u32,
    /// Transient member nodes.
    pub transient_nodes: u32,
    /// Transient nodes switched in so far (a count that only rises, so joins show even when
    /// nodes leave at the same time).
    #[serde(default)]
    pub transient_nodes_added: u64,
    /// Partitions that changed owner so far.
    pub partitions_migrated: u64,
    /// Rollbacks to the BackupPS copy so far.
    pub rollbacks: u64,
    /// Nodes declared failed because their heartbeats stopped.
    #[serde(default)]
    pub heartbeat_failures: u64,
    /// Training loss of the last completed clock (what `spec.stop.targetLoss` is compared
    /// with); absent before the first clock.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss: Option<f64>,
}

/// Error body of a failed request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApiError {
    /// Static category (e.g. `unknown_node`, `bad_secret`).
    pub category: String,
    /// Human-readable description.
    pub message: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn join_defaults_to_reliable_and_round_trips() {
        let join: JoinRequest = serde_json::from_str(
            r#"{"name":"a","data_addr":"127.0.0.1:1","workers":2,"secret":"s"}"#,
        )
        .unwrap();
        assert!(join.reliable && join.serves);
        let back: JoinRequest =
            serde_json::from_str(&serde_json::to_string(&join).unwrap()).unwrap();
        assert_eq!(back, join);
        assert_eq!(
            serde_json::to_string(&JobPhase::Evaluating).unwrap(),
            "\"evaluating\""
        );
    }
}
