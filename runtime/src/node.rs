//! Node-side building blocks shared by the `node` process and the in-process loopback mode:
//! hosting partitions behind a TCP server, and running worker threads against remote servers.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use crate::app::{App, AppWorker, TableSpec, WorkingSet, validate_tables};
use crate::client::{
    ClientConfig, NodeAddrs, PreOpened, RemoteTransport, Severance, fetch_snapshot,
};
use crate::local::{RunError, RunReport, validate_config};
use crate::metrics::RuntimeMetrics;
use crate::partition::{NodeId, PartitionMap};
use crate::process_cache::{ProcessCache, Route};
use crate::server::{ServerConfig, run};
use crate::store::ServerState;
use crate::worker::{
    ClockGate, DivergenceStop, JobConfig, SegmentProgress, WorkerError, WorkerReport,
    process_cache_for, run_worker,
};

/// Which workers a node runs and where every partition lives.
#[derive(Debug, Clone)]
pub struct WorkerPlan {
    /// Global id of the node's first worker thread.
    pub worker_base: u32,
    /// Worker threads on this node.
    pub local_workers: usize,
    /// Worker threads over the whole job.
    pub total_workers: usize,
    /// Partition owners.
    pub map: PartitionMap,
    /// Data-plane address of every owner.
    pub addrs: NodeAddrs,
}

/// A fresh random job secret: 32 bytes from the operating system's generator, as hex.
pub fn random_secret() -> String {
    crate::handshake::nonce()
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect()
}

/// Where each partition of `map` is served (what the process cache registers against).
fn routes_of(map: &PartitionMap, addrs: &NodeAddrs) -> Vec<Route> {
    map.entries()
        .iter()
        .map(|entry| (addrs.get(&entry.owner).copied(), entry.epoch))
        .collect()
}

/// Runs this node's worker threads against the servers in `plan`; returns their reports.
pub fn run_workers<A: App>(
    app: &A,
    specs: &[TableSpec],
    plan: &WorkerPlan,
    client: &ClientConfig,
    config: &JobConfig,
    metrics: &RuntimeMetrics,
    run_start: Instant,
) -> Result<Vec<WorkerReport>, RunError> {
    let gate = ClockGate::range(0, config.clocks);
    run_workers_gated(app, specs, plan, client, config, &gate, metrics, run_start)
}

/// As [`run_workers`] for the clocks `gate` lets the workers run (a segment of an elastic run).
#[allow(clippy::too_many_arguments)]
pub fn run_workers_gated<A: App>(
    app: &A,
    specs: &[TableSpec],
    plan: &WorkerPlan,
    client: &ClientConfig,
    config: &JobConfig,
    gate: &ClockGate,
    metrics: &RuntimeMetrics,
    run_start: Instant,
) -> Result<Vec<WorkerReport>, RunError> {
    let config = JobConfig {
        partitions: plan.map.num_partitions(),
        ..config.clone()
    };
    let app_workers: Vec<(u32, A::Worker, WorkingSet)> = (0..plan.local_workers)
        .map(|i| {
            let global = plan.worker_base + i as u32;
            let app_worker = app.worker(global as usize, plan.total_workers);
            let working_set = app_worker.working_set();
            (global, app_worker, working_set)
        })
        .collect();
    let members: Vec<(u32, &WorkingSet)> = app_workers.iter().map(|(w, _, s)| (*w, s)).collect();
    let shared = process_cache_for(&config, specs, &members);
    let routes = routes_of(&plan.map, &plan.addrs);
    std::thread::scope(|scope| {
        let handles: Vec<_> = app_workers
            .into_iter()
            .map(|(worker, app_worker, working_set)| {
                let config = &config;
                let shared = shared.as_ref().map(|cache| (cache, routes.as_slice()));
                let handle = std::thread::Builder::new()
                    .name(format!("worker-{worker}"))
                    .spawn_scoped(scope, move || {
                        let mut transport = RemoteTransport::connect(
                            &plan.map,
                            &plan.addrs,
                            client,
                        )
                        .map_err(|e| {
                            if let Some((cache, _)) = shared {
                                cache.fail(format!("worker {worker} failed to connect: {e}"));
                            }
                            RunError::RunWorker {
                                worker,
                                source: e.into(),
                            }
                        })?;
                        run_worker(
                            worker,
                            app_worker,
                            &working_set,
                            shared,
                            specs,
                            &mut transport,
                            config,
                            gate,
                            metrics,
                            run_start,
                            DivergenceStop::Report,
                        )
                        .map_err(|source| RunError::RunWorker { worker, source })
                    });
                (worker, handle)
            })
            .collect();
        handles
            .into_iter()
            .map(|(worker, handle)| {
                let handle = handle.map_err(|_| RunError::JoinWorker { worker })?;
                handle.join().map_err(|_| RunError::JoinWorker { worker })?
            })
            .collect()
    })
}

