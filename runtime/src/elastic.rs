//! Elastic training (AgileML, seed 003 §4.2): reliable and transient tiers, stages, partition
//! migration, BackupPS copies, evictions with notice and rollback on failure, with no lost and no
//! doubled updates.
//!
//! An elastic run is a sequence of **segments**. Within a segment membership is fixed: the server
//! nodes of the current stage host the partitions (each at its epoch) behind real TCP data-plane
//! servers, and every logical worker (one per data shard, fixed for the job) runs its clocks
//! against them. A segment ends at a clock boundary ([`ClockGate`]): when an event is due, when the
//! ActivePSs owe their BackupPSs a copy, or at the end of the job. At the boundary every partition
//! is consistent at the same clock and its [`PartitionImage`] (rows, optimizer state and the
//! per-worker clocks that make apply exactly-once) is taken; the controller then applies the
//! events and lays out the next segment:
//!
//! - **join** (bulk add): the nodes are switched in at the boundary; the stage may change.
//! - **notice** with time left: the leaving nodes' partitions move to surviving ActivePSs (partial
//!   eviction) or, when no transient node is left, to the BackupPSs on the reliable tier, which
//!   then serve as ParamServs (end-of-life flush). The new owner's epoch is one higher.
//! - **failure**, or a notice whose deadline passed before the boundary: the node's state is gone.
//!   If it hosted partitions (an ActivePS), every partition rolls back to the last consistent
//!   clock the BackupPSs hold — surviving ActivePSs drop their unflushed updates — and the
//!   workers redo from there. A worker-only node loses nothing: its shards move to survivors.
//!
//! Exactly-once holds because each push is identified by (worker, clock, partition) and the
//! per-worker clocks move with the partition: a migrated partition never re-applies a clock, and a
//! restored one re-applies exactly the clocks after its copy.
//!
//! Stages (seed 003 table 4.1): stage 1 serves from ParamServs on the reliable tier; stage 2 puts
//! ActivePSs on about half of the transient nodes (longest-lived first) with BackupPSs on the
//! reliable tier; stage 3 is stage 2 without workers on the reliable tier. The stage follows the
//! transient:reliable ratio ([`StageThresholds`]).
//!
//! The loop acts on a [`Fleet`]: [`LocalFleet`] (every node a set of threads of this process) or
//! `control::ProcessFleet` (node processes driven over the data plane). What it does not model
//! yet: copies stream between segments (not in the background while training, as the paper's
//! ActivePSs do).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use thiserror::Error;

use crate::app::{App, TableSpec, validate_tables};
use crate::bandwidth::{NodeBandwidth, WorkerPlacement};
use crate::client::{ClientConfig, PreOpened};
use crate::local::{RunError, RunReport, validate_config};
use crate::metrics::RuntimeMetrics;
use crate::node::{SegmentPlan, ServerHandle, WorkerPool, random_secret};
use crate::partition::{NodeId, PartitionEntry, PartitionId, PartitionMap};
use crate::snapshot::ParamSnapshot;
use crate::store::{PartitionImage, PartitionStore, ServerState, StoreError};
use crate::worker::{ClockGate, DivergenceStop, JobConfig, WorkerReport};

/// Transient:reliable ratios above which the next stage is used (seed 003: 1 and 15).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StageThresholds {
    /// Above this ratio: stage 2.
    pub stage2_above: f64,
    /// Above this ratio: stage 3.
    pub stage3_above: f64,
}

impl Default for StageThresholds {
    fn default() -> Self {
        Self {
            stage2_above: 1.0,
            stage3_above: 15.0,
        }
    }
}

impl StageThresholds {
    /// Thresholds that pick `stage` (1, 2 or 3) whenever any transient node is present, for
    /// measuring one stage against another at the same ratio; without transient nodes a run is
    /// always in stage 1.
    pub fn forced(stage: u8) -> Self {
        let (stage2_above, stage3_above) = match stage {
            0 | 1 => (f64::INFINITY, f64::INFINITY),
            2 => (f64::NEG_INFINITY, f64::INFINITY),
            _ => (f64::NEG_INFINITY, f64::NEG_INFINITY),
        };
        Self {
            stage2_above,
            stage3_above,
        }
    }
}

/// The stage for `transient` transient and `reliable` reliable nodes.
pub fn choose_stage(transient: usize, reliable: usize, thresholds: &StageThresholds) -> u8 {
    if transient == 0 {
        return 1;
    }
    let ratio = transient as f64 / reliable.max(1) as f64;
    if ratio > thresholds.stage3_above {
        3
    } else if ratio > thresholds.stage2_above {
        2
    } else {
        1
    }
}

/// A membership event of an elastic run.
#[derive(Debug, Clone, PartialEq)]
pub enum ElasticEvent {
    /// Transient nodes join (a bulk add).
    Join {
        /// Node names (unique within the job).
        names: Vec<String>,
    },
    /// Nodes will be taken away `lead` after the notice arrives (a reliable node only while
    /// another reliable node stays).
    Notice {
        /// Node names.
        names: Vec<String>,
        /// Time between the notice and the deadline; zero means the notice came too late.
        lead: Duration,
    },
    /// Nodes are gone without notice.
    Fail {
        /// Node names.
        names: Vec<String>,
    },
    /// Reliable nodes join while training: replacements of reliable nodes that failed or left
    /// (a crashed on-demand pod recreated under its name). They are in the next layout.
    JoinReliable {
        /// Node names.
        names: Vec<String>,
    },
    /// Stop training at the next clock boundary and report what was done (Ctrl-C, a deadline).
    Stop,
}

impl ElasticEvent {
    fn names(&self) -> &[String] {
        match self {
            ElasticEvent::Join { names }
            | ElasticEvent::JoinReliable { names }
            | ElasticEvent::Notice { names, .. }
            | ElasticEvent::Fail { names } => names,
            ElasticEvent::Stop => &[],
        }
    }
}

/// An event due at a clock boundary (applied after clock `at_clock - 1` completed).
#[derive(Debug, Clone, PartialEq)]
pub struct ScheduledEvent {
    /// The boundary: the event applies once `at_clock` clocks are done.
    pub at_clock: u64,
    /// What happens.
    pub event: ElasticEvent,
}

/// Settings of an elastic run.
#[derive(Debug, Clone)]
pub struct ElasticConfig {
    /// The job; `workers` is the number of logical workers (data shards), fixed for the job.
    pub job: JobConfig,
    /// Stage thresholds.
    pub thresholds: StageThresholds,
    /// Clocks between ActivePS → BackupPS copies (the most a failure can cost), and between
    /// checks whether joined nodes are ready.
    pub backup_every: u64,
    /// Time between ActivePS → BackupPS copies instead: converted to clocks at the time per
    /// clock measured in the last segment (`backup_every` until there is one).
    pub backup_interval: Option<Duration>,
    /// Cap on the background copy traffic, bytes per second over all nodes: copies are spaced
    /// further apart than the above when the last segment's copies, at its time per clock,
    /// would send more (each delta then coalesces the changes of more clocks).
    pub backup_bandwidth: Option<f64>,
    /// Resume from this consistent copy (a coordinator's checkpoint) instead of clock 0.
    pub start: Option<Arc<crate::checkpoint::Checkpoint>>,
    /// Writes the newest consistent copy to disk as the run goes.
    pub checkpoint: Option<Arc<crate::checkpoint::CheckpointWriter>>,
    /// Reliable (on-demand) nodes at the start. Any but the last may fail or leave; a
    /// replacement joins under the same name ([`ElasticEvent::JoinReliable`]).
    pub reliable: Vec<String>,
    /// Transient (spot) nodes present at the start.
    pub transient: Vec<String>,
}

/// Errors of an elastic run.
#[derive(Debug, Error)]
pub enum ElasticError {
    /// The job or its tables are invalid, or a segment failed.
    #[error(transparent)]
    Run(#[from] RunError),
    /// The settings are invalid.
    #[error("invalid elastic run: {0}")]
    Validate(String),
    /// A partition image did not fit (a bug: images come from this run's own servers).
    #[error("restoring partitions failed: {0}")]
    Restore(#[from] StoreError),
    /// A segment ended with partitions at different clocks.
    #[error(
        "segment ended inconsistently: partition {partition} at clock {clock}, expected {expected}"
    )]
    CheckBoundary {
        /// The partition.
        partition: PartitionId,
        /// Its visible clock.
        clock: u64,
        /// The segment's end.
        expected: u64,
    },
}

impl ElasticError {
    /// The divergence that ended the run, if that is why it failed.
    pub fn divergence(&self) -> Option<&crate::divergence::Divergence> {
        match self {
            ElasticError::Run(RunError::Diverged(divergence)) => Some(divergence),
            _ => None,
        }
    }

    /// Static label for metrics.
    pub fn category(&self) -> &'static str {
        match self {
            ElasticError::Run(e) => e.category(),
            ElasticError::Validate(_) => "validate",
            ElasticError::Restore(e) => e.category(),
            ElasticError::CheckBoundary { .. } => "check_boundary",
        }
    }
}

/// A member node.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Member {
    id: NodeId,
    name: String,
    reliable: bool,
    /// In the layout. A transient node that joins is prepared first ([`Fleet::prepare`]:
    /// its data shards load in the background while the others train) and switched in at the
    /// first boundary after the fleet reports it ready.
    ready: bool,
}

/// Where one segment runs: which nodes serve, which hold backups, which run workers, and the
/// owner and epoch of every partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// AgileML stage.
    pub stage: u8,
    /// Nodes serving partitions (ParamServs in stage 1, ActivePSs otherwise).
    pub servers: Vec<NodeId>,
    /// Reliable nodes holding BackupPS copies (stages 2 and 3).
    pub backups: Vec<NodeId>,
    /// Nodes running worker threads.
    pub worker_nodes: Vec<NodeId>,
    /// Owner and epoch per partition.
    pub partitions: Vec<PartitionEntry>,
}

/// Lays out a segment. `members` are (id, reliable) in join order (longest-lived first);
/// `previous` is the last layout's partition table. A partition keeps its owner while that node
/// still serves; otherwise it goes to the serving node with the fewest partitions and its epoch
/// grows by one.
pub fn plan_layout(
    members: &[(NodeId, bool)],
    num_partitions: u32,
    previous: Option<&[PartitionEntry]>,
    thresholds: &StageThresholds,
) -> Result<Layout, String> {
    let reliable: Vec<NodeId> = members.iter().filter(|m| m.1).map(|m| m.0).collect();
    let transient: Vec<NodeId> = members.iter().filter(|m| !m.1).map(|m| m.0).collect();
    if reliable.is_empty() {
        return Err("an elastic run needs at least one reliable node".into());
    }
    if num_partitions == 0 {
        return Err("an elastic run needs at least one partition".into());
    }
    let stage = choose_stage(transient.len(), reliable.len(), thresholds);
    let (servers, backups) = if stage == 1 {
        (reliable.clone(), Vec::new())
    } else {
        // About half of the transient nodes, longest-lived first (members are in join order).
        let active = transient.len().div_ceil(2);
        (transient[..active].to_vec(), reliable.clone())
    };
    let worker_nodes = if stage == 3 {
        transient.clone()
    } else {
        members.iter().map(|m| m.0).collect()
    };
    let serving: BTreeSet<NodeId> = servers.iter().copied().collect();
    let mut load: BTreeMap<NodeId, usize> = servers.iter().map(|&s| (s, 0)).collect();
    let mut partitions: Vec<Option<PartitionEntry>> = vec![None; num_partitions as usize];
    if let Some(previous) = previous {
        for (p, entry) in previous.iter().enumerate().take(num_partitions as usize) {
            if serving.contains(&entry.owner) {
                partitions[p] = Some(*entry);
                *load.entry(entry.owner).or_default() += 1;
            }
        }
    }
    for (p, slot) in partitions.iter_mut().enumerate() {
        if slot.is_some() {
            continue;
        }
        let (&owner, _) = load
            .iter()
            .min_by_key(|&(&node, &count)| (count, node))
            .expect("at least one server");
        *load.entry(owner).or_default() += 1;
        let epoch = previous
            .and_then(|prev| prev.get(p))
            .map_or(1, |entry| entry.epoch + 1);
        *slot = Some(PartitionEntry { owner, epoch });
    }
    Ok(Layout {
        stage,
        servers,
        backups,
        worker_nodes,
        partitions: partitions.into_iter().flatten().collect(),
    })
}

