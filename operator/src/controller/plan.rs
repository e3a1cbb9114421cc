//! The plan step (pure): from the job, its observed pods, the eviction notices and the capacity
//! decision, the desired Secret, Service, PodDisruptionBudget and pods, and which pods to delete.
//!
//! Naming: the Secret is `<job>-token` (key `token`), the headless Service and the
//! PodDisruptionBudget of the coordinator pod `<job>-coordinator`,
//! reliable pods `<job>-r-<i>` (i < reliable.count; `<job>-r-0` hosts the coordinator) and
//! transient pods `<job>-t-<i>` with ordinals the job never used. Pods are immutable in the
//! fields that matter, so drift is fixed by replacing pods, never by patching them.

use std::collections::{BTreeMap, BTreeSet};

use ebbflow_crds::{CapacityType, CapacityTypeLabel, Pool, ResolvedCapacityTypeLabel, TrainingJob};
use k8s_openapi::{
    ByteString,
    api::core::v1::{
        Affinity, Capabilities, Container, ContainerPort, ContainerStateWaiting,
        EmptyDirVolumeSource, EnvVar, EnvVarSource, Node, NodeAffinity, NodeSelector,
        NodeSelectorRequirement, NodeSelectorTerm, ObjectFieldSelector,
        PersistentVolumeClaimVolumeSource, Pod, PodSecurityContext, PodSpec, Probe,
        ResourceRequirements, SeccompProfile, Secret, SecretKeySelector, SecurityContext, Service,
        ServicePort, ServiceSpec, TCPSocketAction, Toleration, Volume, VolumeMount,
    },
    api::networking::v1::{
        NetworkPolicy, NetworkPolicyIngressRule, NetworkPolicyPeer, NetworkPolicyPort,
        NetworkPolicySpec,
    },
    api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec},
    apimachinery::pkg::{
        api::resource::Quantity,
        apis::meta::v1::{LabelSelector, ObjectMeta},
        util::intstr::IntOrString,
    },
};
use kube::{Resource, ResourceExt};

use crate::{
    coordinator::{ADMIN_PORT, DATA_PORT, METRICS_PORT, coordinator_service_name},
    notices::{Notice, NoticeSource},
};

pub use ebbflow_job::provision::PoolKey;
pub use ebbflow_job::run::pod::{DEFAULT_CHECKPOINT_INTERVAL, DEFAULT_GRACE_SECONDS};

/// Label carrying the owning job's name on every child.
pub const JOB_LABEL: &str = "ebbflow.dev/job";
/// Label carrying the tier (`reliable` or `transient`) on runtime pods.
pub const TIER_LABEL: &str = "ebbflow.dev/tier";
/// Label carrying the pool slug on transient pods.
pub const POOL_LABEL: &str = "ebbflow.dev/pool";
/// Label `true` on the pod that hosts the coordinator.
pub const COORDINATOR_LABEL: &str = "ebbflow.dev/coordinator";
/// Annotation with the pool's instance type (empty: any).
pub const INSTANCE_TYPE_ANNOTATION: &str = "ebbflow.dev/instance-type";
/// Prefix of every annotation the operator sets on its children (and reads back).
pub const ANNOTATION_PREFIX: &str = "ebbflow.dev/";
/// Annotation with the pool's zone (empty: any).
pub const ZONE_ANNOTATION: &str = "ebbflow.dev/zone";
/// Annotation with the pool's capacity type (`spot` or `on-demand`).
pub const CAPACITY_TYPE_ANNOTATION: &str = "ebbflow.dev/capacity-type";
/// Annotation with the max price (USD per instance-hour) a transient spot pod's instance was
/// bid at in ec2 mode, as the capacity decision that created it set; read back for the held
/// allocation's eviction outlook and `status.allocations`.
pub const MAX_PRICE_ANNOTATION: &str = "ebbflow.dev/max-price";
/// `app.kubernetes.io/managed-by` value on every child.
pub const MANAGED_BY: &str = "ebbflow-operator";
/// Well-known node label of the instance type.
pub const INSTANCE_TYPE_NODE_LABEL: &str = "node.kubernetes.io/instance-type";
/// Well-known node label of the zone.
pub const ZONE_NODE_LABEL: &str = "topology.kubernetes.io/zone";
/// Key of the data-plane token in the job's Secret.
pub const TOKEN_KEY: &str = "token";
/// Key of the pinned job spec (JSON) in the job's Secret ([`pinned_spec`]).
pub const SPEC_KEY: &str = "spec";
/// Where the coordinator pod mounts `spec.runtime.checkpoint.claimName`.
pub const CHECKPOINT_DIR: &str = "/checkpoint";
/// Karpenter's annotation keeping a pod's node from voluntary disruption (consolidation,
/// drift); set on reliable pods.
pub const DO_NOT_DISRUPT_ANNOTATION: &str = "karpenter.sh/do-not-disrupt";
/// Name of the runtime container.
pub const CONTAINER_NAME: &str = "runtime";
/// User the runtime runs as (distroless `nonroot`).
pub const RUNTIME_USER: i64 = 65532;

/// The runtime container's command: the `ebbflow` binary's pod entrypoint, which the image
/// must put on its PATH.
pub const RUNTIME_COMMAND: [&str; 2] = ["ebbflow", "pod"];

/// Name of the job's data-plane token Secret.
pub fn secret_name(job: &str) -> String {
    format!("{job}-token")
}

/// Name of reliable pod `ordinal`.
pub fn reliable_pod_name(job: &str, ordinal: u32) -> String {
    format!("{job}-r-{ordinal}")
}

/// Name of transient pod `ordinal`.
pub fn transient_pod_name(job: &str, ordinal: u32) -> String {
    format!("{job}-t-{ordinal}")
}

/// Label selector matching every child of `job`.
pub fn job_selector(job: &str) -> String {
    format!("{JOB_LABEL}={job},app.kubernetes.io/managed-by={MANAGED_BY}")
}

/// Operator-wide settings the plan needs.
#[derive(Clone, Debug)]
pub struct PlanConfig {
    /// Runtime image when the spec names none.
    pub default_image: String,
    /// Capacity-type label when the spec keeps the default (karpenter, no overrides).
    pub capacity_label: ResolvedCapacityTypeLabel,
    /// The operator's own pods, admitted to the coordinator's admin port by each job's
    /// NetworkPolicy ([`build_network_policy`]); `None`: no per-job NetworkPolicy.
    pub network_policy: Option<OperatorPeer>,
}

/// Where the operator's pods run and how they are labelled, for the per-job NetworkPolicy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OperatorPeer {
    /// The operator's namespace.
    pub namespace: String,
    /// Labels every operator pod carries (the chart's selector labels).
    pub pod_labels: BTreeMap<String, String>,
}

impl OperatorPeer {
    /// Parses `key=value,key=value` (a `kubectl -l` equality selector) in `namespace`.
    pub fn parse(namespace: &str, selector: &str) -> Result<Self, String> {
        let mut pod_labels = BTreeMap::new();
        for part in selector.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let Some((key, value)) = part.split_once('=') else {
                return Err(format!(
                    "operator pod selector {selector:?}: {part:?} is not key=value"
                ));
            };
            let (key, value) = (key.trim(), value.trim());
            let label = |text: &str, extra: &str| {
                text.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c) || extra.contains(c))
            };
            if key.is_empty() || !label(key, "/") || !label(value, "") {
                return Err(format!(
                    "operator pod selector {selector:?}: {part:?} is not key=value"
                ));
            }
            pod_labels.insert(key.to_owned(), value.to_owned());
        }
        if pod_labels.is_empty() {
            return Err(format!(
                "operator pod selector {selector:?} names no label: every pod would match"
            ));
        }
        Ok(Self {
            namespace: namespace.to_owned(),
            pod_labels,
        })
    }
}

