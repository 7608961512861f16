//! cuDNN's legacy tensor operations, pooling, softmax and LRN on the session: pooling, LRN and
//! op-tensor descriptors (kept in [`crate::registry::dnn`] as [`LegacyDesc`]s, like filters),
//! the pooling's output dimensions, and the computations (cudnnAddTensor, cudnnSetTensor,
//! cudnnScaleTensor, cudnnTransformTensor, cudnnOpTensor, pooling, softmax and cross-channel
//! LRN forward and backward), and reduce-tensor descriptors with cudnnReduceTensor.
//!
//! Every computation goes one way ([`Session::dnn_tensor_op`]): its tensors' shapes are
//! checked as cuDNN checks them (BAD_PARAM for tensors that do not fit together), every range
//! is computed from them and checked against the session's memory, and cuDNN (on a GPU) or the
//! CPU implementation of [`crate::cpu_dnn`] (emu) runs it.
//!
//! [`LegacyDesc`]: crate::registry::dnn::LegacyDesc

use phos_protocol::cudnn::CudnnStatus;

use super::CallCx;
use super::Session;
use super::cudnn::{dnn_status, vendor_status};
use super::cudnn_legacy::{
    CpuTensors, DATA_BFLOAT16, DATA_DOUBLE, DATA_FLOAT, DATA_HALF, checked_type, decode, element_bytes, elements,
    span_bytes,
};
use super::cudnn_ops::Range;
use crate::backend::vendor_cudnn::{ReduceRaw, TensorOp, TensorOpCall};
use crate::cpu_dnn::{self, Lrn, PoolGeometry, SoftmaxGroups};
use crate::registry::dnn::{
    LegacyKind, LegacyState, LrnSettings, OpTensorSettings, PoolingSettings, ReduceSettings, TensorShape,
};

/// cuDNN's most spatial dimensions of a pooling (CUDNN_DIM_MAX - 2).
const MAX_SPATIAL: usize = 6;
/// The most dimensions cudnnAddTensor and cudnnOpTensor take.
const MAX_BROADCAST_DIMS: usize = 5;
/// cudnnLRNMode_t's one mode, CUDNN_LRN_CROSS_CHANNEL_DIM1.
const LRN_CROSS_CHANNEL: i32 = 0;

/// One tensor of a computation: its name (for the log), descriptor and address, whether the
/// call writes it, and its place in cuDNN's call ([`TensorOpCall::t`]).
#[derive(Debug, Clone, Copy)]
pub(super) struct Operand {
    pub what: &'static str,
    pub desc: u64,
    pub addr: u64,
    pub writes: bool,
    pub slot: usize,
}

impl Operand {
    pub fn read(what: &'static str, slot: usize, (desc, addr): (u64, u64)) -> Self {
        Operand { what, desc, addr, writes: false, slot }
    }

    pub fn write(what: &'static str, slot: usize, (desc, addr): (u64, u64)) -> Self {
        Operand { what, desc, addr, writes: true, slot }
    }
}

/// One computation as the program called it: the session's handle and descriptor (pooling,
/// LRN or op-tensor; 0 for none), the algorithm and mode where the call takes them, the
/// scaling factors ([`TensorOpCall::scaling`]'s order), cudnnSetTensor's element and the
/// tensors in [`TensorOp`]'s order.
pub(super) struct LayerCall {
    pub op: TensorOp,
    pub handle: u64,
    pub desc: u64,
    pub algo: i32,
    pub mode: i32,
    pub scaling: [f32; 3],
    /// cudnnSetTensor's value, its first `value_len` bytes (8 for a double tensor, else 4).
    pub value: [u8; 8],
    pub value_len: usize,
    pub operands: Vec<Operand>,
}

impl LayerCall {
    pub fn new(op: TensorOp, handle: u64, operands: Vec<Operand>) -> Self {
        LayerCall { op, handle, desc: 0, algo: 0, mode: 0, scaling: [0.0; 3], value: [0; 8], value_len: 0, operands }
    }

    /// x into y (cudnnTransformTensor, pooling, softmax and LRN forward), with the call's
    /// descriptor, (algorithm, mode) and alpha, beta.
    pub fn forward(
        op: TensorOp,
        (handle, desc): (u64, u64),
        (algo, mode): (i32, i32),
        [alpha, beta]: [f32; 2],
        x: (u64, u64),
        y: (u64, u64),
    ) -> Self {
        let operands = vec![Operand::read("x", 0, x), Operand::write("y", 1, y)];
        LayerCall { desc, algo, mode, scaling: [alpha, beta, 0.0], ..LayerCall::new(op, handle, operands) }
    }

