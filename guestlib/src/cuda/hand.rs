//! The pieces of the driver API the spec marks `implemented_by(guest)`, its utility and its
//! hook.

use std::collections::HashMap;
use std::ffi::{CStr, CString, c_char, c_void};
use std::sync::OnceLock;

use phos_protocol::cuda::{self, CuError, FunctionId as F};
use phos_protocol::types::{Dim3, IpcHandle};

use super::bridge::{self, dptr};
use super::memops::Form;
use super::stubs::HandWritten;
use super::{arrays, context, entry_points, graphs, link, memops, memory, modules, queries, tensor_map, vmm};
use crate::cudart::graphs as rt_graphs;
use crate::cudart::library as rt_library;
use crate::cudart::managed as rt_managed;
use crate::cudart::stubs as cudart;
use crate::runtime;

/// `cudaMemcpyDefault`: the direction from where the pointers live.
const MEMCPY_DEFAULT: i32 = 4;
const MEMCPY_HOST_TO_DEVICE: i32 = 1;
const MEMCPY_DEVICE_TO_HOST: i32 = 2;
const MEMCPY_DEVICE_TO_DEVICE: i32 = 3;

/// A driver function: `CUDA_ERROR_NOT_INITIALIZED` before `cuInit` (or the runtime's first
/// call), as NVIDIA's driver answers.
fn driver(id: F, f: impl FnOnce() -> Result<(), CuError>) -> i32 {
    super::rt::api_call(id, || {
        if !runtime::driver_initialized() {
            return Err(CuError::NOT_INITIALIZED);
        }
        f()
    })
}

/// A driver function that works in the current context: `CUDA_ERROR_INVALID_CONTEXT` on a
/// thread without one.
fn in_context(id: F, f: impl FnOnce() -> Result<(), CuError>) -> i32 {
    driver(id, || {
        context::require_current()?;
        f()
    })
}

/// Write `value` to the caller's out parameter `p`: `CUDA_ERROR_INVALID_VALUE` when null.
///
/// # Safety
/// `p` must be null or writable.
unsafe fn put<T>(p: *mut T, value: T) -> Result<(), CuError> {
    if p.is_null() {
        return Err(CuError::INVALID_VALUE);
    }
    // SAFETY: not null, and writable (this function's contract).
    unsafe { p.write(value) };
    Ok(())
}

/// A name the caller passes.
///
/// # Safety
/// `p` must be null or NUL-terminated.
unsafe fn name<'a>(p: *const c_char) -> Result<&'a str, CuError> {
    if p.is_null() {
        return Err(CuError::INVALID_VALUE);
    }
    // SAFETY: not null and NUL-terminated (this function's contract).
    unsafe { CStr::from_ptr(p) }.to_str().map_err(|_| CuError::INVALID_VALUE)
}

/// An executable graph a `cuGraphExec*SetParams` call names: null is
/// `CUDA_ERROR_INVALID_VALUE` (0 would name the graph's own node).
fn exec_handle(exec: *mut c_void) -> Result<u64, CuError> {
    if exec.is_null() { Err(CuError::INVALID_VALUE) } else { Ok(exec as u64) }
}

/// The implementation of [`HandWritten`].
pub struct Hand;

/// NUL-terminated error names and texts, built once (`cuGetErrorName` hands out pointers that
/// stay valid for the life of the process).
fn error_strings() -> &'static HashMap<i32, (CString, CString)> {
    static TABLE: OnceLock<HashMap<i32, (CString, CString)>> = OnceLock::new();
    TABLE.get_or_init(|| {
        cuda::ERRORS
            .iter()
            .map(|e| (e.code as i32, (CString::new(e.name).unwrap(), CString::new(e.text).unwrap())))
            .collect()
    })
}

/// `cuGetErrorName`/`cuGetErrorString`: the entry's name or text through `p_str`; an error
/// code the driver does not have is `CUDA_ERROR_INVALID_VALUE` with `*p_str` set to NULL, as
/// NVIDIA's driver answers.
unsafe fn error_string(error: i32, p_str: *mut *const c_char, text: bool) -> i32 {
    if p_str.is_null() {
        return CuError::INVALID_VALUE.0;
    }
    let found = error_strings().get(&error).map(|(name, t)| if text { t.as_ptr() } else { name.as_ptr() });
    // SAFETY: `p_str` is non-null and, by the caller's contract with CUDA, points to a
    // `const char *` it may write.
    unsafe { *p_str = found.unwrap_or(std::ptr::null()) };
    if found.is_some() { cuda::SUCCESS } else { CuError::INVALID_VALUE.0 }
}

impl HandWritten for Hand {
    unsafe fn cuGetErrorName(error: i32, p_str: *mut *const c_char) -> i32 {
        // SAFETY: `p_str` is passed on unchanged: `error_string` asks what this export's caller
        // promises (null, or a place for one `const char *`).
        unsafe { error_string(error, p_str, false) }
    }

    unsafe fn cuGetErrorString(error: i32, p_str: *mut *const c_char) -> i32 {
        // SAFETY: as in `cuGetErrorName`.
        unsafe { error_string(error, p_str, true) }
    }

    /// Only NVIDIA's own CUDA runtime asks for the driver's private export tables: say where
    /// it is built in and report the session bypassed (`bypass::private_runtime`); the table
    /// is not there.
    unsafe fn cuGetExportTable(pp_export_table: *mut *const c_void, _table_id: *const c_void) -> i32 {
        if !pp_export_table.is_null() {
            // SAFETY: by the caller's contract with CUDA, a non-null `pp_export_table` points
            // to a pointer it may write.
            unsafe { *pp_export_table = std::ptr::null() };
        }
        super::rt::api_call(cuda::FunctionId::CuGetExportTable, || {
            crate::bypass::private_runtime();
            Err(cuda::NOT_SUPPORTED)
        })
    }

    // ---- Entry points (entry_points.rs)

    unsafe fn cuGetProcAddress(symbol: *const c_char, pfn: *mut *mut c_void, cuda_version: i32, flags: u64) -> i32 {
        // No cuInit needed: programs look the driver up before initialising it.
        // SAFETY: this export's arguments, passed on: `get_proc_address` asks of them what
        // CUDA asks of this export's caller.
        super::rt::api_call(F::CuGetProcAddress, || unsafe {
            entry_points::get_proc_address(
                symbol,
                pfn,
                cuda_version,
                flags,
                std::ptr::null_mut(),
                entry_points::ProcAddressForm::Legacy,
            )
        })
    }

    unsafe fn cuGetProcAddress_v2(
        symbol: *const c_char,
        pfn: *mut *mut c_void,
        cuda_version: i32,
        flags: u64,
        symbol_status: *mut i32,
    ) -> i32 {
        // SAFETY: as in `cuGetProcAddress`.
        super::rt::api_call(F::CuGetProcAddressV2, || unsafe {
            entry_points::get_proc_address(
                symbol,
                pfn,
                cuda_version,
                flags,
                symbol_status,
                entry_points::ProcAddressForm::WithStatus,
            )
        })
    }

    // ---- Contexts (context.rs)

    unsafe fn cuDevicePrimaryCtxRetain(pctx: *mut u64, dev: i32) -> i32 {
        // SAFETY: `pctx` is null or writable: this export's contract.
        driver(F::CuDevicePrimaryCtxRetain, || unsafe {
            if pctx.is_null() {
                return Err(CuError::INVALID_VALUE);
            }
            put(pctx, context::primary_retain(dev)?)
        })
    }

    unsafe fn cuDevicePrimaryCtxRelease(dev: i32) -> i32 {
        driver(F::CuDevicePrimaryCtxRelease, || context::primary_release(dev))
    }

    unsafe fn cuDevicePrimaryCtxRelease_v2(dev: i32) -> i32 {
        driver(F::CuDevicePrimaryCtxReleaseV2, || context::primary_release(dev))
    }

    unsafe fn cuDevicePrimaryCtxGetState(dev: i32, flags: *mut u32, active: *mut i32) -> i32 {
        driver(F::CuDevicePrimaryCtxGetState, || {
            if flags.is_null() || active.is_null() {
                return Err(CuError::INVALID_VALUE);
            }
            let (f, a) = context::primary_state(dev)?;
            // SAFETY: not null and writable (this export's contract).
            unsafe { put(flags, f) }?;
            // SAFETY: as `flags`.
            unsafe { put(active, i32::from(a)) }
        })
    }

    unsafe fn cuDevicePrimaryCtxSetFlags(dev: i32, flags: u32) -> i32 {
        driver(F::CuDevicePrimaryCtxSetFlags, || context::primary_set_flags(dev, flags))
    }

    unsafe fn cuDevicePrimaryCtxSetFlags_v2(dev: i32, flags: u32) -> i32 {
        driver(F::CuDevicePrimaryCtxSetFlagsV2, || context::primary_set_flags(dev, flags))
    }

    unsafe fn cuDevicePrimaryCtxReset(dev: i32) -> i32 {
        driver(F::CuDevicePrimaryCtxReset, || context::primary_reset(dev))
    }

    unsafe fn cuDevicePrimaryCtxReset_v2(dev: i32) -> i32 {
        driver(F::CuDevicePrimaryCtxResetV2, || context::primary_reset(dev))
    }

    unsafe fn cuCtxCreate(pctx: *mut u64, flags: u32, dev: i32) -> i32 {
        // SAFETY: `pctx` is null or writable: this export's contract.
        driver(F::CuCtxCreate, || unsafe { create_context(pctx, flags, dev) })
    }

    unsafe fn cuCtxCreate_v2(pctx: *mut u64, flags: u32, dev: i32) -> i32 {
        // SAFETY: as in `cuCtxCreate`.
        driver(F::CuCtxCreateV2, || unsafe { create_context(pctx, flags, dev) })
    }

    unsafe fn cuCtxCreate_v3(pctx: *mut u64, params: *mut c_void, num_params: i32, flags: u32, dev: i32) -> i32 {
        // SAFETY: as in `cuCtxCreate`.
        driver(F::CuCtxCreateV3, || unsafe {
            if num_params > 0 && !params.is_null() {
                return Err(not_carried("cuCtxCreate_v3", "execution affinity"));
            }
            create_context(pctx, flags, dev)
        })
    }

    unsafe fn cuCtxCreate_v4(pctx: *mut u64, params: *mut c_void, flags: u32, dev: i32) -> i32 {
        driver(F::CuCtxCreateV4, || {
            if !params.is_null() {
                // { CUexecAffinityParam *, int, CUctxCigParam * }: only the empty form.
                // SAFETY: a non-null `params` is a `CUctxCreateParams`, 24 bytes (this export's
                // contract).
                let raw = unsafe { (params as *const [u8; 24]).read_unaligned() };
                let affinity = u64::from_ne_bytes(raw[0..8].try_into().unwrap_or_default());
                let count = i32::from_ne_bytes(raw[8..12].try_into().unwrap_or_default());
                let cig = u64::from_ne_bytes(raw[16..24].try_into().unwrap_or_default());
                if (affinity != 0 && count > 0) || cig != 0 {
                    return Err(not_carried("cuCtxCreate_v4", "execution affinity and CIG contexts"));
                }
            }
            // SAFETY: as in `cuCtxCreate`.
            unsafe { create_context(pctx, flags, dev) }
        })
    }

    unsafe fn cuCtxDestroy(ctx: u64) -> i32 {
        driver(F::CuCtxDestroy, || context::destroy(ctx))
    }

    unsafe fn cuCtxDestroy_v2(ctx: u64) -> i32 {
        driver(F::CuCtxDestroyV2, || context::destroy(ctx))
    }

    unsafe fn cuCtxGetCurrent(pctx: *mut u64) -> i32 {
        // SAFETY: `pctx` is null or writable: this export's contract.
        driver(F::CuCtxGetCurrent, || unsafe { put(pctx, context::current().unwrap_or(0)) })
    }

    unsafe fn cuCtxSetCurrent(ctx: u64) -> i32 {
        driver(F::CuCtxSetCurrent, || context::set_current(ctx))
    }

    unsafe fn cuCtxGetDevice(device: *mut i32) -> i32 {
        // SAFETY: `device` is null or writable: this export's contract.
        driver(F::CuCtxGetDevice, || unsafe {
            if device.is_null() {
                return Err(CuError::INVALID_VALUE);
            }
            put(device, context::current_device()?)
        })
    }

    unsafe fn cuCtxPushCurrent(ctx: u64) -> i32 {
        driver(F::CuCtxPushCurrent, || context::push_current(ctx))
    }

    unsafe fn cuCtxPushCurrent_v2(ctx: u64) -> i32 {
        driver(F::CuCtxPushCurrentV2, || context::push_current(ctx))
    }

    unsafe fn cuCtxPopCurrent(pctx: *mut u64) -> i32 {
        // SAFETY: `pctx` is null or writable: this export's contract.
        driver(F::CuCtxPopCurrent, || unsafe { pop_context(pctx) })
    }

    unsafe fn cuCtxPopCurrent_v2(pctx: *mut u64) -> i32 {
        // SAFETY: as in `cuCtxPopCurrent`.
        driver(F::CuCtxPopCurrentV2, || unsafe { pop_context(pctx) })
    }

    unsafe fn cuCtxSynchronize() -> i32 {
        // SAFETY: cudaDeviceSynchronize takes no arguments.
        in_context(F::CuCtxSynchronize, || bridge::runtime(|| unsafe { cudart::cudaDeviceSynchronize() }))
    }

    unsafe fn cuCtxGetFlags(flags: *mut u32) -> i32 {
        // SAFETY: `flags` is null or writable: this export's contract.
        in_context(F::CuCtxGetFlags, || unsafe { put(flags, context::flags_of_current()?) })
    }

    unsafe fn cuCtxGetApiVersion(ctx: u64, version: *mut u32) -> i32 {
        // SAFETY: `version` is null or writable: this export's contract.
        driver(F::CuCtxGetApiVersion, || unsafe {
            if version.is_null() {
                return Err(CuError::INVALID_VALUE);
            }
            put(version, context::api_version(ctx)?)
        })
    }

    unsafe fn cuCtxGetStreamPriorityRange(least: *mut i32, greatest: *mut i32) -> i32 {
        in_context(F::CuCtxGetStreamPriorityRange, || {
            // SAFETY: null or writable places (this export's contract), which the runtime's
            // function accepts as its own.
            bridge::runtime(|| unsafe { cudart::cudaDeviceGetStreamPriorityRange(least, greatest) })
        })
    }

    // ---- Memory: the runtime's calls (bridge.rs), memory.rs

    unsafe fn cuMemAlloc_v2(dptr_out: *mut u64, bytesize: usize) -> i32 {
        in_context(F::CuMemAllocV2, || {
            if dptr_out.is_null() || bytesize == 0 {
                return Err(CuError::INVALID_VALUE);
            }
            // SAFETY: `dptr_out` is a writable `CUdeviceptr` (not null, checked above), the
            // size of the `void *` cudaMalloc writes.
            bridge::runtime(|| unsafe { cudart::cudaMalloc(dptr_out as *mut *mut c_void, bytesize) })
        })
    }

    unsafe fn cuMemAllocPitch_v2(
        dptr_out: *mut u64,
        pitch: *mut usize,
        width: usize,
        height: usize,
        element: u32,
    ) -> i32 {
        in_context(F::CuMemAllocPitchV2, || {
            // The driver's element sizes; the pitch suits any of them.
            if dptr_out.is_null() || pitch.is_null() || width == 0 || height == 0 || !matches!(element, 4 | 8 | 16) {
                return Err(CuError::INVALID_VALUE);
            }
            // SAFETY: both outputs are writable (not null, checked above; this export's contract),
            // of the sizes cudaMallocPitch writes.
            bridge::runtime(|| unsafe { cudart::cudaMallocPitch(dptr_out as *mut *mut c_void, pitch, width, height) })
        })
    }

    unsafe fn cuMemFree_v2(p: u64) -> i32 {
        // SAFETY: the runtime checks the address against the session's allocations.
        in_context(F::CuMemFreeV2, || bridge::runtime(|| unsafe { cudart::cudaFree(dptr(p)) }))
    }

    unsafe fn cuIpcGetMemHandle(handle: *mut IpcHandle, p: u64) -> i32 {
        in_context(F::CuIpcGetMemHandle, || {
            // SAFETY: `handle` null or writable (this export's contract), as the runtime's takes;
            // the server checks the address.
            bridge::runtime(|| unsafe { cudart::cudaIpcGetMemHandle(handle, dptr(p)) })
        })
    }

    unsafe fn cuIpcOpenMemHandle(p: *mut u64, handle: IpcHandle, flags: u32) -> i32 {
        in_context(F::CuIpcOpenMemHandle, || {
            // SAFETY: `p` null or writable (this export's contract): the runtime writes a
            // pointer, 8 bytes, as a `CUdeviceptr` is.
            bridge::runtime(|| unsafe { cudart::cudaIpcOpenMemHandle(p.cast(), handle, flags) })
        })
    }

    unsafe fn cuIpcOpenMemHandle_v2(p: *mut u64, handle: IpcHandle, flags: u32) -> i32 {
        in_context(F::CuIpcOpenMemHandleV2, || {
            // SAFETY: as in `cuIpcOpenMemHandle`.
            bridge::runtime(|| unsafe { cudart::cudaIpcOpenMemHandle(p.cast(), handle, flags) })
        })
    }

    unsafe fn cuIpcCloseMemHandle(p: u64) -> i32 {
        // SAFETY: the server checks the address against what the session opened.
        in_context(F::CuIpcCloseMemHandle, || bridge::runtime(|| unsafe { cudart::cudaIpcCloseMemHandle(dptr(p)) }))
    }

    unsafe fn cuIpcGetEventHandle(handle: *mut IpcHandle, event: *mut c_void) -> i32 {
        in_context(F::CuIpcGetEventHandle, || {
            // SAFETY: `handle` null or writable (this export's contract); the server checks the
            // event.
            bridge::runtime(|| unsafe { cudart::cudaIpcGetEventHandle(handle, event) })
        })
    }

    unsafe fn cuIpcOpenEventHandle(event: *mut *mut c_void, handle: IpcHandle) -> i32 {
        in_context(F::CuIpcOpenEventHandle, || {
            // SAFETY: `event` null or writable (this export's contract), as the runtime's takes.
            bridge::runtime(|| unsafe { cudart::cudaIpcOpenEventHandle(event, handle) })
        })
    }

    unsafe fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> i32 {
        // SAFETY: null or writable places (this export's contract), as the runtime's takes.
        in_context(F::CuMemGetInfoV2, || bridge::runtime(|| unsafe { cudart::cudaMemGetInfo(free, total) }))
    }

