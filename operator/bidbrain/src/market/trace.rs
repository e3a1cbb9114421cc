//! Trace readers. The format is recognised from the file's content (its CSV header or JSON
//! shape), never from its name; `docs/traces.md` lists every accepted format.
//!
//! Errors name the file, the line and the column (1-based field number for CSV, character
//! column for JSON) and the offending value.

use std::collections::BTreeMap;
use std::path::Path;

use chrono::{DateTime, NaiveDateTime};
use serde::Deserialize;

use super::{
    AdvisorEntry, AdvisorTable, CapacityType, GapPolicy, InstanceSpec, Market, OnDemandTable,
    PoolId, PoolInfo, PoolSeries, Sample, SpecTable, Timestamp,
};

/// The formats [`parse_trace`] recognises.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TraceFormat {
    /// `timestamp_utc,<zone>_available,<zone>_spot_usd_hr,…`: one instance type, availability
    /// and price per zone on a shared timeline (the p3.2xlarge 9-AZ trace).
    ZoneAvailabilityPrice,
    /// SpotLake hourly snapshots: `Time,InstanceType,Region,AZ,SPS,IF,OndemandPrice,SpotPrice,…`.
    SpotLake,
    /// GCP list-price history: `snapshot_utc,source_commit,region,machine_type,on_demand_usd_hr,spot_usd_hr`.
    GcpPriceHistory,
    /// AWS Spot Instance Advisor snapshot: `region,instance_type,interruption_index,interruption_band,savings_vs_on_demand_pct`.
    SpotAdvisor,
    /// On-demand price list: `region,instance_type,on_demand_usd_hr`.
    OnDemandPrices,
    /// Instance sizes: `instance_type,vcpus,memory_gib,…`.
    InstanceSpecs,
    /// The JSON `aws ec2 describe-spot-price-history` prints (`{"SpotPriceHistory": [...]}`).
    Ec2SpotPriceHistoryJson,
}

/// What a trace file holds.
#[derive(Clone, Debug, PartialEq)]
pub enum TraceFile {
    /// Prices (and maybe availability) over time.
    Market(Market),
    /// On-demand prices.
    OnDemand(Vec<OnDemandTable>),
    /// Instance sizes.
    Specs(SpecTable),
    /// Spot Advisor interruption bands.
    Advisor(AdvisorTable),
}

/// Options for reading a trace.
#[derive(Clone, Debug, Default)]
pub struct ReadOptions {
    /// Instance type of a [`TraceFormat::ZoneAvailabilityPrice`] file, whose content does not
    /// name it; default: the first token of the file name that looks like an EC2 instance
    /// type (`p3.2xlarge`).
    pub instance_type: Option<String>,
}

/// Errors reading a trace.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// The file could not be read.
    #[error("read trace {file}: {source}")]
    ReadFile {
        /// The file.
        file: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// No known format matches the content.
    #[error(
        "detect trace format of {file}: line 1 is not a known header or JSON document: {first_line:?}"
    )]
    DetectFormat {
        /// The file.
        file: String,
        /// Its first line (truncated).
        first_line: String,
    },
    /// The CSV structure is broken (e.g. a row with a different number of fields).
    #[error("parse {file} line {line}: {reason}")]
    ParseCsv {
        /// The file.
        file: String,
        /// 1-based line.
        line: u64,
        /// What is wrong.
        reason: String,
    },
    /// One field is invalid.
    #[error("parse {file} line {line} column {column} ({field}): {reason}: {value:?}")]
    ParseField {
        /// The file.
        file: String,
        /// 1-based line.
        line: u64,
        /// 1-based field number.
        column: usize,
        /// Column name.
        field: String,
        /// The offending text.
        value: String,
        /// What is wrong.
        reason: String,
    },
    /// The JSON document is invalid.
    #[error("parse {file} line {line} column {column}: {reason}")]
    ParseJson {
        /// The file.
        file: String,
        /// 1-based line.
        line: usize,
        /// 1-based character column.
        column: usize,
        /// What is wrong.
        reason: String,
    },
    /// Timestamps of one pool go backwards or repeat.
    #[error(
        "order {file} line {line}: pool {pool} has a sample at {at} not after the previous one"
    )]
    OrderSamples {
        /// The file.
        file: String,
        /// 1-based line.
        line: u64,
        /// The pool.
        pool: String,
        /// The timestamp (RFC 3339).
        at: String,
    },
    /// The instance type of a zone-availability trace is unknown.
    #[error(
        "name instance type of {file}: the content does not name it and the file name holds none; pass it explicitly"
    )]
    NameInstanceType {
        /// The file.
        file: String,
    },
    /// The file has a header but no data rows.
    #[error("read trace {file}: no data rows")]
    ReadEmpty {
        /// The file.
        file: String,
    },
    /// A page of EC2 price history says more pages follow, which the file does not hold.
    #[error(
        "read trace {file}: its last page has a NextToken, so older history is missing; save \
         every page (the AWS CLI does without --max-items), as one page or an array of pages"
    )]
    ReadTruncated {
        /// The file.
        file: String,
    },
}

/// Whether `value` is a price a trace may hold: finite and positive, and still so as the 32-bit
/// float the market grid stores (1e-50 became a free 0, 5e38 an infinite price).
fn is_price(value: f64) -> bool {
    let stored = value as f32;
    value.is_finite() && value > 0.0 && stored.is_finite() && stored > 0.0
}

