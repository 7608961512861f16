//! Managed memory (docs/architecture.md, "Managed memory").
//!
//! `cudaMallocManaged` memory is memory of the pinned arena ([`hostmem::alloc_managed`]): one
//! copy, at one address, that the host and every device reach. Prefetches, advice and stream
//! attachment move nothing, there being one copy: they are checked as CUDA checks them and
//! recorded, so that `cudaMemRangeGetAttribute` answers what the program said.
//!
//! `__managed__` variables live in their module, where the kernels reach them by their
//! symbol; the host reaches them through a pointer nvcc's code loads from the variable's
//! shadow (`*hostVarPtrAddress`, set by `__cudaInitModule`). Phos points it at a host copy
//! (a mirror) and keeps the two coherent the way a device without concurrent managed access
//! lets it: a kernel launch first writes each mirror the host changed since it was last in
//! step (compared with a snapshot) to the device, and a synchronisation that follows a launch
//! reads every mirror back. The host may touch managed memory only between the two, as CUDA
//! asks when `cudaDevAttrConcurrentManagedAccess` is 0, which is what Phos reports.

use std::cell::Cell;
use std::collections::{BTreeMap, BTreeSet};
use std::ffi::{c_char, c_void};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use phos_protocol::CudaError;
use phos_protocol::cudart::{FunctionId, consts};

use crate::registry::{self, Variable};
use crate::{hostmem, runtime, soname};

/// `cudaMemLocationType`.
const LOCATION_INVALID: i32 = 0;
const LOCATION_DEVICE: i32 = 1;
const LOCATION_HOST: i32 = 2;
const LOCATION_HOST_NUMA: i32 = 3;
const LOCATION_HOST_NUMA_CURRENT: i32 = 4;
/// `cudaCpuDeviceId`, `cudaInvalidDeviceId`.
const CPU_DEVICE_ID: i32 = -1;
const INVALID_DEVICE_ID: i32 = -2;

/// `cudaMemoryAdvise`.
const ADVISE_SET_READ_MOSTLY: i32 = 1;
const ADVISE_UNSET_READ_MOSTLY: i32 = 2;
const ADVISE_SET_PREFERRED_LOCATION: i32 = 3;
const ADVISE_UNSET_PREFERRED_LOCATION: i32 = 4;
const ADVISE_SET_ACCESSED_BY: i32 = 5;
const ADVISE_UNSET_ACCESSED_BY: i32 = 6;

/// `cudaMemRangeAttribute`.
const RANGE_READ_MOSTLY: i32 = 1;
const RANGE_PREFERRED_LOCATION: i32 = 2;
const RANGE_ACCESSED_BY: i32 = 3;
const RANGE_LAST_PREFETCH_LOCATION: i32 = 4;
const RANGE_PREFERRED_LOCATION_TYPE: i32 = 5;
const RANGE_PREFERRED_LOCATION_ID: i32 = 6;
const RANGE_LAST_PREFETCH_LOCATION_TYPE: i32 = 7;
const RANGE_LAST_PREFETCH_LOCATION_ID: i32 = 8;

/// A `cudaMemLocation`: (type, id).
type Location = (i32, i32);

/// What the program said about one managed allocation (by its base address).
#[derive(Default, Clone)]
struct Advice {
    read_mostly: bool,
    preferred: Option<Location>,
    accessed_by: BTreeSet<i32>,
    last_prefetch: Option<Location>,
}

static ADVICE: Mutex<BTreeMap<usize, Advice>> = Mutex::new(BTreeMap::new());

fn advice() -> MutexGuard<'static, BTreeMap<usize, Advice>> {
    // A poisoned lock: every update below is one assignment, so the map stays consistent.
    ADVICE.lock().unwrap_or_else(|p| p.into_inner())
}

/// `cudaMallocManaged`.
///
/// # Safety
/// `dev_ptr` must be null or writable.
pub unsafe fn malloc_managed(dev_ptr: *mut *mut c_void, size: usize, flags: u32) -> Result<(), CudaError> {
    if dev_ptr.is_null() {
        return Err(CudaError::InvalidValue);
    }
    runtime::session()?;
    let p = hostmem::alloc_managed(size, flags)?;
    if !p.is_null() {
        advice().insert(p as usize, Advice::default());
    }
    // SAFETY: not null (checked above), writable: this function's contract.
    unsafe { *dev_ptr = p };
    Ok(())
}

