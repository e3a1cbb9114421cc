//! What a job costs in the cluster: each runtime pod is one instance, charged under the job's
//! billing model ([`ebbflow_bidbrain::billing::Meter`]) at its market's prices from the pod's start
//! (`status.startTime`: a pod still pending runs on nothing yet) until it is gone or has
//! finished. This is the same accounting `ebbflow run` and `ebbflow simulate` do over their
//! allocations, so `status.cost` and the bidder's expectations agree.
//!
//! - Reliable pods are charged the reliable tier's on-demand price; transient pods their pool's
//!   price (spot: the market's price in force in each of the market's time steps; a step with
//!   no buyable price keeps the last one; on-demand: the pool's on-demand price).
//! - How an instance ended decides its refund: a spot pod whose notice came from the provider
//!   (an interruption taint, EC2's interruption warning, its Node gone) was evicted; any other
//!   pod that goes while the job runs was released; pods that go once the job is over end with
//!   the job (pro rata, as in the paper's accounting).
//! - Market time: a replayed trace runs from the job's creation at the planner's trace speed, a
//!   live market at wall time ([`MarketClock`]).
//! - A running instance's charge is a function of its start, the prices and now, so only the
//!   ended instances' totals need keeping: they are in `status.cost.ended*`, and a restarted
//!   operator carries on from them. An instance that ended while no operator ran is not charged
//!   (nobody saw how long it ran).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use ebbflow_crds::{CapacityType, CostStatus};
use k8s_openapi::jiff::Timestamp;

use super::plan::{ObservedPod, PoolKey, Tier};
use crate::notices::NoticeSource;
use ebbflow_bidbrain::billing::{EndReason, Meter};
use ebbflow_job::jobmarket::MarketSetup;

/// How a decision's wall-clock time maps onto the market's time.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum MarketClock {
    /// A trace replayed from the setup's start slot at the job's creation, `speed` trace
    /// seconds per wall second.
    Replay {
        /// Trace seconds per wall second.
        speed: f64,
    },
    /// A live market: market time is wall time (decisions after the grid's last slot read it).
    Wall,
}

impl MarketClock {
    /// Market seconds per wall second.
    pub fn speed(self) -> f64 {
        match self {
            Self::Replay { speed } => speed,
            Self::Wall => 1.0,
        }
    }
}

/// The market time at wall time `at` of a job created at `created`: a replayed trace starts at
/// the setup's start slot at the job's creation and runs at its clock's speed; a live market's
/// time is wall time.
pub fn market_time(
    setup: &MarketSetup,
    clock: MarketClock,
    created: Timestamp,
    at: Timestamp,
) -> ebbflow_bidbrain::market::Timestamp {
    match clock {
        MarketClock::Replay { speed } => {
            setup.grid.time(setup.start_slot)
                + (seconds_between(created, at).max(0.0) * speed) as i64
        }
        MarketClock::Wall => at.as_second(),
    }
}

/// Seconds from `from` to `to` (negative when `to` is earlier).
pub(crate) fn seconds_between(from: Timestamp, to: Timestamp) -> f64 {
    (to.as_millisecond() - from.as_millisecond()) as f64 / 1000.0
}

/// A job's market as the ledger prices it.
#[derive(Clone)]
pub struct Pricing {
    /// The market (prices per pool and time step, reliable tier, billing model).
    pub setup: Arc<MarketSetup>,
    /// How wall time maps onto the market's time.
    pub clock: MarketClock,
    /// The job's creation (where a replayed trace starts).
    pub created: Timestamp,
}

impl Pricing {
    fn time(&self, at: Timestamp) -> i64 {
        market_time(&self.setup, self.clock, self.created, at)
    }

    /// The pool's index in the market's grid.
    fn pool_index(&self, key: &PoolKey) -> Option<usize> {
        self.setup
            .grid
            .pools
            .iter()
            .position(|p| p.id.instance_type == key.0.instance_type && p.id.zone == key.0.zone)
    }

