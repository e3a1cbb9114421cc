//! Summaries, the text table, CSV files and the SVG chart of a study.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use super::{Strategy, Study};
use crate::market::trace::format_time;

/// Averages of one strategy at one job length.
#[derive(Clone, Debug, PartialEq)]
pub struct Summary {
    /// Job length in hours.
    pub job_hours: f64,
    /// The strategy.
    pub strategy: Strategy,
    /// Runs averaged.
    pub runs: usize,
    /// Mean cost relative to on-demand only.
    pub cost_relative: f64,
    /// Mean runtime relative to on-demand only.
    pub runtime_relative: f64,
    /// Mean cost in USD.
    pub cost_usd: f64,
    /// Mean on-demand instance-hours.
    pub on_demand_hours: f64,
    /// Mean paid spot instance-hours.
    pub paid_spot_hours: f64,
    /// Mean free (refunded) spot instance-hours.
    pub free_hours: f64,
    /// Mean evictions per job.
    pub evictions: f64,
    /// Runs that outlived the trace and finished on on-demand.
    pub outside_trace: usize,
}

/// Averages per job length and strategy, in the study's order.
pub fn summarize(study: &Study) -> Vec<Summary> {
    let mut lengths: Vec<f64> = study.starts.iter().map(|s| s.job_hours).collect();
    lengths.sort_by(f64::total_cmp);
    lengths.dedup();
    let mut out = Vec::new();
    for hours in lengths {
        let starts: Vec<_> = study
            .starts
            .iter()
            .filter(|s| s.job_hours == hours)
            .collect();
        let n = starts.len().max(1) as f64;
        for (index, &strategy) in Strategy::ALL.iter().enumerate() {
            let mean = |f: &dyn Fn(&super::StartResult) -> f64| {
                starts.iter().map(|s| f(s)).sum::<f64>() / n
            };
            out.push(Summary {
                job_hours: hours,
                strategy,
                runs: starts.len(),
                cost_relative: mean(&|s| s.runs[index].cost_usd / s.baseline.cost_usd),
                runtime_relative: mean(&|s| {
                    s.runs[index].runtime_seconds / s.baseline.runtime_seconds
                }),
                cost_usd: mean(&|s| s.runs[index].cost_usd),
                on_demand_hours: mean(&|s| s.runs[index].on_demand_hours),
                paid_spot_hours: mean(&|s| s.runs[index].paid_spot_hours),
                free_hours: mean(&|s| s.runs[index].free_hours),
                evictions: mean(&|s| f64::from(s.runs[index].evictions)),
                outside_trace: starts
                    .iter()
                    .filter(|s| !s.runs[index].completed_in_trace)
                    .count(),
            });
        }
    }
    out
}

/// The targets of issue 5 at one job length.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Targets {
    /// Job length in hours.
    pub job_hours: f64,
    /// BidBrain + AgileML cost / standard + AgileML cost (target < 1).
    pub versus_standard_agileml: f64,
    /// BidBrain + AgileML cost / standard + checkpoint cost (target < 1).
    pub versus_standard_checkpoint: f64,
    /// BidBrain + AgileML cost per work / hindsight bound (target ≤ 1.3): the ratio to the
    /// hindsight optimum is at most this.
    pub versus_hindsight: f64,
    /// BidBrain + AgileML cost per work / the hindsight schedule's: the ratio to the hindsight
    /// optimum is at least this (the schedule is achievable, so the optimum costs no more).
    pub versus_schedule: f64,
}

/// How BidBrain + AgileML stands against the hindsight optimum, which lies between the lower
/// bound and the hindsight schedule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HindsightVerdict {
    /// Within 1.3× even of the lower bound.
    Met,
    /// Over 1.3× even of the achievable schedule.
    Missed,
    /// Within 1.3× of the schedule, not of the bound.
    Undecided,
}

