//! The per-process read cache and write-back buffer shared by the worker threads of one process.
//!
//! Without it every worker thread registers, pulls and pushes its own batch, so a process with
//! `N` threads whose working sets overlap (LDA's word-topic counts, MLR's weights, MF's item
//! factors) moves the shared rows `N` times per clock each way. With it the threads of a process
//! form one *group* that talks to the servers under one identity, its *leader* (the lowest worker
//! id of the group):
//!
//! - **Registration.** Per partition the leader registers the union of the members' keys; every
//!   other member registers an empty batch. Readers with an empty batch never hold back a BSP push,
//!   so the leader's read is the group's read.
//! - **Reads.** Per partition the group keeps one copy of the union rows with its visible clock and
//!   the group clocks it includes. A thread needing the partition at clock `m` after contributing
//!   `f` clocks copies its rows from the group copy if that copy is visible at `m` and includes the
//!   group's clocks below `f` (so it holds the thread's own writes); otherwise it waits for a fetch
//!   in flight that will satisfy it, or fetches itself under the leader's id. Under BSP the first
//!   thread of a clock fetches and the others copy: one pull per partition per process per clock.
//!   A fetch into a valid copy asks only for the rows changed since its visible clock
//!   ([`crate::store::PartitionStore::pull_rows_since`]), and the copy stamps each chunk of
//!   values with the fetch that last changed it, so a thread copies out and installs only what
//!   changed since its own last copy. The servers count a row as changed only where a push's
//!   delta is not zero, but the members' deltas of a clock can cancel in the group's sum while
//!   each member holds its own write: the chunks members wrote are stamped by the first fetch
//!   that includes their clock, whatever the servers say.
//! - **Writes.** A thread adds its clock's deltas into the group's buffer of that clock; the last
//!   member to contribute pushes the sums under the leader's identity (leader, clock, partition)
//!   and an empty push for every other member, so every logical worker still advances its own
//!   clock count (`completed[w]`, part of partition images) once per clock, exactly once.
//!
//! A group's push of a clock goes out when all its members finished that clock, so at the servers
//! the group advances with its slowest thread. A thread that needs a fresher copy first waits for
//! the group's pushes of the clocks it finished (its own writes must be in the copy); otherwise it
//! runs ahead on its own copy as far as its staleness bound allows, so SSP between groups (and its
//! bounds for every thread) is unchanged. A thread only waits for a fetch in flight whose clock it
//! has completed itself, so no wait depends on the waiter's own future push. The attribution of a
//! member's updates to the leader's identity is exact wherever a group's clocks are applied or
//! dropped together (segment boundaries, migrations, rollbacks): docs/elasticity.md. The group is
//! rebuilt when its members change (the union changes) and after any failure; a job with a
//! stateful server optimizer does not use one (its rule must see each worker's delta alone), nor
//! do threads whose working sets overlap by less than a tenth (`worker::overlap_pays`: there it
//! saves nothing and costs a group copy of every row).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex, MutexGuard};

use crate::app::{TableId, TableSpec, WorkingSet};
use crate::metrics::RuntimeMetrics;
use crate::partition::{PartitionId, partition_of};
use crate::worker::{PartitionView, Transport, WorkerError};

/// Where a partition is served, as far as registrations care: a change means re-register.
pub(crate) type Route = (Option<SocketAddr>, u64);

/// The union batch of one partition, in registration order.
#[derive(Debug)]
struct Layout {
    /// Keys per table (tables with keys only, in declaration order).
    tables: Vec<(TableId, Vec<u64>)>,
    /// Row width per entry of `tables`.
    widths: Vec<usize>,
    /// Rows of the batch.
    rows: u64,
    /// Values of the batch.
    len: usize,
}

/// A contiguous stretch of values a thread's view shares with the union batch:
/// `(offset in the view, offset in the union, values)`.
pub(crate) type Run = (usize, usize, usize);

