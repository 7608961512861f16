//! cuDNN's legacy filters, convolutions and activations on the session: filter, convolution
//! and activation descriptors (kept in [`crate::registry::dnn`] as [`LegacyDesc`]s), the
//! convolution's output dimensions, algorithm queries and workspace sizes, and the
//! computations (convolution forward, backward data, filter and bias, the fused
//! convolution-bias-activation, activation forward and backward).
//!
//! Every setter is checked here as cuDNN checks it and given to cuDNN's own descriptor on a
//! GPU; the dispatch records it on its descriptor (restores replay it). A computation's every
//! device range is computed from its descriptors and checked against the session's memory
//! (the workspace against what cuDNN needs for the algorithm too) before cuDNN, or on emu the
//! CPU implementation of [`crate::cpu_dnn`], sees it.

use phos_protocol::cudnn::CudnnStatus;
use phos_protocol::spec::DeviceAccess;

use super::CallCx;
use super::Session;
use super::cudnn::{dnn_status, vendor_status};
use super::cudnn_legacy::{
    CpuTensors, DATA_DOUBLE, checked_type, cpu_type, elements, format_strides, span, span_bytes,
};
use crate::backend::vendor_cudnn::{ActivationCall, ConvCall, ConvDirection, PERF_BYTES};
use crate::cpu_dnn::{self, ACT_IDENTITY, ACT_RELU, Activation, ConvGeometry};
use crate::registry::dnn::{
    ActivationSettings, ConvSettings, DnnHandle, FilterShape, LegacyDesc, LegacyKind, LegacyState, TensorShape,
};

/// cuDNN's most spatial dimensions of a convolution (CUDNN_DIM_MAX - 2).
const MAX_SPATIAL: usize = 6;
/// cudnnConvolutionFwdAlgo_t's CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM: the one
/// algorithm the fused forward takes an identity activation with.
const FWD_IMPLICIT_PRECOMP_GEMM: i32 = 1;

/// One device range a call touches: what it is (for the log), where, how long, whether the
/// call writes it, whether it may be NULL.
pub(super) struct Range<'a> {
    pub what: &'a str,
    pub addr: u64,
    pub len: u64,
    pub writes: bool,
    pub optional: bool,
}

impl<'a> Range<'a> {
    pub fn read(what: &'a str, addr: u64, len: u64) -> Self {
        Range { what, addr, len, writes: false, optional: false }
    }

    pub fn write(what: &'a str, addr: u64, len: u64) -> Self {
        Range { what, addr, len, writes: true, optional: false }
    }
}

/// The checked shapes of one convolution.
struct ConvShapes {
    x: TensorShape,
    w: TensorShape,
    y: TensorShape,
    geometry: ConvGeometry,
}

/// The algorithm a query answers on the CPU, which needs no workspace: any algorithm runs there
/// (the computation is the same direct one).
fn cpu_algorithm(dir: ConvDirection) -> i32 {
    match dir {
        ConvDirection::Forward => 0,
        ConvDirection::BackwardData | ConvDirection::BackwardFilter => 1,
    }
}

/// One cudnnConvolution*AlgoPerf_t: algo, status, time (ms), memory, determinism, mathType.
fn perf_bytes(algo: i32, memory: u64) -> [u8; PERF_BYTES] {
    let mut out = [0u8; PERF_BYTES];
    out[0..4].copy_from_slice(&algo.to_le_bytes());
    out[16..24].copy_from_slice(&memory.to_le_bytes());
    // CUDNN_DETERMINISTIC.
    out[24..28].copy_from_slice(&1i32.to_le_bytes());
    out
}

/// A filter's shape as a tensor, strided as its format packs it.
fn filter_tensor(f: &FilterShape) -> Result<TensorShape, CudnnStatus> {
    Ok(TensorShape { data_type: f.data_type, dims: f.dims.clone(), strides: format_strides(f.format, &f.dims)? })
}

/// A filter's shape, checked as cudnnSetFilterNdDescriptor checks it.
pub(super) fn checked_filter(data_type: i32, format: i32, dims: &[i32]) -> Result<FilterShape, (CudnnStatus, String)> {
    checked_type(data_type)?;
    if dims.len() < 3 || dims.len() > 8 {
        return Err((CudnnStatus::BAD_PARAM, format!("{} dimensions (a filter has 3 to 8)", dims.len())));
    }
    if let Some(d) = dims.iter().find(|&&d| d < 1) {
        return Err((CudnnStatus::BAD_PARAM, format!("dimension {d}")));
    }
    let shape = FilterShape { data_type, format, dims: dims.to_vec() };
    let tensor = filter_tensor(&shape).map_err(|s| (s, format!("format {format}")))?;
    if span(&tensor) > 1 << 31 {
        return Err((CudnnStatus::NOT_SUPPORTED, format!("{dims:?} (more than 2^31 elements)")));
    }
    Ok(shape)
}

