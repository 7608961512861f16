//! The `cuda` backend: a real GPU through the CUDA driver API, loaded at run time through
//! `cudarc`'s dynamic loading (no libcudart on the server, no link-time dependency on CUDA).
//!
//! Each device is used through its primary context; every channel thread makes the calling
//! device's context current before it runs a call. Device memory is mapped with the virtual
//! memory management API (`cuMemCreate` + `cuMemMap` into a range reserved with
//! `cuMemAddressReserve` at a fixed address), so allocations land at the addresses the
//! session's allocator chose.

use std::cell::Cell;
use std::collections::HashMap;
use std::ffi::{CStr, CString, c_void};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use cudarc::driver::sys;
use phos_protocol::CudaError;
use phos_protocol::types::{DeviceProperties, Dim3, FuncAttributes};

use super::{Backend, Copy2D, Gate, LoadedModule, Physical, Raw, StreamRef};
use crate::memory::MemoryView;

/// Attributes are queried up to this number (CUDA 13 defines about 150).
const MAX_ATTRIBUTE: i32 = 160;

fn check(r: sys::CUresult) -> Result<(), CudaError> {
    if r == sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        // Driver and runtime error codes share their numbers for everything the server calls.
        Err(CudaError(r as i32))
    }
}

struct Device {
    ordinal: i32,
    ctx: sys::CUcontext,
    granularity: u64,
    properties: DeviceProperties,
}

// The driver's handles are usable from any thread once a context is current.
unsafe impl Send for Device {}
unsafe impl Sync for Device {}

pub struct CudaBackend {
    devices: Vec<Device>,
    driver_version: i32,
    raw: RawDriver,
    /// `cuDeviceGetAttribute`, called with plain integers: attributes come from guests and
    /// may not be valid enumerators of the bindings' Rust enum.
    get_attribute: unsafe extern "C" fn(*mut i32, i32, sys::CUdevice) -> i32,
    timer: Mutex<KernelTimer>,
}

/// Device time of kernels, from an event pair recorded around each timed launch on its own
/// stream. Pairs are harvested (in launch order) when their end event has completed, so
/// measuring never waits for the GPU. Launches the router marks (a policy is loaded) are all
/// timed; of the others, one in `PHOS_TIME_KERNELS` (default 16, counted that many times; 0:
/// none), for `phosctl top` and the metrics. The two event records and the harvest cost
/// about as much as the launch itself, so timing every launch would halve launch rates.
///
/// Events measure wall time on the GPU: when another process's context holds the GPU in
/// a time slice while this kernel is in flight, the slice counts too, so a kernel would be
/// charged for the other tenant's work. A kernel measured at more than twice the shortest
/// time recently measured for the same launch shape (function, grid, block, shared memory)
/// is therefore charged that shortest time, what the shape takes when nothing interrupts it.
///
/// The router counts a tenant's kernels queued as its launches less the kernels reported
/// measured, so every launch that succeeds is counted once, whether timed or not
/// ([`Sampler`]): an untimed launch is counted as a kernel when it is launched, a timed one
/// when its events are harvested, and a timed launch's time stands for itself and the
/// untimed ones since the last timed launch. So loading a policy in the middle of a sampled
/// run (every launch timed from then on) leaves the count of kernels where the launches
/// are, and the router never takes a queue with kernels in it for an empty one.
struct KernelTimer {
    sampler: Sampler,
    /// (device, start, end, weight, shape) of launches not harvested yet, oldest first.
    pending: std::collections::VecDeque<(i32, sys::CUevent, sys::CUevent, u64, u64)>,
    /// Recent shortest time per launch shape.
    shortest: HashMap<u64, ShapeMinimum>,
    /// Event pairs to reuse, per device.
    free: Vec<Vec<(sys::CUevent, sys::CUevent)>>,
    total_ns: u64,
    kernels: u64,
    /// When finished pairs were last looked for.
    harvested_at: Instant,
}

/// Finished timings are looked for at most this often: a launch storm asks for the
/// session's device time after every call, and a query per launch costs the driver.
const HARVEST_EVERY: Duration = Duration::from_micros(20);

// CUevent handles are plain driver handles, usable from any thread.
unsafe impl Send for KernelTimer {}

/// Which launches are timed. Every launch is counted as a kernel; the device time of the
/// untimed ones is estimated from the next timed one, which stands for them.
struct Sampler {
    /// Time at least one launch in this many when the router does not need every one
    /// (`PHOS_TIME_KERNELS`; 0: none, and nothing counted).
    every: u64,
    /// And one at least this often (see [`sample_gap`]).
    gap: Option<Duration>,
    /// Untimed launches since the last timed one: its successor's time stands for them.
    untimed: u64,
    /// When the last launch was timed.
    last_timed: Option<Instant>,
}

/// How one launch is counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Count {
    timed: bool,
    /// Timed: the launches its time stands for (itself and the untimed ones before it).
    /// Untimed: 1 when counted as a kernel at once, 0 when nothing is counted.
    weight: u64,
}

/// A launch is timed at least this often while the session launches: a kernel of a
/// millisecond or more is timed every time, a storm of short ones about a thousand times a
/// second (an event pair costs the driver about what a launch does).
/// `PHOS_SAMPLE_GAP_US` (default 1000; 0: one launch in `PHOS_TIME_KERNELS` only).
fn sample_gap() -> Option<Duration> {
    static GAP: std::sync::OnceLock<Option<Duration>> = std::sync::OnceLock::new();
    *GAP.get_or_init(|| {
        let us = std::env::var("PHOS_SAMPLE_GAP_US").ok().and_then(|v| v.trim().parse::<u64>().ok()).unwrap_or(1000);
        (us > 0).then(|| Duration::from_micros(us))
    })
}

/// Untimed launches between two looks at the clock for the sampling gap.
const GAP_CHECK_EVERY: u64 = 8;

impl Sampler {
    fn new(every: u64, gap: Option<Duration>) -> Self {
        Sampler { every, gap, untimed: 0, last_timed: None }
    }

