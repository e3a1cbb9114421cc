//! Reconciler scenarios against a mocked API server (`tower-test`) and a fake coordinator on
//! 127.0.0.1 (port 0).
//!
//! The mock serves a small in-memory cluster: the job, its pods, secrets, services, disruption
//! budgets, nodes and events, answering the requests reconcile makes the way the API server
//! would (404s, server-side apply creating objects, graceful pod deletion setting
//! deletionTimestamp, JSON patches on finalizers). Scenarios drive it with fluent helpers and assert on the outcome.

use std::{collections::BTreeMap, net::SocketAddr, sync::Arc, time::Duration};

use axum::{
    Json, Router,
    extract::State,
    routing::{get, post},
};
use ebbflow_crds::{BidAction, Phase, TrainingJob, TrainingJobStatus};
use ebbflow_runtime_api::{
    Ack, JobPhase, JobResult, NoticeRequest, NoticeResponse, StatusResponse,
};
use http::{Request, Response, StatusCode};
use k8s_openapi::{
    api::core::v1::{Node, Pod, Secret, Service},
    api::policy::v1::PodDisruptionBudget,
    apimachinery::pkg::apis::meta::v1::Time,
    jiff::{SignedDuration, Timestamp},
};
use kube::{
    Client, ResourceExt,
    client::Body,
    runtime::{
        controller::Action,
        events::{Recorder, Reporter},
    },
};
use parking_lot::Mutex;
use prometheus::Registry;
use serde_json::{Value, json};

use super::{
    Config, Context, FINALIZER,
    capacity::{CapacityPlanner, CapacityView, SpecCapacityPlanner},
    error_policy, reconcile,
    status::{conditions, reasons},
};
use crate::{
    coordinator::CoordinatorClient,
    metrics::Metrics,
    notices::{KARPENTER_DISRUPTED_TAINT, NTH_SPOT_ITN_TAINT},
};

// ---------------------------------------------------------------------------------------------
// the fake API server

/// An event as recorded by the fake: (type, reason, note).
type RecordedEvent = (String, String, String);

/// The path segment of PodDisruptionBudgets.
const BUDGETS: &str = "poddisruptionbudgets";
/// The API group and path segment of NetworkPolicies.
const NETWORKING: &str = "networking.k8s.io";
const POLICIES: &str = "networkpolicies";

#[derive(Default)]
struct ClusterState {
    job: Option<TrainingJob>,
    pods: BTreeMap<String, Pod>,
    secrets: BTreeMap<String, Secret>,
    services: BTreeMap<String, Service>,
    budgets: BTreeMap<String, PodDisruptionBudget>,
    network_policies: BTreeMap<String, Value>,
    nodes: BTreeMap<String, Node>,
    events: Vec<RecordedEvent>,
    requests: Vec<String>,
    unexpected: Vec<String>,
    fail_pod_list: bool,
}

fn not_found() -> (StatusCode, Value) {
    (
        StatusCode::NOT_FOUND,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
               "message": "not found", "reason": "NotFound", "code": 404}),
    )
}

fn ok(value: impl serde::Serialize) -> (StatusCode, Value) {
    (StatusCode::OK, serde_json::to_value(value).unwrap())
}

fn list(kind: &str, items: Vec<Value>) -> (StatusCode, Value) {
    ok(
        json!({"apiVersion": "v1", "kind": kind, "metadata": {"resourceVersion": "1"}, "items": items}),
    )
}

impl ClusterState {
    fn handle(
        &mut self,
        method: &str,
        path: &str,
        query: &str,
        body: &[u8],
    ) -> (StatusCode, Value) {
        self.requests.push(format!("{method} {path}"));
        let body: Value = if body.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(body).unwrap()
        };
        let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
        match (method, segments.as_slice()) {
            ("GET", ["api", "v1", "namespaces", _, "pods"]) => {
                if self.fail_pod_list {
                    return (
                        StatusCode::INTERNAL_SERVER_ERROR,
                        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": "etcd is sad", "reason": "InternalError", "code": 500}),
                    );
                }
                let job = query_label(query, "ebbflow.dev/job");
                let items = self
                    .pods
                    .values()
                    .filter(|pod| {
                        job.is_none() || pod.labels().get("ebbflow.dev/job") == job.as_ref()
                    })
                    .map(|pod| serde_json::to_value(pod).unwrap())
                    .collect();
                list("PodList", items)
            }
            ("PATCH", ["api", "v1", "namespaces", _, "pods", name]) => {
                let mut pod: Pod = serde_json::from_value(body).unwrap();
                let existing = self.pods.get(*name);
                pod.metadata.creation_timestamp = Some(
                    existing
                        .and_then(|p| p.metadata.creation_timestamp.clone())
                        .unwrap_or(Time(Timestamp::now())),
                );
                pod.status = existing
                    .and_then(|p| p.status.clone())
                    .or_else(|| serde_json::from_value(json!({"phase": "Pending"})).ok());
                if let (Some(existing), Some(spec)) = (existing, pod.spec.as_mut()) {
                    spec.node_name = existing.spec.as_ref().and_then(|s| s.node_name.clone());
                }
                self.pods.insert((*name).to_owned(), pod.clone());
                ok(pod)
            }
            ("DELETE", ["api", "v1", "namespaces", _, "pods", name]) => {
                match self.pods.get_mut(*name) {
                    Some(pod) => {
                        let grace = pod
                            .spec
                            .as_ref()
                            .and_then(|s| s.termination_grace_period_seconds)
                            .unwrap_or(30);
                        pod.metadata.deletion_timestamp.get_or_insert(Time(
                            Timestamp::now() + SignedDuration::from_secs(grace),
                        ));
                        ok(pod.clone())
                    }
                    None => not_found(),
                }
            }
            ("GET", ["api", "v1", "namespaces", _, "secrets", name]) => {
                match self.secrets.get(*name) {
                    Some(secret) => ok(secret),
                    None => not_found(),
                }
            }
            ("PATCH", ["api", "v1", "namespaces", _, "secrets", name]) => {
                let secret: Secret = serde_json::from_value(body).unwrap();
                self.secrets.insert((*name).to_owned(), secret.clone());
                ok(secret)
            }
            ("DELETE", ["api", "v1", "namespaces", _, "secrets", name]) => {
                match self.secrets.remove(*name) {
                    Some(secret) => ok(secret),
                    None => not_found(),
                }
            }
            ("PATCH", ["api", "v1", "namespaces", _, "services", name]) => {
                let service: Service = serde_json::from_value(body).unwrap();
                self.services.insert((*name).to_owned(), service.clone());
                ok(service)
            }
            ("DELETE", ["api", "v1", "namespaces", _, "services", name]) => {
                match self.services.remove(*name) {
                    Some(service) => ok(service),
                    None => not_found(),
                }
            }
            ("PATCH", ["apis", "policy", "v1", "namespaces", _, BUDGETS, name]) => {
                let budget: PodDisruptionBudget = serde_json::from_value(body).unwrap();
                self.budgets.insert((*name).to_owned(), budget.clone());
                ok(budget)
            }
            ("DELETE", ["apis", "policy", "v1", "namespaces", _, BUDGETS, name]) => {
                match self.budgets.remove(*name) {
                    Some(budget) => ok(budget),
                    None => not_found(),
                }
            }
            ("PATCH", ["apis", NETWORKING, "v1", "namespaces", _, POLICIES, name]) => {
                self.network_policies
                    .insert((*name).to_owned(), body.clone());
                ok(body)
            }
            ("DELETE", ["apis", NETWORKING, "v1", "namespaces", _, POLICIES, name]) => {
                match self.network_policies.remove(*name) {
                    Some(policy) => ok(policy),
                    None => not_found(),
                }
            }
            ("GET", ["api", "v1", "nodes", name]) => match self.nodes.get(*name) {
                Some(node) => ok(node),
                None => not_found(),
            },
            (
                "PATCH",
                [
                    "apis",
                    "ebbflow.dev",
                    "v1alpha1",
                    "namespaces",
                    _,
                    "trainingjobs",
                    _,
                    "status",
                ],
            ) => {
                let job = self.job.as_mut().unwrap();
                job.status = Some(serde_json::from_value(body["status"].clone()).unwrap());
                ok(job.clone())
            }
            (
                "PATCH",
                [
                    "apis",
                    "ebbflow.dev",
                    "v1alpha1",
                    "namespaces",
                    _,
                    "trainingjobs",
                    _,
                ],
            ) => {
                let job = self.job.as_mut().unwrap();
                for operation in body.as_array().unwrap() {
                    let path = operation["path"].as_str().unwrap();
                    match (operation["op"].as_str().unwrap(), path) {
                        ("test", _) => {}
                        ("add", "/metadata/finalizers") => {
                            job.metadata.finalizers =
                                serde_json::from_value(operation["value"].clone()).unwrap();
                        }
                        ("add", "/metadata/finalizers/-") => job
                            .metadata
                            .finalizers
                            .get_or_insert_with(Vec::new)
                            .push(operation["value"].as_str().unwrap().to_owned()),
                        ("remove", path) => {
                            let index: usize = path.rsplit('/').next().unwrap().parse().unwrap();
                            job.metadata.finalizers.as_mut().unwrap().remove(index);
                        }
                        other => panic!("unexpected json patch {other:?}"),
                    }
                }
                ok(job.clone())
            }
            ("POST", ["apis", "events.k8s.io", "v1", "namespaces", _, "events"])
            | ("PATCH", ["apis", "events.k8s.io", "v1", "namespaces", _, "events", _]) => {
                self.events.push((
                    body["type"].as_str().unwrap_or_default().to_owned(),
                    body["reason"].as_str().unwrap_or_default().to_owned(),
                    body["note"].as_str().unwrap_or_default().to_owned(),
                ));
                ok(body)
            }
            _ => {
                self.unexpected.push(format!("{method} {path}?{query}"));
                not_found()
            }
        }
    }
}

