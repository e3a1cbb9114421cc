//! The TrainingJob controller: `reconcile` as observe → validate → plan → apply → status, under
//! kube's finalizer helper, with children written by server-side apply under one field manager.

pub mod bidbrain;
pub mod caches;
pub mod calibration;
pub mod capacity;
pub mod context;
pub mod cost;
pub mod delivery;
pub mod interruptions;
pub mod plan;
pub mod relay;
pub mod secret;
pub mod status;
pub mod stop;
pub mod validate;

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
    time::{Duration, Instant},
};

use ebbflow_crds::{TrainingJob, TrainingJobStatus};
use futures::StreamExt;
use k8s_openapi::{
    api::core::v1::{Node, Pod, Secret, Service},
    api::networking::v1::NetworkPolicy,
    api::policy::v1::PodDisruptionBudget,
    jiff::{SignedDuration, Timestamp},
};
use kube::{
    Api, Client, Resource, ResourceExt,
    api::{DeleteParams, ListParams, Patch, PatchParams},
    runtime::{
        Controller, WatchStreamExt,
        controller::Action,
        events::EventType,
        finalizer::{self, finalizer},
        reflector::ObjectRef,
        watcher,
    },
};
use serde_json::json;
use tracing::{debug, info, instrument, warn};

pub use self::context::{Config, Context, NodeIndex};
use self::{
    capacity::CapacityView,
    context::publish,
    delivery::{Delivery, deliver_notice, notify},
    plan::{Activity, CapacityDecision, DeleteReason, PlanInput, PoolKey},
    secret::{fresh_token, job_secret, job_token, secret_text, token_of},
    status::{CoordinatorObservation, StatusInput, conditions, reasons},
};
use crate::{
    coordinator::{coordinator_service_name, coordinator_url},
    notices::{self, Notice, NoticeSource},
};

/// The field manager of every server-side apply, and the finalizer's prefix.
pub const MANAGER: &str = "ebbflow-operator";

/// The finalizer the operator puts on every TrainingJob.
pub const FINALIZER: &str = "ebbflow.dev/cleanup";

/// Errors of the observe step.
#[derive(Debug, thiserror::Error)]
pub enum ObserveError {
    /// Listing the job's pods failed.
    #[error("list pods of the job: {0}")]
    ListPods(#[source] kube::Error),
    /// Reading the token Secret failed.
    #[error("get secret {name}: {source}")]
    GetSecret {
        /// Secret name.
        name: String,
        /// Cause.
        source: kube::Error,
    },
    /// Reading a Node failed.
    #[error("get node {name}: {source}")]
    GetNode {
        /// Node name.
        name: String,
        /// Cause.
        source: kube::Error,
    },
}

/// Errors of the apply step.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    /// Server-side apply of a child failed.
    #[error("apply {kind} {name}: {source}")]
    Apply {
        /// Child kind.
        kind: &'static str,
        /// Child name.
        name: String,
        /// Cause.
        source: kube::Error,
    },
    /// Deleting a child failed.
    #[error("delete {kind} {name}: {source}")]
    Delete {
        /// Child kind.
        kind: &'static str,
        /// Child name.
        name: String,
        /// Cause.
        source: kube::Error,
    },
}

