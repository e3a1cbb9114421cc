//! `ebbflow run`: the whole loop on one machine.
//!
//! Reads the same `TrainingJob` manifest a cluster would (same validation, same messages), trains
//! it for real with the elastic runtime (`ebbflow_runtime::elastic`: every node a set of threads
//! with its own TCP data-plane server on 127.0.0.1), and replays the manifest's spot trace on an
//! accelerated clock (`--speed`): the BidBrain bidder buys and releases transient capacity, the
//! operator's provisioning plan turns that into nodes to launch and release ([`provisioner`]),
//! and new nodes join the job; trace evictions arrive as notices with the scaled notice window,
//! and nodes still there at their deadline fail. The bill accrues under the job's billing model next to the
//! on-demand equivalent. At the end it writes `summary.json`, `timeseries.csv` and `chart.svg`.

pub mod instances;
pub mod pod;
pub mod provisioner;
pub mod replay;
mod report;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use ebbflow_crds::{AppKind, DatasetFormat, ServerOptimizer, TrainingJob};
use ebbflow_runtime::app::App;
use ebbflow_runtime::apps::{LdaApp, LdaConfig, MfApp, MfConfig, MlrApp, MlrConfig, mf};
use ebbflow_runtime::data;
use ebbflow_runtime::divergence::HaltCause;
use ebbflow_runtime::elastic::{
    ElasticConfig, ElasticEvent, ElasticReport, LiveFeed, StageThresholds, run_elastic_live,
};
use ebbflow_runtime::elastic_coordinator::{ElasticJob, run_elastic_job};
use ebbflow_runtime::elastic_node::{ElasticNodeSettings, NoticeSources};
use ebbflow_runtime::exact::{ExactApp, ExactConfig};
use ebbflow_runtime::metrics::RuntimeMetrics;
use ebbflow_runtime::optimizer::Optimizer;
use ebbflow_runtime::tls::TransportSecurity;
use ebbflow_runtime::worker::JobConfig;
use indicatif::{ProgressBar, ProgressStyle};
use prometheus::Registry;

use crate::job_metrics::JobMetrics;
use crate::jobmarket::JobMarketError;
use crate::jobmarket::app_model_status;
use ebbflow_bidbrain::bidder::probe::{
    CALIBRATION_WEIGHT, Observation, ProbeEvent, ProbeSettings, ThroughputProbe,
};
use ebbflow_bidbrain::bidder::{Calibrator, JobState, ThroughputFeed};
use ebbflow_bidbrain::sim::grid::MarketGrid;
use provisioner::{Assignment, LiveAllocation, LocalProvisioner};
use replay::{Bill, MarketReplay, ReplayEvent};
pub use report::{AppModelSummary, RunSummary, TimePoint};

/// Arguments of `ebbflow run`.
#[derive(clap::Args, Clone, Debug)]
pub struct RunArgs {
    /// The TrainingJob manifest (the same YAML `kubectl apply` takes).
    pub manifest: PathBuf,
    /// Trace seconds per wall-clock second (360: one trace hour in ten seconds).
    #[arg(long, default_value_t = 360.0)]
    pub speed: f64,
    /// Shortest wall-clock lead, in seconds, a replayed interruption notice reaches the runtime
    /// with. A notice's trace lead (EC2: 120 s) divided by `--speed` is stretched up to this,
    /// by at most 10 times, so the default replay gives the runtime the time real EC2 gives it
    /// (0.33 s at 360× becomes 2 s), while a replay ten times faster still than what makes the
    /// floor reachable keeps its notices late (`--speed 12000`: the storm). 0: notices are
    /// compressed like the rest of the trace.
    #[arg(long, default_value_t = 2.0)]
    pub notice_floor: f64,
    /// Output directory (default: a fresh `ebbflow-run-<job>-<unix time>`).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Address of the run's Prometheus `/metrics` (port 0: any free port, printed at start).
    #[arg(long, default_value = "127.0.0.1:0")]
    pub metrics_addr: std::net::SocketAddr,
    /// Directory holding relative dataset paths (default: EBBFLOW_DATA_DIR, else the manifest's
    /// directory).
    #[arg(long, env = "EBBFLOW_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// No live progress bar (for logs and tests).
    #[arg(long)]
    pub quiet: bool,
    /// Run every instance as threads of this process instead of one `ebbflow node` process per
    /// instance.
    #[arg(long)]
    pub in_process: bool,
    /// The executable started for each instance (default: this one).
    #[arg(long, hide = true)]
    pub node_exe: Option<PathBuf>,
    /// Calibration file from `ebbflow-elastic-bench --stages --calibration-out FILE`: the
    /// bidder values capacity with the measured throughput-vs-ratio table instead of the
    /// linear φ term (docs/bidder.md), as `ebbflow simulate --calibration` does.
    #[arg(long)]
    pub calibration: Option<PathBuf>,
    /// Keep the bidder on the spec's application model: ν, φ, σ and λ are still measured from
    /// the run and reported in `summary.json`, but no decision uses them.
    #[arg(long)]
    pub no_recalibrate: bool,
}

/// Arguments of `ebbflow node` (one instance of a local run; started by `ebbflow run`).
#[derive(clap::Args, Clone, Debug)]
pub struct NodeArgs {
    /// The TrainingJob manifest of the run.
    pub manifest: PathBuf,
    /// The run's coordinator (admin API URL).
    #[arg(long)]
    pub coordinator: String,
    /// The instance's name.
    #[arg(long)]
    pub name: String,
    /// A transient (spot) instance.
    #[arg(long)]
    pub transient: bool,
    /// Directory holding relative dataset paths.
    #[arg(long, env = "EBBFLOW_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// The job secret (not empty).
    #[arg(
        long,
        env = "EBBFLOW_JOB_SECRET",
        hide_env_values = true,
        value_parser = clap::builder::NonEmptyStringValueParser::new()
    )]
    pub secret: String,
}

/// Errors of `ebbflow run`, each one line that names what was wrong.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The manifest could not be read.
    #[error("read manifest {path}: {source}")]
    ReadManifest {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The manifest is not a valid TrainingJob (the API server's messages).
    #[error("{0}")]
    ParseManifest(#[from] ebbflow_crds::ManifestError),
    /// A runtime pod's environment is missing or malformed, or its part of the job failed.
    #[error("ebbflow pod: {0}")]
    Pod(String),
    /// The job asks for something `ebbflow run` cannot do.
    #[error("{0}")]
    Unsupported(String),
    /// The dataset could not be loaded or the app built.
    #[error("dataset: {0}")]
    LoadData(String),
    /// The calibration file could not be used (the message names the file and field).
    #[error("{0}")]
    Calibration(#[from] ebbflow_bidbrain::bidder::CalibrationError),
    /// The market trace could not be loaded.
    #[error("market trace {path}: {reason}")]
    LoadTrace {
        /// The trace.
        path: String,
        /// Why.
        reason: String,
    },
    /// The metrics address could not be bound.
    #[error("bind metrics address {addr}: {source}")]
    BindMetrics {
        /// The address.
        addr: std::net::SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// The app's own code failed (a Python app's hook raised or returned bad data).
    #[error("{app} failed: {failure}")]
    AppFailed {
        /// The app kind.
        app: String,
        /// Where and how: the hook, the clock and the error.
        failure: ebbflow_runtime::divergence::Divergence,
    },
    /// Training diverged: the model is not a result.
    #[error(
        "{app} diverged: {divergence} (lower spec.app.hyperparameters.learningRate, or use \
         spec.app.serverOptimizer adagrad)"
    )]
    Diverged {
        /// The app kind.
        app: String,
        /// Where and how.
        divergence: ebbflow_runtime::divergence::Divergence,
    },
    /// Training failed.
    #[error("training failed: {0}")]
    Train(#[from] ebbflow_runtime::elastic::ElasticError),
    /// The job's coordinator failed.
    #[error("coordinator: {0}")]
    Coordinate(#[from] ebbflow_runtime::elastic_coordinator::ElasticJobError),
    /// An instance process could not be started or failed.
    #[error("instance {name}: {reason}")]
    Node {
        /// The instance.
        name: String,
        /// What went wrong.
        reason: String,
    },
    /// Writing results failed.
    #[error("write {path}: {source}")]
    WriteOutputs {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
}

impl From<JobMarketError> for RunError {
    fn from(error: JobMarketError) -> Self {
        match error {
            JobMarketError::Unsupported(message) => Self::Unsupported(message),
            JobMarketError::LoadTrace { path, reason } => Self::LoadTrace { path, reason },
        }
    }
}

/// A job's app, built from its spec.
#[derive(Clone)]
enum JobApp {
    Mf(MfApp),
    Mlr(MlrApp),
    Lda(LdaApp),
    /// The integer-exact self-test (kind SelfTest).
    SelfTest(ExactApp),
    /// A model written with the Python SDK (built with the `python` feature).
    #[cfg(feature = "python")]
    Python(ebbflow_python::PyApp),
}

/// Evaluates `$body` with `$app` bound to the concrete app inside the [`JobApp`] `$job_app`
/// (each app is its own type: the runtime is generic over [`App`]).
macro_rules! with_job_app {
    ($job_app:expr, $app:ident => $body:expr) => {
        match $job_app {
            JobApp::Mf($app) => $body,
            JobApp::Mlr($app) => $body,
            JobApp::Lda($app) => $body,
            JobApp::SelfTest($app) => $body,
            #[cfg(feature = "python")]
            JobApp::Python($app) => $body,
        }
    };
}
use with_job_app;

/// Per-pass learning-rate decay that anneals the rate to 5% of its start over the job's `clocks`
/// at `clocks_per_pass` (the spec names no decay; a fixed one would stop long jobs from learning
/// and leave short ones hot). A job shorter than 1/249 of a pass would need a decay per pass
/// below the smallest `f64`; it gets that smallest one, which still ends its run between 5% and
/// 5.8% of the start.
fn annealing_decay(clocks: u64, clocks_per_pass: usize) -> f64 {
    0.05f64
        .powf(clocks_per_pass.max(1) as f64 / clocks.max(1) as f64)
        .max(f64::MIN_POSITIVE)
}

fn u(value: Option<u64>, default: u64) -> usize {
    value.unwrap_or(default) as usize
}

/// Downloads `url` (`spec.app.dataset.url`, plain http: the runtime carries no TLS stack, so
/// a dataset is served from inside the cluster) into the temporary directory (`/tmp` in a
/// runtime pod, an emptyDir), once per URL: a file already there is reused. The file keeps the URL's
/// file name, so `*.gz` is still gunzipped as it is read. The download streams to a temporary
/// name and is renamed when complete; a failure names the URL.
fn download(url: &str) -> Result<PathBuf, RunError> {
    let fail = |what: String| RunError::LoadData(format!("spec.app.dataset.url {url}: {what}"));
    let name: String = url
        .split(['?', '#'])
        .next()
        .and_then(|path| path.rsplit('/').next())
        .filter(|name| !name.is_empty())
        .unwrap_or("dataset")
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_') {
                c
            } else {
                '_'
            }
        })
        .collect();
    let dir = std::env::temp_dir()
        .join("ebbflow-datasets")
        .join(format!("{:016x}", ebbflow_crds::fnv1a(url)));
    let target = dir.join(&name);
    if target.is_file() {
        return Ok(target);
    }
    std::fs::create_dir_all(&dir).map_err(|e| fail(format!("creating {}: {e}", dir.display())))?;
    let partial = dir.join(format!("{name}.partial"));
    let fetch = {
        let (url, partial) = (url.to_owned(), partial.clone());
        // A thread of its own: the caller may be inside a tokio runtime.
        std::thread::spawn(move || -> Result<u64, String> {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| format!("starting a runtime: {e}"))?;
            rt.block_on(async {
                use std::io::Write as _;
                let mut response = reqwest::get(&url).await.map_err(|e| e.to_string())?;
                if !response.status().is_success() {
                    return Err(format!("answered {}", response.status()));
                }
                let mut file = std::fs::File::create(&partial)
                    .map_err(|e| format!("creating {}: {e}", partial.display()))?;
                let mut bytes = 0u64;
                while let Some(chunk) = response.chunk().await.map_err(|e| e.to_string())? {
                    file.write_all(&chunk)
                        .map_err(|e| format!("writing {}: {e}", partial.display()))?;
                    bytes += chunk.len() as u64;
                }
                file.sync_all()
                    .map_err(|e| format!("writing {}: {e}", partial.display()))?;
                Ok(bytes)
            })
        })
    };
    let bytes = fetch
        .join()
        .map_err(|_| fail("the download thread panicked".into()))?
        .map_err(fail)?;
    std::fs::rename(&partial, &target)
        .map_err(|e| fail(format!("renaming {}: {e}", partial.display())))?;
    tracing::info!(url, bytes, path = %target.display(), "dataset downloaded");
    Ok(target)
}

/// Where a job's relative dataset paths resolve, and how an error says so to whoever runs it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct DataDir<'a> {
    /// The directory.
    pub path: &'a Path,
    /// Where it comes from, for the error of a missing dataset.
    pub hint: &'a str,
}

