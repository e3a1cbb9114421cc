//! Bidder decisions in named scenarios.

use super::*;
use crate::eviction::EvictionConfig;
use crate::market::{GapPolicy, Market, PoolId, PoolSeries, Quote, Sample};

const CHURNY: usize = 0;
const STABLE: usize = 1;

fn info(zone: &str) -> PoolInfo {
    PoolInfo {
        id: PoolId {
            instance_type: "c5.xlarge".into(),
            zone: zone.into(),
            capacity: CapacityType::Spot,
        },
        vcpus: 4.0,
        memory_gib: Some(8.0),
        on_demand_usd_hr: Some(1.0),
    }
}

/// Pool 0 is up 30 minutes then down 10, over and over; pool 1 never goes away.
fn eviction_model() -> EvictionModel {
    let samples = |up: &dyn Fn(i64) -> bool| -> Vec<Sample> {
        (0..6000)
            .map(|m| Sample {
                at: m * 60,
                price: Some(0.3),
                available: up(m),
            })
            .collect()
    };
    let market = Market {
        source: "scenario".into(),
        gap: GapPolicy::for_interval(60),
        pools: vec![
            PoolSeries {
                info: info("churny"),
                samples: samples(&|m| m % 40 < 30),
                has_availability: true,
            },
            PoolSeries {
                info: info("stable"),
                samples: samples(&|_| true),
                has_availability: true,
            },
        ],
    };
    EvictionModel::fit(
        &market,
        EvictionConfig {
            bid_deltas: vec![0.0001, 0.5],
            step_seconds: 60.0,
            max_horizon_seconds: 6.0 * 3600.0,
            min_launches: 5,
        },
    )
    .unwrap()
}

struct Scenario {
    pools: Vec<PoolInfo>,
    view: MarketView,
    allocations: Vec<Allocation>,
    reliable: ReliableTier,
    app: AppModel,
    job: JobState,
    config: BidderConfig,
    billing: BillingModel,
}

impl Scenario {
    fn new(billing: BillingModel) -> Self {
        Self {
            pools: vec![info("churny"), info("stable")],
            view: MarketView {
                at: 1_000_000,
                quotes: vec![
                    Quote {
                        price: Some(0.3),
                        available: true,
                        up_since: None,
                    };
                    2
                ],
            },
            allocations: Vec::new(),
            reliable: ReliableTier {
                count: 1,
                vcpus: 4.0,
                usd_hr: 1.0,
            },
            app: AppModel::default(),
            job: JobState {
                remaining_work: 1e9,
                ..JobState::default()
            },
            config: BidderConfig {
                max_transient: 8,
                ..BidderConfig::default()
            },
            billing,
        }
    }

    fn price(mut self, pool: usize, price: Option<f64>, available: bool) -> Self {
        self.view.quotes[pool] = Quote {
            price,
            available,
            up_since: None,
        };
        self
    }

    fn holding(mut self, id: u64, pool: usize, count: u32, max_price: f64, age: i64) -> Self {
        self.allocations.push(Allocation {
            id,
            pool,
            capacity: CapacityType::Spot,
            count,
            max_price: Some(max_price),
            launched_at: self.view.at - age,
        });
        self
    }

    fn clone_allocations(&self) -> Vec<Allocation> {
        self.allocations.clone()
    }

    fn decide(&self, model: &EvictionModel) -> Decision {
        let bidder = Bidder {
            config: self.config.clone(),
            billing: self.billing,
            eviction: model,
        };
        bidder.decide(&BidderInput {
            now: self.view.at,
            pools: &self.pools,
            market: &self.view,
            allocations: &self.allocations,
            reliable: &self.reliable,
            app: &self.app,
            job: &self.job,
        })
    }
}

