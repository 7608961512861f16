//! How cuRAND's exports go through the guest core: a call's status is its return value, as for
//! cuBLAS; the runtime's last error is left alone.

use phos_protocol::apis::Function;
use phos_protocol::curand::{self, CurandStatus, FunctionId};

use crate::runtime;
pub use crate::runtime::{byte_len, c_str, call, check_out, copy_out, in_bytes};

/// Run one cuRAND function; a panic becomes `CURAND_STATUS_INTERNAL_ERROR`. A refusal
/// (`CURAND_STATUS_ARCH_MISMATCH`, from the server or the guest) is logged once by name.
pub fn api_call(id: FunctionId, f: impl FnOnce() -> Result<(), CurandStatus>) -> i32 {
    match runtime::catch_panic(id.name(), f) {
        Ok(()) => curand::SUCCESS,
        Err(e) => {
            if e == curand::NOT_SUPPORTED {
                runtime::log_refusal_once(Function::Curand(id), curand::NOT_SUPPORTED.name());
            }
            e.0
        }
    }
}

/// A function Phos does not support: logged once, answers `CURAND_STATUS_ARCH_MISMATCH`.
pub fn unsupported(id: FunctionId) -> i32 {
    runtime::log_unsupported_once(Function::Curand(id), curand::NOT_SUPPORTED.name());
    curand::NOT_SUPPORTED.0
}