impl<'a> DataDir<'a> {
    /// The data directory of `ebbflow run` and `ebbflow node`.
    fn cli(path: &'a Path) -> Self {
        Self {
            path,
            hint: "relative paths resolve against --data-dir or EBBFLOW_DATA_DIR; \
                   scripts/fetch-data.sh downloads the real sets",
        }
    }
}

/// `spec.app.dataset.path` resolved against `data_dir` when relative; an error naming it unless
/// `found` holds for it.
fn dataset_at(
    path: &str,
    data_dir: DataDir<'_>,
    found: fn(&Path) -> bool,
) -> Result<PathBuf, RunError> {
    let path = Path::new(path);
    let path = if path.is_absolute() {
        path.to_path_buf()
    } else {
        data_dir.path.join(path)
    };
    if found(&path) {
        Ok(path)
    } else {
        Err(RunError::LoadData(format!(
            "spec.app.dataset.path: {} does not exist ({})",
            path.display(),
            data_dir.hint
        )))
    }
}

/// Synthetic MatrixFactorization data with more ratings than this is generated by
/// [`data::PlantedRatings`], each worker its own shard (defaults: the Netflix shape, true rank
/// 16, noise 0.1); up to it, in full by `data::synthetic_ratings` (the quickstart's size).
/// A synthetic LDA corpus of more tokens is generated by [`data::PlantedCorpus`] (in parallel,
/// refused before allocation where it cannot fit), and synthetic LogisticRegression examples of
/// more values (samples × features) by [`data::PlantedExamples`], each worker its own shard.
pub const PLANTED_ABOVE: u64 = 2_000_000;

