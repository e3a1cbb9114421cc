//! `ebbflow-elastic-bench`: issue 4's elasticity measurements, every ratio from one run.
//!
//! 1. **Seed 003 fig. 4.15 at small scale**: MF (MovieLens 100K with `EBBFLOW_DATA_DIR`, else the
//!    seeded synthetic set) on 1 reliable node; 6 transient nodes join at iteration 11 and 4 of
//!    them leave with notice at iteration 35. Writes the time per iteration as CSV and prints the
//!    join and eviction iterations against the median of their neighbours.
//! 2. **Notice to safe**: the integer-exact app with 64 MiB of parameters over 1 reliable and
//!    4 transient nodes (stage 2, two ActivePSs); one ActivePS leaves with notice. Prints the time
//!    from the notice until every affected partition serves from its new owner, and checks the
//!    table is exact.
//!
//! Every node is a thread of this process with its own TCP data-plane server on 127.0.0.1 (the
//! in-process elastic engine, `ebbflow_runtime::elastic`): joins add no cores here, so the figures
//! measure the cost of reconfiguring, not the speed-up of more machines.

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Parser;

use ebbflow_runtime::apps::named::{NamedApp, build_named_app};
use ebbflow_runtime::elastic::{
    ElasticConfig, ElasticEvent, ScheduledEvent, StageThresholds, run_elastic,
};
use ebbflow_runtime::exact::{ExactApp, ExactConfig};
use ebbflow_runtime::metrics::RuntimeMetrics;
use ebbflow_runtime::worker::JobConfig;

/// Command-line arguments.
#[derive(Debug, Parser)]
#[command(about = "ebbflow elasticity benchmark: fig. 4.15 at small scale and notice-to-safe time")]
struct Args {
    /// Directory with the real data sets (scripts/fetch-data.sh); synthetic MF without it.
    #[arg(long, env = "EBBFLOW_DATA_DIR")]
    data: Option<PathBuf>,
    /// Where to write the per-iteration CSV.
    #[arg(long, default_value = "elastic-fig415.csv")]
    csv: PathBuf,
    /// Worker threads (logical workers) of the fig. 4.15 run.
    #[arg(long, default_value_t = 2)]
    workers: usize,
    /// Parameter bytes of the notice-to-safe run (MiB).
    #[arg(long, default_value_t = 64)]
    mib: u64,
}

fn names(prefix: &str, range: std::ops::Range<usize>) -> Vec<String> {
    range.map(|i| format!("{prefix}-{i}")).collect()
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n == 0 {
        return f64::NAN;
    }
    if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}

/// The iteration's time against the median of up to 5 iterations on each side.
fn stall_ratio(seconds: &[f64], iteration: usize) -> f64 {
    let mut neighbours: Vec<f64> = (iteration.saturating_sub(5)
        ..(iteration + 6).min(seconds.len()))
        .filter(|&i| i != iteration)
        .map(|i| seconds[i])
        .collect();
    seconds[iteration] / median(&mut neighbours)
}

