//! Latent Dirichlet allocation by collapsed Gibbs sampling.
//!
//! Tables (counts stored as exact integers in `f32`): [`WORD_TOPIC`] (one row per word, width
//! `K`), [`TOPIC_TOTALS`] (width `K`: the topic counts of the documents `d` with
//! `d mod rows = key`, as few rows as keep each below 2^24, so one for a corpus under 2^24
//! tokens), [`DOC_LOGLIK`] (one row per worker shard, width 1) and [`ASSIGNMENTS`] (the topic of
//! every token, packed [`topics_per_value`] to an `f32`, [`ASSIGNMENTS_PER_ROW`] values a row).
//! Only the worker that owns a
//! document samples its tokens and writes their topics; the doc-topic counts are rebuilt from
//! the topics whenever the worker did not run the clock before (it was built on a joining node,
//! or it redoes clocks after a rollback), so every count stays the sum of the topics the tables
//! hold. Each clock the worker publishes the document part of the log-likelihood of its shard
//! into its [`DOC_LOGLIK`] row, so [`App::evaluate`] can compute the complete log p(w, z)
//! exactly as the `lda` Python package's `loglikelihood()` does.
//!
//! A clock resamples a slice of the worker's tokens (a sweep takes [`App::clocks_per_pass`]
//! clocks); the job's clock 0 also adds the initial assignments, token `i` of the corpus in topic
//! `i mod K` (the `lda` package's initialisation).

use std::borrow::Cow;
use std::sync::Arc;

use crate::app::{
    App, AppWorker, ClockStats, EvalReport, RowCache, RowInit, TableId, TableReader, TableSpec,
    WorkingSet,
};
use crate::data::{Corpus, Planted as _, PlantedCorpus, Rng};

use super::{AppsError, BareWorker, RowStore, ln_gamma, pass_range};

/// Word-topic counts, one row per word.
pub const WORD_TOPIC: TableId = 0;
/// Topic totals: row `r` counts the tokens of the documents `d` with `d mod rows = r`; the
/// topic totals are the sum of the rows.
pub const TOPIC_TOTALS: TableId = 1;
/// Document part of the log-likelihood, one single-value row per worker shard.
pub const DOC_LOGLIK: TableId = 2;
/// The topic of every token: with `n` = [`topics_per_value`]`(K)`, token `i` of the corpus
/// (documents in order) is digit `i mod n` (base `K`, lowest first) of value `v = i / n`, which
/// is column `v mod ASSIGNMENTS_PER_ROW` of row `v / ASSIGNMENTS_PER_ROW`; initially topic
/// `i mod K`. The worker that samples a token writes its topic here, so a worker rebuilt on
/// another node, or after a rollback, resumes from the topics its counts hold. Tokens sharing a
/// value may belong to two workers: each changes only its own digit, so their deltas add up.
pub const ASSIGNMENTS: TableId = 3;

/// Values per [`ASSIGNMENTS`] row: a row per token cost a key, a row header and a slot per
/// token in every table and cache.
pub const ASSIGNMENTS_PER_ROW: usize = 64;

/// Topics packed into one [`ASSIGNMENTS`] value: as many base-`K` digits as keep it an exact
/// `f32` (below 2^24): 5 for 20 topics, 3 for 100, 2 for 1,000 to 4,096, 1 above. Every clock moves
/// a worker's whole working set, the assignments most of it: packing divides their bytes.
pub fn topics_per_value(topics: usize) -> u32 {
    let mut per = 1u32;
    while per < 24 && (topics as u64).pow(per + 1) <= 1 << 24 {
        per += 1;
    }
    per
}

/// Counts are `f32`, exact below 2^24: no word may occur this often, and each [`TOPIC_TOTALS`]
/// row holds fewer tokens.
pub const MAX_EXACT_COUNT: u64 = 1 << 24;

/// Most [`TOPIC_TOTALS`] rows (every worker reads them all every clock).
pub const MAX_TOTALS_ROWS: u64 = 4096;

/// Most clocks a sweep takes when [`LdaConfig::clocks_per_pass`] is `None`: every clock moves
/// the whole word-topic working set.
pub const MAX_AUTO_CLOCKS_PER_PASS: usize = 128;

/// The largest share of a sweep of the other workers' topic moves a worker may sample without
/// seeing, `(staleness + 1) / clocks_per_pass · (workers − 1) / workers`, on a corpus as dense
/// as reuters ([`REFERENCE_TOKENS_PER_COUNT`]). Measured on reuters (BENCHMARKS.md, "LDA at any
/// worker count"): at 1/32 two and eight workers end where one does (per-token log-likelihood
/// -7.80 after 1,500 sweeps, one worker -7.77 to -7.81 over five seeds); at 3/32 they end at
/// -7.83 and at 3/4 at -7.86.
pub const STALE_SWEEP_SHARE: f64 = 1.0 / 32.0;

/// Tokens per word-topic count of reuters (84,010 tokens, 4,258 words, 20 topics), the corpus
/// [`STALE_SWEEP_SHARE`] was measured on.
pub const REFERENCE_TOKENS_PER_COUNT: f64 = 84_010.0 / (4_258.0 * 20.0);

/// The largest stale share any corpus gets. On 10 M planted tokens (10,000 words, 100 topics:
/// 10 tokens a count), two workers under BSP reached the bar of `scripts/bench-lda-scale.sh`
/// in 85 sweeps at a share of 1/32 and of 1/8, and needed 91 at 1/4 and 1/2 (BENCHMARKS.md,
/// "LDA at scale").
pub const MAX_STALE_SWEEP_SHARE: f64 = 1.0 / 8.0;

/// The stale share a corpus of `tokens_per_count` tokens per word-topic count (tokens ÷
/// (vocabulary × topics)) may take: [`STALE_SWEEP_SHARE`] times the square root of its density
/// over reuters', between [`STALE_SWEEP_SHARE`] and [`MAX_STALE_SWEEP_SHARE`].
///
/// Why it grows with density: a worker sees each count `n` off by the other workers' unseen
/// moves into and out of it. Once the chain is near its equilibrium those moves balance, so the
/// error is of the order of the square root of their number, `√(share · n)`, and relative to the
/// count `√(share / n)`: a share growing with `n` keeps it equal. The square root of the
/// density (not the density itself, which that argument gives) leaves a margin for the early
/// sweeps, whose moves do not balance. Corpora sparser than reuters keep its share.
pub fn stale_sweep_share(tokens_per_count: f64) -> f64 {
    let density = (tokens_per_count / REFERENCE_TOKENS_PER_COUNT).max(1.0);
    if !density.is_finite() {
        return STALE_SWEEP_SHARE;
    }
    (STALE_SWEEP_SHARE * density.sqrt()).min(MAX_STALE_SWEEP_SHARE)
}

/// Clocks a sweep takes for `workers` workers at SSP `staleness` on a corpus of
/// `tokens_per_count` tokens per word-topic count, so that no worker samples against more than
/// [`stale_sweep_share`] of a sweep of the others' moves it has not seen: one for one worker
/// (nobody else writes), at most [`MAX_AUTO_CLOCKS_PER_PASS`].
pub fn lda_clocks_per_pass(workers: usize, staleness: u64, tokens_per_count: f64) -> usize {
    if workers <= 1 {
        return 1;
    }
    let others = (workers - 1) as f64 / workers as f64;
    let share = stale_sweep_share(tokens_per_count);
    // A hair below the exact ratio, so a share that divides it evenly is not rounded up.
    let clocks = ((staleness + 1) as f64 * others / share - 1e-9).ceil();
    (clocks as usize).clamp(1, MAX_AUTO_CLOCKS_PER_PASS)
}

/// Hyperparameters of LDA.
#[derive(Debug, Clone, PartialEq)]
pub struct LdaConfig {
    /// Number of topics `K` (at most 65 535).
    pub num_topics: usize,
    /// Symmetric document-topic prior.
    pub alpha: f64,
    /// Symmetric topic-word prior.
    pub eta: f64,
    /// Seed of the samplers (one stream per shard).
    pub seed: u64,
    /// Clocks per Gibbs sweep over the data, or `None` for [`lda_clocks_per_pass`] of the
    /// worker count and `staleness`: clock `c` resamples slice `c % clocks_per_pass` of each
    /// worker's tokens. Workers sample against each other's counts as of up to `staleness + 1`
    /// clock boundaries ago, and the more of a sweep that is, the further the chain ends from
    /// one worker's (reuters, 2 workers, SSP 2, 1,500 sweeps: -7.86 at 2 clocks a sweep,
    /// -7.80 at 48, one worker -7.77 to -7.81).
    pub clocks_per_pass: Option<usize>,
    /// The job's SSP staleness (0 = BSP), which sizes the clocks when `clocks_per_pass` is
    /// `None`.
    pub staleness: u64,
}

