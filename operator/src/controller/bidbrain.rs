//! BidBrain as the controller's capacity planner: the same [`Bidder`] as `ebbflow simulate` and
//! `ebbflow run`, over the same job market ([`ebbflow_job::jobmarket::setup_market`]).
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
//! On the live `ec2` market (when the planner has an EC2 client, [`BidBrainPlanner::with_ec2`])
//! the market is EC2's spot price history over the last `live_lookback`, on-demand prices from
//! an [`OnDemandPrices`] list ([`ebbflow_job::jobmarket::setup_ec2_market`]); it is fetched in a
//! spawned task (a decision never waits on EC2), refreshed every `live_refresh`, and decided at
//! wall-clock time. Until the first fetch lands the reason is `MarketLoading`; a failed fetch is
//! logged and the reason is `MarketUnavailable` until a retry succeeds (a market fetched
//! earlier is kept meanwhile, for at most `live_max_age`).
//!
//! Jobs with another strategy, a live market without a price source here (gcp; ec2 without an
//! EC2 client: reason `NoMarketView`), or a market that cannot be loaded are decided by
//! [`SpecCapacityPlanner`]; a load failure is logged once per market and retried after
//! `retry_failed_after`.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ebbflow_crds::{BiddingStrategy, CapacityType, MarketKind, TrainingJob};
use ebbflow_ec2::Ec2Api;
use k8s_openapi::jiff::Timestamp;
use parking_lot::Mutex;
use tracing::{debug, info, warn};

use super::calibration::JobCalibration;
use super::capacity::{CapacityPlanner, CapacityView, SpecCapacityPlanner};
use super::cost::{MarketClock, Pricing, market_time};
use super::plan::{CapacityDecision, PoolKey};
use ebbflow_bidbrain::bidder::{Allocation, AppModel, Bidder, BidderInput, JobState};
use ebbflow_bidbrain::market;
use ebbflow_job::jobmarket::{
    LiveSettings, MarketSetup, app_model, bidder_config, fetch_ec2_setup, setup_market,
};
use ebbflow_job::live_market::OnDemandPrices;

/// Settings of [`BidBrainPlanner`].
#[derive(Clone, Debug)]
pub struct BidBrainConfig {
    /// Relative trace paths resolve against the working directory, then this directory.
    pub trace_dir: PathBuf,
    /// Trace seconds per wall second (1 in production).
    pub trace_speed: f64,
    /// How long a market that failed to load is not retried.
    pub retry_failed_after: Duration,
    /// How much spot price history a live market learns from.
    pub live_lookback: Duration,
    /// How often a live market is fetched again.
    pub live_refresh: Duration,
    /// How long a live market is still used while fetching it again fails.
    pub live_max_age: Duration,
    /// Decide with the application model re-estimated from each job's progress
    /// ([`super::calibration`]); when false the spec's terms are used (and still measured).
    pub recalibrate: bool,
    /// A job's calibration, or a market (trace or live), that no decision used for this long is
    /// dropped: jobs deleted, or edited onto other markets, do not keep their grids in memory,
    /// and a trace file replaced on its volume is read again once idle.
    pub calibration_idle: Duration,
}

impl Default for BidBrainConfig {
    fn default() -> Self {
        Self {
            trace_dir: PathBuf::from("."),
            trace_speed: 1.0,
            retry_failed_after: Duration::from_secs(60),
            live_lookback: Duration::from_secs(7 * 24 * 3600),
            live_refresh: Duration::from_secs(600),
            live_max_age: Duration::from_secs(3600),
            recalibrate: true,
            calibration_idle: Duration::from_secs(3600),
        }
    }
}

enum Loaded {
    Ready(Arc<MarketSetup>),
    Failed { at: Instant },
}

/// Where live `ec2` markets come from: an EC2 client of one region and the on-demand prices.
#[derive(Clone)]
pub struct Ec2MarketSource {
    /// The client (the operator's `--ec2-region`).
    pub api: Arc<dyn Ec2Api>,
    /// The client's region; jobs whose market is elsewhere get `MarketUnavailable`.
    pub region: String,
    /// On-demand prices (EC2 serves none).
    pub on_demand: Arc<OnDemandPrices>,
}

/// One live market: the last one fetched and the state of fetching.
#[derive(Default)]
struct LiveMarket {
    ready: Option<(Arc<MarketSetup>, Instant)>,
    fetching: bool,
    failed_at: Option<Instant>,
    /// When a decision or a price last asked for it.
    used: Option<Instant>,
}

impl LiveMarket {
    /// Whether a fetch should start now.
    fn wants_fetch(&self, config: &BidBrainConfig) -> bool {
        let stale = self
            .ready
            .as_ref()
            .is_none_or(|(_, at)| at.elapsed() >= config.live_refresh);
        let may_retry = self
            .failed_at
            .is_none_or(|at| at.elapsed() >= config.retry_failed_after);
        stale && may_retry && !self.fetching
    }

