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
//!
//! The guest also keeps every attribute set on a descriptor since its creation (its bytes), so
//! that a setting of what is set already costs no call, a setting of a descriptor it knows goes
//! without waiting (`rt::call_deferred`), and a heuristic query whose descriptors have the
//! contents of an earlier one on the same handle is answered from the earlier answer
//! ([`heuristics`]).
//!
//! A matmul descriptor, layout or preference the program destroys goes to the guest's pool
//! (the server keeps it), and a creation of the kind takes one from it: the server makes it
//! again under the same handle with the creation's arguments (`phosLt...Reinit`, without
//! waiting), so a framework's create/destroy around every matmul costs no round trip.

use std::cell::Cell;
use std::collections::{BTreeMap, HashMap};
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
#[derive(Debug)]
enum Note {
    /// A descriptor is made: its handle is written to `out`.
    Create {
        out: *mut *mut c_void,
        noted: Noted,
        created: [i64; 4],
    },
    Destroy(u64),
    /// An attribute of a descriptor (`kind` says which table the number is from): its bytes.
    Set {
        handle: u64,
        kind: Kind,
        attr: i32,
        value: Vec<u8>,
    },
    /// A heuristic query the guest does not know the answer to: kept when it succeeds.
    Heuristic {
        key: heuristics::Key,
        results: *const u8,
        count: *const i32,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Kind {
    Matmul,
    Layout,
    Preference,
    Transform,
}

/// One live descriptor as the guest knows it: what it keeps to size a matmul, its creation
/// arguments, and every attribute set on it since (by number, the bytes the server took).
#[derive(Debug, Clone)]
struct Known {
    noted: Noted,
    created: [i64; 4],
    values: BTreeMap<i32, Vec<u8>>,
}

thread_local! {
    /// The note of the call this thread is making (one at a time per thread).
    static PENDING: Cell<Option<Note>> = const { Cell::new(None) };
}

/// The descriptors of the process, by handle (handles of every kind are distinct).
/// (A std lock: the guest library does not take parking_lot; the map is updated in one step,
/// so a poisoned lock still holds a consistent map.)
fn descriptors() -> &'static Mutex<HashMap<u64, Known>> {
    static TABLE: OnceLock<Mutex<HashMap<u64, Known>>> = OnceLock::new();
    TABLE.get_or_init(Mutex::default)
}

fn noted(handle: i128) -> Option<Noted> {
    let handle = u64::try_from(handle).ok()?;
    descriptors().lock().unwrap_or_else(PoisonError::into_inner).get(&handle).map(|k| k.noted)
}

/// Whether the guest knows a matmul's descriptors: `matmul` a live matmul descriptor and each
/// of `layouts` a live matrix layout, made (and not destroyed) by calls the server accepted.
pub(crate) fn matmul_descriptors_known(matmul: u64, layouts: [u64; 4]) -> bool {
    let table = descriptors().lock().unwrap_or_else(PoisonError::into_inner);
    let is = |h: u64, kind: Kind| table.get(&h).is_some_and(|n| n.noted.kind == kind);
    is(matmul, Kind::Matmul) && layouts.iter().all(|&l| is(l, Kind::Layout))
}

/// Whether a setting of attribute `attr` with `size` bytes on `handle` can go without waiting:
/// the guest knows the descriptor (live, of the kind the call takes) and cuBLASLt has such an
/// attribute of that size, so only the value is left for the server (and NVIDIA's library) to
/// refuse.
pub(crate) fn setting_known(kind: SetKind, handle: u64, attr: i32, size: u64) -> bool {
    let kind = Kind::from(kind);
    let sized = attribute_size(kind, attr).is_some_and(|s| s as u64 == size);
    sized
        && descriptors()
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&handle)
            .is_some_and(|k| k.noted.kind == kind)
}

/// Whether the destruction of `handle` can go without waiting: the guest knows the descriptor,
/// of the kind the call takes (it leaves the table once the call is sent).
pub(crate) fn destroy_known(kind: SetKind, handle: u64) -> bool {
    let kind = Kind::from(kind);
    descriptors().lock().unwrap_or_else(PoisonError::into_inner).get(&handle).is_some_and(|k| k.noted.kind == kind)
}

impl From<SetKind> for Kind {
    fn from(kind: SetKind) -> Kind {
        match kind {
            SetKind::Matmul => Kind::Matmul,
            SetKind::Layout => Kind::Layout,
            SetKind::Preference => Kind::Preference,
        }
    }
}

