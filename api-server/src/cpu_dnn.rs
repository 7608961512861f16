//! cuDNN's batch normalization on the CPU (emu), with cuDNN's formulas: the batch's mean and
//! biased variance normalise, the running variance is updated with the unbiased one, and the
//! saved statistics are the mean and the inverse standard deviation `1 / sqrt(var + eps)`.
//!
//! Tensors arrive here gathered in canonical order (N, then C, then the spatial dimensions),
//! as `f64`; the service reads and writes them with the descriptors' strides and types.

/// How the elements of a tensor group into the features that share statistics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Groups {
    /// The batch (dimension 0).
    pub n: usize,
    /// The channels (dimension 1).
    pub c: usize,
    /// The product of the spatial dimensions.
    pub spatial: usize,
    /// CUDNN_BATCHNORM_PER_ACTIVATION: one feature per (channel, spatial position); otherwise
    /// one per channel.
    pub per_activation: bool,
}

impl Groups {
    /// Features (the length of the scale, bias and statistics).
    pub fn features(&self) -> usize {
        if self.per_activation { self.c * self.spatial } else { self.c }
    }

    /// Elements per feature.
    pub fn count(&self) -> usize {
        if self.per_activation { self.n } else { self.n * self.spatial }
    }

    /// The feature of the element at canonical index `i`.
    fn feature_of(&self, i: usize) -> usize {
        let within = i % (self.c * self.spatial);
        if self.per_activation { within } else { within / self.spatial }
    }
}

/// The batch's statistics per feature: mean and biased variance.
#[derive(Debug, Clone, PartialEq)]
pub struct Stats {
    pub mean: Vec<f64>,
    pub variance: Vec<f64>,
}

pub fn stats(g: &Groups, x: &[f64]) -> Stats {
    let (features, count) = (g.features(), g.count().max(1) as f64);
    let mut mean = vec![0.0; features];
    for (i, v) in x.iter().enumerate() {
        mean[g.feature_of(i)] += v;
    }
    mean.iter_mut().for_each(|m| *m /= count);
    let mut variance = vec![0.0; features];
    for (i, v) in x.iter().enumerate() {
        let f = g.feature_of(i);
        variance[f] += (v - mean[f]) * (v - mean[f]);
    }
    variance.iter_mut().for_each(|s| *s /= count);
    Stats { mean, variance }
}

/// `1 / sqrt(variance + epsilon)` per feature.
pub fn inverse_std(variance: &[f64], epsilon: f64) -> Vec<f64> {
    variance.iter().map(|v| 1.0 / (v + epsilon).sqrt()).collect()
}

/// `scale * (x - mean) * inv_std + bias`.
pub fn normalize(g: &Groups, x: &[f64], mean: &[f64], inv_std: &[f64], scale: &[f64], bias: &[f64]) -> Vec<f64> {
    x.iter()
        .enumerate()
        .map(|(i, v)| {
            let f = g.feature_of(i);
            scale[f] * (v - mean[f]) * inv_std[f] + bias[f]
        })
        .collect()
}

/// The running statistics after a training step with `factor` (cuDNN's
/// exponentialAverageFactor): `running = (1 - factor) * running + factor * batch`, the variance
/// taken unbiased (`* M / (M - 1)`, with M the elements per feature).
pub fn update_running(g: &Groups, stats: &Stats, factor: f64, mean: &mut [f64], variance: &mut [f64]) {
    let m = g.count() as f64;
    let unbias = if m > 1.0 { m / (m - 1.0) } else { 1.0 };
    for f in 0..g.features() {
        mean[f] = (1.0 - factor) * mean[f] + factor * stats.mean[f];
        variance[f] = (1.0 - factor) * variance[f] + factor * stats.variance[f] * unbias;
    }
}

/// The gradients of a training step's normalisation.
#[derive(Debug, Clone, PartialEq)]
pub struct Gradients {
    pub dx: Vec<f64>,
    pub dscale: Vec<f64>,
    pub dbias: Vec<f64>,
}

