//! Every cross-field rule is in the generated CRD, parses as CEL, and says the same as its Rust
//! twin: the CEL expressions are evaluated client-side (kube-cel, with the API server's defaulting
//! and Kubernetes CEL functions) on many specs and compared with `TrainingJobSpec::validate`.
//! The real API server runs them in the end-to-end suite.

use std::collections::BTreeSet;

use ebbflow_crds::{
    AppKind, BiddingStrategy, BillingModel, ConsistencyModel, DatasetFormat, DatasetSpec,
    DurationString, Ec2Provisioning, Hyperparameters, MarketKind, ProvisioningMode, PythonApp,
    RULES, Rule, ServerOptimizer, SyntheticDataset, TrainingJob, TrainingJobSpec,
};
use k8s_openapi::{apimachinery::pkg::apis::meta::v1::Time, jiff::Timestamp};
use kube::core::cel::{self, CompiledSchema, ErrorKind, Validator};
use serde_json::Value;

fn committed_schema() -> Value {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(ebbflow_crds::CRD_YAML_PATH);
    let text = std::fs::read_to_string(&path).expect("committed CRD yaml exists");
    let crd: Value = serde_yaml::from_str(&text).expect("committed CRD is YAML");
    crd.pointer("/spec/versions/0/schema/openAPIV3Schema")
        .expect("CRD has an openAPIV3Schema")
        .clone()
}

fn generated_schema() -> Value {
    let crd = serde_json::to_value(ebbflow_crds::crd()).expect("crd serializes");
    crd.pointer("/spec/versions/0/schema/openAPIV3Schema")
        .expect("CRD has an openAPIV3Schema")
        .clone()
}

/// The schema node at a dotted path, e.g. `spec.transient`.
fn node<'a>(schema: &'a Value, dotted: &str) -> Option<&'a Value> {
    dotted
        .split('.')
        .try_fold(schema, |node, name| node.get("properties")?.get(name))
}

/// Every `x-kubernetes-validations` entry in the schema, with the dotted path of its node.
fn all_validations(schema: &Value, path: &str, found: &mut Vec<(String, Value)>) {
    if let Some(rules) = schema
        .get("x-kubernetes-validations")
        .and_then(Value::as_array)
    {
        found.extend(rules.iter().map(|rule| (path.to_owned(), rule.clone())));
    }
    if let Some(properties) = schema.get("properties").and_then(Value::as_object) {
        for (name, child) in properties {
            let child_path = if path.is_empty() {
                name.clone()
            } else {
                format!("{path}.{name}")
            };
            all_validations(child, &child_path, found);
        }
    }
    for keyword in ["items", "additionalProperties"] {
        if let Some(child) = schema.get(keyword) {
            all_validations(child, path, found);
        }
    }
}

#[test]
fn every_rule_is_in_the_committed_crd_where_it_belongs() {
    let schema = committed_schema();
    let mut found = Vec::new();
    all_validations(&schema, "", &mut found);
    assert_eq!(
        found.len(),
        RULES.len(),
        "the committed CRD has {} CEL rules, the rule table {}; regenerate with {}",
        found.len(),
        RULES.len(),
        ebbflow_crds::REGENERATE_COMMAND
    );
    for rule in RULES {
        let at_scope = node(&schema, rule.scope)
            .and_then(|n| n.get("x-kubernetes-validations"))
            .and_then(Value::as_array)
            .unwrap_or_else(|| panic!("no CEL rules at {}", rule.scope));
        let entry = at_scope
            .iter()
            .find(|entry| entry["rule"] == rule.cel && entry["message"] == rule.message)
            .unwrap_or_else(|| panic!("rule {:?} missing at {}", rule.cel, rule.scope));
        assert_eq!(
            entry
                .get("fieldPath")
                .and_then(Value::as_str)
                .map(str::to_owned),
            rule.cel_field_path(),
            "fieldPath of {rule:?}"
        );
    }
}

