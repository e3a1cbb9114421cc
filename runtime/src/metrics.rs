//! Prometheus metrics of the runtime, registered on a registry passed in (never the global one).

use prometheus::{
    Gauge, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry,
};

/// The runtime's metrics. Cheap to clone (handles are shared).
#[derive(Debug, Clone)]
pub struct RuntimeMetrics {
    /// Worker clocks completed (summed over worker threads).
    pub iterations: IntCounter,
    /// Wall time of one clock of one worker thread, compute and synchronisation.
    pub iteration_seconds: Histogram,
    /// Latest mean training loss reported by the app.
    pub loss: Gauge,
    /// Runs that ended because training diverged (a non-finite or runaway training loss, or a
    /// non-finite final evaluation).
    pub diverged: IntCounter,
    /// Rows moved between workers and servers, by direction (`push`, `pull`).
    pub rows_moved: IntCounterVec,
    /// Payload bytes moved between workers and servers, by direction (`push`, `pull`).
    pub bytes_moved: IntCounterVec,
    /// Time workers spent waiting for SSP (slowest worker's clock).
    pub ssp_wait_seconds: Histogram,
    /// Open data-plane connections on this server.
    pub connections_open: IntGauge,
    /// Data-plane connections closed for a bad frame or peer, by reason (`dead_peer`: a peer
    /// that stopped answering TCP, a vanished instance).
    pub connections_refused: IntCounterVec,
    /// Admin-API connections closed before HTTP, by reason (`plaintext`: HTTP to a TLS admin
    /// API; `tls`: a failed handshake, such as a client of another job's key;
    /// `handshake_timeout`). A connection closed before its first byte (a TCP readiness probe)
    /// is not counted.
    pub admin_connections_refused: IntCounterVec,
    /// Current AgileML stage (1, 2 or 3) of an elastic run.
    pub stage: IntGauge,
    /// Member nodes of an elastic run, by tier (`reliable`, `transient`).
    pub nodes: IntGaugeVec,
    /// Transient nodes switched in (counted as member nodes) so far: their joins, even when
    /// others leave between two looks at `nodes`.
    pub transient_nodes_added: IntCounter,
    /// Membership events of an elastic run, by kind (`join`, `notice`, `late_notice`, `fail`,
    /// `rejected`).
    pub elastic_events: IntCounterVec,
    /// Partitions that changed owner (migrations, end-of-life flushes, rollback restores).
    pub partitions_migrated: IntCounter,
    /// Rollbacks to the BackupPS copy after a failure.
    pub rollbacks: IntCounter,
    /// Clocks redone after rollbacks (summed over rollbacks).
    pub clocks_redone: IntCounter,
    /// Clocks every partition holds at the last segment boundary of an elastic run.
    pub consistent_clock: IntGauge,
    /// Clock of the last checkpoint written to disk (0: none).
    pub checkpoint_clock: IntGauge,
    /// Checkpoint writes that failed (the next copy tries again).
    pub checkpoint_failures: IntCounter,
    /// Data shards a worker started from, by source (`built`: loaded when the worker started;
    /// `preloaded`: loaded in the background beforehand by the shard's second holder).
    pub shard_loads: IntCounterVec,
    /// Workers' connections to a joining node's server opened and warmed before its switch, by
    /// outcome (`opened`; `taken` by the worker at the switch; `closed` unused, the node having
    /// left or the run ended first).
    pub pre_opened_connections: IntCounterVec,
    /// Workers' connections cut because an abandoned segment's workers did not stop (one was
    /// blocked on a peer that hangs): their reads fail at once instead of at the read timeout.
    pub connections_severed: IntCounter,
    /// Per boundary that applied eviction notices in time: seconds from the first one's arrival
    /// until every partition the leaving nodes served was installed on its new owner (the
    /// reliable tier for a full eviction).
    pub notice_to_safe_seconds: Histogram,
    /// Parameter bytes (row values) of background BackupPS copies, by kind (`whole` images,
    /// coalesced `delta`s): received from node processes, or what an in-process fleet's nodes
    /// would send (its bandwidth model is charged the same).
    pub backup_copy_bytes: IntCounterVec,
    /// Partition images of those copies, by the same kinds.
    pub backup_copy_images: IntCounterVec,
}

