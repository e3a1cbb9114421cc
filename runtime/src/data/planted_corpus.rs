//! A corpus from the LDA generative model at any size (issue 36: LDA at the seed's scale).
//!
//! Topic `k`'s word distribution is drawn from `Dir(eta)` with its own random stream; document
//! `d` is a pure function of (seed, d): its mixture `θ_d ~ Dir(alpha)`, then `doc_len` tokens,
//! each a topic from `θ_d` and a word from that topic. Documents are generated in parallel
//! straight into their place, so a node generates only the documents of its own shard and every
//! node agrees on them. The last `held_out` documents are the held-out set (never trained on):
//! [`crate::apps::lda::held_out_log_likelihood`] scores a model's topics on them.

use super::Planted as _;
use super::{Corpus, DataError, Rng};

/// Documents generated per unit of parallel work.
const DOCS_PER_TASK: usize = 1024;

/// A planted LDA model and the size of the corpus drawn from it.
#[derive(Debug, Clone, PartialEq)]
pub struct PlantedCorpus {
    /// Documents, held-out ones included.
    pub docs: u64,
    /// Vocabulary size.
    pub vocab: u32,
    /// Topics of the hidden model.
    pub topics: usize,
    /// Tokens per document.
    pub doc_len: u32,
    /// Symmetric Dirichlet prior of the document mixtures.
    pub alpha: f64,
    /// Symmetric Dirichlet prior of the topics' word distributions.
    pub eta: f64,
    /// The last `held_out` documents are held out.
    pub held_out: u64,
    /// Seed: the same seed and sizes give the same corpus on every machine.
    pub seed: u64,
}

/// The training documents of a shard (or all of them) and the held-out documents.
#[derive(Debug, Clone)]
pub struct PlantedDocs {
    /// Training documents of the shard, in document order.
    pub train: Corpus,
    /// Held-out documents, in document order.
    pub held_out: Corpus,
}

impl super::Planted for PlantedCorpus {
    /// Bytes [`PlantedCorpus::generate`] allocates for `shard` of `shards` (all training
    /// documents for `None`) and the held-out set: the topics' cumulative distributions while
    /// generating, and at most one `(word, count)` pair per token.
    fn bytes_needed(&self, shard: Option<(usize, usize)>) -> u64 {
        let train = match shard {
            Some((shard, shards)) => super::shard_size(self.train_docs(), shard, shards),
            None => self.train_docs(),
        };
        let doc = std::mem::size_of::<Vec<(u32, u32)>>() as u64 + u64::from(self.doc_len) * 8;
        let topics = self.topics as u64 * u64::from(self.vocab) * 8;
        (train + self.held_out) * doc + topics
    }

    fn describe(&self) -> String {
        format!(
            "a planted corpus of {} documents × {} tokens ({} words, {} topics)",
            self.docs, self.doc_len, self.vocab, self.topics
        )
    }

    fn check(&self) -> Result<(), DataError> {
        let valid = self.docs > self.held_out
            && self.vocab > 0
            && (1..=65_535).contains(&self.topics)
            && self.doc_len > 0
            && self.alpha > 0.0
            && self.eta > 0.0
            && self.alpha.is_finite()
            && self.eta.is_finite();
        if valid {
            Ok(())
        } else {
            Err(DataError::Parameters {
                what: format!(
                    "a planted corpus needs more documents than held-out ones, a vocabulary, \
                     1..=65535 topics, a document length and positive finite priors \
                     (got {self:?})"
                ),
            })
        }
    }
}

impl PlantedCorpus {
    /// Training documents in all.
    pub fn train_docs(&self) -> u64 {
        self.docs - self.held_out
    }

    /// Training tokens in all.
    pub fn train_tokens(&self) -> u64 {
        self.train_docs() * u64::from(self.doc_len)
    }

