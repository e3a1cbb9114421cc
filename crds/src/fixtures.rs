//! Fluent `TrainingJob` fixtures for tests in every crate:
//! `TrainingJob::test("mf").with_transient(4).with_ssp(2)`.
//!
//! [`TrainingJob::test`] is a small job that passes [`TrainingJobSpec::validate`]; each `with_*`
//! changes one aspect and keeps it valid unless its name says otherwise.

use k8s_openapi::{
    apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time},
    jiff::Timestamp,
};

use crate::{
    AppKind, AppSpec, BiddingSpec, BiddingStrategy, BillingModel, ConsistencyModel,
    ConsistencySpec, DatasetFormat, DatasetSpec, DurationString, Ec2Provisioning, MarketKind,
    MarketSpec, Phase, ProvisioningMode, PythonApp, StopSpec, SyntheticDataset, TrainingJob,
    TrainingJobSpec, TrainingJobStatus,
};

/// Namespace of fixture jobs unless [`TrainingJob::with_namespace`] says otherwise.
pub const TEST_NAMESPACE: &str = "default";

/// The spot trace the fixtures and the quickstart replay, relative to the repository's sibling
/// `shared/data/spot` directory.
pub const TEST_TRACE: &str = "aws_p3.2xlarge_availability_price_9az_2023-02-15_to_03-09.csv";

/// A valid spec: matrix factorization on small seeded synthetic data, BSP, 10 iterations, one
/// reliable node, no transient nodes, BidBrain on the p3.2xlarge trace.
pub fn test_spec() -> TrainingJobSpec {
    TrainingJobSpec {
        app: app_spec(AppKind::MatrixFactorization),
        consistency: ConsistencySpec::default(),
        stop: StopSpec {
            iterations: Some(10),
            ..StopSpec::default()
        },
        reliable: Default::default(),
        transient: Default::default(),
        bidding: BiddingSpec {
            strategy: BiddingStrategy::BidBrain,
            market: MarketSpec {
                kind: MarketKind::Trace,
                trace: Some(TEST_TRACE.to_owned()),
                trace_start: None,
                region: None,
                on_demand_price: None,
            },
            billing_model: BillingModel::Aws,
            budget_per_hour: None,
            budget_total: None,
            deadline: None,
            decision_interval: DurationString::new(crate::DEFAULT_DECISION_INTERVAL)
                .expect("default decision interval parses"),
            max_price: None,
            overrides: None,
        },
        elasticity: Default::default(),
        provisioning: Default::default(),
        runtime: Default::default(),
        suspend: false,
    }
}

/// An app of `kind` on small data, without hyperparameters: seeded synthetic data for the
/// built-in kinds; for Python, the SDK's exact app (`examples/python/exact.py`) reading
/// `ml-100k.inter` as a raw file.
fn app_spec(kind: AppKind) -> AppSpec {
    let (dataset, python) = match kind {
        AppKind::Python => (
            DatasetSpec {
                path: Some("ml-100k.inter".into()),
                format: Some(DatasetFormat::Raw),
                ..DatasetSpec::default()
            },
            Some(PythonApp {
                entry: "exact:App".into(),
                args: None,
                path: Vec::new(),
            }),
        ),
        kind => (synthetic_dataset(kind), None),
    };
    AppSpec {
        kind,
        python,
        dataset,
        hyperparameters: None,
        server_optimizer: None,
    }
}

/// Small seeded synthetic data sized for `kind` (a built-in kind).
fn synthetic_dataset(kind: AppKind) -> DatasetSpec {
    let synthetic = match kind {
        AppKind::MatrixFactorization => SyntheticDataset {
            seed: 1,
            users: Some(200),
            items: Some(100),
            ratings: Some(4000),
            true_rank: Some(4),
            ..SyntheticDataset::default()
        },
        AppKind::LogisticRegression => SyntheticDataset {
            seed: 1,
            samples: Some(2000),
            features: Some(20),
            classes: Some(3),
            ..SyntheticDataset::default()
        },
        AppKind::SelfTest => SyntheticDataset {
            seed: 1,
            ..SyntheticDataset::default()
        },
        AppKind::Lda | AppKind::Python => SyntheticDataset {
            seed: 1,
            documents: Some(200),
            vocabulary: Some(500),
            words_per_document: Some(50),
            true_topics: Some(5),
            ..SyntheticDataset::default()
        },
    };
    DatasetSpec {
        synthetic: Some(synthetic),
        ..DatasetSpec::default()
    }
}

