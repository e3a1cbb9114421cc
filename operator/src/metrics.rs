//! Prometheus metrics of `ebbflow-operator`, registered into a registry the caller passes in.
//!
//! Names follow `ebbflow_operator_<what>_<unit>`; every label is a small closed set (error
//! categories, notice sources, tiers, phases), never an object name. The per-job gauges of
//! [`ebbflow_job::job_metrics`] are the documented exception.

use prometheus::{
    Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry,
};

/// Every metric the operator exports.
#[derive(Clone)]
pub struct Metrics {
    /// `ebbflow_operator_reconciliations_total`: reconcile runs started.
    pub reconciliations: IntCounter,
    /// `ebbflow_operator_reconcile_errors_total{category}`: reconcile runs that failed, by
    /// error category.
    pub reconcile_errors: IntCounterVec,
    /// `ebbflow_operator_reconcile_duration_seconds`: wall time of one reconcile run.
    pub reconcile_duration: Histogram,
    /// `ebbflow_operator_notices_sent_total{source}`: eviction notices delivered to
    /// coordinators, by where the notice came from.
    pub notices_sent: IntCounterVec,
    /// `ebbflow_operator_notice_failures_total`: notices the coordinator did not accept.
    pub notice_failures: IntCounter,
    /// `ebbflow_operator_notices_relayed_total`: notices the relay delivered straight from a
    /// watch event or an EC2 spot interruption (the rest of `notices_sent` went through a
    /// reconcile).
    pub notices_relayed: IntCounter,
    /// `ebbflow_operator_interruption_poll_errors_total`: polls of EC2's spot request statuses
    /// (the interruption watcher, ec2 provisioning mode) that failed.
    pub interruption_poll_errors: IntCounter,
    /// `ebbflow_operator_notice_lead_seconds{source}`: time between delivering a notice and
    /// the instance's announced departure (0 when it is already gone).
    pub notice_lead: HistogramVec,
    /// `ebbflow_operator_pods_created_total{tier}`: runtime pods created.
    pub pods_created: IntCounterVec,
    /// `ebbflow_operator_pods_deleted_total{reason}`: runtime pods deleted.
    pub pods_deleted: IntCounterVec,
    /// `ebbflow_operator_node_pod_failures_total`: node pods (not coordinators) that failed by
    /// themselves (`status.nodeFailures`); their replacements back off.
    pub node_pod_failures: IntCounter,
    /// `ebbflow_operator_jobs{phase}`: TrainingJobs this operator reconciles, by phase.
    pub jobs: IntGaugeVec,
    /// `ebbflow_operator_coordinator_requests_total{outcome}`: coordinator admin API calls.
    pub coordinator_requests: IntCounterVec,
    /// `ebbflow_operator_ec2_instances_total{action}`: EC2 instances launched / terminated in
    /// ec2 provisioning mode.
    pub instances: IntCounterVec,
    /// `ebbflow_operator_leader`: 1 while this replica holds the leader lease.
    pub leader: IntGauge,
    /// `ebbflow_operator_reconciles_in_flight`: reconcile runs under way (the controller's work
    /// queue being drained; it stays above zero while the operator falls behind).
    pub reconciles_in_flight: IntGauge,
    /// Per-job gauges for the jobs dashboard (the one place object names are labels).
    pub job: std::sync::Arc<ebbflow_job::job_metrics::JobMetrics>,
}

/// Error categories used as the `category` label (see each step's `category()`).
pub const ERROR_CATEGORIES: &[&str] = &[
    "Kubernetes",
    "Finalizer",
    "InvalidObject",
    "Coordinator",
    "Provisioner",
];

/// Notice sources used as the `source` label.
pub const NOTICE_SOURCES: &[&str] = &[
    "AwsNodeTerminationHandler",
    "AwsMaintenance",
    "AwsRebalanceRecommendation",
    "KarpenterDisruption",
    "GkeTermination",
    "NodeDeletion",
    "NodeGone",
    "PodDisruption",
    "PodDeletion",
    "ScaleDown",
    "Ec2SpotInterruption",
];

/// Pod deletion reasons used as the `reason` label.
pub const DELETE_REASONS: &[&str] = &["ScaleDown", "Replace", "Suspend", "Finished", "Cleanup"];

/// Phases used as the `phase` label.
pub const PHASES: &[&str] = &[
    "Pending",
    "Provisioning",
    "Running",
    "Suspended",
    "Succeeded",
    "Failed",
];

