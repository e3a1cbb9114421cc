//! Plan tests from YAML fixtures.

use super::*;
use crate::notices::{Notice, NoticeSource};
use ebbflow_crds::CapacityTypePreset;
use k8s_openapi::jiff::Timestamp;

/// A job as a user writes it.
const JOB_YAML: &str = r#"
apiVersion: ebbflow.dev/v1alpha1
kind: TrainingJob
metadata:
  name: mf
  namespace: ml
  uid: 7d6c1c6e-0000-4000-8000-000000000001
  generation: 3
spec:
  app:
    kind: MatrixFactorization
    dataset:
      synthetic: { seed: 1, users: 100, items: 50, ratings: 1000, trueRank: 4 }
  stop: { iterations: 10 }
  reliable:
    count: 2
    instanceTypes: [m5.large]
    tolerations:
      - { key: dedicated, operator: Equal, value: ml, effect: NoSchedule }
  transient:
    maxNodes: 4
    instanceTypes: [c5.xlarge, m5.large]
    zones: [us-east-1a, us-east-1b]
    nodeSelector: { team: ml }
  bidding:
    market: { kind: trace, trace: prices.csv }
  runtime:
    image: ghcr.io/ebbflow/ebbflow-runtime:test
    terminationGracePeriodSeconds: 90
    resources:
      requests: { cpu: "2", memory: 4Gi }
"#;

fn job() -> TrainingJob {
    serde_yaml::from_str(JOB_YAML).unwrap()
}

fn config() -> PlanConfig {
    PlanConfig {
        default_image: "ghcr.io/ebbflow/ebbflow-runtime:default".to_owned(),
        capacity_label: CapacityTypeLabel::default().resolved(),
        network_policy: None,
    }
}

fn spot(instance_type: &str, zone: &str) -> PoolKey {
    PoolKey::new(instance_type, zone, CapacityType::Spot)
}

fn decision(pools: &[(PoolKey, u32)]) -> CapacityDecision {
    CapacityDecision {
        transient: pools.iter().cloned().collect(),
        reason: "Test".to_owned(),
        ..CapacityDecision::default()
    }
}

/// An existing pod of job `mf` as the API server would return it.
fn existing(name: &str, pool: Option<&PoolKey>, ready: bool, created: &str) -> Pod {
    let tier = if name.contains("-r-") {
        "reliable"
    } else {
        "transient"
    };
    let (instance_type, zone) =
        pool.map_or(("", ""), |p| (p.instance_type.as_str(), p.zone.as_str()));
    let phase = if ready { "Running" } else { "Pending" };
    let status = if ready { "True" } else { "False" };
    serde_yaml::from_str(&format!(
        r#"
metadata:
  name: {name}
  namespace: ml
  creationTimestamp: "{created}"
  labels: {{ ebbflow.dev/job: mf, ebbflow.dev/tier: {tier} }}
  annotations: {{ ebbflow.dev/instance-type: "{instance_type}", ebbflow.dev/zone: "{zone}", ebbflow.dev/capacity-type: spot }}
spec:
  nodeName: node-{name}
  containers: [{{ name: runtime }}]
status:
  phase: {phase}
  conditions: [{{ type: Ready, status: "{status}" }}]
"#
    ))
    .unwrap()
}

fn run_plan(
    job: &TrainingJob,
    pods: &[Pod],
    notices: &[Notice],
    decision: &CapacityDecision,
) -> Plan {
    plan(&PlanInput {
        job,
        pods,
        existing_token: None,
        existing_spec: None,
        fresh_token: "fresh",
        notices,
        decision,
        activity: Activity::Run,
        config: &config(),
    })
}

fn names(pods: &[Pod]) -> Vec<String> {
    pods.iter().map(|pod| pod.name_any()).collect()
}

fn deleted(plan: &Plan) -> Vec<(&str, DeleteReason)> {
    plan.delete
        .iter()
        .map(|d| (d.name.as_str(), d.reason))
        .collect()
}

#[test]
fn fresh_job_gets_secret_service_and_reliable_pods() {
    let job = job();
    let plan = run_plan(&job, &[], &[], &decision(&[]));
    assert_eq!(names(&plan.create), ["mf-r-0", "mf-r-1"]);
    assert!(plan.delete.is_empty());

    let coordinator = &plan.create[0];
    assert_eq!(
        coordinator
            .labels()
            .get(COORDINATOR_LABEL)
            .map(String::as_str),
        Some("true")
    );
    assert!(!plan.create[1].labels().contains_key(COORDINATOR_LABEL));
    let owner = &coordinator.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str()),
        ("TrainingJob", "mf")
    );
    assert_eq!(owner.controller, Some(true));

    let token = &plan.secret.data.as_ref().unwrap()[TOKEN_KEY];
    assert_eq!(token.0, b"fresh");
    assert_eq!(plan.secret.metadata.name.as_deref(), Some("mf-token"));

    let service = plan.service.spec.as_ref().unwrap();
    assert_eq!(
        plan.service.metadata.name.as_deref(),
        Some("mf-coordinator")
    );
    assert_eq!(service.cluster_ip.as_deref(), Some("None"));
    assert_eq!(
        service.selector.as_ref().unwrap()[COORDINATOR_LABEL],
        "true"
    );
    assert_eq!(service.publish_not_ready_addresses, Some(true));
}

#[test]
fn existing_token_is_preserved() {
    let job = job();
    let plan = plan(&PlanInput {
        job: &job,
        pods: &[],
        existing_token: Some("kept"),
        existing_spec: None,
        fresh_token: "fresh",
        notices: &[],
        decision: &decision(&[]),
        activity: Activity::Run,
        config: &config(),
    });
    assert_eq!(plan.secret.data.as_ref().unwrap()[TOKEN_KEY].0, b"kept");
}

/// The Secret name and key variable `name` of `pod` comes from.
fn secret_ref_of(pod: &Pod, name: &str) -> (String, String) {
    let var = pod.spec.as_ref().unwrap().containers[0]
        .env
        .iter()
        .flatten()
        .find(|e| e.name == name)
        .unwrap_or_else(|| panic!("{name} missing"));
    let from = var
        .value_from
        .as_ref()
        .and_then(|v| v.secret_key_ref.as_ref())
        .unwrap_or_else(|| panic!("{name} is not from a Secret"));
    (from.name.clone(), from.key.clone())
}