impl Default for LdaConfig {
    /// The `lda` package's defaults (`alpha=0.1`, `eta=0.01`) with its README's 20 topics.
    fn default() -> Self {
        Self {
            num_topics: 20,
            alpha: 0.1,
            eta: 0.01,
            seed: 1,
            clocks_per_pass: None,
            staleness: 0,
        }
    }
}

/// A document of a worker's shard: its index in the corpus, the index of its first token, its
/// `(word, count)` pairs.
type ShardDoc<'a> = (u64, u64, Cow<'a, [(u32, u32)]>);

/// Where the workers' documents come from.
#[derive(Debug, Clone)]
enum Docs {
    /// Loaded (or generated) in full: a worker copies its shard out of it.
    Loaded(Arc<Corpus>),
    /// Generated by each worker, its shard only ([`PlantedCorpus::generate_shard`]), on
    /// `threads` threads: a node never holds the documents of shards it does not train.
    /// Document `d` has `doc_len` tokens, so its first token's index is `d × doc_len`.
    Planted {
        source: Arc<PlantedCorpus>,
        threads: usize,
    },
}

/// LDA over a corpus.
#[derive(Debug, Clone)]
pub struct LdaApp {
    config: LdaConfig,
    corpus: Docs,
    vocab_size: usize,
    num_tokens: u64,
    /// [`TOPIC_TOTALS`] rows: document `d` counts in row `d mod totals_rows`.
    totals_rows: u64,
}

impl LdaApp {
    /// Builds the app.
    pub fn new(corpus: Corpus, config: LdaConfig) -> Result<Self, AppsError> {
        Self::with_count_limit(corpus, config, MAX_EXACT_COUNT)
    }

    /// [`LdaApp::new`] with counts kept below `limit` instead of [`MAX_EXACT_COUNT`] (tests split
    /// the totals of a small corpus this way).
    fn with_count_limit(corpus: Corpus, config: LdaConfig, limit: u64) -> Result<Self, AppsError> {
        check_config(&config)?;
        let num_tokens = corpus.num_tokens();
        if num_tokens == 0 || num_tokens >= 1 << 32 {
            return Err(AppsError::Data {
                app: "lda",
                what: format!("need between 1 and 2^32 tokens, got {num_tokens}"),
            });
        }
        let data = |what: String| AppsError::Data { app: "lda", what };
        let mut word_counts = vec![0u64; corpus.vocab_size];
        for &(word, count) in corpus.docs.iter().flatten() {
            word_counts[word as usize] += u64::from(count);
        }
        if let Some((word, &count)) =
            (word_counts.iter().enumerate()).find(|(_, count)| **count >= limit)
        {
            return Err(data(format!(
                "word {word} occurs {count} times; counts must stay below {limit} \
                 (f32 counts are exact below 2^24)"
            )));
        }
        let lengths: Vec<u64> = (corpus.docs.iter())
            .map(|doc| doc.iter().map(|&(_, count)| u64::from(count)).sum())
            .collect();
        let totals_rows = totals_rows(&lengths, limit).map_err(data)?;
        Ok(Self {
            config,
            vocab_size: corpus.vocab_size,
            corpus: Docs::Loaded(Arc::new(corpus)),
            num_tokens,
            totals_rows,
        })
    }

    /// LDA on a planted corpus at any size: each worker generates its own documents when it is
    /// created, on `threads` threads; nothing is generated here but the planted topics. Refused
    /// before anything is generated when one shard of `shards` would not fit in `memory_limit`
    /// bytes, or when a word's expected count under the planted model reaches 2^24 / 1.25 (its
    /// `f32` counts would no longer be exact; a loaded corpus is checked word by word instead).
    pub fn planted(
        source: PlantedCorpus,
        config: LdaConfig,
        threads: usize,
        shards: usize,
        memory_limit: Option<u64>,
    ) -> Result<Self, AppsError> {
        let data = |what: String| AppsError::Data { app: "lda", what };
        check_config(&config)?;
        source
            .check_request(Some((0, shards.max(1))), memory_limit)
            .map_err(|e| data(e.to_string()))?;
        let num_tokens = source.train_tokens();
        if num_tokens >= 1 << 32 {
            return Err(data(format!(
                "need between 1 and 2^32 tokens, got {num_tokens}"
            )));
        }
        // A document's mixture is Dir(alpha), symmetric: each topic is 1/K of the tokens in
        // expectation, so word w is expected num_tokens × mean_k φ_k(w) times.
        let vocab = source.vocab as usize;
        let topic_words = source
            .topic_words(threads)
            .map_err(|e| data(e.to_string()))?;
        let mut expected = vec![0.0f64; vocab];
        for row in topic_words.chunks_exact(vocab) {
            for (count, &p) in expected.iter_mut().zip(row) {
                *count += p * num_tokens as f64 / source.topics as f64;
            }
        }
        if let Some((word, &count)) = (expected.iter().enumerate())
            .find(|(_, count)| **count * 1.25 >= MAX_EXACT_COUNT as f64)
        {
            return Err(data(format!(
                "word {word} is expected to occur {count:.0} times; counts must stay below \
                 {MAX_EXACT_COUNT} (f32 counts are exact below 2^24)"
            )));
        }
        // Every document has doc_len tokens: row r of R counts ceil or floor of docs / R of them.
        let (docs, doc_len) = (source.train_docs(), u64::from(source.doc_len));
        let totals_rows = (num_tokens.div_ceil(MAX_EXACT_COUNT).max(1)..=MAX_TOTALS_ROWS)
            .find(|&rows| docs.div_ceil(rows) * doc_len < MAX_EXACT_COUNT)
            .ok_or_else(|| {
                data(format!(
                    "no split of the topic totals into at most {MAX_TOTALS_ROWS} rows keeps \
                     each below {MAX_EXACT_COUNT} tokens ({num_tokens} tokens)"
                ))
            })?;
        Ok(Self {
            config,
            vocab_size: vocab,
            corpus: Docs::Planted {
                source: Arc::new(source),
                threads: threads.max(1),
            },
            num_tokens,
            totals_rows,
        })
    }

    /// The training documents of `shard` of `num_shards` (document `d` in shard
    /// `d mod num_shards`): `(document, index of its first token in the corpus, its words)`.
    fn shard_docs(&self, shard: usize, num_shards: usize) -> Vec<ShardDoc<'_>> {
        match &self.corpus {
            Docs::Loaded(corpus) => {
                let mut global_index = 0u64;
                let mut mine = Vec::new();
                for (doc, words) in corpus.docs.iter().enumerate() {
                    if doc % num_shards == shard {
                        mine.push((doc as u64, global_index, Cow::Borrowed(&words[..])));
                    }
                    global_index += words.iter().map(|&(_, c)| u64::from(c)).sum::<u64>();
                }
                mine
            }
            Docs::Planted { source, threads } => {
                // the sizes were checked when the app was built, and memory at its creation
                let shard = shard % num_shards;
                let docs = source
                    .generate_shard(shard, num_shards, *threads, None)
                    .expect("planted sizes are validated by LdaApp::planted")
                    .docs;
                let doc_len = u64::from(source.doc_len);
                (docs.into_iter().enumerate())
                    .map(|(i, words)| {
                        let doc = (shard + i * num_shards) as u64;
                        (doc, doc * doc_len, Cow::Owned(words))
                    })
                    .collect()
            }
        }
    }

    /// Number of tokens (updates per clock over all workers).
    pub fn num_tokens(&self) -> u64 {
        self.num_tokens
    }

    /// The same app with a sweep split into `clocks_per_pass` clocks (instead of the count
    /// [`lda_clocks_per_pass`] derives from the worker count and staleness).
    pub fn with_clocks_per_pass(mut self, clocks_per_pass: usize) -> Result<Self, AppsError> {
        if clocks_per_pass == 0 {
            return Err(AppsError::Config {
                app: "lda",
                what: "clocks per sweep must be > 0".into(),
            });
        }
        self.config.clocks_per_pass = Some(clocks_per_pass);
        Ok(self)
    }

    /// Tokens per word-topic count: tokens ÷ (vocabulary × topics), what sizes
    /// [`stale_sweep_share`].
    pub fn tokens_per_count(&self) -> f64 {
        self.num_tokens as f64 / (self.vocab_size.max(1) * self.config.num_topics.max(1)) as f64
    }

    /// The configuration.
    pub fn config(&self) -> &LdaConfig {
        &self.config
    }

    /// The topics' word distributions the counts in `tables` give, row-major `topics × vocab`:
    /// `φ_k(w) = (n_wk + η) / (n_k + Vη)`, the collapsed sampler's estimate.
    pub fn topic_words(&self, tables: &dyn TableReader) -> Vec<f32> {
        let (k, vocab, eta) = (self.config.num_topics, self.vocab_size, self.config.eta);
        let mut counts = vec![0.0f64; k * vocab];
        let mut totals = vec![0.0f64; k];
        let mut row = vec![0.0f32; k];
        for word in 0..vocab {
            tables.read_row(WORD_TOPIC, word as u64, &mut row);
            for (topic, &count) in row.iter().enumerate() {
                counts[topic * vocab + word] = f64::from(count);
                totals[topic] += f64::from(count);
            }
        }
        (counts.chunks_exact(vocab).zip(&totals))
            .flat_map(|(row, total)| {
                let norm = 1.0 / (total + eta * vocab as f64);
                row.iter().map(move |&n| ((n + eta) * norm) as f32)
            })
            .collect()
    }
}

