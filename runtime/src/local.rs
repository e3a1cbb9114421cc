//! Single-process mode: an in-process server hosting every partition and N worker threads that
//! talk to it directly (no TCP, no encoding), plus the run report shared with multi-process mode.

use std::sync::Arc;
use std::time::Instant;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::app::{App, AppError, AppWorker, ClockStats, EvalReport, TableId, validate_tables};
use crate::divergence::{self, Divergence, DivergenceGuard};
use crate::metrics::RuntimeMetrics;
use crate::partition::PartitionId;
use crate::snapshot::ParamSnapshot;
use crate::store::ServerState;
use crate::worker::{
    ClockGate, DivergenceStop, JobConfig, PartitionView, Transport, WorkerError, WorkerReport,
    process_cache_for, run_worker,
};

/// Errors of a whole run.
#[derive(Debug, Error)]
pub enum RunError {
    /// The job configuration is unusable.
    #[error("invalid job configuration: {reason}")]
    ValidateConfig {
        /// What is wrong.
        reason: String,
    },
    /// The app's table declarations are invalid.
    #[error("invalid app tables: {0}")]
    ValidateTables(#[from] AppError),
    /// A worker thread failed.
    #[error("worker {worker} failed: {source}")]
    RunWorker {
        /// The worker.
        worker: u32,
        /// Why.
        source: WorkerError,
    },
    /// A worker thread panicked (a bug in the app).
    #[error("worker {worker} panicked")]
    JoinWorker {
        /// The worker.
        worker: u32,
    },
    /// A node process or the coordinator failed (multi-process mode).
    #[error("cluster run failed: {reason}")]
    RunCluster {
        /// What failed.
        reason: String,
    },
    /// The training loss diverged (NaN, infinite or growing without bound), or the final
    /// evaluation is not finite: the model is not a result.
    #[error("{0}")]
    Diverged(Divergence),
}

impl RunError {
    /// Static label for metrics.
    pub fn category(&self) -> &'static str {
        match self {
            RunError::ValidateConfig { .. } => "validate_config",
            RunError::ValidateTables(_) => "validate_tables",
            RunError::RunWorker { .. } => "run_worker",
            RunError::JoinWorker { .. } => "join_worker",
            RunError::RunCluster { .. } => "run_cluster",
            RunError::Diverged(_) => "diverged",
        }
    }
}

/// Peak resident memory of this process (`VmHWM`), if the platform reports it.
pub fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Checks a job configuration.
pub fn validate_config(config: &JobConfig) -> Result<(), RunError> {
    let reason = if config.workers == 0 {
        "workers must be at least 1"
    } else if config.partitions == 0 {
        "partitions must be at least 1"
    } else if config.clocks == 0 {
        "clocks must be at least 1"
    } else {
        return Ok(());
    };
    Err(RunError::ValidateConfig {
        reason: reason.to_owned(),
    })
}

/// What a run did, the same in single- and multi-process mode.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct RunReport {
    /// Clocks run.
    pub clocks: u64,
    /// Worker threads over all processes.
    pub workers: usize,
    /// Units of work over all workers and clocks.
    pub updates: u64,
    /// Wall time of the clock loops (from workers starting to the last clock ending).
    pub elapsed_seconds: f64,
    /// `updates / elapsed_seconds`.
    pub updates_per_second: f64,
    /// Per clock: the app's stats summed over workers.
    pub clock_stats: Vec<ClockStatsRecord>,
    /// Per clock: wall time from the previous clock's end to this one's (slowest worker).
    pub clock_seconds: Vec<f64>,
    /// Seconds workers spent pulling (SSP waits included), summed over workers.
    pub wait_seconds: f64,
    /// Test quality of the final parameters.
    pub eval: EvalReport,
    /// Bytes of parameter values held by all servers at the end.
    pub parameter_bytes: u64,
    /// Peak resident memory of each node process (multi-process mode; bytes, 0 if unknown).
    #[serde(default)]
    pub node_peak_rss_bytes: Vec<u64>,
    /// Sum of every materialised parameter value (a cheap fingerprint to compare runs).
    pub param_sum: f64,
    /// Sum of absolute values of every materialised parameter value.
    pub param_abs_sum: f64,
    /// The final parameters, if the job asked to keep them.
    #[serde(skip)]
    pub params: Option<ParamSnapshot>,
}

/// Serializable form of [`ClockStats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct ClockStatsRecord {
    /// Units of work.
    pub updates: u64,
    /// Sum of loss terms.
    pub loss_sum: f64,
    /// Number of loss terms.
    pub loss_count: u64,
}

impl From<ClockStats> for ClockStatsRecord {
    fn from(s: ClockStats) -> Self {
        Self {
            updates: s.updates,
            loss_sum: s.loss_sum,
            loss_count: s.loss_count,
        }
    }
}

