//! `cudaMemsetAsync` without waiting (and so `cudaMemsetAsync_ptsz` and the driver's
//! `cuMemsetD8/D16/D32Async`, which end here).
//!
//! A memset waits for its answer until it is proven (`proofs.rs`): its device range lies
//! inside a proven range of the same device, and its stream is proven. A proven memset is sent
//! without waiting (`runtime::call_async`) and can fail only where the server finds what the
//! guest could not know (it becomes the thread's last error, as for a launch). A memset that
//! waited and succeeded proves its range and stream. A queued memset of page-locked memory
//! counts as work that may write what the host reads (`runtime::note_work`).

use std::ffi::c_void;

use phos_protocol::CudaError;
use phos_protocol::cudart::CudaMemsetAsyncRequest;

use super::proofs;
use crate::{hostmem, runtime};

/// Whether a memset at `ptr` writes page-locked (or managed) memory, which the host reads
/// without a call: a queued one is work a synchronous copy may have to wait for
/// (`runtime::work_settled`).
pub fn writes_page_locked(ptr: u64) -> bool {
    let at = ptr as usize;
    hostmem::any_page_locked() && (hostmem::lookup_any(at).is_some() || hostmem::managed(at).is_some())
}

/// `cudaMemsetAsync`: sent without waiting when proven (see the module), else sent
/// synchronously, whose success proves its range and stream.
pub fn memset_async(dev_ptr: *mut c_void, value: i32, count: usize, stream: *mut c_void) -> Result<(), CudaError> {
    let req = CudaMemsetAsyncRequest {
        devPtr: dev_ptr as usize as u64,
        value,
        count: count as u64,
        stream: stream as usize as u64,
    };
    let device = runtime::current_device();
    let range = proofs::range(req.devPtr, req.count);
    let host_visible = writes_page_locked(req.devPtr);
    if let Some(range) = range
        && proofs::quiet()
        && proofs::covers(device, &[range], Some(req.stream))
    {
        let r = runtime::call_async(&req);
        if host_visible {
            runtime::note_work(None);
        }
        return r;
    }
    let epoch = proofs::epoch();
    let r = runtime::call(&req);
    if host_visible {
        runtime::note_work(None);
    }
    r?;
    if let Some(range) = range
        && req.count > 0
    {
        proofs::note(epoch, device, &[range], Some(req.stream));
    }
    Ok(())
}
