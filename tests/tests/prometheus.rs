//! A real Prometheus (Debian's package, `scripts/setup-prometheus.sh`) scrapes the operator and
//! the runtime on 127.0.0.1, and every Grafana dashboard expression is sent to its query API: each
//! must parse, and each whose metrics have samples must return data.
//!
//! The sources are real: the operator's controller reconciles a TrainingJob on the end-to-end
//! cluster; an elastic runtime run trains the exact app through a join, a notice and a failure,
//! with a bad peer refused by its data plane; and `ebbflow run` trains a small quickstart against
//! the replayed p3 trace (runtime and per-job metrics). Skipped (with a line saying so) unless both
//! `EBBFLOW_PROMETHEUS` (the binary) and `EBBFLOW_KUBECONFIG` are set; `scripts/e2e.sh` sets them.

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use ebbflow_crds::TrainingJob;
use ebbflow_runtime::elastic::{
    ElasticConfig, ElasticEvent, ScheduledEvent, StageThresholds, run_elastic,
};
use ebbflow_runtime::exact::{ExactApp, ExactConfig};
use ebbflow_runtime::metrics::RuntimeMetrics;
use ebbflow_runtime::worker::JobConfig;
use ebbflow_tests::cluster::{
    BoxError, FIELD_MANAGER, client_or_skip, install_crd, poll_until, repo_root,
};
use ebbflow_tests::prometheus::{PROMETHEUS_ENV, Prometheus};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams};
use prometheus::Registry;

/// Serves `registry` at `/metrics` on 127.0.0.1 (port 0); returns the address.
async fn serve_metrics(registry: Registry) -> Result<SocketAddr, BoxError> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let router = ebbflow_runtime::coordinator::metrics_router(registry);
    tokio::spawn(async move { axum_serve(listener, router).await });
    Ok(addr)
}

async fn axum_serve(listener: tokio::net::TcpListener, router: axum::Router) {
    let _ = axum::serve(listener, router).await;
}

/// Trains the exact app through a join, a notice and a failure, and knocks once on its data plane
/// with a wrong secret, so the runtime's metrics all move.
fn drive_runtime(metrics: &RuntimeMetrics) -> Result<(), BoxError> {
    let clocks = 30;
    let app = ExactApp::new(ExactConfig {
        rows: 64,
        width: 2,
        tables: 1,
        shared_rows: 4,
        clocks,
        staleness: 1,
        clock_delay: std::time::Duration::ZERO,
        update_period: 1,
    });
    let config = ElasticConfig {
        job: JobConfig {
            clocks,
            staleness: 1,
            workers: 2,
            partitions: 4,
            ..JobConfig::default()
        },
        thresholds: StageThresholds::default(),
        backup_every: 3,
        backup_interval: None,
        backup_bandwidth: None,
        start: None,
        checkpoint: None,
        reliable: vec!["od-0".into()],
        transient: vec!["s-0".into()],
    };
    let events = [
        ScheduledEvent {
            at_clock: 5,
            event: ElasticEvent::Join {
                names: vec!["s-1".into(), "s-2".into()],
            },
        },
        ScheduledEvent {
            at_clock: 12,
            event: ElasticEvent::Notice {
                names: vec!["s-2".into()],
                lead: Duration::from_secs(60),
            },
        },
        ScheduledEvent {
            at_clock: 20,
            event: ElasticEvent::Fail {
                names: vec!["s-0".into()],
            },
        },
    ];
    let report = run_elastic(&app, &config, &events, metrics)?;
    assert_eq!(report.run.eval.metric("wrong_values"), Some(0.0));
    // Background BackupPS copies were taken (the "BackupPS copies" panel has data).
    let copies = &metrics.backup_copy_images;
    let counted =
        copies.with_label_values(&["delta"]).get() + copies.with_label_values(&["whole"]).get();
    assert!(counted > 0, "no background BackupPS copy was counted");
    Ok(())
}