/// The kinds of descriptor whose settings have an async id.
#[derive(Debug, Clone, Copy)]
pub(crate) enum SetKind {
    Matmul,
    Layout,
    Preference,
}

/// The size of an attribute's C type (cublasLt.h of CUDA 11.8, as the server's table has
/// them); `None` for a number the guest does not know (the server answers it).
fn attribute_size(kind: Kind, attr: i32) -> Option<usize> {
    let size = match (kind, attr) {
        // Matmul: the 4-byte enums and counts, the 8-byte pointers and strides, FAST_ACCUM.
        (Kind::Matmul, 0..=7 | 15 | 22 | 26) => 4,
        (Kind::Matmul, 8 | 10..=14 | 17..=21 | 23 | 24) => 8,
        (Kind::Matmul, 25) => 1,
        (Kind::Layout, 0 | 1 | 5) => 4,
        (Kind::Layout, 2..=4 | 6 | 7) => 8,
        (Kind::Preference, 0 | 2..=11 | 13) => 4,
        (Kind::Preference, 1 | 12) => 8,
        (Kind::Transform, 0..=3) => 4,
        _ => return None,
    };
    Some(size)
}

/// Descriptors of each kind the guest keeps for reuse at most.
const POOL_MAX: usize = 64;

/// The guest's pool: descriptors the program destroyed that the server still has, by kind,
/// made again (`phosLt...Reinit`) when the program creates one of the kind.
fn pool() -> &'static Mutex<HashMap<Kind, Vec<u64>>> {
    static POOL: OnceLock<Mutex<HashMap<Kind, Vec<u64>>>> = OnceLock::new();
    POOL.get_or_init(Mutex::default)
}

/// A creation answered from the pool: a descriptor of `kind` taken from it is made again by
/// the server (`reinit`, sent without waiting) with the creation's arguments and written to
/// `out`. `None` when the pool has none (the creation goes to the server).
fn reuse(
    kind: Kind,
    out: *mut *mut c_void,
    noted: Noted,
    created: [i64; 4],
    reinit: impl FnOnce(u64) -> Result<(), CublasLtStatus>,
) -> Option<Result<(), CublasLtStatus>> {
    let _ = PENDING.try_with(|p| p.set(None));
    if out.is_null() {
        // The generated path refuses it.
        return None;
    }
    let handle = pool().lock().unwrap_or_else(PoisonError::into_inner).get_mut(&kind)?.pop()?;
    Some(reinit(handle).map(|()| {
        descriptors()
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(handle, Known { noted, created, values: BTreeMap::new() });
        // SAFETY: `out` is the caller's out parameter (cuBLASLt's contract), checked for null.
        unsafe { out.write(handle as *mut c_void) };
    }))
}

/// A destruction: a descriptor the guest knows goes to the pool while the pool has room
/// (`park` tells the server, without waiting, which refuses every call naming it from then
/// on, as a destroyed one), answered here; otherwise it is noted and destroyed by the server.
fn to_pool(
    kind: Kind,
    handle: u64,
    park: impl FnOnce(u64) -> Result<(), CublasLtStatus>,
) -> Option<Result<(), CublasLtStatus>> {
    let room = {
        let mut table = descriptors().lock().unwrap_or_else(PoisonError::into_inner);
        let known = table.get(&handle).is_some_and(|k| k.noted.kind == kind);
        let room = pool().lock().unwrap_or_else(PoisonError::into_inner).get(&kind).is_none_or(|p| p.len() < POOL_MAX);
        if known && room {
            // Gone for the program's other threads from now on.
            table.remove(&handle);
        }
        known && room
    };
    if !room {
        return note(Note::Destroy(handle));
    }
    let _ = PENDING.try_with(|p| p.set(None));
    Some(park(handle).map(|()| {
        pool().lock().unwrap_or_else(PoisonError::into_inner).entry(kind).or_default().push(handle);
    }))
}

fn note(n: Note) -> Option<Result<(), CublasLtStatus>> {
    let _ = PENDING.try_with(|p| p.set(Some(n)));
    None
}

