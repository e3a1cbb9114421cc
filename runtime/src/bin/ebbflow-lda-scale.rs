//! `ebbflow-lda-scale`: LDA at scale (issue 36), every ratio from one run.
//! `scripts/bench-lda-scale.sh` sets it up.
//!
//! Generates a corpus from a planted LDA model (`data::PlantedCorpus`; sizes are flags), holds
//! out its last documents, and measures the time to a held-out per-token log-likelihood bar for
//! - the bare loop (one thread, the app's collapsed Gibbs sampler on plain rows);
//! - ebbflow in one process, `--threads` worker threads (the parameter server in-process);
//! - the peers on the very same training file (LDA-C), with the same priors and topics:
//!   gensim's `LdaMulticore` at `--threads` workers and the `lda` package (one thread)
//!   (`bench/lda_peers.py`). A peer that is missing or fails is reported as such.
//!
//! Every model is scored by one evaluator, the project's own
//! ([`ebbflow_runtime::apps::lda::held_out_log_likelihood`], document completion), from its
//! topics' word distributions. The bar defaults to the planted model's own held-out score minus
//! `--bar-gap`. Prints a Markdown table with the ratios (a peer's time to the bar ÷ ours: above
//! 1 means ebbflow is faster).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, bail};
use clap::Parser;

#[path = "common/scale.rs"]
mod scale;
use scale::{Report, ToBar, peak_rss_mib};

use ebbflow_runtime::app::App;
use ebbflow_runtime::apps::lda::held_out_log_likelihood;
use ebbflow_runtime::apps::{BareLoop, LdaApp, LdaConfig};
use ebbflow_runtime::data::{self, Corpus, PlantedCorpus};
use ebbflow_runtime::local::run_single_process;
use ebbflow_runtime::metrics::RuntimeMetrics;
use ebbflow_runtime::worker::JobConfig;

/// Command-line arguments.
#[derive(Parser, Debug)]
#[command(about = "LDA at scale: ebbflow against the bare loop, gensim and the lda package")]
struct Args {
    /// Documents in all (held-out ones included).
    #[arg(long, default_value_t = 200_000)]
    docs: u64,
    /// Held-out documents (the last ones).
    #[arg(long, default_value_t = 2_000)]
    held_out: u64,
    /// Vocabulary size.
    #[arg(long, default_value_t = 20_000)]
    vocab: u32,
    /// Topics, of the planted model and of every learned one.
    #[arg(long, default_value_t = 100)]
    topics: usize,
    /// Tokens per document.
    #[arg(long, default_value_t = 100)]
    doc_len: u32,
    /// Document-topic prior, of the planted model and of every learned one.
    #[arg(long, default_value_t = 0.1)]
    alpha: f64,
    /// Topic-word prior of the planted model.
    #[arg(long, default_value_t = 0.05)]
    planted_eta: f64,
    /// Topic-word prior of every learned model.
    #[arg(long, default_value_t = 0.01)]
    eta: f64,
    /// Held-out per-token log-likelihood to reach (default: the planted model's minus
    /// `--bar-gap`).
    #[arg(long, allow_hyphen_values = true)]
    bar: Option<f64>,
    /// How far below the planted model's held-out score the default bar is.
    #[arg(long, default_value_t = 0.05)]
    bar_gap: f64,
    /// Gibbs sweeps at most (bare loop and ebbflow).
    #[arg(long, default_value_t = 400)]
    max_sweeps: u64,
    /// The bare loop is scored every this many sweeps.
    #[arg(long, default_value_t = 10)]
    eval_every: u64,
    /// Threads for ebbflow's workers, gensim's and the generator (default: this machine's cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Seed of the data and the samplers.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Python with gensim and lda (scripts/bench-lda-scale.sh sets it up); without it peers are
    /// not run.
    #[arg(long, env = "EBBFLOW_LDA_PYTHON")]
    python: Option<PathBuf>,
    /// Peers to run (`--peers ''` for none, with `--bar` from an earlier run).
    #[arg(long, value_delimiter = ',', default_value = "gensim,lda")]
    peers: Vec<String>,
    /// gensim: passes at most (one snapshot scored per pass).
    #[arg(long, default_value_t = 10)]
    gensim_passes: u32,
    /// The lda package: Gibbs iterations of its one fit.
    #[arg(long, default_value_t = 100)]
    lda_iterations: u32,
    /// Clocks a sweep of the in-process run (default: the app's, `lda_clocks_per_pass` of the
    /// threads under BSP).
    #[arg(long)]
    clocks_per_sweep: Option<usize>,
    /// Where the training file and the peers' topics go.
    #[arg(long, default_value = "/tmp/ebbflow-lda-scale")]
    work: PathBuf,
}