    /// From y, dy and x (absent for softmax) into dx: the backward passes.
    pub fn backward(
        op: TensorOp,
        (handle, desc): (u64, u64),
        (algo, mode): (i32, i32),
        [alpha, beta]: [f32; 2],
        [y, dy, x, dx]: [(u64, u64); 4],
    ) -> Self {
        let mut operands = vec![Operand::read("y", 0, y), Operand::read("dy", 1, dy)];
        if op == TensorOp::SoftmaxBackward {
            operands.push(Operand::write("dx", 2, dx));
        } else {
            operands.extend([Operand::read("x", 2, x), Operand::write("dx", 3, dx)]);
        }
        LayerCall { desc, algo, mode, scaling: [alpha, beta, 0.0], ..LayerCall::new(op, handle, operands) }
    }
}

/// What the CPU needs of a checked computation beyond its tensors.
enum Plan {
    Elementwise,
    /// cudnnAddTensor's or cudnnOpTensor's operand broadcast over the output (its index
    /// for each of the output's).
    Broadcast(Vec<usize>, Option<OpTensorSettings>),
    Pool(PoolGeometry),
    Softmax(SoftmaxGroups),
    Lrn(Lrn),
}

fn usizes(v: &[i32]) -> Vec<usize> {
    v.iter().map(|&d| d.max(0) as usize).collect()
}

/// A pooling's settings, checked as cudnnSetPoolingNdDescriptor checks them.
pub(super) fn checked_pooling(
    mode: i32,
    nan: i32,
    window: &[i32],
    pads: &[i32],
    strides: &[i32],
) -> Result<PoolingSettings, (CudnnStatus, String)> {
    let n = window.len();
    if n == 0 || n > MAX_SPATIAL || pads.len() != n || strides.len() != n {
        return Err((CudnnStatus::BAD_PARAM, format!("{n} spatial dimensions")));
    }
    if !(cpu_dnn::POOL_MAX..=cpu_dnn::POOL_MAX_DETERMINISTIC).contains(&mode) || !(0..=1).contains(&nan) {
        return Err((CudnnStatus::BAD_PARAM, format!("pooling mode {mode} with NaN propagation {nan}")));
    }
    if let Some(w) = window.iter().chain(strides).find(|&&w| w < 1) {
        return Err((CudnnStatus::BAD_PARAM, format!("window or stride {w}")));
    }
    if let Some(p) = pads.iter().find(|&&p| p < 0) {
        return Err((CudnnStatus::BAD_PARAM, format!("padding {p}")));
    }
    Ok(PoolingSettings {
        mode,
        nan_propagation: nan,
        window: window.to_vec(),
        pads: pads.to_vec(),
        strides: strides.to_vec(),
    })
}

/// The output dimensions of a pooling of `x`, or why cuDNN refuses it.
fn pooling_output(p: &PoolingSettings, x: &TensorShape) -> Result<Vec<i32>, String> {
    let spatial = p.window.len();
    if x.dims.len() != spatial + 2 {
        return Err(format!("the input has {} dimensions, where the pooling has {spatial} spatial ones", x.dims.len()));
    }
    let mut out = vec![x.dims[0], x.dims[1]];
    for d in 0..spatial {
        let padded = i64::from(x.dims[d + 2]) + 2 * i64::from(p.pads[d]);
        if padded < i64::from(p.window[d]) {
            return Err(format!("spatial dimension {d}: the window spans {}, the padded input {padded}", p.window[d]));
        }
        out.push(((padded - i64::from(p.window[d])) / i64::from(p.strides[d]) + 1) as i32);
    }
    Ok(out)
}

/// Whether `from` broadcasts over `to`: as many dimensions, each the same or 1.
fn broadcasts(from: &TensorShape, to: &TensorShape) -> bool {
    from.dims.len() == to.dims.len() && from.dims.iter().zip(&to.dims).all(|(&f, &t)| f == t || f == 1)
}

impl Session {
    pub(super) fn dnn_pooling(&self, cx: &CallCx, handle: u64) -> Result<PoolingSettings, CudnnStatus> {
        match self.dnn_legacy(cx, LegacyKind::Pooling, handle)?.state {
            LegacyState::Pooling(Some(p)) => Ok(p),
            _ => Err(self.dnn_bad(cx, format_args!("the pooling descriptor {handle:#x} was never set"))),
        }
    }

    pub(super) fn dnn_set_pooling(
        &self,
        cx: &CallCx,
        handle: u64,
        (mode, nan): (i32, i32),
        window: &[i32],
        pads: &[i32],
        strides: &[i32],
    ) -> Result<(), CudnnStatus> {
        let p = checked_pooling(mode, nan, window, pads, strides).map_err(|e| self.dnn_refuse_with(cx, e))?;
        self.dnn_legacy_set(cx, LegacyKind::Pooling, handle, LegacyState::Pooling(Some(p)))
    }

