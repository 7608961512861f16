//! The CUDA-version-dependent parts of the runtime ABI that the guest library presents.
//!
//! The same Rust library is loaded as `libcudart.so.11.0`, `.so.12` or `.so.13`, and must
//! behave like the runtime of that major version. The server only knows ABI-neutral data;
//! this module turns it into what an application compiled against a given major expects,
//! chiefly `struct cudaDeviceProp`, whose layout changed in 12 (fields added, a reserved tail)
//! and again in 13 (deprecated fields removed).
//!
//! The three `DeviceProp*` structs mirror `driver_types.h` of CUDA 11.8, 12.9 and 13.0 field
//! by field; `tests/abi_layout.rs` checks them against the real headers. Every field takes its
//! value from one place, the `field_value!` table below, so the three layouts cannot disagree
//! about where a value comes from.
//!
//! Which entry point writes which layout (as the real runtimes do): `libcudart.so.11.0`'s
//! `cudaGetDeviceProperties` writes [`Abi::V11`]; `libcudart.so.12` exports both
//! `cudaGetDeviceProperties_v2` (what 12.x headers call; [`Abi::V12`]) and a legacy
//! `cudaGetDeviceProperties` that writes the 728-byte [`Abi::V11`] layout; `libcudart.so.13`
//! has only `cudaGetDeviceProperties`, writing [`Abi::V13`].

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::mem::MaybeUninit;

use phos_protocol::types::DeviceProperties;

/// The CUDA runtime major version whose ABI the library presents.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Abi {
    V11,
    V12,
    V13,
}

impl Abi {
    /// Every ABI the library can present, oldest first.
    pub const ALL: [Abi; 3] = [Abi::V11, Abi::V12, Abi::V13];

    /// The CUDA major version.
    pub fn major(self) -> u32 {
        match self {
            Abi::V11 => 11,
            Abi::V12 => 12,
            Abi::V13 => 13,
        }
    }

    /// What `cudaRuntimeGetVersion` reports: the newest runtime of that major whose
    /// `cudaDeviceProp` we mirror (11.8, 12.9, 13.0).
    pub fn runtime_version(self) -> i32 {
        match self {
            Abi::V11 => 11080,
            Abi::V12 => 12090,
            Abi::V13 => 13000,
        }
    }

    /// The ABI that a library file name implies: the major version right after `.so.`
    /// (`libcudart.so.11.0` → 11, `libcudart.so.12` → 12, `/opt/x/libcudart.so.13.0.96` → 13).
    /// A leading directory is ignored. `None` for an unversioned name or an unknown major.
    pub fn from_library_name(name: &str) -> Option<Abi> {
        let file = name.rsplit('/').next()?;
        let (_, version) = file.rsplit_once(".so.")?;
        let major = version.split('.').next()?;
        match major {
            "11" => Some(Abi::V11),
            "12" => Some(Abi::V12),
            "13" => Some(Abi::V13),
            _ => None,
        }
    }
}

/// `sizeof(struct cudaDeviceProp)` under `abi`.
pub fn device_prop_size(abi: Abi) -> usize {
    match abi {
        Abi::V11 => size_of::<DeviceProp11>(),
        Abi::V12 => size_of::<DeviceProp12>(),
        Abi::V13 => size_of::<DeviceProp13>(),
    }
}

/// Writes `props` to `dst` as the `struct cudaDeviceProp` of `abi`, the way that version's
/// `cudaGetDeviceProperties` fills it. All [`device_prop_size`]`(abi)` bytes are written:
/// padding and the reserved tail are zero (the real 12 and 13 runtimes leave that tail as it
/// was). Nothing past the struct is touched.
///
/// # Safety
/// `dst` must be valid for writes of [`device_prop_size`]`(abi)` bytes. It need not be aligned.
pub unsafe fn write_device_prop(abi: Abi, dst: *mut c_void, props: &DeviceProperties) {
    match abi {
        // SAFETY: the caller's contract (`device_prop_size(abi)` writable bytes at `dst`) is
        // what `write_as` needs for CUDA 11's struct.
        Abi::V11 => unsafe { write_as::<DeviceProp11>(dst, props) },
        // SAFETY: as above, for CUDA 12's.
        Abi::V12 => unsafe { write_as::<DeviceProp12>(dst, props) },
        // SAFETY: as above, for CUDA 13's.
        Abi::V13 => unsafe { write_as::<DeviceProp13>(dst, props) },
    }
}

/// Builds a `T` on the stack from all-zero bytes, fills its fields and copies its bytes out.
/// Going through a zeroed local (rather than writing fields into `dst`) makes the padding bytes
/// zero too and lets `dst` be misaligned.
unsafe fn write_as<T: FillFrom>(dst: *mut c_void, props: &DeviceProperties) {
    let mut out = MaybeUninit::<T>::zeroed();
    // SAFETY: every field of the `DeviceProp*` structs is an integer or an array of
    // integers, for which all-zero bytes are a valid value.
    let value = unsafe { out.assume_init_mut() };
    value.fill_from(&Source(props));
    // SAFETY: `out` holds size_of::<T>() initialised bytes (field writes leave the zeroed
    // padding as it was); the caller guarantees `dst` has room for them.
    unsafe { std::ptr::copy_nonoverlapping(out.as_ptr().cast::<u8>(), dst.cast::<u8>(), size_of::<T>()) };
}

/// One field of a mirrored C struct: its C name, byte offset, size and alignment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FieldLayout {
    pub name: &'static str,
    pub offset: usize,
    pub size: usize,
    pub align: usize,
}

