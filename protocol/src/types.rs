//! Wire types written by hand: plain structs the spec names with `pod(...)` and the
//! ABI-neutral forms of ABI-dependent structs (`abi_struct(...)`).

/// `dim3` / `uint3`: the same 12-byte layout in every CUDA version.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, bincode::Encode, bincode::Decode)]
pub struct Dim3 {
    pub x: u32,
    pub y: u32,
    pub z: u32,
}

impl Dim3 {
    pub const fn new(x: u32, y: u32, z: u32) -> Self {
        Dim3 { x, y, z }
    }

    /// Total count (threads in a block, blocks in a grid); `u64::MAX` (more than any limit)
    /// where the product does not fit.
    pub fn volume(&self) -> u64 {
        u64::from(self.x).saturating_mul(u64::from(self.y)).saturating_mul(u64::from(self.z))
    }
}

/// `cudaChannelFormatDesc`: bits per component and the component kind.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, bincode::Encode, bincode::Decode)]
pub struct ChannelFormatDesc {
    pub x: i32,
    pub y: i32,
    pub z: i32,
    pub w: i32,
    pub f: i32,
}

impl ChannelFormatDesc {
    /// Bytes of one element: the channels' bits together (`None` when that is not a whole,
    /// positive number of bytes). Which formats CUDA accepts is for the server to decide.
    pub fn element_size(&self) -> Option<u64> {
        let bits = [self.x, self.y, self.z, self.w];
        if bits.iter().any(|&b| b < 0) {
            return None;
        }
        let total: i64 = bits.iter().map(|&b| i64::from(b)).sum();
        (total > 0 && total % 8 == 0).then_some(total as u64 / 8)
    }
}

/// The bytes a CUDA array of `element_size`-byte texels takes in CUDA's packed layout, which
/// Phos accounts as device memory: each level's rows, slices and layers one after another,
/// levels 16 bytes apart. `extent` is cudaMalloc3DArray's (height 0 for 1D, depth 0 for 1D
/// and 2D, layers in depth when `flags` has cudaArrayLayered 1 or cudaArrayCubemap 4);
/// `levels` 0 or 1 for a plain array, clamped to what the extent allows as CUDA does. `None`
/// when the size does not fit 64 bits.
pub fn array_bytes(element_size: u64, extent: [u64; 3], flags: u32, levels: u32) -> Option<u64> {
    let layered = flags & (1 | 4) != 0;
    let [w, h, d] = extent;
    let (dims, layers) = if layered { ([w, h.max(1), 1], d.max(1)) } else { ([w, h.max(1), d.max(1)], 1) };
    let largest = dims.iter().copied().max().unwrap_or(1).max(1);
    let levels = levels.clamp(1, 64 - largest.leading_zeros());
    let mut total = 0u64;
    for l in 0..levels {
        let [lw, lh, ld] = dims.map(|x| (x >> l).max(1));
        let size = element_size.checked_mul(lw)?.checked_mul(lh)?.checked_mul(ld)?.checked_mul(layers)?;
        total = total.checked_add(size)?.checked_next_multiple_of(16)?;
    }
    Some(total)
}

/// `cudaTextureDesc` in CUDA 12's layout (with `seamlessCubemap`): how a texture is sampled.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Default, bincode::Encode, bincode::Decode)]
pub struct TextureDescWire {
    pub address_mode: [i32; 3],
    pub filter_mode: i32,
    pub read_mode: i32,
    pub srgb: i32,
    pub border_color: [f32; 4],
    pub normalized_coords: i32,
    pub max_anisotropy: u32,
    pub mipmap_filter_mode: i32,
    pub mipmap_level_bias: f32,
    pub min_mipmap_level_clamp: f32,
    pub max_mipmap_level_clamp: f32,
    pub disable_trilinear_optimization: i32,
    pub seamless_cubemap: i32,
}

/// `cudaResourceViewDesc` without CUDA 13's reserved words.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, bincode::Encode, bincode::Decode)]
pub struct ResourceViewWire {
    pub format: i32,
    pub width: u64,
    pub height: u64,
    pub depth: u64,
    pub first_mipmap_level: u32,
    pub last_mipmap_level: u32,
    pub first_layer: u32,
    pub last_layer: u32,
}

/// `cudaExtent`: width (bytes for linear memory), height and depth of a 3D region.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, bincode::Encode, bincode::Decode)]
pub struct Extent {
    pub width: usize,
    pub height: usize,
    pub depth: usize,
}

