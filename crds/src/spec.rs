//! `TrainingJob.spec`: what to train, how, on which capacity, and at what price.

use std::collections::BTreeMap;

use k8s_openapi::{
    api::core::v1::{ResourceRequirements, Toleration},
    apimachinery::pkg::apis::meta::v1::Time,
};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::{duration::DurationString, status::TrainingJobStatus};

/// Pattern for instance types (`c5.xlarge`, `n2-standard-8`) and zones (`us-east-1a`).
const CLOUD_NAME_PATTERN: &str = r"^[a-z0-9][a-z0-9.\-]*$";

/// Desired state of a TrainingJob: the app, when to stop, both tiers' capacity, how to bid for
/// the transient tier, elasticity, provisioning and runtime settings.
// Several printer columns share a `type_`, which clippy mistakes for a repeated attribute.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "ebbflow.dev",
    version = "v1alpha1",
    kind = "TrainingJob",
    plural = "trainingjobs",
    singular = "trainingjob",
    shortname = "tj",
    category = "ebbflow",
    namespaced,
    status = "TrainingJobStatus",
    derive = "PartialEq",
    doc = "TrainingJob trains a model on a reliable tier of on-demand nodes plus an elastic tier of spot (transient) nodes, bidding for the transient tier to minimise cost per unit of work.",
    printcolumn(
        name = "Phase",
        type_ = "string",
        json_path = ".status.phase",
        description = "Lifecycle phase"
    ),
    printcolumn(
        name = "Stage",
        type_ = "integer",
        json_path = ".status.stage",
        description = "AgileML stage (1, 2 or 3)"
    ),
    printcolumn(
        name = "Iteration",
        type_ = "integer",
        json_path = ".status.iteration",
        description = "Completed iterations (clocks)"
    ),
    printcolumn(
        name = "Loss",
        type_ = "number",
        json_path = ".status.loss",
        description = "Most recent training loss"
    ),
    printcolumn(
        name = "Nodes",
        type_ = "integer",
        json_path = ".status.nodes.total",
        description = "Running nodes, both tiers"
    ),
    printcolumn(
        name = "Cost",
        type_ = "number",
        json_path = ".status.cost.spent",
        description = "USD spent so far"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct TrainingJobSpec {
    /// The application to train: model kind, dataset and hyperparameters.
    pub app: AppSpec,

    /// Consistency model of parameter reads: BSP, or SSP with a staleness bound.
    #[serde(default)]
    pub consistency: ConsistencySpec,

    /// When training stops; at least one criterion must be set, the first one met wins.
    pub stop: StopSpec,

    /// The reliable tier: on-demand nodes that hold ParamServ/BackupPS state and are never
    /// bid away.
    #[serde(default)]
    pub reliable: ReliableTierSpec,

    /// The transient tier: spot (revocable) nodes the bidder adds and releases.
    #[serde(default)]
    pub transient: TransientTierSpec,

    /// How transient capacity is bought: strategy, market, billing model, budget and deadline.
    pub bidding: BiddingSpec,

    /// AgileML elasticity: stage thresholds, partition count, backup flush interval.
    #[serde(default)]
    pub elasticity: ElasticitySpec,

    /// How nodes come to exist: pods on an autoscaled cluster, or EC2 instances the operator
    /// launches itself.
    #[serde(default)]
    pub provisioning: ProvisioningSpec,

    /// Runtime container image and per-node resources.
    #[serde(default)]
    pub runtime: RuntimeSpec,

    /// Suspends the job: all nodes are released, state is kept on the reliable tier's backups,
    /// and training resumes from it when set back to false.
    #[serde(default)]
    pub suspend: bool,
}

// ---------------------------------------------------------------------------------------------
// app

/// The application to train.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AppSpec {
    /// Model to train: MatrixFactorization (SGD), LogisticRegression (multinomial, SGD), LDA
    /// (collapsed Gibbs sampling), or Python (your own model, written with the Python SDK: set
    /// python).
    pub kind: AppKind,

    /// Your own model (kind Python): the class the runtime calls, its arguments and where its
    /// code is. Required for kind Python, not allowed otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub python: Option<PythonApp>,

    /// Where the training data comes from and how it is encoded.
    pub dataset: DatasetSpec,

    /// Model hyperparameters; every field is optional and defaults per app kind.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hyperparameters: Option<Hyperparameters>,

    /// How servers apply worker deltas (see [`ServerOptimizer`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_optimizer: Option<ServerOptimizer>,
}

