//! Request building and response parsing against recorded EC2 responses (no network).
//!
//! The XML bodies follow the EC2 API reference's examples (query protocol, 2016-11-15).

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};

use aws_config::BehaviorVersion;
use aws_sdk_ec2::config::retry::RetryConfig;
use aws_sdk_ec2::config::{Credentials, Region};
use aws_smithy_http_client::test_util::infallible_client_fn;
use chrono::{TimeZone, Utc};

use super::*;
use crate::types::{Tier, format_price};

/// A recorded exchange: the form parameters the SDK sent, and the response it got.
#[derive(Default)]
struct Recorder {
    responses: Mutex<VecDeque<(u16, String)>>,
    requests: Mutex<Vec<BTreeMap<String, String>>>,
}

impl Recorder {
    fn requests(&self) -> Vec<BTreeMap<String, String>> {
        self.requests.lock().unwrap().clone()
    }
}

/// An [`SdkEc2`] whose HTTP client answers with `responses` in order, SDK retries off.
fn replay(responses: &[(u16, &str)]) -> (SdkEc2, Arc<Recorder>) {
    let recorder = Arc::new(Recorder {
        responses: Mutex::new(
            responses
                .iter()
                .map(|(status, body)| (*status, (*body).to_owned()))
                .collect(),
        ),
        requests: Mutex::default(),
    });
    let seen = recorder.clone();
    let http_client = infallible_client_fn(move |request: http::Request<_>| {
        let body = request.body().bytes().unwrap_or_default();
        seen.requests
            .lock()
            .unwrap()
            .push(parse_form(std::str::from_utf8(body).unwrap()));
        let (status, body) = seen
            .responses
            .lock()
            .unwrap()
            .pop_front()
            .expect("more requests than recorded responses");
        http::Response::builder()
            .status(status)
            .header("content-type", "text/xml;charset=UTF-8")
            .body(body)
            .unwrap()
    });
    let config = aws_sdk_ec2::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new(
            "AKIDTEST",
            "s3cr3t-never-shown",
            None,
            None,
            "t",
        ))
        .retry_config(RetryConfig::disabled())
        .http_client(http_client)
        .build();
    (SdkEc2::from_client(Client::from_conf(config)), recorder)
}

fn parse_form(body: &str) -> BTreeMap<String, String> {
    body.split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            (percent_decode(key), percent_decode(value))
        })
        .collect()
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap();
                out.push(u8::from_str_radix(hex, 16).unwrap());
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            byte => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8(out).unwrap()
}

fn error_xml(code: &str, message: &str) -> String {
    format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Response><Errors><Error><Code>{code}</Code>\
         <Message>{message}</Message></Error></Errors>\
         <RequestID>ea966190-f9aa-478e-9ede-example</RequestID></Response>"
    )
}

const PRICES_PAGE_1: &str = r#"<?xml version="1.0" encoding="UTF-8"?>
<DescribeSpotPriceHistoryResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/">
  <requestId>59dbff89-35bd-4eac-99ed-be587EXAMPLE</requestId>
  <spotPriceHistorySet>
    <item>
      <instanceType>p3.2xlarge</instanceType>
      <productDescription>Linux/UNIX</productDescription>
      <spotPrice>0.918300</spotPrice>
      <timestamp>2023-02-20T21:37:30.000Z</timestamp>
      <availabilityZone>us-east-1a</availabilityZone>
    </item>
    <item>
      <instanceType>p3.2xlarge</instanceType>
      <productDescription>Linux/UNIX</productDescription>
      <spotPrice>1.1626</spotPrice>
      <timestamp>2023-02-20T10:00:00.000Z</timestamp>
      <availabilityZone>us-east-1f</availabilityZone>
    </item>
  </spotPriceHistorySet>
  <nextToken>page-2-token</nextToken>
</DescribeSpotPriceHistoryResponse>"#;

