//! Matrix factorization by SGD with biases: `r̂(u, i) = μ + b_u + b_i + p_u · q_i`.
//!
//! Tables: [`USERS`] and [`ITEMS`], one row per id of width `rank + 1` (column 0 the bias, then
//! the factors). A clock is a slice of a pass over the worker's ratings (a pass takes
//! [`App::clocks_per_pass`] clocks); the learning rate decays geometrically per pass. Test
//! quality is RMSE with predictions clipped to the training range.
//!
//! Why a clock is smaller than a pass: workers share user and item rows, and each runs SGD from
//! the same rows; their deltas are summed. A row updated `n` times a pass at learning rate `η`
//! moves by about `η·n` of its distance to the optimum in one sequential pass; if each of `W`
//! workers did a whole pass before the sum, a popular row's `W` deltas would each go most of the
//! way and together overshoot by up to `W` times (MovieLens 100K: `η·n` = 5.9 for the most
//! rated user, and 4 workers diverged). With `B` clocks a pass, every row's summed move per
//! clock is at most `η·n / B` whatever `W` is, and a pass still makes the progress of a
//! sequential pass. What other workers did arrives up to `staleness` clocks late, so `B` is
//! sized for `η·n·(staleness + 1)` (see [`parallel_clocks_per_pass`]).

use std::sync::Arc;

use crate::app::{
    App, AppWorker, ClockStats, RowCache, RowInit, TableId, TableReader, TableSpec, WorkingSet,
};
use crate::data::{DataError, Planted as _, PlantedRatings, Rating, Ratings};

use super::{
    AppsError, BareWorker, DOT_LANES, RowStore, TestData, dot, fold_lanes,
    parallel_clocks_per_pass, pass_range, wide,
};

/// Table of user rows (bias, factors).
pub const USERS: TableId = 0;
/// Table of item rows (bias, factors).
pub const ITEMS: TableId = 1;

/// Hyperparameters of matrix factorization.
#[derive(Debug, Clone, PartialEq)]
pub struct MfConfig {
    /// Number of latent factors.
    pub rank: usize,
    /// Learning rate of the first clock.
    pub learning_rate: f32,
    /// Multiplicative learning-rate decay per pass over the data (1 = constant), applied
    /// continuously: clock `c` runs at `learning_rate * decay^(c / clocks_per_pass)`.
    pub decay: f32,
    /// L2 regularisation of biases and factors.
    pub regularization: f32,
    /// Standard deviation of the initial biases and factors.
    pub init_std: f32,
    /// Seed of the initial parameters.
    pub seed: u64,
    /// Clocks per pass over the data, or `None` to size it from the data, the learning rate,
    /// the worker count and `staleness` ([`parallel_clocks_per_pass`]): clock `c` is slice
    /// `c % clocks_per_pass` of each worker's shard.
    pub clocks_per_pass: Option<usize>,
    /// The job's SSP staleness (0 = BSP), which sizes the clocks when `clocks_per_pass` is
    /// `None`.
    pub staleness: u64,
    /// Lay each worker's shard out in blocks of users × items ([`block_order`]) so that the
    /// rows a stretch of updates touches stay in cache: 3.3× the updates/s of the random order
    /// at 25 M ratings, where the rows are far larger than the cache. Off by default (small
    /// data fits in cache anyway); on for planted data at scale.
    pub blocked: bool,
    /// Threads one worker's clock runs on. Above 1 the shard is laid out in strata of blocks
    /// ([`stratified_order`]; `blocked` is implied): the blocks of a stratum share no user and no
    /// item, so the threads update them at once without a lock, as LIBMF's threads do, and the
    /// result is the same whatever the number of threads. A process with one worker of `n`
    /// threads moves one copy of its rows a clock, where `n` workers of a thread each move
    /// theirs.
    pub threads: usize,
    /// Adaptive steps, LIBMF's adaptive SGD (AdaGrad by row): every user and item row keeps
    /// `G` in an extra last column, from 1, adding at each of its updates the mean square of its
    /// gradient (bias and factors), and steps by `learning_rate / √G` (`decay` still applies).
    /// The sums add up as the steps do, so workers' deltas to them merge like any other. At
    /// rank 1000 on 25 M planted ratings it reaches the bar in fewer passes than a decaying
    /// rate: see BENCHMARKS.md.
    pub adaptive: bool,
}

impl MfConfig {
    /// Values a row: the bias, the factors and, with [`MfConfig::adaptive`], its `G`.
    pub fn width(&self) -> usize {
        self.rank + 1 + usize::from(self.adaptive)
    }
}

impl Default for MfConfig {
    fn default() -> Self {
        Self {
            rank: 32,
            learning_rate: 0.01,
            decay: 0.92,
            regularization: 0.05,
            init_std: 0.1,
            seed: 1,
            clocks_per_pass: None,
            staleness: 0,
            blocked: false,
            threads: 1,
            adaptive: false,
        }
    }
}

/// Where the workers' training ratings come from.
#[derive(Debug, Clone)]
enum TrainSet {
    /// Loaded (or generated) in full: a worker copies its shard out of it.
    Loaded(Arc<Ratings>),
    /// Generated by each worker, its shard only ([`PlantedRatings::generate`]), on `threads`
    /// threads: a node never holds the ratings of shards it does not train.
    Planted {
        source: Arc<PlantedRatings>,
        threads: usize,
    },
}

/// Matrix factorization over a training and a test set of ratings.
#[derive(Debug, Clone)]
pub struct MfApp {
    config: MfConfig,
    train: TrainSet,
    test: TestData<Ratings>,
    mean: f32,
    clip: (f32, f32),
    /// Ratings of the most rated user or item (updates of one row per pass).
    max_row_updates: usize,
}

impl MfApp {
    /// Builds the app; the global mean and the clipping range come from the training set.
    pub fn new(train: Ratings, test: Ratings, config: MfConfig) -> Result<Self, AppsError> {
        check_config(&config)?;
        if train.entries.is_empty() {
            return Err(AppsError::Data {
                app: "mf",
                what: "the training set has no ratings".into(),
            });
        }
        Ok(Self {
            max_row_updates: max_row_updates(&train.entries, 1.0),
            mean: train.mean() as f32,
            clip: value_range(&train.entries),
            config,
            train: TrainSet::Loaded(Arc::new(train)),
            test: TestData::Held(Arc::new(test)),
        })
    }