/// The corpus in LDA-C (`N id:count …`, 0-based ids), the format every peer reads.
fn write_ldac(path: &Path, corpus: &Corpus) -> anyhow::Result<()> {
    let mut out = std::io::BufWriter::with_capacity(1 << 20, std::fs::File::create(path)?);
    for doc in &corpus.docs {
        write!(out, "{}", doc.len())?;
        for (word, count) in doc {
            write!(out, " {word}:{count}")?;
        }
        writeln!(out)?;
    }
    out.flush()?;
    Ok(())
}

/// Float32 little-endian `topics × vocab`, as the peers write them.
fn read_topics(path: &Path, topics: usize, vocab: usize) -> anyhow::Result<Vec<f32>> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    if bytes.len() != topics * vocab * 4 {
        bail!(
            "{} holds {} bytes, not {topics} × {vocab} float32",
            path.display(),
            bytes.len()
        );
    }
    Ok(bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect())
}

struct Bench<'a> {
    /// The bare loop's (a clock is a sweep).
    app: &'a LdaApp,
    /// The in-process runs' (`--clocks-per-sweep`, else the same).
    ps_app: &'a LdaApp,
    /// The one held-out evaluator every model is scored by.
    score: &'a dyn Fn(&[f32]) -> anyhow::Result<f64>,
    bar: f64,
}

impl Bench<'_> {
    fn score(&self, topic_words: &[f32]) -> anyhow::Result<f64> {
        (self.score)(topic_words)
    }

    /// The bare loop, scored every `every` sweeps until the bar or `max` sweeps.
    fn bare(&self, every: u64, max: u64) -> anyhow::Result<(ToBar, f64)> {
        let mut bare = BareLoop::new(self.app);
        let (mut seconds, mut tokens, mut sweeps) = (0.0, 0u64, 0u64);
        let mut score = f64::NEG_INFINITY;
        while sweeps < max && score < self.bar {
            let start = Instant::now();
            for _ in 0..every.min(max - sweeps) {
                tokens += bare.clock().updates;
                sweeps += 1;
            }
            seconds += start.elapsed().as_secs_f64();
            score = self.score(&self.app.topic_words(bare.tables()))?;
            eprintln!("bare loop: {sweeps} sweeps, {seconds:.1} s: held-out {score:.4}");
        }
        let to_bar = ToBar {
            steps: sweeps,
            seconds,
            quality: score,
            reached: score >= self.bar,
        };
        Ok((to_bar, tokens as f64 / seconds))
    }

    /// The in-process parameter server with `workers` threads for `first` sweeps, then a
    /// sixteenth more each run until one run's final topics reach the bar (each run from scratch;
    /// its training time counts).
    fn ps(&self, workers: usize, first: u64, max: u64) -> anyhow::Result<(ToBar, f64)> {
        let per_sweep = self.ps_app.clocks_per_pass(workers) as u64;
        let mut sweeps = first.max(1);
        loop {
            let config = JobConfig {
                clocks: sweeps * per_sweep,
                staleness: 0,
                workers,
                partitions: 4,
                process_cache: true,
                keep_params: true,
                ..JobConfig::default()
            };
            let run = run_single_process(self.ps_app, &config, &RuntimeMetrics::unregistered())?;
            let params = run.params.as_ref().context("the run kept its parameters")?;
            let score = self.score(&self.app.topic_words(params))?;
            eprintln!(
                "ebbflow in-process, {workers} workers: {sweeps} sweeps ({} clocks), {:.1} s: \
                 held-out {score:.4}",
                config.clocks, run.elapsed_seconds
            );
            let to_bar = ToBar {
                steps: sweeps,
                seconds: run.elapsed_seconds,
                quality: score,
                reached: score >= self.bar,
            };
            if to_bar.reached || sweeps >= max {
                return Ok((to_bar, run.updates_per_second));
            }
            sweeps = (sweeps + sweeps.div_ceil(16)).min(max);
        }
    }
}