/// A data-plane server running on a tokio runtime, stopped on drop of the shutdown sender.
pub struct ServerHandle {
    /// Address the server listens on.
    pub addr: SocketAddr,
    /// The partitions it serves.
    pub state: Arc<ServerState>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl ServerHandle {
    /// Binds `addr` on `runtime` and serves `state` there.
    pub fn start(
        runtime: &tokio::runtime::Handle,
        addr: SocketAddr,
        state: Arc<ServerState>,
        config: ServerConfig,
        metrics: RuntimeMetrics,
    ) -> std::io::Result<Self> {
        let (listener, _) = runtime.block_on(crate::server::bind(addr))?;
        Self::serve(runtime, listener, state, config, metrics)
    }

    /// Serves `state` on a fresh port of 127.0.0.1 with the job `secret`, over `tls` when given.
    pub fn loopback(
        runtime: &tokio::runtime::Handle,
        state: Arc<ServerState>,
        secret: &[u8],
        tls: Option<Arc<crate::tls::JobTls>>,
        wait_timeout: std::time::Duration,
        metrics: &RuntimeMetrics,
    ) -> std::io::Result<Self> {
        let config = ServerConfig {
            wait_timeout,
            tls,
            ..ServerConfig::with_secret(secret.to_vec())
        };
        Self::start(
            runtime,
            ([127, 0, 0, 1], 0).into(),
            state,
            config,
            metrics.clone(),
        )
    }

    /// Serves `state` on an already-bound listener.
    pub fn serve(
        runtime: &tokio::runtime::Handle,
        listener: tokio::net::TcpListener,
        state: Arc<ServerState>,
        config: ServerConfig,
        metrics: RuntimeMetrics,
    ) -> std::io::Result<Self> {
        let addr = listener.local_addr()?;
        let (shutdown, stop) = tokio::sync::oneshot::channel::<()>();
        let serving = state.clone();
        let task = runtime.spawn(async move {
            run(listener, serving, Arc::new(config), metrics, async {
                let _ = stop.await;
            })
            .await;
        });
        Ok(Self {
            addr,
            state,
            shutdown: Some(shutdown),
            task: Some(task),
        })
    }

    /// Stops accepting, waits for open connections to finish.
    pub fn stop(self, runtime: &tokio::runtime::Handle) {
        if let Some(task) = self.stop_in_background() {
            let _ = runtime.block_on(task);
        }
    }

    /// Stops accepting and tells the open connections to finish, without waiting for them: the
    /// returned task ends once they did. A boundary that retires a server (its partitions moved
    /// away) need not wait for that, since nothing it served is served from it any more.
    pub fn stop_in_background(mut self) -> Option<tokio::task::JoinHandle<()>> {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        self.task.take()
    }
}

/// Trains `app` in this process over real TCP: `servers` data-plane servers on 127.0.0.1 (the
/// partitions spread round-robin) and `config.workers` worker threads talking to them through the
/// same client code node processes use. For tests and benchmarks of the data plane.
pub fn run_loopback<A: App>(
    app: &A,
    config: &JobConfig,
    servers: u32,
    metrics: &RuntimeMetrics,
) -> Result<RunReport, RunError> {
    validate_config(config)?;
    let specs = app.tables();
    validate_tables(&specs)?;
    let cluster = |reason: String| RunError::RunCluster { reason };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| cluster(format!("starting the tokio runtime failed: {e}")))?;
    let owners: Vec<NodeId> = (0..servers.max(1)).collect();
    let map = PartitionMap::round_robin(config.partitions, &owners)
        .map_err(|e| cluster(e.to_string()))?;
    let secret = random_secret().into_bytes();
    let tls = crate::tls::JobTls::for_security(config.transport_security, &secret);
    let mut handles = Vec::new();
    let mut addrs = BTreeMap::new();
    for &node in &owners {
        let hosted: Vec<_> = map
            .owned_by(node)
            .into_iter()
            .map(|p| (p, map.entries()[p as usize].epoch))
            .collect();
        let state = Arc::new(ServerState::new(
            &hosted,
            config.partitions,
            &specs,
            config.workers as u32,
            config.optimizer,
            config.staleness == 0,
        ));
        let handle = ServerHandle::loopback(
            runtime.handle(),
            state,
            &secret,
            tls.clone(),
            config.wait_timeout,
            metrics,
        )
        .map_err(|e| cluster(format!("binding a loopback server failed: {e}")))?;
        addrs.insert(node, handle.addr);
        handles.push(handle);
    }
    let plan = WorkerPlan {
        worker_base: 0,
        local_workers: config.workers,
        total_workers: config.workers,
        map: map.clone(),
        addrs: addrs.clone(),
    };
    let client = ClientConfig {
        secret: secret.clone(),
        node: 0,
        max_frame_bytes: crate::frame::DEFAULT_MAX_FRAME_BYTES,
        timeout: config.wait_timeout,
        tls,
    };
    let run_start = Instant::now();
    let reports = run_workers(app, &specs, &plan, &client, config, metrics, run_start)?;
    let mut report = RunReport::from_workers(config.clocks, &reports);
    let snapshot = fetch_snapshot(&map, &addrs, &specs, &client)
        .map_err(|e| cluster(format!("fetching the final parameters failed: {e}")))?;
    report.parameter_bytes = handles
        .iter()
        .map(|h| h.state.parameter_bytes() as u64)
        .sum();
    report.finish(app, snapshot, config.keep_params);
    for handle in handles {
        handle.stop(runtime.handle());
    }
    Ok(report)
}

