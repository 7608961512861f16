//! cuDNN's legacy computations on the CPU (emu), with cuDNN's formulas.
//!
//! Batch normalization: the batch's mean and
//! biased variance normalise, the running variance is updated with the unbiased one, and the
//! saved statistics are the mean and the inverse standard deviation `1 / sqrt(var + eps)`.
//!
//! Convolutions are direct (every tap of every output), in either of cuDNN's modes
//! (convolution flips the filter, cross-correlation does not), with padding, strides,
//! dilations and groups, in any number of spatial dimensions; activations are elementwise.
//!
//! Pooling (max, and averages that count the padding or not), softmax (over an image or over
//! the channels of a position; plain, with the maximum subtracted, or logarithmic), the
//! cross-channel LRN and the elementwise tensor operations (with broadcasting) follow cuDNN's
//! documented formulas.
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

/// The shape of a convolution, checked by the service: x is N x C x in..., w is
/// K x C/groups x filter..., y is N x K x out....
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConvGeometry {
    pub n: usize,
    pub c: usize,
    pub k: usize,
    pub groups: usize,
    pub input: Vec<usize>,
    pub filter: Vec<usize>,
    pub output: Vec<usize>,
    pub pads: Vec<i64>,
    pub strides: Vec<i64>,
    pub dilations: Vec<i64>,
    /// CUDNN_CONVOLUTION: the filter is applied flipped.
    pub flip: bool,
}

/// The coordinates of row-major index `i` in `dims`.
fn unravel(mut i: usize, dims: &[usize], out: &mut [usize]) {
    for d in (0..dims.len()).rev() {
        out[d] = i % dims[d];
        i /= dims[d];
    }
}

impl ConvGeometry {
    /// (output position, filter position, input position) of every tap inside the input.
    fn spatial_taps(&self) -> Vec<(usize, usize, usize)> {
        let (outputs, filters): (usize, usize) = (self.output.iter().product(), self.filter.iter().product());
        let dims = self.input.len();
        let (mut o, mut f) = (vec![0; dims], vec![0; dims]);
        let mut taps = Vec::new();
        for op in 0..outputs {
            unravel(op, &self.output, &mut o);
            'filter: for fp in 0..filters {
                unravel(fp, &self.filter, &mut f);
                let mut ip = 0usize;
                for d in 0..dims {
                    let tap = if self.flip { self.filter[d] - 1 - f[d] } else { f[d] };
                    let at = o[d] as i64 * self.strides[d] - self.pads[d] + tap as i64 * self.dilations[d];
                    if at < 0 || at >= self.input[d] as i64 {
                        continue 'filter;
                    }
                    ip = ip * self.input[d] + at as usize;
                }
                taps.push((op, fp, ip));
            }
        }
        taps
    }

    /// Visit every multiply of the convolution as (x index, w index, y index), in canonical
    /// (packed NCHW / KCRS) order of each tensor.
    pub fn for_each_tap(&self, mut visit: impl FnMut(usize, usize, usize)) {
        let taps = self.spatial_taps();
        let (inputs, filters, outputs): (usize, usize, usize) =
            (self.input.iter().product(), self.filter.iter().product(), self.output.iter().product());
        let groups = self.groups.max(1);
        let (c_per_group, k_per_group) = (self.c / groups, (self.k / groups).max(1));
        for n in 0..self.n {
            for k in 0..self.k {
                let g = k / k_per_group;
                for cg in 0..c_per_group {
                    let c = g * c_per_group + cg;
                    let (x0, w0, y0) =
                        ((n * self.c + c) * inputs, (k * c_per_group + cg) * filters, (n * self.k + k) * outputs);
                    for &(op, fp, ip) in &taps {
                        visit(x0 + ip, w0 + fp, y0 + op);
                    }
                }
            }
        }
    }

    pub fn x_len(&self) -> usize {
        self.n * self.c * self.input.iter().product::<usize>()
    }

    pub fn w_len(&self) -> usize {
        self.k * (self.c / self.groups.max(1)) * self.filter.iter().product::<usize>()
    }

    pub fn y_len(&self) -> usize {
        self.n * self.k * self.output.iter().product::<usize>()
    }
}

