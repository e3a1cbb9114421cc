//! The chart and TrainingJobs on real kubelets (issue 35): real containerd, real images, the
//! kubelet's own SIGTERM and grace periods, Services through kube-proxy and CoreDNS, a volume
//! mounted by the kubelet. `scripts/e2e-real.sh` starts a control plane with four real nodes
//! (scripts/real-nodes.sh: real-od-0 on-demand; real-spot-0 and real-spot-1 spot, tainted;
//! real-spot-broken, spot, never Ready) and
//! imports the release images; this suite then runs the scenarios (numbered as there,
//! bad input last) in this order:
//!
//! 1. `helm install`s the chart with those images: the operator runs as a pod under the chart's
//!    ServiceAccount, becomes Ready and takes the Lease;
//! 2. applies the quickstart TrainingJob (its trace from a volume): the coordinator and reliable
//!    pods land on the on-demand node, transient pods on spot nodes, and the job ends
//!    `Succeeded` with its loss and cost, the runtime pods' logs readable;
//! 3. interrupts a spot node the Node Termination Handler's way (its taint, then a drain through
//!    the Eviction API): the kubelet delivers SIGTERM, the pods hand their work over and exit
//!    well before the grace period ends, and the job still succeeds with no failure or rollback;
//! 6. meanwhile a real Prometheus scrapes the operator (its Service's endpoints) and the runtime
//!    pods, found from the API server: every dashboard query returns data;
//! 5. deletes the coordinator pod of a job with `spec.runtime.checkpoint` on a hostPath volume:
//!    the replacement resumes from the checkpoint, not from clock 0, and the job succeeds;
//! 4. makes a spot node vanish (kubelet and containerd SIGKILLed, pods frozen, then its Node
//!    deleted as the cloud does): heartbeats time out, the job rolls back, the operator creates
//!    replacement pods, and the job succeeds on the nodes left;
//! 8. runs bad input: an image that does not exist, a runtime failing at start, a runtime
//!    OOM-killed, one refusing a dataset its memory limit cannot hold, a spot pool whose node never becomes Ready (real-spot-broken, no CNI): each
//!    job's condition and events name the cause, nothing is recreated in a loop;
//! 9. runs a Python app (the SDK's integer-exact app) in the Python runtime image, its spot
//!    pods evicted mid-run: the job ends exact;
//! 7. `helm uninstall`s and deletes the jobs: no pod, Service, Secret or Lease is left.
//!
//! Skipped (with a line saying so) unless `EBBFLOW_REAL_KUBECONFIG` is set.

use std::io::Write as _;
use std::time::Duration;

use ebbflow_crds::{Phase, TrainingJob};
use ebbflow_operator::controller::plan::{COORDINATOR_LABEL, JOB_LABEL, TIER_LABEL, pod_ready};
use ebbflow_operator::notices::NTH_SPOT_ITN_TAINT;
use ebbflow_tests::cluster::{BoxError, FIELD_MANAGER, poll_until, repo_root};
use ebbflow_tests::prometheus::{PROMETHEUS_ENV, Prometheus};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{
    Event, Namespace, Node, PersistentVolume, PersistentVolumeClaim, Pod, Secret, Service,
};
use k8s_openapi::api::policy::v1::Eviction;
use kube::api::{DeleteParams, ListParams, LogParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config, ResourceExt as _};

const NAMESPACE: &str = "ebbflow-system";
const RELEASE: &str = "ebbflow";
const ON_DEMAND_NODE: &str = "real-od-0";
const SPOT_NODES: [&str; 2] = ["real-spot-0", "real-spot-1"];
/// The spot node that never becomes Ready (no CNI configuration), and its pool's zone.
const BROKEN_NODE: &str = "real-spot-broken";
const BROKEN_ZONE: &str = "us-west-2c";
/// The job whose spot pool is that node's.
const NOT_READY_JOB: &str = "real-not-ready";
/// The operator's wait before it names a pod that cannot be scheduled (the chart's default is
/// 300 s, for a node autoscaler).
const UNSCHEDULABLE_AFTER_SECONDS: u32 = 20;

/// What scripts/e2e-real.sh hands the suite.
struct Real {
    client: Client,
    kubeconfig: String,
    tag: String,
    /// The Prometheus binary (`EBBFLOW_PROMETHEUS`).
    prometheus: std::ffi::OsString,
    /// scripts/real-nodes.sh and the cluster's name, to kill a node.
    nodes_script: String,
    cluster: String,
}

impl Real {
    async fn from_env(test: &str) -> Result<Option<Self>, BoxError> {
        let Some(kubeconfig) = std::env::var("EBBFLOW_REAL_KUBECONFIG")
            .ok()
            .filter(|p| !p.is_empty())
        else {
            let _ = writeln!(
                std::io::stderr(),
                "skipped {test}: EBBFLOW_REAL_KUBECONFIG is unset (scripts/e2e-real.sh starts real nodes and sets it)"
            );
            return Ok(None);
        };
        let config = Config::from_custom_kubeconfig(
            Kubeconfig::read_from(&kubeconfig)?,
            &KubeConfigOptions::default(),
        )
        .await?;
        Ok(Some(Self {
            client: Client::try_from(config)?,
            kubeconfig,
            tag: std::env::var("EBBFLOW_REAL_IMAGE_TAG")?,
            prometheus: std::env::var_os(PROMETHEUS_ENV)
                .filter(|v| !v.is_empty())
                .ok_or("EBBFLOW_PROMETHEUS is unset (scripts/e2e-real.sh sets it)")?,
            nodes_script: std::env::var("EBBFLOW_REAL_NODES_SCRIPT")?,
            cluster: std::env::var("EBBFLOW_REAL_CLUSTER")?,
        }))
    }

    fn helm(&self, args: &[&str]) -> Result<String, BoxError> {
        ebbflow_tests::cluster::helm(&self.kubeconfig, args)
    }
}

fn say(line: &str) {
    let _ = writeln!(std::io::stderr(), "real_pods: {line}");
}

fn trace_dir() -> String {
    std::env::var("EBBFLOW_SPOT_DATA").unwrap_or_else(|_| {
        repo_root()
            .join("../shared/data/spot")
            .to_string_lossy()
            .into_owned()
    })
}

/// A hostPath PersistentVolume bound to claim `claim` of the release namespace: a directory of
/// this host (every real node is this host) that the kubelet mounts into the pod.
async fn host_volume(
    client: &Client,
    claim: &str,
    path: &std::path::Path,
    mode: &str,
) -> Result<(), BoxError> {
    let apply = PatchParams::apply(FIELD_MANAGER).force();
    let volume_name = format!("ebbflow-real-{claim}");
    let volume: PersistentVolume = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": volume_name},
        "spec": {
            "capacity": {"storage": "1Gi"}, "accessModes": [mode],
            "persistentVolumeReclaimPolicy": "Retain", "storageClassName": "",
            "hostPath": {"path": path, "type": "Directory"},
        },
    }))?;
    Api::<PersistentVolume>::all(client.clone())
        .patch(&volume_name, &apply, &Patch::Apply(&volume))
        .await?;
    let claim_object: PersistentVolumeClaim = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": claim, "namespace": NAMESPACE},
        "spec": {
            "accessModes": [mode], "storageClassName": "",
            "volumeName": volume_name, "resources": {"requests": {"storage": "1Gi"}},
        },
    }))?;
    Api::<PersistentVolumeClaim>::namespaced(client.clone(), NAMESPACE)
        .patch(claim, &apply, &Patch::Apply(&claim_object))
        .await?;
    Ok(())
}

