//! The provisioner seam: from the instances a job should have per tier and pool and the instances
//! it holds, what to launch and what to terminate.
//!
//! [`plan_instances`] is pure: it launches what is missing per (tier, pool) and terminates extras
//! and everything in a pool no longer wanted. Which extras go follows what they host
//! ([`InstanceUse`]): idle instances first, then, only if more must go, busy ones; the youngest
//! first within each (the oldest have proven they last; under per-second billing the order does
//! not change what has been paid). An instance whose pods are shutting down (the plan released
//! them) counts as going but is terminated only once they are gone: terminating it at once
//! killed a released pod mid-hand-over (its partitions not yet moved, its grace period cut) and,
//! where the plan released another pod than the youngest instance's, killed a pod the job kept —
//! a loss without notice, a rollback, and a refund the provider never gives.
//! [`reconcile`] carries such a plan out through a [`Provisioner`]: where a job's instances run,
//! seen as what it holds and how to launch and terminate. [`Ec2Provisioner`] is one, over EC2;
//! `ebbflow run`'s local processes or threads are another
//! ([`crate::run::provisioner::LocalProvisioner`]).
//!
//! [`Ec2Provisioner`] applies plans to EC2 through the [`Ec2Api`] seam for jobs with
//! `spec.provisioning.mode: ec2`: instances are tagged with the job's UID, its tier and its pool;
//! a launch carries a client token derived from the job, the pool and what was held, so a retry
//! after a lost answer never launches twice; deleting the job terminates every instance tagged
//! with it.

use std::collections::BTreeMap;
use std::sync::Arc;

use ebbflow_crds::{CapacityType, Ec2Provisioning, Pool, TrainingJob};
use ebbflow_ec2::{
    Capacity, Ec2Api, Ec2Error, Ec2Instance, FleetPool, FleetRequest, JobTags, LaunchRequest,
    LaunchTemplateRef, SpotRequestStatus, Tier,
};

/// A [`Pool`] with a total order (instance type, zone, capacity type), so pools can key
/// ordered maps and plans come out deterministic.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct PoolKey(pub Pool);

impl PoolKey {
    /// A key for a spot or on-demand pool of `instance_type` in `zone`.
    pub fn new(instance_type: &str, zone: &str, capacity_type: CapacityType) -> Self {
        Self(Pool {
            instance_type: instance_type.to_owned(),
            zone: zone.to_owned(),
            capacity_type,
        })
    }

    fn sort_key(&self) -> (&str, &str, u8) {
        let capacity = match self.0.capacity_type {
            CapacityType::OnDemand => 0,
            CapacityType::Spot => 1,
        };
        (&self.0.instance_type, &self.0.zone, capacity)
    }
}

impl Ord for PoolKey {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.sort_key().cmp(&other.sort_key())
    }
}

impl PartialOrd for PoolKey {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl std::ops::Deref for PoolKey {
    type Target = Pool;
    fn deref(&self) -> &Pool {
        &self.0
    }
}

/// Instances wanted in one (tier, pool).
#[derive(Clone, Debug, PartialEq)]
pub struct Wanted {
    /// Reliable or transient.
    pub tier: Tier,
    /// Instance type, zone (empty: any) and capacity type.
    pub pool: Pool,
    /// How many.
    pub count: u32,
    /// Spot max price in USD per instance-hour (`None`: the on-demand price).
    pub max_price: Option<f64>,
}

/// An instance a job holds.
#[derive(Clone, Debug, PartialEq)]
pub struct Held {
    /// Instance id.
    pub id: String,
    /// Its tier.
    pub tier: Tier,
    /// Its pool.
    pub pool: Pool,
    /// Launch time in unix seconds, when known.
    pub launched: Option<i64>,
    /// What it hosts (idle where unknown).
    pub usage: InstanceUse,
}

/// What an instance hosts, of its job or another's, as the cluster shows it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub enum InstanceUse {
    /// No pod that still runs (or none is known: not joined, no node mapping).
    #[default]
    Idle,
    /// Only pods that are shutting down (deleted, or released by this reconcile's plan).
    Draining,
    /// A pod that is kept.
    Busy,
}

