//! Heartbeats of an elastic job's node processes, as the coordinator sees them.
//!
//! A node lost with a broken connection is noticed at once; one that hangs with its sockets open
//! (stopped, swapping, a frozen VM) answers nothing and closes nothing. Every node process posts
//! a heartbeat to the coordinator's admin API (`POST /heartbeat`) every `interval`; a node
//! silent for `timeout` is **declared failed**, for good: the coordinator's fleet treats it as a
//! broken connection (the run rolls back to the BackupPS copy) and a heartbeat that arrives
//! later is answered "fenced", on which the node drops its state and exits. Its late pushes
//! cannot land either way: every partition it could reach moved to a new epoch.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use prometheus::{IntCounter, Registry};

/// Heartbeat settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeartbeatConfig {
    /// Time between a node's heartbeats.
    pub interval: Duration,
    /// Silence after which the coordinator declares a node failed (zero: never).
    pub timeout: Duration,
}

impl Default for HeartbeatConfig {
    fn default() -> Self {
        Self {
            interval: Duration::from_millis(500),
            timeout: Duration::from_secs(5),
        }
    }
}

/// What the coordinator makes of one heartbeat.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Beat {
    /// The node is a live member.
    Alive,
    /// The node was declared failed: it must drop its state and exit.
    Fenced,
    /// The node is not watched (it left the job, or never joined).
    Untracked,
}

#[derive(Debug, Clone, Copy)]
enum Liveness {
    Alive { last: Instant },
    Failed,
}

/// The coordinator's record of every watched node's last heartbeat.
#[derive(Debug)]
pub struct Heartbeats {
    timeout: Duration,
    nodes: Mutex<BTreeMap<String, Liveness>>,
    /// Nodes declared failed for lack of heartbeats.
    failures: IntCounter,
}

fn failures_counter() -> IntCounter {
    IntCounter::new(
        "ebbflow_runtime_heartbeat_failures_total",
        "nodes declared failed because their heartbeats stopped",
    )
    .expect("a valid metric name")
}

impl Heartbeats {
    /// Declares nodes failed after `timeout` of silence (zero: never); the failure counter is
    /// registered on `registry`.
    pub fn new(timeout: Duration, registry: &Registry) -> Result<Self, prometheus::Error> {
        let failures = failures_counter();
        registry.register(Box::new(failures.clone()))?;
        Ok(Self::with_counter(timeout, failures))
    }

    /// As [`Heartbeats::new`] without registering the counter (tests, benches).
    pub fn unregistered(timeout: Duration) -> Self {
        Self::with_counter(timeout, failures_counter())
    }

    fn with_counter(timeout: Duration, failures: IntCounter) -> Self {
        Self {
            timeout,
            nodes: Mutex::new(BTreeMap::new()),
            failures,
        }
    }

    /// The silence after which a node is declared failed (zero: never).
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Starts watching `name` (it joined now); a node already watched keeps its record.
    pub fn track(&self, name: &str, now: Instant) {
        self.nodes
            .lock()
            .entry(name.to_owned())
            .or_insert(Liveness::Alive { last: now });
    }

    /// Watches `name` afresh (a reliable node's replacement joined under the name of one that
    /// failed): whatever its predecessor's record, it is alive now.
    pub fn rejoin(&self, name: &str, now: Instant) {
        self.nodes
            .lock()
            .insert(name.to_owned(), Liveness::Alive { last: now });
    }

    /// Records a heartbeat of `name` at `now`.
    pub fn beat(&self, name: &str, now: Instant) -> Beat {
        let mut nodes = self.nodes.lock();
        let Some(liveness) = nodes.get_mut(name) else {
            return Beat::Untracked;
        };
        if self.expired(liveness, now) {
            self.declare(name, liveness);
        }
        match liveness {
            Liveness::Failed => Beat::Fenced,
            Liveness::Alive { last } => {
                *last = now;
                Beat::Alive
            }
        }
    }

    /// Stops watching `name` (it left the job); a node declared failed stays fenced.
    pub fn forget(&self, name: &str) {
        let mut nodes = self.nodes.lock();
        if matches!(nodes.get(name), Some(Liveness::Alive { .. })) {
            nodes.remove(name);
        }
    }