const PRICES_PAGE_2: &str = r#"<?xml version="1.0" encoding="UTF-8"?>
<DescribeSpotPriceHistoryResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/">
  <requestId>59dbff89-35bd-4eac-99ed-be587EXAMPLF</requestId>
  <spotPriceHistorySet>
    <item>
      <instanceType>p3.2xlarge</instanceType>
      <productDescription>Linux/UNIX</productDescription>
      <spotPrice>0.9500</spotPrice>
      <timestamp>2023-02-19T23:00:00.000Z</timestamp>
      <availabilityZone>us-east-1a</availabilityZone>
    </item>
  </spotPriceHistorySet>
  <nextToken></nextToken>
</DescribeSpotPriceHistoryResponse>"#;

#[tokio::test]
async fn spot_price_history_follows_pages_and_builds_the_filters() {
    let (ec2, recorder) = replay(&[(200, PRICES_PAGE_1), (200, PRICES_PAGE_2)]);
    let query = SpotPriceQuery {
        instance_types: vec!["p3.2xlarge".into()],
        zones: vec!["us-east-1a".into(), "us-east-1f".into()],
        start: Some(Utc.with_ymd_and_hms(2023, 2, 20, 0, 0, 0).unwrap()),
        end: Some(Utc.with_ymd_and_hms(2023, 2, 21, 0, 0, 0).unwrap()),
        page_size: Some(5),
        ..SpotPriceQuery::default()
    };
    let points = ec2.spot_price_history(&query).await.unwrap();

    let requests = recorder.requests();
    assert_eq!(requests.len(), 2);
    let first = &requests[0];
    assert_eq!(first["Action"], "DescribeSpotPriceHistory");
    assert_eq!(first["InstanceType.1"], "p3.2xlarge");
    assert_eq!(first["ProductDescription.1"], "Linux/UNIX");
    assert_eq!(first["Filter.1.Name"], "availability-zone");
    assert_eq!(first["Filter.1.Value.1"], "us-east-1a");
    assert_eq!(first["Filter.1.Value.2"], "us-east-1f");
    assert_eq!(first["StartTime"], "2023-02-20T00:00:00Z");
    assert_eq!(first["EndTime"], "2023-02-21T00:00:00Z");
    assert_eq!(first["MaxResults"], "5");
    assert!(!first.contains_key("NextToken"));
    assert_eq!(requests[1]["NextToken"], "page-2-token");

    let summary: Vec<(String, f64, String)> = points
        .iter()
        .map(|p| (p.zone.clone(), p.price_usd_hr, p.timestamp.to_rfc3339()))
        .collect();
    assert_eq!(
        summary,
        vec![
            (
                "us-east-1a".into(),
                0.95,
                "2023-02-19T23:00:00+00:00".into()
            ),
            (
                "us-east-1f".into(),
                1.1626,
                "2023-02-20T10:00:00+00:00".into()
            ),
            (
                "us-east-1a".into(),
                0.9183,
                "2023-02-20T21:37:30+00:00".into()
            ),
        ]
    );
    assert!(points.iter().all(|p| p.instance_type == "p3.2xlarge"));
    assert!(points.iter().all(|p| p.product_description == "Linux/UNIX"));
}

#[tokio::test]
async fn a_zero_or_missing_price_is_an_error_not_a_free_instance() {
    let zero = PRICES_PAGE_2.replace("0.9500", "0.0000");
    let (ec2, _) = replay(&[(200, &zero)]);
    let error = ec2
        .spot_price_history(&SpotPriceQuery::default())
        .await
        .unwrap_err();
    assert_eq!(error.category(), ErrorCategory::InvalidResponse, "{error}");
    assert!(error.to_string().contains("bad spot price"), "{error}");

    let missing = PRICES_PAGE_2.replace("<spotPrice>0.9500</spotPrice>", "");
    let (ec2, _) = replay(&[(200, &missing)]);
    let error = ec2
        .spot_price_history(&SpotPriceQuery::default())
        .await
        .unwrap_err();
    assert_eq!(error.category(), ErrorCategory::InvalidResponse, "{error}");
}

