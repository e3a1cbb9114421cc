//! [`Ec2Api`] over `aws-sdk-ec2`: request building, pagination, response parsing and error
//! classification.

use std::collections::BTreeMap;

use aws_config::BehaviorVersion;
use aws_sdk_ec2::Client;
use aws_sdk_ec2::config::http::HttpResponse;
use aws_sdk_ec2::config::retry::RetryConfig;
use aws_sdk_ec2::config::timeout::TimeoutConfig;
use aws_sdk_ec2::config::{Credentials, Region};
use aws_sdk_ec2::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};
use aws_sdk_ec2::primitives::DateTime as AwsDateTime;
use aws_sdk_ec2::types as sdk;
use aws_smithy_http_client::tls;
use chrono::{DateTime, Utc};
use tracing::debug;

use crate::api::{BoxFuture, Ec2Api, Ec2Result};
use crate::config::Ec2Config;
use crate::error::{Ec2Error, ErrorCategory, Operation, classify_code};
use crate::types::{
    Capacity, CapacityType, Ec2Instance, FleetInstance, FleetLaunchError, FleetOutcome,
    FleetRequest, InstanceState, InstanceTypeInfo, InstanceTypeOffering, JobTags, LaunchRequest,
    LaunchTemplateRef, PlacementScore, PlacementScoreQuery, SpotPricePoint, SpotPriceQuery,
    SpotRequestStatus, TAG_JOB, TerminatedInstance, format_price,
};

/// Instance states other than `terminated`: what a job's live instances can be in.
const LIVE_STATES: &[&str] = &["pending", "running", "shutting-down", "stopping", "stopped"];
/// EC2 caps the instance types named in one DescribeInstanceTypes call.
const INSTANCE_TYPES_PER_CALL: usize = 100;
/// A safe batch size for instance-ID lists.
const INSTANCE_IDS_PER_CALL: usize = 500;

/// [`Ec2Api`] implemented with the AWS SDK.
#[derive(Debug, Clone)]
pub struct SdkEc2 {
    client: Client,
}

impl SdkEc2 {
    /// Builds a client from `config`: rustls (ring) HTTPS, the SDK's standard retries with
    /// `max_attempts`, operation and connect timeouts, and static or default-chain credentials.
    pub async fn connect(config: &Ec2Config) -> Self {
        let http_client = aws_smithy_http_client::Builder::new()
            .tls_provider(tls::Provider::Rustls(
                tls::rustls_provider::CryptoMode::Ring,
            ))
            .build_https();
        let mut loader = aws_config::defaults(BehaviorVersion::latest())
            .region(Region::new(config.region.clone()))
            .http_client(http_client)
            .retry_config(RetryConfig::standard().with_max_attempts(config.max_attempts.max(1)))
            .timeout_config(
                TimeoutConfig::builder()
                    .operation_timeout(config.operation_timeout)
                    .connect_timeout(config.connect_timeout)
                    .build(),
            );
        if let Some(endpoint) = &config.endpoint_url {
            loader = loader.endpoint_url(endpoint.clone());
        }
        if let Some(credentials) = &config.credentials {
            loader = loader.credentials_provider(Credentials::new(
                credentials.access_key_id.clone(),
                credentials.secret_access_key.clone(),
                None,
                None,
                "ebbflow-static",
            ));
        }
        let shared = loader.load().await;
        Self {
            client: Client::new(&shared),
        }
    }

    /// Wraps an already configured SDK client (tests, custom middleware).
    pub fn from_client(client: Client) -> Self {
        Self { client }
    }

    /// The underlying SDK client, for operations outside the seam (test setup).
    pub fn client(&self) -> &Client {
        &self.client
    }

