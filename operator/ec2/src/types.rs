//! Plain request and result types of the seam: no SDK types leak through them.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};

use crate::error::Ec2Error;

/// Tag key naming the TrainingJob an instance belongs to.
pub const TAG_JOB: &str = "ebbflow.dev/job";
/// Tag key naming the tier (`reliable` or `transient`) an instance serves.
pub const TAG_TIER: &str = "ebbflow.dev/tier";
/// Tag key naming the pool (instance type × zone × capacity type) an instance was bought from.
pub const TAG_POOL: &str = "ebbflow.dev/pool";

/// The product description ebbflow trains on.
pub const LINUX_PRODUCT: &str = "Linux/UNIX";

/// A query for spot price history. Empty lists mean "all".
#[derive(Debug, Clone, PartialEq)]
pub struct SpotPriceQuery {
    /// Instance types (`p3.2xlarge`).
    pub instance_types: Vec<String>,
    /// Availability zone names (`us-east-1a`).
    pub zones: Vec<String>,
    /// Product descriptions; defaults to [`LINUX_PRODUCT`].
    pub product_descriptions: Vec<String>,
    /// Start of the window (inclusive). EC2 also returns the price in force at this time.
    pub start: Option<DateTime<Utc>>,
    /// End of the window (inclusive).
    pub end: Option<DateTime<Utc>>,
    /// Page size (EC2 accepts 5..=1000); `None` lets EC2 choose.
    pub page_size: Option<u32>,
}

impl Default for SpotPriceQuery {
    fn default() -> Self {
        Self {
            instance_types: Vec::new(),
            zones: Vec::new(),
            product_descriptions: vec![LINUX_PRODUCT.to_owned()],
            start: None,
            end: None,
            page_size: None,
        }
    }
}

/// One spot price record: the price in force from `timestamp` until the next record.
#[derive(Debug, Clone, PartialEq)]
pub struct SpotPricePoint {
    /// Instance type.
    pub instance_type: String,
    /// Availability zone name.
    pub zone: String,
    /// Product description (`Linux/UNIX`).
    pub product_description: String,
    /// Price in USD per instance-hour.
    pub price_usd_hr: f64,
    /// When this price took effect.
    pub timestamp: DateTime<Utc>,
}

/// Size of an instance type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceTypeInfo {
    /// Instance type.
    pub instance_type: String,
    /// Default vCPU count.
    pub vcpus: u32,
    /// Memory in MiB.
    pub memory_mib: u64,
    /// Number of GPUs (0 when none).
    pub gpus: u32,
    /// Whether the type can be bought as spot.
    pub spot_supported: bool,
}

/// An instance type offered in an availability zone.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct InstanceTypeOffering {
    /// Instance type.
    pub instance_type: String,
    /// Availability zone name.
    pub zone: String,
}

/// A query for spot placement scores.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlacementScoreQuery {
    /// Instance types to place (any of them may be used).
    pub instance_types: Vec<String>,
    /// Number of instances wanted.
    pub target_capacity: u32,
    /// Score single availability zones rather than regions.
    pub single_availability_zone: bool,
    /// Regions to score; empty means all.
    pub regions: Vec<String>,
}

/// A spot placement score (1 = unlikely to succeed, 10 = very likely).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlacementScore {
    /// Region.
    pub region: String,
    /// Availability zone *ID* (`use1-az4`), when scored per zone.
    pub zone_id: Option<String>,
    /// The score, 1..=10.
    pub score: u8,
}

/// The tier an instance serves in the parameter-server runtime.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Tier {
    /// On-demand capacity hosting ParamServs and BackupPSs.
    Reliable,
    /// Spot capacity hosting ActivePSs and workers.
    Transient,
}

impl Tier {
    /// The tag value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Reliable => "reliable",
            Self::Transient => "transient",
        }
    }

    /// Parses a tag value.
    pub fn parse(value: &str) -> Option<Self> {
        match value {
            "reliable" => Some(Self::Reliable),
            "transient" => Some(Self::Transient),
            _ => None,
        }
    }
}

