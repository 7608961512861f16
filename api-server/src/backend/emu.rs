//! The `emu` backend: a CPU stand-in for a GPU, so the whole stack runs where there is none
//! (CI, laptops). Device memory is host memory mapped at the session's device addresses in
//! the server process, so a device pointer is directly usable here; kernels run from the PTX
//! in the module's fat binary. Work is done in call order as it is submitted, which is one
//! of the orders CUDA's stream semantics allow.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use std::time::Instant;

use phos_protocol::CudaError;
use phos_protocol::types::{DeviceProperties, Dim3, FuncAttributes};
use phos_ptx::exec::{self, GlobalMemory, Program};

use super::emu_arrays::ArrayStore;
use super::prelude::*;
use super::{ArraySide, ArraySpec, Gate, LoadedModule, MemOp, Physical, Raw, StreamRef, TextureSource};
use crate::registry::memory::MemoryView;
use phos_protocol::types::ResourceViewWire;
use phos_ptx::exec::TextureDesc;
use std::sync::atomic::AtomicI32;

/// `CUdevice_attribute` numbers the emulated device reports (the subset that describes it).
mod attr {
    pub const MAX_THREADS_PER_BLOCK: usize = 1;
    pub const MAX_BLOCK_DIM_X: usize = 2;
    pub const MAX_BLOCK_DIM_Y: usize = 3;
    pub const MAX_BLOCK_DIM_Z: usize = 4;
    pub const MAX_GRID_DIM_X: usize = 5;
    pub const MAX_GRID_DIM_Y: usize = 6;
    pub const MAX_GRID_DIM_Z: usize = 7;
    pub const MAX_SHARED_MEMORY_PER_BLOCK: usize = 8;
    pub const TOTAL_CONSTANT_MEMORY: usize = 9;
    pub const WARP_SIZE: usize = 10;
    pub const MAX_PITCH: usize = 11;
    pub const MAX_REGISTERS_PER_BLOCK: usize = 12;
    pub const CLOCK_RATE: usize = 13;
    pub const TEXTURE_ALIGNMENT: usize = 14;
    pub const GPU_OVERLAP: usize = 15;
    pub const MULTIPROCESSOR_COUNT: usize = 16;
    pub const CAN_MAP_HOST_MEMORY: usize = 19;
    pub const SURFACE_ALIGNMENT: usize = 30;
    pub const CONCURRENT_KERNELS: usize = 31;
    pub const PCI_BUS_ID: usize = 33;
    pub const MEMORY_CLOCK_RATE: usize = 36;
    pub const GLOBAL_MEMORY_BUS_WIDTH: usize = 37;
    pub const L2_CACHE_SIZE: usize = 38;
    pub const MAX_THREADS_PER_MULTIPROCESSOR: usize = 39;
    pub const ASYNC_ENGINE_COUNT: usize = 40;
    pub const UNIFIED_ADDRESSING: usize = 41;
    pub const TEXTURE_PITCH_ALIGNMENT: usize = 51;
    pub const COMPUTE_CAPABILITY_MAJOR: usize = 75;
    pub const COMPUTE_CAPABILITY_MINOR: usize = 76;
    pub const STREAM_PRIORITIES_SUPPORTED: usize = 78;
    pub const GLOBAL_L1_CACHE_SUPPORTED: usize = 79;
    pub const LOCAL_L1_CACHE_SUPPORTED: usize = 80;
    pub const MAX_SHARED_MEMORY_PER_MULTIPROCESSOR: usize = 81;
    pub const MAX_REGISTERS_PER_MULTIPROCESSOR: usize = 82;
    pub const SINGLE_TO_DOUBLE_PRECISION_PERF_RATIO: usize = 87;
    pub const COMPUTE_PREEMPTION_SUPPORTED: usize = 90;
    pub const COOPERATIVE_LAUNCH: usize = 95;
    pub const MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: usize = 97;
    pub const MAX_BLOCKS_PER_MULTIPROCESSOR: usize = 106;
    pub const RESERVED_SHARED_MEMORY_PER_BLOCK: usize = 111;
    pub const VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: usize = 102;
    pub const CAN_USE_64_BIT_STREAM_MEM_OPS: usize = 122;
    pub const CAN_USE_STREAM_WAIT_VALUE_NOR: usize = 123;
    pub const LAST: usize = 160;
}

struct Event {
    flags: u32,
    recorded: Option<Instant>,
}

/// A loaded module: its PTX prepared for the interpreter, and the storage of its variables.
struct Module {
    program: Arc<Program>,
    /// What the PTX says of each kernel beyond the interpreter's needs.
    kernels: HashMap<String, KernelMeta>,
    /// Variables by name: (address, size).
    variables: HashMap<String, (u64, u64)>,
    /// Host memory holding the variables (unmapped with the module).
    storage: Option<(u64, usize)>,
}

impl Drop for Module {
    fn drop(&mut self) {
        if let Some((addr, len)) = self.storage {
            // SAFETY: the module's own mapping; its kernels and the session's view of its
            // variables have gone with it.
            unsafe { libc::munmap(addr as *mut libc::c_void, len) };
        }
    }
}

/// The session's memory, as the interpreter checks accesses against it.
impl GlobalMemory for MemoryView<'_> {
    fn region(&self, addr: u64) -> Option<std::ops::Range<u64>> {
        MemoryView::region(self, addr)
    }
}

pub struct EmuBackend {
    properties: DeviceProperties,
    /// Memory of each device.
    total_memory: u64,
    /// Bytes mapped (allocations, arrays) on each device: each device has its own memory.
    mapped: Vec<AtomicU64>,
    /// The device each array's memory was taken from.
    array_devices: Mutex<HashMap<Raw, usize>>,
    next: AtomicU64,
    events: Mutex<HashMap<Raw, Event>>,
    streams: Mutex<HashMap<Raw, ()>>,
    modules: Mutex<HashMap<Raw, Module>>,
    functions: Mutex<HashMap<Raw, Function>>,
    /// Context limits, by `cudaLimit`.
    limits: Mutex<[u64; LIMITS]>,
    /// Host-function gates not opened yet: since work runs in submission order, all work
    /// submitted after a gate waits for it.
    gates: Mutex<Vec<Arc<Gate>>>,
    /// Stream memory waits whose condition did not hold when they were submitted: the work
    /// submitted after one to its stream (or to the legacy stream, or synchronising) waits
    /// until it holds ([`EmuBackend::settle`]); other streams' work goes on.
    waits: Mutex<Vec<(StreamRef, MemOp)>>,
    cache_config: AtomicI32,
    shared_mem_config: AtomicI32,
    /// Device work (copies, memsets, kernels) runs one operation at a time, in the order it
    /// was submitted: a valid CUDA schedule for any mix of streams and host threads.
    work: Mutex<()>,
    workers: usize,
    /// Time spent running kernels (ns) and kernels run: the emulated device's device time.
    kernel_ns: AtomicU64,
    kernels: AtomicU64,
    /// Warp-instructions a launch may run per worker before it fails as timed out (none:
    /// kernels run until they end, as on a GPU).
    kernel_limit: Option<u64>,
    /// Blocks shared with other server processes (IPC): exported ones (by address, their
    /// file) and opened ones (no file kept: the mapping holds it).
    shared: Mutex<HashMap<u64, Option<std::os::fd::OwnedFd>>>,
    /// CUDA arrays, texture and surface objects.
    arrays: Mutex<ArrayStore>,
    /// The C/R engine's buffers and copy lanes (kept as on a GPU, so that tests take the
    /// same path).
    copies: super::copy_pool::CopyPool,
}

/// A kernel handle: its program and the attributes a program may set.
#[derive(Clone)]
struct Function {
    program: Arc<Program>,
    name: String,
    meta: KernelMeta,
    max_dynamic_shared: u32,
    carveout: i32,
    cache_config: i32,
}

/// The PTX's word on a kernel: `.maxntid` / `.reqntid` and the module's `.target`.
#[derive(Clone, Copy, Default)]
struct KernelMeta {
    max_threads: u32,
    /// The virtual architecture the PTX was compiled for (`.target sm_70` is 70), which CUDA
    /// answers as `ptxVersion`: not the PTX ISA's `.version` (7.8 for every target of CUDA
    /// 11.8). CUB and Thrust pick their kernels' tuning from it, and the host's choice must
    /// match the one the device code was compiled with.
    ptx_version: i32,
}

