//! Stream-ordered allocation (`cudaMallocAsync`, `cudaFreeAsync`) and memory pools, kept in
//! the guest. An allocation is mapped when the call is made, which makes it usable by the
//! stream from that point as CUDA promises; a free waits for the stream's earlier work, so
//! nothing queued before it can touch freed memory. Pools keep CUDA's attributes and usage
//! figures; the memory itself is the session's, as for `cudaMalloc`.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Mutex;

use phos_protocol::CudaError;
use phos_protocol::cudart::{CudaFreeRequest, CudaMallocRequest, PhosStreamMemNodeRequest};

use crate::runtime;

/// Pool handles start here (distinct, non-null, pointer-like values).
const HANDLE_BASE: u64 = 0x7000_0000_1000;

#[derive(Clone, Copy, Default)]
struct Pool {
    device: i32,
    is_default: bool,
    reuse: [i32; 3],
    release_threshold: u64,
    used: u64,
    used_high: u64,
    reserved_high: u64,
}

#[derive(Default)]
struct Pools {
    pools: HashMap<u64, Pool>,
    next: u64,
    /// Default and current pool per device.
    defaults: HashMap<i32, u64>,
    current: HashMap<i32, u64>,
    /// Stream-ordered allocations: address -> (pool, size).
    allocations: HashMap<u64, (u64, u64)>,
}

static POOLS: Mutex<Option<Pools>> = Mutex::new(None);

fn with<T>(f: impl FnOnce(&mut Pools) -> Result<T, CudaError>) -> Result<T, CudaError> {
    let mut g = POOLS.lock().unwrap_or_else(|p| p.into_inner());
    f(g.get_or_insert_with(Default::default))
}

fn check_device(device: i32) -> Result<(), CudaError> {
    let n = runtime::session()?.device_count;
    if (0..n).contains(&device) { Ok(()) } else { Err(CudaError::InvalidDevice) }
}

impl Pools {
    fn create(&mut self, device: i32, is_default: bool) -> u64 {
        let h = HANDLE_BASE + self.next * 0x10;
        self.next += 1;
        self.pools.insert(h, Pool { device, is_default, reuse: [1, 1, 1], ..Default::default() });
        h
    }

    fn default_of(&mut self, device: i32) -> u64 {
        if let Some(&h) = self.defaults.get(&device) {
            return h;
        }
        let h = self.create(device, true);
        self.defaults.insert(device, h);
        h
    }

    fn current_of(&mut self, device: i32) -> u64 {
        match self.current.get(&device) {
            Some(&h) => h,
            None => self.default_of(device),
        }
    }

    fn pool(&mut self, h: u64) -> Result<&mut Pool, CudaError> {
        self.pools.get_mut(&h).ok_or(CudaError::InvalidValue)
    }
}

/// Whether `ptr` is a block of `cudaMallocAsync`'s not freed yet (a free node may name it).
pub fn is_async_block(ptr: u64) -> bool {
    with(|s| Ok(s.allocations.contains_key(&ptr))).unwrap_or(false)
}

/// `cudaMallocAsync` and `cudaMallocFromPoolAsync`. On a capturing stream the capture takes an
/// allocation node (its block reserved now, as CUDA's graph allocation is), which the pool's
/// figures do not count.
///
/// # Safety
/// A non-null `out` must be writable.
pub unsafe fn malloc_async(
    out: *mut *mut c_void,
    size: usize,
    pool: Option<u64>,
    stream: *mut c_void,
) -> Result<(), CudaError> {
    if out.is_null() {
        return Err(CudaError::InvalidValue);
    }
    let device = runtime::current_device();
    check_device(device)?;
    let pool = match pool {
        Some(p) => with(|s| s.pool(p).map(|_| p))?,
        None => with(|s| Ok(s.current_of(device)))?,
    };
    if size != 0 {
        let captured = runtime::call(&PhosStreamMemNodeRequest {
            stream: stream as usize as u64,
            free: 0,
            device,
            size: size as u64,
            dptr: 0,
            asyncBlock: 0,
        })?;
        if captured.captured == 1 {
            // SAFETY: `out` is not null (checked above) and writable: this function's contract.
            unsafe { *out = captured.allocated as usize as *mut c_void };
            return Ok(());
        }
    }
    let addr = if size == 0 { 0 } else { runtime::call(&CudaMallocRequest { size: size as u64 })?.devPtr };
    with(|s| {
        s.allocations.insert(addr, (pool, size as u64));
        let p = s.pool(pool)?;
        p.used += size as u64;
        p.used_high = p.used_high.max(p.used);
        p.reserved_high = p.reserved_high.max(p.used);
        Ok(())
    })?;
    // SAFETY: `out` is not null (checked above) and points to a writable value of its type: this
    // function's contract, which is the export's.
    unsafe { *out = addr as usize as *mut c_void };
    Ok(())
}