/// The value of `key=value` in a labelSelector query parameter.
fn query_label(query: &str, key: &str) -> Option<String> {
    let selector = query
        .split('&')
        .find_map(|pair| pair.strip_prefix("labelSelector="))?;
    let decoded = selector
        .replace("%3D", "=")
        .replace("%2C", ",")
        .replace("%2F", "/");
    decoded
        .split(',')
        .find_map(|term| term.strip_prefix(&format!("{key}=")).map(str::to_owned))
}

// ---------------------------------------------------------------------------------------------
// the fake coordinator

struct CoordinatorState {
    status: StatusResponse,
    notices: Vec<NoticeRequest>,
    stops: usize,
    /// `/stop` answers 503.
    refuse_stop: bool,
    /// `/notice` answers this status instead of taking the notice.
    refuse_notice: Option<StatusCode>,
}

impl Default for CoordinatorState {
    fn default() -> Self {
        Self {
            status: StatusResponse {
                phase: JobPhase::Training,
                expected_nodes: 1,
                nodes: Vec::new(),
                partitions: Vec::new(),
                notices: Vec::new(),
                result: None,
                error: None,
                failure_reason: None,
                progress: None,
            },
            notices: Vec::new(),
            stops: 0,
            refuse_stop: false,
            refuse_notice: None,
        }
    }
}

type SharedCoordinator = Arc<Mutex<CoordinatorState>>;

async fn serve_coordinator(state: SharedCoordinator) -> SocketAddr {
    let app = Router::new()
        .route(
            "/status",
            get(|State(s): State<SharedCoordinator>| async move { Json(s.lock().status.clone()) }),
        )
        .route(
            "/notice",
            post(
                |State(s): State<SharedCoordinator>, Json(notice): Json<NoticeRequest>| async move {
                    let mut state = s.lock();
                    if let Some(status) = state.refuse_notice {
                        return Err(status);
                    }
                    let new = !state.notices.contains(&notice);
                    state.notices.push(notice);
                    Ok(Json(NoticeResponse { node: 0, new }))
                },
            ),
        )
        .route(
            "/stop",
            post(|State(s): State<SharedCoordinator>| async move {
                let mut state = s.lock();
                if state.refuse_stop {
                    return Err(StatusCode::SERVICE_UNAVAILABLE);
                }
                state.stops += 1;
                Ok(Json(Ack { ok: true }))
            }),
        )
        .with_state(state);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    address
}

/// An address that refuses connections.
async fn closed_address() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    drop(listener);
    address
}

// ---------------------------------------------------------------------------------------------
// scenario harness

struct Scenario {
    cluster: Arc<Mutex<ClusterState>>,
    coordinator: SharedCoordinator,
    ctx: Arc<Context>,
    registry: Registry,
}

impl Scenario {
    /// A cluster holding `job`, with a reachable coordinator.
    async fn new(job: TrainingJob) -> Self {
        Self::planned_by(job, Arc::new(SpecCapacityPlanner)).await
    }

    /// As [`Scenario::new`] with `planner` deciding capacity (and pricing instances).
    async fn planned_by(job: TrainingJob, planner: Arc<dyn CapacityPlanner>) -> Self {
        let coordinator = SharedCoordinator::default();
        let address = serve_coordinator(coordinator.clone()).await;
        Self::with_coordinator_at(job, coordinator, address, planner)
    }

    /// A cluster holding `job` whose coordinator never answers.
    async fn unreachable(job: TrainingJob) -> Self {
        let address = closed_address().await;
        Self::with_coordinator_at(
            job,
            SharedCoordinator::default(),
            address,
            Arc::new(SpecCapacityPlanner),
        )
    }

    fn with_coordinator_at(
        job: TrainingJob,
        coordinator: SharedCoordinator,
        address: SocketAddr,
        planner: Arc<dyn CapacityPlanner>,
    ) -> Self {
        let cluster = Arc::new(Mutex::new(ClusterState {
            job: Some(job),
            ..ClusterState::default()
        }));
        let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let served = cluster.clone();
        tokio::spawn(async move {
            while let Some((request, respond)) = handle.next_request().await {
                let (parts, body) = request.into_parts();
                let bytes = body.collect_bytes().await.unwrap();
                let (status, value) = served.lock().handle(
                    parts.method.as_str(),
                    parts.uri.path(),
                    parts.uri.query().unwrap_or_default(),
                    &bytes,
                );
                let response = Response::builder()
                    .status(status)
                    .header("content-type", "application/json")
                    .body(Body::from(serde_json::to_vec(&value).unwrap()))
                    .unwrap();
                respond.send_response(response);
            }
        });
        let client = Client::new(service, "default");
        let registry = Registry::new();
        let metrics = Metrics::register(&registry).unwrap();
        let mut config = Config::new("ghcr.io/ebbflow/ebbflow-runtime:test");
        config.plan.network_policy = Some(
            super::plan::OperatorPeer::parse("ebbflow-system", "app.kubernetes.io/name=ebbflow")
                .unwrap(),
        );
        config.coordinator_url_override = Some(format!("http://{address}"));
        let ctx = Context::new(
            client.clone(),
            Recorder::new(client, Reporter::from("ebbflow-operator")),
            metrics,
            config,
            CoordinatorClient::new(Duration::from_secs(2)).unwrap(),
            planner,
        );
        Self {
            cluster,
            coordinator,
            ctx: Arc::new(ctx),
            registry,
        }
    }

