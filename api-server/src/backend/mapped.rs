//! A session's device map: the guest knows its devices by the numbers it was given when it
//! started (its device 0 stays its device 0 for the session's whole life), and a session
//! restored or moved onto another device of the machine has those numbers mapped to other
//! devices of the backend. [`Mapped`] is the session's backend with the map applied: every
//! device number the session's code passes (the current device of a call, a device a call
//! names, the device an object was made on, a record's or a memory region's device) is the
//! guest's, and only here does it become the backend's. Nothing else in the server
//! translates, so nothing can forget to.
//!
//! A map is a permutation of the backend's devices: the guest sees as many devices as the
//! machine has (`cudaGetDeviceCount`), each guest number naming exactly one of them.

use std::sync::Arc;

use phos_protocol::CudaError;
use phos_protocol::types::{DeviceProperties, Dim3, FuncAttributes, ResourceViewWire};
use phos_ptx::exec::TextureDesc;

use super::prelude::*;
use super::{
    ArraySide, ArraySpec, Copy2D, Gate, LinkOutcome, LoadedModule, MemOp, Physical, Raw, StreamRef, TextureSource,
    copy_pool, vendor, vendor_cudnn, vendor_cufft, vendor_curand, vendor_cusparse, vendor_lt, vendor_nvml,
};
use crate::registry::memory::MemoryView;

/// Guest device number → backend device number; a permutation of `0..count`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceMap(Vec<i32>);

/// Why a session cannot be put on the device asked for.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MapError {
    #[error("device {device} does not exist here ({devices} devices)")]
    NoSuchDevice { device: i32, devices: i32 },
    #[error(
        "its objects are on devices {devices:?}: a session that uses several devices moves only as a whole; \
         restore or move it without --device (its devices keep their numbers)"
    )]
    SeveralDevices { devices: Vec<i32> },
}

impl DeviceMap {
    /// Every guest device on the backend device of its own number.
    pub fn identity(count: i32) -> Self {
        DeviceMap((0..count.max(0)).collect())
    }

    /// The map that puts a session whose objects are on the guest devices `used` onto backend
    /// device `to`, of a backend with `count` devices: the session's device becomes `to`, and
    /// the device that had `to`'s number takes the session's old one (a swap), so every guest
    /// number still names one device. A session without objects is taken to be on its device
    /// 0, where every guest starts. A session on several devices is refused: which of them
    /// would go to `to` and where the others would go is the operator's to say, and a
    /// move that guessed could put two of them on one device.
    pub fn moving(count: i32, used: impl IntoIterator<Item = i32>, to: i32) -> Result<Self, MapError> {
        if !(0..count).contains(&to) {
            return Err(MapError::NoSuchDevice { device: to, devices: count });
        }
        let mut devices: Vec<i32> = used.into_iter().collect();
        devices.sort_unstable();
        devices.dedup();
        let from = match devices.as_slice() {
            [] => 0,
            [d] => *d,
            _ => return Err(MapError::SeveralDevices { devices }),
        };
        if !(0..count).contains(&from) {
            return Err(MapError::NoSuchDevice { device: from, devices: count });
        }
        let mut map = Self::identity(count);
        map.0.swap(from as usize, to as usize);
        Ok(map)
    }

    pub fn is_identity(&self) -> bool {
        self.0.iter().enumerate().all(|(i, &d)| d == i as i32)
    }

    /// Devices the guest sees.
    pub fn count(&self) -> i32 {
        self.0.len() as i32
    }

    /// The backend device of guest device `device`.
    pub fn backend(&self, device: i32) -> Result<i32, CudaError> {
        usize::try_from(device).ok().and_then(|d| self.0.get(d)).copied().ok_or(CudaError::InvalidDevice)
    }
}

/// `its device 0 on device 1, its device 1 on device 0`: what the server logs of a map.
impl std::fmt::Display for DeviceMap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (guest, backend) in self.0.iter().enumerate() {
            let sep = if guest == 0 { "" } else { ", " };
            write!(f, "{sep}its device {guest} on device {backend}")?;
        }
        Ok(())
    }
}

