//! The status step's pure part: phase, conditions, counts and the decision log, computed from
//! the previous status and what this reconcile observed and decided.

use std::collections::BTreeMap;

use ebbflow_crds::{
    AllocationStatus, BidAction, BidDecision, CostStatus, NodeCounts, Phase, PoolNodes,
    TrainingJobStatus,
};
use k8s_openapi::{
    apimachinery::pkg::apis::meta::v1::{Condition, Time},
    jiff::{SignedDuration, Timestamp},
};

use super::plan::{CapacityDecision, ObservedPod, PoolKey, Tier};
use super::stop::StopState;
use crate::{coordinator::CoordinatorStatus, notices::NoticeSource};

/// Condition types this operator sets, besides `Valid` and `Progressing`/`Ready` from the CRD
/// crate.
pub mod conditions {
    /// The spec passed validation.
    pub const VALID: &str = ebbflow_crds::condition_types::VALID;
    /// The reliable tier and coordinator are up.
    pub const READY: &str = ebbflow_crds::condition_types::READY;
    /// Nodes are being provisioned or training advances.
    pub const PROGRESSING: &str = ebbflow_crds::condition_types::PROGRESSING;
    /// Something needs attention but the job continues (coordinator unreachable, node lost).
    pub const DEGRADED: &str = "Degraded";
    /// spec.suspend is in force and nodes are released.
    pub const SUSPENDED: &str = "Suspended";
    /// A stop criterion was met.
    pub const SUCCEEDED: &str = "Succeeded";
    /// The job cannot run as specified.
    pub const FAILED: &str = "Failed";
}

/// Condition reasons (CamelCase), also used as event reasons.
pub mod reasons {
    /// The spec broke a rule; the message names the field.
    pub const INVALID_SPEC: &str = "InvalidSpec";
    /// The spec passed validation.
    pub const VALID_SPEC: &str = "ValidSpec";
    /// The coordinator answered.
    pub const COORDINATOR_READY: &str = "CoordinatorReady";
    /// The coordinator did not answer.
    pub const COORDINATOR_UNREACHABLE: &str = "CoordinatorUnreachable";
    /// The EC2 provisioner could not bring the job's instances to the decision.
    pub const PROVISIONER_FAILED: &str = "ProvisionerFailed";
    /// Reliable pods or the coordinator are not up yet.
    pub const PROVISIONING: &str = "Provisioning";
    /// Training advances.
    pub const TRAINING: &str = "Training";
    /// spec.suspend is true.
    pub const SUSPENDED: &str = "Suspended";
    /// spec.suspend is false.
    pub const NOT_SUSPENDED: &str = "NotSuspended";
    /// A stop criterion was met.
    pub const STOP_CRITERION_MET: &str = "StopCriterionMet";
    /// Training has not finished.
    pub const NOT_FINISHED: &str = "NotFinished";
    /// Training ended.
    pub const FINISHED: &str = "Finished";
    /// A node vanished without notice.
    pub const NODE_LOST: &str = "NodeLost";
    /// Pods have waited for a node for minutes: the scheduler finds none that fits.
    pub const PODS_UNSCHEDULABLE: &str = "PodsUnschedulable";
    /// The kubelet cannot start pods: their image cannot be pulled, or their container not
    /// created (a wrong image name or tag, a missing Secret).
    pub const PODS_NOT_STARTING: &str = "PodsNotStarting";
    /// Nothing is wrong.
    pub const AS_EXPECTED: &str = "AsExpected";
    /// The coordinator reported that training failed.
    pub const TRAINING_FAILED: &str = "TrainingFailed";
    /// The coordinator reported that training diverged (a NaN, infinite or runaway loss).
    pub const DIVERGED: &str = "Diverged";
    /// The coordinator reported that the app's own code failed (a Python hook raised).
    pub const APP_FAILED: &str = "AppFailed";
    /// `spec.bidding.budgetTotal` is spent (see [`super::super::stop`]).
    pub const BUDGET_EXHAUSTED: &str = "BudgetExhausted";
    /// The coordinator pod failed [`super::COORDINATOR_FAILURE_LIMIT`] times in a row.
    pub const COORDINATOR_FAILED: &str = "CoordinatorFailed";
}

