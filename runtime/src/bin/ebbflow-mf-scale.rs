//! `ebbflow-mf-scale`: matrix factorization at the seed's scale (issue 36), every ratio from one
//! run. `scripts/bench-mf-scale.sh` sets it up.
//!
//! Generates planted ratings of the Netflix prize data's density (`data::PlantedRatings`: 208
//! ratings per user, 17,770 items; sizes are flags), then
//! measures time to a test RMSE bar and updates/s for
//! - the bare loop (one thread, the app's kernel on plain rows);
//! - ebbflow in one process, `--threads` worker threads (the parameter server in-process);
//! - the peers on the very same split files (float32 triples `user, item, rating`): LIBMF (the
//!   `libmf` binding, built from its sdist), PyTorch on CPU, Spark MLlib ALS in local mode, at
//!   `--threads` threads each (`bench/mf_peers.py`). A peer that is missing or fails is
//!   reported as such.
//!
//! and prints a Markdown table with the ratios (a peer's time to the bar ÷ ours: above 1 means
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

use ebbflow_runtime::apps::{BareLoop, MfApp, MfConfig};
use ebbflow_runtime::data::{self, PlantedRatings, PlantedSplit, Ratings};

/// Command-line arguments.
#[derive(Parser, Debug)]
#[command(
    about = "Matrix factorization at scale: ebbflow against the bare loop, LIBMF and PyTorch"
)]
struct Args {
    /// Ratings in all (test set included).
    #[arg(long, default_value_t = 25_000_000)]
    ratings: u64,
    /// Users (default: the Netflix prize data's ratings per user, 208, at this many ratings).
    #[arg(long)]
    users: Option<u32>,
    /// Items.
    #[arg(long, default_value_t = data::NETFLIX.1)]
    items: u32,
    /// Rank of the planted model.
    #[arg(long, default_value_t = 16)]
    true_rank: usize,
    /// Noise standard deviation (the best achievable test RMSE).
    #[arg(long, default_value_t = 0.1)]
    noise: f64,
    /// Rank of the learned factors.
    #[arg(long, default_value_t = 32)]
    rank: usize,
    /// SGD learning rate (ebbflow, PyTorch; LIBMF keeps its own adaptive step).
    /// (ebbflow's MovieLens default 0.01 needs 10+ passes to leave the saddle of a small start
    /// on this data; 0.03 leaves it in 2.)
    #[arg(long, default_value_t = 0.03)]
    learning_rate: f32,
    /// Learning-rate decay per pass.
    #[arg(long, default_value_t = 0.92)]
    decay: f32,
    /// ebbflow's adaptive step (`MfConfig::adaptive`, LIBMF's rule: AdaGrad by row); pair it
    /// with LIBMF's rate, `--learning-rate 0.1 --decay 1`.
    #[arg(long)]
    adaptive: bool,
    /// L2 regularization.
    #[arg(long, default_value_t = 0.02)]
    regularization: f32,
    /// Standard deviation of the initial factors.
    #[arg(long, default_value_t = 0.1)]
    init_std: f32,
    /// Test RMSE to reach.
    #[arg(long, default_value_t = 0.2)]
    bar: f64,
    /// Passes over the training set at most.
    #[arg(long, default_value_t = 20)]
    max_passes: u64,
    /// Threads for ebbflow's workers and each peer (default: this machine's cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Seed of the data.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Python with the peers' packages (bench/setup-venv.sh); without it peers are not run.
    #[arg(long, env = "EBBFLOW_BENCH_PYTHON")]
    python: Option<PathBuf>,
    /// Python with pyspark for the Spark ALS peer (scripts/bench-mf-scale.sh sets it up).
    #[arg(long, env = "EBBFLOW_SPARK_PYTHON")]
    spark_python: Option<PathBuf>,
    /// Spark ALS's regParam (ALS-WR: Spark scales it by each row's rating count, so SGD's L2
    /// does not carry over).
    #[arg(long, default_value_t = 0.02)]
    spark_reg: f64,
    /// Spark ALS iterations of its first fit. ALS trains all its iterations in one fit, so
    /// the fewest that reach the bar are found by refitting from scratch: up from here while
    /// they miss it, or by bisection below here (a good guess, such as the count found on
    /// smaller data, costs a few fits instead of one per iteration).
    #[arg(long, default_value_t = 1)]
    spark_first_iterations: u32,
    /// Peers to run.
    #[arg(long, value_delimiter = ',', default_value = "libmf,torch,spark")]
    peers: Vec<String>,
    /// Layouts of each worker's shard that ebbflow runs in: `random` (the default order) and
    /// `blocked` (`MfConfig::blocked`, what a TrainingJob of planted ratings uses; the ratios
    /// against the peers use it). At rank 1000 the rows, not their order, set the time, and
    /// `--layouts blocked` halves the bench.
    /// `stratified` runs one worker of `--threads` threads (`MfConfig::threads`: strata of
    /// blocks that share no row, updated at once).
    #[arg(long, value_delimiter = ',', default_value = "random,blocked,stratified", value_parser = ["random", "blocked", "stratified"])]
    layouts: Vec<String>,
    /// Where the split files for the peers go.
    #[arg(long, default_value = "/tmp/ebbflow-mf-scale")]
    work: PathBuf,
}

