//! Operator scenarios on the real control plane (issue 7), each asserting on object state:
//!
//! - a spot interruption signalled the AWS Node Termination Handler way and the Karpenter way (node
//!   taints) reaches a real coordinator on 127.0.0.1 before its deadline;
//! - suspend deletes the job's pods and says so in a condition; resume brings them back;
//! - an operator restart mid-job creates no duplicate pods;
//! - two operator replicas contend for the Lease and exactly one leads until it stops renewing;
//! - a node pod that keeps failing is warned about and replaced after its backoff;
//! - a drain (an eviction) cannot take the coordinator pod of a job without a checkpoint.
//!
//! Skipped (with a line saying so) unless `EBBFLOW_KUBECONFIG` is set (`scripts/e2e.sh`).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ebbflow_crds::TrainingJob;
use ebbflow_operator::controller;
use ebbflow_operator::controller::capacity::SpecCapacityPlanner;
use ebbflow_operator::leader::{LeaderElector, LeaseConfig};
use ebbflow_operator::notices::{KARPENTER_DISRUPTED_TAINT, NTH_SPOT_ITN_TAINT};
use ebbflow_runtime::app::EvalReport;
use ebbflow_runtime::coordinator::{Coordinator, CoordinatorConfig, router};
use ebbflow_runtime_api::JoinRequest;
use ebbflow_tests::cluster::{BoxError, FIELD_MANAGER, client_or_skip, install_crd, poll_until};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use kube::{Api, Client, ResourceExt};

async fn namespace(client: &Client, prefix: &str) -> Result<String, BoxError> {
    Ok(
        ebbflow_tests::cluster::TestNamespace::create(client, prefix)
            .await?
            .name()
            .to_owned(),
    )
}

async fn drop_namespace(client: &Client, name: &str) -> Result<(), BoxError> {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces.delete(name, &DeleteParams::default()).await?;
    Ok(())
}

/// The quickstart as job `name` in `namespace` with `spot` transient pods from the start.
async fn apply_job(
    client: &Client,
    namespace: &str,
    name: &str,
    spot: u32,
    suspend: bool,
) -> Result<(), BoxError> {
    let mut job = ebbflow_tests::cluster::quickstart_job(name, namespace)?;
    job.spec.transient.min_nodes = spot;
    job.spec.transient.max_nodes = spot.max(1);
    job.spec.suspend = suspend;
    let jobs: Api<TrainingJob> = Api::namespaced(client.clone(), namespace);
    jobs.patch(
        name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&job),
    )
    .await?;
    Ok(())
}

/// Live (not terminating) pods of job `name`.
async fn live_pods(pods: &Api<Pod>, name: &str) -> Result<Vec<Pod>, BoxError> {
    let selector = ListParams::default().labels(&format!("{}={name}", controller::plan::JOB_LABEL));
    Ok(pods
        .list(&selector)
        .await?
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect())
}

/// Waits for `count` scheduled live pods of job `name`.
async fn scheduled_pods(pods: &Api<Pod>, name: &str, count: usize) -> Result<Vec<Pod>, BoxError> {
    poll_until(
        &format!("{count} scheduled pods of {name}"),
        Duration::from_secs(60),
        || async {
            let live = live_pods(pods, name).await?;
            let scheduled = live
                .iter()
                .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some())
                .count();
            Ok((scheduled == count && live.len() == count).then_some(live))
        },
    )
    .await
}

/// The operator, reconciling the jobs of `namespace` only: the tests of this file run at once,
/// each with its own operator, and one must not act on another's job (its failures, notices
/// and backoffs live in the operator that saw them).
async fn operator_in(
    client: &Client,
    registry: &prometheus::Registry,
    namespace: &str,
    coordinator_url: &str,
) -> Result<tokio::sync::oneshot::Sender<()>, BoxError> {
    ebbflow_tests::operator::start_custom(
        client,
        registry,
        coordinator_url,
        ebbflow_tests::operator::Custom {
            capacity: Arc::new(SpecCapacityPlanner),
            ec2: None,
            namespace: Some(namespace.to_owned()),
        },
    )
    .await
}

