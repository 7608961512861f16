//! The server's own cuRAND generator, for backends without NVIDIA's libcurand (emu):
//! Philox4x32-10 (Salmon, Moraes, Dror and Shaw, "Parallel random numbers: as easy as 1, 2, 3",
//! SC11), the counter-based generator cuRAND offers as `CURAND_RNG_PSEUDO_PHILOX4_32_10`, keyed
//! by the seed. Word `i` of a sequence is word `i % 4` of the block of counter `i / 4`, so any
//! position is reached at once: a generator's state is its seed and position, which is what a
//! checkpoint keeps. The distributions follow cuRAND's documentation: uniform in (0, 1],
//! normals by Box-Muller in pairs, log-normals as their exponentials, Poisson by inversion
//! (small means) or Hörmann's transformed rejection (PTRS, large means).

/// Philox's multipliers and Weyl key increments (the paper's constants).
const M0: u32 = 0xD251_1F53;
const M1: u32 = 0xCD9E_8D57;
const W0: u32 = 0x9E37_79B9;
const W1: u32 = 0xBB67_AE85;

/// 2^-32 and 2^-53: the steps of the uniform floats and doubles.
const TWO_POW_M32: f64 = 1.0 / 4_294_967_296.0;
const TWO_POW_M53: f64 = 1.0 / 9_007_199_254_740_992.0;

/// One block of four words: ten rounds of Philox4x32 on counter `block` under `seed`.
fn philox_block(seed: u64, block: u64) -> [u32; 4] {
    let mut c = [block as u32, (block >> 32) as u32, 0, 0];
    let mut k = [seed as u32, (seed >> 32) as u32];
    for round in 0..10 {
        if round > 0 {
            k = [k[0].wrapping_add(W0), k[1].wrapping_add(W1)];
        }
        let p0 = u64::from(M0) * u64::from(c[0]);
        let p1 = u64::from(M1) * u64::from(c[2]);
        c = [(p1 >> 32) as u32 ^ c[1] ^ k[0], p1 as u32, (p0 >> 32) as u32 ^ c[3] ^ k[1], p0 as u32];
    }
    c
}

/// A stream of words from `position` on, under `seed`.
pub struct Words {
    seed: u64,
    position: u64,
    block: [u32; 4],
}

impl Words {
    pub fn new(seed: u64, position: u64) -> Words {
        Words { seed, position, block: philox_block(seed, position / 4) }
    }

    pub fn position(&self) -> u64 {
        self.position
    }

    pub fn next_u32(&mut self) -> u32 {
        let w = self.block[(self.position % 4) as usize];
        self.position = self.position.wrapping_add(1);
        if self.position.is_multiple_of(4) {
            self.block = philox_block(self.seed, self.position / 4);
        }
        w
    }

    /// A float in (0, 1] from one word (cuRAND's rule: x * 2^-32 + 2^-33).
    pub fn uniform_f32(&mut self) -> f32 {
        let v = (f64::from(self.next_u32()) * TWO_POW_M32 + TWO_POW_M32 / 2.0) as f32;
        v.min(1.0)
    }

    /// A double in (0, 1] from two words (53 bits).
    pub fn uniform_f64(&mut self) -> f64 {
        let hi = u64::from(self.next_u32()) >> 6;
        let lo = u64::from(self.next_u32()) >> 5;
        let bits = (hi << 27) | lo;
        (bits as f64 + 0.5) * TWO_POW_M53
    }

    /// Two independent standard normals (Box-Muller) from two uniforms.
    fn normal_pair(&mut self, wide: bool) -> (f64, f64) {
        let (u1, u2) = if wide {
            (self.uniform_f64(), self.uniform_f64())
        } else {
            (self.uniform_f32().into(), self.uniform_f32().into())
        };
        let r = (-2.0 * u1.ln()).sqrt();
        let theta = std::f64::consts::TAU * u2;
        (r * theta.cos(), r * theta.sin())
    }

    /// `n` normals of mean `mean` and deviation `stddev` (`n` is even: the pseudo-random
    /// generators make them in pairs, as cuRAND's do).
    pub fn normals(&mut self, n: usize, mean: f64, stddev: f64, wide: bool) -> Vec<f64> {
        let mut out = Vec::with_capacity(n);
        while out.len() < n {
            let (a, b) = self.normal_pair(wide);
            out.push(mean + stddev * a);
            out.push(mean + stddev * b);
        }
        out.truncate(n);
        out
    }

    /// One Poisson variate of mean `lambda` (0 < lambda).
    pub fn poisson(&mut self, lambda: f64) -> u32 {
        if lambda < 64.0 { self.poisson_inversion(lambda) } else { self.poisson_ptrs(lambda) }
    }

