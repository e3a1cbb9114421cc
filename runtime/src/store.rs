//! Server-side partition storage: rows, registered batches, per-worker clocks, exactly-once apply.
//!
//! A [`PartitionStore`] holds the rows of one partition of every table. Workers register their
//! per-clock batch once (the keys of the partition they touch, in a fixed order); afterwards a push
//! or a pull carries only values in that order, and the server indexes pre-resolved row offsets
//! (no per-row hashing per clock).
//!
//! **Clocks and visibility.** The store expects a push from every worker of the job for every clock
//! (an empty one if the worker has no keys here), applied on arrival straight into the rows (no
//! per-push buffering, so a server holds little beyond its parameters). `completed[w]` is the number
//! of clocks of worker `w` received and `visible_clock = min_w completed[w]`: every update of clocks
//! below it is applied, which is SSP's guarantee (a read needing clock `t - s` waits for it). Under
//! BSP (`strict`) a read at clock `t` must also see *nothing* of clock `t`, so a push for clock `c`
//! is held back (by the caller, before reading it off the connection) until every worker that reads
//! this partition has been served its read for clock `c`. Summation order within a clock follows
//! arrival, so BSP runs agree across modes up to float rounding (exactly, for integer apps).
//!
//! **Exactly once.** A push is identified by (worker, clock, partition). Workers push their clocks
//! in order, so `completed[w]` is the whole dedup state: a push with `clock < completed[w]` is a
//! duplicate (acknowledged, not applied), `clock > completed[w]` is a gap (refused). That state is
//! part of the partition, so it moves with it on migration and is reset with it on rollback.

use std::collections::HashMap;

use std::sync::Arc;

use parking_lot::{Condvar, Mutex, RwLock};
use thiserror::Error;

use crate::app::{TableId, TableSpec};
use crate::optimizer::Optimizer;
use crate::partition::PartitionId;

/// Errors of operations on a partition store.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum StoreError {
    /// The partition is not hosted here.
    #[error("partition {partition} is not hosted by this server")]
    LookupPartition {
        /// The requested partition.
        partition: PartitionId,
    },
    /// The request carried a different epoch than the partition's current one.
    #[error("partition {partition} is at epoch {current}, request carried epoch {requested}")]
    CheckEpoch {
        /// The partition.
        partition: PartitionId,
        /// Its current epoch.
        current: u64,
        /// The epoch in the request.
        requested: u64,
    },
    /// The worker id is outside the job's worker range.
    #[error("worker {worker} out of range (job has {num_workers} workers)")]
    LookupWorker {
        /// The worker.
        worker: u32,
        /// Workers in the job.
        num_workers: u32,
    },
    /// A registration named an undeclared table.
    #[error("registration names undeclared table {table}")]
    RegisterTable {
        /// The table.
        table: TableId,
    },
    /// A registration claimed a read the partition cannot have served.
    #[error(
        "worker {worker} claims to hold partition {partition} as of clock {clock}, \
         its visible clock is {visible}"
    )]
    RegisterReadThrough {
        /// The worker.
        worker: u32,
        /// The partition.
        partition: PartitionId,
        /// The clock claimed.
        clock: u64,
        /// The partition's visible clock.
        visible: u64,
    },
    /// A registration declared more values than one push or pull of it may carry.
    #[error(
        "worker {worker} registered {values} values with partition {partition}, more than the \
         {max} one frame carries"
    )]
    RegisterTooLarge {
        /// The worker.
        worker: u32,
        /// The partition.
        partition: PartitionId,
        /// Values the registration declared.
        values: u64,
        /// Most values a batch may hold.
        max: usize,
    },
    /// A registration named a key of another partition.
    #[error("key {key} does not belong to partition {partition}")]
    RegisterKey {
        /// The key.
        key: u64,
        /// The partition it was registered with.
        partition: PartitionId,
    },
    /// The worker pushed or pulled before registering its batch.
    #[error("worker {worker} has not registered a batch with partition {partition}")]
    LookupBatch {
        /// The worker.
        worker: u32,
        /// The partition.
        partition: PartitionId,
    },
    /// The number of values does not match the registered batch.
    #[error("worker {worker} sent {got} values to partition {partition}, its batch has {expected}")]
    PushLength {
        /// The worker.
        worker: u32,
        /// The partition.
        partition: PartitionId,
        /// Values in the registered batch.
        expected: usize,
        /// Values received.
        got: usize,
    },
    /// A push skipped clocks.
    #[error(
        "worker {worker} pushed clock {clock} to partition {partition}, expected clock {expected}"
    )]
    PushClockGap {
        /// The worker.
        worker: u32,
        /// The partition.
        partition: PartitionId,
        /// The next clock the server expects.
        expected: u64,
        /// The clock pushed.
        clock: u64,
    },
    /// A BSP push arrived before every reader read its clock (the caller must wait first).
    #[error(
        "worker {worker} pushed clock {clock} to partition {partition} before every reader read it"
    )]
    PushEarly {
        /// The worker.
        worker: u32,
        /// The partition.
        partition: PartitionId,
        /// The clock pushed.
        clock: u64,
    },
    /// A partition image does not fit the job (migration or rollback input).
    #[error("partition image {partition} does not fit the job: {reason}")]
    RestoreImage {
        /// The partition of the image.
        partition: PartitionId,
        /// What does not fit.
        reason: String,
    },
    /// Waiting for a clock timed out (a worker is stuck or gone).
    #[error("partition {partition} did not reach clock {clock} in time (visible clock {visible})")]
    WaitClock {
        /// The partition.
        partition: PartitionId,
        /// The clock awaited.
        clock: u64,
        /// The visible clock when giving up.
        visible: u64,
    },
    /// The partition's state was abandoned while waiting (a peer failed; the job rolls back).
    #[error("partition {partition} was abandoned for a rollback")]
    Abandoned {
        /// The partition.
        partition: PartitionId,
    },
    /// A BackupPS copy was asked for a clock the partition has already gone past.
    #[error(
        "partition {partition} cannot copy clock {clock} for its BackupPS: updates of clock {clock} \
         or later are applied (visible clock {visible})"
    )]
    BackupTooLate {
        /// The partition.
        partition: PartitionId,
        /// The clock asked for.
        clock: u64,
        /// The visible clock.
        visible: u64,
    },
    /// A BackupPS copy awaited is no longer armed (the segment ended before its clock).
    #[error("partition {partition} has no BackupPS copy armed at clock {clock}")]
    BackupDisarmed {
        /// The partition.
        partition: PartitionId,
        /// The clock awaited.
        clock: u64,
    },
}

impl StoreError {
    /// Static label for metrics.
    pub fn category(&self) -> &'static str {
        match self {
            StoreError::LookupPartition { .. } => "lookup_partition",
            StoreError::CheckEpoch { .. } => "check_epoch",
            StoreError::LookupWorker { .. } => "lookup_worker",
            StoreError::RegisterTable { .. } => "register_table",
            StoreError::RegisterKey { .. } => "register_key",
            StoreError::RegisterTooLarge { .. } => "register_too_large",
            StoreError::RegisterReadThrough { .. } => "register_read_through",
            StoreError::LookupBatch { .. } => "lookup_batch",
            StoreError::PushLength { .. } => "push_length",
            StoreError::PushClockGap { .. } => "push_clock_gap",
            StoreError::PushEarly { .. } => "push_early",
            StoreError::RestoreImage { .. } => "restore_image",
            StoreError::WaitClock { .. } => "wait_clock",
            StoreError::Abandoned { .. } => "abandoned",
            StoreError::BackupTooLate { .. } => "backup_too_late",
            StoreError::BackupDisarmed { .. } => "backup_disarmed",
        }
    }
}

/// Outcome of a push.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PushOutcome {
    /// First delivery: accepted (applied now or when the clock completes).
    Accepted,
    /// Already received earlier (a retry, redirect or replay): ignored.
    Duplicate,
}

/// One table's materialised rows in a [`PartitionImage`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TableImage {
    /// The table.
    pub table: TableId,
    /// Keys in storage order.
    pub keys: Vec<u64>,
    /// `keys.len() * width` values.
    pub data: Vec<f32>,
    /// Optimizer state, same layout as `data` (empty if the optimizer has none).
    pub state: Vec<f32>,
}

/// A partition's whole state at a clock boundary: what a new owner copies on migration and what
/// a BackupPS holds for rollback. The per-worker clocks travel with the rows, so exactly-once
/// apply holds across owners: a replayed push of a clock the image already counts is a duplicate.
#[derive(Debug, Clone, PartialEq)]
pub struct PartitionImage {
    /// The partition.
    pub partition: PartitionId,
    /// Its tables, in declaration order.
    pub tables: Vec<TableImage>,
    /// Per worker: clocks received.
    pub completed: Vec<u64>,
}

impl PartitionImage {
    /// Every update of clocks below this is in the image, and no other.
    pub fn visible_clock(&self) -> u64 {
        self.completed.iter().copied().min().unwrap_or(0)
    }

    /// Bytes of parameter values (rows only).
    pub fn parameter_bytes(&self) -> usize {
        self.tables.iter().map(|t| t.data.len() * 4).sum()
    }
}

/// The `TableRows::touched` mark of a push of `clock`: one past it, saturated (a job of
/// 4 billion clocks marks its later rows as changed at the last one, so deltas still hold them).
fn touched_mark(clock: u64) -> u32 {
    u32::try_from(clock.saturating_add(1)).unwrap_or(u32::MAX)
}

