//! Elastic runs across node processes: the coordinator's controller drives every node over the
//! data plane with `Control` frames ([`ControlRequest`] / [`ControlResponse`] as JSON, partition
//! images as a binary payload).
//!
//! - [`Agent`] is a node process's side: it hosts partitions in its data-plane server, installs
//!   and hands over partition images, runs the logical workers assigned to it for each segment,
//!   and agrees on where a segment ends (pause, then end at the highest clock any process
//!   started).
//! - [`ProcessFleet`] is the coordinator's side: the [`Fleet`] the controller's loop
//!   ([`crate::elastic::run_elastic_on`]) acts on. A node whose connection breaks (its process was
//!   killed, its instance taken) is *lost*: the survivors abandon their state at once and the run
//!   rolls back to the BackupPS copy, which the coordinator holds on the reliable tier. So is a
//!   node declared failed for lack of heartbeats ([`crate::heartbeat`]): a node that hangs with
//!   its sockets open never answers, so every exchange with it runs on a helper thread the
//!   fleet stops waiting for once the node is declared failed, and no further request goes to it.
//!
//! A partition that moves between two live nodes goes straight from the old owner to the new
//! one: the coordinator sends the new owner a [`ControlRequest::Fetch`], the new owner asks the
//! old one's data plane (authenticated with the job secret) for a [`ControlRequest::HandOver`]
//! and installs the image. The old owner stops serving the partition at the hand-over but keeps
//! the image until the boundary is over (the next segment starts, or the run rolls back), so a
//! fetch that fails loses nothing: the coordinator then takes the image from the old owner
//! ([`ControlRequest::Take`] also answers from what was handed over) and installs it itself
//! (old owner → coordinator → new owner). Restores from the coordinator's BackupPS copy (the
//! first layout, a rollback) come from the coordinator. `ebbflow_runtime_partition_bytes_total`
//! counts image bytes by path (`direct`, `relayed`, `restore`).

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use prometheus::{IntCounterVec, Opts, Registry};
use serde::{Deserialize, Serialize};

use crate::app::{App, TableSpec};
use crate::client::{ClientConfig, ClientError, Connection, NodeAddrs, PreOpened, Severance};
use crate::elastic::{
    Fleet, FleetError, Interrupt, Layout, Salvage, SegmentOutcome, SegmentSpec, ShardLoads,
};
use crate::frame::FrameError;
use crate::heartbeat::Heartbeats;
use crate::local::RunError;
use crate::message::{Cursor, Message, Values, put_keys, put_u32};
use crate::metrics::RuntimeMetrics;
use crate::node::{SegmentPlan, WorkerPool};
use crate::partition::{NodeId, PartitionEntry, PartitionId, PartitionMap};
use crate::store::{PartitionImage, ServerState, StoreError, TableImage};
use crate::worker::{ClockGate, DivergenceStop, JobConfig, SegmentProgress, WorkerReport};

/// What the coordinator asks of a node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ControlRequest {
    /// Stop hosting these partitions; their images come back in the payload (a partition
    /// already handed over at this boundary comes from what the node kept of it).
    Take {
        /// The partitions.
        partitions: Vec<PartitionId>,
    },
    /// Fetch `partition`'s image from the node whose data plane is at `from` (a
    /// [`ControlRequest::HandOver`]) and host it at `epoch`; answered
    /// [`ControlResponse::Fetched`].
    Fetch {
        /// The partition.
        partition: PartitionId,
        /// Its epoch here.
        epoch: u64,
        /// Data-plane address of its current owner.
        from: SocketAddr,
    },
    /// Stop hosting `partition` and send its image (in the payload) to the node that asks; the
    /// image is kept until the next segment or an abandon, for a [`ControlRequest::Take`] if
    /// the asker fails to install it.
    HandOver {
        /// The partition.
        partition: PartitionId,
    },
    /// Images of every hosted partition (the BackupPS copy), without releasing them.
    Copy,
    /// Host the partitions whose images are in the payload, each at its epoch (in order).
    Install {
        /// One epoch per image.
        epochs: Vec<u64>,
    },
    /// Drop every hosted partition and stop the running segment: the job rolls back.
    Abandon,
    /// Visible clock of every hosted partition.
    Clocks,
    /// Run a segment with these workers.
    Segment(SegmentOrder),
    /// Hold back clocks past the highest started; answer one past it.
    Pause,
    /// End the running segment at `end` and release paused workers.
    EndAt {
        /// One past the last clock.
        end: u64,
    },
    /// The node's part of the BackupPS copy at `clock`, taken in the background while the
    /// segment runs: the images of its hosted partitions at exactly `clock` (in the payload)
    /// and its workers' reports of the segment's clocks below `clock`, answered
    /// [`ControlResponse::Copied`] once all are there, or [`ControlResponse::Running`] if
    /// `wait_ms` passed first (ask again: what was ready is kept).
    CopyAt {
        /// The copy's clock (one of the segment's [`SegmentOrder::backup_clocks`]).
        clock: u64,
        /// Milliseconds to wait.
        wait_ms: u64,
        /// The clock of the copy the coordinator holds (or will hold before it applies this
        /// one): a partition whose changes since then the node tracked is sent as a coalesced
        /// delta, only its rows changed by pushes of this clock or later (whole otherwise).
        #[serde(default)]
        base: Option<u64>,
    },
    /// Wait up to `wait_ms` for the running segment to finish.
    Await {
        /// Milliseconds to wait.
        wait_ms: u64,
    },
    /// The node leaves the job: its process exits.
    Shutdown,
    /// The node joined but is not switched in yet: load the data shards of `workers` (the
    /// workers it will run) in the background.
    Preload {
        /// Logical workers.
        workers: Vec<u32>,
    },
    /// How many data shards are still loading and connections still opening.
    Preloaded,
    /// A joined node will serve partitions (or this node is the joined one): open the
    /// connections of `workers` (the logical workers this node will run) to the data planes at
    /// `addrs` in the background, warmed for frames of `frame_bytes`, so the workers take them
    /// at the switch instead of connecting then. Answered at once; [`ControlRequest::Preloaded`]
    /// counts them until they are open.
    PreOpen {
        /// Data-plane addresses.
        addrs: Vec<SocketAddr>,
        /// Logical workers.
        workers: Vec<u32>,
        /// Frame size to warm both ends' buffers for.
        frame_bytes: u64,
    },
}

/// One segment for one node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SegmentOrder {
    /// First clock.
    pub first: u64,
    /// One past the last clock, unless ended earlier.
    pub end: u64,
    /// The logical workers this node runs (others it held stop).
    pub workers: Vec<u32>,
    /// (owner, epoch) of every partition.
    pub owners: Vec<(NodeId, u64)>,
    /// Data-plane address of every owner.
    pub addrs: Vec<(NodeId, SocketAddr)>,
    /// The run's start (Unix seconds), so per-clock times line up across processes.
    pub run_start_unix: f64,
    /// Logical workers this node is the second holder of: it loads their data shards in the
    /// background, so it can take one over at once if its node leaves.
    #[serde(default)]
    pub standby: Vec<u32>,
    /// No partition was restored from a copy at this boundary: workers' cached rows stay valid
    /// (see [`SegmentPlan::carried`]).
    #[serde(default)]
    pub carried: bool,
    /// Clocks at which the node's partitions are copied to the BackupPSs in the background
    /// ([`ControlRequest::CopyAt`]); armed before the node's workers start.
    #[serde(default)]
    pub backup_clocks: Vec<u64>,
}

/// A node's answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ControlResponse {
    /// Done.
    Done,
    /// A [`ControlRequest::Fetch`] installed the partition.
    Fetched {
        /// Bytes of the image that came from the old owner.
        bytes: u64,
    },
    /// `count` partition images are in the payload.
    Images {
        /// Images in the payload.
        count: u32,
    },
    /// Visible clocks.
    Clocks {
        /// (partition, visible clock).
        clocks: Vec<(PartitionId, u64)>,
    },
    /// The least end this node can agree to.
    Paused {
        /// One past the highest clock started here.
        least_end: u64,
    },
    /// The segment is still running (or a [`ControlRequest::CopyAt`] is not ready yet).
    Running,
    /// The node's part of the BackupPS copy at `clock`: `count` images in the payload, and
    /// every worker's report of the segment's clocks below `clock`.
    Copied {
        /// The copy's clock.
        clock: u64,
        /// Partition images in the payload.
        count: u32,
        /// (logical worker, report of the clocks from the segment's first to `clock`).
        reports: Vec<(u32, WorkerReport)>,
        /// Per image in the payload, in order: the clock it is a delta since (`None`, or no
        /// entries at all: whole images).
        #[serde(default)]
        bases: Vec<Option<u64>>,
    },
    /// Data shards still loading.
    Preloading {
        /// Shards not loaded yet.
        loading: u32,
        /// [`ControlRequest::PreOpen`]s still opening connections.
        #[serde(default)]
        opening: u32,
    },
    /// The segment finished.
    Finished {
        /// Where it ended.
        end: u64,
        /// (logical worker, report).
        reports: Vec<(u32, WorkerReport)>,
        /// Workers this segment started here: how many loaded their shard then, and how many
        /// took it preloaded.
        #[serde(default)]
        shards: ShardLoads,
    },
    /// The request failed.
    Failed {
        /// Static category.
        category: String,
        /// What went wrong.
        message: String,
    },
}

impl ControlResponse {
    fn failed(category: &str, message: impl std::fmt::Display) -> Self {
        ControlResponse::Failed {
            category: category.to_owned(),
            message: message.to_string(),
        }
    }
}

/// Appends `images` to `out` in the payload format: a count, then per image its partition,
/// tables (id, keys, values, optimizer state) and per-worker clocks.
pub fn encode_images(images: &[PartitionImage], out: &mut Vec<u8>) {
    put_u32(out, images.len() as u32);
    for image in images {
        put_u32(out, image.partition);
        put_u32(out, image.tables.len() as u32);
        for table in &image.tables {
            put_u32(out, table.table);
            put_keys(out, &table.keys);
            Values::F32(&table.data).put(out);
            Values::F32(&table.state).put(out);
        }
        put_keys(out, &image.completed);
    }
}

/// Decodes a payload written by [`encode_images`]; any inconsistency is an error, never a panic.
pub fn decode_images(bytes: &[u8]) -> Result<Vec<PartitionImage>, FrameError> {
    let mut c = Cursor { rest: bytes };
    let count = c.count(8, "image count")?;
    let mut images = Vec::with_capacity(count);
    for _ in 0..count {
        let partition = c.u32("image partition")?;
        let tables = c.count(16, "image table count")?;
        let mut image = PartitionImage {
            partition,
            tables: Vec::with_capacity(tables),
            completed: Vec::new(),
        };
        for _ in 0..tables {
            image.tables.push(TableImage {
                table: c.u32("image table id")?,
                keys: c.keys("image keys")?,
                data: c.values("image values")?.to_vec(),
                state: c.values("image optimizer state")?.to_vec(),
            });
        }
        image.completed = c.keys("image clocks")?;
        images.push(image);
    }
    c.finish()?;
    Ok(images)
}

/// Pairs decoded copy images with the bases a [`ControlResponse::Copied`] gave them (none at
/// all: whole images); a count that does not match is an error.
fn with_bases(
    images: Vec<PartitionImage>,
    bases: Vec<Option<u64>>,
) -> Result<Vec<(PartitionImage, Option<u64>)>, FrameError> {
    if bases.is_empty() {
        return Ok(images.into_iter().map(|image| (image, None)).collect());
    }
    if bases.len() != images.len() {
        return Err(FrameError::Invalid(
            "a copy's delta bases do not match its images",
        ));
    }
    Ok(images.into_iter().zip(bases).collect())
}

/// A node's handler of control requests (served by its data-plane server).
pub trait NodeAgent: Send + Sync {
    /// Answers one request; the payload of the answer goes in the returned bytes.
    fn control(&self, request: ControlRequest, payload: &[u8]) -> (ControlResponse, Vec<u8>);
}

/// How long an abandon waits for the running segment's workers to stop before leaving them
/// behind.
const ABANDON_GRACE: Duration = Duration::from_secs(2);

/// The segment a node is running.
struct Running {
    gate: Arc<ClockGate>,
    result: std::sync::mpsc::Receiver<Result<Vec<(u32, WorkerReport)>, RunError>>,
    /// The workers it started, by shard source.
    shards: ShardLoads,
    /// Pre-opened connections taken before it started (the node's counter).
    taken_before: u64,
    /// Cuts its workers' connections (an abandon whose workers do not stop).
    severance: Arc<Severance>,
}