/// Where jobs' coordinators are when the test runs none: a closed port on 127.0.0.1.
const NO_COORDINATOR: &str = "http://127.0.0.1:9";

/// Deletes job `job`, waits for it to be gone (its finalizer run by the operator), stops the
/// operator and drops namespace `ns`.
async fn delete_job_and_namespace(
    client: &Client,
    jobs: &Api<TrainingJob>,
    job: &str,
    ns: &str,
    stop: tokio::sync::oneshot::Sender<()>,
) -> Result<(), BoxError> {
    jobs.delete(job, &DeleteParams::default()).await?;
    poll_until("the job gone", Duration::from_secs(60), || async {
        Ok(jobs.get_opt(job).await?.is_none().then_some(()))
    })
    .await?;
    let _ = stop.send(());
    drop_namespace(client, ns).await
}

fn tier(pod: &Pod) -> &str {
    pod.labels()
        .get(controller::plan::TIER_LABEL)
        .map_or("", String::as_str)
}

fn node_of(pod: &Pod) -> String {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .unwrap_or_default()
}

async fn set_taint(nodes: &Api<Node>, node: &str, taint: Option<&str>) -> Result<(), BoxError> {
    ebbflow_tests::cluster::set_interruption_taint(nodes, node, taint).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interruptions_reach_a_coordinator_on_loopback_before_their_deadline()
-> Result<(), BoxError> {
    let test = "interruptions_reach_a_coordinator_on_loopback_before_their_deadline";
    let Some(client) = client_or_skip(test).await? else {
        return Ok(());
    };
    install_crd(&client).await?;
    let ns = namespace(&client, "e2e-notice").await?;

    // A real coordinator (the runtime's admin API) on 127.0.0.1, serving before the operator
    // starts (so it is never unreachable). Its admin secret is the job's token: the test creates
    // the job's token Secret itself, and the operator keeps an existing token.
    let job = "interrupted";
    let secret = "e2e-interruption-token".to_owned();
    ebbflow_tests::cluster::create_job_token(&client, &ns, job, &secret).await?;
    let coordinator = Coordinator::new(
        CoordinatorConfig {
            expected_nodes: 100,
            partitions: 4,
            clocks: 10,
            staleness: 0,
            secret: secret.clone(),
            specs: Vec::new(),
            evaluator: Arc::new(|_, _| EvalReport::default()),
            // no node serves data here: only the admin API is exercised
            tls: None,
        },
        prometheus::Registry::new(),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    let serving = coordinator.clone();
    tokio::spawn(async move { axum::serve(listener, router(serving)).await });
    let registry = prometheus::Registry::new();
    let stop = operator_in(&client, &registry, &ns, &url).await?;

    apply_job(&client, &ns, job, 2, false).await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let placed = scheduled_pods(&pods, job, 3).await?;
    let spot: Vec<&Pod> = placed.iter().filter(|p| tier(p) == "transient").collect();
    assert_eq!(spot.len(), 2);
    // The spot pods are the coordinator's nodes, joined under their pod names.
    let mut ids = Vec::new();
    for pod in &spot {
        let joined = coordinator
            .join(JoinRequest {
                name: pod.name_any(),
                data_addr: "127.0.0.1:1".into(),
                workers: 1,
                secret: secret.clone(),
                reliable: false,
                serves: true,
                job: String::new(),
            })
            .map_err(|e| e.to_string())?;
        ids.push(joined.node);
    }

    let nodes: Api<Node> = Api::all(client.clone());
    let cases = [
        (NTH_SPOT_ITN_TAINT, spot[0], ids[0]),
        (KARPENTER_DISRUPTED_TAINT, spot[1], ids[1]),
    ];
    let mut tainted = BTreeSet::new();
    for (taint, pod, id) in cases {
        let node = node_of(pod);
        tainted.insert(node.clone());
        let signalled = Instant::now();
        let signalled_unix = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs();
        set_taint(&nodes, &node, Some(taint)).await?;
        let deadline = poll_until(
            &format!(
                "the {taint} notice for pod {} at the coordinator",
                pod.name_any()
            ),
            Duration::from_secs(60),
            || {
                let coordinator = coordinator.clone();
                async move {
                    Ok(coordinator
                        .status(None)
                        .notices
                        .iter()
                        .find(|(node, _)| *node == id)
                        .map(|(_, deadline)| *deadline))
                }
            },
        )
        .await?;
        let arrived = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs();
        assert!(
            deadline > arrived,
            "{taint}: the notice arrived at {arrived}, after its deadline {deadline}"
        );
        assert!(
            deadline >= signalled_unix,
            "{taint}: deadline {deadline} before the signal at {signalled_unix}"
        );
        println!(
            "{taint}: notice at the coordinator {:.2} s after the taint, {} s before its deadline",
            signalled.elapsed().as_secs_f64(),
            deadline - arrived
        );
    }

    // Which path carried them: the relay (straight from the Node watch event) or a reconcile.
    // The coordinator records a notice before it answers, the operator counts it after: wait for
    // the count.
    let counted = |text: &str| -> f64 {
        text.lines()
            .filter(|l| l.starts_with("ebbflow_operator_notices_sent_total{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    let _ = poll_until("both notices counted", Duration::from_secs(10), || {
        let text = ebbflow_runtime::metrics::render(&registry);
        async move { Ok((counted(&text) >= 2.0).then_some(())) }
    })
    .await;
    let text = ebbflow_runtime::metrics::render(&registry);
    let sent = counted(&text);
    let relayed = text
        .lines()
        .find_map(|l| l.strip_prefix("ebbflow_operator_notices_relayed_total "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .unwrap_or(0.0);
    assert!(sent >= 2.0, "notices sent: {sent}\n{text}");
    println!("notices sent {sent}, of them by the relay {relayed}");

    for node in tainted {
        set_taint(&nodes, &node, None).await?;
    }
    let _ = stop.send(());
    drop_namespace(&client, &ns).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn suspend_resume_and_an_operator_restart_keep_pods_right() -> Result<(), BoxError> {
    let test = "suspend_resume_and_an_operator_restart_keep_pods_right";
    let Some(client) = client_or_skip(test).await? else {
        return Ok(());
    };
    install_crd(&client).await?;
    let ns = namespace(&client, "e2e-suspend").await?;
    let stop = operator_in(&client, &prometheus::Registry::new(), &ns, NO_COORDINATOR).await?;
    let job = "pausable";
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let jobs: Api<TrainingJob> = Api::namespaced(client.clone(), &ns);

    apply_job(&client, &ns, job, 1, false).await?;
    let before: BTreeSet<String> = scheduled_pods(&pods, job, 2)
        .await?
        .iter()
        .filter_map(|p| p.metadata.uid.clone())
        .collect();

    // An operator restart mid-job: the new one adopts the pods, creates no duplicates.
    let _ = stop.send(());
    let registry = prometheus::Registry::new();
    let stop = operator_in(&client, &registry, &ns, NO_COORDINATOR).await?;
    poll_until(
        "the restarted operator reconciled the job twice",
        Duration::from_secs(30),
        || async {
            let text = ebbflow_runtime::metrics::render(&registry);
            let reconciles = text
                .lines()
                .find_map(|l| l.strip_prefix("ebbflow_operator_reconciliations_total "))
                .and_then(|v| v.trim().parse::<f64>().ok())
                .unwrap_or(0.0);
            Ok((reconciles >= 2.0).then_some(()))
        },
    )
    .await?;
    let after: BTreeSet<String> = live_pods(&pods, job)
        .await?
        .iter()
        .filter_map(|p| p.metadata.uid.clone())
        .collect();
    assert_eq!(before, after, "the restart changed the job's pods");

    // Suspend: every pod goes and the Suspended condition says so.
    apply_job(&client, &ns, job, 1, true).await?;
    poll_until(
        "the suspended job without pods",
        Duration::from_secs(60),
        || async {
            let live = live_pods(&pods, job).await?;
            let status = jobs.get(job).await?.status.unwrap_or_default();
            let suspended = status
                .conditions
                .iter()
                .any(|c| c.type_ == "Suspended" && c.status == "True");
            Ok((live.is_empty() && suspended).then_some(()))
        },
    )
    .await?;

    // Resume: the pods come back.
    apply_job(&client, &ns, job, 1, false).await?;
    scheduled_pods(&pods, job, 2).await?;

    delete_job_and_namespace(&client, &jobs, job, &ns, stop).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_elect_one_leader() -> Result<(), BoxError> {
    let Some(client) = client_or_skip("two_replicas_elect_one_leader").await? else {
        return Ok(());
    };
    let ns = namespace(&client, "e2e-lease").await?;
    let config = |identity: &str| LeaseConfig {
        name: "ebbflow-operator".into(),
        namespace: ns.clone(),
        identity: identity.into(),
        lease_duration: Duration::from_secs(3),
        renew_deadline: Duration::from_secs(2),
        retry_period: Duration::from_millis(200),
    };
    let first = LeaderElector::new(client.clone(), config("replica-a"));
    let second = LeaderElector::new(client.clone(), config("replica-b"));
    assert!(
        first.try_acquire_or_renew().await,
        "the first replica leads"
    );
    assert!(
        !second.try_acquire_or_renew().await,
        "a second replica must not lead while the lease is held"
    );
    assert!(first.try_acquire_or_renew().await, "the leader renews");
    assert!(!second.try_acquire_or_renew().await);
    // The leader stops renewing (it crashed): the other takes over once the lease expires.
    let took_over = Instant::now();
    poll_until(
        "the standby to take over",
        Duration::from_secs(20),
        || async { Ok(second.try_acquire_or_renew().await.then_some(())) },
    )
    .await?;
    assert!(
        took_over.elapsed() >= Duration::from_secs(1),
        "the standby took over before the lease could expire"
    );
    assert!(
        !first.try_acquire_or_renew().await,
        "the old leader must not take the lease back"
    );
    // A leader that stops (SIGTERM, a rolling update) releases the lease: the standby takes it
    // at its next round, not after the lease would have expired.
    second.release().await;
    assert!(
        first.try_acquire_or_renew().await,
        "the released lease is free at once"
    );
    // A replica that finds the lease held by another stops leading at its next round.
    let lost = tokio::time::timeout(
        Duration::from_secs(5),
        second.keep(tokio::time::Instant::now()),
    )
    .await
    .map_err(|_| "keep() went on leading while another replica held the lease")?;
    assert!(
        matches!(&lost, ebbflow_operator::leader::LeaderError::Taken { holder, .. } if holder == "replica-a"),
        "{lost}"
    );
    drop_namespace(&client, &ns).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashing_spot_pod_is_warned_about_and_replaced_after_its_backoff() -> Result<(), BoxError>
{
    let test = "a_crashing_spot_pod_is_warned_about_and_replaced_after_its_backoff";
    let Some(client) = client_or_skip(test).await? else {
        return Ok(());
    };
    install_crd(&client).await?;
    let ns = namespace(&client, "e2e-crash").await?;
    let registry = prometheus::Registry::new();
    let stop = operator_in(&client, &registry, &ns, NO_COORDINATOR).await?;
    let job = "crashy";
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let jobs: Api<TrainingJob> = Api::namespaced(client.clone(), &ns);
    apply_job(&client, &ns, job, 1, false).await?;
    let spot = scheduled_pods(&pods, job, 2)
        .await?
        .into_iter()
        .find(|p| tier(p) == "transient")
        .expect("a spot pod");
    let spot_name = spot.name_any();
    let spot_uid = spot.metadata.uid.clone();

    // The kubelet's report of a crash: the container was OOMKilled after printing an error.
    let finished = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs();
    let finished_at = k8s_openapi::jiff::Timestamp::from_second(finished as i64)?;
    pods.patch_status(
        &spot_name,
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({
            "status": {
                "phase": "Failed",
                "containerStatuses": [{
                    "name": "runtime", "image": "ghcr.io/ebbflow/ebbflow-runtime:e2e",
                    "imageID": "", "ready": false, "restartCount": 0,
                    "state": {"terminated": {
                        "exitCode": 137, "reason": "OOMKilled",
                        "message": "loading shard 3: out of memory",
                        "finishedAt": finished_at.to_string(),
                    }},
                }],
            }
        })),
    )
    .await?;

    // Warned about on the job, counted in its status and the operator's metric.
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(client.clone(), &ns);
    let note = poll_until("a NodePodFailed event", Duration::from_secs(30), || async {
        Ok(events
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .find(|e| e.reason.as_deref() == Some("NodePodFailed"))
            .and_then(|e| e.note))
    })
    .await?;
    assert!(
        note.contains(&spot_name)
            && note.contains("exit code 137 (OOMKilled): loading shard 3: out of memory"),
        "{note}"
    );
    poll_until("status.nodeFailures 1", Duration::from_secs(30), || async {
        let status = jobs.get(job).await?.status.unwrap_or_default();
        Ok((status.node_failures == 1).then_some(()))
    })
    .await?;
    let text = ebbflow_runtime::metrics::render(&registry);
    assert!(
        text.contains("ebbflow_operator_node_pod_failures_total 1"),
        "{text}"
    );

    // An operator restart (or a new leader) carries the backoff on from the job's status.
    let _ = stop.send(());
    let registry = prometheus::Registry::new();
    let stop = operator_in(&client, &registry, &ns, NO_COORDINATOR).await?;

    // The replacement comes once the backoff after the failure (5 s after one) has passed.
    let replacement = poll_until(
        "the replacement spot pod",
        Duration::from_secs(60),
        || async {
            Ok(live_pods(&pods, job)
                .await?
                .into_iter()
                .find(|p| tier(p) == "transient" && p.metadata.uid != spot_uid))
        },
    )
    .await?;
    let created = replacement
        .metadata
        .creation_timestamp
        .as_ref()
        .expect("a creation time")
        .0
        .as_second() as u64;
    assert!(
        created >= finished + 5,
        "replacement created {} s after the failure",
        created as i64 - finished as i64
    );
    println!(
        "{spot_name} failed; {} replaced it {} s later, after an operator restart; event: {note}",
        replacement.name_any(),
        created - finished
    );
    let status = jobs.get(job).await?.status.unwrap_or_default();
    assert_eq!(
        status.node_failures, 1,
        "not counted again after the restart"
    );

    delete_job_and_namespace(&client, &jobs, job, &ns, stop).await
}

/// The API server's answer to an eviction of pod `name` (what `kubectl drain` asks): `Ok` if
/// the pod may go, else the status code (429 when a PodDisruptionBudget forbids it).
async fn evict(pods: &Api<Pod>, name: &str) -> Result<Result<(), u16>, BoxError> {
    match pods.evict(name, &kube::api::EvictParams::default()).await {
        Ok(_) => Ok(Ok(())),
        Err(kube::Error::Api(status)) => Ok(Err(status.code)),
        Err(other) => Err(other.into()),
    }
}

/// A drain cannot take the coordinator pod of a job without a checkpoint (its BackupPS copy is
/// the job's only consistent one): the eviction is refused by the job's PodDisruptionBudget as
/// computed by the real kube-controller-manager, while its spot pod may go. Once the job
/// checkpoints (the coordinator writes its copy on SIGTERM and its replacement resumes), the
/// coordinator pod may be evicted too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_cannot_evict_the_coordinator_of_a_job_without_a_checkpoint() -> Result<(), BoxError>
{
    use k8s_openapi::api::policy::v1::PodDisruptionBudget;
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    let test = "a_drain_cannot_evict_the_coordinator_of_a_job_without_a_checkpoint";
    let Some(client) = client_or_skip(test).await? else {
        return Ok(());
    };
    install_crd(&client).await?;
    let ns = namespace(&client, "e2e-drain").await?;
    let stop = operator_in(&client, &prometheus::Registry::new(), &ns, NO_COORDINATOR).await?;
    let job = "drained";
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let jobs: Api<TrainingJob> = Api::namespaced(client.clone(), &ns);
    let budgets: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), &ns);
    // Evictions through a client that takes a 429 for an answer.
    let evictions: Api<Pod> =
        Api::namespaced(ebbflow_tests::cluster::client_without_retries().await?, &ns);
    apply_job(&client, &ns, job, 1, false).await?;
    let live = scheduled_pods(&pods, job, 2).await?;
    let name_of = |tier_name: &str| {
        live.iter()
            .find(|p| tier(p) == tier_name)
            .map(|p| p.name_any())
            .ok_or(format!("no {tier_name} pod"))
    };
    let (coordinator, spot) = (name_of("reliable")?, name_of("transient")?);

    // The disruption controller has read the budget: it expects the one coordinator pod, and
    // counts it healthy once kwok has made it ready (a clean-clone CI run read the budget
    // between the two: expected 1, healthy 0).
    let budget_name = format!("{job}-coordinator");
    let budget = poll_until(
        "the coordinator's disruption budget, observed with its pod healthy",
        Duration::from_secs(60),
        || async {
            let Some(budget) = budgets.get_opt(&budget_name).await? else {
                return Ok(None);
            };
            let status = budget.status.clone().unwrap_or_default();
            let observed = status.observed_generation == budget.metadata.generation;
            Ok(
                (observed && status.expected_pods == 1 && status.current_healthy == 1)
                    .then_some(budget),
            )
        },
    )
    .await?;
    let spec = budget.spec.clone().unwrap_or_default();
    assert_eq!(spec.min_available, Some(IntOrString::Int(1)));
    let status = budget.status.unwrap_or_default();
    assert_eq!(
        (status.current_healthy, status.disruptions_allowed),
        (1, 0),
        "{status:?}"
    );
    assert_eq!(evict(&evictions, &coordinator).await?, Err(429));
    assert_eq!(
        evict(&evictions, &spot).await?,
        Ok(()),
        "a spot pod may be drained"
    );
    assert!(
        pods.get_opt(&coordinator)
            .await?
            .is_some_and(|p| p.metadata.deletion_timestamp.is_none()),
        "the coordinator pod stayed"
    );

    // With a checkpoint the coordinator may go (it writes its copy when told to stop).
    let mut checkpointed = ebbflow_tests::cluster::quickstart_job(job, &ns)?;
    checkpointed.spec.transient.min_nodes = 1;
    checkpointed.spec.transient.max_nodes = 1;
    checkpointed.spec.runtime.checkpoint = Some(ebbflow_crds::CheckpointSpec {
        claim_name: "drained-checkpoints".into(),
        interval: None,
    });
    jobs.patch(
        job,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&checkpointed),
    )
    .await?;
    poll_until(
        "the coordinator evicted once the job checkpoints",
        Duration::from_secs(60),
        || async { Ok(evict(&evictions, &coordinator).await?.ok()) },
    )
    .await?;
    let budget = budgets.get(&budget_name).await?;
    assert_eq!(
        budget.spec.unwrap_or_default().min_available,
        Some(IntOrString::Int(0))
    );

    delete_job_and_namespace(&client, &jobs, job, &ns, stop).await?;
    assert!(
        budgets.get_opt(&budget_name).await?.is_none(),
        "the budget went with its job"
    );
    Ok(())
}
