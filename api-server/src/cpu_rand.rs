//! The server's own cuRAND generator, for backends without NVIDIA's libcurand (emu):
//! Philox4x32-10 (Salmon, Moraes, Dror and Shaw, "Parallel random numbers: as easy as 1, 2, 3",
//! SC11), the counter-based generator cuRAND offers as `CURAND_RNG_PSEUDO_PHILOX4_32_10`, keyed
//! by the seed. Word `i` of a sequence is word `i % 4` of the block of counter `i / 4`, so any
//! position is reached at once: a generator's state is its seed and position, which is what a
//! checkpoint keeps. The distributions follow cuRAND's documentation: uniform in (0, 1],
//! normals by Box-Muller in pairs, log-normals as their exponentials, Poisson by inversion
//! (small means) or Hörmann's transformed rejection (PTRS, large means).
//!
//! Quasi-random numbers are Sobol' sequences of 32-bit points ([`sobol32`]), up to
//! [`SOBOL_DIMENSIONS`] dimensions: the first is the van der Corput sequence, the others come
//! from primitive polynomials with Joe and Kuo's initial direction numbers, in Gray-code order
//! (point `i` is the XOR of the direction numbers of the bits of `i ^ (i >> 1)`).

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

/// The dimensions [`sobol32`] serves.
pub const SOBOL_DIMENSIONS: u32 = 10;

/// Dimensions 2 and up: (degree s, the inner coefficients a_1..a_{s-1} of the primitive
/// polynomial x^s + a_1 x^(s-1) + ... + a_{s-1} x + 1 as bits, a_1 highest, the initial odd
/// direction numbers m_1..m_s).
const SOBOL_POLYNOMIALS: [(usize, u32, &[u32]); SOBOL_DIMENSIONS as usize - 1] = [
    (1, 0, &[1]),
    (2, 1, &[1, 3]),
    (3, 1, &[1, 3, 1]),
    (3, 2, &[1, 1, 1]),
    (4, 1, &[1, 1, 3, 3]),
    (4, 4, &[1, 3, 5, 13]),
    (5, 2, &[1, 1, 5, 5, 17]),
    (5, 4, &[1, 1, 5, 5, 5]),
    (5, 7, &[1, 1, 7, 11, 19]),
];

/// The 32 direction numbers of dimension `dim` (0-based, below [`SOBOL_DIMENSIONS`]).
fn sobol_directions(dim: u32) -> [u32; 32] {
    let mut v = [0u32; 32];
    let Some(&(s, a, m)) = dim.checked_sub(1).and_then(|d| SOBOL_POLYNOMIALS.get(d as usize)) else {
        for (k, vk) in v.iter_mut().enumerate() {
            *vk = 1 << (31 - k);
        }
        return v;
    };
    for k in 0..s {
        v[k] = m[k] << (31 - k);
    }
    for k in s..32 {
        let mut x = v[k - s] ^ (v[k - s] >> s);
        for j in 1..s {
            if (a >> (s - 1 - j)) & 1 == 1 {
                x ^= v[k - j];
            }
        }
        v[k] = x;
    }
    v
}

/// Points `start..start + count` of dimension `dim` of the Sobol' sequence (the first point,
/// index 0, is 0).
pub fn sobol32(dim: u32, start: u64, count: usize) -> Vec<u32> {
    let v = sobol_directions(dim);
    let gray = start ^ (start >> 1);
    let mut x = (0..32).filter(|b| (gray >> b) & 1 == 1).fold(0u32, |x, b| x ^ v[b]);
    let mut out = Vec::with_capacity(count);
    for i in start..start.saturating_add(count as u64) {
        out.push(x);
        // From point i to i + 1 the Gray code changes in the lowest zero bit of i.
        x ^= v[(!i).trailing_zeros().min(31) as usize];
    }
    out
}

/// A 32-bit point as cuRAND's uniform float and double of it: in (0, 1), half a step above
/// the point.
pub fn quasi_uniform(x: u32) -> f64 {
    (f64::from(x) + 0.5) * TWO_POW_M32
}