    unsafe fn cuMemcpyHtoD_v2(dst: u64, src: *const c_void, count: usize) -> i32 {
        in_context(F::CuMemcpyHtoDV2, || {
            // SAFETY: `src` is `count` readable bytes (this export's contract); the runtime checks
            // the device range.
            bridge::runtime(|| unsafe { cudart::cudaMemcpy(dptr(dst), src, count, MEMCPY_HOST_TO_DEVICE) })
        })
    }

    unsafe fn cuMemcpyDtoH_v2(dst: *mut c_void, src: u64, count: usize) -> i32 {
        in_context(F::CuMemcpyDtoHV2, || {
            // SAFETY: `dst` is `count` writable bytes (this export's contract); the runtime
            // checks the device range.
            bridge::runtime(|| unsafe { cudart::cudaMemcpy(dst, dptr(src), count, MEMCPY_DEVICE_TO_HOST) })
        })
    }

    unsafe fn cuMemcpyDtoD_v2(dst: u64, src: u64, count: usize) -> i32 {
        in_context(F::CuMemcpyDtoDV2, || {
            // SAFETY: device addresses only, which the runtime checks.
            bridge::runtime(|| unsafe { cudart::cudaMemcpy(dptr(dst), dptr(src), count, MEMCPY_DEVICE_TO_DEVICE) })
        })
    }

    unsafe fn cuMemcpyHtoDAsync_v2(dst: u64, src: *const c_void, count: usize, stream: *mut c_void) -> i32 {
        in_context(F::CuMemcpyHtoDAsyncV2, || {
            // SAFETY: as in `cuMemcpyHtoD_v2`.
            bridge::runtime(|| unsafe { cudart::cudaMemcpyAsync(dptr(dst), src, count, MEMCPY_HOST_TO_DEVICE, stream) })
        })
    }

    unsafe fn cuMemcpyDtoHAsync_v2(dst: *mut c_void, src: u64, count: usize, stream: *mut c_void) -> i32 {
        in_context(F::CuMemcpyDtoHAsyncV2, || {
            // SAFETY: as in `cuMemcpyDtoH_v2`.
            bridge::runtime(|| unsafe { cudart::cudaMemcpyAsync(dst, dptr(src), count, MEMCPY_DEVICE_TO_HOST, stream) })
        })
    }

    unsafe fn cuMemcpyDtoDAsync_v2(dst: u64, src: u64, count: usize, stream: *mut c_void) -> i32 {
        in_context(F::CuMemcpyDtoDAsyncV2, || {
            // SAFETY: as in `cuMemcpyDtoD_v2`.
            bridge::runtime(|| unsafe {
                cudart::cudaMemcpyAsync(dptr(dst), dptr(src), count, MEMCPY_DEVICE_TO_DEVICE, stream)
            })
        })
    }

    unsafe fn cuMemcpy(dst: u64, src: u64, count: usize) -> i32 {
        in_context(F::CuMemcpy, || {
            // SAFETY: unified addresses: host memory of `count` bytes or device memory, which the
            // runtime tells apart and checks (this export's contract).
            bridge::runtime(|| unsafe { cudart::cudaMemcpy(dptr(dst), dptr(src), count, MEMCPY_DEFAULT) })
        })
    }

    unsafe fn cuMemcpyAsync(dst: u64, src: u64, count: usize, stream: *mut c_void) -> i32 {
        in_context(F::CuMemcpyAsync, || {
            // SAFETY: as in `cuMemcpy`.
            bridge::runtime(|| unsafe { cudart::cudaMemcpyAsync(dptr(dst), dptr(src), count, MEMCPY_DEFAULT, stream) })
        })
    }

    unsafe fn cuMemsetD8_v2(dst: u64, value: u8, count: usize) -> i32 {
        in_context(F::CuMemsetD8V2, || memory::memset_pattern(dst, [value], count, None))
    }

    unsafe fn cuMemsetD16_v2(dst: u64, value: u16, count: usize) -> i32 {
        in_context(F::CuMemsetD16V2, || memory::memset_pattern(dst, value.to_ne_bytes(), count, None))
    }

    unsafe fn cuMemsetD32_v2(dst: u64, value: u32, count: usize) -> i32 {
        in_context(F::CuMemsetD32V2, || memory::memset_pattern(dst, value.to_ne_bytes(), count, None))
    }

    unsafe fn cuMemsetD8Async(dst: u64, value: u8, count: usize, stream: *mut c_void) -> i32 {
        in_context(F::CuMemsetD8Async, || memory::memset_pattern(dst, [value], count, Some(stream)))
    }

    unsafe fn cuMemsetD16Async(dst: u64, value: u16, count: usize, stream: *mut c_void) -> i32 {
        in_context(F::CuMemsetD16Async, || memory::memset_pattern(dst, value.to_ne_bytes(), count, Some(stream)))
    }

    unsafe fn cuMemsetD32Async(dst: u64, value: u32, count: usize, stream: *mut c_void) -> i32 {
        in_context(F::CuMemsetD32Async, || memory::memset_pattern(dst, value.to_ne_bytes(), count, Some(stream)))
    }

    unsafe fn cuPointerGetAttribute(data: *mut c_void, attribute: i32, ptr: u64) -> i32 {
        // SAFETY: `data` is null or holds the attribute's value (this export's contract).
        driver(F::CuPointerGetAttribute, || unsafe { memory::get_attribute(data, attribute, ptr) })
    }

    unsafe fn cuPointerGetAttributes(count: u32, attributes: *mut i32, data: *mut *mut c_void, ptr: u64) -> i32 {
        // SAFETY: `count` attributes and places (this export's contract).
        driver(F::CuPointerGetAttributes, || unsafe { memory::get_attributes(count, attributes, data, ptr) })
    }

    unsafe fn cuMemAllocHost_v2(pp: *mut *mut c_void, bytesize: usize) -> i32 {
        // SAFETY: `pp` is null or writable (this export's contract), as the runtime's takes.
        in_context(F::CuMemAllocHostV2, || bridge::runtime(|| unsafe { cudart::cudaHostAlloc(pp, bytesize, 0) }))
    }

    unsafe fn cuMemHostAlloc(pp: *mut *mut c_void, bytesize: usize, flags: u32) -> i32 {
        // CU_MEMHOSTALLOC_* are the runtime's cudaHostAlloc* flags.
        // SAFETY: as in `cuMemAllocHost_v2`.
        in_context(F::CuMemHostAlloc, || bridge::runtime(|| unsafe { cudart::cudaHostAlloc(pp, bytesize, flags) }))
    }

    unsafe fn cuMemFreeHost(p: *mut c_void) -> i32 {
        // SAFETY: the runtime looks `p` up among its page-locked allocations.
        in_context(F::CuMemFreeHost, || bridge::runtime(|| unsafe { cudart::cudaFreeHost(p) }))
    }

    unsafe fn cuMemHostRegister_v2(p: *mut c_void, bytesize: usize, flags: u32) -> i32 {
        // CU_MEMHOSTREGISTER_* are the runtime's cudaHostRegister* flags.
        in_context(F::CuMemHostRegisterV2, || {
            // SAFETY: `p` is `bytesize` bytes of the program's memory (this export's contract).
            bridge::runtime(|| unsafe { cudart::cudaHostRegister(p, bytesize, flags) })
        })
    }

    unsafe fn cuMemHostUnregister(p: *mut c_void) -> i32 {
        // SAFETY: the runtime looks `p` up among its registrations.
        in_context(F::CuMemHostUnregister, || bridge::runtime(|| unsafe { cudart::cudaHostUnregister(p) }))
    }

    unsafe fn cuMemHostGetFlags(p_flags: *mut u32, p: *mut c_void) -> i32 {
        // SAFETY: `p_flags` is null or a writable `unsigned int` (this export's contract); the
        // runtime checks it and looks `p` up among page-locked and registered memory.
        in_context(F::CuMemHostGetFlags, || bridge::runtime(|| unsafe { cudart::cudaHostGetFlags(p_flags, p) }))
    }

    unsafe fn cuMemHostGetDevicePointer_v2(pdptr: *mut u64, p: *mut c_void, flags: u32) -> i32 {
        in_context(F::CuMemHostGetDevicePointerV2, || {
            // SAFETY: `pdptr` is null or a writable `CUdeviceptr`, the size of the `void *` the
            // runtime writes (this export's contract).
            bridge::runtime(|| unsafe { cudart::cudaHostGetDevicePointer(pdptr as *mut *mut c_void, p, flags) })
        })
    }

    // ---- Virtual memory management (vmm.rs; reservations and mappings are remote calls)

    unsafe fn cuMemGetAllocationGranularity(granularity: *mut usize, prop: *const c_void, option: i32) -> i32 {
        driver(F::CuMemGetAllocationGranularity, || {
            // SAFETY: `prop` null or a `CUmemAllocationProp` (this export's contract).
            let g = unsafe { vmm::granularity(prop, option) }?;
            // SAFETY: `granularity` null (refused) or writable (this export's contract).
            unsafe { put(granularity, g as usize) }
        })
    }

    unsafe fn cuMemCreate(handle: *mut u64, size: usize, prop: *const c_void, flags: u64) -> i32 {
        driver(F::CuMemCreate, || {
            if handle.is_null() {
                return Err(CuError::INVALID_VALUE);
            }
            // SAFETY: `prop` null or a `CUmemAllocationProp` (this export's contract).
            let h = unsafe { vmm::create(size, prop, flags) }?;
            // SAFETY: not null and writable (this export's contract).
            unsafe { put(handle, h) }
        })
    }

    unsafe fn cuMemSetAccess(ptr: u64, size: usize, desc: *const c_void, count: usize) -> i32 {
        // SAFETY: `desc` holds `count` descriptors (this export's contract).
        driver(F::CuMemSetAccess, || unsafe { vmm::set_access(ptr, size, desc, count) })
    }

    unsafe fn cuMemGetAllocationPropertiesFromHandle(prop: *mut c_void, handle: u64) -> i32 {
        // SAFETY: `prop` null or a writable `CUmemAllocationProp` (this export's contract).
        driver(F::CuMemGetAllocationPropertiesFromHandle, || unsafe { vmm::properties(prop, handle) })
    }

    // ---- Modules and launches (modules.rs)

    unsafe fn cuModuleLoadData(module: *mut *mut c_void, image: *const c_void) -> i32 {
        // SAFETY: `module` null or writable, `image` a whole image (this export's contract).
        in_context(F::CuModuleLoadData, || unsafe { load_module(module, image) })
    }

    unsafe fn cuModuleLoad(module: *mut *mut c_void, fname: *const c_char) -> i32 {
        in_context(F::CuModuleLoad, || {
            // SAFETY: `fname` null or NUL-terminated (this export's contract).
            let path = unsafe { name(fname) }?;
            // The image as a NUL-terminated copy (PTX is text the loader reads to its end).
            let mut image = std::fs::read(path).map_err(|e| {
                if let Some(dropped) = phos_protocol::log_limit::GUEST_LINES.admit("cuModuleLoad") {
                    tracing::warn!("cuModuleLoad: cannot read {path}: {e} ({dropped} earlier lines dropped)");
                }
                CuError::FILE_NOT_FOUND
            })?;
            image.push(0);
            // SAFETY: `module` null or writable (this export's contract); `image` a whole
            // image of its file, terminated, alive for the call.
            unsafe { load_module(module, image.as_ptr() as *const c_void) }
        })
    }

    unsafe fn cuModuleLoadDataEx(
        module: *mut *mut c_void,
        image: *const c_void,
        num_options: u32,
        options: *mut i32,
        option_values: *mut *mut c_void,
    ) -> i32 {
        in_context(F::CuModuleLoadDataEx, || {
            // SAFETY: the options as the driver's contract has them.
            unsafe { clear_jit_logs(num_options, options, option_values) };
            // SAFETY: as in `cuModuleLoadData`.
            unsafe { load_module(module, image) }
        })
    }

    unsafe fn cuModuleLoadFatBinary(module: *mut *mut c_void, fat_cubin: *const c_void) -> i32 {
        // SAFETY: as in `cuModuleLoadData`.
        in_context(F::CuModuleLoadFatBinary, || unsafe { load_module(module, fat_cubin) })
    }

    unsafe fn cuModuleUnload(module: *mut c_void) -> i32 {
        in_context(F::CuModuleUnload, || modules::unload(module as u64))
    }

    unsafe fn cuModuleGetFunction(hfunc: *mut *mut c_void, module: *mut c_void, fname: *const c_char) -> i32 {
        in_context(F::CuModuleGetFunction, || {
            if hfunc.is_null() {
                return Err(CuError::INVALID_VALUE);
            }
            // SAFETY: `fname` null or NUL-terminated (this export's contract).
            let f = modules::function(module as u64, unsafe { name(fname) }?)?;
            // SAFETY: `hfunc` not null and writable (this export's contract).
            unsafe { put(hfunc, f as usize as *mut c_void) }
        })
    }

    unsafe fn cuModuleGetGlobal_v2(out: *mut u64, bytes: *mut usize, module: *mut c_void, vname: *const c_char) -> i32 {
        in_context(F::CuModuleGetGlobalV2, || {
            // SAFETY: `vname` null or NUL-terminated (this export's contract).
            let (address, size) = modules::global(module as u64, unsafe { name(vname) }?)?;
            if !out.is_null() {
                // SAFETY: not null and writable (this export's contract; null is allowed).
                unsafe { put(out, address) }?;
            }
            if !bytes.is_null() {
                // SAFETY: as `out`.
                unsafe { put(bytes, size as usize) }?;
            }
            Ok(())
        })
    }

    // ---- JIT linking (link.rs)

    unsafe fn cuLinkCreate(count: u32, options: *mut i32, values: *mut *mut c_void, state_out: *mut u64) -> i32 {
        // SAFETY: as in `cuLinkCreate_v2`.
        unsafe { Self::cuLinkCreate_v2(count, options, values, state_out) }
    }

    unsafe fn cuLinkCreate_v2(count: u32, options: *mut i32, values: *mut *mut c_void, state_out: *mut u64) -> i32 {
        in_context(F::CuLinkCreateV2, || {
            if state_out.is_null() {
                return Err(CuError::INVALID_VALUE);
            }
            // SAFETY: `count` options and values, alive while the state is (this export's
            // contract).
            let state = unsafe { link::create(count, options, values) }?;
            // SAFETY: not null, writable (this export's contract).
            unsafe { put(state_out, state) }
        })
    }

    #[allow(clippy::too_many_arguments)]
    unsafe fn cuLinkAddData(
        state: u64,
        kind: i32,
        data: *mut c_void,
        size: usize,
        name: *const c_char,
        count: u32,
        options: *mut i32,
        values: *mut *mut c_void,
    ) -> i32 {
        // SAFETY: as in `cuLinkAddData_v2`.
        unsafe { Self::cuLinkAddData_v2(state, kind, data, size, name, count, options, values) }
    }

    #[allow(clippy::too_many_arguments)]
    unsafe fn cuLinkAddData_v2(
        state: u64,
        kind: i32,
        data: *mut c_void,
        size: usize,
        name: *const c_char,
        count: u32,
        options: *mut i32,
        values: *mut *mut c_void,
    ) -> i32 {
        // SAFETY: the input's bytes, its name and its options (this export's contract).
        in_context(F::CuLinkAddDataV2, || unsafe {
            link::add_data(state, kind, data, size, name, count, options, values)
        })
    }

    unsafe fn cuLinkAddFile(
        state: u64,
        kind: i32,
        path: *const c_char,
        count: u32,
        options: *mut i32,
        values: *mut *mut c_void,
    ) -> i32 {
        // SAFETY: as in `cuLinkAddFile_v2`.
        unsafe { Self::cuLinkAddFile_v2(state, kind, path, count, options, values) }
    }

    unsafe fn cuLinkAddFile_v2(
        state: u64,
        kind: i32,
        path: *const c_char,
        count: u32,
        options: *mut i32,
        values: *mut *mut c_void,
    ) -> i32 {
        // SAFETY: the path and options (this export's contract).
        in_context(F::CuLinkAddFileV2, || unsafe { link::add_file(state, kind, path, count, options, values) })
    }

    unsafe fn cuLinkComplete(state: u64, cubin_out: *mut *mut c_void, size_out: *mut usize) -> i32 {
        in_context(F::CuLinkComplete, || {
            if cubin_out.is_null() || size_out.is_null() {
                return Err(CuError::INVALID_VALUE);
            }
            let (image, size) = link::complete(state)?;
            // SAFETY: both not null, writable (this export's contract).
            unsafe { put(cubin_out, image as *mut c_void) }?;
            // SAFETY: as above.
            unsafe { put(size_out, size) }
        })
    }

    unsafe fn cuLinkDestroy(state: u64) -> i32 {
        driver(F::CuLinkDestroy, || link::destroy(state))
    }

    // ---- Stream memory operations (memops.rs)

    unsafe fn cuStreamWaitValue32(stream: *mut c_void, addr: u64, value: u32, flags: u32) -> i32 {
        in_context(F::CuStreamWaitValue32, || memops::wait(Form::V1, stream, addr, value as u64, flags, false))
    }

    unsafe fn cuStreamWaitValue32_v2(stream: *mut c_void, addr: u64, value: u32, flags: u32) -> i32 {
        in_context(F::CuStreamWaitValue32V2, || memops::wait(Form::V2, stream, addr, value as u64, flags, false))
    }

    unsafe fn cuStreamWaitValue64(stream: *mut c_void, addr: u64, value: u64, flags: u32) -> i32 {
        in_context(F::CuStreamWaitValue64, || memops::wait(Form::V1, stream, addr, value, flags, true))
    }

    unsafe fn cuStreamWaitValue64_v2(stream: *mut c_void, addr: u64, value: u64, flags: u32) -> i32 {
        in_context(F::CuStreamWaitValue64V2, || memops::wait(Form::V2, stream, addr, value, flags, true))
    }

    unsafe fn cuStreamWriteValue32(stream: *mut c_void, addr: u64, value: u32, flags: u32) -> i32 {
        in_context(F::CuStreamWriteValue32, || memops::write(Form::V1, stream, addr, value as u64, flags, false))
    }

    unsafe fn cuStreamWriteValue32_v2(stream: *mut c_void, addr: u64, value: u32, flags: u32) -> i32 {
        in_context(F::CuStreamWriteValue32V2, || memops::write(Form::V2, stream, addr, value as u64, flags, false))
    }

    unsafe fn cuStreamWriteValue64(stream: *mut c_void, addr: u64, value: u64, flags: u32) -> i32 {
        in_context(F::CuStreamWriteValue64, || memops::write(Form::V1, stream, addr, value, flags, true))
    }

    unsafe fn cuStreamWriteValue64_v2(stream: *mut c_void, addr: u64, value: u64, flags: u32) -> i32 {
        in_context(F::CuStreamWriteValue64V2, || memops::write(Form::V2, stream, addr, value, flags, true))
    }

