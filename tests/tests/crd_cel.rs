//! The TrainingJob CRD against a real kube-apiserver (end-to-end; skipped without
//! `EBBFLOW_KUBECONFIG`): the committed CRD installs and becomes Established, every example in
//! `examples/` is accepted by server-side apply, and every cross-field CEL rule in `RULES` rejects
//! a manifest that breaks it (and nothing else) with its message, reported at the field it names.

use std::collections::BTreeSet;

use ebbflow_crds::{
    AppKind, BiddingStrategy, BillingModel, ConsistencyModel, DatasetFormat, DatasetSpec,
    Ec2Provisioning, Hyperparameters, ProvisioningMode, PythonApp, RULES, Rule, ServerOptimizer,
    StopSpec, SyntheticDataset, TrainingJob,
};
use ebbflow_tests::cluster::{
    BoxError, FIELD_MANAGER, TestNamespace, client_or_skip, install_crd, repo_root,
};
use kube::{
    Api, Client, ResourceExt,
    api::{ApiResource, DynamicObject, Patch, PatchParams, PostParams},
};
use serde::Deserialize as _;

/// One manifest for the API server and whether it must be accepted.
struct Case {
    name: &'static str,
    job: TrainingJob,
}

fn case(name: &'static str, build: impl FnOnce(TrainingJob) -> TrainingJob) -> Case {
    Case {
        name,
        job: build(TrainingJob::test(name)),
    }
}

fn ec2_provisioned(job: TrainingJob) -> TrainingJob {
    job.with_ec2_provisioning("us-east-1", "lt-0123456789abcdef0")
}

fn set_synthetic(
    job: TrainingJob,
    change: impl FnOnce(&mut ebbflow_crds::SyntheticDataset),
) -> TrainingJob {
    job.with_spec(|s| change(s.app.dataset.synthetic.get_or_insert_with(Default::default)))
}

fn set_hyperparameters(job: TrainingJob, change: impl FnOnce(&mut Hyperparameters)) -> TrainingJob {
    job.with_spec(|s| change(s.app.hyperparameters.get_or_insert_with(Default::default)))
}

