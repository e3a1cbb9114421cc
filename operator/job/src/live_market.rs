//! The live EC2 market: spot price history read through the `ebbflow_ec2` seam, laid out as a
//! [`Market`] the same eviction model and bidder read for traces.
//!
//! EC2 lists a spot price only when it changes and serves no on-demand prices, so
//! - [`ec2_market`] keeps, per pool, the records inside the lookback window plus the one in
//!   force at its start (moved to the start), and carries the latest price to `now`;
//! - on-demand prices come from an [`OnDemandPrices`] list: by default the us-east-1 list
//!   compiled in from `operator/data/` ([`OnDemandPrices::bundled`]). A pool of a type the
//!   list does not price in the job's region is an error naming both, never a zero.
//!
//! Everything here is pure; fetching lives with the caller (`jobmarket::fetch_ec2_setup`).

use std::collections::BTreeMap;
use std::path::Path;

use ebbflow_ec2::{InstanceTypeInfo, SpotPricePoint};

use ebbflow_bidbrain::market::trace::{
    Ec2PriceEntry, TraceError, ec2_price_market, parse_on_demand_by_region,
};
use ebbflow_bidbrain::market::{InstanceSpec, Market, OnDemandTable, Sample, SpecTable, Timestamp};

/// The on-demand price list compiled into the operator (see `operator/data/README.md`).
pub const BUNDLED_ON_DEMAND_CSV: &str = include_str!("../data/aws_on_demand_prices_us-east-1.csv");

/// Name of [`BUNDLED_ON_DEMAND_CSV`] in messages.
pub const BUNDLED_ON_DEMAND_NAME: &str = "bundled aws_on_demand_prices_us-east-1.csv";

/// Why a live EC2 market could not be built.
#[derive(Debug, thiserror::Error)]
pub enum LiveMarketError {
    /// The on-demand price list could not be read or parsed.
    #[error("on-demand price list: {0}")]
    ReadOnDemand(#[from] TraceError),
    /// The on-demand price list has no prices for the region.
    #[error(
        "ec2 market in {region}: the on-demand price list ({list}) has no prices for this region (it has {known}); pass --on-demand-prices with a list for {region}"
    )]
    UnknownRegion {
        /// The job's region.
        region: String,
        /// The list's name.
        list: String,
        /// The regions it does price.
        known: String,
    },
    /// A pool's instance type has no on-demand price in the region.
    #[error(
        "ec2 market in {region}: no on-demand price for instance type {instance_type} in the on-demand price list ({list}); pass --on-demand-prices with its price or drop it from spec.transient.instanceTypes"
    )]
    UnknownOnDemand {
        /// The instance type.
        instance_type: String,
        /// The job's region.
        region: String,
        /// The list's name.
        list: String,
    },
    /// EC2 returned no Linux spot price for the job's types and zones.
    #[error(
        "ec2 market in {region}: no Linux spot price history for spec.transient.instanceTypes in spec.transient.zones"
    )]
    EmptyHistory {
        /// The job's region.
        region: String,
    },
    /// The market has no region, or the operator's EC2 client is for another one.
    #[error("ec2 market: {0}")]
    Region(String),
    /// An EC2 call failed.
    #[error("ec2 market in {region}: {source}")]
    Api {
        /// The region.
        region: String,
        /// The failure.
        source: ebbflow_ec2::Ec2Error,
    },
    /// The prices were read but the market could not be set up (eviction model, grid).
    #[error("ec2 market in {region}: {reason}")]
    Setup {
        /// The region.
        region: String,
        /// What failed.
        reason: String,
    },
}

/// On-demand prices per region and instance type (EC2's API serves none).
#[derive(Clone, Debug, PartialEq)]
pub struct OnDemandPrices {
    /// Where the list came from, for messages.
    pub source: String,
    regions: BTreeMap<String, OnDemandTable>,
}

impl OnDemandPrices {
    /// Parses a list with columns `region,instance_type,on_demand_usd_hr`.
    pub fn parse(source: &str, text: &str) -> Result<Self, LiveMarketError> {
        Ok(Self {
            source: source.to_owned(),
            regions: parse_on_demand_by_region(source, text)?,
        })
    }