    async fn spot_price_history_impl(
        &self,
        query: &SpotPriceQuery,
    ) -> Ec2Result<Vec<SpotPricePoint>> {
        const OP: Operation = Operation::DescribeSpotPriceHistory;
        if let Some(size) = query.page_size
            && !(5..=1000).contains(&size)
        {
            return Err(Ec2Error::InvalidArgument {
                field: "page_size",
                reason: format!("must be within 5..=1000, got {size}"),
            });
        }
        if let (Some(start), Some(end)) = (query.start, query.end)
            && start > end
        {
            return Err(Ec2Error::InvalidArgument {
                field: "start",
                reason: format!("window start {start} is after its end {end}"),
            });
        }
        let mut request = self
            .client
            .describe_spot_price_history()
            .set_instance_types(non_empty(
                query
                    .instance_types
                    .iter()
                    .map(|t| sdk::InstanceType::from(t.as_str()))
                    .collect(),
            ))
            .set_product_descriptions(non_empty(query.product_descriptions.clone()))
            .set_start_time(query.start.map(to_aws_time))
            .set_end_time(query.end.map(to_aws_time))
            .set_max_results(query.page_size.map(|size| size as i32));
        if !query.zones.is_empty() {
            request = request.filters(filter("availability-zone", &query.zones));
        }
        let mut pages = request.into_paginator().send();
        let mut points = Vec::new();
        let mut page_count = 0_usize;
        while let Some(page) = pages.next().await {
            let page = page.map_err(|error| api_error(OP, error))?;
            page_count += 1;
            for record in page.spot_price_history() {
                points.push(spot_price_from_sdk(record)?);
            }
        }
        debug!(
            pages = page_count,
            points = points.len(),
            "spot price history read"
        );
        points.sort_by(|a, b| {
            (a.timestamp, &a.zone, &a.instance_type).cmp(&(b.timestamp, &b.zone, &b.instance_type))
        });
        Ok(points)
    }

    async fn instance_types_impl(
        &self,
        instance_types: &[String],
    ) -> Ec2Result<Vec<InstanceTypeInfo>> {
        const OP: Operation = Operation::DescribeInstanceTypes;
        let batches: Vec<Option<Vec<sdk::InstanceType>>> = if instance_types.is_empty() {
            vec![None]
        } else {
            instance_types
                .chunks(INSTANCE_TYPES_PER_CALL)
                .map(|chunk| {
                    Some(
                        chunk
                            .iter()
                            .map(|t| sdk::InstanceType::from(t.as_str()))
                            .collect(),
                    )
                })
                .collect()
        };
        let mut infos = Vec::new();
        for batch in batches {
            let mut pages = self
                .client
                .describe_instance_types()
                .set_instance_types(batch)
                .into_paginator()
                .send();
            while let Some(page) = pages.next().await {
                let page = page.map_err(|error| api_error(OP, error))?;
                for info in page.instance_types() {
                    infos.push(instance_type_from_sdk(info)?);
                }
            }
        }
        infos.sort_by(|a, b| a.instance_type.cmp(&b.instance_type));
        Ok(infos)
    }

    async fn instance_type_offerings_impl(
        &self,
        instance_types: &[String],
        zones: &[String],
    ) -> Ec2Result<Vec<InstanceTypeOffering>> {
        const OP: Operation = Operation::DescribeInstanceTypeOfferings;
        let mut request = self
            .client
            .describe_instance_type_offerings()
            .location_type(sdk::LocationType::AvailabilityZone);
        if !instance_types.is_empty() {
            request = request.filters(filter("instance-type", instance_types));
        }
        if !zones.is_empty() {
            request = request.filters(filter("location", zones));
        }
        let mut pages = request.into_paginator().send();
        let mut offerings = Vec::new();
        while let Some(page) = pages.next().await {
            let page = page.map_err(|error| api_error(OP, error))?;
            for offering in page.instance_type_offerings() {
                let (Some(instance_type), Some(zone)) =
                    (offering.instance_type(), offering.location())
                else {
                    return Err(invalid_response(
                        OP,
                        "offering without instance type or location",
                    ));
                };
                offerings.push(InstanceTypeOffering {
                    instance_type: instance_type.as_str().to_owned(),
                    zone: zone.to_owned(),
                });
            }
        }
        offerings.sort();
        offerings.dedup();
        Ok(offerings)
    }

