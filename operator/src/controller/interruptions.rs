//! The EC2 interruption watcher: spot interruptions of the instances the operator launched itself
//! (`provisioning.mode: ec2`), read from EC2 rather than from the cluster.
//!
//! Without AWS Node Termination Handler or Karpenter nothing taints the Node of a spot instance
//! EC2 is about to reclaim, and the first sign the relay sees is the Node's deletion, after the
//! instance is gone. So every [`Config::interruption_poll`](super::Config) (5 s by default) the
//! watcher asks EC2 for the spot request statuses of every spot instance the ec2-mode jobs hold
//! ([`Ec2Provisioner::spot_statuses`], one DescribeSpotInstanceRequests call), finds the Node of
//! each interrupted instance by its `spec.providerID` (`aws:///<zone>/<instance-id>`, as the AWS
//! cloud provider and Karpenter set it) and the pods on it in the relay's pod cache, and
//! delivers "pod X leaves at T" ([`NoticeSource::Ec2SpotInterruption`]) through the relay's
//! delivery: the same per-job ledger, coordinator path and `EvictionNotice` event. T is EC2's
//! two minutes after the status changed for `marked-for-termination` (`-stop`, `-hibernation`),
//! and now for an instance already terminated or stopped (`instance-terminated-by-*`,
//! `instance-stopped-by-*`). EC2 failures are logged, counted
//! (`ebbflow_operator_interruption_poll_errors_total`) and retried with backoff.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use ebbflow_crds::{ProvisioningMode, TrainingJob};
use ebbflow_ec2::SpotRequestStatus;
use k8s_openapi::{
    api::core::v1::{Node, Pod},
    jiff::Timestamp,
};
use kube::{
    ResourceExt,
    runtime::reflector::{ObjectRef, Store},
};
use tracing::warn;

use super::{
    context::{Context, exponential_backoff},
    plan, relay,
};
use crate::{
    instances::node_instance,
    notices::{EC2_NOTICE, Notice, NoticeSource},
};
use ebbflow_job::provision::{Ec2Provisioner, ProvisionError, job_tag};

/// Longest wait between polls after consecutive EC2 failures (unless the poll interval is
/// longer).
const MAX_BACKOFF: Duration = Duration::from_secs(60);

/// Polls EC2 for interruptions and delivers their notices until the controller stops (never
/// returns, except at once when ec2 provisioning is off).
pub async fn run(ctx: Arc<Context>, jobs: Store<TrainingJob>) {
    let Some(provisioner) = ctx.ec2.clone() else {
        return;
    };
    let poll = ctx.config.interruption_poll;
    let mut failures = 0_u32;
    loop {
        let delay = match poll_once(&ctx, &provisioner, &jobs).await {
            Ok(()) => {
                failures = 0;
                poll
            }
            Err(error) => {
                failures = failures.saturating_add(1);
                ctx.metrics.interruption_poll_errors.inc();
                let delay = backoff(poll, failures);
                warn!(%error, failures, delay_seconds = delay.as_secs_f64(), "ec2 interruption poll failed; backing off");
                delay
            }
        };
        tokio::time::sleep(delay).await;
    }
}

/// The wait after `failures` consecutive failures: the poll interval doubled per failure, at
/// most [`MAX_BACKOFF`] (or the poll interval, if longer).
fn backoff(poll: Duration, failures: u32) -> Duration {
    exponential_backoff(poll * 2, MAX_BACKOFF.max(poll), failures)
}

/// One poll: the notices of the interruptions EC2 reports now, delivered job by job.
async fn poll_once(
    ctx: &Arc<Context>,
    provisioner: &Ec2Provisioner,
    jobs: &Store<TrainingJob>,
) -> Result<(), ProvisionError> {
    let grouped = poll_notices(
        provisioner,
        &jobs.state(),
        &ctx.caches.nodes.state(),
        &ctx.caches.pods.state(),
        Timestamp::now(),
    )
    .await?;
    let deliveries = grouped
        .into_iter()
        .filter_map(|((namespace, name), notices)| {
            let job_ref = ObjectRef::new(&name).within(&namespace);
            let job = jobs.get(&job_ref)?;
            // the reconcile sees them too (no Pod or Node carries them)
            ctx.with_memory(&job_ref, |memory| memory.ledger.remember_external(&notices));
            Some(async move { relay::deliver(ctx, &job, &notices).await })
        });
    futures::future::join_all(deliveries).await;
    Ok(())
}

