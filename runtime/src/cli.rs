//! The `ebbflow-runtime` command line: the coordinator, node and single-process modes of the
//! AgileML runtime, as a library so that a host with more apps than the built-in ones (the Python
//! SDK's `ebbflow runtime …`, which adds `--app python`) runs exactly the same command through
//! [`main_with`] and an [`ExternalApps`].

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::admin;
use crate::app::App;
use crate::apps::NamedApp;
use crate::client::{ClientConfig, NodeAddrs};
use crate::coordinator::{Coordinator, CoordinatorConfig, metrics_router, router};
use crate::elastic::{ElasticConfig, StageThresholds};
use crate::elastic_coordinator::{CheckpointSettings, ElasticJob, run_elastic_job_with};
use crate::elastic_node::{
    ElasticNodeSettings, NodeOptions, NoticeSources, run_elastic_node_with, watch_for_notices,
};
use crate::exact::{ExactApp, ExactConfig};
use crate::local::{peak_rss_bytes, run_single_process};
use crate::metrics::RuntimeMetrics;
use crate::node::{ServerHandle, WorkerPlan};
use crate::optimizer::Optimizer;
use crate::partition::{PartitionEntry, PartitionMap};
use crate::server::ServerConfig;
use crate::store::ServerState;
use crate::tls::{JobTls, TransportSecurity};
use crate::worker::JobConfig;
use anyhow::{Context, bail};
use clap::{Args, Parser, Subcommand};
use ebbflow_runtime_api::{
    ClockRecord, JobPhase, JoinRequest, JoinResponse, PlanResponse, ReportRequest, StatusResponse,
};
use prometheus::Registry;

