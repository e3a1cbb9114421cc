//! Notices raised inside a node (issue 4): the EC2 instance metadata service, played by a real
//! `amazon-ec2-metadata-mock` (IMDSv2 only), and SIGTERM to a real `ebbflow-runtime node`
//! process, each reach a real coordinator on 127.0.0.1 as "this node leaves at T".
//!
//! The metadata tests need `EBBFLOW_EC2_METADATA_MOCK` (the mock's binary; `scripts/test.sh`
//! builds it and sets the variable) and say they are skipped without it.

use std::io::Write as _;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ebbflow_runtime::app::EvalReport;
use ebbflow_runtime::coordinator::{Coordinator, CoordinatorConfig, router};
use ebbflow_runtime::notices::{MetadataClient, REBALANCE_LEAD_SECONDS, watch_metadata};
use ebbflow_runtime_api::JoinRequest;

const SECRET: &str = "node-notice-secret";

/// A coordinator that waits for more nodes than will come (notices are recorded while joining).
async fn coordinator() -> (Arc<Coordinator>, String) {
    let coordinator = Coordinator::new(
        CoordinatorConfig {
            expected_nodes: 10,
            partitions: 2,
            clocks: 1,
            staleness: 0,
            secret: SECRET.into(),
            specs: Vec::new(),
            evaluator: Arc::new(|_, _| EvalReport::default()),
            tls: None,
        },
        prometheus::Registry::new(),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let serving = coordinator.clone();
    tokio::spawn(async move { axum::serve(listener, router(serving)).await });
    (coordinator, url)
}

fn join(coordinator: &Coordinator, name: &str) -> u32 {
    coordinator
        .join(JoinRequest {
            name: name.into(),
            data_addr: "127.0.0.1:1".into(),
            workers: 1,
            secret: SECRET.into(),
            reliable: false,
            serves: true,
            job: String::new(),
        })
        .unwrap()
        .node
}

/// Polls until the coordinator holds a notice for `node`; returns its deadline.
async fn notice_for(coordinator: &Coordinator, node: u32, within: Duration) -> u64 {
    let deadline = Instant::now() + within;
    loop {
        if let Some((_, at)) = coordinator
            .status(None)
            .notices
            .iter()
            .find(|(n, _)| *n == node)
        {
            return *at;
        }
        assert!(
            Instant::now() < deadline,
            "no notice for node {node} within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// RFC 3339 UTC for Unix seconds (the mock's `--time` format).
fn rfc3339(unix: u64) -> String {
    let days = (unix / 86_400) as i64;
    let secs = unix % 86_400;
    // Civil date from days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if m <= 2 { y + 1 } else { y };
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        secs / 3600,
        secs % 3600 / 60,
        secs % 60
    )
}

/// The mock on a free port of 127.0.0.1, killed on drop.
struct Mock(Child, String);

impl Drop for Mock {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn mock_or_skip(test: &str, args: &[&str]) -> Option<Mock> {
    let Some(binary) = std::env::var_os("EBBFLOW_EC2_METADATA_MOCK").filter(|v| !v.is_empty())
    else {
        let _ = writeln!(
            std::io::stderr(),
            "skipped {test}: EBBFLOW_EC2_METADATA_MOCK is unset (scripts/test.sh builds the mock)"
        );
        return None;
    };
    // The mock cannot report a port it picked: take one from the kernel and hand it over.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = Command::new(binary)
        .args(["-n", "127.0.0.1", "-p", &port.to_string(), "-I"])
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start amazon-ec2-metadata-mock");
    let endpoint = format!("http://127.0.0.1:{port}");
    // Ready once it accepts connections.
    let ready = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < ready,
            "the metadata mock did not listen on {port}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    Some(Mock(child, endpoint))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spot_interruption_from_the_metadata_service_reaches_the_coordinator() {
    let at = now_unix() + 120;
    let time = rfc3339(at);
    let Some(mock) = mock_or_skip(
        "a_spot_interruption_from_the_metadata_service_reaches_the_coordinator",
        &["spot", "-t", &time],
    ) else {
        return;
    };
    let (coordinator, url) = coordinator().await;
    let coordinator_url = url.clone();
    let node = join(&coordinator, "spot-a");
    let watcher = tokio::spawn(watch_metadata(
        MetadataClient::new(&mock.1).unwrap(),
        ebbflow_runtime::admin::client(None).build().unwrap(),
        url,
        SECRET.into(),
        "spot-a".into(),
        Duration::from_millis(50),
    ));
    let deadline = notice_for(&coordinator, node, Duration::from_secs(20)).await;
    assert_eq!(
        deadline, at,
        "the notice carries the instance-action time {time}"
    );
    // Without the job secret the coordinator refuses a notice and keeps the one it has.
    let refused = ebbflow_runtime::notices::send_notice(
        &ebbflow_runtime::admin::client(None).build().unwrap(),
        &coordinator_url,
        "wrong-secret",
        "spot-a",
        at + 1,
    )
    .await
    .unwrap_err();
    assert!(refused.to_string().contains("401"), "{refused}");
    assert_eq!(
        notice_for(&coordinator, node, Duration::from_secs(1)).await,
        at
    );
    tokio::time::timeout(Duration::from_secs(5), watcher)
        .await
        .expect("the watcher stops after delivering the interruption")
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebalance_recommendation_reaches_the_coordinator_with_its_lead() {
    let Some(mock) = mock_or_skip(
        "a_rebalance_recommendation_reaches_the_coordinator_with_its_lead",
        &[
            "spot",
            "--mock-delay-sec",
            "3600",
            "--rebalance-delay-sec",
            "0",
        ],
    ) else {
        return;
    };
    let (coordinator, url) = coordinator().await;
    let node = join(&coordinator, "spot-b");
    let before = now_unix();
    let watcher = tokio::spawn(watch_metadata(
        MetadataClient::new(&mock.1).unwrap(),
        ebbflow_runtime::admin::client(None).build().unwrap(),
        url,
        SECRET.into(),
        "spot-b".into(),
        Duration::from_millis(50),
    ));
    let deadline = notice_for(&coordinator, node, Duration::from_secs(20)).await;
    watcher.abort();
    assert!(
        deadline + 5 >= before + REBALANCE_LEAD_SECONDS
            && deadline <= now_unix() + REBALANCE_LEAD_SECONDS + 5,
        "rebalance deadline {deadline} is not about {REBALANCE_LEAD_SECONDS} s after {before}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_tells_the_coordinator_the_node_leaves_after_its_grace_period() {
    let (coordinator, url) = coordinator().await;
    let mut node = Command::new(env!("CARGO_BIN_EXE_ebbflow-runtime"))
        .args([
            "node",
            "--coordinator",
            &url,
            "--name",
            "term-a",
            "--workers",
            "1",
            "--grace-seconds",
            "3",
            // as the in-process coordinator (`tls: None`, a plain admin API)
            "--transport-security",
            "none",
        ])
        .env("EBBFLOW_JOB_SECRET", SECRET)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start a node process");
    // Joined once the coordinator lists it.
    let joined = Instant::now() + Duration::from_secs(30);
    let id = loop {
        if let Some(info) = coordinator
            .status(None)
            .nodes
            .iter()
            .find(|n| n.name == "term-a")
        {
            break info.node;
        }
        assert!(Instant::now() < joined, "the node did not join");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let signalled = now_unix();
    let status = Command::new("kill")
        .args(["-TERM", &node.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let deadline = notice_for(&coordinator, id, Duration::from_secs(10)).await;
    assert!(
        (signalled + 2..=signalled + 4).contains(&deadline),
        "deadline {deadline} is not the 3 s grace after {signalled}"
    );
    // The process leaves at the end of its grace period.
    let exited = Instant::now() + Duration::from_secs(15);
    let code = loop {
        if let Some(status) = node.try_wait().unwrap() {
            break status.code();
        }
        assert!(
            Instant::now() < exited,
            "the node did not exit after its grace period"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(code, Some(143));
}