/// One table's rows within a partition.
#[derive(Debug, Clone)]
struct TableRows {
    spec: TableSpec,
    index: HashMap<u64, u32>,
    keys: Vec<u64>,
    data: Vec<f32>,
    /// Optimizer state, same layout as `data` (empty if the optimizer has none).
    state: Vec<f32>,
    /// Per row: one past the latest clock whose push changed it (0: none since the store's
    /// `floor`). What a BackupPS delta copy ([`BackupCopy::since`]) selects rows by.
    touched: Vec<u32>,
}

impl TableRows {
    /// Records that a push marked `mark` ([`touched_mark`]) changed `row`.
    fn mark_changed(&mut self, row: u32, mark: u32) {
        let touched = &mut self.touched[row as usize];
        *touched = (*touched).max(mark);
    }

    /// Row index of `key`, materialising it from the initialiser on first use.
    fn row_index(&mut self, key: u64, with_state: bool) -> u32 {
        if let Some(&row) = self.index.get(&key) {
            return row;
        }
        let row = self.keys.len() as u32;
        let width = self.spec.width;
        self.keys.push(key);
        let start = self.data.len();
        self.data.resize(start + width, 0.0);
        self.spec
            .init
            .fill(self.spec.id, key, &mut self.data[start..]);
        if with_state {
            self.state.resize(start + width, 0.0);
        }
        self.touched.push(0);
        self.index.insert(key, row);
        row
    }
}

/// A worker's registered batch: for each table (position in `tables`), its rows in push order.
#[derive(Debug, Default, Clone)]
struct Batch {
    segments: Vec<(usize, Vec<u32>)>,
    len: usize,
}

/// A BackupPS copy armed at a clock (see [`PartitionStore::arm_backup`]).
#[derive(Debug)]
enum Backup {
    /// Waiting for the partition to reach `clock`. `shadow` is the partition as it was before
    /// the first push of clock `clock` or later (SSP lets a fast worker push ahead of the
    /// slowest); from then on it receives only the pushes of earlier clocks.
    Pending {
        clock: u64,
        shadow: Option<Box<PartitionStore>>,
    },
    /// The partition's copy at exactly `clock`.
    Ready { clock: u64, copy: BackupCopy },
}

/// A BackupPS copy of a partition at a clock: its whole image, and per row the clock that last
/// changed it, from which [`BackupCopy::since`] makes the coalesced delta a BackupPS needs.
#[derive(Debug, Clone, PartialEq)]
pub struct BackupCopy {
    image: PartitionImage,
    /// Per table, per row (image order): one past the latest clock whose push changed it.
    touched: Vec<Vec<u32>>,
    /// Pushes of this clock and later were all tracked in `touched`.
    floor: u64,
}

/// Values per row of `table` (0 if it has no rows).
fn row_width(table: &TableImage) -> usize {
    table.data.len().checked_div(table.keys.len()).unwrap_or(0)
}

/// Rows (in image order) that a push of clock `base` or later changed, by their marks.
fn changed_since(touched: &[u32], base: u64) -> impl Iterator<Item = usize> + '_ {
    touched
        .iter()
        .enumerate()
        .filter(move |(_, mark)| u64::from(**mark) > base)
        .map(|(row, _)| row)
}

impl BackupCopy {
    /// The whole image.
    pub fn into_image(self) -> PartitionImage {
        self.image
    }

    /// The whole image, borrowed.
    pub fn image(&self) -> &PartitionImage {
        &self.image
    }

    /// `base`, if this copy tracked every change since it.
    fn tracked(&self, base: Option<u64>) -> Option<u64> {
        base.filter(|&b| b >= self.floor && b <= self.image.visible_clock())
    }

    /// Parameter bytes of [`BackupCopy::since`]`(base)` and the base it is a delta since
    /// (`None`: whole), without making it.
    pub fn bytes_since(&self, base: Option<u64>) -> (usize, Option<u64>) {
        let Some(base) = self.tracked(base) else {
            return (self.image.parameter_bytes(), None);
        };
        let bytes = self
            .image
            .tables
            .iter()
            .zip(&self.touched)
            .map(|(table, touched)| changed_since(touched, base).count() * row_width(table) * 4)
            .sum();
        (bytes, Some(base))
    }

    /// What a BackupPS that holds the partition at clock `base` (or later) needs to hold it at
    /// this copy's clock: only the rows changed by pushes of clock `base` or later, with their
    /// values, optimizer state and every worker's clock count (see [`apply_delta`]). `None`
    /// (the whole image) if `base` is `None` or earlier than what this copy tracked, e.g. the
    /// partition was placed here from an image after `base`.
    pub fn since(self, base: Option<u64>) -> (PartitionImage, Option<u64>) {
        let Some(base) = self.tracked(base) else {
            return (self.image, None);
        };
        let mut image = self.image;
        for (table, touched) in image.tables.iter_mut().zip(&self.touched) {
            let width = row_width(table);
            let rows: Vec<usize> = changed_since(touched, base).collect();
            if rows.len() == table.keys.len() {
                continue;
            }
            let pick = |values: &[f32]| -> Vec<f32> {
                if values.is_empty() {
                    return Vec::new();
                }
                rows.iter()
                    .flat_map(|&r| &values[r * width..(r + 1) * width])
                    .copied()
                    .collect()
            };
            table.data = pick(&table.data);
            table.state = pick(&table.state);
            table.keys = rows.iter().map(|&r| table.keys[r]).collect();
        }
        (image, Some(base))
    }
}

/// Applies a delta copy (see [`BackupCopy::since`]) to `held`, the same partition's image at
/// a clock from the delta's base up to its clock: its rows replace or join `held`'s, and its
/// clock counts become `held`'s. The values are absolute, so a delta taken since an earlier
/// base applies just as well (rows that did not change since `held` are rewritten unchanged).
pub fn apply_delta(
    held: &mut PartitionImage,
    base: u64,
    delta: PartitionImage,
) -> Result<(), StoreError> {
    let partition = delta.partition;
    let misfit = |reason: String| StoreError::RestoreImage { partition, reason };
    if held.visible_clock() < base {
        return Err(misfit(format!(
            "a delta since clock {base} for a copy held at clock {}",
            held.visible_clock()
        )));
    }
    if held.completed.len() != delta.completed.len() {
        return Err(misfit(format!(
            "{} workers' clocks in the delta, {} held",
            delta.completed.len(),
            held.completed.len()
        )));
    }
    if held.partition != partition {
        return Err(misfit(format!(
            "a delta of partition {partition} for partition {}",
            held.partition
        )));
    }
    if held.tables.len() != delta.tables.len() {
        return Err(misfit(format!(
            "{} tables in the delta, {} held",
            delta.tables.len(),
            held.tables.len()
        )));
    }
    if held.visible_clock() > delta.visible_clock() {
        return Err(misfit(format!(
            "the delta is at clock {}, behind the held copy at {}",
            delta.visible_clock(),
            held.visible_clock()
        )));
    }
    for (to, from) in held.tables.iter_mut().zip(delta.tables) {
        if to.table != from.table {
            return Err(misfit(format!(
                "table {} where {} is held",
                from.table, to.table
            )));
        }
        if from.keys.is_empty() {
            continue;
        }
        let width = row_width(&from);
        let consistent = width > 0
            && from.data.len() == from.keys.len() * width
            && (to.keys.is_empty() || to.data.len() == to.keys.len() * width)
            && (from.state.is_empty() || from.state.len() == from.data.len())
            && from.state.is_empty() == to.state.is_empty();
        if !consistent {
            return Err(misfit(format!(
                "table {}: {} keys, {} values, {} state values do not fit the held {} keys, {} \
                 values, {} state values",
                from.table,
                from.keys.len(),
                from.data.len(),
                from.state.len(),
                to.keys.len(),
                to.data.len(),
                to.state.len()
            )));
        }
        let index: HashMap<u64, usize> = to.keys.iter().enumerate().map(|(r, &k)| (k, r)).collect();
        for (r, &key) in from.keys.iter().enumerate() {
            let values = &from.data[r * width..(r + 1) * width];
            let state = if from.state.is_empty() {
                &[][..]
            } else {
                &from.state[r * width..(r + 1) * width]
            };
            match index.get(&key) {
                Some(&at) => {
                    to.data[at * width..(at + 1) * width].copy_from_slice(values);
                    if !state.is_empty() {
                        to.state[at * width..(at + 1) * width].copy_from_slice(state);
                    }
                }
                None => {
                    to.keys.push(key);
                    to.data.extend_from_slice(values);
                    to.state.extend_from_slice(state);
                }
            }
        }
    }
    held.completed = delta.completed;
    Ok(())
}

impl Backup {
    fn clock(&self) -> u64 {
        match self {
            Backup::Pending { clock, .. } | Backup::Ready { clock, .. } => *clock,
        }
    }
}

/// The rows and clocks of one partition.
#[derive(Debug)]
pub struct PartitionStore {
    partition: PartitionId,
    num_partitions: u32,
    epoch: u64,
    optimizer: Optimizer,
    tables: Vec<TableRows>,
    batches: Vec<Option<Batch>>,
    completed: Vec<u64>,
    visible_clock: u64,
    /// BSP: hold pushes of clock `c` until every reader was served its clock-`c` read.
    strict: bool,
    /// Per worker: the latest clock it was served a read for.
    read_clock: Vec<Option<u64>>,
    /// BackupPS copies armed at clocks ahead, in clock order.
    backups: Vec<Backup>,
    /// Every push of this clock or later marked the rows it changed (`TableRows::touched`).
    floor: u64,
    /// A copy's image given back once sent ([`PartitionStore::recycle`]): the next BackupPS
    /// copy is made into its buffers instead of new ones, so a node does not allocate and free
    /// its partitions' size every few clocks.
    spare: Option<PartitionImage>,
}

/// Whether a push may be applied now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PushGate {
    /// Apply it.
    Open,
    /// Already received: acknowledge without applying.
    Duplicate,
    /// BSP: some reader has not read this clock yet; wait for a change and ask again.
    Wait,
}

