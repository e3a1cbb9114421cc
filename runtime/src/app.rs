//! The interface between ML applications and the parameter-server runtime.
//!
//! An application owns its data and its math; the runtime owns the parameters. The contract:
//!
//! 1. [`App::tables`] declares the parameter tables: fixed-width `f32` rows keyed by `u64`, each
//!    with a deterministic initialiser ([`RowInit`]) so any server can materialise any row without
//!    coordination (and a row migrated or rebuilt after a rollback gets the same initial value).
//! 2. [`App::worker`] builds the worker for one data shard (one worker thread per shard).
//! 3. [`AppWorker::working_set`] declares, once, every key of every table the worker will touch
//!    (IterStore's pre-built prefetch batch). The runtime registers that batch with the servers
//!    once, so every clock after that moves only values, in one bulk batch per partition.
//! 4. The runtime builds a [`RowCache`] holding exactly those rows in dense `Vec<f32>`s and calls
//!    [`AppWorker::bind`] so the worker translates its keys into slots once; the inner loop then
//!    indexes plain slices (no hashing, no locking, no allocation).
//! 5. Every clock, [`AppWorker::clock`] mutates rows of the cache in place. Writes are visible to
//!    the same worker immediately (read-my-writes). At the clock boundary the runtime computes
//!    `delta = current - snapshot` per row, sends the deltas to the servers, and refreshes the cache
//!    as stale-synchronous parallel (SSP) consistency requires: with staleness `s`, the cache at
//!    clock `t` reflects every update of every worker from clocks `<= t - s - 1`, plus all of this
//!    worker's own updates.
//! 6. [`App::evaluate`] computes test quality on the full parameters ([`TableReader`]).
//!
//! Rows are only ever combined by addition (or by the server-side optimizer applied to the summed
//! delta), so apps express updates as changes to rows. Integer-valued apps (counts in LDA, the
//! [`crate::exact`] test app) stay exact as long as values stay below 2^24.

use std::collections::BTreeMap;

use thiserror::Error;

/// Identifies a parameter table within a job.
pub type TableId = u32;

/// Declaration of one parameter table.
#[derive(Debug, Clone, PartialEq)]
pub struct TableSpec {
    /// Table id, unique within the job.
    pub id: TableId,
    /// Human-readable name (logs and metrics only).
    pub name: String,
    /// Number of `f32` values per row (> 0).
    pub width: usize,
    /// How a row that has never been written is initialised.
    pub init: RowInit,
}

/// Deterministic initial value of a row, a pure function of `(seed, table, key, column)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RowInit {
    /// All zeros.
    Zeros,
    /// Uniform in `[low, high)`.
    Uniform {
        /// Inclusive lower bound.
        low: f32,
        /// Exclusive upper bound.
        high: f32,
        /// Seed of the deterministic generator.
        seed: u64,
    },
    /// Normal with mean 0 and the given standard deviation.
    Normal {
        /// Standard deviation.
        std: f32,
        /// Seed of the deterministic generator.
        seed: u64,
    },
    /// As [`RowInit::Normal`] in every column but the last, which is `last` (MF's adaptive
    /// step keeps a row's sum of squared gradients there, from 1).
    NormalWithLast {
        /// Standard deviation.
        std: f32,
        /// Seed of the deterministic generator.
        seed: u64,
        /// The last column's value.
        last: f32,
    },
    /// Every value is `key mod modulus` (LDA's initial topic of token `key`).
    KeyModulo {
        /// The modulus (> 0; exact in `f32` below 2^24).
        modulus: u64,
    },
    /// Value `c` of row `key` packs `per_value` digits in base `modulus`: digit `j` is
    /// `(p · per_value + j) mod modulus` for position `p = key · width + c` (LDA's initial topics
    /// of consecutive tokens, `per_value` of them a value). `modulus^per_value` must stay
    /// within 2^24 so every value is an exact `f32`.
    PackedModulo {
        /// The base and modulus (> 0).
        modulus: u64,
        /// Digits a value (>= 1).
        per_value: u32,
    },
}

/// SplitMix64 finaliser: a fast, well-mixed 64-bit hash.
pub(crate) fn mix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Uniform in `[0, 1)` from 24 well-mixed bits (exactly representable in `f32`).
fn unit_f32(bits: u64) -> f32 {
    (bits >> 40) as f32 / (1u64 << 24) as f32
}

