//! `ebbflow-bench`: the runtime benchmark of issue 3, every ratio measured in one run.
//!
//! For each app (MF on MovieLens 100K, MLR on digits, LDA on reuters) it measures
//! - the bare single-thread loop (same kernels on plain `Vec<f32>`): clocks and time to the target
//!   test quality, and updates/s over a fixed number of clocks;
//! - the parameter server with one worker, in-process and over TCP loopback (`run_loopback`:
//!   one data-plane server and one worker thread in this process): updates/s over the same clocks
//!   (ratio to the bare loop), time to the same quality, parameter bytes and this process's RSS;
//! - two worker threads in one process (in-process server and over TCP loopback), with and without
//!   the per-process read cache: rows and bytes pulled and pushed per clock, and updates/s;
//! - the peers a user would pick instead (PyTorch on CPU, scikit-surprise, scikit-learn, the `lda`
//!   package) through `bench/*.py` in the benchmark's own venv, on the very same split;
//!
//! and prints a Markdown table of figures and ratios. `scripts/bench.sh` sets everything up.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, bail};
use clap::Parser;

use ebbflow_runtime::app::{App, EvalReport};
use ebbflow_runtime::apps::{
    BareLoop, BareWorker, LdaApp, LdaConfig, MfApp, MfConfig, MlrApp, MlrConfig,
};
use ebbflow_runtime::data;
use ebbflow_runtime::local::{RunReport, run_single_process};
use ebbflow_runtime::metrics::RuntimeMetrics;
use ebbflow_runtime::node::run_loopback;
use ebbflow_runtime::worker::JobConfig;

/// Command-line arguments.
#[derive(Debug, Parser)]
#[command(about = "ebbflow runtime benchmark: bare loop, parameter server and peers in one run")]
struct Args {
    /// Directory with the real data sets (scripts/fetch-data.sh).
    #[arg(long, env = "EBBFLOW_DATA_DIR")]
    data: PathBuf,
    /// Python of the benchmark venv (bench/setup-venv.sh); without it peers are skipped.
    #[arg(long, env = "EBBFLOW_BENCH_PYTHON")]
    python: Option<PathBuf>,
    /// Apps to run (comma-separated: mf, mlr, lda).
    #[arg(long, value_delimiter = ',', default_value = "mf,mlr,lda")]
    apps: Vec<String>,
    /// Repetitions of each throughput measurement (the best is kept).
    #[arg(long, default_value_t = 3)]
    repeat: usize,
    /// LDA iterations of the `lda` package run (its README's reuters example uses 1500).
    #[arg(long, default_value_t = 1500)]
    lda_iterations: u64,
}

/// Which way a quality metric improves.
#[derive(Debug, Clone, Copy)]
struct Target {
    metric: &'static str,
    goal: f64,
    higher_is_better: bool,
}

impl Target {
    fn value(&self, report: &EvalReport) -> f64 {
        report.metric(self.metric).unwrap_or(f64::NAN)
    }

    fn goal_text(&self) -> String {
        let sign = if self.higher_is_better { ">=" } else { "<=" };
        format!("{sign} {:.4}", self.goal)
    }

    fn reached(&self, value: f64) -> bool {
        if self.higher_is_better {
            value >= self.goal
        } else {
            value <= self.goal
        }
    }
}

/// Time to a target quality: clocks, training seconds (evaluation excluded), final quality.
#[derive(Debug, Clone, Copy)]
struct ToQuality {
    clocks: u64,
    seconds: f64,
    quality: f64,
    reached: bool,
}

fn bare_to_target<A>(app: &A, target: Target, max_clocks: u64) -> ToQuality
where
    A: App,
    A::Worker: BareWorker,
{
    let mut bare = BareLoop::new(app);
    let mut seconds = 0.0;
    // At least one clock: untrained parameters can score trivially (LDA with no counts yet).
    let mut quality = f64::NAN;
    while bare.clocks() == 0 || (bare.clocks() < max_clocks && !target.reached(quality)) {
        let start = Instant::now();
        bare.clock();
        seconds += start.elapsed().as_secs_f64();
        quality = target.value(&app.evaluate(bare.tables()));
    }
    ToQuality {
        clocks: bare.clocks(),
        seconds,
        quality,
        reached: target.reached(quality),
    }
}

