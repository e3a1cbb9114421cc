//! The provisioner of `ebbflow run`: the operator's [`Provisioner`] over local instances.
//!
//! What to launch and terminate comes from [`crate::provision::reconcile`], the plan the EC2
//! provisioner follows: the run wants what [`wanted_for`] (the operator's) makes of the replay's
//! live allocations, so a pool short of instances gets new ones and extras are released, the
//! youngest first. [`LocalProvisioner`] carries that out on [`Instances`] (processes or threads)
//! and keeps the books the plan reads. The trace's notices and evictions are the market taking
//! instances away, not a provisioning decision: they reach instances directly, and an instance
//! under notice is out of the plan (it is leaving whatever the plan says).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use ebbflow_crds::{CapacityType, Pool, TrainingJob};
use ebbflow_ec2::Tier;

use super::instances::Instances;
use crate::provision::{Held, InstanceUse, PoolKey, Provisioner, Wanted, pool_tag, wanted_for};
use ebbflow_bidbrain::bidder::Allocation;
use ebbflow_bidbrain::market;
use ebbflow_bidbrain::sim::grid::MarketGrid;

/// The notice a released instance gets: the job ends it itself once its partitions moved (at the
/// next clock boundary), so the deadline only bounds a release that never completes. Two wall
/// minutes, not an hour: a replay at 12,000x releases instances by the dozen, and each one left
/// hanging holds a process until its deadline.
pub const RELEASE_LEAD: Duration = Duration::from_secs(120);

/// Why the local provisioner refused a plan.
#[derive(Debug, thiserror::Error)]
pub enum LocalProvisionError {
    /// The plan asked for reliable instances: a local run's reliable tier is the job's fixed
    /// membership, started with the job.
    #[error("a local run's reliable tier is started with the job; cannot launch {count} in {pool}")]
    ReliableLaunch {
        /// Instances asked for.
        count: u32,
        /// The pool tag.
        pool: String,
    },
}

/// One instance in the books.
#[derive(Debug)]
struct Booked {
    held: Held,
    /// The market gave notice: leaving, out of the plan.
    noticed: bool,
}

/// The provisioner of a local run (see the module docs). Launch times are the run's clock: trace
/// time in unix seconds ([`Self::set_clock`]).
pub struct LocalProvisioner<'a> {
    instances: &'a mut (dyn Instances + Send),
    /// In launch order.
    books: Vec<Booked>,
    now: i64,
    launches: u64,
}

impl<'a> LocalProvisioner<'a> {
    /// A provisioner over `instances` holding `started` (the reliable tier, started with the job).
    pub fn new(instances: &'a mut (dyn Instances + Send), started: Vec<Held>) -> Self {
        Self {
            instances,
            books: started
                .into_iter()
                .map(|held| Booked {
                    held,
                    noticed: false,
                })
                .collect(),
            now: 0,
            launches: 0,
        }
    }

    /// Sets the run's clock (trace unix seconds): the launch time of what launches next.
    pub fn set_clock(&mut self, now: i64) {
        self.now = now;
    }

    /// The instances the plan sees: held and not under notice, in launch order.
    pub fn holding(&self) -> impl Iterator<Item = &Held> {
        self.books.iter().filter(|b| !b.noticed).map(|b| &b.held)
    }

    /// The market takes `ids` away `lead` from now.
    pub fn notice(&mut self, ids: &[String], lead: Duration) {
        for booked in &mut self.books {
            booked.noticed |= ids.contains(&booked.held.id);
        }
        self.instances.notice(ids.to_vec(), lead);
    }

    /// The market took `ids` (without notice, or at its deadline). Instances under notice go
    /// at their notice's deadline instead, which [`Instances`] keeps: a replay that stretched
    /// the notice (`--notice-floor`) must not cut it short when the trace's eviction comes.
    pub fn evict(&mut self, ids: &[String]) {
        let unnoticed: Vec<String> = ids
            .iter()
            .filter(|id| !self.books.iter().any(|b| b.noticed && b.held.id == **id))
            .cloned()
            .collect();
        self.forget(ids);
        if !unnoticed.is_empty() {
            self.instances.evict(unnoticed);
        }
    }

    /// Enforces deadlines and reaps exits (every tick of the replay).
    pub fn tick(&mut self) {
        self.instances.tick();
    }

