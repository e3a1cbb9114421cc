//! `ebbflow-scale-bench`: the operator at scale on the end-to-end cluster (issue 7's benchmark).
//!
//! Creates `--jobs` TrainingJobs of `--pods` pods each (1 on-demand + the rest spot) against the
//! kwok nodes of the cluster in `EBBFLOW_KUBECONFIG`, runs the real `ebbflow-operator` binary as
//! its own process (what users run; its memory and CPU are then its own, not the bench's), and
//! prints: time until every pod is scheduled, reconcile latency p50/p99 (the operator's histogram,
//! scraped from its /metrics), the operator process's peak RSS and CPU seconds, and, after
//! tainting `--interrupt` spot nodes the AWS Node Termination Handler way, the time from taint to
//! the coordinator notice (p50/p99). Every job's coordinator URL points at one recorder on
//! 127.0.0.1 that timestamps notices (it measures the operator; the real coordinator's handling
//! is tested elsewhere).
//!
//! `scripts/bench-scale.sh` brings up the cluster with enough nodes and runs this.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Json;
use axum::extract::State;
use axum::routing::{get, post};
use clap::Parser;
use ebbflow_crds::TrainingJob;
use ebbflow_operator::controller;
use ebbflow_operator::notices::NTH_SPOT_ITN_TAINT;
use ebbflow_runtime_api::{Ack, JobPhase, NoticeRequest, NoticeResponse, StatusResponse};
use ebbflow_tests::cluster::{
    BoxError, FIELD_MANAGER, client_or_skip, free_port, install_crd, poll_until, repo_root,
};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use parking_lot::Mutex;
use serde_json::json;

#[derive(Parser, Debug)]
struct Args {
    /// TrainingJobs to create.
    #[arg(long, default_value_t = 50)]
    jobs: u32,
    /// Pods per job (one on-demand, the rest spot).
    #[arg(long, default_value_t = 20)]
    pods: u32,
    /// Spot nodes to taint for the notice measurement.
    #[arg(long, default_value_t = 20)]
    interrupt: usize,
    /// The operator binary (default: `ebbflow-operator` beside this executable).
    #[arg(long)]
    operator: Option<std::path::PathBuf>,
    /// The operator's log file (default: a temporary file, printed at the end).
    #[arg(long)]
    operator_log: Option<std::path::PathBuf>,
}

/// The operator process; killed when dropped.
struct Operator {
    child: std::process::Child,
    metrics: String,
}

impl Drop for Operator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts the operator binary against the cluster in `EBBFLOW_KUBECONFIG`, every job's
/// coordinator at `coordinator_url`, with the capacity planner that holds the spec's counts (the
/// bench measures reconciling, not bidding), and waits until it serves /readyz.
async fn start_operator(
    args: &Args,
    coordinator_url: &str,
    log: &std::path::Path,
) -> Result<Operator, BoxError> {
    let binary = match &args.operator {
        Some(path) => path.clone(),
        None => std::env::current_exe()?.with_file_name("ebbflow-operator"),
    };
    let kubeconfig = std::env::var("EBBFLOW_KUBECONFIG")?;
    let port = free_port()?;
    let child = std::process::Command::new(&binary)
        .env("KUBECONFIG", &kubeconfig)
        .env("RUST_LOG", "warn")
        .args(["--metrics-addr", &format!("127.0.0.1:{port}")])
        .args(["--coordinator-url", coordinator_url])
        .args(["--capacity-planner", "spec"])
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(log)?)
        .spawn()
        .map_err(|e| format!("start {}: {e}", binary.display()))?;
    let operator = Operator {
        child,
        metrics: format!("http://127.0.0.1:{port}"),
    };
    let http = ebbflow_runtime::admin::client(None).build()?;
    let ready = format!("{}/readyz", operator.metrics);
    poll_until("operator ready", Duration::from_secs(60), || {
        let (http, ready) = (http.clone(), ready.clone());
        async move {
            Ok(http
                .get(&ready)
                .send()
                .await
                .is_ok_and(|r| r.status().is_success())
                .then_some(()))
        }
    })
    .await
    .map_err(|e| format!("{e}; operator log in {}", log.display()))?;
    Ok(operator)
}

/// Notices received by pod name, with when they arrived.
type Received = Arc<Mutex<BTreeMap<String, Instant>>>;