/// What to do.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct InstancePlan {
    /// Launches, one per (tier, pool) short of instances, with the number missing.
    pub launch: Vec<Wanted>,
    /// Instances to terminate.
    pub terminate: Vec<String>,
    /// Extras left running until their pods are gone ([`InstanceUse::Draining`]).
    pub draining: Vec<String>,
}

/// The plan that turns `held` into `wanted` (see the module docs).
pub fn plan_instances(wanted: &[Wanted], held: &[Held]) -> InstancePlan {
    let mut by_pool: BTreeMap<(&str, String, String, &str), Vec<&Held>> = BTreeMap::new();
    let key = |tier: Tier, pool: &Pool| {
        (
            tier.as_str(),
            pool.instance_type.clone(),
            pool.zone.clone(),
            pool.capacity_type.as_str(),
        )
    };
    for instance in held {
        by_pool
            .entry(key(instance.tier, &instance.pool))
            .or_default()
            .push(instance);
    }
    let mut plan = InstancePlan::default();
    for want in wanted {
        let have = by_pool
            .remove(&key(want.tier, &want.pool))
            .unwrap_or_default();
        let count = have.len() as u32;
        if count < want.count {
            plan.launch.push(Wanted {
                count: want.count - count,
                ..want.clone()
            });
        } else if count > want.count {
            plan.take_extras(have, (count - want.count) as usize);
        }
    }
    for (_, rest) in by_pool {
        let all = rest.len();
        plan.take_extras(rest, all);
    }
    plan.terminate.sort();
    plan.draining.sort();
    plan
}

impl InstancePlan {
    /// Takes `extras` of `have` away: idle ones, then draining ones (which wait for their
    /// pods), then busy ones; the youngest first within each (unknown launch times count as
    /// youngest).
    fn take_extras(&mut self, mut have: Vec<&Held>, extras: usize) {
        have.sort_by_key(|h| (h.usage, std::cmp::Reverse(h.launched.unwrap_or(i64::MAX))));
        for instance in have.into_iter().take(extras) {
            match instance.usage {
                InstanceUse::Draining => self.draining.push(instance.id.clone()),
                InstanceUse::Idle | InstanceUse::Busy => self.terminate.push(instance.id.clone()),
            }
        }
    }
}

/// Where a job's instances run, as [`reconcile`] sees it: what the job holds, and how to launch
/// and terminate instances. The calls are async because EC2's are; an implementation with nothing
/// to wait for (local processes) returns ready futures.
pub trait Provisioner {
    /// Why a call failed.
    type Error;

    /// The job's live instances, and the ids of instances whose tier or pool cannot be read
    /// (terminated by [`reconcile`]).
    fn held(
        &mut self,
    ) -> impl Future<Output = Result<(Vec<Held>, Vec<String>), Self::Error>> + Send;

    /// Launches `launch.count` instances in its tier and pool; `held` is what [`Self::held`]
    /// returned in this reconcile. Returns the new instances' ids.
    fn launch(
        &mut self,
        launch: &Wanted,
        held: &[Held],
    ) -> impl Future<Output = Result<Vec<String>, Self::Error>> + Send;

    /// Terminates the instances `ids`.
    fn terminate(&mut self, ids: &[String])
    -> impl Future<Output = Result<(), Self::Error>> + Send;
}

