//! The application model BidBrain optimises for (seed 003 table 4.2): ν, φ, σ, λ, an optional
//! measured throughput-vs-ratio table that replaces the linear φ term, and the calibration that
//! re-estimates the terms from throughput the runtime measures.

/// How the application turns instance-time into work.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct AppModel {
    /// ν: work per vCPU-second on a reliable node (an instance's ν is this times its vCPUs,
    /// seed 003 §4.3 footnote 6).
    pub nu_per_vcpu_second: f64,
    /// φ: fraction of a transient node's ν that turns into progress (0 < φ ≤ 1).
    pub phi: f64,
    /// σ: seconds a newly added allocation runs before it contributes (boot, data load and
    /// the background switch-in).
    pub sigma_seconds: f64,
    /// λ: seconds without progress for the whole job after an eviction.
    pub lambda_seconds: f64,
    /// Transient:reliable node ratio above which reliable nodes stop running workers
    /// (AgileML stage 3; paper 15:1).
    pub stage3_ratio: f64,
}

impl Default for AppModel {
    /// The CRD's defaults (`ApplicationTerms`): ν = 1 per vCPU-second, φ = 0.9, σ = 60 s,
    /// λ = 120 s; stage 3 above 15:1 as in the paper.
    fn default() -> Self {
        Self {
            nu_per_vcpu_second: 1.0,
            phi: 0.9,
            sigma_seconds: 60.0,
            lambda_seconds: 120.0,
            stage3_ratio: 15.0,
        }
    }
}

/// Share of a node's ν that becomes progress, per tier, for one footprint.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Efficiency {
    /// Each reliable node's share (1, or 0 in stage 3, under the linear model).
    pub reliable: f64,
    /// Each transient node's share (φ under the linear model).
    pub transient: f64,
}

/// Measured throughput of a cluster against its transient:reliable node ratio, in the best
/// AgileML stage at each ratio, relative to a cluster of as many reliable nodes only (so 1 at
/// ratio 0). Built from a calibration file ([`super::calibration::Calibration`]).
#[derive(Clone, Debug, PartialEq)]
pub struct ThroughputTable {
    /// (transient ÷ reliable nodes, relative throughput): ratios strictly increasing from 0,
    /// throughputs finite and positive.
    points: Vec<(f64, f64)>,
}

impl ThroughputTable {
    /// A table from `(ratio, relative throughput)` points in any order. The points must include
    /// ratio 0, have distinct finite non-negative ratios and finite positive throughputs.
    pub fn new(mut points: Vec<(f64, f64)>) -> Result<Self, String> {
        if let Some((r, t)) = points
            .iter()
            .find(|(r, t)| !(r.is_finite() && *r >= 0.0 && t.is_finite() && *t > 0.0))
        {
            return Err(format!(
                "point ({r}, {t}): a ratio must be finite and ≥ 0, a throughput finite and > 0"
            ));
        }
        points.sort_by(|a, b| a.0.total_cmp(&b.0));
        if let Some(w) = points.windows(2).find(|w| w[0].0 == w[1].0) {
            return Err(format!("ratio {} is measured twice", w[0].0));
        }
        if points.first().is_none_or(|p| p.0 != 0.0) {
            return Err(
                "no reliable-only point (ratio 0), which the others are relative to".into(),
            );
        }
        Ok(Self { points })
    }

    /// The measured points, by ratio.
    pub fn points(&self) -> &[(f64, f64)] {
        &self.points
    }

    /// Relative throughput at `ratio` transient per reliable node: linear between the measured
    /// ratios, the nearest measured value outside them (an infinite ratio, transient nodes
    /// only, reads the highest measured ratio).
    pub fn relative(&self, ratio: f64) -> f64 {
        let (first, last) = (self.points[0], self.points[self.points.len() - 1]);
        if ratio.is_nan() || ratio <= first.0 {
            return first.1;
        }
        if ratio >= last.0 {
            return last.1;
        }
        let i = self.points.partition_point(|p| p.0 <= ratio);
        let (a, b) = (self.points[i - 1], self.points[i]);
        a.1 + (b.1 - a.1) * (ratio - a.0) / (b.0 - a.0)
    }

