//! Eviction notices: a pure index from observed Nodes and Pods to deduplicated "instance X
//! leaves at T" notices, and a ledger of what was already delivered.
//!
//! Sources, earliest deadline wins when several apply to one pod:
//! - AWS Node Termination Handler taints (`aws-node-termination-handler/spot-itn`, scheduled
//!   maintenance, ASG lifecycle termination: two minutes after the taint; rebalance
//!   recommendation: ten minutes, EC2 gives no deadline for it);
//! - Karpenter's disruption taint (`karpenter.sh/disrupted`, and `karpenter.sh/disruption` of
//!   older releases): the pod's grace period after the taint;
//! - GKE's `cloud.google.com/impending-node-termination` taint: 30 seconds after the taint;
//! - a Node deletion timestamp: the pod's grace period after it;
//! - a Node that no longer exists: now (no notice was given);
//! - a pod `DisruptionTarget` condition: the grace period after it;
//! - a pod deletion timestamp: the timestamp itself (the API server adds the grace period);
//! - an EC2 spot interruption of an instance the operator launched itself (`provisioning.mode:
//!   ec2`), read from EC2 by the interruption watcher
//!   ([`crate::controller::interruptions`]) rather than from a Node: two minutes after the spot
//!   request was marked for termination, stop or hibernation; now once the instance is
//!   terminated or stopped.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::{
    api::core::v1::{Node, Pod, Taint},
    jiff::{SignedDuration, Timestamp},
};

/// The NTH taint for an EC2 spot interruption notice.
pub const NTH_SPOT_ITN_TAINT: &str = "aws-node-termination-handler/spot-itn";
/// The NTH taint for scheduled maintenance events.
pub const NTH_SCHEDULED_MAINTENANCE_TAINT: &str =
    "aws-node-termination-handler/scheduled-maintenance";
/// The NTH taint for ASG lifecycle termination.
pub const NTH_ASG_LIFECYCLE_TAINT: &str = "aws-node-termination-handler/asg-lifecycle-termination";
/// The NTH taint for an EC2 rebalance recommendation.
pub const NTH_REBALANCE_TAINT: &str = "aws-node-termination-handler/rebalance-recommendation";
/// Karpenter v1's disruption taint.
pub const KARPENTER_DISRUPTED_TAINT: &str = "karpenter.sh/disrupted";
/// Karpenter's disruption taint before v1 (value `disrupting`).
pub const KARPENTER_DISRUPTION_TAINT: &str = "karpenter.sh/disruption";
/// GKE's taint on a node about to be preempted or shut down.
pub const GKE_TERMINATION_TAINT: &str = "cloud.google.com/impending-node-termination";

/// EC2's spot interruption notice.
pub(crate) const EC2_NOTICE: SignedDuration =
    SignedDuration::from_secs(ebbflow_job::EC2_NOTICE.as_secs() as i64);
/// Rebalance recommendations carry no deadline; assume generously that one comes later.
const REBALANCE_NOTICE: SignedDuration = SignedDuration::from_secs(600);
/// GKE's preemption notice.
const GKE_NOTICE: SignedDuration = SignedDuration::from_secs(30);
/// Kubernetes' default pod termination grace period.
pub(crate) const DEFAULT_GRACE: SignedDuration = SignedDuration::from_secs(30);

/// Where a notice came from; also the `source` metric label.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum NoticeSource {
    /// An AWS Node Termination Handler spot-interruption taint.
    AwsNodeTerminationHandler,
    /// An AWS Node Termination Handler scheduled-maintenance or ASG-lifecycle taint: the
    /// instance goes, but not because the spot market takes it back (no refund, no signal about
    /// the pool's capacity).
    AwsMaintenance,
    /// An AWS Node Termination Handler rebalance-recommendation taint.
    AwsRebalanceRecommendation,
    /// Karpenter's disruption taint.
    KarpenterDisruption,
    /// GKE's impending-termination taint.
    GkeTermination,
    /// The Node has a deletion timestamp.
    NodeDeletion,
    /// The Node no longer exists: the instance left without notice.
    NodeGone,
    /// The pod carries a `DisruptionTarget` condition.
    PodDisruption,
    /// The pod has a deletion timestamp.
    PodDeletion,
    /// The operator itself releases the pod (scale-down, suspend).
    ScaleDown,
    /// EC2 interrupts the spot instance behind the pod's Node (the interruption watcher).
    Ec2SpotInterruption,
}

