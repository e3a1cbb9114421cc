//! A provable lower bound on the cost of a job with full knowledge of the trace.
//!
//! Any AgileML strategy pays its reliable tier for the job's whole duration `D` and each
//! transient instance-second at its price unless refunded. The bound relaxes everything else:
//!
//! - a slot is *free* if some pool could be bought then and an eviction event (the pool
//!   becomes unavailable or its price rises above the slot's price) follows within an hour:
//!   a necessary condition for refunded compute under `aws` (interrupted in the first hour)
//!   and `aws-hourly-2016` (evicted partial hour); never under `gcp` or `fixed`;
//! - otherwise a slot's work costs at least the cheapest price per work of any buyable pool
//!   or of on-demand capacity; under `aws-hourly-2016`, where an hour is charged at the price
//!   when it began, the cheapest price of the pool over the hour up to the slot (an instance
//!   running in the slot may have started its hour at any of those prices);
//! - every slot offers `cluster_size` instances at the highest per-instance rate of any pool,
//!   with no σ, no λ, and reliable nodes always working; with a measured throughput table,
//!   both tiers at the table's highest relative throughput at any ratio;
//! - work may be split across slots freely (fractional knapsack: free slots first, then the
//!   cheapest), and costs are rounded down to a log-spaced bucket.
//!
//! Each relaxation only lowers the cost, so the minimum over `D` is a lower bound on what any
//! strategy under the same application model can pay. On-demand only is one such strategy the
//! optimum may choose (the bound's on-demand capacity works at the transient share of ν, the
//! baseline at full rate), so the bound is also at most its cost. `D` is scanned in intervals
//! `[D_a, D_b]`, pricing the reliable tier at `D_a` and the transient work with the slots of
//! `D_b`, which keeps the bound valid between grid points.

use super::{Context, MarketGrid, RunResult};
use crate::bidder::{AppModel, ThroughputTable};
use crate::billing::BillingModel;

const BUCKETS: usize = 1024;

/// How far ahead the hindsight schedule looks for a free ride to wait for.
const WAIT_HORIZON_SECONDS: i64 = 6 * 3600;

/// Per-slot cheapest work, precomputed once per trace.
#[derive(Clone, Debug)]
pub struct SlotCosts {
    /// Whether refunded compute was possible in the slot.
    free: Vec<bool>,
    /// Bucket of the cheapest USD per work unit in the slot (`usize::MAX`: nothing buyable).
    bucket: Vec<usize>,
    /// Lower edge of each bucket in USD per work unit.
    edges: Vec<f64>,
    /// Highest transient work per second of one instance over all pools.
    max_rate: f64,
    /// Highest share of ν a reliable node reaches at any ratio.
    reliable_share: f64,
    /// Per slot: the hindsight schedule's free ride there (see [`free_ride`]).
    rides: Vec<Option<Ride>>,
    /// Per slot: the first later slot with a free ride (`usize::MAX`: none).
    next_ride: Vec<usize>,
}

