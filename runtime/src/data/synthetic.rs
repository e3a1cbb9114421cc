//! Seeded synthetic data for each app, so examples and the quickstart need no download.

use super::{Corpus, DataError, Examples, Rating, Ratings, Rng};

/// Low-rank ratings plus Gaussian noise: the noise is irreducible, so the best achievable test
/// RMSE is `noise_std` (a model that recovers the low-rank part exactly reaches it).
#[derive(Debug, Clone)]
pub struct SyntheticRatings {
    /// The generated ratings (shuffled; split them with [`Ratings::split`]).
    pub ratings: Ratings,
    /// Standard deviation of the added noise: the achievable test RMSE.
    pub noise_std: f64,
}

/// Generates `num_ratings` ratings `3 + u·v + noise` for random (user, item) pairs, with true
/// factors of rank `rank` drawn so the low-rank signal has unit standard deviation.
pub fn synthetic_ratings(
    num_users: u32,
    num_items: u32,
    rank: usize,
    num_ratings: usize,
    noise_std: f64,
    seed: u64,
) -> Result<SyntheticRatings, DataError> {
    if num_users == 0 || num_items == 0 || rank == 0 || noise_std.is_nan() || noise_std < 0.0 {
        return Err(DataError::Parameters {
            what: format!(
                "synthetic ratings need users, items and rank > 0 and noise >= 0 \
                 (got {num_users}, {num_items}, {rank}, {noise_std})"
            ),
        });
    }
    let mut rng = Rng::new(seed);
    let scale = (1.0 / rank as f64).sqrt().sqrt();
    let mut factors = |count: u32| -> Vec<f64> {
        (0..count as usize * rank)
            .map(|_| rng.normal() * scale)
            .collect()
    };
    let user_factors = factors(num_users);
    let item_factors = factors(num_items);
    let entries = (0..num_ratings)
        .map(|_| {
            let user = rng.below(num_users);
            let item = rng.below(num_items);
            let u = &user_factors[user as usize * rank..][..rank];
            let v = &item_factors[item as usize * rank..][..rank];
            let signal: f64 = u.iter().zip(v).map(|(a, b)| a * b).sum();
            let value = (3.0 + signal + noise_std * rng.normal()) as f32;
            Rating { user, item, value }
        })
        .collect();
    Ok(SyntheticRatings {
        ratings: Ratings {
            num_users,
            num_items,
            entries,
        },
        noise_std,
    })
}

/// Gaussian class clusters: class `c` has mean `m_c ~ N(0, separation²·I)`, examples are
/// `m_c + N(0, I)`. Larger `separation` makes the classes easier to tell apart.
#[derive(Debug, Clone)]
pub struct SyntheticExamples {
    /// The generated examples (classes drawn uniformly).
    pub examples: Examples,
    /// The class means, row-major `num_classes × num_features`.
    pub means: Vec<f32>,
}

/// Generates `count` examples of `num_features` features in `num_classes` Gaussian clusters.
pub fn synthetic_classification(
    count: usize,
    num_features: usize,
    num_classes: usize,
    separation: f64,
    seed: u64,
) -> Result<SyntheticExamples, DataError> {
    if num_features == 0 || num_classes < 2 {
        return Err(DataError::Parameters {
            what: format!(
                "synthetic classification needs features > 0 and at least 2 classes \
                 (got {num_features}, {num_classes})"
            ),
        });
    }
    let mut rng = Rng::new(seed);
    let means: Vec<f32> = (0..num_classes * num_features)
        .map(|_| (rng.normal() * separation) as f32)
        .collect();
    let mut features = Vec::with_capacity(count * num_features);
    let mut labels = Vec::with_capacity(count);
    for _ in 0..count {
        let class = rng.below(num_classes as u32);
        let mean = &means[class as usize * num_features..][..num_features];
        features.extend(mean.iter().map(|m| m + rng.normal() as f32));
        labels.push(class);
    }
    Ok(SyntheticExamples {
        examples: Examples {
            num_features,
            num_classes,
            features,
            labels,
            class_labels: (0..num_classes as i64).collect(),
        },
        means,
    })
}

