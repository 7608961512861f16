//! How cuFFT's exports go through the guest core: a call's status is its return value, as for
//! cuBLAS; the runtime's last error is left alone.

use phos_protocol::apis::Function;
use phos_protocol::cufft::{self, CufftResult, FunctionId};

use crate::runtime;
pub use crate::runtime::{byte_len, c_str, call, check_out, copy_out, in_bytes};

/// Run one cuFFT function; a panic becomes `CUFFT_INTERNAL_ERROR`. A refusal
/// (`CUFFT_NOT_SUPPORTED`, from the server or the guest) is logged once by name.
pub fn api_call(id: FunctionId, f: impl FnOnce() -> Result<(), CufftResult>) -> i32 {
    match runtime::catch_panic(id.name(), f) {
        Ok(()) => cufft::SUCCESS,
        Err(e) => {
            if e == cufft::NOT_SUPPORTED {
                runtime::log_refusal_once(Function::Cufft(id), cufft::NOT_SUPPORTED.name());
            }
            e.0
        }
    }
}

/// A function Phos does not support: logged once, answers `CUFFT_NOT_SUPPORTED`.
pub fn unsupported(id: FunctionId) -> i32 {
    runtime::log_unsupported_once(Function::Cufft(id), cufft::NOT_SUPPORTED.name());
    cufft::NOT_SUPPORTED.0
}