impl RowInit {
    /// Writes the initial value of row `key` of table `table` into `out` (one row, any width).
    pub fn fill(&self, table: TableId, key: u64, out: &mut [f32]) {
        match *self {
            RowInit::Zeros => out.fill(0.0),
            RowInit::KeyModulo { modulus } => out.fill((key % modulus.max(1)) as f32),
            RowInit::PackedModulo { modulus, per_value } => {
                let (modulus, per) = (modulus.max(1), u64::from(per_value.max(1)));
                let first = key.wrapping_mul(out.len() as u64);
                for (column, value) in out.iter_mut().enumerate() {
                    let position = first.wrapping_add(column as u64).wrapping_mul(per);
                    let packed = (0..per).rev().fold(0u64, |packed, digit| {
                        packed * modulus + position.wrapping_add(digit) % modulus
                    });
                    *value = packed as f32;
                }
            }
            RowInit::Uniform { low, high, seed } => {
                let base = mix64(seed ^ mix64(u64::from(table) ^ mix64(key)));
                for (column, value) in out.iter_mut().enumerate() {
                    let u = unit_f32(mix64(base.wrapping_add(column as u64)));
                    *value = low + (high - low) * u;
                }
            }
            RowInit::NormalWithLast { std, seed, last } => {
                RowInit::Normal { std, seed }.fill(table, key, out);
                if let Some(value) = out.last_mut() {
                    *value = last;
                }
            }
            RowInit::Normal { std, seed } => {
                let base = mix64(seed ^ mix64(u64::from(table) ^ mix64(key)));
                // Box-Muller in f32, both of its normals (cos and sin) from one hash: MF's
                // initial rows at rank 1000 are 137 M values, and one f64 log and cosine a
                // value took seconds of the first clock. Two 24-bit uniforms, u1 in (0, 1].
                let unit = 1.0 / (1u32 << 24) as f32;
                for (pair, values) in out.chunks_mut(2).enumerate() {
                    let bits = mix64(base.wrapping_add(pair as u64));
                    let u1 = ((bits >> 40) as f32 + 1.0) * unit;
                    let u2 = ((bits >> 16) & 0xff_ffff) as f32 * unit;
                    let radius = (-2.0 * u1.ln()).sqrt() * std;
                    let (sin, cos) = (std::f32::consts::TAU * u2).sin_cos();
                    values[0] = radius * cos;
                    if let Some(value) = values.get_mut(1) {
                        *value = radius * sin;
                    }
                }
            }
        }
    }
}

/// Errors building or using the app interface types.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum AppError {
    /// A table id was declared twice.
    #[error("table {table} declared twice")]
    DeclareTable {
        /// The duplicated id.
        table: TableId,
    },
    /// A table was declared with width 0.
    #[error("table {table} declared with width 0")]
    DeclareWidth {
        /// The offending table.
        table: TableId,
    },
    /// A working set names a table the app did not declare.
    #[error("working set names undeclared table {table}")]
    LookupTable {
        /// The unknown table.
        table: TableId,
    },
}

impl AppError {
    /// Static label for metrics.
    pub fn category(&self) -> &'static str {
        match self {
            AppError::DeclareTable { .. } => "declare_table",
            AppError::DeclareWidth { .. } => "declare_width",
            AppError::LookupTable { .. } => "lookup_table",
        }
    }
}

/// Checks a job's table declarations: unique ids, non-zero widths.
pub fn validate_tables(specs: &[TableSpec]) -> Result<(), AppError> {
    let mut seen = std::collections::BTreeSet::new();
    for spec in specs {
        if !seen.insert(spec.id) {
            return Err(AppError::DeclareTable { table: spec.id });
        }
        if spec.width == 0 {
            return Err(AppError::DeclareWidth { table: spec.id });
        }
    }
    Ok(())
}

/// The keys of each table a worker touches, declared once (IterStore's pre-built prefetch batch).
///
/// Keys are kept sorted and deduplicated per table; insertion order does not matter.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WorkingSet {
    tables: BTreeMap<TableId, Vec<u64>>,
}

impl WorkingSet {
    /// An empty working set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds the given keys of `table` (duplicates are fine).
    pub fn add_keys(&mut self, table: TableId, keys: impl IntoIterator<Item = u64>) {
        let entry = self.tables.entry(table).or_default();
        entry.extend(keys);
        entry.sort_unstable();
        entry.dedup();
    }

    /// Adds keys `0..count` of `table` (a dense table such as LDA's word-topic counts).
    pub fn add_range(&mut self, table: TableId, count: u64) {
        self.add_keys(table, 0..count);
    }

