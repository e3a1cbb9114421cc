//! The operator's EC2 provisioner against a real local moto server: a job's reliable on-demand
//! and transient spot instances are launched tagged with the job, a second reconcile launches
//! nothing, scaling down terminates idle instances before busy ones and a draining instance only
//! once its pods are gone, another job's instances are never touched,
//! and cleanup (the finalizer's) terminates everything the job owns.
//!
//! Needs `EBBFLOW_PYTHON` pointing at a Python with moto (`scripts/setup-python.sh` prints one);
//! without it the test prints why it is skipped and passes.

use std::collections::BTreeMap;
use std::sync::Arc;

use ebbflow_crds::{CapacityType, TrainingJob};
use ebbflow_ec2::{CapacityType as Ec2Capacity, Ec2Api, InstanceState, Tier, moto::MotoServer};
use ebbflow_job::provision::PoolKey;
use ebbflow_job::provision::{Ec2Provisioner, InstanceUse, parse_pool_tag, wanted_for};

/// An AMI moto ships in every region.
const AMI: &str = "ami-03cf127a";

fn job(name: &str, uid: &str) -> TrainingJob {
    let mut job = TrainingJob::test(name).with_ec2_provisioning("us-east-1", "unused");
    job.metadata.uid = Some(uid.into());
    let ec2 = job.spec.provisioning.ec2.as_mut().unwrap();
    ec2.launch_template = None;
    ec2.image_id = Some(AMI.into());
    ec2.tags = BTreeMap::from([("team".into(), "ml".into())]);
    job.spec.reliable.count = 1;
    job.spec.reliable.instance_types = vec!["m5.large".into()];
    job.spec.transient.instance_types = vec!["p3.2xlarge".into()];
    job
}

/// A moto server serving the shared p3 trace, or `None` (after saying so) without
/// `EBBFLOW_PYTHON`.
fn moto() -> Option<MotoServer> {
    MotoServer::for_test("ec2_provision", &ebbflow_ec2::moto::p3_trace())
}

#[tokio::test]
async fn provisions_scales_and_cleans_up_a_jobs_instances_on_moto() {
    let Some(moto) = moto() else {
        return;
    };
    let api: Arc<dyn Ec2Api> = Arc::new(moto.client("us-east-1").await);
    let provisioner = Ec2Provisioner::new(api.clone());
    let none = BTreeMap::new();

    let spot_a = PoolKey::new("p3.2xlarge", "us-east-1a", CapacityType::Spot);
    let spot_d = PoolKey::new("p3.2xlarge", "us-east-1d", CapacityType::Spot);
    let mf = job("mf", "uid-mf");
    let wanted = wanted_for(
        &mf,
        &BTreeMap::from([(spot_a.clone(), 2), (spot_d.clone(), 1)]),
        &BTreeMap::from([(spot_a.clone(), 1.25)]),
    );
    let outcome = provisioner.reconcile(&mf, &wanted, &none).await.unwrap();
    assert_eq!(outcome.launched.len(), 4, "{outcome:?}");
    assert_eq!(outcome.held, 4);

    let live = api.job_instances("uid-mf", false).await.unwrap();
    assert_eq!(live.len(), 4);
    let mut per_pool: BTreeMap<String, u32> = BTreeMap::new();
    for instance in &live {
        let tags = instance.job_tags().expect("ebbflow tags");
        let pool = parse_pool_tag(&tags.pool).expect("pool tag parses");
        assert_eq!(instance.instance_type, pool.instance_type);
        if !pool.zone.is_empty() {
            assert_eq!(instance.zone.as_deref(), Some(pool.zone.as_str()));
        }
        let (tier, capacity) = match tags.tier {
            Tier::Reliable => (Tier::Reliable, Ec2Capacity::OnDemand),
            Tier::Transient => (Tier::Transient, Ec2Capacity::Spot),
        };
        assert_eq!(tags.tier, tier);
        assert_eq!(instance.capacity_type, capacity, "{instance:?}");
        assert_eq!(instance.tags.get("team").map(String::as_str), Some("ml"));
        *per_pool.entry(tags.pool).or_default() += 1;
    }
    assert_eq!(
        per_pool,
        BTreeMap::from([
            ("m5.large//on-demand".to_owned(), 1),
            ("p3.2xlarge/us-east-1a/spot".to_owned(), 2),
            ("p3.2xlarge/us-east-1d/spot".to_owned(), 1),
        ])
    );

    // Another job's instances are its own.
    let lda = job("lda", "uid-lda");
    let lda_wanted = wanted_for(&lda, &BTreeMap::new(), &BTreeMap::new());
    provisioner
        .reconcile(&lda, &lda_wanted, &none)
        .await
        .unwrap();

    // Nothing changed: nothing to do.
    let again = provisioner.reconcile(&mf, &wanted, &none).await.unwrap();
    assert!(
        again.launched.is_empty() && again.terminated.is_empty(),
        "{again:?}"
    );

    // BidBrain leaves us-east-1d: its instance goes, the others stay.
    let fewer = wanted_for(
        &mf,
        &BTreeMap::from([(spot_a.clone(), 2)]),
        &BTreeMap::new(),
    );
    let outcome = provisioner.reconcile(&mf, &fewer, &none).await.unwrap();
    assert_eq!(outcome.terminated.len(), 1, "{outcome:?}");
    assert_eq!(outcome.held, 3);
    let gone = api.job_instances("uid-mf", true).await.unwrap();
    let terminated: Vec<_> = gone
        .iter()
        .filter(|i| i.state.is_gone())
        .map(|i| i.zone.clone())
        .collect();
    assert_eq!(terminated, vec![Some("us-east-1d".to_owned())]);

    // One of us-east-1a's two goes. The plan released the pod on one of them (draining), the
    // other hosts a pod the job keeps (busy): the busy one stays, whatever its age, and the
    // draining one is terminated only once its pod is gone.
    let in_a: Vec<String> = api
        .job_instances("uid-mf", false)
        .await
        .unwrap()
        .into_iter()
        .filter(|i| {
            i.zone.as_deref() == Some("us-east-1a") && i.job_tags().unwrap().tier == Tier::Transient
        })
        .map(|i| i.instance_id)
        .collect();
    assert_eq!(in_a.len(), 2);
    let (busy, releasing) = (&in_a[0], &in_a[1]);
    let one = wanted_for(
        &mf,
        &BTreeMap::from([(spot_a.clone(), 1)]),
        &BTreeMap::new(),
    );
    let uses = BTreeMap::from([
        (busy.clone(), InstanceUse::Busy),
        (releasing.clone(), InstanceUse::Draining),
    ]);
    let outcome = provisioner.reconcile(&mf, &one, &uses).await.unwrap();
    assert!(outcome.terminated.is_empty(), "{outcome:?}");
    assert_eq!(outcome.draining, vec![releasing.clone()]);
    assert_eq!(api.job_instances("uid-mf", false).await.unwrap().len(), 3);
    // its pod is gone: now it goes, and only it
    let uses = BTreeMap::from([(busy.clone(), InstanceUse::Busy)]);
    let outcome = provisioner.reconcile(&mf, &one, &uses).await.unwrap();
    assert_eq!(outcome.terminated, vec![releasing.clone()]);
    let live: Vec<String> = api
        .job_instances("uid-mf", false)
        .await
        .unwrap()
        .into_iter()
        .map(|i| i.instance_id)
        .collect();
    assert!(live.contains(busy) && !live.contains(releasing), "{live:?}");

    // The finalizer's cleanup: every instance of the job, none of the other's.
    let cleaned = provisioner.cleanup("uid-mf").await.unwrap();
    assert_eq!(cleaned.len(), 2);
    assert!(api.job_instances("uid-mf", false).await.unwrap().is_empty());
    let others = api.job_instances("uid-lda", false).await.unwrap();
    assert_eq!(others.len(), 1);
    assert!(matches!(
        others[0].state,
        InstanceState::Pending | InstanceState::Running
    ));
    assert!(
        provisioner.cleanup("uid-mf").await.unwrap().is_empty(),
        "idempotent"
    );
}

