//! The ebbflow operator: controller, bidder, markets, provisioners and the simulator.

pub mod bidder;
pub mod billing;
pub mod controller;
pub mod coordinator;
pub mod eviction;
pub mod http;
pub mod job_metrics;
pub mod jobmarket;
pub mod leader;
pub mod market;
pub mod metrics;
pub mod notices;
pub mod provision;
pub mod run;
pub mod sim;

/// Shared by the unit tests.
#[cfg(test)]
pub(crate) mod test_data {
    /// The shared spot data directory: `EBBFLOW_SPOT_DATA`, else `../shared/data/spot` beside
    /// the repository.
    pub fn spot_data() -> std::path::PathBuf {
        std::env::var_os("EBBFLOW_SPOT_DATA").map_or_else(
            || std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/data/spot"),
            std::path::PathBuf::from,
        )
    }
}
