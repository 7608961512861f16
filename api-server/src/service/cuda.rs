//! The driver API's remote functions (`spec/cuda.lapis`), on the same session as the
//! runtime's: the same devices, and the same objects (a `CUstream` is a stream handle the
//! runtime handed out, and the reverse). Where a driver function is a runtime one under
//! another name, it runs the runtime's method and answers its status in the driver's codes.

use phos_protocol::apis::Function;
use phos_protocol::cuda::*;
use phos_protocol::cudart::CudaStreamSynchronizeRequest;
use phos_protocol::error::driver_status;
use phos_protocol::spec::CallAccess;

use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use phos_protocol::tensor_map::Params;

use super::{CallCx, Session};
use crate::backend::{LinkOutcome, MemOp};
use crate::dispatch::cuda::CudaService;
use crate::dispatch::cudart::CudartService;
use crate::registry::memory::VmmError;

impl CudaService for Session {
    type Cx = CallCx;

    fn check_device_range(&self, cx: &CallCx, addr: u64, len: u64, null_ok: bool) -> Result<(), CuError> {
        CudartService::check_device_range(self, cx, addr, len, null_ok).map_err(driver_status)
    }

    fn max_reply_bytes(&self) -> u64 {
        self.max_reply
    }

    fn record(&self, cx: &CallCx, id: FunctionId, payload: &[u8], facts: &phos_protocol::spec::RecordFacts<'_>) {
        self.records.record(Function::Cuda(id), cx.device, payload, facts);
    }

    // The C/R engine's hook sees the driver API's calls as it sees the runtime's.
    fn intercepting(&self) -> bool {
        self.hooks.active()
    }

    fn before_call(&self, _: &CallCx, _: FunctionId, access: &CallAccess<'_>) -> Result<(), CuError> {
        self.hooks.before_call(access).map_err(driver_status)
    }

    fn cu_init(&self, _: &CallCx, _: CuInitRequest) -> Result<CuInitReply, CuError> {
        match self.backend.device_count() {
            0 => Err(CuError::NO_DEVICE),
            _ => Ok(CuInitReply {}),
        }
    }

    fn cu_driver_get_version(
        &self,
        _: &CallCx,
        _: CuDriverGetVersionRequest,
    ) -> Result<CuDriverGetVersionReply, CuError> {
        Ok(CuDriverGetVersionReply { driverVersion: self.backend.driver_version() })
    }

    fn cu_device_get(&self, _: &CallCx, req: CuDeviceGetRequest) -> Result<CuDeviceGetReply, CuError> {
        self.check_device(req.ordinal).map_err(driver_status)?;
        Ok(CuDeviceGetReply { device: req.ordinal })
    }

    fn cu_device_get_count(&self, _: &CallCx, _: CuDeviceGetCountRequest) -> Result<CuDeviceGetCountReply, CuError> {
        // Unlike cudaGetDeviceCount, the driver answers 0 devices with success.
        Ok(CuDeviceGetCountReply { count: self.backend.device_count() })
    }

    fn cu_device_get_name(&self, _: &CallCx, req: CuDeviceGetNameRequest) -> Result<CuDeviceGetNameReply, CuError> {
        self.check_device(req.dev).map_err(driver_status)?;
        let properties = self.backend.device_properties(req.dev).map_err(driver_status)?;
        Ok(CuDeviceGetNameReply { name: c_string_in(&properties.name, req.len) })
    }

    fn cu_device_get_attribute(
        &self,
        _: &CallCx,
        req: CuDeviceGetAttributeRequest,
    ) -> Result<CuDeviceGetAttributeReply, CuError> {
        self.check_device(req.dev).map_err(driver_status)?;
        // CU_DEVICE_ATTRIBUTE_* and cudaDevAttr* are the same numbers.
        let value = self.backend.device_attribute(req.dev, req.attrib).map_err(driver_status)?;
        Ok(CuDeviceGetAttributeReply { pi: value })
    }

    fn cu_device_total_mem_v2(
        &self,
        _: &CallCx,
        req: CuDeviceTotalMemV2Request,
    ) -> Result<CuDeviceTotalMemV2Reply, CuError> {
        self.check_device(req.dev).map_err(driver_status)?;
        let properties = self.backend.device_properties(req.dev).map_err(driver_status)?;
        Ok(CuDeviceTotalMemV2Reply { bytes: properties.total_global_mem })
    }