fn kernel_meta(module: &phos_ptx::Module) -> HashMap<String, KernelMeta> {
    use phos_ptx::{Directive, FunctionDirective};
    let ptx_version = module
        .target()
        .and_then(|t| t.first())
        .and_then(|t| t.trim_start_matches("sm_").trim_end_matches(|c: char| c.is_alphabetic()).parse().ok())
        .unwrap_or(0);
    let mut out = HashMap::new();
    for d in &module.directives {
        let Directive::Function(f) = d else { continue };
        let mut max_threads = 1024u32;
        for fd in &f.directives {
            if let FunctionDirective::MaxNTid(v) | FunctionDirective::ReqNTid(v) = fd {
                max_threads = max_threads.min(v.iter().product::<u32>().max(1));
            }
        }
        out.insert(f.name.clone(), KernelMeta { max_threads, ptx_version });
    }
    out
}

/// `cudaLimit` values there are.
const LIMITS: usize = 7;
/// What a fresh context reports: stack, printf FIFO, malloc heap, device-runtime sync depth,
/// pending launches, L2 fetch granularity, persisting L2 size (CUDA's defaults).
const DEFAULT_LIMITS: [u64; LIMITS] = [1024, 1 << 20, 8 << 20, 2, 2048, 64, 0];
/// The largest stack (local memory) a thread may have.
const MAX_STACK: u64 = 512 << 10;
/// Shared memory a block may use without opting in.
const DEFAULT_DYNAMIC_SHARED: u64 = 48 * 1024;

const PAGE: u64 = 4096;
/// `cudaEventDisableTiming`
const EVENT_DISABLE_TIMING: u32 = 0x2;

impl EmuBackend {
    /// An emulated device with `total_memory` bytes of memory.
    pub fn new(total_memory: u64) -> Self {
        Self::with_devices(total_memory, 1)
    }

    /// `devices` emulated devices (at least 1), each with `total_memory` bytes of memory of
    /// its own; they share the CPU that runs their work (one operation at a time, as one
    /// device does), and differ in their UUID and PCI bus number.
    pub fn with_devices(total_memory: u64, devices: usize) -> Self {
        let devices = devices.max(1);
        let cores = std::thread::available_parallelism().map(|n| n.get() as i32).unwrap_or(1);
        let mut a = vec![0i32; attr::LAST + 1];
        let set = |a: &mut Vec<i32>, i: usize, v: i32| a[i] = v;
        set(&mut a, attr::MAX_THREADS_PER_BLOCK, 1024);
        set(&mut a, attr::MAX_BLOCK_DIM_X, 1024);
        set(&mut a, attr::MAX_BLOCK_DIM_Y, 1024);
        set(&mut a, attr::MAX_BLOCK_DIM_Z, 64);
        set(&mut a, attr::MAX_GRID_DIM_X, i32::MAX);
        set(&mut a, attr::MAX_GRID_DIM_Y, 65535);
        set(&mut a, attr::MAX_GRID_DIM_Z, 65535);
        set(&mut a, attr::MAX_SHARED_MEMORY_PER_BLOCK, 48 * 1024);
        set(&mut a, attr::TOTAL_CONSTANT_MEMORY, 64 * 1024);
        set(&mut a, attr::WARP_SIZE, 32);
        set(&mut a, attr::MAX_PITCH, i32::MAX);
        set(&mut a, attr::MAX_REGISTERS_PER_BLOCK, 65536);
        set(&mut a, attr::CLOCK_RATE, 1_000_000);
        set(&mut a, attr::TEXTURE_ALIGNMENT, 512);
        set(&mut a, attr::GPU_OVERLAP, 1);
        set(&mut a, attr::MULTIPROCESSOR_COUNT, cores);
        set(&mut a, attr::CAN_MAP_HOST_MEMORY, 0);
        // cudaDevAttrIpcEventSupport: IPC events between sessions of a tenant.
        set(&mut a, 125, 1);
        // cudaDevAttrMaxTexture1DLinearWidth: compute capability 5.0 on (2^28 elements), what
        // cudaDeviceGetTexture1DLinearMaxWidth answers.
        set(&mut a, 69, 1 << 28);
        set(&mut a, attr::SURFACE_ALIGNMENT, 512);
        set(&mut a, attr::CONCURRENT_KERNELS, 1);
        set(&mut a, attr::MEMORY_CLOCK_RATE, 1_000_000);
        set(&mut a, attr::GLOBAL_MEMORY_BUS_WIDTH, 64);
        set(&mut a, attr::L2_CACHE_SIZE, 4 << 20);
        set(&mut a, attr::MAX_THREADS_PER_MULTIPROCESSOR, 2048);
        set(&mut a, attr::ASYNC_ENGINE_COUNT, 1);
        set(&mut a, attr::UNIFIED_ADDRESSING, 1);
        set(&mut a, attr::TEXTURE_PITCH_ALIGNMENT, 32);
        set(&mut a, attr::COMPUTE_CAPABILITY_MAJOR, 9);
        set(&mut a, attr::COMPUTE_CAPABILITY_MINOR, 0);
        set(&mut a, attr::STREAM_PRIORITIES_SUPPORTED, 1);
        set(&mut a, attr::GLOBAL_L1_CACHE_SUPPORTED, 1);
        set(&mut a, attr::LOCAL_L1_CACHE_SUPPORTED, 1);
        set(&mut a, attr::MAX_SHARED_MEMORY_PER_MULTIPROCESSOR, 228 * 1024);
        set(&mut a, attr::MAX_REGISTERS_PER_MULTIPROCESSOR, 65536);
        set(&mut a, attr::SINGLE_TO_DOUBLE_PRECISION_PERF_RATIO, 2);
        set(&mut a, attr::COMPUTE_PREEMPTION_SUPPORTED, 1);
        set(&mut a, attr::COOPERATIVE_LAUNCH, 1);
        set(&mut a, attr::MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, 227 * 1024);
        set(&mut a, attr::MAX_BLOCKS_PER_MULTIPROCESSOR, 32);
        set(&mut a, attr::RESERVED_SHARED_MEMORY_PER_BLOCK, 1024);
        set(&mut a, attr::VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 1);
        // Stream memory operations (CUDA 12's, the `_v2` functions), 64-bit ones and NOR
        // waits included; the first forms' attributes (92 to 94) stay 0, as on a CUDA 12
        // driver without its module option for them.
        set(&mut a, attr::CAN_USE_64_BIT_STREAM_MEM_OPS, 1);
        set(&mut a, attr::CAN_USE_STREAM_WAIT_VALUE_NOR, 1);
        super::set_managed_memory_attributes(&mut a);
        let mut uuid = [0u8; 16];
        uuid[..8].copy_from_slice(b"phos-emu");
        EmuBackend {
            properties: DeviceProperties {
                name: "Phos emulated GPU (CPU)".into(),
                uuid,
                luid: [0; 8],
                luid_device_node_mask: 0,
                total_global_mem: total_memory,
                attributes: a,
            },
            total_memory,
            mapped: (0..devices).map(|_| AtomicU64::new(0)).collect(),
            array_devices: Mutex::new(HashMap::new()),
            next: AtomicU64::new(1),
            events: Mutex::new(HashMap::new()),
            streams: Mutex::new(HashMap::new()),
            modules: Mutex::new(HashMap::new()),
            functions: Mutex::new(HashMap::new()),
            limits: Mutex::new(DEFAULT_LIMITS),
            gates: Mutex::new(Vec::new()),
            waits: Mutex::new(Vec::new()),
            cache_config: AtomicI32::new(0),
            shared_mem_config: AtomicI32::new(1),
            work: Mutex::new(()),
            workers: cores as usize,
            kernel_ns: AtomicU64::new(0),
            kernels: AtomicU64::new(0),
            kernel_limit: None,
            shared: Mutex::new(HashMap::new()),
            copies: Default::default(),
            arrays: Mutex::new(ArrayStore::default()),
        }
    }

    /// Fail a launch with `cudaErrorLaunchTimeout` once a worker has run this many
    /// warp-instructions of it (the fuzz harness, whose inputs may loop forever).
    pub fn with_kernel_limit(mut self, max_warp_instructions: u64) -> Self {
        self.kernel_limit = Some(max_warp_instructions);
        self
    }

    fn fresh(&self) -> Raw {
        self.next.fetch_add(1, Ordering::Relaxed)
    }

    fn check_device(&self, device: i32) -> Result<(), CudaError> {
        self.index(device).map(|_| ())
    }