    /// Matrix factorization of planted ratings at any size: each worker generates its own shard
    /// when it is created, on `threads` threads. The global mean, the clipping range and the
    /// busiest row's ratings are estimated from the test set, which is generated here for that
    /// and dropped, then generated again at the first evaluation (a node process never
    /// evaluates). Refused before anything is generated when the test set and one shard of `shards`
    /// would not fit in `memory_limit` bytes.
    pub fn planted(
        source: PlantedRatings,
        config: MfConfig,
        threads: usize,
        shards: usize,
        memory_limit: Option<u64>,
    ) -> Result<Self, AppsError> {
        let data = |error: DataError| AppsError::Data {
            app: "mf",
            what: error.to_string(),
        };
        source
            .fits(Some((0, shards.max(1))), memory_limit)
            .map_err(data)?;
        check_config(&config)?;
        let test = source.generate_test(threads).map_err(data)?.test;
        if test.entries.is_empty() {
            return Err(AppsError::Data {
                app: "mf",
                what: "the planted test set has no ratings (a test fraction of 0?)".into(),
            });
        }
        let scale = 1.0 / source.test_fraction.max(f64::MIN_POSITIVE);
        let source = Arc::new(source);
        let threads = threads.max(1);
        Ok(Self {
            max_row_updates: max_row_updates(&test.entries, scale),
            mean: test.mean() as f32,
            clip: value_range(&test.entries),
            config,
            train: TrainSet::Planted {
                source: source.clone(),
                threads,
            },
            test: TestData::lazy(move || {
                source
                    .generate_test(threads)
                    .expect("planted sizes are validated by MfApp::planted")
                    .test
            }),
        })
    }

    /// The same data with other hyperparameters (validated as in [`MfApp::new`]).
    pub fn with_config(&self, config: MfConfig) -> Result<Self, AppsError> {
        check_config(&config)?;
        Ok(Self {
            config,
            ..self.clone()
        })
    }

    /// Number of training ratings (updates per clock over all workers).
    pub fn train_len(&self) -> usize {
        match &self.train {
            TrainSet::Loaded(train) => train.entries.len(),
            TrainSet::Planted { source, .. } => source.train_len() as usize,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &MfConfig {
        &self.config
    }

    /// The same app with a pass split into `clocks_per_pass` clocks (instead of the count
    /// [`App::clocks_per_pass`] derives from the worker count).
    pub fn with_clocks_per_pass(mut self, clocks_per_pass: usize) -> Result<Self, AppsError> {
        if clocks_per_pass == 0 {
            return Err(AppsError::Config {
                app: "mf",
                what: "clocks per pass must be > 0".into(),
            });
        }
        self.config.clocks_per_pass = Some(clocks_per_pass);
        Ok(self)
    }

    /// The same app with a learning rate decaying by `decay` per pass.
    pub fn with_decay(mut self, decay: f32) -> Result<Self, AppsError> {
        if !(decay > 0.0) {
            return Err(AppsError::Config {
                app: "mf",
                what: format!("decay must be > 0, got {decay}"),
            });
        }
        self.config.decay = decay;
        Ok(self)
    }
}

/// The hyperparameters [`MfApp::new`] accepts.
fn check_config(config: &MfConfig) -> Result<(), AppsError> {
    let bad = |what: String| Err(AppsError::Config { app: "mf", what });
    if config.rank == 0 {
        return bad("rank must be > 0".into());
    }
    if config.clocks_per_pass == Some(0) {
        return bad("clocks per pass must be > 0".into());
    }
    if !(1..=BLOCK_BINS as usize).contains(&config.threads) {
        return bad(format!(
            "threads of a worker must be 1 to {BLOCK_BINS} (a stratum's blocks), got {}",
            config.threads
        ));
    }
    if !(config.learning_rate > 0.0 && config.decay > 0.0 && config.regularization >= 0.0) {
        return bad(format!(
            "learning rate and decay must be > 0 and regularization >= 0, got {config:?}"
        ));
    }
    Ok(())
}

impl MfApp {
    /// Users and items in the id space of the training and test sets.
    fn id_space(&self) -> (u32, u32) {
        let (num_users, num_items) = match &self.train {
            TrainSet::Loaded(train) => (train.num_users, train.num_items),
            TrainSet::Planted { source, .. } => (source.users, source.items),
        };
        match &self.test {
            TestData::Held(test) => (test.num_users.max(num_users), test.num_items.max(num_items)),
            // generated with the same users and items
            TestData::Lazy { .. } => (num_users, num_items),
        }
    }
}

/// Item bins of [`block_order`]; its user bins are at least this many, and at least the
/// workers.
pub const BLOCK_BINS: u32 = 20;

/// Orders a worker's shard by blocks of (user bin, item bin), as LIBMF lays out its data: the
/// rows of one block fit in cache. Worker `shard` of `shards` starts at user bin
/// `shard × user_bins / shards`, so at any clock the workers update different users (each
/// user's ratings in a shard are done within the clocks of its bin, and no other worker is in
/// that bin then); every clock still spans all item bins, so an item's updates are spread over
/// the pass as in the random order. The order inside a block is the in-place sort's (the shard
/// arrives in random order): a stable sort would allocate half the shard again.
pub fn block_order(
    ratings: &mut [Rating],
    num_users: u32,
    num_items: u32,
    shard: usize,
    shards: usize,
) {
    let user_bins = u64::from(BLOCK_BINS).max(shards as u64);
    let item_bins = u64::from(BLOCK_BINS);
    let start = shard as u64 * user_bins / shards.max(1) as u64;
    let (users, items) = (u64::from(num_users.max(1)), u64::from(num_items.max(1)));
    ratings.sort_unstable_by_key(|r| {
        let user_bin = u64::from(r.user) * user_bins / users;
        let item_bin = u64::from(r.item) * item_bins / items;
        ((user_bin + user_bins - start) % user_bins, item_bin)
    });
}

/// The bin of `id` among [`BLOCK_BINS`] equal bins of an id space of `space` ids.
fn bin_of(id: u32, space: u32) -> u64 {
    u64::from(id) * u64::from(BLOCK_BINS) / u64::from(space.max(1))
}

/// The stratum worker `shard` of `shards` starts at in [`stratified_order`].
fn first_stratum(shard: usize, shards: usize) -> usize {
    shard * BLOCK_BINS as usize / shards.max(1)
}

/// Orders a worker's shard in strata of blocks for a clock on several threads: with `B` =
/// [`BLOCK_BINS`] bins of users and of items, block (user bin `u`, item bin `i`) is in stratum
/// `(i - u) mod B`, and a stratum's `B` blocks, in user-bin order, have pairwise distinct users
/// and items (DSGD's strata; LIBMF's threads pick such blocks as they go). Worker `shard` of
/// `shards` starts at stratum `shard × B / shards`. Returns the first rating of every block,
/// stratum by stratum, and the shard's end.
pub fn stratified_order(
    ratings: &mut [Rating],
    num_users: u32,
    num_items: u32,
    shard: usize,
    shards: usize,
) -> Vec<usize> {
    let bins = u64::from(BLOCK_BINS);
    let start = first_stratum(shard, shards) as u64;
    let block = |r: &Rating| {
        let user_bin = bin_of(r.user, num_users);
        let item_bin = bin_of(r.item, num_items);
        let stratum = (item_bin + bins - user_bin) % bins;
        ((stratum + bins - start) % bins) * bins + user_bin
    };
    ratings.sort_unstable_by_key(block);
    let mut starts: Vec<usize> = (0..bins * bins)
        .map(|b| ratings.partition_point(|r| block(r) < b))
        .collect();
    starts.push(ratings.len());
    starts
}

/// Ratings of the most rated user or item, times `scale` (a sample's count to the whole's).
fn max_row_updates(ratings: &[Rating], scale: f64) -> usize {
    let size = |id: fn(&Rating) -> u32| ratings.iter().map(id).max().map_or(0, |m| m as usize + 1);
    let mut users = vec![0usize; size(|r| r.user)];
    let mut items = vec![0usize; size(|r| r.item)];
    for rating in ratings {
        users[rating.user as usize] += 1;
        items[rating.item as usize] += 1;
    }
    let most = users.iter().chain(&items).copied().max().unwrap_or(0);
    (most as f64 * scale).round() as usize
}

/// The smallest and largest rating.
fn value_range(ratings: &[Rating]) -> (f32, f32) {
    ratings
        .iter()
        .fold((f32::INFINITY, f32::NEG_INFINITY), |(lo, hi), r| {
            (lo.min(r.value), hi.max(r.value))
        })
}

/// What an SGD step needs besides the rating and its two rows.
#[derive(Debug, Clone, Copy)]
struct Step {
    /// The global mean rating.
    mean: f32,
    learning_rate: f32,
    regularization: f32,
    /// [`MfConfig::adaptive`]: the rows' last column is their `G`.
    adaptive: bool,
}

/// One SGD pass over `ratings` (user and item fields are slots); returns the summed squared
/// training error seen before each update.
fn sgd_pass(
    ratings: &[Rating],
    (users, items): (&mut [f32], &mut [f32]),
    width: usize,
    step: Step,
) -> f64 {
    wide(SgdRun {
        ratings,
        users: Dense(users, width),
        items: Dense(items, width),
        step,
    })
}

/// SGD over ratings in order, as one kernel for [`wide`]; returns the summed squared error
/// seen before each update.
struct SgdRun<'a, U, I> {
    ratings: &'a [Rating],
    users: U,
    items: I,
    step: Step,
}

/// The rows of one table a run of SGD updates, by slot.
trait Rows {
    fn row(&mut self, slot: u32) -> &mut [f32];
}

/// A table's rows laid end to end, of the given width.
struct Dense<'a>(&'a mut [f32], usize);

