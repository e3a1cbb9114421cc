//! A per-node bandwidth limit on the data plane: a token bucket on every byte a node's
//! data-plane server reads and writes, one bucket per direction (a full-duplex NIC).
//!
//! It stands in for the network of a real cluster when every node runs on one machine: the
//! stage-1 bottleneck of seed 003 §4.5.3 (every worker talking to the few ParamServs on the
//! reliable tier) only shows when a node's bandwidth is finite. A server charges every frame it
//! reads to its node's inbound bucket and every frame it writes to its outbound bucket, so the
//! limit also covers a node's BackupPS copies and partition hand-offs. When the server also knows
//! where the worker on the other end runs ([`WorkerPlacement`], the in-process fleet), the
//! exchange is charged to both nodes — or to neither when worker and server share a node, as
//! traffic that never leaves the machine. A node process knows only its own side.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// Bytes per second of one megabit per second.
const BYTES_PER_MBIT: f64 = 1_000_000.0 / 8.0;

/// A token bucket: `bytes_per_second` on average, up to `burst` bytes at once after an idle
/// spell.
#[derive(Debug)]
pub struct TokenBucket {
    bytes_per_second: f64,
    /// The idle credit, as time: `burst / bytes_per_second`.
    credit: Duration,
    /// When every byte reserved so far has gone out at the limit rate.
    drained_at: Mutex<Option<Instant>>,
}

impl TokenBucket {
    /// A bucket of `bytes_per_second` with `burst` bytes of credit.
    pub fn new(bytes_per_second: f64, burst: usize) -> Self {
        debug_assert!(bytes_per_second > 0.0);
        Self {
            bytes_per_second,
            credit: Duration::from_secs_f64(burst as f64 / bytes_per_second),
            drained_at: Mutex::new(None),
        }
    }

    /// Reserves `bytes` at `now`; returns how long the caller must wait before sending them.
    pub fn reserve(&self, now: Instant, bytes: usize) -> Duration {
        let mut drained_at = self.drained_at.lock();
        // Credit does not pile up beyond the burst: an idle bucket starts `credit` in the past.
        let earliest = now.checked_sub(self.credit).unwrap_or(now);
        let start = drained_at.map_or(earliest, |t| t.max(earliest));
        let done = start + Duration::from_secs_f64(bytes as f64 / self.bytes_per_second);
        *drained_at = Some(done);
        done.saturating_duration_since(now)
    }

    /// Waits (async) until `bytes` may be sent.
    pub async fn acquire(&self, bytes: usize) {
        let wait = self.reserve(Instant::now(), bytes);
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }

    /// Waits (blocking the thread) until `bytes` may be sent.
    pub fn acquire_blocking(&self, bytes: usize) {
        let wait = self.reserve(Instant::now(), bytes);
        if !wait.is_zero() {
            std::thread::sleep(wait);
        }
    }
}

/// A node's data-plane bandwidth: one bucket for what it receives, one for what it sends.
#[derive(Debug)]
pub struct NodeBandwidth {
    /// The limit in megabits per second (each direction).
    pub mbps: f64,
    /// Bytes the node's server reads.
    pub inbound: TokenBucket,
    /// Bytes the node's server writes.
    pub outbound: TokenBucket,
}

impl NodeBandwidth {
    /// A limit of `mbps` megabits per second each way; `None` for 0 (unlimited) or a value
    /// that is not a positive number.
    pub fn from_mbps(mbps: f64) -> Option<std::sync::Arc<Self>> {
        if !(mbps.is_finite() && mbps > 0.0) {
            return None;
        }
        let rate = mbps * BYTES_PER_MBIT;
        // Ten milliseconds of traffic, at least one socket buffer's worth.
        let burst = ((rate / 100.0) as usize).max(64 * 1024);
        Some(std::sync::Arc::new(Self {
            mbps,
            inbound: TokenBucket::new(rate, burst),
            outbound: TokenBucket::new(rate, burst),
        }))
    }
}

/// A worker's node and that node's bandwidth (`None`: unlimited).
type Placed = (u32, Option<Arc<NodeBandwidth>>);

/// Which node each logical worker runs on, and that node's bandwidth (the in-process fleet sets
/// it at every segment).
#[derive(Debug, Default)]
pub struct WorkerPlacement {
    workers: parking_lot::RwLock<BTreeMap<u32, Placed>>,
}

