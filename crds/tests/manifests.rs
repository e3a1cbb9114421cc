//! Manifests: every example is valid against the generated schema and rules, and a table of
//! invalid manifests is rejected with messages that name the offending field.

use std::path::{Path, PathBuf};

use ebbflow_crds::{
    AppKind, ManifestError, MarketKind, ProvisioningMode, TrainingJob, parse_manifest,
};
use serde_json::{Value, json};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("crds/ has a parent")
        .to_path_buf()
}

fn examples() -> Vec<(PathBuf, TrainingJob)> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(repo_root().join("examples"))
        .expect("examples/ exists")
        .map(|entry| entry.expect("readable examples/ entry").path())
        .filter(|path| {
            path.extension()
                .is_some_and(|ext| ext == "yaml" || ext == "yml")
        })
        .collect();
    paths.sort();
    paths
        .into_iter()
        .map(|path| {
            let text = std::fs::read_to_string(&path).expect("readable example");
            let job = parse_manifest(&text)
                .unwrap_or_else(|error| panic!("{} is invalid: {error}", path.display()));
            (path, job)
        })
        .collect()
}

#[test]
fn every_example_is_valid() {
    let examples = examples();
    assert!(
        examples.len() >= 5,
        "expected at least five examples, found {}",
        examples.len()
    );
    for (path, job) in &examples {
        let file_stem = path
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or_default();
        assert_eq!(
            job.metadata.name.as_deref(),
            Some(file_stem),
            "{}: metadata.name should match the file name",
            path.display()
        );
    }
}

#[test]
fn examples_cover_every_app_and_provisioning_mode() {
    let examples = examples();
    for kind in [
        AppKind::MatrixFactorization,
        AppKind::LogisticRegression,
        AppKind::Lda,
    ] {
        assert!(
            examples.iter().any(|(_, job)| job.spec.app.kind == kind),
            "no example for {kind:?}"
        );
    }
    assert!(
        examples
            .iter()
            .any(|(_, job)| job.spec.provisioning.mode == ProvisioningMode::Ec2),
        "no ec2 provisioning example"
    );
    let quickstart = examples
        .iter()
        .find(|(path, _)| path.ends_with("quickstart.yaml"))
        .map(|(_, job)| job)
        .expect("examples/quickstart.yaml exists");
    assert_eq!(quickstart.spec.app.kind, AppKind::MatrixFactorization);
    assert!(
        quickstart.spec.app.dataset.synthetic.is_some(),
        "quickstart uses synthetic data"
    );
    assert_eq!(quickstart.spec.bidding.market.kind, MarketKind::Trace);
    assert!(
        quickstart.spec.transient.max_nodes >= 1,
        "quickstart exercises the transient tier"
    );
}

#[test]
fn example_traces_exist_beside_the_repository() {
    // Traces are resolved against the working directory; the README runs from the repository
    // root, with shared/ beside it.
    if !repo_root().join("../shared/data/spot").is_dir() {
        eprintln!("shared/data/spot not beside the repository; skipping");
        return;
    }
    for (path, job) in examples() {
        if let Some(trace) = &job.spec.bidding.market.trace {
            assert!(
                repo_root().join(trace).is_file(),
                "{}: trace {trace} not found from the repository root",
                path.display()
            );
        }
    }
}

#[test]
fn example_datasets_exist_in_the_data_directory() {
    // scripts/fetch-data.sh fills EBBFLOW_DATA_DIR (the README's test command exports it);
    // relative dataset paths are resolved against it by `ebbflow run`.
    let Some(data_dir) = std::env::var_os("EBBFLOW_DATA_DIR")
        .map(PathBuf::from)
        .filter(|dir| dir.is_dir())
    else {
        eprintln!("EBBFLOW_DATA_DIR not set or not a directory; skipping");
        return;
    };
    for (path, job) in examples() {
        if let Some(dataset) = &job.spec.app.dataset.path {
            assert!(
                data_dir.join(dataset).is_file(),
                "{}: dataset {dataset} not in {} (scripts/fetch-data.sh fetches it)",
                path.display(),
                data_dir.display()
            );
        }
    }
}

