//! Copies that go without waiting for their answer once proven (`proofs.rs`), and the proofs
//! allocations and copies make.
//!
//! - A device-to-device `cudaMemcpyAsync` (a `cudaMemcpyDefault` one whose two pointers the
//!   guest knows as device memory, and so the driver's `cuMemcpyDtoDAsync` and `cuMemcpyAsync`,
//!   which end here) whose two ranges and stream are proven: CUDA returns such a copy once it
//!   is queued. So does a device-to-device `cudaMemcpy` (and `cuMemcpyDtoD`, `cuMemcpy`) whose
//!   ranges are proven: CUDA documents "for transfers from device memory to device memory, no
//!   host-side synchronization is performed".
//! - A host-to-device copy of pageable memory small enough to travel in its call's frame
//!   (below [`runtime::STAGED_MIN`]) whose device range is proven (and, for `cudaMemcpyAsync`,
//!   its stream): once its bytes are in the frame they have left the caller's buffer. CUDA
//!   documents that a synchronous `cudaMemcpy` from pageable memory returns "once the pageable
//!   buffer has been copied to the staging memory for DMA transfer to device memory, but the
//!   DMA to final destination may not have completed" (API synchronization behavior, Memcpy),
//!   and an async one "host memory is copied to a staging buffer immediately". The server runs
//!   the same call (`cudaMemcpy`, which synchronises the legacy stream first, as CUDA's does),
//!   in the channel's order, so this thread's later calls and, through barriers, other
//!   threads' later calls come after it. What the host sees of earlier work without a call
//!   is another matter: a synchronous copy waits where that could differ (device `printf`
//!   output arrived, a host function not run yet, kernels sent in a process with page-locked
//!   memory and not known finished: `host_sees_earlier_work`). A synchronous copy from
//!   page-locked memory of at most `pinned_in_frame_max` bytes goes the same way under the same
//!   conditions (its bytes are taken at the call, when CUDA's DMA would read them, since no
//!   earlier work that could write them is pending); a larger or async one is a DMA of the
//!   caller's own pages and keeps waiting, as CUDA's synchronous copies of pinned memory do.
//!
//! Otherwise a copy waits, as before, and its success proves its device ranges (and stream).
//! A failure of a copy that did not wait, which the guest could not foresee, becomes the
//! thread's last error, as a launch's does.

use std::ffi::c_void;

use phos_protocol::cudart::{CudaMallocRequest, CudaMemcpyAsyncRequest, CudaMemcpyRequest, consts};
use phos_protocol::{CudaError, Ptr};

use super::proofs;
use crate::{hostmem, runtime};

/// `cudaMalloc`: an allocation just returned is a proven range of its full size.
///
/// # Safety
/// `dev_ptr` is null or points to a writable `void *` (the caller's contract with CUDA).
pub unsafe fn malloc(dev_ptr: *mut *mut c_void, size: usize) -> Result<(), CudaError> {
    if dev_ptr.is_null() {
        return Err(CudaError::InvalidValue);
    }
    let device = runtime::current_device();
    let epoch = proofs::epoch();
    let reply = runtime::call(&CudaMallocRequest { size: size as u64 })?;
    // SAFETY: `dev_ptr` is not null (checked above) and points to a writable `void *` (this
    // function's contract).
    unsafe { *dev_ptr = reply.devPtr as usize as *mut c_void };
    if reply.devPtr != 0
        && size > 0
        && let Some(range) = proofs::range(reply.devPtr, size as u64)
    {
        proofs::note(epoch, device, &[range], None);
    }
    Ok(())
}

/// A device-to-device copy (see the module): `cudaMemcpyAsync` on `Some(stream)`, `cudaMemcpy`
/// on `None`.
pub fn device_to_device(dst: u64, src: u64, count: usize, kind: i32, stream: Option<u64>) -> Result<(), CudaError> {
    let (dst_ptr, src_ptr) = (Ptr::Device(dst), Ptr::Device(src));
    let direction = consts::cudaMemcpyDeviceToDevice;
    let count64 = count as u64;
    let send = |wait: bool| match stream {
        Some(stream) => {
            let req = CudaMemcpyAsyncRequest { dst: dst_ptr, src: src_ptr, count: count64, kind, stream, direction };
            if wait { runtime::call(&req).map(|_| ()) } else { runtime::call_async(&req) }
        }
        None => {
            let req = CudaMemcpyRequest { dst: dst_ptr, src: src_ptr, count: count64, kind, direction };
            if wait { runtime::call(&req).map(|_| ()) } else { runtime::call_async(&req) }
        }
    };
    let device = runtime::current_device();
    let ranges = proofs::range(dst, count64).zip(proofs::range(src, count64)).map(|(d, s)| [d, s]);
    if count > 0
        && let Some(r) = &ranges
        && proofs::quiet()
        && proofs::covers(device, r, stream)
    {
        return send(false);
    }
    let epoch = proofs::epoch();
    send(true)?;
    if count > 0
        && let Some(r) = &ranges
    {
        proofs::note(epoch, device, r, stream);
    }
    Ok(())
}