/// What a segment's workers started from: the workers it started, by where their data shard
/// came from, and the connections to new servers they took ready-made.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ShardLoads {
    /// Loaded when the worker started.
    pub built: u32,
    /// Preloaded in the background by the node as the shard's second holder, or by a joined
    /// node while it was prepared.
    pub preloaded: u32,
    /// Connections to a joined node's server opened while it was prepared and taken at the
    /// switch (the others were opened at the switch).
    #[serde(default)]
    pub connections_pre_opened: u32,
}

/// One segment of an elastic run, for the report.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct SegmentRecord {
    /// First clock run.
    pub first_clock: u64,
    /// One past the last clock run.
    pub end_clock: u64,
    /// Stage.
    pub stage: u8,
    /// Reliable nodes.
    pub reliable_nodes: usize,
    /// Transient nodes.
    pub transient_nodes: usize,
    /// Nodes serving partitions.
    pub servers: usize,
    /// Nodes running workers.
    pub worker_nodes: usize,
    /// Partitions whose owner changed when this segment was laid out.
    pub partitions_moved: u32,
    /// Wall seconds of the segment, from laying out its partitions to its boundary image.
    pub seconds: f64,
    /// Of which: restoring partitions into the segment's servers and starting them.
    pub setup_seconds: f64,
    /// Of which: taking the boundary images and stopping the servers.
    pub teardown_seconds: f64,
    /// Workers started for this segment, by data-shard source (node processes only: in process
    /// every worker keeps its shard for the whole run).
    pub shards: ShardLoads,
}

/// What an elastic run did.
#[derive(Debug, Clone)]
pub struct ElasticReport {
    /// Training report over the final clocks (redone clocks count once, their last run).
    pub run: RunReport,
    /// Segments in order.
    pub segments: Vec<SegmentRecord>,
    /// Partitions placed after the first layout: migrations, flushes and restores from the
    /// BackupPS copy, each placement counted once.
    pub partitions_migrated: u64,
    /// Rollbacks to the BackupPS copy.
    pub rollbacks: u64,
    /// Clocks redone after rollbacks: those between the copy a rollback restores and the last
    /// boundary the run had reached. A failed segment's own clocks past its last complete copy
    /// never completed, so they are not counted.
    pub clocks_redone: u64,
    /// Events applied, by kind (`join`, `notice`, `late_notice`, `fail`).
    pub events: BTreeMap<&'static str, u64>,
    /// Events (or names within them) refused, with the reason (unknown or reliable node,
    /// duplicate join): the run goes on.
    pub rejected: Vec<String>,
    /// Per boundary that applied a graceful notice in time: seconds from the first such
    /// notice's arrival until every affected partition was safe on its new owner (refused and
    /// late notices are not counted).
    pub notice_to_safe_seconds: Vec<f64>,
    /// Clocks completed when a stop event ended the run early (`None`: it ran every clock).
    pub stopped_at: Option<u64>,
    /// The final parameters.
    pub snapshot: ParamSnapshot,
}

/// The controller's state between segments.
struct Controller<'a> {
    members: Vec<Member>,
    next_id: NodeId,
    /// Left or failed nodes (a later notice for them is a harmless duplicate).
    departed: BTreeSet<String>,
    /// Notices for reliable nodes refused because no other reliable node stayed, with their
    /// deadlines: tried again at every boundary, so the node leaves once another one joined
    /// (a replacement) instead of dying at its deadline.
    deferred: BTreeMap<String, Instant>,
    /// Authoritative partition images at `clock` (shared with `backup` after a copy, so taking
    /// the copy costs no second clone).
    images: Arc<Vec<PartitionImage>>,
    clock: u64,
    /// The BackupPS copy and its clock.
    backup: Arc<Vec<PartitionImage>>,
    backup_clock: u64,
    layout: Option<Layout>,
    /// Per partition: the highest epoch a layout placed it at, adopted or not (a segment that
    /// failed leaves `layout` as it was).
    epochs: Vec<u64>,
    report: ElasticReport,
    metrics: &'a RuntimeMetrics,
    /// A stop event was applied.
    stopped: bool,
    /// Wall time per clock of the last segment that ran any (its setup and teardown left out).
    seconds_per_clock: Option<f64>,
    /// Bytes of one background copy (all partitions' images) in the last segment that took
    /// any.
    bytes_per_copy: Option<f64>,
}

/// Clocks between BackupPS copies: `backup_every`, or `backup_interval` at the measured time
/// per clock (at least 1 clock; a clock of 0 s counts as 1 µs); then, under a
/// `backup_bandwidth` cap, at least as many clocks as a copy of `bytes_per_copy` takes at that
/// rate.
fn copy_every(
    config: &ElasticConfig,
    seconds_per_clock: Option<f64>,
    bytes_per_copy: Option<f64>,
) -> u64 {
    // Saturates: an interval of years at microsecond clocks is "never" in u64 clocks.
    let clocks_for =
        |seconds: f64, per_clock: f64| ((seconds / per_clock.max(1e-6)).ceil() as u64).max(1);
    let every = match (config.backup_interval, seconds_per_clock) {
        (Some(interval), Some(per_clock)) => clocks_for(interval.as_secs_f64(), per_clock),
        _ => config.backup_every,
    };
    match (config.backup_bandwidth, seconds_per_clock, bytes_per_copy) {
        (Some(rate), Some(per_clock), Some(bytes)) if rate > 0.0 => {
            every.max(clocks_for(bytes / rate, per_clock))
        }
        _ => every,
    }
}

/// A checkpoint to resume from must fit the job: one image per partition, in order, and a clock
/// within the job's.
fn check_start(
    start: &crate::checkpoint::Checkpoint,
    partitions: u32,
    clocks: u64,
) -> Result<(), ElasticError> {
    let in_order = start
        .images
        .iter()
        .enumerate()
        .all(|(i, image)| image.partition == i as u32);
    if start.images.len() != partitions as usize || !in_order {
        return Err(ElasticError::Validate(format!(
            "the checkpoint of job {} holds {} partition images, the job has {partitions}",
            start.job,
            start.images.len()
        )));
    }
    if start.clock > clocks {
        return Err(ElasticError::Validate(format!(
            "the checkpoint of job {} is at clock {}, past the job's {clocks} clocks",
            start.job, start.clock
        )));
    }
    Ok(())
}

/// Under a copy bandwidth cap, segments end after this many copies to measure their size.
const COPIES_PER_MEASUREMENT: u64 = 8;

/// Bytes and images of background copies counted so far, both kinds.
fn copy_totals(metrics: &RuntimeMetrics) -> (u64, u64) {
    ["whole", "delta"]
        .iter()
        .fold((0, 0), |(bytes, images), kind| {
            (
                bytes + metrics.backup_copy_bytes.with_label_values(&[kind]).get(),
                images + metrics.backup_copy_images.with_label_values(&[kind]).get(),
            )
        })
}

fn empty_image(
    partition: PartitionId,
    num_partitions: u32,
    specs: &[TableSpec],
    workers: u32,
) -> PartitionImage {
    PartitionStore::new(
        partition,
        num_partitions,
        1,
        specs,
        workers,
        crate::optimizer::Optimizer::Add,
        false,
    )
    .image()
}

fn empty_images(num_partitions: u32, specs: &[TableSpec], workers: u32) -> Vec<PartitionImage> {
    (0..num_partitions)
        .map(|p| empty_image(p, num_partitions, specs, workers))
        .collect()
}

impl<'a> Controller<'a> {
    /// The members in the layout.
    fn member_list(&self) -> Vec<(NodeId, bool)> {
        self.members
            .iter()
            .filter(|m| m.ready)
            .map(|m| (m.id, m.reliable))
            .collect()
    }

    /// (reliable, transient) members in the layout.
    fn tiers(&self) -> (usize, usize) {
        let ready = self.members.iter().filter(|m| m.ready);
        let reliable = ready.clone().filter(|m| m.reliable).count();
        (reliable, ready.count() - reliable)
    }

    fn add_member(&mut self, name: &str, reliable: bool) -> Result<(), String> {
        if self.members.iter().any(|m| m.name == name) {
            return Err(format!("node {name} already joined"));
        }
        if self.departed.contains(name) {
            // A reliable node is a fixed slot of the job (an on-demand pod recreated under its
            // name); the member that held the name is gone, with its id, so its replacement is
            // a new member. A transient name is used once.
            if !reliable {
                return Err(format!(
                    "node {name} already left the job; join under a new name"
                ));
            }
            self.departed.remove(name);
        }
        // The reliable tier is needed for every layout; the initial members start together.
        let ready = reliable || self.layout.is_none();
        if ready && !reliable {
            self.metrics.transient_nodes_added.inc();
        }
        self.members.push(Member {
            id: self.next_id,
            name: name.to_owned(),
            reliable,
            ready,
        });
        self.next_id += 1;
        Ok(())
    }

    /// Removes node `name`: `None` if it already left, else whether it served partitions in the
    /// last segment. A reliable node is removed only while another reliable member stays: every
    /// layout needs one (the BackupPS copy is the coordinator's, so nothing is lost with it).
    fn remove_member(&mut self, name: &str) -> Result<Option<(NodeId, bool)>, String> {
        if self.departed.contains(name) {
            return Ok(None);
        }
        let Some(position) = self.members.iter().position(|m| m.name == name) else {
            return Err(format!("unknown node {name}"));
        };
        if self.members[position].reliable
            && !self
                .members
                .iter()
                .any(|m| m.reliable && m.ready && m.name != name)
        {
            return Err(format!(
                "node {name} is the last reliable node; every layout needs one, so it stays \
                 a member until the run ends or it is replaced"
            ));
        }
        let member = self.members.remove(position);
        self.departed.insert(member.name);
        let served = self
            .layout
            .as_ref()
            .is_some_and(|l| l.servers.contains(&member.id));
        Ok(Some((member.id, served)))
    }

    fn count_event(&mut self, kind: &'static str) {
        *self.report.events.entry(kind).or_default() += 1;
        self.metrics.elastic_events.with_label_values(&[kind]).inc();
    }

    fn reject(&mut self, reason: String) {
        tracing::warn!(%reason, "elastic event refused");
        self.report.rejected.push(reason);
        self.metrics
            .elastic_events
            .with_label_values(&["rejected"])
            .inc();
    }

    /// Applies one event at the current boundary; returns the serving nodes whose state is lost
    /// (a rollback is due if any).
    fn apply(&mut self, event: &ElasticEvent, received: Instant) -> Vec<NodeId> {
        let mut lost = Vec::new();
        match event {
            ElasticEvent::Join { names } | ElasticEvent::JoinReliable { names } => {
                let reliable = matches!(event, ElasticEvent::JoinReliable { .. });
                for name in names {
                    match self.add_member(name, reliable) {
                        Ok(()) => self.count_event("join"),
                        Err(reason) => self.reject(reason),
                    }
                }
            }
            ElasticEvent::Notice { names, lead } => {
                // The migration happens now, at the boundary; a deadline already past means the
                // nodes are gone before their state could move.
                let deadline = received + *lead;
                for name in names {
                    match self.leave(name, deadline) {
                        Ok(Some(id)) => lost.push(id),
                        Ok(None) => {}
                        Err(reason) => {
                            let reliable =
                                self.members.iter().any(|m| m.reliable && &m.name == name);
                            if reliable {
                                self.deferred.insert(name.clone(), deadline);
                            }
                            self.reject(reason);
                        }
                    }
                }
            }
            ElasticEvent::Stop => self.stopped = true,
            ElasticEvent::Fail { names } => {
                for name in names {
                    match self.remove_member(name) {
                        Ok(Some((id, served))) => {
                            self.count_event("fail");
                            if served {
                                lost.push(id);
                            }
                        }
                        Ok(None) => {}
                        Err(reason) => self.reject(reason),
                    }
                }
            }
        }
        lost
    }

