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
    /// Nodes that joined so far.
    pub joins: u64,
    /// Notices applied in time so far.
    pub notices: u64,
    /// Notices that came too late to hand over so far (the node's state was lost).
    pub late_notices: u64,
    /// Nodes that failed without notice so far.
    pub failures: u64,
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
    /// `--notice-floor`: the shortest wall-clock lead a replayed notice is stretched to.
    pub notice_floor_seconds: f64,
    /// The shortest wall-clock lead a notice of this run was given (none: no notice came).
    pub shortest_notice_lead_seconds: Option<f64>,
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
            notice_floor_seconds: 0.0,
            shortest_notice_lead_seconds: None,
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

    /// The summary with the notice floor and the shortest lead a notice was given.
    pub fn with_notice_leads(self, floor: f64, shortest: Option<f64>) -> Self {
        Self {
            notice_floor_seconds: floor,
            shortest_notice_lead_seconds: shortest,
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
             {}{}\
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
            self.shortest_notice_lead_seconds.map_or(String::new(), |lead| format!(
                "notices: the shortest reached the runtime {lead:.2} s ahead (--notice-floor {} s)\n",
                self.notice_floor_seconds
            )),
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
        "wall_seconds,trace_seconds,clock,loss,stage,reliable_nodes,transient_nodes,spent_usd,on_demand_equivalent_usd,evictions,partitions_migrated,rollbacks,joins,notices,late_notices,failures\n",
    );
    for p in series {
        let _ = writeln!(
            csv,
            "{:.3},{:.0},{},{:.6},{},{},{},{:.4},{:.4},{},{},{},{},{},{},{}",
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
            p.rollbacks,
            p.joins,
            p.notices,
            p.late_notices,
            p.failures
        );
    }
    put("timeseries.csv", csv)?;
    let svg =
        chart(summary, series).map_err(|e| ("chart.svg".to_owned(), std::io::Error::other(e)))?;
    put("chart.svg", svg)
}

/// Three stacked panels over trace hours: the training loss (rollbacks marked), nodes per tier
/// as steps with a marker at every join, notice, late notice, failure and rollback and the
/// AgileML stage as bands, and the spend against the on-demand equivalent.
fn chart(summary: &RunSummary, series: &[TimePoint]) -> Result<String, ebbflow_plot::PlotError> {
    use ebbflow_plot::{Band, Color, Figure, Layout, Line, Mark, Panel, Points, Shape};
    let hours = |p: &TimePoint| p.trace_seconds / 3600.0;
    // the loss gauge reads 0 until the first clock: leave those samples out
    let loss: Vec<(f64, f64)> = series
        .iter()
        .filter(|p| p.clock > 0 && p.loss.is_finite())
        .map(|p| (hours(p), p.loss))
        .collect();
    // where a cumulative count went up: (hours, transient nodes then)
    let rises = |count: fn(&TimePoint) -> u64| -> Vec<(f64, f64)> {
        series
            .windows(2)
            .filter(|w| count(&w[1]) > count(&w[0]))
            .map(|w| (hours(&w[1]), w[1].transient_nodes as f64))
            .collect()
    };
    let rollbacks = rises(|p| p.rollbacks);
    // the stage gauge reads 0 until the first layout
    let stage_name = |stage: i64| match stage {
        0 => "starting".to_owned(),
        n => format!("stage {n}"),
    };
    let mut stages: Vec<Band> = Vec::new();
    for (p, next) in series.iter().zip(series.iter().skip(1)) {
        match stages.last_mut() {
            Some(band) if band.label == stage_name(p.stage) => band.to = hours(next),
            _ => stages.push(Band {
                from: hours(p),
                to: hours(next),
                label: stage_name(p.stage),
                color: match p.stage {
                    0 => Color::GREY,
                    1 => Color::BLUE,
                    2 => Color::GREEN,
                    _ => Color::PURPLE,
                },
            }),
        }
    }
    let events = [
        ("join", Color::GREEN, Shape::Circle, rises(|p| p.joins)),
        (
            "notice in time",
            Color::ORANGE,
            Shape::Triangle,
            rises(|p| p.notices),
        ),
        (
            "late notice",
            Color::RED,
            Shape::Triangle,
            rises(|p| p.late_notices),
        ),
        ("failure", Color::RED, Shape::Cross, rises(|p| p.failures)),
        ("rollback", Color::PURPLE, Shape::Cross, rollbacks.clone()),
    ];
    let x_label = "trace hours".to_owned();
    let figure = Figure {
        title: format!(
            "ebbflow run {}: ${:.2} spent vs ${:.2} on-demand ({:.0}%)",
            summary.job,
            summary.cost_usd,
            summary.on_demand_equivalent_usd,
            100.0 * summary.cost_ratio
        ),
        width: 900,
        panel_height: 250,
        layout: Layout::Rows,
        footnote: Some(format!(
            "{} clocks in {:.0} s wall; {} partitions migrated, {} rollbacks ({} clocks redone); markers on the transient line",
            summary.clocks,
            summary.wall_seconds,
            summary.partitions_migrated,
            summary.rollbacks,
            summary.clocks_redone
        )),
        panels: vec![
            Panel {
                title: "training loss".into(),
                x_label: x_label.clone(),
                y_label: "mean loss".into(),
                lines: vec![Line::new("training loss", Color::BLUE, loss)],
                marks: rollbacks
                    .iter()
                    .map(|&(x, _)| Mark {
                        x,
                        text: String::new(),
                        label: Some("rollback".into()),
                        color: Color::PURPLE,
                    })
                    .collect(),
                ..Panel::default()
            },
            Panel {
                title: "nodes per tier, membership events and AgileML stage".into(),
                x_label: x_label.clone(),
                y_label: "nodes".into(),
                y_from_zero: true,
                lines: vec![
                    Line::new(
                        "reliable",
                        Color::GREY,
                        series
                            .iter()
                            .map(|p| (hours(p), p.reliable_nodes as f64))
                            .collect(),
                    )
                    .steps(),
                    Line::new(
                        "transient",
                        Color::BROWN,
                        series
                            .iter()
                            .map(|p| (hours(p), p.transient_nodes as f64))
                            .collect(),
                    )
                    .steps(),
                ],
                points: events
                    .into_iter()
                    .filter(|(_, _, _, at)| !at.is_empty())
                    .map(|(label, color, shape, points)| Points {
                        label: label.into(),
                        points,
                        color,
                        shape,
                    })
                    .collect(),
                bands: stages,
                ..Panel::default()
            },
            Panel {
                title: "spend".into(),
                x_label,
                y_label: "USD".into(),
                y_from_zero: true,
                lines: vec![
                    Line::new(
                        "spent",
                        Color::RED,
                        series.iter().map(|p| (hours(p), p.spent_usd)).collect(),
                    ),
                    Line::new(
                        "on-demand equivalent",
                        Color::GREY,
                        series
                            .iter()
                            .map(|p| (hours(p), p.on_demand_equivalent_usd))
                            .collect(),
                    )
                    .dashed(),
                ],
                ..Panel::default()
            },
        ],
    };
    figure.svg()
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