/// A corpus drawn from the LDA generative model.
#[derive(Debug, Clone)]
pub struct SyntheticCorpus {
    /// The generated documents.
    pub corpus: Corpus,
    /// The true topics, row-major `num_topics × vocab_size` word distributions.
    pub topics: Vec<f64>,
}

/// Generates `num_docs` documents of `doc_len` tokens: topics `~ Dir(eta)` over `vocab_size`
/// words, per-document mixtures `~ Dir(alpha)`.
pub fn synthetic_corpus(
    num_docs: usize,
    vocab_size: usize,
    num_topics: usize,
    doc_len: usize,
    alpha: f64,
    eta: f64,
    seed: u64,
) -> Result<SyntheticCorpus, DataError> {
    if vocab_size == 0 || num_topics == 0 || doc_len == 0 || !(alpha > 0.0 && eta > 0.0) {
        return Err(DataError::Parameters {
            what: format!(
                "synthetic corpus needs vocabulary, topics and length > 0 and positive priors \
                 (got {vocab_size}, {num_topics}, {doc_len}, {alpha}, {eta})"
            ),
        });
    }
    let mut rng = Rng::new(seed);
    let mut topics = vec![0.0; num_topics * vocab_size];
    for topic in topics.chunks_exact_mut(vocab_size) {
        rng.dirichlet(eta, topic);
    }
    let mut mixture = vec![0.0; num_topics];
    let mut counts = vec![0u32; vocab_size];
    let docs = (0..num_docs)
        .map(|_| {
            rng.dirichlet(alpha, &mut mixture);
            counts.fill(0);
            for _ in 0..doc_len {
                let topic = rng.categorical(&mixture);
                let word = rng.categorical(&topics[topic * vocab_size..][..vocab_size]);
                counts[word] += 1;
            }
            counts
                .iter()
                .enumerate()
                .filter(|(_, c)| **c > 0)
                .map(|(w, c)| (w as u32, *c))
                .collect()
        })
        .collect();
    Ok(SyntheticCorpus {
        corpus: Corpus { vocab_size, docs },
        topics,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratings_are_seeded_and_noise_is_as_declared() {
        let a = synthetic_ratings(50, 40, 3, 2000, 0.5, 1).unwrap();
        let b = synthetic_ratings(50, 40, 3, 2000, 0.5, 1).unwrap();
        assert_eq!(a.ratings, b.ratings);
        let clean = synthetic_ratings(50, 40, 3, 2000, 0.0, 1).unwrap();
        let noise_rms = (a.ratings.entries.iter().zip(&clean.ratings.entries))
            .map(|(x, y)| f64::from(x.value - y.value).powi(2))
            .sum::<f64>()
            / 2000.0;
        assert!(
            (noise_rms.sqrt() - 0.5).abs() < 0.05,
            "{}",
            noise_rms.sqrt()
        );
        assert!(synthetic_ratings(0, 1, 1, 1, 0.1, 1).is_err());
    }

    #[test]
    fn classification_and_corpus_have_requested_shapes() {
        let data = synthetic_classification(300, 5, 4, 2.0, 2).unwrap();
        assert_eq!(data.examples.len(), 300);
        assert_eq!(data.examples.features.len(), 1500);
        assert!(data.examples.labels.iter().all(|&l| l < 4));
        let corpus = synthetic_corpus(20, 30, 3, 50, 0.1, 0.05, 3).unwrap();
        assert_eq!(corpus.corpus.docs.len(), 20);
        assert_eq!(corpus.corpus.num_tokens(), 20 * 50);
        assert!(corpus.corpus.docs.iter().flatten().all(|&(w, _)| w < 30));
    }
}