/// Float32 triples `user, item, rating`, the layout LIBMF's binding takes.
fn write_triples(path: &Path, ratings: &Ratings) -> anyhow::Result<()> {
    let mut out = std::io::BufWriter::with_capacity(1 << 20, std::fs::File::create(path)?);
    for r in &ratings.entries {
        for value in [r.user as f32, r.item as f32, r.value] {
            out.write_all(&value.to_le_bytes())?;
        }
    }
    out.flush()?;
    Ok(())
}

/// Test RMSE, the bar every learner trains to.
const RMSE: Metric = Metric {
    name: "rmse",
    higher_is_better: false,
};

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let threads = threads_or_cores(args.threads);
    let users = args.users.unwrap_or_else(|| {
        let per_rating = f64::from(data::NETFLIX.0) / data::NETFLIX.2 as f64;
        ((args.ratings as f64 * per_rating).round() as u32).max(1)
    });
    let source = PlantedRatings {
        users,
        items: args.items,
        ratings: args.ratings,
        true_rank: args.true_rank,
        noise: args.noise,
        test_fraction: PlantedRatings::test_fraction_for(args.ratings),
        seed: args.seed,
    };
    let mut report = Report::default();
    let start = Instant::now();
    let split = source.generate(None, threads, data::available_memory())?;
    let generated = start.elapsed().as_secs_f64();
    let (train_len, test_len) = (split.train.entries.len(), split.test.entries.len());
    report.add(
        "data".into(),
        format!(
            "planted rank {}, noise {}: {} users × {} items, {train_len} training and {test_len} \
             test ratings",
            args.true_rank, args.noise, users, args.items
        ),
    );
    report.add(
        format!("generation ({threads} threads)"),
        format!(
            "{generated:.1} s ({:.1} M ratings/s)",
            args.ratings as f64 / generated / 1e6
        ),
    );
    std::fs::create_dir_all(&args.work)?;
    let (train_file, test_file) = (args.work.join("train.f32"), args.work.join("test.f32"));
    if args.python.is_some() || args.spark_python.is_some() {
        write_triples(&train_file, &split.train)?;
        write_triples(&test_file, &split.test)?;
    }
    let config = MfConfig {
        rank: args.rank,
        learning_rate: args.learning_rate,
        decay: args.decay,
        regularization: args.regularization,
        init_std: args.init_std,
        adaptive: args.adaptive,
        ..MfConfig::default()
    };
    let app = MfApp::new(split.train, split.test, config.clone())?;
    let width = config.width();
    let parameter_mib =
        (f64::from(users) + f64::from(args.items)) * width as f64 * 4.0 / (1 << 20) as f64;
    let data_mib = args.ratings as f64 * 12.0 / (1 << 20) as f64;

    let (bare, bare_rate) = bare_to_bar(&app, RMSE, args.bar, args.max_passes);
    report.add(
        format!("bare loop (1 thread): time to test rmse <= {}", args.bar),
        bare.text(args.bar, "passes", "rmse", ">"),
    );
    report.add(
        "bare loop: updates/s".into(),
        format!("{:.2} M", bare_rate / 1e6),
    );
    // Random order (the default layout), then blocks (`MfConfig::blocked`, what a TrainingJob
    // of planted ratings uses); the ratios against the peers use the blocked runs.
    let blocked_app = app.with_config(MfConfig {
        blocked: true,
        ..config.clone()
    })?;
    let stratified_app = app.with_config(MfConfig {
        threads,
        ..config.clone()
    })?;
    // (layout, threads in all, run)
    let mut ours = Vec::new();
    let counts: std::collections::BTreeSet<usize> = [1, threads].into_iter().collect();
    for (flag, layout, app) in [
        ("random", "random order", &app),
        ("blocked", "blocked", &blocked_app),
        ("stratified", "stratified", &stratified_app),
    ] {
        if !args.layouts.iter().any(|l| l == flag) {
            continue;
        }
        for &workers in &counts {
            // One worker of all the threads, or one thread a worker.
            let (label, total) = match flag {
                "stratified" if workers == 1 => (format!("1 worker of {threads} threads"), threads),
                "stratified" => continue,
                _ => (format!("{workers} worker thread(s)"), workers),
            };
            let (run, rate) = ps_to_bar(app, workers, RMSE, args.bar, args.max_passes)?;
            report.add(
                format!(
                    "ebbflow in-process, {layout}, {label}: time to test rmse <= {}",
                    args.bar
                ),
                run.text(args.bar, "passes", "rmse", ">"),
            );
            report.add(
                format!("ebbflow in-process, {layout}, {label}: updates/s"),
                format!("{:.2} M (÷ bare loop {:.2})", rate / 1e6, rate / bare_rate),
            );
            ours.push((layout, total, run));
        }
    }
    drop(blocked_app);
    drop(stratified_app);
    report.add(
        "this process's peak RSS (all of the above)".into(),
        format!(
            "{:.0} MiB; parameters {parameter_mib:.0} MiB, ratings {data_mib:.0} MiB",
            peak_rss_mib()
        ),
    );
    drop(app);
    // What cache locality is worth: one pass of the bare loop over the same ratings laid out in
    // LIBMF's 20 × 20 blocks of users × items (a block's rows fit in cache), random inside a
    // block. A measurement, not a training mode: see BENCHMARKS.md.
    let blocked_rate = {
        let bins = 20u64;
        // generated again: this process's RSS above is the figure without it
        let PlantedSplit {
            train: mut blocked,
            test,
        } = source.generate(None, threads, data::available_memory())?;
        let (u, i) = (u64::from(users), u64::from(args.items));
        blocked
            .entries
            .sort_by_key(|r| (u64::from(r.user) * bins / u, u64::from(r.item) * bins / i));
        let blocked_app = MfApp::new(blocked, test, config.clone())?;
        let mut bare = BareLoop::new(&blocked_app);
        let start = Instant::now();
        let updates = bare.clock().updates;
        updates as f64 / start.elapsed().as_secs_f64()
    };
    report.add(
        "bare loop, one pass over the ratings in 20 × 20 blocks (locality only): updates/s".into(),
        format!(
            "{:.2} M (÷ bare loop {:.2})",
            blocked_rate / 1e6,
            blocked_rate / bare_rate
        ),
    );

    // ebbflow's fastest layout to the bar at these threads, else its first
    let ours_at = |threads: usize| {
        let at: Vec<_> = ours.iter().filter(|(_, t, _)| *t == threads).collect();
        at.iter()
            .filter(|(_, _, run)| run.reached)
            .min_by(|a, b| a.2.seconds.total_cmp(&b.2.seconds))
            .or(at.first())
            .map(|(layout, _, run)| (*layout, *run))
    };
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../bench/mf_peers.py");
    let bar_text = format!("test rmse <= {}", args.bar);
    let rows = PeerRows {
        bar: &bar_text,
        metric: "rmse",
        rate_unit: "updates/s",
        ours: ours_at(threads)
            .filter(|(_, run)| run.reached)
            .map(|(layout, run)| {
                (
                    format!("ebbflow in-process ({layout}, {threads} threads)"),
                    run,
                )
            }),
    };
    for peer in args.peers.iter().filter(|peer| !peer.is_empty()) {
        let (python, missing) = if peer == "spark" {
            (
                &args.spark_python,
                "no --spark-python (EBBFLOW_SPARK_PYTHON: pyspark and java)",
            )
        } else {
            (&args.python, "no --python (EBBFLOW_BENCH_PYTHON)")
        };
        let Some(python) = python else {
            report.add(format!("peer {peer}"), format!("not run: {missing}"));
            continue;
        };
        let peer_args: Vec<String> = [
            "--peer",
            peer,
            "--format",
            "f32",
            "--train",
            &train_file.display().to_string(),
            "--test",
            &test_file.display().to_string(),
            "--target",
            &args.bar.to_string(),
            "--rank",
            &args.rank.to_string(),
            "--learning-rate",
            &config.learning_rate.to_string(),
            "--decay",
            &config.decay.to_string(),
            "--regularization",
            &config.regularization.to_string(),
            "--init-std",
            &config.init_std.to_string(),
            "--max-epochs",
            &args.max_passes.to_string(),
            "--threads",
            &threads.to_string(),
            "--spark-reg",
            &args.spark_reg.to_string(),
            "--spark-first-iterations",
            &args.spark_first_iterations.to_string(),
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
    if ours.iter().all(|(_, _, run)| !run.reached) {
        bail!(
            "ebbflow did not reach test rmse {} in {} passes",
            args.bar,
            args.max_passes
        );
    }
    Ok(())
}