impl NoticeSource {
    /// The CamelCase name used in metrics, events and the coordinator API.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::AwsNodeTerminationHandler => "AwsNodeTerminationHandler",
            Self::AwsMaintenance => "AwsMaintenance",
            Self::AwsRebalanceRecommendation => "AwsRebalanceRecommendation",
            Self::KarpenterDisruption => "KarpenterDisruption",
            Self::GkeTermination => "GkeTermination",
            Self::NodeDeletion => "NodeDeletion",
            Self::NodeGone => "NodeGone",
            Self::PodDisruption => "PodDisruption",
            Self::PodDeletion => "PodDeletion",
            Self::ScaleDown => "ScaleDown",
            Self::Ec2SpotInterruption => "Ec2SpotInterruption",
        }
    }

    /// Whether a notice from this source says something about its pool's capacity (the provider
    /// or the cluster taking instances back, or warning that it will): not the operator's own
    /// release, nor a user deleting a pod. Only these make a pool look unsafe to the capacity
    /// planner and count as evictions for the application model.
    pub fn is_capacity_signal(self) -> bool {
        !matches!(
            self,
            Self::ScaleDown | Self::PodDeletion | Self::AwsMaintenance
        )
    }

    /// Every source, in declaration order.
    pub const ALL: [Self; 11] = [
        Self::AwsNodeTerminationHandler,
        Self::AwsMaintenance,
        Self::AwsRebalanceRecommendation,
        Self::KarpenterDisruption,
        Self::GkeTermination,
        Self::NodeDeletion,
        Self::NodeGone,
        Self::PodDisruption,
        Self::PodDeletion,
        Self::ScaleDown,
        Self::Ec2SpotInterruption,
    ];
}

/// "Pod `pod` (a runtime instance) leaves at `leaves_at`", from `source`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Notice {
    /// The runtime pod that goes away.
    pub pod: String,
    /// The node it runs on, if scheduled.
    pub node: Option<String>,
    /// When it goes away.
    pub leaves_at: Timestamp,
    /// Where the notice came from.
    pub source: NoticeSource,
}

/// What was observed about a node a job's pod is bound to.
#[derive(Clone, Debug)]
pub enum NodeObservation {
    /// The Node object exists.
    Present(Box<Node>),
    /// The Node object does not exist (deleted, or never registered).
    Gone,
}

/// Every notice for `pods`, one per pod (the earliest deadline), sorted by pod name.
/// `nodes` holds what was observed about each node the pods are bound to; a node missing from
/// the map was not observed and yields no notice.
pub fn notices(
    pods: &[Pod],
    nodes: &BTreeMap<String, NodeObservation>,
    now: Timestamp,
) -> Vec<Notice> {
    let mut earliest: BTreeMap<String, Notice> = BTreeMap::new();
    for pod in pods {
        let Some(pod_name) = pod.metadata.name.clone() else {
            continue;
        };
        let grace = pod_grace(pod);
        let node_name = pod.spec.as_ref().and_then(|spec| spec.node_name.clone());
        let mut candidates: Vec<(Timestamp, NoticeSource)> = pod_notices(pod, grace);
        if let Some(observation) = node_name.as_ref().and_then(|name| nodes.get(name)) {
            candidates.extend(node_notices(observation, grace, now));
        }
        let Some((leaves_at, source)) = candidates.into_iter().min() else {
            continue;
        };
        earliest.insert(
            pod_name.clone(),
            Notice {
                pod: pod_name,
                node: node_name,
                leaves_at,
                source,
            },
        );
    }
    earliest.into_values().collect()
}

/// The pod's termination grace period, defaulting like Kubernetes.
fn pod_grace(pod: &Pod) -> SignedDuration {
    pod.spec
        .as_ref()
        .and_then(|spec| spec.termination_grace_period_seconds)
        .map_or(DEFAULT_GRACE, SignedDuration::from_secs)
}

pub(crate) fn pod_notices(pod: &Pod, grace: SignedDuration) -> Vec<(Timestamp, NoticeSource)> {
    let mut found = Vec::new();
    if let Some(deletion) = &pod.metadata.deletion_timestamp {
        found.push((deletion.0, NoticeSource::PodDeletion));
    }
    let disruption = pod
        .status
        .as_ref()
        .and_then(|status| status.conditions.as_ref())
        .and_then(|conditions| {
            conditions
                .iter()
                .find(|c| c.type_ == "DisruptionTarget" && c.status == "True")
        });
    if let Some(condition) = disruption {
        let since = condition
            .last_transition_time
            .as_ref()
            .map(|time| time.0)
            .unwrap_or(Timestamp::UNIX_EPOCH);
        found.push((since + grace, NoticeSource::PodDisruption));
    }
    found
}