/// The spot traces as claim `traces` in the release namespace, for the chart's
/// `traces.claimName`: a volume the kubelet mounts into the operator's pod.
async fn traces_volume(client: &Client) -> Result<(), BoxError> {
    let path = std::fs::canonicalize(trace_dir())?;
    host_volume(client, "traces", &path, "ReadOnlyMany").await
}

/// Step 1: the chart with the real images; returns the operator pod's name.
async fn install_chart(real: &Real) -> Result<String, BoxError> {
    let client = &real.client;
    let namespace: Namespace = serde_json::from_value(
        serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}),
    )?;
    Api::<Namespace>::all(client.clone())
        .patch(
            NAMESPACE,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&namespace),
        )
        .await?;
    traces_volume(client).await?;
    let chart = repo_root().join("charts/ebbflow");
    real.helm(&[
        "install",
        RELEASE,
        &chart.to_string_lossy(),
        "--namespace",
        NAMESPACE,
        "--set",
        "image.repository=localhost/ebbflow/operator",
        "--set",
        &format!("image.tag={}", real.tag),
        "--set",
        "runtimeImage.repository=localhost/ebbflow/runtime",
        "--set",
        &format!("runtimeImage.tag={}", real.tag),
        "--set",
        "traces.claimName=traces",
        "--set",
        "traces.speed=360",
        "--set",
        &format!("unschedulableAfterSeconds={UNSCHEDULABLE_AFTER_SECONDS}"),
    ])?;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), NAMESPACE);
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let operator = poll_until(
        "the operator pod to be Ready on a real node",
        Duration::from_secs(120),
        || {
            let pods = pods.clone();
            async move {
                let list = pods
                    .list(&ListParams::default().labels("app.kubernetes.io/name=ebbflow"))
                    .await?;
                Ok(list
                    .items
                    .into_iter()
                    .find(|p| pod_ready(p) && p.metadata.deletion_timestamp.is_none()))
            }
        },
    )
    .await
    .map_err(|e| format!("{e}; {}", pod_report(client, NAMESPACE)))?;
    let node = node_of(&operator);
    assert_eq!(
        node, ON_DEMAND_NODE,
        "the operator lands on the untainted node"
    );
    poll_until(
        "the operator Deployment to be available",
        Duration::from_secs(30),
        || {
            let deployments = deployments.clone();
            async move {
                let deployment = deployments.get(RELEASE).await?;
                let available = deployment
                    .status
                    .and_then(|s| s.available_replicas)
                    .unwrap_or(0);
                Ok((available >= 1).then_some(()))
            }
        },
    )
    .await?;
    let operator_name = operator.name_any();
    let leases: Api<Lease> = Api::namespaced(client.clone(), NAMESPACE);
    poll_until(
        "the operator pod to hold the Lease",
        Duration::from_secs(60),
        || {
            let leases = leases.clone();
            let operator_name = operator_name.clone();
            async move {
                let held = leases
                    .list(&ListParams::default())
                    .await?
                    .items
                    .into_iter()
                    .any(|l| {
                        l.spec.and_then(|s| s.holder_identity).as_deref() == Some(&operator_name)
                    });
                Ok(held.then_some(()))
            }
        },
    )
    .await?;
    say(&format!(
        "1. chart installed: operator pod {operator_name} Ready on {node}, holding the Lease"
    ));
    Ok(operator_name)
}

