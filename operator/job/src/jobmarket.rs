//! A job's market, read from its manifest: the trace replay its spec names (pools filtered to the
//! job's instance types and zones), the eviction model fitted on the trace before the job's
//! start, the billing model, the reliable tier and the bidder's settings. For the live `ec2`
//! market the same setup comes from EC2's spot price history ([`setup_ec2_market`],
//! [`fetch_ec2_setup`]).
//!
//! One function for `ebbflow run` (which replays it on an accelerated clock) and the operator's
//! BidBrain capacity planner (which maps wall time since the job's creation onto it), so both
//! see the same pools, prices and eviction model for the same manifest.

use std::path::{Path, PathBuf};
use std::time::Duration;

use ebbflow_crds::TrainingJob;
use ebbflow_ec2::{Ec2Api, InstanceTypeInfo, SpotPricePoint, SpotPriceQuery};

use crate::live_market::{self as live, LiveMarketError, LiveWindow, OnDemandPrices};
use ebbflow_bidbrain::bidder::{AppModel, BidderConfig, ReliableTier, ThroughputTable};
use ebbflow_bidbrain::billing::{BillingError, BillingModel};
use ebbflow_bidbrain::eviction::{EvictionConfig, EvictionModel};
use ebbflow_bidbrain::market::{Market, Timestamp};
use ebbflow_bidbrain::sim::grid::MarketGrid;

/// Why a job's market could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum JobMarketError {
    /// The job's market is not a trace (or names none).
    #[error("{0}")]
    Unsupported(String),
    /// The trace could not be loaded or used.
    #[error("market trace {path}: {reason}")]
    LoadTrace {
        /// The trace.
        path: String,
        /// Why.
        reason: String,
    },
}

/// The market side of a job: the grid, the fitted eviction model and where the replay starts.
#[derive(Debug)]
pub struct MarketSetup {
    /// Prices and availability per pool on a regular grid.
    pub grid: MarketGrid,
    /// β and expected uptime per pool, fitted on the trace before `start_slot`.
    pub model: EvictionModel,
    /// The grid slot the job starts at.
    pub start_slot: usize,
    /// The reliable tier (count from the spec, price from the market or the spec).
    pub reliable: ReliableTier,
    /// How instances are charged.
    pub billing: BillingModel,
}

/// Where a job's trace file is: a relative path resolves against the working directory, then
/// against `base_dir` (the manifest's directory for `ebbflow run`).
pub fn trace_path(job: &TrainingJob, base_dir: &Path) -> Result<PathBuf, JobMarketError> {
    let market_spec = &job.spec.bidding.market;
    let trace = market_spec.trace.as_deref().ok_or_else(|| {
        JobMarketError::Unsupported(format!(
            "spec.bidding.market: replaying needs a trace; set market.kind: trace and market.trace (got kind {} without a trace)",
            market_spec.kind.as_str()
        ))
    })?;
    let mut path = PathBuf::from(trace);
    if path.is_relative() && !path.exists() {
        path = base_dir.join(trace);
    }
    Ok(path)
}

/// Loads the trace `job` names and fits its eviction model (see the module docs).
pub fn setup_market(job: &TrainingJob, base_dir: &Path) -> Result<MarketSetup, JobMarketError> {
    let market_spec = &job.spec.bidding.market;
    let path = trace_path(job, base_dir)?;
    let trace_error = |reason: String| JobMarketError::LoadTrace {
        path: path.display().to_string(),
        reason,
    };
    if !path.is_file() {
        return Err(trace_error(
            "no such file (relative paths resolve against the working directory, then the manifest's)".into(),
        ));
    }
    let (mut market, _, notes) = ebbflow_bidbrain::sim::cli::load_market(&path, None, None, None)
        .map_err(|e| trace_error(e.to_string()))?;
    for note in notes {
        tracing::info!(trace = %path.display(), "{note}");
    }
    retain_job_pools(&mut market, job);
    if market.pools.is_empty() {
        return Err(trace_error(
            "no pool of the trace matches spec.transient.instanceTypes and zones".into(),
        ));
    }
    let (first, last) = market.span().map_err(|e| trace_error(e.to_string()))?;
    let start = market_spec
        .trace_start
        .as_ref()
        .map(|t| t.0.as_second())
        .unwrap_or(first + (last - first) * 3 / 10);
    if start < first || start >= last {
        return Err(trace_error(format!(
            "spec.bidding.market.traceStart is outside the trace ({first}..{last} unix seconds)"
        )));
    }
    // The eviction model learns from the trace before the job starts (never from its future).
    let training = market.slice(first, start.max(first + 1));
    let model = EvictionModel::fit(&training, EvictionConfig::default())
        .map_err(|e| trace_error(format!("fitting the eviction model: {e}")))?;
    let step = MarketGrid::step_for(&market);
    let grid = MarketGrid::new(&market, step).map_err(|e| trace_error(e.to_string()))?;
    let start_slot = ((start - grid.t0) / grid.step).max(0) as usize;
    let billing = billing_model(job).map_err(|e| JobMarketError::Unsupported(e.to_string()))?;
    let reliable = reliable_tier(job, &grid)
        .ok_or_else(|| trace_error("no pool has an on-demand price".into()))?;
    Ok(MarketSetup {
        grid,
        model,
        start_slot,
        reliable,
        billing,
    })
}