impl RuntimeMetrics {
    /// Creates the metrics and registers them on `registry`.
    pub fn register(registry: &Registry) -> Result<Self, prometheus::Error> {
        let buckets = prometheus::exponential_buckets(0.000_1, 2.0, 20)?;
        let metrics = Self {
            iterations: IntCounter::new(
                "ebbflow_runtime_iterations_total",
                "worker clocks completed",
            )?,
            iteration_seconds: Histogram::with_opts(
                HistogramOpts::new(
                    "ebbflow_runtime_iteration_seconds",
                    "wall time of one worker clock",
                )
                .buckets(buckets.clone()),
            )?,
            loss: Gauge::new(
                "ebbflow_runtime_loss",
                "latest mean training loss reported by the app",
            )?,
            diverged: IntCounter::new(
                "ebbflow_runtime_diverged_total",
                "runs that ended because training diverged (non-finite or runaway training loss, or a non-finite final evaluation)",
            )?,
            rows_moved: IntCounterVec::new(
                Opts::new(
                    "ebbflow_runtime_rows_moved_total",
                    "rows moved between workers and servers",
                ),
                &["direction"],
            )?,
            bytes_moved: IntCounterVec::new(
                Opts::new(
                    "ebbflow_runtime_bytes_moved_total",
                    "payload bytes moved between workers and servers",
                ),
                &["direction"],
            )?,
            ssp_wait_seconds: Histogram::with_opts(
                HistogramOpts::new(
                    "ebbflow_runtime_ssp_wait_seconds",
                    "time a worker waited for the staleness bound",
                )
                .buckets(buckets),
            )?,
            connections_open: IntGauge::new(
                "ebbflow_runtime_connections_open",
                "open data-plane connections",
            )?,
            connections_refused: IntCounterVec::new(
                Opts::new(
                    "ebbflow_runtime_connections_refused_total",
                    "data-plane connections closed for a bad, failed or vanished (dead_peer) peer or a bad frame",
                ),
                &["reason"],
            )?,
            admin_connections_refused: IntCounterVec::new(
                Opts::new(
                    "ebbflow_runtime_admin_connections_refused_total",
                    "admin-API connections closed before HTTP: plaintext to a TLS API, a failed or unfinished TLS handshake",
                ),
                &["reason"],
            )?,
            stage: IntGauge::new("ebbflow_runtime_stage", "current AgileML stage (1, 2 or 3)")?,
            nodes: IntGaugeVec::new(
                Opts::new(
                    "ebbflow_runtime_nodes",
                    "member nodes of an elastic run by tier",
                ),
                &["tier"],
            )?,
            elastic_events: IntCounterVec::new(
                Opts::new(
                    "ebbflow_runtime_elastic_events_total",
                    "membership events of an elastic run",
                ),
                &["kind"],
            )?,
            partitions_migrated: IntCounter::new(
                "ebbflow_runtime_partitions_migrated_total",
                "partitions placed after the first layout (migrations, flushes, restores)",
            )?,
            rollbacks: IntCounter::new(
                "ebbflow_runtime_rollbacks_total",
                "rollbacks to the BackupPS copy after a failure",
            )?,
            clocks_redone: IntCounter::new(
                "ebbflow_runtime_clocks_redone_total",
                "clocks redone after rollbacks",
            )?,
            transient_nodes_added: IntCounter::new(
                "ebbflow_runtime_transient_nodes_added_total",
                "transient nodes switched in to an elastic run",
            )?,
            consistent_clock: IntGauge::new(
                "ebbflow_runtime_consistent_clock",
                "clocks every partition holds at the last segment boundary",
            )?,
            checkpoint_clock: IntGauge::new(
                "ebbflow_runtime_checkpoint_clock",
                "Clock of the last checkpoint the coordinator wrote to disk (0: none yet).",
            )?,
            checkpoint_failures: IntCounter::new(
                "ebbflow_runtime_checkpoint_failures_total",
                "checkpoint writes that failed (disk full, no permission); the next copy tries again",
            )?,
            shard_loads: IntCounterVec::new(
                Opts::new(
                    "ebbflow_runtime_shard_loads_total",
                    "data shards workers started from, by source (built, preloaded)",
                ),
                &["source"],
            )?,
            pre_opened_connections: IntCounterVec::new(
                Opts::new(
                    "ebbflow_runtime_pre_opened_connections_total",
                    "workers' connections to a joining node opened before its switch, by outcome \
                     (opened, taken, closed)",
                ),
                &["outcome"],
            )?,
            connections_severed: IntCounter::new(
                "ebbflow_runtime_connections_severed_total",
                "workers' connections cut because an abandoned segment's workers did not stop \
                 (blocked on a peer that hangs)",
            )?,
            notice_to_safe_seconds: Histogram::with_opts(
                HistogramOpts::new(
                    "ebbflow_runtime_notice_to_safe_seconds",
                    "seconds from an eviction notice to every partition of the leaving nodes \
                     installed on its new owner",
                )
                .buckets(prometheus::exponential_buckets(0.001, 2.0, 20)?),
            )?,
            backup_copy_bytes: IntCounterVec::new(
                Opts::new(
                    "ebbflow_runtime_backup_copy_bytes_total",
                    "parameter bytes of background BackupPS copies sent, by kind (whole, \
                     delta)",
                ),
                &["kind"],
            )?,
            backup_copy_images: IntCounterVec::new(
                Opts::new(
                    "ebbflow_runtime_backup_copy_images_total",
                    "partition images of background BackupPS copies sent, by kind (whole, \
                     delta)",
                ),
                &["kind"],
            )?,
        };
        registry.register(Box::new(metrics.iterations.clone()))?;
        registry.register(Box::new(metrics.stage.clone()))?;
        registry.register(Box::new(metrics.nodes.clone()))?;
        registry.register(Box::new(metrics.elastic_events.clone()))?;
        registry.register(Box::new(metrics.partitions_migrated.clone()))?;
        registry.register(Box::new(metrics.rollbacks.clone()))?;
        registry.register(Box::new(metrics.clocks_redone.clone()))?;
        registry.register(Box::new(metrics.consistent_clock.clone()))?;
        registry.register(Box::new(metrics.checkpoint_clock.clone()))?;
        registry.register(Box::new(metrics.checkpoint_failures.clone()))?;
        registry.register(Box::new(metrics.transient_nodes_added.clone()))?;
        registry.register(Box::new(metrics.shard_loads.clone()))?;
        registry.register(Box::new(metrics.pre_opened_connections.clone()))?;
        registry.register(Box::new(metrics.connections_severed.clone()))?;
        registry.register(Box::new(metrics.notice_to_safe_seconds.clone()))?;
        registry.register(Box::new(metrics.backup_copy_bytes.clone()))?;
        registry.register(Box::new(metrics.backup_copy_images.clone()))?;
        registry.register(Box::new(metrics.iteration_seconds.clone()))?;
        registry.register(Box::new(metrics.loss.clone()))?;
        registry.register(Box::new(metrics.diverged.clone()))?;
        registry.register(Box::new(metrics.rows_moved.clone()))?;
        registry.register(Box::new(metrics.bytes_moved.clone()))?;
        registry.register(Box::new(metrics.ssp_wait_seconds.clone()))?;
        registry.register(Box::new(metrics.connections_open.clone()))?;
        registry.register(Box::new(metrics.connections_refused.clone()))?;
        registry.register(Box::new(metrics.admin_connections_refused.clone()))?;
        Ok(metrics)
    }

