//! What the runtime's progress says about the bidder's application model: samples of a running
//! job and its capacity events turned into [`Measurement`]s for the
//! [`Calibrator`](crate::bidder::Calibrator). One probe serves `ebbflow run` (a sample per
//! replayed slot, events from the replay) and the operator (a sample per BidBrain decision, events
//! from its decisions and the pods it observes: `controller::calibration`).
//!
//! **Units.** Work is clocks, the unit of the bidder's `remaining_work`. A rate is per market
//! second (wall seconds × `speed`: `--speed` in `ebbflow run`, the operator's trace speed, 1 on a
//! live market), the bidder's clock, so the measured ν is clocks per vCPU per market second: the
//! bidder must see how much work an hour of its market buys. The durations σ and λ are wall
//! seconds: they are what the runtime itself takes to switch a node in or to recover from an
//! eviction, which a real deployment (where market time is wall time) would see too. A replay's
//! acceleration does not speed the runtime up, so in trace seconds a join at `--speed 12000`
//! would take hours, and a bidder told so stops buying spot capacity: the run would learn from
//! its own fast-forward instead of from the runtime.
//!
//! **Progress** is the runtime's consistent clock (the clock every partition holds at the last
//! segment boundary or background BackupPS copy): it moves every few clocks in every stage,
//! while the iteration counter of a run with node processes moves only when a segment ends (a
//! stage-2 segment lasts from one membership event to the next), and it falls back on a
//! rollback, so redone clocks are not counted twice.
//!
//! - **Steady** (ν, φ): progress over an interval whose footprint (ready nodes per tier, their
//!   vCPUs, the stage) did not change, with no rollback and no eviction stall open. Both ends
//!   are samples at which progress moved, so the runtime's lumpy progress does not bias the
//!   rate, and an interval starts at the second such sample after a change, so the switch
//!   itself is left out. An interval is measured once it spans `min_clocks` and
//!   `min_wall_seconds`, then the next one starts; shorter remainders are dropped.
//! - **Addition** (σ): from the sample an allocation was bought at until the runtime has switched
//!   in all its instances (joins, the runtime's count of transient nodes switched in or else the
//!   ready count's rises, are credited to allocations in the order they were bought). Not
//!   measured if it leaves first.
//! - **Eviction** (λ): from the notice (or the eviction, without one) of an allocation with a
//!   ready node until progress passes both the clock before it and the clock at which the
//!   runtime dropped the node (a smaller ready count, or a rollback): the pause and any clocks
//!   redone. One stall at a time; evictions during one are part of it.
//!
//! Additions and stalls not over within `max_wait_wall_seconds` are dropped. The resolution of
//! every measurement is one sample.

use std::collections::{BTreeSet, VecDeque};

use super::Measurement;

/// Weight of a new measurement in the [`Calibrator`](crate::bidder::Calibrator) that `ebbflow run`
/// and the operator feed the probe's measurements to, once each term has five (before, a running
/// mean with the spec's value as one measurement).
pub const CALIBRATION_WEIGHT: f64 = 0.2;

/// A change of the job's capacity between two samples.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ProbeEvent {
    /// `count` instances were bought as allocation `allocation`.
    Acquired {
        /// Allocation id (unique within the probe's job).
        allocation: u64,
        /// Instances.
        count: u32,
    },
    /// The allocation was running before the probe started (an operator that restarted finds
    /// its pods): its nodes count as ready, no σ is measured for it.
    Adopted {
        /// Allocation id.
        allocation: u64,
    },
    /// The bidder released the allocation.
    Released {
        /// Allocation id.
        allocation: u64,
    },
    /// The bidder released `count` of the allocation's instances; the rest stay.
    Shrunk {
        /// Allocation id.
        allocation: u64,
        /// Instances released.
        count: u32,
    },
    /// The provider announced it takes the allocation back.
    Notice {
        /// Allocation id.
        allocation: u64,
    },
    /// The allocation was taken back.
    Evicted {
        /// Allocation id.
        allocation: u64,
    },
}

/// When the probe measures.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ProbeSettings {
    /// Market seconds per wall second (`--speed`; 1 on a live market).
    pub speed: f64,
    /// Fewest clocks of progress in a steady interval.
    pub min_clocks: u64,
    /// Fewest wall seconds in a steady interval (sampling jitter is tens of milliseconds).
    pub min_wall_seconds: f64,
    /// An addition or stall not over after this many wall seconds is dropped (a node that
    /// never joins, a count that never drops).
    pub max_wait_wall_seconds: f64,
}