/// Brings `provisioner`'s instances to `wanted` by [`plan_instances`]: terminates the plan's
/// extras and the unreadable instances first, then launches what is missing, pool by pool; stops
/// at the first error.
pub async fn reconcile<P: Provisioner>(
    provisioner: &mut P,
    wanted: &[Wanted],
) -> Result<ProvisionOutcome, P::Error> {
    let (held, unreadable) = provisioner.held().await?;
    let plan = plan_instances(wanted, &held);
    let mut outcome = ProvisionOutcome::default();
    let mut terminate = plan.terminate.clone();
    terminate.extend(unreadable);
    if !terminate.is_empty() {
        provisioner.terminate(&terminate).await?;
        outcome.terminated = terminate;
    }
    for launch in &plan.launch {
        let ids = provisioner.launch(launch, &held).await?;
        outcome.launched.extend(ids);
    }
    outcome.held = held.len() + outcome.launched.len() - plan.terminate.len();
    outcome.draining = plan.draining;
    Ok(outcome)
}

/// The pool tag of an instance: `instance-type/zone/capacity-type`.
pub fn pool_tag(pool: &Pool) -> String {
    format!(
        "{}/{}/{}",
        pool.instance_type,
        pool.zone,
        pool.capacity_type.as_str()
    )
}

/// Parses [`pool_tag`] back.
pub fn parse_pool_tag(tag: &str) -> Option<Pool> {
    let mut parts = tag.rsplitn(3, '/');
    let capacity_type = CapacityType::parse(parts.next()?)?;
    let zone = parts.next()?.to_owned();
    let instance_type = parts.next()?.to_owned();
    if instance_type.is_empty() {
        return None;
    }
    Some(Pool {
        instance_type,
        zone,
        capacity_type,
    })
}

/// Why provisioning failed.
#[derive(Debug, thiserror::Error)]
pub enum ProvisionError {
    /// The job lacks what ec2 provisioning needs.
    #[error("{field}: {reason}")]
    Spec {
        /// The field, e.g. `spec.provisioning.ec2`.
        field: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// A fleet launched nothing in the pool.
    #[error("no instance launched in {pool}: {reasons}")]
    NoCapacity {
        /// The pool tag.
        pool: String,
        /// EC2's launch errors.
        reasons: String,
    },
    /// An EC2 call failed.
    #[error("EC2: {0}")]
    Ec2(#[from] Ec2Error),
}

/// What one reconcile of a job's instances did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ProvisionOutcome {
    /// Instances launched now.
    pub launched: Vec<String>,
    /// Instances terminated now.
    pub terminated: Vec<String>,
    /// Instances held after the reconcile.
    pub held: usize,
    /// Extras kept until their pods are gone (counted in `held`).
    pub draining: Vec<String>,
}

/// The EC2 provisioner (see the module docs).
#[derive(Clone)]
pub struct Ec2Provisioner {
    api: Arc<dyn Ec2Api>,
}

/// The tag value that names a job's instances: its UID.
pub fn job_tag(job: &TrainingJob) -> Result<String, ProvisionError> {
    job.metadata
        .uid
        .clone()
        .filter(|uid| !uid.is_empty())
        .ok_or(ProvisionError::Spec {
            field: "metadata.uid",
            reason: "the job has no UID yet".into(),
        })
}

impl Ec2Provisioner {
    /// A provisioner over `api`.
    pub fn new(api: Arc<dyn Ec2Api>) -> Self {
        Self { api }
    }

    /// The job's live instances (not shutting down or terminated) as [`Held`]; instances whose
    /// ebbflow tags cannot be read are returned with their ids in the second list.
    pub async fn held(&self, job: &str) -> Result<(Vec<Held>, Vec<String>), ProvisionError> {
        let instances = self.api.job_instances(job, false).await?;
        let mut held = Vec::new();
        let mut unreadable = Vec::new();
        for instance in instances.into_iter().filter(|i| !i.state.is_gone()) {
            match read_held(&instance) {
                Some(h) => held.push(h),
                None => unreadable.push(instance.instance_id),
            }
        }
        Ok((held, unreadable))
    }

