//! Worker threads: the clock loop, write-back deltas and the SSP-aware row cache refresh.
//!
//! Each worker thread owns one [`RowCache`] holding exactly its working set, grouped so that each
//! partition's rows are contiguous slot ranges per table. One clock:
//!
//! 1. the app mutates the cache ([`AppWorker::clock`]);
//! 2. per partition, `delta = data - snapshot` into a reused buffer (coalescing every write of the
//!    clock into one value per row), `snapshot = data`;
//! 3. the deltas of all partitions are pushed as one bulk batch per partition, tagged
//!    (worker, clock, partition) so servers apply each exactly once;
//! 4. for the next clock `t + 1`, SSP with staleness `s` needs every update of clocks `<= t - s`:
//!    partitions whose cached copy is older are pulled (waiting until the server's visible clock
//!    reaches `t + 1 - s`); fresher ones are kept. A worker's pushes reach a server before its next
//!    pull of that partition (same connection, or same thread in process), so a pulled copy always
//!    holds this worker's own writes, and a kept copy holds them because the app wrote them there.
//!    A pull of a copy held asks only for the rows a push changed since its visible clock (every
//!    push after that read is of that clock or later), and only those are installed.
//!
//! Nothing here allocates per clock: every buffer is sized once from the working set.
//!
//! With [`JobConfig::process_cache`] (the default) the worker threads of one process share one
//! [`ProcessCache`]: steps 3 and 4 go through it, so shared rows are fetched once per process and
//! the threads' deltas of a clock leave the process as one push per partition (see
//! [`crate::process_cache`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use thiserror::Error;

use crate::app::{AppError, AppWorker, ClockStats, RowCache, TableId, TableSpec, WorkingSet};
use crate::divergence::{Divergence, DivergenceGuard};
use crate::metrics::RuntimeMetrics;
use crate::optimizer::Optimizer;
use crate::partition::{PartitionId, partition_of};
use crate::process_cache::{ProcessCache, ReadScratch, Route, Run};
use crate::store::StoreError;

/// Settings of one training job.
#[derive(Debug, Clone, PartialEq)]
pub struct JobConfig {
    /// Clocks (iterations) to run.
    pub clocks: u64,
    /// SSP staleness `s` (0 = BSP).
    pub staleness: u64,
    /// Worker threads (per process in multi-process mode).
    pub workers: usize,
    /// Partitions of the key space (fixed for the job).
    pub partitions: u32,
    /// Server-side update rule.
    pub optimizer: Optimizer,
    /// How long a worker waits for the staleness bound (or a server reply) before failing.
    pub wait_timeout: Duration,
    /// Whether the run report keeps a full copy of the final parameters.
    pub keep_params: bool,
    /// Whether the worker threads of a process share one read cache and coalesce their pushes
    /// per clock ([`crate::process_cache`]); `false` keeps one cache and one server identity per
    /// thread. Only used with at least two threads in a process and a stateless server optimizer
    /// (a stateful one must see each worker's delta on its own).
    pub process_cache: bool,
    /// How the job's data-plane connections are protected ([`crate::tls`]; TLS by default).
    pub transport_security: crate::tls::TransportSecurity,
}

impl JobConfig {
    /// Whether a process running `local_workers` worker threads shares a [`ProcessCache`].
    pub fn shares_cache(&self, local_workers: usize) -> bool {
        self.process_cache && local_workers > 1 && !self.optimizer.has_state()
    }
}

impl Default for JobConfig {
    fn default() -> Self {
        Self {
            clocks: 10,
            staleness: 0,
            workers: std::thread::available_parallelism().map_or(1, |n| n.get()),
            partitions: 4,
            optimizer: Optimizer::Add,
            wait_timeout: Duration::from_secs(600),
            keep_params: false,
            process_cache: true,
            transport_security: crate::tls::TransportSecurity::Tls,
        }
    }
}

