//! Training applications (matrix factorization, logistic regression, LDA) on the parameter server.
//!
//! Each app implements [`crate::app::App`]. Its math lives in one kernel per app that works on
//! row slices addressed by slot; the parameter-server worker runs it on a [`RowCache`], and the
//! "bare loop" baseline ([`BareLoop`]) runs the very same kernel, single-threaded, on plain dense
//! `Vec<f32>` tables with slot = key. So the bare loop and the PS differ only in what the PS adds
//! (row cache, deltas, servers), which is what the benchmark's ratio measures.

pub mod lda;
pub mod mf;
pub mod mlr;
pub mod named;

use std::sync::Arc;

use thiserror::Error;

use crate::app::{App, AppWorker, ClockStats, RowCache, TableId, TableReader, TableSpec};

pub use lda::{LdaApp, LdaConfig};
pub use mf::{MfApp, MfConfig};
pub use mlr::{MlrApp, MlrConfig};
pub use named::{NamedApp, NamedAppError, build_named_app};

/// Errors building an app from its data and configuration.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum AppsError {
    /// A hyperparameter is out of range.
    #[error("invalid {app} configuration: {what}")]
    Config {
        /// The app (`mf`, `mlr`, `lda`).
        app: &'static str,
        /// What is wrong.
        what: String,
    },
    /// The training or test data cannot be used.
    #[error("invalid {app} data: {what}")]
    Data {
        /// The app.
        app: &'static str,
        /// What is wrong.
        what: String,
    },
}

impl AppsError {
    /// Static label for metrics.
    pub fn category(&self) -> &'static str {
        match self {
            AppsError::Config { .. } => "config",
            AppsError::Data { .. } => "data",
        }
    }
}

/// The part of a worker's shard that clock `clock` works on when a pass over the shard takes
/// `clocks_per_pass` clocks: consecutive slices of (nearly) equal length, in order.
pub fn pass_slice<T>(shard: &[T], clock: u64, clocks_per_pass: usize) -> &[T] {
    &shard[pass_range(shard.len(), clock, clocks_per_pass)]
}

/// The indices of [`pass_slice`] in a shard of `len` items.
pub fn pass_range(len: usize, clock: u64, clocks_per_pass: usize) -> std::ops::Range<usize> {
    let per_pass = clocks_per_pass.max(1);
    let part = (clock % per_pass as u64) as usize;
    part * len / per_pass..(part + 1) * len / per_pass
}

/// How far the summed update of one clock may move a row, as a fraction of its distance to the
/// optimum, counting the `staleness` clocks whose updates other workers have not seen yet. Sized
/// on MovieLens 100K (BENCHMARKS.md, "Convergence at any worker count").
pub const MAX_STEP_PER_CLOCK: f64 = 1.5;

/// Clocks a pass must take so that `workers` workers, whose deltas on a shared row add up, move
/// no row further per clock than one worker's sequential SGD would: `step_per_pass` is the
/// largest fraction of its distance to the optimum one row moves in a sequential pass (for SGD,
/// the learning rate times the row's updates a pass). Others' updates arrive up to `staleness`
/// clocks late, so `staleness + 1` clocks of them count, and a worker sees its own `1 / workers`
/// at once: `B = ceil(step_per_pass · (staleness + 1) · (workers − 1) / workers /`
/// [`MAX_STEP_PER_CLOCK`]`)`, at least 1 and at most [`MAX_CLOCKS_PER_PASS`]. One worker needs
/// 1: nobody else writes.
pub fn parallel_clocks_per_pass(step_per_pass: f64, workers: usize, staleness: u64) -> usize {
    let workers = workers.max(1) as f64;
    let others = (workers - 1.0) / workers;
    let needed = step_per_pass * (staleness as f64 + 1.0) * others / MAX_STEP_PER_CLOCK;
    if needed.is_finite() && needed > 1.0 {
        (needed.ceil() as usize).min(MAX_CLOCKS_PER_PASS)
    } else {
        1
    }
}