impl PartitionStore {
    /// An empty partition of the given tables, expecting pushes from `num_workers` workers.
    pub fn new(
        partition: PartitionId,
        num_partitions: u32,
        epoch: u64,
        specs: &[TableSpec],
        num_workers: u32,
        optimizer: Optimizer,
        strict: bool,
    ) -> Self {
        let tables = specs
            .iter()
            .map(|spec| TableRows {
                spec: spec.clone(),
                index: HashMap::new(),
                keys: Vec::new(),
                data: Vec::new(),
                state: Vec::new(),
                touched: Vec::new(),
            })
            .collect();
        Self {
            partition,
            num_partitions,
            epoch,
            optimizer,
            tables,
            batches: (0..num_workers).map(|_| None).collect(),
            completed: vec![0; num_workers as usize],
            visible_clock: 0,
            strict,
            read_clock: vec![None; num_workers as usize],
            backups: Vec::new(),
            floor: 0,
            spare: None,
        }
    }

    /// The partition's id.
    pub fn partition(&self) -> PartitionId {
        self.partition
    }

    /// The partition's epoch.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Every update of clocks `< visible_clock` is applied, and no other.
    pub fn visible_clock(&self) -> u64 {
        self.visible_clock
    }

    /// Fails unless `epoch` is the partition's current epoch.
    pub fn check_epoch(&self, epoch: u64) -> Result<(), StoreError> {
        if epoch != self.epoch {
            return Err(StoreError::CheckEpoch {
                partition: self.partition,
                current: self.epoch,
                requested: epoch,
            });
        }
        Ok(())
    }

    fn check_worker(&self, worker: u32) -> Result<usize, StoreError> {
        if (worker as usize) < self.completed.len() {
            Ok(worker as usize)
        } else {
            Err(StoreError::LookupWorker {
                worker,
                num_workers: self.completed.len() as u32,
            })
        }
    }

    /// Registers (or re-registers) `worker`'s batch: keys per table, in the order of later values.
    pub fn register(
        &mut self,
        worker: u32,
        tables: &[(TableId, Vec<u64>)],
    ) -> Result<usize, StoreError> {
        self.register_read(worker, tables, None, usize::MAX)
    }

    /// As [`PartitionStore::register`]; `read_through` says the worker already holds the rows
    /// as of that visible clock (read from the partition's previous owner at a clock boundary:
    /// the move changed no value), so BSP pushes need not wait for it to read them again. It
    /// cannot be ahead of this copy's visible clock. A batch of more than `max_values` values
    /// (what one frame carries) is refused. Everything is checked before any row is
    /// materialised, so a refused registration leaves the partition as it was.
    pub fn register_read(
        &mut self,
        worker: u32,
        tables: &[(TableId, Vec<u64>)],
        read_through: Option<u64>,
        max_values: usize,
    ) -> Result<usize, StoreError> {
        let w = self.check_worker(worker)?;
        if let Some(clock) = read_through.filter(|&c| c > self.visible_clock) {
            return Err(StoreError::RegisterReadThrough {
                worker,
                partition: self.partition,
                clock,
                visible: self.visible_clock,
            });
        }
        let mut positions = Vec::with_capacity(tables.len());
        let mut values = 0u64;
        for (table, keys) in tables {
            let position = self
                .tables
                .iter()
                .position(|t| t.spec.id == *table)
                .ok_or(StoreError::RegisterTable { table: *table })?;
            if let Some(&key) = keys.iter().find(|&&k| {
                crate::partition::partition_of(k, self.num_partitions) != self.partition
            }) {
                return Err(StoreError::RegisterKey {
                    key,
                    partition: self.partition,
                });
            }
            values = values.saturating_add(
                (keys.len() as u64).saturating_mul(self.tables[position].spec.width as u64),
            );
            positions.push(position);
        }
        if values > max_values as u64 {
            return Err(StoreError::RegisterTooLarge {
                worker,
                partition: self.partition,
                values,
                max: max_values,
            });
        }
        let with_state = self.optimizer.has_state();
        let mut batch = Batch::default();
        for ((_, keys), position) in tables.iter().zip(positions) {
            let rows = &mut self.tables[position];
            let indices = keys
                .iter()
                .map(|&key| rows.row_index(key, with_state))
                .collect();
            batch.len += keys.len() * rows.spec.width;
            batch.segments.push((position, indices));
        }
        let len = batch.len;
        self.batches[w] = Some(batch);
        // A new batch is read afresh (a process cache's new union, say): until then, BSP pushes
        // wait for this worker's read again, unless it holds the rows already.
        self.read_clock[w] = read_through;
        Ok(len)
    }

    /// Number of values in `worker`'s registered batch.
    pub fn batch_len(&self, worker: u32) -> Result<usize, StoreError> {
        let w = self.check_worker(worker)?;
        self.batches[w]
            .as_ref()
            .map(|b| b.len)
            .ok_or(StoreError::LookupBatch {
                worker,
                partition: self.partition,
            })
    }

    /// Whether `worker`'s push for `clock` may be applied now (see the module docs).
    pub fn push_gate(&self, worker: u32, clock: u64) -> Result<PushGate, StoreError> {
        let w = self.check_worker(worker)?;
        let expected = self.completed[w];
        if clock < expected {
            return Ok(PushGate::Duplicate);
        }
        if clock > expected {
            return Err(StoreError::PushClockGap {
                worker,
                partition: self.partition,
                expected,
                clock,
            });
        }
        if !self.strict {
            return Ok(PushGate::Open);
        }
        // Every worker must have registered (so its readership is known) and read clock `clock`.
        let all_read = self
            .batches
            .iter()
            .zip(&self.read_clock)
            .all(|(batch, read)| match batch {
                None => false,
                Some(batch) => batch.len == 0 || read.is_some_and(|r| r >= clock),
            });
        Ok(if all_read {
            PushGate::Open
        } else {
            PushGate::Wait
        })
    }

    /// Applies `worker`'s deltas for `clock` (`values` in registered order) if its gate is open.
    ///
    /// Returns whether this was a first delivery, and whether the visible clock advanced.
    pub fn push(
        &mut self,
        worker: u32,
        clock: u64,
        values: &[f32],
    ) -> Result<(PushOutcome, bool), StoreError> {
        self.push_le_or_f32(worker, clock, values.len(), |store, w| {
            store.apply(w, clock, values)
        })
    }

    /// As [`PartitionStore::push`] with little-endian encoded values (straight from a frame).
    pub fn push_le(
        &mut self,
        worker: u32,
        clock: u64,
        bytes: &[u8],
    ) -> Result<(PushOutcome, bool), StoreError> {
        self.push_le_or_f32(worker, clock, bytes.len() / 4, |store, w| {
            store.apply_le(w, clock, bytes)
        })
    }

    fn push_le_or_f32(
        &mut self,
        worker: u32,
        clock: u64,
        len: usize,
        apply: impl Fn(&mut Self, usize),
    ) -> Result<(PushOutcome, bool), StoreError> {
        let expected_len = self.batch_len(worker)?;
        if len != expected_len {
            return Err(StoreError::PushLength {
                worker,
                partition: self.partition,
                expected: expected_len,
                got: len,
            });
        }
        match self.push_gate(worker, clock)? {
            PushGate::Duplicate => return Ok((PushOutcome::Duplicate, false)),
            PushGate::Wait => {
                return Err(StoreError::PushEarly {
                    worker,
                    partition: self.partition,
                    clock,
                });
            }
            PushGate::Open => {}
        }
        let w = worker as usize;
        if !self.backups.is_empty() {
            self.shadow_push(w, clock, &apply);
        }
        let advanced = self.apply_counted(w, apply);
        if !self.backups.is_empty() {
            self.settle_backups();
        }
        Ok((PushOutcome::Accepted, advanced))
    }

    /// Applies worker `w`'s push and counts its clock; returns whether the visible clock
    /// advanced.
    fn apply_counted(&mut self, w: usize, apply: impl FnOnce(&mut Self, usize)) -> bool {
        apply(self, w);
        self.completed[w] += 1;
        let min = self.completed.iter().copied().min().unwrap_or(0);
        let advanced = min > self.visible_clock;
        self.visible_clock = min;
        advanced
    }

    /// Before worker `w`'s push of `clock` is applied: every pending BackupPS copy of a later
    /// clock gets the push too; one at `clock` or earlier is forked off first (the first push
    /// it must not contain).
    fn shadow_push(&mut self, w: usize, clock: u64, apply: &impl Fn(&mut Self, usize)) {
        let mut backups = std::mem::take(&mut self.backups);
        for backup in &mut backups {
            let Backup::Pending { clock: at, shadow } = backup else {
                continue;
            };
            match shadow {
                Some(shadow) if clock < *at => {
                    shadow.apply_counted(w, apply);
                }
                Some(_) => {}
                None if clock >= *at => *shadow = Some(Box::new(self.fork())),
                None => {}
            }
        }
        self.backups = backups;
    }

    /// Pending BackupPS copies whose clock every worker reached become ready.
    fn settle_backups(&mut self) {
        let mut backups = std::mem::take(&mut self.backups);
        for backup in &mut backups {
            let Backup::Pending { clock, shadow } = backup else {
                continue;
            };
            let clock = *clock;
            let copy = match shadow.take() {
                Some(shadow) if shadow.visible_clock >= clock => shadow.into_copy(),
                Some(shadow) => {
                    *backup = Backup::Pending {
                        clock,
                        shadow: Some(shadow),
                    };
                    continue;
                }
                None if self.visible_clock >= clock => self.copy(),
                None => continue,
            };
            *backup = Backup::Ready { clock, copy };
        }
        self.backups = backups;
    }