/// Errors of a worker thread.
#[derive(Debug, Error)]
pub enum WorkerError {
    /// The app's working set does not fit its table declarations.
    #[error("building the row cache failed: {0}")]
    BuildCache(#[from] AppError),
    /// A local server refused a request.
    #[error("server refused a request: {0}")]
    Serve(#[from] StoreError),
    /// A remote server could not be reached or refused a request.
    #[error("data plane request failed: {0}")]
    Remote(#[from] crate::client::ClientError),
    /// The server's batch length disagrees with the worker's.
    #[error("partition {partition} registered {server} values, worker expected {worker}")]
    RegisterLength {
        /// The partition.
        partition: PartitionId,
        /// Values the server resolved.
        server: usize,
        /// Values the worker will send.
        worker: usize,
    },
    /// Another worker thread sharing this process's cache failed.
    #[error("a worker thread sharing this process's cache failed: {reason}")]
    PeerFailed {
        /// Its failure.
        reason: String,
    },
    /// The other worker threads of this process did not get as far in time.
    #[error("waited {waited:?} for this process's other worker threads ({what})")]
    WaitPeers {
        /// What was awaited.
        what: &'static str,
        /// How long.
        waited: Duration,
    },
}

impl WorkerError {
    /// Static label for metrics.
    pub fn category(&self) -> &'static str {
        match self {
            WorkerError::BuildCache(e) => e.category(),
            WorkerError::Serve(e) => e.category(),
            WorkerError::Remote(e) => e.category(),
            WorkerError::RegisterLength { .. } => "register_length",
            WorkerError::PeerFailed { .. } => "peer_failed",
            WorkerError::WaitPeers { .. } => "wait_peers",
        }
    }
}

/// A worker's state for one partition: which cache rows belong to it, and reused buffers.
#[derive(Debug)]
pub(crate) struct PartitionView {
    pub(crate) partition: PartitionId,
    /// `(table position in the cache, first slot, end slot)`.
    ranges: Vec<(usize, usize, usize)>,
    /// Values in the batch (sum over ranges of rows × width).
    pub(crate) len: usize,
    /// This clock's deltas (pushed).
    pub(crate) delta: Vec<f32>,
    /// Rows received by a pull. A worker's view lends it the `delta` buffer for the pull, which
    /// is dead between a push and the next clock's deltas (`WorkerLoop::refresh`).
    pub(crate) incoming: Vec<f32>,
    /// Visible clock of the cached copy (all updates of clocks below it are in the cache).
    pub(crate) visible: u64,
    /// Set before a pull: whether this partition must be refreshed.
    pub(crate) needs_pull: bool,
    /// The server's copy changed (a new registration): pull before the next clock whatever
    /// `visible` says.
    pub(crate) stale: bool,
    /// With a process cache: the registration generation of the copy installed.
    pub(crate) generation: u64,
    /// Set before a pull: the visible clock of the copy held (own writes included), so that the
    /// transport may send only the rows changed since ([`Transport::pull`]); `None`: all.
    pub(crate) since: Option<u64>,
    /// After a pull: `None` if `incoming` holds every row, else the stretches
    /// `(offset, values)` it holds (the rows changed since `since`; the others are as held).
    pub(crate) fresh: Option<Vec<(usize, usize)>>,
    /// With a process cache: the group copy's fetch count when this view was last copied.
    pub(crate) copied: u64,
}

impl PartitionView {
    /// A view of `len` values without cache rows or buffers (the process cache's union batches).
    pub(crate) fn bare(partition: PartitionId, len: usize) -> Self {
        Self {
            partition,
            ranges: Vec::new(),
            len,
            delta: Vec::new(),
            incoming: Vec::new(),
            visible: 0,
            needs_pull: false,
            stale: false,
            generation: 0,
            since: None,
            fresh: None,
            copied: 0,
        }
    }
}

/// One batch to register: partition, keys per table, and the clock the worker holds its rows at.
pub(crate) type RegisterBatch = (PartitionId, Vec<(TableId, Vec<u64>)>, Option<u64>);

/// Moves values between a worker and the servers of its partitions.
pub(crate) trait Transport {
    /// Registers the worker's batch with a partition; returns the server's value count.
    /// `read_through`: the worker holds the rows as of that visible clock already.
    fn register(
        &mut self,
        worker: u32,
        partition: PartitionId,
        tables: &[(TableId, Vec<u64>)],
        read_through: Option<u64>,
    ) -> Result<usize, WorkerError>;
    /// Registers several batches, `(partition, keys per table, read_through)`; returns the
    /// server's value count of each, in order. A transport may send them all before it waits
    /// for the answers.
    fn register_all(
        &mut self,
        worker: u32,
        batches: &[RegisterBatch],
    ) -> Result<Vec<usize>, WorkerError> {
        batches
            .iter()
            .map(|(partition, tables, read_through)| {
                self.register(worker, *partition, tables, *read_through)
            })
            .collect()
    }
    /// Pushes every view's `delta` for `clock` (one bulk batch per partition).
    fn push(&mut self, worker: u32, clock: u64, views: &[PartitionView])
    -> Result<(), WorkerError>;
    /// For every view with `needs_pull`, waits until its visible clock is at least `min_clock`,
    /// then fills `incoming` and sets `visible` and `fresh`. With `since` set a transport may
    /// fill only the rows changed since that clock (`fresh` lists them); it may always fill all
    /// (`fresh` = `None`).
    fn pull(
        &mut self,
        worker: u32,
        min_clock: u64,
        views: &mut [PartitionView],
    ) -> Result<(), WorkerError>;
}

/// Which clocks a worker thread runs: from `first` up to an end that a controller may pull in
/// while the workers run (an elasticity event ends the segment at the next clock boundary).
///
/// Every worker asks before starting a clock; [`ClockGate::end_soon`] picks the end as one past
/// the highest clock any worker started, so all workers stop after the same clock and the servers
/// are left at a consistent clock boundary.
///
/// Across processes the end is agreed in two steps: every process's gate is paused
/// ([`ClockGate::pause`], which reports the highest clock started there and holds back any later
/// one), the coordinator takes one past the highest over all processes, and every gate is given
/// that end ([`ClockGate::end_at`]).
#[derive(Debug)]
pub struct ClockGate {
    first: u64,
    inner: parking_lot::Mutex<GateState>,
    resumed: parking_lot::Condvar,
}

#[derive(Debug)]
struct GateState {
    end: u64,
    started: Option<u64>,
    paused: bool,
}

impl ClockGate {
    /// Clocks `first..end`.
    pub fn range(first: u64, end: u64) -> Self {
        Self {
            first,
            inner: parking_lot::Mutex::new(GateState {
                end: end.max(first),
                started: None,
                paused: false,
            }),
            resumed: parking_lot::Condvar::new(),
        }
    }

    /// The first clock.
    pub fn first(&self) -> u64 {
        self.first
    }

    /// The current end (exclusive).
    pub fn end(&self) -> u64 {
        self.inner.lock().end
    }

    /// Whether a worker may start `clock` (records that it did). While the gate is paused, a
    /// clock past the highest one started waits for [`ClockGate::end_at`].
    pub fn try_start(&self, clock: u64) -> bool {
        let mut inner = self.inner.lock();
        while inner.paused && inner.started.is_none_or(|started| clock > started) {
            self.resumed.wait(&mut inner);
        }
        if clock >= inner.end {
            return false;
        }
        inner.started = Some(inner.started.map_or(clock, |started| started.max(clock)));
        true
    }

    /// Ends the range after the highest clock started so far (or before `first` if none started);
    /// returns the new end.
    pub fn end_soon(&self) -> u64 {
        self.end_after_started_or(self.first)
    }

    /// As [`ClockGate::end_soon`], but a range that started no clock yet still runs its first:
    /// an interrupt always leaves a segment one clock of progress, so events arriving faster
    /// than boundaries cannot hold a run at one clock (each segment ended before its workers
    /// started). Returns the new end.
    pub fn end_soon_after_progress(&self) -> u64 {
        self.end_after_started_or(self.first + 1)
    }

    /// Ends the range one past the highest clock started, or at `none_started` if none did;
    /// never later than it ends already.
    fn end_after_started_or(&self, none_started: u64) -> u64 {
        let mut inner = self.inner.lock();
        let soonest = inner.started.map_or(none_started, |started| started + 1);
        inner.end = inner.end.min(soonest);
        inner.end
    }

    /// One past the highest clock started (`first` if none), at most the end: the least end
    /// this process can agree to.
    pub fn least_end(&self) -> u64 {
        self.least_end_of(&self.inner.lock())
    }

    fn least_end_of(&self, inner: &GateState) -> u64 {
        inner
            .started
            .map_or(self.first, |started| started + 1)
            .min(inner.end)
    }

    /// Holds back clocks past the highest started and returns one past it (`first` if none
    /// started): the least end this process can agree to.
    pub fn pause(&self) -> u64 {
        let mut inner = self.inner.lock();
        inner.paused = true;
        self.least_end_of(&inner)
    }

    /// Ends the range at `end` (never later than it was) and releases paused workers.
    pub fn end_at(&self, end: u64) {
        let mut inner = self.inner.lock();
        inner.end = inner.end.min(end.max(self.first));
        inner.paused = false;
        self.resumed.notify_all();
    }
}

/// The clocks a running segment's workers have finished, with their reports so far: a node
/// answers a background BackupPS copy at clock `c` with its workers' reports of the clocks below
/// `c`, so a segment that fails after the copy is not redone before it (the coordinator has both
/// the partitions' state and the workers' results of those clocks).
#[derive(Debug, Default)]
pub struct SegmentProgress {
    reports: parking_lot::Mutex<std::collections::BTreeMap<u32, WorkerReport>>,
    changed: parking_lot::Condvar,
}

/// What a worker does when its training loss diverges, besides reporting it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DivergenceStop {
    /// End the clock gate every worker of the run shares (single process).
    EndGate,
    /// Only report it: the gate is one node's, and the node's peers would wait for clocks it
    /// never ran; the coordinator ends the segment for all of them.
    Report,
}

impl SegmentProgress {
    /// Records that `worker` diverged (reported with its next clocks).
    pub fn diverged(&self, worker: u32, divergence: Divergence) {
        let mut reports = self.reports.lock();
        if let Some(report) = reports.get_mut(&worker) {
            report.diverged.get_or_insert(divergence);
        }
    }

