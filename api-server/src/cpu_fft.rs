//! cuFFT's transforms on the server's CPU (`emu`, where there is no libcufft): a plan's
//! [`Layout`] as cuFFT defines it (rank 1 to 3, batches, the basic and the advanced data
//! layouts), the extents a transform reads and writes, and the transform itself, computed with
//! `rustfft` in double precision whatever the plan's precision (single-precision data is
//! widened on reading and rounded on writing).
//!
//! cuFFT's conventions (its documentation, "Data Layout" and "Advanced Data Layout"): element
//! `x` of transform `b` of a side is at `b * dist + stride * sum_k(x_k * prod_{j>k} embed_j)`
//! elements from the side's pointer; a NULL embedding is the basic layout (the side's logical
//! sizes, stride 1, distance their product), in which a real side of an in-place transform is
//! padded to `2 * (n_last / 2 + 1)` reals in its last dimension. The complex side of a real
//! transform holds the non-redundant half of the spectrum, `n_last / 2 + 1` values in the last
//! dimension. Transforms are unnormalised, the forward one with sign -1.

use rustfft::num_complex::Complex;
use rustfft::{FftDirection, FftPlanner};

/// cuFFT's transform types (`cufftType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FftType {
    C2C,
    R2C,
    C2R,
    Z2Z,
    D2Z,
    Z2D,
}

impl FftType {
    /// The type a `cufftType` value names.
    pub fn from_code(code: i32) -> Option<FftType> {
        Some(match code {
            0x29 => FftType::C2C,
            0x2a => FftType::R2C,
            0x2c => FftType::C2R,
            0x69 => FftType::Z2Z,
            0x6a => FftType::D2Z,
            0x6c => FftType::Z2D,
            _ => return None,
        })
    }

    pub fn code(self) -> i32 {
        match self {
            FftType::C2C => 0x29,
            FftType::R2C => 0x2a,
            FftType::C2R => 0x2c,
            FftType::Z2Z => 0x69,
            FftType::D2Z => 0x6a,
            FftType::Z2D => 0x6c,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            FftType::C2C => "C2C",
            FftType::R2C => "R2C",
            FftType::C2R => "C2R",
            FftType::Z2Z => "Z2Z",
            FftType::D2Z => "D2Z",
            FftType::Z2D => "Z2D",
        }
    }

    pub fn double(self) -> bool {
        matches!(self, FftType::Z2Z | FftType::D2Z | FftType::Z2D)
    }

    fn real_input(self) -> bool {
        matches!(self, FftType::R2C | FftType::D2Z)
    }

    fn real_output(self) -> bool {
        matches!(self, FftType::C2R | FftType::Z2D)
    }

    /// Bytes of one real number of the type's precision.
    fn real_bytes(self) -> u64 {
        if self.double() { 8 } else { 4 }
    }

    /// Bytes of one element of a side: a real or a complex number.
    fn element_bytes(self, input: bool) -> u64 {
        let real = if input { self.real_input() } else { self.real_output() };
        if real { self.real_bytes() } else { 2 * self.real_bytes() }
    }
}

/// One side (input or output) of the advanced layout; `embed: None` is the basic layout
/// (stride and distance then ignored, as cuFFT does).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Side {
    pub embed: Option<Vec<u64>>,
    pub stride: u64,
    pub dist: u64,
}

/// A made plan's transform: what every exec of the plan reads, computes and writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    pub fft_type: FftType,
    /// The transform's sizes, outermost first (rank 1 to 3).
    pub n: Vec<u64>,
    pub input: Side,
    pub output: Side,
    pub batch: u64,
}