/// Best-of-`repeat` updates/s of the bare loop over `clocks` clocks.
fn bare_updates_per_second<A>(app: &A, clocks: u64, repeat: usize) -> f64
where
    A: App,
    A::Worker: BareWorker,
{
    (0..repeat.max(1))
        .map(|_| {
            let mut bare = BareLoop::new(app);
            let start = Instant::now();
            let updates: u64 = (0..clocks).map(|_| bare.clock().updates).sum();
            updates as f64 / start.elapsed().as_secs_f64()
        })
        .fold(0.0, f64::max)
}

/// Where the parameter server runs for a measurement.
#[derive(Debug, Clone, Copy)]
enum Mode {
    /// `run_single_process`: in-process server, 1 worker thread.
    InProcess,
    /// `run_loopback`: 1 data-plane server over TCP on 127.0.0.1, 1 worker thread.
    Loopback,
}

impl Mode {
    fn label(self) -> &'static str {
        match self {
            Mode::InProcess => "ps in-process, 1 worker",
            Mode::Loopback => "ps over TCP loopback (1 server, 1 worker)",
        }
    }

    fn short(self) -> &'static str {
        match self {
            Mode::InProcess => "ps in-process",
            Mode::Loopback => "ps over TCP loopback (1 server)",
        }
    }
}

fn run_ps<A: App>(app: &A, mode: Mode, clocks: u64) -> anyhow::Result<RunReport> {
    run_ps_with(app, mode, clocks, 1, true, &RuntimeMetrics::unregistered())
}

fn run_ps_with<A: App>(
    app: &A,
    mode: Mode,
    clocks: u64,
    workers: usize,
    process_cache: bool,
    metrics: &RuntimeMetrics,
) -> anyhow::Result<RunReport> {
    let config = JobConfig {
        clocks,
        staleness: 0,
        workers,
        partitions: 4,
        process_cache,
        ..JobConfig::default()
    };
    Ok(match mode {
        Mode::InProcess => run_single_process(app, &config, metrics)?,
        Mode::Loopback => run_loopback(app, &config, 1, metrics)?,
    })
}

/// Two worker threads in one process, with and without the process cache: data moved per clock
/// (from the runtime's own counters) and best-of-`repeat` updates/s.
fn measure_process_cache<A: App>(
    report: &mut Report,
    name: &'static str,
    app: &A,
    clocks: u64,
    repeat: usize,
) -> anyhow::Result<()> {
    for mode in [Mode::InProcess, Mode::Loopback] {
        let mut rates = Vec::new();
        for process_cache in [false, true] {
            let mut best = 0.0f64;
            let mut moved = [0u64; 4];
            for _ in 0..repeat.max(1) {
                let metrics = RuntimeMetrics::unregistered();
                let run = run_ps_with(app, mode, clocks, 2, process_cache, &metrics)?;
                best = best.max(run.updates_per_second);
                moved = [
                    metrics.rows_moved.with_label_values(&["pull"]).get(),
                    metrics.bytes_moved.with_label_values(&["pull"]).get(),
                    metrics.rows_moved.with_label_values(&["push"]).get(),
                    metrics.bytes_moved.with_label_values(&["push"]).get(),
                ];
            }
            let per_clock = |n: u64| n as f64 / clocks as f64;
            let cache = if process_cache {
                "process cache"
            } else {
                "per-thread caches"
            };
            report.add(
                name,
                format!(
                    "{}, 2 worker threads, {cache}: per clock pulled rows / KiB, pushed rows / KiB",
                    mode.short()
                ),
                format!(
                    "{:.0} / {:.1}, {:.0} / {:.1}",
                    per_clock(moved[0]),
                    per_clock(moved[1]) / 1024.0,
                    per_clock(moved[2]),
                    per_clock(moved[3]) / 1024.0
                ),
            );
            report.add(
                name,
                format!(
                    "{}, 2 worker threads, {cache}: updates/s ({clocks} clocks, best of {repeat})",
                    mode.short()
                ),
                rate(best),
            );
            rates.push(best);
        }
        report.add(
            name,
            format!(
                "{}, 2 worker threads: process cache / per-thread updates/s",
                mode.short()
            ),
            format!("{:.2}", rates[1] / rates[0]),
        );
    }
    Ok(())
}