    /// The next launch (`now` reads the clock): timed always when `measure`, else when
    /// `every` launches have gone by untimed or the last timed one is the gap old (looked at
    /// every [`GAP_CHECK_EVERY`] launches: a clock read is a tenth of what the server adds
    /// to a launch).
    fn next(&mut self, measure: bool, now: impl Fn() -> Instant) -> Count {
        if !measure && self.every == 0 {
            return Count { timed: false, weight: 0 };
        }
        let mut read = None;
        let due = measure
            || self.untimed + 1 >= self.every
            || match (self.last_timed, self.gap) {
                (None, _) => true,
                (Some(last), Some(gap)) if self.untimed % GAP_CHECK_EVERY == GAP_CHECK_EVERY - 1 => {
                    let t = now();
                    read = Some(t);
                    t.saturating_duration_since(last) >= gap
                }
                _ => false,
            };
        if !due {
            self.untimed += 1;
            return Count { timed: false, weight: 1 };
        }
        self.last_timed = Some(read.unwrap_or_else(now));
        Count { timed: true, weight: 1 + std::mem::take(&mut self.untimed) }
    }

    /// A launch [`next`](Self::next) counted failed: what it stood for goes back.
    fn abandon(&mut self, count: &Count) {
        if count.timed {
            self.untimed += count.weight.saturating_sub(1);
        } else {
            self.untimed = self.untimed.saturating_sub(count.weight);
        }
    }
}

/// How one launch is timed: its event pair (none: not timed) and how it is counted.
struct Timing {
    pair: Option<(sys::CUevent, sys::CUevent)>,
    count: Count,
}

/// Pending pairs beyond this are harvested by waiting, so a stream that never completes
/// cannot grow the queue without bound.
const MAX_PENDING_TIMINGS: usize = 4096;

/// The shortest time of one launch shape over its last two windows of samples, so a
/// kernel whose work grows is charged its new time within two windows.
#[derive(Clone, Copy)]
struct ShapeMinimum {
    current: u64,
    previous: u64,
    samples: u32,
}

/// A measurement more than this many times the shape's shortest (in hundredths) is taken to
/// include another context's time slice and is charged the shortest:
/// `PHOS_KERNEL_INTERRUPTED` (a ratio, default 2). Run times of one shape vary by a few
/// percent, so a lower ratio undercharges short kernels by their spread: at 1 (every kernel
/// charged its shape's recent shortest) an H100 run charged a tenant of 0.1 ms kernels 12%
/// less than one of 10 ms kernels for the same device time (docs/perf.md).
fn interrupted_ratio() -> u64 {
    static RATIO: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *RATIO.get_or_init(|| {
        std::env::var("PHOS_KERNEL_INTERRUPTED")
            .ok()
            .and_then(|v| v.trim().parse::<f64>().ok())
            .filter(|r| *r >= 1.0)
            .map_or(200, |r| (r * 100.0) as u64)
    })
}
/// Samples per window of [`ShapeMinimum`].
const SHAPE_WINDOW: u32 = 32;
/// Shapes remembered; past this the table starts over.
const MAX_SHAPES: usize = 4096;

impl ShapeMinimum {
    /// Record a measurement; returns what the kernel is charged: the shape's recent shortest
    /// time when `ns` is more than `ratio` hundredths of it, else `ns`.
    fn charge(&mut self, ns: u64, ratio: u64) -> u64 {
        if self.samples == SHAPE_WINDOW {
            self.previous = self.current;
            self.current = u64::MAX;
            self.samples = 0;
        }
        self.samples += 1;
        self.current = self.current.min(ns);
        let shortest = self.current.min(self.previous);
        if u128::from(ns) * 100 > u128::from(shortest) * u128::from(ratio) { shortest } else { ns }
    }
}

/// A launch shape's key.
fn launch_shape(function: Raw, grid: Dim3, block: Dim3, shared_mem: u32) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (function, grid, block, shared_mem).hash(&mut h);
    h.finish()
}

impl KernelTimer {
    fn new(devices: usize) -> Self {
        let every = std::env::var("PHOS_TIME_KERNELS").ok().and_then(|v| v.parse().ok()).unwrap_or(256);
        KernelTimer {
            sampler: Sampler::new(every, sample_gap()),
            pending: Default::default(),
            shortest: HashMap::new(),
            free: vec![Vec::new(); devices],
            total_ns: 0,
            kernels: 0,
            harvested_at: Instant::now(),
        }
    }

    /// [`harvest`](Self::harvest), unless it ran less than [`HARVEST_EVERY`] ago.
    fn harvest_if_due(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        let now = Instant::now();
        if now.duration_since(self.harvested_at) >= HARVEST_EVERY {
            self.harvested_at = now;
            self.harvest();
        }
    }

    /// The next launch on `device`: how it is counted, and an event pair if it is timed.
    fn begin(&mut self, device: i32, measure: bool) -> Timing {
        let count = self.sampler.next(measure, Instant::now);
        let pair = if count.timed { self.pair(device) } else { None };
        if !count.timed {
            // Counted now (taken back if the launch fails): its time comes with the next
            // timed launch.
            self.kernels += count.weight;
        }
        Timing { pair, count }
    }

    fn pair(&mut self, device: i32) -> Option<(sys::CUevent, sys::CUevent)> {
        if let Some(pair) = self.free.get_mut(device as usize)?.pop() {
            return Some(pair);
        }
        let mut start = std::ptr::null_mut();
        let mut end = std::ptr::null_mut();
        unsafe {
            check(sys::cuEventCreate(&mut start, 0)).ok()?;
            if check(sys::cuEventCreate(&mut end, 0)).is_err() {
                sys::cuEventDestroy_v2(start);
                return None;
            }
        }
        Some((start, end))
    }

    fn recorded(&mut self, device: i32, pair: (sys::CUevent, sys::CUevent), weight: u64, shape: u64) {
        self.pending.push_back((device, pair.0, pair.1, weight, shape));
        if self.pending.len() > MAX_PENDING_TIMINGS
            && let Some(&(_, _, end, _, _)) = self.pending.front()
        {
            unsafe { sys::cuEventSynchronize(end) };
            self.harvest();
        }
        self.harvest_if_due();
    }

    fn give_back(&mut self, device: i32, pair: (sys::CUevent, sys::CUevent)) {
        if let Some(f) = self.free.get_mut(device as usize) {
            f.push(pair);
        }
    }