    /// Node `name` leaves on a notice with `deadline`: the lost node if the deadline passed
    /// before its partitions could move, `None` otherwise (or if it already left).
    fn leave(&mut self, name: &str, deadline: Instant) -> Result<Option<NodeId>, String> {
        let late = deadline <= Instant::now();
        match self.remove_member(name)? {
            Some((id, served)) => {
                self.count_event(if late { "late_notice" } else { "notice" });
                Ok((late && served).then_some(id))
            }
            None => {
                tracing::info!(node = %name, "duplicate notice ignored");
                Ok(None)
            }
        }
    }

    /// Notices deferred because their reliable node was the last one, tried again (quietly:
    /// each was reported when refused); returns the lost nodes and whether any was applied.
    fn retry_deferred(&mut self) -> (Vec<NodeId>, bool) {
        let mut lost = Vec::new();
        let mut applied = false;
        for (name, deadline) in std::mem::take(&mut self.deferred) {
            if !self.members.iter().any(|m| m.name == name) {
                continue;
            }
            match self.leave(&name, deadline) {
                Ok(gone) => {
                    tracing::info!(node = %name, "a deferred notice applies: another reliable node joined");
                    applied = true;
                    lost.extend(gone);
                }
                Err(_) => {
                    self.deferred.insert(name, deadline);
                }
            }
        }
        (lost, applied)
    }

    /// Copies the ActivePSs' state to the BackupPSs (or, in stage 1, records the ParamServs'
    /// state as the consistent point: they are on the reliable tier).
    fn sync_backup(&mut self) {
        self.backup = self.images.clone();
        self.backup_clock = self.clock;
    }

    fn roll_back(&mut self) {
        let redone = self.clock - self.backup_clock;
        tracing::warn!(
            from = self.clock,
            to = self.backup_clock,
            "server state lost: rolling back to the BackupPS copy"
        );
        self.images = self.backup.clone();
        self.clock = self.backup_clock;
        self.report.rollbacks += 1;
        self.report.clocks_redone += redone;
        self.metrics.rollbacks.inc();
        self.metrics.clocks_redone.inc_by(redone);
        self.metrics.consistent_clock.set(self.clock as i64);
        // Every partition is restored from the backups: a new epoch even where the owner stays,
        // so a request of the abandoned timeline cannot reach it.
        if let Some(layout) = &mut self.layout {
            for entry in &mut layout.partitions {
                entry.epoch += 1;
            }
        }
    }
}

/// Events that arrive while training runs (a market replay, an operator, Ctrl-C). Each one ends
/// the running segment at its next clock boundary, where it is applied.
#[derive(Debug)]
pub struct LiveFeed {
    events: Mutex<std::sync::mpsc::Receiver<ElasticEvent>>,
}

impl LiveFeed {
    /// A feed and the sender that fills it.
    pub fn new() -> (std::sync::mpsc::Sender<ElasticEvent>, Self) {
        let (sender, receiver) = std::sync::mpsc::channel();
        (
            sender,
            Self {
                events: Mutex::new(receiver),
            },
        )
    }

    /// Waits up to `timeout` for one event; `Err(())` once the sender is gone.
    fn wait(&self, timeout: Duration) -> Result<Option<ElasticEvent>, ()> {
        match self.events.lock().recv_timeout(timeout) {
            Ok(event) => Ok(Some(event)),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => Ok(None),
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => Err(()),
        }
    }
}

/// Asks the running segment to end at its next clock boundary (an event arrived). The fleet
/// watches it with [`Interrupt::next`] while the segment runs and [`Interrupt::close`]s it when the
/// segment is over, which wakes the watcher at once (a polling watcher would hold the boundary up
/// by its polling period).
#[derive(Debug, Default)]
pub struct Interrupt {
    /// (requested, closed).
    state: parking_lot::Mutex<(bool, bool)>,
    changed: parking_lot::Condvar,
}

impl Interrupt {
    /// Requests the end of the segment.
    pub fn request(&self) {
        self.state.lock().0 = true;
        self.changed.notify_all();
    }

    /// Blocks until the end of the segment is requested (true) or the segment is over (false).
    pub fn next(&self) -> bool {
        let mut state = self.state.lock();
        while !state.0 && !state.1 {
            self.changed.wait(&mut state);
        }
        state.0 && !state.1
    }

    /// The segment is over: wakes [`Interrupt::next`].
    pub fn close(&self) {
        self.state.lock().1 = true;
        self.changed.notify_all();
    }

    /// Opens it for the next segment, with no request pending.
    fn reset(&self) {
        *self.state.lock() = (false, false);
    }
}

/// What one segment asks of the fleet.
#[derive(Debug, Clone)]
pub struct SegmentSpec {
    /// First clock.
    pub first: u64,
    /// One past the last clock, unless interrupted earlier.
    pub end: u64,
    /// Owner and epoch of every partition.
    pub map: PartitionMap,
    /// Nodes that run workers in this segment.
    pub worker_nodes: Vec<NodeId>,
    /// Every partition holds what it held at the end of the previous segment (none was
    /// restored from a copy): workers' cached rows stay valid.
    pub carried: bool,
    /// Clocks in `(first, end]` at which a fleet that [`Fleet::streams_backups`] copies every
    /// partition to the BackupPSs in the background while workers go on (ascending).
    pub backup_clocks: Vec<u64>,
    /// The BackupPS copy the controller holds as the segment starts (its clock and every
    /// partition's image): a fleet whose background copies are coalesced deltas applies the
    /// first of them to it.
    pub held_backup: Option<(u64, Arc<Vec<PartitionImage>>)>,
    /// Joined members not in this segment's layout (still being prepared): they serve no
    /// partition and run no worker, so a fleet that loses one mid-segment reports it
    /// ([`Fleet::departed`]) instead of failing the segment.
    pub bystanders: Vec<NodeId>,
    /// Reliable (on-demand) members. They get no eviction notice, so a fleet gives their
    /// workers no second holder: only the workers of transient nodes have their data shards
    /// preloaded elsewhere, and a node holding only reliable workers' shards holds one copy of
    /// its data, not two.
    pub reliable: Vec<NodeId>,
}

/// What a segment did: where it ended and, per logical worker, its report.
#[derive(Debug)]
pub struct SegmentOutcome {
    /// One past the last clock every worker ran.
    pub end: u64,
    /// (logical worker, report).
    pub reports: Vec<(u32, WorkerReport)>,
    /// The latest BackupPS copy taken in the background: its clock and every partition's
    /// image at it, in partition order.
    pub backup: Option<(u64, Arc<Vec<PartitionImage>>)>,
    /// Workers started for the segment, by data-shard source.
    pub shards: ShardLoads,
}

/// The latest complete background BackupPS copy of a segment that then failed, with every
/// logical worker's report of the segment's clocks below it: the run rolls back to it rather
/// than to the copy before the segment, and those clocks are not redone.
#[derive(Debug)]
pub struct Salvage {
    /// The copy's clock.
    pub clock: u64,
    /// Every partition's image at `clock`, in partition order (shared with the checkpoint
    /// writer).
    pub images: Arc<Vec<PartitionImage>>,
    /// (logical worker, report of the segment's clocks below `clock`), in worker order.
    pub reports: Vec<(u32, WorkerReport)>,
}

