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
//! So is memory registered with `cudaHostRegister` once its pages are moved into the arena
//! ([`register`]; docs/architecture.md, "Registered memory is moved into the arena").

use std::collections::BTreeMap;
use std::ffi::c_void;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
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
                    Some(Arena { mapping, pid: crate::pid::current() })
                }
                Err(e) => {
                    tracing::info!("no pinned arena ({e}); page-locked memory is copied through the channel");
                    None
                }
            }
        })
        .as_ref()?;
    (a.pid == crate::pid::current()).then_some(a)
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
fn in_arena(addr: usize, len: usize) -> bool {
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

/// The device address of page-locked memory at `addr` that the server reaches: arena
/// allocations and registered ranges moved into the arena.
pub fn mapped_device_pointer(addr: usize) -> Option<u64> {
    arena_device_pointer(addr).or_else(|| {
        // A forked child's session does not have its parent's arena.
        arena()?;
        let (_, r) = registered(addr)?;
        r.moved.map(|m| m.device + (addr - m.first_page) as u64)
    })
}

/// `cudaHostGetDevicePointer`: the device address of page-locked memory at `addr`.
pub fn device_pointer(addr: usize) -> Result<u64, CudaError> {
    if let Some(d) = mapped_device_pointer(addr).filter(|_| managed(addr).is_none()) {
        return Ok(d);
    }
    if lookup_any(addr).is_none() {
        return Err(CudaError::InvalidValue);
    }
    // The process's own memory: no device can reach it through Phos.
    crate::log::not_supported_once(
        "cudaHostGetDevicePointer of page-locked memory outside the pinned arena (no arena, or registered memory that is not private anonymous memory)",
        "cudaErrorNotSupported",
    );
    Err(CudaError::NotSupported)
}

/// `cudaHostRegisterPortable | Mapped | IoMemory | ReadOnly`.
const REGISTER_FLAGS: u32 = 0x1 | 0x2 | 0x4 | 0x8;
/// `cudaHostRegisterIoMemory`: memory of a device's I/O space, which Phos cannot share.
const REGISTER_IO_MEMORY: u32 = 0x4;

/// A range registered with `cudaHostRegister`.
#[derive(Clone, Copy)]
struct Registration {
    size: usize,
    flags: u32,
    /// The device current at the registration (what pointer attributes name).
    device: i32,
    /// Where its pages went in the arena, when they could be moved there; otherwise the
    /// memory stays the process's own and its copies take the ordinary paths.
    moved: Option<Moved>,
}

/// A registered range's whole pages, now pages of the arena mapped over the same addresses.
#[derive(Clone, Copy)]
struct Moved {
    /// The first page of the range.
    first_page: usize,
    /// Bytes of whole pages.
    span: usize,
    /// The same pages at their arena address (the server's allocation).
    arena: usize,
    /// The arena address's device address.
    device: u64,
}

type Registered = BTreeMap<usize, Registration>;

static REGISTERED: Mutex<Registered> = Mutex::new(BTreeMap::new());
/// Registrations whose pages are in the arena: lets a copy of other memory skip the lookup.
static REGISTERED_ANY: AtomicUsize = AtomicUsize::new(0);

fn registered_table() -> std::sync::MutexGuard<'static, Registered> {
    REGISTERED.lock().unwrap_or_else(|e| e.into_inner())
}

