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

/// How a triangular solve reads its matrix (cuBLAS's side, fill mode, operation and diagonal
/// type, as booleans).
#[derive(Debug, Clone, Copy)]
pub struct Triangle {
    pub left: bool,
    pub lower: bool,
    pub transpose: bool,
    pub unit: bool,
}

/// B = X solving op(A) X = alpha B (left) or X op(A) = alpha B (right); A k x k with leading
/// dimension `lda` (k = m on the left, n on the right), B m x n with `ldb`, column-major,
/// computed in f64. Only A's triangle is read (and not its diagonal when `unit`).
#[allow(clippy::too_many_arguments)]
pub fn trsm<T: Real>(t: Triangle, m: usize, n: usize, alpha: T, a: &[T], lda: usize, b: &mut [T], ldb: usize) {
    let k = if t.left { m } else { n };
    // E: the matrix each right-hand side is solved with, op(A) on the left and op(A)^T on the
    // right (X op(A) = B is op(A)^T X^T = B^T), so E is lower when A's triangle, flipped by
    // each transposition, is.
    let flip = t.transpose == t.left;
    let at = |r: usize, c: usize| a[r + c * lda].to_f64();
    let e = |r: usize, c: usize| if flip { at(c, r) } else { at(r, c) };
    let e_lower = t.lower != flip;
    let alpha = alpha.to_f64();
    let (count, len) = if t.left { (n, m) } else { (m, n) };
    let index = |rhs: usize, i: usize| if t.left { i + rhs * ldb } else { rhs + i * ldb };
    let mut x = vec![0.0f64; k];
    for rhs in 0..count {
        for (i, xi) in x.iter_mut().enumerate().take(len) {
            *xi = alpha * b[index(rhs, i)].to_f64();
        }
        let order: Box<dyn Iterator<Item = usize>> = if e_lower { Box::new(0..k) } else { Box::new((0..k).rev()) };
        for i in order {
            let (lo, hi) = if e_lower { (0, i) } else { (i + 1, k) };
            let sum = (lo..hi).fold(x[i], |s, j| s - e(i, j) * x[j]);
            x[i] = if t.unit { sum } else { sum / e(i, i) };
        }
        for (i, xi) in x.iter().enumerate().take(len) {
            b[index(rhs, i)] = T::from_f64(*xi);
        }
    }
}

/// LU factorisation in place of an n x n column-major matrix (leading dimension `lda`), with
/// partial pivoting when `pivots` is given (LAPACK's 1-based row interchanges) and none
/// otherwise, as cuBLAS's getrfBatched: 0, or k + 1 where U's k-th diagonal element is zero
/// (the factorisation is still completed).
pub fn getrf<T: Real>(n: usize, a: &mut [T], lda: usize, mut pivots: Option<&mut [i32]>) -> i32 {
    let mut info = 0;
    let at = |r: usize, c: usize| r + c * lda;
    for k in 0..n {
        if let Some(p) = pivots.as_deref_mut() {
            let best = (k..n)
                .max_by(|&i, &j| {
                    a[at(i, k)]
                        .to_f64()
                        .abs()
                        .partial_cmp(&a[at(j, k)].to_f64().abs())
                        .unwrap_or(std::cmp::Ordering::Equal)
                })
                .unwrap_or(k);
            p[k] = best as i32 + 1;
            if best != k {
                for c in 0..n {
                    a.swap(at(k, c), at(best, c));
                }
            }
        }
        let pivot = a[at(k, k)].to_f64();
        if pivot == 0.0 {
            if info == 0 {
                info = k as i32 + 1;
            }
            continue;
        }
        for r in k + 1..n {
            let l = a[at(r, k)].to_f64() / pivot;
            a[at(r, k)] = T::from_f64(l);
            for c in k + 1..n {
                a[at(r, c)] = T::from_f64(a[at(r, c)].to_f64() - l * a[at(k, c)].to_f64());
            }
        }
    }
    info
}