fn fig_4_15(args: &Args) -> anyhow::Result<()> {
    let name = if args.data.is_some() {
        "mf"
    } else {
        "mf-synthetic"
    };
    let NamedApp::Mf(app) = build_named_app(name, args.data.as_deref())? else {
        bail!("{name} is not matrix factorization");
    };
    let clocks = 50;
    let config = ElasticConfig {
        job: JobConfig {
            clocks,
            staleness: 0,
            workers: args.workers,
            partitions: 8,
            ..JobConfig::default()
        },
        thresholds: StageThresholds::default(),
        backup_every: 5,
        reliable: vec!["od-0".into()],
        transient: Vec::new(),
    };
    let events = [
        ScheduledEvent {
            at_clock: 11,
            event: ElasticEvent::Join {
                names: names("spot", 0..6),
            },
        },
        ScheduledEvent {
            at_clock: 35,
            event: ElasticEvent::Notice {
                names: names("spot", 0..4),
                lead: Duration::from_secs(120),
            },
        },
    ];
    let report = run_elastic(&app, &config, &events, &RuntimeMetrics::unregistered())?;
    let seconds = &report.run.clock_seconds;
    let mut csv = std::fs::File::create(&args.csv)
        .with_context(|| format!("creating {}", args.csv.display()))?;
    writeln!(csv, "iteration,seconds,stage,transient_nodes")?;
    for (iteration, s) in seconds.iter().enumerate() {
        let segment = report
            .segments
            .iter()
            .rev()
            .find(|seg| seg.first_clock as usize <= iteration)
            .context("every iteration belongs to a segment")?;
        writeln!(
            csv,
            "{iteration},{s:.6},{},{}",
            segment.stage, segment.transient_nodes
        )?;
    }
    println!(
        "## fig. 4.15 at small scale ({name}, {} workers, BSP)",
        args.workers
    );
    println!();
    println!("| figure | value |");
    println!("|---|---|");
    println!(
        "| join iteration (11) ÷ median of neighbours | {:.3} |",
        stall_ratio(seconds, 11)
    );
    println!(
        "| eviction iteration (35) ÷ median of neighbours | {:.3} |",
        stall_ratio(seconds, 35)
    );
    println!(
        "| first iteration after a BackupPS copy (21) ÷ median of neighbours | {:.3} |",
        stall_ratio(seconds, 21)
    );
    println!(
        "| median seconds per iteration | {:.4} |",
        median(&mut seconds.clone())
    );
    println!(
        "| final test RMSE | {:.4} |",
        report.run.eval.metric("rmse").unwrap_or(f64::NAN)
    );
    println!(
        "| segments / partitions moved / rollbacks | {} / {} / {} |",
        report.segments.len(),
        report.partitions_migrated,
        report.rollbacks
    );
    let segments = report.segments.len().max(1) as f64;
    let mean = |f: fn(&ebbflow_runtime::elastic::SegmentRecord) -> f64| {
        report.segments.iter().map(f).sum::<f64>() / segments
    };
    println!(
        "| mean segment setup / teardown seconds | {:.4} / {:.4} |",
        mean(|s| s.setup_seconds),
        mean(|s| s.teardown_seconds)
    );
    println!("| per-iteration CSV | {} |", args.csv.display());
    println!();
    Ok(())
}

fn notice_to_safe(args: &Args) -> anyhow::Result<()> {
    // rows × width × 4 bytes = the requested size, in one table.
    let width = 64usize;
    let rows = args.mib * 1024 * 1024 / (width as u64 * 4);
    let clocks = 4;
    let app = ExactApp::new(ExactConfig {
        rows,
        width,
        tables: 1,
        shared_rows: 8,
        clocks,
        staleness: 0,
        clock_delay: std::time::Duration::ZERO,
    });
    let config = ElasticConfig {
        job: JobConfig {
            clocks,
            staleness: 0,
            workers: 4,
            partitions: 8,
            ..JobConfig::default()
        },
        thresholds: StageThresholds::default(),
        backup_every: 1,
        reliable: vec!["od-0".into()],
        transient: names("spot", 0..4),
    };
    let events = [ScheduledEvent {
        at_clock: 2,
        event: ElasticEvent::Notice {
            names: vec!["spot-0".into()],
            lead: Duration::from_secs(120),
        },
    }];
    let report = run_elastic(&app, &config, &events, &RuntimeMetrics::unregistered())?;
    let wrong = report.run.eval.metric("wrong_values").unwrap_or(f64::NAN);
    if wrong != 0.0 {
        bail!("the exact app ended with {wrong} wrong values");
    }
    let safe = report
        .notice_to_safe_seconds
        .first()
        .copied()
        .context("the notice was acted on")?;
    let moved = report
        .segments
        .iter()
        .find(|s| s.first_clock == 2)
        .map_or(0, |s| s.partitions_moved);
    println!(
        "## notice to safe ({} MiB over 1 reliable + 4 transient, stage 2)",
        report.run.parameter_bytes / (1024 * 1024)
    );
    println!();
    println!("| figure | value |");
    println!("|---|---|");
    println!("| partitions moved by the notice | {moved} |");
    println!("| notice → every affected partition safe | {safe:.3} s |");
    println!("| target | ≤ 2 s |");
    println!("| table exact after the move | yes |");
    println!();
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    fig_4_15(&args)?;
    notice_to_safe(&args)?;
    Ok(())
}