/// A backend seen through a session's [`DeviceMap`].
pub struct Mapped {
    inner: Arc<dyn Backend>,
    map: DeviceMap,
}

impl Mapped {
    /// `inner` through `map`; `inner` itself where the map changes nothing.
    pub fn wrap(inner: Arc<dyn Backend>, map: DeviceMap) -> Arc<dyn Backend> {
        if map.is_identity() && map.count() == inner.device_count() {
            return inner;
        }
        Arc::new(Mapped { inner, map })
    }

    fn d(&self, device: i32) -> Result<i32, CudaError> {
        self.map.backend(device)
    }
}

impl Devices for Mapped {
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn device_count(&self) -> i32 {
        self.map.count()
    }
    fn backend_device(&self, device: i32) -> i32 {
        self.map.backend(device).unwrap_or(-1)
    }
    fn device_properties(&self, device: i32) -> Result<DeviceProperties, CudaError> {
        self.inner.device_properties(self.d(device)?)
    }
    fn device_attribute(&self, device: i32, attribute: i32) -> Result<i32, CudaError> {
        self.inner.device_attribute(self.d(device)?, attribute)
    }
    fn driver_version(&self) -> i32 {
        self.inner.driver_version()
    }
    fn mem_info(&self, device: i32) -> Result<(u64, u64), CudaError> {
        self.inner.mem_info(self.d(device)?)
    }
    fn bind(&self, device: i32) -> Result<(), CudaError> {
        self.inner.bind(self.d(device)?)
    }
    fn device_synchronize(&self, device: i32) -> Result<(), CudaError> {
        self.inner.device_synchronize(self.d(device)?)
    }
    fn limit(&self, device: i32, limit: i32) -> Result<u64, CudaError> {
        self.inner.limit(self.d(device)?, limit)
    }
    fn set_limit(&self, device: i32, limit: i32, value: u64) -> Result<(), CudaError> {
        self.inner.set_limit(self.d(device)?, limit, value)
    }
    fn cache_config(&self, device: i32) -> Result<i32, CudaError> {
        self.inner.cache_config(self.d(device)?)
    }
    fn set_cache_config(&self, device: i32, config: i32) -> Result<(), CudaError> {
        self.inner.set_cache_config(self.d(device)?, config)
    }
    fn shared_mem_config(&self, device: i32) -> Result<i32, CudaError> {
        self.inner.shared_mem_config(self.d(device)?)
    }
    fn set_shared_mem_config(&self, device: i32, config: i32) -> Result<(), CudaError> {
        self.inner.set_shared_mem_config(self.d(device)?, config)
    }
    fn stream_priority_range(&self, device: i32) -> Result<(i32, i32), CudaError> {
        self.inner.stream_priority_range(self.d(device)?)
    }
    fn can_access_peer(&self, device: i32, peer: i32) -> Result<bool, CudaError> {
        self.inner.can_access_peer(self.d(device)?, self.d(peer)?)
    }
    fn enable_peer_access(&self, device: i32, peer: i32) -> Result<(), CudaError> {
        self.inner.enable_peer_access(self.d(device)?, self.d(peer)?)
    }
    fn disable_peer_access(&self, device: i32, peer: i32) -> Result<(), CudaError> {
        self.inner.disable_peer_access(self.d(device)?, self.d(peer)?)
    }
    fn reset_persisting_l2_cache(&self, device: i32) -> Result<(), CudaError> {
        self.inner.reset_persisting_l2_cache(self.d(device)?)
    }
    fn exec_affinity_support(&self, device: i32, kind: i32) -> Result<i32, CudaError> {
        self.inner.exec_affinity_support(self.d(device)?, kind)
    }
    fn flush_rdma_writes(&self, device: i32, target: i32, scope: i32) -> Result<(), CudaError> {
        self.inner.flush_rdma_writes(self.d(device)?, target, scope)
    }
}

