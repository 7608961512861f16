//! Backends run the session's work. [`cuda`] drives a real GPU through the CUDA driver API
//! (loaded at run time through `cudarc`, so the server builds and tests without CUDA);
//! [`emu`] executes on the CPU. Both see the same calls, in the driver's vocabulary: the
//! service layer has already translated virtual handles into the backend's raw objects and
//! checked every address against the session's memory map.

pub mod copy_pool;
pub mod cuda;
mod cuda_arrays;
pub mod cuda_hash;
mod cuda_jit;
pub mod emu;
mod emu_arrays;
mod emu_link;
mod jit_link;
pub mod mapped;
pub mod vendor;
pub mod vendor_cudnn;
pub mod vendor_cufft;
pub mod vendor_curand;
pub mod vendor_cusparse;
pub mod vendor_lt;
pub mod vendor_nvml;

use phos_protocol::CudaError;
use phos_protocol::types::{DeviceProperties, Dim3, FuncAttributes, ResourceViewWire};
use phos_ptx::exec::{ChannelFormat, TextureDesc};

use crate::registry::memory::MemoryView;

/// Device attributes of managed memory as Phos provides it, whatever the GPU would say:
/// managed memory is the guest's pinned arena, one copy both sides reach, which the host
/// may touch only while no kernel runs (for `__managed__` variables, whose host copy is
/// written back at launches and read at synchronisations): no concurrent managed access, no
/// access to the guest's pageable memory, and no direct host access to device memory. And
/// registered host memory, also arena memory, has a device pointer of its own.
pub fn managed_memory_attribute(attribute: i32) -> Option<i32> {
    match attribute {
        83 => Some(1),  // cudaDevAttrManagedMemory
        88 => Some(0),  // cudaDevAttrPageableMemoryAccess
        89 => Some(0),  // cudaDevAttrConcurrentManagedAccess
        100 => Some(0), // cudaDevAttrPageableMemoryAccessUsesHostPageTables
        101 => Some(0), // cudaDevAttrDirectManagedMemAccessFromHost
        // Registered memory is moved into the arena, where the device reaches it at the arena
        // address (cudaHostGetDevicePointer), not at the application's pointer.
        91 => Some(0), // cudaDevAttrCanUseHostPointerForRegisteredMem
        _ => None,
    }
}

/// An attribute table (indexed by attribute) with [`managed_memory_attribute`]'s values.
pub fn set_managed_memory_attributes(attributes: &mut [i32]) {
    for (a, slot) in attributes.iter_mut().enumerate() {
        if let Some(v) = i32::try_from(a).ok().and_then(managed_memory_attribute) {
            *slot = v;
        }
    }
}

/// A backend's own object (a `CUstream`, `CUevent`, ... or an emulator index).
pub type Raw = u64;

/// The stream an operation is ordered on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamRef {
    /// The legacy default stream (stream 0 / `cudaStreamLegacy`).
    Legacy,
    /// The calling host thread's default stream (`cudaStreamPerThread`).
    PerThread,
    /// A stream the session created.
    Created(Raw),
}

impl StreamRef {
    /// The `CUstream` this is on a GPU (what NVIDIA's libraries take as a stream too).
    pub fn cu_stream(self) -> u64 {
        match self {
            StreamRef::Legacy => 0,
            // CU_STREAM_PER_THREAD
            StreamRef::PerThread => 0x2,
            StreamRef::Created(raw) => raw,
        }
    }
}

/// Physical backing of one mapped range.
pub type Physical = u64;

/// A point in a stream where a host function runs in the guest: work before it is done when
/// it is *reached*; work after it waits until it is *opened*.
#[derive(Default)]
pub struct Gate {
    /// (reached, opened)
    state: parking_lot::Mutex<(bool, bool)>,
    changed: parking_lot::Condvar,
    /// A graph launch's gate: put in its stream, or given up (the launch failed).
    placed: std::sync::atomic::AtomicBool,
    abandoned: std::sync::atomic::AtomicBool,
}