    fn forget(&mut self, ids: &[String]) {
        self.books.retain(|b| !ids.contains(&b.held.id));
    }
}

impl Provisioner for LocalProvisioner<'_> {
    type Error = LocalProvisionError;

    async fn held(&mut self) -> Result<(Vec<Held>, Vec<String>), LocalProvisionError> {
        Ok((self.holding().cloned().collect(), Vec::new()))
    }

    /// Names new instances `<instance type>-<zone>-<n>`, n counting the run's launches. An
    /// instance whose process fails to start stays held (like an instance that never comes up);
    /// [`Instances`] reports it.
    async fn launch(
        &mut self,
        launch: &Wanted,
        _held: &[Held],
    ) -> Result<Vec<String>, LocalProvisionError> {
        if launch.tier == Tier::Reliable {
            return Err(LocalProvisionError::ReliableLaunch {
                count: launch.count,
                pool: pool_tag(&launch.pool),
            });
        }
        let mut names = Vec::new();
        for _ in 0..launch.count {
            self.launches += 1;
            let name = format!(
                "{}-{}-{}",
                launch.pool.instance_type, launch.pool.zone, self.launches
            );
            self.books.push(Booked {
                held: Held {
                    id: name.clone(),
                    tier: launch.tier,
                    pool: launch.pool.clone(),
                    launched: Some(self.now),
                    // released by notice, not killed: what it hosts does not change the order
                    usage: InstanceUse::Idle,
                },
                noticed: false,
            });
            names.push(name);
        }
        self.instances.launch(names.clone());
        Ok(names)
    }

    /// Releases `ids`: each gets [`RELEASE_LEAD`] notice and leaves once its data moved.
    async fn terminate(&mut self, ids: &[String]) -> Result<(), LocalProvisionError> {
        self.forget(ids);
        self.instances.notice(ids.to_vec(), RELEASE_LEAD);
        Ok(())
    }
}

/// A live allocation of the replay, in the provisioner's terms.
#[derive(Clone, Debug, PartialEq)]
pub struct LiveAllocation {
    /// The replay's allocation id.
    pub id: u64,
    /// Its pool.
    pub pool: Pool,
    /// Instances.
    pub count: u32,
    /// Its spot max price.
    pub max_price: Option<f64>,
    /// The market gave notice on it.
    pub noticed: bool,
}

impl LiveAllocation {
    /// `allocation` of `grid`'s pools; `noticed` as the replay says.
    pub fn new(grid: &MarketGrid, allocation: &Allocation, noticed: bool) -> Self {
        let id = &grid.pools[allocation.pool].id;
        Self {
            id: allocation.id,
            pool: Pool {
                instance_type: id.instance_type.clone(),
                zone: id.zone.clone(),
                capacity_type: match allocation.capacity {
                    market::CapacityType::Spot => CapacityType::Spot,
                    market::CapacityType::OnDemand => CapacityType::OnDemand,
                },
            },
            count: allocation.count,
            max_price: allocation.max_price,
            noticed,
        }
    }
}

/// What a local run wants: [`wanted_for`] with the allocations not under notice as the transient
/// pools (a pool's max price: the highest of its allocations').
pub fn wanted(job: &TrainingJob, live: &[LiveAllocation]) -> Vec<Wanted> {
    let mut counts: BTreeMap<PoolKey, u32> = BTreeMap::new();
    let mut max_prices: BTreeMap<PoolKey, f64> = BTreeMap::new();
    for allocation in live.iter().filter(|a| !a.noticed) {
        let key = PoolKey(allocation.pool.clone());
        if let Some(price) = allocation.max_price {
            let max = max_prices.entry(key.clone()).or_insert(price);
            *max = max.max(price);
        }
        *counts.entry(key).or_default() += allocation.count;
    }
    wanted_for(job, &counts, &max_prices)
}

/// The reliable tier a local run starts with, as held: `names` in the pool [`wanted_for`] wants
/// it in, launched at `at`.
pub fn reliable_held(job: &TrainingJob, names: &[String], at: i64) -> Vec<Held> {
    let pool = wanted_for(job, &BTreeMap::new(), &BTreeMap::new())
        .into_iter()
        .find(|w| w.tier == Tier::Reliable)
        .map(|w| w.pool)
        .unwrap_or_default();
    names
        .iter()
        .map(|name| Held {
            id: name.clone(),
            tier: Tier::Reliable,
            pool: pool.clone(),
            launched: Some(at),
            usage: InstanceUse::Idle,
        })
        .collect()
}

