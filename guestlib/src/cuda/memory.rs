//! Driver memory calls the runtime has no twin for: memsets of 16- and 32-bit patterns and
//! pointer attributes.

use std::ffi::c_void;

use phos_protocol::cuda::{CuError, CuMemGetAddressRangeV2Request};

use super::{bridge, context};
use crate::cudart::stubs as cudart;

/// `cudaMemcpyHostToDevice`.
const HOST_TO_DEVICE: i32 = 1;
/// The largest pattern buffer a 16/32-bit memset builds at once.
const PATTERN_CHUNK: usize = 4 << 20;

/// `cuMemsetD16/D32[Async]`: `count` copies of `pattern` from `dst`. A pattern whose bytes are
/// all equal is a byte memset; any other is written as data, a chunk of the pattern at a
/// time (copies on `stream` keep its order).
pub fn memset_pattern<const N: usize>(
    dst: u64,
    pattern: [u8; N],
    count: usize,
    stream: Option<*mut c_void>,
) -> Result<(), CuError> {
    let bytes = count.checked_mul(N).ok_or(CuError::INVALID_VALUE)?;
    if !dst.is_multiple_of(N as u64) {
        return Err(CuError::INVALID_VALUE);
    }
    if pattern.iter().all(|&b| b == pattern[0]) {
        let value = i32::from(pattern[0]);
        return bridge::runtime(|| match stream {
            // SAFETY: the runtime's exports check their device arguments; no host memory is read.
            Some(s) => unsafe { cudart::cudaMemsetAsync(bridge::dptr(dst), value, bytes, s) },
            // SAFETY: the runtime's export checks its device argument; no host memory is read.
            None => unsafe { cudart::cudaMemset(bridge::dptr(dst), value, bytes) },
        });
    }
    let chunk: Vec<u8> = pattern.iter().copied().cycle().take(bytes.min(PATTERN_CHUNK / N * N)).collect();
    let mut done = 0usize;
    while done < bytes {
        let n = chunk.len().min(bytes - done);
        let at = dst + done as u64;
        let src = chunk.as_ptr() as *const c_void;
        bridge::runtime(|| match stream {
            // SAFETY: `src` is `n` readable bytes of `chunk`, which outlives the call (a copy
            // from pageable memory returns once the data is taken); the runtime checks the
            // destination against the session's memory.
            Some(s) => unsafe { cudart::cudaMemcpyAsync(bridge::dptr(at), src, n, HOST_TO_DEVICE, s) },
            // SAFETY: `src` is `n` readable bytes of `chunk`, which outlives this synchronous
            // copy; the runtime checks the destination against the session's memory.
            None => unsafe { cudart::cudaMemcpy(bridge::dptr(at), src, n, HOST_TO_DEVICE) },
        })?;
        done += n;
    }
    Ok(())
}

/// `CUpointer_attribute` values Phos answers.
mod attr {
    pub const CONTEXT: i32 = 1;
    pub const MEMORY_TYPE: i32 = 2;
    pub const DEVICE_POINTER: i32 = 3;
    pub const HOST_POINTER: i32 = 4;
    pub const BUFFER_ID: i32 = 7;
    pub const IS_MANAGED: i32 = 8;
    pub const DEVICE_ORDINAL: i32 = 9;
    pub const RANGE_START_ADDR: i32 = 11;
    pub const RANGE_SIZE: i32 = 12;
}

/// `CU_MEMORYTYPE_HOST` and `CU_MEMORYTYPE_DEVICE`.
const MEMORYTYPE_HOST: u32 = 1;
const MEMORYTYPE_DEVICE: u32 = 2;

/// What Phos knows of a pointer: the runtime's `cudaPointerAttributes` plus, for device
/// memory, the allocation it lies in.
struct Pointer {
    /// `cudaMemoryType`: 0 unregistered, 1 host, 2 device.
    kind: i32,
    device: i32,
    device_ptr: u64,
    host_ptr: u64,
    range: Option<(u64, u64)>,
}

