//! The pieces of cuBLAS the spec marks `implemented_by(guest)`, its utilities and its hook.

use std::collections::HashMap;
use std::ffi::{CString, c_char, c_void};
use std::sync::OnceLock;

use std::sync::{Mutex, PoisonError};

use phos_protocol::blas;
use phos_protocol::cublas::{self, CublasStatus, FunctionId as F};

use super::rt::api_call;
use super::stubs::HandWritten;
use crate::abi::Abi;
use crate::cudart::stubs as cudart;
use crate::soname;

const POINTER_MODE_HOST: i32 = 0;
const POINTER_MODE_DEVICE: i32 = 1;
const MEMCPY_HOST_TO_DEVICE: i32 = 1;
const MEMCPY_DEVICE_TO_HOST: i32 = 2;

/// The handles whose pointer mode is not the default (host), as the program set it: every
/// BLAS call sends its handle's mode, which chooses where its scalars live.
/// (A std lock: the guest library does not take parking_lot; the map is updated in one step,
/// so a poisoned lock still holds a consistent map.)
fn pointer_modes() -> &'static Mutex<HashMap<u64, i32>> {
    static MODES: OnceLock<Mutex<HashMap<u64, i32>>> = OnceLock::new();
    MODES.get_or_init(Mutex::default)
}

/// cuBLAS's version for the ABI the program loaded: the cuBLAS of CUDA 11.8 (11.11.3), 12.9
/// (12.9.1) and 13.0 (13.0.0), as (major, minor, patch).
fn version(abi: Abi) -> (i32, i32, i32) {
    match abi {
        Abi::V11 => (11, 11, 3),
        Abi::V12 => (12, 9, 1),
        Abi::V13 => (13, 0, 0),
    }
}

/// NUL-terminated status names and texts, built once (the functions hand out pointers that
/// stay valid for the life of the process).
fn status_strings() -> &'static HashMap<i32, (CString, CString)> {
    static TABLE: OnceLock<HashMap<i32, (CString, CString)>> = OnceLock::new();
    TABLE.get_or_init(|| {
        cublas::ERRORS
            .iter()
            .filter_map(|e| Some((e.code as i32, (CString::new(e.name).ok()?, CString::new(e.text).ok()?))))
            .collect()
    })
}

/// A runtime copy's status as cuBLAS answers it: a bad argument is `INVALID_VALUE`, any other
/// failure of the copy `MAPPING_ERROR`.
fn copy_status(status: i32) -> Result<(), CublasStatus> {
    match status {
        0 => Ok(()),
        1 => Err(CublasStatus::INVALID_VALUE),
        _ => Err(CublasStatus::MAPPING_ERROR),
    }
}

/// A strided transfer of `height` runs of `width` bytes, `spitch` and `dpitch` bytes apart, as
/// one runtime 2D copy (on `stream` when given).
///
/// # Safety
/// The host side must hold what the arguments describe (the caller's contract with cuBLAS).
#[allow(clippy::too_many_arguments)]
unsafe fn strided_copy(
    dst: *mut c_void,
    dpitch: i64,
    src: *const c_void,
    spitch: i64,
    width: i64,
    height: i64,
    kind: i32,
    stream: Option<*mut c_void>,
) -> Result<(), CublasStatus> {
    if height == 0 || width == 0 {
        return Ok(());
    }
    let size = |v: i64| usize::try_from(v).map_err(|_| CublasStatus::INVALID_VALUE);
    let (dpitch, spitch, width, height) = (size(dpitch)?, size(spitch)?, size(width)?, size(height)?);
    let status = match stream {
        // SAFETY: the caller's buffers as it described them; the runtime checks the device side.
        Some(s) => unsafe { cudart::cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, height, kind, s) },
        // SAFETY: the caller's buffers as it described them; the runtime checks the device side.
        None => unsafe { cudart::cudaMemcpy2D(dst, dpitch, src, spitch, width, height, kind) },
    };
    copy_status(status)
}

/// `cublasSetVector` and its kin: `n` elements of `elem` bytes, every `incx`-th to every
/// `incy`-th.
///
/// # Safety
/// As [`strided_copy`].
#[allow(clippy::too_many_arguments)]
unsafe fn vector(
    n: i32,
    elem: i32,
    x: *const c_void,
    incx: i32,
    y: *mut c_void,
    incy: i32,
    kind: i32,
    stream: Option<*mut c_void>,
) -> Result<(), CublasStatus> {
    if n < 0 || elem <= 0 || incx <= 0 || incy <= 0 {
        return Err(CublasStatus::INVALID_VALUE);
    }
    let e = i64::from(elem);
    // SAFETY: the caller's contract.
    unsafe { strided_copy(y, i64::from(incy) * e, x, i64::from(incx) * e, e, i64::from(n), kind, stream) }
}