/// A convolution's geometry, checked as cudnnSetConvolutionNdDescriptor checks it.
pub(super) fn checked_conv(
    settings: &ConvSettings,
    pads: &[i32],
    strides: &[i32],
    dilations: &[i32],
    mode: i32,
    compute_type: i32,
) -> Result<ConvSettings, (CudnnStatus, String)> {
    let n = pads.len();
    if n == 0 || n > MAX_SPATIAL || strides.len() != n || dilations.len() != n {
        return Err((CudnnStatus::BAD_PARAM, format!("{n} spatial dimensions")));
    }
    if let Some(p) = pads.iter().find(|&&p| p < 0) {
        return Err((CudnnStatus::BAD_PARAM, format!("padding {p}")));
    }
    if let Some(s) = strides.iter().chain(dilations).find(|&&s| s < 1) {
        return Err((CudnnStatus::BAD_PARAM, format!("stride or dilation {s}")));
    }
    if !(0..=1).contains(&mode) {
        return Err((CudnnStatus::BAD_PARAM, format!("mode {mode}")));
    }
    checked_type(compute_type)?;
    Ok(ConvSettings {
        pads: pads.to_vec(),
        strides: strides.to_vec(),
        dilations: dilations.to_vec(),
        mode,
        compute_type,
        ..settings.clone()
    })
}

/// The output dimensions of a convolution of `x` by `w`, or why cuDNN refuses it.
fn output_dims(conv: &ConvSettings, x: &TensorShape, w: &FilterShape) -> Result<Vec<i32>, String> {
    let spatial = conv.pads.len();
    if spatial == 0 {
        return Err("the convolution descriptor was never given its geometry".into());
    }
    if x.dims.len() != spatial + 2 || w.dims.len() != spatial + 2 {
        return Err(format!(
            "the input has {} dimensions and the filter {}, where the convolution has {spatial} spatial ones",
            x.dims.len(),
            w.dims.len()
        ));
    }
    let groups = conv.groups.max(1);
    if i64::from(x.dims[1]) != i64::from(w.dims[1]) * i64::from(groups) || w.dims[0] % groups != 0 {
        return Err(format!(
            "{} input channels and a filter of {}x{} in {groups} groups",
            x.dims[1], w.dims[0], w.dims[1]
        ));
    }
    let mut out = vec![x.dims[0], w.dims[0]];
    for d in 0..spatial {
        let extent = (i64::from(w.dims[d + 2]) - 1) * i64::from(conv.dilations[d]) + 1;
        let padded = i64::from(x.dims[d + 2]) + 2 * i64::from(conv.pads[d]);
        if padded < extent {
            return Err(format!("spatial dimension {d}: the filter spans {extent}, the padded input {padded}"));
        }
        out.push(((padded - extent) / i64::from(conv.strides[d]) + 1) as i32);
    }
    Ok(out)
}

/// The CPU's view of a checked convolution.
fn geometry(conv: &ConvSettings, x: &TensorShape, w: &FilterShape, y: &[i32]) -> ConvGeometry {
    let u = |v: &[i32]| v.iter().map(|&d| d as usize).collect::<Vec<_>>();
    let l = |v: &[i32]| v.iter().map(|&d| i64::from(d)).collect::<Vec<_>>();
    ConvGeometry {
        n: x.dims[0] as usize,
        c: x.dims[1] as usize,
        k: w.dims[0] as usize,
        groups: conv.groups.max(1) as usize,
        input: u(&x.dims[2..]),
        filter: u(&w.dims[2..]),
        output: u(&y[2..]),
        pads: l(&conv.pads),
        strides: l(&conv.strides),
        dilations: l(&conv.dilations),
        flip: conv.mode == 0,
    }
}

impl Session {
    /// A refusal with cuDNN's status, logged (bounded).
    pub(super) fn dnn_refuse_with(&self, cx: &CallCx, (status, why): (CudnnStatus, String)) -> CudnnStatus {
        self.dnn_refuse(cx, status, format_args!("{why}"))
    }

    pub(super) fn dnn_legacy_create(&self, cx: &CallCx, kind: LegacyKind) -> Result<u64, CudnnStatus> {
        let full = || {
            crate::guest_warn!(
                self.id,
                "{}: the session holds {} descriptors of the kind already",
                cx.function.map_or("cuDNN", |f| f.name()),
                crate::registry::dnn::MAX_DNN_LEGACY
            );
            phos_protocol::CudaError::MemoryAllocation
        };
        let raw = match self.vendor_cudnn() {
            Some(cudnn) => {
                self.backend.bind(cx.device).map_err(dnn_status)?;
                cudnn.create_legacy(kind).map_err(CudnnStatus)?
            }
            None => 0,
        };
        let new = crate::registry::handles::NewHandle { forced: cx.forced(), full: &full };
        self.objects.dnn.create_legacy(kind, raw, &new).map_err(|e| {
            if let Some(cudnn) = self.vendor_cudnn().filter(|_| raw != 0) {
                cudnn.destroy_legacy(kind, raw);
            }
            dnn_status(e)
        })
    }

    pub(super) fn dnn_legacy_destroy(&self, cx: &CallCx, kind: LegacyKind, handle: u64) -> Result<(), CudnnStatus> {
        let d = self.objects.dnn.destroy_legacy(kind, handle).map_err(|_| self.dnn_not_a(cx, kind, handle))?;
        if let Some(cudnn) = self.vendor_cudnn().filter(|_| d.raw != 0) {
            self.backend.bind(cx.device).map_err(dnn_status)?;
            vendor_status(cudnn.destroy_legacy(kind, d.raw))?;
        }
        Ok(())
    }

    fn dnn_not_a(&self, cx: &CallCx, kind: LegacyKind, handle: u64) -> CudnnStatus {
        self.dnn_bad(cx, format_args!("{handle:#x} is not a {} of the session", kind.name().replace('_', " ")))
    }