#[test]
fn the_spec_is_pinned_while_the_jobs_pods_exist() {
    let job = job();
    let current = serde_json::to_string(&job.spec).unwrap();
    let pinned_with = |pods: &[Pod], existing: Option<&str>| {
        let plan = plan(&PlanInput {
            job: &job,
            pods,
            existing_token: Some("kept"),
            existing_spec: existing,
            fresh_token: "fresh",
            notices: &[],
            decision: &decision(&[]),
            activity: Activity::Run,
            config: &config(),
        });
        let spec = String::from_utf8(plan.secret.data.as_ref().unwrap()[SPEC_KEY].0.clone());
        (spec.unwrap(), plan)
    };
    let running = [existing("mf-r-0", None, true, "2026-11-20T10:00:00Z")];
    // pods of the run exist: they and any new pod run the spec they started with
    let (spec, plan) = pinned_with(&running, Some("{\"pinned\": true}"));
    assert_eq!(spec, "{\"pinned\": true}");
    for pod in &plan.create {
        assert_eq!(
            secret_ref_of(pod, "EBBFLOW_JOB_SPEC"),
            ("mf-token".to_owned(), SPEC_KEY.to_owned())
        );
    }
    // no pods (a first start, a resume): the current spec
    assert_eq!(pinned_with(&[], Some("{\"pinned\": true}")).0, current);
    // a Secret from before pinning: the current spec
    assert_eq!(pinned_with(&running, None).0, current);
}

/// An edit of `reliable.count` while the job runs waits for the next start: the running
/// coordinator awaited the pinned count and would refuse a reliable node it did not start with.
#[test]
fn the_reliable_count_is_the_pinned_one_while_the_jobs_pods_exist() {
    let plan_with = |job: &TrainingJob, pods: &[Pod], pinned: &TrainingJob| {
        let pinned = serde_json::to_string(&pinned.spec).unwrap();
        plan(&PlanInput {
            job,
            pods,
            existing_token: Some("kept"),
            existing_spec: Some(&pinned),
            fresh_token: "fresh",
            notices: &[],
            decision: &decision(&[]),
            activity: Activity::Run,
            config: &config(),
        })
    };
    let (one, three) = (job().with_reliable(1), job().with_reliable(3));
    let reliable = |count: usize| -> Vec<Pod> {
        (0..count)
            .map(|i| existing(&format!("mf-r-{i}"), None, true, "2026-11-20T10:00:00Z"))
            .collect()
    };
    // Pinned at 1, edited up to 3: no pod the running coordinator would refuse.
    let up = plan_with(&three, &reliable(1), &one);
    assert!(up.create.is_empty(), "{:?}", names(&up.create));
    assert!(up.delete.is_empty());
    // Pinned at 3, edited down to 1: the running reliable pods stay.
    let down = plan_with(&one, &reliable(3), &three);
    assert!(down.delete.is_empty(), "{:?}", deleted(&down));
    assert!(down.create.is_empty());
    // At the next start (no pods) the edited count.
    assert_eq!(
        names(&plan_with(&three, &[], &one).create),
        ["mf-r-0", "mf-r-1", "mf-r-2"]
    );
}

#[test]
fn transient_pods_per_pool_carry_spot_placement() {
    let job = job();
    let a = spot("c5.xlarge", "us-east-1a");
    let b = spot("m5.large", "us-east-1b");
    let plan = run_plan(&job, &[], &[], &decision(&[(a.clone(), 2), (b.clone(), 1)]));
    assert_eq!(
        names(&plan.create),
        ["mf-r-0", "mf-r-1", "mf-t-0", "mf-t-1", "mf-t-2"]
    );

    let t2 = plan.create[4].spec.as_ref().unwrap();
    let selector = t2.node_selector.as_ref().unwrap();
    assert_eq!(selector["karpenter.sh/capacity-type"], "spot");
    assert_eq!(selector[INSTANCE_TYPE_NODE_LABEL], "m5.large");
    assert_eq!(selector[ZONE_NODE_LABEL], "us-east-1b");
    assert_eq!(selector["team"], "ml", "spec node selector merged");
    let toleration = &t2.tolerations.as_ref().unwrap()[0];
    assert_eq!(
        toleration.key.as_deref(),
        Some("karpenter.sh/capacity-type")
    );
    assert_eq!(toleration.value.as_deref(), Some("spot"));
    assert_eq!(pool_of(&plan.create[4]), b);
    assert_eq!(
        plan.create[4].labels()[POOL_LABEL],
        "m5.large_us-east-1b_spot"
    );
    assert_eq!(plan.create[2].labels()[TIER_LABEL], "transient");
}

#[test]
fn reliable_pods_pin_to_on_demand_under_every_preset() {
    let job = job();
    let plan = run_plan(&job, &[], &[], &decision(&[]));
    let spec = plan.create[0].spec.as_ref().unwrap();
    assert_eq!(
        spec.node_selector.as_ref().unwrap()["karpenter.sh/capacity-type"],
        "on-demand"
    );
    let tolerations = spec.tolerations.as_ref().unwrap();
    assert_eq!(
        tolerations.len(),
        1,
        "only the spec's toleration, no spot one"
    );
    let affinity = spec
        .affinity
        .as_ref()
        .unwrap()
        .node_affinity
        .as_ref()
        .unwrap();
    let terms = &affinity
        .required_during_scheduling_ignored_during_execution
        .as_ref()
        .unwrap()
        .node_selector_terms;
    let instance_types = &terms[0].match_expressions.as_ref().unwrap()[0];
    assert_eq!(instance_types.key, INSTANCE_TYPE_NODE_LABEL);
    assert_eq!(
        instance_types.values.as_deref(),
        Some(&["m5.large".to_owned()][..])
    );

    let eks = job
        .clone()
        .with_spec(|spec| spec.provisioning.capacity_type.preset = CapacityTypePreset::Eks);
    let plan = run_plan(&eks, &[], &[], &decision(&[(spot("", ""), 1)]));
    let reliable = plan.create[0]
        .spec
        .as_ref()
        .unwrap()
        .node_selector
        .clone()
        .unwrap();
    assert_eq!(reliable["eks.amazonaws.com/capacityType"], "ON_DEMAND");
    let transient = plan.create[2]
        .spec
        .as_ref()
        .unwrap()
        .node_selector
        .clone()
        .unwrap();
    assert_eq!(transient["eks.amazonaws.com/capacityType"], "SPOT");
    assert!(
        !transient.contains_key(INSTANCE_TYPE_NODE_LABEL),
        "pool of any type"
    );

    let gke = job
        .clone()
        .with_spec(|spec| spec.provisioning.capacity_type.preset = CapacityTypePreset::Gke);
    let plan = run_plan(&gke, &[], &[], &decision(&[]));
    let spec = plan.create[0].spec.as_ref().unwrap();
    assert!(
        spec.node_selector.is_none(),
        "GKE on-demand nodes lack the label"
    );
    let terms = &spec
        .affinity
        .as_ref()
        .unwrap()
        .node_affinity
        .as_ref()
        .unwrap()
        .required_during_scheduling_ignored_during_execution
        .as_ref()
        .unwrap()
        .node_selector_terms;
    let absent = &terms[0].match_expressions.as_ref().unwrap()[1];
    assert_eq!(
        (absent.key.as_str(), absent.operator.as_str()),
        ("cloud.google.com/gke-spot", "DoesNotExist")
    );
}

