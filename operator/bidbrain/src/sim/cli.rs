//! The `ebbflow simulate` subcommand: arguments and the run behind them.

use std::path::{Path, PathBuf};

use indicatif::{ProgressBar, ProgressStyle};

use super::{SimConfig, SimError, report};
use crate::bidder::{Calibration, CalibrationError};
use crate::billing::{BillingError, BillingModel};
use crate::market::trace::{
    ReadOptions, TraceError, TraceFile, TraceFormat, detect_format, read_trace,
};
use crate::market::{MarketError, OnDemandTable, SpecTable};

/// Arguments of `ebbflow simulate`.
#[derive(clap::Args, Clone, Debug)]
pub struct SimulateArgs {
    /// Trace to replay (format detected from its content; see docs/traces.md).
    #[arg(long)]
    pub trace: PathBuf,
    /// Random start times per job length.
    #[arg(long, default_value_t = 1000)]
    pub starts: usize,
    /// Seed of the start times.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Directory for runs.csv, summary.csv, report.txt and cost.svg.
    #[arg(long, default_value = "ebbflow-simulate")]
    pub out: PathBuf,
    /// Job lengths in hours of on-demand-equivalent work, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = vec![2.0, 20.0])]
    pub hours: Vec<f64>,
    /// Billing model: aws, aws-hourly-2016, gcp or fixed (default: gcp for GCP traces, else aws).
    #[arg(long)]
    pub billing: Option<String>,
    /// Instances of the on-demand baseline; spot strategies hold at most this many.
    #[arg(long, default_value_t = 32)]
    pub cluster_size: u32,
    /// On-demand price list (default: a CSV beside the trace recognised as one by content).
    #[arg(long)]
    pub on_demand: Option<PathBuf>,
    /// Instance specs (default: a CSV beside the trace recognised as one by content).
    #[arg(long)]
    pub specs: Option<PathBuf>,
    /// Instance type of a zone availability+price trace (default: from its file name).
    #[arg(long)]
    pub instance_type: Option<String>,
    /// Worker threads (default: available cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Calibration file from `ebbflow-elastic-bench --stages --calibration-out FILE`: the
    /// measured throughput-vs-ratio table replaces the linear φ term (docs/bidder.md).
    #[arg(long)]
    pub calibration: Option<PathBuf>,
    /// Score BidBrain's allocations over one window without renewal, as eq. 4.2 does (an
    /// allocation evicted inside the window is worth nothing for the rest of it): the model
    /// before 2026-11-27, for comparison (docs/bidder.md, "Renewal").
    #[arg(long)]
    pub single_window: bool,
}

