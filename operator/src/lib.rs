//! The ebbflow operator: controller, bidder, markets, provisioners and the simulator.

pub mod bidder;
pub mod billing;
pub mod eviction;
pub mod market;
pub mod sim;
