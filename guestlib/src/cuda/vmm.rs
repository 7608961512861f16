//! The guest half of virtual memory management: reading the driver's property and access
//! structures. Reservations, handles and mappings are the server's (spec/cuda.lapis).

use std::ffi::c_void;

use phos_protocol::cuda::{
    CuError, PhosMemCreateRequest, PhosMemGranularityRequest, PhosMemHandleDeviceRequest,
    PhosMemRetainAllocationHandleRequest, PhosMemSetAccessRequest,
};

use crate::runtime;

/// `CU_MEM_ALLOCATION_TYPE_PINNED`, `CU_MEM_LOCATION_TYPE_DEVICE`,
/// `CU_MEM_ACCESS_FLAGS_PROT_READWRITE`.
const ALLOCATION_PINNED: i32 = 1;
const LOCATION_DEVICE: i32 = 1;
const ACCESS_READWRITE: i32 = 3;
/// `sizeof(CUmemAllocationProp)` and `sizeof(CUmemAccessDesc)`.
const PROP_SIZE: usize = 32;
const ACCESS_DESC_SIZE: usize = 12;

fn int_at(b: &[u8], at: usize) -> i32 {
    i32::from_ne_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// The device a `CUmemAllocationProp` places memory on: pinned device memory, uncompressed
/// (what Phos carries; other kinds answer `CUDA_ERROR_NOT_SUPPORTED`, named in the log).
///
/// # Safety
/// `prop` must be null or a `CUmemAllocationProp`.
unsafe fn device_of(function: &str, prop: *const c_void) -> Result<i32, CuError> {
    if prop.is_null() {
        return Err(CuError::INVALID_VALUE);
    }
    // SAFETY: a `CUmemAllocationProp`, 32 bytes (this function's contract).
    let raw = unsafe { (prop as *const [u8; PROP_SIZE]).read_unaligned() };
    let (kind, location, device, compression) = (int_at(&raw, 0), int_at(&raw, 8), int_at(&raw, 12), raw[24]);
    if kind != ALLOCATION_PINNED || location != LOCATION_DEVICE || compression != 0 {
        return Err(not_supported(function, "memory other than uncompressed pinned device memory"));
    }
    Ok(device)
}

fn not_supported(function: &str, what: &str) -> CuError {
    if let Some(dropped) = phos_protocol::log_limit::GUEST_LINES.admit(function) {
        tracing::warn!(
            "{function}: {what} is not supported by Phos; returning CUDA_ERROR_NOT_SUPPORTED ({dropped} earlier lines dropped)"
        );
    }
    CuError::NOT_SUPPORTED
}

/// `cuMemGetAllocationGranularity`: the minimum and the recommended granularity are the
/// server's mapping granularity.
///
/// # Safety
/// `prop` null or a `CUmemAllocationProp`.
pub unsafe fn granularity(prop: *const c_void, option: i32) -> Result<u64, CuError> {
    if !(0..=1).contains(&option) {
        return Err(CuError::INVALID_VALUE);
    }
    // SAFETY: as this function's contract.
    let device = unsafe { device_of("cuMemGetAllocationGranularity", prop) }?;
    Ok(runtime::call(&PhosMemGranularityRequest { device })?.granularity)
}

/// `cuMemCreate`.
///
/// # Safety
/// `prop` null or a `CUmemAllocationProp`.
pub unsafe fn create(size: usize, prop: *const c_void, flags: u64) -> Result<u64, CuError> {
    if flags != 0 {
        return Err(CuError::INVALID_VALUE);
    }
    // SAFETY: as this function's contract.
    let device = unsafe { device_of("cuMemCreate", prop) }?;
    Ok(runtime::call(&PhosMemCreateRequest { size: size as u64, device })?.handle)
}

/// `cuMemSetAccess`: read-write access of the mapping's device (what mappings have from the
/// start); any other protection is not carried.
///
/// # Safety
/// `desc` must hold `count` `CUmemAccessDesc`s.
pub unsafe fn set_access(ptr: u64, size: usize, desc: *const c_void, count: usize) -> Result<(), CuError> {
    if desc.is_null() || count == 0 || count > 64 {
        return Err(CuError::INVALID_VALUE);
    }
    for i in 0..count {
        let at = (desc as *const u8).wrapping_add(i * ACCESS_DESC_SIZE);
        // SAFETY: descriptor `i` of `count` (this function's contract).
        let raw = unsafe { (at as *const [u8; ACCESS_DESC_SIZE]).read_unaligned() };
        let (location, device, flags) = (int_at(&raw, 0), int_at(&raw, 4), int_at(&raw, 8));
        if location != LOCATION_DEVICE {
            return Err(CuError::INVALID_VALUE);
        }
        if flags != ACCESS_READWRITE {
            return Err(not_supported("cuMemSetAccess", "access other than read-write"));
        }
        runtime::call(&PhosMemSetAccessRequest { ptr, size: size as u64, device })?;
    }
    Ok(())
}

/// `cuMemGetAllocationPropertiesFromHandle`: pinned memory of the handle's device.
///
/// # Safety
/// `prop` null or a writable `CUmemAllocationProp`.
pub unsafe fn properties(prop: *mut c_void, handle: u64) -> Result<(), CuError> {
    if prop.is_null() {
        return Err(CuError::INVALID_VALUE);
    }
    let device = runtime::call(&PhosMemHandleDeviceRequest { handle })?.device;
    let mut raw = [0u8; PROP_SIZE];
    raw[0..4].copy_from_slice(&ALLOCATION_PINNED.to_ne_bytes());
    raw[8..12].copy_from_slice(&LOCATION_DEVICE.to_ne_bytes());
    raw[12..16].copy_from_slice(&device.to_ne_bytes());
    // SAFETY: not null, a writable `CUmemAllocationProp` (this function's contract).
    unsafe { (prop as *mut [u8; PROP_SIZE]).write_unaligned(raw) };
    Ok(())
}

/// `cuMemGetAccess`: read-write for the device of the mapping at `ptr` (what mappings have from
/// the start here), none for another device; an address that is not mapped memory, or a
/// location that is not a device, is `CUDA_ERROR_INVALID_VALUE`.
///
/// # Safety
/// `location` must be null or a readable `CUmemLocation`.
pub unsafe fn get_access(location: *const c_void, ptr: u64) -> Result<u64, CuError> {
    /// `CU_MEM_ACCESS_FLAGS_PROT_NONE`.
    const ACCESS_NONE: u64 = 0;
    if location.is_null() {
        return Err(CuError::INVALID_VALUE);
    }
    // SAFETY: a `CUmemLocation`, 8 bytes (this function's contract).
    let raw = unsafe { (location as *const [u8; 8]).read_unaligned() };
    let (kind, device) = (int_at(&raw, 0), int_at(&raw, 4));
    if kind != LOCATION_DEVICE {
        return Err(CuError::INVALID_VALUE);
    }
    super::bridge::check_device(device)?;
    // The mapping's device, found by asking for each of the session's devices.
    let count = runtime::session()?.device_count;
    let mut mapped = false;
    for d in 0..count {
        if runtime::call(&PhosMemSetAccessRequest { ptr, size: 1, device: d }).is_ok() {
            if d == device {
                return Ok(ACCESS_READWRITE as u64);
            }
            mapped = true;
        }
    }
    if mapped { Ok(ACCESS_NONE) } else { Err(CuError::INVALID_VALUE) }
}

/// `cuMemRetainAllocationHandle`.
pub fn retain_handle(addr: u64) -> Result<u64, CuError> {
    Ok(runtime::call(&PhosMemRetainAllocationHandleRequest { addr })?.handle)
}
