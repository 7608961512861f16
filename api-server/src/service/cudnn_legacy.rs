//! cuDNN's legacy API on the session: tensor descriptors (kind `cudnn_tensor_descriptor`,
//! kept in [`crate::registry::dnn`]) and batch normalization.
//!
//! A tensor descriptor's shape is checked here as cuDNN checks it (a bad dimension, stride or
//! type is `CUDNN_STATUS_BAD_PARAM`, logged, and changes nothing), kept by the registry, given
//! to cuDNN's own descriptor on a GPU, and recorded as one `cudnnSetTensorNdDescriptor` of the
//! shape, whichever setter made it, so a restore replays it after the creation.
//!
//! A batch normalization call names device memory through descriptors: every range is computed
//! from them, checked against the session's memory and shown to the checkpoint engine before
//! cuDNN (or, on emu, [`crate::cpu_dnn`]) sees it.

use phos_protocol::apis::Function;
use phos_protocol::cudnn::*;
use phos_protocol::spec::{DeviceAccess, RecordFacts};

use super::cudnn_ops::Range;
use super::device_io;
use super::{CallCx, Session};
use crate::backend::StreamRef;
use crate::backend::vendor_cudnn::BnCall;
use crate::cpu_dnn::{self, Groups};
use crate::registry::dnn::{DnnHandle, TensorDesc, TensorShape};

// The shape rules, shared with the guest (which checks a setter before sending it without
// waiting): one copy, so both answer alike.
use phos_protocol::dnn::{BN_PER_ACTIVATION, checked_shape};
pub(super) use phos_protocol::dnn::{
    DATA_BFLOAT16, DATA_DOUBLE, DATA_FLOAT, DATA_HALF, checked_type, element_bytes, elements, format_strides, span,
    span_bytes,
};

// cudnnBatchNormOps_t.
const BN_OPS_BN: i32 = 0;
const BN_OPS_BN_ADD_ACTIVATION: i32 = 2;

/// A type the CPU implementation reads and writes.
pub(super) fn cpu_type(data_type: i32) -> bool {
    matches!(data_type, DATA_FLOAT | DATA_HALF | DATA_BFLOAT16)
}

/// The ints a setter sent (the dispatch checked the length).
pub(super) fn int_array(bytes: &[u8]) -> Vec<i32> {
    bytes.chunks_exact(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

fn int_bytes(values: &[i32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// A host float the dispatch checked to be 4 bytes.
fn scaling(b: &[u8]) -> f32 {
    b.try_into().map_or(0.0, f32::from_le_bytes)
}

/// The element offsets of a shape in canonical (row-major over its dimensions) order.
fn offsets(shape: &TensorShape) -> Vec<usize> {
    let total: usize = shape.dims.iter().map(|&d| d as usize).product();
    let mut out = Vec::with_capacity(total);
    let mut index = vec![0usize; shape.dims.len()];
    for _ in 0..total {
        out.push(index.iter().zip(&shape.strides).map(|(&i, &s)| i * s as usize).sum());
        for d in (0..index.len()).rev() {
            index[d] += 1;
            if index[d] < shape.dims[d] as usize {
                break;
            }
            index[d] = 0;
        }
    }
    out
}

pub(super) fn decode(data_type: i32, bytes: &[u8]) -> f64 {
    match data_type {
        DATA_HALF => f64::from(half::f16::from_le_bytes([bytes[0], bytes[1]])),
        DATA_BFLOAT16 => f64::from(half::bf16::from_le_bytes([bytes[0], bytes[1]])),
        DATA_DOUBLE => f64::from_le_bytes(bytes[..8].try_into().expect("8 bytes of a double")),
        _ => f64::from(f32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]])),
    }
}

fn encode(data_type: i32, value: f64, out: &mut [u8]) {
    match data_type {
        DATA_HALF => out.copy_from_slice(&half::f16::from_f64(value).to_le_bytes()),
        DATA_BFLOAT16 => out.copy_from_slice(&half::bf16::from_f64(value).to_le_bytes()),
        DATA_DOUBLE => out.copy_from_slice(&value.to_le_bytes()),
        _ => out.copy_from_slice(&(value as f32).to_le_bytes()),
    }
}

/// Which size a query asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum BnSize {
    ForwardWorkspace,
    BackwardWorkspace,
    Reserve,
}

