//! The BLAS on the CPU: what the `emu` backend runs cuBLAS's calls with. Operands are read
//! from device memory into host vectors, computed here (GEMMs by `matrixmultiply`, the rest in
//! plain loops), and written back. Matrices are column-major with a leading dimension, as in
//! cuBLAS; vectors have a stride, counted from the end when it is negative.

use half::{bf16, f16};

/// A real element type: f32 or f64.
pub trait Real: Copy + Default + PartialOrd + std::ops::Add<Output = Self> + std::ops::Mul<Output = Self> {
    const BYTES: usize;
    fn from_le(b: &[u8]) -> Self;
    fn put_le(self, out: &mut [u8]);
    fn to_f64(self) -> f64;
    fn from_f64(v: f64) -> Self;
    /// C = alpha op(A) op(B) + beta C, with element strides (row, column) for each matrix.
    #[allow(clippy::too_many_arguments)]
    fn gemm(
        m: usize,
        k: usize,
        n: usize,
        alpha: Self,
        a: &[Self],
        sa: (isize, isize),
        b: &[Self],
        sb: (isize, isize),
        beta: Self,
        c: &mut [Self],
        sc: (isize, isize),
    );
}

macro_rules! real {
    ($t:ty, $n:expr, $gemm:path) => {
        impl Real for $t {
            const BYTES: usize = $n;
            fn from_le(b: &[u8]) -> Self {
                let mut a = [0u8; $n];
                a.copy_from_slice(&b[..$n]);
                <$t>::from_le_bytes(a)
            }
            fn put_le(self, out: &mut [u8]) {
                out[..$n].copy_from_slice(&self.to_le_bytes());
            }
            fn to_f64(self) -> f64 {
                self as f64
            }
            fn from_f64(v: f64) -> Self {
                v as $t
            }
            fn gemm(
                m: usize,
                k: usize,
                n: usize,
                alpha: Self,
                a: &[Self],
                sa: (isize, isize),
                b: &[Self],
                sb: (isize, isize),
                beta: Self,
                c: &mut [Self],
                sc: (isize, isize),
            ) {
                if m == 0 || n == 0 {
                    return;
                }
                // SAFETY: the callers' extents cover every element the strides reach: A has
                // (m-1)*sa.0 + (k-1)*sa.1 + 1 elements at least, B and C likewise
                // (`matrix_len` sizes them), and C does not overlap A or B (separate vectors).
                unsafe {
                    $gemm(
                        m,
                        k,
                        n,
                        alpha,
                        a.as_ptr(),
                        sa.0,
                        sa.1,
                        b.as_ptr(),
                        sb.0,
                        sb.1,
                        beta,
                        c.as_mut_ptr(),
                        sc.0,
                        sc.1,
                    )
                }
            }
        }
    };
}
real!(f32, 4, matrixmultiply::sgemm);
real!(f64, 8, matrixmultiply::dgemm);

/// Elements of a `rows` x `cols` matrix with leading dimension `ld` (0 when it is empty).
pub fn matrix_len(rows: usize, cols: usize, ld: usize) -> usize {
    if rows == 0 || cols == 0 { 0 } else { ld * (cols - 1) + rows }
}

/// Elements a vector of `n` with stride `inc` spans.
pub fn vector_len(n: usize, inc: i64) -> usize {
    if n == 0 { 0 } else { (n - 1) * inc.unsigned_abs() as usize + 1 }
}

/// Index of element `i` of a vector of `n` with stride `inc` (BLAS starts a negative stride at
/// the end).
fn at(i: usize, n: usize, inc: i64) -> usize {
    let step = inc.unsigned_abs() as usize;
    if inc >= 0 { i * step } else { (n - 1 - i) * step }
}

pub fn decode<T: Real>(bytes: &[u8]) -> Vec<T> {
    bytes.chunks_exact(T::BYTES).map(T::from_le).collect()
}

