//! The eviction model: per pool and max price, the probability of eviction within a horizon
//! (β) and the median time to eviction (seed 003 §4.3 "Estimating Evictions").
//!
//! It replays a training slice of a market: from every sample at which the pool could be
//! bought, an instance is launched with max price `price + δ · on-demand`; it is evicted at the
//! first later sample where the pool is unavailable (availability data), its price is unknown
//! (a gap) or its price rises above the max price (a price crossing). The launches give
//! right-censored times to eviction, turned into a Kaplan–Meier survival curve `S(τ)` on a
//! fixed grid per pool and δ. A pool with too few launches borrows the curve pooled over all
//! pools at that δ.
//!
//! [`score`] evaluates the model on a later slice of the same trace against a naive
//! constant-rate (exponential, bid-blind) model, by Brier score and mean log-likelihood.

use crate::market::{Market, PoolSeries};

/// Settings of the eviction model.
#[derive(Clone, Debug, PartialEq)]
pub struct EvictionConfig {
    /// Bid deltas as fractions of the pool's on-demand price, ascending.
    pub bid_deltas: Vec<f64>,
    /// Grid step of the survival curves in seconds.
    pub step_seconds: f64,
    /// Longest horizon modelled; survival beyond it is extrapolated at the last hazard.
    pub max_horizon_seconds: f64,
    /// Pools with fewer launches than this borrow the pooled curve.
    pub min_launches: usize,
}

impl Default for EvictionConfig {
    fn default() -> Self {
        Self {
            // from just above the market (the paper's $0.0001) to the on-demand price and beyond
            bid_deltas: vec![0.0001, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0],
            step_seconds: 60.0,
            max_horizon_seconds: 24.0 * 3600.0,
            min_launches: 20,
        }
    }
}

/// Survival curve of one pool at one δ.
#[derive(Clone, Debug, PartialEq)]
struct Curve {
    /// `S(k · step)`, k = 0..=K.
    survival: Vec<f64>,
    /// `∫_0^{k · step} S`, in seconds.
    integral: Vec<f64>,
    /// Launches that went into it.
    launches: usize,
}

/// Errors building an eviction model.
#[derive(Debug, thiserror::Error)]
pub enum EvictionError {
    /// The configuration is unusable.
    #[error("configure eviction model: {reason}")]
    Configure {
        /// What is wrong.
        reason: String,
    },
}

/// Per pool and bid delta survival curves (see the module docs).
#[derive(Clone, Debug, PartialEq)]
pub struct EvictionModel {
    config: EvictionConfig,
    /// `curves[pool][delta]`, over all launches.
    curves: Vec<Vec<Curve>>,
    /// `by_run_age[pool][delta][bucket]`: launches grouped by how long the pool had been
    /// buyable (see [`RUN_AGE_EDGES`]); `None` where too few launches (the pool's overall curve
    /// is used). Only pools with availability data have them.
    by_run_age: Vec<Vec<Vec<Option<Curve>>>>,
}

/// Bucket edges (seconds) of the pool's buyable run age at launch: with availability data,
/// how long a pool has been up says much about how soon it goes down.
pub const RUN_AGE_EDGES: [f64; 5] = [900.0, 1800.0, 3600.0, 7200.0, 14_400.0];

fn run_age_bucket(run_age: f64) -> usize {
    RUN_AGE_EDGES.partition_point(|&edge| edge <= run_age)
}

/// An observed time to eviction from one launch.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Lifetime {
    /// Seconds from launch to eviction, or to the end of observation.
    pub seconds: f64,
    /// Whether the instance was evicted (false: censored).
    pub evicted: bool,
    /// How long the pool had been buyable without interruption at launch, if known.
    pub run_age: Option<f64>,
}

