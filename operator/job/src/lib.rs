//! A TrainingJob without a cluster, and the `ebbflow` command.
//!
//! - [`run`]: `ebbflow run`, the whole loop on one machine (the runtime trains the job while
//!   BidBrain buys nodes on a replayed spot trace), `ebbflow node` (one of its instances) and
//!   `ebbflow pod` ([`run::pod`]: what the operator's runtime pods run, configured by the
//!   environment the operator writes).
//! - [`jobmarket`] and [`live_market`]: a job's market and bidder from its spec, over a trace or
//!   live EC2 prices.
//! - [`provision`]: what instances a job should launch and terminate, and carrying that out over
//!   EC2 ([`provision::Ec2Provisioner`]) or `ebbflow run`'s local instances.
//! - [`job_metrics`]: the per-job Prometheus metrics both the operator and `ebbflow run` export.
//!
//! The operator (crate `ebbflow-operator`) builds on this crate; this crate needs no Kubernetes
//! client, so the quickstart's build of `ebbflow` compiles neither kube's client nor the
//! controller.

pub mod job_metrics;
pub mod jobmarket;
pub mod live_market;
pub mod provision;
pub mod run;

/// EC2's spot interruption notice: two minutes from the notice to the instance's end.
pub const EC2_NOTICE: std::time::Duration = std::time::Duration::from_secs(120);
