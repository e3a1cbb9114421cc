//! The notice relay: the fast path from a Node or Pod change to the job's coordinator.
//!
//! A spot interruption gives two minutes (GKE: thirty seconds), and every second the notice
//! spends in the operator is a second the runtime does not have to migrate. Reconciles are the
//! slow path: a Node change requeues every job with pods on that node, and each reconcile lists
//! pods, talks to its coordinator and server-side applies its children, so under load notices
//! queued behind hundreds of reconciles (p99 5.9 s at 50 jobs, see BENCHMARKS.md).
//!
//! The relay keeps reflector caches of Nodes and of the operator's Pods, Secrets, Services,
//! PodDisruptionBudgets and NetworkPolicies
//! (one watch per kind for the whole operator: the controller is triggered by the same watches
//! through [`Subscriptions`], and the reconcile reads its children from these caches instead of
//! one LIST and two GETs per reconcile), and reacts to each watch
//! event that can announce a departure (a notice taint, a deletion timestamp, a
//! `DisruptionTarget` condition, a deleted Node) by computing the affected pods' notices with the
//! same pure [`notices::notices`] the reconcile uses, and delivering them to each job's
//! coordinator right away, one task per job. It shares the per-job [`NoticeLedger`] with the
//! reconcile, which therefore skips what the relay delivered (and delivers whatever the relay
//! could not: coordinator unreachable, token not yet known). The reconcile also reads Nodes from
//! the relay's cache instead of one GET per node.
//!
//! [`NoticeLedger`]: crate::notices::NoticeLedger

use std::{
    collections::{BTreeMap, BTreeSet, HashMap, HashSet},
    hash::{Hash, Hasher},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
};

use ebbflow_crds::TrainingJob;
use futures::{StreamExt, channel::mpsc, stream};
use k8s_openapi::{
    api::core::v1::{
        ContainerState, ContainerStatus, Node, NodeCondition, NodeSpec, NodeStatus, Pod, PodSpec,
        PodStatus, Secret, Service,
    },
    api::networking::v1::NetworkPolicy,
    api::policy::v1::PodDisruptionBudget,
    jiff::Timestamp,
};
use kube::{
    Api, ResourceExt,
    runtime::{
        WatchStreamExt,
        reflector::{ObjectRef, Store},
        watcher,
    },
};
use tracing::{debug, warn};

use super::{
    context::Context,
    delivery::{Delivery, notify},
    plan,
    secret::job_token,
};
use crate::{
    coordinator::coordinator_url,
    notices::{self, NodeObservation, Notice, NoticeSource},
};

/// Marks the caches live for as long as it exists.
struct LiveGuard(Arc<AtomicBool>);

impl LiveGuard {
    fn new(live: &Arc<AtomicBool>) -> Self {
        live.store(true, Ordering::Release);
        Self(live.clone())
    }
}