/// What a node's background BackupPS copies read of the running (or last) segment.
#[derive(Clone)]
struct CopySource {
    gate: Arc<ClockGate>,
    progress: Arc<SegmentProgress>,
    workers: Vec<u32>,
}

/// Data shards a node loads in the background for the workers it is the second holder of.
type Preloaded<W> = Arc<Mutex<BTreeMap<u32, W>>>;

/// A node process's [`NodeAgent`]: its partitions, its workers, its part of each segment.
pub struct Agent<A: App> {
    app: Arc<A>,
    /// Shards preloaded for the workers this node is the second holder of.
    preloaded: Preloaded<A::Worker>,
    /// Workers whose shard a background thread is loading now.
    preloading: Arc<Mutex<BTreeSet<u32>>>,
    specs: Vec<TableSpec>,
    state: Arc<ServerState>,
    job: JobConfig,
    client: ClientConfig,
    metrics: RuntimeMetrics,
    /// The worker pool; replaced by a fresh one when an abandoned segment does not stop in
    /// time (its stuck thread keeps the old one).
    pool: Mutex<Arc<Mutex<Option<WorkerPool>>>>,
    running: Mutex<Option<Running>>,
    /// Where the last finished segment ended (a pause after it finished answers this).
    last_end: Mutex<u64>,
    shutdown: Mutex<Option<std::sync::mpsc::Sender<()>>>,
    /// Images handed over at this boundary, kept until the next segment starts or the run
    /// rolls back (the coordinator takes one back if its fetch failed).
    handed_over: Mutex<BTreeMap<PartitionId, PartitionImage>>,
    /// The segment the background copies are taken of.
    copy_source: Mutex<Option<CopySource>>,
    /// Images (each whole or a delta since a clock) of a background copy collected so far, by
    /// clock (a [`ControlRequest::CopyAt`] that runs out of time keeps what it took).
    copies: Mutex<BTreeMap<u64, Vec<(PartitionImage, Option<u64>)>>>,
    /// How many segments this node started; held while a segment arms its copies and while a
    /// finished one disarms those past its end, so a segment left behind by an abandon cannot
    /// disarm the copies of the segment that replaced it.
    armed_segment: Arc<Mutex<u64>>,
    /// Set by the first control request: the coordinator's fleet admitted this node (it may
    /// host partitions or run workers from then on).
    controlled: std::sync::atomic::AtomicBool,
    /// Connections opened ahead of the switch that uses them ([`ControlRequest::PreOpen`]).
    pre_opened: Arc<PreOpened>,
    /// Threads still opening connections for [`ControlRequest::PreOpen`].
    opening: Arc<std::sync::atomic::AtomicU32>,
    /// The data planes the last segment's workers could reach: pre-opened connections to them
    /// that no worker took by the next segment are closed.
    last_addrs: Mutex<Vec<SocketAddr>>,
}

impl<A: App> Agent<A> {
    /// Lets the node go at once if the coordinator's fleet never admitted it (no control
    /// request yet): it hosts nothing and runs no worker, so nothing has to move before it
    /// leaves, and no release will come for it (the fleet releases only nodes it admitted).
    /// True if it did. A pod evicted right after it joined then exits within its grace period
    /// instead of being killed at its end.
    pub fn leave_if_never_admitted(&self) -> bool {
        if self.controlled.load(std::sync::atomic::Ordering::SeqCst) {
            return false;
        }
        match self.shutdown.lock().take() {
            Some(shutdown) => shutdown.send(()).is_ok(),
            None => false,
        }
    }

    /// An agent over `state` (the node's data-plane state); `shutdown` fires when the
    /// coordinator lets the node go.
    pub fn new(
        app: A,
        state: Arc<ServerState>,
        job: JobConfig,
        client: ClientConfig,
        metrics: RuntimeMetrics,
        shutdown: std::sync::mpsc::Sender<()>,
    ) -> Self {
        let specs = app.tables();
        let pre_opened = Arc::new(PreOpened::counted(&metrics));
        Self {
            app: Arc::new(app),
            preloaded: Arc::new(Mutex::new(BTreeMap::new())),
            preloading: Arc::new(Mutex::new(BTreeSet::new())),
            specs,
            state,
            job,
            client,
            metrics,
            pool: Mutex::new(Arc::new(Mutex::new(None))),
            running: Mutex::new(None),
            last_end: Mutex::new(0),
            shutdown: Mutex::new(Some(shutdown)),
            handed_over: Mutex::new(BTreeMap::new()),
            copy_source: Mutex::new(None),
            copies: Mutex::new(BTreeMap::new()),
            armed_segment: Arc::new(Mutex::new(0)),
            controlled: std::sync::atomic::AtomicBool::new(false),
            pre_opened,
            opening: Arc::new(std::sync::atomic::AtomicU32::new(0)),
            last_addrs: Mutex::new(Vec::new()),
        }
    }

    /// Installs `image` at `epoch`.
    fn install(&self, image: PartitionImage, epoch: u64) -> Result<(), ControlResponse> {
        if image.partition >= self.job.partitions {
            return Err(ControlResponse::failed(
                "install",
                format!("partition {} is outside the job", image.partition),
            ));
        }
        self.state
            .install(
                image,
                epoch,
                &self.specs,
                self.job.optimizer,
                self.job.staleness == 0,
            )
            .map_err(|error| ControlResponse::failed(error.category(), error))
    }

    /// Fetches `partition` from the node at `from` and hosts it at `epoch`.
    fn fetch(&self, partition: PartitionId, epoch: u64, from: SocketAddr) -> ControlResponse {
        let fetched = connect(&self.client, from).and_then(|mut connection| {
            call(
                &mut connection,
                &ControlRequest::HandOver { partition },
                &[],
            )
        });
        let payload = match fetched {
            Err(error) => return ControlResponse::failed("fetch", error),
            Ok((ControlResponse::Images { count: 1 }, payload)) => payload,
            Ok((other, _)) => {
                return ControlResponse::failed(
                    "fetch",
                    format!("the owner at {from} answered {other:?}"),
                );
            }
        };
        let image = match decode_images(&payload) {
            Ok(mut images) if images.len() == 1 && images[0].partition == partition => {
                images.remove(0)
            }
            Ok(_) => {
                return ControlResponse::failed(
                    "fetch",
                    format!("the owner at {from} sent other images than partition {partition}"),
                );
            }
            Err(error) => return ControlResponse::failed("decode_images", error),
        };
        match self.install(image, epoch) {
            Ok(()) => ControlResponse::Fetched {
                bytes: payload.len() as u64,
            },
            Err(answer) => answer,
        }
    }

    fn start_segment(&self, order: SegmentOrder) -> Result<(), String> {
        // Every partition of the boundary is placed: what was handed over is installed.
        self.handed_over.lock().clear();
        {
            let mut running = self.running.lock();
            if let Some(current) = running.as_ref() {
                // A segment nobody awaited (the coordinator gave up on it) may be over.
                match current.result.try_recv() {
                    Err(std::sync::mpsc::TryRecvError::Empty) => {
                        return Err("a segment is already running".into());
                    }
                    _ => *running = None,
                }
            }
        }
        let entries = order
            .owners
            .iter()
            .map(|&(owner, epoch)| PartitionEntry { owner, epoch })
            .collect();
        let map = PartitionMap::from_entries(entries).map_err(|e| e.to_string())?;
        if map.num_partitions() != self.job.partitions {
            return Err(format!(
                "the segment has {} partitions, the job {}",
                map.num_partitions(),
                self.job.partitions
            ));
        }
        let addrs: NodeAddrs = order.addrs.iter().copied().collect();
        // Connections pre-opened for the last segment's servers were taken then or are not
        // wanted; those for servers joining later wait for their switch.
        let serving: BTreeSet<NodeId> = order.owners.iter().map(|(owner, _)| *owner).collect();
        let now_reachable: Vec<SocketAddr> = addrs
            .iter()
            .filter(|(node, _)| serving.contains(node))
            .map(|(_, addr)| *addr)
            .collect();
        // So are those to nodes that are no longer members: a joined node that left before
        // its switch.
        let last: BTreeSet<SocketAddr> =
            std::mem::replace(&mut *self.last_addrs.lock(), now_reachable)
                .into_iter()
                .collect();
        let members: BTreeSet<SocketAddr> = addrs.values().copied().collect();
        self.pre_opened
            .forget_unless(|addr| members.contains(&addr) && !last.contains(&addr));
        let taken_before = self.pre_opened.taken();
        let gate = Arc::new(ClockGate::range(order.first, order.end));
        let shards;
        let severance;
        {
            let pool = self.pool.lock().clone();
            let mut pool = pool.lock();
            let pool = pool.get_or_insert_with(|| {
                let now_unix = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0.0, |d| d.as_secs_f64());
                let since = Duration::from_secs_f64((now_unix - order.run_start_unix).max(0.0));
                let run_start = Instant::now()
                    .checked_sub(since)
                    .unwrap_or_else(Instant::now);
                WorkerPool::empty(
                    &self.specs,
                    &self.client,
                    &self.job,
                    &self.metrics,
                    run_start,
                )
                .with_pre_opened(self.pre_opened.clone())
            });
            let preloaded = &self.preloaded;
            let (started, from_preloaded) = pool
                .ensure_with(&*self.app, &order.workers, |worker| {
                    preloaded.lock().remove(&worker)
                })
                .map_err(|e| e.to_string())?;
            severance = pool.severance();
            shards = ShardLoads {
                built: started - from_preloaded,
                preloaded: from_preloaded,
                connections_pre_opened: 0,
            };
        }
        self.preload(&order.standby, &order.workers);
        // Copies of this segment are armed before any worker here starts. Another node's
        // workers may have started already; a copy armed too late is left out (its clock's
        // copy is then incomplete, and the coordinator keeps the one before).
        let segment = {
            let mut armed = self.armed_segment.lock();
            *armed += 1;
            self.copies.lock().clear();
            self.state.disarm_backups(0);
            for &clock in &order.backup_clocks {
                if let Err(error) = self.state.arm_backups(clock) {
                    tracing::warn!(clock, %error, "a BackupPS copy could not be armed");
                    self.state.disarm_backups(clock);
                    break;
                }
            }
            *armed
        };
        // Workers record their clocks only when copies will ask for them.
        let progress = (!order.backup_clocks.is_empty()).then(Arc::<SegmentProgress>::default);
        *self.copy_source.lock() = progress.as_ref().map(|progress| CopySource {
            gate: gate.clone(),
            progress: progress.clone(),
            workers: order.workers.clone(),
        });
        let plan = SegmentPlan {
            gate: gate.clone(),
            map,
            addrs,
            carried: order.carried,
            progress,
            // This node's gate: its peers in other processes would wait for clocks it never
            // ran; the coordinator ends the segment once a copy report shows the divergence.
            divergence_stop: DivergenceStop::Report,
        };
        let (send, result) = std::sync::mpsc::channel();
        let pool = self.pool.lock().clone();
        let state = self.state.clone();
        let armed_segment = self.armed_segment.clone();
        std::thread::Builder::new()
            .name("segment".into())
            .spawn(move || {
                let pool = pool.lock();
                let outcome = match pool.as_ref() {
                    Some(pool) => pool
                        .run_segment(&plan)
                        .map(|reports| pool.ids().into_iter().zip(reports).collect()),
                    None => Ok(Vec::new()),
                };
                disarm_after(&armed_segment, segment, &state, plan.gate.end());
                let _ = send.send(outcome);
            })
            .map_err(|e| format!("starting the segment thread failed: {e}"))?;
        *self.running.lock() = Some(Running {
            gate,
            result,
            shards,
            taken_before,
            severance,
        });
        Ok(())
    }

    /// Keeps preloaded shards for exactly the `standby` workers this node does not run, loading
    /// the missing ones on a background thread (the segment does not wait for it).
    fn preload(&self, standby: &[u32], running: &[u32]) {
        let wanted: BTreeSet<u32> = standby
            .iter()
            .copied()
            .filter(|w| !running.contains(w) && (*w as usize) < self.job.workers)
            .collect();
        self.preloaded.lock().retain(|w, _| wanted.contains(w));
        let missing: Vec<u32> = {
            let held = self.preloaded.lock();
            let mut loading = self.preloading.lock();
            let missing: Vec<u32> = wanted
                .iter()
                .copied()
                .filter(|w| !held.contains_key(w) && !loading.contains(w))
                .collect();
            loading.extend(&missing);
            missing
        };
        if missing.is_empty() {
            return;
        }
        let (app, preloaded, loading) = (
            self.app.clone(),
            self.preloaded.clone(),
            self.preloading.clone(),
        );
        let workers = self.job.workers;
        let spawned = std::thread::Builder::new()
            .name("preload".into())
            .spawn(move || {
                for worker in missing {
                    // A shard that cannot be loaded is not preloaded: the worker loads it when
                    // it starts (and fails there, visibly), and the node still reports done.
                    let built = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        app.worker(worker as usize, workers)
                    }));
                    match built {
                        Ok(shard) => {
                            preloaded.lock().insert(worker, shard);
                            tracing::debug!(worker, "data shard preloaded");
                        }
                        Err(_) => tracing::error!(worker, "preloading the data shard failed"),
                    }
                    loading.lock().remove(&worker);
                }
            });
        if let Err(error) = spawned {
            tracing::warn!(%error, "could not start preloading data shards");
            self.preloading.lock().clear();
        }
    }

    /// Opens `workers`' connections to `addrs` on a background thread (see
    /// [`ControlRequest::PreOpen`]). A connection that cannot be opened is left to the switch,
    /// which connects as it would have without preparation.
    fn pre_open(&self, addrs: Vec<SocketAddr>, workers: Vec<u32>, frame_bytes: u64) {
        let workers: Vec<u32> = workers
            .into_iter()
            .filter(|w| (*w as usize) < self.job.workers)
            .collect();
        if addrs.is_empty() || workers.is_empty() {
            return;
        }
        let (stash, client, opening) = (
            self.pre_opened.clone(),
            self.client.clone(),
            self.opening.clone(),
        );
        let frame_bytes = usize::try_from(frame_bytes).unwrap_or(usize::MAX);
        opening.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        let spawned = std::thread::Builder::new()
            .name("pre-open".into())
            .spawn(move || {
                'addrs: for addr in addrs {
                    for &worker in &workers {
                        if let Err(error) = stash.open(worker, addr, &client, frame_bytes) {
                            tracing::warn!(worker, %addr, %error, "pre-opening a connection failed");
                            continue 'addrs;
                        }
                    }
                }
                opening.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
            });
        if let Err(error) = spawned {
            tracing::warn!(%error, "could not start pre-opening connections");
            self.opening
                .fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
        }
    }

    /// This node's part of the background BackupPS copy at `clock` (see
    /// [`ControlRequest::CopyAt`]).
    fn copy_at(
        &self,
        clock: u64,
        base: Option<u64>,
        wait: Duration,
        out: &mut Vec<u8>,
    ) -> ControlResponse {
        let Some(source) = self.copy_source.lock().clone() else {
            return ControlResponse::failed(
                "no_segment",
                "no segment with background copies is running",
            );
        };
        let deadline = Instant::now() + wait;
        let mut images = self.copies.lock().remove(&clock).unwrap_or_default();
        for partition in self.state.hosted() {
            if images.iter().any(|(image, _)| image.partition == partition) {
                continue;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            match self.state.wait_backup_blocking(partition, clock, left) {
                Ok(copy) => images.push(copy.since(base)),
                Err(StoreError::WaitClock { .. }) => {
                    self.copies.lock().insert(clock, images);
                    return ControlResponse::Running;
                }
                Err(error) => return ControlResponse::failed(error.category(), error),
            }
        }
        let left = deadline.saturating_duration_since(Instant::now());
        let reports =
            source
                .progress
                .through(&source.workers, source.gate.first(), clock, left, || {
                    source.gate.end() < clock
                });
        match reports {
            Some(reports) => {
                images.sort_by_key(|(image, _)| image.partition);
                let (images, bases): (Vec<_>, Vec<_>) = images.into_iter().unzip();
                encode_images(&images, out);
                let count = images.len() as u32;
                // sent: the next copies are made in these buffers
                for image in images {
                    self.state.recycle(image);
                }
                self.copies.lock().retain(|at, _| *at > clock);
                ControlResponse::Copied {
                    clock,
                    count,
                    reports,
                    bases,
                }
            }
            None if source.gate.end() < clock => ControlResponse::failed(
                "backup_disarmed",
                format!(
                    "the segment ended at {} before clock {clock}",
                    source.gate.end()
                ),
            ),
            None => {
                self.copies.lock().insert(clock, images);
                ControlResponse::Running
            }
        }
    }

    fn await_segment(&self, wait: Duration) -> ControlResponse {
        let mut running = self.running.lock();
        let Some(current) = running.as_ref() else {
            return ControlResponse::failed("no_segment", "no segment is running");
        };
        match current.result.recv_timeout(wait) {
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => ControlResponse::Running,
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                *running = None;
                ControlResponse::failed("segment", "the segment thread ended without a result")
            }
            Ok(outcome) => {
                let end = current.gate.end();
                let taken = self.pre_opened.taken().saturating_sub(current.taken_before);
                let shards = ShardLoads {
                    connections_pre_opened: u32::try_from(taken).unwrap_or(u32::MAX),
                    ..current.shards
                };
                // A node whose workers ran nothing (it has none) constrains no end.
                *self.last_end.lock() = current.gate.least_end();
                *running = None;
                match outcome {
                    Ok(reports) => ControlResponse::Finished {
                        end,
                        reports,
                        shards,
                    },
                    Err(error) => ControlResponse::failed(error.category(), error),
                }
            }
        }
    }
}

