//! Multinomial logistic regression (softmax) by mini-batch SGD with L2 regularisation.
//!
//! Table [`WEIGHTS`]: one row per class of width `features + 1` (the weights, then the bias). A
//! clock is one pass over the worker's examples in a seeded per-clock shuffled order, in
//! mini-batches; the learning rate decays geometrically per clock. Test quality: accuracy and mean
//! cross-entropy.

use std::sync::Arc;

use crate::app::{
    App, AppWorker, ClockStats, EvalReport, RowCache, RowInit, TableId, TableReader, TableSpec,
    WorkingSet,
};
use crate::data::{Examples, Rng};

use super::{AppsError, BareWorker, RowStore};

/// Table of per-class weight rows (weights, then bias).
pub const WEIGHTS: TableId = 0;

/// Hyperparameters of multinomial logistic regression.
#[derive(Debug, Clone, PartialEq)]
pub struct MlrConfig {
    /// Learning rate of the first clock.
    pub learning_rate: f32,
    /// Per-clock multiplicative learning-rate decay (1 = constant).
    pub decay: f32,
    /// L2 regularisation of the weights (not the biases).
    pub regularization: f32,
    /// Examples per mini-batch.
    pub batch_size: usize,
    /// Seed of the per-clock example order.
    pub seed: u64,
}

impl Default for MlrConfig {
    fn default() -> Self {
        Self {
            learning_rate: 0.5,
            decay: 0.95,
            regularization: 1e-4,
            batch_size: 8,
            seed: 1,
        }
    }
}

/// Softmax regression over a training and a test set.
#[derive(Debug, Clone)]
pub struct MlrApp {
    config: MlrConfig,
    train: Arc<Examples>,
    test: Arc<Examples>,
}

impl MlrApp {
    /// Builds the app; train and test must agree on features and classes.
    pub fn new(train: Examples, test: Examples, config: MlrConfig) -> Result<Self, AppsError> {
        if config.batch_size == 0 || !(config.learning_rate > 0.0 && config.decay > 0.0) {
            return Err(AppsError::Config {
                app: "mlr",
                what: format!("batch size, learning rate and decay must be > 0, got {config:?}"),
            });
        }
        if train.is_empty()
            || train.num_features != test.num_features
            || train.num_classes < test.num_classes
            || train.num_classes < 2
        {
            return Err(AppsError::Data {
                app: "mlr",
                what: format!(
                    "need a non-empty training set with >= 2 classes and a test set of the same \
                     shape (train {} x {} features, {} classes; test {} features, {} classes)",
                    train.len(),
                    train.num_features,
                    train.num_classes,
                    test.num_features,
                    test.num_classes
                ),
            });
        }
        Ok(Self {
            config,
            train: Arc::new(train),
            test: Arc::new(test),
        })
    }

    /// Number of training examples (updates per clock over all workers).
    pub fn train_len(&self) -> usize {
        self.train.len()
    }

    /// The configuration.
    pub fn config(&self) -> &MlrConfig {
        &self.config
    }
}

/// Softmax probabilities of `x` into `probs`; returns the log of the normaliser minus the max
/// logit's contribution, i.e. `-ln p(label)` for `label`.
#[inline]
fn softmax(
    x: &[f32],
    weights: &[f32],
    rows: &[usize],
    width: usize,
    label: usize,
    probs: &mut [f32],
) -> f32 {
    let features = width - 1;
    let mut max = f32::NEG_INFINITY;
    for (class, &row) in rows.iter().enumerate() {
        let w = &weights[row..row + width];
        let mut logit = w[features];
        for (a, b) in w[..features].iter().zip(x) {
            logit += a * b;
        }
        probs[class] = logit;
        max = max.max(logit);
    }
    let label_logit = probs[label];
    let mut sum = 0.0;
    for p in probs.iter_mut() {
        *p = (*p - max).exp();
        sum += *p;
    }
    let inverse = 1.0 / sum;
    probs.iter_mut().for_each(|p| *p *= inverse);
    sum.ln() - (label_logit - max)
}

/// Scratch space for [`sgd_pass`].
#[derive(Debug, Clone)]
struct Scratch {
    gradient: Vec<f32>,
    probs: Vec<f32>,
}

