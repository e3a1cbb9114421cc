//! `TrainingJob.status`: what the operator observed and decided, written by the leader only.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Most bidder decisions kept in `status.recentDecisions`; older ones are dropped first.
pub const MAX_RECENT_DECISIONS: usize = 20;

/// Most allocations listed in `status.allocations`.
pub const MAX_ALLOCATIONS: usize = 256;

/// Most pools listed in `status.nodes.pools`.
pub const MAX_POOLS: usize = 256;

/// Condition types the operator sets on a TrainingJob.
pub mod condition_types {
    /// The spec passed validation (False with reason InvalidSpec and the failed rules).
    pub const VALID: &str = "Valid";
    /// Nodes are being provisioned or training is advancing.
    pub const PROGRESSING: &str = "Progressing";
    /// The reliable tier and coordinator are up, so training can make progress.
    pub const READY: &str = "Ready";
    /// The job has stopped: reason says which stop criterion, budget or error ended it.
    pub const COMPLETE: &str = "Complete";
}

/// Observed state of a TrainingJob.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TrainingJobStatus {
    /// Lifecycle phase (see [`Phase`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<Phase>,

    /// Latest observations of the job's state (Valid, Progressing, Ready, Complete).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,

    /// The metadata.generation this status was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// AgileML stage: 1 (ParamServs on reliable nodes only), 2 (ActivePSs on transient nodes
    /// backed by BackupPSs) or 3 (as 2, no workers on reliable nodes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 3))]
    pub stage: Option<u8>,

    /// Completed iterations (clocks).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iteration: Option<u64>,

    /// Training loss at the last completed iteration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss: Option<f64>,

    /// Running nodes per tier and per pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes: Option<NodeCounts>,

    /// Money spent and saved so far, in USD.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<CostStatus>,

    /// The application model BidBrain decides with: the spec's `bidding.overrides`,
    /// re-estimated from the job's measured progress.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub app_model: Option<AppModelStatus>,

    /// Current allocations: the alive transient instances of each pool, with the lowest bid
    /// they were launched at and the pool's price now.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 256))]
    pub allocations: Vec<AllocationStatus>,

    /// The most recent bidder decisions, newest last, at most 20.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 20))]
    pub recent_decisions: Vec<BidDecision>,

    /// Nodes lost to the market (with or without notice).
    #[serde(default)]
    pub evictions: u64,

    /// Partition migrations done ahead of evictions or for rebalancing.
    #[serde(default)]
    pub migrations: u64,

    /// Rollbacks to the last consistent clock after failures without enough notice.
    #[serde(default)]
    pub rollbacks: u64,

    /// When training first started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,

    /// When the job reached Succeeded or Failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_time: Option<Time>,

    /// The stop criterion the operator found met (`targetLoss`, `wallClockLimit` or
    /// `budgetTotal`), after which it asked the coordinator to stop. `iterations` is the
    /// runtime's own: the coordinator finishes by itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_reason: Option<String>,

    /// When the operator first asked the coordinator to stop.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_requested_time: Option<Time>,

    /// Times the coordinator pod failed since the coordinator last answered; at 3 the job
    /// fails (reason CoordinatorFailed) instead of replacing it again.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub coordinator_failures: u32,
    /// Node pods (not the coordinator) that failed by themselves (a crash, an error at
    /// startup, OOMKilled; not a spot node's end), in a row: a failure more than 10 minutes
    /// after the one before starts the count again, and pods seen failed by one reconcile
    /// count once (they share a cause). While it is above zero, new node pods wait
    /// for the operator's retry backoff after the last failure (5 s, doubling per failure, at
    /// most 5 min by default) instead of being replaced at once.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub node_failures: u32,

    /// The ordinal the next transient pod gets: transient pod names (`<job>-t-<i>`) are never
    /// reused within a job, since the coordinator knows a node by its pod's name for the whole
    /// run (a node that left cannot join again under its name).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub next_transient_ordinal: u32,

    /// When the last of those node pods failed (the backoff runs from it, across operator
    /// restarts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_node_failure_time: Option<Time>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl TrainingJobStatus {
    /// Appends `decision`, dropping the oldest ones beyond [`MAX_RECENT_DECISIONS`].
    pub fn push_decision(&mut self, decision: BidDecision) {
        self.recent_decisions.push(decision);
        let excess = self
            .recent_decisions
            .len()
            .saturating_sub(MAX_RECENT_DECISIONS);
        self.recent_decisions.drain(..excess);
    }

    /// The condition of type `condition_type`, if set.
    pub fn condition(&self, condition_type: &str) -> Option<&Condition> {
        self.conditions.iter().find(|c| c.type_ == condition_type)
    }
}

// The enum's doc is what `kubectl explain` shows for the optional `phase` field.
/// Lifecycle phase: Pending, Provisioning, Running, Suspended, Succeeded or Failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum Phase {
    /// Accepted, not yet acted on.
    Pending,
    /// Reliable nodes and coordinator are being brought up.
    Provisioning,
    /// Training.
    Running,
    /// spec.suspend is true; nodes are released.
    Suspended,
    /// A stop criterion was met.
    Succeeded,
    /// The job cannot continue (invalid spec, budget exhausted before any criterion, fatal error).
    Failed,
}

