//! The market abstraction the bidder reads: pools (instance type × zone × capacity type), spot
//! price and availability over time, on-demand prices and per-instance sizes.
//!
//! A [`Market`] is a replayable history (from a trace file, see [`trace`], or from a live
//! source that appends samples). The bidder never reads a `Market` directly: it reads a
//! [`MarketView`], the market as seen at one instant, so the same decision code runs in the
//! simulator, in `ebbflow run` and in the operator (whose live EC2 market, the operator's
//! `live_market`, is built from `DescribeSpotPriceHistory`).
//!
//! Gap policy (documented in `docs/traces.md`): a price sample holds until the pool's next
//! sample, for at most [`GapPolicy::max_hold_seconds`]; past that, or where a sample has no
//! price, the pool is *unavailable* at that instant. A missing price is never read as zero.

pub mod trace;

use std::fmt;

/// Seconds since the Unix epoch, UTC.
pub type Timestamp = i64;

/// Whether capacity can be taken back by the provider.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CapacityType {
    /// Revocable capacity (EC2 spot, GCP spot).
    Spot,
    /// Reliable capacity billed at the list price.
    OnDemand,
}

/// One market a bidder can buy from: an instance type in a zone with a capacity type.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PoolId {
    /// Instance or machine type, e.g. `p3.2xlarge`.
    pub instance_type: String,
    /// Availability zone name or ID (or a region where the source has no zones, e.g. GCP).
    pub zone: String,
    /// Spot or on-demand.
    pub capacity: CapacityType,
}

impl fmt::Display for PoolId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let capacity = match self.capacity {
            CapacityType::Spot => "spot",
            CapacityType::OnDemand => "on-demand",
        };
        write!(f, "{}/{}/{}", self.instance_type, self.zone, capacity)
    }
}

/// Static facts about a pool.
#[derive(Clone, Debug, PartialEq)]
pub struct PoolInfo {
    /// Which pool.
    pub id: PoolId,
    /// vCPUs per instance; work per instance-second is proportional to it (seed 003 §4.3).
    pub vcpus: f64,
    /// Memory per instance in GiB, when known.
    pub memory_gib: Option<f64>,
    /// On-demand price of the same instance type in USD per hour, when known.
    pub on_demand_usd_hr: Option<f64>,
}

/// How missing samples are read (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GapPolicy {
    /// A price sample is trusted for at most this long after it was taken.
    pub max_hold_seconds: i64,
}

impl GapPolicy {
    /// The default for a source sampled every `median_interval` seconds: a sample holds for
    /// four intervals, and never less than one hour (AWS publishes a price only when it
    /// changes, so an unchanged price is not a gap).
    pub fn for_interval(median_interval: i64) -> Self {
        Self {
            max_hold_seconds: (4 * median_interval).max(3600),
        }
    }
}

/// One observation of a pool.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sample {
    /// When it was observed.
    pub at: Timestamp,
    /// Spot price in USD per hour; `None` when the source listed no price (the pool is then
    /// unavailable until the next sample with a price).
    pub price: Option<f64>,
    /// Whether capacity could be obtained (or kept) at that instant; `true` where the source
    /// has no availability data.
    pub available: bool,
}

/// The history of one pool: samples sorted by time.
#[derive(Clone, Debug, PartialEq)]
pub struct PoolSeries {
    /// Static facts.
    pub info: PoolInfo,
    /// Observations, strictly increasing in time.
    pub samples: Vec<Sample>,
    /// Whether the source carries availability data (rather than price only).
    pub has_availability: bool,
}

/// What a pool looks like at one instant.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Quote {
    /// Price in USD per hour; `None` when unknown (gap) or not offered.
    pub price: Option<f64>,
    /// Whether new capacity can be obtained and running capacity is kept.
    pub available: bool,
    /// Since when the pool has been buyable without interruption, if known (from
    /// availability history; `None` where the source cannot tell).
    pub up_since: Option<Timestamp>,
}

impl Quote {
    /// The price, if capacity can be bought at this instant.
    pub fn buyable_price(&self) -> Option<f64> {
        if self.available { self.price } else { None }
    }
}

impl PoolSeries {
    /// The pool at `at` under `gap`: the latest sample at or before `at`, if not too old.
    pub fn quote_at(&self, at: Timestamp, gap: GapPolicy) -> Quote {
        let after = self.samples.partition_point(|s| s.at <= at);
        if after == 0 {
            return Quote {
                price: None,
                available: false,
                up_since: None,
            };
        }
        let sample = self.samples[after - 1];
        if at - sample.at > gap.max_hold_seconds {
            return Quote {
                price: None,
                available: false,
                up_since: None,
            };
        }
        Quote {
            price: sample.price,
            available: sample.available && sample.price.is_some(),
            up_since: None,
        }
    }