impl<A: App> NodeAgent for Agent<A> {
    fn control(&self, request: ControlRequest, payload: &[u8]) -> (ControlResponse, Vec<u8>) {
        self.controlled
            .store(true, std::sync::atomic::Ordering::SeqCst);
        let mut out = Vec::new();
        let answer = match request {
            ControlRequest::Take { partitions } => {
                let mut images = Vec::with_capacity(partitions.len());
                let mut missing = None;
                for partition in partitions {
                    let image = self
                        .state
                        .take(partition)
                        .or_else(|| self.handed_over.lock().remove(&partition));
                    match image {
                        Some(image) => images.push(image),
                        None => missing = Some(partition),
                    }
                }
                encode_images(&images, &mut out);
                match missing {
                    Some(partition) => ControlResponse::failed(
                        "lookup_partition",
                        format!("partition {partition} is not hosted here"),
                    ),
                    None => ControlResponse::Images {
                        count: images.len() as u32,
                    },
                }
            }
            ControlRequest::HandOver { partition } => match self.state.take(partition) {
                Some(image) => {
                    encode_images(std::slice::from_ref(&image), &mut out);
                    self.handed_over.lock().insert(partition, image);
                    ControlResponse::Images { count: 1 }
                }
                None => ControlResponse::failed(
                    "lookup_partition",
                    format!("partition {partition} is not hosted here"),
                ),
            },
            ControlRequest::Fetch {
                partition,
                epoch,
                from,
            } => self.fetch(partition, epoch, from),
            ControlRequest::Copy => {
                let images = self.state.images();
                encode_images(&images, &mut out);
                ControlResponse::Images {
                    count: images.len() as u32,
                }
            }
            ControlRequest::Install { epochs } => match decode_images(payload) {
                Err(error) => ControlResponse::failed("decode_images", error),
                Ok(images) if images.len() != epochs.len() => ControlResponse::failed(
                    "install",
                    format!("{} images but {} epochs", images.len(), epochs.len()),
                ),
                Ok(images) => {
                    let mut answer = ControlResponse::Done;
                    for (image, epoch) in images.into_iter().zip(epochs) {
                        if let Err(failed) = self.install(image, epoch) {
                            answer = failed;
                            break;
                        }
                    }
                    answer
                }
            },
            ControlRequest::Abandon => {
                let running = self.running.lock().take();
                let dropped = self.state.abandon();
                self.handed_over.lock().clear();
                self.copies.lock().clear();
                if let Some(running) = running {
                    // No clock starts any more and every wait fails: the workers stop soon,
                    // unless one is blocked on a node that hangs (it answers nothing and closes
                    // nothing). Such a segment's pool is left behind, its workers' connections
                    // cut so that their reads fail now rather than at the read timeout; the
                    // next segment starts on a fresh pool (the workers rebuild their shards).
                    running.gate.end_at(0);
                    let grace = ABANDON_GRACE.min(self.job.wait_timeout);
                    if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
                        running.result.recv_timeout(grace)
                    {
                        *self.pool.lock() = Arc::new(Mutex::new(None));
                        let severed = running.severance.sever();
                        tracing::warn!(
                            grace_ms = grace.as_millis() as u64,
                            severed,
                            "the abandoned segment did not stop: its workers are left behind, their connections severed"
                        );
                        self.metrics.connections_severed.inc_by(severed as u64);
                        std::thread::Builder::new()
                            .name("left-behind".into())
                            .spawn(move || {
                                let started = Instant::now();
                                // ends when the segment does (its result or its thread gone)
                                let _ = running.result.recv();
                                tracing::warn!(
                                    after_ms = started.elapsed().as_millis() as u64,
                                    "the left-behind segment stopped"
                                );
                            })
                            .ok();
                    }
                }
                tracing::warn!(dropped, "state abandoned: the job rolls back");
                ControlResponse::Done
            }
            ControlRequest::Clocks => ControlResponse::Clocks {
                clocks: self.state.visible_clocks(),
            },
            ControlRequest::Segment(order) => match self.start_segment(order) {
                Ok(()) => ControlResponse::Done,
                Err(message) => ControlResponse::failed("segment", message),
            },
            ControlRequest::Pause => match self.running.lock().as_ref() {
                Some(running) => ControlResponse::Paused {
                    least_end: running.gate.pause(),
                },
                None => ControlResponse::Paused {
                    least_end: *self.last_end.lock(),
                },
            },
            ControlRequest::EndAt { end } => {
                if let Some(running) = self.running.lock().as_ref() {
                    running.gate.end_at(end);
                }
                ControlResponse::Done
            }
            ControlRequest::CopyAt {
                clock,
                wait_ms,
                base,
            } => self.copy_at(
                clock,
                base,
                Duration::from_millis(wait_ms.min(10_000)),
                &mut out,
            ),
            ControlRequest::Await { wait_ms } => {
                self.await_segment(Duration::from_millis(wait_ms.min(10_000)))
            }
            ControlRequest::Shutdown => {
                if let Some(shutdown) = self.shutdown.lock().take() {
                    let _ = shutdown.send(());
                }
                ControlResponse::Done
            }
            ControlRequest::Preload { workers } => {
                self.preload(&workers, &[]);
                ControlResponse::Done
            }
            ControlRequest::Preloaded => ControlResponse::Preloading {
                loading: self.preloading.lock().len() as u32,
                opening: self.opening.load(std::sync::atomic::Ordering::Acquire),
            },
            ControlRequest::PreOpen {
                addrs,
                workers,
                frame_bytes,
            } => {
                self.pre_open(addrs, workers, frame_bytes);
                ControlResponse::Done
            }
        };
        (answer, out)
    }
}

/// A finished segment's copies past its `end` will never be ready: drops them, so their waits
/// end now, unless a later segment armed its own since (a segment left behind by an abandon
/// ends after its successor started; those copies are not its to drop). Returns whether it
/// dropped them.
fn disarm_after(armed_segment: &Mutex<u64>, segment: u64, state: &ServerState, end: u64) -> bool {
    let armed = armed_segment.lock();
    let current = *armed == segment;
    if current {
        state.disarm_backups(end + 1);
    }
    current
}

/// One control request/answer over a blocking data-plane connection.
fn call(
    connection: &mut Connection,
    request: &ControlRequest,
    payload: &[u8],
) -> Result<(ControlResponse, Vec<u8>), ClientError> {
    let json = serde_json::to_string(request).unwrap_or_default();
    connection.send(&Message::Control {
        json: &json,
        blob: payload,
    })?;
    connection.flush()?;
    let addr = connection.addr();
    match connection.recv()? {
        Message::ControlReply { json, blob } => {
            let answer = serde_json::from_str(json).map_err(|_| ClientError::Decode {
                addr,
                source: FrameError::Invalid("control answer"),
            })?;
            Ok((answer, blob.to_vec()))
        }
        other => Err(ClientError::Unexpected {
            addr,
            got: other.kind(),
            expected: "control_reply",
        }),
    }
}

/// Why an exchange with a node ended without an answer.
#[derive(Debug, thiserror::Error)]
enum ExchangeError {
    /// The connection failed or the node refused.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// The node was declared failed for lack of heartbeats.
    #[error("no heartbeat for {0:?}: declared failed")]
    Silent(Duration),
}

fn connect(client: &ClientConfig, addr: SocketAddr) -> Result<Connection, ClientError> {
    Connection::connect(addr, client)
}

/// One request/answer over `connection` (a new connection when `None`); the connection comes
/// back with the answer.
fn exchange_now(
    client: &ClientConfig,
    addr: SocketAddr,
    connection: Option<Connection>,
    request: &ControlRequest,
    payload: &[u8],
) -> Result<(Connection, ControlResponse, Vec<u8>), ClientError> {
    let mut connection = match connection {
        Some(connection) => connection,
        None => connect(client, addr)?,
    };
    let (answer, payload) = call(&mut connection, request, payload)?;
    Ok((connection, answer, payload))
}