/// Running nodes per tier and per pool.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeCounts {
    /// Running reliable nodes.
    pub reliable: u32,
    /// Running transient nodes.
    pub transient: u32,
    /// reliable + transient (the Nodes printer column).
    pub total: u32,
    /// Running nodes per pool.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 256))]
    pub pools: Vec<PoolNodes>,
}

/// A pool: one instance type in one zone at one capacity type.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Pool {
    /// Instance type (e.g. c5.xlarge).
    pub instance_type: String,
    /// Zone (e.g. us-east-1a); empty when the market has no zones.
    #[serde(default)]
    pub zone: String,
    /// on-demand or spot.
    pub capacity_type: CapacityType,
}

/// on-demand or spot.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum CapacityType {
    /// Not revocable.
    OnDemand,
    /// Revocable by the market.
    #[default]
    Spot,
}

impl CapacityType {
    /// The name in manifests, pod annotations and instance tags (`on-demand`, `spot`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::OnDemand => "on-demand",
            Self::Spot => "spot",
        }
    }

    /// Parses [`CapacityType::as_str`] back.
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "on-demand" => Some(Self::OnDemand),
            "spot" => Some(Self::Spot),
            _ => None,
        }
    }
}

/// Running nodes in one pool.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PoolNodes {
    /// The pool.
    #[serde(flatten)]
    pub pool: Pool,
    /// Running nodes in it.
    pub count: u32,
}

/// Money spent and saved so far, in USD.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CostStatus {
    /// USD charged so far under the billing model (the Cost printer column).
    pub spent: f64,
    /// USD of compute received free (e.g. refunded or uncharged evicted time).
    pub free_compute: f64,
    /// USD the same instance-time would have cost on demand.
    pub on_demand_equivalent: f64,
    /// The part of `spent` charged for instances that have ended (the operator adds the running
    /// ones to it; kept here so that a restarted operator does not forget them).
    #[serde(default)]
    pub ended_spent: f64,
    /// The part of `freeCompute` from instances that have ended.
    #[serde(default)]
    pub ended_free_compute: f64,
    /// The part of `onDemandEquivalent` from instances that have ended.
    #[serde(default)]
    pub ended_on_demand_equivalent: f64,
    /// Running instances the market gives no price for (not in `spent`): their pool is not in
    /// the job's market (an instance type or zone outside it, or a pod with no pool).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unpriced: Vec<String>,
}

/// BidBrain's application model (seed 003 §4.3) as measured from the job's progress: the
/// spec's terms moved towards each measurement.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AppModelStatus {
    /// ν: training clocks per vCPU per second of the market's clock (trace seconds for a
    /// replayed trace).
    pub nu: f64,
    /// φ: the share of a transient node's ν that becomes progress.
    pub phi: f64,
    /// σ: seconds from buying capacity until the runtime counts it as ready nodes.
    pub sigma_seconds: f64,
    /// λ: seconds of lost progress after an eviction (the pause plus clocks redone).
    pub lambda_seconds: f64,
    /// Steady intervals measured (for ν and φ).
    #[serde(default)]
    pub steady_intervals: u64,
    /// Additions measured (for σ).
    #[serde(default)]
    pub additions: u64,
    /// Eviction stalls measured (for λ).
    #[serde(default)]
    pub evictions: u64,
    /// False when the operator runs with re-estimation off and decides with the spec's terms.
    #[serde(default)]
    pub in_use: bool,
}

/// Instances bought together in one pool at one price.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AllocationStatus {
    /// Stable id of the allocation (unique within the job).
    pub id: String,
    /// The pool.
    #[serde(flatten)]
    pub pool: Pool,
    /// Instances in the allocation.
    pub count: u32,
    /// Highest price bid, USD per instance-hour (spot only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_price: Option<f64>,
    /// Price currently charged, USD per instance-hour (absent where the job's market quotes
    /// none for the pool, or the job has no market).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub price: Option<f64>,
    /// When the allocation was acquired.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<Time>,
}

/// One bidder decision.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BidDecision {
    /// When it was made.
    pub time: Time,
    /// Acquire, Release or Hold.
    pub action: BidAction,
    /// The pool acted on (absent for Hold).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<Pool>,
    /// Instances acquired or released.
    #[serde(default)]
    pub count: u32,
    /// Highest price bid, USD per instance-hour (Acquire of spot only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_price: Option<f64>,
    /// Expected cost per unit of work after the decision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_cost_per_work: Option<f64>,
    /// Why (e.g. LowersCostPerWork, BillingBoundary, Eviction, Deadline, Budget).
    #[serde(default)]
    pub reason: String,
}

/// Acquire, Release or Hold.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum BidAction {
    /// Added an allocation.
    Acquire,
    /// Released (part of) an allocation.
    Release,
    /// Kept the footprint as it is.
    #[default]
    Hold,
}
