//! Dense LAPACK on the server's CPU, for cuSOLVER's calls on a backend without NVIDIA's
//! libcusolver (emu). What a program can observe follows LAPACK exactly: column-major
//! matrices with a leading dimension, the factors left in A as LAPACK leaves them (L and U of
//! an LU with unit L implied, the Cholesky factor in the triangle asked for, R and the
//! Householder vectors of a QR with `tau` in `dlarfg`'s convention), pivots 1-based in the
//! order the row swaps were made, `info` as LAPACK's (0, or the first zero pivot / the order of
//! the first non-positive minor, 1-based), eigenvalues ascending and singular values
//! descending. The factorisations are the unblocked algorithms (dgetf2, dpotf2, dgeqr2,
//! dorm2r), which pick the same pivots as LAPACK's blocked ones; the eigenvalue problem and
//! the SVD of the small triangular factor are nalgebra's. Everything is computed in `f64`.

use nalgebra::DMatrix;

/// A column-major matrix view: element (i, j) at `i + j * ld`.
fn at(ld: usize, i: usize, j: usize) -> usize {
    i + j * ld
}

/// Why a CPU solver call could not run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SolverError {
    #[error("ipiv[{index}] is {value}, outside 1..={n}")]
    BadPivot { index: usize, value: i32, n: usize },
    #[error("the iteration did not converge (or the matrix holds a NaN or an infinity)")]
    NoConvergence,
}

/// Sweeps the eigenvalue and SVD iterations may take (LAPACK's bound, 30 per row), so that a
/// matrix of NaNs from a program ends in `NoConvergence` rather than a server that spins.
fn max_sweeps(n: usize) -> usize {
    30 * n.max(1)
}

/// LU with partial pivoting (`getrf`) of the m x n matrix `a`: the pivots go to `ipiv` (1-based;
/// `None` factors without pivoting, as cuSOLVER does for a null `devIpiv`). Returns `info`.
pub fn getrf(m: usize, n: usize, a: &mut [f64], lda: usize, mut ipiv: Option<&mut [i32]>) -> i32 {
    let mut info = 0;
    for j in 0..m.min(n) {
        let mut p = j;
        if ipiv.is_some() {
            // The first element of largest magnitude (BLAS's idamax).
            let mut best = a[at(lda, j, j)].abs();
            for i in j + 1..m {
                let v = a[at(lda, i, j)].abs();
                if v > best {
                    best = v;
                    p = i;
                }
            }
        }
        if let Some(ipiv) = ipiv.as_deref_mut() {
            ipiv[j] = (p + 1) as i32;
        }
        let pivot = a[at(lda, p, j)];
        if pivot != 0.0 {
            if p != j {
                for c in 0..n {
                    a.swap(at(lda, p, c), at(lda, j, c));
                }
            }
            for i in j + 1..m {
                a[at(lda, i, j)] /= pivot;
            }
        } else if info == 0 {
            info = (j + 1) as i32;
        }
        for c in j + 1..n {
            let f = a[at(lda, j, c)];
            if f != 0.0 {
                for i in j + 1..m {
                    a[at(lda, i, c)] -= a[at(lda, i, j)] * f;
                }
            }
        }
    }
    info
}

/// The rows LAPACK's 1-based pivots name (0-based), each checked to be a row of the n x n
/// matrix they came with (`n` is `ipiv.len()`).
pub fn pivot_rows(ipiv: &[i32]) -> Result<Vec<usize>, SolverError> {
    let n = ipiv.len();
    ipiv.iter()
        .enumerate()
        .map(|(index, &value)| match usize::try_from(value) {
            Ok(r) if (1..=n).contains(&r) => Ok(r - 1),
            _ => Err(SolverError::BadPivot { index, value, n }),
        })
        .collect()
}

