//! An in-memory [`Ec2Api`] for callers' tests (the bidder, the `ec2` provisioner): scripted
//! prices and instance types, launched instances kept in memory, injected failures and spot
//! interruptions, and a log of the operations called. It validates requests exactly as
//! [`crate::SdkEc2`] does and follows EC2's semantics where they matter to callers: price
//! windows include the record in force at their start, client tokens make launches idempotent,
//! terminating twice or terminating an unknown instance is not an error.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Mutex, MutexGuard};

use chrono::{DateTime, Utc};

use crate::api::{BoxFuture, Ec2Api, Ec2Result};
use crate::error::{Ec2Error, ErrorCategory, Operation};
use crate::types::{
    Capacity, CapacityType, Ec2Instance, FleetInstance, FleetOutcome, FleetRequest, InstanceState,
    InstanceTypeInfo, InstanceTypeOffering, LaunchRequest, PlacementScore, PlacementScoreQuery,
    SpotPricePoint, SpotPriceQuery, SpotRequestStatus, TerminatedInstance,
};

/// An in-memory EC2 for tests; see the module docs.
#[derive(Debug, Default)]
pub struct FakeEc2 {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    prices: Vec<SpotPricePoint>,
    instance_types: Vec<InstanceTypeInfo>,
    offerings: Vec<InstanceTypeOffering>,
    placement_scores: Option<Vec<PlacementScore>>,
    instances: BTreeMap<String, Ec2Instance>,
    spot_statuses: BTreeMap<String, SpotRequestStatus>,
    tokens: BTreeMap<String, Vec<String>>,
    failures: BTreeMap<&'static str, VecDeque<Ec2Error>>,
    calls: Vec<Operation>,
    next_id: u64,
    now: Option<DateTime<Utc>>,
}

impl FakeEc2 {
    /// An empty fake: no prices, no types, no instances; placement scores unsupported.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the spot price history (any order).
    pub fn with_prices(self, prices: Vec<SpotPricePoint>) -> Self {
        self.state().prices = prices;
        self
    }

    /// Sets the instance types DescribeInstanceTypes knows.
    pub fn with_instance_types(self, instance_types: Vec<InstanceTypeInfo>) -> Self {
        self.state().instance_types = instance_types;
        self
    }

    /// Sets the instance types DescribeInstanceTypes knows to `names`, each with 2 vCPUs, 8 GiB
    /// and spot support (a fixture for provisioning tests).
    pub fn with_small_types(self, names: &[&str]) -> Self {
        let info = |name: &&str| InstanceTypeInfo {
            instance_type: (*name).to_owned(),
            vcpus: 2,
            memory_mib: 8192,
            gpus: 0,
            spot_supported: true,
        };
        self.with_instance_types(names.iter().map(info).collect())
    }

    /// Sets the (instance type, zone) offerings.
    pub fn with_offerings(self, offerings: Vec<InstanceTypeOffering>) -> Self {
        self.state().offerings = offerings;
        self
    }

    /// Makes GetSpotPlacementScores answer these scores instead of `Unsupported`.
    pub fn with_placement_scores(self, scores: Vec<PlacementScore>) -> Self {
        self.state().placement_scores = Some(scores);
        self
    }

    /// Sets the clock used for launch times and interruption updates.
    pub fn set_now(&self, now: DateTime<Utc>) {
        self.state().now = Some(now);
    }

    /// Makes the next call of `operation` fail with `error` (calls queue up in order).
    pub fn fail_next(&self, operation: Operation, error: Ec2Error) {
        self.state()
            .failures
            .entry(operation.as_str())
            .or_default()
            .push_back(error);
    }

    /// Builds an [`Ec2Error::Api`] as EC2 would answer `code` (for [`FakeEc2::fail_next`]).
    pub fn api_error(operation: Operation, code: &str, status: u16) -> Ec2Error {
        Ec2Error::Api {
            operation,
            category: crate::error::classify_code(code, Some(status)),
            code: code.to_owned(),
            status: Some(status),
            message: format!("injected {code}"),
        }
    }