/// Every launch lifetime of `pool` at max price `price + delta · on_demand`, with launches at
/// every buyable sample and observation capped at `cap_seconds`.
pub fn lifetimes(pool: &PoolSeries, delta: f64, cap_seconds: f64, max_hold: i64) -> Vec<Lifetime> {
    let on_demand = pool.info.on_demand_usd_hr.unwrap_or(0.0);
    let samples = &pool.samples;
    let mut out = Vec::new();
    // start of the pool's current buyable run (None: unknown, it began before the samples)
    let mut run_start: Option<i64> = None;
    let mut previous_sample: Option<(i64, bool)> = None;
    for (i, launch) in samples.iter().enumerate() {
        let buyable = launch.available && launch.price.is_some();
        if let Some((at, was_buyable)) = previous_sample
            && buyable
            && (!was_buyable || launch.at - at > max_hold)
        {
            run_start = Some(launch.at);
        }
        previous_sample = Some((launch.at, buyable));
        let Some(price) = launch.price.filter(|_| buyable) else {
            continue;
        };
        let run_age = run_start.map(|start| (launch.at - start) as f64);
        let max_price = price + delta * on_demand;
        let mut previous = launch.at;
        let mut outcome = None;
        for next in &samples[i + 1..] {
            let age = (next.at - launch.at) as f64;
            if next.at - previous > max_hold {
                // a gap: the pool is unknown from previous + max_hold on
                let gone = ((previous + max_hold) - launch.at) as f64;
                outcome = Some((gone.min(cap_seconds), gone <= cap_seconds));
                break;
            }
            if age > cap_seconds {
                // still running at the next sample, past the cap: survived the whole cap
                outcome = Some((cap_seconds, false));
                break;
            }
            let crossed = next.price.is_none_or(|p| p > max_price);
            if !next.available || crossed {
                outcome = Some((age, true));
                break;
            }
            previous = next.at;
        }
        let (seconds, evicted) =
            outcome.unwrap_or((((previous - launch.at) as f64).min(cap_seconds), false));
        out.push(Lifetime {
            seconds,
            evicted,
            run_age,
        });
    }
    out
}

/// Kaplan–Meier survival on the grid `k · step`, k = 0..=points-1.
fn kaplan_meier(lifetimes: &mut [Lifetime], step: f64, points: usize) -> Vec<f64> {
    lifetimes.sort_by(|a, b| a.seconds.total_cmp(&b.seconds));
    let mut survival = vec![1.0; points];
    let mut at_risk = lifetimes.len() as f64;
    let mut current = 1.0;
    let mut i = 0;
    for (k, slot) in survival.iter_mut().enumerate() {
        let tau = k as f64 * step;
        while i < lifetimes.len() && lifetimes[i].seconds <= tau {
            // all lifetimes with this exact time leave together
            let t = lifetimes[i].seconds;
            let mut events = 0.0;
            let mut leaving = 0.0;
            while i < lifetimes.len() && lifetimes[i].seconds == t {
                if lifetimes[i].evicted {
                    events += 1.0;
                }
                leaving += 1.0;
                i += 1;
            }
            if at_risk > 0.0 {
                current *= 1.0 - events / at_risk;
            }
            at_risk -= leaving;
        }
        *slot = current;
    }
    survival
}

fn curve(mut lifetimes: Vec<Lifetime>, step: f64, points: usize) -> Curve {
    let launches = lifetimes.len();
    let survival = if launches == 0 {
        vec![1.0; points]
    } else {
        kaplan_meier(&mut lifetimes, step, points)
    };
    let mut integral = vec![0.0; points];
    for k in 1..points {
        integral[k] = integral[k - 1] + 0.5 * (survival[k - 1] + survival[k]) * step;
    }
    Curve {
        survival,
        integral,
        launches,
    }
}