/// Read and parse a trace file, detecting its format from its content.
pub fn read_trace(path: &Path, options: &ReadOptions) -> Result<TraceFile, TraceError> {
    let file = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| TraceError::ReadFile {
        file: file.clone(),
        source,
    })?;
    let file_name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut options = options.clone();
    if options.instance_type.is_none() {
        options.instance_type = instance_type_in_name(&file_name);
    }
    parse_trace(&file, &text, &options)
}

/// The first `family.size` token of a file name, e.g. `p3.2xlarge`.
fn instance_type_in_name(name: &str) -> Option<String> {
    name.split(['_', '-', ' '])
        .find(|token| {
            let mut parts = token.splitn(2, '.');
            let (Some(family), Some(size)) = (parts.next(), parts.next()) else {
                return false;
            };
            family.len() >= 2
                && family
                    .chars()
                    .next()
                    .is_some_and(|c| c.is_ascii_lowercase())
                && family.chars().any(|c| c.is_ascii_digit())
                && family.chars().all(|c| c.is_ascii_alphanumeric())
                && (size.ends_with("large")
                    || size.ends_with("medium")
                    || size.ends_with("small")
                    || size.ends_with("micro")
                    || size.ends_with("nano")
                    || size == "metal")
        })
        .map(str::to_string)
}

/// Recognise the format of `text` from its first line.
pub fn detect_format(text: &str) -> Option<TraceFormat> {
    let trimmed = text.trim_start_matches('\u{feff}').trim_start();
    if trimmed.starts_with('{') || trimmed.starts_with('[') {
        return Some(TraceFormat::Ec2SpotPriceHistoryJson);
    }
    let header: Vec<&str> = trimmed
        .lines()
        .next()?
        .trim_end_matches('\r')
        .split(',')
        .map(str::trim)
        .collect();
    let starts = |names: &[&str]| header.len() >= names.len() && header[..names.len()] == *names;
    if header.first() == Some(&"timestamp_utc")
        && header.len() >= 3
        && header.len() % 2 == 1
        && header[1..].chunks(2).all(|pair| {
            pair[0].ends_with("_available")
                && pair[1].ends_with("_spot_usd_hr")
                && pair[0].trim_end_matches("_available")
                    == pair[1].trim_end_matches("_spot_usd_hr")
        })
    {
        return Some(TraceFormat::ZoneAvailabilityPrice);
    }
    if starts(&[
        "Time",
        "InstanceType",
        "Region",
        "AZ",
        "SPS",
        "IF",
        "OndemandPrice",
        "SpotPrice",
    ]) {
        return Some(TraceFormat::SpotLake);
    }
    if starts(&[
        "snapshot_utc",
        "source_commit",
        "region",
        "machine_type",
        "on_demand_usd_hr",
        "spot_usd_hr",
    ]) {
        return Some(TraceFormat::GcpPriceHistory);
    }
    if starts(&[
        "region",
        "instance_type",
        "interruption_index",
        "interruption_band",
        "savings_vs_on_demand_pct",
    ]) {
        return Some(TraceFormat::SpotAdvisor);
    }
    if starts(&["region", "instance_type", "on_demand_usd_hr"]) {
        return Some(TraceFormat::OnDemandPrices);
    }
    if starts(&["instance_type", "vcpus", "memory_gib"]) {
        return Some(TraceFormat::InstanceSpecs);
    }
    None
}

/// Parse trace `text` (read from `file`, used in messages).
pub fn parse_trace(file: &str, text: &str, options: &ReadOptions) -> Result<TraceFile, TraceError> {
    let Some(format) = detect_format(text) else {
        return Err(unknown_format(file, text));
    };
    match format {
        TraceFormat::ZoneAvailabilityPrice => {
            let instance_type =
                options
                    .instance_type
                    .clone()
                    .ok_or_else(|| TraceError::NameInstanceType {
                        file: file.to_string(),
                    })?;
            parse_zone_availability(file, text, &instance_type).map(TraceFile::Market)
        }
        TraceFormat::SpotLake => parse_spotlake(file, text).map(TraceFile::Market),
        TraceFormat::GcpPriceHistory => parse_gcp(file, text).map(TraceFile::Market),
        TraceFormat::SpotAdvisor => parse_advisor(file, text).map(TraceFile::Advisor),
        TraceFormat::OnDemandPrices => parse_on_demand_by_region(file, text)
            .map(|regions| TraceFile::OnDemand(regions.into_values().collect())),
        TraceFormat::InstanceSpecs => parse_specs(file, text).map(TraceFile::Specs),
        TraceFormat::Ec2SpotPriceHistoryJson => parse_ec2_json(file, text).map(TraceFile::Market),
    }
}

/// [`TraceError::DetectFormat`] for `text`, quoting its first line (truncated).
fn unknown_format(file: &str, text: &str) -> TraceError {
    TraceError::DetectFormat {
        file: file.to_string(),
        first_line: text
            .lines()
            .next()
            .unwrap_or("")
            .chars()
            .take(120)
            .collect(),
    }
}

/// A CSV row with the context to report errors about its fields.
struct Row<'a> {
    file: &'a str,
    headers: &'a csv::StringRecord,
    record: csv::StringRecord,
    line: u64,
}