/// `cudaFree` of managed memory (the spec's `fast_path(free_managed)`): `None` for any other
/// pointer, which the server frees.
pub fn free_managed(p: *mut c_void) -> Option<Result<(), CudaError>> {
    let r = hostmem::free_managed(p as usize)?;
    if r.is_ok() {
        advice().remove(&(p as usize));
    }
    Some(r)
}

/// The managed allocation holding all of `[ptr, ptr + count)`: its base.
fn managed_range(ptr: *const c_void, count: usize) -> Result<usize, CudaError> {
    let addr = ptr as usize;
    let (base, size) = hostmem::managed(addr).ok_or(CudaError::InvalidValue)?;
    let end = addr.checked_add(count).ok_or(CudaError::InvalidValue)?;
    if count == 0 || end > base + size {
        return Err(CudaError::InvalidValue);
    }
    Ok(base)
}

/// A location as the ABI the program loaded passes it: CUDA 13 (and 12's `_v2` calls) a
/// `cudaMemLocation` in one register, CUDA 11 and 12 an `int` device (`cudaCpuDeviceId` for
/// the host).
fn location(raw: u64, as_struct: bool) -> Location {
    if as_struct {
        (raw as u32 as i32, (raw >> 32) as u32 as i32)
    } else {
        match raw as u32 as i32 {
            CPU_DEVICE_ID => (LOCATION_HOST, CPU_DEVICE_ID),
            device => (LOCATION_DEVICE, device),
        }
    }
}

fn new_abi() -> bool {
    soname::current_abi().major() >= 13
}

/// A location memory can be at: a device of the session or the host.
fn check_location((kind, id): Location) -> Result<(), CudaError> {
    match kind {
        LOCATION_DEVICE if id >= 0 && id < runtime::session()?.device_count => Ok(()),
        LOCATION_DEVICE => Err(CudaError::InvalidDevice),
        LOCATION_HOST | LOCATION_HOST_NUMA | LOCATION_HOST_NUMA_CURRENT => Ok(()),
        _ => Err(CudaError::InvalidValue),
    }
}

/// `cudaMemAdvise` (`as_struct`: the location is a `cudaMemLocation`).
pub fn advise(ptr: *const c_void, count: usize, advice_kind: i32, raw: u64, as_struct: bool) -> Result<(), CudaError> {
    runtime::session()?;
    let base = managed_range(ptr, count)?;
    let at = location(raw, as_struct);
    let mut all = advice();
    let a = all.entry(base).or_default();
    match advice_kind {
        ADVISE_SET_READ_MOSTLY => a.read_mostly = true,
        ADVISE_UNSET_READ_MOSTLY => a.read_mostly = false,
        ADVISE_SET_PREFERRED_LOCATION => {
            check_location(at)?;
            a.preferred = Some(at);
        }
        ADVISE_UNSET_PREFERRED_LOCATION => a.preferred = None,
        ADVISE_SET_ACCESSED_BY | ADVISE_UNSET_ACCESSED_BY => {
            check_location(at)?;
            let id = if at.0 == LOCATION_DEVICE { at.1 } else { CPU_DEVICE_ID };
            if advice_kind == ADVISE_SET_ACCESSED_BY {
                a.accessed_by.insert(id);
            } else {
                a.accessed_by.remove(&id);
            }
        }
        _ => return Err(CudaError::InvalidValue),
    }
    Ok(())
}

/// `cudaMemAdvise` as the ABI the program loaded declares it.
pub fn advise_abi(ptr: *const c_void, count: usize, advice_kind: i32, raw: u64) -> Result<(), CudaError> {
    advise(ptr, count, advice_kind, raw, new_abi())
}

/// `cudaMemPrefetchAsync`: checked and recorded; the memory is where every device and the
/// host reach it already, so nothing is queued.
pub fn prefetch(ptr: *const c_void, count: usize, raw: u64, flags: u64, as_struct: bool) -> Result<(), CudaError> {
    runtime::session()?;
    let base = managed_range(ptr, count)?;
    let at = location(raw, as_struct);
    check_location(at)?;
    if as_struct && flags as u32 != 0 {
        return Err(CudaError::InvalidValue);
    }
    let mut all = advice();
    all.entry(base).or_default().last_prefetch = Some(at);
    Ok(())
}

