//! `ebbflow-operator`: the Kubernetes controller for TrainingJobs.
//!
//! A thin `main` over the library: flags, tracing, the HTTP endpoints, the CRD check, leader
//! election, then the controller until SIGTERM/Ctrl-C.

use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use anyhow::Context as _;
use clap::{Parser, ValueEnum};
use ebbflow_crds::{CapacityTypeLabel, CapacityTypePreset, ResolvedCapacityTypeLabel};
use ebbflow_ec2::Ec2Api;
use ebbflow_job::live_market::OnDemandPrices;
use ebbflow_operator::{
    controller::{
        self, Config, Context,
        bidbrain::{BidBrainConfig, BidBrainPlanner, Ec2MarketSource},
        capacity::{CapacityPlanner, SpecCapacityPlanner},
    },
    coordinator::CoordinatorClient,
    http::{self, HttpState},
    leader::{LeaderElector, LeaseConfig},
    metrics::Metrics,
};
use kube::{
    Client,
    runtime::events::{Recorder, Reporter},
};
use prometheus::Registry;
use tracing::{error, info};

/// Capacity-type label presets, or custom with explicit key and values.
#[derive(Clone, Copy, Debug, ValueEnum)]
enum Preset {
    /// karpenter.sh/capacity-type: on-demand | spot.
    Karpenter,
    /// eks.amazonaws.com/capacityType: ON_DEMAND | SPOT.
    Eks,
    /// cloud.google.com/gke-spot: "true" on spot nodes.
    Gke,
    /// --capacity-type-label, --on-demand-value and --spot-value.
    Custom,
}

/// ebbflow-operator: reconciles TrainingJobs into runtime pods on on-demand and spot nodes.
#[derive(Parser, Debug)]
#[command(name = "ebbflow-operator", version, about)]
struct Flags {
    /// Address of /metrics, /healthz and /readyz.
    #[arg(long, env = "EBBFLOW_METRICS_ADDR", default_value = "0.0.0.0:8080")]
    metrics_addr: SocketAddr,

    /// Node label preset telling on-demand from spot nodes, for jobs that keep the default.
    #[arg(long, value_enum, default_value = "karpenter")]
    capacity_type_preset: Preset,

    /// Label key (preset custom, or overriding the preset's).
    #[arg(long)]
    capacity_type_label: Option<String>,

    /// Label value on on-demand nodes (preset custom, or overriding the preset's).
    #[arg(long)]
    on_demand_value: Option<String>,

    /// Label value on spot nodes (preset custom, or overriding the preset's).
    #[arg(long)]
    spot_value: Option<String>,

    /// Runtime image for jobs whose spec names none (its containers run `ebbflow pod`: the image
    /// needs the `ebbflow` binary on its PATH).
    #[arg(long, env = "EBBFLOW_RUNTIME_IMAGE", default_value = concat!("ghcr.io/ebbflow/ebbflow-runtime:", env!("CARGO_PKG_VERSION")))]
    runtime_image: String,

    /// Talk to this coordinator URL for every job instead of `http://<job>-coordinator.<ns>.svc:7070`
    /// (tests, port-forwards; e.g. http://127.0.0.1:7070).
    #[arg(long, env = "EBBFLOW_COORDINATOR_URL")]
    coordinator_url: Option<String>,

    /// Timeout of each coordinator request, in seconds.
    #[arg(long, default_value_t = 5)]
    coordinator_timeout_seconds: u64,

    /// Requeue while a job's nodes are being provisioned, in seconds.
    #[arg(long, default_value_t = 10)]
    provisioning_requeue_seconds: u64,

    /// Write progress-only status changes (iteration, loss) at most this often, in seconds.
    #[arg(long, default_value_t = 15)]
    status_interval_seconds: u64,