/// A model written with the Python SDK (docs/python.md): the runtime imports `entry` in every
/// process of the job and calls its hooks.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PythonApp {
    /// The app's class as `module:Class` (e.g. `mf_numpy:App`), imported from the image's
    /// Python path plus path.
    #[schemars(length(min = 3, max = 256))]
    pub entry: String,

    /// Arguments of the class, passed as keyword arguments: `Class(**args)`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::spec::json_object_schema")]
    pub args: Option<serde_json::Map<String, serde_json::Value>>,

    /// Directories put in front of Python's module path (relative ones resolve against the
    /// working directory: the repository root for `ebbflow run` of the examples, the image's
    /// working directory in a pod).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub path: Vec<String>,
}

/// Schema of a free-form JSON object (`x-kubernetes-preserve-unknown-fields`).
pub(crate) fn json_object_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true,
    })
}

/// Model to train: MatrixFactorization (SGD), LogisticRegression (multinomial, SGD), LDA
/// (collapsed Gibbs sampling) or Python (your own model); or SelfTest, which checks the
/// platform: its final table is known exactly, and its loss counts wrong values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum AppKind {
    /// Low-rank factorization of a sparse ratings matrix (SGD).
    MatrixFactorization,
    /// Multinomial logistic regression (SGD).
    LogisticRegression,
    /// Latent Dirichlet allocation topic model (collapsed Gibbs sampling).
    #[serde(rename = "LDA")]
    Lda,
    /// Your own model, written with the Python SDK (spec.app.python).
    Python,
    /// A self-test of the cluster and the runtime, not a model: every worker adds known small
    /// integers to known rows each clock (10 ms of work a clock), so the final table is known
    /// exactly and the job's loss is the number of wrong values: 0 when no update was lost or
    /// doubled through the evictions, failures and rollbacks it went through. Stop it by
    /// spec.stop.iterations (the table is checked against that many clocks); it takes
    /// dataset.synthetic (only its seed) and no hyperparameters.
    SelfTest,
}

impl AppKind {
    /// The name used in manifests and CEL rules.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::MatrixFactorization => "MatrixFactorization",
            Self::LogisticRegression => "LogisticRegression",
            Self::Lda => "LDA",
            Self::Python => "Python",
            Self::SelfTest => "SelfTest",
        }
    }

    /// Dataset formats this app can read.
    pub fn supported_formats(self) -> &'static [DatasetFormat] {
        match self {
            Self::MatrixFactorization => &[DatasetFormat::MovielensInter, DatasetFormat::Csv],
            Self::LogisticRegression => &[DatasetFormat::Libsvm, DatasetFormat::Csv],
            Self::Lda => &[DatasetFormat::Ldac],
            Self::Python => &[DatasetFormat::Raw],
            Self::SelfTest => &[],
        }
    }
}

/// Where the training data comes from. Exactly one of synthetic, path or url must be set.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DatasetSpec {
    /// Generate the data from a seed (reproducible; used by the quickstart and tests). Above
    /// 2,000,000 ratings, MatrixFactorization data comes from a planted low-rank model that each
    /// worker generates for its own shard (unset users and items: the Netflix prize data's);
    /// above 2,000,000 tokens, an LDA corpus comes from a planted LDA model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub synthetic: Option<SyntheticDataset>,

    /// A file every node can read. A relative path is resolved against the dataset root: /data
    /// (where claimName is mounted) in a cluster, the data directory of `ebbflow run`
    /// (EBBFLOW_DATA_DIR, default ~/.cache/ebbflow/data) on one machine. Files ending in .gz are
    /// decompressed while reading.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 4096))]
    pub path: Option<String>,

    /// An http URL each node downloads its data from once (into its /tmp), e.g. a Service in
    /// the cluster; https is not supported (the runtime carries no TLS stack: mount the file
    /// with claimName instead). Files ending in .gz are decompressed while reading.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 4096), pattern(r"^http://"))]
    pub url: Option<String>,

    /// File format; required with path or url, not allowed with synthetic (see
    /// [`DatasetFormat`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<DatasetFormat>,

    /// PersistentVolumeClaim (in the job's namespace) that holds path; mounted read-only at
    /// /data on every node (ignored by `ebbflow run`). Only valid with path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub claim_name: Option<String>,
}