impl ProbeSettings {
    /// The defaults at `speed`: steady intervals of at least 20 clocks and half a wall second;
    /// additions and stalls dropped after 120 wall seconds (the runtime's join timeout).
    pub fn new(speed: f64) -> Self {
        Self {
            speed,
            min_clocks: 20,
            min_wall_seconds: 0.5,
            max_wait_wall_seconds: 120.0,
        }
    }
}

/// One sample of a running job.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Observation {
    /// Wall seconds since the start.
    pub wall_seconds: f64,
    /// The runtime's consistent clock.
    pub clocks: u64,
    /// Rollbacks so far.
    pub rollbacks: u64,
    /// AgileML stage (reliable nodes run no workers in stage 3).
    pub stage: u8,
    /// Ready reliable nodes.
    pub reliable_nodes: u32,
    /// Ready transient nodes.
    pub transient_nodes: u32,
    /// vCPUs of the ready reliable nodes.
    pub reliable_vcpus: f64,
    /// vCPUs of the ready transient nodes.
    pub transient_vcpus: f64,
    /// Transient nodes the runtime switched in since the previous sample, when it counts them
    /// (its `transient_nodes_added`); else the rise of `transient_nodes` stands for them, which
    /// misses joins while other nodes leave.
    pub joined: Option<u32>,
}

impl Observation {
    /// What a steady interval must keep.
    fn footprint(&self) -> (u8, u32, u32, u64, u64) {
        (
            self.stage,
            self.reliable_nodes,
            self.transient_nodes,
            self.reliable_vcpus.to_bits(),
            self.transient_vcpus.to_bits(),
        )
    }

    /// vCPUs of reliable nodes that run workers.
    fn working_reliable_vcpus(&self) -> f64 {
        if self.stage >= 3 {
            0.0
        } else {
            self.reliable_vcpus
        }
    }
}

/// A point an interval starts from.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Mark {
    wall_seconds: f64,
    clocks: u64,
}

/// An allocation bought and not yet all ready.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Pending {
    allocation: u64,
    waiting_for: u32,
    since_wall: f64,
}

/// An eviction whose stall is being timed.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Stall {
    since_wall: f64,
    /// The sample before the notice or eviction.
    before: Observation,
    /// Progress when the runtime dropped the node.
    dropped_at: Option<u64>,
}

/// Turns samples and replay events into measurements (see the module docs). Pure: time is what
/// the samples say.
#[derive(Clone, Debug)]
pub struct ThroughputProbe {
    settings: ProbeSettings,
    last: Option<Observation>,
    interval: Option<Mark>,
    pending: VecDeque<Pending>,
    /// Allocations with at least one ready node.
    working: BTreeSet<u64>,
    /// Allocations whose notice started (or fell into) a stall: their eviction does not.
    noticed: BTreeSet<u64>,
    stall: Option<Stall>,
}

impl ThroughputProbe {
    /// A probe with nothing seen yet.
    pub fn new(settings: ProbeSettings) -> Self {
        Self {
            settings,
            last: None,
            interval: None,
            pending: VecDeque::new(),
            working: BTreeSet::new(),
            noticed: BTreeSet::new(),
            stall: None,
        }
    }

    /// Takes the sample `now` and the `events` since the previous sample; returns what it
    /// measured.
    pub fn observe(&mut self, now: &Observation, events: &[ProbeEvent]) -> Vec<Measurement> {
        let mut measured = Vec::new();
        let sane = |x: f64| x.is_finite() && x >= 0.0;
        if !(sane(now.wall_seconds) && sane(now.reliable_vcpus) && sane(now.transient_vcpus))
            || self
                .last
                .is_some_and(|last| now.wall_seconds < last.wall_seconds)
        {
            return measured;
        }
        let last = self.last.replace(*now);
        // joins belong to allocations bought before this sample
        let joined = now
            .joined
            .or_else(|| last.map(|last| now.transient_nodes.saturating_sub(last.transient_nodes)));
        if let Some(joined) = joined {
            self.credit_joins(joined, now.wall_seconds, &mut measured);
        }
        let before = last.unwrap_or(*now);
        for event in events {
            self.event(event, &before, now.wall_seconds);
        }
        self.follow_stall(now, &mut measured);
        if let Some(last) = &last {
            self.follow_steady(last, now, &mut measured);
        }
        self.expire(now.wall_seconds);
        measured
    }