    /// Since when the pool has been buyable without interruption at `at` (`None` if it is not
    /// buyable, or was buyable since before its first sample). Only meaningful for series with
    /// availability data.
    pub fn up_since(&self, at: Timestamp, gap: GapPolicy) -> Option<Timestamp> {
        let after = self.samples.partition_point(|s| s.at <= at);
        if after == 0 || !self.quote_at(at, gap).available {
            return None;
        }
        let mut start = after - 1;
        while start > 0 {
            let (previous, current) = (self.samples[start - 1], self.samples[start]);
            let buyable = previous.available && previous.price.is_some();
            if !buyable || current.at - previous.at > gap.max_hold_seconds {
                return Some(current.at);
            }
            start -= 1;
        }
        None
    }
}

/// A replayable market history: every pool of one trace.
#[derive(Clone, Debug, PartialEq)]
pub struct Market {
    /// Where it came from (file path or source name), for messages.
    pub source: String,
    /// The pools, each with its samples.
    pub pools: Vec<PoolSeries>,
    /// How gaps are read.
    pub gap: GapPolicy,
}

/// Errors building or combining markets.
#[derive(Debug, thiserror::Error)]
pub enum MarketError {
    /// A pool has no on-demand price and none was supplied.
    #[error(
        "price on-demand for pool {pool} of {source_name}: no on-demand price known; pass an on-demand price list"
    )]
    PriceOnDemand {
        /// The pool.
        pool: String,
        /// The market's source.
        source_name: String,
    },
    /// The market has no pools or no samples.
    #[error("read market {source_name}: it holds no samples")]
    ReadEmpty {
        /// The market's source.
        source_name: String,
    },
}

impl Market {
    /// First and last sample time over all pools.
    pub fn span(&self) -> Result<(Timestamp, Timestamp), MarketError> {
        let first = self
            .pools
            .iter()
            .filter_map(|p| p.samples.first())
            .map(|s| s.at)
            .min();
        let last = self
            .pools
            .iter()
            .filter_map(|p| p.samples.last())
            .map(|s| s.at)
            .max();
        match (first, last) {
            (Some(first), Some(last)) => Ok((first, last)),
            _ => Err(MarketError::ReadEmpty {
                source_name: self.source.clone(),
            }),
        }
    }

    /// Static facts of every pool, in pool order.
    pub fn infos(&self) -> Vec<PoolInfo> {
        self.pools.iter().map(|p| p.info.clone()).collect()
    }

    /// The market as seen at `at`.
    pub fn view_at(&self, at: Timestamp) -> MarketView {
        MarketView {
            at,
            quotes: self
                .pools
                .iter()
                .map(|p| Quote {
                    up_since: if p.has_availability {
                        p.up_since(at, self.gap)
                    } else {
                        None
                    },
                    ..p.quote_at(at, self.gap)
                })
                .collect(),
        }
    }

    /// The market restricted to samples in `[from, to)`, e.g. a training slice.
    pub fn slice(&self, from: Timestamp, to: Timestamp) -> Market {
        Market {
            source: self.source.clone(),
            gap: self.gap,
            pools: self
                .pools
                .iter()
                .map(|p| PoolSeries {
                    info: p.info.clone(),
                    has_availability: p.has_availability,
                    samples: p
                        .samples
                        .iter()
                        .filter(|s| s.at >= from && s.at < to)
                        .copied()
                        .collect(),
                })
                .collect(),
        }
    }