/// Step 6's Prometheus (Debian's). Debian builds it without Kubernetes service discovery (its
/// config refuses `kubernetes_sd_configs`), so [`discover_targets`] does that part: it reads
/// from the API server what prometheus-operator would from the chart's two monitors, and hands
/// it to Prometheus through `file_sd_configs`. Prometheus scrapes the operator through its
/// metrics Service's endpoints and every runtime pod on its admin port.
fn start_prometheus(real: &Real) -> Result<(Prometheus, std::path::PathBuf), BoxError> {
    let dir = std::env::temp_dir().join(format!("ebbflow-real-prometheus-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let targets = |name: &str| dir.join(format!("{name}.json")).display().to_string();
    let config = format!(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  \
         - job_name: ebbflow-operator\n    honor_labels: true\n    file_sd_configs:\n      - files: ['{}']\n  \
         - job_name: ebbflow-runtime\n    file_sd_configs:\n      - files: ['{}']\n",
        targets("operator"),
        targets("runtime")
    );
    let prometheus = Prometheus::start(&real.prometheus, &dir, &config)?;
    Ok((prometheus, dir))
}

/// Keeps Prometheus's target files in `dir` up to date, every second until the test ends: the
/// operator's metrics endpoints from the EndpointSlices of the chart's metrics Service (what
/// its ServiceMonitor selects, `honorLabels` in the scrape config), and each runtime pod's admin
/// port labelled with its namespace, pod and job (its PodMonitor's relabelling).
async fn discover_targets(client: Client, dir: std::path::PathBuf) {
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    let write = |name: &str, groups: &serde_json::Value| -> std::io::Result<()> {
        let temporary = dir.join(format!(".{name}.json"));
        std::fs::write(&temporary, groups.to_string())?;
        std::fs::rename(&temporary, dir.join(format!("{name}.json")))
    };
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), NAMESPACE);
    let pods: Api<Pod> = Api::all(client);
    loop {
        if let Ok(list) = slices
            .list(&ListParams::default().labels("app.kubernetes.io/name=ebbflow"))
            .await
        {
            let mut operator = Vec::new();
            for slice in &list.items {
                let port = slice
                    .ports
                    .iter()
                    .flatten()
                    .find(|p| p.name.as_deref() == Some("metrics"))
                    .and_then(|p| p.port);
                let Some(port) = port else { continue };
                for endpoint in &slice.endpoints {
                    let ready = endpoint
                        .conditions
                        .as_ref()
                        .and_then(|c| c.ready)
                        .unwrap_or(true);
                    if ready {
                        operator.extend(
                            endpoint
                                .addresses
                                .iter()
                                .map(|address| format!("{address}:{port}")),
                        );
                    }
                }
            }
            let _ = write(
                "operator",
                &serde_json::json!([{"targets": operator, "labels": {"namespace": NAMESPACE}}]),
            );
        }
        let selector =
            "app.kubernetes.io/managed-by=ebbflow-operator,app.kubernetes.io/name=ebbflow-runtime";
        if let Ok(list) = pods.list(&ListParams::default().labels(selector)).await {
            let groups: Vec<serde_json::Value> = list
                .items
                .iter()
                .filter_map(|pod| {
                    let ip = pod.status.as_ref()?.pod_ip.clone()?;
                    let port = pod
                        .spec
                        .as_ref()?
                        .containers
                        .iter()
                        .flat_map(|c| c.ports.iter().flatten())
                        .find(|p| p.name.as_deref() == Some("metrics"))?
                        .container_port;
                    Some(serde_json::json!({
                        "targets": [format!("{ip}:{port}")],
                        "labels": {
                            "namespace": pod.namespace().unwrap_or_default(),
                            "pod": pod.name_any(),
                            "trainingjob": pod.labels().get(JOB_LABEL).cloned().unwrap_or_default(),
                        },
                    }))
                })
                .collect();
            let _ = write("runtime", &serde_json::Value::Array(groups));
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// One line per pod of `namespace`: name, node, phase and the reason of any waiting container,
/// for failure messages.
fn pod_report(client: &Client, namespace: &str) -> String {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let handle = tokio::runtime::Handle::current();
    let list = tokio::task::block_in_place(|| handle.block_on(pods.list(&ListParams::default())));
    match list {
        Ok(list) => list
            .items
            .iter()
            .map(|p| {
                let status = p.status.clone().unwrap_or_default();
                let waiting: Vec<String> = status
                    .container_statuses
                    .unwrap_or_default()
                    .into_iter()
                    .filter_map(|c| c.state.and_then(|s| s.waiting))
                    .map(|w| {
                        format!(
                            "{}: {}",
                            w.reason.unwrap_or_default(),
                            w.message.unwrap_or_default()
                        )
                    })
                    .collect();
                format!(
                    "{} on {} {} {}",
                    p.name_any(),
                    node_of(p),
                    status.phase.unwrap_or_default(),
                    waiting.join("; ")
                )
            })
            .collect::<Vec<_>>()
            .join(" | "),
        Err(e) => format!("(could not list pods: {e})"),
    }
}

/// The quickstart job as `name` in the release namespace, its trace read from the traces volume,
/// its spot pools those of the real spot nodes.
fn job(name: &str) -> Result<TrainingJob, BoxError> {
    let mut job = ebbflow_tests::cluster::quickstart_job(name, NAMESPACE)?;
    let trace = job
        .spec
        .bidding
        .market
        .trace
        .as_deref()
        .and_then(|t| t.rsplit('/').next())
        .ok_or("the quickstart names no trace")?
        .to_owned();
    job.spec.bidding.market.trace = Some(trace);
    // The trace's pools that the real spot nodes are (scripts/real-nodes.sh), as Karpenter
    // would have provisioned them.
    job.spec.transient.zones = vec!["us-west-2a".into(), "us-west-2b".into()];
    Ok(job)
}

/// Kind SelfTest as `name`, on the quickstart's market and pools: `clocks` clocks of 10 ms, its
/// final table known exactly, its loss the count of wrong values (0 when exact). Stopped by
/// its clocks alone (the table is checked against all of them).
fn self_test_job(name: &str, clocks: u64) -> Result<TrainingJob, BoxError> {
    let mut value = serde_json::to_value(job(name)?)?;
    merge(
        &mut value,
        serde_json::json!({"spec": {
            "app": {"kind": "SelfTest", "hyperparameters": null},
            "stop": {"iterations": clocks, "wallClockLimit": null},
            "runtime": {"resources": {"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}}},
        }}),
    );
    // its own dataset, not merged into the quickstart's (whose sizes are MF's)
    value["spec"]["app"]["dataset"] = serde_json::json!({"synthetic": {"seed": 1}});
    Ok(serde_json::from_value(value)?)
}

/// The self-test job `name` ended exact: Succeeded with loss 0 (no wrong value in its table).
fn assert_exact(job: &TrainingJob) {
    let status = job.status.clone().unwrap_or_default();
    assert_eq!(
        status.loss,
        Some(0.0),
        "self-test {} counts wrong values in its final table: {status:?}",
        job.name_any()
    );
}

async fn apply_job(client: &Client, job: &TrainingJob) -> Result<(), BoxError> {
    let jobs: Api<TrainingJob> = Api::namespaced(client.clone(), NAMESPACE);
    jobs.patch(
        &job.name_any(),
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(job),
    )
    .await?;
    Ok(())
}

fn node_of(pod: &Pod) -> String {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .unwrap_or_default()
}

/// Waits for job `name` to end, `Succeeded` or `Failed`.
async fn wait_ended(
    client: &Client,
    name: &str,
    timeout: Duration,
) -> Result<TrainingJob, BoxError> {
    let jobs: Api<TrainingJob> = Api::namespaced(client.clone(), NAMESPACE);
    poll_until(&format!("job {name} to finish"), timeout, || {
        let jobs = jobs.clone();
        async move {
            let job = jobs.get(name).await?;
            let phase = job.status.as_ref().and_then(|s| s.phase);
            Ok(matches!(phase, Some(Phase::Succeeded | Phase::Failed)).then_some(job))
        }
    })
    .await
    .map_err(|e| format!("{e}; pods: {}", pod_report(client, NAMESPACE)).into())
}

/// The ended `job` if it `Succeeded`; else an error with its phase and conditions.
fn succeeded(job: TrainingJob) -> Result<TrainingJob, BoxError> {
    let status = job.status.clone().unwrap_or_default();
    if status.phase != Some(Phase::Succeeded) {
        let conditions: Vec<String> = status
            .conditions
            .iter()
            .map(|c| format!("{} {} {}: {}", c.type_, c.status, c.reason, c.message))
            .collect();
        return Err(format!(
            "job {} ended {:?}: {}",
            job.name_any(),
            status.phase,
            conditions.join("; ")
        )
        .into());
    }
    Ok(job)
}

/// Waits for job `name` to finish; fails on `Failed` with its message.
async fn wait_finished(
    client: &Client,
    name: &str,
    timeout: Duration,
) -> Result<TrainingJob, BoxError> {
    succeeded(wait_ended(client, name, timeout).await?)
}

/// Step 2: the quickstart job to `Succeeded` on real pods, placed by tier.
async fn run_job(client: &Client) -> Result<(), BoxError> {
    let name = "real-quickstart";
    apply_job(client, &job(name)?).await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    // Placement, seen while the job runs: every pod of the job is on a real node of its tier.
    let placed = poll_until(
        "the job's coordinator, reliable and transient pods to run",
        Duration::from_secs(120),
        || {
            let pods = pods.clone();
            async move {
                let list = pods
                    .list(&ListParams::default().labels(&format!("{JOB_LABEL}={name}")))
                    .await?;
                let running: Vec<Pod> = list.items.into_iter().filter(running).collect();
                let has = |tier: &str| {
                    running
                        .iter()
                        .any(|p| p.labels().get(TIER_LABEL).map(String::as_str) == Some(tier))
                };
                let coordinator = running
                    .iter()
                    .any(|p| p.labels().contains_key(COORDINATOR_LABEL));
                Ok((coordinator && has("reliable") && has("transient")).then_some(running))
            }
        },
    )
    .await
    .map_err(|e| format!("{e}; pods: {}", pod_report(client, NAMESPACE)))?;
    for pod in &placed {
        let node = node_of(pod);
        let transient = pod.labels().get(TIER_LABEL).map(String::as_str) == Some("transient");
        if transient {
            assert!(
                SPOT_NODES.contains(&node.as_str()),
                "transient pod {} on {node}",
                pod.name_any()
            );
        } else {
            assert_eq!(
                node,
                ON_DEMAND_NODE,
                "pod {} of the reliable tier",
                pod.name_any()
            );
        }
    }
    // A runtime pod's log reads like a user would want: what it is and what it does. Read
    // while it runs (a finished job's pods are gone).
    let reliable = placed
        .iter()
        .find(|p| p.labels().get(TIER_LABEL).map(String::as_str) == Some("reliable"))
        .ok_or("a reliable pod")?
        .name_any();
    let log = poll_until("the reliable pod's log", Duration::from_secs(60), || {
        let pods = pods.clone();
        let reliable = reliable.clone();
        async move {
            let log = pods.logs(&reliable, &LogParams::default()).await?;
            Ok((log.lines().count() >= 2).then_some(log))
        }
    })
    .await?;
    say(&format!(
        "   log of {reliable} (first lines):\n{}",
        log.lines().take(8).collect::<Vec<_>>().join("\n")
    ));
    let finished = wait_finished(client, name, Duration::from_secs(300)).await?;
    let status = finished.status.unwrap_or_default();
    let loss = status.loss.ok_or("a succeeded job reports its loss")?;
    assert!(loss.is_finite(), "loss {loss}");
    let cost = status.cost.ok_or("a succeeded job reports its cost")?;
    assert!(
        cost.spent > 0.0 && cost.spent < cost.on_demand_equivalent,
        "spot capacity costs less than its on-demand equivalent: {cost:?}"
    );
    say(&format!(
        "2. {name} Succeeded at iteration {:?}, loss {loss:.4}, spent ${:.2} against ${:.2} on demand; pods ran on {}",
        status.iteration,
        cost.spent,
        cost.on_demand_equivalent,
        placed
            .iter()
            .map(|p| format!("{}@{}", p.name_any(), node_of(p)))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    Ok(())
}

/// Step 3: a spot node interrupted the NTH way while a job runs; the job still succeeds.
async fn interrupt_spot_node(client: &Client, prometheus: &Prometheus) -> Result<(), BoxError> {
    let name = "real-interrupted";
    // Beside it the integer-exact self-test, drained with it: its table must come out exact.
    let exact = "real-interrupted-exact";
    apply_job(client, &job(name)?).await?;
    apply_job(client, &self_test_job(exact, 2500)?).await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    // A spot node with running transient pods of both jobs (of the MF job alone if none has).
    let node = poll_until(
        "transient pods of both jobs to run",
        Duration::from_secs(120),
        || async move {
            let nodes_of = |pods: Vec<Pod>| -> std::collections::BTreeSet<String> {
                pods.iter().filter(|p| running(p)).map(node_of).collect()
            };
            let transient = format!("{TIER_LABEL}=transient");
            let mf = nodes_of(job_pods(client, name, &transient).await?);
            let selftest = nodes_of(job_pods(client, exact, &transient).await?);
            Ok(mf.intersection(&selftest).next().cloned().or_else(|| {
                (!selftest.is_empty())
                    .then(|| mf.iter().next().cloned())
                    .flatten()
            }))
        },
    )
    .await
    .map_err(|e| format!("{e}; pods: {}", pod_report(client, NAMESPACE)))?;
    // Step 6 reads what Prometheus scraped from this job's real pods: the runtime pods and the
    // operator are targets before the interruption.
    prometheus
        .wait_for(
            "Prometheus to scrape the operator and three runtime pods",
            "up{job=\"ebbflow-runtime\", trainingjob=\"real-interrupted\"} == 1 or up{job=\"ebbflow-operator\"} == 1",
            4,
            Duration::from_secs(60),
        )
        .await?;
    let nodes: Api<Node> = Api::all(client.clone());
    ebbflow_tests::cluster::set_interruption_taint(&nodes, &node, Some(NTH_SPOT_ITN_TAINT)).await?;
    // Drain the way NTH does: cordon, then evict every pod of the job on the node.
    nodes
        .patch(
            &node,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"unschedulable": true}})),
        )
        .await?;
    let on_node = pods
        .list(
            &ListParams::default()
                .labels("app.kubernetes.io/name=ebbflow-runtime")
                .fields(&format!("spec.nodeName={node}")),
        )
        .await?;
    // Each evicted pod's log, followed from now until its container ends: what a node did
    // between the SIGTERM and its exit, for the failure message.
    let followed: Vec<(String, tokio::task::JoinHandle<String>)> = on_node
        .items
        .iter()
        .map(|pod| {
            let (pods, pod_name) = (pods.clone(), pod.name_any());
            let follow = LogParams {
                follow: true,
                since_seconds: Some(5),
                ..LogParams::default()
            };
            let handle = tokio::spawn(async move {
                use futures::AsyncBufReadExt as _;
                let mut text = String::new();
                if let Ok(stream) = pods.log_stream(&pod_name, &follow).await {
                    let mut lines = stream.lines();
                    while let Some(Ok(line)) = futures::StreamExt::next(&mut lines).await {
                        if !line.contains("segment starting") {
                            text.push_str(&line);
                            text.push('\n');
                        }
                    }
                }
                text
            });
            (pod.name_any(), handle)
        })
        .collect();
    let grace = 30;
    for pod in &on_node.items {
        evict(&pods, &pod.name_any(), grace).await?;
    }
    let evicted_at = std::time::Instant::now();
    say(&format!(
        "3. {node} tainted {NTH_SPOT_ITN_TAINT}, cordoned, {} pod(s) evicted with a {grace} s grace",
        on_node.items.len()
    ));
    // The kubelet stops each container with SIGTERM; `ebbflow pod` hands its work over and exits
    // on its own before the grace period ends (at its end the kubelet SIGKILLs: exit code 137).
    let names: Vec<String> = on_node.items.iter().map(|p| p.name_any()).collect();
    let mut last_state: std::collections::BTreeMap<String, (i32, Option<String>)> =
        Default::default();
    let deadline = evicted_at + Duration::from_secs(grace + 10);
    loop {
        let mut left = 0;
        for pod_name in &names {
            if let Some(pod) = pods.get_opt(pod_name).await? {
                left += 1;
                let terminated = pod
                    .status
                    .and_then(|s| s.container_statuses)
                    .and_then(|c| c.into_iter().next())
                    .and_then(|c| c.state)
                    .and_then(|s| s.terminated);
                if let Some(t) = terminated {
                    last_state.insert(pod_name.clone(), (t.exit_code, t.reason));
                }
            }
        }
        if left == 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the evicted pods {names:?} were still there {} s after the eviction ({grace} s grace); {}",
            grace + 10,
            pod_report(client, NAMESPACE)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let gone_after = evicted_at.elapsed();
    let gone_at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_secs_f64();
    let events: Api<Event> = Api::namespaced(client.clone(), NAMESPACE);
    let killing = events
        .list(&ListParams::default().fields("reason=Killing"))
        .await?
        .items
        .into_iter()
        .filter(|e| names.contains(&e.involved_object.name.clone().unwrap_or_default()))
        .count();
    say(&format!(
        "   the kubelet stopped them (Killing events: {killing}); all gone {:.1} s after the eviction; last container states seen: {last_state:?}",
        gone_after.as_secs_f64()
    ));
    assert!(
        killing >= 1,
        "the kubelet recorded no Killing event for {names:?}"
    );
    // 6. Every dashboard's queries, evaluated two seconds after the evicted pods were gone,
    // while the job goes on: once Prometheus has scraped past that moment.
    let at = gone_at + 2.0;
    prometheus
        .wait_for(
            "Prometheus to scrape past the interruption",
            &format!(
                "max(timestamp(up{{job=\"ebbflow-operator\"}})) > {:.3}",
                at + 1.0
            ),
            1,
            Duration::from_secs(30),
        )
        .await?;
    let answered = prometheus.check_dashboards(Some(at)).await?;
    let targets = prometheus.count("up == 1", Some(at)).await;
    say(&format!(
        "6. Prometheus scrapes {targets} targets found through the API server; {answered} dashboard expressions return data, none that should is empty"
    ));
    assert!(
        answered >= 30,
        "only {answered} dashboard expressions returned data"
    );
    let mut logs = String::new();
    for (pod_name, handle) in followed {
        let text = tokio::time::timeout(Duration::from_secs(5), handle)
            .await
            .map(|joined| joined.unwrap_or_default())
            .unwrap_or_default();
        logs.push_str(&format!("--- {pod_name}:\n{text}"));
    }
    for (pod_name, (code, reason)) in &last_state {
        assert_ne!(
            *code, 137,
            "{pod_name} was SIGKILLed at the end of its grace ({reason:?}); the evicted pods' logs:\n{logs}"
        );
    }
    let finished = wait_finished(client, name, Duration::from_secs(300)).await?;
    let status = finished.status.unwrap_or_default();
    assert!(
        status.evictions >= 1,
        "the job counted the eviction: {status:?}"
    );
    assert_eq!(
        (status.node_failures, status.rollbacks),
        (0, 0),
        "an eviction the kubelet gave notice of is neither a failure nor a rollback: {status:?}"
    );
    say(&format!(
        "   {name} Succeeded: evictions {}, migrations {}, node failures 0, rollbacks 0, loss {:?}",
        status.evictions, status.migrations, status.loss
    ));
    let exact_job = wait_finished(client, exact, Duration::from_secs(300)).await?;
    assert_exact(&exact_job);
    let exact_status = exact_job.status.clone().unwrap_or_default();
    say(&format!(
        "   {exact} Succeeded exact (0 wrong values) through {} eviction(s), {} rollback(s)",
        exact_status.evictions, exact_status.rollbacks
    ));
    ebbflow_tests::cluster::set_interruption_taint(&nodes, &node, None).await?;
    nodes
        .patch(
            &node,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"unschedulable": false}})),
        )
        .await?;
    Ok(())
}