/// Refuses hyperparameters no run can use.
fn check_config(config: &LdaConfig) -> Result<(), AppsError> {
    if config.num_topics < 2 || config.num_topics > usize::from(u16::MAX) {
        return Err(AppsError::Config {
            app: "lda",
            what: format!("topics must be in 2..=65535, got {}", config.num_topics),
        });
    }
    if !(config.alpha > 0.0 && config.eta > 0.0) {
        return Err(AppsError::Config {
            app: "lda",
            what: format!(
                "priors must be > 0, got alpha {} eta {}",
                config.alpha, config.eta
            ),
        });
    }
    Ok(())
}

/// The fewest [`TOPIC_TOTALS`] rows, document `d` counting in row `d mod rows`, that keep every
/// row's token count below `limit` ([`MAX_EXACT_COUNT`]: its `f32` counts stay exact), for
/// documents of `lengths` tokens.
fn totals_rows(lengths: &[u64], limit: u64) -> Result<u64, String> {
    let total: u64 = lengths.iter().sum();
    let mut rows = total.div_ceil(limit).max(1);
    let mut sums = Vec::new();
    while rows <= MAX_TOTALS_ROWS {
        sums.clear();
        sums.resize(rows as usize, 0u64);
        for (doc, length) in lengths.iter().enumerate() {
            sums[doc % rows as usize] += length;
        }
        if sums.iter().all(|&sum| sum < limit) {
            return Ok(rows);
        }
        rows += 1;
    }
    Err(format!(
        "no split of the topic totals into at most {MAX_TOTALS_ROWS} rows keeps each below \
         {limit} tokens ({total} tokens, longest document {})",
        lengths.iter().max().unwrap_or(&0)
    ))
}

/// Held-out per-token log-likelihood of a model's topics, by document completion: for each
/// held-out document, the mixture `θ` is fitted on its even-numbered tokens (EM with the topics
/// fixed, prior `alpha`, [`HELD_OUT_ITERATIONS`] iterations from uniform), and its odd-numbered
/// tokens are scored, `ln Σ_k θ_k φ_k(w)` each. One evaluator for every model: ebbflow's
/// ([`LdaApp::topic_words`]), a peer's, or the planted truth. `topic_words` is row-major
/// `topics × vocab`, each row a distribution over the words (`φ_k`).
pub fn held_out_log_likelihood(
    topic_words: &[f32],
    topics: usize,
    held_out: &Corpus,
    alpha: f64,
    threads: usize,
) -> Result<f64, AppsError> {
    let vocab = held_out.vocab_size;
    let data = |what: String| AppsError::Data {
        app: "lda held-out evaluator",
        what,
    };
    if topics == 0 || topic_words.len() != topics * vocab {
        return Err(data(format!(
            "topics must be {topics} × {vocab} values, got {}",
            topic_words.len()
        )));
    }
    if let Some(bad) = topic_words.iter().find(|p| !(p.is_finite() && **p >= 0.0)) {
        return Err(data(format!("a topic-word probability is {bad}")));
    }
    // Word-major, so one word's topics are contiguous.
    let mut by_word = vec![0.0f32; vocab * topics];
    for (topic, row) in topic_words.chunks_exact(vocab).enumerate() {
        for (word, &p) in row.iter().enumerate() {
            by_word[word * topics + topic] = p.max(f32::MIN_POSITIVE);
        }
    }
    let docs = &held_out.docs;
    let chunk = docs.len().div_ceil(threads.max(1)).max(1);
    let (loglik, scored) = std::thread::scope(|scope| {
        let handles: Vec<_> = docs
            .chunks(chunk)
            .map(|docs| scope.spawn(|| complete_documents(docs, &by_word, topics, alpha)))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("an evaluator thread panicked"))
            .fold((0.0, 0u64), |(l, n), (dl, dn)| (l + dl, n + dn))
    });
    if scored == 0 {
        return Err(data(
            "the held-out documents have no second tokens to score".into(),
        ));
    }
    Ok(loglik / scored as f64)
}

/// EM iterations of [`held_out_log_likelihood`]'s mixture fit.
pub const HELD_OUT_ITERATIONS: usize = 30;

/// Log-likelihood of the scored halves of `docs`, and the count of scored tokens.
fn complete_documents(
    docs: &[Vec<(u32, u32)>],
    by_word: &[f32],
    topics: usize,
    alpha: f64,
) -> (f64, u64) {
    let (mut loglik, mut scored_tokens) = (0.0, 0u64);
    let mut theta = vec![0.0f64; topics];
    let mut next = vec![0.0f64; topics];
    let mut observed = Vec::new();
    for doc in docs {
        observed.clear();
        let mut scored = Vec::new();
        let mut position = 0u64;
        for &(word, count) in doc {
            let count = u64::from(count);
            // even positions in [position, position + count)
            let even = (position + count).div_ceil(2) - position.div_ceil(2);
            if even > 0 {
                observed.push((word as usize, even as f64));
            }
            if count > even {
                scored.push((word as usize, (count - even) as f64));
            }
            position += count;
        }
        theta.fill(1.0 / topics as f64);
        for _ in 0..HELD_OUT_ITERATIONS {
            next.fill(alpha);
            for &(word, count) in &observed {
                let phi = &by_word[word * topics..][..topics];
                let norm: f64 = theta.iter().zip(phi).map(|(t, &p)| t * f64::from(p)).sum();
                let scale = count / norm;
                for ((n, t), &p) in next.iter_mut().zip(&theta).zip(phi) {
                    *n += scale * t * f64::from(p);
                }
            }
            let sum: f64 = next.iter().sum();
            for (t, n) in theta.iter_mut().zip(&next) {
                *t = n / sum;
            }
        }
        for &(word, count) in &scored {
            let phi = &by_word[word * topics..][..topics];
            let p: f64 = theta.iter().zip(phi).map(|(t, &p)| t * f64::from(p)).sum();
            loglik += count * p.ln();
            scored_tokens += count as u64;
        }
    }
    (loglik, scored_tokens)
}

/// One token of a worker's shard: its document (local index) and its word (slot after binding).
#[derive(Debug, Clone, Copy)]
struct Token {
    doc: u32,
    word: u32,
}

/// Topics summed together by the sampler's dense draw.
const BLOCK: usize = 8;

/// A word with fewer than `K / SPARSE_SHARE` topics of nonzero count draws over those topics
/// alone (the sparse draw); with more, one vectorised pass over all `K` topics costs less.
const SPARSE_SHARE: usize = 4;

/// Sampler constants and scratch.
///
/// The conditional of a token's topic `t`, with the token taken out, is
/// `(n_wt + η)(n_dt + α) / (n_t + Vη) = n_wt·c_t + η·c_t` for the document's coefficients
/// `c_t = (n_dt + α) / (n_t + Vη)` (SparseLDA's split, Yao, Mimno and McCallum 2009). The
/// first part is nonzero only on the word's topics, the second is `η Σ c_t`, a sum kept as the
/// counts move. A draw costs the word's topic count plus a step, not `K`, once the chain has
/// concentrated the words on few topics; the rare draw in the second part walks all `K`.
#[derive(Debug, Clone)]
struct Sampler {
    topics: usize,
    alpha: f32,
    eta: f32,
    vocab_eta: f32,
    /// A word draws sparsely while it has fewer nonzero topics than this.
    sparse_below: usize,
    /// Each topic's weight for the token being sampled (in the sparse draw, each of the word's
    /// topics' in list order), and their sums by [`BLOCK`] topics.
    weights: Vec<f32>,
    block_sums: Vec<f32>,
    inverse_totals: Vec<f32>,
    /// `c_t` of the document being sampled.
    coefficients: Vec<f32>,
    /// The topic totals, the sum of every [`TOPIC_TOTALS`] row (`f64`: exact at any size).
    totals: Vec<f64>,
    /// For each word slot, how many topics it lists in `word_topics` (0 for a word the sweep
    /// does not sample).
    word_lists: Vec<u32>,
    /// Every topic of nonzero count of each word of the sweep's tokens (a count that falls to
    /// zero during the sweep stays listed, with weight zero), `K` places a word: where a
    /// word's list is depends on its slot alone, so the list, its length and the word's counts
    /// are fetched at once.
    word_topics: Vec<u16>,
}