/// Errors of the status step.
#[derive(Debug, thiserror::Error)]
pub enum StatusError {
    /// Server-side apply of the status failed.
    #[error("apply status: {0}")]
    Patch(#[source] kube::Error),
}

/// Errors of one reconcile run.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The object lacks something every TrainingJob has (namespace).
    #[error("invalid object: {0}")]
    InvalidObject(&'static str),
    /// Observing the cluster failed.
    #[error(transparent)]
    Observe(#[from] ObserveError),
    /// Applying children failed.
    #[error(transparent)]
    Apply(#[from] ApplyError),
    /// Writing the status failed.
    #[error(transparent)]
    Status(#[from] StatusError),
    /// The EC2 provisioner failed (cleanup: the finalizer stays until it succeeds).
    #[error("provisioner: {0}")]
    Provision(#[source] ebbflow_job::provision::ProvisionError),
    /// Adding or removing the finalizer failed.
    #[error("finalizer: {0}")]
    Finalizer(#[source] Box<finalizer::Error<Error>>),
}

impl Error {
    /// A closed, CamelCase category for metric labels and event reasons.
    pub fn category(&self) -> &'static str {
        match self {
            Self::InvalidObject(_) => "InvalidObject",
            Self::Provision(_) => "Provisioner",
            Self::Observe(_) | Self::Apply(_) | Self::Status(_) => "Kubernetes",
            Self::Finalizer(inner) => match inner.as_ref() {
                finalizer::Error::ApplyFailed(error) | finalizer::Error::CleanupFailed(error) => {
                    error.category()
                }
                _ => "Finalizer",
            },
        }
    }
}

/// Reconciles one TrainingJob.
#[instrument(skip(job, ctx), fields(job = %job.name_any(), namespace = job.namespace().unwrap_or_default()))]
pub async fn reconcile(job: Arc<TrainingJob>, ctx: Arc<Context>) -> Result<Action, Error> {
    ctx.metrics.reconciliations.inc();
    let namespace = job
        .namespace()
        .ok_or(Error::InvalidObject("namespace missing"))?;
    // counted from here: an early return above left the gauge raised for good
    ctx.metrics.reconciles_in_flight.inc();
    let started = Instant::now();
    let jobs: Api<TrainingJob> = Api::namespaced(ctx.client.clone(), &namespace);
    let result = finalizer(&jobs, FINALIZER, job, |event| async {
        match event {
            finalizer::Event::Apply(job) => apply_job(job, ctx.clone()).await,
            finalizer::Event::Cleanup(job) => cleanup_job(job, ctx.clone()).await,
        }
    })
    .await
    .map_err(|error| Error::Finalizer(Box::new(error)));
    ctx.metrics
        .reconcile_duration
        .observe(started.elapsed().as_secs_f64());
    ctx.metrics.reconciles_in_flight.dec();
    result
}

/// Retry policy after an error: exponential backoff per job, counted in metrics.
pub fn error_policy(job: Arc<TrainingJob>, error: &Error, ctx: Arc<Context>) -> Action {
    ctx.metrics
        .reconcile_errors
        .with_label_values(&[error.category()])
        .inc();
    let failures = ctx.with_memory(&ObjectRef::from_obj(job.as_ref()), |memory| {
        memory.consecutive_failures += 1;
        memory.consecutive_failures
    });
    let delay = ctx.backoff(failures);
    warn!(job = %job.name_any(), category = error.category(), %error, delay_seconds = delay.as_secs(), "reconcile failed");
    Action::requeue(delay)
}

/// Everything observed about one job.
struct Observed {
    pods: Vec<Pod>,
    token: Option<String>,
    /// The spec the job's runtime pods were started with (in the job's Secret).
    pinned_spec: Option<String>,
    nodes: BTreeMap<String, notices::NodeObservation>,
}

async fn observe(
    job: &TrainingJob,
    ctx: &Context,
    namespace: &str,
) -> Result<Observed, ObserveError> {
    let name = job.name_any();
    // The relay's caches first (the controller was triggered by the watch that filled them);
    // the API server while they fill, or when they do not hold the Secret.
    let pods = match ctx.caches.job_pods(namespace, &name) {
        Some(pods) => pods,
        None => {
            let pods_api: Api<Pod> = Api::namespaced(ctx.client.clone(), namespace);
            pods_api
                .list(&ListParams::default().labels(&plan::job_selector(&name)))
                .await
                .map_err(ObserveError::ListPods)?
                .items
        }
    };
    let secret_name = plan::secret_name(&name);
    let secret = match ctx.caches.secret(namespace, &secret_name) {
        Some(secret) => Some(secret),
        None => job_secret(ctx, namespace, &name)
            .await
            .map_err(|source| ObserveError::GetSecret {
                name: secret_name,
                source,
            })?
            .map(Arc::new),
    };
    let token = secret.as_deref().and_then(token_of);
    let pinned_spec = secret
        .as_deref()
        .and_then(|secret| secret_text(secret, plan::SPEC_KEY));
    let node_names: BTreeSet<String> = pods
        .iter()
        .filter_map(|pod| pod.spec.as_ref()?.node_name.clone())
        .collect();
    let nodes_api: Api<Node> = Api::all(ctx.client.clone());
    let mut nodes = BTreeMap::new();
    for node_name in node_names {
        // The relay's cache first; the API server for nodes it does not hold (yet), which is
        // also what tells a deleted node from one the cache has not seen.
        let node = match ctx.caches.node(&node_name) {
            Some(node) => Some(node.as_ref().clone()),
            None => {
                nodes_api
                    .get_opt(&node_name)
                    .await
                    .map_err(|source| ObserveError::GetNode {
                        name: node_name.clone(),
                        source,
                    })?
            }
        };
        let observation = match node {
            Some(node) => notices::NodeObservation::Present(Box::new(node)),
            None => notices::NodeObservation::Gone,
        };
        nodes.insert(node_name, observation);
    }
    Ok(Observed {
        pods,
        token,
        pinned_spec,
        nodes,
    })
}

/// While the job's pods run the pinned spec, an edit of what makes up its training state (the
/// app, consistency, worker and partition counts: the job id) cannot reach them: the note that
/// says so, or `None` when the shapes agree (or nothing is pinned).
fn shape_edit_pending(job: &TrainingJob, observed: &Observed) -> Option<String> {
    if observed.pods.is_empty() {
        return None;
    }
    let pinned: ebbflow_crds::TrainingJobSpec =
        serde_json::from_str(observed.pinned_spec.as_deref()?).ok()?;
    let running = TrainingJob {
        spec: pinned,
        ..job.clone()
    };
    let (was, now) = (
        ebbflow_job::run::job_id(&running),
        ebbflow_job::run::job_id(job),
    );
    (was != now).then(|| {
        format!(
            "the spec's training shape changed while the job runs; its pods keep the spec they \
             started with, and the edit applies at the next start (suspend and resume; a \
             checkpoint of the old shape is refused): running {was}, edited {now}"
        )
    })
}

/// The stop the operator enforces for `job`, if one of its criteria is met (now or before; see
/// [`stop`]): asks the coordinator to stop until it reports the job stopped, and says whether
/// the job is over.
async fn stop_job(
    ctx: &Context,
    job: &TrainingJob,
    previous: Option<&TrainingJobStatus>,
    report: Option<&crate::coordinator::CoordinatorStatus>,
    cost: Option<&ebbflow_crds::CostStatus>,
    (base, token): (&str, Option<&str>),
    now: Timestamp,
) -> Option<stop::StopState> {
    let progress = stop::Progress {
        started: previous.and_then(|s| s.start_time.as_ref()).map(|t| t.0),
        loss: report.and_then(|r| r.loss),
        spent: cost
            .or(previous.and_then(|s| s.cost.as_ref()))
            .map(|c| c.spent),
    };
    let met = stop::reached(job, &progress, now);
    let recorded = previous
        .and_then(|s| s.stop_reason.as_deref())
        .and_then(stop::Criterion::from_field);
    let (criterion, message) = match (recorded, met) {
        (Some(criterion), Some((now_met, message))) if now_met == criterion => (criterion, message),
        (Some(criterion), _) => (criterion, format!("spec.{} was met", criterion.field())),
        (None, Some(met)) => met,
        (None, None) => return None,
    };
    let requested_at = previous
        .and_then(|s| s.stop_requested_time.as_ref())
        .map_or(now, |t| t.0);
    if recorded.is_none() {
        info!(criterion = criterion.field(), %message, "stop criterion met; stopping the job");
        publish(
            ctx,
            job,
            EventType::Normal,
            "Stopping",
            "Stop",
            format!("{message}; the coordinator is asked to stop"),
        )
        .await;
    }
    let over = report.is_some_and(|r| r.ended());
    // A coordinator that answers but refuses the stop does not hold the job either.
    let mut answers = report.is_some();
    if answers
        && !over
        && let Err(error) = ctx.coordinator.stop(base, token).await
    {
        warn!(%error, "the coordinator was not told to stop; retrying next reconcile");
        answers = false;
    }
    Some(stop::StopState {
        criterion,
        message,
        requested_at,
        confirmed: stop::confirmed(over, answers, requested_at, now),
    })
}

async fn apply_job(job: Arc<TrainingJob>, ctx: Arc<Context>) -> Result<Action, Error> {
    let namespace = job
        .namespace()
        .ok_or(Error::InvalidObject("namespace missing"))?;
    let name = job.name_any();
    let job_ref = ObjectRef::from_obj(job.as_ref());
    let now = Timestamp::now();
    let previous = job.status.as_ref();

    // observe
    let observed = observe(&job, &ctx, &namespace).await?;
    let node_names: BTreeSet<String> = observed.nodes.keys().cloned().collect();
    ctx.node_index.update(&job_ref, &node_names);
    let live_pods: Vec<&str> = observed
        .pods
        .iter()
        .filter_map(|pod| pod.metadata.name.as_deref())
        .collect();
    ctx.with_memory(&job_ref, |memory| {
        memory.ledger.retain_pods(&live_pods);
        memory.token.clone_from(&observed.token);
    });

    // validate
    let errors = validate::validate(&job, ctx.config.capabilities);
    if !errors.is_empty() {
        let message = validate::message(&errors);
        let already_reported = previous
            .and_then(|s| s.condition(conditions::VALID))
            .is_some_and(|c| c.status == "False" && c.message == message);
        if !already_reported {
            publish(
                &ctx,
                &job,
                EventType::Warning,
                reasons::INVALID_SPEC,
                "Validate",
                message.clone(),
            )
            .await;
        }
        let pods_observed = plan::observe_pods(&name, &observed.pods, &[]);
        let status = status::compute_status(&StatusInput {
            previous,
            generation: job.metadata.generation,
            validation: Err(message),
            suspended: job.spec.suspend,
            reliable_count: job.spec.reliable.count,
            pods: &pods_observed,
            creating: 0,
            coordinator: &CoordinatorObservation::NotQueried,
            decision_changes: Vec::new(),
            new_evictions: 0,
            app_model: None,
            provisioner_error: None,
            cost: None,
            prices: BTreeMap::new(),
            stop: None,
            coordinator_failures: 0,
            coordinator_failed: None,
            node_failures: status::NodeFailures::from_status(previous),
            unschedulable_after: ctx.config.unschedulable_after.as_secs() as i64,
            unready_nodes: BTreeMap::new(),
            now,
        });
        write_status(&ctx, &job, &job_ref, &namespace, status).await?;
        ctx.with_memory(&job_ref, |memory| memory.consecutive_failures = 0);
        // Nothing changes until the spec does: wait for the next generation, no retry loop.
        return Ok(Action::await_change());
    }

    // notices: what is leaving, from nodes and pods, and what EC2 told the interruption watcher
    // (before, the reconcile saw an EC2 interruption only once the node was gone: no early
    // replacement, eviction count, pool signal or refund)
    let current_notices = ctx.with_memory(&job_ref, |memory| {
        memory
            .ledger
            .with_external(notices::notices(&observed.pods, &observed.nodes, now))
    });
    // Succeeded and failed-in-training are final: nodes stay released.
    let already_succeeded = status::is_final(previous);
    let coordinator_base = coordinator_url(
        &name,
        &namespace,
        crate::coordinator::uses_tls(&job),
        ctx.config.coordinator_url_override.as_deref(),
    );

    // observe the coordinator, when there is one to ask
    let coordinator_pod_ready = observed.pods.iter().any(plan::is_ready_coordinator);
    let ask_coordinator = !job.spec.suspend
        && !already_succeeded
        && (coordinator_pod_ready || ctx.config.coordinator_url_override.is_some());
    let coordinator = if ask_coordinator {
        match ctx
            .coordinator
            .status(&coordinator_base, observed.token.as_deref())
            .await
        {
            Ok(report) => {
                ctx.metrics
                    .coordinator_requests
                    .with_label_values(&["ok"])
                    .inc();
                CoordinatorObservation::Reported(report)
            }
            Err(error) => {
                ctx.metrics
                    .coordinator_requests
                    .with_label_values(&["error"])
                    .inc();
                CoordinatorObservation::Unreachable(error.to_string())
            }
        }
    } else {
        CoordinatorObservation::NotQueried
    };
    let coordinator_reachable = !matches!(coordinator, CoordinatorObservation::Unreachable(_));

    // deliver notices not yet delivered
    let undelivered: Vec<Notice> = ctx.with_memory(&job_ref, |memory| {
        memory
            .ledger
            .undelivered(&current_notices)
            .into_iter()
            .cloned()
            .collect()
    });
    let new_evictions =
        ctx.with_memory(&job_ref, |memory| memory.ledger.count_new(&current_notices));
    // Notices not through (the coordinator unreachable, or not answering the POST) are tried
    // again well before their deadline, not at the next decision (120 s by default, past EC2's
    // two minutes); one the coordinator refuses (4xx) waits for the usual cadence.
    let not_through: Vec<&Notice> =
        if coordinator_reachable && !matches!(coordinator, CoordinatorObservation::NotQueried) {
            // All at once, as the relay does: a slow POST must not hold the others back.
            let outcomes = futures::future::join_all(undelivered.iter().map(|notice| {
                notify(
                    &ctx,
                    &job,
                    &coordinator_base,
                    observed.token.as_deref(),
                    notice,
                    now,
                )
            }))
            .await;
            undelivered
                .iter()
                .zip(outcomes)
                .filter(|(_, outcome)| *outcome == Delivery::Failed)
                .map(|(notice, _)| notice)
                .collect()
        } else {
            undelivered.iter().collect()
        };
    let retry_notices_by = not_through.iter().map(|notice| notice.leaves_at).min();

    // cost: the job's instances charged on its market, when it has one
    let report = match &coordinator {
        CoordinatorObservation::Reported(report) => Some(report),
        _ => None,
    };
    let classified = plan::observe_pods(&name, &observed.pods, &current_notices);
    let alive = plan::alive_per_pool(&classified);
    let (cost, spend_rate, prices) = match ctx.capacity.pricing(&job, now) {
        Some(pricing) => {
            let job_over = already_succeeded || report.is_some_and(|r| r.ended());
            let previous_cost = previous.and_then(|s| s.cost.as_ref());
            let prices: BTreeMap<PoolKey, f64> = alive
                .keys()
                .filter_map(|pool| {
                    pricing
                        .price_at(pool, now)
                        .map(|price| (pool.clone(), price))
                })
                .collect();
            ctx.with_memory(&job_ref, |memory| {
                let cost = memory
                    .cost
                    .observe(&pricing, &classified, job_over, now, previous_cost);
                (Some(cost), memory.cost.spend_rate(&pricing), prices)
            })
        }
        None => (None, 0.0, BTreeMap::new()),
    };

    if let Some(cost) = &cost {
        let before = previous
            .and_then(|s| s.cost.as_ref())
            .map(|c| c.unpriced.as_slice())
            .unwrap_or_default();
        if !cost.unpriced.is_empty() && cost.unpriced != before {
            publish(
                &ctx,
                &job,
                EventType::Warning,
                "UnpricedInstances",
                "Charge",
                format!(
                    "{} run in pools the job's market has no price for (instance type and zone \
                     not in spec.bidding.market); they are not in status.cost.spent",
                    cost.unpriced.join(", ")
                ),
            )
            .await;
        }
    }

    // stop criteria the operator enforces
    let stop = if already_succeeded || job.spec.suspend {
        None
    } else {
        stop_job(
            &ctx,
            &job,
            previous,
            report,
            cost.as_ref(),
            (&coordinator_base, observed.token.as_deref()),
            now,
        )
        .await
    };

    // the coordinator pod's failures in a row: each failed pod counted once, reset whenever the
    // coordinator answers; at the limit the job fails instead of replacing it again
    let failed_coordinators: Vec<(String, String)> = classified
        .iter()
        .filter_map(|pod| {
            let meta = &pod.pod.metadata;
            let id = meta.uid.clone().or(meta.name.clone())?;
            Some((id, plan::coordinator_failure(pod)?))
        })
        .collect();
    let (coordinator_failures, last_failure) = ctx.with_memory(&job_ref, |memory| {
        let mut count = if report.is_some() {
            0
        } else {
            previous.map_or(0, |s| s.coordinator_failures)
        };
        for (id, message) in failed_coordinators {
            if memory.counted_failures.insert(id) {
                warn!(%message, "the coordinator pod failed");
                count += 1;
                memory.last_failure = Some(message);
            }
        }
        (count, memory.last_failure.clone())
    });
    let coordinator_failed = (!already_succeeded
        && coordinator_failures >= status::COORDINATOR_FAILURE_LIMIT)
        .then(|| {
            format!(
                "the coordinator pod failed {coordinator_failures} times in a row; the last time: {}",
                last_failure.unwrap_or_else(|| "no message".to_owned())
            )
        });

    // node pods that failed by themselves: each counted once; while they keep failing, new
    // node pods wait for the retry backoff after the last one (a crash loop would otherwise
    // recreate pods, and with a provisioner launch instances, every reconcile)
    let failed_nodes: Vec<(String, &str, plan::PodFailure)> = classified
        .iter()
        .filter_map(|pod| {
            let id = pod
                .pod
                .metadata
                .uid
                .clone()
                .unwrap_or_else(|| pod.name.to_owned());
            Some((id, pod.name, plan::node_failure(pod)?))
        })
        .collect();
    let (node_failures, newly_failed) = ctx.with_memory(&job_ref, |memory| {
        // a fresh memory (operator restart, new leader) starts from the status; a failure at or
        // before the last one there was counted by the operator before
        let restored = memory
            .node_failures
            .last
            .is_none()
            .then(|| status::NodeFailures::from_status(previous))
            .filter(|failures| failures.last.is_some());
        let seen_until = restored
            .as_ref()
            .and_then(|r| r.last.as_ref())
            .map(|(at, _)| *at);
        if let Some(restored) = restored {
            memory.node_failures = restored;
        }
        let mut newly = Vec::new();
        let mut latest: Option<(Timestamp, String)> = None;
        for (id, pod_name, failure) in failed_nodes {
            let seen = seen_until.is_some_and(|until| failure.at.is_some_and(|at| at <= until));
            if memory.counted_failures.insert(id) && !seen {
                let at = failure.at.unwrap_or(now);
                if latest.as_ref().is_none_or(|(last, _)| at >= *last) {
                    latest = Some((at, failure.message.clone()));
                }
                newly.push((pod_name.to_owned(), failure.message));
            }
        }
        // node pods failing together have one cause (a lost coordinator, a bad node): one
        // failure in the row, or every node pod would wait the longest backoff at once
        if let Some((at, message)) = latest {
            memory.node_failures.record(at, message);
        }
        (memory.node_failures.clone(), newly)
    });
    for (pod_name, message) in &newly_failed {
        warn!(pod = %pod_name, %message, "a node pod failed");
        ctx.metrics.node_pod_failures.inc();
        publish(
            &ctx,
            &job,
            EventType::Warning,
            "NodePodFailed",
            "Replace",
            format!(
                "{pod_name} failed ({} in a row): {message}",
                node_failures.count
            ),
        )
        .await;
    }
    let hold_nodes_until = node_failures.hold_until(|n| ctx.backoff(n), now);

    // decide capacity
    let finished = already_succeeded
        || report.is_some_and(|r| r.finished || r.failed.is_some())
        || stop.as_ref().is_some_and(|s| s.confirmed)
        || coordinator_failed.is_some();
    let activity = if finished {
        Activity::Finished
    } else if job.spec.suspend {
        Activity::Suspend
    } else {
        Activity::Run
    };
    let under_notice = plan::pools_under_notice(&classified);
    let launched = plan::oldest_per_pool(&classified);
    let bids = plan::bids_per_pool(&classified);
    let failed = plan::failed_per_pool(&classified);
    let after = ctx.config.unschedulable_after.as_secs() as i64;
    let unplaceable = ctx.with_memory(&job_ref, |memory| {
        let found = plan::unplaceable_pools(&classified, now, after);
        if !found.is_empty() && found.iter().any(|p| !memory.unplaceable.contains_key(p)) {
            info!(job = %name, pools = ?found, "pods waited past the unschedulable wait: buying elsewhere");
        }
        plan::remember_unplaceable(&mut memory.unplaceable, found, now, after)
    });
    let decision = if activity == Activity::Run {
        let view = CapacityView {
            job: &job,
            alive: &alive,
            launched: &launched,
            bids: &bids,
            pools_under_notice: &under_notice,
            failed: &failed,
            unplaceable: &unplaceable,
            coordinator: match &coordinator {
                CoordinatorObservation::Reported(report) => Some(report),
                _ => None,
            },
            now,
        };
        let decision = ctx.capacity.decide(&view);
        if decision.total() == 0 && !unplaceable.is_empty() {
            // nowhere else to buy: hold the pools the cluster is slow to place in (their pods
            // wait, and the status says why)
            ctx.capacity.decide(&CapacityView {
                unplaceable: &BTreeSet::new(),
                ..view
            })
        } else {
            decision
        }
    } else {
        CapacityDecision {
            reason: match activity {
                Activity::Suspend => "Suspended".to_owned(),
                _ => "Finished".to_owned(),
            },
            ..CapacityDecision::default()
        }
    };
    let decision_changes = ctx.with_memory(&job_ref, |memory| {
        let before = memory
            .last_decision
            .clone()
            .unwrap_or_else(|| alive.clone());
        let changes = status::decision_changes(&before, &decision, now);
        memory.last_decision = Some(decision.transient.clone());
        changes
    });

    // An edit of the training state's shape waits for the next start: say so once.
    if let Some(note) = shape_edit_pending(&job, &observed) {
        let current = ebbflow_job::run::job_id(&job);
        let new = ctx.with_memory(&job_ref, |memory| {
            let new = memory.warned_shape.as_ref() != Some(&current);
            memory.warned_shape = Some(current);
            new
        });
        if new {
            publish(
                &ctx,
                &job,
                EventType::Warning,
                "ShapeEditPending",
                "Plan",
                note,
            )
            .await;
        }
    }

    // plan (transient ordinals above any this operator handed out, even if the cached job's
    // status does not show the last write yet)
    let fresh = fresh_token();
    let handed_out = ctx.with_memory(&job_ref, |memory| memory.next_transient_ordinal);
    let recorded = previous.map_or(0, |s| s.next_transient_ordinal);
    let job_for_plan = (handed_out > recorded).then(|| {
        let mut copy = (*job).clone();
        copy.status.get_or_insert_default().next_transient_ordinal = handed_out;
        copy
    });
    let mut desired = plan::plan(&PlanInput {
        job: job_for_plan.as_ref().unwrap_or(&job),
        pods: &observed.pods,
        existing_token: observed.token.as_deref(),
        existing_spec: observed.pinned_spec.as_deref(),
        fresh_token: &fresh,
        notices: &current_notices,
        decision: &decision,
        activity,
        config: &ctx.config.plan,
    });
    if let Some(until) = hold_nodes_until {
        let held = plan::hold_node_pods(&mut desired.create);
        if held > 0 {
            debug!(held, %until, "node pods held back after failures");
        }
    }

    // instances (ec2 mode): the reliable tier and the decision's transient pools; a job edited
    // out of ec2 mode releases the instances it launched
    let was_ec2 = ctx.with_memory(&job_ref, |memory| {
        std::mem::replace(
            &mut memory.ec2_mode,
            job.spec.provisioning.mode == ebbflow_crds::ProvisioningMode::Ec2,
        )
    });
    let provisioner_error = match (&ctx.ec2, job.spec.provisioning.mode) {
        (Some(provisioner), mode) if was_ec2 && mode != ebbflow_crds::ProvisioningMode::Ec2 => {
            match terminate_job_instances(&ctx, provisioner, &job).await {
                Ok(terminated) => {
                    if !terminated.is_empty() {
                        publish(
                            &ctx,
                            &job,
                            EventType::Normal,
                            "InstancesTerminated",
                            "Provision",
                            format!(
                                "{} (the job left ec2 provisioning mode)",
                                terminated.join(", ")
                            ),
                        )
                        .await;
                    }
                    None
                }
                Err(error) => {
                    // try again next reconcile
                    ctx.with_memory(&job_ref, |memory| memory.ec2_mode = true);
                    Some(error.to_string())
                }
            }
        }
        (Some(provisioner), ebbflow_crds::ProvisioningMode::Ec2) => {
            let wanted = if activity == Activity::Run {
                ebbflow_job::provision::wanted_for(&job, &decision.transient, &decision.max_prices)
            } else {
                Vec::new()
            };
            // what each instance hosts, of this job or another (pods are placed by pool): one
            // whose pods the plan releases now, or that are shutting down, is terminated only
            // once they are gone, and one hosting any other pod last
            let releasing: BTreeSet<&str> =
                desired.delete.iter().map(|d| d.name.as_str()).collect();
            let every_pod = ctx
                .caches
                .managed_pods()
                .unwrap_or_else(|| observed.pods.clone());
            let uses = crate::instances::instance_uses(
                &every_pod,
                |node_name| {
                    let instance = |node: &k8s_openapi::api::core::v1::Node| {
                        crate::instances::node_instance(node).map(str::to_owned)
                    };
                    match observed.nodes.get(node_name) {
                        Some(notices::NodeObservation::Present(node)) => instance(node),
                        _ => ctx.caches.node(node_name).and_then(|node| instance(&node)),
                    }
                },
                |pod| {
                    pod.metadata.namespace.as_deref() == Some(namespace.as_str())
                        && pod.labels().get(plan::JOB_LABEL) == Some(&name)
                        && releasing.contains(pod.metadata.name.as_deref().unwrap_or_default())
                },
                now,
            );
            match provisioner.reconcile(&job, &wanted, &uses).await {
                Ok(outcome) => {
                    ctx.metrics
                        .instances
                        .with_label_values(&["launched"])
                        .inc_by(outcome.launched.len() as u64);
                    ctx.metrics
                        .instances
                        .with_label_values(&["terminated"])
                        .inc_by(outcome.terminated.len() as u64);
                    if !outcome.draining.is_empty() {
                        debug!(
                            draining = ?outcome.draining,
                            "extra instances wait for their pods to shut down"
                        );
                    }
                    for (reason, ids) in [
                        ("InstancesLaunched", &outcome.launched),
                        ("InstancesTerminated", &outcome.terminated),
                    ] {
                        if !ids.is_empty() {
                            publish(
                                &ctx,
                                &job,
                                EventType::Normal,
                                reason,
                                "Provision",
                                format!("{} ({} held)", ids.join(", "), outcome.held),
                            )
                            .await;
                        }
                    }
                    None
                }
                Err(error) => {
                    ctx.metrics
                        .reconcile_errors
                        .with_label_values(&["Provisioner"])
                        .inc();
                    warn!(%error, "ec2 provisioning failed; retrying with backoff");
                    Some(error.to_string())
                }
            }
        }
        _ => None,
    };

    // apply
    let params = PatchParams::apply(MANAGER).force();
    // An apply that would change nothing the cache shows is skipped: at hundreds of jobs these
    // were two writes per reconcile. A child a user changed or deleted differs, and is applied.
    let secret_name = plan::secret_name(&name);
    let cached = ctx.caches.secret(&namespace, &secret_name);
    apply_unless_applied(&ctx, &namespace, &secret_name, &desired.secret, cached).await?;
    let service_name = coordinator_service_name(&name);
    let cached = ctx.caches.service(&namespace, &service_name);
    apply_unless_applied(&ctx, &namespace, &service_name, &desired.service, cached).await?;
    let cached = ctx.caches.budget(&namespace, &service_name);
    apply_unless_applied(
        &ctx,
        &namespace,
        &service_name,
        &desired.disruption_budget,
        cached,
    )
    .await?;
    if let Some(policy) = &desired.network_policy {
        let cached = ctx.caches.network_policy(&namespace, &service_name);
        apply_unless_applied(&ctx, &namespace, &service_name, policy, cached).await?;
    }
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &namespace);
    let mut created = Vec::new();
    for pod in &desired.create {
        let pod_name = pod.name_any();
        pods.patch(&pod_name, &params, &Patch::Apply(pod))
            .await
            .map_err(|source| ApplyError::Apply {
                kind: "Pod",
                name: pod_name.clone(),
                source,
            })?;
        let tier = pod
            .labels()
            .get(plan::TIER_LABEL)
            .cloned()
            .unwrap_or_default();
        ctx.metrics
            .pods_created
            .with_label_values(&[tier.as_str()])
            .inc();
        created.push(pod_name);
    }
    if job.spec.suspend && !desired.delete.is_empty() && coordinator_pod_ready {
        // Let the coordinator push state to its backups before its nodes go.
        if let Err(error) = ctx
            .coordinator
            .stop(&coordinator_base, observed.token.as_deref())
            .await
        {
            debug!(%error, "stop before suspend not delivered");
        }
    }
    let grace = job
        .spec
        .runtime
        .termination_grace_period_seconds
        .unwrap_or(plan::DEFAULT_GRACE_SECONDS);
    for deletion in &desired.delete {
        if deletion.reason != DeleteReason::Replace && coordinator_reachable {
            // Our own releases are notices too: the coordinator migrates before SIGTERM. Marked
            // released first, so delivering the notice never counts as an eviction.
            ctx.with_memory(&job_ref, |memory| {
                memory.ledger.mark_released(&deletion.name)
            });
            let notice = Notice {
                pod: deletion.name.clone(),
                node: None,
                leaves_at: now + SignedDuration::from_secs(grace),
                source: NoticeSource::ScaleDown,
            };
            if !matches!(coordinator, CoordinatorObservation::NotQueried)
                && deliver_notice(
                    &ctx,
                    (&namespace, &name),
                    &coordinator_base,
                    observed.token.as_deref(),
                    &notice,
                    now,
                )
                .await
                    == Delivery::Delivered
            {
                ctx.with_memory(&job_ref, |memory| memory.ledger.record(&notice));
            }
        }
        match pods.delete(&deletion.name, &DeleteParams::default()).await {
            // counted only when this reconcile deleted it (a pod the cache still lists after
            // it went is not deleted twice)
            Ok(_) => ctx
                .metrics
                .pods_deleted
                .with_label_values(&[deletion.reason.as_str()])
                .inc(),
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(source) => {
                return Err(ApplyError::Delete {
                    kind: "Pod",
                    name: deletion.name.clone(),
                    source,
                }
                .into());
            }
        }
    }
    if !created.is_empty() {
        publish(
            &ctx,
            &job,
            EventType::Normal,
            "PodsCreated",
            "Scale",
            format!("created {}", created.join(", ")),
        )
        .await;
    }
    if !desired.delete.is_empty() {
        let mut by_reason: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for deletion in &desired.delete {
            by_reason
                .entry(deletion.reason.as_str())
                .or_default()
                .push(&deletion.name);
        }
        for (reason, names) in by_reason {
            publish(
                &ctx,
                &job,
                EventType::Normal,
                "PodsDeleted",
                "Scale",
                format!("deleted {} ({reason})", names.join(", ")),
            )
            .await;
        }
    }

    // status
    let mut new_status = status::compute_status(&StatusInput {
        previous,
        generation: job.metadata.generation,
        validation: Ok(()),
        suspended: job.spec.suspend,
        reliable_count: job.spec.reliable.count,
        pods: &classified,
        creating: desired.create.len(),
        coordinator: &coordinator,
        decision_changes,
        new_evictions,
        app_model: decision.app_model.clone(),
        provisioner_error: provisioner_error.clone(),
        cost,
        prices,
        stop,
        coordinator_failures,
        coordinator_failed,
        node_failures: node_failures.clone(),
        unschedulable_after: ctx.config.unschedulable_after.as_secs() as i64,
        unready_nodes: unready_nodes(&ctx, &classified, now),
        now,
    });
    new_status.evictions = ctx.with_memory(&job_ref, |memory| {
        memory.evictions =
            memory.evictions.max(previous.map_or(0, |s| s.evictions)) + new_evictions;
        memory.evictions
    });
    // above every transient pod observed or created now, and any handed out before
    new_status.next_transient_ordinal = plan::next_transient_ordinal(
        plan::next_transient_ordinal(recorded.max(handed_out), &classified),
        &plan::observe_pods(&name, &desired.create, &[]),
    );
    ctx.with_memory(&job_ref, |memory| {
        memory.next_transient_ordinal = new_status.next_transient_ordinal;
    });
    transition_events(&ctx, &job, previous, &new_status).await;
    write_status(&ctx, &job, &job_ref, &namespace, new_status.clone()).await?;

    // requeue
    let failures = ctx.with_memory(&job_ref, |memory| {
        if coordinator_reachable && provisioner_error.is_none() {
            memory.consecutive_failures = 0;
        } else {
            memory.consecutive_failures += 1;
        }
        memory.consecutive_failures
    });
    let interval = job
        .spec
        .bidding
        .decision_interval
        .to_duration()
        .unwrap_or(Duration::from_secs(120));
    // a budget or wall-clock limit may run out before the next decision
    let limits = stop::next_check(
        &job,
        &stop::Progress {
            started: new_status.start_time.as_ref().map(|t| t.0),
            loss: None,
            spent: new_status.cost.as_ref().map(|c| c.spent),
        },
        spend_rate,
        now,
    );
    let stopping = new_status.stop_reason.is_some();
    // held node pods are created when the backoff ends (whole seconds, rounded up, so the
    // reconcile does not come a moment early and hold again)
    let held_for = hold_nodes_until.map(|until| {
        let wait = until.duration_since(now).as_secs_f64().max(0.0);
        Duration::from_secs(wait.ceil() as u64)
    });
    let notice_retry = retry_notices_by.map(|deadline| notice_retry_delay(deadline, now));
    let sooner = |delay: Duration| {
        [held_for, notice_retry]
            .into_iter()
            .flatten()
            .fold(delay, Duration::min)
    };
    let action = if !coordinator_reachable || provisioner_error.is_some() {
        Action::requeue(sooner(ctx.backoff(failures)))
    } else if activity != Activity::Run {
        Action::await_change()
    } else if new_status.phase != Some(ebbflow_crds::Phase::Running)
        || !desired.create.is_empty()
        || !desired.delete.is_empty()
        || stopping
    {
        Action::requeue(sooner(ctx.config.provisioning_requeue.min(interval)))
    } else {
        Action::requeue(sooner(limits.map_or(interval, |limit| limit.min(interval))))
    };
    Ok(action)
}

/// For each of the job's pods the status names as unschedulable (not deleting, waiting past
/// the operator's wait): its pool's nodes that are not Ready, from the Node cache (none looked
/// up while no pod has waited that long).
fn unready_nodes(
    ctx: &Context,
    pods: &[plan::ObservedPod<'_>],
    now: Timestamp,
) -> BTreeMap<String, Vec<String>> {
    let after = ctx.config.unschedulable_after.as_secs() as i64;
    let stuck: Vec<&plan::ObservedPod<'_>> = pods
        .iter()
        .filter(|p| !p.deleting && plan::unschedulable_since(p.pod, now, after).is_some())
        .collect();
    if stuck.is_empty() {
        return BTreeMap::new();
    }
    let nodes = ctx.caches.nodes.state();
    stuck
        .into_iter()
        .map(|p| {
            let unready = plan::unready_pool_nodes(p.pod, nodes.iter().map(|n| n.as_ref()));
            (p.name.to_owned(), unready)
        })
        .filter(|(_, unready)| !unready.is_empty())
        .collect()
}

/// How long to wait before posting again a notice not delivered, whose instance leaves at
/// `deadline`: a quarter of the time left, between 1 s and 15 s (a deadline passed: 1 s, the
/// coordinator still learns of the loss sooner than from heartbeats).
fn notice_retry_delay(deadline: Timestamp, now: Timestamp) -> Duration {
    let left = deadline.duration_since(now).as_secs_f64();
    Duration::from_secs((left / 4.0).clamp(1.0, 15.0).round() as u64)
}

/// Events for phase and condition transitions (not for steady states).
async fn transition_events(
    ctx: &Context,
    job: &TrainingJob,
    previous: Option<&TrainingJobStatus>,
    new: &TrainingJobStatus,
) {
    let became = |type_: &str, value: bool| {
        status::condition_is(Some(new), type_, value)
            && !status::condition_is(previous, type_, value)
    };
    // a job that becomes Degraded or Failed says why where `kubectl describe` shows it too:
    // the condition's reason and message (the fallback reason if the condition is missing)
    for (type_, fallback) in [
        (conditions::DEGRADED, reasons::COORDINATOR_UNREACHABLE),
        (conditions::FAILED, conditions::FAILED),
    ] {
        if became(type_, true) {
            let condition = new.condition(type_);
            let reason = condition.map_or(fallback, |c| c.reason.as_str());
            let message = condition.map(|c| c.message.clone()).unwrap_or_default();
            publish(ctx, job, EventType::Warning, reason, "Observe", message).await;
        }
    }
    if became(conditions::SUSPENDED, true) {
        publish(
            ctx,
            job,
            EventType::Normal,
            "Suspended",
            "Suspend",
            "nodes released".to_owned(),
        )
        .await;
    }
    if became(conditions::SUSPENDED, false)
        && previous.is_some_and(|p| p.phase == Some(ebbflow_crds::Phase::Suspended))
    {
        publish(
            ctx,
            job,
            EventType::Normal,
            "Resumed",
            "Resume",
            "nodes requested again".to_owned(),
        )
        .await;
    }
    if became(conditions::READY, true) {
        publish(
            ctx,
            job,
            EventType::Normal,
            "Ready",
            "Observe",
            "reliable tier and coordinator are up".to_owned(),
        )
        .await;
    }
    if became(conditions::SUCCEEDED, true) {
        publish(
            ctx,
            job,
            EventType::Normal,
            "Succeeded",
            "Observe",
            "training reached a stop criterion".to_owned(),
        )
        .await;
    }
}

/// True if `a` and `b` differ only in training progress fields.
fn only_progress_differs(a: &TrainingJobStatus, b: &TrainingJobStatus) -> bool {
    let strip = |status: &TrainingJobStatus| {
        let mut status = status.clone();
        status.iteration = None;
        status.loss = None;
        status.stage = None;
        status.migrations = 0;
        status.rollbacks = 0;
        // re-estimated with every measurement of the job's progress
        status.app_model = None;
        // running instances' charges grow every reconcile; ended ones are kept at once
        if let Some(cost) = status.cost.as_mut() {
            cost.spent = 0.0;
            cost.free_compute = 0.0;
            cost.on_demand_equivalent = 0.0;
        }
        status
    };
    strip(a) == strip(b)
}

async fn write_status(
    ctx: &Context,
    job: &TrainingJob,
    job_ref: &ObjectRef<TrainingJob>,
    namespace: &str,
    status: TrainingJobStatus,
) -> Result<(), StatusError> {
    let phase = status::phase_name(status.phase);
    ctx.metrics.job.observe(namespace, &job.name_any(), &status);
    ctx.with_memory(job_ref, |memory| {
        if let Some(old) = memory.phase.replace(phase) {
            ctx.metrics.jobs.with_label_values(&[old]).dec();
        }
        ctx.metrics.jobs.with_label_values(&[phase]).inc();
    });
    let previous = job.status.clone().unwrap_or_default();
    if previous == status {
        return Ok(());
    }
    // Progress alone (iteration, loss) changes constantly; writing it on every reconcile would
    // make each status write trigger the next reconcile.
    let throttled = only_progress_differs(&previous, &status)
        && ctx.with_memory(job_ref, |memory| {
            memory
                .last_status_write
                .is_some_and(|at| at.elapsed() < ctx.config.status_interval)
        });
    if throttled {
        return Ok(());
    }
    let api: Api<TrainingJob> = Api::namespaced(ctx.client.clone(), namespace);
    let patch = json!({
        "apiVersion": TrainingJob::api_version(&()),
        "kind": TrainingJob::kind(&()),
        "status": status,
    });
    api.patch_status(
        &job.name_any(),
        &PatchParams::apply(MANAGER).force(),
        &Patch::Apply(&patch),
    )
    .await
    .map_err(StatusError::Patch)?;
    ctx.with_memory(job_ref, |memory| {
        memory.last_status_write = Some(Instant::now())
    });
    Ok(())
}

/// Deletes everything the job created; idempotent and safe when nothing was ever created.
/// Terminates every EC2 instance tagged with `job`'s UID (counted in the instances metric);
/// returns their ids.
async fn terminate_job_instances(
    ctx: &Context,
    provisioner: &ebbflow_job::provision::Ec2Provisioner,
    job: &TrainingJob,
) -> Result<Vec<String>, ebbflow_job::provision::ProvisionError> {
    let tag = ebbflow_job::provision::job_tag(job)?;
    let terminated = provisioner.cleanup(&tag).await?;
    ctx.metrics
        .instances
        .with_label_values(&["terminated"])
        .inc_by(terminated.len() as u64);
    Ok(terminated)
}

async fn cleanup_job(job: Arc<TrainingJob>, ctx: Arc<Context>) -> Result<Action, Error> {
    let namespace = job
        .namespace()
        .ok_or(Error::InvalidObject("namespace missing"))?;
    let name = job.name_any();
    ctx.metrics.job.forget(&namespace, &name);
    ctx.capacity.forget(&job);
    let job_ref = ObjectRef::from_obj(job.as_ref());
    let pods_api: Api<Pod> = Api::namespaced(ctx.client.clone(), &namespace);
    let pods = pods_api
        .list(&ListParams::default().labels(&plan::job_selector(&name)))
        .await
        .map_err(ObserveError::ListPods)?
        .items;
    let coordinator_ready = pods.iter().any(|pod| {
        pod.labels()
            .get(plan::COORDINATOR_LABEL)
            .map(String::as_str)
            == Some("true")
            && plan::pod_ready(pod)
    });
    if coordinator_ready || ctx.config.coordinator_url_override.is_some() {
        let base = coordinator_url(
            &name,
            &namespace,
            crate::coordinator::uses_tls(&job),
            ctx.config.coordinator_url_override.as_deref(),
        );
        let token = job_token(&ctx, &namespace, &name).await.ok().flatten();
        if let Err(error) = ctx.coordinator.stop(&base, token.as_deref()).await {
            // The job is going away either way; a coordinator that cannot be told is deleted.
            debug!(%error, "stop before deletion not delivered");
        }
    }
    for pod in pods
        .iter()
        .filter(|pod| pod.metadata.deletion_timestamp.is_none())
    {
        delete_ignoring_missing(&pods_api, "Pod", &pod.name_any()).await?;
        ctx.metrics
            .pods_deleted
            .with_label_values(&["Cleanup"])
            .inc();
    }
    let mut terminated = Vec::new();
    if let Some(provisioner) = &ctx.ec2 {
        // Instances outlive nothing: the finalizer stays until EC2 confirms termination. Whatever
        // the spec's mode is now: a job edited out of ec2 mode still owns what it launched.
        terminated = terminate_job_instances(&ctx, provisioner, &job)
            .await
            .map_err(Error::Provision)?;
    }
    let services: Api<Service> = Api::namespaced(ctx.client.clone(), &namespace);
    delete_ignoring_missing(&services, "Service", &coordinator_service_name(&name)).await?;
    let budgets: Api<PodDisruptionBudget> = Api::namespaced(ctx.client.clone(), &namespace);
    delete_ignoring_missing(
        &budgets,
        "PodDisruptionBudget",
        &coordinator_service_name(&name),
    )
    .await?;
    // Whether or not this operator makes them: one made before a restart without them stays
    // owned by the job.
    let policies: Api<NetworkPolicy> = Api::namespaced(ctx.client.clone(), &namespace);
    delete_ignoring_missing(&policies, "NetworkPolicy", &coordinator_service_name(&name)).await?;
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &namespace);
    delete_ignoring_missing(&secrets, "Secret", &plan::secret_name(&name)).await?;
    publish(
        &ctx,
        &job,
        EventType::Normal,
        "CleanedUp",
        "Cleanup",
        if terminated.is_empty() {
            format!(
                "deleted {} pods, service, disruption budget, network policy and secret",
                pods.len()
            )
        } else {
            format!(
                "deleted {} pods, service, disruption budget, network policy and secret; terminated instances {}",
                pods.len(),
                terminated.join(", ")
            )
        },
    )
    .await;
    ctx.node_index.update(&job_ref, &BTreeSet::new());
    let forgotten = ctx.memory.lock().remove(&job_ref);
    if let Some(phase) = forgotten.and_then(|memory| memory.phase) {
        ctx.metrics.jobs.with_label_values(&[phase]).dec();
    }
    Ok(Action::await_change())
}

/// Server-side applies `desired` as `name` unless the `cached` object already shows it
/// ([`plan::already_applied`]).
async fn apply_unless_applied<K>(
    ctx: &Context,
    namespace: &str,
    name: &str,
    desired: &K,
    cached: Option<Arc<K>>,
) -> Result<(), ApplyError>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + k8s_openapi::Resource
        + Clone
        + serde::Serialize
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    if plan::already_applied(desired, cached.as_deref()) {
        return Ok(());
    }
    let api: Api<K> = Api::namespaced(ctx.client.clone(), namespace);
    api.patch(
        name,
        &PatchParams::apply(MANAGER).force(),
        &Patch::Apply(desired),
    )
    .await
    .map_err(|source| ApplyError::Apply {
        kind: <K as k8s_openapi::Resource>::KIND,
        name: name.to_owned(),
        source,
    })?;
    Ok(())
}

async fn delete_ignoring_missing<K>(
    api: &Api<K>,
    kind: &'static str,
    name: &str,
) -> Result<(), ApplyError>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        Err(source) => Err(ApplyError::Delete {
            kind,
            name: name.to_owned(),
            source,
        }),
    }
}

/// Errors starting the controller.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The TrainingJob CRD is not installed.
    #[error(
        "the TrainingJob CRD (trainingjobs.ebbflow.dev) is not installed in this cluster; install it with `ebbflow crd | kubectl apply -f -` or the Helm chart"
    )]
    CrdMissing,
    /// The installed CRD is another version's: Helm does not upgrade a chart's CRDs.
    #[error(
        "the installed TrainingJob CRD (trainingjobs.ebbflow.dev) is not the one this operator was built with (schema {found}, expected {expected}); apply it first: `kubectl apply --server-side -f charts/ebbflow/crds/` (or `ebbflow crd | kubectl apply --server-side -f -`)"
    )]
    CrdStale {
        /// The installed CRD's schema hash (`none` without the annotation).
        found: String,
        /// This operator's.
        expected: String,
    },
    /// The API server could not be asked.
    #[error("checking for the TrainingJob CRD failed: {0}")]
    Check(#[source] kube::Error),
}

