//! Capture status answered in the guest. PyTorch asks `cudaStreamIsCapturing` (and
//! `cudaStreamGetCaptureInfo`) before most allocations and autograd steps; forwarded, each is a
//! synchronous call that waits behind the channel's async calls. The answer is `None` without
//! asking the server whenever no stream capture can be open in the process:
//!
//! - The guest counts the captures that may be open: a `cudaStreamBeginCapture` counts from
//!   before it is sent (whether or not it succeeds) until a `cudaStreamEndCapture` on the same
//!   stream has returned (whatever it returns); `cudaStreamBeginCaptureToGraph` counts the
//!   same way (the driver API's begin calls are these two). Other streams join a capture only by waiting on an event recorded in a
//!   capturing stream, which needs an open capture; so at a count of 0 no stream of the
//!   process captures, and every query that happens after the last end returned (in the
//!   program's own order) would have been answered `None` by the server too. A query racing a
//!   begin or an end of another thread may take either answer, as on CUDA.
//! - The stream must be one the guest knows live: a forwarded query on it succeeded and it was
//!   not destroyed since (`cudaStreamDestroy`, `cuStreamDestroy`, a device reset), so a bad
//!   handle still gets CUDA's error from the server.
//! - No sticky error is known to the guest: the server fails every call with it.
//!
//! Otherwise the query is forwarded, as before. A query for the capture's graph and
//! dependency set (`cudaStreamGetCaptureInfo_v2` and later forms) is `phosStreamCaptureGraph`;
//! the dependency array it answers is kept here per stream, as CUDA keeps its own.

use std::collections::{HashMap, HashSet};
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use phos_protocol::CudaError;
use phos_protocol::cudart::{
    CudaStreamBeginCaptureRequest, CudaStreamEndCaptureRequest, CudaStreamIsCapturingRequest,
    PhosStreamBeginCaptureToGraphRequest, PhosStreamCaptureGraphRequest, PhosStreamCaptureInfoRequest,
    PhosStreamUpdateCaptureDependenciesRequest,
};

use crate::runtime;

/// Captures that may be open, in all.
static OPEN: AtomicUsize = AtomicUsize::new(0);
/// The same, by the stream they were begun on (begins not yet matched by an end).
static BEGUN: Mutex<Option<HashMap<u64, usize>>> = Mutex::new(None);
/// Streams a forwarded query succeeded on, not destroyed since.
static LIVE: Mutex<Option<HashSet<u64>>> = Mutex::new(None);
/// Bumped by every forgetting, so that a query that was in flight meanwhile does not note
/// its stream live.
static FORGOTTEN: AtomicU64 = AtomicU64::new(0);

fn live() -> MutexGuard<'static, Option<HashSet<u64>>> {
    LIVE.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The capture status of `stream` when it is known here without asking: no capture can be
/// open in the process, the stream is live and no sticky error is known.
fn known_none(stream: u64) -> bool {
    OPEN.load(Ordering::SeqCst) == 0
        && !runtime::sticky_error_seen()
        && live().as_ref().is_some_and(|l| l.contains(&stream))
}

/// Whether no capture can be open in the process.
pub fn none_open() -> bool {
    OPEN.load(Ordering::SeqCst) == 0
}

/// A forwarded query on `stream` succeeded: it is live, unless it was forgotten meanwhile.
fn note_live(stream: u64, epoch: u64) {
    let mut l = live();
    if FORGOTTEN.load(Ordering::SeqCst) == epoch {
        l.get_or_insert_default().insert(stream);
    }
}

/// `cudaStreamDestroy`: the stream is no longer known live (before the call is sent).
pub fn forget_stream(stream: u64) {
    drop_dependencies(stream);
    let mut l = live();
    FORGOTTEN.fetch_add(1, Ordering::SeqCst);
    if let Some(l) = l.as_mut() {
        l.remove(&stream);
    }
}