#[test]
fn fills_the_transient_tier_from_the_cheapest_pool_per_work() {
    let model = eviction_model();
    let decision = Scenario::new(BillingModel::Gcp)
        .price(CHURNY, Some(0.5), true)
        .price(STABLE, Some(0.2), true)
        .decide(&model);
    assert_eq!(decision.acquire.len(), 1, "{decision:?}");
    assert_eq!(decision.acquire[0].pool, STABLE);
    assert_eq!(decision.acquire[0].count, 8);
    assert!(decision.cost_per_work_after < decision.cost_per_work_before);
    assert!(decision.no_feasible_pool.is_none());
}

#[test]
fn hourly_refunds_make_a_churny_pool_worth_it() {
    // same price; the churny pool is usually evicted within the hour, which refunds it
    let model = eviction_model();
    let mut scenario = Scenario::new(BillingModel::AwsHourly2016);
    scenario.app.lambda_seconds = 10.0;
    let decision = scenario.decide(&model);
    assert_eq!(decision.acquire[0].pool, CHURNY, "{decision:?}");
    // without refunds the evictions only cost work: the stable pool wins
    let mut scenario = Scenario::new(BillingModel::Gcp);
    scenario.app.lambda_seconds = 10.0;
    let decision = scenario.decide(&model);
    assert_eq!(decision.acquire[0].pool, STABLE, "{decision:?}");
}

#[test]
fn says_so_when_no_pool_is_feasible() {
    let model = eviction_model();
    let decision = Scenario::new(BillingModel::Aws)
        .price(CHURNY, Some(0.3), false)
        .price(STABLE, None, true)
        .decide(&model);
    assert!(decision.acquire.is_empty());
    let reason = decision
        .no_feasible_pool
        .expect("no feasible pool reported");
    assert_eq!(reason.unavailable, 1);
    assert_eq!(reason.unpriced, 1);
    assert!(reason.to_string().contains("no feasible spot pool"));
    assert!(decision.next_decision_at > 1_000_000);
}

#[test]
fn releases_before_the_boundary_when_the_price_rose_and_buys_elsewhere() {
    let model = eviction_model();
    // 59 minutes into its hour, pool STABLE now costs more than on-demand per work
    let decision = Scenario::new(BillingModel::AwsHourly2016)
        .price(STABLE, Some(5.0), true)
        .price(CHURNY, Some(0.3), true)
        .holding(7, STABLE, 8, 10.0, 59 * 60)
        .decide(&model);
    assert_eq!(decision.release, vec![7], "{decision:?}");
    assert_eq!(decision.acquire[0].pool, CHURNY);
    // 57 minutes in, a release would pay three minutes for nothing and another decision
    // (in 2 minutes) still comes before the boundary: keep it until then
    let decision = Scenario::new(BillingModel::AwsHourly2016)
        .price(STABLE, Some(5.0), true)
        .price(CHURNY, Some(0.3), true)
        .holding(7, STABLE, 8, 10.0, 57 * 60)
        .decide(&model);
    assert!(decision.release.is_empty(), "{decision:?}");
    assert_eq!(decision.next_decision_at, 1_000_000 + 120);
    // the same allocation mid-hour is kept: its hour is paid for
    let mut scenario = Scenario::new(BillingModel::AwsHourly2016)
        .price(STABLE, Some(5.0), true)
        .holding(7, STABLE, 8, 10.0, 20 * 60);
    scenario.config.interval_seconds = 3600;
    let decision = scenario.decide(&model);
    assert!(decision.release.is_empty(), "{decision:?}");
    // and the next decision comes before its boundary, not at the (longer) interval
    assert_eq!(decision.next_decision_at, 1_000_000 + 40 * 60 - 300);
}

#[test]
fn keeps_a_good_footprint_without_churn() {
    let model = eviction_model();
    let decision = Scenario::new(BillingModel::Gcp)
        .holding(1, STABLE, 8, 0.8, 600)
        .decide(&model);
    assert!(decision.acquire.is_empty(), "{decision:?}");
    assert!(decision.release.is_empty(), "{decision:?}");
    assert_eq!(decision.cost_per_work_after, decision.cost_per_work_before);
}

