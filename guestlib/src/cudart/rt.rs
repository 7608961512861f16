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
        // Before the call is sent: no memset of another thread goes without waiting on what
        // it ends from now on.
        super::memsets::forget();
    }
    match runtime::catch_panic(id.name(), || super::managed::around_call(id, f)) {
        Ok(()) => cudart::SUCCESS,
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
/// `memsets::forget` themselves).
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

/// A function Phos does not support: logged once, answers `cudaErrorNotSupported`.
pub fn unsupported(id: FunctionId) -> i32 {
    let function = phos_protocol::apis::Function::Cudart(id);
    runtime::log_unsupported_once(function, cudart::NOT_SUPPORTED.name());
    runtime::set_last_error(cudart::NOT_SUPPORTED);
    cudart::NOT_SUPPORTED.0
}