    /// Seconds a job's pod may wait for a node before the job's Degraded condition names it
    /// (PodsUnschedulable): how long a node autoscaler may take to launch spot capacity.
    #[arg(long, default_value_t = controller::plan::UNSCHEDULABLE_AFTER_SECONDS.unsigned_abs(),
        value_parser = clap::value_parser!(u64).range(1..))]
    unschedulable_after_seconds: u64,

    /// Compete for a coordination.k8s.io Lease and reconcile only while holding it.
    #[arg(long)]
    leader_election: bool,

    /// Name of the leader Lease.
    #[arg(long, default_value = "ebbflow-operator")]
    lease_name: String,

    /// Namespace of the leader Lease.
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    lease_namespace: String,

    /// Lease validity without renewal, in seconds.
    #[arg(long, default_value_t = 15)]
    lease_duration_seconds: u64,

    /// The leader steps down if it cannot renew for this long, in seconds.
    #[arg(long, default_value_t = 10)]
    renew_deadline_seconds: u64,

    /// Pause between lease attempts, in seconds.
    #[arg(long, default_value_t = 2)]
    retry_period_seconds: u64,

    /// This replica's identity for leader election and events (default: hostname).
    #[arg(long, env = "POD_NAME")]
    identity: Option<String>,

    /// Capacity planner: bidbrain (BidBrain over the job's market for strategy BidBrain, the
    /// spec's maxNodes otherwise) or spec (always hold spec.transient.maxNodes).
    #[arg(long, value_enum, default_value = "bidbrain")]
    capacity_planner: PlannerKind,

    /// Directory that relative `spec.bidding.market.trace` paths resolve against (after the
    /// working directory).
    #[arg(long, env = "EBBFLOW_TRACE_DIR", default_value = ".")]
    trace_dir: std::path::PathBuf,

    /// Trace seconds replayed per wall-clock second for trace markets (1 = real time).
    #[arg(long, default_value_t = 1.0)]
    trace_speed: f64,

    /// Enables ec2 provisioning mode and the live ec2 market in this region: the operator
    /// launches and terminates the EC2 instances of jobs with spec.provisioning.mode ec2, and
    /// BidBrain reads spot price history for jobs with spec.bidding.market.kind ec2
    /// (credentials from the SDK's default chain: environment, IRSA / Pod Identity, instance
    /// metadata). The endpoint honours AWS_ENDPOINT_URL_EC2.
    #[arg(long, env = "EBBFLOW_EC2_REGION")]
    ec2_region: Option<String>,

    /// On-demand price list of the live ec2 market (CSV `region,instance_type,on_demand_usd_hr`;
    /// EC2's API serves no on-demand prices). Default: the us-east-1 list compiled in.
    #[arg(long, env = "EBBFLOW_ON_DEMAND_PRICES")]
    on_demand_prices: Option<std::path::PathBuf>,

    /// Hours of spot price history the live ec2 market learns from.
    #[arg(long, default_value_t = 168)]
    market_lookback_hours: u64,

    /// Fetch a live ec2 market again after this many seconds.
    #[arg(long, default_value_t = 600)]
    market_refresh_seconds: u64,

    /// BidBrain decides with the spec's application model (`bidding.overrides`) instead of the
    /// one re-estimated from each job's progress; the terms are still measured and shown in
    /// `status.appModel`.
    #[arg(long)]
    no_recalibrate: bool,

    /// Ask EC2 this often, in seconds, whether the spot instances of jobs in ec2 provisioning
    /// mode are being interrupted (with --ec2-region).
    #[arg(long, default_value_t = 5)]
    ec2_interruption_poll_seconds: u64,

    /// Reconcile a job once its changes settle for this many milliseconds (trailing-edge
    /// debounce; eviction notices do not wait for it, they take the notice relay).
    #[arg(long, default_value_t = 1000)]
    reconcile_debounce_ms: u64,

    /// Reconciles run at once across jobs (0: no limit); bounds the operator's memory at
    /// hundreds of jobs. Eviction notices do not wait for it, they take the notice relay.
    #[arg(long, default_value_t = 16)]
    max_concurrent_reconciles: u16,

    /// Reconcile the TrainingJobs of this namespace only (default: every namespace).
    #[arg(long, env = "EBBFLOW_WATCH_NAMESPACE")]
    watch_namespace: Option<String>,

    /// Give every job a NetworkPolicy that admits to its runtime pods only the job's own pods,
    /// the operator's pods (these labels, `key=value,...`, in `--operator-namespace`) on the
    /// admin port, and any scraper on the metrics port. Unset: no per-job NetworkPolicy.
    #[arg(long, env = "EBBFLOW_OPERATOR_POD_SELECTOR")]
    operator_pod_selector: Option<String>,

    /// The namespace the operator's pods run in (for `--operator-pod-selector`).
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    operator_namespace: String,
}

/// Which capacity planner decides transient pool counts.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum PlannerKind {
    /// BidBrain (expected cost per work over the job's market).
    Bidbrain,
    /// spec.transient.maxNodes in one candidate pool.
    Spec,
}

