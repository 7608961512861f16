//! Driver entry points by name: `cuGetProcAddress` and the runtime's
//! `cudaGetDriverEntryPoint[ByVersion]`, which answer this library's own exports (never
//! NVIDIA's).
//!
//! A name asked for is the function's base name (`cuMemAlloc`); which export answers it
//! depends on the CUDA version the caller was built for (`cuMemAlloc` before 3.2,
//! `cuMemAlloc_v2` since) and, for functions that take a stream or run on the default stream,
//! on whether it wants the per-thread default stream (`cuMemcpyHtoD_v2_ptds`). That table is
//! `entry_versions.txt`: one line per `PFN_<name>_v<version>[_ptsz|_ptds]` typedef of CUDA's
//! `cudaTypedefs.h` (CUDA 11.8, 12.9 and 13.0), with the export each stands for.

use std::collections::HashMap;
use std::ffi::{CStr, CString, c_char, c_void};
use std::sync::OnceLock;

use phos_protocol::cuda::CuError;

/// `CU_GET_PROC_ADDRESS_*` flags.
const LEGACY_STREAM: u64 = 1;
const PER_THREAD_DEFAULT_STREAM: u64 = 2;

/// `CUdriverProcAddressQueryResult`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SymbolStatus {
    Success = 0,
    SymbolNotFound = 1,
    VersionNotSufficient = 2,
}

/// One line of the table: since `version`, `name` is `export` (for per-thread default stream
/// callers only when `per_thread`).
#[derive(Debug)]
struct Versioned {
    version: u32,
    export: &'static str,
    per_thread: bool,
}

fn table() -> &'static HashMap<&'static str, Vec<Versioned>> {
    static TABLE: OnceLock<HashMap<&'static str, Vec<Versioned>>> = OnceLock::new();
    TABLE.get_or_init(|| {
        let mut t: HashMap<&'static str, Vec<Versioned>> = HashMap::new();
        for line in include_str!("entry_versions.txt").lines() {
            let mut words = line.split_whitespace();
            let (Some(name), Some(version), Some(export)) = (words.next(), words.next(), words.next()) else {
                continue;
            };
            let Ok(version) = version.parse() else { continue };
            let per_thread = words.next() == Some("per_thread");
            t.entry(name).or_default().push(Versioned { version, export, per_thread });
        }
        t
    })
}

/// The export that answers `name` for a caller built for CUDA `version` (`cudaVersion`,
/// 1000 * major + 10 * minor), with or without the per-thread default stream. A name the
/// table does not list answers as itself, at any version.
pub fn export_for(name: &str, version: u32, per_thread: bool) -> Result<&str, SymbolStatus> {
    let Some(versions) = table().get(name) else {
        return Ok(name);
    };
    let newest =
        |pt: bool| versions.iter().filter(|v| v.per_thread == pt && v.version <= version).max_by_key(|v| v.version);
    let chosen = if per_thread { newest(true).or_else(|| newest(false)) } else { newest(false) };
    chosen.map(|v| v.export).ok_or(SymbolStatus::VersionNotSufficient)
}

/// The address of this library's export `name`, if it has one.
fn exported(name: &str) -> Option<*mut c_void> {
    if !is_driver_name(name) {
        return None;
    }
    static FOUND: OnceLock<std::sync::Mutex<HashMap<String, usize>>> = OnceLock::new();
    let found = FOUND.get_or_init(Default::default);
    if let Some(&a) = found.lock().unwrap_or_else(|p| p.into_inner()).get(name) {
        return Some(a as *mut c_void);
    }
    // Only names this library exports are kept: at most one entry per export.
    let a = own_symbol(name)?;
    found.lock().unwrap_or_else(|p| p.into_inner()).insert(name.to_string(), a as usize);
    Some(a)
}

/// A driver API name (`cu...`, not the runtime's `cuda...`), as the export table holds them.
fn is_driver_name(name: &str) -> bool {
    name.starts_with("cu")
        && !name.starts_with("cuda")
        && name.len() < 128
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// The address of this library's own definition of `name` (not one another object exports).
fn own_symbol(name: &str) -> Option<*mut c_void> {
    let handle = own_handle()?;
    let c = CString::new(name).ok()?;
    // SAFETY: `handle` is this library's handle from dlopen (it stays loaded while its code
    // runs); `c` is NUL-terminated.
    let p = unsafe { libc::dlsym(handle as *mut c_void, c.as_ptr()) };
    if p.is_null() || !is_in_this_library(p) {
        return None;
    }
    Some(p)
}

/// This library's handle, from the path the loader knows it by.
fn own_handle() -> Option<usize> {
    static HANDLE: OnceLock<Option<usize>> = OnceLock::new();
    *HANDLE.get_or_init(|| {
        let path = own_path()?;
        // SAFETY: `path` is NUL-terminated; RTLD_NOLOAD only looks up an object already loaded
        // (this one), so nothing is mapped or initialised.
        let h = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_LAZY | libc::RTLD_NOLOAD) };
        (!h.is_null()).then_some(h as usize)
    })
}

fn own_path() -> Option<CString> {
    // SAFETY: `Dl_info` is plain data; all-zero is a valid value that dladdr overwrites.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    let anchor = own_path as *const c_void;
    // SAFETY: `info` is a valid place to write; dladdr only looks `anchor` up.
    if unsafe { libc::dladdr(anchor, &mut info) } == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dladdr set `dli_fname` to the loader's NUL-terminated path of this object, which
    // lives as long as the object.
    Some(unsafe { CStr::from_ptr(info.dli_fname) }.to_owned())
}