impl Drop for LiveGuard {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

/// Keeps of a cached pod only what notices, readiness, job lookup and the reconcile's plan read
/// (names, labels, the operator's own `ebbflow.dev/` annotations, deletion, node, grace period,
/// phase, conditions, start time; a failed pod's reason and terminations, a pending pod's
/// containers the kubelet cannot start, an unplaced pod's node selector): at thousands of pods the rest (containers, volumes, statuses of every
/// container, other annotations, managed fields) is most of the memory.
fn slim_pod(pod: &mut Pod) {
    pod.managed_fields_mut().clear();
    if let Some(annotations) = pod.metadata.annotations.as_mut() {
        annotations.retain(|key, _| key.starts_with(plan::ANNOTATION_PREFIX));
    }
    if let Some(spec) = pod.spec.as_mut() {
        // a pod not yet on a node keeps its node selector: its pool's nodes that are not Ready
        // are named in the job's status (plan::unready_pool_nodes)
        let node_selector = spec
            .node_selector
            .take()
            .filter(|_| spec.node_name.is_none());
        *spec = PodSpec {
            node_name: spec.node_name.take(),
            node_selector,
            termination_grace_period_seconds: spec.termination_grace_period_seconds,
            ..PodSpec::default()
        };
    }
    if let Some(status) = pod.status.as_mut() {
        // A failed pod keeps why (few pods, and the reconcile reports it): its reason and
        // message, and each container's termination (exit code, reason, message, time).
        let failed = status.phase.as_deref() == Some("Failed");
        let terminations = failed.then(|| {
            status
                .container_statuses
                .take()
                .into_iter()
                .flatten()
                .map(|c| ContainerStatus {
                    name: c.name,
                    state: c
                        .state
                        .and_then(|s| s.terminated)
                        .map(|terminated| ContainerState {
                            terminated: Some(terminated),
                            ..ContainerState::default()
                        }),
                    ..ContainerStatus::default()
                })
                .collect()
        });
        // A pending pod the kubelet cannot start keeps why (its image cannot be pulled...):
        // the waiting containers' reason and message, for the job's Degraded condition.
        let pending = status.phase.as_deref() == Some("Pending");
        let stuck = |statuses: Option<Vec<ContainerStatus>>| -> Option<Vec<ContainerStatus>> {
            let kept: Vec<ContainerStatus> = statuses
                .into_iter()
                .flatten()
                .filter_map(|c| {
                    let waiting = c.state?.waiting.filter(plan::waits_not_starting)?;
                    Some(ContainerStatus {
                        name: c.name,
                        state: Some(ContainerState {
                            waiting: Some(waiting),
                            ..ContainerState::default()
                        }),
                        ..ContainerStatus::default()
                    })
                })
                .collect();
            (!kept.is_empty()).then_some(kept)
        };
        let (waiting, init_waiting) = if pending {
            (
                stuck(status.container_statuses.take()),
                stuck(status.init_container_statuses.take()),
            )
        } else {
            (None, None)
        };
        *status = PodStatus {
            phase: status.phase.take(),
            conditions: status.conditions.take(),
            init_container_statuses: init_waiting,
            // the cost ledger charges a pod from when it started running, not from its
            // creation (a pod Pending for capacity is not paid for)
            start_time: status.start_time.take(),
            reason: status.reason.take().filter(|_| failed),
            message: status.message.take().filter(|_| failed),
            container_statuses: terminations.or(waiting),
            ..PodStatus::default()
        };
    }
}

/// Keeps of a cached Node only what notices, the interruption watcher and the job status read
/// (name, labels, deletion, taints, provider ID, the Ready condition without its times).
fn slim_node(node: &mut Node) {
    node.managed_fields_mut().clear();
    node.metadata.annotations = None;
    node.status = node
        .status
        .as_mut()
        .and_then(|s| s.conditions.take())
        .and_then(|c| c.into_iter().find(|c| c.type_ == "Ready"))
        .map(|ready| NodeStatus {
            conditions: Some(vec![NodeCondition {
                last_heartbeat_time: None,
                last_transition_time: None,
                ..ready
            }]),
            ..NodeStatus::default()
        });
    if let Some(spec) = node.spec.as_mut() {
        *spec = NodeSpec {
            taints: spec.taints.take(),
            provider_id: spec.provider_id.take(),
            unschedulable: spec.unschedulable,
            ..NodeSpec::default()
        };
    }
}

/// What one watch event asks the relay to look at.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Trigger {
    /// This Node changed in a way that can announce a departure.
    Node(String),
    /// This Node was deleted.
    NodeDeleted(String),
    /// This pod (namespace, name) changed in a way that can announce a departure.
    Pod(String, String),
}

/// True if `node` carries something that announces a departure.
fn node_announces(node: &Node, now: Timestamp) -> bool {
    let observation = NodeObservation::Present(Box::new(node.clone()));
    !notices::node_notices(&observation, notices::DEFAULT_GRACE, now).is_empty()
}

/// True if `pod` carries something that announces a departure.
fn pod_announces(pod: &Pod) -> bool {
    !notices::pod_notices(pod, notices::DEFAULT_GRACE).is_empty()
}

/// The pods a trigger concerns, from the pod cache (pure over the cached state).
pub(crate) fn affected_pods(trigger: &Trigger, pods: &[Arc<Pod>]) -> Vec<Pod> {
    let on_node = |node: &str| {
        pods.iter()
            .filter(|pod| {
                pod.spec.as_ref().and_then(|spec| spec.node_name.as_deref()) == Some(node)
            })
            .map(|pod| pod.as_ref().clone())
            .collect()
    };
    match trigger {
        Trigger::Node(node) | Trigger::NodeDeleted(node) => on_node(node),
        Trigger::Pod(namespace, name) => pods
            .iter()
            .filter(|pod| {
                pod.metadata.name.as_deref() == Some(name)
                    && pod.metadata.namespace.as_deref() == Some(namespace)
            })
            .map(|pod| pod.as_ref().clone())
            .collect(),
    }
}

