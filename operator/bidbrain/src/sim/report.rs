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
        (dir.join("cost.svg"), svg(study, summaries)),
    ];
    for (path, content) in &paths {
        write_file(path, content)?;
    }
    Ok(paths.into_iter().map(|(p, _)| p).collect())
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// A grouped bar chart: cost (left) and runtime (right) relative to on-demand only, one
/// group per job length, one bar per strategy.
pub fn svg(study: &Study, summaries: &[Summary]) -> String {
    const COLORS: [&str; Strategy::ALL.len()] = [
        "#7f7f7f", "#1f77b4", "#2ca02c", "#d62728", "#ff7f0e", "#9467bd",
    ];
    let mut lengths: Vec<f64> = summaries.iter().map(|s| s.job_hours).collect();
    lengths.dedup();
    let (panel_w, panel_h, top, left) = (420.0, 260.0, 50.0, 50.0);
    let width = left + 2.0 * (panel_w + 40.0);
    let height = top + panel_h + 50.0 + 16.0 * Strategy::ALL.len() as f64;
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(out, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        out,
        r#"<text x="{left}" y="20" font-size="14">{} — billing {}</text>"#,
        escape(&study.source),
        study.billing
    );
    for (panel, (title, value)) in [
        (
            "cost relative to on-demand only",
            (|s: &Summary| s.cost_relative) as fn(&Summary) -> f64,
        ),
        ("runtime relative to on-demand only", |s: &Summary| {
            s.runtime_relative
        }),
    ]
    .into_iter()
    .enumerate()
    {
        let x0 = left + panel as f64 * (panel_w + 40.0);
        let max = summaries.iter().map(value).fold(1.0_f64, f64::max) * 1.1;
        let _ = writeln!(out, r#"<text x="{x0}" y="{}">{title}</text>"#, top - 8.0);
        let _ = writeln!(
            out,
            r#"<line x1="{x0}" y1="{}" x2="{}" y2="{}" stroke="black"/>"#,
            top + panel_h,
            x0 + panel_w,
            top + panel_h
        );
        for tick in 0..=4 {
            let v = max * f64::from(tick) / 4.0;
            let y = top + panel_h - panel_h * v / max;
            let _ = writeln!(
                out,
                r##"<line x1="{x0}" y1="{y:.1}" x2="{}" y2="{y:.1}" stroke="#ddd"/><text x="{}" y="{:.1}" text-anchor="end">{v:.2}</text>"##,
                x0 + panel_w,
                x0 - 4.0,
                y + 4.0
            );
        }
        let group_w = panel_w / lengths.len().max(1) as f64;
        for (g, hours) in lengths.iter().enumerate() {
            let bars: Vec<&Summary> = summaries.iter().filter(|s| s.job_hours == *hours).collect();
            let bar_w = (group_w - 20.0) / bars.len().max(1) as f64;
            for (b, s) in bars.iter().enumerate() {
                let v = value(s);
                let h = panel_h * v / max;
                let x = x0 + g as f64 * group_w + 10.0 + b as f64 * bar_w;
                let _ = writeln!(
                    out,
                    r#"<rect x="{x:.1}" y="{:.1}" width="{:.1}" height="{h:.1}" fill="{}"><title>{}: {v:.3}</title></rect>"#,
                    top + panel_h - h,
                    bar_w - 2.0,
                    COLORS[b % COLORS.len()],
                    escape(s.strategy.name())
                );
            }
            let _ = writeln!(
                out,
                r#"<text x="{:.1}" y="{}" text-anchor="middle">{hours} h jobs</text>"#,
                x0 + g as f64 * group_w + group_w / 2.0,
                top + panel_h + 16.0
            );
        }
    }
    for (i, strategy) in Strategy::ALL.iter().enumerate() {
        let y = top + panel_h + 40.0 + 16.0 * i as f64;
        let _ = writeln!(
            out,
            r#"<rect x="{left}" y="{:.1}" width="12" height="12" fill="{}"/><text x="{}" y="{y:.1}">{}</text>"#,
            y - 10.0,
            COLORS[i],
            left + 18.0,
            escape(strategy.name())
        );
    }
    out.push_str("</svg>\n");
    out
}
