//! A BidBrain job's application model re-estimated from its own progress: the operator's side
//! of the same [`ThroughputProbe`] and [`Calibrator`] that `ebbflow run` feeds.
//!
//! Every BidBrain decision with a coordinator report is a sample. The report gives the progress
//! (its consistent clock), the rollbacks, the stage, the ready nodes per tier and the transient
//! nodes switched in so far (a coordinator still waiting for its nodes reports none: no clock
//! done, no node ready; an unreachable one is no sample: what changed waits); vCPUs are the
//! reliable tier's instance type and the mean of the pools the job's alive transient pods are in.
//! The probe's capacity events come from the operator itself:
//!
//! - **Acquired**: a decision raised a pool's count above what the job held there (one
//!   allocation per raise, dated at that decision, so σ runs from the decision until the
//!   runtime counts the new nodes ready: pod scheduling, instance boot, data load, switch-in);
//! - **Released**: a decision lowered a pool's count (newest allocations first); the pods that
//!   then go are not evictions;
//! - **Notice**: a pool's pods came under an eviction notice (taint, interruption warning);
//! - **Evicted**: a pool lost alive pods the operator did not release;
//! - **Adopted**: pods alive when the calibration started (an operator restart) count as
//!   running, with no σ measured for them.
//!
//! Units are the probe's: ν in clocks per vCPU per market second (the decision's clock: trace
//! seconds at the operator's trace speed, wall seconds on a live market), σ and λ in wall
//! seconds. A job whose spec terms (`bidding.overrides`, `elasticity.stage3Ratio`) change starts
//! again from them.

use std::collections::{BTreeMap, BTreeSet};

use ebbflow_crds::AppModelStatus;
use ebbflow_job::jobmarket::app_model_status;
use k8s_openapi::jiff::Timestamp;

use super::capacity::CapacityView;
use super::plan::PoolKey;
use ebbflow_bidbrain::bidder::probe::{
    CALIBRATION_WEIGHT, Observation, ProbeEvent, ProbeSettings, ThroughputProbe,
};
use ebbflow_bidbrain::bidder::{
    AppModel, Calibrator, Measurement, MeasurementCounts, ThroughputFeed,
};

/// Additions and stalls not over after this many wall seconds are dropped: a real instance
/// boots, pulls its image and loads its data shard in minutes, not the seconds a local run takes.
pub const MAX_WAIT_WALL_SECONDS: f64 = 1800.0;

/// One job's probe and calibrator, and what the operator did to its capacity.
#[derive(Clone, Debug)]
pub struct JobCalibration {
    spec: AppModel,
    probe: ThroughputProbe,
    calibrator: Calibrator,
    created: Timestamp,
    /// Allocations the probe knows per pool, oldest first: (id, instances).
    held: BTreeMap<PoolKey, Vec<(u64, u32)>>,
    /// Released instances per pool whose pods have not gone yet.
    releasing: BTreeMap<PoolKey, u32>,
    /// Alive transient pods per pool at the last sample.
    alive: BTreeMap<PoolKey, u32>,
    /// Pools under notice at the last sample.
    noticed: BTreeSet<PoolKey>,
    /// Transient pods per pool failed by themselves at the last sample.
    failed: BTreeMap<PoolKey, u32>,
    /// Events not yet given to the probe (no coordinator report since).
    events: Vec<ProbeEvent>,
    next_id: u64,
    started: bool,
    /// Pods were alive at the first sample (adopted).
    adopted: bool,
    /// The runtime's count of transient nodes switched in, at the last report.
    added_seen: Option<u64>,
}

impl JobCalibration {
    /// Starts from the spec's terms; `speed` is market seconds per wall second; wall time is
    /// counted from `created` (the job's creation).
    pub fn new(spec: AppModel, speed: f64, created: Timestamp) -> Self {
        let settings = ProbeSettings {
            max_wait_wall_seconds: MAX_WAIT_WALL_SECONDS,
            ..ProbeSettings::new(speed)
        };
        Self {
            calibrator: Calibrator::new(spec.clone(), CALIBRATION_WEIGHT),
            spec,
            probe: ThroughputProbe::new(settings),
            created,
            held: BTreeMap::new(),
            releasing: BTreeMap::new(),
            alive: BTreeMap::new(),
            noticed: BTreeSet::new(),
            failed: BTreeMap::new(),
            events: Vec::new(),
            next_id: 0,
            started: false,
            adopted: false,
            added_seen: None,
        }
    }