/// A valid manifest to break, as JSON.
fn base() -> Value {
    json!({
        "apiVersion": "ebbflow.dev/v1alpha1",
        "kind": "TrainingJob",
        "metadata": { "name": "broken" },
        "spec": {
            "app": {
                "kind": "MatrixFactorization",
                "dataset": { "synthetic": { "seed": 1, "users": 10, "items": 10 } }
            },
            "consistency": { "model": "BSP" },
            "stop": { "iterations": 10 },
            "reliable": {
                "count": 1,
                "tolerations": [{ "key": "k", "operator": "Exists", "effect": "NoSchedule" }]
            },
            "transient": { "minNodes": 0, "maxNodes": 4, "instanceTypes": ["c5.xlarge"] },
            "bidding": {
                "market": { "kind": "trace", "trace": "trace.csv" },
                "billingModel": "aws",
                "budgetPerHour": 2.0,
                "decisionInterval": "2m"
            },
            "runtime": { "resources": { "requests": { "cpu": "500m" } } }
        }
    })
}

fn set(document: &mut Value, pointer: &str, value: Value) {
    let (parent, key) = pointer.rsplit_once('/').expect("pointer has a parent");
    let parent = document
        .pointer_mut(parent)
        .unwrap_or_else(|| panic!("no {parent}"));
    match parent {
        Value::Object(map) => {
            map.insert(key.to_owned(), value);
        }
        Value::Array(items) => items[key.parse::<usize>().expect("array index")] = value,
        _ => panic!("{pointer} has no container"),
    }
}

fn remove(document: &mut Value, pointer: &str) {
    let (parent, key) = pointer.rsplit_once('/').expect("pointer has a parent");
    document
        .pointer_mut(parent)
        .and_then(Value::as_object_mut)
        .and_then(|map| map.remove(key))
        .unwrap_or_else(|| panic!("nothing at {pointer}"));
}