impl From<ClockStatsRecord> for ClockStats {
    fn from(r: ClockStatsRecord) -> Self {
        Self {
            updates: r.updates,
            loss_sum: r.loss_sum,
            loss_count: r.loss_count,
        }
    }
}

impl RunReport {
    /// Sum of the per-clock stats over the whole run.
    pub fn total_stats(&self) -> ClockStats {
        let mut total = ClockStats::default();
        for record in &self.clock_stats {
            total.merge(&ClockStats::from(*record));
        }
        total
    }

    /// The run's divergence, if it diverged: the earliest a worker reported, else one of the
    /// per-clock training loss summed over workers, else a final evaluation that is not finite.
    pub fn divergence(&self, workers: &[WorkerReport]) -> Option<Divergence> {
        if let Some(found) =
            divergence::earliest(workers.iter().filter_map(|w| w.diverged.as_ref()))
        {
            return Some(found);
        }
        let mut guard = DivergenceGuard::new();
        for (clock, record) in self.clock_stats.iter().enumerate() {
            if let Some(found) = guard.observe(clock as u64, &ClockStats::from(*record)) {
                return Some(found);
            }
        }
        divergence::check_eval(&self.eval, self.clocks, guard.last_finite())
    }

    /// Evaluates the final parameters and fills the quality fields.
    pub fn finish<A: App>(&mut self, app: &A, snapshot: ParamSnapshot, keep_params: bool) {
        let eval = app.evaluate(&snapshot);
        self.finish_with(eval, snapshot, keep_params);
    }

    /// Fills the quality fields from an evaluation already computed on `snapshot`.
    pub fn finish_with(&mut self, eval: EvalReport, snapshot: ParamSnapshot, keep_params: bool) {
        self.eval = eval;
        let (sum, abs_sum) = snapshot.sums();
        self.param_sum = sum;
        self.param_abs_sum = abs_sum;
        if keep_params {
            self.params = Some(snapshot);
        }
    }

    /// Builds the timing and stats part of a report from per-worker reports (clock end times
    /// relative to one common start).
    pub fn from_workers(clocks: u64, workers: &[WorkerReport]) -> Self {
        let mut clock_stats = vec![ClockStatsRecord::default(); clocks as usize];
        let mut clock_end = vec![0f64; clocks as usize];
        let mut wait_seconds = 0.0;
        for worker in workers {
            for (clock, stats) in worker.stats.iter().enumerate() {
                let record = &mut clock_stats[clock];
                record.updates += stats.updates;
                record.loss_sum += stats.loss_sum;
                record.loss_count += stats.loss_count;
            }
            for (clock, end) in worker.clock_end.iter().enumerate() {
                clock_end[clock] = clock_end[clock].max(*end);
            }
            wait_seconds += worker.wait_seconds;
        }
        let clock_seconds = clock_end
            .iter()
            .enumerate()
            .map(|(clock, end)| {
                end - if clock == 0 {
                    0.0
                } else {
                    clock_end[clock - 1]
                }
            })
            .collect();
        let elapsed_seconds = clock_end.last().copied().unwrap_or(0.0);
        let updates: u64 = clock_stats.iter().map(|r| r.updates).sum();
        Self {
            clocks,
            workers: workers.len(),
            updates,
            elapsed_seconds,
            updates_per_second: if elapsed_seconds > 0.0 {
                updates as f64 / elapsed_seconds
            } else {
                0.0
            },
            clock_stats,
            clock_seconds,
            wait_seconds,
            ..Self::default()
        }
    }
}

/// Worker-side access to an in-process [`ServerState`].
pub(crate) struct LocalTransport {
    state: Arc<ServerState>,
    config: JobConfig,
}

/// Epoch of every partition in single-process mode (ownership never changes).
const LOCAL_EPOCH: u64 = 1;

impl Transport for LocalTransport {
    fn register(
        &mut self,
        worker: u32,
        partition: PartitionId,
        tables: &[(TableId, Vec<u64>)],
        read_through: Option<u64>,
    ) -> Result<usize, WorkerError> {
        Ok(self.state.with_partition(partition, LOCAL_EPOCH, |store| {
            store.register_read(worker, tables, read_through, usize::MAX)
        })?)
    }

    fn push(
        &mut self,
        worker: u32,
        clock: u64,
        views: &[PartitionView],
    ) -> Result<(), WorkerError> {
        for view in views {
            self.state.push_blocking(
                view.partition,
                LOCAL_EPOCH,
                worker,
                clock,
                &view.delta,
                self.config.wait_timeout,
            )?;
        }
        Ok(())
    }