/// Builds the app the spec describes: seeded synthetic data or a file in a supported format.
fn build_app(job: &TrainingJob, data_dir: DataDir<'_>) -> Result<JobApp, RunError> {
    let app = &job.spec.app;
    let hyper = app.hyperparameters.clone().unwrap_or_default();
    let load = |e: &dyn std::fmt::Display| RunError::LoadData(e.to_string());
    let file = |path: &str| dataset_at(path, data_dir, Path::is_file);
    let f32_or = |value: Option<f64>, default: f32| value.map_or(default, |v| v as f32);
    let dataset = &app.dataset;
    // A dataset URL is downloaded once and then read as a path.
    let dataset_path = match &dataset.url {
        Some(url) => Some(download(url)?.display().to_string()),
        None => dataset.path.clone(),
    };
    let clocks = job.spec.stop.iterations.unwrap_or(100);
    let workers = elastic_config(job).job.workers;
    let staleness = u64::from(job.spec.consistency.effective_staleness());
    let seed = dataset.synthetic.as_ref().map_or(42, |s| u64::from(s.seed));
    Ok(match app.kind {
        AppKind::MatrixFactorization => {
            let defaults = MfConfig::default();
            let rank = hyper.rank.map_or(defaults.rank, |r| r as usize);
            // LIBMF's rate with its adaptive step, which needs no decay (a decaying rate's is set
            // below, from the job's length)
            let adaptive = hyper.adaptive_step.unwrap_or(false);
            let rate = if adaptive {
                0.1
            } else {
                defaults.learning_rate
            };
            let config = MfConfig {
                rank,
                learning_rate: f32_or(hyper.learning_rate, rate),
                decay: 1.0,
                regularization: f32_or(hyper.regularization, defaults.regularization),
                // LIBMF's 1/√rank at high ranks: at rank 1000 a std of 0.1 put noise of std 0.3
                // in every initial prediction, and 8 passes on 5 M ratings left test RMSE 0.88
                // (0.47 with 0.03)
                init_std: defaults.init_std.min(1.0 / (rank as f32).sqrt()),
                adaptive,
                threads: threads_per_worker(&job.spec.runtime),
                seed,
                staleness,
                ..defaults
            };
            let app = if let Some(s) = &dataset.synthetic
                && u(s.ratings, 12_000) as u64 > PLANTED_ABOVE
            {
                // At scale each worker generates its own shard (issue 36): nothing is generated
                // here but the test set, and no node holds the ratings of shards it does not train.
                let ratings = u(s.ratings, 12_000) as u64;
                let source = data::PlantedRatings {
                    users: s
                        .users
                        .unwrap_or(u64::from(data::NETFLIX.0))
                        .min(u64::from(u32::MAX)) as u32,
                    items: s
                        .items
                        .unwrap_or(u64::from(data::NETFLIX.1))
                        .min(u64::from(u32::MAX)) as u32,
                    ratings,
                    true_rank: s.true_rank.unwrap_or(16) as usize,
                    noise: s.noise.unwrap_or(0.1),
                    test_fraction: data::PlantedRatings::test_fraction_for(ratings),
                    seed,
                };
                // a node's cores generate its shards
                let threads = worker_threads(&job.spec.runtime) * config.threads;
                // rows far larger than the cache: each worker's shard in blocks (MfConfig::blocked)
                let config = MfConfig {
                    blocked: true,
                    ..config
                };
                MfApp::planted(source, config, threads, workers, data::available_memory())
                    .map_err(|e| load(&e))?
            } else {
                let ratings = if let Some(s) = &dataset.synthetic {
                    data::synthetic_ratings(
                        s.users.unwrap_or(400) as u32,
                        s.items.unwrap_or(200) as u32,
                        s.true_rank.unwrap_or(4) as usize,
                        u(s.ratings, 12_000),
                        s.noise.unwrap_or(0.1),
                        seed,
                    )
                    .map_err(|e| load(&e))?
                    .ratings
                } else {
                    match (&dataset_path, dataset.format) {
                        (Some(path), Some(DatasetFormat::MovielensInter) | None) => {
                            data::load_movielens_inter(&file(path)?).map_err(|e| load(&e))?
                        }
                        (Some(path), Some(DatasetFormat::Csv)) => {
                            data::load_ratings_csv(&file(path)?).map_err(|e| load(&e))?
                        }
                        (_, format) => {
                            return Err(RunError::Unsupported(format!(
                                "spec.app.dataset: ebbflow run reads MatrixFactorization data as synthetic or a movielens-inter or csv path, not {format:?}"
                            )));
                        }
                    }
                };
                let (train, test) = ratings.split(0.2, seed).map_err(|e| load(&e))?;
                MfApp::new(train, test, config).map_err(|e| load(&e))?
            };
            if adaptive {
                // the adaptive step anneals itself (LIBMF's has no decay)
                JobApp::Mf(app)
            } else {
                let decay = (annealing_decay(clocks, app.clocks_per_pass(workers)) as f32)
                    .max(f32::MIN_POSITIVE);
                JobApp::Mf(app.with_decay(decay).map_err(|e| load(&e))?)
            }
        }
        AppKind::LogisticRegression => {
            let defaults = MlrConfig::default();
            let config = MlrConfig {
                learning_rate: f32_or(hyper.learning_rate, defaults.learning_rate),
                regularization: f32_or(hyper.regularization, defaults.regularization),
                batch_size: hyper.batch_size.map_or(defaults.batch_size, |v| v as usize),
                seed,
                ..defaults
            };
            let with_decay = |train_len: usize| MlrConfig {
                decay: annealing_decay(clocks, MlrApp::steps_for(train_len, config.batch_size)),
                ..config.clone()
            };
            let planted_values = dataset
                .synthetic
                .as_ref()
                .map_or(0, |s| u(s.samples, 2000) as u64 * u(s.features, 20) as u64);
            if let Some(s) = &dataset.synthetic
                && planted_values > PLANTED_ABOVE
            {
                // At scale each worker generates its own shard (issue 36), the coordinator the
                // test set at its first evaluation; the same model as below.
                let examples = u(s.samples, 2000) as u64;
                let source = data::PlantedExamples {
                    examples,
                    features: u(s.features, 20),
                    classes: s.classes.unwrap_or(5) as usize,
                    separation: 1.0,
                    test_fraction: data::PlantedExamples::test_fraction_for(examples),
                    seed,
                };
                let config = with_decay(source.train_len() as usize);
                let threads = worker_threads(&job.spec.runtime);
                let app =
                    MlrApp::planted(source, config, threads, workers, data::available_memory())
                        .map_err(|e| load(&e))?;
                return Ok(JobApp::Mlr(app));
            }
            let examples = if let Some(s) = &dataset.synthetic {
                data::synthetic_classification(
                    u(s.samples, 2000),
                    u(s.features, 20),
                    s.classes.unwrap_or(5) as usize,
                    1.0,
                    seed,
                )
                .map_err(|e| load(&e))?
                .examples
            } else {
                match (&dataset_path, dataset.format) {
                    (Some(path), Some(DatasetFormat::Libsvm)) => {
                        data::load_libsvm(&file(path)?).map_err(|e| load(&e))?
                    }
                    (Some(path), _) => {
                        // CSV, label last (scikit-learn's digits layout), features scaled into
                        // [-1, 1] by the file's largest absolute value (digits: 1/16).
                        let mut examples =
                            data::load_csv(&file(path)?, data::LabelColumn::Last, false)
                                .map_err(|e| load(&e))?;
                        let largest = examples.max_abs();
                        if largest > 0.0 {
                            examples.scale(1.0 / largest);
                        }
                        examples
                    }
                    (None, _) => {
                        return Err(RunError::Unsupported(
                            "spec.app.dataset: needs synthetic or a path".into(),
                        ));
                    }
                }
            };
            let (train, test) = examples.split(0.2, seed).map_err(|e| load(&e))?;
            let config = with_decay(train.len());
            JobApp::Mlr(MlrApp::new(train, test, config).map_err(|e| load(&e))?)
        }
        AppKind::Lda => {
            let defaults = LdaConfig::default();
            let config = LdaConfig {
                num_topics: hyper.topics.map_or(defaults.num_topics, |v| v as usize),
                alpha: hyper.alpha.unwrap_or(defaults.alpha),
                eta: hyper.beta.unwrap_or(defaults.eta),
                seed,
                staleness,
                ..defaults
            };
            let planted_tokens = dataset.synthetic.as_ref().map_or(0, |s| {
                s.documents.unwrap_or(200) * u64::from(s.words_per_document.unwrap_or(80))
            });
            let corpus = if let Some(s) = &dataset.synthetic
                && planted_tokens > PLANTED_ABOVE
            {
                // At scale: data::PlantedCorpus, refused before allocation where a shard cannot
                // fit (the same model as below: alpha 0.1, eta 0.05).
                let source = data::PlantedCorpus {
                    docs: s.documents.unwrap_or(200),
                    vocab: s.vocabulary.unwrap_or(500).min(u64::from(u32::MAX)) as u32,
                    topics: s.true_topics.unwrap_or(10) as usize,
                    doc_len: s.words_per_document.unwrap_or(80),
                    alpha: 0.1,
                    eta: 0.05,
                    held_out: 0,
                    seed,
                };
                // Each worker generates its own documents (issue 36): nothing but the planted
                // topics is generated here.
                let threads = worker_threads(&job.spec.runtime);
                let app =
                    LdaApp::planted(source, config, threads, workers, data::available_memory())
                        .map_err(|e| load(&e))?;
                return Ok(JobApp::Lda(app));
            } else if let Some(s) = &dataset.synthetic {
                data::synthetic_corpus(
                    u(s.documents, 200),
                    u(s.vocabulary, 500),
                    s.true_topics.unwrap_or(10) as usize,
                    s.words_per_document.unwrap_or(80) as usize,
                    0.1,
                    0.05,
                    seed,
                )
                .map_err(|e| load(&e))?
                .corpus
            } else {
                let path = dataset_path.as_deref().ok_or_else(|| {
                    RunError::Unsupported("spec.app.dataset: needs synthetic or a path".into())
                })?;
                data::load_ldac(&file(path)?).map_err(|e| load(&e))?
            };
            JobApp::Lda(LdaApp::new(corpus, config).map_err(|e| load(&e))?)
        }
        AppKind::Python => python_app(job, dataset_path.as_deref(), data_dir)?,
        AppKind::SelfTest => JobApp::SelfTest(ExactApp::new(self_test_config(clocks, staleness))),
    })
}

/// Kind SelfTest's table: 2 tables of 4,096 rows of 4 values, the first 16 rows of each
/// updated by every worker every clock (the rest by one worker each), 10 ms of work a clock,
/// checked against `clocks` clocks of SSP `staleness`.
pub fn self_test_config(clocks: u64, staleness: u64) -> ExactConfig {
    ExactConfig {
        rows: 4096,
        width: 4,
        tables: 2,
        shared_rows: 16,
        clocks,
        staleness,
        clock_delay: Duration::from_millis(10),
        update_period: 1,
    }
}

/// The Python app of a job: `spec.app.python`'s class, imported with its `path` in front, its
/// dataset (a raw file or directory) given to it as `EBBFLOW_DATASET`.
#[cfg(feature = "python")]
fn python_app(
    job: &TrainingJob,
    dataset_path: Option<&str>,
    data_dir: DataDir<'_>,
) -> Result<JobApp, RunError> {
    let python =
        job.spec.app.python.as_ref().ok_or_else(|| {
            RunError::LoadData("spec.app.python is required for kind Python".into())
        })?;
    ebbflow_python::embed().map_err(|e| RunError::LoadData(format!("starting Python: {e}")))?;
    if let Some(path) = dataset_path {
        // A file or a directory: the app reads it.
        let path = dataset_at(path, data_dir, Path::exists)?;
        // For the app's own code (Python's os.environ: this process and its children).
        ebbflow_python::set_env("EBBFLOW_DATASET", &path.display().to_string())
            .map_err(|e| RunError::LoadData(format!("setting EBBFLOW_DATASET: {e}")))?;
    }
    let args = python
        .args
        .as_ref()
        .map(|args| serde_json::Value::Object(args.clone()).to_string());
    let mut path: Vec<PathBuf> = python.path.iter().map(PathBuf::from).collect();
    path.extend(ebbflow_python::python_path());
    let app = ebbflow_python::PyApp::load(&python.entry, args.as_deref(), &path)
        .map_err(|e| RunError::LoadData(e.to_string()))?;
    Ok(JobApp::Python(app))
}

#[cfg(not(feature = "python"))]
fn python_app(job: &TrainingJob, _: Option<&str>, _: DataDir<'_>) -> Result<JobApp, RunError> {
    Err(RunError::LoadData(format!(
        "spec.app.kind Python ({}): this ebbflow was built without Python apps; build it with          `cargo build --release -p ebbflow-job --features python` (docs/python.md)",
        job.spec
            .app
            .python
            .as_ref()
            .map_or("no entry", |p| p.entry.as_str())
    )))
}

/// Threads each worker's clock runs on: `spec.runtime.threadsPerWorker` (MatrixFactorization
/// only, a CEL rule), 1 to [`mf::BLOCK_BINS`], default 1.
fn threads_per_worker(runtime: &ebbflow_crds::RuntimeSpec) -> usize {
    runtime
        .threads_per_worker
        .unwrap_or(1)
        .clamp(1, mf::BLOCK_BINS) as usize
}

/// Workers per node: `spec.runtime.workerThreads`, else one per requested CPU (rounded up; the
/// operator requests 1 when the spec names none) and `threadsPerWorker` of them, at least 1.
fn worker_threads(runtime: &ebbflow_crds::RuntimeSpec) -> usize {
    let requested_cpus = || {
        let cpu = runtime.resources.as_ref()?.requests.as_ref()?.get("cpu")?;
        let text = cpu.0.trim();
        let cores = match text.strip_suffix('m') {
            Some(milli) => milli.parse::<f64>().ok()? / 1000.0,
            None => text.parse::<f64>().ok()?,
        };
        (cores.is_finite() && cores > 0.0).then(|| cores.ceil().min(1024.0) as u32)
    };
    let per_worker = threads_per_worker(runtime) as u32;
    runtime
        .worker_threads
        .or_else(|| requested_cpus().map(|cpus| cpus.div_ceil(per_worker)))
        .unwrap_or(1)
        .max(1) as usize
}