impl Gate {
    pub fn new() -> std::sync::Arc<Gate> {
        std::sync::Arc::new(Gate::default())
    }

    /// The work before the gate is done.
    pub fn reach(&self) {
        self.state.lock().0 = true;
        self.changed.notify_all();
    }

    /// Wait up to `timeout` for [`reach`](Gate::reach); whether it was reached.
    pub fn wait_reached(&self, timeout: std::time::Duration) -> bool {
        let mut g = self.state.lock();
        self.changed.wait_while_for(&mut g, |s| !s.0 && !s.1, timeout);
        g.0 || g.1
    }

    /// Let the work after the gate run (also when the session ends with the gate closed).
    pub fn open(&self) {
        self.state.lock().1 = true;
        self.changed.notify_all();
    }

    pub fn place(&self) {
        self.placed.store(true, std::sync::atomic::Ordering::Release);
    }

    pub fn is_placed(&self) -> bool {
        self.placed.load(std::sync::atomic::Ordering::Acquire)
    }

    /// The gate will never be put in a stream: a wait at it ends, and its function is not run.
    pub fn abandon(&self) {
        self.abandoned.store(true, std::sync::atomic::Ordering::Release);
        self.reach();
    }

    pub fn is_abandoned(&self) -> bool {
        self.abandoned.load(std::sync::atomic::Ordering::Acquire)
    }

    pub fn is_open(&self) -> bool {
        self.state.lock().1
    }

    pub fn wait_opened(&self) {
        let mut g = self.state.lock();
        self.changed.wait_while(&mut g, |s| !s.1);
    }
}

/// The two sides of a 2D copy; a host side is packed.
pub enum Copy2D<'a> {
    HostToDevice { dst: u64, dpitch: u64, src: &'a [u8] },
    DeviceToHost { dst: &'a mut [u8], src: u64, spitch: u64 },
    DeviceToDevice { dst: u64, dpitch: u64, src: u64, spitch: u64 },
}

/// A module a backend loaded.
#[derive(Debug, Default)]
pub struct LoadedModule {
    pub raw: Raw,
    /// Storage the backend made for the module's variables, as (name, address, size):
    /// memory the session's kernels and copies may use besides its allocations.
    pub variables: Vec<(String, u64, u64)>,
}

/// What a JIT link (`cuLinkComplete`) gave: its status (a `CUresult`), the image when it
/// succeeded, and the linker's logs.
#[derive(Debug, Default)]
pub struct LinkOutcome {
    pub status: i32,
    pub image: Vec<u8>,
    pub info_log: Vec<u8>,
    pub error_log: Vec<u8>,
}

impl LinkOutcome {
    /// A link that failed with `status`, saying why in its error log.
    pub fn failed(status: i32, why: impl Into<String>) -> Self {
        LinkOutcome { status, error_log: why.into().into_bytes(), ..Default::default() }
    }
}

/// `CUDA_ERROR_NOT_SUPPORTED`, as a link outcome's status.
pub const LINK_NOT_SUPPORTED: i32 = 801;

/// One stream memory operation (`cuStreamWaitValue*`, `cuStreamWriteValue*`), on an address
/// the service checked is the session's memory, `width` bytes (4 or 8), aligned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemOp {
    /// `CUstreamWaitValue_flags` in `flags`.
    Wait { addr: u64, value: u64, wide: bool, flags: u32 },
    /// `CUstreamWriteValue_flags` in `flags`.
    Write { addr: u64, value: u64, wide: bool, flags: u32 },
    /// `CU_STREAM_MEM_OP_FLUSH_REMOTE_WRITES`.
    Flush,
}

