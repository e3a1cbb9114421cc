//! BidBrain: choose what transient capacity to hold so that the expected cost per unit of work
//! `E = C/W` of the whole footprint is lowest (seed 003 §4.3, eqs. 4.1–4.4).
//!
//! [`Bidder::decide`] is pure and deterministic: given the job's allocations, the market as
//! seen at one instant, the eviction model and the application model, it returns a
//! [`Decision`]. The simulator, `ebbflow run` and the operator's controller all call it; the
//! caller applies the decision and calls again at [`Decision::next_decision_at`], after every
//! eviction, and whenever its inputs change.
//!
//! Every term is taken over the same window: the next `horizon_seconds` (one hour by default)
//! from the decision, for held allocations, candidates and the reliable tier alike.
//!
//! - Expected cost per allocation (eq. 4.1, refunds from the [`BillingModel`], see
//!   [`BillingModel::expected_charge_over`]): each billing period in the window is weighed by
//!   the probability that the allocation still runs then — `(1 − β) · P · k · t` for a period
//!   refunded on eviction, `P · k · E[up]` where it is paid while it runs.
//! - β and `E[up]` come from the pool's state at the decision (current headroom over the price
//!   and, with availability data, how long the pool has been buyable): evictions belong to the
//!   pool, so a held instance and a fresh one in the same pool have the same outlook; the
//!   instance's age only sets its billing periods.
//! - Expected useful time (eq. 4.2): `Δt_i = ω_i − (1 − Π(1 − β_j)) · λ`, where `ω_i` is the
//!   expected running time in the window (minus σ for an allocation being added).
//! - Expected work (eq. 4.3): `Σ k_i · Δt_i · ν_i`, each tier's ν scaled by
//!   [`AppModel::efficiency`] at the footprint's transient:reliable ratio: φ for transient nodes
//!   and reliable nodes idle in AgileML stage 3, or, with a measured [`ThroughputTable`]
//!   ([`BidderConfig::throughput`]), the table's relative throughput for both tiers.
//! - A candidate (pool, count, max price) is added only if it lowers `E` (eq. 4.4); an
//!   allocation is released shortly before its billing boundary (or at any decision where the
//!   model has none) if `E` is lower without it, counting what the release still costs (the
//!   rest of a started hour under `aws-hourly-2016`, where it also waits for the last decision
//!   before the boundary). Reliable nodes are fixed by the spec.
//! - Budgets cap spending; a deadline makes the bidder add capacity (on-demand if need be)
//!   even when that raises `E`.

pub mod app;
pub mod calibration;
pub mod probe;

use std::fmt;

pub use app::{
    AppModel, Calibrator, Efficiency, Measurement, MeasurementCounts, ThroughputFeed,
    ThroughputTable,
};
pub use calibration::{Calibration, CalibrationError};

use crate::billing::BillingModel;
use crate::eviction::EvictionModel;
use crate::market::{CapacityType, MarketView, PoolInfo, Quote, Timestamp};

/// A set of instances of one pool bought at the same time and max price.
#[derive(Clone, Debug, PartialEq)]
pub struct Allocation {
    /// Caller-chosen identity, echoed in [`Decision::release`].
    pub id: u64,
    /// Index into the pool list given with the market view.
    pub pool: usize,
    /// Spot, or on-demand capacity bought for the transient tier (deadline pressure).
    pub capacity: CapacityType,
    /// Number of instances.
    pub count: u32,
    /// Max price in USD per instance-hour (spot only).
    pub max_price: Option<f64>,
    /// When the instances were launched.
    pub launched_at: Timestamp,
}

/// An allocation the bidder asks for.
#[derive(Clone, Debug, PartialEq)]
pub struct AllocationRequest {
    /// Index into the pool list.
    pub pool: usize,
    /// Spot or on-demand.
    pub capacity: CapacityType,
    /// Number of instances.
    pub count: u32,
    /// Max price in USD per instance-hour (spot only).
    pub max_price: Option<f64>,
}

/// The reliable tier, fixed by the spec: never bought or released by the bidder.
#[derive(Clone, Debug, PartialEq)]
pub struct ReliableTier {
    /// Number of on-demand nodes.
    pub count: u32,
    /// vCPUs per node.
    pub vcpus: f64,
    /// On-demand price in USD per node-hour.
    pub usd_hr: f64,
}

/// The job's progress and constraints at the decision.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct JobState {
    /// Work still to do (in ν units).
    pub remaining_work: f64,
    /// Finish by this instant.
    pub deadline: Option<Timestamp>,
    /// USD left of the job's total budget.
    pub budget_remaining_usd: Option<f64>,
    /// Cap on spending in USD per hour across both tiers at current prices.
    pub budget_per_hour_usd: Option<f64>,
}