/// Resident set size of this process in bytes (`VmRSS`), if readable.
fn rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Measures our side for one app: bare loop and PS (both modes) to the target and in throughput.
/// Returns the PS (in-process) training seconds to the target, the figure peers are compared to.
fn measure_ours<A>(
    report: &mut Report,
    name: &'static str,
    app: &A,
    target: Target,
    max_clocks: u64,
    throughput_clocks: u64,
    repeat: usize,
) -> anyhow::Result<f64>
where
    A: App,
    A::Worker: BareWorker,
{
    let bare = bare_to_target(app, target, max_clocks);
    report.add(
        name,
        format!(
            "bare loop: clocks to {} {}",
            target.metric,
            target.goal_text()
        ),
        format!(
            "{} ({}, {} {:.4})",
            bare.clocks,
            seconds(bare.seconds),
            target.metric,
            bare.quality
        ),
    );
    if !bare.reached {
        bail!("{name}: the bare loop did not reach the target in {max_clocks} clocks");
    }
    measure_throughput(report, name, app, throughput_clocks, repeat)?;
    // The PS with one BSP worker runs the same math; allow a few extra clocks for float noise.
    for clocks in bare.clocks.max(1)..=bare.clocks + 5 {
        let run = run_ps(app, Mode::InProcess, clocks)?;
        let quality = target.value(&run.eval);
        if target.reached(quality) {
            report.add(
                name,
                format!(
                    "ps in-process, 1 worker: time to {} {}",
                    target.metric,
                    target.goal_text()
                ),
                format!(
                    "{} ({clocks} clocks, {} {quality:.4})",
                    seconds(run.elapsed_seconds),
                    target.metric
                ),
            );
            return Ok(run.elapsed_seconds);
        }
    }
    bail!("{name}: the parameter server did not reach the target")
}

/// Updates/s of the bare loop, of the PS with one worker (in-process and over TCP loopback) and
/// of two worker threads with and without the process cache, over `throughput_clocks` clocks.
fn measure_throughput<A>(
    report: &mut Report,
    name: &'static str,
    app: &A,
    throughput_clocks: u64,
    repeat: usize,
) -> anyhow::Result<()>
where
    A: App,
    A::Worker: BareWorker,
{
    let bare_rate = bare_updates_per_second(app, throughput_clocks, repeat);
    report.add(
        name,
        format!("bare loop: updates/s ({throughput_clocks} clocks, best of {repeat})"),
        rate(bare_rate),
    );
    for mode in [Mode::InProcess, Mode::Loopback] {
        let mut best = 0.0f64;
        let mut last = None;
        for _ in 0..repeat.max(1) {
            let run = run_ps(app, mode, throughput_clocks)?;
            best = best.max(run.updates_per_second);
            last = Some(run);
        }
        let last = last.expect("at least one repetition");
        report.add(
            name,
            format!(
                "{}: updates/s ({throughput_clocks} clocks, best of {repeat})",
                mode.label()
            ),
            rate(best),
        );
        report.add(
            name,
            format!("{} / bare loop updates/s", mode.label()),
            format!("{:.2}", best / bare_rate),
        );
        if let Mode::Loopback = mode {
            let rss = rss_bytes().unwrap_or(0);
            report.add(
                name,
                "parameter bytes; this process's RSS (server + worker + data + bench)",
                format!(
                    "{:.1} KiB; {:.1} MiB (bound 1.5x params + 64 MiB = {:.1} MiB)",
                    last.parameter_bytes as f64 / 1024.0,
                    rss as f64 / MIB,
                    1.5 * last.parameter_bytes as f64 / MIB + 64.0
                ),
            );
        }
    }
    measure_process_cache(report, name, app, throughput_clocks, repeat)
}

const MIB: f64 = 1024.0 * 1024.0;