/// `cudaHostRegister`: the range must not overlap page-locked memory already known. Where
/// the process has an arena the range's pages are moved into it (see [`move_to_arena`]) so
/// that the server's DMA and kernels reach them; otherwise they stay the process's own.
pub fn register(ptr: usize, size: usize, flags: u32, device: i32) -> Result<(), CudaError> {
    if ptr == 0 || size == 0 || flags & !REGISTER_FLAGS != 0 {
        return Err(CudaError::InvalidValue);
    }
    if flags & REGISTER_IO_MEMORY != 0 {
        crate::log::not_supported_once("cudaHostRegister with cudaHostRegisterIoMemory", "cudaErrorNotSupported");
        return Err(CudaError::NotSupported);
    }
    let end = ptr.checked_add(size).ok_or(CudaError::InvalidValue)?;
    let overlaps = |base: usize, len: usize| ptr < base + len && base < end;
    if table().iter().any(|(b, a)| overlaps(*b, a.size)) {
        return Err(CudaError::HostMemoryAlreadyRegistered);
    }
    // Held while the pages move, so that two registrations never move the same page.
    let mut table = registered_table();
    if table.iter().any(|(b, r)| overlaps(*b, r.size)) {
        return Err(CudaError::HostMemoryAlreadyRegistered);
    }
    let moved = move_to_arena(ptr, end);
    if moved.is_some() {
        REGISTERED_ANY.fetch_add(1, Ordering::Relaxed);
    }
    table.insert(ptr, Registration { size, flags, device, moved });
    Ok(())
}

/// The whole pages around `[start, end)`.
fn page_span(start: usize, end: usize) -> Option<(usize, usize)> {
    let page = host_arena::PAGE as usize;
    let first = start & !(page - 1);
    let last = end.checked_next_multiple_of(page)?;
    Some((first, last - first))
}

/// Move the whole pages around `[start, end)` into the arena: the server allocates as many
/// arena pages (registered with the driver, charged as page-locked memory), their current
/// contents are copied there, and the arena's pages are mapped over the range
/// (`MAP_SHARED | MAP_FIXED`), so the process reads and writes the same bytes at the same
/// addresses and the server's DMA and kernels reach them at the arena address. `None` (the
/// memory stays the process's own) without an arena, or where the pages are not the process's
/// private anonymous memory (a file's pages, shared memory, a page of another registration:
/// moving them would cut them from their file or their other users).
fn move_to_arena(start: usize, end: usize) -> Option<Moved> {
    let a = arena()?;
    let (first_page, span) = page_span(start, end)?;
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    if !private_anonymous(&maps, first_page, first_page + span) {
        tracing::debug!("cudaHostRegister of {start:#x}: not private anonymous memory; it stays the process's own");
        return None;
    }
    let (arena, device) = place_in_arena(span, 0x1 | 0x2)?;
    let give_back = |why: &str| {
        tracing::warn!("cudaHostRegister of {start:#x}: {why}; the memory stays the process's own");
        let _ = runtime::call(&PhosHostFreeRequest { host: arena as u64 });
        None
    };
    // The copy goes through the kernel, which fails cleanly on a page that is not mapped
    // rather than faulting here. The first and last pages, which may hold other data that
    // other threads write (a heap's), go last, just before the mapping.
    let page = host_arena::PAGE as usize;
    let edges = if span > page { vec![0, span - page] } else { vec![0] };
    let mut pieces: Vec<(usize, usize)> = Vec::with_capacity(3);
    if span > 2 * page {
        pieces.push((page, span - 2 * page));
    }
    pieces.extend(edges.iter().map(|&at| (at, page)));
    let local: Vec<libc::iovec> =
        pieces.iter().map(|&(at, len)| libc::iovec { iov_base: (arena + at) as *mut c_void, iov_len: len }).collect();
    let remote: Vec<libc::iovec> = pieces
        .iter()
        .map(|&(at, len)| libc::iovec { iov_base: (first_page + at) as *mut c_void, iov_len: len })
        .collect();
    // SAFETY: `local` lies in the arena allocation the server just made for this range (`span`
    // bytes, mapped in this process, used by nothing else yet); `remote` is only read, by the
    // kernel, which checks it.
    let copied = unsafe {
        libc::process_vm_readv(
            std::process::id() as libc::pid_t,
            local.as_ptr(),
            local.len() as _,
            remote.as_ptr(),
            remote.len() as _,
            0,
        )
    };
    if copied != span as isize {
        return give_back("its pages cannot be read");
    }
    // Writes other threads make to these pages between the copy and the mapping are lost
    // (docs/architecture.md, "Registered memory").
    // SAFETY: the range is private anonymous memory of this process (checked above) and its
    // bytes were copied into the arena pages mapped in its place, so every address keeps its
    // contents; the file is the arena's, whose size covers `arena - BASE + span`.
    let mapped = unsafe {
        libc::mmap(
            first_page as *mut c_void,
            span,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_FIXED,
            std::os::fd::AsRawFd::as_raw_fd(a.mapping.fd()),
            (arena as u64 - BASE) as libc::off_t,
        )
    };
    if mapped != first_page as *mut c_void {
        return give_back("its pages cannot be mapped from the arena");
    }
    Some(Moved { first_page, span, arena, device })
}