/// Errors of a fleet operation.
#[derive(Debug, Error)]
pub enum FleetError {
    /// Nodes stopped answering: their state is gone (the run rolls back).
    #[error("nodes {nodes:?} were lost: {reason}")]
    Lost {
        /// The nodes.
        nodes: Vec<NodeId>,
        /// What was seen.
        reason: String,
    },
    /// A segment failed for another reason.
    #[error(transparent)]
    Run(#[from] RunError),
    /// A partition image did not fit.
    #[error(transparent)]
    Restore(#[from] StoreError),
}

impl From<FleetError> for ElasticError {
    fn from(error: FleetError) -> Self {
        match error {
            FleetError::Run(e) => ElasticError::Run(e),
            FleetError::Restore(e) => ElasticError::Restore(e),
            lost @ FleetError::Lost { .. } => ElasticError::Run(RunError::RunCluster {
                reason: lost.to_string(),
            }),
        }
    }
}

/// Where the nodes of an elastic run live and how the controller acts on them: threads of this
/// process ([`LocalFleet`]) or node processes driven over the data plane
/// (`control::ProcessFleet`). The controller's loop is the same for both.
pub trait Fleet {
    /// Node `id` (named `name`) became a member.
    fn admit(&mut self, id: NodeId, name: &str) -> Result<(), FleetError>;
    /// Node `id` left; it hosts nothing any more.
    fn release(&mut self, id: NodeId);
    /// Hosts `partition` on `to` at `epoch`, taking its state from `from` (its current host) or,
    /// when there is none, from `fallback`.
    fn place(
        &mut self,
        partition: PartitionId,
        to: NodeId,
        epoch: u64,
        from: Option<NodeId>,
        fallback: &PartitionImage,
    ) -> Result<(), FleetError>;
    /// Nodes outside `owners` host no partition now.
    fn retire_idle(&mut self, owners: &BTreeSet<NodeId>);
    /// Every node drops its partitions (a rollback restores them from the BackupPS copy).
    fn abandon_all(&mut self);
    /// The reliable nodes that receive the BackupPS copies of the next segment (none in stage 1).
    fn set_backups(&mut self, _backups: &[NodeId]) {}
    /// Starts preparing joined node `id` in the background for the `prospective` layout (the
    /// one with every joined member in it) while the others train: loading the data shards of
    /// the workers it would run, or starting its server and the workers' connections to it;
    /// true if it is ready to be switched in now.
    fn prepare(&mut self, _id: NodeId, _prospective: &Layout) -> Result<bool, FleetError> {
        Ok(true)
    }
    /// Whether joined node `id` finished preparing.
    fn prepared(&mut self, _id: NodeId) -> Result<bool, FleetError> {
        Ok(true)
    }
    /// Whether the fleet copies partitions to the BackupPSs in the background during a segment
    /// ([`SegmentSpec::backup_clocks`]); if not, the controller ends segments at BackupPS copy
    /// points and gathers the images at the boundary.
    fn streams_backups(&self) -> bool {
        false
    }
    /// After [`Fleet::run_segment`] failed with [`FleetError::Lost`]: the latest complete
    /// background copy that segment took before it failed, if the fleet keeps one.
    fn salvage(&mut self) -> Option<Salvage> {
        None
    }
    /// Bystanders ([`SegmentSpec::bystanders`]) lost in the last segment without failing it;
    /// each is reported once. Their failure costs no rollback: they held nothing.
    fn departed(&mut self) -> Vec<NodeId> {
        Vec::new()
    }
    /// Runs one segment; `interrupt` ends it early at a clock boundary.
    fn run_segment(
        &mut self,
        spec: &SegmentSpec,
        interrupt: &Interrupt,
    ) -> Result<SegmentOutcome, FleetError>;
    /// (partition, visible clock) of every hosted partition.
    fn visible_clocks(&mut self) -> Result<Vec<(PartitionId, u64)>, FleetError>;
    /// Images of every hosted partition, in partition order.
    fn images(&mut self) -> Result<Vec<PartitionImage>, FleetError>;
    /// The run is over: stop every worker and server.
    fn finish(&mut self);
}

/// The fleet of an in-process run: every node's data-plane server is a real TCP server on
/// 127.0.0.1 in this process, and the job's logical workers are threads of one pool.
pub struct LocalFleet {
    runtime: tokio::runtime::Runtime,
    pool: Option<WorkerPool>,
    servers: BTreeMap<NodeId, ServerHandle>,
    secret: Vec<u8>,
    specs: Vec<TableSpec>,
    job: JobConfig,
    metrics: RuntimeMetrics,
    /// Per-node data-plane bandwidth in Mbit/s (0: unlimited).
    bandwidth_mbps: f64,
    /// Each node's bandwidth (when limited), shared by its server and its workers.
    bandwidths: BTreeMap<NodeId, Arc<NodeBandwidth>>,
    /// Which node each logical worker runs on, for the servers' accounting.
    placement: Arc<WorkerPlacement>,
    /// Where the BackupPS copies land.
    backups: Vec<NodeId>,
    /// Servers let go at a boundary, still closing their connections (awaited at the end).
    retiring: Vec<tokio::task::JoinHandle<()>>,
    /// Servers of joined nodes started ahead of the switch that gives them partitions.
    prepared: BTreeMap<NodeId, ServerHandle>,
    /// Per joined node: the thread opening the workers' connections to its prepared server.
    preparing: BTreeMap<NodeId, std::thread::JoinHandle<()>>,
    /// The workers' connections opened by those threads, taken at the switch.
    pre_opened: Arc<PreOpened>,
    /// Held by the thread warming connections: one node is prepared at a time, so the
    /// background work stays a small share of the cores the training uses.
    warming: Arc<Mutex<()>>,
    /// The largest partition hosted when the last joined node was prepared, in parameter bytes:
    /// what a connection's buffers are sized for.
    frame_hint: usize,
    client: ClientConfig,
}

impl LocalFleet {
    /// Starts the job's worker threads (idle until the first segment).
    pub fn start<A: App>(
        app: &A,
        job: &JobConfig,
        metrics: &RuntimeMetrics,
        run_start: Instant,
    ) -> Result<Self, ElasticError> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(|e| RunError::RunCluster {
                reason: format!("starting the tokio runtime failed: {e}"),
            })?;
        let specs = app.tables();
        let secret = random_secret().into_bytes();
        let client = ClientConfig {
            secret: secret.clone(),
            node: 0,
            max_frame_bytes: crate::frame::DEFAULT_MAX_FRAME_BYTES,
            timeout: job.wait_timeout,
            tls: crate::tls::JobTls::for_security(job.transport_security, &secret),
        };
        let pre_opened = Arc::new(PreOpened::counted(metrics));
        let pool = WorkerPool::start(
            app,
            &specs,
            &client,
            job,
            metrics,
            run_start,
            Some(pre_opened.clone()),
        )?;
        Ok(Self {
            runtime,
            pool: Some(pool),
            servers: BTreeMap::new(),
            secret,
            specs,
            job: job.clone(),
            metrics: metrics.clone(),
            bandwidth_mbps: 0.0,
            bandwidths: BTreeMap::new(),
            placement: Arc::new(WorkerPlacement::default()),
            backups: Vec::new(),
            retiring: Vec::new(),
            prepared: BTreeMap::new(),
            preparing: BTreeMap::new(),
            pre_opened,
            warming: Arc::new(Mutex::new(())),
            frame_hint: 0,
            client,
        })
    }

    /// Limits every node to `mbps` megabits per second each way (0: unlimited), as if each sat
    /// behind its own NIC: a worker's exchange with a server on another node is charged to
    /// both nodes (within a node to neither), and a BackupPS copy to the ActivePS that sends it
    /// and the reliable node that receives it.
    pub fn with_bandwidth_limit(mut self, mbps: f64) -> Self {
        self.bandwidth_mbps = mbps;
        self
    }

    /// Starts node `node`'s data-plane server, serving nothing yet.
    fn start_server(&mut self, node: NodeId) -> Result<ServerHandle, FleetError> {
        let strict = self.job.staleness == 0;
        let state = Arc::new(ServerState::new(
            &[],
            self.job.partitions,
            &self.specs,
            self.job.workers as u32,
            self.job.optimizer,
            strict,
        ));
        let config = crate::server::ServerConfig {
            wait_timeout: self.job.wait_timeout,
            bandwidth: self.bandwidth(node),
            placement: Some((node, self.placement.clone())),
            tls: self.client.tls.clone(),
            ..crate::server::ServerConfig::with_secret(self.secret.clone())
        };
        ServerHandle::start(
            self.runtime.handle(),
            ([127, 0, 0, 1], 0).into(),
            state,
            config,
            self.metrics.clone(),
        )
        .map_err(|e| {
            RunError::RunCluster {
                reason: format!("binding a node's data-plane server failed: {e}"),
            }
            .into()
        })
    }

    /// Waits for node `id`'s preparing thread, if it has one.
    fn join_preparing(&mut self, id: NodeId) {
        if let Some(thread) = self.preparing.remove(&id) {
            let _ = thread.join();
        }
    }

    fn bandwidth(&mut self, node: NodeId) -> Option<Arc<NodeBandwidth>> {
        if let Some(bandwidth) = self.bandwidths.get(&node) {
            return Some(bandwidth.clone());
        }
        let bandwidth = NodeBandwidth::from_mbps(self.bandwidth_mbps)?;
        self.bandwidths.insert(node, bandwidth.clone());
        Some(bandwidth)
    }
}

impl Fleet for LocalFleet {
    fn admit(&mut self, _id: NodeId, _name: &str) -> Result<(), FleetError> {
        Ok(())
    }

    fn release(&mut self, id: NodeId) {
        // At a boundary: the workers wait for the next segment, not for old connections to close.
        self.retiring.retain(|task| !task.is_finished());
        // A node that leaves before its switch: no connection to its server may outlive it (a
        // later server could be bound to the same port).
        self.join_preparing(id);
        let server = self
            .servers
            .remove(&id)
            .or_else(|| self.prepared.remove(&id));
        if let Some(server) = &server {
            self.pre_opened.forget(server.addr);
        }
        if let Some(task) = server.and_then(ServerHandle::stop_in_background) {
            self.retiring.push(task);
        }
    }

    fn prepare(&mut self, id: NodeId, prospective: &Layout) -> Result<bool, FleetError> {
        if !prospective.servers.contains(&id)
            || self.servers.contains_key(&id)
            || self.prepared.contains_key(&id)
        {
            return Ok(true);
        }
        // The server starts now, serving nothing; each worker's connection to it is opened and
        // both ends' buffers sized for the largest partition on a thread of its own while the
        // others train, so the switch only hands partitions over.
        // Rows are created as workers first push them, so the partitions' sizes are read now.
        self.frame_hint = self
            .servers
            .values()
            .map(|server| server.state.largest_partition_bytes())
            .fold(self.frame_hint, usize::max);
        let server = self.start_server(id)?;
        let addr = server.addr;
        self.prepared.insert(id, server);
        let (stash, client, workers, bytes, warming) = (
            self.pre_opened.clone(),
            self.client.clone(),
            self.job.workers as u32,
            self.frame_hint,
            self.warming.clone(),
        );
        let thread = std::thread::Builder::new()
            .name(format!("prepare-{id}"))
            .spawn(move || {
                let _one_at_a_time = warming.lock();
                for worker in 0..workers {
                    if let Err(error) = stash.open(worker, addr, &client, bytes) {
                        // The switch connects as it would have without preparation.
                        tracing::warn!(node = id, worker, %error, "pre-opening a connection failed");
                        return;
                    }
                }
            })
            .map_err(|e| RunError::RunCluster {
                reason: format!("starting the thread that prepares node {id} failed: {e}"),
            })?;
        self.preparing.insert(id, thread);
        Ok(false)
    }

    fn prepared(&mut self, id: NodeId) -> Result<bool, FleetError> {
        if self.preparing.get(&id).is_some_and(|t| !t.is_finished()) {
            return Ok(false);
        }
        self.join_preparing(id);
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
        let image = from
            .and_then(|node| self.servers.get(&node))
            .and_then(|server| server.state.take(partition))
            .unwrap_or_else(|| fallback.clone());
        let strict = self.job.staleness == 0;
        if !self.servers.contains_key(&to) {
            let server = match self.prepared.remove(&to) {
                Some(server) => server,
                None => self.start_server(to)?,
            };
            self.servers.insert(to, server);
        }
        let server = self.servers.get_mut(&to).expect("inserted above");
        server
            .state
            .install(image, epoch, &self.specs, self.job.optimizer, strict)?;
        Ok(())
    }

    fn retire_idle(&mut self, owners: &BTreeSet<NodeId>) {
        let idle: Vec<NodeId> = self
            .servers
            .keys()
            .copied()
            .filter(|node| !owners.contains(node))
            .collect();
        for node in idle {
            self.release(node);
        }
    }

    fn abandon_all(&mut self) {
        for (_, handle) in std::mem::take(&mut self.servers) {
            handle.state.abandon();
            handle.stop(self.runtime.handle());
        }
    }

    fn run_segment(
        &mut self,
        spec: &SegmentSpec,
        interrupt: &Interrupt,
    ) -> Result<SegmentOutcome, FleetError> {
        let mut nodes = BTreeMap::new();
        if !spec.worker_nodes.is_empty() {
            for worker in 0..self.job.workers as u32 {
                let node = spec.worker_nodes[worker as usize % spec.worker_nodes.len()];
                let bandwidth = self.bandwidth(node);
                self.placement.place(worker, node, bandwidth);
                nodes.insert(worker, node);
            }
        }
        let Some(pool) = &self.pool else {
            return Err(RunError::JoinWorker { worker: u32::MAX }.into());
        };
        // Workers of one simulated node share a process cache, as in a node process.
        pool.set_nodes(nodes);
        let plan = SegmentPlan {
            gate: Arc::new(ClockGate::range(spec.first, spec.end)),
            map: spec.map.clone(),
            addrs: self
                .servers
                .iter()
                .map(|(node, handle)| (*node, handle.addr))
                .collect(),
            carried: spec.carried,
            // The copier reads the servers, not the workers' progress.
            progress: None,
            // Every worker of the job shares this gate.
            divergence_stop: DivergenceStop::EndGate,
        };
        let gate = plan.gate.clone();
        // Armed before any worker starts, so no copy can be too late.
        let servers: Vec<(NodeId, Arc<ServerState>)> = self
            .servers
            .iter()
            .map(|(node, handle)| (*node, handle.state.clone()))
            .collect();
        for clock in &spec.backup_clocks {
            for (_, state) in &servers {
                state.arm_backups(*clock)?;
            }
        }
        let copier = BackupCopier {
            servers: &servers,
            bandwidths: &self.bandwidths,
            backups: &self.backups,
            wait: self.job.wait_timeout,
            base: spec.held_backup.as_ref().map(|(clock, _)| *clock),
            metrics: &self.metrics,
        };
        let taken_before = self.pre_opened.taken();
        let (outcome, backup) = std::thread::scope(|scope| {
            scope.spawn(|| {
                if interrupt.next() {
                    gate.end_soon_after_progress();
                }
            });
            let copies = scope.spawn(|| copier.run(&spec.backup_clocks));
            let outcome = pool.run_segment(&plan);
            interrupt.close();
            // Copies at clocks past the end will never be ready: disarming them ends the
            // copier's wait (and any later one) there. A segment that failed may have stopped
            // short of its end, so a copy before it may never be ready either; its copies are
            // of no use (the error drops them), so all go and the copier stops at once.
            let disarm_from = if outcome.is_ok() { gate.end() + 1 } else { 0 };
            for (_, state) in &servers {
                state.disarm_backups(disarm_from);
            }
            let backup = copies.join().unwrap_or(None);
            (outcome, backup)
        });
        for (_, state) in &servers {
            state.disarm_backups(0);
        }
        let reports = outcome?;
        Ok(SegmentOutcome {
            end: gate.end(),
            reports: pool.ids().into_iter().zip(reports).collect(),
            backup: backup.map(|(clock, images)| (clock, Arc::new(images))),
            shards: ShardLoads {
                connections_pre_opened: u32::try_from(self.pre_opened.taken() - taken_before)
                    .unwrap_or(u32::MAX),
                ..ShardLoads::default()
            },
        })
    }

