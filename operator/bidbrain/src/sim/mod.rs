//! `ebbflow simulate`: replay a trace from many random start times and compare strategies
//! (seed 003 §4.5.2) with the same bidder code the operator runs.
//!
//! The first [`SimConfig::train_fraction`] of the trace trains the eviction model; jobs start
//! uniformly at random in the rest, so no strategy sees the future it is scored on (except
//! the hindsight bound, by definition). A job is `hours` of work of the on-demand baseline:
//! `cluster_size` on-demand instances of the reference type (the pool type with the lowest
//! on-demand price per vCPU). Spot strategies may hold up to `cluster_size` transient
//! instances; the AgileML ones also keep the reliable tier (`reliable_count` on-demand
//! instances of the reference type).

pub mod cli;
pub mod grid;
pub mod hindsight;
pub mod report;

use std::sync::atomic::{AtomicUsize, Ordering};

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::bidder::{
    Allocation, AppModel, Bidder, BidderConfig, BidderInput, JobState, ReliableTier,
    ThroughputTable,
};
use crate::billing::{BillingModel, Charge, EndReason, Meter};
use crate::eviction::{
    ConstantRateModel, EvictionConfig, EvictionError, EvictionModel, EvictionScore,
};
use crate::market::{CapacityType, Market, MarketError, Timestamp};

pub use grid::MarketGrid;

/// The strategies compared, named as in the output.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Strategy {
    /// The baseline: on-demand instances only.
    OnDemandOnly,
    /// Cheapest pool at the on-demand price, checkpoint/restart on eviction.
    StandardCheckpoint,
    /// Cheapest pool at the on-demand price, AgileML tiers.
    StandardAgileMl,
    /// BidBrain, AgileML tiers.
    BidBrainAgileMl,
    /// AgileML tiers, capacity chosen with full knowledge of the trace and run under the same
    /// rules as the others (σ, λ, billing): an achievable cost, so the hindsight optimum is at
    /// most this.
    HindsightSchedule,
    /// A lower bound on cost with full knowledge of the trace: the hindsight optimum is at
    /// least this.
    Hindsight,
}

impl Strategy {
    /// Every strategy, in output order.
    pub const ALL: [Strategy; 6] = [
        Strategy::OnDemandOnly,
        Strategy::StandardCheckpoint,
        Strategy::StandardAgileMl,
        Strategy::BidBrainAgileMl,
        Strategy::HindsightSchedule,
        Strategy::Hindsight,
    ];

    /// The name printed in tables, CSV and chart.
    pub fn name(self) -> &'static str {
        match self {
            Strategy::OnDemandOnly => "on-demand only",
            Strategy::StandardCheckpoint => "standard + checkpoint/restart",
            Strategy::StandardAgileMl => "standard + AgileML",
            Strategy::BidBrainAgileMl => "BidBrain + AgileML",
            Strategy::HindsightSchedule => "hindsight schedule",
            Strategy::Hindsight => "hindsight optimum",
        }
    }
}

/// Settings of a study.
#[derive(Clone, Debug)]
pub struct SimConfig {
    /// Random start times per job length.
    pub starts: usize,
    /// Seed of the start times.
    pub seed: u64,
    /// Job lengths in hours of on-demand-equivalent work.
    pub job_hours: Vec<f64>,
    /// Instances of the on-demand baseline, and most transient instances held.
    pub cluster_size: u32,
    /// Reliable on-demand nodes of the AgileML strategies.
    pub reliable_count: u32,
    /// How instances are charged.
    pub billing: BillingModel,
    /// Share of the trace (from its start) used to train the eviction model.
    pub train_fraction: f64,
    /// The application (ν, φ, σ, λ).
    pub app: AppModel,
    /// Measured throughput against the transient:reliable ratio (`--calibration`): replaces
    /// the linear φ term in the work rate of every strategy, the bidder's (its
    /// `BidderConfig::throughput` is set to this) and the hindsight bound.
    pub throughput: Option<ThroughputTable>,
    /// Throughput lost to checkpointing (the paper's 17%).
    pub checkpoint_overhead: f64,
    /// Seconds from an eviction until a checkpointed job runs again (new instances booted and
    /// the checkpoint loaded).
    pub restart_seconds: f64,
    /// The bidder's settings (its `max_transient` is set to `cluster_size`).
    pub bidder: BidderConfig,
    /// The eviction model's settings.
    pub eviction: EvictionConfig,
    /// Worker threads.
    pub threads: usize,
}

