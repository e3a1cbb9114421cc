//! Per-job metrics for the "ebbflow / jobs" dashboard: progress, loss, stage, nodes per tier and
//! pool, cost against the on-demand equivalent, free compute, evictions, migrations, rollbacks,
//! notice lead time and BidBrain's measured application model, one series set per TrainingJob.
//!
//! These are the one place where object names become labels (`namespace`, `trainingjob`): a
//! per-job dashboard needs them. Cardinality is bounded by the live jobs (plus their pools), and a
//! job's series are removed when it is deleted ([`JobMetrics::forget`]), as kube-state-metrics
//! does. The operator sets them from each job's computed status; `ebbflow run` from its run.

use std::collections::{BTreeMap, BTreeSet};

use ebbflow_crds::TrainingJobStatus;
use parking_lot::Mutex;
use prometheus::{Gauge, GaugeVec, IntCounterVec, Opts, Registry};

const JOB_LABELS: &[&str] = &["namespace", "trainingjob"];

/// (namespace, job) → the (instance type, zone) pairs with a pool series.
type PoolSeries = BTreeMap<(String, String), BTreeSet<(String, String)>>;

/// The per-job gauges (see the module docs).
#[derive(Debug)]
pub struct JobMetrics {
    iteration: GaugeVec,
    loss: GaugeVec,
    stage: GaugeVec,
    nodes: GaugeVec,
    pool_nodes: GaugeVec,
    spent: GaugeVec,
    on_demand_equivalent: GaugeVec,
    free_compute: GaugeVec,
    evictions: IntCounterVec,
    migrations: IntCounterVec,
    rollbacks: IntCounterVec,
    notice_lead: GaugeVec,
    /// ν, φ, σ, λ: one gauge each, as their units differ.
    app_model: [GaugeVec; 4],
    /// Pool label pairs set per job (to remove them when the job goes or the pool empties).
    pools: Mutex<PoolSeries>,
}

fn gauge(name: &str, help: &str, extra: &[&str]) -> prometheus::Result<GaugeVec> {
    let labels: Vec<&str> = JOB_LABELS.iter().chain(extra).copied().collect();
    GaugeVec::new(Opts::new(name, help), &labels)
}

fn counter(name: &str, help: &str) -> prometheus::Result<IntCounterVec> {
    IntCounterVec::new(Opts::new(name, help), JOB_LABELS)
}

/// Brings `namespace/job`'s series of `vec` to `total`, a count from the job's status. Counts
/// in a status only rise; if one is lower (the job was recreated under its name), the series
/// restarts from it, which rate() reads as a counter reset.
fn count_to(vec: &IntCounterVec, namespace: &str, job: &str, total: u64) {
    let series = vec.with_label_values(&[namespace, job]);
    let now = series.get();
    if total >= now {
        series.inc_by(total - now);
    } else {
        let _ = vec.remove_label_values(&[namespace, job]);
        vec.with_label_values(&[namespace, job]).inc_by(total);
    }
}