impl EvictionModel {
    /// Estimate curves for every pool of `training` (the market's pool order is kept).
    pub fn fit(training: &Market, config: EvictionConfig) -> Result<Self, EvictionError> {
        if config.bid_deltas.is_empty() || config.bid_deltas.windows(2).any(|w| w[0] >= w[1]) {
            return Err(EvictionError::Configure {
                reason: "bid deltas must be non-empty and ascending".into(),
            });
        }
        if config.step_seconds <= 0.0 || config.max_horizon_seconds < config.step_seconds {
            return Err(EvictionError::Configure {
                reason: "step must be positive and at most the horizon".into(),
            });
        }
        let points = (config.max_horizon_seconds / config.step_seconds).floor() as usize + 1;
        let cap = config.max_horizon_seconds;
        let mut per_pool: Vec<Vec<Vec<Lifetime>>> = training
            .pools
            .iter()
            .map(|pool| {
                config
                    .bid_deltas
                    .iter()
                    .map(|&delta| lifetimes(pool, delta, cap, training.gap.max_hold_seconds))
                    .collect()
            })
            .collect();
        let pooled: Vec<Curve> = (0..config.bid_deltas.len())
            .map(|d| {
                let all: Vec<Lifetime> =
                    per_pool.iter().flat_map(|p| p[d].iter().copied()).collect();
                curve(all, config.step_seconds, points)
            })
            .collect();
        let by_run_age = per_pool
            .iter()
            .zip(&training.pools)
            .map(|(deltas, pool)| {
                deltas
                    .iter()
                    .map(|lifetimes| {
                        (0..=RUN_AGE_EDGES.len())
                            .map(|bucket| {
                                if !pool.has_availability {
                                    return None;
                                }
                                let group: Vec<Lifetime> = lifetimes
                                    .iter()
                                    .filter(|l| {
                                        l.run_age.is_some_and(|r| run_age_bucket(r) == bucket)
                                    })
                                    .copied()
                                    .collect();
                                (group.len() >= config.min_launches)
                                    .then(|| curve(group, config.step_seconds, points))
                            })
                            .collect()
                    })
                    .collect()
            })
            .collect();
        let curves = per_pool
            .iter_mut()
            .map(|deltas| {
                deltas
                    .iter_mut()
                    .enumerate()
                    .map(|(d, lifetimes)| {
                        if lifetimes.len() < config.min_launches {
                            pooled[d].clone()
                        } else {
                            curve(std::mem::take(lifetimes), config.step_seconds, points)
                        }
                    })
                    .collect()
            })
            .collect();
        Ok(Self {
            config,
            curves,
            by_run_age,
        })
    }

    /// The configuration used.
    pub fn config(&self) -> &EvictionConfig {
        &self.config
    }

    /// Index of the largest modelled δ not above `delta` (conservative: a lower max price is
    /// evicted at least as often).
    pub fn delta_index(&self, delta: f64) -> usize {
        self.config
            .bid_deltas
            .partition_point(|&d| d <= delta + 1e-12)
            .saturating_sub(1)
    }

    /// The curve for `pool` at `delta`, conditioned on the pool's run age at launch if known.
    fn curve_for(&self, pool: usize, delta: f64, run_age: Option<f64>) -> &Curve {
        let d = self.delta_index(delta);
        run_age
            .and_then(|r| self.by_run_age[pool][d][run_age_bucket(r)].as_ref())
            .unwrap_or(&self.curves[pool][d])
    }

    fn survival_at(&self, curve: &Curve, tau: f64) -> f64 {
        let step = self.config.step_seconds;
        let last = curve.survival.len() - 1;
        let x = (tau.max(0.0)) / step;
        let k = x.floor() as usize;
        if k >= last {
            // extrapolate with the average hazard of the last hour of the grid
            let back = ((3600.0 / step) as usize).clamp(1, last);
            let s_end = curve.survival[last];
            let s_before = curve.survival[last - back];
            if s_end <= 0.0 || s_before <= 0.0 {
                return 0.0;
            }
            let rate = (s_before / s_end).ln() / (back as f64 * step);
            return s_end * (-(tau - last as f64 * step) * rate).exp();
        }
        let frac = x - k as f64;
        curve.survival[k] * (1.0 - frac) + curve.survival[k + 1] * frac
    }

