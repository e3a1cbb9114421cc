//! A job's market, read from its manifest: the trace replay its spec names (pools filtered to the
//! job's instance types and zones), the eviction model fitted on the trace before the job's
//! start, the billing model, the reliable tier and the bidder's settings.
//!
//! One function for `ebbflow run` (which replays it on an accelerated clock) and the operator's
//! BidBrain capacity planner (which maps wall time since the job's creation onto it), so both
//! see the same pools, prices and eviction model for the same manifest.

use std::path::{Path, PathBuf};

use ebbflow_crds::TrainingJob;

use crate::bidder::{AppModel, BidderConfig, ReliableTier};
use crate::billing::BillingModel;
use crate::eviction::{EvictionConfig, EvictionModel};
use crate::sim::grid::MarketGrid;

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
    let bidding = &job.spec.bidding;
    let market_spec = &bidding.market;
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
    let (mut market, _) = crate::sim::cli::load_market(&path, None, None, None)
        .map_err(|e| trace_error(e.to_string()))?;
    let transient = &job.spec.transient;
    market.pools.retain(|pool| {
        (transient.instance_types.is_empty()
            || transient
                .instance_types
                .contains(&pool.info.id.instance_type))
            && (transient.zones.is_empty() || transient.zones.contains(&pool.info.id.zone))
    });
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
    let billing: BillingModel = bidding
        .billing_model
        .as_str()
        .parse()
        .map_err(|e: crate::billing::BillingError| JobMarketError::Unsupported(e.to_string()))?;
    // The reliable tier: the cheapest on-demand price per vCPU (or the manifest's price).
    let reference = crate::sim::reference_pool(&grid)
        .ok_or_else(|| trace_error("no pool has an on-demand price".into()))?;
    let reliable = ReliableTier {
        count: job.spec.reliable.count,
        vcpus: grid.pools[reference].vcpus,
        usd_hr: market_spec
            .on_demand_price
            .or(grid.pools[reference].on_demand_usd_hr)
            .unwrap_or(0.0),
    };
    Ok(MarketSetup {
        grid,
        model,
        start_slot,
        reliable,
        billing,
    })
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

/// The bidder's settings from the spec: decision interval, most transient nodes, max price cap.
pub fn bidder_config(job: &TrainingJob) -> BidderConfig {
    let spec = &job.spec;
    BidderConfig {
        interval_seconds: spec
            .bidding
            .decision_interval
            .to_duration()
            .map_or(120, |d| d.as_secs().max(1) as i64),
        max_transient: spec.transient.max_nodes,
        max_price_cap: spec.bidding.max_price,
        ..BidderConfig::default()
    }
}
