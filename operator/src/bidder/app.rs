//! The application model BidBrain optimises for (seed 003 table 4.2): ν, φ, σ, λ, and the
//! calibration that re-estimates them from throughput the runtime measures.

/// How the application turns instance-time into work.
#[derive(Clone, Debug, PartialEq)]
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

impl AppModel {
    /// Work per second of one reliable instance with `vcpus`, given the footprint's
    /// transient and reliable instance counts (zero in stage 3).
    pub fn reliable_rate(&self, vcpus: f64, transient: f64, reliable: f64) -> f64 {
        if reliable > 0.0 && transient / reliable > self.stage3_ratio {
            0.0
        } else {
            self.nu_per_vcpu_second * vcpus
        }
    }

    /// Work per second of one transient instance with `vcpus`.
    pub fn transient_rate(&self, vcpus: f64) -> f64 {
        self.nu_per_vcpu_second * self.phi * vcpus
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

/// Re-estimates ν, φ, σ and λ by exponentially weighted averages, starting from the spec.
#[derive(Clone, Debug, PartialEq)]
pub struct Calibrator {
    model: AppModel,
    /// Weight of a new measurement (0 < weight ≤ 1).
    weight: f64,
}

impl Calibrator {
    /// Start from `initial` (the spec's values); `weight` is clamped to (0, 1].
    pub fn new(initial: AppModel, weight: f64) -> Self {
        Self {
            model: initial,
            weight: weight.clamp(1e-6, 1.0),
        }
    }

    /// The current estimate.
    pub fn model(&self) -> &AppModel {
        &self.model
    }

    fn blend(&self, old: f64, new: f64) -> f64 {
        old + self.weight * (new - old)
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
                if !(work_per_second.is_finite() && work_per_second >= 0.0) {
                    return;
                }
                if transient_vcpus <= 0.0 && reliable_vcpus > 0.0 {
                    // reliable only: ν directly
                    let nu = work_per_second / reliable_vcpus;
                    self.model.nu_per_vcpu_second = self.blend(self.model.nu_per_vcpu_second, nu);
                } else if transient_vcpus > 0.0 {
                    // the reliable share at the current ν, the rest is φ·ν per transient vCPU
                    let nu = self.model.nu_per_vcpu_second;
                    let phi = (work_per_second / nu - reliable_vcpus) / transient_vcpus;
                    let phi = self.blend(self.model.phi, phi);
                    self.model.phi = phi.clamp(0.01, 1.0);
                }
            }
            Measurement::Addition { seconds } if seconds.is_finite() && seconds >= 0.0 => {
                self.model.sigma_seconds = self.blend(self.model.sigma_seconds, seconds);
            }
            Measurement::Eviction { seconds } if seconds.is_finite() && seconds >= 0.0 => {
                self.model.lambda_seconds = self.blend(self.model.lambda_seconds, seconds);
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
    fn reliable_nodes_stop_working_in_stage_3() {
        let model = AppModel::default();
        assert_eq!(model.reliable_rate(4.0, 15.0, 1.0), 4.0);
        assert_eq!(model.reliable_rate(4.0, 16.0, 1.0), 0.0);
        assert!((model.transient_rate(4.0) - 3.6).abs() < 1e-12);
    }
}