    fn visible_clocks(&mut self) -> Result<Vec<(PartitionId, u64)>, FleetError> {
        Ok(self
            .servers
            .values()
            .flat_map(|server| server.state.visible_clocks())
            .collect())
    }

    fn images(&mut self) -> Result<Vec<PartitionImage>, FleetError> {
        let mut images = Vec::new();
        for (node, server) in &self.servers {
            let these = server.state.images();
            // The copies are sent one after another.
            for image in &these {
                let bytes = image.parameter_bytes();
                charge_backup_copy(
                    &self.bandwidths,
                    &self.backups,
                    *node,
                    image.partition,
                    bytes,
                );
            }
            images.extend(these);
        }
        Ok(images)
    }

    fn finish(&mut self) {
        if let Some(pool) = self.pool.take() {
            pool.stop();
        }
        for id in self.preparing.keys().copied().collect::<Vec<_>>() {
            self.join_preparing(id);
        }
        // Connections never taken close before their servers stop.
        for handle in self.prepared.values() {
            self.pre_opened.forget(handle.addr);
        }
        let prepared = std::mem::take(&mut self.prepared);
        for (_, handle) in std::mem::take(&mut self.servers)
            .into_iter()
            .chain(prepared)
        {
            handle.stop(self.runtime.handle());
        }
        for task in std::mem::take(&mut self.retiring) {
            let _ = self.runtime.block_on(task);
        }
    }

    fn set_backups(&mut self, backups: &[NodeId]) {
        self.backups = backups.to_vec();
    }

    fn streams_backups(&self) -> bool {
        true
    }
}

/// Takes a [`LocalFleet`]'s BackupPS copies in the background during a segment.
struct BackupCopier<'a> {
    servers: &'a [(NodeId, Arc<ServerState>)],
    bandwidths: &'a BTreeMap<NodeId, Arc<NodeBandwidth>>,
    backups: &'a [NodeId],
    wait: Duration,
    /// The clock of the copy the controller holds: the first copy's deltas are since it.
    base: Option<u64>,
    metrics: &'a RuntimeMetrics,
}

impl BackupCopier<'_> {
    /// Collects the copies at `clocks` in turn, each once every partition reached its clock;
    /// returns the latest complete one. Stops at the first clock that is disarmed (past the
    /// segment's end).
    fn run(&self, clocks: &[u64]) -> Option<(u64, Vec<PartitionImage>)> {
        let mut latest = None;
        let mut base = self.base;
        for &clock in clocks {
            let mut images = Vec::new();
            for (node, state) in self.servers {
                for partition in state.hosted() {
                    // However long the clocks take: the end of the segment disarms the wait.
                    let copy = loop {
                        match state.wait_backup_blocking(partition, clock, self.wait) {
                            Err(StoreError::WaitClock { .. }) => continue,
                            other => break other,
                        }
                    };
                    match copy {
                        Ok(copy) => {
                            // In process the whole image is at hand; the bandwidth model is
                            // charged the coalesced delta a node process would send.
                            let partition = copy.image().partition;
                            let (bytes, since) = copy.bytes_since(base);
                            self.metrics.count_backup_copy(bytes, since.is_some());
                            charge_backup_copy(
                                self.bandwidths,
                                self.backups,
                                *node,
                                partition,
                                bytes,
                            );
                            images.push(copy.into_image());
                        }
                        Err(error) => {
                            tracing::debug!(clock, partition, %error, "BackupPS copy dropped");
                            return latest;
                        }
                    }
                }
            }
            images.sort_by_key(|image| image.partition);
            latest = Some((clock, images));
            base = Some(clock);
        }
        latest
    }
}

/// Waits for `image`'s BackupPS copy to cross the NICs of `node` (its server) and of the
/// BackupPS node it goes to (none if they are one node, or bandwidth is unlimited).
fn charge_backup_copy(
    bandwidths: &BTreeMap<NodeId, Arc<NodeBandwidth>>,
    backups: &[NodeId],
    node: NodeId,
    partition: PartitionId,
    bytes: usize,
) {
    let Some(backup) = backups.get(partition as usize % backups.len().max(1)) else {
        return;
    };
    if *backup == node {
        return;
    }
    let now = Instant::now();
    let wait = [
        bandwidths
            .get(&node)
            .map(|b| b.outbound.reserve(now, bytes)),
        bandwidths
            .get(backup)
            .map(|b| b.inbound.reserve(now, bytes)),
    ]
    .into_iter()
    .flatten()
    .max()
    .unwrap_or_default();
    std::thread::sleep(wait);
}

/// Trains `app` elastically through `events` (see the module docs). Every worker and server is a
/// thread of this process talking real TCP on 127.0.0.1.
pub fn run_elastic<A: App>(
    app: &A,
    config: &ElasticConfig,
    events: &[ScheduledEvent],
    metrics: &RuntimeMetrics,
) -> Result<ElasticReport, ElasticError> {
    validate_elastic(app, config, events)?;
    let mut fleet = LocalFleet::start(app, &config.job, metrics, Instant::now())?;
    run_elastic_on(app, config, events, None, &mut fleet, metrics)
}

/// As [`run_elastic`] with events arriving on `feed` while training runs.
pub fn run_elastic_live<A: App>(
    app: &A,
    config: &ElasticConfig,
    feed: &LiveFeed,
    metrics: &RuntimeMetrics,
) -> Result<ElasticReport, ElasticError> {
    validate_elastic(app, config, &[])?;
    let mut fleet = LocalFleet::start(app, &config.job, metrics, Instant::now())?;
    run_elastic_on(app, config, &[], Some(feed), &mut fleet, metrics)
}

/// Checks an elastic run's settings and schedule.
pub fn validate_elastic<A: App>(
    app: &A,
    config: &ElasticConfig,
    events: &[ScheduledEvent],
) -> Result<(), ElasticError> {
    validate_config(&config.job)?;
    validate_tables(&app.tables()).map_err(RunError::from)?;
    let job = &config.job;
    if config.backup_every == 0 {
        return Err(ElasticError::Validate(
            "backup_every must be at least 1".into(),
        ));
    }
    if config.reliable.is_empty() {
        return Err(ElasticError::Validate(
            "an elastic run needs at least one reliable node".into(),
        ));
    }
    if let Some(event) = events
        .iter()
        .find(|e| e.at_clock == 0 || e.at_clock >= job.clocks)
    {
        return Err(ElasticError::Validate(format!(
            "event at clock {} is outside the job's boundaries 1..{}",
            event.at_clock, job.clocks
        )));
    }
    if let Some(event) = events
        .iter()
        .find(|e| e.event.names().is_empty() && e.event != ElasticEvent::Stop)
    {
        return Err(ElasticError::Validate(format!(
            "event at clock {} names no node",
            event.at_clock
        )));
    }
    Ok(())
}

/// The controller's loop over any [`Fleet`] (see the module docs): `events` are scheduled at
/// clock boundaries, `feed` delivers live ones.
pub fn run_elastic_on<A: App>(
    app: &A,
    config: &ElasticConfig,
    events: &[ScheduledEvent],
    feed: Option<&LiveFeed>,
    fleet: &mut dyn Fleet,
    metrics: &RuntimeMetrics,
) -> Result<ElasticReport, ElasticError> {
    validate_elastic(app, config, events)?;
    let arrivals = Arrivals::default();
    let outcome = std::thread::scope(|scope| {
        // The forwarder stops once the controller is done, also when it panics: the panic then
        // reaches the caller instead of leaving this scope waiting for the forwarder forever
        // (the run hung with its admin API up and training stopped).
        let _over = RunOver(&arrivals.over);
        if let Some(feed) = feed {
            // Forwards live events for the whole run: each one is queued for the next boundary
            // and ends the running segment at its next clock boundary.
            scope.spawn(|| {
                while !arrivals.over.load(std::sync::atomic::Ordering::Acquire) {
                    match feed.wait(Duration::from_millis(20)) {
                        Ok(Some(event)) => {
                            arrivals.queued.lock().push((event, Instant::now()));
                            arrivals.interrupt.request();
                        }
                        Ok(None) => {}
                        Err(()) => break,
                    }
                }
            });
        }
        run_controller(app, config, events, &arrivals, fleet, metrics)
    });
    fleet.finish();
    outcome
}

/// Sets the flag it holds when dropped: the controller's run is over, however it ended.
struct RunOver<'a>(&'a std::sync::atomic::AtomicBool);

impl Drop for RunOver<'_> {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::Release);
    }
}

/// Live events forwarded from a [`LiveFeed`] while a run lasts.
#[derive(Debug, Default)]
struct Arrivals {
    /// Arrived events not yet applied, with their arrival.
    queued: Mutex<Vec<(ElasticEvent, Instant)>>,
    /// Ends the running segment when an event arrives.
    interrupt: Interrupt,
    /// The run is over: the forwarder stops.
    over: std::sync::atomic::AtomicBool,
}