/// How many transient instances to run per pool, and the decisions that led there.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CapacityDecision {
    /// Desired transient pods per pool; pools absent hold none.
    pub transient: BTreeMap<PoolKey, u32>,
    /// Why, for the status's decision log (only changes are logged).
    pub reason: String,
    /// Max price bid per spot pool in USD per instance-hour, when the planner set one.
    pub max_prices: BTreeMap<PoolKey, f64>,
    /// The planner's expected cost per unit of work after the decision, when it has a model.
    pub expected_cost_per_work: Option<f64>,
    /// The application model the planner measured for the job, when it keeps one (BidBrain).
    pub app_model: Option<ebbflow_crds::AppModelStatus>,
}

impl CapacityDecision {
    /// Total desired transient pods.
    pub fn total(&self) -> u32 {
        self.transient.values().sum()
    }
}

/// Which tier a runtime pod belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Tier {
    /// On-demand, holds ParamServ/BackupPS state and the coordinator.
    Reliable,
    /// Spot, added and released by the bidder.
    Transient,
}

impl Tier {
    /// The label value and metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Reliable => "reliable",
            Self::Transient => "transient",
        }
    }
}

/// Why a pod is deleted; also the metric label.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum DeleteReason {
    /// More pods than decided in its pool or tier.
    ScaleDown,
    /// Finished, failed, or its node is gone: deleted so it can be replaced.
    Replace,
    /// The job is suspended.
    Suspend,
    /// Training finished.
    Finished,
}

impl DeleteReason {
    /// The CamelCase name (metric label, event text).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ScaleDown => "ScaleDown",
            Self::Replace => "Replace",
            Self::Suspend => "Suspend",
            Self::Finished => "Finished",
        }
    }
}

/// A pod the plan deletes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodDeletion {
    /// Pod name.
    pub name: String,
    /// Why.
    pub reason: DeleteReason,
}

/// Whether the job should be running nodes at all.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activity {
    /// Run the decided footprint.
    Run,
    /// Release every node (spec.suspend).
    Suspend,
    /// Release every node (training finished).
    Finished,
}

/// Everything the plan is computed from.
#[derive(Clone, Debug)]
pub struct PlanInput<'a> {
    /// The job.
    pub job: &'a TrainingJob,
    /// The job's pods as observed.
    pub pods: &'a [Pod],
    /// The token in the existing Secret, if any.
    pub existing_token: Option<&'a str>,
    /// The spec (JSON) the job's runtime pods were started with, from the existing Secret.
    pub existing_spec: Option<&'a str>,
    /// A fresh token, used only when no Secret exists yet.
    pub fresh_token: &'a str,
    /// Current eviction notices of the job's pods.
    pub notices: &'a [Notice],
    /// The capacity decision.
    pub decision: &'a CapacityDecision,
    /// Run, suspend or finished.
    pub activity: Activity,
    /// Operator-wide settings.
    pub config: &'a PlanConfig,
}

/// The desired state and the changes that get there.
#[derive(Clone, Debug)]
pub struct Plan {
    /// The data-plane token Secret (applied every time; the token never changes).
    pub secret: Secret,
    /// The headless coordinator Service (applied every time).
    pub service: Service,
    /// The coordinator pod's PodDisruptionBudget (applied every time).
    pub disruption_budget: PodDisruptionBudget,
    /// The job's NetworkPolicy, when the operator makes them ([`PlanConfig::network_policy`]).
    pub network_policy: Option<NetworkPolicy>,
    /// Pods to create.
    pub create: Vec<Pod>,
    /// Pods to delete, with why.
    pub delete: Vec<PodDeletion>,
}

/// What is known about one observed runtime pod.
#[derive(Clone, Debug)]
pub struct ObservedPod<'a> {
    /// The pod.
    pub pod: &'a Pod,
    /// Its name.
    pub name: &'a str,
    /// Its tier (from its label).
    pub tier: Tier,
    /// Its pool (transient pods, from annotations).
    pub pool: Option<PoolKey>,
    /// Ordinal parsed from its name.
    pub ordinal: Option<u32>,
    /// Already being deleted.
    pub deleting: bool,
    /// Phase Succeeded or Failed.
    pub finished: bool,
    /// The notice against it, if any.
    pub notice: Option<&'a Notice>,
}

impl ObservedPod<'_> {
    /// Counts towards the footprint: not deleting, not finished, no notice.
    pub fn alive(&self) -> bool {
        !self.deleting && !self.finished && self.notice.is_none()
    }

    /// Running with every container ready.
    pub fn ready(&self) -> bool {
        pod_ready(self.pod)
    }
}

/// True if the pod is Running with condition Ready=True.
pub fn pod_ready(pod: &Pod) -> bool {
    let Some(status) = &pod.status else {
        return false;
    };
    status.phase.as_deref() == Some("Running")
        && status
            .conditions
            .iter()
            .flatten()
            .any(|c| c.type_ == "Ready" && c.status == "True")
}

/// How long a pod may wait for a node, by default, before the job's status says it cannot be
/// scheduled (spot capacity a node autoscaler launches takes a minute or two); the operator's
/// `--unschedulable-after-seconds`.
pub const UNSCHEDULABLE_AFTER_SECONDS: i64 = 300;

/// If the scheduler has found no node for `pod` (condition PodScheduled False, reason
/// Unschedulable) for at least `after` seconds by `now`: since when, and the scheduler's
/// message.
pub fn unschedulable_since(
    pod: &Pod,
    now: k8s_openapi::jiff::Timestamp,
    after: i64,
) -> Option<(k8s_openapi::jiff::Timestamp, String)> {
    let status = pod.status.as_ref()?;
    if status.phase.as_deref() != Some("Pending") {
        return None;
    }
    let scheduled = status
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "PodScheduled")?;
    if scheduled.status != "False" || scheduled.reason.as_deref() != Some("Unschedulable") {
        return None;
    }
    let since = scheduled.last_transition_time.as_ref()?.0;
    (now.as_second() - since.as_second() >= after).then(|| {
        (
            since,
            scheduled
                .message
                .clone()
                .unwrap_or_default()
                .trim()
                .to_owned(),
        )
    })
}

/// Taints the node lifecycle controller puts on a node that is not Ready (or whose kubelet
/// stopped reporting).
const NOT_READY_TAINTS: [&str; 2] = [
    "node.kubernetes.io/not-ready",
    "node.kubernetes.io/unreachable",
];

/// The nodes `pod`'s node selector picks (its pool's nodes) that are not Ready: each as
/// `name (why)`, why being the kubelet's Ready message when the cache holds it, else the
/// not-ready taint. What a pod that cannot be scheduled waits for when its pool's node was
/// launched but never came up (no CNI, a kubelet that cannot reach its runtime).
pub fn unready_pool_nodes<'a>(pod: &Pod, nodes: impl IntoIterator<Item = &'a Node>) -> Vec<String> {
    let Some(selector) = pod.spec.as_ref().and_then(|s| s.node_selector.as_ref()) else {
        return Vec::new();
    };
    let mut unready: Vec<String> = nodes
        .into_iter()
        .filter(|node| {
            selector
                .iter()
                .all(|(k, v)| node.labels().get(k) == Some(v))
        })
        .filter_map(|node| {
            let ready = node
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .and_then(|c| c.iter().find(|c| c.type_ == "Ready"));
            let taint = node
                .spec
                .as_ref()
                .and_then(|s| s.taints.as_ref())
                .and_then(|t| {
                    t.iter()
                        .find(|t| NOT_READY_TAINTS.contains(&t.key.as_str()))
                });
            if ready.is_some_and(|c| c.status == "True") || (ready.is_none() && taint.is_none()) {
                return None;
            }
            let why = match (ready.and_then(|c| c.message.as_deref()), taint) {
                (Some(message), _) if !message.trim().is_empty() => {
                    format!("not Ready: {}", message.trim())
                }
                (_, Some(taint)) => format!("not Ready: tainted {}", taint.key),
                _ => "not Ready".to_owned(),
            };
            Some(format!("{} ({why})", node.name_any()))
        })
        .collect();
    unready.sort();
    unready
}