// The enum's doc is what `kubectl explain` shows for the optional `format` field.
/// File format; required with path or url, not allowed with synthetic. movielens-inter:
/// RecBole atomic .inter file (user_id, item_id, rating columns; MatrixFactorization); csv:
/// rows without a header, `user,item,rating[,timestamp]` for MatrixFactorization or
/// `feature,...,feature,label` for LogisticRegression (features scaled into [-1, 1] by the
/// file's largest absolute value); libsvm: `label index:value ...` per line
/// (LogisticRegression); ldac: LDA-C `count word:count ...` per document (LDA).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum DatasetFormat {
    /// RecBole atomic `.inter` file (MovieLens): tab-separated, typed header row.
    #[serde(rename = "movielens-inter")]
    MovielensInter,
    /// Comma-separated rows without a header.
    #[serde(rename = "csv")]
    Csv,
    /// `label index:value ...` per line.
    #[serde(rename = "libsvm")]
    Libsvm,
    /// LDA-C: `count word:count ...` per document.
    #[serde(rename = "ldac")]
    Ldac,
    /// Any file, read by the app's own code (kind Python): its path is the app's
    /// `EBBFLOW_DATASET`.
    #[serde(rename = "raw")]
    Raw,
}

impl DatasetFormat {
    /// The name used in manifests and CEL rules.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::MovielensInter => "movielens-inter",
            Self::Csv => "csv",
            Self::Libsvm => "libsvm",
            Self::Ldac => "ldac",
            Self::Raw => "raw",
        }
    }
}

/// Seeded synthetic data. Size fields apply to one app kind each: users, items, ratings,
/// trueRank and noise to MatrixFactorization; samples, features and classes to
/// LogisticRegression; documents, vocabulary, wordsPerDocument and trueTopics to LDA. Unset
/// sizes take the runtime's small defaults. MatrixFactorization data of more than 2,000,000
/// ratings comes from a planted model that each worker generates for its own shard (unset users
/// and items then default to the Netflix prize data's 480,189 and 17,770, trueRank to 16, noise
/// to 0.1), and an LDA corpus of more than 2,000,000 tokens from a planted model generated in
/// parallel; a size that cannot fit in a node's memory fails the job with the size it needs.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SyntheticDataset {
    /// Random seed; the same seed and sizes give the same data on every machine.
    #[serde(default)]
    pub seed: u32,

    /// MatrixFactorization: rows (users) of the ratings matrix.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100_000_000))]
    pub users: Option<u64>,

    /// MatrixFactorization: columns (items) of the ratings matrix.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100_000_000))]
    pub items: Option<u64>,

    /// MatrixFactorization: observed entries (ratings) drawn from the matrix.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 10_000_000_000u64))]
    pub ratings: Option<u64>,

    /// MatrixFactorization: rank of the hidden model the ratings are drawn from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 4096))]
    pub true_rank: Option<u32>,

    /// MatrixFactorization: standard deviation of Gaussian noise added to each rating.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0, max = 100.0))]
    pub noise: Option<f64>,

    /// LogisticRegression: number of labelled samples.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 10_000_000_000u64))]
    pub samples: Option<u64>,

    /// LogisticRegression: features per sample.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100_000_000))]
    pub features: Option<u64>,

    /// LogisticRegression: number of classes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 2, max = 1_000_000))]
    pub classes: Option<u32>,

    /// LDA: number of documents.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 10_000_000_000u64))]
    pub documents: Option<u64>,

    /// LDA: vocabulary size (distinct words).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100_000_000))]
    pub vocabulary: Option<u64>,

    /// LDA: tokens per document.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1_000_000))]
    pub words_per_document: Option<u32>,

    /// LDA: number of topics in the hidden model the documents are drawn from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100_000))]
    pub true_topics: Option<u32>,
}

