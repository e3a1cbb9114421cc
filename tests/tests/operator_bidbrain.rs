//! The operator's bidder and EC2 provisioner on the real control plane (issue 6):
//!
//! - BidBrain decides a trace-market job's transient pools: its decisions (with their bid and
//!   expected cost per work) are in the job's status and its spot pods are scheduled by the real
//!   kube-scheduler onto kwok nodes of exactly those pools (p3.2xlarge in the trace's zones);
//! - in ec2 provisioning mode the operator launches the job's instances on a local moto server,
//!   tagged with the job, follows a scale-down, and deleting the job terminates them before its
//!   finalizer lets it go.
//!
//! - BidBrain re-estimates a job's application model from a real elastic coordinator's progress
//!   (the runtime on 127.0.0.1, one in-process node per pod the operator created) and decides
//!   with it: `status.appModel` shows ν, σ measured and in use; after a full eviction with
//!   notice (the Node Termination Handler's taint) training goes on in stage 1 and the eviction's
//!   stall (λ) is measured.
//!
//! - A job's `spec.bidding.budgetTotal`: the operator charges its pods at the trace's prices,
//!   stops the real coordinator once they have spent it, and the job fails as BudgetExhausted.
//!
//! Each test runs its own operator scoped to its own namespace. Skipped (with a line saying so)
//! unless `EBBFLOW_KUBECONFIG` names the cluster that `scripts/cluster.sh up` started; the ec2 test
//! also needs `EBBFLOW_PYTHON` (a Python with moto, `scripts/setup-python.sh`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use ebbflow_crds::{
    BidAction, BillingModel, Ec2Provisioning, MarketKind, MarketSpec, ProvisioningMode, TrainingJob,
};
use ebbflow_ec2::{Ec2Api, moto::MotoServer};
use ebbflow_job::provision::Ec2Provisioner;
use ebbflow_operator::controller::{
    self,
    bidbrain::{BidBrainConfig, BidBrainPlanner},
};
use ebbflow_operator::notices::NTH_SPOT_ITN_TAINT;
use ebbflow_runtime::elastic::{ElasticConfig, LiveFeed, StageThresholds};
use ebbflow_runtime::elastic_coordinator::{ElasticJob, run_elastic_job};
use ebbflow_runtime::elastic_node::{ElasticNodeSettings, NoticeSources, run_elastic_node};
use ebbflow_runtime::exact::{ExactApp, ExactConfig};
use ebbflow_runtime::metrics::RuntimeMetrics;
use ebbflow_runtime::worker::JobConfig;
use ebbflow_tests::cluster::{
    BoxError, FIELD_MANAGER, TestNamespace, client_or_skip, install_crd, poll_until,
    quickstart_job, set_interruption_taint,
};
use ebbflow_tests::operator::{Custom, start_custom};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};

const P3: &str = "aws_p3.2xlarge_availability_price_9az_2023-02-15_to_03-09.csv";
/// The trace's zones.
const ZONES: [&str; 9] = [
    "us-east-1a",
    "us-east-1c",
    "us-east-1d",
    "us-east-1f",
    "us-east-2a",
    "us-east-2b",
    "us-west-2a",
    "us-west-2b",
    "us-west-2c",
];
/// An AMI moto ships in every region.
const AMI: &str = "ami-03cf127a";

fn spot_data() -> PathBuf {
    std::env::var_os("EBBFLOW_SPOT_DATA").map_or_else(
        || ebbflow_tests::cluster::repo_root().join("../shared/data/spot"),
        PathBuf::from,
    )
}

async fn apply(client: &Client, job: &TrainingJob) -> Result<(), BoxError> {
    let jobs: Api<TrainingJob> = Api::namespaced(client.clone(), &job.namespace().unwrap());
    jobs.patch(
        &job.name_any(),
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(job),
    )
    .await?;
    Ok(())
}

/// Spot kwok nodes of p3.2xlarge, one per zone of the trace, removed on [`P3Nodes::delete`].
struct P3Nodes {
    api: Api<Node>,
    names: Vec<String>,
}

