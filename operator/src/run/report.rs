//! What `ebbflow run` writes: `summary.json`, `timeseries.csv` and `chart.svg`.

use std::fmt::Write as _;
use std::path::Path;

use ebbflow_runtime::elastic::ElasticReport;

use super::replay::Bill;
use ebbflow_bidbrain::bidder::{AppModel, MeasurementCounts};

/// One sample of a run, taken every replayed market slot.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct TimePoint {
    /// Wall seconds since the start.
    pub wall_seconds: f64,
    /// Trace seconds since the replay's start.
    pub trace_seconds: f64,
    /// Training clocks completed.
    pub clock: u64,
    /// Latest mean training loss.
    pub loss: f64,
    /// AgileML stage.
    pub stage: i64,
    /// Reliable nodes.
    pub reliable_nodes: i64,
    /// Transient nodes.
    pub transient_nodes: i64,
    /// Spent so far under the billing model.
    pub spent_usd: f64,
    /// The same instance-time at on-demand prices.
    pub on_demand_equivalent_usd: f64,
    /// Evictions so far (allocations taken back).
    pub evictions: u64,
    /// Partitions that changed owner so far.
    pub partitions_migrated: u64,
    /// Rollbacks so far.
    pub rollbacks: u64,
}

/// The result of a run (`summary.json`).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct RunSummary {
    /// The job's name.
    pub job: String,
    /// Clocks trained.
    pub clocks: u64,
    /// Whether it stopped early (Ctrl-C, wall-clock limit, target loss, budget).
    pub stopped_early: bool,
    /// Why `ebbflow run` stopped it early: `wallClockLimit`, `targetLoss` or `budgetTotal`
    /// (the spec field that was reached); none for Ctrl-C (see `interrupted`).
    pub stop_reason: Option<String>,
    /// Interrupted by Ctrl-C.
    pub interrupted: bool,
    /// Final quality: the app's evaluation metrics.
    pub quality: std::collections::BTreeMap<String, f64>,
    /// Final evaluation loss.
    pub loss: f64,
    /// Spent under the billing model, reliable tier included.
    pub cost_usd: f64,
    /// The same instance-time at on-demand prices.
    pub on_demand_equivalent_usd: f64,
    /// `cost_usd / on_demand_equivalent_usd`.
    pub cost_ratio: f64,
    /// Free spot instance-hours (refunds).
    pub free_hours: f64,
    /// Trace seconds replayed.
    pub trace_seconds: f64,
    /// Wall seconds.
    pub wall_seconds: f64,
    /// Membership events applied, by kind.
    pub events: std::collections::BTreeMap<String, u64>,
    /// Partitions that changed owner.
    pub partitions_migrated: u64,
    /// Rollbacks after failures.
    pub rollbacks: u64,
    /// Clocks redone after rollbacks.
    pub clocks_redone: u64,
    /// Segments of static membership.
    pub segments: usize,
    /// Per boundary that applied notices in time: seconds from the first of them until every
    /// partition of the leaving nodes was installed on its new owner.
    pub notice_to_safe_seconds: Vec<f64>,
    /// The bidder's application model: the spec's and as re-estimated from the run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub app_model: Option<AppModelSummary>,
    /// Where the files went.
    pub output_dir: String,
}

/// The bidder's application model before and after the run re-estimated it (ν in clocks per
/// vCPU per trace second, σ and λ in wall seconds; `bidder::probe`).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct AppModelSummary {
    /// From the spec's `bidding.overrides` (ν in the spec's own unit).
    pub spec: AppModel,
    /// As re-estimated from the run at its end.
    pub calibrated: AppModel,
    /// What the calibration was fed.
    pub measurements: MeasurementCounts,
    /// The model the bidder's last decision used: `calibrated`, or `spec` with
    /// `--no-recalibrate`.
    pub decided_with: AppModel,
}

impl RunSummary {
    /// The summary of a finished run.
    pub fn new(
        job: &str,
        report: &ElasticReport,
        bill: Bill,
        trace_seconds: f64,
        wall_seconds: f64,
        interrupted: bool,
        out: &Path,
    ) -> Self {
        let clocks = report
            .stopped_at
            .unwrap_or(report.run.clock_stats.len() as u64);
        Self {
            job: job.to_owned(),
            clocks,
            stopped_early: report.stopped_at.is_some(),
            stop_reason: None,
            interrupted,
            quality: report.run.eval.metrics.iter().cloned().collect(),
            loss: report.run.eval.loss,
            cost_usd: bill.spent_usd,
            on_demand_equivalent_usd: bill.on_demand_equivalent_usd,
            cost_ratio: if bill.on_demand_equivalent_usd > 0.0 {
                bill.spent_usd / bill.on_demand_equivalent_usd
            } else {
                f64::NAN
            },
            free_hours: bill.free_hours,
            trace_seconds,
            wall_seconds,
            events: report
                .events
                .iter()
                .map(|(k, v)| ((*k).to_owned(), *v))
                .collect(),
            partitions_migrated: report.partitions_migrated,
            rollbacks: report.rollbacks,
            clocks_redone: report.clocks_redone,
            segments: report.segments.len(),
            notice_to_safe_seconds: report.notice_to_safe_seconds.clone(),
            app_model: None,
            output_dir: out.display().to_string(),
        }
    }