    async fn reconcile(&self) -> Result<Action, super::Error> {
        let job = self.job();
        let result = reconcile(Arc::new(job.clone()), self.ctx.clone()).await;
        if let Err(error) = &result {
            error_policy(Arc::new(job), error, self.ctx.clone());
        }
        let unexpected = self.cluster.lock().unexpected.clone();
        assert!(unexpected.is_empty(), "unexpected requests: {unexpected:?}");
        result
    }

    /// Reconciles and expects success.
    async fn settle(&self) -> Action {
        self.reconcile().await.expect("reconcile succeeds")
    }

    fn job(&self) -> TrainingJob {
        self.cluster.lock().job.clone().unwrap()
    }

    fn status(&self) -> TrainingJobStatus {
        self.job().status.unwrap_or_default()
    }

    fn condition(&self, type_: &str) -> (String, String, String) {
        let status = self.status();
        let c = status
            .condition(type_)
            .unwrap_or_else(|| panic!("no {type_} condition"));
        (c.status.clone(), c.reason.clone(), c.message.clone())
    }

    fn change_spec(&self, change: impl FnOnce(&mut ebbflow_crds::TrainingJobSpec)) {
        let mut cluster = self.cluster.lock();
        let job = cluster.job.as_mut().unwrap();
        change(&mut job.spec);
        job.metadata.generation = Some(job.metadata.generation.unwrap_or(1) + 1);
    }

    /// Pods not being deleted, by name.
    fn live_pods(&self) -> Vec<String> {
        let cluster = self.cluster.lock();
        cluster
            .pods
            .values()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .map(|p| p.name_any())
            .collect()
    }

    fn deleting_pods(&self) -> Vec<String> {
        let cluster = self.cluster.lock();
        cluster
            .pods
            .values()
            .filter(|p| p.metadata.deletion_timestamp.is_some())
            .map(|p| p.name_any())
            .collect()
    }

    fn pod(&self, name: &str) -> Pod {
        self.cluster.lock().pods[name].clone()
    }