    /// The highest relative throughput at any ratio.
    pub fn max_relative(&self) -> f64 {
        self.points.iter().map(|p| p.1).fold(0.0, f64::max)
    }
}

impl AppModel {
    /// Work per second of one instance with `vcpus` at full efficiency (ν · vCPUs).
    pub fn node_rate(&self, vcpus: f64) -> f64 {
        self.nu_per_vcpu_second * vcpus
    }

    /// The share of ν each tier turns into progress in a footprint of `transient` and
    /// `reliable` nodes: the one place the bidder (eqs. 4.2–4.4) and the simulator's work rate
    /// read it. With a measured `throughput` table both tiers run at the table's relative
    /// throughput at the footprint's ratio (which includes the best stage); without one, the
    /// linear model: transient nodes at φ, reliable nodes at 1, or 0 above `stage3_ratio`.
    pub fn efficiency(
        &self,
        throughput: Option<&ThroughputTable>,
        transient: f64,
        reliable: f64,
    ) -> Efficiency {
        match throughput {
            Some(table) => {
                let ratio = if transient <= 0.0 {
                    0.0
                } else if reliable <= 0.0 {
                    f64::INFINITY
                } else {
                    transient / reliable
                };
                let share = table.relative(ratio);
                Efficiency {
                    reliable: share,
                    transient: share,
                }
            }
            None => Efficiency {
                reliable: if reliable > 0.0 && transient / reliable > self.stage3_ratio {
                    0.0
                } else {
                    1.0
                },
                transient: self.phi,
            },
        }
    }

    /// The highest share of ν each tier can reach at any ratio (bounds, e.g. the hindsight
    /// optimum's).
    pub fn best_efficiency(&self, throughput: Option<&ThroughputTable>) -> Efficiency {
        match throughput {
            Some(table) => Efficiency {
                reliable: table.max_relative(),
                transient: table.max_relative(),
            },
            None => Efficiency {
                reliable: 1.0,
                transient: self.phi,
            },
        }
    }

    /// Work per second of one reliable instance with `vcpus`, given the footprint's
    /// transient and reliable instance counts (zero in stage 3), under the linear model.
    pub fn reliable_rate(&self, vcpus: f64, transient: f64, reliable: f64) -> f64 {
        self.node_rate(vcpus) * self.efficiency(None, transient, reliable).reliable
    }

    /// Work per second of one transient instance with `vcpus`, under the linear model.
    pub fn transient_rate(&self, vcpus: f64) -> f64 {
        self.node_rate(vcpus) * self.phi
    }
}

/// One throughput measurement from the runtime (coordinator status).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Measurement {
    /// Steady-state progress over an interval with a fixed footprint.
    Steady {
        /// vCPUs on reliable nodes running workers.
        reliable_vcpus: f64,
        /// vCPUs on transient nodes.
        transient_vcpus: f64,
        /// Measured work per second.
        work_per_second: f64,
    },
    /// Seconds from an allocation's launch until it contributed work.
    Addition {
        /// The delay.
        seconds: f64,
    },
    /// Seconds without progress after an eviction.
    Eviction {
        /// The stall.
        seconds: f64,
    },
}

/// What the runtime feeds: measurements as they arrive.
pub trait ThroughputFeed {
    /// Take one measurement into account.
    fn record(&mut self, measurement: Measurement);
}

/// Measurements a [`Calibrator`] took into account, by kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct MeasurementCounts {
    /// Steady intervals taken (for ν or φ).
    pub steady: u64,
    /// Of those, intervals with transient nodes kept to read φ once a reliable-only interval
    /// measures ν.
    pub waiting: u64,
    /// Addition delays (σ).
    pub additions: u64,
    /// Eviction stalls (λ).
    pub evictions: u64,
}