    /// Interrupts a spot instance as EC2 does: its request is marked and the instance ends
    /// terminated. Returns false when the instance is unknown or not spot.
    pub fn interrupt(&self, instance_id: &str, status_code: &str) -> bool {
        let mut state = self.state();
        let now = state.now;
        let Some(instance) = state.instances.get_mut(instance_id) else {
            return false;
        };
        if instance.capacity_type != CapacityType::Spot {
            return false;
        }
        instance.state = InstanceState::Terminated;
        let request_id = instance.spot_request_id.clone();
        if let Some(status) = request_id.and_then(|id| state.spot_statuses.get_mut(&id)) {
            status.state = Some("closed".into());
            status.status_code = Some(status_code.to_owned());
            status.status_message = Some(format!("interrupted: {status_code}"));
            status.updated = now;
        }
        true
    }

    /// Every instance ever launched, terminated ones included, by ID.
    pub fn instances(&self) -> Vec<Ec2Instance> {
        self.state().instances.values().cloned().collect()
    }

    /// The operations called so far, in order.
    pub fn calls(&self) -> Vec<Operation> {
        self.state().calls.clone()
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A panicking test thread must not hide the state from the others.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Records the call and pops an injected failure, if any.
    fn enter(&self, operation: Operation) -> Result<MutexGuard<'_, State>, Ec2Error> {
        let mut state = self.state();
        state.calls.push(operation);
        if let Some(error) = state
            .failures
            .get_mut(operation.as_str())
            .and_then(VecDeque::pop_front)
        {
            return Err(error);
        }
        Ok(state)
    }
}

impl State {
    fn launch(
        &mut self,
        instance_type: &str,
        zone: Option<&str>,
        capacity_type: CapacityType,
        tags: BTreeMap<String, String>,
    ) -> Ec2Instance {
        self.next_id += 1;
        let instance_id = format!("i-{:017x}", self.next_id);
        let spot_request_id = (capacity_type == CapacityType::Spot).then(|| {
            let request_id = format!("sir-{:08x}", self.next_id);
            self.spot_statuses.insert(
                request_id.clone(),
                SpotRequestStatus {
                    request_id: request_id.clone(),
                    instance_id: Some(instance_id.clone()),
                    state: Some("active".into()),
                    status_code: Some("fulfilled".into()),
                    status_message: None,
                    updated: self.now,
                },
            );
            request_id
        });
        let instance = Ec2Instance {
            instance_id: instance_id.clone(),
            instance_type: instance_type.to_owned(),
            zone: zone.map(str::to_owned),
            state: InstanceState::Running,
            capacity_type,
            launch_time: self.now,
            private_ip: Some(format!(
                "10.0.{}.{}",
                (self.next_id >> 8) & 0xff,
                self.next_id & 0xff
            )),
            spot_request_id,
            tags,
        };
        self.instances.insert(instance_id, instance.clone());
        instance
    }

    fn check_instance_type(&self, operation: Operation, instance_type: &str) -> Ec2Result<()> {
        let known = self.instance_types.is_empty()
            || self
                .instance_types
                .iter()
                .any(|t| t.instance_type == instance_type);
        if known {
            Ok(())
        } else {
            Err(Ec2Error::Api {
                operation,
                category: ErrorCategory::InvalidRequest,
                code: "InvalidParameterValue".into(),
                status: Some(400),
                message: format!("invalid instance type {instance_type}"),
            })
        }
    }
}