#[derive(Debug, Parser)]
#[command(name = "ebbflow-runtime", about = "AgileML parameter-server runtime")]
struct Cli {
    /// Log as JSON lines instead of compact text.
    #[arg(long, global = true)]
    log_json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Single process: in-process server and worker threads, no TCP.
    Local {
        #[command(flatten)]
        job: JobArgs,
        /// Worker threads (default: one per core).
        #[arg(long)]
        workers: Option<usize>,
        #[command(flatten)]
        app: AppArgs,
    },
    /// Coordinator: static membership, admin HTTP API, final evaluation.
    Coordinator {
        #[command(flatten)]
        job: JobArgs,
        /// Admin HTTP address (port 0 picks one; the bound address is printed).
        #[arg(long, default_value = "127.0.0.1:0")]
        listen: SocketAddr,
        /// Nodes to wait for.
        #[arg(long)]
        nodes: u32,
        #[command(flatten)]
        secret: SecretArg,
        /// Write the final run report (JSON) here.
        #[arg(long)]
        report_out: Option<PathBuf>,
        #[command(flatten)]
        app: AppArgs,
    },
    /// Node: hosts partitions and worker threads.
    Node {
        /// Coordinator URL, e.g. `https://127.0.0.1:7000` (`http://` with transport security
        /// `none`).
        #[arg(long)]
        coordinator: String,
        /// Stable node name.
        #[arg(long)]
        name: String,
        /// Data-plane address (port 0 picks one).
        #[arg(long, default_value = "127.0.0.1:0")]
        listen: SocketAddr,
        /// Data-plane address other nodes use (default: the bound address).
        #[arg(long)]
        advertise: Option<SocketAddr>,
        /// Serve `/metrics` on this address.
        #[arg(long)]
        metrics_listen: Option<SocketAddr>,
        /// Worker threads (default: one per core; 0 for a server-only node).
        #[arg(long)]
        workers: Option<usize>,
        /// Host no partitions (a worker-only node).
        #[arg(long)]
        no_serve: bool,
        #[command(flatten)]
        secret: SecretArg,
        /// Server-side optimizer: `add`, `sgd:LR`, `momentum:LR:MU`, `adagrad:LR:EPS`.
        #[arg(long, default_value = "add", value_parser = parse_optimizer)]
        optimizer: Optimizer,
        /// Data-plane transport security: `tls` or `none` (as the job's other processes).
        #[arg(long, env = "EBBFLOW_TRANSPORT_SECURITY", default_value_t = TransportSecurity::Tls)]
        transport_security: TransportSecurity,
        #[command(flatten)]
        notices: NoticeArgs,
        #[command(flatten)]
        app: AppArgs,
    },
    /// Elastic coordinator: node processes join and leave while the job trains (AgileML stages,
    /// migrations on notices, rollback on failures).
    ElasticCoordinator {
        #[command(flatten)]
        job: JobArgs,
        #[command(flatten)]
        elastic: ElasticArgs,
        /// Admin HTTP address (port 0 picks one; the bound address is printed).
        #[arg(long, default_value = "127.0.0.1:0")]
        listen: SocketAddr,
        /// Reliable (on-demand) nodes to wait for before training starts.
        #[arg(long, default_value_t = 1)]
        reliable_nodes: u32,
        /// Clocks between ActivePS -> BackupPS copies (the most a failure can cost).
        #[arg(long, default_value_t = 5)]
        backup_every: u64,
        /// Milliseconds between ActivePS -> BackupPS copies instead of --backup-every, converted
        /// to clocks at the time per clock measured in the last segment.
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
        backup_interval_ms: Option<u64>,
        /// Cap on the BackupPS copy traffic, all nodes together, in megabits per second: copies
        /// are spaced so that their measured size fits (each delta then coalesces more clocks).
        #[arg(long, value_parser = positive_mbps)]
        backup_bandwidth_mbps: Option<f64>,
        /// Take the BackupPS copies at segment boundaries (every node stops every
        /// --backup-every clocks) instead of in the background while workers run.
        #[arg(long)]
        boundary_copies: bool,
        /// Transient:reliable ratio above which stage 2 is used.
        #[arg(long, default_value_t = 1.0)]
        stage2_above: f64,
        /// Transient:reliable ratio above which stage 3 is used.
        #[arg(long, default_value_t = 15.0)]
        stage3_above: f64,
        /// Seconds to wait for the reliable nodes.
        #[arg(long, default_value_t = 600)]
        join_timeout_seconds: u64,
        /// Milliseconds without a heartbeat after which a node is declared failed (its
        /// partitions roll back to the BackupPS copy and it is fenced); 0 turns this off.
        #[arg(long, default_value_t = 5000)]
        heartbeat_timeout_ms: u64,
        #[command(flatten)]
        secret: SecretArg,
        /// Write the final report (JSON) here.
        #[arg(long)]
        report_out: Option<PathBuf>,
        /// Checkpoint the newest consistent BackupPS copy to this file, and resume from it if
        /// it holds this job's (a coordinator restarted after a crash goes on from there).
        #[arg(long)]
        checkpoint: Option<PathBuf>,
        /// Milliseconds between checkpoint writes at most.
        #[arg(long, default_value_t = 30_000)]
        checkpoint_interval_ms: u64,
        #[command(flatten)]
        app: AppArgs,
    },
    /// Elastic node: hosts what the elastic coordinator places on it and runs the workers it
    /// assigns, until the coordinator lets it go (exit 0) or its instance is taken.
    ElasticNode {
        #[command(flatten)]
        job: JobArgs,
        #[command(flatten)]
        elastic: ElasticArgs,
        /// Coordinator URL, e.g. `https://127.0.0.1:7000` (`http://` with transport security
        /// `none`).
        #[arg(long)]
        coordinator: String,
        /// Stable node name (instance or pod name).
        #[arg(long)]
        name: String,
        /// The node runs on transient (spot) capacity.
        #[arg(long)]
        transient: bool,
        /// Data-plane address (port 0 picks one).
        #[arg(long, default_value = "127.0.0.1:0")]
        listen: SocketAddr,
        /// Data-plane address other nodes use (default: the bound address).
        #[arg(long)]
        advertise: Option<SocketAddr>,
        /// Serve `/metrics` on this address.
        #[arg(long)]
        metrics_listen: Option<SocketAddr>,
        #[command(flatten)]
        secret: SecretArg,
        /// Milliseconds between heartbeats to the coordinator.
        #[arg(long, default_value_t = 500)]
        heartbeat_interval_ms: u64,
        /// The node's data-plane bandwidth in Mbit/s each way, enforced by a token bucket on
        /// every byte its server reads and writes (0: unlimited).
        #[arg(long, default_value_t = 0.0)]
        bandwidth_limit_mbps: f64,
        #[command(flatten)]
        notices: NoticeArgs,
        #[command(flatten)]
        app: AppArgs,
    },
    /// Prints the job's admin-API certificate (PEM), which `curl --cacert` or Python's `ssl`
    /// trusts with host-name checks off; `--pin` prints the public-key pin `curl --pinnedpubkey`
    /// takes instead. Both are functions of the job's secret alone.
    AdminCertificate {
        #[command(flatten)]
        secret: SecretArg,
        /// Print `sha256//...` (curl's `--pinnedpubkey`) instead of the certificate.
        #[arg(long)]
        pin: bool,
    },
}

/// The job's shared secret, which every process of a job is given (from the environment: a
/// command line is visible to every user of the machine).
#[derive(Debug, Clone, Args)]
struct SecretArg {
    /// The job's shared secret.
    #[arg(
        long = "secret",
        env = "EBBFLOW_JOB_SECRET",
        hide_env_values = true,
        value_parser = clap::builder::NonEmptyStringValueParser::new()
    )]
    secret: String,
}

/// How a node learns that its instance is going away.
#[derive(Debug, Clone, Args)]
struct NoticeArgs {
    /// Seconds between SIGTERM and the node's end (the pod's termination grace period): on
    /// SIGTERM the coordinator is told the node leaves then, and the process exits then.
    #[arg(long, default_value_t = 30)]
    grace_seconds: u64,
    /// EC2 instance metadata endpoint to watch for spot interruptions and rebalance
    /// recommendations (e.g. http://169.254.169.254; off when unset).
    #[arg(long, env = "EBBFLOW_METADATA_ENDPOINT")]
    metadata_endpoint: Option<String>,
    /// Milliseconds between metadata polls.
    #[arg(long, default_value_t = 2000)]
    metadata_poll_ms: u64,
}

