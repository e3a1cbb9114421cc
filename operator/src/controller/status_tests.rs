//! Status computation tests.

use super::*;
use crate::{
    controller::plan::{CapacityDecision, ObservedPod, observe_pods},
    notices::Notice,
};
use ebbflow_crds::{BidAction, CapacityType, MAX_RECENT_DECISIONS, Phase, TrainingJobStatus};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;

fn pod(name: &str, ready: bool) -> Pod {
    let tier = if name.contains("-r-") {
        "reliable"
    } else {
        "transient"
    };
    let (phase, status) = if ready {
        ("Running", "True")
    } else {
        ("Pending", "False")
    };
    serde_yaml::from_str(&format!(
        r#"
metadata:
  name: {name}
  labels: {{ ebbflow.dev/tier: {tier} }}
  annotations: {{ ebbflow.dev/instance-type: c5.xlarge, ebbflow.dev/zone: us-east-1a, ebbflow.dev/capacity-type: spot }}
spec: {{ containers: [{{ name: runtime }}] }}
status:
  phase: {phase}
  conditions: [{{ type: Ready, status: "{status}" }}]
"#
    ))
    .unwrap()
}

fn at(seconds: i64) -> Timestamp {
    Timestamp::from_second(1_767_225_600 + seconds).unwrap()
}