/// The standard normal quantile of `p` in (0, 1) (Acklam's rational approximation, relative
/// error below 1.2e-9): quasi-random normals are their points' quantiles, which keeps each
/// dimension's spread (Box-Muller would mix two points).
pub fn normal_quantile(p: f64) -> f64 {
    const A: [f64; 6] = [
        -3.969683028665376e1,
        2.209460984245205e2,
        -2.759285104469687e2,
        1.38357751867269e2,
        -3.066479806614716e1,
        2.506628277459239,
    ];
    const B: [f64; 5] =
        [-5.447609879822406e1, 1.615858368580409e2, -1.556989798598866e2, 6.680131188771972e1, -1.328068155288572e1];
    const C: [f64; 6] = [
        -7.784894002430293e-3,
        -3.223964580411365e-1,
        -2.400758277161838,
        -2.549732539343734,
        4.374664141464968,
        2.938163982698783,
    ];
    const D: [f64; 4] = [7.784695709041462e-3, 3.224671290700398e-1, 2.445134137142996, 3.754408661907416];
    let tail = |q: f64| {
        (((((C[0] * q + C[1]) * q + C[2]) * q + C[3]) * q + C[4]) * q + C[5])
            / ((((D[0] * q + D[1]) * q + D[2]) * q + D[3]) * q + 1.0)
    };
    let low = 0.02425;
    if p < low {
        tail((-2.0 * p.ln()).sqrt())
    } else if p > 1.0 - low {
        -tail((-2.0 * (1.0 - p).ln()).sqrt())
    } else {
        let q = p - 0.5;
        let r = q * q;
        (((((A[0] * r + A[1]) * r + A[2]) * r + A[3]) * r + A[4]) * r + A[5]) * q
            / (((((B[0] * r + B[1]) * r + B[2]) * r + B[3]) * r + B[4]) * r + 1.0)
    }
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

    /// Whether x has order 2^s - 1 modulo the polynomial (bits: coefficient k at bit k).
    fn primitive(poly: u32, s: usize) -> bool {
        let times_x = |v: u32| {
            let v = v << 1;
            if v & (1 << s) != 0 { v ^ poly } else { v }
        };
        let power = |e: u32| (0..e).fold(1u32, |v, _| times_x(v));
        let order = (1u32 << s) - 1;
        let prime_factors = (2..=order).filter(|q| order.is_multiple_of(*q) && (2..*q).all(|d| !q.is_multiple_of(d)));
        power(order) == 1 && prime_factors.into_iter().all(|q| power(order / q) != 1)
    }

    #[test]
    fn sobol_polynomials_are_primitive_and_directions_odd() {
        for &(s, a, m) in &SOBOL_POLYNOMIALS {
            let poly = (1 << s) | (a << 1) | 1;
            assert!(primitive(poly, s), "x^{s} with a = {a}");
            assert_eq!(m.len(), s);
            for (k, &mk) in m.iter().enumerate() {
                assert!(mk % 2 == 1 && mk < 1 << (k + 1), "m_{} = {mk}", k + 1);
            }
        }
    }

    #[test]
    fn sobol_points_are_the_sequence() {
        // Dimension 1: 0, 1/2, 3/4, 1/4 (Gray-code order); dimension 2: 0, 1/2, 1/4, 3/4.
        let half = 1u32 << 31;
        assert_eq!(sobol32(0, 0, 4), vec![0, half, half | half >> 1, half >> 1]);
        assert_eq!(sobol32(1, 0, 4), vec![0, half, half >> 1, half | half >> 1]);
        // A start inside the sequence gives the same points.
        assert_eq!(sobol32(4, 5, 20), sobol32(4, 0, 25)[5..].to_vec());
        // Every dimension's first 2^k points fall one in each interval of width 2^-k.
        for dim in 0..SOBOL_DIMENSIONS {
            let mut seen = [false; 64];
            for x in sobol32(dim, 0, 64) {
                seen[(x >> 26) as usize] = true;
            }
            assert!(seen.iter().all(|s| *s), "dimension {dim}");
        }
    }

    #[test]
    fn the_normal_quantile_inverts_the_cdf() {
        assert!(normal_quantile(0.5).abs() < 1e-12);
        assert!((normal_quantile(0.975) - 1.959963984540054).abs() < 1e-8);
        assert!((normal_quantile(0.001) + 3.090232306167813).abs() < 1e-8);
    }
}
