//! Cross-field rules of a `TrainingJob` spec, each defined once: its CEL expression (emitted as an
//! `x-kubernetes-validations` entry so the API server enforces it), the message both the API
//! server and [`TrainingJobSpec::validate`] report, and the Rust predicate `ebbflow run` and the
//! operator evaluate. Tests evaluate every CEL expression client-side and check it agrees with its
//! predicate, so the two cannot drift.

use std::fmt;

use crate::spec::{
    AppKind, BiddingStrategy, BillingModel, ConsistencyModel, MarketKind, ProvisioningMode,
    ServerOptimizer, TrainingJobSpec,
};

/// One cross-field rule.
#[derive(Clone, Copy)]
pub struct Rule {
    /// Dotted path of the schema node the CEL rule is attached to (`self` in the expression).
    pub scope: &'static str,
    /// Field the failure is reported at, relative to `scope` (CEL `fieldPath` without the
    /// leading dot); empty for the scope itself.
    pub field: &'static str,
    /// The CEL expression; true means valid.
    pub cel: &'static str,
    /// What is wrong, naming the field(s).
    pub message: &'static str,
    /// The same check in Rust, on a spec with defaults applied; true means valid.
    pub holds: fn(&TrainingJobSpec) -> bool,
}

impl Rule {
    /// The full dotted path the failure is reported at, e.g. `spec.transient.minNodes`.
    pub fn path(&self) -> String {
        if self.field.is_empty() {
            self.scope.to_owned()
        } else {
            format!("{}.{}", self.scope, self.field)
        }
    }

    /// The CEL `fieldPath` (relative JSONPath from the scope), if the rule names a field.
    pub fn cel_field_path(&self) -> Option<String> {
        (!self.field.is_empty()).then(|| format!(".{}", self.field))
    }
}

impl fmt::Debug for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Rule")
            .field("scope", &self.scope)
            .field("field", &self.field)
            .field("cel", &self.cel)
            .field("message", &self.message)
            .finish()
    }
}

/// `module:Class`: a dotted module path and a class name, identifiers both.
fn is_entry(entry: &str) -> bool {
    let identifier = |part: &str, dots: bool| {
        let mut chars = part.chars();
        chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || (dots && c == '.'))
    };
    entry
        .split_once(':')
        .is_some_and(|(module, class)| identifier(module, true) && identifier(class, false))
}

fn is_lda(spec: &TrainingJobSpec) -> bool {
    spec.app.kind == AppKind::Lda
}