    /// Sorted, deduplicated keys of `table` (empty if none).
    pub fn keys(&self, table: TableId) -> &[u64] {
        self.tables.get(&table).map_or(&[], Vec::as_slice)
    }

    /// Tables with at least one key, in id order.
    pub fn tables(&self) -> impl Iterator<Item = (TableId, &[u64])> {
        self.tables
            .iter()
            .map(|(table, keys)| (*table, keys.as_slice()))
    }

    /// Total number of rows over all tables.
    pub fn len(&self) -> usize {
        self.tables.values().map(Vec::len).sum()
    }

    /// True if no table has a key.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One table's part of a [`RowCache`].
#[derive(Debug, Clone)]
pub(crate) struct CacheTable {
    pub(crate) id: TableId,
    pub(crate) width: usize,
    /// Key of each slot. Slots are grouped by partition (runtime's choice), so each partition's
    /// rows form one contiguous slot range and the bulk copies at clock boundaries are memcpys.
    pub(crate) slot_keys: Vec<u64>,
    /// `(key, slot)` sorted by key, for [`RowCache::slot`].
    pub(crate) by_key: Vec<(u64, u32)>,
    /// Current values, `slot_keys.len() * width`, mutated by the app.
    pub(crate) data: Vec<f32>,
    /// Values as of the last synchronisation; `data - snapshot` is this clock's delta.
    pub(crate) snapshot: Vec<f32>,
}

/// A worker's dense row cache: exactly the rows of its [`WorkingSet`], one `Vec<f32>` per table.
///
/// Slots are assigned once when the cache is built and never change, so apps translate keys into
/// slots in [`AppWorker::bind`] and index rows directly in the inner loop.
#[derive(Debug, Clone)]
pub struct RowCache {
    pub(crate) tables: Vec<CacheTable>,
    /// Position in `tables` by table id (ids are small; absent ids map to `usize::MAX`).
    pub(crate) position: Vec<usize>,
}

impl RowCache {
    /// Builds a cache for `working_set`, initialising rows from the table specs. `partition_of`
    /// orders slots so each partition's rows are contiguous; within a partition, by key.
    pub(crate) fn build(
        specs: &[TableSpec],
        working_set: &WorkingSet,
        partition_of: impl Fn(u64) -> u32,
    ) -> Result<Self, AppError> {
        for (table, _) in working_set.tables() {
            if !specs.iter().any(|spec| spec.id == table) {
                return Err(AppError::LookupTable { table });
            }
        }
        let max_id = specs.iter().map(|spec| spec.id as usize).max().unwrap_or(0);
        let mut position = vec![usize::MAX; max_id + 1];
        let mut tables = Vec::with_capacity(specs.len());
        for spec in specs {
            let mut slot_keys = working_set.keys(spec.id).to_vec();
            slot_keys.sort_by_key(|&key| (partition_of(key), key));
            let mut by_key: Vec<(u64, u32)> = slot_keys
                .iter()
                .enumerate()
                .map(|(slot, &key)| (key, slot as u32))
                .collect();
            by_key.sort_unstable();
            let mut data = vec![0.0; slot_keys.len() * spec.width];
            for (row, &key) in data.chunks_exact_mut(spec.width).zip(&slot_keys) {
                spec.init.fill(spec.id, key, row);
            }
            position[spec.id as usize] = tables.len();
            tables.push(CacheTable {
                id: spec.id,
                width: spec.width,
                slot_keys,
                by_key,
                snapshot: data.clone(),
                data,
            });
        }
        Ok(Self { tables, position })
    }

    /// A cache with no tables (a placeholder while the real one is lent out).
    pub fn empty() -> Self {
        Self {
            tables: Vec::new(),
            position: Vec::new(),
        }
    }

    /// Undoes every change since the last synchronisation: this clock sends no delta.
    pub fn discard_changes(&mut self) {
        for table in &mut self.tables {
            table.data.copy_from_slice(&table.snapshot);
        }
    }

    /// Ids of the cache's tables, in declaration order.
    pub fn table_ids(&self) -> impl Iterator<Item = TableId> + '_ {
        self.tables.iter().map(|t| t.id)
    }

    fn table(&self, table: TableId) -> Option<&CacheTable> {
        let index = *self.position.get(table as usize)?;
        self.tables.get(index)
    }

    fn table_index(&self, table: TableId) -> usize {
        let index = self
            .position
            .get(table as usize)
            .copied()
            .unwrap_or(usize::MAX);
        assert!(
            index != usize::MAX,
            "table {table} is not declared by the app"
        );
        index
    }

