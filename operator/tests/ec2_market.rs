//! BidBrain on the live `ec2` market against a real local moto server serving the p3.2xlarge
//! spot trace: the planner fetches the price history in the background (`MarketLoading` first),
//! then buys spot pools of the job's type with bids at or above the prices moto serves and a
//! finite expected cost per work — with the default week of history (only the prices in force:
//! the trace ended in 2023) and with a lookback over the whole trace (its real price changes
//! train the eviction model).
//!
//! Needs `EBBFLOW_PYTHON` pointing at a Python with moto (`scripts/setup-python.sh` prints one);
//! without it the test prints why it is skipped and passes.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use ebbflow_crds::{CapacityType, TrainingJob};
use ebbflow_ec2::{Ec2Api, SpotPriceQuery, moto::MotoServer};
use ebbflow_job::live_market::OnDemandPrices;
use ebbflow_operator::controller::bidbrain::{BidBrainConfig, BidBrainPlanner, Ec2MarketSource};
use ebbflow_operator::controller::capacity::{CapacityPlanner, CapacityView};
use ebbflow_operator::controller::plan::CapacityDecision;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

/// A moto server serving the shared p3 trace, or `None` (after saying so) without
/// `EBBFLOW_PYTHON`.
fn moto() -> Option<MotoServer> {
    MotoServer::for_test("ec2_market", &ebbflow_ec2::moto::p3_trace())
}

fn job(now: Timestamp) -> TrainingJob {
    let mut job = TrainingJob::test("mf")
        .with_transient_range(0, 4)
        .with_ec2_market("us-east-1");
    job.spec.transient.instance_types = vec!["p3.2xlarge".into()];
    job.metadata.creation_timestamp = Some(Time(now));
    job
}

fn decide(planner: &BidBrainPlanner, job: &TrainingJob, now: Timestamp) -> CapacityDecision {
    planner.decide(&CapacityView {
        job,
        alive: &BTreeMap::new(),
        launched: &BTreeMap::new(),
        bids: &BTreeMap::new(),
        pools_under_notice: &BTreeSet::new(),
        failed: &BTreeMap::new(),
        unplaceable: &BTreeSet::new(),
        coordinator: None,
        now,
    })
}

/// Decides until the background fetch has landed (moto answers within seconds).
async fn settled(planner: &BidBrainPlanner, job: &TrainingJob, now: Timestamp) -> CapacityDecision {
    for _ in 0..600 {
        let decision = decide(planner, job, now);
        if decision.reason != "MarketLoading" {
            return decision;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the ec2 market did not load within a minute");
}

#[tokio::test]
async fn bidbrain_buys_spot_on_the_ec2_market_moto_serves() {
    let Some(moto) = moto() else {
        return;
    };
    let api: Arc<dyn Ec2Api> = Arc::new(moto.client("us-east-1").await);
    let now = Timestamp::now();
    // the prices moto serves now, per zone (the trace's last prices)
    let now_utc = chrono::DateTime::from_timestamp(now.as_second(), 0).unwrap();
    let in_force: BTreeMap<String, f64> = api
        .spot_price_history(&SpotPriceQuery {
            instance_types: vec!["p3.2xlarge".into()],
            start: Some(now_utc),
            end: Some(now_utc),
            ..SpotPriceQuery::default()
        })
        .await
        .expect("moto serves price history")
        .into_iter()
        .map(|p| (p.zone, p.price_usd_hr))
        .collect();
    assert!(
        !in_force.is_empty(),
        "moto serves us-east-1 zones of the trace"
    );

    let trace_start = "2023-02-15T00:00:00Z".parse::<Timestamp>().unwrap();
    let lookbacks = [
        BidBrainConfig::default().live_lookback,
        Duration::from_secs((now.as_second() - trace_start.as_second()) as u64),
    ];
    for lookback in lookbacks {
        let planner = BidBrainPlanner::new(BidBrainConfig {
            live_lookback: lookback,
            ..BidBrainConfig::default()
        })
        .with_ec2(Ec2MarketSource {
            api: api.clone(),
            region: "us-east-1".into(),
            on_demand: Arc::new(OnDemandPrices::bundled().unwrap()),
        });
        let job = job(now);
        let first = decide(&planner, &job, now);
        assert_eq!(first.reason, "MarketLoading", "{first:?}");
        assert_eq!(first.total(), 4, "maxNodes while the market loads");

        let decision = settled(&planner, &job, now).await;
        assert_eq!(
            decision.reason, "BidBrain",
            "lookback {lookback:?}: {decision:?}"
        );
        assert!((1..=4).contains(&decision.total()), "{decision:?}");
        let e = decision
            .expected_cost_per_work
            .expect("the bidder reports E");
        assert!(e.is_finite() && e > 0.0, "E = {e}");
        for (pool, count) in &decision.transient {
            assert!(*count > 0);
            assert_eq!(pool.0.instance_type, "p3.2xlarge");
            assert_eq!(pool.0.capacity_type, CapacityType::Spot);
            let served = in_force[&pool.0.zone];
            let bid = decision.max_prices[pool];
            assert!(
                bid >= served - 1e-9 && bid <= 3.06 + 1e-9,
                "{pool:?}: bid {bid} between the served price {served} and on-demand 3.06"
            );
        }
        eprintln!("lookback {} h: {decision:?}", lookback.as_secs() / 3600);
    }
}
