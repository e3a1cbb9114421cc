//! `ebbflow-elastic-bench`: issue 4's elasticity measurements, every ratio from one run.
//!
//! 1. **Seed 003 fig. 4.15 at small scale**: MF (MovieLens 100K with `EBBFLOW_DATA_DIR`, else the
//!    seeded synthetic set) at the seed's rank 1000 (`--rank`) on 1 reliable node; 6 transient
//!    nodes join at iteration 11 and 4 of them leave with notice at iteration 35. Writes the time
//!    per iteration of every run as CSV (`--csv`) and plots it as SVG (`--plot`), and prints the
//!    join, switch and eviction iterations against the median of their neighbours.
//! 2. **Notice to safe**: the integer-exact app with 64 MiB of parameters over 1 reliable and
//!    4 transient nodes (stage 2, two ActivePSs); one ActivePS leaves with notice. Prints the time
//!    from the notice until every affected partition serves from its new owner, and checks the
//!    table is exact.
//! 3. **Stages under limited bandwidth** (`--stages`, run alone): MF on a fixed number of nodes
//!    at transient:reliable ratios 1:1, 3:1 and 7:1, each ratio in stage 1, 2 and 3 (forced with
//!    `StageThresholds::forced`), every node limited to `--bandwidth-limit-mbps` each way (a
//!    worker's exchange with a server on another node is charged to both nodes, within a node to
//!    neither; a BackupPS copy to its sender and its receiver). Prints seconds per iteration per
//!    (ratio, stage), the winner per ratio and stage 1's time over the best, after a reliable-only
//!    run of the same nodes (0:1, stage 1: the reference a ratio's throughput is relative to).
//!    With `--calibration-out FILE` it also writes what it measured as JSON for `ebbflow simulate
//!    --calibration` (format `ebbflow-calibration/1`, documented in docs/bidder.md).
//!
//! Every node is a thread of this process with its own TCP data-plane server on 127.0.0.1 (the
//! in-process elastic engine, `ebbflow_runtime::elastic`): joins add no cores here, so the figures
//! measure the cost of reconfiguring, not the speed-up of more machines.

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Parser;
use ebbflow_plot::{Color, Figure, Layout, Line, Mark, Panel, Points, Shape};

use ebbflow_runtime::apps::named::{NamedApp, build_named_app};
use ebbflow_runtime::elastic::{
    ElasticConfig, ElasticEvent, LocalFleet, ScheduledEvent, StageThresholds, run_elastic,
    run_elastic_on,
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
    /// Fig. 4.15 runs: one iteration's ratio to its neighbours is a single sample, so the
    /// figures are the median over the runs (with their range).
    #[arg(long, default_value_t = 5)]
    repeats: usize,
    /// MF rank (latent factors). Fig. 4.15 runs at the seed's (1000, its MF on Netflix) unless
    /// given; the stage comparison at the `mf` app's (32) unless given. A smaller rank makes
    /// each iteration and partition proportionally smaller: at 32 an iteration takes
    /// milliseconds, where a boundary's fixed cost is a large share of it.
    #[arg(long)]
    rank: Option<usize>,
    /// Where to write the fig. 4.15 plot (SVG: time per iteration of every run, their median,
    /// and where the join, the switch, the eviction and the BackupPS copies fall).
    #[arg(long, default_value = "elastic-fig415.svg")]
    plot: PathBuf,
    /// Parameter bytes of the notice-to-safe run (MiB).
    #[arg(long, default_value_t = 64)]
    mib: u64,
    /// Run only the stage comparison under limited bandwidth.
    #[arg(long)]
    stages: bool,
    /// Stage comparison: every node's bandwidth in Mbit/s each way.
    #[arg(long, default_value_t = 100.0)]
    bandwidth_limit_mbps: f64,
    /// Stage comparison: nodes (reliable + transient), the same at every ratio.
    #[arg(long, default_value_t = 8)]
    nodes: usize,
    /// Stage comparison: iterations per run (the first two are not counted).
    #[arg(long, default_value_t = 30)]
    stage_clocks: u64,
    /// Stage comparison: clocks between BackupPS copies in stages 2 and 3.
    #[arg(long, default_value_t = 5)]
    backup_every: u64,
    /// Stage comparison: also write the measurements as a calibration file (JSON) here.
    #[arg(long)]
    calibration_out: Option<PathBuf>,
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
    seconds[iteration] / neighbours_median(seconds, iteration)
}

