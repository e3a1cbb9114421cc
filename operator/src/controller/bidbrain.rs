//! BidBrain as the controller's capacity planner: the same [`Bidder`] as `ebbflow simulate` and
//! `ebbflow run`, over the same job market ([`crate::jobmarket::setup_market`]).
//!
//! Every reconcile of a running BidBrain job asks [`BidBrainPlanner::decide`]:
//! - the job's market (trace replay, pools filtered to its instance types and zones, eviction
//!   model fitted on the trace before the job's start) is loaded once and shared by every job
//!   with the same market settings;
//! - wall time since the job's creation maps onto trace time from `traceStart`, `trace_speed`
//!   trace seconds per second (1 in production; tests speed it up);
//! - the transient pods alive per pool are the allocations, launched when the oldest of them was
//!   created;
//! - the bidder's acquisitions and releases become pool counts, clamped to
//!   `[transient.minNodes, transient.maxNodes]` (a floor is filled in the cheapest buyable pool,
//!   a ceiling trims the dearest pools first).
//!
//! Jobs with another strategy, a live market (ec2, gcp) that has no price source here yet, or a
//! trace that cannot be loaded are decided by [`SpecCapacityPlanner`]; a load failure is logged
//! once per market and the decision's reason says `MarketUnavailable`.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ebbflow_crds::{BiddingStrategy, CapacityType, MarketKind, TrainingJob};
use k8s_openapi::jiff::Timestamp;
use parking_lot::Mutex;
use tracing::warn;

use super::capacity::{CapacityPlanner, CapacityView, SpecCapacityPlanner};
use super::plan::{CapacityDecision, PoolKey};
use crate::bidder::{Allocation, Bidder, BidderInput, JobState};
use crate::jobmarket::{MarketSetup, app_model, bidder_config, setup_market};
use crate::market;

/// Settings of [`BidBrainPlanner`].
#[derive(Clone, Debug)]
pub struct BidBrainConfig {
    /// Relative trace paths resolve against the working directory, then this directory.
    pub trace_dir: PathBuf,
    /// Trace seconds per wall second (1 in production).
    pub trace_speed: f64,
    /// How long a market that failed to load is not retried.
    pub retry_failed_after: Duration,
}

impl Default for BidBrainConfig {
    fn default() -> Self {
        Self {
            trace_dir: PathBuf::from("."),
            trace_speed: 1.0,
            retry_failed_after: Duration::from_secs(60),
        }
    }
}

enum Loaded {
    Ready(Arc<MarketSetup>),
    Failed { at: Instant },
}

/// The BidBrain capacity planner (see the module docs).
pub struct BidBrainPlanner {
    config: BidBrainConfig,
    markets: Mutex<HashMap<String, Loaded>>,
}

impl BidBrainPlanner {
    /// A planner with no market loaded yet.
    pub fn new(config: BidBrainConfig) -> Self {
        Self {
            config,
            markets: Mutex::new(HashMap::new()),
        }
    }

    /// The job's market, loaded on first use and shared by jobs with the same market settings.
    fn market(&self, job: &TrainingJob) -> Option<Arc<MarketSetup>> {
        let spec = &job.spec;
        let key = serde_json::json!([
            spec.bidding.market,
            spec.bidding.billing_model,
            spec.transient.instance_types,
            spec.transient.zones,
            spec.reliable.count,
        ])
        .to_string();
        if let Some(loaded) = self.markets.lock().get(&key) {
            match loaded {
                Loaded::Ready(setup) => return Some(setup.clone()),
                Loaded::Failed { at } if at.elapsed() < self.config.retry_failed_after => {
                    return None;
                }
                Loaded::Failed { .. } => {}
            }
        }
        // Loading a trace and fitting its model takes a moment; concurrent first reconciles of
        // jobs on one market may both load it, and the last one is kept.
        let loaded = match setup_market(job, &self.config.trace_dir) {
            Ok(setup) => Loaded::Ready(Arc::new(setup)),
            Err(error) => {
                warn!(job = ?job.metadata.name, %error, "BidBrain has no market view for this job; holding spec.transient.maxNodes");
                Loaded::Failed { at: Instant::now() }
            }
        };
        let setup = match &loaded {
            Loaded::Ready(setup) => Some(setup.clone()),
            Loaded::Failed { .. } => None,
        };
        self.markets.lock().insert(key, loaded);
        setup
    }
}