    async fn spot_placement_scores_impl(
        &self,
        query: &PlacementScoreQuery,
    ) -> Ec2Result<Vec<PlacementScore>> {
        const OP: Operation = Operation::GetSpotPlacementScores;
        if query.instance_types.is_empty() {
            return Err(Ec2Error::InvalidArgument {
                field: "instance_types",
                reason: "at least one instance type is needed".into(),
            });
        }
        let target = positive_i32("target_capacity", query.target_capacity)?;
        let mut pages = self
            .client
            .get_spot_placement_scores()
            .set_instance_types(Some(query.instance_types.clone()))
            .target_capacity(target)
            .target_capacity_unit_type(sdk::TargetCapacityUnitType::Units)
            .single_availability_zone(query.single_availability_zone)
            .set_region_names(non_empty(query.regions.clone()))
            .into_paginator()
            .send();
        let mut scores = Vec::new();
        while let Some(page) = pages.next().await {
            let page = page.map_err(|error| api_error(OP, error))?;
            for score in page.spot_placement_scores() {
                let (Some(region), Some(value)) = (score.region(), score.score()) else {
                    return Err(invalid_response(OP, "score without region or value"));
                };
                let value = u8::try_from(value)
                    .ok()
                    .filter(|v| (1..=10).contains(v))
                    .ok_or_else(|| invalid_response(OP, format!("score {value} outside 1..=10")))?;
                scores.push(PlacementScore {
                    region: region.to_owned(),
                    zone_id: score.availability_zone_id().map(str::to_owned),
                    score: value,
                });
            }
        }
        Ok(scores)
    }

    async fn run_instances_impl(&self, request: &LaunchRequest) -> Ec2Result<Vec<Ec2Instance>> {
        const OP: Operation = Operation::RunInstances;
        let builder = build_run_instances(self.client.run_instances(), request)?;
        let output = builder.send().await.map_err(|error| api_error(OP, error))?;
        output
            .instances()
            .iter()
            .map(|instance| instance_from_sdk(OP, instance))
            .collect()
    }

    async fn create_instant_fleet_impl(&self, request: &FleetRequest) -> Ec2Result<FleetOutcome> {
        const OP: Operation = Operation::CreateFleet;
        let builder = build_create_fleet(self.client.create_fleet(), request)?;
        let output = builder.send().await.map_err(|error| api_error(OP, error))?;
        let fleet_id = output
            .fleet_id()
            .ok_or_else(|| invalid_response(OP, "no fleet id"))?
            .to_owned();
        let mut instances = Vec::new();
        for launched in output.instances() {
            let zone = launched.availability_zone().map(str::to_owned).or_else(|| {
                launched
                    .launch_template_and_overrides()
                    .and_then(|lt| lt.overrides())
                    .and_then(|o| o.availability_zone())
                    .map(str::to_owned)
            });
            for instance_id in launched.instance_ids() {
                instances.push(FleetInstance {
                    instance_id: instance_id.clone(),
                    instance_type: launched.instance_type().map(|t| t.as_str().to_owned()),
                    zone: zone.clone(),
                    capacity_type: match launched.lifecycle() {
                        Some(sdk::InstanceLifecycle::Spot) => CapacityType::Spot,
                        _ => CapacityType::OnDemand,
                    },
                });
            }
        }
        let errors = output
            .errors()
            .iter()
            .map(|error| {
                let overrides = error
                    .launch_template_and_overrides()
                    .and_then(|lt| lt.overrides());
                FleetLaunchError {
                    code: error.error_code().unwrap_or("Unknown").to_owned(),
                    message: error.error_message().unwrap_or_default().to_owned(),
                    instance_type: overrides
                        .and_then(|o| o.instance_type())
                        .map(|t| t.as_str().to_owned()),
                    zone: overrides
                        .and_then(|o| o.availability_zone())
                        .map(str::to_owned),
                }
            })
            .collect();
        Ok(FleetOutcome {
            fleet_id,
            instances,
            errors,
        })
    }