/// One segment for a [`WorkerPool`]: the clocks to run and where every partition lives.
#[derive(Debug, Clone)]
pub struct SegmentPlan {
    /// The clocks (shared by every worker of the segment).
    pub gate: Arc<ClockGate>,
    /// Partition owners and epochs.
    pub map: PartitionMap,
    /// Data-plane address of every owner.
    pub addrs: NodeAddrs,
    /// Every partition holds what it held at the end of the previous segment (moved or not, but
    /// not restored from a copy): a worker's cached rows stay valid across the boundary.
    pub carried: bool,
    /// Where the segment's workers record each clock they finish (for background BackupPS
    /// copies across node processes; `None`: nobody reads it).
    pub progress: Option<Arc<SegmentProgress>>,
    /// What a worker whose loss diverged does: end `gate` where it is every worker's of the job
    /// (one process), or only report it (a node process: the coordinator ends the segment).
    pub divergence_stop: DivergenceStop,
}

/// Worker threads that live across the segments of an elastic run: each keeps its data shard,
/// row cache and connections, registers only with servers that changed and pulls only what is
/// stale, so a segment boundary costs what actually moved. A pool may hold any subset of the
/// job's logical workers (a node process holds the ones assigned to it) and change it between
/// segments. Its threads share one [`ProcessCache`] (if the job does), kept across segments
/// while the pool's workers stay the same and nothing failed; a pool that stands for several
/// node processes ([`WorkerPool::set_nodes`]) keeps one per node.
pub struct WorkerPool {
    workers: BTreeMap<u32, PoolWorker>,
    report: std::sync::mpsc::Sender<(u32, Result<WorkerReport, RunError>)>,
    results: std::sync::mpsc::Receiver<(u32, Result<WorkerReport, RunError>)>,
    specs: Vec<TableSpec>,
    client: ClientConfig,
    config: JobConfig,
    metrics: RuntimeMetrics,
    run_start: Instant,
    /// The process caches of the last segment.
    shared: parking_lot::Mutex<Vec<Arc<ProcessCache>>>,
    /// The node each worker stands for (none set: all on one node, this process).
    nodes: parking_lot::Mutex<BTreeMap<u32, NodeId>>,
    segments: std::sync::atomic::AtomicU64,
    /// Connections opened for the pool's workers ahead of a switch (none: workers connect
    /// when a segment needs a server).
    pre_opened: Option<Arc<PreOpened>>,
    /// Watches every connection the workers' transports hold: severed, a worker blocked on a
    /// hung peer fails at once instead of at its read timeout.
    severance: Arc<Severance>,
}

/// One thread of a [`WorkerPool`].
struct PoolWorker {
    command: std::sync::mpsc::Sender<PoolSegment>,
    thread: std::thread::JoinHandle<()>,
    working_set: WorkingSet,
}

/// What a pool thread runs next.
struct PoolSegment {
    plan: SegmentPlan,
    shared: Option<Arc<ProcessCache>>,
    seq: u64,
    registered: Arc<Registered>,
}

