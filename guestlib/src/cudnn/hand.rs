//! The pieces of cuDNN the spec marks `implemented_by(guest)` and its utility: the versions
//! (those of the libcudnn the server runs, asked once), the error strings and the thread's
//! last error.

use std::ffi::{CString, c_char, c_void};
use std::sync::OnceLock;

use phos_protocol::cudnn::{self, CudnnStatus, FunctionId as F, PhosCudnnGetVersionsRequest};
use phos_protocol::dnn;

use super::known;
use super::packs;
use super::rt;
use super::stubs::HandWritten;
use super::tensors;

/// cuDNN's version where the server cannot be asked (no router): the cuDNN of the headers the
/// spec was written from (9.28.0), as cudnnGetVersion encodes it (major * 10000 + minor * 100
/// + patch).
const FALLBACK_VERSION: usize = 92800;
/// The CUDA runtime that cuDNN was built against, likewise (12.9).
const FALLBACK_CUDART: usize = 12090;
/// The newest compute capability that cuDNN knows, likewise (as 100 * major + 10 * minor).
const FALLBACK_MAX_DEVICE: usize = 1210;

/// The server's cuDNN (version, newest device, CUDA runtime), asked once.
fn versions() -> (usize, usize, usize) {
    static VERSIONS: OnceLock<(usize, usize, usize)> = OnceLock::new();
    *VERSIONS.get_or_init(|| match rt::call(&PhosCudnnGetVersionsRequest {}) {
        Ok(v) => (v.version as usize, v.max_device_version as usize, v.cudart_version as usize),
        Err(e) => {
            tracing::warn!("cuDNN's version could not be asked of the server ({}): answering 9.28.0", e.name());
            (FALLBACK_VERSION, FALLBACK_MAX_DEVICE, FALLBACK_CUDART)
        }
    })
}

/// The status names, NUL-terminated, built once (cudnnGetErrorString hands out pointers that
/// stay valid for the life of the process).
fn status_names() -> &'static Vec<(i32, CString)> {
    static NAMES: OnceLock<Vec<(i32, CString)>> = OnceLock::new();
    NAMES.get_or_init(|| {
        cudnn::ERRORS.iter().filter_map(|e| Some((i32::try_from(e.code).ok()?, CString::new(e.name).ok()?))).collect()
    })
}

/// The ints of a setter's arrays, `nb_dims` each: `None` where the generated path refuses the
/// call (a count cuDNN refuses, a null array) or answers it (so the server's status is the
/// call's).
///
/// # Safety
/// Each array must hold `nb_dims` ints, or be null.
unsafe fn int_arrays<const N: usize>(nb_dims: i32, arrays: [*const i32; N]) -> Option<[Vec<i32>; N]> {
    let n = usize::try_from(nb_dims).ok().filter(|&n| n <= phos_protocol::dnn::DIM_MAX)?;
    if arrays.iter().any(|a| a.is_null()) {
        return None;
    }
    Some(arrays.map(|a| {
        // SAFETY: `a` holds `n` ints (this function's contract), checked for null; read as
        // bytes, since the program's ints need not be aligned.
        let ints = unsafe { std::slice::from_raw_parts(a.cast::<[u8; 4]>(), n) };
        ints.iter().map(|b| i32::from_ne_bytes(*b)).collect()
    }))
}