/// y = conv(x, w).
pub fn conv_forward(g: &ConvGeometry, x: &[f64], w: &[f64]) -> Vec<f64> {
    let mut y = vec![0.0; g.y_len()];
    g.for_each_tap(|xi, wi, yi| y[yi] += x[xi] * w[wi]);
    y
}

/// dx = the gradient of conv(x, w) with respect to x, given dy.
pub fn conv_backward_data(g: &ConvGeometry, w: &[f64], dy: &[f64]) -> Vec<f64> {
    let mut dx = vec![0.0; g.x_len()];
    g.for_each_tap(|xi, wi, yi| dx[xi] += w[wi] * dy[yi]);
    dx
}

/// dw = the gradient of conv(x, w) with respect to w, given dy.
pub fn conv_backward_filter(g: &ConvGeometry, x: &[f64], dy: &[f64]) -> Vec<f64> {
    let mut dw = vec![0.0; g.w_len()];
    g.for_each_tap(|xi, wi, yi| dw[wi] += x[xi] * dy[yi]);
    dw
}

/// The sum over the batch and the spatial positions per channel of `dy` (N x C x spatial).
pub fn channel_sums(n: usize, c: usize, spatial: usize, dy: &[f64]) -> Vec<f64> {
    let mut sums = vec![0.0; c];
    for (i, v) in dy.iter().enumerate().take(n * c * spatial) {
        sums[(i / spatial) % c] += v;
    }
    sums
}

/// cudnnActivationMode_t.
pub const ACT_SIGMOID: i32 = 0;
pub const ACT_RELU: i32 = 1;
pub const ACT_TANH: i32 = 2;
pub const ACT_CLIPPED_RELU: i32 = 3;
pub const ACT_ELU: i32 = 4;
pub const ACT_IDENTITY: i32 = 5;
pub const ACT_SWISH: i32 = 6;

/// One activation: its mode, `coef` (the clipped ReLU's ceiling, the ELU's alpha) and the
/// swish's beta.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Activation {
    pub mode: i32,
    pub coef: f64,
    pub swish_beta: f64,
}

fn sigmoid(v: f64) -> f64 {
    1.0 / (1.0 + (-v).exp())
}

impl Activation {
    pub fn forward(&self, x: f64) -> f64 {
        match self.mode {
            ACT_SIGMOID => sigmoid(x),
            ACT_RELU => x.max(0.0),
            ACT_TANH => x.tanh(),
            ACT_CLIPPED_RELU => x.max(0.0).min(self.coef),
            ACT_ELU => {
                if x > 0.0 {
                    x
                } else {
                    self.coef * (x.exp() - 1.0)
                }
            }
            ACT_SWISH => x * sigmoid(self.swish_beta * x),
            _ => x,
        }
    }

    /// dx from dy, with the forward's input `x` and output `y` (cuDNN takes both).
    pub fn backward(&self, x: f64, y: f64, dy: f64) -> f64 {
        match self.mode {
            ACT_SIGMOID => dy * y * (1.0 - y),
            ACT_RELU => {
                if x > 0.0 {
                    dy
                } else {
                    0.0
                }
            }
            ACT_TANH => dy * (1.0 - y * y),
            ACT_CLIPPED_RELU => {
                if x > 0.0 && x < self.coef {
                    dy
                } else {
                    0.0
                }
            }
            ACT_ELU => {
                if x > 0.0 {
                    dy
                } else {
                    dy * (y + self.coef)
                }
            }
            ACT_SWISH => {
                let s = sigmoid(self.swish_beta * x);
                dy * (s + self.swish_beta * x * s * (1.0 - s))
            }
            _ => dy,
        }
    }
}

/// cudnnPoolingMode_t.
pub const POOL_MAX: i32 = 0;
pub const POOL_AVERAGE_INCLUDE_PADDING: i32 = 1;
pub const POOL_AVERAGE_EXCLUDE_PADDING: i32 = 2;
pub const POOL_MAX_DETERMINISTIC: i32 = 3;