    /// Count every finished pair at the front of the queue.
    fn harvest(&mut self) {
        while let Some(&(device, start, end, weight, shape)) = self.pending.front() {
            let r = unsafe { sys::cuEventQuery(end) };
            if r == sys::CUresult::CUDA_ERROR_NOT_READY {
                break;
            }
            self.pending.pop_front();
            let mut ms = 0f32;
            if r == sys::CUresult::CUDA_SUCCESS
                && unsafe { sys::cuEventElapsedTime(&mut ms, start, end) } == sys::CUresult::CUDA_SUCCESS
            {
                if self.shortest.len() >= MAX_SHAPES && !self.shortest.contains_key(&shape) {
                    self.shortest.clear();
                }
                let min = self.shortest.entry(shape).or_insert(ShapeMinimum {
                    current: u64::MAX,
                    previous: u64::MAX,
                    samples: 0,
                });
                self.total_ns += min.charge((f64::from(ms) * 1e6) as u64, interrupted_ratio()) * weight;
            }
            // Counted even without a time, so that the router's count of kernels queued
            // comes back to none.
            self.kernels += 1;
            self.give_back(device, (start, end));
        }
    }
}

thread_local! {
    /// The device whose context is current on this thread.
    static BOUND: Cell<i32> = const { Cell::new(-1) };
}

impl CudaBackend {
    /// True when a CUDA driver can be loaded (without initialising it).
    pub fn driver_present() -> bool {
        unsafe { sys::is_culib_present() }
    }

    /// Number of GPUs, or why there are none usable.
    pub fn probe() -> Result<i32, String> {
        if !Self::driver_present() {
            return Err("no CUDA driver (libcuda.so) on this machine".into());
        }
        // SAFETY: looking a symbol up in the loaded library runs none of its code.
        let runtime_export = unsafe { sys::culib().get::<unsafe extern "C" fn()>(b"cudaMalloc\0").is_ok() };
        if runtime_export {
            // Phos's guest library exports both APIs; NVIDIA's driver has no runtime functions.
            return Err(
                "the libcuda.so.1 found here is Phos's guest library, not NVIDIA's driver (is LD_LIBRARY_PATH \
                        set to a directory of guest library links for the server?)"
                    .into(),
            );
        }
        unsafe {
            check(sys::cuInit(0)).map_err(|e| format!("cuInit: {e:?}"))?;
            let mut n = 0;
            check(sys::cuDeviceGetCount(&mut n)).map_err(|e| format!("cuDeviceGetCount: {e:?}"))?;
            Ok(n)
        }
    }

    pub fn new() -> Result<Self, String> {
        let count = Self::probe()?;
        if count == 0 {
            return Err("the CUDA driver reports no GPU".into());
        }
        let get_attribute = unsafe {
            *sys::culib()
                .get::<unsafe extern "C" fn(*mut i32, i32, sys::CUdevice) -> i32>(b"cuDeviceGetAttribute\0")
                .map_err(|e| format!("cuDeviceGetAttribute: {e}"))?
        };
        let mut driver_version = 0;
        unsafe { check(sys::cuDriverGetVersion(&mut driver_version)).map_err(|e| format!("{e:?}"))? };
        let mut devices = Vec::new();
        for ordinal in 0..count {
            unsafe {
                let mut dev = 0;
                check(sys::cuDeviceGet(&mut dev, ordinal)).map_err(|e| format!("cuDeviceGet: {e:?}"))?;
                let mut ctx = std::ptr::null_mut();
                check(sys::cuDevicePrimaryCtxRetain(&mut ctx, dev)).map_err(|e| format!("primary context: {e:?}"))?;
                check(sys::cuCtxSetCurrent(ctx)).map_err(|e| format!("cuCtxSetCurrent: {e:?}"))?;
                let prop = allocation_prop(ordinal);
                let mut gran = 0usize;
                check(sys::cuMemGetAllocationGranularity(
                    &mut gran,
                    &prop,
                    sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_RECOMMENDED,
                ))
                .map_err(|e| format!("allocation granularity: {e:?}"))?;
                let properties = query_properties(get_attribute, dev)?;
                devices.push(Device { ordinal, ctx, granularity: gran as u64, properties });
            }
        }
        BOUND.with(|b| b.set(count - 1));
        let timer = Mutex::new(KernelTimer::new(devices.len()));
        let raw = RawDriver::load()?;
        Ok(CudaBackend { devices, driver_version, raw, get_attribute, timer })
    }

    fn device(&self, device: i32) -> Result<&Device, CudaError> {
        usize::try_from(device).ok().and_then(|d| self.devices.get(d)).ok_or(CudaError::InvalidDevice)
    }
}

/// Driver functions whose enum arguments come from guests, called with plain integers: a
/// value that is not an enumerator of the bindings' Rust enums would be undefined behaviour
/// there, while the driver itself answers it with an error.
struct RawDriver {
    ctx_get_limit: unsafe extern "C" fn(*mut usize, i32) -> i32,
    ctx_set_limit: unsafe extern "C" fn(i32, usize) -> i32,
    ctx_get_cache_config: unsafe extern "C" fn(*mut i32) -> i32,
    ctx_set_cache_config: unsafe extern "C" fn(i32) -> i32,
    /// Absent from drivers that dropped bank-size configuration.
    ctx_get_shared_mem_config: Option<unsafe extern "C" fn(*mut i32) -> i32>,
    ctx_set_shared_mem_config: Option<unsafe extern "C" fn(i32) -> i32>,
    func_get_attribute: unsafe extern "C" fn(*mut i32, i32, sys::CUfunction) -> i32,
    func_set_attribute: unsafe extern "C" fn(sys::CUfunction, i32, i32) -> i32,
    func_set_cache_config: unsafe extern "C" fn(sys::CUfunction, i32) -> i32,
}