    /// The scheduler and kubelet: every pending pod lands on its own node and becomes ready.
    fn schedule_and_start_pods(&self) {
        let mut cluster = self.cluster.lock();
        let names: Vec<String> = cluster.pods.keys().cloned().collect();
        for name in names {
            let node_name = format!("node-{name}");
            let pod = cluster.pods.get_mut(&name).unwrap();
            if pod.metadata.deletion_timestamp.is_some() {
                continue;
            }
            pod.spec.as_mut().unwrap().node_name = Some(node_name.clone());
            pod.status = serde_json::from_value(
                json!({"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}),
            )
            .ok();
            let node: Node =
                serde_json::from_value(json!({"metadata": {"name": node_name}})).unwrap();
            cluster.nodes.entry(node_name).or_insert(node);
        }
    }

    /// The kubelet finishes every graceful deletion.
    fn finish_deletions(&self) {
        self.cluster
            .lock()
            .pods
            .retain(|_, pod| pod.metadata.deletion_timestamp.is_none());
    }

    fn taint_node_of(&self, pod: &str, key: &str, added: Timestamp) {
        let mut cluster = self.cluster.lock();
        let node = cluster.nodes.get_mut(&format!("node-{pod}")).unwrap();
        let taint = serde_json::from_value(
            json!({"key": key, "effect": "NoSchedule", "timeAdded": Time(added)}),
        )
        .unwrap();
        node.spec
            .get_or_insert_with(Default::default)
            .taints
            .get_or_insert_with(Vec::new)
            .push(taint);
    }

    fn remove_node_of(&self, pod: &str) {
        self.cluster.lock().nodes.remove(&format!("node-{pod}"));
    }

    fn report(&self, change: impl FnOnce(&mut StatusResponse)) {
        change(&mut self.coordinator.lock().status);
    }

    fn event_reasons(&self) -> Vec<String> {
        self.cluster
            .lock()
            .events
            .iter()
            .map(|(_, reason, _)| reason.clone())
            .collect()
    }

    fn events_with_reason(&self, reason: &str) -> Vec<RecordedEvent> {
        self.cluster
            .lock()
            .events
            .iter()
            .filter(|(_, r, _)| r == reason)
            .cloned()
            .collect()
    }

    fn notices(&self) -> Vec<NoticeRequest> {
        self.coordinator.lock().notices.clone()
    }

    fn metric(&self, name: &str, label: Option<(&str, &str)>) -> f64 {
        self.registry
            .gather()
            .iter()
            .filter(|family| family.name() == name)
            .flat_map(|family| {
                let kind = family.get_field_type();
                family.get_metric().iter().map(move |metric| (kind, metric))
            })
            .filter(|(_, metric)| {
                label.is_none_or(|(key, value)| {
                    metric
                        .get_label()
                        .iter()
                        .any(|pair| pair.name() == key && pair.value() == value)
                })
            })
            .map(|(kind, metric)| match kind {
                prometheus::proto::MetricType::COUNTER => metric.get_counter().get_value(),
                prometheus::proto::MetricType::HISTOGRAM => {
                    metric.get_histogram().get_sample_count() as f64
                }
                _ => metric.get_gauge().get_value(),
            })
            .sum()
    }

    /// Brings a job to Running: reliable tier and decided transient pods up.
    async fn running(job: TrainingJob) -> Self {
        Self::running_with(job, Arc::new(SpecCapacityPlanner)).await
    }

    /// As [`Scenario::running`] with `planner`.
    async fn running_with(job: TrainingJob, planner: Arc<dyn CapacityPlanner>) -> Self {
        let scenario = Self::planned_by(job.with_finalizer(FINALIZER), planner).await;
        scenario.settle().await;
        scenario.schedule_and_start_pods();
        scenario.settle().await;
        scenario.schedule_and_start_pods();
        scenario.settle().await;
        assert_eq!(scenario.status().phase, Some(Phase::Running));
        scenario
    }
}

/// A job with a transient tier of `max_nodes` in c5.xlarge across `zones`.
fn spot_job(name: &str, max_nodes: u32, zones: &[&str]) -> TrainingJob {
    TrainingJob::test(name)
        .with_transient(max_nodes)
        .with_spec(|spec| {
            spec.transient.instance_types = vec!["c5.xlarge".to_owned()];
            spec.transient.zones = zones.iter().map(|z| (*z).to_owned()).collect();
        })
}

// ---------------------------------------------------------------------------------------------
// scenarios

#[tokio::test]
async fn create_adds_finalizer_then_secret_service_and_reliable_pods() {
    let scenario = Scenario::new(TrainingJob::test("mf").with_reliable(2)).await;
    assert_eq!(
        scenario.settle().await,
        Action::await_change(),
        "finalizer first"
    );
    assert_eq!(scenario.job().finalizers(), [FINALIZER]);
    assert!(scenario.live_pods().is_empty());

    scenario.settle().await;
    assert_eq!(scenario.live_pods(), ["mf-r-0", "mf-r-1"]);
    let token = {
        let cluster = scenario.cluster.lock();
        assert!(cluster.services.contains_key("mf-coordinator"));
        assert!(cluster.budgets.contains_key("mf-coordinator"));
        assert!(cluster.network_policies.contains_key("mf-coordinator"));
        cluster.secrets["mf-token"].data.as_ref().unwrap()["token"]
            .0
            .clone()
    };
    assert_eq!(token.len(), 64, "256-bit hex token");
    assert_eq!(scenario.status().phase, Some(Phase::Provisioning));
    assert_eq!(scenario.status().observed_generation, Some(1));
    assert_eq!(scenario.condition(conditions::VALID).0, "True");
    assert!(scenario.event_reasons().contains(&"PodsCreated".to_owned()));

    // Applying again keeps the token and creates nothing new.
    scenario.settle().await;
    let again = scenario.cluster.lock().secrets["mf-token"]
        .data
        .as_ref()
        .unwrap()["token"]
        .0
        .clone();
    assert_eq!(again, token);
    assert_eq!(scenario.live_pods(), ["mf-r-0", "mf-r-1"]);
    assert_eq!(
        scenario.metric(
            "ebbflow_operator_pods_created_total",
            Some(("tier", "reliable"))
        ),
        2.0
    );
}

#[tokio::test]
async fn scale_up_creates_transient_pods_in_the_decided_pool() {
    let scenario = Scenario::running(spot_job("mf", 3, &["us-east-1a"])).await;
    assert_eq!(
        scenario.live_pods(),
        ["mf-r-0", "mf-t-0", "mf-t-1", "mf-t-2"]
    );
    let pod = scenario.pod("mf-t-0");
    let selector = pod.spec.as_ref().unwrap().node_selector.clone().unwrap();
    assert_eq!(selector["karpenter.sh/capacity-type"], "spot");
    assert_eq!(selector["topology.kubernetes.io/zone"], "us-east-1a");
    let nodes = scenario.status().nodes.unwrap();
    assert_eq!((nodes.reliable, nodes.transient), (1, 3));
    assert_eq!(
        scenario.condition(conditions::READY).1,
        reasons::COORDINATOR_READY
    );

    scenario.change_spec(|spec| spec.transient.max_nodes = 5);
    let action = scenario.settle().await;
    assert_eq!(
        scenario.live_pods(),
        ["mf-r-0", "mf-t-0", "mf-t-1", "mf-t-2", "mf-t-3", "mf-t-4"]
    );
    assert_eq!(
        action,
        Action::requeue(Duration::from_secs(10)),
        "provisioning requeue"
    );
    let decisions = scenario.status().recent_decisions;
    let last = decisions.last().unwrap();
    assert_eq!((last.action, last.count), (BidAction::Acquire, 2));
    assert_eq!(scenario.status().observed_generation, Some(2));
}

#[tokio::test]
async fn partial_eviction_notifies_the_coordinator_and_replaces_capacity() {
    let scenario = Scenario::running(spot_job("mf", 4, &["us-east-1a"])).await;
    // Taints carry whole seconds.
    let tainted_at = Timestamp::from_second(Timestamp::now().as_second()).unwrap();
    scenario.taint_node_of("mf-t-1", NTH_SPOT_ITN_TAINT, tainted_at);
    scenario.taint_node_of("mf-t-3", NTH_SPOT_ITN_TAINT, tainted_at);
    scenario.settle().await;

    let notices = scenario.notices();
    let noticed: Vec<&str> = notices.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(noticed, ["mf-t-1", "mf-t-3"]);
    let leaves_at = tainted_at + SignedDuration::from_secs(120);
    assert_eq!(notices[0].deadline_unix, leaves_at.as_second() as u64);
    assert_eq!(scenario.status().evictions, 2);
    assert_eq!(
        scenario.metric(
            "ebbflow_operator_notice_lead_seconds",
            Some(("source", "AwsNodeTerminationHandler"))
        ),
        2.0
    );
    // Replacements come up while the noticed pods drain; nothing is deleted early.
    assert_eq!(
        scenario.live_pods(),
        [
            "mf-r-0", "mf-t-0", "mf-t-1", "mf-t-2", "mf-t-3", "mf-t-4", "mf-t-5"
        ]
    );
    assert_eq!(scenario.events_with_reason("EvictionNotice").len(), 2);

    // Seen again: no duplicate delivery, no double count.
    scenario.settle().await;
    assert_eq!(scenario.notices().len(), 2);
    assert_eq!(scenario.status().evictions, 2);
}

/// A notice the coordinator did not take (it answered 503: restarting, overloaded) is posted
/// again well before its deadline, not at the next decision two minutes later, past EC2's
/// notice; one it refused (404: a node it does not know) waits for the usual cadence.
#[tokio::test]
async fn a_notice_not_taken_is_posted_again_before_its_deadline() {
    let scenario = Scenario::running(spot_job("mf", 2, &["us-east-1a"])).await;
    scenario.coordinator.lock().refuse_notice = Some(StatusCode::SERVICE_UNAVAILABLE);
    let tainted_at = Timestamp::from_second(Timestamp::now().as_second()).unwrap();
    scenario.taint_node_of("mf-t-1", NTH_SPOT_ITN_TAINT, tainted_at);
    scenario.settle().await;
    scenario.schedule_and_start_pods();
    let action = scenario.settle().await;
    assert!(scenario.notices().is_empty());
    // a quarter of the two minutes left, at most 15 s
    assert_requeued_within(&action, 14..=15, "the notice's retry");
    assert!(
        scenario.metric("ebbflow_operator_notice_failures_total", None) >= 2.0,
        "counted"
    );

    scenario.coordinator.lock().refuse_notice = Some(StatusCode::NOT_FOUND);
    let action = scenario.settle().await;
    assert_requeued_within(&action, 120..=120, "a refusal: the decision interval");

    scenario.coordinator.lock().refuse_notice = None;
    scenario.settle().await;
    let notices = scenario.notices();
    assert_eq!(notices.len(), 1, "{notices:?}");
    assert_eq!(notices[0].name, "mf-t-1");
    let action = scenario.settle().await;
    assert_requeued_within(&action, 120..=120, "delivered: nothing to retry");
}

#[tokio::test]
async fn full_eviction_moves_the_transient_tier_to_another_pool() {
    let scenario = Scenario::running(spot_job("mf", 2, &["us-east-1a", "us-east-1b"])).await;
    let now = Timestamp::now();
    for pod in ["mf-t-0", "mf-t-1"] {
        scenario.taint_node_of(pod, KARPENTER_DISRUPTED_TAINT, now);
    }
    scenario.settle().await;
    assert_eq!(scenario.notices().len(), 2);
    assert_eq!(
        scenario.metric(
            "ebbflow_operator_notices_sent_total",
            Some(("source", "KarpenterDisruption"))
        ),
        2.0
    );
    let new_zone = |name: &str| {
        scenario.pod(name).spec.unwrap().node_selector.unwrap()["topology.kubernetes.io/zone"]
            .clone()
    };
    assert_eq!(new_zone("mf-t-2"), "us-east-1b");
    assert_eq!(new_zone("mf-t-3"), "us-east-1b");
    let decisions = scenario.status().recent_decisions;
    let tail: Vec<(BidAction, String)> = decisions
        .iter()
        .rev()
        .take(2)
        .map(|d| (d.action, d.pool.clone().unwrap().zone))
        .collect();
    assert!(
        tail.contains(&(BidAction::Release, "us-east-1a".to_owned())),
        "{tail:?}"
    );
    assert!(
        tail.contains(&(BidAction::Acquire, "us-east-1b".to_owned())),
        "{tail:?}"
    );
    assert_eq!(decisions.last().unwrap().reason, "Eviction");
}

#[tokio::test]
async fn node_deleted_without_notice_replaces_the_pod_and_degrades() {
    let scenario = Scenario::running(spot_job("mf", 2, &["us-east-1a"])).await;
    scenario.remove_node_of("mf-t-0");
    scenario.settle().await;

    let notices = scenario.notices();
    assert_eq!(notices.len(), 1);
    assert_eq!(notices[0].name, "mf-t-0");
    assert!(
        notices[0].deadline_unix <= Timestamp::now().as_second() as u64,
        "already gone"
    );
    assert_eq!(
        scenario.metric(
            "ebbflow_operator_notices_sent_total",
            Some(("source", "NodeGone"))
        ),
        1.0
    );
    assert_eq!(scenario.deleting_pods(), ["mf-t-0"]);
    assert_eq!(scenario.live_pods(), ["mf-r-0", "mf-t-1", "mf-t-2"]);
    let (degraded, reason, message) = scenario.condition(conditions::DEGRADED);
    assert_eq!(
        (degraded.as_str(), reason.as_str()),
        ("True", reasons::NODE_LOST)
    );
    assert!(message.contains("mf-t-0"));
    assert_eq!(scenario.events_with_reason(reasons::NODE_LOST).len(), 1);
    assert_eq!(
        scenario.metric(
            "ebbflow_operator_pods_deleted_total",
            Some(("reason", "Replace"))
        ),
        1.0
    );
}

#[tokio::test]
async fn suspend_releases_every_pod_after_telling_the_coordinator() {
    let scenario = Scenario::running(spot_job("mf", 2, &["us-east-1a"])).await;
    scenario.change_spec(|spec| spec.suspend = true);
    let action = scenario.settle().await;
    assert_eq!(action, Action::await_change());
    assert!(scenario.live_pods().is_empty());
    assert_eq!(scenario.deleting_pods(), ["mf-r-0", "mf-t-0", "mf-t-1"]);
    assert_eq!(scenario.status().phase, Some(Phase::Suspended));
    assert_eq!(scenario.condition(conditions::SUSPENDED).0, "True");
    assert!(scenario.event_reasons().contains(&"Suspended".to_owned()));
    // Suspend stops the coordinator; nothing more is sent to a job that is stopping.
    assert_eq!(scenario.coordinator.lock().stops, 1);
    // Our own release is not counted as an eviction.
    scenario.finish_deletions();
    scenario.settle().await;
    assert_eq!(scenario.status().evictions, 0);
    assert!(
        scenario.cluster.lock().secrets.contains_key("mf-token"),
        "state to resume from"
    );
}

#[tokio::test]
async fn resume_recreates_the_reliable_tier() {
    let scenario = Scenario::running(spot_job("mf", 1, &["us-east-1a"])).await;
    let token = scenario.cluster.lock().secrets["mf-token"].clone();
    scenario.change_spec(|spec| spec.suspend = true);
    scenario.settle().await;
    scenario.finish_deletions();
    scenario.settle().await;
    assert!(scenario.live_pods().is_empty());

    scenario.change_spec(|spec| spec.suspend = false);
    scenario.settle().await;
    // a transient pod's name is never reused within the job
    assert_eq!(scenario.live_pods(), ["mf-r-0", "mf-t-1"]);
    assert_eq!(scenario.status().next_transient_ordinal, 2);
    assert_eq!(scenario.condition(conditions::SUSPENDED).0, "False");
    assert!(scenario.event_reasons().contains(&"Resumed".to_owned()));
    assert_eq!(
        scenario.cluster.lock().secrets["mf-token"],
        token,
        "same token after resume"
    );
    scenario.schedule_and_start_pods();
    scenario.settle().await;
    assert_eq!(scenario.status().phase, Some(Phase::Running));
}

/// An edit of the training shape while the job runs reaches no pod (they run the pinned spec,
/// and the reliable count stays the pinned one) and is warned about once; a stop goal edited
/// beside it is no shape change.
#[tokio::test]
async fn a_shape_edit_while_running_waits_for_the_next_start_and_is_warned_about_once() {
    let scenario = Scenario::running(spot_job("mf", 1, &["us-east-1a"])).await;
    let before = scenario.live_pods();
    scenario.change_spec(|spec| spec.stop.iterations = Some(123));
    scenario.settle().await;
    assert!(scenario.events_with_reason("ShapeEditPending").is_empty());

    scenario.change_spec(|spec| spec.reliable.count += 1);
    scenario.settle().await;
    scenario.settle().await;
    assert_eq!(
        scenario.live_pods(),
        before,
        "no reliable pod the coordinator refuses"
    );
    let warnings = scenario.events_with_reason("ShapeEditPending");
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(warnings[0].2.contains("workers="), "{warnings:?}");

    // At the next start the edited shape is the job's.
    scenario.change_spec(|spec| spec.suspend = true);
    scenario.settle().await;
    scenario.finish_deletions();
    scenario.settle().await;
    scenario.change_spec(|spec| spec.suspend = false);
    scenario.settle().await;
    assert_eq!(
        scenario
            .live_pods()
            .iter()
            .filter(|p| p.contains("-r-"))
            .count(),
        2
    );
    assert_eq!(scenario.events_with_reason("ShapeEditPending").len(), 1);
}

#[tokio::test]
async fn delete_cleans_up_everything_and_releases_the_finalizer() {
    let scenario = Scenario::running(spot_job("mf", 2, &["us-east-1a"])).await;
    {
        let mut cluster = scenario.cluster.lock();
        cluster.job.as_mut().unwrap().metadata.deletion_timestamp = Some(Time(Timestamp::now()));
    }
    scenario.settle().await;
    assert!(scenario.live_pods().is_empty());
    {
        let cluster = scenario.cluster.lock();
        assert!(cluster.services.is_empty());
        assert!(cluster.budgets.is_empty());
        assert!(cluster.network_policies.is_empty());
        assert!(cluster.secrets.is_empty());
    }
    assert!(scenario.job().finalizers().is_empty(), "finalizer removed");
    assert_eq!(
        scenario.coordinator.lock().stops,
        1,
        "told to stop before deletion"
    );
    assert!(scenario.event_reasons().contains(&"CleanedUp".to_owned()));
    assert_eq!(
        scenario.metric(
            "ebbflow_operator_pods_deleted_total",
            Some(("reason", "Cleanup"))
        ),
        3.0
    );
}

#[tokio::test]
async fn delete_before_anything_was_applied_is_clean() {
    let scenario = Scenario::new(TrainingJob::test("mf").being_deleted(FINALIZER)).await;
    scenario.settle().await;
    assert!(scenario.job().finalizers().is_empty());
    // Idempotent: a second cleanup of nothing succeeds too.
    let job = scenario.job().being_deleted(FINALIZER);
    scenario.cluster.lock().job = Some(job);
    scenario.settle().await;
    assert!(scenario.job().finalizers().is_empty());
}

#[tokio::test]
async fn invalid_spec_sets_condition_and_one_event_without_retrying() {
    let scenario = Scenario::new(
        TrainingJob::test("bad")
            .with_transient_range(5, 2)
            .with_finalizer(FINALIZER),
    )
    .await;
    let action = scenario.settle().await;
    assert_eq!(action, Action::await_change(), "no hot retry loop");
    let (valid, reason, message) = scenario.condition(conditions::VALID);
    assert_eq!(
        (valid.as_str(), reason.as_str()),
        ("False", reasons::INVALID_SPEC)
    );
    assert!(message.contains("spec.transient.minNodes"), "{message}");
    assert_eq!(scenario.status().phase, Some(Phase::Failed));
    assert!(
        scenario.live_pods().is_empty(),
        "nothing is created from an invalid spec"
    );
    let events = scenario.events_with_reason(reasons::INVALID_SPEC);
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].0, "Warning");
    assert!(events[0].2.contains("spec.transient.minNodes"));

