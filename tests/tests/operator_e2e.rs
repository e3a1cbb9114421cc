//! The operator against a real control plane (issue 7): the controller runs in this process with
//! the cluster's kubeconfig; a TrainingJob is applied; its Secret, coordinator Service and pods
//! appear, reliable pods are scheduled onto on-demand kwok nodes and transient pods onto spot kwok
//! nodes by the real kube-scheduler, the status carries conditions and `observedGeneration`, a
//! deleted child pod is recreated, and deleting the job removes everything it created.
//!
//! Skipped (with a line saying so) unless `EBBFLOW_KUBECONFIG` names the cluster that
//! `scripts/cluster.sh up` started. The job's coordinator does not run (kwok pods are not
//! processes), so the job reports the coordinator unreachable: this suite is about placement and
//! object lifecycle.

use std::collections::BTreeMap;
use std::time::Duration;

use ebbflow_crds::TrainingJob;
use ebbflow_operator::controller;
use ebbflow_tests::cluster::{BoxError, FIELD_MANAGER, client_or_skip, install_crd, poll_until};
use k8s_openapi::api::core::v1::{Node, Pod, Secret, Service};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use kube::{Api, ResourceExt};

const JOB: &str = "e2e-placement";

fn job_manifest(namespace: &str) -> Result<TrainingJob, BoxError> {
    let mut job = ebbflow_tests::cluster::quickstart_job(JOB, namespace)?;
    // Two spot pods from the start (the spec planner holds minNodes), one on-demand pod.
    job.spec.transient.min_nodes = 2;
    job.spec.transient.max_nodes = 2;
    Ok(job)
}

fn capacity_of(node: &Node) -> Option<String> {
    node.labels().get("karpenter.sh/capacity-type").cloned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_land_on_their_tiers_and_clean_up() -> Result<(), BoxError> {
    let Some(client) = client_or_skip("jobs_land_on_their_tiers_and_clean_up").await? else {
        return Ok(());
    };
    install_crd(&client).await?;
    let test_namespace =
        ebbflow_tests::cluster::TestNamespace::create(&client, "e2e-operator").await?;
    let namespace = test_namespace.name().to_owned();
    let stop = ebbflow_tests::operator::start(&client, &prometheus::Registry::new()).await?;

    let jobs: Api<TrainingJob> = Api::namespaced(client.clone(), &namespace);
    let job = job_manifest(&namespace)?;
    jobs.patch(
        JOB,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&job),
    )
    .await?;

    // Children: the token Secret, the coordinator Service, 1 reliable + 2 transient pods, all
    // scheduled (kwok nodes accept them within a second).
    let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
    let selector = ListParams::default().labels(&format!("{}={JOB}", controller::plan::JOB_LABEL));
    let scheduled = poll_until(
        "3 scheduled pods of the job",
        Duration::from_secs(60),
        || {
            let pods = pods.clone();
            let selector = selector.clone();
            async move {
                let list = pods.list(&selector).await?;
                let placed: Vec<Pod> = list
                    .items
                    .into_iter()
                    .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some())
                    .collect();
                Ok((placed.len() >= 3).then_some(placed))
            }
        },
    )
    .await?;
    let nodes: Api<Node> = Api::all(client.clone());
    let mut tiers: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for pod in &scheduled {
        let tier = pod
            .labels()
            .get(controller::plan::TIER_LABEL)
            .cloned()
            .unwrap_or_default();
        let node_name = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .unwrap_or_default();
        let node = nodes.get(&node_name).await?;
        let capacity = capacity_of(&node).unwrap_or_default();
        let expected = if tier == "transient" {
            "spot"
        } else {
            "on-demand"
        };
        assert_eq!(
            capacity,
            expected,
            "pod {} of tier {tier:?} landed on {node_name} ({capacity})",
            pod.name_any()
        );
        tiers.entry(tier).or_default().push(pod.name_any());
    }
    assert_eq!(
        tiers.get("transient").map(Vec::len),
        Some(2),
        "transient pods: {tiers:?}"
    );
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &namespace);
    let services: Api<Service> = Api::namespaced(client.clone(), &namespace);
    assert!(
        !secrets.list(&selector).await?.items.is_empty(),
        "token secret"
    );
    assert!(
        !services.list(&selector).await?.items.is_empty(),
        "coordinator service"
    );

    // Status: conditions and observedGeneration from the real API server's status subresource.
    poll_until("status with conditions", Duration::from_secs(30), || {
        let jobs = jobs.clone();
        async move {
            let job = jobs.get(JOB).await?;
            let status = job.status.clone().unwrap_or_default();
            Ok((status.observed_generation == job.metadata.generation
                && !status.conditions.is_empty())
            .then_some(()))
        }
    })
    .await?;

    // A deleted child pod is replaced (a new pod, possibly under the same name).
    let victim = tiers["transient"][0].clone();
    let victim_uid = pods.get(&victim).await?.metadata.uid.unwrap_or_default();
    pods.delete(&victim, &DeleteParams::default().grace_period(0))
        .await?;
    poll_until("the deleted pod replaced", Duration::from_secs(60), || {
        let pods = pods.clone();
        let selector = selector.clone();
        let victim_uid = victim_uid.clone();
        async move {
            let list = pods.list(&selector).await?;
            let live = list
                .items
                .iter()
                .filter(|p| {
                    p.metadata.deletion_timestamp.is_none()
                        && p.metadata.uid.as_deref() != Some(victim_uid.as_str())
                })
                .count();
            Ok((live >= 3).then_some(()))
        }
    })
    .await?;

    // Deleting the job removes it (finalizer done) and its children (owner references).
    jobs.delete(JOB, &DeleteParams::default()).await?;
    poll_until("the job and its pods gone", Duration::from_secs(90), || {
        let jobs = jobs.clone();
        let pods = pods.clone();
        let selector = selector.clone();
        async move {
            let job_gone = jobs.get_opt(JOB).await?.is_none();
            let pods_left = pods
                .list(&selector)
                .await?
                .items
                .iter()
                .filter(|p| p.metadata.deletion_timestamp.is_none())
                .count();
            Ok((job_gone && pods_left == 0).then_some(()))
        }
    })
    .await?;

    let _ = stop.send(());
    test_namespace.delete().await?;
    Ok(())
}