    fn cu_stream_synchronize(
        &self,
        cx: &CallCx,
        req: CuStreamSynchronizeRequest,
    ) -> Result<CuStreamSynchronizeReply, CuError> {
        self.cuda_stream_synchronize(cx, CudaStreamSynchronizeRequest { stream: req.hStream })
            .map_err(driver_status)?;
        Ok(CuStreamSynchronizeReply {})
    }

    fn cu_mem_get_address_range_v2(
        &self,
        _: &CallCx,
        req: CuMemGetAddressRangeV2Request,
    ) -> Result<CuMemGetAddressRangeV2Reply, CuError> {
        // An allocation or a module variable; anything else is not the session's memory.
        let range = self.objects.memory.view().region(req.dptr).ok_or(CuError::NOT_FOUND)?;
        Ok(CuMemGetAddressRangeV2Reply { pbase: range.start, psize: range.end - range.start })
    }

    fn cu_mem_address_reserve(
        &self,
        cx: &CallCx,
        req: CuMemAddressReserveRequest,
    ) -> Result<CuMemAddressReserveReply, CuError> {
        let ptr = self
            .objects
            .memory
            .reserve_range(self.backend(), cx.device, req.size, req.alignment, req.addr)
            .map_err(vmm_status(FunctionId::CuMemAddressReserve))?;
        Ok(CuMemAddressReserveReply { ptr })
    }

    fn cu_mem_address_free(&self, _: &CallCx, req: CuMemAddressFreeRequest) -> Result<CuMemAddressFreeReply, CuError> {
        self.objects.memory.free_range(req.ptr, req.size).map_err(vmm_status(FunctionId::CuMemAddressFree))?;
        Ok(CuMemAddressFreeReply {})
    }

    fn phos_mem_create(&self, _: &CallCx, req: PhosMemCreateRequest) -> Result<PhosMemCreateReply, CuError> {
        self.check_device(req.device).map_err(driver_status)?;
        let handle = self
            .objects
            .memory
            .create_handle(self.backend(), req.device, req.size)
            .map_err(vmm_status(FunctionId::CuMemCreate))?;
        Ok(PhosMemCreateReply { handle })
    }

    fn cu_mem_release(&self, _: &CallCx, req: CuMemReleaseRequest) -> Result<CuMemReleaseReply, CuError> {
        self.objects.memory.release_handle(req.handle).map_err(vmm_status(FunctionId::CuMemRelease))?;
        Ok(CuMemReleaseReply {})
    }

    fn cu_mem_map(&self, _: &CallCx, req: CuMemMapRequest) -> Result<CuMemMapReply, CuError> {
        if req.offset != 0 {
            return Err(vmm_status(FunctionId::CuMemMap)(VmmError::NotSupported));
        }
        self.objects
            .memory
            .map_handle(self.backend(), req.ptr, req.size, req.handle)
            .map_err(vmm_status(FunctionId::CuMemMap))?;
        Ok(CuMemMapReply {})
    }

    fn cu_mem_unmap(&self, cx: &CallCx, req: CuMemUnmapRequest) -> Result<CuMemUnmapReply, CuError> {
        // Work in flight may still use the memory, as for cudaFree.
        self.backend().device_synchronize(cx.device).map_err(driver_status)?;
        self.objects
            .memory
            .unmap_range(self.backend(), req.ptr, req.size)
            .map_err(vmm_status(FunctionId::CuMemUnmap))?;
        Ok(CuMemUnmapReply {})
    }

    fn phos_mem_set_access(&self, _: &CallCx, req: PhosMemSetAccessRequest) -> Result<PhosMemSetAccessReply, CuError> {
        // Mappings are read-write for their device from the start: the call checks the range.
        match self.objects.memory.mapped_range_device(req.ptr, req.size) {
            Some(d) if d == req.device => Ok(PhosMemSetAccessReply {}),
            _ => Err(CuError::INVALID_VALUE),
        }
    }

    fn phos_mem_retain_allocation_handle(
        &self,
        _: &CallCx,
        req: PhosMemRetainAllocationHandleRequest,
    ) -> Result<PhosMemRetainAllocationHandleReply, CuError> {
        let handle =
            self.objects.memory.retain_handle(req.addr).map_err(vmm_status(FunctionId::CuMemRetainAllocationHandle))?;
        Ok(PhosMemRetainAllocationHandleReply { handle })
    }