impl MemOp {
    /// Whether a wait's condition holds for `current` (the value at its address): GEQ is
    /// cyclic (`(int32_t)(*addr - value) >= 0`), EQ, AND (`(*addr & value) != 0`), NOR
    /// (`~(*addr | value) != 0`), in 32 or 64 bits.
    pub fn satisfied(value: u64, wide: bool, flags: u32, current: u64) -> bool {
        let mask = if wide { u64::MAX } else { u32::MAX as u64 };
        let (cur, v) = (current & mask, value & mask);
        match flags & 3 {
            0 if wide => (cur.wrapping_sub(v) as i64) >= 0,
            0 => (cur.wrapping_sub(v) as u32 as i32) >= 0,
            1 => cur == v,
            2 => cur & v != 0,
            _ => !(cur | v) & mask != 0,
        }
    }
}

// A backend is a set of capabilities, one trait each, so that a part of the server asks for
// what it uses (the address space needs [`VirtualMemory`] only) and a new API's service adds
// the capabilities it needs without growing one trait for everything. [`Backend`] is all of
// them together. Calls arrive from several channel threads at once.

/// The devices and their contexts: what they are, their limits and configuration, and making
/// one current for the calling thread.
pub trait Devices: Send + Sync {
    /// `cuda` or `emu`.
    fn name(&self) -> &'static str;
    fn device_count(&self) -> i32;
    /// The backend's own number of `device` (a session's device map, [`mapped`], numbers
    /// devices as its guest knows them): for what is kept per backend device outside the
    /// session, such as the copy lanes of [`copy_pool`].
    fn backend_device(&self, device: i32) -> i32 {
        device
    }
    fn device_properties(&self, device: i32) -> Result<DeviceProperties, CudaError>;
    fn device_attribute(&self, device: i32, attribute: i32) -> Result<i32, CudaError>;
    fn driver_version(&self) -> i32;
    /// (free, total) bytes of device memory.
    fn mem_info(&self, device: i32) -> Result<(u64, u64), CudaError>;
    /// Make `device` current for the calling thread.
    fn bind(&self, device: i32) -> Result<(), CudaError>;
    fn device_synchronize(&self, device: i32) -> Result<(), CudaError>;
    /// A context limit (`cudaLimit` numbering, the driver's too).
    fn limit(&self, device: i32, limit: i32) -> Result<u64, CudaError>;
    fn set_limit(&self, device: i32, limit: i32, value: u64) -> Result<(), CudaError>;
    /// `cudaFuncCache` preference of the device.
    fn cache_config(&self, device: i32) -> Result<i32, CudaError>;
    fn set_cache_config(&self, device: i32, config: i32) -> Result<(), CudaError>;
    /// `cudaSharedMemConfig` of the device.
    fn shared_mem_config(&self, device: i32) -> Result<i32, CudaError>;
    fn set_shared_mem_config(&self, device: i32, config: i32) -> Result<(), CudaError>;
    /// (least, greatest) stream priority.
    fn stream_priority_range(&self, device: i32) -> Result<(i32, i32), CudaError>;
    fn can_access_peer(&self, device: i32, peer: i32) -> Result<bool, CudaError>;
    fn enable_peer_access(&self, device: i32, peer: i32) -> Result<(), CudaError>;
    fn disable_peer_access(&self, device: i32, peer: i32) -> Result<(), CudaError>;
    fn reset_persisting_l2_cache(&self, device: i32) -> Result<(), CudaError>;
    /// `cuDeviceGetExecAffinitySupport`: whether the device makes contexts limited by `kind`
    /// (`CUexecAffinityType`) of its resources.
    fn exec_affinity_support(&self, device: i32, kind: i32) -> Result<i32, CudaError>;
    /// `cuFlushGPUDirectRDMAWrites` for `device`'s context (target and scope checked).
    fn flush_rdma_writes(&self, device: i32, target: i32, scope: i32) -> Result<(), CudaError>;
}