impl WorkerPlacement {
    /// Worker `worker` runs on `node`, whose bandwidth is `bandwidth`.
    pub fn place(&self, worker: u32, node: u32, bandwidth: Option<Arc<NodeBandwidth>>) {
        self.workers.write().insert(worker, (node, bandwidth));
    }

    /// The node and bandwidth of `worker`, if placed.
    fn lookup(&self, worker: u32) -> Option<Placed> {
        self.workers.read().get(&worker).cloned()
    }
}

/// The bandwidth one exchange between a server and a peer crosses.
#[derive(Debug, Default)]
pub struct Link {
    server: Option<Arc<NodeBandwidth>>,
    peer: Option<Arc<NodeBandwidth>>,
}

impl Link {
    /// The link between the server of node `node` (bandwidth `server`) and the peer that sent
    /// a frame of `worker` (`None`: not a worker's frame, or no placement known).
    pub fn between(
        server: Option<&Arc<NodeBandwidth>>,
        placement: Option<&(u32, Arc<WorkerPlacement>)>,
        worker: Option<u32>,
    ) -> Self {
        let peer = placement
            .zip(worker)
            .and_then(|((node, placement), worker)| {
                placement
                    .lookup(worker)
                    .map(|(at, bandwidth)| (at == *node, bandwidth))
            });
        match peer {
            // Worker and server share a node: nothing crosses a NIC.
            Some((true, _)) => Self::default(),
            Some((false, bandwidth)) => Self {
                server: server.cloned(),
                peer: bandwidth,
            },
            None => Self {
                server: server.cloned(),
                peer: None,
            },
        }
    }

    /// Waits until `bytes` sent by the peer may be taken in.
    pub async fn receive(&self, bytes: usize) {
        let server = self.server.as_deref().map(|b| &b.inbound);
        let peer = self.peer.as_deref().map(|b| &b.outbound);
        both(server, peer, bytes).await;
    }

    /// Waits until `bytes` may be sent to the peer.
    pub async fn send(&self, bytes: usize) {
        let server = self.server.as_deref().map(|b| &b.outbound);
        let peer = self.peer.as_deref().map(|b| &b.inbound);
        both(server, peer, bytes).await;
    }
}