impl SimConfig {
    /// Refuses settings that would make every figure meaningless (a zero baseline makes every
    /// relative cost NaN; an infinite job overflows the start range), naming the flag.
    pub fn check(&self) -> Result<(), SimError> {
        let bad = |setting, reason: String| Err(SimError::Config { setting, reason });
        if self.starts == 0 {
            return bad("--starts", "must be at least 1".into());
        }
        if self.job_hours.is_empty() {
            return bad("--hours", "needs at least one job length".into());
        }
        if let Some(hours) = self
            .job_hours
            .iter()
            .find(|h| !(h.is_finite() && **h > 0.0))
        {
            return bad(
                "--hours",
                format!("must be positive and finite hours, got {hours}"),
            );
        }
        if self.cluster_size == 0 {
            return bad("--cluster-size", "must be at least 1".into());
        }
        if !(self.train_fraction > 0.0 && self.train_fraction < 1.0) {
            return bad(
                "the training share",
                format!("must be between 0 and 1, got {}", self.train_fraction),
            );
        }
        Ok(())
    }
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            starts: 1000,
            seed: 1,
            job_hours: vec![2.0, 20.0],
            cluster_size: 32,
            reliable_count: 1,
            billing: BillingModel::Aws,
            train_fraction: 0.3,
            app: AppModel::default(),
            throughput: None,
            checkpoint_overhead: 0.17,
            restart_seconds: 300.0,
            bidder: BidderConfig::default(),
            eviction: EvictionConfig::default(),
            threads: std::thread::available_parallelism().map_or(2, |n| n.get()),
        }
    }
}

/// Errors running a study.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// The market is unusable.
    #[error(transparent)]
    Market(#[from] MarketError),
    /// The eviction model could not be fitted.
    #[error(transparent)]
    Eviction(#[from] EvictionError),
    /// A setting of the study is out of range (named as its flag).
    #[error("simulate: {setting} {reason}")]
    Config {
        /// The setting, as its flag (`--hours`).
        setting: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// The trace is too short for the configuration.
    #[error("plan simulation on {source_name}: {reason}")]
    Plan {
        /// The trace.
        source_name: String,
        /// What does not fit.
        reason: String,
    },
}

/// The outcome of one job under one strategy.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct RunResult {
    /// USD spent.
    pub cost_usd: f64,
    /// Seconds from start to the last unit of work.
    pub runtime_seconds: f64,
    /// On-demand instance-hours (reliable tier, baseline, or trace-end fallback).
    pub on_demand_hours: f64,
    /// Spot instance-hours paid for.
    pub paid_spot_hours: f64,
    /// Spot instance-hours refunded.
    pub free_hours: f64,
    /// Spot allocations lost to evictions.
    pub evictions: u32,
    /// False if the trace ended first and the rest ran on on-demand instances.
    pub completed_in_trace: bool,
}

/// One start time of one job length, every strategy.
#[derive(Clone, Debug, PartialEq)]
pub struct StartResult {
    /// Job length in hours.
    pub job_hours: f64,
    /// Start time.
    pub start: Timestamp,
    /// Cost and runtime of the on-demand baseline (the unit of the relative figures).
    pub baseline: RunResult,
    /// Per strategy, in [`Strategy::ALL`] order.
    pub runs: Vec<RunResult>,
    /// How the market moved under the job.
    pub movement: Movement,
}

/// How the market moved while a job ran: the pool the standard strategies start in (the lowest
/// price at most the on-demand price) against every pool, over standard + AgileML's runtime.
/// It bounds what moving capacity between pools could save on the trace.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Movement {
    /// The start pool's price changed, or it could no longer be bought, before the job ended.
    pub price_changed: bool,
    /// Another pool was cheaper per work than the start pool at some slot where both could be
    /// bought.
    pub overtaken: bool,
    /// The share of the start pool's spend (over the slots it could be bought) that holding
    /// the pool cheapest per work at every slot instead would have saved, with moves free.
    pub move_saving: f64,
}