/// Container waiting reasons of a pod the kubelet cannot start and will not get past by
/// itself: its image cannot be pulled, or its container cannot be created. The kubelet retries
/// each with its own backoff, for as long as the pod exists.
const NOT_STARTING_REASONS: [&str; 7] = [
    "ErrImagePull",
    "ImagePullBackOff",
    "ErrImageNeverPull",
    "InvalidImageName",
    "CreateContainerConfigError",
    "CreateContainerError",
    "RunContainerError",
];

/// Whether a container waits for one of [`NOT_STARTING_REASONS`].
pub fn waits_not_starting(waiting: &ContainerStateWaiting) -> bool {
    waiting
        .reason
        .as_deref()
        .is_some_and(|r| NOT_STARTING_REASONS.contains(&r))
}

/// If a container of the pending `pod` waits for one of [`NOT_STARTING_REASONS`]: the kubelet's
/// reason and message (which names the image or what is missing).
pub fn not_starting(pod: &Pod) -> Option<(String, String)> {
    let status = pod.status.as_ref()?;
    if status.phase.as_deref() != Some("Pending") {
        return None;
    }
    status
        .init_container_statuses
        .iter()
        .flatten()
        .chain(status.container_statuses.iter().flatten())
        .find_map(|c| {
            let waiting = c.state.as_ref()?.waiting.as_ref()?;
            waits_not_starting(waiting).then(|| {
                (
                    waiting.reason.clone().unwrap_or_default(),
                    waiting.message.as_deref().unwrap_or("").trim().to_owned(),
                )
            })
        })
}

/// A runtime pod that failed (phase Failed): why, and when.
#[derive(Clone, Debug, PartialEq)]
pub struct PodFailure {
    /// Its termination message (the error it printed), else the container's exit reason, else
    /// the pod's status message.
    pub message: String,
    /// When its container finished, if the kubelet said.
    pub at: Option<k8s_openapi::jiff::Timestamp>,
}

/// Why the runtime pod failed, if it has (phase Failed).
pub fn pod_failure(pod: &Pod) -> Option<PodFailure> {
    let status = pod.status.as_ref()?;
    if status.phase.as_deref() != Some("Failed") {
        return None;
    }
    let terminated = status
        .container_statuses
        .iter()
        .flatten()
        .find_map(|c| c.state.as_ref()?.terminated.as_ref());
    // The exit code and reason always lead (an OOMKill says so even when the termination
    // message is the log's tail), then what the runtime printed.
    let message = match terminated {
        Some(t) => {
            let code = format!(
                "exit code {}{}",
                t.exit_code,
                t.reason
                    .as_deref()
                    .map(|r| format!(" ({r})"))
                    .unwrap_or_default()
            );
            match t
                .message
                .as_deref()
                .map(str::trim)
                .filter(|m| !m.is_empty())
            {
                Some(printed) => format!("{code}: {printed}"),
                None => code,
            }
        }
        None => {
            let said = status
                .message
                .as_deref()
                .map(str::trim)
                .filter(|m| !m.is_empty());
            match (status.reason.as_deref(), said) {
                (Some(reason), Some(said)) => format!("{reason}: {said}"),
                (Some(reason), None) => reason.to_owned(),
                (None, Some(said)) => said.to_owned(),
                (None, None) => "the pod failed".to_owned(),
            }
        }
    };
    Some(PodFailure {
        message,
        at: terminated.and_then(|t| t.finished_at.as_ref()).map(|t| t.0),
    })
}

/// Why the job's coordinator pod failed, if its runtime failed by itself: its container ran and
/// exited in error. Not a pod with a notice against it (a drain, a deletion), ended with its node
/// or evicted by the kubelet for node pressure, nor one the kubelet refused at admission
/// (`OutOfcpu`, `NodeAffinity`, `UnexpectedAdmissionError`: no container ran). Those are the
/// cluster's doing: the pod is replaced, and they do not count toward the failures that end
/// the job (three node shutdowns in a row failed a healthy job for good).
pub fn coordinator_failure(pod: &ObservedPod<'_>) -> Option<String> {
    if !is_coordinator(pod.pod) || ended_by_the_cluster(pod) || !runtime_ran(pod.pod) {
        return None;
    }
    pod_failure(pod.pod).map(|failure| failure.message)
}

/// Pod status reasons of a node's end, not the runtime's: a spot instance shut down or lost.
const NODE_END_REASONS: [&str; 4] = ["NodeShutdown", "Shutdown", "Terminated", "NodeLost"];

/// The kubelet's reason for a pod it evicted under node pressure.
const EVICTED_REASON: &str = "Evicted";

/// Whether `pod` ended by the cluster's doing: a notice against it, its node's end, or the
/// kubelet's eviction under node pressure.
fn ended_by_the_cluster(pod: &ObservedPod<'_>) -> bool {
    ended_with_its_node(pod) || status_reason(pod.pod) == Some(EVICTED_REASON)
}

/// Whether `pod` ended with its instance: a notice against it, or its node shut down or lost.
fn ended_with_its_node(pod: &ObservedPod<'_>) -> bool {
    pod.notice.is_some() || status_reason(pod.pod).is_some_and(|r| NODE_END_REASONS.contains(&r))
}

fn status_reason(pod: &Pod) -> Option<&str> {
    pod.status.as_ref()?.reason.as_deref()
}

/// Whether a container of `pod` ran and terminated (a pod refused at admission has none).
fn runtime_ran(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .is_some_and(|statuses| {
            statuses
                .iter()
                .any(|c| c.state.as_ref().is_some_and(|s| s.terminated.is_some()))
        })
}

/// Why a node pod (not the coordinator) failed, if it failed by itself: a crash, an error at
/// startup, OOMKilled. Not a pod with a notice against it or whose node shut down or went away:
/// those are the spot market's doing, and the footprint replaces them at once.
pub fn node_failure(pod: &ObservedPod<'_>) -> Option<PodFailure> {
    if is_coordinator(pod.pod) || ended_with_its_node(pod) {
        return None;
    }
    pod_failure(pod.pod)
}

/// The node pods of `create` held back while node pods keep failing (the coordinator's are
/// not: its failures have their own limit).
pub fn hold_node_pods(create: &mut Vec<Pod>) -> usize {
    let before = create.len();
    create.retain(is_coordinator);
    before - create.len()
}

/// True for the job's coordinator pod.
fn is_coordinator(pod: &Pod) -> bool {
    pod.labels().get(COORDINATOR_LABEL).map(String::as_str) == Some("true")
}

/// True for the job's coordinator pod once it is ready.
pub fn is_ready_coordinator(pod: &Pod) -> bool {
    is_coordinator(pod) && pod_ready(pod)
}