fn run_controller<A: App>(
    app: &A,
    config: &ElasticConfig,
    events: &[ScheduledEvent],
    arrivals: &Arrivals,
    fleet: &mut dyn Fleet,
    metrics: &RuntimeMetrics,
) -> Result<ElasticReport, ElasticError> {
    let specs = app.tables();
    let job = &config.job;
    let workers = job.workers as u32;
    // A resumed run starts from its checkpoint's copy as a rollback to it would.
    let (start_clock, images) = match &config.start {
        Some(start) => {
            check_start(start, job.partitions, job.clocks)?;
            tracing::info!(clock = start.clock, "resuming from a checkpoint");
            metrics.consistent_clock.set(start.clock as i64);
            (start.clock, Arc::new(start.images.clone()))
        }
        None => (0, Arc::new(empty_images(job.partitions, &specs, workers))),
    };
    let mut controller = Controller {
        members: Vec::new(),
        next_id: 0,
        departed: BTreeSet::new(),
        deferred: BTreeMap::new(),
        backup: images.clone(),
        images,
        clock: start_clock,
        backup_clock: start_clock,
        layout: None,
        epochs: vec![0; job.partitions as usize],
        stopped: false,
        seconds_per_clock: None,
        bytes_per_copy: None,
        report: ElasticReport {
            run: RunReport::default(),
            segments: Vec::new(),
            partitions_migrated: 0,
            rollbacks: 0,
            clocks_redone: 0,
            events: BTreeMap::new(),
            rejected: Vec::new(),
            notice_to_safe_seconds: Vec::new(),
            stopped_at: None,
            snapshot: ParamSnapshot::new(specs.clone()),
        },
        metrics,
    };
    for name in &config.reliable {
        controller
            .add_member(name, true)
            .map_err(ElasticError::Validate)?;
    }
    for name in &config.transient {
        controller
            .add_member(name, false)
            .map_err(ElasticError::Validate)?;
    }
    let mut done = vec![false; events.len()];
    // Per logical worker, per clock: the last run's stats and end time.
    let mut merged: Vec<WorkerReport> = (0..workers)
        .map(|_| WorkerReport {
            stats: vec![Default::default(); job.clocks as usize],
            clock_end: vec![0.0; job.clocks as usize],
            ..WorkerReport::default()
        })
        .collect();
    let mut pending_notice: Option<Instant> = None;
    // Where each partition is hosted (`None`: its state is the controller's copy, to be
    // installed), and which members the fleet knows.
    let mut location: Vec<Option<(NodeId, u64)>> = vec![None; job.partitions as usize];
    let mut admitted: BTreeMap<NodeId, String> = BTreeMap::new();
    // Joined members whose preparation started, by cohort, and whether it finished.
    let mut preparing = Preparations::default();
    // A node was lost mid-segment: the survivors' state is abandoned, so the run rolls back.
    let mut force_rollback = false;
    // Segments lost in a row, none succeeding in between: a failure that recurs every time
    // (a node whose answers never decode, say) ends the run instead of rolling back forever.
    let mut lost_in_a_row = 0u32;
    // Times nodes were lost before the last parameters could be read.
    let mut lost_reading_last = 0u32;

    let mut arrived: Vec<(ElasticEvent, Instant)> = Vec::new();
    loop {
        while controller.clock < job.clocks {
            if let Some(writer) = &config.checkpoint {
                writer.offer(controller.backup_clock, &controller.backup);
            }
            // Events due at this boundary: scheduled ones in schedule order, then live arrivals.
            let clock = controller.clock;
            let mut due: Vec<(ElasticEvent, Instant)> = Vec::new();
            for (index, scheduled) in events.iter().enumerate() {
                if !done[index] && scheduled.at_clock == clock {
                    done[index] = true;
                    due.push((scheduled.event.clone(), Instant::now()));
                }
            }
            due.append(&mut arrived);
            due.append(&mut arrivals.queued.lock());
            let mut lost = Vec::new();
            for (event, received) in &due {
                // Only a notice applied in time hands partitions over: a refused or late one
                // (a rollback) is no notice-to-safe time.
                let in_time = controller.report.events.get("notice").copied();
                lost.extend(controller.apply(event, *received));
                if controller.report.events.get("notice").copied() != in_time
                    && pending_notice.is_none()
                {
                    pending_notice = Some(*received);
                }
            }
            if !controller.deferred.is_empty() {
                let (gone, applied) = controller.retry_deferred();
                lost.extend(gone);
                if applied && pending_notice.is_none() {
                    pending_notice = Some(Instant::now());
                }
            }
            if controller.stopped {
                controller.report.stopped_at = Some(clock);
                // what was trained is kept: the last consistent copy goes to disk now,
                // whatever the checkpoint interval
                if let Some(writer) = &config.checkpoint {
                    writer.write_next_now();
                }
                break;
            }
            // New members are admitted now; one that cannot be reached never held anything, so it
            // simply fails without a rollback.
            let newcomers: Vec<(NodeId, String)> = controller
                .members
                .iter()
                .filter(|m| !admitted.contains_key(&m.id))
                .map(|m| (m.id, m.name.clone()))
                .collect();
            for (id, name) in newcomers {
                match fleet.admit(id, &name) {
                    Ok(()) => {
                        admitted.insert(id, name);
                    }
                    Err(FleetError::Lost { reason, .. }) => {
                        tracing::warn!(node = %name, %reason, "a joining node is unreachable");
                        match controller.remove_member(&name) {
                            Ok(Some(_)) => controller.count_event("fail"),
                            Ok(None) => {}
                            Err(_) => {
                                return Err(RunError::RunCluster {
                                    reason: format!(
                                        "reliable node {name} is unreachable: {reason}"
                                    ),
                                }
                                .into());
                            }
                        }
                    }
                    Err(other) => return Err(other.into()),
                }
            }
            prepare_joined(config, &mut controller, fleet, &admitted, &mut preparing)?;
            // Both are read: a node lost in a segment that served partitions is also in `lost`
            // once its failure is applied, and a `||` that skipped the flag left it set, so the
            // next boundary rolled back a second time for the same loss.
            let forced = std::mem::take(&mut force_rollback);
            if !lost.is_empty() || forced {
                roll_back_everywhere(&mut controller, fleet, &mut location, &mut pending_notice);
            }
            let outcome = run_boundary(
                config,
                &mut controller,
                fleet,
                &mut location,
                &mut admitted,
                &mut pending_notice,
                &mut merged,
                events,
                &done,
                arrivals,
            );
            // Joined nodes lost while being prepared held nothing: they fail at the next
            // boundary without a rollback (a segment that failed for another node still does).
            let departed = names_of(&fleet.departed(), &admitted);
            if !departed.is_empty() {
                tracing::warn!(nodes = ?departed, "nodes lost while being prepared");
                arrived.push((ElasticEvent::Fail { names: departed }, Instant::now()));
            }
            match outcome {
                Ok(()) => lost_in_a_row = 0,
                Err(FleetError::Lost { nodes, reason }) => {
                    tracing::warn!(?nodes, %reason, "nodes lost: rolling back at the next boundary");
                    count_lost(
                        &mut lost_in_a_row,
                        "segments",
                        controller.backup_clock,
                        &reason,
                    )?;
                    // The failed segment's last complete background copy is the newest consistent
                    // point: its clocks, and the workers' results of them, are kept.
                    if let Some(copy) = fleet
                        .salvage()
                        .filter(|copy| copy.clock > controller.backup_clock)
                    {
                        tracing::info!(
                            clock = copy.clock,
                            "keeping the failed segment's last BackupPS copy"
                        );
                        merge_reports(&mut merged, copy.reports);
                        controller.backup = copy.images;
                        controller.backup_clock = copy.clock;
                        controller.clock = controller.clock.max(copy.clock);
                        metrics.consistent_clock.set(copy.clock as i64);
                    }
                    let names = names_of(&nodes, &admitted);
                    if !names.is_empty() {
                        arrived.push((ElasticEvent::Fail { names }, Instant::now()));
                    }
                    force_rollback = true;
                }
                Err(other) => return Err(other.into()),
            }
        }
        // The last segment's parameters, read from the nodes that hold them. A node lost since the
        // last boundary took the only copy of its partitions' last clocks: the run rolls back to
        // the BackupPS copy and redoes them, as after any failure (`ebbflow run`'s quickstart lost
        // a spot node evicted right at the end this way and failed the whole run).
        if location.iter().all(Option::is_none) {
            break;
        }
        match gather_images(fleet, job.partitions) {
            Ok(images) => {
                controller.images = Arc::new(images);
                break;
            }
            Err(FleetError::Lost { nodes, reason }) => {
                tracing::warn!(?nodes, %reason, "nodes lost before the last parameters were read: rolling back");
                // Counted apart: the segments redone in between succeed, resetting the other.
                count_lost(
                    &mut lost_reading_last,
                    "reads of the last parameters",
                    controller.backup_clock,
                    &reason,
                )?;
                let names = names_of(&nodes, &admitted);
                if !names.is_empty() {
                    controller.apply(&ElasticEvent::Fail { names }, Instant::now());
                }
                roll_back_everywhere(&mut controller, fleet, &mut location, &mut pending_notice);
            }
            Err(other) => return Err(other.into()),
        }
    }

    let mut report = controller.report;
    let mut run = RunReport::from_workers(job.clocks, &merged);
    let mut snapshot = ParamSnapshot::new(specs.clone());
    for image in controller.images.iter() {
        for table in &image.tables {
            snapshot.add_rows(table.table, &table.keys, &table.data);
        }
    }
    snapshot.finish();
    run.parameter_bytes = controller
        .images
        .iter()
        .map(|i| i.parameter_bytes() as u64)
        .sum();
    // The controller may have built no worker of its own (node processes run them).
    app.set_num_workers(job.workers);
    run.finish(app, snapshot.clone(), job.keep_params);
    if let Some(divergence) = run.divergence(&merged) {
        metrics.diverged.inc();
        return Err(RunError::Diverged(divergence).into());
    }
    report.run = run;
    report.snapshot = snapshot;
    Ok(report)
}

/// Counts one more loss with no segment finishing since the last; after `MAX_LOST_IN_A_ROW`
/// of them the run gives up (a failure that recurs every time, such as a node whose answers
/// never decode, would roll back forever).
fn count_lost(
    lost_in_a_row: &mut u32,
    what: &str,
    backup_clock: u64,
    reason: &str,
) -> Result<(), ElasticError> {
    *lost_in_a_row += 1;
    if *lost_in_a_row >= MAX_LOST_IN_A_ROW {
        return Err(ElasticError::Run(RunError::RunCluster {
            reason: format!(
                "{lost_in_a_row} {what} in a row lost a node (consistent clock {backup_clock}); \
                 the last: {reason}"
            ),
        }));
    }
    Ok(())
}

/// The lost nodes' state is gone and the survivors' is abandoned: every partition comes back
/// from the BackupPS copy, and no server keeps a live one.
fn roll_back_everywhere(
    controller: &mut Controller<'_>,
    fleet: &mut dyn Fleet,
    location: &mut [Option<(NodeId, u64)>],
    pending_notice: &mut Option<Instant>,
) {
    controller.roll_back();
    *pending_notice = None;
    fleet.abandon_all();
    location.iter_mut().for_each(|l| *l = None);
}

/// The member names of `nodes` the fleet admitted.
fn names_of(nodes: &[NodeId], admitted: &BTreeMap<NodeId, String>) -> Vec<String> {
    nodes
        .iter()
        .filter_map(|id| admitted.get(id).cloned())
        .collect()
}

/// Joined members being prepared. Members whose preparation starts at the same boundary (a bulk
/// add) form a cohort and are switched in together, once all of them are ready: one layout
/// change instead of one per node. A cohort waits only for itself, so capacity that trickles in
/// (one instance every few boundaries, as spot requests are often fulfilled) cannot hold back
/// the members that joined before it.
#[derive(Debug, Default)]
struct Preparations {
    /// Per member: its cohort and whether it is ready.
    nodes: BTreeMap<NodeId, (u64, bool)>,
    /// The cohort the next preparations start in.
    next_cohort: u64,
}

/// Joined members not in the layout yet: the first time, the fleet starts preparing them for
/// the layout with every member in it; afterwards it says whether they are ready. A cohort
/// ([`Preparations`]) is switched in once all its members are ready (the layout they were
/// prepared for). One that is lost while preparing held nothing.
fn prepare_joined(
    config: &ElasticConfig,
    controller: &mut Controller<'_>,
    fleet: &mut dyn Fleet,
    admitted: &BTreeMap<NodeId, String>,
    preparing: &mut Preparations,
) -> Result<(), ElasticError> {
    let pending: Vec<(NodeId, String)> = controller
        .members
        .iter()
        .filter(|m| !m.ready && admitted.contains_key(&m.id))
        .map(|m| (m.id, m.name.clone()))
        .collect();
    // Members that left while preparing are forgotten.
    preparing
        .nodes
        .retain(|id, _| pending.iter().any(|(p, _)| p == id));
    if pending.is_empty() {
        return Ok(());
    }
    let everyone: Vec<(NodeId, bool)> = controller
        .members
        .iter()
        .map(|m| (m.id, m.reliable))
        .collect();
    let prospective = plan_layout(
        &everyone,
        config.job.partitions,
        controller.layout.as_ref().map(|l| l.partitions.as_slice()),
        &config.thresholds,
    )
    .ok();
    let cohort_now = preparing.next_cohort;
    // Per cohort: whether every member is ready, and its members.
    let mut cohorts: BTreeMap<u64, (bool, Vec<(NodeId, String)>)> = BTreeMap::new();
    for (id, name) in pending {
        let (cohort, outcome) = match preparing.nodes.get(&id) {
            None => {
                preparing.next_cohort = cohort_now + 1;
                let started = match &prospective {
                    Some(layout) => fleet.prepare(id, layout),
                    None => Ok(true),
                };
                (cohort_now, started)
            }
            Some(&(cohort, true)) => (cohort, Ok(true)),
            Some(&(cohort, false)) => (cohort, fleet.prepared(id)),
        };
        match outcome {
            Ok(ready) => {
                preparing.nodes.insert(id, (cohort, ready));
                let entry = cohorts.entry(cohort).or_insert((true, Vec::new()));
                entry.0 &= ready;
                entry.1.push((id, name));
            }
            Err(FleetError::Lost { reason, .. }) => {
                tracing::warn!(node = %name, %reason, "a joining node was lost while preparing");
                preparing.nodes.remove(&id);
                if let Ok(Some(_)) = controller.remove_member(&name) {
                    controller.count_event("fail");
                }
            }
            Err(other) => return Err(other.into()),
        }
    }
    for (cohort, (all_ready, members)) in cohorts {
        if !all_ready {
            continue;
        }
        for (id, name) in members {
            preparing.nodes.remove(&id);
            if let Some(member) = controller.members.iter_mut().find(|m| m.id == id) {
                if !member.ready && !member.reliable {
                    controller.metrics.transient_nodes_added.inc();
                }
                member.ready = true;
            }
            tracing::info!(node = %name, cohort, "joined node prepared: switching it in");
        }
    }
    Ok(())
}