/// Everything a study produced.
#[derive(Clone, Debug)]
pub struct Study {
    /// The trace.
    pub source: String,
    /// The billing model.
    pub billing: BillingModel,
    /// The reference instance type of the baseline.
    pub reference_type: String,
    /// The grid step in seconds.
    pub step_seconds: i64,
    /// Training slice end (start of the evaluation slice).
    pub train_end: Timestamp,
    /// The eviction model scored on the evaluation slice.
    pub eviction_score: EvictionScore,
    /// The application model the work rates came from (one line).
    pub application: String,
    /// Per start and length.
    pub starts: Vec<StartResult>,
}

/// The fixed context of every run of a study.
struct Context<'a> {
    grid: &'a MarketGrid,
    model: &'a EvictionModel,
    config: &'a SimConfig,
    reference: usize,
    reliable: ReliableTier,
}

impl Context<'_> {
    fn reference_od(&self) -> f64 {
        self.grid.pools[self.reference]
            .on_demand_usd_hr
            .unwrap_or(f64::INFINITY)
    }

    fn baseline_rate(&self) -> f64 {
        f64::from(self.config.cluster_size)
            * self.config.app.nu_per_vcpu_second
            * self.grid.pools[self.reference].vcpus
    }
}

/// The pool with the cheapest on-demand price per vCPU (the reliable tier's and the on-demand
/// baseline's instance type), if any pool has an on-demand price.
pub fn reference_pool(grid: &MarketGrid) -> Option<usize> {
    (0..grid.pools.len())
        .filter(|&p| grid.pools[p].on_demand_usd_hr.is_some())
        .min_by(|&a, &b| {
            let per_vcpu = |p: usize| {
                grid.pools[p].on_demand_usd_hr.unwrap_or(f64::INFINITY) / grid.pools[p].vcpus
            };
            per_vcpu(a).total_cmp(&per_vcpu(b))
        })
}

