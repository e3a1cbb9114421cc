//! What every reconcile, the notice relay and the interruption watcher share: the operator's
//! settings ([`Config`]), its per-job memory between reconciles and the [`Context`] passed to
//! each (never global).

use std::{
    collections::{BTreeMap, BTreeSet, HashMap, HashSet},
    sync::Arc,
    time::{Duration, Instant},
};

use ebbflow_crds::TrainingJob;
use kube::{
    Client,
    runtime::{events::Recorder, reflector::ObjectRef},
};
use kube::{
    Resource,
    runtime::events::{Event, EventType},
};
use parking_lot::Mutex;
use tracing::warn;

use super::{
    caches::Caches,
    capacity::CapacityPlanner,
    cost,
    plan::{PlanConfig, PoolKey},
    status,
    validate::Capabilities,
};
use crate::{coordinator::CoordinatorClient, metrics::Metrics, notices::NoticeLedger};

/// Operator settings that shape reconciliation.
#[derive(Clone, Debug)]
pub struct Config {
    /// Image defaults and the capacity-type label.
    pub plan: PlanConfig,
    /// Talk to this coordinator URL for every job instead of the job's Service (tests,
    /// port-forwards).
    pub coordinator_url_override: Option<String>,
    /// What this deployment supports (EC2 provisioning).
    pub capabilities: Capabilities,
    /// Requeue while nodes are being provisioned.
    pub provisioning_requeue: Duration,
    /// First retry delay after a failure; doubles per consecutive failure.
    pub backoff_base: Duration,
    /// Longest retry delay.
    pub backoff_max: Duration,
    /// Progress-only status changes (iteration, loss) are written at most this often.
    pub status_interval: Duration,
    /// Reconcile the jobs of this namespace only (`None`: every namespace).
    pub namespace: Option<String>,
    /// How often the interruption watcher asks EC2 about the spot instances of ec2-mode jobs
    /// ([`super::interruptions::run`]).
    pub interruption_poll: Duration,
    /// Trailing-edge debounce of reconcile requests per job: a job whose pods are being
    /// created, scheduled and started changes many times a second, and one reconcile after the
    /// burst does the work of all. Notices do not wait for it: they take the relay.
    pub debounce: Duration,
    /// Reconciles run at once, across jobs (0: no limit). Each holds its job's pods, plan and
    /// API responses; at hundreds of jobs on a slow API server, unbounded, they made the peak
    /// memory of a 500-job run swing from 210 to 370 MiB. Notices do not wait for it.
    pub max_concurrent_reconciles: u16,
    /// How long a pod may wait for a node before the job's Degraded condition names it
    /// (`PodsUnschedulable`).
    pub unschedulable_after: Duration,
}

impl Config {
    /// Defaults for `image`, with the capacity-type label of the Karpenter preset.
    pub fn new(default_image: impl Into<String>) -> Self {
        Self {
            plan: PlanConfig {
                default_image: default_image.into(),
                capacity_label: ebbflow_crds::CapacityTypeLabel::default().resolved(),
                network_policy: None,
            },
            coordinator_url_override: None,
            capabilities: Capabilities::default(),
            provisioning_requeue: Duration::from_secs(10),
            backoff_base: Duration::from_secs(5),
            backoff_max: Duration::from_secs(300),
            status_interval: Duration::from_secs(15),
            namespace: None,
            interruption_poll: Duration::from_secs(5),
            debounce: Duration::from_secs(1),
            max_concurrent_reconciles: 16,
            unschedulable_after: Duration::from_secs(
                super::plan::UNSCHEDULABLE_AFTER_SECONDS.unsigned_abs(),
            ),
        }
    }
}

/// What the controller remembers per job between reconciles. Losing it (restart) only resends
/// notices and relogs a decision.
#[derive(Debug, Default)]
pub(super) struct JobMemory {
    pub(super) ledger: NoticeLedger,
    /// The job's data-plane token as last observed (the relay's, to skip a Secret GET).
    pub(super) token: Option<String>,
    pub(super) last_decision: Option<BTreeMap<PoolKey, u32>>,
    pub(super) consecutive_failures: u32,
    pub(super) last_status_write: Option<Instant>,
    pub(super) phase: Option<&'static str>,
    /// The job's instances and their charges.
    pub(super) cost: cost::CostLedger,
    /// Failed coordinator pods already counted (by uid).
    pub(super) counted_failures: BTreeSet<String>,
    /// Why the last of them failed.
    pub(super) last_failure: Option<String>,
    /// Node pods that failed by themselves, in a row (counted once each, by uid, in
    /// `counted_failures`).
    pub(super) node_failures: status::NodeFailures,
    /// The transient ordinal after every one this operator created pods with.
    pub(super) next_transient_ordinal: u32,
    /// Evictions counted so far. The status is written by server-side apply without a
    /// precondition, so a reconcile of an object older than the last write (the watch had not
    /// caught up) would write its older count back; the count never goes below this.
    pub(super) evictions: u64,
    /// The job was in ec2 provisioning mode at its last reconcile (an edit out of it releases
    /// the instances it launched).
    pub(super) ec2_mode: bool,
    /// The training shape of the spec last warned about as waiting for the next start.
    pub(super) warned_shape: Option<String>,
    /// Pools the cluster did not place the job's pods in, avoided until then
    /// ([`super::plan::remember_unplaceable`]).
    pub(super) unplaceable: BTreeMap<PoolKey, k8s_openapi::jiff::Timestamp>,
}