/// Which batch normalization call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum BnKind {
    ForwardTraining,
    ForwardTrainingEx,
    ForwardInference,
    Backward,
    BackwardEx,
}

impl BnKind {
    fn backward(self) -> bool {
        matches!(self, BnKind::Backward | BnKind::BackwardEx)
    }

    fn extended(self) -> bool {
        matches!(self, BnKind::ForwardTrainingEx | BnKind::BackwardEx)
    }
}

/// Where the CPU implementation reads and writes, on the handle's stream.
pub(super) struct CpuTensors<'s> {
    pub session: &'s Session,
    pub stream: StreamRef,
}

impl CpuTensors<'_> {
    /// The tensor at `addr` in canonical order, as f64.
    pub fn load(&self, addr: u64, shape: &TensorShape) -> Result<Vec<f64>, CudnnStatus> {
        // Integer data, and double data but cudnnSetTensor's, are refused before the work
        // (this is a backstop).
        if !cpu_type(shape.data_type) && shape.data_type != DATA_DOUBLE {
            return Err(CudnnStatus::NOT_SUPPORTED);
        }
        let size = element_bytes(shape.data_type)? as usize;
        let raw = device_io::read(self.session, self.stream, addr, span_bytes(shape) as usize)
            .map_err(super::cudnn::dnn_status)?;
        Ok(offsets(shape).into_iter().map(|o| decode(shape.data_type, &raw[o * size..(o + 1) * size])).collect())
    }

    /// Store `values` (canonical order) at `addr`, leaving the gaps between them as they were.
    pub fn store(&self, addr: u64, shape: &TensorShape, values: &[f64]) -> Result<(), CudnnStatus> {
        if !cpu_type(shape.data_type) && shape.data_type != DATA_DOUBLE {
            return Err(CudnnStatus::NOT_SUPPORTED);
        }
        let size = element_bytes(shape.data_type)? as usize;
        let mut raw = device_io::read(self.session, self.stream, addr, span_bytes(shape) as usize)
            .map_err(super::cudnn::dnn_status)?;
        for (o, v) in offsets(shape).into_iter().zip(values) {
            encode(shape.data_type, *v, &mut raw[o * size..(o + 1) * size]);
        }
        device_io::write(self.session, self.stream, addr, &raw).map_err(super::cudnn::dnn_status)
    }
    /// Store `alpha * result + beta * prior` at `addr` (the prior read only when beta is not 0).
    pub fn blend_store(
        &self,
        addr: u64,
        shape: &TensorShape,
        alpha: f64,
        result: &[f64],
        beta: f64,
    ) -> Result<(), CudnnStatus> {
        let prior = if beta == 0.0 { None } else { Some(self.load(addr, shape)?) };
        self.store(addr, shape, &cpu_dnn::blend(alpha, result, beta, prior.as_deref()))
    }
}

/// The shapes of one batch normalization call, checked.
struct BnShapes {
    data: TensorShape,
    params: TensorShape,
    groups: Groups,
}

impl Session {
    pub(super) fn dnn_tensor_of(&self, cx: &CallCx, handle: u64) -> Result<TensorDesc, CudnnStatus> {
        self.objects
            .dnn
            .tensor(handle)
            .map_err(|_| self.dnn_bad(cx, format_args!("{handle:#x} is not a tensor descriptor of the session")))
    }

    /// A tensor descriptor that has a shape.
    pub(super) fn dnn_shape_of(
        &self,
        cx: &CallCx,
        what: &str,
        handle: u64,
    ) -> Result<(TensorDesc, TensorShape), CudnnStatus> {
        let t = self.dnn_tensor_of(cx, handle)?;
        let Some(shape) = t.shape.clone() else {
            return Err(self.dnn_bad(cx, format_args!("{what} ({handle:#x}) was never given a shape")));
        };
        Ok((t, shape))
    }

