//! NVIDIA's libcublasLt, which a GPU backend runs cuBLASLt with, loaded at run time from where
//! [`super::vendor::find_library`] looks (`PHOS_CUBLASLT_LIB`, the wheels' `nvidia/cu13/lib`
//! and `nvidia/cublas/lib`, the loader's search, `/usr/local/cuda/lib64`). The compute calls and
//! attribute settings are the generated ones (`crate::vendor::cublaslt`); what is here is the
//! life of handles and descriptors, and the heuristic query, whose results array the service
//! passes through as it is.

use std::ffi::c_void;
use std::path::{Path, PathBuf};

use super::vendor::{VendorOpenError, find_library};
use crate::registry::lt::DescKind;
use crate::vendor::cublaslt::Library;

/// The environment variable naming the libcublasLt file to load.
pub const CUBLASLT_LIB_VAR: &str = "PHOS_CUBLASLT_LIB";

/// cuBLASLt's sonames, newest first.
const CUBLASLT_SONAMES: [&str; 3] = ["libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so.11"];

type CreateFn = unsafe extern "C" fn(*mut *mut c_void) -> i32;
type DestroyFn = unsafe extern "C" fn(*mut c_void) -> i32;
type MatmulDescCreateFn = unsafe extern "C" fn(*mut *mut c_void, i32, i32) -> i32;
type LayoutCreateFn = unsafe extern "C" fn(*mut *mut c_void, i32, u64, u64, i64) -> i32;
type TransformDescCreateFn = unsafe extern "C" fn(*mut *mut c_void, i32) -> i32;
type HeuristicFn = unsafe extern "C" fn(
    *mut c_void,
    *mut c_void,
    *mut c_void,
    *mut c_void,
    *mut c_void,
    *mut c_void,
    *mut c_void,
    i32,
    *mut c_void,
    *mut i32,
) -> i32;

/// NVIDIA's libcublasLt: the generated calls, and the object functions the session uses.
pub struct CublasLt {
    pub library: Library,
    pub path: PathBuf,
    // The object functions, from a second handle on the same file (the loader shares it).
    _objects: libloading::Library,
    create: CreateFn,
    destroy: DestroyFn,
    matmul_desc_create: MatmulDescCreateFn,
    matmul_desc_destroy: DestroyFn,
    layout_create: LayoutCreateFn,
    layout_destroy: DestroyFn,
    preference_create: CreateFn,
    preference_destroy: DestroyFn,
    transform_desc_create: TransformDescCreateFn,
    transform_desc_destroy: DestroyFn,
    heuristic: HeuristicFn,
}

/// How a descriptor is made: the arguments of its kind's `Create`.
#[derive(Debug, Clone, Copy)]
pub enum Creation {
    Matmul { compute_type: i32, scale_type: i32 },
    Layout { data_type: i32, rows: u64, cols: u64, ld: i64 },
    Preference,
    Transform { scale_type: i32 },
}