/// Holds a pool's workers back until every one of them registered for the segment: a process
/// cache whose members changed registers new batches with partitions that did not move, and a
/// BSP push of the segment's first clock must wait for the new batch's read (a registration
/// resets it), not slip in before the registration.
#[derive(Debug)]
struct Registered {
    expected: usize,
    state: parking_lot::Mutex<(usize, bool)>,
    changed: parking_lot::Condvar,
}

impl Registered {
    fn new(expected: usize) -> Self {
        Self {
            expected,
            state: parking_lot::Mutex::new((0, false)),
            changed: parking_lot::Condvar::new(),
        }
    }

    /// Records this worker's registration (`ok`) and waits for the others; false if any failed
    /// or `timeout` passed.
    fn arrive(&self, ok: bool, timeout: std::time::Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut state = self.state.lock();
        state.0 += 1;
        state.1 |= !ok;
        self.changed.notify_all();
        while state.0 < self.expected && !state.1 {
            if self.changed.wait_until(&mut state, deadline).timed_out() {
                return false;
            }
        }
        !state.1
    }
}

impl WorkerPool {
    /// Starts `config.workers` worker threads (global ids `0..`), idle until the first segment.
    /// Their transports take connections from `pre_opened` where one waits for them (see
    /// [`PreOpened`]).
    pub fn start<A: App>(
        app: &A,
        specs: &[TableSpec],
        client: &ClientConfig,
        config: &JobConfig,
        metrics: &RuntimeMetrics,
        run_start: Instant,
        pre_opened: Option<Arc<PreOpened>>,
    ) -> Result<Self, RunError> {
        let mut pool = Self::empty(specs, client, config, metrics, run_start);
        pool.pre_opened = pre_opened;
        // One process holds every worker: its groups' registrations are ordered by
        // [`Registered`], so they may share process caches.
        pool.config.process_cache = config.process_cache;
        let all: Vec<u32> = (0..config.workers as u32).collect();
        pool.ensure(app, &all)?;
        Ok(pool)
    }

    /// A pool with no worker yet, for a node process that the coordinator assigns workers
    /// (`ensure`). Its threads keep per-thread caches: when a segment changes which workers a
    /// process holds, the group's new union batch must be registered with every server before
    /// any member reads under the group's identity, and across processes nothing orders that
    /// registration against another process's reads and partition installs yet (`ebbflow
    /// run`'s stormy schedule hit it as a `lookup_batch` refusal). [`WorkerPool::start`], one
    /// process holding every worker, shares.
    pub fn empty(
        specs: &[TableSpec],
        client: &ClientConfig,
        config: &JobConfig,
        metrics: &RuntimeMetrics,
        run_start: Instant,
    ) -> Self {
        let (report, results) = std::sync::mpsc::channel();
        Self {
            workers: BTreeMap::new(),
            report,
            results,
            specs: specs.to_vec(),
            client: client.clone(),
            config: JobConfig {
                process_cache: false,
                ..config.clone()
            },
            metrics: metrics.clone(),
            run_start,
            shared: parking_lot::Mutex::new(Vec::new()),
            nodes: parking_lot::Mutex::new(BTreeMap::new()),
            segments: std::sync::atomic::AtomicU64::new(0),
            pre_opened: None,
            severance: Arc::default(),
        }
    }

    /// Its workers' transports take connections from `stash` where one waits for them (see
    /// [`PreOpened`]).
    pub fn with_pre_opened(mut self, stash: Arc<PreOpened>) -> Self {
        self.pre_opened = Some(stash);
        self
    }

    /// What cuts every connection of the pool's workers ([`Severance::sever`]).
    pub fn severance(&self) -> Arc<Severance> {
        self.severance.clone()
    }

    /// The logical workers held, ascending.
    pub fn ids(&self) -> Vec<u32> {
        self.workers.keys().copied().collect()
    }

    /// Holds exactly the workers `ids` (of the job's `config.workers`): starts the missing ones,
    /// stops the others.
    pub fn ensure<A: App>(&mut self, app: &A, ids: &[u32]) -> Result<(), RunError> {
        self.ensure_with(app, ids, |_| None).map(|_| ())
    }