/// Evicts pod `name` through the Eviction API with a `grace` seconds grace period, as a drain
/// does. The Eviction is posted as the API defines it: kube 5.0's `Api::evict` sends its delete
/// options under `delete_options`, which the API server ignores, so a grace period is lost.
async fn evict(pods: &Api<Pod>, name: &str, grace: u64) -> Result<(), BoxError> {
    let eviction: Eviction = serde_json::from_value(serde_json::json!({
        "apiVersion": "policy/v1", "kind": "Eviction",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "deleteOptions": {"gracePeriodSeconds": grace},
    }))?;
    let _: serde_json::Value = pods
        .create_subresource("eviction", name, &PostParams::default(), &eviction)
        .await?;
    Ok(())
}

/// Step 9: a Python app (the SDK's integer-exact app, `examples/python/exact.py`) in the Python
/// runtime image (`ebbflow-runtime-python`: `ebbflow` with the embedded interpreter, CPython,
/// numpy, the SDK), on real pods: its transient pods on one spot node are evicted mid-run with
/// a grace period, and the job ends Succeeded with an exact table (0 wrong values).
async fn python_job(real: &Real) -> Result<(), BoxError> {
    let client = &real.client;
    let name = "real-python-exact";
    let clocks = 3000;
    let mut value = serde_json::to_value(job(name)?)?;
    merge(
        &mut value,
        serde_json::json!({"spec": {
            "app": {"kind": "Python", "hyperparameters": null, "python": {
                "entry": "exact:App", "path": ["/opt/ebbflow/examples"],
                "args": {"clocks": clocks, "staleness": 1, "clock_ms": 10, "rows": 256, "shared_rows": 16},
            }},
            "stop": {"iterations": clocks, "wallClockLimit": null},
            "runtime": {
                "image": format!("localhost/ebbflow/runtime-python:{}", real.tag),
                "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"memory": "512Mi"}},
            },
        }}),
    );
    // The exact app reads no data; kind Python needs a raw dataset, so it is handed its own code.
    value["spec"]["app"]["dataset"] =
        serde_json::json!({"path": "/opt/ebbflow/examples/exact.py", "format": "raw"});
    // Only the pools of spot nodes still Ready (scenario 4 took one away, and no node
    // autoscaler brings capacity back here).
    let nodes: Api<Node> = Api::all(client.clone());
    let zones: Vec<String> = nodes
        .list(&ListParams::default().labels("karpenter.sh/capacity-type=spot"))
        .await?
        .items
        .iter()
        .filter(|n| SPOT_NODES.contains(&n.name_any().as_str()))
        .filter(|n| {
            n.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        })
        .filter_map(|n| n.labels().get("topology.kubernetes.io/zone").cloned())
        .collect();
    if zones.is_empty() {
        return Err("no spot node is Ready for the Python job".into());
    }
    value["spec"]["transient"]["zones"] = serde_json::json!(zones);
    apply_job(client, &serde_json::from_value(value)?).await?;
    let transient = format!("{TIER_LABEL}=transient");
    let (node, on_node) = poll_until(
        "a transient pod of the Python job to run",
        Duration::from_secs(180),
        || {
            let transient = transient.clone();
            async move {
                let running_pods: Vec<Pod> = job_pods(client, name, &transient)
                    .await?
                    .into_iter()
                    .filter(running)
                    .collect();
                Ok(running_pods.first().map(node_of).map(|node| {
                    let names: Vec<String> = running_pods
                        .iter()
                        .filter(|p| node_of(p) == node)
                        .map(|p| p.name_any())
                        .collect();
                    (node, names)
                }))
            }
        },
    )
    .await
    .map_err(|e| format!("{e}; pods: {}", pod_report(client, NAMESPACE)))?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    for pod in &on_node {
        evict(&pods, pod, 30).await?;
    }
    say(&format!(
        "9. Python job {name}: {} transient pod(s) on {node} evicted with a 30 s grace",
        on_node.len()
    ));
    let finished = wait_finished(client, name, Duration::from_secs(300)).await?;
    assert_exact(&finished);
    let status = finished.status.clone().unwrap_or_default();
    assert!(
        status.evictions >= 1,
        "the Python job counted the eviction: {status:?}"
    );
    say(&format!(
        "   {name} Succeeded exact (0 wrong values) in the Python image: {} clocks, evictions {}, migrations {}, node failures {}, rollbacks {}",
        status.iteration.unwrap_or_default(),
        status.evictions,
        status.migrations,
        status.node_failures,
        status.rollbacks
    ));
    Ok(())
}