/// How a partition image reached its new owner (the `path` label of
/// `ebbflow_runtime_partition_bytes_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImagePath {
    /// Straight from the old owner's data plane to the new owner's.
    Direct,
    /// From the old owner through the coordinator (the fallback of a failed fetch).
    Relayed,
    /// From the coordinator's own copy: the first layout, a rollback to the BackupPS copy.
    Restore,
}

impl ImagePath {
    /// Static label.
    pub fn label(self) -> &'static str {
        match self {
            ImagePath::Direct => "direct",
            ImagePath::Relayed => "relayed",
            ImagePath::Restore => "restore",
        }
    }
}

/// Bytes of partition images placed on new owners, by [`ImagePath`].
#[derive(Clone)]
pub struct PartitionBytes {
    bytes: IntCounterVec,
}

impl PartitionBytes {
    fn counter() -> IntCounterVec {
        IntCounterVec::new(
            Opts::new(
                "ebbflow_runtime_partition_bytes_total",
                "bytes of partition images placed on their new owner, by path \
                 (direct: node to node; relayed: through the coordinator; restore: from the \
                 coordinator's copy)",
            ),
            &["path"],
        )
        .expect("a valid metric")
    }

    /// A counter registered on `registry`.
    pub fn new(registry: &Registry) -> Result<Self, prometheus::Error> {
        let bytes = Self::counter();
        registry.register(Box::new(bytes.clone()))?;
        Ok(Self { bytes })
    }

    /// A counter nobody exports (tests, benches).
    pub fn unregistered() -> Self {
        Self {
            bytes: Self::counter(),
        }
    }

    fn add(&self, path: ImagePath, bytes: u64) {
        self.bytes.with_label_values(&[path.label()]).inc_by(bytes);
    }

    /// Bytes placed through `path` so far.
    pub fn get(&self, path: ImagePath) -> u64 {
        self.bytes.with_label_values(&[path.label()]).get()
    }
}

/// A member node as the coordinator sees it.
struct Link {
    name: String,
    addr: SocketAddr,
    connection: Option<Connection>,
}

/// Where `workers` logical workers run over `nodes`: each stays on its node in `current` while
/// that node is in `nodes`; a worker without a node goes to its node in `prefer` if that is
/// among the least loaded, else to the least loaded; then workers move off a node only while it
/// has two more than another.
fn place_workers(
    workers: u32,
    current: &BTreeMap<u32, NodeId>,
    nodes: &[NodeId],
    prefer: &BTreeMap<u32, NodeId>,
) -> BTreeMap<u32, NodeId> {
    let mut assignment: BTreeMap<u32, NodeId> = current
        .iter()
        .filter(|(_, node)| nodes.contains(node))
        .map(|(w, n)| (*w, *n))
        .collect();
    let mut load: BTreeMap<NodeId, usize> = nodes.iter().map(|&n| (n, 0)).collect();
    for node in assignment.values() {
        *load.entry(*node).or_default() += 1;
    }
    for worker in 0..workers {
        if assignment.contains_key(&worker) {
            continue;
        }
        let Some((&least, &fewest)) = load.iter().min_by_key(|&(&n, &c)| (c, n)) else {
            return assignment;
        };
        let node = prefer
            .get(&worker)
            .copied()
            .filter(|n| load.get(n).is_some_and(|&c| c <= fewest))
            .unwrap_or(least);
        *load.entry(node).or_default() += 1;
        assignment.insert(worker, node);
    }
    loop {
        let (Some((&busy, &most)), Some((&idle, &least))) = (
            load.iter()
                .max_by_key(|&(&n, &c)| (c, std::cmp::Reverse(n))),
            load.iter().min_by_key(|&(&n, &c)| (c, n)),
        ) else {
            return assignment;
        };
        if most < least + 2 {
            return assignment;
        }
        let Some(worker) = assignment
            .iter()
            .rev()
            .find(|(_, n)| **n == busy)
            .map(|(w, _)| *w)
        else {
            return assignment;
        };
        assignment.insert(worker, idle);
        *load.entry(busy).or_default() -= 1;
        *load.entry(idle).or_default() += 1;
    }
}

/// The coordinator's [`Fleet`] of node processes. Nodes announce their data-plane address when
/// they join (the admin API fills `directory`); the controller admits them at a boundary.
pub struct ProcessFleet {
    directory: Arc<Mutex<BTreeMap<String, SocketAddr>>>,
    links: BTreeMap<NodeId, Link>,
    client: ClientConfig,
    workers: u32,
    /// Which node runs each logical worker.
    assignment: BTreeMap<u32, NodeId>,
    /// Each transient node's logical workers' second holder: another worker node that preloads
    /// the worker's data shard and takes it over when its node leaves.
    standby: BTreeMap<u32, NodeId>,
    /// Joined nodes not switched in yet, with the workers whose shards they preload.
    pending: BTreeMap<NodeId, Vec<u32>>,
    run_start_unix: f64,
    /// The coordinator's metrics: clocks run and loss, from the workers' reports.
    metrics: RuntimeMetrics,
    /// Nodes declared failed for lack of heartbeats are lost (`None`: only broken connections).
    heartbeats: Option<Arc<Heartbeats>>,
    /// Bytes of partition images placed, by path.
    partition_bytes: PartitionBytes,
    /// Copy partitions to the BackupPSs in the background during segments (else at
    /// boundaries every `backup_every` clocks).
    background_copies: bool,
    /// Where complete background copies are offered for the coordinator's checkpoint.
    checkpoint: Option<Arc<crate::checkpoint::CheckpointWriter>>,
    /// The latest complete background copy of the last segment, if that segment failed.
    salvage: Option<Salvage>,
    /// Per joined node being prepared: the other nodes opening their workers' connections to
    /// it ([`ControlRequest::PreOpen`]).
    opening: BTreeMap<NodeId, BTreeSet<NodeId>>,
    /// The largest partition image seen (placed or copied): the frame size pre-opened
    /// connections are warmed for.
    largest_image_bytes: usize,
    /// The last segment's bystanders ([`SegmentSpec::bystanders`]): they host nothing, so
    /// reading the partitions' clocks and images does not ask them.
    bystanders: BTreeSet<NodeId>,
    /// Bystanders lost in the last segment, not reported yet ([`Fleet::departed`]).
    departed: Vec<NodeId>,
    /// Where the running segment's partitions and workers are, for the coordinator's status.
    placement: Arc<Mutex<Placement>>,
}

/// Who serves each partition and runs the logical workers in the running segment, by node
/// name: what the elastic coordinator's `/status` shows.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Placement {
    /// Per partition, in partition order: its owner's name and epoch.
    pub partitions: Vec<(String, u64)>,
    /// Logical workers per node name (nodes that run none are absent).
    pub workers: BTreeMap<String, u32>,
}

/// A node's part of a background copy: per partition its image, whole (`None`) or a
/// coalesced delta since a clock, and its workers' reports.
type CopyPart = (Vec<(PartitionImage, Option<u64>)>, Vec<(u32, WorkerReport)>);

/// The parts of a segment's background BackupPS copies that arrived, by clock and node.
#[derive(Default)]
struct CopySets {
    parts: BTreeMap<u64, BTreeMap<NodeId, CopyPart>>,
    latest: Option<Salvage>,
    /// The copy the controller held as the segment started: deltas apply to it until a
    /// complete copy of the segment (`latest`) replaces it.
    held: Option<(u64, Arc<Vec<PartitionImage>>)>,
    /// A set of this segment was not kept: later sets may no longer count on the one before
    /// them ([`CopySets::base_after`]).
    broken: bool,
    /// Where complete copies are offered for the coordinator's checkpoint.
    checkpoint: Option<Arc<crate::checkpoint::CheckpointWriter>>,
}

impl CopySets {
    /// Copy sets over the copy the controller holds.
    fn over(held: Option<(u64, Arc<Vec<PartitionImage>>)>) -> Self {
        Self {
            held,
            ..Self::default()
        }
    }

    /// The clock of the copy deltas are applied to now (and so, the sets completing in clock
    /// order, to every later set): what a node's deltas may be taken since.
    fn base(&self) -> Option<u64> {
        match &self.latest {
            Some(latest) => Some(latest.clock),
            None => self.held.as_ref().map(|(clock, _)| *clock),
        }
    }

    /// The base to ask a node's copy at some clock for, its previous copy having been at
    /// `previous` (received): sets complete in clock order, so that one will be held when this
    /// one applies, unless some set was dropped (then only what is held now counts).
    fn base_after(&self, previous: Option<u64>) -> Option<u64> {
        match (self.broken, previous, self.base()) {
            (false, Some(previous), Some(now)) => Some(previous.max(now)),
            (_, _, now) => now,
        }
    }

    /// Whole images of a complete set: each delta applied to the same partition's image in the
    /// latest complete copy or, before there is one, in the held copy. An error if a delta does
    /// not fit (the latest copy is then gone: later deltas cannot apply either, and the segment
    /// keeps the held copy).
    fn resolve(
        &mut self,
        images: Vec<(PartitionImage, Option<u64>)>,
    ) -> Result<Vec<PartitionImage>, StoreError> {
        if images.iter().all(|(_, base)| base.is_none()) {
            return Ok(images.into_iter().map(|(image, _)| image).collect());
        }
        // A delta since a clock after the held copy would miss rows: the set is dropped, the
        // held copy kept.
        let held_clock = self.base().unwrap_or(0);
        if let Some((image, Some(base))) = images
            .iter()
            .find(|(_, base)| base.is_some_and(|b| b > held_clock))
        {
            return Err(StoreError::RestoreImage {
                partition: image.partition,
                reason: format!("a delta since clock {base}, the copy held is at {held_clock}"),
            });
        }
        let mut previous: BTreeMap<PartitionId, PartitionImage> = self
            .latest
            .take()
            .map(|latest| {
                Arc::unwrap_or_clone(latest.images)
                    .into_iter()
                    .map(|image| (image.partition, image))
                    .collect()
            })
            .unwrap_or_default();
        let held = self.held.as_ref().map(|(_, images)| images);
        images
            .into_iter()
            .map(|(image, base)| {
                let Some(base) = base else {
                    return Ok(image);
                };
                let partition = image.partition;
                let mut at = previous
                    .remove(&partition)
                    .or_else(|| {
                        held.and_then(|images| images.iter().find(|i| i.partition == partition))
                            .cloned()
                    })
                    .ok_or_else(|| StoreError::RestoreImage {
                        partition,
                        reason: format!("no copy is held to apply a delta since clock {base} to"),
                    })?;
                crate::store::apply_delta(&mut at, base, image)?;
                Ok(at)
            })
            .collect()
    }

    /// Adds `node`'s part of the copy at `clock`; once every one of `nodes` sent its part and
    /// the parts hold every one of `partitions` and `workers`, it is the latest complete copy.
    fn add(
        &mut self,
        node: NodeId,
        clock: u64,
        images: Vec<(PartitionImage, Option<u64>)>,
        reports: Vec<(u32, WorkerReport)>,
        (nodes, partitions, workers): (usize, usize, usize),
        metrics: &RuntimeMetrics,
    ) {
        let parts = self.parts.entry(clock).or_default();
        parts.insert(node, (images, reports));
        if parts.len() < nodes {
            return;
        }
        let Some(parts) = self.parts.remove(&clock) else {
            return;
        };
        self.parts.retain(|at, _| *at > clock);
        let (mut images, mut reports): (Vec<_>, Vec<_>) = (Vec::new(), Vec::new());
        for (these, those) in parts.into_values() {
            images.extend(these);
            reports.extend(those);
        }
        images.sort_by_key(|(image, _)| image.partition);
        images.dedup_by_key(|(image, _)| image.partition);
        reports.sort_by_key(|(worker, _)| *worker);
        reports.dedup_by_key(|(worker, _)| *worker);
        if images.len() != partitions || reports.len() != workers {
            self.broken = true;
            tracing::warn!(
                clock,
                images = images.len(),
                reports = reports.len(),
                "an incomplete BackupPS copy is not kept"
            );
            return;
        }
        if self
            .latest
            .as_ref()
            .is_some_and(|latest| latest.clock >= clock)
        {
            return;
        }
        let images = match self.resolve(images) {
            Ok(images) => images,
            Err(error) => {
                self.broken = true;
                tracing::warn!(clock, %error, "a BackupPS delta copy does not apply");
                return;
            }
        };
        metrics.consistent_clock.set(clock as i64);
        let images = Arc::new(images);
        if let Some(writer) = &self.checkpoint {
            writer.offer(clock, &images);
        }
        self.latest = Some(Salvage {
            clock,
            images,
            reports,
        });
    }
}