/// Solve op(A) X = B with the LU of `getrf` (`trans`: A or its transpose), B n x nrhs; `rows`
/// are the pivots as [`pivot_rows`] checked them.
#[allow(clippy::too_many_arguments)]
pub fn getrs(trans: bool, n: usize, nrhs: usize, a: &[f64], lda: usize, rows: &[usize], b: &mut [f64], ldb: usize) {
    let swap_rows = |b: &mut [f64], order: &mut dyn Iterator<Item = usize>| {
        for i in order {
            if rows[i] != i {
                for c in 0..nrhs {
                    b.swap(at(ldb, i, c), at(ldb, rows[i], c));
                }
            }
        }
    };
    if !trans {
        swap_rows(b, &mut (0..n));
        for c in 0..nrhs {
            // L y = b (unit diagonal), then U x = y.
            for i in 0..n {
                let s: f64 = (0..i).map(|k| a[at(lda, i, k)] * b[at(ldb, k, c)]).sum();
                b[at(ldb, i, c)] -= s;
            }
            for i in (0..n).rev() {
                let s: f64 = (i + 1..n).map(|k| a[at(lda, i, k)] * b[at(ldb, k, c)]).sum();
                b[at(ldb, i, c)] = (b[at(ldb, i, c)] - s) / a[at(lda, i, i)];
            }
        }
    } else {
        for c in 0..nrhs {
            // U^T y = b, then L^T x = y (unit diagonal).
            for i in 0..n {
                let s: f64 = (0..i).map(|k| a[at(lda, k, i)] * b[at(ldb, k, c)]).sum();
                b[at(ldb, i, c)] = (b[at(ldb, i, c)] - s) / a[at(lda, i, i)];
            }
            for i in (0..n).rev() {
                let s: f64 = (i + 1..n).map(|k| a[at(lda, k, i)] * b[at(ldb, k, c)]).sum();
                b[at(ldb, i, c)] -= s;
            }
        }
        swap_rows(b, &mut (0..n).rev());
    }
}

/// Cholesky (`potrf`) of the n x n symmetric positive definite `a`, from and into its lower
/// (`lower`) or upper triangle (A = L L^T or U^T U). Returns `info`: the order of the first
/// minor that is not positive definite (its diagonal element left as computed), or 0.
pub fn potrf(lower: bool, n: usize, a: &mut [f64], lda: usize) -> i32 {
    // (i, j) of the triangle in use, i >= j: the lower triangle's, or the upper one's mirror.
    let ix = |i: usize, j: usize| if lower { at(lda, i, j) } else { at(lda, j, i) };
    for j in 0..n {
        let ajj = a[ix(j, j)] - (0..j).map(|k| a[ix(j, k)] * a[ix(j, k)]).sum::<f64>();
        if ajj <= 0.0 || ajj.is_nan() {
            a[ix(j, j)] = ajj;
            return (j + 1) as i32;
        }
        let ajj = ajj.sqrt();
        a[ix(j, j)] = ajj;
        for i in j + 1..n {
            let s: f64 = (0..j).map(|k| a[ix(i, k)] * a[ix(j, k)]).sum();
            a[ix(i, j)] = (a[ix(i, j)] - s) / ajj;
        }
    }
    0
}

/// Solve A X = B with the Cholesky factor of `potrf`, B n x nrhs.
#[allow(clippy::too_many_arguments)]
pub fn potrs(lower: bool, n: usize, nrhs: usize, a: &[f64], lda: usize, b: &mut [f64], ldb: usize) {
    // L (i, k), i >= k: the factor in use as a lower triangular matrix.
    let l = |i: usize, k: usize| if lower { a[at(lda, i, k)] } else { a[at(lda, k, i)] };
    for c in 0..nrhs {
        for i in 0..n {
            let s: f64 = (0..i).map(|k| l(i, k) * b[at(ldb, k, c)]).sum();
            b[at(ldb, i, c)] = (b[at(ldb, i, c)] - s) / l(i, i);
        }
        for i in (0..n).rev() {
            let s: f64 = (i + 1..n).map(|k| l(k, i) * b[at(ldb, k, c)]).sum();
            b[at(ldb, i, c)] = (b[at(ldb, i, c)] - s) / l(i, i);
        }
    }
}

