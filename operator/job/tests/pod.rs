//! The pods the operator plans train the job: the controller's plan (`controller::plan::plan`)
//! for a job with one reliable and two transient pods is turned into three real `ebbflow`
//! processes on 127.0.0.1, each started with its pod's command and environment (only the network
//! is local: the pod IP is 127.0.0.1, the coordinator Service is the coordinator pod's admin
//! port, and ports are free ones instead of the fixed 7070/7071). The coordinator pod trains the
//! job with its own reliable node and the two transient pods; a SIGTERM to a transient pod is a
//! notice with the pod's grace period, after which the job goes on and still reaches its quality.
//! At the end every pod waits for its SIGTERM (the operator deleting it), the coordinator pod
//! serving the outcome meanwhile.

use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ebbflow_crds::{CapacityType, CapacityTypeLabel, TrainingJob};
use ebbflow_operator::controller::plan::{
    Activity, CapacityDecision, PlanConfig, PlanInput, PoolKey, RUNTIME_COMMAND, TOKEN_KEY, plan,
};
use k8s_openapi::api::core::v1::Pod;

const JOB: &str = r#"
apiVersion: ebbflow.dev/v1alpha1
kind: TrainingJob
metadata:
  name: mf
  namespace: ml
spec:
  app:
    kind: MatrixFactorization
    dataset:
      synthetic: { seed: 3, users: 600, items: 300, ratings: 150000, trueRank: 4, noise: 0.1 }
    hyperparameters: { rank: 8, learningRate: 0.01, regularization: 0.02 }
  consistency: { model: SSP, staleness: 1 }
  stop: { iterations: 1500 }
  reliable: { count: 1 }
  transient: { maxNodes: 2 }
  bidding:
    market: { kind: trace, trace: prices.csv }
  runtime:
    terminationGracePeriodSeconds: 20
"#;

/// A port free now that this test binary has not handed out before: two quick binds of port 0
/// may be given the same port once the first is closed, and a pod whose data and admin ports
/// were the same one could not start (CI saw a spot pod that never joined).
fn free_port() -> u16 {
    static HANDED_OUT: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut handed_out = HANDED_OUT
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    loop {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        if !handed_out.contains(&port) {
            handed_out.push(port);
            return port;
        }
    }
}

/// `pod`'s environment as the kubelet would give it, with the network made local.
/// The values of the job's Secret, by key.
type Secrets = BTreeMap<String, String>;

fn environment(pod: &Pod, secrets: &Secrets, admin: u16) -> BTreeMap<String, String> {
    let container = &pod.spec.as_ref().unwrap().containers[0];
    let mut env = BTreeMap::new();
    for var in container.env.iter().flatten() {
        let value = match (&var.value, &var.value_from) {
            (Some(value), _) => value.clone(),
            (None, Some(from)) => {
                if let Some(field) = &from.field_ref {
                    match field.field_path.as_str() {
                        "metadata.name" => pod.metadata.name.clone().unwrap(),
                        "spec.nodeName" => "node-1".to_owned(),
                        "status.podIP" => "127.0.0.1".to_owned(),
                        other => panic!("unexpected field reference {other}"),
                    }
                } else if let Some(secret) = &from.secret_key_ref {
                    assert_eq!(secret.name, "mf-token");
                    secrets
                        .get(&secret.key)
                        .unwrap_or_else(|| panic!("no key {} in the job's Secret", secret.key))
                        .clone()
                } else {
                    panic!("unexpected env source {from:?}")
                }
            }
            (None, None) => String::new(),
        };
        env.insert(var.name.clone(), value);
    }
    env.insert("EBBFLOW_COORDINATOR".into(), format!("127.0.0.1:{admin}"));
    // Every pod has its own IP in a cluster; here a node pod's admin port (unused) and every
    // pod's metrics port are free ones beside the coordinator pod's admin port.
    let own_admin = if env["EBBFLOW_ROLE"] == "coordinator" {
        admin
    } else {
        free_port()
    };
    env.insert("EBBFLOW_ADMIN_PORT".into(), own_admin.to_string());
    env.insert("EBBFLOW_METRICS_PORT".into(), free_port().to_string());
    // The data plane binds any free port and advertises the one it got.
    env.insert("EBBFLOW_DATA_PORT".into(), "0".into());
    env.insert("RUST_LOG".into(), "warn".into());
    env
}