/// A struct whose fields are all filled from the neutral properties.
trait FillFrom {
    fn fill_from(&mut self, src: &Source<'_>);
}

/// Driver attribute numbers (`CUdevice_attribute` in `cuda.h`, equal to `cudaDeviceAttr`),
/// named as in `cuda.h` without the `CU_DEVICE_ATTRIBUTE_` prefix. Only those that
/// `cudaDeviceProp` uses are listed.
pub mod attr {
    pub const MAX_THREADS_PER_BLOCK: i32 = 1;
    pub const MAX_BLOCK_DIM_X: i32 = 2;
    pub const MAX_BLOCK_DIM_Y: i32 = 3;
    pub const MAX_BLOCK_DIM_Z: i32 = 4;
    pub const MAX_GRID_DIM_X: i32 = 5;
    pub const MAX_GRID_DIM_Y: i32 = 6;
    pub const MAX_GRID_DIM_Z: i32 = 7;
    pub const MAX_SHARED_MEMORY_PER_BLOCK: i32 = 8;
    pub const TOTAL_CONSTANT_MEMORY: i32 = 9;
    pub const WARP_SIZE: i32 = 10;
    pub const MAX_PITCH: i32 = 11;
    pub const MAX_REGISTERS_PER_BLOCK: i32 = 12;
    pub const CLOCK_RATE: i32 = 13;
    pub const TEXTURE_ALIGNMENT: i32 = 14;
    pub const GPU_OVERLAP: i32 = 15;
    pub const MULTIPROCESSOR_COUNT: i32 = 16;
    pub const KERNEL_EXEC_TIMEOUT: i32 = 17;
    pub const INTEGRATED: i32 = 18;
    pub const CAN_MAP_HOST_MEMORY: i32 = 19;
    pub const COMPUTE_MODE: i32 = 20;
    pub const MAXIMUM_TEXTURE1D_WIDTH: i32 = 21;
    pub const MAXIMUM_TEXTURE2D_WIDTH: i32 = 22;
    pub const MAXIMUM_TEXTURE2D_HEIGHT: i32 = 23;
    pub const MAXIMUM_TEXTURE3D_WIDTH: i32 = 24;
    pub const MAXIMUM_TEXTURE3D_HEIGHT: i32 = 25;
    pub const MAXIMUM_TEXTURE3D_DEPTH: i32 = 26;
    pub const MAXIMUM_TEXTURE2D_LAYERED_WIDTH: i32 = 27;
    pub const MAXIMUM_TEXTURE2D_LAYERED_HEIGHT: i32 = 28;
    pub const MAXIMUM_TEXTURE2D_LAYERED_LAYERS: i32 = 29;
    pub const SURFACE_ALIGNMENT: i32 = 30;
    pub const CONCURRENT_KERNELS: i32 = 31;
    pub const ECC_ENABLED: i32 = 32;
    pub const PCI_BUS_ID: i32 = 33;
    pub const PCI_DEVICE_ID: i32 = 34;
    pub const TCC_DRIVER: i32 = 35;
    pub const MEMORY_CLOCK_RATE: i32 = 36;
    pub const GLOBAL_MEMORY_BUS_WIDTH: i32 = 37;
    pub const L2_CACHE_SIZE: i32 = 38;
    pub const MAX_THREADS_PER_MULTIPROCESSOR: i32 = 39;
    pub const ASYNC_ENGINE_COUNT: i32 = 40;
    pub const UNIFIED_ADDRESSING: i32 = 41;
    pub const MAXIMUM_TEXTURE1D_LAYERED_WIDTH: i32 = 42;
    pub const MAXIMUM_TEXTURE1D_LAYERED_LAYERS: i32 = 43;
    pub const MAXIMUM_TEXTURE2D_GATHER_WIDTH: i32 = 45;
    pub const MAXIMUM_TEXTURE2D_GATHER_HEIGHT: i32 = 46;
    pub const MAXIMUM_TEXTURE3D_WIDTH_ALTERNATE: i32 = 47;
    pub const MAXIMUM_TEXTURE3D_HEIGHT_ALTERNATE: i32 = 48;
    pub const MAXIMUM_TEXTURE3D_DEPTH_ALTERNATE: i32 = 49;
    pub const PCI_DOMAIN_ID: i32 = 50;
    pub const TEXTURE_PITCH_ALIGNMENT: i32 = 51;
    pub const MAXIMUM_TEXTURECUBEMAP_WIDTH: i32 = 52;
    pub const MAXIMUM_TEXTURECUBEMAP_LAYERED_WIDTH: i32 = 53;
    pub const MAXIMUM_TEXTURECUBEMAP_LAYERED_LAYERS: i32 = 54;
    pub const MAXIMUM_SURFACE1D_WIDTH: i32 = 55;
    pub const MAXIMUM_SURFACE2D_WIDTH: i32 = 56;
    pub const MAXIMUM_SURFACE2D_HEIGHT: i32 = 57;
    pub const MAXIMUM_SURFACE3D_WIDTH: i32 = 58;
    pub const MAXIMUM_SURFACE3D_HEIGHT: i32 = 59;
    pub const MAXIMUM_SURFACE3D_DEPTH: i32 = 60;
    pub const MAXIMUM_SURFACE1D_LAYERED_WIDTH: i32 = 61;
    pub const MAXIMUM_SURFACE1D_LAYERED_LAYERS: i32 = 62;
    pub const MAXIMUM_SURFACE2D_LAYERED_WIDTH: i32 = 63;
    pub const MAXIMUM_SURFACE2D_LAYERED_HEIGHT: i32 = 64;
    pub const MAXIMUM_SURFACE2D_LAYERED_LAYERS: i32 = 65;
    pub const MAXIMUM_SURFACECUBEMAP_WIDTH: i32 = 66;
    pub const MAXIMUM_SURFACECUBEMAP_LAYERED_WIDTH: i32 = 67;
    pub const MAXIMUM_SURFACECUBEMAP_LAYERED_LAYERS: i32 = 68;
    pub const MAXIMUM_TEXTURE1D_LINEAR_WIDTH: i32 = 69;
    pub const MAXIMUM_TEXTURE2D_LINEAR_WIDTH: i32 = 70;
    pub const MAXIMUM_TEXTURE2D_LINEAR_HEIGHT: i32 = 71;
    pub const MAXIMUM_TEXTURE2D_LINEAR_PITCH: i32 = 72;
    pub const MAXIMUM_TEXTURE2D_MIPMAPPED_WIDTH: i32 = 73;
    pub const MAXIMUM_TEXTURE2D_MIPMAPPED_HEIGHT: i32 = 74;
    pub const COMPUTE_CAPABILITY_MAJOR: i32 = 75;
    pub const COMPUTE_CAPABILITY_MINOR: i32 = 76;
    pub const MAXIMUM_TEXTURE1D_MIPMAPPED_WIDTH: i32 = 77;
    pub const STREAM_PRIORITIES_SUPPORTED: i32 = 78;
    pub const GLOBAL_L1_CACHE_SUPPORTED: i32 = 79;
    pub const LOCAL_L1_CACHE_SUPPORTED: i32 = 80;
    pub const MAX_SHARED_MEMORY_PER_MULTIPROCESSOR: i32 = 81;
    pub const MAX_REGISTERS_PER_MULTIPROCESSOR: i32 = 82;
    pub const MANAGED_MEMORY: i32 = 83;
    pub const MULTI_GPU_BOARD: i32 = 84;
    pub const MULTI_GPU_BOARD_GROUP_ID: i32 = 85;
    pub const HOST_NATIVE_ATOMIC_SUPPORTED: i32 = 86;
    pub const SINGLE_TO_DOUBLE_PRECISION_PERF_RATIO: i32 = 87;
    pub const PAGEABLE_MEMORY_ACCESS: i32 = 88;
    pub const CONCURRENT_MANAGED_ACCESS: i32 = 89;
    pub const COMPUTE_PREEMPTION_SUPPORTED: i32 = 90;
    pub const CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM: i32 = 91;
    pub const COOPERATIVE_LAUNCH: i32 = 95;
    pub const COOPERATIVE_MULTI_DEVICE_LAUNCH: i32 = 96;
    pub const MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: i32 = 97;
    pub const HOST_REGISTER_SUPPORTED: i32 = 99;
    pub const PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES: i32 = 100;
    pub const DIRECT_MANAGED_MEM_ACCESS_FROM_HOST: i32 = 101;
    pub const MAX_BLOCKS_PER_MULTIPROCESSOR: i32 = 106;
    pub const MAX_PERSISTING_L2_CACHE_SIZE: i32 = 108;
    pub const MAX_ACCESS_POLICY_WINDOW_SIZE: i32 = 109;
    pub const RESERVED_SHARED_MEMORY_PER_BLOCK: i32 = 111;
    pub const SPARSE_CUDA_ARRAY_SUPPORTED: i32 = 112;
    pub const READ_ONLY_HOST_REGISTER_SUPPORTED: i32 = 113;
    pub const TIMELINE_SEMAPHORE_INTEROP_SUPPORTED: i32 = 114;
    pub const MEMORY_POOLS_SUPPORTED: i32 = 115;
    pub const GPU_DIRECT_RDMA_SUPPORTED: i32 = 116;
    pub const GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS: i32 = 117;
    pub const GPU_DIRECT_RDMA_WRITES_ORDERING: i32 = 118;
    pub const MEMPOOL_SUPPORTED_HANDLE_TYPES: i32 = 119;
    pub const CLUSTER_LAUNCH: i32 = 120;
    pub const DEFERRED_MAPPING_CUDA_ARRAY_SUPPORTED: i32 = 121;
    pub const IPC_EVENT_SUPPORTED: i32 = 125;
    pub const UNIFIED_FUNCTION_POINTERS: i32 = 129;
    pub const NUMA_CONFIG: i32 = 130;
    pub const NUMA_ID: i32 = 131;
    pub const MPS_ENABLED: i32 = 133;
    pub const HOST_NUMA_ID: i32 = 134;
    pub const GPU_PCI_DEVICE_ID: i32 = 139;
    pub const GPU_PCI_SUBSYSTEM_ID: i32 = 140;
    pub const HOST_NUMA_MULTINODE_IPC_SUPPORTED: i32 = 143;
}

/// Reads the neutral properties as C field values.
struct Source<'a>(&'a DeviceProperties);