    /// Takes `events` that happened at the last sample (decisions made right after it);
    /// returns false, taking nothing, before the first sample.
    pub fn events_at_last(&mut self, events: &[ProbeEvent]) -> bool {
        let Some(last) = self.last else {
            return false;
        };
        for event in events {
            self.event(event, &last, last.wall_seconds);
        }
        true
    }

    fn trace_seconds(&self, wall_seconds: f64) -> f64 {
        wall_seconds * self.settings.speed
    }

    fn credit_joins(&mut self, mut joined: u32, wall: f64, measured: &mut Vec<Measurement>) {
        while joined > 0 {
            let Some(front) = self.pending.front_mut() else {
                // a rise nobody waits for (an instance replaced, a count that had dipped)
                return;
            };
            let credited = joined.min(front.waiting_for);
            front.waiting_for -= credited;
            joined -= credited;
            self.working.insert(front.allocation);
            if front.waiting_for == 0 {
                let since = front.since_wall;
                self.pending.pop_front();
                measured.push(Measurement::Addition {
                    seconds: wall - since,
                });
            }
        }
    }

    fn event(&mut self, event: &ProbeEvent, before: &Observation, wall: f64) {
        match *event {
            ProbeEvent::Acquired { allocation, count } => {
                if count > 0 {
                    self.pending.push_back(Pending {
                        allocation,
                        waiting_for: count,
                        since_wall: wall,
                    });
                }
            }
            ProbeEvent::Adopted { allocation } => {
                self.working.insert(allocation);
            }
            ProbeEvent::Released { allocation } => self.forget(allocation),
            ProbeEvent::Shrunk { allocation, count } => {
                // released instances that had not joined yet will not: the addition is timed
                // by the rest, and not at all if none is left to wait for
                for pending in self
                    .pending
                    .iter_mut()
                    .filter(|p| p.allocation == allocation)
                {
                    pending.waiting_for = pending.waiting_for.saturating_sub(count);
                }
                self.pending.retain(|p| p.waiting_for > 0);
            }
            ProbeEvent::Notice { allocation } => {
                self.noticed.insert(allocation);
                self.leaving(allocation, before, wall);
            }
            ProbeEvent::Evicted { allocation } => {
                if !self.noticed.remove(&allocation) {
                    self.leaving(allocation, before, wall);
                }
                self.forget(allocation);
            }
        }
    }

    /// `allocation` is going: a stall starts if it had a ready node and none is being timed.
    fn leaving(&mut self, allocation: u64, before: &Observation, wall: f64) {
        let had_ready_node = self.working.contains(&allocation);
        self.pending.retain(|p| p.allocation != allocation);
        if had_ready_node && self.stall.is_none() {
            self.stall = Some(Stall {
                since_wall: wall,
                before: *before,
                dropped_at: None,
            });
        }
    }

    fn forget(&mut self, allocation: u64) {
        self.pending.retain(|p| p.allocation != allocation);
        self.working.remove(&allocation);
        self.noticed.remove(&allocation);
    }

    fn follow_stall(&mut self, now: &Observation, measured: &mut Vec<Measurement>) {
        let Some(stall) = &mut self.stall else {
            return;
        };
        match stall.dropped_at {
            None => {
                if now.transient_nodes < stall.before.transient_nodes
                    || now.rollbacks > stall.before.rollbacks
                {
                    stall.dropped_at = Some(now.clocks);
                }
            }
            Some(dropped_at) => {
                if now.clocks > dropped_at.max(stall.before.clocks) {
                    let since = stall.since_wall;
                    self.stall = None;
                    measured.push(Measurement::Eviction {
                        seconds: now.wall_seconds - since,
                    });
                } else {
                    // a rollback after the drop: the clocks it lost are redone inside the stall
                    stall.dropped_at = Some(dropped_at.min(now.clocks));
                }
            }
        }
    }

