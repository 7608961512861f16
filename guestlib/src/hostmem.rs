//! Page-locked host memory (`cudaMallocHost`, `cudaHostAlloc`, `cudaHostRegister`).
//!
//! Where the process has a pinned arena ([`phos_protocol::host_arena`]), allocations are made
//! in it by the API server (`phosHostAlloc`): the server registers them with the driver, so
//! copies from and to them are DMAs of these very pages (`phosMemcpyPinned`), and kernels
//! reach them at the same address. Otherwise (a channel on a socket, an arena that is full,
//! refused or unavailable) the memory is the process's own and copies take the ordinary
//! paths. Either way the table lets `cudaFreeHost` refuse pointers it did not hand out, as
//! CUDA does.
//!
//! Managed memory (`cudaMallocManaged`) is arena memory too, marked as such: the host and the
//! device reach the same pages at the same address (docs/architecture.md, "Managed memory").

use std::collections::BTreeMap;
use std::ffi::c_void;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

use phos_protocol::CudaError;
use phos_protocol::cudart::{PhosHostAllocRequest, PhosHostFreeRequest};
use phos_protocol::host_arena::{self, BASE, Mapping};

use crate::runtime;

/// `cudaHostAllocPortable | cudaHostAllocMapped | cudaHostAllocWriteCombined`
const KNOWN_FLAGS: u32 = 0x1 | 0x2 | 0x4;

/// One allocation: its size, flags, and its device address when it is in the arena.
#[derive(Clone, Copy)]
struct HostAlloc {
    size: usize,
    flags: u32,
    device: Option<u64>,
    /// Managed memory (`cudaMallocManaged`, with its attach flags in `flags`), not
    /// page-locked memory: `cudaFreeHost` and the page-locked queries do not see it.
    managed: bool,
}

static ALLOCATIONS: Mutex<BTreeMap<usize, HostAlloc>> = Mutex::new(BTreeMap::new());

/// The process's arena: its mapping, which keeps the file (sent with each shared-memory
/// channel).
struct Arena {
    mapping: Mapping,
    /// A forked child inherits the mapping, but the arena is its parent's session's.
    pid: u32,
}

static ARENA: OnceLock<Option<Arena>> = OnceLock::new();
/// Where the arena ends (0 before it exists): lets a copy of other memory skip every lookup.
static ARENA_END: AtomicU64 = AtomicU64::new(0);
/// The server answered that it cannot use the arena: stop asking.
static ARENA_REFUSED: AtomicBool = AtomicBool::new(false);

/// The arena's size: `PHOS_PINNED_ARENA` (bytes, with an optional K/M/G/T suffix; 0 or
/// `off` for none), else [`host_arena::DEFAULT_BYTES`].
fn arena_bytes() -> u64 {
    let Ok(v) = std::env::var("PHOS_PINNED_ARENA") else { return host_arena::DEFAULT_BYTES };
    let v = v.trim().trim_end_matches("iB").trim_end_matches('B');
    if v.eq_ignore_ascii_case("off") {
        return 0;
    }
    let (digits, shift) = match v.chars().last().map(|c| c.to_ascii_uppercase()) {
        Some('K') => (&v[..v.len() - 1], 10),
        Some('M') => (&v[..v.len() - 1], 20),
        Some('G') => (&v[..v.len() - 1], 30),
        Some('T') => (&v[..v.len() - 1], 40),
        _ => (v, 0),
    };
    match digits.trim().parse::<u64>() {
        Ok(n) => n.checked_shl(shift).filter(|b| b >> shift == n).unwrap_or(host_arena::MAX_BYTES),
        Err(_) => {
            tracing::warn!("PHOS_PINNED_ARENA={v:?} is not a size; using the default");
            host_arena::DEFAULT_BYTES
        }
    }
}

fn arena() -> Option<&'static Arena> {
    let a = ARENA
        .get_or_init(|| {
            let bytes = arena_bytes();
            if bytes == 0 {
                return None;
            }
            match host_arena::create(bytes).and_then(Mapping::at_base) {
                Ok(mapping) => {
                    ARENA_END.store(BASE + mapping.len(), Ordering::Relaxed);
                    Some(Arena { mapping, pid: std::process::id() })
                }
                Err(e) => {
                    tracing::info!("no pinned arena ({e}); page-locked memory is copied through the channel");
                    None
                }
            }
        })
        .as_ref()?;
    (a.pid == std::process::id()).then_some(a)
}

/// The arena file and its size, for a channel that moves to shared memory.
pub fn arena_for_channel() -> Option<(&'static OwnedFd, u64)> {
    arena().map(|a| (a.mapping.fd(), a.mapping.len()))
}

/// Allocate `size` bytes of page-aligned page-locked host memory.
pub fn alloc(size: usize, flags: u32) -> Result<*mut c_void, CudaError> {
    if flags & !KNOWN_FLAGS != 0 {
        return Err(CudaError::InvalidValue);
    }
    if size == 0 {
        return Ok(std::ptr::null_mut());
    }
    if let Some(p) = alloc_in_arena(size, flags) {
        return Ok(p);
    }
    // SAFETY: a new private anonymous mapping where the kernel chooses: no memory in use changes.
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
    table().insert(p as usize, HostAlloc { size, flags, device: None, managed: false });
    Ok(p)
}