/// The notices of `pods` grouped by job (namespace, name), from what is known of their nodes.
pub(crate) fn notices_by_job(
    pods: &[Pod],
    nodes: &BTreeMap<String, NodeObservation>,
    now: Timestamp,
) -> BTreeMap<(String, String), Vec<Notice>> {
    let job_of: BTreeMap<&str, (String, String)> = pods
        .iter()
        .filter_map(|pod| {
            let job = pod.labels().get(plan::JOB_LABEL)?.clone();
            Some((pod.metadata.name.as_deref()?, (pod.namespace()?, job)))
        })
        .collect();
    let mut grouped: BTreeMap<(String, String), Vec<Notice>> = BTreeMap::new();
    for notice in notices::notices(pods, nodes, now) {
        if let Some(job) = job_of.get(notice.pod.as_str()) {
            grouped.entry(job.clone()).or_default().push(notice);
        }
    }
    grouped
}

/// What of a Node the reconcile reads (taints, deletion): a change here requeues the jobs on it,
/// anything else (status heartbeats, images, conditions) does not.
fn fingerprint(node: &Node) -> u64 {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    if let Some(taints) = node.spec.as_ref().and_then(|spec| spec.taints.as_ref()) {
        for taint in taints {
            (&taint.key, &taint.value, &taint.effect).hash(&mut hasher);
            taint.time_added.as_ref().map(|t| t.0).hash(&mut hasher);
        }
    }
    node.metadata
        .deletion_timestamp
        .as_ref()
        .map(|t| t.0)
        .hash(&mut hasher);
    hasher.finish()
}

/// Turns the Node watch into relay triggers and the names of nodes whose jobs need a reconcile,
/// remembering what the reconcile reads of each node. A re-list (after a watch error) is
/// compared with what was known, so changes and deletions missed meanwhile still count.
#[derive(Debug, Default)]
pub(crate) struct NodeTracker {
    fingerprints: HashMap<String, u64>,
    relisted: Option<HashSet<String>>,
}

impl NodeTracker {
    /// (relay triggers, nodes whose jobs to requeue) for one watch event.
    pub(crate) fn observe(
        &mut self,
        event: watcher::Event<Node>,
        now: Timestamp,
    ) -> (Vec<Trigger>, Vec<String>) {
        let (mut triggers, mut requeue) = (Vec::new(), Vec::new());
        match event {
            watcher::Event::Apply(node) | watcher::Event::InitApply(node) => {
                let name = node.name_any();
                if let Some(relisted) = self.relisted.as_mut() {
                    relisted.insert(name.clone());
                }
                if self.fingerprints.insert(name.clone(), fingerprint(&node))
                    != Some(fingerprint(&node))
                {
                    requeue.push(name.clone());
                }
                if node_announces(&node, now) {
                    triggers.push(Trigger::Node(name));
                }
            }
            watcher::Event::Delete(node) => {
                let name = node.name_any();
                self.fingerprints.remove(&name);
                requeue.push(name.clone());
                triggers.push(Trigger::NodeDeleted(name));
            }
            watcher::Event::Init => self.relisted = Some(HashSet::new()),
            watcher::Event::InitDone => {
                let relisted = self.relisted.take().unwrap_or_default();
                let gone: Vec<String> = self
                    .fingerprints
                    .keys()
                    .filter(|name| !relisted.contains(*name))
                    .cloned()
                    .collect();
                for name in gone {
                    self.fingerprints.remove(&name);
                    requeue.push(name.clone());
                    triggers.push(Trigger::NodeDeleted(name));
                }
            }
        }
        (triggers, requeue)
    }
}