/// " and N more" after the first of `count` pods a message names (nothing for one).
fn and_more(count: usize) -> String {
    match count {
        0 | 1 => String::new(),
        n => format!(" and {} more", n - 1),
    }
}

/// What the coordinator query produced this reconcile.
#[derive(Clone, Debug)]
pub enum CoordinatorObservation {
    /// Not asked: its pod is not running yet, or the job is not running.
    NotQueried,
    /// It answered.
    Reported(CoordinatorStatus),
    /// It did not answer (the message names the URL, never a secret).
    Unreachable(String),
}

/// Inputs of [`compute_status`].
#[derive(Clone, Debug)]
pub struct StatusInput<'a> {
    /// The status before this reconcile.
    pub previous: Option<&'a TrainingJobStatus>,
    /// metadata.generation of the job.
    pub generation: Option<i64>,
    /// `Err(message)` if validation failed.
    pub validation: Result<(), String>,
    /// spec.suspend.
    pub suspended: bool,
    /// Desired reliable pods.
    pub reliable_count: u32,
    /// The job's pods, classified.
    pub pods: &'a [ObservedPod<'a>],
    /// Pods created by this reconcile (not yet in `pods`).
    pub creating: usize,
    /// The coordinator's answer.
    pub coordinator: &'a CoordinatorObservation,
    /// Pool changes decided this reconcile (from previous to new counts), for the log.
    pub decision_changes: Vec<BidDecision>,
    /// Evictions first noticed this reconcile.
    pub new_evictions: u64,
    /// The capacity planner's application model for the job, if it keeps one.
    pub app_model: Option<ebbflow_crds::AppModelStatus>,
    /// Why the provisioner (ec2 mode) failed this reconcile, if it did.
    pub provisioner_error: Option<String>,
    /// The job's cost, when its instances are priced ([`super::cost`]).
    pub cost: Option<CostStatus>,
    /// USD per instance-hour each pool is charged now, where the job's market prices it (for
    /// `status.allocations`).
    pub prices: BTreeMap<PoolKey, f64>,
    /// A stop the operator decided ([`super::stop`]).
    pub stop: Option<StopState>,
    /// Times the coordinator pod failed since the coordinator last answered.
    pub coordinator_failures: u32,
    /// Set once those failures reach [`COORDINATOR_FAILURE_LIMIT`]: why the job fails.
    pub coordinator_failed: Option<String>,
    /// Node pods that failed by themselves in a row ([`NodeFailures`]).
    pub node_failures: NodeFailures,
    /// Seconds a pod may wait for a node before it is named unschedulable
    /// ([`super::plan::unschedulable_since`]).
    pub unschedulable_after: i64,
    /// Per pod that cannot be scheduled: its pool's nodes that are not Ready
    /// ([`super::plan::unready_pool_nodes`]), named in the Degraded condition.
    pub unready_nodes: BTreeMap<String, Vec<String>>,
    /// Now.
    pub now: Timestamp,
}