/// `cublasSetMatrix` and its kin: `cols` columns of `rows` elements, `lda` and `ldb` elements
/// apart.
///
/// # Safety
/// As [`strided_copy`].
#[allow(clippy::too_many_arguments)]
unsafe fn matrix(
    rows: i32,
    cols: i32,
    elem: i32,
    a: *const c_void,
    lda: i32,
    b: *mut c_void,
    ldb: i32,
    kind: i32,
    stream: Option<*mut c_void>,
) -> Result<(), CublasStatus> {
    if rows < 0 || cols < 0 || elem <= 0 || lda < rows.max(1) || ldb < rows.max(1) {
        return Err(CublasStatus::INVALID_VALUE);
    }
    let e = i64::from(elem);
    // SAFETY: the caller's contract.
    unsafe {
        strided_copy(b, i64::from(ldb) * e, a, i64::from(lda) * e, i64::from(rows) * e, i64::from(cols), kind, stream)
    }
}

/// Write `value` to the caller's out parameter `p`: `CUBLAS_STATUS_INVALID_VALUE` when null.
///
/// # Safety
/// `p` must be null or writable.
unsafe fn put(p: *mut i32, value: i32) -> Result<(), CublasStatus> {
    if p.is_null() {
        return Err(CublasStatus::INVALID_VALUE);
    }
    // SAFETY: not null, and writable (this function's contract).
    unsafe { p.write(value) };
    Ok(())
}

/// The implementation of [`HandWritten`].
pub struct Hand;

impl HandWritten for Hand {
    unsafe fn cublasGetVersion_v2(_handle: *mut c_void, version: *mut i32) -> i32 {
        api_call(F::CublasGetVersionV2, || {
            let (major, minor, patch) = self::version(soname::current_abi());
            // SAFETY: the caller's out parameter, checked for null.
            unsafe { put(version, major * 10000 + minor * 100 + patch) }
        })
    }

    unsafe fn cublasGetProperty(property: i32, value: *mut i32) -> i32 {
        api_call(F::CublasGetProperty, || {
            let (major, minor, patch) = version(soname::current_abi());
            // MAJOR_VERSION, MINOR_VERSION, PATCH_LEVEL of libraryPropertyType.
            let v = match property {
                0 => major,
                1 => minor,
                2 => patch,
                _ => return Err(CublasStatus::INVALID_VALUE),
            };
            // SAFETY: the caller's out parameter, checked for null.
            unsafe { put(value, v) }
        })
    }

    unsafe fn cublasGetCudartVersion() -> usize {
        soname::current_abi().runtime_version() as usize
    }

    unsafe fn cublasGetStatusString(status: i32) -> *const c_char {
        match status_strings().get(&status) {
            Some((_, text)) => text.as_ptr(),
            None => c"unknown cuBLAS status".as_ptr(),
        }
    }

    unsafe fn cublasGetStatusName(status: i32) -> *const c_char {
        match status_strings().get(&status) {
            Some((name, _)) => name.as_ptr(),
            None => c"CUBLAS_STATUS_UNKNOWN".as_ptr(),
        }
    }

    unsafe fn cublasSetVector(n: i32, elem: i32, x: *const c_void, incx: i32, y: *mut c_void, incy: i32) -> i32 {
        // SAFETY: the caller's buffers, as cuBLAS's contract describes them.
        api_call(F::CublasSetVector, || unsafe { vector(n, elem, x, incx, y, incy, MEMCPY_HOST_TO_DEVICE, None) })
    }

    unsafe fn cublasGetVector(n: i32, elem: i32, x: *const c_void, incx: i32, y: *mut c_void, incy: i32) -> i32 {
        // SAFETY: cuBLAS's contract for the caller: `x` holds `n` elements of `elem` bytes at
        // stride `incx` on the device, `y` as many at stride `incy` on the host.
        api_call(F::CublasGetVector, || unsafe { vector(n, elem, x, incx, y, incy, MEMCPY_DEVICE_TO_HOST, None) })
    }

    unsafe fn cublasSetMatrix(
        rows: i32,
        cols: i32,
        elem: i32,
        a: *const c_void,
        lda: i32,
        b: *mut c_void,
        ldb: i32,
    ) -> i32 {
        // SAFETY: cuBLAS's contract for the caller: `a` holds `rows` x `cols` elements of
        // `elem` bytes with leading dimension `lda` on the host, `b` likewise (`ldb`) on the device.
        api_call(F::CublasSetMatrix, || unsafe {
            matrix(rows, cols, elem, a, lda, b, ldb, MEMCPY_HOST_TO_DEVICE, None)
        })
    }