/// Classifies the job's pods; pods without the tier label are ignored.
pub fn observe_pods<'a>(
    job_name: &str,
    pods: &'a [Pod],
    notices: &'a [Notice],
) -> Vec<ObservedPod<'a>> {
    pods.iter()
        .filter_map(|pod| {
            let name = pod.metadata.name.as_deref()?;
            let tier = match pod.labels().get(TIER_LABEL).map(String::as_str) {
                Some("reliable") => Tier::Reliable,
                Some("transient") => Tier::Transient,
                _ => return None,
            };
            let prefix = match tier {
                Tier::Reliable => format!("{job_name}-r-"),
                Tier::Transient => format!("{job_name}-t-"),
            };
            let ordinal = name
                .strip_prefix(&prefix)
                .and_then(|rest| rest.parse().ok());
            Some(ObservedPod {
                pod,
                name,
                tier,
                pool: (tier == Tier::Transient).then(|| pool_of(pod)),
                ordinal,
                deleting: pod.metadata.deletion_timestamp.is_some(),
                finished: pod_finished(pod),
                notice: notices.iter().find(|notice| notice.pod == name),
            })
        })
        .collect()
}

/// True if the pod's phase is final (Succeeded or Failed).
pub fn pod_finished(pod: &Pod) -> bool {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    matches!(phase, Some("Succeeded" | "Failed"))
}

/// The pool a transient pod was created for, from its annotations.
pub fn pool_of(pod: &Pod) -> PoolKey {
    let annotation = |key: &str| pod.annotations().get(key).cloned().unwrap_or_default();
    PoolKey(Pool {
        instance_type: annotation(INSTANCE_TYPE_ANNOTATION),
        zone: annotation(ZONE_ANNOTATION),
        capacity_type: CapacityType::parse(&annotation(CAPACITY_TYPE_ANNOTATION))
            .unwrap_or(CapacityType::Spot),
    })
}

/// A label-value-safe name for a pool (at most 63 characters).
pub fn pool_slug(pool: &Pool) -> String {
    let part = |text: &str| {
        if text.is_empty() {
            "any".to_owned()
        } else {
            text.chars()
                .map(|c| {
                    if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                        c
                    } else {
                        '-'
                    }
                })
                .collect()
        }
    };
    let capacity = pool.capacity_type.as_str();
    let slug = format!(
        "{}_{}_{capacity}",
        part(&pool.instance_type),
        part(&pool.zone)
    );
    if slug.len() <= 63 {
        return slug;
    }
    // Too long for a label value: keep a prefix and make it unique with a hash of the whole.
    let hash = ebbflow_crds::fnv1a(&slug);
    format!("{}-{:016x}", &slug[..46], hash)
}

/// The capacity-type label in force for `job`: the spec's when it differs from the default,
/// else the operator's.
pub fn capacity_label(job: &TrainingJob, config: &PlanConfig) -> ResolvedCapacityTypeLabel {
    let spec_label = &job.spec.provisioning.capacity_type;
    if *spec_label == CapacityTypeLabel::default() {
        config.capacity_label.clone()
    } else {
        spec_label.resolved()
    }
}

/// Computes the plan.
pub fn plan(input: &PlanInput<'_>) -> Plan {
    let job = input.job;
    let job_name = job.name_any();
    let observed = observe_pods(&job_name, input.pods, input.notices);
    let mut create = Vec::new();
    let mut delete = Vec::new();

    if input.activity != Activity::Run {
        let reason = match input.activity {
            Activity::Suspend => DeleteReason::Suspend,
            _ => DeleteReason::Finished,
        };
        for pod in observed.iter().filter(|pod| !pod.deleting) {
            delete.push(PodDeletion {
                name: pod.name.to_owned(),
                reason,
            });
        }
    } else {
        plan_reliable(input, &observed, &mut create, &mut delete);
        plan_transient(input, &observed, &mut create, &mut delete);
    }
    delete.sort_by(|a, b| a.name.cmp(&b.name));

    Plan {
        secret: build_secret(
            job,
            input.existing_token.unwrap_or(input.fresh_token),
            &pinned_spec(input),
        ),
        service: build_service(job),
        disruption_budget: build_disruption_budget(job),
        network_policy: input
            .config
            .network_policy
            .as_ref()
            .map(|operator| build_network_policy(job, operator)),
        create,
        delete,
    }
}

/// Deletes pods that must be replaced: finished, or bound to a node that is gone.
fn needs_replacement(pod: &ObservedPod<'_>) -> bool {
    !pod.deleting
        && (pod.finished
            || pod
                .notice
                .is_some_and(|n| n.source == NoticeSource::NodeGone))
}

/// How many reliable pods the job runs: the pinned spec's `reliable.count` while any of its pods
/// exist, the current spec's otherwise. The count is part of the training state's shape (it sets
/// the logical workers), and the running coordinator awaited the pinned count and refuses a
/// reliable node it did not start with: a pod added for an edited count would fail and be
/// replaced forever, and with one removed a replaced coordinator (reading the pinned spec) would
/// wait for a reliable node that is never created. So an edit of the count applies at the next
/// start (suspend and resume, or a new job).
fn reliable_count(input: &PlanInput<'_>) -> u32 {
    let pinned = input
        .existing_spec
        .filter(|_| !input.pods.is_empty())
        .and_then(|spec| serde_json::from_str::<ebbflow_crds::TrainingJobSpec>(spec).ok());
    pinned.map_or(input.job.spec.reliable.count, |spec| spec.reliable.count)
}