/// CUDA 13's batched hints: `cudaMemPrefetchBatchAsync` (`locations` given, no discard),
/// `cudaMemDiscardBatchAsync` (`discard`, no locations) and
/// `cudaMemDiscardAndPrefetchBatchAsync` (both). The batch is checked whole first (the ranges
/// managed memory, the locations' indices 0 first and rising, below `count`, each location
/// one memory can be at, no flags); then each prefetch is recorded as `cudaMemPrefetchAsync`
/// records it. A discard leaves the contents as they are: after one CUDA leaves them
/// undetermined, and the values they had are among those.
///
/// # Safety
/// `dptrs` and `sizes` null or holding `count` entries; `locations` null or holding `num`
/// `cudaMemLocation`s, and `idxs` `num` indices.
#[allow(clippy::too_many_arguments)]
pub unsafe fn batch_hints(
    dptrs: *const u64,
    sizes: *const usize,
    count: usize,
    locations: *const u64,
    idxs: *const usize,
    num: usize,
    prefetch: bool,
    flags: u64,
) -> Result<(), CudaError> {
    runtime::session()?;
    if count == 0 || dptrs.is_null() || sizes.is_null() || flags != 0 {
        return Err(CudaError::InvalidValue);
    }
    let mut bases = Vec::with_capacity(count.min(1 << 16));
    for i in 0..count {
        // SAFETY: `i < count`, within the pointers (this function's contract).
        let ptr = unsafe { dptrs.wrapping_add(i).read_unaligned() };
        // SAFETY: `i < count`, within the sizes (this function's contract).
        let size = unsafe { sizes.wrapping_add(i).read_unaligned() };
        bases.push(managed_range(ptr as usize as *const c_void, size)?);
    }
    if !prefetch {
        return Ok(());
    }
    if num == 0 || num > count || locations.is_null() || idxs.is_null() {
        return Err(CudaError::InvalidValue);
    }
    // Each location applies from its index to the next one's.
    let mut from = Vec::with_capacity(num);
    for k in 0..num {
        // SAFETY: `k < num`, within the indices (this function's contract).
        let first = unsafe { idxs.wrapping_add(k).read_unaligned() };
        // SAFETY: `k < num`, within the locations (this function's contract).
        let at = location(unsafe { locations.wrapping_add(k).read_unaligned() }, true);
        let ordered = match from.last() {
            None => first == 0,
            Some(&(p, _)) => first > p,
        };
        if !ordered || first >= count {
            return Err(CudaError::InvalidValue);
        }
        check_location(at)?;
        from.push((first, at));
    }
    let mut all = advice();
    for (i, base) in bases.into_iter().enumerate() {
        let at = from.iter().rev().find(|(first, _)| *first <= i).map(|&(_, at)| at);
        all.entry(base).or_default().last_prefetch = at;
    }
    Ok(())
}

/// `cudaMemPrefetchAsync` as the ABI the program loaded declares it: under CUDA 11 and 12
/// the stream arrives where CUDA 13 passes `flags`, and has no flags.
pub fn prefetch_abi(ptr: *const c_void, count: usize, raw: u64, flags_or_stream: u64) -> Result<(), CudaError> {
    let v13 = new_abi();
    prefetch(ptr, count, raw, if v13 { flags_or_stream } else { 0 }, v13)
}

/// `cudaStreamAttachMemAsync`: every stream and the host reach managed memory at all times,
/// so attaching checks its arguments and records the flags.
pub fn attach(ptr: *mut c_void, length: usize, flags: u32) -> Result<(), CudaError> {
    runtime::session()?;
    if ![hostmem::ATTACH_GLOBAL, hostmem::ATTACH_HOST, hostmem::ATTACH_SINGLE].contains(&flags) {
        return Err(CudaError::InvalidValue);
    }
    let (base, size) = hostmem::managed(ptr as usize).ok_or(CudaError::InvalidValue)?;
    // Memory of cudaMallocManaged is attached whole: from its start, all of it or length 0.
    if base != ptr as usize || (length != 0 && length != size) {
        return Err(CudaError::InvalidValue);
    }
    hostmem::set_managed_flags(base, flags);
    Ok(())
}