impl Targets {
    /// The hindsight target (≤ 1.3× the optimum) as far as the bracket decides it.
    pub fn hindsight(&self) -> HindsightVerdict {
        if self.versus_hindsight <= 1.3 {
            HindsightVerdict::Met
        } else if self.versus_schedule > 1.3 {
            HindsightVerdict::Missed
        } else {
            HindsightVerdict::Undecided
        }
    }

    /// Whether every target is met.
    pub fn met(&self) -> bool {
        self.versus_standard_agileml < 1.0
            && self.versus_standard_checkpoint < 1.0
            && self.hindsight() == HindsightVerdict::Met
    }
}

/// Targets per job length, from mean costs (every strategy does the same work).
pub fn targets(summaries: &[Summary]) -> Vec<Targets> {
    let mut lengths: Vec<f64> = summaries.iter().map(|s| s.job_hours).collect();
    lengths.dedup();
    lengths
        .into_iter()
        .filter_map(|hours| {
            let cost = |strategy: Strategy| {
                summaries
                    .iter()
                    .find(|s| s.job_hours == hours && s.strategy == strategy)
                    .map(|s| s.cost_usd)
            };
            let bidbrain = cost(Strategy::BidBrainAgileMl)?;
            Some(Targets {
                job_hours: hours,
                versus_standard_agileml: bidbrain / cost(Strategy::StandardAgileMl)?,
                versus_standard_checkpoint: bidbrain / cost(Strategy::StandardCheckpoint)?,
                versus_hindsight: bidbrain / cost(Strategy::Hindsight)?,
                versus_schedule: bidbrain / cost(Strategy::HindsightSchedule)?,
            })
        })
        .collect()
}

/// The text report: eviction-model score, one table per job length, the targets.
pub fn table(study: &Study, summaries: &[Summary]) -> String {
    let mut out = String::new();
    let score = &study.eviction_score;
    let _ = writeln!(
        out,
        "trace {} · billing {} · reference {} · grid {} s · training slice until {}",
        study.source,
        study.billing,
        study.reference_type,
        study.step_seconds,
        format_time(study.train_end)
    );
    let _ = writeln!(
        out,
        "eviction model on the later slice ({} launch×bid outcomes, {:.1}% evicted within 1 h): Brier {:.4} vs constant-rate {:.4}; log-likelihood {:.4} vs {:.4}",
        score.outcomes,
        100.0 * score.eviction_rate,
        score.model.brier,
        score.naive.brier,
        score.model.log_likelihood,
        score.naive.log_likelihood
    );
    let _ = writeln!(out, "{}", study.application);
    let mut lengths: Vec<f64> = summaries.iter().map(|s| s.job_hours).collect();
    lengths.dedup();
    for hours in lengths {
        let _ = writeln!(out);
        let runs = summaries
            .iter()
            .find(|s| s.job_hours == hours)
            .map_or(0, |s| s.runs);
        let _ = writeln!(
            out,
            "{hours} h jobs, {runs} random starts (means; cost and runtime relative to on-demand only)"
        );
        let _ = writeln!(
            out,
            "{:<30} {:>9} {:>9} {:>12} {:>12} {:>10} {:>10} {:>9}",
            "strategy",
            "cost",
            "runtime",
            "on-demand h",
            "paid spot h",
            "free h",
            "evictions",
            "past end"
        );
        for s in summaries.iter().filter(|s| s.job_hours == hours) {
            let _ = writeln!(
                out,
                "{:<30} {:>9.3} {:>9.3} {:>12.1} {:>12.1} {:>10.1} {:>10.2} {:>9}",
                s.strategy.name(),
                s.cost_relative,
                s.runtime_relative,
                s.on_demand_hours,
                s.paid_spot_hours,
                s.free_hours,
                s.evictions,
                s.outside_trace
            );
        }
    }
    let _ = writeln!(out);
    for t in targets(summaries) {
        let _ = writeln!(
            out,
            "targets {} h: BidBrain + AgileML cost ÷ standard + AgileML {:.3} (<1 {}), ÷ standard + checkpoint/restart {:.3} (<1 {}), ÷ hindsight optimum between {:.3} (÷ hindsight schedule) and {:.3} (÷ lower bound) (≤1.3 {})",
            t.job_hours,
            t.versus_standard_agileml,
            yes_no(t.versus_standard_agileml < 1.0),
            t.versus_standard_checkpoint,
            yes_no(t.versus_standard_checkpoint < 1.0),
            t.versus_schedule,
            t.versus_hindsight,
            match t.hindsight() {
                HindsightVerdict::Met => "met",
                HindsightVerdict::Missed => "MISSED",
                HindsightVerdict::Undecided => "undecided: the bracket spans 1.3",
            }
        );
    }
    for (hours, m) in movement(study) {
        let _ = writeln!(
            out,
            "market under {hours} h jobs (the pool standard starts in, over standard + AgileML's runtime): its price changed in {} of {} starts, another pool was cheaper per work at some point in {}; holding the cheapest pool per work at every slot, moves free, would save {:.3}% of its spend (mean)",
            m.price_changed,
            m.starts,
            m.overtaken,
            100.0 * m.move_saving
        );
    }
    out
}