    fn phos_occupancy_max_active_clusters(
        &self,
        _: &CallCx,
        req: PhosOccupancyMaxActiveClustersRequest,
    ) -> Result<PhosOccupancyMaxActiveClustersReply, CuError> {
        let f = self.objects.modules.resolve_function(req.func).map_err(driver_status)?;
        check_launch_shape(req.grid, req.block)?;
        // A cluster of 0 blocks: none given (the function's own size, if it has one).
        let c = req.cluster;
        let cluster = (c.x != 0 || c.y != 0 || c.z != 0).then_some(c);
        let n = self
            .backend()
            .max_active_clusters(f, req.grid, req.block, req.sharedMem, cluster)
            .map_err(driver_status)?;
        Ok(PhosOccupancyMaxActiveClustersReply { numClusters: n })
    }

    fn phos_occupancy_max_potential_cluster_size(
        &self,
        _: &CallCx,
        req: PhosOccupancyMaxPotentialClusterSizeRequest,
    ) -> Result<PhosOccupancyMaxPotentialClusterSizeReply, CuError> {
        let f = self.objects.modules.resolve_function(req.func).map_err(driver_status)?;
        check_launch_shape(req.grid, req.block)?;
        let n =
            self.backend().max_potential_cluster_size(f, req.grid, req.block, req.sharedMem).map_err(driver_status)?;
        Ok(PhosOccupancyMaxPotentialClusterSizeReply { clusterSize: n })
    }

    fn cu_device_get_exec_affinity_support(
        &self,
        _: &CallCx,
        req: CuDeviceGetExecAffinitySupportRequest,
    ) -> Result<CuDeviceGetExecAffinitySupportReply, CuError> {
        self.check_device(req.dev).map_err(driver_status)?;
        // CU_EXEC_AFFINITY_TYPE_SM_COUNT is the only type.
        if req.affinityType != 0 {
            return Err(CuError::INVALID_VALUE);
        }
        let value = self.backend().exec_affinity_support(req.dev, req.affinityType).map_err(driver_status)?;
        Ok(CuDeviceGetExecAffinitySupportReply { pi: value })
    }

    fn phos_flush_gpu_direct_rdma_writes(
        &self,
        cx: &CallCx,
        req: PhosFlushGPUDirectRDMAWritesRequest,
    ) -> Result<PhosFlushGPUDirectRDMAWritesReply, CuError> {
        // CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TARGET_CURRENT_CTX; scopes TO_OWNER and TO_ALL_DEVICES.
        if req.target != 0 || !matches!(req.scope, 100 | 200) {
            return Err(CuError::INVALID_VALUE);
        }
        self.backend().flush_rdma_writes(cx.device, req.target, req.scope).map_err(driver_status)?;
        Ok(PhosFlushGPUDirectRDMAWritesReply {})
    }

    fn phos_mem_granularity(
        &self,
        _: &CallCx,
        req: PhosMemGranularityRequest,
    ) -> Result<PhosMemGranularityReply, CuError> {
        self.check_device(req.device).map_err(driver_status)?;
        Ok(PhosMemGranularityReply { granularity: self.backend().granularity(req.device) })
    }

    fn phos_link_run(&self, cx: &CallCx, req: PhosLinkRunRequest<'_>) -> Result<PhosLinkRunReply, CuError> {
        let inputs = phos_protocol::jit_link::decode(req.inputs).map_err(|e| {
            tracing::warn!("cuLinkComplete: the guest's link inputs are refused: {e}");
            CuError::INVALID_VALUE
        })?;
        let mut outcome = self.backend().link(cx.device, &inputs);
        let total = (outcome.image.len() + outcome.info_log.len() + outcome.error_log.len()) as u64;
        if total > self.max_reply {
            outcome = LinkOutcome::failed(CuError::OUT_OF_MEMORY.0, "the linked image is larger than a reply may be");
        }
        let link = NEXT_LINK.fetch_add(1, Ordering::Relaxed);
        let reply = PhosLinkRunReply {
            link,
            status: outcome.status,
            imageSize: outcome.image.len() as u64,
            infoSize: outcome.info_log.len() as u64,
            errorSize: outcome.error_log.len() as u64,
        };
        let mut links = LINKS.lock();
        if links.iter().filter(|((s, _), _)| *s == self.id).count() >= LINKS_KEPT
            && let Some(oldest) = links.iter().position(|((s, _), _)| *s == self.id)
        {
            links.remove(oldest);
        }
        links.push(((self.id, link), outcome));
        // A guest that never takes its images holds at most this much of the server's memory.
        let held = |l: &Vec<((u64, u64), LinkOutcome)>| {
            l.iter().map(|(_, o)| (o.image.len() + o.info_log.len() + o.error_log.len()) as u64).sum::<u64>()
        };
        while links.len() > 1 && held(&links) > LINKS_HELD_BYTES {
            links.remove(0);
        }
        Ok(reply)
    }