/// A member thread's buffers for [`ProcessCache::read`], allocated once.
#[derive(Debug, Default)]
pub(crate) struct ReadScratch {
    /// Union-sized receive buffers for the fetches the thread makes (on first use).
    views: Vec<PartitionView>,
    /// Per partition: whether the thread's view is settled in the current read.
    done: Vec<bool>,
    /// Group copies to copy out of once the lock is released: `(partition, copy, since)`
    /// (`since`: copy only the chunks changed after that fetch).
    copies: Vec<(usize, Arc<CopyData>, Option<u64>)>,
}

/// Values a group copy tracks changes of together (a stretch of a row, or of a few).
const CHUNK: usize = 128;

/// The values of a group copy, with which fetch last changed each [`CHUNK`] of them, so a
/// member copies out only what changed since its last copy.
#[derive(Debug, Clone)]
struct CopyData {
    values: Vec<f32>,
    /// Per chunk: the `seq` of the fetch that last changed it.
    stamps: Vec<u64>,
    /// Fetches installed into this copy (counting from the group's start, never reset).
    seq: u64,
}

impl CopyData {
    fn new(len: usize) -> Self {
        Self {
            values: vec![0.0; len],
            stamps: vec![0; len.div_ceil(CHUNK)],
            seq: 0,
        }
    }
}

/// The group's copy of one partition.
#[derive(Debug)]
struct PartCopy {
    /// Shared so that members copy their rows out of it without holding the group's lock; a
    /// fetch updates it (in place when no member is still copying out of it).
    copy: Arc<CopyData>,
    visible: u64,
    /// Group clocks pushed before the copy was fetched (so it holds every member's writes of them).
    includes: u64,
    valid: bool,
    /// Bumped at every registration; a thread's view installed under another one is stale.
    generation: u64,
    /// Fetches in flight: `(min_clock, includes)`.
    fetching: Vec<(u64, u64)>,
}

/// One clock's sums, per partition, each with the number of members that added theirs. Each
/// partition has a lock of its own, so members add into different partitions at once.
#[derive(Debug)]
struct ClockSums {
    parts: Vec<Mutex<(PartitionView, usize)>>,
}

impl ClockSums {
    fn new(layouts: &[Layout]) -> Self {
        Self {
            parts: bare_views(layouts, true)
                .into_iter()
                .map(|view| Mutex::new((view, 0)))
                .collect(),
        }
    }

    fn clear(&self) {
        for part in &self.parts {
            let mut part = part.lock();
            part.0.delta.fill(0.0);
            part.1 = 0;
        }
    }
}

#[derive(Debug)]
struct Shared {
    failed: Option<String>,
    /// Group clocks pushed: every member's deltas of clocks below are at the servers.
    pushed: u64,
    /// Clocks being accumulated: `(clock, sums, partitions pushed)`.
    pending: Vec<(u64, Arc<ClockSums>, usize)>,
    /// Zeroed sum buffers for later clocks.
    spare: Vec<Arc<ClockSums>>,
    parts: Vec<PartCopy>,
}

#[derive(Debug, Default)]
struct Segment {
    seq: u64,
    routes: Vec<Route>,
}

/// The shared read cache and write-back buffer of one process's worker threads.
#[derive(Debug)]
pub struct ProcessCache {
    leader: u32,
    members: Vec<u32>,
    layouts: Vec<Layout>,
    wait_timeout: Duration,
    shared: Mutex<Shared>,
    changed: Condvar,
    segment: Mutex<Segment>,
    /// Empty batches pushed for the members other than the leader.
    empties: Vec<PartitionView>,
    /// Per partition, per [`CHUNK`] of the union: one past the earliest clock a member wrote
    /// it in that no fetch has stamped yet (0: none). Members' writes can cancel in the group's
    /// sum, and the servers do not mark a row a zero sum reaches as changed, yet the members
    /// hold their own writes of it: the first fetch that includes the clock stamps it.
    written: Vec<Mutex<Vec<u64>>>,
}