impl NoticeArgs {
    /// The notice sources of node `name` of the job behind `coordinator`.
    fn sources(&self, coordinator: &str, secret: &str, name: &str) -> NoticeSources {
        NoticeSources {
            coordinator: coordinator.trim_end_matches('/').to_owned(),
            secret: secret.to_owned(),
            name: name.to_owned(),
            grace: Duration::from_secs(self.grace_seconds),
            metadata_endpoint: self.metadata_endpoint.clone(),
            metadata_poll: Duration::from_millis(self.metadata_poll_ms.max(10)),
        }
    }
}

/// What every process of an elastic job must agree on.
#[derive(Debug, Clone, Args)]
struct ElasticArgs {
    /// Logical workers (data shards) of the job, spread over the nodes that run workers.
    #[arg(long, default_value_t = 4)]
    job_workers: usize,
}

/// The job description nodes present when they join (a node started for another job is
/// refused).
fn job_id(job: &JobArgs, elastic: &ElasticArgs, app: &AppArgs) -> String {
    let mut id = format!(
        "{} clocks={} staleness={} partitions={} workers={} optimizer={:?}",
        app.app, job.clocks, job.staleness, job.partitions, elastic.job_workers, job.optimizer
    );
    if app.app == "exact" {
        id.push_str(&format!(
            " rows={} width={} tables={} shared={} clock_ms={}",
            app.exact_rows, app.exact_width, app.exact_tables, app.exact_shared, app.exact_clock_ms
        ));
        if app.exact_update_period != 1 {
            id.push_str(&format!(" update_period={}", app.exact_update_period));
        }
    }
    if let Some(clocks) = app.mf_clocks_per_pass {
        id.push_str(&format!(" mf_clocks_per_pass={clocks}"));
    }
    if let Some(entry) = &app.entry {
        id.push_str(&format!(" entry={entry}"));
    }
    if let Some(args) = &app.app_args {
        id.push_str(&format!(" args={args}"));
    }
    id
}

fn elastic_job_config(job: &JobArgs, elastic: &ElasticArgs) -> JobConfig {
    JobConfig {
        clocks: job.clocks,
        staleness: job.staleness,
        partitions: job.partitions,
        optimizer: job.optimizer,
        workers: elastic.job_workers,
        transport_security: job.transport_security,
        ..JobConfig::default()
    }
}

#[derive(Debug, Clone, Args)]
struct JobArgs {
    /// Clocks to run.
    #[arg(long, default_value_t = 10)]
    clocks: u64,
    /// SSP staleness (0 = BSP).
    #[arg(long, default_value_t = 0)]
    staleness: u64,
    /// Partitions of the key space.
    #[arg(long, default_value_t = 4)]
    partitions: u32,
    /// Server-side optimizer: `add`, `sgd:LR`, `momentum:LR:MU`, `adagrad:LR:EPS` (local mode).
    #[arg(long = "server-optimizer", default_value = "add", value_parser = parse_optimizer)]
    optimizer: Optimizer,
    /// Data-plane transport security: `tls` (TLS 1.3 keyed by the job secret) or `none`
    /// (plain TCP; the handshake still never sends the secret). Every process of a job must
    /// use the same.
    #[arg(long, env = "EBBFLOW_TRANSPORT_SECURITY", default_value_t = TransportSecurity::Tls)]
    transport_security: TransportSecurity,
}

#[derive(Debug, Clone, Args)]
struct AppArgs {
    /// Application: `exact` (the integer-exact test app), or `mf`, `mlr`, `lda` (real data from
    /// `EBBFLOW_DATA_DIR`) and `mf-synthetic`, `mlr-synthetic`, `lda-synthetic`.
    #[arg(long, default_value = "exact")]
    app: String,
    /// exact: rows per table.
    #[arg(long, default_value_t = 64)]
    exact_rows: u64,
    /// exact: values per row.
    #[arg(long, default_value_t = 4)]
    exact_width: usize,
    /// exact: tables.
    #[arg(long, default_value_t = 2)]
    exact_tables: u32,
    /// exact: rows every worker touches.
    #[arg(long, default_value_t = 4)]
    exact_shared: u64,
    /// exact: simulated compute milliseconds per clock.
    #[arg(long, default_value_t = 0)]
    exact_clock_ms: u64,
    /// exact: a row changes only at clocks `c` with `(row + c) % N == 0` (1: every clock).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    exact_update_period: u64,
    /// mf, mf-synthetic: clocks a pass over the data takes (default: derived from the worker
    /// count and the staleness).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    mf_clocks_per_pass: Option<u64>,
    /// An app the host adds (`--app python`): where its code is, e.g. `package.module:Class`.
    #[arg(long)]
    entry: Option<String>,
    /// An app the host adds: its arguments, as one JSON object.
    #[arg(long)]
    app_args: Option<String>,
}

/// The `--app`, `--entry` and `--app-args` of an app the host adds.
#[derive(Debug, Clone, Copy)]
pub struct ExternalAppArgs<'a> {
    /// `--app`.
    pub app: &'a str,
    /// `--entry`, if given.
    pub entry: Option<&'a str>,
    /// `--app-args`, if given.
    pub args: Option<&'a str>,
    /// The job's SSP staleness.
    pub staleness: u64,
}