    /// A refusal with the status cuDNN gives, logged (bounded).
    pub(super) fn dnn_refuse(&self, cx: &CallCx, status: CudnnStatus, why: std::fmt::Arguments<'_>) -> CudnnStatus {
        let name = cx.function.map_or("cuDNN", |f| f.name());
        let label = phos_protocol::cudnn::ERRORS.iter().find(|e| e.code == i64::from(status.0)).map_or("", |e| e.name);
        crate::guest_warn!(self.id, "{name}: {why}: {label}");
        status
    }

    pub(super) fn dnn_create_tensor(&self, cx: &CallCx) -> Result<u64, CudnnStatus> {
        let full = || {
            crate::guest_warn!(
                self.id,
                "cudnnCreateTensorDescriptor: the session holds {} tensor descriptors already",
                crate::registry::dnn::MAX_DNN_TENSORS
            );
            phos_protocol::CudaError::MemoryAllocation
        };
        let raw = match self.vendor_cudnn() {
            Some(cudnn) => {
                self.backend.bind(cx.device).map_err(super::cudnn::dnn_status)?;
                cudnn.create_tensor().map_err(CudnnStatus)?
            }
            None => 0,
        };
        let new = crate::registry::handles::NewHandle { forced: cx.forced(), full: &full };
        self.objects.dnn.create_tensor(TensorDesc { raw, shape: None }, &new).map_err(|e| {
            if let Some(cudnn) = self.vendor_cudnn().filter(|_| raw != 0) {
                cudnn.destroy_tensor(raw);
            }
            super::cudnn::dnn_status(e)
        })
    }

    pub(super) fn dnn_destroy_tensor(&self, cx: &CallCx, handle: u64) -> Result<(), CudnnStatus> {
        let t = self
            .objects
            .dnn
            .destroy_tensor(handle)
            .map_err(|_| self.dnn_bad(cx, format_args!("{handle:#x} is not a tensor descriptor of the session")))?;
        if let Some(cudnn) = self.vendor_cudnn().filter(|_| t.raw != 0) {
            self.backend.bind(cx.device).map_err(super::cudnn::dnn_status)?;
            super::cudnn::vendor_status(cudnn.destroy_tensor(t.raw))?;
        }
        Ok(())
    }

    /// Make the tensor descriptor `handle` again (the guest's pool,
    /// `phosCudnnTensorDescriptorReinit`): a fresh one with no shape (and a fresh cuDNN
    /// descriptor) replaces it under the same handle, recorded as made by
    /// `cudnnCreateTensorDescriptor`, the earlier one's records dropped. The call was sent
    /// without waiting: a failure (a handle that is not a tensor descriptor of the session,
    /// cuDNN's) is logged and kept for the next synchronous cuDNN call.
    pub(super) fn dnn_reinit_tensor(&self, cx: &CallCx, handle: u64) {
        let made = (|| -> Result<(), CudnnStatus> {
            let raw = match self.vendor_cudnn() {
                Some(cudnn) => {
                    self.backend.bind(cx.device).map_err(super::cudnn::dnn_status)?;
                    cudnn.create_tensor().map_err(CudnnStatus)?
                }
                None => 0,
            };
            let old = self.objects.dnn.reinit_tensor(handle, TensorDesc { raw, shape: None }).map_err(|_| {
                if let Some(cudnn) = self.vendor_cudnn().filter(|_| raw != 0) {
                    cudnn.destroy_tensor(raw);
                }
                self.dnn_bad(cx, format_args!("{handle:#x} is not a tensor descriptor of the session"))
            })?;
            if let Some(cudnn) = self.vendor_cudnn().filter(|_| old.raw != 0) {
                cudnn.destroy_tensor(old.raw);
            }
            let object = [("cudnn_tensor_descriptor", handle)];
            let facts =
                RecordFacts { created: &object, destroyed: &object, mutated: &[], depends_on: &[], global: false };
            let payload = phos_protocol::encode(&CudnnCreateTensorDescriptorRequest {});
            self.records.record(Function::Cudnn(FunctionId::CudnnCreateTensorDescriptor), cx.device, &payload, &facts);
            Ok(())
        })();
        if let Err(status) = made {
            self.dnn_defer_any("phosCudnnTensorDescriptorReinit", status);
        }
    }