/// The rule servers apply workers' deltas with (`spec.app.serverOptimizer`; default sgd, the
/// deltas added as sent).
fn server_optimizer(kind: Option<ServerOptimizer>) -> Optimizer {
    match kind {
        None | Some(ServerOptimizer::Sgd) => Optimizer::Add,
        Some(ServerOptimizer::Momentum) => Optimizer::MOMENTUM,
        Some(ServerOptimizer::Adagrad) => Optimizer::ADAGRAD,
    }
}

/// Iterations between BackupPS copies when the manifest sets no `backupFlushInterval`.
pub const DEFAULT_BACKUP_EVERY: u64 = 5;

/// The elastic run a manifest describes (the same for `ebbflow run` and each `ebbflow node`).
fn elastic_config(job: &TrainingJob) -> ElasticConfig {
    let spec = &job.spec;
    let threads = worker_threads(&spec.runtime);
    let max_nodes = (spec.reliable.count + spec.transient.max_nodes).max(1) as usize;
    let clocks = spec.stop.iterations.unwrap_or(100).max(1);
    let partitions = spec
        .elasticity
        .partitions
        .unwrap_or((max_nodes as u32).div_ceil(2))
        .max(1);
    ElasticConfig {
        job: JobConfig {
            clocks,
            staleness: u64::from(spec.consistency.effective_staleness()),
            workers: threads * max_nodes,
            partitions,
            optimizer: server_optimizer(spec.app.server_optimizer),
            wait_timeout: Duration::from_secs(120),
            transport_security: match spec.runtime.transport_security {
                None | Some(ebbflow_crds::TransportSecurity::Tls) => TransportSecurity::Tls,
                Some(ebbflow_crds::TransportSecurity::None) => TransportSecurity::None,
            },
            ..JobConfig::default()
        },
        thresholds: StageThresholds {
            stage2_above: spec.elasticity.stage2_ratio,
            stage3_above: spec.elasticity.stage3_ratio,
        },
        backup_every: DEFAULT_BACKUP_EVERY,
        backup_interval: spec
            .elasticity
            .backup_flush_interval
            .as_ref()
            .and_then(|interval| interval.to_duration()),
        backup_bandwidth: spec
            .elasticity
            .backup_bandwidth_mbps
            .map(|mbps| mbps * 1e6 / 8.0),
        start: None,
        checkpoint: None,
        reliable: (0..spec.reliable.count)
            .map(|i| format!("od-{i}"))
            .collect(),
        transient: Vec::new(),
    }
}

/// What every process of a run must agree on, and what a coordinator checkpoint is valid for:
/// the job's name and the shape of its training state. That is the app (kind, dataset,
/// hyperparameters, server optimizer), the consistency model, and the derived worker and
/// partition counts (`transient.maxNodes`, `reliable.count`, `runtime.workerThreads` or the CPU
/// request, `elasticity.partitions`): a partition image holds every worker's clock count. Fields
/// that only steer capacity, bidding, stopping or the pods (`stop`, `bidding`, `minNodes`, grace,
/// checkpoint interval, ...) are left out, so a job suspended, edited there and resumed carries
/// on from its checkpoint. The digest is FNV-1a, stable across builds and toolchains (a
/// checkpoint outlives the binary that wrote it); the counts are spelled out so a refused
/// checkpoint's error shows what changed.
pub fn job_id(job: &TrainingJob) -> String {
    let config = elastic_config(job);
    let shape = serde_json::json!({
        "app": job.spec.app,
        "consistency": job.spec.consistency,
        "workers": config.job.workers,
        "partitions": config.job.partitions,
    });
    format!(
        "{} training={:016x} (app={:?} workers={} partitions={} staleness={})",
        job.metadata.name.as_deref().unwrap_or("job"),
        ebbflow_crds::fnv1a(&shape.to_string()),
        job.spec.app.kind,
        config.job.workers,
        config.job.partitions,
        config.job.staleness,
    )
}

/// Reads and validates the manifest at `path`; returns the job and the manifest's directory
/// (where relative dataset and trace paths start).
fn load_manifest(path: &Path) -> Result<(TrainingJob, PathBuf), RunError> {
    let text = std::fs::read_to_string(path).map_err(|source| RunError::ReadManifest {
        path: path.display().to_string(),
        source,
    })?;
    let job = ebbflow_crds::parse_manifest(&text)?;
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
        .to_path_buf();
    Ok((job, dir))
}

/// Runs `ebbflow node`: one instance of a local run, until the run's coordinator releases it.
pub fn node(args: &NodeArgs) -> Result<(), RunError> {
    let (job, manifest_dir) = load_manifest(&args.manifest)?;
    let data_dir = args.data_dir.clone().unwrap_or(manifest_dir);
    let app = build_app(&job, DataDir::cli(&data_dir))?;
    let settings = ElasticNodeSettings {
        job: elastic_config(&job).job,
        job_id: job_id(&job),
        reliable: !args.transient,
        listen: ([127, 0, 0, 1], 0).into(),
        advertise: None,
        metrics_listen: None,
        registry: None,
        notices: NoticeSources {
            coordinator: args.coordinator.clone(),
            secret: args.secret.clone(),
            name: args.name.clone(),
            // The run posts notices itself and kills the process at the deadline.
            grace: Duration::from_secs(30),
            metadata_endpoint: None,
            metadata_poll: Duration::from_secs(2),
        },
    };
    pod::run_node(app, settings, &args.name)
}

/// Runs `ebbflow run`: metrics on `--metrics-addr`; returns the summary (also written to the
/// output directory).
pub fn run(args: &RunArgs) -> Result<RunSummary, RunError> {
    let registry = Registry::new();
    // Bound before anything else, so a port in use fails fast.
    let listener =
        std::net::TcpListener::bind(args.metrics_addr).map_err(|source| RunError::BindMetrics {
            addr: args.metrics_addr,
            source,
        })?;
    let metrics_addr = listener
        .local_addr()
        .map_err(|source| RunError::BindMetrics {
            addr: args.metrics_addr,
            source,
        })?;
    let serving = serve_metrics(listener, registry.clone());
    if !args.quiet {
        eprintln!("ebbflow run: metrics on http://{metrics_addr}/metrics");
    }
    let summary = run_on(args, &registry);
    drop(serving);
    summary
}