/// LAPACK's `dlarfg`: the reflector H = I - tau v v^T with v = (1, x') that maps (alpha, x) to
/// (beta, 0). Overwrites `x` with v's tail and returns (beta, tau).
fn householder(alpha: f64, x: &mut [f64]) -> (f64, f64) {
    let xnorm = x.iter().map(|v| v * v).sum::<f64>().sqrt();
    if xnorm == 0.0 {
        return (alpha, 0.0);
    }
    let beta = -alpha.hypot(xnorm).copysign(alpha);
    let tau = (beta - alpha) / beta;
    let scale = 1.0 / (alpha - beta);
    for v in x.iter_mut() {
        *v *= scale;
    }
    (beta, tau)
}

/// QR (`geqrf`) of the m x n `a`: R in the upper triangle, the Householder vectors below it,
/// their factors in `tau` (min(m, n) of them).
pub fn geqrf(m: usize, n: usize, a: &mut [f64], lda: usize, tau: &mut [f64]) {
    for i in 0..m.min(n) {
        let mut tail: Vec<f64> = (i + 1..m).map(|r| a[at(lda, r, i)]).collect();
        let (beta, t) = householder(a[at(lda, i, i)], &mut tail);
        for (r, v) in (i + 1..m).zip(&tail) {
            a[at(lda, r, i)] = *v;
        }
        tau[i] = t;
        a[at(lda, i, i)] = beta;
        // H(i) applied to the columns right of it.
        if t != 0.0 {
            for c in i + 1..n {
                let w = a[at(lda, i, c)] + (i + 1..m).map(|r| a[at(lda, r, i)] * a[at(lda, r, c)]).sum::<f64>();
                a[at(lda, i, c)] -= t * w;
                for r in i + 1..m {
                    a[at(lda, r, c)] -= t * a[at(lda, r, i)] * w;
                }
            }
        }
    }
}

/// Which side of C the orthogonal factor multiplies, and whether transposed (`ormqr`).
#[derive(Debug, Clone, Copy)]
pub struct Apply {
    pub left: bool,
    pub trans: bool,
}

/// C = op(Q) C or C op(Q) (`ormqr`), Q = H(1) ... H(k) from `geqrf`'s vectors in the columns of
/// `a` and `tau`; C is m x n.
#[allow(clippy::too_many_arguments)]
pub fn ormqr(how: Apply, m: usize, n: usize, k: usize, a: &[f64], lda: usize, tau: &[f64], c: &mut [f64], ldc: usize) {
    // Q C = H(1) (H(2) ... (H(k) C)): the last reflector first; likewise C Q^T.
    let last_first = how.left != how.trans;
    let order: Vec<usize> = if last_first { (0..k).rev().collect() } else { (0..k).collect() };
    let nq = if how.left { m } else { n };
    for i in order {
        let t = tau[i];
        if t == 0.0 {
            continue;
        }
        // v = (1, a[i+1.., i]) over rows (left) or columns (right) i..nq of C.
        let v = |r: usize| if r == i { 1.0 } else { a[at(lda, r, i)] };
        if how.left {
            for col in 0..n {
                let w: f64 = (i..nq).map(|r| v(r) * c[at(ldc, r, col)]).sum();
                for r in i..nq {
                    c[at(ldc, r, col)] -= t * v(r) * w;
                }
            }
        } else {
            for row in 0..m {
                let w: f64 = (i..nq).map(|j| c[at(ldc, row, j)] * v(j)).sum();
                for j in i..nq {
                    c[at(ldc, row, j)] -= t * w * v(j);
                }
            }
        }
    }
}