impl P3Nodes {
    async fn create(client: &Client, tag: &str) -> Result<Self, BoxError> {
        let api: Api<Node> = Api::all(client.clone());
        let mut names = Vec::new();
        for zone in ZONES {
            let name = format!("kwok-p3-{tag}-{zone}-{}", std::process::id());
            let node: Node = serde_json::from_value(serde_json::json!({
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": name,
                    "annotations": {
                        "kwok.x-k8s.io/node": "fake",
                        "node.alpha.kubernetes.io/ttl": "0",
                    },
                    "labels": {
                        "type": "kwok",
                        "kubernetes.io/hostname": name,
                        "kubernetes.io/os": "linux",
                        "kubernetes.io/arch": "amd64",
                        "node.kubernetes.io/instance-type": "p3.2xlarge",
                        "topology.kubernetes.io/region": &zone[..zone.len() - 1],
                        "topology.kubernetes.io/zone": zone,
                        "karpenter.sh/capacity-type": "spot",
                        "eks.amazonaws.com/capacityType": "SPOT",
                    },
                },
                "spec": {
                    "providerID": format!("kwok://{name}"),
                    "taints": [{"key": "karpenter.sh/capacity-type", "value": "spot", "effect": "NoSchedule"}],
                },
                "status": {
                    "allocatable": {"cpu": "8", "memory": "61Gi", "pods": "110"},
                    "capacity": {"cpu": "8", "memory": "61Gi", "pods": "110"},
                },
            }))?;
            api.create(&PostParams::default(), &node).await?;
            names.push(name);
        }
        let nodes = Self { api, names };
        poll_until(
            "the p3 kwok nodes to be Ready",
            Duration::from_secs(60),
            || {
                let api = nodes.api.clone();
                let names = nodes.names.clone();
                async move {
                    for name in &names {
                        let node = api.get(name).await?;
                        let ready = node
                            .status
                            .and_then(|s| s.conditions)
                            .unwrap_or_default()
                            .iter()
                            .any(|c| c.type_ == "Ready" && c.status == "True");
                        if !ready {
                            return Ok(None);
                        }
                    }
                    Ok(Some(()))
                }
            },
        )
        .await?;
        Ok(nodes)
    }

    async fn delete(self) -> Result<(), BoxError> {
        for name in &self.names {
            self.api.delete(name, &DeleteParams::default()).await?;
        }
        Ok(())
    }
}