/// Keeps the pools of `market` among the job's instance types and zones (empty: all).
fn retain_job_pools(market: &mut Market, job: &TrainingJob) {
    let transient = &job.spec.transient;
    market.pools.retain(|pool| {
        (transient.instance_types.is_empty()
            || transient
                .instance_types
                .contains(&pool.info.id.instance_type))
            && (transient.zones.is_empty() || transient.zones.contains(&pool.info.id.zone))
    });
}

/// The job's billing model.
fn billing_model(job: &TrainingJob) -> Result<BillingModel, BillingError> {
    job.spec.bidding.billing_model.as_str().parse()
}

/// The reliable tier: the spec's count on the pool with the cheapest on-demand price per vCPU,
/// at that price or the manifest's `market.onDemandPrice`; `None` when no pool has one.
fn reliable_tier(job: &TrainingJob, grid: &MarketGrid) -> Option<ReliableTier> {
    let reference = ebbflow_bidbrain::sim::reference_pool(grid)?;
    Some(ReliableTier {
        count: job.spec.reliable.count,
        vcpus: grid.pools[reference].vcpus,
        usd_hr: job
            .spec
            .bidding
            .market
            .on_demand_price
            .or(grid.pools[reference].on_demand_usd_hr)
            .unwrap_or(0.0),
    })
}

/// How a live market is read: the lookback of its price history and what prices on-demand
/// capacity.
#[derive(Clone, Copy, Debug)]
pub struct LiveSettings<'a> {
    /// On-demand prices per region and type (EC2 serves none).
    pub on_demand: &'a OnDemandPrices,
    /// How much price history the eviction model learns from.
    pub lookback: Duration,
}

/// The market side of a job on the live EC2 market at `now` (pure): the pools of `points`
/// (its spot price history, see [`live::ec2_market`]) among the job's types and zones, the
/// eviction model fitted on the whole history (price crossings; EC2 has no availability
/// data), and a one-slot grid holding the prices in force at `now` (`start_slot` 0).
pub fn setup_ec2_market(
    job: &TrainingJob,
    points: &[SpotPricePoint],
    types: &[InstanceTypeInfo],
    settings: LiveSettings<'_>,
    now: Timestamp,
) -> Result<MarketSetup, LiveMarketError> {
    let region = ec2_region(job)?;
    let setup_error = |reason: String| LiveMarketError::Setup {
        region: region.to_owned(),
        reason,
    };
    let window = LiveWindow {
        region,
        now,
        lookback_seconds: settings.lookback.as_secs() as i64,
        drop_unpriced: job.spec.transient.instance_types.is_empty(),
    };
    let mut market = live::ec2_market(points, types, settings.on_demand, window)?;
    retain_job_pools(&mut market, job);
    if market.pools.is_empty() {
        return Err(LiveMarketError::EmptyHistory {
            region: region.to_owned(),
        });
    }
    let model = EvictionModel::fit(&market, EvictionConfig::default())
        .map_err(|e| setup_error(format!("fitting the eviction model: {e}")))?;
    // every pool has a sample at `now` (live::ec2_market carries prices forward)
    let grid =
        MarketGrid::new(&market.slice(now, now + 1), 60).map_err(|e| setup_error(e.to_string()))?;
    let billing = billing_model(job).map_err(|e| setup_error(e.to_string()))?;
    let reliable = reliable_tier(job, &grid)
        .ok_or_else(|| setup_error("no pool has an on-demand price".into()))?;
    Ok(MarketSetup {
        grid,
        model,
        start_slot: 0,
        reliable,
        billing,
    })
}

/// The region of the job's ec2 market.
fn ec2_region(job: &TrainingJob) -> Result<&str, LiveMarketError> {
    job.spec.bidding.market.region.as_deref().ok_or_else(|| {
        LiveMarketError::Region("spec.bidding.market.region is required for an ec2 market".into())
    })
}