    /// Slot of `key` in `table`, or `None` if the key is not in the working set.
    pub fn slot(&self, table: TableId, key: u64) -> Option<u32> {
        let table = self.table(table)?;
        let found = table.by_key.binary_search_by_key(&key, |&(k, _)| k).ok()?;
        Some(table.by_key[found].1)
    }

    /// Key held in `slot` of `table`.
    ///
    /// # Panics
    /// If the table is not declared or the slot is out of range (a bug in the app).
    pub fn key(&self, table: TableId, slot: u32) -> u64 {
        self.tables[self.table_index(table)].slot_keys[slot as usize]
    }

    /// Number of rows (slots) of `table` in this cache.
    pub fn len(&self, table: TableId) -> usize {
        self.table(table).map_or(0, |t| t.slot_keys.len())
    }

    /// Width of `table`'s rows, or `None` if the table is not declared.
    pub fn width(&self, table: TableId) -> Option<usize> {
        self.table(table).map(|t| t.width)
    }

    /// Row in `slot` of `table`.
    ///
    /// # Panics
    /// If the table is not declared or the slot is out of range (a bug in the app).
    pub fn row(&self, table: TableId, slot: u32) -> &[f32] {
        let t = &self.tables[self.table_index(table)];
        let start = slot as usize * t.width;
        &t.data[start..start + t.width]
    }

    /// Mutable row in `slot` of `table`; changes become this clock's update.
    ///
    /// # Panics
    /// If the table is not declared or the slot is out of range (a bug in the app).
    pub fn row_mut(&mut self, table: TableId, slot: u32) -> &mut [f32] {
        let index = self.table_index(table);
        let t = &mut self.tables[index];
        let start = slot as usize * t.width;
        &mut t.data[start..start + t.width]
    }

    /// All rows of `table` as one slice (row `slot` at `slot * width`), and the width.
    ///
    /// # Panics
    /// If the table is not declared (a bug in the app).
    pub fn table_mut(&mut self, table: TableId) -> (&mut [f32], usize) {
        let index = self.table_index(table);
        let t = &mut self.tables[index];
        (&mut t.data, t.width)
    }

    /// Mutable access to two tables at once (e.g. MF's user and item factors).
    ///
    /// # Panics
    /// If either table is not declared or both ids are equal (a bug in the app).
    pub fn two_tables_mut(
        &mut self,
        a: TableId,
        b: TableId,
    ) -> ((&mut [f32], usize), (&mut [f32], usize)) {
        let (ia, ib) = (self.table_index(a), self.table_index(b));
        assert!(ia != ib, "two_tables_mut needs two distinct tables");
        let (low, high) = (ia.min(ib), ia.max(ib));
        let (left, right) = self.tables.split_at_mut(high);
        let (tl, th) = (&mut left[low], &mut right[0]);
        let (first, second) = ((&mut tl.data[..], tl.width), (&mut th.data[..], th.width));
        if ia < ib {
            (first, second)
        } else {
            (second, first)
        }
    }
}

/// A float that JSON wrote as `null` (serde_json's form of NaN and infinities) is NaN.
fn f64_or_nan<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<f64, D::Error> {
    use serde::Deserialize as _;
    Ok(Option::<f64>::deserialize(deserializer)?.unwrap_or(f64::NAN))
}

/// What one worker did in one clock.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ClockStats {
    /// Units of work done (ratings, examples or tokens processed): the throughput numerator.
    pub updates: u64,
    /// Sum of training loss terms observed during the clock (0 if the app reports none). A
    /// diverged model's NaN or infinity travels as JSON `null` and comes back as NaN.
    #[serde(deserialize_with = "f64_or_nan")]
    pub loss_sum: f64,
    /// Number of loss terms in `loss_sum`.
    pub loss_count: u64,
}

impl ClockStats {
    /// Adds another worker's or clock's stats into this one.
    pub fn merge(&mut self, other: &ClockStats) {
        self.updates += other.updates;
        self.loss_sum += other.loss_sum;
        self.loss_count += other.loss_count;
    }

    /// Mean loss, or `None` without loss terms.
    pub fn mean_loss(&self) -> Option<f64> {
        (self.loss_count > 0).then(|| self.loss_sum / self.loss_count as f64)
    }
}