    fn follow_steady(
        &mut self,
        last: &Observation,
        now: &Observation,
        measured: &mut Vec<Measurement>,
    ) {
        let unsteady = now.clocks < last.clocks
            || now.joined.is_some_and(|joined| joined > 0)
            || now.rollbacks != last.rollbacks
            || now.footprint() != last.footprint()
            || self.stall.is_some();
        if unsteady {
            self.interval = None;
            return;
        }
        if now.clocks == last.clocks {
            return;
        }
        let mark = Mark {
            wall_seconds: now.wall_seconds,
            clocks: now.clocks,
        };
        let Some(start) = self.interval else {
            self.interval = Some(mark);
            return;
        };
        let clocks = now.clocks - start.clocks;
        let wall = now.wall_seconds - start.wall_seconds;
        if clocks < self.settings.min_clocks || wall < self.settings.min_wall_seconds {
            return;
        }
        self.interval = Some(mark);
        let reliable_vcpus = now.working_reliable_vcpus();
        if reliable_vcpus + now.transient_vcpus <= 0.0 {
            return;
        }
        measured.push(Measurement::Steady {
            reliable_vcpus,
            transient_vcpus: now.transient_vcpus,
            work_per_second: clocks as f64 / self.trace_seconds(wall),
        });
    }

    fn expire(&mut self, wall: f64) {
        let limit = self.settings.max_wait_wall_seconds;
        self.pending.retain(|p| wall - p.since_wall <= limit);
        if self.stall.is_some_and(|s| wall - s.since_wall > limit) {
            self.stall = None;
        }
    }
}

