//! The pieces of cuBLASLt the spec marks `implemented_by(guest)`, its utilities and the notes
//! the guest keeps of each descriptor.
//!
//! A matmul's scalars are host or device memory of the descriptor's scale type, which only the
//! descriptor says, and its cost (2mnk per matrix of the batch) follows from the descriptor and
//! the layouts. So the guest keeps, per descriptor, the few attributes these depend on: each
//! creation, destruction and setting is noted before it is sent (`fast_path`, which leaves the
//! call to the generated path) and applied once the server has accepted it (`on_success`), so
//! a refused call changes nothing. The server keeps its own copy and checks what the guest
//! sends against it.

use std::cell::Cell;
use std::collections::HashMap;
use std::ffi::{CString, c_char, c_void};
use std::sync::{Mutex, OnceLock, PoisonError};

use phos_protocol::cublaslt::{self, CublasLtStatus, FunctionId as F};

use super::rt::api_call;
use super::stubs::HandWritten;
use crate::abi::Abi;
use crate::soname;

/// cuBLASLt's attribute numbers the guest reads (cublasLt.h).
mod attr {
    pub const MATMUL_SCALE_TYPE: i32 = 1;
    pub const MATMUL_POINTER_MODE: i32 = 2;
    pub const MATMUL_TRANSA: i32 = 3;
    pub const LAYOUT_ROWS: i32 = 2;
    pub const LAYOUT_COLS: i32 = 3;
    pub const LAYOUT_BATCH_COUNT: i32 = 5;
    pub const TRANSFORM_SCALE_TYPE: i32 = 0;
    pub const TRANSFORM_POINTER_MODE: i32 = 1;
}

/// What the guest keeps of one descriptor.
#[derive(Debug, Clone, Copy)]
struct Noted {
    kind: Kind,
    scale_type: i32,
    pointer_mode: i32,
    transa: i32,
    rows: u64,
    cols: u64,
    batch: i64,
}

impl Noted {
    fn scaled(kind: Kind, scale_type: i32) -> Noted {
        Noted { kind, scale_type, pointer_mode: 0, transa: 0, rows: 0, cols: 0, batch: 1 }
    }
}

/// A change noted before its call is sent, applied when the call succeeds.
#[derive(Debug, Clone, Copy)]
enum Note {
    /// A descriptor is made: its handle is written to `out`.
    Create {
        out: *mut *mut c_void,
        noted: Noted,
    },
    Destroy(u64),
    /// An integer attribute of a descriptor (`kind` says which table the number is from).
    Set {
        handle: u64,
        kind: Kind,
        attr: i32,
        value: i64,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Matmul,
    Layout,
    Transform,
}

thread_local! {
    /// The note of the call this thread is making (one at a time per thread).
    static PENDING: Cell<Option<Note>> = const { Cell::new(None) };
}

/// The descriptors of the process, by handle (handles of every kind are distinct).
/// (A std lock: the guest library does not take parking_lot; the map is updated in one step,
/// so a poisoned lock still holds a consistent map.)
fn descriptors() -> &'static Mutex<HashMap<u64, Noted>> {
    static TABLE: OnceLock<Mutex<HashMap<u64, Noted>>> = OnceLock::new();
    TABLE.get_or_init(Mutex::default)
}

fn noted(handle: i128) -> Option<Noted> {
    let handle = u64::try_from(handle).ok()?;
    descriptors().lock().unwrap_or_else(PoisonError::into_inner).get(&handle).copied()
}

/// Whether the guest knows a matmul's descriptors: `matmul` a live matmul descriptor and each
/// of `layouts` a live matrix layout, made (and not destroyed) by calls the server accepted.
pub(crate) fn matmul_descriptors_known(matmul: u64, layouts: [u64; 4]) -> bool {
    let table = descriptors().lock().unwrap_or_else(PoisonError::into_inner);
    let is = |h: u64, kind: Kind| table.get(&h).is_some_and(|n| n.kind == kind);
    is(matmul, Kind::Matmul) && layouts.iter().all(|&l| is(l, Kind::Layout))
}