impl TrainingJob {
    /// A valid fixture job named `name` in [`TEST_NAMESPACE`] with spec [`test_spec`],
    /// generation 1 and a uid, and no status.
    pub fn test(name: &str) -> Self {
        let mut job = Self::new(name, test_spec());
        job.metadata = ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(TEST_NAMESPACE.to_owned()),
            uid: Some(format!(
                "00000000-0000-4000-8000-{:012x}",
                crate::fnv1a(name) & 0xffff_ffff_ffff
            )),
            generation: Some(1),
            ..ObjectMeta::default()
        };
        job
    }

    /// Moves the job to `namespace`.
    pub fn with_namespace(mut self, namespace: &str) -> Self {
        self.metadata.namespace = Some(namespace.to_owned());
        self
    }

    /// Sets `metadata.generation`.
    pub fn with_generation(mut self, generation: i64) -> Self {
        self.metadata.generation = Some(generation);
        self
    }

    /// Allows up to `max_nodes` transient nodes (minNodes 0).
    pub fn with_transient(self, max_nodes: u32) -> Self {
        self.with_transient_range(0, max_nodes)
    }

    /// Sets transient minNodes and maxNodes as given (invalid if `min_nodes > max_nodes`).
    pub fn with_transient_range(mut self, min_nodes: u32, max_nodes: u32) -> Self {
        self.spec.transient.min_nodes = min_nodes;
        self.spec.transient.max_nodes = max_nodes;
        self
    }

    /// Sets the number of reliable nodes.
    pub fn with_reliable(mut self, count: u32) -> Self {
        self.spec.reliable.count = count;
        self
    }

    /// Switches the app to `kind` with small data for it and no hyperparameters (see
    /// [`app_spec`]).
    pub fn with_app(mut self, kind: AppKind) -> Self {
        self.spec.app = app_spec(kind);
        self
    }

    /// Reads the dataset from `path` in `format` instead of generating it.
    pub fn with_dataset_path(mut self, path: &str, format: DatasetFormat) -> Self {
        self.spec.app.dataset = DatasetSpec {
            path: Some(path.to_owned()),
            format: Some(format),
            ..DatasetSpec::default()
        };
        self
    }

    /// Uses SSP with `staleness` (BSP if 0).
    pub fn with_ssp(mut self, staleness: u32) -> Self {
        self.spec.consistency = if staleness == 0 {
            ConsistencySpec::default()
        } else {
            ConsistencySpec {
                model: ConsistencyModel::Ssp,
                staleness: Some(staleness),
            }
        };
        self
    }

    /// Stops after `iterations` iterations (other stop criteria unchanged).
    pub fn with_iterations(mut self, iterations: u64) -> Self {
        self.spec.stop.iterations = Some(iterations);
        self
    }

    /// Stops once the loss reaches `target_loss` (other stop criteria unchanged).
    pub fn with_target_loss(mut self, target_loss: f64) -> Self {
        self.spec.stop.target_loss = Some(target_loss);
        self
    }

    /// Stops after `limit` of wall-clock time (e.g. "30m"; other stop criteria unchanged).
    pub fn with_wall_clock_limit(mut self, limit: &str) -> Self {
        self.spec.stop.wall_clock_limit = Some(duration(limit));
        self
    }

    /// Uses bidding `strategy`.
    pub fn with_strategy(mut self, strategy: BiddingStrategy) -> Self {
        self.spec.bidding.strategy = strategy;
        self
    }

    /// Uses `billing_model`.
    pub fn with_billing_model(mut self, billing_model: BillingModel) -> Self {
        self.spec.bidding.billing_model = billing_model;
        self
    }

    /// Replays the trace at `path`.
    pub fn with_trace(mut self, path: &str) -> Self {
        self.spec.bidding.market = MarketSpec {
            kind: MarketKind::Trace,
            trace: Some(path.to_owned()),
            trace_start: None,
            region: None,
            on_demand_price: None,
        };
        self
    }

    /// Bids on the live EC2 market in `region` with billing model aws.
    pub fn with_ec2_market(mut self, region: &str) -> Self {
        self.spec.bidding.market = MarketSpec {
            kind: MarketKind::Ec2,
            trace: None,
            trace_start: None,
            region: Some(region.to_owned()),
            on_demand_price: None,
        };
        self.spec.bidding.billing_model = BillingModel::Aws;
        self
    }

    /// Provisions EC2 instances from `launch_template` itself, on the EC2 market in `region`.
    pub fn with_ec2_provisioning(self, region: &str, launch_template: &str) -> Self {
        self.with_ec2(
            region,
            Ec2Provisioning {
                launch_template: Some(launch_template.to_owned()),
                ..Ec2Provisioning::default()
            },
        )
    }

    /// Provisions EC2 instances as `ec2` says, on the EC2 market in `region`.
    fn with_ec2(mut self, region: &str, ec2: Ec2Provisioning) -> Self {
        self.spec.provisioning.mode = ProvisioningMode::Ec2;
        self.spec.provisioning.ec2 = Some(ec2);
        self.with_ec2_market(region)
    }

    /// Provisions EC2 instances of `image_id` (no launch template) on the EC2 market in `region`,
    /// reliable ones of type m5.large, for a job with UID `uid-1`.
    pub fn with_ec2_image(mut self, region: &str, image_id: &str) -> Self {
        self.metadata.uid = Some("uid-1".into());
        self.spec.reliable.instance_types = vec!["m5.large".into()];
        self.with_ec2(
            region,
            Ec2Provisioning {
                image_id: Some(image_id.to_owned()),
                ..Ec2Provisioning::default()
            },
        )
    }

    /// Caps spending at `usd` per hour.
    pub fn with_budget_per_hour(mut self, usd: f64) -> Self {
        self.spec.bidding.budget_per_hour = Some(usd);
        self
    }

    /// Caps total spending at `usd`.
    pub fn with_budget_total(mut self, usd: f64) -> Self {
        self.spec.bidding.budget_total = Some(usd);
        self
    }

    /// Sets the bidder's deadline (e.g. "6h").
    pub fn with_deadline(mut self, deadline: &str) -> Self {
        self.spec.bidding.deadline = Some(duration(deadline));
        self
    }

    /// Sets the bidder's decision interval (e.g. "30s").
    pub fn with_decision_interval(mut self, interval: &str) -> Self {
        self.spec.bidding.decision_interval = duration(interval);
        self
    }

    /// Caps the spot bid at `usd` per instance-hour.
    pub fn with_max_price(mut self, usd: f64) -> Self {
        self.spec.bidding.max_price = Some(usd);
        self
    }

    /// Fixes the partition count.
    pub fn with_partitions(mut self, partitions: u32) -> Self {
        self.spec.elasticity.partitions = Some(partitions);
        self
    }

    /// Sets spec.suspend.
    pub fn with_suspend(mut self, suspend: bool) -> Self {
        self.spec.suspend = suspend;
        self
    }

    /// Marks the job as being deleted (deletionTimestamp set), with `finalizer` still on it.
    pub fn being_deleted(mut self, finalizer: &str) -> Self {
        self.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
        self.metadata.finalizers = Some(vec![finalizer.to_owned()]);
        self
    }

    /// Adds `finalizer` to metadata.finalizers.
    pub fn with_finalizer(mut self, finalizer: &str) -> Self {
        self.metadata
            .finalizers
            .get_or_insert_with(Vec::new)
            .push(finalizer.to_owned());
        self
    }

    /// Replaces the status.
    pub fn with_status(mut self, status: TrainingJobStatus) -> Self {
        self.status = Some(status);
        self
    }

    /// Sets status.phase (creating the status if needed).
    pub fn with_phase(mut self, phase: Phase) -> Self {
        self.status.get_or_insert_with(Default::default).phase = Some(phase);
        self
    }

    /// Applies any change to the spec, for what no `with_*` covers.
    pub fn with_spec(mut self, change: impl FnOnce(&mut TrainingJobSpec)) -> Self {
        change(&mut self.spec);
        self
    }
}