    /// `device` as an index of [`mapped`](Self::mapped), if the device exists.
    fn index(&self, device: i32) -> Result<usize, CudaError> {
        usize::try_from(device).ok().filter(|&d| d < self.mapped.len()).ok_or(CudaError::InvalidDevice)
    }

    /// Wait until every host-function gate submitted so far is open, and every stream memory
    /// wait holds (work that synchronises, or is ordered after every stream).
    fn pass_gates(&self) {
        self.open_gates();
        self.settle(None);
    }

    fn open_gates(&self) {
        let gates: Vec<Arc<Gate>> = self.gates.lock().clone();
        for g in &gates {
            g.wait_opened();
        }
        self.gates.lock().retain(|g| !g.is_open());
    }

    /// Wait until the stream memory waits that work submitted to `scope` is ordered after
    /// hold: those of its stream and of the legacy stream (`None`, or the legacy stream: all).
    /// No lock is held while waiting: the session's other streams go on, and one of them
    /// (or the guest, through mapped host memory) is what makes the condition hold. A wait
    /// that never holds blocks its stream's next work, as on a GPU; this server runs one
    /// session, so no other tenant waits with it.
    fn settle(&self, scope: Option<StreamRef>) {
        let relevant = |s: &StreamRef| match scope {
            None | Some(StreamRef::Legacy) => true,
            Some(own) => *s == own || *s == StreamRef::Legacy,
        };
        let mut pause = std::time::Duration::from_micros(20);
        loop {
            let pending = {
                let mut waits = self.waits.lock();
                waits.retain(|(_, op)| !Self::holds(op));
                waits.iter().any(|(s, _)| relevant(s))
            };
            if !pending {
                return;
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(std::time::Duration::from_millis(2));
        }
    }

    /// Whether a wait's condition holds now.
    fn holds(op: &MemOp) -> bool {
        let MemOp::Wait { addr, value, wide, flags } = *op else { return true };
        // The service checked the address is the session's memory, aligned to the value's
        // width; memory is freed only after the device synchronises, which waits for this wait
        // first. Read volatile: kernels, copies or the guest write it meanwhile.
        let current = if wide {
            // SAFETY: as above, eight bytes.
            unsafe { std::ptr::read_volatile(addr as *const u64) }
        } else {
            // SAFETY: as above, four bytes.
            unsafe { std::ptr::read_volatile(addr as *const u32) as u64 }
        };
        MemOp::satisfied(value, wide, flags, current)
    }

    fn check_stream(&self, s: StreamRef) -> Result<(), CudaError> {
        self.open_gates();
        self.settle(Some(s));
        match s {
            StreamRef::Created(raw) if !self.streams.lock().contains_key(&raw) => Err(CudaError::InvalidResourceHandle),
            _ => Ok(()),
        }
    }
}

/// Why a module image gives no PTX to read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ImageError {
    #[error("{0}")]
    Fatbin(#[from] phos_fatbin::FatbinError),
    #[error("not a fat binary, and not PTX text: {0}")]
    Text(#[from] std::str::Utf8Error),
}

/// The PTX of a module image to run: from a fat binary, the entry for the newest virtual
/// architecture; or a PTX text on its own.
pub(crate) fn ptx_of(image: &[u8]) -> Result<Option<String>, ImageError> {
    if image.starts_with(&0xBA55_ED50u32.to_le_bytes()) {
        let fatbin = phos_fatbin::FatBinary::parse(image)?;
        let mut best: Option<(u32, String)> = None;
        for entry in fatbin.entries() {
            let entry = entry?;
            if let phos_fatbin::EntryKind::Ptx = entry.kind
                && best.as_ref().is_none_or(|(arch, _)| entry.sm_arch > *arch)
                && let Some(text) = entry.ptx_text()?
            {
                best = Some((entry.sm_arch, text));
            }
        }
        return Ok(best.map(|(_, t)| t));
    }
    let text = std::str::from_utf8(image.split(|&b| b == 0).next().unwrap_or(&[]))?;
    Ok(text.contains(".version").then(|| text.to_string()))
}

/// Module variables by name, as (address, size), and the mapping that holds them.
type VariableStorage = (HashMap<String, (u64, u64)>, Option<(u64, usize)>);

/// Storage for a module's variables, initialised: one anonymous mapping outside the
/// session's allocation range (module variables live apart from allocations on a GPU too).
/// The mapping starts zeroed, so only the initialized part of each variable is copied in.
/// Variables that do not fit in `limit` bytes (the device's memory) together are refused, as
/// a GPU refuses them.
fn allocate_variables(program: &mut Program, limit: u64) -> Result<VariableStorage, CudaError> {
    let vars = program.variables().to_vec();
    if vars.is_empty() {
        return Ok((HashMap::new(), None));
    }
    let mut offsets = Vec::with_capacity(vars.len());
    let mut end = 0u64;
    for v in &vars {
        // Sizes and alignments are the module's word: a sum past the limit (or past u64)
        // is refused, never wrapped.
        let at = end.checked_next_multiple_of(v.align.max(1)).ok_or(CudaError::MemoryAllocation)?;
        offsets.push(at);
        end = at.checked_add(v.size.max(1)).filter(|&e| e <= limit).ok_or(CudaError::MemoryAllocation)?;
    }
    let len = end.div_ceil(PAGE) * PAGE;
    // SAFETY: a fresh anonymous mapping where the kernel chooses; nothing else is touched.
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if base == libc::MAP_FAILED {
        return Err(CudaError::MemoryAllocation);
    }
    let base = base as u64;
    let addresses: Vec<u64> = offsets.iter().map(|o| base + o).collect();
    let contents = program.bind_variables(&addresses);
    let mut by_name = HashMap::new();
    for ((v, &addr), init) in vars.iter().zip(&addresses).zip(contents) {
        let n = init.len().min(v.size as usize);
        // SAFETY: `addr` is this variable's place in the mapping just made, which holds
        // `v.size` bytes there (offsets were laid out above); `n` is at most that.
        unsafe { std::ptr::copy_nonoverlapping(init.as_ptr(), addr as *mut u8, n) };
        by_name.insert(v.name.clone(), (addr, v.size));
    }
    Ok((by_name, Some((base, len as usize))))
}

impl Devices for EmuBackend {
    fn name(&self) -> &'static str {
        "emu"
    }

    fn device_count(&self) -> i32 {
        self.mapped.len() as i32
    }

    fn device_properties(&self, device: i32) -> Result<DeviceProperties, CudaError> {
        let d = self.index(device)?;
        let mut p = self.properties.clone();
        // Device 0's UUID and bus are those of the one emulated device there used to be.
        p.uuid[8] = d as u8;
        p.attributes[attr::PCI_BUS_ID] = d as i32;
        Ok(p)
    }

    fn device_attribute(&self, device: i32, attribute: i32) -> Result<i32, CudaError> {
        let d = self.index(device)?;
        match usize::try_from(attribute) {
            Ok(attr::PCI_BUS_ID) => Ok(d as i32),
            Ok(a) if (1..=attr::LAST).contains(&a) => Ok(self.properties.attributes[a]),
            _ => Err(CudaError::InvalidValue),
        }
    }

    fn driver_version(&self) -> i32 {
        13000
    }

    fn mem_info(&self, device: i32) -> Result<(u64, u64), CudaError> {
        let used = self.mapped[self.index(device)?].load(Ordering::Relaxed);
        Ok((self.total_memory.saturating_sub(used), self.total_memory))
    }

    fn bind(&self, device: i32) -> Result<(), CudaError> {
        self.check_device(device)
    }

    fn device_synchronize(&self, device: i32) -> Result<(), CudaError> {
        self.check_device(device)?;
        self.pass_gates();
        Ok(())
    }

    fn limit(&self, device: i32, limit: i32) -> Result<u64, CudaError> {
        self.check_device(device)?;
        let i = usize::try_from(limit).ok().filter(|&i| i < LIMITS).ok_or(CudaError::UnsupportedLimit)?;
        Ok(self.limits.lock()[i])
    }

    fn set_limit(&self, device: i32, limit: i32, value: u64) -> Result<(), CudaError> {
        self.check_device(device)?;
        let i = usize::try_from(limit).ok().filter(|&i| i < LIMITS).ok_or(CudaError::UnsupportedLimit)?;
        let l2 = self.properties.attributes[attr::L2_CACHE_SIZE] as u64;
        // What CUDA documents for each limit, as a driver of this compute capability (9.0)
        // answers it.
        let value = match i {
            // A thread's stack is its local memory: at most 512 KiB. The driver rounds the
            // size up to a multiple of 16 bytes.
            0 if value > MAX_STACK => return Err(CudaError::InvalidValue),
            0 => value.div_ceil(16) * 16,
            // The printf FIFO and the malloc heap are device memory the driver reserves.
            1 | 2 if value > self.total_memory => return Err(CudaError::MemoryAllocation),
            // "Only applicable to devices of compute capability < 9.0."
            3 => return Err(CudaError::UnsupportedLimit),
            // A hint "between 0 and 128" bytes.
            5 if value > 128 => return Err(CudaError::InvalidValue),
            // A hint the driver clamps to what the L2 cache can set aside.
            6 => value.min(l2),
            _ => value,
        };
        self.limits.lock()[i] = value;
        Ok(())
    }

    fn cache_config(&self, device: i32) -> Result<i32, CudaError> {
        self.check_device(device)?;
        Ok(self.cache_config.load(Ordering::Relaxed))
    }

    fn set_cache_config(&self, device: i32, config: i32) -> Result<(), CudaError> {
        self.check_device(device)?;
        self.cache_config.store(config, Ordering::Relaxed);
        Ok(())
    }

    fn shared_mem_config(&self, device: i32) -> Result<i32, CudaError> {
        self.check_device(device)?;
        Ok(self.shared_mem_config.load(Ordering::Relaxed))
    }

    fn set_shared_mem_config(&self, device: i32, _config: i32) -> Result<(), CudaError> {
        // Four-byte banks are the only size, as on every GPU since Volta.
        self.check_device(device)
    }

    fn stream_priority_range(&self, device: i32) -> Result<(i32, i32), CudaError> {
        self.check_device(device)?;
        Ok((0, -5))
    }

    fn can_access_peer(&self, device: i32, peer: i32) -> Result<bool, CudaError> {
        self.check_device(device)?;
        self.check_device(peer)?;
        Ok(false)
    }

    fn enable_peer_access(&self, device: i32, peer: i32) -> Result<(), CudaError> {
        self.check_device(device)?;
        self.check_device(peer)?;
        Err(CudaError::PeerAccessUnsupported)
    }

    fn disable_peer_access(&self, device: i32, peer: i32) -> Result<(), CudaError> {
        self.check_device(device)?;
        self.check_device(peer)?;
        Err(CudaError::PeerAccessNotEnabled)
    }

    fn reset_persisting_l2_cache(&self, device: i32) -> Result<(), CudaError> {
        self.check_device(device)
    }

    // Emu's contexts use the whole device.
    fn exec_affinity_support(&self, device: i32, _kind: i32) -> Result<i32, CudaError> {
        self.check_device(device)?;
        Ok(0)
    }

    // Nothing writes into emu's memory from outside the server.
    fn flush_rdma_writes(&self, device: i32, _target: i32, _scope: i32) -> Result<(), CudaError> {
        self.check_device(device)
    }
}

impl VirtualMemory for EmuBackend {
    fn reserve(&self, base: u64, size: u64) -> Result<(), CudaError> {
        // SAFETY: MAP_FIXED_NOREPLACE never replaces a mapping: it fails where the range is
        // taken, so nothing of the process is touched.
        let p = unsafe {
            libc::mmap(
                base as *mut libc::c_void,
                size as usize,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_FIXED_NOREPLACE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED || p as u64 != base {
            if p != libc::MAP_FAILED {
                // SAFETY: the mapping just made elsewhere, used by nothing.
                unsafe { libc::munmap(p, size as usize) };
            }
            tracing::error!(
                "cannot reserve the device address range {base:#x}+{size:#x}: {}",
                std::io::Error::last_os_error()
            );
            return Err(CudaError::MemoryAllocation);
        }
        Ok(())
    }

    fn unreserve(&self, base: u64, size: u64) {
        // SAFETY: the session's reservation, which nothing uses once the session has gone.
        unsafe { libc::munmap(base as *mut libc::c_void, size as usize) };
    }

    fn granularity(&self, _device: i32) -> u64 {
        2 << 20
    }

    fn map(&self, device: i32, addr: u64, size: u64) -> Result<Physical, CudaError> {
        let d = self.index(device)?;
        if self.mapped[d].load(Ordering::Relaxed) + size > self.total_memory {
            return Err(CudaError::MemoryAllocation);
        }
        // SAFETY: `[addr, addr + size)` is a free part of the session's reservation (the
        // address space decided); opening it changes no memory.
        let r = unsafe { libc::mprotect(addr as *mut libc::c_void, size as usize, libc::PROT_READ | libc::PROT_WRITE) };
        if r != 0 {
            return Err(CudaError::MemoryAllocation);
        }
        self.mapped[d].fetch_add(size, Ordering::Relaxed);
        // The physical memory's handle is its device, which `unmap` gives it back to.
        Ok(d as Physical)
    }

    fn unmap(&self, addr: u64, size: u64, physical: Physical) -> Result<(), CudaError> {
        debug_assert_eq!(addr % PAGE, 0);
        if self.shared.lock().remove(&addr).is_some() {
            // A shared block: the other process keeps the file's pages; this process's range
            // goes back to the reservation as it was.
            // SAFETY: a range of the session's reservation that `export_block` or
            // `import_block` mapped and nothing uses now; MAP_FIXED replaces that mapping only.
            let p = unsafe {
                libc::mmap(
                    addr as *mut libc::c_void,
                    size as usize,
                    libc::PROT_NONE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_FIXED,
                    -1,
                    0,
                )
            };
            if p == libc::MAP_FAILED {
                tracing::error!("giving back a shared block at {addr:#x}: {}", std::io::Error::last_os_error());
                return Err(CudaError::Unknown);
            }
            if let Some(m) = usize::try_from(physical).ok().and_then(|d| self.mapped.get(d)) {
                m.fetch_sub(size, Ordering::Relaxed);
            }
            return Ok(());
        }
        // Give the pages back and make stray accesses fault.
        // SAFETY: a range `map` opened, which the session no longer uses (its allocation is
        // freed, and kernels hold the memory view while they run): its contents may go.
        unsafe { libc::madvise(addr as *mut libc::c_void, size as usize, libc::MADV_DONTNEED) };
        // SAFETY: the same range, part of the session's reservation: closing it unmaps nothing.
        unsafe { libc::mprotect(addr as *mut libc::c_void, size as usize, libc::PROT_NONE) };
        if let Some(m) = usize::try_from(physical).ok().and_then(|d| self.mapped.get(d)) {
            m.fetch_sub(size, Ordering::Relaxed);
        }
        Ok(())
    }

    fn export_block(&self, addr: u64, len: u64, _physical: Physical) -> Result<std::os::fd::OwnedFd, CudaError> {
        use std::os::fd::FromRawFd;
        let mut shared = self.shared.lock();
        if let Some(Some(file)) = shared.get(&addr) {
            return file.try_clone().map_err(|_| CudaError::MapBufferObjectFailed);
        }
        if shared.contains_key(&addr) {
            // Opened from another session: not this session's to export.
            return Err(CudaError::InvalidValue);
        }
        // SAFETY: a NUL-terminated name; the flags are memfd_create's.
        let raw = unsafe { libc::memfd_create(c"phos-ipc".as_ptr(), libc::MFD_CLOEXEC) };
        if raw < 0 {
            return Err(CudaError::MapBufferObjectFailed);
        }
        // SAFETY: a descriptor memfd_create just opened, owned by nothing else.
        let file = unsafe { std::os::fd::OwnedFd::from_raw_fd(raw) };
        let mut f = std::fs::File::from(file.try_clone().map_err(|_| CudaError::MapBufferObjectFailed)?);
        // The block's contents move into the file, which then backs the block.
        // SAFETY: `[addr, addr + len)` is the mapped block (the caller holds the map's write
        // lock, so nothing writes it meanwhile).
        let contents = unsafe { std::slice::from_raw_parts(addr as *const u8, len as usize) };
        std::io::Write::write_all(&mut f, contents).map_err(|_| CudaError::MapBufferObjectFailed)?;
        Self::map_shared(&file, addr, len)?;
        let out = file.try_clone().map_err(|_| CudaError::MapBufferObjectFailed)?;
        shared.insert(addr, Some(file));
        Ok(out)
    }

    fn import_block(
        &self,
        device: i32,
        file: &std::os::fd::OwnedFd,
        addr: u64,
        len: u64,
    ) -> Result<Physical, CudaError> {
        let d = self.index(device)?;
        let f = std::fs::File::from(file.try_clone().map_err(|_| CudaError::MapBufferObjectFailed)?);
        // A file shorter than the block would fault on access: refuse it.
        if f.metadata().map(|m| m.len()).unwrap_or(0) < len {
            return Err(CudaError::MapBufferObjectFailed);
        }
        Self::map_shared(file, addr, len)?;
        self.shared.lock().insert(addr, None);
        self.mapped[d].fetch_add(len, Ordering::Relaxed);
        // The physical memory's handle is its device, as `map`'s.
        Ok(d as Physical)
    }
}

impl EmuBackend {
    /// Map `file` shared at `[addr, addr + len)`, replacing what is there.
    fn map_shared(file: &std::os::fd::OwnedFd, addr: u64, len: u64) -> Result<(), CudaError> {
        use std::os::fd::AsRawFd;
        // SAFETY: `[addr, addr + len)` is a range of the session's reservation the address
        // space gave for this block (the caller holds the map's write lock: no kernel and no
        // copy uses it); MAP_FIXED replaces that mapping only.
        let p = unsafe {
            libc::mmap(
                addr as *mut libc::c_void,
                len as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_FIXED,
                file.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            tracing::warn!("mapping a shared block at {addr:#x}: {}", std::io::Error::last_os_error());
            return Err(CudaError::MapBufferObjectFailed);
        }
        Ok(())
    }
}

impl Copies for EmuBackend {
    fn prepare_hashing(&self, device: i32) -> Result<(), CudaError> {
        self.index(device).map(|_| ())
    }

    /// The same function as the GPU's kernel, on the CPU.
    fn hash_blocks(&self, device: i32, blocks: &[(u64, u64)]) -> Result<Vec<u64>, CudaError> {
        self.index(device)?;
        let _work = self.work.lock();
        let mut buf = Vec::new();
        Ok(blocks
            .iter()
            .map(|&(addr, len)| {
                buf.resize(len as usize, 0);
                // SAFETY: the engine's ranges, of the session's mapped memory (see the trait),
                // which `buf`, a host buffer, is not part of; copied as `memcpy_dtoh` does.
                unsafe { std::ptr::copy_nonoverlapping(addr as *const u8, buf.as_mut_ptr(), buf.len()) };
                phos_checkpoint::piece_hash::block_hash(&buf)
            })
            .collect())
    }

    fn memcpy_htod(&self, dst: u64, src: &[u8], stream: Option<StreamRef>) -> Result<(), CudaError> {
        match stream {
            Some(s) => self.check_stream(s)?,
            None => self.pass_gates(),
        }
        let _work = self.work.lock();
        // SAFETY: the service checked [dst, dst + len) against the session's mapped memory,
        // which `src`, a host buffer, is not part of.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst as *mut u8, src.len()) };
        Ok(())
    }

    fn memcpy_dtoh(&self, dst: &mut [u8], src: u64, stream: Option<StreamRef>) -> Result<(), CudaError> {
        match stream {
            Some(s) => self.check_stream(s)?,
            None => self.pass_gates(),
        }
        let _work = self.work.lock();
        // SAFETY: the service checked [src, src + len) against the session's mapped memory,
        // which `dst`, a host buffer, is not part of.
        unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    fn memcpy_dtod(&self, dst: u64, src: u64, len: u64, stream: Option<StreamRef>) -> Result<(), CudaError> {
        match stream {
            Some(s) => self.check_stream(s)?,
            None => self.pass_gates(),
        }
        let _work = self.work.lock();
        // SAFETY: the service checked both ranges against the session's mapped memory; they
        // may overlap (`copy`, not `copy_nonoverlapping`).
        unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, len as usize) };
        Ok(())
    }

    fn memset(&self, dst: u64, value: u8, len: u64, stream: Option<StreamRef>) -> Result<(), CudaError> {
        match stream {
            Some(s) => self.check_stream(s)?,
            None => self.pass_gates(),
        }
        let _work = self.work.lock();
        // SAFETY: the service checked [dst, dst + len) against the session's mapped memory.
        unsafe { std::ptr::write_bytes(dst as *mut u8, value, len as usize) };
        Ok(())
    }
}

impl HostMemory for EmuBackend {
    fn copy_pool(&self) -> Option<&super::copy_pool::CopyPool> {
        Some(&self.copies)
    }

    fn register_host(&self, addr: u64, _len: u64) -> Result<u64, CudaError> {
        // Device memory is host memory here: the device reaches it at its own address.
        Ok(addr)
    }

    fn unregister_host(&self, _addr: u64) {}

    fn memcpy_registered(
        &self,
        device: u64,
        host: u64,
        len: u64,
        to_device: bool,
        stream: Option<StreamRef>,
    ) -> Result<(), CudaError> {
        match stream {
            Some(s) => self.check_stream(s)?,
            None => self.pass_gates(),
        }
        let _work = self.work.lock();
        let (dst, src) = if to_device { (device, host) } else { (host, device) };
        // SAFETY: the service checked the device range and that the host range is a live
        // allocation of the mapped arena or a staging slot (both mapped in this process). The
        // guest can write the host side meanwhile: a raw copy, with no reference made to it,
        // reads whatever bytes are there (as `vm-memory`'s volatile copies do).
        unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, len as usize) };
        Ok(())
    }
}

impl Streams for EmuBackend {
    fn stream_create(&self, device: i32, _flags: u32, _priority: i32) -> Result<Raw, CudaError> {
        self.check_device(device)?;
        let raw = self.fresh();
        self.streams.lock().insert(raw, ());
        Ok(raw)
    }