/// Manifests that break cross-field rules only the API server's CEL catches (each is valid
/// against the OpenAPI schema). Together they break every rule in `RULES`.
fn invalid_cases() -> Vec<Case> {
    vec![
        case("dataset-none", |j| {
            j.with_spec(|s| s.app.dataset = DatasetSpec::default())
        }),
        case("dataset-synthetic-with-format", |j| {
            j.with_spec(|s| s.app.dataset.format = Some(DatasetFormat::Csv))
        }),
        case("dataset-claim-without-path", |j| {
            j.with_spec(|s| s.app.dataset.claim_name = Some("training-data".to_owned()))
        }),
        case("dataset-format-unsuited-to-kind", |j| {
            j.with_dataset_path("ratings.ldac", DatasetFormat::Ldac)
        }),
        case("synthetic-mf-fields-on-lr", |j| {
            set_synthetic(j.with_app(AppKind::LogisticRegression), |d| {
                d.users = Some(10)
            })
        }),
        case("synthetic-lr-fields-on-mf", |j| {
            set_synthetic(j, |d| d.samples = Some(10))
        }),
        case("synthetic-lda-fields-on-mf", |j| {
            set_synthetic(j, |d| d.documents = Some(10))
        }),
        case("rank-on-lr", |j| {
            set_hyperparameters(j.with_app(AppKind::LogisticRegression), |h| {
                h.rank = Some(4)
            })
        }),
        case("adaptive-step-on-lr", |j| {
            set_hyperparameters(j.with_app(AppKind::LogisticRegression), |h| {
                h.adaptive_step = Some(true)
            })
        }),
        case("adaptive-step-with-server-momentum", |j| {
            set_hyperparameters(j, |h| h.adaptive_step = Some(true))
                .with_spec(|s| s.app.server_optimizer = Some(ServerOptimizer::Momentum))
        }),
        case("threads-per-worker-on-lr", |j| {
            j.with_app(AppKind::LogisticRegression)
                .with_spec(|s| s.runtime.threads_per_worker = Some(2))
        }),
        case("batch-size-on-mf", |j| {
            set_hyperparameters(j, |h| h.batch_size = Some(8))
        }),
        case("topics-on-mf", |j| {
            set_hyperparameters(j, |h| h.topics = Some(5))
        }),
        case("learning-rate-on-lda", |j| {
            set_hyperparameters(j.with_app(AppKind::Lda), |h| h.learning_rate = Some(0.1))
        }),
        case("server-optimizer-on-lda", |j| {
            j.with_app(AppKind::Lda)
                .with_spec(|s| s.app.server_optimizer = Some(ServerOptimizer::Sgd))
        }),
        case("python-on-mf", |j| {
            j.with_spec(|s| {
                s.app.python = Some(PythonApp {
                    entry: "mf_numpy:App".into(),
                    args: None,
                    path: Vec::new(),
                })
            })
        }),
        case("python-entry-without-colon", |j| {
            j.with_app(AppKind::Python).with_spec(|s| {
                if let Some(python) = s.app.python.as_mut() {
                    python.entry = "mf_numpy".into();
                }
            })
        }),
        case("synthetic-on-python", |j| {
            j.with_app(AppKind::Python).with_spec(|s| {
                s.app.dataset = DatasetSpec {
                    synthetic: Some(SyntheticDataset {
                        seed: 1,
                        ..SyntheticDataset::default()
                    }),
                    ..DatasetSpec::default()
                }
            })
        }),
        case("hyperparameters-on-python", |j| {
            j.with_app(AppKind::Python)
                .with_spec(|s| s.app.hyperparameters = Some(Hyperparameters::default()))
        }),
        case("self-test-reading-a-file", |j| {
            j.with_app(AppKind::SelfTest)
                .with_dataset_path("ratings.csv", DatasetFormat::Csv)
        }),
        case("server-optimizer-on-self-test", |j| {
            j.with_app(AppKind::SelfTest)
                .with_spec(|s| s.app.server_optimizer = Some(ServerOptimizer::Sgd))
        }),
        case("staleness-with-bsp", |j| {
            j.with_spec(|s| s.consistency.staleness = Some(2))
        }),
        case("ssp-without-staleness", |j| {
            j.with_spec(|s| {
                s.consistency.model = ConsistencyModel::Ssp;
                s.consistency.staleness = None;
            })
        }),
        case("stop-criteria-none", |j| {
            j.with_spec(|s| s.stop = StopSpec::default())
        }),
        case("transient-min-above-max", |j| j.with_transient_range(5, 2)),
        case("stage-thresholds-out-of-order", |j| {
            j.with_spec(|s| {
                s.elasticity.stage2_ratio = 10.0;
                s.elasticity.stage3_ratio = 5.0;
            })
        }),
        case("budget-per-hour-zero", |j| j.with_budget_per_hour(0.0)),
        // 0, not negative: the schema's minimum (0) would reject a negative total before CEL.
        case("budget-total-zero", |j| j.with_budget_total(0.0)),
        case("max-price-zero", |j| j.with_max_price(0.0)),
        case("max-price-with-on-demand-only", |j| {
            j.with_strategy(BiddingStrategy::OnDemandOnly)
                .with_max_price(1.5)
        }),
        case("decision-interval-below-10s", |j| {
            j.with_decision_interval("5s")
        }),
        case("deadline-not-after-decision-interval", |j| {
            j.with_decision_interval("2m").with_deadline("1m")
        }),
        case("billing-model-unsuited-to-market", |j| {
            j.with_ec2_market("us-east-1")
                .with_billing_model(BillingModel::Fixed)
        }),
        case("trace-market-without-trace", |j| {
            j.with_spec(|s| s.bidding.market.trace = None)
        }),
        case("ec2-market-with-trace", |j| {
            j.with_ec2_market("us-east-1")
                .with_spec(|s| s.bidding.market.trace = Some("prices.csv".to_owned()))
        }),
        case("ec2-market-without-region", |j| {
            j.with_ec2_market("us-east-1")
                .with_spec(|s| s.bidding.market.region = None)
        }),
        case("ec2-mode-without-ec2", |j| {
            ec2_provisioned(j).with_spec(|s| s.provisioning.ec2 = None)
        }),
        case("ec2-settings-in-cluster-mode", |j| {
            ec2_provisioned(j).with_spec(|s| s.provisioning.mode = ProvisioningMode::Cluster)
        }),
        case("ec2-without-image", |j| {
            ec2_provisioned(j).with_spec(|s| {
                if let Some(ec2) = s.provisioning.ec2.as_mut() {
                    ec2.launch_template = None;
                }
            })
        }),
        case("ec2-mode-with-trace-market", |j| {
            j.with_spec(|s| {
                s.provisioning.mode = ProvisioningMode::Ec2;
                s.provisioning.ec2 = Some(Ec2Provisioning {
                    launch_template: Some("lt-0123456789abcdef0".to_owned()),
                    ..Ec2Provisioning::default()
                });
            })
        }),
    ]
}

