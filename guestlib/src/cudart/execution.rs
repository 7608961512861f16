//! Kernel attributes, occupancy and the launch variants: the guest turns a host stub into
//! the kernel's function handle and asks the server.

use std::collections::HashMap;
use std::ffi::{CString, c_char, c_void};
use std::sync::Mutex;

use phos_protocol::CudaError;
use phos_protocol::cudart::{
    PhosFuncGetAttributesRequest, PhosFuncSetAttributeRequest, PhosFuncSetCacheConfigRequest,
    PhosOccupancyAvailableDynamicSMemRequest, PhosOccupancyMaxActiveBlocksRequest,
};
use phos_protocol::types::{Dim3, FuncAttributes};

use super::launch;
use crate::{registry, runtime, soname};

/// The kernel's function handle. What a pointer that is no kernel gives changed in CUDA 13
/// (measured on an H100): `cudaErrorInvalidDeviceFunction` before, then
/// `cudaErrorInvalidResourceHandle`.
fn function_of(func: *const c_void) -> Result<u64, CudaError> {
    let not_a_kernel = if soname::current_abi().major() >= 13 {
        CudaError::InvalidResourceHandle
    } else {
        CudaError::InvalidDeviceFunction
    };
    match registry::kernel(func) {
        Some(kernel) => kernel.remote(),
        // A loaded library's kernel (`cudaKernel_t`) is the server's function handle.
        None if crate::cuda::modules::loaded_function(func as u64).is_some() => Ok(func as u64),
        None => Err(not_a_kernel),
    }
}

/// The parameter layout of the kernel registered for host stub `func`, or of the loaded
/// library's kernel `func` is.
fn layout_of(func: *const c_void) -> Result<registry::ParamLayout, CudaError> {
    match registry::kernel(func) {
        Some(kernel) => kernel.layout(),
        None => crate::cuda::modules::loaded_function(func as u64)
            .map(|layout| (*layout).clone())
            .ok_or(CudaError::InvalidDeviceFunction),
    }
}

/// Writes `struct cudaFuncAttributes`: 56 bytes in CUDA 11, 144 since CUDA 12 (cluster
/// fields, then reserved words, zero).
pub unsafe fn get_attributes(out: *mut c_void, func: *const c_void) -> Result<(), CudaError> {
    if out.is_null() {
        return Err(CudaError::InvalidValue);
    }
    let function = function_of(func)?;
    let a: FuncAttributes = runtime::call(&PhosFuncGetAttributesRequest { function })?.attr;
    let mut bytes = [0u8; 144];
    bytes[0..8].copy_from_slice(&a.shared_size_bytes.to_ne_bytes());
    bytes[8..16].copy_from_slice(&a.const_size_bytes.to_ne_bytes());
    bytes[16..24].copy_from_slice(&a.local_size_bytes.to_ne_bytes());
    let ints = [
        a.max_threads_per_block,
        a.num_regs,
        a.ptx_version,
        a.binary_version,
        a.cache_mode_ca,
        a.max_dynamic_shared_size_bytes,
        a.preferred_shmem_carveout,
        a.cluster_dim_must_be_set,
        a.required_cluster[0],
        a.required_cluster[1],
        a.required_cluster[2],
        a.cluster_scheduling_policy_preference,
        a.non_portable_cluster_size_allowed,
    ];
    for (i, v) in ints.iter().enumerate() {
        bytes[24 + 4 * i..28 + 4 * i].copy_from_slice(&v.to_ne_bytes());
    }
    let size = if soname::current_abi().major() >= 12 { 144 } else { 56 };
    // SAFETY: `out` is not null (checked above) and is a `cudaFuncAttributes` of this
    // process's ABI, `size` bytes (this function's contract).
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), out as *mut u8, size) };
    Ok(())
}

pub fn set_attribute(func: *const c_void, attr: i32, value: i32) -> Result<(), CudaError> {
    let function = function_of(func)?;
    runtime::call(&PhosFuncSetAttributeRequest { function, attr, value }).map(|_| ())
}

pub fn set_cache_config(func: *const c_void, config: i32) -> Result<(), CudaError> {
    let function = function_of(func)?;
    runtime::call(&PhosFuncSetCacheConfigRequest { function, config }).map(|_| ())
}

pub fn set_shared_mem_config(func: *const c_void, config: i32) -> Result<(), CudaError> {
    function_of(func)?;
    if !(0..=2).contains(&config) {
        return Err(CudaError::InvalidValue);
    }
    Ok(())
}

/// `cudaFuncGetName`: the kernel's (mangled) device name; the string lives as long as the
/// process.
pub unsafe fn get_name(out: *mut *const c_char, func: *const c_void) -> Result<(), CudaError> {
    if out.is_null() {
        return Err(CudaError::InvalidValue);
    }
    let kernel = registry::kernel(func).ok_or(CudaError::InvalidDeviceFunction)?;
    static NAMES: Mutex<Option<HashMap<String, &'static std::ffi::CStr>>> = Mutex::new(None);
    let mut g = NAMES.lock().unwrap_or_else(|p| p.into_inner());
    let name = *g
        .get_or_insert_with(HashMap::new)
        .entry(kernel.name.clone())
        .or_insert_with(|| Box::leak(CString::new(kernel.name.clone()).unwrap_or_default().into_boxed_c_str()));
    // SAFETY: `out` is not null (checked above) and points to a writable value of its type: this
    // function's contract, which is the export's.
    unsafe { *out = name.as_ptr() };
    Ok(())
}