impl JobMetrics {
    /// Creates the gauges and registers them into `registry`.
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let metrics = Self {
            iteration: gauge("ebbflow_job_iteration", "Training clocks completed", &[])?,
            loss: gauge("ebbflow_job_loss", "Latest training loss", &[])?,
            stage: gauge("ebbflow_job_stage", "AgileML stage (1, 2 or 3)", &[])?,
            nodes: gauge("ebbflow_job_nodes", "Running nodes by tier", &["tier"])?,
            pool_nodes: gauge(
                "ebbflow_job_pool_nodes",
                "Running transient nodes by pool",
                &["instance_type", "zone"],
            )?,
            spent: gauge(
                "ebbflow_job_spent_usd",
                "USD charged so far under the job's billing model",
                &[],
            )?,
            on_demand_equivalent: gauge(
                "ebbflow_job_on_demand_equivalent_usd",
                "USD the same instance-time would have cost on demand",
                &[],
            )?,
            free_compute: gauge(
                "ebbflow_job_free_compute_usd",
                "USD of compute received free (refunded or uncharged evicted time)",
                &[],
            )?,
            evictions: counter("ebbflow_job_evictions_total", "Evictions so far")?,
            migrations: counter(
                "ebbflow_job_migrations_total",
                "Partition migrations so far",
            )?,
            rollbacks: counter("ebbflow_job_rollbacks_total", "Rollbacks so far")?,
            notice_lead: gauge(
                "ebbflow_job_notice_lead_seconds",
                "Lead time of the latest eviction notice delivered",
                &[],
            )?,
            app_model: [
                gauge(
                    "ebbflow_job_app_model_nu_clocks_per_vcpu_second",
                    "BidBrain's application model: training clocks per vCPU per market second (nu)",
                    &[],
                )?,
                gauge(
                    "ebbflow_job_app_model_phi_ratio",
                    "BidBrain's application model: share of a transient node's nu that becomes progress (phi)",
                    &[],
                )?,
                gauge(
                    "ebbflow_job_app_model_sigma_seconds",
                    "BidBrain's application model: from buying capacity until the runtime switched it in (sigma)",
                    &[],
                )?,
                gauge(
                    "ebbflow_job_app_model_lambda_seconds",
                    "BidBrain's application model: progress lost after an eviction (lambda)",
                    &[],
                )?,
            ],
            pools: Mutex::new(BTreeMap::new()),
        };
        for gauge in metrics.gauges() {
            registry.register(Box::new(gauge.clone()))?;
        }
        for counter in metrics.counters() {
            registry.register(Box::new(counter.clone()))?;
        }
        Ok(metrics)
    }

    /// The gauges with only the job's labels.
    fn gauges(&self) -> [&GaugeVec; 13] {
        [
            &self.iteration,
            &self.loss,
            &self.stage,
            &self.nodes,
            &self.pool_nodes,
            &self.spent,
            &self.on_demand_equivalent,
            &self.free_compute,
            &self.notice_lead,
            &self.app_model[0],
            &self.app_model[1],
            &self.app_model[2],
            &self.app_model[3],
        ]
    }

    fn counters(&self) -> [&IntCounterVec; 3] {
        [&self.evictions, &self.migrations, &self.rollbacks]
    }

    fn one(&self, vec: &GaugeVec, namespace: &str, job: &str) -> Gauge {
        vec.with_label_values(&[namespace, job])
    }

    /// Sets every gauge of `namespace/job` from its status (unknown values are left out).
    pub fn observe(&self, namespace: &str, job: &str, status: &TrainingJobStatus) {
        if let Some(iteration) = status.iteration {
            self.one(&self.iteration, namespace, job)
                .set(iteration as f64);
        }
        if let Some(loss) = status.loss.filter(|l| l.is_finite()) {
            self.one(&self.loss, namespace, job).set(loss);
        }
        if let Some(stage) = status.stage {
            self.one(&self.stage, namespace, job).set(f64::from(stage));
        }
        if let Some(nodes) = &status.nodes {
            for (tier, count) in [("reliable", nodes.reliable), ("transient", nodes.transient)] {
                self.nodes
                    .with_label_values(&[namespace, job, tier])
                    .set(f64::from(count));
            }
            let now: BTreeSet<(String, String)> = nodes
                .pools
                .iter()
                .map(|p| (p.pool.instance_type.clone(), p.pool.zone.clone()))
                .collect();
            for pool in &nodes.pools {
                self.pool_nodes
                    .with_label_values(&[namespace, job, &pool.pool.instance_type, &pool.pool.zone])
                    .set(f64::from(pool.count));
            }
            let mut pools = self.pools.lock();
            let known = pools
                .entry((namespace.to_owned(), job.to_owned()))
                .or_default();
            for (instance_type, zone) in known.difference(&now) {
                let _ = self
                    .pool_nodes
                    .remove_label_values(&[namespace, job, instance_type, zone]);
            }
            *known = now;
        }
        if let Some(cost) = &status.cost {
            self.one(&self.spent, namespace, job).set(cost.spent);
            self.one(&self.on_demand_equivalent, namespace, job)
                .set(cost.on_demand_equivalent);
            self.one(&self.free_compute, namespace, job)
                .set(cost.free_compute);
        }
        count_to(&self.evictions, namespace, job, status.evictions);
        count_to(&self.migrations, namespace, job, status.migrations);
        count_to(&self.rollbacks, namespace, job, status.rollbacks);
        if let Some(model) = &status.app_model {
            let terms = [
                model.nu,
                model.phi,
                model.sigma_seconds,
                model.lambda_seconds,
            ];
            for (gauge, value) in self.app_model.iter().zip(terms) {
                self.one(gauge, namespace, job).set(value);
            }
        }
    }

    /// Records the lead time of a notice delivered for `namespace/job`.
    pub fn notice_delivered(&self, namespace: &str, job: &str, lead_seconds: f64) {
        self.one(&self.notice_lead, namespace, job)
            .set(lead_seconds.max(0.0));
    }

    /// Removes every series of `namespace/job` (the job was deleted).
    pub fn forget(&self, namespace: &str, job: &str) {
        // The vectors with more labels refuse the two-label removal; they follow below.
        for vec in self.gauges() {
            let _ = vec.remove_label_values(&[namespace, job]);
        }
        for vec in self.counters() {
            let _ = vec.remove_label_values(&[namespace, job]);
        }
        for tier in ["reliable", "transient"] {
            let _ = self.nodes.remove_label_values(&[namespace, job, tier]);
        }
        let pools = self
            .pools
            .lock()
            .remove(&(namespace.to_owned(), job.to_owned()))
            .unwrap_or_default();
        for (instance_type, zone) in pools {
            let _ = self
                .pool_nodes
                .remove_label_values(&[namespace, job, &instance_type, &zone]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ebbflow_crds::{CostStatus, NodeCounts, Pool, PoolNodes};

    fn text(registry: &Registry) -> String {
        use prometheus::Encoder;
        let mut buffer = Vec::new();
        prometheus::TextEncoder::new()
            .encode(&registry.gather(), &mut buffer)
            .unwrap();
        String::from_utf8(buffer).unwrap()
    }

    #[test]
    fn observes_a_status_and_forgets_a_deleted_job() {
        let registry = Registry::new();
        let metrics = JobMetrics::register(&registry).unwrap();
        let pool = |zone: &str, count| PoolNodes {
            pool: Pool {
                instance_type: "m5.large".into(),
                zone: zone.into(),
                ..Pool::default()
            },
            count,
        };
        let mut status = TrainingJobStatus {
            iteration: Some(12),
            loss: Some(0.5),
            stage: Some(2),
            nodes: Some(NodeCounts {
                reliable: 1,
                transient: 3,
                total: 4,
                pools: vec![pool("a", 2), pool("b", 1)],
            }),
            cost: Some(CostStatus {
                spent: 1.25,
                free_compute: 0.5,
                on_demand_equivalent: 4.0,
                ..CostStatus::default()
            }),
            evictions: 2,
            app_model: Some(ebbflow_crds::AppModelStatus {
                nu: 0.03,
                phi: 0.9,
                sigma_seconds: 30.5,
                lambda_seconds: 120.0,
                ..ebbflow_crds::AppModelStatus::default()
            }),
            ..TrainingJobStatus::default()
        };
        metrics.observe("ns", "job", &status);
        metrics.notice_delivered("ns", "job", 95.0);
        let before = text(&registry);
        for expected in [
            "ebbflow_job_iteration{namespace=\"ns\",trainingjob=\"job\"} 12",
            "ebbflow_job_spent_usd{namespace=\"ns\",trainingjob=\"job\"} 1.25",
            "ebbflow_job_nodes{namespace=\"ns\",tier=\"transient\",trainingjob=\"job\"} 3",
            "ebbflow_job_pool_nodes{instance_type=\"m5.large\",namespace=\"ns\",trainingjob=\"job\",zone=\"b\"} 1",
            "ebbflow_job_notice_lead_seconds{namespace=\"ns\",trainingjob=\"job\"} 95",
            "ebbflow_job_app_model_sigma_seconds{namespace=\"ns\",trainingjob=\"job\"} 30.5",
            "ebbflow_job_app_model_nu_clocks_per_vcpu_second{namespace=\"ns\",trainingjob=\"job\"} 0.03",
            "# TYPE ebbflow_job_evictions_total counter",
            "ebbflow_job_evictions_total{namespace=\"ns\",trainingjob=\"job\"} 2",
        ] {
            assert!(
                before.contains(expected),
                "{expected} missing from\n{before}"
            );
        }
        // Counts follow the status; a lower one (the job recreated) restarts the series.
        status.evictions = 5;
        metrics.observe("ns", "job", &status);
        assert!(
            text(&registry)
                .contains("ebbflow_job_evictions_total{namespace=\"ns\",trainingjob=\"job\"} 5")
        );
        status.evictions = 1;
        metrics.observe("ns", "job", &status);
        assert!(
            text(&registry)
                .contains("ebbflow_job_evictions_total{namespace=\"ns\",trainingjob=\"job\"} 1")
        );
        // A pool that empties loses its series.
        status.nodes.as_mut().unwrap().pools.pop();
        metrics.observe("ns", "job", &status);
        assert!(!text(&registry).contains("zone=\"b\""));
        metrics.forget("ns", "job");
        assert!(!text(&registry).contains("trainingjob=\"job\""));
    }
}