/// Every cross-field rule, in the order failures are reported.
pub static RULES: &[Rule] = &[
    // --- app ---------------------------------------------------------------------------------
    Rule {
        scope: "spec.app.dataset",
        field: "",
        cel: "(has(self.synthetic) ? 1 : 0) + (has(self.path) ? 1 : 0) + (has(self.url) ? 1 : 0) == 1",
        message: "spec.app.dataset must set exactly one of synthetic, path or url",
        holds: |s| {
            let d = &s.app.dataset;
            [d.synthetic.is_some(), d.path.is_some(), d.url.is_some()]
                .into_iter()
                .filter(|set| *set)
                .count()
                == 1
        },
    },
    Rule {
        scope: "spec.app.dataset",
        field: "format",
        cel: "has(self.synthetic) ? !has(self.format) : has(self.format)",
        message: "spec.app.dataset.format is required with path or url and not allowed with synthetic",
        holds: |s| {
            let d = &s.app.dataset;
            d.synthetic.is_some() != d.format.is_some()
        },
    },
    Rule {
        scope: "spec.app.dataset",
        field: "claimName",
        cel: "!has(self.claimName) || has(self.path)",
        message: "spec.app.dataset.claimName is only valid with spec.app.dataset.path",
        holds: |s| s.app.dataset.claim_name.is_none() || s.app.dataset.path.is_some(),
    },
    Rule {
        scope: "spec.app",
        field: "dataset.format",
        cel: "!has(self.dataset.format) \
              || (self.kind == 'MatrixFactorization' && self.dataset.format in ['movielens-inter', 'csv']) \
              || (self.kind == 'LogisticRegression' && self.dataset.format in ['libsvm', 'csv']) \
              || (self.kind == 'LDA' && self.dataset.format == 'ldac') \
              || (self.kind == 'Python' && self.dataset.format == 'raw') \
              || self.kind == 'SelfTest'",
        message: "spec.app.dataset.format must suit spec.app.kind: movielens-inter or csv for MatrixFactorization, libsvm or csv for LogisticRegression, ldac for LDA, raw for Python",
        // SelfTest reads no data: the rule of its own says so
        holds: |s| {
            s.app.kind == AppKind::SelfTest
                || s.app
                    .dataset
                    .format
                    .is_none_or(|format| s.app.kind.supported_formats().contains(&format))
        },
    },
    Rule {
        scope: "spec.app",
        field: "dataset.synthetic",
        cel: "self.kind == 'MatrixFactorization' || !has(self.dataset.synthetic) \
              || !(has(self.dataset.synthetic.users) || has(self.dataset.synthetic.items) \
              || has(self.dataset.synthetic.ratings) || has(self.dataset.synthetic.trueRank) \
              || has(self.dataset.synthetic.noise))",
        message: "spec.app.dataset.synthetic users, items, ratings, trueRank and noise are only valid for kind MatrixFactorization",
        holds: |s| {
            s.app.kind == AppKind::MatrixFactorization
                || s.app.dataset.synthetic.as_ref().is_none_or(|d| {
                    d.users.is_none()
                        && d.items.is_none()
                        && d.ratings.is_none()
                        && d.true_rank.is_none()
                        && d.noise.is_none()
                })
        },
    },
    Rule {
        scope: "spec.app",
        field: "dataset.synthetic",
        cel: "self.kind == 'LogisticRegression' || !has(self.dataset.synthetic) \
              || !(has(self.dataset.synthetic.samples) || has(self.dataset.synthetic.features) \
              || has(self.dataset.synthetic.classes))",
        message: "spec.app.dataset.synthetic samples, features and classes are only valid for kind LogisticRegression",
        holds: |s| {
            s.app.kind == AppKind::LogisticRegression
                || s.app.dataset.synthetic.as_ref().is_none_or(|d| {
                    d.samples.is_none() && d.features.is_none() && d.classes.is_none()
                })
        },
    },
    Rule {
        scope: "spec.app",
        field: "dataset.synthetic",
        cel: "self.kind == 'LDA' || !has(self.dataset.synthetic) \
              || !(has(self.dataset.synthetic.documents) || has(self.dataset.synthetic.vocabulary) \
              || has(self.dataset.synthetic.wordsPerDocument) || has(self.dataset.synthetic.trueTopics))",
        message: "spec.app.dataset.synthetic documents, vocabulary, wordsPerDocument and trueTopics are only valid for kind LDA",
        holds: |s| {
            is_lda(s)
                || s.app.dataset.synthetic.as_ref().is_none_or(|d| {
                    d.documents.is_none()
                        && d.vocabulary.is_none()
                        && d.words_per_document.is_none()
                        && d.true_topics.is_none()
                })
        },
    },
    Rule {
        scope: "spec.app",
        field: "hyperparameters.rank",
        cel: "self.kind == 'MatrixFactorization' || !has(self.hyperparameters) || !has(self.hyperparameters.rank)",
        message: "spec.app.hyperparameters.rank is only valid for kind MatrixFactorization",
        holds: |s| {
            s.app.kind == AppKind::MatrixFactorization
                || s.app
                    .hyperparameters
                    .as_ref()
                    .is_none_or(|h| h.rank.is_none())
        },
    },
    Rule {
        scope: "spec.app",
        field: "hyperparameters.adaptiveStep",
        cel: "self.kind == 'MatrixFactorization' || !has(self.hyperparameters) || !has(self.hyperparameters.adaptiveStep)",
        message: "spec.app.hyperparameters.adaptiveStep is only valid for kind MatrixFactorization",
        holds: |s| {
            s.app.kind == AppKind::MatrixFactorization
                || s.app
                    .hyperparameters
                    .as_ref()
                    .is_none_or(|h| h.adaptive_step.is_none())
        },
    },
    Rule {
        scope: "spec.app",
        field: "serverOptimizer",
        cel: "!has(self.hyperparameters) || !has(self.hyperparameters.adaptiveStep) \
              || !self.hyperparameters.adaptiveStep || !has(self.serverOptimizer) || self.serverOptimizer == 'sgd'",
        message: "spec.app.serverOptimizer must be sgd (the default) with hyperparameters.adaptiveStep: each row keeps its sum of squared gradients in the row, and only deltas added as sent keep it a sum",
        holds: |s| {
            let adaptive =
                (s.app.hyperparameters.as_ref()).is_some_and(|h| h.adaptive_step == Some(true));
            !adaptive || matches!(s.app.server_optimizer, None | Some(ServerOptimizer::Sgd))
        },
    },
    Rule {
        scope: "spec.app",
        field: "hyperparameters.batchSize",
        cel: "self.kind == 'LogisticRegression' || !has(self.hyperparameters) || !has(self.hyperparameters.batchSize)",
        message: "spec.app.hyperparameters.batchSize is only valid for kind LogisticRegression",
        holds: |s| {
            s.app.kind == AppKind::LogisticRegression
                || s.app
                    .hyperparameters
                    .as_ref()
                    .is_none_or(|h| h.batch_size.is_none())
        },
    },
    Rule {
        scope: "spec.app",
        field: "hyperparameters",
        cel: "self.kind == 'LDA' || !has(self.hyperparameters) \
              || !(has(self.hyperparameters.topics) || has(self.hyperparameters.alpha) || has(self.hyperparameters.beta))",
        message: "spec.app.hyperparameters topics, alpha and beta are only valid for kind LDA",
        holds: |s| {
            is_lda(s)
                || s.app
                    .hyperparameters
                    .as_ref()
                    .is_none_or(|h| h.topics.is_none() && h.alpha.is_none() && h.beta.is_none())
        },
    },
    Rule {
        scope: "spec.app",
        field: "hyperparameters",
        cel: "self.kind != 'LDA' || !has(self.hyperparameters) \
              || !(has(self.hyperparameters.learningRate) || has(self.hyperparameters.regularization))",
        message: "spec.app.hyperparameters learningRate and regularization are not valid for kind LDA",
        holds: |s| {
            !is_lda(s)
                || s.app
                    .hyperparameters
                    .as_ref()
                    .is_none_or(|h| h.learning_rate.is_none() && h.regularization.is_none())
        },
    },
    Rule {
        scope: "spec.app",
        field: "serverOptimizer",
        cel: "self.kind != 'LDA' || !has(self.serverOptimizer)",
        message: "spec.app.serverOptimizer is not valid for kind LDA",
        holds: |s| !is_lda(s) || s.app.server_optimizer.is_none(),
    },
    Rule {
        scope: "spec.app",
        field: "python",
        cel: "(self.kind == 'Python') == has(self.python)",
        message: "spec.app.python is required for kind Python and only valid for it",
        holds: |s| (s.app.kind == AppKind::Python) == s.app.python.is_some(),
    },
    Rule {
        scope: "spec.app",
        field: "python.entry",
        cel: "!has(self.python) || self.python.entry.matches('^[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_]*$')",
        message: "spec.app.python.entry must be module:Class, e.g. mf_numpy:App",
        holds: |s| s.app.python.as_ref().is_none_or(|p| is_entry(&p.entry)),
    },
    Rule {
        scope: "spec.app",
        field: "dataset.synthetic",
        cel: "self.kind != 'Python' || !has(self.dataset.synthetic)",
        message: "spec.app.dataset.synthetic is not valid for kind Python: its code reads its own data (set path or url with format raw)",
        holds: |s| s.app.kind != AppKind::Python || s.app.dataset.synthetic.is_none(),
    },
    Rule {
        scope: "spec.app",
        field: "hyperparameters",
        cel: "self.kind != 'Python' || !has(self.hyperparameters)",
        message: "spec.app.hyperparameters is not valid for kind Python: pass spec.app.python.args",
        holds: |s| s.app.kind != AppKind::Python || s.app.hyperparameters.is_none(),
    },
    Rule {
        scope: "spec.app",
        field: "dataset.synthetic",
        cel: "self.kind != 'SelfTest' || has(self.dataset.synthetic)",
        message: "spec.app.dataset.synthetic is required for kind SelfTest: its table is generated (e.g. synthetic: {seed: 1})",
        holds: |s| s.app.kind != AppKind::SelfTest || s.app.dataset.synthetic.is_some(),
    },
    Rule {
        scope: "spec.app",
        field: "hyperparameters",
        cel: "self.kind != 'SelfTest' || (!has(self.hyperparameters) && !has(self.serverOptimizer))",
        message: "spec.app.hyperparameters and serverOptimizer are not valid for kind SelfTest: its updates are exact integer sums",
        holds: |s| {
            s.app.kind != AppKind::SelfTest
                || (s.app.hyperparameters.is_none() && s.app.server_optimizer.is_none())
        },
    },
    // --- consistency, stop -------------------------------------------------------------------
    Rule {
        scope: "spec.consistency",
        field: "staleness",
        cel: "self.model == 'SSP' || !has(self.staleness) || self.staleness == 0",
        message: "spec.consistency.staleness is only allowed with model SSP",
        holds: |s| {
            s.consistency.model == ConsistencyModel::Ssp
                || s.consistency.staleness.is_none_or(|st| st == 0)
        },
    },
    Rule {
        scope: "spec.consistency",
        field: "staleness",
        cel: "self.model != 'SSP' || (has(self.staleness) && self.staleness >= 1)",
        message: "spec.consistency.staleness must be set to at least 1 when model is SSP",
        holds: |s| {
            s.consistency.model != ConsistencyModel::Ssp
                || s.consistency.staleness.is_some_and(|st| st >= 1)
        },
    },
    Rule {
        scope: "spec.stop",
        field: "",
        cel: "has(self.iterations) || has(self.targetLoss) || has(self.wallClockLimit)",
        message: "spec.stop must set at least one of iterations, targetLoss or wallClockLimit",
        holds: |s| {
            s.stop.iterations.is_some()
                || s.stop.target_loss.is_some()
                || s.stop.wall_clock_limit.is_some()
        },
    },
    // --- tiers, elasticity -------------------------------------------------------------------
    Rule {
        scope: "spec.transient",
        field: "minNodes",
        cel: "self.minNodes <= self.maxNodes",
        message: "spec.transient.minNodes must be less than or equal to spec.transient.maxNodes",
        holds: |s| s.transient.min_nodes <= s.transient.max_nodes,
    },
    Rule {
        scope: "spec.elasticity",
        field: "stage3Ratio",
        cel: "self.stage2Ratio < self.stage3Ratio",
        message: "spec.elasticity.stage3Ratio must be greater than spec.elasticity.stage2Ratio",
        holds: |s| s.elasticity.stage2_ratio < s.elasticity.stage3_ratio,
    },
    // --- bidding -----------------------------------------------------------------------------
    Rule {
        scope: "spec.bidding",
        field: "budgetPerHour",
        cel: "!has(self.budgetPerHour) || self.budgetPerHour > 0.0",
        message: "spec.bidding.budgetPerHour must be greater than 0",
        holds: |s| s.bidding.budget_per_hour.is_none_or(|b| b > 0.0),
    },
    Rule {
        scope: "spec.bidding",
        field: "budgetTotal",
        cel: "!has(self.budgetTotal) || self.budgetTotal > 0.0",
        message: "spec.bidding.budgetTotal must be greater than 0",
        holds: |s| s.bidding.budget_total.is_none_or(|b| b > 0.0),
    },
    Rule {
        scope: "spec.bidding",
        field: "maxPrice",
        cel: "!has(self.maxPrice) || self.maxPrice > 0.0",
        message: "spec.bidding.maxPrice must be greater than 0",
        holds: |s| s.bidding.max_price.is_none_or(|p| p > 0.0),
    },
    Rule {
        scope: "spec.bidding",
        field: "maxPrice",
        cel: "self.strategy != 'OnDemandOnly' || !has(self.maxPrice)",
        message: "spec.bidding.maxPrice is not valid with strategy OnDemandOnly",
        holds: |s| {
            s.bidding.strategy != BiddingStrategy::OnDemandOnly || s.bidding.max_price.is_none()
        },
    },
    Rule {
        scope: "spec.bidding",
        field: "decisionInterval",
        cel: "duration(self.decisionInterval) >= duration('10s')",
        message: "spec.bidding.decisionInterval must be at least 10s",
        holds: |s| {
            s.bidding
                .decision_interval
                .to_duration()
                .is_some_and(|d| d >= std::time::Duration::from_secs(10))
        },
    },
    Rule {
        scope: "spec.bidding",
        field: "deadline",
        cel: "!has(self.deadline) || duration(self.deadline) > duration(self.decisionInterval)",
        message: "spec.bidding.deadline must be longer than spec.bidding.decisionInterval",
        holds: |s| {
            let Some(deadline) = &s.bidding.deadline else {
                return true;
            };
            match (
                deadline.to_duration(),
                s.bidding.decision_interval.to_duration(),
            ) {
                (Some(deadline), Some(interval)) => deadline > interval,
                _ => false,
            }
        },
    },
    Rule {
        scope: "spec.bidding",
        field: "billingModel",
        cel: "self.market.kind == 'trace' \
              || (self.market.kind == 'ec2' && self.billingModel == 'aws') \
              || (self.market.kind == 'gcp' && self.billingModel == 'gcp')",
        message: "spec.bidding.billingModel must be aws for market kind ec2 and gcp for market kind gcp",
        holds: |s| match s.bidding.market.kind {
            MarketKind::Trace => true,
            MarketKind::Ec2 => s.bidding.billing_model == BillingModel::Aws,
            MarketKind::Gcp => s.bidding.billing_model == BillingModel::Gcp,
        },
    },
    Rule {
        scope: "spec.bidding.market",
        field: "trace",
        cel: "self.kind != 'trace' || has(self.trace)",
        message: "spec.bidding.market.trace is required when kind is trace",
        holds: |s| s.bidding.market.kind != MarketKind::Trace || s.bidding.market.trace.is_some(),
    },
    Rule {
        scope: "spec.bidding.market",
        field: "trace",
        cel: "self.kind == 'trace' || !(has(self.trace) || has(self.traceStart))",
        message: "spec.bidding.market.trace and traceStart are only valid when kind is trace",
        holds: |s| {
            let market = &s.bidding.market;
            market.kind == MarketKind::Trace
                || (market.trace.is_none() && market.trace_start.is_none())
        },
    },
    Rule {
        scope: "spec.bidding.market",
        field: "region",
        cel: "self.kind == 'trace' || has(self.region)",
        message: "spec.bidding.market.region is required when kind is ec2 or gcp",
        holds: |s| s.bidding.market.kind == MarketKind::Trace || s.bidding.market.region.is_some(),
    },
    // --- provisioning ------------------------------------------------------------------------
    Rule {
        scope: "spec.provisioning",
        field: "ec2",
        cel: "self.mode != 'ec2' || has(self.ec2)",
        message: "spec.provisioning.ec2 is required when mode is ec2",
        holds: |s| s.provisioning.mode != ProvisioningMode::Ec2 || s.provisioning.ec2.is_some(),
    },
    Rule {
        scope: "spec.provisioning",
        field: "ec2",
        cel: "self.mode == 'ec2' || !has(self.ec2)",
        message: "spec.provisioning.ec2 is only valid when mode is ec2",
        holds: |s| s.provisioning.mode == ProvisioningMode::Ec2 || s.provisioning.ec2.is_none(),
    },
    Rule {
        scope: "spec.provisioning.ec2",
        field: "",
        cel: "has(self.launchTemplate) || has(self.imageId)",
        message: "spec.provisioning.ec2 must set launchTemplate or imageId",
        holds: |s| {
            s.provisioning
                .ec2
                .as_ref()
                .is_none_or(|ec2| ec2.launch_template.is_some() || ec2.image_id.is_some())
        },
    },
    Rule {
        scope: "spec",
        field: "runtime.threadsPerWorker",
        cel: "self.app.kind == 'MatrixFactorization' || !has(self.runtime) || !has(self.runtime.threadsPerWorker)",
        message: "spec.runtime.threadsPerWorker is only valid for spec.app.kind MatrixFactorization",
        holds: |s| {
            s.app.kind == AppKind::MatrixFactorization || s.runtime.threads_per_worker.is_none()
        },
    },
    Rule {
        scope: "spec",
        field: "provisioning.mode",
        cel: "self.provisioning.mode != 'ec2' || self.bidding.market.kind == 'ec2'",
        message: "spec.provisioning.mode ec2 requires spec.bidding.market.kind ec2",
        holds: |s| {
            s.provisioning.mode != ProvisioningMode::Ec2 || s.bidding.market.kind == MarketKind::Ec2
        },
    },
];