/// Model hyperparameters. Each applies to the app kinds named in its description.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Hyperparameters {
    /// MatrixFactorization only: rank of the learned factors (default 32). The initial factors
    /// are normal with standard deviation min(0.1, 1/√rank), LIBMF's scale at high ranks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 4096))]
    pub rank: Option<u32>,

    /// MatrixFactorization only: LIBMF's adaptive step (AdaGrad by row) instead of a rate that
    /// decays 8 % a pass: each user and item steps by learningRate / √G, G the running sum of
    /// its mean squared gradient, from 1. learningRate then defaults to 0.1. It needs fewer
    /// passes at high ranks (BENCHMARKS.md: 3 to LIBMF's 5 at rank 1000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adaptive_step: Option<bool>,

    /// MatrixFactorization and LogisticRegression: SGD step size (default 0.01 for
    /// MatrixFactorization, 0.1 for LogisticRegression).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0, max = 100.0))]
    pub learning_rate: Option<f64>,

    /// MatrixFactorization and LogisticRegression: L2 regularization weight (default 0.05 for
    /// MatrixFactorization, 0.0001 for LogisticRegression).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0, max = 100.0))]
    pub regularization: Option<f64>,

    /// LDA only: number of topics to learn (default 20).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100_000))]
    pub topics: Option<u32>,

    /// LDA only: symmetric document-topic Dirichlet prior (default 0.1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0, max = 1000.0))]
    pub alpha: Option<f64>,

    /// LDA only: symmetric topic-word Dirichlet prior (default 0.01).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0, max = 1000.0))]
    pub beta: Option<f64>,

    /// LogisticRegression only: examples per mini-batch SGD step (default 8). MatrixFactorization
    /// and LDA sweep a worker thread's whole data shard per iteration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100_000_000))]
    pub batch_size: Option<u32>,
}

// The enum's doc is what `kubectl explain` shows for the optional `serverOptimizer` field.
/// How ParamServs/ActivePSs apply worker deltas: sgd (default), momentum or adagrad. Not valid
/// for LDA, whose updates are counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ServerOptimizer {
    /// Add each delta as sent.
    Sgd,
    /// Heavy-ball momentum 0.9 on the server with step 0.1, so a steady delta moves a row as
    /// far as sgd would.
    Momentum,
    /// Per-coordinate AdaGrad steps on the server (0.05 times the delta over the root of the
    /// row's summed squared deltas). On MF it trails sgd (MovieLens 100K test RMSE 0.96 against
    /// 0.94 after 40 iterations).
    Adagrad,
}

// ---------------------------------------------------------------------------------------------
// consistency, stop

/// Consistency model of parameter reads.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConsistencySpec {
    /// BSP (every read sees all updates of previous iterations) or SSP (reads may miss the
    /// last staleness iterations' updates); default BSP.
    #[serde(default)]
    pub model: ConsistencyModel,

    /// SSP only, and required there: how many iterations (clocks) a read may lag; a read at
    /// clock t sees every update up to t - staleness - 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 1000))]
    pub staleness: Option<u32>,
}

impl ConsistencySpec {
    /// The staleness bound in force: 0 for BSP.
    pub fn effective_staleness(&self) -> u32 {
        match self.model {
            ConsistencyModel::Bsp => 0,
            ConsistencyModel::Ssp => self.staleness.unwrap_or(0),
        }
    }
}

/// BSP (bulk synchronous) or SSP (stale synchronous parallel).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "UPPERCASE")]
pub enum ConsistencyModel {
    /// Bulk synchronous parallel: staleness 0.
    #[default]
    Bsp,
    /// Stale synchronous parallel with a staleness bound.
    Ssp,
}

/// When training stops. At least one of iterations, targetLoss or wallClockLimit must be set;
/// the first criterion met stops the job.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StopSpec {
    /// Stop after this many iterations (clocks; one pass of every worker over its shard).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100_000_000))]
    pub iterations: Option<u64>,

    /// Stop once the training loss reported by the coordinator is at or below this value (every
    /// app reports a non-negative loss: RMSE, cross-entropy, negative log-likelihood per token).
    /// The operator checks it on each reconcile, asks the coordinator to stop, and the job
    /// succeeds with reason TargetLossReached once the coordinator has stopped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0, max = 1.0e9))]
    pub target_loss: Option<f64>,

    /// Stop after this much wall-clock time since training started (`status.startTime`; e.g.
    /// 90s, 30m, 6h); the job succeeds with reason WallClockLimitReached.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wall_clock_limit: Option<DurationString>,
}

// ---------------------------------------------------------------------------------------------
// tiers

/// The reliable tier (on-demand capacity).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReliableTierSpec {
    /// Number of reliable nodes (default 1). They host ParamServs/BackupPSs and the coordinator.
    #[serde(default = "default_reliable_count")]
    #[schemars(range(min = 1, max = 64))]
    pub count: u32,

    /// Candidate instance types for reliable nodes, cheapest first; empty lets the operator
    /// choose.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(
        length(max = 32),
        inner(length(min = 1, max = 64), pattern(CLOUD_NAME_PATTERN))
    )]
    pub instance_types: Vec<String>,

    /// Extra node selector for reliable pods, merged over the on-demand capacity-type label.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,

    /// Extra tolerations for reliable pods.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub tolerations: Vec<Toleration>,
}