/// The most clocks a pass is cut into: a step that needs more is one no SGD survives (a learning
/// rate of 100 on MovieLens would need thousands of clocks of a rating or two each), and every
/// clock moves the working sets; such a job diverges, and fails as such, within a pass.
pub const MAX_CLOCKS_PER_PASS: usize = 64;

/// All rows of one table as a slice, and the row width.
pub type RowsMut<'a> = (&'a mut [f32], usize);

/// Dense rows addressed by slot, as the kernels see them: a [`RowCache`] on the PS, or
/// [`DenseTables`] in the bare loop.
pub trait RowStore {
    /// All rows of `table` as one slice, and the row width.
    fn rows_mut(&mut self, table: TableId) -> RowsMut<'_>;
    /// All rows of two distinct tables at once.
    fn two_rows_mut(&mut self, a: TableId, b: TableId) -> (RowsMut<'_>, RowsMut<'_>);
}

impl RowStore for RowCache {
    fn rows_mut(&mut self, table: TableId) -> RowsMut<'_> {
        self.table_mut(table)
    }

    fn two_rows_mut(&mut self, a: TableId, b: TableId) -> (RowsMut<'_>, RowsMut<'_>) {
        self.two_tables_mut(a, b)
    }
}

/// An app worker that can also run bare: on [`DenseTables`] where a row's slot is its key.
pub trait BareWorker: AppWorker {
    /// Binds with slot = key (the dense tables hold row `key` at `key * width`).
    fn bind_dense(&mut self);
    /// One clock on any row store (the same code the PS path runs).
    fn clock_on(&mut self, store: &mut dyn RowStore, clock: u64) -> ClockStats;
}

/// Parameters held in plain dense vectors: row `key` of a table at `key * width`.
#[derive(Debug, Clone)]
pub struct DenseTables {
    specs: Vec<TableSpec>,
    data: Vec<Vec<f32>>,
}

impl DenseTables {
    /// Tables with `rows[i]` rows for `specs[i]`, each row initialised by its spec's [`RowInit`].
    ///
    /// [`RowInit`]: crate::app::RowInit
    pub fn new(specs: Vec<TableSpec>, rows: &[usize]) -> Self {
        let data = specs
            .iter()
            .zip(rows)
            .map(|(spec, &count)| {
                let mut values = vec![0.0; count * spec.width];
                for (key, row) in values.chunks_exact_mut(spec.width).enumerate() {
                    spec.init.fill(spec.id, key as u64, row);
                }
                values
            })
            .collect();
        Self { specs, data }
    }

    fn index(&self, table: TableId) -> usize {
        self.specs
            .iter()
            .position(|spec| spec.id == table)
            .unwrap_or_else(|| panic!("table {table} is not declared by the app"))
    }

    /// Total parameter bytes held.
    pub fn bytes(&self) -> usize {
        self.data.iter().map(|t| t.len() * 4).sum()
    }
}

impl RowStore for DenseTables {
    fn rows_mut(&mut self, table: TableId) -> RowsMut<'_> {
        let index = self.index(table);
        (&mut self.data[index], self.specs[index].width)
    }

    fn two_rows_mut(&mut self, a: TableId, b: TableId) -> (RowsMut<'_>, RowsMut<'_>) {
        let (ia, ib) = (self.index(a), self.index(b));
        assert!(ia != ib, "two_rows_mut needs two distinct tables");
        let (wa, wb) = (self.specs[ia].width, self.specs[ib].width);
        let (low, high) = (ia.min(ib), ia.max(ib));
        let (left, right) = self.data.split_at_mut(high);
        let (first, second) = (&mut left[low][..], &mut right[0][..]);
        if ia < ib {
            ((first, wa), (second, wb))
        } else {
            ((second, wa), (first, wb))
        }
    }
}