/// A pod's process; its stdout and stderr go to files (a full pipe would stall it).
struct PodProcess {
    child: Child,
    /// Its `EBBFLOW_METRICS_PORT`.
    metrics_port: u16,
    out: std::path::PathBuf,
    err: std::path::PathBuf,
}

fn start(pod: &Pod, secrets: &Secrets, admin: u16, logs: &std::path::Path) -> PodProcess {
    start_with(pod, secrets, admin, logs, &[])
}

/// As [`start`] with `extra` variables set over the pod's (files, once per process start).
fn start_with(
    pod: &Pod,
    secrets: &Secrets,
    admin: u16,
    logs: &std::path::Path,
    extra: &[(&str, String)],
) -> PodProcess {
    let container = &pod.spec.as_ref().unwrap().containers[0];
    let command = container
        .command
        .clone()
        .expect("the runtime container has a command");
    assert_eq!(command, RUNTIME_COMMAND);
    let name = pod.metadata.name.clone().unwrap();
    let started = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let out = logs.join(format!("{name}-{started}.out"));
    let err = logs.join(format!("{name}-{started}.err"));
    let mut env = environment(pod, secrets, admin);
    for (key, value) in extra {
        env.insert((*key).to_owned(), value.clone());
    }
    let metrics_port = env["EBBFLOW_METRICS_PORT"].parse().unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_ebbflow"))
        .args(&command[1..])
        .envs(env)
        .stdout(Stdio::from(std::fs::File::create(&out).unwrap()))
        .stderr(Stdio::from(std::fs::File::create(&err).unwrap()))
        .spawn()
        .unwrap();
    PodProcess {
        child,
        metrics_port,
        out,
        err,
    }
}