    // Reconciling the same generation again emits no second event.
    scenario.settle().await;
    assert_eq!(scenario.events_with_reason(reasons::INVALID_SPEC).len(), 1);

    // Fixing the spec recovers.
    scenario.change_spec(|spec| spec.transient.min_nodes = 0);
    scenario.settle().await;
    assert_eq!(scenario.condition(conditions::VALID).0, "True");
    assert_eq!(scenario.live_pods(), ["bad-r-0", "bad-t-0", "bad-t-1"]);
}

#[tokio::test]
async fn coordinator_unreachable_is_degraded_with_backoff() {
    let scenario = Scenario::unreachable(TrainingJob::test("mf").with_finalizer(FINALIZER)).await;
    let first = scenario.settle().await;
    assert_eq!(first, Action::requeue(Duration::from_secs(5)));
    let (degraded, reason, message) = scenario.condition(conditions::DEGRADED);
    assert_eq!(
        (degraded.as_str(), reason.as_str()),
        ("True", reasons::COORDINATOR_UNREACHABLE)
    );
    assert!(message.contains("127.0.0.1"), "{message}");
    assert_eq!(
        scenario.live_pods(),
        ["mf-r-0"],
        "children are still applied"
    );
    let second = scenario.settle().await;
    assert_eq!(
        second,
        Action::requeue(Duration::from_secs(10)),
        "backoff doubles"
    );
    let third = scenario.settle().await;
    assert_eq!(third, Action::requeue(Duration::from_secs(20)));
    assert_eq!(
        scenario
            .events_with_reason(reasons::COORDINATOR_UNREACHABLE)
            .len(),
        1,
        "one event per transition"
    );
    assert_eq!(
        scenario.metric(
            "ebbflow_operator_coordinator_requests_total",
            Some(("outcome", "error"))
        ),
        3.0
    );
}

