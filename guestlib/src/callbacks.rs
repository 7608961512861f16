//! Host functions in stream order (`cudaLaunchHostFunc`, `cudaStreamAddCallback`). The
//! function belongs to this process, so it runs here, on the library's callback thread (as
//! CUDA runs it on a driver thread); the stream is held at a gate on the server meanwhile:
//!
//! 1. the calling thread asks the server to put a gate in the stream (`phosHostFuncEnqueue`):
//!    work submitted to the stream later waits until the gate opens;
//! 2. the callback thread, taking host functions in the order they were submitted, waits
//!    until the work before the gate is done (`phosHostFuncWait`), runs the function, and
//!    opens the gate (`phosHostFuncDone`).
//!
//! A host function is not run when the work before it failed (CUDA's rule for
//! `cudaLaunchHostFunc`); a stream callback is, with the error as its status.

use std::ffi::c_void;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Sender, channel};

use phos_protocol::CudaError;
use phos_protocol::cudart::{PhosHostFuncDoneRequest, PhosHostFuncEnqueueRequest, PhosHostFuncWaitRequest};

use crate::runtime;

/// `void (*)(void *userData)`
type HostFn = unsafe extern "C" fn(*mut c_void);
/// `void (*)(cudaStream_t, cudaError_t, void *userData)`
type StreamCallback = unsafe extern "C" fn(*mut c_void, i32, *mut c_void);

enum Call {
    HostFn(HostFn, *mut c_void),
    Callback(StreamCallback, *mut c_void, *mut c_void),
}

struct Pending {
    gate: u64,
    call: Call,
}

// SAFETY: the pointers are the application's, never dereferenced here: they are handed back
// to its own function on the callback thread, as CUDA does (the application's function and
// data must be usable from another thread; CUDA runs them on one of its own).
unsafe impl Send for Pending {}

/// The callback thread's queue, and the process that started it (a forked child needs its
/// own thread).
static WORKER: Mutex<Option<(u32, Sender<Pending>)>> = Mutex::new(None);
static NEXT_GATE: AtomicU64 = AtomicU64::new(1);
/// Host functions handed to the callback thread and not run yet.
static PENDING: AtomicU64 = AtomicU64::new(0);

/// Whether no host function is waiting to run: CUDA's synchronous copies return after the
/// host functions before them in their stream's order ran (`cudart/copies.rs`).
pub fn none_pending() -> bool {
    PENDING.load(Ordering::Acquire) == 0
}

fn run(p: Pending) {
    let status = runtime::call(&PhosHostFuncWaitRequest { gate: p.gate });
    match p.call {
        Call::HostFn(f, data) => {
            if status.is_ok() {
                // SAFETY: the application's host function with its own data
                // (`cudaLaunchHostFunc`'s contract), called once, as CUDA would.
                unsafe { f(data) }
            }
        }
        Call::Callback(f, stream, data) => {
            let code = match status {
                Ok(_) => 0,
                Err(e) => e.0,
            };
            // SAFETY: the application's stream callback with its stream and data
            // (`cudaStreamAddCallback`'s contract), called once, as CUDA would.
            unsafe { f(stream, code, data) }
        }
    }
    if let Err(e) = runtime::call(&PhosHostFuncDoneRequest { gate: p.gate }) {
        tracing::warn!("opening the stream after a host function: {e:?}");
    }
    PENDING.fetch_sub(1, Ordering::Release);
}

fn submit(stream: *mut c_void, call: Call) -> Result<(), CudaError> {
    runtime::session()?;
    let gate = NEXT_GATE.fetch_add(1, Ordering::Relaxed);
    // Waits for the answer: the callback thread's calls travel on its own channel and must
    // find the gate in place.
    runtime::call(&PhosHostFuncEnqueueRequest { stream: stream as usize as u64, gate })?;
    hand_over(Pending { gate, call })
}

/// `count` gate numbers no other host function uses: the first.
pub(crate) fn reserve_gates(count: u64) -> u64 {
    NEXT_GATE.fetch_add(count, Ordering::Relaxed)
}

/// A graph's host node: `f(data)` runs on the callback thread once the stream reaches
/// `gate`, which the server has announced (not run if the launch gives the gate up).
///
/// # Safety
/// `f` must be the address of a host function `void f(void *)`, which may be called with
/// `data` on another thread.
pub(crate) unsafe fn graph_host_node(gate: u64, f: u64, data: u64) -> Result<(), CudaError> {
    if f == 0 {
        return Err(CudaError::InvalidValue);
    }
    // SAFETY: not null, so the address of a function of this signature (this function's
    // contract).
    let f: HostFn = unsafe { std::mem::transmute::<usize, HostFn>(f as usize) };
    hand_over(Pending { gate, call: Call::HostFn(f, data as usize as *mut c_void) })
}

/// Give a host function whose gate is in place (or announced) to the callback thread.
fn hand_over(pending: Pending) -> Result<(), CudaError> {
    PENDING.fetch_add(1, Ordering::AcqRel);
    let r = send_to_worker(pending);
    if r.is_err() {
        PENDING.fetch_sub(1, Ordering::Release);
    }
    r
}

fn send_to_worker(pending: Pending) -> Result<(), CudaError> {
    let gate = pending.gate;
    let mut worker = WORKER.lock().unwrap_or_else(|p| p.into_inner());
    let pid = std::process::id();
    let sender = match worker.as_ref() {
        Some((owner, tx)) if *owner == pid => tx.clone(),
        _ => {
            let (tx, rx) = channel::<Pending>();
            std::thread::Builder::new()
                .name("phos-callbacks".into())
                .spawn(move || {
                    runtime::without_barriers();
                    while let Ok(p) = rx.recv() {
                        run(p);
                    }
                })
                .map_err(|_| {
                    // Nobody would run the function: let the stream go on.
                    let _ = runtime::call(&PhosHostFuncDoneRequest { gate });
                    CudaError::OperatingSystem
                })?;
            *worker = Some((pid, tx.clone()));
            tx
        }
    };
    sender.send(pending).map_err(|_| CudaError::Unknown)
}

/// `cudaLaunchHostFunc`.
///
/// # Safety
/// `f` must be null or the address of a host function `void f(void *)`, which may be called
/// with `data` on another thread.
pub unsafe fn launch_host_func(stream: *mut c_void, f: u64, data: *mut c_void) -> Result<(), CudaError> {
    if f == 0 {
        return Err(CudaError::InvalidValue);
    }
    // SAFETY: not null, so the address of a function of this signature (this function's
    // contract).
    let f: HostFn = unsafe { std::mem::transmute::<usize, HostFn>(f as usize) };
    submit(stream, Call::HostFn(f, data))
}

/// `cudaStreamAddCallback`: `flags` is reserved and must be 0.
///
/// # Safety
/// `f` must be null or the address of a stream callback
/// `void f(cudaStream_t, cudaError_t, void *)`, which may be called with `stream` and `data`
/// on another thread.
pub unsafe fn add_callback(stream: *mut c_void, f: u64, data: *mut c_void, flags: u32) -> Result<(), CudaError> {
    if f == 0 || flags != 0 {
        return Err(CudaError::InvalidValue);
    }
    // SAFETY: not null, so the address of a function of this signature (this function's
    // contract).
    let f: StreamCallback = unsafe { std::mem::transmute::<usize, StreamCallback>(f as usize) };
    submit(stream, Call::Callback(f, stream, data))
}