async fn wait_deleted(jobs: &Api<TrainingJob>, name: &str) -> Result<(), BoxError> {
    poll_until(
        &format!("job {name} to be gone"),
        Duration::from_secs(60),
        || async { Ok(jobs.get_opt(name).await?.is_none().then_some(())) },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bidbrain_buys_trace_pools_and_spot_pods_land_in_them() -> Result<(), BoxError> {
    let Some(client) =
        client_or_skip("bidbrain_buys_trace_pools_and_spot_pods_land_in_them").await?
    else {
        return Ok(());
    };
    install_crd(&client).await?;
    let test_namespace = TestNamespace::create(&client, "e2e-bidbrain").await?;
    let namespace = test_namespace.name().to_owned();
    let nodes = P3Nodes::create(&client, "bb").await?;
    let planner = BidBrainPlanner::new(BidBrainConfig {
        trace_dir: spot_data(),
        ..BidBrainConfig::default()
    });
    let stop = start_custom(
        &client,
        &prometheus::Registry::new(),
        "http://127.0.0.1:9",
        Custom {
            capacity: Arc::new(planner),
            ec2: None,
            namespace: Some(namespace.clone()),
        },
    )
    .await?;

    let mut job = quickstart_job("bidbrain", &namespace)?;
    job.spec.bidding.market.trace = Some(spot_data().join(P3).display().to_string());
    job.spec.bidding.market.trace_start = Some(Time("2023-02-20T00:00:00Z".parse()?));
    job.spec.transient.min_nodes = 0;
    job.spec.transient.max_nodes = 3;
    apply(&client, &job).await?;

    // BidBrain's first decisions, in the status: acquisitions with a bid and E.
    let jobs: Api<TrainingJob> = Api::namespaced(client.clone(), &namespace);
    let decisions = poll_until(
        "BidBrain acquisitions in the status",
        Duration::from_secs(60),
        || async {
            let job = jobs.get("bidbrain").await?;
            let decisions = job.status.map(|s| s.recent_decisions).unwrap_or_default();
            Ok((!decisions.is_empty()).then_some(decisions))
        },
    )
    .await?;
    let mut bought: BTreeMap<String, u32> = BTreeMap::new();
    for decision in &decisions {
        assert_eq!(decision.action, BidAction::Acquire, "{decision:?}");
        assert_eq!(decision.reason, "BidBrain", "{decision:?}");
        let pool = decision.pool.as_ref().expect("a pool");
        assert_eq!(pool.instance_type, "p3.2xlarge");
        assert!(ZONES.contains(&pool.zone.as_str()), "{pool:?}");
        assert!(decision.max_price.is_some_and(|p| p > 0.0), "{decision:?}");
        assert!(
            decision.expected_cost_per_work.is_some_and(|e| e > 0.0),
            "{decision:?}"
        );
        *bought.entry(pool.zone.clone()).or_default() += decision.count;
    }
    let total: u32 = bought.values().sum();
    assert!((1..=3).contains(&total), "{bought:?}");

    // The real scheduler puts the spot pods on kwok nodes of exactly those pools.
    let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
    let selector = ListParams::default().labels(&format!(
        "{}=bidbrain,{}=transient",
        controller::plan::JOB_LABEL,
        controller::plan::TIER_LABEL
    ));
    let placed = poll_until(
        "the bought spot pods to be scheduled",
        Duration::from_secs(60),
        || async {
            let list = pods.list(&selector).await?.items;
            let nodes: Vec<String> = list
                .iter()
                .filter_map(|p| p.spec.as_ref().and_then(|s| s.node_name.clone()))
                .collect();
            Ok((list.len() == total as usize && nodes.len() == list.len()).then_some(nodes))
        },
    )
    .await?;
    let mut landed: BTreeMap<String, u32> = BTreeMap::new();
    for node in &placed {
        let node = nodes.api.get(node).await?;
        let labels = node.labels();
        assert_eq!(
            labels
                .get("node.kubernetes.io/instance-type")
                .map(String::as_str),
            Some("p3.2xlarge")
        );
        *landed
            .entry(labels["topology.kubernetes.io/zone"].clone())
            .or_default() += 1;
    }
    assert_eq!(landed, bought, "pods land in the pools BidBrain bought");

    jobs.delete("bidbrain", &DeleteParams::default()).await?;
    wait_deleted(&jobs, "bidbrain").await?;
    let _ = stop.send(());
    nodes.delete().await?;
    test_namespace.delete().await
}

/// Clocks the calibration test's runtime would run (it is stopped long before).
const CALIBRATION_CLOCKS: u64 = 1_000_000;

/// The integer-exact app of the calibration test: 10 ms of work per clock.
fn calibration_app() -> ExactApp {
    ExactApp::new(ExactConfig {
        rows: 64,
        width: 4,
        tables: 2,
        shared_rows: 4,
        clocks: CALIBRATION_CLOCKS,
        staleness: 0,
        clock_delay: Duration::from_millis(10),
        update_period: 1,
    })
}

fn calibration_job_config() -> JobConfig {
    JobConfig {
        clocks: CALIBRATION_CLOCKS,
        staleness: 0,
        partitions: 4,
        workers: 4,
        wait_timeout: Duration::from_secs(60),
        ..JobConfig::default()
    }
}

/// One elastic node of the calibration test's job, named after its pod, on a thread of this
/// process (real data plane and admin API on 127.0.0.1); it runs until the coordinator lets it go.
fn calibration_node(url: &str, secret: &str, name: &str, reliable: bool) {
    let settings = ElasticNodeSettings {
        job: calibration_job_config(),
        job_id: "e2e-calibration".into(),
        reliable,
        listen: "127.0.0.1:0".parse().expect("an address"),
        advertise: None,
        metrics_listen: None,
        registry: None,
        notices: NoticeSources {
            coordinator: url.to_owned(),
            secret: secret.to_owned(),
            name: name.to_owned(),
            grace: Duration::from_secs(30),
            metadata_endpoint: None,
            metadata_poll: Duration::from_secs(1),
        },
    };
    let name = name.to_owned();
    std::thread::spawn(move || {
        if let Err(error) = run_elastic_node(calibration_app(), settings) {
            eprintln!("node {name}: {error}");
        }
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bidbrain_recalibrates_from_a_real_coordinators_progress() -> Result<(), BoxError> {
    let test = "bidbrain_recalibrates_from_a_real_coordinators_progress";
    let Some(client) = client_or_skip(test).await? else {
        return Ok(());
    };
    install_crd(&client).await?;
    let test_namespace = TestNamespace::create(&client, "e2e-calibrate").await?;
    let namespace = test_namespace.name().to_owned();
    let nodes = P3Nodes::create(&client, "cal").await?;
    let name = "calibrated";

    // The runtime: a real elastic coordinator on 127.0.0.1 whose secret is the job's token (the
    // test creates the token Secret; the operator keeps an existing one).
    let secret = "e2e-calibration-token".to_owned();
    ebbflow_tests::cluster::create_job_token(&client, &namespace, name, &secret).await?;
    // The operator decides with BidBrain on the p3 trace at 60 trace seconds per second.
    let (url, coordinator) = start_coordinator(&secret, None)?;
    let stop = start_bidbrain_operator(&client, &url, &namespace).await?;
    let mut job = trace_job(name, &namespace)?;
    job.spec.transient.min_nodes = 1;
    job.spec.transient.max_nodes = 3;
    let spec_model = ebbflow_job::jobmarket::app_model(&job);
    apply(&client, &job).await?;

    // The test is the kubelet: every pod of the job the operator creates becomes a node.
    let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
    let jobs: Api<TrainingJob> = Api::namespaced(client.clone(), &namespace);
    let selector = ListParams::default().labels(&format!("{}={name}", controller::plan::JOB_LABEL));
    let mut started: BTreeSet<String> = BTreeSet::new();
    let applied = std::time::Instant::now();
    let deadline = applied + Duration::from_secs(240);
    let status = loop {
        start_nodes_for_pods(&pods, name, (&url, &secret), &mut started).await?;
        let status = jobs.get(name).await?.status.unwrap_or_default();
        let measured = status
            .app_model
            .as_ref()
            .is_some_and(|m| m.additions >= 1 && m.steady_intervals >= 1);
        if measured {
            break status;
        }
        if std::time::Instant::now() > deadline {
            return Err(format!(
                "no calibrated application model in the status after 240 s; nodes started {started:?}, status {status:?}"
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };

    // Progress came from the runtime, and the model decided with was measured from it.
    let model = status.app_model.clone().expect("measured above");
    assert!(status.iteration.is_some_and(|i| i > 0), "{status:?}");
    assert!(status.stage.is_some(), "{status:?}");
    assert!(model.in_use, "{model:?}");
    assert!(
        model.nu > 0.0 && (model.nu - spec_model.nu_per_vcpu_second).abs() > 1e-6,
        "ν measured in clocks per vCPU per trace second, not the spec's: {model:?}"
    );
    assert!(
        model.sigma_seconds > 0.0 && model.sigma_seconds < spec_model.sigma_seconds,
        "σ moved from the spec's {} s towards the seconds a node took to join: {model:?}",
        spec_model.sigma_seconds
    );
    eprintln!(
        "{test}: after {:.1} s: iteration {:?}, stage {:?}, app model {model:?}",
        applied.elapsed().as_secs_f64(),
        status.iteration,
        status.stage
    );

    // A full eviction with notice: the Node Termination Handler's taint on every node the job's
    // started transient pods run on. The coordinator moves every partition back to the reliable
    // tier (stage 1) and training goes on there. No node starts from here on, so no join ends
    // that stage-1 segment: the job's iteration moves only through the BackupPS copies taken
    // within it (before 3a28ad5 none were, the iteration stood still, and BidBrain never saw
    // the eviction's stall end; then the segment armed every copy clock to the job's end, and
    // its workers started 31 s late). BidBrain times the stall (λ) from the notice until the
    // consistent clock passes where it was.
    let node_api: Api<Node> = Api::all(client.clone());
    let mut tainted = BTreeSet::new();
    for pod in pods.list(&selector).await?.items {
        let transient = pod
            .labels()
            .get(controller::plan::TIER_LABEL)
            .is_some_and(|tier| tier == "transient");
        let node = pod.spec.as_ref().and_then(|spec| spec.node_name.clone());
        if transient
            && pod.metadata.deletion_timestamp.is_none()
            && started.contains(&pod.name_any())
        {
            tainted.extend(node);
        }
    }
    assert!(!tainted.is_empty(), "no started transient pod to evict");
    for node in &tainted {
        set_interruption_taint(&node_api, node, Some(NTH_SPOT_ITN_TAINT)).await?;
    }
    let tainted_at = std::time::Instant::now();
    let stalls_before = model.evictions;
    let first_in_stage_one: std::cell::Cell<Option<u64>> = std::cell::Cell::new(None);
    let (after, resumed_from) = poll_until(
        "the eviction's stall to end while training goes on in stage 1",
        Duration::from_secs(150),
        || {
            let jobs = jobs.clone();
            let first_in_stage_one = &first_in_stage_one;
            async move {
                let status = jobs.get(name).await?.status.unwrap_or_default();
                if status.stage != Some(1) {
                    return Ok(None);
                }
                // The first stage-1 status is the reference; a later one must be past it (the
                // iteration moved in stage 1) with the eviction's stall measured.
                let Some(first) = first_in_stage_one.get() else {
                    first_in_stage_one.set(Some(status.iteration.unwrap_or(0)));
                    return Ok(None);
                };
                let stalls = status.app_model.as_ref().map_or(0, |m| m.evictions);
                let moved = status.iteration.is_some_and(|i| i > first);
                Ok((stalls > stalls_before && moved).then_some((status, first)))
            }
        },
    )
    .await?;
    let evicted_model = after.app_model.clone().expect("measured above");
    assert!(
        evicted_model.lambda_seconds.is_finite() && evicted_model.lambda_seconds > 0.0,
        "{evicted_model:?}"
    );
    eprintln!(
        "{test}: {} node(s) tainted; {:.1} s later: iteration {:?} (stage 1 from {resumed_from}), \
         app model {evicted_model:?}",
        tainted.len(),
        tainted_at.elapsed().as_secs_f64(),
        after.iteration
    );

    // Deleting the job stops the runtime (the operator posts /stop with the token).
    jobs.delete(name, &DeleteParams::default()).await?;
    wait_deleted(&jobs, name).await?;
    let report = tokio::task::spawn_blocking(move || coordinator.join())
        .await?
        .map_err(|_| "the coordinator thread panicked")??;
    assert!(report.stopped_at.is_some(), "stopped by the operator");
    let _ = stop.send(());
    nodes.delete().await?;
    test_namespace.delete().await
}

/// A real elastic coordinator of the calibration app on 127.0.0.1 (a thread) whose secret is
/// `secret`; `linger` as in [`ElasticJob::linger`]. Returns its URL and the thread.
#[allow(clippy::type_complexity)]
fn start_coordinator(
    secret: &str,
    linger: Option<tokio::sync::watch::Receiver<bool>>,
) -> Result<
    (
        String,
        std::thread::JoinHandle<
            Result<
                ebbflow_runtime::elastic::ElasticReport,
                ebbflow_runtime::elastic_coordinator::ElasticJobError,
            >,
        >,
    ),
    BoxError,
> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let url = format!("https://{}", listener.local_addr()?);
    let registry = prometheus::Registry::new();
    let metrics = RuntimeMetrics::register(&registry)?;
    let settings = ElasticJob {
        config: ElasticConfig {
            job: calibration_job_config(),
            thresholds: StageThresholds::default(),
            backup_every: 10,
            backup_interval: None,
            backup_bandwidth: None,
            start: None,
            checkpoint: None,
            reliable: Vec::new(),
            transient: Vec::new(),
        },
        secret: secret.to_owned(),
        job: "e2e-calibration".into(),
        reliable_nodes: 1,
        join_timeout: Duration::from_secs(120),
        background_copies: true,
        linger,
        stop: None,
        checkpoint: None,
    };
    let coordinator = std::thread::spawn(move || {
        run_elastic_job(
            &calibration_app(),
            settings,
            listener,
            registry,
            &metrics,
            LiveFeed::new(),
        )
    });
    Ok((url, coordinator))
}

/// An operator scoped to `namespace` deciding with BidBrain on trace markets at 60 trace seconds
/// per second, its jobs' coordinator at `url`.
async fn start_bidbrain_operator(
    client: &Client,
    url: &str,
    namespace: &str,
) -> Result<tokio::sync::oneshot::Sender<()>, BoxError> {
    let planner = BidBrainPlanner::new(BidBrainConfig {
        trace_dir: spot_data(),
        trace_speed: 60.0,
        ..BidBrainConfig::default()
    });
    start_custom(
        client,
        &prometheus::Registry::new(),
        url,
        Custom {
            capacity: Arc::new(planner),
            ec2: None,
            namespace: Some(namespace.to_owned()),
        },
    )
    .await
}

/// The quickstart job on the p3 trace from 2023-02-20, deciding every 10 s, with more clocks
/// than the tests run.
fn trace_job(name: &str, namespace: &str) -> Result<TrainingJob, BoxError> {
    let mut job = quickstart_job(name, namespace)?;
    job.spec.bidding.market.trace = Some(spot_data().join(P3).display().to_string());
    job.spec.bidding.market.trace_start = Some(Time("2023-02-20T00:00:00Z".parse()?));
    job.spec.bidding.decision_interval = ebbflow_crds::DurationString::new("10s")?;
    job.spec.stop.iterations = Some(CALIBRATION_CLOCKS);
    Ok(job)
}

/// Starts an elastic node (a thread of this process) for every runtime pod of job `name` the
/// operator created that has none yet: the test is the kubelet.
async fn start_nodes_for_pods(
    pods: &Api<Pod>,
    name: &str,
    (url, secret): (&str, &str),
    started: &mut BTreeSet<String>,
) -> Result<(), BoxError> {
    let selector = ListParams::default().labels(&format!("{}={name}", controller::plan::JOB_LABEL));
    for pod in pods.list(&selector).await?.items {
        let tier = pod
            .labels()
            .get(controller::plan::TIER_LABEL)
            .cloned()
            .unwrap_or_default();
        let pod_name = pod.name_any();
        if pod.metadata.deletion_timestamp.is_none()
            && (tier == "reliable" || tier == "transient")
            && started.insert(pod_name.clone())
        {
            calibration_node(url, secret, &pod_name, tier == "reliable");
        }
    }
    Ok(())
}

/// `spec.bidding.budgetTotal` in the cluster: the operator charges the job's pods at the p3
/// trace's prices (60 trace seconds per second), and once they have spent the budget it stops a
/// real elastic coordinator (POST /stop), which ends the run with its final evaluation and keeps
/// serving that outcome (as `ebbflow pod` does) until the operator has seen it; the job fails
/// with reason BudgetExhausted and its pods are released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spent_budget_stops_a_real_coordinator_and_releases_the_job() -> Result<(), BoxError> {
    let test = "a_spent_budget_stops_a_real_coordinator_and_releases_the_job";
    let Some(client) = client_or_skip(test).await? else {
        return Ok(());
    };
    install_crd(&client).await?;
    let test_namespace = TestNamespace::create(&client, "e2e-budget").await?;
    let namespace = test_namespace.name().to_owned();
    let nodes = P3Nodes::create(&client, "bud").await?;
    let name = "budgeted";
    let budget = 1.5;

    let secret = "e2e-budget-token".to_owned();
    ebbflow_tests::cluster::create_job_token(&client, &namespace, name, &secret).await?;
    let (release, linger) = tokio::sync::watch::channel(false);
    let (url, coordinator) = start_coordinator(&secret, Some(linger))?;
    let stop = start_bidbrain_operator(&client, &url, &namespace).await?;
    let mut job = trace_job(name, &namespace)?;
    job.spec.bidding.budget_total = Some(budget);
    job.spec.transient.min_nodes = 1;
    job.spec.transient.max_nodes = 2;
    apply(&client, &job).await?;

    let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
    let jobs: Api<TrainingJob> = Api::namespaced(client.clone(), &namespace);
    let mut started = BTreeSet::new();
    let applied = std::time::Instant::now();
    let deadline = applied + Duration::from_secs(240);
    let mut charged = Vec::new();
    let status = loop {
        start_nodes_for_pods(&pods, name, (&url, &secret), &mut started).await?;
        let status = jobs.get(name).await?.status.unwrap_or_default();
        if let Some(cost) = &status.cost {
            if charged.last() != Some(&cost.spent) {
                charged.push(cost.spent);
            }
        }
        if status.phase == Some(ebbflow_crds::Phase::Failed) {
            break status;
        }
        if std::time::Instant::now() > deadline {
            return Err(format!(
                "the job did not end on its budget within 240 s; nodes started {started:?}, status {status:?}"
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let elapsed = applied.elapsed();
    let failed = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Failed")
        .cloned()
        .expect("a Failed condition");
    assert_eq!(
        (failed.status.as_str(), failed.reason.as_str()),
        ("True", "BudgetExhausted"),
        "{status:?}"
    );
    assert_eq!(status.stop_reason.as_deref(), Some("budgetTotal"));
    let cost = status.cost.clone().expect("the job was charged");
    assert!(cost.spent >= budget, "{cost:?}");
    // What runs on after the budget is crossed: the seconds until the coordinator has stopped,
    // at 60 trace seconds per second (about $0.08 a second here).
    assert!(
        cost.spent < budget * 2.0,
        "stopped soon after the budget was spent: {cost:?} (charges seen {charged:?})"
    );
    assert!(
        cost.on_demand_equivalent > cost.spent,
        "spot pods ran below the on-demand price: {cost:?}"
    );
    assert!(
        charged.windows(2).all(|w| w[0] <= w[1]) && charged.len() >= 3,
        "charges rose as the pods ran: {charged:?}"
    );
    assert!(
        status.iteration.is_some_and(|i| i > 0),
        "the runtime trained: {status:?}"
    );
    eprintln!(
        "{test}: failed after {:.1} s (trace speed 60): stop requested {:?}, spent ${:.3} of ${budget}, on-demand equivalent ${:.3}, iteration {:?}, charges seen {charged:?}",
        elapsed.as_secs_f64(),
        status.stop_requested_time,
        cost.spent,
        cost.on_demand_equivalent,
        status.iteration,
    );

    // The operator saw the coordinator's outcome: it may stop serving it now.
    let _ = release.send(true);
    let report = tokio::task::spawn_blocking(move || coordinator.join())
        .await?
        .map_err(|_| "the coordinator thread panicked")??;
    assert!(report.stopped_at.is_some(), "stopped by the operator");
    let selector = ListParams::default().labels(&format!("{}={name}", controller::plan::JOB_LABEL));
    poll_until(
        "the job's pods to be released",
        Duration::from_secs(60),
        || {
            let pods = pods.clone();
            let selector = selector.clone();
            async move {
                let live = pods
                    .list(&selector)
                    .await?
                    .items
                    .into_iter()
                    .filter(|p| p.metadata.deletion_timestamp.is_none())
                    .count();
                Ok((live == 0).then_some(()))
            }
        },
    )
    .await?;
    jobs.delete(name, &DeleteParams::default()).await?;
    wait_deleted(&jobs, name).await?;
    let _ = stop.send(());
    nodes.delete().await?;
    test_namespace.delete().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ec2_mode_launches_tagged_instances_and_deletion_terminates_them() -> Result<(), BoxError> {
    let test = "ec2_mode_launches_tagged_instances_and_deletion_terminates_them";
    let Some(client) = client_or_skip(test).await? else {
        return Ok(());
    };
    let Some(python) = std::env::var_os("EBBFLOW_PYTHON") else {
        eprintln!("skipped {test}: set EBBFLOW_PYTHON (scripts/setup-python.sh)");
        return Ok(());
    };
    install_crd(&client).await?;
    let moto = MotoServer::start(Path::new(&python), &spot_data().join(P3))?;
    let api: Arc<dyn Ec2Api> = Arc::new(moto.client("us-east-1").await);
    let test_namespace = TestNamespace::create(&client, "e2e-ec2").await?;
    let namespace = test_namespace.name().to_owned();
    let stop = start_custom(
        &client,
        &prometheus::Registry::new(),
        "http://127.0.0.1:9",
        Custom {
            capacity: Arc::new(BidBrainPlanner::new(BidBrainConfig::default())),
            ec2: Some(Ec2Provisioner::new(api.clone())),
            namespace: Some(namespace.clone()),
        },
    )
    .await?;

    let mut job = quickstart_job("ec2", &namespace)?;
    job.spec.bidding.market = MarketSpec {
        kind: MarketKind::Ec2,
        trace: None,
        trace_start: None,
        region: Some("us-east-1".into()),
        on_demand_price: None,
    };
    job.spec.bidding.billing_model = BillingModel::Aws;
    job.spec.provisioning.mode = ProvisioningMode::Ec2;
    job.spec.provisioning.ec2 = Some(Ec2Provisioning {
        image_id: Some(AMI.into()),
        tags: BTreeMap::from([("team".into(), "ml".into())]),
        ..Ec2Provisioning::default()
    });
    job.spec.reliable.instance_types = vec!["m5.large".into()];
    job.spec.transient.instance_types = vec!["p3.2xlarge".into()];
    job.spec.transient.zones = vec!["us-east-1a".into()];
    job.spec.transient.min_nodes = 2;
    job.spec.transient.max_nodes = 2;
    apply(&client, &job).await?;
    let jobs: Api<TrainingJob> = Api::namespaced(client.clone(), &namespace);
    let uid = jobs.get("ec2").await?.uid().expect("a UID");

    let live = |count: usize| {
        let api = api.clone();
        let uid = uid.clone();
        move || {
            let api = api.clone();
            let uid = uid.clone();
            async move {
                let instances = api.job_instances(&uid, false).await?;
                Ok((instances.len() == count).then_some(instances))
            }
        }
    };
    let instances = poll_until(
        "1 on-demand + 2 spot instances on moto",
        Duration::from_secs(60),
        live(3),
    )
    .await?;
    let pools: BTreeSet<String> = instances
        .iter()
        .map(|i| i.job_tags().expect("ebbflow tags").pool)
        .collect();
    assert_eq!(
        pools,
        BTreeSet::from([
            "m5.large/us-east-1a/on-demand".to_owned(),
            "p3.2xlarge/us-east-1a/spot".to_owned()
        ])
    );
    assert!(instances.iter().all(|i| i.tags["team"] == "ml"));

    // Scale down: one spot instance goes.
    job.spec.transient.min_nodes = 1;
    job.spec.transient.max_nodes = 1;
    apply(&client, &job).await?;
    poll_until(
        "2 instances after scaling down",
        Duration::from_secs(60),
        live(2),
    )
    .await?;

    // Edited out of ec2 mode: the job's instances are released; back in it, launched again.
    let mut cluster_mode = job.clone();
    cluster_mode.spec.provisioning.mode = ProvisioningMode::Cluster;
    cluster_mode.spec.provisioning.ec2 = None;
    apply(&client, &cluster_mode).await?;
    poll_until(
        "no instances once the job left ec2 mode",
        Duration::from_secs(60),
        live(0),
    )
    .await?;
    apply(&client, &job).await?;
    poll_until(
        "2 instances back in ec2 mode",
        Duration::from_secs(60),
        live(2),
    )
    .await?;

    // Deleting the job terminates everything it launched before the finalizer lets go, in
    // whatever mode its spec is by then.
    apply(&client, &cluster_mode).await?;
    jobs.delete("ec2", &DeleteParams::default()).await?;
    wait_deleted(&jobs, "ec2").await?;
    assert!(api.job_instances(&uid, false).await?.is_empty());
    assert_eq!(api.job_instances(&uid, true).await?.len(), 5);
    let _ = stop.send(());
    test_namespace.delete().await
}
