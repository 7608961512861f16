//! The pieces of cuSPARSE the spec marks `implemented_by(guest)`, its utilities and its hooks:
//! versions and texts, the pointer mode each handle has, and the legacy matrix descriptor
//! (`cusparseMatDescr_t`), which no carried function sends to the server: the guest keeps it.

use std::collections::HashMap;
use std::ffi::{CString, c_char, c_void};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError};

use phos_protocol::blas;
use phos_protocol::cusparse::{self, CusparseStatus, FunctionId as F};

use super::rt::api_call;
use super::stubs::HandWritten;
use crate::abi::Abi;
use crate::soname;

const POINTER_MODE_HOST: i32 = 0;
const POINTER_MODE_DEVICE: i32 = 1;

/// The handles whose pointer mode is not the default (host), as the program set it: every
/// compute call sends its handle's mode, which chooses where its scalars live.
/// (A std lock: the guest library does not take parking_lot; the map is updated in one step,
/// so a poisoned lock still holds a consistent map.)
fn pointer_modes() -> &'static Mutex<HashMap<u64, i32>> {
    static MODES: OnceLock<Mutex<HashMap<u64, i32>>> = OnceLock::new();
    MODES.get_or_init(Mutex::default)
}

/// A legacy matrix descriptor's settings (cuSPARSE's defaults: general, lower, non-unit,
/// base 0).
#[derive(Clone, Copy, Default)]
struct MatDescr {
    matrix_type: i32,
    fill_mode: i32,
    diag_type: i32,
    index_base: i32,
}

/// The live matrix descriptors by the value the program holds. (A std lock, as above: every
/// change is one insert, remove or field store.)
fn mat_descrs() -> &'static Mutex<HashMap<u64, MatDescr>> {
    static DESCRS: OnceLock<Mutex<HashMap<u64, MatDescr>>> = OnceLock::new();
    DESCRS.get_or_init(Mutex::default)
}

/// The value the next matrix descriptor gets: never null, never reused.
static NEXT_DESCR: AtomicU64 = AtomicU64::new(0x5350_0000_0001);

/// cuSPARSE's version for the ABI the program loaded: the cuSPARSE of CUDA 11.8 (11.7.5),
/// 12.9 (12.5.10) and 13.0 (12.6.2), as (major, minor, patch).
fn version(abi: Abi) -> (i32, i32, i32) {
    match abi {
        Abi::V11 => (11, 7, 5),
        Abi::V12 => (12, 5, 10),
        Abi::V13 => (12, 6, 2),
    }
}

/// NUL-terminated status names and texts, built once (the functions hand out pointers that
/// stay valid for the life of the process).
fn status_strings() -> &'static HashMap<i32, (CString, CString)> {
    static TABLE: OnceLock<HashMap<i32, (CString, CString)>> = OnceLock::new();
    TABLE.get_or_init(|| {
        cusparse::ERRORS
            .iter()
            .filter_map(|e| Some((e.code as i32, (CString::new(e.name).ok()?, CString::new(e.text).ok()?))))
            .collect()
    })
}

/// Write `value` to the caller's out parameter `p`: `CUSPARSE_STATUS_INVALID_VALUE` when null.
///
/// # Safety
/// `p` must be null or writable.
unsafe fn put<T>(p: *mut T, value: T) -> Result<(), CusparseStatus> {
    if p.is_null() {
        return Err(CusparseStatus::INVALID_VALUE);
    }
    // SAFETY: not null, and writable (this function's contract).
    unsafe { p.write(value) };
    Ok(())
}

/// Change one setting of a live matrix descriptor; `valid` is the setting's range. An unknown
/// descriptor is `CUSPARSE_STATUS_INVALID_VALUE`, as is a value out of range.
fn set_descr(
    id: F,
    descr: u64,
    value: i32,
    valid: std::ops::RangeInclusive<i32>,
    field: fn(&mut MatDescr) -> &mut i32,
) -> i32 {
    api_call(id, || {
        if !valid.contains(&value) {
            return Err(CusparseStatus::INVALID_VALUE);
        }
        let mut descrs = mat_descrs().lock().unwrap_or_else(PoisonError::into_inner);
        let d = descrs.get_mut(&descr).ok_or(CusparseStatus::INVALID_VALUE)?;
        *field(d) = value;
        Ok(())
    })
}

/// One setting of a matrix descriptor (the default for an unknown one: the getters return the
/// setting itself, with no status to fail with).
fn get_descr(descr: u64, field: fn(&MatDescr) -> i32) -> i32 {
    let descrs = mat_descrs().lock().unwrap_or_else(PoisonError::into_inner);
    field(&descrs.get(&descr).copied().unwrap_or_default())
}

/// The implementation of [`HandWritten`].
pub struct Hand;

impl HandWritten for Hand {
    unsafe fn cusparseGetVersion(_handle: *mut c_void, out: *mut i32) -> i32 {
        api_call(F::CusparseGetVersion, || {
            let (major, minor, patch) = version(soname::current_abi());
            // SAFETY: the caller's out parameter, checked for null.
            unsafe { put(out, major * 1000 + minor * 100 + patch) }
        })
    }