impl Ec2Api for FakeEc2 {
    fn spot_price_history<'a>(
        &'a self,
        query: &'a SpotPriceQuery,
    ) -> BoxFuture<'a, Ec2Result<Vec<SpotPricePoint>>> {
        Box::pin(async move {
            let state = self.enter(Operation::DescribeSpotPriceHistory)?;
            let mut pools: BTreeMap<(&str, &str), Vec<&SpotPricePoint>> = BTreeMap::new();
            for point in &state.prices {
                let wanted = (query.instance_types.is_empty()
                    || query.instance_types.contains(&point.instance_type))
                    && (query.zones.is_empty() || query.zones.contains(&point.zone))
                    && (query.product_descriptions.is_empty()
                        || query
                            .product_descriptions
                            .contains(&point.product_description));
                if wanted {
                    pools
                        .entry((&point.instance_type, &point.zone))
                        .or_default()
                        .push(point);
                }
            }
            let mut selected = Vec::new();
            for mut points in pools.into_values() {
                points.sort_by_key(|p| p.timestamp);
                let first = query.start.map_or(0, |start| {
                    points
                        .partition_point(|p| p.timestamp <= start)
                        .saturating_sub(1)
                });
                let last = query.end.map_or(points.len(), |end| {
                    points.partition_point(|p| p.timestamp <= end)
                });
                selected.extend(points[first..last.max(first)].iter().map(|p| (*p).clone()));
            }
            selected.sort_by(|a, b| {
                (a.timestamp, &a.zone, &a.instance_type).cmp(&(
                    b.timestamp,
                    &b.zone,
                    &b.instance_type,
                ))
            });
            Ok(selected)
        })
    }

    fn instance_types<'a>(
        &'a self,
        instance_types: &'a [String],
    ) -> BoxFuture<'a, Ec2Result<Vec<InstanceTypeInfo>>> {
        Box::pin(async move {
            let state = self.enter(Operation::DescribeInstanceTypes)?;
            if let Some(unknown) = instance_types.iter().find(|wanted| {
                !state
                    .instance_types
                    .iter()
                    .any(|t| &t.instance_type == *wanted)
            }) {
                return Err(Ec2Error::Api {
                    operation: Operation::DescribeInstanceTypes,
                    category: ErrorCategory::InvalidRequest,
                    code: "InvalidInstanceType".into(),
                    status: Some(400),
                    message: format!(
                        "the following supplied instance types do not exist: [{unknown}]"
                    ),
                });
            }
            let mut infos: Vec<InstanceTypeInfo> = state
                .instance_types
                .iter()
                .filter(|t| instance_types.is_empty() || instance_types.contains(&t.instance_type))
                .cloned()
                .collect();
            infos.sort_by(|a, b| a.instance_type.cmp(&b.instance_type));
            Ok(infos)
        })
    }

    fn instance_type_offerings<'a>(
        &'a self,
        instance_types: &'a [String],
        zones: &'a [String],
    ) -> BoxFuture<'a, Ec2Result<Vec<InstanceTypeOffering>>> {
        Box::pin(async move {
            let state = self.enter(Operation::DescribeInstanceTypeOfferings)?;
            let mut offerings: Vec<InstanceTypeOffering> = state
                .offerings
                .iter()
                .filter(|o| instance_types.is_empty() || instance_types.contains(&o.instance_type))
                .filter(|o| zones.is_empty() || zones.contains(&o.zone))
                .cloned()
                .collect();
            offerings.sort();
            offerings.dedup();
            Ok(offerings)
        })
    }

    fn spot_placement_scores<'a>(
        &'a self,
        _query: &'a PlacementScoreQuery,
    ) -> BoxFuture<'a, Ec2Result<Vec<PlacementScore>>> {
        Box::pin(async move {
            let state = self.enter(Operation::GetSpotPlacementScores)?;
            state.placement_scores.clone().ok_or_else(|| {
                Self::api_error(
                    Operation::GetSpotPlacementScores,
                    "UnsupportedOperation",
                    400,
                )
            })
        })
    }

    fn run_instances<'a>(
        &'a self,
        request: &'a LaunchRequest,
    ) -> BoxFuture<'a, Ec2Result<Vec<Ec2Instance>>> {
        Box::pin(async move {
            request.validate()?;
            let mut state = self.enter(Operation::RunInstances)?;
            state.check_instance_type(Operation::RunInstances, &request.instance_type)?;
            if let Some(ids) = request
                .client_token
                .as_ref()
                .and_then(|token| state.tokens.get(token))
            {
                return Ok(ids
                    .iter()
                    .filter_map(|id| state.instances.get(id).cloned())
                    .collect());
            }
            let capacity_type = match request.capacity {
                Capacity::OnDemand => CapacityType::OnDemand,
                Capacity::Spot { .. } => CapacityType::Spot,
            };
            let mut tags = request.extra_tags.clone();
            for (key, value) in request.tags.pairs() {
                tags.insert(key.to_owned(), value.to_owned());
            }
            let launched: Vec<Ec2Instance> = (0..request.count)
                .map(|_| {
                    state.launch(
                        &request.instance_type,
                        request.zone.as_deref(),
                        capacity_type,
                        tags.clone(),
                    )
                })
                .collect();
            if let Some(token) = &request.client_token {
                state.tokens.insert(
                    token.clone(),
                    launched.iter().map(|i| i.instance_id.clone()).collect(),
                );
            }
            Ok(launched)
        })
    }

    fn create_instant_fleet<'a>(
        &'a self,
        request: &'a FleetRequest,
    ) -> BoxFuture<'a, Ec2Result<FleetOutcome>> {
        Box::pin(async move {
            request.validate()?;
            let mut state = self.enter(Operation::CreateFleet)?;
            let pool = &request.pools[0];
            state.check_instance_type(Operation::CreateFleet, &pool.instance_type)?;
            let tags: BTreeMap<String, String> = request
                .tags
                .pairs()
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect();
            let wanted = (0..request.spot_count)
                .map(|_| CapacityType::Spot)
                .chain((0..request.on_demand_count).map(|_| CapacityType::OnDemand));
            let mut instances = Vec::new();
            for capacity_type in wanted {
                let instance = state.launch(
                    &pool.instance_type,
                    pool.zone.as_deref(),
                    capacity_type,
                    tags.clone(),
                );
                instances.push(FleetInstance {
                    instance_id: instance.instance_id,
                    instance_type: Some(instance.instance_type),
                    zone: instance.zone,
                    capacity_type,
                });
            }
            state.next_id += 1;
            Ok(FleetOutcome {
                fleet_id: format!("fleet-{:08x}", state.next_id),
                instances,
                errors: Vec::new(),
            })
        })
    }

    fn job_instances<'a>(
        &'a self,
        job: &'a str,
        include_terminated: bool,
    ) -> BoxFuture<'a, Ec2Result<Vec<Ec2Instance>>> {
        Box::pin(async move {
            if job.is_empty() {
                return Err(Ec2Error::InvalidArgument {
                    field: "job",
                    reason: "must not be empty".into(),
                });
            }
            let state = self.enter(Operation::DescribeInstances)?;
            Ok(state
                .instances
                .values()
                .filter(|i| i.tags.get(crate::types::TAG_JOB).map(String::as_str) == Some(job))
                .filter(|i| include_terminated || i.state != InstanceState::Terminated)
                .cloned()
                .collect())
        })
    }

    fn terminate_instances<'a>(
        &'a self,
        instance_ids: &'a [String],
    ) -> BoxFuture<'a, Ec2Result<Vec<TerminatedInstance>>> {
        Box::pin(async move {
            let mut ids = instance_ids.to_vec();
            ids.sort();
            ids.dedup();
            if ids.is_empty() {
                return Ok(Vec::new());
            }
            let mut state = self.enter(Operation::TerminateInstances)?;
            Ok(ids
                .into_iter()
                .map(|id| match state.instances.get_mut(&id) {
                    Some(instance) => {
                        let previous =
                            std::mem::replace(&mut instance.state, InstanceState::Terminated);
                        TerminatedInstance {
                            instance_id: id,
                            previous_state: Some(previous),
                            current_state: Some(InstanceState::Terminated),
                        }
                    }
                    None => TerminatedInstance {
                        instance_id: id,
                        previous_state: None,
                        current_state: None,
                    },
                })
                .collect())
        })
    }

    fn spot_requests<'a>(
        &'a self,
        instance_ids: &'a [String],
    ) -> BoxFuture<'a, Ec2Result<Vec<SpotRequestStatus>>> {
        Box::pin(async move {
            if instance_ids.is_empty() {
                return Ok(Vec::new());
            }
            let state = self.enter(Operation::DescribeSpotInstanceRequests)?;
            Ok(state
                .spot_statuses
                .values()
                .filter(|s| {
                    s.instance_id
                        .as_ref()
                        .is_some_and(|id| instance_ids.contains(id))
                })
                .cloned()
                .collect())
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use chrono::TimeZone;

    use super::*;
    use crate::types::{JobTags, LINUX_PRODUCT, Tier};
    use crate::{FleetPool, LaunchTemplateRef, RetryAdvice};

    fn point(zone: &str, hour: u32, price: f64) -> SpotPricePoint {
        SpotPricePoint {
            instance_type: "c5.large".into(),
            zone: zone.into(),
            product_description: LINUX_PRODUCT.into(),
            price_usd_hr: price,
            timestamp: Utc.with_ymd_and_hms(2024, 1, 1, hour, 0, 0).unwrap(),
        }
    }

    fn launch(job: &str, capacity: Capacity, count: u32) -> LaunchRequest {
        LaunchRequest {
            image_id: "ami-1".into(),
            instance_type: "c5.large".into(),
            zone: Some("us-east-1a".into()),
            subnet_id: None,
            count,
            capacity,
            tags: JobTags {
                job: job.into(),
                tier: Tier::Transient,
                pool: "c5.large/us-east-1a/spot".into(),
            },
            extra_tags: BTreeMap::new(),
            security_group_ids: Vec::new(),
            iam_instance_profile: None,
            user_data_base64: None,
            client_token: None,
        }
    }

    #[tokio::test]
    async fn price_windows_include_the_price_in_force_at_the_start() {
        let ec2 = FakeEc2::new().with_prices(vec![
            point("us-east-1a", 5, 0.04),
            point("us-east-1a", 1, 0.03),
            point("us-east-1b", 3, 0.05),
            point("us-east-1a", 9, 0.06),
        ]);
        let query = SpotPriceQuery {
            zones: vec!["us-east-1a".into()],
            start: Some(Utc.with_ymd_and_hms(2024, 1, 1, 2, 0, 0).unwrap()),
            end: Some(Utc.with_ymd_and_hms(2024, 1, 1, 6, 0, 0).unwrap()),
            ..SpotPriceQuery::default()
        };
        let prices: Vec<f64> = ec2
            .spot_price_history(&query)
            .await
            .unwrap()
            .iter()
            .map(|p| p.price_usd_hr)
            .collect();
        assert_eq!(prices, vec![0.03, 0.04]);
    }

    #[tokio::test]
    async fn launches_are_tagged_idempotent_and_terminate_twice() {
        let ec2: Arc<dyn Ec2Api> = Arc::new(FakeEc2::new());
        let mut request = launch(
            "ml/a",
            Capacity::Spot {
                max_price_usd_hr: Some(0.05),
            },
            2,
        );
        request.client_token = Some("token-1".into());
        let first = ec2.run_instances(&request).await.unwrap();
        let again = ec2.run_instances(&request).await.unwrap();
        assert_eq!(first, again, "same client token, same instances");
        ec2.run_instances(&launch("ml/b", Capacity::OnDemand, 1))
            .await
            .unwrap();
        let mine = ec2.job_instances("ml/a", false).await.unwrap();
        assert_eq!(mine.len(), 2);
        assert!(mine.iter().all(|i| i.capacity_type == CapacityType::Spot));
        let ids: Vec<String> = mine.iter().map(|i| i.instance_id.clone()).collect();
        let terminated = ec2.terminate_instances(&ids).await.unwrap();
        assert!(
            terminated
                .iter()
                .all(|t| t.previous_state == Some(InstanceState::Running))
        );
        let twice = ec2.terminate_instances(&ids).await.unwrap();
        assert!(
            twice
                .iter()
                .all(|t| t.previous_state == Some(InstanceState::Terminated))
        );
        assert!(ec2.job_instances("ml/a", false).await.unwrap().is_empty());
        assert_eq!(ec2.job_instances("ml/b", false).await.unwrap().len(), 1);
    }

    #[tokio::test]
    async fn injected_failures_interruptions_and_unsupported_scores() {
        let ec2 = FakeEc2::new();
        ec2.fail_next(
            Operation::RunInstances,
            FakeEc2::api_error(Operation::RunInstances, "InsufficientInstanceCapacity", 500),
        );
        let request = launch(
            "ml/a",
            Capacity::Spot {
                max_price_usd_hr: None,
            },
            1,
        );
        let error = ec2.run_instances(&request).await.unwrap_err();
        assert_eq!(error.retry(), RetryAdvice::OtherPool);
        let launched = ec2.run_instances(&request).await.unwrap();
        let id = launched[0].instance_id.clone();
        assert!(ec2.interrupt(&id, "instance-terminated-by-price"));
        let statuses = ec2.spot_requests(std::slice::from_ref(&id)).await.unwrap();
        assert!(statuses[0].is_interrupted());
        assert!(ec2.job_instances("ml/a", false).await.unwrap().is_empty());

        let scores = ec2
            .spot_placement_scores(&PlacementScoreQuery {
                instance_types: vec!["c5.large".into()],
                target_capacity: 1,
                single_availability_zone: true,
                regions: Vec::new(),
            })
            .await
            .unwrap_err();
        assert_eq!(scores.category(), ErrorCategory::Unsupported);
        assert_eq!(
            ec2.calls(),
            vec![
                Operation::RunInstances,
                Operation::RunInstances,
                Operation::DescribeSpotInstanceRequests,
                Operation::DescribeInstances,
                Operation::GetSpotPlacementScores,
            ]
        );
    }

    #[tokio::test]
    async fn requests_are_validated_like_the_sdk_client() {
        let ec2 = FakeEc2::new().with_instance_types(vec![InstanceTypeInfo {
            instance_type: "c5.large".into(),
            vcpus: 2,
            memory_mib: 4096,
            gpus: 0,
            spot_supported: true,
        }]);
        let bad_price = launch(
            "ml/a",
            Capacity::Spot {
                max_price_usd_hr: Some(-1.0),
            },
            1,
        );
        let error = ec2.run_instances(&bad_price).await.unwrap_err();
        assert_eq!(error.category(), ErrorCategory::InvalidArgument);
        let mut unknown = launch("ml/a", Capacity::OnDemand, 1);
        unknown.instance_type = "zz9.plural".into();
        let error = ec2.run_instances(&unknown).await.unwrap_err();
        assert_eq!(error.category(), ErrorCategory::InvalidRequest);
        let fleet = FleetRequest {
            launch_template: LaunchTemplateRef::Name("t".into()),
            launch_template_version: None,
            pools: vec![FleetPool {
                instance_type: "c5.large".into(),
                zone: Some("us-east-1a".into()),
                subnet_id: None,
                max_price_usd_hr: None,
            }],
            spot_count: 2,
            on_demand_count: 1,
            tags: bad_price.tags.clone(),
            client_token: None,
        };
        let outcome = ec2.create_instant_fleet(&fleet).await.unwrap();
        assert_eq!(outcome.instances.len(), 3);
        let empty = FleetRequest {
            spot_count: 0,
            on_demand_count: 0,
            ..fleet
        };
        let error = ec2.create_instant_fleet(&empty).await.unwrap_err();
        assert_eq!(error.category(), ErrorCategory::InvalidArgument);
    }
}