/// Runs the caches' watchers and relays notices until the streams end (never, in practice).
/// Node changes the reconcile cares about go to `requeue` as the jobs with pods on them.
pub async fn run(
    ctx: Arc<Context>,
    jobs: Store<TrainingJob>,
    requeue: mpsc::UnboundedSender<ObjectRef<TrainingJob>>,
) {
    let Some(writers) = ctx.caches.writers.lock().take() else {
        warn!("notice relay already running");
        return;
    };
    let _live = LiveGuard::new(&ctx.caches.live);
    let namespace = ctx.config.namespace.as_deref();
    let children = watcher::Config::default().labels(&format!(
        "app.kubernetes.io/managed-by={}",
        plan::MANAGED_BY
    ));
    let pod_events = watcher(scoped::<Pod>(&ctx.client, namespace), children.clone())
        .default_backoff()
        .modify(slim_pod)
        .reflect_shared(writers.pods)
        .map(Watched::Pod);
    let node_events = watcher(
        Api::<Node>::all(ctx.client.clone()),
        watcher::Config::default(),
    )
    .default_backoff()
    .modify(slim_node)
    .reflect(writers.nodes)
    .map(Watched::Node);
    let secret_events = watcher(scoped::<Secret>(&ctx.client, namespace), children.clone())
        .default_backoff()
        .modify(|secret| secret.managed_fields_mut().clear())
        .reflect_shared(writers.secrets)
        .map(Watched::child);
    let service_events = watcher(scoped::<Service>(&ctx.client, namespace), children.clone())
        .default_backoff()
        .modify(|service| service.managed_fields_mut().clear())
        .reflect_shared(writers.services)
        .map(Watched::child);
    let budget_events = watcher(
        scoped::<PodDisruptionBudget>(&ctx.client, namespace),
        children.clone(),
    )
    .default_backoff()
    .modify(|budget| budget.managed_fields_mut().clear())
    .reflect_shared(writers.budgets)
    .map(Watched::child);
    let policy_events = watcher(scoped::<NetworkPolicy>(&ctx.client, namespace), children)
        .default_backoff()
        .modify(|policy| policy.managed_fields_mut().clear())
        .reflect_shared(writers.network_policies)
        .map(Watched::child);
    let mut events = std::pin::pin!(stream::select_all([
        pod_events.boxed(),
        node_events.boxed(),
        secret_events.boxed(),
        service_events.boxed(),
        budget_events.boxed(),
        policy_events.boxed(),
    ]));
    let mut tracker = NodeTracker::default();
    while let Some(event) = events.next().await {
        let triggers = match event {
            Watched::Pod(Ok(watcher::Event::Apply(pod) | watcher::Event::InitApply(pod)))
                if pod_announces(&pod) =>
            {
                vec![Trigger::Pod(
                    pod.namespace().unwrap_or_default(),
                    pod.name_any(),
                )]
            }
            Watched::Pod(Ok(watcher::Event::Delete(pod))) => {
                // The controller hears of applied children only: a deleted one is requeued here
                // (its replacement is due).
                requeue_owner(&requeue, &ChildDeleted::of(pod));
                Vec::new()
            }
            Watched::ChildDeleted(child) => {
                requeue_owner(&requeue, &child);
                Vec::new()
            }
            Watched::Pod(Ok(_)) | Watched::Quiet => Vec::new(),
            Watched::Node(Ok(event)) => {
                let (triggers, changed) = tracker.observe(event, Timestamp::now());
                for node in changed {
                    for job in ctx.node_index.jobs_on(&node) {
                        // The controller is gone only when shutting down.
                        let _ = requeue.unbounded_send(job);
                    }
                }
                triggers
            }
            Watched::Pod(Err(error)) | Watched::Node(Err(error)) | Watched::Error(error) => {
                debug!(%error, "watch error (retrying with backoff)");
                Vec::new()
            }
        };
        for trigger in &triggers {
            relay(&ctx, &jobs, trigger);
        }
    }
}

/// One event of the relay's watches (one at a time, straight from the stream: not worth boxing).
#[allow(clippy::large_enum_variant)]
enum Watched {
    Pod(Result<watcher::Event<Pod>, watcher::Error>),
    Node(Result<watcher::Event<Node>, watcher::Error>),
    /// A Secret, Service or PodDisruptionBudget was deleted.
    ChildDeleted(ChildDeleted),
    /// A Secret, Service or PodDisruptionBudget changed (the controller hears of it through its
    /// subscription).
    Quiet,
    /// A watch of Secrets, Services or PodDisruptionBudgets failed (it retries with backoff).
    Error(watcher::Error),
}

impl Watched {
    fn child<K: kube::Resource>(event: Result<watcher::Event<K>, watcher::Error>) -> Self {
        match event {
            Ok(watcher::Event::Delete(child)) => Self::ChildDeleted(ChildDeleted::of(child)),
            Ok(_) => Self::Quiet,
            Err(error) => Self::Error(error),
        }
    }
}

/// The job a deleted child belonged to: (namespace, job label).
struct ChildDeleted(Option<(String, String)>);

impl ChildDeleted {
    fn of<K: kube::Resource>(child: K) -> Self {
        let job = child.labels().get(plan::JOB_LABEL).cloned();
        Self(child.namespace().zip(job))
    }
}