    fn phos_link_take(&self, _: &CallCx, req: PhosLinkTakeRequest) -> Result<PhosLinkTakeReply, CuError> {
        let mut links = LINKS.lock();
        let at = links.iter().position(|(k, _)| *k == (self.id, req.link)).ok_or(CuError::INVALID_HANDLE)?;
        let o = &links[at].1;
        if (o.image.len() as u64, o.info_log.len() as u64, o.error_log.len() as u64)
            != (req.imageSize, req.infoSize, req.errorSize)
        {
            return Err(CuError::INVALID_VALUE);
        }
        let (_, o) = links.remove(at);
        Ok(PhosLinkTakeReply { image: o.image, infoLog: o.info_log, errorLog: o.error_log })
    }

    fn phos_stream_mem_op(&self, cx: &CallCx, req: PhosStreamMemOpRequest) -> Result<PhosStreamMemOpReply, CuError> {
        const WAIT_FLAGS: u32 = 3 | 1 << 30;
        const WRITE_FLAGS: u32 = 1;
        let (addr, flags) = (req.addr, req.flags);
        let op = match req.op {
            1 | 3 if flags & !WAIT_FLAGS == 0 => MemOp::Wait { addr, value: req.value, wide: req.op == 3, flags },
            2 | 4 if flags & !WRITE_FLAGS == 0 => MemOp::Write { addr, value: req.value, wide: req.op == 4, flags },
            5 => MemOp::Flush,
            _ => return Err(CuError::INVALID_VALUE),
        };
        if let MemOp::Wait { wide, .. } | MemOp::Write { wide, .. } = op {
            let width = if wide { 8 } else { 4 };
            if !addr.is_multiple_of(width) {
                return Err(CuError::INVALID_VALUE);
            }
            CudartService::check_device_range(self, cx, addr, width, false).map_err(driver_status)?;
        }
        let function = match req.op {
            1 | 3 => FunctionId::CuStreamWaitValue32V2,
            _ => FunctionId::CuStreamWriteValue32V2,
        };
        if self.objects.graphs.captures.active().is_some_and(|c| c.of_stream(req.stream).is_some()) {
            // A captured memory operation is a batch memory operation node, which Phos's
            // graphs do not carry.
            return Err(not_supported(function, "a stream memory operation in a capturing stream"));
        }
        let stream = self.objects.streams.resolve(req.stream).map_err(driver_status)?;
        // The C/R hooks see the word it reads or writes (an on-demand restore loads it first,
        // a concurrent checkpoint knows it is written); no argument the spec names is it.
        if let MemOp::Wait { wide, .. } | MemOp::Write { wide, .. } = op {
            let writes = matches!(op, MemOp::Write { .. });
            let access = [phos_protocol::spec::DeviceAccess { addr, len: if wide { 8 } else { 4 }, writes }];
            self.before_work(function.name(), &access).map_err(driver_status)?;
        }
        self.backend().stream_mem_op(stream, op).map_err(driver_status)?;
        Ok(PhosStreamMemOpReply {})
    }

    fn phos_tensor_map_encode(
        &self,
        _: &CallCx,
        req: PhosTensorMapEncodeRequest<'_>,
    ) -> Result<PhosTensorMapEncodeReply, CuError> {
        let params = Params::decode(req.params).ok_or(CuError::INVALID_VALUE)?;
        // The driver's reference's rules, checked again: the guest's check is for speed.
        params.check().map_err(|_| CuError::INVALID_VALUE)?;
        // The address is not checked against the session's memory, as the driver does not:
        // a map may be made before its memory is, and a kernel reaches only its own context's
        // memory on a GPU (emu does not run tensor copies).
        let map = self.backend().tensor_map_encode(&params).map_err(driver_status)?;
        Ok(PhosTensorMapEncodeReply { tensorMap: map.to_vec() })
    }

    fn phos_tensor_map_replace_address(
        &self,
        _: &CallCx,
        req: PhosTensorMapReplaceAddressRequest<'_>,
    ) -> Result<PhosTensorMapReplaceAddressReply, CuError> {
        let mut map: [u8; 128] = req.tensorMap.try_into().map_err(|_| CuError::INVALID_VALUE)?;
        self.backend().tensor_map_replace_address(&mut map, req.globalAddress).map_err(driver_status)?;
        Ok(PhosTensorMapReplaceAddressReply { tensorMap: map.to_vec() })
    }