    unsafe fn cuStreamBatchMemOp(stream: *mut c_void, count: u32, params: *mut c_void, flags: u32) -> i32 {
        // SAFETY: `count` operations (this export's contract).
        in_context(F::CuStreamBatchMemOp, || unsafe { memops::batch(Form::V1, stream, count, params, flags) })
    }

    unsafe fn cuStreamBatchMemOp_v2(stream: *mut c_void, count: u32, params: *mut c_void, flags: u32) -> i32 {
        // SAFETY: `count` operations (this export's contract).
        in_context(F::CuStreamBatchMemOpV2, || unsafe { memops::batch(Form::V2, stream, count, params, flags) })
    }

    // ---- Tensor maps (tensor_map.rs)

    #[allow(clippy::too_many_arguments)]
    unsafe fn cuTensorMapEncodeTiled(
        map: *mut c_void,
        data_type: i32,
        rank: u32,
        address: *mut c_void,
        dims: *const u64,
        strides: *const u64,
        box_dim: *const u32,
        element_strides: *const u32,
        interleave: i32,
        swizzle: i32,
        l2_promotion: i32,
        oob_fill: i32,
    ) -> i32 {
        let raw = tensor_map::Raw {
            kind: tensor_map::Kind::Tiled,
            data_type,
            rank,
            address: address as u64,
            dims,
            strides,
            box_dim,
            element_strides,
            interleave,
            swizzle,
            l2_promotion,
            oob_fill,
            lower: std::ptr::null(),
            upper: std::ptr::null(),
            lower_width: 0,
            upper_width: 0,
            channels_per_pixel: 0,
            pixels_per_column: 0,
            mode: 0,
        };
        // SAFETY: the map's 128 bytes and the arrays of its rank (this export's contract).
        driver(F::CuTensorMapEncodeTiled, || unsafe { tensor_map::encode(map, &raw) })
    }

    #[allow(clippy::too_many_arguments)]
    unsafe fn cuTensorMapEncodeIm2col(
        map: *mut c_void,
        data_type: i32,
        rank: u32,
        address: *mut c_void,
        dims: *const u64,
        strides: *const u64,
        lower: *const i32,
        upper: *const i32,
        channels_per_pixel: u32,
        pixels_per_column: u32,
        element_strides: *const u32,
        interleave: i32,
        swizzle: i32,
        l2_promotion: i32,
        oob_fill: i32,
    ) -> i32 {
        let raw = tensor_map::Raw {
            kind: tensor_map::Kind::Im2col,
            data_type,
            rank,
            address: address as u64,
            dims,
            strides,
            box_dim: std::ptr::null(),
            element_strides,
            interleave,
            swizzle,
            l2_promotion,
            oob_fill,
            lower,
            upper,
            lower_width: 0,
            upper_width: 0,
            channels_per_pixel,
            pixels_per_column,
            mode: 0,
        };
        // SAFETY: the map's 128 bytes and the arrays of its rank (this export's contract).
        driver(F::CuTensorMapEncodeIm2col, || unsafe { tensor_map::encode(map, &raw) })
    }

    #[allow(clippy::too_many_arguments)]
    unsafe fn cuTensorMapEncodeIm2colWide(
        map: *mut c_void,
        data_type: i32,
        rank: u32,
        address: *mut c_void,
        dims: *const u64,
        strides: *const u64,
        lower_width: i32,
        upper_width: i32,
        channels_per_pixel: u32,
        pixels_per_column: u32,
        element_strides: *const u32,
        interleave: i32,
        mode: i32,
        swizzle: i32,
        l2_promotion: i32,
        oob_fill: i32,
    ) -> i32 {
        let raw = tensor_map::Raw {
            kind: tensor_map::Kind::Im2colWide,
            data_type,
            rank,
            address: address as u64,
            dims,
            strides,
            box_dim: std::ptr::null(),
            element_strides,
            interleave,
            swizzle,
            l2_promotion,
            oob_fill,
            lower: std::ptr::null(),
            upper: std::ptr::null(),
            lower_width,
            upper_width,
            channels_per_pixel,
            pixels_per_column,
            mode,
        };
        // SAFETY: the map's 128 bytes and the arrays of its rank (this export's contract).
        driver(F::CuTensorMapEncodeIm2colWide, || unsafe { tensor_map::encode(map, &raw) })
    }

    unsafe fn cuTensorMapReplaceAddress(map: *mut c_void, address: *mut c_void) -> i32 {
        // SAFETY: a tensor map's 128 bytes (this export's contract).
        driver(F::CuTensorMapReplaceAddress, || unsafe { tensor_map::replace_address(map, address as u64) })
    }

    // ---- Libraries and their kernels: the runtime's library API (cudart/library.rs)

    unsafe fn cuLibraryLoadData(
        library: *mut *mut c_void,
        code: *const c_void,
        jit: *mut i32,
        jit_values: *mut *mut c_void,
        jit_count: u32,
        lib: *mut i32,
        lib_values: *mut *mut c_void,
        lib_count: u32,
    ) -> i32 {
        driver(F::CuLibraryLoadData, || {
            // SAFETY: this export's arguments, passed on: `load_data` asks of them what the
            // driver asks of this export's caller.
            bridge::from_runtime(unsafe {
                rt_library::load_data(library, code, jit, jit_values, jit_count, lib, lib_values, lib_count)
            })
        })
    }

    unsafe fn cuLibraryLoadFromFile(
        library: *mut *mut c_void,
        path: *const c_char,
        jit: *mut i32,
        jit_values: *mut *mut c_void,
        jit_count: u32,
        lib: *mut i32,
        lib_values: *mut *mut c_void,
        lib_count: u32,
    ) -> i32 {
        driver(F::CuLibraryLoadFromFile, || {
            // SAFETY: as in `cuLibraryLoadData`.
            bridge::from_runtime(unsafe {
                rt_library::load_from_file(library, path, jit, jit_values, jit_count, lib, lib_values, lib_count)
            })
        })
    }

    unsafe fn cuLibraryUnload(library: *mut c_void) -> i32 {
        driver(F::CuLibraryUnload, || bridge::from_runtime(rt_library::unload(library as u64)))
    }

    unsafe fn cuLibraryGetKernel(kernel: *mut *mut c_void, library: *mut c_void, kname: *const c_char) -> i32 {
        driver(F::CuLibraryGetKernel, || {
            // SAFETY: a writable handle and a NUL-terminated name where the driver asks for them.
            bridge::from_runtime(unsafe { rt_library::get_kernel(kernel, library as u64, kname) })
        })
    }

    unsafe fn cuLibraryGetKernelCount(count: *mut u32, library: *mut c_void) -> i32 {
        driver(F::CuLibraryGetKernelCount, || {
            // SAFETY: a writable `unsigned int` where the driver asks for one.
            bridge::from_runtime(unsafe { rt_library::kernel_count(count, library as u64) })
        })
    }

    unsafe fn cuLibraryEnumerateKernels(kernels: *mut *mut c_void, max: u32, library: *mut c_void) -> i32 {
        driver(F::CuLibraryEnumerateKernels, || {
            // SAFETY: room for `max` handles where the driver asks for it.
            bridge::from_runtime(unsafe { rt_library::enumerate_kernels(kernels, max, library as u64) })
        })
    }

    unsafe fn cuLibraryGetGlobal(out: *mut u64, bytes: *mut usize, library: *mut c_void, vname: *const c_char) -> i32 {
        driver(F::CuLibraryGetGlobal, || {
            // SAFETY: writable out parameters (or null) and a NUL-terminated name where the
            // driver asks for them; a `CUdeviceptr` has a pointer's size.
            bridge::from_runtime(unsafe { rt_library::get_global(out.cast(), bytes, library as u64, vname) })
        })
    }

    unsafe fn cuLibraryGetManaged(
        _out: *mut u64,
        _bytes: *mut usize,
        _library: *mut c_void,
        _name: *const c_char,
    ) -> i32 {
        driver(F::CuLibraryGetManaged, || bridge::from_runtime(rt_library::get_managed()))
    }

    unsafe fn cuLibraryGetUnifiedFunction(
        _fptr: *mut *mut c_void,
        _library: *mut c_void,
        _symbol: *const c_char,
    ) -> i32 {
        driver(F::CuLibraryGetUnifiedFunction, || bridge::from_runtime(rt_library::get_unified_function()))
    }

    unsafe fn cuLibraryGetModule(module: *mut *mut c_void, library: *mut c_void) -> i32 {
        in_context(F::CuLibraryGetModule, || {
            // The library is its module.
            modules::kernel_names(library as u64)?;
            // SAFETY: null or writable (this export's contract).
            unsafe { put(module, library) }
        })
    }

    unsafe fn cuKernelGetFunction(function: *mut *mut c_void, kernel: *mut c_void) -> i32 {
        in_context(F::CuKernelGetFunction, || {
            // A kernel is the function of its module in every context.
            modules::known(kernel as u64)?;
            // SAFETY: null or writable (this export's contract).
            unsafe { put(function, kernel) }
        })
    }

    unsafe fn cuKernelGetLibrary(library: *mut *mut c_void, kernel: *mut c_void) -> i32 {
        driver(F::CuKernelGetLibrary, || {
            let module = modules::module_of(kernel as u64).ok_or(CuError::INVALID_HANDLE)?;
            // SAFETY: null or writable (this export's contract).
            unsafe { put(library, module as usize as *mut c_void) }
        })
    }

    unsafe fn cuKernelGetAttribute(pi: *mut i32, attrib: i32, kernel: *mut c_void, dev: i32) -> i32 {
        driver(F::CuKernelGetAttribute, || {
            bridge::check_device(dev)?;
            if pi.is_null() {
                return Err(CuError::INVALID_VALUE);
            }
            // SAFETY: not null, writable (this export's contract).
            unsafe { put(pi, modules::attribute(kernel as u64, attrib)?) }
        })
    }

    unsafe fn cuKernelSetAttribute(attrib: i32, value: i32, kernel: *mut c_void, dev: i32) -> i32 {
        driver(F::CuKernelSetAttribute, || {
            bridge::check_device(dev)?;
            modules::set_attribute(kernel as u64, attrib, value)
        })
    }

    unsafe fn cuKernelSetCacheConfig(kernel: *mut c_void, config: i32, dev: i32) -> i32 {
        driver(F::CuKernelSetCacheConfig, || {
            bridge::check_device(dev)?;
            modules::set_cache_config(kernel as u64, config)
        })
    }

    unsafe fn cuFuncGetAttribute(pi: *mut i32, attrib: i32, hfunc: *mut c_void) -> i32 {
        // SAFETY: `pi` null or writable (this export's contract).
        in_context(F::CuFuncGetAttribute, || unsafe {
            if pi.is_null() {
                return Err(CuError::INVALID_VALUE);
            }
            put(pi, modules::attribute(hfunc as u64, attrib)?)
        })
    }

    unsafe fn cuFuncSetAttribute(hfunc: *mut c_void, attrib: i32, value: i32) -> i32 {
        in_context(F::CuFuncSetAttribute, || modules::set_attribute(hfunc as u64, attrib, value))
    }

    unsafe fn cuFuncSetCacheConfig(hfunc: *mut c_void, config: i32) -> i32 {
        in_context(F::CuFuncSetCacheConfig, || modules::set_cache_config(hfunc as u64, config))
    }

    unsafe fn cuLaunchKernel(
        f: *mut c_void,
        grid_x: u32,
        grid_y: u32,
        grid_z: u32,
        block_x: u32,
        block_y: u32,
        block_z: u32,
        shared_mem_bytes: u32,
        stream: *mut c_void,
        kernel_params: *mut *mut c_void,
        extra: *mut *mut c_void,
    ) -> i32 {
        let grid = Dim3 { x: grid_x, y: grid_y, z: grid_z };
        let block = Dim3 { x: block_x, y: block_y, z: block_z };
        // SAFETY: `kernel_params` and `extra` as the driver's contract has them.
        in_context(F::CuLaunchKernel, || unsafe {
            modules::launch(f as u64, grid, block, shared_mem_bytes, stream as u64, kernel_params, extra, false)
        })
    }

    unsafe fn cuLaunchCooperativeKernel(
        f: *mut c_void,
        grid_x: u32,
        grid_y: u32,
        grid_z: u32,
        block_x: u32,
        block_y: u32,
        block_z: u32,
        shared_mem_bytes: u32,
        stream: *mut c_void,
        kernel_params: *mut *mut c_void,
    ) -> i32 {
        let grid = Dim3 { x: grid_x, y: grid_y, z: grid_z };
        let block = Dim3 { x: block_x, y: block_y, z: block_z };
        let none = std::ptr::null_mut();
        // SAFETY: `kernel_params` as the driver's contract has it.
        in_context(F::CuLaunchCooperativeKernel, || unsafe {
            modules::launch(f as u64, grid, block, shared_mem_bytes, stream as u64, kernel_params, none, true)
        })
    }

    unsafe fn cuLaunchKernelEx(
        config: *const c_void,
        f: *mut c_void,
        kernel_params: *mut *mut c_void,
        extra: *mut *mut c_void,
    ) -> i32 {
        // SAFETY: `config` null or a `CUlaunchConfig`; the rest as in `cuLaunchKernel`.
        in_context(F::CuLaunchKernelEx, || unsafe { modules::launch_ex(config, f as u64, kernel_params, extra, false) })
    }

    unsafe fn cuOccupancyMaxActiveBlocksPerMultiprocessor(
        num_blocks: *mut i32,
        func: *mut c_void,
        block_size: i32,
        dynamic_smem: usize,
    ) -> i32 {
        // SAFETY: `num_blocks` null or writable (this export's contract).
        in_context(F::CuOccupancyMaxActiveBlocksPerMultiprocessor, || unsafe {
            if num_blocks.is_null() {
                return Err(CuError::INVALID_VALUE);
            }
            put(num_blocks, modules::occupancy(func as u64, block_size, dynamic_smem, 0)?)
        })
    }

    unsafe fn cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(
        num_blocks: *mut i32,
        func: *mut c_void,
        block_size: i32,
        dynamic_smem: usize,
        flags: u32,
    ) -> i32 {
        // SAFETY: as in `cuOccupancyMaxActiveBlocksPerMultiprocessor`.
        in_context(F::CuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags, || unsafe {
            if num_blocks.is_null() {
                return Err(CuError::INVALID_VALUE);
            }
            put(num_blocks, modules::occupancy(func as u64, block_size, dynamic_smem, flags)?)
        })
    }

    // ---- Streams and events: the runtime's (same handles, same flag values)

    unsafe fn cuStreamCreate(ph_stream: *mut *mut c_void, flags: u32) -> i32 {
        in_context(F::CuStreamCreate, || {
            // SAFETY: `ph_stream` null or writable (this export's contract), as the runtime's takes.
            bridge::runtime(|| unsafe { cudart::cudaStreamCreateWithPriority(ph_stream, flags, 0) })
        })
    }

    unsafe fn cuStreamCreateWithPriority(ph_stream: *mut *mut c_void, flags: u32, priority: i32) -> i32 {
        in_context(F::CuStreamCreateWithPriority, || {
            // SAFETY: as in `cuStreamCreate`.
            bridge::runtime(|| unsafe { cudart::cudaStreamCreateWithPriority(ph_stream, flags, priority) })
        })
    }

    unsafe fn cuStreamDestroy(stream: *mut c_void) -> i32 {
        // SAFETY: a handle, which the server checks.
        in_context(F::CuStreamDestroy, || bridge::runtime(|| unsafe { cudart::cudaStreamDestroy(stream) }))
    }

    unsafe fn cuStreamDestroy_v2(stream: *mut c_void) -> i32 {
        // SAFETY: as in `cuStreamDestroy`.
        in_context(F::CuStreamDestroyV2, || bridge::runtime(|| unsafe { cudart::cudaStreamDestroy(stream) }))
    }

    unsafe fn cuStreamQuery(stream: *mut c_void) -> i32 {
        // SAFETY: as in `cuStreamDestroy`.
        in_context(F::CuStreamQuery, || bridge::runtime(|| unsafe { cudart::cudaStreamQuery(stream) }))
    }

    unsafe fn cuStreamWaitEvent(stream: *mut c_void, event: *mut c_void, flags: u32) -> i32 {
        in_context(F::CuStreamWaitEvent, || {
            // SAFETY: handles, which the server checks.
            bridge::runtime(|| unsafe { cudart::cudaStreamWaitEvent(stream, event, flags) })
        })
    }

    unsafe fn cuStreamGetPriority(stream: *mut c_void, priority: *mut i32) -> i32 {
        in_context(F::CuStreamGetPriority, || {
            // SAFETY: `priority` null or writable (this export's contract), as the runtime's takes.
            bridge::runtime(|| unsafe { cudart::cudaStreamGetPriority(stream, priority) })
        })
    }

    unsafe fn cuStreamGetFlags(stream: *mut c_void, flags: *mut u32) -> i32 {
        // SAFETY: as in `cuStreamGetPriority`.
        in_context(F::CuStreamGetFlags, || bridge::runtime(|| unsafe { cudart::cudaStreamGetFlags(stream, flags) }))
    }

    unsafe fn cuEventCreate(ph_event: *mut *mut c_void, flags: u32) -> i32 {
        in_context(F::CuEventCreate, || {
            // SAFETY: `ph_event` null or writable (this export's contract), as the runtime's takes.
            bridge::runtime(|| unsafe { cudart::cudaEventCreateWithFlags(ph_event, flags) })
        })
    }

    unsafe fn cuEventRecord(event: *mut c_void, stream: *mut c_void) -> i32 {
        // SAFETY: handles, which the server checks.
        in_context(F::CuEventRecord, || bridge::runtime(|| unsafe { cudart::cudaEventRecord(event, stream) }))
    }

    unsafe fn cuEventQuery(event: *mut c_void) -> i32 {
        // SAFETY: a handle, which the server checks.
        in_context(F::CuEventQuery, || bridge::runtime(|| unsafe { cudart::cudaEventQuery(event) }))
    }

    unsafe fn cuEventSynchronize(event: *mut c_void) -> i32 {
        // SAFETY: a handle, which the server checks.
        in_context(F::CuEventSynchronize, || bridge::runtime(|| unsafe { cudart::cudaEventSynchronize(event) }))
    }

    unsafe fn cuEventElapsedTime(ms: *mut f32, start: *mut c_void, end: *mut c_void) -> i32 {
        in_context(F::CuEventElapsedTime, || {
            // SAFETY: `ms` null or writable (this export's contract), as the runtime's takes.
            bridge::runtime(|| unsafe { cudart::cudaEventElapsedTime(ms, start, end) })
        })
    }

