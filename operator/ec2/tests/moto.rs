//! The EC2 seam against a real local moto server (`moto/launch.py`), serving spot prices from
//! the shared p3.2xlarge 9-zone trace.
//!
//! Needs `EBBFLOW_PYTHON` pointing at a Python with moto (`scripts/setup-python.sh` prints one);
//! without it every test prints why it is skipped and passes.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use chrono::{DateTime, TimeZone, Utc};
use ebbflow_ec2::{
    Capacity, CapacityType, Ec2Api, ErrorCategory, FleetPool, FleetRequest, InstanceState, JobTags,
    LaunchRequest, LaunchTemplateRef, PlacementScoreQuery, RetryAdvice, SdkEc2, SpotPriceQuery,
    Tier, moto::MotoServer,
};

/// An AMI moto ships in every region.
const AMI: &str = "ami-03cf127a";

/// The moto server of one test.
struct Moto(MotoServer);

impl Moto {
    /// Starts the launcher on the shared p3.2xlarge trace; `None` (after saying so) when no
    /// Python is configured.
    fn start(test: &str) -> Option<Self> {
        Self::start_with_trace(test, &ebbflow_ec2::moto::p3_trace())
    }

    /// Starts the launcher serving `trace`.
    fn start_with_trace(test: &str, trace: &Path) -> Option<Self> {
        MotoServer::for_test(test, trace).map(Self)
    }

    async fn client(&self, region: &str) -> SdkEc2 {
        self.0.client(region).await
    }
}

