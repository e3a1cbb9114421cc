//! Labelled examples from planted Gaussian classes at any size (issue 36: the classification
//! generator at scale).
//!
//! Example `j` of `0..examples` is a pure function of (seed, j): it draws from its own random
//! stream, so any subset is generated without the others, in parallel, straight into its final
//! place (the output is allocated once at its exact size, never held twice). The first
//! [`PlantedExamples::test_len`] examples are the test set, the rest the training set; training
//! example number `g` belongs to worker shard `g mod shards`, so a node generates only the shards
//! it trains and every node agrees on them.

use super::Planted as _;
use super::{DataError, Examples, Rng};

/// Examples per unit of parallel generation.
const EXAMPLES_PER_TASK: usize = 2048;

/// The largest test set [`PlantedExamples::test_fraction_for`] makes, in examples.
pub const MAX_TEST_EXAMPLES: u64 = 100_000;

/// Stream of the class means, apart from every example's.
const MEANS_STREAM: u64 = u64::MAX;

/// A planted classification model: class `c` has mean `μ_c ~ N(0, separation² I)`; an example's
/// class is uniform over `classes` and its features are `μ_c + N(0, I)`. The same model as
/// [`super::synthetic_classification`], drawn per example instead of from one stream.
#[derive(Debug, Clone, PartialEq)]
pub struct PlantedExamples {
    /// Examples in all, test set included.
    pub examples: u64,
    /// Features per example.
    pub features: usize,
    /// Classes (at least 2).
    pub classes: usize,
    /// Standard deviation of the class means (the noise around them is 1).
    pub separation: f64,
    /// Fraction of the examples held out for testing, in `[0, 1)`.
    pub test_fraction: f64,
    /// Seed: the same seed and sizes give the same examples on every machine.
    pub seed: u64,
}

/// One worker shard of the training set (or all of it), and the test set.
#[derive(Debug, Clone, PartialEq)]
pub struct PlantedExampleSplit {
    /// The training examples of the shard, in index order.
    pub train: Examples,
    /// The test examples, in index order.
    pub test: Examples,
}

impl super::Planted for PlantedExamples {
    /// Bytes [`PlantedExamples::generate`] allocates for `shard` of `shards` (the whole training
    /// set for `None`) and the test set: the features and the label of each.
    fn bytes_needed(&self, shard: Option<(usize, usize)>) -> u64 {
        let train = match shard {
            Some((shard, shards)) => self.shard_len(shard, shards),
            None => self.train_len(),
        };
        let example = (self.features as u64).saturating_mul(4).saturating_add(4);
        (train + self.test_len()).saturating_mul(example)
    }

    fn describe(&self) -> String {
        format!(
            "{} planted examples ({} features, {} classes)",
            self.examples, self.features, self.classes
        )
    }

    fn check(&self) -> Result<(), DataError> {
        let valid = self.examples > 0
            && self.features > 0
            && self.classes >= 2
            && self.classes <= u32::MAX as usize
            && self.separation >= 0.0
            && self.separation.is_finite()
            && (0.0..1.0).contains(&self.test_fraction);
        if valid {
            Ok(())
        } else {
            Err(DataError::Parameters {
                what: format!(
                    "planted examples need examples and features > 0, at least 2 classes, a \
                     finite separation >= 0 and a test fraction in [0, 1) (got {self:?})"
                ),
            })
        }
    }
}

impl PlantedExamples {
    /// The test fraction the run paths use: 20% up to 500,000 examples, then
    /// [`MAX_TEST_EXAMPLES`].
    pub fn test_fraction_for(examples: u64) -> f64 {
        (MAX_TEST_EXAMPLES as f64 / examples.max(1) as f64).min(0.2)
    }

    /// Test examples (the first ones).
    pub fn test_len(&self) -> u64 {
        (self.examples as f64 * self.test_fraction).round() as u64
    }

    /// Training examples in all.
    pub fn train_len(&self) -> u64 {
        self.examples - self.test_len()
    }

    /// Training examples of `shard` of `shards`.
    pub fn shard_len(&self, shard: usize, shards: usize) -> u64 {
        super::shard_size(self.train_len(), shard, shards)
    }

    /// Generates the test set and the training examples of `shard` of `shards` (all of them for
    /// `None`) on `threads` threads. Refused, before anything is allocated, when it would need
    /// more than `memory_limit` bytes (see [`super::available_memory`]).
    pub fn generate(
        &self,
        shard: Option<(usize, usize)>,
        threads: usize,
        memory_limit: Option<u64>,
    ) -> Result<PlantedExampleSplit, DataError> {
        self.check_request(shard, memory_limit)?;
        let (shard, shards) = shard.unwrap_or((0, 1));
        let means = self.means();
        let test_len = self.test_len();
        Ok(PlantedExampleSplit {
            train: self.fill(
                &means,
                test_len + shard as u64,
                shards as u64,
                self.shard_len(shard, shards),
                threads,
            ),
            test: self.fill(&means, 0, 1, test_len, threads),
        })
    }