/// As [`run`] with the metrics registered on `registry` (served by the caller).
pub fn run_on(args: &RunArgs, registry: &Registry) -> Result<RunSummary, RunError> {
    let (job, manifest_dir) = load_manifest(&args.manifest)?;
    let name = job.metadata.name.clone().unwrap_or_else(|| "job".into());
    if !(args.speed.is_finite() && args.speed > 0.0) {
        return Err(RunError::Unsupported(format!(
            "--speed must be a positive number of trace seconds per second, got {}",
            args.speed
        )));
    }
    if !(args.notice_floor.is_finite() && args.notice_floor >= 0.0) {
        return Err(RunError::Unsupported(format!(
            "--notice-floor must be zero or a positive number of seconds, got {}",
            args.notice_floor
        )));
    }
    // `--calibration` over the spec's `bidding.overrides.throughput`.
    let spec_table = crate::jobmarket::throughput_table(&job).map_err(|detail| {
        RunError::Unsupported(format!("spec.bidding.overrides.throughput: {detail}"))
    })?;
    let throughput = match &args.calibration {
        Some(path) => Some(ebbflow_bidbrain::bidder::Calibration::load(path)?.throughput_table()),
        None => spec_table,
    };
    let data_dir = args
        .data_dir
        .clone()
        .unwrap_or_else(|| manifest_dir.clone());
    let app = build_app(&job, DataDir::cli(&data_dir))?;
    let market = crate::jobmarket::setup_market(&job, &manifest_dir)?;

    let register_error =
        |e: prometheus::Error| RunError::Unsupported(format!("registering metrics failed: {e}"));
    let metrics = RuntimeMetrics::register(registry).map_err(register_error)?;
    let job_metrics = JobMetrics::register(registry).map_err(register_error)?;

    let out = args.out.clone().unwrap_or_else(|| {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        PathBuf::from(format!("ebbflow-run-{name}-{now}"))
    });
    std::fs::create_dir_all(&out).map_err(|source| RunError::WriteOutputs {
        path: out.display().to_string(),
        source,
    })?;

    let spec = &job.spec;
    let config = elastic_config(&job);
    let clocks = config.job.clocks;
    let wall_limit = spec
        .stop
        .wall_clock_limit
        .as_ref()
        .and_then(|d| d.to_duration());
    let bidder = ebbflow_bidbrain::bidder::BidderConfig {
        throughput,
        ..crate::jobmarket::bidder_config(&job)
    };
    let replay = MarketReplay::new(
        &market.grid,
        &market.model,
        bidder,
        market.billing,
        crate::jobmarket::app_model(&job),
        market.reliable.clone(),
        market.start_slot,
    );

    if !args.quiet {
        let per_pass = with_job_app!(&app, app => app.clocks_per_pass(config.job.workers));
        eprintln!(
            "ebbflow run {name}: {} clocks ({per_pass} a pass over the data), {} logical workers, \
             writing {}",
            clocks,
            config.job.workers,
            out.display()
        );
        eprintln!(
            "ebbflow run {name}: an EC2 notice ({} s ahead in the trace) reaches the runtime {:.2} s \
             ahead at --speed {} (--notice-floor {} s)",
            crate::EC2_NOTICE.as_secs(),
            notice_wall_lead(
                crate::EC2_NOTICE.as_secs_f64(),
                args.speed,
                args.notice_floor
            ),
            args.speed,
            args.notice_floor
        );
    }
    let interrupted = Arc::new(AtomicBool::new(false));
    let (sender, feed) = LiveFeed::new();
    watch_ctrl_c(sender.clone(), interrupted.clone());
    let started = Instant::now();
    let drive = Drive {
        job: &job,
        reliable: &config.reliable,
        reliable_vcpus: market.reliable.vcpus,
        grid: &market.grid,
        start_slot: market.start_slot,
        speed: args.speed,
        notice_floor: args.notice_floor,
        recalibrate: !args.no_recalibrate,
        workers: config.job.workers as u64,
        clocks,
        wall_limit,
        target_loss: spec.stop.target_loss,
        budget_total: spec.bidding.budget_total,
        budget_per_hour: spec.bidding.budget_per_hour,
        quiet: args.quiet,
        job_metrics: &job_metrics,
        namespace: job.metadata.namespace.as_deref().unwrap_or("local"),
        name: &name,
    };
    let outcome = if args.in_process {
        let mut instances = instances::NodeThreads {
            events: sender.clone(),
        };
        std::thread::scope(|scope| {
            let training = scope.spawn(
                || with_job_app!(&app, app => run_elastic_live(app, &config, &feed, &metrics)),
            );
            let driven = drive.run(replay, &mut instances, &sender, &metrics, || {
                training.is_finished()
            });
            let report = training.join().unwrap_or_else(|_| {
                Err(ebbflow_runtime::elastic::ElasticError::Validate(
                    "the training thread panicked".into(),
                ))
            });
            (driven, report.map_err(RunError::from))
        })
    } else {
        let listener =
            std::net::TcpListener::bind("127.0.0.1:0").map_err(|source| RunError::BindMetrics {
                addr: ([127, 0, 0, 1], 0).into(),
                source,
            })?;
        let coordinator = format!(
            "{}://{}",
            ebbflow_runtime::admin::scheme(config.job.transport_security == TransportSecurity::Tls),
            listener
                .local_addr()
                .map_err(|source| RunError::BindMetrics {
                    addr: ([127, 0, 0, 1], 0).into(),
                    source,
                })?
        );
        let secret = ebbflow_runtime::node::random_secret();
        let exe = match &args.node_exe {
            Some(exe) => exe.clone(),
            None => std::env::current_exe().map_err(|e| RunError::Node {
                name: "self".into(),
                reason: format!("cannot find this executable to start instances: {e}"),
            })?,
        };
        let mut instances = instances::NodeProcesses::new(instances::NodeCommand {
            exe,
            manifest: args.manifest.clone(),
            data_dir: args.data_dir.clone(),
            coordinator,
            secret: secret.clone(),
            log_dir: out.join("nodes"),
        })
        .map_err(|source| RunError::WriteOutputs {
            path: out.join("nodes").display().to_string(),
            source,
        })?;
        for reliable in &config.reliable {
            instances
                .launch_reliable(reliable)
                .map_err(|e| RunError::Node {
                    name: reliable.clone(),
                    reason: format!("starting it failed: {e}"),
                })?;
        }
        let job_settings = ElasticJob {
            config: ElasticConfig {
                reliable: Vec::new(),
                transient: Vec::new(),
                ..config.clone()
            },
            secret,
            job: job_id(&job),
            reliable_nodes: config.reliable.len() as u32,
            join_timeout: Duration::from_secs(120),
            background_copies: true,
            linger: None,
            stop: None,
            checkpoint: None,
        };
        let outcome = std::thread::scope(|scope| {
            let training = scope.spawn(|| {
                let feed = (sender.clone(), feed);
                with_job_app!(&app, app => run_elastic_job(
                    app,
                    job_settings,
                    listener,
                    registry.clone(),
                    &metrics,
                    feed,
                ))
            });
            let driven = drive.run(replay, &mut instances, &sender, &metrics, || {
                training.is_finished()
            });
            let report = training.join().unwrap_or_else(|_| {
                Err(ebbflow_runtime::elastic_coordinator::ElasticJobError::Run(
                    ebbflow_runtime::elastic::ElasticError::Validate(
                        "the coordinator thread panicked".into(),
                    ),
                ))
            });
            (driven, report.map_err(RunError::from))
        });
        for problem in &instances.problems {
            tracing::warn!(%problem, "instance problem");
        }
        drop(instances);
        outcome
    };
    let (driven, report) = outcome;
    let report: ElasticReport = report.map_err(|error| {
        let divergence = match &error {
            RunError::Train(e) => e.divergence(),
            RunError::Coordinate(e) => e.divergence(),
            _ => None,
        };
        let app = format!("{:?}", job.spec.app.kind);
        match divergence {
            Some(failure) if failure.cause == HaltCause::AppFailed => RunError::AppFailed {
                app,
                failure: failure.clone(),
            },
            Some(divergence) => RunError::Diverged {
                app,
                divergence: divergence.clone(),
            },
            None => error,
        }
    })?;
    let evaluate_kind = with_job_app!(&app, app => app.tables().len());
    debug_assert!(evaluate_kind > 0);
    let summary = RunSummary::new(
        &name,
        &report,
        driven.bill,
        driven.trace_seconds,
        started.elapsed().as_secs_f64(),
        interrupted.load(Ordering::Relaxed),
        &out,
    )
    .with_app_model(AppModelSummary {
        spec: crate::jobmarket::app_model(&job),
        calibrated: driven.calibrator.model().clone(),
        measurements: driven.calibrator.counts(),
        decided_with: driven.decided_with,
    })
    .with_stop_reason(driven.stop_reason)
    .with_notice_leads(args.notice_floor, driven.shortest_notice_lead);
    report::write(&out, &summary, &driven.series)
        .map_err(|(path, source)| RunError::WriteOutputs { path, source })?;
    Ok(summary)
}

/// Serves `/metrics` from `registry` on a thread of its own until the returned guard drops.
fn serve_metrics(listener: std::net::TcpListener, registry: Registry) -> Option<ShutdownGuard> {
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    listener.set_nonblocking(true).ok()?;
    let thread = std::thread::Builder::new()
        .name("metrics".into())
        .spawn(move || {
            let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            runtime.block_on(async move {
                let Ok(listener) = tokio::net::TcpListener::from_std(listener) else {
                    return;
                };
                let router = ebbflow_runtime::coordinator::metrics_router(registry);
                let _ = axum::serve(listener, router)
                    .with_graceful_shutdown(async {
                        let _ = stopped.await;
                    })
                    .await;
            });
        })
        .ok()?;
    Some(ShutdownGuard {
        stop: Some(stop),
        thread: Some(thread),
    })
}