impl VirtualMemory for Mapped {
    fn reserve(&self, base: u64, size: u64) -> Result<(), CudaError> {
        self.inner.reserve(base, size)
    }
    fn unreserve(&self, base: u64, size: u64) {
        self.inner.unreserve(base, size)
    }
    fn granularity(&self, device: i32) -> u64 {
        // Every device the session may name is mapped; an unknown one asks device 0, as the
        // backend would answer for a device it does not check.
        self.inner.granularity(self.d(device).unwrap_or(0))
    }
    fn map(&self, device: i32, addr: u64, size: u64) -> Result<Physical, CudaError> {
        self.inner.map(self.d(device)?, addr, size)
    }
    fn unmap(&self, addr: u64, size: u64, physical: Physical) -> Result<(), CudaError> {
        self.inner.unmap(addr, size, physical)
    }
    fn export_block(&self, addr: u64, len: u64, physical: Physical) -> Result<std::os::fd::OwnedFd, CudaError> {
        self.inner.export_block(addr, len, physical)
    }
    fn import_block(
        &self,
        device: i32,
        file: &std::os::fd::OwnedFd,
        addr: u64,
        len: u64,
    ) -> Result<Physical, CudaError> {
        self.inner.import_block(self.d(device)?, file, addr, len)
    }
}

impl Copies for Mapped {
    fn prepare_hashing(&self, device: i32) -> Result<(), CudaError> {
        self.inner.prepare_hashing(self.d(device)?)
    }
    fn hash_blocks(&self, device: i32, blocks: &[(u64, u64)]) -> Result<Vec<u64>, CudaError> {
        self.inner.hash_blocks(self.d(device)?, blocks)
    }
    fn memcpy_htod(&self, dst: u64, src: &[u8], stream: Option<StreamRef>) -> Result<(), CudaError> {
        self.inner.memcpy_htod(dst, src, stream)
    }
    fn memcpy_dtoh(&self, dst: &mut [u8], src: u64, stream: Option<StreamRef>) -> Result<(), CudaError> {
        self.inner.memcpy_dtoh(dst, src, stream)
    }
    fn memcpy_dtod(&self, dst: u64, src: u64, len: u64, stream: Option<StreamRef>) -> Result<(), CudaError> {
        self.inner.memcpy_dtod(dst, src, len, stream)
    }
    fn memset(&self, dst: u64, value: u8, len: u64, stream: Option<StreamRef>) -> Result<(), CudaError> {
        self.inner.memset(dst, value, len, stream)
    }
    fn memcpy_2d(&self, copy: Copy2D<'_>, width: u64, height: u64, stream: Option<StreamRef>) -> Result<(), CudaError> {
        self.inner.memcpy_2d(copy, width, height, stream)
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
        self.inner.memset_2d(dst, pitch, value, width, height, stream)
    }
}

impl HostMemory for Mapped {
    fn pin_host(&self, buf: &mut [u8]) {
        self.inner.pin_host(buf)
    }
    fn unpin_host(&self, buf: &mut [u8]) {
        self.inner.unpin_host(buf)
    }
    fn copy_pool(&self) -> Option<&copy_pool::CopyPool> {
        self.inner.copy_pool()
    }
    fn pin_shared(&self, addr: u64, len: u64) {
        self.inner.pin_shared(addr, len)
    }
    fn unpin_shared(&self, addr: u64) {
        self.inner.unpin_shared(addr)
    }
    fn register_host(&self, addr: u64, len: u64) -> Result<u64, CudaError> {
        self.inner.register_host(addr, len)
    }
    fn unregister_host(&self, addr: u64) {
        self.inner.unregister_host(addr)
    }
    fn memcpy_registered(
        &self,
        device: u64,
        host: u64,
        len: u64,
        to_device: bool,
        stream: Option<StreamRef>,
    ) -> Result<(), CudaError> {
        self.inner.memcpy_registered(device, host, len, to_device, stream)
    }
}