/// `iteration`'s seconds minus the median of its ±5 neighbours.
fn stall_extra(seconds: &[f64], iteration: usize) -> f64 {
    seconds[iteration] - neighbours_median(seconds, iteration)
}

fn neighbours_median(seconds: &[f64], iteration: usize) -> f64 {
    let mut neighbours: Vec<f64> = (iteration.saturating_sub(5)
        ..(iteration + 6).min(seconds.len()))
        .filter(|&i| i != iteration)
        .map(|i| seconds[i])
        .collect();
    median(&mut neighbours)
}

/// Per iteration, the median of its seconds over the runs (that reached it).
fn per_iteration_median(runs: &[Vec<f64>]) -> Vec<f64> {
    let longest = runs.iter().map(Vec::len).max().unwrap_or(0);
    (0..longest)
        .map(|i| {
            median(
                &mut runs
                    .iter()
                    .filter_map(|r| r.get(i).copied())
                    .collect::<Vec<_>>(),
            )
        })
        .collect()
}

/// The fig. 4.15 plot: milliseconds per iteration of every run (thin grey lines) and their
/// median (a thick line), with dashed vertical lines at `marks` (iteration, label) and markers at
/// the BackupPS `copies`. The y axis runs to 1.5 × the highest median past iteration 0 (the
/// first iteration pulls every row), so a single slow sample does not flatten the rest: points
/// above it are drawn at the top edge.
fn fig_figure(
    runs: &[Vec<f64>],
    marks: &[(usize, String)],
    copies: &[usize],
    title: &str,
) -> Figure {
    let medians = per_iteration_median(runs);
    let n = medians.len().max(2);
    let top = medians
        .iter()
        .skip(1)
        .copied()
        .filter(|s| s.is_finite())
        .fold(0.0f64, f64::max)
        * 1.5
        * 1000.0;
    let top = if top > 0.0 { top } else { 1.0 };
    let ms = |seconds: &[f64]| -> Vec<(f64, f64)> {
        seconds
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let ms = if s.is_finite() {
                    (s * 1000.0).clamp(0.0, top)
                } else {
                    top
                };
                (i as f64, ms)
            })
            .collect()
    };
    let mut lines: Vec<Line> = runs
        .iter()
        .enumerate()
        .map(|(i, run)| {
            let line = Line::new("each run", Color::LIGHT_GREY, ms(run)).width(1);
            if i == 0 { line } else { line.unlabelled() }
        })
        .collect();
    lines.push(Line::new("median of the runs", Color::DARK_BLUE, ms(&medians)).width(3));
    let copies: Vec<(f64, f64)> = copies
        .iter()
        .filter(|&&c| c < n)
        .map(|&c| (c as f64, 0.0))
        .collect();
    Figure {
        title: title.to_owned(),
        width: 900,
        panel_height: 440,
        layout: Layout::Rows,
        footnote: None,
        panels: vec![Panel {
            title: String::new(),
            x_label: "iteration".into(),
            y_label: "ms per iteration".into(),
            x_range: Some((0.0, (n - 1) as f64)),
            y_range: Some((0.0, top)),
            lines,
            points: if copies.is_empty() {
                Vec::new()
            } else {
                vec![Points {
                    label: "BackupPS copy".into(),
                    points: copies,
                    color: Color::GREEN,
                    shape: Shape::Triangle,
                }]
            },
            marks: marks
                .iter()
                .filter(|(i, _)| *i < n)
                .map(|(i, text)| Mark {
                    x: *i as f64,
                    text: text.clone(),
                    label: None,
                    color: Color::RED,
                })
                .collect(),
            ..Panel::default()
        }],
    }
}

/// The first clock run with transient nodes in the layout.
fn report_switch(report: &ebbflow_runtime::elastic::ElasticReport) -> Option<usize> {
    report
        .segments
        .iter()
        .find(|segment| segment.transient_nodes > 0)
        .map(|segment| segment.first_clock as usize)
}

/// The MF rank of the seed's experiments (MF on Netflix at rank 1000, seed 003 §4.4), fig. 4.15's.
const PAPER_RANK: usize = 1000;