/// Eigenvalues (ascending, into `w`) and, with `vectors`, orthonormal eigenvectors (into the
/// columns of `a`) of the n x n symmetric matrix held in the lower or upper triangle of `a`
/// (`syevd`).
pub fn syevd(
    vectors: bool,
    lower: bool,
    n: usize,
    a: &mut [f64],
    lda: usize,
    w: &mut [f64],
) -> Result<(), SolverError> {
    if n == 0 {
        return Ok(());
    }
    let sym = DMatrix::from_fn(n, n, |i, j| {
        let (r, c) = if (i >= j) == lower { (i, j) } else { (j, i) };
        a[at(lda, r, c)]
    });
    // nalgebra's iterations assume finite numbers (its SVD panics on a NaN).
    if sym.iter().any(|v| !v.is_finite()) {
        return Err(SolverError::NoConvergence);
    }
    let eig = nalgebra::SymmetricEigen::try_new(sym, f64::EPSILON, max_sweeps(n)).ok_or(SolverError::NoConvergence)?;
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&x, &y| eig.eigenvalues[x].total_cmp(&eig.eigenvalues[y]));
    for (dst, &src) in order.iter().enumerate() {
        w[dst] = eig.eigenvalues[src];
        if vectors {
            for r in 0..n {
                a[at(lda, r, dst)] = eig.eigenvectors[(r, src)];
            }
        }
    }
    Ok(())
}

/// What `gesvd` computes of U or V^T: all of it (`'A'`), its leading min(m, n) vectors (`'S'`),
/// those into A (`'O'`), or nothing (`'N'`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Job {
    All,
    Some,
    Overwrite,
    None,
}

impl Job {
    pub fn from_char(c: i8) -> Option<Job> {
        match c as u8 {
            b'A' => Some(Job::All),
            b'S' => Some(Job::Some),
            b'O' => Some(Job::Overwrite),
            b'N' => Some(Job::None),
            _ => None,
        }
    }
}

/// The SVD's outputs, column-major: U (m x ucols), V^T (n x n).
pub struct Svd {
    pub s: Vec<f64>,
    pub u: Vec<f64>,
    pub ucols: usize,
    pub vt: Vec<f64>,
}