#[test]
fn every_rule_parses_as_cel_and_names_its_field() {
    let schema = committed_schema();
    let mut found = Vec::new();
    all_validations(&schema, "", &mut found);
    for (path, entry) in &found {
        let expression = entry["rule"].as_str().expect("rule is a string");
        if let Err(error) = cel::cel::Program::compile(expression) {
            panic!("CEL rule at {path} does not parse: {expression}\n{error}");
        }
        // The API server requires balanced, non-empty messages without line breaks.
        let message = entry["message"].as_str().expect("every rule has a message");
        assert!(
            !message.is_empty() && !message.contains('\n'),
            "message of {expression}"
        );
        assert!(
            message.starts_with("spec."),
            "message {message:?} should name its field"
        );
        if let Some(field_path) = entry.get("fieldPath").and_then(Value::as_str) {
            let target = format!("{path}{field_path}");
            assert!(
                node(&schema, &target).is_some(),
                "fieldPath {field_path} of {expression} is not a field under {path}"
            );
        }
    }
    for rule in RULES {
        assert!(
            rule.message.contains(&rule.path()),
            "message {:?} should name {}",
            rule.message,
            rule.path()
        );
    }
}

#[test]
fn compiled_schema_has_no_cel_compilation_errors() {
    fn check(compiled: &CompiledSchema, path: &str) {
        let errors = compiled.compilation_errors();
        assert!(
            errors.is_empty(),
            "CEL compilation errors at {path}: {errors:?}"
        );
        for (name, child) in &compiled.properties {
            check(child, &format!("{path}.{name}"));
        }
        if let Some(items) = &compiled.items {
            check(items, &format!("{path}[]"));
        }
    }
    check(&cel::compile_schema(&committed_schema()), "");
}

/// Evaluates the CRD's CEL rules on `job` and returns the failures as (path, message).
fn cel_failures(
    validator: &Validator,
    compiled: &CompiledSchema,
    job: &TrainingJob,
) -> BTreeSet<(String, String)> {
    let object = serde_json::to_value(job).expect("job serializes");
    match validator.validate_compiled(compiled, &object, None) {
        Ok(()) => BTreeSet::new(),
        Err(errors) => errors
            .into_vec()
            .into_iter()
            .map(|error| {
                assert_eq!(
                    error.kind,
                    ErrorKind::ValidationFailure,
                    "CEL rule {:?} could not be evaluated on {}: {}",
                    error.rule,
                    serde_json::to_string(&job.spec).unwrap_or_default(),
                    error.message
                );
                (error.field_path, error.message)
            })
            .collect(),
    }
}

fn rust_failures(spec: &TrainingJobSpec) -> BTreeSet<(String, String)> {
    spec.broken_rules()
        .map(|rule| (rule.path(), rule.message.to_owned()))
        .collect()
}

fn assert_agree(validator: &Validator, compiled: &CompiledSchema, job: &TrainingJob) {
    let cel = cel_failures(validator, compiled, job);
    let rust = rust_failures(&job.spec);
    assert_eq!(
        cel,
        rust,
        "CEL and Rust disagree on spec {}",
        serde_json::to_string_pretty(&job.spec).unwrap_or_default()
    );
}

fn duration(text: &str) -> DurationString {
    DurationString::new(text).expect("test duration parses")
}

