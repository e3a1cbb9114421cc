//! `ebbflow-mlr-scale`: softmax regression at scale (issue 36: the classification generator from
//! a benchmark), every ratio from one run. `scripts/bench-mlr-scale.sh` sets it up.
//!
//! Generates planted Gaussian classes (`data::PlantedExamples`; sizes are flags), computes the
//! Bayes-optimal classifier's test cross-entropy (or accuracy) from the planted means
//! ([`PlantedExamples::optimal_weights`]: no model does better, and a linear one can do as well),
//! sets the bar a gap worse than it, and measures time to the bar and examples/s for
//! - the bare loop (one thread, the app's mini-batch SGD on plain rows);
//! - ebbflow in one process, 1 and `--threads` worker threads (the parameter server
//!   in-process), the whole run timed from scratch (workers, tables, binding, training);
//! - the peers on the very same examples (float32 files, `bench/mlr_peers.py`): PyTorch on CPU
//!   with the same mini-batch SGD, learning rate, decay and L2, and scikit-learn's
//!   `SGDClassifier`, at `--threads` threads. A peer that is missing or fails is reported as
//!   such.
//!
//! Prints a Markdown table with the ratios (a peer's time to the bar ÷ ours: above 1 means
//! ebbflow is faster).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::bail;
use clap::Parser;

#[path = "common/scale.rs"]
mod scale;
use scale::{
    Metric, PeerRows, Report, bare_to_bar, peak_rss_mib, ps_to_bar, run_json_peer, threads_or_cores,
};

use ebbflow_runtime::app::App;
use ebbflow_runtime::apps::mlr::WEIGHTS;
use ebbflow_runtime::apps::{MlrApp, MlrConfig};
use ebbflow_runtime::data::{self, Examples, PlantedExamples};
use ebbflow_runtime::snapshot::ParamSnapshot;

/// Command-line arguments.
#[derive(Parser, Debug)]
#[command(
    about = "Softmax regression at scale: ebbflow against the bare loop, PyTorch and \
                   scikit-learn on planted classes"
)]
struct Args {
    /// Examples in all (test set included: 20%, at most 100,000).
    #[arg(long, default_value_t = 4_000_000)]
    examples: u64,
    /// Features per example.
    #[arg(long, default_value_t = 100)]
    features: usize,
    /// Classes.
    #[arg(long, default_value_t = 10)]
    classes: usize,
    /// Standard deviation of the class means (unit noise around them): 0.15 at 100 features
    /// puts two means about 2 noise deviations apart, so even the Bayes-optimal classifier errs
    /// on about a third of the examples.
    #[arg(long, default_value_t = 0.15)]
    separation: f64,
    /// Examples per SGD step (a clock), over all workers.
    #[arg(long, default_value_t = 1024)]
    batch_size: usize,
    /// Learning rate of the first pass.
    #[arg(long, default_value_t = 0.5)]
    learning_rate: f32,
    /// Learning-rate decay per pass.
    #[arg(long, default_value_t = 0.7)]
    decay: f64,
    /// L2 regularization of the weights.
    #[arg(long, default_value_t = 1e-5)]
    regularization: f32,
    /// The test metric of the bar: `cross-entropy` (mean negative log-likelihood in nats, at
    /// most the bar) or `accuracy` (at least the bar; on 100,000 test examples its standard
    /// error is 0.0016, as large as the gap to the optimum it would measure).
    #[arg(long, default_value = "cross-entropy", value_parser = ["cross-entropy", "accuracy"])]
    metric: String,
    /// The bar (default: the Bayes-optimal classifier's test metric, `--bar-gap` worse).
    #[arg(long)]
    bar: Option<f64>,
    /// How much worse than the Bayes-optimal classifier's test metric the default bar is.
    #[arg(long, default_value_t = 0.002)]
    bar_gap: f64,
    /// Passes over the training set at most.
    #[arg(long, default_value_t = 10)]
    max_passes: u64,
    /// Threads for ebbflow's workers, each peer and the generator (default: this machine's
    /// cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Seed of the data and the example order.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Python with torch for the PyTorch peer (scripts/setup-python.sh); without it that peer
    /// is not run.
    #[arg(long, env = "EBBFLOW_BENCH_PYTHON")]
    python: Option<PathBuf>,
    /// Python with scikit-learn for the `sgd` peer (scripts/bench-mlr-scale.sh sets it up).
    #[arg(long, env = "EBBFLOW_SKLEARN_PYTHON")]
    sklearn_python: Option<PathBuf>,
    /// Peers to run (`--peers ''` for none).
    #[arg(long, value_delimiter = ',', default_value = "torch,sgd")]
    peers: Vec<String>,
    /// Where the example files for the peers go.
    #[arg(long, default_value = "/tmp/ebbflow-mlr-scale")]
    work: PathBuf,
}