fn default_reliable_count() -> u32 {
    1
}

impl Default for ReliableTierSpec {
    fn default() -> Self {
        Self {
            count: default_reliable_count(),
            instance_types: Vec::new(),
            node_selector: BTreeMap::new(),
            tolerations: Vec::new(),
        }
    }
}

/// The transient tier (spot capacity).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TransientTierSpec {
    /// Fewest transient nodes the bidder keeps while the market allows (default 0).
    #[serde(default)]
    #[schemars(range(min = 0, max = 1000))]
    pub min_nodes: u32,

    /// Most transient nodes the bidder may hold at once (default 0: reliable tier only).
    #[serde(default)]
    #[schemars(range(min = 0, max = 1000))]
    pub max_nodes: u32,

    /// Candidate instance types for transient nodes; each type × zone is a pool the bidder
    /// prices. Empty lets the market offer every type it knows.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(
        length(max = 32),
        inner(length(min = 1, max = 64), pattern(CLOUD_NAME_PATTERN))
    )]
    pub instance_types: Vec<String>,

    /// Candidate zones (e.g. us-east-1a); empty allows every zone of the market's region.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(
        length(max = 32),
        inner(length(min = 1, max = 64), pattern(CLOUD_NAME_PATTERN))
    )]
    pub zones: Vec<String>,

    /// Extra node selector for transient pods, merged over the spot capacity-type label.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,

    /// Extra tolerations for transient pods (e.g. for a spot-only taint).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub tolerations: Vec<Toleration>,
}

// ---------------------------------------------------------------------------------------------
// bidding

/// How transient capacity is bought.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BiddingSpec {
    /// BidBrain (expected cost per work over pools, default), Standard (bid the on-demand price
    /// for maxNodes in the cheapest pool) or OnDemandOnly (the transient tier runs on
    /// on-demand capacity).
    #[serde(default)]
    pub strategy: BiddingStrategy,

    /// Where prices, pools and eviction notices come from.
    pub market: MarketSpec,

    /// How instances are charged: aws (per second; no charge if EC2 interrupts a spot instance
    /// in its first hour), aws-hourly-2016 (hourly; an evicted partial hour is refunded), gcp
    /// (per second, no refund) or fixed (private cluster, flat price); default aws.
    #[serde(default)]
    pub billing_model: BillingModel,

    /// Spending cap in USD per hour across both tiers; must be > 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0, max = 1_000_000.0))]
    pub budget_per_hour: Option<f64>,

    /// Spending cap in USD for the whole job, both tiers together (`status.cost.spent`). Once it
    /// is spent the bidder releases transient capacity (decision reason BudgetExhausted) and the
    /// job is stopped: the operator asks the coordinator to stop and the job fails with reason
    /// BudgetExhausted (`ebbflow run`: summary stop_reason budgetTotal). Must be > 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0, max = 100_000_000.0))]
    pub budget_total: Option<f64>,

    /// Finish within this long after the job starts (e.g. 6h); the bidder buys enough capacity
    /// to meet it. Must be longer than decisionInterval.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline: Option<DurationString>,

    /// How often the bidder reconsiders allocations besides after evictions and before billing
    /// boundaries (default 2m, at least 10s).
    #[serde(default = "default_decision_interval")]
    pub decision_interval: DurationString,

    /// Highest price in USD per instance-hour ever bid for a spot instance; must be > 0. Not
    /// valid with strategy OnDemandOnly.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0, max = 1_000_000.0))]
    pub max_price: Option<f64>,

    /// Starting values for BidBrain's application terms, re-estimated online from runtime
    /// metrics.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overrides: Option<ApplicationTerms>,
}

/// The default bidder decision interval, as in Proteus.
pub const DEFAULT_DECISION_INTERVAL: &str = "2m";

fn default_decision_interval() -> DurationString {
    DurationString::new(DEFAULT_DECISION_INTERVAL).expect("default decision interval parses")
}

/// BidBrain, Standard or OnDemandOnly.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum BiddingStrategy {
    /// Expected cost per work over candidate pools, with eviction probabilities (Proteus).
    #[default]
    BidBrain,
    /// Bid the on-demand price for maxNodes instances in the cheapest pool.
    Standard,
    /// Buy only on-demand capacity for both tiers.
    OnDemandOnly,
}