    /// A tensor descriptor goes into the guest's pool (`phosCudnnTensorDescriptorPark`):
    /// refused from now on until the guest makes it again; one that is not a live tensor
    /// descriptor of the session is refused, logged, the failure kept.
    pub(super) fn dnn_park_tensor(&self, cx: &CallCx, handle: u64) {
        if self.objects.dnn.park_tensor(handle).is_err() {
            let status = self.dnn_bad(cx, format_args!("{handle:#x} is not a live tensor descriptor of the session"));
            self.dnn_defer_any("phosCudnnTensorDescriptorPark", status);
        }
    }

    /// A Phos-internal call sent without waiting failed: logged, and kept for the next
    /// synchronous cuDNN call of the session, whatever it names.
    pub(super) fn dnn_defer_any(&self, name: &'static str, status: CudnnStatus) {
        let failed = crate::deferred::Failed { status: status.0, function: name };
        self.deferred.failed(phos_protocol::apis::Api::Cudnn.id(), crate::deferred::ANY, failed);
        tracing::error!(
            session = self.id,
            "{name} (sent asynchronously) failed with {}: the next synchronous cuDNN call returns it",
            status.name()
        );
    }

    /// Give a tensor descriptor a shape: checked, set on cuDNN's descriptor, kept, recorded.
    pub(super) fn dnn_set_tensor(
        &self,
        cx: &CallCx,
        handle: u64,
        data_type: i32,
        dims: &[i32],
        strides: &[i32],
    ) -> Result<(), CudnnStatus> {
        let t = self.dnn_tensor_of(cx, handle)?;
        let shape = checked_shape(data_type, dims, strides)
            .map_err(|(status, why)| self.dnn_refuse(cx, status, format_args!("{why}")))?;
        if let Some(cudnn) = self.vendor_cudnn().filter(|_| t.raw != 0) {
            self.backend.bind(cx.device).map_err(super::cudnn::dnn_status)?;
            super::cudnn::vendor_status(cudnn.set_tensor_nd(t.raw, data_type, &shape.dims, &shape.strides))?;
        }
        let (dim_bytes, stride_bytes) = (int_bytes(&shape.dims), int_bytes(&shape.strides));
        let state = CudnnSetTensorNdDescriptorRequest {
            tensorDesc: handle,
            dataType: data_type,
            nbDims: shape.dims.len() as i32,
            dimA: &dim_bytes,
            strideA: &stride_bytes,
        };
        let payload = phos_protocol::encode(&state);
        self.objects.dnn.set_tensor_shape(handle, shape).map_err(super::cudnn::dnn_status)?;
        let mutated = [("cudnn_tensor_descriptor", handle)];
        let facts = RecordFacts { created: &[], destroyed: &[], mutated: &mutated, depends_on: &[], global: false };
        let setter = Function::Cudnn(FunctionId::CudnnSetTensorNdDescriptor);
        self.records.record_keyed(setter, 0, cx.device, &payload, &facts);
        Ok(())
    }

    pub(super) fn dnn_set_tensor_format(
        &self,
        cx: &CallCx,
        handle: u64,
        format: i32,
        data_type: i32,
        dims: &[i32],
    ) -> Result<(), CudnnStatus> {
        let strides = format_strides(format, dims)
            .map_err(|status| self.dnn_refuse(cx, status, format_args!("tensor format {format}")))?;
        self.dnn_set_tensor(cx, handle, data_type, dims, &strides)
    }

    pub(super) fn dnn_get_tensor(&self, cx: &CallCx, handle: u64) -> Result<TensorShape, CudnnStatus> {
        Ok(self.dnn_shape_of(cx, "the descriptor", handle)?.1)
    }