    unsafe fn cublasGetMatrix(
        rows: i32,
        cols: i32,
        elem: i32,
        a: *const c_void,
        lda: i32,
        b: *mut c_void,
        ldb: i32,
    ) -> i32 {
        // SAFETY: cuBLAS's contract for the caller: `a` holds `rows` x `cols` elements of
        // `elem` bytes with leading dimension `lda` on the device, `b` likewise (`ldb`) on the host.
        api_call(F::CublasGetMatrix, || unsafe {
            matrix(rows, cols, elem, a, lda, b, ldb, MEMCPY_DEVICE_TO_HOST, None)
        })
    }

    unsafe fn cublasSetVectorAsync(
        n: i32,
        elem: i32,
        x: *const c_void,
        incx: i32,
        y: *mut c_void,
        incy: i32,
        stream: *mut c_void,
    ) -> i32 {
        // SAFETY: as cublasSetVector's contract, and `x` stays valid until `stream` reaches the
        // copy (the caller's, for an asynchronous copy).
        api_call(F::CublasSetVectorAsync, || unsafe {
            vector(n, elem, x, incx, y, incy, MEMCPY_HOST_TO_DEVICE, Some(stream))
        })
    }

    unsafe fn cublasGetVectorAsync(
        n: i32,
        elem: i32,
        x: *const c_void,
        incx: i32,
        y: *mut c_void,
        incy: i32,
        stream: *mut c_void,
    ) -> i32 {
        // SAFETY: as cublasGetVector's contract, and `y` stays valid until `stream` reaches the
        // copy (the caller's, for an asynchronous copy).
        api_call(F::CublasGetVectorAsync, || unsafe {
            vector(n, elem, x, incx, y, incy, MEMCPY_DEVICE_TO_HOST, Some(stream))
        })
    }

    unsafe fn cublasSetMatrixAsync(
        rows: i32,
        cols: i32,
        elem: i32,
        a: *const c_void,
        lda: i32,
        b: *mut c_void,
        ldb: i32,
        stream: *mut c_void,
    ) -> i32 {
        // SAFETY: as cublasSetMatrix's contract, and `a` stays valid until `stream` reaches the
        // copy (the caller's, for an asynchronous copy).
        api_call(F::CublasSetMatrixAsync, || unsafe {
            matrix(rows, cols, elem, a, lda, b, ldb, MEMCPY_HOST_TO_DEVICE, Some(stream))
        })
    }

    unsafe fn cublasGetMatrixAsync(
        rows: i32,
        cols: i32,
        elem: i32,
        a: *const c_void,
        lda: i32,
        b: *mut c_void,
        ldb: i32,
        stream: *mut c_void,
    ) -> i32 {
        // SAFETY: as cublasGetMatrix's contract, and `b` stays valid until `stream` reaches the
        // copy (the caller's, for an asynchronous copy).
        api_call(F::CublasGetMatrixAsync, || unsafe {
            matrix(rows, cols, elem, a, lda, b, ldb, MEMCPY_DEVICE_TO_HOST, Some(stream))
        })
    }

    fn compute_scalar_size(compute_type: i128, c_type: i128) -> Result<i128, CublasStatus> {
        let (compute_type, c_type) = (narrow(compute_type)?, narrow(c_type)?);
        blas::compute_scalar_bytes(compute_type, c_type).map(i128::from).ok_or(CublasStatus::NOT_SUPPORTED)
    }

    fn data_type_size(data_type: i128) -> Result<i128, CublasStatus> {
        blas::data_type_bytes(narrow(data_type)?).map(i128::from).ok_or(CublasStatus::NOT_SUPPORTED)
    }

    fn pointer_mode(handle: i128) -> Result<i128, CublasStatus> {
        let handle = u64::try_from(handle).map_err(|_| CublasStatus::INVALID_VALUE)?;
        Ok(i128::from(
            pointer_modes()
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .get(&handle)
                .copied()
                .unwrap_or(POINTER_MODE_HOST),
        ))
    }

    unsafe fn note_pointer_mode(handle: *mut c_void, mode: i32) -> Option<Result<(), CublasStatus>> {
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

/// An enum argument as the utilities receive it.
fn narrow(v: i128) -> Result<i32, CublasStatus> {
    i32::try_from(v).map_err(|_| CublasStatus::INVALID_VALUE)
}