    /// USD per instance-hour charged for an instance of `pool` at `at` (`None`: the market
    /// quotes no price for it then).
    pub fn price_at(&self, pool: &PoolKey, at: Timestamp) -> Option<f64> {
        let slot = self.setup.grid.slot_at(self.time(at));
        self.price(&Priced::Pool(pool.clone()), slot).0
    }

    /// USD per hour charged for `what` during step `slot` (`None`: the market gives none then)
    /// and the on-demand price of the same instance.
    fn price(&self, what: &Priced, slot: usize) -> (Option<f64>, Option<f64>) {
        match what {
            Priced::Reliable => {
                let usd = self.setup.reliable.usd_hr;
                (Some(usd), Some(usd))
            }
            Priced::Pool(key) => {
                // Looked up at every charge: the market's pools are rebuilt when the spec's
                // pools change (an index kept from before charged another pool, or was out of
                // range).
                let Some(index) = self.pool_index(key) else {
                    return (None, None);
                };
                let on_demand = self.setup.grid.pools[index].on_demand_usd_hr;
                match key.0.capacity_type {
                    CapacityType::Spot => (self.setup.grid.price(index, slot), on_demand),
                    CapacityType::OnDemand => (on_demand, on_demand),
                }
            }
        }
    }
}

/// What an instance is charged as.
#[derive(Clone, Debug, PartialEq)]
enum Priced {
    /// A reliable-tier node.
    Reliable,
    /// A node of this pool of the market.
    Pool(PoolKey),
}

/// One running instance's meter.
#[derive(Clone, Debug)]
struct Running {
    priced: Priced,
    meter: Meter,
    /// Market time charged up to.
    accrued_to: i64,
    /// On-demand USD of the time charged so far.
    on_demand_usd: f64,
    /// The last price charged (for a step the market gives none, and for the free compute).
    last_price: f64,
    /// The provider announced it takes the instance back.
    evicted: bool,
    /// Market time the instance stopped running by, if known: its container's end, or the
    /// provider's deadline for taking it back. A gone instance is charged up to it, not up to
    /// when the operator noticed (which could push an interruption in its first hour past it).
    ended_by: Option<i64>,
}

impl Running {
    fn is_spot(&self) -> bool {
        matches!(&self.priced, Priced::Pool(key) if key.0.capacity_type == CapacityType::Spot)
    }

    /// What `pod`'s status and notice say about this instance's end.
    fn note_end(&mut self, pod: &ObservedPod<'_>, pricing: &Pricing) {
        let reclaimed = pod.notice.filter(|n| provider_reclaims(n.source));
        if reclaimed.is_some() && self.is_spot() {
            self.evicted = true;
        }
        let finished = pod
            .finished
            .then(|| super::plan::pod_failure(pod.pod).and_then(|f| f.at))
            .flatten();
        for end in [finished, reclaimed.map(|n| n.leaves_at)]
            .into_iter()
            .flatten()
        {
            let end = pricing.time(end);
            self.ended_by = Some(self.ended_by.map_or(end, |by| by.min(end)));
        }
    }
}

impl Running {
    /// Charges up to market time `to`, one market time step at a time.
    fn accrue(&mut self, pricing: &Pricing, to: i64) {
        let grid = &pricing.setup.grid;
        while self.accrued_to < to {
            let slot = pricing.setup.grid.slot_at(self.accrued_to);
            let step_end = if slot + 1 < grid.slots {
                grid.time(slot + 1).max(self.accrued_to + 1)
            } else {
                to
            };
            let until = step_end.min(to);
            let (price, on_demand) = pricing.price(&self.priced, slot);
            let price = price.unwrap_or(self.last_price);
            let hours = (until - self.accrued_to) as f64 / 3600.0;
            self.meter.advance(until, price);
            self.on_demand_usd += on_demand.unwrap_or(price) * hours;
            self.last_price = price;
            self.accrued_to = until;
        }
    }
}

/// USD totals.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Totals {
    spent: f64,
    free_compute: f64,
    on_demand_equivalent: f64,
}