/// Reads the job's spot price history (the last `settings.lookback` before `now`) and instance
/// sizes through `api`, a client of `api_region`, and sets up its market with
/// [`setup_ec2_market`] on a blocking thread.
pub async fn fetch_ec2_setup(
    api: &dyn Ec2Api,
    api_region: &str,
    job: &TrainingJob,
    settings: LiveSettings<'_>,
    now: Timestamp,
) -> Result<MarketSetup, LiveMarketError> {
    let region = ec2_region(job)?;
    if region != api_region {
        return Err(LiveMarketError::Region(format!(
            "the job's market is in {region} but the operator's EC2 client is for {api_region} (--ec2-region)"
        )));
    }
    let api_error = |source| LiveMarketError::Api {
        region: region.to_owned(),
        source,
    };
    let transient = &job.spec.transient;
    let start = chrono::DateTime::from_timestamp(now - settings.lookback.as_secs() as i64, 0);
    let query = SpotPriceQuery {
        instance_types: transient.instance_types.clone(),
        zones: transient.zones.clone(),
        start,
        end: chrono::DateTime::from_timestamp(now, 0),
        ..SpotPriceQuery::default()
    };
    let points = api.spot_price_history(&query).await.map_err(api_error)?;
    let types = api
        .instance_types(&transient.instance_types)
        .await
        .map_err(api_error)?;
    let job = job.clone();
    let on_demand = settings.on_demand.clone();
    let lookback = settings.lookback;
    tokio::task::spawn_blocking(move || {
        let settings = LiveSettings {
            on_demand: &on_demand,
            lookback,
        };
        setup_ec2_market(&job, &points, &types, settings, now)
    })
    .await
    .map_err(|e| LiveMarketError::Setup {
        region: region.to_owned(),
        reason: format!("setting up the market: {e}"),
    })?
}

/// BidBrain's application terms: the spec's overrides over the defaults.
pub fn app_model(job: &TrainingJob) -> AppModel {
    let defaults = AppModel::default();
    let overrides = job.spec.bidding.overrides.clone().unwrap_or_default();
    AppModel {
        nu_per_vcpu_second: overrides.nu.unwrap_or(defaults.nu_per_vcpu_second),
        phi: overrides.phi.unwrap_or(defaults.phi),
        sigma_seconds: overrides.sigma.unwrap_or(defaults.sigma_seconds),
        lambda_seconds: overrides.lambda.unwrap_or(defaults.lambda_seconds),
        stage3_ratio: job.spec.elasticity.stage3_ratio,
    }
}

/// The spec's measured throughput table (`bidding.overrides.throughput`), if it has one; an
/// error names what is wrong with it.
pub fn throughput_table(job: &TrainingJob) -> Result<Option<ThroughputTable>, String> {
    let Some(points) = job
        .spec
        .bidding
        .overrides
        .as_ref()
        .and_then(|o| o.throughput.as_ref())
    else {
        return Ok(None);
    };
    ThroughputTable::new(points.iter().map(|p| (p.ratio, p.relative)).collect()).map(Some)
}

/// The bidder's settings from the spec: decision interval, most transient nodes, max price cap,
/// the measured throughput table (an invalid one is refused by validation before this runs).
pub fn bidder_config(job: &TrainingJob) -> BidderConfig {
    let spec = &job.spec;
    BidderConfig {
        throughput: throughput_table(job).ok().flatten(),
        interval_seconds: spec
            .bidding
            .decision_interval
            .to_duration()
            .map_or(120, |d| d.as_secs().max(1) as i64),
        max_transient: spec.transient.max_nodes,
        min_transient: spec.transient.min_nodes,
        max_price_cap: spec.bidding.max_price,
        ..BidderConfig::default()
    }
}
/// The status form (`status.appModel`, the jobs dashboard's application-model panels) of
/// `calibrator`'s estimate; `in_use` says whether decisions use it. The operator's and
/// `ebbflow run`'s.
pub fn app_model_status(
    calibrator: &ebbflow_bidbrain::bidder::Calibrator,
    in_use: bool,
) -> ebbflow_crds::AppModelStatus {
    let model = calibrator.model();
    let counts = calibrator.counts();
    ebbflow_crds::AppModelStatus {
        nu: model.nu_per_vcpu_second,
        phi: model.phi,
        sigma_seconds: model.sigma_seconds,
        lambda_seconds: model.lambda_seconds,
        steady_intervals: counts.steady,
        additions: counts.additions,
        evictions: counts.evictions,
        in_use,
    }
}
