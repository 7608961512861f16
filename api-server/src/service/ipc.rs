//! The session's side of IPC between sessions of one tenant ([`crate::ipc`] says how the
//! memory travels): the runtime API's calls, which the driver API's reach through the guest.

use phos_protocol::CudaError;
use phos_protocol::limits::LimitKind;

use super::{CallCx, Session};
use crate::ipc::{Ipc, LAZY_ENABLE_PEER_ACCESS};

impl Session {
    /// `cudaIpcGetMemHandle`: the handle of the whole allocation `ptr` lies in.
    pub(crate) fn ipc_get_mem_handle(&self, ptr: u64) -> Result<[u8; 64], CudaError> {
        let memory = &self.objects.memory;
        memory.with_allocation_block(ptr, |a, start, len, physical| {
            self.ipc.export_memory(self.id, a.addr, a.size, (start, len), || {
                self.backend().export_block(start, len, physical)
            })
        })
    }

    /// `cudaIpcOpenMemHandle`.
    pub(crate) fn ipc_open_mem_handle(&self, cx: &CallCx, handle: &[u8; 64], flags: u32) -> Result<u64, CudaError> {
        if flags & !LAZY_ENABLE_PEER_ACCESS != 0 {
            return Err(CudaError::InvalidValue);
        }
        let parsed = Ipc::parse_memory(handle).inspect_err(|_| {
            tracing::warn!(session = self.id, "cudaIpcOpenMemHandle: a handle Phos did not make refused");
        })?;
        if parsed.session == self.id {
            // CUDA refuses memory of the opening process itself.
            return Err(CudaError::DeviceUninitialized);
        }
        if let Some(addr) = self.ipc.reopen(&parsed) {
            return Ok(addr);
        }
        let exported = self.ipc.fetch_memory(&parsed).map_err(|e| {
            tracing::warn!(session = self.id, "cudaIpcOpenMemHandle refused: {e}");
            CudaError::MapBufferObjectFailed
        })?;
        let gran = self.backend().granularity(cx.device);
        // The exporter is an API server of the tenant's, but its figures are checked all the
        // same: a block of whole granules holding the allocation.
        let sane = exported.block_len > 0
            && exported.block_len.is_multiple_of(gran)
            && exported.block_len <= self.objects.memory.size()
            && exported.size > 0
            && exported.offset.checked_add(exported.size).is_some_and(|end| end <= exported.block_len);
        if !sane {
            tracing::warn!(session = self.id, "cudaIpcOpenMemHandle: the exporter's figures do not hold together");
            return Err(CudaError::MapBufferObjectFailed);
        }
        let addr =
            self.objects.memory.import(cx.device, exported.block_len, exported.offset, exported.size, gran, |at| {
                self.backend().import_block(cx.device, &exported.file, at, exported.block_len)
            })?;
        self.ipc.note_opened(parsed, addr);
        Ok(addr)
    }

    /// `cudaIpcCloseMemHandle`: the last close unmaps the memory.
    pub(crate) fn ipc_close_mem_handle(&self, cx: &CallCx, ptr: u64) -> Result<(), CudaError> {
        match self.ipc.close(ptr) {
            None => Err(CudaError::InvalidValue),
            Some(false) => Ok(()),
            Some(true) => {
                // Work in flight may still use the memory.
                self.backend().device_synchronize(cx.device)?;
                self.objects.memory.close_imported(self.backend(), ptr).map(|_| ())
            }
        }
    }

    /// `cudaIpcGetEventHandle`: events made `cudaEventInterprocess` only.
    pub(crate) fn ipc_get_event_handle(&self, event: u64) -> Result<[u8; 64], CudaError> {
        let raw = self.objects.events.resolve_interprocess(event)?;
        let exported = self.backend().event_export(raw)?;
        self.ipc.export_event(self.id, event, exported)
    }

    /// `cudaIpcOpenEventHandle`: a new event handle of this session.
    pub(crate) fn ipc_open_event_handle(&self, cx: &CallCx, handle: &[u8; 64]) -> Result<u64, CudaError> {
        let parsed = Ipc::parse_event(handle).inspect_err(|_| {
            tracing::warn!(session = self.id, "cudaIpcOpenEventHandle: a handle Phos did not make refused");
        })?;
        if parsed.session == self.id {
            return Err(CudaError::DeviceUninitialized);
        }
        let exported = self.ipc.fetch_event(&parsed).map_err(|e| {
            tracing::warn!(session = self.id, "cudaIpcOpenEventHandle refused: {e}");
            CudaError::InvalidValue
        })?;
        let raw = self.backend().event_import(cx.device, &exported)?;
        self.with_new_handle(cx, LimitKind::Events, |new| self.objects.events.add_opened(self.backend(), raw, new))
    }
}