/// The job's transient allocations: its alive pods per pool, bought when the oldest of them
/// was created, at the lowest bid their pods record, charged at the pool's price now.
pub fn allocations(
    pods: &[ObservedPod<'_>],
    prices: &BTreeMap<PoolKey, f64>,
) -> Vec<AllocationStatus> {
    let launched = super::plan::oldest_per_pool(pods);
    let bids = super::plan::bids_per_pool(pods);
    super::plan::alive_per_pool(pods)
        .into_iter()
        .filter(|(_, count)| *count > 0)
        .map(|(pool, count)| AllocationStatus {
            id: super::plan::pool_slug(&pool.0),
            count,
            max_price: bids.get(&pool).copied(),
            price: prices.get(&pool).copied(),
            since: launched.get(&pool).map(|at| Time(*at)),
            pool: pool.0,
        })
        .collect()
}

/// Sets condition `type_` in `conditions`, keeping lastTransitionTime when the status did not
/// change so that repeated reconciles write identical statuses.
pub fn set_condition(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: bool,
    reason: &str,
    message: &str,
    generation: Option<i64>,
    now: Timestamp,
) {
    let status_text = if status { "True" } else { "False" };
    let last_transition_time = conditions
        .iter()
        .find(|c| c.type_ == type_ && c.status == status_text)
        .map_or(Time(now), |c| c.last_transition_time.clone());
    let condition = Condition {
        type_: type_.to_owned(),
        status: status_text.to_owned(),
        reason: reason.to_owned(),
        message: message.to_owned(),
        observed_generation: generation,
        last_transition_time,
    };
    match conditions.iter_mut().find(|c| c.type_ == type_) {
        Some(existing) => *existing = condition,
        None => conditions.push(condition),
    }
}

/// True if the condition `type_` is set with `status`.
pub fn condition_is(status: Option<&TrainingJobStatus>, type_: &str, value: bool) -> bool {
    let text = if value { "True" } else { "False" };
    status
        .and_then(|s| s.condition(type_))
        .is_some_and(|c| c.status == text)
}

/// True once the job failed in training (final; an invalid spec is not final).
pub fn training_failed(status: Option<&TrainingJobStatus>) -> bool {
    failed_for(status, reasons::TRAINING_FAILED)
        || failed_for(status, reasons::DIVERGED)
        || failed_for(status, reasons::APP_FAILED)
}

/// Coordinator pod failures in a row (without the coordinator answering in between) after
/// which the job fails instead of replacing the pod again: a bad dataset path or a spec the
/// runtime refuses fails every pod the same way.
pub const COORDINATOR_FAILURE_LIMIT: u32 = 3;

/// A failure after which a node pod's failures in a row start again from one.
pub const NODE_FAILURE_RESET: std::time::Duration = std::time::Duration::from_secs(600);

/// Node pods that failed by themselves in a row, and the last one's time and message.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeFailures {
    /// Failures in a row.
    pub count: u32,
    /// When the last one happened, and why.
    pub last: Option<(Timestamp, String)>,
}

impl NodeFailures {
    /// The failures a job's status holds (an operator restarted, or a new leader, carries on
    /// with them; the message is not kept).
    pub fn from_status(status: Option<&TrainingJobStatus>) -> Self {
        let Some(status) = status else {
            return Self::default();
        };
        Self {
            count: status.node_failures,
            last: status
                .last_node_failure_time
                .as_ref()
                .map(|at| (at.0, String::new())),
        }
    }

    /// Counts a failure at `at`; one more than [`NODE_FAILURE_RESET`] after the last starts
    /// the count again.
    pub fn record(&mut self, at: Timestamp, message: String) {
        let fresh = self.last.as_ref().is_none_or(|(last, _)| {
            at.duration_since(*last)
                > SignedDuration::try_from(NODE_FAILURE_RESET).unwrap_or_default()
        });
        self.count = if fresh { 1 } else { self.count + 1 };
        let newest = self.last.as_ref().is_none_or(|(last, _)| at >= *last);
        if newest {
            self.last = Some((at, message));
        }
    }

    /// Until when new node pods wait: the last failure plus `backoff(count)`; `None` once that
    /// has passed (or with no failure).
    pub fn hold_until(
        &self,
        backoff: impl Fn(u32) -> std::time::Duration,
        now: Timestamp,
    ) -> Option<Timestamp> {
        let (last, _) = self.last.as_ref()?;
        let wait = SignedDuration::try_from(backoff(self.count)).ok()?;
        let until = last.checked_add(wait).ok()?;
        (self.count > 0 && until > now).then_some(until)
    }
}

/// True if the job failed because its coordinator pod kept failing.
pub fn coordinator_failed(status: Option<&TrainingJobStatus>) -> bool {
    failed_for(status, reasons::COORDINATOR_FAILED)
}