    /// Fill in on-demand prices and vCPUs from tables where the trace lacks them; a pool whose
    /// on-demand price stays unknown is an error (never a silent zero).
    ///
    /// On-demand prices differ by region, so a pool takes its price from the table of its zone's
    /// region ([`region_of_zone`]), else from a table of no stated region. Only when neither
    /// lists its type does it borrow another region's price, and the returned notes say so, one
    /// per instance type and pair of regions, for the caller to show (the p3.2xlarge trace's
    /// us-east-2 and us-west-2 zones cost what us-east-1 lists, but most types do not).
    pub fn complete(
        &mut self,
        on_demand: &[OnDemandTable],
        specs: Option<&SpecTable>,
    ) -> Result<Vec<String>, MarketError> {
        let mut notes: Vec<String> = Vec::new();
        for pool in &mut self.pools {
            if pool.info.on_demand_usd_hr.is_none() {
                let instance_type = pool.info.id.instance_type.as_str();
                let region = region_of_zone(&pool.info.id.zone);
                let own = on_demand
                    .iter()
                    .filter(|t| t.region.as_deref() == Some(region))
                    .chain(on_demand.iter().filter(|t| t.region.is_none()))
                    .find_map(|t| t.price(instance_type));
                pool.info.on_demand_usd_hr = own.or_else(|| {
                    let (price, from) = on_demand.iter().find_map(|t| {
                        t.price(instance_type)
                            .map(|price| (price, t.region.clone().unwrap_or_default()))
                    })?;
                    let note = format!(
                        "on-demand price of {instance_type} in {region} taken from the {from} \
                         list ({price} USD/h): no {region} list names it"
                    );
                    if !notes.contains(&note) {
                        notes.push(note);
                    }
                    Some(price)
                });
            }
            if let Some(spec) = specs.and_then(|t| t.spec(&pool.info.id.instance_type)) {
                pool.info.vcpus = spec.vcpus;
                pool.info.memory_gib = Some(spec.memory_gib);
            }
            if pool.info.on_demand_usd_hr.is_none() {
                return Err(MarketError::PriceOnDemand {
                    pool: pool.info.id.to_string(),
                    source_name: self.source.clone(),
                });
            }
        }
        Ok(notes)
    }
}

/// The region of an availability zone: AWS `us-east-1a` and local zone `us-west-2-lax-1a` are in
/// `us-west-2`/`us-east-1` (the name up to its first number), GCP `us-central1-a` is in
/// `us-central1` (the name without its zone letter).
pub fn region_of_zone(zone: &str) -> &str {
    let mut at = 0;
    for (i, part) in zone.split('-').enumerate() {
        if i >= 1 && part.starts_with(|c: char| c.is_ascii_digit()) {
            let digits = part.len() - part.trim_start_matches(|c: char| c.is_ascii_digit()).len();
            return &zone[..at + digits];
        }
        at += part.len() + 1;
    }
    match zone.rsplit_once('-') {
        Some((region, letter)) if letter.len() == 1 => region,
        _ => zone,
    }
}

/// The market at one instant: one quote per pool, in the order of the pool list the caller
/// holds. This is all the bidder sees of the market besides the eviction model.
#[derive(Clone, Debug, PartialEq)]
pub struct MarketView {
    /// When it was observed.
    pub at: Timestamp,
    /// One quote per pool.
    pub quotes: Vec<Quote>,
}

/// On-demand prices per instance type (one region).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OnDemandTable {
    /// The region the prices are for (`None`: not stated).
    pub region: Option<String>,
    /// `(instance type, USD per hour)`, sorted by type.
    pub prices: Vec<(String, f64)>,
}

impl OnDemandTable {
    /// The on-demand price of `instance_type`, if listed.
    pub fn price(&self, instance_type: &str) -> Option<f64> {
        self.prices
            .binary_search_by(|(t, _)| t.as_str().cmp(instance_type))
            .ok()
            .map(|i| self.prices[i].1)
    }
}

/// Size of one instance type.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct InstanceSpec {
    /// vCPUs.
    pub vcpus: f64,
    /// Memory in GiB.
    pub memory_gib: f64,
}

/// Instance sizes per type.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SpecTable {
    /// `(instance type, spec)`, sorted by type.
    pub specs: Vec<(String, InstanceSpec)>,
}

impl SpecTable {
    /// The spec of `instance_type`, if listed.
    pub fn spec(&self, instance_type: &str) -> Option<InstanceSpec> {
        self.specs
            .binary_search_by(|(t, _)| t.as_str().cmp(instance_type))
            .ok()
            .map(|i| self.specs[i].1)
    }
}

/// One row of the AWS Spot Instance Advisor: interruption band and savings.
#[derive(Clone, Debug, PartialEq)]
pub struct AdvisorEntry {
    /// Region, e.g. `us-east-1`.
    pub region: String,
    /// Instance type.
    pub instance_type: String,
    /// Upper bound of AWS's monthly interruption-frequency band (0.05 for `<5%`, 1.0 for
    /// `>20%`).
    pub interruption_upper: f64,
    /// Lower bound of the band (0.20 for `>20%`).
    pub interruption_lower: f64,
    /// Savings versus on-demand in percent.
    pub savings_pct: f64,
}

