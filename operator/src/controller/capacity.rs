//! The capacity decision the plan consumes: how many transient pods per pool.
//!
//! [`CapacityPlanner`] is the seam between the controller and a bidder. The controller asks it
//! on every reconcile (events: evictions, spec changes, pod changes) and at least every
//! `spec.bidding.decisionInterval` (the requeue timer); only changes are logged in the status.

use std::collections::{BTreeMap, BTreeSet};

use ebbflow_crds::{BiddingStrategy, CapacityType, TrainingJob};
use k8s_openapi::jiff::Timestamp;

use super::plan::{CapacityDecision, PoolKey};
use crate::coordinator::CoordinatorStatus;

/// What a capacity planner sees.
#[derive(Clone, Debug)]
pub struct CapacityView<'a> {
    /// The job (spec: tiers, bidding, budget).
    pub job: &'a TrainingJob,
    /// Transient pods alive per pool (not leaving).
    pub alive: &'a BTreeMap<PoolKey, u32>,
    /// When the oldest alive transient pod of each pool was created.
    pub launched: &'a BTreeMap<PoolKey, Timestamp>,
    /// The lowest max price (USD per instance-hour) the alive spot pods of each pool were bid
    /// at, where their pods record it ([`super::plan::MAX_PRICE_ANNOTATION`]).
    pub bids: &'a BTreeMap<PoolKey, f64>,
    /// Pools with a pod under an eviction notice right now.
    pub pools_under_notice: &'a BTreeSet<PoolKey>,
    /// Transient pods per pool that failed by themselves (a crash, an OOMKill, an admission
    /// refusal) and are still listed: gone from `alive` for the runtime's reasons, not the
    /// market's.
    pub failed: &'a BTreeMap<PoolKey, u32>,
    /// Pools the cluster did not place the job's pods in: a transient pod waited there for a
    /// node past the operator's unschedulable wait, recently (the capacity a node autoscaler
    /// should have launched did not come). Planners buy elsewhere and drop what waits there.
    pub unplaceable: &'a BTreeSet<PoolKey>,
    /// The coordinator's last report, if reachable.
    pub coordinator: Option<&'a CoordinatorStatus>,
    /// Now.
    pub now: Timestamp,
}