impl Sampler {
    fn new(topics: usize, alpha: f32, eta: f32, vocab_eta: f32) -> Self {
        Self {
            topics,
            alpha,
            eta,
            vocab_eta,
            sparse_below: topics.div_ceil(SPARSE_SHARE),
            weights: vec![0.0; topics],
            block_sums: vec![0.0; topics.div_ceil(BLOCK)],
            inverse_totals: vec![0.0; topics],
            coefficients: vec![0.0; topics],
            totals: vec![0.0; topics],
            word_lists: Vec::new(),
            word_topics: Vec::new(),
        }
    }

    /// Lists the nonzero topics of every word of `tokens`.
    fn list_word_topics(&mut self, tokens: &[Token], word_topic: &[f32]) {
        let k = self.topics;
        self.word_lists.clear();
        self.word_lists.resize(word_topic.len() / k, 0);
        self.word_topics.resize(word_topic.len(), 0);
        for token in tokens {
            self.word_lists[token.word as usize] = 1;
        }
        let rows = word_topic
            .chunks_exact(k)
            .zip(self.word_topics.chunks_exact_mut(k));
        for ((row, listed), len) in rows.zip(&mut self.word_lists) {
            if *len == 0 {
                continue;
            }
            *len = 0;
            for (t, &count) in row.iter().enumerate() {
                if count != 0.0 {
                    listed[*len as usize] = t as u16;
                    *len += 1;
                }
            }
        }
    }

    /// One collapsed Gibbs sweep over `tokens`, updating assignments, the word-topic and
    /// doc-topic counts and `self.totals` in place; each move is also counted in `moves`, row
    /// `doc_rows[doc]` (the [`TOPIC_TOTALS`] row of the token's document).
    #[allow(clippy::too_many_arguments)]
    fn sweep(
        &mut self,
        tokens: &[Token],
        assignments: &mut [u16],
        word_topic: &mut [f32],
        doc_topic: &mut [f32],
        doc_rows: &[u32],
        moves: &mut [i32],
        rng: &mut Rng,
    ) {
        let k = self.topics;
        self.list_word_topics(tokens, word_topic);
        let (alpha, eta, vocab_eta) = (self.alpha, self.eta, f64::from(self.vocab_eta));
        let mut topics = TopicCounts {
            totals: &mut self.totals[..k],
            inverse: &mut self.inverse_totals[..k],
            coefficients: &mut self.coefficients[..k],
            coefficient_sum: 0.0,
            alpha,
            vocab_eta,
        };
        for (t, inv) in topics.totals.iter().zip(topics.inverse.iter_mut()) {
            *inv = (1.0 / (t + vocab_eta)) as f32;
        }
        let weights = &mut self.weights[..k];
        let block_sums = &mut self.block_sums[..k.div_ceil(BLOCK)];
        let mut current_doc = None;
        for (token, assignment) in tokens.iter().zip(assignments.iter_mut()) {
            let word = &mut word_topic[token.word as usize * k..][..k];
            let doc = &mut doc_topic[token.doc as usize * k..][..k];
            let moved = &mut moves[doc_rows[token.doc as usize] as usize * k..][..k];
            if current_doc != Some(token.doc) {
                current_doc = Some(token.doc);
                topics.start_document(doc);
            }
            let old = usize::from(*assignment);
            word[old] -= 1.0;
            doc[old] -= 1.0;
            moved[old] -= 1;
            topics.recount(old, -1.0, doc[old]);
            let coefficients = &*topics.coefficients;
            let len = self.word_lists[token.word as usize];
            let listed = &mut self.word_topics[token.word as usize * k..][..k];
            let sparse = (len as usize) < self.sparse_below;
            let new = if sparse {
                let listed = &listed[..len as usize];
                let mut word_part = 0.0f32;
                for (weight, &t) in weights.iter_mut().zip(listed) {
                    *weight = word[usize::from(t)] * coefficients[usize::from(t)];
                    word_part += *weight;
                }
                let prior_part = eta * topics.coefficient_sum as f32;
                let target = rng.next_f32() * (word_part + prior_part);
                if target < word_part {
                    usize::from(listed[walk(&weights[..listed.len()], target)])
                } else {
                    // The prior part, `η c_t` over every topic: rare while η is small.
                    block_totals(coefficients, block_sums);
                    blocked_walk(coefficients, block_sums, (target - word_part) / eta)
                }
            } else {
                // One pass without a carried sum (it vectorises), the sums by blocks, then the
                // draw walks the blocks and one block's topics: about K/8 + 8 dependent steps.
                for ((weight, &w), &c) in weights.iter_mut().zip(&*word).zip(coefficients) {
                    *weight = (w + eta) * c;
                }
                let total = block_totals(weights, block_sums);
                blocked_walk(weights, block_sums, rng.next_f32() * total)
            };
            if word[new] == 0.0 && sparse && !listed[..len as usize].contains(&(new as u16)) {
                listed[len as usize] = new as u16;
                self.word_lists[token.word as usize] += 1;
            }
            word[new] += 1.0;
            doc[new] += 1.0;
            moved[new] += 1;
            topics.recount(new, 1.0, doc[new]);
            *assignment = new as u16;
        }
    }
}

/// The sampler's per-topic state through a sweep: totals, `1 / (n_t + Vη)`, the document's
/// coefficients `c_t` and their sum.
struct TopicCounts<'a> {
    totals: &'a mut [f64],
    inverse: &'a mut [f32],
    coefficients: &'a mut [f32],
    coefficient_sum: f64,
    alpha: f32,
    vocab_eta: f64,
}

impl TopicCounts<'_> {
    /// The coefficients of a document of counts `doc`.
    fn start_document(&mut self, doc: &[f32]) {
        for ((c, &d), &inv) in self.coefficients.iter_mut().zip(doc).zip(&*self.inverse) {
            *c = (d + self.alpha) * inv;
        }
        self.coefficient_sum = self.coefficients.iter().map(|&c| f64::from(c)).sum();
    }

    /// Moves topic `topic`'s total by `by` and updates its coefficient for the document's new
    /// count `doc_count`.
    fn recount(&mut self, topic: usize, by: f32, doc_count: f32) {
        self.totals[topic] += f64::from(by);
        self.inverse[topic] = (1.0 / (self.totals[topic] + self.vocab_eta)) as f32;
        let c = (doc_count + self.alpha) * self.inverse[topic];
        self.coefficient_sum += f64::from(c) - f64::from(self.coefficients[topic]);
        self.coefficients[topic] = c;
    }
}

/// Sums `weights` by [`BLOCK`] into `sums`; returns their total.
fn block_totals(weights: &[f32], sums: &mut [f32]) -> f32 {
    for (sum, block) in sums.iter_mut().zip(weights.chunks(BLOCK)) {
        *sum = block.iter().sum();
    }
    sums.iter().sum()
}

/// The index where `target` falls in the running sum of `weights` (the last if past the end).
fn walk(weights: &[f32], mut target: f32) -> usize {
    let mut index = 0;
    while index + 1 < weights.len() && weights[index] <= target {
        target -= weights[index];
        index += 1;
    }
    index
}

/// [`walk`] by the block sums first, then within one block.
fn blocked_walk(weights: &[f32], sums: &[f32], mut target: f32) -> usize {
    let mut block = 0;
    while block + 1 < sums.len() && sums[block] <= target {
        target -= sums[block];
        block += 1;
    }
    let start = block * BLOCK;
    start + walk(&weights[start..weights.len().min(start + BLOCK)], target)
}

impl App for LdaApp {
    type Worker = LdaWorker;

    fn tables(&self) -> Vec<TableSpec> {
        let k = self.config.num_topics;
        let table = |id, name: &str, width| TableSpec {
            id,
            name: name.into(),
            width,
            init: RowInit::Zeros,
        };
        vec![
            table(WORD_TOPIC, "lda_word_topic", k),
            table(TOPIC_TOTALS, "lda_topic_totals", k),
            table(DOC_LOGLIK, "lda_doc_loglik", 1),
            TableSpec {
                id: ASSIGNMENTS,
                name: "lda_assignments".into(),
                width: ASSIGNMENTS_PER_ROW,
                init: RowInit::PackedModulo {
                    modulus: k as u64,
                    per_value: topics_per_value(k),
                },
            },
        ]
    }

