//! The pieces of the runtime the spec marks `implemented_by(guest)`, plus the utilities,
//! ABI writers and hooks its expressions name. Everything here is guest-local state or
//! hand-written glue; all remote calls go through the generated request types.

use std::collections::HashMap;
use std::ffi::{CString, c_char, c_void};
use std::sync::OnceLock;

use phos_protocol::cudart::{self, consts};
use phos_protocol::types::{DeviceProperties, Dim3};
use phos_protocol::{CudaError, cudart::FunctionId};

use crate::abi::Abi;
use crate::stubs::HandWritten;
use crate::{hostmem, launch, registry, runtime, soname};

/// The implementation of [`HandWritten`].
pub struct Hand;

fn code(r: Result<(), CudaError>) -> i32 {
    match r {
        Ok(()) => cudart::SUCCESS,
        Err(e) => {
            runtime::set_last_error(e);
            e.0
        }
    }
}

/// NUL-terminated error names and texts for this process's ABI, built once.
fn error_strings() -> &'static HashMap<i32, (CString, CString)> {
    static TABLE: OnceLock<HashMap<i32, (CString, CString)>> = OnceLock::new();
    TABLE.get_or_init(|| {
        let major = soname::current_abi().major();
        cudart::ERRORS
            .iter()
            .map(|e| {
                let err = CudaError(e.code as i32);
                let text = if e.code == 0 { e.text } else { err.text(major) };
                (e.code as i32, (CString::new(e.name).unwrap(), CString::new(text).unwrap()))
            })
            .collect()
    })
}

/// CUDA 13's launch path (`__cudaLaunchKernel` with a kernel handle) reports a launch
/// configuration the device cannot run as `cudaErrorInvalidValue`, where `cudaLaunchKernel`
/// reports `cudaErrorInvalidConfiguration` (measured on an H100 with CUDA 13.0 and 11.8).
fn kernel_handle_launch(r: Result<(), CudaError>) -> Result<(), CudaError> {
    r.map_err(|e| if e == CudaError::InvalidConfiguration { CudaError::InvalidValue } else { e })
}

const UNRECOGNIZED: &std::ffi::CStr = c"unrecognized error code";

fn memcpy_kind_of(addr: u64) -> bool {
    runtime::session_if_open().is_some_and(|s| s.contains(addr)) || registry::is_module_global(addr)
}

#[allow(non_snake_case)]
/// `cudaMemcpy`/`cudaMemcpyAsync` fast path: large host<->device copies move through the
/// channel's staging region.
unsafe fn staged(
    dst: *mut c_void,
    src: *const c_void,
    count: usize,
    kind: i32,
    stream: u64,
) -> Option<Result<(), CudaError>> {
    if count < runtime::STAGED_MIN {
        return None;
    }
    let direction =
        match <Hand as HandWritten>::resolve_memcpy_kind(kind as i128, dst as usize as i128, src as usize as i128) {
            Ok(d) => d as i32,
            Err(e) => return Some(Err(e)),
        };
    match direction {
        consts::cudaMemcpyHostToDevice if !src.is_null() => unsafe {
            runtime::staged_copy(direction, dst as usize as u64, src as *mut u8, count, stream)
        },
        consts::cudaMemcpyDeviceToHost if !dst.is_null() => unsafe {
            runtime::staged_copy(direction, src as usize as u64, dst as *mut u8, count, stream)
        },
        _ => None,
    }
}

impl HandWritten for Hand {
    unsafe fn memcpy_staged(
        dst: *mut c_void,
        src: *const c_void,
        count: usize,
        kind: i32,
    ) -> Option<Result<(), CudaError>> {
        unsafe { staged(dst, src, count, kind, 0) }
    }

    unsafe fn memcpy_async_staged(
        dst: *mut c_void,
        src: *const c_void,
        count: usize,
        kind: i32,
        stream: *mut c_void,
    ) -> Option<Result<(), CudaError>> {
        unsafe { staged(dst, src, count, kind, stream as usize as u64) }
    }

    unsafe fn cudaGetLastError() -> i32 {
        runtime::take_last_error()
    }

    unsafe fn cudaPeekAtLastError() -> i32 {
        runtime::peek_last_error()
    }

    unsafe fn cudaGetErrorString(error: i32) -> *const c_char {
        error_strings().get(&error).map_or(UNRECOGNIZED.as_ptr(), |(_, text)| text.as_ptr())
    }

    unsafe fn cudaGetErrorName(error: i32) -> *const c_char {
        error_strings().get(&error).map_or(UNRECOGNIZED.as_ptr(), |(name, _)| name.as_ptr())
    }