/// Runs `bench/lda_peers.py` for one peer: its snapshots (pass, seconds, tokens/s, topics file),
/// or why it did not run.
fn run_peer(
    python: &Path,
    script: &Path,
    args: &[String],
) -> Result<(String, Vec<(u64, f64, f64, PathBuf)>), String> {
    eprintln!("==> peer: {} {}", script.display(), args.join(" "));
    let output = Command::new(python)
        .arg(script)
        .args(args)
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| format!("cannot run {}: {e}", python.display()))?;
    if !output.status.success() {
        return Err(format!("failed ({}); its error is above", output.status));
    }
    let mut name = String::new();
    let mut snapshots = Vec::new();
    for line in String::from_utf8_lossy(&output.stdout).lines() {
        let value: serde_json::Value =
            serde_json::from_str(line).map_err(|e| format!("printed {line:?}: {e}"))?;
        if value["done"].as_bool() == Some(true) {
            return Ok((name, snapshots));
        }
        name = value["peer"].as_str().unwrap_or_default().to_string();
        let (Some(pass), Some(seconds), Some(rate), Some(file)) = (
            value["pass"].as_u64(),
            value["seconds"].as_f64(),
            value["tokens_per_s"].as_f64(),
            value["topics_file"].as_str(),
        ) else {
            return Err(format!("printed {line:?}, not a snapshot"));
        };
        snapshots.push((pass, seconds, rate, PathBuf::from(file)));
    }
    Err("ended without its last line".into())
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let threads = scale::threads_or_cores(args.threads);
    let source = PlantedCorpus {
        docs: args.docs,
        vocab: args.vocab,
        topics: args.topics,
        doc_len: args.doc_len,
        alpha: args.alpha,
        eta: args.planted_eta,
        held_out: args.held_out,
        seed: args.seed,
    };
    let mut report = Report::default();
    let start = Instant::now();
    let docs = source.generate(None, threads, data::available_memory())?;
    let generated = start.elapsed().as_secs_f64();
    let tokens = docs.train.num_tokens();
    report.add(
        "data".into(),
        format!(
            "planted LDA, {} topics, alpha {}, eta {}: {} training documents × {} tokens \
             ({tokens} tokens), {} words, {} held-out documents",
            args.topics,
            args.alpha,
            args.planted_eta,
            docs.train.docs.len(),
            args.doc_len,
            args.vocab,
            docs.held_out.docs.len()
        ),
    );
    report.add(
        format!("generation ({threads} threads)"),
        format!(
            "{generated:.1} s ({:.1} M tokens/s)",
            tokens as f64 / generated / 1e6
        ),
    );
    let truth: Vec<f32> = source
        .topic_words(threads)?
        .iter()
        .map(|&p| p as f32)
        .collect();
    let score = |topic_words: &[f32]| -> anyhow::Result<f64> {
        Ok(held_out_log_likelihood(
            topic_words,
            args.topics,
            &docs.held_out,
            args.alpha,
            threads,
        )?)
    };
    let truth_score = score(&truth)?;
    report.add(
        "held-out per-token log-likelihood of the planted topics (document completion)".into(),
        format!("{truth_score:.4}"),
    );
    std::fs::create_dir_all(&args.work)?;
    let train_file = args.work.join("train.ldac");
    if args.python.is_some() {
        write_ldac(&train_file, &docs.train)?;
    }

    // The peers first: the default bar is the best gensim reaches.
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../bench/lda_peers.py");
    let mut peers = Vec::new();
    for peer in args.peers.iter().filter(|peer| !peer.is_empty()) {
        let Some(python) = &args.python else {
            report.add(
                format!("peer {peer}"),
                "not run: no --python (EBBFLOW_LDA_PYTHON)".into(),
            );
            continue;
        };
        let peer_threads = if peer == "lda" { 1 } else { threads };
        let peer_args: Vec<String> = [
            "--peer",
            peer,
            "--train",
            &train_file.display().to_string(),
            "--vocab",
            &args.vocab.to_string(),
            "--topics",
            &args.topics.to_string(),
            "--alpha",
            &args.alpha.to_string(),
            "--eta",
            &args.eta.to_string(),
            "--threads",
            &peer_threads.to_string(),
            "--passes",
            &args.gensim_passes.to_string(),
            "--iterations",
            &args.lda_iterations.to_string(),
            "--seed",
            &args.seed.to_string(),
            "--out-dir",
            &args.work.join(peer).display().to_string(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let (name, snapshots) = match run_peer(python, &script, &peer_args) {
            Ok(result) => result,
            Err(why) => {
                report.add(format!("peer {peer}"), format!("did not run: {why}"));
                continue;
            }
        };
        let unit = if peer == "lda" {
            "iterations"
        } else {
            "passes"
        };
        let mut scored = Vec::new();
        for (pass, seconds, rate, file) in snapshots {
            let value = score(&read_topics(&file, args.topics, args.vocab as usize)?)?;
            eprintln!("{name}: {pass} {unit}, {seconds:.1} s: held-out {value:.4}");
            let _ = std::fs::remove_file(&file);
            scored.push((pass, seconds, rate, value));
        }
        if scored.is_empty() {
            report.add(format!("peer {peer}"), "did not run: no snapshot".into());
            continue;
        }
        peers.push((peer.clone(), name, peer_threads, unit, scored));
    }
    let gensim_best = (peers.iter())
        .filter(|(peer, ..)| peer == "gensim")
        .flat_map(|(.., scored)| scored.iter().map(|s| s.3))
        .reduce(f64::max);
    let (bar, why) = match (args.bar, gensim_best) {
        (Some(bar), _) => (bar, "given".to_string()),
        (None, Some(best)) => (best, "the best gensim reached".to_string()),
        (None, None) => (
            truth_score - args.bar_gap,
            format!("the planted topics' minus {}", args.bar_gap),
        ),
    };
    report.add(
        "the bar: held-out per-token log-likelihood".into(),
        format!("{bar:.4} ({why})"),
    );

    let config = LdaConfig {
        num_topics: args.topics,
        alpha: args.alpha,
        eta: args.eta,
        seed: args.seed,
        ..LdaConfig::default()
    };
    let app = LdaApp::new(docs.train, config)?;
    let ps_app = match args.clocks_per_sweep {
        Some(clocks) => app.clone().with_clocks_per_pass(clocks)?,
        None => app.clone(),
    };
    let bench = Bench {
        app: &app,
        ps_app: &ps_app,
        score: &score,
        bar,
    };
    let (bare, bare_rate) = bench.bare(args.eval_every, args.max_sweeps)?;
    report.add(
        format!("bare loop (1 thread): time to held-out >= {bar:.4}"),
        bare.text(bar, "sweeps", "held-out", "<"),
    );
    report.add(
        "bare loop: tokens/s".into(),
        format!("{:.2} M", bare_rate / 1e6),
    );
    let (ours, rate) = bench.ps(threads, bare.steps, args.max_sweeps)?;
    report.add(
        format!(
            "ebbflow in-process, {threads} worker threads ({} clocks a sweep): time to \
             held-out >= {bar:.4}",
            ps_app.clocks_per_pass(threads)
        ),
        ours.text(bar, "sweeps", "held-out", "<"),
    );
    report.add(
        format!("ebbflow in-process, {threads} worker threads: tokens/s"),
        format!("{:.2} M (÷ bare loop {:.2})", rate / 1e6, rate / bare_rate),
    );
    report.add(
        "this process's peak RSS (ebbflow's runs)".into(),
        format!("{:.0} MiB", peak_rss_mib()),
    );

    for (peer, name, peer_threads, unit, scored) in &peers {
        let reached = scored.iter().find(|s| s.3 >= bar);
        let &(pass, seconds, rate, value) = reached.unwrap_or(scored.last().expect("not empty"));
        let theirs = ToBar {
            steps: pass,
            seconds,
            quality: value,
            reached: reached.is_some(),
        };
        report.add(
            format!("{name} ({peer_threads} thread(s)): time to held-out >= {bar:.4}"),
            theirs.text(bar, unit, "held-out", "<"),
        );
        report.add(
            format!("{name}: tokens/s (tokens × {unit} ÷ s)"),
            format!("{:.2} M", rate / 1e6),
        );
        for (what, ours) in [("bare loop, 1 thread", &bare), ("in-process", &ours)] {
            let label = format!("speed, ebbflow {what} ÷ {peer}: its time to the bar ÷ ours");
            if theirs.reached && ours.reached {
                report.add(label, format!("{:.2}×", theirs.seconds / ours.seconds));
            } else if ours.reached {
                report.add(
                    label,
                    format!(
                        "more than {:.2}× ({peer} did not reach the bar in {:.1} s)",
                        theirs.seconds / ours.seconds,
                        theirs.seconds
                    ),
                );
            }
        }
    }

    report.print_table()?;
    if !ours.reached {
        bail!(
            "ebbflow did not reach held-out {bar:.4} in {} sweeps",
            args.max_sweeps
        );
    }
    Ok(())
}