/// Settings of the bidder.
#[derive(Clone, Debug, PartialEq)]
pub struct BidderConfig {
    /// Seconds between periodic decisions (default 120, as in Proteus).
    pub interval_seconds: i64,
    /// Decide this long before an allocation's billing boundary (default 300).
    pub boundary_lead_seconds: i64,
    /// Window over which every expected cost and work is taken, from the decision (default one
    /// hour; longer windows price hours the bidder would not keep: see docs/bidder.md).
    pub horizon_seconds: f64,
    /// Most transient instances held at once.
    pub max_transient: u32,
    /// Transient instances held "while the market allows" (the spec's `minNodes`): bought in
    /// the cheapest spot pool priced within the bid ceiling, as many as fit under
    /// `budgetPerHour`, whatever they do to the cost per work (default 0).
    pub min_transient: u32,
    /// Highest max price ever bid in USD per instance-hour.
    pub max_price_cap: Option<f64>,
    /// A candidate must lower `E` by at least this fraction (hysteresis, default 0.5%).
    pub min_improvement: f64,
    /// Measured throughput against the transient:reliable ratio (a calibration file); `None`:
    /// the application model's linear φ term.
    pub throughput: Option<ThroughputTable>,
    /// Renewal (default): a spot allocation expected to be evicted inside the window is valued
    /// as renewed on the same terms until the window ends (`window / E[up]` lives, σ for each
    /// after the first, λ for each expected eviction), since the bidder decides again at every
    /// eviction. `false`: eq. 4.2's single window, where an allocation evicted early is worth
    /// nothing for the rest of it while the reliable tier is still paid, which undervalues short
    /// refundable rides (docs/bidder.md, "Renewal").
    pub renewal: bool,
}

impl Default for BidderConfig {
    fn default() -> Self {
        Self {
            interval_seconds: 120,
            boundary_lead_seconds: 300,
            horizon_seconds: 3600.0,
            max_transient: 16,
            min_transient: 0,
            max_price_cap: None,
            min_improvement: 0.005,
            throughput: None,
            renewal: true,
        }
    }
}

/// Why no spot pool could be bought from.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct NoFeasiblePool {
    /// Pools without capacity at the decision.
    pub unavailable: usize,
    /// Pools whose price is unknown (gap) at the decision.
    pub unpriced: usize,
    /// Pools whose price is above the max price cap.
    pub above_max_price: usize,
}

impl fmt::Display for NoFeasiblePool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "no feasible spot pool: {} unavailable, {} without a known price, {} above the max price",
            self.unavailable, self.unpriced, self.above_max_price
        )
    }
}

impl NoFeasiblePool {
    /// `quote`'s price if capacity can be bought at it within `ceiling`; otherwise counts why
    /// not and gives `None`.
    fn admit(&mut self, quote: &Quote, ceiling: f64) -> Option<f64> {
        if !quote.available {
            self.unavailable += 1;
            return None;
        }
        let Some(price) = quote.price else {
            self.unpriced += 1;
            return None;
        };
        if price > ceiling {
            self.above_max_price += 1;
            return None;
        }
        Some(price)
    }
}

/// Transient instances of `input.allocations` that `release` does not name, less what `shrink`
/// releases of them.
fn held_count(input: &BidderInput<'_>, release: &[u64], shrink: &[Shrink]) -> u32 {
    input
        .allocations
        .iter()
        .filter(|a| !release.contains(&a.id))
        .map(|a| a.count.saturating_sub(shrunk(shrink, a.id)))
        .sum()
}

/// Instances `shrink` releases of allocation `id`.
fn shrunk(shrink: &[Shrink], id: u64) -> u32 {
    shrink.iter().filter(|s| s.id == id).map(|s| s.count).sum()
}

/// What a decision did to hold [`BidderConfig::min_transient`] (absent: what is kept and bought
/// for the cost per work already holds it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MinTransientFill {
    /// This many instances were bought for the minimum alone.
    Filled {
        /// Instances bought.
        count: u32,
    },
    /// Fewer instances than missing fit under `budgetPerHour`.
    BudgetLimited {
        /// Instances bought.
        count: u32,
        /// Instances the minimum still lacks.
        missing: u32,
    },
    /// No spot pool is priced within the bid ceiling (the job's max price and on-demand):
    /// nothing was bought.
    NoFeasiblePool(NoFeasiblePool),
}

/// Part of a held allocation to release: `count` of its instances go, the rest stay held
/// (launched when they were, at the bid they were launched under).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shrink {
    /// The allocation's id.
    pub id: u64,
    /// Instances to release (fewer than the allocation holds).
    pub count: u32,
}