    unsafe fn cuEventElapsedTime_v2(ms: *mut f32, start: *mut c_void, end: *mut c_void) -> i32 {
        in_context(F::CuEventElapsedTimeV2, || {
            // SAFETY: as in `cuEventElapsedTime`.
            bridge::runtime(|| unsafe { cudart::cudaEventElapsedTime(ms, start, end) })
        })
    }

    unsafe fn cuEventDestroy(event: *mut c_void) -> i32 {
        // SAFETY: a handle, which the server checks.
        in_context(F::CuEventDestroy, || bridge::runtime(|| unsafe { cudart::cudaEventDestroy(event) }))
    }

    unsafe fn cuEventDestroy_v2(event: *mut c_void) -> i32 {
        // SAFETY: a handle, which the server checks.
        in_context(F::CuEventDestroyV2, || bridge::runtime(|| unsafe { cudart::cudaEventDestroy(event) }))
    }

    // ---- Graphs and stream capture: the runtime's (graphs.rs; same handles, same numbers)

    unsafe fn cuStreamBeginCapture(stream: *mut c_void) -> i32 {
        in_context(F::CuStreamBeginCapture, || {
            // SAFETY: a handle, which the server checks; the legacy form captures in the global mode.
            bridge::runtime(|| unsafe { cudart::cudaStreamBeginCapture(stream, 0) })
        })
    }

    unsafe fn cuStreamBeginCapture_v2(stream: *mut c_void, mode: i32) -> i32 {
        in_context(F::CuStreamBeginCaptureV2, || {
            // SAFETY: a handle, which the server checks.
            bridge::runtime(|| unsafe { cudart::cudaStreamBeginCapture(stream, mode) })
        })
    }

    unsafe fn cuStreamEndCapture(stream: *mut c_void, graph: *mut *mut c_void) -> i32 {
        in_context(F::CuStreamEndCapture, || {
            // SAFETY: `graph` null or writable (this export's contract), as the runtime's takes.
            bridge::runtime(|| unsafe { cudart::cudaStreamEndCapture(stream, graph) })
        })
    }

    unsafe fn cuStreamIsCapturing(stream: *mut c_void, status: *mut i32) -> i32 {
        in_context(F::CuStreamIsCapturing, || {
            // SAFETY: `status` null or writable (this export's contract), as the runtime's takes.
            bridge::runtime(|| unsafe { cudart::cudaStreamIsCapturing(stream, status) })
        })
    }

    unsafe fn cuGraphCreate(graph: *mut *mut c_void, flags: u32) -> i32 {
        in_context(F::CuGraphCreate, || {
            // SAFETY: `graph` null or writable (this export's contract), as the runtime's takes.
            bridge::runtime(|| unsafe { cudart::cudaGraphCreate(graph, flags) })
        })
    }

    unsafe fn cuGraphDestroy(graph: *mut c_void) -> i32 {
        in_context(F::CuGraphDestroy, || {
            // SAFETY: a handle, which the server checks.
            bridge::runtime(|| unsafe { cudart::cudaGraphDestroy(graph) })
        })
    }

    unsafe fn cuGraphInstantiateWithFlags(exec: *mut *mut c_void, graph: *mut c_void, flags: u64) -> i32 {
        in_context(F::CuGraphInstantiateWithFlags, || {
            // SAFETY: `exec` null or writable (this export's contract), as the runtime's takes.
            bridge::runtime(|| unsafe { cudart::cudaGraphInstantiateWithFlags(exec, graph, flags) })
        })
    }

    unsafe fn cuGraphInstantiateWithParams(exec: *mut *mut c_void, graph: *mut c_void, params: *mut c_void) -> i32 {
        in_context(F::CuGraphInstantiateWithParams, || {
            // SAFETY: `exec` null or writable, `params` null or a writable
            // `CUDA_GRAPH_INSTANTIATE_PARAMS` (this export's contract), the runtime's struct.
            bridge::runtime(|| unsafe { cudart::cudaGraphInstantiateWithParams(exec, graph, params) })
        })
    }

    unsafe fn cuGraphInstantiateWithParams_ptsz(
        exec: *mut *mut c_void,
        graph: *mut c_void,
        params: *mut c_void,
    ) -> i32 {
        in_context(F::CuGraphInstantiateWithParamsPtsz, || {
            // SAFETY: as in `cuGraphInstantiateWithParams`.
            bridge::runtime(|| unsafe { cudart::cudaGraphInstantiateWithParams_ptsz(exec, graph, params) })
        })
    }

    unsafe fn cuGraphLaunch(exec: *mut c_void, stream: *mut c_void) -> i32 {
        in_context(F::CuGraphLaunch, || {
            // SAFETY: handles, which the server checks.
            bridge::runtime(|| unsafe { cudart::cudaGraphLaunch(exec, stream) })
        })
    }

    unsafe fn cuGraphExecDestroy(exec: *mut c_void) -> i32 {
        in_context(F::CuGraphExecDestroy, || {
            // SAFETY: a handle, which the server checks.
            bridge::runtime(|| unsafe { cudart::cudaGraphExecDestroy(exec) })
        })
    }

    unsafe fn cuGraphUpload(exec: *mut c_void, stream: *mut c_void) -> i32 {
        in_context(F::CuGraphUpload, || {
            // SAFETY: handles, which the server checks.
            bridge::runtime(|| unsafe { cudart::cudaGraphUpload(exec, stream) })
        })
    }

    unsafe fn cuGraphGetNodes(graph: *mut c_void, nodes: *mut *mut c_void, count: *mut usize) -> i32 {
        in_context(F::CuGraphGetNodes, || {
            // SAFETY: the arrays as this export's caller gives them, what the runtime's asks of its caller.
            bridge::runtime(|| unsafe { cudart::cudaGraphGetNodes(graph, nodes, count) })
        })
    }

    unsafe fn cuGraphGetRootNodes(graph: *mut c_void, nodes: *mut *mut c_void, count: *mut usize) -> i32 {
        in_context(F::CuGraphGetRootNodes, || {
            // SAFETY: as in `cuGraphGetNodes`.
            bridge::runtime(|| unsafe { cudart::cudaGraphGetRootNodes(graph, nodes, count) })
        })
    }

    unsafe fn cuGraphAddEmptyNode(
        node: *mut *mut c_void,
        graph: *mut c_void,
        deps: *const *mut c_void,
        count: usize,
    ) -> i32 {
        in_context(F::CuGraphAddEmptyNode, || {
            // SAFETY: the out handle and the dependencies as this export's caller gives them, what the runtime's asks of its caller.
            bridge::runtime(|| unsafe { cudart::cudaGraphAddEmptyNode(node, graph, deps, count) })
        })
    }

    unsafe fn cuGraphAddHostNode(
        node: *mut *mut c_void,
        graph: *mut c_void,
        deps: *const *mut c_void,
        count: usize,
        params: *const c_void,
    ) -> i32 {
        in_context(F::CuGraphAddHostNode, || {
            // SAFETY: as in `cuGraphAddEmptyNode`; `CUDA_HOST_NODE_PARAMS` is `cudaHostNodeParams`.
            bridge::runtime(|| unsafe { cudart::cudaGraphAddHostNode(node, graph, deps, count, params) })
        })
    }

    unsafe fn cuGraphAddMemsetNode(
        node: *mut *mut c_void,
        graph: *mut c_void,
        deps: *const *mut c_void,
        count: usize,
        params: *const c_void,
        _ctx: u64,
    ) -> i32 {
        in_context(F::CuGraphAddMemsetNode, || {
            // SAFETY: as in `cuGraphAddEmptyNode`; `CUDA_MEMSET_NODE_PARAMS` is `cudaMemsetParams` (the context is the device's: one address space).
            bridge::runtime(|| unsafe { cudart::cudaGraphAddMemsetNode(node, graph, deps, count, params) })
        })
    }

    unsafe fn cuGraphAddChildGraphNode(
        node: *mut *mut c_void,
        graph: *mut c_void,
        deps: *const *mut c_void,
        count: usize,
        child: *mut c_void,
    ) -> i32 {
        in_context(F::CuGraphAddChildGraphNode, || {
            // SAFETY: as in `cuGraphAddEmptyNode`.
            bridge::runtime(|| unsafe { cudart::cudaGraphAddChildGraphNode(node, graph, deps, count, child) })
        })
    }

    unsafe fn cuGraphAddEventRecordNode(
        node: *mut *mut c_void,
        graph: *mut c_void,
        deps: *const *mut c_void,
        count: usize,
        event: *mut c_void,
    ) -> i32 {
        in_context(F::CuGraphAddEventRecordNode, || {
            // SAFETY: as in `cuGraphAddEmptyNode`.
            bridge::runtime(|| unsafe { cudart::cudaGraphAddEventRecordNode(node, graph, deps, count, event) })
        })
    }

    unsafe fn cuGraphAddEventWaitNode(
        node: *mut *mut c_void,
        graph: *mut c_void,
        deps: *const *mut c_void,
        count: usize,
        event: *mut c_void,
    ) -> i32 {
        in_context(F::CuGraphAddEventWaitNode, || {
            // SAFETY: as in `cuGraphAddEmptyNode`.
            bridge::runtime(|| unsafe { cudart::cudaGraphAddEventWaitNode(node, graph, deps, count, event) })
        })
    }

    unsafe fn cuGraphConditionalHandleCreate(
        out: *mut u64,
        graph: *mut c_void,
        _ctx: u64,
        default: u32,
        flags: u32,
    ) -> i32 {
        in_context(F::CuGraphConditionalHandleCreate, || {
            // The context names a device, whose memory is the session's: the cell is the
            // calling device's.
            // SAFETY: `out` null or writable (this export's contract).
            bridge::from_runtime(unsafe {
                rt_graphs::conditional_handle_create(out, graph as usize as u64, default, flags)
            })
        })
    }

    unsafe fn cuGraphClone(out: *mut *mut c_void, graph: *mut c_void) -> i32 {
        in_context(F::CuGraphClone, || {
            // SAFETY: `out` null or writable (this export's contract), as the runtime's takes.
            bridge::runtime(|| unsafe { cudart::cudaGraphClone(out, graph) })
        })
    }

    unsafe fn cuGraphNodeGetType(node: *mut c_void, kind: *mut i32) -> i32 {
        in_context(F::CuGraphNodeGetType, || {
            // SAFETY: `kind` null or writable (this export's contract); `CUgraphNodeType` numbers its types as `cudaGraphNodeType` does.
            bridge::runtime(|| unsafe { cudart::cudaGraphNodeGetType(node, kind) })
        })
    }

    unsafe fn cuGraphDestroyNode(node: *mut c_void) -> i32 {
        in_context(F::CuGraphDestroyNode, || {
            // SAFETY: a handle, which the server checks.
            bridge::runtime(|| unsafe { cudart::cudaGraphDestroyNode(node) })
        })
    }

    unsafe fn cuGraphChildGraphNodeGetGraph(node: *mut c_void, out: *mut *mut c_void) -> i32 {
        in_context(F::CuGraphChildGraphNodeGetGraph, || {
            // SAFETY: `out` null or writable (this export's contract), as the runtime's takes.
            bridge::runtime(|| unsafe { cudart::cudaGraphChildGraphNodeGetGraph(node, out) })
        })
    }

    unsafe fn cuGraphEventRecordNodeGetEvent(node: *mut c_void, out: *mut *mut c_void) -> i32 {
        in_context(F::CuGraphEventRecordNodeGetEvent, || {
            // SAFETY: as in `cuGraphChildGraphNodeGetGraph`.
            bridge::runtime(|| unsafe { cudart::cudaGraphEventRecordNodeGetEvent(node, out) })
        })
    }

    unsafe fn cuGraphEventWaitNodeGetEvent(node: *mut c_void, out: *mut *mut c_void) -> i32 {
        in_context(F::CuGraphEventWaitNodeGetEvent, || {
            // SAFETY: as in `cuGraphChildGraphNodeGetGraph`.
            bridge::runtime(|| unsafe { cudart::cudaGraphEventWaitNodeGetEvent(node, out) })
        })
    }

    unsafe fn cuGraphEventRecordNodeSetEvent(node: *mut c_void, event: *mut c_void) -> i32 {
        in_context(F::CuGraphEventRecordNodeSetEvent, || {
            // SAFETY: handles, which the server checks.
            bridge::runtime(|| unsafe { cudart::cudaGraphEventRecordNodeSetEvent(node, event) })
        })
    }

    unsafe fn cuGraphEventWaitNodeSetEvent(node: *mut c_void, event: *mut c_void) -> i32 {
        in_context(F::CuGraphEventWaitNodeSetEvent, || {
            // SAFETY: handles, which the server checks.
            bridge::runtime(|| unsafe { cudart::cudaGraphEventWaitNodeSetEvent(node, event) })
        })
    }

    unsafe fn cuGraphExecChildGraphNodeSetParams(exec: *mut c_void, node: *mut c_void, child: *mut c_void) -> i32 {
        in_context(F::CuGraphExecChildGraphNodeSetParams, || {
            // SAFETY: handles, which the server checks.
            bridge::runtime(|| unsafe { cudart::cudaGraphExecChildGraphNodeSetParams(exec, node, child) })
        })
    }

    unsafe fn cuGraphExecEventRecordNodeSetEvent(exec: *mut c_void, node: *mut c_void, event: *mut c_void) -> i32 {
        in_context(F::CuGraphExecEventRecordNodeSetEvent, || {
            // SAFETY: handles, which the server checks.
            bridge::runtime(|| unsafe { cudart::cudaGraphExecEventRecordNodeSetEvent(exec, node, event) })
        })
    }

    unsafe fn cuGraphExecEventWaitNodeSetEvent(exec: *mut c_void, node: *mut c_void, event: *mut c_void) -> i32 {
        in_context(F::CuGraphExecEventWaitNodeSetEvent, || {
            // SAFETY: handles, which the server checks.
            bridge::runtime(|| unsafe { cudart::cudaGraphExecEventWaitNodeSetEvent(exec, node, event) })
        })
    }

    unsafe fn cuGraphExecGetFlags(exec: *mut c_void, flags: *mut u64) -> i32 {
        in_context(F::CuGraphExecGetFlags, || {
            // SAFETY: `flags` null or writable (this export's contract), as the runtime's takes.
            bridge::runtime(|| unsafe { cudart::cudaGraphExecGetFlags(exec, flags) })
        })
    }

    unsafe fn cuGraphExecHostNodeSetParams(exec: *mut c_void, node: *mut c_void, params: *const c_void) -> i32 {
        in_context(F::CuGraphExecHostNodeSetParams, || {
            // SAFETY: `params` a `CUDA_HOST_NODE_PARAMS`, which is `cudaHostNodeParams` (this export's contract).
            bridge::runtime(|| unsafe { cudart::cudaGraphExecHostNodeSetParams(exec, node, params) })
        })
    }

    unsafe fn cuGraphExecMemsetNodeSetParams(
        exec: *mut c_void,
        node: *mut c_void,
        params: *const c_void,
        _ctx: u64,
    ) -> i32 {
        in_context(F::CuGraphExecMemsetNodeSetParams, || {
            // SAFETY: `params` a `CUDA_MEMSET_NODE_PARAMS`, which is `cudaMemsetParams` (this export's contract).
            bridge::runtime(|| unsafe { cudart::cudaGraphExecMemsetNodeSetParams(exec, node, params) })
        })
    }

    unsafe fn cuGraphHostNodeGetParams(node: *mut c_void, params: *mut c_void) -> i32 {
        in_context(F::CuGraphHostNodeGetParams, || {
            // SAFETY: `params` null or a writable `CUDA_HOST_NODE_PARAMS`, which is `cudaHostNodeParams`.
            bridge::runtime(|| unsafe { cudart::cudaGraphHostNodeGetParams(node, params) })
        })
    }

    unsafe fn cuGraphHostNodeSetParams(node: *mut c_void, params: *const c_void) -> i32 {
        in_context(F::CuGraphHostNodeSetParams, || {
            // SAFETY: `params` a `CUDA_HOST_NODE_PARAMS`, which is `cudaHostNodeParams`.
            bridge::runtime(|| unsafe { cudart::cudaGraphHostNodeSetParams(node, params) })
        })
    }

    unsafe fn cuGraphMemsetNodeGetParams(node: *mut c_void, params: *mut c_void) -> i32 {
        in_context(F::CuGraphMemsetNodeGetParams, || {
            // SAFETY: `params` null or a writable `CUDA_MEMSET_NODE_PARAMS`, which is `cudaMemsetParams`.
            bridge::runtime(|| unsafe { cudart::cudaGraphMemsetNodeGetParams(node, params) })
        })
    }

    unsafe fn cuGraphMemsetNodeSetParams(node: *mut c_void, params: *const c_void) -> i32 {
        in_context(F::CuGraphMemsetNodeSetParams, || {
            // SAFETY: `params` a `CUDA_MEMSET_NODE_PARAMS`, which is `cudaMemsetParams`.
            bridge::runtime(|| unsafe { cudart::cudaGraphMemsetNodeSetParams(node, params) })
        })
    }

    unsafe fn cuGraphNodeFindInClone(out: *mut *mut c_void, node: *mut c_void, clone: *mut c_void) -> i32 {
        in_context(F::CuGraphNodeFindInClone, || {
            // SAFETY: `out` null or writable (this export's contract), as the runtime's takes.
            bridge::runtime(|| unsafe { cudart::cudaGraphNodeFindInClone(out, node, clone) })
        })
    }

    unsafe fn cuGraphNodeGetEnabled(exec: *mut c_void, node: *mut c_void, enabled: *mut u32) -> i32 {
        in_context(F::CuGraphNodeGetEnabled, || {
            // SAFETY: `enabled` null or writable (this export's contract), as the runtime's takes.
            bridge::runtime(|| unsafe { cudart::cudaGraphNodeGetEnabled(exec, node, enabled) })
        })
    }

    unsafe fn cuGraphNodeSetEnabled(exec: *mut c_void, node: *mut c_void, enabled: u32) -> i32 {
        in_context(F::CuGraphNodeSetEnabled, || {
            // SAFETY: handles, which the server checks.
            bridge::runtime(|| unsafe { cudart::cudaGraphNodeSetEnabled(exec, node, enabled) })
        })
    }

    unsafe fn cuThreadExchangeStreamCaptureMode(mode: *mut i32) -> i32 {
        driver(F::CuThreadExchangeStreamCaptureMode, || {
            // SAFETY: `mode` null or readable and writable (this export's contract), as the runtime's takes.
            bridge::runtime(|| unsafe { cudart::cudaThreadExchangeStreamCaptureMode(mode) })
        })
    }

    unsafe fn cuStreamGetCaptureInfo(stream: *mut c_void, status: *mut i32, id: *mut u64) -> i32 {
        let none = std::ptr::null_mut::<*mut c_void>();
        // SAFETY: the out pointers as this export's caller gives them (null or writable).
        in_context(F::CuStreamGetCaptureInfo, || unsafe {
            graphs::capture_info(stream as u64, status, id, none, none.cast(), none.cast(), none.cast())
        })
    }