/// Requeues the job of a deleted child.
fn requeue_owner(requeue: &mpsc::UnboundedSender<ObjectRef<TrainingJob>>, child: &ChildDeleted) {
    if let Some((namespace, job)) = &child.0 {
        // The controller is gone only when shutting down.
        let _ = requeue.unbounded_send(ObjectRef::new(job).within(namespace));
    }
}

/// `K`s of one namespace, or of every namespace.
pub(super) fn scoped<K>(client: &kube::Client, namespace: Option<&str>) -> Api<K>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
    <K as kube::Resource>::DynamicType: Default,
{
    match namespace {
        Some(namespace) => Api::namespaced(client.clone(), namespace),
        None => Api::all(client.clone()),
    }
}

/// Computes the trigger's notices and spawns one delivery task per job.
fn relay(ctx: &Arc<Context>, jobs: &Store<TrainingJob>, trigger: &Trigger) {
    let pods = affected_pods(trigger, &ctx.caches.pods.state());
    if pods.is_empty() {
        return;
    }
    let node_names: BTreeSet<String> = pods
        .iter()
        .filter_map(|pod| pod.spec.as_ref()?.node_name.clone())
        .collect();
    let mut nodes = BTreeMap::new();
    for name in node_names {
        let observation = match (trigger, ctx.caches.node(&name)) {
            (Trigger::NodeDeleted(deleted), _) if *deleted == name => NodeObservation::Gone,
            (_, Some(node)) => NodeObservation::Present(Box::new(node.as_ref().clone())),
            // Not cached yet: the reconcile will look it up.
            (_, None) => continue,
        };
        nodes.insert(name, observation);
    }
    for ((namespace, name), notices) in notices_by_job(&pods, &nodes, Timestamp::now()) {
        let Some(job) = jobs.get(&ObjectRef::new(&name).within(&namespace)) else {
            continue;
        };
        let ctx = ctx.clone();
        tokio::spawn(async move { deliver(&ctx, &job, &notices).await });
    }
}