/// Quality of the parameters, computed by [`App::evaluate`].
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct EvalReport {
    /// The app's headline loss (lower is better): test RMSE, test cross-entropy, negative
    /// per-token log-likelihood, or the exact app's count of wrong rows.
    pub loss: f64,
    /// Further named metrics (e.g. `("accuracy", 0.96)`), in a stable order.
    pub metrics: Vec<(String, f64)>,
}

impl EvalReport {
    /// Value of the named metric, if reported.
    pub fn metric(&self, name: &str) -> Option<f64> {
        self.metrics
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| *v)
    }
}

/// Read access to the full parameters of a job (all tables, all partitions).
pub trait TableReader {
    /// Width of `table`, or `None` if undeclared.
    fn width(&self, table: TableId) -> Option<usize>;
    /// Copies row `key` of `table` into `out` (`out.len()` must equal the width). Rows never
    /// written hold their initial value. Returns false if the table is unknown or widths differ.
    fn read_row(&self, table: TableId, key: u64, out: &mut [f32]) -> bool;
    /// Keys of `table` that servers have materialised (touched by some worker), sorted.
    fn keys(&self, table: TableId) -> Vec<u64>;
}

/// A machine-learning application running on the parameter server.
pub trait App: Send + Sync + 'static {
    /// Per-shard worker state (the data shard plus scratch buffers).
    type Worker: AppWorker;
    /// The parameter tables (ids unique, widths > 0).
    fn tables(&self) -> Vec<TableSpec>;
    /// The worker for data shard `shard` of `num_shards` (one per worker thread).
    fn worker(&self, shard: usize, num_shards: usize) -> Self::Worker;
    /// Test quality of the given parameters.
    fn evaluate(&self, tables: &dyn TableReader) -> EvalReport;
    /// Clocks one pass over the training data takes in a job of `workers` workers (1: a clock is a
    /// pass). Apps whose workers share rows make a clock a slice of a pass so that the workers'
    /// summed deltas stay as small as one worker's (see [`crate::apps::parallel_clocks_per_pass`]).
    fn clocks_per_pass(&self, _workers: usize) -> usize {
        1
    }
    /// Tells an app evaluated in a process that built no workers (the coordinator) how many
    /// workers the job had; only apps whose evaluation depends on it need to override this.
    fn set_num_workers(&self, _num_workers: usize) {}
}