/// Errors of `ebbflow simulate`.
#[derive(Debug, thiserror::Error)]
pub enum SimulateError {
    /// A trace or table could not be read.
    #[error(transparent)]
    ReadTrace(#[from] TraceError),
    /// The billing model name is wrong.
    #[error(transparent)]
    ParseBilling(#[from] BillingError),
    /// The trace holds no prices over time.
    #[error("replay {file}: it is a {kind} table, not a price trace")]
    ReplayTable {
        /// The file.
        file: String,
        /// What it is.
        kind: &'static str,
    },
    /// A file given as a table holds something else.
    #[error("read {file}: given as the {expected} table, but its content is another format")]
    TableKind {
        /// The file.
        file: String,
        /// The table it was given as.
        expected: &'static str,
    },
    /// The market is incomplete.
    #[error(transparent)]
    CompleteMarket(#[from] MarketError),
    /// The study failed.
    #[error(transparent)]
    Simulate(#[from] SimError),
    /// Outputs could not be written.
    #[error(transparent)]
    WriteOutputs(#[from] report::ReportError),
    /// The calibration file is unusable.
    #[error(transparent)]
    Calibration(#[from] CalibrationError),
}

/// Tables beside `trace` recognised by content: (on-demand prices, specs).
fn sibling_tables(trace: &Path) -> (Vec<PathBuf>, Option<PathBuf>) {
    let mut on_demand = Vec::new();
    let mut specs = None;
    let dir = trace
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let Ok(entries) = std::fs::read_dir(dir) else {
        return (Vec::new(), None);
    };
    let mut paths: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_file())
        .collect();
    paths.sort();
    for path in paths {
        let Some(head) = first_line(&path) else {
            continue;
        };
        match detect_format(&head) {
            Some(TraceFormat::OnDemandPrices) => on_demand.push(path),
            Some(TraceFormat::InstanceSpecs) if specs.is_none() => specs = Some(path),
            _ => {}
        }
    }
    (on_demand, specs)
}

fn first_line(path: &Path) -> Option<String> {
    use std::io::BufRead;
    let file = std::fs::File::open(path).ok()?;
    let mut line = String::new();
    std::io::BufReader::new(file).read_line(&mut line).ok()?;
    Some(line)
}

/// Loads a price trace and completes it with the on-demand price and instance spec tables (given,
/// or found beside the trace by content: every on-demand list there, one per region or more).
/// Also returns the trace's detected format and the notes of [`crate::market::Market::complete`]
/// (on-demand prices borrowed from another region's list).
pub fn load_market(
    trace: &Path,
    instance_type: Option<String>,
    on_demand: Option<PathBuf>,
    specs: Option<PathBuf>,
) -> Result<(crate::market::Market, Option<TraceFormat>, Vec<String>), SimulateError> {
    let options = ReadOptions { instance_type };
    let file = trace.display().to_string();
    let format = first_line(trace).and_then(|l| detect_format(&l));
    let mut market = match read_trace(trace, &options)? {
        TraceFile::Market(market) => market,
        TraceFile::OnDemand(_) => {
            return Err(SimulateError::ReplayTable {
                file,
                kind: "on-demand price",
            });
        }
        TraceFile::Specs(_) => {
            return Err(SimulateError::ReplayTable {
                file,
                kind: "instance spec",
            });
        }
        TraceFile::Advisor(_) => {
            return Err(SimulateError::ReplayTable {
                file,
                kind: "Spot Advisor",
            });
        }
    };
    let (found_on_demand, found_specs) = sibling_tables(trace);
    // A file named on the command line that is not the table asked for is an error (before, it
    // was dropped without a word and vCPUs defaulted to 1); the siblings were found by content.
    let wrong = |path: &Path, expected| SimulateError::TableKind {
        file: path.display().to_string(),
        expected,
    };
    let mut tables: Vec<OnDemandTable> = Vec::new();
    for path in on_demand.map_or(found_on_demand, |path| vec![path]) {
        match read_trace(&path, &ReadOptions::default())? {
            TraceFile::OnDemand(regions) => tables.extend(regions),
            _ => return Err(wrong(&path, "on-demand price")),
        }
    }
    let specs: Option<SpecTable> = match specs.or(found_specs) {
        Some(path) => match read_trace(&path, &ReadOptions::default())? {
            TraceFile::Specs(table) => Some(table),
            _ => return Err(wrong(&path, "instance spec")),
        },
        None => None,
    };
    let notes = market.complete(&tables, specs.as_ref())?;
    Ok((market, format, notes))
}

/// Run `ebbflow simulate`: the report on stdout, files in `--out`, progress on stderr.
pub fn run(args: &SimulateArgs) -> Result<String, SimulateError> {
    let (market, format, notes) = load_market(
        &args.trace,
        args.instance_type.clone(),
        args.on_demand.clone(),
        args.specs.clone(),
    )?;
    let throughput = match &args.calibration {
        Some(path) => Some(Calibration::load(path)?.throughput_table()),
        None => None,
    };
    let billing = match &args.billing {
        Some(name) => name.parse::<BillingModel>()?,
        None if format == Some(TraceFormat::GcpPriceHistory) => BillingModel::Gcp,
        None => BillingModel::Aws,
    };
    let mut config = SimConfig {
        starts: args.starts,
        seed: args.seed,
        job_hours: args.hours.clone(),
        cluster_size: args.cluster_size,
        billing,
        throughput,
        ..SimConfig::default()
    };
    if let Some(threads) = args.threads {
        config.threads = threads;
    }
    config.bidder.renewal = !args.single_window;
    let total = (config.starts * config.job_hours.len() * super::Strategy::ALL.len()) as u64;
    let bar = ProgressBar::new(total);
    if let Ok(style) = ProgressStyle::with_template(
        "{spinner} simulate [{elapsed_precise}] {wide_bar} {pos}/{len} runs ({eta})",
    ) {
        bar.set_style(style);
    }
    let study = super::run_study(&market, &config, &|| bar.inc(1))?;
    bar.finish_and_clear();
    let summaries = report::summarize(&study);
    let paths = report::write_outputs(&study, &summaries, &notes, &args.out)?;
    let mut text = report::table(&study, &summaries);
    text.push_str(&report::note_lines(&notes));
    text.push('\n');
    for path in paths {
        text.push_str(&format!("wrote {}\n", path.display()));
    }
    Ok(text)
}