impl Source<'_> {
    fn int(&self, attribute: i32) -> c_int {
        self.0.attr(attribute)
    }

    /// An `unsigned int` field: the attribute's bits, as the C assignment keeps them.
    fn uint(&self, attribute: i32) -> c_uint {
        self.0.attr(attribute) as c_uint
    }

    /// A `size_t` field: the attribute widened as C widens an `int` (sign-extended).
    fn size(&self, attribute: i32) -> usize {
        self.0.attr(attribute) as isize as usize
    }

    fn ints<const N: usize>(&self, attributes: [i32; N]) -> [c_int; N] {
        attributes.map(|a| self.int(a))
    }

    /// The device name, cut to 255 bytes, NUL-terminated and zero-padded.
    fn name(&self) -> [c_char; 256] {
        let mut out = [0; 256];
        for (dst, &b) in out.iter_mut().zip(self.0.name.as_bytes().iter().take(255)) {
            *dst = b as c_char;
        }
        out
    }

    fn chars<const N: usize>(bytes: &[u8; N]) -> [c_char; N] {
        bytes.map(|b| b as c_char)
    }
}

/// The value of each `cudaDeviceProp` field, by field name. A field that a struct declares but
/// that has no line here does not compile, so every layout's every field has a source.
#[rustfmt::skip] // One line per field reads better than rustfmt's three.
macro_rules! field_value {
    // Not attributes.
    (name, $s:ident) => { $s.name() };
    (uuid, $s:ident) => { Source::chars(&$s.0.uuid) };
    (luid, $s:ident) => { Source::chars(&$s.0.luid) };
    (luidDeviceNodeMask, $s:ident) => { $s.0.luid_device_node_mask };
    (totalGlobalMem, $s:ident) => { $s.0.total_global_mem as usize };
    (reserved, $s:ident) => { [0; _] };

    // Since CUDA 11 (and most of them much earlier).
    (sharedMemPerBlock, $s:ident) => { $s.size(attr::MAX_SHARED_MEMORY_PER_BLOCK) };
    (regsPerBlock, $s:ident) => { $s.int(attr::MAX_REGISTERS_PER_BLOCK) };
    (warpSize, $s:ident) => { $s.int(attr::WARP_SIZE) };
    (memPitch, $s:ident) => { $s.size(attr::MAX_PITCH) };
    (maxThreadsPerBlock, $s:ident) => { $s.int(attr::MAX_THREADS_PER_BLOCK) };
    (maxThreadsDim, $s:ident) => { $s.ints([attr::MAX_BLOCK_DIM_X, attr::MAX_BLOCK_DIM_Y, attr::MAX_BLOCK_DIM_Z]) };
    (maxGridSize, $s:ident) => { $s.ints([attr::MAX_GRID_DIM_X, attr::MAX_GRID_DIM_Y, attr::MAX_GRID_DIM_Z]) };
    (clockRate, $s:ident) => { $s.int(attr::CLOCK_RATE) };
    (totalConstMem, $s:ident) => { $s.size(attr::TOTAL_CONSTANT_MEMORY) };
    (major, $s:ident) => { $s.int(attr::COMPUTE_CAPABILITY_MAJOR) };
    (minor, $s:ident) => { $s.int(attr::COMPUTE_CAPABILITY_MINOR) };
    (textureAlignment, $s:ident) => { $s.size(attr::TEXTURE_ALIGNMENT) };
    (texturePitchAlignment, $s:ident) => { $s.size(attr::TEXTURE_PITCH_ALIGNMENT) };
    (deviceOverlap, $s:ident) => { $s.int(attr::GPU_OVERLAP) };
    (multiProcessorCount, $s:ident) => { $s.int(attr::MULTIPROCESSOR_COUNT) };
    (kernelExecTimeoutEnabled, $s:ident) => { $s.int(attr::KERNEL_EXEC_TIMEOUT) };
    (integrated, $s:ident) => { $s.int(attr::INTEGRATED) };
    (canMapHostMemory, $s:ident) => { $s.int(attr::CAN_MAP_HOST_MEMORY) };
    (computeMode, $s:ident) => { $s.int(attr::COMPUTE_MODE) };
    (maxTexture1D, $s:ident) => { $s.int(attr::MAXIMUM_TEXTURE1D_WIDTH) };
    (maxTexture1DMipmap, $s:ident) => { $s.int(attr::MAXIMUM_TEXTURE1D_MIPMAPPED_WIDTH) };
    (maxTexture1DLinear, $s:ident) => { $s.int(attr::MAXIMUM_TEXTURE1D_LINEAR_WIDTH) };
    (maxTexture2D, $s:ident) => { $s.ints([attr::MAXIMUM_TEXTURE2D_WIDTH, attr::MAXIMUM_TEXTURE2D_HEIGHT]) };
    (maxTexture2DMipmap, $s:ident) => {
        $s.ints([attr::MAXIMUM_TEXTURE2D_MIPMAPPED_WIDTH, attr::MAXIMUM_TEXTURE2D_MIPMAPPED_HEIGHT])
    };
    (maxTexture2DLinear, $s:ident) => {
        $s.ints([
            attr::MAXIMUM_TEXTURE2D_LINEAR_WIDTH,
            attr::MAXIMUM_TEXTURE2D_LINEAR_HEIGHT,
            attr::MAXIMUM_TEXTURE2D_LINEAR_PITCH,
        ])
    };
    (maxTexture2DGather, $s:ident) => {
        $s.ints([attr::MAXIMUM_TEXTURE2D_GATHER_WIDTH, attr::MAXIMUM_TEXTURE2D_GATHER_HEIGHT])
    };
    (maxTexture3D, $s:ident) => {
        $s.ints([attr::MAXIMUM_TEXTURE3D_WIDTH, attr::MAXIMUM_TEXTURE3D_HEIGHT, attr::MAXIMUM_TEXTURE3D_DEPTH])
    };
    (maxTexture3DAlt, $s:ident) => {
        $s.ints([
            attr::MAXIMUM_TEXTURE3D_WIDTH_ALTERNATE,
            attr::MAXIMUM_TEXTURE3D_HEIGHT_ALTERNATE,
            attr::MAXIMUM_TEXTURE3D_DEPTH_ALTERNATE,
        ])
    };
    (maxTextureCubemap, $s:ident) => { $s.int(attr::MAXIMUM_TEXTURECUBEMAP_WIDTH) };
    (maxTexture1DLayered, $s:ident) => {
        $s.ints([attr::MAXIMUM_TEXTURE1D_LAYERED_WIDTH, attr::MAXIMUM_TEXTURE1D_LAYERED_LAYERS])
    };
    (maxTexture2DLayered, $s:ident) => {
        $s.ints([
            attr::MAXIMUM_TEXTURE2D_LAYERED_WIDTH,
            attr::MAXIMUM_TEXTURE2D_LAYERED_HEIGHT,
            attr::MAXIMUM_TEXTURE2D_LAYERED_LAYERS,
        ])
    };
    (maxTextureCubemapLayered, $s:ident) => {
        $s.ints([attr::MAXIMUM_TEXTURECUBEMAP_LAYERED_WIDTH, attr::MAXIMUM_TEXTURECUBEMAP_LAYERED_LAYERS])
    };
    (maxSurface1D, $s:ident) => { $s.int(attr::MAXIMUM_SURFACE1D_WIDTH) };
    (maxSurface2D, $s:ident) => { $s.ints([attr::MAXIMUM_SURFACE2D_WIDTH, attr::MAXIMUM_SURFACE2D_HEIGHT]) };
    (maxSurface3D, $s:ident) => {
        $s.ints([attr::MAXIMUM_SURFACE3D_WIDTH, attr::MAXIMUM_SURFACE3D_HEIGHT, attr::MAXIMUM_SURFACE3D_DEPTH])
    };
    (maxSurface1DLayered, $s:ident) => {
        $s.ints([attr::MAXIMUM_SURFACE1D_LAYERED_WIDTH, attr::MAXIMUM_SURFACE1D_LAYERED_LAYERS])
    };
    (maxSurface2DLayered, $s:ident) => {
        $s.ints([
            attr::MAXIMUM_SURFACE2D_LAYERED_WIDTH,
            attr::MAXIMUM_SURFACE2D_LAYERED_HEIGHT,
            attr::MAXIMUM_SURFACE2D_LAYERED_LAYERS,
        ])
    };
    (maxSurfaceCubemap, $s:ident) => { $s.int(attr::MAXIMUM_SURFACECUBEMAP_WIDTH) };
    (maxSurfaceCubemapLayered, $s:ident) => {
        $s.ints([attr::MAXIMUM_SURFACECUBEMAP_LAYERED_WIDTH, attr::MAXIMUM_SURFACECUBEMAP_LAYERED_LAYERS])
    };
    (surfaceAlignment, $s:ident) => { $s.size(attr::SURFACE_ALIGNMENT) };
    (concurrentKernels, $s:ident) => { $s.int(attr::CONCURRENT_KERNELS) };
    (ECCEnabled, $s:ident) => { $s.int(attr::ECC_ENABLED) };
    (pciBusID, $s:ident) => { $s.int(attr::PCI_BUS_ID) };
    (pciDeviceID, $s:ident) => { $s.int(attr::PCI_DEVICE_ID) };
    (pciDomainID, $s:ident) => { $s.int(attr::PCI_DOMAIN_ID) };
    (tccDriver, $s:ident) => { $s.int(attr::TCC_DRIVER) };
    (asyncEngineCount, $s:ident) => { $s.int(attr::ASYNC_ENGINE_COUNT) };
    (unifiedAddressing, $s:ident) => { $s.int(attr::UNIFIED_ADDRESSING) };
    (memoryClockRate, $s:ident) => { $s.int(attr::MEMORY_CLOCK_RATE) };
    (memoryBusWidth, $s:ident) => { $s.int(attr::GLOBAL_MEMORY_BUS_WIDTH) };
    (l2CacheSize, $s:ident) => { $s.int(attr::L2_CACHE_SIZE) };
    (persistingL2CacheMaxSize, $s:ident) => { $s.int(attr::MAX_PERSISTING_L2_CACHE_SIZE) };
    (maxThreadsPerMultiProcessor, $s:ident) => { $s.int(attr::MAX_THREADS_PER_MULTIPROCESSOR) };
    (streamPrioritiesSupported, $s:ident) => { $s.int(attr::STREAM_PRIORITIES_SUPPORTED) };
    (globalL1CacheSupported, $s:ident) => { $s.int(attr::GLOBAL_L1_CACHE_SUPPORTED) };
    (localL1CacheSupported, $s:ident) => { $s.int(attr::LOCAL_L1_CACHE_SUPPORTED) };
    (sharedMemPerMultiprocessor, $s:ident) => { $s.size(attr::MAX_SHARED_MEMORY_PER_MULTIPROCESSOR) };
    (regsPerMultiprocessor, $s:ident) => { $s.int(attr::MAX_REGISTERS_PER_MULTIPROCESSOR) };
    (managedMemory, $s:ident) => { $s.int(attr::MANAGED_MEMORY) };
    (isMultiGpuBoard, $s:ident) => { $s.int(attr::MULTI_GPU_BOARD) };
    (multiGpuBoardGroupID, $s:ident) => { $s.int(attr::MULTI_GPU_BOARD_GROUP_ID) };
    (hostNativeAtomicSupported, $s:ident) => { $s.int(attr::HOST_NATIVE_ATOMIC_SUPPORTED) };
    (singleToDoublePrecisionPerfRatio, $s:ident) => { $s.int(attr::SINGLE_TO_DOUBLE_PRECISION_PERF_RATIO) };
    (pageableMemoryAccess, $s:ident) => { $s.int(attr::PAGEABLE_MEMORY_ACCESS) };
    (concurrentManagedAccess, $s:ident) => { $s.int(attr::CONCURRENT_MANAGED_ACCESS) };
    (computePreemptionSupported, $s:ident) => { $s.int(attr::COMPUTE_PREEMPTION_SUPPORTED) };
    (canUseHostPointerForRegisteredMem, $s:ident) => { $s.int(attr::CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM) };
    (cooperativeLaunch, $s:ident) => { $s.int(attr::COOPERATIVE_LAUNCH) };
    (cooperativeMultiDeviceLaunch, $s:ident) => { $s.int(attr::COOPERATIVE_MULTI_DEVICE_LAUNCH) };
    (sharedMemPerBlockOptin, $s:ident) => { $s.size(attr::MAX_SHARED_MEMORY_PER_BLOCK_OPTIN) };
    (pageableMemoryAccessUsesHostPageTables, $s:ident) => {
        $s.int(attr::PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES)
    };
    (directManagedMemAccessFromHost, $s:ident) => { $s.int(attr::DIRECT_MANAGED_MEM_ACCESS_FROM_HOST) };
    (maxBlocksPerMultiProcessor, $s:ident) => { $s.int(attr::MAX_BLOCKS_PER_MULTIPROCESSOR) };
    (accessPolicyMaxWindowSize, $s:ident) => { $s.int(attr::MAX_ACCESS_POLICY_WINDOW_SIZE) };
    (reservedSharedMemPerBlock, $s:ident) => { $s.size(attr::RESERVED_SHARED_MEMORY_PER_BLOCK) };

    // Since CUDA 12.
    (hostRegisterSupported, $s:ident) => { $s.int(attr::HOST_REGISTER_SUPPORTED) };
    (sparseCudaArraySupported, $s:ident) => { $s.int(attr::SPARSE_CUDA_ARRAY_SUPPORTED) };
    (hostRegisterReadOnlySupported, $s:ident) => { $s.int(attr::READ_ONLY_HOST_REGISTER_SUPPORTED) };
    (timelineSemaphoreInteropSupported, $s:ident) => { $s.int(attr::TIMELINE_SEMAPHORE_INTEROP_SUPPORTED) };
    (memoryPoolsSupported, $s:ident) => { $s.int(attr::MEMORY_POOLS_SUPPORTED) };
    (gpuDirectRDMASupported, $s:ident) => { $s.int(attr::GPU_DIRECT_RDMA_SUPPORTED) };
    (gpuDirectRDMAFlushWritesOptions, $s:ident) => { $s.uint(attr::GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS) };
    (gpuDirectRDMAWritesOrdering, $s:ident) => { $s.int(attr::GPU_DIRECT_RDMA_WRITES_ORDERING) };
    (memoryPoolSupportedHandleTypes, $s:ident) => { $s.uint(attr::MEMPOOL_SUPPORTED_HANDLE_TYPES) };
    (deferredMappingCudaArraySupported, $s:ident) => { $s.int(attr::DEFERRED_MAPPING_CUDA_ARRAY_SUPPORTED) };
    (ipcEventSupported, $s:ident) => { $s.int(attr::IPC_EVENT_SUPPORTED) };
    (clusterLaunch, $s:ident) => { $s.int(attr::CLUSTER_LAUNCH) };
    (unifiedFunctionPointers, $s:ident) => { $s.int(attr::UNIFIED_FUNCTION_POINTERS) };

    // Since CUDA 13.
    (deviceNumaConfig, $s:ident) => { $s.int(attr::NUMA_CONFIG) };
    (deviceNumaId, $s:ident) => { $s.int(attr::NUMA_ID) };
    (mpsEnabled, $s:ident) => { $s.int(attr::MPS_ENABLED) };
    (hostNumaId, $s:ident) => { $s.int(attr::HOST_NUMA_ID) };
    (gpuPciDeviceID, $s:ident) => { $s.uint(attr::GPU_PCI_DEVICE_ID) };
    (gpuPciSubsystemID, $s:ident) => { $s.uint(attr::GPU_PCI_SUBSYSTEM_ID) };
    (hostNumaMultinodeIpcSupported, $s:ident) => { $s.int(attr::HOST_NUMA_MULTINODE_IPC_SUPPORTED) };
}

