//! BidBrain (seed 003, §4.3): the half of ebbflow that decides what capacity to buy.
//!
//! - [`market`]: pools, spot price and availability over time, on-demand prices and sizes, read
//!   from trace files ([`market::trace`]) or appended by a live source (the operator's EC2 market);
//! - [`billing`]: what an allocation costs under a provider's billing model;
//! - [`eviction`]: the probability that a spot allocation is taken back, fitted to the market;
//! - [`bidder`]: the expected cost per unit of work of every candidate allocation and the choice,
//!   with the application model and its calibration from measured throughput;
//! - [`sim`]: the simulator behind `ebbflow simulate`, the market grid the replays step on, and the
//!   hindsight-optimal schedule it is scored against.
//!
//! Nothing here knows Kubernetes or the training runtime: the operator (crate `ebbflow-operator`)
//! feeds it markets and measurements and applies its allocations, so the bidder can be read, tested
//! and benchmarked on its own.

pub mod bidder;
pub mod billing;
pub mod eviction;
pub mod market;
pub mod sim;

/// Shared by the unit tests.
#[cfg(test)]
pub(crate) mod test_data {
    /// The shared spot data directory: `EBBFLOW_SPOT_DATA`, else `../shared/data/spot` beside
    /// the repository.
    pub fn spot_data() -> std::path::PathBuf {
        std::env::var_os("EBBFLOW_SPOT_DATA").map_or_else(
            || std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/data/spot"),
            std::path::PathBuf::from,
        )
    }
}
