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

/// A handle's settings as this process last set them, once a call has set them (`None`:
/// not set since the handle was made, or not known). A setter that sets what is set is
/// answered here without a call, as nothing changes.
#[derive(Debug, Default, Clone, Copy)]
struct Settings {
    stream: Option<u64>,
    /// `Some(None)`: cuBLAS's default workspace (after `cublasSetStream`, which resets it).
    workspace: Option<Option<(u64, u64)>>,
    math_mode: Option<i32>,
    atomics_mode: Option<i32>,
}

fn settings() -> &'static Mutex<HashMap<u64, Settings>> {
    static SETTINGS: OnceLock<Mutex<HashMap<u64, Settings>>> = OnceLock::new();
    SETTINGS.get_or_init(Mutex::default)
}

/// A setter of `handle`: answered here when `unchanged` says the handle (live: a synchronous
/// call on it succeeded) already has what it sets, else sent (`send`, without waiting once
/// the handle is live) and noted with `note` once accepted.
fn setter(
    handle: *mut c_void,
    unchanged: impl FnOnce(&Settings) -> bool,
    send: impl FnOnce(u64) -> Result<(), CublasStatus>,
    note: impl FnOnce(&mut Settings),
) -> Option<Result<(), CublasStatus>> {
    let h = handle as u64;
    let live = crate::runtime::is_live(phos_protocol::apis::Api::Cublas, h);
    if live && settings().lock().unwrap_or_else(PoisonError::into_inner).get(&h).is_some_and(unchanged) {
        return Some(Ok(()));
    }
    let r = send(h);
    if r.is_ok() {
        note(settings().lock().unwrap_or_else(PoisonError::into_inner).entry(h).or_default());
    }
    Some(r)
}

/// `CUBLAS_DEFAULT_MATH`, a handle's mode when it is made.
const DEFAULT_MATH: i32 = 0;
/// `CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION`, a flag over the mode.
const DISALLOW_REDUCED_PRECISION_REDUCTION: i32 = 16;

/// The math mode of `handle` when the guest knows it: the handle is live (a synchronous call
/// on it succeeded and it was not destroyed since), so every setting of its mode since it was
/// made went through `set_math_mode`: the last one accepted, or cuBLAS's default where none
/// was. A mode cuBLAS might answer otherwise than set (the deprecated
/// `CUBLAS_TENSOR_OP_MATH`, a value it refuses) is asked of the server.
fn known_math_mode(handle: u64) -> Option<i32> {
    if !crate::runtime::is_live(phos_protocol::apis::Api::Cublas, handle) {
        return None;
    }
    let mode = settings().lock().unwrap_or_else(PoisonError::into_inner).get(&handle).and_then(|s| s.math_mode);
    let mode = mode.unwrap_or(DEFAULT_MATH);
    // CUBLAS_DEFAULT_MATH, CUBLAS_PEDANTIC_MATH, CUBLAS_TF32_TENSOR_OP_MATH, with or without the flag.
    matches!(mode & !DISALLOW_REDUCED_PRECISION_REDUCTION, 0 | 2 | 3).then_some(mode)
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
        let now = modes.get(&(handle as u64)).copied().unwrap_or(POINTER_MODE_HOST);
        if now == mode && crate::runtime::is_live(phos_protocol::apis::Api::Cublas, handle as u64) {
            // Every handle starts in host mode and every change goes through here: the mode
            // the handle has is known, and setting it again changes nothing.
            return Some(Ok(()));
        }
        if mode == POINTER_MODE_DEVICE {
            modes.insert(handle as u64, mode);
        } else {
            modes.remove(&(handle as u64));
        }
        None
    }

    unsafe fn forget_handle(handle: *mut c_void) -> Option<Result<(), CublasStatus>> {
        // Before the call: no call of another thread goes without waiting on it from now on.
        crate::runtime::forget_handle(phos_protocol::apis::Api::Cublas, handle as u64);
        // A cuBLAS handle may serve as a cuBLASLt handle (NVIDIA's documentation allows it):
        // its matmuls wait again too.
        crate::runtime::forget_handle(phos_protocol::apis::Api::Cublaslt, handle as u64);
        settings().lock().unwrap_or_else(PoisonError::into_inner).remove(&(handle as u64));
        pointer_modes().lock().unwrap_or_else(PoisonError::into_inner).remove(&(handle as u64));
        None
    }

    unsafe fn set_stream(handle: *mut c_void, stream: *mut c_void) -> Option<Result<(), CublasStatus>> {
        let stream = stream as u64;
        // cublasSetStream also resets the workspace to cuBLAS's default: it changes nothing
        // only where the stream is the same and the workspace the default already.
        setter(
            handle,
            |s| s.stream == Some(stream) && s.workspace == Some(None),
            |h| super::rt::call_deferred(&cublas::CublasSetStreamV2Request { handle: h, streamId: stream }, h),
            |s| {
                s.stream = Some(stream);
                s.workspace = Some(None);
            },
        )
    }

    unsafe fn set_workspace(
        handle: *mut c_void,
        workspace: *mut c_void,
        bytes: usize,
    ) -> Option<Result<(), CublasStatus>> {
        let ws = (workspace as u64, bytes as u64);
        setter(
            handle,
            |s| s.workspace == Some(Some(ws)),
            |h| {
                super::rt::call_deferred(
                    &cublas::CublasSetWorkspaceV2Request {
                        handle: h,
                        workspace: phos_protocol::Ptr::Device(ws.0),
                        workspaceSizeInBytes: ws.1,
                    },
                    h,
                )
            },
            |s| s.workspace = Some(Some(ws)),
        )
    }

    unsafe fn set_math_mode(handle: *mut c_void, mode: i32) -> Option<Result<(), CublasStatus>> {
        setter(
            handle,
            |s| s.math_mode == Some(mode),
            |h| super::rt::call_deferred(&cublas::CublasSetMathModeRequest { handle: h, mode }, h),
            |s| s.math_mode = Some(mode),
        )
    }

    unsafe fn get_math_mode(handle: *mut c_void, mode: *mut i32) -> Option<Result<(), CublasStatus>> {
        // A null `mode` is refused by the generated path, without a call.
        let known = known_math_mode(handle as u64).filter(|_| !mode.is_null())?;
        // SAFETY: not null (checked above): a writable `cublasMath_t`, as cuBLAS asks of its
        // caller.
        unsafe { *mode = known };
        Some(Ok(()))
    }

    unsafe fn set_atomics_mode(handle: *mut c_void, mode: i32) -> Option<Result<(), CublasStatus>> {
        setter(
            handle,
            |s| s.atomics_mode == Some(mode),
            |h| super::rt::call_deferred(&cublas::CublasSetAtomicsModeRequest { handle: h, mode }, h),
            |s| s.atomics_mode = Some(mode),
        )
    }
}

/// An enum argument as the utilities receive it.
fn narrow(v: i128) -> Result<i32, CublasStatus> {
    i32::try_from(v).map_err(|_| CublasStatus::INVALID_VALUE)
}