/// MF on MovieLens 100K with `--data`, else on the seeded synthetic set, at `rank` (the app's
/// own without); and its name.
fn mf_app(
    args: &Args,
    rank: Option<usize>,
) -> anyhow::Result<(&'static str, ebbflow_runtime::apps::mf::MfApp)> {
    let name = if args.data.is_some() {
        "mf"
    } else {
        "mf-synthetic"
    };
    let NamedApp::Mf(app) = build_named_app(name, args.data.as_deref(), 0)? else {
        bail!("{name} is not matrix factorization");
    };
    // The seed's iteration is a pass: time per iteration stays comparable with fig. 4.15 (and
    // with earlier figures), whatever slice of a pass a training job's clock is.
    let app = app.with_config(ebbflow_runtime::apps::mf::MfConfig {
        clocks_per_pass: Some(1),
        ..app.config().clone()
    })?;
    let Some(rank) = rank else {
        return Ok((name, app));
    };
    if rank == 0 {
        bail!("--rank must be at least 1");
    }
    let config = ebbflow_runtime::apps::mf::MfConfig {
        rank,
        ..app.config().clone()
    };
    Ok((name, app.with_config(config)?))
}

/// A fig. 4.15 iteration that takes a BackupPS copy in the background (copies every 5 clocks
/// from clock 0, in every stage: the copy at clock c is each partition's image once all of
/// clock c - 1's pushes landed, taken while iteration c runs), clear of the join and eviction.
const COPY_ITERATION: usize = 20;