/// A device reset: every stream goes.
pub fn forget_streams() {
    *KEPT.lock().unwrap_or_else(PoisonError::into_inner) = None;
    let mut l = live();
    FORGOTTEN.fetch_add(1, Ordering::SeqCst);
    *l = None;
}

/// `cudaStreamIsCapturing`, answered here when it can be, else forwarded.
///
/// # Safety
/// A non-null `status` must be writable.
pub unsafe fn is_capturing(stream: u64, status: *mut i32) -> Option<Result<(), CudaError>> {
    if status.is_null() {
        // The generated path refuses it, without a call.
        return None;
    }
    let answer = if known_none(stream) {
        0
    } else {
        let epoch = FORGOTTEN.load(Ordering::SeqCst);
        match runtime::call(&CudaStreamIsCapturingRequest { stream }) {
            Ok(reply) => {
                note_live(stream, epoch);
                reply.pCaptureStatus
            }
            Err(e) => return Some(Err(e)),
        }
    };
    // SAFETY: not null (checked above), so writable (this function's contract).
    unsafe { *status = answer };
    Some(Ok(()))
}

/// The status and id of `stream`'s capture (`cudaStreamGetCaptureInfo`): `(0, 0)` here when
/// no capture can be open, else the server's.
pub fn capture_info(stream: u64) -> Result<(i32, u64), CudaError> {
    if known_none(stream) {
        return Ok((0, 0));
    }
    let epoch = FORGOTTEN.load(Ordering::SeqCst);
    let reply = runtime::call(&PhosStreamCaptureInfoRequest { stream })?;
    note_live(stream, epoch);
    Ok((reply.status, reply.id))
}

/// What `cudaStreamGetCaptureInfo` answers beyond the status and id while a capture is active:
/// the capture's graph and the nodes the stream's next captured work depends on.
pub struct CaptureGraph {
    pub status: i32,
    pub id: u64,
    pub graph: u64,
    /// The dependency set, in an array of the library's that stays where it is until the next
    /// query on the stream, the stream's capture ends or the stream is destroyed (CUDA keeps
    /// its array until the next call on the stream or the capture's end).
    pub deps: *const u64,
    /// Default edge data (zeros) for each dependency, kept as long.
    pub edges: *const u8,
    pub count: usize,
}

/// A stream's dependency array and its edge data, as the last query answered them.
struct Kept {
    deps: Box<[u64]>,
    edges: Box<[u64]>,
}

/// The arrays [`CaptureGraph`] points into, by stream.
static KEPT: Mutex<Option<HashMap<u64, Kept>>> = Mutex::new(None);

/// Forget the arrays kept for `stream`'s queries.
fn drop_dependencies(stream: u64) {
    if let Some(k) = KEPT.lock().unwrap_or_else(PoisonError::into_inner).as_mut() {
        k.remove(&stream);
    }
}

/// `cudaStreamGetCaptureInfo` with the graph and dependencies: status None (0) here when no
/// capture can be open, else the server's answer.
pub fn capture_graph(stream: u64) -> Result<CaptureGraph, CudaError> {
    let none = CaptureGraph { status: 0, id: 0, graph: 0, deps: std::ptr::null(), edges: std::ptr::null(), count: 0 };
    if known_none(stream) {
        return Ok(none);
    }
    let epoch = FORGOTTEN.load(Ordering::SeqCst);
    // Most dependency sets are a node or two: one call, a second when more.
    let mut max = 8u64;
    let reply = loop {
        let reply = runtime::call(&PhosStreamCaptureGraphRequest { stream, max })?;
        if reply.count <= max {
            break reply;
        }
        max = reply.count;
    };
    note_live(stream, epoch);
    let count = reply.count as usize;
    let deps: Box<[u64]> =
        reply.deps.chunks_exact(8).take(count).map(|h| u64::from_ne_bytes(h.try_into().expect("8 bytes"))).collect();
    if reply.status != 1 || deps.is_empty() {
        drop_dependencies(stream);
        return Ok(CaptureGraph { status: reply.status, id: reply.id, graph: reply.graph, ..none });
    }
    let mut all = KEPT.lock().unwrap_or_else(PoisonError::into_inner);
    let all = all.get_or_insert_default();
    // The same set answers the same array, so a pointer of an earlier query stays good while
    // the set does not change.
    let kept = match all.get(&stream) {
        Some(k) if k.deps == deps => k,
        _ => {
            let kept = Kept { edges: vec![0u64; deps.len()].into_boxed_slice(), deps };
            all.insert(stream, kept);
            &all[&stream]
        }
    };
    // Boxes do not move their contents when the box moves into the map.
    let (deps, edges) = (kept.deps.as_ptr(), kept.edges.as_ptr() as *const u8);
    Ok(CaptureGraph { status: reply.status, id: reply.id, graph: reply.graph, deps, edges, count })
}