    /// cudnnGetPoolingNdForwardOutputDim: the dimensions of the output.
    pub(super) fn dnn_pooling_output(&self, cx: &CallCx, pooling: u64, x: u64) -> Result<Vec<i32>, CudnnStatus> {
        let p = self.dnn_pooling(cx, pooling)?;
        let (_, xs) = self.dnn_shape_of(cx, "inputTensorDesc", x)?;
        pooling_output(&p, &xs).map_err(|why| self.dnn_bad(cx, format_args!("{why}")))
    }

    pub(super) fn dnn_lrn(&self, cx: &CallCx, handle: u64) -> Result<LrnSettings, CudnnStatus> {
        match self.dnn_legacy(cx, LegacyKind::Lrn, handle)?.state {
            LegacyState::Lrn(l) => Ok(l),
            _ => Err(CudnnStatus::INTERNAL_ERROR),
        }
    }

    /// cudnnSetLRNDescriptor: a window of 1 to 16 channels, k at least 1e-5, beta at least
    /// 0.01 (cuDNN's CUDNN_LRN_MIN_N, MAX_N, MIN_K and MIN_BETA).
    pub(super) fn dnn_set_lrn(&self, cx: &CallCx, handle: u64, l: LrnSettings) -> Result<(), CudnnStatus> {
        if !(1..=16).contains(&l.n)
            || l.k.is_nan()
            || l.k < 1e-5
            || l.beta.is_nan()
            || l.beta < 0.01
            || !l.alpha.is_finite()
        {
            return Err(
                self.dnn_bad(cx, format_args!("LRN window {}, alpha {}, beta {}, k {}", l.n, l.alpha, l.beta, l.k))
            );
        }
        self.dnn_legacy_set(cx, LegacyKind::Lrn, handle, LegacyState::Lrn(l))
    }

    pub(super) fn dnn_op_tensor(&self, cx: &CallCx, handle: u64) -> Result<OpTensorSettings, CudnnStatus> {
        match self.dnn_legacy(cx, LegacyKind::OpTensor, handle)?.state {
            LegacyState::OpTensor(Some(o)) => Ok(o),
            _ => Err(self.dnn_bad(cx, format_args!("the op-tensor descriptor {handle:#x} was never set"))),
        }
    }

    pub(super) fn dnn_set_op_tensor(&self, cx: &CallCx, handle: u64, o: OpTensorSettings) -> Result<(), CudnnStatus> {
        if !(cpu_dnn::OP_ADD..=cpu_dnn::OP_NOT).contains(&o.op) || !(0..=1).contains(&o.nan_propagation) {
            return Err(self.dnn_bad(cx, format_args!("op {} with NaN propagation {}", o.op, o.nan_propagation)));
        }
        checked_type(o.compute_type).map_err(|e| self.dnn_refuse_with(cx, e))?;
        self.dnn_legacy_set(cx, LegacyKind::OpTensor, handle, LegacyState::OpTensor(Some(o)))
    }

    /// Checks a computation's shapes (`s`, in the operands' order) as cuDNN does and answers
    /// what the CPU needs.
    fn dnn_layer_plan(&self, cx: &CallCx, call: &LayerCall, s: &[TensorShape]) -> Result<Plan, CudnnStatus> {
        let names: Vec<(&str, &TensorShape)> = call.operands.iter().map(|o| o.what).zip(s).collect();
        let plan = self.dnn_layer_shapes(cx, call, s, &names)?;
        if call.op == TensorOp::Set {
            // No scaling factors: any type cuDNN sets; the value is a double for a double
            // tensor and a float for the others (half and bfloat16 included, as libcudnn reads it).
            if element_bytes(s[0].data_type).is_err() || set_value_bytes(s[0].data_type) != call.value_len {
                return Err(self.dnn_bad(
                    cx,
                    format_args!("a value of {} bytes for data type {}", call.value_len, s[0].data_type),
                ));
            }
            return Ok(plan);
        }
        self.dnn_same_types(cx, &names)?;
        Ok(plan)
    }