fn plan_reliable(
    input: &PlanInput<'_>,
    observed: &[ObservedPod<'_>],
    create: &mut Vec<Pod>,
    delete: &mut Vec<PodDeletion>,
) {
    let job_name = input.job.name_any();
    let count = reliable_count(input);
    let reliable: Vec<&ObservedPod<'_>> = observed
        .iter()
        .filter(|p| p.tier == Tier::Reliable)
        .collect();
    for pod in &reliable {
        let in_range = pod.ordinal.is_some_and(|ordinal| ordinal < count);
        if !in_range && !pod.deleting {
            delete.push(PodDeletion {
                name: pod.name.to_owned(),
                reason: DeleteReason::ScaleDown,
            });
        } else if in_range && needs_replacement(pod) {
            delete.push(PodDeletion {
                name: pod.name.to_owned(),
                reason: DeleteReason::Replace,
            });
        }
    }
    for ordinal in 0..count {
        let name = reliable_pod_name(&job_name, ordinal);
        // A pod still present under the name (even while deleting) blocks re-creation; the
        // next reconcile after it is gone creates the replacement.
        if !reliable.iter().any(|pod| pod.name == name) {
            create.push(build_pod(input, &PodRole::Reliable { ordinal }));
        }
    }
}

fn plan_transient(
    input: &PlanInput<'_>,
    observed: &[ObservedPod<'_>],
    create: &mut Vec<Pod>,
    delete: &mut Vec<PodDeletion>,
) {
    let job_name = input.job.name_any();
    let transient: Vec<&ObservedPod<'_>> = observed
        .iter()
        .filter(|p| p.tier == Tier::Transient)
        .collect();
    for pod in &transient {
        if needs_replacement(pod) {
            delete.push(PodDeletion {
                name: pod.name.to_owned(),
                reason: DeleteReason::Replace,
            });
        }
    }

    let mut alive_per_pool: BTreeMap<PoolKey, Vec<&ObservedPod<'_>>> = BTreeMap::new();
    for pod in transient.iter().filter(|pod| pod.alive()) {
        let pool = pod.pool.clone().unwrap_or_default();
        alive_per_pool.entry(pool).or_default().push(pod);
    }

    // Scale down: pools absent from the decision lose every pod; others their excess, least
    // valuable first (not yet ready, then youngest, then highest ordinal).
    for (pool, mut pods) in alive_per_pool.clone() {
        let desired = input.decision.transient.get(&pool).copied().unwrap_or(0) as usize;
        if pods.len() <= desired {
            continue;
        }
        pods.sort_by_key(|pod| {
            (
                pod.ready(),
                std::cmp::Reverse(pod.pod.metadata.creation_timestamp.clone().map(|t| t.0)),
                std::cmp::Reverse(pod.ordinal),
            )
        });
        for pod in pods.iter().take(pods.len() - desired) {
            delete.push(PodDeletion {
                name: pod.name.to_owned(),
                reason: DeleteReason::ScaleDown,
            });
        }
    }

    // Scale up with ordinals no pod of the job ever had: above every existing pod's and the
    // status's high-water mark. The coordinator knows a node by its pod's name for the whole run
    // and refuses a departed or failed name that joins again, so a reused name never joins.
    let mut used: BTreeSet<u32> = transient.iter().filter_map(|pod| pod.ordinal).collect();
    let recorded = input
        .job
        .status
        .as_ref()
        .map_or(0, |status| status.next_transient_ordinal);
    let mut next_ordinal = next_transient_ordinal(recorded, observed);
    for (pool, desired) in &input.decision.transient {
        let alive = alive_per_pool.get(pool).map_or(0, Vec::len) as u32;
        for _ in alive..*desired {
            while used.contains(&next_ordinal) {
                next_ordinal += 1;
            }
            used.insert(next_ordinal);
            debug_assert!(transient_pod_name(&job_name, next_ordinal).len() <= 253);
            create.push(build_pod(
                input,
                &PodRole::Transient {
                    ordinal: next_ordinal,
                    pool: pool.clone(),
                },
            ));
        }
    }
}

/// The lowest transient ordinal above `floor` and every transient pod of `observed`.
pub fn next_transient_ordinal(floor: u32, observed: &[ObservedPod<'_>]) -> u32 {
    observed
        .iter()
        .filter(|pod| pod.tier == Tier::Transient)
        .filter_map(|pod| pod.ordinal)
        .map(|ordinal| ordinal.saturating_add(1))
        .fold(floor, u32::max)
}

/// Which runtime pod to build.
enum PodRole {
    Reliable { ordinal: u32 },
    Transient { ordinal: u32, pool: PoolKey },
}

fn common_labels(job_name: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (JOB_LABEL.to_owned(), job_name.to_owned()),
        (
            "app.kubernetes.io/name".to_owned(),
            "ebbflow-runtime".to_owned(),
        ),
        ("app.kubernetes.io/instance".to_owned(), job_name.to_owned()),
        (
            "app.kubernetes.io/managed-by".to_owned(),
            MANAGED_BY.to_owned(),
        ),
    ])
}

fn child_meta(job: &TrainingJob, name: String, labels: BTreeMap<String, String>) -> ObjectMeta {
    ObjectMeta {
        name: Some(name),
        namespace: job.namespace(),
        labels: Some(labels),
        owner_references: job.controller_owner_ref(&()).map(|owner| vec![owner]),
        ..ObjectMeta::default()
    }
}

/// The spec every runtime pod runs (JSON): the one pinned in the job's Secret while any of its
/// pods exist, so that pods created after an edit of the spec (a replacement, a scale-up) run
/// the same job as the others (the runtime refuses a node started for another spec, and a
/// checkpoint of another); the current spec once none exist (a fresh start, a resume).
pub fn pinned_spec(input: &PlanInput<'_>) -> String {
    match input.existing_spec {
        Some(pinned) if !input.pods.is_empty() => pinned.to_owned(),
        // Serializing our own derived type cannot fail.
        _ => serde_json::to_string(&input.job.spec).unwrap_or_default(),
    }
}

/// The job's Secret: the data-plane token and the pinned spec ([`pinned_spec`]).
pub fn build_secret(job: &TrainingJob, token: &str, spec_json: &str) -> Secret {
    let job_name = job.name_any();
    Secret {
        metadata: child_meta(job, secret_name(&job_name), common_labels(&job_name)),
        type_: Some("Opaque".to_owned()),
        data: Some(BTreeMap::from([
            (TOKEN_KEY.to_owned(), ByteString(token.as_bytes().to_vec())),
            (
                SPEC_KEY.to_owned(),
                ByteString(spec_json.as_bytes().to_vec()),
            ),
        ])),
        ..Secret::default()
    }
}

/// The headless Service resolving to the coordinator pod, ready or not (nodes must reach it
/// while it is still starting).
pub fn build_service(job: &TrainingJob) -> Service {
    let job_name = job.name_any();
    let port = |name: &str, port: u16| ServicePort {
        name: Some(name.to_owned()),
        port: i32::from(port),
        protocol: Some("TCP".to_owned()),
        ..ServicePort::default()
    };
    Service {
        metadata: child_meta(
            job,
            coordinator_service_name(&job_name),
            common_labels(&job_name),
        ),
        spec: Some(ServiceSpec {
            cluster_ip: Some("None".to_owned()),
            publish_not_ready_addresses: Some(true),
            selector: Some(BTreeMap::from([
                (JOB_LABEL.to_owned(), job_name.clone()),
                (COORDINATOR_LABEL.to_owned(), "true".to_owned()),
            ])),
            ports: Some(vec![port("admin", ADMIN_PORT), port("data", DATA_PORT)]),
            ..ServiceSpec::default()
        }),
        ..Service::default()
    }
}

/// The job's NetworkPolicy (named like its Service): ingress to the job's runtime pods only
/// from the job's own pods (data and admin ports: nodes join the coordinator and exchange
/// parameters), from the operator's pods (the admin port: status, notices, stop), and to the
/// metrics port from anywhere (Prometheus scrapes there alone; it serves nothing but
/// `/metrics`). Every other port and peer is refused by a CNI that enforces policies. Egress is
/// left alone: pods must reach the coordinator Service, DNS and, in ec2 mode, the instance
/// metadata endpoint.
pub fn build_network_policy(job: &TrainingJob, operator: &OperatorPeer) -> NetworkPolicy {
    let job_name = job.name_any();
    let runtime_pods = LabelSelector {
        match_labels: Some(BTreeMap::from([
            (JOB_LABEL.to_owned(), job_name.clone()),
            (
                "app.kubernetes.io/managed-by".to_owned(),
                MANAGED_BY.to_owned(),
            ),
        ])),
        ..LabelSelector::default()
    };
    let ports = |ports: &[u16]| {
        Some(
            ports
                .iter()
                .map(|&port| NetworkPolicyPort {
                    port: Some(IntOrString::Int(i32::from(port))),
                    protocol: Some("TCP".to_owned()),
                    ..NetworkPolicyPort::default()
                })
                .collect(),
        )
    };
    NetworkPolicy {
        metadata: child_meta(
            job,
            coordinator_service_name(&job_name),
            common_labels(&job_name),
        ),
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(runtime_pods.clone()),
            policy_types: Some(vec!["Ingress".to_owned()]),
            ingress: Some(vec![
                NetworkPolicyIngressRule {
                    from: Some(vec![NetworkPolicyPeer {
                        pod_selector: Some(runtime_pods),
                        ..NetworkPolicyPeer::default()
                    }]),
                    ports: ports(&[ADMIN_PORT, DATA_PORT]),
                },
                NetworkPolicyIngressRule {
                    from: Some(vec![NetworkPolicyPeer {
                        namespace_selector: Some(LabelSelector {
                            match_labels: Some(BTreeMap::from([(
                                "kubernetes.io/metadata.name".to_owned(),
                                operator.namespace.clone(),
                            )])),
                            ..LabelSelector::default()
                        }),
                        pod_selector: Some(LabelSelector {
                            match_labels: Some(operator.pod_labels.clone()),
                            ..LabelSelector::default()
                        }),
                        ..NetworkPolicyPeer::default()
                    }]),
                    ports: ports(&[ADMIN_PORT]),
                },
                NetworkPolicyIngressRule {
                    from: None,
                    ports: ports(&[METRICS_PORT]),
                },
            ]),
            ..NetworkPolicySpec::default()
        }),
    }
}