fn bare_views(layouts: &[Layout], with_delta: bool) -> Vec<PartitionView> {
    layouts
        .iter()
        .enumerate()
        .map(|(p, layout)| {
            let mut view = PartitionView::bare(p as PartitionId, layout.len);
            if with_delta {
                view.delta = vec![0.0; layout.len];
            } else {
                view.incoming = vec![0.0; layout.len];
            }
            view
        })
        .collect()
}

impl ProcessCache {
    /// A group of the worker threads `members` (global id and working set) of one process.
    pub(crate) fn new(
        members: &[(u32, &WorkingSet)],
        specs: &[TableSpec],
        num_partitions: u32,
        wait_timeout: Duration,
    ) -> Self {
        let mut layouts: Vec<Layout> = (0..num_partitions)
            .map(|_| Layout {
                tables: Vec::new(),
                widths: Vec::new(),
                rows: 0,
                len: 0,
            })
            .collect();
        for spec in specs {
            let mut keys: Vec<u64> = members
                .iter()
                .flat_map(|(_, set)| set.keys(spec.id).iter().copied())
                .collect();
            keys.sort_unstable();
            keys.dedup();
            let mut by_partition: Vec<Vec<u64>> = vec![Vec::new(); num_partitions as usize];
            for key in keys {
                by_partition[partition_of(key, num_partitions) as usize].push(key);
            }
            for (layout, keys) in layouts.iter_mut().zip(by_partition) {
                if keys.is_empty() {
                    continue;
                }
                layout.rows += keys.len() as u64;
                layout.len += keys.len() * spec.width;
                layout.tables.push((spec.id, keys));
                layout.widths.push(spec.width);
            }
        }
        let mut ids: Vec<u32> = members.iter().map(|(id, _)| *id).collect();
        ids.sort_unstable();
        let parts = layouts
            .iter()
            .map(|layout| PartCopy {
                copy: Arc::new(CopyData::new(layout.len)),
                visible: 0,
                includes: 0,
                valid: false,
                generation: 0,
                fetching: Vec::new(),
            })
            .collect();
        let empties = (0..num_partitions)
            .map(|p| PartitionView::bare(p, 0))
            .collect();
        let written = layouts
            .iter()
            .map(|layout| Mutex::new(vec![0; layout.len.div_ceil(CHUNK)]))
            .collect();
        Self {
            written,
            leader: ids.first().copied().unwrap_or(0),
            members: ids,
            layouts,
            wait_timeout,
            shared: Mutex::new(Shared {
                failed: None,
                pushed: 0,
                pending: Vec::new(),
                spare: Vec::new(),
                parts,
            }),
            changed: Condvar::new(),
            segment: Mutex::new(Segment::default()),
            empties,
        }
    }

    /// The group's worker ids, ascending.
    pub(crate) fn members(&self) -> &[u32] {
        &self.members
    }

    /// Whether a member failed (the group is unusable; build a new one).
    pub(crate) fn failed(&self) -> bool {
        self.shared.lock().failed.is_some()
    }

    /// Marks the group failed and wakes every waiting member.
    pub(crate) fn fail(&self, reason: String) {
        let mut shared = self.shared.lock();
        shared.failed.get_or_insert(reason);
        self.changed.notify_all();
    }

    /// Maps a thread's view of `partition` (keys per table, in view order, with widths) onto the
    /// union batch.
    pub(crate) fn runs(
        &self,
        partition: PartitionId,
        tables: &[(TableId, &[u64], usize)],
    ) -> Vec<Run> {
        let layout = &self.layouts[partition as usize];
        let mut runs: Vec<Run> = Vec::new();
        let mut own = 0;
        for &(table, keys, width) in tables {
            let mut base = 0;
            let mut found = None;
            for ((id, union), w) in layout.tables.iter().zip(&layout.widths) {
                if *id == table {
                    found = Some(union);
                    break;
                }
                base += union.len() * w;
            }
            let Some(union) = found else {
                own += keys.len() * width;
                continue;
            };
            for &key in keys {
                let row = union
                    .binary_search(&key)
                    .expect("a member's key is in the union batch");
                let at = base + row * width;
                match runs.last_mut() {
                    Some((o, u, n)) if *o + *n == own && *u + *n == at => *n += width,
                    _ => runs.push((own, at, width)),
                }
                own += width;
            }
        }
        runs
    }