/// Run a study over `market` (on-demand prices and vCPUs must be complete). `progress` is
/// called once per finished run.
pub fn run_study(
    market: &Market,
    config: &SimConfig,
    progress: &(dyn Fn() + Sync),
) -> Result<Study, SimError> {
    config.check()?;
    let (first, last) = market.span()?;
    let train_end = first + ((last - first) as f64 * config.train_fraction) as i64;
    let training = market.slice(first, train_end);
    let model = EvictionModel::fit(&training, config.eviction.clone())?;
    let naive = ConstantRateModel::fit(&training, model.config());
    let eviction_score =
        crate::eviction::score(&model, &naive, &market.slice(train_end, last + 1), 3600.0);

    let step = MarketGrid::step_for(market);
    let grid = MarketGrid::new(market, step)?;
    let reference = reference_pool(&grid).ok_or_else(|| SimError::Plan {
        source_name: market.source.clone(),
        reason: "no pool has an on-demand price".into(),
    })?;
    let reference_info = &grid.pools[reference];
    let reliable = ReliableTier {
        count: config.reliable_count,
        vcpus: reference_info.vcpus,
        usd_hr: reference_info.on_demand_usd_hr.unwrap_or(f64::INFINITY),
    };
    let ctx = Context {
        grid: &grid,
        model: &model,
        config,
        reference,
        reliable,
    };

    // start slots: uniform over the evaluation slice, leaving room for 4× the longest job
    let first_slot = ((train_end - grid.t0) / step).max(0) as usize;
    let longest = config.job_hours.iter().copied().fold(0.0, f64::max);
    let room = (4.0 * longest * 3600.0 / step as f64).ceil();
    if first_slot as f64 + room >= grid.slots as f64 {
        return Err(SimError::Plan {
            source_name: market.source.clone(),
            reason: format!(
                "the evaluation slice ({:.1} h) is shorter than 4× the longest job ({longest} h)",
                (grid.slots - first_slot.min(grid.slots)) as f64 * step as f64 / 3600.0
            ),
        });
    }
    let room = room as usize;
    let mut rng = ChaCha8Rng::seed_from_u64(config.seed);
    let mut jobs: Vec<(f64, usize)> = Vec::new();
    for &hours in &config.job_hours {
        for _ in 0..config.starts {
            jobs.push((hours, rng.random_range(first_slot..grid.slots - room)));
        }
    }
    let hindsight = hindsight::SlotCosts::new(
        &grid,
        &config.app,
        config.throughput.as_ref(),
        config.billing,
    );

    let next = AtomicUsize::new(0);
    let threads = config.threads.max(1);
    let mut results: Vec<Option<StartResult>> = vec![None; jobs.len()];
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                let (ctx, jobs, next, hindsight) = (&ctx, &jobs, &next, &hindsight);
                scope.spawn(move || {
                    let mut out = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(&(hours, slot)) = jobs.get(i) else {
                            break;
                        };
                        out.push((i, run_start(ctx, hindsight, hours, slot, progress)));
                    }
                    out
                })
            })
            .collect();
        for handle in handles {
            for (i, result) in handle.join().expect("simulation thread panicked") {
                results[i] = Some(result);
            }
        }
    });
    Ok(Study {
        source: market.source.clone(),
        billing: config.billing,
        reference_type: grid.pools[reference].id.instance_type.clone(),
        step_seconds: step,
        train_end,
        eviction_score,
        application: describe_application(&config.app, config.throughput.as_ref()),
        starts: results.into_iter().flatten().collect(),
    })
}

fn run_start(
    ctx: &Context<'_>,
    hindsight: &hindsight::SlotCosts,
    hours: f64,
    slot: usize,
    progress: &(dyn Fn() + Sync),
) -> StartResult {
    let work = hours * 3600.0 * ctx.baseline_rate();
    let baseline = on_demand_only(ctx, hours);
    let runs: Vec<RunResult> = Strategy::ALL
        .iter()
        .map(|&strategy| {
            let result = match strategy {
                Strategy::OnDemandOnly => baseline,
                Strategy::Hindsight => hindsight::lower_bound(ctx, hindsight, slot, work),
                _ => simulate(ctx, hindsight, strategy, slot, work),
            };
            progress();
            result
        })
        .collect();
    let index = Strategy::ALL
        .iter()
        .position(|&s| s == Strategy::StandardAgileMl)
        .unwrap_or(0);
    let span = (runs[index].runtime_seconds / ctx.grid.step as f64).ceil() as usize;
    StartResult {
        job_hours: hours,
        start: ctx.grid.time(slot),
        baseline,
        movement: movement(ctx, slot, span.max(1)),
        runs,
    }
}

/// One line naming the work-rate model: the linear terms, or the measured table.
fn describe_application(app: &AppModel, throughput: Option<&ThroughputTable>) -> String {
    let rate = match throughput {
        None => format!(
            "linear: transient nodes at φ = {}, reliable nodes idle above {}:1",
            app.phi, app.stage3_ratio
        ),
        Some(table) => {
            let points: Vec<String> = table
                .points()
                .iter()
                .map(|(ratio, share)| format!("{ratio}:1 {share:.3}"))
                .collect();
            format!(
                "measured throughput ÷ reliable-only by transient:reliable ratio, clamped outside \
                 ({})",
                points.join(", ")
            )
        }
    };
    format!(
        "application: ν = {} per vCPU-second, σ = {} s, λ = {} s; {rate}",
        app.nu_per_vcpu_second, app.sigma_seconds, app.lambda_seconds
    )
}