    /// The topics' word distributions, row-major `topics × vocab`, on `threads` threads.
    pub fn topic_words(&self, threads: usize) -> Result<Vec<f64>, DataError> {
        self.check()?;
        let vocab = self.vocab as usize;
        let mut topics = vec![0.0; self.topics * vocab];
        super::parallel_tasks(
            topics.chunks_mut(vocab).collect(),
            threads,
            || (),
            |topic, row, ()| {
                Rng::stream(self.seed ^ TOPIC_STREAMS, topic as u64).dirichlet(self.eta, row);
            },
        );
        Ok(topics)
    }

    /// Generates the held-out documents and the training documents of `shard` of `shards` (all
    /// for `None`; training document `d` is in shard `d mod shards`) on `threads` threads.
    /// Refused, before anything is allocated, when it would need more than `memory_limit`
    /// bytes.
    pub fn generate(
        &self,
        shard: Option<(usize, usize)>,
        threads: usize,
        memory_limit: Option<u64>,
    ) -> Result<PlantedDocs, DataError> {
        self.generate_with(shard, true, threads, memory_limit)
    }

    /// The training documents of `shard` of `shards` alone (what a worker trains on; the
    /// held-out set is not generated), on `threads` threads: the same documents as
    /// [`PlantedCorpus::generate`]'s shard.
    pub fn generate_shard(
        &self,
        shard: usize,
        shards: usize,
        threads: usize,
        memory_limit: Option<u64>,
    ) -> Result<Corpus, DataError> {
        Ok(self
            .generate_with(Some((shard, shards)), false, threads, memory_limit)?
            .train)
    }

    fn generate_with(
        &self,
        shard: Option<(usize, usize)>,
        with_held_out: bool,
        threads: usize,
        memory_limit: Option<u64>,
    ) -> Result<PlantedDocs, DataError> {
        self.check_request(shard, memory_limit)?;
        let mut cumulative = self.topic_words(threads)?;
        for row in cumulative.chunks_mut(self.vocab as usize) {
            let mut sum = 0.0;
            for value in row.iter_mut() {
                sum += *value;
                *value = sum;
            }
        }
        let (shard, shards) = shard.unwrap_or((0, 1));
        let train_ids: Vec<u64> = (shard as u64..self.train_docs()).step_by(shards).collect();
        let held_out_ids: Vec<u64> = if with_held_out {
            (self.train_docs()..self.docs).collect()
        } else {
            Vec::new()
        };
        let corpus = |ids: &[u64]| Corpus {
            vocab_size: self.vocab as usize,
            docs: self.documents(ids, &cumulative, threads),
        };
        Ok(PlantedDocs {
            train: corpus(&train_ids),
            held_out: corpus(&held_out_ids),
        })
    }

    /// Documents `ids`, generated in parallel into their place.
    fn documents(&self, ids: &[u64], cumulative: &[f64], threads: usize) -> Vec<Vec<(u32, u32)>> {
        let mut docs = vec![Vec::new(); ids.len()];
        super::parallel_tasks(
            ids.chunks(DOCS_PER_TASK)
                .zip(docs.chunks_mut(DOCS_PER_TASK))
                .collect(),
            threads,
            || {
                let mixture = vec![0.0; self.topics];
                (mixture, Vec::with_capacity(self.doc_len as usize))
            },
            |_, (ids, out), (mixture, words)| {
                for (&id, doc) in ids.iter().zip(out.iter_mut()) {
                    *doc = self.document(id, cumulative, mixture, words);
                }
            },
        );
        docs
    }

    /// Document `id` as `(word, count)` pairs in word order.
    fn document(
        &self,
        id: u64,
        cumulative: &[f64],
        mixture: &mut [f64],
        words: &mut Vec<u32>,
    ) -> Vec<(u32, u32)> {
        let vocab = self.vocab as usize;
        let mut rng = Rng::stream(self.seed, id + 1);
        rng.dirichlet(self.alpha, mixture);
        let mut sum = 0.0;
        for value in mixture.iter_mut() {
            sum += *value;
            *value = sum;
        }
        words.clear();
        for _ in 0..self.doc_len {
            let topic = draw(mixture, rng.next_f64());
            let row = &cumulative[topic * vocab..][..vocab];
            words.push(draw(row, rng.next_f64()) as u32);
        }
        words.sort_unstable();
        let mut pairs: Vec<(u32, u32)> = Vec::new();
        for &word in words.iter() {
            match pairs.last_mut() {
                Some((last, count)) if *last == word => *count += 1,
                _ => pairs.push((word, 1)),
            }
        }
        pairs.shrink_to_fit();
        pairs
    }
}