pub fn encode<T: Real>(values: &[T]) -> Vec<u8> {
    let mut out = vec![0u8; values.len() * T::BYTES];
    for (v, o) in values.iter().zip(out.chunks_exact_mut(T::BYTES)) {
        v.put_le(o);
    }
    out
}

/// The (row, column) element strides of op(X) for X column-major with leading dimension
/// `ld`: transposed when `trans` is not CUBLAS_OP_N.
pub fn strides(trans: bool, ld: usize) -> (isize, isize) {
    if trans { (ld as isize, 1) } else { (1, ld as isize) }
}

pub fn axpy<T: Real>(n: usize, alpha: T, x: &[T], incx: i64, y: &mut [T], incy: i64) {
    for i in 0..n {
        let (xi, yi) = (at(i, n, incx), at(i, n, incy));
        y[yi] = alpha * x[xi] + y[yi];
    }
}

pub fn scal<T: Real>(n: usize, alpha: T, x: &mut [T], incx: i64) {
    if incx <= 0 {
        return;
    }
    for i in 0..n {
        let xi = at(i, n, incx);
        x[xi] = alpha * x[xi];
    }
}

pub fn copy<T: Real>(n: usize, x: &[T], incx: i64, y: &mut [T], incy: i64) {
    for i in 0..n {
        y[at(i, n, incy)] = x[at(i, n, incx)];
    }
}

pub fn swap<T: Real>(n: usize, x: &mut [T], incx: i64, y: &mut [T], incy: i64) {
    for i in 0..n {
        let (xi, yi) = (at(i, n, incx), at(i, n, incy));
        std::mem::swap(&mut x[xi], &mut y[yi]);
    }
}

pub fn dot<T: Real>(n: usize, x: &[T], incx: i64, y: &[T], incy: i64) -> T {
    (0..n).fold(T::default(), |acc, i| acc + x[at(i, n, incx)] * y[at(i, n, incy)])
}

/// nrm2, asum, amax and amin read nothing for a stride that is not positive (cuBLAS answers 0).
pub fn nrm2<T: Real>(n: usize, x: &[T], incx: i64) -> T {
    if incx <= 0 {
        return T::default();
    }
    T::from_f64((0..n).map(|i| x[at(i, n, incx)].to_f64().powi(2)).sum::<f64>().sqrt())
}

pub fn asum<T: Real>(n: usize, x: &[T], incx: i64) -> T {
    if incx <= 0 {
        return T::default();
    }
    T::from_f64((0..n).map(|i| x[at(i, n, incx)].to_f64().abs()).sum())
}

/// The 1-based index of the first element of largest (`max`) or smallest magnitude.
pub fn iamax<T: Real>(n: usize, x: &[T], incx: i64, max: bool) -> i32 {
    if incx <= 0 || n == 0 {
        return 0;
    }
    let mut best = 0;
    let mut best_abs = x[at(0, n, incx)].to_f64().abs();
    for i in 1..n {
        let v = x[at(i, n, incx)].to_f64().abs();
        if (max && v > best_abs) || (!max && v < best_abs) {
            best = i;
            best_abs = v;
        }
    }
    i32::try_from(best + 1).unwrap_or(i32::MAX)
}

/// y = alpha op(A) x + beta y, A m x n.
#[allow(clippy::too_many_arguments)]
pub fn gemv<T: Real>(
    trans: bool,
    m: usize,
    n: usize,
    alpha: T,
    a: &[T],
    lda: usize,
    x: &[T],
    incx: i64,
    beta: T,
    y: &mut [T],
    incy: i64,
) {
    let (rows, cols) = if trans { (n, m) } else { (m, n) };
    for r in 0..rows {
        let mut acc = T::default();
        for c in 0..cols {
            let e = if trans { a[r * lda + c] } else { a[c * lda + r] };
            acc = acc + e * x[at(c, cols, incx)];
        }
        let yi = at(r, rows, incy);
        // beta = 0 ignores what y held (NaN included), as BLAS does.
        y[yi] = if beta.to_f64() == 0.0 { alpha * acc } else { alpha * acc + beta * y[yi] };
    }
}

