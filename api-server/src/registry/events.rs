//! The session's events.

use parking_lot::Mutex;
use phos_protocol::CudaError;
use phos_protocol::apis::HandleKind;

use super::handles::{HandleTable, NewHandle};
use crate::backend::Raw;
use crate::backend::prelude::*;

/// Event flags CUDA defines (blocking sync, disable timing, interprocess).
const EVENT_FLAGS: u32 = 0x1 | 0x2 | 0x4;

/// `cudaEventDisableTiming`, `cudaEventInterprocess`.
const DISABLE_TIMING: u32 = 0x2;
const INTERPROCESS: u32 = 0x4;

pub struct EventRegistry {
    table: Mutex<HandleTable<Raw>>,
    /// Handles of events made with `cudaEventInterprocess` (they may be exported).
    interprocess: Mutex<std::collections::HashSet<u64>>,
    /// Handles of events opened from another session (`cudaIpcOpenEventHandle`).
    opened: Mutex<std::collections::HashSet<u64>>,
}

impl EventRegistry {
    /// Events of a session that may hold `limit` of them at once.
    pub fn new(limit: u64) -> Self {
        EventRegistry {
            table: Mutex::new(HandleTable::new(HandleKind::Event, limit)),
            interprocess: Default::default(),
            opened: Default::default(),
        }
    }

    /// A new event on `device`.
    pub fn create(
        &self,
        backend: &dyn Backend,
        device: i32,
        flags: u32,
        new: &NewHandle<'_>,
    ) -> Result<u64, CudaError> {
        // An interprocess event must not be timed (CUDA refuses the pair).
        if flags & !EVENT_FLAGS != 0 || (flags & INTERPROCESS != 0 && flags & DISABLE_TIMING == 0) {
            return Err(CudaError::InvalidValue);
        }
        let raw = backend.event_create(device, flags)?;
        let handle = self.table.lock().add(raw, new).inspect_err(|_| {
            let _ = backend.event_destroy(raw);
        })?;
        if flags & INTERPROCESS != 0 {
            self.interprocess.lock().insert(handle);
        }
        Ok(handle)
    }

    /// The backend's event behind `handle`, if it was made interprocess (it may be exported);
    /// another event is `cudaErrorInvalidResourceHandle`, as CUDA answers.
    pub fn resolve_interprocess(&self, handle: u64) -> Result<Raw, CudaError> {
        let raw = self.resolve(handle)?;
        if !self.interprocess.lock().contains(&handle) {
            return Err(CudaError::InvalidResourceHandle);
        }
        Ok(raw)
    }

    /// A handle for an event the backend opened from another session's export.
    pub fn add_opened(&self, backend: &dyn Backend, raw: Raw, new: &NewHandle<'_>) -> Result<u64, CudaError> {
        let handle = self.table.lock().add(raw, new).inspect_err(|_| {
            let _ = backend.event_destroy(raw);
        })?;
        self.opened.lock().insert(handle);
        Ok(handle)
    }

    /// Whether the session holds events opened from another session.
    pub fn has_opened(&self) -> bool {
        !self.opened.lock().is_empty()
    }

    /// The backend's event behind a handle.
    pub fn resolve(&self, handle: u64) -> Result<Raw, CudaError> {
        self.table.lock().get(handle).copied()
    }

    pub fn destroy(&self, backend: &dyn Backend, handle: u64) -> Result<(), CudaError> {
        let raw = self.table.lock().remove(handle)?;
        self.interprocess.lock().remove(&handle);
        self.opened.lock().remove(&handle);
        backend.event_destroy(raw)
    }

    pub fn next_counter(&self) -> u64 {
        self.table.lock().next_counter()
    }

    pub fn set_next_counter(&self, next: u64) {
        self.table.lock().set_next_counter(next)
    }

    pub fn release_all(&self, backend: &dyn Backend) {
        self.interprocess.lock().clear();
        self.opened.lock().clear();
        for (_, raw) in self.table.lock().drain() {
            let _ = backend.event_destroy(raw);
        }
    }
}