impl RawDriver {
    fn load() -> Result<Self, String> {
        fn get<T: Copy>(name: &str) -> Option<T> {
            let mut sym = name.as_bytes().to_vec();
            sym.push(0);
            unsafe { sys::culib().get::<T>(sym.as_slice()).ok().map(|f| *f) }
        }
        macro_rules! need {
            ($name:literal) => {
                get($name).ok_or_else(|| format!("the CUDA driver lacks {}", $name))?
            };
        }
        Ok(RawDriver {
            ctx_get_limit: need!("cuCtxGetLimit"),
            ctx_set_limit: need!("cuCtxSetLimit"),
            ctx_get_cache_config: need!("cuCtxGetCacheConfig"),
            ctx_set_cache_config: need!("cuCtxSetCacheConfig"),
            ctx_get_shared_mem_config: get("cuCtxGetSharedMemConfig"),
            ctx_set_shared_mem_config: get("cuCtxSetSharedMemConfig"),
            func_get_attribute: need!("cuFuncGetAttribute"),
            func_set_attribute: need!("cuFuncSetAttribute"),
            func_set_cache_config: need!("cuFuncSetCacheConfig"),
        })
    }
}

fn check_raw(r: i32) -> Result<(), CudaError> {
    if r == 0 { Ok(()) } else { Err(CudaError(r)) }
}

fn allocation_prop(ordinal: i32) -> sys::CUmemAllocationProp {
    let mut prop: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
    prop.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = ordinal;
    prop
}

unsafe fn query_properties(
    get_attribute: unsafe extern "C" fn(*mut i32, i32, sys::CUdevice) -> i32,
    dev: sys::CUdevice,
) -> Result<DeviceProperties, String> {
    let mut name = [0 as std::ffi::c_char; 256];
    unsafe { check(sys::cuDeviceGetName(name.as_mut_ptr(), 256, dev)).map_err(|e| format!("{e:?}"))? };
    let name = unsafe { CStr::from_ptr(name.as_ptr()) }.to_string_lossy().into_owned();
    let mut total = 0usize;
    unsafe { check(sys::cuDeviceTotalMem_v2(&mut total, dev)).map_err(|e| format!("{e:?}"))? };
    let mut uuid: sys::CUuuid = unsafe { std::mem::zeroed() };
    unsafe { check(sys::cuDeviceGetUuid(&mut uuid, dev)).map_err(|e| format!("{e:?}"))? };
    let mut attributes = vec![0i32; MAX_ATTRIBUTE as usize + 1];
    for (a, slot) in attributes.iter_mut().enumerate().skip(1) {
        let mut v = 0;
        // Attributes this driver does not know answer an error: they stay 0.
        if unsafe { get_attribute(&mut v, a as i32, dev) } == 0 {
            *slot = v;
        }
    }
    Ok(DeviceProperties {
        name,
        uuid: uuid.bytes.map(|b| b as u8),
        luid: [0; 8],
        luid_device_node_mask: 0,
        total_global_mem: total as u64,
        attributes,
    })
}

fn stream_handle(s: StreamRef) -> sys::CUstream {
    match s {
        StreamRef::Legacy => std::ptr::null_mut(),
        // CU_STREAM_PER_THREAD
        StreamRef::PerThread => 0x2 as sys::CUstream,
        StreamRef::Created(raw) => raw as sys::CUstream,
    }
}