/// What the bidder wants done.
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    /// Allocations to buy.
    pub acquire: Vec<AllocationRequest>,
    /// Allocation ids to release now.
    pub release: Vec<u64>,
    /// Allocations to release part of now (only where more is held than
    /// [`BidderConfig::max_transient`] allows: a lowered maximum).
    pub shrink: Vec<Shrink>,
    /// Expected cost per work of the footprint as it was, USD per work unit.
    pub cost_per_work_before: f64,
    /// Expected cost per work after the decision.
    pub cost_per_work_after: f64,
    /// Call again at this instant at the latest.
    pub next_decision_at: Timestamp,
    /// Set when no spot pool could be bought from at all.
    pub no_feasible_pool: Option<NoFeasiblePool>,
    /// Set when the deadline cannot be met even with every allowed addition.
    pub deadline_at_risk: bool,
    /// Set when the total budget is spent: every transient allocation is released.
    pub budget_exhausted: bool,
    /// Set when what is held costs more per hour at current prices than `budgetPerHour`:
    /// the dearest allocations are released until the rest fits.
    pub over_budget_per_hour: bool,
    /// What holding the minimum of transient instances took, if anything.
    pub min_transient: Option<MinTransientFill>,
    /// Set when more transient instances were held than [`BidderConfig::max_transient`]
    /// allows (it was lowered under a running job): the instances dearest per unit of work
    /// are released (`release` and `shrink`) down to the maximum.
    pub over_max_transient: bool,
}

impl Decision {
    /// Instances of `allocation` the decision keeps: none if it releases it, else what a
    /// shrink leaves.
    pub fn kept(&self, allocation: &Allocation) -> u32 {
        if self.release.contains(&allocation.id) {
            return 0;
        }
        allocation
            .count
            .saturating_sub(shrunk(&self.shrink, allocation.id))
    }
}

/// Inputs of one decision.
#[derive(Clone, Copy, Debug)]
pub struct BidderInput<'a> {
    /// The decision instant.
    pub now: Timestamp,
    /// Static facts of the pools the view quotes, in the same order.
    pub pools: &'a [PoolInfo],
    /// The market at `now`.
    pub market: &'a MarketView,
    /// The job's transient allocations.
    pub allocations: &'a [Allocation],
    /// The reliable tier.
    pub reliable: &'a ReliableTier,
    /// The current application model.
    pub app: &'a AppModel,
    /// Progress and constraints.
    pub job: &'a JobState,
}

/// Expected cost and work of one allocation over the decision window.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Term {
    /// Expected USD.
    cost: f64,
    /// Σ k · ν · ω at full efficiency (the footprint's [`Efficiency`] is applied to the sum).
    work: f64,
    /// Σ k · ν at full efficiency (for the λ loss).
    rate: f64,
    /// Probability it survives the window (1 − β).
    survive: f64,
    /// Expected evictions in the window.
    events: f64,
    /// Instances.
    count: f64,
    /// USD per hour at current prices (budget checks).
    spend_per_hour: f64,
    /// Expected work per second over the window at full efficiency (deadline checks).
    expected_rate: f64,
}

/// A footprint's sums, from which `E` follows in O(1).
#[derive(Clone, Copy, Debug, PartialEq)]
struct Footprint {
    cost: f64,
    work: f64,
    rate: f64,
    survive: f64,
    events: f64,
    transient: f64,
    spend_per_hour: f64,
    expected_rate: f64,
}

impl Footprint {
    fn empty() -> Self {
        Self {
            cost: 0.0,
            work: 0.0,
            rate: 0.0,
            survive: 1.0,
            events: 0.0,
            transient: 0.0,
            spend_per_hour: 0.0,
            expected_rate: 0.0,
        }
    }

    fn with(mut self, term: &Term) -> Self {
        self.cost += term.cost;
        self.work += term.work;
        self.rate += term.rate;
        self.survive *= term.survive;
        self.events += term.events;
        self.transient += term.count;
        self.spend_per_hour += term.spend_per_hour;
        self.expected_rate += term.expected_rate;
        self
    }
}

/// The bidder: configuration, billing model and eviction model.
#[derive(Clone, Debug)]
pub struct Bidder<'a> {
    /// Settings.
    pub config: BidderConfig,
    /// How instances are charged.
    pub billing: BillingModel,
    /// β and expected uptime per pool and max price.
    pub eviction: &'a EvictionModel,
}