/// `cudaStreamUpdateCaptureDependencies`: `deps` (handles, 8 bytes each) replace (`flags` 1)
/// or join (0) the stream's dependency set.
pub fn update_dependencies(stream: u64, deps: &[u8], flags: u32) -> Result<(), CudaError> {
    let count = (deps.len() / 8) as u64;
    runtime::call(&PhosStreamUpdateCaptureDependenciesRequest { stream, deps, count, flags }).map(|_| ())
}

/// `cudaStreamBeginCapture`: counted before it is sent, so that a query ordered after the
/// begin by the program is forwarded.
pub fn begin(stream: u64, mode: i32) -> Result<(), CudaError> {
    {
        let mut b = BEGUN.lock().unwrap_or_else(PoisonError::into_inner);
        *b.get_or_insert_default().entry(stream).or_default() += 1;
        OPEN.fetch_add(1, Ordering::SeqCst);
    }
    runtime::call(&CudaStreamBeginCaptureRequest { stream, mode }).map(|_| ())
}

/// `cudaStreamBeginCaptureToGraph`: counted as [`begin`]'s; `deps` are node handles of
/// `graph` (8 bytes each), which the capture's first work follows.
pub fn begin_to_graph(stream: u64, graph: u64, deps: &[u8], mode: i32) -> Result<(), CudaError> {
    {
        let mut b = BEGUN.lock().unwrap_or_else(PoisonError::into_inner);
        *b.get_or_insert_default().entry(stream).or_default() += 1;
        OPEN.fetch_add(1, Ordering::SeqCst);
    }
    let count = (deps.len() / 8) as u64;
    runtime::call(&PhosStreamBeginCaptureToGraphRequest { stream, graph, deps, count, mode }).map(|_| ())
}

/// `cudaStreamEndCapture`: one begin on `stream` stops counting once the end has returned,
/// whatever it returns (the server has ended the capture, or `stream` began none).
///
/// A null `graph` takes no answer (CUDA's samples end a capture into a conditional node's body
/// graph so: the graph is the one they gave).
///
/// # Safety
/// A non-null `graph` must be writable.
pub unsafe fn end(stream: u64, graph: *mut *mut c_void) -> Result<(), CudaError> {
    let r = runtime::call(&CudaStreamEndCaptureRequest { stream });
    drop_dependencies(stream);
    {
        let mut b = BEGUN.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(n) = b.as_mut().and_then(|b| b.get_mut(&stream)) {
            *n -= 1;
            if *n == 0 {
                b.as_mut().map(|b| b.remove(&stream));
            }
            OPEN.fetch_sub(1, Ordering::SeqCst);
        }
    }
    let made = match r {
        Ok(reply) => reply.pGraph,
        // The capture ended without a graph: CUDA answers a null one.
        Err(e @ (CudaError::StreamCaptureInvalidated | CudaError::StreamCaptureUnjoined)) if !graph.is_null() => {
            // SAFETY: not null (checked), so writable (this function's contract).
            unsafe { *graph = std::ptr::null_mut() };
            return Err(e);
        }
        Err(e) => return Err(e),
    };
    if !graph.is_null() {
        // SAFETY: not null (checked), so writable (this function's contract).
        unsafe { *graph = made as usize as *mut c_void };
    }
    Ok(())
}