    fn stream_destroy(&self, stream: Raw) -> Result<(), CudaError> {
        self.streams.lock().remove(&stream).map(|_| ()).ok_or(CudaError::InvalidResourceHandle)
    }

    fn stream_synchronize(&self, stream: StreamRef) -> Result<(), CudaError> {
        self.check_stream(stream)
    }

    fn stream_query(&self, stream: StreamRef) -> Result<bool, CudaError> {
        // Not ready while a host function's gate is closed, and never waiting for one: the
        // callback thread asks this while it waits at a gate of its own.
        if let StreamRef::Created(raw) = stream
            && !self.streams.lock().contains_key(&raw)
        {
            return Err(CudaError::InvalidResourceHandle);
        }
        Ok(self.gates.lock().iter().all(|g| g.is_open()))
    }

    fn stream_wait_event(&self, stream: StreamRef, event: Raw) -> Result<(), CudaError> {
        // Work runs in submission order, so the event's work is already done.
        self.check_stream(stream)?;
        self.events.lock().get(&event).map(|_| ()).ok_or(CudaError::InvalidResourceHandle)
    }

    fn stream_mem_op(&self, stream: StreamRef, op: MemOp) -> Result<(), CudaError> {
        self.check_stream(stream)?;
        match op {
            MemOp::Wait { .. } => {
                if !Self::holds(&op) {
                    self.waits.lock().push((stream, op));
                }
            }
            MemOp::Write { addr, value, wide, .. } => {
                let _work = self.work.lock();
                if wide {
                    // SAFETY: the service checked the address is the session's memory, aligned
                    // to the width; volatile, as another stream's wait reads it.
                    unsafe { std::ptr::write_volatile(addr as *mut u64, value) };
                } else {
                    // SAFETY: as above, four bytes.
                    unsafe { std::ptr::write_volatile(addr as *mut u32, value as u32) };
                }
            }
            // Writes land in memory the host reads directly: nothing is left to flush.
            MemOp::Flush => {}
        }
        Ok(())
    }