#[test]
fn a_deadline_buys_on_demand_when_spot_is_gone() {
    let model = eviction_model();
    let mut scenario = Scenario::new(BillingModel::Aws)
        .price(CHURNY, None, false)
        .price(STABLE, None, false);
    // 4 reliable vCPUs give 4 work/s; 10 h left for 360k work needs 10/s
    scenario.job.remaining_work = 360_000.0;
    scenario.job.deadline = Some(scenario.view.at + 36_000);
    let decision = scenario.decide(&model);
    assert!(decision.no_feasible_pool.is_some());
    let on_demand: u32 = decision
        .acquire
        .iter()
        .filter(|r| r.capacity == CapacityType::OnDemand)
        .map(|r| r.count)
        .sum();
    assert!(on_demand >= 2, "{decision:?}");
    assert!(!decision.deadline_at_risk, "{decision:?}");
    // an impossible deadline is reported, not spun on
    scenario.job.remaining_work = 1e9;
    let decision = scenario.decide(&model);
    assert!(decision.deadline_at_risk);
    assert!(decision.acquire.iter().map(|r| r.count).sum::<u32>() <= 8);
}

/// Once the deadline has passed it is reported, and the decision is the one without a deadline
/// (the lowest cost per work). Before, the rate asked for was infinite: every decision bought up
/// to maxNodes, on-demand included, and released nothing.
#[test]
fn a_passed_deadline_is_reported_and_does_not_buy_everything() {
    let model = eviction_model();
    let mut scenario = Scenario::new(BillingModel::Aws)
        .price(CHURNY, None, false)
        .price(STABLE, None, false);
    scenario.job.remaining_work = 360_000.0;
    let calm = scenario.decide(&model);
    scenario.job.deadline = Some(scenario.view.at - 1);
    let late = scenario.decide(&model);
    assert!(late.deadline_at_risk, "{late:?}");
    assert_eq!(late.acquire, calm.acquire, "{late:?}");
    assert_eq!(late.release, calm.release, "{late:?}");
}

#[test]
fn budgets_cap_spending() {
    let model = eviction_model();
    let mut scenario = Scenario::new(BillingModel::Gcp);
    // 1 USD/h reliable + 3 × 0.3 USD/h fits under 2 USD/h, a fourth does not
    scenario.job.budget_per_hour_usd = Some(2.0);
    let decision = scenario.decide(&model);
    let total: u32 = decision.acquire.iter().map(|r| r.count).sum();
    assert_eq!(total, 3, "{decision:?}");
    scenario.job.budget_remaining_usd = Some(0.0);
    let scenario = scenario.holding(3, STABLE, 2, 1.0, 100);
    let decision = scenario.decide(&model);
    assert!(decision.budget_exhausted);
    assert_eq!(decision.release, vec![3]);
    assert!(decision.acquire.is_empty());
}

#[test]
fn budget_per_hour_holds_for_what_is_held() {
    let model = eviction_model();
    // held: 4 stable at 0.3 and 2 churny; prices rose to 0.45 (stable) and 0.6 (churny), so
    // 1 + 4 × 0.45 + 2 × 0.6 = 4 USD/h against a cap of 2.5
    let mut scenario = Scenario::new(BillingModel::Gcp)
        .price(STABLE, Some(0.45), true)
        .price(CHURNY, Some(0.6), true)
        .holding(1, STABLE, 4, 0.9, 600)
        .holding(2, CHURNY, 2, 0.9, 600);
    scenario.job.budget_per_hour_usd = Some(2.5);
    let decision = scenario.decide(&model);
    assert!(decision.over_budget_per_hour, "{decision:?}");
    // the dearest (churny) goes first; then the stable allocation is still over the cap, so
    // it goes too and what fits (3 × 0.45 ≤ 1.5) may be bought back
    assert!(decision.release.contains(&2), "{decision:?}");
    let kept: f64 = scenario
        .allocations
        .iter()
        .filter(|a| !decision.release.contains(&a.id))
        .map(|a| f64::from(a.count) * scenario.view.quotes[a.pool].price.unwrap())
        .sum();
    let bought: f64 = decision
        .acquire
        .iter()
        .map(|r| f64::from(r.count) * scenario.view.quotes[r.pool].price.unwrap())
        .sum();
    assert!(1.0 + kept + bought <= 2.5 + 1e-9, "{decision:?}");
    assert!(kept + bought > 0.0, "{decision:?}");

    // within the cap nothing is released for it
    scenario.job.budget_per_hour_usd = Some(10.0);
    let decision = scenario.decide(&model);
    assert!(!decision.over_budget_per_hour, "{decision:?}");
}