#[test]
fn operator_label_applies_when_the_spec_keeps_the_default() {
    let job = job();
    let mut config = config();
    config.capacity_label = ResolvedCapacityTypeLabel {
        key: "example.com/lifecycle".to_owned(),
        on_demand_value: Some("normal".to_owned()),
        spot_value: "cheap".to_owned(),
    };
    let plan = plan(&PlanInput {
        job: &job,
        pods: &[],
        existing_token: None,
        existing_spec: None,
        fresh_token: "t",
        notices: &[],
        decision: &decision(&[]),
        activity: Activity::Run,
        config: &config,
    });
    assert_eq!(
        plan.create[0]
            .spec
            .as_ref()
            .unwrap()
            .node_selector
            .as_ref()
            .unwrap()["example.com/lifecycle"],
        "normal"
    );
}

#[test]
fn pods_run_non_root_read_only_with_spec_grace_resources_and_token() {
    let job = job();
    let plan = run_plan(&job, &[], &[], &decision(&[]));
    let spec = plan.create[0].spec.as_ref().unwrap();
    assert_eq!(spec.termination_grace_period_seconds, Some(90));
    assert_eq!(spec.restart_policy.as_deref(), Some("Never"));
    let pod_security = spec.security_context.as_ref().unwrap();
    assert_eq!(pod_security.run_as_non_root, Some(true));
    let container = &spec.containers[0];
    let security = container.security_context.as_ref().unwrap();
    assert_eq!(security.read_only_root_filesystem, Some(true));
    assert_eq!(security.allow_privilege_escalation, Some(false));
    assert_eq!(
        container.image.as_deref(),
        Some("ghcr.io/ebbflow/ebbflow-runtime:test")
    );
    let requests = container
        .resources
        .as_ref()
        .unwrap()
        .requests
        .as_ref()
        .unwrap();
    assert_eq!(requests["cpu"].0, "2");
    let env = container.env.as_ref().unwrap();
    assert_eq!(
        secret_ref_of(&plan.create[0], "EBBFLOW_TOKEN"),
        ("mf-token".to_owned(), TOKEN_KEY.to_owned())
    );
    let role = env.iter().find(|e| e.name == "EBBFLOW_ROLE").unwrap();
    assert_eq!(role.value.as_deref(), Some("coordinator"));
    // ready once the admin port answers
    let probe = container.readiness_probe.as_ref().unwrap();
    assert_eq!(
        probe.tcp_socket.as_ref().unwrap().port,
        k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String("admin".into())
    );

    // Defaults when the spec says nothing.
    let bare = TrainingJob::test("bare");
    let plan = run_plan(&bare, &[], &[], &decision(&[]));
    let spec = plan.create[0].spec.as_ref().unwrap();
    assert_eq!(
        spec.termination_grace_period_seconds,
        Some(DEFAULT_GRACE_SECONDS)
    );
    assert_eq!(
        spec.containers[0].image.as_deref(),
        Some("ghcr.io/ebbflow/ebbflow-runtime:default")
    );
    assert!(
        spec.containers[0]
            .resources
            .as_ref()
            .unwrap()
            .requests
            .is_some()
    );
}

#[test]
fn steady_state_plans_no_pod_changes() {
    let job = job();
    let a = spot("c5.xlarge", "us-east-1a");
    let pods = vec![
        existing("mf-r-0", None, true, "2026-01-01T00:00:00Z"),
        existing("mf-r-1", None, true, "2026-01-01T00:00:00Z"),
        existing("mf-t-0", Some(&a), true, "2026-01-01T00:01:00Z"),
        existing("mf-t-1", Some(&a), true, "2026-01-01T00:01:00Z"),
    ];
    let plan = run_plan(&job, &pods, &[], &decision(&[(a, 2)]));
    assert!(plan.create.is_empty(), "{:?}", names(&plan.create));
    assert!(plan.delete.is_empty());
}

#[test]
fn scale_down_releases_unready_then_youngest_pods() {
    let job = job();
    let a = spot("c5.xlarge", "us-east-1a");
    let b = spot("m5.large", "us-east-1b");
    let pods = vec![
        existing("mf-r-0", None, true, "2026-01-01T00:00:00Z"),
        existing("mf-r-1", None, true, "2026-01-01T00:00:00Z"),
        existing("mf-t-0", Some(&a), true, "2026-01-01T00:01:00Z"),
        existing("mf-t-1", Some(&a), true, "2026-01-01T00:03:00Z"),
        existing("mf-t-2", Some(&a), false, "2026-01-01T00:00:30Z"),
        existing("mf-t-3", Some(&a), true, "2026-01-01T00:02:00Z"),
        existing("mf-t-4", Some(&b), true, "2026-01-01T00:02:00Z"),
    ];
    let plan = run_plan(&job, &pods, &[], &decision(&[(a, 2)]));
    assert!(plan.create.is_empty());
    assert_eq!(
        deleted(&plan),
        [
            ("mf-t-1", DeleteReason::ScaleDown),
            ("mf-t-2", DeleteReason::ScaleDown),
            ("mf-t-4", DeleteReason::ScaleDown),
        ]
    );

    // Fewer reliable nodes: the highest ordinals go.
    let smaller = job.clone().with_reliable(1);
    let plan = run_plan(&smaller, &pods[..2], &[], &decision(&[]));
    assert_eq!(deleted(&plan), [("mf-r-1", DeleteReason::ScaleDown)]);
}

