//! cuBLASLt's matmul on the CPU (what `emu` runs `cublasLtMatmul` with): D = epilogue(alpha
//! op(A) op(B) + beta C) per matrix of a strided batch, with matrices in column or row order,
//! computed in f32 by [`crate::cpu_blas`]'s GEMM. The epilogues are cuBLASLt's: a bias vector
//! (one value per row of D) added to every column, then RELU or GELU (the tanh approximation,
//! as cuBLASLt computes it); the AUX forms of GELU also store its input in a column-major
//! auxiliary matrix.

use crate::cpu_blas::Real;

/// Where one operand's matrices lie, in elements: `rows` x `cols` as stored, `ld` elements
/// between columns (column order) or rows (row order), `batch` matrices `stride` apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    pub rows: usize,
    pub cols: usize,
    pub ld: usize,
    pub row_major: bool,
    pub batch: usize,
    pub stride: usize,
}

impl Shape {
    /// Elements of one matrix, from its first to its last.
    pub fn matrix_len(&self) -> Option<usize> {
        if self.rows == 0 || self.cols == 0 {
            return Some(0);
        }
        let (outer, inner) = if self.row_major { (self.rows, self.cols) } else { (self.cols, self.rows) };
        (outer - 1).checked_mul(self.ld)?.checked_add(inner)
    }

    /// Elements the whole batch spans (`None` when it overflows).
    pub fn extent(&self) -> Option<usize> {
        let one = self.matrix_len()?;
        if one == 0 || self.batch == 0 {
            return Some(0);
        }
        (self.batch - 1).checked_mul(self.stride)?.checked_add(one)
    }

    /// The leading dimension holds a row (row order) or a column (column order).
    pub fn ld_ok(&self) -> bool {
        self.ld >= if self.row_major { self.cols } else { self.rows }.max(1)
    }

    /// (row, column) strides of the matrix, or of its transpose.
    fn strides(&self, trans: bool) -> (isize, isize) {
        let ld = self.ld as isize;
        let s = if self.row_major { (ld, 1) } else { (1, ld) };
        if trans { (s.1, s.0) } else { s }
    }

    fn at(&self, i: usize, j: usize) -> usize {
        if self.row_major { i * self.ld + j } else { i + j * self.ld }
    }
}

/// The activation of an epilogue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    None,
    Relu,
    Gelu,
}

/// What an epilogue does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Epilogue {
    pub bias: bool,
    pub activation: Activation,
    /// Store the activation's input in the auxiliary matrix.
    pub aux: bool,
}

impl Epilogue {
    /// cuBLASLt's `cublasLtEpilogue_t` values the CPU runs: DEFAULT (1), RELU (2), BIAS (4),
    /// RELU_BIAS (6), GELU (32), GELU_BIAS (36), GELU_AUX (160), GELU_AUX_BIAS (164).
    pub fn from_code(code: i64) -> Option<Epilogue> {
        let e = |bias, activation, aux| Some(Epilogue { bias, activation, aux });
        match code {
            1 => e(false, Activation::None, false),
            2 => e(false, Activation::Relu, false),
            4 => e(true, Activation::None, false),
            6 => e(true, Activation::Relu, false),
            32 => e(false, Activation::Gelu, false),
            36 => e(true, Activation::Gelu, false),
            160 => e(false, Activation::Gelu, true),
            164 => e(true, Activation::Gelu, true),
            _ => None,
        }
    }
}

fn gelu(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * (x + 0.044_715 * x * x * x)).tanh())
}

/// The operands of one matmul, as host vectors covering each operand's extent.
pub struct Operands<'a> {
    pub a: &'a [f32],
    pub a_shape: Shape,
    pub trans_a: bool,
    pub b: &'a [f32],
    pub b_shape: Shape,
    pub trans_b: bool,
    pub c: &'a [f32],
    pub c_shape: Shape,
    pub alpha: f32,
    pub beta: f32,
    /// The bias (m values per matrix, `stride` apart), with the epilogue's bias.
    pub bias: Option<(&'a [f32], usize)>,
}

/// The auxiliary output: column-major, `ld` apart, `stride` between matrices.
pub struct Aux<'a> {
    pub values: &'a mut [f32],
    pub ld: usize,
    pub stride: usize,
}

