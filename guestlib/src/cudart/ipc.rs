//! IPC events in the guest. Records are async calls (the call returns before the server ran
//! it), but once a process has recorded an IPC event it may tell another process, which may
//! wait on the event at once: a record of an IPC event is therefore followed by a synchronous
//! call on the same channel, so that it has run in the server before `cudaEventRecord`
//! returns.

use std::collections::HashSet;
use std::ffi::c_void;
use std::sync::Mutex;

use phos_protocol::CudaError;
use phos_protocol::cudart::{
    CudaDriverGetVersionRequest, CudaEventRecordRequest, CudaEventRecordWithFlagsRequest, CudaIpcOpenEventHandleRequest,
};
use phos_protocol::types::IpcHandle;

use crate::runtime;

/// Event handles this process exported or opened.
static IPC_EVENTS: Mutex<Option<HashSet<u64>>> = Mutex::new(None);

fn is_ipc(event: *mut c_void) -> bool {
    let g = IPC_EVENTS.lock().unwrap_or_else(|e| e.into_inner());
    g.as_ref().is_some_and(|s| s.contains(&(event as usize as u64)))
}

fn note(event: u64) {
    IPC_EVENTS.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert_with(HashSet::new).insert(event);
}

/// The record has run once a later synchronous call of this thread's channel is answered.
fn flush() {
    let _ = runtime::call(&CudaDriverGetVersionRequest {});
}

/// `cudaIpcGetEventHandle`'s hook: note the event, and let the call go on.
pub fn note_exported(event: *mut c_void) -> Option<Result<(), CudaError>> {
    note(event as usize as u64);
    None
}

/// `cudaIpcOpenEventHandle`'s hook: open, and note the new event.
///
/// # Safety
/// `event` must be null or writable.
pub unsafe fn open(event: *mut *mut c_void, handle: IpcHandle) -> Option<Result<(), CudaError>> {
    if event.is_null() {
        return Some(Err(CudaError::InvalidValue));
    }
    Some(runtime::call(&CudaIpcOpenEventHandleRequest { handle }).map(|r| {
        note(r.event);
        // SAFETY: not null, and writable (this function's contract).
        unsafe { event.write(r.event as usize as *mut c_void) };
    }))
}

/// `cudaEventRecord`'s hook: an IPC event's record is sent and run before the call returns.
pub fn record(event: *mut c_void, stream: *mut c_void) -> Option<Result<(), CudaError>> {
    if !is_ipc(event) {
        return None;
    }
    let r = runtime::call(&CudaEventRecordRequest { event: event as usize as u64, stream: stream as usize as u64 });
    flush();
    Some(r.map(|_| ()))
}

/// `cudaEventRecordWithFlags`'s hook, as [`record`].
pub fn record_with_flags(event: *mut c_void, stream: *mut c_void, flags: u32) -> Option<Result<(), CudaError>> {
    if !is_ipc(event) {
        return None;
    }
    let r = runtime::call(&CudaEventRecordWithFlagsRequest {
        event: event as usize as u64,
        stream: stream as usize as u64,
        flags,
    });
    flush();
    Some(r.map(|_| ()))
}