/// Stops the metrics server on drop.
struct ShutdownGuard {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for ShutdownGuard {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// On Ctrl-C: stop training at the next clock boundary (results are still written).
fn watch_ctrl_c(sender: std::sync::mpsc::Sender<ElasticEvent>, interrupted: Arc<AtomicBool>) {
    let _ = std::thread::Builder::new()
        .name("ctrl-c".into())
        .spawn(move || {
            let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            if runtime.block_on(tokio::signal::ctrl_c()).is_ok() {
                interrupted.store(true, Ordering::Relaxed);
                let _ = sender.send(ElasticEvent::Stop);
            }
        });
}

/// The market side of a run, paced on the accelerated clock.
struct Drive<'a> {
    job: &'a TrainingJob,
    /// The reliable tier's instances, started with the job.
    reliable: &'a [String],
    /// vCPUs of one reliable instance.
    reliable_vcpus: f64,
    grid: &'a MarketGrid,
    start_slot: usize,
    speed: f64,
    /// Shortest wall lead of a notice (`--notice-floor`).
    notice_floor: f64,
    /// The bidder decides with the re-estimated application model (else with the spec's).
    recalibrate: bool,
    workers: u64,
    clocks: u64,
    wall_limit: Option<Duration>,
    /// `spec.stop.targetLoss`: stop once the coordinator's training loss is at or below it.
    target_loss: Option<f64>,
    budget_total: Option<f64>,
    budget_per_hour: Option<f64>,
    quiet: bool,
    job_metrics: &'a JobMetrics,
    namespace: &'a str,
    name: &'a str,
}

/// What the market side of a run ends with.
struct Driven {
    /// One sample per replayed slot.
    series: Vec<TimePoint>,
    /// The shortest wall-clock lead a notice was given, if any came.
    shortest_notice_lead: Option<f64>,
    /// The final bill.
    bill: Bill,
    /// Trace seconds replayed.
    trace_seconds: f64,
    /// The application model re-estimated from the run, with what it was fed.
    calibrator: Calibrator,
    /// The model the bidder's last decision used.
    decided_with: ebbflow_bidbrain::bidder::AppModel,
    /// The spec field that made the run stop early, if one did.
    stop_reason: Option<&'static str>,
}

impl Drive<'_> {
    /// Steps the replay until `finished()`, re-estimating the bidder's application model from
    /// what the runtime does ([`ebbflow_bidbrain::bidder::probe`]) and deciding with it from then on.
    fn run(
        &self,
        mut replay: MarketReplay<'_>,
        instances: &mut (dyn instances::Instances + Send),
        sender: &std::sync::mpsc::Sender<ElasticEvent>,
        metrics: &RuntimeMetrics,
        finished: impl Fn() -> bool,
    ) -> Driven {
        let bar = if self.quiet {
            ProgressBar::hidden()
        } else {
            ProgressBar::new(self.clocks)
        };
        if let Ok(style) = ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {wide_bar} clock {pos}/{len} {msg}",
        ) {
            bar.set_style(style);
        }
        let started = Instant::now();
        let start = self.grid.time(self.start_slot);
        let started_with = provisioner::reliable_held(self.job, self.reliable, start);
        let mut provisioner = LocalProvisioner::new(instances, started_with);
        let mut assignment = Assignment::default();
        let mut evictions = 0u64;
        let mut series = Vec::new();
        let mut slot = self.start_slot;
        let mut stop_reason = None;
        let mut last_bill = Bill::default();
        // the shortest wall-clock lead a notice was given
        let mut shortest_lead: Option<f64> = None;
        let mut probe = ThroughputProbe::new(ProbeSettings::new(self.speed));
        // the runtime's count of transient nodes switched in, at the last sample
        let mut added_seen = 0u64;
        let mut calibrator = Calibrator::new(replay.app().clone(), CALIBRATION_WEIGHT);
        // vCPUs of one transient instance: the held pools', else the market's mean
        let mut transient_vcpus = self.grid.pools.iter().map(|p| p.vcpus).sum::<f64>()
            / self.grid.pools.len().max(1) as f64;
        loop {
            let t = self.grid.time(slot.min(self.grid.slots.saturating_sub(1)));
            let trace_seconds = (t - start) as f64;
            let clock = metrics.iterations.get() / self.workers.max(1);
            if finished() {
                let decided_with = replay.app().clone();
                let bill = replay.finish(t);
                series.push(self.point(trace_seconds, started, clock, metrics, bill, evictions));
                bar.finish_and_clear();
                return Driven {
                    series,
                    shortest_notice_lead: shortest_lead,
                    bill,
                    trace_seconds,
                    calibrator,
                    decided_with,
                    stop_reason,
                };
            }
            let mut events = Vec::new();
            if slot < self.grid.slots {
                let budget_spent = last_bill.spent_usd;
                let job = JobState {
                    remaining_work: (self.clocks.saturating_sub(clock)) as f64,
                    deadline: None,
                    budget_remaining_usd: self.budget_total.map(|b| (b - budget_spent).max(0.0)),
                    budget_per_hour_usd: self.budget_per_hour,
                };
                events = replay.step(slot, &job);
                for event in &events {
                    match *event {
                        // the provisioner's business: the plan below
                        ReplayEvent::Acquired { .. }
                        | ReplayEvent::Released { .. }
                        | ReplayEvent::Shrunk { .. } => {}
                        ReplayEvent::Notice {
                            allocation,
                            lead_seconds,
                        } => {
                            if let Some(ids) = assignment.instances(allocation) {
                                let lead =
                                    notice_wall_lead(lead_seconds, self.speed, self.notice_floor);
                                shortest_lead =
                                    Some(shortest_lead.map_or(lead, |s: f64| s.min(lead)));
                                provisioner.notice(ids, Duration::from_secs_f64(lead));
                            }
                        }
                        ReplayEvent::Evicted { allocation } => {
                            evictions += 1;
                            if let Some(ids) = assignment.remove(allocation) {
                                provisioner.evict(&ids);
                            }
                        }
                    }
                }
                self.provision(&mut provisioner, &mut assignment, &replay, t);
            }
            provisioner.tick();
            last_bill = replay.bill(t);
            let point = self.point(trace_seconds, started, clock, metrics, last_bill, evictions);
            let (held, held_vcpus) =
                replay
                    .held()
                    .iter()
                    .fold((0u32, 0.0), |(count, vcpus), &(pool, n)| {
                        (
                            count + n,
                            vcpus + f64::from(n) * self.grid.pools[pool].vcpus,
                        )
                    });
            if held > 0 {
                transient_vcpus = held_vcpus / f64::from(held);
            }
            let added = metrics.transient_nodes_added.get();
            let joined = u32::try_from(added - added_seen).unwrap_or(u32::MAX);
            added_seen = added;
            let observation = self.observation(&point, metrics, transient_vcpus, joined);
            let events: Vec<ProbeEvent> = events.iter().map(probe_event).collect();
            let measured = probe.observe(&observation, &events);
            if !measured.is_empty() {
                for measurement in measured {
                    tracing::debug!(?measurement, ?observation, "application model measured");
                    calibrator.record(measurement);
                }
                if self.recalibrate {
                    replay.set_app(calibrator.model().clone());
                }
            }
            self.publish(
                &point,
                &replay,
                last_bill,
                app_model_status(&calibrator, self.recalibrate),
            );
            let app = calibrator.model();
            bar.set_position(clock.min(self.clocks));
            bar.set_message(format!(
                "loss {:.4} | nodes {}+{} | ${:.2} spent vs ${:.2} on-demand | evictions {evictions} | migrated {} | ν {:.3} φ {:.2} σ {:.0}s λ {:.0}s",
                point.loss,
                point.reliable_nodes,
                point.transient_nodes,
                point.spent_usd,
                point.on_demand_equivalent_usd,
                metrics.partitions_migrated.get(),
                app.nu_per_vcpu_second,
                app.phi,
                app.sigma_seconds,
                app.lambda_seconds,
            ));
            series.push(point);
            if stop_reason.is_none() {
                stop_reason = self.stop_reached(&point, started.elapsed());
                if stop_reason.is_some() {
                    let _ = sender.send(ElasticEvent::Stop);
                }
            }
            slot += 1;
            // Pace: slot k of the replay is due at (k · step) / speed wall seconds.
            let due = Duration::from_secs_f64(
                (slot - self.start_slot) as f64 * self.grid.step as f64 / self.speed,
            );
            while started.elapsed() < due && !finished() {
                std::thread::sleep(
                    due.saturating_sub(started.elapsed())
                        .min(Duration::from_millis(20)),
                );
            }
        }
    }

    /// The spec's stop condition `point` reached after `elapsed` of wall time, if any: the
    /// wall-clock limit, the target loss (once some clock ran: the loss gauge reads 0 before
    /// the first) or the total budget (spent across both tiers).
    fn stop_reached(&self, point: &TimePoint, elapsed: Duration) -> Option<&'static str> {
        if self.wall_limit.is_some_and(|limit| elapsed >= limit) {
            return Some("wallClockLimit");
        }
        let loss = |target: f64| point.clock > 0 && point.loss.is_finite() && point.loss <= target;
        if self.target_loss.is_some_and(loss) {
            return Some("targetLoss");
        }
        if self
            .budget_total
            .is_some_and(|budget| point.spent_usd >= budget)
        {
            return Some("budgetTotal");
        }
        None
    }

    /// Brings the instances to what the replay's live allocations want (the operator's plan, at
    /// trace time `t`), then hands instances to allocations.
    fn provision(
        &self,
        provisioner: &mut LocalProvisioner<'_>,
        assignment: &mut Assignment,
        replay: &MarketReplay<'_>,
        t: ebbflow_bidbrain::market::Timestamp,
    ) {
        let live: Vec<LiveAllocation> = replay
            .allocations()
            .map(|(allocation, noticed)| LiveAllocation::new(self.grid, allocation, noticed))
            .collect();
        provisioner.set_clock(t);
        let wanted = provisioner::wanted(self.job, &live);
        // Local instances have nothing to wait for: the futures are ready.
        if let Err(error) =
            futures::executor::block_on(crate::provision::reconcile(provisioner, &wanted))
        {
            tracing::warn!(%error, "provisioning failed");
        }
        let holding: Vec<crate::provision::Held> = provisioner.holding().cloned().collect();
        assignment.update(&live, &holding);
    }

    /// Sets the per-job gauges (the jobs dashboard) from a sample and the application model
    /// measured so far.
    fn publish(
        &self,
        point: &TimePoint,
        replay: &MarketReplay<'_>,
        bill: Bill,
        app_model: ebbflow_crds::AppModelStatus,
    ) {
        let mut pools: std::collections::BTreeMap<(String, String), u32> = Default::default();
        for (pool, count) in replay.held() {
            let id = &self.grid.pools[pool].id;
            *pools
                .entry((id.instance_type.clone(), id.zone.clone()))
                .or_default() += count;
        }
        let status = ebbflow_crds::TrainingJobStatus {
            iteration: Some(point.clock),
            loss: Some(point.loss),
            stage: u8::try_from(point.stage).ok().filter(|s| *s > 0),
            nodes: Some(ebbflow_crds::NodeCounts {
                reliable: point.reliable_nodes.max(0) as u32,
                transient: point.transient_nodes.max(0) as u32,
                total: (point.reliable_nodes + point.transient_nodes).max(0) as u32,
                pools: pools
                    .into_iter()
                    .map(|((instance_type, zone), count)| ebbflow_crds::PoolNodes {
                        pool: ebbflow_crds::Pool {
                            instance_type,
                            zone,
                            ..ebbflow_crds::Pool::default()
                        },
                        count,
                    })
                    .collect(),
            }),
            cost: Some(ebbflow_crds::CostStatus {
                spent: bill.spent_usd,
                free_compute: bill.free_usd,
                on_demand_equivalent: bill.on_demand_equivalent_usd,
                ..ebbflow_crds::CostStatus::default()
            }),
            evictions: point.evictions,
            migrations: point.partitions_migrated,
            rollbacks: point.rollbacks,
            app_model: Some(app_model),
            ..Default::default()
        };
        self.job_metrics.observe(self.namespace, self.name, &status);
    }

    /// What the throughput probe needs from a sample: the consistent clock, ready nodes per
    /// tier and their vCPUs (`transient_vcpus` per transient instance), and the transient nodes
    /// `joined` since the last sample.
    fn observation(
        &self,
        point: &TimePoint,
        metrics: &RuntimeMetrics,
        transient_vcpus: f64,
        joined: u32,
    ) -> Observation {
        let reliable_nodes = point.reliable_nodes.max(0) as u32;
        let transient_nodes = point.transient_nodes.max(0) as u32;
        Observation {
            joined: Some(joined),
            wall_seconds: point.wall_seconds,
            clocks: metrics.consistent_clock.get().max(0) as u64,
            rollbacks: point.rollbacks,
            stage: point.stage.clamp(0, 3) as u8,
            reliable_nodes,
            transient_nodes,
            reliable_vcpus: f64::from(reliable_nodes) * self.reliable_vcpus,
            transient_vcpus: f64::from(transient_nodes) * transient_vcpus,
        }
    }

    fn point(
        &self,
        trace_seconds: f64,
        started: Instant,
        clock: u64,
        metrics: &RuntimeMetrics,
        bill: Bill,
        evictions: u64,
    ) -> TimePoint {
        TimePoint {
            wall_seconds: started.elapsed().as_secs_f64(),
            trace_seconds,
            clock,
            loss: metrics.loss.get(),
            stage: metrics.stage.get(),
            reliable_nodes: metrics.nodes.with_label_values(&["reliable"]).get(),
            transient_nodes: metrics.nodes.with_label_values(&["transient"]).get(),
            spent_usd: bill.spent_usd,
            on_demand_equivalent_usd: bill.on_demand_equivalent_usd,
            evictions,
            partitions_migrated: metrics.partitions_migrated.get(),
            rollbacks: metrics.rollbacks.get(),
            joins: metrics.elastic_events.with_label_values(&["join"]).get(),
            notices: metrics.elastic_events.with_label_values(&["notice"]).get(),
            late_notices: metrics
                .elastic_events
                .with_label_values(&["late_notice"])
                .get(),
            failures: metrics.elastic_events.with_label_values(&["fail"]).get(),
        }
    }
}