impl Rows for Dense<'_> {
    #[inline(always)]
    fn row(&mut self, slot: u32) -> &mut [f32] {
        &mut self.0[slot as usize * self.1..][..self.1]
    }
}

impl Rows for &mut RowRefs<'_> {
    #[inline(always)]
    fn row(&mut self, slot: u32) -> &mut [f32] {
        self[slot as usize]
            .as_deref_mut()
            .expect("a block's rows are its thread's")
    }
}

impl<U: Rows, I: Rows> pulp::WithSimd for SgdRun<'_, U, I> {
    type Output = f64;

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(mut self, _: S) -> f64 {
        let mut squared_error = 0.0f64;
        for rating in self.ratings {
            let user = self.users.row(rating.user);
            let item = self.items.row(rating.item);
            squared_error += if self.step.adaptive {
                adaptive_step(rating.value, user, item, self.step)
            } else {
                sgd_step(rating.value, user, item, self.step)
            };
        }
        squared_error
    }
}

/// The ratings `range` of a stratified shard ([`stratified_order`], which started at stratum
/// `first`) on `threads` threads: stratum by stratum, thread `t` takes the stratum's blocks `b`
/// with `b mod threads = t` (their part within `range`), each block one sequential SGD pass,
/// and gets the rows of those blocks only (`bins`: the user bin of every user slot and the item
/// bin of every item slot, [`NO_BIN`] for none). The blocks of a stratum share no row, so the
/// result is that of any order of them, the same at any thread count; the squared error is
/// summed in block order.
#[allow(clippy::too_many_arguments)]
fn stratified_pass(
    ratings: &[Rating],
    blocks: &[usize],
    first: usize,
    range: std::ops::Range<usize>,
    threads: usize,
    (users, items): (&mut [f32], &mut [f32]),
    bins: (&[u8], &[u8]),
    width: usize,
    step: Step,
) -> f64 {
    let count = BLOCK_BINS as usize;
    let threads = threads.clamp(1, count);
    let mut total = 0.0f64;
    for position in 0..count {
        let parts: Vec<std::ops::Range<usize>> = (0..count)
            .map(|b| {
                let (start, end) = (
                    blocks[position * count + b],
                    blocks[position * count + b + 1],
                );
                start.max(range.start)..end.min(range.end).max(start.max(range.start))
            })
            .collect();
        if parts.iter().all(|p| p.is_empty()) {
            continue;
        }
        // Block `u` of the stratum holds user bin `u` and item bin `(u + stratum) mod count`.
        let stratum = (position + first) % count;
        let mut rows: Vec<(RowRefs<'_>, RowRefs<'_>)> = (0..threads)
            .map(|_| {
                (
                    (0..users.len() / width).map(|_| None).collect(),
                    (0..items.len() / width).map(|_| None).collect(),
                )
            })
            .collect();
        for (slot, row) in users.chunks_exact_mut(width).enumerate() {
            if let Some(&bin) = bins.0.get(slot).filter(|&&b| b != NO_BIN) {
                rows[usize::from(bin) % threads].0[slot] = Some(row);
            }
        }
        for (slot, row) in items.chunks_exact_mut(width).enumerate() {
            if let Some(&bin) = bins.1.get(slot).filter(|&&b| b != NO_BIN) {
                let block = (usize::from(bin) + count - stratum) % count;
                rows[block % threads].1[slot] = Some(row);
            }
        }
        let work = |t: usize, (mut users, mut items): (RowRefs<'_>, RowRefs<'_>)| {
            let mut errors = Vec::new();
            for (b, part) in parts.iter().enumerate().skip(t).step_by(threads) {
                let run = SgdRun {
                    ratings: &ratings[part.clone()],
                    users: &mut users,
                    items: &mut items,
                    step,
                };
                errors.push((b, wide(run)));
            }
            errors
        };
        let mut errors = vec![0.0f64; count];
        std::thread::scope(|scope| {
            let mut rows = rows.drain(..).enumerate();
            let own = rows.next().expect("one thread at least");
            let helpers: Vec<_> = rows
                .map(|(t, rows)| scope.spawn(move || work(t, rows)))
                .collect();
            for (b, error) in work(own.0, own.1) {
                errors[b] = error;
            }
            for helper in helpers {
                for (b, error) in helper.join().expect("an SGD thread panicked") {
                    errors[b] = error;
                }
            }
        });
        total += errors.iter().sum::<f64>();
    }
    total
}