    /// Records that `worker` finished `clock` (the next after what it recorded, from `first`).
    pub fn record(&self, worker: u32, first: u64, stats: ClockStats, clock_end: f64) {
        let mut reports = self.reports.lock();
        let report = reports.entry(worker).or_insert_with(|| WorkerReport {
            first_clock: first,
            ..WorkerReport::default()
        });
        report.stats.push(stats);
        report.clock_end.push(clock_end);
        drop(reports);
        self.changed.notify_all();
    }

    /// The reports of `workers` over the clocks below `clock` once every one of them finished
    /// `clock - 1`; `None` if `timeout` passed first or `gave_up` says the clock will not come.
    pub fn through(
        &self,
        workers: &[u32],
        first: u64,
        clock: u64,
        timeout: Duration,
        gave_up: impl Fn() -> bool,
    ) -> Option<Vec<(u32, WorkerReport)>> {
        let needed = clock.saturating_sub(first) as usize;
        let deadline = Instant::now() + timeout;
        let mut reports = self.reports.lock();
        loop {
            let done = workers
                .iter()
                .all(|w| needed == 0 || reports.get(w).is_some_and(|r| r.stats.len() >= needed));
            if done {
                return Some(
                    workers
                        .iter()
                        .map(|w| {
                            let mut report = reports.get(w).cloned().unwrap_or(WorkerReport {
                                first_clock: first,
                                ..WorkerReport::default()
                            });
                            report.stats.truncate(needed);
                            report.clock_end.truncate(needed);
                            (*w, report)
                        })
                        .collect(),
                );
            }
            if gave_up() {
                return None;
            }
            // Short waits: `gave_up` is checked between them.
            let wake = deadline.min(Instant::now() + Duration::from_millis(20));
            if self.changed.wait_until(&mut reports, wake).timed_out() && Instant::now() >= deadline
            {
                return None;
            }
        }
    }
}

/// What one worker thread did.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct WorkerReport {
    /// The clock of `stats[0]` (non-zero for a segment of an elastic run).
    #[serde(default)]
    pub first_clock: u64,
    /// Per clock: the app's stats.
    pub stats: Vec<ClockStats>,
    /// Per clock: seconds since the run's start when the clock ended.
    pub clock_end: Vec<f64>,
    /// Seconds spent in pulls (waiting for the staleness bound included).
    pub wait_seconds: f64,
    /// The first divergence of this worker's training loss, if it diverged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub diverged: Option<Divergence>,
}