fn int_bytes(values: &[i32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// The implementation of [`HandWritten`].
pub struct Hand;

impl HandWritten for Hand {
    unsafe fn cudnnGetVersion() -> usize {
        versions().0
    }

    unsafe fn cudnnGetMaxDeviceVersion() -> usize {
        versions().1
    }

    unsafe fn cudnnGetCudartVersion() -> usize {
        versions().2
    }

    unsafe fn cudnnGetProperty(property: i32, value: *mut i32) -> i32 {
        rt::api_call(F::CudnnGetProperty, || {
            let v = versions().0;
            // libraryPropertyType: MAJOR_VERSION, MINOR_VERSION, PATCH_LEVEL.
            let answer = match property {
                0 => v / 10000,
                1 => (v / 100) % 100,
                2 => v % 100,
                _ => return Err(CudnnStatus::BAD_PARAM),
            };
            if value.is_null() {
                return Err(CudnnStatus::BAD_PARAM);
            }
            // SAFETY: the caller's out parameter, checked for null.
            unsafe { value.write(answer as i32) };
            Ok(())
        })
    }

    unsafe fn cudnnGetErrorString(status: i32) -> *const c_char {
        static UNKNOWN: &std::ffi::CStr = c"CUDNN_UNKNOWN_STATUS";
        status_names().iter().find(|(code, _)| *code == status).map_or(UNKNOWN.as_ptr(), |(_, name)| name.as_ptr())
    }

    unsafe fn cudnnGetLastErrorString(message: *mut c_char, max_size: usize) {
        if message.is_null() || max_size == 0 {
            return;
        }
        let text = rt::take_last_error();
        let n = text.len().min(max_size - 1);
        let mut bytes: Vec<c_char> = text.bytes().take(n).map(|b| b as c_char).collect();
        bytes.push(0);
        // SAFETY: the caller gives `max_size` writable bytes at `message` (cuDNN's contract);
        // `n + 1 <= max_size` are written.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), message, bytes.len()) };
    }

    fn requested_elements(array: i128, requested: i128) -> Result<i128, CudnnStatus> {
        Ok(if array == 0 { 0 } else { requested })
    }

    fn tensor_value_bytes(desc: i128) -> Result<i128, CudnnStatus> {
        let desc = u64::try_from(desc).map_err(|_| CudnnStatus::BAD_PARAM)?;
        Ok(i128::from(known::value_bytes(desc)))
    }

    unsafe fn forget_handle(handle: *mut c_void) -> Option<Result<(), CudnnStatus>> {
        // Before the call: no call of another thread goes without waiting on it from now on.
        known::forget_handle(handle as u64);
        None
    }

    unsafe fn set_stream(handle: *mut c_void, stream: *mut c_void) -> Option<Result<(), CudnnStatus>> {
        let (h, stream) = (handle as u64, stream as u64);
        if known::stream_is(h, stream) {
            // Setting the stream the handle has changes nothing.
            return Some(Ok(()));
        }
        // Without waiting once the handle is live (a bad stream then fails the next synchronous
        // call on the handle).
        let r = crate::runtime::call_deferred(&cudnn::CudnnSetStreamRequest { handle: h, streamId: stream }, h);
        if r.is_ok() {
            known::note_stream(h, stream);
        }
        Some(r)
    }

    unsafe fn forget_backend_descriptor(descriptor: *mut c_void) -> Option<Result<(), CudnnStatus>> {
        known::forget(descriptor as u64);
        // A known variant pack goes to the pool (or is destroyed) without waiting.
        packs::destroy(descriptor as u64)
    }

    unsafe fn backend_create(descriptor_type: i32, descriptor: *mut *mut c_void) -> Option<Result<(), CudnnStatus>> {
        packs::create(descriptor_type, descriptor)
    }

    fn apply_backend_create() {
        packs::apply_create();
    }

    unsafe fn forget_tensor_descriptor(tensor_desc: *mut c_void) -> Option<Result<(), CudnnStatus>> {
        known::forget(tensor_desc as u64);
        // A known one goes to the pool (or is destroyed) without waiting.
        tensors::destroy(tensor_desc as u64)
    }

    unsafe fn tensor_create(tensor_desc: *mut *mut c_void) -> Option<Result<(), CudnnStatus>> {
        tensors::create(tensor_desc)
    }

    #[allow(clippy::too_many_arguments)]
    unsafe fn tensor_get_4d(
        desc: *mut c_void,
        data_type: *mut i32,
        n: *mut i32,
        c: *mut i32,
        h: *mut i32,
        w: *mut i32,
        n_stride: *mut i32,
        c_stride: *mut i32,
        h_stride: *mut i32,
        w_stride: *mut i32,
    ) -> Option<Result<(), CudnnStatus>> {
        let outs = [data_type, n, c, h, w, n_stride, c_stride, h_stride, w_stride];
        if outs.iter().any(|p| p.is_null()) {
            // The generated path refuses it.
            return None;
        }
        // As the server answers: a descriptor with no shape, or not of 4 dimensions, is
        // BAD_PARAM.
        const NAME: &str = "cudnnGetTensor4dDescriptor";
        let shape = match tensors::shape_or_refuse(NAME, "the descriptor", desc as u64)? {
            Ok(s) => s,
            Err(status) => return Some(Err(status)),
        };
        if shape.dims.len() != 4 {
            let why = format!("{} dimensions, not 4", shape.dims.len());
            return Some(Err(tensors::refuse(NAME, desc as u64, CudnnStatus::BAD_PARAM, &why)));
        }
        let values =
            [shape.data_type].into_iter().chain(shape.dims.iter().copied()).chain(shape.strides.iter().copied());
        for (out, v) in outs.into_iter().zip(values) {
            // SAFETY: the caller's out parameters (cuDNN's contract), checked for null.
            unsafe { out.write_unaligned(v) };
        }
        Some(Ok(()))
    }

    unsafe fn tensor_get_nd(
        desc: *mut c_void,
        nb_dims_requested: i32,
        data_type: *mut i32,
        nb_dims: *mut i32,
        dim_a: *mut i32,
        stride_a: *mut i32,
    ) -> Option<Result<(), CudnnStatus>> {
        let room = usize::try_from(nb_dims_requested).ok().filter(|&r| r <= phos_protocol::dnn::DIM_MAX)?;
        if data_type.is_null() || nb_dims.is_null() {
            // The generated path refuses it.
            return None;
        }
        let shape = match tensors::shape_or_refuse("cudnnGetTensorNdDescriptor", "the descriptor", desc as u64)? {
            Ok(s) => s,
            Err(status) => return Some(Err(status)),
        };
        // SAFETY: the caller's out parameters (cuDNN's contract), checked for null; `dim_a`
        // and `stride_a` hold `nb_dims_requested` ints or are null (written as the server's
        // reply is: `room` ints, zero beyond the descriptor's dimensions).
        unsafe { data_type.write_unaligned(shape.data_type) };
        // SAFETY: as above.
        unsafe { nb_dims.write_unaligned(shape.dims.len() as i32) };
        // SAFETY: as above.
        unsafe { tensors::write_ints(dim_a, &shape.dims, room) };
        // SAFETY: as above.
        unsafe { tensors::write_ints(stride_a, &shape.strides, room) };
        Some(Ok(()))
    }

    unsafe fn tensor_get_size(desc: *mut c_void, size: *mut usize) -> Option<Result<(), CudnnStatus>> {
        if size.is_null() {
            return None;
        }
        let shape = match tensors::shape_or_refuse("cudnnGetTensorSizeInBytes", "the descriptor", desc as u64)? {
            Ok(s) => s,
            Err(status) => return Some(Err(status)),
        };
        // SAFETY: the caller's out parameter, checked for null.
        unsafe { size.write_unaligned(phos_protocol::dnn::span_bytes(&shape) as usize) };
        Some(Ok(()))
    }

    unsafe fn forget_filter_descriptor(filter_desc: *mut c_void) -> Option<Result<(), CudnnStatus>> {
        known::forget(filter_desc as u64);
        None
    }

    unsafe fn forget_convolution_descriptor(conv_desc: *mut c_void) -> Option<Result<(), CudnnStatus>> {
        known::forget(conv_desc as u64);
        None
    }

    unsafe fn forget_activation_descriptor(activation_desc: *mut c_void) -> Option<Result<(), CudnnStatus>> {
        known::forget(activation_desc as u64);
        None
    }

    unsafe fn forget_op_tensor_descriptor(op_tensor_desc: *mut c_void) -> Option<Result<(), CudnnStatus>> {
        known::forget(op_tensor_desc as u64);
        None
    }

    unsafe fn forget_pooling_descriptor(pooling_desc: *mut c_void) -> Option<Result<(), CudnnStatus>> {
        known::forget(pooling_desc as u64);
        None
    }

    unsafe fn forget_lrn_descriptor(lrn_desc: *mut c_void) -> Option<Result<(), CudnnStatus>> {
        known::forget(lrn_desc as u64);
        None
    }

    unsafe fn forget_reduce_descriptor(reduce_tensor_desc: *mut c_void) -> Option<Result<(), CudnnStatus>> {
        known::forget(reduce_tensor_desc as u64);
        None
    }

    unsafe fn note_tensor_4d(
        desc: *mut c_void,
        format: i32,
        data_type: i32,
        n: i32,
        c: i32,
        h: i32,
        w: i32,
    ) -> Option<Result<(), CudnnStatus>> {
        const NAME: &str = "cudnnSetTensor4dDescriptor";
        let d = desc as u64;
        let shape = dnn::checked_format_shape(format, data_type, &[n, c, h, w]);
        let send = || {
            let req =
                cudnn::CudnnSetTensor4dDescriptorRequest { tensorDesc: d, format, dataType: data_type, n, c, h, w };
            crate::runtime::call_async(&req)
        };
        if let Some(r) = tensors::set(NAME, d, shape, send) {
            return Some(r);
        }
        known::note_tensor_type(d, data_type);
        None
    }

    unsafe fn note_tensor_4d_ex(
        desc: *mut c_void,
        data_type: i32,
        n: i32,
        c: i32,
        h: i32,
        w: i32,
        n_stride: i32,
        c_stride: i32,
        h_stride: i32,
        w_stride: i32,
    ) -> Option<Result<(), CudnnStatus>> {
        const NAME: &str = "cudnnSetTensor4dDescriptorEx";
        let d = desc as u64;
        let strides = [n_stride, c_stride, h_stride, w_stride];
        let shape = dnn::checked_shape(data_type, &[n, c, h, w], &strides);
        let send = || {
            let req = cudnn::CudnnSetTensor4dDescriptorExRequest {
                tensorDesc: d,
                dataType: data_type,
                n,
                c,
                h,
                w,
                nStride: n_stride,
                cStride: c_stride,
                hStride: h_stride,
                wStride: w_stride,
            };
            crate::runtime::call_async(&req)
        };
        if let Some(r) = tensors::set(NAME, d, shape, send) {
            return Some(r);
        }
        known::note_tensor_type(d, data_type);
        None
    }

    unsafe fn note_tensor_nd(
        desc: *mut c_void,
        data_type: i32,
        nb_dims: i32,
        dims: *const i32,
        strides: *const i32,
    ) -> Option<Result<(), CudnnStatus>> {
        const NAME: &str = "cudnnSetTensorNdDescriptor";
        let d = desc as u64;
        // SAFETY: `dims` and `strides` hold `nb_dims` ints (cuDNN's contract for the caller).
        if let Some([dims, strides]) = unsafe { int_arrays(nb_dims, [dims, strides]) } {
            let shape = dnn::checked_shape(data_type, &dims, &strides);
            let send = || {
                let (dim_bytes, stride_bytes) = (int_bytes(&dims), int_bytes(&strides));
                let req = cudnn::CudnnSetTensorNdDescriptorRequest {
                    tensorDesc: d,
                    dataType: data_type,
                    nbDims: nb_dims,
                    dimA: &dim_bytes,
                    strideA: &stride_bytes,
                };
                crate::runtime::call_async(&req)
            };
            if let Some(r) = tensors::set(NAME, d, shape, send) {
                return Some(r);
            }
        }
        known::note_tensor_type(d, data_type);
        None
    }

    unsafe fn note_tensor_nd_ex(
        desc: *mut c_void,
        format: i32,
        data_type: i32,
        nb_dims: i32,
        dims: *const i32,
    ) -> Option<Result<(), CudnnStatus>> {
        const NAME: &str = "cudnnSetTensorNdDescriptorEx";
        let d = desc as u64;
        // SAFETY: `dims` holds `nb_dims` ints (cuDNN's contract for the caller).
        if let Some([dims]) = unsafe { int_arrays(nb_dims, [dims]) } {
            let shape = dnn::checked_format_shape(format, data_type, &dims);
            let send = || {
                let dim_bytes = int_bytes(&dims);
                let req = cudnn::CudnnSetTensorNdDescriptorExRequest {
                    tensorDesc: d,
                    format,
                    dataType: data_type,
                    nbDims: nb_dims,
                    dimA: &dim_bytes,
                };
                crate::runtime::call_async(&req)
            };
            if let Some(r) = tensors::set(NAME, d, shape, send) {
                return Some(r);
            }
        }
        known::note_tensor_type(d, data_type);
        None
    }

    unsafe fn note_derived_bn(derived: *mut c_void, x_desc: *mut c_void, mode: i32) -> Option<Result<(), CudnnStatus>> {
        let (d, x) = (derived as u64, x_desc as u64);
        if let Some(shape) = tensors::derived(d, x, mode) {
            let send = || {
                let req = cudnn::CudnnDeriveBNTensorDescriptorRequest { derivedBnDesc: d, xDesc: x, mode };
                crate::runtime::call_async(&req)
            };
            return tensors::set("cudnnDeriveBNTensorDescriptor", d, shape, send);
        }
        known::note_derived(d, x);
        None
    }

    fn apply_tensor_note() {
        known::apply_tensor_note();
        tensors::apply_create();
    }

    unsafe fn note_finalize(desc: *mut c_void) -> Option<Result<(), CudnnStatus>> {
        known::note_finalize(desc as u64);
        let r = packs::finalize(desc as u64)?;
        if r.is_ok() {
            // Sent without waiting: finalized as far as the execution's proof goes.
            known::apply_finalize();
        }
        Some(r)
    }

    unsafe fn invalidate_backend_attribute(
        desc: *mut c_void,
        attribute_name: i32,
        attribute_type: i32,
        element_count: i64,
        array_of_elements: *const c_void,
    ) -> Option<Result<(), CudnnStatus>> {
        known::invalidate(desc as u64);
        // SAFETY: the export's own arguments: `array_of_elements` holds `element_count`
        // elements of `attribute_type` (cuDNN's contract for the caller), or is null.
        unsafe { packs::set(desc as u64, attribute_name, attribute_type, element_count, array_of_elements) }
    }

    unsafe fn invalidate_filter_4d(
        desc: *mut c_void,
        _data_type: i32,
        _format: i32,
        _k: i32,
        _c: i32,
        _h: i32,
        _w: i32,
    ) -> Option<Result<(), CudnnStatus>> {
        // Before the call: what the descriptor was proven in no longer goes without waiting.
        known::invalidate(desc as u64);
        None
    }

    unsafe fn invalidate_filter_nd(
        desc: *mut c_void,
        _data_type: i32,
        _format: i32,
        _nb_dims: i32,
        _filter_dim_a: *const i32,
    ) -> Option<Result<(), CudnnStatus>> {
        known::invalidate(desc as u64);
        None
    }

    unsafe fn invalidate_convolution_2d(
        desc: *mut c_void,
        _pad_h: i32,
        _pad_w: i32,
        _u: i32,
        _v: i32,
        _dilation_h: i32,
        _dilation_w: i32,
        _mode: i32,
        _compute_type: i32,
    ) -> Option<Result<(), CudnnStatus>> {
        known::invalidate(desc as u64);
        None
    }

    unsafe fn invalidate_convolution_nd(
        desc: *mut c_void,
        _array_length: i32,
        _pad_a: *const i32,
        _filter_stride_a: *const i32,
        _dilation_a: *const i32,
        _mode: i32,
        _compute_type: i32,
    ) -> Option<Result<(), CudnnStatus>> {
        known::invalidate(desc as u64);
        None
    }

    unsafe fn invalidate_convolution_math(desc: *mut c_void, _math_type: i32) -> Option<Result<(), CudnnStatus>> {
        known::invalidate(desc as u64);
        None
    }

    unsafe fn invalidate_convolution_groups(desc: *mut c_void, _group_count: i32) -> Option<Result<(), CudnnStatus>> {
        known::invalidate(desc as u64);
        None
    }

    unsafe fn invalidate_convolution_reorder(desc: *mut c_void, _reorder_type: i32) -> Option<Result<(), CudnnStatus>> {
        known::invalidate(desc as u64);
        None
    }

    unsafe fn invalidate_activation(
        desc: *mut c_void,
        _mode: i32,
        _relu_nan_opt: i32,
        _coef: f64,
    ) -> Option<Result<(), CudnnStatus>> {
        known::invalidate(desc as u64);
        None
    }

    unsafe fn invalidate_activation_swish(desc: *mut c_void, _swish_beta: f64) -> Option<Result<(), CudnnStatus>> {
        known::invalidate(desc as u64);
        None
    }

    unsafe fn invalidate_op_tensor(
        desc: *mut c_void,
        _op_tensor_op: i32,
        _op_tensor_comp_type: i32,
        _op_tensor_nan_opt: i32,
    ) -> Option<Result<(), CudnnStatus>> {
        known::invalidate(desc as u64);
        None
    }

    unsafe fn invalidate_pooling_2d(
        desc: *mut c_void,
        _mode: i32,
        _maxpooling_nan_opt: i32,
        _window_height: i32,
        _window_width: i32,
        _vertical_padding: i32,
        _horizontal_padding: i32,
        _vertical_stride: i32,
        _horizontal_stride: i32,
    ) -> Option<Result<(), CudnnStatus>> {
        known::invalidate(desc as u64);
        None
    }

    unsafe fn invalidate_pooling_nd(
        desc: *mut c_void,
        _mode: i32,
        _maxpooling_nan_opt: i32,
        _nb_dims: i32,
        _window_dim_a: *const i32,
        _padding_a: *const i32,
        _stride_a: *const i32,
    ) -> Option<Result<(), CudnnStatus>> {
        known::invalidate(desc as u64);
        None
    }

    unsafe fn invalidate_lrn(
        desc: *mut c_void,
        _lrn_n: u32,
        _lrn_alpha: f64,
        _lrn_beta: f64,
        _lrn_k: f64,
    ) -> Option<Result<(), CudnnStatus>> {
        known::invalidate(desc as u64);
        None
    }

    unsafe fn invalidate_reduce(
        desc: *mut c_void,
        _reduce_tensor_op: i32,
        _reduce_tensor_comp_type: i32,
        _reduce_tensor_nan_opt: i32,
        _reduce_tensor_indices: i32,
        _reduce_tensor_indices_type: i32,
    ) -> Option<Result<(), CudnnStatus>> {
        known::invalidate(desc as u64);
        None
    }

    #[allow(clippy::too_many_arguments)]
    unsafe fn bn_forward_workspace_known(
        handle: *mut c_void,
        mode: i32,
        bn_ops: i32,
        x_desc: *mut c_void,
        z_desc: *mut c_void,
        y_desc: *mut c_void,
        bn_desc: *mut c_void,
        activation_desc: *mut c_void,
        size: *mut usize,
    ) -> Option<Result<(), CudnnStatus>> {
        let tensors = [x_desc, z_desc, y_desc, bn_desc].map(|d| d as u64);
        tensors::sizes::ask(187, handle as u64, [mode, bn_ops], &tensors, activation_desc as u64, size)
    }

    #[allow(clippy::too_many_arguments)]
    unsafe fn bn_backward_workspace_known(
        handle: *mut c_void,
        mode: i32,
        bn_ops: i32,
        x_desc: *mut c_void,
        y_desc: *mut c_void,
        dy_desc: *mut c_void,
        dz_desc: *mut c_void,
        dx_desc: *mut c_void,
        dbn_desc: *mut c_void,
        activation_desc: *mut c_void,
        size: *mut usize,
    ) -> Option<Result<(), CudnnStatus>> {
        let tensors = [x_desc, y_desc, dy_desc, dz_desc, dx_desc, dbn_desc].map(|d| d as u64);
        tensors::sizes::ask(186, handle as u64, [mode, bn_ops], &tensors, activation_desc as u64, size)
    }

    unsafe fn bn_reserve_known(
        handle: *mut c_void,
        mode: i32,
        bn_ops: i32,
        activation_desc: *mut c_void,
        x_desc: *mut c_void,
        size: *mut usize,
    ) -> Option<Result<(), CudnnStatus>> {
        tensors::sizes::ask(188, handle as u64, [mode, bn_ops], &[x_desc as u64], activation_desc as u64, size)
    }

    fn keep_size() {
        tensors::sizes::keep();
    }

    fn apply_finalize() {
        known::apply_finalize();
        packs::apply_finalize();
    }
}