    /// A copy of the rows, optimizer state, batches and clocks (no backups of its own).
    fn fork(&self) -> PartitionStore {
        PartitionStore {
            partition: self.partition,
            num_partitions: self.num_partitions,
            epoch: self.epoch,
            optimizer: self.optimizer,
            tables: self.tables.clone(),
            batches: self.batches.clone(),
            completed: self.completed.clone(),
            visible_clock: self.visible_clock,
            strict: self.strict,
            read_clock: self.read_clock.clone(),
            backups: Vec::new(),
            floor: self.floor,
            spare: None,
        }
    }

    /// Arms a BackupPS copy at `clock`: the partition's image with every update of clocks below
    /// `clock` and none other, taken in the background while workers go on (no barrier), for
    /// [`PartitionStore::take_backup`]. Arming a clock already armed does nothing.
    pub fn arm_backup(&mut self, clock: u64) -> Result<(), StoreError> {
        if self.backups.iter().any(|b| b.clock() == clock) {
            return Ok(());
        }
        let ahead = self.completed.iter().copied().max().unwrap_or(0);
        if self.visible_clock > clock || ahead > clock {
            return Err(StoreError::BackupTooLate {
                partition: self.partition,
                clock,
                visible: self.visible_clock,
            });
        }
        let at = self.backups.partition_point(|b| b.clock() < clock);
        self.backups.insert(
            at,
            Backup::Pending {
                clock,
                shadow: None,
            },
        );
        self.settle_backups();
        Ok(())
    }

    /// Whether the BackupPS copy at `clock` is ready; an error if none is armed there.
    pub fn backup_ready(&self, clock: u64) -> Result<bool, StoreError> {
        match self.backups.iter().find(|b| b.clock() == clock) {
            Some(Backup::Ready { .. }) => Ok(true),
            Some(Backup::Pending { .. }) => Ok(false),
            None => Err(StoreError::BackupDisarmed {
                partition: self.partition,
                clock,
            }),
        }
    }

    /// Takes the ready BackupPS copy at `clock` (and drops any of earlier clocks).
    pub fn take_backup(&mut self, clock: u64) -> Option<BackupCopy> {
        let at = self
            .backups
            .iter()
            .position(|b| matches!(b, Backup::Ready { clock: c, .. } if *c == clock))?;
        let mut taken = self.backups.drain(..=at);
        match taken.next_back() {
            Some(Backup::Ready { copy, .. }) => Some(copy),
            _ => None,
        }
    }

    /// Drops the BackupPS copies armed at clocks `from` and later (the segment ended before
    /// them; 0: all).
    pub fn disarm_backups(&mut self, from: u64) {
        self.backups.retain(|b| b.clock() < from);
    }

    fn apply_le(&mut self, w: usize, clock: u64, bytes: &[u8]) {
        let Some(batch) = self.batches[w].as_ref() else {
            return;
        };
        let optimizer = self.optimizer;
        let mark = touched_mark(clock);
        let mut delta = [0f32; 64];
        let mut offset = 0;
        for (position, rows) in &batch.segments {
            let table = &mut self.tables[*position];
            let width = table.spec.width;
            for &row in rows {
                let start = row as usize * width;
                // A stateful rule changes the row even for a zero delta (momentum goes on).
                let mut changed = !table.state.is_empty();
                // Decode in small stack chunks: no per-push allocation.
                let mut column = 0;
                while column < width {
                    let n = (width - column).min(delta.len());
                    let from = (offset + column) * 4;
                    crate::frame::get_f32s(&bytes[from..from + n * 4], &mut delta[..n]);
                    changed |= delta[..n].iter().any(|d| *d != 0.0);
                    let values = &mut table.data[start + column..start + column + n];
                    let state = if table.state.is_empty() {
                        &mut [][..]
                    } else {
                        &mut table.state[start + column..start + column + n]
                    };
                    optimizer.apply(values, state, &delta[..n]);
                    column += n;
                }
                if changed {
                    table.mark_changed(row, mark);
                }
                offset += width;
            }
        }
    }

    fn apply(&mut self, w: usize, clock: u64, values: &[f32]) {
        let Some(batch) = self.batches[w].as_ref() else {
            return;
        };
        let optimizer = self.optimizer;
        let mark = touched_mark(clock);
        let mut offset = 0;
        for (position, rows) in &batch.segments {
            let table = &mut self.tables[*position];
            let width = table.spec.width;
            for &row in rows {
                let start = row as usize * width;
                let delta = &values[offset..offset + width];
                offset += width;
                // A stateful rule changes the row even for a zero delta (momentum goes on); a
                // stateless one leaves it as it is.
                if table.state.is_empty() && delta.iter().all(|d| *d == 0.0) {
                    continue;
                }
                table.mark_changed(row, mark);
                let state = if table.state.is_empty() {
                    &mut [][..]
                } else {
                    &mut table.state[start..start + width]
                };
                optimizer.apply(&mut table.data[start..start + width], state, delta);
            }
        }
    }

    /// Serves `worker`'s read for clock `clock`: its rows in batch order, to `sink` (one call per
    /// row), and records the read (it may open BSP push gates).
    pub fn pull_rows(
        &mut self,
        worker: u32,
        clock: u64,
        mut sink: impl FnMut(&[f32]),
    ) -> Result<(), StoreError> {
        self.pull_rows_since(worker, clock, None, |_, row| sink(row))
            .map(|_| ())
    }

    /// As [`PartitionStore::pull_rows`], but with `since` (the visible clock of a copy of the
    /// batch the worker holds, own writes included) only the rows a push of clock `since` or
    /// later changed go to `sink`, with their offset in the batch: every other row is what the
    /// worker holds. Pushes after a read at visible clock `v` are of clocks `v` and later, so no
    /// change since the held copy is left out. Returns whether the read was incremental: it is
    /// not (every row goes to `sink`) without `since` or where this store does not know which
    /// rows changed since then (it was restored from an image taken later).
    pub fn pull_rows_since(
        &mut self,
        worker: u32,
        clock: u64,
        since: Option<u64>,
        mut sink: impl FnMut(usize, &[f32]),
    ) -> Result<bool, StoreError> {
        let w = self.check_worker(worker)?;
        let batch = self.batches[w].as_ref().ok_or(StoreError::LookupBatch {
            worker,
            partition: self.partition,
        })?;
        let since = since.filter(|&s| s >= self.floor);
        let mut offset = 0;
        for (position, rows) in &batch.segments {
            let table = &self.tables[*position];
            let width = table.spec.width;
            for &row in rows {
                if since.is_none_or(|s| u64::from(table.touched[row as usize]) > s) {
                    let start = row as usize * width;
                    sink(offset, &table.data[start..start + width]);
                }
                offset += width;
            }
        }
        let read = &mut self.read_clock[w];
        *read = Some(read.map_or(clock, |r| r.max(clock)));
        Ok(since.is_some())
    }

    /// Feeds `worker`'s registered rows, in batch order, to `sink` (one call per row).
    pub fn read_rows(&self, worker: u32, mut sink: impl FnMut(&[f32])) -> Result<(), StoreError> {
        let w = self.check_worker(worker)?;
        let batch = self.batches[w].as_ref().ok_or(StoreError::LookupBatch {
            worker,
            partition: self.partition,
        })?;
        for (position, rows) in &batch.segments {
            let table = &self.tables[*position];
            let width = table.spec.width;
            for &row in rows {
                let start = row as usize * width;
                sink(&table.data[start..start + width]);
            }
        }
        Ok(())
    }

    /// Ids of the partition's tables, in declaration order.
    pub fn table_ids(&self) -> Vec<TableId> {
        self.tables.iter().map(|t| t.spec.id).collect()
    }

    /// Every materialised row of `table`: `(keys, values)` in storage order.
    pub fn table_rows(&self, table: TableId) -> Option<(&[u64], &[f32], usize)> {
        let t = self.tables.iter().find(|t| t.spec.id == table)?;
        Some((&t.keys, &t.data, t.spec.width))
    }

    /// Bytes of parameter values held (rows only, without optimizer state).
    pub fn parameter_bytes(&self) -> usize {
        self.tables.iter().map(|t| t.data.len() * 4).sum()
    }

    /// The partition's rows, optimizer state and per-worker clocks, moved out.
    fn into_image(self) -> PartitionImage {
        PartitionImage {
            partition: self.partition,
            tables: self
                .tables
                .into_iter()
                .map(|t| TableImage {
                    table: t.spec.id,
                    keys: t.keys,
                    data: t.data,
                    state: t.state,
                })
                .collect(),
            completed: self.completed,
        }
    }

    /// The store as a BackupPS copy, moved out.
    fn into_copy(mut self) -> BackupCopy {
        let touched = self
            .tables
            .iter_mut()
            .map(|t| std::mem::take(&mut t.touched))
            .collect();
        let floor = self.floor;
        BackupCopy {
            image: self.into_image(),
            touched,
            floor,
        }
    }

    /// A BackupPS copy of the store as it is, in the spare image's buffers if one was given
    /// back.
    fn copy(&mut self) -> BackupCopy {
        let image = match self.spare.take() {
            Some(mut spare) => {
                self.image_into(&mut spare);
                spare
            }
            None => self.image(),
        };
        BackupCopy {
            image,
            touched: self.tables.iter().map(|t| t.touched.clone()).collect(),
            floor: self.floor,
        }
    }

    /// Gives back the image of a copy once it is sent, for the next copy's buffers (see
    /// `spare`). An image of another partition is dropped.
    pub fn recycle(&mut self, image: PartitionImage) {
        if image.partition == self.partition {
            self.spare = Some(image);
        }
    }