    unsafe fn cudaSetDevice(device: i32) -> i32 {
        code(runtime::session().and_then(|s| {
            if device < 0 || device >= s.device_count {
                return Err(CudaError::InvalidDevice);
            }
            runtime::set_current_device(device);
            Ok(())
        }))
    }

    unsafe fn cudaGetDevice(device: *mut i32) -> i32 {
        if device.is_null() {
            return code(Err(CudaError::InvalidValue));
        }
        unsafe { *device = runtime::current_device() };
        cudart::SUCCESS
    }

    unsafe fn cudaRuntimeGetVersion(runtime_version: *mut i32) -> i32 {
        if runtime_version.is_null() {
            return code(Err(CudaError::InvalidValue));
        }
        unsafe { *runtime_version = soname::current_abi().runtime_version() };
        cudart::SUCCESS
    }

    unsafe fn cudaMallocHost(ptr: *mut *mut c_void, size: usize) -> i32 {
        unsafe { Self::cudaHostAlloc(ptr, size, 0) }
    }

    unsafe fn cudaHostAlloc(p_host: *mut *mut c_void, size: usize, flags: u32) -> i32 {
        if p_host.is_null() {
            return code(Err(CudaError::InvalidValue));
        }
        code(hostmem::alloc(size, flags).map(|p| unsafe { *p_host = p }))
    }

    unsafe fn cudaFreeHost(ptr: *mut c_void) -> i32 {
        code(unsafe { hostmem::free(ptr) })
    }

    unsafe fn cudaLaunchKernel(
        func: *const c_void,
        grid: Dim3,
        block: Dim3,
        args: *mut *mut c_void,
        shared_mem: usize,
        stream: *mut c_void,
    ) -> i32 {
        runtime::api_call(FunctionId::CudaLaunchKernel, || unsafe {
            launch::launch(func, grid, block, args, shared_mem, stream, false)
        })
    }

    unsafe fn cudaLaunchKernel_ptsz(
        func: *const c_void,
        grid: Dim3,
        block: Dim3,
        args: *mut *mut c_void,
        shared_mem: usize,
        stream: *mut c_void,
    ) -> i32 {
        runtime::api_call(FunctionId::CudaLaunchKernelPtsz, || unsafe {
            launch::launch(func, grid, block, args, shared_mem, stream, true)
        })
    }

    unsafe fn __cudaGetKernel(kernel: *mut *mut c_void, func: *const c_void) -> i32 {
        // The kernel handle is the host stub's address: it names the registered kernel.
        if kernel.is_null() {
            return code(Err(CudaError::InvalidValue));
        }
        match registry::kernel(func) {
            Some(_) => {
                unsafe { *kernel = func as *mut c_void };
                cudart::SUCCESS
            }
            None => code(Err(CudaError::InvalidDeviceFunction)),
        }
    }

    unsafe fn __cudaLaunchKernel(
        kernel: *mut c_void,
        grid: Dim3,
        block: Dim3,
        args: *mut *mut c_void,
        shared_mem: usize,
        stream: *mut c_void,
    ) -> i32 {
        runtime::api_call(FunctionId::PrivCudaLaunchKernel, || unsafe {
            kernel_handle_launch(launch::launch(kernel, grid, block, args, shared_mem, stream, false))
        })
    }

    unsafe fn __cudaLaunchKernel_ptsz(
        kernel: *mut c_void,
        grid: Dim3,
        block: Dim3,
        args: *mut *mut c_void,
        shared_mem: usize,
        stream: *mut c_void,
    ) -> i32 {
        runtime::api_call(FunctionId::PrivCudaLaunchKernelPtsz, || unsafe {
            kernel_handle_launch(launch::launch(kernel, grid, block, args, shared_mem, stream, true))
        })
    }

    unsafe fn __cudaRegisterFatBinary(fat_cubin: *mut c_void) -> *mut *mut c_void {
        unsafe { registry::register_fat_binary(fat_cubin) }
    }

    unsafe fn __cudaRegisterFatBinaryEnd(_handle: *mut *mut c_void) {}

    unsafe fn __cudaUnregisterFatBinary(_handle: *mut *mut c_void) {
        // Runs from exit handlers. The session ends with the process and the server drops
        // every module then; but device printf output still pending is printed at exit, as
        // CUDA does when its context is torn down, so one synchronising call fetches it.
        static FLUSHED: std::sync::Once = std::sync::Once::new();
        FLUSHED.call_once(|| {
            if runtime::session_if_open().is_some() {
                let _ = runtime::call(&cudart::CudaDeviceSynchronizeRequest {});
            }
        });
    }