#[tokio::test]
async fn a_launch_template_job_launches_through_instant_fleets_on_moto() {
    let Some(moto) = moto() else {
        return;
    };
    let sdk = moto.client("us-east-1").await;
    sdk.client()
        .create_launch_template()
        .launch_template_name("ebbflow-node")
        .launch_template_data(
            aws_sdk_ec2::types::RequestLaunchTemplateData::builder()
                .image_id(AMI)
                .build(),
        )
        .send()
        .await
        .expect("create launch template");
    let api: Arc<dyn Ec2Api> = Arc::new(sdk);
    let provisioner = Ec2Provisioner::new(api.clone());

    let mut fleet_job = job("fleet", "uid-fleet");
    let ec2 = fleet_job.spec.provisioning.ec2.as_mut().unwrap();
    ec2.image_id = None;
    ec2.launch_template = Some("ebbflow-node".into());
    fleet_job.spec.transient.zones = vec!["us-east-1a".into()];
    let spot = PoolKey::new("p3.2xlarge", "us-east-1a", CapacityType::Spot);
    let wanted = wanted_for(
        &fleet_job,
        &BTreeMap::from([(spot.clone(), 2)]),
        &BTreeMap::from([(spot, 1.5)]),
    );
    let outcome = provisioner
        .reconcile(&fleet_job, &wanted, &BTreeMap::new())
        .await
        .unwrap();
    assert_eq!(outcome.launched.len(), 3, "{outcome:?}");
    let live = api.job_instances("uid-fleet", false).await.unwrap();
    let mut per_pool: BTreeMap<String, u32> = BTreeMap::new();
    for instance in &live {
        *per_pool
            .entry(instance.job_tags().expect("ebbflow tags").pool)
            .or_default() += 1;
    }
    assert_eq!(
        per_pool,
        BTreeMap::from([
            ("m5.large/us-east-1a/on-demand".to_owned(), 1),
            ("p3.2xlarge/us-east-1a/spot".to_owned(), 2),
        ])
    );
    let again = provisioner
        .reconcile(&fleet_job, &wanted, &BTreeMap::new())
        .await
        .unwrap();
    assert!(again.launched.is_empty(), "{again:?}");
    assert_eq!(provisioner.cleanup("uid-fleet").await.unwrap().len(), 3);
}