/// Segments lost in a row (no segment finishing in between) after which a run gives up.
const MAX_LOST_IN_A_ROW: u32 = 10;

/// Most background BackupPS copies one segment arms; a segment that would run past its last one
/// ends there (the next starts at once, with the same layout). Every copy clock is armed on every
/// server before the workers start and, across node processes, sent in the segment's order, so a
/// segment from one event to the end of a long job armed them all up front: 100,000 clocks (a
/// job of 1,000,000 clocks copied every 10) held the workers of a stage-1 segment back 31 s.
const MAX_COPIES_PER_SEGMENT: usize = 64;

/// Lays out and runs one segment from the current boundary.
#[allow(clippy::too_many_arguments)]
fn run_boundary(
    config: &ElasticConfig,
    controller: &mut Controller<'_>,
    fleet: &mut dyn Fleet,
    location: &mut [Option<(NodeId, u64)>],
    admitted: &mut BTreeMap<NodeId, String>,
    pending_notice: &mut Option<Instant>,
    merged: &mut [WorkerReport],
    events: &[ScheduledEvent],
    done: &[bool],
    arrivals: &Arrivals,
) -> Result<(), FleetError> {
    let job = &config.job;
    let metrics = controller.metrics;
    let clock = controller.clock;
    let next_event = events
        .iter()
        .zip(done)
        .filter(|(e, done)| !**done && e.at_clock > clock)
        .map(|(e, _)| e.at_clock)
        .min()
        .unwrap_or(job.clocks);
    let mut layout = plan_layout(
        &controller.member_list(),
        job.partitions,
        controller.layout.as_ref().map(|l| l.partitions.as_slice()),
        &config.thresholds,
    )
    .map_err(|reason| RunError::RunCluster { reason })?;
    // A partition placed from the controller's copy (a rollback) gets an epoch above every one
    // it was placed at, so no request of the abandoned timeline reaches it and no worker takes
    // it for the copy it registered with. `roll_back` bumps the adopted layout's epochs, but
    // when the first layout's segment failed none was adopted, and planning starts again at 1.
    for (entry, (&at, &placed)) in layout
        .partitions
        .iter_mut()
        .zip(location.iter().zip(&controller.epochs))
    {
        if at.is_none() {
            entry.epoch = entry.epoch.max(placed + 1);
        }
    }
    // Copies are taken in every stage. In stage 1 the reliable nodes serve every partition, but
    // a lost worker node leaves its unfinished clock's updates on some partitions and not on
    // others, so a failure still rolls back to a copy; and the copy's clock is the job's
    // reported progress (without one, a stage-1 segment across node processes would show none
    // until the next event).
    let every = copy_every(
        config,
        controller.seconds_per_clock,
        controller.bytes_per_copy,
    );
    let copied_before = copy_totals(metrics);
    let next_backup = controller.backup_clock.saturating_add(every);
    // A fleet that copies to the BackupPSs in the background runs until the next event (or its
    // last armed copy, below); any other ends the segment at the next copy point and copies at
    // the boundary.
    let streams = fleet.streams_backups();
    let end = if streams {
        next_event.min(job.clocks)
    } else {
        next_event.min(next_backup.max(clock + 1)).min(job.clocks)
    };
    // While joined nodes prepare, come back every `backup_every` clocks to switch them in.
    let end = if controller.members.iter().any(|m| !m.ready) {
        end.min(clock + config.backup_every)
    } else {
        end
    };
    // Under a bandwidth cap the copies' size is measured again every few copies (a delta's
    // size follows how many clocks it coalesces).
    let end = if config.backup_bandwidth.is_some() && streams {
        end.min(clock.saturating_add(every.saturating_mul(COPIES_PER_MEASUREMENT)))
    } else {
        end
    };
    let backup_clocks: Vec<u64> = if streams {
        let mut at = next_backup;
        if at <= clock {
            at += (clock - at) / every * every + every;
        }
        std::iter::successors(Some(at), |c| c.checked_add(every))
            .take_while(|c| *c <= end)
            .take(MAX_COPIES_PER_SEGMENT)
            .collect()
    } else {
        Vec::new()
    };
    // A segment with every copy it may arm ends at the last one.
    let end = match backup_clocks.last() {
        Some(&last) if backup_clocks.len() == MAX_COPIES_PER_SEGMENT => end.min(last),
        _ => end,
    };
    let moved = moved_partitions(controller.layout.as_ref(), &layout);
    fleet.set_backups(&layout.backups);
    metrics.stage.set(i64::from(layout.stage));
    let (reliable_now, transient_now) = controller.tiers();
    metrics
        .nodes
        .with_label_values(&["reliable"])
        .set(reliable_now as i64);
    metrics
        .nodes
        .with_label_values(&["transient"])
        .set(transient_now as i64);

    // Lay the partitions out: a partition whose owner or epoch changed is copied to its new
    // owner (from its old one, or from the controller's copy after a rollback).
    let segment_start = Instant::now();
    let carried = location.iter().all(Option::is_some);
    // Every placement after the first layout is a migration, a flush or a restore, counted once
    // here (a rollback's restores used to count again when the next layout moved them).
    let mut placed = 0u64;
    for (p, target) in layout.partitions.iter().enumerate() {
        if location[p] == Some((target.owner, target.epoch)) {
            continue;
        }
        placed += 1;
        let from = location[p].map(|(node, _)| node);
        controller.epochs[p] = controller.epochs[p].max(target.epoch);
        fleet.place(
            p as PartitionId,
            target.owner,
            target.epoch,
            from,
            &controller.images[p],
        )?;
        location[p] = Some((target.owner, target.epoch));
    }
    if controller.layout.is_some() {
        controller.report.partitions_migrated += placed;
        metrics.partitions_migrated.inc_by(placed);
    }
    // Nodes that serve nothing now host nothing; departed ones are let go.
    let owners: BTreeSet<NodeId> = layout.partitions.iter().map(|e| e.owner).collect();
    fleet.retire_idle(&owners);
    let members: BTreeSet<NodeId> = controller.members.iter().map(|m| m.id).collect();
    let gone: Vec<NodeId> = admitted
        .keys()
        .copied()
        .filter(|id| !members.contains(id))
        .collect();
    for id in gone {
        fleet.release(id);
        admitted.remove(&id);
    }
    if let Some(received) = pending_notice.take() {
        let safe = received.elapsed().as_secs_f64();
        controller.report.notice_to_safe_seconds.push(safe);
        metrics.notice_to_safe_seconds.observe(safe);
    }
    let map = PartitionMap::from_entries(layout.partitions.clone()).map_err(|e| {
        RunError::RunCluster {
            reason: e.to_string(),
        }
    })?;
    tracing::info!(
        first = clock,
        end,
        stage = layout.stage,
        servers = layout.servers.len(),
        moved,
        "segment starting"
    );
    let setup_seconds = segment_start.elapsed().as_secs_f64();
    let spec = SegmentSpec {
        first: clock,
        end,
        map,
        worker_nodes: layout.worker_nodes.clone(),
        carried,
        backup_clocks,
        held_backup: Some((controller.backup_clock, controller.backup.clone())),
        bystanders: controller
            .members
            .iter()
            .filter(|m| !m.ready && admitted.contains_key(&m.id))
            .map(|m| m.id)
            .collect(),
        reliable: controller
            .members
            .iter()
            .filter(|m| m.reliable)
            .map(|m| m.id)
            .collect(),
    };
    let interrupt = &arrivals.interrupt;
    interrupt.reset();
    // An event that arrived since the boundary began ends this segment at once (the forwarder
    // queues before it requests, so none slips between the reset and this check).
    if !arrivals.queued.lock().is_empty() {
        interrupt.request();
    }
    let outcome = fleet.run_segment(&spec, interrupt);
    let teardown_start = Instant::now();
    let SegmentOutcome {
        end,
        reports,
        backup,
        shards,
    } = outcome?;
    if let Some(&(partition, clock)) = fleet
        .visible_clocks()?
        .iter()
        .find(|(_, clock)| *clock != end)
    {
        return Err(RunError::RunCluster {
            reason: ElasticError::CheckBoundary {
                partition,
                clock,
                expected: end,
            }
            .to_string(),
        }
        .into());
    }
    // A worker whose training loss diverged ends the run: the segment ended early for it (a
    // node's background copy report brings that forward) or at its planned end.
    if let Some(divergence) =
        crate::divergence::earliest(reports.iter().filter_map(|(_, r)| r.diverged.as_ref()))
    {
        metrics.diverged.inc();
        return Err(RunError::Diverged(divergence).into());
    }
    merge_reports(merged, reports);
    // A copy taken in the background counts only once its segment succeeded, checks included:
    // the workers' reports of a failed segment are lost, so its clocks must all be redone. The
    // clock moves with it, so the copy is never ahead of the clock a rollback redoes from (a
    // node lost in the check after a copy was adopted once left the copy at clock 9 and the
    // clock at 0, and the rollback's count of redone clocks overflowed).
    if let Some((at, images)) = backup {
        controller.backup = images;
        controller.backup_clock = at;
    }
    controller.clock = end;
    // Stage 1 copies in the background as the other stages do, so a boundary (a join that
    // starts stage 2, say) copies only when the last copy is `backup_every` clocks old: the
    // rank-1000 fig. 4.15 join spent 5-8 ms here copying every parameter at the switch.
    if end - controller.backup_clock >= every {
        // ActivePS → BackupPS: the consistent copy at this boundary.
        controller.images = Arc::new(gather_images(fleet, job.partitions)?);
        controller.sync_backup();
    }
    metrics.consistent_clock.set(end as i64);
    let (reliable_nodes, transient_nodes) = controller.tiers();
    let teardown_seconds = teardown_start.elapsed().as_secs_f64();
    let seconds = segment_start.elapsed().as_secs_f64();
    if end > clock {
        let running = (seconds - setup_seconds - teardown_seconds).max(0.0);
        controller.seconds_per_clock = Some(running / (end - clock) as f64);
    }
    // One copy sends an image (whole or delta) of every partition.
    let (bytes_before, images_before) = copied_before;
    let (bytes_after, images_after) = copy_totals(metrics);
    let images = images_after.saturating_sub(images_before);
    if images > 0 {
        let copies = images as f64 / f64::from(job.partitions.max(1));
        controller.bytes_per_copy = Some(bytes_after.saturating_sub(bytes_before) as f64 / copies);
    }
    controller.report.segments.push(SegmentRecord {
        first_clock: clock,
        end_clock: end,
        stage: layout.stage,
        reliable_nodes,
        transient_nodes,
        servers: layout.servers.len(),
        worker_nodes: layout.worker_nodes.len(),
        partitions_moved: moved,
        seconds,
        setup_seconds,
        teardown_seconds,
        shards,
    });
    controller.layout = Some(layout);
    Ok(())
}