    unsafe fn __cudaRegisterFunction(
        handle: *mut *mut c_void,
        host_fun: *const c_char,
        _device_fun: *mut c_char,
        device_name: *const c_char,
        _thread_limit: i32,
        _tid: *mut Dim3,
        _bid: *mut Dim3,
        _b_dim: *mut Dim3,
        _g_dim: *mut Dim3,
        _w_size: *mut i32,
    ) {
        unsafe { registry::register_function(handle, host_fun, device_name) }
    }

    unsafe fn __cudaRegisterVar(
        handle: *mut *mut c_void,
        host_var: *mut c_char,
        _device_address: *mut c_char,
        device_name: *const c_char,
        _ext: i32,
        size: usize,
        _constant: i32,
        _global: i32,
    ) {
        unsafe { registry::register_variable(handle, host_var, device_name, size) }
    }

    unsafe fn __cudaRegisterManagedVar(
        _handle: *mut *mut c_void,
        _host_var_ptr_address: *mut *mut c_void,
        _device_address: *mut c_char,
        device_name: *const c_char,
        _ext: i32,
        _size: usize,
        _constant: i32,
        _global: i32,
    ) {
        crate::log::init();
        let name = unsafe { runtime::c_str(device_name) }.unwrap_or("?");
        tracing::warn!("__managed__ variable {name} is not supported by Phos; kernels using it will fail");
    }

    unsafe fn __cudaPushCallConfiguration(grid: Dim3, block: Dim3, shared_mem: usize, stream: *mut c_void) -> u32 {
        launch::push_config(grid, block, shared_mem, stream);
        0
    }

    unsafe fn __cudaPopCallConfiguration(
        grid: *mut Dim3,
        block: *mut Dim3,
        shared_mem: *mut usize,
        stream: *mut c_void,
    ) -> i32 {
        code(unsafe { launch::pop_config(grid, block, shared_mem, stream) })
    }

    unsafe fn __cudaInitModule(_handle: *mut *mut c_void) -> c_char {
        1
    }

    fn device_symbol_address(symbol: i128) -> Result<i128, CudaError> {
        let var = registry::variable(symbol as usize as *const c_void).ok_or(CudaError::InvalidSymbol)?;
        Ok(i128::from(var.remote()?.0))
    }

    fn device_symbol_size(symbol: i128) -> Result<i128, CudaError> {
        let var = registry::variable(symbol as usize as *const c_void).ok_or(CudaError::InvalidSymbol)?;
        Ok(i128::from(var.remote()?.1))
    }

    fn resolve_memcpy_kind(kind: i128, dst: i128, src: i128) -> Result<i128, CudaError> {
        let kind = i32::try_from(kind).map_err(|_| CudaError::InvalidMemcpyDirection)?;
        match kind {
            consts::cudaMemcpyHostToHost
            | consts::cudaMemcpyHostToDevice
            | consts::cudaMemcpyDeviceToHost
            | consts::cudaMemcpyDeviceToDevice => Ok(i128::from(kind)),
            consts::cudaMemcpyDefault => {
                runtime::session()?;
                let on_device = |p: i128| u64::try_from(p).is_ok_and(memcpy_kind_of);
                Ok(i128::from(match (on_device(dst), on_device(src)) {
                    (false, false) => consts::cudaMemcpyHostToHost,
                    (true, false) => consts::cudaMemcpyHostToDevice,
                    (false, true) => consts::cudaMemcpyDeviceToHost,
                    (true, true) => consts::cudaMemcpyDeviceToDevice,
                }))
            }
            _ => Err(CudaError::InvalidMemcpyDirection),
        }
    }

    unsafe fn write_cudaDeviceProp(dst: *mut c_void, value: &DeviceProperties) {
        // The plain entry point of libcudart.so.12 kept the CUDA 11 layout.
        let layout = match soname::current_abi() {
            Abi::V11 | Abi::V12 => Abi::V11,
            Abi::V13 => Abi::V13,
        };
        unsafe { crate::abi::write_device_prop(layout, dst, value) }
    }

    unsafe fn write_cudaDeviceProp_v2(dst: *mut c_void, value: &DeviceProperties) {
        unsafe { crate::abi::write_device_prop(soname::current_abi(), dst, value) }
    }

    fn forget_device_state() {
        registry::forget_remote_state();
    }
}
