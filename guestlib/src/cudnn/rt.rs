//! How cuDNN's exports go through the guest core: a call's status is its return value, as for
//! cuBLAS; the runtime's last error is left alone. The last failure of the thread is kept for
//! `cudnnGetLastErrorString`.

use std::cell::RefCell;

use phos_protocol::apis::Function;
use phos_protocol::cudnn::{self, CudnnStatus, FunctionId};

use crate::runtime;
pub use crate::runtime::{byte_len, call, check_out, copy_out, in_bytes};

thread_local! {
    /// What the thread's last failed cuDNN call was: its name and status.
    static LAST_ERROR: RefCell<String> = const { RefCell::new(String::new()) };
}

/// The thread's last failure in words, and forget it (cuDNN clears it once read).
pub fn take_last_error() -> String {
    LAST_ERROR.try_with(|e| std::mem::take(&mut *e.borrow_mut())).unwrap_or_default()
}

fn note_failure(id: FunctionId, status: CudnnStatus) {
    let text = format!("{}: {}", id.name(), status.name());
    let _ = LAST_ERROR.try_with(|e| *e.borrow_mut() = text);
}

/// Run one cuDNN function; a panic becomes `CUDNN_STATUS_INTERNAL_ERROR`. A refusal
/// (`CUDNN_STATUS_NOT_SUPPORTED`, from the server or the guest) is logged once by name.
pub fn api_call(id: FunctionId, f: impl FnOnce() -> Result<(), CudnnStatus>) -> i32 {
    match runtime::catch_panic(id.name(), f) {
        Ok(()) => cudnn::SUCCESS,
        Err(e) => {
            if e == cudnn::NOT_SUPPORTED {
                runtime::log_refusal_once(Function::Cudnn(id), cudnn::NOT_SUPPORTED.name());
            }
            note_failure(id, e);
            e.0
        }
    }
}

/// A function Phos does not support: logged once, answers `CUDNN_STATUS_NOT_SUPPORTED`.
pub fn unsupported(id: FunctionId) -> i32 {
    runtime::log_unsupported_once(Function::Cudnn(id), cudnn::NOT_SUPPORTED.name());
    note_failure(id, cudnn::NOT_SUPPORTED);
    cudnn::NOT_SUPPORTED.0
}