    unsafe fn cuStreamGetCaptureInfo_v2(
        stream: *mut c_void,
        status: *mut i32,
        id: *mut u64,
        graph: *mut *mut c_void,
        deps: *mut *const *mut c_void,
        count: *mut usize,
    ) -> i32 {
        let none = std::ptr::null_mut::<*const c_void>();
        // SAFETY: as in `cuStreamGetCaptureInfo`.
        in_context(F::CuStreamGetCaptureInfoV2, || unsafe {
            graphs::capture_info(stream as u64, status, id, graph, deps, none, count)
        })
    }

    unsafe fn cuStreamGetCaptureInfo_v3(
        stream: *mut c_void,
        status: *mut i32,
        id: *mut u64,
        graph: *mut *mut c_void,
        deps: *mut *const *mut c_void,
        edges: *mut *const c_void,
        count: *mut usize,
    ) -> i32 {
        // SAFETY: as in `cuStreamGetCaptureInfo`.
        in_context(F::CuStreamGetCaptureInfoV3, || unsafe {
            graphs::capture_info(stream as u64, status, id, graph, deps, edges, count)
        })
    }

    unsafe fn cuStreamUpdateCaptureDependencies(
        stream: *mut c_void,
        deps: *mut *mut c_void,
        count: usize,
        flags: u32,
    ) -> i32 {
        // SAFETY: `deps` null or holding `count` handles, as this export's caller gives it.
        in_context(F::CuStreamUpdateCaptureDependencies, || unsafe {
            graphs::update_capture_dependencies(stream as u64, deps.cast_const(), std::ptr::null(), count, flags)
        })
    }

    unsafe fn cuStreamBeginCaptureToGraph(
        stream: *mut c_void,
        graph: *mut c_void,
        deps: *const *mut c_void,
        edges: *const c_void,
        count: usize,
        mode: i32,
    ) -> i32 {
        // SAFETY: `deps` and `edges` null or holding `count` entries, as this export's caller
        // gives them.
        in_context(F::CuStreamBeginCaptureToGraph, || unsafe {
            graphs::begin_capture_to_graph(stream, graph, deps.cast(), edges.cast(), count, mode)
        })
    }

    unsafe fn cuStreamBeginCaptureToGraph_ptsz(
        stream: *mut c_void,
        graph: *mut c_void,
        deps: *const *mut c_void,
        edges: *const c_void,
        count: usize,
        mode: i32,
    ) -> i32 {
        // The null stream of a `_ptsz` entry point is the thread's default stream.
        let stream = if stream.is_null() { 2usize as *mut c_void } else { stream };
        // SAFETY: as `cuStreamBeginCaptureToGraph`'s.
        in_context(F::CuStreamBeginCaptureToGraphPtsz, || unsafe {
            graphs::begin_capture_to_graph(stream, graph, deps.cast(), edges.cast(), count, mode)
        })
    }

    unsafe fn cuStreamUpdateCaptureDependencies_v2(
        stream: *mut c_void,
        deps: *mut *mut c_void,
        edges: *const c_void,
        count: usize,
        flags: u32,
    ) -> i32 {
        // SAFETY: `deps` and `edges` null or holding `count` entries, as this export's caller
        // gives them.
        in_context(F::CuStreamUpdateCaptureDependenciesV2, || unsafe {
            graphs::update_capture_dependencies(stream as u64, deps.cast_const(), edges, count, flags)
        })
    }

    unsafe fn cuGraphInstantiate(
        exec: *mut *mut c_void,
        graph: *mut c_void,
        _error_node: *mut *mut c_void,
        _log: *mut c_char,
        _log_size: usize,
    ) -> i32 {
        // No error node or log: instantiation fails only on handles and cycles.
        in_context(F::CuGraphInstantiate, || {
            // SAFETY: `exec` null or writable (this export's contract), as the runtime's takes.
            bridge::runtime(|| unsafe { cudart::cudaGraphInstantiateWithFlags(exec, graph, 0) })
        })
    }

    unsafe fn cuGraphInstantiate_v2(
        exec: *mut *mut c_void,
        graph: *mut c_void,
        _error_node: *mut *mut c_void,
        _log: *mut c_char,
        _log_size: usize,
    ) -> i32 {
        in_context(F::CuGraphInstantiateV2, || {
            // SAFETY: as in `cuGraphInstantiate`.
            bridge::runtime(|| unsafe { cudart::cudaGraphInstantiateWithFlags(exec, graph, 0) })
        })
    }

    unsafe fn cuGraphAddKernelNode(
        node: *mut *mut c_void,
        graph: *mut c_void,
        deps: *const *mut c_void,
        count: usize,
        params: *const c_void,
    ) -> i32 {
        // SAFETY: this export's arguments, passed on (at most retyped): `graphs::add_kernel` asks of
        // them what CUDA asks of this export's caller.
        in_context(F::CuGraphAddKernelNode, || unsafe {
            graphs::add_kernel(node.cast(), graph as u64, deps.cast(), count, params, false)
        })
    }

    unsafe fn cuGraphAddKernelNode_v2(
        node: *mut *mut c_void,
        graph: *mut c_void,
        deps: *const *mut c_void,
        count: usize,
        params: *const c_void,
    ) -> i32 {
        // SAFETY: as in `cuGraphAddKernelNode`, with CUDA 12's struct.
        in_context(F::CuGraphAddKernelNodeV2, || unsafe {
            graphs::add_kernel(node.cast(), graph as u64, deps.cast(), count, params, true)
        })
    }

    unsafe fn cuGraphKernelNodeGetParams(node: *mut c_void, params: *mut c_void) -> i32 {
        // SAFETY: `params` null or a writable `CUDA_KERNEL_NODE_PARAMS_v1` (this export's contract).
        in_context(F::CuGraphKernelNodeGetParams, || unsafe { graphs::kernel_params(node as u64, params, false) })
    }

    unsafe fn cuGraphKernelNodeGetParams_v2(node: *mut c_void, params: *mut c_void) -> i32 {
        // SAFETY: `params` null or a writable CUDA 12 `CUDA_KERNEL_NODE_PARAMS` (this export's
        // contract).
        in_context(F::CuGraphKernelNodeGetParamsV2, || unsafe { graphs::kernel_params(node as u64, params, true) })
    }

    unsafe fn cuGraphKernelNodeSetParams(node: *mut c_void, params: *const c_void) -> i32 {
        // SAFETY: `params` as `cuGraphAddKernelNode` takes it (this export's contract).
        in_context(F::CuGraphKernelNodeSetParams, || unsafe { graphs::set_kernel(0, node as u64, params, false) })
    }

    unsafe fn cuGraphKernelNodeSetParams_v2(node: *mut c_void, params: *const c_void) -> i32 {
        // SAFETY: `params` as `cuGraphAddKernelNode_v2` takes it (this export's contract).
        in_context(F::CuGraphKernelNodeSetParamsV2, || unsafe { graphs::set_kernel(0, node as u64, params, true) })
    }

    unsafe fn cuGraphExecKernelNodeSetParams(exec: *mut c_void, node: *mut c_void, params: *const c_void) -> i32 {
        // SAFETY: as in `cuGraphKernelNodeSetParams`.
        in_context(F::CuGraphExecKernelNodeSetParams, || unsafe {
            graphs::set_kernel(exec_handle(exec)?, node as u64, params, false)
        })
    }

    unsafe fn cuGraphExecKernelNodeSetParams_v2(exec: *mut c_void, node: *mut c_void, params: *const c_void) -> i32 {
        // SAFETY: as in `cuGraphKernelNodeSetParams_v2`.
        in_context(F::CuGraphExecKernelNodeSetParamsV2, || unsafe {
            graphs::set_kernel(exec_handle(exec)?, node as u64, params, true)
        })
    }

    unsafe fn cuGraphAddMemcpyNode(
        node: *mut *mut c_void,
        graph: *mut c_void,
        deps: *const *mut c_void,
        count: usize,
        params: *const c_void,
        _ctx: u64,
    ) -> i32 {
        // SAFETY: this export's arguments, passed on (at most retyped): `graphs::add_memcpy` asks of
        // them what CUDA asks of this export's caller (the context is the device's).
        in_context(F::CuGraphAddMemcpyNode, || unsafe {
            graphs::add_memcpy(node.cast(), graph as u64, deps.cast(), count, params)
        })
    }

    unsafe fn cuGraphMemcpyNodeGetParams(node: *mut c_void, params: *mut c_void) -> i32 {
        // SAFETY: `params` null or a writable `CUDA_MEMCPY3D` (this export's contract).
        in_context(F::CuGraphMemcpyNodeGetParams, || unsafe { graphs::memcpy_params(node as u64, params) })
    }

    unsafe fn cuGraphMemcpyNodeSetParams(node: *mut c_void, params: *const c_void) -> i32 {
        // SAFETY: `params` as `cuGraphAddMemcpyNode` takes it (this export's contract).
        in_context(F::CuGraphMemcpyNodeSetParams, || unsafe { graphs::set_memcpy(0, node as u64, params) })
    }

    unsafe fn cuGraphExecMemcpyNodeSetParams(
        exec: *mut c_void,
        node: *mut c_void,
        params: *const c_void,
        _ctx: u64,
    ) -> i32 {
        // SAFETY: as in `cuGraphMemcpyNodeSetParams` (the context is the device's).
        in_context(F::CuGraphExecMemcpyNodeSetParams, || unsafe {
            graphs::set_memcpy(exec_handle(exec)?, node as u64, params)
        })
    }

    // User objects are the runtime's (`cudaUserObject_t`): one made with either API is retained
    // and released with the other, and by graphs of either.
    unsafe fn cuUserObjectCreate(object: *mut u64, ptr: *mut c_void, destroy: u64, initial: u32, flags: u32) -> i32 {
        driver(F::CuUserObjectCreate, || {
            // SAFETY: `object` null or writable, `destroy` null or a `CUhostFn`, which is a
            // `cudaHostFn_t` (this export's contract), as the runtime's takes them.
            bridge::runtime(|| unsafe { cudart::cudaUserObjectCreate(object, ptr, destroy, initial, flags) })
        })
    }

    unsafe fn cuUserObjectRetain(object: u64, count: u32) -> i32 {
        // SAFETY: values only.
        driver(F::CuUserObjectRetain, || bridge::runtime(|| unsafe { cudart::cudaUserObjectRetain(object, count) }))
    }

    unsafe fn cuUserObjectRelease(object: u64, count: u32) -> i32 {
        // SAFETY: values only.
        driver(F::CuUserObjectRelease, || bridge::runtime(|| unsafe { cudart::cudaUserObjectRelease(object, count) }))
    }

    unsafe fn cuGraphRetainUserObject(graph: *mut c_void, object: u64, count: u32, flags: u32) -> i32 {
        driver(F::CuGraphRetainUserObject, || {
            // SAFETY: handles and values only.
            bridge::runtime(|| unsafe { cudart::cudaGraphRetainUserObject(graph, object, count, flags) })
        })
    }

    unsafe fn cuGraphReleaseUserObject(graph: *mut c_void, object: u64, count: u32) -> i32 {
        driver(F::CuGraphReleaseUserObject, || {
            // SAFETY: handles and values only.
            bridge::runtime(|| unsafe { cudart::cudaGraphReleaseUserObject(graph, object, count) })
        })
    }

    unsafe fn cuGraphAddDependencies(
        graph: *mut c_void,
        from: *const *mut c_void,
        to: *const *mut c_void,
        count: usize,
    ) -> i32 {
        in_context(F::CuGraphAddDependencies, || {
            // SAFETY: `count` handles at `from` and at `to` (this export's contract).
            bridge::from_runtime(unsafe {
                rt_graphs::add_dependencies_with_edges(graph as u64, from.cast(), to.cast(), std::ptr::null(), count)
            })
        })
    }

    unsafe fn cuGraphAddDependencies_v2(
        graph: *mut c_void,
        from: *const *mut c_void,
        to: *const *mut c_void,
        edges: *const c_void,
        count: usize,
    ) -> i32 {
        in_context(F::CuGraphAddDependenciesV2, || {
            // SAFETY: `count` handles at `from` and at `to`, and a non-null `edges` holds `count`
            // edge data (this export's contract).
            bridge::from_runtime(unsafe {
                rt_graphs::add_dependencies_with_edges(graph as u64, from.cast(), to.cast(), edges.cast(), count)
            })
        })
    }

    unsafe fn cuGraphRemoveDependencies(
        graph: *mut c_void,
        from: *const *mut c_void,
        to: *const *mut c_void,
        count: usize,
    ) -> i32 {
        in_context(F::CuGraphRemoveDependencies, || {
            // SAFETY: `count` handles at `from` and at `to` (this export's contract).
            bridge::from_runtime(unsafe {
                rt_graphs::remove_dependencies(graph as u64, from.cast(), to.cast(), std::ptr::null(), count)
            })
        })
    }

    unsafe fn cuGraphGetEdges(
        graph: *mut c_void,
        from: *mut *mut c_void,
        to: *mut *mut c_void,
        count: *mut usize,
    ) -> i32 {
        in_context(F::CuGraphGetEdges, || {
            // SAFETY: `count` writable, non-null `from` and `to` with room for `*count` handles
            // (this export's contract).
            bridge::from_runtime(unsafe {
                rt_graphs::get_edges(graph as u64, from.cast(), to.cast(), std::ptr::null_mut(), count)
            })
        })
    }

    unsafe fn cuGraphNodeGetDependencies(node: *mut c_void, out: *mut *mut c_void, count: *mut usize) -> i32 {
        in_context(F::CuGraphNodeGetDependencies, || {
            // SAFETY: `count` writable, a non-null `out` with room for `*count` handles (this
            // export's contract).
            bridge::from_runtime(unsafe {
                rt_graphs::node_edges(node as u64, false, out.cast(), std::ptr::null_mut(), count)
            })
        })
    }

    unsafe fn cuGraphNodeGetDependentNodes(node: *mut c_void, out: *mut *mut c_void, count: *mut usize) -> i32 {
        in_context(F::CuGraphNodeGetDependentNodes, || {
            // SAFETY: as in `cuGraphNodeGetDependencies`.
            bridge::from_runtime(unsafe {
                rt_graphs::node_edges(node as u64, true, out.cast(), std::ptr::null_mut(), count)
            })
        })
    }

    unsafe fn cuGraphExecUpdate(
        exec: *mut c_void,
        graph: *mut c_void,
        error_node: *mut *mut c_void,
        result: *mut i32,
    ) -> i32 {
        // SAFETY: the out parameters of CUDA 11's form (this export's contract).
        in_context(F::CuGraphExecUpdate, || unsafe {
            graphs::exec_update(exec as u64, graph as u64, std::ptr::null_mut(), error_node.cast(), result)
        })
    }

    unsafe fn cuGraphAddNode(
        node: *mut *mut c_void,
        graph: *mut c_void,
        deps: *const *mut c_void,
        count: usize,
        params: *mut c_void,
    ) -> i32 {
        // SAFETY: this export's arguments, passed on (at most retyped): `graphs::add_node` asks of
        // them what CUDA asks of this export's caller.
        in_context(F::CuGraphAddNode, || unsafe {
            graphs::add_node(node.cast(), graph as u64, deps.cast(), std::ptr::null(), count, params)
        })
    }

    unsafe fn cuGraphAddNode_v2(
        node: *mut *mut c_void,
        graph: *mut c_void,
        deps: *const *mut c_void,
        edges: *const c_void,
        count: usize,
        params: *mut c_void,
    ) -> i32 {
        // SAFETY: as in `cuGraphAddNode`, with `count` edge data at a non-null `edges`.
        in_context(F::CuGraphAddNodeV2, || unsafe {
            graphs::add_node(node.cast(), graph as u64, deps.cast(), edges.cast(), count, params)
        })
    }

    unsafe fn cuGraphNodeGetParams(node: *mut c_void, params: *mut c_void) -> i32 {
        // SAFETY: `params` null or a writable `CUgraphNodeParams` (this export's contract).
        in_context(F::CuGraphNodeGetParams, || unsafe { graphs::get_node_params(node as u64, params) })
    }

    unsafe fn cuGraphKernelNodeSetAttribute(node: *mut c_void, attr: i32, value: *const c_void) -> i32 {
        in_context(F::CuGraphKernelNodeSetAttribute, || {
            // SAFETY: `value` null or a readable `CUkernelNodeAttrValue`, which is
            // `cudaLaunchAttributeValue` (the ids are the runtime's too).
            bridge::runtime(|| unsafe { cudart::cudaGraphKernelNodeSetAttribute(node, attr, value) })
        })
    }

    unsafe fn cuGraphKernelNodeGetAttribute(node: *mut c_void, attr: i32, value_out: *mut c_void) -> i32 {
        in_context(F::CuGraphKernelNodeGetAttribute, || {
            // SAFETY: `value_out` null or a writable `CUkernelNodeAttrValue`, as above.
            bridge::runtime(|| unsafe { cudart::cudaGraphKernelNodeGetAttribute(node, attr, value_out) })
        })
    }

    unsafe fn cuGraphKernelNodeCopyAttributes(dst: *mut c_void, src: *mut c_void) -> i32 {
        in_context(F::CuGraphKernelNodeCopyAttributes, || {
            // SAFETY: two handles, passed on.
            bridge::runtime(|| unsafe { cudart::cudaGraphKernelNodeCopyAttributes(dst, src) })
        })
    }

    unsafe fn cuGraphNodeSetParams(node: *mut c_void, params: *mut c_void) -> i32 {
        // SAFETY: `params` as `cuGraphAddNode` takes it (this export's contract).
        in_context(F::CuGraphNodeSetParams, || unsafe { graphs::set_with_params(0, node as u64, params) })
    }

    unsafe fn cuGraphExecNodeSetParams(exec: *mut c_void, node: *mut c_void, params: *mut c_void) -> i32 {
        // SAFETY: as in `cuGraphNodeSetParams`.
        in_context(F::CuGraphExecNodeSetParams, || unsafe {
            graphs::set_with_params(exec_handle(exec)?, node as u64, params)
        })
    }

    unsafe fn cuGraphAddMemAllocNode(
        node: *mut *mut c_void,
        graph: *mut c_void,
        deps: *const *mut c_void,
        count: usize,
        params: *mut c_void,
    ) -> i32 {
        in_context(F::CuGraphAddMemAllocNode, || {
            // SAFETY: as in `cuGraphAddEmptyNode`; `CUDA_MEM_ALLOC_NODE_PARAMS` is
            // `cudaMemAllocNodeParams` (same pool properties, access descriptors and numbers).
            bridge::runtime(|| unsafe { cudart::cudaGraphAddMemAllocNode(node, graph, deps, count, params) })
        })
    }