fn compute(
    previous: Option<&TrainingJobStatus>,
    pods: &[ObservedPod<'_>],
    coordinator: &CoordinatorObservation,
    suspended: bool,
    now: Timestamp,
) -> TrainingJobStatus {
    compute_with(previous, pods, coordinator, suspended, (None, None), now)
}

/// As [`compute`] with a cost and an operator's stop.
fn compute_with(
    previous: Option<&TrainingJobStatus>,
    pods: &[ObservedPod<'_>],
    coordinator: &CoordinatorObservation,
    suspended: bool,
    (cost, stop): (
        Option<ebbflow_crds::CostStatus>,
        Option<crate::controller::stop::StopState>,
    ),
    now: Timestamp,
) -> TrainingJobStatus {
    compute_status(&StatusInput {
        previous,
        generation: Some(4),
        suspended,
        coordinator,
        cost,
        stop,
        now,
        ..input(pods)
    })
}

fn condition<'a>(status: &'a TrainingJobStatus, type_: &str) -> (&'a str, &'a str) {
    let c = status
        .condition(type_)
        .unwrap_or_else(|| panic!("{type_} missing"));
    (c.status.as_str(), c.reason.as_str())
}

fn reported(iteration: u64, finished: bool) -> CoordinatorObservation {
    CoordinatorObservation::Reported(CoordinatorStatus {
        stage: Some(2),
        iteration: Some(iteration),
        loss: Some(0.5),
        finished,
        ..CoordinatorStatus::default()
    })
}

#[test]
fn lifecycle_pending_provisioning_running_succeeded() {
    let pending = compute(None, &[], &CoordinatorObservation::NotQueried, false, at(0));
    assert_eq!(pending.phase, Some(Phase::Pending));
    assert_eq!(pending.observed_generation, Some(4));
    assert_eq!(
        condition(&pending, conditions::READY),
        ("False", reasons::PROVISIONING)
    );
    assert_eq!(
        condition(&pending, conditions::PROGRESSING),
        ("True", reasons::PROVISIONING)
    );

    let pods = [pod("mf-r-0", false)];
    let observed = observe_pods("mf", &pods, &[]);
    let provisioning = compute(
        Some(&pending),
        &observed,
        &CoordinatorObservation::NotQueried,
        false,
        at(5),
    );
    assert_eq!(provisioning.phase, Some(Phase::Provisioning));

    let pods = [
        pod("mf-r-0", true),
        pod("mf-t-0", true),
        pod("mf-t-1", false),
    ];
    let observed = observe_pods("mf", &pods, &[]);
    let running = compute(
        Some(&provisioning),
        &observed,
        &reported(3, false),
        false,
        at(10),
    );
    assert_eq!(running.phase, Some(Phase::Running));
    assert_eq!(
        condition(&running, conditions::READY),
        ("True", reasons::COORDINATOR_READY)
    );
    assert_eq!(
        condition(&running, conditions::DEGRADED),
        ("False", reasons::AS_EXPECTED)
    );
    assert_eq!(
        (running.stage, running.iteration, running.loss),
        (Some(2), Some(3), Some(0.5))
    );
    assert_eq!(running.start_time.as_ref().unwrap().0, at(10));
    let nodes = running.nodes.as_ref().unwrap();
    assert_eq!((nodes.reliable, nodes.transient, nodes.total), (1, 1, 2));
    assert_eq!(nodes.pools[0].pool.instance_type, "c5.xlarge");
    assert_eq!(nodes.pools[0].pool.capacity_type, CapacityType::Spot);

    let done = compute(
        Some(&running),
        &observed,
        &reported(10, true),
        false,
        at(20),
    );
    assert_eq!(done.phase, Some(Phase::Succeeded));
    assert_eq!(
        condition(&done, conditions::SUCCEEDED),
        ("True", reasons::STOP_CRITERION_MET)
    );
    assert_eq!(done.completion_time.as_ref().unwrap().0, at(20));
    // Succeeded is final: later observations do not move it or its completion time.
    let later = compute(
        Some(&done),
        &[],
        &CoordinatorObservation::NotQueried,
        false,
        at(30),
    );
    assert_eq!(later.phase, Some(Phase::Succeeded));
    assert_eq!(later.completion_time.as_ref().unwrap().0, at(20));
}

#[test]
fn unchanged_observations_keep_transition_times() {
    let pods = [pod("mf-r-0", true)];
    let observed = observe_pods("mf", &pods, &[]);
    let first = compute(None, &observed, &reported(1, false), false, at(0));
    let second = compute(Some(&first), &observed, &reported(1, false), false, at(60));
    assert_eq!(first, second, "identical inputs give an identical status");
}

#[test]
fn unreachable_coordinator_degrades_but_keeps_running() {
    let pods = [pod("mf-r-0", true)];
    let observed = observe_pods("mf", &pods, &[]);
    let running = compute(None, &observed, &reported(1, false), false, at(0));
    let unreachable =
        CoordinatorObservation::Unreachable("coordinator at http://x unreachable".into());
    let degraded = compute(Some(&running), &observed, &unreachable, false, at(5));
    assert_eq!(degraded.phase, Some(Phase::Running));
    assert_eq!(
        condition(&degraded, conditions::DEGRADED),
        ("True", reasons::COORDINATOR_UNREACHABLE)
    );
    assert_eq!(
        condition(&degraded, conditions::READY),
        ("False", reasons::COORDINATOR_UNREACHABLE)
    );
    assert_eq!(degraded.iteration, Some(1), "progress is kept, not reset");
}

#[test]
fn lost_node_degrades() {
    let pods = [pod("mf-r-0", true), pod("mf-t-0", true)];
    let notices = [Notice {
        pod: "mf-t-0".into(),
        node: Some("n".into()),
        leaves_at: at(0),
        source: crate::notices::NoticeSource::NodeGone,
    }];
    let observed = observe_pods("mf", &pods, &notices);
    let status = compute(None, &observed, &reported(1, false), false, at(0));
    assert_eq!(
        condition(&status, conditions::DEGRADED),
        ("True", reasons::NODE_LOST)
    );
    assert!(
        status
            .condition(conditions::DEGRADED)
            .unwrap()
            .message
            .contains("mf-t-0")
    );
}

/// A pod the scheduler finds no node for is named in the Degraded condition once it has waited
/// five minutes (spot capacity takes a minute or two to arrive), with the scheduler's reason.
#[test]
fn pods_that_cannot_be_scheduled_degrade_after_five_minutes() {
    let unschedulable = |name: &str, since: i64| {
        let mut pod = pod(name, false);
        pod.status = serde_json::from_value(serde_json::json!({
            "phase": "Pending",
            "conditions": [{
                "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                "message": "0/3 nodes are available: 3 Insufficient cpu.",
                "lastTransitionTime": at(since).to_string(),
            }],
        }))
        .unwrap();
        pod
    };
    let pods = [
        pod("mf-r-0", true),
        unschedulable("mf-t-1", 100),
        unschedulable("mf-t-0", 0),
    ];
    let observed = observe_pods("mf", &pods, &[]);
    let early = compute(None, &observed, &reported(1, false), false, at(299));
    assert_eq!(
        condition(&early, conditions::DEGRADED),
        ("False", reasons::AS_EXPECTED)
    );
    let late = compute(Some(&early), &observed, &reported(1, false), false, at(420));
    assert_eq!(
        condition(&late, conditions::DEGRADED),
        ("True", reasons::PODS_UNSCHEDULABLE)
    );
    let message = &late.condition(conditions::DEGRADED).unwrap().message;
    assert_eq!(
        message,
        "mf-t-0 and 1 more cannot be scheduled (for 7 min): 0/3 nodes are available: 3 Insufficient cpu."
    );
    assert_eq!(
        late.phase,
        Some(Phase::Running),
        "training goes on without them"
    );
    // the operator's --unschedulable-after-seconds shortens the wait; the pool's nodes that
    // are not Ready are named
    let soon = compute_status(&StatusInput {
        coordinator: &reported(1, false),
        unschedulable_after: 60,
        unready_nodes: BTreeMap::from([(
            "mf-t-0".to_owned(),
            vec!["spot-2 (not Ready: cni plugin not initialized)".to_owned()],
        )]),
        now: at(90),
        ..input(&observed)
    });
    assert_eq!(
        soon.condition(conditions::DEGRADED).unwrap().message,
        "mf-t-0 cannot be scheduled (for 90 s): 0/3 nodes are available: 3 Insufficient cpu.; \
         its pool's node spot-2 (not Ready: cni plugin not initialized)"
    );
}

/// A pod whose image cannot be pulled is named in the Degraded condition at once, with the
/// kubelet's reason and message (the image), ahead of the unreachable coordinator it causes.
#[test]
fn pods_the_kubelet_cannot_start_degrade_with_its_reason() {
    let waiting = |name: &str, reason: &str, message: &str| {
        let mut pod = pod(name, false);
        pod.status = serde_json::from_value(serde_json::json!({
            "phase": "Pending",
            "containerStatuses": [{
                "name": "runtime", "image": "example.com/ebbflow/runtime:nope", "imageID": "",
                "ready": false, "restartCount": 0,
                "state": {"waiting": {"reason": reason, "message": message}},
            }],
        }))
        .unwrap();
        pod
    };
    let message = "Back-off pulling image \"example.com/ebbflow/runtime:nope\"";
    let pods = [
        waiting("mf-r-0", "ImagePullBackOff", message),
        waiting("mf-t-0", "ImagePullBackOff", message),
        // still being created: not stuck
        waiting("mf-t-1", "ContainerCreating", ""),
    ];
    let observed = observe_pods("mf", &pods, &[]);
    let status = compute(
        None,
        &observed,
        &CoordinatorObservation::Unreachable("connection refused".into()),
        false,
        at(10),
    );
    assert_eq!(
        condition(&status, conditions::DEGRADED),
        ("True", reasons::PODS_NOT_STARTING)
    );
    assert_eq!(
        status.condition(conditions::DEGRADED).unwrap().message,
        format!("mf-r-0 and 1 more cannot start (ImagePullBackOff): {message}")
    );
    let creating = [waiting("mf-t-1", "ContainerCreating", "")];
    let observed = observe_pods("mf", &creating, &[]);
    let status = compute(None, &observed, &reported(1, false), false, at(10));
    assert_eq!(
        condition(&status, conditions::DEGRADED),
        ("False", reasons::AS_EXPECTED)
    );
}

#[test]
fn suspend_and_resume() {
    let suspended = compute(None, &[], &CoordinatorObservation::NotQueried, true, at(0));
    assert_eq!(suspended.phase, Some(Phase::Suspended));
    assert_eq!(
        condition(&suspended, conditions::SUSPENDED),
        ("True", reasons::SUSPENDED)
    );
    assert_eq!(
        condition(&suspended, conditions::READY),
        ("False", reasons::SUSPENDED)
    );
    let resumed = compute(
        Some(&suspended),
        &[],
        &CoordinatorObservation::NotQueried,
        false,
        at(5),
    );
    assert_eq!(resumed.phase, Some(Phase::Pending));
    assert_eq!(
        condition(&resumed, conditions::SUSPENDED),
        ("False", reasons::NOT_SUSPENDED)
    );
}

#[test]
fn invalid_spec_fails_with_the_field_in_the_message() {
    let status = compute_status(&StatusInput {
        generation: Some(2),
        validation: Err("spec.transient.minNodes: must not exceed maxNodes".into()),
        now: at(0),
        ..input(&[])
    });
    assert_eq!(status.phase, Some(Phase::Failed));
    assert_eq!(
        condition(&status, conditions::VALID),
        ("False", reasons::INVALID_SPEC)
    );
    assert_eq!(
        condition(&status, conditions::FAILED),
        ("True", reasons::INVALID_SPEC)
    );
    assert!(
        status
            .condition(conditions::VALID)
            .unwrap()
            .message
            .contains("spec.transient.minNodes")
    );
}

#[test]
fn decision_log_records_changes_and_stays_bounded() {
    let a = PoolKey::new("c5.xlarge", "us-east-1a", CapacityType::Spot);
    let b = PoolKey::new("m5.large", "us-east-1b", CapacityType::Spot);
    let before = BTreeMap::from([(a.clone(), 4)]);
    let after = BTreeMap::from([(a.clone(), 1), (b.clone(), 2)]);
    let decided = |reason: &str| CapacityDecision {
        transient: after.clone(),
        reason: reason.to_owned(),
        max_prices: BTreeMap::from([(b.clone(), 0.25)]),
        expected_cost_per_work: Some(0.5),
        app_model: None,
    };
    let changes = decision_changes(&before, &decided("Eviction"), at(0));
    assert_eq!(changes.len(), 2);
    assert_eq!(
        (changes[0].action, changes[0].count),
        (BidAction::Release, 3)
    );
    assert_eq!(
        (changes[1].action, changes[1].count),
        (BidAction::Acquire, 2)
    );
    assert_eq!(changes[1].pool.as_ref().unwrap().instance_type, "m5.large");
    assert_eq!(
        changes[1].max_price,
        Some(0.25),
        "acquisitions carry the bid"
    );
    assert_eq!(changes[0].max_price, None);
    assert_eq!(changes[1].expected_cost_per_work, Some(0.5));
    assert!(decision_changes(&after, &decided("Hold"), at(0)).is_empty());

    let mut status = TrainingJobStatus::default();
    for i in 0..(MAX_RECENT_DECISIONS + 5) {
        status = compute_status(&StatusInput {
            previous: Some(&status),
            decision_changes: decision_changes(&before, &decided(&format!("R{i}")), at(i as i64)),
            new_evictions: 1,
            now: at(i as i64),
            ..input(&[])
        });
    }
    assert_eq!(status.recent_decisions.len(), MAX_RECENT_DECISIONS);
    assert_eq!(
        status.recent_decisions.last().unwrap().reason,
        format!("R{}", MAX_RECENT_DECISIONS + 4)
    );
    assert_eq!(status.evictions, (MAX_RECENT_DECISIONS + 5) as u64);
}

fn with_stop(
    previous: Option<&TrainingJobStatus>,
    pods: &[ObservedPod<'_>],
    coordinator: &CoordinatorObservation,
    stop: Option<crate::controller::stop::StopState>,
    now: Timestamp,
) -> TrainingJobStatus {
    let cost = ebbflow_crds::CostStatus {
        spent: 2.5,
        ..ebbflow_crds::CostStatus::default()
    };
    compute_with(previous, pods, coordinator, false, (Some(cost), stop), now)
}

#[test]
fn operator_stops_end_in_success_or_for_the_budget_in_failure() {
    use crate::controller::stop::{Criterion, StopState};
    let pods = [pod("mf-r-0", true)];
    let observed = observe_pods("mf", &pods, &[]);
    let running = compute(None, &observed, &reported(3, false), false, at(0));
    let stop = |criterion, confirmed| StopState {
        criterion,
        message: "met".into(),
        requested_at: at(10),
        confirmed,
    };
    for criterion in [
        Criterion::TargetLoss,
        Criterion::WallClockLimit,
        Criterion::BudgetTotal,
    ] {
        // asked to stop: still running, the criterion recorded, the cost taken in
        let stopping = with_stop(
            Some(&running),
            &observed,
            &reported(4, false),
            Some(stop(criterion, false)),
            at(10),
        );
        assert_eq!(stopping.phase, Some(Phase::Running), "{criterion:?}");
        assert_eq!(stopping.stop_reason.as_deref(), Some(criterion.field()));
        assert_eq!(stopping.stop_requested_time.as_ref().unwrap().0, at(10));
        assert_eq!(stopping.cost.as_ref().unwrap().spent, 2.5);
        assert!(!is_final(Some(&stopping)));
        // confirmed
        let stopped = CoordinatorObservation::Reported(crate::coordinator::CoordinatorStatus {
            stopped: true,
            ..crate::coordinator::CoordinatorStatus::default()
        });
        let done = with_stop(
            Some(&stopping),
            &observed,
            &stopped,
            Some(stop(criterion, true)),
            at(20),
        );
        assert!(is_final(Some(&done)), "{criterion:?}: {done:?}");
        assert_eq!(done.completion_time.as_ref().unwrap().0, at(20));
        assert_eq!(done.stop_requested_time.as_ref().unwrap().0, at(10));
        if criterion.succeeds() {
            assert_eq!(done.phase, Some(Phase::Succeeded));
            assert_eq!(
                condition(&done, conditions::SUCCEEDED),
                ("True", criterion.reason())
            );
        } else {
            assert_eq!(done.phase, Some(Phase::Failed));
            assert_eq!(
                condition(&done, conditions::FAILED),
                ("True", reasons::BUDGET_EXHAUSTED)
            );
            assert_eq!(
                condition(&done, conditions::READY),
                ("False", reasons::BUDGET_EXHAUSTED)
            );
        }
        // and stays so on later reconciles with nothing more to say
        let later = with_stop(
            Some(&done),
            &observed,
            &CoordinatorObservation::NotQueried,
            None,
            at(30),
        );
        assert_eq!(later.phase, done.phase, "{criterion:?}");
        assert_eq!(later.completion_time, done.completion_time);
    }
}

#[test]
fn node_failures_in_a_row_back_off_and_start_again_after_ten_quiet_minutes() {
    let backoff = |n: u32| std::time::Duration::from_secs(5 * 2_u64.pow(n - 1));
    let mut failures = NodeFailures::default();
    assert_eq!(failures.hold_until(backoff, at(0)), None);
    failures.record(at(100), "exit code 1".into());
    assert_eq!(failures.count, 1);
    assert_eq!(failures.hold_until(backoff, at(101)), Some(at(105)));
    assert_eq!(
        failures.hold_until(backoff, at(105)),
        None,
        "over at its end"
    );
    failures.record(at(200), "exit code 2".into());
    failures.record(at(150), "an older pod's, seen late".into());
    assert_eq!(failures.count, 3);
    assert_eq!(failures.last, Some((at(200), "exit code 2".to_owned())));
    assert_eq!(failures.hold_until(backoff, at(201)), Some(at(220)));
    // a failure more than 10 minutes after the last starts the row again
    failures.record(at(200 + 601), "exit code 3".into());
    assert_eq!(failures.count, 1);
    assert_eq!(failures.hold_until(backoff, at(802)), Some(at(806)));
}

#[test]
fn allocations_are_the_alive_pods_per_pool_with_their_bid_and_price() {
    let mut pods = vec![
        pod("mf-r-0", true),
        pod("mf-t-0", true),
        pod("mf-t-1", false),
        pod("mf-t-2", true),
    ];
    for (pod, (bid, created)) in pods[1..]
        .iter_mut()
        .zip([("0.31", 100), ("0.3", 50), ("0.4", 10)])
    {
        pod.annotations_mut().insert(
            crate::controller::plan::MAX_PRICE_ANNOTATION.to_owned(),
            bid.to_owned(),
        );
        pod.metadata.creation_timestamp = Some(Time(at(created)));
    }
    let notices = [Notice {
        pod: "mf-t-2".into(),
        node: None,
        leaves_at: at(100),
        source: crate::notices::NoticeSource::AwsNodeTerminationHandler,
    }];
    let observed = observe_pods("mf", &pods, &notices);
    let pool = PoolKey::new("c5.xlarge", "us-east-1a", CapacityType::Spot);
    let status = compute_status(&StatusInput {
        prices: BTreeMap::from([(pool.clone(), 0.29)]),
        ..input(&observed)
    });
    // mf-t-2 is under notice: leaving, not held
    assert_eq!(
        status.allocations,
        [AllocationStatus {
            id: "c5.xlarge_us-east-1a_spot".to_owned(),
            pool: pool.0,
            count: 2,
            max_price: Some(0.3),
            price: Some(0.29),
            since: Some(Time(at(50))),
        }]
    );
    // no market: no price, the rest as before
    let status = compute_status(&input(&observed));
    assert_eq!(status.allocations[0].price, None);
    assert_eq!(status.allocations[0].count, 2);
}

/// A status input for a running job with `pods` and nothing else.
fn input<'a>(pods: &'a [ObservedPod<'a>]) -> StatusInput<'a> {
    StatusInput {
        previous: None,
        generation: Some(1),
        validation: Ok(()),
        suspended: false,
        reliable_count: 1,
        pods,
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
        node_failures: NodeFailures::default(),
        unschedulable_after: crate::controller::plan::UNSCHEDULABLE_AFTER_SECONDS,
        unready_nodes: BTreeMap::new(),
        now: at(200),
    }
}