/// A poll's notices, grouped by job: EC2's spot request statuses of the instances the
/// [`watched`] `jobs` hold, mapped onto `nodes` and `pods` ([`interruption_notices`]).
async fn poll_notices(
    provisioner: &Ec2Provisioner,
    jobs: &[Arc<TrainingJob>],
    nodes: &[Arc<Node>],
    pods: &[Arc<Pod>],
    now: Timestamp,
) -> Result<BTreeMap<(String, String), Vec<Notice>>, ProvisionError> {
    let statuses = provisioner.spot_statuses(&watched(jobs)).await?;
    Ok(interruption_notices(&statuses, nodes, pods, now))
}

/// The tags ([`job_tag`]) of the jobs whose instances to watch: ec2 provisioning mode, not
/// suspended, not being deleted (their instances go on purpose).
fn watched(jobs: &[Arc<TrainingJob>]) -> Vec<String> {
    jobs.iter()
        .filter(|job| {
            job.spec.provisioning.mode == ProvisioningMode::Ec2
                && !job.spec.suspend
                && job.metadata.deletion_timestamp.is_none()
        })
        .filter_map(|job| job_tag(job).ok())
        .collect()
}

/// When the instance of an interrupted spot request leaves; `None` when the status announces no
/// interruption (see the module docs).
fn leaves_at(status: &SpotRequestStatus, now: Timestamp) -> Option<Timestamp> {
    if !status.is_interrupted() {
        return None;
    }
    if status
        .status_code
        .as_deref()
        .is_some_and(|code| code.starts_with("marked-for-"))
    {
        let marked = status
            .updated
            .and_then(|at| Timestamp::from_millisecond(at.timestamp_millis()).ok())
            .unwrap_or(now);
        Some(marked + EC2_NOTICE)
    } else {
        Some(now)
    }
}