    /// The market to decide on, or why there is none.
    fn current(&self, config: &BidBrainConfig) -> Result<Arc<MarketSetup>, &'static str> {
        match &self.ready {
            Some((setup, at)) if at.elapsed() < config.live_max_age => Ok(setup.clone()),
            _ if self.fetching && self.failed_at.is_none() => Err("MarketLoading"),
            _ => Err("MarketUnavailable"),
        }
    }
}

type LiveMarkets = Arc<Mutex<HashMap<String, LiveMarket>>>;

/// The BidBrain capacity planner (see the module docs).
pub struct BidBrainPlanner {
    config: BidBrainConfig,
    /// Trace markets by [`market_key`], with when a decision last used each.
    markets: Mutex<HashMap<String, (Loaded, Instant)>>,
    ec2: Option<Ec2MarketSource>,
    live: LiveMarkets,
    /// Per job (uid): its calibration and when a decision last used it.
    calibrations: Mutex<HashMap<String, (JobCalibration, Instant)>>,
}

/// Jobs with equal keys share one market.
fn market_key(job: &TrainingJob) -> String {
    let spec = &job.spec;
    serde_json::json!([
        spec.bidding.market,
        spec.bidding.billing_model,
        spec.transient.instance_types,
        spec.transient.zones,
        spec.reliable.count,
    ])
    .to_string()
}

/// The spec's decision with `reason`, while BidBrain has no market for the job; nothing
/// transient once the total budget is spent (the spec's maxNodes would keep buying).
fn hold_spec(view: &CapacityView<'_>, reason: &str) -> CapacityDecision {
    if budget_spent(view.job) {
        return CapacityDecision {
            reason: "BudgetExhausted".to_owned(),
            ..CapacityDecision::default()
        };
    }
    let mut decision = SpecCapacityPlanner.decide(view);
    decision.reason = reason.to_owned();
    decision
}

/// USD the job has spent so far (`status.cost.spent`).
fn spent(job: &TrainingJob) -> f64 {
    job.status
        .as_ref()
        .and_then(|s| s.cost.as_ref())
        .map_or(0.0, |c| c.spent)
}

/// The job's total budget is set and spent.
fn budget_spent(job: &TrainingJob) -> bool {
    job.spec
        .bidding
        .budget_total
        .is_some_and(|budget| spent(job) >= budget)
}

impl BidBrainPlanner {
    /// A planner with no market loaded yet and no live source.
    pub fn new(config: BidBrainConfig) -> Self {
        Self {
            config,
            markets: Mutex::new(HashMap::new()),
            ec2: None,
            live: LiveMarkets::default(),
            calibrations: Mutex::new(HashMap::new()),
        }
    }

    /// Decides jobs on the live `ec2` market from `source`.
    pub fn with_ec2(mut self, source: Ec2MarketSource) -> Self {
        self.ec2 = Some(source);
        self
    }