    fn wait(
        &self,
        shared: &mut MutexGuard<'_, Shared>,
        deadline: Instant,
        what: &'static str,
    ) -> Result<(), WorkerError> {
        if let Some(reason) = &shared.failed {
            return Err(WorkerError::PeerFailed {
                reason: reason.clone(),
            });
        }
        if self.changed.wait_until(shared, deadline).timed_out() {
            return Err(WorkerError::WaitPeers {
                what,
                waited: self.wait_timeout,
            });
        }
        match &shared.failed {
            Some(reason) => Err(WorkerError::PeerFailed {
                reason: reason.clone(),
            }),
            None => Ok(()),
        }
    }

    /// Starts segment `seq` at clock `first` (once per segment, whichever member comes first):
    /// registers the group's batches with every partition whose route changed and invalidates
    /// their copies. The other members wait until it is done.
    pub(crate) fn begin_segment<T: Transport>(
        &self,
        transport: &mut T,
        seq: u64,
        first: u64,
        routes: &[Route],
    ) -> Result<(), WorkerError> {
        let mut segment = self.segment.lock();
        if segment.seq == seq {
            return match &self.shared.lock().failed {
                Some(reason) => Err(WorkerError::PeerFailed {
                    reason: reason.clone(),
                }),
                None => Ok(()),
            };
        }
        segment.seq = seq;
        let changed: Vec<PartitionId> = routes
            .iter()
            .enumerate()
            .filter(|&(p, route)| segment.routes.get(p) != Some(route))
            .map(|(p, _)| p as PartitionId)
            .collect();
        let registered = (|| {
            for &partition in &changed {
                let layout = &self.layouts[partition as usize];
                let len = transport.register(self.leader, partition, &layout.tables, None)?;
                if len != layout.len {
                    return Err(WorkerError::RegisterLength {
                        partition,
                        server: len,
                        worker: layout.len,
                    });
                }
                for &member in self.members.iter().filter(|&&m| m != self.leader) {
                    let len = transport.register(member, partition, &[], None)?;
                    if len != 0 {
                        return Err(WorkerError::RegisterLength {
                            partition,
                            server: len,
                            worker: 0,
                        });
                    }
                }
            }
            Ok(())
        })();
        if let Err(error) = registered {
            segment.routes.clear();
            self.fail(error.to_string());
            return Err(error);
        }
        segment.routes = routes.to_vec();
        let mut shared = self.shared.lock();
        shared.pushed = first;
        let pending = std::mem::take(&mut shared.pending);
        shared.spare.extend(pending.into_iter().map(|(_, sums, _)| {
            sums.clear();
            sums
        }));
        for &partition in &changed {
            let part = &mut shared.parts[partition as usize];
            part.valid = false;
            part.generation += 1;
            part.fetching.clear();
        }
        Ok(())
    }