    /// The list compiled into the operator (us-east-1).
    pub fn bundled() -> Result<Self, LiveMarketError> {
        Self::parse(BUNDLED_ON_DEMAND_NAME, BUNDLED_ON_DEMAND_CSV)
    }

    /// Reads a list from `path` (same columns as the bundled one).
    pub fn read(path: &Path) -> Result<Self, LiveMarketError> {
        let source = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source_error| TraceError::ReadFile {
            file: source.clone(),
            source: source_error,
        })?;
        Self::parse(&source, &text)
    }

    /// The regions priced, sorted.
    pub fn regions(&self) -> impl Iterator<Item = &str> {
        self.regions.keys().map(String::as_str)
    }

    /// The table of `region`, or [`LiveMarketError::UnknownRegion`].
    pub fn region(&self, region: &str) -> Result<&OnDemandTable, LiveMarketError> {
        self.regions
            .get(region)
            .ok_or_else(|| LiveMarketError::UnknownRegion {
                region: region.to_owned(),
                list: self.source.clone(),
                known: self.regions().collect::<Vec<_>>().join(", "),
            })
    }
}

/// What [`ec2_market`] reads besides the records.
#[derive(Clone, Copy, Debug)]
pub struct LiveWindow<'a> {
    /// The region the records are from.
    pub region: &'a str,
    /// Now (the market ends here; later records are ignored).
    pub now: Timestamp,
    /// How far back the history goes, in seconds.
    pub lookback_seconds: i64,
    /// Drop pools whose type has no on-demand price instead of failing (for jobs that list no
    /// instance types and so take every type the market offers).
    pub drop_unpriced: bool,
}

/// The records that describe `[now - lookback, now]`: per pool, those inside the window plus
/// the latest one before it, moved to the window's start (EC2 returns the price in force at
/// the window's start with the time it took effect, possibly long before).
fn in_window(points: &[SpotPricePoint], start: Timestamp, now: Timestamp) -> Vec<Ec2PriceEntry> {
    let mut pools: BTreeMap<(&str, &str), Vec<Ec2PriceEntry>> = BTreeMap::new();
    for point in points {
        let at = point.timestamp.timestamp();
        if at > now {
            continue;
        }
        pools
            .entry((&point.instance_type, &point.zone))
            .or_default()
            .push(Ec2PriceEntry {
                availability_zone: point.zone.clone(),
                instance_type: point.instance_type.clone(),
                product_description: Some(point.product_description.clone()),
                spot_price: point.price_usd_hr,
                timestamp: at,
            });
    }
    let mut out = Vec::new();
    for mut entries in pools.into_values() {
        entries.sort_by_key(|e| e.timestamp);
        let inside = entries.partition_point(|e| e.timestamp < start);
        if let Some(in_force) = inside.checked_sub(1).map(|i| &entries[i])
            && entries.get(inside).is_none_or(|e| e.timestamp > start)
        {
            out.push(Ec2PriceEntry {
                timestamp: start,
                ..in_force.clone()
            });
        }
        out.extend(entries.drain(inside..));
    }
    out
}

/// Instance sizes from DescribeInstanceTypes.
fn spec_table(types: &[InstanceTypeInfo]) -> SpecTable {
    let mut specs: Vec<(String, InstanceSpec)> = types
        .iter()
        .filter(|t| t.vcpus > 0)
        .map(|t| {
            (
                t.instance_type.clone(),
                InstanceSpec {
                    vcpus: f64::from(t.vcpus),
                    memory_gib: t.memory_mib as f64 / 1024.0,
                },
            )
        })
        .collect();
    specs.sort_by(|a, b| a.0.cmp(&b.0));
    specs.dedup_by(|a, b| a.0 == b.0);
    SpecTable { specs }
}