/// A pooling of an N x C x in... tensor into N x C x out..., checked by the service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolGeometry {
    /// N times C: the planes pooled one by one.
    pub planes: usize,
    pub input: Vec<usize>,
    pub output: Vec<usize>,
    pub window: Vec<i64>,
    pub pads: Vec<i64>,
    pub strides: Vec<i64>,
    pub mode: i32,
    /// CUDNN_PROPAGATE_NAN: a NaN in a max pooling's window is its maximum.
    pub propagate_nan: bool,
}

impl PoolGeometry {
    fn max(&self) -> bool {
        matches!(self.mode, POOL_MAX | POOL_MAX_DETERMINISTIC)
    }

    /// Each output element (plane-relative index) with the input elements (plane-relative) of
    /// its window that lie inside the input, and what an average divides by. Only the window's
    /// part inside the input is visited (a window may be far larger).
    fn for_each_window(&self, mut visit: impl FnMut(usize, &[usize], f64)) {
        let dims = self.output.len();
        let out_len: usize = self.output.iter().product();
        let window_len: f64 = self.window.iter().map(|&w| w as f64).product();
        let mut inside = Vec::new();
        for o in 0..out_len {
            inside.clear();
            // The window's extent inside the input in each dimension, outermost first.
            let mut rest = o;
            let mut ranges = vec![(0usize, 0usize); dims];
            for d in (0..dims).rev() {
                let at = (rest % self.output[d]) as i64;
                rest /= self.output[d];
                let start = at * self.strides[d] - self.pads[d];
                let lo = start.clamp(0, self.input[d] as i64) as usize;
                let hi = (start + self.window[d]).clamp(0, self.input[d] as i64) as usize;
                ranges[d] = (lo, hi.max(lo));
            }
            let mut index: Vec<usize> = ranges.iter().map(|r| r.0).collect();
            if ranges.iter().all(|r| r.1 > r.0) {
                'walk: loop {
                    inside.push(index.iter().zip(&self.input).fold(0usize, |acc, (&i, &n)| acc * n + i));
                    // The next position, innermost dimension fastest.
                    let mut d = dims;
                    loop {
                        if d == 0 {
                            break 'walk;
                        }
                        d -= 1;
                        index[d] += 1;
                        if index[d] < ranges[d].1 {
                            break;
                        }
                        index[d] = ranges[d].0;
                    }
                }
            }
            let divisor = match self.mode {
                POOL_AVERAGE_EXCLUDE_PADDING => inside.len() as f64,
                _ => window_len,
            };
            visit(o, &inside, divisor);
        }
    }

    /// The first maximum of a window (its plane-relative index), NaN as the geometry says.
    fn argmax(&self, plane: &[f64], inside: &[usize]) -> Option<usize> {
        let mut best: Option<usize> = None;
        for &i in inside {
            let v = plane[i];
            match best {
                _ if v.is_nan() && !self.propagate_nan => {}
                None => best = Some(i),
                Some(b) if plane[b].is_nan() => {}
                Some(b) if v.is_nan() || v > plane[b] => best = Some(i),
                Some(_) => {}
            }
        }
        best
    }
}

/// cudnnPoolingForward's result (before blending).
pub fn pooling_forward(g: &PoolGeometry, x: &[f64]) -> Vec<f64> {
    let (in_len, out_len) = (g.input.iter().product::<usize>(), g.output.iter().product::<usize>());
    let mut y = vec![0.0; g.planes * out_len];
    for p in 0..g.planes {
        let plane = &x[p * in_len..(p + 1) * in_len];
        let out = &mut y[p * out_len..(p + 1) * out_len];
        g.for_each_window(|o, inside, divisor| {
            out[o] = if g.max() {
                g.argmax(plane, inside).map_or(0.0, |i| plane[i])
            } else if divisor > 0.0 {
                inside.iter().map(|&i| plane[i]).sum::<f64>() / divisor
            } else {
                0.0
            };
        });
    }
    y
}