fn note(n: Note) -> Option<Result<(), CublasLtStatus>> {
    let _ = PENDING.try_with(|p| p.set(Some(n)));
    None
}

/// An attribute's value as an integer, when it is one the guest keeps and `size` is its size
/// (a wrong size is the server's to refuse).
///
/// # Safety
/// `buf` must hold `size` bytes, or be null.
unsafe fn integer(buf: *const c_void, size: usize) -> Option<i64> {
    if buf.is_null() {
        return None;
    }
    match size {
        // SAFETY: `buf` holds 4 bytes (this function's contract); an unaligned read.
        4 => Some(i64::from(unsafe { buf.cast::<i32>().read_unaligned() })),
        // SAFETY: `buf` holds 8 bytes (this function's contract); an unaligned read.
        8 => Some(unsafe { buf.cast::<i64>().read_unaligned() }),
        _ => None,
    }
}

/// Bytes of one scalar of a `cudaDataType` used as a scale type.
fn scale_bytes(scale_type: i32) -> i32 {
    match scale_type {
        2 | 14 => 2,     // CUDA_R_16F, CUDA_R_16BF
        0 | 10 | 3 => 4, // CUDA_R_32F, CUDA_R_32I, CUDA_R_8I (scaled as int32)
        1 | 4 => 8,      // CUDA_R_64F, CUDA_C_32F
        5 => 16,         // CUDA_C_64F
        _ => 4,
    }
}

/// cuBLASLt's version for the ABI the program loaded (that of the cuBLAS of the same CUDA).
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
        cublaslt::ERRORS
            .iter()
            .filter_map(|e| Some((e.code as i32, (CString::new(e.name).ok()?, CString::new(e.text).ok()?))))
            .collect()
    })
}

/// The implementation of [`HandWritten`].
pub struct Hand;

impl HandWritten for Hand {
    unsafe fn cublasLtGetVersion() -> usize {
        let (major, minor, patch) = version(soname::current_abi());
        (major * 10000 + minor * 100 + patch) as usize
    }

    unsafe fn cublasLtGetCudartVersion() -> usize {
        soname::current_abi().runtime_version() as usize
    }

    unsafe fn cublasLtGetProperty(property: i32, value: *mut i32) -> i32 {
        api_call(F::CublasLtGetProperty, || {
            let (major, minor, patch) = version(soname::current_abi());
            // MAJOR_VERSION, MINOR_VERSION, PATCH_LEVEL of libraryPropertyType.
            let v = match property {
                0 => major,
                1 => minor,
                2 => patch,
                _ => return Err(CublasLtStatus::INVALID_VALUE),
            };
            if value.is_null() {
                return Err(CublasLtStatus::INVALID_VALUE);
            }
            // SAFETY: the caller's out parameter, checked for null.
            unsafe { value.write(v) };
            Ok(())
        })
    }

    unsafe fn cublasLtGetStatusString(status: i32) -> *const c_char {
        match status_strings().get(&status) {
            Some((_, text)) => text.as_ptr(),
            None => c"unknown cuBLAS status".as_ptr(),
        }
    }

    unsafe fn cublasLtGetStatusName(status: i32) -> *const c_char {
        match status_strings().get(&status) {
            Some((name, _)) => name.as_ptr(),
            None => c"CUBLAS_STATUS_UNKNOWN".as_ptr(),
        }
    }

    unsafe fn cublasLtLoggerSetCallback(callback: *mut c_void) -> i32 {
        api_call(F::CublasLtLoggerSetCallback, || {
            tracing::info!("cublasLtLoggerSetCallback({callback:p}): accepted; Phos's cuBLASLt logs nothing to it");
            Ok(())
        })
    }

