//! The integer-exact test app: every worker adds known integer amounts to known rows each clock.
//!
//! Because every amount is a small positive integer and every sum stays far below 2^24, `f32`
//! arithmetic is exact and the final table is known in closed form. A lost update leaves a value
//! too small, a doubled one too large: [`App::evaluate`] counts wrong values.
//!
//! The workers also check SSP while they run. Worker `w` at clock `t` reads every shared row
//! (touched by all workers) and verifies it holds at least every worker's updates from clocks
//! `<= t - s - 1` plus its own from clocks `<= t - 1`, and at most every worker's updates from
//! clocks `<= t + s` (no worker starts a clock more than `s` ahead of the slowest; under BSP it
//! is exactly clocks `<= t - 1`: a read never sees any of the current clock). Each
//! failed check counts as one unit of "loss" in [`ClockStats`], so the runtime aggregates it across
//! threads and processes like any training loss: a correct run reports `loss_sum == 0`.

use crate::app::{
    App, AppWorker, ClockStats, EvalReport, RowCache, RowInit, TableId, TableReader, TableSpec,
    WorkingSet,
};

/// Shape of the exact app's job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExactConfig {
    /// Rows per table.
    pub rows: u64,
    /// Values per row.
    pub width: usize,
    /// Number of tables (ids `0..tables`).
    pub tables: u32,
    /// Rows `0..shared_rows` of each table are touched by every worker.
    pub shared_rows: u64,
    /// Clocks the job runs (needed for the expected final table).
    pub clocks: u64,
    /// SSP staleness the job runs with (needed for the in-run checks).
    pub staleness: u64,
    /// Simulated compute time per clock (each worker sleeps this long every clock), so tests can
    /// make membership change while a run is in progress.
    pub clock_delay: std::time::Duration,
    /// Row `key` changes only at clocks `c` with `(key + c) % update_period == 0` (1: every
    /// clock): a sparse job, whose BackupPS deltas hold only some rows.
    pub update_period: u64,
}

impl Default for ExactConfig {
    fn default() -> Self {
        Self {
            rows: 64,
            width: 4,
            tables: 2,
            shared_rows: 4,
            clocks: 10,
            staleness: 0,
            clock_delay: std::time::Duration::ZERO,
            update_period: 1,
        }
    }
}

/// The amount worker `worker` adds to column `column` of row `key` of `table` at `clock`: 1..=5.
pub fn amount(worker: usize, clock: u64, table: TableId, key: u64, column: usize) -> u32 {
    let mixed =
        worker as u64 * 31 + clock * 17 + u64::from(table) * 13 + key * 7 + column as u64 * 3;
    1 + (mixed % 5) as u32
}

