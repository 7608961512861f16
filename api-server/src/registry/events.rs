//! The session's events.

use parking_lot::Mutex;
use phos_protocol::CudaError;
use phos_protocol::apis::HandleKind;

use super::handles::{HandleTable, NewHandle};
use crate::backend::Raw;
use crate::backend::prelude::*;

/// Event flags CUDA defines (blocking sync, disable timing, interprocess).
const EVENT_FLAGS: u32 = 0x1 | 0x2 | 0x4;

pub struct EventRegistry {
    table: Mutex<HandleTable<Raw>>,
}

impl EventRegistry {
    /// Events of a session that may hold `limit` of them at once.
    pub fn new(limit: u64) -> Self {
        EventRegistry { table: Mutex::new(HandleTable::new(HandleKind::Event, limit)) }
    }

    /// A new event on `device`.
    pub fn create(
        &self,
        backend: &dyn Backend,
        device: i32,
        flags: u32,
        new: &NewHandle<'_>,
    ) -> Result<u64, CudaError> {
        if flags & !EVENT_FLAGS != 0 {
            return Err(CudaError::InvalidValue);
        }
        let raw = backend.event_create(device, flags)?;
        self.table.lock().add(raw, new).inspect_err(|_| {
            let _ = backend.event_destroy(raw);
        })
    }

    /// The backend's event behind a handle.
    pub fn resolve(&self, handle: u64) -> Result<Raw, CudaError> {
        self.table.lock().get(handle).copied()
    }

    pub fn destroy(&self, backend: &dyn Backend, handle: u64) -> Result<(), CudaError> {
        let raw = self.table.lock().remove(handle)?;
        backend.event_destroy(raw)
    }

    pub fn next_counter(&self) -> u64 {
        self.table.lock().next_counter()
    }

    pub fn set_next_counter(&self, next: u64) {
        self.table.lock().set_next_counter(next)
    }

    pub fn release_all(&self, backend: &dyn Backend) {
        for (_, raw) in self.table.lock().drain() {
            let _ = backend.event_destroy(raw);
        }
    }
}