pub(crate) fn node_notices(
    observation: &NodeObservation,
    grace: SignedDuration,
    now: Timestamp,
) -> Vec<(Timestamp, NoticeSource)> {
    let node = match observation {
        NodeObservation::Gone => return vec![(now, NoticeSource::NodeGone)],
        NodeObservation::Present(node) => node,
    };
    let mut found = Vec::new();
    if let Some(deletion) = &node.metadata.deletion_timestamp {
        found.push((deletion.0 + grace, NoticeSource::NodeDeletion));
    }
    let taints = node
        .spec
        .as_ref()
        .and_then(|spec| spec.taints.as_deref())
        .unwrap_or_default();
    for taint in taints {
        if let Some((lead, source)) = taint_notice(taint, grace) {
            let added = taint.time_added.as_ref().map_or(now, |time| time.0);
            found.push((added + lead, source));
        }
    }
    found
}

/// The lead time and source a taint announces, if it announces a departure.
fn taint_notice(taint: &Taint, grace: SignedDuration) -> Option<(SignedDuration, NoticeSource)> {
    match taint.key.as_str() {
        NTH_SPOT_ITN_TAINT => Some((EC2_NOTICE, NoticeSource::AwsNodeTerminationHandler)),
        NTH_SCHEDULED_MAINTENANCE_TAINT | NTH_ASG_LIFECYCLE_TAINT => {
            Some((EC2_NOTICE, NoticeSource::AwsMaintenance))
        }
        NTH_REBALANCE_TAINT => Some((REBALANCE_NOTICE, NoticeSource::AwsRebalanceRecommendation)),
        KARPENTER_DISRUPTED_TAINT => Some((grace, NoticeSource::KarpenterDisruption)),
        KARPENTER_DISRUPTION_TAINT if taint.value.as_deref() == Some("disrupting") => {
            Some((grace, NoticeSource::KarpenterDisruption))
        }
        GKE_TERMINATION_TAINT => Some((GKE_NOTICE, NoticeSource::GkeTermination)),
        _ => None,
    }
}

/// Per job: the deadline already delivered for each pod, so a notice is sent again only when
/// its deadline moves earlier. Duplicates are harmless to the coordinator; this only saves
/// requests. Lost on restart, which merely resends.
#[derive(Clone, Debug, Default)]
pub struct NoticeLedger {
    delivered: BTreeMap<String, Timestamp>,
    seen: BTreeSet<String>,
    /// Notices no Pod or Node shows (EC2's interruption notice, from the interruption
    /// watcher), by pod: merged into what each reconcile observes.
    external: BTreeMap<String, Notice>,
}

impl NoticeLedger {
    /// Keeps `notices` from outside the cluster's objects (the earliest deadline per pod).
    pub fn remember_external(&mut self, notices: &[Notice]) {
        for notice in notices {
            let keep = self
                .external
                .get(&notice.pod)
                .is_none_or(|kept| notice.leaves_at < kept.leaves_at);
            if keep {
                self.external.insert(notice.pod.clone(), notice.clone());
            }
        }
    }

    /// `observed` (one notice per pod, from Pods and Nodes) with the external notices merged
    /// in: a pod's earliest deadline wins.
    pub fn with_external(&self, mut observed: Vec<Notice>) -> Vec<Notice> {
        for notice in self.external.values() {
            match observed.iter_mut().find(|n| n.pod == notice.pod) {
                Some(seen) if notice.leaves_at < seen.leaves_at => *seen = notice.clone(),
                Some(_) => {}
                None => observed.push(notice.clone()),
            }
        }
        observed
    }