/// Reserves `bytes` on both buckets at once and waits for the slower.
async fn both(a: Option<&TokenBucket>, b: Option<&TokenBucket>, bytes: usize) {
    let now = Instant::now();
    let wait = [a, b]
        .into_iter()
        .flatten()
        .map(|bucket| bucket.reserve(now, bytes))
        .max()
        .unwrap_or_default();
    if !wait.is_zero() {
        tokio::time::sleep(wait).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sends `total` bytes in `chunk`-byte pieces as fast as the bucket lets a sender go
    /// (simulated time: each send starts when the previous wait ends); returns the seconds taken.
    fn simulate(bucket: &TokenBucket, total: usize, chunk: usize) -> f64 {
        let start = Instant::now();
        let mut now = start;
        let mut sent = 0;
        while sent < total {
            now += bucket.reserve(now, chunk);
            sent += chunk;
        }
        (now - start).as_secs_f64()
    }

    #[test]
    fn the_bucket_holds_its_rate_after_the_burst() {
        // 8 Mbit/s = 1 MB/s with 64 KiB of burst: 10 MB take 10 s less the burst.
        let bucket = TokenBucket::new(8.0 * BYTES_PER_MBIT, 64 * 1024);
        let seconds = simulate(&bucket, 10_000_000, 10_000);
        let expected = (10_000_000.0 - 64.0 * 1024.0) / 1_000_000.0;
        assert!(
            (seconds - expected).abs() < 0.02,
            "took {seconds} s, expected {expected} s"
        );
        // Large frames are paced the same way.
        let bucket = TokenBucket::new(1_000_000.0, 64 * 1024);
        let seconds = simulate(&bucket, 8_000_000, 1_000_000);
        let expected = (8_000_000.0 - 64.0 * 1024.0) / 1_000_000.0;
        assert!((seconds - expected).abs() < 0.01, "took {seconds} s");
    }

    #[test]
    fn an_idle_bucket_grants_its_burst_but_no_more() {
        let bucket = TokenBucket::new(1_000_000.0, 100_000);
        let now = Instant::now();
        assert_eq!(bucket.reserve(now, 100_000), Duration::ZERO, "the burst");
        let wait = bucket.reserve(now, 100_000);
        assert!(
            (wait.as_secs_f64() - 0.1).abs() < 1e-6,
            "the next 100 kB wait 0.1 s: {wait:?}"
        );
        // A long idle spell refills the credit only up to the burst.
        let later = now + Duration::from_secs(60);
        assert_eq!(bucket.reserve(later, 100_000), Duration::ZERO);
        assert!(bucket.reserve(later, 1).as_secs_f64() > 0.0);
    }

    #[test]
    fn zero_means_unlimited_and_mbps_are_megabits() {
        assert!(NodeBandwidth::from_mbps(0.0).is_none());
        assert!(NodeBandwidth::from_mbps(-3.0).is_none());
        assert!(NodeBandwidth::from_mbps(f64::NAN).is_none());
        let limit = NodeBandwidth::from_mbps(80.0).unwrap();
        // 80 Mbit/s = 10 MB/s: 20 MB beyond the burst take 2 s each way.
        let burst = 100_000.0_f64.max(64.0 * 1024.0);
        for bucket in [&limit.inbound, &limit.outbound] {
            let seconds = simulate(bucket, 20_000_000, 50_000);
            let expected = (20_000_000.0 - burst) / 10_000_000.0;
            assert!((seconds - expected).abs() < 0.01, "{seconds} vs {expected}");
        }
    }

    #[test]
    fn an_exchange_is_charged_to_both_nodes_or_to_neither() {
        let server = NodeBandwidth::from_mbps(8.0).unwrap();
        let worker_node = NodeBandwidth::from_mbps(8.0).unwrap();
        let placement = Arc::new(WorkerPlacement::default());
        placement.place(0, 1, Some(worker_node.clone()));
        placement.place(1, 7, Some(server.clone()));
        let at_node_7 = (7, placement);
        let now = Instant::now();
        // Worker 0 on node 1: both ends pay; worker 1 shares node 7 with the server: free.
        let remote = Link::between(Some(&server), Some(&at_node_7), Some(0));
        assert!(remote.server.is_some() && remote.peer.is_some());
        let local = Link::between(Some(&server), Some(&at_node_7), Some(1));
        assert!(local.server.is_none() && local.peer.is_none());
        // Unknown worker or no placement: the server's side only.
        let unknown = Link::between(Some(&server), Some(&at_node_7), Some(9));
        assert!(unknown.server.is_some() && unknown.peer.is_none());
        let control = Link::between(Some(&server), None, None);
        assert!(control.server.is_some() && control.peer.is_none());
        // The worker node's outbound is spent by what the server receives from it.
        let before = worker_node.outbound.reserve(now, 1);
        assert_eq!(before, Duration::ZERO);
    }

    #[tokio::test]
    async fn a_link_waits_for_the_slower_end() {
        let fast = NodeBandwidth::from_mbps(800.0).unwrap();
        let slow = NodeBandwidth::from_mbps(8.0).unwrap();
        let placement = Arc::new(WorkerPlacement::default());
        placement.place(0, 1, Some(slow.clone()));
        let link = Link::between(Some(&fast), Some(&(2, placement)), Some(0));
        // 1 MB/s at the worker's end: 164 kB past its 64 KiB burst take about 0.1 s.
        let start = Instant::now();
        link.receive(164_000).await;
        let elapsed = start.elapsed().as_secs_f64();
        let expected = (164_000.0 - 64.0 * 1024.0) / 1_000_000.0;
        assert!(elapsed >= expected * 0.95, "{elapsed} s < {expected} s");
    }

    #[tokio::test]
    async fn acquire_waits_for_the_tokens() {
        // Real time, but short: 200 kB at 2 MB/s past a 64 KiB burst is about 68 ms.
        let bucket = TokenBucket::new(2_000_000.0, 64 * 1024);
        let start = Instant::now();
        for _ in 0..4 {
            bucket.acquire(50_000).await;
        }
        let elapsed = start.elapsed().as_secs_f64();
        let expected = (200_000.0 - 64.0 * 1024.0) / 2_000_000.0;
        assert!(elapsed >= expected * 0.95, "{elapsed} s < {expected} s");
    }
}