    /// The op-specific part of [`Session::dnn_layer_plan`] (the types are checked after).
    fn dnn_layer_shapes(
        &self,
        cx: &CallCx,
        call: &LayerCall,
        s: &[TensorShape],
        names: &[(&str, &TensorShape)],
    ) -> Result<Plan, CudnnStatus> {
        // Each of the tensors from `from` on has the dimensions of the first (the status cuDNN
        // answers otherwise: BAD_PARAM, NOT_SUPPORTED for an LRN).
        let same_dims_or = |from: usize, status: CudnnStatus| -> Result<(), CudnnStatus> {
            match s[from..].iter().zip(&names[from..]).find(|(t, _)| t.dims != s[from].dims) {
                Some((t, (what, _))) => Err(self.dnn_refuse(
                    cx,
                    status,
                    format_args!("{what} is {:?}, where {} is {:?}", t.dims, names[from].0, s[from].dims),
                )),
                None => Ok(()),
            }
        };
        let same_dims = |from: usize| same_dims_or(from, CudnnStatus::BAD_PARAM);
        // The gradient and the tensor it is of are strided alike (pooling and softmax backward).
        let same_strides = |a: usize, b: usize| -> Result<(), CudnnStatus> {
            if s[a].strides != s[b].strides {
                return Err(self.dnn_bad(
                    cx,
                    format_args!("{} is strided {:?}, {} {:?}", names[a].0, s[a].strides, names[b].0, s[b].strides),
                ));
            }
            Ok(())
        };
        let groups = |x: &TensorShape| {
            let d = usizes(&x.dims);
            (d[0], d[1], d[2..].iter().product::<usize>())
        };
        match call.op {
            TensorOp::Set | TensorOp::Scale => Ok(Plan::Elementwise),
            TensorOp::Transform => {
                same_dims(0)?;
                Ok(Plan::Elementwise)
            }
            TensorOp::Add | TensorOp::Op => {
                let (from, to) =
                    if call.op == TensorOp::Add { (&s[0], &s[1]) } else { (&s[s.len() - 2], &s[s.len() - 1]) };
                if to.dims.len() > MAX_BROADCAST_DIMS {
                    // cudnnAddTensor does not support more; cudnnOpTensor calls them bad.
                    let status =
                        if call.op == TensorOp::Add { CudnnStatus::NOT_SUPPORTED } else { CudnnStatus::BAD_PARAM };
                    return Err(self.dnn_refuse(
                        cx,
                        status,
                        format_args!("{} dimensions (cuDNN takes up to {MAX_BROADCAST_DIMS})", to.dims.len()),
                    ));
                }
                let op = if call.op == TensorOp::Op { Some(self.dnn_op_tensor(cx, call.desc)?) } else { None };
                // cudnnOpTensor's A has C's dimensions; B (or cudnnAddTensor's A) broadcasts.
                if op.is_some() && s[0].dims != to.dims {
                    return Err(self.dnn_bad(cx, format_args!("A is {:?}, where C is {:?}", s[0].dims, to.dims)));
                }
                if !broadcasts(from, to) {
                    return Err(self.dnn_bad(cx, format_args!("{:?} does not broadcast over {:?}", from.dims, to.dims)));
                }
                Ok(Plan::Broadcast(cpu_dnn::broadcast_indices(&usizes(&to.dims), &usizes(&from.dims)), op))
            }
            TensorOp::PoolingForward | TensorOp::PoolingBackward => {
                let p = self.dnn_pooling(cx, call.desc)?;
                // Forward: x, y. Backward: y, dy, x, dx.
                let (x, y) = if call.op == TensorOp::PoolingForward { (&s[0], &s[1]) } else { (&s[2], &s[0]) };
                if call.op == TensorOp::PoolingBackward {
                    same_dims(2)?;
                    if s[1].dims != s[0].dims {
                        return Err(self.dnn_bad(cx, format_args!("dy is {:?}, where y is {:?}", s[1].dims, s[0].dims)));
                    }
                    same_strides(0, 1)?;
                    same_strides(2, 3)?;
                }
                if x.dims.len() != p.window.len() + 2 {
                    return Err(self.dnn_bad(
                        cx,
                        format_args!("{} dimensions for a pooling of {} spatial ones", x.dims.len(), p.window.len()),
                    ));
                }
                // cuDNN checks the batch and channels only: each output position pools the
                // window the stride and padding place it at, whatever the output's extent.
                if y.dims.len() != x.dims.len() || y.dims[..2] != x.dims[..2] {
                    return Err(
                        self.dnn_bad(cx, format_args!("the output is {:?} for an input of {:?}", y.dims, x.dims))
                    );
                }
                let out = y.dims.clone();
                let l = |v: &[i32]| v.iter().map(|&d| i64::from(d)).collect::<Vec<_>>();
                Ok(Plan::Pool(PoolGeometry {
                    planes: usizes(&x.dims[..2]).iter().product(),
                    input: usizes(&x.dims[2..]),
                    output: usizes(&out[2..]),
                    window: l(&p.window),
                    pads: l(&p.pads),
                    strides: l(&p.strides),
                    mode: p.mode,
                    propagate_nan: p.nan_propagation == 1,
                }))
            }
            TensorOp::SoftmaxForward | TensorOp::SoftmaxBackward => {
                if !(cpu_dnn::SOFTMAX_FAST..=cpu_dnn::SOFTMAX_LOG).contains(&call.algo) || !(0..=1).contains(&call.mode)
                {
                    return Err(self.dnn_bad(cx, format_args!("softmax algorithm {} in mode {}", call.algo, call.mode)));
                }
                same_dims(0)?;
                if call.op == TensorOp::SoftmaxBackward {
                    same_strides(0, 1)?;
                }
                let (n, c, spatial) = groups(&s[0]);
                Ok(Plan::Softmax(SoftmaxGroups { n, c, spatial, per_channel: call.mode == 1 }))
            }
            TensorOp::LrnForward | TensorOp::LrnBackward => {
                let l = self.dnn_lrn(cx, call.desc)?;
                if call.mode != LRN_CROSS_CHANNEL {
                    return Err(self.dnn_bad(cx, format_args!("LRN mode {}", call.mode)));
                }
                // cuDNN does not support tensors of other types or dimensions than x's.
                if let Some((what, t)) = names.iter().find(|(_, t)| t.data_type != s[0].data_type) {
                    return Err(self.dnn_refuse(
                        cx,
                        CudnnStatus::NOT_SUPPORTED,
                        format_args!("{what} is of type {}, x of type {}", t.data_type, s[0].data_type),
                    ));
                }
                same_dims_or(0, CudnnStatus::NOT_SUPPORTED)?;
                if s[0].dims.len() > 5 {
                    return Err(self.dnn_refuse(
                        cx,
                        CudnnStatus::NOT_SUPPORTED,
                        format_args!("{} dimensions (cuDNN takes up to 5)", s[0].dims.len()),
                    ));
                }
                let (images, c, spatial) = groups(&s[0]);
                Ok(Plan::Lrn(Lrn { images, c, spatial, n: l.n as usize, alpha: l.alpha, beta: l.beta, k: l.k }))
            }
        }
    }

