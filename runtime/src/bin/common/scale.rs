//! What the scale benchmarks (`ebbflow-mf-scale`, `ebbflow-lda-scale`, `ebbflow-mlr-scale`)
//! share.

// Each bench includes this file as a module of its own, and not every bench uses every piece
// (ebbflow-lda-scale scores its own snapshots and reads its peers' line by line).
#![allow(dead_code)]

use std::path::Path;
use std::time::Instant;

use anyhow::Context;
use ebbflow_runtime::app::{App, EvalReport};
use ebbflow_runtime::apps::{BareLoop, BareWorker};
use ebbflow_runtime::local::run_single_process;
use ebbflow_runtime::metrics::RuntimeMetrics;
use ebbflow_runtime::worker::JobConfig;

/// Time to a quality bar: steps (passes, sweeps, iterations), training seconds (evaluation
/// excluded), the last quality measured and whether it met the bar.
#[derive(Debug, Clone, Copy)]
pub struct ToBar {
    pub steps: u64,
    pub seconds: f64,
    pub quality: f64,
    pub reached: bool,
}

impl ToBar {
    /// `12.3 s (4 passes, rmse 0.1968)`, or why the bar was not reached: `unit` names the
    /// steps, `metric` the quality, `missed` how the last quality compares to the bar (`>`
    /// for an error, `<` for a likelihood).
    pub fn text(&self, bar: f64, unit: &str, metric: &str, missed: &str) -> String {
        if self.reached {
            format!(
                "{:.1} s ({} {unit}, {metric} {:.4})",
                self.seconds, self.steps, self.quality
            )
        } else {
            format!(
                "not reached in {} {unit} ({:.1} s, {metric} {:.4} {missed} {bar:.4})",
                self.steps, self.seconds, self.quality
            )
        }
    }
}

/// A bench's measurements: each printed to stderr as it is taken, all of them to stdout as a
/// Markdown table at the end (what BENCHMARKS.md records).
#[derive(Debug, Default)]
pub struct Report {
    rows: Vec<(String, String)>,
}

impl Report {
    /// Records one measurement.
    pub fn add(&mut self, what: String, value: String) {
        eprintln!("{what:<70} {value}");
        self.rows.push((what, value));
    }

    /// Writes the table of every measurement to stdout.
    pub fn print_table(&self) -> std::io::Result<()> {
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        writeln!(out, "| measurement | value |\n|---|---|")?;
        for (what, value) in &self.rows {
            writeln!(out, "| {what} | {value} |")?;
        }
        Ok(())
    }
}

/// This process's peak resident memory (`VmHWM`) in MiB, NaN where unknown.
pub fn peak_rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|rest| rest.split_whitespace().next()?.parse::<f64>().ok())
        .map_or(f64::NAN, |kib| kib / 1024.0)
}

/// The worker threads a bench runs: `--threads`, else this machine's cores.
pub fn threads_or_cores(threads: Option<usize>) -> usize {
    threads.unwrap_or_else(|| {
        std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
    })
}

/// The test metric a bar is set on, as the app's evaluation names it.
#[derive(Debug, Clone, Copy)]
pub struct Metric {
    /// Its name in [`App::evaluate`]'s report (and in the peers' `--metric`).
    pub name: &'static str,
    pub higher_is_better: bool,
}

impl Metric {
    /// Its value in `report` (NaN where the report lacks it).
    pub fn of(&self, report: &EvalReport) -> f64 {
        report.metric(self.name).unwrap_or(f64::NAN)
    }

    /// Whether `quality` meets `bar`.
    pub fn meets(&self, quality: f64, bar: f64) -> bool {
        if self.higher_is_better {
            quality >= bar
        } else {
            quality <= bar
        }
    }

    /// `>=` or `<=`: how a quality meets the bar.
    pub fn relation(&self) -> &'static str {
        if self.higher_is_better { ">=" } else { "<=" }
    }

    /// How a quality that misses compares to the bar.
    pub fn missed(&self) -> &'static str {
        if self.higher_is_better { "<" } else { ">" }
    }
}

/// The bare loop on `app`, scored after every pass, until `metric` meets `bar` or `max_passes`
/// passes: its time to the bar (training only) and its updates per second.
pub fn bare_to_bar<A, W>(app: &A, metric: Metric, bar: f64, max_passes: u64) -> (ToBar, f64)
where
    A: App<Worker = W>,
    W: BareWorker,
{
    let mut bare = BareLoop::new(app);
    let per_pass = app.clocks_per_pass(1) as u64;
    let (mut seconds, mut quality, mut updates, mut passes) = (0.0, f64::NAN, 0u64, 0);
    while passes < max_passes && !metric.meets(quality, bar) {
        let start = Instant::now();
        for _ in 0..per_pass {
            updates += bare.clock().updates;
        }
        seconds += start.elapsed().as_secs_f64();
        passes += 1;
        quality = metric.of(&app.evaluate(bare.tables()));
        eprintln!(
            "bare loop: pass {passes}: {} {quality:.4} after {seconds:.1} s",
            metric.name
        );
    }
    let to_bar = ToBar {
        steps: passes,
        seconds,
        quality,
        reached: metric.meets(quality, bar),
    };
    (to_bar, updates as f64 / seconds)
}