    /// A copy of the partition's rows, optimizer state and per-worker clocks.
    pub fn image(&self) -> PartitionImage {
        let mut image = PartitionImage {
            partition: self.partition,
            tables: Vec::new(),
            completed: Vec::new(),
        };
        self.image_into(&mut image);
        image
    }

    /// [`PartitionStore::image`] into `image`, reusing its buffers.
    fn image_into(&self, image: &mut PartitionImage) {
        image.partition = self.partition;
        image
            .tables
            .resize_with(self.tables.len(), TableImage::default);
        for (to, from) in image.tables.iter_mut().zip(&self.tables) {
            to.table = from.spec.id;
            to.keys.clone_from(&from.keys);
            to.data.clone_from(&from.data);
            to.state.clone_from(&from.state);
        }
        image.completed.clone_from(&self.completed);
    }

    /// A partition restored from `image` at `epoch`. Workers register their batches again (their
    /// row order is per connection); reads restart from the image's clocks.
    pub fn from_image(
        image: PartitionImage,
        num_partitions: u32,
        epoch: u64,
        specs: &[TableSpec],
        optimizer: Optimizer,
        strict: bool,
    ) -> Result<Self, StoreError> {
        let partition = image.partition;
        let misfit = |reason: String| StoreError::RestoreImage { partition, reason };
        if partition >= num_partitions {
            return Err(misfit(format!("the job has {num_partitions} partitions")));
        }
        if image.tables.len() != specs.len() {
            return Err(misfit(format!(
                "{} tables, the job declares {}",
                image.tables.len(),
                specs.len()
            )));
        }
        let with_state = optimizer.has_state();
        let mut tables = Vec::with_capacity(specs.len());
        for (spec, table) in specs.iter().zip(image.tables) {
            if table.table != spec.id {
                return Err(misfit(format!(
                    "table {} where the job declares table {}",
                    table.table, spec.id
                )));
            }
            let values = table.keys.len() * spec.width;
            if table.data.len() != values {
                return Err(misfit(format!(
                    "table {} has {} values for {} rows of width {}",
                    spec.id,
                    table.data.len(),
                    table.keys.len(),
                    spec.width
                )));
            }
            let state_len = if with_state { values } else { 0 };
            if table.state.len() != state_len {
                return Err(misfit(format!(
                    "table {} has {} optimizer state values, expected {state_len}",
                    spec.id,
                    table.state.len()
                )));
            }
            let mut index = HashMap::with_capacity(table.keys.len());
            for (row, &key) in table.keys.iter().enumerate() {
                if crate::partition::partition_of(key, num_partitions) != partition {
                    return Err(misfit(format!("key {key} belongs to another partition")));
                }
                if index.insert(key, row as u32).is_some() {
                    return Err(misfit(format!(
                        "key {key} appears twice in table {}",
                        spec.id
                    )));
                }
            }
            tables.push(TableRows {
                spec: spec.clone(),
                index,
                touched: vec![0; table.keys.len()],
                keys: table.keys,
                data: table.data,
                state: table.state,
            });
        }
        let num_workers = image.completed.len();
        let visible_clock = image.completed.iter().copied().min().unwrap_or(0);
        // Which rows changed before the image is unknown here: a delta copy is taken only
        // since a clock every worker had pushed when it was taken.
        let floor = image.completed.iter().copied().max().unwrap_or(0);
        Ok(Self {
            partition,
            num_partitions,
            epoch,
            optimizer,
            tables,
            batches: (0..num_workers).map(|_| None).collect(),
            completed: image.completed,
            visible_clock,
            strict,
            read_clock: vec![None; num_workers],
            backups: Vec::new(),
            floor,
            spare: None,
        })
    }
}

/// One hosted partition with its wake-ups for waiters.
#[derive(Debug)]
struct Slot {
    store: Mutex<PartitionStore>,
    /// Wakes blocking (worker-thread) waiters on every change of the partition.
    changed: Condvar,
    /// Wakes async (connection-handler) waiters on every change (a change counter).
    watch: tokio::sync::watch::Sender<u64>,
    /// Set when the state is abandoned for a rollback: waiters give up at once.
    abandoned: std::sync::atomic::AtomicBool,
}

impl Slot {
    fn holding(store: PartitionStore) -> Arc<Self> {
        Arc::new(Self {
            store: Mutex::new(store),
            changed: Condvar::new(),
            watch: tokio::sync::watch::channel(0).0,
            abandoned: std::sync::atomic::AtomicBool::new(false),
        })
    }

    fn check_live(&self, partition: PartitionId) -> Result<(), StoreError> {
        if self.abandoned.load(std::sync::atomic::Ordering::Acquire) {
            Err(StoreError::Abandoned { partition })
        } else {
            Ok(())
        }
    }

    fn notify(&self) {
        self.changed.notify_all();
        self.watch
            .send_modify(|version| *version = version.wrapping_add(1));
    }
}

/// The partitions a server process hosts, shared by its connection handlers and local workers.
///
/// Partitions can be installed and taken out at clock boundaries (migrations, rollbacks): the
/// slot table is behind a read-write lock that requests only read.
#[derive(Debug)]
pub struct ServerState {
    slots: RwLock<Vec<Option<Arc<Slot>>>>,
}

impl ServerState {
    /// Hosts `partitions` (each at `epoch`) of a job with `num_partitions`, `specs` and
    /// `num_workers`; `strict` holds pushes for BSP (staleness 0).
    pub fn new(
        hosted: &[(PartitionId, u64)],
        num_partitions: u32,
        specs: &[TableSpec],
        num_workers: u32,
        optimizer: Optimizer,
        strict: bool,
    ) -> Self {
        let mut slots: Vec<Option<Arc<Slot>>> = (0..num_partitions).map(|_| None).collect();
        for &(partition, epoch) in hosted {
            if let Some(entry) = slots.get_mut(partition as usize) {
                *entry = Some(Slot::holding(PartitionStore::new(
                    partition,
                    num_partitions,
                    epoch,
                    specs,
                    num_workers,
                    optimizer,
                    strict,
                )));
            }
        }
        Self {
            slots: RwLock::new(slots),
        }
    }

    /// Hosts partitions restored from images, each at its epoch (a migration's new owner, or a
    /// rollback to the BackupPS copy).
    pub fn from_images(
        images: Vec<(PartitionImage, u64)>,
        num_partitions: u32,
        specs: &[TableSpec],
        optimizer: Optimizer,
        strict: bool,
    ) -> Result<Self, StoreError> {
        let state = Self {
            slots: RwLock::new((0..num_partitions).map(|_| None).collect()),
        };
        for (image, epoch) in images {
            state.install(image, epoch, specs, optimizer, strict)?;
        }
        Ok(state)
    }

    /// Hosts the partition of `image` at `epoch`, replacing any copy held (call at a clock
    /// boundary: a waiter on the replaced copy would never wake).
    pub fn install(
        &self,
        image: PartitionImage,
        epoch: u64,
        specs: &[TableSpec],
        optimizer: Optimizer,
        strict: bool,
    ) -> Result<(), StoreError> {
        let partition = image.partition;
        let mut slots = self.slots.write();
        let num_partitions = slots.len() as u32;
        let store =
            PartitionStore::from_image(image, num_partitions, epoch, specs, optimizer, strict)?;
        slots[partition as usize] = Some(Slot::holding(store));
        Ok(())
    }

    /// Stops hosting `partition`; returns its image (call at a clock boundary).
    pub fn take(&self, partition: PartitionId) -> Option<PartitionImage> {
        let slot = self.slots.write().get_mut(partition as usize)?.take()?;
        match Arc::try_unwrap(slot) {
            // Nobody else holds it (no request in flight, the usual case at a boundary): the
            // rows move out instead of being copied.
            Ok(slot) => Some(slot.store.into_inner().into_image()),
            Err(slot) => {
                let image = slot.store.lock().image();
                slot.notify();
                Some(image)
            }
        }
    }

    /// Drops every hosted partition: the job rolls back to its BackupPS copy, so this state is
    /// worthless, and every request waiting on it fails at once instead of timing out.
    pub fn abandon(&self) -> usize {
        let slots: Vec<Arc<Slot>> = self
            .slots
            .write()
            .iter_mut()
            .filter_map(Option::take)
            .collect();
        for slot in &slots {
            slot.abandoned
                .store(true, std::sync::atomic::Ordering::Release);
            // Under the lock, so a waiter between its check and its wait cannot miss the wake.
            let _held = slot.store.lock();
            slot.notify();
        }
        slots.len()
    }

    /// Images of every hosted partition (call at a clock boundary, when no push is in flight).
    pub fn images(&self) -> Vec<PartitionImage> {
        self.slots
            .read()
            .iter()
            .flatten()
            .map(|slot| slot.store.lock().image())
            .collect()
    }

    /// The image of one hosted partition.
    pub fn image(&self, partition: PartitionId) -> Option<PartitionImage> {
        self.slot(partition)
            .ok()
            .map(|slot| slot.store.lock().image())
    }

    /// (partition, visible clock) of every hosted partition.
    pub fn visible_clocks(&self) -> Vec<(PartitionId, u64)> {
        self.slots
            .read()
            .iter()
            .flatten()
            .map(|slot| {
                let store = slot.store.lock();
                (store.partition(), store.visible_clock())
            })
            .collect()
    }

    fn slot(&self, partition: PartitionId) -> Result<Arc<Slot>, StoreError> {
        self.slots
            .read()
            .get(partition as usize)
            .and_then(Option::clone)
            .ok_or(StoreError::LookupPartition { partition })
    }

    /// Runs `f` on the locked partition after checking `epoch`, then wakes waiters.
    pub fn with_partition<R>(
        &self,
        partition: PartitionId,
        epoch: u64,
        f: impl FnOnce(&mut PartitionStore) -> Result<R, StoreError>,
    ) -> Result<R, StoreError> {
        let slot = self.slot(partition)?;
        let mut store = slot.store.lock();
        store.check_epoch(epoch)?;
        let result = f(&mut store);
        drop(store);
        slot.notify();
        result
    }