fn pointer(ptr: u64) -> Result<Pointer, CuError> {
    let mut raw = [0u8; 88];
    // SAFETY: `raw` holds the largest `cudaPointerAttributes` (CUDA 13's, 88 bytes).
    bridge::runtime(|| unsafe {
        cudart::cudaPointerGetAttributes(raw.as_mut_ptr() as *mut c_void, bridge::dptr(ptr))
    })?;
    let int = |at: usize| i32::from_ne_bytes(raw[at..at + 4].try_into().unwrap_or_default());
    let long = |at: usize| u64::from_ne_bytes(raw[at..at + 8].try_into().unwrap_or_default());
    let kind = int(0);
    let range = if kind == 2 {
        let r = crate::runtime::call(&CuMemGetAddressRangeV2Request { dptr: ptr })?;
        Some((r.pbase, r.psize))
    } else {
        None
    };
    Ok(Pointer { kind, device: int(4), device_ptr: long(8), host_ptr: long(16), range })
}

/// `cuPointerSetAttribute`: `CU_POINTER_ATTRIBUTE_SYNC_MEMOPS` is the one attribute the
/// driver lets a program set, on device memory (allocated or managed) of the session; it is
/// accepted and has nothing to change (a synchronous copy or memset through Phos returns once
/// done). Any other attribute, or other memory, is `CUDA_ERROR_INVALID_VALUE`.
///
/// # Safety
/// `value` must be null or point to an `unsigned int`.
pub unsafe fn set_attribute(value: *const c_void, which: i32, ptr: u64) -> Result<(), CuError> {
    const SYNC_MEMOPS: i32 = 6;
    if value.is_null() || which != SYNC_MEMOPS {
        return Err(CuError::INVALID_VALUE);
    }
    // `cudaMemoryTypeDevice` or `cudaMemoryTypeManaged`.
    if !matches!(pointer(ptr)?.kind, 2 | 3) {
        return Err(CuError::INVALID_VALUE);
    }
    Ok(())
}

/// The bytes `cuPointerGetAttribute` writes for `attribute` of `ptr`: `None` for memory the
/// session does not know (CUDA_ERROR_INVALID_VALUE from `cuPointerGetAttribute`, zeros from
/// `cuPointerGetAttributes`).
fn attribute(attribute: i32, p: &Pointer) -> Result<Option<Vec<u8>>, CuError> {
    if p.kind == 0 {
        return Ok(None);
    }
    let v = match attribute {
        attr::CONTEXT => context::primary_handle(p.device).to_ne_bytes().to_vec(),
        attr::MEMORY_TYPE => (if p.kind == 1 { MEMORYTYPE_HOST } else { MEMORYTYPE_DEVICE }).to_ne_bytes().to_vec(),
        attr::DEVICE_POINTER => p.device_ptr.to_ne_bytes().to_vec(),
        attr::HOST_POINTER if p.host_ptr == 0 => return Err(CuError::INVALID_VALUE),
        attr::HOST_POINTER => p.host_ptr.to_ne_bytes().to_vec(),
        // An allocation's id: its base address, unique while it lives.
        attr::BUFFER_ID => p.range.map_or(p.host_ptr, |r| r.0).to_ne_bytes().to_vec(),
        // A `bool`.
        attr::IS_MANAGED => vec![0],
        attr::DEVICE_ORDINAL => p.device.to_ne_bytes().to_vec(),
        attr::RANGE_START_ADDR => p.range.map_or(p.device_ptr, |r| r.0).to_ne_bytes().to_vec(),
        attr::RANGE_SIZE => p.range.map_or(0, |r| r.1).to_ne_bytes().to_vec(),
        other => {
            if let Some(dropped) = phos_protocol::log_limit::GUEST_LINES.admit("cuPointerGetAttribute") {
                tracing::warn!(
                    "cuPointerGetAttribute: attribute {other} is not supported by Phos; returning CUDA_ERROR_NOT_SUPPORTED ({dropped} earlier lines dropped)"
                );
            }
            return Err(CuError::NOT_SUPPORTED);
        }
    };
    Ok(Some(v))
}