    fn host_func(&self, stream: StreamRef, gate: Arc<Gate>) -> Result<(), CudaError> {
        self.check_stream(stream)?;
        // The work before it ran when it was submitted.
        gate.reach();
        self.gates.lock().push(gate);
        Ok(())
    }
}

impl Events for EmuBackend {
    fn event_create(&self, device: i32, flags: u32) -> Result<Raw, CudaError> {
        self.check_device(device)?;
        let raw = self.fresh();
        self.events.lock().insert(raw, Event { flags, recorded: None });
        Ok(raw)
    }

    fn event_destroy(&self, event: Raw) -> Result<(), CudaError> {
        self.events.lock().remove(&event).map(|_| ()).ok_or(CudaError::InvalidResourceHandle)
    }

    fn event_record(&self, event: Raw, stream: StreamRef) -> Result<(), CudaError> {
        self.check_stream(stream)?;
        let mut events = self.events.lock();
        let e = events.get_mut(&event).ok_or(CudaError::InvalidResourceHandle)?;
        e.recorded = Some(Instant::now());
        Ok(())
    }

    fn event_synchronize(&self, event: Raw) -> Result<(), CudaError> {
        self.events.lock().get(&event).map(|_| ()).ok_or(CudaError::InvalidResourceHandle)
    }