    /// The training examples of `shard` of `shards` alone (what a worker trains on), on
    /// `threads` threads: the same examples as [`PlantedExamples::generate`]'s shard.
    pub fn generate_shard(
        &self,
        shard: usize,
        shards: usize,
        threads: usize,
        memory_limit: Option<u64>,
    ) -> Result<Examples, DataError> {
        self.check_request(Some((shard, shards)), memory_limit)?;
        let first = self.test_len() + shard as u64;
        let count = self.shard_len(shard, shards);
        Ok(self.fill(&self.means(), first, shards as u64, count, threads))
    }

    /// The test set alone, on `threads` threads.
    pub fn generate_test(&self, threads: usize) -> Result<Examples, DataError> {
        self.check()?;
        Ok(self.fill(&self.means(), 0, 1, self.test_len(), threads))
    }

    /// The Bayes-optimal softmax regression of the planted model, in the layout of
    /// [`crate::apps::mlr::WEIGHTS`]: a row per class of `features + 1` values, the weights then
    /// the bias. With uniform classes and unit noise, `ln p(c | x) = μ_c·x − |μ_c|²/2 + const`,
    /// so row `c` is `μ_c` and bias `−|μ_c|²/2`: no classifier does better on this data, and a
    /// linear one can do as well, which makes its test accuracy the bar a benchmark can set.
    pub fn optimal_weights(&self) -> Vec<f32> {
        let means = self.means();
        let mut rows = Vec::with_capacity(self.classes * (self.features + 1));
        for mean in means.chunks_exact(self.features.max(1)) {
            rows.extend_from_slice(mean);
            let norm: f64 = mean.iter().map(|&m| f64::from(m) * f64::from(m)).sum();
            rows.push((-norm / 2.0) as f32);
        }
        rows
    }

    /// The class means, row-major `classes × features`.
    fn means(&self) -> Vec<f32> {
        let mut rng = Rng::stream(self.seed, MEANS_STREAM);
        (0..self.classes * self.features)
            .map(|_| (rng.normal() * self.separation) as f32)
            .collect()
    }