/// A source of prices, pools and eviction notices.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MarketSpec {
    /// trace (replay a recorded price/availability CSV), ec2 (live EC2 spot market) or gcp
    /// (live GCP spot prices).
    pub kind: MarketKind,

    /// trace only, and required there: path of the trace CSV (e.g. a file of shared/data/spot);
    /// a relative path is resolved against the working directory of the operator or of
    /// `ebbflow run`/`simulate`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 4096))]
    pub trace: Option<String>,

    /// trace only: replay from this instant of the trace (RFC 3339); default its first row.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_start: Option<Time>,

    /// ec2 and gcp, and required there: the cloud region (e.g. us-east-1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 64), pattern(CLOUD_NAME_PATTERN))]
    pub region: Option<String>,

    /// On-demand price in USD per instance-hour used for the reliable tier and for the
    /// on-demand-equivalent cost; default the market's own on-demand price list.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0, max = 1_000_000.0))]
    pub on_demand_price: Option<f64>,
}

/// trace, ec2 or gcp.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum MarketKind {
    /// Replay a recorded trace.
    Trace,
    /// Live EC2 spot market.
    Ec2,
    /// Live GCP spot prices.
    Gcp,
}

impl MarketKind {
    /// The name used in manifests and CEL rules.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Trace => "trace",
            Self::Ec2 => "ec2",
            Self::Gcp => "gcp",
        }
    }
}

/// aws, aws-hourly-2016, gcp or fixed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum BillingModel {
    /// Per second; an EC2-interrupted Linux spot instance is free in its first hour.
    #[default]
    #[serde(rename = "aws")]
    Aws,
    /// Hourly; the partial hour of an evicted spot instance is refunded (the Proteus setting).
    #[serde(rename = "aws-hourly-2016")]
    AwsHourly2016,
    /// Per second, no refund.
    #[serde(rename = "gcp")]
    Gcp,
    /// Flat price per instance-hour (private clusters).
    #[serde(rename = "fixed")]
    Fixed,
}

impl BillingModel {
    /// The name used in manifests and CEL rules.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Aws => "aws",
            Self::AwsHourly2016 => "aws-hourly-2016",
            Self::Gcp => "gcp",
            Self::Fixed => "fixed",
        }
    }
}

/// Starting values for BidBrain's application terms (seed 003, table 4.2).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ApplicationTerms {
    /// φ: scaling efficiency, the fraction of an added node's work that turns into progress
    /// (0 < φ ≤ 1; default 0.9).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.01, max = 1.0))]
    pub phi: Option<f64>,

    /// σ: seconds without progress after adding or removing nodes (default 60).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0, max = 86_400.0))]
    pub sigma: Option<f64>,

    /// λ: seconds without progress after an eviction (default 120).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0, max = 86_400.0))]
    pub lambda: Option<f64>,

    /// ν: work per vCPU-second; an instance's ν is this times its vCPUs (default 1, as in
    /// Proteus).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.000001, max = 1_000_000.0))]
    pub nu: Option<f64>,

    /// Measured relative throughput by transient:reliable node ratio (a calibration: the
    /// `throughput ÷ 0:1` column `ebbflow-elastic-bench --stages` prints, or the file its
    /// `--calibration-out` writes). Replaces φ and the stage-3 rule; linear between points,
    /// clamped outside. Needs a point at ratio 0 (reliable only) and distinct ratios.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 32))]
    pub throughput: Option<Vec<ThroughputPoint>>,
}

/// One measured point of a throughput table: a ratio and the throughput there.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ThroughputPoint {
    /// Transient nodes per reliable node (0: reliable only).
    #[schemars(range(min = 0.0, max = 1000.0))]
    pub ratio: f64,
    /// The cluster's throughput per node at this ratio, relative to reliable only (ratio 0).
    #[schemars(range(min = 0.000001, max = 100.0))]
    pub relative: f64,
}

// ---------------------------------------------------------------------------------------------
// elasticity, provisioning, runtime