#[tokio::test]
async fn finished_training_succeeds_and_releases_nodes() {
    let scenario = Scenario::running(spot_job("mf", 1, &["us-east-1a"])).await;
    scenario.report(|status| {
        status.phase = JobPhase::Done;
        status.result = Some(JobResult {
            loss: 0.125,
            metrics: Vec::new(),
            updates_per_second: 100.0,
        });
    });
    scenario.settle().await;
    assert_eq!(scenario.status().phase, Some(Phase::Succeeded));
    assert_eq!(
        scenario.condition(conditions::SUCCEEDED).1,
        reasons::STOP_CRITERION_MET
    );
    assert_eq!(scenario.status().loss, Some(0.125));
    assert!(scenario.live_pods().is_empty());
    assert!(scenario.event_reasons().contains(&"Succeeded".to_owned()));
}

#[tokio::test]
async fn a_met_target_loss_stops_the_coordinator_and_the_job_succeeds_once_it_stopped() {
    let job = spot_job("mf", 1, &["us-east-1a"]).with_target_loss(0.5);
    let scenario = Scenario::running(job).await;
    let progress = |loss| ebbflow_runtime_api::ElasticProgress {
        clock: 40,
        stage: 2,
        loss: Some(loss),
        ..ebbflow_runtime_api::ElasticProgress::default()
    };
    // above the target: nothing happens
    scenario.report(|status| status.progress = Some(progress(0.6)));
    scenario.settle().await;
    assert_eq!(scenario.coordinator.lock().stops, 0);
    assert_eq!(scenario.status().stop_reason, None);

    // at the target: the coordinator is asked to stop, the job runs until it has
    scenario.report(|status| status.progress = Some(progress(0.45)));
    scenario.settle().await;
    assert!(scenario.coordinator.lock().stops >= 1);
    let stopping = scenario.status();
    assert_eq!(stopping.stop_reason.as_deref(), Some("targetLoss"));
    assert_eq!(stopping.phase, Some(Phase::Running));
    assert_eq!(stopping.loss, Some(0.45), "the last clock's training loss");
    assert_eq!(scenario.live_pods(), ["mf-r-0", "mf-t-0"]);
    assert_eq!(scenario.events_with_reason("Stopping").len(), 1);

    // a loss that rises again does not undo the stop; the coordinator's end does finish it
    scenario.report(|status| {
        status.progress = Some(progress(0.7));
        status.phase = JobPhase::Stopped;
        status.result = Some(JobResult {
            loss: 0.44,
            metrics: Vec::new(),
            updates_per_second: 100.0,
        });
    });
    scenario.settle().await;
    let done = scenario.status();
    assert_eq!(done.phase, Some(Phase::Succeeded), "{done:?}");
    let (value, reason, message) = scenario.condition(conditions::SUCCEEDED);
    assert_eq!(
        (value.as_str(), reason.as_str()),
        ("True", "TargetLossReached")
    );
    assert!(message.contains("targetLoss"), "{message}");
    assert_eq!(done.loss, Some(0.44), "the final evaluation's");
    assert!(scenario.live_pods().is_empty());
}

#[tokio::test]
async fn an_unanswered_stop_ends_the_job_after_the_wait() {
    let scenario =
        Scenario::running(spot_job("mf", 1, &["us-east-1a"]).with_wall_clock_limit("1h")).await;
    // training started long ago; the coordinator is gone
    {
        let mut cluster = scenario.cluster.lock();
        let status = cluster.job.as_mut().unwrap().status.as_mut().unwrap();
        status.start_time = Some(Time(Timestamp::now() - SignedDuration::from_hours(2)));
    }
    scenario
        .report(|status| status.progress = Some(ebbflow_runtime_api::ElasticProgress::default()));
    scenario.settle().await;
    assert_eq!(
        scenario.status().stop_reason.as_deref(),
        Some("wallClockLimit")
    );
    assert_eq!(
        scenario.status().phase,
        Some(Phase::Running),
        "waiting for the coordinator"
    );
    // the coordinator never confirms and refuses the stop; past the wait the job ends anyway
    scenario.coordinator.lock().refuse_stop = true;
    {
        let mut cluster = scenario.cluster.lock();
        let status = cluster.job.as_mut().unwrap().status.as_mut().unwrap();
        status.stop_requested_time = Some(Time(
            Timestamp::now()
                - SignedDuration::from_secs(super::stop::CONFIRM_WAIT.as_secs() as i64 + 1),
        ));
    }
    scenario.settle().await;
    let done = scenario.status();
    assert_eq!(done.phase, Some(Phase::Succeeded), "{done:?}");
    assert_eq!(
        scenario.condition(conditions::SUCCEEDED).1,
        "WallClockLimitReached"
    );
    assert!(scenario.live_pods().is_empty());
}

/// The spec's capacity, its instances priced on the p3 trace replayed at an hour per second.
struct PricedSpec(super::cost::Pricing);

impl CapacityPlanner for PricedSpec {
    fn decide(&self, view: &CapacityView<'_>) -> super::plan::CapacityDecision {
        SpecCapacityPlanner.decide(view)
    }

    fn pricing(&self, _job: &TrainingJob, _now: Timestamp) -> Option<super::cost::Pricing> {
        Some(self.0.clone())
    }
}