/// Whether `p` lies in this library (the base dladdr gives for it is this library's).
fn is_in_this_library(p: *mut c_void) -> bool {
    let base = |addr: *const c_void| {
        // SAFETY: `Dl_info` is plain data; all-zero is a valid value that dladdr overwrites.
        let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
        // SAFETY: `info` is a valid place to write; dladdr only looks `addr` up.
        (unsafe { libc::dladdr(addr, &mut info) } != 0).then_some(info.dli_fbase as usize)
    };
    base(p).is_some_and(|b| Some(b) == base(own_path as *const c_void))
}

/// `cuGetProcAddress[_v2]` and the runtime's entry point calls: the address of the export that
/// answers `symbol` for `version` and `flags`, and the status CUDA 12 reports beside it. The
/// default flag (0) is the legacy default stream, as for programs built without
/// `--default-stream per-thread` (the caller cannot be asked which it was).
pub fn resolve(symbol: &str, version: u32, flags: u64) -> Result<*mut c_void, SymbolStatus> {
    let per_thread = flags & PER_THREAD_DEFAULT_STREAM != 0 && flags & LEGACY_STREAM == 0;
    let export = export_for(symbol, version, per_thread)?;
    exported(export).ok_or(SymbolStatus::SymbolNotFound)
}

/// Which export asks: they answer a name they cannot give differently.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcAddressForm {
    /// `cuGetProcAddress` (CUDA 11): `CUDA_ERROR_NOT_FOUND`, `*pfn` left as it was.
    Legacy,
    /// `cuGetProcAddress_v2` (CUDA 12 and later): `CUDA_SUCCESS` with `*pfn` NULL and the
    /// reason in `*status`, as NVIDIA's driver answers (measured with driver 580).
    WithStatus,
}

/// The driver's answer: `CUDA_SUCCESS` with the address; for a name it cannot give, what
/// `form` answers (above), `*status` (when given) saying why. A bad argument is
/// `CUDA_ERROR_INVALID_VALUE`.
///
/// # Safety
/// `symbol` must be null or a NUL-terminated string; `pfn` and `status` null or writable.
pub unsafe fn get_proc_address(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: i32,
    flags: u64,
    status: *mut i32,
    form: ProcAddressForm,
) -> Result<(), CuError> {
    if symbol.is_null() || pfn.is_null() || flags & !(LEGACY_STREAM | PER_THREAD_DEFAULT_STREAM) != 0 {
        return Err(CuError::INVALID_VALUE);
    }
    let version = u32::try_from(version).map_err(|_| CuError::INVALID_VALUE)?;
    // SAFETY: `symbol` is not null and NUL-terminated (this function's contract).
    let name = unsafe { CStr::from_ptr(symbol) }.to_str().unwrap_or("");
    let found = resolve(name, version, flags);
    let (address, answer) = match found {
        Ok(p) => (p, SymbolStatus::Success),
        Err(s) => (std::ptr::null_mut(), s),
    };
    if answer == SymbolStatus::Success || form == ProcAddressForm::WithStatus {
        // SAFETY: `pfn` is not null (checked above) and writable (this function's contract).
        unsafe { *pfn = address };
    }
    if !status.is_null() {
        // SAFETY: `status` is not null and writable (this function's contract).
        unsafe { *status = answer as i32 };
    }
    if answer == SymbolStatus::Success {
        Ok(())
    } else {
        if let Some(dropped) = phos_protocol::log_limit::GUEST_LINES.admit("cuGetProcAddress") {
            tracing::debug!(
                "cuGetProcAddress: no entry point for {name} at CUDA {version} ({answer:?}; {dropped} earlier lines dropped)"
            );
        }
        match form {
            ProcAddressForm::Legacy => Err(CuError::NOT_FOUND),
            ProcAddressForm::WithStatus => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_pick_the_export_of_their_time() {
        assert_eq!(export_for("cuMemAlloc", 2000, false), Ok("cuMemAlloc"));
        assert_eq!(export_for("cuMemAlloc", 12000, false), Ok("cuMemAlloc_v2"));
        assert_eq!(export_for("cuCtxCreate", 11040, false), Ok("cuCtxCreate_v3"));
        assert_eq!(export_for("cuStreamDestroy", 12000, false), Ok("cuStreamDestroy_v2"));
        assert_eq!(export_for("cuGetProcAddress", 12000, false), Ok("cuGetProcAddress_v2"));
        assert_eq!(export_for("cuGetProcAddress", 11080, false), Ok("cuGetProcAddress"));
    }

    #[test]
    fn per_thread_callers_get_the_per_thread_export() {
        assert_eq!(export_for("cuMemcpyHtoD", 12000, true), Ok("cuMemcpyHtoD_v2_ptds"));
        assert_eq!(export_for("cuLaunchKernel", 12000, true), Ok("cuLaunchKernel_ptsz"));
        // Functions without a per-thread form answer as for everyone.
        assert_eq!(export_for("cuMemAlloc", 12000, true), Ok("cuMemAlloc_v2"));
    }

    #[test]
    fn too_old_a_version_is_not_sufficient() {
        assert_eq!(export_for("cuMemCreate", 10000, false), Err(SymbolStatus::VersionNotSufficient));
        assert_eq!(export_for("cuMemCreate", 10020, false), Ok("cuMemCreate"));
    }

    #[test]
    fn only_driver_names_are_looked_up() {
        assert!(is_driver_name("cuMemAlloc_v2"));
        assert!(!is_driver_name("cudaMalloc"));
        assert!(!is_driver_name("malloc"));
        assert!(!is_driver_name("cu../x"));
    }
}