/// Manifests at the edge of a rule that must be accepted (the rules are not stricter than
/// documented).
fn boundary_cases() -> Vec<Case> {
    vec![
        case("fixture", |j| j),
        case("transient-min-equals-max", |j| j.with_transient_range(3, 3)),
        case("ssp-staleness-one", |j| j.with_ssp(1)),
        case("decision-interval-10s", |j| j.with_decision_interval("10s")),
        case("deadline-just-after-interval", |j| {
            j.with_decision_interval("2m").with_deadline("2m1s")
        }),
        case("budgets-tiny-but-positive", |j| {
            j.with_budget_per_hour(0.01)
                .with_budget_total(0.01)
                .with_max_price(0.001)
        }),
        case("logistic-regression", |j| {
            j.with_app(AppKind::LogisticRegression)
        }),
        case("lda", |j| j.with_app(AppKind::Lda)),
        case("mf-threads-per-worker", |j| {
            j.with_spec(|s| s.runtime.threads_per_worker = Some(20))
        }),
        case("ec2-provisioning", ec2_provisioned),
    ]
}

fn rule_key(rule: &Rule) -> (&'static str, &'static str, &'static str) {
    (rule.scope, rule.field, rule.cel)
}

async fn with_cluster(test: &str) -> Result<Option<Client>, BoxError> {
    let Some(client) = client_or_skip(test).await? else {
        return Ok(None);
    };
    install_crd(&client).await?;
    Ok(Some(client))
}

#[tokio::test]
async fn every_example_is_accepted_by_server_side_apply() -> Result<(), BoxError> {
    let Some(client) = with_cluster("every_example_is_accepted_by_server_side_apply").await? else {
        return Ok(());
    };
    let namespace = TestNamespace::create(&client, "cel-examples").await?;
    let resource = ApiResource::erase::<TrainingJob>(&());
    let jobs: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), namespace.name(), &resource);

    let examples_dir = repo_root().join("examples");
    let mut paths: Vec<_> = std::fs::read_dir(&examples_dir)
        .map_err(|e| format!("read {}: {e}", examples_dir.display()))?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| {
            path.extension()
                .is_some_and(|ext| ext == "yaml" || ext == "yml")
        })
        .collect();
    paths.sort();
    let mut applied = Vec::new();
    for path in &paths {
        let text =
            std::fs::read_to_string(path).map_err(|e| format!("read {}: {e}", path.display()))?;
        for document in serde_yaml::Deserializer::from_str(&text) {
            let value = serde_json::Value::deserialize(document)
                .map_err(|e| format!("parse {}: {e}", path.display()))?;
            if value.get("kind").and_then(|k| k.as_str()) != Some("TrainingJob") {
                continue;
            }
            let mut object: DynamicObject = serde_json::from_value(value)?;
            object.metadata.namespace = Some(namespace.name().to_owned());
            let name = object.name_any();
            let stored = jobs
                .patch(
                    &name,
                    &PatchParams::apply(FIELD_MANAGER).validation_strict(),
                    &Patch::Apply(&object),
                )
                .await
                .map_err(|e| format!("example {} ({name}) was rejected: {e}", path.display()))?;
            // What the API server stored (with its defaults) must read back as a TrainingJob.
            let typed: TrainingJob = serde_json::from_value(serde_json::to_value(&stored)?)
                .map_err(|e| {
                    format!(
                        "example {} ({name}) as stored does not parse: {e}",
                        path.display()
                    )
                })?;
            typed.spec.validate().map_err(|e| {
                format!(
                    "example {} ({name}) as stored breaks a rule: {e}",
                    path.display()
                )
            })?;
            applied.push(format!("{} ({name})", path.display()));
        }
    }
    assert!(
        !applied.is_empty(),
        "no TrainingJob manifests found in {}",
        examples_dir.display()
    );
    println!("applied {} examples: {}", applied.len(), applied.join(", "));
    namespace.delete().await
}

