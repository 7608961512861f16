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

    /// Total count (threads in a block, blocks in a grid), without overflow.
    pub fn volume(&self) -> u64 {
        u64::from(self.x) * u64::from(self.y) * u64::from(self.z)
    }
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