#[test]
fn noticed_pods_are_replaced_under_fresh_ordinals_and_lost_ones_deleted() {
    let job = job();
    let a = spot("c5.xlarge", "us-east-1a");
    let pods = vec![
        existing("mf-r-0", None, true, "2026-01-01T00:00:00Z"),
        existing("mf-r-1", None, true, "2026-01-01T00:00:00Z"),
        existing("mf-t-0", Some(&a), true, "2026-01-01T00:01:00Z"),
        existing("mf-t-1", Some(&a), true, "2026-01-01T00:01:00Z"),
    ];
    let notice = |pod: &str, source| Notice {
        pod: pod.to_owned(),
        node: Some(format!("node-{pod}")),
        leaves_at: Timestamp::UNIX_EPOCH,
        source,
    };
    let notices = [
        notice("mf-t-0", NoticeSource::AwsNodeTerminationHandler),
        notice("mf-t-1", NoticeSource::NodeGone),
    ];
    let plan = run_plan(&job, &pods, &notices, &decision(&[(a, 2)]));
    // t-0 keeps running until its node goes; t-1's node is already gone.
    assert_eq!(deleted(&plan), [("mf-t-1", DeleteReason::Replace)]);
    assert_eq!(names(&plan.create), ["mf-t-2", "mf-t-3"]);
}

#[test]
fn finished_or_lost_reliable_pods_are_replaced_after_they_are_gone() {
    let job = job();
    let mut failed = existing("mf-r-1", None, false, "2026-01-01T00:00:00Z");
    failed.status.as_mut().unwrap().phase = Some("Failed".to_owned());
    let pods = vec![
        existing("mf-r-0", None, true, "2026-01-01T00:00:00Z"),
        failed,
    ];
    let plan = run_plan(&job, &pods, &[], &decision(&[]));
    assert_eq!(deleted(&plan), [("mf-r-1", DeleteReason::Replace)]);
    assert!(plan.create.is_empty(), "recreated once the old pod is gone");

    let plan = run_plan(&job, &pods[..1], &[], &decision(&[]));
    assert_eq!(names(&plan.create), ["mf-r-1"]);
}

#[test]
fn suspend_and_finish_release_every_pod_but_keep_secret_and_service() {
    let job = job();
    let a = spot("c5.xlarge", "us-east-1a");
    let mut deleting = existing("mf-t-1", Some(&a), true, "2026-01-01T00:01:00Z");
    deleting.metadata.deletion_timestamp = Some(
        k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Timestamp::UNIX_EPOCH),
    );
    let pods = vec![
        existing("mf-r-0", None, true, "2026-01-01T00:00:00Z"),
        existing("mf-t-0", Some(&a), true, "2026-01-01T00:01:00Z"),
        deleting,
    ];
    for (activity, reason) in [
        (Activity::Suspend, DeleteReason::Suspend),
        (Activity::Finished, DeleteReason::Finished),
    ] {
        let plan = plan(&PlanInput {
            job: &job,
            pods: &pods,
            existing_token: Some("kept"),
            existing_spec: None,
            fresh_token: "fresh",
            notices: &[],
            decision: &decision(&[(a.clone(), 4)]),
            activity,
            config: &config(),
        });
        assert!(plan.create.is_empty());
        assert_eq!(deleted(&plan), [("mf-r-0", reason), ("mf-t-0", reason)]);
        assert_eq!(plan.secret.data.as_ref().unwrap()[TOKEN_KEY].0, b"kept");
    }
}

#[test]
fn pool_slugs_are_valid_label_values() {
    assert_eq!(pool_slug(&spot("", "")), "any_any_spot");
    let long = spot(&"x".repeat(64), "us-east-1a");
    let slug = pool_slug(&long);
    assert!(slug.len() <= 63, "{slug}");
    assert_ne!(slug, pool_slug(&spot(&"x".repeat(63), "us-east-1a")));
}

#[test]
fn an_apply_is_skipped_only_when_it_would_change_nothing() {
    let job = job();
    let desired = build_service(&job);
    assert!(!already_applied(&desired, None), "absent: apply");

    // What the API server returns: our fields plus defaults and another manager's.
    let mut observed: Service = serde_json::from_value(serde_json::json!({
        "metadata": { "resourceVersion": "7", "uid": "x", "annotations": { "team": "ml" } },
        "spec": {
            "ports": [
                { "port": 7070, "targetPort": 7070 },
                { "port": 7071, "targetPort": 7071 }
            ],
            "sessionAffinity": "None",
            "type": "ClusterIP"
        }
    }))
    .unwrap();
    let mut merged = serde_json::to_value(&desired).unwrap();
    json_merge(&mut merged, serde_json::to_value(&observed).unwrap());
    observed = serde_json::from_value(merged).unwrap();
    assert!(
        already_applied(&desired, Some(&observed)),
        "{}\n{}",
        serde_json::to_string(&desired).unwrap(),
        serde_json::to_string(&observed).unwrap()
    );

    // A user's edit of a field we own, a removed label, a dropped port: apply again.
    let mut selector_edited = observed.clone();
    selector_edited
        .spec
        .as_mut()
        .unwrap()
        .selector
        .as_mut()
        .unwrap()
        .insert(JOB_LABEL.into(), "other".into());
    assert!(!already_applied(&desired, Some(&selector_edited)));
    let mut label_removed = observed.clone();
    label_removed.labels_mut().remove(JOB_LABEL);
    assert!(!already_applied(&desired, Some(&label_removed)));
    let mut port_dropped = observed.clone();
    port_dropped
        .spec
        .as_mut()
        .unwrap()
        .ports
        .as_mut()
        .unwrap()
        .pop();
    assert!(!already_applied(&desired, Some(&port_dropped)));

    // A Secret with another token is not ours as planned.
    let secret = build_secret(&job, "abc", "{}");
    assert!(already_applied(&secret, Some(&secret.clone())));
    assert!(!already_applied(
        &secret,
        Some(&build_secret(&job, "abd", "{}"))
    ));
}

/// Deep-merges `extra` into `base` (objects by key, arrays element by element).
fn json_merge(base: &mut serde_json::Value, extra: serde_json::Value) {
    use serde_json::Value;
    match (base, extra) {
        (Value::Object(base), Value::Object(extra)) => {
            for (key, value) in extra {
                match base.get_mut(&key) {
                    Some(slot) => json_merge(slot, value),
                    None => {
                        base.insert(key, value);
                    }
                }
            }
        }
        (Value::Array(base), Value::Array(extra)) => {
            for (slot, value) in base.iter_mut().zip(extra) {
                json_merge(slot, value);
            }
        }
        (base, extra) => *base = extra,
    }
}