    pub(super) fn dnn_legacy(&self, cx: &CallCx, kind: LegacyKind, handle: u64) -> Result<LegacyDesc, CudnnStatus> {
        self.objects.dnn.legacy(kind, handle).map_err(|_| self.dnn_not_a(cx, kind, handle))
    }

    /// Give a descriptor its new state (checked by the caller): cuDNN's first, then kept.
    pub(super) fn dnn_legacy_set(
        &self,
        cx: &CallCx,
        kind: LegacyKind,
        handle: u64,
        state: LegacyState,
    ) -> Result<(), CudnnStatus> {
        let d = self.dnn_legacy(cx, kind, handle)?;
        if let Some(cudnn) = self.vendor_cudnn().filter(|_| d.raw != 0) {
            self.backend.bind(cx.device).map_err(dnn_status)?;
            cudnn.apply_legacy(d.raw, &state).map_err(CudnnStatus)?;
        }
        self.objects.dnn.set_legacy(kind, handle, state).map_err(dnn_status)
    }

    pub(super) fn dnn_filter(&self, cx: &CallCx, handle: u64) -> Result<FilterShape, CudnnStatus> {
        match self.dnn_legacy(cx, LegacyKind::Filter, handle)?.state {
            LegacyState::Filter(Some(f)) => Ok(f),
            _ => Err(self.dnn_bad(cx, format_args!("the filter descriptor {handle:#x} was never given a shape"))),
        }
    }

    /// cudnnGetFilterSizeInBytes: the packed filter's bytes.
    pub(super) fn dnn_filter_bytes(&self, cx: &CallCx, handle: u64) -> Result<u64, CudnnStatus> {
        let f = self.dnn_filter(cx, handle)?;
        Ok(span_bytes(&filter_tensor(&f)?))
    }

    pub(super) fn dnn_conv(&self, cx: &CallCx, handle: u64) -> Result<ConvSettings, CudnnStatus> {
        match self.dnn_legacy(cx, LegacyKind::Convolution, handle)?.state {
            LegacyState::Convolution(c) => Ok(c),
            _ => Err(CudnnStatus::INTERNAL_ERROR),
        }
    }

    /// A convolution descriptor that has its geometry.
    fn dnn_conv_set(&self, cx: &CallCx, handle: u64) -> Result<ConvSettings, CudnnStatus> {
        let c = self.dnn_conv(cx, handle)?;
        if c.pads.is_empty() {
            return Err(self.dnn_bad(cx, format_args!("the convolution descriptor {handle:#x} was never set")));
        }
        Ok(c)
    }

    pub(super) fn dnn_activation(&self, cx: &CallCx, handle: u64) -> Result<ActivationSettings, CudnnStatus> {
        match self.dnn_legacy(cx, LegacyKind::Activation, handle)?.state {
            LegacyState::Activation(Some(a)) => Ok(a),
            _ => Err(self.dnn_bad(cx, format_args!("the activation descriptor {handle:#x} was never set"))),
        }
    }

    pub(super) fn dnn_set_filter(
        &self,
        cx: &CallCx,
        handle: u64,
        data_type: i32,
        format: i32,
        dims: &[i32],
    ) -> Result<(), CudnnStatus> {
        let shape = checked_filter(data_type, format, dims).map_err(|e| self.dnn_refuse_with(cx, e))?;
        self.dnn_legacy_set(cx, LegacyKind::Filter, handle, LegacyState::Filter(Some(shape)))
    }

    /// Change a convolution descriptor: `change` checks and answers its new settings.
    pub(super) fn dnn_change_conv(
        &self,
        cx: &CallCx,
        handle: u64,
        change: impl FnOnce(&ConvSettings) -> Result<ConvSettings, (CudnnStatus, String)>,
    ) -> Result<(), CudnnStatus> {
        let now = self.dnn_conv(cx, handle)?;
        let next = change(&now).map_err(|e| self.dnn_refuse_with(cx, e))?;
        self.dnn_legacy_set(cx, LegacyKind::Convolution, handle, LegacyState::Convolution(next))
    }

    /// Change an activation descriptor (its swish beta, or everything else).
    pub(super) fn dnn_change_activation(
        &self,
        cx: &CallCx,
        handle: u64,
        change: impl FnOnce(ActivationSettings) -> ActivationSettings,
    ) -> Result<(), CudnnStatus> {
        let now = match self.dnn_legacy(cx, LegacyKind::Activation, handle)?.state {
            LegacyState::Activation(a) => a,
            _ => None,
        };
        // cuDNN's defaults for what was never set: swish beta 1.
        let base = now.unwrap_or(ActivationSettings { mode: 0, nan_propagation: 0, coef: 0.0, swish_beta: 1.0 });
        let next = change(base);
        if !(0..=cpu_dnn::ACT_SWISH).contains(&next.mode) || !(0..=1).contains(&next.nan_propagation) {
            return Err(self.dnn_bad(
                cx,
                format_args!("activation mode {} with NaN propagation {}", next.mode, next.nan_propagation),
            ));
        }
        if next.coef.is_nan() || next.swish_beta.is_nan() {
            return Err(self.dnn_bad(cx, format_args!("a NaN coefficient")));
        }
        self.dnn_legacy_set(cx, LegacyKind::Activation, handle, LegacyState::Activation(Some(next)))
    }