    fn phos_mem_handle_device(
        &self,
        _: &CallCx,
        req: PhosMemHandleDeviceRequest,
    ) -> Result<PhosMemHandleDeviceReply, CuError> {
        let (_, device) = self
            .objects
            .memory
            .handle_info(req.handle)
            .map_err(vmm_status(FunctionId::CuMemGetAllocationPropertiesFromHandle))?;
        Ok(PhosMemHandleDeviceReply { device })
    }
}

/// A grid and block of an occupancy query: no dimension of zero blocks or threads.
fn check_launch_shape(grid: phos_protocol::types::Dim3, block: phos_protocol::types::Dim3) -> Result<(), CuError> {
    let zero = |d: phos_protocol::types::Dim3| d.x == 0 || d.y == 0 || d.z == 0;
    if zero(grid) || zero(block) { Err(CuError::INVALID_VALUE) } else { Ok(()) }
}

/// Link outcomes waiting for the guest to take them (`phosLinkRun`, then `phosLinkTake`), by
/// (session, link): a few per session, the oldest dropped, so a guest that never takes them
/// holds little.
static LINKS: Mutex<Vec<((u64, u64), LinkOutcome)>> = Mutex::new(Vec::new());
const LINKS_KEPT: usize = 4;
/// The most bytes of images and logs kept for guests to take (the newest is kept whatever
/// its size, which `max_reply` bounds).
const LINKS_HELD_BYTES: u64 = 512 << 20;
static NEXT_LINK: AtomicU64 = AtomicU64::new(1);

fn not_supported(function: FunctionId, what: &str) -> CuError {
    if let Some(dropped) = phos_protocol::log_limit::GUEST_LINES.admit(function.name()) {
        tracing::warn!(
            "{}: {what} is not supported by Phos; returning CUDA_ERROR_NOT_SUPPORTED ({dropped} earlier lines dropped)",
            function.name()
        );
    }
    CuError::NOT_SUPPORTED
}

/// A refusal of the virtual memory calls in the driver's codes; what Phos does not carry is
/// named in the log.
fn vmm_status(function: FunctionId) -> impl Fn(VmmError) -> CuError {
    move |e| match e {
        VmmError::InvalidValue => CuError::INVALID_VALUE,
        VmmError::OutOfMemory => CuError::OUT_OF_MEMORY,
        VmmError::NotSupported => {
            if let Some(dropped) = phos_protocol::log_limit::GUEST_LINES.admit(function.name()) {
                tracing::warn!(
                    "{}: only whole handles mapped once, at offset 0, are supported by Phos; returning CUDA_ERROR_NOT_SUPPORTED ({dropped} earlier lines dropped)",
                    function.name()
                );
            }
            CuError::NOT_SUPPORTED
        }
        VmmError::Device(e) => driver_status(e),
    }
}

/// `name` as a C string in a buffer of `len` bytes: cut to `len - 1` bytes, NUL-terminated,
/// the rest zero (nothing for a buffer of 0 bytes).
fn c_string_in(name: &str, len: i32) -> Vec<u8> {
    let len = usize::try_from(len).unwrap_or(0);
    let mut out = vec![0u8; len];
    let n = name.len().min(len.saturating_sub(1));
    out[..n].copy_from_slice(&name.as_bytes()[..n]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use phos_protocol::cudart::CudaError;

    #[test]
    fn names_are_cut_and_terminated() {
        assert_eq!(c_string_in("H100", 8), b"H100\0\0\0\0");
        assert_eq!(c_string_in("NVIDIA H100 80GB HBM3", 5), b"NVID\0");
        assert_eq!(c_string_in("H100", 1), b"\0");
        assert!(c_string_in("H100", 0).is_empty());
    }

    #[test]
    fn runtime_statuses_in_driver_codes() {
        assert_eq!(driver_status(CudaError::InvalidDevice), CuError::INVALID_DEVICE);
        assert_eq!(driver_status(CudaError::InvalidResourceHandle), CuError::INVALID_HANDLE);
        assert_eq!(driver_status(CudaError::IllegalAddress), CuError::ILLEGAL_ADDRESS);
        assert_eq!(driver_status(CudaError::InvalidDevicePointer), CuError::INVALID_VALUE);
    }
}