/// The `int` CUDA 11 and 12 answer for a location: a device, `cudaCpuDeviceId` for the host,
/// `cudaInvalidDeviceId` for none.
fn location_as_device(at: Option<Location>) -> i32 {
    match at {
        Some((LOCATION_DEVICE, id)) => id,
        Some((LOCATION_HOST | LOCATION_HOST_NUMA | LOCATION_HOST_NUMA_CURRENT, _)) => CPU_DEVICE_ID,
        _ => INVALID_DEVICE_ID,
    }
}

/// `cudaMemRangeGetAttribute`.
///
/// # Safety
/// `data` must be null or `data_size` writable bytes.
pub unsafe fn range_get_attribute(
    data: *mut c_void,
    data_size: usize,
    attribute: i32,
    ptr: *const c_void,
    count: usize,
) -> Result<(), CudaError> {
    runtime::session()?;
    if data.is_null() {
        return Err(CudaError::InvalidValue);
    }
    let base = managed_range(ptr, count)?;
    let a = advice().get(&base).cloned().unwrap_or_default();
    let values: Vec<i32> = match attribute {
        RANGE_READ_MOSTLY => vec![a.read_mostly as i32],
        RANGE_PREFERRED_LOCATION => vec![location_as_device(a.preferred)],
        RANGE_LAST_PREFETCH_LOCATION => vec![location_as_device(a.last_prefetch)],
        RANGE_PREFERRED_LOCATION_TYPE => vec![a.preferred.map_or(LOCATION_INVALID, |l| l.0)],
        RANGE_PREFERRED_LOCATION_ID => vec![a.preferred.map_or(INVALID_DEVICE_ID, |l| l.1)],
        RANGE_LAST_PREFETCH_LOCATION_TYPE => vec![a.last_prefetch.map_or(LOCATION_INVALID, |l| l.0)],
        RANGE_LAST_PREFETCH_LOCATION_ID => vec![a.last_prefetch.map_or(INVALID_DEVICE_ID, |l| l.1)],
        RANGE_ACCESSED_BY => {
            if data_size == 0 || !data_size.is_multiple_of(4) {
                return Err(CudaError::InvalidValue);
            }
            // The devices that access it, then cudaInvalidDeviceId in the rest.
            let mut v: Vec<i32> = a.accessed_by.iter().copied().take(data_size / 4).collect();
            v.resize(data_size / 4, INVALID_DEVICE_ID);
            v
        }
        _ => return Err(CudaError::InvalidValue),
    };
    if attribute != RANGE_ACCESSED_BY && data_size != 4 {
        return Err(CudaError::InvalidValue);
    }
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_ne_bytes()).collect();
    // SAFETY: `data` is not null and has `data_size` writable bytes (this function's
    // contract); `bytes` is exactly `data_size` long (checked above).
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), data as *mut u8, bytes.len()) };
    Ok(())
}

/// `cudaMemRangeGetAttributes`: each attribute into its own buffer.
///
/// # Safety
/// `data`, `data_sizes` and `attributes` must be null or hold `count` entries, each data
/// pointer with its size of writable bytes.
pub unsafe fn range_get_attributes(
    data: *mut *mut c_void,
    data_sizes: *mut usize,
    attributes: *mut i32,
    count: usize,
    ptr: *const c_void,
    range: usize,
) -> Result<(), CudaError> {
    if data.is_null() || data_sizes.is_null() || attributes.is_null() || count == 0 {
        return Err(CudaError::InvalidValue);
    }
    // SAFETY: not null (checked above): `count` entries (this function's contract), the
    // caller's arrays, which nothing writes during the call.
    let data = unsafe { std::slice::from_raw_parts(data, count) };
    // SAFETY: not null (checked above): `count` entries, the caller's array (this function's
    // contract), which nothing writes during the call.
    let data_sizes = unsafe { std::slice::from_raw_parts(data_sizes, count) };
    // SAFETY: not null (checked above): `count` entries, the caller's array (this function's
    // contract), which nothing writes during the call.
    let attributes = unsafe { std::slice::from_raw_parts(attributes, count) };
    for ((&out, &size), &attribute) in data.iter().zip(data_sizes).zip(attributes) {
        // SAFETY: `out` has `size` writable bytes (this function's contract).
        unsafe { range_get_attribute(out, size, attribute, ptr, range)? };
    }
    Ok(())
}

// ---- __managed__ variables