    fn integral_at(&self, curve: &Curve, tau: f64) -> f64 {
        let step = self.config.step_seconds;
        let last = curve.integral.len() - 1;
        let x = tau.max(0.0) / step;
        let k = x.floor() as usize;
        if k >= last {
            return curve.integral[last] + curve.survival[last] * (tau - last as f64 * step);
        }
        let frac = x - k as f64;
        let s_k = curve.survival[k];
        let s_at = self.survival_at(curve, tau);
        curve.integral[k] + 0.5 * (s_k + s_at) * frac * step
    }

    /// Probability that an instance of `pool` launched at max price `price + delta ·
    /// on-demand` when the pool had been buyable for `run_age` seconds (if known), still
    /// running at `age` seconds, survives `horizon` more seconds.
    pub fn survival(
        &self,
        pool: usize,
        delta: f64,
        run_age: Option<f64>,
        age: f64,
        horizon: f64,
    ) -> f64 {
        let curve = self.curve_for(pool, delta, run_age);
        let at_age = self.survival_at(curve, age);
        if at_age <= 1e-9 {
            // the model never saw an instance this old: assume the hazard of the whole curve
            return self.survival_at(curve, horizon);
        }
        (self.survival_at(curve, age + horizon) / at_age).clamp(0.0, 1.0)
    }

    /// β: probability of eviction within `horizon` seconds (see [`EvictionModel::survival`]).
    pub fn beta(
        &self,
        pool: usize,
        delta: f64,
        run_age: Option<f64>,
        age: f64,
        horizon: f64,
    ) -> f64 {
        1.0 - self.survival(pool, delta, run_age, age, horizon)
    }

    /// Expected running seconds within the next `horizon` seconds, `∫ S(age + τ)/S(age) dτ`.
    pub fn expected_uptime(
        &self,
        pool: usize,
        delta: f64,
        run_age: Option<f64>,
        age: f64,
        horizon: f64,
    ) -> f64 {
        let curve = self.curve_for(pool, delta, run_age);
        let at_age = self.survival_at(curve, age);
        if at_age <= 1e-9 {
            return self.integral_at(curve, horizon);
        }
        ((self.integral_at(curve, age + horizon) - self.integral_at(curve, age)) / at_age)
            .clamp(0.0, horizon)
    }

    /// Median time to eviction from launch, or `None` if more than half survive the grid.
    pub fn median_time_to_eviction(&self, pool: usize, delta: f64) -> Option<f64> {
        let curve = &self.curves[pool][self.delta_index(delta)];
        curve
            .survival
            .iter()
            .position(|&s| s <= 0.5)
            .map(|k| k as f64 * self.config.step_seconds)
    }

    /// Launches behind the curve of `pool` at `delta` (pooled curves report the pooled count).
    pub fn launches(&self, pool: usize, delta: f64) -> usize {
        self.curves[pool][self.delta_index(delta)].launches
    }
}

/// A naive eviction model: a constant per-pool eviction rate, blind to the max price, fitted
/// by maximum likelihood (evictions / exposure) over the same training launches at every δ.
#[derive(Clone, Debug, PartialEq)]
pub struct ConstantRateModel {
    /// Evictions per second, per pool.
    pub rates: Vec<f64>,
}

impl ConstantRateModel {
    /// Fit on `training` with the same launch rule as [`EvictionModel::fit`].
    pub fn fit(training: &Market, config: &EvictionConfig) -> Self {
        let rates = training
            .pools
            .iter()
            .map(|pool| {
                let (mut events, mut exposure) = (0.0, 0.0);
                for &delta in &config.bid_deltas {
                    for l in lifetimes(
                        pool,
                        delta,
                        config.max_horizon_seconds,
                        training.gap.max_hold_seconds,
                    ) {
                        exposure += l.seconds;
                        if l.evicted {
                            events += 1.0;
                        }
                    }
                }
                if exposure > 0.0 {
                    events / exposure
                } else {
                    0.0
                }
            })
            .collect();
        Self { rates }
    }