    /// cudnnGetConvolutionNdForwardOutputDim: the dimensions of the output.
    pub(super) fn dnn_conv_output(&self, cx: &CallCx, conv: u64, x: u64, w: u64) -> Result<Vec<i32>, CudnnStatus> {
        let c = self.dnn_conv_set(cx, conv)?;
        let (_, xs) = self.dnn_shape_of(cx, "inputTensorDesc", x)?;
        let ws = self.dnn_filter(cx, w)?;
        output_dims(&c, &xs, &ws).map_err(|why| self.dnn_bad(cx, format_args!("{why}")))
    }

    /// Every range in `ranges` checked against the session's memory: the accesses to show
    /// the checkpoint engine.
    pub(super) fn dnn_ranges(&self, cx: &CallCx, ranges: &[Range<'_>]) -> Result<Vec<DeviceAccess>, CudnnStatus> {
        let mut access = Vec::with_capacity(ranges.len());
        for r in ranges {
            if r.addr == 0 && r.optional {
                continue;
            }
            if r.addr == 0 || !self.objects.memory.contains(r.addr, r.len) {
                return Err(self.dnn_bad(
                    cx,
                    format_args!("`{}` at {:#x} is not {} bytes of the session's device memory", r.what, r.addr, r.len),
                ));
            }
            access.push(DeviceAccess { addr: r.addr, len: r.len, writes: r.writes });
        }
        Ok(access)
    }

    /// Data the CPU implementation can work on: float, half or bfloat16 (not double: the
    /// scaling factors travel as floats) and no overlapping strides (more elements than the
    /// checked memory holds).
    pub(super) fn dnn_cpu_takes(&self, cx: &CallCx, shapes: &[&TensorShape]) -> Result<(), CudnnStatus> {
        for s in shapes {
            if !cpu_type(s.data_type) {
                return Err(self.dnn_refuse(
                    cx,
                    CudnnStatus::NOT_SUPPORTED,
                    format_args!("data type {} (the CPU implementation takes float, half and bfloat16)", s.data_type),
                ));
            }
            if elements(s) > span(s) {
                return Err(self.dnn_refuse(
                    cx,
                    CudnnStatus::NOT_SUPPORTED,
                    format_args!("overlapping strides {:?} (on the CPU implementation)", s.strides),
                ));
            }
        }
        Ok(())
    }

    /// The types of a call's tensors: all `data_type`, and not double.
    pub(super) fn dnn_same_types(&self, cx: &CallCx, shapes: &[(&str, &TensorShape)]) -> Result<(), CudnnStatus> {
        let first = shapes[0].1.data_type;
        if first == DATA_DOUBLE {
            return Err(self.dnn_refuse(
                cx,
                CudnnStatus::NOT_SUPPORTED,
                format_args!("double data (Phos carries the scaling factors as floats)"),
            ));
        }
        if let Some((what, s)) = shapes.iter().find(|(_, s)| s.data_type != first) {
            return Err(self.dnn_bad(
                cx,
                format_args!("{what} is of type {}, where {} is of type {first}", s.data_type, shapes[0].0),
            ));
        }
        Ok(())
    }

    /// The shapes of a convolution, checked as cuDNN checks them: the output's dimensions are
    /// what the input, filter and convolution make.
    fn dnn_conv_shapes(&self, cx: &CallCx, call: &ConvCall) -> Result<ConvShapes, CudnnStatus> {
        let conv = self.dnn_conv_set(cx, call.conv_desc)?;
        let (_, x) = self.dnn_shape_of(cx, "the input descriptor", call.x_desc)?;
        let filter = self.dnn_filter(cx, call.w_desc)?;
        let (_, y) = self.dnn_shape_of(cx, "the output descriptor", call.y_desc)?;
        let expected = output_dims(&conv, &x, &filter).map_err(|why| self.dnn_bad(cx, format_args!("{why}")))?;
        if y.dims != expected {
            return Err(self.dnn_bad(
                cx,
                format_args!("the output descriptor is {:?}, where the convolution makes {expected:?}", y.dims),
            ));
        }
        let w = filter_tensor(&filter)
            .map_err(|s| self.dnn_refuse(cx, s, format_args!("filter format {}", filter.format)))?;
        self.dnn_same_types(cx, &[("the input", &x), ("the filter", &w), ("the output", &y)])?;
        let geometry = geometry(&conv, &x, &filter, &expected);
        Ok(ConvShapes { x, w, y, geometry })
    }

    /// The call with cuDNN's objects in place of the session's.
    fn dnn_conv_raw(&self, cx: &CallCx, h: &DnnHandle, call: &ConvCall) -> Result<ConvCall, CudnnStatus> {
        let tensor =
            |d: u64| -> Result<u64, CudnnStatus> { if d == 0 { Ok(0) } else { Ok(self.dnn_tensor_of(cx, d)?.raw) } };
        let legacy = |kind, d: u64| -> Result<u64, CudnnStatus> {
            if d == 0 { Ok(0) } else { Ok(self.dnn_legacy(cx, kind, d)?.raw) }
        };
        Ok(ConvCall {
            handle: h.raw,
            x_desc: tensor(call.x_desc)?,
            w_desc: legacy(LegacyKind::Filter, call.w_desc)?,
            conv_desc: legacy(LegacyKind::Convolution, call.conv_desc)?,
            y_desc: tensor(call.y_desc)?,
            z_desc: tensor(call.z_desc)?,
            bias_desc: tensor(call.bias_desc)?,
            activation: legacy(LegacyKind::Activation, call.activation)?,
            ..*call
        })
    }

    /// cudnnGetConvolution*AlgorithmMaxCount: libcudnn's answer on a GPU; on the CPU what
    /// libcudnn 9 answers (its count is more than the enumeration's).
    pub(super) fn dnn_algorithm_max_count(
        &self,
        cx: &CallCx,
        dir: ConvDirection,
        handle: u64,
    ) -> Result<i32, CudnnStatus> {
        let h = self.dnn_handle(cx, handle)?;
        let Some(cudnn) = self.vendor_cudnn() else { return Ok(dir.library_max_count()) };
        self.backend.bind(h.device).map_err(dnn_status)?;
        cudnn.algorithm_max_count(dir, h.raw).map_err(CudnnStatus)
    }

    fn dnn_check_algo(&self, cx: &CallCx, dir: ConvDirection, algo: i32) -> Result<(), CudnnStatus> {
        if !(0..dir.algorithm_count()).contains(&algo) {
            return Err(self.dnn_bad(cx, format_args!("algorithm {algo}")));
        }
        Ok(())
    }

    /// The workspace a convolution's algorithm needs (none on the CPU).
    pub(super) fn dnn_conv_workspace(
        &self,
        cx: &CallCx,
        dir: ConvDirection,
        call: &ConvCall,
    ) -> Result<u64, CudnnStatus> {
        let h = self.dnn_handle(cx, call.handle)?;
        self.dnn_conv_shapes(cx, call)?;
        self.dnn_check_algo(cx, dir, call.algo)?;
        let Some(cudnn) = self.vendor_cudnn() else { return Ok(0) };
        let raw = self.dnn_conv_raw(cx, &h, call)?;
        self.backend.bind(h.device).map_err(dnn_status)?;
        cudnn.conv_workspace(dir, &raw).map_err(CudnnStatus)
    }

    /// The device ranges of a convolution: x, w and y (which of them it writes by `dir`), and
    /// the workspace.
    fn dnn_conv_ranges(
        &self,
        cx: &CallCx,
        dir: ConvDirection,
        call: &ConvCall,
        shapes: &ConvShapes,
    ) -> Result<Vec<DeviceAccess>, CudnnStatus> {
        let (x, w, y) = (span_bytes(&shapes.x), span_bytes(&shapes.w), span_bytes(&shapes.y));
        let [x_name, w_name, y_name] = match dir {
            ConvDirection::Forward => ["x", "w", "y"],
            ConvDirection::BackwardData => ["dx", "w", "dy"],
            ConvDirection::BackwardFilter => ["x", "dw", "dy"],
        };
        let ranges = [
            Range { writes: dir == ConvDirection::BackwardData, ..Range::read(x_name, call.x, x) },
            Range { writes: dir == ConvDirection::BackwardFilter, ..Range::read(w_name, call.w, w) },
            Range { writes: dir == ConvDirection::Forward, ..Range::read(y_name, call.y, y) },
            Range {
                optional: call.workspace_size == 0,
                ..Range::write("workSpace", call.workspace, call.workspace_size)
            },
        ];
        self.dnn_ranges(cx, &ranges)
    }

    /// Checks a convolution (its shapes, algorithm, workspace and every range) and answers its
    /// handle, shapes, cuDNN's call (on a GPU) and accesses.
    fn dnn_conv_checked(
        &self,
        cx: &CallCx,
        dir: ConvDirection,
        call: &ConvCall,
    ) -> Result<(DnnHandle, ConvShapes, Option<ConvCall>, Vec<DeviceAccess>), CudnnStatus> {
        let h = self.dnn_handle(cx, call.handle)?;
        let shapes = self.dnn_conv_shapes(cx, call)?;
        self.dnn_check_algo(cx, dir, call.algo)?;
        let raw = match self.vendor_cudnn() {
            Some(cudnn) => {
                let raw = self.dnn_conv_raw(cx, &h, call)?;
                self.backend.bind(h.device).map_err(dnn_status)?;
                let needed = cudnn.conv_workspace(dir, &raw).map_err(CudnnStatus)?;
                if call.workspace_size < needed {
                    return Err(self.dnn_bad(
                        cx,
                        format_args!(
                            "a workspace of {} bytes, where algorithm {} needs {needed}",
                            call.workspace_size, call.algo
                        ),
                    ));
                }
                Some(raw)
            }
            None => None,
        };
        let access = self.dnn_conv_ranges(cx, dir, call, &shapes)?;
        Ok((h, shapes, raw, access))
    }

    /// Run a convolution (forward, backward data or backward filter).
    pub(super) fn dnn_convolution(&self, cx: &CallCx, dir: ConvDirection, call: ConvCall) -> Result<(), CudnnStatus> {
        let (h, shapes, raw, access) = self.dnn_conv_checked(cx, dir, &call)?;
        self.dnn_work(cx, &h)?;
        let name = cx.function.map_or("cuDNN", |f| f.name());
        self.before_work(name, &access).map_err(dnn_status)?;
        if let (Some(cudnn), Some(raw)) = (self.vendor_cudnn(), raw) {
            self.backend.bind(h.device).map_err(dnn_status)?;
            return vendor_status(cudnn.convolution(dir, &raw));
        }
        self.dnn_cpu_takes(cx, &[&shapes.x, &shapes.w, &shapes.y])?;
        let t = self.dnn_cpu(&h)?;
        let g = &shapes.geometry;
        let [alpha, beta] = call.scaling.map(f64::from);
        let (result, addr, shape) = match dir {
            ConvDirection::Forward => {
                (cpu_dnn::conv_forward(g, &t.load(call.x, &shapes.x)?, &t.load(call.w, &shapes.w)?), call.y, &shapes.y)
            }
            ConvDirection::BackwardData => (
                cpu_dnn::conv_backward_data(g, &t.load(call.w, &shapes.w)?, &t.load(call.y, &shapes.y)?),
                call.x,
                &shapes.x,
            ),
            ConvDirection::BackwardFilter => (
                cpu_dnn::conv_backward_filter(g, &t.load(call.x, &shapes.x)?, &t.load(call.y, &shapes.y)?),
                call.w,
                &shapes.w,
            ),
        };
        t.blend_store(addr, shape, alpha, &result, beta)
    }

    /// Where the CPU implementation reads and writes: the handle's stream.
    pub(super) fn dnn_cpu(&self, h: &DnnHandle) -> Result<CpuTensors<'_>, CudnnStatus> {
        let stream = self.objects.streams.resolve(h.stream).map_err(dnn_status)?;
        Ok(CpuTensors { session: self, stream })
    }