/// Whether `/proc/self/maps` (`maps`) shows `[start, end)` wholly as private, anonymous,
/// readable and writable memory (the heap or anonymous mappings; not the stack).
fn private_anonymous(maps: &str, start: usize, end: usize) -> bool {
    let mut covered = start;
    for line in maps.lines() {
        let mut fields = line.split_whitespace();
        let (Some(range), Some(perms), Some(_offset), Some(_dev), Some(inode)) =
            (fields.next(), fields.next(), fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        let path = fields.next().unwrap_or("");
        let Some((lo, hi)) = range.split_once('-') else { continue };
        let (Ok(lo), Ok(hi)) = (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16)) else { continue };
        if hi <= covered || lo > covered {
            continue;
        }
        let usable =
            perms.starts_with("rw") && perms.ends_with('p') && inode == "0" && (path.is_empty() || path == "[heap]");
        if !usable {
            return false;
        }
        covered = hi;
        if covered >= end {
            return true;
        }
    }
    false
}

/// `cudaHostUnregister`: `ptr` must be the base of a registered range. Moved pages become
/// the process's private memory again, with their current contents, before the server frees
/// their arena pages.
pub fn unregister(ptr: usize) -> Result<(), CudaError> {
    let r = {
        let table = registered_table();
        table.get(&ptr).copied().ok_or_else(|| not_a_base(&table, ptr))?
    };
    if r.moved.is_some() {
        // Copies and kernels in flight may still read or write the pages (waited for without
        // the table's lock, which other threads' copies take).
        let _ = runtime::call(&phos_protocol::cudart::CudaDeviceSynchronizeRequest {});
    }
    let mut table = registered_table();
    let r = table.get(&ptr).copied().ok_or_else(|| not_a_base(&table, ptr))?;
    if let Some(m) = r.moved {
        move_out_of_arena(m)?;
        REGISTERED_ANY.fetch_sub(1, Ordering::Relaxed);
        table.remove(&ptr);
        // The range is the process's own again whatever the server answers.
        return runtime::call(&PhosHostFreeRequest { host: m.arena as u64 }).map(|_| ());
    }
    table.remove(&ptr);
    Ok(())
}

/// Why `ptr` cannot be unregistered: inside a registered range (not its base), CUDA answers
/// `cudaErrorInvalidValue` (measured on the H100, driver 580); elsewhere, not registered.
fn not_a_base(table: &Registered, ptr: usize) -> CudaError {
    let inside = table.range(..ptr).next_back().is_some_and(|(base, r)| ptr < base + r.size);
    if inside { CudaError::InvalidValue } else { CudaError::HostMemoryNotRegistered }
}