    /// Brings the job's instances to `wanted` ([`reconcile`] over the job's EC2 instances):
    /// launches what is missing, terminates extras and instances whose tags cannot be read.
    /// `uses` says what each instance hosts ([`instance_uses`]; absent: idle).
    pub async fn reconcile(
        &self,
        job: &TrainingJob,
        wanted: &[Wanted],
        uses: &BTreeMap<String, InstanceUse>,
    ) -> Result<ProvisionOutcome, ProvisionError> {
        let tag = job_tag(job)?;
        let ec2 = job
            .spec
            .provisioning
            .ec2
            .as_ref()
            .ok_or(ProvisionError::Spec {
                field: "spec.provisioning.ec2",
                reason: "required when mode is ec2".into(),
            })?;
        let mut instances = Ec2Instances {
            provisioner: self,
            tag,
            ec2,
            uses,
        };
        reconcile(&mut instances, wanted).await
    }

    /// The spot request statuses of the `jobs`' (tags) spot instances, recently terminated ones
    /// included (EC2 lists them for about an hour), in one DescribeSpotInstanceRequests call:
    /// what the operator's interruption watcher polls.
    pub async fn spot_statuses(
        &self,
        jobs: &[String],
    ) -> Result<Vec<SpotRequestStatus>, ProvisionError> {
        let mut ids = Vec::new();
        for job in jobs {
            ids.extend(
                self.api
                    .job_instances(job, true)
                    .await?
                    .into_iter()
                    .filter(|i| i.capacity_type == ebbflow_ec2::CapacityType::Spot)
                    .map(|i| i.instance_id),
            );
        }
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        Ok(self.api.spot_requests(&ids).await?)
    }

    /// Terminates every live instance tagged with the job; returns how many.
    pub async fn cleanup(&self, job: &str) -> Result<Vec<String>, ProvisionError> {
        let ids: Vec<String> = self
            .api
            .job_instances(job, false)
            .await?
            .into_iter()
            .filter(|i| !i.state.is_gone())
            .map(|i| i.instance_id)
            .collect();
        if !ids.is_empty() {
            self.api.terminate_instances(&ids).await?;
        }
        Ok(ids)
    }
}

/// One job's instances on EC2: the [`Provisioner`] behind [`Ec2Provisioner::reconcile`].
struct Ec2Instances<'a> {
    provisioner: &'a Ec2Provisioner,
    /// The job's tag ([`job_tag`]).
    tag: String,
    /// How the job launches instances.
    ec2: &'a Ec2Provisioning,
    uses: &'a BTreeMap<String, InstanceUse>,
}