    unsafe fn cuGraphAddMemFreeNode(
        node: *mut *mut c_void,
        graph: *mut c_void,
        deps: *const *mut c_void,
        count: usize,
        dptr: u64,
    ) -> i32 {
        in_context(F::CuGraphAddMemFreeNode, || {
            // SAFETY: as in `cuGraphAddEmptyNode`; the address is checked by the server.
            bridge::runtime(|| unsafe { cudart::cudaGraphAddMemFreeNode(node, graph, deps, count, bridge::dptr(dptr)) })
        })
    }

    unsafe fn cuGraphMemAllocNodeGetParams(node: *mut c_void, params: *mut c_void) -> i32 {
        in_context(F::CuGraphMemAllocNodeGetParams, || {
            // SAFETY: `params` null or a writable `CUDA_MEM_ALLOC_NODE_PARAMS`, which is
            // `cudaMemAllocNodeParams` (this export's contract).
            bridge::runtime(|| unsafe { cudart::cudaGraphMemAllocNodeGetParams(node, params) })
        })
    }

    unsafe fn cuGraphMemFreeNodeGetParams(node: *mut c_void, dptr: *mut u64) -> i32 {
        in_context(F::CuGraphMemFreeNodeGetParams, || {
            // SAFETY: `dptr` null or a writable `CUdeviceptr`, the runtime's address (this
            // export's contract).
            bridge::runtime(|| unsafe { cudart::cudaGraphMemFreeNodeGetParams(node, dptr.cast()) })
        })
    }

    unsafe fn cuDeviceGraphMemTrim(device: i32) -> i32 {
        // SAFETY: a device ordinal, which the runtime checks.
        driver(F::CuDeviceGraphMemTrim, || bridge::runtime(|| unsafe { cudart::cudaDeviceGraphMemTrim(device) }))
    }

    unsafe fn cuDeviceGetGraphMemAttribute(device: i32, attr: i32, value: *mut c_void) -> i32 {
        driver(F::CuDeviceGetGraphMemAttribute, || {
            // SAFETY: `value` null or a writable `cuuint64_t` (this export's contract);
            // `CUgraphMem_attribute` numbers its attributes as `cudaGraphMemAttributeType` does.
            bridge::runtime(|| unsafe { cudart::cudaDeviceGetGraphMemAttribute(device, attr, value) })
        })
    }

    unsafe fn cuDeviceSetGraphMemAttribute(device: i32, attr: i32, value: *mut c_void) -> i32 {
        driver(F::CuDeviceSetGraphMemAttribute, || {
            // SAFETY: as in `cuDeviceGetGraphMemAttribute`, a readable `cuuint64_t`.
            bridge::runtime(|| unsafe { cudart::cudaDeviceSetGraphMemAttribute(device, attr, value) })
        })
    }

    unsafe fn cuGraphDebugDotPrint(graph: *mut c_void, path: *const c_char, flags: u32) -> i32 {
        in_context(F::CuGraphDebugDotPrint, || {
            // SAFETY: `path` null or NUL-terminated (this export's contract), as the runtime's takes.
            bridge::runtime(|| unsafe { cudart::cudaGraphDebugDotPrint(graph, path, flags) })
        })
    }

    unsafe fn cuGraphGetEdges_v2(
        graph: *mut c_void,
        from: *mut *mut c_void,
        to: *mut *mut c_void,
        edges: *mut c_void,
        count: *mut usize,
    ) -> i32 {
        in_context(F::CuGraphGetEdgesV2, || {
            // SAFETY: as in `cuGraphGetEdges`; a non-null `edges` with room for `*count` edge data.
            bridge::from_runtime(unsafe {
                rt_graphs::get_edges(graph as u64, from.cast(), to.cast(), edges.cast(), count)
            })
        })
    }

    unsafe fn cuGraphNodeGetDependencies_v2(
        node: *mut c_void,
        out: *mut *mut c_void,
        edges: *mut c_void,
        count: *mut usize,
    ) -> i32 {
        in_context(F::CuGraphNodeGetDependenciesV2, || {
            // SAFETY: as in `cuGraphNodeGetDependencies`; a non-null `edges` with room for
            // `*count` edge data.
            bridge::from_runtime(unsafe { rt_graphs::node_edges(node as u64, false, out.cast(), edges.cast(), count) })
        })
    }

    unsafe fn cuGraphNodeGetDependentNodes_v2(
        node: *mut c_void,
        out: *mut *mut c_void,
        edges: *mut c_void,
        count: *mut usize,
    ) -> i32 {
        in_context(F::CuGraphNodeGetDependentNodesV2, || {
            // SAFETY: as in `cuGraphNodeGetDependencies_v2`.
            bridge::from_runtime(unsafe { rt_graphs::node_edges(node as u64, true, out.cast(), edges.cast(), count) })
        })
    }

    unsafe fn cuGraphRemoveDependencies_v2(
        graph: *mut c_void,
        from: *const *mut c_void,
        to: *const *mut c_void,
        edges: *const c_void,
        count: usize,
    ) -> i32 {
        in_context(F::CuGraphRemoveDependenciesV2, || {
            // SAFETY: as in `cuGraphRemoveDependencies`; a non-null `edges` holds `count` edge data.
            bridge::from_runtime(unsafe {
                rt_graphs::remove_dependencies(graph as u64, from.cast(), to.cast(), edges.cast(), count)
            })
        })
    }

    unsafe fn cuGraphExecUpdate_v2(exec: *mut c_void, graph: *mut c_void, info: *mut c_void) -> i32 {
        in_context(F::CuGraphExecUpdateV2, || {
            if info.is_null() {
                return Err(CuError::INVALID_VALUE);
            }
            // SAFETY: a writable `CUgraphExecUpdateResultInfo` (this export's contract).
            unsafe { graphs::exec_update(exec as u64, graph as u64, info, std::ptr::null_mut(), std::ptr::null_mut()) }
        })
    }

    // CUDA arrays, texture and surface objects: the runtime's, through `arrays`.

    unsafe fn cuArrayCreate_v2(out: *mut *mut c_void, desc: *const c_void) -> i32 {
        // SAFETY: the pointers as cuArrayCreate asks of its caller.
        in_context(F::CuArrayCreateV2, || unsafe { arrays::create(out, desc, false, None) })
    }

    unsafe fn cuArray3DCreate_v2(out: *mut *mut c_void, desc: *const c_void) -> i32 {
        // SAFETY: the pointers as cuArray3DCreate asks of its caller.
        in_context(F::CuArray3DCreateV2, || unsafe { arrays::create(out, desc, true, None) })
    }

    unsafe fn cuMipmappedArrayCreate(out: *mut *mut c_void, desc: *const c_void, levels: u32) -> i32 {
        // SAFETY: the pointers as cuMipmappedArrayCreate asks of its caller.
        in_context(F::CuMipmappedArrayCreate, || unsafe { arrays::create(out, desc, true, Some(levels)) })
    }

    unsafe fn cuArrayGetDescriptor_v2(out: *mut c_void, array: *mut c_void) -> i32 {
        // SAFETY: `out` as cuArrayGetDescriptor asks of its caller; the handle is the server's to check.
        in_context(F::CuArrayGetDescriptorV2, || unsafe { arrays::describe(out, array, false) })
    }

    unsafe fn cuArray3DGetDescriptor_v2(out: *mut c_void, array: *mut c_void) -> i32 {
        // SAFETY: `out` as cuArray3DGetDescriptor asks of its caller.
        in_context(F::CuArray3DGetDescriptorV2, || unsafe { arrays::describe(out, array, true) })
    }

    unsafe fn cuArrayDestroy(array: *mut c_void) -> i32 {
        // SAFETY: a handle, which the server checks.
        in_context(F::CuArrayDestroy, || bridge::runtime(|| unsafe { cudart::cudaFreeArray(array) }))
    }

    unsafe fn cuMipmappedArrayDestroy(mipmap: *mut c_void) -> i32 {
        // SAFETY: a handle, which the server checks.
        in_context(F::CuMipmappedArrayDestroy, || bridge::runtime(|| unsafe { cudart::cudaFreeMipmappedArray(mipmap) }))
    }

    unsafe fn cuMipmappedArrayGetLevel(out: *mut *mut c_void, mipmap: *mut c_void, level: u32) -> i32 {
        in_context(F::CuMipmappedArrayGetLevel, || {
            if out.is_null() {
                return Err(CuError::INVALID_VALUE);
            }
            // SAFETY: `out` is a writable `CUarray` (not null; this export's contract); the
            // handle is the server's to check.
            bridge::runtime(|| unsafe { cudart::cudaGetMipmappedArrayLevel(out, mipmap, level) })
        })
    }

    unsafe fn cuMemcpy2D_v2(copy: *const c_void) -> i32 {
        // SAFETY: a `CUDA_MEMCPY2D` as cuMemcpy2D asks of its caller.
        in_context(F::CuMemcpy2DV2, || unsafe { arrays::memcpy_2d(copy, None) })
    }

    unsafe fn cuMemcpy2DUnaligned_v2(copy: *const c_void) -> i32 {
        // SAFETY: as in `cuMemcpy2D_v2`.
        in_context(F::CuMemcpy2DUnalignedV2, || unsafe { arrays::memcpy_2d(copy, None) })
    }

    unsafe fn cuMemcpy2DAsync_v2(copy: *const c_void, stream: *mut c_void) -> i32 {
        // SAFETY: as in `cuMemcpy2D_v2`; the stream is the server's to check.
        in_context(F::CuMemcpy2DAsyncV2, || unsafe { arrays::memcpy_2d(copy, Some(stream as u64)) })
    }

    unsafe fn cuMemcpy3D_v2(copy: *const c_void) -> i32 {
        // SAFETY: a `CUDA_MEMCPY3D` as cuMemcpy3D asks of its caller.
        in_context(F::CuMemcpy3DV2, || unsafe { arrays::memcpy_3d(copy, None) })
    }

    unsafe fn cuMemcpy3DAsync_v2(copy: *const c_void, stream: *mut c_void) -> i32 {
        // SAFETY: as in `cuMemcpy3D_v2`; the stream is the server's to check.
        in_context(F::CuMemcpy3DAsyncV2, || unsafe { arrays::memcpy_3d(copy, Some(stream as u64)) })
    }

    unsafe fn cuMemcpyHtoA_v2(array: *mut c_void, offset: usize, src: *const c_void, count: usize) -> i32 {
        // SAFETY: `src` is `count` readable bytes (this export's contract).
        in_context(F::CuMemcpyHtoAV2, || unsafe { arrays::to_array(array, offset, src, count, false, None) })
    }

    unsafe fn cuMemcpyHtoAAsync_v2(
        array: *mut c_void,
        offset: usize,
        src: *const c_void,
        count: usize,
        stream: *mut c_void,
    ) -> i32 {
        // SAFETY: as in `cuMemcpyHtoA_v2`.
        in_context(F::CuMemcpyHtoAAsyncV2, || unsafe {
            arrays::to_array(array, offset, src, count, false, Some(stream as u64))
        })
    }

    unsafe fn cuMemcpyDtoA_v2(array: *mut c_void, offset: usize, src: u64, count: usize) -> i32 {
        // SAFETY: a device source, which the server checks.
        in_context(F::CuMemcpyDtoAV2, || unsafe { arrays::to_array(array, offset, dptr(src), count, true, None) })
    }

    unsafe fn cuMemcpyAtoH_v2(dst: *mut c_void, array: *mut c_void, offset: usize, count: usize) -> i32 {
        // SAFETY: `dst` is `count` writable bytes (this export's contract).
        in_context(F::CuMemcpyAtoHV2, || unsafe { arrays::from_array(dst, array, offset, count, false, None) })
    }

    unsafe fn cuMemcpyAtoHAsync_v2(
        dst: *mut c_void,
        array: *mut c_void,
        offset: usize,
        count: usize,
        stream: *mut c_void,
    ) -> i32 {
        // SAFETY: as in `cuMemcpyAtoH_v2`.
        in_context(F::CuMemcpyAtoHAsyncV2, || unsafe {
            arrays::from_array(dst, array, offset, count, false, Some(stream as u64))
        })
    }

    unsafe fn cuMemcpyAtoD_v2(dst: u64, array: *mut c_void, offset: usize, count: usize) -> i32 {
        // SAFETY: a device destination, which the server checks.
        in_context(F::CuMemcpyAtoDV2, || unsafe { arrays::from_array(dptr(dst), array, offset, count, true, None) })
    }

    unsafe fn cuMemcpyAtoA_v2(
        dst: *mut c_void,
        dst_offset: usize,
        src: *mut c_void,
        src_offset: usize,
        count: usize,
    ) -> i32 {
        in_context(F::CuMemcpyAtoAV2, || arrays::array_to_array(dst, dst_offset, src, src_offset, count))
    }

    unsafe fn cuTexObjectCreate(out: *mut u64, res: *const c_void, tex: *const c_void, view: *const c_void) -> i32 {
        // SAFETY: the descriptors as cuTexObjectCreate asks of its caller.
        in_context(F::CuTexObjectCreate, || unsafe { arrays::create_texture(out, res, tex, view) })
    }

    unsafe fn cuTexObjectDestroy(object: u64) -> i32 {
        // SAFETY: a value, which the server checks.
        in_context(F::CuTexObjectDestroy, || bridge::runtime(|| unsafe { cudart::cudaDestroyTextureObject(object) }))
    }

    unsafe fn cuTexObjectGetResourceDesc(out: *mut c_void, object: u64) -> i32 {
        // SAFETY: `out` as the query asks of its caller.
        in_context(F::CuTexObjectGetResourceDesc, || unsafe { arrays::texture_resource(out, object) })
    }

    unsafe fn cuTexObjectGetTextureDesc(out: *mut c_void, object: u64) -> i32 {
        // SAFETY: `out` as the query asks of its caller.
        in_context(F::CuTexObjectGetTextureDesc, || unsafe { arrays::texture_desc_of(out, object) })
    }

    unsafe fn cuTexObjectGetResourceViewDesc(out: *mut c_void, object: u64) -> i32 {
        // SAFETY: `out` as the query asks of its caller.
        in_context(F::CuTexObjectGetResourceViewDesc, || unsafe { arrays::texture_view(out, object) })
    }

    unsafe fn cuSurfObjectCreate(out: *mut u64, res: *const c_void) -> i32 {
        // SAFETY: the pointers as cuSurfObjectCreate asks of its caller.
        in_context(F::CuSurfObjectCreate, || unsafe { arrays::create_surface(out, res) })
    }

    unsafe fn cuSurfObjectDestroy(object: u64) -> i32 {
        // SAFETY: a value, which the server checks.
        in_context(F::CuSurfObjectDestroy, || bridge::runtime(|| unsafe { cudart::cudaDestroySurfaceObject(object) }))
    }

    unsafe fn cuSurfObjectGetResourceDesc(out: *mut c_void, object: u64) -> i32 {
        // SAFETY: `out` as the query asks of its caller.
        in_context(F::CuSurfObjectGetResourceDesc, || unsafe { arrays::surface_resource(out, object) })
    }

    // ---- Context and device queries: the runtime's (its limits, cache and shared memory
    // configurations, peers, PCI ids, pools), queries.rs and context.rs

    // The profiler's start and stop, as the runtime's: Phos runs no profiler of its own.
    unsafe fn cuProfilerStart() -> i32 {
        in_context(F::CuProfilerStart, || Ok(()))
    }

    unsafe fn cuProfilerStop() -> i32 {
        in_context(F::CuProfilerStop, || Ok(()))
    }

    unsafe fn cuCtxResetPersistingL2Cache() -> i32 {
        in_context(F::CuCtxResetPersistingL2Cache, || {
            // SAFETY: the runtime's takes no arguments.
            bridge::runtime(|| unsafe { cudart::cudaCtxResetPersistingL2Cache() })
        })
    }

    unsafe fn cuFlushGPUDirectRDMAWrites(target: i32, scope: i32) -> i32 {
        in_context(F::CuFlushGPUDirectRDMAWrites, || {
            // CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TARGET_CURRENT_CTX; scopes TO_OWNER and
            // TO_ALL_DEVICES.
            if target != 0 || !matches!(scope, 100 | 200) {
                return Err(CuError::INVALID_VALUE);
            }
            runtime::call(&cuda::PhosFlushGPUDirectRDMAWritesRequest { target, scope })?;
            Ok(())
        })
    }

    /// A context Phos makes has no execution affinity: it may use every SM of its device,
    /// which is what `CU_EXEC_AFFINITY_TYPE_SM_COUNT` answers.
    unsafe fn cuCtxGetExecAffinity(out: *mut c_void, kind: i32) -> i32 {
        in_context(F::CuCtxGetExecAffinity, || {
            if out.is_null() || kind != 0 {
                return Err(CuError::INVALID_VALUE);
            }
            let dev = context::current_device()?;
            // CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT.
            let sms = runtime::call(&cuda::CuDeviceGetAttributeRequest { attrib: 16, dev })?.pi;
            // SAFETY: a writable `CUexecAffinityParam` at the non-null `out` (this export's
            // contract): its type, then its `smCount`.
            unsafe { out.cast::<[i32; 2]>().write_unaligned([kind, sms]) };
            Ok(())
        })
    }

    unsafe fn cuCtxGetLimit(value: *mut usize, limit: i32) -> i32 {
        // SAFETY: `value` null or writable (this export's contract), as the runtime's takes.
        in_context(F::CuCtxGetLimit, || bridge::runtime(|| unsafe { cudart::cudaDeviceGetLimit(value, limit) }))
    }

    unsafe fn cuCtxSetLimit(limit: i32, value: usize) -> i32 {
        // SAFETY: values only.
        in_context(F::CuCtxSetLimit, || bridge::runtime(|| unsafe { cudart::cudaDeviceSetLimit(limit, value) }))
    }

    unsafe fn cuCtxGetCacheConfig(config: *mut i32) -> i32 {
        in_context(F::CuCtxGetCacheConfig, || {
            // SAFETY: `config` null or writable (this export's contract), as the runtime's takes.
            bridge::runtime(|| unsafe { cudart::cudaDeviceGetCacheConfig(config) })
        })
    }

    unsafe fn cuCtxSetCacheConfig(config: i32) -> i32 {
        // SAFETY: a value only.
        in_context(F::CuCtxSetCacheConfig, || bridge::runtime(|| unsafe { cudart::cudaDeviceSetCacheConfig(config) }))
    }

    unsafe fn cuCtxGetSharedMemConfig(config: *mut i32) -> i32 {
        in_context(F::CuCtxGetSharedMemConfig, || {
            // SAFETY: `config` null or writable (this export's contract), as the runtime's takes.
            bridge::runtime(|| unsafe { cudart::cudaDeviceGetSharedMemConfig(config) })
        })
    }