/// Which instances stand for which of the replay's allocations, so that the trace's notices and
/// evictions reach instances. Instances of one pool are alike: when the plan ends the youngest
/// of a pool while the bidder released an older allocation, the survivors stand in for the
/// allocation that lost its own.
#[derive(Debug, Default)]
pub struct Assignment(BTreeMap<u64, Vec<String>>);

impl Assignment {
    /// The instances standing for `allocation`.
    pub fn instances(&self, allocation: u64) -> Option<&[String]> {
        self.0.get(&allocation).map(Vec::as_slice)
    }

    /// Forgets `allocation`; returns its instances.
    pub fn remove(&mut self, allocation: u64) -> Option<Vec<String>> {
        self.0.remove(&allocation)
    }

    /// After a reconcile: allocations no longer `live` are forgotten; one under notice keeps its
    /// instances; any other keeps those still in `holding` (the plan's view, in launch order)
    /// and, when short, takes the oldest transient instances of its pool that stand for nothing.
    pub fn update(&mut self, live: &[LiveAllocation], holding: &[Held]) {
        let held: BTreeSet<&str> = holding.iter().map(|h| h.id.as_str()).collect();
        self.0.retain(|id, _| live.iter().any(|a| a.id == *id));
        for allocation in live.iter().filter(|a| !a.noticed) {
            if let Some(ids) = self.0.get_mut(&allocation.id) {
                ids.retain(|id| held.contains(id.as_str()));
            }
        }
        let taken: BTreeSet<String> = self.0.values().flatten().cloned().collect();
        let mut free: Vec<&Held> = holding
            .iter()
            .filter(|h| h.tier == Tier::Transient && !taken.contains(&h.id))
            .collect();
        let mut by_id: Vec<&LiveAllocation> = live.iter().filter(|a| !a.noticed).collect();
        by_id.sort_by_key(|a| a.id);
        for allocation in by_id {
            let ids = self.0.entry(allocation.id).or_default();
            while ids.len() < allocation.count as usize {
                let Some(at) = free.iter().position(|h| h.pool == allocation.pool) else {
                    break;
                };
                ids.push(free.remove(at).id.clone());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use futures::executor::block_on;

    use super::*;
    use crate::provision::reconcile;

    /// Records what reaches the instances.
    #[derive(Default)]
    struct Log(Vec<String>);

    impl Instances for Log {
        fn launch(&mut self, names: Vec<String>) {
            self.0.push(format!("launch {}", names.join(" ")));
        }

        fn notice(&mut self, names: Vec<String>, lead: Duration) {
            self.0
                .push(format!("notice {} {}s", names.join(" "), lead.as_secs()));
        }

        fn evict(&mut self, names: Vec<String>) {
            self.0.push(format!("evict {}", names.join(" ")));
        }
    }

    fn pool(zone: &str) -> Pool {
        Pool {
            instance_type: "p3.2xlarge".into(),
            zone: zone.into(),
            capacity_type: CapacityType::Spot,
        }
    }

    fn live(id: u64, zone: &str, count: u32, noticed: bool) -> LiveAllocation {
        LiveAllocation {
            id,
            pool: pool(zone),
            count,
            max_price: Some(1.0),
            noticed,
        }
    }

    fn job() -> TrainingJob {
        let mut job = TrainingJob::test("local");
        job.spec.reliable.count = 1;
        job
    }

    /// One replay step's provisioning: the plan for `live`, then the assignment.
    fn step(
        provisioner: &mut LocalProvisioner<'_>,
        assignment: &mut Assignment,
        live: &[LiveAllocation],
    ) {
        block_on(reconcile(provisioner, &wanted(&job(), live))).unwrap();
        let holding: Vec<Held> = provisioner.holding().cloned().collect();
        assignment.update(live, &holding);
    }

    #[test]
    fn wants_the_reliable_tier_and_each_pool_not_under_notice() {
        let wanted = wanted(
            &job(),
            &[
                live(1, "a", 2, false),
                LiveAllocation {
                    max_price: Some(2.0),
                    ..live(2, "a", 1, false)
                },
                live(3, "b", 4, true),
            ],
        );
        assert_eq!(wanted.len(), 2, "{wanted:?}");
        assert_eq!((wanted[0].tier, wanted[0].count), (Tier::Reliable, 1));
        assert_eq!(
            (wanted[1].tier, &wanted[1].pool, wanted[1].count),
            (Tier::Transient, &pool("a"), 3)
        );
        assert_eq!(wanted[1].max_price, Some(2.0));
    }

    #[test]
    fn launches_through_the_plan_and_releases_the_youngest_of_a_pool() {
        let mut log = Log::default();
        let mut assignment = Assignment::default();
        {
            let started = reliable_held(&job(), &["od-0".into()], 0);
            let mut provisioner = LocalProvisioner::new(&mut log, started);
            provisioner.set_clock(100);
            step(&mut provisioner, &mut assignment, &[live(1, "a", 2, false)]);
            provisioner.set_clock(200);
            let both = [live(1, "a", 2, false), live(2, "a", 1, false)];
            step(&mut provisioner, &mut assignment, &both);
            assert_eq!(assignment.instances(2).unwrap(), ["p3.2xlarge-a-3"]);
            // the bidder releases the older allocation: the plan releases the youngest two (one
            // of allocation 1's, of equal age), and the survivor stands in for allocation 2
            step(&mut provisioner, &mut assignment, &both[1..]);
            assert_eq!(assignment.instances(1), None);
            assert_eq!(assignment.instances(2).unwrap(), ["p3.2xlarge-a-2"]);
            // the market gives notice on it and takes it: nothing is relaunched meanwhile
            let noticed = [live(2, "a", 1, true)];
            provisioner.notice(assignment.instances(2).unwrap(), Duration::from_secs(2));
            step(&mut provisioner, &mut assignment, &noticed);
            assert_eq!(assignment.instances(2).unwrap(), ["p3.2xlarge-a-2"]);
            // the trace's eviction of a noticed instance leaves it to its notice's deadline
            provisioner.evict(&assignment.remove(2).unwrap());
            step(&mut provisioner, &mut assignment, &[]);
            let holding: Vec<&str> = provisioner.holding().map(|h| h.id.as_str()).collect();
            assert_eq!(holding, ["od-0"]);
            // an eviction without notice takes the instance at once
            provisioner.set_clock(300);
            step(&mut provisioner, &mut assignment, &[live(3, "a", 1, false)]);
            provisioner.evict(&assignment.remove(3).unwrap());
            step(&mut provisioner, &mut assignment, &[]);
        }
        assert_eq!(
            log.0,
            [
                "launch p3.2xlarge-a-1 p3.2xlarge-a-2",
                "launch p3.2xlarge-a-3",
                "notice p3.2xlarge-a-1 p3.2xlarge-a-3 120s",
                "notice p3.2xlarge-a-2 2s",
                "launch p3.2xlarge-a-4",
                "evict p3.2xlarge-a-4",
            ]
        );
    }

    #[test]
    fn refuses_to_launch_reliable_instances() {
        let mut log = Log::default();
        let mut provisioner = LocalProvisioner::new(&mut log, Vec::new());
        let error = block_on(reconcile(&mut provisioner, &wanted(&job(), &[]))).unwrap_err();
        assert!(error.to_string().contains("reliable tier"), "{error}");
        assert!(log.0.is_empty());
    }

    #[test]
    fn an_allocation_under_notice_keeps_its_instances_until_it_ends() {
        let mut assignment = Assignment::default();
        let holding = [Held {
            id: "x-1".into(),
            tier: Tier::Transient,
            pool: pool("a"),
            launched: Some(0),
            usage: InstanceUse::Idle,
        }];
        assignment.update(&[live(1, "a", 1, false)], &holding);
        assert_eq!(assignment.instances(1).unwrap(), ["x-1"]);
        // under notice, its instance is out of the plan's view but still its own
        assignment.update(&[live(1, "a", 1, true)], &[]);
        assert_eq!(assignment.instances(1).unwrap(), ["x-1"]);
        // released while under notice: forgotten, nothing terminated by the plan
        assignment.update(&[], &[]);
        assert_eq!(assignment.instances(1), None);
    }
}