/// One `__managed__` variable: the module's variable, where nvcc's code finds the host
/// address, and once the module is initialised the mirror and its snapshot.
struct ManagedVar {
    handle: usize,
    var: Arc<Variable>,
    /// `hostVarPtrAddress`: the pointer nvcc's host code dereferences.
    host_ptr_address: usize,
    mirror: Option<Mirror>,
}

/// The host copy of a variable, and what it held when it was last in step with the device.
struct Mirror {
    addr: usize,
    snapshot: Vec<u8>,
}

static VARS: Mutex<Vec<ManagedVar>> = Mutex::new(Vec::new());
/// Some mirror exists: launches and synchronisations have work to do.
static ANY_MIRROR: AtomicBool = AtomicBool::new(false);
/// A kernel was launched since the mirrors were last read back.
static DEVICE_MAY_HAVE_WRITTEN: AtomicBool = AtomicBool::new(false);

thread_local! {
    /// This thread is moving mirrors: the copies it makes are not hooked again.
    static MOVING: Cell<bool> = const { Cell::new(false) };
}

fn vars() -> MutexGuard<'static, Vec<ManagedVar>> {
    // A poisoned lock: entries are pushed whole and a mirror is set in one assignment.
    VARS.lock().unwrap_or_else(|p| p.into_inner())
}

/// `__cudaRegisterManagedVar`.
///
/// # Safety
/// Arguments as nvcc passes them: `host_ptr_address` is the variable's host shadow pointer.
pub unsafe fn register_var(
    handle: *mut *mut c_void,
    host_ptr_address: *mut *mut c_void,
    name: *const c_char,
    size: usize,
) {
    // SAFETY: the arguments as nvcc passes them (this function's contract); the shadow
    // pointer's address is unique to the variable, so it keys it in the registry.
    unsafe { registry::register_variable(handle, host_ptr_address as *const c_char, name, size) };
    let Some(var) = registry::variable(host_ptr_address as *const c_void) else { return };
    vars().push(ManagedVar { handle: handle as usize, var, host_ptr_address: host_ptr_address as usize, mirror: None });
}

/// `__cudaInitModule`: give every managed variable of the module its mirror, filled from the
/// device, and point nvcc's shadow pointer at it. 1 once done, 0 (logged) on failure.
pub fn init_module(handle: *mut *mut c_void) -> c_char {
    let _moving = Moving::enter();
    let mut all = vars();
    for v in all.iter_mut().filter(|v| v.handle == handle as usize && v.mirror.is_none()) {
        match new_mirror(&v.var) {
            Ok(m) => {
                // SAFETY: nvcc's shadow pointer of this variable (registered with it), a
                // static of the program that its host code reads after this call.
                unsafe { *(v.host_ptr_address as *mut *mut c_void) = m.addr as *mut c_void };
                registry::alias_variable(m.addr, v.var.clone());
                v.mirror = Some(m);
                ANY_MIRROR.store(true, Ordering::Release);
            }
            Err(e) => {
                crate::log::init();
                tracing::error!("__cudaInitModule: __managed__ variable {} has no host copy: {e:?}", v.var.name);
                return 0;
            }
        }
    }
    1
}

fn new_mirror(var: &Variable) -> Result<Mirror, CudaError> {
    let (device, size) = var.remote()?;
    let len = (size as usize).max(1);
    // Leaked: nvcc's code may hold the address for the life of the process. Page-aligned
    // and zeroed, as a fresh managed allocation is.
    let layout = std::alloc::Layout::from_size_align(len, 4096).map_err(|_| CudaError::MemoryAllocation)?;
    // SAFETY: a layout of non-zero size.
    let addr = unsafe { std::alloc::alloc_zeroed(layout) } as usize;
    if addr == 0 {
        return Err(CudaError::MemoryAllocation);
    }
    let mut m = Mirror { addr, snapshot: Vec::new() };
    pull(&mut m, device, size as usize)?;
    Ok(m)
}

/// Read the device's copy into the mirror, and remember it.
fn pull(m: &mut Mirror, device: u64, size: usize) -> Result<(), CudaError> {
    // SAFETY: the mirror has `size` bytes (allocated so); a device-to-host copy writes them.
    let code = unsafe {
        super::stubs::cudaMemcpy(
            m.addr as *mut c_void,
            device as usize as *const c_void,
            size,
            consts::cudaMemcpyDeviceToHost,
        )
    };
    status(code)?;
    m.snapshot = mirror_bytes(m.addr, size);
    Ok(())
}