/// The live market of `points` (spot price history, any order) over `window`: one spot pool
/// per instance type and zone, priced until `now`, with on-demand prices from `on_demand` and
/// vCPUs from `types` (1 where a type is not listed). Pure.
pub fn ec2_market(
    points: &[SpotPricePoint],
    types: &[InstanceTypeInfo],
    on_demand: &OnDemandPrices,
    window: LiveWindow<'_>,
) -> Result<Market, LiveMarketError> {
    let region = window.region;
    let table = on_demand.region(region)?;
    let start = window.now - window.lookback_seconds.max(0);
    let source = format!("ec2 {region}");
    let empty = || LiveMarketError::EmptyHistory {
        region: region.to_owned(),
    };
    let mut market = match ec2_price_market(&source, in_window(points, start, window.now)) {
        Ok(market) => market,
        Err(TraceError::ReadEmpty { .. }) => return Err(empty()),
        Err(error) => return Err(error.into()),
    };
    if window.drop_unpriced {
        market
            .pools
            .retain(|pool| table.price(&pool.info.id.instance_type).is_some());
    }
    if let Some(pool) = market
        .pools
        .iter()
        .find(|pool| table.price(&pool.info.id.instance_type).is_none())
    {
        return Err(LiveMarketError::UnknownOnDemand {
            instance_type: pool.info.id.instance_type.clone(),
            region: region.to_owned(),
            list: on_demand.source.clone(),
        });
    }
    if market.pools.is_empty() {
        return Err(empty());
    }
    // A price holds until the next change: carry each pool's latest price to now.
    for pool in &mut market.pools {
        if let Some(last) = pool.samples.last().copied()
            && last.at < window.now
        {
            pool.samples.push(Sample {
                at: window.now,
                ..last
            });
        }
    }
    market
        .complete(std::slice::from_ref(table), Some(&spec_table(types)))
        .map_err(|e| LiveMarketError::Setup {
            region: region.to_owned(),
            reason: e.to_string(),
        })?;
    Ok(market)
}

#[cfg(test)]
mod tests {
    use chrono::{DateTime, Utc};

    use super::*;

    const NOW: Timestamp = 1_700_000_000;
    const DAY: i64 = 86_400;

    fn point(instance_type: &str, zone: &str, at: Timestamp, price: f64) -> SpotPricePoint {
        SpotPricePoint {
            instance_type: instance_type.into(),
            zone: zone.into(),
            product_description: ebbflow_ec2::LINUX_PRODUCT.into(),
            price_usd_hr: price,
            timestamp: DateTime::<Utc>::from_timestamp(at, 0).unwrap(),
        }
    }

