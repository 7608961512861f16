//! Page-locked host memory (`cudaMallocHost`, `cudaHostAlloc`): it belongs to the guest
//! process, so it is allocated here. The table lets `cudaFreeHost` refuse pointers it did not
//! hand out, as CUDA does.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Mutex;

use phos_protocol::CudaError;

/// `cudaHostAllocPortable | cudaHostAllocMapped | cudaHostAllocWriteCombined`
const KNOWN_FLAGS: u32 = 0x1 | 0x2 | 0x4;

static ALLOCATIONS: Mutex<Option<HashMap<usize, (usize, u32)>>> = Mutex::new(None);

/// Allocate `size` bytes of page-aligned host memory.
pub fn alloc(size: usize, flags: u32) -> Result<*mut c_void, CudaError> {
    if flags & !KNOWN_FLAGS != 0 {
        return Err(CudaError::InvalidValue);
    }
    if size == 0 {
        return Ok(std::ptr::null_mut());
    }
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            size,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(CudaError::MemoryAllocation);
    }
    ALLOCATIONS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get_or_insert_with(HashMap::new)
        .insert(p as usize, (size, flags));
    Ok(p)
}

/// Free what [`alloc`] returned; a null pointer is a no-op.
///
/// # Safety
/// The memory must not be used afterwards (the pages are unmapped).
pub unsafe fn free(p: *mut c_void) -> Result<(), CudaError> {
    if p.is_null() {
        return Ok(());
    }
    let entry = ALLOCATIONS.lock().unwrap_or_else(|e| e.into_inner()).as_mut().and_then(|m| m.remove(&(p as usize)));
    match entry {
        Some((size, _)) => {
            unsafe { libc::munmap(p, size) };
            Ok(())
        }
        None => Err(CudaError::InvalidValue),
    }
}

/// Base, size and flags of the allocation containing `addr`, if it is page-locked memory of ours.
pub fn lookup(addr: usize) -> Option<(usize, usize, u32)> {
    let g = ALLOCATIONS.lock().unwrap_or_else(|e| e.into_inner());
    g.as_ref()?.iter().find(|(base, (size, _))| addr >= **base && addr - **base < *size).map(|(b, (s, f))| (*b, *s, *f))
}

/// `cudaHostRegisterPortable | Mapped | IoMemory | ReadOnly`.
const REGISTER_FLAGS: u32 = 0x1 | 0x2 | 0x4 | 0x8;

/// A range registered with `cudaHostRegister`: (size, flags, device), by base address.
type Registered = HashMap<usize, (usize, u32, i32)>;

static REGISTERED: Mutex<Option<Registered>> = Mutex::new(None);

/// `cudaHostRegister`: the range must not overlap page-locked memory already known.
pub fn register(ptr: usize, size: usize, flags: u32, device: i32) -> Result<(), CudaError> {
    if ptr == 0 || size == 0 || flags & !REGISTER_FLAGS != 0 {
        return Err(CudaError::InvalidValue);
    }
    let end = ptr.checked_add(size).ok_or(CudaError::InvalidValue)?;
    let overlaps = |base: usize, len: usize| ptr < base + len && base < end;
    let allocated = ALLOCATIONS.lock().unwrap_or_else(|e| e.into_inner());
    if allocated.as_ref().is_some_and(|m| m.iter().any(|(b, (s, _))| overlaps(*b, *s))) {
        return Err(CudaError::HostMemoryAlreadyRegistered);
    }
    let mut g = REGISTERED.lock().unwrap_or_else(|e| e.into_inner());
    let table = g.get_or_insert_with(HashMap::new);
    if table.iter().any(|(b, (s, _, _))| overlaps(*b, *s)) {
        return Err(CudaError::HostMemoryAlreadyRegistered);
    }
    table.insert(ptr, (size, flags, device));
    Ok(())
}

/// `cudaHostUnregister`: `ptr` must be the base of a registered range.
pub fn unregister(ptr: usize) -> Result<(), CudaError> {
    let mut g = REGISTERED.lock().unwrap_or_else(|e| e.into_inner());
    g.as_mut().and_then(|m| m.remove(&ptr)).map(|_| ()).ok_or(CudaError::HostMemoryNotRegistered)
}

/// Base, size, flags and device of the page-locked range (allocated or registered) that
/// contains `addr`.
pub fn lookup_any(addr: usize) -> Option<(usize, usize, u32, i32)> {
    if let Some((base, size, flags)) = lookup(addr) {
        return Some((base, size, flags, 0));
    }
    let g = REGISTERED.lock().unwrap_or_else(|e| e.into_inner());
    g.as_ref()?
        .iter()
        .find(|(base, (size, _, _))| addr >= **base && addr - **base < *size)
        .map(|(b, (s, f, d))| (*b, *s, *f, *d))
}