    /// Run a tensor computation: check its handle, descriptor, shapes and every range, then
    /// hand it to cuDNN or the CPU.
    pub(super) fn dnn_tensor_op(&self, cx: &CallCx, call: LayerCall) -> Result<(), CudnnStatus> {
        let h = self.dnn_handle(cx, call.handle)?;
        let mut shapes = Vec::with_capacity(call.operands.len());
        for o in &call.operands {
            shapes.push(self.dnn_shape_of(cx, o.what, o.desc)?.1);
        }
        let plan = self.dnn_layer_plan(cx, &call, &shapes)?;
        let ranges: Vec<Range<'_>> = call
            .operands
            .iter()
            .zip(&shapes)
            .map(|(o, s)| Range { writes: o.writes, ..Range::read(o.what, o.addr, span_bytes(s)) })
            .collect();
        let access = self.dnn_ranges(cx, &ranges)?;
        let raw = match self.vendor_cudnn() {
            Some(_) => {
                let desc_kind = match call.op {
                    TensorOp::Op => Some(LegacyKind::OpTensor),
                    TensorOp::PoolingForward | TensorOp::PoolingBackward => Some(LegacyKind::Pooling),
                    TensorOp::LrnForward | TensorOp::LrnBackward => Some(LegacyKind::Lrn),
                    _ => None,
                };
                let desc = match desc_kind {
                    Some(kind) => self.dnn_legacy(cx, kind, call.desc)?.raw,
                    None => 0,
                };
                let mut t = [(0u64, 0u64); 4];
                for o in &call.operands {
                    t[o.slot] = (self.dnn_tensor_of(cx, o.desc)?.raw, o.addr);
                }
                // A unary op-tensor reads A alone: cuDNN is given A (checked, of C's shape) as
                // B too, never the program's unchecked B.
                if call.op == TensorOp::Op && call.operands.len() == 2 {
                    t[1] = t[0];
                }
                Some(TensorOpCall {
                    op: call.op,
                    handle: h.raw,
                    desc,
                    algo: call.algo,
                    mode: call.mode,
                    scaling: call.scaling,
                    value: call.value,
                    t,
                })
            }
            None => None,
        };
        self.dnn_work(cx, &h)?;
        let name = cx.function.map_or("cuDNN", |f| f.name());
        self.before_work(name, &access).map_err(dnn_status)?;
        if let (Some(cudnn), Some(raw)) = (self.vendor_cudnn(), raw) {
            self.backend.bind(h.device).map_err(dnn_status)?;
            return vendor_status(cudnn.tensor_op(&raw));
        }
        let refs: Vec<&TensorShape> = shapes.iter().collect();
        // cudnnSetTensor writes double data too (it has no scaling factors).
        if !(call.op == TensorOp::Set && shapes[0].data_type == DATA_DOUBLE) {
            self.dnn_cpu_takes(cx, &refs)?;
        }
        let t = self.dnn_cpu(&h)?;
        let at = |i: usize| call.operands[i].addr;
        layer_on_cpu(&t, &call, &shapes, plan, at)
    }
}

/// cudnnReduceTensorIndices_t's CUDNN_REDUCE_TENSOR_FLATTENED_INDICES and cudnnIndicesType_t's
/// CUDNN_32BIT_INDICES: the indices cuDNN answers.
const FLATTENED_INDICES: i32 = 1;
const INDICES_32BIT: i32 = 0;