/// A += alpha x y^T, A m x n.
#[allow(clippy::too_many_arguments)]
pub fn ger<T: Real>(m: usize, n: usize, alpha: T, x: &[T], incx: i64, y: &[T], incy: i64, a: &mut [T], lda: usize) {
    for c in 0..n {
        let yc = alpha * y[at(c, n, incy)];
        for r in 0..m {
            a[c * lda + r] = a[c * lda + r] + x[at(r, m, incx)] * yc;
        }
    }
}

/// A `cudaDataType` GemmEx can run on the CPU, read as f32 or f64.
pub fn decode_typed(data_type: i32, bytes: &[u8]) -> Option<Vec<f64>> {
    Some(match data_type {
        0 => decode::<f32>(bytes).into_iter().map(f64::from).collect(),
        1 => decode::<f64>(bytes),
        2 => bytes.chunks_exact(2).map(|b| f16::from_le_bytes([b[0], b[1]]).to_f64()).collect(),
        14 => bytes.chunks_exact(2).map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f64()).collect(),
        _ => return None,
    })
}

/// Values written back as `data_type` (one of [`decode_typed`]'s).
pub fn encode_typed(data_type: i32, values: &[f64]) -> Vec<u8> {
    match data_type {
        0 => encode(&values.iter().map(|&v| v as f32).collect::<Vec<_>>()),
        1 => encode(values),
        2 => values.iter().flat_map(|&v| f16::from_f64(v).to_le_bytes()).collect(),
        _ => values.iter().flat_map(|&v| bf16::from_f64(v).to_le_bytes()).collect(),
    }
}

/// A GemmEx scalar of `bytes` bytes (half, float or double), as f64.
pub fn scalar_f64(bytes: &[u8]) -> Option<f64> {
    Some(match bytes.len() {
        2 => f16::from_le_bytes([bytes[0], bytes[1]]).to_f64(),
        4 => f64::from(f32::from_le(bytes)),
        8 => f64::from_le(bytes),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gemm_with_transposes_matches_the_definition() {
        // A 2x3 (lda 2), B 3x2 given transposed (B^T 2x3, ldb 2), C 2x2.
        let a = [1.0f32, 4.0, 2.0, 5.0, 3.0, 6.0];
        let bt = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0];
        let mut c = [1.0f32; 4];
        f32::gemm(2, 3, 2, 1.0, &a, strides(false, 2), &bt, strides(true, 2), 2.0, &mut c, (1, 2));
        // A = [[1,2,3],[4,5,6]], op(B) = B = [[1,2],[3,4],[5,6]]: AB = [[22,28],[49,64]], plus 2.
        assert_eq!(c, [24.0, 51.0, 30.0, 66.0]);
    }

    #[test]
    fn level1_with_negative_strides() {
        let x = [1.0f64, 2.0, 3.0];
        let mut y = [0.0f64; 3];
        copy(3, &x, -1, &mut y, 1);
        assert_eq!(y, [3.0, 2.0, 1.0]);
        assert_eq!(dot(3, &x, 1, &y, 1), 10.0);
        assert_eq!(iamax(3, &[1.0f32, -5.0, 5.0], 1, true), 2);
        assert_eq!(iamax(3, &[1.0f32, -5.0, 0.5], 1, false), 3);
        assert_eq!(nrm2(2, &[3.0f32, 4.0], 1), 5.0);
        assert_eq!(asum(2, &[3.0f32, -4.0], 1), 7.0);
        assert_eq!(asum(2, &[3.0f32, -4.0], 0), 0.0);
    }

    #[test]
    fn half_precision_round_trips() {
        let bytes = encode_typed(2, &[1.5, -2.0]);
        assert_eq!(decode_typed(2, &bytes), Some(vec![1.5, -2.0]));
        assert_eq!(scalar_f64(&f16::from_f32(0.5).to_le_bytes()), Some(0.5));
    }
}