/// `cudaFreeAsync`: on a capturing stream the capture takes a free node (of a graph allocation
/// or a block of `cudaMallocAsync`'s); else the block is freed once the stream's earlier work
/// is done (the server waits for it).
pub fn free_async(ptr: *mut c_void, stream: *mut c_void) -> Result<(), CudaError> {
    if ptr.is_null() {
        return Ok(());
    }
    let dptr = ptr as usize as u64;
    let captured = runtime::call(&PhosStreamMemNodeRequest {
        stream: stream as usize as u64,
        free: 1,
        device: 0,
        size: 0,
        dptr,
        asyncBlock: i32::from(is_async_block(dptr)),
    })?;
    if captured.captured == 1 {
        return Ok(());
    }
    runtime::call(&CudaFreeRequest { devPtr: dptr })?;
    with(|s| {
        if let Some((pool, size)) = s.allocations.remove(&(ptr as usize as u64))
            && let Ok(p) = s.pool(pool)
        {
            p.used = p.used.saturating_sub(size);
        }
        Ok(())
    })
}

pub unsafe fn device_default_pool(out: *mut u64, device: i32) -> Result<(), CudaError> {
    if out.is_null() {
        return Err(CudaError::InvalidValue);
    }
    check_device(device)?;
    let h = with(|s| Ok(s.default_of(device)))?;
    // SAFETY: `out` is not null (checked above) and points to a writable value of its type: this
    // function's contract, which is the export's.
    unsafe { *out = h };
    Ok(())
}

pub unsafe fn device_current_pool(out: *mut u64, device: i32) -> Result<(), CudaError> {
    if out.is_null() {
        return Err(CudaError::InvalidValue);
    }
    check_device(device)?;
    let h = with(|s| Ok(s.current_of(device)))?;
    // SAFETY: `out` is not null (checked above) and points to a writable value of its type: this
    // function's contract, which is the export's.
    unsafe { *out = h };
    Ok(())
}

pub fn set_device_pool(device: i32, pool: u64) -> Result<(), CudaError> {
    check_device(device)?;
    with(|s| {
        if s.pool(pool)?.device != device {
            return Err(CudaError::InvalidDevice);
        }
        s.current.insert(device, pool);
        Ok(())
    })
}

/// `struct cudaMemPoolProps` starts with `allocType`, `handleTypes` and the location
/// (`type`, `id`): pinned device memory is what Phos allocates.
pub unsafe fn create_pool(out: *mut u64, props: *const c_void) -> Result<(), CudaError> {
    if out.is_null() || props.is_null() {
        return Err(CudaError::InvalidValue);
    }
    // SAFETY: not null (checked above): a `cudaMemPoolProps`, whose first four fields are
    // these ints (this function's contract), read without assuming alignment.
    let words = unsafe { (props as *const [i32; 4]).read_unaligned() };
    let [alloc_type, handle_types, location_type, device] = words;
    // cudaMemAllocationTypePinned, cudaMemHandleTypeNone, cudaMemLocationTypeDevice.
    if alloc_type != 1 || location_type != 1 {
        return Err(CudaError::InvalidValue);
    }
    if handle_types != 0 {
        // Shareable handles would let other processes map the memory.
        return Err(CudaError::NotSupported);
    }
    check_device(device)?;
    let h = with(|s| Ok(s.create(device, false)))?;
    // SAFETY: `out` is not null (checked above) and points to a writable value of its type: this
    // function's contract, which is the export's.
    unsafe { *out = h };
    Ok(())
}

pub fn destroy_pool(pool: u64) -> Result<(), CudaError> {
    with(|s| {
        let p = *s.pool(pool)?;
        if p.is_default {
            return Err(CudaError::InvalidValue);
        }
        s.pools.remove(&pool);
        s.current.retain(|_, h| *h != pool);
        Ok(())
    })
}

/// `cudaMemPoolAttr` values.
const REUSE_FOLLOW_EVENT_DEPENDENCIES: i32 = 1;
const REUSE_ALLOW_INTERNAL_DEPENDENCIES: i32 = 3;
const RELEASE_THRESHOLD: i32 = 4;
const RESERVED_MEM_CURRENT: i32 = 5;
const RESERVED_MEM_HIGH: i32 = 6;
const USED_MEM_CURRENT: i32 = 7;
const USED_MEM_HIGH: i32 = 8;