    async fn job_instances_impl(
        &self,
        job: &str,
        include_terminated: bool,
    ) -> Ec2Result<Vec<Ec2Instance>> {
        const OP: Operation = Operation::DescribeInstances;
        if job.is_empty() {
            return Err(Ec2Error::InvalidArgument {
                field: "job",
                reason: "must not be empty".into(),
            });
        }
        let mut request = self
            .client
            .describe_instances()
            .filters(filter(&format!("tag:{TAG_JOB}"), &[job]));
        if !include_terminated {
            request = request.filters(filter("instance-state-name", LIVE_STATES));
        }
        let mut pages = request.into_paginator().send();
        let mut instances = Vec::new();
        while let Some(page) = pages.next().await {
            let page = page.map_err(|error| api_error(OP, error))?;
            for reservation in page.reservations() {
                for instance in reservation.instances() {
                    instances.push(instance_from_sdk(OP, instance)?);
                }
            }
        }
        instances.sort_by(|a, b| a.instance_id.cmp(&b.instance_id));
        Ok(instances)
    }

    async fn terminate_instances_impl(
        &self,
        instance_ids: &[String],
    ) -> Ec2Result<Vec<TerminatedInstance>> {
        let mut ids = instance_ids.to_vec();
        ids.sort();
        ids.dedup();
        let mut results = Vec::with_capacity(ids.len());
        for chunk in ids.chunks(INSTANCE_IDS_PER_CALL) {
            match self.terminate_batch(chunk).await {
                Ok(batch) => results.extend(batch),
                // EC2 rejects the whole call if one ID is unknown (long gone, or never existed):
                // retry one by one so the known ones are still terminated.
                Err(error) if error.category() == ErrorCategory::NotFound => {
                    for id in chunk {
                        match self.terminate_batch(std::slice::from_ref(id)).await {
                            Ok(batch) => results.extend(batch),
                            Err(error) if error.category() == ErrorCategory::NotFound => {
                                results.push(TerminatedInstance {
                                    instance_id: id.clone(),
                                    previous_state: None,
                                    current_state: None,
                                });
                            }
                            Err(error) => return Err(error),
                        }
                    }
                }
                Err(error) => return Err(error),
            }
        }
        Ok(results)
    }

    async fn terminate_batch(&self, ids: &[String]) -> Ec2Result<Vec<TerminatedInstance>> {
        const OP: Operation = Operation::TerminateInstances;
        let output = self
            .client
            .terminate_instances()
            .set_instance_ids(Some(ids.to_vec()))
            .send()
            .await
            .map_err(|error| api_error(OP, error))?;
        output
            .terminating_instances()
            .iter()
            .map(|change| {
                let instance_id = change
                    .instance_id()
                    .ok_or_else(|| invalid_response(OP, "state change without instance id"))?;
                let state = |s: Option<&sdk::InstanceState>| {
                    s.and_then(|s| s.name())
                        .map(|name| InstanceState::parse(name.as_str()))
                };
                Ok(TerminatedInstance {
                    instance_id: instance_id.to_owned(),
                    previous_state: state(change.previous_state()),
                    current_state: state(change.current_state()),
                })
            })
            .collect()
    }