/// One worker thread's view of an app: a data shard that does one clock of work at a time.
pub trait AppWorker: Send + 'static {
    /// Every key of every table this worker will touch in any clock (declared once).
    fn working_set(&self) -> WorkingSet;
    /// Translates keys into cache slots once, before the first clock.
    fn bind(&mut self, cache: &RowCache);
    /// Does one clock of work (typically one pass over the shard), mutating rows in place.
    fn clock(&mut self, cache: &mut RowCache, clock: u64) -> ClockStats;
    /// Why the last [`AppWorker::clock`] (or building this worker) failed, if it did: the
    /// runtime then halts the run as it does a diverged one, with this message. Built-in apps
    /// cannot fail; a Python app's hook can raise. A failed clock should leave the cache as it
    /// found it ([`RowCache::discard_changes`]) so none of its partial writes are sent.
    fn failure(&mut self) -> Option<String> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_diverged_loss_survives_json() {
        let stats = ClockStats {
            updates: 3,
            loss_sum: f64::NAN,
            loss_count: 3,
        };
        let json = serde_json::to_string(&stats).unwrap();
        assert_eq!(json, r#"{"updates":3,"loss_sum":null,"loss_count":3}"#);
        let back: ClockStats = serde_json::from_str(&json).unwrap();
        assert!(back.loss_sum.is_nan());
        assert_eq!((back.updates, back.loss_count), (3, 3));
        let finite: ClockStats =
            serde_json::from_str(r#"{"updates":1,"loss_sum":2.5,"loss_count":1}"#).unwrap();
        assert_eq!(finite.loss_sum, 2.5);
    }

    fn specs() -> Vec<TableSpec> {
        vec![
            TableSpec {
                id: 0,
                name: "a".into(),
                width: 2,
                init: RowInit::Zeros,
            },
            TableSpec {
                id: 3,
                name: "b".into(),
                width: 3,
                init: RowInit::Uniform {
                    low: -1.0,
                    high: 1.0,
                    seed: 7,
                },
            },
        ]
    }

    #[test]
    fn init_is_deterministic_and_in_range() {
        let init = RowInit::Uniform {
            low: 0.5,
            high: 1.5,
            seed: 9,
        };
        let (mut a, mut b, mut c) = ([0.0; 8], [0.0; 8], [0.0; 8]);
        init.fill(1, 42, &mut a);
        init.fill(1, 42, &mut b);
        init.fill(1, 43, &mut c);
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert!(a.iter().all(|v| (0.5..1.5).contains(v)));
        let normal = RowInit::Normal { std: 0.1, seed: 1 };
        let mut many = vec![0.0f32; 10_000];
        normal.fill(0, 5, &mut many);
        let mean = many.iter().map(|v| f64::from(*v)).sum::<f64>() / many.len() as f64;
        let var = many
            .iter()
            .map(|v| (f64::from(*v) - mean).powi(2))
            .sum::<f64>()
            / many.len() as f64;
        assert!(mean.abs() < 0.01, "mean {mean}");
        assert!((var.sqrt() - 0.1).abs() < 0.01, "std {}", var.sqrt());
        // a pair's two normals (one hash, cos and sin) are uncorrelated
        let pairs = many.chunks_exact(2);
        let covariance = pairs
            .map(|p| (f64::from(p[0]) - mean) * (f64::from(p[1]) - mean))
            .sum::<f64>()
            / 5_000.0;
        assert!(
            (covariance / var).abs() < 0.05,
            "correlation {}",
            covariance / var
        );
        // the same normals, and the last column set
        let with_last = RowInit::NormalWithLast {
            std: 0.1,
            seed: 1,
            last: 1.0,
        };
        let mut row = vec![0.0f32; 10_000];
        with_last.fill(0, 5, &mut row);
        assert_eq!(row[..9_999], many[..9_999]);
        assert_eq!(row[9_999], 1.0);
        let positions = RowInit::PackedModulo {
            modulus: 5,
            per_value: 1,
        };
        let mut row = [0.0f32; 4];
        positions.fill(0, 3, &mut row);
        assert_eq!(row, [2.0, 3.0, 4.0, 0.0], "tokens 12..16 mod 5");
        let packed = RowInit::PackedModulo {
            modulus: 5,
            per_value: 2,
        };
        let mut row = [0.0f32; 2];
        packed.fill(0, 1, &mut row);
        // values 2 and 3: tokens 4, 5 (topics 4, 0) and 6, 7 (topics 1, 2), low digit first
        assert_eq!(row, [4.0, 1.0 + 2.0 * 5.0]);
    }

    #[test]
    fn working_set_sorts_and_dedups() {
        let mut ws = WorkingSet::new();
        ws.add_keys(3, [5, 1, 5, 2]);
        ws.add_keys(3, [1, 9]);
        assert_eq!(ws.keys(3), &[1, 2, 5, 9]);
        assert_eq!(ws.keys(0), &[] as &[u64]);
        assert_eq!(ws.len(), 4);
    }

    #[test]
    fn cache_groups_slots_by_partition_and_finds_keys() {
        let mut ws = WorkingSet::new();
        ws.add_keys(3, [10, 11, 12, 13]);
        ws.add_keys(0, [1]);
        // Odd keys in partition 0, even keys in partition 1.
        let mut cache = RowCache::build(&specs(), &ws, |k| (k % 2 == 0) as u32).unwrap();
        assert_eq!(cache.tables[1].slot_keys, vec![11, 13, 10, 12]);
        let slot = cache.slot(3, 12).unwrap();
        assert_eq!(cache.key(3, slot), 12);
        assert_eq!(cache.slot(3, 99), None);
        assert_eq!(cache.slot(7, 1), None);
        let mut expected = [0.0; 3];
        RowInit::Uniform {
            low: -1.0,
            high: 1.0,
            seed: 7,
        }
        .fill(3, 12, &mut expected);
        assert_eq!(cache.row(3, slot), &expected);
        cache.row_mut(0, 0)[1] = 4.0;
        let ((a, wa), (b, wb)) = cache.two_tables_mut(0, 3);
        assert_eq!((a[1], wa, b.len(), wb), (4.0, 2, 12, 3));
    }

    #[test]
    fn undeclared_tables_are_rejected() {
        let mut ws = WorkingSet::new();
        ws.add_keys(5, [1]);
        assert_eq!(
            RowCache::build(&specs(), &ws, |_| 0).unwrap_err(),
            AppError::LookupTable { table: 5 }
        );
        let mut dup = specs();
        dup[1].id = 0;
        assert_eq!(
            validate_tables(&dup),
            Err(AppError::DeclareTable { table: 0 })
        );
    }
}