impl TableReader for DenseTables {
    fn width(&self, table: TableId) -> Option<usize> {
        self.specs.iter().find(|s| s.id == table).map(|s| s.width)
    }

    fn read_row(&self, table: TableId, key: u64, out: &mut [f32]) -> bool {
        let Some(index) = self.specs.iter().position(|s| s.id == table) else {
            return false;
        };
        let spec = &self.specs[index];
        if out.len() != spec.width {
            return false;
        }
        let start = key as usize * spec.width;
        match self.data[index].get(start..start + spec.width) {
            Some(row) => out.copy_from_slice(row),
            None => spec.init.fill(table, key, out),
        }
        true
    }

    fn keys(&self, table: TableId) -> Vec<u64> {
        let Some(index) = self.specs.iter().position(|s| s.id == table) else {
            return Vec::new();
        };
        (0..(self.data[index].len() / self.specs[index].width) as u64).collect()
    }
}

/// The bare-loop baseline: one worker over all the data, single-threaded, on [`DenseTables`].
pub struct BareLoop<W> {
    worker: W,
    tables: DenseTables,
    clock: u64,
}

impl<W: BareWorker> BareLoop<W> {
    /// Builds the single worker (shard 0 of 1) and dense tables covering its working set.
    pub fn new<A: App<Worker = W>>(app: &A) -> Self {
        let mut worker = app.worker(0, 1);
        let working_set = worker.working_set();
        let specs = app.tables();
        let rows: Vec<usize> = specs
            .iter()
            .map(|spec| {
                working_set
                    .keys(spec.id)
                    .last()
                    .map_or(0, |&key| key as usize + 1)
            })
            .collect();
        worker.bind_dense();
        Self {
            worker,
            tables: DenseTables::new(specs, &rows),
            clock: 0,
        }
    }

    /// Runs one clock (one pass over the data) and returns its stats.
    pub fn clock(&mut self) -> ClockStats {
        let stats = self.worker.clock_on(&mut self.tables, self.clock);
        self.clock += 1;
        stats
    }

    /// Clocks run so far.
    pub fn clocks(&self) -> u64 {
        self.clock
    }

    /// The parameters, for [`App::evaluate`].
    pub fn tables(&self) -> &DenseTables {
        &self.tables
    }
}

/// Natural log of the gamma function for `x > 0` (Lanczos, g = 7, n = 9; ~1e-15 relative).
pub fn ln_gamma(x: f64) -> f64 {
    const COEFFICIENTS: [f64; 9] = [
        0.999_999_999_999_809_9,
        676.520_368_121_885_1,
        -1_259.139_216_722_402_8,
        771.323_428_777_653_1,
        -176.615_029_162_140_6,
        12.507_343_278_686_905,
        -0.138_571_095_265_720_12,
        9.984_369_578_019_572e-6,
        1.505_632_735_149_311_6e-7,
    ];
    if x < 0.5 {
        // Reflection: Γ(x)Γ(1-x) = π / sin(πx).
        let pi = std::f64::consts::PI;
        return (pi / (pi * x).sin()).ln() - ln_gamma(1.0 - x);
    }
    let x = x - 1.0;
    let mut sum = COEFFICIENTS[0];
    for (i, c) in COEFFICIENTS.iter().enumerate().skip(1) {
        sum += c / (x + i as f64);
    }
    let t = x + 7.5;
    0.5 * (2.0 * std::f64::consts::PI).ln() + (x + 0.5) * t.ln() - t + sum.ln()
}

/// An app's test set: held from the start, or generated at the first evaluation. A node process
/// only trains (the coordinator evaluates), so a planted app's node never holds its test set.
#[derive(Clone)]
pub(crate) enum TestData<T> {
    /// Held from the start.
    Held(Arc<T>),
    /// Generated by `generate` when first asked for.
    Lazy {
        generate: Arc<dyn Fn() -> T + Send + Sync>,
        generated: Arc<std::sync::OnceLock<T>>,
    },
}