    async fn spot_requests_impl(
        &self,
        instance_ids: &[String],
    ) -> Ec2Result<Vec<SpotRequestStatus>> {
        const OP: Operation = Operation::DescribeSpotInstanceRequests;
        let mut statuses = Vec::new();
        for chunk in instance_ids.chunks(INSTANCE_IDS_PER_CALL) {
            let mut pages = self
                .client
                .describe_spot_instance_requests()
                .filters(filter("instance-id", chunk))
                .into_paginator()
                .send();
            while let Some(page) = pages.next().await {
                let page = page.map_err(|error| api_error(OP, error))?;
                for request in page.spot_instance_requests() {
                    let request_id = request
                        .spot_instance_request_id()
                        .ok_or_else(|| invalid_response(OP, "spot request without id"))?;
                    let status = request.status();
                    statuses.push(SpotRequestStatus {
                        request_id: request_id.to_owned(),
                        instance_id: request.instance_id().map(str::to_owned),
                        state: request.state().map(|s| s.as_str().to_owned()),
                        status_code: status.and_then(|s| s.code()).map(str::to_owned),
                        status_message: status.and_then(|s| s.message()).map(str::to_owned),
                        updated: status.and_then(|s| s.update_time()).and_then(to_chrono),
                    });
                }
            }
        }
        Ok(statuses)
    }
}

impl Ec2Api for SdkEc2 {
    fn spot_price_history<'a>(
        &'a self,
        query: &'a SpotPriceQuery,
    ) -> BoxFuture<'a, Ec2Result<Vec<SpotPricePoint>>> {
        Box::pin(self.spot_price_history_impl(query))
    }

    fn instance_types<'a>(
        &'a self,
        instance_types: &'a [String],
    ) -> BoxFuture<'a, Ec2Result<Vec<InstanceTypeInfo>>> {
        Box::pin(self.instance_types_impl(instance_types))
    }

    fn instance_type_offerings<'a>(
        &'a self,
        instance_types: &'a [String],
        zones: &'a [String],
    ) -> BoxFuture<'a, Ec2Result<Vec<InstanceTypeOffering>>> {
        Box::pin(self.instance_type_offerings_impl(instance_types, zones))
    }

    fn spot_placement_scores<'a>(
        &'a self,
        query: &'a PlacementScoreQuery,
    ) -> BoxFuture<'a, Ec2Result<Vec<PlacementScore>>> {
        Box::pin(self.spot_placement_scores_impl(query))
    }

    fn run_instances<'a>(
        &'a self,
        request: &'a LaunchRequest,
    ) -> BoxFuture<'a, Ec2Result<Vec<Ec2Instance>>> {
        Box::pin(self.run_instances_impl(request))
    }

    fn create_instant_fleet<'a>(
        &'a self,
        request: &'a FleetRequest,
    ) -> BoxFuture<'a, Ec2Result<FleetOutcome>> {
        Box::pin(self.create_instant_fleet_impl(request))
    }

    fn job_instances<'a>(
        &'a self,
        job: &'a str,
        include_terminated: bool,
    ) -> BoxFuture<'a, Ec2Result<Vec<Ec2Instance>>> {
        Box::pin(self.job_instances_impl(job, include_terminated))
    }

    fn terminate_instances<'a>(
        &'a self,
        instance_ids: &'a [String],
    ) -> BoxFuture<'a, Ec2Result<Vec<TerminatedInstance>>> {
        Box::pin(self.terminate_instances_impl(instance_ids))
    }

    fn spot_requests<'a>(
        &'a self,
        instance_ids: &'a [String],
    ) -> BoxFuture<'a, Ec2Result<Vec<SpotRequestStatus>>> {
        Box::pin(self.spot_requests_impl(instance_ids))
    }
}

type RunInstancesBuilder =
    aws_sdk_ec2::operation::run_instances::builders::RunInstancesFluentBuilder;
type CreateFleetBuilder = aws_sdk_ec2::operation::create_fleet::builders::CreateFleetFluentBuilder;