#[tokio::test]
async fn invalid_queries_are_rejected_before_sending() {
    let (ec2, recorder) = replay(&[]);
    let query = SpotPriceQuery {
        page_size: Some(3),
        ..SpotPriceQuery::default()
    };
    let error = ec2.spot_price_history(&query).await.unwrap_err();
    assert_eq!(error.category(), ErrorCategory::InvalidArgument);
    let backwards = SpotPriceQuery {
        start: Some(Utc.with_ymd_and_hms(2023, 2, 21, 0, 0, 0).unwrap()),
        end: Some(Utc.with_ymd_and_hms(2023, 2, 20, 0, 0, 0).unwrap()),
        ..SpotPriceQuery::default()
    };
    let error = ec2.spot_price_history(&backwards).await.unwrap_err();
    assert_eq!(error.category(), ErrorCategory::InvalidArgument);

    let mut launch = spot_launch(Some(0.0));
    let error = ec2.run_instances(&launch).await.unwrap_err();
    assert_eq!(error.category(), ErrorCategory::InvalidArgument);
    launch.capacity = Capacity::OnDemand;
    launch.count = 0;
    let error = ec2.run_instances(&launch).await.unwrap_err();
    assert_eq!(error.category(), ErrorCategory::InvalidArgument);
    assert!(recorder.requests().is_empty());
}

fn spot_launch(max_price: Option<f64>) -> LaunchRequest {
    LaunchRequest {
        image_id: "ami-03cf127a".into(),
        instance_type: "p3.2xlarge".into(),
        zone: Some("us-east-1a".into()),
        subnet_id: None,
        count: 2,
        capacity: Capacity::Spot {
            max_price_usd_hr: max_price,
        },
        tags: JobTags {
            job: "ml/mf-1".into(),
            tier: Tier::Transient,
            pool: "p3.2xlarge/us-east-1a/spot".into(),
        },
        extra_tags: BTreeMap::from([("team".to_owned(), "ml".to_owned())]),
        security_group_ids: vec!["sg-1".into()],
        iam_instance_profile: None,
        user_data_base64: None,
        client_token: Some("ebbflow-ml-mf-1-7".into()),
    }
}

const RUN_INSTANCES_SPOT: &str = r#"<?xml version="1.0" encoding="UTF-8"?>
<RunInstancesResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/">
  <requestId>7a62c49f-347e-4fc4-9331-6e8eEXAMPLE</requestId>
  <reservationId>r-1234567890abcdef0</reservationId>
  <ownerId>123456789012</ownerId>
  <instancesSet>
    <item>
      <instanceId>i-1234567890abcdef0</instanceId>
      <imageId>ami-03cf127a</imageId>
      <instanceState><code>0</code><name>pending</name></instanceState>
      <privateIpAddress>10.0.0.12</privateIpAddress>
      <instanceType>p3.2xlarge</instanceType>
      <launchTime>2026-11-22T05:00:00.000Z</launchTime>
      <placement><availabilityZone>us-east-1a</availabilityZone><tenancy>default</tenancy></placement>
      <instanceLifecycle>spot</instanceLifecycle>
      <spotInstanceRequestId>sir-abcd1234</spotInstanceRequestId>
      <tagSet>
        <item><key>ebbflow.dev/job</key><value>ml/mf-1</value></item>
        <item><key>ebbflow.dev/tier</key><value>transient</value></item>
        <item><key>ebbflow.dev/pool</key><value>p3.2xlarge/us-east-1a/spot</value></item>
      </tagSet>
    </item>
  </instancesSet>
</RunInstancesResponse>"#;