    fn pull(
        &mut self,
        worker: u32,
        min_clock: u64,
        views: &mut [PartitionView],
    ) -> Result<(), WorkerError> {
        for view in views.iter_mut().filter(|v| v.needs_pull) {
            self.state
                .wait_clock_blocking(view.partition, min_clock, self.config.wait_timeout)?;
            let (incoming, since) = (&mut view.incoming, view.since);
            let mut fresh = view.fresh.take().unwrap_or_default();
            fresh.clear();
            let (visible, incremental) =
                self.state
                    .with_partition(view.partition, LOCAL_EPOCH, |store| {
                        let incremental =
                            store.pull_rows_since(worker, min_clock, since, |offset, row| {
                                incoming[offset..offset + row.len()].copy_from_slice(row);
                                crate::worker::add_stretch(&mut fresh, offset, row.len());
                            })?;
                        Ok((store.visible_clock(), incremental))
                    })?;
            view.visible = visible;
            view.fresh = incremental.then_some(fresh);
        }
        Ok(())
    }
}

/// Copies every hosted partition of `state` into a snapshot.
pub(crate) fn snapshot_state(
    state: &ServerState,
    specs: &[crate::app::TableSpec],
) -> ParamSnapshot {
    let mut snapshot = ParamSnapshot::new(specs.to_vec());
    for partition in state.hosted() {
        let _ = state.with_partition(partition, LOCAL_EPOCH, |store| {
            for spec in specs {
                if let Some((keys, data, _)) = store.table_rows(spec.id) {
                    snapshot.add_rows(spec.id, keys, data);
                }
            }
            Ok(())
        });
    }
    snapshot.finish();
    snapshot
}

/// Trains `app` in this process: one in-process server, `config.workers` worker threads.
pub fn run_single_process<A: App>(
    app: &A,
    config: &JobConfig,
    metrics: &RuntimeMetrics,
) -> Result<RunReport, RunError> {
    validate_config(config)?;
    let specs = app.tables();
    validate_tables(&specs)?;
    let hosted: Vec<(PartitionId, u64)> =
        (0..config.partitions).map(|p| (p, LOCAL_EPOCH)).collect();
    let state = Arc::new(ServerState::new(
        &hosted,
        config.partitions,
        &specs,
        config.workers as u32,
        config.optimizer,
        config.staleness == 0,
    ));
    let app_workers: Vec<A::Worker> = (0..config.workers)
        .map(|shard| app.worker(shard, config.workers))
        .collect();
    let working_sets: Vec<_> = app_workers.iter().map(|w| w.working_set()).collect();
    let members: Vec<_> = working_sets
        .iter()
        .enumerate()
        .map(|(worker, set)| (worker as u32, set))
        .collect();
    let shared = process_cache_for(config, &specs, &members);
    let routes = vec![(None, LOCAL_EPOCH); config.partitions as usize];
    tracing::info!(
        workers = config.workers,
        partitions = config.partitions,
        clocks = config.clocks,
        staleness = config.staleness,
        clocks_per_pass = app.clocks_per_pass(config.workers),
        "single-process run starting"
    );
    let run_start = Instant::now();
    let gate = &ClockGate::range(0, config.clocks);
    let results: Vec<Result<WorkerReport, RunError>> = std::thread::scope(|scope| {
        let handles: Vec<_> = app_workers
            .into_iter()
            .zip(&working_sets)
            .enumerate()
            .map(|(worker, (app_worker, working_set))| {
                let mut transport = LocalTransport {
                    state: state.clone(),
                    config: config.clone(),
                };
                let specs = &specs;
                let shared = shared.as_ref().map(|cache| (cache, routes.as_slice()));
                std::thread::Builder::new()
                    .name(format!("worker-{worker}"))
                    .spawn_scoped(scope, move || {
                        run_worker(
                            worker as u32,
                            app_worker,
                            working_set,
                            shared,
                            specs,
                            &mut transport,
                            config,
                            gate,
                            metrics,
                            run_start,
                            DivergenceStop::EndGate,
                        )
                        .map_err(|source| RunError::RunWorker {
                            worker: worker as u32,
                            source,
                        })
                    })
                    .map_err(|_| RunError::JoinWorker {
                        worker: worker as u32,
                    })
            })
            .collect();
        handles
            .into_iter()
            .enumerate()
            .map(|(worker, handle)| {
                handle?.join().map_err(|_| RunError::JoinWorker {
                    worker: worker as u32,
                })?
            })
            .collect()
    });
    let reports = results.into_iter().collect::<Result<Vec<_>, _>>()?;
    let mut report = RunReport::from_workers(config.clocks, &reports);
    report.parameter_bytes = state.parameter_bytes() as u64;
    report.finish(app, snapshot_state(&state, &specs), config.keep_params);
    if let Some(divergence) = report.divergence(&reports) {
        metrics.diverged.inc();
        return Err(RunError::Diverged(divergence));
    }
    tracing::info!(
        updates_per_second = report.updates_per_second,
        loss = report.eval.loss,
        "single-process run done"
    );
    Ok(report)
}