/// AgileML elasticity settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ElasticitySpec {
    /// Stage 2 (ActivePSs on transient nodes, BackupPSs on reliable) starts when the
    /// transient:reliable node ratio exceeds this (default 1).
    #[serde(default = "default_stage2_ratio")]
    #[schemars(range(min = 0.0, max = 1000.0))]
    pub stage2_ratio: f64,

    /// Stage 3 (as stage 2, with no workers on reliable nodes) starts when the
    /// transient:reliable ratio exceeds this (default 15). Must be greater than stage2Ratio.
    #[serde(default = "default_stage3_ratio")]
    #[schemars(range(min = 0.0, max = 1000.0))]
    pub stage3_ratio: f64,

    /// Number of parameter partitions, fixed for the job's life (default half of
    /// reliable.count + transient.maxNodes, at least 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 4096))]
    pub partitions: Option<u32>,

    /// How often ActivePSs send their BackupPSs coalesced deltas (the rows changed since the
    /// last copy), e.g. 5s: converted to iterations at the measured time per iteration. A
    /// failure without notice redoes at most this much work. Default: every 5 iterations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup_flush_interval: Option<DurationString>,

    /// Cap on the ActivePS → BackupPS copy traffic of the whole job, in megabits per second:
    /// copies are then spaced further apart than backupFlushInterval when the last ones, at
    /// the measured time per iteration, would send more (each coalesced delta then covers more
    /// iterations, and a failure without notice may redo more work). Default: no cap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.001, max = 1_000_000.0))]
    pub backup_bandwidth_mbps: Option<f64>,
}

/// The Proteus stage-2 threshold on the transient:reliable ratio.
pub const DEFAULT_STAGE2_RATIO: f64 = 1.0;
/// The Proteus stage-3 threshold on the transient:reliable ratio.
pub const DEFAULT_STAGE3_RATIO: f64 = 15.0;

fn default_stage2_ratio() -> f64 {
    DEFAULT_STAGE2_RATIO
}

fn default_stage3_ratio() -> f64 {
    DEFAULT_STAGE3_RATIO
}

impl Default for ElasticitySpec {
    fn default() -> Self {
        Self {
            stage2_ratio: DEFAULT_STAGE2_RATIO,
            stage3_ratio: DEFAULT_STAGE3_RATIO,
            partitions: None,
            backup_flush_interval: None,
            backup_bandwidth_mbps: None,
        }
    }
}

/// How nodes come to exist.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProvisioningSpec {
    /// cluster (pods with capacity-type node selectors; the cluster's autoscaler brings nodes,
    /// default) or ec2 (the operator launches and terminates EC2 instances itself).
    #[serde(default)]
    pub mode: ProvisioningMode,

    /// Node label that tells on-demand from spot nodes (cluster mode).
    #[serde(default)]
    pub capacity_type: CapacityTypeLabel,

    /// ec2 mode only, and required there: how to launch instances.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ec2: Option<Ec2Provisioning>,
}

/// cluster or ec2.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ProvisioningMode {
    /// Pods on an autoscaled cluster.
    #[default]
    Cluster,
    /// EC2 instances launched by the operator.
    Ec2,
}

/// The node label that tells on-demand from spot nodes. key, onDemandValue and spotValue
/// override the preset's.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CapacityTypeLabel {
    /// karpenter (karpenter.sh/capacity-type: on-demand|spot, default), eks
    /// (eks.amazonaws.com/capacityType: ON_DEMAND|SPOT) or gke (cloud.google.com/gke-spot:
    /// "true" on spot nodes, absent on on-demand ones).
    #[serde(default)]
    pub preset: CapacityTypePreset,

    /// Label key, overriding the preset's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 316))]
    pub key: Option<String>,

    /// Label value on on-demand nodes, overriding the preset's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 63))]
    pub on_demand_value: Option<String>,

    /// Label value on spot nodes, overriding the preset's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 63))]
    pub spot_value: Option<String>,
}

/// karpenter, eks or gke.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum CapacityTypePreset {
    /// karpenter.sh/capacity-type: on-demand | spot.
    #[default]
    Karpenter,
    /// eks.amazonaws.com/capacityType: ON_DEMAND | SPOT.
    Eks,
    /// cloud.google.com/gke-spot: "true" on spot nodes.
    Gke,
}

/// The resolved capacity-type label: key, value on on-demand nodes (`None`: the label is
/// absent there) and value on spot nodes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResolvedCapacityTypeLabel {
    /// Label key.
    pub key: String,
    /// Value on on-demand nodes; `None` means on-demand nodes lack the label.
    pub on_demand_value: Option<String>,
    /// Value on spot nodes.
    pub spot_value: String,
}