impl ProcessFleet {
    /// A fleet of `workers` logical workers over the nodes `directory` names.
    pub fn new(
        directory: Arc<Mutex<BTreeMap<String, SocketAddr>>>,
        secret: &[u8],
        tls: Option<Arc<crate::tls::JobTls>>,
        workers: u32,
        timeout: Duration,
        metrics: RuntimeMetrics,
    ) -> Self {
        Self {
            directory,
            links: BTreeMap::new(),
            client: ClientConfig {
                secret: secret.to_vec(),
                node: u32::MAX,
                max_frame_bytes: crate::frame::DEFAULT_MAX_FRAME_BYTES,
                timeout,
                tls,
            },
            workers,
            assignment: BTreeMap::new(),
            standby: BTreeMap::new(),
            pending: BTreeMap::new(),
            run_start_unix: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64()),
            metrics,
            heartbeats: None,
            partition_bytes: PartitionBytes::unregistered(),
            background_copies: true,
            checkpoint: None,
            salvage: None,
            opening: BTreeMap::new(),
            largest_image_bytes: 0,
            bystanders: BTreeSet::new(),
            departed: Vec::new(),
            placement: Arc::default(),
        }
    }

    /// Publishes where each segment's partitions and workers are on `placement` (cleared while
    /// nothing is placed: between a loss and its rollback, and after the run).
    pub fn with_placement(mut self, placement: Arc<Mutex<Placement>>) -> Self {
        self.placement = placement;
        self
    }

    /// Publishes the running segment's placement: partitions as in `map`, workers as assigned.
    fn publish_placement(&self, map: &PartitionMap) {
        let name = |node: NodeId| {
            self.links
                .get(&node)
                .map_or_else(|| format!("node-{node}"), |l| l.name.clone())
        };
        let mut workers: BTreeMap<String, u32> = BTreeMap::new();
        for node in self.assignment.values() {
            *workers.entry(name(*node)).or_default() += 1;
        }
        *self.placement.lock() = Placement {
            partitions: map
                .entries()
                .iter()
                .map(|e| (name(e.owner), e.epoch))
                .collect(),
            workers,
        };
    }

    /// Copies to the BackupPSs at boundaries every `backup_every` clocks instead of in the
    /// background (`false`; the benchmarks compare both).
    pub fn with_background_copies(mut self, on: bool) -> Self {
        self.background_copies = on;
        self
    }

    /// Offers every complete background copy to `writer` (the coordinator's checkpoint).
    pub fn with_checkpoint(
        mut self,
        writer: Option<Arc<crate::checkpoint::CheckpointWriter>>,
    ) -> Self {
        self.checkpoint = writer;
        self
    }

    /// Counts the bytes of placed partition images on `bytes`.
    pub fn with_partition_bytes(mut self, bytes: PartitionBytes) -> Self {
        self.partition_bytes = bytes;
        self
    }

    /// Treats the nodes `heartbeats` declares failed as lost.
    pub fn with_heartbeats(mut self, heartbeats: Arc<Heartbeats>) -> Self {
        self.heartbeats = Some(heartbeats);
        self
    }

    /// Whether node `name` was declared failed for lack of heartbeats.
    fn silent(&self, name: &str) -> Option<ExchangeError> {
        let heartbeats = self.heartbeats.as_ref()?;
        heartbeats
            .has_failed(name, Instant::now())
            .then(|| ExchangeError::Silent(heartbeats.timeout()))
    }

    fn name(&self, node: NodeId) -> &str {
        self.links.get(&node).map_or("", |l| l.name.as_str())
    }

    /// One request to node `name` at `addr`. Without heartbeats this waits for the answer (or
    /// the connection's timeout); with them the exchange runs on a helper thread and the wait
    /// ends as soon as the node is declared failed (the thread then ends on its own when the
    /// connection does).
    fn exchange(
        &self,
        name: &str,
        addr: SocketAddr,
        connection: Option<Connection>,
        request: &ControlRequest,
        payload: &[u8],
    ) -> Result<(Connection, ControlResponse, Vec<u8>), ExchangeError> {
        let Some(heartbeats) = &self.heartbeats else {
            return Ok(exchange_now(
                &self.client,
                addr,
                connection,
                request,
                payload,
            )?);
        };
        if let Some(silent) = self.silent(name) {
            return Err(silent);
        }
        let (send, answer) = std::sync::mpsc::channel();
        let (client, request, payload) = (self.client.clone(), request.clone(), payload.to_vec());
        std::thread::Builder::new()
            .name("control-call".into())
            .spawn(move || {
                let _ = send.send(exchange_now(&client, addr, connection, &request, &payload));
            })
            .map_err(|source| ClientError::Exchange { addr, source })?;
        loop {
            match answer.recv_timeout(Duration::from_millis(10)) {
                Ok(outcome) => return Ok(outcome?),
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                    if heartbeats.has_failed(name, Instant::now()) {
                        return Err(ExchangeError::Silent(heartbeats.timeout()));
                    }
                }
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                    return Err(ClientError::Exchange {
                        addr,
                        source: std::io::Error::other("the control call ended without an answer"),
                    }
                    .into());
                }
            }
        }
    }

    /// Asks `request` of `node` at `addr` on `connection` (a new one when `None`, kept for the
    /// next call) until the answer is not [`ControlResponse::Running`]; `None` once `stop`
    /// says so.
    fn ask_until_answered(
        &self,
        node: NodeId,
        addr: SocketAddr,
        connection: &mut Option<Connection>,
        request: &ControlRequest,
        stop: impl Fn() -> bool,
    ) -> Result<Option<(ControlResponse, Vec<u8>)>, ExchangeError> {
        let name = self.name(node);
        while !stop() {
            let (kept, answer, payload) =
                self.exchange(name, addr, connection.take(), request, &[])?;
            *connection = Some(kept);
            if !matches!(answer, ControlResponse::Running) {
                return Ok(Some((answer, payload)));
            }
        }
        Ok(None)
    }

    /// `node`'s parts of a segment's background BackupPS copies at `clocks`, in turn, into
    /// `copies`, until `stop` says the segment failed. Ends at the first copy the node does not
    /// take (the segment ended before it, or it was armed too late and so were the later ones):
    /// no later copy can be complete without this node. A lost node is for the segment's await
    /// to report.
    fn copy_in_background(
        &self,
        node: NodeId,
        addr: SocketAddr,
        clocks: &[u64],
        copies: &Mutex<CopySets>,
        shape: (usize, usize, usize),
        stop: impl Fn() -> bool,
        interrupt: &Interrupt,
    ) {
        let mut connection = None;
        let mut previous = None;
        for &clock in clocks {
            let request = ControlRequest::CopyAt {
                clock,
                wait_ms: 200,
                base: copies.lock().base_after(previous),
            };
            match self.ask_until_answered(node, addr, &mut connection, &request, &stop) {
                Ok(Some((ControlResponse::Copied { reports, bases, .. }, payload))) => {
                    // A worker whose loss diverged: end the segment now for every node (the
                    // controller then fails the run with the reports).
                    if reports.iter().any(|(_, report)| report.diverged.is_some()) {
                        tracing::warn!(node, clock, "a worker diverged: the segment ends");
                        interrupt.request();
                    }
                    match decode_images(&payload).and_then(|images| with_bases(images, bases)) {
                        Ok(images) => {
                            for (image, base) in &images {
                                self.metrics
                                    .count_backup_copy(image.parameter_bytes(), base.is_some());
                            }
                            copies
                                .lock()
                                .add(node, clock, images, reports, shape, &self.metrics);
                            previous = Some(clock);
                        }
                        Err(error) => tracing::warn!(
                            node, clock, %error,
                            "a node sent an undecodable BackupPS copy"
                        ),
                    }
                }
                Ok(Some((answer, _))) => {
                    tracing::debug!(node, clock, ?answer, "background copies end here");
                    return;
                }
                Ok(None) | Err(_) => return,
            }
        }
    }

    /// Which node runs each logical worker now.
    pub fn assignment(&self) -> &BTreeMap<u32, NodeId> {
        &self.assignment
    }

    fn lost(node: NodeId, error: impl std::fmt::Display) -> FleetError {
        FleetError::Lost {
            nodes: vec![node],
            reason: error.to_string(),
        }
    }

    /// Sends one request to `node` on its standing connection.
    fn request(
        &mut self,
        node: NodeId,
        request: &ControlRequest,
        payload: &[u8],
    ) -> Result<(ControlResponse, Vec<u8>), FleetError> {
        let (addr, name) = self
            .links
            .get(&node)
            .map(|l| (l.addr, l.name.clone()))
            .ok_or_else(|| Self::lost(node, "not a member"))?;
        let connection = self.links.get_mut(&node).and_then(|l| l.connection.take());
        match self.exchange(&name, addr, connection, request, payload) {
            Ok((connection, answer, payload)) => {
                if let Some(link) = self.links.get_mut(&node) {
                    link.connection = Some(connection);
                }
                match answer {
                    ControlResponse::Failed { category, message } => Err(RunError::RunCluster {
                        reason: format!("node {node} refused ({category}): {message}"),
                    }
                    .into()),
                    answer => Ok((answer, payload)),
                }
            }
            Err(ExchangeError::Client(ClientError::Refused {
                category, message, ..
            })) => Err(RunError::RunCluster {
                reason: format!("node {node} refused ({category}): {message}"),
            }
            .into()),
            Err(error) => Err(Self::lost(node, error)),
        }
    }

    /// Balances logical workers over `nodes`, keeping each where it is while its node still
    /// runs workers; a worker whose node left goes to its second holder (which preloaded its
    /// shard) when that is among the least loaded. Then picks a second holder for every worker
    /// of a node not in `reliable`: the node it would go to if its own node left now. Reliable
    /// nodes get no eviction notice, so their workers' shards are not preloaded anywhere (a
    /// second copy of a node's data is paid only where it buys a fast migration).
    fn assign(&mut self, nodes: &[NodeId], reliable: &BTreeSet<NodeId>) {
        self.assignment = place_workers(self.workers, &self.assignment, nodes, &self.standby);
        self.standby.clear();
        if nodes.len() < 2 {
            return;
        }
        for &leaving in nodes.iter().filter(|n| !reliable.contains(n)) {
            let rest: Vec<NodeId> = nodes.iter().copied().filter(|&n| n != leaving).collect();
            let placed = place_workers(self.workers, &self.assignment, &rest, &BTreeMap::new());
            for (&worker, &node) in &self.assignment {
                if node == leaving
                    && let Some(&holder) = placed.get(&worker)
                {
                    self.standby.insert(worker, holder);
                }
            }
        }
    }

    /// Each logical worker's second holder.
    pub fn standby(&self) -> &BTreeMap<u32, NodeId> {
        &self.standby
    }

    /// Runs `request` on every node in `nodes` over fresh connections, in parallel.
    fn broadcast(
        &self,
        nodes: &[(NodeId, SocketAddr)],
        request: &ControlRequest,
    ) -> Vec<(NodeId, Result<ControlResponse, ExchangeError>)> {
        std::thread::scope(|scope| {
            let handles: Vec<_> = nodes
                .iter()
                .map(|&(node, addr)| {
                    scope.spawn(move || {
                        let answer = self
                            .exchange(self.name(node), addr, None, request, &[])
                            .map(|(_, answer, _)| answer);
                        (node, answer)
                    })
                })
                .collect();
            handles.into_iter().filter_map(|h| h.join().ok()).collect()
        })
    }
}

impl ProcessFleet {
    /// The members that may host partitions: all but the last segment's bystanders.
    fn hosting_nodes(&self) -> Vec<NodeId> {
        self.links
            .keys()
            .copied()
            .filter(|n| !self.bystanders.contains(n))
            .collect()
    }

    /// Node `name` at `addr` is no member any more: its heartbeats are no longer watched, then
    /// its name leaves the directory (in this order: a replacement may join as soon as the name
    /// is gone, and its heartbeat record must not be forgotten after it joined), unless a
    /// replacement already holds it.
    fn let_go(&self, name: &str, addr: SocketAddr) {
        if let Some(heartbeats) = &self.heartbeats {
            heartbeats.forget(name);
        }
        let mut directory = self.directory.lock();
        if directory.get(name) == Some(&addr) {
            directory.remove(name);
        }
    }
}