    unsafe fn cuCtxSetSharedMemConfig(config: i32) -> i32 {
        in_context(F::CuCtxSetSharedMemConfig, || {
            // SAFETY: a value only.
            bridge::runtime(|| unsafe { cudart::cudaDeviceSetSharedMemConfig(config) })
        })
    }

    unsafe fn cuCtxGetId(ctx: u64, id: *mut u64) -> i32 {
        driver(F::CuCtxGetId, || {
            if id.is_null() {
                return Err(CuError::INVALID_VALUE);
            }
            // SAFETY: not null, writable (this export's contract).
            unsafe { put(id, context::id(ctx)?) }
        })
    }

    unsafe fn cuCtxSetFlags(flags: u32) -> i32 {
        driver(F::CuCtxSetFlags, || context::set_flags_of_current(flags))
    }

    /// All the context's work so far: the device's, once done, then the event recorded in the
    /// legacy stream (which has nothing left before it by then).
    unsafe fn cuCtxRecordEvent(ctx: u64, event: *mut c_void) -> i32 {
        driver(F::CuCtxRecordEvent, || {
            let device = context::device_of(ctx)?;
            if event.is_null() {
                return Err(CuError::INVALID_HANDLE);
            }
            // On the context's device, whichever is current (put back after).
            let current = crate::runtime::current_device();
            crate::runtime::set_current_device(device);
            // SAFETY: cudaDeviceSynchronize takes no arguments.
            let r = bridge::runtime(|| unsafe { cudart::cudaDeviceSynchronize() }).and_then(|_| {
                let legacy = STREAM_LEGACY as usize as *mut c_void;
                // SAFETY: handles, which the server checks.
                bridge::runtime(|| unsafe { cudart::cudaEventRecord(event, legacy) })
            });
            crate::runtime::set_current_device(current);
            r
        })
    }

    /// Work submitted to the context after this call starts once the event's work is done:
    /// the call returns then.
    unsafe fn cuCtxWaitEvent(ctx: u64, event: *mut c_void) -> i32 {
        driver(F::CuCtxWaitEvent, || {
            context::device_of(ctx)?;
            if event.is_null() {
                return Err(CuError::INVALID_HANDLE);
            }
            // SAFETY: a handle, which the server checks.
            bridge::runtime(|| unsafe { cudart::cudaEventSynchronize(event) })
        })
    }

    unsafe fn cuDeviceCanAccessPeer(can: *mut i32, dev: i32, peer: i32) -> i32 {
        driver(F::CuDeviceCanAccessPeer, || {
            // SAFETY: `can` null or writable (this export's contract), as the runtime's takes.
            bridge::runtime(|| unsafe { cudart::cudaDeviceCanAccessPeer(can, dev, peer) })
        })
    }

    unsafe fn cuDeviceGetP2PAttribute(value: *mut i32, attrib: i32, src: i32, dst: i32) -> i32 {
        // The attributes have the runtime's numbers.
        driver(F::CuDeviceGetP2PAttribute, || {
            // SAFETY: `value` null or writable (this export's contract), as the runtime's takes.
            bridge::runtime(|| unsafe { cudart::cudaDeviceGetP2PAttribute(value, attrib, src, dst) })
        })
    }

    unsafe fn cuCtxEnablePeerAccess(peer: u64, flags: u32) -> i32 {
        in_context(F::CuCtxEnablePeerAccess, || {
            let device = context::device_of(peer)?;
            // SAFETY: values only.
            bridge::runtime(|| unsafe { cudart::cudaDeviceEnablePeerAccess(device, flags) })
        })
    }

    unsafe fn cuCtxDisablePeerAccess(peer: u64) -> i32 {
        in_context(F::CuCtxDisablePeerAccess, || {
            let device = context::device_of(peer)?;
            // SAFETY: a value only.
            bridge::runtime(|| unsafe { cudart::cudaDeviceDisablePeerAccess(device) })
        })
    }

    unsafe fn cuDeviceGetPCIBusId(bus_id: *mut c_char, len: i32, dev: i32) -> i32 {
        driver(F::CuDeviceGetPCIBusId, || {
            // SAFETY: `bus_id` null or `len` writable bytes (this export's contract), as the
            // runtime's takes.
            bridge::runtime(|| unsafe { cudart::cudaDeviceGetPCIBusId(bus_id, len, dev) })
        })
    }

    unsafe fn cuDeviceGetByPCIBusId(dev: *mut i32, bus_id: *const c_char) -> i32 {
        driver(F::CuDeviceGetByPCIBusId, || {
            // SAFETY: `dev` null or writable, `bus_id` null or NUL-terminated (this export's
            // contract), as the runtime's takes.
            bridge::runtime(|| unsafe { cudart::cudaDeviceGetByPCIBusId(dev, bus_id) })
        })
    }

    unsafe fn cuDeviceGetUuid(uuid: *mut c_void, dev: i32) -> i32 {
        // SAFETY: `uuid` null or 16 writable bytes (this export's contract).
        driver(F::CuDeviceGetUuid, || unsafe { put(uuid.cast(), queries::properties(dev)?.uuid) })
    }

    unsafe fn cuDeviceGetUuid_v2(uuid: *mut c_void, dev: i32) -> i32 {
        // SAFETY: as in `cuDeviceGetUuid`.
        driver(F::CuDeviceGetUuidV2, || unsafe { put(uuid.cast(), queries::properties(dev)?.uuid) })
    }

    /// The legacy export writes an `unsigned int`: the size, at most 4 GiB - 1.
    unsafe fn cuDeviceTotalMem(bytes: *mut u32, dev: i32) -> i32 {
        driver(F::CuDeviceTotalMem, || {
            let total = queries::properties(dev)?.total_global_mem;
            // SAFETY: `bytes` null or writable (this export's contract).
            unsafe { put(bytes, u32::try_from(total).unwrap_or(u32::MAX)) }
        })
    }

    unsafe fn cuDeviceComputeCapability(major: *mut i32, minor: *mut i32, dev: i32) -> i32 {
        driver(F::CuDeviceComputeCapability, || {
            if major.is_null() || minor.is_null() {
                return Err(CuError::INVALID_VALUE);
            }
            let (ma, mi) = queries::compute_capability(dev)?;
            // SAFETY: not null, writable (this export's contract).
            unsafe { put(major, ma) }?;
            // SAFETY: as `major`.
            unsafe { put(minor, mi) }
        })
    }

    unsafe fn cuDeviceGetProperties(prop: *mut c_void, dev: i32) -> i32 {
        // SAFETY: `prop` null or a writable `CUdevprop`, fourteen `int`s (this export's contract).
        driver(F::CuDeviceGetProperties, || unsafe { put(prop.cast(), queries::devprop(dev)?) })
    }

    unsafe fn cuDeviceGetTexture1DLinearMaxWidth(width: *mut usize, format: i32, channels: u32, dev: i32) -> i32 {
        driver(F::CuDeviceGetTexture1DLinearMaxWidth, || {
            let desc = arrays::channel_desc(format as u32, channels)?;
            // SAFETY: `width` null or writable (this export's contract), a channel description
            // that lives across the call.
            bridge::runtime(|| unsafe { cudart::cudaDeviceGetTexture1DLinearMaxWidth(width, &desc, dev) })
        })
    }

    unsafe fn cuDeviceGetDefaultMemPool(pool: *mut u64, dev: i32) -> i32 {
        driver(F::CuDeviceGetDefaultMemPool, || {
            // SAFETY: `pool` null or writable (this export's contract), as the runtime's takes.
            bridge::runtime(|| unsafe { cudart::cudaDeviceGetDefaultMemPool(pool, dev) })
        })
    }

    unsafe fn cuDeviceGetMemPool(pool: *mut u64, dev: i32) -> i32 {
        driver(F::CuDeviceGetMemPool, || {
            // SAFETY: as in `cuDeviceGetDefaultMemPool`.
            bridge::runtime(|| unsafe { cudart::cudaDeviceGetMemPool(pool, dev) })
        })
    }

    unsafe fn cuDeviceSetMemPool(dev: i32, pool: u64) -> i32 {
        // SAFETY: values only (the pool is checked by the runtime's code).
        driver(F::CuDeviceSetMemPool, || bridge::runtime(|| unsafe { cudart::cudaDeviceSetMemPool(dev, pool) }))
    }

    unsafe fn cuMemGetAccess(flags: *mut u64, location: *const c_void, ptr: u64) -> i32 {
        driver(F::CuMemGetAccess, || {
            if flags.is_null() {
                return Err(CuError::INVALID_VALUE);
            }
            // SAFETY: `location` null or a readable `CUmemLocation` (this export's contract).
            let access = unsafe { vmm::get_access(location, ptr) }?;
            // SAFETY: not null, writable (this export's contract).
            unsafe { put(flags, access) }
        })
    }

    unsafe fn cuMemRetainAllocationHandle(handle: *mut u64, addr: *mut c_void) -> i32 {
        driver(F::CuMemRetainAllocationHandle, || {
            if handle.is_null() {
                return Err(CuError::INVALID_VALUE);
            }
            // SAFETY: not null, writable (this export's contract).
            unsafe { put(handle, vmm::retain_handle(addr as u64)?) }
        })
    }

    // ---- Functions and modules (modules.rs, queries.rs)

    unsafe fn cuFuncGetName(name: *mut *const c_char, hfunc: *mut c_void) -> i32 {
        // SAFETY: `name` null or writable (this export's contract).
        driver(F::CuFuncGetName, || unsafe { function_name(name, hfunc) })
    }

    unsafe fn cuKernelGetName(name: *mut *const c_char, kernel: *mut c_void) -> i32 {
        // A kernel is its module's function here.
        // SAFETY: as in `cuFuncGetName`.
        driver(F::CuKernelGetName, || unsafe { function_name(name, kernel) })
    }

    unsafe fn cuFuncGetParamInfo(hfunc: *mut c_void, index: usize, offset: *mut usize, size: *mut usize) -> i32 {
        // SAFETY: `offset` null or writable, `size` null or writable (this export's contract).
        driver(F::CuFuncGetParamInfo, || unsafe { param_info(hfunc, index, offset, size) })
    }

    unsafe fn cuKernelGetParamInfo(kernel: *mut c_void, index: usize, offset: *mut usize, size: *mut usize) -> i32 {
        // SAFETY: as in `cuFuncGetParamInfo`.
        driver(F::CuKernelGetParamInfo, || unsafe { param_info(kernel, index, offset, size) })
    }

    /// Every function is loaded once its handle exists (Phos loads a module's kernels with it).
    unsafe fn cuFuncIsLoaded(state: *mut i32, hfunc: *mut c_void) -> i32 {
        const LOADED: i32 = 1;
        driver(F::CuFuncIsLoaded, || {
            if state.is_null() {
                return Err(CuError::INVALID_VALUE);
            }
            modules::known(hfunc as u64)?;
            // SAFETY: not null, writable (this export's contract).
            unsafe { put(state, LOADED) }
        })
    }

    unsafe fn cuFuncLoad(hfunc: *mut c_void) -> i32 {
        driver(F::CuFuncLoad, || modules::known(hfunc as u64).map(|_| ()))
    }

    unsafe fn cuFuncGetModule(module: *mut *mut c_void, hfunc: *mut c_void) -> i32 {
        driver(F::CuFuncGetModule, || {
            if module.is_null() {
                return Err(CuError::INVALID_VALUE);
            }
            let Some(m) = modules::module_of(hfunc as u64) else {
                modules::known(hfunc as u64)?;
                return Err(not_carried("cuFuncGetModule", "the module of a kernel the runtime registered"));
            };
            // SAFETY: not null, writable (this export's contract).
            unsafe { put(module, m as usize as *mut c_void) }
        })
    }

    unsafe fn cuModuleGetFunctionCount(count: *mut u32, module: *mut c_void) -> i32 {
        driver(F::CuModuleGetFunctionCount, || {
            if count.is_null() {
                return Err(CuError::INVALID_VALUE);
            }
            let n = modules::kernel_names(module as u64)?.len();
            // SAFETY: not null, writable (this export's contract).
            unsafe { put(count, u32::try_from(n).unwrap_or(u32::MAX)) }
        })
    }

    unsafe fn cuModuleEnumerateFunctions(functions: *mut *mut c_void, max: u32, module: *mut c_void) -> i32 {
        driver(F::CuModuleEnumerateFunctions, || {
            if functions.is_null() || max == 0 {
                return Err(CuError::INVALID_VALUE);
            }
            let names = modules::kernel_names(module as u64)?;
            for (i, name) in names.iter().take(max as usize).enumerate() {
                let f = modules::function(module as u64, name)?;
                // SAFETY: `i < max`: within the room for `max` handles (this export's contract).
                unsafe { functions.wrapping_add(i).write_unaligned(f as usize as *mut c_void) };
            }
            Ok(())
        })
    }

    /// `CU_MODULE_LAZY_LOADING` unless the program asked for eager loading
    /// (`CUDA_MODULE_LOADING=EAGER`), as NVIDIA's driver answers; Phos loads a module whole
    /// either way.
    unsafe fn cuModuleGetLoadingMode(mode: *mut i32) -> i32 {
        const EAGER: i32 = 1;
        const LAZY: i32 = 2;
        driver(F::CuModuleGetLoadingMode, || {
            let eager = std::env::var("CUDA_MODULE_LOADING").is_ok_and(|v| v == "EAGER");
            // SAFETY: `mode` null or writable (this export's contract).
            unsafe { put(mode, if eager { EAGER } else { LAZY }) }
        })
    }

    /// Deprecated: the bank size is the device's; a valid configuration of a valid function is
    /// accepted.
    unsafe fn cuFuncSetSharedMemConfig(hfunc: *mut c_void, config: i32) -> i32 {
        in_context(F::CuFuncSetSharedMemConfig, || {
            modules::known(hfunc as u64)?;
            if (0..=2).contains(&config) { Ok(()) } else { Err(CuError::INVALID_VALUE) }
        })
    }

    unsafe fn cuOccupancyMaxPotentialBlockSize(
        min_grid: *mut i32,
        block_size: *mut i32,
        func: *mut c_void,
        smem_of: u64,
        dynamic_smem: usize,
        limit: i32,
    ) -> i32 {
        in_context(F::CuOccupancyMaxPotentialBlockSize, || {
            // SAFETY: the out parameters null or writable, `smem_of` null or the program's
            // function of the driver's type (this export's contract).
            unsafe { potential_block_size(min_grid, block_size, func, smem_of, dynamic_smem, limit, 0) }
        })
    }

    unsafe fn cuOccupancyMaxPotentialBlockSizeWithFlags(
        min_grid: *mut i32,
        block_size: *mut i32,
        func: *mut c_void,
        smem_of: u64,
        dynamic_smem: usize,
        limit: i32,
        flags: u32,
    ) -> i32 {
        in_context(F::CuOccupancyMaxPotentialBlockSizeWithFlags, || {
            // SAFETY: as in `cuOccupancyMaxPotentialBlockSize`.
            unsafe { potential_block_size(min_grid, block_size, func, smem_of, dynamic_smem, limit, flags) }
        })
    }

    unsafe fn cuOccupancyAvailableDynamicSMemPerBlock(
        size: *mut usize,
        func: *mut c_void,
        num_blocks: i32,
        block_size: i32,
    ) -> i32 {
        in_context(F::CuOccupancyAvailableDynamicSMemPerBlock, || {
            if size.is_null() {
                return Err(CuError::INVALID_VALUE);
            }
            let bytes = modules::available_dynamic_smem(func as u64, num_blocks, block_size)?;
            // SAFETY: not null, writable (this export's contract).
            unsafe { put(size, usize::try_from(bytes).unwrap_or(usize::MAX)) }
        })
    }

    unsafe fn cuOccupancyMaxActiveClusters(num: *mut i32, func: *mut c_void, config: *const c_void) -> i32 {
        in_context(F::CuOccupancyMaxActiveClusters, || {
            if num.is_null() {
                return Err(CuError::INVALID_VALUE);
            }
            // SAFETY: `config` null or a `CUlaunchConfig` (this export's contract).
            let n = unsafe { modules::max_active_clusters(func as u64, config, false) }?;
            // SAFETY: not null, writable (this export's contract).
            unsafe { put(num, n) }
        })
    }

    unsafe fn cuOccupancyMaxPotentialClusterSize(size: *mut i32, func: *mut c_void, config: *const c_void) -> i32 {
        in_context(F::CuOccupancyMaxPotentialClusterSize, || {
            if size.is_null() {
                return Err(CuError::INVALID_VALUE);
            }
            // SAFETY: as in `cuOccupancyMaxActiveClusters`.
            let n = unsafe { modules::max_potential_cluster_size(func as u64, config, false) }?;
            // SAFETY: not null, writable (this export's contract).
            unsafe { put(size, n) }
        })
    }

    // ---- Streams and events: the runtime's (stream attributes, ids, host functions)

    unsafe fn cuStreamGetAttribute(stream: *mut c_void, attr: i32, value: *mut c_void) -> i32 {
        // The attributes and their values have the runtime's numbers and layout.
        in_context(F::CuStreamGetAttribute, || {
            // SAFETY: `value` null or a writable `CUstreamAttrValue` (this export's contract).
            bridge::runtime(|| unsafe { cudart::cudaStreamGetAttribute(stream, attr, value) })
        })
    }

    unsafe fn cuStreamSetAttribute(stream: *mut c_void, attr: i32, value: *const c_void) -> i32 {
        in_context(F::CuStreamSetAttribute, || {
            // SAFETY: `value` null or a readable `CUstreamAttrValue` (this export's contract).
            bridge::runtime(|| unsafe { cudart::cudaStreamSetAttribute(stream, attr, value) })
        })
    }

    unsafe fn cuStreamCopyAttributes(dst: *mut c_void, src: *mut c_void) -> i32 {
        in_context(F::CuStreamCopyAttributes, || {
            // SAFETY: handles, which the runtime's code checks.
            bridge::runtime(|| unsafe { cudart::cudaStreamCopyAttributes(dst, src) })
        })
    }

    unsafe fn cuStreamGetCtx(stream: *mut c_void, ctx: *mut u64) -> i32 {
        driver(F::CuStreamGetCtx, || {
            if ctx.is_null() {
                return Err(CuError::INVALID_VALUE);
            }
            // SAFETY: not null, writable (this export's contract).
            unsafe { put(ctx, queries::stream_context(stream)?) }
        })
    }

