//! NVIDIA's libcusparse, which a GPU backend runs cuSPARSE with, loaded at run time from where
//! [`super::vendor::find_library`] looks (`PHOS_CUSPARSE_LIB` first). The compute calls are the
//! generated ones (`crate::vendor::cusparse`); what is here is the life and settings of the
//! handles and descriptors, which the session keeps itself, and SpGEMM's two steps whose buffer
//! size is both read and written (not a shape the generated calls take).

use std::ffi::c_void;
use std::path::{Path, PathBuf};

use super::vendor::{VendorOpenError, find_library};
use crate::registry::sparse::{DnMat, DnVec, FORMAT_COO, FORMAT_CSC, SpMat};
use crate::vendor::cusparse::Library;

/// `cusparseSpMatAttribute_t`.
pub const ATTRIBUTE_FILL_MODE: i32 = 0;
pub const ATTRIBUTE_DIAG_TYPE: i32 = 1;

/// The environment variable naming the libcusparse file to load.
pub const CUSPARSE_LIB_VAR: &str = "PHOS_CUSPARSE_LIB";

/// cuSPARSE's sonames, newest first: `.12` is CUDA 12's and 13's, `.11` CUDA 11's.
const CUSPARSE_SONAMES: [&str; 2] = ["libcusparse.so.12", "libcusparse.so.11"];

type P = *mut c_void;
type CreateFn = unsafe extern "C" fn(*mut P) -> i32;
type ObjectFn = unsafe extern "C" fn(P) -> i32;
type SetPtrFn = unsafe extern "C" fn(P, P) -> i32;
type SetI32Fn = unsafe extern "C" fn(P, i32) -> i32;
type SetPtrsFn = unsafe extern "C" fn(P, P, P, P) -> i32;
type CreateCompressedFn = unsafe extern "C" fn(*mut P, i64, i64, i64, P, P, P, i32, i32, i32, i32) -> i32;
type CreateCooFn = unsafe extern "C" fn(*mut P, i64, i64, i64, P, P, P, i32, i32, i32) -> i32;
type CreateDnVecFn = unsafe extern "C" fn(*mut P, i64, P, i32) -> i32;
type CreateDnMatFn = unsafe extern "C" fn(*mut P, i64, i64, i64, P, i32, i32) -> i32;
type GetSizeFn = unsafe extern "C" fn(P, *mut i64, *mut i64, *mut i64) -> i32;
type SetAttributeFn = unsafe extern "C" fn(P, i32, *const c_void, usize) -> i32;
type SpGemmStepFn =
    unsafe extern "C" fn(P, i32, i32, *const c_void, P, P, *const c_void, P, i32, i32, P, *mut usize, P) -> i32;

/// One SpGEMM step's arguments, with the vendor's objects.
pub struct SpGemmStep {
    pub handle: u64,
    pub op_a: i32,
    pub op_b: i32,
    pub alpha: *const c_void,
    pub a: u64,
    pub b: u64,
    pub beta: *const c_void,
    pub c: u64,
    pub compute_type: i32,
    pub alg: i32,
    pub descr: u64,
    pub buffer: u64,
}

/// NVIDIA's libcusparse: the compute calls, and the object functions the session uses.
pub struct Cusparse {
    pub library: Library,
    pub path: PathBuf,
    // The object functions, from a second handle on the same file (the loader shares it).
    _objects: libloading::Library,
    create: CreateFn,
    destroy: ObjectFn,
    set_stream: SetPtrFn,
    set_pointer_mode: SetI32Fn,
    create_csr: CreateCompressedFn,
    create_csc: CreateCompressedFn,
    create_coo: CreateCooFn,
    create_dn_vec: CreateDnVecFn,
    create_dn_mat: CreateDnMatFn,
    destroy_sp_mat: ObjectFn,
    destroy_dn_vec: ObjectFn,
    destroy_dn_mat: ObjectFn,
    csr_set_pointers: SetPtrsFn,
    csc_set_pointers: SetPtrsFn,
    coo_set_pointers: SetPtrsFn,
    sp_mat_set_values: SetPtrFn,
    dn_vec_set_values: SetPtrFn,
    dn_mat_set_values: SetPtrFn,
    sp_mat_get_size: GetSizeFn,
    spgemm_create: CreateFn,
    spgemm_destroy: ObjectFn,
    spgemm_work_estimation: SpGemmStepFn,
    spgemm_compute: SpGemmStepFn,
    sp_mat_set_attribute: SetAttributeFn,
    spsv_create: CreateFn,
    spsv_destroy: ObjectFn,
}

