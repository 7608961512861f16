//! Sparse linear algebra on the CPU: what the `emu` backend runs cuSPARSE's calls with. A
//! sparse matrix is read from device memory into a list of entries (row, column, value), 0-based
//! and in its storage order, after its structure has been checked (offsets that start at the
//! base, never decrease and end at nnz; every index inside the matrix): an array a program wrote
//! wrong is an error naming what is wrong, never an out-of-bounds access. Values are computed in
//! f64 and stored in the descriptor's type.

use std::collections::BTreeMap;

/// Why a sparse matrix's arrays do not describe a matrix of its size.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum StructureError {
    #[error("offset {at} is {value}, where the offsets must start at the index base {base}")]
    FirstOffset { at: usize, value: i64, base: i64 },
    #[error("offset {at} is {value}, below the offset before it ({before})")]
    Decreasing { at: usize, value: i64, before: i64 },
    #[error("the last offset is {value}, where nnz plus the index base is {end}")]
    LastOffset { value: i64, end: i64 },
    #[error("index {at} is {value}, outside [{base}, {limit}) (the matrix's size with its index base)")]
    IndexOutOfRange { at: usize, value: i64, base: i64, limit: i64 },
}

/// One stored entry: row, column, value (0-based).
pub type Entry = (usize, usize, f64);

/// An index against its limit, made 0-based.
fn index(at: usize, value: i64, base: i64, limit: usize) -> Result<usize, StructureError> {
    let zero = value - base;
    if zero < 0 || zero as u64 >= limit as u64 {
        return Err(StructureError::IndexOutOfRange { at, value, base, limit: limit as i64 + base });
    }
    Ok(zero as usize)
}

/// The entries of a compressed matrix: `offsets` per major line (rows of CSR, columns of
/// CSC), `indices` the minor index of each entry. `major`/`minor` are the line counts.
pub fn compressed_entries(
    major: usize,
    minor: usize,
    offsets: &[i64],
    indices: &[i64],
    values: &[f64],
    base: i64,
    row_major: bool,
) -> Result<Vec<Entry>, StructureError> {
    let nnz = indices.len() as i64;
    if offsets.first().copied().unwrap_or(base) != base {
        return Err(StructureError::FirstOffset { at: 0, value: offsets[0], base });
    }
    for (at, w) in offsets.windows(2).enumerate() {
        if w[1] < w[0] {
            return Err(StructureError::Decreasing { at: at + 1, value: w[1], before: w[0] });
        }
    }
    let last = offsets.get(major).copied().unwrap_or(base);
    if last != nnz + base {
        return Err(StructureError::LastOffset { value: last, end: nnz + base });
    }
    let mut entries = Vec::with_capacity(indices.len());
    for line in 0..major {
        let (start, end) = ((offsets[line] - base) as usize, (offsets[line + 1] - base) as usize);
        for k in start..end {
            let other = index(k, indices[k], base, minor)?;
            entries.push(if row_major { (line, other, values[k]) } else { (other, line, values[k]) });
        }
    }
    Ok(entries)
}

/// The entries of a COO matrix.
pub fn coo_entries(
    rows: usize,
    cols: usize,
    row_ind: &[i64],
    col_ind: &[i64],
    values: &[f64],
    base: i64,
) -> Result<Vec<Entry>, StructureError> {
    (0..values.len())
        .map(|k| Ok((index(k, row_ind[k], base, rows)?, index(k, col_ind[k], base, cols)?, values[k])))
        .collect()
}

/// `y = alpha op(A) x + beta y` (op the transpose when `transpose`); `y` is scaled first,
/// set to zero where beta is zero (as BLAS does, so a NaN in y does not survive beta = 0).
pub fn spmv(entries: &[Entry], transpose: bool, alpha: f64, x: &[f64], beta: f64, y: &mut [f64]) {
    scale(y.iter_mut(), beta);
    for &(r, c, v) in entries {
        let (out, inp) = if transpose { (c, r) } else { (r, c) };
        y[out] += alpha * v * x[inp];
    }
}

/// How SpSV reads its matrix: the triangle (after the operation), whether its diagonal is
/// taken as ones.
#[derive(Debug, Clone, Copy)]
pub struct Triangular {
    pub lower: bool,
    pub unit: bool,
    pub transpose: bool,
}