impl Backend for CudaBackend {
    fn name(&self) -> &'static str {
        "cuda"
    }

    fn device_count(&self) -> i32 {
        self.devices.len() as i32
    }

    fn device_properties(&self, device: i32) -> Result<DeviceProperties, CudaError> {
        Ok(self.device(device)?.properties.clone())
    }

    fn device_attribute(&self, device: i32, attribute: i32) -> Result<i32, CudaError> {
        let d = self.device(device)?;
        let mut dev = 0;
        unsafe { check(sys::cuDeviceGet(&mut dev, d.ordinal))? };
        let mut v = 0;
        let r = unsafe { (self.get_attribute)(&mut v, attribute, dev) };
        if r != 0 { Err(CudaError(r)) } else { Ok(v) }
    }

    fn driver_version(&self) -> i32 {
        self.driver_version
    }

    fn mem_info(&self, device: i32) -> Result<(u64, u64), CudaError> {
        self.bind(device)?;
        let (mut free, mut total) = (0usize, 0usize);
        unsafe { check(sys::cuMemGetInfo_v2(&mut free, &mut total))? };
        Ok((free as u64, total as u64))
    }

    fn bind(&self, device: i32) -> Result<(), CudaError> {
        if BOUND.with(|b| b.get()) == device {
            return Ok(());
        }
        let d = self.device(device)?;
        unsafe { check(sys::cuCtxSetCurrent(d.ctx))? };
        BOUND.with(|b| b.set(device));
        Ok(())
    }

    fn device_synchronize(&self, device: i32) -> Result<(), CudaError> {
        self.bind(device)?;
        unsafe { check(sys::cuCtxSynchronize()) }
    }

    fn reserve(&self, base: u64, size: u64) -> Result<(), CudaError> {
        let mut got: sys::CUdeviceptr = 0;
        let align = self.devices.iter().map(|d| d.granularity).max().unwrap_or(2 << 20);
        unsafe { check(sys::cuMemAddressReserve(&mut got, size as usize, align as usize, base, 0))? };
        if got != base {
            // The driver treats the address as a hint; pointers would not be stable.
            unsafe {
                sys::cuMemAddressFree(got, size as usize);
            }
            tracing::error!("device address range {base:#x} is taken (the driver offered {got:#x})");
            return Err(CudaError::MemoryAllocation);
        }
        Ok(())
    }

    fn unreserve(&self, base: u64, size: u64) {
        unsafe {
            sys::cuMemAddressFree(base, size as usize);
        }
    }

    fn granularity(&self, device: i32) -> u64 {
        self.device(device).map(|d| d.granularity).unwrap_or(2 << 20)
    }

    fn map(&self, device: i32, addr: u64, size: u64) -> Result<Physical, CudaError> {
        let d = self.device(device)?;
        let prop = allocation_prop(d.ordinal);
        let mut handle: sys::CUmemGenericAllocationHandle = 0;
        unsafe {
            check(sys::cuMemCreate(&mut handle, size as usize, &prop, 0))?;
            if let Err(e) = check(sys::cuMemMap(addr, size as usize, 0, handle, 0)) {
                sys::cuMemRelease(handle);
                return Err(e);
            }
            let mut access: sys::CUmemAccessDesc = std::mem::zeroed();
            access.location = prop.location;
            access.flags = sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
            // Every device of the session may read and write it (peer access).
            let descs: Vec<sys::CUmemAccessDesc> = self
                .devices
                .iter()
                .map(|other| {
                    let mut a = access;
                    a.location.id = other.ordinal;
                    a
                })
                .collect();
            let r = sys::cuMemSetAccess(addr, size as usize, descs.as_ptr(), descs.len());
            let r = if r != sys::CUresult::CUDA_SUCCESS && descs.len() > 1 {
                // Without peer access between the GPUs, only the owner maps it.
                sys::cuMemSetAccess(addr, size as usize, &access, 1)
            } else {
                r
            };
            if let Err(e) = check(r) {
                sys::cuMemUnmap(addr, size as usize);
                sys::cuMemRelease(handle);
                return Err(e);
            }
        }
        Ok(handle)
    }

    fn unmap(&self, addr: u64, size: u64, physical: Physical) -> Result<(), CudaError> {
        unsafe {
            check(sys::cuMemUnmap(addr, size as usize))?;
            check(sys::cuMemRelease(physical))
        }
    }

    fn memcpy_htod(&self, dst: u64, src: &[u8], stream: Option<StreamRef>) -> Result<(), CudaError> {
        unsafe {
            match stream {
                None => check(sys::cuMemcpyHtoD_v2(dst, src.as_ptr() as *const c_void, src.len())),
                Some(s) => {
                    check(sys::cuMemcpyHtoDAsync_v2(dst, src.as_ptr() as *const c_void, src.len(), stream_handle(s)))
                }
            }
        }
    }

    fn pin_host(&self, buf: &mut [u8]) {
        unsafe {
            sys::cuMemHostRegister_v2(buf.as_mut_ptr() as *mut c_void, buf.len(), 0);
        }
    }

    fn unpin_host(&self, buf: &mut [u8]) {
        unsafe {
            sys::cuMemHostUnregister(buf.as_mut_ptr() as *mut c_void);
        }
    }

    fn memcpy_dtoh(&self, dst: &mut [u8], src: u64, stream: Option<StreamRef>) -> Result<(), CudaError> {
        unsafe {
            match stream {
                None => check(sys::cuMemcpyDtoH_v2(dst.as_mut_ptr() as *mut c_void, src, dst.len())),
                Some(s) => {
                    // The reply carries the data, so the copy must be finished before it is sent.
                    let h = stream_handle(s);
                    check(sys::cuMemcpyDtoHAsync_v2(dst.as_mut_ptr() as *mut c_void, src, dst.len(), h))?;
                    check(sys::cuStreamSynchronize(h))
                }
            }
        }
    }

    fn register_host(&self, addr: u64, len: u64) -> Result<u64, CudaError> {
        // Portable (every context) and mapped (kernels reach it); under unified addressing
        // the device address is the host address.
        const PORTABLE_MAPPED: u32 = 0x1 | 0x2;
        let p = addr as *mut c_void;
        unsafe {
            check(sys::cuMemHostRegister_v2(p, len as usize, PORTABLE_MAPPED))?;
            let mut device = 0;
            if let Err(e) = check(sys::cuMemHostGetDevicePointer_v2(&mut device, p, 0)) {
                sys::cuMemHostUnregister(p);
                return Err(e);
            }
            Ok(device)
        }
    }

    fn unregister_host(&self, addr: u64) {
        unsafe {
            sys::cuMemHostUnregister(addr as *mut c_void);
        }
    }

    fn memcpy_registered(
        &self,
        device: u64,
        host: u64,
        len: u64,
        to_device: bool,
        stream: Option<StreamRef>,
    ) -> Result<(), CudaError> {
        let (h, n) = (host as *mut c_void, len as usize);
        unsafe {
            check(match (to_device, stream) {
                (true, None) => sys::cuMemcpyHtoD_v2(device, h, n),
                (true, Some(s)) => sys::cuMemcpyHtoDAsync_v2(device, h, n, stream_handle(s)),
                (false, None) => sys::cuMemcpyDtoH_v2(h, device, n),
                (false, Some(s)) => sys::cuMemcpyDtoHAsync_v2(h, device, n, stream_handle(s)),
            })
        }
    }

    fn memcpy_dtod(&self, dst: u64, src: u64, len: u64, stream: Option<StreamRef>) -> Result<(), CudaError> {
        unsafe {
            match stream {
                None => check(sys::cuMemcpyDtoD_v2(dst, src, len as usize)),
                Some(s) => check(sys::cuMemcpyDtoDAsync_v2(dst, src, len as usize, stream_handle(s))),
            }
        }
    }

    fn memset(&self, dst: u64, value: u8, len: u64, stream: Option<StreamRef>) -> Result<(), CudaError> {
        unsafe {
            match stream {
                None => check(sys::cuMemsetD8_v2(dst, value, len as usize)),
                Some(s) => check(sys::cuMemsetD8Async(dst, value, len as usize, stream_handle(s))),
            }
        }
    }

    fn memcpy_2d(&self, copy: Copy2D<'_>, width: u64, height: u64, stream: Option<StreamRef>) -> Result<(), CudaError> {
        let host = sys::CUmemorytype::CU_MEMORYTYPE_HOST;
        let device = sys::CUmemorytype::CU_MEMORYTYPE_DEVICE;
        // (memory type, host pointer, device address, pitch) of each side. The struct has
        // enum fields without a zero value, so it is built whole, never zeroed.
        let (reply_wait, src, dst) = match copy {
            Copy2D::HostToDevice { dst, dpitch, src } => {
                (false, (host, src.as_ptr() as *mut c_void, 0, width), (device, std::ptr::null_mut(), dst, dpitch))
            }
            Copy2D::DeviceToHost { dst, src, spitch } => {
                (true, (device, std::ptr::null_mut(), src, spitch), (host, dst.as_mut_ptr() as *mut c_void, 0, width))
            }
            Copy2D::DeviceToDevice { dst, dpitch, src, spitch } => {
                (false, (device, std::ptr::null_mut(), src, spitch), (device, std::ptr::null_mut(), dst, dpitch))
            }
        };
        let p = sys::CUDA_MEMCPY2D {
            srcXInBytes: 0,
            srcY: 0,
            srcMemoryType: src.0,
            srcHost: src.1,
            srcDevice: src.2,
            srcArray: std::ptr::null_mut(),
            srcPitch: src.3 as usize,
            dstXInBytes: 0,
            dstY: 0,
            dstMemoryType: dst.0,
            dstHost: dst.1,
            dstDevice: dst.2,
            dstArray: std::ptr::null_mut(),
            dstPitch: dst.3 as usize,
            WidthInBytes: width as usize,
            Height: height as usize,
        };
        unsafe {
            match stream {
                None => check(sys::cuMemcpy2DUnaligned_v2(&p)),
                Some(s) => {
                    let h = stream_handle(s);
                    check(sys::cuMemcpy2DAsync_v2(&p, h))?;
                    // A host side is the request's or the reply's buffer: done before either goes.
                    if reply_wait || p.srcMemoryType == host { check(sys::cuStreamSynchronize(h)) } else { Ok(()) }
                }
            }
        }
    }

    fn memset_2d(
        &self,
        dst: u64,
        pitch: u64,
        value: u8,
        width: u64,
        height: u64,
        stream: Option<StreamRef>,
    ) -> Result<(), CudaError> {
        let (pitch, width, height) = (pitch as usize, width as usize, height as usize);
        unsafe {
            match stream {
                None => check(sys::cuMemsetD2D8_v2(dst, pitch, value, width, height)),
                Some(s) => check(sys::cuMemsetD2D8Async(dst, pitch, value, width, height, stream_handle(s))),
            }
        }
    }

    fn limit(&self, device: i32, limit: i32) -> Result<u64, CudaError> {
        self.bind(device)?;
        let mut v = 0usize;
        check_raw(unsafe { (self.raw.ctx_get_limit)(&mut v, limit) })?;
        Ok(v as u64)
    }

    fn set_limit(&self, device: i32, limit: i32, value: u64) -> Result<(), CudaError> {
        self.bind(device)?;
        check_raw(unsafe { (self.raw.ctx_set_limit)(limit, value as usize) })
    }

    fn cache_config(&self, device: i32) -> Result<i32, CudaError> {
        self.bind(device)?;
        let mut v = 0;
        check_raw(unsafe { (self.raw.ctx_get_cache_config)(&mut v) })?;
        Ok(v)
    }

    fn set_cache_config(&self, device: i32, config: i32) -> Result<(), CudaError> {
        self.bind(device)?;
        check_raw(unsafe { (self.raw.ctx_set_cache_config)(config) })
    }

    fn shared_mem_config(&self, device: i32) -> Result<i32, CudaError> {
        self.bind(device)?;
        let Some(get) = self.raw.ctx_get_shared_mem_config else {
            return Ok(1); // four-byte banks, the only size of current GPUs
        };
        let mut v = 0;
        check_raw(unsafe { get(&mut v) })?;
        Ok(v)
    }

    fn set_shared_mem_config(&self, device: i32, config: i32) -> Result<(), CudaError> {
        self.bind(device)?;
        match self.raw.ctx_set_shared_mem_config {
            Some(set) => check_raw(unsafe { set(config) }),
            None => Ok(()),
        }
    }

    fn stream_priority_range(&self, device: i32) -> Result<(i32, i32), CudaError> {
        self.bind(device)?;
        let (mut least, mut greatest) = (0, 0);
        unsafe { check(sys::cuCtxGetStreamPriorityRange(&mut least, &mut greatest))? };
        Ok((least, greatest))
    }

    fn can_access_peer(&self, device: i32, peer: i32) -> Result<bool, CudaError> {
        let (d, p) = (self.device(device)?.ordinal, self.device(peer)?.ordinal);
        let mut can = 0;
        unsafe { check(sys::cuDeviceCanAccessPeer(&mut can, d, p))? };
        Ok(can != 0)
    }

    fn enable_peer_access(&self, device: i32, peer: i32) -> Result<(), CudaError> {
        let peer_ctx = self.device(peer)?.ctx;
        self.bind(device)?;
        unsafe { check(sys::cuCtxEnablePeerAccess(peer_ctx, 0)) }
    }

    fn disable_peer_access(&self, device: i32, peer: i32) -> Result<(), CudaError> {
        let peer_ctx = self.device(peer)?.ctx;
        self.bind(device)?;
        unsafe { check(sys::cuCtxDisablePeerAccess(peer_ctx)) }
    }

    fn reset_persisting_l2_cache(&self, device: i32) -> Result<(), CudaError> {
        self.bind(device)?;
        unsafe { check(sys::cuCtxResetPersistingL2Cache()) }
    }

    fn host_func(&self, stream: StreamRef, gate: std::sync::Arc<Gate>) -> Result<(), CudaError> {
        // Runs on the driver's callback thread when the stream gets there; the stream stays
        // there until the guest has run its function.
        unsafe extern "C" fn at_gate(gate: *mut c_void) {
            let gate = unsafe { std::sync::Arc::from_raw(gate as *const Gate) };
            gate.reach();
            gate.wait_opened();
        }
        let raw = std::sync::Arc::into_raw(gate) as *mut c_void;
        let r = unsafe { check(sys::cuLaunchHostFunc(stream_handle(stream), Some(at_gate), raw)) };
        if r.is_err() {
            drop(unsafe { std::sync::Arc::from_raw(raw as *const Gate) });
        }
        r
    }

    fn stream_wait_event(&self, stream: StreamRef, event: Raw) -> Result<(), CudaError> {
        unsafe { check(sys::cuStreamWaitEvent(stream_handle(stream), event as sys::CUevent, 0)) }
    }

    fn function_attributes(&self, function: Raw) -> Result<FuncAttributes, CudaError> {
        let f = function as sys::CUfunction;
        let get = |attr: i32| -> Result<i32, CudaError> {
            let mut v = 0;
            check_raw(unsafe { (self.raw.func_get_attribute)(&mut v, attr, f) })?;
            Ok(v)
        };
        // The cluster attributes (10..=15) are unknown to drivers before CUDA 12: 0 then.
        let optional = |attr: i32| get(attr).unwrap_or(0);
        Ok(FuncAttributes {
            max_threads_per_block: get(0)?,
            shared_size_bytes: get(1)? as u64,
            const_size_bytes: get(2)? as u64,
            local_size_bytes: get(3)? as u64,
            num_regs: get(4)?,
            ptx_version: get(5)?,
            binary_version: get(6)?,
            cache_mode_ca: get(7)?,
            max_dynamic_shared_size_bytes: get(8)?,
            preferred_shmem_carveout: get(9)?,
            cluster_dim_must_be_set: optional(10),
            required_cluster: [optional(11), optional(12), optional(13)],
            non_portable_cluster_size_allowed: optional(14),
            cluster_scheduling_policy_preference: optional(15),
            reserved: 0,
        })
    }

    fn function_set_attribute(&self, function: Raw, attr: i32, value: i32) -> Result<(), CudaError> {
        check_raw(unsafe { (self.raw.func_set_attribute)(function as sys::CUfunction, attr, value) })
    }

    fn function_set_cache_config(&self, function: Raw, config: i32) -> Result<(), CudaError> {
        check_raw(unsafe { (self.raw.func_set_cache_config)(function as sys::CUfunction, config) })
    }

    fn occupancy(&self, function: Raw, block_size: i32, dynamic_smem: u64, flags: u32) -> Result<i32, CudaError> {
        let mut n = 0;
        unsafe {
            check(sys::cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(
                &mut n,
                function as sys::CUfunction,
                block_size,
                dynamic_smem as usize,
                flags,
            ))?
        };
        Ok(n)
    }

    fn available_dynamic_smem(&self, function: Raw, blocks: i32, block_size: i32) -> Result<u64, CudaError> {
        let mut n = 0usize;
        unsafe {
            check(sys::cuOccupancyAvailableDynamicSMemPerBlock(
                &mut n,
                function as sys::CUfunction,
                blocks,
                block_size,
            ))?
        };
        Ok(n as u64)
    }

    fn stream_create(&self, device: i32, flags: u32, priority: i32) -> Result<Raw, CudaError> {
        self.bind(device)?;
        let mut s = std::ptr::null_mut();
        unsafe { check(sys::cuStreamCreateWithPriority(&mut s, flags, priority))? };
        Ok(s as Raw)
    }

    fn stream_destroy(&self, stream: Raw) -> Result<(), CudaError> {
        unsafe { check(sys::cuStreamDestroy_v2(stream as sys::CUstream)) }
    }

    fn stream_synchronize(&self, stream: StreamRef) -> Result<(), CudaError> {
        unsafe { check(sys::cuStreamSynchronize(stream_handle(stream))) }
    }

    fn stream_query(&self, stream: StreamRef) -> Result<bool, CudaError> {
        match unsafe { sys::cuStreamQuery(stream_handle(stream)) } {
            sys::CUresult::CUDA_SUCCESS => Ok(true),
            sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            e => Err(CudaError(e as i32)),
        }
    }

    fn event_create(&self, device: i32, flags: u32) -> Result<Raw, CudaError> {
        self.bind(device)?;
        let mut e = std::ptr::null_mut();
        unsafe { check(sys::cuEventCreate(&mut e, flags))? };
        Ok(e as Raw)
    }

    fn event_destroy(&self, event: Raw) -> Result<(), CudaError> {
        unsafe { check(sys::cuEventDestroy_v2(event as sys::CUevent)) }
    }

    fn event_record(&self, event: Raw, stream: StreamRef) -> Result<(), CudaError> {
        unsafe { check(sys::cuEventRecord(event as sys::CUevent, stream_handle(stream))) }
    }

    fn event_synchronize(&self, event: Raw) -> Result<(), CudaError> {
        unsafe { check(sys::cuEventSynchronize(event as sys::CUevent)) }
    }

    fn event_query(&self, event: Raw) -> Result<bool, CudaError> {
        match unsafe { sys::cuEventQuery(event as sys::CUevent) } {
            sys::CUresult::CUDA_SUCCESS => Ok(true),
            sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            e => Err(CudaError(e as i32)),
        }
    }

    fn event_elapsed(&self, start: Raw, end: Raw) -> Result<f32, CudaError> {
        let mut ms = 0f32;
        unsafe { check(sys::cuEventElapsedTime(&mut ms, start as sys::CUevent, end as sys::CUevent))? };
        Ok(ms)
    }

    fn module_load(&self, device: i32, image: &[u8]) -> Result<LoadedModule, CudaError> {
        self.bind(device)?;
        // The driver reads the image as 8-byte words; give it an aligned, NUL-terminated copy
        // (PTX images need the terminator).
        let mut aligned = vec![0u64; image.len() / 8 + 2];
        unsafe { std::ptr::copy_nonoverlapping(image.as_ptr(), aligned.as_mut_ptr() as *mut u8, image.len()) };
        let mut m = std::ptr::null_mut();
        unsafe { check(sys::cuModuleLoadData(&mut m, aligned.as_ptr() as *const c_void))? };
        // The driver keeps module variables in memory of its own and cannot list them: find
        // their names in the image and ask for each.
        let variables = crate::module_vars::variable_names(image)
            .into_iter()
            .filter_map(|name| {
                let (addr, size) = self.module_global(m as Raw, &name).ok()?;
                Some((name, addr, size))
            })
            .collect();
        Ok(LoadedModule { raw: m as Raw, variables })
    }

    fn module_unload(&self, module: Raw) -> Result<(), CudaError> {
        unsafe { check(sys::cuModuleUnload(module as sys::CUmodule)) }
    }

    fn module_function(&self, module: Raw, name: &str) -> Result<Raw, CudaError> {
        let name = CString::new(name).map_err(|_| CudaError::InvalidValue)?;
        let mut f = std::ptr::null_mut();
        unsafe { check(sys::cuModuleGetFunction(&mut f, module as sys::CUmodule, name.as_ptr()))? };
        Ok(f as Raw)
    }

    fn module_global(&self, module: Raw, name: &str) -> Result<(u64, u64), CudaError> {
        let name = CString::new(name).map_err(|_| CudaError::InvalidValue)?;
        let (mut ptr, mut size) = (0u64, 0usize);
        unsafe { check(sys::cuModuleGetGlobal_v2(&mut ptr, &mut size, module as sys::CUmodule, name.as_ptr()))? };
        Ok((ptr, size as u64))
    }

    fn launch(
        &self,
        function: Raw,
        grid: Dim3,
        block: Dim3,
        shared_mem: u32,
        stream: StreamRef,
        params: &[u8],
        _memory: &MemoryView<'_>,
        _printed: &mut Vec<u8>,
        measure: bool,
        cooperative: bool,
    ) -> Result<(), CudaError> {
        let mut size = params.len();
        // CU_LAUNCH_PARAM_BUFFER_POINTER, buffer, CU_LAUNCH_PARAM_BUFFER_SIZE, &size, CU_LAUNCH_PARAM_END
        let mut extra: [*mut c_void; 5] = [
            std::ptr::without_provenance_mut(1),
            params.as_ptr() as *mut c_void,
            std::ptr::without_provenance_mut(2),
            &mut size as *mut usize as *mut c_void,
            std::ptr::null_mut(),
        ];
        let device = BOUND.with(|b| b.get());
        let timing = self.timer.lock().unwrap().begin(device, measure);
        let h = stream_handle(stream);
        if let Some((start, _)) = timing.pair {
            unsafe { sys::cuEventRecord(start, h) };
        }
        let r = if cooperative {
            // cuLaunchCooperativeKernel takes no packed buffer; cuLaunchKernelEx does.
            let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
            attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
            attr.value.cooperative = 1;
            let config = sys::CUlaunchConfig {
                gridDimX: grid.x,
                gridDimY: grid.y,
                gridDimZ: grid.z,
                blockDimX: block.x,
                blockDimY: block.y,
                blockDimZ: block.z,
                sharedMemBytes: shared_mem,
                hStream: h,
                attrs: &mut attr,
                numAttrs: 1,
            };
            unsafe {
                check(sys::cuLaunchKernelEx(
                    &config,
                    function as sys::CUfunction,
                    std::ptr::null_mut(),
                    extra.as_mut_ptr(),
                ))
            }
        } else {
            unsafe {
                check(sys::cuLaunchKernel(
                    function as sys::CUfunction,
                    grid.x,
                    grid.y,
                    grid.z,
                    block.x,
                    block.y,
                    block.z,
                    shared_mem,
                    h,
                    std::ptr::null_mut(),
                    extra.as_mut_ptr(),
                ))
            }
        };
        if timing.pair.is_some() || r.is_err() || timing.count.timed {
            let mut timer = self.timer.lock().unwrap();
            match timing.pair {
                Some(pair) if r.is_ok() && unsafe { sys::cuEventRecord(pair.1, h) } == sys::CUresult::CUDA_SUCCESS => {
                    timer.recorded(device, pair, timing.count.weight, launch_shape(function, grid, block, shared_mem));
                }
                pair => {
                    if let Some(pair) = pair {
                        timer.give_back(device, pair);
                    }
                    if r.is_err() {
                        timer.sampler.abandon(&timing.count);
                        if !timing.count.timed {
                            timer.kernels -= timing.count.weight;
                        }
                    } else if timing.count.timed {
                        // Launched but not timed (no events to be had): counted, without a time.
                        timer.kernels += 1;
                    }
                }
            }
        }
        r
    }

    fn device_time(&self) -> (u64, u64) {
        let mut timer = self.timer.lock().unwrap();
        timer.harvest_if_due();
        (timer.total_ns, timer.kernels)
    }

    fn measuring(&self) -> bool {
        !self.timer.lock().unwrap().pending.is_empty()
    }
}