/// Device virtual address space: ranges reserved at fixed addresses, and physical memory
/// mapped into them (the session's allocator, [`crate::registry::memory`], decides where).
pub trait VirtualMemory: Send + Sync {
    /// Reserve `[base, base + size)` of device address space; it must be granted at `base`
    /// exactly, so that pointers stay the same across restores.
    fn reserve(&self, base: u64, size: u64) -> Result<(), CudaError>;
    /// Give a reservation back (everything in it is unmapped already).
    fn unreserve(&self, base: u64, size: u64);
    /// Mapping granularity (a multiple of the page size).
    fn granularity(&self, device: i32) -> u64;
    /// Back `[addr, addr + size)` with fresh device memory of `device`.
    fn map(&self, device: i32, addr: u64, size: u64) -> Result<Physical, CudaError>;
    /// Undo [`map`](VirtualMemory::map) (or [`import_block`](VirtualMemory::import_block)).
    fn unmap(&self, addr: u64, size: u64, physical: Physical) -> Result<(), CudaError>;
    /// A file another API server process of the machine can map the block `[addr, addr +
    /// len)` (one `map`) with, the same memory (IPC between sessions of one tenant).
    fn export_block(&self, _addr: u64, _len: u64, _physical: Physical) -> Result<std::os::fd::OwnedFd, CudaError> {
        Err(CudaError::MapBufferObjectFailed)
    }
    /// Map a block another server exported (`len` bytes) at `addr`, a free, aligned part of
    /// the session's reservation.
    fn import_block(
        &self,
        _device: i32,
        _file: &std::os::fd::OwnedFd,
        _addr: u64,
        _len: u64,
    ) -> Result<Physical, CudaError> {
        Err(CudaError::MapBufferObjectFailed)
    }
}

/// Copies to, from and within device memory, and sets of it.
pub trait Copies: Send + Sync {
    /// Make ready to hash `device`'s memory ([`hash_blocks`](Copies::hash_blocks)): a GPU
    /// loads its hash kernel (seconds of the driver's JIT at worst), before a recopy holds
    /// the session.
    fn prepare_hashing(&self, device: i32) -> Result<(), CudaError>;
    /// The content hash ([`phos_checkpoint::piece_hash::block_hash`]) of each of `blocks`
    /// (address, length) of `device`'s memory as it is now, in order, computed where the
    /// memory is (a GPU's kernel: nothing but the hashes crosses the bus). The ranges are the
    /// C/R engine's, of the session's live memory.
    fn hash_blocks(&self, device: i32, blocks: &[(u64, u64)]) -> Result<Vec<u64>, CudaError>;
    fn memcpy_htod(&self, dst: u64, src: &[u8], stream: Option<StreamRef>) -> Result<(), CudaError>;
    fn memcpy_dtoh(&self, dst: &mut [u8], src: u64, stream: Option<StreamRef>) -> Result<(), CudaError>;
    fn memcpy_dtod(&self, dst: u64, src: u64, len: u64, stream: Option<StreamRef>) -> Result<(), CudaError>;
    fn memset(&self, dst: u64, value: u8, len: u64, stream: Option<StreamRef>) -> Result<(), CudaError>;
    /// One 2D copy of `height` rows of `width` bytes (a host side is packed: its pitch is
    /// `width`). The default copies row by row.
    fn memcpy_2d(&self, copy: Copy2D<'_>, width: u64, height: u64, stream: Option<StreamRef>) -> Result<(), CudaError> {
        let (w, h) = (width as usize, height as usize);
        match copy {
            Copy2D::HostToDevice { dst, dpitch, src } => {
                for (row, bytes) in src.chunks_exact(w).take(h).enumerate() {
                    self.memcpy_htod(dst + row as u64 * dpitch, bytes, stream)?;
                }
            }
            Copy2D::DeviceToHost { dst, src, spitch } => {
                for (row, bytes) in dst.chunks_exact_mut(w).take(h).enumerate() {
                    self.memcpy_dtoh(bytes, src + row as u64 * spitch, stream)?;
                }
            }
            Copy2D::DeviceToDevice { dst, dpitch, src, spitch } => {
                for row in 0..height {
                    self.memcpy_dtod(dst + row * dpitch, src + row * spitch, width, stream)?;
                }
            }
        }
        Ok(())
    }
    /// Set `height` rows of `width` bytes, `pitch` apart. The default sets row by row.
    fn memset_2d(
        &self,
        dst: u64,
        pitch: u64,
        value: u8,
        width: u64,
        height: u64,
        stream: Option<StreamRef>,
    ) -> Result<(), CudaError> {
        for row in 0..height {
            self.memset(dst + row * pitch, value, width, stream)?;
        }
        Ok(())
    }
}