impl Streams for Mapped {
    fn stream_create(&self, device: i32, flags: u32, priority: i32) -> Result<Raw, CudaError> {
        self.inner.stream_create(self.d(device)?, flags, priority)
    }
    fn stream_destroy(&self, stream: Raw) -> Result<(), CudaError> {
        self.inner.stream_destroy(stream)
    }
    fn stream_synchronize(&self, stream: StreamRef) -> Result<(), CudaError> {
        self.inner.stream_synchronize(stream)
    }
    fn stream_query(&self, stream: StreamRef) -> Result<bool, CudaError> {
        self.inner.stream_query(stream)
    }
    fn stream_wait_event(&self, stream: StreamRef, event: Raw) -> Result<(), CudaError> {
        self.inner.stream_wait_event(stream, event)
    }
    fn host_func(&self, stream: StreamRef, gate: Arc<Gate>) -> Result<(), CudaError> {
        self.inner.host_func(stream, gate)
    }
    fn stream_mem_op(&self, stream: StreamRef, op: MemOp) -> Result<(), CudaError> {
        self.inner.stream_mem_op(stream, op)
    }
}

impl Events for Mapped {
    fn event_create(&self, device: i32, flags: u32) -> Result<Raw, CudaError> {
        self.inner.event_create(self.d(device)?, flags)
    }
    fn event_destroy(&self, event: Raw) -> Result<(), CudaError> {
        self.inner.event_destroy(event)
    }
    fn event_record(&self, event: Raw, stream: StreamRef) -> Result<(), CudaError> {
        self.inner.event_record(event, stream)
    }
    fn event_synchronize(&self, event: Raw) -> Result<(), CudaError> {
        self.inner.event_synchronize(event)
    }
    fn event_query(&self, event: Raw) -> Result<bool, CudaError> {
        self.inner.event_query(event)
    }
    fn event_elapsed(&self, start: Raw, end: Raw) -> Result<f32, CudaError> {
        self.inner.event_elapsed(start, end)
    }
    fn event_export(&self, event: Raw) -> Result<[u8; 64], CudaError> {
        self.inner.event_export(event)
    }
    fn event_import(&self, device: i32, exported: &[u8; 64]) -> Result<Raw, CudaError> {
        self.inner.event_import(self.d(device)?, exported)
    }
}

impl Modules for Mapped {
    fn module_load(&self, device: i32, image: &[u8]) -> Result<LoadedModule, CudaError> {
        self.inner.module_load(self.d(device)?, image)
    }
    fn compile_ptx(&self, device: i32, ptx: &[u8]) -> Option<Vec<u8>> {
        self.inner.compile_ptx(self.d(device).ok()?, ptx)
    }
    fn module_unload(&self, module: Raw) -> Result<(), CudaError> {
        self.inner.module_unload(module)
    }
    fn module_function(&self, module: Raw, name: &str) -> Result<Raw, CudaError> {
        self.inner.module_function(module, name)
    }
    fn module_global(&self, module: Raw, name: &str) -> Result<(u64, u64), CudaError> {
        self.inner.module_global(module, name)
    }
    fn function_attributes(&self, function: Raw) -> Result<FuncAttributes, CudaError> {
        self.inner.function_attributes(function)
    }
    fn function_set_attribute(&self, function: Raw, attr: i32, value: i32) -> Result<(), CudaError> {
        self.inner.function_set_attribute(function, attr, value)
    }
    fn function_set_cache_config(&self, function: Raw, config: i32) -> Result<(), CudaError> {
        self.inner.function_set_cache_config(function, config)
    }
    fn occupancy(&self, function: Raw, block_size: i32, dynamic_smem: u64, flags: u32) -> Result<i32, CudaError> {
        self.inner.occupancy(function, block_size, dynamic_smem, flags)
    }
    fn available_dynamic_smem(&self, function: Raw, blocks: i32, block_size: i32) -> Result<u64, CudaError> {
        self.inner.available_dynamic_smem(function, blocks, block_size)
    }
    fn max_active_clusters(
        &self,
        function: Raw,
        grid: Dim3,
        block: Dim3,
        smem: u32,
        cluster: Option<Dim3>,
    ) -> Result<i32, CudaError> {
        self.inner.max_active_clusters(function, grid, block, smem, cluster)
    }
    fn max_potential_cluster_size(&self, function: Raw, grid: Dim3, block: Dim3, smem: u32) -> Result<i32, CudaError> {
        self.inner.max_potential_cluster_size(function, grid, block, smem)
    }
    fn link(&self, device: i32, inputs: &phos_protocol::jit_link::LinkInputs<'_>) -> LinkOutcome {
        match self.d(device) {
            Ok(d) => self.inner.link(d, inputs),
            Err(e) => LinkOutcome::failed(e.0, "no such device"),
        }
    }
    fn tensor_map_encode(&self, params: &phos_protocol::tensor_map::Params) -> Result<[u8; 128], CudaError> {
        self.inner.tensor_map_encode(params)
    }
    fn tensor_map_replace_address(&self, map: &mut [u8; 128], address: u64) -> Result<(), CudaError> {
        self.inner.tensor_map_replace_address(map, address)
    }
}