    /// Whether `name` is declared failed at `now` (declaring it if its silence just exceeded
    /// the timeout).
    pub fn has_failed(&self, name: &str, now: Instant) -> bool {
        let mut nodes = self.nodes.lock();
        let Some(liveness) = nodes.get_mut(name) else {
            return false;
        };
        if self.expired(liveness, now) {
            self.declare(name, liveness);
        }
        matches!(liveness, Liveness::Failed)
    }

    /// Declares every node silent for longer than the timeout failed; returns the names
    /// declared now.
    pub fn sweep(&self, now: Instant) -> Vec<String> {
        let mut nodes = self.nodes.lock();
        let mut declared = Vec::new();
        for (name, liveness) in nodes.iter_mut() {
            if self.expired(liveness, now) {
                self.declare(name, liveness);
                declared.push(name.clone());
            }
        }
        declared
    }

    /// Nodes declared failed so far.
    pub fn failures(&self) -> u64 {
        self.failures.get()
    }

    fn expired(&self, liveness: &Liveness, now: Instant) -> bool {
        match liveness {
            Liveness::Alive { last } => {
                !self.timeout.is_zero() && now.saturating_duration_since(*last) > self.timeout
            }
            Liveness::Failed => false,
        }
    }

    fn declare(&self, name: &str, liveness: &mut Liveness) {
        if let Liveness::Alive { last } = *liveness {
            tracing::warn!(
                node = %name,
                silent_ms = last.elapsed().as_millis() as u64,
                "no heartbeat: node declared failed"
            );
        }
        *liveness = Liveness::Failed;
        self.failures.inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn silence_beyond_the_timeout_fails_a_node_for_good() {
        let heartbeats = Heartbeats::unregistered(Duration::from_secs(2));
        let t0 = Instant::now();
        heartbeats.track("a", t0);
        heartbeats.track("b", t0);
        assert_eq!(
            heartbeats.beat("a", t0 + Duration::from_secs(1)),
            Beat::Alive
        );
        assert!(!heartbeats.has_failed("a", t0 + Duration::from_millis(2900)));
        // b has been silent 2.5 s: declared once, by whoever looks first.
        assert_eq!(
            heartbeats.sweep(t0 + Duration::from_millis(2500)),
            vec!["b".to_owned()]
        );
        assert!(heartbeats.sweep(t0 + Duration::from_secs(3)).is_empty());
        assert!(heartbeats.has_failed("b", t0 + Duration::from_secs(3)));
        assert_eq!(heartbeats.failures(), 1);
        // A late heartbeat is fenced, and joining again does not revive it.
        assert_eq!(
            heartbeats.beat("b", t0 + Duration::from_secs(4)),
            Beat::Fenced
        );
        heartbeats.track("b", t0 + Duration::from_secs(4));
        assert!(heartbeats.has_failed("b", t0 + Duration::from_secs(4)));
        // a's own silence is counted from its last beat.
        assert!(heartbeats.has_failed("a", t0 + Duration::from_millis(3100)));
        assert_eq!(heartbeats.failures(), 2);
    }

    #[test]
    fn departed_nodes_are_untracked_but_failed_ones_stay_fenced() {
        let heartbeats = Heartbeats::unregistered(Duration::from_secs(1));
        let t0 = Instant::now();
        heartbeats.track("left", t0);
        heartbeats.track("hung", t0);
        heartbeats.forget("left");
        assert_eq!(heartbeats.beat("left", t0), Beat::Untracked);
        assert!(!heartbeats.has_failed("left", t0 + Duration::from_secs(9)));
        assert!(heartbeats.has_failed("hung", t0 + Duration::from_secs(2)));
        heartbeats.forget("hung");
        assert_eq!(
            heartbeats.beat("hung", t0 + Duration::from_secs(3)),
            Beat::Fenced
        );
        assert_eq!(heartbeats.beat("never", t0), Beat::Untracked);
    }

    #[test]
    fn a_zero_timeout_never_declares() {
        let heartbeats = Heartbeats::unregistered(Duration::ZERO);
        let t0 = Instant::now();
        heartbeats.track("a", t0);
        assert!(!heartbeats.has_failed("a", t0 + Duration::from_secs(3600)));
        assert!(heartbeats.sweep(t0 + Duration::from_secs(3600)).is_empty());
        let registry = Registry::new();
        let registered = Heartbeats::new(Duration::from_secs(1), &registry).unwrap();
        assert_eq!(registered.timeout(), Duration::from_secs(1));
        assert!(
            registry
                .gather()
                .iter()
                .any(|f| f.name() == "ebbflow_runtime_heartbeat_failures_total")
        );
    }
}