#[test]
fn decisions_are_deterministic() {
    let model = eviction_model();
    let scenario = Scenario::new(BillingModel::Aws).holding(1, CHURNY, 2, 0.31, 1000);
    assert_eq!(scenario.decide(&model), scenario.decide(&model));
}

#[test]
fn under_aws_an_instance_about_to_leave_its_free_hour_is_replaced_by_a_fresh_one() {
    let model = eviction_model();
    // 56 minutes old in the churny pool: past the hour an interruption is no longer free, while
    // a fresh allocation in the same pool is again refunded if interrupted in its first hour
    let mut scenario = Scenario::new(BillingModel::Aws).holding(4, CHURNY, 8, 0.31, 56 * 60);
    scenario.app.lambda_seconds = 10.0;
    let decision = scenario.decide(&model);
    assert_eq!(decision.release, vec![4], "{decision:?}");
    assert_eq!(
        decision.acquire.iter().map(|r| r.count).sum::<u32>(),
        8,
        "{decision:?}"
    );
    // without refunds a fresh allocation only costs its start-up time: a good one is kept
    let mut scenario = Scenario::new(BillingModel::Gcp).holding(4, STABLE, 8, 0.31, 56 * 60);
    scenario.app.lambda_seconds = 10.0;
    let decision = scenario.decide(&model);
    assert!(decision.release.is_empty(), "{decision:?}");
}

#[test]
fn a_held_instance_is_as_likely_to_be_evicted_as_a_fresh_one_in_the_same_pool() {
    // evictions are the pool's: 25 minutes into a 30-minute up-cycle says nothing about the
    // instance that the pool's state (run age, headroom) does not, so with the same headroom a
    // held and a fresh allocation expect the same work and, without refunds, the same cost
    let model = eviction_model();
    let scenario = Scenario::new(BillingModel::Gcp);
    let bidder = Bidder {
        config: scenario.config.clone(),
        billing: scenario.billing,
        eviction: &model,
    };
    let input = BidderInput {
        now: scenario.view.at,
        pools: &scenario.pools,
        market: &scenario.view,
        allocations: &[],
        reliable: &scenario.reliable,
        app: &scenario.app,
        job: &scenario.job,
    };
    let term = |age: f64| {
        bidder
            .term(
                &input,
                CHURNY,
                CapacityType::Spot,
                4.0,
                Some(0.31),
                age,
                false,
            )
            .unwrap()
    };
    let (fresh, held) = (term(0.0), term(25.0 * 60.0));
    assert!((fresh.work - held.work).abs() < 1e-9, "{fresh:?} {held:?}");
    assert!((fresh.cost - held.cost).abs() < 1e-9, "{fresh:?} {held:?}");
    assert!(
        fresh.survive < 0.5,
        "the churny pool is mostly evicted within the hour: {fresh:?}"
    );
}