impl Launch for Mapped {
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
    ) -> Result<(), CudaError> {
        self.inner.launch(function, grid, block, shared_mem, stream, params, memory, printed, measure, cooperative)
    }
    fn device_time(&self) -> (u64, u64) {
        self.inner.device_time()
    }
    fn measuring(&self) -> bool {
        self.inner.measuring()
    }
}

impl Arrays for Mapped {
    fn array_create(&self, device: i32, spec: &ArraySpec) -> Result<Raw, CudaError> {
        self.inner.array_create(self.d(device)?, spec)
    }
    fn array_destroy(&self, array: Raw, mipmapped: bool) -> Result<(), CudaError> {
        self.inner.array_destroy(array, mipmapped)
    }
    fn mipmap_level(&self, mipmap: Raw, level: u32) -> Result<Raw, CudaError> {
        self.inner.mipmap_level(mipmap, level)
    }
    fn array_copy(
        &self,
        dst: ArraySide<'_>,
        src: ArraySide<'_>,
        extent: [u64; 3],
        stream: Option<StreamRef>,
    ) -> Result<(), CudaError> {
        self.inner.array_copy(dst, src, extent, stream)
    }
    fn texture_create(
        &self,
        source: &TextureSource,
        desc: &TextureDesc,
        view: Option<&ResourceViewWire>,
    ) -> Result<u64, CudaError> {
        self.inner.texture_create(source, desc, view)
    }
    fn texture_destroy(&self, texture: u64) -> Result<(), CudaError> {
        self.inner.texture_destroy(texture)
    }
    fn surface_create(&self, array: Raw) -> Result<u64, CudaError> {
        self.inner.surface_create(array)
    }
    fn surface_destroy(&self, surface: u64) -> Result<(), CudaError> {
        self.inner.surface_destroy(surface)
    }
    fn texture_create_as(
        &self,
        value: u64,
        source: &TextureSource,
        desc: &TextureDesc,
        view: Option<&ResourceViewWire>,
    ) -> Result<u64, CudaError> {
        self.inner.texture_create_as(value, source, desc, view)
    }
    fn surface_create_as(&self, value: u64, array: Raw) -> Result<u64, CudaError> {
        self.inner.surface_create_as(value, array)
    }
}

