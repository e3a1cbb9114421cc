//! The seam: what ebbflow needs from EC2, as a dyn-compatible trait.

use std::future::Future;
use std::pin::Pin;

use crate::error::Ec2Error;
use crate::types::{
    Ec2Instance, FleetOutcome, FleetRequest, InstanceTypeInfo, InstanceTypeOffering, LaunchRequest,
    PlacementScore, PlacementScoreQuery, SpotPricePoint, SpotPriceQuery, SpotRequestStatus,
    TerminatedInstance,
};

/// A boxed, sendable future (keeps [`Ec2Api`] usable as `Arc<dyn Ec2Api>`).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Result of an [`Ec2Api`] call.
pub type Ec2Result<T> = Result<T, Ec2Error>;

/// The EC2 operations ebbflow uses. [`crate::SdkEc2`] implements it over `aws-sdk-ec2`;
/// tests of callers can implement it in memory.
pub trait Ec2Api: Send + Sync {
    /// DescribeSpotPriceHistory, every page, sorted by time then zone then instance type.
    fn spot_price_history<'a>(
        &'a self,
        query: &'a SpotPriceQuery,
    ) -> BoxFuture<'a, Ec2Result<Vec<SpotPricePoint>>>;

    /// DescribeInstanceTypes for the given types (all types when empty), sorted by type.
    fn instance_types<'a>(
        &'a self,
        instance_types: &'a [String],
    ) -> BoxFuture<'a, Ec2Result<Vec<InstanceTypeInfo>>>;

    /// DescribeInstanceTypeOfferings per availability zone, filtered by types and zones
    /// (empty means all), sorted.
    fn instance_type_offerings<'a>(
        &'a self,
        instance_types: &'a [String],
        zones: &'a [String],
    ) -> BoxFuture<'a, Ec2Result<Vec<InstanceTypeOffering>>>;

    /// GetSpotPlacementScores. Endpoints without it answer
    /// [`crate::ErrorCategory::Unsupported`]; callers then fall back on price history.
    fn spot_placement_scores<'a>(
        &'a self,
        query: &'a PlacementScoreQuery,
    ) -> BoxFuture<'a, Ec2Result<Vec<PlacementScore>>>;

    /// RunInstances: on-demand, or one-time spot terminated on interruption; tagged.
    fn run_instances<'a>(
        &'a self,
        request: &'a LaunchRequest,
    ) -> BoxFuture<'a, Ec2Result<Vec<Ec2Instance>>>;

    /// CreateFleet of type `instant` over a launch template and candidate pools.
    fn create_instant_fleet<'a>(
        &'a self,
        request: &'a FleetRequest,
    ) -> BoxFuture<'a, Ec2Result<FleetOutcome>>;

    /// DescribeInstances tagged with this job, every page; terminated ones only when asked.
    fn job_instances<'a>(
        &'a self,
        job: &'a str,
        include_terminated: bool,
    ) -> BoxFuture<'a, Ec2Result<Vec<Ec2Instance>>>;

    /// TerminateInstances, idempotent: already-terminated and unknown instances are not errors.
    fn terminate_instances<'a>(
        &'a self,
        instance_ids: &'a [String],
    ) -> BoxFuture<'a, Ec2Result<Vec<TerminatedInstance>>>;

    /// DescribeSpotInstanceRequests for these instances, for interruption detection.
    fn spot_requests<'a>(
        &'a self,
        instance_ids: &'a [String],
    ) -> BoxFuture<'a, Ec2Result<Vec<SpotRequestStatus>>>;
}