/// Back through `y = scale * (x - mean) * inv_std + bias` with the batch's statistics.
pub fn backward(g: &Groups, x: &[f64], dy: &[f64], scale: &[f64], mean: &[f64], inv_std: &[f64]) -> Gradients {
    let features = g.features();
    let m = g.count().max(1) as f64;
    let (mut dscale, mut dbias) = (vec![0.0; features], vec![0.0; features]);
    for (i, (v, d)) in x.iter().zip(dy).enumerate() {
        let f = g.feature_of(i);
        dbias[f] += d;
        dscale[f] += d * (v - mean[f]) * inv_std[f];
    }
    let dx = x
        .iter()
        .zip(dy)
        .enumerate()
        .map(|(i, (v, d))| {
            let f = g.feature_of(i);
            let xhat = (v - mean[f]) * inv_std[f];
            scale[f] * inv_std[f] / m * (m * d - dbias[f] - xhat * dscale[f])
        })
        .collect();
    Gradients { dx, dscale, dbias }
}

/// `alpha * result + beta * prior`; the prior is not read when beta is 0 (cuDNN's rule, so an
/// output holding NaN is overwritten).
pub fn blend(alpha: f64, result: &[f64], beta: f64, prior: Option<&[f64]>) -> Vec<f64> {
    match prior {
        Some(p) if beta != 0.0 => result.iter().zip(p).map(|(r, p)| alpha * r + beta * p).collect(),
        _ => result.iter().map(|r| alpha * r).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SPATIAL: Groups = Groups { n: 2, c: 2, spatial: 2, per_activation: false };

    #[test]
    fn spatial_statistics_group_by_channel() {
        // n0: c0 = [1, 2], c1 = [10, 20]; n1: c0 = [3, 4], c1 = [30, 40].
        let x = [1.0, 2.0, 10.0, 20.0, 3.0, 4.0, 30.0, 40.0];
        let s = stats(&SPATIAL, &x);
        assert_eq!(s.mean, vec![2.5, 25.0]);
        assert_eq!(s.variance, vec![1.25, 125.0]);
        let mut rm = [0.0, 0.0];
        let mut rv = [1.0, 1.0];
        update_running(&SPATIAL, &s, 0.5, &mut rm, &mut rv);
        assert_eq!(rm, [1.25, 12.5]);
        // Unbiased: 1.25 * 4 / 3.
        assert!((rv[0] - (0.5 + 0.5 * 1.25 * 4.0 / 3.0)).abs() < 1e-12);
    }

    #[test]
    fn per_activation_groups_over_the_batch_only() {
        let g = Groups { per_activation: true, ..SPATIAL };
        let x = [1.0, 2.0, 10.0, 20.0, 3.0, 4.0, 30.0, 40.0];
        assert_eq!(stats(&g, &x).mean, vec![2.0, 3.0, 20.0, 30.0]);
    }

    #[test]
    fn normalized_output_has_zero_mean_and_the_backward_sums_match() {
        let x = [1.0, 2.0, 10.0, 20.0, 3.0, 4.0, 30.0, 40.0];
        let s = stats(&SPATIAL, &x);
        let inv = inverse_std(&s.variance, 0.0);
        let y = normalize(&SPATIAL, &x, &s.mean, &inv, &[1.0, 1.0], &[0.0, 0.0]);
        assert!(stats(&SPATIAL, &y).mean.iter().all(|m| m.abs() < 1e-12));
        let dy = [1.0; 8];
        let g = backward(&SPATIAL, &x, &dy, &[2.0, 2.0], &s.mean, &inv);
        assert_eq!(g.dbias, vec![4.0, 4.0]);
        // A constant gradient moves nothing through the normalisation.
        assert!(g.dx.iter().all(|d| d.abs() < 1e-12));
        assert!(g.dscale.iter().all(|d| d.abs() < 1e-12));
    }

    #[test]
    fn blend_reads_no_prior_when_beta_is_zero() {
        assert_eq!(blend(2.0, &[1.0], 0.0, Some(&[f64::NAN])), vec![2.0]);
        assert_eq!(blend(2.0, &[1.0], 1.0, Some(&[3.0])), vec![5.0]);
    }
}