/// For each rule, a change to the valid fixture that breaks it (and only it).
type Breaker = (&'static str, fn(&mut TrainingJobSpec));

fn python_app(entry: &str) -> PythonApp {
    PythonApp {
        entry: entry.into(),
        args: None,
        path: Vec::new(),
    }
}

/// A valid Python app: the entry, a raw file.
fn python_kind(s: &mut TrainingJobSpec) {
    s.app.kind = AppKind::Python;
    s.app.python = Some(python_app("mf_numpy:App"));
    s.app.dataset = DatasetSpec {
        path: Some("ratings.inter".into()),
        format: Some(DatasetFormat::Raw),
        ..DatasetSpec::default()
    };
}

fn breakers() -> Vec<Breaker> {
    vec![
        ("spec.app.dataset must set exactly one", |s| {
            s.app.dataset.path = Some("ratings.csv".into());
        }),
        ("spec.app.dataset.format is required", |s| {
            s.app.dataset.format = Some(DatasetFormat::Csv);
        }),
        ("spec.app.dataset.claimName", |s| {
            s.app.dataset.claim_name = Some("data".into());
        }),
        ("spec.app.dataset.format must suit", |s| {
            s.app.dataset.synthetic = None;
            s.app.dataset.path = Some("docs.ldac".into());
            s.app.dataset.format = Some(DatasetFormat::Ldac);
        }),
        ("trueRank and noise are only valid", |s| {
            s.app.kind = AppKind::LogisticRegression;
            s.app.dataset.synthetic = Some(SyntheticDataset {
                noise: Some(0.1),
                ..Default::default()
            });
        }),
        ("samples, features and classes", |s| {
            s.app
                .dataset
                .synthetic
                .get_or_insert_with(Default::default)
                .classes = Some(3);
        }),
        ("wordsPerDocument and trueTopics", |s| {
            s.app
                .dataset
                .synthetic
                .get_or_insert_with(Default::default)
                .true_topics = Some(3);
        }),
        ("hyperparameters.rank", |s| {
            s.app.kind = AppKind::LogisticRegression;
            s.app.dataset.synthetic = Some(SyntheticDataset::default());
            s.app.hyperparameters = Some(Hyperparameters {
                rank: Some(8),
                ..Default::default()
            });
        }),
        ("hyperparameters.adaptiveStep", |s| {
            s.app.kind = AppKind::Lda;
            s.app.dataset.synthetic = Some(SyntheticDataset::default());
            s.app.hyperparameters = Some(Hyperparameters {
                adaptive_step: Some(true),
                ..Default::default()
            });
        }),
        ("runtime.threadsPerWorker is only valid", |s| {
            s.app.kind = AppKind::Lda;
            s.app.dataset.synthetic = Some(SyntheticDataset::default());
            s.runtime.threads_per_worker = Some(2);
        }),
        (
            "must be sgd (the default) with hyperparameters.adaptiveStep",
            |s| {
                s.app.hyperparameters = Some(Hyperparameters {
                    adaptive_step: Some(true),
                    ..Default::default()
                });
                s.app.server_optimizer = Some(ServerOptimizer::Adagrad);
            },
        ),
        ("spec.app.python is required", |s| {
            s.app.python = Some(python_app("mf_numpy:App"));
        }),
        ("spec.app.python.entry must be", |s| {
            python_kind(s);
            s.app.python = Some(python_app("mf_numpy"));
        }),
        (
            "spec.app.dataset.synthetic is not valid for kind Python",
            |s| {
                python_kind(s);
                s.app.dataset = DatasetSpec {
                    synthetic: Some(SyntheticDataset::default()),
                    ..DatasetSpec::default()
                };
            },
        ),
        (
            "spec.app.hyperparameters is not valid for kind Python",
            |s| {
                python_kind(s);
                s.app.hyperparameters = Some(Hyperparameters::default());
            },
        ),
        ("hyperparameters.batchSize", |s| {
            s.app.hyperparameters = Some(Hyperparameters {
                batch_size: Some(8),
                ..Default::default()
            });
        }),
        ("topics, alpha and beta", |s| {
            s.app.hyperparameters = Some(Hyperparameters {
                alpha: Some(0.1),
                ..Default::default()
            });
        }),
        ("learningRate and regularization", |s| {
            s.app.kind = AppKind::Lda;
            s.app.dataset.synthetic = Some(SyntheticDataset::default());
            s.app.hyperparameters = Some(Hyperparameters {
                learning_rate: Some(0.1),
                ..Default::default()
            });
        }),
        ("spec.app.serverOptimizer", |s| {
            s.app.kind = AppKind::Lda;
            s.app.dataset.synthetic = Some(SyntheticDataset::default());
            s.app.server_optimizer = Some(ServerOptimizer::Adagrad);
        }),
        ("required for kind SelfTest", |s| {
            s.app.kind = AppKind::SelfTest;
            s.app.hyperparameters = None;
            s.app.dataset = DatasetSpec {
                path: Some("ratings.csv".into()),
                format: Some(DatasetFormat::Csv),
                ..DatasetSpec::default()
            };
        }),
        ("not valid for kind SelfTest", |s| {
            s.app.kind = AppKind::SelfTest;
            s.app.hyperparameters = None;
            s.app.dataset.synthetic = Some(SyntheticDataset::default());
            s.app.server_optimizer = Some(ServerOptimizer::Sgd);
        }),
        ("only allowed with model SSP", |s| {
            s.consistency.staleness = Some(3)
        }),
        ("at least 1 when model is SSP", |s| {
            s.consistency.model = ConsistencyModel::Ssp
        }),
        ("spec.stop must set", |s| s.stop.iterations = None),
        ("spec.transient.minNodes", |s| {
            s.transient.min_nodes = 3;
            s.transient.max_nodes = 2;
        }),
        ("spec.elasticity.stage3Ratio", |s| {
            s.elasticity.stage3_ratio = 1.0
        }),
        ("budgetPerHour must be greater", |s| {
            s.bidding.budget_per_hour = Some(0.0)
        }),
        ("budgetTotal must be greater", |s| {
            s.bidding.budget_total = Some(0.0)
        }),
        ("maxPrice must be greater", |s| {
            s.bidding.max_price = Some(0.0)
        }),
        ("maxPrice is not valid with strategy OnDemandOnly", |s| {
            s.bidding.strategy = BiddingStrategy::OnDemandOnly;
            s.bidding.max_price = Some(1.0);
        }),
        ("decisionInterval must be at least 10s", |s| {
            s.bidding.decision_interval = duration("9s");
        }),
        ("deadline must be longer", |s| {
            s.bidding.deadline = Some(duration("1m59s"))
        }),
        ("billingModel must be aws", |s| {
            s.bidding.market.kind = MarketKind::Gcp;
            s.bidding.market.trace = None;
            s.bidding.market.region = Some("us-central1".into());
        }),
        ("trace is required", |s| s.bidding.market.trace = None),
        ("trace and traceStart are only valid", |s| {
            s.bidding.market.kind = MarketKind::Ec2;
            s.bidding.market.region = Some("us-east-1".into());
        }),
        ("region is required", |s| {
            s.bidding.market.kind = MarketKind::Ec2;
            s.bidding.market.trace = None;
        }),
        ("ec2 is required when mode is ec2", |s| {
            s.provisioning.mode = ProvisioningMode::Ec2;
            s.bidding.market.kind = MarketKind::Ec2;
            s.bidding.market.trace = None;
            s.bidding.market.region = Some("us-east-1".into());
        }),
        ("ec2 is only valid when mode is ec2", |s| {
            s.provisioning.ec2 = Some(Ec2Provisioning {
                launch_template: Some("lt".into()),
                ..Default::default()
            });
        }),
        ("must set launchTemplate or imageId", |s| {
            s.provisioning.mode = ProvisioningMode::Ec2;
            s.provisioning.ec2 = Some(Ec2Provisioning::default());
            s.bidding.market.kind = MarketKind::Ec2;
            s.bidding.market.trace = None;
            s.bidding.market.region = Some("us-east-1".into());
        }),
        ("requires spec.bidding.market.kind ec2", |s| {
            s.provisioning.mode = ProvisioningMode::Ec2;
            s.provisioning.ec2 = Some(Ec2Provisioning {
                image_id: Some("ami-0abc".into()),
                ..Default::default()
            });
        }),
    ]
}

#[test]
fn each_rule_fails_alone_on_its_breaking_change_in_cel_and_rust() {
    let validator = Validator::new();
    let compiled = cel::compile_schema(&generated_schema());
    let valid = TrainingJob::test("valid");
    assert_agree(&validator, &compiled, &valid);
    assert!(valid.spec.validate().is_ok());

    let mut covered: BTreeSet<&str> = BTreeSet::new();
    for (needle, change) in breakers() {
        let mut job = valid.clone();
        change(&mut job.spec);
        let broken: Vec<&Rule> = job.spec.broken_rules().collect();
        assert_eq!(
            broken.len(),
            1,
            "change {needle:?} should break exactly one rule: {broken:?}"
        );
        assert!(
            broken[0].message.contains(needle),
            "change {needle:?} broke {:?}",
            broken[0]
        );
        covered.insert(broken[0].message);
        assert_agree(&validator, &compiled, &job);
    }
    let uncovered: Vec<&str> = RULES
        .iter()
        .map(|r| r.message)
        .filter(|m| !covered.contains(m))
        .collect();
    assert!(
        uncovered.is_empty(),
        "rules without a breaking case: {uncovered:?}"
    );
}

/// A small deterministic generator (xorshift64*) for varied specs.
struct Choices(u64);

impl Choices {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    /// The first option (the fixture's valid choice) half the time, else any.
    fn pick<T: Clone>(&mut self, options: &[T]) -> T {
        if self.next().is_multiple_of(2) {
            return options[0].clone();
        }
        options[(self.next() % options.len() as u64) as usize].clone()
    }
    fn maybe<T>(&mut self, value: T) -> Option<T> {
        self.next().is_multiple_of(6).then_some(value)
    }
    fn often<T>(&mut self, value: T) -> Option<T> {
        (!self.next().is_multiple_of(6)).then_some(value)
    }
}

fn varied_spec(seed: u64) -> TrainingJobSpec {
    let mut c = Choices(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let mut s = ebbflow_crds::fixtures::test_spec();
    s.app.kind = c.pick(&[
        AppKind::MatrixFactorization,
        AppKind::LogisticRegression,
        AppKind::Lda,
        AppKind::Python,
        AppKind::SelfTest,
    ]);
    let entry = c.pick(&["mf_numpy:App", "pkg.model:Net", "no-colon", ":App"]);
    s.app.python = c.maybe(python_app(entry));
    let d = &mut s.app.dataset;
    let synthetic = SyntheticDataset {
        seed: 3,
        users: c.maybe(10),
        noise: c.maybe(0.5),
        samples: c.maybe(10),
        classes: c.maybe(2),
        documents: c.maybe(10),
        words_per_document: c.maybe(10),
        ..Default::default()
    };
    d.synthetic = c.often(synthetic);
    d.path = c.maybe("data.txt".to_owned());
    d.url = c.maybe("http://example.invalid/data".to_owned());
    d.format = c.pick(&[
        None,
        Some(DatasetFormat::MovielensInter),
        Some(DatasetFormat::Csv),
        Some(DatasetFormat::Libsvm),
        Some(DatasetFormat::Ldac),
        Some(DatasetFormat::Raw),
    ]);
    d.claim_name = c.maybe("pvc".to_owned());
    let hyperparameters = Hyperparameters {
        rank: c.maybe(4),
        adaptive_step: c.maybe(true),
        learning_rate: c.maybe(0.1),
        regularization: c.maybe(0.01),
        topics: c.maybe(5),
        alpha: c.maybe(0.1),
        beta: c.maybe(0.01),
        batch_size: c.maybe(100),
    };
    s.app.hyperparameters = c.often(hyperparameters);
    s.app.server_optimizer = c.pick(&[None, Some(ServerOptimizer::Momentum)]);
    s.consistency.model = c.pick(&[ConsistencyModel::Bsp, ConsistencyModel::Ssp]);
    s.consistency.staleness = c.pick(&[None, Some(0), Some(1), Some(4)]);
    s.stop.iterations = c.often(5);
    s.stop.target_loss = c.maybe(0.5);
    s.stop.wall_clock_limit = c.maybe(duration("10m"));
    s.transient.min_nodes = c.pick(&[0, 1, 3]);
    s.transient.max_nodes = c.pick(&[0, 2, 3]);
    s.elasticity.stage2_ratio = c.pick(&[0.5, 1.0, 15.0]);
    s.elasticity.stage3_ratio = c.pick(&[1.0, 15.0, 20.0]);
    let b = &mut s.bidding;
    b.strategy = c.pick(&[
        BiddingStrategy::BidBrain,
        BiddingStrategy::Standard,
        BiddingStrategy::OnDemandOnly,
    ]);
    b.billing_model = c.pick(&[
        BillingModel::Aws,
        BillingModel::AwsHourly2016,
        BillingModel::Gcp,
        BillingModel::Fixed,
    ]);
    b.budget_per_hour = c.pick(&[None, Some(0.0), Some(2.5)]);
    b.budget_total = c.pick(&[None, Some(0.0), Some(100.0)]);
    b.max_price = c.pick(&[None, Some(0.0), Some(0.9)]);
    b.decision_interval = duration(c.pick(&["2m", "5s", "10s", "1h30m"]));
    b.deadline = c.pick(&[
        None,
        Some(duration("30s")),
        Some(duration("2m")),
        Some(duration("6h")),
    ]);
    b.market.kind = c.pick(&[MarketKind::Trace, MarketKind::Ec2, MarketKind::Gcp]);
    b.market.trace = c.often("trace.csv".to_owned());
    b.market.trace_start = c.maybe(Time(Timestamp::UNIX_EPOCH));
    b.market.region = c.maybe("us-east-1".to_owned());
    s.provisioning.mode = c.pick(&[ProvisioningMode::Cluster, ProvisioningMode::Ec2]);
    let ec2 = Ec2Provisioning {
        launch_template: c.maybe("lt".to_owned()),
        image_id: c.maybe("ami-0abc".to_owned()),
        ..Default::default()
    };
    s.provisioning.ec2 = c.maybe(ec2);
    s
}

#[test]
fn cel_and_rust_agree_on_varied_specs() {
    let validator = Validator::new();
    let compiled = cel::compile_schema(&generated_schema());
    let mut valid = 0usize;
    let mut broken = BTreeSet::new();
    let breakers = breakers();
    for seed in 0..1500 {
        let spec = if seed % 2 == 0 {
            varied_spec(seed)
        } else {
            // The fixture with 0, 1 or 2 rule-breaking changes layered on it.
            let mut c = Choices(seed | 1);
            let mut spec = ebbflow_crds::fixtures::test_spec();
            for _ in 0..seed % 3 {
                let (_, change) = breakers[(c.next() % breakers.len() as u64) as usize];
                change(&mut spec);
            }
            spec
        };
        let job = TrainingJob::new("varied", spec);
        assert_agree(&validator, &compiled, &job);
        let failures: Vec<&Rule> = job.spec.broken_rules().collect();
        valid += usize::from(failures.is_empty());
        broken.extend(failures.iter().map(|rule| rule.message));
    }
    // The generator must reach both sides of the rules to mean anything.
    assert!(valid >= 20, "only {valid} varied specs were valid");
    assert!(
        broken.len() * 10 >= RULES.len() * 8,
        "varied specs broke only {} rules",
        broken.len()
    );
}

#[test]
fn cel_applies_schema_defaults_like_serde() {
    // A manifest without the defaulted sections: the API server fills them before CEL runs;
    // serde fills the same values in Rust.
    let validator = Validator::new();
    let compiled = cel::compile_schema(&generated_schema());
    let document = serde_json::json!({
        "apiVersion": "ebbflow.dev/v1alpha1",
        "kind": "TrainingJob",
        "metadata": { "name": "bare" },
        "spec": {
            "app": { "kind": "LDA", "dataset": { "synthetic": {} } },
            "stop": { "iterations": 3 },
            "bidding": { "market": { "kind": "trace", "trace": "t.csv" } }
        }
    });
    validator
        .validate_compiled(&compiled, &document, None)
        .expect("bare manifest passes CEL after defaulting");
    let job: TrainingJob = serde_json::from_value(document).expect("bare manifest deserializes");
    job.spec
        .validate()
        .expect("bare manifest passes the Rust rules");
    assert_eq!(job.spec.elasticity.stage3_ratio, 15.0);
    assert_eq!(job.spec.bidding.decision_interval.as_str(), "2m");
}