/// The coordinator pod's PodDisruptionBudget (named like its Service). Without
/// `spec.runtime.checkpoint` the coordinator holds the job's only consistent copy (the BackupPS
/// copy; a new coordinator starts from clock 0), so no eviction may take it while it runs
/// (`minAvailable: 1`: `kubectl drain` and Karpenter wait for the job; the operator's own
/// deletions are not evictions). With a checkpoint, a coordinator told to stop writes its newest
/// copy at once and its replacement resumes there, so it may be evicted (`minAvailable: 0`).
///
/// An integer `minAvailable`, not `maxUnavailable`: for `maxUnavailable` the disruption
/// controller reads the expected pod count from the pods' controller's scale subresource, which
/// a TrainingJob does not have (the real kube-controller-manager marks such a budget SyncFailed,
/// and it then allows no eviction of any kind). A coordinator pod that is not ready (starting,
/// crash-looping) holds nothing yet and may always be evicted, so a broken job never blocks a
/// drain.
pub fn build_disruption_budget(job: &TrainingJob) -> PodDisruptionBudget {
    let job_name = job.name_any();
    let available = if job.spec.runtime.checkpoint.is_some() {
        0
    } else {
        1
    };
    PodDisruptionBudget {
        metadata: child_meta(
            job,
            coordinator_service_name(&job_name),
            common_labels(&job_name),
        ),
        spec: Some(PodDisruptionBudgetSpec {
            min_available: Some(IntOrString::Int(available)),
            selector: Some(LabelSelector {
                match_labels: Some(BTreeMap::from([
                    (JOB_LABEL.to_owned(), job_name),
                    (COORDINATOR_LABEL.to_owned(), "true".to_owned()),
                ])),
                ..LabelSelector::default()
            }),
            unhealthy_pod_eviction_policy: Some("AlwaysAllow".to_owned()),
            ..PodDisruptionBudgetSpec::default()
        }),
        ..PodDisruptionBudget::default()
    }
}

fn env(name: &str, value: impl Into<String>) -> EnvVar {
    EnvVar {
        name: name.to_owned(),
        value: Some(value.into()),
        value_from: None,
    }
}

fn env_field(name: &str, field_path: &str) -> EnvVar {
    EnvVar {
        name: name.to_owned(),
        value: None,
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: field_path.to_owned(),
                api_version: None,
            }),
            ..EnvVarSource::default()
        }),
    }
}

/// Variable `name` from `key` of job `job_name`'s Secret.
fn secret_env(name: &str, job_name: &str, key: &str) -> EnvVar {
    EnvVar {
        name: name.to_owned(),
        value: None,
        value_from: Some(EnvVarSource {
            secret_key_ref: Some(SecretKeySelector {
                name: secret_name(job_name),
                key: key.to_owned(),
                optional: Some(false),
            }),
            ..EnvVarSource::default()
        }),
    }
}

fn default_resources() -> ResourceRequirements {
    let quantities = |cpu: &str, memory: &str| {
        BTreeMap::from([
            ("cpu".to_owned(), Quantity(cpu.to_owned())),
            ("memory".to_owned(), Quantity(memory.to_owned())),
        ])
    };
    ResourceRequirements {
        requests: Some(quantities("1", "1Gi")),
        limits: Some(BTreeMap::from([(
            "memory".to_owned(),
            Quantity("1Gi".to_owned()),
        )])),
        ..ResourceRequirements::default()
    }
}

/// Node placement of a pod: node selector, affinity and tolerations.
struct Placement {
    node_selector: BTreeMap<String, String>,
    required: Vec<NodeSelectorRequirement>,
    tolerations: Vec<Toleration>,
}

fn placement(input: &PlanInput<'_>, role: &PodRole) -> Placement {
    let spec = &input.job.spec;
    let label = capacity_label(input.job, input.config);
    let mut node_selector = BTreeMap::new();
    let mut required = Vec::new();
    let mut tolerations = Vec::new();
    let (capacity, extra_selector, extra_tolerations) = match role {
        PodRole::Reliable { .. } => {
            if !spec.reliable.instance_types.is_empty() {
                required.push(NodeSelectorRequirement {
                    key: INSTANCE_TYPE_NODE_LABEL.to_owned(),
                    operator: "In".to_owned(),
                    values: Some(spec.reliable.instance_types.clone()),
                });
            }
            (
                CapacityType::OnDemand,
                &spec.reliable.node_selector,
                &spec.reliable.tolerations,
            )
        }
        PodRole::Transient { pool, .. } => {
            if !pool.instance_type.is_empty() {
                node_selector.insert(
                    INSTANCE_TYPE_NODE_LABEL.to_owned(),
                    pool.instance_type.clone(),
                );
            }
            if !pool.zone.is_empty() {
                node_selector.insert(ZONE_NODE_LABEL.to_owned(), pool.zone.clone());
            }
            (
                pool.capacity_type,
                &spec.transient.node_selector,
                &spec.transient.tolerations,
            )
        }
    };
    match capacity {
        CapacityType::Spot => {
            node_selector.insert(label.key.clone(), label.spot_value.clone());
            // Spot node pools are often tainted with their own capacity-type label.
            tolerations.push(Toleration {
                key: Some(label.key.clone()),
                operator: Some("Equal".to_owned()),
                value: Some(label.spot_value.clone()),
                effect: Some("NoSchedule".to_owned()),
                toleration_seconds: None,
            });
        }
        CapacityType::OnDemand => match &label.on_demand_value {
            Some(value) => {
                node_selector.insert(label.key.clone(), value.clone());
            }
            // GKE marks only spot nodes; on-demand means the label is absent.
            None => required.push(NodeSelectorRequirement {
                key: label.key.clone(),
                operator: "DoesNotExist".to_owned(),
                values: None,
            }),
        },
    }
    node_selector.extend(extra_selector.iter().map(|(k, v)| (k.clone(), v.clone())));
    tolerations.extend(extra_tolerations.iter().cloned());
    Placement {
        node_selector,
        required,
        tolerations,
    }
}