impl CublasLt {
    /// Load the first libcublasLt that opens and has the object functions.
    pub fn open() -> Result<CublasLt, VendorOpenError> {
        let mut last = VendorOpenError::NotFound { library: "libcublasLt", var: CUBLASLT_LIB_VAR };
        for path in find_library(CUBLASLT_LIB_VAR, "cublas", &CUBLASLT_SONAMES) {
            match CublasLt::open_at(&path) {
                Ok(c) => return Ok(c),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    fn open_at(path: &Path) -> Result<CublasLt, VendorOpenError> {
        let err = |error| VendorOpenError::Load { path: path.to_path_buf(), error };
        // SAFETY: a file named as NVIDIA's libcublasLt; loading it runs its initialisers,
        // which is what using it means.
        let library = unsafe { Library::open(path) }.map_err(err)?;
        // SAFETY: the same file again (the loader hands out the same object).
        let objects = unsafe { libloading::Library::new(path) }.map_err(err)?;
        /// An entry point of the objects' library, with its prototype from cublasLt.h.
        fn get<T: Copy>(lib: &libloading::Library, name: &[u8]) -> Result<T, libloading::Error> {
            // SAFETY: the callers name each function with its prototype in cublasLt.h.
            unsafe { lib.get::<T>(name) }.map(|s| *s)
        }
        Ok(CublasLt {
            create: get(&objects, b"cublasLtCreate\0").map_err(err)?,
            destroy: get(&objects, b"cublasLtDestroy\0").map_err(err)?,
            matmul_desc_create: get(&objects, b"cublasLtMatmulDescCreate\0").map_err(err)?,
            matmul_desc_destroy: get(&objects, b"cublasLtMatmulDescDestroy\0").map_err(err)?,
            layout_create: get(&objects, b"cublasLtMatrixLayoutCreate\0").map_err(err)?,
            layout_destroy: get(&objects, b"cublasLtMatrixLayoutDestroy\0").map_err(err)?,
            preference_create: get(&objects, b"cublasLtMatmulPreferenceCreate\0").map_err(err)?,
            preference_destroy: get(&objects, b"cublasLtMatmulPreferenceDestroy\0").map_err(err)?,
            transform_desc_create: get(&objects, b"cublasLtMatrixTransformDescCreate\0").map_err(err)?,
            transform_desc_destroy: get(&objects, b"cublasLtMatrixTransformDescDestroy\0").map_err(err)?,
            heuristic: get(&objects, b"cublasLtMatmulAlgoGetHeuristic\0").map_err(err)?,
            _objects: objects,
            library,
            path: path.to_path_buf(),
        })
    }

    /// A new handle, on the context current on the calling thread.
    pub fn create(&self) -> Result<u64, i32> {
        let mut h: *mut c_void = std::ptr::null_mut();
        // SAFETY: cublasLtCreate writes the handle to a valid out pointer.
        let code = unsafe { (self.create)(&mut h) };
        if code == 0 { Ok(h as u64) } else { Err(code) }
    }

    pub fn destroy(&self, handle: u64) -> i32 {
        // SAFETY: a handle `create` made and the session has not destroyed.
        unsafe { (self.destroy)(handle as *mut c_void) }
    }

    /// A new descriptor of the vendor's.
    pub fn create_descriptor(&self, how: Creation) -> Result<u64, i32> {
        let mut d: *mut c_void = std::ptr::null_mut();
        let started = phos_protocol::call_profile::start();
        // SAFETY (each call): the create writes the descriptor to a valid out pointer; the
        // other arguments are values cuBLASLt checks itself.
        let code = match how {
            Creation::Matmul { compute_type, scale_type } => {
                // SAFETY: as above.
                unsafe { (self.matmul_desc_create)(&mut d, compute_type, scale_type) }
            }
            // SAFETY: as above.
            Creation::Layout { data_type, rows, cols, ld } => unsafe {
                (self.layout_create)(&mut d, data_type, rows, cols, ld)
            },
            // SAFETY: as above.
            Creation::Preference => unsafe { (self.preference_create)(&mut d) },
            // SAFETY: as above.
            Creation::Transform { scale_type } => unsafe { (self.transform_desc_create)(&mut d, scale_type) },
        };
        phos_protocol::call_profile::vendor_ended(started);
        if code == 0 { Ok(d as u64) } else { Err(code) }
    }

    pub fn destroy_descriptor(&self, kind: DescKind, raw: u64) -> i32 {
        let f = match kind {
            DescKind::Matmul => self.matmul_desc_destroy,
            DescKind::Layout => self.layout_destroy,
            DescKind::Preference => self.preference_destroy,
            DescKind::Transform => self.transform_desc_destroy,
        };
        // SAFETY: a descriptor of this kind that `create_descriptor` made and the session has
        // not destroyed.
        crate::backend::vendor::in_library(|| unsafe { f(raw as *mut c_void) })
    }

    /// The heuristic query on the vendor's objects (`raw`: handle, matmul descriptor, the four
    /// layouts, the preference), into `results` (`count` entries of 96 bytes).
    pub fn heuristic(&self, raw: [u64; 7], count: i32, results: &mut [u8]) -> Result<i32, i32> {
        if results.len() < usize::try_from(count).unwrap_or(usize::MAX).saturating_mul(96) {
            return Err(7);
        }
        let mut returned = 0i32;
        let p = |v: u64| v as *mut c_void;
        // SAFETY: live vendor objects, and a results buffer of `count` entries (checked above).
        let code = unsafe {
            (self.heuristic)(
                p(raw[0]),
                p(raw[1]),
                p(raw[2]),
                p(raw[3]),
                p(raw[4]),
                p(raw[5]),
                p(raw[6]),
                count,
                results.as_mut_ptr().cast(),
                &mut returned,
            )
        };
        if code == 0 { Ok(returned) } else { Err(code) }
    }
}
