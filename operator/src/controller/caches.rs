//! The reflector caches of Nodes and of the operator's Pods, Secrets, Services,
//! PodDisruptionBudgets and NetworkPolicies: filled by the notice relay ([`super::relay`]), read by the reconcile
//! instead of LIST and GET calls, and broadcast to the controller as its child triggers.

use std::{
    hash::Hash,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
};

use futures::FutureExt;
use k8s_openapi::api::{
    core::v1::{Node, Pod, Secret, Service},
    networking::v1::NetworkPolicy,
    policy::v1::PodDisruptionBudget,
};
use kube::{
    ResourceExt,
    runtime::reflector::{self, ObjectRef, ReflectHandle, Store},
};
use parking_lot::Mutex;

use super::plan;

/// The writing halves of [`Caches`], taken once by the relay ([`super::relay::run`]).
pub(super) struct Writers {
    pub(super) pods: reflector::store::Writer<Pod>,
    pub(super) nodes: reflector::store::Writer<Node>,
    pub(super) secrets: reflector::store::Writer<Secret>,
    pub(super) services: reflector::store::Writer<Service>,
    pub(super) budgets: reflector::store::Writer<PodDisruptionBudget>,
    pub(super) network_policies: reflector::store::Writer<NetworkPolicy>,
}

/// Changes the caches broadcast to subscribers (the controller) after applying them; a slow
/// subscriber holds the relay back once this many are queued.
const SUBSCRIBER_BUFFER: usize = 1024;

/// The reflector caches shared by the relay and the reconcile.
#[derive(Clone)]
pub struct Caches {
    /// The operator's pods (managed-by label), slimmed by `slim_pod`.
    pub pods: Store<Pod>,
    /// Every Node, slimmed by `slim_node`.
    pub nodes: Store<Node>,
    /// The operator's Secrets (managed-by label), without managed fields.
    pub secrets: Store<Secret>,
    /// The operator's Services (managed-by label), without managed fields.
    pub services: Store<Service>,
    /// The operator's PodDisruptionBudgets (managed-by label), without managed fields.
    pub budgets: Store<PodDisruptionBudget>,
    /// The operator's NetworkPolicies (managed-by label), without managed fields.
    pub network_policies: Store<NetworkPolicy>,
    pub(super) writers: Arc<Mutex<Option<Writers>>>,
    /// True while the relay ([`super::relay::run`]) keeps the stores current; a stale store is never read.
    pub(super) live: Arc<AtomicBool>,
}

impl Default for Caches {
    fn default() -> Self {
        let (pods, pod_writer) = reflector::store_shared(SUBSCRIBER_BUFFER);
        let (nodes, node_writer) = reflector::store();
        let (secrets, secret_writer) = reflector::store_shared(SUBSCRIBER_BUFFER);
        let (services, service_writer) = reflector::store_shared(SUBSCRIBER_BUFFER);
        let (budgets, budget_writer) = reflector::store_shared(SUBSCRIBER_BUFFER);
        let (network_policies, policy_writer) = reflector::store_shared(SUBSCRIBER_BUFFER);
        Self {
            pods,
            nodes,
            secrets,
            services,
            budgets,
            network_policies,
            writers: Arc::new(Mutex::new(Some(Writers {
                pods: pod_writer,
                nodes: node_writer,
                secrets: secret_writer,
                services: service_writer,
                budgets: budget_writer,
                network_policies: policy_writer,
            }))),
            live: Arc::new(AtomicBool::new(false)),
        }
    }
}

/// The caches' change streams for the controller's child triggers: the controller reacts to the
/// very watches that fill the caches, after the cache holds the change (so a reconcile reads
/// what triggered it). Deletions are not broadcast; the relay requeues their jobs itself.
pub struct Subscriptions {
    /// Applied pods.
    pub pods: ReflectHandle<Pod>,
    /// Applied Secrets.
    pub secrets: ReflectHandle<Secret>,
    /// Applied Services.
    pub services: ReflectHandle<Service>,
    /// Applied PodDisruptionBudgets.
    pub budgets: ReflectHandle<PodDisruptionBudget>,
    /// Applied NetworkPolicies.
    pub network_policies: ReflectHandle<NetworkPolicy>,
}