/// Nodes → jobs with pods on them, fed by reconciles; maps Node watch events back to jobs.
#[derive(Clone, Debug, Default)]
pub struct NodeIndex {
    inner: Arc<Mutex<HashMap<String, HashSet<ObjectRef<TrainingJob>>>>>,
}

impl NodeIndex {
    /// Records that `job`'s pods run on exactly `nodes`.
    pub fn update(&self, job: &ObjectRef<TrainingJob>, nodes: &BTreeSet<String>) {
        let mut index = self.inner.lock();
        index.retain(|node, jobs| {
            if !nodes.contains(node) {
                jobs.remove(job);
            }
            !jobs.is_empty()
        });
        for node in nodes {
            index.entry(node.clone()).or_default().insert(job.clone());
        }
    }

    /// The jobs with pods on `node`.
    pub fn jobs_on(&self, node: &str) -> Vec<ObjectRef<TrainingJob>> {
        self.inner
            .lock()
            .get(node)
            .map(|jobs| jobs.iter().cloned().collect())
            .unwrap_or_default()
    }
}

/// Everything reconcile needs, passed in (never global).
pub struct Context {
    /// Kubernetes client.
    pub client: Client,
    /// Publishes Kubernetes Events on TrainingJobs.
    pub recorder: Recorder,
    /// Operator metrics.
    pub metrics: Metrics,
    /// Settings.
    pub config: Config,
    /// Talks to job coordinators.
    pub coordinator: CoordinatorClient,
    /// Decides transient pool counts (the bidder seam).
    pub capacity: Arc<dyn CapacityPlanner>,
    /// Launches and terminates EC2 instances for jobs in ec2 provisioning mode, when enabled.
    pub ec2: Option<ebbflow_job::provision::Ec2Provisioner>,
    /// Node → jobs index for the Node watch.
    pub node_index: NodeIndex,
    /// Pod and Node caches, filled by the notice relay ([`super::relay::run`]).
    pub caches: Caches,
    pub(super) memory: Mutex<HashMap<ObjectRef<TrainingJob>, JobMemory>>,
}

impl Context {
    /// A context from its parts.
    pub fn new(
        client: Client,
        recorder: Recorder,
        metrics: Metrics,
        config: Config,
        coordinator: CoordinatorClient,
        capacity: Arc<dyn CapacityPlanner>,
    ) -> Self {
        Self {
            client,
            recorder,
            metrics,
            config,
            coordinator,
            capacity,
            ec2: None,
            node_index: NodeIndex::default(),
            caches: Caches::default(),
            memory: Mutex::new(HashMap::new()),
        }
    }

    /// Enables ec2 provisioning through `provisioner` (and says so to validation).
    pub fn with_ec2(mut self, provisioner: ebbflow_job::provision::Ec2Provisioner) -> Self {
        self.ec2 = Some(provisioner);
        self.config.capabilities.ec2 = true;
        self
    }

    pub(super) fn with_memory<T>(
        &self,
        job: &ObjectRef<TrainingJob>,
        f: impl FnOnce(&mut JobMemory) -> T,
    ) -> T {
        f(self.memory.lock().entry(job.clone()).or_default())
    }

    pub(super) fn backoff(&self, failures: u32) -> Duration {
        exponential_backoff(self.config.backoff_base, self.config.backoff_max, failures)
    }
}

/// The wait after `failures` consecutive failures: `first` after one, doubling per failure, at
/// most `max`.
pub(super) fn exponential_backoff(first: Duration, max: Duration, failures: u32) -> Duration {
    let factor = 2_u32.saturating_pow(failures.saturating_sub(1).min(16));
    (first * factor).min(max)
}

pub(super) async fn publish(
    ctx: &Context,
    job: &TrainingJob,
    type_: EventType,
    reason: &str,
    action: &str,
    note: String,
) {
    let event = Event {
        type_,
        reason: reason.to_owned(),
        note: Some(note),
        action: action.to_owned(),
        secondary: None,
    };
    if let Err(error) = ctx.recorder.publish(&event, &job.object_ref(&())).await {
        // Events are best effort: losing one must not fail the reconcile.
        warn!(%error, reason, "publish event failed");
    }
}