/// cudnnPoolingBackward's dx (before blending): a max pooling's gradient goes to the maximum
/// of `x` in each window, an average's spreads over the window's elements.
pub fn pooling_backward(g: &PoolGeometry, x: &[f64], dy: &[f64]) -> Vec<f64> {
    let (in_len, out_len) = (g.input.iter().product::<usize>(), g.output.iter().product::<usize>());
    let mut dx = vec![0.0; g.planes * in_len];
    for p in 0..g.planes {
        let plane = &x[p * in_len..(p + 1) * in_len];
        let grad = &dy[p * out_len..(p + 1) * out_len];
        let out = &mut dx[p * in_len..(p + 1) * in_len];
        g.for_each_window(|o, inside, divisor| {
            if g.max() {
                if let Some(i) = g.argmax(plane, inside) {
                    out[i] += grad[o];
                }
            } else if divisor > 0.0 {
                for &i in inside {
                    out[i] += grad[o] / divisor;
                }
            }
        });
    }
    dx
}

/// cudnnSoftmaxAlgorithm_t.
pub const SOFTMAX_FAST: i32 = 0;
pub const SOFTMAX_ACCURATE: i32 = 1;
pub const SOFTMAX_LOG: i32 = 2;

/// How a softmax groups an N x C x spatial tensor: over C x spatial per image (instance), or
/// over C per image and position (channel).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SoftmaxGroups {
    pub n: usize,
    pub c: usize,
    pub spatial: usize,
    pub per_channel: bool,
}

impl SoftmaxGroups {
    /// The canonical indices of each group.
    fn groups(&self) -> Vec<Vec<usize>> {
        let image = self.c * self.spatial;
        if self.per_channel {
            (0..self.n * self.spatial)
                .map(|g| {
                    let (n, s) = (g / self.spatial, g % self.spatial);
                    (0..self.c).map(|c| n * image + c * self.spatial + s).collect()
                })
                .collect()
        } else {
            (0..self.n).map(|n| (n * image..(n + 1) * image).collect()).collect()
        }
    }
}

/// cudnnSoftmaxForward's result: exp(x) / sum (FAST), the same with the group's maximum
/// subtracted first (ACCURATE), or its logarithm (LOG).
pub fn softmax_forward(g: &SoftmaxGroups, algo: i32, x: &[f64]) -> Vec<f64> {
    let mut y = vec![0.0; x.len()];
    for group in g.groups() {
        let max =
            if algo == SOFTMAX_FAST { 0.0 } else { group.iter().map(|&i| x[i]).fold(f64::NEG_INFINITY, f64::max) };
        let sum: f64 = group.iter().map(|&i| (x[i] - max).exp()).sum();
        for &i in &group {
            y[i] = if algo == SOFTMAX_LOG { x[i] - max - sum.ln() } else { (x[i] - max).exp() / sum };
        }
    }
    y
}

/// cudnnSoftmaxBackward's dx from the forward's `y` and `dy`: y (dy - sum(dy y)), or for LOG
/// dy - exp(y) sum(dy).
pub fn softmax_backward(g: &SoftmaxGroups, algo: i32, y: &[f64], dy: &[f64]) -> Vec<f64> {
    let mut dx = vec![0.0; y.len()];
    for group in g.groups() {
        if algo == SOFTMAX_LOG {
            let sum: f64 = group.iter().map(|&i| dy[i]).sum();
            for &i in &group {
                dx[i] = dy[i] - y[i].exp() * sum;
            }
        } else {
            let dot: f64 = group.iter().map(|&i| dy[i] * y[i]).sum();
            for &i in &group {
                dx[i] = y[i] * (dy[i] - dot);
            }
        }
    }
    dx
}

/// A cross-channel LRN over an N x C x spatial tensor: the window of `n` channels around
/// each (floor((n - 1) / 2) before, the rest after), `alpha` divided by `n` as cuDNN does.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Lrn {
    pub images: usize,
    pub c: usize,
    pub spatial: usize,
    pub n: usize,
    pub alpha: f64,
    pub beta: f64,
    pub k: f64,
}