/// Whether `[src, src + count)` is pageable memory: neither end in page-locked memory the
/// guest allocated or registered.
fn pageable(src: usize, count: usize) -> bool {
    hostmem::lookup_any(src).is_none() && hostmem::lookup_any(src.saturating_add(count - 1)).is_none()
}

/// Whether a synchronous copy's return on `device` may show the host what work before it
/// did, other than through later calls (which the server runs after the copy, and so after
/// the stream synchronisation it begins with): CUDA prints the device output of the kernels
/// before it before it returns, has run the host functions before it, and kernels (graphs,
/// library calls, async copies into page-locked memory, memsets of it) before it may have
/// written page-locked memory, which the host reads directly, unless the host already knows them
/// finished (`runtime::work_settled`: none was sent since a synchronisation that covered
/// them). Then it waits, as before.
fn host_sees_earlier_work(device: i32) -> bool {
    runtime::device_output_seen()
        || !crate::callbacks::none_pending()
        || (hostmem::any_page_locked() && !runtime::work_settled(device))
}

/// Synchronous host-to-device copies of page-locked memory up to this many bytes travel in
/// their call's frame and return without waiting, under the conditions of a pageable one
/// (`PHOS_PINNED_IN_FRAME`, bytes; 32 KiB by default, 0: never). CUDA's synchronous copy of
/// page-locked memory returns once the device has the bytes; this one returns once they are
/// in the frame. The host cannot tell the two apart: its source bytes are taken at the call,
/// which is when CUDA's DMA reads them too, since no earlier work that could still write them
/// is pending (`host_sees_earlier_work`, as for pageable memory: kernels, host functions,
/// queued copies into page-locked memory are known finished), and everything the process
/// sends later runs after the copy on the server. A round trip (3.8-4.2 µs on the H100 and
/// H200) is half of a native 4 KiB copy, while a frame's bytes cost about 0.18 µs a KiB there
/// (docs/perf.md): past some 32 KiB the DMA of the arena's pages is the faster path.
fn pinned_in_frame_max() -> usize {
    static MAX: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *MAX.get_or_init(|| {
        std::env::var("PHOS_PINNED_IN_FRAME").ok().and_then(|v| v.trim().parse::<usize>().ok()).unwrap_or(32 << 10)
    })
}

/// A host-to-device copy of pageable memory (or a small synchronous one of page-locked
/// memory) in its call's frame: without waiting when it may (see the module); an async one
/// of pageable memory that may not waits for its answer, which proves its range and stream.
/// `None` where neither applies: the caller takes its other paths. `stream` is `None` for
/// `cudaMemcpy`.
///
/// # Safety
/// `src` is null or points to `count` readable bytes (the caller's contract with CUDA).
pub unsafe fn host_to_device_small(
    dst: u64,
    src: *const c_void,
    count: usize,
    kind: i32,
    stream: Option<u64>,
) -> Option<Result<(), CudaError>> {
    if count == 0 || count >= runtime::STAGED_MIN || src.is_null() {
        return None;
    }
    // Page-locked memory goes in the frame only for a small synchronous copy that returns at
    // once (see `pinned_in_frame_max`); otherwise it is a DMA of its own pages.
    let page_locked = !pageable(src as usize, count);
    if page_locked && (stream.is_some() || count > pinned_in_frame_max()) {
        return None;
    }
    let range = proofs::range(dst, count as u64)?;
    let device = runtime::current_device();
    let early = (stream.is_some() || !host_sees_earlier_work(device))
        && proofs::quiet()
        && proofs::covers(device, &[range], stream);
    if !early && (stream.is_none() || page_locked) {
        return None;
    }
    // SAFETY: `src` is not null and points to `count` readable bytes (this function's
    // contract); they are copied into the request before the call returns.
    let bytes = unsafe { std::slice::from_raw_parts(src as *const u8, count) };
    let direction = consts::cudaMemcpyHostToDevice;
    let (dst, src) = (Ptr::Device(dst), Ptr::In(bytes));
    Some(match stream {
        None => runtime::call_async(&CudaMemcpyRequest { dst, src, count: count as u64, kind, direction }),
        Some(stream) => {
            let req = CudaMemcpyAsyncRequest { dst, src, count: count as u64, kind, stream, direction };
            if early {
                runtime::call_async(&req)
            } else {
                let epoch = proofs::epoch();
                runtime::call(&req).map(|_| proofs::note(epoch, device, &[range], Some(stream)))
            }
        }
    })
}

/// A host<->device copy that waited succeeded: its device range is proven, and its stream
/// (`None` for a synchronous copy, which names none).
pub fn proved(epoch: proofs::Epoch, device_range: u64, count: usize, stream: Option<u64>) {
    if count == 0 {
        return;
    }
    if let Some(range) = proofs::range(device_range, count as u64) {
        proofs::note(epoch, runtime::current_device(), &[range], stream);
    }
}