/// Rows of a table one thread of [`stratified_pass`] may update, by slot.
type RowRefs<'a> = Vec<Option<&'a mut [f32]>>;

/// The bin of a slot no rating refers to.
const NO_BIN: u8 = u8::MAX;

/// One SGD step on a rating; returns its squared error before the step.
#[inline(always)]
fn sgd_step(
    value: f32,
    user: &mut [f32],
    item: &mut [f32],
    Step {
        mean,
        learning_rate,
        regularization,
        ..
    }: Step,
) -> f64 {
    let prediction = mean + user[0] + item[0] + dot(&user[1..], &item[1..]);
    let error = value - prediction;
    user[0] += learning_rate * (error - regularization * user[0]);
    item[0] += learning_rate * (error - regularization * item[0]);
    // p + η(e·q − λ·p) as (1 − ηλ)·p + ηe·q: two multiplies and an add a factor, not three
    // and two
    let (keep, pull) = (1.0 - learning_rate * regularization, learning_rate * error);
    for (p, q) in user[1..].iter_mut().zip(&mut item[1..]) {
        let (old_p, old_q) = (*p, *q);
        *p = keep * old_p + pull * old_q;
        *q = keep * old_q + pull * old_p;
    }
    f64::from(error * error)
}

/// One adaptive SGD step ([`MfConfig::adaptive`]) on a rating, the rows' last column their `G`;
/// returns the squared error before the step. The squared gradients are summed in
/// [`DOT_LANES`] partial sums, as [`dot`] sums, so the loop vectorizes and its bits do not
/// depend on the width.
#[inline(always)]
fn adaptive_step(value: f32, user: &mut [f32], item: &mut [f32], step: Step) -> f64 {
    let last = user.len() - 1;
    let prediction = step.mean + user[0] + item[0] + dot(&user[1..last], &item[1..last]);
    let error = value - prediction;
    let (rate_user, rate_item) = (
        step.learning_rate / user[last].sqrt(),
        step.learning_rate / item[last].sqrt(),
    );
    let lambda = step.regularization;
    // gradients of ½e² + ½λ(‖user‖² + ‖item‖²), bias first
    let (user_bias, item_bias) = (lambda * user[0] - error, lambda * item[0] - error);
    user[0] -= rate_user * user_bias;
    item[0] -= rate_item * item_bias;
    let (mut user_sums, mut item_sums) = ([0.0f32; DOT_LANES], [0.0f32; DOT_LANES]);
    let (mut user_tail, mut item_tail) = (user_bias * user_bias, item_bias * item_bias);
    let update = |p: &mut f32, q: &mut f32| {
        let (old_p, old_q) = (*p, *q);
        let (gp, gq) = (
            lambda * old_p - error * old_q,
            lambda * old_q - error * old_p,
        );
        *p = old_p - rate_user * gp;
        *q = old_q - rate_item * gq;
        (gp * gp, gq * gq)
    };
    let mut users = user[1..last].chunks_exact_mut(DOT_LANES);
    let mut items = item[1..last].chunks_exact_mut(DOT_LANES);
    for (p, q) in (&mut users).zip(&mut items) {
        for k in 0..DOT_LANES {
            let (gp2, gq2) = update(&mut p[k], &mut q[k]);
            user_sums[k] += gp2;
            item_sums[k] += gq2;
        }
    }
    for (p, q) in users
        .into_remainder()
        .iter_mut()
        .zip(items.into_remainder())
    {
        let (gp2, gq2) = update(p, q);
        user_tail += gp2;
        item_tail += gq2;
    }
    // the mean over the bias and the factors
    let coordinates = last as f32;
    user[last] += (fold_lanes(user_sums) + user_tail) / coordinates;
    item[last] += (fold_lanes(item_sums) + item_tail) / coordinates;
    f64::from(error * error)
}

impl App for MfApp {
    type Worker = MfWorker;

    fn tables(&self) -> Vec<TableSpec> {
        let (std, seed) = (self.config.init_std, self.config.seed);
        let init = if self.config.adaptive {
            RowInit::NormalWithLast {
                std,
                seed,
                last: 1.0,
            }
        } else {
            RowInit::Normal { std, seed }
        };
        let width = self.config.width();
        vec![
            TableSpec {
                id: USERS,
                name: "mf_users".into(),
                width,
                init,
            },
            TableSpec {
                id: ITEMS,
                name: "mf_items".into(),
                width,
                init,
            },
        ]
    }