/// A rule that a spec breaks, reported at a field path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldError {
    /// Dotted field path, e.g. `spec.transient.minNodes` or `spec.reliable.tolerations[0].effect`.
    pub field: String,
    /// What is wrong, in the API server's words, e.g. `Required value`.
    pub detail: String,
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.detail)
    }
}

impl FieldError {
    /// The error the API server (Kubernetes 1.35) reports when `rule` fails:
    /// `<path>: Invalid value: <message>`.
    pub fn from_rule(rule: &Rule) -> Self {
        Self {
            field: rule.path(),
            detail: format!("Invalid value: {}", rule.message),
        }
    }
}

/// The cross-field rules a spec breaks.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{}", join_errors(.0))]
pub struct InvalidSpec(pub Vec<FieldError>);

/// `a` alone, or `[a, b, ...]` as the API server aggregates field errors.
pub(crate) fn join_errors(errors: &[FieldError]) -> String {
    match errors {
        [single] => single.to_string(),
        many => {
            let joined: Vec<String> = many.iter().map(ToString::to_string).collect();
            format!("[{}]", joined.join(", "))
        }
    }
}

impl TrainingJobSpec {
    /// Checks every cross-field rule in [`RULES`] (schema bounds are the API server's job, or
    /// [`crate::parse_manifest`]'s outside a cluster).
    pub fn validate(&self) -> Result<(), InvalidSpec> {
        let errors: Vec<FieldError> = self.broken_rules().map(FieldError::from_rule).collect();
        if errors.is_empty() {
            Ok(())
        } else {
            Err(InvalidSpec(errors))
        }
    }

    /// The rules this spec breaks, in [`RULES`] order.
    pub fn broken_rules(&self) -> impl Iterator<Item = &'static Rule> + '_ {
        RULES.iter().filter(move |rule| !(rule.holds)(self))
    }
}