impl Provisioner for Ec2Instances<'_> {
    type Error = ProvisionError;

    async fn held(&mut self) -> Result<(Vec<Held>, Vec<String>), ProvisionError> {
        let (mut held, unreadable) = self.provisioner.held(&self.tag).await?;
        for instance in &mut held {
            instance.usage = self.uses.get(&instance.id).copied().unwrap_or_default();
        }
        Ok((held, unreadable))
    }

    async fn terminate(&mut self, ids: &[String]) -> Result<(), ProvisionError> {
        self.provisioner.api.terminate_instances(ids).await?;
        Ok(())
    }

    /// Tagged with the job, its tier and pool, under a client token derived from them and what
    /// the pool held (see the module docs).
    async fn launch(
        &mut self,
        launch: &Wanted,
        held: &[Held],
    ) -> Result<Vec<String>, ProvisionError> {
        if launch.pool.instance_type.is_empty() {
            return Err(ProvisionError::Spec {
                field: match launch.tier {
                    Tier::Reliable => "spec.reliable.instanceTypes",
                    Tier::Transient => "spec.transient.instanceTypes",
                },
                reason: "ec2 provisioning needs an instance type to launch".into(),
            });
        }
        let tags = JobTags {
            job: self.tag.clone(),
            tier: launch.tier,
            pool: pool_tag(&launch.pool),
        };
        let have = held
            .iter()
            .filter(|h| h.tier == launch.tier && h.pool == launch.pool)
            .count();
        // A retry within ten minutes (a lost answer) reuses the token and cannot launch
        // twice; later reconciles see what launched through the tags, and a failed launch
        // is retried under a fresh token once the bucket turns.
        let bucket = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() / 600);
        let token = format!(
            "ebbflow-{:016x}",
            ebbflow_crds::fnv1a(&format!(
                "{}|{}|{have}|{}|{bucket}",
                self.tag, tags.pool, launch.count
            ))
        );
        let zone = (!launch.pool.zone.is_empty()).then(|| launch.pool.zone.clone());
        let max_price = match launch.pool.capacity_type {
            CapacityType::Spot => launch.max_price,
            CapacityType::OnDemand => None,
        };
        let ids: Vec<String> = match (&self.ec2.image_id, &self.ec2.launch_template) {
            (Some(image_id), _) => {
                let request = LaunchRequest {
                    image_id: image_id.clone(),
                    instance_type: launch.pool.instance_type.clone(),
                    zone: zone.clone(),
                    subnet_id: self.ec2.subnet_ids.first().cloned(),
                    count: launch.count,
                    capacity: match launch.pool.capacity_type {
                        CapacityType::OnDemand => Capacity::OnDemand,
                        CapacityType::Spot => Capacity::Spot {
                            max_price_usd_hr: max_price,
                        },
                    },
                    tags,
                    extra_tags: self.ec2.tags.clone(),
                    security_group_ids: self.ec2.security_group_ids.clone(),
                    iam_instance_profile: self.ec2.instance_profile.clone(),
                    user_data_base64: None,
                    client_token: Some(token),
                };
                self.provisioner
                    .api
                    .run_instances(&request)
                    .await?
                    .into_iter()
                    .map(|i| i.instance_id)
                    .collect()
            }
            (None, Some(template)) => {
                let template = if template.starts_with("lt-") {
                    LaunchTemplateRef::Id(template.clone())
                } else {
                    LaunchTemplateRef::Name(template.clone())
                };
                let (spot_count, on_demand_count) = match launch.pool.capacity_type {
                    CapacityType::Spot => (launch.count, 0),
                    CapacityType::OnDemand => (0, launch.count),
                };
                let request = FleetRequest {
                    launch_template: template,
                    launch_template_version: None,
                    pools: vec![FleetPool {
                        instance_type: launch.pool.instance_type.clone(),
                        zone,
                        subnet_id: self.ec2.subnet_ids.first().cloned(),
                        max_price_usd_hr: max_price,
                    }],
                    spot_count,
                    on_demand_count,
                    tags,
                    client_token: Some(token),
                };
                let fleet = self.provisioner.api.create_instant_fleet(&request).await?;
                if fleet.instances.is_empty() {
                    return Err(ProvisionError::NoCapacity {
                        pool: pool_tag(&launch.pool),
                        reasons: fleet
                            .errors
                            .iter()
                            .map(|e| format!("{}: {}", e.code, e.message))
                            .collect::<Vec<_>>()
                            .join("; "),
                    });
                }
                fleet.instances.into_iter().map(|i| i.instance_id).collect()
            }
            (None, None) => {
                return Err(ProvisionError::Spec {
                    field: "spec.provisioning.ec2",
                    reason: "must set launchTemplate or imageId".into(),
                });
            }
        };
        Ok(ids)
    }
}

fn read_held(instance: &Ec2Instance) -> Option<Held> {
    let tags = instance.job_tags()?;
    Some(Held {
        id: instance.instance_id.clone(),
        tier: tags.tier,
        pool: parse_pool_tag(&tags.pool)?,
        launched: instance.launch_time.map(|t| t.timestamp()),
        usage: InstanceUse::Idle,
    })
}