/// Apps a host adds to the built-in ones.
pub trait ExternalApps: Sync {
    /// Whether the host has an app called `app`.
    fn has(&self, app: &str) -> bool;
    /// Builds the app `args.app` (one [`ExternalApps::has`]) and runs `task` with it.
    fn run<T: AppTask>(&self, args: ExternalAppArgs<'_>, task: T) -> anyhow::Result<()>;
}

/// A host with only the built-in apps (the `ebbflow-runtime` binary).
#[derive(Debug, Clone, Copy, Default)]
pub struct BuiltinApps;

impl ExternalApps for BuiltinApps {
    fn has(&self, _: &str) -> bool {
        false
    }

    fn run<T: AppTask>(&self, args: ExternalAppArgs<'_>, _: T) -> anyhow::Result<()> {
        bail!("unknown app {:?}", args.app)
    }
}

/// A rate in megabits per second: a finite number above 0.
fn positive_mbps(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(mbps) if mbps.is_finite() && mbps > 0.0 => Ok(mbps),
        _ => Err(format!(
            "expected megabits per second above 0 (e.g. 100 or 0.5), got {text:?}"
        )),
    }
}

/// Parses a server optimizer: `add`, `sgd:LR`, `momentum:LR:MU` or `adagrad:LR:EPS`.
pub fn parse_optimizer(text: &str) -> Result<Optimizer, String> {
    let parts: Vec<&str> = text.split(':').collect();
    let number = |i: usize| -> Result<f32, String> {
        parts
            .get(i)
            .ok_or_else(|| format!("optimizer {text:?} misses a parameter"))?
            .parse()
            .map_err(|_| format!("optimizer {text:?}: not a number"))
    };
    match parts[0] {
        "add" if parts.len() == 1 => Ok(Optimizer::Add),
        "sgd" if parts.len() == 2 => Ok(Optimizer::Sgd { lr: number(1)? }),
        "momentum" if parts.len() == 3 => Ok(Optimizer::Momentum {
            lr: number(1)?,
            momentum: number(2)?,
        }),
        "adagrad" if parts.len() == 3 => Ok(Optimizer::AdaGrad {
            lr: number(1)?,
            eps: number(2)?,
        }),
        _ => Err(format!(
            "unknown optimizer {text:?} (expected add, sgd:LR, momentum:LR:MU or adagrad:LR:EPS)"
        )),
    }
}

fn exact_app(args: &AppArgs, clocks: u64, staleness: u64) -> anyhow::Result<ExactApp> {
    Ok(ExactApp::new(ExactConfig {
        rows: args.exact_rows,
        width: args.exact_width,
        tables: args.exact_tables,
        shared_rows: args.exact_shared,
        clocks,
        staleness,
        clock_delay: Duration::from_millis(args.exact_clock_ms),
        update_period: args.exact_update_period,
    }))
}

/// Work that needs the app, whose type `--app` picks at run time.
pub trait AppTask {
    /// Runs with the built app.
    fn run<A: App>(self, app: A) -> anyhow::Result<()>;
}

/// Builds the app named by `--app` and runs `task` with it.
fn with_app<T: AppTask, E: ExternalApps>(
    external: &E,
    args: &AppArgs,
    clocks: u64,
    staleness: u64,
    task: T,
) -> anyhow::Result<()> {
    if args.app == "exact" {
        return task.run(exact_app(args, clocks, staleness)?);
    }
    if external.has(&args.app) {
        let external_args = ExternalAppArgs {
            app: &args.app,
            entry: args.entry.as_deref(),
            args: args.app_args.as_deref(),
            staleness,
        };
        return external.run(external_args, task);
    }
    // MF, MLR and LDA with their standard data (EBBFLOW_DATA_DIR) or synthetic variants.
    let data_dir = crate::data::data_dir();
    match crate::apps::build_named_app(&args.app, data_dir.as_deref(), staleness)? {
        NamedApp::Mf(app) => match args.mf_clocks_per_pass {
            Some(clocks) => task.run(app.with_clocks_per_pass(clocks as usize)?),
            None => task.run(app),
        },
        NamedApp::Mlr(app) => task.run(app),
        NamedApp::Lda(app) => task.run(app),
    }
}

/// Single-process mode.
struct LocalTask {
    config: JobConfig,
}

impl AppTask for LocalTask {
    fn run<A: App>(self, app: A) -> anyhow::Result<()> {
        let report = run_single_process(&app, &self.config, &RuntimeMetrics::unregistered())?;
        println!("{}", serde_json::to_string(&report)?);
        Ok(())
    }
}

fn default_workers() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

fn init_tracing(json: bool) {
    let filter =
        tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    // A host that set up tracing itself keeps its subscriber.
    let _ = if json {
        builder.json().try_init()
    } else {
        builder.compact().try_init()
    };
}