/// Delivers the job's undelivered notices when its coordinator is there to hear them; whatever
/// is left undelivered falls to the reconcile.
pub(super) async fn deliver(ctx: &Context, job: &TrainingJob, current: &[Notice]) {
    let (namespace, name) = (job.namespace().unwrap_or_default(), job.name_any());
    if job.spec.suspend || super::status::is_final(job.status.as_ref()) {
        return;
    }
    let coordinator_ready = ctx.config.coordinator_url_override.is_some()
        || ctx
            .caches
            .pods
            .find(|pod| {
                pod.namespace().as_deref() == Some(namespace.as_str())
                    && pod.labels().get(plan::JOB_LABEL) == Some(&name)
                    && plan::is_ready_coordinator(pod)
            })
            .is_some();
    if !coordinator_ready {
        return;
    }
    let job_ref = ObjectRef::from_obj(job);
    let undelivered: Vec<Notice> = ctx.with_memory(&job_ref, |memory| {
        memory
            .ledger
            .undelivered(current)
            .into_iter()
            // A pod the reconcile already told the coordinator about (its own scale-down
            // release, say) being deleted is no news.
            .filter(|n| !(n.source == NoticeSource::PodDeletion && memory.ledger.knows(&n.pod)))
            .cloned()
            .collect()
    });
    if undelivered.is_empty() {
        return;
    }
    let token = match ctx.with_memory(&job_ref, |memory| memory.token.clone()) {
        Some(token) => Some(token),
        None => match job_token(ctx, &namespace, &name).await {
            Ok(token) => token,
            Err(error) => {
                warn!(job = %name, %error, "notice relay: token unavailable; the reconcile retries");
                return;
            }
        },
    };
    let base = coordinator_url(
        &name,
        &namespace,
        crate::coordinator::uses_tls(&job),
        ctx.config.coordinator_url_override.as_deref(),
    );
    let now = Timestamp::now();
    // All at once: a notice must not wait for the one before it (and its event) to be through.
    let delivered = futures::future::join_all(
        undelivered
            .iter()
            .map(|notice| notify(ctx, job, &base, token.as_deref(), notice, now)),
    )
    .await;
    let relayed = delivered
        .into_iter()
        .filter(|&outcome| outcome == Delivery::Delivered)
        .count();
    ctx.metrics.notices_relayed.inc_by(relayed as u64);
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{NodeSpec, PodSpec, Taint};

    pub(crate) fn pod(namespace: &str, name: &str, job: &str, node: &str) -> Arc<Pod> {
        let mut pod = Pod::default();
        pod.metadata.name = Some(name.into());
        pod.metadata.namespace = Some(namespace.into());
        pod.metadata.labels = Some([(plan::JOB_LABEL.to_owned(), job.to_owned())].into());
        pod.spec = Some(PodSpec {
            node_name: Some(node.into()),
            termination_grace_period_seconds: Some(60),
            ..PodSpec::default()
        });
        Arc::new(pod)
    }

    fn node(name: &str, taint: Option<&str>) -> Node {
        let mut node = Node::default();
        node.metadata.name = Some(name.into());
        node.spec = Some(NodeSpec {
            taints: taint.map(|key| {
                vec![Taint {
                    key: key.into(),
                    effect: "NoSchedule".into(),
                    time_added: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                        "2026-01-01T00:00:00Z".parse().unwrap(),
                    )),
                    value: None,
                }]
            }),
            ..NodeSpec::default()
        });
        node
    }

    #[test]
    fn only_departure_signals_trigger() {
        let now: Timestamp = "2026-01-01T00:00:30Z".parse().unwrap();
        assert!(!node_announces(&node("n", None), now));
        assert!(!node_announces(&node("n", Some("example.com/other")), now));
        assert!(node_announces(
            &node("n", Some(notices::NTH_SPOT_ITN_TAINT)),
            now
        ));
        assert!(node_announces(
            &node("n", Some(notices::KARPENTER_DISRUPTED_TAINT)),
            now
        ));
        let mut deleting = node("n", None);
        deleting.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now));
        assert!(node_announces(&deleting, now));
        let mut leaving = pod("ns", "p", "j", "n").as_ref().clone();
        assert!(!pod_announces(&leaving));
        leaving.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now));
        assert!(pod_announces(&leaving));
    }

    #[test]
    fn a_tainted_node_notifies_every_job_on_it_and_nothing_else() {
        let cached = vec![
            pod("a", "mf-t-0", "mf", "spot-1"),
            pod("a", "mf-t-1", "mf", "spot-2"),
            pod("b", "lda-t-0", "lda", "spot-1"),
            pod("b", "lda-r-0", "lda", "od-1"),
        ];
        let affected = affected_pods(&Trigger::Node("spot-1".into()), &cached);
        let names: Vec<_> = affected.iter().map(|p| p.name_any()).collect();
        assert_eq!(names, ["mf-t-0", "lda-t-0"]);
        let nodes = BTreeMap::from([(
            "spot-1".to_owned(),
            NodeObservation::Present(Box::new(node("spot-1", Some(notices::NTH_SPOT_ITN_TAINT)))),
        )]);
        let now: Timestamp = "2026-01-01T00:00:05Z".parse().unwrap();
        let grouped = notices_by_job(&affected, &nodes, now);
        assert_eq!(grouped.len(), 2);
        let mf = &grouped[&("a".to_owned(), "mf".to_owned())];
        assert_eq!(mf.len(), 1);
        assert_eq!(mf[0].pod, "mf-t-0");
        // EC2's two minutes from the taint's own timestamp, not from when the relay saw it.
        assert_eq!(
            mf[0].leaves_at,
            "2026-01-01T00:02:00Z".parse::<Timestamp>().unwrap()
        );
        assert_eq!(
            grouped[&("b".to_owned(), "lda".to_owned())][0].pod,
            "lda-t-0"
        );
    }

    #[test]
    fn a_deleted_node_is_gone_now_and_a_pod_trigger_is_one_pod() {
        let cached = vec![
            pod("a", "mf-t-0", "mf", "spot-1"),
            pod("a", "mf-t-1", "mf", "spot-1"),
        ];
        let now: Timestamp = "2026-01-01T00:00:05Z".parse().unwrap();
        let affected = affected_pods(&Trigger::NodeDeleted("spot-1".into()), &cached);
        let nodes = BTreeMap::from([("spot-1".to_owned(), NodeObservation::Gone)]);
        let grouped = notices_by_job(&affected, &nodes, now);
        let mf = &grouped[&("a".to_owned(), "mf".to_owned())];
        assert_eq!(mf.len(), 2);
        assert!(mf.iter().all(|n| n.leaves_at == now));
        assert_eq!(
            affected_pods(&Trigger::Pod("a".into(), "mf-t-1".into()), &cached).len(),
            1
        );
        assert!(affected_pods(&Trigger::Pod("b".into(), "mf-t-1".into()), &cached).is_empty());
    }

    #[test]
    fn heartbeats_do_not_requeue_but_taints_deletions_and_missed_deletions_do() {
        let now: Timestamp = "2026-01-01T00:00:30Z".parse().unwrap();
        let mut tracker = NodeTracker::default();
        // Start-up listing: remembered, a reconcile of every job follows anyway.
        assert_eq!(tracker.observe(watcher::Event::Init, now), (vec![], vec![]));
        for name in ["spot-1", "spot-2", "spot-3"] {
            let (triggers, requeue) =
                tracker.observe(watcher::Event::InitApply(node(name, None)), now);
            assert!(triggers.is_empty());
            assert_eq!(requeue, [name]);
        }
        tracker.observe(watcher::Event::InitDone, now);
        // A status heartbeat: nothing the reconcile reads changed.
        let mut heartbeat = node("spot-1", None);
        heartbeat.status = Some(Default::default());
        assert_eq!(
            tracker.observe(watcher::Event::Apply(heartbeat), now),
            (vec![], vec![])
        );
        // An interruption taint: relayed and requeued.
        let tainted = node("spot-1", Some(notices::NTH_SPOT_ITN_TAINT));
        assert_eq!(
            tracker.observe(watcher::Event::Apply(tainted.clone()), now),
            (vec![Trigger::Node("spot-1".into())], vec!["spot-1".into()])
        );
        // The same taint again (another field changed): relayed (the ledger dedupes), no requeue.
        assert_eq!(
            tracker.observe(watcher::Event::Apply(tainted), now),
            (vec![Trigger::Node("spot-1".into())], vec![])
        );
        // A deletion.
        assert_eq!(
            tracker.observe(watcher::Event::Delete(node("spot-2", None)), now),
            (
                vec![Trigger::NodeDeleted("spot-2".into())],
                vec!["spot-2".into()]
            )
        );
        // A re-list after a watch error that no longer holds spot-3: deleted meanwhile.
        tracker.observe(watcher::Event::Init, now);
        tracker.observe(
            watcher::Event::InitApply(node("spot-1", Some(notices::NTH_SPOT_ITN_TAINT))),
            now,
        );
        assert_eq!(
            tracker.observe(watcher::Event::InitDone, now),
            (
                vec![Trigger::NodeDeleted("spot-3".into())],
                vec!["spot-3".into()]
            )
        );
    }

    #[test]
    fn slimmed_objects_keep_everything_notices_and_readiness_read() {
        let now: Timestamp = "2026-01-01T00:00:05Z".parse().unwrap();
        let mut full: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": "mf-t-0", "namespace": "a",
                "labels": { (plan::JOB_LABEL): "mf", (plan::COORDINATOR_LABEL): "true" },
                "annotations": { "big": "x".repeat(4096), (plan::ZONE_ANNOTATION): "us-east-1a" },
                "deletionTimestamp": "2026-01-01T00:00:30Z",
                "managedFields": [{ "manager": "kwok" }]
            },
            "spec": {
                "nodeName": "spot-1", "terminationGracePeriodSeconds": 60,
                "containers": [{ "name": "runtime", "image": "ebbflow:dev", "args": ["--a", "--b"] }]
            },
            "status": {
                "phase": "Running",
                "startTime": "2026-01-01T00:00:02Z",
                "conditions": [
                    { "type": "Ready", "status": "True" },
                    { "type": "DisruptionTarget", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z" }
                ],
                "containerStatuses": [{ "name": "runtime", "image": "ebbflow:dev", "imageID": "", "ready": true, "restartCount": 0 }]
            }
        }))
        .unwrap();
        let mut slim = full.clone();
        slim_pod(&mut slim);
        assert!(slim.spec.as_ref().unwrap().containers.is_empty());
        assert!(slim.status.as_ref().unwrap().container_statuses.is_none());
        assert_eq!(
            slim.annotations(),
            &BTreeMap::from([(plan::ZONE_ANNOTATION.to_owned(), "us-east-1a".to_owned())]),
            "the operator's own annotations stay (the plan reads a pod's pool from them)"
        );
        assert!(
            serde_json::to_vec(&slim).unwrap().len() * 4 < serde_json::to_vec(&full).unwrap().len()
        );
        assert_eq!(plan::pod_ready(&slim), plan::pod_ready(&full));
        assert_eq!(slim.labels(), full.labels());
        assert_eq!(
            slim.status.as_ref().unwrap().start_time,
            full.status.as_ref().unwrap().start_time,
            "the cost ledger charges from it"
        );
        assert!(slim.status.as_ref().unwrap().start_time.is_some());
        // a failed pod keeps why it failed (the reconcile reports it)
        let mut failed = full.clone();
        let status = failed.status.as_mut().unwrap();
        status.phase = Some("Failed".into());
        status.container_statuses.as_mut().unwrap()[0].state = serde_json::from_value(
            serde_json::json!({"terminated": {"exitCode": 1, "message": "Error: no shard 3"}}),
        )
        .unwrap();
        let mut slim_failed = failed.clone();
        slim_pod(&mut slim_failed);
        assert_eq!(
            plan::pod_failure(&slim_failed)
                .map(|f| f.message)
                .as_deref(),
            Some("exit code 1: Error: no shard 3")
        );
        assert_eq!(plan::pod_failure(&slim_failed), plan::pod_failure(&failed));
        // a pending pod the kubelet cannot start keeps why (the Degraded condition reports it);
        // one still being created keeps nothing
        let mut stuck = full.clone();
        let status = stuck.status.as_mut().unwrap();
        status.phase = Some("Pending".into());
        status.container_statuses.as_mut().unwrap()[0].state = serde_json::from_value(
            serde_json::json!({"waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling image \"ebbflow:nope\""}}),
        )
        .unwrap();
        let mut slim_stuck = stuck.clone();
        slim_pod(&mut slim_stuck);
        assert_eq!(
            plan::not_starting(&slim_stuck),
            Some((
                "ImagePullBackOff".to_owned(),
                "Back-off pulling image \"ebbflow:nope\"".to_owned()
            ))
        );
        assert_eq!(plan::not_starting(&slim_stuck), plan::not_starting(&stuck));
        stuck
            .status
            .as_mut()
            .unwrap()
            .container_statuses
            .as_mut()
            .unwrap()[0]
            .state =
            serde_json::from_value(serde_json::json!({"waiting": {"reason": "ContainerCreating"}}))
                .unwrap();
        slim_pod(&mut stuck);
        assert!(stuck.status.as_ref().unwrap().container_statuses.is_none());
        // a pod not yet on a node keeps its node selector (its pool's nodes are looked up);
        // one on a node does not
        let selector =
            BTreeMap::from([(plan::ZONE_NODE_LABEL.to_owned(), "us-east-1a".to_owned())]);
        let mut unplaced = full.clone();
        let spec = unplaced.spec.as_mut().unwrap();
        spec.node_name = None;
        spec.node_selector = Some(selector.clone());
        let mut placed = unplaced.clone();
        placed.spec.as_mut().unwrap().node_name = Some("spot-1".into());
        slim_pod(&mut unplaced);
        slim_pod(&mut placed);
        assert_eq!(unplaced.spec.unwrap().node_selector, Some(selector));
        assert_eq!(placed.spec.unwrap().node_selector, None);
        let mut node = node("spot-1", Some(notices::NTH_SPOT_ITN_TAINT));
        node.spec.as_mut().unwrap().provider_id = Some("aws:///us-east-1a/i-0abc".into());
        node.status = Some(Default::default());
        let mut slim_n = node.clone();
        slim_node(&mut slim_n);
        assert_eq!(slim_n.spec, node.spec);
        assert!(slim_n.status.is_none());
        // the Ready condition stays, without its times (the job status names a node not Ready)
        let mut unready = node.clone();
        unready.status = serde_json::from_value(serde_json::json!({
            "conditions": [
                {"type": "MemoryPressure", "status": "False"},
                {"type": "Ready", "status": "False", "reason": "KubeletNotReady",
                 "message": "cni plugin not initialized",
                 "lastHeartbeatTime": "2026-01-01T00:00:00Z", "lastTransitionTime": "2026-01-01T00:00:00Z"},
            ],
            "capacity": {"cpu": "8"},
        }))
        .unwrap();
        slim_node(&mut unready);
        assert_eq!(
            serde_json::to_value(&unready.status).unwrap(),
            serde_json::json!({"conditions": [{"type": "Ready", "status": "False",
                "reason": "KubeletNotReady", "message": "cni plugin not initialized"}]})
        );
        let observed = |n: &Node| {
            BTreeMap::from([(
                "spot-1".to_owned(),
                NodeObservation::Present(Box::new(n.clone())),
            )])
        };
        full.metadata.deletion_timestamp = None;
        slim.metadata.deletion_timestamp = None;
        assert_eq!(
            notices::notices(&[slim], &observed(&slim_n), now),
            notices::notices(&[full], &observed(&node), now)
        );
    }
}