#[tokio::test]
async fn spot_launch_sets_market_options_tags_and_token() {
    let (ec2, recorder) = replay(&[(200, RUN_INSTANCES_SPOT)]);
    let instances = ec2.run_instances(&spot_launch(Some(1.25))).await.unwrap();

    let sent = &recorder.requests()[0];
    let expect = [
        ("Action", "RunInstances"),
        ("ImageId", "ami-03cf127a"),
        ("InstanceType", "p3.2xlarge"),
        ("MinCount", "1"),
        ("MaxCount", "2"),
        ("Placement.AvailabilityZone", "us-east-1a"),
        ("SecurityGroupId.1", "sg-1"),
        ("ClientToken", "ebbflow-ml-mf-1-7"),
        ("InstanceMarketOptions.MarketType", "spot"),
        ("InstanceMarketOptions.SpotOptions.MaxPrice", "1.25"),
        (
            "InstanceMarketOptions.SpotOptions.SpotInstanceType",
            "one-time",
        ),
        (
            "InstanceMarketOptions.SpotOptions.InstanceInterruptionBehavior",
            "terminate",
        ),
        ("TagSpecification.1.ResourceType", "instance"),
        ("TagSpecification.1.Tag.1.Key", "team"),
        ("TagSpecification.1.Tag.2.Key", "ebbflow.dev/job"),
        ("TagSpecification.1.Tag.2.Value", "ml/mf-1"),
        ("TagSpecification.1.Tag.3.Key", "ebbflow.dev/tier"),
        ("TagSpecification.1.Tag.3.Value", "transient"),
        ("TagSpecification.1.Tag.4.Key", "ebbflow.dev/pool"),
        (
            "TagSpecification.1.Tag.4.Value",
            "p3.2xlarge/us-east-1a/spot",
        ),
    ];
    for (key, value) in expect {
        assert_eq!(sent.get(key).map(String::as_str), Some(value), "{key}");
    }

    assert_eq!(instances.len(), 1);
    let instance = &instances[0];
    assert_eq!(instance.instance_id, "i-1234567890abcdef0");
    assert_eq!(instance.state, InstanceState::Pending);
    assert_eq!(instance.capacity_type, CapacityType::Spot);
    assert_eq!(instance.zone.as_deref(), Some("us-east-1a"));
    assert_eq!(instance.private_ip.as_deref(), Some("10.0.0.12"));
    assert_eq!(instance.spot_request_id.as_deref(), Some("sir-abcd1234"));
    assert_eq!(
        instance.launch_time,
        Some(Utc.with_ymd_and_hms(2026, 11, 22, 5, 0, 0).unwrap())
    );
    let tags = instance.job_tags().unwrap();
    assert_eq!((tags.job.as_str(), tags.tier), ("ml/mf-1", Tier::Transient));
}

#[tokio::test]
async fn on_demand_launch_has_no_market_options() {
    let on_demand = RUN_INSTANCES_SPOT
        .replace("<instanceLifecycle>spot</instanceLifecycle>", "")
        .replace(
            "<spotInstanceRequestId>sir-abcd1234</spotInstanceRequestId>",
            "",
        );
    let (ec2, recorder) = replay(&[(200, &on_demand)]);
    let mut launch = spot_launch(None);
    launch.capacity = Capacity::OnDemand;
    launch.tags.tier = Tier::Reliable;
    let instances = ec2.run_instances(&launch).await.unwrap();
    let sent = &recorder.requests()[0];
    assert!(
        !sent.keys().any(|k| k.starts_with("InstanceMarketOptions")),
        "{sent:?}"
    );
    assert_eq!(sent["TagSpecification.1.Tag.3.Value"], "reliable");
    assert_eq!(instances[0].capacity_type, CapacityType::OnDemand);
    assert_eq!(instances[0].spot_request_id, None);
}