/// Runs the command line `args` (the program name first) with the built-in apps and `external`'s.
pub fn main_with<E: ExternalApps>(
    args: impl IntoIterator<Item = OsString>,
    external: &E,
) -> anyhow::Result<()> {
    let cli = Cli::parse_from(args);
    init_tracing(cli.log_json);
    match cli.command {
        Command::Local { job, workers, app } => {
            let config = JobConfig {
                clocks: job.clocks,
                staleness: job.staleness,
                partitions: job.partitions,
                optimizer: job.optimizer,
                workers: workers.unwrap_or_else(default_workers),
                ..JobConfig::default()
            };
            with_app(
                external,
                &app,
                job.clocks,
                job.staleness,
                LocalTask { config },
            )
        }
        Command::Coordinator {
            job,
            listen,
            nodes,
            secret: SecretArg { secret },
            report_out,
            app,
        } => coordinator_main(external, job, listen, nodes, secret, report_out, app),
        Command::Node {
            coordinator,
            name,
            listen,
            advertise,
            metrics_listen,
            workers,
            no_serve,
            secret: SecretArg { secret },
            optimizer,
            transport_security,
            notices,
            app,
        } => node_main(
            external,
            NodeArgs {
                serves: !no_serve,
                notices: notices.sources(&coordinator, &secret, &name),
                listen,
                advertise,
                metrics_listen,
                workers: workers.unwrap_or_else(default_workers),
                optimizer,
                transport_security,
                app,
            },
        ),
        Command::ElasticCoordinator {
            job,
            elastic,
            listen,
            reliable_nodes,
            backup_every,
            backup_interval_ms,
            backup_bandwidth_mbps,
            boundary_copies,
            stage2_above,
            stage3_above,
            join_timeout_seconds,
            heartbeat_timeout_ms,
            secret: SecretArg { secret },
            report_out,
            checkpoint,
            checkpoint_interval_ms,
            app,
        } => {
            if reliable_nodes == 0 {
                bail!("--reliable-nodes must be at least 1");
            }
            let task = ElasticCoordinatorTask {
                job: ElasticJob {
                    config: ElasticConfig {
                        job: elastic_job_config(&job, &elastic),
                        thresholds: StageThresholds {
                            stage2_above,
                            stage3_above,
                        },
                        backup_every,
                        backup_interval: backup_interval_ms.map(Duration::from_millis),
                        backup_bandwidth: backup_bandwidth_mbps.map(|mbps| mbps * 1e6 / 8.0),
                        start: None,
                        checkpoint: None,
                        reliable: Vec::new(),
                        transient: Vec::new(),
                    },
                    secret,
                    job: job_id(&job, &elastic, &app),
                    reliable_nodes,
                    join_timeout: Duration::from_secs(join_timeout_seconds),
                    background_copies: !boundary_copies,
                    linger: None,
                    stop: None,
                    checkpoint: checkpoint.map(|path| CheckpointSettings {
                        path,
                        interval: Duration::from_millis(checkpoint_interval_ms),
                    }),
                },
                listen,
                report_out,
                heartbeat_timeout: Duration::from_millis(heartbeat_timeout_ms),
            };
            with_app(external, &app, job.clocks, job.staleness, task)
        }
        Command::ElasticNode {
            job,
            elastic,
            coordinator,
            name,
            transient,
            listen,
            advertise,
            metrics_listen,
            secret: SecretArg { secret },
            heartbeat_interval_ms,
            bandwidth_limit_mbps,
            notices,
            app,
        } => {
            if !(bandwidth_limit_mbps.is_finite() && bandwidth_limit_mbps >= 0.0) {
                bail!("--bandwidth-limit-mbps must be 0 (unlimited) or a positive number");
            }
            let task = ElasticNodeTask {
                options: NodeOptions {
                    heartbeat_interval: Duration::from_millis(heartbeat_interval_ms.max(10)),
                    bandwidth_limit_mbps,
                },
                settings: ElasticNodeSettings {
                    job: elastic_job_config(&job, &elastic),
                    job_id: job_id(&job, &elastic, &app),
                    reliable: !transient,
                    listen,
                    advertise,
                    metrics_listen,
                    registry: None,
                    notices: notices.sources(&coordinator, &secret, &name),
                },
            };
            with_app(external, &app, job.clocks, job.staleness, task)
        }
        Command::AdminCertificate {
            secret: SecretArg { secret },
            pin,
        } => {
            let tls = JobTls::new(secret.as_bytes());
            if pin {
                println!("{}", tls.admin_public_key_pin());
            } else {
                print!("{}", tls.admin_certificate_pem());
            }
            Ok(())
        }
    }
}

/// The elastic coordinator's life once the app is built.
struct ElasticCoordinatorTask {
    job: ElasticJob,
    listen: SocketAddr,
    report_out: Option<PathBuf>,
    heartbeat_timeout: Duration,
}

impl AppTask for ElasticCoordinatorTask {
    fn run<A: App>(self, app: A) -> anyhow::Result<()> {
        let registry = Registry::new();
        let metrics = RuntimeMetrics::register(&registry).context("registering metrics")?;
        let listener = std::net::TcpListener::bind(self.listen)
            .with_context(|| format!("binding the admin address {}", self.listen))?;
        let bound = listener.local_addr()?;
        // The launcher reads this line to learn the port.
        println!("listening on {bound}");
        tracing::info!(%bound, reliable = self.job.reliable_nodes, "elastic coordinator listening");
        let (events, feed) = crate::elastic::LiveFeed::new();
        let stop =
            stop_on_signals(events.clone()).context("installing the SIGTERM/SIGINT handler")?;
        let report = run_elastic_job_with(
            &app,
            ElasticJob {
                stop: Some(stop),
                ..self.job
            },
            self.heartbeat_timeout,
            listener,
            registry,
            &metrics,
            (events, feed),
        )?;
        let summary = serde_json::json!({
            "run": report.run,
            "segments": report.segments,
            "partitions_migrated": report.partitions_migrated,
            "rollbacks": report.rollbacks,
            "clocks_redone": report.clocks_redone,
            "events": report.events,
            "rejected": report.rejected,
            "notice_to_safe_seconds": report.notice_to_safe_seconds,
            "stopped_at": report.stopped_at,
        });
        if let Some(path) = &self.report_out {
            std::fs::write(path, serde_json::to_vec_pretty(&summary)?)
                .with_context(|| format!("writing the report to {}", path.display()))?;
        }
        tracing::info!(
            loss = report.run.eval.loss,
            rollbacks = report.rollbacks,
            migrated = report.partitions_migrated,
            "elastic job done"
        );
        Ok(())
    }
}