#[test]
fn a_release_pays_the_rest_of_a_started_hour_only_under_hourly_billing() {
    let model = eviction_model();
    for (billing, expected) in [
        (BillingModel::AwsHourly2016, 8.0 * 0.3 * 300.0 / 3600.0),
        (BillingModel::Aws, 0.0),
        (BillingModel::Gcp, 0.0),
    ] {
        // 55 minutes in: 5 minutes of the hour left
        let scenario = Scenario::new(billing).holding(7, STABLE, 8, 1.3, 55 * 60);
        let bidder = Bidder {
            config: scenario.config.clone(),
            billing,
            eviction: &model,
        };
        let input = BidderInput {
            now: scenario.view.at,
            pools: &scenario.pools,
            market: &scenario.view,
            allocations: &scenario.allocations,
            reliable: &scenario.reliable,
            app: &scenario.app,
            job: &scenario.job,
        };
        let term = bidder.release_term(
            &input,
            &scenario.allocations[0],
            scenario.allocations[0].count,
        );
        assert!((term.cost - expected).abs() < 1e-12, "{billing}: {term:?}");
        assert_eq!((term.work, term.count), (0.0, 0.0));
    }
}

fn table(points: &[(f64, f64)]) -> ThroughputTable {
    ThroughputTable::new(points.to_vec()).unwrap()
}

#[test]
fn a_throughput_table_scales_expected_work_by_its_value_at_the_footprints_ratio() {
    // φ = 1 and no stage 3: the linear model is a table that reads 1 everywhere
    let model = eviction_model();
    let mut scenario = Scenario::new(BillingModel::Gcp)
        .price(CHURNY, None, false)
        .holding(1, STABLE, 4, 1.3, 600);
    scenario.app.phi = 1.0;
    scenario.app.stage3_ratio = f64::INFINITY;
    let linear = scenario.decide(&model).cost_per_work_before;
    scenario.config.throughput = Some(table(&[(0.0, 1.0), (8.0, 1.0)]));
    let flat = scenario.decide(&model).cost_per_work_before;
    assert!((flat - linear).abs() < 1e-12 * linear, "{flat} {linear}");
    // 4 transient : 1 reliable, halfway between 2:1 (0.5) and 6:1 (0.9): 0.7 of the work,
    // λ loss included, at the same cost
    scenario.config.throughput = Some(table(&[(0.0, 1.0), (2.0, 0.5), (6.0, 0.9)]));
    let measured = scenario.decide(&model).cost_per_work_before;
    assert!(
        (measured - linear / 0.7).abs() < 1e-9 * linear,
        "{measured} vs {}",
        linear / 0.7
    );
}

#[test]
fn a_table_that_collapses_at_high_ratios_keeps_the_transient_tier_small() {
    let model = eviction_model();
    let mut scenario = Scenario::new(BillingModel::Gcp).price(CHURNY, None, false);
    let held = |decision: &Decision| decision.acquire.iter().map(|a| a.count).sum::<u32>();
    let linear = scenario.decide(&model);
    assert_eq!(held(&linear), 8, "{linear:?}");
    // throughput falls to a tenth from 3:1 on: the bidder stops short of that
    scenario.config.throughput = Some(table(&[(0.0, 1.0), (1.0, 1.0), (3.0, 0.1)]));
    let measured = scenario.decide(&model);
    let count = held(&measured);
    assert!((1..=2).contains(&count), "{measured:?}");
}

#[test]
fn with_a_table_the_bidder_scores_the_counts_that_reach_each_measured_ratio() {
    // 4:1 is the only good split: 1 and 8 instances (1:1, 8:1) are both worse than none
    let model = eviction_model();
    let mut scenario = Scenario::new(BillingModel::Gcp).price(CHURNY, None, false);
    scenario.config.throughput = Some(table(&[(0.0, 1.0), (1.0, 0.3), (4.0, 1.0), (8.0, 0.2)]));
    let decision = scenario.decide(&model);
    let counts: Vec<u32> = decision.acquire.iter().map(|a| a.count).collect();
    assert_eq!(counts, vec![4], "{decision:?}");
}