    fn worker(&self, shard: usize, num_shards: usize) -> MfWorker {
        let num_shards = num_shards.max(1);
        let mut ratings: Vec<Rating> = match &self.train {
            TrainSet::Loaded(train) => train
                .entries
                .iter()
                .skip(shard)
                .step_by(num_shards)
                .copied()
                .collect(),
            TrainSet::Planted { source, threads } => {
                // the sizes were checked when the app was built, and memory at its creation
                source
                    .generate_shard(shard % num_shards, num_shards, *threads, None)
                    .expect("planted sizes are validated by MfApp::planted")
                    .entries
            }
        };
        let (num_users, num_items) = self.id_space();
        let mut blocks = Vec::new();
        let first_stratum = first_stratum(shard, num_shards);
        if self.config.threads > 1 {
            blocks = stratified_order(&mut ratings, num_users, num_items, shard, num_shards);
        } else if self.config.blocked {
            block_order(&mut ratings, num_users, num_items, shard, num_shards);
        }
        MfWorker {
            clocks_per_pass: self.clocks_per_pass(num_shards),
            ratings,
            bound: None,
            mean: self.mean,
            config: self.config.clone(),
            blocks,
            first_stratum,
            id_space: (num_users, num_items),
            bins: (Vec::new(), Vec::new()),
        }
    }

    /// The configured number, or [`parallel_clocks_per_pass`] of this data, learning rate and
    /// staleness.
    fn clocks_per_pass(&self, workers: usize) -> usize {
        self.config.clocks_per_pass.unwrap_or_else(|| {
            parallel_clocks_per_pass(
                f64::from(self.config.learning_rate) * self.max_row_updates as f64,
                workers,
                self.config.staleness,
            )
        })
    }

    fn evaluate(&self, tables: &dyn TableReader) -> crate::app::EvalReport {
        let width = self.config.width();
        let factors = 1..=self.config.rank;
        let read_all = |table: TableId, count: u32| {
            let mut values = vec![0.0f32; count as usize * width];
            for (key, row) in values.chunks_exact_mut(width).enumerate() {
                tables.read_row(table, key as u64, row);
            }
            values
        };
        let (num_users, num_items) = self.id_space();
        let users = read_all(USERS, num_users);
        let items = read_all(ITEMS, num_items);
        let test = self.test.get();
        let mut squared_error = 0.0f64;
        for rating in &test.entries {
            let user = &users[rating.user as usize * width..][..width];
            let item = &items[rating.item as usize * width..][..width];
            let prediction = (self.mean
                + user[0]
                + item[0]
                + dot(&user[factors.clone()], &item[factors.clone()]))
            .clamp(self.clip.0, self.clip.1);
            squared_error += f64::from(rating.value - prediction).powi(2);
        }
        let rmse = (squared_error / test.entries.len().max(1) as f64).sqrt();
        crate::app::EvalReport {
            loss: rmse,
            metrics: vec![("rmse".into(), rmse)],
        }
    }
}

/// A worker's shard of ratings, held once: with their original ids until the first binding,
/// then with ids replaced by slots, each slot's id kept in [`Bound`].
#[derive(Debug, Clone)]
pub struct MfWorker {
    ratings: Vec<Rating>,
    bound: Option<Bound>,
    mean: f32,
    config: MfConfig,
    clocks_per_pass: usize,
    /// With threads: the first rating of every block of [`stratified_order`], and the end;
    /// the stratum it starts at; the id space; and the bin of every bound user and item slot.
    blocks: Vec<usize>,
    first_stratum: usize,
    id_space: (u32, u32),
    bins: (Vec<u8>, Vec<u8>),
}

/// The original id of each slot the ratings refer to, per table (`u32::MAX`: no rating's).
#[derive(Debug, Clone)]
struct Bound {
    users: Vec<u32>,
    items: Vec<u32>,
}

const NO_ID: u32 = u32::MAX;

impl MfWorker {
    /// The original (user, item) of a rating.
    fn ids(&self, rating: &Rating) -> (u32, u32) {
        match &self.bound {
            None => (rating.user, rating.item),
            Some(bound) => (
                bound.users[rating.user as usize],
                bound.items[rating.item as usize],
            ),
        }
    }

    fn bind_with(&mut self, slot: impl Fn(TableId, u64) -> u32) {
        let mut next = Bound {
            users: Vec::new(),
            items: Vec::new(),
        };
        let remember = |ids: &mut Vec<u32>, slot: u32, id: u32| {
            if ids.len() <= slot as usize {
                ids.resize(slot as usize + 1, NO_ID);
            }
            ids[slot as usize] = id;
        };
        // each id's slot looked up once (the lookup hashes; a shard at scale has tens of
        // millions of ratings over far fewer ids)
        let mut memo = [Vec::<u32>::new(), Vec::<u32>::new()];
        let mut slot_of = |table: TableId, id: u32| {
            let ids = &mut memo[usize::from(table == ITEMS)];
            if ids.len() <= id as usize {
                ids.resize(id as usize + 1, NO_ID);
            }
            if ids[id as usize] == NO_ID {
                ids[id as usize] = slot(table, u64::from(id));
            }
            ids[id as usize]
        };
        for i in 0..self.ratings.len() {
            let (user, item) = self.ids(&self.ratings[i]);
            let (user_slot, item_slot) = (slot_of(USERS, user), slot_of(ITEMS, item));
            remember(&mut next.users, user_slot, user);
            remember(&mut next.items, item_slot, item);
            self.ratings[i].user = user_slot;
            self.ratings[i].item = item_slot;
        }
        if !self.blocks.is_empty() {
            let bin = |ids: &[u32], space: u32| -> Vec<u8> {
                ids.iter()
                    .map(|&id| match id {
                        NO_ID => NO_BIN,
                        id => bin_of(id, space) as u8,
                    })
                    .collect()
            };
            self.bins = (
                bin(&next.users, self.id_space.0),
                bin(&next.items, self.id_space.1),
            );
        }
        self.bound = Some(next);
    }
}