impl SlotCosts {
    /// Precompute for `grid` under `app` (with its measured `throughput`, if any) and
    /// `billing`.
    pub fn new(
        grid: &MarketGrid,
        app: &AppModel,
        throughput: Option<&ThroughputTable>,
        billing: BillingModel,
    ) -> Self {
        let best = app.best_efficiency(throughput);
        let refunds = matches!(billing, BillingModel::Aws | BillingModel::AwsHourly2016);
        let hour_slots = (3600 / grid.step).max(1) as usize;
        let mut free = vec![false; grid.slots];
        // on-demand capacity can always be bought for the transient tier
        let on_demand = grid
            .pools
            .iter()
            .filter_map(|info| {
                let rate = app.node_rate(info.vcpus) * best.transient;
                info.on_demand_usd_hr
                    .filter(|_| rate > 0.0)
                    .map(|od| od / 3600.0 / rate)
            })
            .fold(f64::INFINITY, f64::min);
        let mut cheapest = vec![on_demand; grid.slots];
        let mut max_rate: f64 = 0.0;
        // the best free ride per slot so far, with the work it does
        let mut rides: Vec<Option<(f64, Ride)>> = vec![None; grid.slots];
        for (pool, info) in grid.pools.iter().enumerate() {
            let rate = app.node_rate(info.vcpus) * best.transient;
            max_rate = max_rate.max(rate);
            // next slot after each slot where the pool is gone or pricier (monotonic stack)
            let mut next_event = vec![usize::MAX; grid.slots];
            let mut stack: Vec<usize> = Vec::new();
            let mut next_gone = usize::MAX;
            for slot in (0..grid.slots).rev() {
                let price = grid.price(pool, slot);
                match price {
                    None => {
                        next_gone = slot;
                        stack.clear();
                    }
                    Some(p) => {
                        while let Some(&top) = stack.last() {
                            if grid.price(pool, top).is_some_and(|q| q <= p) {
                                stack.pop();
                            } else {
                                break;
                            }
                        }
                        let greater = stack.last().copied().unwrap_or(usize::MAX);
                        next_event[slot] = greater.min(next_gone);
                        stack.push(slot);
                        if rate > 0.0 {
                            let charged = if billing == BillingModel::AwsHourly2016 {
                                hour_low(grid, pool, slot, hour_slots)
                            } else {
                                p
                            };
                            cheapest[slot] = cheapest[slot].min(charged / 3600.0 / rate);
                        }
                        if refunds
                            && next_event[slot] != usize::MAX
                            && next_event[slot] - slot <= hour_slots
                        {
                            free[slot] = true;
                            let ride = refunded_ride(grid, app, pool, p, slot, next_event[slot]);
                            if let Some((work, ride)) = ride
                                && rides[slot].as_ref().is_none_or(|(w, _)| work > *w)
                            {
                                rides[slot] = Some((work, ride));
                            }
                        }
                    }
                }
            }
        }
        let rides: Vec<Option<Ride>> = rides
            .into_iter()
            .map(|ride| ride.map(|(_, ride)| ride))
            .collect();
        let mut next_ride = vec![usize::MAX; grid.slots];
        for slot in (0..grid.slots.saturating_sub(1)).rev() {
            next_ride[slot] = if rides[slot + 1].is_some() {
                slot + 1
            } else {
                next_ride[slot + 1]
            };
        }
        let finite: Vec<f64> = cheapest
            .iter()
            .copied()
            .filter(|c| c.is_finite() && *c > 0.0)
            .collect();
        let low = finite.iter().copied().fold(f64::INFINITY, f64::min);
        let high = finite.iter().copied().fold(0.0, f64::max);
        let (low, high) = if finite.is_empty() {
            (1.0, 1.0)
        } else {
            (low, high.max(low * 1.000_001))
        };
        let ratio = (high / low).powf(1.0 / (BUCKETS - 1) as f64);
        let edges: Vec<f64> = (0..BUCKETS).map(|b| low * ratio.powi(b as i32)).collect();
        let bucket = cheapest
            .iter()
            .map(|&c| {
                if !c.is_finite() {
                    usize::MAX
                } else {
                    (((c / low).ln() / ratio.ln()).floor().max(0.0) as usize).min(BUCKETS - 1)
                }
            })
            .collect();
        Self {
            free,
            bucket,
            edges,
            max_rate,
            reliable_share: best.reliable,
            rides,
            next_ride,
        }
    }
}

/// The lowest price of `pool` over the hour up to `slot` (the `hour_slots` slots ending at it),
/// where it had one: what an instance running in `slot` may have been charged for its hour
/// under `aws-hourly-2016`.
fn hour_low(grid: &MarketGrid, pool: usize, slot: usize, hour_slots: usize) -> f64 {
    (slot.saturating_sub(hour_slots - 1)..=slot)
        .filter_map(|s| grid.price(pool, s))
        .fold(f64::INFINITY, f64::min)
}

/// The lower bound for `work` starting at `start_slot` (see the module docs).
pub(super) fn lower_bound(
    ctx: &Context<'_>,
    costs: &SlotCosts,
    start_slot: usize,
    work: f64,
) -> RunResult {
    let grid = ctx.grid;
    let step = grid.step as f64;
    let app = &ctx.config.app;
    let reliable_count = f64::from(ctx.reliable.count);
    let reliable_rate = reliable_count * app.node_rate(ctx.reliable.vcpus) * costs.reliable_share;
    let reliable_usd_per_slot = reliable_count * ctx.reliable.usd_hr * step / 3600.0;
    let instances = f64::from(ctx.config.cluster_size);
    let slot_work = instances * costs.max_rate * step;
    let fastest = ((work / (slot_work + reliable_rate * step)).ceil() as usize).max(1);
    let width = (fastest / 64).max(1);

    let mut histogram = vec![0usize; BUCKETS];
    let mut free_slots = 0usize;
    let mut added = 0usize;
    let mut best: Option<RunResult> = None;
    let mut d_a = fastest;
    loop {
        // a job that touches d slots ran for more than d − 1 of them
        let reliable_cost = reliable_usd_per_slot * (d_a - 1) as f64;
        if best.as_ref().is_some_and(|b| reliable_cost >= b.cost_usd) {
            break;
        }
        let d_b = d_a + width - 1;
        if start_slot + d_b > grid.slots {
            break;
        }
        while added < d_b {
            let slot = start_slot + added;
            if costs.free[slot] {
                free_slots += 1;
            } else if costs.bucket[slot] != usize::MAX {
                histogram[costs.bucket[slot]] += 1;
            }
            added += 1;
        }
        let need = (work - reliable_rate * d_b as f64 * step).max(0.0);
        let mut slots_needed = need / slot_work;
        let free_used = slots_needed.min(free_slots as f64);
        slots_needed -= free_used;
        let mut transient_cost = 0.0;
        let mut paid_used = 0.0;
        for (b, &count) in histogram.iter().enumerate() {
            if slots_needed <= 0.0 {
                break;
            }
            let take = slots_needed.min(count as f64);
            transient_cost += take * slot_work * costs.edges[b];
            paid_used += take;
            slots_needed -= take;
        }
        if slots_needed <= 1e-9 {
            let cost = reliable_cost + transient_cost;
            if best.as_ref().is_none_or(|b| cost < b.cost_usd) {
                best = Some(RunResult {
                    cost_usd: cost,
                    runtime_seconds: d_a as f64 * step,
                    on_demand_hours: reliable_count * d_a as f64 * step / 3600.0,
                    paid_spot_hours: paid_used * instances * step / 3600.0,
                    free_hours: free_used * instances * step / 3600.0,
                    evictions: 0,
                    completed_in_trace: true,
                });
            }
        }
        d_a += width;
    }
    // on-demand only is a strategy too: the optimum costs at most that (and where the trace
    // ended before any duration could finish, the bound is the on-demand rest)
    let hours = work / ctx.baseline_rate() / 3600.0;
    let on_demand = super::on_demand_only(ctx, hours);
    match best {
        Some(bound) if bound.cost_usd <= on_demand.cost_usd => bound,
        Some(_) => on_demand,
        None => RunResult {
            completed_in_trace: false,
            ..on_demand
        },
    }
}