    fn window(lookback_days: i64) -> LiveWindow<'static> {
        LiveWindow {
            region: "us-east-1",
            now: NOW,
            lookback_seconds: lookback_days * DAY,
            drop_unpriced: false,
        }
    }

    fn bundled() -> OnDemandPrices {
        OnDemandPrices::bundled().expect("the bundled list parses")
    }

    #[test]
    fn bundled_list_prices_us_east_1() {
        let list = bundled();
        assert_eq!(list.regions().collect::<Vec<_>>(), ["us-east-1"]);
        let table = list.region("us-east-1").unwrap();
        assert!(table.prices.len() > 1000);
        assert_eq!(table.price("p3.2xlarge"), Some(3.06));
        assert_eq!(table.price("m5.large"), Some(0.096));
        let err = list.region("eu-west-1").unwrap_err().to_string();
        assert!(
            err.contains("eu-west-1") && err.contains("us-east-1"),
            "{err}"
        );
    }

    #[test]
    fn a_list_of_another_shape_or_with_a_zero_price_is_refused() {
        let err = OnDemandPrices::parse("od.csv", "instance_type,price\nm5.large,0.096\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("od.csv"), "{err}");
        let zero = "region,instance_type,on_demand_usd_hr\nus-east-1,m5.large,0\n";
        let err = OnDemandPrices::parse("od.csv", zero)
            .unwrap_err()
            .to_string();
        assert!(err.contains("line 2") && err.contains("positive"), "{err}");
    }

    #[test]
    fn the_window_starts_with_the_price_in_force_and_ends_now() {
        let points = [
            point("m5.large", "us-east-1a", NOW - 400 * DAY, 0.050),
            point("m5.large", "us-east-1a", NOW - 30 * DAY, 0.040),
            point("m5.large", "us-east-1a", NOW - DAY, 0.045),
            point("m5.large", "us-east-1a", NOW + 60, 0.099),
            point("p3.2xlarge", "us-east-1b", NOW - 200 * DAY, 0.918),
        ];
        let market = ec2_market(&points, &[], &bundled(), window(7)).unwrap();
        assert_eq!(market.pools.len(), 2);
        let m5 = &market.pools[0];
        assert_eq!(m5.info.id.instance_type, "m5.large");
        assert_eq!(m5.info.on_demand_usd_hr, Some(0.096));
        let samples: Vec<(Timestamp, Option<f64>)> =
            m5.samples.iter().map(|s| (s.at, s.price)).collect();
        assert_eq!(
            samples,
            [
                (NOW - 7 * DAY, Some(0.040)),
                (NOW - DAY, Some(0.045)),
                (NOW, Some(0.045))
            ],
            "in force at the start, the changes inside, carried to now; the future ignored"
        );
        let p3 = &market.pools[1];
        assert_eq!(p3.samples.len(), 2);
        assert_eq!(p3.info.on_demand_usd_hr, Some(3.06));
        assert_eq!(market.view_at(NOW).quotes[1].buyable_price(), Some(0.918));
    }

    #[test]
    fn vcpus_come_from_describe_instance_types() {
        let points = [point("m5.large", "us-east-1a", NOW - DAY, 0.04)];
        let types = [InstanceTypeInfo {
            instance_type: "m5.large".into(),
            vcpus: 2,
            memory_mib: 8192,
            gpus: 0,
            spot_supported: true,
        }];
        let market = ec2_market(&points, &types, &bundled(), window(7)).unwrap();
        assert_eq!(market.pools[0].info.vcpus, 2.0);
        assert_eq!(market.pools[0].info.memory_gib, Some(8.0));
    }

    #[test]
    fn an_unpriced_type_is_an_error_naming_type_and_region_unless_dropped() {
        let points = [
            point("m5.large", "us-east-1a", NOW - DAY, 0.04),
            point("zz9.huge", "us-east-1a", NOW - DAY, 1.0),
        ];
        let err = ec2_market(&points, &[], &bundled(), window(7)).unwrap_err();
        assert!(
            matches!(&err, LiveMarketError::UnknownOnDemand { instance_type, region, .. }
                if instance_type == "zz9.huge" && region == "us-east-1"),
            "{err}"
        );
        let message = err.to_string();
        assert!(message.contains("zz9.huge") && message.contains("us-east-1"));
        let market = ec2_market(
            &points,
            &[],
            &bundled(),
            LiveWindow {
                drop_unpriced: true,
                ..window(7)
            },
        )
        .unwrap();
        assert_eq!(market.pools.len(), 1);
        // another region than the list's
        let err = ec2_market(
            &points,
            &[],
            &bundled(),
            LiveWindow {
                region: "ap-south-1",
                ..window(7)
            },
        )
        .unwrap_err();
        assert!(
            matches!(err, LiveMarketError::UnknownRegion { .. }),
            "{err}"
        );
    }

    #[test]
    fn empty_history_is_an_error() {
        let err = ec2_market(&[], &[], &bundled(), window(7)).unwrap_err();
        assert!(matches!(err, LiveMarketError::EmptyHistory { .. }), "{err}");
        // only future records, or only other products
        let mut windows = point("m5.large", "us-east-1a", NOW - DAY, 0.04);
        windows.product_description = "Windows".into();
        let future = point("m5.large", "us-east-1a", NOW + 1, 0.04);
        let err = ec2_market(&[windows, future], &[], &bundled(), window(7)).unwrap_err();
        assert!(matches!(err, LiveMarketError::EmptyHistory { .. }), "{err}");
    }
}