    fn worker(&self, shard: usize, num_shards: usize) -> LdaWorker {
        let k = self.config.num_topics;
        let num_shards = num_shards.max(1);
        let mut tokens = Vec::new();
        let mut words = Vec::new();
        let (mut doc_lengths, mut doc_starts, mut doc_rows) = (Vec::new(), Vec::new(), Vec::new());
        for (doc, first_token, doc_words) in self.shard_docs(shard, num_shards) {
            let local = doc_lengths.len() as u32;
            let length: u64 = doc_words.iter().map(|&(_, c)| u64::from(c)).sum();
            for &(word, count) in doc_words.iter() {
                for _ in 0..count {
                    tokens.push(Token { doc: local, word });
                    words.push(word);
                }
            }
            doc_lengths.push(length as u32);
            doc_starts.push(first_token);
            doc_rows.push((doc % self.totals_rows) as u32);
        }
        let alpha = self.config.alpha;
        let max_length = doc_lengths.iter().copied().max().unwrap_or(0) as usize;
        let ln_gamma_alpha = ln_gamma(alpha);
        let doc_term_table = (0..=max_length)
            .map(|n| ln_gamma(alpha + n as f64) - ln_gamma_alpha)
            .collect();
        let ln_gamma_alpha_k = ln_gamma(alpha * k as f64);
        let doc_constant = doc_lengths
            .iter()
            .map(|&n| ln_gamma_alpha_k - ln_gamma(alpha * k as f64 + f64::from(n)))
            .sum();
        let totals_rows = self.totals_rows as usize;
        LdaWorker {
            clocks_per_pass: self.clocks_per_pass(num_shards),
            shard: shard as u64,
            doc_topic: vec![0.0; doc_lengths.len() * k],
            // Read from the table at the worker's first clock.
            assignments: vec![0; tokens.len()],
            assignment_value: vec![0; tokens.len()],
            assignment_digit: vec![0; tokens.len()],
            previous: Vec::new(),
            digit_weights: (0..topics_per_value(k))
                .map(|j| (k as u32).pow(j))
                .collect(),
            tokens,
            words,
            doc_lengths,
            doc_starts,
            doc_rows,
            doc_term_table,
            doc_constant,
            last_clock: None,
            totals_slots: vec![0; totals_rows],
            moves: vec![0; totals_rows * k],
            loglik_slot: 0,
            seed: self.config.seed,
            sampler: Sampler::new(
                k,
                alpha as f32,
                self.config.eta as f32,
                (self.config.eta * self.vocab_size as f64) as f32,
            ),
        }
    }

    fn clocks_per_pass(&self, workers: usize) -> usize {
        self.config
            .clocks_per_pass
            .unwrap_or_else(|| {
                lda_clocks_per_pass(workers, self.config.staleness, self.tokens_per_count())
            })
            .max(1)
    }

    fn evaluate(&self, tables: &dyn TableReader) -> EvalReport {
        let k = self.config.num_topics;
        let vocab = self.vocab_size;
        let eta = self.config.eta;
        let ln_gamma_eta = ln_gamma(eta);
        let mut row = vec![0.0f32; k];
        let mut totals = vec![0.0f64; k];
        let mut loglik = k as f64 * ln_gamma(eta * vocab as f64);
        for word in 0..vocab as u64 {
            tables.read_row(WORD_TOPIC, word, &mut row);
            for (total, &count) in totals.iter_mut().zip(&row) {
                let count = f64::from(count).round();
                *total += count;
                if count > 0.0 {
                    loglik += ln_gamma(eta + count) - ln_gamma_eta;
                }
            }
        }
        for total in &totals {
            loglik -= ln_gamma(eta * vocab as f64 + total);
        }
        let mut value = [0.0f32];
        for shard in tables.keys(DOC_LOGLIK) {
            tables.read_row(DOC_LOGLIK, shard, &mut value);
            loglik += f64::from(value[0]);
        }
        let per_token = loglik / self.num_tokens as f64;
        EvalReport {
            loss: -per_token,
            metrics: vec![
                ("log_likelihood".into(), loglik),
                ("per_token_log_likelihood".into(), per_token),
            ],
        }
    }
}

/// A worker's documents: tokens, their topic assignments and the local doc-topic counts.
#[derive(Debug, Clone)]
pub struct LdaWorker {
    clocks_per_pass: usize,
    shard: u64,
    tokens: Vec<Token>,
    /// Word id of each token (the working set; `tokens[i].word` becomes a slot on binding).
    words: Vec<u32>,
    /// Each token's topic, as of the last clock this worker ran (the table holds the truth).
    assignments: Vec<u16>,
    /// Where each token's topic is in the [`ASSIGNMENTS`] rows after binding: the value (row
    /// slot · [`ASSIGNMENTS_PER_ROW`] + column) and the digit (below [`topics_per_value`]).
    assignment_value: Vec<u32>,
    assignment_digit: Vec<u8>,
    /// The topics of a clock's tokens before its sweep (scratch).
    previous: Vec<u16>,
    /// `K^j` for each digit `j` of a packed value.
    digit_weights: Vec<u32>,
    /// Per local document: its token count, the corpus index of its first token and its
    /// [`TOPIC_TOTALS`] row.
    doc_lengths: Vec<u32>,
    doc_starts: Vec<u64>,
    doc_rows: Vec<u32>,
    doc_topic: Vec<f32>,
    /// `ln Γ(α + n) − ln Γ(α)` for every possible doc-topic count `n`.
    doc_term_table: Vec<f64>,
    /// `Σ_d ln Γ(Kα) − ln Γ(Kα + n_d)` over this shard's documents.
    doc_constant: f64,
    /// The clock this worker ran last: its topics and doc-topic counts are current for the next.
    last_clock: Option<u64>,
    /// Slot of every [`TOPIC_TOTALS`] row (by key), and this clock's moves into each.
    totals_slots: Vec<u32>,
    moves: Vec<i32>,
    loglik_slot: u32,
    /// Seed of the samplers: clock `c` of shard `s` draws from stream `(seed ^ mix(c), s)`, so a
    /// clock redone or moved draws the same numbers.
    seed: u64,
    sampler: Sampler,
}

impl LdaWorker {
    fn bind_with(&mut self, slot: impl Fn(TableId, u64) -> u32) {
        for (token, &word) in self.tokens.iter_mut().zip(&self.words) {
            token.word = slot(WORD_TOPIC, u64::from(word));
        }
        for (key, bound) in self.totals_slots.iter_mut().enumerate() {
            *bound = slot(TOPIC_TOTALS, key as u64);
        }
        self.loglik_slot = slot(DOC_LOGLIK, self.shard);
        let per_row = ASSIGNMENTS_PER_ROW as u64;
        let per_value = self.digit_weights.len() as u64;
        let mut index = self
            .assignment_value
            .iter_mut()
            .zip(&mut self.assignment_digit);
        let mut row = None;
        for (&start, &length) in self.doc_starts.iter().zip(&self.doc_lengths) {
            for token in start..start + u64::from(length) {
                let (position, digit) = (token / per_value, token % per_value);
                let key = position / per_row;
                let row_slot = match row {
                    Some((bound_key, bound_slot)) if bound_key == key => bound_slot,
                    _ => {
                        let bound_slot = slot(ASSIGNMENTS, key);
                        row = Some((key, bound_slot));
                        bound_slot
                    }
                };
                let value = u64::from(row_slot) * per_row + position % per_row;
                let (bound_value, bound_digit) = index.next().expect("one index per token");
                *bound_value = value
                    .try_into()
                    .expect("LdaApp::new keeps a worker's assignments within u32 indices");
                *bound_digit = digit as u8;
            }
        }
    }