/// The additions and eviction stalls of `measured` (the delay measurements, without the steady
/// throughput ones).
pub fn delays(measured: &[Measurement]) -> Vec<Measurement> {
    measured
        .iter()
        .copied()
        .filter(|m| !matches!(m, Measurement::Steady { .. }))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const SPEED: f64 = 360.0;

    /// A run sampled every `step` wall seconds; the footprint is set by the test.
    struct Run {
        probe: ThroughputProbe,
        now: Observation,
        step: f64,
        measured: Vec<Measurement>,
    }

    impl Run {
        /// One reliable node of 8 vCPUs, stage 1, sampled every 1/8 s (exact in binary).
        fn new() -> Self {
            Self {
                probe: ThroughputProbe::new(ProbeSettings::new(SPEED)),
                now: Observation {
                    stage: 1,
                    reliable_nodes: 1,
                    reliable_vcpus: 8.0,
                    ..Observation::default()
                },
                step: 0.125,
                measured: Vec::new(),
            }
        }

        fn transient(mut self, nodes: u32) -> Self {
            self.now.transient_nodes = nodes;
            self.now.transient_vcpus = 8.0 * f64::from(nodes);
            self
        }

        /// Advances one sample with `clocks` more progress and `events` in its slot.
        fn sample(&mut self, clocks: u64, events: &[ProbeEvent]) -> &mut Self {
            self.now.wall_seconds += self.step;
            self.now.clocks += clocks;
            let measured = self.probe.observe(&self.now, events);
            self.measured.extend(measured);
            self
        }

        fn samples(&mut self, count: usize, clocks: u64) -> &mut Self {
            for _ in 0..count {
                self.sample(clocks, &[]);
            }
            self
        }

        fn steady(&self) -> Vec<(f64, f64, f64)> {
            self.measured
                .iter()
                .filter_map(|m| match *m {
                    Measurement::Steady {
                        reliable_vcpus,
                        transient_vcpus,
                        work_per_second,
                    } => Some((reliable_vcpus, transient_vcpus, work_per_second)),
                    _ => None,
                })
                .collect()
        }

        fn delays(&self) -> Vec<Measurement> {
            delays(&self.measured)
        }
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-9 * b.abs().max(1.0)
    }

    fn acquired(allocation: u64, count: u32) -> ProbeEvent {
        ProbeEvent::Acquired { allocation, count }
    }

    #[test]
    fn a_steady_footprint_is_measured_in_clocks_per_trace_second() {
        let mut run = Run::new();
        // 5 clocks every 1/8 s: 40 clocks per wall second, 40/360 per trace second
        run.samples(30, 5);
        let steady = run.steady();
        // the first sample starts no interval (nothing to compare), the second starts one, then
        // one ends every 0.5 s (20 clocks)
        assert_eq!(steady.len(), 7, "{steady:?}");
        for (reliable, transient, rate) in steady {
            assert_eq!((reliable, transient), (8.0, 0.0));
            assert!(close(rate, 40.0 / SPEED), "{rate}");
        }
        assert!(run.delays().is_empty());
    }

    #[test]
    fn lumpy_progress_is_measured_between_the_samples_where_it_moved() {
        let mut run = Run::new().transient(2);
        // the runtime reports 40 clocks at once every second
        for _ in 0..6 {
            run.samples(7, 0).sample(40, &[]);
        }
        let steady = run.steady();
        assert_eq!(steady.len(), 5, "{steady:?}");
        for (reliable, transient, rate) in steady {
            assert_eq!((reliable, transient), (8.0, 16.0));
            assert!(close(rate, 40.0 / SPEED), "{rate}");
        }
    }

    #[test]
    fn a_footprint_change_leaves_the_switch_out() {
        let mut run = Run::new();
        run.samples(10, 5);
        let before = run.steady().len();
        // the switch: two transient nodes, 1.25 s without progress, then 80 clocks per second
        run.now.transient_nodes = 2;
        run.now.transient_vcpus = 16.0;
        run.samples(10, 0).samples(12, 10);
        let after: Vec<_> = run.steady().into_iter().skip(before).collect();
        assert!(!after.is_empty());
        for (_, transient, rate) in after {
            assert_eq!(transient, 16.0);
            assert!(close(rate, 80.0 / SPEED), "{rate}");
        }
    }

    #[test]
    fn short_intervals_and_stage_3_reliable_nodes() {
        // 1 clock per sample: 15 samples hold fewer than 20 clocks
        let mut run = Run::new();
        run.samples(15, 1);
        assert!(run.steady().is_empty(), "{:?}", run.steady());
        // fast progress but under half a second between changes: nothing
        let mut run = Run::new();
        for nodes in 0..6 {
            run.now.transient_nodes = nodes;
            run.samples(4, 20);
        }
        assert!(run.steady().is_empty(), "{:?}", run.steady());
        // stage 3: the reliable nodes' vCPUs run no workers
        let mut run = Run::new().transient(16);
        run.now.stage = 3;
        run.samples(10, 5);
        assert!(run.steady().iter().all(|s| s.0 == 0.0 && s.1 == 128.0));
        assert!(!run.steady().is_empty());
    }

    #[test]
    fn an_addition_is_timed_until_all_its_nodes_are_ready() {
        let mut run = Run::new();
        run.sample(5, &[])
            .sample(5, &[acquired(1, 2), acquired(2, 1)]);
        let bought = run.now.wall_seconds;
        run.samples(4, 5);
        run.now.transient_nodes = 1;
        run.samples(5, 5);
        // allocation 1 has one of its two nodes: nothing yet
        assert!(run.delays().is_empty());
        run.now.transient_nodes = 3;
        run.sample(5, &[]);
        let ready = run.now.wall_seconds;
        let expected = ready - bought;
        assert_eq!(run.delays().len(), 2, "{:?}", run.delays());
        for delay in run.delays() {
            let Measurement::Addition { seconds } = delay else {
                panic!("{delay:?}");
            };
            assert!(close(seconds, expected), "{seconds} vs {expected}");
        }
    }

    #[test]
    fn an_allocation_that_leaves_before_it_is_ready_measures_nothing() {
        let mut run = Run::new();
        run.sample(5, &[acquired(1, 1)]).samples(3, 5);
        run.sample(5, &[ProbeEvent::Evicted { allocation: 1 }]);
        run.sample(5, &[acquired(2, 1)]);
        run.sample(5, &[ProbeEvent::Released { allocation: 2 }]);
        // a rise now belongs to nobody
        run.now.transient_nodes = 1;
        run.samples(5, 5);
        assert!(run.delays().is_empty(), "{:?}", run.delays());
    }

    #[test]
    fn an_addition_cut_before_it_joined_is_timed_by_the_rest_or_not_at_all() {
        // 3 bought, 2 of them released (maxNodes lowered) before any joined: the addition is
        // complete when the one left joins
        let mut run = Run::new();
        run.sample(5, &[]).sample(5, &[acquired(1, 3)]);
        let bought = run.now.wall_seconds;
        run.samples(2, 5).sample(
            5,
            &[ProbeEvent::Shrunk {
                allocation: 1,
                count: 2,
            }],
        );
        run.now.transient_nodes = 1;
        run.sample(5, &[]);
        let expected = run.now.wall_seconds - bought;
        assert_eq!(run.delays().len(), 1, "{:?}", run.delays());
        let Measurement::Addition { seconds } = run.delays()[0] else {
            panic!("{:?}", run.delays());
        };
        assert!(close(seconds, expected), "{seconds} vs {expected}");
        // all of them cut: nothing is waited for, and a later rise is credited to nobody
        let mut run = Run::new();
        run.sample(5, &[]).sample(5, &[acquired(1, 2)]);
        run.sample(
            5,
            &[ProbeEvent::Shrunk {
                allocation: 1,
                count: 2,
            }],
        );
        run.now.transient_nodes = 2;
        run.samples(3, 5);
        assert!(run.delays().is_empty(), "{:?}", run.delays());
    }

    #[test]
    fn additions_that_never_complete_expire() {
        let mut run = Run::new();
        run.step = 10.0;
        run.sample(5, &[acquired(1, 1)]).samples(13, 5);
        run.now.transient_nodes = 1;
        run.sample(5, &[]);
        assert!(run.delays().is_empty(), "{:?}", run.delays());
    }

    #[test]
    fn an_eviction_stall_lasts_until_progress_passes_the_clock_before_it() {
        let mut run = Run::new();
        run.sample(5, &[acquired(1, 1)]);
        run.now.transient_nodes = 1;
        run.now.transient_vcpus = 8.0;
        run.samples(5, 5);
        let clock_before = run.now.clocks;
        run.sample(0, &[ProbeEvent::Evicted { allocation: 1 }]);
        let evicted = run.now.wall_seconds;
        // the runtime rolls back 10 clocks and drops the node
        run.now.transient_nodes = 0;
        run.now.transient_vcpus = 0.0;
        run.now.rollbacks = 1;
        run.now.clocks -= 10;
        run.sample(0, &[]).samples(2, 5);
        assert_eq!(run.now.clocks, clock_before);
        // redone, not yet past: still stalled
        assert_eq!(run.delays().len(), 1, "{:?}", run.delays());
        run.sample(5, &[]);
        let over = run.now.wall_seconds;
        let delays = run.delays();
        assert_eq!(delays.len(), 2, "{delays:?}");
        assert!(matches!(delays[0], Measurement::Addition { .. }));
        let Measurement::Eviction { seconds } = delays[1] else {
            panic!("{delays:?}");
        };
        assert!(close(seconds, over - evicted), "{seconds}");
        // no steady interval spans the stall
        let steady_during = run.steady();
        assert!(steady_during.iter().all(|s| close(s.2, 40.0 / SPEED)));
    }

    #[test]
    fn a_noticed_eviction_is_timed_from_its_notice_once() {
        let mut run = Run::new();
        run.sample(5, &[acquired(1, 1), acquired(2, 1)]);
        run.now.transient_nodes = 2;
        run.now.transient_vcpus = 16.0;
        run.samples(5, 5);
        run.sample(5, &[ProbeEvent::Notice { allocation: 1 }]);
        let noticed = run.now.wall_seconds;
        // the segment ends at the notice (its clocks arrive), then the node is dropped
        run.sample(10, &[]);
        run.now.transient_nodes = 1;
        run.now.transient_vcpus = 8.0;
        run.sample(0, &[ProbeEvent::Evicted { allocation: 1 }]);
        // a second eviction during the stall is part of it
        run.sample(0, &[ProbeEvent::Evicted { allocation: 2 }]);
        run.sample(5, &[]);
        let over = run.now.wall_seconds;
        let evictions: Vec<f64> = run
            .delays()
            .into_iter()
            .filter_map(|m| match m {
                Measurement::Eviction { seconds } => Some(seconds),
                _ => None,
            })
            .collect();
        assert_eq!(evictions.len(), 1, "{:?}", run.delays());
        assert!(close(evictions[0], over - noticed));
        // allocation 2's eviction fell into the stall and is forgotten: nothing follows
        run.samples(5, 5);
        assert_eq!(run.delays().len(), 3, "{:?}", run.delays());
    }

    #[test]
    fn nonsense_samples_are_ignored() {
        let mut run = Run::new();
        run.samples(10, 5);
        let count = run.measured.len();
        let mut nonsense = run.now;
        nonsense.wall_seconds = f64::NAN;
        assert!(run.probe.observe(&nonsense, &[]).is_empty());
        nonsense.wall_seconds = 0.0; // before the last sample
        nonsense.clocks += 1000;
        assert!(run.probe.observe(&nonsense, &[]).is_empty());
        nonsense = run.now;
        nonsense.transient_vcpus = -8.0;
        assert!(run.probe.observe(&nonsense, &[]).is_empty());
        run.samples(10, 5);
        assert!(run.measured.len() > count);
        assert!(run.steady().iter().all(|s| close(s.2, 40.0 / SPEED)));
        // progress that goes back (a rollback the counter missed) restarts the interval
        run.now.clocks -= 50;
        run.samples(10, 5);
        assert!(run.steady().iter().all(|s| close(s.2, 40.0 / SPEED)));
    }
}