    /// As [`WorkerPool::ensure`], starting a missing worker from `preloaded(worker)` (its data
    /// shard loaded beforehand) when that has one. Returns the workers started, and how many of
    /// them from a preloaded shard.
    pub fn ensure_with<A: App>(
        &mut self,
        app: &A,
        ids: &[u32],
        mut preloaded: impl FnMut(u32) -> Option<A::Worker>,
    ) -> Result<(u32, u32), RunError> {
        let (mut started, mut from_preloaded) = (0, 0);
        let wanted: std::collections::BTreeSet<u32> = ids.iter().copied().collect();
        let gone: Vec<u32> = self
            .workers
            .keys()
            .copied()
            .filter(|w| !wanted.contains(w))
            .collect();
        for worker in gone {
            if let Some(held) = self.workers.remove(&worker) {
                drop(held.command);
                let _ = held.thread.join();
            }
        }
        for &worker in &wanted {
            if self.workers.contains_key(&worker) {
                continue;
            }
            if worker as usize >= self.config.workers {
                return Err(RunError::JoinWorker { worker });
            }
            let shard = preloaded(worker);
            let source = if shard.is_some() {
                from_preloaded += 1;
                "preloaded"
            } else {
                "built"
            };
            let spawned = self.spawn(app, worker, shard)?;
            self.metrics.shard_loads.with_label_values(&[source]).inc();
            self.workers.insert(worker, spawned);
            started += 1;
        }
        Ok((started, from_preloaded))
    }

    fn spawn<A: App>(
        &self,
        app: &A,
        worker: u32,
        shard: Option<A::Worker>,
    ) -> Result<PoolWorker, RunError> {
        let app_worker = shard.unwrap_or_else(|| app.worker(worker as usize, self.config.workers));
        let working_set = app_worker.working_set();
        let (command, segments) = std::sync::mpsc::channel::<PoolSegment>();
        let (specs, client, config, metrics, report, run_start, set) = (
            self.specs.clone(),
            self.client.clone(),
            self.config.clone(),
            self.metrics.clone(),
            self.report.clone(),
            self.run_start,
            working_set.clone(),
        );
        let pre_opened = self.pre_opened.clone().map(|stash| (worker, stash));
        let severance = self.severance.clone();
        let thread = std::thread::Builder::new()
            .name(format!("worker-{worker}"))
            .spawn(move || {
                let fail = |source: WorkerError| RunError::RunWorker { worker, source };
                let mut state = match crate::worker::WorkerLoop::new(
                    worker,
                    app_worker,
                    &set,
                    &specs,
                    config.partitions,
                ) {
                    Ok(state) => Some(state),
                    Err(error) => {
                        let _ = report.send((worker, Err(fail(error))));
                        None
                    }
                };
                drop(set);
                let mut transport: Option<RemoteTransport> = None;
                while let Ok(segment) = segments.recv() {
                    let PoolSegment {
                        plan,
                        shared,
                        seq,
                        registered,
                    } = segment;
                    let Some(worker_loop) = state.as_mut() else {
                        registered.arrive(false, config.wait_timeout);
                        if let Some(cache) = &shared {
                            cache.fail(format!("worker {worker} has no state"));
                        }
                        let _ = report.send((worker, Err(RunError::JoinWorker { worker })));
                        continue;
                    };
                    let mut prepare = || {
                        let changed = match transport.as_mut() {
                            Some(transport) => Some(
                                transport
                                    .retarget(&plan.map, &plan.addrs)
                                    .map_err(|e| fail(e.into()))?,
                            ),
                            None => {
                                transport = Some(
                                    RemoteTransport::connect_as(
                                        &plan.map,
                                        &plan.addrs,
                                        &client,
                                        pre_opened.clone(),
                                        Some(severance.clone()),
                                    )
                                    .map_err(|e| fail(e.into()))?,
                                );
                                None
                            }
                        };
                        let transport = transport.as_mut().expect("connected above");
                        let alone_before = worker_loop.is_alone();
                        worker_loop.attach(shared.as_ref());
                        match &shared {
                            Some(cache) => cache
                                .begin_segment(
                                    transport,
                                    seq,
                                    plan.gate.first(),
                                    &routes_of(&plan.map, &plan.addrs),
                                )
                                .map_err(fail),
                            // Back on its own after sharing: its server batches are the group's.
                            // Nothing carried (a rollback): every partition was restored from a
                            // copy, which holds no registration, even one that came back at the
                            // route the worker had (same server, same epoch).
                            None if !alone_before || !plan.carried => worker_loop
                                .register(transport, None, plan.carried)
                                .map_err(fail),
                            None => worker_loop
                                .register(transport, changed.as_deref(), plan.carried)
                                .map_err(fail),
                        }
                    };
                    let prepared = prepare();
                    let everyone = registered.arrive(prepared.is_ok(), config.wait_timeout);
                    let outcome = prepared.and_then(|()| {
                        if !everyone {
                            return Err(fail(WorkerError::PeerFailed {
                                reason: "another worker of this pool did not register".into(),
                            }));
                        }
                        let transport = transport.as_mut().expect("connected when prepared");
                        worker_loop
                            .run(
                                transport,
                                &config,
                                &plan.gate,
                                false,
                                &metrics,
                                run_start,
                                plan.progress.as_deref(),
                                plan.divergence_stop,
                            )
                            .map_err(fail)
                    });
                    if let Err(error) = &outcome {
                        tracing::warn!(worker, %error, "a worker's segment failed");
                        // Its connections may be mid-exchange: start clean next time.
                        transport = None;
                        if let Some(cache) = &shared {
                            cache.fail(error.to_string());
                        }
                    }
                    if report.send((worker, outcome)).is_err() {
                        return;
                    }
                }
            })
            .map_err(|_| RunError::JoinWorker { worker })?;
        Ok(PoolWorker {
            command,
            thread,
            working_set,
        })
    }

