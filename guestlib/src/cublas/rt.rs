//! How cuBLAS's exports go through the guest core: a call's status is its return value, as for
//! the driver API; the runtime's last error is left alone.

use phos_protocol::apis::Function;
use phos_protocol::cublas::{self, CublasStatus, FunctionId};

use crate::runtime;
pub use crate::runtime::{byte_len, c_str, call, call_deferred, check_out, copy_out, in_bytes};

/// Run one cuBLAS function; a panic becomes `CUBLAS_STATUS_INTERNAL_ERROR`. A refusal
/// (`CUBLAS_STATUS_NOT_SUPPORTED`, from the server or the guest) is logged once by name.
pub fn api_call(id: FunctionId, f: impl FnOnce() -> Result<(), CublasStatus>) -> i32 {
    match runtime::catch_panic(id.name(), f) {
        Ok(()) => cublas::SUCCESS,
        Err(e) => {
            if e == cublas::NOT_SUPPORTED {
                runtime::log_refusal_once(Function::Cublas(id), cublas::NOT_SUPPORTED.name());
            }
            e.0
        }
    }
}

/// A function Phos does not support: logged once, answers `CUBLAS_STATUS_NOT_SUPPORTED`.
pub fn unsupported(id: FunctionId) -> i32 {
    runtime::log_unsupported_once(Function::Cublas(id), cublas::NOT_SUPPORTED.name());
    cublas::NOT_SUPPORTED.0
}