/// Salt of the topics' random streams (documents use `(seed, id + 1)`).
const TOPIC_STREAMS: u64 = 0x7091_c5ee_d000_0001;

/// The index whose cumulative weight first exceeds `unit · total` (binary search).
fn draw(cumulative: &[f64], unit: f64) -> usize {
    let target = unit * cumulative.last().copied().unwrap_or(0.0);
    cumulative
        .partition_point(|&value| value <= target)
        .min(cumulative.len() - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small() -> PlantedCorpus {
        PlantedCorpus {
            docs: 500,
            vocab: 300,
            topics: 5,
            doc_len: 40,
            alpha: 0.1,
            eta: 0.05,
            held_out: 50,
            seed: 7,
        }
    }

    #[test]
    fn shards_are_the_whole_corpus_split_by_document_and_seeded() {
        let source = small();
        let all = source.generate(None, 3, None).unwrap();
        assert_eq!(all.train.docs.len(), 450);
        assert_eq!(all.held_out.docs.len(), 50);
        assert_eq!(all.train.num_tokens(), 450 * 40);
        assert!(
            all.train
                .docs
                .iter()
                .flatten()
                .all(|&(w, c)| w < 300 && c > 0)
        );
        let again = source.generate(None, 1, None).unwrap();
        assert_eq!(all.train, again.train, "threads do not change the corpus");
        for shard in 0..3 {
            let part = source.generate(Some((shard, 3)), 2, None).unwrap();
            let expected: Vec<_> = all
                .train
                .docs
                .iter()
                .skip(shard)
                .step_by(3)
                .cloned()
                .collect();
            assert_eq!(part.train.docs, expected, "shard {shard}");
            assert_eq!(part.held_out, all.held_out);
        }
        let other = PlantedCorpus { seed: 8, ..source };
        assert_ne!(other.generate(None, 2, None).unwrap().train, all.train);
    }

    /// Word frequencies follow the planted model: a word's share of the corpus is close to its
    /// mean probability over the topics (every document mixes topics symmetrically).
    #[test]
    fn word_frequencies_follow_the_planted_topics() {
        let source = PlantedCorpus {
            docs: 4000,
            held_out: 1,
            ..small()
        };
        let topics = source.topic_words(2).unwrap();
        let corpus = source.generate(None, 2, None).unwrap().train;
        let mut counts = vec![0.0f64; 300];
        for &(word, count) in corpus.docs.iter().flatten() {
            counts[word as usize] += f64::from(count);
        }
        let tokens = corpus.num_tokens() as f64;
        let mut distance = 0.0;
        for (word, count) in counts.iter().enumerate() {
            let expected: f64 = (0..5).map(|k| topics[k * 300 + word]).sum::<f64>() / 5.0;
            distance += (count / tokens - expected).abs();
        }
        assert!(distance < 0.15, "total variation {}", distance / 2.0);
    }

    #[test]
    fn bad_sizes_are_refused_before_allocation() {
        let too_big = PlantedCorpus {
            docs: 1 << 40,
            held_out: 10,
            ..small()
        };
        let error = too_big.generate(None, 1, Some(1 << 30)).unwrap_err();
        assert_eq!(error.category(), "too_large");
        assert!(
            error.to_string().contains("1099511627776 documents"),
            "{error}"
        );
        let no_train = PlantedCorpus {
            held_out: 500,
            ..small()
        };
        assert_eq!(
            no_train.generate(None, 1, None).unwrap_err().category(),
            "parameters"
        );
        assert!(small().generate(Some((3, 3)), 1, None).is_err());
    }
}
