//! NVIDIA's libraries that a GPU backend runs library APIs with, loaded at run time: for
//! cuBLAS, `libcublas`, found where [`find_cublas`] looks; for cuSOLVER, `libcusolver`, looked
//! for the same way ([`find_library`]). The compute calls are the generated ones
//! (`crate::vendor::cublas`, `crate::vendor::cusolver`); what is here is the handles' life and
//! settings, which the session keeps itself.

use std::ffi::c_void;
use std::path::{Path, PathBuf};

use crate::vendor::cublas::Library;

/// Run a call of NVIDIA's library, its time counted as the library's in the `PHOS_PROFILE`
/// table (the server's own share of a call is the rest).
pub(crate) fn in_library<T>(call: impl FnOnce() -> T) -> T {
    let started = phos_protocol::call_profile::start();
    let r = call();
    phos_protocol::call_profile::vendor_ended(started);
    r
}

/// The environment variable naming the libcublas file to load.
pub const CUBLAS_LIB_VAR: &str = "PHOS_CUBLAS_LIB";

/// cuBLAS's sonames, newest first (a newer cuBLAS runs on the drivers an older one needs).
const CUBLAS_SONAMES: [&str; 3] = ["libcublas.so.13", "libcublas.so.12", "libcublas.so.11"];

type CreateFn = unsafe extern "C" fn(*mut *mut c_void) -> i32;
type HandleFn = unsafe extern "C" fn(*mut c_void) -> i32;
type SetPtrFn = unsafe extern "C" fn(*mut c_void, *mut c_void) -> i32;
type SetIntFn = unsafe extern "C" fn(*mut c_void, i32) -> i32;
type SetWorkspaceFn = unsafe extern "C" fn(*mut c_void, *mut c_void, usize) -> i32;

/// NVIDIA's libcublas: the compute calls, and the handle functions the session uses.
pub struct Cublas {
    pub library: Library,
    pub path: PathBuf,
    // The handle functions, from a second handle on the same file (the loader shares it).
    _handles: libloading::Library,
    create: CreateFn,
    destroy: HandleFn,
    set_stream: SetPtrFn,
    set_pointer_mode: SetIntFn,
    set_math_mode: SetIntFn,
    set_atomics_mode: SetIntFn,
    set_workspace: Option<SetWorkspaceFn>,
}

/// Why libcublas could not be used.
#[derive(Debug, thiserror::Error)]
pub enum CublasOpenError {
    #[error("no libcublas found ({CUBLAS_LIB_VAR}, Python's nvidia/*/lib, the loader's paths, /usr/local/cuda)")]
    NotFound,
    #[error("{path}: {error}")]
    Load { path: PathBuf, error: libloading::Error },
}

/// Where libcublas is looked for, in order: the file `PHOS_CUBLAS_LIB` names; the wheels of
/// Python's site directories (`nvidia/cublas/lib`, `nvidia/cu13/lib`); the loader's own search
/// by soname (its cache, `LD_LIBRARY_PATH`); `/usr/local/cuda/lib64`.
pub fn find_cublas() -> Vec<PathBuf> {
    find_library(CUBLAS_LIB_VAR, "cublas", &CUBLAS_SONAMES)
}

/// Where a vendor library is looked for, in order: the file the environment variable `var`
/// names; the wheels of Python's site directories (`nvidia/<wheel>/lib`, `nvidia/cu13/lib`);
/// the loader's own search by soname (its cache, `LD_LIBRARY_PATH`); `/usr/local/cuda/lib64`.
pub fn find_library(var: &str, wheel: &str, sonames: &[&str]) -> Vec<PathBuf> {
    let mut candidates = Vec::new();
    if let Some(p) = std::env::var_os(var) {
        candidates.push(PathBuf::from(p));
    }
    for site in python_site_dirs() {
        for sub in ["nvidia/cu13/lib".to_string(), format!("nvidia/{wheel}/lib")] {
            for soname in sonames {
                let p = site.join(&sub).join(soname);
                if p.exists() {
                    candidates.push(p);
                }
            }
        }
    }
    // Bare sonames: the loader searches its cache and LD_LIBRARY_PATH.
    candidates.extend(sonames.iter().map(PathBuf::from));
    candidates.extend(sonames.iter().map(|s| Path::new("/usr/local/cuda/lib64").join(s)));
    candidates
}