/// A Spot Advisor snapshot.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AdvisorTable {
    /// Rows in file order.
    pub entries: Vec<AdvisorEntry>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series(samples: Vec<Sample>) -> PoolSeries {
        PoolSeries {
            info: PoolInfo {
                id: PoolId {
                    instance_type: "m5.large".into(),
                    zone: "z".into(),
                    capacity: CapacityType::Spot,
                },
                vcpus: 2.0,
                memory_gib: None,
                on_demand_usd_hr: Some(0.096),
            },
            samples,
            has_availability: false,
        }
    }

    #[test]
    fn quote_holds_a_price_until_the_gap_limit_then_reports_unavailable() {
        let pool = series(vec![
            Sample {
                at: 0,
                price: Some(0.03),
                available: true,
            },
            Sample {
                at: 10_000,
                price: None,
                available: true,
            },
        ]);
        let gap = GapPolicy {
            max_hold_seconds: 3600,
        };
        assert_eq!(pool.quote_at(-1, gap).price, None);
        assert_eq!(pool.quote_at(3600, gap).buyable_price(), Some(0.03));
        let stale = pool.quote_at(3601, gap);
        assert_eq!(stale.price, None);
        assert!(!stale.available);
        // a sample without a price is unavailable, not free
        let unlisted = pool.quote_at(10_000, gap);
        assert_eq!(unlisted.buyable_price(), None);
    }

    #[test]
    fn up_since_finds_the_start_of_the_current_buyable_run() {
        let flags = [true, false, true, true, true];
        let pool = series(
            flags
                .iter()
                .enumerate()
                .map(|(i, &available)| Sample {
                    at: 100 * i as i64,
                    price: Some(0.03),
                    available,
                })
                .collect(),
        );
        let gap = GapPolicy::for_interval(100);
        assert_eq!(pool.up_since(450, gap), Some(200));
        assert_eq!(pool.up_since(150, gap), None, "not buyable");
        assert_eq!(
            pool.up_since(50, gap),
            None,
            "buyable since before the first sample"
        );
    }

    #[test]
    fn complete_refuses_a_pool_without_on_demand_price() {
        let mut pool = series(vec![]);
        pool.info.on_demand_usd_hr = None;
        let mut market = Market {
            source: "t.csv".into(),
            pools: vec![pool],
            gap: GapPolicy::for_interval(60),
        };
        let err = market.complete(&[], None).unwrap_err();
        assert!(err.to_string().contains("m5.large/z/spot"), "{err}");
        let table = OnDemandTable {
            region: None,
            prices: vec![("m5.large".into(), 0.096)],
        };
        assert!(market.complete(&[table], None).unwrap().is_empty());
        assert_eq!(market.pools[0].info.on_demand_usd_hr, Some(0.096));
    }

    #[test]
    fn complete_takes_the_price_of_the_pools_region_and_says_when_it_borrows() {
        let table = |region: &str, price| OnDemandTable {
            region: Some(region.into()),
            prices: vec![("m5.large".into(), price)],
        };
        let pool = |zone: &str| {
            let mut pool = series(vec![]);
            pool.info.on_demand_usd_hr = None;
            pool.info.id.zone = zone.into();
            pool
        };
        let mut market = Market {
            source: "t.csv".into(),
            pools: vec![pool("eu-west-1b"), pool("us-east-1a"), pool("ap-south-1a")],
            gap: GapPolicy::for_interval(60),
        };
        let tables = [table("us-east-1", 0.096), table("eu-west-1", 0.107)];
        let notes = market.complete(&tables, None).unwrap();
        let prices: Vec<_> = market
            .pools
            .iter()
            .map(|p| p.info.on_demand_usd_hr)
            .collect();
        assert_eq!(prices, vec![Some(0.107), Some(0.096), Some(0.096)]);
        assert_eq!(notes.len(), 1, "{notes:?}");
        assert!(
            notes[0].contains("ap-south-1") && notes[0].contains("from the us-east-1 list"),
            "{notes:?}"
        );
    }

    #[test]
    fn zones_map_to_their_regions() {
        for (zone, region) in [
            ("us-east-1a", "us-east-1"),
            ("us-gov-west-1b", "us-gov-west-1"),
            ("us-west-2-lax-1a", "us-west-2"),
            ("ap-northeast-1d", "ap-northeast-1"),
            ("us-central1-a", "us-central1"),
            ("europe-west4-b", "europe-west4"),
            ("z", "z"),
        ] {
            assert_eq!(region_of_zone(zone), region, "{zone}");
        }
    }
}