fn mirror_bytes(addr: usize, size: usize) -> Vec<u8> {
    let mut v = vec![0u8; size];
    // SAFETY: a mirror of `size` bytes this module allocated and never frees; the program may
    // write it too (it is the variable), so a raw copy, no reference to it.
    unsafe { std::ptr::copy_nonoverlapping(addr as *const u8, v.as_mut_ptr(), size) };
    v
}

fn status(code: i32) -> Result<(), CudaError> {
    if code == phos_protocol::cudart::SUCCESS { Ok(()) } else { Err(CudaError(code)) }
}

/// Marks this thread as moving mirrors for as long as it lives.
struct Moving(bool);

impl Moving {
    fn enter() -> Moving {
        Moving(MOVING.try_with(|m| m.replace(true)).unwrap_or(false))
    }
}

impl Drop for Moving {
    fn drop(&mut self) {
        let _ = MOVING.try_with(|m| m.set(self.0));
    }
}

/// Before a kernel (or graph) launch: write to the device each mirror the host changed.
pub fn before_launch() -> Result<(), CudaError> {
    if !ANY_MIRROR.load(Ordering::Acquire) || MOVING.try_with(Cell::get).unwrap_or(false) {
        return Ok(());
    }
    let _moving = Moving::enter();
    let mut all = vars();
    for v in all.iter_mut() {
        let Some(m) = v.mirror.as_mut() else { continue };
        let now = mirror_bytes(m.addr, m.snapshot.len());
        if now == m.snapshot {
            continue;
        }
        let (device, _) = v.var.remote()?;
        // SAFETY: a host-to-device copy of `now`, which this function owns.
        let code = unsafe {
            super::stubs::cudaMemcpy(
                device as usize as *mut c_void,
                now.as_ptr() as *const c_void,
                now.len(),
                consts::cudaMemcpyHostToDevice,
            )
        };
        status(code).inspect_err(|e| {
            tracing::error!("a kernel launch: __managed__ variable {} not written to the device: {e:?}", v.var.name)
        })?;
        m.snapshot = now;
    }
    DEVICE_MAY_HAVE_WRITTEN.store(true, Ordering::Release);
    Ok(())
}

/// After a call that waits for the device: read the mirrors back if a kernel ran since.
fn after_synchronisation() {
    if !ANY_MIRROR.load(Ordering::Acquire)
        || MOVING.try_with(Cell::get).unwrap_or(false)
        || !DEVICE_MAY_HAVE_WRITTEN.swap(false, Ordering::AcqRel)
    {
        return;
    }
    let _moving = Moving::enter();
    let mut all = vars();
    for v in all.iter_mut() {
        let Some(m) = v.mirror.as_mut() else { continue };
        let size = m.snapshot.len();
        if let Err(e) = v.var.remote().and_then(|(device, _)| pull(m, device, size)) {
            tracing::error!("a synchronisation: __managed__ variable {} not read back: {e:?}", v.var.name);
            DEVICE_MAY_HAVE_WRITTEN.store(true, Ordering::Release);
        }
    }
}

/// Calls after which the device's earlier work is done (for the calling thread's view), so
/// the host may touch managed memory.
fn synchronises(id: FunctionId) -> bool {
    use FunctionId as F;
    matches!(
        id,
        F::CudaDeviceSynchronize
            | F::CudaStreamSynchronize
            | F::CudaEventSynchronize
            | F::CudaMemcpy
            | F::CudaMemcpyFromSymbol
            | F::CudaMemcpyToSymbol
    )
}

/// Generated exports after which the device may hold what the host has not seen: graph
/// launches (the hand-written kernel launches call [`before_launch`] themselves), and copies
/// to a symbol, which may be a managed variable. Each first writes the host's changes.
fn device_work(id: FunctionId) -> bool {
    use FunctionId as F;
    matches!(id, F::CudaGraphLaunch | F::CudaMemcpyToSymbol | F::CudaMemcpyFromSymbol)
}

/// Run around every runtime call ([`super::rt::api_call`]).
pub fn around_call(id: FunctionId, f: impl FnOnce() -> Result<(), CudaError>) -> Result<(), CudaError> {
    if device_work(id) {
        before_launch()?;
    }
    let r = f();
    if r.is_ok() && synchronises(id) {
        after_synchronisation();
    }
    r
}
