//! A small, fast, seeded random generator (xoshiro256++), shared by data generators and apps.
//!
//! Apps need a generator in their inner loops (Gibbs sampling draws one number per token) and
//! reproducible streams across runs and processes, so it is a plain value type, seeded explicitly.

/// xoshiro256++ seeded through SplitMix64. Deterministic for a given seed on every platform.
#[derive(Debug, Clone)]
pub struct Rng {
    state: [u64; 4],
}

impl Rng {
    /// A generator whose stream is a pure function of `seed`.
    pub fn new(seed: u64) -> Self {
        let mut z = seed;
        let mut next = || {
            z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut x = z;
            x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            x ^ (x >> 31)
        };
        Self {
            state: [next(), next(), next(), next()],
        }
    }

    /// A generator for stream `stream` of `seed` (e.g. one per worker shard).
    pub fn stream(seed: u64, stream: u64) -> Self {
        Self::new(seed ^ stream.wrapping_mul(0xd1b5_4a32_d192_ed03).rotate_left(17))
    }

    /// Next 64 uniformly random bits.
    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        let s = &mut self.state;
        let result = s[0].wrapping_add(s[3]).rotate_left(23).wrapping_add(s[0]);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    /// Uniform in `[0, 1)` with 24 bits of precision.
    #[inline]
    pub fn next_f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 * (1.0 / (1u32 << 24) as f32)
    }

    /// Uniform in `[0, 1)` with 53 bits of precision.
    #[inline]
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform integer in `0..bound` (`bound > 0`), by multiply-shift (bias below 2^-32).
    #[inline]
    pub fn below(&mut self, bound: u32) -> u32 {
        debug_assert!(bound > 0);
        (((self.next_u64() >> 32) * u64::from(bound)) >> 32) as u32
    }

    /// Standard normal variate (Box-Muller).
    pub fn normal(&mut self) -> f64 {
        let u1 = 1.0 - self.next_f64();
        let u2 = self.next_f64();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }

    /// Gamma(shape, 1) variate (Marsaglia-Tsang; boosted for `shape < 1`). `shape > 0`.
    pub fn gamma(&mut self, shape: f64) -> f64 {
        if shape < 1.0 {
            let boost = (1.0 - self.next_f64()).powf(1.0 / shape);
            return self.gamma(shape + 1.0) * boost;
        }
        let d = shape - 1.0 / 3.0;
        let c = 1.0 / (9.0 * d).sqrt();
        loop {
            let x = self.normal();
            let v = (1.0 + c * x).powi(3);
            if v <= 0.0 {
                continue;
            }
            let u = 1.0 - self.next_f64();
            if u.ln() < 0.5 * x * x + d - d * v + d * v.ln() {
                return d * v;
            }
        }
    }

    /// Symmetric Dirichlet(`concentration`) sample of dimension `out.len()`.
    pub fn dirichlet(&mut self, concentration: f64, out: &mut [f64]) {
        let mut sum = 0.0;
        for value in out.iter_mut() {
            *value = self.gamma(concentration).max(1e-300);
            sum += *value;
        }
        for value in out.iter_mut() {
            *value /= sum;
        }
    }

    /// Index drawn from the (unnormalised, non-negative) weights.
    pub fn categorical(&mut self, weights: &[f64]) -> usize {
        let total: f64 = weights.iter().sum();
        let mut target = self.next_f64() * total;
        for (index, weight) in weights.iter().enumerate() {
            if target < *weight {
                return index;
            }
            target -= weight;
        }
        weights.len() - 1
    }

    /// Fisher-Yates shuffle.
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.below(i as u32 + 1) as usize;
            items.swap(i, j);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_are_reproducible_and_distinct() {
        let a: Vec<u64> = (0..4)
            .map({
                let mut r = Rng::new(1);
                move |_| r.next_u64()
            })
            .collect();
        let b: Vec<u64> = (0..4)
            .map({
                let mut r = Rng::new(1);
                move |_| r.next_u64()
            })
            .collect();
        assert_eq!(a, b);
        assert_ne!(Rng::stream(1, 0).next_u64(), Rng::stream(1, 1).next_u64());
    }

    #[test]
    fn distributions_have_the_right_moments() {
        let mut rng = Rng::new(3);
        let n = 200_000;
        let mean_u = (0..n).map(|_| f64::from(rng.next_f32())).sum::<f64>() / n as f64;
        assert!((mean_u - 0.5).abs() < 0.01, "{mean_u}");
        let counts = (0..n).fold([0u32; 3], |mut c, _| {
            c[rng.below(3) as usize] += 1;
            c
        });
        assert!(
            counts
                .iter()
                .all(|&c| (c as f64 / n as f64 - 1.0 / 3.0).abs() < 0.01)
        );
        for shape in [0.3, 1.0, 4.0] {
            let mean = (0..n).map(|_| rng.gamma(shape)).sum::<f64>() / n as f64;
            assert!(
                (mean - shape).abs() < 0.03 * shape.max(1.0),
                "{shape}: {mean}"
            );
        }
        let mut p = [0.0; 5];
        rng.dirichlet(0.5, &mut p);
        assert!((p.iter().sum::<f64>() - 1.0).abs() < 1e-12);
    }
}