    fn event_query(&self, event: Raw) -> Result<bool, CudaError> {
        self.events.lock().get(&event).map(|_| true).ok_or(CudaError::InvalidResourceHandle)
    }

    fn event_elapsed(&self, start: Raw, end: Raw) -> Result<f32, CudaError> {
        let events = self.events.lock();
        let (a, b) = match (events.get(&start), events.get(&end)) {
            (Some(a), Some(b)) => (a, b),
            _ => return Err(CudaError::InvalidResourceHandle),
        };
        if (a.flags | b.flags) & EVENT_DISABLE_TIMING != 0 {
            return Err(CudaError::InvalidResourceHandle);
        }
        match (a.recorded, b.recorded) {
            (Some(ta), Some(tb)) => {
                let ms = if tb >= ta { (tb - ta).as_secs_f64() * 1e3 } else { -((ta - tb).as_secs_f64() * 1e3) };
                Ok(ms as f32)
            }
            _ => Err(CudaError::InvalidResourceHandle),
        }
    }

    fn event_export(&self, event: Raw) -> Result<[u8; 64], CudaError> {
        self.events.lock().get(&event).map(|_| [0; 64]).ok_or(CudaError::InvalidResourceHandle)
    }

    fn event_import(&self, device: i32, _exported: &[u8; 64]) -> Result<Raw, CudaError> {
        // Work runs in submission order, in each process before the call that submitted it
        // returns: whatever another process recorded is done, so the opened event is a
        // completed one of this process.
        self.event_create(device, EVENT_DISABLE_TIMING | 0x4)
    }
}

impl Modules for EmuBackend {
    fn module_load(&self, device: i32, image: &[u8]) -> Result<LoadedModule, CudaError> {
        self.check_device(device)?;
        let ptx = ptx_of(image).map_err(|e| {
            tracing::warn!("emu: cannot read the module image: {e}");
            CudaError::InvalidKernelImage
        })?;
        // Only machine code for real GPUs: nothing the emulator can run.
        let ptx = ptx.ok_or(CudaError::NoKernelImageForDevice)?;
        let module = phos_ptx::parse(&ptx).map_err(|e| {
            tracing::warn!("emu: cannot parse the module's PTX: {e}");
            CudaError::InvalidPtx
        })?;
        let kernels = kernel_meta(&module);
        let mut program = Program::new(&module);
        let (variables, storage) = allocate_variables(&mut program, self.total_memory)?;
        let regions = variables.iter().map(|(name, &(addr, size))| (name.clone(), addr, size)).collect();
        let raw = self.fresh();
        self.modules.lock().insert(raw, Module { program: Arc::new(program), kernels, variables, storage });
        Ok(LoadedModule { raw, variables: regions })
    }

    fn link(&self, device: i32, inputs: &phos_protocol::jit_link::LinkInputs<'_>) -> super::LinkOutcome {
        if let Err(e) = self.check_device(device) {
            return super::LinkOutcome::failed(e.0, "no such device");
        }
        super::emu_link::link(inputs)
    }

    fn module_unload(&self, module: Raw) -> Result<(), CudaError> {
        self.modules.lock().remove(&module).map(|_| ()).ok_or(CudaError::InvalidResourceHandle)
    }

    fn module_function(&self, module: Raw, name: &str) -> Result<Raw, CudaError> {
        let modules = self.modules.lock();
        let m = modules.get(&module).ok_or(CudaError::InvalidResourceHandle)?;
        let Some(info) = m.program.kernel(name) else {
            return Err(CudaError::SymbolNotFound);
        };
        let meta = m.kernels.get(name).copied().unwrap_or_default();
        let raw = self.fresh();
        let function = Function {
            program: m.program.clone(),
            name: name.to_string(),
            meta,
            max_dynamic_shared: DEFAULT_DYNAMIC_SHARED.saturating_sub(info.static_shared) as u32,
            carveout: -1,
            cache_config: 0,
        };
        self.functions.lock().insert(raw, function);
        Ok(raw)
    }

    fn module_global(&self, module: Raw, name: &str) -> Result<(u64, u64), CudaError> {
        let modules = self.modules.lock();
        let m = modules.get(&module).ok_or(CudaError::InvalidResourceHandle)?;
        m.variables.get(name).copied().ok_or(CudaError::SymbolNotFound)
    }

    fn function_attributes(&self, function: Raw) -> Result<FuncAttributes, CudaError> {
        let f = self.functions.lock().get(&function).cloned().ok_or(CudaError::InvalidResourceHandle)?;
        let info = f.program.kernel(&f.name).ok_or(CudaError::InvalidDeviceFunction)?;
        Ok(FuncAttributes {
            shared_size_bytes: info.static_shared,
            const_size_bytes: 0,
            local_size_bytes: info.local_size,
            max_threads_per_block: f.meta.max_threads as i32,
            // The interpreter has no register file.
            num_regs: 0,
            ptx_version: f.meta.ptx_version,
            // The PTX is compiled for the device it runs on, as the driver's JIT compiles it.
            binary_version: self.compute_capability(),
            cache_mode_ca: 0,
            max_dynamic_shared_size_bytes: f.max_dynamic_shared as i32,
            preferred_shmem_carveout: f.carveout,
            ..FuncAttributes::default()
        })
    }

    fn function_set_attribute(&self, function: Raw, attr: i32, value: i32) -> Result<(), CudaError> {
        let mut functions = self.functions.lock();
        let f = functions.get_mut(&function).ok_or(CudaError::InvalidResourceHandle)?;
        let static_shared = f.program.kernel(&f.name).map(|k| k.static_shared).unwrap_or(0);
        let optin = self.properties.attributes[attr::MAX_SHARED_MEMORY_PER_BLOCK_OPTIN] as u64;
        match attr {
            // cudaFuncAttributeMaxDynamicSharedMemorySize
            8 if value >= 0 && value as u64 + static_shared <= optin => f.max_dynamic_shared = value as u32,
            // cudaFuncAttributePreferredSharedMemoryCarveout
            9 if (-1..=100).contains(&value) => f.carveout = value,
            _ => return Err(CudaError::InvalidValue),
        }
        Ok(())
    }

    fn function_set_cache_config(&self, function: Raw, config: i32) -> Result<(), CudaError> {
        let mut functions = self.functions.lock();
        functions.get_mut(&function).ok_or(CudaError::InvalidResourceHandle)?.cache_config = config;
        Ok(())
    }

    fn occupancy(&self, function: Raw, block_size: i32, dynamic_smem: u64, _flags: u32) -> Result<i32, CudaError> {
        let f = self.functions.lock().get(&function).cloned().ok_or(CudaError::InvalidResourceHandle)?;
        if block_size <= 0 || block_size as u32 > f.meta.max_threads {
            return Ok(0);
        }
        let a = &self.properties.attributes;
        let warps = (block_size as i64 + 31) / 32;
        let by_threads = a[attr::MAX_THREADS_PER_MULTIPROCESSOR] as i64 / (warps * 32);
        let static_shared = f.program.kernel(&f.name).map(|k| k.static_shared).unwrap_or(0);
        let shared = static_shared + dynamic_smem;
        let by_shared = if shared == 0 {
            i64::MAX
        } else {
            let per_block = shared + a[attr::RESERVED_SHARED_MEMORY_PER_BLOCK] as u64;
            (a[attr::MAX_SHARED_MEMORY_PER_MULTIPROCESSOR] as u64 / per_block) as i64
        };
        let blocks = by_threads.min(by_shared).min(a[attr::MAX_BLOCKS_PER_MULTIPROCESSOR] as i64);
        Ok(blocks.max(0) as i32)
    }

    fn max_active_clusters(
        &self,
        function: Raw,
        _grid: Dim3,
        block: Dim3,
        smem: u32,
        cluster: Option<Dim3>,
    ) -> Result<i32, CudaError> {
        match cluster {
            Some(Dim3 { x: 1, y: 1, z: 1 }) => self.one_block_clusters(function, block, smem),
            // No cluster size given (kernels here have none of their own), or one of zero.
            None => Err(CudaError::InvalidClusterSize),
            Some(c) if c.x == 0 || c.y == 0 || c.z == 0 => Err(CudaError::InvalidClusterSize),
            Some(_) => Err(CudaError::NotSupported),
        }
    }