/// D = epilogue(alpha op(A) op(B) + beta C) for every matrix of the batch: `m` x `n` from D's
/// shape, `k` the inner dimension. The callers have checked every extent (each slice covers
/// its shape's extent) and that the shapes agree.
pub fn matmul(
    ops: &Operands<'_>,
    k: usize,
    d: &mut [f32],
    d_shape: Shape,
    epilogue: Epilogue,
    mut aux: Option<Aux<'_>>,
) {
    let (m, n) = (d_shape.rows, d_shape.cols);
    if m == 0 || n == 0 {
        return;
    }
    let mut tmp = vec![0f32; m * n];
    for batch in 0..d_shape.batch {
        let c0 = batch * ops.c_shape.stride;
        for j in 0..n {
            for i in 0..m {
                tmp[i + j * m] = if ops.beta == 0.0 { 0.0 } else { ops.c[c0 + ops.c_shape.at(i, j)] };
            }
        }
        if k > 0 {
            let a = &ops.a[batch * ops.a_shape.stride..];
            let b = &ops.b[batch * ops.b_shape.stride..];
            f32::gemm(
                m,
                k,
                n,
                ops.alpha,
                a,
                ops.a_shape.strides(ops.trans_a),
                b,
                ops.b_shape.strides(ops.trans_b),
                ops.beta,
                &mut tmp,
                (1, m as isize),
            );
        } else {
            tmp.iter_mut().for_each(|v| *v *= ops.beta);
        }
        let d0 = batch * d_shape.stride;
        for j in 0..n {
            for i in 0..m {
                let mut v = tmp[i + j * m];
                if let (true, Some((bias, stride))) = (epilogue.bias, ops.bias) {
                    v += bias[batch * stride + i];
                }
                if let (true, Some(aux)) = (epilogue.aux, aux.as_mut()) {
                    aux.values[batch * aux.stride + i + j * aux.ld] = v;
                }
                v = match epilogue.activation {
                    Activation::None => v,
                    Activation::Relu => v.max(0.0),
                    Activation::Gelu => gelu(v),
                };
                d[d0 + d_shape.at(i, j)] = v;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn col(rows: usize, cols: usize) -> Shape {
        Shape { rows, cols, ld: rows, row_major: false, batch: 1, stride: 0 }
    }

    #[test]
    fn row_and_column_order_with_bias_and_relu() {
        // A 2x2 row-major [[1,2],[3,4]], B identity (column-major), C zero: D = A + bias, RELU.
        let a = [1.0, 2.0, 3.0, 4.0];
        let a_shape = Shape { row_major: true, ..col(2, 2) };
        let b = [1.0, 0.0, 0.0, 1.0];
        let c = [0.0; 4];
        let bias = [-2.0, 1.0];
        let ops = Operands {
            a: &a,
            a_shape,
            trans_a: false,
            b: &b,
            b_shape: col(2, 2),
            trans_b: false,
            c: &c,
            c_shape: col(2, 2),
            alpha: 1.0,
            beta: 0.0,
            bias: Some((&bias, 0)),
        };
        let mut d = [9.0; 4];
        let e = Epilogue::from_code(6).unwrap();
        matmul(&ops, 2, &mut d, col(2, 2), e, None);
        // A + bias per row: [[-1,0],[4,5]] -> RELU [[0,0],[4,5]], column-major.
        assert_eq!(d, [0.0, 4.0, 0.0, 5.0]);
    }

    #[test]
    fn strided_batch_transposed_and_gelu_aux() {
        // Two 1x1 "matrices" per operand: D_b = gelu(alpha * a_b * b_b + beta * c_b).
        let one = |stride| Shape { batch: 2, stride, ..col(1, 1) };
        let ops = Operands {
            a: &[2.0, 0.0, 3.0],
            a_shape: one(2),
            trans_a: true,
            b: &[1.0, -1.0],
            b_shape: one(1),
            trans_b: false,
            c: &[1.0, 1.0],
            c_shape: one(1),
            alpha: 1.0,
            beta: 1.0,
            bias: None,
        };
        let mut d = [0.0; 2];
        let mut aux = [0.0; 2];
        let e = Epilogue::from_code(160).unwrap();
        matmul(&ops, 1, &mut d, one(1), e, Some(Aux { values: &mut aux, ld: 1, stride: 1 }));
        assert_eq!(aux, [3.0, -2.0]);
        assert!((d[0] - 2.9964).abs() < 1e-3, "{d:?}");
        assert!((d[1] + 0.0454).abs() < 1e-3, "{d:?}");
    }

    #[test]
    fn extents() {
        let s = Shape { rows: 3, cols: 2, ld: 4, row_major: false, batch: 3, stride: 10 };
        assert_eq!(s.extent(), Some(27));
        let r = Shape { row_major: true, ..s };
        assert_eq!(r.matrix_len(), Some(10));
        assert!(!Shape { ld: 2, ..s }.ld_ok());
        assert_eq!(Shape { rows: 0, ..s }.extent(), Some(0));
    }
}