/// The in-process parameter server on `app` with `workers` threads (BSP, 4 partitions, the
/// process cache), run for 1, 2, … passes until one run's final evaluation meets `bar` (each
/// run from scratch, its whole run timed: workers, tables, binding and training): its time to
/// the bar and its updates per second.
pub fn ps_to_bar<A: App>(
    app: &A,
    workers: usize,
    metric: Metric,
    bar: f64,
    max_passes: u64,
) -> anyhow::Result<(ToBar, f64)> {
    let per_pass = app.clocks_per_pass(workers) as u64;
    let mut last = None;
    for passes in 1..=max_passes {
        let config = JobConfig {
            clocks: passes * per_pass,
            staleness: 0,
            workers,
            partitions: 4,
            process_cache: true,
            ..JobConfig::default()
        };
        let run = run_single_process(app, &config, &RuntimeMetrics::unregistered())?;
        let quality = metric.of(&run.eval);
        let training: f64 = run.clock_seconds.iter().sum();
        eprintln!(
            "ps in-process, {workers} workers: {passes} passes ({} clocks): {} {quality:.4}, \
             {training:.1} s training, {:.1} s in all",
            config.clocks, metric.name, run.elapsed_seconds
        );
        let to_bar = ToBar {
            steps: passes,
            seconds: run.elapsed_seconds,
            quality,
            reached: metric.meets(quality, bar),
        };
        last = Some((to_bar, run.updates_per_second));
        if to_bar.reached || !quality.is_finite() {
            break;
        }
    }
    last.context("max passes must be >= 1")
}

/// Runs a peer script (`bench/mf_peers.py`, `bench/mlr_peers.py`) with `args`: the JSON object
/// of its last stdout line, or why it did not run.
pub fn run_json_peer(
    python: &Path,
    script: &Path,
    args: &[String],
) -> Result<serde_json::Value, String> {
    eprintln!("==> peer: {} {}", script.display(), args.join(" "));
    let mut child = std::process::Command::new(python)
        .arg(script)
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run {}: {e}", python.display()))?;
    // The peer's stderr goes on to ours as it comes (a fit takes minutes), and its last line
    // names what went wrong when the peer fails.
    let stderr = child.stderr.take().expect("stderr is piped");
    let echo = std::thread::spawn(move || {
        let mut last = String::new();
        for line in std::io::BufRead::lines(std::io::BufReader::new(stderr)).map_while(Result::ok) {
            eprintln!("{line}");
            if !line.trim().is_empty() {
                last = line;
            }
        }
        last
    });
    let output = child
        .wait_with_output()
        .map_err(|e| format!("cannot run {}: {e}", python.display()))?;
    let last_error = echo.join().unwrap_or_default();
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        return Err(format!("failed ({}): {last_error}", output.status));
    }
    let last = stdout.lines().last().unwrap_or("");
    serde_json::from_str(last).map_err(|e| format!("printed {last:?}: {e}"))
}

/// What a bench measures against its peers: the bar's text (`test rmse <= 0.2`), the metric's
/// name, the rate's unit, and ours at the peers' threads (`None` where it missed the bar).
pub struct PeerRows<'a> {
    pub bar: &'a str,
    pub metric: &'a str,
    pub rate_unit: &'a str,
    /// `(what ours is, its time to the bar)`.
    pub ours: Option<(String, ToBar)>,
}

impl PeerRows<'_> {
    /// Adds the rows of one peer's JSON object (`peer`, `time_to_quality_s`, `quality`,
    /// `epochs`, `updates_per_s`): its time to the bar, its rate, and our speed ÷ its where both
    /// reached the bar.
    pub fn add(&self, report: &mut Report, peer: &str, result: &serde_json::Value) {
        let name = result["peer"].as_str().unwrap_or(peer).to_string();
        let time = result["time_to_quality_s"].as_f64();
        let quality = result["quality"].as_f64().unwrap_or(f64::NAN);
        let epochs = result["epochs"].as_u64().unwrap_or(0);
        let metric = self.metric;
        report.add(
            format!("{name}: time to {}", self.bar),
            match time {
                Some(t) => format!("{t:.1} s ({epochs} epochs, {metric} {quality:.4})"),
                None => format!("not reached in {epochs} epochs ({metric} {quality:.4})"),
            },
        );
        if let Some(rate) = result["updates_per_s"].as_f64() {
            report.add(
                format!("{name}: {}", self.rate_unit),
                format!("{:.2} M", rate / 1e6),
            );
        }
        if let (Some(peer_time), Some((what, run))) = (time, &self.ours)
            && run.reached
        {
            report.add(
                format!("speed, {what} ÷ {peer}: its time to the bar ÷ ours"),
                format!("{:.2}×", peer_time / run.seconds),
            );
        }
    }
}