/// y solving op(A) y = alpha x for an n x n matrix given by its entries, reading only the
/// triangle `t.lower` names (of A, before the operation) and its diagonal unless `t.unit`
/// (duplicates add up, as in SpMV). A missing diagonal entry of a non-unit matrix is a zero
/// pivot: the result holds its infinities, as a division by zero gives.
pub fn spsv(entries: &[Entry], n: usize, t: Triangular, alpha: f64, x: &[f64]) -> Vec<f64> {
    // The rows of op(A)'s triangle, and its diagonal.
    let mut rows: Vec<Vec<(usize, f64)>> = vec![Vec::new(); n];
    let mut diagonal = vec![0.0f64; n];
    for &(r, c, v) in entries {
        if r == c {
            diagonal[r] += v;
        } else if (r > c) == t.lower {
            let (row, col) = if t.transpose { (c, r) } else { (r, c) };
            rows[row].push((col, v));
        }
    }
    // op(A) is lower when A's lower triangle is taken as is, or its upper one transposed.
    let forward = t.lower != t.transpose;
    let mut y = vec![0.0f64; n];
    let order: Box<dyn Iterator<Item = usize>> = if forward { Box::new(0..n) } else { Box::new((0..n).rev()) };
    for i in order {
        let sum = rows[i].iter().fold(alpha * x[i], |acc, &(j, v)| acc - v * y[j]);
        y[i] = if t.unit { sum } else { sum / diagonal[i] };
    }
    y
}

fn scale<'a>(values: impl Iterator<Item = &'a mut f64>, beta: f64) {
    for v in values {
        *v = if beta == 0.0 { 0.0 } else { *v * beta };
    }
}

/// A dense matrix's layout: element (r, c) is at `r + c * ld` (column-major) or `r * ld + c`.
#[derive(Clone, Copy)]
pub struct Layout {
    pub ld: usize,
    pub col_major: bool,
}

impl Layout {
    pub fn at(self, r: usize, c: usize) -> usize {
        if self.col_major { r + c * self.ld } else { r * self.ld + c }
    }
}

/// `C = alpha op(A) op(B) + beta C` with C of `m` x `n`; `b_transpose` reads B as its transpose.
#[allow(clippy::too_many_arguments)]
pub fn spmm(
    entries: &[Entry],
    a_transpose: bool,
    alpha: f64,
    b: &[f64],
    b_layout: Layout,
    b_transpose: bool,
    beta: f64,
    c: &mut [f64],
    c_layout: Layout,
    m: usize,
    n: usize,
) {
    for i in 0..m {
        for j in 0..n {
            let at = c_layout.at(i, j);
            c[at] = if beta == 0.0 { 0.0 } else { c[at] * beta };
        }
    }
    for &(r, col, v) in entries {
        let (i, k) = if a_transpose { (col, r) } else { (r, col) };
        for j in 0..n {
            let bkj = if b_transpose { b[b_layout.at(j, k)] } else { b[b_layout.at(k, j)] };
            c[c_layout.at(i, j)] += alpha * v * bkj;
        }
    }
}

/// A CSR product: 0-based offsets, columns sorted within each row, values.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Csr {
    pub offsets: Vec<i64>,
    pub columns: Vec<i64>,
    pub values: Vec<f64>,
}

/// `alpha A B` for A of `m` rows: every column a product reaches is an entry of its row (a sum
/// that cancels to zero stays an entry, as cuSPARSE keeps it).
pub fn spgemm(a: &[Entry], b: &[Entry], m: usize, alpha: f64) -> Csr {
    let mut b_rows: BTreeMap<usize, Vec<(usize, f64)>> = BTreeMap::new();
    for &(r, c, v) in b {
        b_rows.entry(r).or_default().push((c, v));
    }
    let mut rows: Vec<BTreeMap<usize, f64>> = vec![BTreeMap::new(); m];
    for &(i, k, av) in a {
        for &(j, bv) in b_rows.get(&k).map(Vec::as_slice).unwrap_or(&[]) {
            *rows[i].entry(j).or_insert(0.0) += alpha * av * bv;
        }
    }
    let mut out = Csr { offsets: vec![0], ..Csr::default() };
    for row in rows {
        for (c, v) in row {
            out.columns.push(c as i64);
            out.values.push(v);
        }
        out.offsets.push(out.columns.len() as i64);
    }
    out
}

/// The nonzero entries of a dense `rows` x `cols` matrix, row by row (CSR's and COO's order)
/// or column by column (CSC's).
pub fn dense_entries(d: &[f64], layout: Layout, rows: usize, cols: usize, by_rows: bool) -> Vec<Entry> {
    let mut out = Vec::new();
    let (outer, inner) = if by_rows { (rows, cols) } else { (cols, rows) };
    for o in 0..outer {
        for i in 0..inner {
            let (r, c) = if by_rows { (o, i) } else { (i, o) };
            let v = d[layout.at(r, c)];
            if v != 0.0 {
                out.push((r, c, v));
            }
        }
    }
    out
}