#[tokio::test]
async fn running_pods_are_charged_and_pods_without_a_price_are_warned_about() {
    let market_job = TrainingJob::test("mf")
        .with_trace("aws_p3.2xlarge_availability_price_9az_2023-02-15_to_03-09.csv");
    let setup = ebbflow_job::jobmarket::setup_market(&market_job, &crate::test_data::spot_data())
        .expect("the p3 trace loads");
    let pricing = super::cost::Pricing {
        setup: Arc::new(setup),
        clock: super::cost::MarketClock::Replay { speed: 3600.0 },
        created: Timestamp::now(),
    };
    // c5.xlarge is not in the p3 market: its spot pod runs unpriced
    let scenario = Scenario::running_with(
        spot_job("mf", 1, &["us-east-1a"]),
        Arc::new(PricedSpec(pricing)),
    )
    .await;
    // (the reconciles take milliseconds: trace seconds at this speed)
    scenario.change_spec(|spec| spec.stop.iterations = Some(2000));
    scenario.settle().await;
    let cost = scenario.status().cost.expect("a priced job is charged");
    assert!(cost.spent > 0.0, "the reliable pod ran: {cost:?}");
    assert_eq!(cost.unpriced, ["mf-t-0"]);
    let warnings = scenario.events_with_reason("UnpricedInstances");
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert_eq!(warnings[0].0, "Warning");
    assert!(warnings[0].2.contains("mf-t-0"), "{warnings:?}");
    // the same unpriced pods are not warned about again
    scenario.change_spec(|spec| spec.stop.iterations = Some(3000));
    scenario.settle().await;
    assert_eq!(scenario.events_with_reason("UnpricedInstances").len(), 1);
}

#[tokio::test]
async fn a_coordinator_pod_failing_at_startup_fails_the_job_after_three_times() {
    let scenario =
        Scenario::unreachable(spot_job("mf", 1, &["us-east-1a"]).with_finalizer(FINALIZER)).await;
    scenario.settle().await;
    scenario.schedule_and_start_pods();
    let error = "spec.app.dataset.path: /data/ratings.csv does not exist";
    for attempt in 1..=3u32 {
        // the kubelet: the coordinator pod's container exited with the error it printed
        terminate_pod(
            &scenario,
            "mf-r-0",
            &format!("uid-{attempt}"),
            json!({"exitCode": 1, "reason": "Error", "message": format!("Error: {error}\n")}),
        );
        let _ = scenario.reconcile().await;
        let status = scenario.status();
        if attempt < 3 {
            assert_eq!(status.coordinator_failures, attempt, "{status:?}");
            assert_ne!(status.phase, Some(Phase::Failed));
            // replaced: deleted, then created again
            let _ = scenario.reconcile().await;
            scenario.finish_deletions();
            let _ = scenario.reconcile().await;
            assert!(scenario.live_pods().contains(&"mf-r-0".to_owned()));
            scenario.schedule_and_start_pods();
        }
    }
    let status = scenario.status();
    assert_eq!(status.phase, Some(Phase::Failed), "{status:?}");
    let (value, reason, message) = scenario.condition(conditions::FAILED);
    assert_eq!(
        (value.as_str(), reason.as_str()),
        ("True", "CoordinatorFailed")
    );
    assert!(
        message.contains("3 times") && message.contains(error),
        "{message}"
    );
    let _ = scenario.reconcile().await;
    assert!(scenario.live_pods().is_empty(), "every pod released");
}

/// `action` requeues after a whole number of seconds in `seconds` (the wait to a time given in
/// whole seconds, measured a moment later).
fn assert_requeued_within(action: &Action, seconds: std::ops::RangeInclusive<u64>, what: &str) {
    assert!(
        seconds
            .clone()
            .any(|s| *action == Action::requeue(Duration::from_secs(s))),
        "{what}: {action:?}, not {seconds:?} s"
    );
}

/// Marks pod `name` Failed: its container exited with `message` at `finished`.
fn fail_pod(scenario: &Scenario, name: &str, uid: &str, message: &str, finished: Timestamp) {
    terminate_pod(
        scenario,
        name,
        uid,
        json!({
            "exitCode": 137, "reason": "OOMKilled", "message": message,
            "finishedAt": finished.to_string(),
        }),
    );
}

/// The kubelet's report of pod `name` (now `uid`) Failed: its container `terminated` so.
fn terminate_pod(scenario: &Scenario, name: &str, uid: &str, terminated: Value) {
    let mut cluster = scenario.cluster.lock();
    let pod = cluster.pods.get_mut(name).expect("the pod exists");
    pod.metadata.uid = Some(uid.to_owned());
    pod.status = serde_json::from_value(json!({
        "phase": "Failed",
        "containerStatuses": [{
            "name": "runtime", "image": "i", "imageID": "", "ready": false,
            "restartCount": 0,
            "state": {"terminated": terminated},
        }],
    }))
    .ok();
}

#[tokio::test]
async fn a_failing_node_pod_is_replaced_after_a_backoff_and_warned_about() {
    let scenario = Scenario::running(spot_job("mf", 2, &["us-east-1a"])).await;
    // a spot pod that crashed a minute ago: warned about, and replaced at once (the backoff
    // after one failure, 5 s, has passed)
    let minute_ago = Timestamp::now() - SignedDuration::from_secs(60);
    fail_pod(
        &scenario,
        "mf-t-1",
        "uid-t1",
        "out of memory loading shard 3",
        minute_ago,
    );
    let _ = scenario.settle().await;
    assert_eq!(scenario.status().node_failures, 1);
    let warnings = scenario.events_with_reason("NodePodFailed");
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert_eq!(warnings[0].0, "Warning");
    assert!(
        warnings[0].2.contains("mf-t-1") && warnings[0].2.contains("out of memory loading shard 3"),
        "{warnings:?}"
    );
    scenario.finish_deletions();
    let _ = scenario.settle().await;
    assert_eq!(scenario.live_pods(), ["mf-r-0", "mf-t-0", "mf-t-2"]);
    scenario.schedule_and_start_pods();
    let _ = scenario.settle().await;
    // the same failed pod is not counted twice
    assert_eq!(scenario.events_with_reason("NodePodFailed").len(), 1);

    // another crashes now, the second in a row: not created again until 10 s after it
    fail_pod(
        &scenario,
        "mf-t-0",
        "uid-t0",
        "exit code 1",
        Timestamp::now(),
    );
    let action = scenario.settle().await;
    assert_eq!(scenario.status().node_failures, 2);
    assert_eq!(scenario.events_with_reason("NodePodFailed").len(), 2);
    assert_eq!(
        scenario.metric("ebbflow_operator_node_pod_failures_total", None),
        2.0
    );
    scenario.finish_deletions();
    let held = scenario.settle().await;
    assert_eq!(scenario.live_pods(), ["mf-r-0", "mf-t-2"], "held back");
    assert_requeued_within(&held, 9..=10, "the backoff's end (10 s after the failure)");
    assert_ne!(action, Action::await_change());
}

#[tokio::test]
async fn node_pods_failing_together_count_once() {
    let scenario = Scenario::running(spot_job("mf", 3, &["us-east-1a"])).await;
    let now = Timestamp::now();
    for (pod, uid) in [("mf-t-0", "u0"), ("mf-t-1", "u1"), ("mf-t-2", "u2")] {
        fail_pod(&scenario, pod, uid, "the coordinator is gone", now);
    }
    let _ = scenario.settle().await;
    assert_eq!(scenario.status().node_failures, 1, "one cause, one failure");
    assert_eq!(scenario.events_with_reason("NodePodFailed").len(), 3);
    scenario.finish_deletions();
    let held = scenario.settle().await;
    assert_requeued_within(&held, 4..=5, "the first backoff (5 s after the failures)");
}