/// Counts of [`super::Movement`] over the starts of one job length.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct MovementSummary {
    /// Starts.
    pub starts: usize,
    /// Starts whose start pool's price changed during the job.
    pub price_changed: usize,
    /// Starts in which another pool became cheaper per work.
    pub overtaken: usize,
    /// Mean share of the start pool's spend that free moves to the cheapest pool would save.
    pub move_saving: f64,
}

/// [`MovementSummary`] per job length.
pub fn movement(study: &Study) -> Vec<(f64, MovementSummary)> {
    let mut lengths: Vec<f64> = study.starts.iter().map(|s| s.job_hours).collect();
    lengths.sort_by(f64::total_cmp);
    lengths.dedup();
    lengths
        .into_iter()
        .map(|hours| {
            let mut m = MovementSummary::default();
            for s in study.starts.iter().filter(|s| s.job_hours == hours) {
                m.starts += 1;
                m.price_changed += usize::from(s.movement.price_changed);
                m.overtaken += usize::from(s.movement.overtaken);
                m.move_saving += s.movement.move_saving;
            }
            m.move_saving /= m.starts.max(1) as f64;
            (hours, m)
        })
        .collect()
}

fn yes_no(ok: bool) -> &'static str {
    if ok { "met" } else { "MISSED" }
}

/// Errors writing outputs.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// A file could not be written.
    #[error("write {path}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
}

fn write_file(path: &Path, content: &str) -> Result<(), ReportError> {
    let mut file = std::fs::File::create(path).map_err(|source| ReportError::Write {
        path: path.to_path_buf(),
        source,
    })?;
    file.write_all(content.as_bytes())
        .map_err(|source| ReportError::Write {
            path: path.to_path_buf(),
            source,
        })
}

/// `notes` as `note: …` lines after a blank line (nothing without notes).
pub fn note_lines(notes: &[String]) -> String {
    if notes.is_empty() {
        return String::new();
    }
    let mut text = String::from("\n");
    for note in notes {
        text.push_str(&format!("note: {note}\n"));
    }
    text
}