/// The coordinator pod's PodDisruptionBudget: no eviction without a checkpoint (the coordinator
/// holds the only consistent copy), one with (it checkpoints on SIGTERM and resumes).
#[test]
fn the_coordinator_pod_is_protected_from_eviction_unless_it_checkpoints() {
    let mut job = job();
    let plan = run_plan(&job, &[], &[], &decision(&[]));
    let budget = &plan.disruption_budget;
    assert_eq!(budget.metadata.name.as_deref(), Some("mf-coordinator"));
    assert_eq!(
        budget.metadata.owner_references.as_ref().unwrap()[0].name,
        "mf"
    );
    let spec = budget.spec.as_ref().unwrap();
    assert_eq!(spec.min_available, Some(IntOrString::Int(1)));
    assert_eq!(spec.max_unavailable, None, "needs a scale subresource");
    assert_eq!(
        spec.unhealthy_pod_eviction_policy.as_deref(),
        Some("AlwaysAllow")
    );
    let selector = spec
        .selector
        .as_ref()
        .unwrap()
        .match_labels
        .clone()
        .unwrap();
    assert_eq!(
        selector,
        BTreeMap::from([
            (JOB_LABEL.to_owned(), "mf".to_owned()),
            (COORDINATOR_LABEL.to_owned(), "true".to_owned()),
        ])
    );
    // It selects the coordinator pod and no other.
    let selects = |pod: &Pod| selector.iter().all(|(k, v)| pod.labels().get(k) == Some(v));
    let selected: Vec<String> = plan
        .create
        .iter()
        .filter(|p| selects(p))
        .map(|p| p.name_any())
        .collect();
    assert_eq!(selected, ["mf-r-0"]);

    job.spec.runtime.checkpoint = Some(ebbflow_crds::CheckpointSpec {
        claim_name: "mf-checkpoints".into(),
        interval: None,
    });
    let plan = run_plan(&job, &[], &[], &decision(&[]));
    let spec = plan.disruption_budget.spec.unwrap();
    assert_eq!(spec.min_available, Some(IntOrString::Int(0)));
}

/// The per-job NetworkPolicy: the job's pods reach each other's data and admin ports, the
/// operator's pods (in their namespace) the admin port, anyone the metrics port; nothing else.
/// Each port a runtime pod declares is one the policy names, and the admin port is only on the
/// coordinator pod.
#[test]
fn a_jobs_network_policy_admits_its_own_pods_the_operator_and_scrapers() {
    let job = job().with_reliable(2);
    let decided = decision(&[(spot("p3.2xlarge", "us-west-2a"), 1)]);
    assert!(run_plan(&job, &[], &[], &decided).network_policy.is_none());
    let operator = OperatorPeer::parse(
        "ebbflow-system",
        "app.kubernetes.io/name=ebbflow, app.kubernetes.io/component=operator",
    )
    .unwrap();
    let config = PlanConfig {
        network_policy: Some(operator.clone()),
        ..config()
    };
    let plan = plan(&PlanInput {
        job: &job,
        pods: &[],
        existing_token: None,
        existing_spec: None,
        fresh_token: "fresh",
        notices: &[],
        decision: &decided,
        activity: Activity::Run,
        config: &config,
    });
    let policy = plan.network_policy.as_ref().unwrap();
    assert_eq!(policy.metadata.name.as_deref(), Some("mf-coordinator"));
    assert_eq!(
        policy.metadata.owner_references.as_ref().unwrap()[0].name,
        "mf"
    );
    let spec = policy.spec.as_ref().unwrap();
    assert_eq!(
        spec.policy_types.as_deref(),
        Some(&["Ingress".to_owned()][..])
    );
    let job_pods = BTreeMap::from([
        (JOB_LABEL.to_owned(), "mf".to_owned()),
        (
            "app.kubernetes.io/managed-by".to_owned(),
            MANAGED_BY.to_owned(),
        ),
    ]);
    let selected = spec
        .pod_selector
        .as_ref()
        .unwrap()
        .match_labels
        .as_ref()
        .unwrap();
    assert_eq!(selected, &job_pods);
    // Every pod of the plan is selected.
    assert_eq!(plan.create.len(), 3);
    for pod in &plan.create {
        assert!(
            job_pods.iter().all(|(k, v)| pod.labels().get(k) == Some(v)),
            "{} is not selected",
            pod.name_any()
        );
    }
    let ports = |rule: &k8s_openapi::api::networking::v1::NetworkPolicyIngressRule| -> Vec<i32> {
        rule.ports
            .iter()
            .flatten()
            .map(|p| match p.port.as_ref().unwrap() {
                IntOrString::Int(port) => *port,
                other => panic!("a named port {other:?}"),
            })
            .collect()
    };
    let rules = spec.ingress.as_ref().unwrap();
    assert_eq!(rules.len(), 3);
    // The job's own pods: admin and data.
    let from = rules[0].from.as_ref().unwrap();
    assert_eq!(from.len(), 1);
    assert_eq!(
        from[0].pod_selector.as_ref().unwrap().match_labels.as_ref(),
        Some(&job_pods)
    );
    assert!(from[0].namespace_selector.is_none(), "same namespace only");
    assert_eq!(ports(&rules[0]), [7070, 7071]);
    // The operator: admin, from its namespace and pods only.
    let from = rules[1].from.as_ref().unwrap();
    assert_eq!(
        from[0]
            .namespace_selector
            .as_ref()
            .unwrap()
            .match_labels
            .as_ref()
            .unwrap()["kubernetes.io/metadata.name"],
        "ebbflow-system"
    );
    assert_eq!(
        from[0].pod_selector.as_ref().unwrap().match_labels.as_ref(),
        Some(&operator.pod_labels)
    );
    assert_eq!(ports(&rules[1]), [7070]);
    // Scrapers: the metrics port alone, from anywhere.
    assert!(rules[2].from.is_none());
    assert_eq!(ports(&rules[2]), [7072]);
    // The ports the pods declare: the admin API on the coordinator pod only.
    for pod in &plan.create {
        let declared: Vec<(String, i32)> = pod.spec.as_ref().unwrap().containers[0]
            .ports
            .iter()
            .flatten()
            .map(|p| (p.name.clone().unwrap(), p.container_port))
            .collect();
        let coordinator = pod
            .labels()
            .get(COORDINATOR_LABEL)
            .is_some_and(|v| v == "true");
        let expected: Vec<(String, i32)> = if coordinator {
            vec![
                ("admin".into(), 7070),
                ("data".into(), 7071),
                ("metrics".into(), 7072),
            ]
        } else {
            vec![("data".into(), 7071), ("metrics".into(), 7072)]
        };
        assert_eq!(declared, expected, "{}", pod.name_any());
        let probe = pod.spec.as_ref().unwrap().containers[0]
            .readiness_probe
            .as_ref()
            .unwrap();
        let probed = probe.tcp_socket.as_ref().unwrap().port.clone();
        assert!(
            declared
                .iter()
                .any(|(name, _)| IntOrString::String(name.clone()) == probed),
            "{} probes an undeclared port {probed:?}",
            pod.name_any()
        );
    }
}