/// The integer-exact app (see the module docs).
#[derive(Debug, Clone)]
pub struct ExactApp {
    config: ExactConfig,
    /// Number of workers, learned from [`App::worker`]; needed by `evaluate`.
    num_workers: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl ExactApp {
    /// An exact app with the given shape.
    pub fn new(config: ExactConfig) -> Self {
        Self {
            config,
            num_workers: Default::default(),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &ExactConfig {
        &self.config
    }

    /// Sets the number of workers explicitly (for a process that evaluates without hosting every
    /// worker, such as a coordinator).
    pub fn with_num_workers(self, num_workers: usize) -> Self {
        self.num_workers
            .store(num_workers, std::sync::atomic::Ordering::Relaxed);
        self
    }

    /// What `worker` adds to one value at `clock`: [`amount`], or 0 at a clock where the row
    /// does not change (`ExactConfig::update_period`).
    pub fn amount(
        &self,
        worker: usize,
        clock: u64,
        table: TableId,
        key: u64,
        column: usize,
    ) -> u32 {
        let period = self.config.update_period.max(1);
        if (key + clock) % period != 0 {
            return 0;
        }
        amount(worker, clock, table, key, column)
    }

    /// Whether worker `worker` of `num_workers` touches `key`.
    fn touches(&self, worker: usize, num_workers: usize, key: u64) -> bool {
        key < self.config.shared_rows || key % num_workers as u64 == worker as u64
    }

    /// Sum of the amounts of `workers` over `clocks` for one value.
    fn sum(
        &self,
        workers: impl Iterator<Item = usize> + Clone,
        clocks: std::ops::Range<u64>,
        table: TableId,
        key: u64,
        column: usize,
    ) -> u64 {
        clocks
            .flat_map(|clock| {
                workers
                    .clone()
                    .map(move |worker| u64::from(self.amount(worker, clock, table, key, column)))
            })
            .sum()
    }

    /// The exact final value of one cell after `clocks` clocks of `num_workers` workers.
    pub fn expected(&self, num_workers: usize, table: TableId, key: u64, column: usize) -> u64 {
        let workers = (0..num_workers).filter(|&w| self.touches(w, num_workers, key));
        self.sum(workers, 0..self.config.clocks, table, key, column)
    }
}

impl App for ExactApp {
    type Worker = ExactWorker;

    fn tables(&self) -> Vec<TableSpec> {
        (0..self.config.tables)
            .map(|id| TableSpec {
                id,
                name: format!("exact{id}"),
                width: self.config.width,
                init: RowInit::Zeros,
            })
            .collect()
    }

    fn worker(&self, shard: usize, num_shards: usize) -> ExactWorker {
        self.num_workers
            .store(num_shards, std::sync::atomic::Ordering::Relaxed);
        let keys: Vec<u64> = (0..self.config.rows)
            .filter(|&k| self.touches(shard, num_shards, k))
            .collect();
        ExactWorker {
            app: self.clone(),
            worker: shard,
            num_workers: num_shards,
            keys,
            slots: Vec::new(),
        }
    }

    fn set_num_workers(&self, num_workers: usize) {
        self.num_workers
            .store(num_workers, std::sync::atomic::Ordering::Relaxed);
    }

    fn evaluate(&self, tables: &dyn TableReader) -> EvalReport {
        let num_workers = self
            .num_workers
            .load(std::sync::atomic::Ordering::Relaxed)
            .max(1);
        let mut wrong = 0u64;
        let mut max_error = 0f64;
        let mut row = vec![0f32; self.config.width];
        for table in 0..self.config.tables {
            for key in 0..self.config.rows {
                if !tables.read_row(table, key, &mut row) {
                    wrong += self.config.width as u64;
                    continue;
                }
                for (column, value) in row.iter().enumerate() {
                    let expected = self.expected(num_workers, table, key, column) as f64;
                    let error = (f64::from(*value) - expected).abs();
                    if error != 0.0 {
                        wrong += 1;
                        max_error = max_error.max(error);
                    }
                }
            }
        }
        EvalReport {
            loss: wrong as f64,
            metrics: vec![
                ("wrong_values".into(), wrong as f64),
                ("max_abs_error".into(), max_error),
            ],
        }
    }
}

/// One worker of the exact app.
#[derive(Debug)]
pub struct ExactWorker {
    app: ExactApp,
    worker: usize,
    num_workers: usize,
    keys: Vec<u64>,
    /// `slots[table][i]` is the cache slot of `keys[i]`.
    slots: Vec<Vec<u32>>,
}

impl ExactWorker {
    /// Checks the SSP bounds on the shared rows at the start of `clock`; returns failed checks.
    fn check_reads(&self, cache: &RowCache, clock: u64) -> (u64, u64) {
        let staleness = self.app.config.staleness;
        let everyone = 0..self.num_workers;
        let others_complete = clock.saturating_sub(staleness);
        let (mut failed, mut checks) = (0u64, 0u64);
        for table in 0..self.app.config.tables {
            for (index, &key) in self
                .keys
                .iter()
                .enumerate()
                .take_while(|(_, k)| **k < self.app.config.shared_rows)
            {
                let row = cache.row(table, self.slots[table as usize][index]);
                for (column, value) in row.iter().enumerate() {
                    let lower =
                        self.app
                            .sum(everyone.clone(), 0..others_complete, table, key, column)
                            + self.app.sum(
                                std::iter::once(self.worker),
                                others_complete..clock,
                                table,
                                key,
                                column,
                            );
                    // Another worker may have finished clocks up to `t + s` (it starts clock `t + s` as
                    // soon as this worker finished `t - 1`); under BSP nothing of clock `t`.
                    let upper = self.app.sum(
                        everyone.clone(),
                        0..if staleness == 0 {
                            clock
                        } else {
                            clock + staleness + 1
                        },
                        table,
                        key,
                        column,
                    );
                    let value = f64::from(*value);
                    checks += 1;
                    if value < lower as f64 || value > upper as f64 {
                        failed += 1;
                    }
                }
            }
        }
        (failed, checks)
    }
}

impl AppWorker for ExactWorker {
    fn working_set(&self) -> WorkingSet {
        let mut set = WorkingSet::new();
        for table in 0..self.app.config.tables {
            set.add_keys(table, self.keys.iter().copied());
        }
        set
    }

    fn bind(&mut self, cache: &RowCache) {
        self.slots = (0..self.app.config.tables)
            .map(|table| {
                self.keys
                    .iter()
                    .map(|&key| cache.slot(table, key).expect("working-set key has a slot"))
                    .collect()
            })
            .collect();
    }

    fn clock(&mut self, cache: &mut RowCache, clock: u64) -> ClockStats {
        if !self.app.config.clock_delay.is_zero() {
            std::thread::sleep(self.app.config.clock_delay);
        }
        let (failed, checks) = self.check_reads(cache, clock);
        let mut updates = 0;
        for table in 0..self.app.config.tables {
            for (index, &key) in self.keys.iter().enumerate() {
                let row = cache.row_mut(table, self.slots[table as usize][index]);
                for (column, value) in row.iter_mut().enumerate() {
                    *value += self.app.amount(self.worker, clock, table, key, column) as f32;
                }
                updates += 1;
            }
        }
        ClockStats {
            updates,
            loss_sum: failed as f64,
            loss_count: checks,
        }
    }
}