async fn recorder(received: Received) -> Result<String, BoxError> {
    let app = axum::Router::new()
        .route(
            "/status",
            get(|| async {
                Json(StatusResponse {
                    phase: JobPhase::Joining,
                    expected_nodes: 0,
                    nodes: Vec::new(),
                    partitions: Vec::new(),
                    notices: Vec::new(),
                    result: None,
                    error: None,
                    failure_reason: None,
                    progress: None,
                })
            }),
        )
        .route(
            "/notice",
            post(
                |State(received): State<Received>, Json(notice): Json<NoticeRequest>| async move {
                    let new = received
                        .lock()
                        .insert(notice.name, Instant::now())
                        .is_none();
                    Json(NoticeResponse { node: 0, new })
                },
            ),
        )
        .route("/stop", post(|| async { Json(Ack { ok: true }) }))
        .with_state(received);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(url)
}

/// (peak RSS bytes, CPU seconds) of process `pid`.
fn usage(pid: u32) -> (u64, f64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let peak_kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0);
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or(Vec::new(), |(_, rest)| rest.split_whitespace().collect());
    // utime and stime are fields 14 and 15 (1-based), i.e. 11 and 12 after the command name.
    let ticks: f64 = [11, 12]
        .iter()
        .filter_map(|&i| fields.get(i)?.parse::<f64>().ok())
        .sum();
    (peak_kib * 1024, ticks / 100.0)
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