/// One reduction as the program called it.
pub(super) struct ReduceCall {
    pub handle: u64,
    pub desc: u64,
    pub indices: u64,
    pub indices_size: u64,
    pub workspace: u64,
    pub workspace_size: u64,
    pub scaling: [f32; 2],
    pub a: (u64, u64),
    pub c: (u64, u64),
}

impl Session {
    pub(super) fn dnn_reduce_settings(&self, cx: &CallCx, handle: u64) -> Result<ReduceSettings, CudnnStatus> {
        match self.dnn_legacy(cx, LegacyKind::ReduceTensor, handle)?.state {
            LegacyState::ReduceTensor(Some(r)) => Ok(r),
            _ => Err(self.dnn_bad(cx, format_args!("the reduce-tensor descriptor {handle:#x} was never set"))),
        }
    }

    pub(super) fn dnn_set_reduce(&self, cx: &CallCx, handle: u64, r: ReduceSettings) -> Result<(), CudnnStatus> {
        let known = (cpu_dnn::REDUCE_ADD..=cpu_dnn::REDUCE_MUL_NO_ZEROS).contains(&r.op)
            && (0..=1).contains(&r.nan_propagation)
            && (0..=1).contains(&r.indices)
            && (0..=3).contains(&r.indices_type);
        if !known {
            return Err(self.dnn_bad(
                cx,
                format_args!(
                    "reduction {} with NaN propagation {}, indices {} of type {}",
                    r.op, r.nan_propagation, r.indices, r.indices_type
                ),
            ));
        }
        checked_type(r.compute_type).map_err(|e| self.dnn_refuse_with(cx, e))?;
        self.dnn_legacy_set(cx, LegacyKind::ReduceTensor, handle, LegacyState::ReduceTensor(Some(r)))
    }

    /// A reduction's settings and shapes, checked as cuDNN checks them: C has A's dimensions
    /// or 1 in each; indices only of MIN, MAX and AMAX, 32-bit.
    fn dnn_reduce_shapes(
        &self,
        cx: &CallCx,
        desc: u64,
        a: u64,
        c: u64,
    ) -> Result<(ReduceSettings, TensorShape, TensorShape), CudnnStatus> {
        let r = self.dnn_reduce_settings(cx, desc)?;
        let (_, a) = self.dnn_shape_of(cx, "aDesc", a)?;
        let (_, c) = self.dnn_shape_of(cx, "cDesc", c)?;
        if !broadcasts(&c, &a) {
            return Err(self.dnn_bad(cx, format_args!("C {:?} is not a reduction of A {:?}", c.dims, a.dims)));
        }
        if r.indices == FLATTENED_INDICES && (!cpu_dnn::reduce_has_indices(r.op) || r.indices_type != INDICES_32BIT) {
            return Err(self.dnn_refuse(
                cx,
                CudnnStatus::NOT_SUPPORTED,
                format_args!(
                    "indices of type {} for reduction {} (cuDNN answers 32-bit indices of MIN, MAX and AMAX)",
                    r.indices_type, r.op
                ),
            ));
        }
        self.dnn_same_types(cx, &[("A", &a), ("C", &c)])?;
        Ok((r, a, c))
    }

    /// cudnnGetReductionIndicesSize (`indices`) or cudnnGetReductionWorkspaceSize.
    pub(super) fn dnn_reduce_size(
        &self,
        cx: &CallCx,
        indices: bool,
        handle: u64,
        desc: u64,
        a: u64,
        c: u64,
    ) -> Result<u64, CudnnStatus> {
        let h = self.dnn_handle(cx, handle)?;
        let (r, _, cs) = self.dnn_reduce_shapes(cx, desc, a, c)?;
        let Some(cudnn) = self.vendor_cudnn() else {
            let wanted = indices && r.indices == FLATTENED_INDICES;
            return Ok(if wanted { elements(&cs) * 4 } else { 0 });
        };
        let raw = (
            self.dnn_legacy(cx, LegacyKind::ReduceTensor, desc)?.raw,
            self.dnn_tensor_of(cx, a)?.raw,
            self.dnn_tensor_of(cx, c)?.raw,
        );
        self.backend.bind(h.device).map_err(dnn_status)?;
        cudnn.reduction_size(indices, h.raw, raw).map_err(CudnnStatus)
    }