/// True if the job failed because its total budget is spent.
pub fn budget_exhausted(status: Option<&TrainingJobStatus>) -> bool {
    failed_for(status, reasons::BUDGET_EXHAUSTED)
}

fn failed_for(status: Option<&TrainingJobStatus>, reason: &str) -> bool {
    status.is_some_and(|s| s.phase == Some(Phase::Failed))
        && status
            .and_then(|s| s.condition(conditions::FAILED))
            .is_some_and(|c| c.status == "True" && c.reason == reason)
}

/// True once the job is over for good: succeeded, failed in training, or out of budget. Its
/// nodes stay released and nobody is told about departures any more.
pub fn is_final(status: Option<&TrainingJobStatus>) -> bool {
    status.and_then(|s| s.phase) == Some(Phase::Succeeded)
        || training_failed(status)
        || budget_exhausted(status)
        || coordinator_failed(status)
}

/// The new status.
pub fn compute_status(input: &StatusInput<'_>) -> TrainingJobStatus {
    let mut status = input.previous.cloned().unwrap_or_default();
    let generation = input.generation;
    let now = input.now;
    status.observed_generation = generation;
    let set =
        |status: &mut TrainingJobStatus, type_: &str, value: bool, reason: &str, message: &str| {
            set_condition(
                &mut status.conditions,
                type_,
                value,
                reason,
                message,
                generation,
                now,
            );
        };

    // Counts of ready pods per tier and pool.
    let ready = |tier: Tier| {
        input
            .pods
            .iter()
            .filter(move |p| p.tier == tier && p.ready())
    };
    let reliable_ready = ready(Tier::Reliable).count() as u32;
    let mut pools: BTreeMap<PoolKey, u32> = BTreeMap::new();
    for pod in ready(Tier::Transient) {
        *pools
            .entry(pod.pool.clone().unwrap_or_default())
            .or_insert(0) += 1;
    }
    let transient_ready: u32 = pools.values().sum();
    status.allocations = allocations(input.pods, &input.prices);
    status.nodes = Some(NodeCounts {
        reliable: reliable_ready,
        transient: transient_ready,
        total: reliable_ready + transient_ready,
        pools: pools
            .into_iter()
            .map(|(pool, count)| PoolNodes {
                pool: pool.0,
                count,
            })
            .collect(),
    });
    status.evictions += input.new_evictions;
    for decision in &input.decision_changes {
        status.push_decision(decision.clone());
    }
    if let CoordinatorObservation::Reported(report) = input.coordinator {
        status.stage = report.stage.or(status.stage);
        status.iteration = report.iteration.or(status.iteration);
        status.loss = report.loss.or(status.loss);
        status.migrations = status.migrations.max(report.migrations);
        status.rollbacks = status.rollbacks.max(report.rollbacks);
    }
    if let Some(model) = &input.app_model {
        status.app_model = Some(model.clone());
    }
    if let Some(cost) = &input.cost {
        status.cost = Some(cost.clone());
    }
    if !coordinator_failed(Some(&status)) {
        status.coordinator_failures = input.coordinator_failures;
    }
    status.node_failures = input.node_failures.count;
    status.last_node_failure_time = input.node_failures.last.as_ref().map(|(at, _)| Time(*at));
    if let Some(stop) = &input.stop {
        status.stop_reason = Some(stop.criterion.field().to_owned());
        status
            .stop_requested_time
            .get_or_insert(Time(stop.requested_at));
    }

    if let Err(message) = &input.validation {
        status.phase = Some(Phase::Failed);
        set(
            &mut status,
            conditions::VALID,
            false,
            reasons::INVALID_SPEC,
            message,
        );
        set(
            &mut status,
            conditions::FAILED,
            true,
            reasons::INVALID_SPEC,
            message,
        );
        set(
            &mut status,
            conditions::READY,
            false,
            reasons::INVALID_SPEC,
            message,
        );
        set(
            &mut status,
            conditions::PROGRESSING,
            false,
            reasons::INVALID_SPEC,
            message,
        );
        return status;
    }
    set(
        &mut status,
        conditions::VALID,
        true,
        reasons::VALID_SPEC,
        "the spec passed validation",
    );
    // Failures the operator decides, final: the budget is spent and the coordinator stopped
    // (or did not answer), or the coordinator pod kept failing.
    let out_of_budget = input
        .stop
        .as_ref()
        .filter(|stop| stop.confirmed && !stop.criterion.succeeds())
        .map(|stop| stop.message.clone());
    for (reason, failed_now, summary) in [
        (
            reasons::BUDGET_EXHAUSTED,
            out_of_budget,
            "spec.bidding.budgetTotal is spent",
        ),
        (
            reasons::COORDINATOR_FAILED,
            input.coordinator_failed.clone(),
            "the coordinator pod kept failing",
        ),
    ] {
        let already = failed_for(Some(&status), reason);
        if !already && failed_now.is_none() {
            continue;
        }
        if let Some(message) = failed_now.filter(|_| !already) {
            status.completion_time = Some(Time(now));
            set(&mut status, conditions::FAILED, true, reason, &message);
        }
        status.phase = Some(Phase::Failed);
        for type_ in [conditions::READY, conditions::PROGRESSING] {
            set(&mut status, type_, false, reason, summary);
        }
        return status;
    }
    if !training_failed(Some(&status)) {
        set(
            &mut status,
            conditions::FAILED,
            false,
            reasons::AS_EXPECTED,
            "",
        );
    }

    // Training failed (the coordinator says so): final, like success.
    let failure = match input.coordinator {
        CoordinatorObservation::Reported(report) => report.failed.clone().map(|message| {
            let reason = report
                .failed_reason
                .clone()
                .filter(|reason| {
                    [reasons::DIVERGED, reasons::APP_FAILED].contains(&reason.as_str())
                })
                .unwrap_or_else(|| reasons::TRAINING_FAILED.to_owned());
            (reason, message)
        }),
        _ => None,
    };
    if training_failed(Some(&status)) || failure.is_some() {
        if !training_failed(Some(&status)) {
            status.completion_time = Some(Time(now));
            let (reason, message) = failure.unwrap_or_default();
            set(&mut status, conditions::FAILED, true, &reason, &message);
        }
        status.phase = Some(Phase::Failed);
        set(
            &mut status,
            conditions::READY,
            false,
            reasons::TRAINING_FAILED,
            "training failed",
        );
        set(
            &mut status,
            conditions::PROGRESSING,
            false,
            reasons::TRAINING_FAILED,
            "training failed",
        );
        return status;
    }
    let finished_report = match input.coordinator {
        CoordinatorObservation::Reported(report) if report.finished => Some(report),
        _ => None,
    };
    let already_succeeded = status.phase == Some(Phase::Succeeded);
    // A stop the operator decided, confirmed: success on the criterion's terms (unless the
    // coordinator finished on its own first).
    let stopped = input
        .stop
        .as_ref()
        .filter(|stop| stop.confirmed && stop.criterion.succeeds());
    if already_succeeded || finished_report.is_some() || stopped.is_some() {
        if !already_succeeded {
            status.completion_time = Some(Time(now));
        }
        status.phase = Some(Phase::Succeeded);
        let (reason, message) = match (finished_report, stopped) {
            (Some(report), _) => (
                report
                    .reason
                    .clone()
                    .filter(|r| !r.is_empty() && r.chars().all(|c| c.is_ascii_alphanumeric()))
                    .unwrap_or_else(|| reasons::STOP_CRITERION_MET.to_owned()),
                "training reached a stop criterion".to_owned(),
            ),
            (None, Some(stop)) => (stop.criterion.reason().to_owned(), stop.message.clone()),
            (None, None) => (reasons::STOP_CRITERION_MET.to_owned(), String::new()),
        };
        if !already_succeeded {
            set(&mut status, conditions::SUCCEEDED, true, &reason, &message);
        }
        set(
            &mut status,
            conditions::READY,
            false,
            reasons::FINISHED,
            "training finished",
        );
        set(
            &mut status,
            conditions::PROGRESSING,
            false,
            reasons::FINISHED,
            "training finished",
        );
        set(
            &mut status,
            conditions::SUSPENDED,
            false,
            reasons::NOT_SUSPENDED,
            "",
        );
        set(
            &mut status,
            conditions::DEGRADED,
            false,
            reasons::AS_EXPECTED,
            "",
        );
        return status;
    }
    set(
        &mut status,
        conditions::SUCCEEDED,
        false,
        reasons::NOT_FINISHED,
        "",
    );

    if input.suspended {
        status.phase = Some(Phase::Suspended);
        set(
            &mut status,
            conditions::SUSPENDED,
            true,
            reasons::SUSPENDED,
            "spec.suspend is true; nodes are released",
        );
        set(
            &mut status,
            conditions::READY,
            false,
            reasons::SUSPENDED,
            "the job is suspended",
        );
        set(
            &mut status,
            conditions::PROGRESSING,
            false,
            reasons::SUSPENDED,
            "the job is suspended",
        );
        set(
            &mut status,
            conditions::DEGRADED,
            false,
            reasons::AS_EXPECTED,
            "",
        );
        return status;
    }
    set(
        &mut status,
        conditions::SUSPENDED,
        false,
        reasons::NOT_SUSPENDED,
        "",
    );

    let lost: Vec<&str> = input
        .pods
        .iter()
        .filter(|p| p.notice.is_some_and(|n| n.source == NoticeSource::NodeGone))
        .map(|p| p.name)
        .collect();
    // Pods the scheduler has found no node for in minutes: named with the scheduler's reason,
    // ahead of what follows from them (an unreachable coordinator whose pod never started).
    let mut stuck: Vec<(&str, k8s_openapi::jiff::Timestamp, String)> = input
        .pods
        .iter()
        .filter(|p| !p.deleting)
        .filter_map(|p| {
            let (since, why) =
                super::plan::unschedulable_since(p.pod, now, input.unschedulable_after)?;
            Some((p.name, since, why))
        })
        .collect();
    stuck.sort_by_key(|(name, since, _)| (*since, *name));
    // Pods the kubelet cannot start (an image that cannot be pulled): named with its reason,
    // ahead of the unreachable coordinator that follows when the coordinator's is one of them.
    let mut not_starting: Vec<(&str, String, String)> = input
        .pods
        .iter()
        .filter(|p| !p.deleting)
        .filter_map(|p| {
            let (reason, why) = super::plan::not_starting(p.pod)?;
            Some((p.name, reason, why))
        })
        .collect();
    not_starting.sort();
    match input.coordinator {
        _ if !not_starting.is_empty() => {
            let (first, reason, why) = &not_starting[0];
            let others = and_more(not_starting.len());
            let why = if why.is_empty() {
                String::new()
            } else {
                format!(": {why}")
            };
            let message = format!("{first}{others} cannot start ({reason}){why}");
            set(
                &mut status,
                conditions::DEGRADED,
                true,
                reasons::PODS_NOT_STARTING,
                &message,
            );
        }
        _ if !stuck.is_empty() => {
            let (first, since, why) = &stuck[0];
            let waited = now.as_second() - since.as_second();
            let waited = if waited < 120 {
                format!("{waited} s")
            } else {
                format!("{} min", waited / 60)
            };
            let others = and_more(stuck.len());
            let nodes = match input.unready_nodes.get(*first).map(Vec::as_slice) {
                None | Some([]) => String::new(),
                Some([node]) => format!("; its pool's node {node}"),
                Some(nodes) => format!("; its pool's nodes {}", nodes.join(", ")),
            };
            let message =
                format!("{first}{others} cannot be scheduled (for {waited}): {why}{nodes}");
            set(
                &mut status,
                conditions::DEGRADED,
                true,
                reasons::PODS_UNSCHEDULABLE,
                &message,
            );
        }
        CoordinatorObservation::Unreachable(message) => {
            set(
                &mut status,
                conditions::DEGRADED,
                true,
                reasons::COORDINATOR_UNREACHABLE,
                message,
            );
        }
        _ if input.provisioner_error.is_some() => {
            set(
                &mut status,
                conditions::DEGRADED,
                true,
                reasons::PROVISIONER_FAILED,
                input.provisioner_error.as_deref().unwrap_or_default(),
            );
        }
        _ if !lost.is_empty() => {
            let message = format!("nodes of {} vanished without notice", lost.join(", "));
            set(
                &mut status,
                conditions::DEGRADED,
                true,
                reasons::NODE_LOST,
                &message,
            );
        }
        _ => set(
            &mut status,
            conditions::DEGRADED,
            false,
            reasons::AS_EXPECTED,
            "",
        ),
    }

    let coordinator_up = matches!(input.coordinator, CoordinatorObservation::Reported(_));
    if coordinator_up && reliable_ready >= input.reliable_count {
        if status.start_time.is_none() {
            status.start_time = Some(Time(now));
        }
        status.phase = Some(Phase::Running);
        set(
            &mut status,
            conditions::READY,
            true,
            reasons::COORDINATOR_READY,
            "the reliable tier and coordinator are up",
        );
        set(
            &mut status,
            conditions::PROGRESSING,
            true,
            reasons::TRAINING,
            "training is advancing",
        );
    } else {
        let was_running = status.phase == Some(Phase::Running);
        status.phase = Some(if was_running {
            Phase::Running
        } else if input.pods.is_empty() && input.creating == 0 {
            Phase::Pending
        } else {
            Phase::Provisioning
        });
        let (reason, message) = match input.coordinator {
            CoordinatorObservation::Unreachable(_) => (
                reasons::COORDINATOR_UNREACHABLE,
                "the coordinator does not answer".to_owned(),
            ),
            _ => (
                reasons::PROVISIONING,
                format!(
                    "{reliable_ready} of {} reliable nodes ready",
                    input.reliable_count
                ),
            ),
        };
        set(&mut status, conditions::READY, false, reason, &message);
        set(
            &mut status,
            conditions::PROGRESSING,
            true,
            reasons::PROVISIONING,
            &message,
        );
    }
    status
}