/// Runs a peer script and parses the JSON object it prints.
fn run_peer(python: &Path, script: &Path, args: &[String]) -> anyhow::Result<serde_json::Value> {
    eprintln!("==> peer: {} {}", script.display(), args.join(" "));
    let output = Command::new(python)
        .arg(script)
        .args(args)
        .output()
        .with_context(|| format!("running {} {}", python.display(), script.display()))?;
    if !output.status.success() {
        bail!(
            "peer {} failed: {}",
            script.display(),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    let last = stdout.lines().last().unwrap_or("");
    serde_json::from_str(last).with_context(|| format!("peer printed {stdout:?}"))
}

/// One line of the results table.
struct Row {
    app: &'static str,
    what: String,
    value: String,
}

struct Report {
    rows: Vec<Row>,
}

impl Report {
    fn add(&mut self, app: &'static str, what: impl Into<String>, value: impl Into<String>) {
        let row = Row {
            app,
            what: what.into(),
            value: value.into(),
        };
        eprintln!("{:<4} {:<60} {}", row.app, row.what, row.value);
        self.rows.push(row);
    }

    fn print(&self) {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "| app | measurement | value |\n|---|---|---|");
        for row in &self.rows {
            let _ = writeln!(out, "| {} | {} | {} |", row.app, row.what, row.value);
        }
    }
}

fn seconds(value: f64) -> String {
    format!("{value:.3} s")
}

fn rate(value: f64) -> String {
    format!("{:.2} M/s", value / 1e6)
}

/// Adds a peer's figures and the ratio of its time to quality over ours.
fn add_peer(
    report: &mut Report,
    app: &'static str,
    peer: &serde_json::Value,
    ours_seconds: f64,
    goal: &str,
) {
    let name = peer["peer"].as_str().unwrap_or("peer").to_string();
    let quality = peer["quality"].as_f64().unwrap_or(f64::NAN);
    let updates = peer["updates_per_s"]
        .as_f64()
        .or_else(|| peer["tokens_per_s"].as_f64())
        .unwrap_or(f64::NAN);
    match peer["time_to_quality_s"].as_f64() {
        Some(time) => {
            report.add(
                app,
                format!("{name}: time to quality (epochs {})", peer["epochs"]),
                format!(
                    "{} (quality {quality:.4}, {})",
                    seconds(time),
                    rate(updates)
                ),
            );
            report.add(
                app,
                format!("speed-up vs {name} at equal quality ({goal})"),
                format!("{:.1}x", time / ours_seconds),
            );
        }
        None => report.add(
            app,
            format!("{name}: target not reached"),
            format!("final quality {quality:.4} after {} epochs", peer["epochs"]),
        ),
    }
}

fn write_ratings(path: &Path, ratings: &data::Ratings) -> anyhow::Result<()> {
    let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
    for r in &ratings.entries {
        writeln!(out, "{}\t{}\t{}", r.user, r.item, r.value)?;
    }
    out.flush()?;
    Ok(())
}

fn write_examples(path: &Path, examples: &data::Examples) -> anyhow::Result<()> {
    let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
    for index in 0..examples.len() {
        for value in examples.row(index) {
            write!(out, "{value},")?;
        }
        writeln!(out, "{}", examples.labels[index])?;
    }
    out.flush()?;
    Ok(())
}

struct Bench {
    args: Args,
    work: PathBuf,
    bench_dir: PathBuf,
    report: Report,
}

impl Bench {
    fn peer(&self, script: &str, args: Vec<String>) -> Option<serde_json::Value> {
        let python = self.args.python.as_ref()?;
        match run_peer(python, &self.bench_dir.join(script), &args) {
            Ok(value) => Some(value),
            Err(error) => {
                eprintln!("peer {script} failed: {error:#}");
                None
            }
        }
    }

    fn mf(&mut self) -> anyhow::Result<()> {
        let ratings = data::load_movielens_inter(&self.args.data.join("ml-100k.inter"))?;
        let (train, test) = ratings.split(0.2, 42)?;
        let (train_path, test_path) = (
            self.work.join("mf_train.tsv"),
            self.work.join("mf_test.tsv"),
        );
        write_ratings(&train_path, &train)?;
        write_ratings(&test_path, &test)?;
        let config = MfConfig::default();
        let app = MfApp::new(train, test, config.clone())?;
        let target = Target {
            metric: "rmse",
            goal: 0.95,
            higher_is_better: false,
        };
        let ours = measure_ours(
            &mut self.report,
            "mf",
            &app,
            target,
            100,
            20,
            self.args.repeat,
        )?;
        let common = |peer: &str| {
            vec![
                "--peer".into(),
                peer.into(),
                "--train".into(),
                train_path.display().to_string(),
                "--test".into(),
                test_path.display().to_string(),
                "--target".into(),
                target.goal.to_string(),
                "--rank".into(),
                config.rank.to_string(),
                "--learning-rate".into(),
                config.learning_rate.to_string(),
                "--decay".into(),
                config.decay.to_string(),
                "--regularization".into(),
                config.regularization.to_string(),
                "--init-std".into(),
                config.init_std.to_string(),
            ]
        };
        for peer in ["torch", "surprise"] {
            if let Some(result) = self.peer("mf_peers.py", common(peer)) {
                add_peer(&mut self.report, "mf", &result, ours, "RMSE <= 0.95");
            }
        }
        Ok(())
    }

    fn mlr(&mut self) -> anyhow::Result<()> {
        let mut digits = data::load_digits(&self.args.data.join("digits.csv.gz"))?;
        digits.scale(1.0 / 16.0);
        let (train, test) = digits.split(0.2, 42)?;
        let (train_path, test_path) = (
            self.work.join("mlr_train.csv"),
            self.work.join("mlr_test.csv"),
        );
        write_examples(&train_path, &train)?;
        write_examples(&test_path, &test)?;
        let config = MlrConfig::default();
        let app = MlrApp::new(train, test, config.clone())?;
        let target = Target {
            metric: "accuracy",
            goal: 0.95,
            higher_is_better: true,
        };
        let ours = measure_ours(
            &mut self.report,
            "mlr",
            &app,
            target,
            100,
            20,
            self.args.repeat,
        )?;
        for peer in ["torch", "sgd", "lbfgs"] {
            let args = vec![
                "--peer".into(),
                peer.into(),
                "--train".into(),
                train_path.display().to_string(),
                "--test".into(),
                test_path.display().to_string(),
                "--target".into(),
                target.goal.to_string(),
                "--learning-rate".into(),
                config.learning_rate.to_string(),
                "--decay".into(),
                config.decay.to_string(),
                "--regularization".into(),
                config.regularization.to_string(),
                "--batch-size".into(),
                config.batch_size.to_string(),
            ];
            if let Some(result) = self.peer("mlr_peers.py", args) {
                add_peer(&mut self.report, "mlr", &result, ours, "accuracy >= 0.95");
            }
        }
        Ok(())
    }

    fn lda(&mut self) -> anyhow::Result<()> {
        let corpus = data::load_ldac(&self.args.data.join("reuters.ldac"))?;
        let config = LdaConfig::default();
        let app = LdaApp::new(corpus, config.clone())?;
        let iterations = self.args.lda_iterations;
        let peer = self.peer(
            "lda_peer.py",
            vec![
                "--data".into(),
                self.args.data.display().to_string(),
                "--topics".into(),
                config.num_topics.to_string(),
                "--iterations".into(),
                iterations.to_string(),
                "--alpha".into(),
                config.alpha.to_string(),
                "--eta".into(),
                config.eta.to_string(),
            ],
        );
        let Some(peer) = peer else {
            // No peer to set the quality target: throughput figures only.
            return measure_throughput(&mut self.report, "lda", &app, 200, self.args.repeat);
        };
        let theirs = peer["per_token_log_likelihood"]
            .as_f64()
            .unwrap_or(f64::NAN);
        let their_seconds = peer["seconds"].as_f64().unwrap_or(f64::NAN);
        let their_rate = peer["tokens_per_s"].as_f64().unwrap_or(f64::NAN);
        self.report.add(
            "lda",
            format!(
                "{}: {iterations} iterations",
                peer["peer"].as_str().unwrap_or("lda")
            ),
            format!(
                "{} (per-token log-likelihood {theirs:.4}, {} tokens/s)",
                seconds(their_seconds),
                rate(their_rate)
            ),
        );
        let target = Target {
            metric: "per_token_log_likelihood",
            goal: theirs,
            higher_is_better: true,
        };
        let ours = measure_ours(
            &mut self.report,
            "lda",
            &app,
            target,
            iterations * 2,
            200,
            self.args.repeat,
        )?;
        self.report.add(
            "lda",
            "speed-up vs the lda package at equal log-likelihood (ps in-process)",
            format!("{:.1}x", their_seconds / ours),
        );
        let run = run_ps(&app, Mode::InProcess, iterations)?;
        self.report.add(
            "lda",
            format!("ps in-process tokens/s over {iterations} iterations / lda package tokens/s"),
            format!(
                "{:.2} ({} vs {})",
                run.updates_per_second / their_rate,
                rate(run.updates_per_second),
                rate(their_rate)
            ),
        );
        Ok(())
    }
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let work = std::env::temp_dir().join(format!("ebbflow-bench-{}", std::process::id()));
    std::fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;
    let bench_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../bench");
    if args.python.is_none() {
        eprintln!("no --python / EBBFLOW_BENCH_PYTHON: peers skipped (scripts/bench.sh sets it)");
    }
    let apps = args.apps.clone();
    let mut bench = Bench {
        args,
        work: work.clone(),
        bench_dir,
        report: Report { rows: Vec::new() },
    };
    for app in &apps {
        match app.as_str() {
            "mf" => bench.mf()?,
            "mlr" => bench.mlr()?,
            "lda" => bench.lda()?,
            other => bail!("unknown app {other:?} (expected mf, mlr or lda)"),
        }
    }
    bench.report.print();
    let _ = std::fs::remove_dir_all(&work);
    Ok(())
}