    /// The spec's terms this calibration started from.
    pub fn spec(&self) -> &AppModel {
        &self.spec
    }

    /// The current estimate.
    pub fn model(&self) -> &AppModel {
        self.calibrator.model()
    }

    /// What the calibrator has taken into account.
    pub fn counts(&self) -> MeasurementCounts {
        self.calibrator.counts()
    }

    /// The status form of the current estimate; `in_use` says whether decisions use it.
    pub fn status(&self, in_use: bool) -> AppModelStatus {
        app_model_status(&self.calibrator, in_use)
    }

    fn allocation(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    /// Takes the sample of `view`: what changed in the pods since the last one, and the
    /// coordinator's progress if it reported. `reliable_vcpus` is one reliable node's,
    /// `vcpus_of` a pool's per instance. Returns what was measured (already recorded).
    pub fn observe(
        &mut self,
        view: &CapacityView<'_>,
        reliable_vcpus: f64,
        vcpus_of: impl Fn(&PoolKey) -> Option<f64>,
    ) -> Vec<Measurement> {
        if !self.started {
            self.started = true;
            for (pool, &count) in view.alive {
                if count > 0 {
                    let id = self.allocation();
                    self.held.entry(pool.clone()).or_default().push((id, count));
                    self.events.push(ProbeEvent::Adopted { allocation: id });
                    self.adopted = true;
                }
            }
        }
        self.pod_changes(view);

        let Some(report) = view.coordinator else {
            // unreachable: the pod changes wait for a sample
            return Vec::new();
        };
        // A coordinator that reports no progress yet is waiting for its nodes: nothing counts
        // as ready and no clock is done, and capacity bought meanwhile is still switching in.
        let clocks = report.iteration.unwrap_or(0);
        let reliable_nodes = report.reliable_nodes.unwrap_or(0);
        let transient_nodes = report.transient_nodes.unwrap_or(0);
        let (instances, vcpus) = view
            .alive
            .iter()
            .filter_map(|(pool, &count)| vcpus_of(pool).map(|v| (count, v)))
            .fold((0u32, 0.0), |(n, sum), (count, v)| {
                (n + count, sum + f64::from(count) * v)
            });
        let per_transient = if instances > 0 {
            vcpus / f64::from(instances)
        } else {
            reliable_vcpus
        };
        let wall_seconds =
            (view.now.as_millisecond() - self.created.as_millisecond()).max(0) as f64 / 1000.0;
        // Joins since the last report; at the first one, every join so far unless the pods were
        // adopted (their nodes joined before this calibration started).
        let joined = report.transient_nodes_added.map(|added| {
            let seen = self
                .added_seen
                .unwrap_or(if self.adopted { added } else { 0 });
            self.added_seen = Some(added);
            // a smaller count is a restarted coordinator: nothing known joined
            u32::try_from(added.saturating_sub(seen)).unwrap_or(u32::MAX)
        });
        let observation = Observation {
            joined,
            wall_seconds,
            clocks,
            rollbacks: report.rollbacks,
            stage: report.stage.unwrap_or(1),
            reliable_nodes,
            transient_nodes,
            reliable_vcpus: f64::from(reliable_nodes) * reliable_vcpus,
            transient_vcpus: f64::from(transient_nodes) * per_transient,
        };
        let events = std::mem::take(&mut self.events);
        let measured = self.probe.observe(&observation, &events);
        for measurement in &measured {
            self.calibrator.record(*measurement);
        }
        measured
    }

    /// Notices and pods gone since the last sample.
    fn pod_changes(&mut self, view: &CapacityView<'_>) {
        for pool in view.pools_under_notice.difference(&self.noticed) {
            for &(allocation, _) in self.held.get(pool).into_iter().flatten() {
                self.events.push(ProbeEvent::Notice { allocation });
            }
        }
        self.noticed = view.pools_under_notice.clone();
        let pools: BTreeSet<PoolKey> = self
            .alive
            .keys()
            .chain(view.alive.keys())
            .cloned()
            .collect();
        for pool in pools {
            let before = self.alive.get(&pool).copied().unwrap_or(0);
            let now = view.alive.get(&pool).copied().unwrap_or(0);
            let mut gone = before.saturating_sub(now);
            // pods that failed by themselves since (a crash, an OOMKill) are not the market's
            // doing: no eviction for the application model
            let failed_before = self.failed.get(&pool).copied().unwrap_or(0);
            let failed_now = view.failed.get(&pool).copied().unwrap_or(0);
            gone -= gone.min(failed_now.saturating_sub(failed_before));
            let releasing = self.releasing.entry(pool.clone()).or_default();
            let released = gone.min(*releasing);
            *releasing -= released;
            gone -= released;
            if now == 0 {
                // nothing of the pool is left to release
                *releasing = 0;
            }
            if gone > 0 {
                let held = self.held.entry(pool.clone()).or_default();
                while gone > 0 && !held.is_empty() {
                    let (allocation, count) = &mut held[0];
                    self.events.push(ProbeEvent::Evicted {
                        allocation: *allocation,
                    });
                    let taken = gone.min(*count);
                    *count -= taken;
                    gone -= taken;
                    if *count == 0 {
                        held.remove(0);
                    }
                }
            }
        }
        self.releasing.retain(|_, count| *count > 0);
        self.held.retain(|_, held| !held.is_empty());
        self.alive = view.alive.clone();
        self.failed = view.failed.clone();
    }

    /// Takes the decision's pool counts: raises become acquisitions dated at the last sample,
    /// cuts release the newest allocations first.
    pub fn decided(&mut self, counts: &BTreeMap<PoolKey, u32>) {
        let mut events = Vec::new();
        let pools: BTreeSet<PoolKey> = self.held.keys().chain(counts.keys()).cloned().collect();
        for pool in pools {
            let want = counts.get(&pool).copied().unwrap_or(0);
            let have: u32 = self
                .held
                .get(&pool)
                .map_or(0, |held| held.iter().map(|(_, n)| n).sum());
            if want > have {
                let allocation = self.allocation();
                self.held
                    .entry(pool.clone())
                    .or_default()
                    .push((allocation, want - have));
                events.push(ProbeEvent::Acquired {
                    allocation,
                    count: want - have,
                });
            } else if want < have {
                let mut cut = have - want;
                *self.releasing.entry(pool.clone()).or_default() += cut;
                let held = self.held.entry(pool.clone()).or_default();
                while cut > 0 {
                    let Some((allocation, count)) = held.last_mut() else {
                        break;
                    };
                    let taken = cut.min(*count);
                    *count -= taken;
                    cut -= taken;
                    if *count == 0 {
                        events.push(ProbeEvent::Released {
                            allocation: *allocation,
                        });
                        held.pop();
                    } else {
                        events.push(ProbeEvent::Shrunk {
                            allocation: *allocation,
                            count: taken,
                        });
                    }
                }
            }
        }
        self.held.retain(|_, held| !held.is_empty());
        // dated at the decision's own sample, or at the first one if there is none yet
        if !self.probe.events_at_last(&events) {
            self.events.extend(events);
        }
    }
}

#[cfg(test)]
mod tests {
    use ebbflow_crds::CapacityType;
    use k8s_openapi::jiff::SignedDuration;