    fn max_potential_cluster_size(&self, function: Raw, _grid: Dim3, block: Dim3, smem: u32) -> Result<i32, CudaError> {
        // One block, where one fits at all.
        Ok(i32::from(self.one_block_clusters(function, block, smem)? > 0))
    }

    fn available_dynamic_smem(&self, function: Raw, blocks: i32, block_size: i32) -> Result<u64, CudaError> {
        let f = self.functions.lock().get(&function).cloned().ok_or(CudaError::InvalidResourceHandle)?;
        let a = &self.properties.attributes;
        if blocks <= 0 || block_size <= 0 || block_size as u32 > f.meta.max_threads {
            return Ok(0);
        }
        let warps = (block_size as i64 + 31) / 32;
        if i64::from(blocks) * warps * 32 > a[attr::MAX_THREADS_PER_MULTIPROCESSOR] as i64 {
            return Ok(0);
        }
        let static_shared = f.program.kernel(&f.name).map(|k| k.static_shared).unwrap_or(0);
        let per_block = a[attr::MAX_SHARED_MEMORY_PER_MULTIPROCESSOR] as u64 / blocks as u64;
        let usable = per_block.saturating_sub(a[attr::RESERVED_SHARED_MEMORY_PER_BLOCK] as u64 + static_shared);
        Ok(usable.min((a[attr::MAX_SHARED_MEMORY_PER_BLOCK_OPTIN] as u64).saturating_sub(static_shared)))
    }
}

impl EmuBackend {
    /// The device's compute capability as CUDA writes architectures (9.0 is 90).
    fn compute_capability(&self) -> i32 {
        let a = &self.properties.attributes;
        a[attr::COMPUTE_CAPABILITY_MAJOR] * 10 + a[attr::COMPUTE_CAPABILITY_MINOR]
    }

    /// Clusters are of one block here (the interpreter runs no distributed shared memory):
    /// as many clusters as blocks fit on the device at once.
    fn one_block_clusters(&self, function: Raw, block: Dim3, smem: u32) -> Result<i32, CudaError> {
        // A guest's dimensions: their product may not fit.
        let threads = u64::from(block.x).saturating_mul(u64::from(block.y)).saturating_mul(u64::from(block.z));
        if threads == 0 {
            return Err(CudaError::InvalidValue);
        }
        let per_sm = self.occupancy(function, i32::try_from(threads).unwrap_or(i32::MAX), u64::from(smem), 0)?;
        Ok(per_sm.saturating_mul(self.properties.attributes[attr::MULTIPROCESSOR_COUNT]))
    }
}

/// cuBLAS runs on the server's CPU BLAS, cuRAND on its CPU generator.
impl Libraries for EmuBackend {}

impl Arrays for EmuBackend {
    fn array_create(&self, device: i32, spec: &ArraySpec) -> Result<Raw, CudaError> {
        let d = self.index(device)?;
        let mapped = &self.mapped[d];
        // Arrays count against the device's memory, as on a GPU: taken before anything is
        // mapped, given back if the array cannot be made.
        let bytes = ArrayStore::bytes(spec)?;
        if mapped.fetch_add(bytes, Ordering::Relaxed) + bytes > self.total_memory {
            mapped.fetch_sub(bytes, Ordering::Relaxed);
            return Err(CudaError::MemoryAllocation);
        }
        let raw = self.fresh();
        self.arrays.lock().create(raw, spec).inspect_err(|_| {
            mapped.fetch_sub(bytes, Ordering::Relaxed);
        })?;
        self.array_devices.lock().insert(raw, d);
        Ok(raw)
    }

    fn array_destroy(&self, array: Raw, _mipmapped: bool) -> Result<(), CudaError> {
        // Kernels read arrays while they run: wait for the work before.
        let _work = self.work.lock();
        let bytes = self.arrays.lock().destroy(array)?;
        let d = self.array_devices.lock().remove(&array).unwrap_or(0);
        self.mapped[d].fetch_sub(bytes, Ordering::Relaxed);
        Ok(())
    }

    fn mipmap_level(&self, mipmap: Raw, level: u32) -> Result<Raw, CudaError> {
        let raw = self.fresh();
        self.arrays.lock().level(mipmap, level, raw)?;
        Ok(raw)
    }

    fn array_copy(
        &self,
        dst: ArraySide<'_>,
        src: ArraySide<'_>,
        extent: [u64; 3],
        stream: Option<StreamRef>,
    ) -> Result<(), CudaError> {
        match stream {
            Some(s) => self.check_stream(s)?,
            None => self.pass_gates(),
        }
        let _work = self.work.lock();
        self.arrays.lock().copy(dst, src, extent)
    }

    fn texture_create(
        &self,
        source: &TextureSource,
        desc: &TextureDesc,
        view: Option<&ResourceViewWire>,
    ) -> Result<u64, CudaError> {
        let handle = self.fresh();
        self.arrays.lock().texture(handle, source, desc, view)?;
        Ok(handle)
    }

    fn texture_destroy(&self, texture: u64) -> Result<(), CudaError> {
        let _work = self.work.lock();
        self.arrays.lock().destroy_texture(texture)
    }

    fn surface_create(&self, array: Raw) -> Result<u64, CudaError> {
        let handle = self.fresh();
        self.arrays.lock().surface(handle, array)?;
        Ok(handle)
    }

    fn surface_destroy(&self, surface: u64) -> Result<(), CudaError> {
        let _work = self.work.lock();
        self.arrays.lock().destroy_surface(surface)
    }

    /// Under `value` itself, where no object has it; never handed out fresh afterwards.
    fn texture_create_as(
        &self,
        value: u64,
        source: &TextureSource,
        desc: &TextureDesc,
        view: Option<&ResourceViewWire>,
    ) -> Result<u64, CudaError> {
        let mut store = self.arrays.lock();
        if value == 0 || store.has_object(value) {
            return Err(CudaError::InvalidValue);
        }
        self.next.fetch_max(value.saturating_add(1), Ordering::Relaxed);
        store.texture(value, source, desc, view)?;
        Ok(value)
    }

    fn surface_create_as(&self, value: u64, array: Raw) -> Result<u64, CudaError> {
        let mut store = self.arrays.lock();
        if value == 0 || store.has_object(value) {
            return Err(CudaError::InvalidValue);
        }
        self.next.fetch_max(value.saturating_add(1), Ordering::Relaxed);
        store.surface(value, array)?;
        Ok(value)
    }
}

impl Launch for EmuBackend {
    fn launch(
        &self,
        function: Raw,
        grid: Dim3,
        block: Dim3,
        shared_mem: u32,
        stream: StreamRef,
        params: &[u8],
        memory: &MemoryView<'_>,
        printed: &mut Vec<u8>,
        _measure: bool,
        cooperative: bool,
    ) -> Result<(), CudaError> {
        self.check_stream(stream)?;
        let f = self.functions.lock().get(&function).cloned().ok_or(CudaError::InvalidResourceHandle)?;
        // As on a GPU: more threads than the kernel's bounds, or more dynamic shared memory
        // than it opted in to, fail the launch.
        if block.volume() > u64::from(f.meta.max_threads) {
            return Err(CudaError::InvalidValue);
        }
        if shared_mem > f.max_dynamic_shared {
            return Err(CudaError::InvalidValue);
        }
        // A cooperative grid must fit on the device at once.
        if cooperative {
            let per_sm = self.occupancy(function, block.volume() as i32, u64::from(shared_mem), 0)?;
            let sms = self.properties.attributes[attr::MULTIPROCESSOR_COUNT];
            if grid.volume() > (per_sm as u64) * (sms as u64) {
                return Err(CudaError::CooperativeLaunchTooLarge);
            }
        }
        let (program, name) = (f.program, f.name);
        let launch = exec::Launch {
            grid: [grid.x, grid.y, grid.z],
            block: [block.x, block.y, block.z],
            dynamic_shared: shared_mem,
            params,
        };
        let _work = self.work.lock();
        let (resources, memory) = self.arrays.lock().for_launch(memory);
        let started = std::time::Instant::now();
        let options = exec::RunOptions { workers: self.workers, max_warp_instructions: self.kernel_limit };
        let result = exec::run_with_resources(&program, &name, &launch, &memory, &resources, printed, &options);
        // A kernel that failed is not counted: the router takes the failure as a launch
        // that will not be measured, and counts the kernels measured against its own.
        if result.is_ok() {
            self.kernel_ns.fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
            self.kernels.fetch_add(1, Ordering::Relaxed);
        }
        match result {
            Ok(_) => Ok(()),
            Err(e) => {
                match &e {
                    exec::ExecError::Unsupported { .. } | exec::ExecError::NotFound(_) => tracing::warn!("emu: {e}"),
                    _ => tracing::info!("emu: {e}"),
                }
                Err(CudaError(e.cuda_error()))
            }
        }
    }

