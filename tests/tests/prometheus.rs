//! A real Prometheus (Debian's package, `scripts/setup-prometheus.sh`) scrapes the operator and
//! the runtime on 127.0.0.1, and every Grafana dashboard expression is sent to its query API: each
//! must parse, and each whose metrics have samples must return data.
//!
//! The sources are real: the operator's controller reconciles a TrainingJob on the end-to-end
//! cluster; an elastic runtime run trains the exact app through a join, a notice and a failure,
//! with a bad peer refused by its data plane; and `ebbflow run` trains a small quickstart against
//! the replayed p3 trace (runtime and per-job metrics). Skipped (with a line saying so) unless both
//! `EBBFLOW_PROMETHEUS` (the binary) and `EBBFLOW_KUBECONFIG` are set; `scripts/e2e.sh` sets them.

use std::collections::BTreeSet;
use std::io::Write as _;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use ebbflow_crds::TrainingJob;
use ebbflow_runtime::elastic::{
    ElasticConfig, ElasticEvent, ScheduledEvent, StageThresholds, run_elastic,
};
use ebbflow_runtime::exact::{ExactApp, ExactConfig};
use ebbflow_runtime::metrics::RuntimeMetrics;
use ebbflow_runtime::worker::JobConfig;
use ebbflow_tests::cluster::{
    BoxError, FIELD_MANAGER, client_or_skip, free_port, install_crd, poll_until, repo_root,
};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams};
use prometheus::Registry;

/// A Prometheus process, killed on drop.
struct PrometheusProcess(Child);

impl Drop for PrometheusProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

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

async fn query(
    http: &reqwest::Client,
    base: &str,
    expr: &str,
) -> Result<serde_json::Value, BoxError> {
    let response = http
        .get(format!(
            "{base}/api/v1/query?query={}",
            percent_encode(expr)
        ))
        .send()
        .await?;
    let status = response.status();
    let body: serde_json::Value = response.json().await?;
    if !status.is_success() || body["status"] != "success" {
        return Err(format!("query {expr:?} failed ({status}): {body}").into());
    }
    Ok(body)
}