/// A notice may be stretched to at most this many times its lead scaled by the replay's speed.
const NOTICE_STRETCH: f64 = 10.0;

/// The wall-clock lead of a notice the trace gives `trace_lead` seconds ahead, replayed at
/// `speed`: the scaled lead, stretched to `floor` but never past [`NOTICE_STRETCH`] times itself.
fn notice_wall_lead(trace_lead: f64, speed: f64, floor: f64) -> f64 {
    let scaled = trace_lead.max(0.0) / speed;
    scaled.max(floor.min(NOTICE_STRETCH * scaled))
}

/// The probe's view of a replay event.
fn probe_event(event: &ReplayEvent) -> ProbeEvent {
    match *event {
        ReplayEvent::Acquired {
            allocation, count, ..
        } => ProbeEvent::Acquired { allocation, count },
        ReplayEvent::Released { allocation } => ProbeEvent::Released { allocation },
        ReplayEvent::Shrunk { allocation, count } => ProbeEvent::Shrunk { allocation, count },
        ReplayEvent::Notice { allocation, .. } => ProbeEvent::Notice { allocation },
        ReplayEvent::Evicted { allocation } => ProbeEvent::Evicted { allocation },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_notice_reaches_the_runtime_with_the_floor_unless_the_replay_is_ten_times_too_fast() {
        // the default pace: EC2's 120 s become 0.33 s, stretched to the 2 s floor
        assert_eq!(notice_wall_lead(120.0, 360.0, 2.0), 2.0);
        // slow enough that the scaled lead is longer than the floor: untouched
        assert_eq!(notice_wall_lead(120.0, 10.0, 2.0), 12.0);
        // the storm: 120 s at 12000× is 0.01 s, stretched at most ten times
        assert!((notice_wall_lead(120.0, 12_000.0, 2.0) - 0.1).abs() < 1e-12);
        // floor 0: compressed like the rest of the trace
        assert!((notice_wall_lead(120.0, 360.0, 0.0) - 120.0 / 360.0).abs() < 1e-12);
        // a notice without lead stays without lead
        assert_eq!(notice_wall_lead(0.0, 360.0, 2.0), 0.0);
    }

    fn example(name: &str) -> TrainingJob {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../examples")
            .join(name);
        load_manifest(&path).expect("the example is valid").0
    }

    #[test]
    fn the_backup_flush_interval_sets_the_copy_interval_in_time() {
        let config = elastic_config(&example("lda-reuters.yaml"));
        assert_eq!(config.backup_interval, Some(Duration::from_secs(5)));
        let mut job = example("quickstart.yaml");
        let config = elastic_config(&job);
        assert_eq!(config.backup_interval, None);
        assert_eq!(config.backup_every, DEFAULT_BACKUP_EVERY);
        assert_eq!(config.backup_bandwidth, None);
        job.spec.elasticity.backup_bandwidth_mbps = Some(8.0);
        assert_eq!(
            elastic_config(&job).backup_bandwidth,
            Some(1e6),
            "bytes per second"
        );
    }

    #[test]
    fn the_job_id_follows_the_training_state_not_capacity_or_stop_edits() {
        let job = example("quickstart.yaml");
        let id = job_id(&job);
        assert!(id.starts_with("quickstart training="), "{id}");
        assert_eq!(id, job_id(&job.clone()), "deterministic");
        // A job suspended, edited in these fields and resumed keeps its checkpoint.
        let mut edited = job.clone();
        edited.spec.stop.iterations = Some(5000);
        edited.spec.stop.target_loss = Some(0.5);
        edited.spec.bidding.budget_total = Some(12.0);
        edited.spec.transient.min_nodes = 1;
        edited.spec.runtime.termination_grace_period_seconds = Some(30);
        edited.spec.elasticity.backup_bandwidth_mbps = Some(100.0);
        assert_eq!(job_id(&edited), id);
        // These change what a partition image holds: the id changes and says what.
        let mut more_nodes = job.clone();
        more_nodes.spec.transient.max_nodes += 2;
        let more = job_id(&more_nodes);
        assert_ne!(more, id);
        let workers = |id: &str| {
            id.split("workers=")
                .nth(1)
                .and_then(|rest| rest.split(' ').next().map(str::to_owned))
        };
        assert_ne!(workers(&more), workers(&id), "{id} vs {more}");
        let mut other_partitions = job.clone();
        other_partitions.spec.elasticity.partitions = Some(7);
        assert!(job_id(&other_partitions).contains("partitions=7"));
        let mut other_rank = job.clone();
        other_rank
            .spec
            .app
            .hyperparameters
            .get_or_insert_with(Default::default)
            .rank = Some(3);
        assert_ne!(job_id(&other_rank), id);
    }

    /// Serves `body` at paths ending in `file` on 127.0.0.1 (404 elsewhere), counting requests.
    fn serve(
        file: &'static str,
        body: Vec<u8>,
    ) -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
        use std::io::{BufRead as _, Write as _};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let requests = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = requests.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { continue };
                counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let mut reader = std::io::BufReader::new(stream.try_clone().unwrap());
                let mut line = String::new();
                let _ = reader.read_line(&mut line);
                let path = line.split_whitespace().nth(1).unwrap_or("").to_owned();
                loop {
                    let mut header = String::new();
                    if reader.read_line(&mut header).unwrap_or(0) == 0 || header == "\r\n" {
                        break;
                    }
                }
                let (status, body): (&str, &[u8]) = if path.ends_with(file) {
                    ("200 OK", &body)
                } else {
                    ("404 Not Found", b"no such file")
                };
                let _ = write!(
                    stream,
                    "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    body.len()
                );
                let _ = stream.write_all(body);
            }
        });
        (base, requests)
    }

    /// Synthetic ratings past PLANTED_ABOVE are planted: nothing but the test set is generated
    /// when the app is built (workers generate their shards), and a size that cannot fit is
    /// refused before anything is generated, with the size it needs.
    #[test]
    fn large_synthetic_ratings_are_planted_and_sizes_that_cannot_fit_are_refused() {
        let with_ratings = |ratings: u64| {
            let mut job = example("quickstart.yaml");
            let synthetic = job.spec.app.dataset.synthetic.as_mut().unwrap();
            synthetic.ratings = Some(ratings);
            synthetic.users = Some(20_000);
            synthetic.items = Some(2_000);
            build_app(&job, DataDir::cli(Path::new("/nonexistent")))
        };
        let ratings = PLANTED_ABOVE + 500_000;
        match with_ratings(ratings) {
            Ok(JobApp::Mf(app)) => {
                let test = ebbflow_runtime::data::PlantedRatings::test_fraction_for(ratings);
                let expected = ratings as f64 * (1.0 - test);
                assert!(
                    (app.train_len() as f64 - expected).abs() < 10.0,
                    "{}",
                    app.train_len()
                );
            }
            Ok(_) => panic!("not matrix factorization"),
            Err(error) => panic!("{error}"),
        }
        let error = with_ratings(10_000_000_000)
            .err()
            .expect("ten billion ratings do not fit this machine")
            .to_string();
        assert!(
            error.contains("GiB") && error.contains("10000000000"),
            "{error}"
        );
    }

    /// `adaptiveStep` turns on MF's adaptive step with LIBMF's rate and no decay, unless the
    /// spec names a rate; the initial factors shrink as 1/√rank past rank 100.
    #[test]
    fn adaptive_step_and_the_rank_reach_the_mf_config() {
        let config = |adaptive: Option<bool>, rank: u32, rate: Option<f64>| {
            let mut job = example("quickstart.yaml");
            let hyper = job
                .spec
                .app
                .hyperparameters
                .get_or_insert_with(Default::default);
            (hyper.adaptive_step, hyper.rank, hyper.learning_rate) = (adaptive, Some(rank), rate);
            match build_app(&job, DataDir::cli(Path::new("/nonexistent"))) {
                Ok(JobApp::Mf(app)) => app.config().clone(),
                Ok(_) => panic!("not matrix factorization"),
                Err(error) => panic!("{error}"),
            }
        };
        let plain = config(None, 32, None);
        assert!(!plain.adaptive);
        assert_eq!(plain.learning_rate, 0.01);
        assert!(plain.decay < 1.0, "annealed over the job: {}", plain.decay);
        assert_eq!(plain.init_std, 0.1);
        let adaptive = config(Some(true), 1000, None);
        assert!(adaptive.adaptive);
        assert_eq!((adaptive.learning_rate, adaptive.decay), (0.1, 1.0));
        assert!(
            (adaptive.init_std - 0.0316).abs() < 1e-4,
            "{}",
            adaptive.init_std
        );
        assert_eq!(config(Some(true), 8, Some(0.05)).learning_rate, 0.05);
    }

    /// A synthetic LDA corpus past PLANTED_ABOVE tokens is planted (past 2^24 tokens LdaApp
    /// splits its totals), and one that cannot fit is refused with the size it needs.
    #[test]
    fn large_synthetic_corpora_are_planted_and_sizes_that_cannot_fit_are_refused() {
        let with_docs = |documents: u64| {
            let mut job = example("lda-reuters.yaml");
            job.spec.app.dataset.path = None;
            job.spec.app.dataset.format = None;
            job.spec.app.dataset.synthetic = Some(ebbflow_crds::SyntheticDataset {
                documents: Some(documents),
                vocabulary: Some(2_000),
                true_topics: Some(5),
                words_per_document: Some(100),
                ..Default::default()
            });
            build_app(&job, DataDir::cli(Path::new("/nonexistent")))
        };
        match with_docs(25_000) {
            Ok(JobApp::Lda(app)) => assert_eq!(app.num_tokens(), 2_500_000),
            Ok(_) => panic!("not LDA"),
            Err(error) => panic!("{error}"),
        }
        let error = with_docs(4_000_000_000)
            .err()
            .expect("400 billion tokens do not fit this machine")
            .to_string();
        assert!(
            error.contains("GiB") && error.contains("4000000000"),
            "{error}"
        );
    }

    /// Synthetic LogisticRegression examples past PLANTED_ABOVE values (samples × features) are
    /// planted: the app is built without generating its shards or its test set, and a size that
    /// cannot fit is refused with the size it needs.
    #[test]
    fn large_synthetic_examples_are_planted_and_sizes_that_cannot_fit_are_refused() {
        let with_samples = |samples: u64| {
            let mut job = example("mlr-digits.yaml");
            job.spec.app.dataset.path = None;
            job.spec.app.dataset.format = None;
            job.spec.app.dataset.synthetic = Some(ebbflow_crds::SyntheticDataset {
                samples: Some(samples),
                features: Some(100),
                classes: Some(10),
                ..Default::default()
            });
            build_app(&job, DataDir::cli(Path::new("/nonexistent")))
        };
        let samples = 3_000_000;
        match with_samples(samples) {
            Ok(JobApp::Mlr(app)) => {
                let test = ebbflow_runtime::data::PlantedExamples::test_fraction_for(samples);
                let expected = (samples as f64 * (1.0 - test)).round() as usize;
                assert_eq!(app.train_len(), expected);
            }
            Ok(_) => panic!("not logistic regression"),
            Err(error) => panic!("{error}"),
        }
        let error = with_samples(50_000_000_000)
            .err()
            .expect("five trillion values do not fit this machine")
            .to_string();
        assert!(
            error.contains("GiB") && error.contains("50000000000 planted examples"),
            "{error}"
        );
    }

    #[test]
    fn a_dataset_url_is_downloaded_once_and_read_as_its_path() {
        let Some(data) = ebbflow_runtime::data::data_dir() else {
            println!("skipped: set EBBFLOW_DATA_DIR (scripts/fetch-data.sh)");
            return;
        };
        let inter = std::fs::read(data.join("ml-100k.inter")).unwrap();
        let (base, requests) = serve("ml-100k.inter", inter);
        // a path of its own per run: the download cache is the machine's temporary directory
        let unique = format!(
            "{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        );
        let with_url = |url: String| {
            let mut job = example("mf-movielens.yaml");
            job.spec.app.dataset.path = None;
            job.spec.app.dataset.url = Some(url);
            job.spec.app.dataset.format = Some(DatasetFormat::MovielensInter);
            build_app(&job, DataDir::cli(Path::new("/nonexistent")))
        };
        let url = format!("{base}/{unique}/ml-100k.inter");
        for _ in 0..2 {
            match with_url(url.clone()) {
                Ok(JobApp::Mf(app)) => assert_eq!(app.train_len(), 80_000),
                Ok(_) => panic!("not matrix factorization"),
                Err(error) => panic!("{error}"),
            }
        }
        assert_eq!(
            requests.load(std::sync::atomic::Ordering::SeqCst),
            1,
            "downloaded once"
        );
        let missing = format!("{base}/{unique}/missing.inter");
        let error = with_url(missing.clone())
            .err()
            .expect("refused")
            .to_string();
        assert!(error.contains(&missing) && error.contains("404"), "{error}");
    }

    #[test]
    fn matrix_factorization_reads_csv_ratings_as_it_reads_movielens_inter() {
        let Some(data) = ebbflow_runtime::data::data_dir() else {
            println!("skipped: set EBBFLOW_DATA_DIR (scripts/fetch-data.sh)");
            return;
        };
        let inter = std::fs::read_to_string(data.join("ml-100k.inter")).unwrap();
        // The same ratings as `user,item,rating,timestamp` rows without a header.
        let csv: String = inter
            .lines()
            .skip(1)
            .map(|line| line.split('\t').collect::<Vec<_>>().join(",") + "\n")
            .collect();
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("ratings.csv"), csv).unwrap();
        let train_len = |path: String, format: DatasetFormat, from: &Path| {
            let mut job = example("mf-movielens.yaml");
            job.spec.app.dataset.path = Some(path);
            job.spec.app.dataset.format = Some(format);
            match build_app(&job, DataDir::cli(from)) {
                Ok(JobApp::Mf(app)) => app.train_len(),
                Ok(_) => panic!("not matrix factorization"),
                Err(error) => panic!("{error}"),
            }
        };
        let from_inter = train_len("ml-100k.inter".into(), DatasetFormat::MovielensInter, &data);
        let from_csv = train_len("ratings.csv".into(), DatasetFormat::Csv, dir.path());
        assert_eq!(from_csv, from_inter);
        assert_eq!(from_inter, 80_000, "MovieLens 100K less its 20% test split");
        // A malformed row names the file and line.
        std::fs::write(dir.path().join("bad.csv"), "1,2,3\n1,2\n").unwrap();
        let mut job = example("mf-movielens.yaml");
        job.spec.app.dataset.path = Some("bad.csv".into());
        job.spec.app.dataset.format = Some(DatasetFormat::Csv);
        let error = build_app(&job, DataDir::cli(dir.path()))
            .err()
            .expect("refused")
            .to_string();
        assert!(error.contains("bad.csv:2"), "{error}");
    }

    #[test]
    fn worker_threads_default_to_the_requested_cpus() {
        use k8s_openapi::api::core::v1::ResourceRequirements;
        use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
        let with_cpu = |cpu: &str| ebbflow_crds::RuntimeSpec {
            resources: Some(ResourceRequirements {
                requests: Some(
                    [("cpu".to_owned(), Quantity(cpu.to_owned()))]
                        .into_iter()
                        .collect(),
                ),
                ..ResourceRequirements::default()
            }),
            ..ebbflow_crds::RuntimeSpec::default()
        };
        assert_eq!(worker_threads(&ebbflow_crds::RuntimeSpec::default()), 1);
        assert_eq!(worker_threads(&with_cpu("4")), 4);
        assert_eq!(worker_threads(&with_cpu("1500m")), 2);
        assert_eq!(worker_threads(&with_cpu("0.5")), 1);
        assert_eq!(
            worker_threads(&with_cpu("lots")),
            1,
            "unreadable: the default"
        );
        let explicit = ebbflow_crds::RuntimeSpec {
            worker_threads: Some(3),
            ..with_cpu("8")
        };
        assert_eq!(worker_threads(&explicit), 3);
        // threads of a worker take their share of the CPUs, and clamp to a stratum's blocks
        let per_worker = |threads: u32, cpu: &str| ebbflow_crds::RuntimeSpec {
            threads_per_worker: Some(threads),
            ..with_cpu(cpu)
        };
        assert_eq!(worker_threads(&per_worker(2, "4")), 2);
        assert_eq!(worker_threads(&per_worker(4, "6")), 2);
        assert_eq!(worker_threads(&per_worker(8, "2")), 1);
        assert_eq!(threads_per_worker(&per_worker(64, "2")), 20);
        assert_eq!(threads_per_worker(&ebbflow_crds::RuntimeSpec::default()), 1);
    }

    /// `threadsPerWorker` reaches a matrix factorization's config (the runtime's `mf` tests
    /// check that a worker of n threads trains the model one thread trains).
    #[test]
    fn threads_per_worker_reach_the_mf_config() {
        let config = |threads: Option<u32>| {
            let mut job = example("quickstart.yaml");
            job.spec.runtime.threads_per_worker = threads;
            match build_app(&job, DataDir::cli(Path::new("/nonexistent"))) {
                Ok(JobApp::Mf(app)) => app.config().clone(),
                Ok(_) => panic!("not matrix factorization"),
                Err(error) => panic!("{error}"),
            }
        };
        assert_eq!(config(None).threads, 1);
        assert_eq!(config(Some(2)).threads, 2);
    }

    #[test]
    fn the_server_optimizer_reaches_the_job() {
        let mut job = example("quickstart.yaml");
        assert_eq!(elastic_config(&job).job.optimizer, Optimizer::Add);
        let movielens = elastic_config(&example("mf-movielens.yaml"));
        assert_eq!(movielens.job.optimizer, Optimizer::MOMENTUM);
        for (kind, optimizer) in [
            (ServerOptimizer::Sgd, Optimizer::Add),
            (ServerOptimizer::Momentum, Optimizer::MOMENTUM),
            (ServerOptimizer::Adagrad, Optimizer::ADAGRAD),
        ] {
            job.spec.app.server_optimizer = Some(kind);
            assert_eq!(elastic_config(&job).job.optimizer, optimizer);
        }
    }
}