/// One job's instances and what they cost (see the module docs).
#[derive(Clone, Debug, Default)]
pub struct CostLedger {
    running: BTreeMap<String, Running>,
    ended: Totals,
    /// Whether `ended` was taken from the job's status yet.
    loaded: bool,
}

/// Sources that mean the provider takes a spot instance back (a refund may apply), as opposed
/// to a release, a maintenance drain or a recommendation.
fn provider_reclaims(source: NoticeSource) -> bool {
    matches!(
        source,
        NoticeSource::AwsNodeTerminationHandler
            | NoticeSource::GkeTermination
            | NoticeSource::NodeGone
            | NoticeSource::Ec2SpotInterruption
    )
}

impl CostLedger {
    /// USD per wall-clock second the running instances are charged at their last prices (a
    /// replayed trace's seconds pass `speed` times faster).
    pub fn spend_rate(&self, pricing: &Pricing) -> f64 {
        let usd_per_market_hour: f64 = self.running.values().map(|r| r.last_price).sum();
        usd_per_market_hour / 3600.0 * pricing.clock.speed()
    }

    /// Charges the job's `pods` up to `now` on `pricing` and returns the job's cost. `previous`
    /// is the job's last status cost (its ended totals are taken on the first call); `job_over`
    /// says the job has ended, so instances that go now end with it.
    pub fn observe(
        &mut self,
        pricing: &Pricing,
        pods: &[ObservedPod<'_>],
        job_over: bool,
        now: Timestamp,
        previous: Option<&CostStatus>,
    ) -> CostStatus {
        if !self.loaded {
            if let Some(previous) = previous {
                self.ended = Totals {
                    spent: previous.ended_spent,
                    free_compute: previous.ended_free_compute,
                    on_demand_equivalent: previous.ended_on_demand_equivalent,
                };
            }
            self.loaded = true;
        }
        let now_m = pricing.time(now);
        let mut unpriced = Vec::new();
        let mut seen = BTreeSet::new();
        for pod in pods {
            // When the kubelet took the pod; a running pod without it (a simulated kubelet),
            // from its creation.
            let status = pod.pod.status.as_ref();
            let running = status.and_then(|s| s.phase.as_deref()) == Some("Running");
            let started = status
                .and_then(|s| s.start_time.as_ref())
                .or_else(|| {
                    running
                        .then_some(pod.pod.metadata.creation_timestamp.as_ref())
                        .flatten()
                })
                .map(|t| t.0);
            // A pod first seen finished, or under the provider's notice, still gets its
            // eviction's refund and ends when it ended (the check came after the skip below).
            if let Some(running) = self.running.get_mut(pod.name) {
                running.note_end(pod, pricing);
            }
            let Some(started) = started else {
                continue;
            };
            if pod.finished {
                continue;
            }
            let priced = match (pod.tier, &pod.pool) {
                (Tier::Reliable, _) => Some(Priced::Reliable),
                (Tier::Transient, Some(key)) => {
                    pricing.pool_index(key).map(|_| Priced::Pool(key.clone()))
                }
                (Tier::Transient, None) => None,
            };
            let Some(priced) = priced else {
                unpriced.push(pod.name.to_owned());
                continue;
            };
            seen.insert(pod.name.to_owned());
            // An instance seen before was noted above; a new one is noted as it starts.
            if let std::collections::btree_map::Entry::Vacant(slot) =
                self.running.entry(pod.name.to_owned())
            {
                let from = pricing.time(started).min(now_m);
                slot.insert(Running {
                    priced: priced.clone(),
                    meter: Meter::new(pricing.setup.billing, from),
                    accrued_to: from,
                    on_demand_usd: 0.0,
                    last_price: 0.0,
                    evicted: false,
                    ended_by: None,
                })
                .note_end(pod, pricing);
            }
        }
        let gone: Vec<String> = self
            .running
            .keys()
            .filter(|name| !seen.contains(*name))
            .cloned()
            .collect();
        for (name, running) in &mut self.running {
            // A gone instance is charged up to when it stopped, if that is known, and a spot
            // instance the provider takes back up to its deadline (its pod may linger, listed,
            // after the instance is gone).
            let to = match running.ended_by {
                Some(by) if running.evicted || gone.contains(name) => {
                    by.clamp(running.accrued_to, now_m)
                }
                _ => now_m,
            };
            running.accrue(pricing, to);
        }
        for name in gone {
            let Some(running) = self.running.remove(&name) else {
                continue;
            };
            let reason = if running.evicted {
                EndReason::Evicted
            } else if job_over {
                EndReason::JobFinished
            } else {
                EndReason::Released
            };
            let charge = running.meter.finish(reason);
            self.ended.spent += charge.usd;
            self.ended.free_compute += charge.free_seconds / 3600.0 * running.last_price;
            self.ended.on_demand_equivalent += running.on_demand_usd;
        }
        let live = self
            .running
            .values()
            .fold(Totals::default(), |sum, running| Totals {
                spent: sum.spent + running.meter.accrued_usd(),
                free_compute: sum.free_compute,
                on_demand_equivalent: sum.on_demand_equivalent + running.on_demand_usd,
            });
        CostStatus {
            spent: self.ended.spent + live.spent,
            free_compute: self.ended.free_compute,
            on_demand_equivalent: self.ended.on_demand_equivalent + live.on_demand_equivalent,
            ended_spent: self.ended.spent,
            ended_free_compute: self.ended.free_compute,
            ended_on_demand_equivalent: self.ended.on_demand_equivalent,
            unpriced,
        }
    }
}

#[cfg(test)]
mod tests {
    use ebbflow_crds::{BillingModel, TrainingJob};
    use k8s_openapi::api::core::v1::Pod;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use super::*;
    use crate::controller::plan::{
        CAPACITY_TYPE_ANNOTATION, INSTANCE_TYPE_ANNOTATION, TIER_LABEL, ZONE_ANNOTATION,
        observe_pods,
    };
    use crate::notices::Notice;
    use crate::test_data::spot_data;
    use ebbflow_job::jobmarket::setup_market;