/// Write `runs.csv` (one row per start, length and strategy), `summary.csv`, `report.txt`
/// and `cost.svg` into `dir` (created if missing); returns the paths written. `notes` (how the
/// market was completed, e.g. on-demand prices borrowed from another region) end the report as
/// `note:` lines, as on stdout.
pub fn write_outputs(
    study: &Study,
    summaries: &[Summary],
    notes: &[String],
    dir: &Path,
) -> Result<Vec<PathBuf>, ReportError> {
    std::fs::create_dir_all(dir).map_err(|source| ReportError::Write {
        path: dir.to_path_buf(),
        source,
    })?;
    let mut runs = String::from(
        "job_hours,start_utc,strategy,cost_usd,cost_relative,runtime_hours,runtime_relative,on_demand_hours,paid_spot_hours,free_hours,evictions,completed_in_trace\n",
    );
    for start in &study.starts {
        for (strategy, run) in Strategy::ALL.iter().zip(&start.runs) {
            let _ = writeln!(
                runs,
                "{},{},{},{:.4},{:.5},{:.4},{:.5},{:.3},{:.3},{:.3},{},{}",
                start.job_hours,
                format_time(start.start),
                strategy.name(),
                run.cost_usd,
                run.cost_usd / start.baseline.cost_usd,
                run.runtime_seconds / 3600.0,
                run.runtime_seconds / start.baseline.runtime_seconds,
                run.on_demand_hours,
                run.paid_spot_hours,
                run.free_hours,
                run.evictions,
                run.completed_in_trace
            );
        }
    }
    let mut summary = String::from(
        "job_hours,strategy,runs,cost_relative,runtime_relative,cost_usd,on_demand_hours,paid_spot_hours,free_hours,evictions,past_trace_end\n",
    );
    for s in summaries {
        let _ = writeln!(
            summary,
            "{},{},{},{:.5},{:.5},{:.4},{:.3},{:.3},{:.3},{:.3},{}",
            s.job_hours,
            s.strategy.name(),
            s.runs,
            s.cost_relative,
            s.runtime_relative,
            s.cost_usd,
            s.on_demand_hours,
            s.paid_spot_hours,
            s.free_hours,
            s.evictions,
            s.outside_trace
        );
    }
    let paths = [
        (dir.join("runs.csv"), runs),
        (dir.join("summary.csv"), summary),
        (
            dir.join("report.txt"),
            table(study, summaries) + &note_lines(notes),
        ),
        (
            dir.join("cost.svg"),
            svg(study, summaries).map_err(|e| ReportError::Write {
                path: dir.join("cost.svg"),
                source: std::io::Error::other(e),
            })?,
        ),
    ];
    for (path, content) in &paths {
        write_file(path, content)?;
    }
    Ok(paths.into_iter().map(|(p, _)| p).collect())
}

/// A grouped bar chart: cost (left) and runtime (right) relative to on-demand only, one
/// group per job length, one bar per strategy.
pub fn svg(study: &Study, summaries: &[Summary]) -> Result<String, ebbflow_plot::PlotError> {
    use ebbflow_plot::{Bars, Color, Figure, Layout, Panel};
    let mut lengths: Vec<f64> = summaries.iter().map(|s| s.job_hours).collect();
    lengths.dedup();
    let panel = |title: &str, value: fn(&Summary) -> f64| Panel {
        title: title.to_owned(),
        x_label: "job length (hours of on-demand work)".into(),
        y_label: "relative to on-demand only".into(),
        bars: Some(Bars {
            groups: lengths.iter().map(|h| format!("{h} h jobs")).collect(),
            series: Strategy::ALL
                .iter()
                .enumerate()
                .map(|(i, strategy)| {
                    let values = lengths
                        .iter()
                        .map(|h| {
                            summaries
                                .iter()
                                .find(|s| s.job_hours == *h && s.strategy == *strategy)
                                .map_or(f64::NAN, value)
                        })
                        .collect();
                    (
                        strategy.name().to_owned(),
                        Color::PALETTE[i % Color::PALETTE.len()],
                        values,
                    )
                })
                .collect(),
        }),
        ..Panel::default()
    };
    Figure {
        title: format!("{} — billing {}", study.source, study.billing),
        width: 1240,
        panel_height: 420,
        layout: Layout::Columns,
        footnote: Some(format!(
            "means over {} random start times per job length",
            study.starts.len() / lengths.len().max(1)
        )),
        panels: vec![
            panel("cost", |s| s.cost_relative),
            panel("runtime", |s| s.runtime_relative),
        ],
    }
    .svg()
}
