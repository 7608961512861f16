//! How the driver API's exports go through the guest core. Unlike the runtime, the driver
//! keeps no last error: a call's status is its return value, and nothing else.

use phos_protocol::cuda::{self, CuError, FunctionId};

use crate::runtime;
pub use crate::runtime::{byte_len, c_str, call, check_out, copy_out, in_bytes};

/// Run one driver API function; a panic becomes `CUDA_ERROR_UNKNOWN`.
pub fn api_call(id: FunctionId, f: impl FnOnce() -> Result<(), CuError>) -> i32 {
    if matches!(id, FunctionId::CuMemUnmap | FunctionId::CuMemRelease | FunctionId::CuMemAddressFree) {
        // Before the call is sent: memsets and copies on what it ends wait again.
        crate::cudart::proofs::forget();
    }
    match runtime::catch_panic(id.name(), f) {
        Ok(()) => cuda::SUCCESS,
        Err(e) => e.0,
    }
}

/// A function Phos does not support: logged once, answers `CUDA_ERROR_NOT_SUPPORTED`.
pub fn unsupported(id: FunctionId) -> i32 {
    runtime::log_unsupported_once(phos_protocol::apis::Function::Cuda(id), cuda::NOT_SUPPORTED.name());
    cuda::NOT_SUPPORTED.0
}