/// The inverse into `c` (leading dimension `ldc`) of the matrix whose [`getrf`] factors `lu`
/// holds: 0, or k + 1 where U's k-th diagonal element is zero (`c` then left as it was).
pub fn getri<T: Real>(n: usize, lu: &[T], lda: usize, pivots: Option<&[i32]>, c: &mut [T], ldc: usize) -> i32 {
    let at = |r: usize, col: usize| r + col * lda;
    if let Some(k) = (0..n).find(|&k| lu[at(k, k)].to_f64() == 0.0) {
        return k as i32 + 1;
    }
    let mut x = vec![0.0f64; n];
    for j in 0..n {
        x.iter_mut().for_each(|v| *v = 0.0);
        x[j] = 1.0;
        // P e_j: the interchanges in order.
        if let Some(p) = pivots {
            for (k, &pk) in p.iter().enumerate().take(n) {
                x.swap(k, (pk - 1) as usize);
            }
        }
        for r in 0..n {
            let sum = (0..r).fold(x[r], |s, k| s - lu[at(r, k)].to_f64() * x[k]);
            x[r] = sum;
        }
        for r in (0..n).rev() {
            let sum = (r + 1..n).fold(x[r], |s, k| s - lu[at(r, k)].to_f64() * x[k]);
            x[r] = sum / lu[at(r, r)].to_f64();
        }
        for (r, v) in x.iter().enumerate() {
            c[r + j * ldc] = T::from_f64(*v);
        }
    }
    0
}

/// A complex number as (real, imaginary), computed in f64.
pub type Complex = (f64, f64);

/// Complex numbers from interleaved little-endian (real, imaginary) pairs of `half`-byte
/// floats (4: cuComplex, 8: cuDoubleComplex).
pub fn complex_decode(bytes: &[u8], half: usize) -> Vec<Complex> {
    let part = |b: &[u8]| if half == 4 { f64::from(f32::from_le(b)) } else { f64::from_le(b) };
    bytes.chunks_exact(2 * half).map(|c| (part(&c[..half]), part(&c[half..]))).collect()
}

/// The inverse of [`complex_decode`].
pub fn complex_encode(values: &[Complex], half: usize) -> Vec<u8> {
    let mut out = vec![0u8; values.len() * 2 * half];
    for (chunk, &(re, im)) in out.chunks_exact_mut(2 * half).zip(values) {
        if half == 4 {
            (re as f32).put_le(&mut chunk[..4]);
            (im as f32).put_le(&mut chunk[4..]);
        } else {
            re.put_le(&mut chunk[..8]);
            im.put_le(&mut chunk[8..]);
        }
    }
    out
}

/// Element (r, c) of op(X) for cuBLAS's operation `op` (0 none, 1 transpose, 2 conjugate
/// transpose) of a column-major X with leading dimension `ld`.
fn complex_op(x: &[Complex], ld: usize, op: i32, r: usize, c: usize) -> Complex {
    match op {
        0 => x[r + c * ld],
        1 => x[c + r * ld],
        _ => {
            let (re, im) = x[c + r * ld];
            (re, -im)
        }
    }
}

fn complex_mul(a: Complex, b: Complex) -> Complex {
    (a.0 * b.0 - a.1 * b.1, a.0 * b.1 + a.1 * b.0)
}

