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
}