    /// Counts one partition's part of a background BackupPS copy: `bytes` of parameters, sent
    /// whole or as a coalesced delta.
    pub fn count_backup_copy(&self, bytes: usize, delta: bool) {
        let kind = if delta { "delta" } else { "whole" };
        self.backup_copy_bytes
            .with_label_values(&[kind])
            .inc_by(bytes as u64);
        self.backup_copy_images.with_label_values(&[kind]).inc();
    }

    /// Metrics registered on a fresh private registry (tests, benchmarks).
    pub fn unregistered() -> Self {
        Self::register(&Registry::new()).expect("fresh registry accepts the runtime metrics")
    }
}

/// Another registry's metrics, gathered into the one this is registered on with one more label
/// on every series: the coordinator pod serves its own reliable node's data-plane and worker
/// metrics (`process="node"`) beside the coordinator's from one admin port. Families of the same
/// name merge (the registry's gather does that); the label keeps the series apart.
pub struct Nested {
    registry: Registry,
    label: (&'static str, &'static str),
}

impl Nested {
    /// `registry`'s metrics with `name="value"` added.
    pub fn new(registry: Registry, name: &'static str, value: &'static str) -> Self {
        Self {
            registry,
            label: (name, value),
        }
    }
}

impl prometheus::core::Collector for Nested {
    fn desc(&self) -> Vec<&prometheus::core::Desc> {
        Vec::new()
    }

    fn collect(&self) -> Vec<prometheus::proto::MetricFamily> {
        let mut families = self.registry.gather();
        for family in &mut families {
            for metric in family.mut_metric().iter_mut() {
                let mut label = prometheus::proto::LabelPair::default();
                label.set_name(self.label.0.to_owned());
                label.set_value(self.label.1.to_owned());
                let mut labels = metric.take_label();
                labels.push(label);
                metric.set_label(labels);
            }
        }
        families
    }
}

/// Renders `registry` in the Prometheus text format.
pub fn render(registry: &Registry) -> String {
    use prometheus::Encoder;
    let mut buffer = Vec::new();
    let encoder = prometheus::TextEncoder::new();
    if encoder.encode(&registry.gather(), &mut buffer).is_err() {
        return String::new();
    }
    String::from_utf8(buffer).unwrap_or_default()
}
