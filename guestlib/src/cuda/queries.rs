//! Driver functions composed in the guest over what the runtime already has: device
//! properties the driver reports in its own forms (`cuDeviceGetUuid`, `cuDeviceGetProperties`,
//! `cuDeviceComputeCapability`), the context of a stream, peer copies of `CUDA_MEMCPY3D_PEER`,
//! and the occupancy calculator's block size (`cuOccupancyMaxPotentialBlockSize`).

use std::ffi::c_void;

use phos_protocol::cuda::CuError;
use phos_protocol::cudart::CudaGetDevicePropertiesV2Request;
use phos_protocol::types::DeviceProperties;

use super::bridge::{self, from_runtime};
use super::{arrays, context, modules};
use crate::cudart::stubs as cudart;
use crate::runtime;

/// `CU_DEVICE_ATTRIBUTE_*` the driver's own forms read.
mod attr {
    pub const MAX_THREADS_PER_BLOCK: i32 = 1;
    pub const WARP_SIZE: i32 = 10;
    pub const TEXTURE_ALIGNMENT: i32 = 14;
    pub const MULTIPROCESSOR_COUNT: i32 = 16;
    pub const MAX_THREADS_PER_MULTIPROCESSOR: i32 = 39;
    pub const COMPUTE_CAPABILITY_MAJOR: i32 = 75;
    pub const COMPUTE_CAPABILITY_MINOR: i32 = 76;
}

/// `CU_STREAM_LEGACY` and `CU_STREAM_PER_THREAD`.
const STREAM_LEGACY: u64 = 1;
const STREAM_PER_THREAD: u64 = 2;

/// The properties of a device of the session (`CUDA_ERROR_INVALID_DEVICE` for any other).
pub fn properties(device: i32) -> Result<DeviceProperties, CuError> {
    bridge::check_device(device)?;
    Ok(from_runtime(runtime::call(&CudaGetDevicePropertiesV2Request { device }))?.prop)
}

/// `cuDeviceComputeCapability`: (major, minor).
pub fn compute_capability(device: i32) -> Result<(i32, i32), CuError> {
    let p = properties(device)?;
    Ok((p.attr(attr::COMPUTE_CAPABILITY_MAJOR), p.attr(attr::COMPUTE_CAPABILITY_MINOR)))
}

/// `cuDeviceGetProperties`: the deprecated `CUdevprop`, fourteen `int`s that are the device
/// attributes 1 to 14 in order (`maxThreadsPerBlock`, `maxThreadsDim[3]`, `maxGridSize[3]`,
/// `sharedMemPerBlock`, `totalConstantMemory`, `SIMDWidth`, `memPitch`, `regsPerBlock`,
/// `clockRate`, `textureAlign`).
pub fn devprop(device: i32) -> Result<[i32; 14], CuError> {
    let p = properties(device)?;
    let mut out = [0i32; 14];
    for (a, v) in (attr::MAX_THREADS_PER_BLOCK..=attr::TEXTURE_ALIGNMENT).zip(out.iter_mut()) {
        *v = p.attr(a);
    }
    Ok(out)
}

/// The context a stream belongs to (`cuStreamGetCtx`). Streams belong to their device here,
/// whatever context made them: the calling thread's current context where it is on the
/// stream's device, else the device's primary context. The special streams are the current
/// context's.
pub fn stream_context(stream: *mut c_void) -> Result<u64, CuError> {
    let current = context::current();
    if matches!(stream as u64, 0 | STREAM_LEGACY | STREAM_PER_THREAD) {
        return current.ok_or(CuError::INVALID_CONTEXT);
    }
    let mut device = -1;
    // SAFETY: a handle, which the server checks, and a writable `int`.
    bridge::runtime(|| unsafe { cudart::cudaStreamGetDevice(stream, &mut device) })?;
    match current {
        Some(c) if context::device_of(c) == Ok(device) => Ok(c),
        _ => Ok(context::primary_handle(device)),
    }
}

/// `CUDA_MEMCPY3D_PEER` is `CUDA_MEMCPY3D` with each side's context where the latter has a
/// reserved pointer: its size and the offsets of the two contexts.
const MEMCPY3D_SIZE: usize = 200;
const SRC_CONTEXT: usize = 64;
const DST_CONTEXT: usize = 152;

/// `cuMemcpy3DPeer` and `cuMemcpy3DPeerAsync` (`stream`): the copy `cuMemcpy3D` makes, once
/// both contexts are checked (memory is the device's, whichever context names it).
///
/// # Safety
/// `p` must be null or a readable `CUDA_MEMCPY3D_PEER`, whose pointers are what the driver
/// asks of them.
pub unsafe fn memcpy_3d_peer(p: *const c_void, stream: Option<u64>) -> Result<(), CuError> {
    if p.is_null() {
        return Err(CuError::INVALID_VALUE);
    }
    // SAFETY: a readable `CUDA_MEMCPY3D_PEER` (this function's contract), 200 bytes.
    let mut raw = unsafe { (p as *const [u8; MEMCPY3D_SIZE]).read_unaligned() };
    for at in [SRC_CONTEXT, DST_CONTEXT] {
        let ctx = u64::from_ne_bytes(raw[at..at + 8].try_into().unwrap_or_default());
        context::device_of(ctx)?;
        raw[at..at + 8].fill(0);
    }
    // SAFETY: `raw` is a `CUDA_MEMCPY3D` of the caller's copy (its reserved fields zero).
    unsafe { arrays::memcpy_3d(raw.as_ptr() as *const c_void, stream) }
}

/// `cuOccupancyMaxPotentialBlockSize(WithFlags)` on the current context's device: (the
/// smallest grid for full occupancy, the block size). `smem_of` is the program's
/// `blockSizeToDynamicSMemSize`, called here in the guest, or the fixed size.
pub fn potential_block_size(
    function: u64,
    block_size_limit: i32,
    flags: u32,
    smem_of: impl FnMut(i32) -> usize,
) -> Result<(i32, i32), CuError> {
    let device = context::current_device()?;
    let p = properties(device)?;
    let function_max = modules::attribute(function, 0)?;
    let limits = modules::OccupancyLimits {
        max_block: p.attr(attr::MAX_THREADS_PER_BLOCK).min(function_max),
        warp_size: p.attr(attr::WARP_SIZE),
        max_threads_per_sm: p.attr(attr::MAX_THREADS_PER_MULTIPROCESSOR),
        sm_count: p.attr(attr::MULTIPROCESSOR_COUNT),
    };
    modules::potential_block_size(function, &limits, block_size_limit, flags, smem_of)
}