    /// Adds `worker`'s deltas of `clock` (its views, mapped by `runs`) to the group's buffer;
    /// the last member to add into a partition pushes that partition's sums for the whole group,
    /// so members arriving together push different partitions at once (each starts at a
    /// partition of its own). With `reading_next` the caller reads next and, if its push
    /// completed the clock, the wake-up of the members waiting for it is left to that read
    /// (returns whether it is owed), which usually wakes them once with a fresh copy instead of
    /// twice: on a busy machine every wake-up costs a scheduling delay.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn contribute<T: Transport>(
        &self,
        transport: &mut T,
        worker: u32,
        clock: u64,
        views: &[PartitionView],
        runs: &[Vec<Run>],
        reading_next: bool,
        metrics: &RuntimeMetrics,
    ) -> Result<bool, WorkerError> {
        let sums = {
            let mut shared = self.shared.lock();
            if let Some(reason) = &shared.failed {
                return Err(WorkerError::PeerFailed {
                    reason: reason.clone(),
                });
            }
            match shared.pending.iter().find(|(c, _, _)| *c == clock) {
                Some((_, sums, _)) => sums.clone(),
                None => {
                    let sums = shared
                        .spare
                        .pop()
                        .unwrap_or_else(|| Arc::new(ClockSums::new(&self.layouts)));
                    shared.pending.push((clock, sums.clone(), 0));
                    sums
                }
            }
        };
        let partitions = self.layouts.len();
        let first = self.members.iter().position(|&m| m == worker).unwrap_or(0) * partitions
            / self.members.len().max(1);
        let (mut pushed, mut rows, mut values) = (0usize, 0u64, 0usize);
        for p in (first..partitions).chain(0..first) {
            let mut part = sums.parts[p].lock();
            let (sum, contributed) = &mut *part;
            let mut written = self.written[p].lock();
            for &(own, union, n) in &runs[p] {
                // Chunk by chunk, so the test for a write reads what the sum just did.
                let mut at = union;
                while at < union + n {
                    let chunk = at / CHUNK;
                    let end = ((chunk + 1) * CHUNK).min(union + n);
                    let deltas = &views[p].delta[own + (at - union)..own + (end - union)];
                    let mut nonzero = false;
                    for (s, d) in sum.delta[at..end].iter_mut().zip(deltas) {
                        *s += d;
                        nonzero |= *d != 0.0;
                    }
                    if nonzero {
                        let first = &mut written[chunk];
                        if *first == 0 || *first > clock + 1 {
                            *first = clock + 1;
                        }
                    }
                    at = end;
                }
            }
            drop(written);
            *contributed += 1;
            if *contributed < self.members.len() {
                continue;
            }
            let result = (|| {
                transport.push(self.leader, clock, std::slice::from_ref(sum))?;
                let empty = std::slice::from_ref(&self.empties[p]);
                for &member in self.members.iter().filter(|&&m| m != self.leader) {
                    transport.push(member, clock, empty)?;
                }
                Ok(())
            })();
            if let Err(error) = result {
                drop(part);
                self.fail(format!("pushing clock {clock} failed: {error}"));
                return Err(error);
            }
            sum.delta.fill(0.0);
            *contributed = 0;
            pushed += 1;
            rows += self.layouts[p].rows;
            values += self.layouts[p].len;
        }
        if pushed == 0 {
            return Ok(false);
        }
        metrics.rows_moved.with_label_values(&["push"]).inc_by(rows);
        metrics
            .bytes_moved
            .with_label_values(&["push"])
            .inc_by(values as u64 * 4);
        let mut shared = self.shared.lock();
        let Some(index) = shared.pending.iter().position(|(c, _, _)| *c == clock) else {
            // The segment ended under us (begin_segment cleared it): nothing to complete.
            return Ok(false);
        };
        shared.pending[index].2 += pushed;
        if shared.pending[index].2 < partitions {
            return Ok(false);
        }
        let (_, sums, _) = shared.pending.swap_remove(index);
        shared.pushed = shared.pushed.max(clock + 1);
        shared.spare.push(sums);
        if !reading_next {
            self.changed.notify_all();
        }
        Ok(reading_next)
    }

    /// Fills `incoming` of every view that needs it (stale, older than `min_clock`, installed
    /// under an older registration, or all with `force`) from the group's copies, fetching a copy
    /// under the leader's id where none will do; sets `needs_pull` on exactly those views.
    /// `done` is the number of clocks this thread has contributed; `owed` says it owes the group
    /// the wake-up of its last push ([`ProcessCache::contribute`]).
    ///
    /// A member fetches one partition at a time and copies its rows out of the group's copies
    /// with the lock released, so members needing the same clock fetch different partitions and
    /// copy at once.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn read<T: Transport>(
        &self,
        transport: &mut T,
        min_clock: u64,
        done: u64,
        force: bool,
        mut owed: bool,
        views: &mut [PartitionView],
        runs: &[Vec<Run>],
        scratch: &mut ReadScratch,
        metrics: &RuntimeMetrics,
    ) -> Result<(), WorkerError> {
        let deadline = Instant::now() + self.wait_timeout;
        let mut shared = self.shared.lock();
        for view in views.iter_mut() {
            let part = &shared.parts[view.partition as usize];
            view.needs_pull = view.len > 0
                && (force
                    || view.stale
                    || view.visible < min_clock
                    || view.generation != part.generation);
        }
        // Copied views are done; `needs_pull` stays set on them for the caller's install.
        let ReadScratch {
            views: fetches,
            done: done_views,
            copies,
        } = scratch;
        done_views.clear();
        done_views.extend(views.iter().map(|v| !v.needs_pull));
        loop {
            if let Some(reason) = &shared.failed {
                return Err(WorkerError::PeerFailed {
                    reason: reason.clone(),
                });
            }
            if shared.pushed < done {
                if std::mem::take(&mut owed) {
                    self.changed.notify_all();
                }
                self.wait(&mut shared, deadline, "their clock's pushes")?;
                continue;
            }
            let (mut fetch, mut waiting) = (None, false);
            let includes = shared.pushed;
            for (view, finished) in views.iter_mut().zip(done_views.iter_mut()) {
                if *finished {
                    continue;
                }
                let p = view.partition as usize;
                let part = &mut shared.parts[p];
                if part.valid && part.visible >= min_clock && part.includes >= done {
                    // A copy held (not restored or re-registered since) takes only what changed.
                    let since = (!force && !view.stale && view.copied > 0).then_some(view.copied);
                    copies.push((p, part.copy.clone(), since));
                    view.visible = part.visible;
                    view.generation = part.generation;
                    view.copied = part.copy.seq;
                    *finished = true;
                } else if part
                    .fetching
                    .iter()
                    .any(|&(m, i)| m >= min_clock && i >= done && m <= done)
                {
                    waiting = true;
                } else if fetch.is_none() {
                    part.fetching.push((min_clock, includes));
                    // A valid copy is brought up to date with the rows changed since it.
                    fetch = Some((p, part.valid.then_some(part.visible), part.copy.seq));
                }
            }
            if fetch.is_none() && std::mem::take(&mut owed) {
                self.changed.notify_all();
            }
            if copies.is_empty() && fetch.is_none() {
                if !waiting {
                    return Ok(());
                }
                self.wait(&mut shared, deadline, "a fetch of their process cache")?;
                continue;
            }
            drop(shared);
            for (p, copy, since) in copies.drain(..) {
                copy_runs(&copy, &mut views[p], &runs[p], since);
            }
            let Some((p, since, base)) = fetch else {
                shared = self.shared.lock();
                continue;
            };
            if fetches.is_empty() {
                *fetches = bare_views(&self.layouts, false);
            }
            fetches[p].needs_pull = true;
            fetches[p].since = since;
            let pulled = transport.pull(self.leader, min_clock, fetches);
            let fetched = &mut fetches[p];
            fetched.needs_pull = false;
            let layout = &self.layouts[p];
            let segments = (layout.tables.iter().zip(&layout.widths))
                .map(|((_, keys), &width)| (keys.len() * width, width));
            let (moved_rows, moved_values) =
                crate::worker::pulled_rows_and_values(fetched.fresh.as_deref(), segments);
            shared = self.shared.lock();
            let part = &mut shared.parts[p];
            if let Some(at) = part
                .fetching
                .iter()
                .position(|&f| f == (min_clock, includes))
            {
                part.fetching.swap_remove(at);
            }
            if pulled.is_ok() {
                let newer = fetched.visible >= part.visible && includes >= part.includes;
                match fetched.fresh.as_deref() {
                    Some(stretches) if part.valid && newer && part.copy.seq == base => {
                        // Only the rows changed since the copy came: update it in place (a
                        // member still copying out of it keeps the old one).
                        let copy = Arc::make_mut(&mut part.copy);
                        copy.seq += 1;
                        for &(at, n) in stretches {
                            copy.values[at..at + n].copy_from_slice(&fetched.incoming[at..at + n]);
                            copy.stamps[at / CHUNK..(at + n).div_ceil(CHUNK)].fill(copy.seq);
                        }
                        stamp_written(&mut self.written[p].lock(), copy, includes);
                        part.visible = fetched.visible;
                        part.includes = includes;
                    }
                    // Changes since a copy another fetch has replaced meanwhile: of no use;
                    // the loop looks again.
                    Some(_) => {}
                    None if !part.valid || newer => {
                        let seq = part.copy.seq + 1;
                        if Arc::get_mut(&mut part.copy).is_none() {
                            // A member is still copying out of the old copy: leave it that one.
                            part.copy = Arc::new(CopyData::new(fetched.incoming.len()));
                        }
                        let copy = Arc::get_mut(&mut part.copy).expect("a copy of our own");
                        std::mem::swap(&mut copy.values, &mut fetched.incoming);
                        copy.stamps.fill(seq);
                        copy.seq = seq;
                        stamp_written(&mut self.written[p].lock(), copy, includes);
                        part.visible = fetched.visible;
                        part.includes = includes;
                        part.valid = true;
                    }
                    None => {
                        if let Some(view) = views.get_mut(p) {
                            // The group holds a copy fresher in some respect: keep it, use ours
                            // here (a copy outside the group's history: the next is whole).
                            copy_all(&fetched.incoming, view, &runs[p]);
                            view.visible = fetched.visible;
                            view.generation = part.generation;
                            view.copied = 0;
                            done_views[p] = true;
                        }
                    }
                }
            }
            self.changed.notify_all();
            owed = false;
            if let Err(error) = pulled {
                drop(shared);
                self.fail(format!("fetching the process cache failed: {error}"));
                return Err(error);
            }
            metrics
                .rows_moved
                .with_label_values(&["pull"])
                .inc_by(moved_rows);
            metrics
                .bytes_moved
                .with_label_values(&["pull"])
                .inc_by(moved_values * 4);
        }
    }
}