    /// Keys of the [`ASSIGNMENTS`] rows holding this worker's tokens, in order.
    fn assignment_keys(&self) -> impl Iterator<Item = u64> + '_ {
        let per_row = (ASSIGNMENTS_PER_ROW * self.digit_weights.len()) as u64;
        let mut last = None;
        (self.doc_starts.iter().zip(&self.doc_lengths))
            .filter(|(_, length)| **length > 0)
            .flat_map(move |(&start, &length)| {
                start / per_row..=(start + u64::from(length) - 1) / per_row
            })
            .filter(move |&key| last.replace(key) != Some(key))
    }

    /// Takes the topics from the table (after a move or a rollback, what the counts hold) and
    /// rebuilds the doc-topic counts from them.
    fn load_assignments(&mut self, rows: &[f32]) {
        let k = self.sampler.topics;
        let places = self.assignment_value.iter().zip(&self.assignment_digit);
        for (topic, (&value, &digit)) in self.assignments.iter_mut().zip(places) {
            let packed = rows[value as usize] as u32;
            *topic = (packed / self.digit_weights[usize::from(digit)] % k as u32) as u16;
        }
        self.doc_topic.fill(0.0);
        for (token, &topic) in self.tokens.iter().zip(&self.assignments) {
            self.doc_topic[token.doc as usize * k + usize::from(topic)] += 1.0;
        }
    }

    /// Document part of log p(z) for this shard, from the local doc-topic counts.
    fn doc_loglik(&self) -> f64 {
        self.doc_constant
            + self
                .doc_topic
                .iter()
                .map(|&count| self.doc_term_table[count as usize])
                .sum::<f64>()
    }
}

impl AppWorker for LdaWorker {
    fn working_set(&self) -> WorkingSet {
        let mut set = WorkingSet::new();
        set.add_keys(WORD_TOPIC, self.words.iter().map(|&w| u64::from(w)));
        set.add_range(TOPIC_TOTALS, self.totals_slots.len() as u64);
        set.add_keys(DOC_LOGLIK, [self.shard]);
        set.add_keys(ASSIGNMENTS, self.assignment_keys());
        set
    }

    fn bind(&mut self, cache: &RowCache) {
        self.bind_with(|table, key| {
            cache
                .slot(table, key)
                .expect("the runtime caches every key of the working set")
        });
    }

    fn clock(&mut self, cache: &mut RowCache, clock: u64) -> ClockStats {
        self.clock_on(cache, clock)
    }
}

impl BareWorker for LdaWorker {
    fn bind_dense(&mut self) {
        self.bind_with(|_, key| key as u32);
    }