fn duration(text: &str) -> DurationString {
    DurationString::new(text).unwrap_or_else(|error| panic!("fixture duration: {error}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixtures_are_valid_and_fluent() {
        let job = TrainingJob::test("mf").with_transient(4).with_ssp(2);
        assert_eq!(job.metadata.name.as_deref(), Some("mf"));
        assert_eq!(job.metadata.namespace.as_deref(), Some(TEST_NAMESPACE));
        assert_eq!(job.spec.transient.max_nodes, 4);
        assert_eq!(job.spec.consistency.effective_staleness(), 2);
        job.spec.validate().expect("fixture is valid");

        for kind in [
            AppKind::MatrixFactorization,
            AppKind::LogisticRegression,
            AppKind::Lda,
            AppKind::Python,
            AppKind::SelfTest,
        ] {
            let job = TrainingJob::test("app").with_app(kind);
            job.spec.validate().expect("every app fixture is valid");
        }
        let ec2 = TrainingJob::test("ec2")
            .with_ec2_provisioning("us-east-1", "ebbflow-runtime")
            .with_deadline("6h")
            .with_budget_per_hour(2.5);
        ec2.spec.validate().expect("ec2 fixture is valid");
    }

    #[test]
    fn invalid_changes_are_reported() {
        let job = TrainingJob::test("bad").with_transient_range(5, 2);
        let error = job.spec.validate().expect_err("min > max");
        assert_eq!(error.0[0].field, "spec.transient.minNodes");
    }

    #[test]
    fn uids_are_stable_and_distinct() {
        let a = TrainingJob::test("a").metadata.uid;
        assert_eq!(a, TrainingJob::test("a").metadata.uid);
        assert_ne!(a, TrainingJob::test("b").metadata.uid);
    }
}