impl Lrn {
    fn index(&self, image: usize, c: usize, s: usize) -> usize {
        (image * self.c + c) * self.spatial + s
    }

    /// The channels in the window of channel `c`.
    fn window(&self, c: usize) -> std::ops::Range<usize> {
        let behind = (self.n - 1) / 2;
        let ahead = self.n - 1 - behind;
        c.saturating_sub(behind)..(c + ahead + 1).min(self.c)
    }

    /// k + alpha / n * the sum of the squares in each element's window.
    fn scales(&self, x: &[f64]) -> Vec<f64> {
        let mut scale = vec![0.0; x.len()];
        for image in 0..self.images {
            for s in 0..self.spatial {
                for c in 0..self.c {
                    let sum: f64 = self.window(c).map(|j| x[self.index(image, j, s)].powi(2)).sum();
                    scale[self.index(image, c, s)] = self.k + self.alpha / self.n as f64 * sum;
                }
            }
        }
        scale
    }

    /// y = x / scale^beta.
    pub fn forward(&self, x: &[f64]) -> Vec<f64> {
        self.scales(x).iter().zip(x).map(|(s, v)| v * s.powf(-self.beta)).collect()
    }

    /// dx = dy scale^-beta - 2 beta alpha / n x sum over the windows holding the element of
    /// dy y / scale.
    pub fn backward(&self, x: &[f64], y: &[f64], dy: &[f64]) -> Vec<f64> {
        let scale = self.scales(x);
        let ratio: Vec<f64> = (0..x.len()).map(|i| dy[i] * y[i] / scale[i]).collect();
        let factor = 2.0 * self.beta * self.alpha / self.n as f64;
        let behind = (self.n - 1) / 2;
        let ahead = self.n - 1 - behind;
        let mut dx = vec![0.0; x.len()];
        for image in 0..self.images {
            for s in 0..self.spatial {
                for c in 0..self.c {
                    // The channels whose window holds c: c - ahead ..= c + behind.
                    let holders = c.saturating_sub(ahead)..(c + behind + 1).min(self.c);
                    let sum: f64 = holders.map(|j| ratio[self.index(image, j, s)]).sum();
                    let i = self.index(image, c, s);
                    dx[i] = dy[i] * scale[i].powf(-self.beta) - factor * x[i] * sum;
                }
            }
        }
        dx
    }
}

/// cudnnOpTensorOp_t.
pub const OP_ADD: i32 = 0;
pub const OP_MUL: i32 = 1;
pub const OP_MIN: i32 = 2;
pub const OP_MAX: i32 = 3;
pub const OP_SQRT: i32 = 4;
pub const OP_NOT: i32 = 5;

/// Whether the op reads A alone.
pub fn op_is_unary(op: i32) -> bool {
    matches!(op, OP_SQRT | OP_NOT)
}

/// One element of cudnnOpTensor's op(a, b) (b unused by the unary ones).
pub fn op_tensor(op: i32, a: f64, b: f64) -> f64 {
    match op {
        OP_ADD => a + b,
        OP_MUL => a * b,
        OP_MIN => a.min(b),
        OP_MAX => a.max(b),
        OP_SQRT => a.sqrt(),
        OP_NOT => 1.0 - a,
        _ => f64::NAN,
    }
}

/// For each canonical index of a tensor of `dims`, the canonical index of a tensor of
/// `from` (each of whose dimensions is the same or 1) broadcast over it.
pub fn broadcast_indices(dims: &[usize], from: &[usize]) -> Vec<usize> {
    let total: usize = dims.iter().product();
    (0..total)
        .map(|mut i| {
            let (mut index, mut inner) = (0usize, 1usize);
            for d in (0..dims.len()).rev() {
                let at = i % dims[d];
                i /= dims[d];
                if from[d] != 1 {
                    index += at * inner;
                }
                inner *= from[d];
            }
            index
        })
        .collect()
}