    /// The notices of `current` not yet delivered with the same or an earlier deadline.
    pub fn undelivered<'a>(&self, current: &'a [Notice]) -> Vec<&'a Notice> {
        current
            .iter()
            .filter(|notice| {
                self.delivered
                    .get(&notice.pod)
                    .is_none_or(|delivered| notice.leaves_at < *delivered)
            })
            .collect()
    }

    /// True if a notice for `pod` was ever delivered.
    pub fn knows(&self, pod: &str) -> bool {
        self.delivered.contains_key(pod)
    }

    /// Counts the pods noticed for the first time (evictions), remembering them: those of
    /// `current` and those whose notice was delivered (by the relay, say), gone or not: a pod
    /// drained in three seconds may leave between two reconciles, and its eviction must still
    /// count. Pods the operator released itself ([`Self::mark_released`]) are not evictions.
    pub fn count_new(&mut self, current: &[Notice]) -> u64 {
        let mut new = 0;
        for pod in current.iter().map(|n| &n.pod).chain(self.delivered.keys()) {
            if self.seen.insert(pod.clone()) {
                new += 1;
            }
        }
        new
    }

    /// Remembers that the operator itself released `pod`, so its deletion is no eviction.
    pub fn mark_released(&mut self, pod: &str) {
        self.seen.insert(pod.to_owned());
    }

    /// Records that `notice` reached the coordinator.
    pub fn record(&mut self, notice: &Notice) {
        self.delivered.insert(notice.pod.clone(), notice.leaves_at);
    }

    /// Forgets pods that no longer exist, keeping the ledger bounded; a delivered notice not yet
    /// counted stays until the next [`Self::count_new`] counts it.
    pub fn retain_pods(&mut self, live: &[&str]) {
        self.delivered
            .retain(|pod, _| live.contains(&pod.as_str()) || !self.seen.contains(pod));
        self.seen.retain(|pod| live.contains(&pod.as_str()));
        self.external.retain(|pod, _| live.contains(&pod.as_str()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(yaml: &str) -> Pod {
        serde_yaml::from_str(yaml).unwrap()
    }

    fn node(yaml: &str) -> NodeObservation {
        NodeObservation::Present(Box::new(serde_yaml::from_str(yaml).unwrap()))
    }

    fn at(text: &str) -> Timestamp {
        text.parse().unwrap()
    }

    const POD_ON_N1: &str = r#"
metadata: { name: mf-t-0 }
spec:
  nodeName: n1
  terminationGracePeriodSeconds: 90
  containers: [{ name: runtime }]
"#;

    fn nodes(entries: Vec<(&str, NodeObservation)>) -> BTreeMap<String, NodeObservation> {
        entries
            .into_iter()
            .map(|(name, observation)| (name.to_owned(), observation))
            .collect()
    }

    #[test]
    fn nth_spot_interruption_taint_gives_two_minutes_from_the_taint() {
        let n1 = node(
            r#"
metadata: { name: n1 }
spec:
  taints:
    - { key: aws-node-termination-handler/spot-itn, value: i-123, effect: NoSchedule, timeAdded: "2026-01-01T00:00:00Z" }
"#,
        );
        let found = notices(
            &[pod(POD_ON_N1)],
            &nodes(vec![("n1", n1)]),
            at("2026-01-01T00:00:10Z"),
        );
        assert_eq!(
            found,
            vec![Notice {
                pod: "mf-t-0".into(),
                node: Some("n1".into()),
                leaves_at: at("2026-01-01T00:02:00Z"),
                source: NoticeSource::AwsNodeTerminationHandler,
            }]
        );
    }

    #[test]
    fn nth_maintenance_and_lifecycle_taints_are_not_spot_interruptions() {
        for key in [NTH_SCHEDULED_MAINTENANCE_TAINT, NTH_ASG_LIFECYCLE_TAINT] {
            let n1 = node(&format!(
                r#"
metadata: {{ name: n1 }}
spec:
  taints:
    - {{ key: {key}, effect: NoSchedule, timeAdded: "2026-01-01T00:00:00Z" }}
"#
            ));
            let found = notices(
                &[pod(POD_ON_N1)],
                &nodes(vec![("n1", n1)]),
                at("2026-01-01T00:00:10Z"),
            );
            assert_eq!(found[0].source, NoticeSource::AwsMaintenance, "{key}");
            assert_eq!(found[0].leaves_at, at("2026-01-01T00:02:00Z"), "{key}");
            assert!(!found[0].source.is_capacity_signal(), "{key}");
        }
    }

    #[test]
    fn karpenter_and_gke_taints_and_unrelated_taints() {
        let karpenter = node(
            r#"
metadata: { name: n1 }
spec:
  taints:
    - { key: example.com/dedicated, value: ml, effect: NoSchedule }
    - { key: karpenter.sh/disrupted, effect: NoSchedule, timeAdded: "2026-01-01T00:00:00Z" }
"#,
        );
        let found = notices(
            &[pod(POD_ON_N1)],
            &nodes(vec![("n1", karpenter)]),
            at("2026-01-01T00:00:05Z"),
        );
        assert_eq!(found[0].source, NoticeSource::KarpenterDisruption);
        // The pod's own 90 s grace period, not the default.
        assert_eq!(found[0].leaves_at, at("2026-01-01T00:01:30Z"));

        let gke = node(
            r#"
metadata: { name: n1 }
spec:
  taints:
    - { key: cloud.google.com/impending-node-termination, effect: NoSchedule }
"#,
        );
        let now = at("2026-01-01T00:00:05Z");
        let found = notices(&[pod(POD_ON_N1)], &nodes(vec![("n1", gke)]), now);
        assert_eq!(found[0].source, NoticeSource::GkeTermination);
        assert_eq!(
            found[0].leaves_at,
            at("2026-01-01T00:00:35Z"),
            "no timeAdded: from now"
        );

        let quiet = node(
            r#"
metadata: { name: n1 }
spec:
  taints:
    - { key: karpenter.sh/disruption, value: candidate, effect: NoSchedule }
    - { key: node.kubernetes.io/unschedulable, effect: NoSchedule }
"#,
        );
        assert!(notices(&[pod(POD_ON_N1)], &nodes(vec![("n1", quiet)]), now).is_empty());
    }

    #[test]
    fn node_deletion_and_gone_node() {
        let deleting = node(
            r#"
metadata: { name: n1, deletionTimestamp: "2026-01-01T00:00:00Z" }
"#,
        );
        let now = at("2026-01-01T00:00:30Z");
        let found = notices(&[pod(POD_ON_N1)], &nodes(vec![("n1", deleting)]), now);
        assert_eq!(found[0].source, NoticeSource::NodeDeletion);
        assert_eq!(found[0].leaves_at, at("2026-01-01T00:01:30Z"));

        let found = notices(
            &[pod(POD_ON_N1)],
            &nodes(vec![("n1", NodeObservation::Gone)]),
            now,
        );
        assert_eq!(found[0].source, NoticeSource::NodeGone);
        assert_eq!(found[0].leaves_at, now);

        // Unobserved nodes and unscheduled pods yield nothing.
        assert!(notices(&[pod(POD_ON_N1)], &BTreeMap::new(), now).is_empty());
    }

    #[test]
    fn pod_conditions_and_deletion_dedupe_to_the_earliest() {
        let disrupted = pod(r#"
metadata: { name: mf-t-1, deletionTimestamp: "2026-01-01T00:05:00Z" }
spec:
  nodeName: n2
  terminationGracePeriodSeconds: 60
  containers: [{ name: runtime }]
status:
  conditions:
    - { type: DisruptionTarget, status: "True", reason: TerminationByKubelet, lastTransitionTime: "2026-01-01T00:00:00Z" }
"#);
        let tainted = node(
            r#"
metadata: { name: n2 }
spec:
  taints:
    - { key: aws-node-termination-handler/rebalance-recommendation, effect: NoSchedule, timeAdded: "2026-01-01T00:00:00Z" }
"#,
        );
        let found = notices(
            std::slice::from_ref(&disrupted),
            &nodes(vec![("n2", tainted)]),
            at("2026-01-01T00:00:01Z"),
        );
        assert_eq!(found.len(), 1, "one notice per pod");
        assert_eq!(found[0].source, NoticeSource::PodDisruption);
        assert_eq!(found[0].leaves_at, at("2026-01-01T00:01:00Z"));

        let mut only_deleted = disrupted;
        only_deleted.status = None;
        let found = notices(
            &[only_deleted],
            &BTreeMap::new(),
            at("2026-01-01T00:00:01Z"),
        );
        assert_eq!(found[0].source, NoticeSource::PodDeletion);
        assert_eq!(found[0].leaves_at, at("2026-01-01T00:05:00Z"));
    }

    #[test]
    fn source_names_are_the_variant_names() {
        for source in NoticeSource::ALL {
            assert_eq!(source.as_str(), format!("{source:?}"));
        }
    }

    #[test]
    fn ledger_resends_only_earlier_deadlines() {
        let notice = |leaves_at: &str| Notice {
            pod: "mf-t-0".into(),
            node: None,
            leaves_at: at(leaves_at),
            source: NoticeSource::PodDeletion,
        };
        let mut ledger = NoticeLedger::default();
        let first = [notice("2026-01-01T00:02:00Z")];
        assert_eq!(ledger.undelivered(&first).len(), 1);
        ledger.record(&first[0]);
        assert!(ledger.knows("mf-t-0"));
        assert!(
            ledger.undelivered(&first).is_empty(),
            "same deadline is a duplicate"
        );
        assert!(
            ledger
                .undelivered(&[notice("2026-01-01T00:03:00Z")])
                .is_empty()
        );
        assert_eq!(
            ledger.undelivered(&[notice("2026-01-01T00:01:00Z")]).len(),
            1
        );
        ledger.mark_released("mf-t-9");
        let evicted = [
            notice("2026-01-01T00:01:00Z"),
            Notice {
                pod: "mf-t-9".into(),
                ..notice("2026-01-01T00:01:00Z")
            },
        ];
        assert_eq!(
            ledger.count_new(&evicted),
            1,
            "released pods are no evictions"
        );
        assert_eq!(ledger.count_new(&evicted), 0, "each eviction counts once");
        ledger.retain_pods(&[]);
        assert!(!ledger.knows("mf-t-0"));
    }

    /// A notice the relay delivered counts as an eviction even when its pod drained and went
    /// before any reconcile saw it; a pod the operator released does not.
    #[test]
    fn delivered_notices_count_even_when_their_pod_is_gone() {
        let notice = |pod: &str| Notice {
            pod: pod.into(),
            node: None,
            leaves_at: at("2026-01-01T00:02:00Z"),
            source: NoticeSource::AwsNodeTerminationHandler,
        };
        let mut ledger = NoticeLedger::default();
        ledger.record(&notice("mf-t-0"));
        ledger.record(&notice("mf-t-1"));
        ledger.mark_released("mf-t-1");
        ledger.retain_pods(&[]);
        assert_eq!(ledger.count_new(&[]), 1, "the evicted pod counts once");
        assert_eq!(ledger.count_new(&[notice("mf-t-0")]), 0);
        ledger.mark_released("mf-t-2");
        ledger.record(&notice("mf-t-2"));
        assert_eq!(ledger.count_new(&[]), 0, "a released pod is no eviction");
    }

    /// EC2's interruption notices (the watcher's) join what the reconcile observes from Pods
    /// and Nodes, earliest deadline first, until their pods are gone.
    #[test]
    fn external_notices_merge_into_the_observed_ones() {
        let notice = |pod: &str, leaves_at: &str, source| Notice {
            pod: pod.into(),
            node: None,
            leaves_at: at(leaves_at),
            source,
        };
        let mut ledger = NoticeLedger::default();
        ledger.remember_external(&[
            notice(
                "mf-t-0",
                "2026-01-01T00:02:00Z",
                NoticeSource::Ec2SpotInterruption,
            ),
            notice(
                "mf-t-1",
                "2026-01-01T00:02:00Z",
                NoticeSource::Ec2SpotInterruption,
            ),
        ]);
        // a later deadline for the same pod does not replace the kept one
        ledger.remember_external(&[notice(
            "mf-t-0",
            "2026-01-01T00:09:00Z",
            NoticeSource::Ec2SpotInterruption,
        )]);
        let observed = vec![
            // a taint seen later than EC2's notice, with a later deadline: EC2's wins
            notice(
                "mf-t-0",
                "2026-01-01T00:05:00Z",
                NoticeSource::AwsNodeTerminationHandler,
            ),
            notice("mf-t-2", "2026-01-01T00:03:00Z", NoticeSource::PodDeletion),
        ];
        let merged = ledger.with_external(observed);
        let summary: Vec<(&str, NoticeSource)> =
            merged.iter().map(|n| (n.pod.as_str(), n.source)).collect();
        assert_eq!(
            summary,
            [
                ("mf-t-0", NoticeSource::Ec2SpotInterruption),
                ("mf-t-2", NoticeSource::PodDeletion),
                ("mf-t-1", NoticeSource::Ec2SpotInterruption),
            ]
        );
        assert_eq!(merged[0].leaves_at, at("2026-01-01T00:02:00Z"));
        ledger.retain_pods(&["mf-t-2"]);
        assert_eq!(
            ledger.with_external(Vec::new()),
            Vec::new(),
            "gone pods are forgotten"
        );
    }
}