impl AppWorker for MfWorker {
    fn working_set(&self) -> WorkingSet {
        let mut set = WorkingSet::new();
        let ids = |ids: &[u32]| {
            ids.iter()
                .filter(|&&id| id != NO_ID)
                .map(|&id| u64::from(id))
                .collect::<Vec<_>>()
        };
        match &self.bound {
            None => {
                // distinct ids through a bitmap: sorting every rating's id took seconds at scale
                let distinct = |id: fn(&Rating) -> u32| {
                    let mut seen = Vec::<bool>::new();
                    for rating in &self.ratings {
                        let id = id(rating) as usize;
                        if seen.len() <= id {
                            seen.resize(id + 1, false);
                        }
                        seen[id] = true;
                    }
                    seen.iter()
                        .enumerate()
                        .filter(|(_, seen)| **seen)
                        .map(|(id, _)| id as u64)
                        .collect::<Vec<_>>()
                };
                set.add_keys(USERS, distinct(|r| r.user));
                set.add_keys(ITEMS, distinct(|r| r.item));
            }
            Some(bound) => {
                set.add_keys(USERS, ids(&bound.users));
                set.add_keys(ITEMS, ids(&bound.items));
            }
        }
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

impl BareWorker for MfWorker {
    fn bind_dense(&mut self) {
        self.bind_with(|_, key| key as u32);
    }

    fn clock_on(&mut self, store: &mut dyn RowStore, clock: u64) -> ClockStats {
        let ((users, width), (items, _)) = store.two_rows_mut(USERS, ITEMS);
        let per_pass = self.clocks_per_pass;
        let learning_rate =
            self.config.learning_rate * self.config.decay.powf(clock as f32 / per_pass as f32);
        let range = pass_range(self.ratings.len(), clock, per_pass);
        let step = Step {
            mean: self.mean,
            learning_rate,
            regularization: self.config.regularization,
            adaptive: self.config.adaptive,
        };
        let squared_error = if self.blocks.is_empty() {
            sgd_pass(&self.ratings[range.clone()], (users, items), width, step)
        } else {
            stratified_pass(
                &self.ratings,
                &self.blocks,
                self.first_stratum,
                range.clone(),
                self.config.threads,
                (users, items),
                (&self.bins.0, &self.bins.1),
                width,
                step,
            )
        };
        ClockStats {
            updates: range.len() as u64,
            loss_sum: squared_error,
            loss_count: range.len() as u64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apps::BareLoop;
    use crate::apps::test_support::data_dir_or_skip;
    use crate::data::{PlantedRatings, load_movielens_inter, synthetic_ratings};

    /// Ratings over `users` × `items` and rows of `width` drawn for them, both tables.
    fn kernel_inputs(
        users: u32,
        items: u32,
        count: usize,
        width: usize,
    ) -> (Vec<Rating>, Vec<f32>, Vec<f32>) {
        let ratings = synthetic_ratings(users, items, 4, count, 0.1, 5)
            .unwrap()
            .ratings
            .entries;
        let init = RowInit::NormalWithLast {
            std: 0.1,
            seed: 3,
            last: 1.0,
        };
        let rows = |table: TableId, count: u32| {
            let mut values = vec![0.0f32; count as usize * width];
            for (key, row) in values.chunks_exact_mut(width).enumerate() {
                init.fill(table, key as u64, row);
            }
            values
        };
        (ratings, rows(USERS, users), rows(ITEMS, items))
    }

    /// A pass of SGD on the rows, compiled for the widest vectors this CPU has or for the
    /// build's baseline.
    fn kernel_pass(
        ratings: &[Rating],
        (users, items): (&mut [f32], &mut [f32]),
        width: usize,
        (widest, adaptive): (bool, bool),
    ) -> f64 {
        let run = SgdRun {
            ratings,
            users: Dense(users, width),
            items: Dense(items, width),
            step: Step {
                mean: 3.5,
                learning_rate: 0.01,
                regularization: 0.05,
                adaptive,
            },
        };
        if widest {
            wide(run)
        } else {
            pulp::WithSimd::with_simd(run, pulp::Scalar::new())
        }
    }

    #[test]
    fn a_pass_gives_the_same_bits_wide_and_narrow() {
        // an odd rank: the dot's remainder and the update loop's tail run too (adaptive rows
        // hold one value more)
        for adaptive in [false, true] {
            let width = 38;
            let (ratings, users, items) = kernel_inputs(300, 200, 20_000, width);
            let (mut wide_users, mut wide_items) = (users.clone(), items.clone());
            let (mut narrow_users, mut narrow_items) = (users, items);
            for _ in 0..3 {
                let wide_error = kernel_pass(
                    &ratings,
                    (&mut wide_users, &mut wide_items),
                    width,
                    (true, adaptive),
                );
                let narrow_error = kernel_pass(
                    &ratings,
                    (&mut narrow_users, &mut narrow_items),
                    width,
                    (false, adaptive),
                );
                assert_eq!(wide_error.to_bits(), narrow_error.to_bits());
            }
            let bits = |values: &[f32]| values.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(&wide_users),
                bits(&narrow_users),
                "adaptive {adaptive}"
            );
            assert_eq!(
                bits(&wide_items),
                bits(&narrow_items),
                "adaptive {adaptive}"
            );
        }
    }

    #[test]
    fn an_adaptive_step_follows_libmf_s_rule() {
        // rank 40: a chunk of the partial sums and a remainder
        let rank = 40;
        let user: Vec<f32> = (0..rank + 2)
            .map(|c| {
                if c == rank + 1 {
                    2.5
                } else {
                    0.01 * c as f32 - 0.1
                }
            })
            .collect();
        let item: Vec<f32> = (0..rank + 2)
            .map(|c| {
                if c == rank + 1 {
                    1.5
                } else {
                    0.2 - 0.007 * c as f32
                }
            })
            .collect();
        let step = Step {
            mean: 3.0,
            learning_rate: 0.1,
            regularization: 0.05,
            adaptive: true,
        };
        let (mut new_user, mut new_item) = (user.clone(), item.clone());
        let squared_error = adaptive_step(4.0, &mut new_user, &mut new_item, step);
        // the rule in f64, term by term
        let f = |v: &[f32]| v.iter().map(|&x| f64::from(x)).collect::<Vec<_>>();
        let (u, i) = (f(&user), f(&item));
        let prediction = 3.0 + u[0] + i[0] + (1..=rank).map(|c| u[c] * i[c]).sum::<f64>();
        let error = 4.0 - prediction;
        assert!((squared_error - error * error).abs() < 1e-5);
        let lambda = 0.05f64;
        for (own, other, new) in [(&u, &i, &new_user), (&i, &u, &new_item)] {
            let rate = 0.1 / own[rank + 1].sqrt();
            let mut squares = 0.0;
            for c in 0..=rank {
                // the bias's gradient pulls with 1, a factor's with the other row's factor
                let pull = if c == 0 { 1.0 } else { other[c] };
                let g = lambda * own[c] - error * pull;
                squares += g * g;
                let want = own[c] - rate * g;
                assert!((f64::from(new[c]) - want).abs() < 1e-6, "column {c}");
            }
            let g_sum = own[rank + 1] + squares / (rank + 1) as f64;
            assert!((f64::from(new[rank + 1]) - g_sum).abs() < 1e-5);
        }
    }

    /// A measurement, not a check: `cargo test --release -p ebbflow-runtime --lib
    /// kernel_widest_against -- --ignored --nocapture`. Rank 1000, on the rows of one block of
    /// 5 M ratings at the Netflix shape and on rows that fit in L2.
    #[test]
    #[ignore = "a measurement: run it with --ignored --nocapture"]
    fn kernel_widest_against_baseline_timed() {
        let width = 1001;
        // one block's rows (9 MB), and rows that fit in L2 (1.2 MB)
        for (users, items) in [(1_200, 900), (200, 100)] {
            let (ratings, mut users, mut items) = kernel_inputs(users, items, 200_000, width);
            let mut seconds = [Vec::new(), Vec::new()];
            for round in 0..10 {
                let widest = round % 2 == 0;
                let start = std::time::Instant::now();
                kernel_pass(&ratings, (&mut users, &mut items), width, (widest, false));
                seconds[usize::from(widest)].push(start.elapsed().as_secs_f64());
            }
            let mean = |s: &[f64]| s.iter().sum::<f64>() / s.len() as f64;
            let (baseline, widest) = (mean(&seconds[0]), mean(&seconds[1]));
            println!(
                "rank 1000, {} updates a pass: baseline {:.2} M updates/s, widest {:.2} M updates/s, \
             widest ÷ baseline {:.2}",
                ratings.len(),
                ratings.len() as f64 / baseline / 1e6,
                ratings.len() as f64 / widest / 1e6,
                baseline / widest
            );
        }
    }

    fn train_bare(app: &MfApp, clocks: u64) -> f64 {
        let mut bare = BareLoop::new(app);
        for _ in 0..clocks {
            bare.clock();
        }
        app.evaluate(bare.tables()).loss
    }

    #[test]
    fn synthetic_low_rank_ratings_reach_near_the_noise_floor() {
        let data = synthetic_ratings(300, 200, 4, 40_000, 0.3, 11).unwrap();
        let (train, test) = data.ratings.split(0.2, 5).unwrap();
        let config = MfConfig {
            rank: 8,
            learning_rate: 0.02,
            decay: 0.97,
            regularization: 0.02,
            ..MfConfig::default()
        };
        let app = MfApp::new(train, test, config).unwrap();
        let untrained = train_bare(&app, 0);
        let rmse = train_bare(&app, 60);
        assert!(untrained > 0.9, "untrained rmse {untrained}");
        assert!(
            rmse < data.noise_std + 0.15,
            "rmse {rmse}, noise {}",
            data.noise_std
        );
    }

    #[test]
    fn invalid_configurations_are_rejected() {
        let data = synthetic_ratings(5, 5, 1, 50, 0.1, 1).unwrap();
        let (train, test) = data.ratings.split(0.2, 1).unwrap();
        let zero_rank = MfConfig {
            rank: 0,
            ..MfConfig::default()
        };
        let error = MfApp::new(train.clone(), test.clone(), zero_rank).unwrap_err();
        assert_eq!(error.category(), "config");
        for threads in [0, 21] {
            let config = MfConfig {
                threads,
                ..MfConfig::default()
            };
            let error = MfApp::new(train.clone(), test.clone(), config).unwrap_err();
            assert!(error.to_string().contains("threads"), "{error}");
        }
        let empty = Ratings {
            entries: Vec::new(),
            ..train
        };
        assert!(MfApp::new(empty, test, MfConfig::default()).is_err());
    }

    /// Issue 3 quality bar: MovieLens 100K, seeded 80/20 split, test RMSE <= 0.95.
    #[test]
    fn movielens_100k_bare_loop_reaches_rmse_0_95() {
        let Some(dir) = data_dir_or_skip("movielens_100k_bare_loop_reaches_rmse_0_95") else {
            return;
        };
        let ratings = load_movielens_inter(&dir.join("ml-100k.inter")).unwrap();
        assert_eq!(ratings.entries.len(), 100_000);
        let (train, test) = ratings.split(0.2, 42).unwrap();
        let app = MfApp::new(train, test, MfConfig::default()).unwrap();
        let rmse = train_bare(&app, 30);
        println!("movielens 100k bare loop: test rmse {rmse:.4}");
        assert!(rmse <= 0.95, "test rmse {rmse}");
    }

    fn planted() -> PlantedRatings {
        PlantedRatings {
            users: 400,
            items: 300,
            ratings: 150_000,
            true_rank: 4,
            noise: 0.2,
            test_fraction: 0.1,
            seed: 3,
        }
    }

    /// A planted app's workers generate exactly the shards a loaded copy of the same ratings
    /// hands out, and it trains to near the noise floor.
    #[test]
    fn planted_workers_generate_their_own_shards_and_train_to_the_noise_floor() {
        let source = planted();
        let config = MfConfig {
            rank: 8,
            learning_rate: 0.02,
            decay: 0.95,
            regularization: 0.02,
            ..MfConfig::default()
        };
        let app = MfApp::planted(source.clone(), config.clone(), 2, 3, None).unwrap();
        let all = source.generate(None, 2, None).unwrap();
        let loaded = MfApp::new(all.train.clone(), all.test.clone(), config).unwrap();
        assert_eq!(app.train_len(), all.train.entries.len());
        for shard in 0..3 {
            assert_eq!(
                app.worker(shard, 3).ratings,
                loaded.worker(shard, 3).ratings
            );
        }
        let rmse = train_bare(&app, 40);
        assert!(
            rmse < source.noise + 0.1,
            "rmse {rmse}, noise {}",
            source.noise
        );
        let refused = MfApp::planted(source, MfConfig::default(), 1, 1, Some(1000)).unwrap_err();
        assert!(refused.to_string().contains("GiB"), "{refused}");
    }

    /// Binding again (the cache's slots changed) keeps the shard's ids and working set.
    #[test]
    fn a_worker_rebinds_without_a_second_copy_of_its_ratings() {
        let data = synthetic_ratings(50, 40, 2, 500, 0.1, 1).unwrap();
        let app = MfApp::new(data.ratings.clone(), data.ratings, MfConfig::default()).unwrap();
        let mut worker = app.worker(0, 2);
        let before = worker.working_set();
        let original: Vec<(u32, u32)> = worker.ratings.iter().map(|r| worker.ids(r)).collect();
        worker.bind_with(|_, key| key as u32 * 3 + 1);
        worker.bind_with(|_, key| 1000 - key as u32);
        let after: Vec<(u32, u32)> = worker.ratings.iter().map(|r| worker.ids(r)).collect();
        assert_eq!(original, after);
        assert_eq!(worker.ratings[0].user, 1000 - original[0].0);
        assert_eq!(format!("{before:?}"), format!("{:?}", worker.working_set()));
    }

    /// Blocked order is a permutation of the shard, by rotated user bin then item bin, the
    /// shard's own order kept inside a block; a planted app trains to the noise floor in it.
    #[test]
    fn blocked_order_lays_shards_out_in_rotated_blocks_and_still_trains() {
        let data = synthetic_ratings(400, 100, 2, 5000, 0.1, 9).unwrap();
        let mut ratings = data.ratings.entries.clone();
        block_order(&mut ratings, 400, 100, 1, 2);
        let key = |r: &Rating| (r.user, r.item, r.value.to_bits());
        let (mut a, mut b): (Vec<_>, Vec<_>) = (
            ratings.iter().map(key).collect(),
            data.ratings.entries.iter().map(key).collect(),
        );
        a.sort_unstable();
        b.sort_unstable();
        assert_eq!(a, b, "a permutation");
        // shard 1 of 2 starts at user bin 10 of 20 (users 200..220), and wraps around
        assert!((200..220).contains(&ratings[0].user), "{:?}", ratings[0]);
        assert!(ratings.last().unwrap().user < 200);
        let bins: Vec<(u32, u32)> = ratings
            .iter()
            .map(|r| (((r.user / 20) + 10) % 20, r.item / 5))
            .collect();
        assert!(bins.windows(2).all(|w| w[0] <= w[1]), "ordered by block");

        let config = MfConfig {
            rank: 8,
            learning_rate: 0.02,
            decay: 0.95,
            regularization: 0.02,
            blocked: true,
            ..MfConfig::default()
        };
        let source = planted();
        let app = MfApp::planted(source.clone(), config, 2, 1, None).unwrap();
        let rmse = train_bare(&app, 40);
        assert!(rmse < source.noise + 0.1, "rmse {rmse}");
    }

    /// A worker's clock on threads: the strata's blocks share no user and no item, the threads
    /// leave every value bit for bit where one thread does (1, 2, 3 and 20 threads, a clock
    /// cutting through strata), and it trains.
    #[test]
    fn a_clock_on_threads_updates_disjoint_blocks_and_ends_where_one_thread_does() {
        let (users, items) = (400u32, 100u32);
        let data = synthetic_ratings(users, items, 2, 5000, 0.1, 9).unwrap();
        let mut ratings = data.ratings.entries.clone();
        let blocks = stratified_order(&mut ratings, users, items, 1, 2);
        assert_eq!(blocks.len(), 20 * 20 + 1);
        assert_eq!(*blocks.last().unwrap(), ratings.len());
        for stratum in 0..20 {
            let (mut seen_users, mut seen_items) = (vec![None; 400], vec![None; 100]);
            for b in 0..20 {
                for r in &ratings[blocks[stratum * 20 + b]..blocks[stratum * 20 + b + 1]] {
                    for (seen, id) in [(&mut seen_users, r.user), (&mut seen_items, r.item)] {
                        let owner = seen[id as usize].get_or_insert(b);
                        assert_eq!(*owner, b, "stratum {stratum}: id {id} in two blocks");
                    }
                }
            }
        }
        let width = 5;
        let bin = |id: u32, space: u32| (u64::from(id) * 20 / u64::from(space)) as u8;
        let bins: (Vec<u8>, Vec<u8>) = (
            (0..users).map(|u| bin(u, users)).collect(),
            (0..items).map(|i| bin(i, items)).collect(),
        );
        let start: Vec<f32> = (0..(users + items) as usize * width)
            .map(|i| ((i * 7919) % 101) as f32 / 1000.0)
            .collect();
        let train = |threads: usize, range: std::ops::Range<usize>| {
            let mut tables = start.clone();
            let (u, i) = tables.split_at_mut(users as usize * width);
            let error = stratified_pass(
                &ratings,
                &blocks,
                10,
                range,
                threads,
                (u, i),
                (&bins.0, &bins.1),
                width,
                Step {
                    mean: 3.0,
                    learning_rate: 0.02,
                    regularization: 0.02,
                    adaptive: false,
                },
            );
            (tables, error)
        };
        let slice = ratings.len() / 3..ratings.len() * 2 / 3;
        let one = train(1, slice.clone());
        assert_ne!(one.0, start);
        for threads in [2, 3, 20] {
            let many = train(threads, slice.clone());
            assert!(
                one.0 == many.0 && one.1.to_bits() == many.1.to_bits(),
                "{threads} threads"
            );
        }
        assert_eq!(train(2, 0..0).0, start, "an empty clock changes nothing");

        let config = MfConfig {
            rank: 8,
            learning_rate: 0.02,
            decay: 0.95,
            regularization: 0.02,
            threads: 2,
            ..MfConfig::default()
        };
        let source = planted();
        let app = MfApp::planted(source.clone(), config, 2, 1, None).unwrap();
        let rmse = train_bare(&app, 40);
        assert!(rmse < source.noise + 0.1, "rmse {rmse}");
    }
}