impl CapacityPlanner for BidBrainPlanner {
    fn decide(&self, view: &CapacityView<'_>) -> CapacityDecision {
        let job = view.job;
        let bidding = &job.spec.bidding;
        if bidding.strategy != BiddingStrategy::BidBrain || job.spec.transient.max_nodes == 0 {
            return SpecCapacityPlanner.decide(view);
        }
        if bidding.market.kind != MarketKind::Trace {
            let mut decision = SpecCapacityPlanner.decide(view);
            decision.reason = "NoMarketView".to_owned();
            return decision;
        }
        match self.market(job) {
            Some(setup) => decide_on(&setup, self.config.trace_speed, view),
            None => {
                let mut decision = SpecCapacityPlanner.decide(view);
                decision.reason = "MarketUnavailable".to_owned();
                decision
            }
        }
    }
}

/// Seconds from `from` to `to` (negative when `to` is earlier).
fn seconds_between(from: Timestamp, to: Timestamp) -> f64 {
    (to.as_millisecond() - from.as_millisecond()) as f64 / 1000.0
}

fn pool_key(info: &market::PoolInfo, capacity: market::CapacityType) -> PoolKey {
    let capacity = match capacity {
        market::CapacityType::Spot => CapacityType::Spot,
        market::CapacityType::OnDemand => CapacityType::OnDemand,
    };
    PoolKey::new(&info.id.instance_type, &info.id.zone, capacity)
}