/// What a job in ec2 mode wants: `spec.reliable.count` on-demand instances of its first reliable
/// instance type, and the capacity decision's transient pools.
pub fn wanted_for(
    job: &TrainingJob,
    transient: &BTreeMap<PoolKey, u32>,
    max_prices: &BTreeMap<PoolKey, f64>,
) -> Vec<Wanted> {
    let reliable = &job.spec.reliable;
    let mut wanted = vec![Wanted {
        tier: Tier::Reliable,
        pool: Pool {
            instance_type: reliable.instance_types.first().cloned().unwrap_or_default(),
            zone: job
                .spec
                .transient
                .zones
                .first()
                .cloned()
                .unwrap_or_default(),
            capacity_type: CapacityType::OnDemand,
        },
        count: reliable.count,
        max_price: None,
    }];
    for (pool, count) in transient {
        wanted.push(Wanted {
            tier: Tier::Transient,
            pool: pool.0.clone(),
            count: *count,
            max_price: max_prices.get(pool).copied().or(job.spec.bidding.max_price),
        });
    }
    wanted.retain(|w| w.count > 0);
    wanted
}

#[cfg(test)]
mod tests {
    use ebbflow_ec2::FakeEc2;

    use super::*;

    fn pool(instance_type: &str, zone: &str, capacity_type: CapacityType) -> Pool {
        Pool {
            instance_type: instance_type.into(),
            zone: zone.into(),
            capacity_type,
        }
    }

    fn held(id: &str, tier: Tier, pool: Pool, launched: i64) -> Held {
        Held {
            id: id.into(),
            tier,
            pool,
            launched: Some(launched),
            usage: InstanceUse::Idle,
        }
    }

    #[test]
    fn plans_launches_for_missing_and_terminates_youngest_extras_and_unwanted_pools() {
        let a = pool("c5.xlarge", "us-east-1a", CapacityType::Spot);
        let b = pool("c5.xlarge", "us-east-1b", CapacityType::Spot);
        let od = pool("m5.large", "us-east-1a", CapacityType::OnDemand);
        let have = vec![
            held("i-old", Tier::Transient, a.clone(), 100),
            held("i-young", Tier::Transient, a.clone(), 300),
            held("i-mid", Tier::Transient, a.clone(), 200),
            held("i-b", Tier::Transient, b.clone(), 100),
            held("i-r", Tier::Reliable, od.clone(), 50),
        ];
        let want = |tier, pool: &Pool, count| Wanted {
            tier,
            pool: pool.clone(),
            count,
            max_price: Some(0.1),
        };
        let plan = plan_instances(
            &[want(Tier::Reliable, &od, 2), want(Tier::Transient, &a, 1)],
            &have,
        );
        assert_eq!(plan.launch, vec![want(Tier::Reliable, &od, 1)]);
        assert_eq!(plan.terminate, vec!["i-b", "i-mid", "i-young"]);
        // a transient pool with the reliable pool's name is another (tier, pool)
        let plan = plan_instances(&[want(Tier::Transient, &od, 1)], &have);
        assert_eq!(plan.launch, vec![want(Tier::Transient, &od, 1)]);
        assert_eq!(plan.terminate.len(), 5);
        assert_eq!(plan_instances(&[], &[]), InstancePlan::default());
    }

    #[test]
    fn extras_go_idle_first_busy_last_and_draining_ones_wait_for_their_pods() {
        let a = pool("c5.xlarge", "us-east-1a", CapacityType::Spot);
        let b = pool("c5.xlarge", "us-east-1b", CapacityType::Spot);
        let using = |id: &str, launched, usage| Held {
            usage,
            ..held(id, Tier::Transient, a.clone(), launched)
        };
        let have = vec![
            using("i-busy-young", 400, InstanceUse::Busy),
            using("i-busy-old", 100, InstanceUse::Busy),
            using("i-draining", 200, InstanceUse::Draining),
            using("i-idle", 150, InstanceUse::Idle),
            Held {
                usage: InstanceUse::Draining,
                ..held("i-b", Tier::Transient, b.clone(), 100)
            },
        ];
        let want = |count| Wanted {
            tier: Tier::Transient,
            pool: a.clone(),
            count,
            max_price: Some(0.1),
        };
        // two of four go: the idle one now, the draining one once its pod is gone; the pool no
        // longer wanted drains too; the busy ones (the youngest among them) stay
        let plan = plan_instances(&[want(2)], &have);
        assert_eq!(plan.terminate, vec!["i-idle"]);
        assert_eq!(plan.draining, vec!["i-b", "i-draining"]);
        // three go: then the youngest busy one as well
        let plan = plan_instances(&[want(1)], &have);
        assert_eq!(plan.terminate, vec!["i-busy-young", "i-idle"]);
        // nothing wanted: every idle and busy one now, draining ones later
        let plan = plan_instances(&[], &have);
        assert_eq!(plan.terminate, vec!["i-busy-old", "i-busy-young", "i-idle"]);
        assert_eq!(plan.draining, vec!["i-b", "i-draining"]);
    }

