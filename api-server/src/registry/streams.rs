//! The session's streams, and the host-function gates waiting in them.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use phos_protocol::CudaError;
use phos_protocol::apis::HandleKind;

use super::handles::{HandleTable, NewHandle};
use crate::backend::prelude::*;
use crate::backend::{Gate, Raw, StreamRef};

/// Stream flags CUDA defines (`cudaStreamNonBlocking`).
const STREAM_FLAGS: u32 = 0x1;

/// Host-function gates a session may have waiting at once.
const MAX_GATES: usize = 1 << 16;

struct Stream {
    raw: Raw,
    device: i32,
    flags: u32,
    priority: i32,
}

pub struct StreamRegistry {
    table: Mutex<HandleTable<Stream>>,
    /// Host-function gates in the session's streams, by the guest's number, with their
    /// stream. A gate is opened when the guest has run its function, or when the session
    /// lets go of everything.
    gates: Mutex<HashMap<u64, (Arc<Gate>, StreamRef)>>,
}

impl StreamRegistry {
    /// Streams of a session that may hold `limit` of them at once.
    pub fn new(limit: u64) -> Self {
        StreamRegistry { table: Mutex::new(HandleTable::new(HandleKind::Stream, limit)), gates: Mutex::default() }
    }

    /// The backend stream behind a guest's stream value (0, `cudaStreamLegacy`,
    /// `cudaStreamPerThread`, or a handle).
    pub fn resolve(&self, handle: u64) -> Result<StreamRef, CudaError> {
        match handle {
            0 | 1 => Ok(StreamRef::Legacy),
            2 => Ok(StreamRef::PerThread),
            h => Ok(StreamRef::Created(self.table.lock().get(h)?.raw)),
        }
    }

    /// A new stream on `device`. CUDA clamps a priority outside the device's range into it.
    pub fn create(
        &self,
        backend: &dyn Backend,
        device: i32,
        flags: u32,
        priority: i32,
        new: &NewHandle<'_>,
    ) -> Result<u64, CudaError> {
        if flags & !STREAM_FLAGS != 0 {
            return Err(CudaError::InvalidValue);
        }
        let (least, greatest) = backend.stream_priority_range(device)?;
        let priority = priority.clamp(greatest, least);
        let raw = backend.stream_create(device, flags, priority)?;
        self.table.lock().add(Stream { raw, device, flags, priority }, new).inspect_err(|_| {
            let _ = backend.stream_destroy(raw);
        })
    }

    pub fn destroy(&self, backend: &dyn Backend, handle: u64) -> Result<(), CudaError> {
        let s = self.table.lock().remove(handle)?;
        backend.stream_destroy(s.raw)
    }

    /// (flags, priority, device) of a stream value. The special streams are the calling
    /// device's, blocking, of priority 0.
    pub fn facts(&self, handle: u64, calling_device: i32) -> Result<(u32, i32, i32), CudaError> {
        if handle <= 2 {
            return Ok((0, 0, calling_device));
        }
        let t = self.table.lock();
        let s = t.get(handle)?;
        Ok((s.flags, s.priority, s.device))
    }

    /// Put host-function gate `number` (the guest's) in `stream`.
    pub fn add_gate(&self, backend: &dyn Backend, stream: StreamRef, number: u64) -> Result<(), CudaError> {
        {
            let gates = self.gates.lock();
            if gates.len() >= MAX_GATES || gates.contains_key(&number) {
                return Err(CudaError::InvalidValue);
            }
        }
        // Not under the table's lock: a backend may wait here for earlier gates to open.
        let gate = Gate::new();
        backend.host_func(stream, gate.clone())?;
        self.gates.lock().insert(number, (gate, stream));
        Ok(())
    }

    /// Announce gates `first..first + count` of `stream` for a graph launch's host nodes: the
    /// guest's callback thread may wait at them before the launch puts them in the stream
    /// ([`place_gate`](Self::place_gate)).
    pub fn announce_gates(&self, stream: StreamRef, first: u64, count: u64) -> Result<(), CudaError> {
        let end = first.checked_add(count).ok_or(CudaError::InvalidValue)?;
        let mut gates = self.gates.lock();
        if gates.len() as u64 + count > MAX_GATES as u64 || (first..end).any(|n| gates.contains_key(&n)) {
            return Err(CudaError::InvalidValue);
        }
        for n in first..end {
            gates.insert(n, (Gate::new(), stream));
        }
        Ok(())
    }

    /// Put announced gate `number` in its stream, which must be `stream`.
    pub fn place_gate(&self, backend: &dyn Backend, stream: StreamRef, number: u64) -> Result<(), CudaError> {
        let (gate, announced) = self.gate(number)?;
        if announced != stream || gate.is_placed() {
            return Err(CudaError::InvalidValue);
        }
        gate.place();
        backend.host_func(stream, gate)
    }

    /// Gates `first..first + count` will not be put in their stream (the launch failed or was
    /// captured): the host functions waiting at them are not run.
    pub fn abandon_gates(&self, first: u64, count: u64) {
        let gates = self.gates.lock();
        for n in first..first.saturating_add(count) {
            if let Some((gate, _)) = gates.get(&n)
                && !gate.is_placed()
            {
                gate.abandon();
            }
        }
    }

    /// Gate `number` and its stream.
    pub fn gate(&self, number: u64) -> Result<(Arc<Gate>, StreamRef), CudaError> {
        self.gates.lock().get(&number).cloned().ok_or(CudaError::InvalidResourceHandle)
    }

    /// Gate `number`, which the guest has run the function of: it leaves the registry.
    pub fn take_gate(&self, number: u64) -> Result<Arc<Gate>, CudaError> {
        self.gates.lock().remove(&number).map(|(g, _)| g).ok_or(CudaError::InvalidResourceHandle)
    }

    pub fn next_counter(&self) -> u64 {
        self.table.lock().next_counter()
    }

    pub fn set_next_counter(&self, next: u64) {
        self.table.lock().set_next_counter(next)
    }

    /// Open every gate (the host functions will not run now) and destroy every stream.
    pub fn release_all(&self, backend: &dyn Backend) {
        for (_, (gate, _)) in self.gates.lock().drain() {
            gate.open();
        }
        for (_, s) in self.table.lock().drain() {
            let _ = backend.stream_destroy(s.raw);
        }
    }
}