/// Builds one view per partition from the cache's partition-grouped slot order.
fn build_views(cache: &RowCache, num_partitions: u32) -> Vec<PartitionView> {
    let mut views: Vec<PartitionView> = (0..num_partitions)
        .map(|partition| PartitionView::bare(partition, 0))
        .collect();
    for (position, table) in cache.tables.iter().enumerate() {
        let mut start = 0;
        while start < table.slot_keys.len() {
            let partition = partition_of(table.slot_keys[start], num_partitions);
            let mut end = start + 1;
            while end < table.slot_keys.len()
                && partition_of(table.slot_keys[end], num_partitions) == partition
            {
                end += 1;
            }
            let view = &mut views[partition as usize];
            view.ranges.push((position, start, end));
            view.len += (end - start) * table.width;
            start = end;
        }
    }
    for view in &mut views {
        // `incoming` borrows this buffer for each pull (`WorkerLoop::refresh`).
        view.delta = vec![0.0; view.len];
    }
    views
}

/// Keys per table of a view, in batch order (sent once at registration).
fn view_keys(cache: &RowCache, view: &PartitionView) -> Vec<(TableId, Vec<u64>)> {
    view.ranges
        .iter()
        .map(|&(position, start, end)| {
            let table = &cache.tables[position];
            (table.id, table.slot_keys[start..end].to_vec())
        })
        .collect()
}

/// `delta = data - snapshot; snapshot = data` over the view's rows.
fn collect_delta(cache: &mut RowCache, view: &mut PartitionView) {
    let mut offset = 0;
    for &(position, start, end) in &view.ranges {
        let table = &mut cache.tables[position];
        let (from, to) = (start * table.width, end * table.width);
        let delta = &mut view.delta[offset..offset + (to - from)];
        for ((d, value), snap) in delta
            .iter_mut()
            .zip(&table.data[from..to])
            .zip(&mut table.snapshot[from..to])
        {
            *d = value - *snap;
            *snap = *value;
        }
        offset += to - from;
    }
}

/// Appends the stretch `(at, n)` of a view's values to `fresh` (in offset order), joining it to
/// the last one where they meet.
pub(crate) fn add_stretch(fresh: &mut Vec<(usize, usize)>, at: usize, n: usize) {
    match fresh.last_mut() {
        Some((start, len)) if *start + *len == at => *len += n,
        _ => fresh.push((at, n)),
    }
}

/// The rows and values a pull moved: every one of a batch laid out as `segments` (each table's
/// values and row width, end to end), or those of the `fresh` stretches it came back with
/// (whole rows, in offset order, a stretch perhaps crossing from one table into the next): an
/// incremental read moves only the rows changed since the copy held.
pub(crate) fn pulled_rows_and_values(
    fresh: Option<&[(usize, usize)]>,
    segments: impl Iterator<Item = (usize, usize)>,
) -> (u64, u64) {
    let (mut rows, mut values, mut offset) = (0u64, 0u64, 0usize);
    let mut stretches = fresh.map(|f| f.iter().peekable());
    for (len, width) in segments {
        let covered = match stretches.as_mut() {
            None => len,
            Some(stretches) => {
                let mut covered = 0;
                while let Some(&&(at, n)) = stretches.peek() {
                    if at >= offset + len {
                        break;
                    }
                    covered += (at + n).min(offset + len) - at.max(offset);
                    if at + n > offset + len {
                        break;
                    }
                    stretches.next();
                }
                covered
            }
        };
        rows += (covered / width.max(1)) as u64;
        values += covered as u64;
        offset += len;
    }
    (rows, values)
}

/// Installs a pulled copy: `data = snapshot = incoming`, over the stretches `fresh` names (all
/// without it).
fn install(cache: &mut RowCache, view: &mut PartitionView) {
    let mut offset = 0;
    let mut fresh = view.fresh.as_deref().map(|f| f.iter().peekable());
    for &(position, start, end) in &view.ranges {
        let table = &mut cache.tables[position];
        let (from, to) = (start * table.width, end * table.width);
        let len = to - from;
        let mut put = |at: usize, n: usize| {
            let source = &view.incoming[offset + at..offset + at + n];
            table.data[from + at..from + at + n].copy_from_slice(source);
            table.snapshot[from + at..from + at + n].copy_from_slice(source);
        };
        match fresh.as_mut() {
            None => put(0, len),
            Some(stretches) => {
                // Stretches are in offset order and may cross from one range into the next.
                while let Some(&&(at, n)) = stretches.peek() {
                    if at >= offset + len {
                        break;
                    }
                    let (lo, hi) = (at.max(offset), (at + n).min(offset + len));
                    put(lo - offset, hi - lo);
                    if at + n > offset + len {
                        break;
                    }
                    stretches.next();
                }
            }
        }
        offset += len;
    }
}

