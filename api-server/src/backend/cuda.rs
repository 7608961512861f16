//! The `cuda` backend: a real GPU through the CUDA driver API, loaded at run time through
//! `cudarc`'s dynamic loading (no libcudart on the server, no link-time dependency on CUDA).
//!
//! Each device is used through its primary context; every channel thread makes the calling
//! device's context current before it runs a call. Device memory is mapped with the virtual
//! memory management API (`cuMemCreate` + `cuMemMap` into a range reserved with
//! `cuMemAddressReserve` at a fixed address), so allocations land at the addresses the
//! session's allocator chose.
//!
//! Calls go through `cudarc`'s typed layer (`cudarc::driver::result`: a Rust signature per
//! driver call, failures as `DriverError`) wherever it has the call Phos makes. Raw `sys`
//! calls remain where it does not, each group said where it is: the virtual memory management
//! API (reserve, create, map, set access), host memory registration, peer access, stream
//! queries, 2D copies and sets, launches with a packed parameter buffer (the typed
//! `launch_kernel` takes an argument array), copies of the guest's pinned memory (memory the
//! guest writes meanwhile, which no Rust slice may stand for), the driver version, and every
//! call whose enum or flag argument comes from a guest ([`RawDriver`], `cuEventCreate`): a
//! value outside the bindings' Rust enum would be undefined behaviour in a typed signature,
//! where the driver itself answers it with an error. The `safe` layer is not used: it owns
//! its streams, events and modules and destroys them with their Rust values, while the server
//! keeps raw handles in its registries and destroys them when the guest says so.

use std::cell::Cell;
use std::collections::HashMap;
use std::ffi::{CStr, CString, c_void};
use std::time::{Duration, Instant};

use cudarc::driver::result::{self, DriverError};
use cudarc::driver::sys;
use parking_lot::Mutex;
use phos_protocol::CudaError;
use phos_protocol::types::{DeviceProperties, Dim3, FuncAttributes};

use super::prelude::*;
use super::{Copy2D, Gate, LoadedModule, Physical, Raw, StreamRef};
use crate::registry::memory::MemoryView;

/// Attributes are queried up to this number (CUDA 13 defines about 150).
const MAX_ATTRIBUTE: i32 = 160;

/// A raw driver call's result.
pub(super) fn check(r: sys::CUresult) -> Result<(), CudaError> {
    r.result().map_err(driver)
}

/// The runtime's error for a driver error: driver and runtime error codes share their numbers
/// for everything the server calls.
pub(super) fn driver(e: DriverError) -> CudaError {
    CudaError(e.0 as i32)
}

/// Why the `cuda` backend cannot be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("no CUDA driver (libcuda.so) on this machine")]
    NoDriver,
    #[error("the CUDA driver reports no GPU")]
    NoGpu,
    #[error("{call}: {error}")]
    Driver { call: &'static str, error: CudaError },
    #[error("the CUDA driver lacks {0}")]
    Missing(&'static str),
    #[error(
        "the libcuda.so.1 found here is Phos's guest library, not NVIDIA's driver (is LD_LIBRARY_PATH set to a \
         directory of guest library links for the server?)"
    )]
    GuestLibrary,
}

impl OpenError {
    fn driver(call: &'static str) -> impl FnOnce(DriverError) -> OpenError {
        move |e| OpenError::Driver { call, error: driver(e) }
    }
}

pub(super) struct Device {
    ordinal: i32,
    ctx: sys::CUcontext,
    granularity: u64,
    properties: DeviceProperties,
}

// SAFETY: a device's context is a driver handle, usable from any thread (each binds it before
// use); the rest is plain data, never changed after the backend is opened.
unsafe impl Send for Device {}
// SAFETY: as above: nothing in a device changes once it is set up.
unsafe impl Sync for Device {}