impl Bidder<'_> {
    /// Expected cost and work of `count` instances of `pool` at `max_price` and age `age`.
    #[allow(clippy::too_many_arguments)] // one call per allocation shape; a struct would only rename them
    fn term(
        &self,
        input: &BidderInput<'_>,
        pool: usize,
        capacity: CapacityType,
        count: f64,
        max_price: Option<f64>,
        age: f64,
        adding: bool,
    ) -> Option<Term> {
        let info = &input.pools[pool];
        let on_demand = info.on_demand_usd_hr?;
        let rate_each = input.app.node_rate(info.vcpus);
        let horizon = self.config.horizon_seconds;
        let (price, beta, uptime, charge) = match capacity {
            CapacityType::OnDemand => (on_demand, 0.0, horizon, on_demand * horizon / 3600.0),
            CapacityType::Spot => {
                let quote = input.market.quotes.get(pool)?;
                match (quote.buyable_price(), max_price) {
                    (Some(price), Some(max_price)) if price <= max_price => {
                        // evictions belong to the pool, not to the instance: a held instance
                        // is as likely to be evicted next as a fresh one with the same
                        // headroom in the same pool, so survival is read from now, at the
                        // current headroom δ and the pool's current run age; the instance's
                        // own age only sets its billing periods
                        let delta = (max_price - price) / on_demand;
                        let run_age = quote
                            .up_since
                            .filter(|since| *since <= input.now)
                            .map(|since| (input.now - since) as f64);
                        let model = self.eviction;
                        let survival = |t: f64| model.survival(pool, delta, run_age, 0.0, t - age);
                        let uptime_to =
                            |t: f64| model.expected_uptime(pool, delta, run_age, 0.0, t - age);
                        let uptime = uptime_to(age + horizon);
                        let charge = self.billing.expected_charge_over(
                            price,
                            age,
                            horizon,
                            &survival,
                            &|t0, t1| uptime_to(t1) - uptime_to(t0),
                        );
                        (price, 1.0 - survival(age + horizon), uptime, charge)
                    }
                    // unavailable, unpriced or above its max price: it is going away now
                    _ => (quote.price.unwrap_or(0.0), 1.0, 0.0, 0.0),
                }
            }
        };
        let cycles = if self.config.renewal
            && capacity == CapacityType::Spot
            && uptime > 0.0
            && uptime < horizon
        {
            horizon / uptime
        } else {
            1.0
        };
        let fresh = (uptime - input.app.sigma_seconds).max(0.0);
        let useful = if adding {
            cycles * fresh
        } else {
            uptime + (cycles - 1.0) * fresh
        };
        Some(Term {
            cost: count * charge * cycles,
            work: count * rate_each * useful,
            rate: count * rate_each,
            survive: 1.0 - beta,
            events: beta * cycles,
            count,
            spend_per_hour: count * price,
            expected_rate: count * rate_each * useful / horizon.max(1.0),
        })
    }

    /// What releasing `count` instances of `allocation` now still costs: no work, no capacity,
    /// and the rest of a started billing period where the billing model charges it in full.
    fn release_term(&self, input: &BidderInput<'_>, allocation: &Allocation, count: u32) -> Term {
        let age = (input.now - allocation.launched_at).max(0) as f64;
        let price = match allocation.capacity {
            CapacityType::Spot => input
                .market
                .quotes
                .get(allocation.pool)
                .and_then(|q| q.price),
            CapacityType::OnDemand => input
                .pools
                .get(allocation.pool)
                .and_then(|p| p.on_demand_usd_hr),
        };
        Term {
            cost: f64::from(count) * self.billing.release_charge(price.unwrap_or(0.0), age),
            work: 0.0,
            rate: 0.0,
            survive: 1.0,
            events: 0.0,
            count: 0.0,
            spend_per_hour: 0.0,
            expected_rate: 0.0,
        }
    }

    /// `E = C / W` of `footprint` plus the reliable tier (eqs. 4.2–4.4).
    fn cost_per_work(&self, input: &BidderInput<'_>, footprint: &Footprint) -> f64 {
        let (cost, work) = self.totals(input, footprint);
        if work <= 0.0 {
            f64::INFINITY
        } else {
            cost / work
        }
    }

    /// Each tier's share of ν with `footprint`'s transient nodes beside the reliable tier.
    fn efficiency(&self, input: &BidderInput<'_>, footprint: &Footprint) -> Efficiency {
        input.app.efficiency(
            self.config.throughput.as_ref(),
            footprint.transient,
            f64::from(input.reliable.count),
        )
    }

    /// The reliable tier's work per second beside `footprint`.
    fn reliable_rate(&self, input: &BidderInput<'_>, footprint: &Footprint) -> f64 {
        let reliable = input.reliable;
        f64::from(reliable.count)
            * input.app.node_rate(reliable.vcpus)
            * self.efficiency(input, footprint).reliable
    }

    /// Expected work per second of `footprint` and the reliable tier over the window.
    fn expected_rate(&self, input: &BidderInput<'_>, footprint: &Footprint) -> f64 {
        footprint.expected_rate * self.efficiency(input, footprint).transient
            + self.reliable_rate(input, footprint)
    }

    fn totals(&self, input: &BidderInput<'_>, footprint: &Footprint) -> (f64, f64) {
        let window = self.config.horizon_seconds;
        let reliable = input.reliable;
        let share = self.efficiency(input, footprint).transient;
        let reliable_rate = self.reliable_rate(input, footprint);
        let cost = footprint.cost + f64::from(reliable.count) * reliable.usd_hr * window / 3600.0;
        let events = if self.config.renewal {
            footprint.events
        } else {
            1.0 - footprint.survive
        };
        let lambda_loss = events * input.app.lambda_seconds;
        let work = footprint.work * share + reliable_rate * window
            - (footprint.rate * share + reliable_rate) * lambda_loss;
        (cost, work.max(0.0))
    }

    /// The instance counts scored for one candidate: the smallest and the largest, and with a
    /// measured throughput table every count that brings the footprint to a measured ratio
    /// (the table need not be monotone, so neither is E in the count).
    fn counts(&self, input: &BidderInput<'_>, footprint: &Footprint, largest: f64) -> Vec<f64> {
        let mut counts = vec![1.0, largest];
        if let Some(table) = &self.config.throughput {
            let reliable = f64::from(input.reliable.count);
            for &(ratio, _) in table.points() {
                let count = (ratio * reliable - footprint.transient).round();
                if count > 1.0 && count < largest {
                    counts.push(count);
                }
            }
        }
        counts
    }

    /// Decide what to buy and release (see the module docs).
    pub fn decide(&self, input: &BidderInput<'_>) -> Decision {
        let now = input.now;
        let lead = self.config.boundary_lead_seconds;
        let mut current = Footprint::empty();
        // (allocation, its term, whether it is up for renewal now)
        let mut terms: Vec<(&Allocation, Term, bool)> = Vec::new();
        for allocation in input.allocations {
            let age = (now - allocation.launched_at).max(0) as f64;
            let count = f64::from(allocation.count);
            let Some(term) = self.term(
                input,
                allocation.pool,
                allocation.capacity,
                count,
                allocation.max_price,
                age,
                false,
            ) else {
                continue;
            };
            current = current.with(&term);
            // weigh keeping it if its billing boundary is near or the model has none
            // (per-second billing can stop at any time); where a release still pays the rest of
            // the period, not before the last decision ahead of the boundary
            let boundary = self.billing.next_boundary(allocation.launched_at, now);
            let renewable = match (allocation.capacity, boundary) {
                (CapacityType::Spot, Some(b)) => {
                    let pays_rest = self.release_term(input, allocation, 1).cost > 0.0;
                    b - now <= lead && !(pays_rest && b - now > self.config.interval_seconds)
                }
                (_, None) | (CapacityType::OnDemand, _) => true,
            };
            terms.push((allocation, term, renewable));
        }
        let before = self.cost_per_work(input, &current);

        // budget exhausted: release every transient allocation
        if input.job.budget_remaining_usd.is_some_and(|b| b <= 0.0) {
            let reliable_only = Footprint::empty();
            return Decision {
                acquire: Vec::new(),
                release: input.allocations.iter().map(|a| a.id).collect(),
                shrink: Vec::new(),
                cost_per_work_before: before,
                cost_per_work_after: self.cost_per_work(input, &reliable_only),
                next_decision_at: now + self.config.interval_seconds,
                no_feasible_pool: None,
                deadline_at_risk: input.job.deadline.is_some(),
                budget_exhausted: true,
                over_budget_per_hour: false,
                min_transient: None,
                over_max_transient: false,
            };
        }

        // A deadline that has passed can no longer be met: it is reported (at risk), and the
        // bidder goes back to the lowest cost per work. Before, the rate it asked for was
        // infinite, so every decision bought up to maxNodes (on-demand included) and released
        // nothing, for as long as the job ran.
        let deadline_passed = input.job.deadline.is_some_and(|deadline| deadline <= now);
        let required_rate = input
            .job
            .deadline
            .filter(|_| !deadline_passed)
            .map(|deadline| input.job.remaining_work / (deadline - now) as f64);

        // candidates: every buyable spot pool at every modelled bid delta
        let mut infeasible = NoFeasiblePool::default();
        let mut candidates: Vec<(usize, CapacityType, Option<f64>)> = Vec::new();
        for (pool, quote) in input.market.quotes.iter().enumerate() {
            let Some(info) = input.pools.get(pool) else {
                continue;
            };
            let Some(on_demand) = info.on_demand_usd_hr else {
                continue;
            };
            if info.id.capacity != CapacityType::Spot {
                continue;
            }
            let cap = self.config.max_price_cap.unwrap_or(f64::INFINITY);
            let Some(price) = infeasible.admit(quote, cap) else {
                continue;
            };
            for &delta in &self.eviction.config().bid_deltas {
                let max_price = (price + delta * on_demand).min(cap);
                candidates.push((pool, CapacityType::Spot, Some(max_price)));
            }
        }
        let no_feasible_pool = candidates.is_empty().then_some(infeasible);
        if required_rate.is_some() {
            // on-demand capacity for the transient tier, one per instance type
            let mut seen: Vec<&str> = Vec::new();
            for (pool, info) in input.pools.iter().enumerate() {
                if info.on_demand_usd_hr.is_some()
                    && !seen.contains(&info.id.instance_type.as_str())
                {
                    seen.push(&info.id.instance_type);
                    candidates.push((pool, CapacityType::OnDemand, None));
                }
            }
        }

        // releases before billing boundaries: keep an allocation (over the horizon, renewed at
        // its boundaries) only if that is no worse than releasing it now — paying what a
        // release still costs — alone or with the best fresh candidate of the same size in its
        // place (under `aws` a fresh instance is again refunded if interrupted in its first hour)
        let mut footprint = current;
        let mut release: Vec<u64> = Vec::new();
        let mut released = Footprint::empty();
        for (allocation, term, renewable) in &terms {
            if !renewable {
                continue;
            }
            let id = allocation.id;
            let others = terms
                .iter()
                .filter(|(other, _, _)| other.id != id && !release.contains(&other.id))
                .fold(released, |f, (_, t, _)| f.with(t));
            let with = self.cost_per_work(input, &others.with(term));
            let dropped = others.with(&self.release_term(input, allocation, allocation.count));
            let mut without = self.cost_per_work(input, &dropped);
            for &(pool, capacity, max_price) in
                candidates.iter().filter(|c| c.1 == CapacityType::Spot)
            {
                if let Some(fresh) =
                    self.term(input, pool, capacity, term.count, max_price, 0.0, true)
                {
                    without = without.min(self.cost_per_work(input, &dropped.with(&fresh)));
                }
            }
            let rate_without = self.expected_rate(input, &others);
            let deadline_needs_it = required_rate.is_some_and(|r| rate_without < r);
            if without < with * (1.0 - self.config.min_improvement) && !deadline_needs_it {
                release.push(id);
                released = released.with(&self.release_term(input, allocation, allocation.count));
                footprint = dropped;
            }
        }

        // the minimum of transient instances keeps what the cost per work alone would release
        // (a fresh instance bought back for it would cost its switch-in and a hand-over);
        // budgetPerHour below still releases what it must
        let mut restored = false;
        while held_count(input, &release, &[]) < self.config.min_transient
            && release.pop().is_some()
        {
            restored = true;
        }
        if restored {
            footprint = self.with_releases(input, &terms, &release, &[]);
        }

        // budgetPerHour holds for what is held too: prices move, so an allocation bought
        // within the cap can take the footprint over it. The dearest instances go first (a
        // whole allocation at a time; the acquisitions below may buy back what fits). The cap
        // wins over a deadline: it is the user's limit on money.
        let mut over_budget_per_hour = false;
        if let Some(cap) = input.job.budget_per_hour_usd {
            let reliable = f64::from(input.reliable.count) * input.reliable.usd_hr;
            loop {
                let kept = terms
                    .iter()
                    .filter(|(allocation, _, _)| !release.contains(&allocation.id));
                let spend: f64 = kept.clone().map(|(_, term, _)| term.spend_per_hour).sum();
                if spend + reliable <= cap + 1e-9 {
                    break;
                }
                let Some((allocation, _, _)) = kept
                    .filter(|(_, term, _)| term.spend_per_hour > 0.0)
                    .max_by(|a, b| {
                        let each = |t: &Term| t.spend_per_hour / t.count.max(1.0);
                        each(&a.1).total_cmp(&each(&b.1))
                    })
                else {
                    break;
                };
                over_budget_per_hour = true;
                release.push(allocation.id);
            }
            if over_budget_per_hour {
                footprint = self.with_releases(input, &terms, &release, &[]);
            }
        }

        // maxNodes holds for what is held too: lowered under a running job, it leaves more
        // held than it allows. The instances dearest per unit of work go first (those the
        // model cannot price at all before them: their pool is gone or above their bid), whole
        // allocations while they fit in the excess, then part of one.
        let excess = held_count(input, &release, &[]).saturating_sub(self.config.max_transient);
        let over_max_transient = excess > 0;
        let mut shrink: Vec<Shrink> = Vec::new();
        if over_max_transient {
            shrink = self.cut_to_max(input, &terms, &mut release, excess);
            footprint = self.with_releases(input, &terms, &release, &shrink);
        }

        // acquisitions: greedily add the candidate that lowers E most
        let mut acquire: Vec<AllocationRequest> = Vec::new();
        let mut deadline_at_risk = deadline_passed;
        loop {
            let free = f64::from(self.config.max_transient) - footprint.transient;
            if free < 1.0 {
                break;
            }
            let e_now = self.cost_per_work(input, &footprint);
            let rate_now = self.expected_rate(input, &footprint);
            let pressed = required_rate.is_some_and(|r| rate_now < r);
            let mut best: Option<(f64, AllocationRequest, Footprint)> = None;
            for &(pool, capacity, max_price) in &candidates {
                if capacity == CapacityType::OnDemand && !pressed {
                    continue;
                }
                // under the linear model E of (footprint + k instances) is monotone in k, so
                // only the smallest and the largest count can be best (see `counts`)
                let price = match capacity {
                    CapacityType::Spot => input.market.quotes[pool].price.unwrap_or(f64::INFINITY),
                    CapacityType::OnDemand => {
                        input.pools[pool].on_demand_usd_hr.unwrap_or(f64::INFINITY)
                    }
                };
                let mut largest = free.floor();
                if let Some(cap) = input.job.budget_per_hour_usd {
                    let room = cap
                        - footprint.spend_per_hour
                        - f64::from(input.reliable.count) * input.reliable.usd_hr;
                    largest = largest.min((room / price).floor());
                }
                if largest < 1.0 {
                    continue;
                }
                for count in self.counts(input, &footprint, largest) {
                    let Some(term) = self.term(input, pool, capacity, count, max_price, 0.0, true)
                    else {
                        continue;
                    };
                    let next = footprint.with(&term);
                    let e = self.cost_per_work(input, &next);
                    let score = if pressed {
                        // under deadline pressure: the cheapest way to add rate
                        if term.expected_rate <= 0.0 {
                            continue;
                        }
                        e
                    } else {
                        if e >= e_now * (1.0 - self.config.min_improvement) {
                            continue;
                        }
                        e
                    };
                    if best.as_ref().is_none_or(|(b, _, _)| score < *b) {
                        best = Some((
                            score,
                            AllocationRequest {
                                pool,
                                capacity,
                                count: count as u32,
                                max_price,
                            },
                            next,
                        ));
                    }
                }
            }
            match best {
                Some((_, request, next)) => {
                    acquire.push(request);
                    footprint = next;
                }
                None => {
                    deadline_at_risk |= pressed;
                    break;
                }
            }
        }
        let min_transient =
            self.hold_min_transient(input, &release, &shrink, &mut acquire, &mut footprint);
        if let Some(r) = required_rate {
            let rate = self.expected_rate(input, &footprint);
            deadline_at_risk |= rate < r;
        }

        let mut next_decision_at = now + self.config.interval_seconds;
        for allocation in input.allocations {
            if let Some(boundary) = self.billing.next_boundary(allocation.launched_at, now) {
                let at = boundary - lead;
                if at > now {
                    next_decision_at = next_decision_at.min(at);
                }
            }
        }
        Decision {
            acquire,
            release,
            shrink,
            cost_per_work_before: before,
            cost_per_work_after: self.cost_per_work(input, &footprint),
            next_decision_at,
            no_feasible_pool,
            deadline_at_risk,
            budget_exhausted: false,
            over_budget_per_hour,
            min_transient,
            over_max_transient,
        }
    }

    /// The footprint of `terms` with the allocations of `release` released and part of those
    /// of `shrink`: what the releases still cost (summed in release order) and what is held.
    fn with_releases(
        &self,
        input: &BidderInput<'_>,
        terms: &[(&Allocation, Term, bool)],
        release: &[u64],
        shrink: &[Shrink],
    ) -> Footprint {
        let released = release
            .iter()
            .filter_map(|id| terms.iter().find(|(a, _, _)| a.id == *id))
            .fold(Footprint::empty(), |f, (allocation, _, _)| {
                f.with(&self.release_term(input, allocation, allocation.count))
            });
        terms
            .iter()
            .filter(|(allocation, _, _)| !release.contains(&allocation.id))
            .fold(released, |f, (allocation, term, _)| {
                let cut = shrunk(shrink, allocation.id).min(allocation.count);
                if cut == 0 {
                    return f.with(term);
                }
                let age = (input.now - allocation.launched_at).max(0) as f64;
                let kept = self.term(
                    input,
                    allocation.pool,
                    allocation.capacity,
                    f64::from(allocation.count - cut),
                    allocation.max_price,
                    age,
                    false,
                );
                let f = f.with(&self.release_term(input, allocation, cut));
                kept.map_or(f, |kept| f.with(&kept))
            })
    }

    /// Releases `excess` held instances, dearest per unit of expected work first: allocations
    /// the model cannot price (their pool is gone or above their bid) before any other, whole
    /// allocations (pushed to `release`) while they fit in what is left of the excess, then
    /// part of one (returned). Ties go to the newest allocation (the highest id).
    fn cut_to_max(
        &self,
        input: &BidderInput<'_>,
        terms: &[(&Allocation, Term, bool)],
        release: &mut Vec<u64>,
        mut excess: u32,
    ) -> Vec<Shrink> {
        let per_work = |allocation: &Allocation| {
            terms
                .iter()
                .find(|(a, _, _)| a.id == allocation.id)
                .and_then(|(_, term, _)| (term.work > 0.0).then(|| term.cost / term.work))
                .unwrap_or(f64::INFINITY)
        };
        let mut held: Vec<&Allocation> = input
            .allocations
            .iter()
            .filter(|a| !release.contains(&a.id) && a.count > 0)
            .collect();
        held.sort_by(|a, b| {
            per_work(b)
                .total_cmp(&per_work(a))
                .then_with(|| b.id.cmp(&a.id))
        });
        let mut shrink = Vec::new();
        for allocation in held {
            if excess == 0 {
                break;
            }
            if allocation.count <= excess {
                release.push(allocation.id);
                excess -= allocation.count;
            } else {
                shrink.push(Shrink {
                    id: allocation.id,
                    count: excess,
                });
                excess = 0;
            }
        }
        shrink
    }

    /// Tops the transient instances kept (`input.allocations` but `release`) and bought
    /// (`acquire`) up to [`BidderConfig::min_transient`], "while the market allows": in the
    /// cheapest available spot pool priced within its bid ceiling (the job's max price and the
    /// pool's on-demand price), bidding that ceiling, as many as fit under `budgetPerHour`.
    fn hold_min_transient(
        &self,
        input: &BidderInput<'_>,
        release: &[u64],
        shrink: &[Shrink],
        acquire: &mut Vec<AllocationRequest>,
        footprint: &mut Footprint,
    ) -> Option<MinTransientFill> {
        let kept =
            held_count(input, release, shrink) + acquire.iter().map(|r| r.count).sum::<u32>();
        let missing = self.config.min_transient.checked_sub(kept)?;
        if missing == 0 {
            return None;
        }
        let cap = self.config.max_price_cap.unwrap_or(f64::INFINITY);
        let mut infeasible = NoFeasiblePool::default();
        let mut cheapest: Option<(usize, f64, f64)> = None;
        for (pool, quote) in input.market.quotes.iter().enumerate() {
            let Some(info) = input.pools.get(pool) else {
                continue;
            };
            if info.id.capacity != CapacityType::Spot {
                continue;
            }
            let ceiling = info.on_demand_usd_hr.map_or(cap, |od| od.min(cap));
            if let Some(price) = infeasible.admit(quote, ceiling)
                && cheapest.is_none_or(|(_, best, _)| price < best)
            {
                cheapest = Some((pool, price, ceiling));
            }
        }
        let Some((pool, price, ceiling)) = cheapest else {
            return Some(MinTransientFill::NoFeasiblePool(infeasible));
        };
        let mut count = missing;
        if let Some(budget) = input.job.budget_per_hour_usd {
            let room = budget
                - footprint.spend_per_hour
                - f64::from(input.reliable.count) * input.reliable.usd_hr;
            let fits = (room / price).floor().max(0.0);
            count = count.min(fits.min(f64::from(u32::MAX)) as u32);
        }
        if count > 0 {
            let max_price = ceiling.is_finite().then_some(ceiling);
            if let Some(term) = self.term(
                input,
                pool,
                CapacityType::Spot,
                f64::from(count),
                max_price,
                0.0,
                true,
            ) {
                *footprint = footprint.with(&term);
            }
            acquire.push(AllocationRequest {
                pool,
                capacity: CapacityType::Spot,
                count,
                max_price,
            });
        }
        Some(if count < missing {
            MinTransientFill::BudgetLimited {
                count,
                missing: missing - count,
            }
        } else {
            MinTransientFill::Filled { count }
        })
    }
}

#[cfg(test)]
mod tests;