impl Fleet for ProcessFleet {
    fn admit(&mut self, id: NodeId, name: &str) -> Result<(), FleetError> {
        let addr = self
            .directory
            .lock()
            .get(name)
            .copied()
            .ok_or_else(|| Self::lost(id, format!("node {name} never announced an address")))?;
        // A cheap request proves the node answers (a hung one is declared failed meanwhile).
        // One that does not is let go like a released node: a replacement under its name (a
        // reliable slot) can join only once the directory no longer holds it.
        let (connection, _, _) = match self.exchange(name, addr, None, &ControlRequest::Clocks, &[])
        {
            Ok(answer) => answer,
            Err(error) => {
                self.let_go(name, addr);
                return Err(Self::lost(id, error));
            }
        };
        self.links.insert(
            id,
            Link {
                name: name.to_owned(),
                addr,
                connection: Some(connection),
            },
        );
        tracing::info!(node = id, %name, %addr, "node admitted");
        Ok(())
    }

    fn release(&mut self, id: NodeId) {
        if self.links.contains_key(&id) {
            let _ = self.request(id, &ControlRequest::Shutdown, &[]);
        }
        if let Some(link) = self.links.remove(&id) {
            self.let_go(&link.name, link.addr);
            tracing::info!(node = id, name = %link.name, "node released");
        }
        self.assignment.retain(|_, node| *node != id);
        self.pending.remove(&id);
        self.opening.remove(&id);
        for nodes in self.opening.values_mut() {
            nodes.remove(&id);
        }
    }

    fn prepare(&mut self, id: NodeId, prospective: &Layout) -> Result<bool, FleetError> {
        let placed = place_workers(
            self.workers,
            &self.assignment,
            &prospective.worker_nodes,
            &self.standby,
        );
        let mut by_node: BTreeMap<NodeId, Vec<u32>> = BTreeMap::new();
        for (worker, node) in &placed {
            by_node.entry(*node).or_default().push(*worker);
        }
        let workers = by_node.remove(&id).unwrap_or_default();
        let mut preparing = false;
        if !workers.is_empty() {
            let request = ControlRequest::Preload {
                workers: workers.clone(),
            };
            match self.request(id, &request, &[])?.0 {
                ControlResponse::Done => {
                    tracing::info!(node = id, ?workers, "preparing a joined node");
                    self.pending.insert(id, workers.clone());
                    preparing = true;
                }
                other => {
                    return Err(RunError::RunCluster {
                        reason: format!("node {id} answered {other:?} to preload"),
                    }
                    .into());
                }
            }
        }
        // The connections the switch would open, opened now: the joined node's workers' to
        // every server of the layout, and, if it will serve, every other worker node's to it.
        let frame_bytes = self.largest_image_bytes as u64;
        let addr_of = |fleet: &Self, node: &NodeId| fleet.links.get(node).map(|l| l.addr);
        let servers: Vec<SocketAddr> = prospective
            .servers
            .iter()
            .filter_map(|node| addr_of(self, node))
            .collect();
        if !workers.is_empty() && !servers.is_empty() {
            let request = ControlRequest::PreOpen {
                addrs: servers,
                workers,
                frame_bytes,
            };
            // Non-empty `workers` were sent to preload above, so `prepared` already polls it.
            self.request(id, &request, &[])?;
            tracing::info!(
                node = id,
                "pre-opening the joined node's connections to the servers"
            );
        }
        let joined_addr = prospective
            .servers
            .contains(&id)
            .then(|| addr_of(self, &id))
            .flatten();
        if let Some(addr) = joined_addr {
            for (node, workers) in by_node {
                if !self.links.contains_key(&node) {
                    continue;
                }
                let request = ControlRequest::PreOpen {
                    addrs: vec![addr],
                    workers,
                    frame_bytes,
                };
                // A node that does not take the request connects at the switch, as before; if
                // it is lost, the segment finds out.
                if let Ok((ControlResponse::Done, _)) = self.request(node, &request, &[]) {
                    tracing::info!(
                        node,
                        joined = id,
                        "pre-opening connections to a joined node"
                    );
                    self.opening.entry(id).or_default().insert(node);
                    preparing = true;
                }
            }
        }
        Ok(!preparing)
    }

    fn prepared(&mut self, id: NodeId) -> Result<bool, FleetError> {
        if self.pending.contains_key(&id) {
            match self.request(id, &ControlRequest::Preloaded, &[])?.0 {
                ControlResponse::Preloading {
                    loading: 0,
                    opening: 0,
                } => {
                    self.pending.remove(&id);
                }
                ControlResponse::Preloading { .. } => return Ok(false),
                other => {
                    return Err(RunError::RunCluster {
                        reason: format!("node {id} answered {other:?} to preloaded"),
                    }
                    .into());
                }
            }
        }
        // Other nodes still opening connections to it; one that does not answer is no reason
        // to hold the joined node back (the segment finds out what became of it).
        let others: Vec<NodeId> = self
            .opening
            .get(&id)
            .map(|nodes| nodes.iter().copied().collect())
            .unwrap_or_default();
        for node in others {
            if let Ok((ControlResponse::Preloading { opening, .. }, _)) =
                self.request(node, &ControlRequest::Preloaded, &[])
                && opening > 0
            {
                return Ok(false);
            }
            if let Some(nodes) = self.opening.get_mut(&id) {
                nodes.remove(&node);
            }
        }
        self.opening.remove(&id);
        Ok(true)
    }

    fn place(
        &mut self,
        partition: PartitionId,
        to: NodeId,
        epoch: u64,
        from: Option<NodeId>,
        fallback: &PartitionImage,
    ) -> Result<(), FleetError> {
        self.largest_image_bytes = self.largest_image_bytes.max(fallback.parameter_bytes());
        let old = from.and_then(|node| self.links.get(&node).map(|l| (node, l.addr)));
        if let Some((node, addr)) = old
            && node != to
        {
            // Straight from the old owner to the new one.
            let fetch = ControlRequest::Fetch {
                partition,
                epoch,
                from: addr,
            };
            match self.request(to, &fetch, &[]) {
                Ok((ControlResponse::Fetched { bytes }, _)) => {
                    self.partition_bytes.add(ImagePath::Direct, bytes);
                    return Ok(());
                }
                Ok((other, _)) => {
                    tracing::warn!(partition, from = node, to, answer = ?other,
                        "direct fetch answered unexpectedly: relaying the partition");
                }
                Err(error @ FleetError::Lost { .. }) => return Err(error),
                Err(error) => {
                    tracing::warn!(partition, from = node, to, %error,
                        "direct fetch failed: relaying the partition");
                }
            }
        }
        let (payload, path) = match old {
            Some((node, _)) => {
                let request = ControlRequest::Take {
                    partitions: vec![partition],
                };
                (self.request(node, &request, &[])?.1, ImagePath::Relayed)
            }
            None => {
                let mut out = Vec::new();
                encode_images(std::slice::from_ref(fallback), &mut out);
                (out, ImagePath::Restore)
            }
        };
        self.request(
            to,
            &ControlRequest::Install {
                epochs: vec![epoch],
            },
            &payload,
        )?;
        self.partition_bytes.add(path, payload.len() as u64);
        Ok(())
    }

    fn retire_idle(&mut self, _owners: &BTreeSet<NodeId>) {
        // A node process keeps its data-plane server for its whole life; idle, it hosts nothing.
    }

    fn abandon_all(&mut self) {
        *self.placement.lock() = Placement::default();
        let nodes: Vec<(NodeId, SocketAddr)> =
            self.links.iter().map(|(id, l)| (*id, l.addr)).collect();
        for (node, answer) in self.broadcast(&nodes, &ControlRequest::Abandon) {
            if let Err(error) = answer {
                tracing::warn!(node, %error, "abandon did not reach the node");
            }
        }
    }

    fn run_segment(
        &mut self,
        spec: &SegmentSpec,
        interrupt: &Interrupt,
    ) -> Result<SegmentOutcome, FleetError> {
        self.salvage = None;
        // Joined nodes still being prepared get the order (their standby shards) but hold
        // nothing: losing one must not fail the segment (it is reported, and fails without a
        // rollback), so they take no part in its copies and their answers are not awaited.
        self.bystanders = spec
            .bystanders
            .iter()
            .copied()
            .filter(|n| self.links.contains_key(n))
            .collect();
        let copy_clocks: &[u64] = if self.background_copies {
            &spec.backup_clocks
        } else {
            &[]
        };
        self.assign(&spec.worker_nodes, &spec.reliable.iter().copied().collect());
        self.publish_placement(&spec.map);
        let owners: Vec<(NodeId, u64)> = spec
            .map
            .entries()
            .iter()
            .map(|e| (e.owner, e.epoch))
            .collect();
        let addrs: Vec<(NodeId, SocketAddr)> =
            self.links.iter().map(|(id, l)| (*id, l.addr)).collect();
        let nodes: Vec<NodeId> = self.links.keys().copied().collect();
        for &node in &nodes {
            let workers: Vec<u32> = self
                .assignment
                .iter()
                .filter(|(_, n)| **n == node)
                .map(|(w, _)| *w)
                .collect();
            let standby: Vec<u32> = self
                .standby
                .iter()
                .filter(|(_, n)| **n == node)
                .map(|(w, _)| *w)
                .chain(self.pending.get(&node).into_iter().flatten().copied())
                .collect();
            let order = SegmentOrder {
                first: spec.first,
                end: spec.end,
                workers,
                owners: owners.clone(),
                addrs: addrs.clone(),
                run_start_unix: self.run_start_unix,
                standby,
                carried: spec.carried,
                backup_clocks: copy_clocks.to_vec(),
            };
            match self.request(node, &ControlRequest::Segment(order), &[]) {
                Err(FleetError::Lost { reason, .. }) if self.bystanders.contains(&node) => {
                    tracing::warn!(node, %reason, "a node being prepared was lost");
                    self.departed.push(node);
                }
                Err(error) => {
                    // The others may have started: stop them before reporting.
                    self.abandon_all();
                    return Err(error);
                }
                Ok(_) => {}
            }
        }
        // The nodes that took the order; of those, the ones the segment depends on.
        let addrs: Vec<(NodeId, SocketAddr)> = addrs
            .into_iter()
            .filter(|(n, _)| !self.departed.contains(n))
            .collect();
        let participants: Vec<(NodeId, SocketAddr)> = addrs
            .iter()
            .copied()
            .filter(|(n, _)| !self.bystanders.contains(n))
            .collect();
        let quiet: Mutex<Vec<NodeId>> = Mutex::new(Vec::new());
        let lost: Mutex<Vec<(NodeId, String)>> = Mutex::new(Vec::new());
        let agreed: Mutex<Option<u64>> = Mutex::new(None);
        let copies = Mutex::new(CopySets {
            checkpoint: self.checkpoint.clone(),
            ..CopySets::over(spec.held_backup.clone())
        });
        let shape = (
            participants.len(),
            spec.map.num_partitions() as usize,
            self.workers as usize,
        );
        let this = &*self;
        let abort = |node: NodeId, reason: String| {
            if this.bystanders.contains(&node) {
                tracing::warn!(node, %reason, "a node being prepared was lost");
                quiet.lock().push(node);
                return;
            }
            let mut lost = lost.lock();
            let first = lost.is_empty();
            lost.push((node, reason));
            drop(lost);
            if first {
                // Survivors drop their state at once: their waits fail instead of timing out,
                // and their workers stop.
                let others: Vec<(NodeId, SocketAddr)> =
                    addrs.iter().copied().filter(|(n, _)| *n != node).collect();
                let _ = this.broadcast(&others, &ControlRequest::Abandon);
            }
        };
        let abort = &abort;
        let results: Vec<(NodeId, Result<ControlResponse, FleetError>)> =
            std::thread::scope(|scope| {
                // An interrupt ends the segment at the highest clock any process started, but
                // after its first clock at least: events arriving faster than boundaries (a
                // market replayed fast, many nodes joining) must not end every segment before
                // its workers start, which held the stormy `ebbflow run` test at one clock.
                scope.spawn(|| {
                    if interrupt.next() {
                        let paused = this.broadcast(&addrs, &ControlRequest::Pause);
                        let mut end = (spec.first + 1).min(spec.end);
                        for (node, answer) in paused {
                            match answer {
                                Ok(ControlResponse::Paused { least_end }) => {
                                    end = end.max(least_end);
                                }
                                Ok(other) => abort(node, format!("pause answered {other:?}")),
                                Err(error) => abort(node, error.to_string()),
                            }
                        }
                        let end = end.min(spec.end);
                        *agreed.lock() = Some(end);
                        for (node, answer) in this.broadcast(&addrs, &ControlRequest::EndAt { end })
                        {
                            if let Err(error) = answer {
                                abort(node, error.to_string());
                            }
                        }
                    }
                });
                // Background BackupPS copies: every node's part of each copy, while the
                // workers go on; a copy is complete once every node sent its part.
                if !copy_clocks.is_empty() {
                    for &(node, addr) in &participants {
                        let (copies, lost) = (&copies, &lost);
                        scope.spawn(move || {
                            this.copy_in_background(
                                node,
                                addr,
                                copy_clocks,
                                copies,
                                shape,
                                || !lost.lock().is_empty(),
                                interrupt,
                            );
                        });
                    }
                }
                let handles: Vec<_> = addrs
                    .iter()
                    .map(|&(node, addr)| {
                        scope.spawn(move || {
                            let request = ControlRequest::Await { wait_ms: 200 };
                            let outcome = this
                                .ask_until_answered(node, addr, &mut None, &request, || false)
                                .map_err(|error| Self::lost(node, error))
                                // Never stopped: `None` cannot come back.
                                .map(|answer| {
                                    answer.map_or(ControlResponse::Running, |(answer, _)| answer)
                                });
                            if let Err(FleetError::Lost { reason, .. }) = &outcome {
                                abort(node, reason.clone());
                            }
                            (node, outcome)
                        })
                    })
                    .collect();
                let results = handles.into_iter().filter_map(|h| h.join().ok()).collect();
                interrupt.close();
                results
            });
        let lost = lost.into_inner();
        let quiet = quiet.into_inner();
        self.departed.extend(quiet.iter().copied());
        let latest = copies.into_inner().latest;
        if !lost.is_empty() {
            // What the failed segment copied before it failed is where the run rolls back to.
            self.salvage = latest;
            return Err(FleetError::Lost {
                nodes: lost.iter().map(|(n, _)| *n).collect(),
                reason: lost
                    .iter()
                    .map(|(n, r)| format!("node {n}: {r}"))
                    .collect::<Vec<_>>()
                    .join("; "),
            });
        }
        let mut reports = Vec::new();
        let mut started = ShardLoads::default();
        let mut end = agreed.into_inner().unwrap_or(spec.end);
        for (node, outcome) in results {
            if quiet.contains(&node) {
                continue;
            }
            match outcome? {
                ControlResponse::Finished {
                    end: node_end,
                    reports: node_reports,
                    shards,
                } => {
                    if !node_reports.is_empty() {
                        end = node_end;
                    }
                    started.built += shards.built;
                    started.preloaded += shards.preloaded;
                    started.connections_pre_opened += shards.connections_pre_opened;
                    self.metrics
                        .pre_opened_connections
                        .with_label_values(&["taken"])
                        .inc_by(u64::from(shards.connections_pre_opened));
                    let loads = &self.metrics.shard_loads;
                    loads
                        .with_label_values(&["built"])
                        .inc_by(u64::from(shards.built));
                    loads
                        .with_label_values(&["preloaded"])
                        .inc_by(u64::from(shards.preloaded));
                    reports.extend(node_reports);
                }
                ControlResponse::Failed { category, message } => {
                    self.abandon_all();
                    return Err(RunError::RunCluster {
                        reason: format!("node {node}'s segment failed ({category}): {message}"),
                    }
                    .into());
                }
                other => {
                    return Err(RunError::RunCluster {
                        reason: format!("node {node} answered {other:?} to await"),
                    }
                    .into());
                }
            }
        }
        reports.sort_by_key(|(worker, _)| *worker);
        // The workers ran in other processes: account their clocks and loss here too, so the
        // coordinator's /metrics shows the job's progress.
        let clocks_run: usize = reports.iter().map(|(_, r)| r.stats.len()).sum();
        self.metrics.iterations.inc_by(clocks_run as u64);
        let (loss_sum, loss_count) = reports
            .iter()
            .filter_map(|(_, r)| r.stats.last())
            .fold((0.0, 0u64), |(sum, count), s| {
                (sum + s.loss_sum, count + s.loss_count)
            });
        if loss_count > 0 {
            self.metrics.loss.set(loss_sum / loss_count as f64);
        }
        if let Some(copy) = &latest {
            let largest = copy
                .images
                .iter()
                .map(PartitionImage::parameter_bytes)
                .max();
            self.largest_image_bytes = self.largest_image_bytes.max(largest.unwrap_or(0));
        }
        Ok(SegmentOutcome {
            end,
            reports,
            backup: latest.map(|copy| (copy.clock, copy.images)),
            shards: started,
        })
    }