enum Edit {
    Set(&'static str, Value),
    Remove(&'static str),
}

use Edit::{Remove, Set};

struct Case {
    name: &'static str,
    edits: Vec<Edit>,
    /// The field the error must be reported at (and named in the message).
    field: &'static str,
    /// A fragment of the message.
    says: &'static str,
}

fn case(name: &'static str, edits: Vec<Edit>, field: &'static str, says: &'static str) -> Case {
    Case {
        name,
        edits,
        field,
        says,
    }
}

fn invalid_cases() -> Vec<Case> {
    vec![
        // wrong types
        case(
            "count is a string",
            vec![Set("/spec/transient/maxNodes", json!("four"))],
            "spec.transient.maxNodes",
            "must be of type integer",
        ),
        case(
            "suspend is a string",
            vec![Set("/spec/suspend", json!("yes"))],
            "spec.suspend",
            "must be of type boolean",
        ),
        case(
            "toleration effect is a number",
            vec![Set("/spec/reliable/tolerations/0/effect", json!(5))],
            "spec.reliable.tolerations[0].effect",
            "must be of type string",
        ),
        case(
            "target loss is negative",
            vec![Set("/spec/stop/targetLoss", json!(-0.5))],
            "spec.stop.targetLoss",
            "greater than or equal to 0",
        ),
        case(
            "stop is a list",
            vec![Set("/spec/stop", json!([10]))],
            "spec.stop",
            "must be of type object",
        ),
        case(
            "resource quantity is an object",
            vec![Set(
                "/spec/runtime/resources/requests/cpu",
                json!({ "cores": 1 }),
            )],
            "spec.runtime.resources.requests.cpu",
            "must be of type integer or string",
        ),
        // out-of-range numbers
        case(
            "too many transient nodes",
            vec![Set("/spec/transient/maxNodes", json!(5000))],
            "spec.transient.maxNodes",
            "less than or equal to 1000",
        ),
        case(
            "no reliable node",
            vec![Set("/spec/reliable/count", json!(0))],
            "spec.reliable.count",
            "greater than or equal to 1",
        ),
        case(
            "negative total budget",
            vec![Set("/spec/bidding/budgetTotal", json!(-5))],
            "spec.bidding.budgetTotal",
            "greater than or equal to 0",
        ),
        case(
            "phi above 1",
            vec![Set("/spec/bidding/overrides", json!({ "phi": 1.5 }))],
            "spec.bidding.overrides.phi",
            "less than or equal to 1",
        ),
        case(
            "huge staleness",
            vec![Set(
                "/spec/consistency",
                json!({ "model": "SSP", "staleness": 5000 }),
            )],
            "spec.consistency.staleness",
            "less than or equal to 1000",
        ),
        // unknown enum values
        case(
            "unknown app kind",
            vec![Set("/spec/app/kind", json!("KMeans"))],
            "spec.app.kind",
            "Unsupported value: \"KMeans\"",
        ),
        case(
            "unknown billing model",
            vec![Set("/spec/bidding/billingModel", json!("azure"))],
            "spec.bidding.billingModel",
            "supported values: \"aws\"",
        ),
        case(
            "unknown consistency model",
            vec![Set("/spec/consistency/model", json!("ASP"))],
            "spec.consistency.model",
            "Unsupported value",
        ),
        case(
            "unknown market kind",
            vec![Set("/spec/bidding/market/kind", json!("azure"))],
            "spec.bidding.market.kind",
            "Unsupported value",
        ),
        // malformed strings
        case(
            "wall-clock limit in words",
            vec![Set("/spec/stop/wallClockLimit", json!("2 minutes"))],
            "spec.stop.wallClockLimit",
            "should match",
        ),
        case(
            "deadline in days",
            vec![Set("/spec/bidding/deadline", json!("1d"))],
            "spec.bidding.deadline",
            "should match",
        ),
        case(
            "upper-case instance type",
            vec![Set("/spec/transient/instanceTypes/0", json!("C5.XLARGE"))],
            "spec.transient.instanceTypes[0]",
            "should match",
        ),
        case(
            "ftp dataset url",
            vec![
                Remove("/spec/app/dataset/synthetic"),
                Set(
                    "/spec/app/dataset/url",
                    json!("ftp://example.invalid/r.csv"),
                ),
                Set("/spec/app/dataset/format", json!("csv")),
            ],
            "spec.app.dataset.url",
            "should match",
        ),
        case(
            "trace start not a time",
            vec![Set("/spec/bidding/market/traceStart", json!("yesterday"))],
            "spec.bidding.market.traceStart",
            "date-time",
        ),
        // missing required fields
        case(
            "no app kind",
            vec![Remove("/spec/app/kind")],
            "spec.app.kind",
            "Required value",
        ),
        case(
            "no market",
            vec![Remove("/spec/bidding/market")],
            "spec.bidding.market",
            "Required value",
        ),
        case(
            "no stop",
            vec![Remove("/spec/stop")],
            "spec.stop",
            "Required value",
        ),
        case(
            "no name",
            vec![Remove("/metadata/name")],
            "metadata.name",
            "Required value",
        ),
        case(
            "wrong apiVersion",
            vec![Set("/apiVersion", json!("ebbflow.dev/v1"))],
            "apiVersion",
            "supported values: \"ebbflow.dev/v1alpha1\"",
        ),
        // unknown fields
        case(
            "typo in a field name",
            vec![Set("/spec/transient/maxNode", json!(4))],
            "spec.transient.maxNode",
            "field not declared in schema",
        ),
        case(
            "field from another API",
            vec![Set("/spec/replicas", json!(3))],
            "spec.replicas",
            "field not declared in schema",
        ),
        // cross-field rules (CEL on the cluster)
        case(
            "min above max",
            vec![Set("/spec/transient/minNodes", json!(5))],
            "spec.transient.minNodes",
            "spec.transient.minNodes must be less than or equal to spec.transient.maxNodes",
        ),
        case(
            "stage thresholds out of order",
            vec![Set(
                "/spec/elasticity",
                json!({ "stage2Ratio": 20, "stage3Ratio": 15 }),
            )],
            "spec.elasticity.stage3Ratio",
            "must be greater than spec.elasticity.stage2Ratio",
        ),
        case(
            "zero budget",
            vec![Set("/spec/bidding/budgetPerHour", json!(0))],
            "spec.bidding.budgetPerHour",
            "must be greater than 0",
        ),
        case(
            "staleness with BSP",
            vec![Set("/spec/consistency/staleness", json!(2))],
            "spec.consistency.staleness",
            "only allowed with model SSP",
        ),
        case(
            "SSP without staleness",
            vec![Set("/spec/consistency/model", json!("SSP"))],
            "spec.consistency.staleness",
            "must be set to at least 1",
        ),
        case(
            "no stop criterion",
            vec![Set("/spec/stop", json!({}))],
            "spec.stop",
            "at least one of iterations, targetLoss or wallClockLimit",
        ),
        case(
            "two dataset sources",
            vec![Set("/spec/app/dataset/path", json!("r.csv"))],
            "spec.app.dataset",
            "exactly one of synthetic, path or url",
        ),
        case(
            "format unfit for the app",
            vec![
                Set("/spec/app/kind", json!("LDA")),
                Set(
                    "/spec/app/dataset",
                    json!({ "path": "docs.csv", "format": "csv" }),
                ),
            ],
            "spec.app.dataset.format",
            "ldac for LDA",
        ),
        case(
            "trace market without trace",
            vec![Remove("/spec/bidding/market/trace")],
            "spec.bidding.market.trace",
            "required when kind is trace",
        ),
        case(
            "ec2 market without region",
            vec![Set("/spec/bidding/market", json!({ "kind": "ec2" }))],
            "spec.bidding.market.region",
            "required when kind is ec2 or gcp",
        ),
        case(
            "deadline before the first decision",
            vec![Set("/spec/bidding/deadline", json!("90s"))],
            "spec.bidding.deadline",
            "longer than spec.bidding.decisionInterval",
        ),
        case(
            "ec2 provisioning on a trace market",
            vec![Set(
                "/spec/provisioning",
                json!({ "mode": "ec2", "ec2": { "launchTemplate": "lt" } }),
            )],
            "spec.provisioning.mode",
            "requires spec.bidding.market.kind ec2",
        ),
    ]
}

fn apply(case: &Case) -> Value {
    let mut document = base();
    for edit in &case.edits {
        match edit {
            Set(pointer, value) => set(&mut document, pointer, value.clone()),
            Remove(pointer) => remove(&mut document, pointer),
        }
    }
    document
}

#[test]
fn base_manifest_is_valid() {
    let yaml = serde_yaml::to_string(&base()).expect("base serializes");
    parse_manifest(&yaml).expect("the base of the invalid table is valid");
}

#[test]
fn invalid_manifests_are_rejected_naming_the_field() {
    let cases = invalid_cases();
    assert!(cases.len() >= 15);
    let mut failures = Vec::new();
    for case in &cases {
        let yaml = serde_yaml::to_string(&apply(case)).expect("case serializes");
        let error = match parse_manifest(&yaml) {
            Ok(_) => {
                failures.push(format!("{}: accepted", case.name));
                continue;
            }
            Err(error) => error,
        };
        let message = error.to_string();
        let at_field = error
            .field_errors()
            .iter()
            .any(|e| e.field == case.field && e.to_string().contains(case.says));
        if !at_field || !message.contains(case.field) {
            failures.push(format!(
                "{}: expected an error at {} saying {:?}, got: {message}",
                case.name, case.field, case.says
            ));
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

#[test]
fn messages_read_like_the_api_server() {
    let too_many = case(
        "too many",
        vec![Set("/spec/transient/maxNodes", json!(5000))],
        "",
        "",
    );
    let yaml = serde_yaml::to_string(&apply(&too_many)).expect("serializes");
    let error = parse_manifest(&yaml).expect_err("out of range");
    assert_eq!(
        error.to_string(),
        "TrainingJob.ebbflow.dev \"broken\" is invalid: spec.transient.maxNodes: Invalid value: \
         5000: spec.transient.maxNodes in body should be less than or equal to 1000"
    );

    let two_rules = case(
        "two rules",
        vec![
            Set("/spec/transient/minNodes", json!(5)),
            Set("/spec/stop", json!({})),
        ],
        "",
        "",
    );
    let yaml = serde_yaml::to_string(&apply(&two_rules)).expect("serializes");
    let error = parse_manifest(&yaml).expect_err("two rules broken");
    assert_eq!(
        error.to_string(),
        "TrainingJob.ebbflow.dev \"broken\" is invalid: [spec.stop: Invalid value: spec.stop \
         must set at least one of iterations, targetLoss or wallClockLimit, \
         spec.transient.minNodes: Invalid value: spec.transient.minNodes must be less than or \
         equal to spec.transient.maxNodes]"
    );
}

#[test]
fn yaml_syntax_errors_are_not_field_errors() {
    let error = parse_manifest("spec: [unclosed").expect_err("not yaml");
    assert!(matches!(error, ManifestError::Yaml(_)), "{error:?}");
    assert!(error.field_errors().is_empty());
    assert!(error.to_string().starts_with("parse manifest yaml: "));
}

#[test]
fn explicit_nulls_are_accepted_like_the_api_server_does() {
    let mut document = base();
    set(&mut document, "/spec/stop/targetLoss", Value::Null);
    set(&mut document, "/spec/app/hyperparameters", Value::Null);
    let yaml = serde_yaml::to_string(&document).expect("serializes");
    let job = parse_manifest(&yaml).expect("nulls on optional fields are accepted");
    assert_eq!(job.spec.stop.target_loss, None);
}

#[test]
fn defaults_are_applied() {
    let yaml = serde_yaml::to_string(&base()).expect("serializes");
    let job = parse_manifest(&yaml).expect("valid");
    assert_eq!(job.spec.elasticity.stage2_ratio, 1.0);
    assert_eq!(job.spec.elasticity.stage3_ratio, 15.0);
    assert_eq!(job.spec.provisioning.mode, ProvisioningMode::Cluster);
    assert!(!job.spec.suspend);
}