pub struct CudaBackend {
    devices: Vec<Device>,
    driver_version: i32,
    raw: RawDriver,
    /// NVIDIA's libcublas, loaded at the first cuBLAS call (`None` when none is found).
    cublas: std::sync::OnceLock<Option<super::vendor::Cublas>>,
    /// NVIDIA's libcurand, loaded at the first cuRAND call (`None` when none is found).
    curand: std::sync::OnceLock<Option<super::vendor_curand::Curand>>,
    /// NVIDIA's libcusolver, loaded at the first cuSOLVER call (`None` when none is found).
    cusolver: std::sync::OnceLock<Option<super::vendor::Cusolver>>,
    /// NVIDIA's libcudnn, loaded at the first cuDNN call (`None` when none is found).
    cudnn: std::sync::OnceLock<Option<super::vendor_cudnn::Cudnn>>,
    /// NVIDIA's libcusparse, loaded at the first cuSPARSE call (`None` when none is found).
    cusparse: std::sync::OnceLock<Option<super::vendor_cusparse::Cusparse>>,
    /// NVIDIA's libcublasLt, loaded at the first cuBLASLt call (`None` when none is found).
    cublaslt: std::sync::OnceLock<Option<super::vendor_lt::CublasLt>>,
    /// NVIDIA's NVML, loaded at the first NVML query (`None` when none is found).
    nvml: std::sync::OnceLock<Option<super::vendor_nvml::Nvml>>,
    /// NVIDIA's libcufft, loaded at the first cuFFT call (`None` when none is found).
    cufft: std::sync::OnceLock<Option<super::vendor_cufft::Cufft>>,
    /// `cuDeviceGetAttribute`, called with plain integers: attributes come from guests and
    /// may not be valid enumerators of the bindings' Rust enum.
    get_attribute: unsafe extern "C" fn(*mut i32, i32, sys::CUdevice) -> i32,
    timer: Mutex<KernelTimer>,
    /// The C/R engine's page-locked buffers and copy lanes, made once.
    copies: super::copy_pool::CopyPool,
    /// NVIDIA's nvJitLink, for the checked twins, looked for the first time one is compiled.
    jit_link: std::sync::OnceLock<Option<super::jit_link::JitLink>>,
    /// The hash kernel of each device, for recopies' exact passes ([`super::cuda_hash`]).
    hashers: super::cuda_hash::Hashers,
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

// SAFETY: its raw parts are CUevent handles, driver handles usable from any thread; the timer
// is only used under its mutex.
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
        let start = result::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT).ok()?;
        match result::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT) {
            Ok(end) => Some((start, end)),
            Err(_) => {
                // SAFETY: `start` was just created and is used nowhere else.
                let _ = unsafe { result::event::destroy(start) };
                None
            }
        }
    }

    fn recorded(&mut self, device: i32, pair: (sys::CUevent, sys::CUevent), weight: u64, shape: u64) {
        self.pending.push_back((device, pair.0, pair.1, weight, shape));
        if self.pending.len() > MAX_PENDING_TIMINGS
            && let Some(&(_, _, end, _, _)) = self.pending.front()
        {
            // SAFETY: a live event of this timer's (pending pairs are destroyed never, reused).
            let _ = unsafe { result::event::synchronize(end) };
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
            // SAFETY: `start` and `end` are live events of this timer's, both recorded.
            let done = unsafe { result::event::query(end) };
            if done == Err(DriverError(sys::CUresult::CUDA_ERROR_NOT_READY)) {
                break;
            }
            self.pending.pop_front();
            // SAFETY: as above.
            if let Some(ms) = done.ok().and_then(|()| unsafe { result::event::elapsed(start, end) }.ok()) {
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
        // SAFETY: only looks for the library.
        unsafe { sys::is_culib_present() }
    }

    /// Number of GPUs, or why there are none usable.
    pub fn probe() -> Result<i32, OpenError> {
        if !Self::driver_present() {
            return Err(OpenError::NoDriver);
        }
        // SAFETY: the driver's library (present, checked above), loaded once for the
        // process's life; loading runs its initialisers, which is what using the driver means.
        let library = unsafe { sys::culib() };
        // SAFETY: looking a symbol up runs none of the library's code.
        let runtime_export = unsafe { library.get::<unsafe extern "C" fn()>(b"cudaMalloc\0") }.is_ok();
        if runtime_export {
            // Phos's guest library exports both APIs; NVIDIA's driver has no runtime functions.
            return Err(OpenError::GuestLibrary);
        }
        result::init().map_err(OpenError::driver("cuInit"))?;
        result::device::get_count().map_err(OpenError::driver("cuDeviceGetCount"))
    }

    pub fn new() -> Result<Self, OpenError> {
        let count = Self::probe()?;
        if count == 0 {
            return Err(OpenError::NoGpu);
        }
        // SAFETY: the driver's library, loaded by `probe` above and kept for the process's life.
        let library = unsafe { sys::culib() };
        // SAFETY: the symbol is `cuDeviceGetAttribute`, whose C signature this is (with the
        // attribute as a plain integer, see `RawDriver`); the library stays loaded for the
        // process's life, so the function pointer stays good.
        let get_attribute = *unsafe {
            library.get::<unsafe extern "C" fn(*mut i32, i32, sys::CUdevice) -> i32>(b"cuDeviceGetAttribute\0")
        }
        .map_err(|_| OpenError::Missing("cuDeviceGetAttribute"))?;
        // Raw: the typed layer has no cuDriverGetVersion.
        let mut driver_version = 0;
        // SAFETY: writes one int.
        check(unsafe { sys::cuDriverGetVersion(&mut driver_version) })
            .map_err(|error| OpenError::Driver { call: "cuDriverGetVersion", error })?;
        let mut devices = Vec::new();
        for ordinal in 0..count {
            let dev = result::device::get(ordinal).map_err(OpenError::driver("cuDeviceGet"))?;
            // SAFETY: a device the driver just named. The primary context is kept for the
            // server's life (never released).
            let ctx =
                unsafe { result::primary_ctx::retain(dev) }.map_err(OpenError::driver("cuDevicePrimaryCtxRetain"))?;
            // SAFETY: a context the driver just retained.
            unsafe { result::ctx::set_current(ctx) }.map_err(OpenError::driver("cuCtxSetCurrent"))?;
            // Raw: the typed layer has no virtual memory management.
            let prop = allocation_prop(ordinal);
            let mut gran = 0usize;
            // SAFETY: `prop` describes pinned memory of this device; writes one size.
            check(unsafe {
                sys::cuMemGetAllocationGranularity(
                    &mut gran,
                    &prop,
                    sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_RECOMMENDED,
                )
            })
            .map_err(|error| OpenError::Driver { call: "cuMemGetAllocationGranularity", error })?;
            let properties = query_properties(get_attribute, dev)?;
            devices.push(Device { ordinal, ctx, granularity: gran as u64, properties });
        }
        BOUND.with(|b| b.set(count - 1));
        let timer = Mutex::new(KernelTimer::new(devices.len()));
        let raw = RawDriver::load()?;
        Ok(CudaBackend {
            cudnn: std::sync::OnceLock::new(),
            devices,
            driver_version,
            raw,
            cublas: std::sync::OnceLock::new(),
            curand: std::sync::OnceLock::new(),
            cusolver: std::sync::OnceLock::new(),
            cusparse: std::sync::OnceLock::new(),
            cublaslt: std::sync::OnceLock::new(),
            cufft: std::sync::OnceLock::new(),
            nvml: std::sync::OnceLock::new(),
            get_attribute,
            timer,
            copies: Default::default(),
            jit_link: std::sync::OnceLock::new(),
            hashers: Default::default(),
        })
    }

    pub(super) fn device(&self, device: i32) -> Result<&Device, CudaError> {
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
    fn load() -> Result<Self, OpenError> {
        fn get<T: Copy>(name: &str) -> Option<T> {
            let mut sym = name.as_bytes().to_vec();
            sym.push(0);
            // SAFETY: the driver's library, loaded (`probe`) before a backend is made, and kept
            // for the process's life.
            let library = unsafe { sys::culib() };
            // SAFETY: each field's type below is the C signature of the symbol of its name
            // (enums as plain integers); the library stays loaded, so the pointer stays good.
            unsafe { library.get::<T>(sym.as_slice()) }.ok().map(|f| *f)
        }
        macro_rules! need {
            ($name:literal) => {
                get($name).ok_or(OpenError::Missing($name))?
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
    // SAFETY: a plain C struct whose zero value is valid (its enums have zero variants).
    let mut prop: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
    prop.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = ordinal;
    prop
}

fn query_properties(
    get_attribute: unsafe extern "C" fn(*mut i32, i32, sys::CUdevice) -> i32,
    dev: sys::CUdevice,
) -> Result<DeviceProperties, OpenError> {
    // Raw: `cudaDeviceProp` holds 256 bytes of name, the typed `get_name` 128.
    let mut name = [0 as std::ffi::c_char; 256];
    // SAFETY: the driver writes at most 256 bytes, NUL-terminated.
    check(unsafe { sys::cuDeviceGetName(name.as_mut_ptr(), 256, dev) })
        .map_err(|error| OpenError::Driver { call: "cuDeviceGetName", error })?;
    // SAFETY: NUL-terminated by the driver, inside the buffer.
    let name = unsafe { CStr::from_ptr(name.as_ptr()) }.to_string_lossy().into_owned();
    // SAFETY: `dev` is a device the driver named.
    let total = unsafe { result::device::total_mem(dev) }.map_err(OpenError::driver("cuDeviceTotalMem"))?;
    let uuid = result::device::get_uuid(dev).map_err(OpenError::driver("cuDeviceGetUuid"))?;
    let mut attributes = vec![0i32; MAX_ATTRIBUTE as usize + 1];
    for (a, slot) in attributes.iter_mut().enumerate().skip(1) {
        let mut v = 0;
        // Attributes this driver does not know answer an error: they stay 0.
        // SAFETY: writes one int; any attribute number is answered (an unknown one with an
        // error).
        if unsafe { get_attribute(&mut v, a as i32, dev) } == 0 {
            *slot = v;
        }
    }
    super::set_managed_memory_attributes(&mut attributes);
    Ok(DeviceProperties {
        name,
        uuid: uuid.bytes.map(|b| b as u8),
        luid: [0; 8],
        luid_device_node_mask: 0,
        total_global_mem: total as u64,
        attributes,
    })
}

pub(super) fn stream_handle(s: StreamRef) -> sys::CUstream {
    s.cu_stream() as sys::CUstream
}

impl Devices for CudaBackend {
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
        let dev = result::device::get(self.device(device)?.ordinal).map_err(driver)?;
        if let Some(v) = super::managed_memory_attribute(attribute) {
            return Ok(v);
        }
        let mut v = 0;
        // SAFETY: writes one int; a guest's attribute number the driver does not know is
        // answered with an error (hence the raw call: see `RawDriver`).
        let r = unsafe { (self.get_attribute)(&mut v, attribute, dev) };
        if r != 0 { Err(CudaError(r)) } else { Ok(v) }
    }

    fn driver_version(&self) -> i32 {
        self.driver_version
    }

    fn mem_info(&self, device: i32) -> Result<(u64, u64), CudaError> {
        self.bind(device)?;
        let (free, total) = result::mem_get_info().map_err(driver)?;
        Ok((free as u64, total as u64))
    }

    fn bind(&self, device: i32) -> Result<(), CudaError> {
        if BOUND.with(|b| b.get()) == device {
            return Ok(());
        }
        let d = self.device(device)?;
        // SAFETY: a primary context retained for the server's life.
        unsafe { result::ctx::set_current(d.ctx) }.map_err(driver)?;
        BOUND.with(|b| b.set(device));
        Ok(())
    }

    fn device_synchronize(&self, device: i32) -> Result<(), CudaError> {
        self.bind(device)?;
        result::ctx::synchronize().map_err(driver)
    }

    // Limits, cache and shared memory configuration: raw (`RawDriver`), their enums come
    // from guests.
    fn limit(&self, device: i32, limit: i32) -> Result<u64, CudaError> {
        self.bind(device)?;
        let mut v = 0usize;
        // SAFETY: `RawDriver`'s functions have these C signatures, and take any integer for
        // their enum arguments (answering an unknown one with an error; so do the raw calls
        // below); this one writes one size.
        check_raw(unsafe { (self.raw.ctx_get_limit)(&mut v, limit) })?;
        Ok(v as u64)
    }

    fn set_limit(&self, device: i32, limit: i32, value: u64) -> Result<(), CudaError> {
        self.bind(device)?;
        // SAFETY: as in `limit`; acts on the current context only.
        check_raw(unsafe { (self.raw.ctx_set_limit)(limit, value as usize) })
    }

    fn cache_config(&self, device: i32) -> Result<i32, CudaError> {
        self.bind(device)?;
        let mut v = 0;
        // SAFETY: as in `limit`; writes one int.
        check_raw(unsafe { (self.raw.ctx_get_cache_config)(&mut v) })?;
        Ok(v)
    }

    fn set_cache_config(&self, device: i32, config: i32) -> Result<(), CudaError> {
        self.bind(device)?;
        // SAFETY: as in `limit`; acts on the current context only.
        check_raw(unsafe { (self.raw.ctx_set_cache_config)(config) })
    }

    fn shared_mem_config(&self, device: i32) -> Result<i32, CudaError> {
        self.bind(device)?;
        let Some(get) = self.raw.ctx_get_shared_mem_config else {
            return Ok(1); // four-byte banks, the only size of current GPUs
        };
        let mut v = 0;
        // SAFETY: as in `limit`; writes one int.
        check_raw(unsafe { get(&mut v) })?;
        Ok(v)
    }

    fn set_shared_mem_config(&self, device: i32, config: i32) -> Result<(), CudaError> {
        self.bind(device)?;
        match self.raw.ctx_set_shared_mem_config {
            // SAFETY: as in `limit`; acts on the current context only.
            Some(set) => check_raw(unsafe { set(config) }),
            None => Ok(()),
        }
    }

    fn stream_priority_range(&self, device: i32) -> Result<(i32, i32), CudaError> {
        self.bind(device)?;
        result::stream::get_priority_range().map_err(driver)
    }

    fn can_access_peer(&self, device: i32, peer: i32) -> Result<bool, CudaError> {
        let (d, p) = (self.device(device)?.ordinal, self.device(peer)?.ordinal);
        let mut can = 0;
        // Raw: the typed layer has no peer access (nor the persisting L2 reset below).
        // SAFETY: writes one int.
        check(unsafe { sys::cuDeviceCanAccessPeer(&mut can, d, p) })?;
        Ok(can != 0)
    }

    fn enable_peer_access(&self, device: i32, peer: i32) -> Result<(), CudaError> {
        let peer_ctx = self.device(peer)?.ctx;
        self.bind(device)?;
        // SAFETY: both contexts are primary contexts kept for the server's life.
        check(unsafe { sys::cuCtxEnablePeerAccess(peer_ctx, 0) })
    }

    fn disable_peer_access(&self, device: i32, peer: i32) -> Result<(), CudaError> {
        let peer_ctx = self.device(peer)?.ctx;
        self.bind(device)?;
        // SAFETY: as above.
        check(unsafe { sys::cuCtxDisablePeerAccess(peer_ctx) })
    }

    fn reset_persisting_l2_cache(&self, device: i32) -> Result<(), CudaError> {
        self.bind(device)?;
        // SAFETY: acts on the current context only.
        check(unsafe { sys::cuCtxResetPersistingL2Cache() })
    }

    fn exec_affinity_support(&self, device: i32, kind: i32) -> Result<i32, CudaError> {
        let kind = match kind {
            0 => sys::CUexecAffinityType::CU_EXEC_AFFINITY_TYPE_SM_COUNT,
            _ => return Err(CudaError::InvalidValue),
        };
        let dev = result::device::get(self.device(device)?.ordinal).map_err(driver)?;
        let mut value = 0;
        // SAFETY: `value` is a writable int; `dev` one of the driver's devices.
        check(unsafe { sys::cuDeviceGetExecAffinitySupport(&mut value, kind, dev) })?;
        Ok(value)
    }

    fn flush_rdma_writes(&self, device: i32, target: i32, scope: i32) -> Result<(), CudaError> {
        use sys::CUflushGPUDirectRDMAWritesScope as Scope;
        let target = match target {
            0 => sys::CUflushGPUDirectRDMAWritesTarget::CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TARGET_CURRENT_CTX,
            _ => return Err(CudaError::InvalidValue),
        };
        let scope = match scope {
            100 => Scope::CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TO_OWNER,
            200 => Scope::CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TO_ALL_DEVICES,
            _ => return Err(CudaError::InvalidValue),
        };
        self.bind(device)?;
        // SAFETY: acts on the current context only.
        check(unsafe { sys::cuFlushGPUDirectRDMAWrites(target, scope) })
    }
}

// Raw throughout: the typed layer has no virtual memory management.
impl VirtualMemory for CudaBackend {
    fn reserve(&self, base: u64, size: u64) -> Result<(), CudaError> {
        let mut got: sys::CUdeviceptr = 0;
        let align = self.devices.iter().map(|d| d.granularity).max().unwrap_or(2 << 20);
        // SAFETY: writes one address; reserves address space only.
        check(unsafe { sys::cuMemAddressReserve(&mut got, size as usize, align as usize, base, 0) })?;
        if got != base {
            // The driver treats the address as a hint; pointers would not be stable.
            // SAFETY: the range the driver just reserved, nothing mapped in it.
            unsafe {
                sys::cuMemAddressFree(got, size as usize);
            }
            tracing::error!("device address range {base:#x} is taken (the driver offered {got:#x})");
            return Err(CudaError::MemoryAllocation);
        }
        Ok(())
    }

    fn unreserve(&self, base: u64, size: u64) {
        // SAFETY: the session's reservation, everything in it unmapped already.
        if let Err(e) = check(unsafe { sys::cuMemAddressFree(base, size as usize) }) {
            tracing::warn!("giving back the device address range {base:#x}+{size:#x}: {e:?}");
        }
    }

    fn granularity(&self, device: i32) -> u64 {
        self.device(device).map(|d| d.granularity).unwrap_or(2 << 20)
    }

    fn map(&self, device: i32, addr: u64, size: u64) -> Result<Physical, CudaError> {
        let d = self.device(device)?;
        let prop = allocation_prop(d.ordinal);
        let mut handle: sys::CUmemGenericAllocationHandle = 0;
        // `[addr, addr + size)` is a free, granularity-aligned part of the session's
        // reservation (the address space decided); each step is undone if a later one fails.
        // Exportable as a file (IPC between sessions of a tenant), where the device can.
        let mut shareable = prop;
        shareable.requestedHandleTypes = sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
        // SAFETY: writes the new handle into `handle`; reads `shareable`.
        if unsafe { sys::cuMemCreate(&mut handle, size as usize, &shareable, 0) } != sys::CUresult::CUDA_SUCCESS {
            // SAFETY: as above, with `prop`.
            check(unsafe { sys::cuMemCreate(&mut handle, size as usize, &prop, 0) })?;
        }
        // SAFETY: maps the new memory into the free range just described.
        if let Err(e) = check(unsafe { sys::cuMemMap(addr, size as usize, 0, handle, 0) }) {
            // SAFETY: the handle just made, used by nothing.
            unsafe { sys::cuMemRelease(handle) };
            return Err(e);
        }
        // SAFETY: all zeros is a valid access descriptor (filled in below).
        let mut access: sys::CUmemAccessDesc = unsafe { std::mem::zeroed() };
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
        // SAFETY: reads `descs.len()` descriptors of `descs`; the range was just mapped.
        let r = unsafe { sys::cuMemSetAccess(addr, size as usize, descs.as_ptr(), descs.len()) };
        let r = if r != sys::CUresult::CUDA_SUCCESS && descs.len() > 1 {
            // Without peer access between the GPUs, only the owner maps it.
            // SAFETY: as above, with the one descriptor `access`.
            unsafe { sys::cuMemSetAccess(addr, size as usize, &access, 1) }
        } else {
            r
        };
        if let Err(e) = check(r) {
            // SAFETY: the range mapped above, which nothing uses yet.
            unsafe { sys::cuMemUnmap(addr, size as usize) };
            // SAFETY: the handle made above, now unmapped.
            unsafe { sys::cuMemRelease(handle) };
            return Err(e);
        }
        Ok(handle)
    }

    fn unmap(&self, addr: u64, size: u64, physical: Physical) -> Result<(), CudaError> {
        // SAFETY: a range `map` mapped with this handle, nothing of the session's using it now.
        check(unsafe { sys::cuMemUnmap(addr, size as usize) })?;
        // SAFETY: the handle of that range, unmapped just now.
        check(unsafe { sys::cuMemRelease(physical) })
    }

    fn export_block(&self, _addr: u64, _len: u64, physical: Physical) -> Result<std::os::fd::OwnedFd, CudaError> {
        use std::os::fd::FromRawFd;
        let mut fd: libc::c_int = -1;
        // SAFETY: writes one descriptor into `fd`; `physical` is the live handle of a block
        // of the session's (the caller holds the map's lock).
        let r = unsafe {
            sys::cuMemExportToShareableHandle(
                (&mut fd as *mut libc::c_int).cast(),
                physical,
                sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                0,
            )
        };
        if r != sys::CUresult::CUDA_SUCCESS || fd < 0 {
            tracing::warn!("exporting a block for IPC: {r:?}");
            return Err(CudaError::MapBufferObjectFailed);
        }
        // SAFETY: a descriptor the driver just opened for us, owned by nothing else.
        Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
    }

    fn import_block(
        &self,
        device: i32,
        file: &std::os::fd::OwnedFd,
        addr: u64,
        len: u64,
    ) -> Result<Physical, CudaError> {
        use std::os::fd::AsRawFd;
        let d = self.device(device)?;
        let mut handle: sys::CUmemGenericAllocationHandle = 0;
        // SAFETY: writes one handle; the driver reads the descriptor (passed by value, as
        // its POSIX handle type wants) and does not take it.
        let r = unsafe {
            sys::cuMemImportFromShareableHandle(
                &mut handle,
                file.as_raw_fd() as usize as *mut c_void,
                sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
            )
        };
        if r != sys::CUresult::CUDA_SUCCESS {
            tracing::warn!("opening an exported block: {r:?}");
            return Err(CudaError::MapBufferObjectFailed);
        }
        // SAFETY: maps the imported memory into a free, aligned range of the reservation.
        if unsafe { sys::cuMemMap(addr, len as usize, 0, handle, 0) } != sys::CUresult::CUDA_SUCCESS {
            // SAFETY: the handle just imported, used by nothing.
            unsafe { sys::cuMemRelease(handle) };
            return Err(CudaError::MapBufferObjectFailed);
        }
        // SAFETY: all zeros is a valid access descriptor (filled in below).
        let mut access: sys::CUmemAccessDesc = unsafe { std::mem::zeroed() };
        access.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
        access.location.id = d.ordinal;
        access.flags = sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        // SAFETY: reads one descriptor; the range was just mapped.
        if unsafe { sys::cuMemSetAccess(addr, len as usize, &access, 1) } != sys::CUresult::CUDA_SUCCESS {
            // SAFETY: the range mapped above, which nothing uses yet.
            unsafe { sys::cuMemUnmap(addr, len as usize) };
            // SAFETY: the handle imported above, now unmapped.
            unsafe { sys::cuMemRelease(handle) };
            return Err(CudaError::MapBufferObjectFailed);
        }
        Ok(handle)
    }
}

impl Copies for CudaBackend {
    fn prepare_hashing(&self, device: i32) -> Result<(), CudaError> {
        self.hashers.prepare(self, device)
    }

    fn hash_blocks(&self, device: i32, blocks: &[(u64, u64)]) -> Result<Vec<u64>, CudaError> {
        self.hashers.hash(self, device, blocks)
    }

    fn memcpy_htod(&self, dst: u64, src: &[u8], stream: Option<StreamRef>) -> Result<(), CudaError> {
        let r = match stream {
            // SAFETY: the service checked `[dst, dst + len)` against the session's memory.
            None => unsafe { result::memcpy_htod_sync(dst, src) },
            // SAFETY: as above; `src` outlives the copy: it is the request's data, and the
            // caller synchronises before it is reused (the driver stages pageable memory
            // before it returns).
            Some(s) => unsafe { result::memcpy_htod_async(dst, src, stream_handle(s)) },
        };
        r.map_err(driver)
    }

    fn memcpy_dtoh(&self, dst: &mut [u8], src: u64, stream: Option<StreamRef>) -> Result<(), CudaError> {
        match stream {
            // SAFETY: the service checked `[src, src + len)`; `dst` is written before this
            // returns.
            None => unsafe { result::memcpy_dtoh_sync(dst, src) }.map_err(driver),
            Some(s) => {
                // The reply carries the data, so the copy must be finished before it is sent.
                let h = stream_handle(s);
                // SAFETY: the service checked `[src, src + len)`; `dst` stays borrowed until the
                // stream is synchronised below (a copy that failed to queue writes nothing).
                unsafe { result::memcpy_dtoh_async(dst, src, h) }.map_err(driver)?;
                // SAFETY: a live stream of the session's, or a special one.
                unsafe { result::stream::synchronize(h) }.map_err(driver)
            }
        }
    }

    fn memcpy_dtod(&self, dst: u64, src: u64, len: u64, stream: Option<StreamRef>) -> Result<(), CudaError> {
        let r = match stream {
            // SAFETY: the service checked both ranges against the session's memory.
            None => unsafe { result::memcpy_dtod_sync(dst, src, len as usize) },
            // SAFETY: as above; the stream is live (or a special one).
            Some(s) => unsafe { result::memcpy_dtod_async(dst, src, len as usize, stream_handle(s)) },
        };
        r.map_err(driver)
    }

    fn memset(&self, dst: u64, value: u8, len: u64, stream: Option<StreamRef>) -> Result<(), CudaError> {
        let r = match stream {
            // SAFETY: the service checked `[dst, dst + len)` against the session's memory.
            None => unsafe { result::memset_d8_sync(dst, value, len as usize) },
            // SAFETY: as above; the stream is live (or a special one).
            Some(s) => unsafe { result::memset_d8_async(dst, value, len as usize, stream_handle(s)) },
        };
        r.map_err(driver)
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
        // Raw: the typed layer has no 2D copies.
        match stream {
            // SAFETY: the service checked every row of both sides; a host side is a buffer of
            // `width * height` bytes, borrowed until the copy is done.
            None => check(unsafe { sys::cuMemcpy2DUnaligned_v2(&p) }),
            Some(s) => {
                let h = stream_handle(s);
                // SAFETY: as above; a host side stays borrowed until the stream is
                // synchronised below.
                check(unsafe { sys::cuMemcpy2DAsync_v2(&p, h) })?;
                // A host side is the request's or the reply's buffer: done before either goes.
                if reply_wait || p.srcMemoryType == host {
                    // SAFETY: a live stream of the session's, or a special one.
                    unsafe { result::stream::synchronize(h) }.map_err(driver)
                } else {
                    Ok(())
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
        // Raw: the typed layer has no 2D sets.
        check(match stream {
            // SAFETY: the service checked every row against the session's memory.
            None => unsafe { sys::cuMemsetD2D8_v2(dst, pitch, value, width, height) },
            // SAFETY: as above; the stream is live (or a special one).
            Some(s) => unsafe { sys::cuMemsetD2D8Async(dst, pitch, value, width, height, stream_handle(s)) },
        })
    }
}

// Raw throughout: the typed layer has no host memory registration, and a pinned copy's host
// side is the guest's memory, which the guest writes meanwhile: no Rust slice may stand for it.
impl HostMemory for CudaBackend {
    fn pin_host(&self, buf: &mut [u8]) {
        // Registering needs a current context, which a thread that has made no call has not
        // (the driver answers "device uninitialized" and the buffer stays pageable, copies
        // through it at a third of the link's rate): bind one if the thread has none.
        // Portable: page-locked for every device's context, whichever thread copies.
        const PORTABLE: u32 = 0x1;
        if BOUND.with(|b| b.get()) < 0
            && let Err(e) = self.bind(0)
        {
            tracing::warn!("page-locking a copy buffer of {} bytes: no context: {e:?}", buf.len());
            return;
        }
        // SAFETY: the buffer lives until `unpin_host` (its owner unpins it before freeing it).
        let r = check(unsafe { sys::cuMemHostRegister_v2(buf.as_mut_ptr() as *mut c_void, buf.len(), PORTABLE) });
        if let Err(e) = r {
            // Copies through it still work, from pageable memory (slower).
            tracing::warn!("page-locking a copy buffer of {} bytes: {e:?}", buf.len());
        }
    }

    fn copy_pool(&self) -> Option<&super::copy_pool::CopyPool> {
        Some(&self.copies)
    }

    fn unpin_host(&self, buf: &mut [u8]) {
        // As for registering, a context must be current.
        if BOUND.with(|b| b.get()) < 0 {
            let _ = self.bind(0);
        }
        // SAFETY: a buffer `pin_host` was given. One it could not register answers an error
        // here, and nothing else happens.
        let _ = unsafe { sys::cuMemHostUnregister(buf.as_mut_ptr() as *mut c_void) };
    }

    fn pin_shared(&self, addr: u64, len: u64) {
        // As `pin_host`: a context must be current, and the slots are page-locked for every
        // context, whichever thread copies through them.
        const PORTABLE: u32 = 0x1;
        if BOUND.with(|b| b.get()) < 0
            && let Err(e) = self.bind(0)
        {
            tracing::warn!("page-locking a staging region of {len} bytes: no context: {e:?}");
            return;
        }
        // SAFETY: `[addr, addr + len)` is mapped in this process until `unpin_shared` (a
        // staging region's slots, unpinned before the region is dropped); registering it
        // reads and writes none of it.
        let r = check(unsafe { sys::cuMemHostRegister_v2(addr as *mut c_void, len as usize, PORTABLE) });
        if let Err(e) = r {
            // Copies through it still work, from pageable memory (slower).
            tracing::warn!("page-locking a staging region of {len} bytes: {e:?}");
        }
    }

    fn unpin_shared(&self, addr: u64) {
        if BOUND.with(|b| b.get()) < 0 {
            let _ = self.bind(0);
        }
        // SAFETY: a range `pin_shared` was given (one it could not register answers an error
        // here, and nothing else happens).
        let _ = unsafe { sys::cuMemHostUnregister(addr as *mut c_void) };
    }

    fn register_host(&self, addr: u64, len: u64) -> Result<u64, CudaError> {
        // Portable (every context) and mapped (kernels reach it); under unified addressing
        // the device address is the host address.
        const PORTABLE_MAPPED: u32 = 0x1 | 0x2;
        let p = addr as *mut c_void;
        // SAFETY: whole pages of the guest's arena mapped in this process, handed out by the
        // server; registering reads and writes none of them.
        check(unsafe { sys::cuMemHostRegister_v2(p, len as usize, PORTABLE_MAPPED) })?;
        let mut device = 0;
        // SAFETY: writes one device address into `device`; `p` was just registered.
        if let Err(e) = check(unsafe { sys::cuMemHostGetDevicePointer_v2(&mut device, p, 0) }) {
            // SAFETY: the range just registered, which nothing uses yet.
            unsafe { sys::cuMemHostUnregister(p) };
            return Err(e);
        }
        Ok(device)
    }

    fn unregister_host(&self, addr: u64) {
        // SAFETY: a range `register_host` registered.
        if let Err(e) = check(unsafe { sys::cuMemHostUnregister(addr as *mut c_void) }) {
            tracing::warn!("unregistering the pinned memory at {addr:#x}: {e:?}");
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
        // The service checked the device range and that `[host, host + len)` lies in one
        // registered allocation of the mapped arena, which outlives queued copies, or in a
        // staging slot, mapped while its channel lives and synchronised before it is reused;
        // or it is a copy buffer of the C/R engine's, borrowed until the copy is waited for.
        // Only the driver touches the host memory.
        check(match (to_device, stream) {
            // SAFETY: as above.
            (true, None) => unsafe { sys::cuMemcpyHtoD_v2(device, h, n) },
            // SAFETY: as above, on a live stream (or a special one).
            (true, Some(s)) => unsafe { sys::cuMemcpyHtoDAsync_v2(device, h, n, stream_handle(s)) },
            // SAFETY: as above.
            (false, None) => unsafe { sys::cuMemcpyDtoH_v2(h, device, n) },
            // SAFETY: as above, on a live stream (or a special one).
            (false, Some(s)) => unsafe { sys::cuMemcpyDtoHAsync_v2(h, device, n, stream_handle(s)) },
        })
    }
}

impl Streams for CudaBackend {
    fn stream_create(&self, device: i32, flags: u32, priority: i32) -> Result<Raw, CudaError> {
        use result::stream::StreamKind;
        self.bind(device)?;
        // The flags CUDA defines (the service refuses others; the driver would answer this).
        let kind = match flags {
            0 => StreamKind::Default,
            1 => StreamKind::NonBlocking,
            _ => return Err(CudaError::InvalidValue),
        };
        result::stream::create_with_priority(kind, priority).map(|s| s as Raw).map_err(driver)
    }

    fn stream_destroy(&self, stream: Raw) -> Result<(), CudaError> {
        // SAFETY: a stream this backend created, which the registry has just let go of.
        unsafe { result::stream::destroy(stream as sys::CUstream) }.map_err(driver)
    }

    fn stream_synchronize(&self, stream: StreamRef) -> Result<(), CudaError> {
        // SAFETY: a live stream of the session's, or a special stream.
        unsafe { result::stream::synchronize(stream_handle(stream)) }.map_err(driver)
    }

    fn stream_query(&self, stream: StreamRef) -> Result<bool, CudaError> {
        // Raw: the typed layer has no stream query.
        // SAFETY: a live stream of the session's, or a special stream.
        match unsafe { sys::cuStreamQuery(stream_handle(stream)) } {
            sys::CUresult::CUDA_SUCCESS => Ok(true),
            sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            e => Err(CudaError(e as i32)),
        }
    }

    fn stream_wait_event(&self, stream: StreamRef, event: Raw) -> Result<(), CudaError> {
        let wait = sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT;
        // SAFETY: a live stream (or a special one) and a live event of the session's.
        unsafe { result::stream::wait_event(stream_handle(stream), event as sys::CUevent, wait) }.map_err(driver)
    }

    fn host_func(&self, stream: StreamRef, gate: std::sync::Arc<Gate>) -> Result<(), CudaError> {
        // Runs on the driver's callback thread when the stream gets there; the stream stays
        // there until the guest has run its function.
        unsafe extern "C" fn at_gate(gate: *mut c_void) {
            // SAFETY: `gate` is the reference `host_func` gave the driver, passed back once.
            let gate = unsafe { std::sync::Arc::from_raw(gate as *const Gate) };
            gate.reach();
            gate.wait_opened();
        }
        let raw = std::sync::Arc::into_raw(gate) as *mut c_void;
        // SAFETY: `at_gate` takes back the reference `raw` holds, once, when the stream gets
        // there; the stream is live (or a special one).
        let r = unsafe { result::stream::launch_host_function(stream_handle(stream), at_gate, raw) }.map_err(driver);
        if r.is_err() {
            // SAFETY: the driver did not take the reference: it is given back here, once.
            drop(unsafe { std::sync::Arc::from_raw(raw as *const Gate) });
        }
        r
    }

    fn stream_mem_op(&self, stream: StreamRef, op: super::MemOp) -> Result<(), CudaError> {
        let s = stream_handle(stream);
        // Raw: the typed layer has no stream memory operations. The flags are the guest's,
        // checked by the guest library and plain integers here; the driver checks them again.
        let r = match op {
            // SAFETY: a live stream of the session's (or a special one); an address of the
            // session's memory (the service checked it), aligned to the width.
            super::MemOp::Wait { addr, value, wide: false, flags } => unsafe {
                sys::cuStreamWaitValue32_v2(s, addr, value as u32, flags)
            },
            // SAFETY: as above.
            super::MemOp::Wait { addr, value, wide: true, flags } => unsafe {
                sys::cuStreamWaitValue64_v2(s, addr, value, flags)
            },
            // SAFETY: as above.
            super::MemOp::Write { addr, value, wide: false, flags } => unsafe {
                sys::cuStreamWriteValue32_v2(s, addr, value as u32, flags)
            },
            // SAFETY: as above.
            super::MemOp::Write { addr, value, wide: true, flags } => unsafe {
                sys::cuStreamWriteValue64_v2(s, addr, value, flags)
            },
            super::MemOp::Flush => {
                // CU_STREAM_MEM_OP_FLUSH_REMOTE_WRITES: one operation of a batch.
                let mut p: sys::CUstreamBatchMemOpParams = unsafe_zeroed_batch_op();
                // SAFETY: the operation field of the union (its first word).
                unsafe { (&mut p as *mut sys::CUstreamBatchMemOpParams as *mut u32).write(3) };
                // SAFETY: one operation, flags 0; a live stream.
                unsafe { sys::cuStreamBatchMemOp_v2(s, 1, &mut p, 0) }
            }
        };
        check(r)
    }
}

/// A `CUstreamBatchMemOpParams` of zeros.
fn unsafe_zeroed_batch_op() -> sys::CUstreamBatchMemOpParams {
    // SAFETY: a C union of integers and pointers, for which all zeros is a valid value.
    unsafe { std::mem::zeroed() }
}

impl Events for CudaBackend {
    fn event_create(&self, device: i32, flags: u32) -> Result<Raw, CudaError> {
        self.bind(device)?;
        // Raw: the guest's flags are a set of bits (blocking sync | disable timing | ...),
        // which the typed layer's one-value enum cannot hold.
        let mut e = std::ptr::null_mut();
        // SAFETY: writes one event handle.
        check(unsafe { sys::cuEventCreate(&mut e, flags) })?;
        Ok(e as Raw)
    }

    fn event_export(&self, event: Raw) -> Result<[u8; 64], CudaError> {
        // SAFETY: all zeros is a valid handle (written below).
        let mut h: sys::CUipcEventHandle = unsafe { std::mem::zeroed() };
        // SAFETY: writes one handle; a live event of the session's.
        check(unsafe { sys::cuIpcGetEventHandle(&mut h, event as sys::CUevent) })?;
        Ok(h.reserved.map(|c| c as u8))
    }

    fn event_import(&self, device: i32, exported: &[u8; 64]) -> Result<Raw, CudaError> {
        self.bind(device)?;
        // SAFETY: all zeros is a valid handle (filled below).
        let mut h: sys::CUipcEventHandle = unsafe { std::mem::zeroed() };
        h.reserved = exported.map(|b| b as std::ffi::c_char);
        let mut e = std::ptr::null_mut();
        // SAFETY: writes one event; the handle is what another server's driver exported
        // (checked by that server, which answered for its tenant).
        check(unsafe { sys::cuIpcOpenEventHandle(&mut e, h) })?;
        Ok(e as Raw)
    }

    fn event_destroy(&self, event: Raw) -> Result<(), CudaError> {
        // SAFETY: an event this backend created, which the registry has just let go of.
        unsafe { result::event::destroy(event as sys::CUevent) }.map_err(driver)
    }

    fn event_record(&self, event: Raw, stream: StreamRef) -> Result<(), CudaError> {
        // SAFETY: a live event and a live (or special) stream of the session's.
        unsafe { result::event::record(event as sys::CUevent, stream_handle(stream)) }.map_err(driver)
    }

    fn event_synchronize(&self, event: Raw) -> Result<(), CudaError> {
        // SAFETY: a live event of the session's.
        unsafe { result::event::synchronize(event as sys::CUevent) }.map_err(driver)
    }

    fn event_query(&self, event: Raw) -> Result<bool, CudaError> {
        // SAFETY: a live event of the session's.
        match unsafe { result::event::query(event as sys::CUevent) } {
            Ok(()) => Ok(true),
            Err(DriverError(sys::CUresult::CUDA_ERROR_NOT_READY)) => Ok(false),
            Err(e) => Err(driver(e)),
        }
    }

    fn event_elapsed(&self, start: Raw, end: Raw) -> Result<f32, CudaError> {
        // SAFETY: live events of the session's.
        unsafe { result::event::elapsed(start as sys::CUevent, end as sys::CUevent) }.map_err(driver)
    }
}

impl Modules for CudaBackend {
    fn module_load(&self, device: i32, image: &[u8]) -> Result<LoadedModule, CudaError> {
        self.bind(device)?;
        // The driver reads the image as 8-byte words; give it an aligned, NUL-terminated copy
        // (PTX images need the terminator).
        let mut aligned = vec![0u64; image.len() / 8 + 2];
        // SAFETY: `aligned` has room for the image and at least 8 more bytes (the terminator).
        unsafe { std::ptr::copy_nonoverlapping(image.as_ptr(), aligned.as_mut_ptr() as *mut u8, image.len()) };
        // SAFETY: an aligned, terminated image that outlives the call (the driver copies it).
        let m = unsafe { result::module::load_data(aligned.as_ptr() as *const c_void) }.map_err(driver)?;
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

    fn compile_ptx(&self, device: i32, ptx: &[u8]) -> Option<Vec<u8>> {
        let jit = self.jit_link.get_or_init(|| {
            let found = super::jit_link::JitLink::open();
            match &found {
                Some(j) => tracing::info!("checked twins are compiled with {}", j.path.display()),
                None => tracing::info!(
                    "no nvJitLink found ({}, Python's nvidia/*/lib, the loader's paths): the driver compiles checked twins, holding up the session's calls while it does",
                    super::jit_link::NVJITLINK_LIB_VAR
                ),
            }
            found
        });
        let jit = jit.as_ref()?;
        // `CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR` and `_MINOR`
        let major = self.device_attribute(device, 75).ok()?;
        let minor = self.device_attribute(device, 76).ok()?;
        let ptx = ptx.strip_suffix(&[0]).unwrap_or(ptx);
        match jit.compile(ptx, major * 10 + minor) {
            Ok(cubin) => Some(cubin),
            Err(e) => {
                tracing::warn!("nvJitLink did not compile a checked twin ({e}): the driver compiles it");
                None
            }
        }
    }

    fn module_unload(&self, module: Raw) -> Result<(), CudaError> {
        // SAFETY: a module this backend loaded, which the registry has just let go of.
        unsafe { result::module::unload(module as sys::CUmodule) }.map_err(driver)
    }

    fn module_function(&self, module: Raw, name: &str) -> Result<Raw, CudaError> {
        let name = CString::new(name).map_err(|_| CudaError::InvalidValue)?;
        // SAFETY: a live module of the session's.
        let f = unsafe { result::module::get_function(module as sys::CUmodule, name) }.map_err(driver)?;
        Ok(f as Raw)
    }

    fn module_global(&self, module: Raw, name: &str) -> Result<(u64, u64), CudaError> {
        let name = CString::new(name).map_err(|_| CudaError::InvalidValue)?;
        // SAFETY: a live module of the session's.
        let (ptr, size) = unsafe { result::module::get_global(module as sys::CUmodule, name) }.map_err(driver)?;
        Ok((ptr, size as u64))
    }

    fn function_attributes(&self, function: Raw) -> Result<FuncAttributes, CudaError> {
        let f = function as sys::CUfunction;
        let get = |attr: i32| -> Result<i32, CudaError> {
            let mut v = 0;
            // SAFETY: `RawDriver`'s signature of cuFuncGetAttribute, for a live function of the
            // session's; writes one int (an attribute it does not know is an error).
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
        // SAFETY: `RawDriver`'s signature of cuFuncSetAttribute, for a live function of the
        // session's; a guest's attribute or value the driver does not take is an error.
        check_raw(unsafe { (self.raw.func_set_attribute)(function as sys::CUfunction, attr, value) })
    }

    fn function_set_cache_config(&self, function: Raw, config: i32) -> Result<(), CudaError> {
        // SAFETY: `RawDriver`'s signature of cuFuncSetCacheConfig, for a live function of the
        // session's; a guest's configuration the driver does not know is an error.
        check_raw(unsafe { (self.raw.func_set_cache_config)(function as sys::CUfunction, config) })
    }

    fn occupancy(&self, function: Raw, block_size: i32, dynamic_smem: u64, flags: u32) -> Result<i32, CudaError> {
        let f = function as sys::CUfunction;
        // SAFETY: a live function of the session's.
        unsafe {
            result::occupancy::max_active_block_per_multiprocessor_with_flags(
                f,
                block_size,
                dynamic_smem as usize,
                flags,
            )
        }
        .map_err(driver)
    }

    fn available_dynamic_smem(&self, function: Raw, blocks: i32, block_size: i32) -> Result<u64, CudaError> {
        let f = function as sys::CUfunction;
        // SAFETY: a live function of the session's.
        let n = unsafe { result::occupancy::available_dynamic_shared_mem_per_block(f, blocks, block_size) }
            .map_err(driver)?;
        Ok(n as u64)
    }

    fn max_active_clusters(
        &self,
        function: Raw,
        grid: Dim3,
        block: Dim3,
        smem: u32,
        cluster: Option<Dim3>,
    ) -> Result<i32, CudaError> {
        let mut attr = ClusterAttribute::new(cluster);
        let config = launch_config(grid, block, smem, &mut attr);
        let mut n = 0;
        // SAFETY: a live function of the session's; the configuration and its attribute (if
        // any) live across the call.
        check(unsafe { sys::cuOccupancyMaxActiveClusters(&mut n, function as sys::CUfunction, &config) })?;
        Ok(n)
    }

    fn max_potential_cluster_size(&self, function: Raw, grid: Dim3, block: Dim3, smem: u32) -> Result<i32, CudaError> {
        let mut attr = ClusterAttribute::new(None);
        let config = launch_config(grid, block, smem, &mut attr);
        let mut n = 0;
        // SAFETY: as in `max_active_clusters`.
        check(unsafe { sys::cuOccupancyMaxPotentialClusterSize(&mut n, function as sys::CUfunction, &config) })?;
        Ok(n)
    }

    fn link(&self, device: i32, inputs: &phos_protocol::jit_link::LinkInputs<'_>) -> super::LinkOutcome {
        if let Err(e) = self.bind(device) {
            return super::LinkOutcome::failed(e.0, "cannot make the device current");
        }
        super::cuda_jit::link(inputs)
    }

    fn tensor_map_encode(&self, params: &phos_protocol::tensor_map::Params) -> Result<[u8; 128], CudaError> {
        super::cuda_jit::tensor_map_encode(params)
    }

    fn tensor_map_replace_address(&self, map: &mut [u8; 128], address: u64) -> Result<(), CudaError> {
        super::cuda_jit::tensor_map_replace_address(map, address)
    }
}

/// A `CUlaunchAttribute` of `CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION` (its id, padding, a 64-byte
/// value whose first three words are the dimensions), or none.
#[repr(C, align(8))]
struct ClusterAttribute {
    bytes: [u8; 72],
    present: bool,
}

impl ClusterAttribute {
    fn new(cluster: Option<Dim3>) -> Self {
        const CLUSTER_DIMENSION: u32 = 4;
        let mut bytes = [0u8; 72];
        if let Some(c) = cluster {
            bytes[0..4].copy_from_slice(&CLUSTER_DIMENSION.to_ne_bytes());
            for (k, v) in [c.x, c.y, c.z].into_iter().enumerate() {
                bytes[8 + 4 * k..12 + 4 * k].copy_from_slice(&v.to_ne_bytes());
            }
        }
        ClusterAttribute { bytes, present: cluster.is_some() }
    }
}

/// The launch configuration an occupancy query of clusters takes (no stream).
fn launch_config(grid: Dim3, block: Dim3, smem: u32, attr: &mut ClusterAttribute) -> sys::CUlaunchConfig {
    sys::CUlaunchConfig {
        gridDimX: grid.x,
        gridDimY: grid.y,
        gridDimZ: grid.z,
        blockDimX: block.x,
        blockDimY: block.y,
        blockDimZ: block.z,
        sharedMemBytes: smem,
        hStream: std::ptr::null_mut(),
        attrs: if attr.present { attr.bytes.as_mut_ptr() as *mut sys::CUlaunchAttribute } else { std::ptr::null_mut() },
        numAttrs: u32::from(attr.present),
    }
}

impl Libraries for CudaBackend {
    fn cublas(&self) -> Option<&super::vendor::Cublas> {
        self.cublas
            .get_or_init(|| match super::vendor::Cublas::open() {
                Ok(c) => {
                    tracing::info!(
                        "cuBLAS: {} ({} of the compute functions Phos carries found)",
                        c.path.display(),
                        c.library.found()
                    );
                    Some(c)
                }
                Err(e) => {
                    tracing::warn!("cuBLAS calls run on the server's CPU (slowly): {e}");
                    None
                }
            })
            .as_ref()
    }

    fn curand(&self) -> Option<&super::vendor_curand::Curand> {
        self.curand
            .get_or_init(|| match super::vendor_curand::Curand::open() {
                Ok(c) => {
                    tracing::info!(
                        "cuRAND: {} ({} of the generation functions Phos carries found)",
                        c.path.display(),
                        c.library.found()
                    );
                    Some(c)
                }
                Err(e) => {
                    tracing::warn!("cuRAND generators are drawn on the server's CPU (Philox4x32-10): {e}");
                    None
                }
            })
            .as_ref()
    }

    fn cublaslt(&self) -> Option<&super::vendor_lt::CublasLt> {
        self.cublaslt
            .get_or_init(|| match super::vendor_lt::CublasLt::open() {
                Ok(c) => {
                    tracing::info!(
                        "cuBLASLt: {} ({} of the calls Phos makes through it found)",
                        c.path.display(),
                        c.library.found()
                    );
                    Some(c)
                }
                Err(e) => {
                    tracing::warn!("cuBLASLt matmuls run on the server's CPU (slowly): {e}");
                    None
                }
            })
            .as_ref()
    }

    fn cusolver(&self) -> Option<&super::vendor::Cusolver> {
        self.cusolver
            .get_or_init(|| match super::vendor::Cusolver::open() {
                Ok(c) => {
                    tracing::info!(
                        "cuSOLVER: {} ({} of the compute functions Phos carries found)",
                        c.path.display(),
                        c.library.found()
                    );
                    Some(c)
                }
                Err(e) => {
                    tracing::warn!("cuSOLVER calls run on the server's CPU (slowly): {e}");
                    None
                }
            })
            .as_ref()
    }

    fn cusparse(&self) -> Option<&super::vendor_cusparse::Cusparse> {
        self.cusparse
            .get_or_init(|| match super::vendor_cusparse::Cusparse::open() {
                Ok(c) => {
                    tracing::info!(
                        "cuSPARSE: {} ({} of the compute functions Phos carries found)",
                        c.path.display(),
                        c.library.found()
                    );
                    Some(c)
                }
                Err(e) => {
                    tracing::warn!("cuSPARSE calls run on the server's CPU (slowly): {e}");
                    None
                }
            })
            .as_ref()
    }

    fn nvml(&self) -> Option<&super::vendor_nvml::Nvml> {
        self.nvml
            .get_or_init(|| match super::vendor_nvml::Nvml::open() {
                Ok(n) => {
                    tracing::info!("NVML: {}", n.path.display());
                    Some(n)
                }
                Err(e) => {
                    tracing::warn!("NVML queries are answered from the device attributes alone: {e}");
                    None
                }
            })
            .as_ref()
    }

    fn cufft(&self) -> Option<&super::vendor_cufft::Cufft> {
        self.cufft
            .get_or_init(|| match super::vendor_cufft::Cufft::open() {
                Ok(c) => {
                    tracing::info!(
                        "cuFFT: {} ({} of the functions Phos calls through its spec found)",
                        c.path.display(),
                        c.library.found()
                    );
                    Some(c)
                }
                Err(e) => {
                    tracing::warn!("cuFFT transforms run on the server's CPU (slowly): {e}");
                    None
                }
            })
            .as_ref()
    }

    fn cudnn(&self) -> Option<&super::vendor_cudnn::Cudnn> {
        self.cudnn
            .get_or_init(|| match super::vendor_cudnn::Cudnn::open() {
                Ok(c) => {
                    tracing::info!("cuDNN: {} (version {})", c.path.display(), c.versions().version);
                    Some(c)
                }
                Err(e) => {
                    tracing::warn!("cuDNN calls that need cuDNN answer CUDNN_STATUS_NOT_SUPPORTED: {e}");
                    None
                }
            })
            .as_ref()
    }
}

impl Launch for CudaBackend {
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
        // Raw: the launch passes the packed parameter buffer (`extra`), the typed
        // `launch_kernel` an array of pointers to each argument.
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
        let timing = self.timer.lock().begin(device, measure);
        let h = stream_handle(stream);
        if let Some((start, _)) = timing.pair {
            // SAFETY: the timer's live event, and the launch's (live or special) stream.
            let _ = unsafe { result::event::record(start, h) };
        }
        let profiled = phos_protocol::call_profile::start();
        let r = if cooperative {
            // cuLaunchCooperativeKernel takes no packed buffer; cuLaunchKernelEx does.
            // SAFETY: a plain C struct (and union) whose zero value is valid.
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
            // SAFETY: `extra` points at the parameter buffer and its size, both alive for the
            // call (the driver copies the parameters at launch); the function and stream
            // are live.
            unsafe {
                check(sys::cuLaunchKernelEx(
                    &config,
                    function as sys::CUfunction,
                    std::ptr::null_mut(),
                    extra.as_mut_ptr(),
                ))
            }
        } else {
            // SAFETY: as above.
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
        phos_protocol::call_profile::vendor_ended(profiled);
        if timing.pair.is_some() || r.is_err() || timing.count.timed {
            let mut timer = self.timer.lock();
            match timing.pair {
                // SAFETY: as above.
                Some(pair) if r.is_ok() && unsafe { result::event::record(pair.1, h) }.is_ok() => {
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
        let mut timer = self.timer.lock();
        timer.harvest_if_due();
        (timer.total_ns, timer.kernels)
    }

    fn measuring(&self) -> bool {
        !self.timer.lock().pending.is_empty()
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