/// A vendor status as a result.
fn status(code: i32) -> Result<(), i32> {
    if code == 0 { Ok(()) } else { Err(code) }
}

impl Cusparse {
    /// Load the first libcusparse that opens and has the object functions.
    pub fn open() -> Result<Cusparse, VendorOpenError> {
        let mut last = VendorOpenError::NotFound { library: "libcusparse", var: CUSPARSE_LIB_VAR };
        for path in find_library(CUSPARSE_LIB_VAR, "cusparse", &CUSPARSE_SONAMES) {
            match Cusparse::open_at(&path) {
                Ok(c) => return Ok(c),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    fn open_at(path: &Path) -> Result<Cusparse, VendorOpenError> {
        let err = |error| VendorOpenError::Load { path: path.to_path_buf(), error };
        // SAFETY: a file named as NVIDIA's libcusparse; loading it runs its initialisers, which
        // is what using it means.
        let library = unsafe { Library::open(path) }.map_err(err)?;
        // SAFETY: the same file again (the loader hands out the same object).
        let objects = unsafe { libloading::Library::new(path) }.map_err(err)?;
        /// An entry point of the objects' library, with its prototype from cusparse.h.
        fn get<T: Copy>(lib: &libloading::Library, name: &[u8]) -> Result<T, libloading::Error> {
            // SAFETY: the callers name each function with its prototype in cusparse.h.
            unsafe { lib.get::<T>(name) }.map(|s| *s)
        }
        let o = &objects;
        Ok(Cusparse {
            create: get(o, b"cusparseCreate\0").map_err(err)?,
            destroy: get(o, b"cusparseDestroy\0").map_err(err)?,
            set_stream: get(o, b"cusparseSetStream\0").map_err(err)?,
            set_pointer_mode: get(o, b"cusparseSetPointerMode\0").map_err(err)?,
            create_csr: get(o, b"cusparseCreateCsr\0").map_err(err)?,
            create_csc: get(o, b"cusparseCreateCsc\0").map_err(err)?,
            create_coo: get(o, b"cusparseCreateCoo\0").map_err(err)?,
            create_dn_vec: get(o, b"cusparseCreateDnVec\0").map_err(err)?,
            create_dn_mat: get(o, b"cusparseCreateDnMat\0").map_err(err)?,
            destroy_sp_mat: get(o, b"cusparseDestroySpMat\0").map_err(err)?,
            destroy_dn_vec: get(o, b"cusparseDestroyDnVec\0").map_err(err)?,
            destroy_dn_mat: get(o, b"cusparseDestroyDnMat\0").map_err(err)?,
            csr_set_pointers: get(o, b"cusparseCsrSetPointers\0").map_err(err)?,
            csc_set_pointers: get(o, b"cusparseCscSetPointers\0").map_err(err)?,
            coo_set_pointers: get(o, b"cusparseCooSetPointers\0").map_err(err)?,
            sp_mat_set_values: get(o, b"cusparseSpMatSetValues\0").map_err(err)?,
            dn_vec_set_values: get(o, b"cusparseDnVecSetValues\0").map_err(err)?,
            dn_mat_set_values: get(o, b"cusparseDnMatSetValues\0").map_err(err)?,
            sp_mat_get_size: get(o, b"cusparseSpMatGetSize\0").map_err(err)?,
            spgemm_create: get(o, b"cusparseSpGEMM_createDescr\0").map_err(err)?,
            spgemm_destroy: get(o, b"cusparseSpGEMM_destroyDescr\0").map_err(err)?,
            spgemm_work_estimation: get(o, b"cusparseSpGEMM_workEstimation\0").map_err(err)?,
            spgemm_compute: get(o, b"cusparseSpGEMM_compute\0").map_err(err)?,
            sp_mat_set_attribute: get(o, b"cusparseSpMatSetAttribute\0").map_err(err)?,
            spsv_create: get(o, b"cusparseSpSV_createDescr\0").map_err(err)?,
            spsv_destroy: get(o, b"cusparseSpSV_destroyDescr\0").map_err(err)?,
            _objects: objects,
            library,
            path: path.to_path_buf(),
        })
    }

    /// A new handle, on the context current on the calling thread.
    pub fn create(&self) -> Result<u64, i32> {
        let mut h: P = std::ptr::null_mut();
        // SAFETY: cusparseCreate writes the handle to a valid out pointer.
        status(unsafe { (self.create)(&mut h) })?;
        Ok(h as u64)
    }

    pub fn destroy(&self, handle: u64) -> i32 {
        // SAFETY: a handle `create` made and the session has not destroyed.
        unsafe { (self.destroy)(handle as P) }
    }

    /// The stream a handle's work goes on (a `CUstream`; 0 the legacy default stream).
    pub fn set_stream(&self, handle: u64, stream: u64) -> i32 {
        // SAFETY: a live handle, and a stream of the session's context (or a special one).
        unsafe { (self.set_stream)(handle as P, stream as P) }
    }

    pub fn set_pointer_mode(&self, handle: u64, mode: i32) -> i32 {
        // SAFETY: a live handle; the mode is one the dispatch checked.
        unsafe { (self.set_pointer_mode)(handle as P, mode) }
    }

    /// The vendor's descriptor of a sparse matrix the session has checked.
    pub fn create_sp_mat(&self, m: &SpMat) -> Result<u64, i32> {
        let mut d: P = std::ptr::null_mut();
        let (first, second, values) = (m.first as P, m.second as P, m.values as P);
        let (rows, cols, nnz, base, value_type) = (m.rows, m.cols, m.nnz, m.base, m.value_type);
        let (first_type, second_type) = (m.first_type, m.second_type);
        let code = match m.format {
            // SAFETY: a valid out pointer, and arrays the session checked against its memory
            // for the extents the sizes and types give.
            FORMAT_COO => unsafe {
                (self.create_coo)(&mut d, rows, cols, nnz, first, second, values, first_type, base, value_type)
            },
            // SAFETY: as above.
            FORMAT_CSC => unsafe {
                (self.create_csc)(
                    &mut d,
                    rows,
                    cols,
                    nnz,
                    first,
                    second,
                    values,
                    first_type,
                    second_type,
                    base,
                    value_type,
                )
            },
            // SAFETY: as above.
            _ => unsafe {
                (self.create_csr)(
                    &mut d,
                    rows,
                    cols,
                    nnz,
                    first,
                    second,
                    values,
                    first_type,
                    second_type,
                    base,
                    value_type,
                )
            },
        };
        status(code)?;
        // The attributes the session holds (a descriptor made again keeps them).
        let attributes = [(ATTRIBUTE_FILL_MODE, m.fill_mode), (ATTRIBUTE_DIAG_TYPE, m.diag_type)];
        for (attribute, value) in attributes.into_iter().filter(|(_, value)| *value != 0) {
            if let Err(code) = status(self.sp_mat_set_attribute(d as u64, attribute, value)) {
                self.destroy_sp_mat(d as u64);
                return Err(code);
            }
        }
        Ok(d as u64)
    }

    /// One attribute of a sparse matrix (its fill mode or diagonal type, both 4-byte enums).
    pub fn sp_mat_set_attribute(&self, d: u64, attribute: i32, value: i32) -> i32 {
        // SAFETY: a live descriptor, and a value of the 4 bytes the attribute takes.
        unsafe { (self.sp_mat_set_attribute)(d as P, attribute, (&value as *const i32).cast(), size_of::<i32>()) }
    }

    pub fn create_spsv(&self) -> Result<u64, i32> {
        let mut d: P = std::ptr::null_mut();
        // SAFETY: a valid out pointer.
        status(unsafe { (self.spsv_create)(&mut d) })?;
        Ok(d as u64)
    }

    pub fn destroy_spsv(&self, d: u64) -> i32 {
        // SAFETY: a descriptor this library made and the session has not destroyed.
        unsafe { (self.spsv_destroy)(d as P) }
    }

    pub fn create_dn_vec(&self, v: &DnVec) -> Result<u64, i32> {
        let mut d: P = std::ptr::null_mut();
        // SAFETY: a valid out pointer, and values the session checked.
        status(unsafe { (self.create_dn_vec)(&mut d, v.size, v.values as P, v.value_type) })?;
        Ok(d as u64)
    }

    pub fn create_dn_mat(&self, m: &DnMat) -> Result<u64, i32> {
        let mut d: P = std::ptr::null_mut();
        // SAFETY: a valid out pointer, and values the session checked.
        status(unsafe { (self.create_dn_mat)(&mut d, m.rows, m.cols, m.ld, m.values as P, m.value_type, m.order) })?;
        Ok(d as u64)
    }

    pub fn destroy_sp_mat(&self, d: u64) -> i32 {
        // SAFETY: a descriptor this library made and the session has not destroyed.
        unsafe { (self.destroy_sp_mat)(d as P) }
    }

    pub fn destroy_dn_vec(&self, d: u64) -> i32 {
        // SAFETY: as destroy_sp_mat.
        unsafe { (self.destroy_dn_vec)(d as P) }
    }

    pub fn destroy_dn_mat(&self, d: u64) -> i32 {
        // SAFETY: as destroy_sp_mat.
        unsafe { (self.destroy_dn_mat)(d as P) }
    }

    /// A sparse matrix's three arrays (its format's setter).
    pub fn set_pointers(&self, m: &SpMat) -> i32 {
        let f = match m.format {
            FORMAT_COO => self.coo_set_pointers,
            FORMAT_CSC => self.csc_set_pointers,
            _ => self.csr_set_pointers,
        };
        // SAFETY: a live descriptor, and arrays the session checked for its sizes.
        unsafe { f(m.raw as P, m.first as P, m.second as P, m.values as P) }
    }

    pub fn sp_mat_set_values(&self, d: u64, values: u64) -> i32 {
        // SAFETY: a live descriptor, and values the session checked for its sizes.
        unsafe { (self.sp_mat_set_values)(d as P, values as P) }
    }

    pub fn dn_vec_set_values(&self, d: u64, values: u64) -> i32 {
        // SAFETY: as sp_mat_set_values.
        unsafe { (self.dn_vec_set_values)(d as P, values as P) }
    }

    pub fn dn_mat_set_values(&self, d: u64, values: u64) -> i32 {
        // SAFETY: as sp_mat_set_values.
        unsafe { (self.dn_mat_set_values)(d as P, values as P) }
    }

    /// A sparse matrix's size as the library holds it (SpGEMM and dense-to-sparse change nnz).
    pub fn sp_mat_size(&self, d: u64) -> Result<(i64, i64, i64), i32> {
        let (mut rows, mut cols, mut nnz) = (0i64, 0i64, 0i64);
        // SAFETY: a live descriptor and three valid out pointers.
        status(unsafe { (self.sp_mat_get_size)(d as P, &mut rows, &mut cols, &mut nnz) })?;
        Ok((rows, cols, nnz))
    }

    pub fn create_spgemm(&self) -> Result<u64, i32> {
        let mut d: P = std::ptr::null_mut();
        // SAFETY: a valid out pointer.
        status(unsafe { (self.spgemm_create)(&mut d) })?;
        Ok(d as u64)
    }

    pub fn destroy_spgemm(&self, d: u64) -> i32 {
        // SAFETY: a descriptor this library made and the session has not destroyed.
        unsafe { (self.spgemm_destroy)(d as P) }
    }

    /// SpGEMM's work estimation (`compute` false) or compute step; the buffer size in and out.
    ///
    /// # Safety
    /// The objects are live vendor objects, the scalars point at values of the compute type
    /// (host or device as the handle's pointer mode says), and a non-null buffer is the
    /// session's memory for `*size` bytes.
    pub unsafe fn spgemm_step(&self, compute: bool, s: &SpGemmStep, size: &mut usize) -> i32 {
        let f = if compute { self.spgemm_compute } else { self.spgemm_work_estimation };
        // SAFETY: this function's contract.
        unsafe {
            f(
                s.handle as P,
                s.op_a,
                s.op_b,
                s.alpha,
                s.a as P,
                s.b as P,
                s.beta,
                s.c as P,
                s.compute_type,
                s.alg,
                s.descr as P,
                size,
                s.buffer as P,
            )
        }
    }
}