    /// cudnnReduceTensor.
    pub(super) fn dnn_reduce(&self, cx: &CallCx, call: ReduceCall) -> Result<(), CudnnStatus> {
        let h = self.dnn_handle(cx, call.handle)?;
        let (r, a, c) = self.dnn_reduce_shapes(cx, call.desc, call.a.0, call.c.0)?;
        let wants_indices = r.indices == FLATTENED_INDICES;
        let (indices_needed, workspace_needed) = match self.vendor_cudnn() {
            Some(_) => (
                self.dnn_reduce_size(cx, true, call.handle, call.desc, call.a.0, call.c.0)?,
                self.dnn_reduce_size(cx, false, call.handle, call.desc, call.a.0, call.c.0)?,
            ),
            None => (if wants_indices { elements(&c) * 4 } else { 0 }, 0),
        };
        if call.indices_size < indices_needed || call.workspace_size < workspace_needed {
            return Err(self.dnn_bad(
                cx,
                format_args!(
                    "indices of {} bytes and a workspace of {}, where the reduction needs {indices_needed} and {workspace_needed}",
                    call.indices_size, call.workspace_size
                ),
            ));
        }
        let ranges = [
            Range::read("A", call.a.1, span_bytes(&a)),
            Range::write("C", call.c.1, span_bytes(&c)),
            Range { optional: call.indices_size == 0, ..Range::write("indices", call.indices, call.indices_size) },
            Range {
                optional: call.workspace_size == 0,
                ..Range::write("workspace", call.workspace, call.workspace_size)
            },
        ];
        let access = self.dnn_ranges(cx, &ranges)?;
        let raw = match self.vendor_cudnn() {
            Some(_) => Some(ReduceRaw {
                handle: h.raw,
                desc: self.dnn_legacy(cx, LegacyKind::ReduceTensor, call.desc)?.raw,
                indices: call.indices,
                indices_size: call.indices_size,
                workspace: call.workspace,
                workspace_size: call.workspace_size,
                scaling: call.scaling,
                a: (self.dnn_tensor_of(cx, call.a.0)?.raw, call.a.1),
                c: (self.dnn_tensor_of(cx, call.c.0)?.raw, call.c.1),
            }),
            None => None,
        };
        self.dnn_work(cx, &h)?;
        self.before_work("cudnnReduceTensor", &access).map_err(dnn_status)?;
        if let (Some(cudnn), Some(raw)) = (self.vendor_cudnn(), raw) {
            self.backend.bind(h.device).map_err(dnn_status)?;
            return vendor_status(cudnn.reduce(&raw));
        }
        self.dnn_cpu_takes(cx, &[&a, &c])?;
        let t = self.dnn_cpu(&h)?;
        let group = cpu_dnn::broadcast_indices(&usizes(&a.dims), &usizes(&c.dims));
        let (result, picked) = cpu_dnn::reduce(r.op, &t.load(call.a.1, &a)?, &group, elements(&c) as usize);
        let [alpha, beta] = call.scaling.map(f64::from);
        t.blend_store(call.c.1, &c, alpha, &result, beta)?;
        if wants_indices {
            let bytes: Vec<u8> = picked.iter().flat_map(|i| i.to_le_bytes()).collect();
            super::device_io::write(self, t.stream, call.indices, &bytes).map_err(dnn_status)?;
        }
        Ok(())
    }
}

/// The bytes of cudnnSetTensor's value for a tensor of `data_type`: a double for a double
/// tensor, a float for every other (libcudnn 9 reads a float for half and bfloat16 tensors:
/// measured on an H200, half bits given to a half tensor set it to zero).
pub(super) fn set_value_bytes(data_type: i32) -> usize {
    if data_type == DATA_DOUBLE { 8 } else { 4 }
}

