//! The pieces of the driver API the spec marks `implemented_by(guest)`, its utility and its
//! hook.

use std::collections::HashMap;
use std::ffi::{CString, c_char, c_void};
use std::sync::OnceLock;

use phos_protocol::cuda::{self, CuError};

use super::stubs::HandWritten;
use crate::runtime;

/// The implementation of [`HandWritten`].
pub struct Hand;

/// NUL-terminated error names and texts, built once (`cuGetErrorName` hands out pointers that
/// stay valid for the life of the process).
fn error_strings() -> &'static HashMap<i32, (CString, CString)> {
    static TABLE: OnceLock<HashMap<i32, (CString, CString)>> = OnceLock::new();
    TABLE.get_or_init(|| {
        cuda::ERRORS
            .iter()
            .map(|e| (e.code as i32, (CString::new(e.name).unwrap(), CString::new(e.text).unwrap())))
            .collect()
    })
}

/// `cuGetErrorName`/`cuGetErrorString`: the entry's name or text through `p_str`; an error
/// code the driver does not have is `CUDA_ERROR_INVALID_VALUE` with `*p_str` set to NULL, as
/// NVIDIA's driver answers.
unsafe fn error_string(error: i32, p_str: *mut *const c_char, text: bool) -> i32 {
    if p_str.is_null() {
        return CuError::INVALID_VALUE.0;
    }
    let found = error_strings().get(&error).map(|(name, t)| if text { t.as_ptr() } else { name.as_ptr() });
    // SAFETY: `p_str` is non-null and, by the caller's contract with CUDA, points to a
    // `const char *` it may write.
    unsafe { *p_str = found.unwrap_or(std::ptr::null()) };
    if found.is_some() { cuda::SUCCESS } else { CuError::INVALID_VALUE.0 }
}

impl HandWritten for Hand {
    unsafe fn cuGetErrorName(error: i32, p_str: *mut *const c_char) -> i32 {
        // SAFETY: `p_str` is passed on unchanged: `error_string` asks what this export's caller
        // promises (null, or a place for one `const char *`).
        unsafe { error_string(error, p_str, false) }
    }

    unsafe fn cuGetErrorString(error: i32, p_str: *mut *const c_char) -> i32 {
        // SAFETY: as in `cuGetErrorName`.
        unsafe { error_string(error, p_str, true) }
    }

    /// Only NVIDIA's own CUDA runtime asks for the driver's private export tables: say where
    /// it is built in and report the session bypassed (`bypass::private_runtime`); the table
    /// is not there.
    unsafe fn cuGetExportTable(pp_export_table: *mut *const c_void, _table_id: *const c_void) -> i32 {
        if !pp_export_table.is_null() {
            // SAFETY: by the caller's contract with CUDA, a non-null `pp_export_table` points
            // to a pointer it may write.
            unsafe { *pp_export_table = std::ptr::null() };
        }
        super::rt::api_call(cuda::FunctionId::CuGetExportTable, || {
            crate::bypass::private_runtime();
            Err(cuda::NOT_SUPPORTED)
        })
    }

    fn driver_initialized() -> Result<i128, CuError> {
        Ok(i128::from(runtime::driver_initialized()))
    }

    fn initialize_driver() {
        runtime::set_driver_initialized();
    }
}