    /// Examples `first, first + step, …` (`count` of them), generated in parallel in place.
    fn fill(&self, means: &[f32], first: u64, step: u64, count: u64, threads: usize) -> Examples {
        let features = self.features;
        let count = count as usize;
        let mut values = vec![0.0f32; count * features];
        let mut labels = vec![0u32; count];
        super::parallel_tasks(
            values
                .chunks_mut(EXAMPLES_PER_TASK * features)
                .zip(labels.chunks_mut(EXAMPLES_PER_TASK))
                .collect(),
            threads,
            || (),
            |task, (values, labels), ()| {
                let start = (task * EXAMPLES_PER_TASK) as u64;
                for (i, (x, label)) in values.chunks_exact_mut(features).zip(labels).enumerate() {
                    let index = first + (start + i as u64) * step;
                    let mut rng = Rng::stream(self.seed, index);
                    let class = rng.below(self.classes as u32);
                    let mean = &means[class as usize * features..][..features];
                    for (value, &m) in x.iter_mut().zip(mean) {
                        *value = m + rng.normal() as f32;
                    }
                    *label = class;
                }
            },
        );
        Examples {
            num_features: features,
            num_classes: self.classes,
            features: values,
            labels,
            class_labels: (0..self.classes as i64).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn source() -> PlantedExamples {
        PlantedExamples {
            examples: 10_001,
            features: 7,
            classes: 3,
            separation: 1.0,
            test_fraction: 0.2,
            seed: 5,
        }
    }

    #[test]
    fn the_same_examples_on_any_thread_count_and_shards_partition_the_training_set() {
        let source = source();
        let whole = source.generate(None, 1, None).unwrap();
        assert_eq!(whole.test.len() as u64, source.test_len());
        assert_eq!(whole.train.len() as u64, source.train_len());
        assert_eq!(whole, source.generate(None, 3, None).unwrap());
        assert_eq!(whole.test, source.generate_test(2).unwrap());
        let shards = 3;
        let mut seen = 0;
        for shard in 0..shards {
            let part = source.generate_shard(shard, shards, 2, None).unwrap();
            assert_eq!(part.len() as u64, source.shard_len(shard, shards));
            assert_eq!(
                part,
                source
                    .generate(Some((shard, shards)), 1, None)
                    .unwrap()
                    .train
            );
            for (i, label) in part.labels.iter().enumerate() {
                let g = shard + i * shards;
                assert_eq!(*label, whole.train.labels[g]);
                assert_eq!(part.row(i), whole.train.row(g));
            }
            seen += part.len();
        }
        assert_eq!(seen, whole.train.len());
        // Every class occurs, and the features centre on their class means.
        let mut counts = [0usize; 3];
        for &label in &whole.train.labels {
            counts[label as usize] += 1;
        }
        assert!(counts.iter().all(|&c| c > 2_000), "{counts:?}");
        let other = PlantedExamples {
            seed: 6,
            ..source.clone()
        };
        assert_ne!(other.generate_test(1).unwrap(), whole.test);
    }

    /// The optimal weights classify as the exact posterior does (each test example's most
    /// likely class under the planted Gaussians), and softmax regression trained by the bare
    /// loop (6 annealed passes) ends within a point of their accuracy, never clearly above it.
    #[test]
    fn the_optimal_weights_are_the_bayes_classifier_and_training_approaches_them() {
        use crate::app::{App, TableReader};
        use crate::apps::{BareLoop, MlrApp, MlrConfig, mlr::WEIGHTS};
        let source = PlantedExamples {
            examples: 40_000,
            features: 10,
            classes: 4,
            separation: 0.5,
            test_fraction: 0.25,
            seed: 9,
        };
        let split = source.generate(None, 2, None).unwrap();
        let (k, f) = (source.classes, source.features);
        let optimal = source.optimal_weights();
        assert_eq!(optimal.len(), k * (f + 1));
        let means = source.means();
        for i in 0..200 {
            let x = split.test.row(i);
            let nearest = (0..k)
                .map(|c| {
                    let d: f64 = (x.iter().zip(&means[c * f..][..f]))
                        .map(|(&a, &m)| f64::from(a - m).powi(2))
                        .sum();
                    (c, d)
                })
                .min_by(|a, b| a.1.total_cmp(&b.1))
                .unwrap()
                .0;
            let best = (0..k)
                .map(|c| {
                    let row = &optimal[c * (f + 1)..][..f + 1];
                    let logit: f32 = x.iter().zip(row).map(|(a, w)| a * w).sum::<f32>() + row[f];
                    (c, logit)
                })
                .max_by(|a, b| a.1.total_cmp(&b.1))
                .unwrap()
                .0;
            assert_eq!(best, nearest, "example {i}");
        }
        let config = MlrConfig {
            learning_rate: 0.5,
            decay: 0.5,
            batch_size: 256,
            ..MlrConfig::default()
        };
        let app = MlrApp::new(split.train, split.test, config).unwrap();
        let mut snapshot = crate::snapshot::ParamSnapshot::new(app.tables());
        snapshot.add_rows(WEIGHTS, &(0..k as u64).collect::<Vec<_>>(), &optimal);
        snapshot.finish();
        let bayes = app.evaluate(&snapshot).metric("accuracy").unwrap();
        assert!(
            (0.5..0.95).contains(&bayes),
            "a task neither trivial nor hopeless: {bayes}"
        );
        let mut bare = BareLoop::new(&app);
        for _ in 0..6 * app.clocks_per_pass(1) {
            bare.clock();
        }
        let tables: &dyn TableReader = bare.tables();
        let trained = app.evaluate(tables).metric("accuracy").unwrap();
        assert!(
            trained > bayes - 0.01 && trained < bayes + 0.005,
            "trained {trained}, Bayes {bayes}"
        );
    }

    #[test]
    fn a_size_that_cannot_fit_is_refused_before_allocation_with_what_it_needs() {
        let huge = PlantedExamples {
            examples: 1 << 40,
            features: 1000,
            ..source()
        };
        let err = huge.generate(Some((0, 4)), 1, Some(1 << 30)).unwrap_err();
        assert_eq!(err.category(), "too_large");
        let text = err.to_string();
        assert!(text.contains("1099511627776 planted examples"), "{text}");
        let err = huge.generate_shard(1, 4, 1, Some(1 << 30)).unwrap_err();
        assert!(err.to_string().contains("shard 1 of 4"), "{err}");
        let bad = PlantedExamples {
            classes: 1,
            ..source()
        };
        assert!(
            bad.generate_test(1)
                .unwrap_err()
                .to_string()
                .contains("at least 2 classes")
        );
        assert!(source().generate_shard(3, 3, 1, None).is_err());
    }
}
