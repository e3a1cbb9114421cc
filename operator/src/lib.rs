//! The ebbflow operator: the controller, the cluster's side of provisioning, notices and the
//! coordinator client. The bidder, markets, billing and the simulator are crate
//! `ebbflow-bidbrain`; what a TrainingJob needs without a cluster (its market, its provisioning
//! plan, its metrics, its pods' entry point and the `ebbflow` command) is crate `ebbflow-job`.

pub mod controller;
pub mod coordinator;
pub mod http;
pub mod instances;
pub mod leader;
pub mod metrics;
pub mod notices;

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