/// Declares a `#[repr(C)]` mirror of one version's `cudaDeviceProp`, its field table
/// (`FIELDS`, for the layout tests) and its fill function (one `field_value!` per field).
macro_rules! device_prop {
    ($(#[$meta:meta])* pub struct $ty:ident { $($field:ident: $fty:ty,)* }) => {
        $(#[$meta])*
        #[repr(C)]
        #[allow(non_snake_case)]
        #[derive(Debug, Clone, Copy)]
        pub struct $ty {
            $(pub $field: $fty,)*
        }

        impl $ty {
            /// Every field with its offset, size and alignment, in declaration order.
            pub const FIELDS: &[FieldLayout] = &[$(FieldLayout {
                name: stringify!($field),
                offset: std::mem::offset_of!($ty, $field),
                size: size_of::<$fty>(),
                align: align_of::<$fty>(),
            },)*];
        }

        impl FillFrom for $ty {
            fn fill_from(&mut self, src: &Source<'_>) {
                $(self.$field = field_value!($field, src);)*
            }
        }
    };
}

device_prop! {
    /// `struct cudaDeviceProp` of CUDA 11.x (checked against 11.8), 728 bytes.
    pub struct DeviceProp11 {
        name: [c_char; 256],
        uuid: [c_char; 16],
        luid: [c_char; 8],
        luidDeviceNodeMask: c_uint,
        totalGlobalMem: usize,
        sharedMemPerBlock: usize,
        regsPerBlock: c_int,
        warpSize: c_int,
        memPitch: usize,
        maxThreadsPerBlock: c_int,
        maxThreadsDim: [c_int; 3],
        maxGridSize: [c_int; 3],
        clockRate: c_int,
        totalConstMem: usize,
        major: c_int,
        minor: c_int,
        textureAlignment: usize,
        texturePitchAlignment: usize,
        deviceOverlap: c_int,
        multiProcessorCount: c_int,
        kernelExecTimeoutEnabled: c_int,
        integrated: c_int,
        canMapHostMemory: c_int,
        computeMode: c_int,
        maxTexture1D: c_int,
        maxTexture1DMipmap: c_int,
        maxTexture1DLinear: c_int,
        maxTexture2D: [c_int; 2],
        maxTexture2DMipmap: [c_int; 2],
        maxTexture2DLinear: [c_int; 3],
        maxTexture2DGather: [c_int; 2],
        maxTexture3D: [c_int; 3],
        maxTexture3DAlt: [c_int; 3],
        maxTextureCubemap: c_int,
        maxTexture1DLayered: [c_int; 2],
        maxTexture2DLayered: [c_int; 3],
        maxTextureCubemapLayered: [c_int; 2],
        maxSurface1D: c_int,
        maxSurface2D: [c_int; 2],
        maxSurface3D: [c_int; 3],
        maxSurface1DLayered: [c_int; 2],
        maxSurface2DLayered: [c_int; 3],
        maxSurfaceCubemap: c_int,
        maxSurfaceCubemapLayered: [c_int; 2],
        surfaceAlignment: usize,
        concurrentKernels: c_int,
        ECCEnabled: c_int,
        pciBusID: c_int,
        pciDeviceID: c_int,
        pciDomainID: c_int,
        tccDriver: c_int,
        asyncEngineCount: c_int,
        unifiedAddressing: c_int,
        memoryClockRate: c_int,
        memoryBusWidth: c_int,
        l2CacheSize: c_int,
        persistingL2CacheMaxSize: c_int,
        maxThreadsPerMultiProcessor: c_int,
        streamPrioritiesSupported: c_int,
        globalL1CacheSupported: c_int,
        localL1CacheSupported: c_int,
        sharedMemPerMultiprocessor: usize,
        regsPerMultiprocessor: c_int,
        managedMemory: c_int,
        isMultiGpuBoard: c_int,
        multiGpuBoardGroupID: c_int,
        hostNativeAtomicSupported: c_int,
        singleToDoublePrecisionPerfRatio: c_int,
        pageableMemoryAccess: c_int,
        concurrentManagedAccess: c_int,
        computePreemptionSupported: c_int,
        canUseHostPointerForRegisteredMem: c_int,
        cooperativeLaunch: c_int,
        cooperativeMultiDeviceLaunch: c_int,
        sharedMemPerBlockOptin: usize,
        pageableMemoryAccessUsesHostPageTables: c_int,
        directManagedMemAccessFromHost: c_int,
        maxBlocksPerMultiProcessor: c_int,
        accessPolicyMaxWindowSize: c_int,
        reservedSharedMemPerBlock: usize,
    }
}

device_prop! {
    /// `struct cudaDeviceProp` of CUDA 12.x (checked against 12.9), 1032 bytes: 11's fields,
    /// then thirteen new ones and a reserved tail. (Headers before 12.9 split that tail into
    /// `reserved2`/`reserved1`/`reserved` of the same total size.)
    pub struct DeviceProp12 {
        name: [c_char; 256],
        uuid: [c_char; 16],
        luid: [c_char; 8],
        luidDeviceNodeMask: c_uint,
        totalGlobalMem: usize,
        sharedMemPerBlock: usize,
        regsPerBlock: c_int,
        warpSize: c_int,
        memPitch: usize,
        maxThreadsPerBlock: c_int,
        maxThreadsDim: [c_int; 3],
        maxGridSize: [c_int; 3],
        clockRate: c_int,
        totalConstMem: usize,
        major: c_int,
        minor: c_int,
        textureAlignment: usize,
        texturePitchAlignment: usize,
        deviceOverlap: c_int,
        multiProcessorCount: c_int,
        kernelExecTimeoutEnabled: c_int,
        integrated: c_int,
        canMapHostMemory: c_int,
        computeMode: c_int,
        maxTexture1D: c_int,
        maxTexture1DMipmap: c_int,
        maxTexture1DLinear: c_int,
        maxTexture2D: [c_int; 2],
        maxTexture2DMipmap: [c_int; 2],
        maxTexture2DLinear: [c_int; 3],
        maxTexture2DGather: [c_int; 2],
        maxTexture3D: [c_int; 3],
        maxTexture3DAlt: [c_int; 3],
        maxTextureCubemap: c_int,
        maxTexture1DLayered: [c_int; 2],
        maxTexture2DLayered: [c_int; 3],
        maxTextureCubemapLayered: [c_int; 2],
        maxSurface1D: c_int,
        maxSurface2D: [c_int; 2],
        maxSurface3D: [c_int; 3],
        maxSurface1DLayered: [c_int; 2],
        maxSurface2DLayered: [c_int; 3],
        maxSurfaceCubemap: c_int,
        maxSurfaceCubemapLayered: [c_int; 2],
        surfaceAlignment: usize,
        concurrentKernels: c_int,
        ECCEnabled: c_int,
        pciBusID: c_int,
        pciDeviceID: c_int,
        pciDomainID: c_int,
        tccDriver: c_int,
        asyncEngineCount: c_int,
        unifiedAddressing: c_int,
        memoryClockRate: c_int,
        memoryBusWidth: c_int,
        l2CacheSize: c_int,
        persistingL2CacheMaxSize: c_int,
        maxThreadsPerMultiProcessor: c_int,
        streamPrioritiesSupported: c_int,
        globalL1CacheSupported: c_int,
        localL1CacheSupported: c_int,
        sharedMemPerMultiprocessor: usize,
        regsPerMultiprocessor: c_int,
        managedMemory: c_int,
        isMultiGpuBoard: c_int,
        multiGpuBoardGroupID: c_int,
        hostNativeAtomicSupported: c_int,
        singleToDoublePrecisionPerfRatio: c_int,
        pageableMemoryAccess: c_int,
        concurrentManagedAccess: c_int,
        computePreemptionSupported: c_int,
        canUseHostPointerForRegisteredMem: c_int,
        cooperativeLaunch: c_int,
        cooperativeMultiDeviceLaunch: c_int,
        sharedMemPerBlockOptin: usize,
        pageableMemoryAccessUsesHostPageTables: c_int,
        directManagedMemAccessFromHost: c_int,
        maxBlocksPerMultiProcessor: c_int,
        accessPolicyMaxWindowSize: c_int,
        reservedSharedMemPerBlock: usize,
        hostRegisterSupported: c_int,
        sparseCudaArraySupported: c_int,
        hostRegisterReadOnlySupported: c_int,
        timelineSemaphoreInteropSupported: c_int,
        memoryPoolsSupported: c_int,
        gpuDirectRDMASupported: c_int,
        gpuDirectRDMAFlushWritesOptions: c_uint,
        gpuDirectRDMAWritesOrdering: c_int,
        memoryPoolSupportedHandleTypes: c_uint,
        deferredMappingCudaArraySupported: c_int,
        ipcEventSupported: c_int,
        clusterLaunch: c_int,
        unifiedFunctionPointers: c_int,
        reserved: [c_int; 63],
    }
}

device_prop! {
    /// `struct cudaDeviceProp` of CUDA 13.x (checked against 13.0; 13.5 is identical),
    /// 1008 bytes: 12's fields less the deprecated `clockRate`, `deviceOverlap`,
    /// `kernelExecTimeoutEnabled`, `computeMode`, `maxTexture1DLinear`, `memoryClockRate`,
    /// `singleToDoublePrecisionPerfRatio` and `cooperativeMultiDeviceLaunch`, plus seven
    /// NUMA/MPS/PCI fields taken from the reserved tail.
    pub struct DeviceProp13 {
        name: [c_char; 256],
        uuid: [c_char; 16],
        luid: [c_char; 8],
        luidDeviceNodeMask: c_uint,
        totalGlobalMem: usize,
        sharedMemPerBlock: usize,
        regsPerBlock: c_int,
        warpSize: c_int,
        memPitch: usize,
        maxThreadsPerBlock: c_int,
        maxThreadsDim: [c_int; 3],
        maxGridSize: [c_int; 3],
        totalConstMem: usize,
        major: c_int,
        minor: c_int,
        textureAlignment: usize,
        texturePitchAlignment: usize,
        multiProcessorCount: c_int,
        integrated: c_int,
        canMapHostMemory: c_int,
        maxTexture1D: c_int,
        maxTexture1DMipmap: c_int,
        maxTexture2D: [c_int; 2],
        maxTexture2DMipmap: [c_int; 2],
        maxTexture2DLinear: [c_int; 3],
        maxTexture2DGather: [c_int; 2],
        maxTexture3D: [c_int; 3],
        maxTexture3DAlt: [c_int; 3],
        maxTextureCubemap: c_int,
        maxTexture1DLayered: [c_int; 2],
        maxTexture2DLayered: [c_int; 3],
        maxTextureCubemapLayered: [c_int; 2],
        maxSurface1D: c_int,
        maxSurface2D: [c_int; 2],
        maxSurface3D: [c_int; 3],
        maxSurface1DLayered: [c_int; 2],
        maxSurface2DLayered: [c_int; 3],
        maxSurfaceCubemap: c_int,
        maxSurfaceCubemapLayered: [c_int; 2],
        surfaceAlignment: usize,
        concurrentKernels: c_int,
        ECCEnabled: c_int,
        pciBusID: c_int,
        pciDeviceID: c_int,
        pciDomainID: c_int,
        tccDriver: c_int,
        asyncEngineCount: c_int,
        unifiedAddressing: c_int,
        memoryBusWidth: c_int,
        l2CacheSize: c_int,
        persistingL2CacheMaxSize: c_int,
        maxThreadsPerMultiProcessor: c_int,
        streamPrioritiesSupported: c_int,
        globalL1CacheSupported: c_int,
        localL1CacheSupported: c_int,
        sharedMemPerMultiprocessor: usize,
        regsPerMultiprocessor: c_int,
        managedMemory: c_int,
        isMultiGpuBoard: c_int,
        multiGpuBoardGroupID: c_int,
        hostNativeAtomicSupported: c_int,
        pageableMemoryAccess: c_int,
        concurrentManagedAccess: c_int,
        computePreemptionSupported: c_int,
        canUseHostPointerForRegisteredMem: c_int,
        cooperativeLaunch: c_int,
        sharedMemPerBlockOptin: usize,
        pageableMemoryAccessUsesHostPageTables: c_int,
        directManagedMemAccessFromHost: c_int,
        maxBlocksPerMultiProcessor: c_int,
        accessPolicyMaxWindowSize: c_int,
        reservedSharedMemPerBlock: usize,
        hostRegisterSupported: c_int,
        sparseCudaArraySupported: c_int,
        hostRegisterReadOnlySupported: c_int,
        timelineSemaphoreInteropSupported: c_int,
        memoryPoolsSupported: c_int,
        gpuDirectRDMASupported: c_int,
        gpuDirectRDMAFlushWritesOptions: c_uint,
        gpuDirectRDMAWritesOrdering: c_int,
        memoryPoolSupportedHandleTypes: c_uint,
        deferredMappingCudaArraySupported: c_int,
        ipcEventSupported: c_int,
        clusterLaunch: c_int,
        unifiedFunctionPointers: c_int,
        deviceNumaConfig: c_int,
        deviceNumaId: c_int,
        mpsEnabled: c_int,
        hostNumaId: c_int,
        gpuPciDeviceID: c_uint,
        gpuPciSubsystemID: c_uint,
        hostNumaMultinodeIpcSupported: c_int,
        reserved: [c_int; 56],
    }
}

const _: () = {
    assert!(size_of::<DeviceProp11>() == 728);
    assert!(size_of::<DeviceProp12>() == 1032);
    assert!(size_of::<DeviceProp13>() == 1008);
};

/// The compute capability a `struct cudaDeviceProp` of `abi` asks for (`cudaChooseDevice`).
///
/// # Safety
/// `src` must be valid for reads of [`device_prop_size`]`(abi)` bytes. It need not be aligned.
pub unsafe fn requested_compute_capability(abi: Abi, src: *const c_void) -> (i32, i32) {
    let (major, minor) = match abi {
        Abi::V11 => (std::mem::offset_of!(DeviceProp11, major), std::mem::offset_of!(DeviceProp11, minor)),
        Abi::V12 => (std::mem::offset_of!(DeviceProp12, major), std::mem::offset_of!(DeviceProp12, minor)),
        Abi::V13 => (std::mem::offset_of!(DeviceProp13, major), std::mem::offset_of!(DeviceProp13, minor)),
    };
    let read = |at: usize| {
        // SAFETY: `at` is the offset of a field of this ABI's struct, so within the
        // `device_prop_size(abi)` readable bytes at `src` (this function's contract).
        let field = unsafe { src.cast::<u8>().add(at) };
        // SAFETY: an `int` there, read without assuming alignment (the caller's need not be).
        unsafe { field.cast::<c_int>().read_unaligned() }
    };
    (read(major), read(minor))
}