/// A scratch directory removed on drop (unique per process and test).
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> Self {
        let path = std::env::temp_dir().join(format!("ebbflow-ec2-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&path).unwrap();
        Self(path)
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The trace's price changes per zone, as EC2 records them: a point only when the price moves.
fn trace_changes() -> BTreeMap<String, Vec<(DateTime<Utc>, f64)>> {
    let mut reader = csv::Reader::from_path(ebbflow_ec2::moto::p3_trace()).unwrap();
    let headers = reader.headers().unwrap().clone();
    let zones: Vec<(usize, String)> = headers
        .iter()
        .enumerate()
        .filter_map(|(i, h)| h.strip_suffix("_spot_usd_hr").map(|z| (i, z.to_owned())))
        .collect();
    let time_column = headers.iter().position(|h| h == "timestamp_utc").unwrap();
    let mut changes: BTreeMap<String, Vec<(DateTime<Utc>, f64)>> = BTreeMap::new();
    for row in reader.records() {
        let row = row.unwrap();
        let raw = row[time_column].trim_end_matches('Z');
        let time = chrono::NaiveDateTime::parse_from_str(raw, "%Y-%m-%dT%H:%M:%S%.f")
            .or_else(|_| chrono::NaiveDateTime::parse_from_str(raw, "%Y-%m-%d %H:%M:%S%.f"))
            .or_else(|_| DateTime::parse_from_rfc3339(&row[time_column]).map(|t| t.naive_utc()))
            .unwrap_or_else(|e| panic!("timestamp {:?}: {e}", &row[time_column]))
            .and_utc();
        for (column, zone) in &zones {
            let price: f64 = row[*column].parse().unwrap();
            let series = changes.entry(zone.clone()).or_default();
            if series.last().is_none_or(|(_, last)| *last != price) {
                series.push((time, price));
            }
        }
    }
    changes
}

/// What EC2 returns for a window: the record in force at `start`, then changes up to `end`.
fn expected_window(
    changes: &[(DateTime<Utc>, f64)],
    start: DateTime<Utc>,
    end: DateTime<Utc>,
) -> Vec<(DateTime<Utc>, f64)> {
    let first = changes
        .partition_point(|(t, _)| *t <= start)
        .saturating_sub(1);
    let last = changes.partition_point(|(t, _)| *t <= end);
    changes[first..last].to_vec()
}

#[tokio::test]
async fn price_history_pages_return_exactly_the_trace_window() {
    let Some(moto) = Moto::start("price_history") else {
        return;
    };
    let ec2 = moto.client("us-east-1").await;
    let start = Utc.with_ymd_and_hms(2023, 2, 18, 0, 0, 0).unwrap();
    let end = Utc.with_ymd_and_hms(2023, 2, 25, 0, 0, 0).unwrap();
    let query = SpotPriceQuery {
        instance_types: vec!["p3.2xlarge".into()],
        zones: vec![
            "us-east-1a".into(),
            "us-east-1c".into(),
            "us-east-1d".into(),
        ],
        start: Some(start),
        end: Some(end),
        page_size: Some(5),
        ..SpotPriceQuery::default()
    };
    let points = ec2.spot_price_history(&query).await.unwrap();

    let changes = trace_changes();
    let mut expected: Vec<(DateTime<Utc>, String, f64)> = Vec::new();
    for zone in &query.zones {
        for (time, price) in expected_window(&changes[zone], start, end) {
            expected.push((time, zone.clone(), price));
        }
    }
    expected.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
    let got: Vec<(DateTime<Utc>, String, f64)> = points
        .iter()
        .map(|p| (p.timestamp, p.zone.clone(), p.price_usd_hr))
        .collect();
    assert!(
        expected.len() > 5,
        "the window must span several pages, has {} points",
        expected.len()
    );
    assert_eq!(got, expected);
    assert!(points.iter().all(|p| p.instance_type == "p3.2xlarge"));
    assert!(points.iter().all(|p| p.product_description == "Linux/UNIX"));

    // No zone filter: every zone of the region, and only those.
    let whole_region = SpotPriceQuery {
        zones: Vec::new(),
        ..query.clone()
    };
    let zones: BTreeSet<String> = ec2
        .spot_price_history(&whole_region)
        .await
        .unwrap()
        .into_iter()
        .map(|p| p.zone)
        .collect();
    let want: BTreeSet<String> = changes
        .keys()
        .filter(|z| z.starts_with("us-east-1"))
        .cloned()
        .collect();
    assert_eq!(zones, want);

    // Another region sees its own zones; a product the trace lacks has no history.
    let oregon = moto.client("us-west-2").await;
    let west = oregon.spot_price_history(&whole_region).await.unwrap();
    assert!(!west.is_empty());
    assert!(west.iter().all(|p| p.zone.starts_with("us-west-2")));
    let windows = SpotPriceQuery {
        product_descriptions: vec!["Windows".into()],
        ..query
    };
    assert!(ec2.spot_price_history(&windows).await.unwrap().is_empty());
}

#[tokio::test]
async fn instance_types_and_offerings() {
    let Some(moto) = Moto::start("instance_types") else {
        return;
    };
    let ec2 = moto.client("us-east-1").await;
    let types = ec2
        .instance_types(&["p3.2xlarge".to_owned(), "m5.large".to_owned()])
        .await
        .unwrap();
    let sizes: Vec<(&str, u32, u64)> = types
        .iter()
        .map(|t| (t.instance_type.as_str(), t.vcpus, t.memory_mib))
        .collect();
    assert_eq!(sizes, vec![("m5.large", 2, 8192), ("p3.2xlarge", 8, 62464)]);
    let p3 = &types[1];
    assert_eq!(p3.gpus, 1);
    assert!(p3.spot_supported);

    let offerings = ec2
        .instance_type_offerings(&["p3.2xlarge".to_owned()], &[])
        .await
        .unwrap();
    assert!(!offerings.is_empty());
    assert!(
        offerings
            .iter()
            .all(|o| o.instance_type == "p3.2xlarge" && o.zone.starts_with("us-east-1")),
        "{offerings:?}"
    );
    let one_zone = ec2
        .instance_type_offerings(&["p3.2xlarge".to_owned()], &[offerings[0].zone.clone()])
        .await
        .unwrap();
    assert_eq!(one_zone, vec![offerings[0].clone()]);

    let unknown = ec2
        .instance_types(&["zz9.plural".to_owned()])
        .await
        .unwrap_err();
    assert!(
        matches!(
            unknown.category(),
            ErrorCategory::InvalidRequest | ErrorCategory::NotFound
        ),
        "{unknown}"
    );
    assert_eq!(unknown.retry(), RetryAdvice::Never);
}

#[tokio::test]
async fn placement_scores_are_unsupported_by_moto() {
    let Some(moto) = Moto::start("placement_scores") else {
        return;
    };
    let ec2 = moto.client("us-east-1").await;
    let query = PlacementScoreQuery {
        instance_types: vec!["p3.2xlarge".into()],
        target_capacity: 4,
        single_availability_zone: true,
        regions: vec!["us-east-1".into()],
    };
    let error = ec2.spot_placement_scores(&query).await.unwrap_err();
    assert_eq!(error.category(), ErrorCategory::Unsupported, "{error}");
    assert_eq!(error.code(), Some("UnsupportedOperation"));
    assert!(!error.is_retryable());
}

fn launch(job: &str, tier: Tier, capacity: Capacity, count: u32) -> LaunchRequest {
    let capacity_label = match capacity {
        Capacity::OnDemand => "on-demand",
        Capacity::Spot { .. } => "spot",
    };
    LaunchRequest {
        image_id: AMI.into(),
        instance_type: "p3.2xlarge".into(),
        zone: Some("us-east-1a".into()),
        subnet_id: None,
        count,
        capacity,
        tags: JobTags {
            job: job.into(),
            tier,
            pool: format!("p3.2xlarge/us-east-1a/{capacity_label}"),
        },
        extra_tags: BTreeMap::new(),
        security_group_ids: Vec::new(),
        iam_instance_profile: None,
        user_data_base64: None,
        client_token: None,
    }
}

#[tokio::test]
async fn launch_describe_and_terminate_a_jobs_instances() {
    let Some(moto) = Moto::start("launch") else {
        return;
    };
    let ec2 = moto.client("us-east-1").await;
    let job = "ml/mf-1";
    let spot = ec2
        .run_instances(&launch(
            job,
            Tier::Transient,
            Capacity::Spot {
                max_price_usd_hr: Some(1.25),
            },
            2,
        ))
        .await
        .unwrap();
    assert_eq!(spot.len(), 2);
    assert!(spot.iter().all(|i| i.capacity_type == CapacityType::Spot));
    let on_demand = ec2
        .run_instances(&launch(job, Tier::Reliable, Capacity::OnDemand, 1))
        .await
        .unwrap();
    assert_eq!(on_demand.len(), 1);
    assert_eq!(on_demand[0].capacity_type, CapacityType::OnDemand);
    // Someone else's instance must never be listed or touched.
    let other = ec2
        .run_instances(&launch("ml/other", Tier::Reliable, Capacity::OnDemand, 1))
        .await
        .unwrap();

    let listed = ec2.job_instances(job, false).await.unwrap();
    let mut launched_ids: Vec<String> = spot
        .iter()
        .chain(&on_demand)
        .map(|i| i.instance_id.clone())
        .collect();
    launched_ids.sort();
    let listed_ids: Vec<String> = listed.iter().map(|i| i.instance_id.clone()).collect();
    assert_eq!(listed_ids, launched_ids);
    for instance in &listed {
        let tags = instance.job_tags().expect("ebbflow tags");
        assert_eq!(tags.job, job);
        assert_eq!(instance.zone.as_deref(), Some("us-east-1a"));
        assert_eq!(instance.instance_type, "p3.2xlarge");
        let (tier, pool_suffix) = match instance.capacity_type {
            CapacityType::Spot => (Tier::Transient, "spot"),
            CapacityType::OnDemand => (Tier::Reliable, "on-demand"),
        };
        assert_eq!(tags.tier, tier);
        assert!(tags.pool.ends_with(pool_suffix), "{}", tags.pool);
        assert!(matches!(
            instance.state,
            InstanceState::Pending | InstanceState::Running
        ));
    }

    let terminated = ec2.terminate_instances(&launched_ids).await.unwrap();
    assert_eq!(terminated.len(), 3);
    assert!(
        terminated
            .iter()
            .all(|t| t.current_state.as_ref().is_some_and(InstanceState::is_gone)),
        "{terminated:?}"
    );
    assert!(ec2.job_instances(job, false).await.unwrap().is_empty());
    let with_terminated = ec2.job_instances(job, true).await.unwrap();
    assert_eq!(with_terminated.len(), 3);

    // Idempotent: terminating again, or an instance EC2 never knew, is not an error.
    let mut again = launched_ids.clone();
    again.push("i-0123456789abcdef0".into());
    let repeated = ec2.terminate_instances(&again).await.unwrap();
    assert_eq!(repeated.len(), 4);
    let unknown = repeated
        .iter()
        .find(|t| t.instance_id == "i-0123456789abcdef0")
        .unwrap();
    assert_eq!(unknown.current_state, None);

    let survivors = ec2.job_instances("ml/other", false).await.unwrap();
    assert_eq!(survivors.len(), 1);
    assert_eq!(survivors[0].instance_id, other[0].instance_id);
}

#[tokio::test]
async fn bad_requests_give_typed_errors() {
    let Some(moto) = Moto::start("bad_requests") else {
        return;
    };
    let ec2 = moto.client("us-east-1").await;
    let mut unknown_type = launch("ml/bad", Tier::Transient, Capacity::OnDemand, 1);
    unknown_type.instance_type = "zz9.plural".into();
    let error = ec2.run_instances(&unknown_type).await.unwrap_err();
    assert!(
        matches!(
            error.category(),
            ErrorCategory::InvalidRequest | ErrorCategory::NotFound
        ),
        "{error}"
    );
    assert_eq!(error.retry(), RetryAdvice::Never);
    assert!(error.to_string().contains("zz9.plural"), "{error}");

    let mut wrong_zone = launch("ml/bad", Tier::Transient, Capacity::OnDemand, 1);
    wrong_zone.zone = Some("eu-west-1a".into());
    let error = ec2.run_instances(&wrong_zone).await.unwrap_err();
    assert_eq!(error.retry(), RetryAdvice::Never, "{error}");
    assert!(error.code().is_some(), "{error}");

    let error = ec2
        .terminate_instances(&["not-an-instance-id".to_owned()])
        .await;
    // moto answers malformed IDs like unknown ones; either way nothing is launched or leaked.
    if let Err(error) = error {
        assert_eq!(error.retry(), RetryAdvice::Never, "{error}");
    }
    assert!(ec2.job_instances("ml/bad", true).await.unwrap().is_empty());
}

#[tokio::test]
async fn instant_fleet_launches_tagged_spot_instances() {
    let Some(moto) = Moto::start("fleet") else {
        return;
    };
    let ec2 = moto.client("us-east-1").await;
    ec2.client()
        .create_launch_template()
        .launch_template_name("ebbflow-node")
        .launch_template_data(
            aws_sdk_ec2::types::RequestLaunchTemplateData::builder()
                .image_id(AMI)
                .instance_type(aws_sdk_ec2::types::InstanceType::P32xlarge)
                .build(),
        )
        .send()
        .await
        .expect("create launch template");
    let request = FleetRequest {
        launch_template: LaunchTemplateRef::Name("ebbflow-node".into()),
        launch_template_version: None,
        pools: vec![FleetPool {
            instance_type: "p3.2xlarge".into(),
            zone: Some("us-east-1a".into()),
            subnet_id: None,
            max_price_usd_hr: Some(1.5),
        }],
        spot_count: 2,
        on_demand_count: 0,
        tags: JobTags {
            job: "ml/fleet".into(),
            tier: Tier::Transient,
            pool: "p3.2xlarge/us-east-1a/spot".into(),
        },
        client_token: None,
    };
    let outcome = ec2.create_instant_fleet(&request).await.unwrap();
    assert!(outcome.fleet_id.starts_with("fleet-"), "{outcome:?}");
    assert_eq!(outcome.instances.len(), 2, "{outcome:?}");
    assert!(outcome.errors.is_empty(), "{outcome:?}");
    let listed = ec2.job_instances("ml/fleet", false).await.unwrap();
    let mut fleet_ids: Vec<String> = outcome
        .instances
        .iter()
        .map(|i| i.instance_id.clone())
        .collect();
    fleet_ids.sort();
    let listed_ids: Vec<String> = listed.iter().map(|i| i.instance_id.clone()).collect();
    assert_eq!(listed_ids, fleet_ids);
    assert!(listed.iter().all(|i| i.job_tags().is_some()));
    ec2.terminate_instances(&fleet_ids).await.unwrap();
    assert!(
        ec2.job_instances("ml/fleet", false)
            .await
            .unwrap()
            .is_empty()
    );
}

#[tokio::test]
async fn launcher_reads_cli_json_and_long_csv_traces() {
    if std::env::var_os("EBBFLOW_PYTHON").is_none() {
        eprintln!("other_formats: skipped: set EBBFLOW_PYTHON (scripts/setup-python.sh)");
        return;
    }
    let dir = TempDir::new("formats");
    // What `aws ec2 describe-spot-price-history` prints (newest first, as EC2 answers).
    let json = dir.path().join("history.json");
    std::fs::write(
        &json,
        r#"{"SpotPriceHistory": [
  {"AvailabilityZone": "us-east-1b", "InstanceType": "m5.large", "ProductDescription": "Linux/UNIX",
   "SpotPrice": "0.041200", "Timestamp": "2024-05-01T12:00:00+00:00"},
  {"AvailabilityZone": "us-east-1b", "InstanceType": "m5.large", "ProductDescription": "Linux/UNIX",
   "SpotPrice": "0.039800", "Timestamp": "2024-05-01T06:00:00+00:00"}
]}"#,
    )
    .unwrap();
    let long = dir.path().join("long.csv");
    std::fs::write(
        &long,
        "timestamp,instance_type,zone,price_usd_hr\n\
         2024-05-01T00:00:00Z,c5.large,us-east-1a,0.0350\n\
         2024-05-01T01:00:00Z,c5.large,us-east-1a,0.0350\n\
         2024-05-01T02:00:00Z,c5.large,us-east-1a,0.0371\n",
    )
    .unwrap();
    let at = |h: u32| Utc.with_ymd_and_hms(2024, 5, 1, h, 0, 0).unwrap();

    let moto = Moto::start_with_trace("json_format", &json).unwrap();
    let ec2 = moto.client("us-east-1").await;
    let points = ec2
        .spot_price_history(&SpotPriceQuery::default())
        .await
        .unwrap();
    let got: Vec<(DateTime<Utc>, &str, f64)> = points
        .iter()
        .map(|p| (p.timestamp, p.instance_type.as_str(), p.price_usd_hr))
        .collect();
    assert_eq!(
        got,
        vec![(at(6), "m5.large", 0.0398), (at(12), "m5.large", 0.0412)]
    );
    drop(moto);

    let moto = Moto::start_with_trace("long_format", &long).unwrap();
    let ec2 = moto.client("us-east-1").await;
    let query = SpotPriceQuery {
        start: Some(at(1)),
        ..SpotPriceQuery::default()
    };
    let points = ec2.spot_price_history(&query).await.unwrap();
    let got: Vec<(DateTime<Utc>, f64)> = points
        .iter()
        .map(|p| (p.timestamp, p.price_usd_hr))
        .collect();
    // The repeated 01:00 price is no change; the price in force at 01:00 is the 00:00 record.
    assert_eq!(got, vec![(at(0), 0.035), (at(2), 0.0371)]);
}

#[tokio::test]
async fn launcher_maps_spotlake_zone_ids_to_zone_names() {
    let spotlake =
        ebbflow_ec2::moto::p3_trace().with_file_name("aws_spotlake_hourly_2024-01_5regions.csv");
    let Some(moto) = Moto::start_with_trace("spotlake_format", &spotlake) else {
        return;
    };
    let ec2 = moto.client("us-east-1").await;
    let query = SpotPriceQuery {
        instance_types: vec!["c5.large".into()],
        start: Some(Utc.with_ymd_and_hms(2024, 1, 10, 0, 0, 0).unwrap()),
        end: Some(Utc.with_ymd_and_hms(2024, 1, 12, 0, 0, 0).unwrap()),
        ..SpotPriceQuery::default()
    };
    let points = ec2.spot_price_history(&query).await.unwrap();
    assert!(!points.is_empty());
    let mut reader = csv::Reader::from_path(&spotlake).unwrap();
    let traced: BTreeSet<String> = reader
        .records()
        .map(|r| r.unwrap())
        .filter(|r| &r[1] == "c5.large" && &r[2] == "us-east-1")
        .map(|r| r[7].parse::<f64>().unwrap().to_string())
        .collect();
    for point in &points {
        assert!(point.zone.starts_with("us-east-1"), "{point:?}");
        assert_eq!(point.instance_type, "c5.large");
        assert!(
            traced.contains(&point.price_usd_hr.to_string()),
            "{point:?}"
        );
    }
}