/// Python's site directories where pip puts NVIDIA's wheels: the virtual environment's, the
/// user's and the system's, for every Python 3 present.
pub(super) fn python_site_dirs() -> Vec<PathBuf> {
    let mut roots: Vec<PathBuf> = Vec::new();
    if let Some(venv) = std::env::var_os("VIRTUAL_ENV") {
        roots.push(PathBuf::from(venv).join("lib"));
    }
    if let Some(home) = std::env::var_os("HOME") {
        roots.push(PathBuf::from(home).join(".local/lib"));
    }
    roots.extend(["/usr/lib", "/usr/local/lib", "/opt/conda/lib"].map(PathBuf::from));
    let mut sites = Vec::new();
    for root in roots {
        let Ok(entries) = std::fs::read_dir(&root) else { continue };
        for entry in entries.flatten() {
            if entry.file_name().to_string_lossy().starts_with("python3") {
                for kind in ["site-packages", "dist-packages"] {
                    let dir = entry.path().join(kind);
                    if dir.is_dir() {
                        sites.push(dir);
                    }
                }
            }
        }
    }
    sites
}

impl Cublas {
    /// Load the first libcublas of [`find_cublas`] that opens and has the handle functions.
    pub fn open() -> Result<Cublas, CublasOpenError> {
        let mut last = CublasOpenError::NotFound;
        for path in find_cublas() {
            match Cublas::open_at(&path) {
                Ok(c) => return Ok(c),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    fn open_at(path: &Path) -> Result<Cublas, CublasOpenError> {
        let err = |error| CublasOpenError::Load { path: path.to_path_buf(), error };
        // SAFETY: a file named as NVIDIA's libcublas; loading it runs its initialisers,
        // which is what using it means.
        let library = unsafe { Library::open(path) }.map_err(err)?;
        // SAFETY: the same file as the line before: the loader hands out the object already
        // loaded, whose initialisers have run.
        let handles = unsafe { libloading::Library::new(path) }.map_err(err)?;
        /// An entry point of the handles' library, with its prototype from cublas_api.h.
        fn get<T: Copy>(lib: &libloading::Library, name: &[u8]) -> Result<T, libloading::Error> {
            // SAFETY: the callers name each function with its prototype in cublas_api.h.
            unsafe { lib.get::<T>(name) }.map(|s| *s)
        }
        Ok(Cublas {
            create: get(&handles, b"cublasCreate_v2\0").map_err(err)?,
            destroy: get(&handles, b"cublasDestroy_v2\0").map_err(err)?,
            set_stream: get(&handles, b"cublasSetStream_v2\0").map_err(err)?,
            set_pointer_mode: get(&handles, b"cublasSetPointerMode_v2\0").map_err(err)?,
            set_math_mode: get(&handles, b"cublasSetMathMode\0").map_err(err)?,
            set_atomics_mode: get(&handles, b"cublasSetAtomicsMode\0").map_err(err)?,
            set_workspace: get(&handles, b"cublasSetWorkspace_v2\0").ok(),
            _handles: handles,
            library,
            path: path.to_path_buf(),
        })
    }

    /// A new handle, on the context current on the calling thread.
    pub fn create(&self) -> Result<u64, i32> {
        let mut h: *mut c_void = std::ptr::null_mut();
        // SAFETY: cublasCreate_v2 writes the handle to a valid out pointer.
        let code = unsafe { (self.create)(&mut h) };
        if code == 0 { Ok(h as u64) } else { Err(code) }
    }

    pub fn destroy(&self, handle: u64) -> i32 {
        // SAFETY: a handle `create` made and the session has not destroyed.
        unsafe { (self.destroy)(handle as *mut c_void) }
    }

    /// The stream a handle's work goes on (a `CUstream`; 0 the legacy default stream).
    pub fn set_stream(&self, handle: u64, stream: u64) -> i32 {
        // SAFETY: a live handle, and a stream of the session's context (or a special one).
        in_library(|| unsafe { (self.set_stream)(handle as *mut c_void, stream as *mut c_void) })
    }

    pub fn set_pointer_mode(&self, handle: u64, mode: i32) -> i32 {
        // SAFETY: a live handle; cuBLAS checks the value.
        unsafe { (self.set_pointer_mode)(handle as *mut c_void, mode) }
    }

    pub fn set_math_mode(&self, handle: u64, mode: i32) -> i32 {
        // SAFETY: a live handle of this library (the registry's); cuBLAS checks the mode's value.
        in_library(|| unsafe { (self.set_math_mode)(handle as *mut c_void, mode) })
    }

    pub fn set_atomics_mode(&self, handle: u64, mode: i32) -> i32 {
        // SAFETY: a live handle of this library (the registry's); cuBLAS checks the mode's value.
        unsafe { (self.set_atomics_mode)(handle as *mut c_void, mode) }
    }

    /// Give a handle a workspace of the session's device memory (checked by the dispatch);
    /// `NOT_SUPPORTED` (15) from a cuBLAS without the function (before 11.x).
    pub fn set_workspace(&self, handle: u64, addr: u64, bytes: u64) -> i32 {
        let Some(f) = self.set_workspace else { return 15 };
        // SAFETY: a live handle and `[addr, addr + bytes)` of the session's device memory.
        in_library(|| unsafe { f(handle as *mut c_void, addr as *mut c_void, bytes as usize) })
    }
}

/// The environment variable naming the libcusolver file to load.
pub const CUSOLVER_LIB_VAR: &str = "PHOS_CUSOLVER_LIB";

/// cuSOLVER's sonames, newest first: `.12` is CUDA 13's, `.11` CUDA 11's and 12's.
const CUSOLVER_SONAMES: [&str; 2] = ["libcusolver.so.12", "libcusolver.so.11"];

/// Why a vendor library other than cuBLAS could not be used.
#[derive(Debug, thiserror::Error)]
pub enum VendorOpenError {
    #[error("no {library} found ({var}, Python's nvidia/*/lib, the loader's paths, /usr/local/cuda)")]
    NotFound { library: &'static str, var: &'static str },
    #[error("{path}: {error}")]
    Load { path: PathBuf, error: libloading::Error },
}

/// NVIDIA's libcusolver (the dense API): the compute calls, and the handle functions the
/// session uses.
pub struct Cusolver {
    pub library: crate::vendor::cusolver::Library,
    pub path: PathBuf,
    _handles: libloading::Library,
    create: CreateFn,
    destroy: HandleFn,
    set_stream: SetPtrFn,
}

impl Cusolver {
    /// Load the first libcusolver of [`find_library`] that opens and has the handle functions.
    pub fn open() -> Result<Cusolver, VendorOpenError> {
        let mut last = VendorOpenError::NotFound { library: "libcusolver", var: CUSOLVER_LIB_VAR };
        for path in find_library(CUSOLVER_LIB_VAR, "cusolver", &CUSOLVER_SONAMES) {
            match Cusolver::open_at(&path) {
                Ok(c) => return Ok(c),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    fn open_at(path: &Path) -> Result<Cusolver, VendorOpenError> {
        let err = |error| VendorOpenError::Load { path: path.to_path_buf(), error };
        // SAFETY: a file named as NVIDIA's libcusolver; loading it runs its initialisers,
        // which is what using it means.
        let library = unsafe { crate::vendor::cusolver::Library::open(path) }.map_err(err)?;
        // SAFETY: the same file again (the loader hands out the same object).
        let handles = unsafe { libloading::Library::new(path) }.map_err(err)?;
        /// An entry point of the handles' library, with its prototype from cusolverDn.h.
        fn get<T: Copy>(lib: &libloading::Library, name: &[u8]) -> Result<T, libloading::Error> {
            // SAFETY: the callers name each function with its prototype in cusolverDn.h.
            unsafe { lib.get::<T>(name) }.map(|s| *s)
        }
        Ok(Cusolver {
            create: get(&handles, b"cusolverDnCreate\0").map_err(err)?,
            destroy: get(&handles, b"cusolverDnDestroy\0").map_err(err)?,
            set_stream: get(&handles, b"cusolverDnSetStream\0").map_err(err)?,
            _handles: handles,
            library,
            path: path.to_path_buf(),
        })
    }

    /// A new handle, on the context current on the calling thread.
    pub fn create(&self) -> Result<u64, i32> {
        let mut h: *mut c_void = std::ptr::null_mut();
        // SAFETY: cusolverDnCreate writes the handle to a valid out pointer.
        let code = unsafe { (self.create)(&mut h) };
        if code == 0 { Ok(h as u64) } else { Err(code) }
    }

    pub fn destroy(&self, handle: u64) -> i32 {
        // SAFETY: a handle `create` made and the session has not destroyed.
        unsafe { (self.destroy)(handle as *mut c_void) }
    }

    /// The stream a handle's work goes on (a `CUstream`; 0 the legacy default stream).
    pub fn set_stream(&self, handle: u64, stream: u64) -> i32 {
        // SAFETY: a live handle, and a stream of the session's context (or a special one).
        in_library(|| unsafe { (self.set_stream)(handle as *mut c_void, stream as *mut c_void) })
    }
}