/// Fills a RunInstances request from `request` after validating it.
fn build_run_instances(
    builder: RunInstancesBuilder,
    request: &LaunchRequest,
) -> Ec2Result<RunInstancesBuilder> {
    request.validate()?;
    let count = positive_i32("count", request.count)?;
    let mut builder = builder
        .image_id(&request.image_id)
        .instance_type(sdk::InstanceType::from(request.instance_type.as_str()))
        .min_count(1)
        .max_count(count)
        .set_subnet_id(request.subnet_id.clone())
        .set_security_group_ids(non_empty(request.security_group_ids.clone()))
        .set_user_data(request.user_data_base64.clone())
        .set_client_token(request.client_token.clone())
        .tag_specifications(tag_specification(
            sdk::ResourceType::Instance,
            &request.tags,
            &request.extra_tags,
        ));
    if let Some(zone) = &request.zone {
        builder = builder.placement(sdk::Placement::builder().availability_zone(zone).build());
    }
    if let Some(profile) = &request.iam_instance_profile {
        builder = builder.iam_instance_profile(
            sdk::IamInstanceProfileSpecification::builder()
                .name(profile)
                .build(),
        );
    }
    if let Capacity::Spot { max_price_usd_hr } = request.capacity {
        let max_price = max_price_usd_hr
            .map(|price| format_price("max_price_usd_hr", price))
            .transpose()?;
        builder = builder.instance_market_options(
            sdk::InstanceMarketOptionsRequest::builder()
                .market_type(sdk::MarketType::Spot)
                .spot_options(
                    sdk::SpotMarketOptions::builder()
                        .spot_instance_type(sdk::SpotInstanceType::OneTime)
                        .instance_interruption_behavior(
                            sdk::InstanceInterruptionBehavior::Terminate,
                        )
                        .set_max_price(max_price)
                        .build(),
                )
                .build(),
        );
    }
    Ok(builder)
}

/// Fills a CreateFleet (`instant`) request from `request` after validating it.
fn build_create_fleet(
    builder: CreateFleetBuilder,
    request: &FleetRequest,
) -> Ec2Result<CreateFleetBuilder> {
    request.validate()?;
    let total = request.spot_count.saturating_add(request.on_demand_count);
    let total = positive_i32("spot_count + on_demand_count", total)?;
    let template = match &request.launch_template {
        LaunchTemplateRef::Id(id) => {
            sdk::FleetLaunchTemplateSpecificationRequest::builder().launch_template_id(id)
        }
        LaunchTemplateRef::Name(name) => {
            sdk::FleetLaunchTemplateSpecificationRequest::builder().launch_template_name(name)
        }
    }
    .version(
        request
            .launch_template_version
            .clone()
            .unwrap_or_else(|| "$Default".to_owned()),
    )
    .build();
    let mut config =
        sdk::FleetLaunchTemplateConfigRequest::builder().launch_template_specification(template);
    for pool in &request.pools {
        let max_price = pool
            .max_price_usd_hr
            .map(|price| format_price("pools.max_price_usd_hr", price))
            .transpose()?;
        config = config.overrides(
            sdk::FleetLaunchTemplateOverridesRequest::builder()
                .instance_type(sdk::InstanceType::from(pool.instance_type.as_str()))
                .set_availability_zone(pool.zone.clone())
                .set_subnet_id(pool.subnet_id.clone())
                .set_max_price(max_price)
                .build(),
        );
    }
    let default_type = if request.spot_count > 0 {
        sdk::DefaultTargetCapacityType::Spot
    } else {
        sdk::DefaultTargetCapacityType::OnDemand
    };
    Ok(builder
        .r#type(sdk::FleetType::Instant)
        .launch_template_configs(config.build())
        .target_capacity_specification(
            sdk::TargetCapacitySpecificationRequest::builder()
                .total_target_capacity(total)
                .spot_target_capacity(request.spot_count as i32)
                .on_demand_target_capacity(request.on_demand_count as i32)
                .default_target_capacity_type(default_type)
                .build(),
        )
        .spot_options(
            sdk::SpotOptionsRequest::builder()
                .allocation_strategy(sdk::SpotAllocationStrategy::PriceCapacityOptimized)
                .instance_interruption_behavior(sdk::SpotInstanceInterruptionBehavior::Terminate)
                .build(),
        )
        .tag_specifications(tag_specification(
            sdk::ResourceType::Instance,
            &request.tags,
            &BTreeMap::new(),
        ))
        .set_client_token(request.client_token.clone()))
}