/// A worker thread's membership in its process's [`ProcessCache`].
struct Attached {
    cache: Arc<ProcessCache>,
    /// Per partition: where the thread's view lies in the union batch.
    runs: Vec<Vec<Run>>,
    /// Buffers for reads through the cache.
    scratch: ReadScratch,
}

/// One worker thread's state across the segments of a run: its app worker (data shard), row
/// cache and per-partition views. Built once; each segment registers only with servers that
/// changed and pulls only what is stale.
pub(crate) struct WorkerLoop<W: AppWorker> {
    worker_id: u32,
    app_worker: W,
    cache: RowCache,
    views: Vec<PartitionView>,
    pushed_rows: u64,
    pushed_bytes: u64,
    shared: Option<Attached>,
    /// Watches this worker's training loss across the segments of the run.
    guard: DivergenceGuard,
}

impl<W: AppWorker> WorkerLoop<W> {
    /// Builds the worker's cache of `working_set` (its app worker's) for `num_partitions`
    /// partitions.
    pub(crate) fn new(
        worker_id: u32,
        mut app_worker: W,
        working_set: &WorkingSet,
        specs: &[TableSpec],
        num_partitions: u32,
    ) -> Result<Self, WorkerError> {
        let cache = RowCache::build(specs, working_set, |key| partition_of(key, num_partitions))?;
        let views = build_views(&cache, num_partitions);
        app_worker.bind(&cache);
        let pushed_rows: u64 = (views.iter().flat_map(|view| &view.ranges))
            .map(|&(_, start, end)| (end - start) as u64)
            .sum();
        let pushed_bytes: u64 = views.iter().map(|v| v.len as u64 * 4).sum();
        Ok(Self {
            worker_id,
            app_worker,
            cache,
            views,
            pushed_rows,
            pushed_bytes,
            shared: None,
            guard: DivergenceGuard::new(),
        })
    }

    /// Whether the worker reads and writes on its own (no process cache).
    pub(crate) fn is_alone(&self) -> bool {
        self.shared.is_none()
    }

    /// Reads and writes through `cache` from now on (`None`: on its own). Joining a different
    /// cache than before marks every copy stale; leaving one keeps the copies (the thread's own
    /// cache holds what it last read through the group).
    pub(crate) fn attach(&mut self, cache: Option<&Arc<ProcessCache>>) {
        let same = match (&self.shared, cache) {
            (Some(attached), Some(cache)) => Arc::ptr_eq(&attached.cache, cache),
            (None, None) => true,
            _ => false,
        };
        if same {
            return;
        }
        if cache.is_some() {
            for view in &mut self.views {
                view.stale = true;
            }
        }
        self.shared = cache.map(|cache| {
            let runs = self
                .views
                .iter()
                .map(|view| {
                    let tables: Vec<(TableId, &[u64], usize)> = view
                        .ranges
                        .iter()
                        .map(|&(position, start, end)| {
                            let table = &self.cache.tables[position];
                            (table.id, &table.slot_keys[start..end], table.width)
                        })
                        .collect();
                    cache.runs(view.partition, &tables)
                })
                .collect();
            Attached {
                cache: cache.clone(),
                runs,
                scratch: ReadScratch::default(),
            }
        });
    }

    /// Registers the worker's batch with the servers of `partitions` (every partition when
    /// `None`). With `carried` (every partition holds what it held at the end of the last
    /// segment: it moved, or stayed, but was not restored) a copy the worker holds stays valid,
    /// and the registration tells the server it was read (BSP pushes need not wait for a new
    /// read); otherwise the copies are marked stale so the next segment pulls them (which also
    /// records the read a BSP server waits for before it takes this worker's next push).
    pub(crate) fn register<T: Transport>(
        &mut self,
        transport: &mut T,
        partitions: Option<&[PartitionId]>,
        carried: bool,
    ) -> Result<(), WorkerError> {
        let chosen: Vec<usize> = (0..self.views.len())
            .filter(|&i| partitions.is_none_or(|wanted| wanted.contains(&self.views[i].partition)))
            .collect();
        let batches: Vec<RegisterBatch> = chosen
            .iter()
            .map(|&i| {
                let view = &self.views[i];
                let read_through = (carried && !view.stale).then_some(view.visible);
                (view.partition, view_keys(&self.cache, view), read_through)
            })
            .collect();
        let lens = transport.register_all(self.worker_id, &batches)?;
        for ((&i, (_, _, read_through)), server) in chosen.iter().zip(&batches).zip(lens) {
            let view = &mut self.views[i];
            if server != view.len {
                return Err(WorkerError::RegisterLength {
                    partition: view.partition,
                    server,
                    worker: view.len,
                });
            }
            view.stale = read_through.is_none();
        }
        Ok(())
    }