    /// No stream belongs to a green context here: `*pGreenCtx` is null.
    unsafe fn cuStreamGetCtx_v2(stream: *mut c_void, ctx: *mut u64, green: *mut u64) -> i32 {
        driver(F::CuStreamGetCtxV2, || {
            if ctx.is_null() || green.is_null() {
                return Err(CuError::INVALID_VALUE);
            }
            let c = queries::stream_context(stream)?;
            // SAFETY: not null, writable (this export's contract).
            unsafe { put(ctx, c) }?;
            // SAFETY: as `ctx`.
            unsafe { put(green, 0) }
        })
    }

    unsafe fn cuStreamGetId(stream: *mut c_void, id: *mut u64) -> i32 {
        // SAFETY: `id` null or writable (this export's contract), as the runtime's takes.
        in_context(F::CuStreamGetId, || bridge::runtime(|| unsafe { cudart::cudaStreamGetId(stream, id) }))
    }

    unsafe fn cuStreamGetDevice(stream: *mut c_void, device: *mut i32) -> i32 {
        // SAFETY: `device` null or writable (this export's contract), as the runtime's takes.
        in_context(F::CuStreamGetDevice, || bridge::runtime(|| unsafe { cudart::cudaStreamGetDevice(stream, device) }))
    }

    unsafe fn cuEventRecordWithFlags(event: *mut c_void, stream: *mut c_void, flags: u32) -> i32 {
        in_context(F::CuEventRecordWithFlags, || {
            // SAFETY: handles, which the server checks.
            bridge::runtime(|| unsafe { cudart::cudaEventRecordWithFlags(event, stream, flags) })
        })
    }

    unsafe fn cuLaunchHostFunc(stream: *mut c_void, host_fn: u64, user_data: *mut c_void) -> i32 {
        in_context(F::CuLaunchHostFunc, || {
            // SAFETY: the program's function and its argument, called as the runtime calls its
            // own (`CUhostFn` is `cudaHostFn_t`).
            bridge::runtime(|| unsafe { cudart::cudaLaunchHostFunc(stream, host_fn, user_data) })
        })
    }

    unsafe fn cuStreamAddCallback(stream: *mut c_void, callback: u64, user_data: *mut c_void, flags: u32) -> i32 {
        in_context(F::CuStreamAddCallback, || {
            // SAFETY: the program's callback and its argument: a `CUstreamCallback` is a
            // `cudaStreamCallback_t` (a stream, a status of the same numbers, the argument).
            bridge::runtime(|| unsafe { cudart::cudaStreamAddCallback(stream, callback, user_data, flags) })
        })
    }

    unsafe fn cuStreamAttachMemAsync(stream: *mut c_void, p: u64, length: usize, flags: u32) -> i32 {
        in_context(F::CuStreamAttachMemAsync, || {
            // SAFETY: a device address, which the runtime's code checks.
            bridge::runtime(|| unsafe { cudart::cudaStreamAttachMemAsync(stream, dptr(p), length, flags) })
        })
    }

    unsafe fn cuLaunchKernelEx_ptsz(
        config: *const c_void,
        f: *mut c_void,
        kernel_params: *mut *mut c_void,
        extra: *mut *mut c_void,
    ) -> i32 {
        // SAFETY: as in `cuLaunchKernelEx`.
        in_context(F::CuLaunchKernelExPtsz, || unsafe {
            modules::launch_ex(config, f as u64, kernel_params, extra, true)
        })
    }

    // ---- Memory: stream-ordered allocation and pools, managed memory, peer copies (the
    // runtime's)

    unsafe fn cuMemAllocAsync(out: *mut u64, size: usize, stream: *mut c_void) -> i32 {
        in_context(F::CuMemAllocAsync, || {
            if out.is_null() {
                return Err(CuError::INVALID_VALUE);
            }
            // SAFETY: a writable `CUdeviceptr` (not null), the size of the `void *` the
            // runtime's writes.
            bridge::runtime(|| unsafe { cudart::cudaMallocAsync(out.cast(), size, stream) })
        })
    }

    unsafe fn cuMemFreeAsync(p: u64, stream: *mut c_void) -> i32 {
        // SAFETY: a device address, which the runtime's code checks.
        in_context(F::CuMemFreeAsync, || bridge::runtime(|| unsafe { cudart::cudaFreeAsync(dptr(p), stream) }))
    }

    unsafe fn cuMemAllocFromPoolAsync(out: *mut u64, size: usize, pool: u64, stream: *mut c_void) -> i32 {
        in_context(F::CuMemAllocFromPoolAsync, || {
            if out.is_null() {
                return Err(CuError::INVALID_VALUE);
            }
            // SAFETY: as in `cuMemAllocAsync`.
            bridge::runtime(|| unsafe { cudart::cudaMallocFromPoolAsync(out.cast(), size, pool, stream) })
        })
    }

    unsafe fn cuMemPoolCreate(pool: *mut u64, props: *const c_void) -> i32 {
        // A `CUmemPoolProps` is a `cudaMemPoolProps`.
        driver(F::CuMemPoolCreate, || {
            // SAFETY: `pool` null or writable, `props` null or readable (this export's contract).
            bridge::runtime(|| unsafe { cudart::cudaMemPoolCreate(pool, props) })
        })
    }

    unsafe fn cuMemPoolDestroy(pool: u64) -> i32 {
        // SAFETY: a value, which the runtime's code checks.
        driver(F::CuMemPoolDestroy, || bridge::runtime(|| unsafe { cudart::cudaMemPoolDestroy(pool) }))
    }

    unsafe fn cuMemPoolSetAttribute(pool: u64, attr: i32, value: *mut c_void) -> i32 {
        driver(F::CuMemPoolSetAttribute, || {
            // SAFETY: `value` null or the attribute's value (this export's contract).
            bridge::runtime(|| unsafe { cudart::cudaMemPoolSetAttribute(pool, attr, value) })
        })
    }

    unsafe fn cuMemPoolGetAttribute(pool: u64, attr: i32, value: *mut c_void) -> i32 {
        driver(F::CuMemPoolGetAttribute, || {
            // SAFETY: `value` null or room for the attribute's value (this export's contract).
            bridge::runtime(|| unsafe { cudart::cudaMemPoolGetAttribute(pool, attr, value) })
        })
    }

    unsafe fn cuMemPoolTrimTo(pool: u64, keep: usize) -> i32 {
        // SAFETY: values only.
        driver(F::CuMemPoolTrimTo, || bridge::runtime(|| unsafe { cudart::cudaMemPoolTrimTo(pool, keep) }))
    }

    unsafe fn cuMemPoolSetAccess(pool: u64, list: *const c_void, count: usize) -> i32 {
        driver(F::CuMemPoolSetAccess, || {
            // SAFETY: `list` null or `count` readable `CUmemAccessDesc`s, which are
            // `cudaMemAccessDesc`s (this export's contract).
            bridge::runtime(|| unsafe { cudart::cudaMemPoolSetAccess(pool, list, count) })
        })
    }

    unsafe fn cuMemPoolGetAccess(flags: *mut i32, pool: u64, location: *mut c_void) -> i32 {
        driver(F::CuMemPoolGetAccess, || {
            // SAFETY: `flags` null or writable, `location` null or a readable `CUmemLocation`
            // (this export's contract).
            bridge::runtime(|| unsafe { cudart::cudaMemPoolGetAccess(flags, pool, location) })
        })
    }

    unsafe fn cuMemAllocManaged(out: *mut u64, size: usize, flags: u32) -> i32 {
        in_context(F::CuMemAllocManaged, || {
            if out.is_null() || size == 0 {
                return Err(CuError::INVALID_VALUE);
            }
            // SAFETY: as in `cuMemAllocAsync`.
            bridge::runtime(|| unsafe { cudart::cudaMallocManaged(out.cast(), size, flags) })
        })
    }

    unsafe fn cuMemAdvise(p: u64, count: usize, advice: i32, device: i32) -> i32 {
        in_context(F::CuMemAdvise, || {
            bridge::from_runtime(rt_managed::advise(dptr(p), count, advice, device as u32 as u64, false))
        })
    }

    unsafe fn cuMemAdvise_v2(p: u64, count: usize, advice: i32, location: u64) -> i32 {
        // `location`: a `CUmemLocation` by value, in one register (its type, then its id).
        in_context(F::CuMemAdviseV2, || {
            bridge::from_runtime(rt_managed::advise(dptr(p), count, advice, location, true))
        })
    }

    unsafe fn cuMemPrefetchAsync(p: u64, count: usize, device: i32, _stream: *mut c_void) -> i32 {
        // One copy, at one address on both sides: nothing moves (the runtime's prefetch).
        in_context(F::CuMemPrefetchAsync, || {
            bridge::from_runtime(rt_managed::prefetch(dptr(p), count, device as u32 as u64, 0, false))
        })
    }

    unsafe fn cuMemPrefetchAsync_v2(p: u64, count: usize, location: u64, flags: u32, _stream: *mut c_void) -> i32 {
        in_context(F::CuMemPrefetchAsyncV2, || {
            bridge::from_runtime(rt_managed::prefetch(dptr(p), count, location, u64::from(flags), true))
        })
    }

    unsafe fn cuMemRangeGetAttribute(data: *mut c_void, size: usize, attribute: i32, p: u64, count: usize) -> i32 {
        // The attributes have the runtime's numbers.
        in_context(F::CuMemRangeGetAttribute, || {
            // SAFETY: `data` null or `size` writable bytes (this export's contract).
            bridge::runtime(|| unsafe { cudart::cudaMemRangeGetAttribute(data, size, attribute, dptr(p), count) })
        })
    }

    unsafe fn cuMemRangeGetAttributes(
        data: *mut *mut c_void,
        sizes: *mut usize,
        attributes: *mut i32,
        n: usize,
        p: u64,
        count: usize,
    ) -> i32 {
        in_context(F::CuMemRangeGetAttributes, || {
            // SAFETY: `n` places, sizes and attributes (this export's contract).
            bridge::runtime(|| unsafe { cudart::cudaMemRangeGetAttributes(data, sizes, attributes, n, dptr(p), count) })
        })
    }

    unsafe fn cuPointerSetAttribute(value: *const c_void, attribute: i32, p: u64) -> i32 {
        // SAFETY: `value` null or the attribute's value (this export's contract).
        driver(F::CuPointerSetAttribute, || unsafe { memory::set_attribute(value, attribute, p) })
    }

    unsafe fn cuMemcpyPeer(dst: u64, dst_ctx: u64, src: u64, src_ctx: u64, count: usize) -> i32 {
        driver(F::CuMemcpyPeer, || {
            let (dst_device, src_device) = (context::device_of(dst_ctx)?, context::device_of(src_ctx)?);
            // SAFETY: device addresses, which the runtime's code checks.
            bridge::runtime(|| unsafe { cudart::cudaMemcpyPeer(dptr(dst), dst_device, dptr(src), src_device, count) })
        })
    }

    unsafe fn cuMemcpyPeerAsync(
        dst: u64,
        dst_ctx: u64,
        src: u64,
        src_ctx: u64,
        count: usize,
        stream: *mut c_void,
    ) -> i32 {
        driver(F::CuMemcpyPeerAsync, || {
            let (dst_device, src_device) = (context::device_of(dst_ctx)?, context::device_of(src_ctx)?);
            // SAFETY: as in `cuMemcpyPeer`; a stream handle, which the server checks.
            bridge::runtime(|| unsafe {
                cudart::cudaMemcpyPeerAsync(dptr(dst), dst_device, dptr(src), src_device, count, stream)
            })
        })
    }

    unsafe fn cuMemcpy3DPeer(copy: *const c_void) -> i32 {
        // SAFETY: `copy` as the driver asks of its caller.
        driver(F::CuMemcpy3DPeer, || unsafe { queries::memcpy_3d_peer(copy, None) })
    }

    unsafe fn cuMemcpy3DPeerAsync(copy: *const c_void, stream: *mut c_void) -> i32 {
        // SAFETY: as in `cuMemcpy3DPeer`.
        driver(F::CuMemcpy3DPeerAsync, || unsafe { queries::memcpy_3d_peer(copy, Some(stream as u64)) })
    }

    fn driver_initialized() -> Result<i128, CuError> {
        Ok(i128::from(runtime::driver_initialized()))
    }

    fn initialize_driver() {
        runtime::set_driver_initialized();
    }
}

/// `CU_STREAM_LEGACY`.
const STREAM_LEGACY: u64 = 1;

/// `cuFuncGetName`/`cuKernelGetName`: a module's function's name (kept by the guest), or a
/// registered kernel's (the runtime's `cudaFuncGetName`).
///
/// # Safety
/// `name` must be null or writable.
unsafe fn function_name(name: *mut *const c_char, function: *mut c_void) -> Result<(), CuError> {
    if name.is_null() {
        return Err(CuError::INVALID_VALUE);
    }
    modules::known(function as u64)?;
    match modules::name_of(function as u64) {
        // SAFETY: not null, writable (this function's contract).
        Some(n) => unsafe { put(name, n) },
        // SAFETY: as above; a registered kernel's host function, which the runtime knows.
        None => bridge::runtime(|| unsafe { cudart::cudaFuncGetName(name, function) }),
    }
}

/// `cuFuncGetParamInfo`/`cuKernelGetParamInfo`: the offset (required) and size (optional) of
/// a parameter.
///
/// # Safety
/// `offset` and `size` must be null or writable.
unsafe fn param_info(function: *mut c_void, index: usize, offset: *mut usize, size: *mut usize) -> Result<(), CuError> {
    if offset.is_null() {
        return Err(CuError::INVALID_VALUE);
    }
    let (at, bytes) = modules::param_info(function as u64, index)?;
    // SAFETY: not null, writable (this function's contract).
    unsafe { put(offset, at) }?;
    if !size.is_null() {
        // SAFETY: not null, writable (this function's contract).
        unsafe { put(size, bytes) }?;
    }
    Ok(())
}

/// `cuOccupancyMaxPotentialBlockSize(WithFlags)`: the block size and grid of the occupancy
/// calculator (queries.rs), the dynamic shared memory of each block size from the program's
/// `blockSizeToDynamicSMemSize` where it passes one.
///
/// # Safety
/// `min_grid` and `block_size` null or writable; `smem_of` null or a
/// `size_t (*)(int blockSize)` of the program.
unsafe fn potential_block_size(
    min_grid: *mut i32,
    block_size: *mut i32,
    func: *mut c_void,
    smem_of: u64,
    dynamic_smem: usize,
    limit: i32,
    flags: u32,
) -> Result<(), CuError> {
    type BlockToSmem = unsafe extern "C" fn(i32) -> usize;
    if min_grid.is_null() || block_size.is_null() {
        return Err(CuError::INVALID_VALUE);
    }
    let callback: Option<BlockToSmem> = if smem_of == 0 {
        None
    } else {
        // SAFETY: a non-null `CUoccupancyB2DSize` of the program (this function's contract).
        Some(unsafe { std::mem::transmute::<usize, BlockToSmem>(smem_of as usize) })
    };
    let (grid, block) = queries::potential_block_size(func as u64, limit, flags, |b| match callback {
        // SAFETY: the program's function, called with a block size as the driver calls it.
        Some(f) => unsafe { f(b) },
        None => dynamic_smem,
    })?;
    // SAFETY: not null, writable (this function's contract).
    unsafe { put(min_grid, grid) }?;
    // SAFETY: as `min_grid`.
    unsafe { put(block_size, block) }
}

/// A form of a carried function Phos does not carry: logged (rate-limited), and answered
/// `CUDA_ERROR_NOT_SUPPORTED`.
fn not_carried(function: &str, what: &str) -> CuError {
    if let Some(dropped) = phos_protocol::log_limit::GUEST_LINES.admit(function) {
        tracing::warn!(
            "{function}: {what} is not supported by Phos; returning CUDA_ERROR_NOT_SUPPORTED ({dropped} earlier lines dropped)"
        );
    }
    CuError::NOT_SUPPORTED
}

/// `cuCtxCreate`: a new context on `dev`, current on this thread.
///
/// # Safety
/// `pctx` must be null or writable.
unsafe fn create_context(pctx: *mut u64, flags: u32, dev: i32) -> Result<(), CuError> {
    if pctx.is_null() {
        return Err(CuError::INVALID_VALUE);
    }
    let ctx = context::create(flags, dev)?;
    // SAFETY: not null, writable (this function's contract).
    unsafe { put(pctx, ctx) }
}

/// `cuCtxPopCurrent`: the popped context through `pctx` when given.
///
/// # Safety
/// `pctx` must be null or writable.
unsafe fn pop_context(pctx: *mut u64) -> Result<(), CuError> {
    let ctx = context::pop_current()?;
    if !pctx.is_null() {
        // SAFETY: not null, writable (this function's contract).
        unsafe { put(pctx, ctx)? };
    }
    Ok(())
}

/// Load a module image and hand out its handle.
///
/// # Safety
/// `module` must be null or writable, `image` null or a whole module image.
unsafe fn load_module(module: *mut *mut c_void, image: *const c_void) -> Result<(), CuError> {
    if module.is_null() {
        return Err(CuError::INVALID_VALUE);
    }
    // SAFETY: `image` as this function's contract gives it.
    let m = unsafe { modules::load(image)? };
    // SAFETY: not null, writable (this function's contract).
    unsafe { put(module, m as usize as *mut c_void) }
}

/// JIT options of `cuModuleLoadDataEx`: Phos compiles nothing in the guest, so the info and
/// error logs it is given are left empty (their sizes set to 0); other options are hints.
///
/// # Safety
/// `options` and `values` must hold `count` entries, log buffers the sizes given beside them.
pub(crate) unsafe fn clear_jit_logs(count: u32, options: *mut i32, values: *mut *mut c_void) {
    const INFO_LOG_BUFFER: i32 = 3;
    const INFO_LOG_BUFFER_SIZE_BYTES: i32 = 4;
    const ERROR_LOG_BUFFER: i32 = 5;
    const ERROR_LOG_BUFFER_SIZE_BYTES: i32 = 6;
    if options.is_null() || values.is_null() {
        return;
    }
    for i in 0..count.min(64) as usize {
        // SAFETY: `i < count`, the length of both lists (this function's contract).
        let option = unsafe { options.wrapping_add(i).read() };
        let value = values.wrapping_add(i);
        match option {
            INFO_LOG_BUFFER | ERROR_LOG_BUFFER => {
                // SAFETY: the option's value, a buffer of at least one byte or null.
                let buffer = unsafe { value.read() } as *mut u8;
                if !buffer.is_null() {
                    // SAFETY: not null: its first byte, writable.
                    unsafe { buffer.write(0) };
                }
            }
            // The size options' values are the sizes themselves, written back as used.
            // SAFETY: the option's place, writable.
            INFO_LOG_BUFFER_SIZE_BYTES | ERROR_LOG_BUFFER_SIZE_BYTES => unsafe { value.write(std::ptr::null_mut()) },
            _ => {}
        }
    }
}