impl CapacityTypeLabel {
    /// The preset with any explicit overrides applied.
    pub fn resolved(&self) -> ResolvedCapacityTypeLabel {
        let (key, on_demand, spot) = match self.preset {
            CapacityTypePreset::Karpenter => {
                ("karpenter.sh/capacity-type", Some("on-demand"), "spot")
            }
            CapacityTypePreset::Eks => {
                ("eks.amazonaws.com/capacityType", Some("ON_DEMAND"), "SPOT")
            }
            CapacityTypePreset::Gke => ("cloud.google.com/gke-spot", None, "true"),
        };
        ResolvedCapacityTypeLabel {
            key: self.key.clone().unwrap_or_else(|| key.to_owned()),
            on_demand_value: self
                .on_demand_value
                .clone()
                .or_else(|| on_demand.map(str::to_owned)),
            spot_value: self.spot_value.clone().unwrap_or_else(|| spot.to_owned()),
        }
    }
}

/// How the operator launches EC2 instances in ec2 mode.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Ec2Provisioning {
    /// Launch template (name, or id lt-...) whose user data starts the ebbflow runtime; one of
    /// launchTemplate or imageId is required.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 128))]
    pub launch_template: Option<String>,

    /// AMI id (ami-...) with the ebbflow runtime installed, if no launch template is given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 64), pattern(r"^ami-[0-9a-f]+$"))]
    pub image_id: Option<String>,

    /// Subnets to launch into, one per zone used; empty uses the launch template's.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), inner(pattern(r"^subnet-[0-9a-f]+$")))]
    pub subnet_ids: Vec<String>,

    /// Security groups for the instances; empty uses the launch template's.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16), inner(pattern(r"^sg-[0-9a-f]+$")))]
    pub security_group_ids: Vec<String>,

    /// IAM instance profile name for the instances.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 128))]
    pub instance_profile: Option<String>,

    /// Extra tags on every instance, besides the per-job tags the operator always sets.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tags: BTreeMap<String, String>,
}

/// Runtime container and per-node resources.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RuntimeSpec {
    /// ebbflow-runtime container image; default the image the operator was installed with. Its
    /// containers run `ebbflow pod`, so it needs the `ebbflow` binary on its PATH.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 512))]
    pub image: Option<String>,

    /// CPU/memory requests and limits of each node's runtime container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,

    /// Workers per node, each a thread or threadsPerWorker threads (default: one per
    /// requested CPU divided by threadsPerWorker, rounded up, at least 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1024))]
    pub worker_threads: Option<u32>,

    /// MatrixFactorization only: threads each worker's clock runs on (default 1, at most 20).
    /// Its shard is laid out in strata of blocks that share no user and no item, which the
    /// threads update at once without a lock, the same model bit for bit as one thread trains;
    /// a worker of n threads moves one copy of its rows a clock where n workers move n, and
    /// holds one row cache where they hold n.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 20))]
    pub threads_per_worker: Option<u32>,

    /// Seconds a node gets between SIGTERM and SIGKILL to hand its partitions over (default
    /// 120, the EC2 spot notice).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 3600))]
    pub termination_grace_period_seconds: Option<i64>,

    /// Where the coordinator keeps its checkpoint (its newest consistent copy of the
    /// parameters), so that a job whose coordinator pod is lost (its node drained, the pod
    /// evicted) resumes from there instead of from the start. Default: no checkpoint. Ignored
    /// by `ebbflow run`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<CheckpointSpec>,

    /// How the nodes' data-plane connections (parameters, deltas, partition moves) and the
    /// coordinator's admin API are protected: tls (default) or none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transport_security: Option<TransportSecurity>,
}

// The enum's doc is what `kubectl explain` shows for the optional `transportSecurity` field.
/// Transport security of the data plane and the admin API: tls (default: TLS 1.3 keyed by the
/// job's secret, docs/security.md) or none (plain TCP and HTTP; the data-plane handshake still
/// never sends the secret, but parameters, deltas and the admin API's bearer token cross the
/// network in clear).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum TransportSecurity {
    /// TLS 1.3 keyed by the job's secret.
    Tls,
    /// Plain TCP.
    None,
}

/// The coordinator's checkpoint storage.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CheckpointSpec {
    /// PersistentVolumeClaim (in the job's namespace, writable) mounted at /checkpoint on the
    /// coordinator pod; the checkpoint is the file named after the job's uid there.
    #[schemars(length(min = 1, max = 253))]
    pub claim_name: String,

    /// At most one write per this long (e.g. 60s, 10m); default 60s. Each write is the whole
    /// parameter set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval: Option<DurationString>,
}