    /// Inversion by sequential search from 0 (exact; e^-lambda is a normal double here).
    fn poisson_inversion(&mut self, lambda: f64) -> u32 {
        let u = self.uniform_f64();
        let mut p = (-lambda).exp();
        let mut cdf = p;
        let mut k = 0u32;
        // The tail beyond lambda + 40 sqrt(lambda) + 40 is below a double's resolution.
        let limit = (lambda + 40.0 * lambda.sqrt() + 40.0) as u32;
        while u > cdf && k < limit {
            k += 1;
            p *= lambda / f64::from(k);
            cdf += p;
        }
        k
    }

    /// Hörmann's PTRS ("The transformed rejection method for generating Poisson random
    /// variables", 1993), for lambda >= 10.
    fn poisson_ptrs(&mut self, lambda: f64) -> u32 {
        let slam = lambda.sqrt();
        let loglam = lambda.ln();
        let b = 0.931 + 2.53 * slam;
        let a = -0.059 + 0.02483 * b;
        let inv_alpha = 1.1239 + 1.1328 / (b - 3.4);
        let vr = 0.9277 - 3.6224 / (b - 2.0);
        loop {
            let u = self.uniform_f64() - 0.5;
            let v = self.uniform_f64();
            let us = 0.5 - u.abs();
            let k = ((2.0 * a / us + b) * u + lambda + 0.43).floor();
            if us >= 0.07 && v <= vr {
                return k as u32;
            }
            if k < 0.0 || (us < 0.013 && v > us) {
                continue;
            }
            if v.ln() + inv_alpha.ln() - (a / (us * us) + b).ln() <= -lambda + k * loglam - ln_factorial(k) {
                return k as u32;
            }
        }
    }
}

/// ln(k!) for a whole `k` >= 0: summed for small `k`, Stirling's series beyond.
fn ln_factorial(k: f64) -> f64 {
    if k < 20.0 {
        return (2..=k as u32).map(|i| f64::from(i).ln()).sum();
    }
    let n = k + 1.0;
    (n - 0.5) * n.ln() - n + 0.5 * std::f64::consts::TAU.ln() + 1.0 / (12.0 * n) - 1.0 / (360.0 * n.powi(3))
        + 1.0 / (1260.0 * n.powi(5))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The known-answer vector of the Random123 distribution (kat_vectors: philox4x32, 10
    /// rounds, counter 0 and key 0).
    #[test]
    fn philox_matches_the_published_answer() {
        assert_eq!(philox_block(0, 0), [0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8]);
    }

    #[test]
    fn a_position_is_reached_directly() {
        let mut from_start = Words::new(1234, 0);
        let skipped: Vec<u32> = (0..37).map(|_| from_start.next_u32()).collect();
        let mut later = Words::new(1234, 30);
        assert_eq!(later.next_u32(), skipped[30]);
        assert_eq!(from_start.position(), 37);
        assert_ne!(Words::new(1, 0).next_u32(), Words::new(2, 0).next_u32(), "the seed is the key");
    }

    fn moments(v: &[f64]) -> (f64, f64) {
        let mean = v.iter().sum::<f64>() / v.len() as f64;
        (mean, v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / v.len() as f64)
    }

    #[test]
    fn distributions_have_their_moments() {
        let mut w = Words::new(42, 0);
        let uniforms: Vec<f64> = (0..200_000).map(|_| f64::from(w.uniform_f32())).collect();
        assert!(uniforms.iter().all(|&u| u > 0.0 && u <= 1.0));
        let (m, v) = moments(&uniforms);
        assert!((m - 0.5).abs() < 0.005 && (v - 1.0 / 12.0).abs() < 0.002, "uniform {m} {v}");
        let doubles: Vec<f64> = (0..200_000).map(|_| w.uniform_f64()).collect();
        let (m, _) = moments(&doubles);
        assert!((m - 0.5).abs() < 0.005, "uniform double {m}");
        let (m, v) = moments(&w.normals(200_000, 3.0, 2.0, true));
        assert!((m - 3.0).abs() < 0.02 && (v - 4.0).abs() < 0.08, "normal {m} {v}");
        for lambda in [0.5, 7.0, 100.0, 5000.0] {
            let p: Vec<f64> = (0..100_000).map(|_| f64::from(w.poisson(lambda))).collect();
            let (m, v) = moments(&p);
            let tolerance = 5.0 * (lambda / 100_000f64).sqrt() + 0.01 * lambda;
            assert!(
                (m - lambda).abs() < tolerance && (v - lambda).abs() < 0.05 * lambda + 0.05,
                "poisson({lambda}) {m} {v}"
            );
        }
    }

    #[test]
    fn ln_factorial_is_right_on_both_sides_of_the_switch() {
        let exact = |k: u32| (2..=k).map(|i| f64::from(i).ln()).sum::<f64>();
        for k in [0u32, 1, 5, 19, 20, 21, 50, 170] {
            assert!((ln_factorial(f64::from(k)) - exact(k)).abs() < 1e-9, "{k}");
        }
    }
}