/// SIGTERM or SIGINT stops the elastic job at the next clock boundary, as `POST /stop` does:
/// what was trained is kept (checkpointed at once under `--checkpoint`), the report is written
/// and the nodes are released; before training starts it ends the wait for the nodes (the
/// returned receiver turns true). A second signal exits at once.
fn stop_on_signals(
    events: std::sync::mpsc::Sender<crate::elastic::ElasticEvent>,
) -> anyhow::Result<tokio::sync::watch::Receiver<bool>> {
    let (stopping, stop) = tokio::sync::watch::channel(false);
    use tokio::signal::unix::{SignalKind, signal};
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (mut terminate, mut interrupt) = {
        let _guard = rt.enter();
        (
            signal(SignalKind::terminate())?,
            signal(SignalKind::interrupt())?,
        )
    };
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            rt.block_on(async {
                let mut told = false;
                loop {
                    let name = tokio::select! {
                        _ = terminate.recv() => "SIGTERM",
                        _ = interrupt.recv() => "SIGINT",
                    };
                    if told {
                        tracing::warn!(signal = name, "told again: exiting now");
                        std::process::exit(130);
                    }
                    told = true;
                    tracing::info!(
                        signal = name,
                        "stopping at the next clock boundary (again to exit now)"
                    );
                    let _ = events.send(crate::elastic::ElasticEvent::Stop);
                    let _ = stopping.send(true);
                }
            });
        })?;
    Ok(stop)
}

/// An elastic node's life once the app is built.
struct ElasticNodeTask {
    settings: ElasticNodeSettings,
    options: NodeOptions,
}

impl AppTask for ElasticNodeTask {
    fn run<A: App>(self, app: A) -> anyhow::Result<()> {
        Ok(run_elastic_node_with(app, self.settings, self.options)?)
    }
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the tokio runtime")
}

fn coordinator_main<E: ExternalApps>(
    external: &E,
    job: JobArgs,
    listen: SocketAddr,
    nodes: u32,
    secret: String,
    report_out: Option<PathBuf>,
    app: AppArgs,
) -> anyhow::Result<()> {
    if nodes == 0 {
        bail!("--nodes must be at least 1");
    }
    let (clocks, staleness) = (job.clocks, job.staleness);
    with_app(
        external,
        &app,
        clocks,
        staleness,
        CoordinatorTask {
            job,
            listen,
            nodes,
            secret,
            report_out,
        },
    )
}

/// The coordinator's life once the app (for its tables and evaluation) is built.
struct CoordinatorTask {
    job: JobArgs,
    listen: SocketAddr,
    nodes: u32,
    secret: String,
    report_out: Option<PathBuf>,
}

impl AppTask for CoordinatorTask {
    fn run<A: App>(self, app: A) -> anyhow::Result<()> {
        let CoordinatorTask {
            job,
            listen,
            nodes,
            secret,
            report_out,
        } = self;
        let specs = app.tables();
        let app = Arc::new(app);
        let tls = JobTls::for_security(job.transport_security, secret.as_bytes());
        let config = CoordinatorConfig {
            expected_nodes: nodes,
            partitions: job.partitions,
            clocks: job.clocks,
            staleness: job.staleness,
            tls: tls.clone(),
            secret,
            specs,
            evaluator: Arc::new(move |snapshot, total_workers| {
                app.set_num_workers(total_workers);
                app.evaluate(snapshot)
            }),
        };
        let registry = Registry::new();
        let metrics = RuntimeMetrics::register(&registry).context("registering metrics")?;
        let coordinator = Coordinator::new(config, registry);
        let rt = runtime()?;
        let listener = rt
            .block_on(tokio::net::TcpListener::bind(listen))
            .with_context(|| format!("binding the admin address {listen}"))?;
        let bound = listener.local_addr()?;
        // The launcher reads this line to learn the port.
        println!("listening on {bound}");
        let url = format!("{}://{bound}", admin::scheme(tls.is_some()));
        tracing::info!(%url, nodes, "coordinator listening");
        let served = coordinator.clone();
        rt.block_on(async move {
            let waiter = served.clone();
            let finished = async move {
                while !waiter.finished() {
                    tokio::select! {
                        () = waiter.changed() => {}
                        () = tokio::time::sleep(Duration::from_millis(200)) => {}
                    }
                }
            };
            let refused = metrics.admin_connections_refused.clone();
            admin::serve(listener, router(served), tls.as_deref(), refused, finished).await
        })
        .context("serving the admin API")?;
        let status = coordinator.status(None);
        if let (Some(path), Some(report)) = (report_out, coordinator.run_report()) {
            std::fs::write(&path, serde_json::to_vec_pretty(&report)?)
                .with_context(|| format!("writing the report to {}", path.display()))?;
        }
        match status.phase {
            JobPhase::Done => Ok(()),
            phase => bail!("job ended {phase:?}: {}", status.error.unwrap_or_default()),
        }
    }
}