impl MeasurementCounts {
    /// Every measurement taken.
    pub fn total(&self) -> u64 {
        self.steady + self.additions + self.evictions
    }
}

/// Steady intervals with transient nodes kept while ν is unmeasured (the oldest go first).
const MAX_WAITING: usize = 32;

/// Re-estimates ν, φ, σ and λ from measurements, starting from the spec.
///
/// Each term is a running mean in which the spec's value counts as one measurement, until the
/// mean's weight falls to `weight`; from then on an exponentially weighted average with that
/// weight (so the first measurement moves a term halfway, and old ones fade). ν is the
/// exception: the spec's ν may count another unit of work than the measurements, so the first
/// measured ν replaces it.
///
/// φ is read at the current ν, so it needs ν measured in the measurements' own unit (the spec's
/// ν may count other work): until a reliable-only interval measures ν, an interval with
/// transient nodes sets ν at the current φ instead, and waits (at most 32, the newest) to be
/// read for φ once ν is measured.
#[derive(Clone, Debug, PartialEq)]
pub struct Calibrator {
    model: AppModel,
    /// Weight of a new measurement once a term has enough of them (0 < weight ≤ 1).
    weight: f64,
    /// Measurements taken per term: ν, φ, σ, λ.
    taken: [u64; 4],
    /// Steady intervals with transient nodes waiting for ν.
    waiting: std::collections::VecDeque<Measurement>,
    /// Whether a reliable-only interval has measured ν.
    nu_measured: bool,
    /// Whether ν is still the spec's.
    nu_from_spec: bool,
    counts: MeasurementCounts,
}

impl Calibrator {
    /// Start from `initial` (the spec's values); `weight` is clamped to (0, 1].
    pub fn new(initial: AppModel, weight: f64) -> Self {
        Self {
            model: initial,
            weight: weight.clamp(1e-6, 1.0),
            taken: [0; 4],
            waiting: std::collections::VecDeque::new(),
            nu_measured: false,
            nu_from_spec: true,
            counts: MeasurementCounts::default(),
        }
    }

    /// The current estimate.
    pub fn model(&self) -> &AppModel {
        &self.model
    }

    /// The measurements taken so far.
    pub fn counts(&self) -> MeasurementCounts {
        MeasurementCounts {
            waiting: self.waiting.len() as u64,
            ..self.counts
        }
    }

    /// Moves term `index` (ν, φ, σ, λ) from `old` towards `new`.
    fn blend(&mut self, index: usize, old: f64, new: f64) -> f64 {
        let weight = self.weight.max(1.0 / (self.taken[index] as f64 + 2.0));
        self.taken[index] += 1;
        old + weight * (new - old)
    }

    /// Takes `nu` (measured in the measurements' unit) into ν.
    fn take_nu(&mut self, nu: f64) {
        if self.nu_from_spec {
            self.nu_from_spec = false;
            self.taken[0] = 1;
            self.model.nu_per_vcpu_second = nu;
        } else {
            self.model.nu_per_vcpu_second = self.blend(0, self.model.nu_per_vcpu_second, nu);
        }
    }

    /// φ from a steady interval with transient nodes at the current ν: the reliable share at
    /// ν, the rest is φ·ν per transient vCPU.
    fn read_phi(&mut self, interval: Measurement) {
        let Measurement::Steady {
            reliable_vcpus,
            transient_vcpus,
            work_per_second,
        } = interval
        else {
            return;
        };
        let nu = self.model.nu_per_vcpu_second;
        let phi = (work_per_second / nu - reliable_vcpus) / transient_vcpus;
        let phi = self.blend(1, self.model.phi, phi);
        self.model.phi = phi.clamp(0.01, 1.0);
    }
}

