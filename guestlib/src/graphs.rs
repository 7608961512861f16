//! The guest side of stream capture and graphs: the parameters whose meaning changed between
//! CUDA versions. The capture itself happens at the server (api-server/src/capture.rs).

use std::ffi::c_void;

use phos_protocol::CudaError;
use phos_protocol::cudart::{PhosGraphExecUpdateRequest, PhosGraphInstantiateRequest, PhosStreamCaptureInfoRequest};

use crate::{runtime, soname};

/// `cudaGraphInstantiateFlagAutoFreeOnLaunch | Upload | UseNodePriority`: accepted (no graph
/// allocates memory, launches issue everything, priorities are hints).
const INSTANTIATE_FLAGS: u64 = 0x1 | 0x2 | 0x8;
/// `cudaGraphInstantiateFlagDeviceLaunch`: graphs launched from kernels.
const DEVICE_LAUNCH: u64 = 0x4;

/// `cudaStreamGetCaptureInfo` (and `_v2`, `_v3`): the status and the capture id.
///
/// # Safety
/// Non-null out pointers must be writable.
pub unsafe fn capture_info(stream: *mut c_void, status: *mut i32, id: *mut u64) -> Result<(), CudaError> {
    if status.is_null() {
        return Err(CudaError::InvalidValue);
    }
    let reply = runtime::call(&PhosStreamCaptureInfoRequest { stream: stream as usize as u64 })?;
    unsafe {
        *status = reply.status;
        if !id.is_null() && reply.status != 0 {
            *id = reply.id;
        }
    }
    Ok(())
}

/// # Safety
/// A non-null `exec` must be writable.
pub unsafe fn instantiate(exec: *mut *mut c_void, graph: *mut c_void, flags: u64) -> Result<(), CudaError> {
    if exec.is_null() {
        return Err(CudaError::InvalidValue);
    }
    if flags & DEVICE_LAUNCH != 0 {
        return Err(CudaError::NotSupported);
    }
    if flags & !INSTANTIATE_FLAGS != 0 {
        return Err(CudaError::InvalidValue);
    }
    let reply = runtime::call(&PhosGraphInstantiateRequest { graph: graph as usize as u64 })?;
    unsafe { *exec = reply.pGraphExec as usize as *mut c_void };
    Ok(())
}

/// `cudaGraphExecUpdate`. CUDA 12 reports through a `cudaGraphExecUpdateResultInfo`
/// (result, error node, error-from node); CUDA 11 through two out parameters (error node,
/// result), the third and fourth; a CUDA 12 caller passes no fourth.
///
/// # Safety
/// The out pointers must be what the ABI's signature says, writable.
pub unsafe fn exec_update(
    exec: *mut c_void,
    graph: *mut c_void,
    out: *mut c_void,
    result_11: *mut i32,
) -> Result<(), CudaError> {
    let reply =
        runtime::call(&PhosGraphExecUpdateRequest { hGraphExec: exec as usize as u64, hGraph: graph as usize as u64 })?;
    if soname::current_abi().major() >= 12 {
        if out.is_null() {
            return Err(CudaError::InvalidValue);
        }
        let mut bytes = [0u8; 24];
        bytes[0..4].copy_from_slice(&reply.result.to_ne_bytes());
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), out as *mut u8, 24) };
    } else {
        if out.is_null() || result_11.is_null() {
            return Err(CudaError::InvalidValue);
        }
        unsafe {
            (out as *mut u64).write_unaligned(0);
            result_11.write_unaligned(reply.result);
        }
    }
    if reply.result == 0 { Ok(()) } else { Err(CudaError::GraphExecUpdateFailure) }
}