/// Decides transient pool counts for one job. Implementations are pure and fast (they run
/// inside reconcile).
pub trait CapacityPlanner: Send + Sync {
    /// The desired transient pods per pool.
    fn decide(&self, view: &CapacityView<'_>) -> CapacityDecision;

    /// Drops what the planner keeps for `job` (it was deleted).
    fn forget(&self, _job: &TrainingJob) {}

    /// The job's market, to charge its instances with ([`super::cost`]), if this planner has
    /// one for it now.
    fn pricing(&self, _job: &TrainingJob, _now: Timestamp) -> Option<super::cost::Pricing> {
        None
    }
}

/// The candidate pools of a job: transient instance types × zones (an empty list means "any"),
/// on spot capacity, or on-demand capacity for strategy OnDemandOnly.
pub fn candidate_pools(job: &TrainingJob) -> Vec<PoolKey> {
    let transient = &job.spec.transient;
    let capacity_type = match job.spec.bidding.strategy {
        BiddingStrategy::OnDemandOnly => CapacityType::OnDemand,
        BiddingStrategy::BidBrain | BiddingStrategy::Standard => CapacityType::Spot,
    };
    let any = [String::new()];
    let types: &[String] = if transient.instance_types.is_empty() {
        &any
    } else {
        &transient.instance_types
    };
    let zones: &[String] = if transient.zones.is_empty() {
        &any
    } else {
        &transient.zones
    };
    types
        .iter()
        .flat_map(|instance_type| {
            zones
                .iter()
                .map(move |zone| PoolKey::new(instance_type, zone, capacity_type))
        })
        .collect()
}

/// Capacity from the spec alone, for clusters without a market view: hold
/// `transient.maxNodes` in one candidate pool, as the Standard strategy does. It stays in the
/// pool it already uses, and moves to the next candidate when its pool is being evicted (a
/// spot pool under reclamation tends to stay reclaimed).
#[derive(Clone, Copy, Debug, Default)]
pub struct SpecCapacityPlanner;

impl CapacityPlanner for SpecCapacityPlanner {
    fn decide(&self, view: &CapacityView<'_>) -> CapacityDecision {
        let target = view.job.spec.transient.max_nodes;
        if target == 0 {
            return CapacityDecision {
                reason: "NoTransientTier".to_owned(),
                ..CapacityDecision::default()
            };
        }
        let candidates = candidate_pools(view.job);
        let calm = |pool: &&PoolKey| {
            !view.pools_under_notice.contains(*pool) && !view.unplaceable.contains(*pool)
        };
        let current = candidates
            .iter()
            .filter(calm)
            .find(|pool| view.alive.get(*pool).copied().unwrap_or(0) > 0);
        let (pool, reason) = match current {
            Some(pool) => (pool, "Hold"),
            None => match candidates.iter().find(calm) {
                Some(pool) if !view.pools_under_notice.is_empty() => (pool, "Eviction"),
                Some(pool) => (pool, "MaxNodes"),
                None => (&candidates[0], "AllPoolsEvicting"),
            },
        };
        CapacityDecision {
            transient: BTreeMap::from([(pool.clone(), target)]),
            reason: reason.to_owned(),
            ..CapacityDecision::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(instance_type: &str, zone: &str) -> PoolKey {
        PoolKey::new(instance_type, zone, CapacityType::Spot)
    }

    fn decide(
        job: &TrainingJob,
        alive: &[(PoolKey, u32)],
        noticed: &[PoolKey],
    ) -> CapacityDecision {
        let alive: BTreeMap<PoolKey, u32> = alive.iter().cloned().collect();
        let noticed: BTreeSet<PoolKey> = noticed.iter().cloned().collect();
        SpecCapacityPlanner.decide(&CapacityView {
            job,
            alive: &alive,
            launched: &BTreeMap::new(),
            bids: &BTreeMap::new(),
            pools_under_notice: &noticed,
            failed: &BTreeMap::new(),
            unplaceable: &BTreeSet::new(),
            coordinator: None,
            now: Timestamp::UNIX_EPOCH,
        })
    }

    fn job() -> TrainingJob {
        TrainingJob::test("mf").with_transient(4).with_spec(|spec| {
            spec.transient.instance_types = vec!["c5.xlarge".into()];
            spec.transient.zones = vec!["us-east-1a".into(), "us-east-1b".into()];
        })
    }

    #[test]
    fn candidates_are_types_by_zones_and_any_when_empty() {
        assert_eq!(
            candidate_pools(&job()),
            vec![
                pool("c5.xlarge", "us-east-1a"),
                pool("c5.xlarge", "us-east-1b")
            ]
        );
        let any =
            candidate_pools(&TrainingJob::test("mf").with_strategy(BiddingStrategy::OnDemandOnly));
        assert_eq!(any.len(), 1);
        assert_eq!(any[0].instance_type, "");
        assert_eq!(any[0].capacity_type, CapacityType::OnDemand);
    }

    #[test]
    fn holds_max_nodes_in_the_current_pool_and_moves_away_from_evictions() {
        let a = pool("c5.xlarge", "us-east-1a");
        let b = pool("c5.xlarge", "us-east-1b");
        let first = decide(&job(), &[], &[]);
        assert_eq!(first.transient, BTreeMap::from([(a.clone(), 4)]));
        assert_eq!(first.reason, "MaxNodes");

        let staying = decide(&job(), &[(b.clone(), 2)], &[]);
        assert_eq!(
            staying.transient,
            BTreeMap::from([(b.clone(), 4)]),
            "sticky"
        );

        let moving = decide(&job(), &[(a.clone(), 2)], std::slice::from_ref(&a));
        assert_eq!(moving.transient, BTreeMap::from([(b.clone(), 4)]));
        assert_eq!(moving.reason, "Eviction");

        let nowhere = decide(&job(), &[], &[a.clone(), b]);
        assert_eq!(nowhere.transient, BTreeMap::from([(a, 4)]));
        assert_eq!(nowhere.reason, "AllPoolsEvicting");

        assert!(
            decide(&TrainingJob::test("r"), &[], &[])
                .transient
                .is_empty()
        );
    }
}