impl ThroughputFeed for Calibrator {
    fn record(&mut self, measurement: Measurement) {
        match measurement {
            Measurement::Steady {
                reliable_vcpus,
                transient_vcpus,
                work_per_second,
            } => {
                let sane = |x: f64| x.is_finite() && x >= 0.0;
                if !(sane(work_per_second) && sane(reliable_vcpus) && sane(transient_vcpus)) {
                    return;
                }
                if work_per_second <= 0.0 || reliable_vcpus + transient_vcpus <= 0.0 {
                    // a stall, not a rate (and φ cannot be read at ν = 0)
                    return;
                }
                self.counts.steady += 1;
                if transient_vcpus <= 0.0 {
                    // reliable only: ν directly (the first such interval weighs against an
                    // estimate at φ as one measurement), then φ from whatever waited for it
                    if !self.nu_measured {
                        self.nu_measured = true;
                        self.taken[0] = 0;
                    }
                    self.take_nu(work_per_second / reliable_vcpus);
                    while let Some(waiting) = self.waiting.pop_front() {
                        self.read_phi(waiting);
                    }
                } else if self.nu_measured {
                    self.read_phi(measurement);
                } else {
                    // ν in the measurements' unit at the current φ, until it is measured
                    let capacity = reliable_vcpus + self.model.phi * transient_vcpus;
                    self.take_nu(work_per_second / capacity);
                    if self.waiting.len() == MAX_WAITING {
                        self.waiting.pop_front();
                    }
                    self.waiting.push_back(measurement);
                }
            }
            Measurement::Addition { seconds } if seconds.is_finite() && seconds >= 0.0 => {
                self.model.sigma_seconds = self.blend(2, self.model.sigma_seconds, seconds);
                self.counts.additions += 1;
            }
            Measurement::Eviction { seconds } if seconds.is_finite() && seconds >= 0.0 => {
                self.model.lambda_seconds = self.blend(3, self.model.lambda_seconds, seconds);
                self.counts.evictions += 1;
            }
            Measurement::Addition { .. } | Measurement::Eviction { .. } => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calibration_converges_to_measured_terms() {
        let mut calibrator = Calibrator::new(AppModel::default(), 0.5);
        for _ in 0..30 {
            calibrator.record(Measurement::Steady {
                reliable_vcpus: 4.0,
                transient_vcpus: 0.0,
                work_per_second: 8.0,
            });
        }
        assert!((calibrator.model().nu_per_vcpu_second - 2.0).abs() < 1e-6);
        for _ in 0..30 {
            // 4 reliable vCPUs at ν = 2 give 8; 10 transient vCPUs give 14 more: φ = 0.7
            calibrator.record(Measurement::Steady {
                reliable_vcpus: 4.0,
                transient_vcpus: 10.0,
                work_per_second: 22.0,
            });
            calibrator.record(Measurement::Eviction { seconds: 30.0 });
            calibrator.record(Measurement::Addition { seconds: 200.0 });
        }
        let model = calibrator.model();
        assert!((model.phi - 0.7).abs() < 1e-6, "{model:?}");
        assert!((model.lambda_seconds - 30.0).abs() < 1e-3);
        assert!((model.sigma_seconds - 200.0).abs() < 1e-3);
        // nonsense is ignored
        calibrator.record(Measurement::Eviction { seconds: f64::NAN });
        assert!((calibrator.model().lambda_seconds - 30.0).abs() < 1e-3);
    }

    #[test]
    fn the_spec_counts_as_one_measurement_until_the_weight_floor() {
        let mut calibrator = Calibrator::new(AppModel::default(), 0.2);
        calibrator.record(Measurement::Addition { seconds: 160.0 });
        // halfway from the spec's 60 s
        assert!((calibrator.model().sigma_seconds - 110.0).abs() < 1e-9);
        calibrator.record(Measurement::Addition { seconds: 160.0 });
        // the mean of 60, 160, 160
        assert!((calibrator.model().sigma_seconds - 380.0 / 3.0).abs() < 1e-9);
        for _ in 0..3 {
            calibrator.record(Measurement::Addition { seconds: 160.0 });
        }
        // 1/(n + 2) ≤ 0.2 from the fourth measurement on: the floor
        let before = calibrator.model().sigma_seconds;
        calibrator.record(Measurement::Addition { seconds: 0.0 });
        assert!((calibrator.model().sigma_seconds - 0.8 * before).abs() < 1e-9);
        assert_eq!(calibrator.counts().additions, 6);
        // the other terms are untouched
        assert_eq!(calibrator.model().lambda_seconds, 120.0);
    }

    #[test]
    fn phi_waits_for_a_measured_nu() {
        let mut calibrator = Calibrator::new(AppModel::default(), 1.0);
        // 8 reliable + 8 transient vCPUs at 0.12 work per second: at the spec's ν = 1 that
        // would read φ < 0; it sets ν at φ = 0.9 instead and waits
        let mixed = Measurement::Steady {
            reliable_vcpus: 8.0,
            transient_vcpus: 8.0,
            work_per_second: 0.12,
        };
        calibrator.record(mixed);
        assert_eq!(calibrator.model().phi, 0.9);
        let nu_at_phi = 0.12 / (8.0 + 0.9 * 8.0);
        assert!((calibrator.model().nu_per_vcpu_second - nu_at_phi).abs() < 1e-12);
        assert_eq!(calibrator.counts().waiting, 1);
        assert_eq!(calibrator.counts().total(), 1);
        // ν = 0.01 per vCPU-second from the reliable tier alone: the waiting interval reads
        // φ = (0.12 / 0.01 − 8) / 8 = 0.5
        calibrator.record(Measurement::Steady {
            reliable_vcpus: 8.0,
            transient_vcpus: 0.0,
            work_per_second: 0.08,
        });
        let model = calibrator.model();
        assert!((model.nu_per_vcpu_second - 0.01).abs() < 1e-12, "{model:?}");
        assert!((model.phi - 0.5).abs() < 1e-9, "{model:?}");
        assert_eq!(calibrator.counts().waiting, 0);
        assert_eq!(calibrator.counts().steady, 2);
        // no progress is a stall, not ν = 0; nonsense is ignored
        calibrator.record(Measurement::Steady {
            reliable_vcpus: 8.0,
            transient_vcpus: 0.0,
            work_per_second: 0.0,
        });
        calibrator.record(Measurement::Steady {
            reliable_vcpus: f64::NAN,
            transient_vcpus: 8.0,
            work_per_second: 1.0,
        });
        assert!((calibrator.model().nu_per_vcpu_second - 0.01).abs() < 1e-12);
        assert_eq!(calibrator.counts().steady, 2);
    }

    #[test]
    fn the_first_measured_nu_replaces_the_spec_s() {
        let mut calibrator = Calibrator::new(AppModel::default(), 0.2);
        let mixed = Measurement::Steady {
            reliable_vcpus: 8.0,
            transient_vcpus: 8.0,
            work_per_second: 0.12,
        };
        calibrator.record(mixed);
        let at_phi = 0.12 / (8.0 + 0.9 * 8.0);
        assert!((calibrator.model().nu_per_vcpu_second - at_phi).abs() < 1e-12);
        calibrator.record(mixed);
        assert!((calibrator.model().nu_per_vcpu_second - at_phi).abs() < 1e-12);
        // the first reliable-only interval: halfway from the estimate at φ
        let reliable_only = Measurement::Steady {
            reliable_vcpus: 8.0,
            transient_vcpus: 0.0,
            work_per_second: 0.08,
        };
        calibrator.record(reliable_only);
        let nu = calibrator.model().nu_per_vcpu_second;
        assert!((nu - (at_phi + 0.01) / 2.0).abs() < 1e-12, "{nu}");
        // a spec's ν with only reliable-only intervals: replaced at once
        let mut calibrator = Calibrator::new(AppModel::default(), 0.2);
        calibrator.record(reliable_only);
        assert!((calibrator.model().nu_per_vcpu_second - 0.01).abs() < 1e-12);
    }

    #[test]
    fn at_most_32_intervals_wait_for_nu() {
        let mut calibrator = Calibrator::new(AppModel::default(), 0.5);
        for _ in 0..40 {
            calibrator.record(Measurement::Steady {
                reliable_vcpus: 0.0,
                transient_vcpus: 4.0,
                work_per_second: 1.0,
            });
        }
        assert_eq!(calibrator.counts().waiting, 32);
    }

    #[test]
    fn throughput_is_interpolated_between_measured_ratios_and_clamped_outside() {
        let table =
            ThroughputTable::new(vec![(7.0, 0.96), (0.0, 1.0), (3.0, 0.55), (1.0, 1.02)]).unwrap();
        let at = |ratio: f64| table.relative(ratio);
        assert_eq!(at(0.0), 1.0);
        assert_eq!(at(1.0), 1.02);
        assert!((at(0.5) - 1.01).abs() < 1e-12);
        assert!((at(2.0) - 0.785).abs() < 1e-12);
        assert!((at(5.0) - 0.755).abs() < 1e-12);
        assert_eq!(at(7.0), 0.96);
        assert_eq!(at(32.0), 0.96);
        assert_eq!(at(f64::INFINITY), 0.96);
        assert_eq!(at(-1.0), 1.0);
        assert_eq!(table.max_relative(), 1.02);
    }

    #[test]
    fn a_table_needs_a_reliable_only_point_and_sane_values() {
        assert!(ThroughputTable::new(vec![(1.0, 1.0), (3.0, 0.5)]).is_err());
        assert!(ThroughputTable::new(vec![(0.0, 1.0), (3.0, 0.5), (3.0, 0.6)]).is_err());
        assert!(ThroughputTable::new(vec![(0.0, 1.0), (3.0, 0.0)]).is_err());
        assert!(ThroughputTable::new(vec![(0.0, 1.0), (3.0, f64::NAN)]).is_err());
        assert!(ThroughputTable::new(vec![(0.0, 1.0), (f64::INFINITY, 0.5)]).is_err());
        assert!(ThroughputTable::new(Vec::new()).is_err());
    }

    #[test]
    fn a_table_replaces_phi_and_stage_3_for_both_tiers() {
        let app = AppModel::default();
        let table = ThroughputTable::new(vec![(0.0, 1.0), (1.0, 1.0), (3.0, 0.5)]).unwrap();
        let measured = app.efficiency(Some(&table), 2.0, 1.0);
        assert_eq!(measured.reliable, 0.75);
        assert_eq!(measured.transient, 0.75);
        // transient nodes only (no reliable tier): the highest measured ratio
        assert_eq!(app.efficiency(Some(&table), 8.0, 0.0).transient, 0.5);
        // no transient nodes: the reliable-only reference
        assert_eq!(app.efficiency(Some(&table), 0.0, 1.0).reliable, 1.0);
        // without a table, the linear model
        let linear = app.efficiency(None, 2.0, 1.0);
        assert_eq!((linear.reliable, linear.transient), (1.0, 0.9));
        assert_eq!(app.efficiency(None, 16.0, 1.0).reliable, 0.0);
        assert_eq!(app.best_efficiency(Some(&table)).reliable, 1.0);
    }

    #[test]
    fn reliable_nodes_stop_working_in_stage_3() {
        let model = AppModel::default();
        assert_eq!(model.reliable_rate(4.0, 15.0, 1.0), 4.0);
        assert_eq!(model.reliable_rate(4.0, 16.0, 1.0), 0.0);
        assert!((model.transient_rate(4.0) - 3.6).abs() < 1e-12);
    }
}
