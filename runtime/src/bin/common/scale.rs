//! What the scale benchmarks (`ebbflow-mf-scale`, `ebbflow-lda-scale`, `ebbflow-mlr-scale`)
//! share.

use std::path::Path;

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

/// Runs a peer script (`bench/mf_peers.py`, `bench/mlr_peers.py`) with `args`: the JSON object
/// of its last stdout line, or why it did not run.
#[allow(dead_code)] // ebbflow-lda-scale reads its peers' snapshots line by line
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
#[allow(dead_code)] // ebbflow-lda-scale reads its peers' snapshots line by line
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
    #[allow(dead_code)]
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