    unsafe fn cublasLtLoggerSetFile(file: *mut c_void) -> i32 {
        api_call(F::CublasLtLoggerSetFile, || {
            tracing::info!("cublasLtLoggerSetFile({file:p}): accepted; Phos's cuBLASLt writes nothing to it");
            Ok(())
        })
    }

    unsafe fn cublasLtLoggerOpenFile(log_file: *const c_char) -> i32 {
        api_call(F::CublasLtLoggerOpenFile, || {
            if log_file.is_null() {
                return Err(CublasLtStatus::INVALID_VALUE);
            }
            // SAFETY: a NUL-terminated string (the caller's contract), checked for null.
            let name = unsafe { std::ffi::CStr::from_ptr(log_file) }.to_string_lossy();
            tracing::info!("cublasLtLoggerOpenFile({name}): accepted; Phos's cuBLASLt writes nothing to it");
            Ok(())
        })
    }

    unsafe fn cublasLtLoggerSetLevel(level: i32) -> i32 {
        api_call(F::CublasLtLoggerSetLevel, || {
            if !(0..=5).contains(&level) {
                return Err(CublasLtStatus::INVALID_VALUE);
            }
            tracing::info!("cublasLtLoggerSetLevel({level}): accepted");
            Ok(())
        })
    }

    unsafe fn cublasLtLoggerSetMask(mask: i32) -> i32 {
        api_call(F::CublasLtLoggerSetMask, || {
            tracing::info!("cublasLtLoggerSetMask({mask:#x}): accepted");
            Ok(())
        })
    }

    unsafe fn cublasLtLoggerForceDisable() -> i32 {
        api_call(F::CublasLtLoggerForceDisable, || Ok(()))
    }

    fn lt_pointer_mode(desc: i128) -> Result<i128, CublasLtStatus> {
        // An unknown descriptor is the server's to refuse (by name, logged).
        Ok(i128::from(noted(desc).map_or(0, |n| n.pointer_mode)))
    }

    fn lt_scale_size(desc: i128) -> Result<i128, CublasLtStatus> {
        Ok(i128::from(noted(desc).map_or(4, |n| scale_bytes(n.scale_type))))
    }

    fn lt_algo_bytes(algo: i128) -> Result<i128, CublasLtStatus> {
        Ok(if algo == 0 { 0 } else { 64 })
    }

    fn lt_matmul_flops(desc: i128, a_desc: i128, d_desc: i128) -> Result<i128, CublasLtStatus> {
        let (Some(desc), Some(a), Some(d)) = (noted(desc), noted(a_desc), noted(d_desc)) else { return Ok(0) };
        let k = if desc.transa == 0 { a.cols } else { a.rows };
        Ok(2 * i128::from(d.rows) * i128::from(d.cols) * i128::from(k) * i128::from(d.batch.max(1)))
    }

    unsafe fn lt_note_matmul_desc_create(
        matmul_desc: *mut *mut c_void,
        _compute_type: i32,
        scale_type: i32,
    ) -> Option<Result<(), CublasLtStatus>> {
        note(Note::Create { out: matmul_desc, noted: Noted::scaled(Kind::Matmul, scale_type) })
    }

    unsafe fn lt_note_layout_create(
        layout: *mut *mut c_void,
        _type: i32,
        rows: u64,
        cols: u64,
        _ld: i64,
    ) -> Option<Result<(), CublasLtStatus>> {
        note(Note::Create { out: layout, noted: Noted { rows, cols, ..Noted::scaled(Kind::Layout, 0) } })
    }

    unsafe fn lt_note_transform_desc_create(
        transform_desc: *mut *mut c_void,
        scale_type: i32,
    ) -> Option<Result<(), CublasLtStatus>> {
        note(Note::Create { out: transform_desc, noted: Noted::scaled(Kind::Transform, scale_type) })
    }