/// Why a plan's parameters are refused, and the status cuFFT gives.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    #[error("type {0:#x} is not a cuFFT type")]
    Type(i32),
    #[error("rank {0} is not 1, 2 or 3")]
    Rank(i64),
    #[error("size {size} of dimension {dim} is not positive or too large")]
    Size { dim: usize, size: i64 },
    #[error("batch {0} is not positive or too large")]
    Batch(i64),
    #[error("{side} embedding {embed} of dimension {dim} is smaller than the {size} elements it holds")]
    Embed { side: &'static str, dim: usize, embed: i64, size: u64 },
    #[error("{side} stride {stride} or distance {dist} is not positive")]
    Stride { side: &'static str, stride: i64, dist: i64 },
    #[error("the transform of {0} elements is more than the server's CPU transforms")]
    TooLarge(u64),
    #[error("one embedding is NULL and the other is not (cuFFT 13 refuses the pair)")]
    OneEmbedding,
}

impl LayoutError {
    /// Whether cuFFT answers this with `CUFFT_INVALID_TYPE` (the rest: `_INVALID_SIZE` for
    /// sizes, `_INVALID_VALUE` for the layout's other numbers).
    pub fn is_type(&self) -> bool {
        matches!(self, LayoutError::Type(_))
    }

    pub fn is_size(&self) -> bool {
        matches!(
            self,
            LayoutError::Rank(_) | LayoutError::Size { .. } | LayoutError::Batch(_) | LayoutError::TooLarge(_)
        )
    }
}

/// The most elements one transform (one batch) may have on the CPU: 2^27 complex doubles are
/// 2 GiB of the server's memory.
pub const MAX_CPU_ELEMENTS: u64 = 1 << 27;

/// A plan's parameters as cuFFT's calls give them (PlanMany's, of which the others are cases).
pub struct PlanParams<'a> {
    pub rank: i64,
    pub n: &'a [i64],
    pub inembed: Option<&'a [i64]>,
    pub istride: i64,
    pub idist: i64,
    pub onembed: Option<&'a [i64]>,
    pub ostride: i64,
    pub odist: i64,
    pub fft_type: i32,
    pub batch: i64,
}

impl Layout {
    /// The layout of a plan of these parameters, refused as cuFFT refuses it.
    pub fn new(p: &PlanParams<'_>) -> Result<Layout, LayoutError> {
        let fft_type = FftType::from_code(p.fft_type).ok_or(LayoutError::Type(p.fft_type))?;
        if !(1..=3).contains(&p.rank) || p.n.len() as i64 != p.rank {
            return Err(LayoutError::Rank(p.rank));
        }
        let n =
            p.n.iter()
                .enumerate()
                .map(|(dim, &size)| {
                    u64::try_from(size)
                        .ok()
                        .filter(|s| *s >= 1 && *s <= i64::from(i32::MAX) as u64)
                        .ok_or(LayoutError::Size { dim, size })
                })
                .collect::<Result<Vec<u64>, _>>()?;
        let batch = u64::try_from(p.batch).ok().filter(|b| *b >= 1).ok_or(LayoutError::Batch(p.batch))?;
        if p.inembed.is_some() != p.onembed.is_some() {
            return Err(LayoutError::OneEmbedding);
        }
        let mut layout = Layout {
            fft_type,
            n,
            input: Side { embed: None, stride: 1, dist: 0 },
            output: Side { embed: None, stride: 1, dist: 0 },
            batch,
        };
        layout.input = layout.side("input", p.inembed, p.istride, p.idist)?;
        layout.output = layout.side("output", p.onembed, p.ostride, p.odist)?;
        // The extents must be numbers (checked arithmetic), in place or not.
        for in_place in [false, true] {
            for input in [false, true] {
                layout.extent_bytes(input, in_place).ok_or(LayoutError::TooLarge(u64::MAX))?;
            }
        }
        Ok(layout)
    }

    fn side(&self, name: &'static str, embed: Option<&[i64]>, stride: i64, dist: i64) -> Result<Side, LayoutError> {
        let Some(embed) = embed else { return Ok(Side { embed: None, stride: 1, dist: 0 }) };
        let dims = self.dims(name == "input");
        if embed.len() != dims.len() {
            return Err(LayoutError::Rank(embed.len() as i64));
        }
        if stride < 1 || dist < 0 {
            return Err(LayoutError::Stride { side: name, stride, dist });
        }
        // The outermost embedding only bounds the array (cuFFT's formula never multiplies by
        // it); the inner ones must hold their dimension.
        let embed = embed
            .iter()
            .zip(&dims)
            .enumerate()
            .map(|(dim, (&e, &size))| match u64::try_from(e) {
                Ok(e) if dim == 0 || e >= size => Ok(e),
                _ => Err(LayoutError::Embed { side: name, dim, embed: e, size }),
            })
            .collect::<Result<Vec<u64>, _>>()?;
        Ok(Side { embed: Some(embed), stride: stride as u64, dist: dist as u64 })
    }