fn wait(pod: &mut PodProcess, within: Duration) -> (std::process::ExitStatus, String, String) {
    let deadline = Instant::now() + within;
    let child = &mut pod.child;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let read = |path: &std::path::Path| std::fs::read_to_string(path).unwrap_or_default();
            return (status, read(&pod.out), read(&pod.err));
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("pod process still running after {within:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Sends SIGTERM to `pod`, as the kubelet does when the pod is deleted.
fn terminate(pod: &mut PodProcess) {
    let pid = pod.child.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
}

/// The plan's pods for `job` (its reliable pods, one transient pod in each of two spot pools) and
/// the values of the job's Secret (its token and the pinned spec).
/// The value of the sample whose line starts with `series` (name, labels and a space).
fn sample(metrics: &str, series: &str) -> Option<f64> {
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(series))
        .and_then(|value| value.trim().parse::<f64>().ok())
}

fn planned_pods(job: &TrainingJob) -> (Vec<Pod>, Secrets) {
    let pools = [
        PoolKey::new("c5.xlarge", "us-east-1a", CapacityType::Spot),
        PoolKey::new("m5.large", "us-east-1b", CapacityType::Spot),
    ];
    let decision = CapacityDecision {
        transient: pools.iter().map(|p| (p.clone(), 1)).collect(),
        reason: "Test".into(),
        ..CapacityDecision::default()
    };
    let config = PlanConfig {
        default_image: "ebbflow-runtime:test".into(),
        capacity_label: CapacityTypeLabel::default().resolved(),
        network_policy: None,
    };
    let planned = plan(&PlanInput {
        job,
        pods: &[],
        existing_token: None,
        existing_spec: None,
        fresh_token: "pod-test-token",
        notices: &[],
        decision: &decision,
        activity: Activity::Run,
        config: &config,
    });
    let secrets: Secrets = planned
        .secret
        .data
        .as_ref()
        .unwrap()
        .iter()
        .map(|(key, value)| (key.clone(), String::from_utf8(value.0.clone()).unwrap()))
        .collect();
    assert!(secrets.contains_key(TOKEN_KEY));
    let names: Vec<String> = planned
        .create
        .iter()
        .map(|p| p.metadata.name.clone().unwrap())
        .collect();
    let reliable = (0..job.spec.reliable.count).map(|i| format!("mf-r-{i}"));
    let expected: Vec<String> = reliable.chain(["mf-t-0".into(), "mf-t-1".into()]).collect();
    assert_eq!(names, expected);
    (planned.create, secrets)
}

/// The coordinator pod's admin API on 127.0.0.1.
struct Admin {
    rt: tokio::runtime::Runtime,
    http: reqwest::Client,
    /// For the admin API, served over TLS keyed by the job's token (the job's default).
    admin_http: reqwest::Client,
    port: u16,
    /// The job's token: `/status` is for the job only.
    token: String,
}

impl Admin {
    fn new(port: u16, secrets: &Secrets) -> Self {
        Self {
            token: secrets[TOKEN_KEY].clone(),
            rt: tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap(),
            http: ebbflow_runtime::admin::client(None).build().unwrap(),
            admin_http: ebbflow_runtime::admin::client(Some(&ebbflow_runtime::tls::JobTls::new(
                secrets[TOKEN_KEY].as_bytes(),
            )))
            .build()
            .unwrap(),
            port,
        }
    }

    /// The text `GET http://127.0.0.1:{port}{path}` answers.
    fn text(&self, port: u16, path: &str) -> String {
        self.rt
            .block_on(async {
                self.http
                    .get(format!("http://127.0.0.1:{port}{path}"))
                    .send()
                    .await?
                    .text()
                    .await
            })
            .unwrap_or_else(|e| panic!("GET :{port}{path}: {e}"))
    }

    /// Polls `/status` until `ready` holds for it.
    fn wait(
        &self,
        what: &str,
        within: Duration,
        ready: &dyn Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        let deadline = Instant::now() + within;
        let mut last = None;
        loop {
            let url = format!("https://127.0.0.1:{}/status", self.port);
            let answer = self.rt.block_on(async {
                self.admin_http
                    .get(url)
                    .bearer_auth(&self.token)
                    .send()
                    .await?
                    .json::<serde_json::Value>()
                    .await
            });
            if let Ok(response) = answer {
                if ready(&response) {
                    return response;
                }
                last = Some(response);
            }
            assert!(Instant::now() < deadline, "waiting for {what}: {last:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

fn transient(s: &serde_json::Value) -> u64 {
    s["progress"]["transient_nodes"].as_u64().unwrap_or(0)
}

fn clock(s: &serde_json::Value) -> u64 {
    s["progress"]["clock"].as_u64().unwrap_or(0)
}

fn reliable(s: &serde_json::Value) -> u64 {
    s["progress"]["reliable_nodes"].as_u64().unwrap_or(0)
}

fn rollbacks(s: &serde_json::Value) -> u64 {
    s["progress"]["rollbacks"].as_u64().unwrap_or(0)
}

/// A job with two reliable pods: the second one's process dies (OOMKilled, a crash) and the
/// operator recreates the pod under its name, as it does every failed node pod. The coordinator
/// rolls back, trains on without it, and switches the new process in under the same name; the
/// job ends with its quality.
#[test]
fn a_crashed_reliable_pod_recreated_under_its_name_rejoins_the_job() {
    let mut job: TrainingJob = serde_yaml::from_str(JOB).unwrap();
    job.spec.reliable.count = 2;
    let (pods, token) = planned_pods(&job);
    let logs = tempfile::tempdir().unwrap();
    let admin = free_port();
    let admin_api = Admin::new(admin, &token);
    let status = |what: &str, ready: &dyn Fn(&serde_json::Value) -> bool| {
        admin_api.wait(what, Duration::from_secs(60), ready)
    };
    // The spot pods join before the second reliable one, so training (which waits for the
    // reliable tier only) starts with all four: a job that finished before a slow process
    // joined (a loaded CI machine) failed this test.
    let joined_by_name = |s: &serde_json::Value, name: &str| {
        s["nodes"]
            .as_array()
            .is_some_and(|nodes| nodes.iter().any(|n| n["name"] == name))
    };
    let mut processes: Vec<PodProcess> = vec![start(&pods[0], &token, admin, logs.path())];
    processes.extend(
        pods[2..]
            .iter()
            .map(|pod| start(pod, &token, admin, logs.path())),
    );
    status("the spot pods joined", &|s| {
        joined_by_name(s, "mf-t-0") && joined_by_name(s, "mf-t-1")
    });
    processes.insert(1, start(&pods[1], &token, admin, logs.path()));
    let joined = status("every pod", &|s| reliable(s) == 2 && transient(s) == 2);
    let at = clock(&joined);
    status("training", &|s| clock(s) >= at + 10);

    // mf-r-1 dies without notice.
    let mut crashed = processes.remove(1);
    crashed.child.kill().unwrap();
    crashed.child.wait().unwrap();
    let lost = status("the rollback without mf-r-1", &|s| {
        rollbacks(s) == 1 && reliable(s) == 1
    });
    // The recreated pod: the same name and spec, a new process.
    processes.push(start(&pods[1], &token, admin, logs.path()));
    let back = status("mf-r-1 back in the layout", &|s| {
        reliable(s) == 2 && clock(s) > clock(&lost)
    });
    let at = clock(&back);
    status("training with it", &|s| clock(s) >= at + 10);

    let done = admin_api.wait("the job's end", Duration::from_secs(240), &|s| {
        s["phase"] == "done"
    });
    assert_eq!(rollbacks(&done), 1, "{done}");
    for pod in &mut processes {
        terminate(pod);
    }
    let (exit, stdout, stderr) = wait(&mut processes[0], Duration::from_secs(30));
    assert!(exit.success(), "coordinator pod: {exit:?}\n{stderr}");
    let report: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    println!("coordinator pod report: {report}");
    assert_eq!(report["events"]["fail"], 1, "{report}");
    assert!(report["events"]["join"].as_u64() >= Some(1), "{report}");
    assert_eq!(report["clocks"], 1500, "{report}");
    let rmse = report["quality"]["rmse"].as_f64().unwrap();
    assert!(rmse < 0.3, "{report}");
    for pod in &mut processes[1..] {
        let (exit, _, stderr) = wait(pod, Duration::from_secs(30));
        assert!(exit.success(), "{exit:?} {stderr}");
    }
}

#[test]
fn the_planned_pods_train_the_job_and_a_terminated_spot_pod_leaves_with_notice() {
    let job: TrainingJob = serde_yaml::from_str(JOB).unwrap();
    let (pods, token) = planned_pods(&job);
    let admin = free_port();
    let logs = tempfile::tempdir().unwrap();
    let mut coordinator = start(&pods[0], &token, admin, logs.path());
    let mut spot: Vec<PodProcess> = pods[1..]
        .iter()
        .map(|pod| start(pod, &token, admin, logs.path()))
        .collect();

    // Once both spot pods have joined and training moved on, one is terminated: a notice.
    let admin_api = Admin::new(admin, &token);
    let status = |what: &str, ready: &dyn Fn(&serde_json::Value) -> bool| {
        admin_api.wait(what, Duration::from_secs(60), ready)
    };
    let joined = status("both spot pods", &|s| transient(s) == 2);
    let at = clock(&joined);
    status("training after the joins", &|s| clock(s) >= at + 10);
    // A node pod serves its own metrics on its metrics port (what the chart's PodMonitor scrapes).
    let metrics = admin_api.text(spot[0].metrics_port, "/metrics");
    let iterations = sample(&metrics, "ebbflow_runtime_iterations_total ");
    assert!(
        iterations.is_some_and(|n| n > 0.0),
        "a spot pod's /metrics: {metrics}"
    );
    // The coordinator pod's own reliable node: its metrics beside the coordinator's, on the
    // coordinator pod's metrics port, one family each.
    let metrics = admin_api.text(coordinator.metrics_port, "/metrics");
    let iterations = sample(
        &metrics,
        "ebbflow_runtime_iterations_total{process=\"node\"} ",
    );
    assert!(
        iterations.is_some_and(|n| n > 0.0),
        "the coordinator pod's /metrics: {metrics}"
    );
    assert_eq!(
        metrics
            .lines()
            .filter(|line| line.starts_with("# TYPE ebbflow_runtime_iterations_total "))
            .count(),
        1,
        "{metrics}"
    );
    assert!(
        metrics.contains("ebbflow_runtime_stage "),
        "the coordinator's own: {metrics}"
    );
    let mut victim = spot.pop().unwrap();
    terminate(&mut victim);
    let (exit, _, stderr) = wait(&mut victim, Duration::from_secs(30));
    assert!(
        exit.success(),
        "the terminated pod was let go before its grace: {exit:?} {stderr}"
    );

    // Training ends; the coordinator keeps serving the outcome, and every pod waits, until the
    // operator deletes the pods (SIGTERM).
    let done = admin_api.wait("the job's end", Duration::from_secs(240), &|s| {
        s["phase"] == "done"
    });
    assert!(done["result"]["loss"].is_number(), "{done}");
    for pod in std::iter::once(&mut coordinator).chain(spot.iter_mut()) {
        assert!(
            pod.child.try_wait().unwrap().is_none(),
            "a pod exited before its SIGTERM"
        );
        terminate(pod);
    }
    let (exit, stdout, stderr) = wait(&mut coordinator, Duration::from_secs(30));
    assert!(exit.success(), "coordinator pod: {exit:?}\n{stderr}");
    let report: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap_or_else(|e| {
        panic!("the coordinator pod prints its report as JSON ({e}): {stdout:?}\n{stderr}")
    });
    println!("coordinator pod report: {report}");
    assert_eq!(report["clocks"], 1500, "{report}");
    assert_eq!(report["events"]["notice"], 1, "{report}");
    let rmse = report["quality"]["rmse"].as_f64().unwrap();
    assert!(rmse < 0.3, "{report}");
    for child in &mut spot {
        let (exit, _, stderr) = wait(child, Duration::from_secs(30));
        assert!(
            exit.success(),
            "spot pod released at the end, then terminated: {exit:?} {stderr}"
        );
    }
}

/// Starts the coordinator pod (with `extra` in its environment) and the spot pods of `pods`, and
/// waits until both spot pods joined: the admin API, the coordinator pod, the spot pods.
fn start_joined(
    pods: &[Pod],
    token: &Secrets,
    logs: &std::path::Path,
    extra: &[(&str, String)],
) -> (Admin, PodProcess, Vec<PodProcess>) {
    let admin = free_port();
    let admin_api = Admin::new(admin, &token);
    let coordinator = start_with(&pods[0], token, admin, logs, extra);
    let spot: Vec<PodProcess> = pods[1..]
        .iter()
        .map(|pod| start(pod, token, admin, logs))
        .collect();
    admin_api.wait("both spot pods", Duration::from_secs(60), &|s| {
        transient(s) == 2
    });
    (admin_api, coordinator, spot)
}

/// JOB running longer with `spec.runtime.checkpoint` every `interval`: the job, its planned pods
/// and token, and the claim's mount (a directory of the test's).
fn checkpointed_job(interval: &str) -> (TrainingJob, Vec<Pod>, Secrets, Claim) {
    let mut job: TrainingJob = serde_yaml::from_str(JOB).unwrap();
    job.metadata.uid = Some("6f1c1a52-0d0c-4f43-9a41-3f1a9b0f0c11".into());
    job.spec.stop.iterations = Some(6000);
    job.spec.runtime.checkpoint = Some(ebbflow_crds::CheckpointSpec {
        claim_name: "mf-checkpoints".into(),
        interval: Some(ebbflow_crds::DurationString::new(interval).unwrap()),
    });
    let (pods, token) = planned_pods(&job);
    let dir = tempfile::tempdir().unwrap();
    // The plan's path is /checkpoint/<uid>.ckpt; the test's claim holds the same file name.
    let planned_path = pods[0].spec.as_ref().unwrap().containers[0]
        .env
        .iter()
        .flatten()
        .find(|e| e.name == "EBBFLOW_CHECKPOINT")
        .and_then(|e| e.value.clone())
        .expect("the coordinator pod has a checkpoint");
    let file = dir.path().join(
        std::path::Path::new(&planned_path)
            .file_name()
            .expect("a file name"),
    );
    (job, pods, token, Claim { _dir: dir, file })
}

/// A checkpoint claim's mount in a test.
struct Claim {
    _dir: tempfile::TempDir,
    file: std::path::PathBuf,
}

impl Claim {
    /// The coordinator pod's environment pointing at the file.
    fn env(&self) -> [(&'static str, String); 1] {
        [("EBBFLOW_CHECKPOINT", self.file.display().to_string())]
    }

    /// The clock of the checkpoint on disk.
    fn clock(&self) -> Option<u64> {
        let bytes = std::fs::read(&self.file).ok()?;
        ebbflow_runtime::checkpoint::Checkpoint::decode(&bytes, &self.file)
            .ok()
            .map(|c| c.clock)
    }
}

/// A coordinator pod told to stop (SIGTERM, a node drain) checkpoints its next consistent copy at
/// once, however long its checkpoint interval: a replacement loses the clocks since that copy,
/// not up to an interval of them.
#[test]
fn a_terminated_coordinator_pod_checkpoints_at_once() {
    // An hour between checkpoints: only the first copy is written in the run's own course.
    let (_, pods, token, claim) = checkpointed_job("1h");
    let logs = tempfile::tempdir().unwrap();
    let (admin_api, mut coordinator, mut spot) =
        start_joined(&pods, &token, logs.path(), &claim.env());
    let at = clock(&admin_api.wait("clock 300", Duration::from_secs(120), &|s| clock(s) >= 300));
    let before = claim.clock().expect("the first copy is checkpointed");
    assert!(before < 300, "checkpointed at {before} within the hour");
    terminate(&mut coordinator);
    let deadline = Instant::now() + Duration::from_secs(30);
    while claim.clock().is_none_or(|c| c < at) {
        assert!(
            Instant::now() < deadline,
            "no checkpoint at clock {at} or later 30 s after SIGTERM (on disk: {:?})",
            claim.clock()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let after = claim.clock().unwrap();
    println!("SIGTERM at clock {at}: checkpoint {before} → {after} (interval 1 h)");
    for pod in std::iter::once(&mut coordinator).chain(spot.iter_mut()) {
        let _ = pod.child.kill();
        let _ = pod.child.wait();
    }
}

/// The coordinator pod lost mid-run (SIGKILL, with the spot pods: a drained node) and replaced
/// by a pod with the same spec resumes from the checkpoint on its claim, not from clock 0, and
/// the job still reaches its quality.
#[test]
fn a_replaced_coordinator_pod_resumes_from_its_checkpoint() {
    // The job of JOB running longer, its coordinator checkpointing every second.
    let (job, pods, token, claim) = checkpointed_job("1s");
    let logs = tempfile::tempdir().unwrap();
    let extra = claim.env();
    let read_clock = || claim.clock();

    let (admin_api, coordinator, spot) = start_joined(&pods, &token, logs.path(), &extra);
    let admin = admin_api.port;
    let (mut coordinator, mut spot) = (coordinator, spot);
    let mut at = clock(&admin_api.wait("training", Duration::from_secs(60), &|s| clock(s) > 0));
    while read_clock().is_none_or(|c| c < 500) {
        at += 100;
        assert!(
            at < 5000,
            "no checkpoint at clock 500 or later by clock {at}"
        );
        admin_api.wait(&format!("clock {at}"), Duration::from_secs(60), &|s| {
            clock(s) >= at
        });
    }
    for pod in std::iter::once(&mut coordinator).chain(spot.iter_mut()) {
        let _ = pod.child.kill();
        let _ = pod.child.wait();
    }
    let saved = read_clock().expect("a checkpoint");

    // The operator replaces the failed pods; the new coordinator pod starts from the checkpoint.
    // The job was suspended and edited meanwhile in fields that do not shape the training state
    // (a stop goal, the budget, the grace period), so the new pods carry another spec.
    let mut edited = job.clone();
    edited.spec.stop.target_loss = Some(0.01);
    edited.spec.bidding.budget_total = Some(40.0);
    edited.spec.runtime.termination_grace_period_seconds = Some(90);
    let (pods, token) = planned_pods(&edited);
    let mut coordinator = start_with(&pods[0], &token, admin, logs.path(), &extra);
    let mut spot: Vec<PodProcess> = pods[1..]
        .iter()
        .map(|pod| start(pod, &token, admin, logs.path()))
        .collect();
    let resumed = admin_api.wait("training again", Duration::from_secs(60), &|s| {
        s["phase"] == "training" && s["progress"].is_object()
    });
    assert!(
        clock(&resumed) >= saved,
        "resumed at clock {} below the checkpoint's {saved}",
        clock(&resumed)
    );
    let done = admin_api.wait("the job's end", Duration::from_secs(240), &|s| {
        s["phase"] == "done"
    });
    for pod in std::iter::once(&mut coordinator).chain(spot.iter_mut()) {
        terminate(pod);
    }
    let (exit, stdout, stderr) = wait(&mut coordinator, Duration::from_secs(30));
    assert!(exit.success(), "coordinator pod: {exit:?}\n{stderr}");
    let report: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    let rmse = report["quality"]["rmse"].as_f64().unwrap();
    println!(
        "checkpoint at clock {saved} of 6000; resumed at {}; final rmse {rmse:.4}; {}",
        clock(&resumed),
        done["result"]
    );
    assert!(rmse < 0.3, "{report}");
    for pod in &mut spot {
        let (exit, _, stderr) = wait(pod, Duration::from_secs(30));
        assert!(exit.success(), "{exit:?} {stderr}");
    }
}
