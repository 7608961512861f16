//! The pieces of cuDNN the spec marks `implemented_by(guest)` and its utility: the versions
//! (those of the libcudnn the server runs, asked once), the error strings and the thread's
//! last error.

use std::ffi::{CString, c_char};
use std::sync::OnceLock;

use phos_protocol::cudnn::{self, CudnnStatus, FunctionId as F, PhosCudnnGetVersionsRequest};

use super::rt;
use super::stubs::HandWritten;

/// cuDNN's version where the server cannot be asked (no router): the cuDNN of the headers the
/// spec was written from (9.28.0), as cudnnGetVersion encodes it (major * 10000 + minor * 100
/// + patch).
const FALLBACK_VERSION: usize = 92800;
/// The CUDA runtime that cuDNN was built against, likewise (12.9).
const FALLBACK_CUDART: usize = 12090;
/// The newest compute capability that cuDNN knows, likewise (as 100 * major + 10 * minor).
const FALLBACK_MAX_DEVICE: usize = 1210;

/// The server's cuDNN (version, newest device, CUDA runtime), asked once.
fn versions() -> (usize, usize, usize) {
    static VERSIONS: OnceLock<(usize, usize, usize)> = OnceLock::new();
    *VERSIONS.get_or_init(|| match rt::call(&PhosCudnnGetVersionsRequest {}) {
        Ok(v) => (v.version as usize, v.max_device_version as usize, v.cudart_version as usize),
        Err(e) => {
            tracing::warn!("cuDNN's version could not be asked of the server ({}): answering 9.28.0", e.name());
            (FALLBACK_VERSION, FALLBACK_MAX_DEVICE, FALLBACK_CUDART)
        }
    })
}

/// The status names, NUL-terminated, built once (cudnnGetErrorString hands out pointers that
/// stay valid for the life of the process).
fn status_names() -> &'static Vec<(i32, CString)> {
    static NAMES: OnceLock<Vec<(i32, CString)>> = OnceLock::new();
    NAMES.get_or_init(|| {
        cudnn::ERRORS.iter().filter_map(|e| Some((i32::try_from(e.code).ok()?, CString::new(e.name).ok()?))).collect()
    })
}

/// The implementation of [`HandWritten`].
pub struct Hand;

impl HandWritten for Hand {
    unsafe fn cudnnGetVersion() -> usize {
        versions().0
    }

    unsafe fn cudnnGetMaxDeviceVersion() -> usize {
        versions().1
    }

    unsafe fn cudnnGetCudartVersion() -> usize {
        versions().2
    }

    unsafe fn cudnnGetProperty(property: i32, value: *mut i32) -> i32 {
        rt::api_call(F::CudnnGetProperty, || {
            let v = versions().0;
            // libraryPropertyType: MAJOR_VERSION, MINOR_VERSION, PATCH_LEVEL.
            let answer = match property {
                0 => v / 10000,
                1 => (v / 100) % 100,
                2 => v % 100,
                _ => return Err(CudnnStatus::BAD_PARAM),
            };
            if value.is_null() {
                return Err(CudnnStatus::BAD_PARAM);
            }
            // SAFETY: the caller's out parameter, checked for null.
            unsafe { value.write(answer as i32) };
            Ok(())
        })
    }

    unsafe fn cudnnGetErrorString(status: i32) -> *const c_char {
        static UNKNOWN: &std::ffi::CStr = c"CUDNN_UNKNOWN_STATUS";
        status_names().iter().find(|(code, _)| *code == status).map_or(UNKNOWN.as_ptr(), |(_, name)| name.as_ptr())
    }

    unsafe fn cudnnGetLastErrorString(message: *mut c_char, max_size: usize) {
        if message.is_null() || max_size == 0 {
            return;
        }
        let text = rt::take_last_error();
        let n = text.len().min(max_size - 1);
        let mut bytes: Vec<c_char> = text.bytes().take(n).map(|b| b as c_char).collect();
        bytes.push(0);
        // SAFETY: the caller gives `max_size` writable bytes at `message` (cuDNN's contract);
        // `n + 1 <= max_size` are written.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), message, bytes.len()) };
    }

    fn requested_elements(array: i128, requested: i128) -> Result<i128, CudnnStatus> {
        Ok(if array == 0 { 0 } else { requested })
    }
}
