//! The chart and TrainingJobs on real kubelets (issue 35): real containerd, real images, the
//! kubelet's own SIGTERM and grace periods, Services through kube-proxy and CoreDNS, a volume
//! mounted by the kubelet. `scripts/e2e-real.sh` starts a control plane with three real nodes
//! (scripts/real-nodes.sh: real-od-0 on-demand; real-spot-0 and real-spot-1 spot, tainted) and
//! imports the release images; this suite then, in order:
//!
//! 1. `helm install`s the chart with those images: the operator runs as a pod under the chart's
//!    ServiceAccount, becomes Ready and takes the Lease;
//! 2. applies the quickstart TrainingJob (its trace from a volume): the coordinator and reliable
//!    pods land on the on-demand node, transient pods on spot nodes, and the job ends
//!    `Succeeded` with its loss and cost, the runtime pods' logs readable;
//! 3. interrupts a spot node the Node Termination Handler's way (its taint, then a drain through
//!    the Eviction API): the kubelet delivers SIGTERM, the pods hand their work over and exit
//!    well before the grace period ends, and the job still succeeds with no failure or rollback;
//! 4. `helm uninstall`s and deletes the jobs: no pod, Service, Secret or Lease is left.
//!
//! Skipped (with a line saying so) unless `EBBFLOW_REAL_KUBECONFIG` is set.

use std::io::Write as _;
use std::time::Duration;

use ebbflow_crds::{Phase, TrainingJob};
use ebbflow_operator::controller::plan::{COORDINATOR_LABEL, JOB_LABEL, TIER_LABEL};
use ebbflow_operator::notices::NTH_SPOT_ITN_TAINT;
use ebbflow_tests::cluster::{BoxError, FIELD_MANAGER, poll_until, repo_root};
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

/// What scripts/e2e-real.sh hands the suite.
struct Real {
    client: Client,
    kubeconfig: String,
    tag: String,
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

/// A hostPath PersistentVolume of the spot traces and its claim in the release namespace, for
/// the chart's `traces.claimName`: a volume the kubelet mounts into the operator's pod.
async fn traces_volume(client: &Client) -> Result<(), BoxError> {
    let apply = PatchParams::apply(FIELD_MANAGER).force();
    let volume: PersistentVolume = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": "ebbflow-real-traces"},
        "spec": {
            "capacity": {"storage": "1Gi"}, "accessModes": ["ReadOnlyMany"],
            "persistentVolumeReclaimPolicy": "Retain", "storageClassName": "",
            "hostPath": {"path": std::fs::canonicalize(trace_dir())?, "type": "Directory"},
        },
    }))?;
    Api::<PersistentVolume>::all(client.clone())
        .patch("ebbflow-real-traces", &apply, &Patch::Apply(&volume))
        .await?;
    let claim: PersistentVolumeClaim = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": "traces", "namespace": NAMESPACE},
        "spec": {
            "accessModes": ["ReadOnlyMany"], "storageClassName": "",
            "volumeName": "ebbflow-real-traces", "resources": {"requests": {"storage": "1Gi"}},
        },
    }))?;
    Api::<PersistentVolumeClaim>::namespaced(client.clone(), NAMESPACE)
        .patch("traces", &apply, &Patch::Apply(&claim))
        .await?;
    Ok(())
}

fn pod_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
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

/// Waits for job `name` to finish; fails on `Failed` with its message.
async fn wait_finished(
    client: &Client,
    name: &str,
    timeout: Duration,
) -> Result<TrainingJob, BoxError> {
    let jobs: Api<TrainingJob> = Api::namespaced(client.clone(), NAMESPACE);
    let job = poll_until(&format!("job {name} to finish"), timeout, || {
        let jobs = jobs.clone();
        async move {
            let job = jobs.get(name).await?;
            let phase = job.status.as_ref().and_then(|s| s.phase);
            Ok(matches!(phase, Some(Phase::Succeeded | Phase::Failed)).then_some(job))
        }
    })
    .await
    .map_err(|e| format!("{e}; pods: {}", pod_report(client, NAMESPACE)))?;
    let status = job.status.clone().unwrap_or_default();
    if status.phase != Some(Phase::Succeeded) {
        let conditions: Vec<String> = status
            .conditions
            .iter()
            .map(|c| format!("{} {} {}: {}", c.type_, c.status, c.reason, c.message))
            .collect();
        return Err(format!(
            "job {name} ended {:?}: {}",
            status.phase,
            conditions.join("; ")
        )
        .into());
    }
    Ok(job)
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
                let running: Vec<Pod> = list
                    .items
                    .into_iter()
                    .filter(|p| {
                        p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
                    })
                    .collect();
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
async fn interrupt_spot_node(client: &Client) -> Result<(), BoxError> {
    let name = "real-interrupted";
    apply_job(client, &job(name)?).await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let victim = poll_until("a transient pod to run", Duration::from_secs(120), || {
        let pods = pods.clone();
        async move {
            let list = pods
                .list(
                    &ListParams::default()
                        .labels(&format!("{JOB_LABEL}={name},{TIER_LABEL}=transient")),
                )
                .await?;
            Ok(list
                .items
                .into_iter()
                .find(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")))
        }
    })
    .await
    .map_err(|e| format!("{e}; pods: {}", pod_report(client, NAMESPACE)))?;
    let node = node_of(&victim);
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
                .labels(&format!("{JOB_LABEL}={name}"))
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
    // The Eviction is posted as the API defines it: kube 5.0's `Api::evict` sends its delete
    // options under `delete_options`, which the API server ignores, so a grace period is lost.
    let grace = 30;
    for pod in &on_node.items {
        let eviction: Eviction = serde_json::from_value(serde_json::json!({
            "apiVersion": "policy/v1", "kind": "Eviction",
            "metadata": {"name": pod.name_any(), "namespace": NAMESPACE},
            "deleteOptions": {"gracePeriodSeconds": grace},
        }))?;
        let _: serde_json::Value = pods
            .create_subresource(
                "eviction",
                &pod.name_any(),
                &PostParams::default(),
                &eviction,
            )
            .await?;
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

/// Step 4: uninstall and job deletion leave nothing of ebbflow behind.
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
    say("4. helm uninstall and job deletion left no pod, Service, Secret or held Lease");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chart_and_jobs_run_on_real_kubelets() -> Result<(), BoxError> {
    let Some(real) = Real::from_env("the_chart_and_jobs_run_on_real_kubelets").await? else {
        return Ok(());
    };
    let operator = install_chart(&real).await?;
    run_job(&real.client).await?;
    interrupt_spot_node(&real.client).await?;
    uninstall(&real, &operator).await?;
    Ok(())
}
