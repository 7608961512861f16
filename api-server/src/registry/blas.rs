//! The session's cuBLAS handles and their settings. A handle is a virtual handle of kind
//! `cublas_handle`; what it stands for on the backend is its settings (the server runs the
//! calls with them), so a restore makes it again by replaying its creation and the last call
//! of each setter.

use parking_lot::Mutex;
use phos_protocol::CudaError;
use phos_protocol::apis::HandleKind;

use super::handles::{HandleTable, NewHandle};
use crate::backend::Backend;

/// cuBLAS handles a session may hold at once.
pub const MAX_BLAS_HANDLES: u64 = 1024;

/// One handle's settings.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BlasHandle {
    /// The device current when it was made (cuBLAS handles belong to one).
    pub device: i32,
    /// The stream its work goes on (a stream handle; 0 is the legacy default stream).
    pub stream: u64,
    pub pointer_mode: i32,
    pub math_mode: i32,
    pub atomics_mode: i32,
    /// The workspace the program gave it: (address, bytes).
    pub workspace: (u64, u64),
    /// The vendor library's handle (NVIDIA's `cublasHandle_t`), 0 where the server computes
    /// cuBLAS's calls itself.
    pub raw: u64,
    /// The pointer mode last set on `raw` (each call's scalars choose it).
    pub raw_pointer_mode: i32,
}

pub struct BlasRegistry {
    table: Mutex<HandleTable<BlasHandle>>,
}

impl Default for BlasRegistry {
    fn default() -> Self {
        BlasRegistry { table: Mutex::new(HandleTable::new(HandleKind::CublasHandle, MAX_BLAS_HANDLES)) }
    }
}

impl BlasRegistry {
    pub fn create(&self, device: i32, raw: u64, new: &NewHandle<'_>) -> Result<u64, CudaError> {
        self.table.lock().add(BlasHandle { device, raw, ..BlasHandle::default() }, new)
    }

    pub fn destroy(&self, handle: u64) -> Result<BlasHandle, CudaError> {
        self.table.lock().remove(handle)
    }

    pub fn get(&self, handle: u64) -> Result<BlasHandle, CudaError> {
        self.table.lock().get(handle).copied()
    }

    /// Change a handle's settings in one step.
    pub fn update(&self, handle: u64, change: impl FnOnce(&mut BlasHandle)) -> Result<(), CudaError> {
        change(self.table.lock().get_mut(handle)?);
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
        if let Some(cublas) = backend.cublas() {
            for (_, h) in handles.into_iter().filter(|(_, h)| h.raw != 0) {
                cublas.destroy(h.raw);
            }
        }
    }
}