/// The fast path of an attribute setting: answered here when it sets what the descriptor has
/// already (the same bytes, set since its creation), noted otherwise.
///
/// # Safety
/// `buf` must hold `size` bytes, or be null.
unsafe fn note_set(
    kind: Kind,
    handle: u64,
    attr: i32,
    buf: *const c_void,
    size: usize,
) -> Option<Result<(), CublasLtStatus>> {
    if buf.is_null() || size > 64 {
        // The generated path refuses it.
        let _ = PENDING.try_with(|p| p.set(None));
        return None;
    }
    // SAFETY: `buf` holds `size` bytes (this function's contract), checked for null.
    let value = unsafe { std::slice::from_raw_parts(buf.cast::<u8>(), size) }.to_vec();
    let set_already = descriptors()
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .get(&handle)
        .is_some_and(|k| k.noted.kind == kind && k.values.get(&attr) == Some(&value));
    if set_already {
        let _ = PENDING.try_with(|p| p.set(None));
        return Some(Ok(()));
    }
    note(Note::Set { handle, kind, attr, value })
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
        compute_type: i32,
        scale_type: i32,
    ) -> Option<Result<(), CublasLtStatus>> {
        let created = [i64::from(compute_type), i64::from(scale_type), 0, 0];
        let noted = Noted::scaled(Kind::Matmul, scale_type);
        let reinit = |h| {
            let req = cublaslt::PhosLtMatmulDescReinitRequest {
                matmulDesc: h,
                computeType: compute_type,
                scaleType: scale_type,
            };
            crate::runtime::call_async(&req)
        };
        if let Some(made) = reuse(Kind::Matmul, matmul_desc, noted, created, reinit) {
            return Some(made);
        }
        note(Note::Create { out: matmul_desc, noted, created })
    }

    unsafe fn lt_note_layout_create(
        layout: *mut *mut c_void,
        data_type: i32,
        rows: u64,
        cols: u64,
        ld: i64,
    ) -> Option<Result<(), CublasLtStatus>> {
        let created = [i64::from(data_type), rows as i64, cols as i64, ld];
        let noted = Noted { rows, cols, ..Noted::scaled(Kind::Layout, 0) };
        let reinit = |h| {
            let req = cublaslt::PhosLtMatrixLayoutReinitRequest { matLayout: h, dataType: data_type, rows, cols, ld };
            crate::runtime::call_async(&req)
        };
        if let Some(made) = reuse(Kind::Layout, layout, noted, created, reinit) {
            return Some(made);
        }
        note(Note::Create { out: layout, noted, created })
    }

    unsafe fn lt_note_transform_desc_create(
        transform_desc: *mut *mut c_void,
        scale_type: i32,
    ) -> Option<Result<(), CublasLtStatus>> {
        let created = [i64::from(scale_type), 0, 0, 0];
        note(Note::Create { out: transform_desc, noted: Noted::scaled(Kind::Transform, scale_type), created })
    }

    unsafe fn lt_note_preference_create(pref: *mut *mut c_void) -> Option<Result<(), CublasLtStatus>> {
        let noted = Noted::scaled(Kind::Preference, 0);
        let reinit = |h| crate::runtime::call_async(&cublaslt::PhosLtMatmulPreferenceReinitRequest { pref: h });
        if let Some(made) = reuse(Kind::Preference, pref, noted, [0; 4], reinit) {
            return Some(made);
        }
        note(Note::Create { out: pref, noted, created: [0; 4] })
    }

    unsafe fn lt_note_descriptor_destroy_preference(desc: *mut c_void) -> Option<Result<(), CublasLtStatus>> {
        let park = |h| crate::runtime::call_async(&cublaslt::PhosLtMatmulPreferenceParkRequest { pref: h });
        to_pool(Kind::Preference, desc as u64, park)
    }

    unsafe fn lt_note_preference_set(
        pref: *mut c_void,
        attr: i32,
        buf: *const c_void,
        size: usize,
    ) -> Option<Result<(), CublasLtStatus>> {
        // SAFETY: `buf` holds `size` bytes (cuBLASLt's contract for the caller).
        unsafe { note_set(Kind::Preference, pref as u64, attr, buf, size) }
    }

    #[allow(clippy::too_many_arguments)]
    unsafe fn lt_heuristic_cached(
        handle: *mut c_void,
        operation_desc: *mut c_void,
        a_desc: *mut c_void,
        b_desc: *mut c_void,
        c_desc: *mut c_void,
        d_desc: *mut c_void,
        preference: *mut c_void,
        requested: i32,
        results: *mut c_void,
        count: *mut i32,
    ) -> Option<Result<(), CublasLtStatus>> {
        let _ = PENDING.try_with(|p| p.set(None));
        if results.is_null() || count.is_null() {
            return None;
        }
        let named = [operation_desc, a_desc, b_desc, c_desc, d_desc, preference].map(|d| d as u64);
        let key = {
            let table = descriptors().lock().unwrap_or_else(PoisonError::into_inner);
            heuristics::key(handle as u64, requested, named, |h, i| {
                let kind = if i == 0 {
                    Kind::Matmul
                } else if i == 5 {
                    Kind::Preference
                } else {
                    Kind::Layout
                };
                table.get(&h).filter(|k| k.noted.kind == kind).map(|k| (k.created, k.values.clone()))
            })
        }?;
        // Only on a handle the server has taken calls on (and that was not destroyed since).
        if crate::runtime::is_live(phos_protocol::apis::Api::Cublaslt, handle as u64)
            && let Some((answers, n)) = heuristics::lookup(&key)
        {
            // SAFETY: `results` holds `requested` results of 96 bytes (the caller's contract;
            // the precondition bounds it), `answers` at most that many; `count` is writable.
            unsafe {
                std::ptr::copy_nonoverlapping(answers.as_ptr(), results.cast::<u8>(), answers.len());
            }
            // SAFETY: as above.
            unsafe { count.write(n) };
            return Some(Ok(()));
        }
        note(Note::Heuristic { key, results: results.cast::<u8>().cast_const(), count: count.cast_const() })
    }

    unsafe fn lt_forget_handle(handle: *mut c_void) -> Option<Result<(), CublasLtStatus>> {
        // Before the call: no matmul of another thread goes without waiting on it from now on.
        crate::runtime::forget_handle(phos_protocol::apis::Api::Cublaslt, handle as u64);
        // A cuBLAS handle cast to a cuBLASLt one is the same handle: it is gone for both.
        crate::runtime::forget_handle(phos_protocol::apis::Api::Cublas, handle as u64);
        None
    }

    unsafe fn lt_note_descriptor_destroy_matmul(desc: *mut c_void) -> Option<Result<(), CublasLtStatus>> {
        let park = |h| crate::runtime::call_async(&cublaslt::PhosLtMatmulDescParkRequest { matmulDesc: h });
        to_pool(Kind::Matmul, desc as u64, park)
    }

    unsafe fn lt_note_descriptor_destroy_layout(desc: *mut c_void) -> Option<Result<(), CublasLtStatus>> {
        let park = |h| crate::runtime::call_async(&cublaslt::PhosLtMatrixLayoutParkRequest { matLayout: h });
        to_pool(Kind::Layout, desc as u64, park)
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
        unsafe { note_set(Kind::Matmul, desc as u64, attr, buf, size) }
    }

    unsafe fn lt_note_layout_set(
        layout: *mut c_void,
        attr: i32,
        buf: *const c_void,
        size: usize,
    ) -> Option<Result<(), CublasLtStatus>> {
        // SAFETY: as above.
        unsafe { note_set(Kind::Layout, layout as u64, attr, buf, size) }
    }

    unsafe fn lt_note_transform_desc_set(
        desc: *mut c_void,
        attr: i32,
        buf: *const c_void,
        size: usize,
    ) -> Option<Result<(), CublasLtStatus>> {
        // SAFETY: as above.
        unsafe { note_set(Kind::Transform, desc as u64, attr, buf, size) }
    }

    fn lt_apply_note() {
        let Some(pending) = PENDING.try_with(Cell::take).ok().flatten() else { return };
        if let Note::Heuristic { key, results, count } = pending {
            // SAFETY: the out parameters the generated stub has just written the answer to
            // (checked for null before the call was sent).
            let n = unsafe { count.read() };
            let len = usize::try_from(n).unwrap_or(0).saturating_mul(96);
            // SAFETY: as above: `results` holds the `requested` results, `n` of them answered
            // (at most `requested`: the server's reply is the array it was sent).
            let answers = unsafe { std::slice::from_raw_parts(results, len) }.to_vec();
            heuristics::keep(key, answers, n);
            return;
        }
        let mut table = descriptors().lock().unwrap_or_else(PoisonError::into_inner);
        match pending {
            Note::Create { out, noted, created } => {
                // SAFETY: the out parameter the generated stub has just written the new handle
                // to (checked for null before the call was sent).
                let handle = unsafe { out.read() } as u64;
                table.insert(handle, Known { noted, created, values: BTreeMap::new() });
            }
            Note::Destroy(handle) => {
                table.remove(&handle);
            }
            Note::Set { handle, kind, attr, value } => {
                let Some(k) = table.get_mut(&handle) else { return };
                // SAFETY: `value` holds its own length of bytes.
                let integer = unsafe { integer(value.as_ptr().cast(), value.len()) };
                k.values.insert(attr, value);
                let Some(value) = integer else { return };
                let n = &mut k.noted;
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
            Note::Heuristic { .. } => {}
        }
    }
}

