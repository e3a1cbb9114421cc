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