#[test]
fn operator_pod_selectors_are_parsed_or_refused_by_name() {
    let peer = OperatorPeer::parse("ops", "a=b,c=d").unwrap();
    assert_eq!(peer.namespace, "ops");
    assert_eq!(peer.pod_labels.len(), 2);
    for bad in ["", "a", "a=b,c", "=b", "a!=b", "a==b"] {
        let error = OperatorPeer::parse("ops", bad).unwrap_err();
        assert!(error.contains("operator pod selector"), "{bad:?}: {error}");
    }
}

#[test]
fn the_coordinator_pod_alone_mounts_the_checkpoint_claim() {
    let mut job = job().with_reliable(2);
    job.spec.runtime.checkpoint = Some(ebbflow_crds::CheckpointSpec {
        claim_name: "mf-checkpoints".into(),
        interval: Some(ebbflow_crds::DurationString::new("5m").unwrap()),
    });
    let uid = job.metadata.uid.clone().unwrap();
    let plan = run_plan(
        &job,
        &[],
        &[],
        &decision(&[(spot("c5.xlarge", "us-east-1a"), 1)]),
    );
    let env_of = |pod: &Pod, name: &str| {
        pod.spec.as_ref().unwrap().containers[0]
            .env
            .as_ref()
            .unwrap()
            .iter()
            .find(|e| e.name == name)
            .and_then(|e| e.value.clone())
    };
    let claim_of = |pod: &Pod| {
        let spec = pod.spec.as_ref().unwrap();
        let volume = spec
            .volumes
            .iter()
            .flatten()
            .find(|v| v.name == "checkpoint")?;
        let mount = spec.containers[0]
            .volume_mounts
            .iter()
            .flatten()
            .find(|m| m.name == "checkpoint")?;
        let claim = volume.persistent_volume_claim.as_ref()?;
        Some((
            claim.claim_name.clone(),
            claim.read_only,
            mount.mount_path.clone(),
        ))
    };
    let coordinator = &plan.create[0];
    assert_eq!(
        env_of(coordinator, "EBBFLOW_ROLE").as_deref(),
        Some("coordinator")
    );
    assert_eq!(
        env_of(coordinator, "EBBFLOW_CHECKPOINT"),
        Some(format!("{CHECKPOINT_DIR}/{uid}.ckpt"))
    );
    assert_eq!(
        env_of(coordinator, "EBBFLOW_CHECKPOINT_INTERVAL_SECONDS").as_deref(),
        Some("300")
    );
    assert_eq!(
        claim_of(coordinator),
        Some(("mf-checkpoints".into(), Some(false), CHECKPOINT_DIR.into()))
    );
    for pod in &plan.create[1..] {
        assert_eq!(
            env_of(pod, "EBBFLOW_CHECKPOINT"),
            None,
            "{}",
            pod.name_any()
        );
        assert_eq!(claim_of(pod), None);
    }
    // without the field, nothing
    let plain = run_plan(&self::job(), &[], &[], &decision(&[]));
    assert_eq!(env_of(&plain.create[0], "EBBFLOW_CHECKPOINT"), None);
    assert_eq!(claim_of(&plain.create[0]), None);
}

#[test]
fn node_failures_are_crashes_not_spot_ends_nor_the_coordinator() {
    let a = spot("c5.xlarge", "us-east-1a");
    let failed = |name: &str, reason: Option<&str>| {
        let mut pod = existing(name, Some(&a), false, "2026-01-01T00:01:00Z");
        pod.status = serde_json::from_value(serde_json::json!({
            "phase": "Failed",
            "reason": reason,
            "containerStatuses": [{
                "name": "runtime", "image": "i", "imageID": "", "ready": false,
                "restartCount": 0,
                "state": {"terminated": {
                    "exitCode": 1, "message": "Error: no shard 3\n",
                    "finishedAt": "2026-01-01T00:02:00Z",
                }},
            }],
        }))
        .unwrap();
        pod
    };
    let mut coordinator = failed("mf-r-0", None);
    coordinator
        .metadata
        .labels
        .get_or_insert_default()
        .insert(COORDINATOR_LABEL.to_owned(), "true".to_owned());
    let pods = vec![
        coordinator,
        failed("mf-t-0", None),
        failed("mf-t-1", Some("NodeShutdown")),
        failed("mf-t-2", None),
    ];
    let notices = [Notice {
        pod: "mf-t-2".to_owned(),
        node: None,
        leaves_at: Timestamp::UNIX_EPOCH,
        source: NoticeSource::AwsNodeTerminationHandler,
    }];
    let observed = observe_pods("mf", &pods, &notices);
    let failures: Vec<(&str, PodFailure)> = observed
        .iter()
        .filter_map(|pod| Some((pod.name, node_failure(pod)?)))
        .collect();
    assert_eq!(
        failures,
        [(
            "mf-t-0",
            PodFailure {
                message: "exit code 1: Error: no shard 3".to_owned(),
                at: Some("2026-01-01T00:02:00Z".parse().unwrap()),
            }
        )]
    );
    assert_eq!(
        coordinator_failure(&observed[0]).as_deref(),
        Some("exit code 1: Error: no shard 3")
    );

    // held back: every node pod of a plan, not the coordinator's
    let mut plan = run_plan(
        &job(),
        &[],
        &[],
        &decision(&[(spot("c5.xlarge", "us-east-1a"), 2)]),
    );
    assert!(plan.create.len() > 1);
    let held = hold_node_pods(&mut plan.create);
    assert_eq!(names(&plan.create), ["mf-r-0"]);
    assert!(held >= 2, "{held}");
}