fn tag_specification(
    resource: sdk::ResourceType,
    tags: &JobTags,
    extra: &BTreeMap<String, String>,
) -> sdk::TagSpecification {
    let mut spec = sdk::TagSpecification::builder().resource_type(resource);
    for (key, value) in extra {
        spec = spec.tags(sdk::Tag::builder().key(key).value(value).build());
    }
    // ebbflow's own tags go last and win over extra tags with the same key.
    for (key, value) in tags.pairs() {
        spec = spec.tags(sdk::Tag::builder().key(key).value(value).build());
    }
    spec.build()
}

fn filter<S: AsRef<str>>(name: &str, values: &[S]) -> sdk::Filter {
    sdk::Filter::builder()
        .name(name)
        .set_values(Some(values.iter().map(|v| v.as_ref().to_owned()).collect()))
        .build()
}

fn non_empty<T>(values: Vec<T>) -> Option<Vec<T>> {
    (!values.is_empty()).then_some(values)
}

fn positive_i32(field: &'static str, value: u32) -> Ec2Result<i32> {
    i32::try_from(value)
        .ok()
        .filter(|v| *v > 0)
        .ok_or_else(|| Ec2Error::InvalidArgument {
            field,
            reason: format!("must be within 1..={}, got {value}", i32::MAX),
        })
}

fn to_aws_time(time: DateTime<Utc>) -> AwsDateTime {
    AwsDateTime::from_secs_and_nanos(time.timestamp(), time.timestamp_subsec_nanos())
}

fn to_chrono(time: &AwsDateTime) -> Option<DateTime<Utc>> {
    DateTime::from_timestamp(time.secs(), time.subsec_nanos())
}

fn invalid_response(operation: Operation, detail: impl Into<String>) -> Ec2Error {
    Ec2Error::InvalidResponse {
        operation,
        detail: detail.into(),
    }
}

fn spot_price_from_sdk(record: &sdk::SpotPrice) -> Ec2Result<SpotPricePoint> {
    const OP: Operation = Operation::DescribeSpotPriceHistory;
    let (Some(instance_type), Some(zone), Some(price), Some(timestamp)) = (
        record.instance_type(),
        record.availability_zone(),
        record.spot_price(),
        record.timestamp(),
    ) else {
        return Err(invalid_response(
            OP,
            format!("incomplete spot price record {record:?}"),
        ));
    };
    // A missing or zero price must never pass as a free instance.
    let price_usd_hr = price
        .trim()
        .parse::<f64>()
        .ok()
        .filter(|p| p.is_finite() && *p > 0.0)
        .ok_or_else(|| {
            invalid_response(
                OP,
                format!("bad spot price {price:?} for {instance_type} in {zone}"),
            )
        })?;
    let timestamp = to_chrono(timestamp)
        .ok_or_else(|| invalid_response(OP, format!("timestamp out of range: {timestamp}")))?;
    Ok(SpotPricePoint {
        instance_type: instance_type.as_str().to_owned(),
        zone: zone.to_owned(),
        product_description: record
            .product_description()
            .map(|d| d.as_str().to_owned())
            .unwrap_or_default(),
        price_usd_hr,
        timestamp,
    })
}

fn instance_type_from_sdk(info: &sdk::InstanceTypeInfo) -> Ec2Result<InstanceTypeInfo> {
    const OP: Operation = Operation::DescribeInstanceTypes;
    let instance_type = info
        .instance_type()
        .ok_or_else(|| invalid_response(OP, "instance type info without a name"))?
        .as_str()
        .to_owned();
    let vcpus = info
        .v_cpu_info()
        .and_then(|v| v.default_v_cpus())
        .and_then(|v| u32::try_from(v).ok())
        .ok_or_else(|| invalid_response(OP, format!("{instance_type}: no vCPU count")))?;
    let memory_mib = info
        .memory_info()
        .and_then(|m| m.size_in_mib())
        .and_then(|m| u64::try_from(m).ok())
        .ok_or_else(|| invalid_response(OP, format!("{instance_type}: no memory size")))?;
    let gpus = info.gpu_info().map_or(0, |g| {
        g.gpus()
            .iter()
            .filter_map(|d| d.count())
            .map(|c| u32::try_from(c).unwrap_or(0))
            .sum()
    });
    let spot_supported = info
        .supported_usage_classes()
        .contains(&sdk::UsageClassType::Spot);
    Ok(InstanceTypeInfo {
        instance_type,
        vcpus,
        memory_mib,
        gpus,
        spot_supported,
    })
}