/// p-quantile of a Prometheus histogram from its rendered text.
fn histogram_quantile(text: &str, name: &str, q: f64) -> f64 {
    let mut buckets: Vec<(f64, f64)> = text
        .lines()
        .filter_map(|line| {
            let rest = line.strip_prefix(&format!("{name}_bucket{{le=\""))?;
            let (le, value) = rest.split_once("\"} ")?;
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().ok()?
            };
            Some((le, value.trim().parse().ok()?))
        })
        .collect();
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    let total = buckets.last().map_or(0.0, |b| b.1);
    let wanted = total * q;
    buckets
        .iter()
        .find(|(_, count)| *count >= wanted)
        .map_or(f64::NAN, |(le, _)| *le)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), BoxError> {
    let args = Args::parse();
    let Some(client) = client_or_skip("ebbflow-scale-bench").await? else {
        return Err("set EBBFLOW_KUBECONFIG (scripts/bench-scale.sh does)".into());
    };
    install_crd(&client).await?;
    let received: Received = Arc::default();
    let url = recorder(received.clone()).await?;
    let log = match &args.operator_log {
        Some(path) => path.clone(),
        None => {
            std::env::temp_dir().join(format!("ebbflow-scale-operator-{}.log", std::process::id()))
        }
    };
    let operator = start_operator(&args, &url, &log).await?;

    let namespace = "scale-bench";
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let mut ns = Namespace::default();
    ns.metadata.name = Some(namespace.into());
    let _ = namespaces.create(&PostParams::default(), &ns).await;
    let quickstart = std::fs::read_to_string(repo_root().join("examples/quickstart.yaml"))?;
    let template: TrainingJob = serde_yaml::from_str(&quickstart)?;
    let jobs: Api<TrainingJob> = Api::namespaced(client.clone(), namespace);
    let started = Instant::now();
    for i in 0..args.jobs {
        let mut job = template.clone();
        job.metadata.name = Some(format!("job-{i}"));
        job.metadata.namespace = Some(namespace.into());
        job.spec.transient.min_nodes = args.pods - 1;
        job.spec.transient.max_nodes = args.pods - 1;
        // The quickstart decides every 10 s for its accelerated demo; a fleet runs at the
        // product's default.
        job.spec.bidding.decision_interval =
            ebbflow_crds::DurationString::new(ebbflow_crds::DEFAULT_DECISION_INTERVAL)?;
        jobs.patch(
            &format!("job-{i}"),
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&job),
        )
        .await?;
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let want = (args.jobs * args.pods) as usize;
    // Light polls: pod metadata for the count, and only the unscheduled pods in full.
    let unscheduled = ListParams::default().fields("spec.nodeName=");
    let scheduled_after = loop {
        let created = pods
            .list_metadata(&ListParams::default())
            .await?
            .items
            .len();
        let pending = pods.list(&unscheduled).await?.items.len();
        if created >= want && pending == 0 {
            break started.elapsed();
        }
        if started.elapsed() > Duration::from_secs(1800) {
            return Err(format!(
                "after 30 min: {created} of {want} pods created, {pending} unscheduled"
            )
            .into());
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    };

    // Interruptions: taint spot nodes that run job pods, the NTH way.
    let mut pods_on: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut page = ListParams::default().limit(500);
    loop {
        let list = pods.list(&page).await?;
        for pod in &list.items {
            let is_spot = pod
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(controller::plan::TIER_LABEL))
                .is_some_and(|t| t == "transient");
            if let (true, Some(node)) =
                (is_spot, pod.spec.as_ref().and_then(|s| s.node_name.clone()))
            {
                pods_on
                    .entry(node)
                    .or_default()
                    .push(pod.metadata.name.clone().unwrap_or_default());
            }
        }
        match list.metadata.continue_.filter(|token| !token.is_empty()) {
            Some(token) => page = page.continue_token(&token),
            None => break,
        }
    }
    let nodes: Api<Node> = Api::all(client.clone());
    // Per pod: when the taint was sent, and when the API server had committed it (its answer).
    let mut tainted_at: BTreeMap<String, (Instant, Instant)> = BTreeMap::new();
    for (node, names) in pods_on.iter().take(args.interrupt) {
        let sent = Instant::now();
        ebbflow_tests::cluster::set_interruption_taint(&nodes, node, Some(NTH_SPOT_ITN_TAINT))
            .await?;
        let committed = Instant::now();
        for name in names {
            tainted_at.insert(name.clone(), (sent, committed));
        }
    }
    let deadline = Instant::now() + Duration::from_secs(300);
    while received
        .lock()
        .keys()
        .filter(|k| tainted_at.contains_key(*k))
        .count()
        < tainted_at.len()
        && Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Lags from the taint's request and from its commit (a notice may even beat the API
    // server's answer to the tainting client: 0 then).
    let (mut lags, mut committed_lags): (Vec<f64>, Vec<f64>) = received
        .lock()
        .iter()
        .filter_map(|(name, at)| {
            let (sent, committed) = tainted_at.get(name)?;
            Some((
                at.saturating_duration_since(*sent).as_secs_f64(),
                at.saturating_duration_since(*committed).as_secs_f64(),
            ))
        })
        .unzip();
    lags.sort_by(f64::total_cmp);
    committed_lags.sort_by(f64::total_cmp);
    let text = reqwest::get(format!("{}/metrics", operator.metrics))
        .await?
        .text()
        .await?;
    let (rss, cpu) = usage(operator.child.id());
    println!("| figure | value |");
    println!("|---|---|");
    println!(
        "| TrainingJobs × pods | {} × {} = {want} |",
        args.jobs, args.pods
    );
    println!(
        "| all pods scheduled after | {:.1} s |",
        scheduled_after.as_secs_f64()
    );
    println!(
        "| reconcile latency p50 / p99 (histogram bucket bound) | {} / {} s |",
        histogram_quantile(&text, "ebbflow_operator_reconcile_duration_seconds", 0.5),
        histogram_quantile(&text, "ebbflow_operator_reconcile_duration_seconds", 0.99)
    );
    println!(
        "| notices received / expected | {} / {} |",
        lags.len(),
        tainted_at.len()
    );
    println!(
        "| taint committed → coordinator notice p50 / p99 | {:.3} / {:.3} s |",
        percentile(&committed_lags, 0.5),
        percentile(&committed_lags, 0.99)
    );
    println!(
        "| taint request sent → coordinator notice p50 / p99 | {:.3} / {:.3} s |",
        percentile(&lags, 0.5),
        percentile(&lags, 0.99)
    );
    println!(
        "| operator process peak RSS | {:.1} MiB |",
        rss as f64 / (1024.0 * 1024.0)
    );
    println!("| operator process CPU seconds | {cpu:.1} s |");
    eprintln!("operator log: {}", log.display());

    for (node, _) in pods_on.iter().take(args.interrupt) {
        let current = nodes.get(node).await?;
        let taints: Vec<_> = current
            .spec
            .and_then(|s| s.taints)
            .unwrap_or_default()
            .into_iter()
            .filter(|t| t.key != NTH_SPOT_ITN_TAINT)
            .collect();
        nodes
            .patch(
                node,
                &PatchParams::default(),
                &Patch::Merge(json!({ "spec": { "taints": taints } })),
            )
            .await?;
    }
    let _ = jobs
        .delete_collection(&DeleteParams::default(), &ListParams::default())
        .await;
    drop(operator);
    Ok(())
}