#[test]
fn min_transient_holds_while_the_market_allows() {
    let model = eviction_model();
    // spot at 0.99 of on-demand: no addition lowers the cost per work, so without a minimum
    // the bidder buys nothing
    let mut scenario = Scenario::new(BillingModel::Gcp)
        .price(CHURNY, Some(0.995), true)
        .price(STABLE, Some(0.99), true);
    let decision = scenario.decide(&model);
    assert!(decision.acquire.is_empty(), "{decision:?}");
    assert_eq!(decision.min_transient, None);

    // minimum 3: three in the cheapest pool, bidding its ceiling (on-demand here)
    scenario.config.min_transient = 3;
    let decision = scenario.decide(&model);
    assert_eq!(
        decision.acquire,
        vec![AllocationRequest {
            pool: STABLE,
            capacity: CapacityType::Spot,
            count: 3,
            max_price: Some(1.0),
        }],
        "{decision:?}"
    );
    assert_eq!(
        decision.min_transient,
        Some(MinTransientFill::Filled { count: 3 })
    );

    // what is held counts, and is kept for the minimum even where the cost per work alone
    // would release it: one held, two bought
    let held = Scenario {
        allocations: Vec::new(),
        pools: scenario.pools.clone(),
        view: scenario.view.clone(),
        reliable: scenario.reliable.clone(),
        app: scenario.app.clone(),
        job: scenario.job.clone(),
        config: scenario.config.clone(),
        billing: scenario.billing,
    }
    .holding(9, CHURNY, 1, 1.0, 600);
    let decision = held.decide(&model);
    let bought: u32 = decision.acquire.iter().map(|r| r.count).sum();
    assert_eq!(bought, 2, "{decision:?}");
    assert!(decision.release.is_empty(), "{decision:?}");
    let mut no_minimum = held;
    no_minimum.config.min_transient = 0;
    assert_eq!(no_minimum.decide(&model).release, vec![9]);

    // budgetPerHour limits it: 1 (reliable) + 2 × 0.99 fits under 3, a third does not
    scenario.job.budget_per_hour_usd = Some(3.0);
    let decision = scenario.decide(&model);
    assert_eq!(
        decision.min_transient,
        Some(MinTransientFill::BudgetLimited {
            count: 2,
            missing: 1
        }),
        "{decision:?}"
    );
    scenario.job.budget_per_hour_usd = None;

    // above the job's max price nothing is bought, and the decision says why
    scenario.config.max_price_cap = Some(0.5);
    let decision = scenario.decide(&model);
    assert!(decision.acquire.is_empty(), "{decision:?}");
    assert_eq!(
        decision.min_transient,
        Some(MinTransientFill::NoFeasiblePool(NoFeasiblePool {
            above_max_price: 2,
            ..NoFeasiblePool::default()
        }))
    );
}