#[tokio::test]
async fn spot_launch_without_max_price_omits_it() {
    let (ec2, recorder) = replay(&[(200, RUN_INSTANCES_SPOT)]);
    ec2.run_instances(&spot_launch(None)).await.unwrap();
    let sent = &recorder.requests()[0];
    assert_eq!(sent["InstanceMarketOptions.MarketType"], "spot");
    assert!(!sent.contains_key("InstanceMarketOptions.SpotOptions.MaxPrice"));
}

#[tokio::test]
async fn service_errors_are_classified() {
    let cases = [
        (503, "RequestLimitExceeded", ErrorCategory::Throttled, true),
        (500, "InternalError", ErrorCategory::Server, true),
        (401, "AuthFailure", ErrorCategory::Auth, false),
        (403, "UnauthorizedOperation", ErrorCategory::Auth, false),
        (
            400,
            "InvalidParameterValue",
            ErrorCategory::InvalidRequest,
            false,
        ),
        (
            400,
            "InsufficientInstanceCapacity",
            ErrorCategory::Capacity,
            false,
        ),
        (
            400,
            "UnsupportedOperation",
            ErrorCategory::Unsupported,
            false,
        ),
    ];
    for (status, code, category, retryable) in cases {
        let body = error_xml(code, "recorded message");
        let (ec2, _) = replay(&[(status, &body)]);
        let error = ec2
            .run_instances(&spot_launch(Some(1.0)))
            .await
            .unwrap_err();
        assert_eq!(error.category(), category, "{code}: {error}");
        assert_eq!(error.is_retryable(), retryable, "{code}");
        assert_eq!(error.code(), Some(code));
        assert_eq!(error.operation(), Some(Operation::RunInstances));
        assert!(error.to_string().contains("recorded message"), "{error}");
        assert!(!format!("{error:?}").contains("s3cr3t"), "{error:?}");
    }
}

#[tokio::test]
async fn an_html_500_is_a_retryable_server_error() {
    let (ec2, _) = replay(&[(
        500,
        "<!doctype html><title>500 Internal Server Error</title>",
    )]);
    let error = ec2
        .spot_price_history(&SpotPriceQuery::default())
        .await
        .unwrap_err();
    assert_eq!(error.category(), ErrorCategory::Server, "{error}");
    assert!(error.is_retryable());
}

const TERMINATE_ONE: &str = r#"<?xml version="1.0" encoding="UTF-8"?>
<TerminateInstancesResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/">
  <requestId>59dbff89-35bd-4eac-99ed-be587EXAMPLE</requestId>
  <instancesSet>
    <item>
      <instanceId>i-1</instanceId>
      <currentState><code>32</code><name>shutting-down</name></currentState>
      <previousState><code>16</code><name>running</name></previousState>
    </item>
  </instancesSet>
</TerminateInstancesResponse>"#;

#[tokio::test]
async fn terminate_skips_instances_ec2_no_longer_knows() {
    let not_found = error_xml(
        "InvalidInstanceID.NotFound",
        "The instance ID 'i-2' does not exist",
    );
    let (ec2, recorder) = replay(&[(400, &not_found), (200, TERMINATE_ONE), (400, &not_found)]);
    let ids = vec!["i-2".to_owned(), "i-1".to_owned(), "i-1".to_owned()];
    let results = ec2.terminate_instances(&ids).await.unwrap();
    let requests = recorder.requests();
    assert_eq!(requests.len(), 3);
    assert_eq!(requests[0]["InstanceId.1"], "i-1");
    assert_eq!(requests[0]["InstanceId.2"], "i-2");
    assert!(
        !requests[0].contains_key("InstanceId.3"),
        "ids are deduplicated"
    );
    assert_eq!(
        results,
        vec![
            TerminatedInstance {
                instance_id: "i-1".into(),
                previous_state: Some(InstanceState::Running),
                current_state: Some(InstanceState::ShuttingDown),
            },
            TerminatedInstance {
                instance_id: "i-2".into(),
                previous_state: None,
                current_state: None,
            },
        ]
    );
    let (ec2, recorder) = replay(&[]);
    assert!(ec2.terminate_instances(&[]).await.unwrap().is_empty());
    assert!(recorder.requests().is_empty());
}