/// An allocation of `cluster_size` instances the hindsight schedule buys at a slot.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Ride {
    /// The pool.
    pub pool: usize,
    /// Its max price.
    pub max_price: Option<f64>,
    /// Whether it is evicted within its first hour, so refunded.
    pub free: bool,
}

/// The ride in `pool`, bought at `slot` at its current `price` as the max price and so evicted
/// at slot `event` (gone, or any price rise), if that is within its first hour (refunded) and
/// longer than σ + λ (its instances boot for σ and the job stalls λ at the eviction); with the
/// transient work it does.
fn refunded_ride(
    grid: &MarketGrid,
    app: &AppModel,
    pool: usize,
    price: f64,
    slot: usize,
    event: usize,
) -> Option<(f64, Ride)> {
    let ran = (grid.time(event) - grid.time(slot)) as f64;
    if ran >= 3600.0 || ran <= app.sigma_seconds + app.lambda_seconds {
        return None;
    }
    let work = app.node_rate(grid.pools[pool].vcpus) * (ran - app.sigma_seconds);
    Some((
        work,
        Ride {
            pool,
            max_price: Some(price),
            free: true,
        },
    ))
}

/// The hindsight schedule's free ride at `slot`: under a billing model that refunds an
/// instance evicted in its first hour (`aws`, `aws-hourly-2016`), the pool whose
/// [`refunded_ride`] does the most transient work (the first such pool on a tie).
pub(super) fn free_ride(costs: &SlotCosts, slot: usize) -> Option<Ride> {
    costs.rides[slot]
}

/// Whether the hindsight schedule holds no transient capacity at `slot`, waiting for a free
/// ride that starts within [`WAIT_HORIZON_SECONDS`]. Work moved from paid capacity into a later
/// free ride costs only the longer run of the reliable tier, so waiting pays whenever the
/// reliable tier costs less per hour than the cheapest paid transient capacity would.
pub(super) fn wait_for_free_ride(ctx: &Context<'_>, costs: &SlotCosts, slot: usize) -> bool {
    let grid = ctx.grid;
    let Some(paid) = paid_ride(ctx, slot) else {
        return true;
    };
    let paid_usd_hr =
        grid.price(paid.pool, slot).unwrap_or(f64::INFINITY) * f64::from(ctx.config.cluster_size);
    let reliable_usd_hr = f64::from(ctx.reliable.count) * ctx.reliable.usd_hr;
    if reliable_usd_hr >= paid_usd_hr {
        return false;
    }
    let next = costs.next_ride[slot];
    next != usize::MAX && grid.time(next) - grid.time(slot) <= WAIT_HORIZON_SECONDS
}

/// The hindsight schedule's paid ride at `slot`: the pool cheapest per work at its current
/// price, at most its on-demand price, bid at that on-demand price.
pub(super) fn paid_ride(ctx: &Context<'_>, slot: usize) -> Option<Ride> {
    let grid = ctx.grid;
    let app = &ctx.config.app;
    (0..grid.pools.len())
        .filter_map(|pool| {
            let price = grid.price(pool, slot)?;
            let on_demand = grid.pools[pool].on_demand_usd_hr?;
            let rate = app.node_rate(grid.pools[pool].vcpus);
            (price <= on_demand && rate > 0.0).then_some((price / rate, pool, on_demand))
        })
        .min_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, pool, on_demand)| Ride {
            pool,
            max_price: Some(on_demand),
            free: false,
        })
}