    use super::*;
    use crate::coordinator::CoordinatorStatus;

    fn pool(zone: &str) -> PoolKey {
        PoolKey::new("p3.2xlarge", zone, CapacityType::Spot)
    }

    /// A job sampled by the test: pods per pool, notices, the coordinator's progress.
    struct Job {
        calibration: JobCalibration,
        job: ebbflow_crds::TrainingJob,
        now: Timestamp,
        alive: BTreeMap<PoolKey, u32>,
        noticed: BTreeSet<PoolKey>,
        failed: BTreeMap<PoolKey, u32>,
        report: CoordinatorStatus,
        reachable: bool,
        measured: Vec<Measurement>,
    }

    impl Job {
        fn new() -> Self {
            let created: Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
            Self {
                calibration: JobCalibration::new(AppModel::default(), 1.0, created),
                job: ebbflow_crds::TrainingJob::test("mf"),
                now: created,
                alive: BTreeMap::new(),
                noticed: BTreeSet::new(),
                failed: BTreeMap::new(),
                report: CoordinatorStatus {
                    stage: Some(1),
                    iteration: Some(0),
                    reliable_nodes: Some(1),
                    transient_nodes: Some(0),
                    ..CoordinatorStatus::default()
                },
                reachable: true,
                measured: Vec::new(),
            }
        }