/// Stamps with `copy`'s latest fetch the chunks members wrote in clocks below `includes` (the
/// fetch holds those clocks' pushes), and forgets those writes.
fn stamp_written(written: &mut [u64], copy: &mut CopyData, includes: u64) {
    for (first, stamp) in written.iter_mut().zip(&mut copy.stamps) {
        if *first != 0 && *first <= includes {
            *stamp = copy.seq;
            *first = 0;
        }
    }
}

/// Copies a view's rows out of the union values.
fn copy_all(union: &[f32], view: &mut PartitionView, runs: &[Run]) {
    for &(own, at, n) in runs {
        view.incoming[own..own + n].copy_from_slice(&union[at..at + n]);
    }
    view.fresh = None;
}

/// Copies a view's rows out of a group copy: all of them, or with `since` only the chunks a
/// later fetch changed (listed in the view's `fresh`, for its install).
fn copy_runs(copy: &CopyData, view: &mut PartitionView, runs: &[Run], since: Option<u64>) {
    let Some(since) = since else {
        return copy_all(&copy.values, view, runs);
    };
    let mut fresh = view.fresh.take().unwrap_or_default();
    fresh.clear();
    for &(own, at, n) in runs {
        let end = at + n;
        for chunk in at / CHUNK..end.div_ceil(CHUNK) {
            if copy.stamps[chunk] <= since {
                continue;
            }
            let (lo, hi) = ((chunk * CHUNK).max(at), ((chunk + 1) * CHUNK).min(end));
            let to = own + (lo - at);
            view.incoming[to..to + (hi - lo)].copy_from_slice(&copy.values[lo..hi]);
            crate::worker::add_stretch(&mut fresh, to, hi - lo);
        }
    }
    view.fresh = Some(fresh);
}