    /// β within `horizon` seconds.
    pub fn beta(&self, pool: usize, horizon: f64) -> f64 {
        1.0 - (-self.rates[pool] * horizon).exp()
    }
}

/// Scores of one model on a test slice.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ModelScore {
    /// Mean squared error of β against the outcome (lower is better).
    pub brier: f64,
    /// Mean log-likelihood of the outcomes (higher is better); β clamped to [1e-4, 1 − 1e-4].
    pub log_likelihood: f64,
}

/// The eviction model against the naive model on a later slice.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct EvictionScore {
    /// Test launches × δ scored (launches censored before the horizon are left out).
    pub outcomes: usize,
    /// Share of outcomes that were evictions.
    pub eviction_rate: f64,
    /// The empirical per-pool, per-δ model.
    pub model: ModelScore,
    /// The constant-rate model.
    pub naive: ModelScore,
}

/// Score `model` and `naive` on `test` (same pools, same order) for eviction within
/// `horizon_seconds` of launch.
pub fn score(
    model: &EvictionModel,
    naive: &ConstantRateModel,
    test: &Market,
    horizon_seconds: f64,
) -> EvictionScore {
    let mut out = EvictionScore::default();
    let clamp = |p: f64| p.clamp(1e-4, 1.0 - 1e-4);
    let (mut evicted_count, mut n) = (0.0, 0.0);
    for (pool_index, pool) in test.pools.iter().enumerate() {
        for &delta in &model.config.bid_deltas {
            for l in lifetimes(pool, delta, horizon_seconds, test.gap.max_hold_seconds) {
                let y = if l.evicted && l.seconds <= horizon_seconds {
                    1.0
                } else if l.seconds >= horizon_seconds {
                    0.0
                } else {
                    continue; // censored before the horizon: outcome unknown
                };
                let p_model = model.beta(pool_index, delta, l.run_age, 0.0, horizon_seconds);
                let p_naive = naive.beta(pool_index, horizon_seconds);
                out.model.brier += (p_model - y) * (p_model - y);
                out.naive.brier += (p_naive - y) * (p_naive - y);
                let ll = |p: f64| y * clamp(p).ln() + (1.0 - y) * (1.0 - clamp(p)).ln();
                out.model.log_likelihood += ll(p_model);
                out.naive.log_likelihood += ll(p_naive);
                evicted_count += y;
                n += 1.0;
            }
        }
    }
    if n > 0.0 {
        out.model.brier /= n;
        out.naive.brier /= n;
        out.model.log_likelihood /= n;
        out.naive.log_likelihood /= n;
        out.eviction_rate = evicted_count / n;
    }
    out.outcomes = n as usize;
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::market::{CapacityType, GapPolicy, PoolId, PoolInfo, Sample};

    /// A pool sampled every minute whose availability follows `up` (true = available) and
    /// whose price follows `price`.
    fn pool(up: impl Fn(i64) -> bool, price: impl Fn(i64) -> f64, minutes: i64) -> PoolSeries {
        PoolSeries {
            info: PoolInfo {
                id: PoolId {
                    instance_type: "x.large".into(),
                    zone: "z".into(),
                    capacity: CapacityType::Spot,
                },
                vcpus: 2.0,
                memory_gib: None,
                on_demand_usd_hr: Some(1.0),
            },
            samples: (0..minutes)
                .map(|m| Sample {
                    at: m * 60,
                    price: Some(price(m)),
                    available: up(m),
                })
                .collect(),
            has_availability: true,
        }
    }

    fn market(pools: Vec<PoolSeries>) -> Market {
        Market {
            source: "test".into(),
            pools,
            gap: GapPolicy::for_interval(60),
        }
    }

    fn config() -> EvictionConfig {
        EvictionConfig {
            bid_deltas: vec![0.0001, 0.5],
            step_seconds: 60.0,
            max_horizon_seconds: 6.0 * 3600.0,
            min_launches: 5,
        }
    }

    #[test]
    fn availability_cycles_give_the_cycle_as_median() {
        // up 50 minutes, down 10, repeating: launched uniformly in the up phase, the time to
        // eviction is uniform on 1..=50 minutes
        let m = market(vec![pool(|m| m % 60 < 50, |_| 0.3, 6000)]);
        let model = EvictionModel::fit(&m, config()).unwrap();
        let median = model.median_time_to_eviction(0, 0.5).unwrap();
        assert!((1200.0..=1800.0).contains(&median), "median {median}");
        assert!(model.beta(0, 0.5, None, 0.0, 3600.0) > 0.99);
        assert!(model.beta(0, 0.5, None, 0.0, 600.0) < 0.3);
        // conditional on surviving 40 minutes, eviction within 15 minutes is certain
        assert!(model.beta(0, 0.5, None, 2400.0, 900.0) > 0.95);
        let uptime = model.expected_uptime(0, 0.5, None, 0.0, 3600.0);
        assert!((1300.0..1800.0).contains(&uptime), "uptime {uptime}");
    }

    #[test]
    fn a_higher_max_price_survives_price_spikes() {
        // price 0.3 with a spike to 0.5 for one minute every 30 minutes
        let m = market(vec![pool(
            |_| true,
            |m| if m % 30 == 0 { 0.5 } else { 0.3 },
            6000,
        )]);
        let model = EvictionModel::fit(&m, config()).unwrap();
        // launches during a spike (1 in 30) bid above every later price and survive
        let beta_low = model.beta(0, 0.0001, None, 0.0, 3600.0);
        assert!((0.95..0.98).contains(&beta_low), "{beta_low}");
        assert!(model.beta(0, 0.5, None, 0.0, 3600.0) < 0.01);
        assert_eq!(model.median_time_to_eviction(0, 0.5), None);
        // a delta between the grid points uses the lower one
        assert_eq!(model.delta_index(0.3), 0);
        assert_eq!(model.delta_index(0.6), 1);
    }

    #[test]
    fn sparse_pools_borrow_the_pooled_curve() {
        let sparse = pool(|m| m < 3, |_| 0.3, 6000);
        let busy = pool(|m| m % 60 < 50, |_| 0.3, 6000);
        let model = EvictionModel::fit(&market(vec![sparse, busy]), config()).unwrap();
        assert!(model.launches(0, 0.5) > 100);
        assert_eq!(
            model.median_time_to_eviction(0, 0.5),
            model.median_time_to_eviction(1, 0.5)
        );
    }

    #[test]
    fn the_model_beats_a_constant_rate_on_bid_dependent_evictions() {
        // a cheap bid is evicted by every spike, a high bid never: a bid-blind rate can't tell
        let price = |m: i64| if m % 40 == 0 { 0.6 } else { 0.3 };
        let m = market(vec![pool(|_| true, price, 20_000)]);
        let train_end = 10_000 * 60;
        let training = m.slice(0, train_end);
        let test = m.slice(train_end, i64::MAX);
        let model = EvictionModel::fit(&training, config()).unwrap();
        let naive = ConstantRateModel::fit(&training, model.config());
        let s = score(&model, &naive, &test, 3600.0);
        assert!(s.outcomes > 1000);
        assert!(s.model.brier < s.naive.brier, "{s:?}");
        assert!(s.model.log_likelihood > s.naive.log_likelihood, "{s:?}");
    }

    #[test]
    fn bad_configuration_is_refused() {
        let m = market(vec![]);
        let mut c = config();
        c.bid_deltas = vec![0.5, 0.1];
        assert!(EvictionModel::fit(&m, c).is_err());
    }
}