    /// Says which node each worker stands for from the next segment on: the in-process fleet
    /// simulates node processes with one pool, and the workers of one node (only) share a
    /// process cache, as they would in a node process. Workers not named are on node 0.
    pub fn set_nodes(&self, nodes: BTreeMap<u32, NodeId>) {
        *self.nodes.lock() = nodes;
    }

    /// The process cache of each worker for the next segment: per node, the current one while
    /// that node's workers are its members and nothing failed, else a new one (or none, if the
    /// job does not share).
    fn shared_caches(&self) -> BTreeMap<u32, Arc<ProcessCache>> {
        let nodes = self.nodes.lock().clone();
        let mut by_node: BTreeMap<NodeId, Vec<(u32, &WorkingSet)>> = BTreeMap::new();
        for (id, held) in &self.workers {
            let node = nodes.get(id).copied().unwrap_or(0);
            by_node
                .entry(node)
                .or_default()
                .push((*id, &held.working_set));
        }
        let mut shared = self.shared.lock();
        let mut kept = Vec::new();
        let mut caches = BTreeMap::new();
        for members in by_node.values() {
            let ids = members.iter().map(|(id, _)| id);
            let cache = shared
                .iter()
                .find(|cache| !cache.failed() && cache.members().iter().eq(ids.clone()))
                .cloned()
                .or_else(|| process_cache_for(&self.config, &self.specs, members));
            if let Some(cache) = cache {
                for (id, _) in members {
                    caches.insert(*id, cache.clone());
                }
                kept.push(cache);
            }
        }
        *shared = kept;
        caches
    }

    /// Runs one segment on every worker held; returns their reports in worker order.
    pub fn run_segment(&self, plan: &SegmentPlan) -> Result<Vec<WorkerReport>, RunError> {
        let caches = self.shared_caches();
        let seq = self
            .segments
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            + 1;
        let registered = Arc::new(Registered::new(self.workers.len()));
        for (&worker, held) in &self.workers {
            let shared = caches.get(&worker).cloned();
            let segment = PoolSegment {
                plan: plan.clone(),
                shared: shared.clone(),
                seq,
                registered: registered.clone(),
            };
            if held.command.send(segment).is_err() {
                registered.arrive(false, std::time::Duration::ZERO);
                if let Some(cache) = &shared {
                    cache.fail(format!("worker {worker} is gone"));
                }
                return Err(RunError::JoinWorker { worker });
            }
        }
        let mut reports: BTreeMap<u32, WorkerReport> = BTreeMap::new();
        let mut first_error = None;
        for _ in 0..self.workers.len() {
            let (worker, outcome) = self
                .results
                .recv()
                .map_err(|_| RunError::JoinWorker { worker: u32::MAX })?;
            match outcome {
                Ok(report) => {
                    reports.insert(worker, report);
                }
                Err(error) => {
                    first_error.get_or_insert(error);
                }
            }
        }
        if let Some(error) = first_error {
            return Err(error);
        }
        Ok(reports.into_values().collect())
    }

    /// Stops the threads and waits for them.
    pub fn stop(self) {
        for (_, held) in self.workers {
            drop(held.command);
            let _ = held.thread.join();
        }
    }
}
