//! The session's cuSOLVER dense handles. A handle is a virtual handle of kind
//! `cusolver_dn_handle`; what it stands for is its device and stream (the server runs the calls
//! on them), so a restore makes it again by replaying its creation and its last
//! `cusolverDnSetStream`.

use parking_lot::Mutex;
use phos_protocol::CudaError;
use phos_protocol::apis::HandleKind;

use super::handles::{HandleTable, NewHandle};
use crate::backend::Backend;

/// cuSOLVER handles a session may hold at once.
pub const MAX_SOLVER_HANDLES: u64 = 1024;

/// One handle's state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SolverHandle {
    /// The device current when it was made.
    pub device: i32,
    /// The stream its work goes on (a stream handle; 0 is the legacy default stream).
    pub stream: u64,
    /// The vendor library's handle (NVIDIA's `cusolverDnHandle_t`), 0 where the server
    /// computes the calls itself.
    pub raw: u64,
}

pub struct SolverRegistry {
    table: Mutex<HandleTable<SolverHandle>>,
}

impl Default for SolverRegistry {
    fn default() -> Self {
        SolverRegistry { table: Mutex::new(HandleTable::new(HandleKind::CusolverDnHandle, MAX_SOLVER_HANDLES)) }
    }
}

impl SolverRegistry {
    pub fn create(&self, device: i32, raw: u64, new: &NewHandle<'_>) -> Result<u64, CudaError> {
        self.table.lock().add(SolverHandle { device, raw, stream: 0 }, new)
    }

    pub fn destroy(&self, handle: u64) -> Result<SolverHandle, CudaError> {
        self.table.lock().remove(handle)
    }

    pub fn get(&self, handle: u64) -> Result<SolverHandle, CudaError> {
        self.table.lock().get(handle).copied()
    }

    pub fn set_stream(&self, handle: u64, stream: u64) -> Result<(), CudaError> {
        self.table.lock().get_mut(handle)?.stream = stream;
        Ok(())
    }

    pub fn next_counter(&self) -> u64 {
        self.table.lock().next_counter()
    }

    pub fn set_next_counter(&self, next: u64) {
        self.table.lock().set_next_counter(next);
    }

    /// Destroy every handle (a device reset, the session's end).
    pub fn release_all(&self, backend: &dyn Backend) {
        let handles = self.table.lock().drain();
        if let Some(solver) = backend.cusolver() {
            for (_, h) in handles.into_iter().filter(|(_, h)| h.raw != 0) {
                solver.destroy(h.raw);
            }
        }
    }
}