    /// The job's live market, fetched in the background (see the module docs).
    fn live_market(
        &self,
        source: &Ec2MarketSource,
        job: &TrainingJob,
        now: Timestamp,
    ) -> Result<Arc<MarketSetup>, &'static str> {
        let key = market_key(job);
        let mut markets = self.live.lock();
        let idle = self.config.calibration_idle;
        markets.retain(|k, m| *k == key || m.fetching || m.used.is_none_or(|u| u.elapsed() < idle));
        let entry = markets.entry(key.clone()).or_default();
        entry.used = Some(Instant::now());
        if entry.wants_fetch(&self.config) {
            match tokio::runtime::Handle::try_current() {
                Ok(runtime) => {
                    entry.fetching = true;
                    runtime.spawn(fetch_live(
                        self.live.clone(),
                        key,
                        source.clone(),
                        job.clone(),
                        self.config.live_lookback,
                        now.as_second(),
                    ));
                }
                Err(error) => {
                    warn!(job = ?job.metadata.name, %error, "BidBrain cannot fetch the ec2 market outside a tokio runtime");
                    entry.failed_at = Some(Instant::now());
                }
            }
        }
        entry.current(&self.config)
    }

    /// Decides `view`'s job on `setup` with its calibrated application model (see
    /// [`super::calibration`]), and takes the decision into the calibration.
    fn decide_calibrated(
        &self,
        setup: &MarketSetup,
        clock: MarketClock,
        view: &CapacityView<'_>,
    ) -> CapacityDecision {
        let job = view.job;
        let key = job_key(job);
        let spec = app_model(job);
        // Taken out while deciding: reconciles of one job never run concurrently, and other jobs'
        // decisions do not wait on this one.
        let taken = {
            let mut calibrations = self.calibrations.lock();
            let idle = self.config.calibration_idle;
            calibrations.retain(|_, (_, used)| used.elapsed() < idle);
            calibrations.remove(&key)
        };
        let mut calibration = match taken {
            Some((calibration, _)) if calibration.spec() == &spec => calibration,
            _ => {
                let created = job
                    .metadata
                    .creation_timestamp
                    .as_ref()
                    .map_or(view.now, |t| t.0);
                JobCalibration::new(spec.clone(), clock.speed(), created)
            }
        };
        let vcpus_of = |key: &PoolKey| {
            setup
                .grid
                .pools
                .iter()
                .find(|p| p.id.instance_type == key.0.instance_type && p.id.zone == key.0.zone)
                .map(|p| p.vcpus)
        };
        for measurement in calibration.observe(view, setup.reliable.vcpus, vcpus_of) {
            debug!(job = ?job.metadata.name, ?measurement, model = ?calibration.model(), "application model measured");
        }
        let app = if self.config.recalibrate {
            calibration.model().clone()
        } else {
            spec
        };
        let mut decision = decide_on(setup, clock, view, &app);
        calibration.decided(&decision.transient);
        decision.app_model = Some(calibration.status(self.config.recalibrate));
        self.calibrations
            .lock()
            .insert(key, (calibration, Instant::now()));
        decision
    }

    /// The job's market, loaded on first use and shared by jobs with the same market settings.
    fn market(&self, job: &TrainingJob) -> Option<Arc<MarketSetup>> {
        let key = market_key(job);
        let idle = self.config.calibration_idle;
        let mut markets = self.markets.lock();
        markets.retain(|k, (_, used)| *k == key || used.elapsed() < idle);
        if let Some((loaded, used)) = markets.get_mut(&key) {
            *used = Instant::now();
            match loaded {
                Loaded::Ready(setup) => return Some(setup.clone()),
                Loaded::Failed { at } if at.elapsed() < self.config.retry_failed_after => {
                    return None;
                }
                Loaded::Failed { .. } => {}
            }
        }
        drop(markets);
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
        self.markets.lock().insert(key, (loaded, Instant::now()));
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
        match (bidding.market.kind, &self.ec2) {
            (MarketKind::Trace, _) => match self.market(job) {
                Some(setup) => self.decide_calibrated(
                    &setup,
                    MarketClock::Replay {
                        speed: self.config.trace_speed,
                    },
                    view,
                ),
                None => hold_spec(view, "MarketUnavailable"),
            },
            (MarketKind::Ec2, Some(source)) => match self.live_market(source, job, view.now) {
                Ok(setup) => self.decide_calibrated(&setup, MarketClock::Wall, view),
                Err(reason) => hold_spec(view, reason),
            },
            (MarketKind::Ec2 | MarketKind::Gcp, _) => hold_spec(view, "NoMarketView"),
        }
    }

    fn forget(&self, job: &TrainingJob) {
        self.calibrations.lock().remove(&job_key(job));
    }

    /// Any strategy's job is priced on its market: a trace replayed at this planner's speed, or
    /// the live ec2 market once fetched.
    fn pricing(&self, job: &TrainingJob, now: Timestamp) -> Option<Pricing> {
        let created = job
            .metadata
            .creation_timestamp
            .as_ref()
            .map_or(now, |t| t.0);
        let (setup, clock) = match (job.spec.bidding.market.kind, &self.ec2) {
            (MarketKind::Trace, _) => (
                self.market(job)?,
                MarketClock::Replay {
                    speed: self.config.trace_speed,
                },
            ),
            (MarketKind::Ec2, Some(source)) => {
                (self.live_market(source, job, now).ok()?, MarketClock::Wall)
            }
            (MarketKind::Ec2 | MarketKind::Gcp, _) => return None,
        };
        Some(Pricing {
            setup,
            clock,
            created,
        })
    }
}

/// A job's calibration key: its uid, or namespace/name without one.
fn job_key(job: &TrainingJob) -> String {
    match &job.metadata.uid {
        Some(uid) => uid.clone(),
        None => format!(
            "{}/{}",
            job.metadata.namespace.as_deref().unwrap_or_default(),
            job.metadata.name.as_deref().unwrap_or_default()
        ),
    }
}

/// Fetches one live market and stores the outcome under `key`.
async fn fetch_live(
    markets: LiveMarkets,
    key: String,
    source: Ec2MarketSource,
    job: TrainingJob,
    lookback: Duration,
    now: market::Timestamp,
) {
    let settings = LiveSettings {
        on_demand: &source.on_demand,
        lookback,
    };
    let result = fetch_ec2_setup(source.api.as_ref(), &source.region, &job, settings, now).await;
    let mut markets = markets.lock();
    let entry = markets.entry(key).or_default();
    entry.fetching = false;
    match result {
        Ok(setup) => {
            info!(job = ?job.metadata.name, pools = setup.grid.pools.len(), "BidBrain fetched the ec2 market");
            entry.ready = Some((Arc::new(setup), Instant::now()));
            entry.failed_at = None;
        }
        Err(error) => {
            warn!(job = ?job.metadata.name, %error, "BidBrain could not fetch the ec2 market; holding spec.transient.maxNodes until a retry succeeds");
            entry.failed_at = Some(Instant::now());
        }
    }
}

fn pool_key(info: &market::PoolInfo, capacity: market::CapacityType) -> PoolKey {
    let capacity = match capacity {
        market::CapacityType::Spot => CapacityType::Spot,
        market::CapacityType::OnDemand => CapacityType::OnDemand,
    };
    PoolKey::new(&info.id.instance_type, &info.id.zone, capacity)
}