    pub(super) fn dnn_tensor_size(&self, cx: &CallCx, handle: u64) -> Result<u64, CudnnStatus> {
        Ok(span_bytes(&self.dnn_shape_of(cx, "the descriptor", handle)?.1))
    }

    /// cudnnDeriveBNTensorDescriptor: the shape of the scale, bias and statistics of `x`.
    pub(super) fn dnn_derive_bn(&self, cx: &CallCx, derived: u64, x: u64, mode: i32) -> Result<(), CudnnStatus> {
        let (_, shape) = self.dnn_shape_of(cx, "xDesc", x)?;
        let params = self.dnn_bn_param_shape(cx, &shape, mode)?;
        self.dnn_set_tensor(cx, derived, params.data_type, &params.dims, &params.strides)
    }

    /// The packed shape cuDNN wants for the parameters of data of `shape` in `mode`: 1xCx1x1
    /// (spatial) or 1xCxHxW (per activation), float for float, half and bfloat16 data.
    fn dnn_bn_param_shape(&self, cx: &CallCx, shape: &TensorShape, mode: i32) -> Result<TensorShape, CudnnStatus> {
        phos_protocol::dnn::bn_param_shape(shape, mode)
            .map_err(|(status, why)| self.dnn_refuse(cx, status, format_args!("{why}")))
    }

    /// The sizes cuDNN asks for (0 on emu, whose CPU implementation needs no memory of its
    /// own): the forward workspace, the backward workspace or the reserve.
    pub(super) fn dnn_bn_size(&self, cx: &CallCx, which: BnSize, call: BnCall) -> Result<u64, CudnnStatus> {
        let h = self.dnn_handle(cx, call.handle)?;
        if call.ops != BN_OPS_BN {
            return Err(self.dnn_bn_ops(cx, call.ops));
        }
        let (_, x) = self.dnn_shape_of(cx, "xDesc", call.x_desc)?;
        self.dnn_bn_param_shape(cx, &x, call.mode)?;
        let Some(cudnn) = self.vendor_cudnn() else { return Ok(0) };
        let raw = self.dnn_raw_call(cx, &h, &call)?;
        self.backend.bind(h.device).map_err(super::cudnn::dnn_status)?;
        match which {
            BnSize::ForwardWorkspace => cudnn.forward_training_workspace(&raw),
            BnSize::BackwardWorkspace => cudnn.backward_workspace(&raw),
            BnSize::Reserve => cudnn.training_reserve(&raw),
        }
        .map_err(CudnnStatus)
    }

    fn dnn_bn_ops(&self, cx: &CallCx, ops: i32) -> CudnnStatus {
        if (BN_OPS_BN..=BN_OPS_BN_ADD_ACTIVATION).contains(&ops) {
            self.dnn_refuse(
                cx,
                CudnnStatus::NOT_SUPPORTED,
                format_args!("bnOps {ops} (the fused add and activation are not carried)"),
            )
        } else {
            self.dnn_bad(cx, format_args!("bnOps {ops}"))
        }
    }

    /// The call with cuDNN's handle and descriptors in place of the session's (0 stays 0).
    fn dnn_raw_call(&self, cx: &CallCx, h: &DnnHandle, call: &BnCall) -> Result<BnCall, CudnnStatus> {
        let raw_of =
            |d: u64| -> Result<u64, CudnnStatus> { if d == 0 { Ok(0) } else { Ok(self.dnn_tensor_of(cx, d)?.raw) } };
        Ok(BnCall {
            handle: h.raw,
            x_desc: raw_of(call.x_desc)?,
            z_desc: raw_of(call.z_desc)?,
            y_desc: raw_of(call.y_desc)?,
            dy_desc: raw_of(call.dy_desc)?,
            dz_desc: raw_of(call.dz_desc)?,
            dx_desc: raw_of(call.dx_desc)?,
            bn_desc: raw_of(call.bn_desc)?,
            ..*call
        })
    }