/// The ebbflow tags every launched instance carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobTags {
    /// Job identity (for example `namespace/name` or the job's UID).
    pub job: String,
    /// Tier.
    pub tier: Tier,
    /// Pool name (for example `p3.2xlarge/us-east-1a/spot`).
    pub pool: String,
}

impl JobTags {
    /// The tags as key/value pairs.
    pub fn pairs(&self) -> [(&'static str, &str); 3] {
        [
            (TAG_JOB, self.job.as_str()),
            (TAG_TIER, self.tier.as_str()),
            (TAG_POOL, self.pool.as_str()),
        ]
    }

    /// Reads the ebbflow tags back from an instance's tags, if all are present and valid.
    pub fn from_tags(tags: &BTreeMap<String, String>) -> Option<Self> {
        Some(Self {
            job: tags.get(TAG_JOB)?.clone(),
            tier: Tier::parse(tags.get(TAG_TIER)?)?,
            pool: tags.get(TAG_POOL)?.clone(),
        })
    }

    /// Checks the values fit EC2's tag limits.
    pub fn validate(&self) -> Result<(), Ec2Error> {
        for (field, value) in [("tags.job", &self.job), ("tags.pool", &self.pool)] {
            if value.is_empty() || value.chars().count() > 256 {
                return Err(Ec2Error::InvalidArgument {
                    field,
                    reason: format!("must be 1 to 256 characters, got {}", value.chars().count()),
                });
            }
        }
        Ok(())
    }
}

/// How an instance is paid for.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Capacity {
    /// On-demand.
    OnDemand,
    /// One-time spot request, terminated on interruption.
    Spot {
        /// Maximum price in USD per hour; `None` means the on-demand price (EC2's default).
        max_price_usd_hr: Option<f64>,
    },
}

/// The capacity type an existing instance was bought with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CapacityType {
    /// On-demand.
    OnDemand,
    /// Spot.
    Spot,
}

impl CapacityType {
    /// A stable label (`on-demand`, `spot`), as Karpenter spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::OnDemand => "on-demand",
            Self::Spot => "spot",
        }
    }
}

/// A RunInstances request for `count` identical instances of one pool.
#[derive(Debug, Clone, PartialEq)]
pub struct LaunchRequest {
    /// AMI to boot.
    pub image_id: String,
    /// Instance type.
    pub instance_type: String,
    /// Availability zone; `None` lets EC2 choose (or the subnet decides).
    pub zone: Option<String>,
    /// Subnet to launch into.
    pub subnet_id: Option<String>,
    /// Number of instances wanted; EC2 may launch fewer (at least one) when capacity is short.
    pub count: u32,
    /// On-demand or spot.
    pub capacity: Capacity,
    /// ebbflow tags (job, tier, pool).
    pub tags: JobTags,
    /// Further tags.
    pub extra_tags: BTreeMap<String, String>,
    /// Security groups.
    pub security_group_ids: Vec<String>,
    /// IAM instance profile name.
    pub iam_instance_profile: Option<String>,
    /// Base64-encoded user data.
    pub user_data_base64: Option<String>,
    /// Idempotency token: retrying with the same token never launches twice.
    pub client_token: Option<String>,
}

impl LaunchRequest {
    /// Checks the request before anything is sent.
    pub fn validate(&self) -> Result<(), Ec2Error> {
        self.tags.validate()?;
        non_empty_field("image_id", &self.image_id)?;
        non_empty_field("instance_type", &self.instance_type)?;
        count_field("count", self.count)?;
        if let Capacity::Spot {
            max_price_usd_hr: Some(price),
        } = self.capacity
        {
            format_price("max_price_usd_hr", price)?;
        }
        Ok(())
    }
}

/// A launch template reference for CreateFleet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LaunchTemplateRef {
    /// By ID (`lt-…`).
    Id(String),
    /// By name.
    Name(String),
}

/// One pool a fleet may draw from.
#[derive(Debug, Clone, PartialEq)]
pub struct FleetPool {
    /// Instance type.
    pub instance_type: String,
    /// Availability zone.
    pub zone: Option<String>,
    /// Subnet.
    pub subnet_id: Option<String>,
    /// Spot maximum price in USD per hour.
    pub max_price_usd_hr: Option<f64>,
}