    /// The algorithm queries: cuDNN's heuristics (`find` false), its measured search with its
    /// own buffers (`find`, `ex` false) or on the program's (`ex`, checked like the
    /// convolution). The CPU answers its one algorithm, which needs no workspace.
    pub(super) fn dnn_conv_algorithms(
        &self,
        cx: &CallCx,
        dir: ConvDirection,
        (find, ex): (bool, bool),
        call: &ConvCall,
        requested: i32,
    ) -> Result<(i32, Vec<u8>), CudnnStatus> {
        let room = usize::try_from(requested).unwrap_or(0).min(64);
        let mut results = vec![0u8; room * PERF_BYTES];
        if room == 0 {
            return Err(self.dnn_bad(cx, format_args!("requestedAlgoCount {requested}")));
        }
        let (h, raw) = if ex {
            let (h, _, raw, access) = self.dnn_conv_checked(cx, dir, &ConvCall { algo: 0, ..*call })?;
            self.dnn_work(cx, &h)?;
            let name = cx.function.map_or("cuDNN", |f| f.name());
            self.before_work(name, &access).map_err(dnn_status)?;
            (h, raw)
        } else {
            let h = self.dnn_handle(cx, call.handle)?;
            self.dnn_conv_shapes(cx, call)?;
            let raw = match self.vendor_cudnn() {
                Some(_) => Some(self.dnn_conv_raw(cx, &h, call)?),
                None => None,
            };
            if find {
                self.dnn_work(cx, &h)?;
            }
            (h, raw)
        };
        let (Some(cudnn), Some(raw)) = (self.vendor_cudnn(), raw) else {
            results[..PERF_BYTES].copy_from_slice(&perf_bytes(cpu_algorithm(dir), 0));
            return Ok((1, results));
        };
        self.backend.bind(h.device).map_err(dnn_status)?;
        let returned = if ex {
            cudnn.conv_find_ex(dir, &raw, &mut results)
        } else {
            cudnn.conv_algorithms(dir, find, &raw, &mut results)
        };
        Ok((returned.map_err(CudnnStatus)?.clamp(0, room as i32), results))
    }