/// The answers of heuristic queries (`cublasLtMatmulAlgoGetHeuristic`) this process got.
///
/// cuBLASLt's heuristic is a function of the question: the handle (its device and library),
/// the matmul descriptor, the four layouts, the preference and the number of algorithms asked
/// for; no matrix's address or contents are part of it. The guest knows every one of these
/// descriptors' contents (their creation arguments and every attribute set since, as the
/// server took them), so a question with the same handle and the same contents has the same
/// answer: it is answered here, without a call. Only successful answers are kept, on a handle
/// that is live (a destroyed handle's answers are never used again), and the cache is per
/// process, so per guest and per device the handle was made on. It is bounded: when full it
/// is emptied (a framework asks a few shapes over and over).
mod heuristics {
    use std::collections::{BTreeMap, HashMap};
    use std::sync::{Mutex, OnceLock, PoisonError};

    /// The question, as bytes: the handle, the count asked for, then each descriptor's
    /// creation arguments and attributes (number, length, bytes).
    pub type Key = Vec<u8>;

    /// Answers kept at most.
    const MAX_KEPT: usize = 1024;

    /// A kept answer: the algorithms' results (96 bytes each) and their count.
    type Answer = (Vec<u8>, i32);

    fn cache() -> &'static Mutex<HashMap<Key, Answer>> {
        static CACHE: OnceLock<Mutex<HashMap<Key, Answer>>> = OnceLock::new();
        CACHE.get_or_init(Mutex::default)
    }

    /// The key of a question; `None` when a descriptor it names is not one the guest knows
    /// (`contents(handle, position)`: position 0 the matmul descriptor, 1-4 the layouts, 5 the
    /// preference).
    pub fn key(
        handle: u64,
        requested: i32,
        named: [u64; 6],
        contents: impl Fn(u64, usize) -> Option<([i64; 4], BTreeMap<i32, Vec<u8>>)>,
    ) -> Option<Key> {
        let mut key = Vec::with_capacity(256);
        key.extend_from_slice(&handle.to_le_bytes());
        key.extend_from_slice(&requested.to_le_bytes());
        for (i, &h) in named.iter().enumerate() {
            let (created, values) = contents(h, i)?;
            key.push(0xff);
            for c in created {
                key.extend_from_slice(&c.to_le_bytes());
            }
            for (attr, bytes) in values {
                key.extend_from_slice(&attr.to_le_bytes());
                key.push(bytes.len() as u8);
                key.extend_from_slice(&bytes);
            }
        }
        Some(key)
    }

    pub fn lookup(key: &Key) -> Option<Answer> {
        cache().lock().unwrap_or_else(PoisonError::into_inner).get(key).cloned()
    }

    pub fn keep(key: Key, answers: Vec<u8>, count: i32) {
        let mut cache = cache().lock().unwrap_or_else(PoisonError::into_inner);
        if cache.len() >= MAX_KEPT {
            cache.clear();
        }
        cache.insert(key, (answers, count));
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn a_question_is_its_handle_count_and_contents() {
            let contents = |set: i32| {
                move |h: u64, _: usize| {
                    (h != 0).then(|| ([h as i64, 0, 0, 0], BTreeMap::from([(7, set.to_le_bytes().to_vec())])))
                }
            };
            let k = key(1, 4, [1, 2, 3, 4, 5, 6], contents(1)).unwrap();
            assert_eq!(key(1, 4, [1, 2, 3, 4, 5, 6], contents(1)), Some(k.clone()));
            assert_ne!(key(1, 4, [1, 2, 3, 4, 5, 6], contents(2)), Some(k.clone()), "an attribute differs");
            assert_ne!(key(2, 4, [1, 2, 3, 4, 5, 6], contents(1)), Some(k.clone()), "another handle");
            assert_ne!(key(1, 3, [1, 2, 3, 4, 5, 6], contents(1)), Some(k.clone()), "another count");
            assert_eq!(key(1, 4, [1, 2, 3, 0, 5, 6], contents(1)), None, "a descriptor it does not know");
            keep(k.clone(), vec![9; 96], 1);
            assert_eq!(lookup(&k), Some((vec![9; 96], 1)));
        }
    }
}
