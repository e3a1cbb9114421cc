//! ebbflow's EC2 seam.
//!
//! [`Ec2Api`] is what the bidder (live market) and the `ec2` provisioner need from EC2: spot
//! price history, instance types and offerings, placement scores, launching tagged spot and
//! on-demand instances, finding and terminating a job's instances. [`SdkEc2`] implements it over
//! `aws-sdk-ec2`; every failure becomes an [`Ec2Error`] with a bounded [`ErrorCategory`] and a
//! [`RetryAdvice`]. [`FakeEc2`] is an in-memory implementation for callers' tests. This crate is alone in depending on the (slow to build) SDK, and only with its `sdk`
//! feature: without it the seam, its types and the fake build in seconds.
//!
//! Integration tests run against a local moto server started by `moto/launch.py`, which
//! serves spot prices from a real trace (see the crate README).

mod api;
mod config;
mod error;
mod fake;
#[cfg(feature = "sdk")]
pub mod moto;
#[cfg(feature = "sdk")]
mod sdk;
mod types;

pub use api::{BoxFuture, Ec2Api, Ec2Result};
pub use config::{Ec2Config, StaticCredentials};
pub use error::{Ec2Error, ErrorCategory, Operation, RetryAdvice, classify_code};
pub use fake::FakeEc2;
#[cfg(feature = "sdk")]
pub use sdk::SdkEc2;
pub use types::{
    Capacity, CapacityType, Ec2Instance, FleetInstance, FleetLaunchError, FleetOutcome, FleetPool,
    FleetRequest, InstanceState, InstanceTypeInfo, InstanceTypeOffering, JobTags, LINUX_PRODUCT,
    LaunchRequest, LaunchTemplateRef, PlacementScore, PlacementScoreQuery, SpotPricePoint,
    SpotPriceQuery, SpotRequestStatus, TAG_JOB, TAG_POOL, TAG_TIER, TerminatedInstance, Tier,
    format_price,
};