struct NodeArgs {
    serves: bool,
    /// Coordinator, secret and name live here.
    notices: NoticeSources,
    listen: SocketAddr,
    advertise: Option<SocketAddr>,
    metrics_listen: Option<SocketAddr>,
    workers: usize,
    optimizer: Optimizer,
    transport_security: TransportSecurity,
    app: AppArgs,
}

async fn get_json<T: serde::de::DeserializeOwned>(
    http: &reqwest::Client,
    url: &str,
    secret: &str,
) -> anyhow::Result<T> {
    let response = http
        .get(url)
        .bearer_auth(secret)
        .send()
        .await
        .with_context(|| format!("GET {url}"))?;
    let status = response.status();
    if !status.is_success() {
        bail!(
            "GET {url} answered {status}: {}",
            response.text().await.unwrap_or_default()
        );
    }
    response
        .json()
        .await
        .with_context(|| format!("decoding GET {url}"))
}

async fn post_json<B: serde::Serialize, T: serde::de::DeserializeOwned>(
    http: &reqwest::Client,
    url: &str,
    body: &B,
) -> anyhow::Result<T> {
    let response = http
        .post(url)
        .json(body)
        .send()
        .await
        .with_context(|| format!("POST {url}"))?;
    let status = response.status();
    if !status.is_success() {
        bail!(
            "POST {url} answered {status}: {}",
            response.text().await.unwrap_or_default()
        );
    }
    response
        .json()
        .await
        .with_context(|| format!("decoding POST {url}"))
}

fn node_main<E: ExternalApps>(external: &E, args: NodeArgs) -> anyhow::Result<()> {
    let rt = runtime()?;
    let registry = Registry::new();
    let metrics = RuntimeMetrics::register(&registry).context("registering metrics")?;
    let listener = rt
        .block_on(tokio::net::TcpListener::bind(args.listen))
        .with_context(|| format!("binding the data plane on {}", args.listen))?;
    let advertise = args.advertise.unwrap_or(listener.local_addr()?);
    if let Some(addr) = args.metrics_listen {
        let metrics_listener = rt
            .block_on(tokio::net::TcpListener::bind(addr))
            .with_context(|| format!("binding metrics on {addr}"))?;
        let app = metrics_router(registry.clone());
        rt.spawn(async move { axum::serve(metrics_listener, app).await });
    }
    let tls = JobTls::for_security(args.transport_security, args.notices.secret.as_bytes());
    let http = admin::client(tls.as_deref())
        .timeout(Duration::from_secs(60))
        .build()
        .context("building the HTTP client")?;
    let base =
        &admin::base_url(&args.notices.coordinator, tls.is_some()).map_err(anyhow::Error::msg)?;
    let join = JoinRequest {
        name: args.notices.name.clone(),
        data_addr: advertise.to_string(),
        workers: args.workers as u32,
        secret: args.notices.secret.clone(),
        reliable: true,
        serves: args.serves,
        job: String::new(),
    };
    let joined: JoinResponse = rt.block_on(post_json(&http, &format!("{base}/join"), &join))?;
    let node = joined.node;
    tracing::info!(node, name = %args.notices.name, %advertise, "joined");
    watch_for_notices(&rt, &args.notices, &http)?;
    let deadline = Instant::now() + Duration::from_secs(600);
    let plan: PlanResponse = loop {
        let plan: PlanResponse = rt.block_on(get_json(
            &http,
            &format!("{base}/plan?node={node}"),
            &args.notices.secret,
        ))?;
        if plan.ready {
            break plan;
        }
        if Instant::now() > deadline {
            bail!("the job did not start within 600 s");
        }
        // Short: a node serves its partitions only once it has the plan, and peers may already be
        // connecting (their connections wait in the listen backlog meanwhile).
        rt.block_on(async { tokio::time::sleep(Duration::from_millis(5)).await });
    };
    let entries = plan
        .partitions
        .iter()
        .map(|p| PartitionEntry {
            owner: p.owner,
            epoch: p.epoch,
        })
        .collect();
    let map = PartitionMap::from_entries(entries)?;
    let mut addrs = NodeAddrs::new();
    for info in &plan.nodes {
        addrs.insert(
            info.node,
            info.data_addr
                .parse()
                .with_context(|| format!("node {} address {:?}", info.node, info.data_addr))?,
        );
    }
    let me = plan
        .nodes
        .iter()
        .find(|n| n.node == node)
        .context("the plan does not list this node")?;
    let (clocks, staleness) = (plan.clocks, plan.staleness);
    let app_args = args.app.clone();
    let task = NodeTask {
        rt,
        metrics,
        listener,
        http,
        tls,
        base: base.to_owned(),
        node,
        map,
        addrs,
        me: me.clone(),
        plan,
        args,
    };
    with_app(external, &app_args, clocks, staleness, task)
}