    /// The summary with the spec field that stopped the run.
    pub fn with_stop_reason(self, reason: Option<&str>) -> Self {
        Self {
            stop_reason: reason.map(str::to_owned),
            ..self
        }
    }

    /// The summary with the run's application model.
    pub fn with_app_model(self, app_model: AppModelSummary) -> Self {
        Self {
            app_model: Some(app_model),
            ..self
        }
    }

    /// A few lines for the terminal.
    pub fn text(&self) -> String {
        let quality: Vec<String> = self
            .quality
            .iter()
            .map(|(k, v)| format!("{k} {v:.4}"))
            .collect();
        let app_model = self.app_model.as_ref().map_or(String::new(), |m| {
            let (app, fed) = (&m.calibrated, &m.measurements);
            format!(
                "bidder model: ν {:.4} clocks per vCPU-second, φ {:.3}, σ {:.0} s, λ {:.0} s \
                 from {} steady intervals ({} waiting for ν), {} additions, {} eviction stalls\n",
                app.nu_per_vcpu_second,
                app.phi,
                app.sigma_seconds,
                app.lambda_seconds,
                fed.steady,
                fed.waiting,
                fed.additions,
                fed.evictions
            )
        });
        format!(
            "job {}: {} clocks{} in {:.1} s wall ({:.1} trace hours)\n\
             quality: {}\n\
             cost: ${:.2} vs ${:.2} on-demand equivalent ({:.0}% of it), {:.1} free spot hours\n\
             elasticity: {} events {:?}, {} partitions migrated, {} rollbacks ({} clocks redone), {} segments{}\n\
             {}\
             wrote {}/summary.json, timeseries.csv, chart.svg\n",
            self.job,
            self.clocks,
            match (self.stopped_early, &self.stop_reason) {
                (true, Some(reason)) => format!(" (stopped early: {reason} reached)"),
                (true, None) => " (stopped early)".to_owned(),
                (false, _) => String::new(),
            },
            self.wall_seconds,
            self.trace_seconds / 3600.0,
            quality.join(", "),
            self.cost_usd,
            self.on_demand_equivalent_usd,
            100.0 * self.cost_ratio,
            self.free_hours,
            self.events.values().sum::<u64>(),
            self.events,
            self.partitions_migrated,
            self.rollbacks,
            self.clocks_redone,
            self.segments,
            notices_line(&self.notice_to_safe_seconds),
            app_model,
            self.output_dir
        )
    }
}