    /// The data and parameter shapes of a call, checked as cuDNN checks them.
    fn dnn_bn_shapes(&self, cx: &CallCx, kind: BnKind, call: &BnCall) -> Result<BnShapes, CudnnStatus> {
        let (_, data) = self.dnn_shape_of(cx, "xDesc", call.x_desc)?;
        let expected = self.dnn_bn_param_shape(cx, &data, call.mode)?;
        if data.data_type == DATA_DOUBLE {
            return Err(self.dnn_refuse(
                cx,
                CudnnStatus::NOT_SUPPORTED,
                format_args!("double data (Phos carries the scaling factors as floats)"),
            ));
        }
        let outputs: &[(&str, u64)] = if kind.backward() {
            &[("dyDesc", call.dy_desc), ("dxDesc", call.dx_desc)]
        } else {
            &[("yDesc", call.y_desc)]
        };
        for &(what, d) in outputs {
            let (_, s) = self.dnn_shape_of(cx, what, d)?;
            if s.dims != data.dims || s.data_type != data.data_type {
                return Err(self.dnn_bad(
                    cx,
                    format_args!(
                        "{what} is {:?} of type {}, where xDesc is {:?} of type {}",
                        s.dims, s.data_type, data.dims, data.data_type
                    ),
                ));
            }
        }
        let (_, params) = self.dnn_shape_of(cx, "the scale/bias descriptor", call.bn_desc)?;
        if params.dims != expected.dims || params.data_type != expected.data_type {
            return Err(self.dnn_bad(
                cx,
                format_args!(
                    "the scale/bias descriptor is {:?} of type {}, where mode {} wants {:?} of type {}",
                    params.dims, params.data_type, call.mode, expected.dims, expected.data_type
                ),
            ));
        }
        let dims: Vec<usize> = data.dims.iter().map(|&d| d as usize).collect();
        let groups = Groups {
            n: dims[0],
            c: dims[1],
            spatial: dims[2..].iter().product(),
            per_activation: call.mode == BN_PER_ACTIVATION,
        };
        Ok(BnShapes { data, params, groups })
    }

    /// Every range the call touches, each checked against the session's memory.
    fn dnn_bn_ranges(
        &self,
        cx: &CallCx,
        kind: BnKind,
        call: &BnCall,
        shapes: &BnShapes,
        needed: (u64, u64),
    ) -> Result<Vec<DeviceAccess>, CudnnStatus> {
        let (data, params) = (span_bytes(&shapes.data), span_bytes(&shapes.params));
        let pair = |a: u64, b: u64, what: &str| -> Result<(), CudnnStatus> {
            if (a == 0) != (b == 0) {
                return Err(self.dnn_bad(cx, format_args!("{what}: one is NULL and the other is not")));
            }
            Ok(())
        };
        // (what, address, bytes, written, may be NULL)
        let mut ranges: Vec<(&str, u64, u64, bool, bool)> = vec![("x", call.x, data, false, false)];
        if kind.backward() {
            pair(call.saved_mean, call.saved_inv_var, "savedMean and savedInvVariance")?;
            ranges.extend([
                ("dy", call.dy, data, false, false),
                ("dx", call.dx, data, true, false),
                ("bnScale", call.scale, params, false, false),
                ("dBnScaleResult", call.dscale, params, true, false),
                ("dBnBiasResult", call.dbias, params, true, false),
                ("savedMean", call.saved_mean, params, false, true),
                ("savedInvVariance", call.saved_inv_var, params, false, true),
            ]);
        } else {
            ranges.extend([
                ("y", call.y, data, true, false),
                ("bnScale", call.scale, params, false, false),
                ("bnBias", call.bias, params, false, false),
            ]);
            if kind == BnKind::ForwardInference {
                ranges.extend([
                    ("estimatedMean", call.running_mean, params, false, false),
                    ("estimatedVariance", call.running_var, params, false, false),
                ]);
            } else {
                pair(call.running_mean, call.running_var, "resultRunningMean and resultRunningVariance")?;
                pair(call.saved_mean, call.saved_inv_var, "resultSaveMean and resultSaveInvVariance")?;
                ranges.extend([
                    ("resultRunningMean", call.running_mean, params, true, true),
                    ("resultRunningVariance", call.running_var, params, true, true),
                    ("resultSaveMean", call.saved_mean, params, true, true),
                    ("resultSaveInvVariance", call.saved_inv_var, params, true, true),
                ]);
            }
        }
        if kind.extended() {
            for (what, given, need) in
                [("workspace", call.workspace_size, needed.0), ("reserve space", call.reserve_size, needed.1)]
            {
                if given < need {
                    return Err(self.dnn_bad(cx, format_args!("{what} of {given} bytes, where cuDNN needs {need}")));
                }
            }
            ranges.push(("workspace", call.workspace, call.workspace_size, true, call.workspace_size == 0));
            ranges.push(("reserveSpace", call.reserve, call.reserve_size, true, call.reserve_size == 0));
        }
        let ranges: Vec<Range<'_>> = ranges
            .into_iter()
            .map(|(what, addr, len, writes, optional)| Range { what, addr, len, writes, optional })
            .collect();
        self.dnn_ranges(cx, &ranges)
    }