/// Host memory the devices reach: page-locked copy buffers, and the guest's pinned arena
/// registered with the driver.
pub trait HostMemory: Send + Sync {
    /// Page-lock host memory for fast copies (checkpoint buffers); a backend that has no use
    /// for it does nothing.
    fn pin_host(&self, _buf: &mut [u8]) {}
    /// Undo [`pin_host`](HostMemory::pin_host).
    fn unpin_host(&self, _buf: &mut [u8]) {}
    /// The page-locked buffers and copy lanes the C/R engine reuses, on a backend that keeps
    /// them ([`copy_pool`]).
    fn copy_pool(&self) -> Option<&copy_pool::CopyPool> {
        None
    }
    /// Page-lock `[addr, addr + len)`, memory of this process shared with the guest (a
    /// staging region's slots), for fast copies with
    /// [`memcpy_registered`](HostMemory::memcpy_registered); a backend that has no use for it
    /// does nothing. An address, not a slice: Rust code holds no reference to memory the
    /// guest can write.
    fn pin_shared(&self, _addr: u64, _len: u64) {}
    /// Undo [`pin_shared`](HostMemory::pin_shared).
    fn unpin_shared(&self, _addr: u64) {}
    /// Make host memory of this process, `[addr, addr + len)` (whole pages of the guest's
    /// pinned arena), page-locked and reachable by every device; its device address.
    fn register_host(&self, addr: u64, len: u64) -> Result<u64, CudaError>;
    /// Undo [`register_host`](HostMemory::register_host).
    fn unregister_host(&self, addr: u64);
    /// A copy between device memory and host memory at `host`, an address of this process
    /// that the guest can write too (an allocation of its pinned arena, registered; a staging
    /// slot, pinned), or a buffer of the C/R engine's that stays borrowed until the copy is
    /// waited for: only the device, or a raw copy, touches it. On a stream it is only queued:
    /// the host memory outlives it.
    fn memcpy_registered(
        &self,
        device: u64,
        host: u64,
        len: u64,
        to_device: bool,
        stream: Option<StreamRef>,
    ) -> Result<(), CudaError>;
}

/// Streams, and the host-function gates put in them.
pub trait Streams: Send + Sync {
    fn stream_create(&self, device: i32, flags: u32, priority: i32) -> Result<Raw, CudaError>;
    fn stream_destroy(&self, stream: Raw) -> Result<(), CudaError>;
    fn stream_synchronize(&self, stream: StreamRef) -> Result<(), CudaError>;
    /// `Ok(true)` when all work is done.
    fn stream_query(&self, stream: StreamRef) -> Result<bool, CudaError>;
    /// Work submitted to `stream` from now on waits for `event`'s recorded work.
    fn stream_wait_event(&self, stream: StreamRef, event: Raw) -> Result<(), CudaError>;
    /// Put `gate` in `stream`: reach it once the stream's earlier work is done, and hold the
    /// stream's later work until it is opened.
    fn host_func(&self, stream: StreamRef, gate: std::sync::Arc<Gate>) -> Result<(), CudaError>;
    /// A stream memory operation, in stream order: a wait holds the stream's later work until
    /// its condition holds (it never holds the calling thread, nor the session's other
    /// streams); a write lands once the stream's earlier work is done.
    fn stream_mem_op(&self, _stream: StreamRef, _op: MemOp) -> Result<(), CudaError> {
        Err(CudaError::NotSupported)
    }
}