    fn visible_clocks(&mut self) -> Result<Vec<(PartitionId, u64)>, FleetError> {
        let nodes = self.hosting_nodes();
        let mut clocks = Vec::new();
        for node in nodes {
            if let (ControlResponse::Clocks { clocks: these }, _) =
                self.request(node, &ControlRequest::Clocks, &[])?
            {
                clocks.extend(these);
            }
        }
        Ok(clocks)
    }

    fn images(&mut self) -> Result<Vec<PartitionImage>, FleetError> {
        let nodes = self.hosting_nodes();
        let mut images = Vec::new();
        for node in nodes {
            let (_, payload) = self.request(node, &ControlRequest::Copy, &[])?;
            images.extend(decode_images(&payload).map_err(|e| RunError::RunCluster {
                reason: format!("node {node} sent undecodable images: {e}"),
            })?);
        }
        Ok(images)
    }

    fn streams_backups(&self) -> bool {
        self.background_copies
    }

    fn salvage(&mut self) -> Option<Salvage> {
        self.salvage.take()
    }

    fn departed(&mut self) -> Vec<NodeId> {
        std::mem::take(&mut self.departed)
    }

    fn finish(&mut self) {
        *self.placement.lock() = Placement::default();
        let nodes: Vec<NodeId> = self.links.keys().copied().collect();
        for node in nodes {
            self.release(node);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn images_round_trip_and_garbage_is_an_error() {
        let images = vec![
            PartitionImage {
                partition: 3,
                tables: vec![TableImage {
                    table: 1,
                    keys: vec![7, 9],
                    data: vec![1.0, 2.0, 3.0, 4.0],
                    state: vec![],
                }],
                completed: vec![5, 5, 4],
            },
            PartitionImage {
                partition: 0,
                tables: vec![],
                completed: vec![],
            },
        ];
        let mut out = Vec::new();
        encode_images(&images, &mut out);
        assert_eq!(decode_images(&out).unwrap(), images);
        for cut in 0..out.len() {
            assert!(decode_images(&out[..cut]).is_err(), "truncated at {cut}");
        }
        let mut huge = Vec::new();
        put_u32(&mut huge, u32::MAX);
        assert!(decode_images(&huge).is_err());
    }

    #[test]
    fn partition_bytes_are_exported_by_path() {
        let registry = Registry::new();
        let bytes = PartitionBytes::new(&registry).unwrap();
        bytes.add(ImagePath::Direct, 10);
        bytes.add(ImagePath::Direct, 5);
        assert_eq!(bytes.get(ImagePath::Direct), 15);
        assert_eq!(bytes.get(ImagePath::Relayed), 0);
        let text = crate::metrics::render(&registry);
        assert!(
            text.contains(r#"ebbflow_runtime_partition_bytes_total{path="direct"} 15"#),
            "{text}"
        );
    }

    fn agent(hosted: &[(PartitionId, u64)]) -> Agent<crate::exact::ExactApp> {
        agent_of(
            crate::exact::ExactApp::new(crate::exact::ExactConfig::default()),
            hosted,
        )
    }

    fn agent_of<A: App>(app: A, hosted: &[(PartitionId, u64)]) -> Agent<A> {
        let job = JobConfig {
            partitions: 4,
            workers: 2,
            ..JobConfig::default()
        };
        let state = Arc::new(ServerState::new(
            hosted,
            job.partitions,
            &app.tables(),
            job.workers as u32,
            job.optimizer,
            job.staleness == 0,
        ));
        let client = ClientConfig {
            secret: b"s".to_vec(),
            node: 0,
            max_frame_bytes: crate::frame::DEFAULT_MAX_FRAME_BYTES,
            timeout: Duration::from_secs(1),
            tls: None,
        };
        let (shutdown, _) = std::sync::mpsc::channel();
        Agent::new(
            app,
            state,
            job,
            client,
            RuntimeMetrics::unregistered(),
            shutdown,
        )
    }

    /// The exact app with an unreadable shard 1.
    struct BrokenShard(crate::exact::ExactApp);

    impl App for BrokenShard {
        type Worker = <crate::exact::ExactApp as App>::Worker;
        fn tables(&self) -> Vec<TableSpec> {
            self.0.tables()
        }
        fn worker(&self, shard: usize, num_shards: usize) -> Self::Worker {
            assert_ne!(shard, 1, "shard 1 is unreadable");
            self.0.worker(shard, num_shards)
        }
        fn evaluate(&self, tables: &dyn crate::app::TableReader) -> crate::app::EvalReport {
            self.0.evaluate(tables)
        }
    }

    #[test]
    fn preloading_finishes_even_when_a_shard_cannot_be_loaded() {
        let app = BrokenShard(crate::exact::ExactApp::new(
            crate::exact::ExactConfig::default(),
        ));
        let node = agent_of(app, &[]);
        let (answer, _) = node.control(
            ControlRequest::Preload {
                workers: vec![0, 1],
            },
            &[],
        );
        assert!(matches!(answer, ControlResponse::Done), "{answer:?}");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match node.control(ControlRequest::Preloaded, &[]).0 {
                ControlResponse::Preloading { loading: 0, .. } => break,
                ControlResponse::Preloading { .. } => {
                    assert!(Instant::now() < deadline, "preloading never finished");
                    std::thread::yield_now();
                }
                other => panic!("preloaded answered {other:?}"),
            }
        }
        let held: Vec<u32> = node.preloaded.lock().keys().copied().collect();
        assert_eq!(
            held,
            vec![0],
            "shard 0 is preloaded, shard 1 loads at start"
        );
    }

    #[test]
    fn a_handed_over_partition_is_kept_until_taken_back_or_abandoned() {
        let old = agent(&[(1, 3)]);
        let (answer, payload) = old.control(ControlRequest::HandOver { partition: 1 }, &[]);
        assert!(matches!(answer, ControlResponse::Images { count: 1 }));
        let handed = decode_images(&payload).unwrap();
        assert!(old.state.visible_clocks().is_empty(), "it stopped serving");
        // The fetch failed: the coordinator takes the same image back.
        let take = ControlRequest::Take {
            partitions: vec![1],
        };
        let (answer, payload) = old.control(take.clone(), &[]);
        assert!(matches!(answer, ControlResponse::Images { count: 1 }));
        assert_eq!(decode_images(&payload).unwrap(), handed);
        let (answer, _) = old.control(take.clone(), &[]);
        assert!(
            matches!(answer, ControlResponse::Failed { .. }),
            "taken once"
        );
        // A rollback drops what was handed over.
        let old = agent(&[(2, 1)]);
        old.control(ControlRequest::HandOver { partition: 2 }, &[]);
        old.control(ControlRequest::Abandon, &[]);
        let (answer, _) = old.control(
            ControlRequest::Take {
                partitions: vec![2],
            },
            &[],
        );
        assert!(matches!(answer, ControlResponse::Failed { .. }));
    }

    fn image(partition: PartitionId) -> PartitionImage {
        PartitionImage {
            partition,
            tables: Vec::new(),
            completed: Vec::new(),
        }
    }

    fn report(first_clock: u64, clocks: usize) -> WorkerReport {
        WorkerReport {
            first_clock,
            stats: vec![Default::default(); clocks],
            clock_end: vec![0.0; clocks],
            ..WorkerReport::default()
        }
    }

    #[test]
    fn a_background_copy_counts_once_every_node_sent_every_partition_and_worker() {
        let metrics = RuntimeMetrics::unregistered();
        let mut sets = CopySets::default();
        // 2 nodes, 3 partitions, 2 workers; segment from clock 10. A node's part: its
        // partitions' images and, if it runs one, its worker's report of clocks 10..clock.
        let mut add = |node: NodeId, clock: u64, partitions: &[u32], worker: Option<u32>| {
            let reports = worker
                .map(|w| (w, report(10, (clock - 10) as usize)))
                .into_iter()
                .collect();
            let images = partitions.iter().map(|&p| (image(p), None)).collect();
            sets.add(node, clock, images, reports, (2, 3, 2), &metrics);
            sets.latest.as_ref().map(|latest| latest.clock)
        };
        assert_eq!(
            add(1, 15, &[0, 2], Some(0)),
            None,
            "node 2's part is missing"
        );
        assert_eq!(add(2, 15, &[1], Some(1)), Some(15));
        // A later copy missing a partition (armed too late somewhere) is not kept.
        add(1, 20, &[0], Some(0));
        assert_eq!(add(2, 20, &[1], Some(1)), Some(15));
        // Nor one missing a worker's report.
        add(1, 25, &[0, 2], None);
        assert_eq!(add(2, 25, &[1], Some(1)), Some(15));
        add(2, 30, &[1], Some(1));
        assert_eq!(add(1, 30, &[0, 2], Some(0)), Some(30));
        let latest = sets.latest.as_ref().expect("complete");
        let partitions: Vec<u32> = latest.images.iter().map(|i| i.partition).collect();
        assert_eq!(partitions, vec![0, 1, 2]);
        let workers: Vec<u32> = latest.reports.iter().map(|(w, _)| *w).collect();
        assert_eq!(workers, vec![0, 1]);
        assert_eq!(metrics.consistent_clock.get(), 30);
        assert!(sets.parts.is_empty(), "older parts are dropped");
    }

    fn rows(partition: PartitionId, clock: u64, rows: &[(u64, f32)]) -> PartitionImage {
        PartitionImage {
            partition,
            tables: vec![TableImage {
                table: 0,
                keys: rows.iter().map(|(k, _)| *k).collect(),
                data: rows.iter().map(|(_, v)| *v).collect(),
                state: Vec::new(),
            }],
            completed: vec![clock],
        }
    }

    #[test]
    fn background_deltas_apply_to_the_held_copy_then_to_the_latest() {
        let metrics = RuntimeMetrics::unregistered();
        let held = vec![rows(0, 10, &[(0, 1.0), (2, 2.0)]), rows(1, 10, &[(1, 3.0)])];
        let mut sets = CopySets::over(Some((10, Arc::new(held))));
        assert_eq!(sets.base(), Some(10));
        // A node whose copy at 12 arrived is asked for the next since 12: that set completes
        // (and is held) before this one applies.
        assert_eq!(sets.base_after(Some(12)), Some(12));
        // 1 node, 2 partitions, 1 worker. Partition 0 changed row 2 and gained row 4;
        // partition 1 comes whole.
        let mut add = |clock: u64, parts: Vec<(PartitionImage, Option<u64>)>| {
            sets.add(
                1,
                clock,
                parts,
                vec![(0, report(10, 5))],
                (1, 2, 1),
                &metrics,
            );
            sets.latest.as_ref().map(|l| (l.clock, l.images.clone()))
        };
        let (clock, images) = add(
            15,
            vec![
                (rows(0, 15, &[(2, 5.0), (4, 6.0)]), Some(10)),
                (rows(1, 15, &[(1, 7.0)]), None),
            ],
        )
        .expect("complete");
        assert_eq!(clock, 15);
        assert_eq!(images[0], rows(0, 15, &[(0, 1.0), (2, 5.0), (4, 6.0)]));
        assert_eq!(images[1], rows(1, 15, &[(1, 7.0)]));
        // The next delta applies to the copy at 15 (one since 10 would too: values are whole).
        let (_, images) = add(
            20,
            vec![
                (rows(0, 20, &[(0, 8.0)]), Some(15)),
                (rows(1, 20, &[]), Some(10)),
            ],
        )
        .unwrap();
        assert_eq!(images[0], rows(0, 20, &[(0, 8.0), (2, 5.0), (4, 6.0)]));
        assert_eq!(images[1], rows(1, 20, &[(1, 7.0)]));
        // A delta since a clock after the latest copy would miss rows: the set is not kept.
        let kept = add(
            25,
            vec![(rows(0, 25, &[]), Some(22)), (rows(1, 25, &[]), Some(20))],
        );
        assert_eq!(
            kept.map(|(clock, _)| clock),
            Some(20),
            "the set at 25 is dropped"
        );
        assert_eq!(sets.base(), Some(20));
        // After a dropped set the next copy is asked since what is held, not since 25.
        assert_eq!(sets.base_after(Some(25)), Some(20));
    }

    #[test]
    fn a_segment_left_behind_does_not_disarm_its_successors_copies() {
        let node = agent(&[(0, 1)]);
        node.state.arm_backups(15).unwrap();
        let pending = |state: &ServerState| {
            matches!(
                state.wait_backup_blocking(0, 15, Duration::ZERO),
                Err(StoreError::WaitClock { .. })
            )
        };
        // Segment 1 ends at 10 after segment 2 armed its copy at 15: the copy stays.
        let armed = Mutex::new(2);
        assert!(!disarm_after(&armed, 1, &node.state, 10));
        assert!(pending(&node.state));
        // Segment 2 itself ending at 10 drops it.
        assert!(disarm_after(&armed, 2, &node.state, 10));
        assert!(matches!(
            node.state.wait_backup_blocking(0, 15, Duration::ZERO),
            Err(StoreError::BackupDisarmed { .. })
        ));
    }

    #[test]
    fn a_copy_without_a_segment_is_refused() {
        let node = agent(&[(0, 1)]);
        let (answer, _) = node.control(
            ControlRequest::CopyAt {
                clock: 5,
                wait_ms: 10,
                base: None,
            },
            &[],
        );
        assert!(
            matches!(&answer, ControlResponse::Failed { category, .. } if category == "no_segment"),
            "{answer:?}"
        );
    }

    #[test]
    fn a_fetch_from_nowhere_fails_and_installs_nothing() {
        let unused = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let from = unused.local_addr().unwrap();
        drop(unused);
        let new = agent(&[]);
        let (answer, _) = new.control(
            ControlRequest::Fetch {
                partition: 1,
                epoch: 4,
                from,
            },
            &[],
        );
        assert!(
            matches!(&answer, ControlResponse::Failed { category, .. } if category == "fetch"),
            "{answer:?}"
        );
        assert!(new.state.visible_clocks().is_empty());
    }

    #[test]
    fn requests_are_json_with_stable_names() {
        let json = serde_json::to_string(&ControlRequest::Take {
            partitions: vec![1, 2],
        })
        .unwrap();
        assert_eq!(json, r#"{"take":{"partitions":[1,2]}}"#);
        let json = serde_json::to_string(&ControlRequest::CopyAt {
            clock: 15,
            wait_ms: 200,
            base: Some(10),
        })
        .unwrap();
        assert_eq!(json, r#"{"copy_at":{"clock":15,"wait_ms":200,"base":10}}"#);
        // A coordinator from before deltas asks without a base: whole images.
        assert_eq!(
            serde_json::from_str::<ControlRequest>(r#"{"copy_at":{"clock":15,"wait_ms":200}}"#)
                .unwrap(),
            ControlRequest::CopyAt {
                clock: 15,
                wait_ms: 200,
                base: None
            }
        );
        assert_eq!(
            serde_json::from_str::<ControlRequest>(r#""abandon""#).unwrap(),
            ControlRequest::Abandon
        );
    }

    /// A fleet of `workers` logical workers and no node yet.
    fn fleet_of(workers: u32) -> ProcessFleet {
        let directory = Arc::new(Mutex::new(BTreeMap::new()));
        ProcessFleet::new(
            directory,
            b"s",
            None,
            workers,
            Duration::from_secs(1),
            RuntimeMetrics::unregistered(),
        )
    }

    /// A node that cannot be reached when it is admitted is let go at once: its name leaves the
    /// directory (a reliable slot's replacement may join) and its heartbeats are not watched.
    #[test]
    fn a_node_that_cannot_be_admitted_is_let_go() {
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = closed.local_addr().unwrap();
        drop(closed);
        let heartbeats = Arc::new(Heartbeats::unregistered(Duration::from_secs(60)));
        let mut fleet = fleet_of(2).with_heartbeats(heartbeats.clone());
        fleet.directory.lock().insert("r1".into(), addr);
        heartbeats.track("r1", std::time::Instant::now());
        assert!(matches!(fleet.admit(3, "r1"), Err(FleetError::Lost { .. })));
        assert!(!fleet.directory.lock().contains_key("r1"));
        assert_eq!(
            heartbeats.beat("r1", std::time::Instant::now()),
            crate::heartbeat::Beat::Untracked
        );
        // A replacement that already took the name keeps it when the old one is let go.
        let replacement: SocketAddr = "127.0.0.1:1".parse().unwrap();
        fleet.directory.lock().insert("r1".into(), replacement);
        fleet.let_go("r1", addr);
        assert_eq!(fleet.directory.lock().get("r1"), Some(&replacement));
    }

    /// A node SIGTERMed before the fleet admitted it holds nothing and gets no release, so it
    /// lets itself go; once admitted (a control request came) it waits for the coordinator.
    #[test]
    fn a_node_never_admitted_leaves_at_once_and_an_admitted_one_waits() {
        let fresh = agent(&[]);
        let (shutdown, released) = std::sync::mpsc::channel();
        *fresh.shutdown.lock() = Some(shutdown);
        assert!(fresh.leave_if_never_admitted());
        assert!(released.try_recv().is_ok());
        assert!(!fresh.leave_if_never_admitted(), "it lets itself go once");

        let admitted = agent(&[]);
        let (shutdown, released) = std::sync::mpsc::channel();
        *admitted.shutdown.lock() = Some(shutdown);
        let _ = admitted.control(ControlRequest::Clocks, &[]);
        assert!(!admitted.leave_if_never_admitted());
        assert!(released.try_recv().is_err());
    }

    #[test]
    fn workers_stay_put_and_spread_evenly() {
        let mut fleet = fleet_of(6);
        fleet.assign(&[0, 1], &BTreeSet::new());
        let count =
            |f: &ProcessFleet, n: NodeId| f.assignment.values().filter(|&&x| x == n).count();
        assert_eq!((count(&fleet, 0), count(&fleet, 1)), (3, 3));
        let before = fleet.assignment.clone();
        fleet.assign(&[0, 1, 2], &BTreeSet::new());
        assert_eq!(
            (count(&fleet, 0), count(&fleet, 1), count(&fleet, 2)),
            (2, 2, 2)
        );
        let kept = before
            .iter()
            .filter(|(w, n)| fleet.assignment.get(w) == Some(n))
            .count();
        assert_eq!(kept, 4, "only the moves needed to balance");
        fleet.assign(&[2], &BTreeSet::new());
        assert_eq!(count(&fleet, 2), 6);
    }

    #[test]
    fn a_worker_whose_node_leaves_goes_to_its_second_holder() {
        let mut fleet = fleet_of(4);
        fleet.assign(&[1, 2, 3, 4], &BTreeSet::new());
        // Every worker has a second holder: another worker node, one shard each.
        assert_eq!(fleet.standby().len(), 4);
        for (worker, holder) in fleet.standby() {
            assert_ne!(fleet.assignment()[worker], *holder);
        }
        // The holder is where the worker would go: the least loaded of the others.
        let on_two = fleet.assignment().iter().find(|(_, n)| **n == 2).unwrap().0;
        assert_eq!(fleet.standby()[on_two], 1);
        // Node 1 leaves: its worker goes where its shard is preloaded.
        let (&moved, _) = fleet
            .assignment()
            .iter()
            .find(|(_, node)| **node == 1)
            .unwrap();
        let holder = fleet.standby()[&moved];
        fleet.assign(&[2, 3, 4], &BTreeSet::new());
        assert_eq!(fleet.assignment()[&moved], holder);
        // The new layout gives it (and the worker whose holder was node 1) a new second holder.
        for (worker, holder) in fleet.standby() {
            assert_ne!(fleet.assignment()[worker], *holder);
            assert_ne!(*holder, 1);
        }
        assert_eq!(fleet.standby().len(), 4);
        // A single worker node has no second holder.
        fleet.assign(&[4], &BTreeSet::new());
        assert!(fleet.standby().is_empty());
    }

    #[test]
    fn only_workers_of_transient_nodes_get_a_second_holder() {
        let mut fleet = fleet_of(4);
        // Nodes 1 and 2 reliable, 3 and 4 transient: one worker each.
        fleet.assign(&[1, 2, 3, 4], &BTreeSet::from([1, 2]));
        let on = |f: &ProcessFleet, node: NodeId| -> Vec<u32> {
            f.assignment()
                .iter()
                .filter(|(_, n)| **n == node)
                .map(|(w, _)| *w)
                .collect()
        };
        let mut insured: Vec<u32> = fleet.standby().keys().copied().collect();
        insured.sort_unstable();
        let mut transient = [on(&fleet, 3), on(&fleet, 4)].concat();
        transient.sort_unstable();
        assert_eq!(
            insured, transient,
            "reliable nodes' workers are not preloaded"
        );
        for (worker, holder) in fleet.standby() {
            assert_ne!(fleet.assignment()[worker], *holder);
        }
        // Two reliable nodes alone: each holds only its own workers' shards.
        fleet.assign(&[1, 2], &BTreeSet::from([1, 2]));
        assert!(fleet.standby().is_empty());
    }
}