/// True once `store` holds a complete list (it never goes back).
fn synced<K>(store: &Store<K>) -> bool
where
    K: kube::Resource + Clone + 'static,
    K::DynamicType: Eq + Hash + Clone,
{
    store
        .wait_until_ready()
        .now_or_never()
        .is_some_and(|ready| ready.is_ok())
}

impl Caches {
    /// The cached Node, if the cache holds it. `None` means "not known here", not "gone": the
    /// caller asks the API server (the cache may be filling, or unused in tests).
    pub fn node(&self, name: &str) -> Option<Arc<Node>> {
        if !self.live.load(Ordering::Acquire) {
            return None;
        }
        self.nodes.get(&ObjectRef::new(name))
    }

    /// The change streams for the controller; `None` once the relay has started (subscribe first).
    pub fn subscribe(&self) -> Option<Subscriptions> {
        let writers = self.writers.lock();
        let writers = writers.as_ref()?;
        Some(Subscriptions {
            pods: writers.pods.subscribe()?,
            secrets: writers.secrets.subscribe()?,
            services: writers.services.subscribe()?,
            budgets: writers.budgets.subscribe()?,
            network_policies: writers.network_policies.subscribe()?,
        })
    }

    /// The pods of job `job` in `namespace`, if the pod cache is live and synced (`None`: ask
    /// the API server).
    pub fn job_pods(&self, namespace: &str, job: &str) -> Option<Vec<Pod>> {
        if !self.live.load(Ordering::Acquire) || !synced(&self.pods) {
            return None;
        }
        Some(
            self.pods
                .state_filter(|pod| {
                    pod.metadata.namespace.as_deref() == Some(namespace)
                        && pod.labels().get(plan::JOB_LABEL).map(String::as_str) == Some(job)
                })
                .iter()
                .map(|pod| pod.as_ref().clone())
                .collect(),
        )
    }

    /// Every runtime pod the operator manages (any job), if the cache is live and synced.
    pub fn managed_pods(&self) -> Option<Vec<Pod>> {
        if !self.live.load(Ordering::Acquire) || !synced(&self.pods) {
            return None;
        }
        Some(
            self.pods
                .state()
                .iter()
                .map(|pod| pod.as_ref().clone())
                .collect(),
        )
    }

    /// The cached Secret `namespace/name`, if the cache is live and holds it (`None` is not
    /// "absent": a cache that missed a just-applied Secret must not make the caller mint a new
    /// token, so callers ask the API server then).
    pub fn secret(&self, namespace: &str, name: &str) -> Option<Arc<Secret>> {
        if !self.live.load(Ordering::Acquire) {
            return None;
        }
        self.secrets.get(&ObjectRef::new(name).within(namespace))
    }

    /// The cached Service `namespace/name`, if the cache is live and holds it.
    pub fn service(&self, namespace: &str, name: &str) -> Option<Arc<Service>> {
        if !self.live.load(Ordering::Acquire) {
            return None;
        }
        self.services.get(&ObjectRef::new(name).within(namespace))
    }

    /// The cached PodDisruptionBudget `namespace/name`, if the cache is live and holds it.
    pub fn budget(&self, namespace: &str, name: &str) -> Option<Arc<PodDisruptionBudget>> {
        if !self.live.load(Ordering::Acquire) {
            return None;
        }
        self.budgets.get(&ObjectRef::new(name).within(namespace))
    }

    /// The cached NetworkPolicy `namespace/name`, if the cache is live and holds it.
    pub fn network_policy(&self, namespace: &str, name: &str) -> Option<Arc<NetworkPolicy>> {
        if !self.live.load(Ordering::Acquire) {
            return None;
        }
        self.network_policies
            .get(&ObjectRef::new(name).within(namespace))
    }
}
