//! Helpers of the tests that drive node processes against a coordinator's admin API: read its
//! status, wait for a condition on it, signal and reap node processes. Shared, by `#[path]`, by
//! `runtime/tests/elastic_processes.rs` (Rust nodes) and `python/tests/processes.rs` (Python
//! nodes).

#![allow(dead_code)]

use std::io::Read as _;
use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

use ebbflow_runtime_api::{JobPhase, StatusResponse};

/// The coordinator's `/status`, or `None` while it does not answer.
pub fn status(url: &str, secret: &str) -> Option<StatusResponse> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        ebbflow_runtime::admin::client_for_url(url, secret.as_bytes())
            .build()
            .unwrap()
            .get(format!("{url}/status"))
            .bearer_auth(secret)
            .send()
            .await
            .ok()?
            .json()
            .await
            .ok()
    })
}

/// Polls the coordinator until `ready` holds for its status (at most `within`); the job ending
/// first fails the test.
pub fn wait_for(
    url: &str,
    secret: &str,
    within: Duration,
    what: &str,
    ready: impl Fn(&StatusResponse) -> bool,
) -> StatusResponse {
    let deadline = Instant::now() + within;
    loop {
        if let Some(status) = status(url, secret) {
            if ready(&status) {
                return status;
            }
            assert!(
                !matches!(status.phase, JobPhase::Done | JobPhase::Failed),
                "the job ended before {what}: {status:?}"
            );
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}: {:?}",
            status(url, secret)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The clock an elastic job has reached.
pub fn clock(status: &StatusResponse) -> u64 {
    status.progress.as_ref().map_or(0, |p| p.clock)
}

/// The transient nodes of an elastic job.
pub fn transient(status: &StatusResponse) -> u32 {
    status.progress.as_ref().map_or(0, |p| p.transient_nodes)
}

/// Sends `signal` (`TERM`, `KILL`, `STOP`, ...) to `child`.
pub fn signal(child: &Child, signal: &str) {
    let status = Command::new("kill")
        .args([&format!("-{signal}"), &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

/// Waits (at most `within`) for `child` to exit; its status and what it wrote to stderr.
pub fn wait_exit(child: &mut Child, within: Duration) -> (ExitStatus, String) {
    let deadline = Instant::now() + within;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut stderr = String::new();
            if let Some(mut pipe) = child.stderr.take() {
                let _ = pipe.read_to_string(&mut stderr);
            }
            return (status, stderr);
        }
        assert!(
            Instant::now() < deadline,
            "node {} did not exit",
            child.id()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}