/// The SVD of the m x n `a`, m >= n (`gesvd`): singular values descending, U with `ucols`
/// columns (m for a full U, n for the leading ones, 0 for none), V^T n x n. Computed as LAPACK
/// does for a tall matrix: A = Q R, then R = Ur S V^T, and U = Q [Ur 0; 0 I].
pub fn gesvd(m: usize, n: usize, a: &[f64], lda: usize, ucols: usize) -> Result<Svd, SolverError> {
    if n == 0 {
        // Nothing to decompose; a full U is the identity.
        let u = (0..m * ucols).map(|p| if p % (m + 1) == 0 { 1.0 } else { 0.0 }).collect();
        return Ok(Svd { s: Vec::new(), u, ucols, vt: Vec::new() });
    }
    let mut qr: Vec<f64> = (0..n).flat_map(|j| (0..m).map(move |i| (i, j))).map(|(i, j)| a[at(lda, i, j)]).collect();
    let mut tau = vec![0.0; n];
    geqrf(m, n, &mut qr, m, &mut tau);
    let r = DMatrix::from_fn(n, n, |i, j| if i <= j { qr[at(m, i, j)] } else { 0.0 });
    if r.iter().any(|v| !v.is_finite()) {
        return Err(SolverError::NoConvergence);
    }
    let svd =
        nalgebra::SVD::try_new(r, ucols > 0, true, f64::EPSILON, max_sweeps(n)).ok_or(SolverError::NoConvergence)?;
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&x, &y| svd.singular_values[y].total_cmp(&svd.singular_values[x]));
    let s: Vec<f64> = order.iter().map(|&i| svd.singular_values[i]).collect();
    let v_t = svd.v_t.as_ref().ok_or(SolverError::NoConvergence)?;
    let mut vt = vec![0.0; n * n];
    for (row, &src) in order.iter().enumerate() {
        for c in 0..n {
            vt[at(n, row, c)] = v_t[(src, c)];
        }
    }
    let mut u = vec![0.0; m * ucols];
    if ucols > 0 {
        let ur = svd.u.as_ref().ok_or(SolverError::NoConvergence)?;
        for (col, &src) in order.iter().enumerate() {
            for r in 0..n {
                u[at(m, r, col)] = ur[(r, src)];
            }
        }
        for extra in n..ucols {
            u[at(m, extra, extra)] = 1.0;
        }
        ormqr(Apply { left: true, trans: false }, m, ucols, n, &qr, m, &tau, &mut u, m);
    }
    Ok(Svd { s, u, ucols, vt })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// op(A) B for column-major A (m x k) and B (k x n).
    fn matmul(m: usize, k: usize, n: usize, a: &[f64], lda: usize, b: &[f64], ldb: usize) -> Vec<f64> {
        let mut c = vec![0.0; m * n];
        for j in 0..n {
            for i in 0..m {
                c[at(m, i, j)] = (0..k).map(|p| a[at(lda, i, p)] * b[at(ldb, p, j)]).sum();
            }
        }
        c
    }

    fn close(a: &[f64], b: &[f64]) -> bool {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-9)
    }

    #[test]
    fn lu_pivots_and_factors_are_lapacks() {
        // A = [[1, 2], [3, 4]] (column-major): LAPACK's dgetrf swaps rows 1 and 2, giving
        // ipiv = [2, 2], U = [[3, 4], [0, 2/3]], L21 = 1/3.
        let mut a = vec![1.0, 3.0, 2.0, 4.0];
        let mut ipiv = [0; 2];
        assert_eq!(getrf(2, 2, &mut a, 2, Some(&mut ipiv)), 0);
        assert_eq!(ipiv, [2, 2]);
        assert!(close(&a, &[3.0, 1.0 / 3.0, 4.0, 2.0 - 4.0 / 3.0]), "{a:?}");
        let rows = pivot_rows(&ipiv).unwrap();
        let mut b = vec![5.0, 11.0];
        getrs(false, 2, 1, &a, 2, &rows, &mut b, 2);
        assert!(close(&b, &[1.0, 2.0]), "{b:?}");
        let mut bt = vec![7.0, 10.0]; // A^T x = (7, 10) for x = (1, 2)
        getrs(true, 2, 1, &a, 2, &rows, &mut bt, 2);
        assert!(close(&bt, &[1.0, 2.0]), "{bt:?}");
    }

    #[test]
    fn a_singular_matrix_reports_its_first_zero_pivot() {
        let mut a = vec![1.0, 2.0, 2.0, 4.0];
        let mut ipiv = [0; 2];
        assert_eq!(getrf(2, 2, &mut a, 2, Some(&mut ipiv)), 2);
        assert_eq!(pivot_rows(&[3, 1]), Err(SolverError::BadPivot { index: 0, value: 3, n: 2 }));
        assert_eq!(pivot_rows(&[1, 0]), Err(SolverError::BadPivot { index: 1, value: 0, n: 2 }));
    }

    #[test]
    fn cholesky_in_either_triangle_solves() {
        // A = [[4, 2], [2, 3]]: L = [[2, 0], [1, sqrt 2]].
        for lower in [true, false] {
            let mut a = vec![4.0, 2.0, 2.0, 3.0];
            assert_eq!(potrf(lower, 2, &mut a, 2), 0);
            let l21 = if lower { a[1] } else { a[2] };
            assert!((a[0] - 2.0).abs() < 1e-12 && (l21 - 1.0).abs() < 1e-12 && (a[3] - 2f64.sqrt()).abs() < 1e-12);
            let mut b = vec![8.0, 8.0]; // x = (1, 2)
            potrs(lower, 2, 1, &a, 2, &mut b, 2);
            assert!(close(&b, &[1.0, 2.0]), "{b:?}");
        }
        let mut not_pd = vec![1.0, 2.0, 2.0, 1.0];
        assert_eq!(potrf(true, 2, &mut not_pd, 2), 2);
        assert_eq!(not_pd[3], -3.0, "the failing minor's value is left on the diagonal");
    }

    #[test]
    fn qr_follows_dlarfg_and_q_applies_both_ways() {
        // A 3 x 2; R's diagonal is -sign(a11) * norm, as dlarfg makes it.
        let a0 = vec![3.0, 4.0, 0.0, 1.0, 2.0, 2.0];
        let mut a = a0.clone();
        let mut tau = [0.0; 2];
        geqrf(3, 2, &mut a, 3, &mut tau);
        assert!((a[0] + 5.0).abs() < 1e-12, "R11 = -5: {a:?}");
        assert!((tau[0] - 1.6).abs() < 1e-12, "tau1 = (beta - alpha) / beta = 1.6: {tau:?}");
        // Q^T A = [R; 0] and Q (Q^T A) = A.
        let mut c = a0.clone();
        ormqr(Apply { left: true, trans: true }, 3, 2, 2, &a, 3, &tau, &mut c, 3);
        assert!(c[1].abs() < 1e-12 && c[2].abs() < 1e-12 && c[5].abs() < 1e-12, "{c:?}");
        assert!((c[0] - a[0]).abs() < 1e-12 && (c[3] - a[3]).abs() < 1e-12 && (c[4] - a[4]).abs() < 1e-12);
        ormqr(Apply { left: true, trans: false }, 3, 2, 2, &a, 3, &tau, &mut c, 3);
        assert!(close(&c, &a0), "{c:?}");
        // From the right: (C Q) Q^T = C.
        let c0 = vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]; // 2 x 3
        let mut c = c0.clone();
        ormqr(Apply { left: false, trans: false }, 2, 3, 2, &a, 3, &tau, &mut c, 2);
        assert!(!close(&c, &c0));
        ormqr(Apply { left: false, trans: true }, 2, 3, 2, &a, 3, &tau, &mut c, 2);
        assert!(close(&c, &c0), "{c:?}");
    }

    #[test]
    fn eigenvalues_ascend_with_their_vectors() {
        // [[2, 1], [1, 2]]: 1 and 3; the upper triangle's garbage below it is ignored.
        let mut a = vec![2.0, 99.0, 1.0, 2.0];
        let mut w = [0.0; 2];
        syevd(true, false, 2, &mut a, 2, &mut w).unwrap();
        assert!(close(&w, &[1.0, 3.0]), "{w:?}");
        let s = std::f64::consts::FRAC_1_SQRT_2;
        assert!((a[0].abs() - s).abs() < 1e-12 && (a[0] + a[1]).abs() < 1e-12, "(1, -1)/sqrt 2: {a:?}");
    }

    #[test]
    fn a_matrix_of_nans_does_not_converge() {
        // Refused before nalgebra's iterations, which assume finite numbers.
        let nan = SolverError::NoConvergence;
        assert_eq!(syevd(true, true, 2, &mut [f64::NAN; 4], 2, &mut [0.0; 2]), Err(nan));
        assert_eq!(gesvd(3, 2, &[1.0, f64::INFINITY, 0.0, 0.0, 1.0, 0.0], 3, 3).err(), Some(nan));
    }

    #[test]
    fn empty_matrices_are_answered() {
        assert_eq!(syevd(true, true, 0, &mut [], 1, &mut []), Ok(()));
        let svd = gesvd(2, 0, &[], 2, 2).unwrap();
        assert!(svd.s.is_empty() && svd.u == [1.0, 0.0, 0.0, 1.0]);
        assert!(gesvd(0, 0, &[], 1, 0).unwrap().u.is_empty());
    }

    #[test]
    fn svd_reconstructs_with_a_full_u() {
        let (m, n) = (4, 2);
        let a = vec![1.0, 2.0, 3.0, 4.0, 2.0, 0.0, 1.0, -1.0];
        let svd = gesvd(m, n, &a, m, m).unwrap();
        assert!(svd.s[0] >= svd.s[1] && svd.s[1] > 0.0);
        // U^T U = I (4 x 4).
        let mut ut = vec![0.0; m * m];
        for i in 0..m {
            for j in 0..m {
                ut[at(m, j, i)] = svd.u[at(m, i, j)];
            }
        }
        let eye: Vec<f64> = (0..m * m).map(|p| if p % (m + 1) == 0 { 1.0 } else { 0.0 }).collect();
        assert!(close(&matmul(m, m, m, &ut, m, &svd.u, m), &eye));
        // U[:, :n] S V^T = A.
        let mut us = svd.u[..m * n].to_vec();
        for j in 0..n {
            for i in 0..m {
                us[at(m, i, j)] *= svd.s[j];
            }
        }
        assert!(close(&matmul(m, n, n, &us, m, &svd.vt, n), &a));
    }
}