    /// cudnnConvolutionBackwardBias: db (1 x K x 1...) = alpha * the sums of dy per channel
    /// + beta * db. `x` is dy, `y` is db.
    pub(super) fn dnn_backward_bias(&self, cx: &CallCx, call: ConvCall) -> Result<(), CudnnStatus> {
        let h = self.dnn_handle(cx, call.handle)?;
        let (_, dy) = self.dnn_shape_of(cx, "dyDesc", call.x_desc)?;
        let (_, db) = self.dnn_shape_of(cx, "dbDesc", call.y_desc)?;
        let bias_of = |s: &TensorShape| {
            s.dims.len() == dy.dims.len()
                && s.dims.iter().enumerate().all(|(i, &d)| d == if i == 1 { dy.dims[1] } else { 1 })
        };
        if !bias_of(&db) {
            return Err(self.dnn_bad(cx, format_args!("dbDesc is {:?} for dyDesc {:?}", db.dims, dy.dims)));
        }
        self.dnn_same_types(cx, &[("dyDesc", &dy), ("dbDesc", &db)])?;
        let access = self.dnn_ranges(
            cx,
            &[Range::read("dy", call.x, span_bytes(&dy)), Range::write("db", call.y, span_bytes(&db))],
        )?;
        let raw = match self.vendor_cudnn() {
            Some(_) => Some(self.dnn_conv_raw(cx, &h, &call)?),
            None => None,
        };
        self.dnn_work(cx, &h)?;
        self.before_work("cudnnConvolutionBackwardBias", &access).map_err(dnn_status)?;
        if let (Some(cudnn), Some(raw)) = (self.vendor_cudnn(), raw) {
            self.backend.bind(h.device).map_err(dnn_status)?;
            return vendor_status(cudnn.conv_backward_bias(&raw));
        }
        self.dnn_cpu_takes(cx, &[&dy, &db])?;
        let t = self.dnn_cpu(&h)?;
        let (n, c) = (dy.dims[0] as usize, dy.dims[1] as usize);
        let spatial = dy.dims[2..].iter().map(|&d| d as usize).product();
        let sums = cpu_dnn::channel_sums(n, c, spatial, &t.load(call.x, &dy)?);
        let [alpha, beta] = call.scaling.map(f64::from);
        t.blend_store(call.y, &db, alpha, &sums, beta)
    }