    /// Blocks until `ready` holds for the partition (re-checked on every change).
    fn wait_blocking(
        &self,
        partition: PartitionId,
        timeout: std::time::Duration,
        ready: impl Fn(&PartitionStore) -> Result<bool, StoreError>,
        timed_out: impl Fn(&PartitionStore) -> StoreError,
    ) -> Result<(), StoreError> {
        let slot = self.slot(partition)?;
        let deadline = std::time::Instant::now() + timeout;
        let mut store = slot.store.lock();
        while !ready(&store)? {
            slot.check_live(partition)?;
            if slot.changed.wait_until(&mut store, deadline).timed_out() && !ready(&store)? {
                return Err(timed_out(&store));
            }
        }
        Ok(())
    }

    /// Waits (async) until `ready` holds for the partition (re-checked on every change).
    async fn wait_async(
        &self,
        partition: PartitionId,
        timeout: std::time::Duration,
        ready: impl Fn(&PartitionStore) -> Result<bool, StoreError>,
        timed_out: impl Fn(&PartitionStore) -> StoreError,
    ) -> Result<(), StoreError> {
        let slot = self.slot(partition)?;
        // Subscribed before checking, so no change between the check and the wait is missed.
        let mut receiver = slot.watch.subscribe();
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if ready(&slot.store.lock())? {
                return Ok(());
            }
            slot.check_live(partition)?;
            if tokio::time::timeout_at(deadline, receiver.changed())
                .await
                .is_err()
            {
                let store = slot.store.lock();
                return if ready(&store)? {
                    Ok(())
                } else {
                    Err(timed_out(&store))
                };
            }
        }
    }

    /// Blocks the calling thread until `partition`'s visible clock is at least `clock`.
    pub fn wait_clock_blocking(
        &self,
        partition: PartitionId,
        clock: u64,
        timeout: std::time::Duration,
    ) -> Result<(), StoreError> {
        self.wait_blocking(
            partition,
            timeout,
            |store| Ok(store.visible_clock() >= clock),
            |store| StoreError::WaitClock {
                partition,
                clock,
                visible: store.visible_clock(),
            },
        )
    }

    /// Waits (async) until `partition`'s visible clock is at least `clock`.
    pub async fn wait_clock(
        &self,
        partition: PartitionId,
        clock: u64,
        timeout: std::time::Duration,
    ) -> Result<(), StoreError> {
        self.wait_async(
            partition,
            timeout,
            |store| Ok(store.visible_clock() >= clock),
            |store| StoreError::WaitClock {
                partition,
                clock,
                visible: store.visible_clock(),
            },
        )
        .await
    }

    /// Waits (async) until `worker`'s push for `clock` may be applied (BSP gate; see module docs).
    pub async fn wait_push_gate(
        &self,
        partition: PartitionId,
        worker: u32,
        clock: u64,
        timeout: std::time::Duration,
    ) -> Result<(), StoreError> {
        let (open, timed_out) = push_gate_wait(partition, worker, clock);
        self.wait_async(partition, timeout, open, timed_out).await
    }

    /// Applies `worker`'s push for `clock`, first blocking while the BSP gate is closed (and
    /// again if it closed between the wait and the push: a worker registered meanwhile).
    pub fn push_blocking(
        &self,
        partition: PartitionId,
        epoch: u64,
        worker: u32,
        clock: u64,
        values: &[f32],
        timeout: std::time::Duration,
    ) -> Result<PushOutcome, StoreError> {
        loop {
            let (open, timed_out) = push_gate_wait(partition, worker, clock);
            self.wait_blocking(partition, timeout, open, timed_out)?;
            match self.with_partition(partition, epoch, |store| {
                store
                    .push(worker, clock, values)
                    .map(|(outcome, _)| outcome)
            }) {
                Err(StoreError::PushEarly { .. }) => continue,
                pushed => return pushed,
            }
        }
    }

    /// Arms a BackupPS copy at `clock` on every hosted partition (see
    /// [`PartitionStore::arm_backup`]); returns the partitions armed.
    pub fn arm_backups(&self, clock: u64) -> Result<Vec<PartitionId>, StoreError> {
        let slots: Vec<Arc<Slot>> = self.slots.read().iter().flatten().cloned().collect();
        let mut armed = Vec::with_capacity(slots.len());
        for slot in slots {
            let mut store = slot.store.lock();
            store.arm_backup(clock)?;
            armed.push(store.partition());
            drop(store);
            slot.notify();
        }
        Ok(armed)
    }

    /// Blocks until `partition`'s BackupPS copy at `clock` is ready and takes it. Fails at once
    /// if it is disarmed ([`ServerState::disarm_backups`]) or the partition abandoned.
    pub fn wait_backup_blocking(
        &self,
        partition: PartitionId,
        clock: u64,
        timeout: std::time::Duration,
    ) -> Result<BackupCopy, StoreError> {
        self.wait_blocking(
            partition,
            timeout,
            |store| store.backup_ready(clock),
            |store| StoreError::WaitClock {
                partition,
                clock,
                visible: store.visible_clock(),
            },
        )?;
        self.slot(partition)?
            .store
            .lock()
            .take_backup(clock)
            .ok_or(StoreError::BackupDisarmed { partition, clock })
    }

    /// Gives a sent copy's image back to its partition, if hosted here, for the next copy's
    /// buffers ([`PartitionStore::recycle`]).
    pub fn recycle(&self, image: PartitionImage) {
        if let Ok(slot) = self.slot(image.partition) {
            slot.store.lock().recycle(image);
        }
    }

    /// Drops the BackupPS copies armed at clocks `from` and later on every hosted partition
    /// and wakes their waiters (0: all).
    pub fn disarm_backups(&self, from: u64) {
        let slots: Vec<Arc<Slot>> = self.slots.read().iter().flatten().cloned().collect();
        for slot in slots {
            slot.store.lock().disarm_backups(from);
            slot.notify();
        }
    }

    /// Partitions hosted here, ascending.
    pub fn hosted(&self) -> Vec<PartitionId> {
        let slots = self.slots.read();
        (0..slots.len() as u32)
            .filter(|&p| slots[p as usize].is_some())
            .collect()
    }

    /// Bytes of parameter values held over all hosted partitions.
    pub fn parameter_bytes(&self) -> usize {
        self.slots
            .read()
            .iter()
            .flatten()
            .map(|slot| slot.store.lock().parameter_bytes())
            .sum()
    }

    /// Bytes of parameter values of the largest hosted partition.
    pub fn largest_partition_bytes(&self) -> usize {
        self.slots
            .read()
            .iter()
            .flatten()
            .map(|slot| slot.store.lock().parameter_bytes())
            .max()
            .unwrap_or(0)
    }
}