    /// Pulls every view older than `min_clock` (or every view, with `force`); `done` is the
    /// number of clocks this worker has pushed, `owed` whether it owes its process cache a
    /// wake-up.
    #[allow(clippy::too_many_arguments)]
    fn refresh<T: Transport>(
        &mut self,
        transport: &mut T,
        min_clock: u64,
        done: u64,
        force: bool,
        owed: bool,
        report: &mut WorkerReport,
        metrics: &RuntimeMetrics,
    ) -> Result<(), WorkerError> {
        // A view's pushed `delta` is dead until the next clock's `collect_delta` overwrites it,
        // so the pull lands in that buffer: one buffer per view instead of two (a worker's
        // memory is its cache rows, their snapshot and this buffer).
        for view in &mut self.views {
            std::mem::swap(&mut view.incoming, &mut view.delta);
        }
        let waited = Instant::now();
        let pulled = match self.shared.as_mut() {
            Some(shared) => shared.cache.read(
                transport,
                min_clock,
                done,
                force,
                owed,
                &mut self.views,
                &shared.runs,
                &mut shared.scratch,
                metrics,
            ),
            None => {
                for view in self.views.iter_mut() {
                    view.needs_pull =
                        view.len > 0 && (force || view.stale || view.visible < min_clock);
                    view.since = (!force && !view.stale).then_some(view.visible);
                }
                transport.pull(self.worker_id, min_clock, &mut self.views)
            }
        };
        let waited = waited.elapsed().as_secs_f64();
        if pulled.is_ok() {
            if self.shared.is_none() {
                let (mut rows, mut values) = (0, 0);
                for view in self.views.iter().filter(|v| v.needs_pull) {
                    let segments = view.ranges.iter().map(|&(position, start, end)| {
                        let width = self.cache.tables[position].width;
                        ((end - start) * width, width)
                    });
                    let moved = pulled_rows_and_values(view.fresh.as_deref(), segments);
                    rows += moved.0;
                    values += moved.1;
                }
                metrics.rows_moved.with_label_values(&["pull"]).inc_by(rows);
                metrics
                    .bytes_moved
                    .with_label_values(&["pull"])
                    .inc_by(values * 4);
            }
            for view in self.views.iter_mut().filter(|v| v.needs_pull) {
                install(&mut self.cache, view);
                view.stale = false;
            }
        }
        for view in &mut self.views {
            std::mem::swap(&mut view.incoming, &mut view.delta);
        }
        pulled?;
        report.wait_seconds += waited;
        metrics.ssp_wait_seconds.observe(waited);
        Ok(())
    }

    /// Sends this clock's deltas: straight to the servers, or into the process cache; returns
    /// whether the refresh that follows (`reading_next`) owes the cache a wake-up.
    fn push<T: Transport>(
        &mut self,
        transport: &mut T,
        clock: u64,
        reading_next: bool,
        metrics: &RuntimeMetrics,
    ) -> Result<bool, WorkerError> {
        if let Some(shared) = &self.shared {
            return shared.cache.contribute(
                transport,
                self.worker_id,
                clock,
                &self.views,
                &shared.runs,
                reading_next,
                metrics,
            );
        }
        transport.push(self.worker_id, clock, &self.views)?;
        metrics
            .rows_moved
            .with_label_values(&["push"])
            .inc_by(self.pushed_rows);
        metrics
            .bytes_moved
            .with_label_values(&["push"])
            .inc_by(self.pushed_bytes);
        Ok(false)
    }

    /// Runs the clocks `gate` lets this worker run. The first pull refreshes what is stale for
    /// the first clock (everything, with `force`); after each clock but the job's last, the
    /// copies the next clock needs are pulled, so a following segment starts warm. On a failure
    /// the caller fails the process cache too, so the threads sharing it stop waiting.
    pub(crate) fn run<T: Transport>(
        &mut self,
        transport: &mut T,
        config: &JobConfig,
        gate: &ClockGate,
        force: bool,
        metrics: &RuntimeMetrics,
        run_start: Instant,
        progress: Option<&SegmentProgress>,
        divergence_stop: DivergenceStop,
    ) -> Result<WorkerReport, WorkerError> {
        let first = gate.first();
        let mut report = WorkerReport {
            first_clock: first,
            ..WorkerReport::default()
        };
        // A segment starts at a clock boundary where every update of earlier clocks is applied.
        let first_bound = if force {
            first
        } else {
            first.saturating_sub(config.staleness)
        };
        self.refresh(
            transport,
            first_bound,
            first,
            force,
            false,
            &mut report,
            metrics,
        )?;

        for clock in first..config.clocks {
            if !gate.try_start(clock) {
                break;
            }
            let started = Instant::now();
            let stats = self.app_worker.clock(&mut self.cache, clock);
            for view in &mut self.views {
                collect_delta(&mut self.cache, view);
            }
            let reading_next = clock + 1 < config.clocks;
            let owed = self.push(transport, clock, reading_next, metrics)?;
            if reading_next {
                let min_clock = (clock + 1).saturating_sub(config.staleness);
                self.refresh(
                    transport,
                    min_clock,
                    clock + 1,
                    false,
                    owed,
                    &mut report,
                    metrics,
                )?;
            }
            metrics.iterations.inc();
            metrics
                .iteration_seconds
                .observe(started.elapsed().as_secs_f64());
            if let Some(loss) = stats.mean_loss() {
                metrics.loss.set(loss);
            }
            let clock_end = run_start.elapsed().as_secs_f64();
            report.stats.push(stats);
            report.clock_end.push(clock_end);
            let failed = self
                .app_worker
                .failure()
                .map(|what| Divergence::app_failed(clock, what));
            let diverged = failed.or_else(|| self.guard.observe(clock, &stats));
            if let Some(divergence) = &diverged {
                tracing::error!(worker = self.worker_id, %divergence, "the worker halts the run");
                if divergence_stop == DivergenceStop::EndGate {
                    // Every worker of the run shares this gate: they all stop after the highest
                    // clock any of them started, as at a segment's end.
                    gate.end_soon();
                }
                report.diverged = diverged.clone();
            }
            if let Some(progress) = progress {
                progress.record(self.worker_id, first, stats, clock_end);
                if let Some(divergence) = diverged {
                    progress.diverged(self.worker_id, divergence);
                }
            }
            tracing::debug!(
                worker = self.worker_id,
                clock,
                updates = stats.updates,
                "clock done"
            );
        }
        Ok(report)
    }
}