/// The coordinator's failures end the job after three in a row, so only its runtime's own
/// count: not its node's end, the kubelet's eviction under node pressure, a notice against it,
/// nor the kubelet refusing it at admission (no container ran). A node pod refused at admission
/// is still a failure (its replacements wait out the backoff), named by the kubelet's reason.
#[test]
fn only_the_coordinators_own_failures_count_and_messages_name_the_exit() {
    let with_status = |name: &str, status: serde_json::Value| {
        let mut pod = existing(name, None, true, "2026-01-01T00:01:00Z");
        pod.metadata
            .labels
            .get_or_insert_default()
            .insert(COORDINATOR_LABEL.to_owned(), "true".to_owned());
        pod.status = serde_json::from_value(status).unwrap();
        pod
    };
    let terminated = |reason: Option<&str>, exit: i32, message: &str| {
        serde_json::json!({
            "phase": "Failed",
            "reason": reason,
            "containerStatuses": [{
                "name": "runtime", "image": "i", "imageID": "", "ready": false,
                "restartCount": 0,
                "state": {"terminated": {"exitCode": exit, "reason": "Error", "message": message}},
            }],
        })
    };
    let refused = serde_json::json!({
        "phase": "Failed",
        "reason": "OutOfcpu",
        "message": "Pod was rejected: Node didn't have enough resource: cpu",
    });
    let coordinator = |status| {
        let pods = [with_status("mf-r-0", status)];
        let observed = observe_pods("mf", &pods, &[]);
        coordinator_failure(&observed[0])
    };
    assert_eq!(
        coordinator(terminated(None, 1, "Error: bad dataset\n")).as_deref(),
        Some("exit code 1 (Error): Error: bad dataset")
    );
    for cluster in ["NodeShutdown", "Terminated", "Evicted"] {
        assert_eq!(
            coordinator(terminated(Some(cluster), 137, "")),
            None,
            "{cluster}"
        );
    }
    assert_eq!(coordinator(refused.clone()), None, "no container ran");
    // a notice against it (a drain): not its own failure either
    let pods = [with_status("mf-r-0", terminated(None, 143, ""))];
    let notices = [Notice {
        pod: "mf-r-0".to_owned(),
        node: None,
        leaves_at: Timestamp::UNIX_EPOCH,
        source: NoticeSource::PodDeletion,
    }];
    assert_eq!(
        coordinator_failure(&observe_pods("mf", &pods, &notices)[0]),
        None
    );

    // a node pod refused at admission is a failure, named by the kubelet
    let mut node_pod = existing(
        "mf-t-0",
        Some(&spot("c5.xlarge", "us-east-1a")),
        false,
        "2026-01-01T00:01:00Z",
    );
    node_pod.status = serde_json::from_value(refused).unwrap();
    let pods = [node_pod];
    let observed = observe_pods("mf", &pods, &[]);
    assert_eq!(
        node_failure(&observed[0]).map(|f| f.message).as_deref(),
        Some("OutOfcpu: Pod was rejected: Node didn't have enough resource: cpu")
    );
    // an OOMKill says so ahead of the log's tail
    let mut oom = pods[0].clone();
    oom.status = serde_json::from_value(serde_json::json!({
        "phase": "Failed",
        "containerStatuses": [{
            "name": "runtime", "image": "i", "imageID": "", "ready": false, "restartCount": 0,
            "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled", "message": "loading shard 3"}},
        }],
    }))
    .unwrap();
    assert_eq!(
        pod_failure(&oom).map(|f| f.message).as_deref(),
        Some("exit code 137 (OOMKilled): loading shard 3")
    );
}

/// Only notices about capacity mark a pool: a user deleting a pod, or the operator releasing
/// one, says nothing about the market (before, either moved a Standard job's whole transient
/// tier to another pool, and counted as an eviction for the application model).
#[test]
fn a_pool_is_under_notice_only_for_capacity_signals() {
    let (a, b, c) = (
        spot("c5.xlarge", "us-east-1a"),
        spot("c5.xlarge", "us-east-1b"),
        spot("c5.xlarge", "us-east-1c"),
    );
    let pods = [
        existing("mf-t-0", Some(&a), true, "2026-01-01T00:01:00Z"),
        existing("mf-t-1", Some(&b), true, "2026-01-01T00:01:00Z"),
        existing("mf-t-2", Some(&c), true, "2026-01-01T00:01:00Z"),
    ];
    let notice = |pod: &str, source| Notice {
        pod: pod.to_owned(),
        node: None,
        leaves_at: Timestamp::UNIX_EPOCH,
        source,
    };
    let notices = [
        notice("mf-t-0", NoticeSource::PodDeletion),
        notice("mf-t-1", NoticeSource::ScaleDown),
        notice("mf-t-2", NoticeSource::AwsNodeTerminationHandler),
    ];
    let observed = observe_pods("mf", &pods, &notices);
    assert_eq!(pools_under_notice(&observed), BTreeSet::from([c]));
    for source in NoticeSource::ALL {
        let expected = !matches!(
            source,
            NoticeSource::PodDeletion | NoticeSource::ScaleDown | NoticeSource::AwsMaintenance
        );
        assert_eq!(source.is_capacity_signal(), expected, "{source:?}");
    }
}

#[test]
fn transient_names_are_never_reused_within_a_job() {
    let a = spot("c5.xlarge", "us-east-1a");
    // t-0 and t-1 are gone (evicted, deleted); t-2 runs; the status saw ordinals up to 3
    let mut seen = job();
    seen.status.get_or_insert_default().next_transient_ordinal = 4;
    let pods = vec![
        existing("mf-r-0", None, true, "2026-01-01T00:00:00Z"),
        existing("mf-r-1", None, true, "2026-01-01T00:00:00Z"),
        existing("mf-t-2", Some(&a), true, "2026-01-01T00:01:00Z"),
    ];
    let plan = run_plan(&seen, &pods, &[], &decision(&[(a.clone(), 3)]));
    assert_eq!(names(&plan.create), ["mf-t-4", "mf-t-5"]);
    assert_eq!(
        next_transient_ordinal(4, &observe_pods("mf", &plan.create, &[])),
        6
    );
    // without a status, above every pod there is
    let plan = run_plan(&job(), &pods, &[], &decision(&[(a, 2)]));
    assert_eq!(names(&plan.create), ["mf-t-3"]);
    let observed = observe_pods("mf", &pods, &[]);
    assert_eq!(next_transient_ordinal(4, &observed), 4);
    assert_eq!(next_transient_ordinal(0, &observed), 3);
}