/// cudnnReduceTensorOp_t.
pub const REDUCE_ADD: i32 = 0;
pub const REDUCE_MUL: i32 = 1;
pub const REDUCE_MIN: i32 = 2;
pub const REDUCE_MAX: i32 = 3;
pub const REDUCE_AMAX: i32 = 4;
pub const REDUCE_AVG: i32 = 5;
pub const REDUCE_NORM1: i32 = 6;
pub const REDUCE_NORM2: i32 = 7;
pub const REDUCE_MUL_NO_ZEROS: i32 = 8;

/// Whether a reduction can answer indices (the element it picked).
pub fn reduce_has_indices(op: i32) -> bool {
    matches!(op, REDUCE_MIN | REDUCE_MAX | REDUCE_AMAX)
}

/// cudnnReduceTensor's result (before blending) and, for MIN, MAX and AMAX, the flattened
/// index within its group of the element each picked (the first, in canonical order). `a` is
/// A in canonical order, `group` the canonical index in C of each of A's elements
/// ([`broadcast_indices`] of C over A), `out` C's element count.
pub fn reduce(op: i32, a: &[f64], group: &[usize], out: usize) -> (Vec<f64>, Vec<u32>) {
    let mut acc: Vec<Option<f64>> = vec![None; out];
    let mut count = vec![0u32; out];
    let mut picked = vec![0u32; out];
    for (&v, &g) in a.iter().zip(group) {
        let ordinal = count[g];
        count[g] += 1;
        let value = match op {
            REDUCE_AMAX | REDUCE_NORM1 => v.abs(),
            REDUCE_NORM2 => v * v,
            _ => v,
        };
        if op == REDUCE_MUL_NO_ZEROS && value == 0.0 {
            continue;
        }
        acc[g] = Some(match acc[g] {
            None => {
                picked[g] = ordinal;
                value
            }
            Some(now) => match op {
                REDUCE_MUL | REDUCE_MUL_NO_ZEROS => now * value,
                REDUCE_MIN | REDUCE_MAX | REDUCE_AMAX => {
                    let better = if op == REDUCE_MIN { value < now } else { value > now };
                    if better {
                        picked[g] = ordinal;
                        value
                    } else {
                        now
                    }
                }
                _ => now + value,
            },
        });
    }
    let result = acc
        .iter()
        .zip(&count)
        .map(|(v, &n)| match (op, v) {
            // Nothing but zeros: the empty product.
            (REDUCE_MUL_NO_ZEROS, None) => 1.0,
            (_, None) => 0.0,
            (REDUCE_AVG, Some(v)) => v / f64::from(n.max(1)),
            (REDUCE_NORM2, Some(v)) => v.sqrt(),
            (_, Some(v)) => *v,
        })
        .collect();
    (result, picked)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn geometry(input: usize, filter: usize, pad: i64, stride: i64, flip: bool) -> ConvGeometry {
        let output = ((input as i64 + 2 * pad - filter as i64) / stride + 1) as usize;
        ConvGeometry {
            n: 1,
            c: 1,
            k: 1,
            groups: 1,
            input: vec![input],
            filter: vec![filter],
            output: vec![output],
            pads: vec![pad],
            strides: vec![stride],
            dilations: vec![1],
            flip,
        }
    }

    #[test]
    fn a_one_dimensional_convolution_matches_by_hand() {
        let g = geometry(4, 2, 0, 1, false);
        // Cross-correlation of [1 2 3 4] with [1 10].
        assert_eq!(conv_forward(&g, &[1.0, 2.0, 3.0, 4.0], &[1.0, 10.0]), vec![21.0, 32.0, 43.0]);
        // Convolution flips the filter.
        let flipped = ConvGeometry { flip: true, ..g.clone() };
        assert_eq!(conv_forward(&flipped, &[1.0, 2.0, 3.0, 4.0], &[1.0, 10.0]), vec![12.0, 23.0, 34.0]);
        // Padding and stride: [0 1 2 3 4 0] taken at 0, 2, 4.
        let padded = geometry(4, 2, 1, 2, false);
        assert_eq!(conv_forward(&padded, &[1.0, 2.0, 3.0, 4.0], &[1.0, 10.0]), vec![10.0, 32.0, 4.0]);
    }

    #[test]
    fn the_backward_passes_are_the_adjoints_of_the_forward() {
        // <conv(x, w), dy> = <x, dx(w, dy)> = <w, dw(x, dy)> for any x, w, dy.
        let g = ConvGeometry {
            n: 2,
            c: 4,
            k: 6,
            groups: 2,
            input: vec![5, 4],
            filter: vec![3, 2],
            output: vec![3, 2],
            pads: vec![1, 0],
            strides: vec![2, 2],
            dilations: vec![1, 2],
            flip: true,
        };
        let fill =
            |len: usize, seed: usize| -> Vec<f64> { (0..len).map(|i| ((i * 7 + seed) % 11) as f64 - 5.0).collect() };
        let (x, w, dy) = (fill(g.x_len(), 1), fill(g.w_len(), 2), fill(g.y_len(), 3));
        let dot = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(a, b)| a * b).sum::<f64>();
        let forward = dot(&conv_forward(&g, &x, &w), &dy);
        assert!(forward != 0.0);
        assert_eq!(forward, dot(&x, &conv_backward_data(&g, &w, &dy)));
        assert_eq!(forward, dot(&w, &conv_backward_filter(&g, &x, &dy)));
    }

    #[test]
    fn activations_and_their_gradients() {
        let act = |mode| Activation { mode, coef: 1.5, swish_beta: 1.0 };
        assert_eq!(act(ACT_RELU).forward(-2.0), 0.0);
        assert_eq!(act(ACT_CLIPPED_RELU).forward(3.0), 1.5);
        assert_eq!(act(ACT_SIGMOID).forward(0.0), 0.5);
        // Numerical derivatives agree.
        for mode in [ACT_SIGMOID, ACT_TANH, ACT_ELU, ACT_SWISH] {
            let (a, x, h) = (act(mode), -0.7, 1e-6);
            let numeric = (a.forward(x + h) - a.forward(x - h)) / (2.0 * h);
            assert!((a.backward(x, a.forward(x), 1.0) - numeric).abs() < 1e-6, "mode {mode}");
        }
        assert_eq!(channel_sums(2, 2, 2, &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]), vec![14.0, 22.0]);
    }

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

    #[test]
    fn pooling_takes_the_window_maximum_or_average() {
        // One 3x3 plane, a 2x2 window, stride 1, padding 1 on each side: a 4x4 output.
        let x: Vec<f64> = (1..=9).map(f64::from).collect();
        let g = |mode| PoolGeometry {
            planes: 1,
            input: vec![3, 3],
            output: vec![4, 4],
            window: vec![2, 2],
            pads: vec![1, 1],
            strides: vec![1, 1],
            mode,
            propagate_nan: false,
        };
        let max = pooling_forward(&g(POOL_MAX), &x);
        assert_eq!(max[0], 1.0);
        assert_eq!(max[5], 5.0);
        assert_eq!(max[15], 9.0);
        // The corner window holds one element: counted over 4 with the padding, 1 without.
        assert_eq!(pooling_forward(&g(POOL_AVERAGE_INCLUDE_PADDING), &x)[0], 0.25);
        assert_eq!(pooling_forward(&g(POOL_AVERAGE_EXCLUDE_PADDING), &x)[0], 1.0);
        let dy = vec![1.0; 16];
        let dx = pooling_backward(&g(POOL_MAX), &x, &dy);
        // 9 is the maximum of the four windows that hold it.
        assert_eq!(dx[8], 4.0);
        let total: f64 = pooling_backward(&g(POOL_AVERAGE_INCLUDE_PADDING), &x, &dy).iter().sum();
        assert!((total - 9.0).abs() < 1e-12, "each of the 16 windows spreads 1/4 per element");
    }

    #[test]
    fn softmax_groups_sum_to_one_and_backward_is_its_gradient() {
        let g = SoftmaxGroups { n: 2, c: 3, spatial: 2, per_channel: true };
        let x: Vec<f64> = (0..12).map(|i| f64::from(i) * 0.3 - 1.0).collect();
        let y = softmax_forward(&g, SOFTMAX_ACCURATE, &x);
        let sum: f64 = [0, 2, 4].iter().map(|&i| y[i]).sum();
        assert!((sum - 1.0).abs() < 1e-12);
        let log = softmax_forward(&g, SOFTMAX_LOG, &x);
        assert!((log[3].exp() - y[3]).abs() < 1e-12);
        // The gradient of sum(w * y) by finite differences.
        let w: Vec<f64> = (0..12).map(|i| f64::from(i % 5) - 2.0).collect();
        let dx = softmax_backward(&g, SOFTMAX_ACCURATE, &y, &w);
        let f = |x: &[f64]| softmax_forward(&g, SOFTMAX_ACCURATE, x).iter().zip(&w).map(|(a, b)| a * b).sum::<f64>();
        let mut bumped = x.clone();
        bumped[4] += 1e-6;
        assert!(((f(&bumped) - f(&x)) / 1e-6 - dx[4]).abs() < 1e-4);
    }

    #[test]
    fn lrn_backward_is_the_forward_gradient() {
        let lrn = Lrn { images: 1, c: 6, spatial: 2, n: 4, alpha: 0.5, beta: 0.75, k: 1.5 };
        let x: Vec<f64> = (0..12).map(|i| f64::from(i) * 0.25 - 1.0).collect();
        let w: Vec<f64> = (0..12).map(|i| f64::from(i % 4) - 1.5).collect();
        let y = lrn.forward(&x);
        let dx = lrn.backward(&x, &y, &w);
        let f = |x: &[f64]| lrn.forward(x).iter().zip(&w).map(|(a, b)| a * b).sum::<f64>();
        for i in 0..12 {
            let mut bumped = x.clone();
            bumped[i] += 1e-6;
            assert!(((f(&bumped) - f(&x)) / 1e-6 - dx[i]).abs() < 1e-4, "element {i}");
        }
    }

    #[test]
    fn broadcasting_repeats_the_dimensions_of_one() {
        assert_eq!(broadcast_indices(&[2, 3], &[1, 3]), vec![0, 1, 2, 0, 1, 2]);
        assert_eq!(broadcast_indices(&[2, 3], &[2, 1]), vec![0, 0, 0, 1, 1, 1]);
        assert_eq!(broadcast_indices(&[2, 3], &[2, 3]), vec![0, 1, 2, 3, 4, 5]);
    }

    #[test]
    fn reductions_answer_cudnns_values_and_indices() {
        // A 2x3 tensor reduced over its columns.
        let a = [1.0, -4.0, 2.0, 0.0, 3.0, -1.0];
        let group = broadcast_indices(&[2, 3], &[2, 1]);
        let r = |op| reduce(op, &a, &group, 2);
        assert_eq!(r(REDUCE_ADD).0, vec![-1.0, 2.0]);
        assert_eq!(r(REDUCE_MUL).0, vec![-8.0, 0.0]);
        assert_eq!(r(REDUCE_MUL_NO_ZEROS).0, vec![-8.0, -3.0]);
        assert_eq!(r(REDUCE_MIN), (vec![-4.0, -1.0], vec![1, 2]));
        assert_eq!(r(REDUCE_MAX), (vec![2.0, 3.0], vec![2, 1]));
        assert_eq!(r(REDUCE_AMAX), (vec![4.0, 3.0], vec![1, 1]));
        assert_eq!(r(REDUCE_AVG).0, vec![-1.0 / 3.0, 2.0 / 3.0]);
        assert_eq!(r(REDUCE_NORM1).0, vec![7.0, 4.0]);
        assert_eq!(r(REDUCE_NORM2).0, vec![21f64.sqrt(), 10f64.sqrt()]);
    }
}