/// Give moved pages back as private memory holding their current contents: filled aside,
/// then moved over the range in one step (`mremap`), so every address stays mapped.
fn move_out_of_arena(m: Moved) -> Result<(), CudaError> {
    // SAFETY: a new private anonymous mapping where the kernel chooses: no memory in use changes.
    let aside = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            m.span,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if aside == libc::MAP_FAILED {
        return Err(CudaError::MemoryAllocation);
    }
    // SAFETY: `m.arena` is the arena allocation of `m.span` bytes mapped in this process (the
    // registration holds it), `aside` a new mapping of as many bytes; they do not overlap.
    unsafe { std::ptr::copy_nonoverlapping(m.arena as *const u8, aside as *mut u8, m.span) };
    // SAFETY: moves the new mapping over the registered range, replacing the arena's pages
    // there with a copy of their bytes: every address keeps its contents.
    let moved = unsafe {
        libc::mremap(aside, m.span, m.span, libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED, m.first_page as *mut c_void)
    };
    if moved != m.first_page as *mut c_void {
        // SAFETY: `aside` is the mapping made above, used by nothing else.
        unsafe { libc::munmap(aside, m.span) };
        tracing::error!("cudaHostUnregister of {:#x}: cannot give its pages back", m.first_page);
        return Err(CudaError::Unknown);
    }
    Ok(())
}

fn registered(addr: usize) -> Option<(usize, Registration)> {
    let t = registered_table();
    let (&b, &r) = t.range(..=addr).next_back()?;
    (addr - b < r.size).then_some((b, r))
}

/// Whether the process has page-locked memory (allocated, managed or registered), which
/// kernels may write and the host read without a call.
pub fn any_page_locked() -> bool {
    REGISTERED_ANY.load(Ordering::Relaxed) > 0 || !table().is_empty()
}

/// Base, size, flags and device of the page-locked range (allocated or registered) that
/// contains `addr`.
pub fn lookup_any(addr: usize) -> Option<(usize, usize, u32, i32)> {
    lookup(addr)
        .map(|(base, size, flags)| (base, size, flags, 0))
        .or_else(|| registered(addr).map(|(b, r)| (b, r.size, r.flags, r.device)))
}

