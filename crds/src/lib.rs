//! The `TrainingJob` API (`ebbflow.dev/v1alpha1`) and CRD YAML generation.
//!
//! A `TrainingJob` is namespaced, short name `tj`, category `ebbflow`, with a status subresource.
//! Its spec, as written in a manifest (every field is documented in [`spec`]; `kubectl explain
//! trainingjob.spec` shows the same text):
//!
//! ```text
//! spec:
//!   app:                         # required
//!     kind: MatrixFactorization | LogisticRegression | LDA            (required)
//!     dataset:                   # exactly one of synthetic, path, url
//!       synthetic: { seed, users, items, ratings, trueRank, noise,      # MatrixFactorization
//!                    samples, features, classes,                        # LogisticRegression
//!                    documents, vocabulary, wordsPerDocument, trueTopics }  # LDA
//!       path: <file>             # relative to the dataset root; .gz is decompressed
//!       url: http(s)://...
//!       format: movielens-inter | csv | libsvm | ldac   # required with path/url, must suit kind
//!       claimName: <pvc>         # with path: mounted read-only at /data
//!     hyperparameters: { rank, adaptiveStep, learningRate, regularization, topics, alpha, beta, batchSize }
//!     serverOptimizer: sgd | momentum | adagrad
//!   consistency: { model: BSP | SSP (default BSP), staleness }   # staleness ≥ 1, SSP only
//!   stop: { iterations, targetLoss, wallClockLimit }             # at least one
//!   reliable: { count (default 1), instanceTypes, nodeSelector, tolerations }
//!   transient: { minNodes, maxNodes (default 0, min ≤ max), instanceTypes, zones,
//!                nodeSelector, tolerations }
//!   bidding:                     # required
//!     strategy: BidBrain | Standard | OnDemandOnly                 (default BidBrain)
//!     market: { kind: trace | ec2 | gcp, trace, traceStart, region, onDemandPrice }
//!     billingModel: aws | aws-hourly-2016 | gcp | fixed            (default aws)
//!     budgetPerHour, budgetTotal, maxPrice                         # USD, > 0
//!     deadline, decisionInterval (default 2m, ≥ 10s, < deadline)   # durations: 90s, 30m, 1h30m
//!     overrides: { phi, sigma, lambda, nu, throughput: [{ ratio, relative }] }
//!   elasticity: { stage2Ratio (default 1) < stage3Ratio (default 15), partitions,
//!                 backupFlushInterval }
//!   provisioning:
//!     mode: cluster | ec2                                           (default cluster)
//!     capacityType: { preset: karpenter | eks | gke, key, onDemandValue, spotValue }
//!     ec2: { launchTemplate, imageId, subnetIds, securityGroupIds, instanceProfile, tags }
//!   runtime: { image, resources, workerThreads, threadsPerWorker, terminationGracePeriodSeconds }
//!   suspend: false
//! ```
//!
//! Status ([`status`]): `phase`, `conditions`, `observedGeneration`, `stage`, `iteration`,
//! `loss`, `nodes {reliable, transient, total, pools[]}`, `cost {spent, freeCompute,
//! onDemandEquivalent}`, `allocations[]`, `recentDecisions[]` (at most
//! [`status::MAX_RECENT_DECISIONS`] = 20, newest last), `evictions`, `migrations`, `rollbacks`,
//! `startTime`, `completionTime`.
//!
//! Validation happens in two layers that report the API server's messages in both places:
//! the OpenAPI schema (types, bounds, enums, required fields) and the cross-field [`RULES`],
//! which are emitted as CEL `x-kubernetes-validations` and also run in Rust by
//! [`TrainingJobSpec::validate`]. [`parse_manifest`] runs both for use without a cluster.

pub mod duration;
pub mod fixtures;
mod manifest;
pub mod rules;
pub mod spec;
pub mod status;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, JSONSchemaProps, ValidationRule,
};
use kube::CustomResourceExt;

pub use duration::{DurationString, parse_duration};

/// FNV-1a (64 bits) of `text`: a stable, dependency-free hash for derived names and tokens.
pub fn fnv1a(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
    })
}
pub use manifest::{ManifestError, parse_manifest};
pub use rules::{FieldError, InvalidSpec, RULES, Rule};
pub use spec::*;
pub use status::*;

/// The command that regenerates the committed CRD YAML.
pub const REGENERATE_COMMAND: &str = "cargo run -p ebbflow-job --bin ebbflow -- crd > charts/ebbflow/crds/trainingjobs.ebbflow.dev.yaml";

/// Where the generated CRD YAML is committed, relative to the repository root.
pub const CRD_YAML_PATH: &str = "charts/ebbflow/crds/trainingjobs.ebbflow.dev.yaml";