/// `text` with everything but unreserved URL characters percent-encoded.
fn percent_encode(text: &str) -> String {
    text.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// Every panel expression, and every variable's `label_values` as a query that must return
/// data, each with where it comes from.
type Expressions = Vec<(String, String)>;

fn dashboard_expressions() -> Result<(Expressions, Expressions), BoxError> {
    let mut expressions = Vec::new();
    let mut variables = Vec::new();
    for name in ["operator.json", "jobs.json", "runtime.json"] {
        let text = std::fs::read_to_string(repo_root().join("dashboards").join(name))?;
        let dashboard: serde_json::Value = serde_json::from_str(&text)?;
        let unvar = |expr: &str| {
            ["$instance", "$namespace", "$trainingjob"]
                .iter()
                .fold(expr.to_owned(), |expr, var| expr.replace(var, ".*"))
        };
        for panel in dashboard["panels"].as_array().into_iter().flatten() {
            for target in panel["targets"].as_array().into_iter().flatten() {
                if let Some(expr) = target["expr"].as_str() {
                    let title = format!("{name}: {}", panel["title"].as_str().unwrap_or("?"));
                    expressions.push((title, unvar(expr)));
                }
            }
        }
        // the variables' `label_values(selector, label)`: a variable whose metric has no
        // series leaves its panels without a value to choose
        for variable in dashboard["templating"]["list"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let Some(inner) = variable["definition"]
                .as_str()
                .and_then(|q| q.strip_prefix("label_values("))
                .and_then(|q| q.strip_suffix(')'))
            else {
                continue;
            };
            let Some((selector, label)) = inner.rsplit_once(',') else {
                continue;
            };
            let title = format!(
                "{name}: variable {}",
                variable["name"].as_str().unwrap_or("?")
            );
            // only series that carry the label give the variable a value
            let label = label.trim();
            let selector = unvar(selector);
            let selector = match selector.strip_suffix('}') {
                Some(open) => format!("{open}, {label}!=\"\"}}"),
                None => format!("{selector}{{{label}!=\"\"}}"),
            };
            variables.push((title, format!("count by ({label}) ({selector})")));
        }
    }
    Ok((expressions, variables))
}

/// Metric families an expression names (histogram suffixes folded).
fn families(expr: &str) -> BTreeSet<String> {
    expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|word| word.starts_with("ebbflow_"))
        .map(|word| {
            ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|suffix| word.strip_suffix(suffix))
                .unwrap_or(word)
                .to_owned()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboards_query_a_real_prometheus_scraping_the_operator_and_runtime()
-> Result<(), BoxError> {
    let test = "dashboards_query_a_real_prometheus_scraping_the_operator_and_runtime";
    let Some(binary) = std::env::var_os("EBBFLOW_PROMETHEUS").filter(|v| !v.is_empty()) else {
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
    let run_args = ebbflow_operator::run::RunArgs {
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
        ebbflow_operator::run::run_on(&run_args, &registry).map_err(|e| e.to_string())
    })
    .await??;
    assert!(summary.clocks > 0);
    let run_addr = serve_metrics(run_registry).await?;

    // Prometheus scraping all three every second; the runtime targets carry the labels the
    // chart's PodMonitor gives them (the pod's namespace, its ebbflow.dev/job as trainingjob).
    let port = free_port()?;
    let config = format!(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  \
         - job_name: ebbflow-operator\n    static_configs:\n      - targets: ['{operator_addr}']\n  \
         - job_name: ebbflow-runtime\n    static_configs:\n      - targets: ['{runtime_addr}']\n        labels: {{namespace: e2e, trainingjob: quickstart}}\n  \
         - job_name: ebbflow-run\n    static_configs:\n      - targets: ['{run_addr}']\n        labels: {{namespace: e2e, trainingjob: run}}\n"
    );
    std::fs::write(dir.join("prometheus.yml"), config)?;
    let log = std::fs::File::create(dir.join("prometheus.log"))?;
    let _prometheus = PrometheusProcess(
        Command::new(&binary)
            .arg(format!(
                "--config.file={}",
                dir.join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()?,
    );
    let base = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()?;

    // Every target up, with at least three scrapes each (rate() needs two samples).
    poll_until(
        "all targets scraped three times",
        Duration::from_secs(60),
        || {
            let http = http.clone();
            let base = base.clone();
            async move {
                let Ok(body) =
                    query(&http, &base, "count_over_time(up[5m]) >= 3 and up == 1").await
                else {
                    return Ok(None);
                };
                let up = body["data"]["result"].as_array().map_or(0, Vec::len);
                Ok((up == 3).then_some(()))
            }
        },
    )
    .await
    .map_err(|e| format!("{e}; prometheus log in {}", dir.display()))?;

    let mut failures = Vec::new();
    let mut answered = 0;
    let (expressions, variables) = dashboard_expressions()?;
    // a variable with no value leaves its dashboard empty: every one must have values
    for (title, expr) in &variables {
        let body = query(&http, &base, expr).await?;
        if body["data"]["result"].as_array().is_none_or(Vec::is_empty) {
            failures.push(format!("{title}: {expr} has no values"));
        }
    }
    for (title, expr) in expressions {
        let body = match query(&http, &base, &expr).await {
            Ok(body) => body,
            Err(error) => {
                failures.push(format!("{title}: {error}"));
                continue;
            }
        };
        let results = body["data"]["result"].as_array().map_or(0, Vec::len);
        // Every family the expression names has series: then the expression must return data.
        let mut all_present = true;
        for family in families(&expr) {
            let present = query(
                &http,
                &base,
                &format!("count({{__name__=~\"{family}(_bucket)?\"}})"),
            )
            .await?;
            all_present &= present["data"]["result"]
                .as_array()
                .is_some_and(|r| !r.is_empty());
        }
        if all_present && results == 0 {
            failures.push(format!("{title}: {expr} returned no data"));
        }
        answered += usize::from(results > 0);
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
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