    const P3: &str = "aws_p3.2xlarge_availability_price_9az_2023-02-15_to_03-09.csv";
    const CREATED: &str = "2026-11-23T10:00:00Z";

    fn job(billing: BillingModel) -> TrainingJob {
        let mut job = TrainingJob::test("mf")
            .with_transient_range(0, 4)
            .with_trace(P3)
            .with_billing_model(billing);
        job.spec.bidding.market.trace_start = Some(Time("2023-02-20T00:00:00Z".parse().unwrap()));
        job.metadata.creation_timestamp = Some(Time(CREATED.parse().unwrap()));
        job
    }

    fn pricing(job: &TrainingJob) -> Pricing {
        Pricing {
            setup: Arc::new(setup_market(job, &spot_data()).expect("the p3 trace loads")),
            clock: MarketClock::Replay { speed: 1.0 },
            created: CREATED.parse().unwrap(),
        }
    }

    fn at(seconds: i64) -> Timestamp {
        let created: Timestamp = CREATED.parse().unwrap();
        Timestamp::from_second(created.as_second() + seconds).unwrap()
    }

    /// A runtime pod started `started` seconds after the job's creation (`None`: pending).
    fn pod(name: &str, pool: Option<(&str, &str)>, started: Option<i64>) -> Pod {
        let tier = if pool.is_some() {
            "transient"
        } else {
            "reliable"
        };
        let mut annotations = serde_json::Map::new();
        if let Some((instance_type, zone)) = pool {
            annotations.insert(INSTANCE_TYPE_ANNOTATION.into(), instance_type.into());
            annotations.insert(ZONE_ANNOTATION.into(), zone.into());
            annotations.insert(CAPACITY_TYPE_ANNOTATION.into(), "spot".into());
        }
        serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": name,
                "labels": { TIER_LABEL: tier },
                "annotations": annotations,
            },
            "status": started.map(|s| serde_json::json!({
                "phase": "Running",
                "startTime": at(s).to_string(),
            })),
        }))
        .unwrap()
    }

    /// A zone of the p3 trace whose spot pool is buyable from the job's start for `hours`.
    fn buyable_zone(pricing: &Pricing, hours: i64) -> (usize, String) {
        let start = pricing.time(at(0));
        let end = pricing.time(at(hours * 3600));
        let grid = &pricing.setup.grid;
        (0..grid.pools.len())
            .find(|&p| {
                (pricing.setup.grid.slot_at(start)..=pricing.setup.grid.slot_at(end))
                    .all(|s| grid.price(p, s).is_some())
            })
            .map(|p| (p, grid.pools[p].id.zone.clone()))
            .expect("a p3 pool with capacity for the hours asked")
    }

    /// USD of one spot instance of `pool` over market times [from, to), step by step.
    fn spot_usd(pricing: &Pricing, pool: usize, from: i64, to: i64) -> f64 {
        let grid = &pricing.setup.grid;
        let mut usd = 0.0;
        let mut t = from;
        while t < to {
            let slot = pricing.setup.grid.slot_at(t);
            let end = grid.time(slot + 1).min(to);
            usd += grid.price(pool, slot).unwrap() * (end - t) as f64 / 3600.0;
            t = end;
        }
        usd
    }

    fn observe(
        ledger: &mut CostLedger,
        pricing: &Pricing,
        pods: &[Pod],
        notices: &[Notice],
        now: Timestamp,
        previous: Option<&CostStatus>,
    ) -> CostStatus {
        let observed = observe_pods("mf", pods, notices);
        ledger.observe(pricing, &observed, false, now, previous)
    }

    #[test]
    fn pods_are_charged_their_pools_trace_prices_and_a_restart_keeps_the_ended_ones() {
        let job = job(BillingModel::Aws);
        let pricing = pricing(&job);
        let (pool, zone) = buyable_zone(&pricing, 3);
        let reliable_usd = pricing.setup.reliable.usd_hr;
        let on_demand = pricing.setup.grid.pools[pool].on_demand_usd_hr.unwrap();
        let spot = pod("mf-t-0", Some(("p3.2xlarge", &zone)), Some(600));
        let pods = vec![pod("mf-r-0", None, Some(0)), spot.clone()];
        let mut ledger = CostLedger::default();
        let two_hours = observe(&mut ledger, &pricing, &pods, &[], at(7200), None);
        let spot_two = spot_usd(
            &pricing,
            pool,
            pricing.time(at(600)),
            pricing.time(at(7200)),
        );
        let expected = 2.0 * reliable_usd + spot_two;
        assert!(
            (two_hours.spent - expected).abs() < 1e-9,
            "{two_hours:?}, expected {expected}"
        );
        assert!(spot_two > 0.0 && spot_two < on_demand * 6600.0 / 3600.0);
        let equivalent = 2.0 * reliable_usd + on_demand * 6600.0 / 3600.0;
        assert!((two_hours.on_demand_equivalent - equivalent).abs() < 1e-9);
        assert_eq!(two_hours.ended_spent, 0.0);
        assert!(two_hours.unpriced.is_empty());

        // The spot pod is released at 3 h: its charge ends there and is kept as ended.
        let three_hours = observe(&mut ledger, &pricing, &pods, &[], at(10_800), None);
        let reliable_only = vec![pod("mf-r-0", None, Some(0))];
        let released = observe(&mut ledger, &pricing, &reliable_only, &[], at(10_800), None);
        let spot_three = spot_usd(
            &pricing,
            pool,
            pricing.time(at(600)),
            pricing.time(at(10_800)),
        );
        assert!(
            (released.ended_spent - spot_three).abs() < 1e-9,
            "{released:?}"
        );
        assert!((released.spent - three_hours.spent).abs() < 1e-9);

        // A restarted operator (a fresh ledger) carries on from the status.
        let later = observe(&mut ledger, &pricing, &reliable_only, &[], at(14_400), None);
        let mut restarted = CostLedger::default();
        let again = observe(
            &mut restarted,
            &pricing,
            &reliable_only,
            &[],
            at(14_400),
            Some(&released),
        );
        assert!(
            (again.spent - later.spent).abs() < 1e-9,
            "{again:?} vs {later:?}"
        );
        assert!((again.spent - (4.0 * reliable_usd + spot_three)).abs() < 1e-9);
    }

    #[test]
    fn an_evicted_spot_pod_gets_its_billing_models_refund() {
        for (billing, ran, charged_hours) in [
            // aws: interrupted within its first hour, it is free
            (BillingModel::Aws, 1800, 0.0),
            // aws-hourly-2016: the evicted partial hour is free, the full hour is not
            (BillingModel::AwsHourly2016, 5400, 1.0),
        ] {
            let job = job(billing);
            let pricing = pricing(&job);
            let (pool, zone) = buyable_zone(&pricing, 2);
            let spot = pod("mf-t-0", Some(("p3.2xlarge", &zone)), Some(0));
            let notice = Notice {
                pod: "mf-t-0".into(),
                node: Some("n".into()),
                leaves_at: at(ran),
                source: NoticeSource::Ec2SpotInterruption,
            };
            let mut ledger = CostLedger::default();
            let noticed = observe(
                &mut ledger,
                &pricing,
                std::slice::from_ref(&spot),
                std::slice::from_ref(&notice),
                at(ran - 60),
                None,
            );
            assert!(noticed.spent > 0.0, "{billing:?}: {noticed:?}");
            let gone = observe(&mut ledger, &pricing, &[], &[], at(ran), None);
            let hourly_price = |hour: i64| {
                let t = pricing.time(at(hour * 3600));
                pricing
                    .setup
                    .grid
                    .price(pool, pricing.setup.grid.slot_at(t))
                    .unwrap()
            };
            let expected = if charged_hours > 0.0 {
                hourly_price(0)
            } else {
                0.0
            };
            assert!(
                (gone.spent - expected).abs() < 1e-9,
                "{billing:?}: {gone:?}, expected {expected}"
            );
            assert!(gone.free_compute > 0.0, "{billing:?}: {gone:?}");

            // The same pod released (no provider notice) pays: per second, or the whole hour.
            let mut ledger = CostLedger::default();
            observe(
                &mut ledger,
                &pricing,
                std::slice::from_ref(&spot),
                &[],
                at(ran - 60),
                None,
            );
            let released = observe(&mut ledger, &pricing, &[], &[], at(ran), None);
            assert!(released.spent > gone.spent, "{billing:?}: {released:?}");
            assert_eq!(released.free_compute, 0.0);

            // Under NTH's scheduled-maintenance or ASG-lifecycle taint the instance goes, but
            // the spot market did not take it back: no refund, it pays as released.
            let maintenance = Notice {
                source: NoticeSource::AwsMaintenance,
                ..notice.clone()
            };
            let mut ledger = CostLedger::default();
            observe(
                &mut ledger,
                &pricing,
                std::slice::from_ref(&spot),
                std::slice::from_ref(&maintenance),
                at(ran - 60),
                None,
            );
            let retired = observe(&mut ledger, &pricing, &[], &[], at(ran), None);
            assert!(
                (retired.spent - released.spent).abs() < 1e-9,
                "{billing:?}: {retired:?} vs {released:?}"
            );
            assert_eq!(retired.free_compute, 0.0);
        }
    }

    /// The refund holds however the operator learns of the interruption: from a pod first
    /// seen already Failed under the provider's notice, or from a pod that vanished minutes
    /// after the provider's deadline (charged up to the deadline, not to when it was noticed:
    /// an interruption at 59 min seen at 61 min is still in the first hour).
    #[test]
    fn an_interruption_noticed_late_is_still_refunded_up_to_its_deadline() {
        let job = job(BillingModel::Aws);
        let pricing = pricing(&job);
        let (_, zone) = buyable_zone(&pricing, 2);
        let spot = pod("mf-t-0", Some(("p3.2xlarge", &zone)), Some(0));
        let notice = |leaves_at: i64| Notice {
            pod: "mf-t-0".into(),
            node: Some("n".into()),
            leaves_at: at(leaves_at),
            source: NoticeSource::NodeGone,
        };
        // running at 39 min, no notice yet; at 40 min Failed with its node gone
        let mut ledger = CostLedger::default();
        observe(
            &mut ledger,
            &pricing,
            std::slice::from_ref(&spot),
            &[],
            at(2340),
            None,
        );
        let mut failed = spot.clone();
        failed.status.as_mut().unwrap().phase = Some("Failed".into());
        let after = observe(
            &mut ledger,
            &pricing,
            &[failed],
            &[notice(2400)],
            at(2400),
            None,
        );
        assert_eq!(after.spent, 0.0, "{after:?}");
        assert!(after.free_compute > 0.0, "{after:?}");

        // under notice at 58 min (deadline 59 min), gone when the operator looks at 61 min
        let mut ledger = CostLedger::default();
        observe(
            &mut ledger,
            &pricing,
            std::slice::from_ref(&spot),
            &[notice(3540)],
            at(3480),
            None,
        );
        let late = observe(&mut ledger, &pricing, &[], &[], at(3660), None);
        assert_eq!(late.spent, 0.0, "{late:?}");
    }

    /// The market's pools are rebuilt when the spec's change: a running instance keeps being
    /// charged its own pool's price (by instance type and zone, not by its position in the old
    /// list, which an edit of `transient.zones` shifts or puts out of range).
    #[test]
    fn a_rebuilt_market_charges_each_instance_its_own_pool() {
        let job = job(BillingModel::Aws);
        let pricing = pricing(&job);
        let grid = &pricing.setup.grid;
        let (start, end) = (pricing.time(at(0)), pricing.time(at(3 * 3600)));
        let pool = (0..grid.pools.len())
            .rev()
            .find(|&p| {
                (grid.slot_at(start)..=grid.slot_at(end)).all(|s| grid.price(p, s).is_some())
            })
            .expect("a buyable p3 pool");
        assert!(pool > 0, "the test needs a pool after the first");
        let zone = grid.pools[pool].id.zone.clone();
        let spot = pod("mf-t-0", Some(("p3.2xlarge", &zone)), Some(0));
        let mut ledger = CostLedger::default();
        let first = observe(
            &mut ledger,
            &pricing,
            std::slice::from_ref(&spot),
            &[],
            at(3600),
            None,
        );
        // the spec drops the first pool's zone: every later pool moves up one place
        let mut edited = job.clone();
        edited.spec.transient.zones = grid
            .pools
            .iter()
            .skip(1)
            .map(|p| p.id.zone.clone())
            .collect();
        let rebuilt = Pricing {
            setup: Arc::new(setup_market(&edited, &spot_data()).expect("the p3 trace loads")),
            ..pricing.clone()
        };
        assert_eq!(rebuilt.setup.grid.pools.len(), grid.pools.len() - 1);
        let second = observe(
            &mut ledger,
            &rebuilt,
            std::slice::from_ref(&spot),
            &[],
            at(7200),
            None,
        );
        let expected = first.spent
            + spot_usd(
                &pricing,
                pool,
                pricing.time(at(3600)),
                pricing.time(at(7200)),
            );
        assert!(
            (second.spent - expected).abs() < 1e-9,
            "{second:?}, expected {expected}"
        );
    }

    #[test]
    fn pending_and_unpriced_pods_are_not_charged() {
        let job = job(BillingModel::Aws);
        let pricing = pricing(&job);
        let pods = vec![
            pod("mf-r-0", None, None),
            pod("mf-t-0", Some(("m5.large", "us-east-1a")), Some(0)),
        ];
        let mut ledger = CostLedger::default();
        let cost = observe(&mut ledger, &pricing, &pods, &[], at(3600), None);
        assert_eq!(cost.spent, 0.0, "{cost:?}");
        assert_eq!(cost.unpriced, ["mf-t-0"]);
    }
}