    #[test]
    fn pool_tags_round_trip() {
        for p in [
            pool("p3.2xlarge", "us-east-1a", CapacityType::Spot),
            pool("m5.large", "", CapacityType::OnDemand),
        ] {
            assert_eq!(parse_pool_tag(&pool_tag(&p)), Some(p));
        }
        assert_eq!(parse_pool_tag("nonsense"), None);
        assert_eq!(parse_pool_tag("/us-east-1a/spot"), None);
        assert_eq!(parse_pool_tag("m5.large/us-east-1a/reserved"), None);
    }

    fn ec2_job() -> TrainingJob {
        TrainingJob::test("ec2").with_ec2_image("us-east-1", "ami-12345678")
    }

    fn fake() -> Arc<FakeEc2> {
        Arc::new(FakeEc2::new().with_small_types(&["m5.large", "c5.xlarge"]))
    }

    #[tokio::test]
    async fn reconciles_a_job_to_its_wanted_instances_and_cleans_up() {
        let fake = fake();
        let provisioner = Ec2Provisioner::new(fake.clone());
        let job = ec2_job();
        let spot = PoolKey::new("c5.xlarge", "us-east-1a", CapacityType::Spot);
        let wanted = wanted_for(
            &job,
            &BTreeMap::from([(spot.clone(), 3)]),
            &BTreeMap::from([(spot.clone(), 0.12)]),
        );
        let outcome = provisioner
            .reconcile(&job, &wanted, &BTreeMap::new())
            .await
            .unwrap();
        assert_eq!(outcome.launched.len(), 4, "1 reliable + 3 spot");
        assert_eq!(outcome.held, 4);
        let live = fake.instances();
        assert_eq!(live.len(), 4);
        assert!(
            live.iter().all(|i| i.tags[ebbflow_ec2::TAG_JOB] == "uid-1"),
            "{live:?}"
        );
        // idempotent: nothing more to do
        let again = provisioner
            .reconcile(&job, &wanted, &BTreeMap::new())
            .await
            .unwrap();
        assert!(again.launched.is_empty() && again.terminated.is_empty());
        // scale down to one spot instance
        let fewer = wanted_for(&job, &BTreeMap::from([(spot, 1)]), &BTreeMap::new());
        let outcome = provisioner
            .reconcile(&job, &fewer, &BTreeMap::new())
            .await
            .unwrap();
        assert_eq!(outcome.terminated.len(), 2);
        assert_eq!(outcome.held, 2);
        // delete: everything goes
        let gone = provisioner.cleanup("uid-1").await.unwrap();
        assert_eq!(gone.len(), 2);
        assert!(provisioner.held("uid-1").await.unwrap().0.is_empty());
    }

    #[tokio::test]
    async fn a_job_without_an_instance_type_is_a_spec_error_naming_the_field() {
        let fake = fake();
        let provisioner = Ec2Provisioner::new(fake.clone());
        let mut job = ec2_job();
        job.spec.reliable.instance_types.clear();
        let wanted = wanted_for(&job, &BTreeMap::new(), &BTreeMap::new());
        let error = provisioner
            .reconcile(&job, &wanted, &BTreeMap::new())
            .await
            .unwrap_err();
        assert!(
            error.to_string().contains("spec.reliable.instanceTypes"),
            "{error}"
        );
        assert!(fake.instances().is_empty());
    }
}