impl<T> TestData<T> {
    /// Generated at the first evaluation by `generate` (which must not fail: the app checks its
    /// sizes when it is built).
    pub(crate) fn lazy(generate: impl Fn() -> T + Send + Sync + 'static) -> Self {
        TestData::Lazy {
            generate: Arc::new(generate),
            generated: Arc::default(),
        }
    }

    /// The test set, generating it the first time.
    pub(crate) fn get(&self) -> &T {
        match self {
            TestData::Held(test) => test,
            TestData::Lazy {
                generate,
                generated,
            } => generated.get_or_init(|| generate()),
        }
    }
}

impl<T> std::fmt::Debug for TestData<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TestData::Held(_) => f.write_str("TestData::Held"),
            TestData::Lazy { generated, .. } => f
                .debug_struct("TestData::Lazy")
                .field("generated", &generated.get().is_some())
                .finish(),
        }
    }
}

#[cfg(test)]
pub(crate) mod test_support {
    //! Shared helpers for the apps' tests.

    use std::path::PathBuf;

    /// The real-data directory, or `None` after printing why the test is skipped.
    pub(crate) fn data_dir_or_skip(test: &str) -> Option<PathBuf> {
        let dir = crate::data::data_dir();
        if dir.is_none() {
            println!("{test}: skipped: set EBBFLOW_DATA_DIR (scripts/fetch-data.sh)");
        }
        dir
    }
}

/// Runs `kernel` compiled for the widest vector instructions this CPU has, chosen at run time
/// by [`pulp`] (AVX-512 or AVX2 on x86-64, NEON on aarch64, the build's baseline otherwise).
/// The release build targets baseline x86-64, whose vectors hold four `f32`; a loop the
/// compiler vectorizes runs on eight or sixteen here. Only the instructions change, not the
/// arithmetic: Rust never fuses a multiply and an add, and the kernels fix the order of their
/// sums, so every path gives the same bits (test `a_pass_gives_the_same_bits_wide_and_narrow`).
///
/// A kernel is a struct whose `with_simd` is `#[inline(always)]` and holds the loop: only code
/// inlined into it is compiled wide, and a closure's body is not inlined there (measured: the
/// call stayed, compiled narrow), hence `#[inline(always)]` on [`dot`] and the SGD steps too.
/// Call it once for a stretch of work (a pass, a block), not per element.
pub(crate) fn wide<K: pulp::WithSimd>(kernel: K) -> K::Output {
    pulp::Arch::new().dispatch(kernel)
}

/// `a · b` with [`DOT_LANES`] independent partial sums: one running sum makes every
/// multiply-add wait for the previous one (about 4 cycles each, 128 for rank 32); many let them
/// overlap and vectorize (MF's prediction, MLR's logits). Thirty-two fill two AVX-512 registers,
/// four AVX2 or eight SSE2 ones, so even the widest path keeps two sums in flight; with eight
/// (one AVX2 register) the dot was half of MF's step at rank 1000 under AVX-512.
#[inline(always)]
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut sums = [0.0f32; DOT_LANES];
    let (a_chunks, b_chunks) = (a.chunks_exact(DOT_LANES), b.chunks_exact(DOT_LANES));
    let tail: f32 = a_chunks
        .remainder()
        .iter()
        .zip(b_chunks.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in a_chunks.zip(b_chunks) {
        for k in 0..DOT_LANES {
            sums[k] += x[k] * y[k];
        }
    }
    fold_lanes(sums) + tail
}

/// Partial sums of [`dot`] and of the kernels that sum like it.
pub(crate) const DOT_LANES: usize = 32;