/// Log entries for the change from `before` to `after` pool counts (Acquire/Release per pool;
/// nothing when equal).
pub fn decision_changes(
    before: &BTreeMap<PoolKey, u32>,
    decision: &CapacityDecision,
    now: Timestamp,
) -> Vec<BidDecision> {
    let after = &decision.transient;
    let pools: std::collections::BTreeSet<&PoolKey> = before.keys().chain(after.keys()).collect();
    pools
        .into_iter()
        .filter_map(|pool| {
            let old = before.get(pool).copied().unwrap_or(0);
            let new = after.get(pool).copied().unwrap_or(0);
            let (action, count) = match new.cmp(&old) {
                std::cmp::Ordering::Greater => (BidAction::Acquire, new - old),
                std::cmp::Ordering::Less => (BidAction::Release, old - new),
                std::cmp::Ordering::Equal => return None,
            };
            Some(BidDecision {
                time: Time(now),
                action,
                pool: Some(pool.0.clone()),
                count,
                max_price: match action {
                    BidAction::Acquire => decision.max_prices.get(pool).copied(),
                    _ => None,
                },
                expected_cost_per_work: decision.expected_cost_per_work,
                reason: decision.reason.clone(),
            })
        })
        .collect()
}

/// The label of `phase` in the jobs gauge.
pub fn phase_name(phase: Option<Phase>) -> &'static str {
    match phase {
        None | Some(Phase::Pending) => "Pending",
        Some(Phase::Provisioning) => "Provisioning",
        Some(Phase::Running) => "Running",
        Some(Phase::Suspended) => "Suspended",
        Some(Phase::Succeeded) => "Succeeded",
        Some(Phase::Failed) => "Failed",
    }
}

#[cfg(test)]
#[path = "status_tests.rs"]
mod tests;