impl Flags {
    fn capacity_label(&self) -> anyhow::Result<ResolvedCapacityTypeLabel> {
        let preset = match self.capacity_type_preset {
            Preset::Karpenter => Some(CapacityTypePreset::Karpenter),
            Preset::Eks => Some(CapacityTypePreset::Eks),
            Preset::Gke => Some(CapacityTypePreset::Gke),
            Preset::Custom => None,
        };
        let label = match preset {
            Some(preset) => CapacityTypeLabel {
                preset,
                key: self.capacity_type_label.clone(),
                on_demand_value: self.on_demand_value.clone(),
                spot_value: self.spot_value.clone(),
            }
            .resolved(),
            None => ResolvedCapacityTypeLabel {
                key: self
                    .capacity_type_label
                    .clone()
                    .context("--capacity-type-preset=custom needs --capacity-type-label")?,
                on_demand_value: self.on_demand_value.clone(),
                spot_value: self
                    .spot_value
                    .clone()
                    .context("--capacity-type-preset=custom needs --spot-value")?,
            },
        };
        Ok(label)
    }
}

fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    if std::env::var("EBBFLOW_LOG_FORMAT").as_deref() == Ok("json") {
        builder.json().init();
    } else {
        builder.compact().init();
    }
}

async fn shutdown_signal() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut terminate =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                .expect("install SIGTERM handler");
        tokio::select! {
            _ = interrupt => {}
            _ = terminate.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = interrupt.await;
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let flags = Flags::parse();
    init_tracing();
    let capacity_label = flags.capacity_label()?;
    if !(flags.trace_speed.is_finite() && flags.trace_speed > 0.0) {
        anyhow::bail!(
            "--trace-speed must be a positive number of trace seconds per second, got {}",
            flags.trace_speed
        );
    }
    let identity = flags.identity.clone().unwrap_or_else(|| {
        std::env::var("HOSTNAME").unwrap_or_else(|_| "ebbflow-operator".to_owned())
    });

    let registry = Registry::new();
    let metrics = Metrics::register(&registry).context("register metrics")?;
    let ready = Arc::new(AtomicBool::new(false));
    let listener = tokio::net::TcpListener::bind(flags.metrics_addr)
        .await
        .with_context(|| format!("bind {}", flags.metrics_addr))?;
    info!(address = %flags.metrics_addr, "serving /metrics, /healthz, /readyz");
    let http_state = HttpState {
        registry,
        ready: ready.clone(),
    };
    tokio::spawn(async move {
        if let Err(error) = http::serve(listener, http_state, shutdown_signal()).await {
            error!(%error, "http server failed");
        }
    });

    let client = Client::try_default()
        .await
        .context("connect to Kubernetes (in-cluster config or KUBECONFIG)")?;
    if let Err(error) = controller::check_crd(&client).await {
        // One clear line, no backtrace: the usual cause is a missing `helm install`.
        eprintln!("ebbflow-operator: {error}");
        std::process::exit(1);
    }

    // Ready once it can serve as leader or standby: a standby waiting for the lease is a
    // healthy replica. Gating readiness on the lease kept every rolling update from finishing
    // (the new pod waited for a lease the old one held, so the old one was never replaced) and
    // kept a second replica unready for good.
    ready.store(true, Ordering::Relaxed);

    let mut elector = None;
    if flags.leader_election {
        let config = LeaseConfig {
            name: flags.lease_name.clone(),
            namespace: flags.lease_namespace.clone(),
            identity: identity.clone(),
            lease_duration: Duration::from_secs(flags.lease_duration_seconds),
            renew_deadline: Duration::from_secs(flags.renew_deadline_seconds),
            retry_period: Duration::from_secs(flags.retry_period_seconds),
        };
        config.validate()?;
        let lease = LeaderElector::new(client.clone(), config);
        info!(lease = %flags.lease_name, %identity, "waiting for leadership");
        let won = tokio::select! {
            won = lease.acquire() => won,
            () = shutdown_signal() => {
                info!("told to stop while a standby");
                return Ok(());
            }
        };
        elector = Some((lease, won));
    }
    metrics.leader.set(1);

    let ec2_api: Option<Arc<dyn Ec2Api>> = match &flags.ec2_region {
        Some(region) => {
            let api = connect_ec2(region).await?;
            info!(%region, "ec2 provisioning and the live ec2 market enabled");
            Some(api)
        }
        None => None,
    };
    let capacity: Arc<dyn CapacityPlanner> = match flags.capacity_planner {
        PlannerKind::Bidbrain => {
            let mut planner = BidBrainPlanner::new(BidBrainConfig {
                trace_dir: flags.trace_dir.clone(),
                trace_speed: flags.trace_speed,
                live_lookback: Duration::from_secs(flags.market_lookback_hours * 3600),
                live_refresh: Duration::from_secs(flags.market_refresh_seconds),
                recalibrate: !flags.no_recalibrate,
                ..BidBrainConfig::default()
            });
            if let (Some(api), Some(region)) = (&ec2_api, &flags.ec2_region) {
                let on_demand = match &flags.on_demand_prices {
                    Some(path) => OnDemandPrices::read(path),
                    None => OnDemandPrices::bundled(),
                }
                .context("load the on-demand price list (--on-demand-prices)")?;
                planner = planner.with_ec2(Ec2MarketSource {
                    api: api.clone(),
                    region: region.clone(),
                    on_demand: Arc::new(on_demand),
                });
            }
            Arc::new(planner)
        }
        PlannerKind::Spec => Arc::new(SpecCapacityPlanner),
    };
    let mut config = Config::new(flags.runtime_image.clone());
    config.plan.capacity_label = capacity_label;
    config.plan.network_policy = flags
        .operator_pod_selector
        .as_deref()
        .map(|selector| {
            controller::plan::OperatorPeer::parse(&flags.operator_namespace, selector)
                .map_err(|e| anyhow::anyhow!("--operator-pod-selector: {e}"))
        })
        .transpose()?;
    config.coordinator_url_override = flags.coordinator_url.clone();
    config.provisioning_requeue = Duration::from_secs(flags.provisioning_requeue_seconds);
    config.status_interval = Duration::from_secs(flags.status_interval_seconds);
    config.namespace = flags.watch_namespace.clone();
    config.debounce = Duration::from_millis(flags.reconcile_debounce_ms);
    config.max_concurrent_reconciles = flags.max_concurrent_reconciles;
    config.unschedulable_after = Duration::from_secs(flags.unschedulable_after_seconds);
    config.interruption_poll = Duration::from_secs(flags.ec2_interruption_poll_seconds.max(1));
    let reporter = Reporter {
        controller: controller::MANAGER.to_owned(),
        instance: Some(identity.clone()),
    };
    let ec2 = ec2_api.map(ebbflow_job::provision::Ec2Provisioner::new);
    let mut ctx = Context::new(
        client.clone(),
        Recorder::new(client, reporter),
        metrics.clone(),
        config,
        CoordinatorClient::new(Duration::from_secs(flags.coordinator_timeout_seconds))
            .context("build coordinator http client")?,
        capacity,
    );
    if let Some(provisioner) = ec2 {
        ctx = ctx.with_ec2(provisioner);
    }
    let ctx = Arc::new(ctx);

    info!("controller starting");
    let controller = controller::run(ctx, shutdown_signal());
    match elector {
        Some((elector, won)) => {
            tokio::select! {
                () = controller => {
                    // shutting down: hand the lease over now, not after it expires
                    metrics.leader.set(0);
                    elector.release().await;
                }
                lost = elector.keep(won) => {
                    metrics.leader.set(0);
                    // Exit so the pod restarts as a standby; never reconcile without the lease.
                    anyhow::bail!("{lost}");
                }
            }
        }
        None => controller.await,
    }
    info!("controller stopped");
    Ok(())
}

/// The EC2 client for `--ec2-region` (aws-sdk-ec2, behind the `ec2` feature).
#[cfg(feature = "ec2")]
async fn connect_ec2(region: &str) -> anyhow::Result<Arc<dyn Ec2Api>> {
    let config = ebbflow_ec2::Ec2Config::new(region.to_owned());
    Ok(Arc::new(ebbflow_ec2::SdkEc2::connect(&config).await))
}

/// Built without the `ec2` feature: `--ec2-region` is refused, naming the build flag.
#[cfg(not(feature = "ec2"))]
async fn connect_ec2(region: &str) -> anyhow::Result<Arc<dyn Ec2Api>> {
    anyhow::bail!(
        "--ec2-region {region}: this ebbflow-operator was built without EC2 support; \
         rebuild with `cargo build --release -p ebbflow-operator --features ec2` \
         (the operator image has it)"
    )
}