/// The job's pods matching `labels` (besides the job's own), by name.
async fn job_pods(client: &Client, job: &str, labels: &str) -> Result<Vec<Pod>, BoxError> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let selector = if labels.is_empty() {
        format!("{JOB_LABEL}={job}")
    } else {
        format!("{JOB_LABEL}={job},{labels}")
    };
    Ok(pods
        .list(&ListParams::default().labels(&selector))
        .await?
        .items)
}

fn running(pod: &Pod) -> bool {
    pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
        && pod.metadata.deletion_timestamp.is_none()
}

/// The first unsigned number after `key` in `line` (a log line, compact or JSON).
fn number_after(line: &str, key: &str) -> Option<u64> {
    let rest = &line[line.find(key)? + key.len()..];
    let digits: String = rest
        .trim_start_matches(|c: char| !c.is_ascii_digit())
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

/// Step 5: a job with `spec.runtime.checkpoint` on a real volume loses its coordinator pod (a
/// deletion: the kubelet's SIGTERM, on which the coordinator checkpoints at once); the operator's
/// replacement coordinator resumes from the checkpoint, not from clock 0, and the job succeeds.
async fn resume_from_checkpoint(client: &Client) -> Result<(), BoxError> {
    let name = "real-checkpointed";
    let dir = std::env::temp_dir().join(format!("ebbflow-real-checkpoints-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    // The runtime runs as its own user; a hostPath directory keeps the host's owner and mode.
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o777))?;
    host_volume(client, "checkpoints", &dir, "ReadWriteOnce").await?;
    let mut job = job(name)?;
    job.spec.runtime.checkpoint = Some(serde_json::from_value(
        serde_json::json!({"claimName": "checkpoints", "interval": "1s"}),
    )?);
    apply_job(client, &job).await?;
    let jobs: Api<TrainingJob> = Api::namespaced(client.clone(), NAMESPACE);
    let uid = jobs.get(name).await?.uid().ok_or("the job has a uid")?;
    let file = dir.join(format!("{uid}.ckpt"));
    let coordinator_label = format!("{COORDINATOR_LABEL}=true");
    let first = poll_until(
        "the coordinator to train and write its checkpoint on the volume",
        Duration::from_secs(120),
        || {
            let coordinator_label = coordinator_label.clone();
            let file = file.clone();
            let jobs = jobs.clone();
            async move {
                let running = job_pods(client, name, &coordinator_label)
                    .await?
                    .into_iter()
                    .find(running);
                // well into training: the checkpoint on the volume is not clock 0's
                let iteration = jobs
                    .get(name)
                    .await?
                    .status
                    .and_then(|s| s.iteration)
                    .unwrap_or(0);
                Ok(running.filter(|_| file.exists() && iteration >= 4000))
            }
        },
    )
    .await
    .map_err(|e| format!("{e}; pods: {}", pod_report(client, NAMESPACE)))?;
    let before = jobs
        .get(name)
        .await?
        .status
        .and_then(|s| s.iteration)
        .unwrap_or(0);
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    // A short grace: the kubelet's SIGTERM, on which the coordinator checkpoints at once, then
    // its SIGKILL well before training ends (with the default 120 s it would train to the end).
    let grace = DeleteParams {
        grace_period_seconds: Some(3),
        ..DeleteParams::default()
    };
    pods.delete(&first.name_any(), &grace).await?;
    say(&format!(
        "5. {name}: coordinator pod {} deleted at iteration {before}, its checkpoint on the volume ({})",
        first.name_any(),
        file.display()
    ));
    let first_uid = first.uid();
    let replacement = poll_until(
        "a replacement coordinator pod to run",
        Duration::from_secs(180),
        || {
            let coordinator_label = coordinator_label.clone();
            let first_uid = first_uid.clone();
            async move {
                Ok(job_pods(client, name, &coordinator_label)
                    .await?
                    .into_iter()
                    .find(|p| running(p) && p.uid() != first_uid))
            }
        },
    )
    .await
    .map_err(|e| format!("{e}; pods: {}", pod_report(client, NAMESPACE)))?;
    let replacement_name = replacement.name_any();
    let line = poll_until(
        "the replacement coordinator to say where it starts",
        Duration::from_secs(60),
        || {
            let pods = pods.clone();
            let replacement_name = replacement_name.clone();
            async move {
                let log = pods
                    .logs(&replacement_name, &LogParams::default())
                    .await
                    .unwrap_or_default();
                Ok(log
                    .lines()
                    .find(|l| l.contains("checkpoint") && l.contains("clock"))
                    .map(str::to_owned))
            }
        },
    )
    .await?;
    assert!(
        line.contains("resuming from this job's checkpoint"),
        "the replacement coordinator did not resume from the checkpoint: {line}"
    );
    let resumed = number_after(&line, "clock").ok_or("the resume line names a clock")?;
    let total = job.spec.stop.iterations.unwrap_or(0);
    assert!(
        resumed > 0 && resumed < total,
        "the replacement should resume mid-run, between clock 0 and the job's {total}: {line}"
    );
    let finished = wait_finished(client, name, Duration::from_secs(300)).await?;
    let status = finished.status.unwrap_or_default();
    say(&format!(
        "   the replacement {replacement_name} resumed at clock {resumed} of {total} (the job was at iteration {before} when its coordinator was deleted with a 3 s grace); {name} Succeeded, loss {:?}",
        status.loss
    ));
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// Step 4: a spot node vanishes without notice: its kubelet and containerd are SIGKILLed and
/// its pods frozen (`real-nodes.sh kill`), then its Node is deleted, as the cloud's node
/// lifecycle controller does for a terminated instance. The coordinator finds the node by its
/// missing heartbeats and rolls back; the operator replaces the lost pods and the job goes on
/// with the nodes left and succeeds.
async fn lose_spot_node(real: &Real) -> Result<(), BoxError> {
    let client = &real.client;
    let name = "real-vanished";
    // The integer-exact self-test, long enough (about 30 clocks a second on these nodes) that the
    // operator replaces the lost pods, and moves them off the lost pool, before the end; at
    // least two transient pods, so the replacements are bought somewhere.
    let mut value = serde_json::to_value(self_test_job(name, 6000)?)?;
    merge(
        &mut value,
        serde_json::json!({"spec": {"transient": {"minNodes": 2}}}),
    );
    apply_job(client, &serde_json::from_value(value)?).await?;
    let jobs: Api<TrainingJob> = Api::namespaced(client.clone(), NAMESPACE);
    // A transient pod that the coordinator admitted and that trains.
    let victim = poll_until(
        "a transient pod to run while the job trains",
        Duration::from_secs(120),
        || {
            let jobs = jobs.clone();
            async move {
                let training = jobs
                    .get(name)
                    .await?
                    .status
                    .and_then(|s| s.iteration)
                    .unwrap_or(0)
                    > 300;
                let pod = job_pods(client, name, &format!("{TIER_LABEL}=transient"))
                    .await?
                    .into_iter()
                    .find(pod_ready);
                Ok(pod.filter(|_| training))
            }
        },
    )
    .await
    .map_err(|e| format!("{e}; pods: {}", pod_report(client, NAMESPACE)))?;
    let node = node_of(&victim);
    let output = std::process::Command::new(&real.nodes_script)
        .args(["kill", &real.cluster, &node])
        .output()?;
    if !output.status.success() {
        return Err(format!(
            "real-nodes.sh kill {node} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        )
        .into());
    }
    let killed_at = std::time::Instant::now();
    let killed_time = k8s_openapi::jiff::Timestamp::now();
    say(&format!(
        "4. {node} vanished (kubelet and containerd killed, pods frozen) under {name}'s pod {}",
        victim.name_any()
    ));
    let failed = poll_until(
        "the coordinator to find the node failed and roll back",
        Duration::from_secs(120),
        || {
            let jobs = jobs.clone();
            async move {
                let status = jobs.get(name).await?.status.unwrap_or_default();
                Ok((status.rollbacks >= 1).then_some(status))
            }
        },
    )
    .await?;
    let found_after = killed_at.elapsed();
    let nodes: Api<Node> = Api::all(client.clone());
    nodes.delete(&node, &DeleteParams::default()).await?;
    // Until the job ends: the transient pods the operator creates after the loss. BidBrain
    // first buys the lost node's pool again (there a node autoscaler would launch a node,
    // which this cluster has not); once its pod has waited past the unschedulable wait (20 s
    // here) the pool is avoided and the pods are bought in the other one, on the other node.
    let mut replacement: Option<String> = None;
    let deadline = std::time::Instant::now() + Duration::from_secs(300);
    let finished = loop {
        let job = jobs.get(name).await?;
        if matches!(
            job.status.as_ref().and_then(|s| s.phase),
            Some(Phase::Succeeded | Phase::Failed)
        ) {
            break job;
        }
        // the first replacement seen, until one is seen running
        if replacement
            .as_deref()
            .is_none_or(|r| r.ends_with("Pending)"))
        {
            let mut created: Vec<Pod> = job_pods(client, name, &format!("{TIER_LABEL}=transient"))
                .await?
                .into_iter()
                .filter(|p| {
                    p.metadata
                        .creation_timestamp
                        .as_ref()
                        .is_some_and(|t| t.0 > killed_time)
                })
                .collect();
            created.sort_by_key(|p| !running(p));
            let found = created.into_iter().next().map(|p| {
                let pool = p
                    .spec
                    .as_ref()
                    .and_then(|s| s.node_selector.as_ref())
                    .and_then(|s| s.get("topology.kubernetes.io/zone").cloned())
                    .unwrap_or_default();
                match node_of(&p).as_str() {
                    "" => format!("{} (pool {pool}, Pending)", p.name_any()),
                    on => format!("{}@{on} (pool {pool})", p.name_any()),
                }
            });
            replacement = found.or(replacement);
        }
        assert!(
            std::time::Instant::now() < deadline,
            "job {name} did not finish within 5 minutes of losing {node}; pods: {}",
            pod_report(client, NAMESPACE)
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let finished = succeeded(finished)?;
    let status = finished.status.clone().unwrap_or_default();
    say(&format!(
        "   rolled back {:.1} s after the kill (at iteration {:?}; rollbacks {} in all); replacement transient pod: {}; {name} Succeeded exact, loss {:?} (wrong values)",
        found_after.as_secs_f64(),
        failed.iteration,
        status.rollbacks,
        replacement.as_deref().unwrap_or("none"),
        status.loss
    ));
    assert_exact(&finished);
    let replacement = replacement.ok_or_else(|| {
        format!("the operator created no transient pod after losing {node}: {status:?}")
    })?;
    assert!(
        !replacement.ends_with("Pending)") && !replacement.contains(&format!("@{node} ")),
        "no replacement ran on another spot node after {node} was lost: {replacement}"
    );
    Ok(())
}

/// A bad-input job: the quickstart as `name`, small enough in CPU that several fit the
/// on-demand node at once, with `edit` applied to its spec.
fn bad_job(name: &str, edit: serde_json::Value) -> Result<TrainingJob, BoxError> {
    let job = job(name)?;
    let mut value = serde_json::to_value(&job)?;
    value["spec"]["runtime"]["resources"] = serde_json::json!({"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"memory": "512Mi"}});
    merge(&mut value, edit);
    Ok(serde_json::from_value(value)?)
}

/// JSON merge patch (RFC 7386) of `patch` into `target`.
fn merge(target: &mut serde_json::Value, patch: serde_json::Value) {
    match (target, patch) {
        (serde_json::Value::Object(target), serde_json::Value::Object(patch)) => {
            for (key, value) in patch {
                if value.is_null() {
                    target.remove(&key);
                } else {
                    merge(target.entry(key).or_insert(serde_json::Value::Null), value);
                }
            }
        }
        (target, patch) => *target = patch,
    }
}

/// The job's condition `type_` as (status, reason, message), once it exists.
fn condition_of(job: &TrainingJob, type_: &str) -> Option<(String, String, String)> {
    job.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

/// Step 8: bad input on real kubelets, three jobs at once. An image that does not exist, a
/// runtime that fails at start (a dataset file that is not there), a runtime OOM-killed by
/// the kernel at its memory limit and one that measures first and refuses: each job's status says which and why (a condition and an
/// event naming the cause), pods that cannot start are not recreated in a loop, and nothing is
/// left once the jobs are deleted (step 7 checks).
async fn bad_input(client: &Client) -> Result<(), BoxError> {
    let missing_image = "localhost/ebbflow/runtime:does-not-exist";
    let jobs_in: [(&str, serde_json::Value); 4] = [
        (
            "real-bad-image",
            serde_json::json!({"spec": {"runtime": {"image": missing_image}}}),
        ),
        (
            "real-bad-dataset",
            serde_json::json!({"spec": {"app": {"dataset": {"synthetic": null,
                "path": "no-such-ratings.inter", "format": "movielens-inter"}}}}),
        ),
        // The largest synthetic set generated whole in one process (operator::run::
        // PLANTED_ABOVE ratings, ~250 MB at its peak) under a 48 MiB limit: the kernel kills it.
        (
            "real-oom",
            serde_json::json!({"spec": {"app": {"dataset": {"synthetic": {"seed": 1,
                "users": 480189, "items": 17770, "ratings": 2000000, "trueRank": 4, "noise": 0.1}}},
                "runtime": {"resources": {"limits": {"memory": "48Mi"}}}}}),
        ),
        // Ten times as many: generated by shard, so the runtime measures first and refuses,
        // naming what it needs and what the container's memory limit leaves.
        (
            "real-too-large",
            serde_json::json!({"spec": {"app": {"dataset": {"synthetic": {"seed": 1,
                "users": 480189, "items": 17770, "ratings": 20000000, "trueRank": 4, "noise": 0.1}}},
                "runtime": {"resources": {"limits": {"memory": "48Mi"}}}}}),
        ),
    ];
    for (name, edit) in &jobs_in {
        apply_job(client, &bad_job(name, edit.clone())?).await?;
    }
    // A spot pool whose only node never becomes Ready (real-spot-broken, no CNI): the job
    // trains on its reliable node, its transient pod waits, and after the operator's
    // unschedulable wait (20 s here, chart value unschedulableAfterSeconds) the job says which
    // node and why.
    let mut not_ready = serde_json::to_value(self_test_job(NOT_READY_JOB, 100_000)?)?;
    merge(
        &mut not_ready,
        serde_json::json!({"spec": {"transient": {"zones": [BROKEN_ZONE], "minNodes": 1, "maxNodes": 1}}}),
    );
    apply_job(client, &serde_json::from_value(not_ready)?).await?;
    let jobs: Api<TrainingJob> = Api::namespaced(client.clone(), NAMESPACE);
    // The missing image: Degraded, the kubelet's reason and the image named, at once.
    let (_, reason, message) = poll_until(
        "real-bad-image to say its pods cannot start",
        Duration::from_secs(120),
        || {
            let jobs = jobs.clone();
            async move {
                let job = jobs.get("real-bad-image").await?;
                Ok(condition_of(&job, "Degraded").filter(|(status, _, _)| status == "True"))
            }
        },
    )
    .await
    .map_err(|e| format!("{e}; pods: {}", pod_report(client, NAMESPACE)))?;
    say(&format!("8. real-bad-image: Degraded {reason}: {message}"));
    let coordinator = format!("{COORDINATOR_LABEL}=true");
    let stuck: std::collections::BTreeSet<String> =
        job_pods(client, "real-bad-image", &coordinator)
            .await?
            .iter()
            .filter_map(|p| p.uid())
            .collect();
    assert_eq!(reason, "PodsNotStarting", "{message}");
    assert!(message.contains(missing_image), "{message}");
    // The other two fail for good after the coordinator's third failure in a row, the cause
    // in the Failed condition.
    for (name, cause) in [
        ("real-bad-dataset", "no-such-ratings.inter"),
        ("real-oom", "OOMKilled"),
        ("real-too-large", "of memory is available"),
    ] {
        let failed = wait_ended(client, name, Duration::from_secs(180)).await?;
        assert_eq!(
            failed.status.as_ref().and_then(|s| s.phase),
            Some(Phase::Failed),
            "{name} ended but did not fail"
        );
        let (_, reason, message) =
            condition_of(&failed, "Failed").ok_or("a failed job has a Failed condition")?;
        say(&format!("   {name}: Failed {reason}: {message}"));
        assert!(
            message.contains(cause),
            "{name}'s Failed condition names {cause:?}: {reason}: {message}"
        );
    }
    // The coordinator pod that cannot start is the same pod, never recreated: the kubelet's
    // pull backoff is the only retry.
    let now: std::collections::BTreeSet<String> = job_pods(client, "real-bad-image", &coordinator)
        .await?
        .iter()
        .filter_map(|p| p.uid())
        .collect();
    assert_eq!(
        now, stuck,
        "the coordinator pod of real-bad-image, which cannot start, was replaced"
    );
    // The never-Ready node: named with the kubelet's reason, the job still training, its
    // pending pod the same one (nothing recreated in a loop).
    let (job, message) = poll_until(
        "real-not-ready to say its pod cannot be scheduled",
        Duration::from_secs(120),
        || {
            let jobs = jobs.clone();
            async move {
                let job = jobs.get(NOT_READY_JOB).await?;
                Ok(condition_of(&job, "Degraded")
                    .filter(|(status, reason, _)| status == "True" && reason == "PodsUnschedulable")
                    .map(|(_, _, message)| (job, message)))
            }
        },
    )
    .await
    .map_err(|e| format!("{e}; pods: {}", pod_report(client, NAMESPACE)))?;
    say(&format!(
        "   {NOT_READY_JOB}: Degraded PodsUnschedulable: {message}"
    ));
    for part in [BROKEN_NODE, "cni plugin not initialized"] {
        assert!(
            message.contains(part),
            "the Degraded message names {part:?}: {message}"
        );
    }
    assert_eq!(
        job.status.as_ref().and_then(|s| s.phase),
        Some(Phase::Running),
        "{NOT_READY_JOB} trains on its reliable node meanwhile"
    );
    let transient = format!("{TIER_LABEL}=transient");
    let waiting: Vec<String> = job_pods(client, NOT_READY_JOB, &transient)
        .await?
        .iter()
        .filter_map(|p| p.uid())
        .collect();
    assert_eq!(
        waiting.len(),
        1,
        "one transient pod waits for {BROKEN_NODE}"
    );
    // Events on the jobs: what `kubectl describe tj` shows.
    let events: Api<Event> = Api::namespaced(client.clone(), NAMESPACE);
    let listed = events.list(&ListParams::default()).await?.items;
    for (name, reason) in [
        ("real-bad-image", "PodsNotStarting"),
        ("real-bad-dataset", "CoordinatorFailed"),
        ("real-oom", "CoordinatorFailed"),
        ("real-too-large", "CoordinatorFailed"),
        (NOT_READY_JOB, "PodsUnschedulable"),
    ] {
        let found = listed.iter().any(|e| {
            e.involved_object.kind.as_deref() == Some("TrainingJob")
                && e.involved_object.name.as_deref() == Some(name)
                && e.reason.as_deref() == Some(reason)
        });
        let seen: Vec<String> = listed
            .iter()
            .filter(|e| e.involved_object.name.as_deref() == Some(name))
            .map(|e| e.reason.clone().unwrap_or_default())
            .collect();
        assert!(found, "no {reason} event on {name}; its events: {seen:?}");
    }
    let still: Vec<String> = job_pods(client, NOT_READY_JOB, &transient)
        .await?
        .iter()
        .filter_map(|p| p.uid())
        .collect();
    assert_eq!(
        still, waiting,
        "the pod waiting for {BROKEN_NODE} was replaced"
    );
    for name in jobs_in.iter().map(|(name, _)| *name).chain([NOT_READY_JOB]) {
        jobs.delete(name, &DeleteParams::foreground()).await?;
    }
    Ok(())
}

/// Step 7: uninstall and job deletion leave nothing of ebbflow behind.
async fn uninstall(real: &Real, operator: &str) -> Result<(), BoxError> {
    let client = &real.client;
    let jobs: Api<TrainingJob> = Api::namespaced(client.clone(), NAMESPACE);
    for job in jobs.list(&ListParams::default()).await?.items {
        jobs.delete(&job.name_any(), &DeleteParams::foreground())
            .await?;
    }
    poll_until("the jobs to be deleted", Duration::from_secs(120), || {
        let jobs = jobs.clone();
        async move {
            Ok(jobs
                .list(&ListParams::default())
                .await?
                .items
                .is_empty()
                .then_some(()))
        }
    })
    .await?;
    real.helm(&["uninstall", RELEASE, "--namespace", NAMESPACE, "--wait"])?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let services: Api<Service> = Api::namespaced(client.clone(), NAMESPACE);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NAMESPACE);
    let leases: Api<Lease> = Api::namespaced(client.clone(), NAMESPACE);
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        let mut left: Vec<String> = Vec::new();
        left.extend(
            pods.list(&ListParams::default())
                .await?
                .items
                .iter()
                .map(|p| format!("pod {}", p.name_any())),
        );
        left.extend(
            services
                .list(&ListParams::default())
                .await?
                .items
                .iter()
                .map(|o| format!("service {}", o.name_any())),
        );
        // Secrets of the release and the jobs (a ServiceAccount token Secret is the cluster's).
        left.extend(
            secrets
                .list(&ListParams::default())
                .await?
                .items
                .iter()
                .filter(|o| o.type_.as_deref() != Some("kubernetes.io/service-account-token"))
                .map(|o| format!("secret {}", o.name_any())),
        );
        left.extend(
            leases
                .list(&ListParams::default())
                .await?
                .items
                .iter()
                .map(|o| {
                    let holder = o
                        .spec
                        .as_ref()
                        .and_then(|s| s.holder_identity.clone())
                        .unwrap_or_default();
                    format!(
                        "lease {} (held by {holder:?}; the operator was {operator})",
                        o.name_any()
                    )
                }),
        );
        if left.is_empty() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "2 minutes after helm uninstall and the jobs' deletion, {NAMESPACE} still has: {}",
            left.join(", ")
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    say("7. helm uninstall and job deletion left no pod, Service, Secret or held Lease");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chart_and_jobs_run_on_real_kubelets() -> Result<(), BoxError> {
    let Some(real) = Real::from_env("the_chart_and_jobs_run_on_real_kubelets").await? else {
        return Ok(());
    };
    let operator = install_chart(&real).await?;
    let (prometheus, prometheus_dir) = start_prometheus(&real)?;
    let discovery = tokio::spawn(discover_targets(
        real.client.clone(),
        prometheus_dir.clone(),
    ));
    // EBBFLOW_REAL_SCENARIOS=5,8 runs only those between the install and the uninstall (by
    // hand, while working on one; 6 runs with 3).
    let only = std::env::var("EBBFLOW_REAL_SCENARIOS").unwrap_or_default();
    let run = |scenario: &str| only.is_empty() || only.split(',').any(|s| s.trim() == scenario);
    if run("2") {
        run_job(&real.client).await?;
    }
    if run("3") {
        interrupt_spot_node(&real.client, &prometheus).await?;
    }
    if run("5") {
        resume_from_checkpoint(&real.client).await?;
    }
    if run("4") {
        lose_spot_node(&real).await?;
    }
    if run("8") {
        bad_input(&real.client).await?;
    }
    if run("9") {
        python_job(&real).await?;
    }
    uninstall(&real, &operator).await?;
    discovery.abort();
    drop(prometheus);
    let _ = std::fs::remove_dir_all(prometheus_dir);
    Ok(())
}