fn build_pod(input: &PlanInput<'_>, role: &PodRole) -> Pod {
    let job = input.job;
    let spec = &job.spec;
    let job_name = job.name_any();
    let namespace = job.namespace().unwrap_or_default();
    let mut labels = common_labels(&job_name);
    let mut annotations = BTreeMap::new();
    let (name, tier, is_coordinator) = match role {
        PodRole::Reliable { ordinal } => {
            // Karpenter must not consolidate the reliable tier away: the coordinator and the
            // BackupPSs hold the job's only consistent copy (AgileML assumes it stays).
            annotations.insert(DO_NOT_DISRUPT_ANNOTATION.to_owned(), "true".to_owned());
            (
                reliable_pod_name(&job_name, *ordinal),
                Tier::Reliable,
                *ordinal == 0,
            )
        }
        PodRole::Transient { ordinal, pool } => {
            labels.insert(POOL_LABEL.to_owned(), pool_slug(pool));
            annotations.insert(
                INSTANCE_TYPE_ANNOTATION.to_owned(),
                pool.instance_type.clone(),
            );
            annotations.insert(ZONE_ANNOTATION.to_owned(), pool.zone.clone());
            annotations.insert(
                CAPACITY_TYPE_ANNOTATION.to_owned(),
                pool.capacity_type.as_str().to_owned(),
            );
            // the bid is real only where the operator launches the instance (ec2 mode)
            if pool.capacity_type == CapacityType::Spot
                && spec.provisioning.mode == ebbflow_crds::ProvisioningMode::Ec2
                && let Some(bid) = input.decision.max_prices.get(pool)
            {
                annotations.insert(MAX_PRICE_ANNOTATION.to_owned(), bid.to_string());
            }
            (
                transient_pod_name(&job_name, *ordinal),
                Tier::Transient,
                false,
            )
        }
    };
    labels.insert(TIER_LABEL.to_owned(), tier.as_str().to_owned());
    if is_coordinator {
        labels.insert(COORDINATOR_LABEL.to_owned(), "true".to_owned());
    }
    let role_name = if is_coordinator {
        "coordinator"
    } else {
        tier.as_str()
    };

    let mut env_vars = vec![
        env("EBBFLOW_JOB_NAME", job_name.clone()),
        env("EBBFLOW_NAMESPACE", namespace.clone()),
        env("EBBFLOW_ROLE", role_name),
        env("EBBFLOW_TIER", tier.as_str()),
        env(
            "EBBFLOW_COORDINATOR",
            format!(
                "{}.{namespace}.svc:{ADMIN_PORT}",
                coordinator_service_name(&job_name)
            ),
        ),
        env("EBBFLOW_ADMIN_PORT", ADMIN_PORT.to_string()),
        env("EBBFLOW_DATA_PORT", DATA_PORT.to_string()),
        env("EBBFLOW_METRICS_PORT", METRICS_PORT.to_string()),
        // The pinned spec, from the Secret (the same for every pod of a run).
        secret_env("EBBFLOW_JOB_SPEC", &job_name, SPEC_KEY),
        env_field("EBBFLOW_POD_NAME", "metadata.name"),
        env_field("EBBFLOW_NODE_NAME", "spec.nodeName"),
        env_field("EBBFLOW_POD_IP", "status.podIP"),
        secret_env("EBBFLOW_TOKEN", &job_name, TOKEN_KEY),
    ];
    if let Some(threads) = spec.runtime.worker_threads {
        env_vars.push(env("EBBFLOW_WORKER_THREADS", threads.to_string()));
    }
    // The coordinator's checkpoint, on the claim, named after the job's uid (a job created
    // again under the same name does not resume the old one's).
    let checkpoint = spec.runtime.checkpoint.as_ref().filter(|_| is_coordinator);
    if let Some(checkpoint) = checkpoint {
        let id = job.metadata.uid.clone().unwrap_or_else(|| job_name.clone());
        env_vars.push(env(
            "EBBFLOW_CHECKPOINT",
            format!("{CHECKPOINT_DIR}/{id}.ckpt"),
        ));
        let interval = checkpoint
            .interval
            .as_ref()
            .and_then(|d| d.to_duration())
            .unwrap_or(DEFAULT_CHECKPOINT_INTERVAL);
        env_vars.push(env(
            "EBBFLOW_CHECKPOINT_INTERVAL_SECONDS",
            interval.as_secs().max(1).to_string(),
        ));
    }

    let mut volumes = vec![Volume {
        name: "scratch".to_owned(),
        empty_dir: Some(EmptyDirVolumeSource::default()),
        ..Volume::default()
    }];
    let mut mounts = vec![VolumeMount {
        name: "scratch".to_owned(),
        mount_path: "/tmp".to_owned(),
        ..VolumeMount::default()
    }];
    if let Some(checkpoint) = checkpoint {
        volumes.push(Volume {
            name: "checkpoint".to_owned(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: checkpoint.claim_name.clone(),
                read_only: Some(false),
            }),
            ..Volume::default()
        });
        mounts.push(VolumeMount {
            name: "checkpoint".to_owned(),
            mount_path: CHECKPOINT_DIR.to_owned(),
            ..VolumeMount::default()
        });
    }
    if let Some(claim) = &spec.app.dataset.claim_name {
        volumes.push(Volume {
            name: "data".to_owned(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: claim.clone(),
                read_only: Some(true),
            }),
            ..Volume::default()
        });
        mounts.push(VolumeMount {
            name: "data".to_owned(),
            mount_path: "/data".to_owned(),
            read_only: Some(true),
            ..VolumeMount::default()
        });
    }

    let placement = placement(input, role);
    let affinity = (!placement.required.is_empty()).then(|| Affinity {
        node_affinity: Some(NodeAffinity {
            required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                node_selector_terms: vec![NodeSelectorTerm {
                    match_expressions: Some(placement.required),
                    match_fields: None,
                }],
            }),
            ..NodeAffinity::default()
        }),
        ..Affinity::default()
    });

    let port = |name: &str, port: u16| ContainerPort {
        name: Some(name.to_owned()),
        container_port: i32::from(port),
        protocol: Some("TCP".to_owned()),
        ..ContainerPort::default()
    };
    let mut metadata = child_meta(job, name, labels);
    if !annotations.is_empty() {
        metadata.annotations = Some(annotations);
    }
    Pod {
        metadata,
        spec: Some(PodSpec {
            restart_policy: Some("Never".to_owned()),
            termination_grace_period_seconds: Some(
                spec.runtime
                    .termination_grace_period_seconds
                    .unwrap_or(DEFAULT_GRACE_SECONDS),
            ),
            automount_service_account_token: Some(false),
            enable_service_links: Some(false),
            node_selector: (!placement.node_selector.is_empty()).then_some(placement.node_selector),
            affinity,
            tolerations: (!placement.tolerations.is_empty()).then_some(placement.tolerations),
            security_context: Some(PodSecurityContext {
                run_as_non_root: Some(true),
                run_as_user: Some(RUNTIME_USER),
                run_as_group: Some(RUNTIME_USER),
                fs_group: Some(RUNTIME_USER),
                seccomp_profile: Some(SeccompProfile {
                    type_: "RuntimeDefault".to_owned(),
                    localhost_profile: None,
                }),
                ..PodSecurityContext::default()
            }),
            containers: vec![Container {
                name: CONTAINER_NAME.to_owned(),
                image: Some(
                    spec.runtime
                        .image
                        .clone()
                        .unwrap_or_else(|| input.config.default_image.clone()),
                ),
                // `ebbflow pod` (operator/job/src/run/pod.rs) reads everything from `env_vars`.
                command: Some(RUNTIME_COMMAND.iter().map(|s| (*s).to_owned()).collect()),
                // A pod that fails at startup says why in its status (the error it printed).
                termination_message_policy: Some("FallbackToLogsOnError".to_owned()),
                env: Some(env_vars),
                // The admin API on the coordinator pod only; `metrics` on every pod.
                ports: Some(if is_coordinator {
                    vec![
                        port("admin", ADMIN_PORT),
                        port("data", DATA_PORT),
                        port("metrics", METRICS_PORT),
                    ]
                } else {
                    vec![port("data", DATA_PORT), port("metrics", METRICS_PORT)]
                }),
                // Ready once the coordinator's admin API is bound (after its dataset loaded),
                // a node's metrics port as it starts. Before that the operator would find the
                // coordinator unreachable and mark the job Degraded.
                readiness_probe: Some(Probe {
                    tcp_socket: Some(TCPSocketAction {
                        port: IntOrString::String(
                            if is_coordinator { "admin" } else { "metrics" }.to_owned(),
                        ),
                        host: None,
                    }),
                    period_seconds: Some(2),
                    failure_threshold: Some(3),
                    ..Probe::default()
                }),
                resources: Some(
                    spec.runtime
                        .resources
                        .clone()
                        .unwrap_or_else(default_resources),
                ),
                volume_mounts: Some(mounts),
                security_context: Some(SecurityContext {
                    read_only_root_filesystem: Some(true),
                    allow_privilege_escalation: Some(false),
                    run_as_non_root: Some(true),
                    capabilities: Some(Capabilities {
                        drop: Some(vec!["ALL".to_owned()]),
                        add: None,
                    }),
                    ..SecurityContext::default()
                }),
                ..Container::default()
            }],
            volumes: Some(volumes),
            ..PodSpec::default()
        }),
        status: None,
    }
}

