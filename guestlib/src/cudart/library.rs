//! CUDA 12's context-independent loading (`cudaLibrary*`): a library is a module the server
//! loaded (the driver API's `cuModuleLoadData` machinery, guestlib/src/cuda/modules.rs) and
//! its kernels (`cudaKernel_t`) are the module's functions, which the runtime's launches and
//! kernel attribute calls take wherever they take a kernel.

use std::collections::HashMap;
use std::ffi::{c_char, c_void};
use std::sync::{Mutex, PoisonError};

use phos_protocol::CudaError;
use phos_protocol::cuda::CuError;

use crate::cuda::modules;

/// The kernel handle of each (library, name) handed out: CUDA answers one kernel the same
/// handle however often it is asked for (a program may compare them).
static KERNELS: Mutex<Option<HashMap<(u64, String), u64>>> = Mutex::new(None);

/// The handle of `library`'s kernel `kernel`, the same each time.
fn kernel_of(library: u64, kernel: &str) -> Result<u64, CudaError> {
    let key = (library, kernel.to_string());
    if let Some(&f) = KERNELS.lock().unwrap_or_else(PoisonError::into_inner).get_or_insert_with(HashMap::new).get(&key)
    {
        return Ok(f);
    }
    let f = modules::function(library, kernel).map_err(runtime_status)?;
    let mut g = KERNELS.lock().unwrap_or_else(PoisonError::into_inner);
    Ok(*g.get_or_insert_with(HashMap::new).entry(key).or_insert(f))
}

/// A driver status of the module machinery as the runtime says it: the two APIs share the
/// numbers of everything a load or a lookup answers (an invalid image, PTX, handle, a name not
/// found).
fn runtime_status(e: CuError) -> CudaError {
    CudaError(e.0)
}

/// Log, once, a call that answers `cudaErrorNotSupported`.
fn not_supported(what: &str) -> CudaError {
    crate::log::init();
    if let Some(dropped) = phos_protocol::log_limit::GUEST_LINES.admit(what) {
        tracing::warn!("{what} is not supported by Phos ({dropped} earlier lines dropped)");
    }
    CudaError::NotSupported
}

/// A name the caller passes.
///
/// # Safety
/// `p` must be null or NUL-terminated.
unsafe fn name<'a>(p: *const c_char) -> Result<&'a str, CudaError> {
    if p.is_null() {
        return Err(CudaError::InvalidValue);
    }
    // SAFETY: not null, NUL-terminated (this function's contract).
    unsafe { crate::runtime::c_str(p) }.map_err(|_| CudaError::InvalidValue)
}

/// Write `value` to a caller's out parameter.
///
/// # Safety
/// `out` must be null or writable.
unsafe fn put<T>(out: *mut T, value: T) -> Result<(), CudaError> {
    if out.is_null() {
        return Err(CudaError::InvalidValue);
    }
    // SAFETY: not null, writable (this function's contract).
    unsafe { out.write_unaligned(value) };
    Ok(())
}

/// The JIT and library options: counts with their arrays. JIT options are hints to a
/// compiler Phos does not run in the process (its log buffers are left empty, as
/// `cuModuleLoadDataEx` leaves them); the library options (`cudaLibraryHostUniversalFunction
/// AndDataTable`, `cudaLibraryBinaryIsPreserved`) change nothing Phos keeps.
///
/// # Safety
/// Each non-null array must hold its count of entries.
unsafe fn check_options(
    jit: *mut i32,
    jit_values: *mut *mut c_void,
    jit_count: u32,
    lib: *mut i32,
    lib_values: *mut *mut c_void,
    lib_count: u32,
) -> Result<(), CudaError> {
    if jit_count > 0 && (jit.is_null() || jit_values.is_null()) {
        return Err(CudaError::InvalidValue);
    }
    if lib_count > 0 && (lib.is_null() || lib_values.is_null()) {
        return Err(CudaError::InvalidValue);
    }
    for i in 0..lib_count as usize {
        // SAFETY: `i < lib_count`, within the non-null array (this function's contract).
        let option = unsafe { lib.wrapping_add(i).read_unaligned() };
        // cudaLibraryHostUniversalFunctionAndDataTable (0), cudaLibraryBinaryIsPreserved (1).
        if !(0..=1).contains(&option) {
            return Err(CudaError::InvalidValue);
        }
    }
    // SAFETY: `jit_count` entries in each non-null array (this function's contract).
    unsafe { crate::cuda::hand::clear_jit_logs(jit_count, jit, jit_values) };
    Ok(())
}

/// `cudaLibraryLoadData`: the image (a fat binary, a cubin or NUL-terminated PTX) loaded as a
/// module.
///
/// # Safety
/// `out` null or writable; `code` null or a whole image; the options as [`check_options`].
#[allow(clippy::too_many_arguments)]
pub unsafe fn load_data(
    out: *mut *mut c_void,
    code: *const c_void,
    jit: *mut i32,
    jit_values: *mut *mut c_void,
    jit_count: u32,
    lib: *mut i32,
    lib_values: *mut *mut c_void,
    lib_count: u32,
) -> Result<(), CudaError> {
    if out.is_null() || code.is_null() {
        return Err(CudaError::InvalidValue);
    }
    // SAFETY: the options as this function's contract gives them.
    unsafe { check_options(jit, jit_values, jit_count, lib, lib_values, lib_count)? };
    // SAFETY: `code` is not null and a whole image (this function's contract).
    let module = unsafe { modules::load_for("cudaLibraryLoadData", code) }.map_err(runtime_status)?;
    // SAFETY: not null, writable (this function's contract).
    unsafe { put(out, module as usize as *mut c_void) }
}