    /// Run one batch normalization call: checked, shown to the checkpoint engine, then run
    /// by cuDNN or the CPU.
    pub(super) fn dnn_batch_norm(&self, cx: &CallCx, kind: BnKind, call: BnCall) -> Result<(), CudnnStatus> {
        let h = self.dnn_handle(cx, call.handle)?;
        if kind.extended() && call.ops != BN_OPS_BN {
            return Err(self.dnn_bn_ops(cx, call.ops));
        }
        // NaN is refused too.
        if call.epsilon.is_nan() || call.epsilon < 0.0 {
            return Err(self.dnn_bad(cx, format_args!("epsilon {} (below CUDNN_BN_MIN_EPSILON, 0)", call.epsilon)));
        }
        let shapes = self.dnn_bn_shapes(cx, kind, &call)?;
        let vendor = self.vendor_cudnn();
        let raw = match vendor {
            Some(_) => Some(self.dnn_raw_call(cx, &h, &call)?),
            None => None,
        };
        // What cuDNN needs of the workspace and reserve (the CPU needs none).
        let needed = match (vendor, &raw) {
            (Some(cudnn), Some(raw)) if kind.extended() => {
                self.backend.bind(h.device).map_err(super::cudnn::dnn_status)?;
                let workspace = if kind == BnKind::BackwardEx {
                    cudnn.backward_workspace(raw)
                } else {
                    cudnn.forward_training_workspace(raw)
                };
                (workspace.map_err(CudnnStatus)?, cudnn.training_reserve(raw).map_err(CudnnStatus)?)
            }
            _ => (0, 0),
        };
        let access = self.dnn_bn_ranges(cx, kind, &call, &shapes, needed)?;
        // Checked: now run, or taken into a capture.
        self.dnn_work(cx, &h)?;
        let name = cx.function.map_or("cuDNN", |f| f.name());
        self.before_work(name, &access).map_err(super::cudnn::dnn_status)?;
        if let (Some(cudnn), Some(raw)) = (vendor, raw) {
            self.backend.bind(h.device).map_err(super::cudnn::dnn_status)?;
            let code = match kind {
                BnKind::ForwardTraining => cudnn.forward_training(&raw),
                BnKind::ForwardTrainingEx => cudnn.forward_training_ex(&raw),
                BnKind::ForwardInference => cudnn.forward_inference(&raw),
                BnKind::Backward => cudnn.backward(&raw),
                BnKind::BackwardEx => cudnn.backward_ex(&raw),
            };
            return super::cudnn::vendor_status(code);
        }
        // The CPU works on every element: tensors whose strides overlap (more elements than
        // they span, so more than the checked memory holds) are not taken.
        for shape in [&shapes.data, &shapes.params] {
            if elements(shape) > span(shape) {
                return Err(self.dnn_refuse(
                    cx,
                    CudnnStatus::NOT_SUPPORTED,
                    format_args!("overlapping strides {:?} (on the CPU implementation)", shape.strides),
                ));
            }
        }
        let stream = self.objects.streams.resolve(h.stream).map_err(super::cudnn::dnn_status)?;
        self.dnn_batch_norm_on_cpu(&CpuTensors { session: self, stream }, kind, &call, &shapes)
    }