/// One BidBrain decision for the job in `view` on `setup`'s market (pure).
pub fn decide_on(
    setup: &MarketSetup,
    trace_speed: f64,
    view: &CapacityView<'_>,
) -> CapacityDecision {
    let job = view.job;
    let grid = &setup.grid;
    let created = job
        .metadata
        .creation_timestamp
        .as_ref()
        .map_or(view.now, |t| t.0);
    // wall → trace time, from the job's start slot
    let to_trace = |at: Timestamp| -> i64 {
        grid.time(setup.start_slot) + (seconds_between(created, at).max(0.0) * trace_speed) as i64
    };
    let now = to_trace(view.now);
    let slot = (((now - grid.t0) / grid.step).max(0) as usize).min(grid.slots.saturating_sub(1));
    let market_view = grid.view(slot);

    // the allocations: alive transient pods per known pool
    let mut index: BTreeMap<PoolKey, (usize, market::CapacityType)> = BTreeMap::new();
    for (i, info) in grid.pools.iter().enumerate() {
        for capacity in [market::CapacityType::Spot, market::CapacityType::OnDemand] {
            index.insert(pool_key(info, capacity), (i, capacity));
        }
    }
    let max_price = |pool: usize| {
        let on_demand = grid.pools[pool].on_demand_usd_hr;
        match (job.spec.bidding.max_price, on_demand) {
            (Some(cap), Some(od)) => Some(cap.min(od)),
            (Some(cap), None) => Some(cap),
            (None, od) => od,
        }
    };
    let mut allocations = Vec::new();
    for (id, (key, count)) in view.alive.iter().enumerate() {
        let Some(&(pool, capacity)) = index.get(key) else {
            continue;
        };
        if *count == 0 {
            continue;
        }
        let launched = view.launched.get(key).copied().unwrap_or(view.now);
        allocations.push(Allocation {
            id: id as u64,
            pool,
            capacity,
            count: *count,
            max_price: match capacity {
                market::CapacityType::Spot => max_price(pool),
                market::CapacityType::OnDemand => None,
            },
            launched_at: to_trace(launched),
        });
    }

    let iterations = job.spec.stop.iterations.unwrap_or(0);
    let done = view.coordinator.and_then(|c| c.iteration).unwrap_or(0);
    let spent = job
        .status
        .as_ref()
        .and_then(|s| s.cost.as_ref())
        .map_or(0.0, |c| c.spent);
    let state = JobState {
        remaining_work: iterations.saturating_sub(done) as f64,
        deadline: job
            .spec
            .bidding
            .deadline
            .as_ref()
            .and_then(|d| d.to_duration())
            .map(|d| to_trace(created) + (d.as_secs_f64() * trace_speed) as i64),
        budget_remaining_usd: job.spec.bidding.budget_total.map(|b| (b - spent).max(0.0)),
        budget_per_hour_usd: job.spec.bidding.budget_per_hour,
    };
    let bidder = Bidder {
        config: bidder_config(job),
        billing: setup.billing,
        eviction: &setup.model,
    };
    let app = app_model(job);
    let decision = bidder.decide(&BidderInput {
        now,
        pools: &grid.pools,
        market: &market_view,
        allocations: &allocations,
        reliable: &setup.reliable,
        app: &app,
        job: &state,
    });

    // allocations → pool counts
    let mut counts: BTreeMap<PoolKey, u32> = BTreeMap::new();
    let mut prices: BTreeMap<PoolKey, f64> = BTreeMap::new();
    for allocation in &allocations {
        if decision.release.contains(&allocation.id) {
            continue;
        }
        let key = pool_key(&grid.pools[allocation.pool], allocation.capacity);
        *counts.entry(key.clone()).or_default() += allocation.count;
        if let Some(price) = allocation.max_price {
            prices.insert(key, price);
        }
    }
    for request in &decision.acquire {
        let key = pool_key(&grid.pools[request.pool], request.capacity);
        *counts.entry(key.clone()).or_default() += request.count;
        if let Some(price) = request.max_price {
            prices.insert(key, price);
        }
    }
    let mut reason = if decision.budget_exhausted {
        "BudgetExhausted"
    } else if decision.no_feasible_pool.is_some() {
        "NoFeasiblePool"
    } else if decision.deadline_at_risk {
        "DeadlineAtRisk"
    } else if !decision.acquire.is_empty() || !decision.release.is_empty() {
        "BidBrain"
    } else {
        "BidBrainHold"
    };

    // the spec's bounds
    let spec = &job.spec.transient;
    let total: u32 = counts.values().sum();
    if total < spec.min_nodes && !decision.budget_exhausted {
        let cheapest = (0..grid.pools.len())
            .filter_map(|pool| grid.price(pool, slot).map(|price| (pool, price)))
            .min_by(|a, b| a.1.total_cmp(&b.1));
        if let Some((pool, _)) = cheapest {
            let key = pool_key(&grid.pools[pool], market::CapacityType::Spot);
            *counts.entry(key.clone()).or_default() += spec.min_nodes - total;
            if let Some(price) = max_price(pool) {
                prices.entry(key).or_insert(price);
            }
            reason = "MinNodes";
        }
    }
    let mut total: u32 = counts.values().sum();
    while total > spec.max_nodes {
        let dearest = counts
            .keys()
            .max_by(|a, b| {
                let price = |k: &PoolKey| {
                    index
                        .get(k)
                        .and_then(|(pool, _)| grid.price(*pool, slot))
                        .unwrap_or(f64::INFINITY)
                };
                price(a).total_cmp(&price(b))
            })
            .cloned()
            .expect("counts is not empty while total > 0");
        let count = counts.get_mut(&dearest).expect("key from counts");
        let cut = (*count).min(total - spec.max_nodes);
        *count -= cut;
        total -= cut;
        reason = "MaxNodes";
    }
    counts.retain(|_, count| *count > 0);
    prices.retain(|key, _| counts.contains_key(key));
    let cost_per_work = decision.cost_per_work_after;
    CapacityDecision {
        transient: counts,
        reason: reason.to_owned(),
        max_prices: prices,
        expected_cost_per_work: cost_per_work.is_finite().then_some(cost_per_work),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use ebbflow_crds::{MarketSpec, TrainingJob};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use super::*;

    const P3: &str = "aws_p3.2xlarge_availability_price_9az_2023-02-15_to_03-09.csv";

    use crate::test_data::spot_data;

    fn job(min: u32, max: u32) -> TrainingJob {
        let mut job = TrainingJob::test("mf")
            .with_transient_range(min, max)
            .with_trace(P3);
        job.spec.bidding.market.trace_start = Some(Time("2023-02-20T00:00:00Z".parse().unwrap()));
        job.metadata.creation_timestamp = Some(Time("2026-11-23T10:00:00Z".parse().unwrap()));
        job
    }

    fn planner() -> BidBrainPlanner {
        BidBrainPlanner::new(BidBrainConfig {
            trace_dir: spot_data(),
            ..BidBrainConfig::default()
        })
    }

    fn decide(
        planner: &dyn CapacityPlanner,
        job: &TrainingJob,
        alive: &[(PoolKey, u32)],
        now: &str,
    ) -> CapacityDecision {
        let alive: BTreeMap<PoolKey, u32> = alive.iter().cloned().collect();
        let launched: BTreeMap<PoolKey, Timestamp> = alive
            .keys()
            .map(|k| {
                (
                    k.clone(),
                    job.metadata.creation_timestamp.clone().unwrap().0,
                )
            })
            .collect();
        planner.decide(&CapacityView {
            job,
            alive: &alive,
            launched: &launched,
            pools_under_notice: &BTreeSet::new(),
            coordinator: None,
            now: now.parse().unwrap(),
        })
    }

    /// Pools of the p3 trace buyable at the job's start.
    fn buyable_at_start(job: &TrainingJob) -> BTreeSet<PoolKey> {
        let setup = setup_market(job, &spot_data()).expect("the p3 trace loads");
        let slot = setup.start_slot;
        (0..setup.grid.pools.len())
            .filter(|&pool| setup.grid.price(pool, slot).is_some())
            .map(|pool| pool_key(&setup.grid.pools[pool], market::CapacityType::Spot))
            .collect()
    }

    #[test]
    fn buys_buyable_spot_pools_of_the_trace_with_a_bid_and_a_cost_per_work() {
        let job = job(0, 4);
        let decision = decide(&planner(), &job, &[], "2026-11-23T10:00:00Z");
        assert_eq!(decision.reason, "BidBrain", "{decision:?}");
        assert!(
            (1..=4).contains(&decision.total()),
            "BidBrain buys within maxNodes: {decision:?}"
        );
        let buyable = buyable_at_start(&job);
        for pool in decision.transient.keys() {
            assert_eq!(pool.0.instance_type, "p3.2xlarge");
            assert!(buyable.contains(pool), "{pool:?} is not buyable then");
            let bid = decision.max_prices[pool];
            assert!(
                bid > 0.0 && bid <= 3.06 + 1e-9,
                "bid {bid} at most on-demand"
            );
        }
        let e = decision.expected_cost_per_work.expect("a model gives E");
        assert!(e.is_finite() && e > 0.0);
    }

    #[test]
    fn holds_what_it_bought_and_adds_only_where_capacity_is() {
        let job = job(0, 4);
        let planner = planner();
        let first = decide(&planner, &job, &[], "2026-11-23T10:00:00Z");
        let held: Vec<(PoolKey, u32)> = first.transient.clone().into_iter().collect();
        let again = decide(&planner, &job, &held, "2026-11-23T10:00:30Z");
        for (pool, count) in &held {
            assert!(
                again.transient.get(pool).copied().unwrap_or(0) >= *count,
                "a fresh allocation is kept: {first:?} then {again:?}"
            );
        }
        // a pool without capacity in the trace gets nothing more (what runs there is the
        // cluster's to take back: real evictions arrive as notices, not from the trace)
        let setup = setup_market(&job, &spot_data()).unwrap();
        let buyable = buyable_at_start(&job);
        let gone = setup
            .grid
            .pools
            .iter()
            .map(|info| pool_key(info, market::CapacityType::Spot))
            .find(|pool| !buyable.contains(pool))
            .expect("the p3 trace has a pool without capacity on 2023-02-20");
        let decision = decide(&planner, &job, &[(gone.clone(), 2)], "2026-11-23T10:00:00Z");
        assert!(
            decision.transient.get(&gone).copied().unwrap_or(0) <= 2,
            "{decision:?}"
        );
        assert!(
            decision.transient.keys().any(|pool| buyable.contains(pool)),
            "it buys where capacity is: {decision:?}"
        );
    }

    #[test]
    fn spec_bounds_clamp_the_bidder() {
        let pinned = job(3, 3);
        let decision = decide(&planner(), &pinned, &[], "2026-11-23T10:00:00Z");
        assert_eq!(decision.total(), 3, "{decision:?}");
        let none = job(0, 0);
        assert!(
            decide(&planner(), &none, &[], "2026-11-23T10:00:00Z")
                .transient
                .is_empty()
        );
    }

    #[test]
    fn other_strategies_and_markets_fall_back_on_the_spec() {
        let planner = planner();
        let standard = job(0, 2).with_strategy(BiddingStrategy::Standard);
        assert_eq!(
            decide(&planner, &standard, &[], "2026-11-23T10:00:00Z"),
            decide(&SpecCapacityPlanner, &standard, &[], "2026-11-23T10:00:00Z")
        );
        let live = job(0, 2).with_ec2_market("us-east-1");
        let decision = decide(&planner, &live, &[], "2026-11-23T10:00:00Z");
        assert_eq!(decision.reason, "NoMarketView");
        assert_eq!(decision.total(), 2);

        let mut missing = job(0, 2);
        missing.spec.bidding.market = MarketSpec {
            trace: Some("no-such-trace.csv".into()),
            ..missing.spec.bidding.market.clone()
        };
        let decision = decide(&planner, &missing, &[], "2026-11-23T10:00:00Z");
        assert_eq!(decision.reason, "MarketUnavailable");
        assert_eq!(decision.total(), 2, "the job still runs on maxNodes");
    }

    #[test]
    fn trace_time_follows_wall_time_since_creation() {
        let job = job(0, 4);
        let setup = setup_market(&job, &spot_data()).unwrap();
        // a day later at 60x: 60 trace days later, past the trace's end → the last slot
        let alive = BTreeMap::new();
        let launched = BTreeMap::new();
        let noticed = BTreeSet::new();
        let view = |now: &str| CapacityView {
            job: &job,
            alive: &alive,
            launched: &launched,
            pools_under_notice: &noticed,
            coordinator: None,
            now: now.parse().unwrap(),
        };
        let at_start = decide_on(&setup, 1.0, &view("2026-11-23T10:00:00Z"));
        let at_end = decide_on(&setup, 60.0, &view("2026-11-24T10:00:00Z"));
        let last = setup.grid.slots - 1;
        let buyable_last: BTreeSet<PoolKey> = (0..setup.grid.pools.len())
            .filter(|&pool| setup.grid.price(pool, last).is_some())
            .map(|pool| pool_key(&setup.grid.pools[pool], market::CapacityType::Spot))
            .collect();
        for pool in at_end.transient.keys() {
            assert!(buyable_last.contains(pool), "{pool:?} at the trace's end");
        }
        assert!(at_start.total() > 0);
    }
}