/// Transient pods per pool that failed by themselves ([`node_failure`]) and are still listed.
pub fn failed_per_pool(observed: &[ObservedPod<'_>]) -> BTreeMap<PoolKey, u32> {
    transient_per_pool(observed, |p| node_failure(p).is_some())
}

/// Pods the plan keeps that count towards each pool (alive transient pods), for the bidder's
/// view and the status.
pub fn alive_per_pool(observed: &[ObservedPod<'_>]) -> BTreeMap<PoolKey, u32> {
    transient_per_pool(observed, |p| p.alive())
}

/// Transient pods per pool for which `counts` holds.
fn transient_per_pool(
    observed: &[ObservedPod<'_>],
    counts: impl Fn(&ObservedPod<'_>) -> bool,
) -> BTreeMap<PoolKey, u32> {
    let mut per_pool = BTreeMap::new();
    for pod in observed
        .iter()
        .filter(|p| p.tier == Tier::Transient && counts(p))
    {
        *per_pool
            .entry(pod.pool.clone().unwrap_or_default())
            .or_insert(0) += 1;
    }
    per_pool
}

/// When the oldest alive transient pod of each pool was created (its allocation's launch).
pub fn oldest_per_pool(
    observed: &[ObservedPod<'_>],
) -> BTreeMap<PoolKey, k8s_openapi::jiff::Timestamp> {
    let mut oldest: BTreeMap<PoolKey, k8s_openapi::jiff::Timestamp> = BTreeMap::new();
    for pod in observed
        .iter()
        .filter(|p| p.tier == Tier::Transient && p.alive())
    {
        let Some(created) = pod.pod.metadata.creation_timestamp.as_ref() else {
            continue;
        };
        let entry = oldest
            .entry(pod.pool.clone().unwrap_or_default())
            .or_insert(created.0);
        if created.0 < *entry {
            *entry = created.0;
        }
    }
    oldest
}

/// The lowest max price each pool's alive spot pods were bid at ([`MAX_PRICE_ANNOTATION`]; the
/// lowest bid is the first the market takes back). Pods without a readable bid are left out.
pub fn bids_per_pool(observed: &[ObservedPod<'_>]) -> BTreeMap<PoolKey, f64> {
    let mut bids: BTreeMap<PoolKey, f64> = BTreeMap::new();
    for pod in observed
        .iter()
        .filter(|p| p.tier == Tier::Transient && p.alive())
    {
        let Some(bid) = pod
            .pod
            .annotations()
            .get(MAX_PRICE_ANNOTATION)
            .and_then(|text| text.parse::<f64>().ok())
            .filter(|bid| bid.is_finite() && *bid > 0.0)
        else {
            continue;
        };
        let pool = pod.pool.clone().unwrap_or_default();
        if pool.0.capacity_type != CapacityType::Spot {
            continue;
        }
        let entry = bids.entry(pool).or_insert(bid);
        *entry = entry.min(bid);
    }
    bids
}

/// How many unschedulable waits a pool the cluster did not place a pod in is avoided for
/// ([`remember_unplaceable`]): long enough that the bidder does not buy it again at once, short
/// enough that capacity that comes back later is used again.
pub const UNPLACEABLE_WAITS: i64 = 6;

/// The pools where a transient pod of the job has waited for a node for `after` seconds by
/// `now` ([`unschedulable_since`]).
pub fn unplaceable_pools(
    observed: &[ObservedPod<'_>],
    now: k8s_openapi::jiff::Timestamp,
    after: i64,
) -> BTreeSet<PoolKey> {
    observed
        .iter()
        .filter(|p| p.tier == Tier::Transient && !p.deleting)
        .filter(|p| unschedulable_since(p.pod, now, after).is_some())
        .filter_map(|p| p.pool.clone())
        .collect()
}

/// Adds `found` to the pools remembered as unplaceable (each until [`UNPLACEABLE_WAITS`] waits
/// of `after` seconds from `now`), forgets those whose time is up, and returns the rest: the
/// pools the bidder avoids ([`super::capacity::CapacityView::unplaceable`]). Remembered, since
/// the pod that showed it is dropped once the bidder buys elsewhere.
pub fn remember_unplaceable(
    remembered: &mut BTreeMap<PoolKey, k8s_openapi::jiff::Timestamp>,
    found: BTreeSet<PoolKey>,
    now: k8s_openapi::jiff::Timestamp,
    after: i64,
) -> BTreeSet<PoolKey> {
    let until = now + k8s_openapi::jiff::SignedDuration::from_secs(after * UNPLACEABLE_WAITS);
    for pool in found {
        remembered.insert(pool, until);
    }
    remembered.retain(|_, until| *until > now);
    remembered.keys().cloned().collect()
}

/// Pools that have at least one pod under a notice about the pool's capacity
/// ([`NoticeSource::is_capacity_signal`]): a user's `kubectl delete pod` or the operator's own
/// release moved the whole transient tier of a Standard job to another pool before.
pub fn pools_under_notice(observed: &[ObservedPod<'_>]) -> BTreeSet<PoolKey> {
    observed
        .iter()
        .filter(|p| p.tier == Tier::Transient)
        .filter(|p| p.notice.is_some_and(|n| n.source.is_capacity_signal()))
        .filter_map(|p| p.pool.clone())
        .collect()
}

/// True if server-side applying `desired` would change nothing of `observed`: every field
/// `desired` sets is present in `observed` with the same value (fields the API server defaults,
/// or other managers set, do not count). Lists must match element by element, each element by
/// the same rule. `None` (not observed) is never applied.
pub fn already_applied<K: serde::Serialize>(desired: &K, observed: Option<&K>) -> bool {
    let Some(observed) = observed else {
        return false;
    };
    match (
        serde_json::to_value(desired),
        serde_json::to_value(observed),
    ) {
        (Ok(desired), Ok(observed)) => json_within(&desired, &observed),
        _ => false,
    }
}

/// `desired ⊆ observed` in the sense of [`already_applied`].
fn json_within(desired: &serde_json::Value, observed: &serde_json::Value) -> bool {
    use serde_json::Value;
    match (desired, observed) {
        (Value::Object(desired), Value::Object(observed)) => desired.iter().all(|(key, value)| {
            observed
                .get(key)
                .is_some_and(|observed| json_within(value, observed))
        }),
        (Value::Array(desired), Value::Array(observed)) => {
            desired.len() == observed.len()
                && desired
                    .iter()
                    .zip(observed)
                    .all(|(desired, observed)| json_within(desired, observed))
        }
        (desired, observed) => desired == observed,
    }
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