    unsafe fn cusparseGetProperty(property: i32, value: *mut i32) -> i32 {
        api_call(F::CusparseGetProperty, || {
            let (major, minor, patch) = version(soname::current_abi());
            // MAJOR_VERSION, MINOR_VERSION, PATCH_LEVEL of libraryPropertyType.
            let v = match property {
                0 => major,
                1 => minor,
                2 => patch,
                _ => return Err(CusparseStatus::INVALID_VALUE),
            };
            // SAFETY: the caller's out parameter, checked for null.
            unsafe { put(value, v) }
        })
    }

    unsafe fn cusparseGetErrorName(status: i32) -> *const c_char {
        match status_strings().get(&status) {
            Some((name, _)) => name.as_ptr(),
            None => c"CUSPARSE_STATUS_UNKNOWN".as_ptr(),
        }
    }

    unsafe fn cusparseGetErrorString(status: i32) -> *const c_char {
        match status_strings().get(&status) {
            Some((_, text)) => text.as_ptr(),
            None => c"unknown error".as_ptr(),
        }
    }

    unsafe fn cusparseCreateMatDescr(descr: *mut u64) -> i32 {
        api_call(F::CusparseCreateMatDescr, || {
            let id = NEXT_DESCR.fetch_add(1, Ordering::Relaxed);
            // SAFETY: the caller's out parameter, checked for null.
            unsafe { put(descr, id) }?;
            mat_descrs().lock().unwrap_or_else(PoisonError::into_inner).insert(id, MatDescr::default());
            Ok(())
        })
    }

    unsafe fn cusparseDestroyMatDescr(descr: u64) -> i32 {
        api_call(F::CusparseDestroyMatDescr, || {
            // Destroying NULL is a no-op in cuSPARSE.
            if descr != 0 {
                mat_descrs().lock().unwrap_or_else(PoisonError::into_inner).remove(&descr);
            }
            Ok(())
        })
    }

    unsafe fn cusparseSetMatType(descr: u64, value: i32) -> i32 {
        set_descr(F::CusparseSetMatType, descr, value, 0..=3, |d| &mut d.matrix_type)
    }

    unsafe fn cusparseGetMatType(descr: u64) -> i32 {
        get_descr(descr, |d| d.matrix_type)
    }

    unsafe fn cusparseSetMatFillMode(descr: u64, value: i32) -> i32 {
        set_descr(F::CusparseSetMatFillMode, descr, value, 0..=1, |d| &mut d.fill_mode)
    }

    unsafe fn cusparseGetMatFillMode(descr: u64) -> i32 {
        get_descr(descr, |d| d.fill_mode)
    }

    unsafe fn cusparseSetMatDiagType(descr: u64, value: i32) -> i32 {
        set_descr(F::CusparseSetMatDiagType, descr, value, 0..=1, |d| &mut d.diag_type)
    }

    unsafe fn cusparseGetMatDiagType(descr: u64) -> i32 {
        get_descr(descr, |d| d.diag_type)
    }

    unsafe fn cusparseSetMatIndexBase(descr: u64, value: i32) -> i32 {
        set_descr(F::CusparseSetMatIndexBase, descr, value, 0..=1, |d| &mut d.index_base)
    }

    unsafe fn cusparseGetMatIndexBase(descr: u64) -> i32 {
        get_descr(descr, |d| d.index_base)
    }

    fn data_type_size(data_type: i128) -> Result<i128, CusparseStatus> {
        let data_type = i32::try_from(data_type).map_err(|_| CusparseStatus::INVALID_VALUE)?;
        blas::data_type_bytes(data_type).map(i128::from).ok_or(CusparseStatus::NOT_SUPPORTED)
    }

    fn pointer_mode(handle: i128) -> Result<i128, CusparseStatus> {
        let handle = u64::try_from(handle).map_err(|_| CusparseStatus::INVALID_VALUE)?;
        let modes = pointer_modes().lock().unwrap_or_else(PoisonError::into_inner);
        Ok(i128::from(modes.get(&handle).copied().unwrap_or(POINTER_MODE_HOST)))
    }

    unsafe fn forget_handle(handle: *mut c_void) -> Option<Result<(), CusparseStatus>> {
        // Forgotten before the server answers: a handle the server refuses to destroy is not
        // one of the session's anyway.
        pointer_modes().lock().unwrap_or_else(PoisonError::into_inner).remove(&(handle as u64));
        None
    }

    unsafe fn note_pointer_mode(handle: *mut c_void, mode: i32) -> Option<Result<(), CusparseStatus>> {
        // Noted before the server answers: a handle the server refuses fails every call anyway.
        let mut modes = pointer_modes().lock().unwrap_or_else(PoisonError::into_inner);
        if mode == POINTER_MODE_DEVICE {
            modes.insert(handle as u64, mode);
        } else {
            modes.remove(&(handle as u64));
        }
        None
    }
}