    /// The logical sizes of a side: the transform's, with the last halved (plus one) on the
    /// complex side of a real transform.
    fn dims(&self, input: bool) -> Vec<u64> {
        let mut d = self.n.clone();
        let complex_half = if input { self.fft_type.real_output() } else { self.fft_type.real_input() };
        if complex_half {
            let last = d.len() - 1;
            d[last] = d[last] / 2 + 1;
        }
        d
    }

    /// Elements of one transform.
    pub fn elements(&self) -> u64 {
        self.n.iter().product()
    }

    /// A side's sizes, embedding, stride and distance as an exec uses them.
    fn geometry(&self, input: bool, in_place: bool) -> Option<Geometry> {
        let side = if input { &self.input } else { &self.output };
        let dims = self.dims(input);
        let (embed, stride, dist) = match &side.embed {
            Some(e) => (e.clone(), side.stride, side.dist),
            None => {
                let mut e = dims.clone();
                let real = if input { self.fft_type.real_input() } else { self.fft_type.real_output() };
                if real && in_place {
                    let last = e.len() - 1;
                    e[last] = 2 * (self.n[last] / 2 + 1);
                }
                let dist = e.iter().try_fold(1u64, |a, &x| a.checked_mul(x))?;
                (e, 1, dist)
            }
        };
        // Element strides per dimension: stride * prod_{j>k} embed_j.
        let mut pitch = vec![0u64; dims.len()];
        let mut acc = stride;
        for k in (0..dims.len()).rev() {
            pitch[k] = acc;
            acc = acc.checked_mul(embed[k])?;
        }
        Some(Geometry { dims, pitch, dist, element_bytes: self.fft_type.element_bytes(input) })
    }

    /// Bytes from a side's pointer that its batches span (the last element's end); `None` when
    /// the number is beyond 64 bits.
    pub fn extent_bytes(&self, input: bool, in_place: bool) -> Option<u64> {
        let g = self.geometry(input, in_place)?;
        let mut last = (self.batch - 1).checked_mul(g.dist)?;
        for (d, p) in g.dims.iter().zip(&g.pitch) {
            last = last.checked_add((d - 1).checked_mul(*p)?)?;
        }
        last.checked_add(1)?.checked_mul(g.element_bytes)
    }

    /// The CPU's work for one transform, in bytes: the transform's complex buffer and
    /// rustfft's scratch for its longest dimension (what this server reports as the work size).
    pub fn cpu_work_bytes(&self) -> Result<u64, LayoutError> {
        let elements = self.elements();
        if elements > MAX_CPU_ELEMENTS {
            return Err(LayoutError::TooLarge(elements));
        }
        let mut planner = FftPlanner::<f64>::new();
        let scratch = self
            .n
            .iter()
            .map(|&len| planner.plan_fft_forward(len as usize).get_inplace_scratch_len() as u64)
            .max()
            .unwrap_or(0);
        Ok((elements + scratch) * 16)
    }