pub unsafe fn set_attribute(pool: u64, attr: i32, value: *const c_void) -> Result<(), CudaError> {
    if value.is_null() {
        return Err(CudaError::InvalidValue);
    }
    with(|s| {
        let p = s.pool(pool)?;
        match attr {
            REUSE_FOLLOW_EVENT_DEPENDENCIES..=REUSE_ALLOW_INTERNAL_DEPENDENCIES => {
                // SAFETY: not null (checked above): for these attributes an `int` (this
                // function's contract, `cudaMemPoolSetAttribute`'s), read unaligned.
                p.reuse[(attr - 1) as usize] = unsafe { (value as *const i32).read_unaligned() }
            }
            // SAFETY: not null (checked above): for this attribute a `cuuint64_t`.
            RELEASE_THRESHOLD => p.release_threshold = unsafe { (value as *const u64).read_unaligned() },
            // The high-water marks may only be reset.
            RESERVED_MEM_HIGH | USED_MEM_HIGH => {
                // SAFETY: not null (checked above): for these attributes a `cuuint64_t`.
                if unsafe { (value as *const u64).read_unaligned() } != 0 {
                    return Err(CudaError::InvalidValue);
                }
                if attr == USED_MEM_HIGH {
                    p.used_high = p.used;
                } else {
                    p.reserved_high = p.used;
                }
            }
            _ => return Err(CudaError::InvalidValue),
        }
        Ok(())
    })
}

pub unsafe fn get_attribute(pool: u64, attr: i32, value: *mut c_void) -> Result<(), CudaError> {
    if value.is_null() {
        return Err(CudaError::InvalidValue);
    }
    with(|s| {
        let p = *s.pool(pool)?;
        let v64 = match attr {
            REUSE_FOLLOW_EVENT_DEPENDENCIES..=REUSE_ALLOW_INTERNAL_DEPENDENCIES => {
                // SAFETY: not null (checked above): for these attributes a writable `int` (this
                // function's contract, `cudaMemPoolGetAttribute`'s).
                unsafe { (value as *mut i32).write_unaligned(p.reuse[(attr - 1) as usize]) };
                return Ok(());
            }
            RELEASE_THRESHOLD => p.release_threshold,
            RESERVED_MEM_CURRENT | USED_MEM_CURRENT => p.used,
            RESERVED_MEM_HIGH => p.reserved_high,
            USED_MEM_HIGH => p.used_high,
            _ => return Err(CudaError::InvalidValue),
        };
        // SAFETY: not null (checked above): for these attributes a writable `cuuint64_t`.
        unsafe { (value as *mut u64).write_unaligned(v64) };
        Ok(())
    })
}

pub fn trim(pool: u64) -> Result<(), CudaError> {
    // Freed memory goes back at once; nothing is held to trim.
    with(|s| s.pool(pool).map(|_| ()))
}

/// `cudaMemAccessDesc` / `cudaMemLocation`: (type, id) then flags; only the pool's own
/// device can be given (or asked about) read-write access.
pub unsafe fn set_access(pool: u64, list: *const c_void, count: usize) -> Result<(), CudaError> {
    if count > 0 && list.is_null() {
        return Err(CudaError::InvalidValue);
    }
    let device = with(|s| s.pool(pool).map(|p| p.device))?;
    for i in 0..count {
        // SAFETY: `i < count`: within the `count` access descriptors of `list`, not null when
        // `count > 0` (checked above; this function's contract).
        let at = unsafe { (list as *const [i32; 3]).add(i) };
        // SAFETY: a `cudaMemAccessDesc` there (location type, id, flags), read unaligned.
        let [location_type, id, flags] = unsafe { at.read_unaligned() };
        if location_type != 1 {
            return Err(CudaError::InvalidValue);
        }
        check_device(id)?;
        if id == device && flags != 3 {
            return Err(CudaError::InvalidValue);
        }
        if id != device && flags != 0 {
            return Err(CudaError::InvalidDevice);
        }
    }
    Ok(())
}

pub unsafe fn get_access(flags: *mut i32, pool: u64, location: *const c_void) -> Result<(), CudaError> {
    if flags.is_null() || location.is_null() {
        return Err(CudaError::InvalidValue);
    }
    let device = with(|s| s.pool(pool).map(|p| p.device))?;
    // SAFETY: not null (checked above): a `cudaMemLocation` (this function's contract), read
    // without assuming alignment.
    let [location_type, id] = unsafe { (location as *const [i32; 2]).read_unaligned() };
    if location_type != 1 {
        return Err(CudaError::InvalidValue);
    }
    check_device(id)?;
    // SAFETY: `flags` is not null (checked above) and points to a writable value of its type: this
    // function's contract, which is the export's.
    unsafe { *flags = if id == device { 3 } else { 0 } };
    Ok(())
}

/// The device a `cudaMemLocation` names for CUDA 13's location-based pool calls: a device
/// location and pinned allocations (`cudaMemAllocationTypePinned`) only.
///
/// # Safety
/// A non-null `location` must point to a `cudaMemLocation`.
pub unsafe fn location_device(location: *const c_void, alloc_type: i32) -> Result<i32, CudaError> {
    if location.is_null() || alloc_type != 1 {
        return Err(CudaError::InvalidValue);
    }
    // SAFETY: not null (checked above): a `cudaMemLocation` (this function's contract), read
    // without assuming alignment.
    let [location_type, id] = unsafe { (location as *const [i32; 2]).read_unaligned() };
    if location_type != 1 {
        return Err(CudaError::NotSupported);
    }
    check_device(id)?;
    Ok(id)
}