fn fig_4_15(args: &Args) -> anyhow::Result<()> {
    let (name, app) = mf_app(args, Some(args.rank.unwrap_or(PAPER_RANK)))?;
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
        backup_interval: None,
        backup_bandwidth: None,
        start: None,
        checkpoint: None,
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
    if args.repeats == 0 {
        bail!("--repeats must be at least 1");
    }
    // Per run: join, eviction and post-copy ratios, the join iteration's extra seconds, the
    // switch iteration's ratio and extra seconds, and the switch iteration.
    let mut runs: Vec<[f64; 7]> = Vec::with_capacity(args.repeats);
    let mut every: Vec<Vec<f64>> = Vec::with_capacity(args.repeats);
    let mut report = None;
    for _ in 0..args.repeats {
        let run = run_elastic(&app, &config, &events, &RuntimeMetrics::unregistered())?;
        let seconds = &run.run.clock_seconds;
        // The joined nodes are prepared in the background (servers started, connections opened)
        // and switched in at a later boundary: the first clock with transient nodes.
        let switch = report_switch(&run).context("the joined nodes were never switched in")?;
        runs.push([
            stall_ratio(seconds, 11),
            stall_ratio(seconds, 35),
            stall_ratio(seconds, COPY_ITERATION),
            stall_extra(seconds, 11),
            stall_ratio(seconds, switch),
            stall_extra(seconds, switch),
            switch as f64,
        ]);
        every.push(seconds.clone());
        report = Some(run);
    }
    let report = report.context("at least one run")?;
    let seconds = &report.run.clock_seconds;
    let mut csv = std::fs::File::create(&args.csv)
        .with_context(|| format!("creating {}", args.csv.display()))?;
    // seconds, stage and transient_nodes are the last run's; then the median over the runs and
    // each run's seconds.
    let run_columns: String = (1..=every.len()).map(|r| format!(",run_{r}")).collect();
    writeln!(
        csv,
        "iteration,seconds,stage,transient_nodes,median_seconds{run_columns}"
    )?;
    let medians = per_iteration_median(&every);
    for (iteration, s) in seconds.iter().enumerate() {
        let segment = report
            .segments
            .iter()
            .rev()
            .find(|seg| seg.first_clock as usize <= iteration)
            .context("every iteration belongs to a segment")?;
        let runs: String = every
            .iter()
            .map(|run| {
                run.get(iteration)
                    .map_or(",".into(), |s| format!(",{s:.6}"))
            })
            .collect();
        writeln!(
            csv,
            "{iteration},{s:.6},{},{},{:.6}{runs}",
            segment.stage, segment.transient_nodes, medians[iteration]
        )?;
    }
    let mut switch_median: Vec<f64> = runs.iter().map(|r| r[6]).collect();
    let marks = [
        (11, "6 join".to_owned()),
        (
            median(&mut switch_median).round() as usize,
            "switch".to_owned(),
        ),
        (35, "4 evicted".to_owned()),
    ];
    let copies: Vec<usize> = (1..)
        .map(|k| k * config.backup_every as usize)
        .take_while(|&c| c < seconds.len())
        .collect();
    let title = format!(
        "fig. 4.15 at small scale: {name}, rank {}, 1 reliable + 6 transient, {} runs",
        app.config().rank,
        every.len()
    );
    let svg = fig_figure(&every, &marks, &copies, &title).svg()?;
    std::fs::write(&args.plot, svg).with_context(|| format!("writing {}", args.plot.display()))?;
    println!(
        "## fig. 4.15 at small scale ({name}, rank {}, {} workers, BSP, {} runs)",
        app.config().rank,
        args.workers,
        args.repeats
    );
    println!();
    println!("| figure (median over the runs, range in parentheses) | value |");
    println!("|---|---|");
    let summary = |column: usize, digits: usize| {
        let mut values: Vec<f64> = runs.iter().map(|r| r[column]).collect();
        let low = values.iter().copied().fold(f64::INFINITY, f64::min);
        let high = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        format!(
            "{:.digits$} ({low:.digits$}–{high:.digits$})",
            median(&mut values)
        )
    };
    println!(
        "| join iteration (11) ÷ median of neighbours | {} |",
        summary(0, 3)
    );
    println!(
        "| join iteration (11) minus median of neighbours, seconds | {} |",
        summary(3, 4)
    );
    println!(
        "| switch iteration (joined nodes prepared, first clock in stage 2: {}) ÷ median of neighbours | {} |",
        summary(6, 0),
        summary(4, 3)
    );
    println!(
        "| switch iteration minus median of neighbours, seconds | {} |",
        summary(5, 4)
    );
    println!(
        "| eviction iteration (35) ÷ median of neighbours | {} |",
        summary(1, 3)
    );
    println!(
        "| iteration of a BackupPS copy ({COPY_ITERATION}) ÷ median of neighbours | {} |",
        summary(2, 3)
    );
    println!("| (rows below: the last run) | |");
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
    println!(
        "| plot of time per iteration (SVG) | {} |",
        args.plot.display()
    );
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
        update_period: 1,
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
        backup_interval: None,
        backup_bandwidth: None,
        start: None,
        checkpoint: None,
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

/// Mean seconds per iteration of one MF run with `reliable` + `transient` nodes in `stage`.
fn seconds_per_iteration(
    args: &Args,
    app: &ebbflow_runtime::apps::mf::MfApp,
    reliable: usize,
    transient: usize,
    stage: u8,
) -> anyhow::Result<f64> {
    let config = ElasticConfig {
        job: JobConfig {
            clocks: args.stage_clocks,
            staleness: 0,
            // One logical worker per node (stage 3 moves the reliable tier's to transient nodes).
            workers: args.nodes,
            // The paper's partitioning: half the most nodes there can be.
            partitions: args.nodes.div_ceil(2) as u32,
            // Each logical worker stands for one node's worker, with its own traffic: the
            // per-process cache would merge the whole in-process fleet into one group.
            process_cache: false,
            ..JobConfig::default()
        },
        thresholds: StageThresholds::forced(stage),
        backup_every: args.backup_every,
        backup_interval: None,
        backup_bandwidth: None,
        start: None,
        checkpoint: None,
        reliable: names("od", 0..reliable),
        transient: names("spot", 0..transient),
    };
    let metrics = RuntimeMetrics::unregistered();
    let mut fleet = LocalFleet::start(app, &config.job, &metrics, std::time::Instant::now())?
        .with_bandwidth_limit(args.bandwidth_limit_mbps);
    let report = run_elastic_on(app, &config, &[], None, &mut fleet, &metrics)?;
    let ran: Vec<u8> = report.segments.iter().map(|s| s.stage).collect();
    if ran.iter().any(|&s| s != stage) {
        bail!("asked for stage {stage}, ran {ran:?}");
    }
    let counted = &report.run.clock_seconds[2.min(report.run.clock_seconds.len())..];
    Ok(counted.iter().sum::<f64>() / counted.len().max(1) as f64)
}

fn stages(args: &Args) -> anyhow::Result<()> {
    let (name, app) = mf_app(args, args.rank)?;
    if args.nodes < 2 {
        bail!("--nodes must be at least 2 (a reliable and a transient node)");
    }
    println!(
        "## stages 1, 2, 3 at {} Mbit/s per node ({name}, {} nodes, {} logical workers, BSP, \
         BackupPS copy every {} clocks, mean of iterations 2..{})",
        args.bandwidth_limit_mbps, args.nodes, args.nodes, args.backup_every, args.stage_clocks
    );
    println!();
    println!(
        "| transient:reliable | nodes (R + T) | stage 1 s/it | stage 2 s/it | stage 3 s/it | \
         winner | stage 1 ÷ best | throughput ÷ 0:1 |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    // 0:1 first: every node reliable, one stage (no transient node to move work to)
    let mut reference = None;
    let mut measured = Vec::new();
    for ratio in [0usize, 1, 3, 7] {
        let reliable = (args.nodes / (ratio + 1)).max(1);
        let transient = args.nodes - reliable;
        if measured.iter().any(|m: &serde_json::Value| {
            m["reliable_nodes"] == reliable && m["transient_nodes"] == transient
        }) {
            // with few nodes two ratios round to the same split: measure it once
            continue;
        }
        let stages_run: &[u8] = if transient == 0 { &[1] } else { &[1, 2, 3] };
        let mut times = Vec::new();
        for &stage in stages_run {
            times.push((
                stage,
                seconds_per_iteration(args, &app, reliable, transient, stage)?,
            ));
        }
        let (best_stage, best) = times
            .iter()
            .copied()
            .min_by(|a, b| a.1.total_cmp(&b.1))
            .context("a stage ran")?;
        let reference = *reference.get_or_insert(best);
        let cell = |stage: u8| {
            times
                .iter()
                .find(|t| t.0 == stage)
                .map_or("—".to_owned(), |t| format!("{:.4}", t.1))
        };
        println!(
            "| {ratio}:1 | {reliable} + {transient} | {} | {} | {} | stage {best_stage} | \
             {:.2} | {:.3} |",
            cell(1),
            cell(2),
            cell(3),
            times[0].1 / best,
            reference / best
        );
        measured.push(serde_json::json!({
            "reliable_nodes": reliable,
            "transient_nodes": transient,
            "stages": times
                .iter()
                .map(|(stage, s)| serde_json::json!({"stage": stage, "seconds_per_iteration": s}))
                .collect::<Vec<_>>(),
            "best_stage": best_stage,
        }));
    }
    println!();
    if let Some(path) = &args.calibration_out {
        let file = serde_json::json!({
            "format": "ebbflow-calibration/1",
            "app": name,
            "nodes": args.nodes,
            "bandwidth_mbps_per_node": args.bandwidth_limit_mbps,
            "clocks": args.stage_clocks,
            "counted_from_clock": 2,
            "backup_every": args.backup_every,
            "ratios": measured,
        });
        let text = serde_json::to_string_pretty(&file)? + "\n";
        std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
        println!("calibration written to {}", path.display());
        println!();
    }
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if args.stages {
        return stages(&args);
    }
    fig_4_15(&args)?;
    notice_to_safe(&args)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_median_per_iteration_takes_every_run_that_reached_it() {
        let runs = vec![vec![1.0, 4.0, 9.0], vec![3.0, 2.0], vec![2.0, 6.0, 1.0]];
        assert_eq!(per_iteration_median(&runs), vec![2.0, 4.0, 5.0]);
        assert!(per_iteration_median(&[]).is_empty());
    }

    #[test]
    fn the_plot_draws_every_run_the_median_and_the_marks() {
        let runs = vec![
            vec![0.5, 0.010, 0.011, 0.030, 0.010],
            vec![0.4, 0.012, 0.010, 0.020, 0.011],
        ];
        let marks = [
            (3, "4 evicted".to_owned()),
            (9, "beyond the end".to_owned()),
        ];
        let figure = fig_figure(&runs, &marks, &[2, 4, 7], "rank <1000> & more");
        let panel = &figure.panels[0];
        // two runs (one legend entry for both) and the median
        assert_eq!(panel.lines.len(), 3);
        assert_eq!(panel.lines.iter().filter(|l| l.label.is_some()).count(), 2);
        // Only the marks and copies inside the 5 iterations are drawn.
        assert_eq!(panel.marks.len(), 1);
        assert_eq!(panel.marks[0].text, "4 evicted");
        assert_eq!(panel.points[0].points, vec![(2.0, 0.0), (4.0, 0.0)]);
        // The axis tops at 1.5 × the highest median past iteration 0 (0.025 s → 37.5 ms);
        // iteration 0's 0.45 s is drawn at the top edge, not scaled to.
        let top = panel.y_range.unwrap().1;
        assert!((top - 37.5).abs() < 1e-9, "{top}");
        assert_eq!(panel.lines[2].points[0], (0.0, top));
        let svg = figure.svg().unwrap();
        assert!(svg.contains("4 evicted") && !svg.contains("beyond the end"));
        assert!(svg.contains("rank &lt;1000&gt; &amp; more"));
    }
}