    /// cudnnConvolutionBiasActivationForward: y = act(alpha1 * conv(x, w) + alpha2 * z + bias).
    pub(super) fn dnn_conv_bias_activation(&self, cx: &CallCx, call: ConvCall) -> Result<(), CudnnStatus> {
        let act = self.dnn_activation(cx, call.activation)?;
        if act.mode != ACT_RELU && !(act.mode == ACT_IDENTITY && call.algo == FWD_IMPLICIT_PRECOMP_GEMM) {
            return Err(self.dnn_refuse(
                cx,
                CudnnStatus::NOT_SUPPORTED,
                format_args!(
                    "activation mode {} with algorithm {} (cuDNN fuses RELU, and IDENTITY with IMPLICIT_PRECOMP_GEMM)",
                    act.mode, call.algo
                ),
            ));
        }
        let (_, z) = self.dnn_shape_of(cx, "zDesc", call.z_desc)?;
        let (_, bias) = self.dnn_shape_of(cx, "biasDesc", call.bias_desc)?;
        let (h, shapes, raw, mut access) = self.dnn_conv_checked(cx, ConvDirection::Forward, &call)?;
        let k = shapes.y.dims[1];
        let bias_ok = bias.dims.len() == shapes.y.dims.len()
            && bias.dims.iter().enumerate().all(|(i, &d)| d == if i == 1 { k } else { 1 });
        if z.dims != shapes.y.dims || !bias_ok {
            return Err(self.dnn_bad(
                cx,
                format_args!("zDesc {:?} and biasDesc {:?} for an output of {:?}", z.dims, bias.dims, shapes.y.dims),
            ));
        }
        self.dnn_same_types(cx, &[("yDesc", &shapes.y), ("zDesc", &z)])?;
        access.extend(self.dnn_ranges(
            cx,
            &[Range::read("z", call.z, span_bytes(&z)), Range::read("bias", call.bias, span_bytes(&bias))],
        )?);
        self.dnn_work(cx, &h)?;
        self.before_work("cudnnConvolutionBiasActivationForward", &access).map_err(dnn_status)?;
        if let (Some(cudnn), Some(raw)) = (self.vendor_cudnn(), raw) {
            self.backend.bind(h.device).map_err(dnn_status)?;
            return vendor_status(cudnn.conv_bias_activation(&raw));
        }
        self.dnn_cpu_takes(cx, &[&shapes.x, &shapes.w, &shapes.y, &z, &bias])?;
        let t = self.dnn_cpu(&h)?;
        let conv = cpu_dnn::conv_forward(&shapes.geometry, &t.load(call.x, &shapes.x)?, &t.load(call.w, &shapes.w)?);
        let [alpha1, alpha2] = call.scaling.map(f64::from);
        // z is read only when alpha2 is not 0 (it may be y itself, holding anything).
        let z_values = if alpha2 == 0.0 { None } else { Some(t.load(call.z, &z)?) };
        let bias_values = t.load(call.bias, &bias)?;
        let spatial = shapes.geometry.output.iter().product::<usize>().max(1);
        let activation = Activation { mode: act.mode, coef: act.coef, swish_beta: act.swish_beta };
        let y: Vec<f64> = conv
            .iter()
            .enumerate()
            .map(|(i, v)| {
                let prior = z_values.as_ref().map_or(0.0, |z| alpha2 * z[i]);
                activation.forward(alpha1 * v + prior + bias_values[(i / spatial) % k as usize])
            })
            .collect();
        t.store(call.y, &shapes.y, &y)
    }