    fn clock_on(&mut self, store: &mut dyn RowStore, clock: u64) -> ClockStats {
        let k = self.sampler.topics;
        // A worker that did not run the clock before (new here, or redoing after a rollback)
        // takes the topics the table holds; only this worker writes its tokens' rows.
        if clock == 0 || self.last_clock != clock.checked_sub(1) {
            let (rows, _) = store.rows_mut(ASSIGNMENTS);
            self.load_assignments(rows);
        }
        let ((word_topic, _), (totals_rows, _)) = store.two_rows_mut(WORD_TOPIC, TOPIC_TOTALS);
        // The job's first clock adds every token's initial topic to the counts, once.
        if clock == 0 {
            for (token, &topic) in self.tokens.iter().zip(&self.assignments) {
                let topic = usize::from(topic);
                word_topic[token.word as usize * k + topic] += 1.0;
                let row = self.totals_slots[self.doc_rows[token.doc as usize] as usize];
                totals_rows[row as usize * k + topic] += 1.0;
            }
        }
        self.sampler.totals.fill(0.0);
        for &slot in &self.totals_slots {
            let row = &totals_rows[slot as usize * k..][..k];
            for (total, &count) in self.sampler.totals.iter_mut().zip(row) {
                *total += f64::from(count);
            }
        }
        self.moves.fill(0);
        let range = pass_range(self.tokens.len(), clock, self.clocks_per_pass);
        let mut rng = Rng::stream(self.seed ^ crate::app::mix64(clock), self.shard);
        self.previous.clear();
        self.previous
            .extend_from_slice(&self.assignments[range.clone()]);
        self.sampler.sweep(
            &self.tokens[range.clone()],
            &mut self.assignments[range.clone()],
            word_topic,
            &mut self.doc_topic,
            &self.doc_rows,
            &mut self.moves,
            &mut rng,
        );
        // A row stays in [0, 2^24), so its net move does too: exact in f32.
        for (&slot, moved) in self.totals_slots.iter().zip(self.moves.chunks_exact(k)) {
            let row = &mut totals_rows[slot as usize * k..][..k];
            for (count, &delta) in row.iter_mut().zip(moved) {
                *count += delta as f32;
            }
        }
        let (rows, _) = store.rows_mut(ASSIGNMENTS);
        // Only this token's digit changes, by its own move: a value shared with another
        // worker's tokens keeps theirs, and the two deltas add up on the server. A value stays
        // below 2^24, so the sum is exact in f32.
        let places = self.assignment_value[range.clone()]
            .iter()
            .zip(&self.assignment_digit[range.clone()]);
        let topics = self.assignments[range.clone()].iter().zip(&self.previous);
        for ((&new, &old), (&value, &digit)) in topics.zip(places) {
            if new != old {
                let weight = self.digit_weights[usize::from(digit)] as f32;
                rows[value as usize] += (f32::from(new) - f32::from(old)) * weight;
            }
        }
        self.last_clock = Some(clock);
        let doc_loglik = self.doc_loglik();
        let (rows, _) = store.rows_mut(DOC_LOGLIK);
        rows[self.loglik_slot as usize] = doc_loglik as f32;
        ClockStats {
            updates: range.len() as u64,
            loss_sum: 0.0,
            loss_count: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apps::BareLoop;
    use crate::data::synthetic_corpus;

    /// Reference log p(w, z) computed from scratch with the `lda` package's formula.
    fn reference_loglik(worker: &LdaWorker, app: &LdaApp) -> f64 {
        let k = app.config.num_topics;
        let (alpha, eta) = (app.config.alpha, app.config.eta);
        let Docs::Loaded(corpus) = &app.corpus else {
            panic!("a loaded corpus")
        };
        let vocab = corpus.vocab_size;
        let mut nzw = vec![0u64; vocab * k];
        let mut nz = vec![0u64; k];
        let mut ndz = vec![0u64; corpus.docs.len() * k];
        for ((token, &z), &word) in worker
            .tokens
            .iter()
            .zip(&worker.assignments)
            .zip(&worker.words)
        {
            nzw[word as usize * k + usize::from(z)] += 1;
            nz[usize::from(z)] += 1;
            ndz[token.doc as usize * k + usize::from(z)] += 1;
        }
        let mut ll = k as f64 * ln_gamma(eta * vocab as f64);
        for &n in &nz {
            ll -= ln_gamma(eta * vocab as f64 + n as f64);
        }
        ll += nzw
            .iter()
            .filter(|&&n| n > 0)
            .map(|&n| ln_gamma(eta + n as f64) - ln_gamma(eta))
            .sum::<f64>();
        for doc in ndz.chunks_exact(k) {
            let nd: u64 = doc.iter().sum();
            ll += ln_gamma(alpha * k as f64) - ln_gamma(alpha * k as f64 + nd as f64);
            ll += doc
                .iter()
                .filter(|&&n| n > 0)
                .map(|&n| ln_gamma(alpha + n as f64) - ln_gamma(alpha))
                .sum::<f64>();
        }
        ll
    }

    /// Both draws, the dense one over blocks and the sparse one over the word's topics and the
    /// prior part, follow the collapsed conditional `(n_wk + η)(n_dk + α) / (n_k + Vη)` with
    /// the token taken out: a word and a document with zero and nonzero topics in every
    /// combination and K = 11 (a partial last block), one token drawn 200,000 times from the
    /// same state, every topic's frequency within 4.5 standard errors of its exact probability.
    /// η is large enough here that a third of the sparse draws fall in the prior part.
    #[test]
    fn the_draw_follows_the_exact_conditional() {
        for sparse_below in [0, 12] {
            draw_follows_the_exact_conditional(sparse_below);
        }
    }

    fn draw_follows_the_exact_conditional(sparse_below: usize) {
        let k = 11;
        let (alpha, eta, vocab) = (0.7f32, 0.5f32, 4.0f32);
        // Counts including the token (at topic 0); the word rows hold other workers' tokens too.
        let word_row = [3.0f32, 0.0, 0.0, 5.0, 0.0, 1.0, 0.0, 2.0, 0.0, 7.0, 1.0];
        let doc_row = [2.0f32, 1.0, 0.0, 0.0, 0.0, 3.0, 4.0, 0.0, 1.0, 0.0, 2.0];
        let totals = [10.0f64, 4.0, 6.0, 12.0, 2.0, 8.0, 9.0, 3.0, 5.0, 11.0, 4.0];
        // Word 1 (word 0 is another word of the table).
        let tokens = [Token { doc: 0, word: 1 }];
        let mut word_topic = vec![0.0f32; 2 * k];
        word_topic[k..].copy_from_slice(&word_row);
        word_topic[0] = 1.0;
        let weights: Vec<f64> = (0..k)
            .map(|t| {
                let own = if t == 0 { 1.0 } else { 0.0 };
                f64::from(word_row[t] - own + eta) * f64::from(doc_row[t] - own + alpha)
                    / (totals[t] - own as f64 + f64::from(eta * vocab))
            })
            .collect();
        let sum: f64 = weights.iter().sum();
        let mut sampler = Sampler::new(k, alpha, eta, eta * vocab);
        sampler.sparse_below = sparse_below;
        let trials = 200_000u64;
        let mut counts = vec![0u64; k];
        for trial in 0..trials {
            sampler.totals.copy_from_slice(&totals);
            let (mut words, mut doc) = (word_topic.clone(), doc_row.to_vec());
            let mut assignment = [0u16];
            let mut moves = vec![0i32; k];
            let mut rng = Rng::stream(7, trial);
            sampler.sweep(
                &tokens,
                &mut assignment,
                &mut words,
                &mut doc,
                &[0],
                &mut moves,
                &mut rng,
            );
            let new = usize::from(assignment[0]);
            counts[new] += 1;
            assert_eq!(
                words[k + new],
                word_row[new] + if new == 0 { 0.0 } else { 1.0 }
            );
            assert_eq!(moves.iter().sum::<i32>(), 0);
        }
        for t in 0..k {
            let p = weights[t] / sum;
            let frequency = counts[t] as f64 / trials as f64;
            let error = (p * (1.0 - p) / trials as f64).sqrt();
            assert!(
                (frequency - p).abs() < 4.5 * error,
                "sparse below {sparse_below}, topic {t}: drawn {frequency:.5}, exact {p:.5} \
                 (counts {counts:?})"
            );
        }
    }

    /// Seconds a sweep of the sparse and of the dense draw take on the same chain, alternated
    /// sweep by sweep after a burn-in, so a noisy host slows both alike (`cargo test --release
    /// -p ebbflow-runtime --lib sparse_and_dense -- --ignored --nocapture`).
    #[test]
    #[ignore = "a measurement: prints the seconds of each draw"]
    fn sparse_and_dense_draws_timed_on_one_chain() {
        let source = crate::data::PlantedCorpus {
            docs: 10_000,
            vocab: 10_000,
            topics: 100,
            doc_len: 100,
            alpha: 0.1,
            eta: 0.01,
            held_out: 0,
            seed: 1,
        };
        let config = LdaConfig {
            num_topics: 100,
            clocks_per_pass: Some(1),
            ..LdaConfig::default()
        };
        let app = LdaApp::planted(source, config, 2, 1, None).unwrap();
        let mut bare = BareLoop::new(&app);
        let sparse = bare.worker.sampler.sparse_below;
        for _ in 0..8 {
            let mut seconds = [0.0; 2];
            for _ in 0..5 {
                for (draw, below) in [sparse, 0].into_iter().enumerate() {
                    bare.worker.sampler.sparse_below = below;
                    let start = std::time::Instant::now();
                    bare.clock();
                    seconds[draw] += start.elapsed().as_secs_f64();
                }
            }
            println!(
                "sweeps {:>3}: sparse {:.3} s, dense {:.3} s a sweep (dense / sparse {:.2})",
                bare.clocks(),
                seconds[0] / 5.0,
                seconds[1] / 5.0,
                seconds[1] / seconds[0]
            );
        }
    }

    /// A planted corpus at scale (issue 36): each worker generates only its own documents, and
    /// its shard (tokens, first-token indices, totals rows) and the chain are those of the same
    /// corpus generated whole and loaded. A word expected to pass 2^24 / 1.25 occurrences is
    /// refused by name, and a shard that cannot fit is refused with the size it needs.
    #[test]
    fn a_planted_corpus_trains_as_the_same_corpus_loaded_and_refuses_what_cannot_be_exact() {
        let source = crate::data::PlantedCorpus {
            docs: 700,
            vocab: 300,
            topics: 6,
            doc_len: 40,
            alpha: 0.1,
            eta: 0.05,
            held_out: 100,
            seed: 4,
        };
        let config = LdaConfig {
            num_topics: 6,
            ..LdaConfig::default()
        };
        let planted = LdaApp::planted(source.clone(), config.clone(), 2, 3, None).unwrap();
        let whole = source.generate(None, 2, None).unwrap().train;
        let loaded = LdaApp::new(whole, config.clone()).unwrap();
        assert_eq!(planted.num_tokens(), loaded.num_tokens());
        assert_eq!(planted.totals_rows, loaded.totals_rows);
        for shard in 0..3 {
            let (ours, theirs) = (planted.worker(shard, 3), loaded.worker(shard, 3));
            assert_eq!(ours.words, theirs.words);
            assert_eq!(ours.doc_starts, theirs.doc_starts);
            assert_eq!(ours.doc_lengths, theirs.doc_lengths);
            assert_eq!(ours.doc_rows, theirs.doc_rows);
        }
        let run = |app: &LdaApp| {
            let mut bare = BareLoop::new(app);
            for _ in 0..5 {
                bare.clock();
            }
            app.evaluate(bare.tables())
        };
        assert_eq!(run(&planted), run(&loaded));
        let crowded = crate::data::PlantedCorpus {
            docs: 200_000,
            vocab: 2,
            topics: 2,
            doc_len: 100,
            held_out: 0,
            ..source.clone()
        };
        let error = LdaApp::planted(crowded, config.clone(), 2, 4, None).unwrap_err();
        assert!(
            error.to_string().contains("is expected to occur"),
            "{error}"
        );
        let huge = crate::data::PlantedCorpus {
            docs: 1 << 40,
            ..source
        };
        let error = LdaApp::planted(huge, config, 2, 4, Some(1 << 30)).unwrap_err();
        assert!(error.to_string().contains("shard 0 of 4"), "{error}");
    }

    #[test]
    fn topics_pack_into_exact_f32_values() {
        for (topics, per) in [(2, 24), (20, 5), (100, 3), (1000, 2), (4096, 2), (4097, 1)] {
            assert_eq!(topics_per_value(topics), per, "{topics} topics");
            assert!((topics as u64).pow(per) <= 1 << 24);
        }
        assert_eq!(topics_per_value(65_535), 1);
    }

    #[test]
    fn a_sweep_has_enough_clocks_that_stale_moves_stay_a_small_share() {
        let reuters = REFERENCE_TOKENS_PER_COUNT;
        assert_eq!(lda_clocks_per_pass(1, 3, reuters), 1);
        assert_eq!(lda_clocks_per_pass(2, 0, reuters), 16);
        assert_eq!(lda_clocks_per_pass(2, 2, reuters), 48);
        assert_eq!(lda_clocks_per_pass(7, 1, reuters), 55);
        assert_eq!(lda_clocks_per_pass(32, 2, reuters), 93);
        assert_eq!(
            lda_clocks_per_pass(64, 8, reuters),
            MAX_AUTO_CLOCKS_PER_PASS
        );
        // Sparser corpora keep reuters' share; denser ones take more, up to the cap.
        assert_eq!(lda_clocks_per_pass(2, 0, reuters / 10.0), 16);
        assert_eq!(lda_clocks_per_pass(2, 0, reuters * 4.0), 8);
        // 10 M planted tokens over 10,000 words and 100 topics: 10 tokens a count.
        assert_eq!(lda_clocks_per_pass(2, 0, 10.0), 6);
        assert_eq!(lda_clocks_per_pass(2, 0, 1e6), 4);
        assert_eq!(stale_sweep_share(f64::INFINITY), STALE_SWEEP_SHARE);
        assert_eq!(stale_sweep_share(f64::NAN), STALE_SWEEP_SHARE);
        for density in [0.01, 1.0, 3.0, 10.0, 100.0, 1e9] {
            let allowed = stale_sweep_share(density);
            assert!((STALE_SWEEP_SHARE..=MAX_STALE_SWEEP_SHARE).contains(&allowed));
            for workers in 2..40 {
                for staleness in 0..3 {
                    let clocks = lda_clocks_per_pass(workers, staleness, density) as f64;
                    let share =
                        (staleness + 1) as f64 / clocks * (workers - 1) as f64 / workers as f64;
                    assert!(
                        share <= allowed + 1e-12 || clocks as usize == MAX_AUTO_CLOCKS_PER_PASS,
                        "{workers} {staleness} {density}: {share}"
                    );
                }
            }
        }
    }

    #[test]
    fn counts_stay_consistent_and_loglik_matches_the_reference_formula() {
        let data = synthetic_corpus(60, 80, 4, 40, 0.2, 0.05, 9).unwrap();
        let app = LdaApp::new(
            data.corpus,
            LdaConfig {
                num_topics: 4,
                ..LdaConfig::default()
            },
        )
        .unwrap();
        let mut bare = BareLoop::new(&app);
        let mut history = Vec::new();
        for _ in 0..30 {
            assert_eq!(bare.clock().updates, 60 * 40);
            history.push(
                app.evaluate(bare.tables())
                    .metric("log_likelihood")
                    .unwrap(),
            );
        }
        let expected = reference_loglik(&bare.worker, &app);
        let got = *history.last().unwrap();
        assert!(
            (got - expected).abs() < 1e-6 * expected.abs(),
            "{got} vs {expected}"
        );
        assert!(history[29] > history[0], "{history:?}");
        let mut totals = [0.0f32; 4];
        bare.tables().read_row(TOPIC_TOTALS, 0, &mut totals);
        assert_eq!(totals.iter().sum::<f32>(), (60 * 40) as f32);
    }

    /// A corpus whose totals do not fit one row (here under a limit of 700 tokens instead of
    /// 2^24) splits them by document; every row counts exactly its documents' tokens, and the
    /// chain is the one a single row gives (the same draws, the same topics).
    #[test]
    fn topic_totals_split_into_rows_each_counting_its_documents() {
        let data = synthetic_corpus(60, 80, 4, 40, 0.2, 0.05, 9).unwrap();
        let config = LdaConfig {
            num_topics: 4,
            ..LdaConfig::default()
        };
        let split = LdaApp::with_count_limit(data.corpus.clone(), config.clone(), 700).unwrap();
        assert_eq!(split.totals_rows, 4, "2,400 tokens under 700 a row");
        let whole = LdaApp::new(data.corpus.clone(), config).unwrap();
        assert_eq!(whole.totals_rows, 1);
        let (mut a, mut b) = (BareLoop::new(&split), BareLoop::new(&whole));
        for _ in 0..10 {
            a.clock();
            b.clock();
        }
        assert_eq!(a.worker.assignments, b.worker.assignments);
        let loglik = |bare: &BareLoop<LdaWorker>, app: &LdaApp| {
            app.evaluate(bare.tables())
                .metric("log_likelihood")
                .unwrap()
        };
        assert_eq!(loglik(&a, &split), loglik(&b, &whole));
        let mut row = [0.0f32; 4];
        for key in 0..4u64 {
            a.tables().read_row(TOPIC_TOTALS, key, &mut row);
            let docs = data.corpus.docs.len() as u64;
            let tokens = (key..docs).step_by(4).count() as f32 * 40.0;
            assert_eq!(row.iter().sum::<f32>(), tokens, "row {key}");
        }
        let refused = LdaApp::with_count_limit(data.corpus, LdaConfig::default(), 30).unwrap_err();
        assert!(refused.to_string().contains("occurs"), "{refused}");
    }

    /// The held-out evaluator ranks the planted topics above a trained model's early topics and
    /// those above uniform topics, and training moves the model toward the truth.
    #[test]
    fn held_out_likelihood_ranks_truth_over_training_over_uniform() {
        let source = crate::data::PlantedCorpus {
            docs: 1200,
            vocab: 200,
            topics: 5,
            doc_len: 60,
            alpha: 0.1,
            eta: 0.05,
            held_out: 200,
            seed: 3,
        };
        let docs = source.generate(None, 2, None).unwrap();
        let truth: Vec<f32> = source
            .topic_words(2)
            .unwrap()
            .iter()
            .map(|&p| p as f32)
            .collect();
        let score = |phi: &[f32]| held_out_log_likelihood(phi, 5, &docs.held_out, 0.1, 2).unwrap();
        let app = LdaApp::new(
            docs.train.clone(),
            LdaConfig {
                num_topics: 5,
                ..LdaConfig::default()
            },
        )
        .unwrap();
        let mut bare = BareLoop::new(&app);
        bare.clock();
        let early = score(&app.topic_words(bare.tables()));
        for _ in 0..60 {
            bare.clock();
        }
        let trained = score(&app.topic_words(bare.tables()));
        let uniform = score(&vec![1.0 / 200.0; 5 * 200]);
        let best = score(&truth);
        assert!((uniform - (1.0f64 / 200.0).ln()).abs() < 1e-6, "{uniform}");
        assert!(
            uniform < early && early < trained && trained <= best + 0.02,
            "uniform {uniform}, 1 sweep {early}, 61 sweeps {trained}, truth {best}"
        );
        assert!(trained > best - 0.1, "61 sweeps {trained}, truth {best}");
        let wrong = held_out_log_likelihood(&truth[1..], 5, &docs.held_out, 0.1, 1).unwrap_err();
        assert!(wrong.to_string().contains("5 × 200"), "{wrong}");
    }

    #[test]
    fn invalid_configurations_are_rejected() {
        let data = synthetic_corpus(2, 5, 2, 3, 0.1, 0.1, 1).unwrap();
        let one_topic = LdaConfig {
            num_topics: 1,
            ..LdaConfig::default()
        };
        assert_eq!(
            LdaApp::new(data.corpus.clone(), one_topic)
                .unwrap_err()
                .category(),
            "config"
        );
        let empty = Corpus {
            vocab_size: 3,
            docs: vec![Vec::new()],
        };
        assert!(LdaApp::new(empty, LdaConfig::default()).is_err());
    }

    /// `model.loglikelihood() / N` of `lda==3.0.2` on reuters.ldac (K = 20, alpha = 0.1,
    /// eta = 0.01, 1500 iterations, random_state = 1), recorded with
    /// `bench/lda_peer.py --data $EBBFLOW_DATA_DIR --iterations 1500`.
    const LDA_PACKAGE_PER_TOKEN: f64 = -7.806_907;

    /// K, priors and iterations of the `lda` package's reuters example (its README).
    const REUTERS_ITERATIONS: u64 = 1500;

    fn reuters_per_token(dir: &std::path::Path) -> f64 {
        let corpus = crate::data::load_ldac(&dir.join("reuters.ldac")).unwrap();
        let vocab = crate::data::load_vocab(&dir.join("reuters.tokens")).unwrap();
        assert_eq!((corpus.docs.len(), corpus.vocab_size), (395, vocab.len()));
        let app = LdaApp::new(corpus, LdaConfig::default()).unwrap();
        let mut bare = BareLoop::new(&app);
        for _ in 0..REUTERS_ITERATIONS {
            bare.clock();
        }
        app.evaluate(bare.tables())
            .metric("per_token_log_likelihood")
            .unwrap()
    }

    fn assert_within_2_percent(ours: f64, theirs: f64) {
        let relative = (ours - theirs).abs() / theirs.abs();
        println!(
            "reuters per-token log-likelihood: ebbflow {ours:.4}, lda package {theirs:.4}, \
             relative difference {relative:.4}"
        );
        assert!(relative <= 0.02, "ours {ours}, lda package {theirs}");
    }

    /// Issue 3 quality bar, side by side: run the `lda` package (through `EBBFLOW_PYTHON`) and our
    /// sampler at the same time, compare final per-token log-likelihoods (within 2%).
    #[test]
    fn reuters_loglik_within_2_percent_of_the_lda_package_side_by_side() {
        let name = "reuters_loglik_within_2_percent_of_the_lda_package_side_by_side";
        let Some(dir) = crate::apps::test_support::data_dir_or_skip(name) else {
            return;
        };
        let Some(python) = std::env::var_os("EBBFLOW_PYTHON").filter(|p| !p.is_empty()) else {
            println!("{name}: skipped: set EBBFLOW_PYTHON (scripts/setup-python.sh)");
            return;
        };
        let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../bench/lda_peer.py");
        let peer = std::process::Command::new(python)
            .arg(&script)
            .arg("--data")
            .arg(&dir)
            .args(["--iterations", &REUTERS_ITERATIONS.to_string()])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("start the lda package peer");
        let ours = reuters_per_token(&dir);
        let output = peer.wait_with_output().expect("lda package peer runs");
        assert!(output.status.success(), "lda peer failed: {output:?}");
        let report: serde_json::Value =
            serde_json::from_slice(&output.stdout).expect("lda peer prints JSON");
        let theirs = report["per_token_log_likelihood"].as_f64().unwrap();
        assert_within_2_percent(ours, theirs);
    }

    /// The same bar against the recorded `lda` package figure, for runs without Python.
    #[test]
    fn reuters_loglik_within_2_percent_of_the_recorded_lda_package_figure() {
        let name = "reuters_loglik_within_2_percent_of_the_recorded_lda_package_figure";
        let Some(dir) = crate::apps::test_support::data_dir_or_skip(name) else {
            return;
        };
        assert_within_2_percent(reuters_per_token(&dir), LDA_PACKAGE_PER_TOKEN);
    }
}