/// Fails with a one-line error when the TrainingJob CRD is not installed, or is not the one
/// these types generate (its [`ebbflow_crds::SCHEMA_ANNOTATION`] differs): a stale schema would
/// make the API server drop the fields it lacks from every spec and status write, silently.
pub async fn check_crd(client: &Client) -> Result<(), StartError> {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd = match crds.get_opt("trainingjobs.ebbflow.dev").await {
        Ok(Some(crd)) => crd,
        Ok(None) => return Err(StartError::CrdMissing),
        Err(error) => return Err(StartError::Check(error)),
    };
    let expected = ebbflow_crds::schema_hash();
    let found = crd
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ebbflow_crds::SCHEMA_ANNOTATION))
        .cloned()
        .unwrap_or_else(|| "none".to_owned());
    if found != expected {
        return Err(StartError::CrdStale { found, expected });
    }
    Ok(())
}

/// Runs the controller until `shutdown` resolves: TrainingJobs, owning Pods, Services and
/// Secrets, with the notice relay beside it ([`relay::run`]), which watches Nodes, relays notices
/// and requeues the jobs whose pods run on a node that changed, and, with ec2 provisioning, the
/// EC2 interruption watcher ([`interruptions::run`]).
pub async fn run(
    ctx: Arc<Context>,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let client = ctx.client.clone();
    // One namespace (--watch-namespace) or all of them; Nodes are cluster-scoped either way.
    let namespace = ctx.config.namespace.as_deref();
    let jobs: Api<TrainingJob> = relay::scoped(&client, namespace);
    // The children's watches are the relay's: one watch per kind for the whole operator.
    let Some(children) = ctx.caches.subscribe() else {
        warn!("the notice relay's caches are already in use; controller not started");
        return;
    };
    // As `Controller::new`, with the jobs' managed fields dropped from the cache: the status
    // applies make them several kilobytes per job, and nothing here reads them.
    let (reader, writer) = kube::runtime::reflector::store();
    let job_events = kube::runtime::reflector(
        writer,
        watcher(jobs, watcher::Config::default().any_semantic())
            .modify(|job| job.managed_fields_mut().clear()),
    )
    .applied_objects();
    let controller = Controller::for_stream(job_events, reader).with_config(
        kube::runtime::controller::Config::default()
            .debounce(ctx.config.debounce)
            .concurrency(ctx.config.max_concurrent_reconciles),
    );
    // The relay lives exactly as long as this controller (a stopped operator must not keep
    // delivering notices), so it runs beside it rather than as a detached task. It also owns
    // the Node watch: jobs are requeued only when what the reconcile reads of a node changes
    // (taints, deletion), not on every status heartbeat of a thousand nodes.
    let (requeue, requeued) = futures::channel::mpsc::unbounded();
    let relay = {
        let (ctx, jobs) = (ctx.clone(), controller.store());
        async move {
            relay::run(ctx, jobs, requeue).await;
            std::future::pending::<()>().await;
        }
    };
    // Likewise the interruption watcher (it returns at once without ec2 provisioning).
    let interruptions = {
        let (ctx, jobs) = (ctx.clone(), controller.store());
        async move {
            interruptions::run(ctx, jobs).await;
            std::future::pending::<()>().await;
        }
    };
    let controller = controller
        .owns_shared_stream(children.pods)
        .owns_shared_stream(children.services)
        .owns_shared_stream(children.budgets)
        .owns_shared_stream(children.network_policies)
        .owns_shared_stream(children.secrets)
        .reconcile_on(requeued)
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            match result {
                Ok((object, _)) => debug!(job = %object.name, "reconciled"),
                Err(error) => debug!(%error, "reconcile stream error"),
            }
        });
    tokio::select! {
        () = controller => {}
        () = relay => {}
        () = interruptions => {}
    }
}

#[cfg(test)]
mod tests;