/// The sum of [`DOT_LANES`] partial sums, pairwise by halves: the order is fixed, whatever
/// vector width runs it.
#[inline(always)]
pub(crate) fn fold_lanes(mut sums: [f32; DOT_LANES]) -> f32 {
    let mut width = DOT_LANES;
    while width > 1 {
        width /= 2;
        for k in 0..width {
            sums[k] += sums[k + width];
        }
    }
    sums[0]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pass_of_slices_covers_the_shard_once_in_order() {
        let shard: Vec<u32> = (0..103).collect();
        for per_pass in [1, 2, 7, 103, 200] {
            let mut seen = Vec::new();
            for clock in 0..per_pass as u64 {
                seen.extend_from_slice(pass_slice(&shard, clock, per_pass));
            }
            assert_eq!(seen, shard, "{per_pass} clocks a pass");
            // The next pass starts over.
            assert_eq!(
                pass_slice(&shard, per_pass as u64, per_pass),
                pass_slice(&shard, 0, per_pass)
            );
        }
    }

    #[test]
    fn clocks_a_pass_grow_with_the_step_the_workers_and_the_staleness() {
        // One worker needs no slicing: nobody else writes its rows.
        assert_eq!(parallel_clocks_per_pass(5.9, 1, 2), 1);
        // MovieLens 100K (learning rate 0.01, most rated row 590 ratings), SSP 2.
        assert_eq!(parallel_clocks_per_pass(5.9, 2, 2), 6);
        assert_eq!(parallel_clocks_per_pass(5.9, 4, 2), 9);
        assert_eq!(parallel_clocks_per_pass(5.9, 18, 2), 12);
        assert_eq!(parallel_clocks_per_pass(5.9, 32, 2), 12);
        // BSP needs fewer.
        assert_eq!(parallel_clocks_per_pass(5.9, 4, 0), 3);
        // A small step needs none; nonsense is 1.
        assert_eq!(parallel_clocks_per_pass(0.5, 32, 0), 1);
        assert_eq!(parallel_clocks_per_pass(f64::NAN, 8, 1), 1);
        // A step no SGD survives is not cut into thousands of clocks.
        assert_eq!(
            parallel_clocks_per_pass(59_000.0, 18, 2),
            MAX_CLOCKS_PER_PASS
        );
    }

    #[test]
    fn ln_gamma_matches_known_values() {
        let cases = [
            (1.0, 0.0),
            (2.0, 0.0),
            (0.5, std::f64::consts::PI.sqrt().ln()),
            (10.0, 362_880f64.ln()),
            (0.01, 4.599_479_878_042_022),
            (1e5, 1_051_287.708_973_656_6),
        ];
        for (x, expected) in cases {
            let got = ln_gamma(x);
            assert!(
                (got - expected).abs() <= 1e-10 * expected.abs().max(1.0),
                "ln_gamma({x}) = {got}, expected {expected}"
            );
        }
    }

    #[test]
    fn dense_tables_read_and_split_borrows() {
        use crate::app::RowInit;
        let specs = vec![
            TableSpec {
                id: 4,
                name: "a".into(),
                width: 2,
                init: RowInit::Zeros,
            },
            TableSpec {
                id: 1,
                name: "b".into(),
                width: 1,
                init: RowInit::Uniform {
                    low: 1.0,
                    high: 2.0,
                    seed: 3,
                },
            },
        ];
        let mut tables = DenseTables::new(specs, &[3, 2]);
        let ((b, wb), (a, wa)) = tables.two_rows_mut(1, 4);
        assert_eq!((b.len(), wb, a.len(), wa), (2, 1, 6, 2));
        a[3] = 7.0;
        let mut row = [0.0; 2];
        assert!(tables.read_row(4, 1, &mut row));
        assert_eq!(row, [0.0, 7.0]);
        let mut one = [0.0; 1];
        assert!(
            tables.read_row(1, 9, &mut one),
            "unmaterialised rows read as their init"
        );
        assert!((1.0..2.0).contains(&one[0]));
        assert!(!tables.read_row(9, 0, &mut one));
        assert_eq!(tables.keys(1), vec![0, 1]);
        assert_eq!(tables.bytes(), 32);
    }
}