/// `cudaPitchedPtr`: a pitched allocation (`pitch` bytes per row, `xsize` by `ysize`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, bincode::Encode, bincode::Decode)]
pub struct PitchedPtr {
    pub ptr: u64,
    pub pitch: usize,
    pub xsize: usize,
    pub ysize: usize,
}

/// What `cudaFuncGetAttributes` reports of a kernel, independent of the `cudaFuncAttributes`
/// layout (CUDA 12 appended the cluster fields).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, bincode::Encode, bincode::Decode)]
pub struct FuncAttributes {
    pub shared_size_bytes: u64,
    pub const_size_bytes: u64,
    pub local_size_bytes: u64,
    pub max_threads_per_block: i32,
    pub num_regs: i32,
    pub ptx_version: i32,
    pub binary_version: i32,
    pub cache_mode_ca: i32,
    pub max_dynamic_shared_size_bytes: i32,
    pub preferred_shmem_carveout: i32,
    pub cluster_dim_must_be_set: i32,
    pub required_cluster: [i32; 3],
    pub cluster_scheduling_policy_preference: i32,
    pub non_portable_cluster_size_allowed: i32,
    pub reserved: i32,
}

/// Everything `cudaGetDeviceProperties` reports, independent of the `cudaDeviceProp` layout
/// of any CUDA version. Most fields are device attributes: `attributes[a]` is the value of
/// `cudaDeviceAttr`/`CUdevice_attribute` number `a` (0 where the device does not report it).
#[derive(Debug, Clone, Default, PartialEq, Eq, bincode::Encode, bincode::Decode)]
pub struct DeviceProperties {
    pub name: String,
    pub uuid: [u8; 16],
    pub luid: [u8; 8],
    pub luid_device_node_mask: u32,
    pub total_global_mem: u64,
    pub attributes: Vec<i32>,
}

impl DeviceProperties {
    /// The value of one attribute, 0 if unknown.
    pub fn attr(&self, attribute: i32) -> i32 {
        usize::try_from(attribute).ok().and_then(|a| self.attributes.get(a)).copied().unwrap_or(0)
    }
}

/// Which values of an [`NvmlDescription`] or [`NvmlState`] the server knows: a bit per value;
/// the guest answers `NVML_ERROR_NOT_SUPPORTED` for a query whose bit is clear.
pub mod nvml_known {
    pub const NAME: u64 = 1 << 0;
    pub const UUID: u64 = 1 << 1;
    pub const PCI: u64 = 1 << 2;
    pub const COMPUTE_CAPABILITY: u64 = 1 << 3;
    pub const COMPUTE_MODE: u64 = 1 << 4;
    pub const ECC: u64 = 1 << 5;
    pub const MAX_CLOCKS: u64 = 1 << 6;
    pub const CUDA_DRIVER_VERSION: u64 = 1 << 7;
    pub const DRIVER_VERSION: u64 = 1 << 8;
    pub const SERIAL: u64 = 1 << 9;
    pub const MINOR_NUMBER: u64 = 1 << 10;
    pub const MAX_PCIE_LINK: u64 = 1 << 11;
    pub const BRAND: u64 = 1 << 12;
    pub const PERSISTENCE: u64 = 1 << 13;
    pub const POWER_LIMIT: u64 = 1 << 14;
    pub const MIG_MODE: u64 = 1 << 15;
    // NvmlState's
    pub const MEMORY: u64 = 1 << 32;
    pub const BAR1: u64 = 1 << 33;
    pub const UTILIZATION: u64 = 1 << 34;
    pub const TEMPERATURE: u64 = 1 << 35;
    pub const POWER_USAGE: u64 = 1 << 36;
    pub const FAN: u64 = 1 << 37;
    pub const PSTATE: u64 = 1 << 38;
    pub const CLOCKS: u64 = 1 << 39;
    pub const APPLICATION_CLOCKS: u64 = 1 << 40;
    pub const PCIE_LINK: u64 = 1 << 41;
    pub const PCIE_THROUGHPUT: u64 = 1 << 42;
    pub const CLOCK_EVENT_REASONS: u64 = 1 << 43;
}