/// A process cache is formed only if it saves at least this fraction of the rows the threads
/// would move on their own: for threads whose working sets hardly overlap it saves nothing and
/// costs a group copy of every row and copies in and out of it (two threads on disjoint halves of
/// a million rows: 1.9x the worker memory, 0.6x the updates per second, 1.2x the server memory
/// for its larger frames; BENCHMARKS.md).
pub const MIN_SHARED_FRACTION: f64 = 0.1;

/// Whether the working sets of `workers` overlap enough for a process cache: their union holds at
/// most `1 - MIN_SHARED_FRACTION` of the rows they hold together.
pub fn overlap_pays(workers: &[(u32, &WorkingSet)]) -> bool {
    let total: usize = workers.iter().map(|(_, set)| set.len()).sum();
    let mut union: Vec<(TableId, u64)> = workers
        .iter()
        .flat_map(|(_, set)| {
            set.tables()
                .flat_map(|(table, keys)| keys.iter().map(move |&key| (table, key)))
        })
        .collect();
    union.sort_unstable();
    union.dedup();
    (union.len() as f64) <= (1.0 - MIN_SHARED_FRACTION) * total as f64
}

/// The process cache for `workers` (global id, working set) if `config` shares one and their
/// working sets overlap enough ([`overlap_pays`]).
pub(crate) fn process_cache_for(
    config: &JobConfig,
    specs: &[TableSpec],
    workers: &[(u32, &WorkingSet)],
) -> Option<Arc<ProcessCache>> {
    (config.shares_cache(workers.len()) && overlap_pays(workers)).then(|| {
        Arc::new(ProcessCache::new(
            workers,
            specs,
            config.partitions,
            config.wait_timeout,
        ))
    })
}