    /// Run the plan's transform: `input` holds the input side's extent, `output` the output
    /// side's (read first, so that what the layout skips stays as it was), which gets the
    /// result. `inverse` picks the sign of a complex-to-complex transform (`CUFFT_INVERSE`);
    /// the real ones have theirs. The buffers are the sizes [`Layout::extent_bytes`] gives.
    pub fn execute(&self, input: &[u8], output: &mut [u8], in_place: bool, inverse: bool) -> Result<(), LayoutError> {
        let elements = self.elements();
        if elements > MAX_CPU_ELEMENTS {
            return Err(LayoutError::TooLarge(elements));
        }
        let too_large = LayoutError::TooLarge(elements);
        let gi = self.geometry(true, in_place).ok_or(too_large.clone())?;
        let go = self.geometry(false, in_place).ok_or(too_large)?;
        let t = self.fft_type;
        let direction = match t {
            FftType::R2C | FftType::D2Z => FftDirection::Forward,
            FftType::C2R | FftType::Z2D => FftDirection::Inverse,
            _ if inverse => FftDirection::Inverse,
            _ => FftDirection::Forward,
        };
        let mut planner = FftPlanner::<f64>::new();
        let n: Vec<usize> = self.n.iter().map(|&x| x as usize).collect();
        let mut buf = vec![Complex::new(0.0, 0.0); elements as usize];
        let wide = t.double();
        for b in 0..self.batch {
            // Gather into the full complex array of the transform's sizes.
            if t.real_output() {
                let half = gather(input, &gi, b, false, wide);
                expand_hermitian(&half, &n, &mut buf);
            } else {
                let values = gather(input, &gi, b, t.real_input(), wide);
                buf.copy_from_slice(&values);
            }
            transform(&mut planner, &mut buf, &n, direction);
            // Scatter the output side's part of it.
            if t.real_input() {
                scatter(output, &go, b, &half_of(&buf, &n), false, wide);
            } else {
                scatter(output, &go, b, &buf, t.real_output(), wide);
            }
        }
        Ok(())
    }
}

/// A side as an exec walks it.
struct Geometry {
    dims: Vec<u64>,
    /// Elements between neighbours of each dimension.
    pitch: Vec<u64>,
    dist: u64,
    element_bytes: u64,
}

impl Geometry {
    /// Element offsets of batch `b`, in row-major order of the side's logical sizes.
    fn offsets(&self, b: u64) -> impl Iterator<Item = u64> + '_ {
        let count: u64 = self.dims.iter().product();
        (0..count).map(move |mut i| {
            let mut off = b * self.dist;
            for k in (0..self.dims.len()).rev() {
                off += (i % self.dims[k]) * self.pitch[k];
                i /= self.dims[k];
            }
            off
        })
    }
}