/// `cuPointerGetAttribute`.
///
/// # Safety
/// `data` must be null or writable for the attribute's value.
pub unsafe fn get_attribute(data: *mut c_void, which: i32, ptr: u64) -> Result<(), CuError> {
    if data.is_null() {
        return Err(CuError::INVALID_VALUE);
    }
    let p = pointer(ptr)?;
    let bytes = attribute(which, &p)?.ok_or(CuError::INVALID_VALUE)?;
    // SAFETY: `data` is not null and holds the attribute's value (this function's contract).
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), data as *mut u8, bytes.len()) };
    Ok(())
}

/// `cuPointerGetAttributes`: each attribute into its own place; memory the session does not
/// know reads as zeros, as NVIDIA's driver answers.
///
/// # Safety
/// `attributes` must hold `count` attributes and `data` `count` places, each null or
/// writable for its attribute's value.
pub unsafe fn get_attributes(
    count: u32,
    attributes: *const i32,
    data: *mut *mut c_void,
    ptr: u64,
) -> Result<(), CuError> {
    if count == 0 || attributes.is_null() || data.is_null() {
        return Err(CuError::INVALID_VALUE);
    }
    let p = pointer(ptr)?;
    for i in 0..count as usize {
        // SAFETY: `i < count`, the length of `attributes` (this function's contract).
        let at = unsafe { attributes.add(i) };
        // SAFETY: the place of one attribute, readable.
        let which = unsafe { at.read() };
        // SAFETY: `i < count`, the length of `data` (this function's contract).
        let slot = unsafe { data.add(i) };
        // SAFETY: that slot, readable.
        let out = unsafe { slot.read() };
        if out.is_null() {
            continue;
        }
        let bytes = match attribute(which, &p)? {
            Some(b) => b,
            None => vec![0u8; zero_size(which)],
        };
        // SAFETY: `out` is not null and holds the attribute's value (this function's
        // contract).
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), out as *mut u8, bytes.len()) };
    }
    Ok(())
}

/// The size of an attribute's value, for writing zeros.
fn zero_size(which: i32) -> usize {
    match which {
        attr::MEMORY_TYPE | attr::DEVICE_ORDINAL => 4,
        attr::IS_MANAGED => 1,
        _ => 8,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn device(range: (u64, u64)) -> Pointer {
        Pointer { kind: 2, device: 0, device_ptr: range.0 + 16, host_ptr: 0, range: Some(range) }
    }

    #[test]
    fn device_memory_reads_as_the_driver_says() {
        let p = device((0x7000_0000, 4096));
        assert_eq!(attribute(attr::MEMORY_TYPE, &p), Ok(Some(MEMORYTYPE_DEVICE.to_ne_bytes().to_vec())));
        assert_eq!(attribute(attr::RANGE_START_ADDR, &p), Ok(Some(0x7000_0000u64.to_ne_bytes().to_vec())));
        assert_eq!(attribute(attr::RANGE_SIZE, &p), Ok(Some(4096u64.to_ne_bytes().to_vec())));
        assert_eq!(attribute(attr::HOST_POINTER, &p), Err(CuError::INVALID_VALUE));
        assert_eq!(attribute(attr::IS_MANAGED, &p), Ok(Some(vec![0])));
    }

    #[test]
    fn unknown_memory_and_attributes() {
        let unknown = Pointer { kind: 0, device: -2, device_ptr: 0, host_ptr: 0, range: None };
        assert_eq!(attribute(attr::DEVICE_POINTER, &unknown), Ok(None));
        assert_eq!(attribute(15, &device((0x7000_0000, 16))), Err(CuError::NOT_SUPPORTED));
    }
}