impl Row<'_> {
    fn error(&self, column: usize, reason: &str) -> TraceError {
        TraceError::ParseField {
            file: self.file.to_string(),
            line: self.line,
            column: column + 1,
            field: self.headers.get(column).unwrap_or("").to_string(),
            value: self.record.get(column).unwrap_or("").to_string(),
            reason: reason.to_string(),
        }
    }

    fn text(&self, column: usize) -> Result<&str, TraceError> {
        match self.record.get(column).map(str::trim) {
            Some(value) if !value.is_empty() => Ok(value),
            _ => Err(self.error(column, "empty field")),
        }
    }

    /// A price: finite and strictly positive (a zero price is rejected, never read as free).
    fn price(&self, column: usize) -> Result<f64, TraceError> {
        let value: f64 = self
            .text(column)?
            .parse()
            .map_err(|_| self.error(column, "not a number"))?;
        if !is_price(value) {
            return Err(self.error(
                column,
                "price must be a positive number (and between about 1e-38 and 3e38)",
            ));
        }
        Ok(value)
    }

    /// A price that may be empty (no offering listed).
    fn optional_price(&self, column: usize) -> Result<Option<f64>, TraceError> {
        if self
            .record
            .get(column)
            .map(str::trim)
            .unwrap_or("")
            .is_empty()
        {
            return Ok(None);
        }
        self.price(column).map(Some)
    }

    fn number(&self, column: usize) -> Result<f64, TraceError> {
        let value: f64 = self
            .text(column)?
            .parse()
            .map_err(|_| self.error(column, "not a number"))?;
        if !value.is_finite() || value < 0.0 {
            return Err(self.error(column, "must be a non-negative number"));
        }
        Ok(value)
    }

    fn time(&self, column: usize) -> Result<Timestamp, TraceError> {
        parse_time(self.text(column)?)
            .ok_or_else(|| self.error(column, "not an RFC 3339 or `YYYY-MM-DD HH:MM:SS` UTC time"))
    }

    fn flag(&self, column: usize) -> Result<bool, TraceError> {
        match self.text(column)? {
            "1" | "true" | "True" => Ok(true),
            "0" | "false" | "False" => Ok(false),
            _ => Err(self.error(column, "not 0 or 1")),
        }
    }
}

/// Parse RFC 3339 (`2023-02-15T22:08:16Z`) or naive UTC (`2024-01-01 00:00:00`).
pub fn parse_time(text: &str) -> Option<Timestamp> {
    if let Ok(t) = DateTime::parse_from_rfc3339(text) {
        return Some(t.timestamp());
    }
    NaiveDateTime::parse_from_str(text, "%Y-%m-%d %H:%M:%S")
        .ok()
        .map(|t| t.and_utc().timestamp())
}

/// Format a timestamp as RFC 3339 for messages and output.
pub fn format_time(at: Timestamp) -> String {
    DateTime::from_timestamp(at, 0)
        .map(|t| t.format("%Y-%m-%dT%H:%M:%SZ").to_string())
        .unwrap_or_else(|| at.to_string())
}