/// Events: points in streams.
pub trait Events: Send + Sync {
    fn event_create(&self, device: i32, flags: u32) -> Result<Raw, CudaError>;
    fn event_destroy(&self, event: Raw) -> Result<(), CudaError>;
    fn event_record(&self, event: Raw, stream: StreamRef) -> Result<(), CudaError>;
    fn event_synchronize(&self, event: Raw) -> Result<(), CudaError>;
    fn event_query(&self, event: Raw) -> Result<bool, CudaError>;
    fn event_elapsed(&self, start: Raw, end: Raw) -> Result<f32, CudaError>;
    /// What another server process needs to open an interprocess event
    /// (`cuIpcGetEventHandle`'s 64 bytes on a GPU).
    fn event_export(&self, _event: Raw) -> Result<[u8; 64], CudaError> {
        Err(CudaError::NotSupported)
    }
    /// Open an event another server process exported.
    fn event_import(&self, _device: i32, _exported: &[u8; 64]) -> Result<Raw, CudaError> {
        Err(CudaError::NotSupported)
    }
}

/// Modules, the functions and variables in them, and what a function's launches may use.
pub trait Modules: Send + Sync {
    /// Load a module image (a fat binary, cubin or PTX) on `device`.
    fn module_load(&self, device: i32, image: &[u8]) -> Result<LoadedModule, CudaError>;
    /// PTX of the server's own (a checked twin) compiled for `device` away from the driver
    /// (which compiles under a lock every call of the process waits for), where the backend
    /// can; `None`: load the PTX itself.
    fn compile_ptx(&self, _device: i32, _ptx: &[u8]) -> Option<Vec<u8>> {
        None
    }
    fn module_unload(&self, module: Raw) -> Result<(), CudaError>;
    fn module_function(&self, module: Raw, name: &str) -> Result<Raw, CudaError>;
    /// Address and size of a module's global variable.
    fn module_global(&self, module: Raw, name: &str) -> Result<(u64, u64), CudaError>;
    fn function_attributes(&self, function: Raw) -> Result<FuncAttributes, CudaError>;
    /// `attr` numbered as `cudaFuncAttribute` / `CUfunction_attribute`.
    fn function_set_attribute(&self, function: Raw, attr: i32, value: i32) -> Result<(), CudaError>;
    fn function_set_cache_config(&self, function: Raw, config: i32) -> Result<(), CudaError>;
    /// Blocks of `block_size` threads that fit on one multiprocessor at once.
    fn occupancy(&self, function: Raw, block_size: i32, dynamic_smem: u64, flags: u32) -> Result<i32, CudaError>;
    /// Dynamic shared memory a block may use with `blocks` blocks of `block_size` resident.
    fn available_dynamic_smem(&self, function: Raw, blocks: i32, block_size: i32) -> Result<u64, CudaError>;
    /// Clusters of `cluster` blocks (none given: the function's own cluster size) that can be
    /// resident on the device at once, for a launch of `grid` blocks of `block` threads with
    /// `smem` bytes of dynamic shared memory each.
    fn max_active_clusters(
        &self,
        function: Raw,
        grid: Dim3,
        block: Dim3,
        smem: u32,
        cluster: Option<Dim3>,
    ) -> Result<i32, CudaError>;
    /// The largest cluster such a launch can have.
    fn max_potential_cluster_size(&self, function: Raw, grid: Dim3, block: Dim3, smem: u32) -> Result<i32, CudaError>;
    /// Link `inputs` for `device` (`cuLinkComplete`): an image [`module_load`] loads.
    ///
    /// [`module_load`]: Modules::module_load
    fn link(&self, _device: i32, _inputs: &phos_protocol::jit_link::LinkInputs<'_>) -> LinkOutcome {
        LinkOutcome::failed(LINK_NOT_SUPPORTED, "this backend links nothing")
    }
    /// The 128 bytes of a tensor map of `params` (checked by the service): Phos's own encoding
    /// unless the backend's device has one.
    fn tensor_map_encode(&self, params: &phos_protocol::tensor_map::Params) -> Result<[u8; 128], CudaError> {
        Ok(params.phos_encoding())
    }
    /// `cuTensorMapReplaceAddress` on a map [`tensor_map_encode`] made.
    ///
    /// [`tensor_map_encode`]: Modules::tensor_map_encode
    fn tensor_map_replace_address(&self, map: &mut [u8; 128], address: u64) -> Result<(), CudaError> {
        phos_protocol::tensor_map::PhosMap::replace_address(map, address).map_err(|_| CudaError::InvalidValue)
    }
}