/// `; notice → safe median M s, max X s over N hand-overs`, or nothing without one.
fn notices_line(seconds: &[f64]) -> String {
    if seconds.is_empty() {
        return String::new();
    }
    let mut sorted = seconds.to_vec();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    let median = if n % 2 == 1 {
        sorted[n / 2]
    } else {
        (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
    };
    format!(
        "; notice → safe median {median:.3} s, max {:.3} s over {n} hand-over{}",
        sorted[n - 1],
        if n == 1 { "" } else { "s" }
    )
}

/// Writes the three files; on failure returns the path and the error.
pub fn write(
    out: &Path,
    summary: &RunSummary,
    series: &[TimePoint],
) -> Result<(), (String, std::io::Error)> {
    let put = |name: &str, text: String| {
        let path = out.join(name);
        std::fs::write(&path, text).map_err(|e| (path.display().to_string(), e))
    };
    let json = serde_json::to_string_pretty(summary)
        .map_err(|e| ("summary.json".to_owned(), std::io::Error::other(e)))?;
    put("summary.json", json + "\n")?;
    let mut csv = String::from(
        "wall_seconds,trace_seconds,clock,loss,stage,reliable_nodes,transient_nodes,spent_usd,on_demand_equivalent_usd,evictions,partitions_migrated,rollbacks\n",
    );
    for p in series {
        let _ = writeln!(
            csv,
            "{:.3},{:.0},{},{:.6},{},{},{},{:.4},{:.4},{},{},{}",
            p.wall_seconds,
            p.trace_seconds,
            p.clock,
            p.loss,
            p.stage,
            p.reliable_nodes,
            p.transient_nodes,
            p.spent_usd,
            p.on_demand_equivalent_usd,
            p.evictions,
            p.partitions_migrated,
            p.rollbacks
        );
    }
    put("timeseries.csv", csv)?;
    put("chart.svg", chart(summary, series))
}

/// Three stacked panels over trace hours: loss, nodes per tier, cumulative spend (with the
/// on-demand equivalent dashed).
fn chart(summary: &RunSummary, series: &[TimePoint]) -> String {
    const W: f64 = 720.0;
    const PANEL: f64 = 160.0;
    const LEFT: f64 = 70.0;
    const TOP: f64 = 40.0;
    let hours: Vec<f64> = series.iter().map(|p| p.trace_seconds / 3600.0).collect();
    let max_hours = hours.iter().copied().fold(1e-9, f64::max);
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"{LEFT}\" y=\"22\" font-size=\"14\">ebbflow run {}: ${:.2} spent vs ${:.2} on-demand</text>\n",
        TOP + 3.0 * (PANEL + 30.0),
        summary.job,
        summary.cost_usd,
        summary.on_demand_equivalent_usd
    );
    // (title, [(label, colour, values)])
    type Panel<'a> = (&'a str, Vec<(&'a str, &'a str, Vec<f64>)>);
    let panels: [Panel<'_>; 3] = [
        (
            "training loss",
            vec![("loss", "#1f77b4", series.iter().map(|p| p.loss).collect())],
        ),
        (
            "nodes",
            vec![
                (
                    "reliable",
                    "#2ca02c",
                    series.iter().map(|p| p.reliable_nodes as f64).collect(),
                ),
                (
                    "transient",
                    "#ff7f0e",
                    series.iter().map(|p| p.transient_nodes as f64).collect(),
                ),
            ],
        ),
        (
            "cumulative $",
            vec![
                (
                    "spent",
                    "#d62728",
                    series.iter().map(|p| p.spent_usd).collect(),
                ),
                (
                    "on-demand equivalent",
                    "#7f7f7f",
                    series.iter().map(|p| p.on_demand_equivalent_usd).collect(),
                ),
            ],
        ),
    ];
    for (index, (title, lines)) in panels.iter().enumerate() {
        let top = TOP + index as f64 * (PANEL + 30.0);
        let max = lines
            .iter()
            .flat_map(|(_, _, v)| v.iter().copied())
            .filter(|v| v.is_finite())
            .fold(1e-9, f64::max);
        let _ = writeln!(
            svg,
            "<rect x=\"{LEFT}\" y=\"{top}\" width=\"{}\" height=\"{PANEL}\" fill=\"none\" stroke=\"#ccc\"/>\n\
             <text x=\"5\" y=\"{}\">{title}</text><text x=\"5\" y=\"{}\">{max:.3}</text>",
            W - LEFT - 10.0,
            top + PANEL / 2.0,
            top + 12.0
        );
        for (line, (label, color, values)) in lines.iter().enumerate() {
            let points: Vec<String> = hours
                .iter()
                .zip(values)
                .filter(|(_, v)| v.is_finite())
                .map(|(h, v)| {
                    format!(
                        "{:.1},{:.1}",
                        LEFT + h / max_hours * (W - LEFT - 10.0),
                        top + PANEL - v / max * PANEL
                    )
                })
                .collect();
            let dash = if line == 1 && index == 2 {
                " stroke-dasharray=\"5,4\""
            } else {
                ""
            };
            let _ = writeln!(
                svg,
                "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"1.5\"{dash} points=\"{}\"/>\n\
                 <text x=\"{}\" y=\"{}\" fill=\"{color}\">{label}</text>",
                points.join(" "),
                W - 180.0,
                top + 14.0 + 14.0 * line as f64
            );
        }
    }
    let _ = writeln!(
        svg,
        "<text x=\"{LEFT}\" y=\"{}\">trace hours (0 – {max_hours:.2})</text>\n</svg>",
        TOP + 3.0 * (PANEL + 30.0) - 8.0
    );
    svg
}

#[cfg(test)]
mod tests {
    use super::notices_line;

    #[test]
    fn the_notices_line_gives_the_median_and_the_max_or_nothing() {
        assert_eq!(notices_line(&[]), "");
        assert_eq!(
            notices_line(&[0.5]),
            "; notice → safe median 0.500 s, max 0.500 s over 1 hand-over"
        );
        assert_eq!(
            notices_line(&[0.9, 0.1, 0.4, 0.2]),
            "; notice → safe median 0.300 s, max 0.900 s over 4 hand-overs"
        );
    }
}