/// An allocation in the arena, if there is one and the server places it.
fn alloc_in_arena(size: usize, flags: u32) -> Option<*mut c_void> {
    let (host, device) = place_in_arena(size, flags)?;
    table().insert(host, HostAlloc { size, flags, device: Some(device), managed: false });
    Some(host as *mut c_void)
}

/// Pages of the arena the server placed and registered for `size` bytes: (address, device
/// address); `None` where there is no arena or the server does not place them.
fn place_in_arena(size: usize, flags: u32) -> Option<(usize, u64)> {
    let a = arena()?;
    if ARENA_REFUSED.load(Ordering::Relaxed) {
        return None;
    }
    let reply = match runtime::call(&PhosHostAllocRequest { size: size as u64, flags }) {
        Ok(r) => r,
        Err(CudaError::NotSupported) => {
            // The server has no arena (the channel is on a socket, or it could not map it).
            ARENA_REFUSED.store(true, Ordering::Relaxed);
            return None;
        }
        Err(e) => {
            // Full, or over the tenant's quota of pinned memory: the process's own memory.
            tracing::debug!("pinned allocation of {size} bytes outside the arena: {e:?}");
            return None;
        }
    };
    if !a.mapping.contains(reply.host, size as u64) {
        tracing::error!("the server placed pinned memory outside the arena ({:#x})", reply.host);
        return None;
    }
    Some((reply.host as usize, reply.device))
}

/// `cudaMemAttachGlobal`, `cudaMemAttachHost`, `cudaMemAttachSingle`.
pub const ATTACH_GLOBAL: u32 = 0x1;
pub const ATTACH_HOST: u32 = 0x2;
pub const ATTACH_SINGLE: u32 = 0x4;

/// `cudaMallocManaged`: `size` bytes the host and the device both reach at the returned
/// address, pages of the arena (mapped and registered by the server like page-locked
/// memory). Without an arena there is no memory both sides can reach: not supported.
pub fn alloc_managed(size: usize, flags: u32) -> Result<*mut c_void, CudaError> {
    if flags != ATTACH_GLOBAL && flags != ATTACH_HOST {
        return Err(CudaError::InvalidValue);
    }
    // As NVIDIA's runtime (measured on the H100): nothing asked for, success and NULL.
    if size == 0 {
        return Ok(std::ptr::null_mut());
    }
    // Portable and mapped: every device of the session reaches it at its own address.
    let placed = place_in_arena(size, 0x1 | 0x2);
    if arena().is_none() || ARENA_REFUSED.load(Ordering::Relaxed) {
        // No arena here, or the server has none (it answered the first allocation so).
        crate::log::not_supported_once(
            "cudaMallocManaged without the pinned arena (a channel on a socket or vsock, PHOS_PINNED_ARENA=off)",
            "cudaErrorNotSupported",
        );
        return Err(CudaError::NotSupported);
    }
    // Otherwise `None` is a full arena or the tenant's pinned_host_memory quota.
    let (host, device) = placed.ok_or(CudaError::MemoryAllocation)?;
    if device != host as u64 {
        // Managed memory has one address for the host and the device.
        tracing::error!("cudaMallocManaged: the server mapped {host:#x} for the device at {device:#x}");
        // Give the pages back: nothing else knows of them yet.
        let _ = runtime::call(&PhosHostFreeRequest { host: host as u64 });
        return Err(CudaError::MemoryAllocation);
    }
    table().insert(host, HostAlloc { size, flags, device: Some(device), managed: true });
    Ok(host as *mut c_void)
}

/// `cudaFree` of managed memory: `None` when `p` is not managed memory (the server frees it).
/// A pointer inside an allocation but not at its start is `cudaErrorInvalidValue`, as for
/// device memory.
pub fn free_managed(p: usize) -> Option<Result<(), CudaError>> {
    let (base, _) = managed(p)?;
    if base != p {
        return Some(Err(CudaError::InvalidValue));
    }
    // The server waits for the device first (work in flight may still use the memory).
    Some(runtime::call(&PhosHostFreeRequest { host: p as u64 }).map(|_| {
        table().remove(&p);
    }))
}

/// The managed allocation containing `addr`: (base, size).
pub fn managed(addr: usize) -> Option<(usize, usize)> {
    containing(addr).filter(|(_, a)| a.managed).map(|(base, a)| (base, a.size))
}

/// Change the attach flags of the managed allocation at `base` (`cudaStreamAttachMemAsync`).
pub fn set_managed_flags(base: usize, flags: u32) {
    if let Some(a) = table().get_mut(&base).filter(|a| a.managed) {
        a.flags = flags;
    }
}

fn table() -> std::sync::MutexGuard<'static, BTreeMap<usize, HostAlloc>> {
    ALLOCATIONS.lock().unwrap_or_else(|e| e.into_inner())
}

