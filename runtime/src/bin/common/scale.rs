//! What the scale benchmarks (`ebbflow-mf-scale`, `ebbflow-lda-scale`) share.

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