#[tokio::test]
async fn failed_training_is_final_and_releases_nodes() {
    let scenario = Scenario::running(spot_job("mf", 1, &["us-east-1a"])).await;
    scenario.report(|status| {
        status.phase = JobPhase::Failed;
        status.error = Some("worker 3 diverged".to_owned());
    });
    scenario.settle().await;
    assert_eq!(scenario.status().phase, Some(Phase::Failed));
    let (failed, reason, message) = scenario.condition(conditions::FAILED);
    assert_eq!(
        (failed.as_str(), reason.as_str()),
        ("True", reasons::TRAINING_FAILED)
    );
    assert_eq!(message, "worker 3 diverged");
    assert!(scenario.live_pods().is_empty());
    scenario.finish_deletions();
    scenario.settle().await;
    assert_eq!(scenario.status().phase, Some(Phase::Failed), "final");
    assert!(scenario.live_pods().is_empty(), "nothing recreated");
}

#[tokio::test]
async fn a_diverged_run_fails_the_job_with_reason_diverged() {
    let scenario = Scenario::running(spot_job("mf", 1, &["us-east-1a"])).await;
    let message = "training diverged at clock 4: the mean training loss is NaN; last finite \
                   training loss 1.5e9 at clock 3";
    scenario.report(|status| {
        status.phase = JobPhase::Failed;
        status.error = Some(message.to_owned());
        status.failure_reason = Some(ebbflow_runtime_api::FailureReason::Diverged);
    });
    scenario.settle().await;
    assert_eq!(scenario.status().phase, Some(Phase::Failed));
    let (failed, reason, said) = scenario.condition(conditions::FAILED);
    assert_eq!(
        (failed.as_str(), reason.as_str()),
        ("True", reasons::DIVERGED)
    );
    assert_eq!(said, message);
    assert!(scenario.live_pods().is_empty());
    scenario.finish_deletions();
    scenario.settle().await;
    assert_eq!(scenario.status().phase, Some(Phase::Failed), "final");
    let (_, reason, _) = scenario.condition(conditions::FAILED);
    assert_eq!(reason, reasons::DIVERGED, "kept");
}

#[tokio::test]
async fn a_failed_python_hook_fails_the_job_with_reason_app_failed() {
    let scenario = Scenario::running(spot_job("mf", 1, &["us-east-1a"])).await;
    let message = "the app failed at clock 3: app broken:App: hook clock(tables, 3) of shard 1 \
                   failed: RuntimeError: boom";
    scenario.report(|status| {
        status.phase = JobPhase::Failed;
        status.error = Some(message.to_owned());
        status.failure_reason = Some(ebbflow_runtime_api::FailureReason::AppFailed);
    });
    scenario.settle().await;
    assert_eq!(scenario.status().phase, Some(Phase::Failed));
    let (failed, reason, said) = scenario.condition(conditions::FAILED);
    assert_eq!(
        (failed.as_str(), reason.as_str()),
        ("True", reasons::APP_FAILED)
    );
    assert_eq!(said, message);
    assert!(scenario.live_pods().is_empty());
}

#[tokio::test]
async fn api_errors_back_off_per_job_and_are_counted_by_category() {
    let scenario = Scenario::new(TrainingJob::test("mf").with_finalizer(FINALIZER)).await;
    scenario.cluster.lock().fail_pod_list = true;
    let error = scenario.reconcile().await.unwrap_err();
    assert_eq!(error.category(), "Kubernetes");
    assert!(error.to_string().contains("list pods"), "{error}");
    assert_eq!(
        scenario.metric(
            "ebbflow_operator_reconcile_errors_total",
            Some(("category", "Kubernetes"))
        ),
        1.0
    );
    let job = Arc::new(scenario.job());
    let next = error_policy(job, &error, scenario.ctx.clone());
    assert_eq!(
        next,
        Action::requeue(Duration::from_secs(10)),
        "second failure waits longer"
    );
}

#[tokio::test]
async fn node_events_map_back_to_jobs_with_pods_there() {
    let scenario = Scenario::running(spot_job("mf", 1, &["us-east-1a"])).await;
    let jobs = scenario.ctx.node_index.jobs_on("node-mf-t-0");
    assert_eq!(jobs.len(), 1);
    assert_eq!(jobs[0].name, "mf");
    assert!(scenario.ctx.node_index.jobs_on("node-elsewhere").is_empty());
}

/// `check_crd` against an API server serving `crd`.
async fn check_crd_serving(
    crd: k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
) -> Result<(), super::StartError> {
    let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let server = tokio::spawn(async move {
        let (_, respond) = handle.next_request().await.unwrap();
        respond.send_response(
            Response::builder()
                .status(StatusCode::OK)
                .body(Body::from(serde_json::to_vec(&crd).unwrap()))
                .unwrap(),
        );
    });
    let result = super::check_crd(&Client::new(service, "default")).await;
    server.await.unwrap();
    result
}

/// The CRD this build generates passes; one of another build (a field added since, the
/// annotation's hash differs) or one without the annotation (before it existed) is a one-line
/// error saying to apply the CRD: Helm does not upgrade it, and the API server would drop the
/// new fields silently.
#[tokio::test]
async fn a_stale_crd_is_refused_with_the_command_that_updates_it() {
    let current = ebbflow_crds::crd();
    check_crd_serving(current.clone()).await.unwrap();
    let mut other = current.clone();
    other.metadata.annotations.as_mut().unwrap().insert(
        ebbflow_crds::SCHEMA_ANNOTATION.into(),
        "0123456789abcdef".into(),
    );
    let error = check_crd_serving(other).await.unwrap_err();
    let text = error.to_string();
    assert!(
        matches!(error, super::StartError::CrdStale { .. }),
        "{text}"
    );
    assert!(
        text.contains("0123456789abcdef") && text.contains("kubectl apply --server-side"),
        "{text}"
    );
    assert!(!text.contains('\n'));
    let mut unannotated = current;
    unannotated.metadata.annotations = None;
    let error = check_crd_serving(unannotated).await.unwrap_err();
    assert!(error.to_string().contains("schema none"), "{error}");
}

#[test]
fn the_schema_hash_follows_the_schema() {
    let hash = ebbflow_crds::schema_hash();
    assert_eq!(hash.len(), 16);
    assert_eq!(hash, ebbflow_crds::schema_hash(), "stable");
    // the committed CRD YAML carries it (crds/tests/crd_yaml.rs keeps the file generated)
    let yaml = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("..")
            .join(ebbflow_crds::CRD_YAML_PATH),
    )
    .unwrap();
    assert!(yaml.contains(&hash), "the committed CRD lacks {hash}");
}

#[tokio::test]
async fn missing_crd_is_one_clear_line() {
    let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let server = tokio::spawn(async move {
        let (request, respond) = handle.next_request().await.unwrap();
        assert_eq!(
            request.uri().path(),
            "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/trainingjobs.ebbflow.dev"
        );
        let (status, body) = not_found();
        respond.send_response(
            Response::builder()
                .status(status)
                .body(Body::from(serde_json::to_vec(&body).unwrap()))
                .unwrap(),
        );
    });
    let error = super::check_crd(&Client::new(service, "default"))
        .await
        .unwrap_err();
    assert!(matches!(error, super::StartError::CrdMissing), "{error}");
    let text = error.to_string();
    assert!(!text.contains('\n'));
    assert!(text.contains("trainingjobs.ebbflow.dev"), "{text}");
    server.await.unwrap();
}
