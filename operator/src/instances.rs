//! The cluster's side of provisioning: the EC2 instance behind a Node and what each instance
//! hosts, from the runtime pods the operator sees. The plan itself (what to launch and terminate)
//! is `ebbflow_job::provision`, which needs no cluster.

use std::collections::BTreeMap;

use ebbflow_job::provision::InstanceUse;

/// The instance ID in a Node's `spec.providerID` (`aws:///<zone>/<instance-id>`).
pub fn node_instance(node: &k8s_openapi::api::core::v1::Node) -> Option<&str> {
    let provider_id = node.spec.as_ref()?.provider_id.as_deref()?;
    let id = provider_id.strip_prefix("aws://")?.rsplit('/').next()?;
    id.starts_with("i-").then_some(id)
}

/// How long past its deletion deadline (the deletion timestamp: the request plus the grace
/// period) a pod still being deleted keeps its instance: a kubelet that stopped answering never
/// confirms the deletion, and its instance must not be kept for that.
pub const DRAIN_SLACK: k8s_openapi::jiff::SignedDuration =
    k8s_openapi::jiff::SignedDuration::from_secs(30);

/// What each instance hosts at `now`: `pods` (every runtime pod the operator knows, of any
/// job: pods are placed by pool, so another job's pod may run on this job's instance) mapped
/// through their Nodes (`instance_of` a node name, from its `providerID`) onto instance IDs. A
/// pod that has finished hosts nothing, nor does one [`DRAIN_SLACK`] past its deletion
/// deadline; one being deleted, or `releasing` (the plan deletes it now), is shutting down.
/// Pure.
pub fn instance_uses(
    pods: &[k8s_openapi::api::core::v1::Pod],
    instance_of: impl Fn(&str) -> Option<String>,
    releasing: impl Fn(&k8s_openapi::api::core::v1::Pod) -> bool,
    now: k8s_openapi::jiff::Timestamp,
) -> BTreeMap<String, InstanceUse> {
    let mut uses: BTreeMap<String, InstanceUse> = BTreeMap::new();
    for pod in pods {
        if crate::controller::plan::pod_finished(pod) {
            continue;
        }
        if pod
            .metadata
            .deletion_timestamp
            .as_ref()
            .is_some_and(|deadline| deadline.0 + DRAIN_SLACK < now)
        {
            continue;
        }
        let Some(instance) = pod
            .spec
            .as_ref()
            .and_then(|spec| spec.node_name.as_deref())
            .and_then(&instance_of)
        else {
            continue;
        };
        let usage = if pod.metadata.deletion_timestamp.is_some() || releasing(pod) {
            InstanceUse::Draining
        } else {
            InstanceUse::Busy
        };
        let entry = uses.entry(instance).or_default();
        *entry = (*entry).max(usage);
    }
    uses
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instances_are_used_by_the_pods_on_their_nodes() {
        use k8s_openapi::api::core::v1::{Node, Pod};
        let node = |name: &str, provider: &str| -> Node {
            serde_json::from_value(serde_json::json!({
                "metadata": { "name": name },
                "spec": { "providerID": provider },
            }))
            .unwrap()
        };
        let pod = |name: &str, node: &str, phase: &str, deleting: bool| -> Pod {
            let mut pod: Pod = serde_json::from_value(serde_json::json!({
                "metadata": { "name": name },
                "spec": { "nodeName": node, "containers": [] },
                "status": { "phase": phase },
            }))
            .unwrap();
            if deleting {
                pod.metadata.deletion_timestamp =
                    Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                        "2026-11-26T10:00:00Z".parse().unwrap(),
                    ));
            }
            pod
        };
        let nodes = [
            node("n-1", "aws:///us-east-1a/i-1"),
            node("n-2", "aws:///us-east-1a/i-2"),
            node("n-3", "aws:///us-east-1a/i-3"),
            node("n-4", "aws:///us-east-1a/i-4"),
            node("kwok", "kwok://fake"),
        ];
        let pods = [
            pod("mf-t-0", "n-1", "Running", false),
            pod("mf-t-1", "n-1", "Running", true),
            pod("mf-t-2", "n-2", "Running", true),
            pod("mf-t-3", "n-3", "Running", false),
            pod("mf-t-4", "n-4", "Failed", false),
            pod("mf-t-5", "kwok", "Running", false),
            pod("mf-t-6", "gone", "Running", false),
        ];
        let by_name = |name: &str| {
            nodes
                .iter()
                .find(|n| n.metadata.name.as_deref() == Some(name))
                .and_then(node_instance)
                .map(str::to_owned)
        };
        let releasing = |pod: &Pod| pod.metadata.name.as_deref() == Some("mf-t-3");
        // the deletions are due at 10:00:00; at 10:00:20 they still drain
        let now: k8s_openapi::jiff::Timestamp = "2026-11-26T10:00:20Z".parse().unwrap();
        let uses = instance_uses(&pods, by_name, releasing, now);
        assert_eq!(
            uses,
            BTreeMap::from([
                ("i-1".to_owned(), InstanceUse::Busy),
                ("i-2".to_owned(), InstanceUse::Draining),
                ("i-3".to_owned(), InstanceUse::Draining),
            ])
        );
        // past the deadline and the slack (a kubelet that never confirms): i-2 hosts nothing,
        // and i-1 only the pod the job keeps
        let later: k8s_openapi::jiff::Timestamp = "2026-11-26T10:00:31Z".parse().unwrap();
        let uses = instance_uses(&pods, by_name, releasing, later);
        assert_eq!(uses.get("i-2"), None);
        assert_eq!(uses.get("i-1"), Some(&InstanceUse::Busy));
    }
}