#[test]
fn a_lowered_maximum_releases_whole_allocations_then_part_of_one() {
    let model = eviction_model();
    // 7 held in the stable pool (4 older, 3 newer): the maximum was lowered to 5
    let mut scenario = Scenario::new(BillingModel::Gcp)
        .holding(1, STABLE, 4, 0.9, 3600)
        .holding(2, STABLE, 3, 0.9, 600);
    scenario.config.max_transient = 5;
    let decision = scenario.decide(&model);
    assert!(decision.over_max_transient, "{decision:?}");
    // alike per work: the newest goes first, part of it
    assert!(decision.release.is_empty(), "{decision:?}");
    assert_eq!(decision.shrink, vec![Shrink { id: 2, count: 2 }]);
    assert!(decision.acquire.is_empty(), "{decision:?}");
    // the decision's cost per work is that of the 5 kept, not of the 7 held
    let mut kept = scenario.clone_allocations();
    kept[1].count = 1;
    let mut five = Scenario::new(BillingModel::Gcp);
    five.allocations = kept;
    five.config.max_transient = 5;
    let held_five = five.decide(&model);
    assert!(!held_five.over_max_transient, "{held_five:?}");
    assert!(
        (decision.cost_per_work_after - held_five.cost_per_work_before).abs()
            < 1e-9 * held_five.cost_per_work_before,
        "{decision:?} against {held_five:?}"
    );

    // lowered to 2: the newer allocation goes whole, then 2 of the older
    scenario.config.max_transient = 2;
    let decision = scenario.decide(&model);
    assert_eq!(decision.release, vec![2], "{decision:?}");
    assert_eq!(decision.shrink, vec![Shrink { id: 1, count: 2 }]);
    assert!(decision.acquire.is_empty(), "{decision:?}");

    // within the maximum nothing is cut for it
    scenario.config.max_transient = 7;
    let decision = scenario.decide(&model);
    assert!(!decision.over_max_transient, "{decision:?}");
    assert!(decision.shrink.is_empty() && decision.release.is_empty());
}

#[test]
fn a_lowered_maximum_cuts_the_dearest_per_work_first() {
    let model = eviction_model();
    // hourly billing, both 10 minutes into their hour (no release is weighed before the
    // boundary); the older allocation is in the pool now dearer per work (its price rose)
    let mut scenario = Scenario::new(BillingModel::AwsHourly2016)
        .price(STABLE, Some(0.9), true)
        .holding(1, STABLE, 4, 1.0, 600)
        .holding(2, CHURNY, 2, 0.9, 600);
    scenario.config.max_transient = 5;
    let decision = scenario.decide(&model);
    assert!(decision.over_max_transient, "{decision:?}");
    assert!(decision.release.is_empty(), "{decision:?}");
    assert_eq!(decision.shrink, vec![Shrink { id: 1, count: 1 }]);
    // lowered to 3: still the dearer allocation, 3 of its 4
    scenario.config.max_transient = 3;
    let decision = scenario.decide(&model);
    assert!(decision.release.is_empty(), "{decision:?}");
    assert_eq!(decision.shrink, vec![Shrink { id: 1, count: 3 }]);
    // lowered to 1: the dearer one whole, then one of the other
    scenario.config.max_transient = 1;
    let decision = scenario.decide(&model);
    assert_eq!(decision.release, vec![1], "{decision:?}");
    assert_eq!(decision.shrink, vec![Shrink { id: 2, count: 1 }]);

    // an allocation the model cannot price (its pool is gone) goes before any other
    let mut scenario = Scenario::new(BillingModel::Gcp)
        .price(CHURNY, Some(0.3), false)
        .holding(1, STABLE, 4, 0.9, 600)
        .holding(2, CHURNY, 2, 0.9, 3600);
    scenario.config.max_transient = 4;
    let decision = scenario.decide(&model);
    assert_eq!(decision.release, vec![2], "{decision:?}");
    assert!(decision.shrink.is_empty(), "{decision:?}");
}

#[test]
fn renewal_values_a_short_refunded_ride_as_the_bidder_will_renew_it() {
    let model = eviction_model();
    // under `aws` the churny pool (up 30 minutes, down 10) is interrupted within its first
    // hour, so it is free; the stable pool is paid, at 0.4 of its price. Single window: the
    // churny allocation is gone for the last part of the hour while the reliable node is still
    // paid, and the stable pool wins; renewed, the free rides do.
    let mut scenario = Scenario::new(BillingModel::Aws)
        .price(CHURNY, Some(0.3), true)
        .price(STABLE, Some(0.12), true);
    let renewed = scenario.decide(&model);
    scenario.config.renewal = false;
    let one_window = scenario.decide(&model);
    assert_eq!(one_window.acquire[0].pool, STABLE, "{one_window:?}");
    assert_eq!(renewed.acquire[0].pool, CHURNY, "{renewed:?}");
}