    fn device_time(&self) -> (u64, u64) {
        (self.kernel_ns.load(Ordering::Relaxed), self.kernels.load(Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A wait that does not hold when submitted holds back its own stream's next work (and
    /// a synchronisation) until another stream's write makes it hold; the other streams'
    /// work goes on meanwhile.
    #[test]
    fn a_stream_waits_for_a_value_another_stream_writes() {
        let emu = Arc::new(EmuBackend::new(1 << 20));
        let (a, b) = (emu.stream_create(0, 1, 0).unwrap(), emu.stream_create(0, 1, 0).unwrap());
        let cell = Box::new([0u64; 2]);
        let addr = cell.as_ptr() as u64;
        let wait = MemOp::Wait { addr, value: 3, wide: false, flags: 0 }; // GEQ
        emu.stream_mem_op(StreamRef::Created(b), wait).unwrap();
        // Stream a is not held back.
        emu.stream_mem_op(StreamRef::Created(a), MemOp::Write { addr: addr + 8, value: 1, wide: true, flags: 0 })
            .unwrap();
        let waiting = {
            let emu = emu.clone();
            std::thread::spawn(move || emu.stream_synchronize(StreamRef::Created(b)))
        };
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(!waiting.is_finished(), "stream b waits for its value");
        emu.stream_mem_op(StreamRef::Created(a), MemOp::Write { addr, value: 5, wide: false, flags: 1 }).unwrap();
        waiting.join().unwrap().unwrap();
        assert_eq!(*cell, [5, 1]);
        drop(cell);
    }

    #[test]
    fn wait_conditions_are_the_drivers() {
        let s = MemOp::satisfied;
        assert!(s(5, false, 0, 5) && s(5, false, 0, 6) && !s(5, false, 0, 4));
        assert!(s(0xffff_fff0, false, 0, 2), "GEQ is cyclic: 2 is 18 past 0xfffffff0");
        assert!(s(7, false, 1, 7) && !s(7, false, 1, 8));
        assert!(s(6, false, 2, 7) && !s(8, false, 2, 7));
        assert!(s(0xffff_fff0, false, 3, 7) && !s(0xffff_fff8, false, 3, 7));
        assert!(s(1 << 40, true, 0, (1 << 40) + 1) && !s(1 << 40, true, 0, 1));
    }

    /// Arrays count against the device's memory; their texels survive copies in and out, and
    /// a level of a mipmapped array is its own region of the storage.
    #[test]
    fn arrays_take_device_memory_and_keep_their_texels() {
        use phos_ptx::exec::{ChannelFormat, ChannelType};
        let emu = EmuBackend::new(1 << 20);
        let format = ChannelFormat { ty: ChannelType::U8, channels: 1 };
        let whole = ArraySpec { format, extent: [1024, 1024, 0], flags: 0, levels: None };
        let a = emu.array_create(0, &whole).unwrap();
        assert_eq!(emu.array_create(0, &whole), Err(CudaError::MemoryAllocation), "the device is full");
        emu.array_destroy(a, false).unwrap();
        let mip = ArraySpec { format, extent: [8, 4, 0], flags: 0, levels: Some(3) };
        let m = emu.array_create(0, &mip).unwrap();
        let (l0, l1) = (emu.mipmap_level(m, 0).unwrap(), emu.mipmap_level(m, 1).unwrap());
        assert_eq!(emu.mipmap_level(m, 3), Err(CudaError::InvalidValue));
        let texels: Vec<u8> = (0..32).collect();
        let at = |raw| ArraySide::Array { raw, x: 0, y: 0, z: 0 };
        emu.array_copy(at(l0), ArraySide::Host(&texels), [8, 4, 1], None).unwrap();
        emu.array_copy(at(l1), ArraySide::Host(&[100, 101, 102, 103, 104, 105, 106, 107]), [4, 2, 1], None).unwrap();
        let mut back = vec![0u8; 32];
        emu.array_copy(ArraySide::HostOut(&mut back), at(l0), [8, 4, 1], None).unwrap();
        assert_eq!(back, texels, "level 1 does not overlap level 0");
        let mut corner = [0u8; 2];
        let inner = ArraySide::Array { raw: l1, x: 2, y: 1, z: 0 };
        emu.array_copy(ArraySide::HostOut(&mut corner), inner, [2, 1, 1], None).unwrap();
        assert_eq!(corner, [106, 107]);
        // A copy past the storage is refused even if the service let it through.
        let past = ArraySide::Array { raw: l1, x: 0, y: 0, z: 1 << 20 };
        assert_eq!(
            emu.array_copy(ArraySide::HostOut(&mut corner), past, [2, 1, 1], None),
            Err(CudaError::InvalidValue)
        );
        assert_eq!(emu.array_destroy(l1, false), Err(CudaError::InvalidValue), "a level goes with its array");
        emu.array_destroy(m, true).unwrap();
        assert_eq!(emu.mipmap_level(m, 0), Err(CudaError::InvalidResourceHandle));
        emu.array_create(0, &whole).expect("all the memory is back");
    }

    #[test]
    fn a_stack_size_that_cannot_be_rounded_up_is_refused() {
        // Rounding u64::MAX up to a multiple of 16 overflowed before sizes were bounded
        // (found by the `dispatch` fuzz target).
        let emu = EmuBackend::new(1 << 20);
        assert_eq!(emu.set_limit(0, 0, u64::MAX), Err(CudaError::InvalidValue));
        emu.set_limit(0, 0, 17).unwrap();
        assert_eq!(emu.limit(0, 0), Ok(32));
    }

    fn image(variables: &str) -> Vec<u8> {
        let ptx = format!(
            ".version 7.0\n.target sm_70\n.address_size 64\n{variables}\n.visible .entry k()\n{{\n\tret;\n}}\n\0"
        );
        ptx.into_bytes()
    }

    #[test]
    fn module_variables_that_do_not_fit_the_device_are_refused() {
        let emu = EmuBackend::new(64 << 20);
        // Sizes whose sum wraps past 2^64: added unchecked, they made an 8 KiB mapping stand
        // for an exabyte of device memory the session could then reach.
        let wraps = ".global .align 4096 .b8 a[18446744073709547520];\n.global .align 4096 .b8 b[8192];";
        assert_eq!(emu.module_load(0, &image(wraps)).err(), Some(CudaError::MemoryAllocation));
        // More than the device's memory.
        let big = ".global .align 8 .b8 a[134217728];";
        assert_eq!(emu.module_load(0, &image(big)).err(), Some(CudaError::MemoryAllocation));
        // What fits loads, its variables where the module says.
        let fits = ".global .align 8 .b8 a[1048576];\n.global .align 4 .u32 b[4] = {7};";
        let loaded = emu.module_load(0, &image(fits)).unwrap();
        let b = loaded.variables.iter().find(|(n, _, _)| n == "b").unwrap();
        assert_eq!(b.2, 16);
        // SAFETY: the module's storage is mapped while the module is loaded; b is 16 bytes.
        let value = unsafe { std::ptr::read(b.1 as *const [u32; 4]) };
        assert_eq!(value, [7, 0, 0, 0]);
    }

    /// `ptxVersion` is the architecture the PTX was compiled for (CUB and Thrust choose
    /// their tuning by it), never the PTX ISA's version; `binaryVersion` is the device's,
    /// which the PTX is compiled for when loaded.
    #[test]
    fn function_attributes_name_the_ptx_architecture_and_the_device() {
        let emu = EmuBackend::new(1 << 20);
        for (target, want) in [("sm_52", 52), ("sm_70", 70), ("sm_90a", 90)] {
            let ptx =
                format!(".version 7.8\n.target {target}\n.address_size 64\n.visible .entry k()\n{{\n\tret;\n}}\n\0");
            let module = emu.module_load(0, ptx.as_bytes()).unwrap();
            let f = emu.module_function(module.raw, "k").unwrap();
            let a = emu.function_attributes(f).unwrap();
            assert_eq!((a.ptx_version, a.binary_version), (want, 90), "{target}");
        }
    }
}