/// The max price a held spot allocation is modelled at: in ec2 mode the bid its instances
/// were launched at (`recorded`, where the pods record one), else the job's `cap` (the cluster
/// buys spot capacity without our bid).
fn held_bid(ec2: bool, recorded: Option<f64>, cap: Option<f64>) -> Option<f64> {
    if ec2 { recorded.or(cap) } else { cap }
}

/// One BidBrain decision for the job in `view` on `setup`'s market with application model
/// `app` (pure).
pub fn decide_on(
    setup: &MarketSetup,
    clock: MarketClock,
    view: &CapacityView<'_>,
    app: &AppModel,
) -> CapacityDecision {
    let job = view.job;
    let grid = &setup.grid;
    let created = job
        .metadata
        .creation_timestamp
        .as_ref()
        .map_or(view.now, |t| t.0);
    let to_trace = |at: Timestamp| market_time(setup, clock, created, at);

    let now = to_trace(view.now);
    let slot = grid.slot_at(now);
    let mut market_view = grid.view(slot);

    // the allocations: alive transient pods per known pool
    let mut index: BTreeMap<PoolKey, (usize, market::CapacityType)> = BTreeMap::new();
    for (i, info) in grid.pools.iter().enumerate() {
        for capacity in [market::CapacityType::Spot, market::CapacityType::OnDemand] {
            index.insert(pool_key(info, capacity), (i, capacity));
        }
    }
    // A spot pool the cluster did not place the job's pods in has, for this job, no capacity
    // whatever its price says: nothing is bought there, and what waits there is not held (the
    // plan drops it), so the bidder buys it elsewhere.
    for key in view.unplaceable {
        if let Some(&(pool, market::CapacityType::Spot)) = index.get(key)
            && let Some(quote) = market_view.quotes.get_mut(pool)
        {
            quote.available = false;
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
    let ec2_bids = job.spec.provisioning.mode == ebbflow_crds::ProvisioningMode::Ec2;
    let mut allocations = Vec::new();
    for (id, (key, count)) in view.alive.iter().enumerate() {
        let Some(&(pool, capacity)) = index.get(key) else {
            continue;
        };
        if *count == 0 || view.unplaceable.contains(key) {
            continue;
        }
        let launched = view.launched.get(key).copied().unwrap_or(view.now);
        allocations.push(Allocation {
            id: id as u64,
            pool,
            capacity,
            count: *count,
            // in ec2 mode the bid the instances were launched at (a held instance keeps its
            // bid); elsewhere the cluster buys spot capacity without our bid (Karpenter and
            // the like pay the market up to on-demand), and pods that record none fall back
            // on the cap or the on-demand price too
            max_price: match capacity {
                market::CapacityType::Spot => {
                    held_bid(ec2_bids, view.bids.get(key).copied(), max_price(pool))
                }
                market::CapacityType::OnDemand => None,
            },
            launched_at: to_trace(launched),
        });
    }

    let iterations = job.spec.stop.iterations.unwrap_or(0);
    let done = view.coordinator.and_then(|c| c.iteration).unwrap_or(0);
    let spent = spent(job);
    let state = JobState {
        remaining_work: iterations.saturating_sub(done) as f64,
        deadline: job
            .spec
            .bidding
            .deadline
            .as_ref()
            .and_then(|d| d.to_duration())
            .map(|d| to_trace(created) + (d.as_secs_f64() * clock.speed()) as i64),
        budget_remaining_usd: job.spec.bidding.budget_total.map(|b| (b - spent).max(0.0)),
        budget_per_hour_usd: job.spec.bidding.budget_per_hour,
    };
    let bidder = Bidder {
        config: bidder_config(job),
        billing: setup.billing,
        eviction: &setup.model,
    };
    let decision = bidder.decide(&BidderInput {
        now,
        pools: &grid.pools,
        market: &market_view,
        allocations: &allocations,
        reliable: &setup.reliable,
        app,
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
        *counts.entry(key.clone()).or_default() += decision.kept(allocation);
        // an instance launched for this pool without a new acquisition (a replacement) bids
        // the job's cap, not the held ones' bid: that was near the price of its day
        if allocation.capacity == market::CapacityType::Spot
            && let Some(price) = max_price(allocation.pool)
        {
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
    // minNodes is the bidder's (BidderConfig::min_transient): it bought what the market
    // allows, and says when the market or budgetPerHour allowed less
    use ebbflow_bidbrain::bidder::MinTransientFill;
    let mut reason = if decision.budget_exhausted {
        "BudgetExhausted"
    } else {
        match &decision.min_transient {
            Some(MinTransientFill::Filled { .. }) => "MinNodes",
            Some(MinTransientFill::BudgetLimited { .. }) => "BudgetPerHour",
            Some(MinTransientFill::NoFeasiblePool(_)) => "NoFeasiblePool",
            None if decision.over_budget_per_hour => "BudgetPerHour",
            None if decision.no_feasible_pool.is_some() => "NoFeasiblePool",
            None if decision.deadline_at_risk => "DeadlineAtRisk",
            None if !decision.acquire.is_empty() || !decision.release.is_empty() => "BidBrain",
            None => "BidBrainHold",
        }
    };

    // a lowered maxNodes is the bidder's (BidderConfig::max_transient): it released the
    // instances dearest per work down to it, whole allocations or part of one (`shrink`), and
    // its cost per work counts the cut
    if decision.over_max_transient {
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
        app_model: None,
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
        decide_avoiding(planner, job, alive, &BTreeSet::new(), now)
    }

    /// As [`decide`], with pools the cluster did not place pods in.
    fn decide_avoiding(
        planner: &dyn CapacityPlanner,
        job: &TrainingJob,
        alive: &[(PoolKey, u32)],
        unplaceable: &BTreeSet<PoolKey>,
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
            bids: &BTreeMap::new(),
            pools_under_notice: &BTreeSet::new(),
            failed: &BTreeMap::new(),
            unplaceable,
            coordinator: None,
            now: now.parse().unwrap(),
        })
    }

    /// A pool the cluster did not place the job's pods in is neither bought nor held: what
    /// waits there is dropped and bought in another pool.
    #[test]
    fn a_pool_the_cluster_does_not_place_pods_in_is_bought_elsewhere() {
        let job = job(1, 4);
        let planner = planner();
        let first = decide(&planner, &job, &[], "2026-11-23T10:00:00Z");
        let held: Vec<(PoolKey, u32)> = first.transient.clone().into_iter().collect();
        let (lost, _) = held.first().cloned().expect("BidBrain buys");
        let unplaceable = BTreeSet::from([lost.clone()]);
        let after = decide_avoiding(&planner, &job, &held, &unplaceable, "2026-11-23T10:00:30Z");
        assert!(
            !after.transient.contains_key(&lost),
            "{lost:?} is avoided: {first:?} then {after:?}"
        );
        assert!(
            after.total() >= 1,
            "minNodes is bought elsewhere: {after:?}"
        );
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
    fn a_lowered_max_nodes_is_cut_by_the_bidder_and_priced_in_its_cost_per_work() {
        let planner = planner();
        let first = decide(&planner, &job(0, 6), &[], "2026-11-23T10:00:00Z");
        assert_eq!(first.total(), 6, "{first:?}");
        let held: Vec<(PoolKey, u32)> = first.transient.clone().into_iter().collect();
        // the user lowers maxNodes to 4 under the running job
        let lowered = decide(&planner, &job(0, 4), &held, "2026-11-23T10:00:30Z");
        assert_eq!(lowered.reason, "MaxNodes", "{lowered:?}");
        assert_eq!(lowered.total(), 4, "{lowered:?}");
        for (pool, count) in &lowered.transient {
            assert!(
                *count <= first.transient.get(pool).copied().unwrap_or(0),
                "nothing is bought while over the maximum: {lowered:?}"
            );
        }
        // its cost per work is that of the 4 kept: the same as the next decision's, which
        // holds them
        let kept: Vec<(PoolKey, u32)> = lowered.transient.clone().into_iter().collect();
        let next = decide(&planner, &job(0, 4), &kept, "2026-11-23T10:00:30Z");
        assert_ne!(next.reason, "MaxNodes", "{next:?}");
        assert_eq!(next.transient, lowered.transient, "{next:?}");
        let (e_lowered, e_next) = (
            lowered.expected_cost_per_work.unwrap(),
            next.expected_cost_per_work.unwrap(),
        );
        assert!(
            (e_lowered - e_next).abs() <= 1e-9 * e_next,
            "{e_lowered} against {e_next}"
        );
    }

    #[test]
    fn markets_no_decision_uses_are_dropped() {
        let eager = BidBrainPlanner::new(BidBrainConfig {
            trace_dir: spot_data(),
            calibration_idle: Duration::ZERO,
            ..BidBrainConfig::default()
        });
        let a = job(0, 4);
        let mut b = job(0, 4);
        b.spec.transient.zones = vec!["us-east-1a".into()];
        assert!(eager.market(&a).is_some());
        assert!(eager.market(&b).is_some());
        // b's market is the one in use; a's, idle since, went
        let keys: Vec<String> = eager.markets.lock().keys().cloned().collect();
        assert_eq!(keys, [market_key(&b)]);
        // with the default idle time both stay
        let planner = planner();
        assert!(planner.market(&a).is_some());
        assert!(planner.market(&b).is_some());
        assert_eq!(planner.markets.lock().len(), 2);
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

    /// The cheapest buyable spot pool at the job's start, its price, and the reliable tier's
    /// USD per hour.
    fn cheapest_at_start(job: &TrainingJob) -> (PoolKey, f64, f64) {
        let setup = setup_market(job, &spot_data()).expect("the p3 trace loads");
        let slot = setup.start_slot;
        let (pool, price) = (0..setup.grid.pools.len())
            .filter_map(|pool| setup.grid.price(pool, slot).map(|price| (pool, price)))
            .min_by(|a, b| a.1.total_cmp(&b.1))
            .expect("a buyable pool");
        let key = pool_key(&setup.grid.pools[pool], market::CapacityType::Spot);
        let reliable = f64::from(setup.reliable.count) * setup.reliable.usd_hr;
        (key, price, reliable)
    }

    #[test]
    fn min_nodes_holds_only_while_the_market_allows() {
        let (_, price, reliable) = cheapest_at_start(&job(3, 3));
        // every pool is above the job's max price: nothing is bought, and the decision says so
        let capped = job(3, 3).with_max_price(price / 2.0);
        let decision = decide(&planner(), &capped, &[], "2026-11-23T10:00:00Z");
        assert_eq!(decision.reason, "NoFeasiblePool", "{decision:?}");
        assert_eq!(decision.total(), 0, "{decision:?}");
        // budgetPerHour leaves room for one instance beside the reliable tier: one, not three
        let budget = job(3, 3).with_budget_per_hour(reliable + 1.5 * price);
        let decision = decide(&planner(), &budget, &[], "2026-11-23T10:00:00Z");
        assert_eq!(decision.reason, "BudgetPerHour", "{decision:?}");
        assert_eq!(decision.total(), 1, "{decision:?}");
        // room for all three: minNodes as before
        let roomy = job(3, 3).with_budget_per_hour(reliable + 3.5 * price);
        let decision = decide(&planner(), &roomy, &[], "2026-11-23T10:00:00Z");
        assert_eq!(decision.total(), 3, "{decision:?}");
    }

    #[test]
    fn a_held_allocation_is_modelled_at_its_bid_and_a_replacement_bids_the_cap() {
        let mut job = job(0, 2);
        job.spec.provisioning.mode = ebbflow_crds::ProvisioningMode::Ec2;
        let (pool, price, _) = cheapest_at_start(&job);
        let alive = BTreeMap::from([(pool.clone(), 2)]);
        let launched = BTreeMap::from([(
            pool.clone(),
            job.metadata.creation_timestamp.clone().unwrap().0,
        )]);
        let view = |bids: &BTreeMap<PoolKey, f64>| {
            planner().decide(&CapacityView {
                job: &job,
                alive: &alive,
                launched: &launched,
                bids,
                pools_under_notice: &BTreeSet::new(),
                failed: &BTreeMap::new(),
                unplaceable: &BTreeSet::new(),
                coordinator: None,
                now: "2026-11-23T10:00:30Z".parse().unwrap(),
            })
        };
        let bid = price + 0.0001 * 3.06;
        let recorded = view(&BTreeMap::from([(pool.clone(), bid)]));
        assert_eq!(recorded.transient.get(&pool), Some(&2), "{recorded:?}");
        // an instance launched in the pool without a new acquisition (a replacement) bids the
        // job's cap (here the on-demand price), not the held ones' bid near an old price
        assert_eq!(recorded.max_prices.get(&pool), Some(&3.06), "{recorded:?}");
        // the held allocation itself is modelled at its recorded bid, in ec2 mode only
        assert_eq!(held_bid(true, Some(bid), Some(3.06)), Some(bid));
        assert_eq!(held_bid(true, None, Some(3.06)), Some(3.06));
        assert_eq!(held_bid(false, Some(bid), Some(3.06)), Some(3.06));
    }

    #[test]
    fn a_spent_budget_buys_nothing_while_the_market_loads() {
        let mut live = job(0, 2)
            .with_ec2_market("us-east-1")
            .with_budget_total(10.0);
        live.status = Some(ebbflow_crds::TrainingJobStatus {
            cost: Some(ebbflow_crds::CostStatus {
                spent: 10.0,
                ..Default::default()
            }),
            ..Default::default()
        });
        let decision = decide(&planner(), &live, &[], "2026-11-23T10:00:00Z");
        assert_eq!(decision.reason, "BudgetExhausted");
        assert_eq!(decision.total(), 0);
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

    mod live {
        use std::sync::Arc;

        use chrono::DateTime;
        use ebbflow_ec2::{
            Ec2Api, FakeEc2, InstanceTypeInfo, LINUX_PRODUCT, Operation, SpotPricePoint,
        };

        use super::*;
        use ebbflow_job::jobmarket::{LiveSettings, setup_ec2_market};
        use ebbflow_job::live_market::{LiveMarketError, OnDemandPrices};

        const NOW: &str = "2026-11-23T10:00:00Z";
        const ZONES: [&str; 3] = ["us-east-1a", "us-east-1b", "us-east-1c"];

        fn now() -> i64 {
            NOW.parse::<Timestamp>().unwrap().as_second()
        }

        /// A week of p3.2xlarge price changes every two hours per zone, 0.90..1.26 USD/h.
        fn history() -> Vec<SpotPricePoint> {
            let mut points = Vec::new();
            for (z, zone) in ZONES.iter().enumerate() {
                for step in 0..84_i64 {
                    let at = now() - 7 * 86_400 + step * 7200 + z as i64 * 600;
                    points.push(SpotPricePoint {
                        instance_type: "p3.2xlarge".into(),
                        zone: (*zone).into(),
                        product_description: LINUX_PRODUCT.into(),
                        price_usd_hr: 0.90 + 0.06 * ((step * 5 + z as i64) % 7) as f64,
                        timestamp: DateTime::from_timestamp(at, 0).unwrap(),
                    });
                }
            }
            points
        }

        fn p3_type() -> InstanceTypeInfo {
            InstanceTypeInfo {
                instance_type: "p3.2xlarge".into(),
                vcpus: 8,
                memory_mib: 62_464,
                gpus: 1,
                spot_supported: true,
            }
        }

        fn ec2_job(types: &[&str]) -> TrainingJob {
            let mut job = TrainingJob::test("mf")
                .with_transient_range(0, 4)
                .with_ec2_market("us-east-1");
            job.spec.transient.instance_types = types.iter().map(|t| (*t).into()).collect();
            job.metadata.creation_timestamp = Some(Time(NOW.parse().unwrap()));
            job
        }

        fn on_demand() -> OnDemandPrices {
            OnDemandPrices::bundled().unwrap()
        }

        fn settings(on_demand: &OnDemandPrices) -> LiveSettings<'_> {
            LiveSettings {
                on_demand,
                lookback: Duration::from_secs(7 * 86_400),
            }
        }

        fn source(api: FakeEc2) -> Ec2MarketSource {
            Ec2MarketSource {
                api: Arc::new(api) as Arc<dyn Ec2Api>,
                region: "us-east-1".into(),
                on_demand: Arc::new(on_demand()),
            }
        }

        fn fake() -> FakeEc2 {
            FakeEc2::new()
                .with_prices(history())
                .with_instance_types(vec![p3_type()])
        }

        /// Decides until the background fetch has landed (or a few seconds passed).
        async fn settled(planner: &BidBrainPlanner, job: &TrainingJob) -> CapacityDecision {
            for _ in 0..500 {
                let decision = decide(planner, job, &[], NOW);
                if decision.reason != "MarketLoading" {
                    return decision;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            panic!("the ec2 market never loaded");
        }

        #[test]
        fn price_history_becomes_a_market_decided_at_wall_time() {
            let job = ec2_job(&["p3.2xlarge"]);
            let od = on_demand();
            let setup =
                setup_ec2_market(&job, &history(), &[p3_type()], settings(&od), now()).unwrap();
            assert_eq!(setup.grid.pools.len(), 3);
            assert_eq!(
                setup.grid.t0,
                now(),
                "the grid holds the prices in force now"
            );
            assert_eq!(setup.reliable.usd_hr, 3.06);
            assert_eq!(setup.reliable.vcpus, 8.0);
            let (alive, launched, noticed) = (BTreeMap::new(), BTreeMap::new(), BTreeSet::new());
            let view = CapacityView {
                job: &job,
                alive: &alive,
                launched: &launched,
                bids: &BTreeMap::new(),
                pools_under_notice: &noticed,
                failed: &BTreeMap::new(),
                unplaceable: &BTreeSet::new(),
                coordinator: None,
                now: "2026-11-23T10:04:00Z".parse().unwrap(),
            };
            let decision = decide_on(&setup, MarketClock::Wall, &view, &app_model(&job));
            assert_eq!(decision.reason, "BidBrain", "{decision:?}");
            assert!((1..=4).contains(&decision.total()), "{decision:?}");
            for (pool, bid) in &decision.max_prices {
                assert!(ZONES.contains(&pool.0.zone.as_str()), "{pool:?}");
                assert!(*bid > 0.0 && *bid <= 3.06 + 1e-9, "bid {bid}");
            }
            let e = decision.expected_cost_per_work.expect("E");
            assert!(e.is_finite() && e > 0.0);
        }

        #[test]
        fn bad_live_input_is_a_typed_error() {
            let od = on_demand();
            // a type the on-demand list does not price: named, with the region
            let mut points = history();
            points[0].instance_type = "zz9.huge".into();
            let job = ec2_job(&["p3.2xlarge", "zz9.huge"]);
            let err = setup_ec2_market(&job, &points, &[], settings(&od), now()).unwrap_err();
            assert!(
                matches!(&err, LiveMarketError::UnknownOnDemand { instance_type, .. } if instance_type == "zz9.huge"),
                "{err}"
            );
            // no history, or none in the job's zones
            let job = ec2_job(&["p3.2xlarge"]);
            let err = setup_ec2_market(&job, &[], &[], settings(&od), now()).unwrap_err();
            assert!(matches!(err, LiveMarketError::EmptyHistory { .. }), "{err}");
            let mut elsewhere = job.clone();
            elsewhere.spec.transient.zones = vec!["us-east-1f".into()];
            let err =
                setup_ec2_market(&elsewhere, &history(), &[], settings(&od), now()).unwrap_err();
            assert!(matches!(err, LiveMarketError::EmptyHistory { .. }), "{err}");
            // a region the list does not price
            let mut west = job.clone();
            west.spec.bidding.market.region = Some("eu-west-1".into());
            let err = setup_ec2_market(&west, &history(), &[], settings(&od), now()).unwrap_err();
            assert!(err.to_string().contains("eu-west-1"), "{err}");
        }

        #[tokio::test]
        async fn the_planner_loads_in_the_background_then_bids() {
            let planner = planner().with_ec2(source(fake()));
            let job = ec2_job(&["p3.2xlarge"]);
            let first = decide(&planner, &job, &[], NOW);
            assert_eq!(first.reason, "MarketLoading");
            assert_eq!(first.total(), 4, "the spec's maxNodes while loading");
            let decision = settled(&planner, &job).await;
            assert_eq!(decision.reason, "BidBrain", "{decision:?}");
            assert!(decision.expected_cost_per_work.is_some_and(f64::is_finite));
            for pool in decision.transient.keys() {
                assert_eq!(pool.0.capacity_type, CapacityType::Spot);
            }
        }

        #[tokio::test]
        async fn live_markets_no_decision_uses_are_dropped() {
            let planner = BidBrainPlanner::new(BidBrainConfig {
                trace_dir: spot_data(),
                calibration_idle: Duration::ZERO,
                ..BidBrainConfig::default()
            })
            .with_ec2(source(fake()));
            let a = ec2_job(&["p3.2xlarge"]);
            let mut b = ec2_job(&["p3.2xlarge"]);
            b.spec.transient.zones = vec!["us-east-1a".into()];
            settled(&planner, &a).await;
            settled(&planner, &b).await;
            // a's market, idle since b's loaded, went; b's is kept while in use
            let keys: Vec<String> = planner.live.lock().keys().cloned().collect();
            assert_eq!(keys, [market_key(&b)]);
        }

        #[tokio::test]
        async fn a_failed_fetch_is_market_unavailable_until_a_retry() {
            let api = fake();
            api.fail_next(
                Operation::DescribeSpotPriceHistory,
                FakeEc2::api_error(
                    Operation::DescribeSpotPriceHistory,
                    "RequestLimitExceeded",
                    503,
                ),
            );
            let planner = BidBrainPlanner::new(BidBrainConfig {
                retry_failed_after: Duration::from_millis(50),
                ..BidBrainConfig::default()
            })
            .with_ec2(source(api));
            let job = ec2_job(&["p3.2xlarge"]);
            let failed = settled(&planner, &job).await;
            assert_eq!(failed.reason, "MarketUnavailable");
            assert_eq!(failed.total(), 4);
            tokio::time::sleep(Duration::from_millis(60)).await;
            let mut decision = decide(&planner, &job, &[], NOW);
            for _ in 0..500 {
                if decision.reason != "MarketUnavailable" {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
                decision = decide(&planner, &job, &[], NOW);
            }
            assert_eq!(decision.reason, "BidBrain", "the retry succeeds");

            // an unpriced type and another region than the client's stay unavailable
            let unknown = ec2_job(&["p3.2xlarge", "zz9.huge"]);
            let mut points = history();
            points[0].instance_type = "zz9.huge".into();
            let planner = planner_with(FakeEc2::new().with_prices(points));
            assert_eq!(
                settled(&planner, &unknown).await.reason,
                "MarketUnavailable"
            );
            let mut west = ec2_job(&["p3.2xlarge"]);
            west.spec.bidding.market.region = Some("us-west-2".into());
            let planner = planner_with(fake());
            assert_eq!(settled(&planner, &west).await.reason, "MarketUnavailable");
        }

        fn planner_with(api: FakeEc2) -> BidBrainPlanner {
            planner().with_ec2(source(api))
        }

        #[test]
        fn gcp_and_ec2_without_a_client_have_no_market_view() {
            let with_client = planner_with(fake());
            let mut gcp = ec2_job(&["p3.2xlarge"]);
            gcp.spec.bidding.market.kind = MarketKind::Gcp;
            assert_eq!(decide(&with_client, &gcp, &[], NOW).reason, "NoMarketView");
            let ec2 = ec2_job(&["p3.2xlarge"]);
            assert_eq!(decide(&planner(), &ec2, &[], NOW).reason, "NoMarketView");
        }
    }

    #[test]
    fn trace_time_follows_wall_time_since_creation() {
        let job = job(0, 4);
        let setup = setup_market(&job, &spot_data()).unwrap();
        // a day later at 60x: 60 trace days later, past the trace's end → the last slot
        let alive = BTreeMap::new();
        let launched = BTreeMap::new();
        let noticed = BTreeSet::new();
        let failed = BTreeMap::new();
        let bids = BTreeMap::new();
        let view = |now: &str| CapacityView {
            job: &job,
            alive: &alive,
            launched: &launched,
            bids: &bids,
            pools_under_notice: &noticed,
            failed: &failed,
            unplaceable: &noticed,
            coordinator: None,
            now: now.parse().unwrap(),
        };
        let at_start = decide_on(
            &setup,
            MarketClock::Replay { speed: 1.0 },
            &view("2026-11-23T10:00:00Z"),
            &app_model(&job),
        );
        let at_end = decide_on(
            &setup,
            MarketClock::Replay { speed: 60.0 },
            &view("2026-11-24T10:00:00Z"),
            &app_model(&job),
        );
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