    /// cudnnActivationForward and cudnnActivationBackward.
    pub(super) fn dnn_activate(&self, cx: &CallCx, call: ActivationCall) -> Result<(), CudnnStatus> {
        let h = self.dnn_handle(cx, call.handle)?;
        let act = self.dnn_activation(cx, call.activation)?;
        if act.mode == ACT_IDENTITY {
            return Err(self.dnn_bad(cx, format_args!("the identity activation (cuDNN fuses it only)")));
        }
        let mut tensors: Vec<(&str, u64, u64, bool)> = vec![("x", call.x_desc, call.x, false)];
        if call.backward {
            tensors.extend([
                ("y", call.y_desc, call.y, false),
                ("dy", call.dy_desc, call.dy, false),
                ("dx", call.dx_desc, call.dx, true),
            ]);
        } else {
            tensors.push(("y", call.y_desc, call.y, true));
        }
        let mut shapes = Vec::with_capacity(tensors.len());
        for &(what, desc, _, _) in &tensors {
            shapes.push(self.dnn_shape_of(cx, what, desc)?.1);
        }
        if let Some(s) = shapes.iter().find(|s| s.dims != shapes[0].dims) {
            return Err(self.dnn_bad(cx, format_args!("tensors of {:?} and {:?}", shapes[0].dims, s.dims)));
        }
        let named: Vec<(&str, &TensorShape)> = tensors.iter().map(|t| t.0).zip(&shapes).collect();
        self.dnn_same_types(cx, &named)?;
        let ranges: Vec<Range<'_>> = tensors
            .iter()
            .zip(&shapes)
            .map(|(&(what, _, addr, writes), s)| Range { writes, ..Range::read(what, addr, span_bytes(s)) })
            .collect();
        let access = self.dnn_ranges(cx, &ranges)?;
        let raw = match self.vendor_cudnn() {
            Some(_) => {
                let tensor = |d: u64| -> Result<u64, CudnnStatus> { Ok(self.dnn_tensor_of(cx, d)?.raw) };
                Some(ActivationCall {
                    handle: h.raw,
                    activation: self.dnn_legacy(cx, LegacyKind::Activation, call.activation)?.raw,
                    x_desc: tensor(call.x_desc)?,
                    y_desc: tensor(call.y_desc)?,
                    dy_desc: if call.backward { tensor(call.dy_desc)? } else { 0 },
                    dx_desc: if call.backward { tensor(call.dx_desc)? } else { 0 },
                    ..call
                })
            }
            None => None,
        };
        self.dnn_work(cx, &h)?;
        let name = cx.function.map_or("cuDNN", |f| f.name());
        self.before_work(name, &access).map_err(dnn_status)?;
        if let (Some(cudnn), Some(raw)) = (self.vendor_cudnn(), raw) {
            self.backend.bind(h.device).map_err(dnn_status)?;
            return vendor_status(cudnn.activation(&raw));
        }
        let refs: Vec<&TensorShape> = shapes.iter().collect();
        self.dnn_cpu_takes(cx, &refs)?;
        let t = self.dnn_cpu(&h)?;
        let activation = Activation { mode: act.mode, coef: act.coef, swish_beta: act.swish_beta };
        let [alpha, beta] = call.scaling.map(f64::from);
        let x = t.load(call.x, &shapes[0])?;
        if call.backward {
            let (y, dy) = (t.load(call.y, &shapes[1])?, t.load(call.dy, &shapes[2])?);
            let dx: Vec<f64> = (0..x.len()).map(|i| activation.backward(x[i], y[i], dy[i])).collect();
            t.blend_store(call.dx, &shapes[3], alpha, &dx, beta)
        } else {
            let y: Vec<f64> = x.iter().map(|&v| activation.forward(v)).collect();
            t.blend_store(call.y, &shapes[1], alpha, &y, beta)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tensor(dims: &[i32]) -> TensorShape {
        TensorShape { data_type: 0, dims: dims.to_vec(), strides: format_strides(0, dims).unwrap() }
    }

    #[test]
    fn output_dimensions_follow_cudnns_formula() {
        let conv = checked_conv(&ConvSettings::default(), &[1, 0], &[2, 1], &[1, 2], 1, 0).unwrap();
        let w = FilterShape { data_type: 0, format: 0, dims: vec![8, 3, 3, 2] };
        // H: (10 + 2 - 3) / 2 + 1 = 5; W: (7 - 3) / 1 + 1 = 5 (dilated extent 3).
        assert_eq!(output_dims(&conv, &tensor(&[2, 3, 10, 7]), &w).unwrap(), vec![2, 8, 5, 5]);
        // Channels must match the filter's times the groups.
        assert!(output_dims(&conv, &tensor(&[2, 4, 10, 7]), &w).is_err());
        // A filter larger than the padded input.
        assert!(output_dims(&conv, &tensor(&[2, 3, 10, 2]), &w).is_err());
        let grouped = ConvSettings { groups: 3, ..conv.clone() };
        let depthwise = FilterShape { dims: vec![6, 1, 3, 2], ..w.clone() };
        assert_eq!(output_dims(&grouped, &tensor(&[2, 3, 10, 7]), &depthwise).unwrap()[1], 6);
    }

    #[test]
    fn bad_settings_are_refused_as_cudnn_refuses_them() {
        let base = ConvSettings::default();
        assert_eq!(checked_conv(&base, &[-1, 0], &[1, 1], &[1, 1], 0, 0).unwrap_err().0, CudnnStatus::BAD_PARAM);
        assert_eq!(checked_conv(&base, &[0, 0], &[0, 1], &[1, 1], 0, 0).unwrap_err().0, CudnnStatus::BAD_PARAM);
        assert_eq!(checked_conv(&base, &[0, 0], &[1, 1], &[1, 1], 2, 0).unwrap_err().0, CudnnStatus::BAD_PARAM);
        assert_eq!(checked_conv(&base, &[0, 0], &[1, 1], &[1, 1], 0, 99).unwrap_err().0, CudnnStatus::BAD_PARAM);
        assert_eq!(checked_conv(&base, &[], &[], &[], 0, 0).unwrap_err().0, CudnnStatus::BAD_PARAM);
        assert_eq!(checked_filter(0, 0, &[8, 3, 0, 3]).unwrap_err().0, CudnnStatus::BAD_PARAM);
        assert_eq!(checked_filter(0, 7, &[8, 3, 3, 3]).unwrap_err().0, CudnnStatus::BAD_PARAM);
        assert_eq!(checked_filter(0, 0, &[8, 3]).unwrap_err().0, CudnnStatus::BAD_PARAM);
        assert!(checked_filter(0, 1, &[8, 3, 3, 3]).is_ok());
        let huge = checked_filter(0, 0, &[i32::MAX, i32::MAX, i32::MAX]);
        assert!(huge.is_err());
    }

    #[test]
    fn a_perf_result_has_cudnns_layout() {
        let p = perf_bytes(5, 1024);
        assert_eq!(i32::from_le_bytes(p[0..4].try_into().unwrap()), 5);
        assert_eq!(u64::from_le_bytes(p[16..24].try_into().unwrap()), 1024);
        assert_eq!(i32::from_le_bytes(p[24..28].try_into().unwrap()), 1);
    }
}