/// A CreateFleet request of type `instant`.
#[derive(Debug, Clone, PartialEq)]
pub struct FleetRequest {
    /// Launch template supplying the AMI and the rest.
    pub launch_template: LaunchTemplateRef,
    /// Template version; `None` means `$Default`.
    pub launch_template_version: Option<String>,
    /// Candidate pools.
    pub pools: Vec<FleetPool>,
    /// Spot instances wanted.
    pub spot_count: u32,
    /// On-demand instances wanted.
    pub on_demand_count: u32,
    /// ebbflow tags.
    pub tags: JobTags,
    /// Idempotency token.
    pub client_token: Option<String>,
}

impl FleetRequest {
    /// Checks the request before anything is sent.
    pub fn validate(&self) -> Result<(), Ec2Error> {
        self.tags.validate()?;
        if self.pools.is_empty() {
            return Err(Ec2Error::InvalidArgument {
                field: "pools",
                reason: "at least one pool is needed".into(),
            });
        }
        for pool in &self.pools {
            non_empty_field("pools.instance_type", &pool.instance_type)?;
            if let Some(price) = pool.max_price_usd_hr {
                format_price("pools.max_price_usd_hr", price)?;
            }
        }
        count_field(
            "spot_count + on_demand_count",
            self.spot_count.saturating_add(self.on_demand_count),
        )?;
        Ok(())
    }
}

fn non_empty_field(field: &'static str, value: &str) -> Result<(), Ec2Error> {
    if value.is_empty() {
        return Err(Ec2Error::InvalidArgument {
            field,
            reason: "must not be empty".into(),
        });
    }
    Ok(())
}

/// Counts go to EC2 as 32-bit signed integers.
fn count_field(field: &'static str, value: u32) -> Result<i32, Ec2Error> {
    i32::try_from(value)
        .ok()
        .filter(|v| *v > 0)
        .ok_or_else(|| Ec2Error::InvalidArgument {
            field,
            reason: format!("must be within 1..={}, got {value}", i32::MAX),
        })
}

/// Instances one CreateFleet call launched, and the pools that failed.
#[derive(Debug, Clone, PartialEq)]
pub struct FleetOutcome {
    /// Fleet ID.
    pub fleet_id: String,
    /// Launched instances.
    pub instances: Vec<FleetInstance>,
    /// Per-pool launch errors.
    pub errors: Vec<FleetLaunchError>,
}

/// An instance a fleet launched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FleetInstance {
    /// Instance ID.
    pub instance_id: String,
    /// Instance type.
    pub instance_type: Option<String>,
    /// Availability zone.
    pub zone: Option<String>,
    /// Spot or on-demand.
    pub capacity_type: CapacityType,
}

/// A pool a fleet could not launch into.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FleetLaunchError {
    /// EC2 error code.
    pub code: String,
    /// EC2 message.
    pub message: String,
    /// Instance type of the pool.
    pub instance_type: Option<String>,
    /// Zone of the pool.
    pub zone: Option<String>,
}

/// Lifecycle state of an instance.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum InstanceState {
    /// Booting.
    Pending,
    /// Running.
    Running,
    /// Being terminated.
    ShuttingDown,
    /// Terminated.
    Terminated,
    /// Stopping.
    Stopping,
    /// Stopped.
    Stopped,
    /// A state this crate does not know.
    Other(String),
}

impl InstanceState {
    /// Parses EC2's state name.
    pub fn parse(name: &str) -> Self {
        match name {
            "pending" => Self::Pending,
            "running" => Self::Running,
            "shutting-down" => Self::ShuttingDown,
            "terminated" => Self::Terminated,
            "stopping" => Self::Stopping,
            "stopped" => Self::Stopped,
            other => Self::Other(other.to_owned()),
        }
    }

    /// True once the instance is gone or going.
    pub fn is_gone(&self) -> bool {
        matches!(self, Self::ShuttingDown | Self::Terminated)
    }
}