/// What does not change of a session's device, as NVML queries see it (`phosNvmlDescribe`);
/// strings are NUL-padded. A value is meaningful only where its [`nvml_known`] bit is set.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, bincode::Encode, bincode::Decode)]
pub struct NvmlDescription {
    pub known: u64,
    pub total_memory: u64,
    pub index: u32,
    pub cc_major: i32,
    pub cc_minor: i32,
    pub pci_domain: u32,
    pub pci_bus: u32,
    pub pci_device: u32,
    /// The PCI device id in NVML's form: device id in the high 16 bits, vendor id in the low.
    pub pci_device_id: u32,
    pub pci_subsystem_id: u32,
    pub compute_mode: i32,
    pub ecc_enabled: i32,
    pub max_sm_clock_mhz: u32,
    pub max_mem_clock_mhz: u32,
    pub cuda_driver_version: i32,
    pub minor_number: u32,
    pub max_pcie_gen: u32,
    pub max_pcie_width: u32,
    pub brand: i32,
    pub persistence: i32,
    pub power_limit_mw: u32,
    pub enforced_power_limit_mw: u32,
    pub mig_current: u32,
    pub mig_pending: u32,
    pub name: [u8; 96],
    pub uuid: [u8; 16],
    pub driver_version: [u8; 80],
    pub serial: [u8; 32],
}

impl Default for NvmlDescription {
    fn default() -> Self {
        NvmlDescription {
            known: 0,
            total_memory: 0,
            index: 0,
            cc_major: 0,
            cc_minor: 0,
            pci_domain: 0,
            pci_bus: 0,
            pci_device: 0,
            pci_device_id: 0,
            pci_subsystem_id: 0,
            compute_mode: 0,
            ecc_enabled: 0,
            max_sm_clock_mhz: 0,
            max_mem_clock_mhz: 0,
            cuda_driver_version: 0,
            minor_number: 0,
            max_pcie_gen: 0,
            max_pcie_width: 0,
            brand: 0,
            persistence: 0,
            power_limit_mw: 0,
            enforced_power_limit_mw: 0,
            mig_current: 0,
            mig_pending: 0,
            name: [0; 96],
            uuid: [0; 16],
            driver_version: [0; 80],
            serial: [0; 32],
        }
    }
}

/// What changes (`phosNvmlSample`): the session's memory on the device and the device's
/// sensors and clocks, each meaningful only where its [`nvml_known`] bit is set.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, bincode::Encode, bincode::Decode)]
pub struct NvmlState {
    pub known: u64,
    pub memory_total: u64,
    pub memory_used: u64,
    pub memory_free: u64,
    pub bar1_total: u64,
    pub bar1_used: u64,
    pub bar1_free: u64,
    pub clock_event_reasons: u64,
    pub util_gpu: u32,
    pub util_memory: u32,
    pub temperature_c: u32,
    pub power_mw: u32,
    pub fan_percent: u32,
    pub pstate: i32,
    pub clock_graphics_mhz: u32,
    pub clock_sm_mhz: u32,
    pub clock_mem_mhz: u32,
    pub clock_video_mhz: u32,
    pub app_clock_graphics_mhz: u32,
    pub app_clock_mem_mhz: u32,
    pub pcie_gen: u32,
    pub pcie_width: u32,
    pub pcie_tx_kbs: u32,
    pub pcie_rx_kbs: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_volume_too_large_for_u64_saturates() {
        // A launch of 2^32 - 1 cubed blocks overflowed the product (found by the `dispatch`
        // fuzz target); the limit checks need only that it is larger than any limit.
        assert_eq!(Dim3::new(u32::MAX, u32::MAX, u32::MAX).volume(), u64::MAX);
        assert_eq!(Dim3::new(u32::MAX, u32::MAX, 1).volume(), u64::from(u32::MAX) * u64::from(u32::MAX));
        assert_eq!(Dim3::new(32, 4, 2).volume(), 256);
    }

    #[test]
    fn nvml_wire_structs_have_the_sizes_the_spec_declares() {
        // spec/nvml.lapis: pod(NvmlDescription, 328), pod(NvmlState, 128).
        assert_eq!(std::mem::size_of::<NvmlDescription>(), 328);
        assert_eq!(std::mem::size_of::<NvmlState>(), 128);
    }
}

/// `cudaIpcMemHandle_t` / `cudaIpcEventHandle_t` (and the driver's `CUipc*Handle`): 64 opaque
/// bytes. Phos's handles are its own (the server makes and checks them); a guest may send any
/// bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, bincode::Encode, bincode::Decode)]
pub struct IpcHandle {
    pub reserved: [u8; 64],
}

impl Default for IpcHandle {
    fn default() -> Self {
        IpcHandle { reserved: [0; 64] }
    }
}