/// The computation on the CPU, its shapes and plan checked.
fn layer_on_cpu(
    t: &CpuTensors<'_>,
    call: &LayerCall,
    s: &[TensorShape],
    plan: Plan,
    at: impl Fn(usize) -> u64,
) -> Result<(), CudnnStatus> {
    let [alpha, beta, third] = call.scaling.map(f64::from);
    let last = s.len() - 1;
    match (call.op, plan) {
        (TensorOp::Set, _) => {
            // A float for half and bfloat16 tensors (see `set_value_bytes`).
            let value_type =
                if matches!(s[0].data_type, DATA_HALF | DATA_BFLOAT16) { DATA_FLOAT } else { s[0].data_type };
            let value = decode(value_type, &call.value);
            let count = s[0].dims.iter().map(|&d| d.max(0) as usize).product();
            t.store(at(0), &s[0], &vec![value; count])
        }
        (TensorOp::Scale, _) => {
            let y: Vec<f64> = t.load(at(0), &s[0])?.iter().map(|v| alpha * v).collect();
            t.store(at(0), &s[0], &y)
        }
        (TensorOp::Transform, _) => t.blend_store(at(1), &s[1], alpha, &t.load(at(0), &s[0])?, beta),
        (TensorOp::Add, Plan::Broadcast(index, _)) => {
            let a = t.load(at(0), &s[0])?;
            let spread: Vec<f64> = index.iter().map(|&i| a[i]).collect();
            t.blend_store(at(1), &s[1], alpha, &spread, beta)
        }
        (TensorOp::Op, Plan::Broadcast(index, Some(o))) => {
            // alpha1, alpha2, beta.
            let a = t.load(at(0), &s[0])?;
            let result: Vec<f64> = if cpu_dnn::op_is_unary(o.op) {
                a.iter().map(|&v| cpu_dnn::op_tensor(o.op, alpha * v, 0.0)).collect()
            } else {
                let b = t.load(at(1), &s[1])?;
                a.iter().zip(&index).map(|(&v, &i)| cpu_dnn::op_tensor(o.op, alpha * v, beta * b[i])).collect()
            };
            t.blend_store(at(last), &s[last], 1.0, &result, third)
        }
        (TensorOp::PoolingForward, Plan::Pool(g)) => {
            t.blend_store(at(1), &s[1], alpha, &cpu_dnn::pooling_forward(&g, &t.load(at(0), &s[0])?), beta)
        }
        (TensorOp::PoolingBackward, Plan::Pool(g)) => {
            let dx = cpu_dnn::pooling_backward(&g, &t.load(at(2), &s[2])?, &t.load(at(1), &s[1])?);
            t.blend_store(at(3), &s[3], alpha, &dx, beta)
        }
        (TensorOp::SoftmaxForward, Plan::Softmax(g)) => {
            let y = cpu_dnn::softmax_forward(&g, call.algo, &t.load(at(0), &s[0])?);
            t.blend_store(at(1), &s[1], alpha, &y, beta)
        }
        (TensorOp::SoftmaxBackward, Plan::Softmax(g)) => {
            let dx = cpu_dnn::softmax_backward(&g, call.algo, &t.load(at(0), &s[0])?, &t.load(at(1), &s[1])?);
            t.blend_store(at(2), &s[2], alpha, &dx, beta)
        }
        (TensorOp::LrnForward, Plan::Lrn(l)) => {
            t.blend_store(at(1), &s[1], alpha, &l.forward(&t.load(at(0), &s[0])?), beta)
        }
        (TensorOp::LrnBackward, Plan::Lrn(l)) => {
            let (y, dy, x) = (t.load(at(0), &s[0])?, t.load(at(1), &s[1])?, t.load(at(2), &s[2])?);
            t.blend_store(at(3), &s[3], alpha, &l.backward(&x, &y, &dy), beta)
        }
        _ => Err(CudnnStatus::INTERNAL_ERROR),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::service::cudnn_legacy::format_strides;

    fn tensor(dims: &[i32]) -> TensorShape {
        TensorShape { data_type: 0, dims: dims.to_vec(), strides: format_strides(0, dims).unwrap() }
    }

    #[test]
    fn pooling_output_follows_cudnns_formula() {
        let p = checked_pooling(0, 0, &[2, 3], &[0, 1], &[2, 2]).unwrap();
        // H: (24 - 2) / 2 + 1 = 12; W: (24 + 2 - 3) / 2 + 1 = 12.
        assert_eq!(pooling_output(&p, &tensor(&[1, 20, 24, 24])).unwrap(), vec![1, 20, 12, 12]);
        assert!(pooling_output(&p, &tensor(&[1, 20, 24])).is_err());
        assert!(pooling_output(&p, &tensor(&[1, 20, 1, 24])).is_err());
    }

    #[test]
    fn bad_pooling_settings_are_refused() {
        assert_eq!(checked_pooling(4, 0, &[2, 2], &[0, 0], &[2, 2]).unwrap_err().0, CudnnStatus::BAD_PARAM);
        assert_eq!(checked_pooling(0, 2, &[2, 2], &[0, 0], &[2, 2]).unwrap_err().0, CudnnStatus::BAD_PARAM);
        assert_eq!(checked_pooling(0, 0, &[0, 2], &[0, 0], &[2, 2]).unwrap_err().0, CudnnStatus::BAD_PARAM);
        assert_eq!(checked_pooling(0, 0, &[2, 2], &[-1, 0], &[2, 2]).unwrap_err().0, CudnnStatus::BAD_PARAM);
        assert_eq!(checked_pooling(0, 0, &[2, 2], &[0, 0], &[2, 0]).unwrap_err().0, CudnnStatus::BAD_PARAM);
        assert_eq!(checked_pooling(0, 0, &[], &[], &[]).unwrap_err().0, CudnnStatus::BAD_PARAM);
    }

    #[test]
    fn broadcasting_needs_each_dimension_the_same_or_one() {
        assert!(broadcasts(&tensor(&[1, 20, 1, 1]), &tensor(&[2, 20, 5, 5])));
        assert!(!broadcasts(&tensor(&[1, 10, 1, 1]), &tensor(&[2, 20, 5, 5])));
        assert!(!broadcasts(&tensor(&[20, 1, 1]), &tensor(&[2, 20, 5, 5])));
    }
}