#[test]
fn reliable_pods_are_kept_from_voluntary_disruption_spot_pods_are_not() {
    let a = spot("c5.xlarge", "us-east-1a");
    let plan = run_plan(&job(), &[], &[], &decision(&[(a, 1)]));
    for pod in &plan.create {
        let annotation = pod.annotations().get(DO_NOT_DISRUPT_ANNOTATION).cloned();
        if pod.name_any().contains("-r-") {
            assert_eq!(annotation.as_deref(), Some("true"), "{}", pod.name_any());
        } else {
            assert_eq!(annotation, None, "{}", pod.name_any());
        }
    }
}

#[test]
fn spot_pods_record_their_bid_and_the_lowest_bid_per_pool_is_read_back() {
    let mut job = job();
    job.spec.provisioning.mode = ebbflow_crds::ProvisioningMode::Ec2;
    let a = spot("c5.xlarge", "us-east-1a");
    let b = spot("m5.large", "us-east-1b");
    let mut decided = decision(&[(a.clone(), 2), (b.clone(), 1)]);
    decided.max_prices.insert(a.clone(), 0.1234);
    let plan = run_plan(&job, &[], &[], &decided);
    let bid = |pod: &Pod| pod.annotations().get(MAX_PRICE_ANNOTATION).cloned();
    assert_eq!(bid(&plan.create[2]).as_deref(), Some("0.1234"));
    assert_eq!(bid(&plan.create[4]), None, "no bid decided for b");
    assert_eq!(bid(&plan.create[0]), None, "reliable pods bid nothing");
    // outside ec2 mode the cluster buys the capacity: no bid to record
    let mut cluster = job.clone();
    cluster.spec.provisioning.mode = ebbflow_crds::ProvisioningMode::Cluster;
    let plan = run_plan(&cluster, &[], &[], &decided);
    assert_eq!(bid(&plan.create[2]), None);

    // read back: the lowest readable bid among a pool's alive pods
    let mut pods = vec![
        existing("mf-t-0", Some(&a), true, "2026-11-23T10:00:00Z"),
        existing("mf-t-1", Some(&a), true, "2026-11-23T10:00:00Z"),
        existing("mf-t-2", Some(&a), true, "2026-11-23T10:00:00Z"),
        existing("mf-t-3", Some(&b), true, "2026-11-23T10:00:00Z"),
    ];
    for (pod, text) in pods.iter_mut().zip(["0.5", "0.25", "not a price", "-1"]) {
        pod.annotations_mut()
            .insert(MAX_PRICE_ANNOTATION.to_owned(), text.to_owned());
    }
    let observed = observe_pods("mf", &pods, &[]);
    assert_eq!(bids_per_pool(&observed), BTreeMap::from([(a, 0.25)]));
}

/// A pending pod's pool nodes that are not Ready are named with the kubelet's message, else
/// their not-ready taint; Ready nodes and nodes outside the pool are not.
#[test]
fn unready_pool_nodes_are_named_with_why() {
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "mf-t-0"},
        "spec": {"containers": [], "nodeSelector": {"topology.kubernetes.io/zone": "us-west-2c"}},
    }))
    .unwrap();
    let node = |name: &str, zone: &str, ready: Option<(&str, &str)>, taint: Option<&str>| -> Node {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "labels": {"topology.kubernetes.io/zone": zone}},
            "spec": {"taints": taint.map(|key| vec![serde_json::json!({"key": key, "effect": "NoSchedule"})])},
            "status": {"conditions": ready.map(|(status, message)| vec![serde_json::json!({
                "type": "Ready", "status": status, "message": message})])},
        }))
        .unwrap()
    };
    let nodes = [
        node(
            "b-no-cni",
            "us-west-2c",
            Some(("False", "cni plugin not initialized")),
            Some("node.kubernetes.io/not-ready"),
        ),
        node(
            "a-tainted",
            "us-west-2c",
            None,
            Some("node.kubernetes.io/unreachable"),
        ),
        node(
            "ready",
            "us-west-2c",
            Some(("True", "kubelet is posting ready status")),
            None,
        ),
        node("elsewhere", "us-west-2a", Some(("False", "down")), None),
        node("unknown", "us-west-2c", None, None),
    ];
    assert_eq!(
        unready_pool_nodes(&pod, &nodes),
        [
            "a-tainted (not Ready: tainted node.kubernetes.io/unreachable)",
            "b-no-cni (not Ready: cni plugin not initialized)",
        ]
    );
    // a pod with no node selector has no pool to speak of
    let mut anywhere = pod.clone();
    anywhere.spec.as_mut().unwrap().node_selector = None;
    assert!(unready_pool_nodes(&anywhere, &nodes).is_empty());
}

/// A transient pod that waited past the unschedulable wait marks its pool unplaceable, and
/// the pool stays avoided for UNPLACEABLE_WAITS waits after it was last seen so.
#[test]
fn pools_the_cluster_does_not_place_pods_in_are_remembered_for_a_while() {
    let pool = spot("p3.2xlarge", "us-west-2b");
    let mut pending = existing("mf-t-3", Some(&pool), false, "2026-01-01T00:00:00Z");
    pending.status = serde_json::from_value(serde_json::json!({
        "phase": "Pending",
        "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                        "lastTransitionTime": "2026-01-01T00:00:00Z"}],
    }))
    .unwrap();
    let pods = [pending];
    let observed = observe_pods("mf", &pods, &[]);
    let at = |s: i64| Timestamp::from_second(1_767_225_600 + s).unwrap();
    assert!(
        unplaceable_pools(&observed, at(19), 20).is_empty(),
        "not yet"
    );
    let found = unplaceable_pools(&observed, at(20), 20);
    assert_eq!(found, BTreeSet::from([pool.clone()]));
    let mut remembered = BTreeMap::new();
    assert_eq!(
        remember_unplaceable(&mut remembered, found, at(20), 20),
        BTreeSet::from([pool.clone()])
    );
    // the pod is gone: still avoided, until UNPLACEABLE_WAITS waits later
    let until = 20 + 20 * UNPLACEABLE_WAITS;
    assert_eq!(
        remember_unplaceable(&mut remembered, BTreeSet::new(), at(until - 1), 20),
        BTreeSet::from([pool])
    );
    assert!(remember_unplaceable(&mut remembered, BTreeSet::new(), at(until), 20).is_empty());
}