/// C = alpha op(A) op(B) + beta C for complex matrices: op(A) m x k, op(B) k x n, C m x n,
/// column-major. With beta zero C is not read (as cuBLAS: it may hold anything).
#[allow(clippy::too_many_arguments)]
pub fn complex_gemm(
    (op_a, op_b): (i32, i32),
    (m, n, k): (usize, usize, usize),
    alpha: Complex,
    (a, lda): (&[Complex], usize),
    (b, ldb): (&[Complex], usize),
    beta: Complex,
    (c, ldc): (&mut [Complex], usize),
) {
    for col in 0..n {
        for row in 0..m {
            let mut sum = (0.0, 0.0);
            for l in 0..k {
                let p = complex_mul(complex_op(a, lda, op_a, row, l), complex_op(b, ldb, op_b, l, col));
                sum = (sum.0 + p.0, sum.1 + p.1);
            }
            let scaled = complex_mul(alpha, sum);
            let old = if beta == (0.0, 0.0) { (0.0, 0.0) } else { complex_mul(beta, c[row + col * ldc]) };
            c[row + col * ldc] = (scaled.0 + old.0, scaled.1 + old.1);
        }
    }
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

    #[test]
    fn trsm_solves_each_side_and_operation() {
        // A = [[2, 0], [1, 4]] column-major (lower); its upper storage holds a 9 never read.
        let a = [2.0f64, 1.0, 9.0, 4.0];
        let lower = Triangle { left: true, lower: true, transpose: false, unit: false };
        // A x = 2 b with b = (1, 3): x = (1, 1.25).
        let mut b = [1.0f64, 3.0];
        trsm(lower, 2, 1, 2.0, &a, 2, &mut b, 2);
        assert_eq!(b, [1.0, 1.25]);
        // A^T x = b with b = (4, 8): x2 = 2, x1 = (4 - 2) / 2 = 1.
        let mut b = [4.0f64, 8.0];
        trsm(Triangle { transpose: true, ..lower }, 2, 1, 1.0, &a, 2, &mut b, 2);
        assert_eq!(b, [1.0, 2.0]);
        // x A = b (right side), a row vector, b = (4, 8): x2 = 2, x1 = (4 - 2) / 2 = 1.
        let mut b = [4.0f64, 8.0];
        trsm(Triangle { left: false, ..lower }, 1, 2, 1.0, &a, 2, &mut b, 1);
        assert_eq!(b, [1.0, 2.0]);
        // Unit diagonal: A x = b with A = [[1, 0], [1, 1]]: x = (1, 2) for b = (1, 3).
        let mut b = [1.0f64, 3.0];
        trsm(Triangle { unit: true, ..lower }, 2, 1, 1.0, &a, 2, &mut b, 2);
        assert_eq!(b, [1.0, 2.0]);
        // Upper: A = [[2, 9], [., 4]], A x = b with b = (13, 4): x2 = 1, x1 = 2.
        let mut b = [13.0f64, 4.0];
        trsm(Triangle { lower: false, ..lower }, 2, 1, 1.0, &a, 2, &mut b, 2);
        assert_eq!(b, [2.0, 1.0]);
    }

    #[test]
    fn getrf_and_getri_invert_with_and_without_pivoting() {
        // A = [[1, 2], [3, 4]] column-major; its inverse is [[-2, 1], [1.5, -0.5]].
        let a = [1.0f64, 3.0, 2.0, 4.0];
        let inverse = [-2.0, 1.5, 1.0, -0.5];
        let mut lu = a;
        let mut pivots = [0i32; 2];
        assert_eq!(getrf(2, &mut lu, 2, Some(&mut pivots)), 0);
        assert_eq!(pivots, [2, 2], "row 2 holds the larger first element");
        let mut c = [0.0f64; 4];
        assert_eq!(getri(2, &lu, 2, Some(&pivots), &mut c, 2), 0);
        assert!(c.iter().zip(inverse).all(|(x, y)| (x - y).abs() < 1e-12), "{c:?}");
        let mut lu = a;
        assert_eq!(getrf(2, &mut lu, 2, None), 0);
        assert_eq!(lu, [1.0, 3.0, 2.0, -2.0]);
        assert_eq!(getri(2, &lu, 2, None, &mut c, 2), 0);
        assert!(c.iter().zip(inverse).all(|(x, y)| (x - y).abs() < 1e-12), "{c:?}");
        // A singular matrix: U's second diagonal element is zero.
        let mut singular = [1.0f64, 2.0, 2.0, 4.0];
        assert_eq!(getrf(2, &mut singular, 2, None), 2);
        assert_eq!(getri(2, &singular, 2, None, &mut c, 2), 2);
    }

    #[test]
    fn complex_gemm_conjugates_and_scales() {
        // A = [[i]] (1 x 2: [i, 2]), B = [1, 1 + i]^T: A B = i + 2 + 2i = 2 + 3i.
        let a = [(0.0, 1.0), (2.0, 0.0)];
        let b = [(1.0, 0.0), (1.0, 1.0)];
        let mut c = [(f64::NAN, f64::NAN)];
        complex_gemm((0, 0), (1, 1, 2), (1.0, 0.0), (&a, 1), (&b, 2), (0.0, 0.0), (&mut c, 1));
        assert_eq!(c, [(2.0, 3.0)], "beta zero ignores C's NaN");
        // A^H (2 x 1) times [[1, i]] (1 x 2), scaled by alpha = i, plus 2 C.
        let row = [(1.0, 0.0), (0.0, 1.0)];
        let mut c = [(1.0, 0.0); 4];
        complex_gemm((2, 0), (2, 2, 1), (0.0, 1.0), (&a, 1), (&row, 1), (2.0, 0.0), (&mut c, 2));
        // conj(A)^T = [-i, 2]: products [[-i, 1], [2, 2i]], times i: [[1, i], [2i, -2]], plus 2.
        assert_eq!(c, [(3.0, 0.0), (2.0, 2.0), (2.0, 1.0), (0.0, 0.0)]);
        let bytes = complex_encode(&[(1.5, -2.0)], 4);
        assert_eq!(complex_decode(&bytes, 4), vec![(1.5, -2.0)]);
    }
}