/// Kernel launches, and the device time they took.
pub trait Launch: Send + Sync {
    /// Launch with a packed parameter buffer. A backend that runs the kernel itself checks
    /// every access against `memory` (frozen for the launch) and appends its `printf` output
    /// to `printed`. `measure`: the router needs this launch's device time (a policy is
    /// loaded), so it is timed rather than sampled.
    #[allow(clippy::too_many_arguments)]
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
        measure: bool,
        cooperative: bool,
    ) -> Result<(), CudaError>;
    /// Device time of the kernels launched so far, as far as it is known: (nanoseconds,
    /// kernels measured). Kernels still running are counted once they finish.
    fn device_time(&self) -> (u64, u64) {
        (0, 0)
    }
    /// Whether launched kernels are still to be measured (so [`device_time`] will grow
    /// without another call): the server then keeps reporting while the guest is quiet.
    ///
    /// [`device_time`]: Launch::device_time
    fn measuring(&self) -> bool {
        false
    }
}

/// A CUDA array or mipmapped array as the backend creates it; the service checked the shape
/// (`phos_ptx::exec::ArrayDesc::from_cuda` accepts it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArraySpec {
    pub format: ChannelFormat,
    /// `cudaMalloc3DArray`'s extent: height 0 for 1D, depth 0 for 1D and 2D, layers in depth
    /// for layered and cubemap arrays.
    pub extent: [u64; 3],
    /// `cudaArray*` flags (layered 1, surface load/store 2, cubemap 4, texture gather 8).
    pub flags: u32,
    /// `None` for a plain array; the level count of a mipmapped array.
    pub levels: Option<u32>,
}

/// One side of a copy with a CUDA array. The service checked every side: an array's corner
/// and extent lie in the array, a device side's rows in the session's memory, a host side is
/// exactly the copy's bytes, packed.
pub enum ArraySide<'a> {
    /// `x` in bytes (a multiple of the element size), `y` rows, `z` slices or layers.
    Array {
        raw: Raw,
        x: u64,
        y: u64,
        z: u64,
    },
    Device {
        addr: u64,
        pitch: u64,
        slice: u64,
    },
    Host(&'a [u8]),
    HostOut(&'a mut [u8]),
}

/// What a texture object reads (`cudaResourceDesc`), with the backend's arrays.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TextureSource {
    Array { raw: Raw, format: ChannelFormat },
    Mipmapped { raw: Raw, format: ChannelFormat },
    Linear { addr: u64, format: ChannelFormat, size: u64 },
    Pitch2D { addr: u64, format: ChannelFormat, width: u64, height: u64, pitch: u64 },
}

impl TextureSource {
    pub fn format(&self) -> ChannelFormat {
        match *self {
            TextureSource::Array { format, .. }
            | TextureSource::Mipmapped { format, .. }
            | TextureSource::Linear { format, .. }
            | TextureSource::Pitch2D { format, .. } => format,
        }
    }
}