impl Libraries for Mapped {
    fn cublas(&self) -> Option<&vendor::Cublas> {
        self.inner.cublas()
    }
    fn curand(&self) -> Option<&vendor_curand::Curand> {
        self.inner.curand()
    }
    fn cusolver(&self) -> Option<&vendor::Cusolver> {
        self.inner.cusolver()
    }
    fn cusparse(&self) -> Option<&vendor_cusparse::Cusparse> {
        self.inner.cusparse()
    }
    fn cudnn(&self) -> Option<&vendor_cudnn::Cudnn> {
        self.inner.cudnn()
    }
    fn cublaslt(&self) -> Option<&vendor_lt::CublasLt> {
        self.inner.cublaslt()
    }
    fn cufft(&self) -> Option<&vendor_cufft::Cufft> {
        self.inner.cufft()
    }
    fn nvml(&self) -> Option<&vendor_nvml::Nvml> {
        self.inner.nvml()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::emu::EmuBackend;

    #[test]
    fn a_single_device_session_swaps_with_its_target() {
        let m = DeviceMap::moving(2, [0, 0], 1).unwrap();
        assert_eq!((m.backend(0), m.backend(1), m.backend(2)), (Ok(1), Ok(0), Err(CudaError::InvalidDevice)));
        assert_eq!(DeviceMap::moving(3, [], 2).unwrap().0, vec![2, 1, 0], "no objects: its device 0 moves");
        assert!(DeviceMap::moving(2, [1], 1).unwrap().is_identity());
        assert_eq!(DeviceMap::moving(2, [0], 2), Err(MapError::NoSuchDevice { device: 2, devices: 2 }));
        assert_eq!(DeviceMap::moving(2, [0, 1], 1), Err(MapError::SeveralDevices { devices: vec![0, 1] }));
        assert_eq!(DeviceMap::moving(2, [3], 1), Err(MapError::NoSuchDevice { device: 3, devices: 2 }));
        assert_eq!(m.to_string(), "its device 0 on device 1, its device 1 on device 0");
    }

    #[test]
    fn the_guest_numbers_reach_the_backend_mapped() {
        let emu: Arc<dyn Backend> = Arc::new(EmuBackend::with_devices(1 << 30, 2));
        let m = Mapped::wrap(emu.clone(), DeviceMap::moving(2, [0], 1).unwrap());
        assert_eq!(m.device_count(), 2);
        assert_eq!(m.backend_device(0), 1);
        assert_eq!(m.device_properties(0).unwrap().uuid, emu.device_properties(1).unwrap().uuid);
        assert_eq!(m.bind(2), Err(CudaError::InvalidDevice));
        // Memory taken through guest device 0 is backend device 1's.
        let base = 0x7100_0000_0000;
        m.reserve(base, 4 << 20).unwrap();
        let p = m.map(0, base, 2 << 20).unwrap();
        assert_eq!(emu.mem_info(1).unwrap().0 + (2 << 20), emu.mem_info(0).unwrap().0);
        assert_eq!(m.mem_info(0).unwrap(), emu.mem_info(1).unwrap());
        m.unmap(base, 2 << 20, p).unwrap();
        m.unreserve(base, 4 << 20);
        assert!(Arc::ptr_eq(&Mapped::wrap(emu.clone(), DeviceMap::identity(2)), &emu), "no map: no wrapper");
    }

    /// The map wraps every backend method, so a method with a default body (the backends
    /// that lack a feature inherit it) must be written out here too, or the wrapper would
    /// answer the default for a backend that has the feature: every method of the backend
    /// traits is forwarded by name.
    #[test]
    fn every_backend_method_is_forwarded() {
        let traits = include_str!("mod.rs");
        let forwarded = include_str!("mapped.rs");
        let mut in_trait = false;
        let (mut missing, mut methods) = (Vec::new(), 0);
        for line in traits.lines() {
            if line.starts_with("pub trait ") {
                in_trait = true;
            } else if line == "}" {
                in_trait = false;
            } else if in_trait && let Some(rest) = line.trim_start().strip_prefix("fn ") {
                let name: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
                methods += 1;
                if !forwarded.contains(&format!("fn {name}(")) && !forwarded.contains(&format!("fn {name}<")) {
                    missing.push(name);
                }
            }
        }
        assert!(methods > 60, "the traits' methods were not found ({methods})");
        assert!(missing.is_empty(), "backend methods the device map does not forward: {missing:?}");
    }
}