const DESCRIBE_INSTANCE_TYPES: &str = r#"<?xml version="1.0" encoding="UTF-8"?>
<DescribeInstanceTypesResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/">
  <requestId>1</requestId>
  <instanceTypeSet>
    <item>
      <instanceType>p3.2xlarge</instanceType>
      <vCpuInfo><defaultVCpus>8</defaultVCpus></vCpuInfo>
      <memoryInfo><sizeInMiB>62464</sizeInMiB></memoryInfo>
      <gpuInfo><gpus><item><name>V100</name><manufacturer>NVIDIA</manufacturer><count>1</count></item></gpus></gpuInfo>
      <supportedUsageClasses><item>on-demand</item><item>spot</item></supportedUsageClasses>
    </item>
  </instanceTypeSet>
</DescribeInstanceTypesResponse>"#;

#[tokio::test]
async fn instance_types_parse_sizes() {
    let (ec2, recorder) = replay(&[(200, DESCRIBE_INSTANCE_TYPES)]);
    let infos = ec2
        .instance_types(&["p3.2xlarge".to_owned()])
        .await
        .unwrap();
    assert_eq!(recorder.requests()[0]["InstanceType.1"], "p3.2xlarge");
    assert_eq!(
        infos,
        vec![InstanceTypeInfo {
            instance_type: "p3.2xlarge".into(),
            vcpus: 8,
            memory_mib: 62464,
            gpus: 1,
            spot_supported: true,
        }]
    );
}