/// The notices of the interruptions in `statuses`, grouped by job (namespace, name): one per pod
/// (in `pods`, by name) bound to a Node of `nodes` whose instance is interrupted, with the
/// earliest deadline when several statuses name one instance. Pure.
pub(crate) fn interruption_notices(
    statuses: &[SpotRequestStatus],
    nodes: &[Arc<Node>],
    pods: &[Arc<Pod>],
    now: Timestamp,
) -> BTreeMap<(String, String), Vec<Notice>> {
    let mut instances: BTreeMap<&str, Timestamp> = BTreeMap::new();
    for status in statuses {
        let (Some(instance), Some(at)) = (status.instance_id.as_deref(), leaves_at(status, now))
        else {
            continue;
        };
        instances
            .entry(instance)
            .and_modify(|earliest| *earliest = (*earliest).min(at))
            .or_insert(at);
    }
    if instances.is_empty() {
        return BTreeMap::new();
    }
    let leaving: BTreeMap<&str, Timestamp> = nodes
        .iter()
        .filter_map(|node| {
            let at = instances.get(node_instance(node)?)?;
            Some((node.metadata.name.as_deref()?, *at))
        })
        .collect();
    let mut grouped: BTreeMap<(String, String), Vec<Notice>> = BTreeMap::new();
    for pod in pods {
        let Some(node) = pod.spec.as_ref().and_then(|spec| spec.node_name.as_deref()) else {
            continue;
        };
        let (Some(leaves_at), Some(name), Some(namespace), Some(job)) = (
            leaving.get(node),
            pod.metadata.name.clone(),
            pod.namespace(),
            pod.labels().get(plan::JOB_LABEL),
        ) else {
            continue;
        };
        grouped
            .entry((namespace, job.clone()))
            .or_default()
            .push(Notice {
                pod: name,
                node: Some(node.to_owned()),
                leaves_at: *leaves_at,
                source: NoticeSource::Ec2SpotInterruption,
            });
    }
    for notices in grouped.values_mut() {
        notices.sort_by(|a, b| a.pod.cmp(&b.pod));
    }
    grouped
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use chrono::{TimeZone, Utc};
    use ebbflow_crds::CapacityType;
    use ebbflow_ec2::{CapacityType as Ec2CapacityType, Operation};
    use k8s_openapi::api::core::v1::NodeSpec;

    use super::*;
    use crate::controller::{plan::PoolKey, relay::tests::pod};
    use ebbflow_ec2::FakeEc2;
    use ebbflow_job::provision::wanted_for;

    fn ec2_job() -> TrainingJob {
        TrainingJob::test("ec2").with_ec2_image("us-east-1", "ami-12345678")
    }

    fn fake() -> Arc<FakeEc2> {
        Arc::new(FakeEc2::new().with_small_types(&["m5.large", "c5.xlarge"]))
    }

    fn at(text: &str) -> Timestamp {
        text.parse().unwrap()
    }

    fn node(name: &str, provider_id: Option<&str>) -> Arc<Node> {
        let mut node = Node::default();
        node.metadata.name = Some(name.into());
        node.spec = Some(NodeSpec {
            provider_id: provider_id.map(str::to_owned),
            ..NodeSpec::default()
        });
        Arc::new(node)
    }

    fn status(instance: &str, code: &str, updated: &str) -> SpotRequestStatus {
        SpotRequestStatus {
            request_id: format!("sir-{instance}"),
            instance_id: Some(instance.into()),
            state: Some("active".into()),
            status_code: Some(code.into()),
            status_message: None,
            updated: Some(updated.parse().unwrap()),
        }
    }

    /// (pod, leaves at) per job, for compact assertions.
    fn summary(
        grouped: &BTreeMap<(String, String), Vec<Notice>>,
    ) -> BTreeMap<(&str, &str), Vec<(&str, Timestamp)>> {
        grouped
            .iter()
            .map(|((namespace, job), notices)| {
                assert!(
                    notices
                        .iter()
                        .all(|n| n.source == NoticeSource::Ec2SpotInterruption)
                );
                (
                    (namespace.as_str(), job.as_str()),
                    notices
                        .iter()
                        .map(|n| (n.pod.as_str(), n.leaves_at))
                        .collect(),
                )
            })
            .collect()
    }

    #[test]
    fn provider_ids_name_aws_instances_only() {
        let id = |provider_id| node_instance(&node("n", provider_id)).map(str::to_owned);
        assert_eq!(id(Some("aws:///us-east-1a/i-0abc")), Some("i-0abc".into()));
        assert_eq!(id(Some("aws://us-east-1a/i-0abc")), Some("i-0abc".into()));
        assert_eq!(id(Some("gce://project/us-central1-a/vm-1")), None);
        assert_eq!(id(Some("kwok://spot-1")), None);
        assert_eq!(id(None), None);
    }

    #[test]
    fn marked_instances_leave_two_minutes_after_the_mark_and_terminated_ones_now() {
        let now = at("2026-01-01T00:00:30Z");
        let nodes = vec![
            node("spot-a", Some("aws:///us-east-1a/i-a")),
            node("spot-b", Some("aws:///us-east-1b/i-b")),
            node("spot-c", Some("aws:///us-east-1a/i-c")),
            node("no-provider", None),
        ];
        let pods = vec![
            pod("ns", "mf-t-0", "mf", "spot-a"),
            pod("ns", "mf-t-1", "mf", "spot-b"),
            pod("ns", "mf-t-2", "mf", "spot-c"),
            pod("ns", "mf-t-3", "mf", "no-provider"),
            pod("other", "lda-t-0", "lda", "spot-a"),
        ];
        let statuses = vec![
            status("i-a", "marked-for-termination", "2026-01-01T00:00:10Z"),
            status(
                "i-b",
                "instance-terminated-by-price",
                "2026-01-01T00:00:20Z",
            ),
            // Not interrupted: no notice for its node.
            status("i-c", "fulfilled", "2026-01-01T00:00:00Z"),
            // Interrupted, but no Node is backed by it (never registered, or gone already).
            status("i-z", "marked-for-termination", "2026-01-01T00:00:00Z"),
        ];
        let grouped = interruption_notices(&statuses, &nodes, &pods, now);
        assert_eq!(
            summary(&grouped),
            BTreeMap::from([
                (
                    ("ns", "mf"),
                    vec![("mf-t-0", at("2026-01-01T00:02:10Z")), ("mf-t-1", now)]
                ),
                (
                    ("other", "lda"),
                    vec![("lda-t-0", at("2026-01-01T00:02:10Z"))]
                ),
            ])
        );
        assert_eq!(
            grouped[&("ns".to_owned(), "mf".to_owned())][0]
                .node
                .as_deref(),
            Some("spot-a")
        );
        // Nothing interrupted: nothing at all.
        assert!(interruption_notices(&statuses[2..3], &nodes, &pods, now).is_empty());
    }

    #[test]
    fn several_statuses_of_one_instance_take_the_earliest_deadline() {
        let now = at("2026-01-01T00:00:30Z");
        let statuses = vec![
            status("i-a", "marked-for-stop", "2026-01-01T00:00:10Z"),
            status("i-a", "instance-stopped-by-price", "2026-01-01T00:00:20Z"),
        ];
        let grouped = interruption_notices(
            &statuses,
            &[node("spot-a", Some("aws:///us-east-1a/i-a"))],
            &[pod("ns", "mf-t-0", "mf", "spot-a")],
            now,
        );
        assert_eq!(
            summary(&grouped),
            BTreeMap::from([(("ns", "mf"), vec![("mf-t-0", now)])])
        );
    }

    #[test]
    fn backoff_doubles_up_to_a_minute() {
        let poll = Duration::from_secs(5);
        assert_eq!(backoff(poll, 1), Duration::from_secs(10));
        assert_eq!(backoff(poll, 2), Duration::from_secs(20));
        assert_eq!(backoff(poll, 9), MAX_BACKOFF);
        assert_eq!(
            backoff(Duration::from_secs(120), 3),
            Duration::from_secs(120)
        );
    }

    /// The watcher's poll step against the fake EC2: the instances come from the provisioner,
    /// the Nodes and pods from an in-memory view.
    #[tokio::test]
    async fn a_poll_notifies_exactly_the_pods_on_the_interrupted_instances_node() {
        let fake = fake();
        fake.set_now(Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap());
        let provisioner = Ec2Provisioner::new(fake.clone());
        let job = ec2_job();
        let spot = PoolKey::new("c5.xlarge", "us-east-1a", CapacityType::Spot);
        let wanted = wanted_for(&job, &BTreeMap::from([(spot, 2)]), &BTreeMap::new());
        provisioner
            .reconcile(&job, &wanted, &BTreeMap::new())
            .await
            .unwrap();
        let instances = fake.instances();
        let (spots, on_demand): (Vec<_>, Vec<_>) = instances
            .iter()
            .partition(|i| i.capacity_type == Ec2CapacityType::Spot);
        assert_eq!((spots.len(), on_demand.len()), (2, 1));
        let provider = |id: &str| format!("aws:///us-east-1a/{id}");
        let nodes = vec![
            node("spot-1", Some(&provider(&spots[0].instance_id))),
            node("spot-2", Some(&provider(&spots[1].instance_id))),
            node("od-1", Some(&provider(&on_demand[0].instance_id))),
        ];
        let pods = vec![
            pod("ns", "mf-t-0", "mf", "spot-1"),
            pod("ns", "mf-t-1", "mf", "spot-1"),
            pod("ns", "mf-t-2", "mf", "spot-2"),
            pod("ns", "mf-r-0", "mf", "od-1"),
        ];
        let mut off = ec2_job();
        off.metadata.uid = Some("uid-off".into());
        off.spec.provisioning.mode = ProvisioningMode::Cluster;
        let jobs = vec![Arc::new(job), Arc::new(off)];
        let now = at("2026-01-01T00:01:00Z");
        let step = async || {
            poll_notices(&provisioner, &jobs, &nodes, &pods, now)
                .await
                .unwrap()
        };

        assert!(step().await.is_empty(), "nothing interrupted yet");
        fake.set_now(Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 40).unwrap());
        assert!(fake.interrupt(&spots[0].instance_id, "marked-for-termination"));
        let calls_before = fake.calls().len();
        let grouped = step().await;
        assert_eq!(
            summary(&grouped),
            BTreeMap::from([(
                ("ns", "mf"),
                vec![
                    ("mf-t-0", at("2026-01-01T00:02:40Z")),
                    ("mf-t-1", at("2026-01-01T00:02:40Z")),
                ]
            )])
        );
        // One DescribeInstances per watched job, one DescribeSpotInstanceRequests for all.
        assert_eq!(
            fake.calls()[calls_before..],
            [
                Operation::DescribeInstances,
                Operation::DescribeSpotInstanceRequests
            ]
        );
    }
}
