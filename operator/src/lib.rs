//! The ebbflow operator: the controller, provisioning, notices, the live EC2 market and the `ebbflow`
//! command line. The bidder, markets, billing and the simulator are crate `ebbflow-bidbrain`.

pub mod controller;
pub mod coordinator;
pub mod http;
pub mod job_metrics;
pub mod jobmarket;
pub mod leader;
pub mod live_market;
pub mod metrics;
pub mod notices;
pub mod provision;
pub mod run;

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