/// Writes each logical worker's per-clock results of a segment into the run's.
fn merge_reports(merged: &mut [WorkerReport], reports: Vec<(u32, WorkerReport)>) {
    for (worker, report) in reports {
        let Some(target) = merged.get_mut(worker as usize) else {
            continue;
        };
        for (offset, stats) in report.stats.iter().enumerate() {
            let at = report.first_clock as usize + offset;
            if at < target.stats.len() {
                target.stats[at] = *stats;
                target.clock_end[at] = report.clock_end[offset];
            }
        }
        target.wait_seconds += report.wait_seconds;
    }
}

/// Images of every partition from the fleet, in partition order.
fn gather_images(
    fleet: &mut dyn Fleet,
    num_partitions: u32,
) -> Result<Vec<PartitionImage>, FleetError> {
    let mut images = fleet.images()?;
    images.sort_by_key(|image| image.partition);
    if images.len() != num_partitions as usize {
        return Err(RunError::RunCluster {
            reason: format!("{} of {num_partitions} partitions are hosted", images.len()),
        }
        .into());
    }
    Ok(images)
}

/// Partitions whose owner differs between two layouts (all of them for the first layout: they
/// are created, not moved, so zero then).
fn moved_partitions(previous: Option<&Layout>, next: &Layout) -> u32 {
    let Some(previous) = previous else {
        return 0;
    };
    previous
        .partitions
        .iter()
        .zip(&next.partitions)
        .filter(|(a, b)| a.owner != b.owner || a.epoch != b.epoch)
        .count() as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fleet whose every segment is lost, as if a node's answers never decoded.
    struct AlwaysLost {
        segments: u32,
        /// (partition, owner, epoch) of every placement, in order.
        placed: Vec<(PartitionId, NodeId, u64)>,
    }

    impl Fleet for AlwaysLost {
        fn admit(&mut self, _id: NodeId, _name: &str) -> Result<(), FleetError> {
            Ok(())
        }
        fn release(&mut self, _id: NodeId) {}
        fn place(
            &mut self,
            partition: PartitionId,
            to: NodeId,
            epoch: u64,
            _from: Option<NodeId>,
            _fallback: &PartitionImage,
        ) -> Result<(), FleetError> {
            self.placed.push((partition, to, epoch));
            Ok(())
        }
        fn retire_idle(&mut self, _owners: &BTreeSet<NodeId>) {}
        fn abandon_all(&mut self) {}
        fn run_segment(
            &mut self,
            _spec: &SegmentSpec,
            _interrupt: &Interrupt,
        ) -> Result<SegmentOutcome, FleetError> {
            self.segments += 1;
            Err(FleetError::Lost {
                nodes: vec![0],
                reason: "undecodable answer".into(),
            })
        }
        fn visible_clocks(&mut self) -> Result<Vec<(PartitionId, u64)>, FleetError> {
            Ok(Vec::new())
        }
        fn images(&mut self) -> Result<Vec<PartitionImage>, FleetError> {
            Ok(Vec::new())
        }
        fn finish(&mut self) {}
    }

    /// Runs the integer-exact app with `partitions` on one reliable node over an
    /// [`AlwaysLost`] fleet; returns the fleet and the run's error.
    fn run_always_lost(partitions: u32) -> (AlwaysLost, ElasticError) {
        let app = crate::exact::ExactApp::new(crate::exact::ExactConfig::default());
        let config = ElasticConfig {
            job: JobConfig {
                clocks: 20,
                workers: 2,
                partitions,
                ..JobConfig::default()
            },
            thresholds: StageThresholds::default(),
            backup_every: 5,
            backup_interval: None,
            backup_bandwidth: None,
            start: None,
            checkpoint: None,
            reliable: vec!["r0".into()],
            transient: Vec::new(),
        };
        let mut fleet = AlwaysLost {
            segments: 0,
            placed: Vec::new(),
        };
        let error = run_elastic_on(
            &app,
            &config,
            &[],
            None,
            &mut fleet,
            &RuntimeMetrics::unregistered(),
        )
        .expect_err("no segment ever finishes");
        (fleet, error)
    }

    #[test]
    fn a_copy_interval_in_time_is_converted_at_the_measured_time_per_clock() {
        let mut config = ElasticConfig {
            job: JobConfig::default(),
            thresholds: StageThresholds::default(),
            backup_every: 5,
            backup_interval: None,
            backup_bandwidth: None,
            start: None,
            checkpoint: None,
            reliable: Vec::new(),
            transient: Vec::new(),
        };
        assert_eq!(
            copy_every(&config, Some(0.01), None),
            5,
            "no interval: backup_every"
        );
        config.backup_interval = Some(Duration::from_secs(2));
        assert_eq!(copy_every(&config, None, None), 5, "nothing measured yet");
        assert_eq!(copy_every(&config, Some(0.01), None), 200);
        assert_eq!(copy_every(&config, Some(0.3), None), 7, "rounded up");
        assert_eq!(
            copy_every(&config, Some(5.0), None),
            1,
            "at least every clock"
        );
        assert_eq!(
            copy_every(&config, Some(0.0), None),
            2_000_000,
            "a 0 s clock counts as 1 us"
        );
        config.backup_interval = Some(Duration::from_secs(u64::MAX));
        assert_eq!(copy_every(&config, Some(0.0), None), u64::MAX, "saturates");

        // A bandwidth cap spaces copies so that the last copy's size fits: 1 MB at 1 MB/s is a
        // second of clocks; an interval longer than that still decides.
        config.backup_interval = None;
        config.backup_bandwidth = Some(1e6);
        assert_eq!(copy_every(&config, Some(0.01), Some(1e6)), 100);
        assert_eq!(
            copy_every(&config, Some(0.01), Some(1e3)),
            5,
            "small copies: backup_every"
        );
        assert_eq!(
            copy_every(&config, Some(0.01), None),
            5,
            "no copy measured yet"
        );
        config.backup_interval = Some(Duration::from_secs(3));
        assert_eq!(copy_every(&config, Some(0.01), Some(1e6)), 300);
        assert_eq!(copy_every(&config, Some(0.01), Some(5e6)), 500);
    }

    #[test]
    fn a_failure_that_recurs_every_segment_ends_the_run_with_its_reason() {
        let (fleet, error) = run_always_lost(2);
        assert_eq!(fleet.segments, MAX_LOST_IN_A_ROW);
        let text = error.to_string();
        assert!(
            text.contains("in a row") && text.contains("undecodable answer"),
            "{text}"
        );
    }

    #[test]
    fn a_partition_restored_after_a_failed_first_layout_never_gets_an_epoch_it_had() {
        // No segment ever succeeds, so no layout is adopted: every rollback restores every
        // partition from the controller's copy onto the same node. A restored partition at an
        // epoch it had before would take requests of the abandoned timeline, and node
        // processes' workers would take it for the copy they registered with (they re-register
        // only partitions whose server or epoch changed): their BSP pushes then wait forever
        // for a read by a worker the restored copy does not know.
        let (fleet, _) = run_always_lost(3);
        assert_eq!(fleet.placed.len(), 3 * MAX_LOST_IN_A_ROW as usize);
        let distinct: BTreeSet<_> = fleet.placed.iter().copied().collect();
        assert_eq!(
            distinct.len(),
            fleet.placed.len(),
            "a partition was placed twice on one node at one epoch: {:?}",
            fleet.placed
        );
    }

    #[test]
    fn stage_follows_the_ratio() {
        let t = StageThresholds::default();
        assert_eq!(choose_stage(0, 1, &t), 1);
        assert_eq!(choose_stage(1, 1, &t), 1);
        assert_eq!(choose_stage(2, 1, &t), 2);
        assert_eq!(choose_stage(15, 1, &t), 2);
        assert_eq!(choose_stage(16, 1, &t), 3);
        assert_eq!(choose_stage(30, 2, &t), 2);
        assert_eq!(choose_stage(32, 2, &t), 3);
        for stage in 1..=3 {
            let forced = StageThresholds::forced(stage);
            for (transient, reliable) in [(1, 1), (3, 1), (7, 1), (63, 1)] {
                assert_eq!(choose_stage(transient, reliable, &forced), stage);
            }
            assert_eq!(choose_stage(0, 1, &forced), 1, "no transient node: stage 1");
        }
    }

    #[test]
    fn layout_keeps_owners_and_moves_only_what_must_move() {
        let t = StageThresholds::default();
        // 1 reliable (0), 4 transient (1..=4): stage 2, ActivePSs on the two oldest.
        let members = [(0, true), (1, false), (2, false), (3, false), (4, false)];
        let first = plan_layout(&members, 8, None, &t).unwrap();
        assert_eq!(first.stage, 2);
        assert_eq!(first.servers, vec![1, 2]);
        assert_eq!(first.backups, vec![0]);
        assert!(first.partitions.iter().all(|e| e.epoch == 1));
        assert_eq!(
            first.partitions.iter().filter(|e| e.owner == 1).count(),
            4,
            "balanced"
        );
        // Node 1 leaves: its partitions go to node 2 (the remaining ActivePS of 3 transient
        // nodes is 2 and 3), epoch 2; node 2's stay at epoch 1.
        let members = [(0, true), (2, false), (3, false), (4, false)];
        let second = plan_layout(&members, 8, Some(&first.partitions), &t).unwrap();
        assert_eq!(second.servers, vec![2, 3]);
        for (before, after) in first.partitions.iter().zip(&second.partitions) {
            if before.owner == 2 {
                assert_eq!(after, before);
            } else {
                assert_eq!((after.owner, after.epoch), (3, 2));
            }
        }
        // Every transient node gone: end-of-life flush to the reliable tier, stage 1.
        let third = plan_layout(&[(0, true)], 8, Some(&second.partitions), &t).unwrap();
        assert_eq!(third.stage, 1);
        assert!(third.partitions.iter().all(|e| e.owner == 0));
        assert_eq!(third.worker_nodes, vec![0]);
        // Stage 3: no workers on the reliable tier.
        let many: Vec<(NodeId, bool)> = std::iter::once((0, true))
            .chain((1..=16).map(|n| (n, false)))
            .collect();
        let fourth = plan_layout(&many, 8, None, &t).unwrap();
        assert_eq!(fourth.stage, 3);
        assert!(!fourth.worker_nodes.contains(&0));
        assert_eq!(fourth.servers.len(), 8);
        assert!(plan_layout(&[(1, false)], 8, None, &t).is_err());
    }

    #[test]
    fn clock_gate_stops_every_worker_after_the_same_clock() {
        let gate = ClockGate::range(3, 10);
        assert!(gate.try_start(3));
        assert!(gate.try_start(4));
        assert_eq!(gate.end_soon(), 5);
        assert!(!gate.try_start(5));
        assert!(gate.try_start(4), "a slower worker still finishes clock 4");
        let idle = ClockGate::range(2, 9);
        assert_eq!(idle.end_soon(), 2);
        // An interrupt leaves a segment that started nothing its first clock.
        let fresh = ClockGate::range(2, 10);
        assert_eq!(fresh.end_soon_after_progress(), 3);
        assert!(fresh.try_start(2) && !fresh.try_start(3));
        let started = ClockGate::range(2, 10);
        assert!(started.try_start(2) && started.try_start(3));
        assert_eq!(started.end_soon_after_progress(), 4);
    }
}