/// Errors from generating the CRD document.
#[derive(Debug, thiserror::Error)]
pub enum CrdError {
    /// The CRD could not be serialized to YAML.
    #[error("serialize crd to yaml: {0}")]
    Serialize(#[from] serde_yaml::Error),
    /// The CRD could not be turned into a JSON value.
    #[error("serialize crd to json: {0}")]
    SerializeJson(#[from] serde_json::Error),
}

/// The TrainingJob CustomResourceDefinition, with every rule of [`RULES`] attached as a CEL
/// `x-kubernetes-validations` entry at its scope.
pub fn crd() -> CustomResourceDefinition {
    let mut crd = TrainingJob::crd();
    for version in &mut crd.spec.versions {
        let root = version
            .schema
            .as_mut()
            .and_then(|validation| validation.open_api_v3_schema.as_mut())
            .expect("derived CRD has an openAPIV3Schema");
        tidy_schema(root);
        for rule in RULES {
            let node = schema_node(root, rule.scope).unwrap_or_else(|| {
                panic!(
                    "rule scope {} is not a field of the TrainingJob schema",
                    rule.scope
                )
            });
            node.x_kubernetes_validations
                .get_or_insert_with(Vec::new)
                .push(ValidationRule {
                    rule: rule.cel.to_owned(),
                    message: Some(rule.message.to_owned()),
                    field_path: rule.cel_field_path(),
                    reason: Some("FieldValueInvalid".to_owned()),
                    ..ValidationRule::default()
                });
        }
    }
    let hash = schema_hash_of(&crd);
    crd.metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(SCHEMA_ANNOTATION.to_owned(), hash);
    crd
}

/// Annotation on the generated CRD with the hash of its spec ([`schema_hash`]): the operator
/// checks at start that the CRD the API server serves is the one it was built with (Helm never
/// upgrades a chart's CRDs, and an API server silently drops fields its schema lacks).
pub const SCHEMA_ANNOTATION: &str = "ebbflow.dev/schema-hash";

/// The hash of the CRD spec these types generate (FNV-1a of its JSON, keys sorted), as the
/// [`SCHEMA_ANNOTATION`] of [`crd`] carries it.
pub fn schema_hash() -> String {
    crd()
        .metadata
        .annotations
        .and_then(|mut a| a.remove(SCHEMA_ANNOTATION))
        .expect("crd() sets the schema annotation")
}

fn schema_hash_of(crd: &CustomResourceDefinition) -> String {
    let spec = sort_keys(serde_json::to_value(&crd.spec).expect("CRD spec serializes to JSON"));
    format!("{:016x}", fnv1a(&spec.to_string()))
}

/// Makes the derived schema read well in `kubectl explain` and stay within the formats the API
/// server knows: doc comments wrapped at 100 columns become single lines (paragraphs and lists
/// are kept), Quantity's page-long description becomes one line, and schemars' unsigned integer
/// formats (`uint32`, ...) are dropped; their `minimum` bounds stay.
fn tidy_schema(root: &mut JSONSchemaProps) {
    let mut value = serde_json::to_value(&*root).expect("schema serializes to JSON");
    tidy_schema_value(&mut value);
    *root = serde_json::from_value(value).expect("tidied schema deserializes");
}

fn tidy_schema_value(node: &mut serde_json::Value) {
    match node {
        serde_json::Value::Object(map) => {
            if let Some(serde_json::Value::String(description)) = map.get_mut("description") {
                *description = tidy_description(description);
            }
            if map
                .get("format")
                .and_then(serde_json::Value::as_str)
                .is_some_and(|format| format.starts_with("uint"))
            {
                map.remove("format");
            }
            for (keyword, child) in map.iter_mut() {
                if !matches!(keyword.as_str(), "default" | "enum" | "example") {
                    tidy_schema_value(child);
                }
            }
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(tidy_schema_value),
        _ => {}
    }
}

/// Joins hard-wrapped lines; keeps blank lines and lines that start a list item.
fn tidy_description(description: &str) -> String {
    if description.starts_with("Quantity is a fixed-point representation of a number.") {
        return "A quantity: a number with an optional SI or binary suffix, e.g. 500m, 2, 1.5Gi."
            .to_owned();
    }
    let chars: Vec<char> = description.chars().collect();
    let mut tidied = String::with_capacity(description.len());
    for (i, &c) in chars.iter().enumerate() {
        let wraps = c == '\n'
            && i > 0
            && chars[i - 1] != '\n'
            && chars
                .get(i + 1)
                .is_some_and(|next| !matches!(next, '\n' | ' ' | '\t' | '-' | '*'));
        tidied.push(if wraps { ' ' } else { c });
    }
    tidied
}

/// The schema node at a dotted property path (e.g. `spec.transient`).
fn schema_node<'a>(root: &'a mut JSONSchemaProps, path: &str) -> Option<&'a mut JSONSchemaProps> {
    path.split('.').try_fold(root, |node, name| {
        node.properties
            .as_mut()
            .and_then(|properties| properties.get_mut(name))
    })
}

/// The TrainingJob CRD as a YAML document (what `ebbflow crd` prints).
pub fn crd_yaml() -> Result<String, CrdError> {
    // Keys sorted at every level: the output must not depend on whether some other crate in the
    // build turned on serde_json's `preserve_order` (a workspace build does, a package build not).
    let value = sort_keys(serde_json::to_value(crd())?);
    let body = serde_yaml::to_string(&value)?;
    Ok(format!(
        "# Generated from the ebbflow-crds types; do not edit. Regenerate with:\n#   {REGENERATE_COMMAND}\n{body}"
    ))
}

/// `value` with every object's keys in sorted order.
fn sort_keys(value: serde_json::Value) -> serde_json::Value {
    match value {
        serde_json::Value::Object(map) => {
            let mut entries: Vec<(String, serde_json::Value)> = map.into_iter().collect();
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            serde_json::Value::Object(
                entries
                    .into_iter()
                    .map(|(key, value)| (key, sort_keys(value)))
                    .collect(),
            )
        }
        serde_json::Value::Array(items) => {
            serde_json::Value::Array(items.into_iter().map(sort_keys).collect())
        }
        other => other,
    }
}
