//! A per-node bandwidth limit on the data plane: a token bucket on every byte a node's
//! data-plane server reads and writes, one bucket per direction (a full-duplex NIC).
//!
//! It stands in for the network of a real cluster when every node runs on one machine: the
//! stage-1 bottleneck of seed 003 §4.5.3 (every worker talking to the few ParamServs on the
//! reliable tier) only shows when a node's bandwidth is finite. The limit applies to the
//! server side of every exchange, so it also covers a node's BackupPS copies and partition
//! hand-offs; a worker's own outbound pushes count against the server that receives them.

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