    unsafe fn lt_forget_handle(handle: *mut c_void) -> Option<Result<(), CublasLtStatus>> {
        // Before the call: no matmul of another thread goes without waiting on it from now on.
        crate::runtime::forget_handle(phos_protocol::apis::Api::Cublaslt, handle as u64);
        // A cuBLAS handle cast to a cuBLASLt one is the same handle: it is gone for both.
        crate::runtime::forget_handle(phos_protocol::apis::Api::Cublas, handle as u64);
        None
    }

    unsafe fn lt_note_descriptor_destroy_matmul(desc: *mut c_void) -> Option<Result<(), CublasLtStatus>> {
        note(Note::Destroy(desc as u64))
    }

    unsafe fn lt_note_descriptor_destroy_layout(desc: *mut c_void) -> Option<Result<(), CublasLtStatus>> {
        note(Note::Destroy(desc as u64))
    }

    unsafe fn lt_note_descriptor_destroy_transform(desc: *mut c_void) -> Option<Result<(), CublasLtStatus>> {
        note(Note::Destroy(desc as u64))
    }

    unsafe fn lt_note_matmul_desc_set(
        desc: *mut c_void,
        attr: i32,
        buf: *const c_void,
        size: usize,
    ) -> Option<Result<(), CublasLtStatus>> {
        // SAFETY: `buf` holds `size` bytes (cuBLASLt's contract for the caller).
        let value = unsafe { integer(buf, size) };
        let _ = PENDING
            .try_with(|p| p.set(value.map(|value| Note::Set { handle: desc as u64, kind: Kind::Matmul, attr, value })));
        None
    }

    unsafe fn lt_note_layout_set(
        layout: *mut c_void,
        attr: i32,
        buf: *const c_void,
        size: usize,
    ) -> Option<Result<(), CublasLtStatus>> {
        // SAFETY: as above.
        let value = unsafe { integer(buf, size) };
        PENDING
            .with(|p| p.set(value.map(|value| Note::Set { handle: layout as u64, kind: Kind::Layout, attr, value })));
        None
    }

    unsafe fn lt_note_transform_desc_set(
        desc: *mut c_void,
        attr: i32,
        buf: *const c_void,
        size: usize,
    ) -> Option<Result<(), CublasLtStatus>> {
        // SAFETY: as above.
        let value = unsafe { integer(buf, size) };
        PENDING
            .with(|p| p.set(value.map(|value| Note::Set { handle: desc as u64, kind: Kind::Transform, attr, value })));
        None
    }

    fn lt_apply_note() {
        let Some(pending) = PENDING.try_with(Cell::take).ok().flatten() else { return };
        let mut table = descriptors().lock().unwrap_or_else(PoisonError::into_inner);
        match pending {
            Note::Create { out, noted } => {
                // SAFETY: the out parameter the generated stub has just written the new handle
                // to (checked for null before the call was sent).
                let handle = unsafe { out.read() } as u64;
                table.insert(handle, noted);
            }
            Note::Destroy(handle) => {
                table.remove(&handle);
            }
            Note::Set { handle, kind, attr, value } => {
                let Some(n) = table.get_mut(&handle) else { return };
                let narrow = |v: i64| i32::try_from(v).unwrap_or(-1);
                match (kind, attr) {
                    (Kind::Matmul, attr::MATMUL_SCALE_TYPE) | (Kind::Transform, attr::TRANSFORM_SCALE_TYPE) => {
                        n.scale_type = narrow(value)
                    }
                    (Kind::Matmul, attr::MATMUL_POINTER_MODE) | (Kind::Transform, attr::TRANSFORM_POINTER_MODE) => {
                        n.pointer_mode = narrow(value)
                    }
                    (Kind::Matmul, attr::MATMUL_TRANSA) => n.transa = narrow(value),
                    (Kind::Layout, attr::LAYOUT_ROWS) => n.rows = value as u64,
                    (Kind::Layout, attr::LAYOUT_COLS) => n.cols = value as u64,
                    (Kind::Layout, attr::LAYOUT_BATCH_COUNT) => n.batch = value,
                    _ => {}
                }
            }
        }
    }
}