/// The standard strategies' pick at `slot`: the lowest current price at most the pool's
/// on-demand price.
fn standard_pool(grid: &MarketGrid, slot: usize) -> Option<(usize, f64)> {
    (0..grid.pools.len())
        .filter_map(|p| grid.price(p, slot).map(|price| (p, price)))
        .filter(|&(p, price)| grid.pools[p].on_demand_usd_hr.is_some_and(|od| price <= od))
        .min_by(|a, b| a.1.total_cmp(&b.1))
}

/// [`Movement`] over `span` slots from `start`.
fn movement(ctx: &Context<'_>, start: usize, span: usize) -> Movement {
    let grid = ctx.grid;
    let Some((held, first_price)) = standard_pool(grid, start) else {
        return Movement::default();
    };
    let per_work =
        |pool: usize, price: f64| price / ctx.config.app.transient_rate(grid.pools[pool].vcpus);
    let mut out = Movement::default();
    let (mut spend, mut saved) = (0.0, 0.0);
    for slot in start..(start + span).min(grid.slots) {
        let Some(price) = grid.price(held, slot) else {
            out.price_changed = true;
            continue;
        };
        out.price_changed |= price != first_price;
        let own = per_work(held, price);
        let best = (0..grid.pools.len())
            .filter_map(|p| grid.price(p, slot).map(|q| (p, q)))
            .filter(|&(p, q)| grid.pools[p].on_demand_usd_hr.is_some_and(|od| q <= od))
            .map(|(p, q)| per_work(p, q))
            .fold(own, f64::min);
        out.overtaken |= best < own;
        spend += own;
        saved += own - best;
    }
    out.move_saving = if spend > 0.0 { saved / spend } else { 0.0 };
    out
}

/// `cluster_size` on-demand instances for `hours`: the unit of every relative figure.
fn on_demand_only(ctx: &Context<'_>, hours: f64) -> RunResult {
    let instances = f64::from(ctx.config.cluster_size);
    RunResult {
        cost_usd: instances * ctx.reference_od() * hours,
        runtime_seconds: hours * 3600.0,
        on_demand_hours: instances * hours,
        completed_in_trace: true,
        ..RunResult::default()
    }
}

/// A running allocation in the simulator.
#[derive(Clone)]
struct Live {
    allocation: Allocation,
    meter: Meter,
    ready_at: Timestamp,
    rate_each: f64,
}

impl Live {
    /// Starts `allocation` (launched at its `launched_at`); it works from `ready_at` on.
    fn launch(ctx: &Context<'_>, allocation: Allocation, ready_at: Timestamp) -> Self {
        Self {
            rate_each: ctx
                .config
                .app
                .node_rate(ctx.grid.pools[allocation.pool].vcpus),
            meter: Meter::new(ctx.config.billing, allocation.launched_at),
            allocation,
            ready_at,
        }
    }
}

/// Totals of finished instances.
#[derive(Default)]
struct Ledger {
    result: RunResult,
}

impl Ledger {
    /// Ends every allocation of `live` for `reason`.
    fn close_all(&mut self, live: &mut Vec<Live>, reason: EndReason) {
        for l in live.drain(..) {
            self.close(l, reason);
        }
    }

    fn close(&mut self, live: Live, reason: EndReason) {
        let count = f64::from(live.allocation.count);
        let charge: Charge = live.meter.finish(reason);
        self.result.cost_usd += count * charge.usd;
        if live.allocation.capacity == CapacityType::OnDemand {
            self.result.on_demand_hours +=
                count * (charge.paid_seconds + charge.free_seconds) / 3600.0;
        } else {
            self.result.paid_spot_hours += count * charge.paid_seconds / 3600.0;
            self.result.free_hours += count * charge.free_seconds / 3600.0;
        }
        if reason == EndReason::Evicted {
            self.result.evictions += 1;
        }
    }
}

