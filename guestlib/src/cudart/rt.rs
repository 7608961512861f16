//! How the runtime API's exports go through the guest core: its calls, and CUDA's rule that
//! every call's error becomes the calling thread's last error (`cudaGetLastError`).

use phos_protocol::cudart::{self, CudaError, FunctionId};

use crate::runtime;
pub use crate::runtime::{byte_len, c_str, call, check_out, copy_out, in_bytes};

/// Run one runtime API function: record its error as the thread's last error, turn panics
/// into `cudaErrorUnknown`, return the code. The runtime initialises the driver API on its
/// first call, as NVIDIA's does.
pub fn api_call(id: FunctionId, f: impl FnOnce() -> Result<(), CudaError>) -> i32 {
    runtime::set_driver_initialized();
    runtime::note_runtime_call();
    if ends_memory_or_streams(id) {
        // Before the call is sent: no memset or copy of another thread goes without waiting on
        // what it ends from now on.
        super::proofs::forget();
    }
    // Read before it is sent: the work a device synchronisation covers (`runtime::work_settled`).
    let mark = if id == FunctionId::CudaDeviceSynchronize { runtime::work_mark() } else { None };
    match runtime::catch_panic(id.name(), || super::managed::around_call(id, f)) {
        Ok(()) => {
            if let Some(mark) = mark {
                runtime::work_done(mark, true);
            }
            cudart::SUCCESS
        }
        Err(e) => {
            if e == cudart::NOT_SUPPORTED {
                // The server's refusal or the guest's: either way the log names the call.
                runtime::log_refusal_once(phos_protocol::apis::Function::Cudart(id), cudart::NOT_SUPPORTED.name());
            }
            runtime::set_last_error(e);
            e.0
        }
    }
}

/// Whether `id` may end device memory or a stream (the hand-written ones that may, call
/// `proofs::forget` themselves).
fn ends_memory_or_streams(id: FunctionId) -> bool {
    matches!(
        id,
        FunctionId::CudaFree
            | FunctionId::CudaStreamDestroy
            | FunctionId::CudaDeviceReset
            | FunctionId::CudaIpcCloseMemHandle
            | FunctionId::CudaGraphLaunch
            | FunctionId::PhosHostFree
    )
}

/// A call the spec marks `async_when_live` (an event record, a wait on an event, a graph
/// launch): sent without waiting once proven (`crate::live`), but only while no stream capture
/// can be open in the process (a capture turns these calls into nodes and may refuse them:
/// `cudaErrorStreamCaptureIsolation`, `...Unsupported`, `...Implicit`) and no sticky error is
/// known (the server fails every call with it, which must come back from the call). The
/// driver API's counterparts (`cuEventRecord`, `cuStreamWaitEvent`, `cuGraphLaunch`) run these
/// exports.
pub fn call_when_live<R: phos_protocol::RemoteCall<Status = CudaError>>(
    req: &R,
    handles: &[u64],
    values: &[u64],
) -> Result<(), CudaError> {
    let may_go = super::capture::none_open() && !runtime::sticky_error_seen();
    crate::live::call(req, handles, values, may_go)
}

/// A handle is being destroyed (before the call is sent): see `crate::live`.
pub fn forget_live(handle: u64) {
    crate::live::forget(handle);
}

/// A function Phos does not support: logged once, answers `cudaErrorNotSupported`.
pub fn unsupported(id: FunctionId) -> i32 {
    let function = phos_protocol::apis::Function::Cudart(id);
    runtime::log_unsupported_once(function, cudart::NOT_SUPPORTED.name());
    runtime::set_last_error(cudart::NOT_SUPPORTED);
    cudart::NOT_SUPPORTED.0
}