/// A bad peer on a runtime data-plane server (no hello with the secret): counted as refused.
async fn refuse_a_bad_peer(metrics: &RuntimeMetrics, registry: &Registry) -> Result<(), BoxError> {
    use tokio::io::AsyncWriteExt as _;
    let state = std::sync::Arc::new(ebbflow_runtime::store::ServerState::new(
        &[],
        1,
        &[],
        1,
        ebbflow_runtime::optimizer::Optimizer::Add,
        true,
    ));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let config = std::sync::Arc::new(ebbflow_runtime::server::ServerConfig::with_secret(
        b"right".to_vec(),
    ));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(ebbflow_runtime::server::run(
        listener,
        state,
        config,
        metrics.clone(),
        async move {
            let _ = stopped.await;
        },
    ));
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    stream.write_all(b"not a hello frame at all").await?;
    stream.shutdown().await?;
    poll_until("the bad peer refused", Duration::from_secs(10), || async {
        let text = ebbflow_runtime::metrics::render(registry);
        Ok(text
            .contains("ebbflow_runtime_connections_refused_total{")
            .then_some(()))
    })
    .await?;
    let _ = stop.send(());
    let _ = server.await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboards_query_a_real_prometheus_scraping_the_operator_and_runtime()
-> Result<(), BoxError> {
    let test = "dashboards_query_a_real_prometheus_scraping_the_operator_and_runtime";
    let Some(binary) = std::env::var_os(PROMETHEUS_ENV).filter(|v| !v.is_empty()) else {
        let _ = writeln!(
            std::io::stderr(),
            "skipped {test}: EBBFLOW_PROMETHEUS is unset (scripts/e2e.sh sets it)"
        );
        return Ok(());
    };
    let Some(client) = client_or_skip(test).await? else {
        return Ok(());
    };

    // The operator: its controller reconciles one job on the cluster.
    install_crd(&client).await?;
    let operator_registry = Registry::new();
    let stop_operator = ebbflow_tests::operator::start(&client, &operator_registry).await?;
    let operator_addr = serve_metrics(operator_registry).await?;
    let test_namespace =
        ebbflow_tests::cluster::TestNamespace::create(&client, "e2e-prometheus").await?;
    let namespace = test_namespace.name().to_owned();
    let quickstart = std::fs::read_to_string(repo_root().join("examples/quickstart.yaml"))?;
    let mut job: TrainingJob = serde_yaml::from_str(&quickstart)?;
    job.metadata.namespace = Some(namespace.clone());
    job.spec.transient.min_nodes = 1;
    let jobs: Api<TrainingJob> = Api::namespaced(client.clone(), &namespace);
    jobs.patch(
        "quickstart",
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&job),
    )
    .await?;

    // The runtime: an elastic run and a refused bad peer.
    let runtime_registry = Registry::new();
    let runtime_metrics = RuntimeMetrics::register(&runtime_registry)?;
    refuse_a_bad_peer(&runtime_metrics, &runtime_registry).await?;
    let driven = runtime_metrics.clone();
    tokio::task::spawn_blocking(move || drive_runtime(&driven).map_err(|e| e.to_string()))
        .await??;
    let runtime_addr = serve_metrics(runtime_registry).await?;

    // `ebbflow run` of a small quickstart on the real p3 trace: runtime and per-job metrics.
    let run_registry = Registry::new();
    let dir = tempfile_dir(test)?;
    let manifest = local_run_manifest(&dir)?;
    let run_args = ebbflow_job::run::RunArgs {
        manifest,
        speed: 3600.0,
        out: Some(dir.join("run")),
        metrics_addr: "127.0.0.1:0".parse()?,
        data_dir: None,
        quiet: true,
        in_process: true,
        node_exe: None,
        calibration: None,
        no_recalibrate: false,
        notice_floor: 2.0,
    };
    let registry = run_registry.clone();
    let summary = tokio::task::spawn_blocking(move || {
        ebbflow_job::run::run_on(&run_args, &registry).map_err(|e| e.to_string())
    })
    .await??;
    assert!(summary.clocks > 0);
    let run_addr = serve_metrics(run_registry).await?;

    // Prometheus scraping all three every second; the runtime targets carry the labels the
    // chart's PodMonitor gives them (the pod's namespace, its ebbflow.dev/job as trainingjob).
    let config = format!(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  \
         - job_name: ebbflow-operator\n    static_configs:\n      - targets: ['{operator_addr}']\n  \
         - job_name: ebbflow-runtime\n    static_configs:\n      - targets: ['{runtime_addr}']\n        labels: {{namespace: e2e, trainingjob: quickstart}}\n  \
         - job_name: ebbflow-run\n    static_configs:\n      - targets: ['{run_addr}']\n        labels: {{namespace: e2e, trainingjob: run}}\n"
    );
    let prometheus = Prometheus::start(&binary, &dir, &config)?;

    // Every target up, with at least three scrapes each (rate() needs two samples).
    prometheus
        .wait_for(
            "all targets scraped three times",
            "count_over_time(up[5m]) >= 3 and up == 1",
            3,
            Duration::from_secs(60),
        )
        .await
        .map_err(|e| format!("{e}; prometheus log in {}", dir.display()))?;
    let answered = prometheus.check_dashboards(None).await?;
    assert!(
        answered >= 15,
        "only {answered} dashboard expressions returned data"
    );

    let _ = stop_operator.send(());
    jobs.delete("quickstart", &DeleteParams::default()).await?;
    test_namespace.delete().await?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// The quickstart sized for a few seconds, with the shared p3 trace's absolute path.
fn local_run_manifest(dir: &Path) -> Result<std::path::PathBuf, BoxError> {
    let spot = std::env::var_os("EBBFLOW_SPOT_DATA").map_or_else(
        || repo_root().join("../shared/data/spot"),
        std::path::PathBuf::from,
    );
    let trace = spot.join("aws_p3.2xlarge_availability_price_9az_2023-02-15_to_03-09.csv");
    if !trace.is_file() {
        return Err(format!(
            "{} is missing (set EBBFLOW_SPOT_DATA to the shared spot data directory)",
            trace.display()
        )
        .into());
    }
    let quickstart = std::fs::read_to_string(repo_root().join("examples/quickstart.yaml"))?;
    let text: Vec<String> = quickstart
        .lines()
        .map(|line| {
            let trimmed = line.trim_start();
            let indent = &line[..line.len() - trimmed.len()];
            if trimmed.starts_with("trace: ") {
                format!("{indent}trace: {}", trace.display())
            } else if trimmed.starts_with("iterations: ") {
                format!("{indent}iterations: 300")
            } else if trimmed.starts_with("ratings: ") {
                format!("{indent}ratings: 20000")
            } else {
                line.to_owned()
            }
        })
        .collect();
    let path = dir.join("quickstart.yaml");
    std::fs::write(&path, text.join("\n"))?;
    Ok(path)
}

/// A fresh directory for Prometheus' config and data under the system temp dir.
fn tempfile_dir(test: &str) -> Result<std::path::PathBuf, BoxError> {
    let dir = std::env::temp_dir().join(format!("{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(Path::new(&dir))?;
    Ok(dir)
}