/// Compressed offsets (with `base`) of entries sorted by their major line.
pub fn offsets_of(entries: &[Entry], lines: usize, by_rows: bool, base: i64) -> Vec<i64> {
    let mut counts = vec![0i64; lines + 1];
    for &(r, c, _) in entries {
        counts[if by_rows { r } else { c } + 1] += 1;
    }
    let mut acc = base;
    counts
        .iter()
        .map(|n| {
            acc += n;
            acc
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csr_structure_is_checked() {
        let ok = compressed_entries(2, 2, &[1, 2, 3], &[1, 2], &[5.0, 6.0], 1, true).unwrap();
        assert_eq!(ok, vec![(0, 0, 5.0), (1, 1, 6.0)]);
        assert!(matches!(
            compressed_entries(2, 2, &[0, 1, 2], &[0, 2], &[1.0, 1.0], 0, true),
            Err(StructureError::IndexOutOfRange { at: 1, value: 2, .. })
        ));
        assert!(matches!(
            compressed_entries(2, 2, &[0, 2, 1], &[0, 1], &[1.0, 1.0], 0, true),
            Err(StructureError::Decreasing { .. })
        ));
        assert!(matches!(
            compressed_entries(2, 2, &[0, 1, 5], &[0, 1], &[1.0, 1.0], 0, true),
            Err(StructureError::LastOffset { .. })
        ));
    }

    #[test]
    fn spmv_and_its_transpose() {
        // [[1, 2], [0, 3]]
        let e = vec![(0, 0, 1.0), (0, 1, 2.0), (1, 1, 3.0)];
        let mut y = vec![1.0, 1.0];
        spmv(&e, false, 2.0, &[1.0, 1.0], 1.0, &mut y);
        assert_eq!(y, vec![7.0, 7.0]);
        let mut y = vec![f64::NAN, f64::NAN];
        spmv(&e, true, 1.0, &[1.0, 1.0], 0.0, &mut y);
        assert_eq!(y, vec![1.0, 5.0]);
    }

    #[test]
    fn spgemm_squares_a_matrix() {
        let e = vec![(0, 0, 1.0), (0, 1, 2.0), (1, 1, 3.0)];
        let c = spgemm(&e, &e, 2, 1.0);
        assert_eq!(c, Csr { offsets: vec![0, 2, 3], columns: vec![0, 1, 1], values: vec![1.0, 8.0, 9.0] });
    }

    #[test]
    fn spmm_with_transposed_b() {
        let e = vec![(0, 0, 1.0), (1, 1, 2.0)];
        // B (2x2 row-major) = [[1, 2], [3, 4]]; op(B) = B^T = [[1, 3], [2, 4]].
        let b = [1.0, 2.0, 3.0, 4.0];
        let mut c = vec![0.0; 4];
        let row = Layout { ld: 2, col_major: false };
        spmm(&e, false, 1.0, &b, row, true, 0.0, &mut c, row, 2, 2);
        assert_eq!(c, vec![1.0, 3.0, 4.0, 8.0]);
    }

    #[test]
    fn dense_round_trip_offsets() {
        let d = [0.0, 1.0, 2.0, 0.0]; // column-major 2x2: [[0, 2], [1, 0]]
        let col = Layout { ld: 2, col_major: true };
        let e = dense_entries(&d, col, 2, 2, true);
        assert_eq!(e, vec![(0, 1, 2.0), (1, 0, 1.0)]);
        assert_eq!(offsets_of(&e, 2, true, 1), vec![1, 2, 3]);
    }

    #[test]
    fn spsv_reads_one_triangle_and_solves_both_ways() {
        // A = [[2, 5], [1, 4]]: the 5 is the upper triangle, never read by a lower solve.
        let a: Vec<Entry> = vec![(0, 0, 2.0), (0, 1, 5.0), (1, 0, 1.0), (1, 1, 4.0)];
        let lower = Triangular { lower: true, unit: false, transpose: false };
        // L y = 2 x with x = (1, 3): y = (1, 1.25).
        assert_eq!(spsv(&a, 2, lower, 2.0, &[1.0, 3.0]), vec![1.0, 1.25]);
        // L^T y = x with x = (4, 8): y2 = 2, y1 = (4 - 2) / 2.
        assert_eq!(spsv(&a, 2, Triangular { transpose: true, ..lower }, 1.0, &[4.0, 8.0]), vec![1.0, 2.0]);
        // Unit lower: [[1, 0], [1, 1]] y = (1, 3): y = (1, 2).
        assert_eq!(spsv(&a, 2, Triangular { unit: true, ..lower }, 1.0, &[1.0, 3.0]), vec![1.0, 2.0]);
        // Upper: [[2, 5], [0, 4]] y = (9, 4): y2 = 1, y1 = 2.
        assert_eq!(spsv(&a, 2, Triangular { lower: false, ..lower }, 1.0, &[9.0, 4.0]), vec![2.0, 1.0]);
        // A zero pivot: no diagonal entry in row 1.
        let y = spsv(&[(0, 0, 1.0)], 2, lower, 1.0, &[1.0, 1.0]);
        assert!(y[1].is_infinite());
    }
}