/// CUDA arrays, and the texture and surface objects kernels read and write them through.
/// Texture and surface objects are the backend's own 64-bit values, which kernels take as
/// they are.
pub trait Arrays: Send + Sync {
    fn array_create(&self, device: i32, spec: &ArraySpec) -> Result<Raw, CudaError>;
    /// Destroys a plain array, or a mipmapped one with its levels.
    fn array_destroy(&self, array: Raw, mipmapped: bool) -> Result<(), CudaError>;
    /// Level `level` of a mipmapped array, as an array.
    fn mipmap_level(&self, mipmap: Raw, level: u32) -> Result<Raw, CudaError>;
    /// A copy of `width` bytes by `height` rows by `depth` slices; at least one side is an
    /// array.
    fn array_copy(
        &self,
        dst: ArraySide<'_>,
        src: ArraySide<'_>,
        extent: [u64; 3],
        stream: Option<StreamRef>,
    ) -> Result<(), CudaError>;
    fn texture_create(
        &self,
        source: &TextureSource,
        desc: &TextureDesc,
        view: Option<&ResourceViewWire>,
    ) -> Result<u64, CudaError>;
    fn texture_destroy(&self, texture: u64) -> Result<(), CudaError>;
    fn surface_create(&self, array: Raw) -> Result<u64, CudaError>;
    fn surface_destroy(&self, surface: u64) -> Result<(), CudaError>;
    /// A texture object made again by a restore, which asks for the value the program holds:
    /// a backend that picks values itself (a driver) makes one as usual and answers its value,
    /// which the caller compares (this default); one that can, under `value`.
    fn texture_create_as(
        &self,
        _value: u64,
        source: &TextureSource,
        desc: &TextureDesc,
        view: Option<&ResourceViewWire>,
    ) -> Result<u64, CudaError> {
        self.texture_create(source, desc, view)
    }
    /// A surface object made again by a restore (as [`texture_create_as`](Self::texture_create_as)).
    fn surface_create_as(&self, _value: u64, array: Raw) -> Result<u64, CudaError> {
        self.surface_create(array)
    }
}

/// The vendor's libraries a backend runs library APIs with (NVIDIA's libcublas, libcublasLt,
/// libcurand, libcusolver, libcusparse, libcudnn and libcufft on a GPU); a backend without them
/// (emu) leaves those calls to the server's own implementations ([`crate::cpu_blas`],
/// [`crate::cpu_rand`], [`crate::cpu_solver`], [`crate::cpu_fft`], ...).
pub trait Libraries: Send + Sync {
    fn cublas(&self) -> Option<&vendor::Cublas> {
        None
    }
    /// NVIDIA's libcurand (the host API).
    fn curand(&self) -> Option<&vendor_curand::Curand> {
        None
    }
    /// NVIDIA's libcusolver (the dense API).
    fn cusolver(&self) -> Option<&vendor::Cusolver> {
        None
    }
    /// NVIDIA's libcusparse.
    fn cusparse(&self) -> Option<&vendor_cusparse::Cusparse> {
        None
    }
    /// NVIDIA's libcudnn (cuDNN 9).
    fn cudnn(&self) -> Option<&vendor_cudnn::Cudnn> {
        None
    }
    /// NVIDIA's libcublasLt.
    fn cublaslt(&self) -> Option<&vendor_lt::CublasLt> {
        None
    }
    /// NVIDIA's libcufft.
    fn cufft(&self) -> Option<&vendor_cufft::Cufft> {
        None
    }
    /// NVIDIA's NVML (the driver's), for what the device attributes do not say.
    fn nvml(&self) -> Option<&vendor_nvml::Nvml> {
        None
    }
}

/// Every capability: what a session's backend is (`cuda` or `emu`).
pub trait Backend:
    Devices + VirtualMemory + Copies + HostMemory + Streams + Events + Modules + Launch + Arrays + Libraries
{
}

impl<T: Devices + VirtualMemory + Copies + HostMemory + Streams + Events + Modules + Launch + Arrays + Libraries>
    Backend for T
{
}

/// The capability traits, for code that calls a [`Backend`]'s methods.
pub mod prelude {
    pub use super::{
        Arrays, Backend, Copies, Devices, Events, HostMemory, Launch, Libraries, Modules, Streams, VirtualMemory,
    };
}