/// Free what [`alloc`] returned; a null pointer is a no-op.
///
/// # Safety
/// The memory must not be used afterwards (the pages are given back).
pub unsafe fn free(p: *mut c_void) -> Result<(), CudaError> {
    if p.is_null() {
        return Ok(());
    }
    let addr = p as usize;
    let entry = table().get(&addr).copied().filter(|a| !a.managed).ok_or(CudaError::InvalidValue)?;
    if entry.device.is_some() {
        runtime::call(&PhosHostFreeRequest { host: addr as u64 })?;
    } else {
        // SAFETY: `p` is the start of a mapping `alloc` made outside the arena (the table says so,
        // and its size); the caller's contract is that nothing uses it any more.
        unsafe { libc::munmap(p, entry.size) };
    }
    table().remove(&addr);
    Ok(())
}

/// The allocation containing `addr`: (base, entry).
fn containing(addr: usize) -> Option<(usize, HostAlloc)> {
    let (&base, &a) = table().range(..=addr).next_back()?;
    (addr - base < a.size).then_some((base, a))
}

/// Base, size and flags of the allocation containing `addr`, if it is page-locked memory of ours.
pub fn lookup(addr: usize) -> Option<(usize, usize, u32)> {
    containing(addr).filter(|(_, a)| !a.managed).map(|(base, a)| (base, a.size, a.flags))
}

/// Whether `[addr, addr + len)` lies in one arena allocation, so the server can copy it
/// directly. Cheap for memory that is not in the arena.
pub fn in_arena(addr: usize, len: usize) -> bool {
    if (addr as u64) < BASE || (addr as u64) >= ARENA_END.load(Ordering::Relaxed) || arena().is_none() {
        return false;
    }
    containing(addr).is_some_and(|(base, a)| a.device.is_some() && addr + len <= base + a.size)
}

/// The device address of arena memory at `addr`.
pub fn arena_device_pointer(addr: usize) -> Option<u64> {
    match containing(addr)? {
        (base, HostAlloc { device: Some(d), .. }) => Some(d + (addr - base) as u64),
        _ => None,
    }
}

/// `cudaHostGetDevicePointer`: the device address of page-locked memory at `addr`.
pub fn device_pointer(addr: usize) -> Result<u64, CudaError> {
    if let Some(d) = arena_device_pointer(addr).filter(|_| managed(addr).is_none()) {
        return Ok(d);
    }
    if lookup_any(addr).is_none() {
        return Err(CudaError::InvalidValue);
    }
    // The process's own memory: no device can reach it through Phos.
    crate::log::not_supported_once(
        "cudaHostGetDevicePointer of page-locked memory outside the pinned arena",
        "cudaErrorNotSupported",
    );
    Err(CudaError::NotSupported)
}

/// `cudaHostRegisterPortable | Mapped | IoMemory | ReadOnly`.
const REGISTER_FLAGS: u32 = 0x1 | 0x2 | 0x4 | 0x8;

/// A range registered with `cudaHostRegister`: (size, flags, device), by base address.
type Registered = BTreeMap<usize, (usize, u32, i32)>;

static REGISTERED: Mutex<Registered> = Mutex::new(BTreeMap::new());

fn registered_table() -> std::sync::MutexGuard<'static, Registered> {
    REGISTERED.lock().unwrap_or_else(|e| e.into_inner())
}

/// `cudaHostRegister`: the range must not overlap page-locked memory already known.
pub fn register(ptr: usize, size: usize, flags: u32, device: i32) -> Result<(), CudaError> {
    if ptr == 0 || size == 0 || flags & !REGISTER_FLAGS != 0 {
        return Err(CudaError::InvalidValue);
    }
    let end = ptr.checked_add(size).ok_or(CudaError::InvalidValue)?;
    let overlaps = |base: usize, len: usize| ptr < base + len && base < end;
    if table().iter().any(|(b, a)| overlaps(*b, a.size)) {
        return Err(CudaError::HostMemoryAlreadyRegistered);
    }
    let mut table = registered_table();
    if table.iter().any(|(b, (s, _, _))| overlaps(*b, *s)) {
        return Err(CudaError::HostMemoryAlreadyRegistered);
    }
    table.insert(ptr, (size, flags, device));
    Ok(())
}

/// `cudaHostUnregister`: `ptr` must be the base of a registered range.
pub fn unregister(ptr: usize) -> Result<(), CudaError> {
    registered_table().remove(&ptr).map(|_| ()).ok_or(CudaError::HostMemoryNotRegistered)
}

fn registered(addr: usize) -> Option<(usize, usize, u32, i32)> {
    let t = registered_table();
    let (&b, &(s, f, d)) = t.range(..=addr).next_back()?;
    (addr - b < s).then_some((b, s, f, d))
}

/// Base, size, flags and device of the page-locked range (allocated or registered) that
/// contains `addr`.
pub fn lookup_any(addr: usize) -> Option<(usize, usize, u32, i32)> {
    lookup(addr).map(|(base, size, flags)| (base, size, flags, 0)).or_else(|| registered(addr))
}