        /// `seconds` later with `clocks` more progress; the bidder then decides `decision`.
        fn step(&mut self, seconds: i64, clocks: u64, decision: &[(PoolKey, u32)]) -> &mut Self {
            self.now += SignedDuration::from_secs(seconds);
            if let Some(iteration) = self.report.iteration.as_mut() {
                *iteration += clocks;
            }
            let view = CapacityView {
                job: &self.job,
                alive: &self.alive,
                launched: &BTreeMap::new(),
                bids: &BTreeMap::new(),
                pools_under_notice: &self.noticed,
                failed: &self.failed,
                unplaceable: &BTreeSet::new(),
                coordinator: self.reachable.then_some(&self.report),
                now: self.now,
            };
            let measured = self.calibration.observe(&view, 8.0, |_| Some(8.0));
            self.measured.extend(measured);
            self.calibration
                .decided(&decision.iter().cloned().collect::<BTreeMap<_, _>>());
            self
        }

        /// A job training with two pods in `pool` for two samples.
        fn with_two_pods_in(pool: &PoolKey) -> Self {
            let mut job = Self::new();
            job.alive.insert(pool.clone(), 2);
            job.report.transient_nodes = Some(2);
            job.step(10, 5, &[(pool.clone(), 2)]);
            job.step(10, 5, &[(pool.clone(), 2)]);
            job
        }

        fn delays(&self) -> Vec<Measurement> {
            ebbflow_bidbrain::bidder::probe::delays(&self.measured)
        }
    }

    #[test]
    fn a_pool_raise_is_measured_until_the_runtime_counts_its_nodes() {
        let mut job = Job::new();
        let a = pool("us-east-1a");
        job.step(1, 0, &[(a.clone(), 2)]);
        // pods appear at once, the runtime counts them 90 s after the decision
        job.alive.insert(a.clone(), 2);
        job.step(30, 30, &[(a.clone(), 2)]);
        job.step(30, 30, &[(a.clone(), 2)]);
        job.report.transient_nodes = Some(2);
        job.step(30, 30, &[(a.clone(), 2)]);
        assert_eq!(
            job.delays(),
            [Measurement::Addition { seconds: 90.0 }],
            "{:?}",
            job.measured
        );
        assert_eq!(job.calibration.counts().additions, 1);
        // σ moved from the spec's 60 s towards 90 s
        assert!(job.calibration.model().sigma_seconds > 60.0);
    }

    #[test]
    fn a_pool_move_is_measured_by_the_runtimes_count_of_joins() {
        let mut job = Job::new();
        let a = pool("us-east-1a");
        let b = pool("us-east-1b");
        job.report.transient_nodes_added = Some(0);
        job.step(10, 5, &[(a.clone(), 2)]);
        job.alive.insert(a.clone(), 2);
        job.report.transient_nodes = Some(2);
        job.report.transient_nodes_added = Some(2);
        job.step(10, 5, &[(a.clone(), 2)]);
        assert_eq!(job.delays(), [Measurement::Addition { seconds: 10.0 }]);
        // the bidder moves to pool b; by the next sample a's nodes left and b's joined: the
        // ready count did not change, the count of joins did
        job.step(10, 5, &[(b.clone(), 2)]);
        job.alive.remove(&a);
        job.alive.insert(b.clone(), 2);
        job.report.transient_nodes_added = Some(4);
        job.step(15, 5, &[(b.clone(), 2)]);
        assert_eq!(
            job.delays(),
            [
                Measurement::Addition { seconds: 10.0 },
                Measurement::Addition { seconds: 15.0 }
            ]
        );
        assert_eq!(
            job.calibration.counts().evictions,
            0,
            "a release, no eviction"
        );
    }

    #[test]
    fn steady_progress_measures_nu_in_clocks_per_vcpu_second() {
        let mut job = Job::new();
        // one reliable node of 8 vCPUs, 4 clocks every 10 s: 0.05 clocks per vCPU-second
        for _ in 0..12 {
            job.step(10, 4, &[]);
        }
        let nu = job.calibration.model().nu_per_vcpu_second;
        assert!((nu - 0.05).abs() < 1e-9, "ν {nu}");
        let status = job.calibration.status(true);
        assert!(status.steady_intervals > 0 && status.in_use);
    }