/// The part of a node's life that needs the app: host partitions, train, report, serve until done.
struct NodeTask {
    rt: tokio::runtime::Runtime,
    metrics: RuntimeMetrics,
    listener: tokio::net::TcpListener,
    http: reqwest::Client,
    /// The job's TLS (none without transport security), derived once for both planes.
    tls: Option<Arc<JobTls>>,
    base: String,
    node: u32,
    map: PartitionMap,
    addrs: NodeAddrs,
    me: ebbflow_runtime_api::NodeInfo,
    plan: PlanResponse,
    args: NodeArgs,
}

impl AppTask for NodeTask {
    fn run<A: App>(self, app: A) -> anyhow::Result<()> {
        let NodeTask {
            rt,
            metrics,
            listener,
            http,
            tls,
            base,
            node,
            map,
            addrs,
            me,
            plan,
            args,
        } = self;
        let base = &base;
        let me = &me;
        let specs = app.tables();
        let hosted: Vec<_> = map
            .owned_by(node)
            .into_iter()
            .map(|p| (p, map.entries()[p as usize].epoch))
            .collect();
        let state = Arc::new(ServerState::new(
            &hosted,
            map.num_partitions(),
            &specs,
            plan.total_workers,
            args.optimizer,
            plan.staleness == 0,
        ));
        let wait_timeout = Duration::from_secs(600);
        let server_config = ServerConfig {
            wait_timeout,
            tls: tls.clone(),
            ..ServerConfig::with_secret(args.notices.secret.clone().into_bytes())
        };
        let server =
            ServerHandle::serve(rt.handle(), listener, state, server_config, metrics.clone())?;
        let worker_plan = WorkerPlan {
            worker_base: me.worker_base,
            local_workers: me.workers as usize,
            total_workers: plan.total_workers as usize,
            map: map.clone(),
            addrs,
        };
        let client = ClientConfig {
            secret: args.notices.secret.clone().into_bytes(),
            node,
            max_frame_bytes: crate::frame::DEFAULT_MAX_FRAME_BYTES,
            timeout: wait_timeout,
            tls,
        };
        let config = JobConfig {
            clocks: plan.clocks,
            staleness: plan.staleness,
            workers: me.workers as usize,
            partitions: map.num_partitions(),
            optimizer: args.optimizer,
            wait_timeout,
            transport_security: args.transport_security,
            keep_params: false,
            ..JobConfig::default()
        };
        let outcome = crate::node::run_workers(
            &app,
            &specs,
            &worker_plan,
            &client,
            &config,
            &metrics,
            Instant::now(),
        );
        if me.workers == 0 {
            // A server-only node reports once training is over, so its peak memory covers it.
            loop {
                let status: StatusResponse = rt.block_on(get_json(
                    &http,
                    &format!("{base}/status"),
                    &args.notices.secret,
                ))?;
                let training_over = status
                    .nodes
                    .iter()
                    .filter(|n| n.workers > 0)
                    .all(|n| n.finished);
                if training_over
                    || matches!(
                        status.phase,
                        JobPhase::Done | JobPhase::Stopped | JobPhase::Failed
                    )
                {
                    break;
                }
                rt.block_on(async { tokio::time::sleep(Duration::from_millis(50)).await });
            }
        }
        let report = match &outcome {
            Ok(reports) => ReportRequest {
                node,
                secret: args.notices.secret.clone(),
                workers: reports
                    .iter()
                    .map(|r| {
                        r.stats
                            .iter()
                            .zip(&r.clock_end)
                            .map(|(s, end)| ClockRecord {
                                updates: s.updates,
                                loss_sum: s.loss_sum,
                                loss_count: s.loss_count,
                                end_seconds: *end,
                            })
                            .collect()
                    })
                    .collect(),
                wait_seconds: reports.iter().map(|r| r.wait_seconds).collect(),
                error: None,
                peak_rss_bytes: peak_rss_bytes().unwrap_or(0),
                parameter_bytes: server.state.parameter_bytes() as u64,
            },
            Err(error) => ReportRequest {
                node,
                secret: args.notices.secret.clone(),
                workers: vec![],
                wait_seconds: vec![],
                error: Some(error.to_string()),
                peak_rss_bytes: peak_rss_bytes().unwrap_or(0),
                parameter_bytes: 0,
            },
        };
        let _: ebbflow_runtime_api::Ack =
            rt.block_on(post_json(&http, &format!("{base}/report"), &report))?;
        // Keep serving partitions until the coordinator has copied them and says the job is over.
        let status: StatusResponse = loop {
            let status: StatusResponse = rt.block_on(get_json(
                &http,
                &format!("{base}/status?node={node}"),
                &args.notices.secret,
            ))?;
            if matches!(
                status.phase,
                JobPhase::Done | JobPhase::Stopped | JobPhase::Failed
            ) {
                break status;
            }
            rt.block_on(async { tokio::time::sleep(Duration::from_millis(50)).await });
        };
        server.stop(rt.handle());
        outcome?;
        match status.phase {
            JobPhase::Done => {
                tracing::info!(node, "job done");
                Ok(())
            }
            phase => bail!("job ended {phase:?}: {}", status.error.unwrap_or_default()),
        }
    }
}