pub unsafe fn occupancy(
    out: *mut i32,
    func: *const c_void,
    block_size: i32,
    dynamic_smem: usize,
    flags: u32,
) -> Result<(), CudaError> {
    if out.is_null() {
        return Err(CudaError::InvalidValue);
    }
    let function = function_of(func)?;
    let reply = runtime::call(&PhosOccupancyMaxActiveBlocksRequest {
        function,
        blockSize: block_size,
        dynamicSMemSize: dynamic_smem as u64,
        flags,
    })?;
    // SAFETY: `out` is not null (checked above) and points to a writable value of its type: this
    // function's contract, which is the export's.
    unsafe { *out = reply.numBlocks };
    Ok(())
}

pub unsafe fn available_dynamic_smem(
    out: *mut usize,
    func: *const c_void,
    blocks: i32,
    block_size: i32,
) -> Result<(), CudaError> {
    if out.is_null() {
        return Err(CudaError::InvalidValue);
    }
    let function = function_of(func)?;
    let reply = runtime::call(&PhosOccupancyAvailableDynamicSMemRequest {
        function,
        numBlocks: blocks,
        blockSize: block_size,
    })?;
    // SAFETY: `out` is not null (checked above) and points to a writable value of its type: this
    // function's contract, which is the export's.
    unsafe { *out = reply.dynamicSmemSize as usize };
    Ok(())
}

/// `cudaFuncGetParamInfo`: where parameter `index` lies in the parameter buffer.
///
/// # Safety
/// Non-null out pointers must be writable.
pub unsafe fn param_info(
    func: *const c_void,
    index: usize,
    offset: *mut usize,
    size: *mut usize,
) -> Result<(), CudaError> {
    if offset.is_null() || size.is_null() {
        return Err(CudaError::InvalidValue);
    }
    let layout = layout_of(func)?;
    let &(at, len) = layout.params.get(index).ok_or(CudaError::InvalidValue)?;
    // SAFETY: not null (checked above), so writable (this function's contract).
    unsafe { *offset = at };
    // SAFETY: as for `offset`.
    unsafe { *size = len };
    Ok(())
}

/// `cudaFuncGetParamCount`.
///
/// # Safety
/// A non-null `count` must be writable.
pub unsafe fn param_count(func: *const c_void, count: *mut usize) -> Result<(), CudaError> {
    if count.is_null() {
        return Err(CudaError::InvalidValue);
    }
    let layout = layout_of(func)?;
    // SAFETY: `count` is not null (checked above) and points to a writable value of its type: this
    // function's contract, which is the export's.
    unsafe { *count = layout.params.len() };
    Ok(())
}

/// `cudaLaunchConfig_t`: grid, block, dynamic shared memory, stream, attributes.
#[repr(C)]
struct LaunchConfig {
    grid: Dim3,
    block: Dim3,
    dynamic_smem: usize,
    stream: *mut c_void,
    attrs: *const LaunchAttribute,
    num_attrs: u32,
}

/// `cudaLaunchAttribute`: an id and a 64-byte value.
#[repr(C)]
struct LaunchAttribute {
    id: i32,
    _pad: [u8; 4],
    value: [u8; 64],
}

/// `cudaLaunchKernelExC`. Attributes that change what a launch computes must be honoured:
/// cooperative launches are; cluster shapes other than 1x1x1, programmatic events and
/// launch-completion events are not carried ([`super::attributes::launch_attribute`]).
/// Hints without effect on results are checked and not applied.
pub unsafe fn launch_ex(
    config: *const c_void,
    func: *const c_void,
    args: *mut *mut c_void,
    per_thread: bool,
) -> Result<(), CudaError> {
    if config.is_null() {
        return Err(CudaError::InvalidValue);
    }
    // SAFETY: not null (checked above): a `cudaLaunchConfig_t` (this function's contract),
    // read without assuming alignment; its pointers are only copied here.
    let c = unsafe { (config as *const LaunchConfig).read_unaligned() };
    if c.num_attrs > 0 && c.attrs.is_null() {
        return Err(CudaError::InvalidValue);
    }
    let mut cooperative = false;
    for i in 0..c.num_attrs as usize {
        // SAFETY: `i < num_attrs`: within the config's attribute array, not null when
        // `num_attrs > 0` (checked above; what `cudaLaunchKernelExC` asks of its caller).
        let at = unsafe { c.attrs.add(i) };
        // SAFETY: a `cudaLaunchAttribute` there, read without assuming alignment.
        let a = unsafe { at.read_unaligned() };
        cooperative |= super::attributes::launch_attribute(a.id, &a.value)?;
    }
    // SAFETY: the kernel and its argument array as `cudaLaunchKernelExC`'s caller gives them
    // (this function's contract): what `launch::launch` reads.
    unsafe { launch::launch(func, c.grid, c.block, args, c.dynamic_smem, c.stream, per_thread, cooperative) }
}