/// An EC2 instance as ebbflow sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct Ec2Instance {
    /// Instance ID.
    pub instance_id: String,
    /// Instance type.
    pub instance_type: String,
    /// Availability zone.
    pub zone: Option<String>,
    /// State.
    pub state: InstanceState,
    /// Spot or on-demand.
    pub capacity_type: CapacityType,
    /// Launch time.
    pub launch_time: Option<DateTime<Utc>>,
    /// Private IPv4 address.
    pub private_ip: Option<String>,
    /// Spot request ID, for spot instances.
    pub spot_request_id: Option<String>,
    /// All tags.
    pub tags: BTreeMap<String, String>,
}

impl Ec2Instance {
    /// The ebbflow tags, if present.
    pub fn job_tags(&self) -> Option<JobTags> {
        JobTags::from_tags(&self.tags)
    }
}

/// The outcome of terminating one instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TerminatedInstance {
    /// Instance ID.
    pub instance_id: String,
    /// State before the call; `None` when EC2 no longer knows the instance.
    pub previous_state: Option<InstanceState>,
    /// State after the call; `None` when EC2 no longer knows the instance.
    pub current_state: Option<InstanceState>,
}

/// Status of the spot request behind a spot instance, for interruption detection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpotRequestStatus {
    /// Spot request ID.
    pub request_id: String,
    /// Instance ID, once fulfilled.
    pub instance_id: Option<String>,
    /// Request state (`open`, `active`, `closed`, `cancelled`, `failed`).
    pub state: Option<String>,
    /// Status code (`fulfilled`, `marked-for-termination`, `instance-terminated-by-price`, …).
    pub status_code: Option<String>,
    /// Status message.
    pub status_message: Option<String>,
    /// When the status last changed.
    pub updated: Option<DateTime<Utc>>,
}

impl SpotRequestStatus {
    /// True when EC2 has announced or carried out an interruption of this request's instance.
    pub fn is_interrupted(&self) -> bool {
        self.status_code.as_deref().is_some_and(|code| {
            code == "marked-for-termination"
                || code == "marked-for-stop"
                || code == "marked-for-hibernation"
                || code.starts_with("instance-terminated-by-")
                || code.starts_with("instance-stopped-by-")
        })
    }
}

/// Formats a price as EC2 expects it (shortest exact decimal), after checking it.
pub fn format_price(field: &'static str, price: f64) -> Result<String, Ec2Error> {
    if !price.is_finite() || price <= 0.0 {
        return Err(Ec2Error::InvalidArgument {
            field,
            reason: format!("must be a positive number of USD per hour, got {price}"),
        });
    }
    Ok(price.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_tags_round_trip() {
        let tags = JobTags {
            job: "ml/mf-1".into(),
            tier: Tier::Transient,
            pool: "p3.2xlarge/us-east-1a/spot".into(),
        };
        let map: BTreeMap<String, String> = tags
            .pairs()
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        assert_eq!(JobTags::from_tags(&map), Some(tags.clone()));
        assert!(tags.validate().is_ok());
        let empty = JobTags {
            job: String::new(),
            ..tags
        };
        assert_eq!(
            empty.validate().unwrap_err().category(),
            crate::ErrorCategory::InvalidArgument
        );
    }

    #[test]
    fn prices_are_checked_and_formatted_exactly() {
        assert_eq!(format_price("p", 1.5).unwrap(), "1.5");
        assert_eq!(format_price("p", 0.9183).unwrap(), "0.9183");
        assert!(format_price("p", 0.0).is_err());
        assert!(format_price("p", -1.0).is_err());
        assert!(format_price("p", f64::NAN).is_err());
    }

    #[test]
    fn interruption_codes() {
        let mut status = SpotRequestStatus {
            request_id: "sir-1".into(),
            instance_id: Some("i-1".into()),
            state: Some("active".into()),
            status_code: Some("fulfilled".into()),
            status_message: None,
            updated: None,
        };
        assert!(!status.is_interrupted());
        status.status_code = Some("marked-for-termination".into());
        assert!(status.is_interrupted());
        status.status_code = Some("instance-terminated-by-price".into());
        assert!(status.is_interrupted());
    }
}