/// The address the server knows page-locked memory `[addr, addr + len)` by, when it lies in
/// one arena allocation or one registered range moved into the arena: a copy of it is a DMA
/// of these pages (`phosMemcpyPinned`). Cheap for memory that is neither.
pub fn pinned_address(addr: usize, len: usize) -> Option<u64> {
    if in_arena(addr, len) {
        return Some(addr as u64);
    }
    if REGISTERED_ANY.load(Ordering::Relaxed) == 0 || arena().is_none() {
        return None;
    }
    let (base, r) = registered(addr)?;
    let m = r.moved?;
    (addr.checked_add(len)? <= base + r.size).then(|| (m.arena + (addr - m.first_page)) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: &str = "\
55d4c8a00000-55d4c8a21000 rw-p 00000000 00:00 0                          [heap]
7f0000000000-7f0000004000 rw-p 00000000 00:00 0 
7f0000004000-7f0000008000 rw-p 00000000 00:00 0 
7f0000008000-7f000000a000 rw-s 00000000 00:01 4242                       /memfd:phos-arena (deleted)
7f000000a000-7f000000c000 rw-p 00001000 08:01 1234                       /usr/lib/libc.so.6
7f000000c000-7f000000e000 r--p 00000000 00:00 0 
7f000000e000-7f0000010000 rw-p 00000000 00:00 0 
7ffc00000000-7ffc00021000 rw-p 00000000 00:00 0                          [stack]
";

    #[test]
    fn private_anonymous_memory_is_what_may_move() {
        // The heap, anonymous mappings, and a range over two adjacent anonymous mappings.
        assert!(private_anonymous(MAPS, 0x55d4c8a00000, 0x55d4c8a21000));
        assert!(private_anonymous(MAPS, 0x7f0000001000, 0x7f0000003000));
        assert!(private_anonymous(MAPS, 0x7f0000000000, 0x7f0000008000));
        // Shared memory, a file's pages, read-only memory and the stack stay where they are.
        assert!(!private_anonymous(MAPS, 0x7f0000008000, 0x7f0000009000));
        assert!(!private_anonymous(MAPS, 0x7f0000006000, 0x7f0000009000));
        assert!(!private_anonymous(MAPS, 0x7f000000a000, 0x7f000000b000));
        assert!(!private_anonymous(MAPS, 0x7f000000c000, 0x7f000000d000));
        assert!(!private_anonymous(MAPS, 0x7ffc00001000, 0x7ffc00002000));
        // A hole (nothing mapped) anywhere in the range.
        assert!(!private_anonymous(MAPS, 0x7f000000e000, 0x7f0000011000));
        assert!(!private_anonymous(MAPS, 0x7e0000000000, 0x7f0000001000));
        assert!(!private_anonymous(MAPS, 0x100000, 0x101000));
    }

    #[test]
    fn a_range_is_rounded_out_to_whole_pages() {
        assert_eq!(page_span(0x1000, 0x2000), Some((0x1000, 0x1000)));
        assert_eq!(page_span(0x1024, 0x1028), Some((0x1000, 0x1000)));
        assert_eq!(page_span(0x1ffc, 0x2004), Some((0x1000, 0x2000)));
        assert_eq!(page_span(usize::MAX - 10, usize::MAX), None);
    }

    /// A registration moves private pages onto a shared file's pages and back, keeping every
    /// byte of the pages, inside the range and around it (what the arena moves do, on a file of
    /// this test's own).
    #[test]
    fn pages_moved_onto_a_file_and_back_keep_their_bytes() {
        let page = host_arena::PAGE as usize;
        let span = 3 * page;
        let file = host_arena::create(host_arena::MIN_BYTES).unwrap();
        // SAFETY: a new shared mapping of the test's own file, where the kernel chooses.
        let arena = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                span,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                std::os::fd::AsRawFd::as_raw_fd(&file),
                0,
            )
        } as usize;
        let mut buffer = vec![0u8; span + page];
        let first_page = (buffer.as_mut_ptr() as usize).next_multiple_of(page);
        // SAFETY: `first_page..+span` lies in `buffer`, which this test owns.
        let bytes = unsafe { std::slice::from_raw_parts_mut(first_page as *mut u8, span) };
        for (i, b) in bytes.iter_mut().enumerate() {
            *b = (i * 31 % 251) as u8;
        }
        let expected = bytes.to_vec();
        let local = libc::iovec { iov_base: arena as *mut c_void, iov_len: span };
        let remote = libc::iovec { iov_base: first_page as *mut c_void, iov_len: span };
        // SAFETY: copies the test's own buffer into its own shared mapping, both `span` bytes.
        let copied = unsafe { libc::process_vm_readv(std::process::id() as libc::pid_t, &local, 1, &remote, 1, 0) };
        assert_eq!(copied, span as isize);
        // SAFETY: maps the test's file over pages of its own buffer, which hold the same bytes.
        let mapped = unsafe {
            libc::mmap(
                first_page as *mut c_void,
                span,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_FIXED,
                std::os::fd::AsRawFd::as_raw_fd(&file),
                0,
            )
        };
        assert_eq!(mapped as usize, first_page);
        // SAFETY: as above; the pages are mapped again.
        let bytes = unsafe { std::slice::from_raw_parts_mut(first_page as *mut u8, span) };
        assert_eq!(bytes, &expected[..]);
        // One copy: a write through the range is seen at the file's other mapping.
        bytes[page + 5] = 0xee;
        // SAFETY: the test's own mapping of `span` bytes.
        assert_eq!(unsafe { *((arena + page + 5) as *const u8) }, 0xee);
        let mut expected = expected;
        expected[page + 5] = 0xee;
        move_out_of_arena(Moved { first_page, span, arena, device: 0 }).unwrap();
        // SAFETY: as above.
        let bytes = unsafe { std::slice::from_raw_parts_mut(first_page as *mut u8, span) };
        assert_eq!(bytes, &expected[..]);
        // Private again: a write no longer reaches the file.
        bytes[7] = 0x11;
        // SAFETY: the test's own mapping.
        assert_ne!(unsafe { *((arena + 7) as *const u8) }, 0x11);
        // SAFETY: the test's own mapping, unused from here on.
        unsafe { libc::munmap(arena as *mut c_void, span) };
    }
}