fn instance_from_sdk(operation: Operation, instance: &sdk::Instance) -> Ec2Result<Ec2Instance> {
    let instance_id = instance
        .instance_id()
        .ok_or_else(|| invalid_response(operation, "instance without id"))?
        .to_owned();
    let tags = instance
        .tags()
        .iter()
        .filter_map(|tag| Some((tag.key()?.to_owned(), tag.value().unwrap_or("").to_owned())))
        .collect();
    Ok(Ec2Instance {
        instance_type: instance
            .instance_type()
            .map(|t| t.as_str().to_owned())
            .unwrap_or_default(),
        zone: instance
            .placement()
            .and_then(|p| p.availability_zone())
            .map(str::to_owned),
        state: instance.state().and_then(|s| s.name()).map_or_else(
            || InstanceState::Other("unknown".into()),
            |name| InstanceState::parse(name.as_str()),
        ),
        capacity_type: match instance.instance_lifecycle() {
            Some(sdk::InstanceLifecycleType::Spot) => CapacityType::Spot,
            _ => CapacityType::OnDemand,
        },
        launch_time: instance.launch_time().and_then(to_chrono),
        private_ip: instance.private_ip_address().map(str::to_owned),
        spot_request_id: instance.spot_instance_request_id().map(str::to_owned),
        tags,
        instance_id,
    })
}

/// Maps an SDK failure onto [`Ec2Error`]. Only EC2's code and message and the transport's
/// description are kept: never the request, its headers or its signature.
fn api_error<E>(operation: Operation, error: SdkError<E, HttpResponse>) -> Ec2Error
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    let (category, code, status, message) = match &error {
        SdkError::ServiceError(context) => {
            let status = context.raw().status().as_u16();
            let code = context.err().code().unwrap_or("Unknown").to_owned();
            let message = context.err().message().unwrap_or_default().to_owned();
            (
                classify_code(&code, Some(status)),
                code,
                Some(status),
                message,
            )
        }
        SdkError::TimeoutError(_) => (
            ErrorCategory::Timeout,
            "Timeout".to_owned(),
            None,
            "the call exceeded its time limit".to_owned(),
        ),
        SdkError::DispatchFailure(failure) => {
            let category = if failure.is_timeout() {
                ErrorCategory::Timeout
            } else if failure.is_user() {
                ErrorCategory::InvalidArgument
            } else {
                ErrorCategory::Connection
            };
            (
                category,
                "DispatchFailure".to_owned(),
                None,
                DisplayErrorContext(&error).to_string(),
            )
        }
        SdkError::ResponseError(context) => {
            let status = context.raw().status().as_u16();
            let category = if status >= 500 {
                ErrorCategory::Server
            } else {
                ErrorCategory::InvalidResponse
            };
            (
                category,
                "ResponseError".to_owned(),
                Some(status),
                DisplayErrorContext(&error).to_string(),
            )
        }
        SdkError::ConstructionFailure(_) => (
            ErrorCategory::InvalidArgument,
            "ConstructionFailure".to_owned(),
            None,
            DisplayErrorContext(&error).to_string(),
        ),
        _ => (
            ErrorCategory::Other,
            "Unknown".to_owned(),
            None,
            DisplayErrorContext(&error).to_string(),
        ),
    };
    Ec2Error::Api {
        operation,
        category,
        code,
        status,
        message,
    }
}

#[cfg(test)]
mod tests;