/// Iterate CSV rows with headers, turning structural errors into [`TraceError::ParseCsv`].
fn for_each_row(
    file: &str,
    text: &str,
    mut each: impl FnMut(&Row<'_>) -> Result<(), TraceError>,
) -> Result<(), TraceError> {
    let mut reader = csv::ReaderBuilder::new()
        .has_headers(true)
        .trim(csv::Trim::All)
        .from_reader(text.trim_start_matches('\u{feff}').as_bytes());
    let headers = reader.headers().map_err(|e| csv_error(file, &e))?.clone();
    let mut rows = 0usize;
    for record in reader.records() {
        let record = record.map_err(|e| csv_error(file, &e))?;
        let line = record.position().map(|p| p.line()).unwrap_or(0);
        rows += 1;
        each(&Row {
            file,
            headers: &headers,
            record,
            line,
        })?;
    }
    if rows == 0 {
        return Err(TraceError::ReadEmpty {
            file: file.to_string(),
        });
    }
    Ok(())
}

fn csv_error(file: &str, error: &csv::Error) -> TraceError {
    TraceError::ParseCsv {
        file: file.to_string(),
        line: error.position().map(|p| p.line()).unwrap_or(0),
        reason: error.to_string(),
    }
}

/// Samples per pool, checked to be strictly increasing as they arrive.
#[derive(Default)]
struct SeriesBuilder {
    pools: BTreeMap<(String, String), (Option<f64>, Vec<Sample>)>,
    /// A repeated timestamp replaces the previous sample instead of being an error.
    replace_repeated: bool,
}

impl SeriesBuilder {
    fn push(
        &mut self,
        file: &str,
        line: u64,
        key: (String, String),
        sample: Sample,
        on_demand: Option<f64>,
    ) -> Result<(), TraceError> {
        let entry = self.pools.entry(key.clone()).or_default();
        if self.replace_repeated
            && let Some(last) = entry.1.last_mut()
            && last.at == sample.at
        {
            *last = sample;
            if on_demand.is_some() {
                entry.0 = on_demand;
            }
            return Ok(());
        }
        if let Some(last) = entry.1.last()
            && last.at >= sample.at
        {
            return Err(TraceError::OrderSamples {
                file: file.to_string(),
                line,
                pool: format!("{}/{}", key.0, key.1),
                at: format_time(sample.at),
            });
        }
        if on_demand.is_some() {
            entry.0 = on_demand;
        }
        entry.1.push(sample);
        Ok(())
    }

    fn build(
        self,
        source: &str,
        has_availability: bool,
        vcpus: impl Fn(&str) -> f64,
        gap: Option<GapPolicy>,
    ) -> Market {
        let mut intervals: Vec<i64> = self
            .pools
            .values()
            .flat_map(|(_, s)| s.windows(2).map(|w| w[1].at - w[0].at))
            .collect();
        intervals.sort_unstable();
        let median = intervals.get(intervals.len() / 2).copied().unwrap_or(3600);
        let pools = self
            .pools
            .into_iter()
            .map(|((instance_type, zone), (on_demand, samples))| PoolSeries {
                info: PoolInfo {
                    vcpus: vcpus(&instance_type),
                    id: PoolId {
                        instance_type,
                        zone,
                        capacity: CapacityType::Spot,
                    },
                    memory_gib: None,
                    on_demand_usd_hr: on_demand,
                },
                samples,
                has_availability,
            })
            .collect();
        Market {
            source: source.to_string(),
            pools,
            gap: gap.unwrap_or_else(|| GapPolicy::for_interval(median)),
        }
    }
}

/// vCPUs of an instance type where no spec table is given: 1 until a spec table fills it in
/// (ν is then per instance rather than per vCPU).
fn unknown_vcpus(_: &str) -> f64 {
    1.0
}

fn parse_zone_availability(
    file: &str,
    text: &str,
    instance_type: &str,
) -> Result<Market, TraceError> {
    let mut builder = SeriesBuilder::default();
    for_each_row(file, text, |row| {
        let at = row.time(0)?;
        let zones = (row.headers.len() - 1) / 2;
        for zone in 0..zones {
            let available_column = 1 + 2 * zone;
            let price_column = available_column + 1;
            let name = row.headers[available_column]
                .trim_end_matches("_available")
                .to_string();
            let sample = Sample {
                at,
                price: Some(row.price(price_column)?),
                available: row.flag(available_column)?,
            };
            builder.push(
                file,
                row.line,
                (instance_type.to_string(), name),
                sample,
                None,
            )?;
        }
        Ok(())
    })?;
    Ok(builder.build(file, true, unknown_vcpus, None))
}

fn parse_spotlake(file: &str, text: &str) -> Result<Market, TraceError> {
    let mut builder = SeriesBuilder::default();
    for_each_row(file, text, |row| {
        let at = row.time(0)?;
        let instance_type = row.text(1)?.to_string();
        let zone = row.text(3)?.to_string();
        let on_demand = row.price(6)?;
        // SpotLake writes -1 where its collector got no price: a gap, not a price
        let price = match row.text(7)? {
            "-1" | "-1.0" => None,
            _ => Some(row.price(7)?),
        };
        let sample = Sample {
            at,
            price,
            available: true,
        };
        builder.push(
            file,
            row.line,
            (instance_type, zone),
            sample,
            Some(on_demand),
        )
    })?;
    Ok(builder.build(file, false, unknown_vcpus, None))
}

/// vCPUs of a GCP machine type from its name (`n2-standard-8` → 8; A2 and A3 GPU types from
/// Google's published shapes), or `None` if the name has no known shape.
pub fn gcp_vcpus(machine_type: &str) -> Option<f64> {
    let parts: Vec<&str> = machine_type.split('-').collect();
    match parts.as_slice() {
        ["a2", "highgpu", gpus] => gpus
            .strip_suffix('g')?
            .parse::<f64>()
            .ok()
            .map(|g| 12.0 * g),
        ["a2", "megagpu", "16g"] => Some(96.0),
        ["a3", "highgpu", gpus] => gpus
            .strip_suffix('g')?
            .parse::<f64>()
            .ok()
            .map(|g| 26.0 * g),
        [_, _, count] => count.parse::<f64>().ok().filter(|c| *c > 0.0),
        _ => None,
    }
}

fn parse_gcp(file: &str, text: &str) -> Result<Market, TraceError> {
    // two source commits can carry the same snapshot timestamp: the later row wins
    let mut builder = SeriesBuilder {
        replace_repeated: true,
        ..SeriesBuilder::default()
    };
    let mut vcpus_of: BTreeMap<String, f64> = BTreeMap::new();
    let mut on_demand_history: BTreeMap<(String, String), Vec<f64>> = BTreeMap::new();
    for_each_row(file, text, |row| {
        let at = row.time(0)?;
        let region = row.text(2)?.to_string();
        let machine_type = row.text(3)?.to_string();
        let vcpus = gcp_vcpus(&machine_type)
            .ok_or_else(|| row.error(3, "unknown machine shape (vCPUs)"))?;
        vcpus_of.insert(machine_type.clone(), vcpus);
        let on_demand = row.price(4)?;
        on_demand_history
            .entry((machine_type.clone(), region.clone()))
            .or_default()
            .push(on_demand);
        let sample = Sample {
            at,
            price: row.optional_price(5)?,
            available: true,
        };
        builder.push(file, row.line, (machine_type, region), sample, None)
    })?;
    // GCP list prices move over the years; a pool's on-demand reference is the median.
    for (key, (on_demand, _)) in builder.pools.iter_mut() {
        if let Some(history) = on_demand_history.get_mut(key) {
            history.sort_by(f64::total_cmp);
            *on_demand = Some(history[history.len() / 2]);
        }
    }
    Ok(builder.build(
        file,
        false,
        |t| vcpus_of.get(t).copied().unwrap_or(1.0),
        None,
    ))
}

fn parse_band(band: &str) -> Option<(f64, f64)> {
    match band {
        "<5%" => Some((0.0, 0.05)),
        "5-10%" => Some((0.05, 0.10)),
        "10-15%" => Some((0.10, 0.15)),
        "15-20%" => Some((0.15, 0.20)),
        ">20%" => Some((0.20, 1.0)),
        _ => None,
    }
}

fn parse_advisor(file: &str, text: &str) -> Result<AdvisorTable, TraceError> {
    let mut entries = Vec::new();
    for_each_row(file, text, |row| {
        let (lower, upper) = parse_band(row.text(3)?).ok_or_else(|| {
            row.error(
                3,
                "not an interruption band (<5%, 5-10%, 10-15%, 15-20%, >20%)",
            )
        })?;
        // negative savings are real: some spot prices sit above on-demand
        let savings_pct: f64 = row
            .text(4)?
            .parse()
            .map_err(|_| row.error(4, "not a number"))?;
        if !savings_pct.is_finite() || savings_pct > 100.0 {
            return Err(row.error(4, "savings must be a number up to 100"));
        }
        entries.push(AdvisorEntry {
            region: row.text(0)?.to_string(),
            instance_type: row.text(1)?.to_string(),
            interruption_lower: lower,
            interruption_upper: upper,
            savings_pct,
        });
        Ok(())
    })?;
    Ok(AdvisorTable { entries })
}

/// Rows of an on-demand price list: `(region, instance type, USD per hour)`, in file order.
fn on_demand_rows(file: &str, text: &str) -> Result<Vec<(String, String, f64)>, TraceError> {
    let mut rows = Vec::new();
    for_each_row(file, text, |row| {
        rows.push((
            row.text(0)?.to_string(),
            row.text(1)?.to_string(),
            row.price(2)?,
        ));
        Ok(())
    })?;
    Ok(rows)
}

/// `region`'s table from `(type, price)` pairs; a type listed twice keeps its first price.
fn on_demand_table(region: String, mut prices: Vec<(String, f64)>) -> OnDemandTable {
    prices.sort_by(|a, b| a.0.cmp(&b.0));
    prices.dedup_by(|a, b| a.0 == b.0);
    OnDemandTable {
        region: Some(region),
        prices,
    }
}

/// An on-demand price list (`region,instance_type,on_demand_usd_hr`, see
/// [`TraceFormat::OnDemandPrices`]) split by region.
pub fn parse_on_demand_by_region(
    file: &str,
    text: &str,
) -> Result<BTreeMap<String, OnDemandTable>, TraceError> {
    if detect_format(text) != Some(TraceFormat::OnDemandPrices) {
        return Err(unknown_format(file, text));
    }
    let mut regions: BTreeMap<String, Vec<(String, f64)>> = BTreeMap::new();
    for (region, instance_type, price) in on_demand_rows(file, text)? {
        regions
            .entry(region)
            .or_default()
            .push((instance_type, price));
    }
    Ok(regions
        .into_iter()
        .map(|(region, prices)| (region.clone(), on_demand_table(region, prices)))
        .collect())
}

fn parse_specs(file: &str, text: &str) -> Result<SpecTable, TraceError> {
    let mut specs = Vec::new();
    for_each_row(file, text, |row| {
        let vcpus = row.number(1)?;
        if vcpus < 1.0 {
            return Err(row.error(1, "an instance has at least one vCPU"));
        }
        specs.push((
            row.text(0)?.to_string(),
            InstanceSpec {
                vcpus,
                memory_gib: row.number(2)?,
            },
        ));
        Ok(())
    })?;
    specs.sort_by(|a, b| a.0.cmp(&b.0));
    specs.dedup_by(|a, b| a.0 == b.0);
    Ok(SpecTable { specs })
}

/// A positive price written as a JSON string (`"0.918000"`), as the AWS CLI prints it.
fn deserialize_price<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<f64, D::Error> {
    let text = String::deserialize(deserializer)?;
    match text.trim().parse::<f64>() {
        Ok(price) if is_price(price) => Ok(price),
        _ => Err(serde::de::Error::custom(format!(
            "SpotPrice {text:?} is not a positive number"
        ))),
    }
}

fn deserialize_time<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<Timestamp, D::Error> {
    let text = String::deserialize(deserializer)?;
    parse_time(&text)
        .ok_or_else(|| serde::de::Error::custom(format!("Timestamp {text:?} is not RFC 3339")))
}

/// One record of EC2 spot price history: the price in force from `timestamp` until the pool's
/// next record (as `aws ec2 describe-spot-price-history` prints it, or as the live market
/// reads it through `ebbflow_ec2`).
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct Ec2PriceEntry {
    /// Availability zone name.
    pub availability_zone: String,
    /// Instance type.
    pub instance_type: String,
    /// Product description; only Linux prices are kept.
    #[serde(default)]
    pub product_description: Option<String>,
    /// USD per instance-hour, positive.
    #[serde(deserialize_with = "deserialize_price")]
    pub spot_price: f64,
    /// When the price took effect.
    #[serde(deserialize_with = "deserialize_time")]
    pub timestamp: Timestamp,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Ec2PricePage {
    spot_price_history: Vec<Ec2PriceEntry>,
    /// Set when more pages follow.
    #[serde(default)]
    next_token: Option<String>,
}

fn parse_ec2_json(file: &str, text: &str) -> Result<Market, TraceError> {
    let json_error = |e: serde_json::Error| TraceError::ParseJson {
        file: file.to_string(),
        line: e.line(),
        column: e.column(),
        reason: e.to_string(),
    };
    // A byte-order mark is no JSON (the format was detected past it).
    let text = text.trim_start_matches('\u{feff}');
    // One page (`{"SpotPriceHistory": …}`) or several pages in an array; parsed as typed
    // structs so that errors inside an entry keep their line and column.
    let value: serde_json::Value = serde_json::from_str(text).map_err(json_error)?;
    let pages: Vec<Ec2PricePage> = if value.is_array() {
        serde_json::from_str(text).map_err(json_error)?
    } else {
        vec![serde_json::from_str(text).map_err(json_error)?]
    };
    if pages
        .last()
        .and_then(|page| page.next_token.as_deref())
        .is_some_and(|token| !token.is_empty())
    {
        return Err(TraceError::ReadTruncated {
            file: file.to_string(),
        });
    }
    ec2_price_market(file, pages.into_iter().flat_map(|p| p.spot_price_history))
}

/// A market of the Linux spot price records in `entries` (any order): one pool per instance
/// type and zone, spot, no availability data, each price held until the pool's next record.
/// A timestamp listed twice keeps its first record. No record is [`TraceError::ReadEmpty`].
pub fn ec2_price_market(
    file: &str,
    entries: impl IntoIterator<Item = Ec2PriceEntry>,
) -> Result<Market, TraceError> {
    let mut entries: Vec<Ec2PriceEntry> = entries
        .into_iter()
        // Linux prices only: "Linux/UNIX" and the EC2-Classic era "Linux/UNIX (Amazon VPC)".
        .filter(|e| {
            e.product_description
                .as_deref()
                .is_none_or(|d| d.starts_with("Linux/UNIX"))
        })
        .collect();
    if entries.is_empty() {
        return Err(TraceError::ReadEmpty {
            file: file.to_string(),
        });
    }
    // The CLI prints newest first; a timestamp listed twice (both Linux descriptions) keeps
    // its first entry.
    entries.sort_by(|a, b| {
        (&a.instance_type, &a.availability_zone, a.timestamp).cmp(&(
            &b.instance_type,
            &b.availability_zone,
            b.timestamp,
        ))
    });
    entries.dedup_by(|a, b| {
        a.instance_type == b.instance_type
            && a.availability_zone == b.availability_zone
            && a.timestamp == b.timestamp
    });
    let mut builder = SeriesBuilder::default();
    for entry in entries {
        let sample = Sample {
            at: entry.timestamp,
            price: Some(entry.spot_price),
            available: true,
        };
        builder.push(
            file,
            0,
            (entry.instance_type, entry.availability_zone),
            sample,
            None,
        )?;
    }
    // EC2 lists a price only when it changes: a price holds until the next change.
    let gap = GapPolicy {
        max_hold_seconds: i64::MAX / 4,
    };
    Ok(builder.build(file, false, unknown_vcpus, Some(gap)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn market(file: TraceFile) -> Market {
        match file {
            TraceFile::Market(m) => m,
            other => panic!("expected a market, got {other:?}"),
        }
    }

    fn p3_options() -> ReadOptions {
        ReadOptions {
            instance_type: Some("p3.2xlarge".into()),
        }
    }

    #[test]
    fn zone_availability_trace_parses_per_zone_pools() {
        let text = "timestamp_utc,us-east-1a_available,us-east-1a_spot_usd_hr,us-west-2a_available,us-west-2a_spot_usd_hr\n\
                    2023-02-15T22:08:16Z,0,1.6703,1,0.9180\n\
                    2023-02-15T22:11:31Z,1,1.6000,1,0.9180\n";
        let m = market(parse_trace("t.csv", text, &p3_options()).unwrap());
        assert_eq!(m.pools.len(), 2);
        let a = &m.pools[0];
        assert_eq!(a.info.id.zone, "us-east-1a");
        assert_eq!(a.info.id.instance_type, "p3.2xlarge");
        assert!(a.has_availability);
        assert!(!a.samples[0].available);
        assert_eq!(a.samples[1].price, Some(1.6));
        assert_eq!(a.samples[1].at - a.samples[0].at, 195);
    }

    #[test]
    fn instance_type_comes_from_the_file_name_when_content_lacks_it() {
        assert_eq!(
            instance_type_in_name("aws_p3.2xlarge_availability_price_9az_2023-02-15_to_03-09.csv")
                .as_deref(),
            Some("p3.2xlarge")
        );
        assert_eq!(instance_type_in_name("trace.csv"), None);
        let text = "timestamp_utc,z_available,z_spot_usd_hr\n2023-02-15T22:08:16Z,1,1.0\n";
        let err = parse_trace("trace.csv", text, &ReadOptions::default()).unwrap_err();
        assert!(matches!(err, TraceError::NameInstanceType { .. }), "{err}");
    }

    #[test]
    fn spotlake_rows_group_into_pools_with_on_demand_price() {
        let text = "Time,InstanceType,Region,AZ,SPS,IF,OndemandPrice,SpotPrice,Savings\n\
                    2024-01-01 00:00:00,c5.large,eu-central-1,euc1-az1,3,3.0,0.097,0.0547,43\n\
                    2024-01-01 00:00:00,c5.large,eu-central-1,euc1-az2,3,3.0,0.097,0.0442,54\n\
                    2024-01-01 01:00:00,c5.large,eu-central-1,euc1-az1,3,3.0,0.097,0.0550,43\n";
        let m = market(parse_trace("s.csv", text, &ReadOptions::default()).unwrap());
        assert_eq!(m.pools.len(), 2);
        assert_eq!(m.pools[0].samples.len(), 2);
        assert_eq!(m.pools[0].info.on_demand_usd_hr, Some(0.097));
        assert!(!m.pools[0].has_availability);
        assert_eq!(m.gap.max_hold_seconds, 4 * 3600);
    }

    #[test]
    fn gcp_empty_spot_price_means_not_offered_not_free() {
        let text = "snapshot_utc,source_commit,region,machine_type,on_demand_usd_hr,spot_usd_hr\n\
                    2022-02-09T23:07:12Z,d4890e9324,europe-west4,a2-highgpu-1g,3.622044,\n\
                    2022-02-16T23:07:12Z,d4890e9325,europe-west4,a2-highgpu-1g,3.622044,1.1\n";
        let repeated = format!(
            "{text}2022-02-16T23:07:12Z,d4890e9326,europe-west4,a2-highgpu-1g,3.622044,1.2\n"
        );
        let m = market(parse_trace("g.csv", &repeated, &ReadOptions::default()).unwrap());
        assert_eq!(m.pools[0].samples.len(), 2);
        assert_eq!(
            m.pools[0].samples[1].price,
            Some(1.2),
            "a repeated snapshot replaces the earlier row"
        );
        let m = market(parse_trace("g.csv", text, &ReadOptions::default()).unwrap());
        let pool = &m.pools[0];
        assert_eq!(pool.info.vcpus, 12.0);
        assert_eq!(pool.samples[0].price, None);
        let first = pool.quote_at(pool.samples[0].at + 10, m.gap);
        assert_eq!(first.buyable_price(), None);
        assert_eq!(
            pool.quote_at(pool.samples[1].at, m.gap).buyable_price(),
            Some(1.1)
        );
        assert_eq!(gcp_vcpus("n2-highmem-8"), Some(8.0));
        assert_eq!(gcp_vcpus("a3-highgpu-8g"), Some(208.0));
        assert_eq!(gcp_vcpus("mystery"), None);
    }

    #[test]
    fn tables_parse_and_look_up() {
        let od = "region,instance_type,on_demand_usd_hr\nus-east-1,p3.2xlarge,3.06\nus-east-1,a1.large,0.051\n";
        let TraceFile::OnDemand(od) = parse_trace("od.csv", od, &ReadOptions::default()).unwrap()
        else {
            panic!("on-demand table expected")
        };
        let [od] = od.as_slice() else {
            panic!("one region expected: {od:?}")
        };
        assert_eq!(od.region.as_deref(), Some("us-east-1"));
        assert_eq!(od.price("p3.2xlarge"), Some(3.06));
        assert_eq!(od.price("nope"), None);
        let specs = "instance_type,vcpus,memory_gib,emr\np3.2xlarge,8,61.0,True\n";
        let TraceFile::Specs(specs) = parse_trace("s.csv", specs, &ReadOptions::default()).unwrap()
        else {
            panic!("spec table expected")
        };
        assert_eq!(specs.spec("p3.2xlarge").unwrap().vcpus, 8.0);
        let advisor = "region,instance_type,interruption_index,interruption_band,savings_vs_on_demand_pct\naf-south-1,c5.12xlarge,4,>20%,87\n";
        let TraceFile::Advisor(advisor) =
            parse_trace("a.csv", advisor, &ReadOptions::default()).unwrap()
        else {
            panic!("advisor table expected")
        };
        assert_eq!(advisor.entries[0].interruption_lower, 0.2);
        assert_eq!(advisor.entries[0].savings_pct, 87.0);
    }

    #[test]
    fn ec2_json_is_sorted_deduplicated_and_holds_prices_until_the_next_change() {
        let text = r#"{
    "SpotPriceHistory": [
        {"AvailabilityZone": "us-east-1a", "InstanceType": "m5.large", "ProductDescription": "Linux/UNIX", "SpotPrice": "0.040000", "Timestamp": "2024-01-02T00:00:00+00:00"},
        {"AvailabilityZone": "us-east-1a", "InstanceType": "m5.large", "ProductDescription": "Windows", "SpotPrice": "0.140000", "Timestamp": "2024-01-01T12:00:00+00:00"},
        {"AvailabilityZone": "us-east-1a", "InstanceType": "m5.large", "ProductDescription": "Linux/UNIX", "SpotPrice": "0.035000", "Timestamp": "2024-01-01T00:00:00+00:00"}
    ],
    "NextToken": ""
}"#;
        let m = market(parse_trace("h.json", text, &ReadOptions::default()).unwrap());
        assert_eq!(m.pools.len(), 1);
        let pool = &m.pools[0];
        assert_eq!(pool.samples.len(), 2);
        assert_eq!(pool.samples[0].price, Some(0.035));
        // twenty hours after the first sample there was no change: the price still holds
        let later = pool.samples[0].at + 20 * 3600;
        assert_eq!(pool.quote_at(later, m.gap).buyable_price(), Some(0.035));
    }

    #[test]
    fn malformed_csv_names_file_line_and_column() {
        let text = "Time,InstanceType,Region,AZ,SPS,IF,OndemandPrice,SpotPrice,Savings\n\
                    2024-01-01 00:00:00,c5.large,eu-central-1,euc1-az1,3,3.0,0.097,0.0547,43\n\
                    2024-01-01 01:00:00,c5.large,eu-central-1,euc1-az1,3,3.0,0.097,abc,43\n";
        let err = parse_trace("bad.csv", text, &ReadOptions::default()).unwrap_err();
        let message = err.to_string();
        assert!(
            message.contains("bad.csv line 3 column 8 (SpotPrice)"),
            "{message}"
        );
        assert!(message.contains("abc"), "{message}");

        let sentinel = text.replace("abc", "-1.0");
        let TraceFile::Market(m) =
            parse_trace("gap.csv", &sentinel, &ReadOptions::default()).unwrap()
        else {
            panic!("market expected")
        };
        assert_eq!(m.pools[0].samples[1].price, None, "SpotLake's -1 is a gap");
        let negative = text.replace("abc", "-2.5");
        assert!(parse_trace("neg.csv", &negative, &ReadOptions::default()).is_err());

        let zero = text.replace("abc", "0");
        let err = parse_trace("zero.csv", &zero, &ReadOptions::default()).unwrap_err();
        assert!(err.to_string().contains("positive"), "{err}");
        // finite and positive as read, but 0 or infinite as the grid's 32-bit float: refused
        for (tiny, value) in [("tiny.csv", "1e-50"), ("huge.csv", "5e38")] {
            let err = parse_trace(tiny, &text.replace("abc", value), &ReadOptions::default())
                .unwrap_err();
            assert!(
                err.to_string()
                    .contains(&format!("{tiny} line 3 column 8 (SpotPrice)")),
                "{err}"
            );
        }

        let short = "region,instance_type,on_demand_usd_hr\nus-east-1,m5.large\n";
        let err = parse_trace("short.csv", short, &ReadOptions::default()).unwrap_err();
        assert!(matches!(err, TraceError::ParseCsv { line: 2, .. }), "{err}");

        let backwards = "timestamp_utc,z_available,z_spot_usd_hr\n2023-02-15T22:08:16Z,1,1.0\n2023-02-15T22:08:16Z,1,1.0\n";
        let err = parse_trace("b.csv", backwards, &p3_options()).unwrap_err();
        assert!(
            matches!(err, TraceError::OrderSamples { line: 3, .. }),
            "{err}"
        );

        let bad_time = "timestamp_utc,z_available,z_spot_usd_hr\nyesterday,1,1.0\n";
        let err = parse_trace("t.csv", bad_time, &p3_options()).unwrap_err();
        assert!(
            err.to_string()
                .contains("t.csv line 2 column 1 (timestamp_utc)"),
            "{err}"
        );

        let err = parse_trace("u.csv", "a,b,c\n1,2,3\n", &ReadOptions::default()).unwrap_err();
        assert!(matches!(err, TraceError::DetectFormat { .. }), "{err}");
    }

    #[test]
    fn malformed_json_names_line_and_column() {
        let text = "{\n  \"SpotPriceHistory\": [\n    {\"AvailabilityZone\": \"a\", \"InstanceType\": \"m5.large\", \"SpotPrice\": \"-1\", \"Timestamp\": \"2024-01-01T00:00:00Z\"}\n  ]\n}";
        let err = parse_trace("h.json", text, &ReadOptions::default()).unwrap_err();
        let TraceError::ParseJson { line, column, .. } = &err else {
            panic!("json error expected, got {err}")
        };
        assert_eq!(*line, 3);
        assert!(*column > 40, "{err}");
        assert!(err.to_string().contains("SpotPrice"), "{err}");
        let tiny = text.replace("\"-1\"", "\"1e-50\"");
        let err = parse_trace("h.json", &tiny, &ReadOptions::default()).unwrap_err();
        assert!(
            matches!(err, TraceError::ParseJson { line: 3, .. }),
            "{err}"
        );
    }

    /// A file saved with a byte-order mark reads as without; a last page that says more follow
    /// is an error, not a silently shorter history.
    #[test]
    fn ec2_json_with_a_bom_reads_and_a_truncated_history_is_an_error() {
        let page = |token: &str| {
            format!(
                "{{\"SpotPriceHistory\": [{{\"AvailabilityZone\": \"us-east-1a\", \"InstanceType\": \"m5.large\", \"SpotPrice\": \"0.04\", \"Timestamp\": \"2024-01-01T00:00:00Z\"}}], \"NextToken\": {token}}}"
            )
        };
        let bom = format!("\u{feff}{}", page("\"\""));
        let m = market(parse_trace("bom.json", &bom, &ReadOptions::default()).unwrap());
        assert_eq!(m.pools.len(), 1);
        assert!(parse_trace("null.json", &page("null"), &ReadOptions::default()).is_ok());
        let err = parse_trace("cut.json", &page("\"abc\""), &ReadOptions::default()).unwrap_err();
        assert!(matches!(err, TraceError::ReadTruncated { .. }), "{err}");
        assert!(err.to_string().contains("cut.json"), "{err}");
        // in an array of pages only the last may not say more follow
        let pages = format!("[{}, {}]", page("\"abc\""), page("\"\""));
        assert!(parse_trace("pages.json", &pages, &ReadOptions::default()).is_ok());
    }

    use crate::test_data::spot_data;

    #[test]
    fn every_shared_trace_is_recognised_by_content() {
        let dir = spot_data();
        let read = |name: &str| {
            read_trace(&dir.join(name), &ReadOptions::default()).unwrap_or_else(|e| {
                panic!("{e} (set EBBFLOW_SPOT_DATA to the shared spot data directory)")
            })
        };
        let p3 = market(read(
            "aws_p3.2xlarge_availability_price_9az_2023-02-15_to_03-09.csv",
        ));
        assert_eq!(p3.pools.len(), 9);
        assert!(
            p3.pools
                .iter()
                .all(|p| p.samples.len() == 9778 && p.has_availability)
        );
        let spotlake = market(read("aws_spotlake_hourly_2024-01_5regions.csv"));
        assert_eq!(spotlake.pools.len(), 72);
        assert!(spotlake.pools.iter().all(|p| p.samples.len() == 744));
        let gcp = market(read("gcp_spot_on_demand_price_history_2022-2026.csv"));
        assert!(gcp.pools.len() >= 40, "{}", gcp.pools.len());
        assert!(
            gcp.pools
                .iter()
                .all(|p| p.info.on_demand_usd_hr.is_some() && p.info.vcpus >= 8.0)
        );
        assert!(
            matches!(read("aws_spot_advisor_linux_snapshot.csv"), TraceFile::Advisor(a) if a.entries.len() == 14_962)
        );
        assert!(
            matches!(read("aws_on_demand_prices_us-east-1.csv"), TraceFile::OnDemand(t) if t[0].prices.len() > 1000)
        );
        assert!(
            matches!(read("aws_instance_specs.csv"), TraceFile::Specs(t) if t.specs.len() == 929)
        );
    }
}