/// Float32 little-endian rows of the features then the class, the layout `bench/mlr_peers.py
/// --format f32` reads.
fn write_examples(path: &Path, examples: &Examples) -> anyhow::Result<()> {
    let mut out = std::io::BufWriter::with_capacity(1 << 20, std::fs::File::create(path)?);
    for (index, &label) in examples.labels.iter().enumerate() {
        for value in examples.row(index) {
            out.write_all(&value.to_le_bytes())?;
        }
        out.write_all(&(label as f32).to_le_bytes())?;
    }
    out.flush()?;
    Ok(())
}

const ACCURACY: Metric = Metric {
    name: "accuracy",
    higher_is_better: true,
};

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let threads = threads_or_cores(args.threads);
    let source = PlantedExamples {
        examples: args.examples,
        features: args.features,
        classes: args.classes,
        separation: args.separation,
        test_fraction: PlantedExamples::test_fraction_for(args.examples),
        seed: args.seed,
    };
    let config = MlrConfig {
        learning_rate: args.learning_rate,
        decay: args.decay,
        regularization: args.regularization,
        batch_size: args.batch_size,
        seed: args.seed,
    };
    let mut report = Report::default();
    let start = Instant::now();
    let split = source.generate(None, threads, data::available_memory())?;
    let generated = start.elapsed().as_secs_f64();
    let (train_len, test_len) = (split.train.len(), split.test.len());
    report.add(
        "data".into(),
        format!(
            "planted Gaussian classes, separation {}: {} classes × {} features, {train_len} \
             training and {test_len} test examples ({:.0} MiB)",
            args.separation,
            args.classes,
            args.features,
            (train_len + test_len) as f64 * (args.features + 1) as f64 * 4.0 / (1 << 20) as f64
        ),
    );
    report.add(
        format!("generation ({threads} threads)"),
        format!(
            "{generated:.1} s ({:.1} M examples/s)",
            args.examples as f64 / generated / 1e6
        ),
    );
    std::fs::create_dir_all(&args.work)?;
    let (train_file, test_file) = (args.work.join("train.f32"), args.work.join("test.f32"));
    let python_of = |peer: &str| match peer {
        "sgd" => (
            &args.sklearn_python,
            "no --sklearn-python (EBBFLOW_SKLEARN_PYTHON)",
        ),
        _ => (&args.python, "no --python (EBBFLOW_BENCH_PYTHON)"),
    };
    let run_peers = (args.peers.iter()).any(|peer| !peer.is_empty() && python_of(peer).0.is_some());
    if run_peers {
        write_examples(&train_file, &split.train)?;
        write_examples(&test_file, &split.test)?;
    }
    let app = MlrApp::new(split.train, split.test, config.clone())?;
    let mut optimal = ParamSnapshot::new(app.tables());
    let classes: Vec<u64> = (0..args.classes as u64).collect();
    optimal.add_rows(WEIGHTS, &classes, &source.optimal_weights());
    optimal.finish();
    let metric = match args.metric.as_str() {
        "accuracy" => ACCURACY,
        _ => Metric {
            name: "cross_entropy",
            higher_is_better: false,
        },
    };
    let bayes = app.evaluate(&optimal);
    report.add(
        "Bayes-optimal classifier (the planted means): test accuracy / cross-entropy".into(),
        format!("{:.4} / {:.4}", ACCURACY.of(&bayes), bayes.loss),
    );
    let optimum = metric.of(&bayes);
    let (bar, why) = match args.bar {
        Some(bar) => (bar, "given".to_string()),
        None if metric.higher_is_better => (
            optimum - args.bar_gap,
            format!("the Bayes-optimal's minus {}", args.bar_gap),
        ),
        None => (
            optimum + args.bar_gap,
            format!("the Bayes-optimal's plus {}", args.bar_gap),
        ),
    };
    let bar_text = format!("test {} {} {bar:.4}", metric.name, metric.relation());
    report.add(
        format!("the bar: test {}", metric.name),
        format!("{bar:.4} ({why})"),
    );

    let (bare, bare_rate) = bare_to_bar(&app, metric, bar, args.max_passes);
    report.add(
        format!("bare loop (1 thread): time to {bar_text}"),
        bare.text(bar, "passes", metric.name, metric.missed()),
    );
    report.add(
        "bare loop: examples/s".into(),
        format!("{:.2} M", bare_rate / 1e6),
    );
    let mut ours = Vec::new();
    let counts: std::collections::BTreeSet<usize> = [1, threads].into_iter().collect();
    for &workers in &counts {
        let (run, rate) = ps_to_bar(&app, workers, metric, bar, args.max_passes)?;
        report.add(
            format!("ebbflow in-process, {workers} worker thread(s): time to {bar_text}"),
            run.text(bar, "passes", metric.name, metric.missed()),
        );
        report.add(
            format!("ebbflow in-process, {workers} worker thread(s): examples/s"),
            format!("{:.2} M (÷ bare loop {:.2})", rate / 1e6, rate / bare_rate),
        );
        ours.push((workers, run));
    }
    report.add(
        "this process's peak RSS (all of the above)".into(),
        format!("{:.0} MiB", peak_rss_mib()),
    );

    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../bench/mlr_peers.py");
    let rows = PeerRows {
        bar: &bar_text,
        metric: metric.name,
        rate_unit: "examples/s",
        ours: (ours.iter())
            .find(|(workers, run)| *workers == threads && run.reached)
            .map(|(_, run)| (format!("ebbflow in-process ({threads} threads)"), *run)),
    };
    for peer in args.peers.iter().filter(|peer| !peer.is_empty()) {
        let (python, missing) = python_of(peer);
        let Some(python) = python else {
            report.add(format!("peer {peer}"), format!("not run: {missing}"));
            continue;
        };
        let peer_args: Vec<String> = [
            "--peer",
            peer,
            "--format",
            "f32",
            "--features",
            &args.features.to_string(),
            "--train",
            &train_file.display().to_string(),
            "--test",
            &test_file.display().to_string(),
            "--target",
            &bar.to_string(),
            "--metric",
            metric.name,
            "--learning-rate",
            &config.learning_rate.to_string(),
            "--decay",
            &config.decay.to_string(),
            "--regularization",
            &config.regularization.to_string(),
            "--batch-size",
            &config.batch_size.to_string(),
            "--max-epochs",
            &args.max_passes.to_string(),
            "--threads",
            &threads.to_string(),
            "--seed",
            &args.seed.to_string(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        match run_json_peer(python, &script, &peer_args) {
            Ok(result) => rows.add(&mut report, peer, &result),
            Err(why) => report.add(format!("peer {peer}"), format!("did not run: {why}")),
        }
    }

    report.print_table()?;
    if ours.iter().all(|(_, run)| !run.reached) {
        bail!(
            "ebbflow did not reach {bar_text} in {} passes",
            args.max_passes
        );
    }
    Ok(())
}