/// Runs one worker thread's whole job (or one segment of it): register (alone, or through the
/// process cache `shared` with every partition served at `routes`), then the clocks `gate`
/// allows.
#[allow(clippy::too_many_arguments)]
pub(crate) fn run_worker<W: AppWorker, T: Transport>(
    worker_id: u32,
    app_worker: W,
    working_set: &WorkingSet,
    shared: Option<(&Arc<ProcessCache>, &[Route])>,
    specs: &[TableSpec],
    transport: &mut T,
    config: &JobConfig,
    gate: &ClockGate,
    metrics: &RuntimeMetrics,
    run_start: Instant,
    divergence_stop: DivergenceStop,
) -> Result<WorkerReport, WorkerError> {
    let result = WorkerLoop::new(worker_id, app_worker, working_set, specs, config.partitions)
        .and_then(|mut worker| {
            match shared {
                Some((cache, routes)) => {
                    worker.attach(Some(cache));
                    cache.begin_segment(transport, 1, gate.first(), routes)?;
                }
                None => worker.register(transport, None, false)?,
            }
            worker.run(
                transport,
                config,
                gate,
                true,
                metrics,
                run_start,
                None,
                divergence_stop,
            )
        });
    if let (Err(error), Some((cache, _))) = (&result, shared) {
        cache.fail(format!("worker {worker_id} failed: {error}"));
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pull_counts_the_rows_it_moved_whole_or_changed() {
        // two rows of width 3, then two of width 2
        let segments = || [(6, 3), (4, 2)].into_iter();
        assert_eq!(pulled_rows_and_values(None, segments()), (4, 10));
        assert_eq!(pulled_rows_and_values(Some(&[]), segments()), (0, 0));
        // the second row of the first table and the first of the second, in one stretch
        assert_eq!(pulled_rows_and_values(Some(&[(3, 5)]), segments()), (2, 5));
        assert_eq!(
            pulled_rows_and_values(Some(&[(0, 3), (8, 2)]), segments()),
            (2, 5)
        );
    }

    #[test]
    fn a_process_cache_is_formed_only_where_working_sets_overlap() {
        let set = |keys: std::ops::Range<u64>| {
            let mut set = WorkingSet::new();
            set.add_keys(0, keys);
            set
        };
        // Disjoint halves: nothing to share.
        let (a, b) = (set(0..100), set(100..200));
        assert!(!overlap_pays(&[(0, &a), (1, &b)]));
        // 4 shared rows of 104 each: under a tenth saved.
        let (a, b) = (set(0..104), set(100..204));
        assert!(!overlap_pays(&[(0, &a), (1, &b)]));
        // 50 of 250 rows shared: 200 moved instead of 250.
        let (a, b) = (set(0..125), set(75..200));
        assert!(overlap_pays(&[(0, &a), (1, &b)]));
        // The same keys in another table are other rows.
        let mut c = set(0..100);
        c.add_keys(1, 0..100);
        let d = set(0..100);
        assert!(overlap_pays(&[(0, &c), (1, &d)]));
    }
    use crate::app::{RowInit, WorkingSet};

    fn stats(updates: u64) -> ClockStats {
        ClockStats {
            updates,
            loss_sum: 0.0,
            loss_count: 0,
        }
    }

    #[test]
    fn segment_progress_answers_once_every_worker_finished_the_clock_before() {
        let progress = Arc::new(SegmentProgress::default());
        let never = || false;
        // Segment from clock 10; workers 0 and 1. A copy at 10 needs no clock of the segment.
        let at_start = progress.through(&[0, 1], 10, 10, Duration::ZERO, never);
        let at_start = at_start.expect("nothing to wait for");
        assert!(
            at_start
                .iter()
                .all(|(_, r)| r.stats.is_empty() && r.first_clock == 10)
        );
        progress.record(0, 10, stats(1), 0.1);
        progress.record(0, 10, stats(2), 0.2);
        progress.record(1, 10, stats(3), 0.15);
        // Worker 1 has not finished clock 11 yet.
        assert!(
            progress
                .through(&[0, 1], 10, 12, Duration::from_millis(5), never)
                .is_none()
        );
        assert!(
            progress
                .through(&[0, 1], 10, 12, Duration::from_secs(5), || true)
                .is_none(),
            "a clock that will not come is given up at once"
        );
        let waiter = {
            let progress = progress.clone();
            std::thread::spawn(move || {
                progress.through(&[0, 1], 10, 12, Duration::from_secs(30), || false)
            })
        };
        progress.record(1, 10, stats(4), 0.25);
        progress.record(1, 10, stats(5), 0.35);
        let reports = waiter.join().unwrap().expect("both finished clock 11");
        let updates: Vec<(u32, Vec<u64>)> = reports
            .iter()
            .map(|(w, r)| (*w, r.stats.iter().map(|s| s.updates).collect()))
            .collect();
        // Clock 12 of worker 1 is past the copy: left out.
        assert_eq!(updates, vec![(0, vec![1, 2]), (1, vec![3, 4])]);
        assert_eq!(reports[1].1.clock_end, vec![0.15, 0.25]);
        assert_eq!(reports[1].1.first_clock, 10);
    }

    #[test]
    fn views_cover_the_cache_and_deltas_round_trip() {
        let specs = vec![
            TableSpec {
                id: 0,
                name: "a".into(),
                width: 2,
                init: RowInit::Zeros,
            },
            TableSpec {
                id: 1,
                name: "b".into(),
                width: 1,
                init: RowInit::Zeros,
            },
        ];
        let mut ws = WorkingSet::new();
        ws.add_range(0, 20);
        ws.add_range(1, 7);
        let mut cache = RowCache::build(&specs, &ws, |k| partition_of(k, 3)).unwrap();
        let mut views = build_views(&cache, 3);
        assert_eq!(views.iter().map(|v| v.len).sum::<usize>(), 20 * 2 + 7);
        for view in &views {
            for (table, keys) in view_keys(&cache, view) {
                assert!(
                    keys.iter().all(|&k| partition_of(k, 3) == view.partition),
                    "table {table}"
                );
            }
        }
        let slot = cache.slot(0, 13).unwrap();
        cache.row_mut(0, slot)[1] = 2.5;
        let owner = partition_of(13, 3) as usize;
        for view in &mut views {
            collect_delta(&mut cache, view);
        }
        assert_eq!(views[owner].delta.iter().sum::<f32>(), 2.5);
        assert!(
            views
                .iter()
                .enumerate()
                .all(|(p, v)| p == owner || v.delta.iter().all(|d| *d == 0.0))
        );
        // A pulled copy replaces both the values and the delta baseline.
        // (`refresh` lends the pull the delta buffer; here the test fills its own.)
        let view = &mut views[owner];
        assert!(view.incoming.is_empty(), "one buffer a view between pulls");
        view.incoming = vec![1.0; view.len];
        install(&mut cache, view);
        assert_eq!(cache.row(0, slot), &[1.0, 1.0]);
        collect_delta(&mut cache, view);
        assert!(view.delta.iter().all(|d| *d == 0.0));
        // A read of the rows changed since: only its stretches are installed, one of them
        // across the view's two tables (the last row of table 0, the first of table 1).
        let table0 = view.ranges[0].2 - view.ranges[0].1;
        view.incoming.fill(7.0);
        view.fresh = Some(vec![(0, 1), (table0 * 2 - 2, 3)]);
        install(&mut cache, view);
        collect_delta(&mut cache, view);
        assert!(view.delta.iter().all(|d| *d == 0.0), "snapshots follow");
        let mut values = Vec::new();
        for &(position, start, end) in &view.ranges {
            let width = cache.tables[position].width;
            values.extend_from_slice(&cache.tables[position].data[start * width..end * width]);
        }
        let mut expected = vec![1.0; view.len];
        for (at, n) in [(0, 1), (table0 * 2 - 2, 3)] {
            expected[at..at + n].fill(7.0);
        }
        assert_eq!(values, expected);
    }
}