/// One pass of mini-batch SGD over `examples` in `order`; `rows[c]` is the offset of class `c`'s
/// row in `weights`. Returns the summed cross-entropy seen before each update.
#[allow(clippy::too_many_arguments)]
fn sgd_pass(
    examples: &Examples,
    order: &[u32],
    weights: &mut [f32],
    rows: &[usize],
    width: usize,
    config: &MlrConfig,
    learning_rate: f32,
    scratch: &mut Scratch,
) -> f64 {
    let features = width - 1;
    let mut loss = 0.0f64;
    for batch in order.chunks(config.batch_size) {
        scratch.gradient.fill(0.0);
        for &index in batch {
            let x = examples.row(index as usize);
            let label = examples.labels[index as usize] as usize;
            loss += f64::from(softmax(x, weights, rows, width, label, &mut scratch.probs));
            for (class, &p) in scratch.probs.iter().enumerate() {
                let g = p - f32::from(u8::from(class == label));
                let grad = &mut scratch.gradient[class * width..][..width];
                for (acc, v) in grad[..features].iter_mut().zip(x) {
                    *acc += g * v;
                }
                grad[features] += g;
            }
        }
        let step = learning_rate / batch.len() as f32;
        let shrink = 1.0 - learning_rate * config.regularization;
        for (class, &row) in rows.iter().enumerate() {
            let w = &mut weights[row..row + width];
            let grad = &scratch.gradient[class * width..][..width];
            for (value, g) in w[..features].iter_mut().zip(grad) {
                *value = *value * shrink - step * g;
            }
            w[features] -= step * grad[features];
        }
    }
    loss
}

impl App for MlrApp {
    type Worker = MlrWorker;

    fn tables(&self) -> Vec<TableSpec> {
        vec![TableSpec {
            id: WEIGHTS,
            name: "mlr_weights".into(),
            width: self.train.num_features + 1,
            init: RowInit::Zeros,
        }]
    }

    fn worker(&self, shard: usize, num_shards: usize) -> MlrWorker {
        let indices: Vec<usize> = (shard..self.train.len())
            .step_by(num_shards.max(1))
            .collect();
        let examples = self.train.select(&indices);
        let classes = self.train.num_classes;
        let width = self.train.num_features + 1;
        MlrWorker {
            order: (0..examples.len() as u32).collect(),
            rng: Rng::stream(self.config.seed, shard as u64),
            examples,
            rows: (0..classes).map(|class| class * width).collect(),
            scratch: Scratch {
                gradient: vec![0.0; classes * width],
                probs: vec![0.0; classes],
            },
            config: self.config.clone(),
        }
    }

    fn evaluate(&self, tables: &dyn TableReader) -> EvalReport {
        let width = self.train.num_features + 1;
        let classes = self.train.num_classes;
        let mut weights = vec![0.0f32; classes * width];
        for (class, row) in weights.chunks_exact_mut(width).enumerate() {
            tables.read_row(WEIGHTS, class as u64, row);
        }
        let rows: Vec<usize> = (0..classes).map(|class| class * width).collect();
        let mut probs = vec![0.0f32; classes];
        let (mut correct, mut loss) = (0usize, 0.0f64);
        for index in 0..self.test.len() {
            let label = self.test.labels[index] as usize;
            let x = self.test.row(index);
            loss += f64::from(softmax(x, &weights, &rows, width, label, &mut probs));
            let predicted = probs
                .iter()
                .enumerate()
                .fold((0, f32::NEG_INFINITY), |best, (c, &p)| {
                    if p > best.1 { (c, p) } else { best }
                })
                .0;
            correct += usize::from(predicted == label);
        }
        let count = self.test.len().max(1) as f64;
        EvalReport {
            loss: loss / count,
            metrics: vec![
                ("accuracy".into(), correct as f64 / count),
                ("cross_entropy".into(), loss / count),
            ],
        }
    }
}

/// A worker's shard of examples and its scratch buffers.
#[derive(Debug, Clone)]
pub struct MlrWorker {
    examples: Examples,
    order: Vec<u32>,
    rng: Rng,
    /// Offset of each class's row in the weight table (slot × width, after binding).
    rows: Vec<usize>,
    scratch: Scratch,
    config: MlrConfig,
}