    fn dnn_batch_norm_on_cpu(
        &self,
        t: &CpuTensors<'_>,
        kind: BnKind,
        c: &BnCall,
        s: &BnShapes,
    ) -> Result<(), CudnnStatus> {
        let g = &s.groups;
        let x = t.load(c.x, &s.data)?;
        let scale = t.load(c.scale, &s.params)?;
        let [alpha, beta] = c.data_scaling.map(f64::from);
        match kind {
            BnKind::ForwardTraining | BnKind::ForwardTrainingEx | BnKind::ForwardInference => {
                let bias = t.load(c.bias, &s.params)?;
                let (mean, inv) = if kind == BnKind::ForwardInference {
                    let variance = t.load(c.running_var, &s.params)?;
                    (t.load(c.running_mean, &s.params)?, cpu_dnn::inverse_std(&variance, c.epsilon))
                } else {
                    let stats = cpu_dnn::stats(g, &x);
                    if c.running_mean != 0 {
                        let mut mean = t.load(c.running_mean, &s.params)?;
                        let mut variance = t.load(c.running_var, &s.params)?;
                        cpu_dnn::update_running(g, &stats, c.factor, &mut mean, &mut variance);
                        t.store(c.running_mean, &s.params, &mean)?;
                        t.store(c.running_var, &s.params, &variance)?;
                    }
                    let inv = cpu_dnn::inverse_std(&stats.variance, c.epsilon);
                    if c.saved_mean != 0 {
                        t.store(c.saved_mean, &s.params, &stats.mean)?;
                        t.store(c.saved_inv_var, &s.params, &inv)?;
                    }
                    (stats.mean, inv)
                };
                let y = cpu_dnn::normalize(g, &x, &mean, &inv, &scale, &bias);
                t.blend_store(c.y, &s.data, alpha, &y, beta)
            }
            BnKind::Backward | BnKind::BackwardEx => {
                let dy = t.load(c.dy, &s.data)?;
                let (mean, inv) = if c.saved_mean != 0 {
                    (t.load(c.saved_mean, &s.params)?, t.load(c.saved_inv_var, &s.params)?)
                } else {
                    let stats = cpu_dnn::stats(g, &x);
                    let inv = cpu_dnn::inverse_std(&stats.variance, c.epsilon);
                    (stats.mean, inv)
                };
                let grads = cpu_dnn::backward(g, &x, &dy, &scale, &mean, &inv);
                t.blend_store(c.dx, &s.data, alpha, &grads.dx, beta)?;
                let [alpha_p, beta_p] = c.param_scaling.map(f64::from);
                for (addr, values) in [(c.dscale, &grads.dscale), (c.dbias, &grads.dbias)] {
                    t.blend_store(addr, &s.params, alpha_p, values, beta_p)?;
                }
                Ok(())
            }
        }
    }
}

/// The scaling factors of a call (host floats).
pub(super) fn scaling_pair(alpha: &[u8], beta: &[u8]) -> [f32; 2] {
    [scaling(alpha), scaling(beta)]
}

pub(super) fn int_array_out(values: &[i32], room: usize) -> Vec<u8> {
    let mut out = int_bytes(&values[..values.len().min(room)]);
    out.resize(room * 4, 0);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_strided_shape_spans_its_gaps() {
        let s = TensorShape { data_type: DATA_HALF, dims: vec![2, 1, 1, 3], strides: vec![8, 3, 3, 1] };
        assert_eq!(span(&s), 11);
        assert_eq!(span_bytes(&s), 22);
        assert_eq!(offsets(&s), vec![0, 1, 2, 8, 9, 10]);
    }
}