#[tokio::test]
async fn cel_rules_reject_invalid_manifests_naming_the_field() -> Result<(), BoxError> {
    let Some(client) = with_cluster("cel_rules_reject_invalid_manifests_naming_the_field").await?
    else {
        return Ok(());
    };
    // Dry-run creates: the API server validates fully but stores nothing.
    let jobs: Api<TrainingJob> = Api::default_namespaced(client.clone());
    let dry_run = PostParams {
        dry_run: true,
        field_manager: Some(FIELD_MANAGER.to_owned()),
    };
    let mut failures = Vec::new();

    for Case { name, job } in invalid_cases() {
        // What the API server reports for a failed CEL rule with a fieldPath (Kubernetes 1.35):
        // `<path>: Invalid value: <message>`, one entry per broken rule.
        let expected: Vec<String> = job
            .spec
            .broken_rules()
            .map(|rule| format!("{}: Invalid value: {}", rule.path(), rule.message))
            .collect();
        if expected.is_empty() {
            failures.push(format!(
                "{name}: the case breaks no rule in Rust, fix the table"
            ));
            continue;
        }
        match jobs.create(&dry_run, &job).await {
            Ok(_) => failures.push(format!("{name}: accepted, expected: {expected:?}")),
            Err(kube::Error::Api(response)) => {
                let prefix = format!("TrainingJob.ebbflow.dev \"{name}\" is invalid: ");
                let Some(details) = response.message.strip_prefix(&prefix) else {
                    failures.push(format!("{name}: unexpected message: {}", response.message));
                    continue;
                };
                // The same set of field errors as Rust predicts, nothing more: remove each
                // expected error and only the list punctuation may remain.
                let mut rest = details.to_owned();
                for text in &expected {
                    if !rest.contains(text) {
                        failures.push(format!(
                            "{name}: API server said {:?}, expected it to contain {text:?}",
                            response.message
                        ));
                    }
                    rest = rest.replacen(text, "", 1);
                }
                if rest.chars().any(|c| !matches!(c, '[' | ']' | ',' | ' ')) {
                    failures.push(format!(
                        "{name}: API server reported more than Rust predicts: {:?} (extra: {rest:?})",
                        response.message
                    ));
                }
                if response.code != 422 {
                    failures.push(format!("{name}: HTTP {} instead of 422", response.code));
                }
            }
            Err(other) => return Err(format!("{name}: create failed: {other}").into()),
        }
    }

    for Case { name, job } in boundary_cases() {
        if let Err(e) = job.spec.validate() {
            failures.push(format!(
                "{name}: boundary case breaks a rule in Rust ({e}), fix the table"
            ));
            continue;
        }
        if let Err(e) = jobs.create(&dry_run, &job).await {
            failures.push(format!("{name}: valid boundary manifest rejected: {e}"));
        }
    }

    let uncovered = uncovered_rules(&invalid_cases());
    if !uncovered.is_empty() {
        failures.push(format!(
            "no case in invalid_cases() breaks: {}",
            uncovered.join("; ")
        ));
    }
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
    println!(
        "{} CEL rules each rejected a manifest on a real API server",
        RULES.len()
    );
    Ok(())
}

/// The rules no invalid case breaks (in Rust), as `path (message)`.
fn uncovered_rules(cases: &[Case]) -> Vec<String> {
    let exercised: BTreeSet<_> = cases
        .iter()
        .flat_map(|case| case.job.spec.broken_rules().map(rule_key))
        .collect();
    RULES
        .iter()
        .filter(|rule| !exercised.contains(&rule_key(rule)))
        .map(|rule| format!("{} ({})", rule.path(), rule.message))
        .collect()
}

#[test]
fn case_table_covers_every_rule_with_valid_object_names() {
    // Runs without a cluster, so a new rule without an API-server case fails plain cargo test.
    let invalid = invalid_cases();
    let boundary = boundary_cases();
    let mut names = BTreeSet::new();
    for Case { name, job } in invalid.iter().chain(&boundary) {
        assert!(
            name.len() <= 63
                && name
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'),
            "{name} is not a DNS label"
        );
        assert!(names.insert(*name), "{name} appears twice");
        assert_eq!(job.name_any(), *name);
    }
    for Case { name, job } in &invalid {
        assert!(
            job.spec.validate().is_err(),
            "invalid case {name} breaks no rule"
        );
    }
    for Case { name, job } in &boundary {
        assert!(
            job.spec.validate().is_ok(),
            "boundary case {name} breaks a rule"
        );
    }
    let uncovered = uncovered_rules(&invalid);
    assert!(
        uncovered.is_empty(),
        "add a case to invalid_cases() in tests/tests/crd_cel.rs for: {}",
        uncovered.join("; ")
    );
}