impl MlrWorker {
    fn bind_with(&mut self, slot: impl Fn(u64) -> u32) {
        let width = self.examples.num_features + 1;
        for (class, row) in self.rows.iter_mut().enumerate() {
            *row = slot(class as u64) as usize * width;
        }
    }
}

impl AppWorker for MlrWorker {
    fn working_set(&self) -> WorkingSet {
        let mut set = WorkingSet::new();
        set.add_range(WEIGHTS, self.rows.len() as u64);
        set
    }

    fn bind(&mut self, cache: &RowCache) {
        self.bind_with(|key| {
            cache
                .slot(WEIGHTS, key)
                .expect("the runtime caches every key of the working set")
        });
    }

    fn clock(&mut self, cache: &mut RowCache, clock: u64) -> ClockStats {
        self.clock_on(cache, clock)
    }
}

impl BareWorker for MlrWorker {
    fn bind_dense(&mut self) {
        self.bind_with(|key| key as u32);
    }

    fn clock_on(&mut self, store: &mut dyn RowStore, clock: u64) -> ClockStats {
        let (weights, width) = store.rows_mut(WEIGHTS);
        self.rng.shuffle(&mut self.order);
        let learning_rate = self.config.learning_rate * self.config.decay.powi(clock as i32);
        let loss = sgd_pass(
            &self.examples,
            &self.order,
            weights,
            &self.rows,
            width,
            &self.config,
            learning_rate,
            &mut self.scratch,
        );
        ClockStats {
            updates: self.order.len() as u64,
            loss_sum: loss,
            loss_count: self.order.len() as u64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apps::BareLoop;
    use crate::apps::test_support::data_dir_or_skip;
    use crate::data::{load_digits, synthetic_classification};

    fn train_bare(app: &MlrApp, clocks: u64) -> EvalReport {
        let mut bare = BareLoop::new(app);
        for _ in 0..clocks {
            bare.clock();
        }
        app.evaluate(bare.tables())
    }

    #[test]
    fn separable_synthetic_clusters_are_learned() {
        let data = synthetic_classification(3000, 10, 4, 1.5, 3).unwrap();
        let (train, test) = data.examples.split(0.2, 1).unwrap();
        let config = MlrConfig {
            learning_rate: 0.1,
            ..MlrConfig::default()
        };
        let app = MlrApp::new(train, test, config).unwrap();
        let before = train_bare(&app, 0);
        let after = train_bare(&app, 10);
        assert!(before.metric("accuracy").unwrap() < 0.5, "{before:?}");
        assert!(after.metric("accuracy").unwrap() > 0.9, "{after:?}");
        assert!(after.loss < before.loss);
    }

    #[test]
    fn mismatched_data_is_rejected() {
        let a = synthetic_classification(50, 3, 2, 1.0, 1).unwrap().examples;
        let b = synthetic_classification(50, 4, 2, 1.0, 1).unwrap().examples;
        let error = MlrApp::new(a.clone(), b, MlrConfig::default()).unwrap_err();
        assert_eq!(error.category(), "data");
        let zero_batch = MlrConfig {
            batch_size: 0,
            ..MlrConfig::default()
        };
        assert!(MlrApp::new(a.clone(), a, zero_batch).is_err());
    }

    /// Issue 3 quality bar: digits, seeded 80/20 split, test accuracy >= 0.95.
    #[test]
    fn digits_bare_loop_reaches_accuracy_0_95() {
        let Some(dir) = data_dir_or_skip("digits_bare_loop_reaches_accuracy_0_95") else {
            return;
        };
        let mut digits = load_digits(&dir.join("digits.csv.gz")).unwrap();
        assert_eq!((digits.len(), digits.num_classes), (1797, 10));
        digits.scale(1.0 / 16.0);
        let (train, test) = digits.split(0.2, 42).unwrap();
        let app = MlrApp::new(train, test, MlrConfig::default()).unwrap();
        let report = train_bare(&app, 30);
        let accuracy = report.metric("accuracy").unwrap();
        println!("digits bare loop: test accuracy {accuracy:.4}");
        assert!(accuracy >= 0.95, "{report:?}");
    }
}