impl Metrics {
    /// Creates every metric and registers it into `registry`.
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let metrics = Self {
            reconciliations: IntCounter::new(
                "ebbflow_operator_reconciliations_total",
                "TrainingJob reconcile runs started",
            )?,
            reconcile_errors: IntCounterVec::new(
                Opts::new(
                    "ebbflow_operator_reconcile_errors_total",
                    "TrainingJob reconcile runs that failed, by error category",
                ),
                &["category"],
            )?,
            reconcile_duration: Histogram::with_opts(
                HistogramOpts::new(
                    "ebbflow_operator_reconcile_duration_seconds",
                    "Wall time of one TrainingJob reconcile run",
                )
                .buckets(vec![
                    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                ]),
            )?,
            notices_sent: IntCounterVec::new(
                Opts::new(
                    "ebbflow_operator_notices_sent_total",
                    "Eviction notices delivered to job coordinators, by source",
                ),
                &["source"],
            )?,
            notice_failures: IntCounter::new(
                "ebbflow_operator_notice_failures_total",
                "Eviction notices the coordinator did not accept",
            )?,
            notices_relayed: IntCounter::new(
                "ebbflow_operator_notices_relayed_total",
                "Eviction notices delivered by the notice relay straight from a watch event",
            )?,
            interruption_poll_errors: IntCounter::new(
                "ebbflow_operator_interruption_poll_errors_total",
                "Polls of EC2 spot request statuses for interruptions that failed",
            )?,
            notice_lead: HistogramVec::new(
                HistogramOpts::new(
                    "ebbflow_operator_notice_lead_seconds",
                    "Seconds between delivering an eviction notice and the announced departure",
                )
                .buckets(vec![
                    0.0, 5.0, 15.0, 30.0, 60.0, 90.0, 120.0, 300.0, 600.0, 1800.0,
                ]),
                &["source"],
            )?,
            pods_created: IntCounterVec::new(
                Opts::new(
                    "ebbflow_operator_pods_created_total",
                    "Runtime pods created, by tier",
                ),
                &["tier"],
            )?,
            instances: IntCounterVec::new(
                Opts::new(
                    "ebbflow_operator_ec2_instances_total",
                    "EC2 instances launched or terminated in ec2 provisioning mode, by action",
                ),
                &["action"],
            )?,
            pods_deleted: IntCounterVec::new(
                Opts::new(
                    "ebbflow_operator_pods_deleted_total",
                    "Runtime pods deleted, by reason",
                ),
                &["reason"],
            )?,
            node_pod_failures: IntCounter::new(
                "ebbflow_operator_node_pod_failures_total",
                "Node pods that failed by themselves (crash, startup error, OOMKilled)",
            )?,
            jobs: IntGaugeVec::new(
                Opts::new("ebbflow_operator_jobs", "TrainingJobs reconciled, by phase"),
                &["phase"],
            )?,
            coordinator_requests: IntCounterVec::new(
                Opts::new(
                    "ebbflow_operator_coordinator_requests_total",
                    "Coordinator admin API calls, by outcome (ok, error)",
                ),
                &["outcome"],
            )?,
            leader: IntGauge::new(
                "ebbflow_operator_leader",
                "1 while this replica holds the leader lease",
            )?,
            reconciles_in_flight: IntGauge::new(
                "ebbflow_operator_reconciles_in_flight",
                "Reconcile runs under way",
            )?,
            job: std::sync::Arc::new(ebbflow_job::job_metrics::JobMetrics::register(registry)?),
        };
        registry.register(Box::new(metrics.reconciliations.clone()))?;
        registry.register(Box::new(metrics.reconcile_errors.clone()))?;
        registry.register(Box::new(metrics.reconcile_duration.clone()))?;
        registry.register(Box::new(metrics.notices_sent.clone()))?;
        registry.register(Box::new(metrics.notice_failures.clone()))?;
        registry.register(Box::new(metrics.notices_relayed.clone()))?;
        registry.register(Box::new(metrics.interruption_poll_errors.clone()))?;
        registry.register(Box::new(metrics.notice_lead.clone()))?;
        registry.register(Box::new(metrics.pods_created.clone()))?;
        registry.register(Box::new(metrics.pods_deleted.clone()))?;
        registry.register(Box::new(metrics.node_pod_failures.clone()))?;
        registry.register(Box::new(metrics.instances.clone()))?;
        registry.register(Box::new(metrics.jobs.clone()))?;
        registry.register(Box::new(metrics.coordinator_requests.clone()))?;
        registry.register(Box::new(metrics.leader.clone()))?;
        registry.register(Box::new(metrics.reconciles_in_flight.clone()))?;
        // Pre-create every series of the closed label sets so dashboards see zeros, not gaps.
        for category in ERROR_CATEGORIES {
            metrics.reconcile_errors.with_label_values(&[category]);
        }
        for source in NOTICE_SOURCES {
            metrics.notices_sent.with_label_values(&[source]);
        }
        for tier in ["reliable", "transient"] {
            metrics.pods_created.with_label_values(&[tier]);
        }
        for reason in DELETE_REASONS {
            metrics.pods_deleted.with_label_values(&[reason]);
        }
        for phase in PHASES {
            metrics.jobs.with_label_values(&[phase]);
        }
        for action in ["launched", "terminated"] {
            metrics.instances.with_label_values(&[action]);
        }
        for outcome in ["ok", "error"] {
            metrics.coordinator_requests.with_label_values(&[outcome]);
        }
        Ok(metrics)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registers_every_metric_with_conventional_names() {
        let registry = Registry::new();
        let metrics = Metrics::register(&registry).unwrap();
        metrics.reconciliations.inc();
        metrics.reconcile_duration.observe(0.01);
        metrics
            .notice_lead
            .with_label_values(&["NodeGone"])
            .observe(0.0);
        let families = registry.gather();
        let names: Vec<&str> = families.iter().map(|family| family.name()).collect();
        assert_eq!(names.len(), 16, "{names:?}");
        for name in names {
            assert!(name.starts_with("ebbflow_operator_"), "{name}");
        }
        // A second registration into the same registry is refused, proving it is not global.
        assert!(Metrics::register(&registry).is_err());
        assert!(Metrics::register(&Registry::new()).is_ok());
    }

    #[test]
    fn notice_sources_label_every_source() {
        let sources: Vec<&str> = crate::notices::NoticeSource::ALL
            .iter()
            .map(|source| source.as_str())
            .collect();
        assert_eq!(NOTICE_SOURCES, sources.as_slice());
    }
}