#[cfg(test)]
mod timing_tests {
    use super::*;

    #[test]
    fn launches_are_sampled_by_count_and_by_time() {
        let t0 = Instant::now();
        let at = |us: u64| move || t0 + Duration::from_micros(us);
        let untimed = Count { timed: false, weight: 1 };
        let mut s = Sampler::new(16, Some(Duration::from_millis(1)));
        // The first launch is timed; within the gap, one in 16, standing for those before.
        assert_eq!(s.next(false, at(0)), Count { timed: true, weight: 1 });
        for i in 1..16 {
            assert_eq!(s.next(false, at(i)), untimed);
        }
        assert_eq!(s.next(false, at(16)), Count { timed: true, weight: 16 });
        // Long kernels: the clock is looked at every eighth untimed launch, and a launch a
        // gap after the last timed one is timed.
        for i in 0..7 {
            assert_eq!(s.next(false, at(2_000 + i)), untimed, "launch {i}");
        }
        assert_eq!(s.next(false, at(2_100)), Count { timed: true, weight: 8 });
        // A policy is loaded: every launch timed, standing for itself and any untimed before.
        assert_eq!(s.next(false, at(2_101)), untimed);
        assert_eq!(s.next(true, at(2_102)), Count { timed: true, weight: 2 });
        assert_eq!(s.next(true, at(2_103)), Count { timed: true, weight: 1 });
        // A launch that fails gives back what it stood for.
        assert_eq!(s.next(false, at(2_104)), untimed);
        let c = s.next(false, at(2_105));
        s.abandon(&c);
        assert_eq!(s.untimed, 1);
        let c = s.next(true, at(2_106));
        assert_eq!(c, Count { timed: true, weight: 2 });
        s.abandon(&c);
        assert_eq!(s.untimed, 1);
        // PHOS_TIME_KERNELS=0: nothing timed or counted but what the router asks for.
        let mut s = Sampler::new(0, Some(Duration::from_millis(1)));
        assert_eq!(s.next(false, at(0)), Count { timed: false, weight: 0 });
        assert_eq!(s.next(true, at(1)), Count { timed: true, weight: 1 });
    }

    #[test]
    fn a_kernel_is_charged_its_shapes_recent_shortest_time() {
        for ratio in [100, 200] {
            let mut m = ShapeMinimum { current: u64::MAX, previous: u64::MAX, samples: 0 };
            assert_eq!(m.charge(100, ratio), 100);
            // Interrupted by another context's time slice: charged what the shape takes alone.
            assert_eq!(m.charge(2_100, ratio), 100);
            assert_eq!(m.charge(90, ratio), 90);
            // Within the ratio, charged as measured; past it, the shortest.
            assert_eq!(m.charge(120, ratio), if ratio == 100 { 90 } else { 120 });
            // The work grows: after two windows the old minimum is forgotten.
            for _ in 0..2 * SHAPE_WINDOW {
                m.charge(500, ratio);
            }
            assert_eq!(m.charge(500, ratio), 500);
        }
    }
}