/// What waiting for `worker`'s BSP push gate at `clock` on `partition` checks (the gate is open,
/// or the push is a duplicate), and the error when it stays closed.
fn push_gate_wait(
    partition: PartitionId,
    worker: u32,
    clock: u64,
) -> (
    impl Fn(&PartitionStore) -> Result<bool, StoreError>,
    impl Fn(&PartitionStore) -> StoreError,
) {
    (
        move |store: &PartitionStore| Ok(store.push_gate(worker, clock)? != PushGate::Wait),
        move |store: &PartitionStore| StoreError::WaitClock {
            partition,
            clock,
            visible: store.visible_clock(),
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::app::RowInit;
    use crate::partition::partition_of;

    fn spec() -> Vec<TableSpec> {
        vec![TableSpec {
            id: 0,
            name: "t".into(),
            width: 2,
            init: RowInit::Zeros,
        }]
    }

    fn keys_of(partition: PartitionId, num_partitions: u32, n: usize) -> Vec<u64> {
        (0..)
            .filter(|&k| partition_of(k, num_partitions) == partition)
            .take(n)
            .collect()
    }

    fn read(store: &PartitionStore, worker: u32) -> Vec<f32> {
        let mut out = Vec::new();
        store
            .read_rows(worker, |row| out.extend_from_slice(row))
            .unwrap();
        out
    }

    fn two_workers(strict: bool) -> PartitionStore {
        let keys = keys_of(0, 2, 2);
        let mut store = PartitionStore::new(0, 2, 1, &spec(), 2, Optimizer::Add, strict);
        for worker in 0..2 {
            store.register(worker, &[(0, keys.clone())]).unwrap();
        }
        store
    }

    /// Values of a worker-independent push: worker `w`, clock `c`.
    fn delta(w: u32, c: u64) -> [f32; 4] {
        [(1 + w) as f32 * 100.0 + c as f32; 4]
    }

    #[test]
    fn a_registration_that_holds_the_rows_already_counts_as_their_read() {
        let keys = keys_of(0, 2, 2);
        let mut store = PartitionStore::new(0, 2, 1, &spec(), 2, Optimizer::Add, true);
        // A claim ahead of the partition is refused and registers nothing.
        assert!(matches!(
            store.register_read(0, &[(0, keys.clone())], Some(1), usize::MAX),
            Err(StoreError::RegisterReadThrough {
                clock: 1,
                visible: 0,
                ..
            })
        ));
        assert!(store.batch_len(0).is_err());
        // Both workers hold clock 0's rows (read from the previous owner): BSP pushes of clock
        // 0 need no new read.
        for worker in 0..2 {
            store
                .register_read(worker, &[(0, keys.clone())], Some(0), usize::MAX)
                .unwrap();
        }
        assert_eq!(store.push_gate(0, 0), Ok(PushGate::Open));
        // Without the claim, the push waits for the read.
        store.register(1, &[(0, keys.clone())]).unwrap();
        assert_eq!(store.push_gate(0, 0), Ok(PushGate::Wait));
    }

    #[test]
    fn take_moves_the_rows_out_or_copies_them_while_a_request_holds_the_partition() {
        let mut store = two_workers(false);
        store.push(0, 0, &delta(0, 0)).unwrap();
        store.push(1, 0, &delta(1, 0)).unwrap();
        let expected = store.image();
        let state = ServerState::from_images(
            vec![(expected.clone(), 3)],
            2,
            &spec(),
            Optimizer::Add,
            false,
        )
        .unwrap();
        // Nobody else holds the slot: the image moves out, and the partition is gone.
        assert_eq!(state.take(0), Some(expected.clone()));
        assert_eq!(state.take(0), None);
        assert!(state.image(0).is_none());
        // A request in flight holds the slot: the image is copied, and the request's waiters
        // are woken (it finds the partition gone from the table).
        state
            .install(expected.clone(), 4, &spec(), Optimizer::Add, false)
            .unwrap();
        let in_flight = state.slot(0).unwrap();
        assert_eq!(state.take(0), Some(expected.clone()));
        assert_eq!(in_flight.store.lock().image(), expected);
        assert!(state.slot(0).is_err());
    }

    #[test]
    fn a_backup_copy_under_ssp_holds_exactly_the_clocks_below_it() {
        // Worker 0 runs three clocks ahead of worker 1 (SSP): the copy at clock 2 must hold
        // clocks 0 and 1 of both and nothing of worker 0's clocks 2 and 3.
        let mut store = two_workers(false);
        store.arm_backup(2).unwrap();
        let mut reference = two_workers(false);
        for c in 0..4 {
            store.push(0, c, &delta(0, c)).unwrap();
            if c < 2 {
                reference.push(0, c, &delta(0, c)).unwrap();
            }
        }
        assert_eq!(store.backup_ready(2), Ok(false));
        store.push(1, 0, &delta(1, 0)).unwrap();
        reference.push(1, 0, &delta(1, 0)).unwrap();
        assert_eq!(store.backup_ready(2), Ok(false));
        store.push(1, 1, &delta(1, 1)).unwrap();
        reference.push(1, 1, &delta(1, 1)).unwrap();
        assert_eq!(store.backup_ready(2), Ok(true));
        // Later pushes change the live partition, not the copy.
        store.push(1, 2, &delta(1, 2)).unwrap();
        let copy = store.take_backup(2).unwrap().into_image();
        assert_eq!(copy, reference.image());
        assert_eq!(copy.visible_clock(), 2);
        assert_ne!(copy, store.image());
        assert_eq!(store.take_backup(2), None);
    }

    /// A copy's image given back is where the next copy is made (no new buffers), and that copy
    /// is the partition at its clock as a fresh one would be; another partition's is dropped.
    #[test]
    fn a_copy_is_made_in_the_buffers_of_the_last_one_given_back() {
        let mut store = two_workers(false);
        store.arm_backup(1).unwrap();
        for w in 0..2 {
            store.push(w, 0, &delta(w, 0)).unwrap();
        }
        let first = store.take_backup(1).unwrap().into_image();
        assert_eq!(first, store.image());
        let buffer = first.tables[0].data.as_ptr();
        store.recycle(first);
        store.arm_backup(2).unwrap();
        for w in 0..2 {
            store.push(w, 1, &delta(w, 1)).unwrap();
        }
        let second = store.take_backup(2).unwrap().into_image();
        assert_eq!(
            second.tables[0].data.as_ptr(),
            buffer,
            "made in the spare's buffer"
        );
        assert_eq!(second, store.image());
        assert_eq!(second.visible_clock(), 2);
        let mut other = second.clone();
        other.partition = 1;
        store.recycle(other);
        assert!(
            store.spare.is_none(),
            "another partition's image is not kept"
        );
    }

    /// A store of 2 workers over `rows` keys of partition 0 under `optimizer`, SSP.
    fn sparse_store(rows: usize, optimizer: Optimizer) -> (PartitionStore, Vec<u64>) {
        let keys = keys_of(0, 2, rows);
        let mut store = PartitionStore::new(0, 2, 1, &spec(), 2, optimizer, false);
        for worker in 0..2 {
            store.register(worker, &[(0, keys.clone())]).unwrap();
        }
        (store, keys)
    }

    /// Worker `w`'s push of clock `c` over `rows` rows of width 2: row `r` changes only at
    /// clocks where `(r + c) % 3 == 0`.
    fn sparse_push(w: u32, c: u64, rows: usize) -> Vec<f32> {
        (0..rows)
            .flat_map(|r| {
                let v = if (r as u64 + c) % 3 == 0 {
                    (1 + w) as f32 + c as f32
                } else {
                    0.0
                };
                [v, v]
            })
            .collect()
    }

    #[test]
    fn a_delta_copy_holds_only_the_rows_changed_since_its_base_and_rebuilds_the_whole() {
        let rows = 6;
        let (mut store, _) = sparse_store(rows, Optimizer::Add);
        store.arm_backup(3).unwrap();
        store.arm_backup(4).unwrap();
        // Worker 0 runs two clocks ahead (SSP): the copies are forked off before its pushes.
        for c in 0..6 {
            store.push(0, c, &sparse_push(0, c, rows)).unwrap();
            if c >= 1 {
                store.push(1, c - 1, &sparse_push(1, c - 1, rows)).unwrap();
            }
        }
        let three = store.take_backup(3).unwrap();
        let four = store.take_backup(4).unwrap();
        let (whole_three, base) = three.clone().since(None);
        assert_eq!(base, None);
        assert_eq!(whole_three.visible_clock(), 3);
        // Clock 3 changes rows 0 and 3 only.
        let bytes = four.bytes_since(Some(3));
        let (delta, base) = four.clone().since(Some(3));
        assert_eq!(base, Some(3));
        assert_eq!(delta.tables[0].keys.len(), 2, "{delta:?}");
        assert_eq!(bytes, (delta.parameter_bytes(), Some(3)));
        assert_eq!(four.bytes_since(None), (rows * 2 * 4, None));
        let mut rebuilt = whole_three.clone();
        apply_delta(&mut rebuilt, 3, delta).unwrap();
        assert_eq!(rebuilt, four.clone().into_image());
        // A delta since an earlier base holds more rows and applies just as well.
        let (wider, _) = four.clone().since(Some(1));
        assert!(wider.tables[0].keys.len() > 2);
        let mut rebuilt = whole_three.clone();
        apply_delta(&mut rebuilt, 1, wider).unwrap();
        assert_eq!(rebuilt, four.clone().into_image());
        // Applied to a copy older than its base, a delta would lose rows: refused.
        let (delta, _) = four.clone().since(Some(4));
        let mut older = whole_three.clone();
        assert!(matches!(
            apply_delta(&mut older, 4, delta),
            Err(StoreError::RestoreImage { .. })
        ));
        // A partition placed from an image at clock 4 knows nothing of earlier changes: a copy
        // since clock 3 is whole.
        let mut moved =
            PartitionStore::from_image(four.into_image(), 2, 2, &spec(), Optimizer::Add, false)
                .unwrap();
        moved.arm_backup(4).unwrap();
        let (copy, base) = moved.take_backup(4).unwrap().since(Some(3));
        assert_eq!((copy.tables[0].keys.len(), base), (rows, None));
    }

    /// Rows a read since a clock brings: `(offset, first value)` of each.
    fn pulled_since(store: &mut PartitionStore, since: Option<u64>) -> (Vec<(usize, f32)>, bool) {
        let mut rows = Vec::new();
        let incremental = store
            .pull_rows_since(0, store.visible_clock(), since, |offset, row| {
                rows.push((offset, row[0]))
            })
            .unwrap();
        (rows, incremental)
    }

    #[test]
    fn a_read_since_a_clock_brings_only_the_rows_changed_since() {
        let rows = 6;
        let (mut store, keys) = sparse_store(rows, Optimizer::Add);
        for c in 0..3 {
            for w in 0..2 {
                store.push(w, c, &sparse_push(w, c, rows)).unwrap();
            }
        }
        let whole = read(&store, 0);
        // Without a clock, or since before the first push: every row.
        let (all, incremental) = pulled_since(&mut store, None);
        assert!(!incremental);
        assert_eq!(all.len(), rows);
        assert_eq!(pulled_since(&mut store, Some(0)).0.len(), rows);
        // Clock 2 changed rows 1 and 4 only (width 2: offsets 2 and 8), with their values.
        let (changed, incremental) = pulled_since(&mut store, Some(2));
        assert!(incremental);
        assert_eq!(changed, vec![(2, whole[2]), (8, whole[8])]);
        assert_eq!(pulled_since(&mut store, Some(3)).0, vec![]);
        // A zero delta changes nothing.
        store.push(0, 3, &vec![0.0; rows * 2]).unwrap();
        store.push(1, 3, &vec![0.0; rows * 2]).unwrap();
        assert_eq!(read(&store, 0), whole);
        assert_eq!(pulled_since(&mut store, Some(3)).0, vec![]);
        // A partition placed from an image at clock 4 knows nothing of earlier changes: since
        // clock 3 it sends every row, since 4 what changed after.
        let mut moved =
            PartitionStore::from_image(store.image(), 2, 2, &spec(), Optimizer::Add, false)
                .unwrap();
        for w in 0..2 {
            moved.register(w, &[(0, keys.clone())]).unwrap();
        }
        let (all, incremental) = pulled_since(&mut moved, Some(3));
        assert_eq!((all.len(), incremental), (rows, false));
        assert_eq!(pulled_since(&mut moved, Some(4)), (vec![], true));
        moved.push(0, 4, &sparse_push(0, 5, rows)).unwrap();
        let changed: Vec<usize> = pulled_since(&mut moved, Some(4))
            .0
            .iter()
            .map(|r| r.0)
            .collect();
        assert_eq!(changed, vec![2, 8]);
    }

    #[test]
    fn a_stateful_optimizer_marks_every_pushed_row_changed() {
        let rows = 6;
        let momentum = Optimizer::Momentum {
            lr: 0.1,
            momentum: 0.9,
        };
        let (mut store, _) = sparse_store(rows, momentum);
        store.arm_backup(1).unwrap();
        store.arm_backup(2).unwrap();
        for c in 0..2 {
            for w in 0..2 {
                store.push(w, c, &sparse_push(w, c, rows)).unwrap();
            }
        }
        let one = store.take_backup(1).unwrap().into_image();
        let (delta, _) = store.take_backup(2).unwrap().since(Some(1));
        // Clock 1 changes rows 2 and 5, but momentum moves rows 0 and 3 on as well.
        assert_eq!(delta.tables[0].keys.len(), rows);
        let mut rebuilt = one;
        apply_delta(&mut rebuilt, 1, delta.clone()).unwrap();
        assert_eq!(rebuilt, delta);
    }

    #[test]
    fn a_backup_copy_under_bsp_is_taken_when_the_clock_completes() {
        let mut store = two_workers(true);
        store.arm_backup(1).unwrap();
        store.arm_backup(2).unwrap();
        for c in 0..3 {
            for w in 0..2 {
                store.pull_rows(w, c, |_| {}).unwrap();
            }
            for w in 0..2 {
                store.push(w, c, &delta(w, c)).unwrap();
            }
            if c == 0 {
                assert_eq!(store.backup_ready(1), Ok(true));
                assert_eq!(store.backup_ready(2), Ok(false));
            }
        }
        let one = store.take_backup(1).unwrap().into_image();
        assert_eq!(one.completed, vec![1, 1]);
        let two = store.take_backup(2).unwrap().into_image();
        assert_eq!(two.completed, vec![2, 2]);
        // Clock 0 gives 100 + 200, clock 1 adds 101 + 201.
        assert_eq!(two.tables[0].data, vec![602.0; 4]);
        assert_eq!(one.tables[0].data, vec![300.0; 4]);
    }

    #[test]
    fn a_backup_copy_too_late_or_disarmed_is_an_error() {
        let mut store = two_workers(false);
        store.push(0, 0, &delta(0, 0)).unwrap();
        store.push(0, 1, &delta(0, 1)).unwrap();
        // Worker 0 already pushed clock 1: a copy at clock 1 would contain it.
        assert!(matches!(
            store.arm_backup(1),
            Err(StoreError::BackupTooLate { clock: 1, .. })
        ));
        store.arm_backup(2).unwrap();
        store.disarm_backups(0);
        assert!(matches!(
            store.backup_ready(2),
            Err(StoreError::BackupDisarmed { clock: 2, .. })
        ));
        // Arming the current boundary of a quiet partition is ready at once.
        let mut quiet = two_workers(true);
        quiet.arm_backup(0).unwrap();
        assert_eq!(quiet.take_backup(0).unwrap().into_image(), quiet.image());
    }

    #[test]
    fn pushes_apply_once_and_the_visible_clock_is_the_slowest_worker() {
        let mut store = two_workers(false);
        assert_eq!(
            store.push(0, 0, &[1.0; 4]).unwrap(),
            (PushOutcome::Accepted, false)
        );
        assert_eq!(
            store.push(0, 1, &[10.0; 4]).unwrap(),
            (PushOutcome::Accepted, false)
        );
        assert_eq!(store.visible_clock(), 0);
        assert_eq!(
            store.push(1, 0, &[2.0; 4]).unwrap(),
            (PushOutcome::Accepted, true)
        );
        assert_eq!(store.visible_clock(), 1);
        assert_eq!(read(&store, 1), vec![13.0; 4]);
        // A retry of clock 0 is acknowledged and ignored; a gap or a wrong length is refused.
        assert_eq!(
            store.push(1, 0, &[2.0; 4]).unwrap(),
            (PushOutcome::Duplicate, false)
        );
        assert!(matches!(
            store.push(1, 5, &[0.0; 4]),
            Err(StoreError::PushClockGap {
                expected: 1,
                clock: 5,
                ..
            })
        ));
        assert!(matches!(
            store.push(1, 1, &[0.0; 3]),
            Err(StoreError::PushLength {
                expected: 4,
                got: 3,
                ..
            })
        ));
        let mut bytes = Vec::new();
        crate::frame::put_f32s(&mut bytes, &[20.0; 4]);
        assert_eq!(
            store.push_le(1, 1, &bytes).unwrap(),
            (PushOutcome::Accepted, true)
        );
        assert_eq!(read(&store, 0), vec![33.0; 4]);
        assert_eq!(store.visible_clock(), 2);
    }

    #[test]
    fn bsp_holds_a_push_until_every_reader_read_its_clock() {
        let mut store = two_workers(true);
        assert_eq!(
            store.push_gate(0, 0).unwrap(),
            PushGate::Wait,
            "nobody read clock 0 yet"
        );
        store.pull_rows(0, 0, |_| ()).unwrap();
        assert_eq!(
            store.push_gate(0, 0).unwrap(),
            PushGate::Wait,
            "worker 1 has not read clock 0"
        );
        assert!(matches!(
            store.push(0, 0, &[1.0; 4]),
            Err(StoreError::PushEarly { .. })
        ));
        store.pull_rows(1, 0, |_| ()).unwrap();
        assert_eq!(store.push_gate(0, 0).unwrap(), PushGate::Open);
        store.push(0, 0, &[1.0; 4]).unwrap();
        // Worker 0 is a clock ahead; its clock-1 push waits for worker 1's clock-1 read, which
        // itself needs worker 1's clock-0 push: the read then sees exactly clock 0.
        assert_eq!(store.push_gate(0, 1).unwrap(), PushGate::Wait);
        store.push(1, 0, &[2.0; 4]).unwrap();
        assert_eq!(store.visible_clock(), 1);
        let mut seen = Vec::new();
        store
            .pull_rows(1, 1, |row| seen.extend_from_slice(row))
            .unwrap();
        assert_eq!(seen, vec![3.0; 4]);
        store.pull_rows(0, 1, |_| ()).unwrap();
        assert_eq!(store.push_gate(0, 1).unwrap(), PushGate::Open);
        assert_eq!(store.push_gate(0, 0).unwrap(), PushGate::Duplicate);
    }

    #[test]
    fn registration_is_validated() {
        let mut store = PartitionStore::new(1, 2, 1, &spec(), 1, Optimizer::Add, false);
        let foreign = keys_of(0, 2, 1);
        assert!(matches!(
            store.register(0, &[(0, foreign)]),
            Err(StoreError::RegisterKey { .. })
        ));
        assert!(matches!(
            store.register(0, &[(9, vec![])]),
            Err(StoreError::RegisterTable { table: 9 })
        ));
        assert!(matches!(
            store.register(4, &[]),
            Err(StoreError::LookupWorker { worker: 4, .. })
        ));
        assert!(matches!(
            store.push(0, 0, &[]),
            Err(StoreError::LookupBatch { .. })
        ));
        assert!(matches!(
            store.check_epoch(2),
            Err(StoreError::CheckEpoch {
                current: 1,
                requested: 2,
                ..
            })
        ));
        // Refused registrations materialise no row: not one of more values than a frame
        // carries, nor one whose second table is undeclared.
        let keys = keys_of(1, 2, 3);
        assert!(matches!(
            store.register_read(0, &[(0, keys.clone())], None, 5),
            Err(StoreError::RegisterTooLarge {
                values: 6,
                max: 5,
                ..
            })
        ));
        assert!(matches!(
            store.register(0, &[(0, keys.clone()), (9, vec![])]),
            Err(StoreError::RegisterTable { table: 9 })
        ));
        assert_eq!(store.parameter_bytes(), 0);
        assert_eq!(store.register_read(0, &[(0, keys)], None, 6).unwrap(), 6);
        assert_eq!(store.parameter_bytes(), 6 * 4);
    }

    #[test]
    fn server_state_wakes_waiters() {
        let keys = keys_of(1, 2, 1);
        let state = std::sync::Arc::new(ServerState::new(
            &[(1, 3)],
            2,
            &spec(),
            1,
            Optimizer::Add,
            true,
        ));
        state
            .with_partition(1, 3, |s| s.register(0, &[(0, keys.clone())]))
            .unwrap();
        assert!(matches!(
            state.with_partition(0, 1, |_| Ok(())),
            Err(StoreError::LookupPartition { partition: 0 })
        ));
        let long = std::time::Duration::from_secs(60);
        let pusher = {
            let state = state.clone();
            // Blocks until the read of clock 0 below opens the BSP gate.
            std::thread::spawn(move || state.push_blocking(1, 3, 0, 0, &[1.5, 1.5], long))
        };
        let waiter = {
            let state = state.clone();
            std::thread::spawn(move || state.wait_clock_blocking(1, 1, long))
        };
        state
            .with_partition(1, 3, |s| s.pull_rows(0, 0, |_| ()))
            .unwrap();
        assert_eq!(pusher.join().unwrap(), Ok(PushOutcome::Accepted));
        assert_eq!(waiter.join().unwrap(), Ok(()));
        let timeout = state.wait_clock_blocking(1, 5, std::time::Duration::from_millis(1));
        assert!(matches!(
            timeout,
            Err(StoreError::WaitClock {
                clock: 5,
                visible: 1,
                ..
            })
        ));
        assert_eq!(state.parameter_bytes(), 8);
    }
}