    #[test]
    fn an_eviction_with_notice_is_a_stall_and_a_release_is_not() {
        let mut job = Job::new();
        let a = pool("us-east-1a");
        let b = pool("us-east-1b");
        job.alive.insert(a.clone(), 2);
        job.alive.insert(b.clone(), 1);
        job.report.transient_nodes = Some(3);
        // adopted at the first sample: no σ
        job.step(10, 5, &[(a.clone(), 2), (b.clone(), 1)]);
        job.step(10, 5, &[(a.clone(), 2), (b.clone(), 1)]);
        // the bidder releases b; its pod goes, the runtime drops it: no stall
        job.step(10, 5, &[(a.clone(), 2)]);
        job.alive.remove(&b);
        job.report.transient_nodes = Some(2);
        job.step(10, 5, &[(a.clone(), 2)]);
        job.step(10, 5, &[(a.clone(), 2)]);
        assert!(job.delays().is_empty(), "{:?}", job.delays());
        // pool a gets a notice; 20 s later the runtime has dropped its nodes, progress resumes
        // past the drop another 20 s after that
        job.noticed.insert(a.clone());
        job.step(10, 5, &[(a.clone(), 2)]);
        job.alive.remove(&a);
        job.noticed.clear();
        job.report.transient_nodes = Some(0);
        job.step(20, 0, &[]);
        job.step(20, 3, &[]);
        assert_eq!(job.delays(), [Measurement::Eviction { seconds: 40.0 }]);
        // after the release, the pods that went were released ones, not evictions
        assert_eq!(job.calibration.counts().evictions, 1);
    }

    #[test]
    fn pods_lost_without_a_release_or_notice_are_evictions() {
        let a = pool("us-east-1a");
        let mut job = Job::with_two_pods_in(&a);
        // one of two pods gone, unasked: the runtime rolls back and redoes 5 clocks in 30 s
        job.alive.insert(a.clone(), 1);
        job.report.transient_nodes = Some(1);
        job.report.rollbacks = 1;
        *job.report.iteration.as_mut().unwrap() -= 5;
        job.step(10, 0, &[(a.clone(), 2)]);
        job.step(30, 6, &[(a.clone(), 2)]);
        assert_eq!(job.delays(), [Measurement::Eviction { seconds: 30.0 }]);
    }

    /// A pod that crashed (or was OOMKilled, or refused at admission) left for the runtime's
    /// reasons: the operator replaces it, and the application model sees no eviction.
    #[test]
    fn pods_that_failed_by_themselves_are_no_evictions() {
        let a = pool("us-east-1a");
        let mut job = Job::with_two_pods_in(&a);
        // one of the two pods crashed: listed as failed, no longer alive
        job.alive.insert(a.clone(), 1);
        job.failed.insert(a.clone(), 1);
        job.report.transient_nodes = Some(1);
        job.step(10, 5, &[(a.clone(), 2)]);
        // it is deleted (replaced): no longer listed at all
        job.failed.clear();
        job.step(10, 5, &[(a.clone(), 2)]);
        job.step(10, 5, &[(a.clone(), 2)]);
        assert_eq!(job.calibration.counts().evictions, 0);
        assert!(job.delays().is_empty(), "{:?}", job.delays());
        // the same loss without the failure is an eviction
        job.alive.insert(a.clone(), 0);
        job.report.transient_nodes = Some(0);
        job.step(10, 0, &[]);
        job.step(30, 6, &[]);
        assert_eq!(job.calibration.counts().evictions, 1);
    }

    #[test]
    fn capacity_bought_before_training_starts_is_timed_from_its_decision() {
        let mut job = Job::new();
        let a = pool("us-east-1a");
        // the coordinator answers but waits for its nodes: no progress reported
        job.report = CoordinatorStatus::default();
        job.step(5, 0, &[(a.clone(), 2)]);
        job.alive.insert(a.clone(), 2);
        job.step(5, 0, &[(a.clone(), 2)]);
        assert!(job.measured.is_empty());
        // training starts with both nodes switched in as initial members
        job.report = CoordinatorStatus {
            stage: Some(2),
            iteration: Some(0),
            reliable_nodes: Some(1),
            transient_nodes: Some(2),
            transient_nodes_added: Some(2),
            ..CoordinatorStatus::default()
        };
        job.step(5, 0, &[(a.clone(), 2)]);
        assert_eq!(job.delays(), [Measurement::Addition { seconds: 10.0 }]);
    }

    #[test]
    fn an_unreachable_coordinator_is_no_sample() {
        let mut job = Job::new();
        let a = pool("us-east-1a");
        job.reachable = false;
        job.step(5, 0, &[(a.clone(), 1)]);
        job.alive.insert(a.clone(), 1);
        job.step(5, 0, &[(a.clone(), 1)]);
        assert!(job.measured.is_empty());
        job.reachable = true;
        job.step(5, 1, &[(a.clone(), 1)]);
        job.report.transient_nodes = Some(1);
        job.step(5, 1, &[(a.clone(), 1)]);
        // the acquisition is dated at the first sample, when the probe saw it
        assert_eq!(job.delays(), [Measurement::Addition { seconds: 5.0 }]);
    }
}