/// `cudaLibraryLoadFromFile`: the file's image, as [`load_data`].
///
/// # Safety
/// `out` null or writable; `path` null or NUL-terminated; the options as [`check_options`].
#[allow(clippy::too_many_arguments)]
pub unsafe fn load_from_file(
    out: *mut *mut c_void,
    path: *const c_char,
    jit: *mut i32,
    jit_values: *mut *mut c_void,
    jit_count: u32,
    lib: *mut i32,
    lib_values: *mut *mut c_void,
    lib_count: u32,
) -> Result<(), CudaError> {
    // SAFETY: null or NUL-terminated (this function's contract).
    let path = unsafe { name(path)? };
    // A NUL-terminated copy: PTX is text the loader reads to its end.
    let mut image = std::fs::read(path).map_err(|e| {
        if let Some(dropped) = phos_protocol::log_limit::GUEST_LINES.admit("cudaLibraryLoadFromFile") {
            tracing::warn!("cudaLibraryLoadFromFile: cannot read {path}: {e} ({dropped} earlier lines dropped)");
        }
        CudaError::FileNotFound
    })?;
    if image.len() < 4 {
        return Err(CudaError::InvalidPtx);
    }
    image.push(0);
    // SAFETY: the image of the file, terminated, alive for the call; the rest as this
    // function's contract gives it.
    unsafe { load_data(out, image.as_ptr().cast(), jit, jit_values, jit_count, lib, lib_values, lib_count) }
}

/// `cudaLibraryUnload`: its kernels go with it.
pub fn unload(library: u64) -> Result<(), CudaError> {
    modules::unload(library).map_err(runtime_status)?;
    // Its kernels went with its last unload (the same image loaded twice is one module).
    if modules::kernel_names(library).is_err()
        && let Some(k) = KERNELS.lock().unwrap_or_else(PoisonError::into_inner).as_mut()
    {
        k.retain(|(l, _), _| *l != library);
    }
    Ok(())
}

/// `cudaLibraryGetKernel`.
///
/// # Safety
/// `out` null or writable; `kernel` null or NUL-terminated.
pub unsafe fn get_kernel(out: *mut *mut c_void, library: u64, kernel: *const c_char) -> Result<(), CudaError> {
    if out.is_null() {
        return Err(CudaError::InvalidValue);
    }
    // SAFETY: null or NUL-terminated (this function's contract).
    let f = kernel_of(library, unsafe { name(kernel)? })?;
    // SAFETY: not null, writable (this function's contract).
    unsafe { put(out, f as usize as *mut c_void) }
}

/// `cudaLibraryGetKernelCount`.
///
/// # Safety
/// `out` null or writable.
pub unsafe fn kernel_count(out: *mut u32, library: u64) -> Result<(), CudaError> {
    if out.is_null() {
        return Err(CudaError::InvalidValue);
    }
    let n = modules::kernel_names(library).map_err(runtime_status)?.len();
    // SAFETY: not null, writable (this function's contract).
    unsafe { put(out, u32::try_from(n).unwrap_or(u32::MAX)) }
}

/// `cudaLibraryEnumerateKernels`: up to `max` of the library's kernels.
///
/// # Safety
/// `out` null or room for `max` handles.
pub unsafe fn enumerate_kernels(out: *mut *mut c_void, max: u32, library: u64) -> Result<(), CudaError> {
    if out.is_null() || max == 0 {
        return Err(CudaError::InvalidValue);
    }
    let names = modules::kernel_names(library).map_err(runtime_status)?;
    for (i, kernel) in names.iter().take(max as usize).enumerate() {
        let f = kernel_of(library, kernel)?;
        // SAFETY: `i < max`: within the room for `max` handles (this function's contract).
        unsafe { out.wrapping_add(i).write_unaligned(f as usize as *mut c_void) };
    }
    Ok(())
}

/// `cudaLibraryGetGlobal`: a `__device__` or `__constant__` variable of the library.
///
/// # Safety
/// `dptr` and `bytes` null or writable; `var` null or NUL-terminated.
pub unsafe fn get_global(
    dptr: *mut *mut c_void,
    bytes: *mut usize,
    library: u64,
    var: *const c_char,
) -> Result<(), CudaError> {
    if dptr.is_null() && bytes.is_null() {
        return Err(CudaError::InvalidValue);
    }
    // SAFETY: null or NUL-terminated (this function's contract).
    let (address, size) = modules::global(library, unsafe { name(var)? }).map_err(runtime_status)?;
    if !dptr.is_null() {
        // SAFETY: not null, writable (this function's contract).
        unsafe { put(dptr, address as usize as *mut c_void)? };
    }
    if !bytes.is_null() {
        // SAFETY: not null, writable (this function's contract).
        unsafe { put(bytes, size as usize)? };
    }
    Ok(())
}

/// `cudaLibraryGetManaged`: a library's `__managed__` variables would need the host copy
/// Phos keeps for the program's own (registered at start-up), which a loaded image does not
/// register: not carried.
pub fn get_managed() -> Result<(), CudaError> {
    Err(not_supported("cudaLibraryGetManaged"))
}

/// `cudaLibraryGetUnifiedFunction`: unified functions (device functions callable from the
/// host) have no host code Phos could hand out: not carried.
pub fn get_unified_function() -> Result<(), CudaError> {
    Err(not_supported("cudaLibraryGetUnifiedFunction"))
}