/// Replay one job from `start_slot` under a standard or BidBrain strategy.
fn simulate(
    ctx: &Context<'_>,
    costs: &hindsight::SlotCosts,
    strategy: Strategy,
    start_slot: usize,
    work: f64,
) -> RunResult {
    let grid = ctx.grid;
    let config = ctx.config;
    let app = &config.app;
    let billing = config.billing;
    let step = grid.step;
    let agile = strategy != Strategy::StandardCheckpoint;
    let start = grid.time(start_slot);
    let mut bidder_config = config.bidder.clone();
    bidder_config.max_transient = config.cluster_size;
    bidder_config.throughput = config.throughput.clone();
    // The replay decides at slot starts only, so the bidder is told so: its decisions come
    // every step at the soonest, and the last one before a billing boundary is up to a step
    // ahead of it. Before, on a 15-minute grid (hourly data) the time to a boundary was
    // never within the 5-minute lead, and under aws-hourly-2016 BidBrain never released.
    bidder_config.interval_seconds = bidder_config.interval_seconds.max(step);
    bidder_config.boundary_lead_seconds = bidder_config.boundary_lead_seconds.max(step);
    let bidder = Bidder {
        config: bidder_config,
        billing,
        eviction: ctx.model,
    };

    let mut ledger = Ledger::default();
    let mut live: Vec<Live> = Vec::new();
    let mut next_id = 0u64;
    // the reliable tier runs throughout (AgileML only), billed like any on-demand instance
    let mut reliable_meter = agile.then(|| Meter::new(billing, start));
    let reliable_od = ctx.reliable.usd_hr;
    let mut done = 0.0;
    let mut stall_until: Timestamp = start;
    let mut next_decision: Timestamp = start;
    // checkpointing state
    let mut checkpoint_work = 0.0;
    let mut last_checkpoint: Timestamp = start;
    let mut checkpoint_interval = 3600.0;
    // the hindsight schedule holds a ride it knows is refunded
    let mut riding_free = false;

    let mut slot = start_slot;
    loop {
        let t = grid.time(slot);
        if slot >= grid.slots {
            // the trace ended: finish the rest on the on-demand baseline; a checkpointed job
            // restarts there from its last checkpoint (what it did since is lost), after the
            // restart delay
            let (kept, restart) = if agile {
                (done, 0.0)
            } else {
                (checkpoint_work, config.restart_seconds)
            };
            let rest_hours = (work - kept) / ctx.baseline_rate() / 3600.0;
            ledger.close_all(&mut live, EndReason::JobFinished);
            if let Some(meter) = reliable_meter.take() {
                ledger.result.cost_usd +=
                    f64::from(ctx.reliable.count) * meter.finish(EndReason::JobFinished).usd;
                ledger.result.on_demand_hours +=
                    f64::from(ctx.reliable.count) * (t - start) as f64 / 3600.0;
            }
            let fallback = on_demand_only(ctx, rest_hours);
            ledger.result.cost_usd += fallback.cost_usd;
            ledger.result.on_demand_hours += fallback.on_demand_hours;
            ledger.result.runtime_seconds = (t - start) as f64 + restart + rest_hours * 3600.0;
            ledger.result.completed_in_trace = false;
            return ledger.result;
        }

        // evictions: the pool cannot be kept, or its price rose above the max price
        let mut evicted = false;
        let mut index = 0;
        while index < live.len() {
            let l = &live[index];
            let keep = match l.allocation.capacity {
                CapacityType::OnDemand => true,
                CapacityType::Spot => grid
                    .price(l.allocation.pool, slot)
                    .is_some_and(|p| p <= l.allocation.max_price.unwrap_or(f64::INFINITY)),
            };
            if keep {
                index += 1;
            } else {
                ledger.close(live.swap_remove(index), EndReason::Evicted);
                evicted = true;
            }
        }
        if evicted {
            if agile {
                stall_until = stall_until.max(t + app.lambda_seconds as i64);
            } else {
                done = checkpoint_work;
                last_checkpoint = t;
                stall_until = stall_until.max(t + config.restart_seconds as i64);
            }
        }

        // decisions
        match strategy {
            Strategy::BidBrainAgileMl if evicted || t >= next_decision => {
                let view = grid.view(slot);
                let allocations: Vec<Allocation> =
                    live.iter().map(|l| l.allocation.clone()).collect();
                let job = JobState {
                    remaining_work: work - done,
                    ..JobState::default()
                };
                let decision = bidder.decide(&BidderInput {
                    now: t,
                    pools: &grid.pools,
                    market: &view,
                    allocations: &allocations,
                    reliable: &ctx.reliable,
                    app,
                    job: &job,
                });
                for id in &decision.release {
                    if let Some(i) = live.iter().position(|l| l.allocation.id == *id) {
                        ledger.close(live.swap_remove(i), EndReason::Released);
                    }
                }
                for cut in &decision.shrink {
                    if let Some(held) = live.iter_mut().find(|l| l.allocation.id == cut.id) {
                        let count = cut.count.min(held.allocation.count);
                        let mut part = held.clone();
                        part.allocation.count = count;
                        held.allocation.count -= count;
                        ledger.close(part, EndReason::Released);
                    }
                }
                for request in decision.acquire {
                    let buyable = match request.capacity {
                        CapacityType::OnDemand => true,
                        CapacityType::Spot => grid
                            .price(request.pool, slot)
                            .is_some_and(|p| p <= request.max_price.unwrap_or(f64::INFINITY)),
                    };
                    if buyable {
                        next_id += 1;
                        let allocation = Allocation {
                            id: next_id,
                            pool: request.pool,
                            capacity: request.capacity,
                            count: request.count,
                            max_price: request.max_price,
                            launched_at: t,
                        };
                        live.push(Live::launch(ctx, allocation, t + app.sigma_seconds as i64));
                    }
                }
                next_decision = decision.next_decision_at.max(t + 1);
            }
            Strategy::HindsightSchedule => {
                // Keep a free ride to its eviction; leave a paid one (or nothing) for a free
                // ride as soon as one exists, or to wait for one due within 6 h when that is
                // cheaper; otherwise hold the pool cheapest per work.
                riding_free &= !live.is_empty();
                let ride = if riding_free {
                    None
                } else if let Some(free) = hindsight::free_ride(costs, slot) {
                    Some(free)
                } else if hindsight::wait_for_free_ride(ctx, costs, slot) {
                    ledger.close_all(&mut live, EndReason::Released);
                    None
                } else if live.is_empty() {
                    hindsight::paid_ride(ctx, slot)
                } else {
                    None
                };
                if let Some(ride) = ride {
                    ledger.close_all(&mut live, EndReason::Released);
                    next_id += 1;
                    let allocation = Allocation {
                        id: next_id,
                        pool: ride.pool,
                        capacity: CapacityType::Spot,
                        count: config.cluster_size,
                        max_price: ride.max_price,
                        launched_at: t,
                    };
                    live.push(Live::launch(ctx, allocation, t + app.sigma_seconds as i64));
                    riding_free = ride.free;
                }
            }
            Strategy::StandardCheckpoint | Strategy::StandardAgileMl if live.is_empty() => {
                // the lowest current market price, bid the on-demand price
                if let Some((pool, price)) = standard_pool(grid, slot) {
                    let on_demand = grid.pools[pool].on_demand_usd_hr.unwrap_or(price);
                    next_id += 1;
                    let ready_at = if agile {
                        t + app.sigma_seconds as i64
                    } else {
                        // boot, then restore: progress resumes after the restart delay
                        t + (config.restart_seconds as i64).max(app.sigma_seconds as i64)
                    };
                    let allocation = Allocation {
                        id: next_id,
                        pool,
                        capacity: CapacityType::Spot,
                        count: config.cluster_size,
                        max_price: Some(on_demand),
                        launched_at: t,
                    };
                    live.push(Live::launch(ctx, allocation, ready_at));
                    if !agile {
                        // MTTF-based interval (Young): with overhead δ/I = 17%, I = 2 · 0.17 · MTTF
                        let delta = (on_demand - price) / on_demand;
                        let mttf = ctx
                            .model
                            .median_time_to_eviction(pool, delta)
                            .unwrap_or(4.0 * 3600.0);
                        checkpoint_interval =
                            (2.0 * config.checkpoint_overhead * mttf).clamp(600.0, 7200.0);
                    }
                }
            }
            _ => {}
        }

        // progress over [t, t + step)
        let end = t + step;
        let transient_count: f64 = live.iter().map(|l| f64::from(l.allocation.count)).sum();
        let reliable_count = if agile {
            f64::from(ctx.reliable.count)
        } else {
            0.0
        };
        // the bidder's code: each tier's share of ν at this footprint's ratio
        let share = app.efficiency(config.throughput.as_ref(), transient_count, reliable_count);
        let reliable_rate = reliable_count * app.node_rate(ctx.reliable.vcpus) * share.reliable;
        let efficiency = if agile {
            share.transient
        } else {
            share.transient / (1.0 + config.checkpoint_overhead)
        };
        // (rate, from) pieces: each allocation contributes from when it is ready
        let progress_from = |ready: Timestamp| (ready.max(stall_until).max(t)).min(end);
        let mut pieces: Vec<(Timestamp, f64)> = live
            .iter()
            .map(|l| {
                (
                    progress_from(l.ready_at),
                    l.rate_each * f64::from(l.allocation.count) * efficiency,
                )
            })
            .collect();
        pieces.push((progress_from(t), reliable_rate));
        pieces.sort_by_key(|p| p.0);
        let mut finish_at = None;
        let mut rate = 0.0;
        for i in 0..pieces.len() {
            rate += pieces[i].1;
            let from = pieces[i].0;
            let to = pieces.get(i + 1).map_or(end, |p| p.0);
            let gain = rate * (to - from) as f64;
            if rate > 0.0 && done + gain >= work {
                finish_at = Some(from + ((work - done) / rate).ceil() as Timestamp);
                done = work;
                break;
            }
            done += gain;
        }

        let until = finish_at.unwrap_or(end);
        for l in &mut live {
            let price = match l.allocation.capacity {
                CapacityType::Spot => grid.price(l.allocation.pool, slot).unwrap_or(0.0),
                CapacityType::OnDemand => grid.pools[l.allocation.pool]
                    .on_demand_usd_hr
                    .unwrap_or(0.0),
            };
            l.meter.advance(until, price);
        }
        if let Some(meter) = reliable_meter.as_mut() {
            meter.advance(until, reliable_od);
        }
        if let Some(finish) = finish_at {
            ledger.close_all(&mut live, EndReason::JobFinished);
            if let Some(meter) = reliable_meter.take() {
                let reliable = f64::from(ctx.reliable.count);
                ledger.result.cost_usd += reliable * meter.finish(EndReason::JobFinished).usd;
                ledger.result.on_demand_hours += reliable * (finish - start) as f64 / 3600.0;
            }
            ledger.result.runtime_seconds = (finish - start) as f64;
            ledger.result.completed_in_trace = true;
            return ledger.result;
        }
        if !agile && (end - last_checkpoint) as f64 >= checkpoint_interval {
            checkpoint_work = done;
            last_checkpoint = end;
        }
        slot += 1;
    }
}

#[cfg(test)]
mod tests;