#[tokio::test]
async fn job_instances_filter_by_tag_and_live_states() {
    let body = r#"<?xml version="1.0" encoding="UTF-8"?>
<DescribeInstancesResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/">
  <requestId>1</requestId>
  <reservationSet/>
</DescribeInstancesResponse>"#;
    let (ec2, recorder) = replay(&[(200, body), (200, body)]);
    assert!(
        ec2.job_instances("ml/mf-1", false)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(ec2.job_instances("ml/mf-1", true).await.unwrap().is_empty());
    let requests = recorder.requests();
    assert_eq!(requests[0]["Filter.1.Name"], "tag:ebbflow.dev/job");
    assert_eq!(requests[0]["Filter.1.Value.1"], "ml/mf-1");
    assert_eq!(requests[0]["Filter.2.Name"], "instance-state-name");
    assert_eq!(requests[0]["Filter.2.Value.1"], "pending");
    assert!(!requests[1].contains_key("Filter.2.Name"));
}

#[tokio::test]
async fn fleet_request_building() {
    let body = r#"<?xml version="1.0" encoding="UTF-8"?>
<CreateFleetResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/">
  <requestId>1</requestId>
  <fleetId>fleet-12345678-1234-1234-1234-123456789012</fleetId>
  <errorSet>
    <item>
      <errorCode>InsufficientInstanceCapacity</errorCode>
      <errorMessage>none left</errorMessage>
      <lifecycle>spot</lifecycle>
      <launchTemplateAndOverrides>
        <overrides><instanceType>p3.2xlarge</instanceType><availabilityZone>us-east-1c</availabilityZone></overrides>
      </launchTemplateAndOverrides>
    </item>
  </errorSet>
  <fleetInstanceSet>
    <item>
      <instanceIds><item>i-a</item><item>i-b</item></instanceIds>
      <instanceType>p3.2xlarge</instanceType>
      <lifecycle>spot</lifecycle>
      <launchTemplateAndOverrides>
        <overrides><instanceType>p3.2xlarge</instanceType><availabilityZone>us-east-1a</availabilityZone></overrides>
      </launchTemplateAndOverrides>
    </item>
  </fleetInstanceSet>
</CreateFleetResponse>"#;
    let (ec2, recorder) = replay(&[(200, body)]);
    let request = FleetRequest {
        launch_template: LaunchTemplateRef::Name("ebbflow-node".into()),
        launch_template_version: None,
        pools: vec![
            crate::types::FleetPool {
                instance_type: "p3.2xlarge".into(),
                zone: Some("us-east-1a".into()),
                subnet_id: None,
                max_price_usd_hr: Some(1.5),
            },
            crate::types::FleetPool {
                instance_type: "p3.2xlarge".into(),
                zone: Some("us-east-1c".into()),
                subnet_id: None,
                max_price_usd_hr: None,
            },
        ],
        spot_count: 2,
        on_demand_count: 0,
        tags: spot_launch(None).tags,
        client_token: None,
    };
    let outcome = ec2.create_instant_fleet(&request).await.unwrap();
    let sent = &recorder.requests()[0];
    let expect = [
        ("Type", "instant"),
        (
            "LaunchTemplateConfigs.1.LaunchTemplateSpecification.LaunchTemplateName",
            "ebbflow-node",
        ),
        (
            "LaunchTemplateConfigs.1.LaunchTemplateSpecification.Version",
            "$Default",
        ),
        (
            "LaunchTemplateConfigs.1.Overrides.1.AvailabilityZone",
            "us-east-1a",
        ),
        ("LaunchTemplateConfigs.1.Overrides.1.MaxPrice", "1.5"),
        (
            "LaunchTemplateConfigs.1.Overrides.2.AvailabilityZone",
            "us-east-1c",
        ),
        ("TargetCapacitySpecification.TotalTargetCapacity", "2"),
        ("TargetCapacitySpecification.SpotTargetCapacity", "2"),
        (
            "TargetCapacitySpecification.DefaultTargetCapacityType",
            "spot",
        ),
        ("SpotOptions.AllocationStrategy", "price-capacity-optimized"),
        ("SpotOptions.InstanceInterruptionBehavior", "terminate"),
        ("TagSpecification.1.ResourceType", "instance"),
        ("TagSpecification.1.Tag.1.Key", "ebbflow.dev/job"),
    ];
    for (key, value) in expect {
        assert_eq!(sent.get(key).map(String::as_str), Some(value), "{key}");
    }
    assert!(!sent.contains_key("LaunchTemplateConfigs.1.Overrides.2.MaxPrice"));
    assert_eq!(outcome.instances.len(), 2);
    assert!(
        outcome
            .instances
            .iter()
            .all(|i| i.capacity_type == CapacityType::Spot
                && i.zone.as_deref() == Some("us-east-1a"))
    );
    assert_eq!(outcome.errors.len(), 1);
    assert_eq!(outcome.errors[0].code, "InsufficientInstanceCapacity");
    assert_eq!(outcome.errors[0].zone.as_deref(), Some("us-east-1c"));
}

#[tokio::test]
async fn an_unreachable_endpoint_is_a_retryable_connection_error_without_secrets() {
    // A port that was free a moment ago: connecting is refused.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    drop(listener);
    let mut config = Ec2Config::emulator("us-east-1", endpoint);
    config.credentials = Some(crate::StaticCredentials::new(
        "AKIDTEST",
        "s3cr3t-never-shown",
    ));
    config.max_attempts = 1;
    let ec2 = SdkEc2::connect(&config).await;
    let error = ec2
        .spot_price_history(&SpotPriceQuery::default())
        .await
        .unwrap_err();
    assert!(
        matches!(
            error.category(),
            ErrorCategory::Connection | ErrorCategory::Timeout
        ),
        "{error}"
    );
    assert!(error.is_retryable());
    assert!(
        !format!("{error} {error:?}").contains("s3cr3t"),
        "{error:?}"
    );
    assert_eq!(format_price("p", 2.0).unwrap(), "2");
}

#[tokio::test]
async fn spot_request_status_reports_interruptions() {
    let body = r#"<?xml version="1.0" encoding="UTF-8"?>
<DescribeSpotInstanceRequestsResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/">
  <requestId>1</requestId>
  <spotInstanceRequestSet>
    <item>
      <spotInstanceRequestId>sir-1a2b3c4d</spotInstanceRequestId>
      <spotPrice>1.25</spotPrice>
      <type>one-time</type>
      <state>active</state>
      <status>
        <code>marked-for-termination</code>
        <updateTime>2026-11-22T05:10:00.000Z</updateTime>
        <message>Your Spot Instance is marked for termination.</message>
      </status>
      <instanceId>i-1</instanceId>
    </item>
  </spotInstanceRequestSet>
</DescribeSpotInstanceRequestsResponse>"#;
    let (ec2, recorder) = replay(&[(200, body)]);
    let statuses = ec2.spot_requests(&["i-1".to_owned()]).await.unwrap();
    let sent = &recorder.requests()[0];
    assert_eq!(sent["Action"], "DescribeSpotInstanceRequests");
    assert_eq!(sent["Filter.1.Name"], "instance-id");
    assert_eq!(sent["Filter.1.Value.1"], "i-1");
    assert_eq!(statuses.len(), 1);
    let status = &statuses[0];
    assert_eq!(status.request_id, "sir-1a2b3c4d");
    assert_eq!(status.instance_id.as_deref(), Some("i-1"));
    assert_eq!(status.state.as_deref(), Some("active"));
    assert!(status.is_interrupted());
    assert_eq!(
        status.updated,
        Some(Utc.with_ymd_and_hms(2026, 11, 22, 5, 10, 0).unwrap())
    );
    let (ec2, recorder) = replay(&[]);
    assert!(ec2.spot_requests(&[]).await.unwrap().is_empty());
    assert!(recorder.requests().is_empty());
}

#[tokio::test]
async fn placement_scores_parse_and_reject_out_of_range_scores() {
    let body = r#"<?xml version="1.0" encoding="UTF-8"?>
<GetSpotPlacementScoresResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/">
  <requestId>1</requestId>
  <spotPlacementScoreSet>
    <item><region>us-east-1</region><availabilityZoneId>use1-az4</availabilityZoneId><score>9</score></item>
    <item><region>us-east-1</region><availabilityZoneId>use1-az6</availabilityZoneId><score>3</score></item>
  </spotPlacementScoreSet>
</GetSpotPlacementScoresResponse>"#;
    let query = PlacementScoreQuery {
        instance_types: vec!["p3.2xlarge".into(), "g5.xlarge".into()],
        target_capacity: 4,
        single_availability_zone: true,
        regions: vec!["us-east-1".into()],
    };
    let (ec2, recorder) = replay(&[(200, body)]);
    let scores = ec2.spot_placement_scores(&query).await.unwrap();
    let sent = &recorder.requests()[0];
    assert_eq!(sent["Action"], "GetSpotPlacementScores");
    assert_eq!(sent["InstanceType.1"], "p3.2xlarge");
    assert_eq!(sent["InstanceType.2"], "g5.xlarge");
    assert_eq!(sent["TargetCapacity"], "4");
    assert_eq!(sent["TargetCapacityUnitType"], "units");
    assert_eq!(sent["SingleAvailabilityZone"], "true");
    assert_eq!(sent["RegionName.1"], "us-east-1");
    assert_eq!(
        scores,
        vec![
            PlacementScore {
                region: "us-east-1".into(),
                zone_id: Some("use1-az4".into()),
                score: 9,
            },
            PlacementScore {
                region: "us-east-1".into(),
                zone_id: Some("use1-az6".into()),
                score: 3,
            },
        ]
    );
    let (ec2, _) = replay(&[(200, &body.replace("<score>3</score>", "<score>11</score>"))]);
    let error = ec2.spot_placement_scores(&query).await.unwrap_err();
    assert_eq!(error.category(), ErrorCategory::InvalidResponse, "{error}");
}