fn read_real(bytes: &[u8], at: usize, wide: bool) -> f64 {
    if wide {
        f64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"))
    } else {
        f64::from(f32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes")))
    }
}

fn write_real(bytes: &mut [u8], at: usize, value: f64, wide: bool) {
    if wide {
        bytes[at..at + 8].copy_from_slice(&value.to_le_bytes());
    } else {
        bytes[at..at + 4].copy_from_slice(&(value as f32).to_le_bytes());
    }
}

/// The values of batch `b` of a side, in row-major order (reals as complex numbers).
fn gather(bytes: &[u8], g: &Geometry, b: u64, real: bool, wide: bool) -> Vec<Complex<f64>> {
    let width = if wide { 8 } else { 4 };
    g.offsets(b)
        .map(|off| {
            let at = (off * g.element_bytes) as usize;
            if real {
                Complex::new(read_real(bytes, at, wide), 0.0)
            } else {
                Complex::new(read_real(bytes, at, wide), read_real(bytes, at + width, wide))
            }
        })
        .collect()
}

/// Write batch `b` of a side from row-major `values` (real parts only on a real side).
fn scatter(bytes: &mut [u8], g: &Geometry, b: u64, values: &[Complex<f64>], real: bool, wide: bool) {
    let width = if wide { 8 } else { 4 };
    for (off, v) in g.offsets(b).zip(values) {
        let at = (off * g.element_bytes) as usize;
        write_real(bytes, at, v.re, wide);
        if !real {
            write_real(bytes, at + width, v.im, wide);
        }
    }
}

/// The non-redundant half (last dimension `n_last / 2 + 1`) of a full spectrum.
fn half_of(full: &[Complex<f64>], n: &[usize]) -> Vec<Complex<f64>> {
    let last = n[n.len() - 1];
    let half = last / 2 + 1;
    full.chunks(last).flat_map(|row| row[..half].iter().copied()).collect()
}

/// The full spectrum of a real signal from its half: the values beyond the half are the
/// conjugates of their mirror images (index `-k` in every dimension).
fn expand_hermitian(half: &[Complex<f64>], n: &[usize], full: &mut [Complex<f64>]) {
    let rank = n.len();
    let last = n[rank - 1];
    let h = last / 2 + 1;
    let outer: usize = n[..rank - 1].iter().product();
    for o in 0..outer {
        // The mirror of the outer index, dimension by dimension.
        let mut rest = o;
        let mut mirror = 0;
        let mut scale = 1;
        for k in (0..rank - 1).rev() {
            let x = rest % n[k];
            rest /= n[k];
            mirror += ((n[k] - x) % n[k]) * scale;
            scale *= n[k];
        }
        for x in 0..last {
            full[o * last + x] = if x < h { half[o * h + x] } else { half[mirror * h + (last - x)].conj() };
        }
    }
}

/// The unnormalised multi-dimensional transform of row-major `buf`: one-dimensional transforms
/// along each dimension.
fn transform(planner: &mut FftPlanner<f64>, buf: &mut [Complex<f64>], n: &[usize], direction: FftDirection) {
    let total = buf.len();
    for (axis, &len) in n.iter().enumerate() {
        if len == 1 {
            continue;
        }
        let fft = planner.plan_fft(len, direction);
        let inner: usize = n[axis + 1..].iter().product();
        let mut line = vec![Complex::new(0.0, 0.0); len];
        let mut scratch = vec![Complex::new(0.0, 0.0); fft.get_inplace_scratch_len()];
        for outer in 0..total / (len * inner) {
            for i in 0..inner {
                let base = outer * len * inner + i;
                for (x, v) in line.iter_mut().enumerate() {
                    *v = buf[base + x * inner];
                }
                fft.process_with_scratch(&mut line, &mut scratch);
                for (x, v) in line.iter().enumerate() {
                    buf[base + x * inner] = *v;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn basic(fft_type: FftType, n: &[i64], batch: i64) -> Layout {
        Layout::new(&PlanParams {
            rank: n.len() as i64,
            n,
            inembed: None,
            istride: 1,
            idist: 0,
            onembed: None,
            ostride: 1,
            odist: 0,
            fft_type: fft_type.code(),
            batch,
        })
        .unwrap()
    }

    fn complex_bytes(v: &[(f64, f64)]) -> Vec<u8> {
        v.iter().flat_map(|(re, im)| [(*re as f32).to_le_bytes(), (*im as f32).to_le_bytes()].concat()).collect()
    }

    fn floats(b: &[u8]) -> Vec<f32> {
        b.chunks(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()
    }

    /// The direct DFT of a 1D complex signal, sign -1.
    fn dft(x: &[(f64, f64)]) -> Vec<(f64, f64)> {
        let n = x.len();
        (0..n)
            .map(|k| {
                x.iter().enumerate().fold((0.0, 0.0), |(re, im), (j, (a, b))| {
                    let ang = -2.0 * std::f64::consts::PI * (j * k) as f64 / n as f64;
                    (re + a * ang.cos() - b * ang.sin(), im + a * ang.sin() + b * ang.cos())
                })
            })
            .collect()
    }

    #[test]
    fn a_c2c_transform_is_the_dft_with_sign_minus_one() {
        let x: Vec<(f64, f64)> = (0..6).map(|i| (i as f64, (i * i) as f64 * 0.5 - 1.0)).collect();
        let l = basic(FftType::C2C, &[6], 1);
        assert_eq!(l.extent_bytes(true, false), Some(48));
        let input = complex_bytes(&x);
        let mut out = vec![0u8; 48];
        l.execute(&input, &mut out, false, false).unwrap();
        let want = dft(&x);
        for (k, (re, im)) in want.iter().enumerate() {
            let got = floats(&out);
            assert!((got[2 * k] as f64 - re).abs() < 1e-4 && (got[2 * k + 1] as f64 - im).abs() < 1e-4, "{k}");
        }
    }

    #[test]
    fn r2c_then_c2r_gives_the_signal_times_n_in_2d_and_in_place_padding() {
        let n = [3i64, 4];
        let r2c = basic(FftType::R2C, &n, 2);
        let c2r = basic(FftType::C2R, &n, 2);
        // In place: rows of 2 * (4 / 2 + 1) = 6 reals, of which the last row's padding is
        // beyond the last element read.
        assert_eq!(r2c.extent_bytes(true, true), Some((2 * 3 * 6 - 2) * 4));
        assert_eq!(r2c.extent_bytes(false, true), Some(2 * 3 * 3 * 8));
        assert_eq!(r2c.extent_bytes(true, false), Some(2 * 12 * 4));
        let signal: Vec<f32> = (0..24).map(|i| ((i * 7) % 11) as f32 - 3.0).collect();
        let input: Vec<u8> = signal.iter().flat_map(|v| v.to_le_bytes()).collect();
        let mut spectrum = vec![0u8; r2c.extent_bytes(false, false).unwrap() as usize];
        r2c.execute(&input, &mut spectrum, false, false).unwrap();
        // The DC term of each batch is the sum of its signal.
        let s = floats(&spectrum);
        let sum0: f32 = signal[..12].iter().sum();
        assert!((s[0] - sum0).abs() < 1e-4 && s[1].abs() < 1e-4);
        let mut back = vec![0u8; c2r.extent_bytes(false, false).unwrap() as usize];
        c2r.execute(&spectrum, &mut back, false, false).unwrap();
        for (got, want) in floats(&back).iter().zip(&signal) {
            assert!((got - want * 12.0).abs() < 1e-3, "{got} {want}");
        }
    }

    #[test]
    fn the_advanced_layout_reads_strided_batches_and_leaves_the_gaps() {
        // Two transforms of 4 interleaved (stride 2, distance 1) in, out to distance 5 apart.
        let l = Layout::new(&PlanParams {
            rank: 1,
            n: &[4],
            inembed: Some(&[4]),
            istride: 2,
            idist: 1,
            onembed: Some(&[4]),
            ostride: 1,
            odist: 5,
            fft_type: FftType::C2C.code(),
            batch: 2,
        })
        .unwrap();
        assert_eq!(l.extent_bytes(true, false), Some(8 * 8));
        assert_eq!(l.extent_bytes(false, false), Some(9 * 8));
        let x: Vec<(f64, f64)> = (0..8).map(|i| (i as f64, 0.0)).collect();
        let mut out = complex_bytes(&[(99.0, 99.0); 9]);
        l.execute(&complex_bytes(&x), &mut out, false, false).unwrap();
        let got = floats(&out);
        // Batch 0 is 0, 2, 4, 6: its DC is 12; batch 1 is 1, 3, 5, 7: DC 16, at element 5.
        assert_eq!((got[0], got[10]), (12.0, 16.0));
        assert_eq!((got[8], got[9]), (99.0, 99.0), "the gap is untouched");
    }

    #[test]
    fn bad_parameters_are_refused_as_cufft_refuses_them() {
        let p = |n: &'static [i64], t: i32, batch: i64| PlanParams {
            rank: n.len() as i64,
            n,
            inembed: None,
            istride: 1,
            idist: 0,
            onembed: None,
            ostride: 1,
            odist: 0,
            fft_type: t,
            batch,
        };
        assert!(Layout::new(&p(&[0], 0x29, 1)).unwrap_err().is_size());
        assert!(Layout::new(&p(&[8], 0x29, 0)).unwrap_err().is_size());
        assert!(Layout::new(&p(&[8], 0x99, 1)).unwrap_err().is_type());
        assert!(Layout::new(&p(&[1, 1, 1, 1], 0x29, 1)).unwrap_err().is_size());
        // Extents past 64 bits; a transform past what the CPU computes.
        let huge = Layout::new(&p(&[i32::MAX as i64, i32::MAX as i64, 2], 0x29, i32::MAX as i64));
        assert!(huge.is_err_and(|e| e.is_size()));
        let big = Layout::new(&p(&[1 << 20, 1 << 10], 0x29, 1)).unwrap();
        assert!(big.cpu_work_bytes().unwrap_err().is_size());
        let mut q = p(&[4, 4], 0x29, 1);
        q.inembed = Some(&[4, 3]);
        assert_eq!(Layout::new(&q).err(), Some(LayoutError::OneEmbedding), "one NULL embedding beside one");
        q.onembed = Some(&[4, 4]);
        assert!(matches!(Layout::new(&q), Err(LayoutError::Embed { .. })));
        q.inembed = Some(&[4, 4]);
        q.istride = 0;
        assert!(matches!(Layout::new(&q), Err(LayoutError::Stride { .. })));
    }
}
