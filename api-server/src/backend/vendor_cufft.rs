//! NVIDIA's libcufft, which a GPU backend runs cuFFT with, loaded at run time from where
//! [`find_cufft`] looks. The transforms and the plain size queries are the generated calls
//! (`crate::vendor::cufft`); what is here is the plans' life, layout and settings, which the
//! session keeps itself, and the queries that take embeddings (NULL where the program's were).

use std::ffi::c_void;
use std::path::{Path, PathBuf};

use crate::cpu_fft::{Layout, Side};
use crate::vendor::cufft::Library;

/// The environment variable naming the libcufft file to load.
pub const CUFFT_LIB_VAR: &str = "PHOS_CUFFT_LIB";

/// cuFFT's sonames, newest first: CUDA 13's, 12's and 11's.
const CUFFT_SONAMES: [&str; 3] = ["libcufft.so.12", "libcufft.so.11", "libcufft.so.10"];

type CreateFn = unsafe extern "C" fn(*mut i32) -> i32;
type PlanFn = unsafe extern "C" fn(i32) -> i32;
type SetIntFn = unsafe extern "C" fn(i32, i32) -> i32;
type SetPtrFn = unsafe extern "C" fn(i32, *mut c_void) -> i32;
/// cufftMakePlanMany64 and cufftGetSizeMany64.
type Many64Fn =
    unsafe extern "C" fn(i32, i32, *mut i64, *mut i64, i64, i64, *mut i64, i64, i64, i32, i64, *mut usize) -> i32;
/// cufftEstimateMany.
type EstimateManyFn =
    unsafe extern "C" fn(i32, *mut i32, *mut i32, i32, i32, *mut i32, i32, i32, i32, i32, *mut usize) -> i32;

/// NVIDIA's libcufft: the generated calls, and the plan functions the session uses.
pub struct Cufft {
    pub library: Library,
    pub path: PathBuf,
    // The plan functions, from a second handle on the same file (the loader shares it).
    _plans: libloading::Library,
    create: CreateFn,
    destroy: PlanFn,
    set_auto_allocation: SetIntFn,
    make_plan_many64: Many64Fn,
    get_size_many64: Many64Fn,
    estimate_many: EstimateManyFn,
    set_stream: SetPtrFn,
    set_work_area: SetPtrFn,
}

/// Why libcufft could not be used.
#[derive(Debug, thiserror::Error)]
pub enum CufftOpenError {
    #[error("no libcufft found ({CUFFT_LIB_VAR}, Python's nvidia/*/lib, the loader's paths, /usr/local/cuda)")]
    NotFound,
    #[error("{path}: {error}")]
    Load { path: PathBuf, error: libloading::Error },
}

/// Where libcufft is looked for, in order: the file `PHOS_CUFFT_LIB` names; the wheels of
/// Python's site directories (`nvidia/cufft/lib`, `nvidia/cu13/lib`); the loader's own search
/// by soname (its cache, `LD_LIBRARY_PATH`); `/usr/local/cuda/lib64`.
pub fn find_cufft() -> Vec<PathBuf> {
    super::vendor::find_library(CUFFT_LIB_VAR, "cufft", &CUFFT_SONAMES)
}

/// A side's embedding as the 64-bit calls take it (NULL for the basic layout).
fn embed_ptr(side: &Side, storage: &mut Vec<i64>) -> *mut i64 {
    match &side.embed {
        Some(e) => {
            *storage = e.iter().map(|&x| x as i64).collect();
            storage.as_mut_ptr()
        }
        None => std::ptr::null_mut(),
    }
}

impl Cufft {
    /// Load the first libcufft of [`find_cufft`] that opens and has the plan functions.
    pub fn open() -> Result<Cufft, CufftOpenError> {
        let mut last = CufftOpenError::NotFound;
        for path in find_cufft() {
            match Cufft::open_at(&path) {
                Ok(c) => return Ok(c),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    fn open_at(path: &Path) -> Result<Cufft, CufftOpenError> {
        let err = |error| CufftOpenError::Load { path: path.to_path_buf(), error };
        // SAFETY: a file named as NVIDIA's libcufft; loading it runs its initialisers, which
        // is what using it means.
        let library = unsafe { Library::open(path) }.map_err(err)?;
        // SAFETY: the same file as the line before: the loader hands out the object already
        // loaded, whose initialisers have run.
        let plans = unsafe { libloading::Library::new(path) }.map_err(err)?;
        /// An entry point of the plans' library, with its prototype from cufft.h.
        fn get<T: Copy>(lib: &libloading::Library, name: &[u8]) -> Result<T, libloading::Error> {
            // SAFETY: the callers name each function with its prototype in cufft.h.
            unsafe { lib.get::<T>(name) }.map(|s| *s)
        }
        Ok(Cufft {
            create: get(&plans, b"cufftCreate\0").map_err(err)?,
            destroy: get(&plans, b"cufftDestroy\0").map_err(err)?,
            set_auto_allocation: get(&plans, b"cufftSetAutoAllocation\0").map_err(err)?,
            make_plan_many64: get(&plans, b"cufftMakePlanMany64\0").map_err(err)?,
            get_size_many64: get(&plans, b"cufftGetSizeMany64\0").map_err(err)?,
            estimate_many: get(&plans, b"cufftEstimateMany\0").map_err(err)?,
            set_stream: get(&plans, b"cufftSetStream\0").map_err(err)?,
            set_work_area: get(&plans, b"cufftSetWorkArea\0").map_err(err)?,
            _plans: plans,
            library,
            path: path.to_path_buf(),
        })
    }

    /// A new, empty plan on the context current on the calling thread; cuFFT's status when
    /// it refuses.
    pub fn create(&self) -> Result<i32, i32> {
        let mut plan = 0i32;
        // SAFETY: cufftCreate writes the plan to a valid out pointer.
        let code = unsafe { (self.create)(&mut plan) };
        if code == 0 { Ok(plan) } else { Err(code) }
    }

    pub fn destroy(&self, plan: i32) -> i32 {
        // SAFETY: a plan `create` made and the session has not destroyed.
        unsafe { (self.destroy)(plan) }
    }

    pub fn set_auto_allocation(&self, plan: i32, auto: bool) -> i32 {
        // SAFETY: a live plan of this library (the registry's).
        unsafe { (self.set_auto_allocation)(plan, i32::from(auto)) }
    }

    /// Make `plan` for `layout` (every plan call is a case of cufftMakePlanMany64): its work
    /// size, or cuFFT's status.
    pub fn make_plan(&self, plan: i32, layout: &Layout) -> Result<u64, i32> {
        self.many64(self.make_plan_many64, plan, layout)
    }

    /// The work size a plan of `layout` would take (cufftGetSize* on `plan`).
    pub fn plan_size(&self, plan: i32, layout: &Layout) -> Result<u64, i32> {
        self.many64(self.get_size_many64, plan, layout)
    }

    fn many64(&self, f: Many64Fn, plan: i32, layout: &Layout) -> Result<u64, i32> {
        let mut n: Vec<i64> = layout.n.iter().map(|&x| x as i64).collect();
        let (mut inembed, mut onembed) = (Vec::new(), Vec::new());
        let ip = embed_ptr(&layout.input, &mut inembed);
        let op = embed_ptr(&layout.output, &mut onembed);
        let mut work = 0usize;
        // SAFETY: a live plan; `n` has rank entries, each embedding rank entries or is NULL
        // (the Layout's invariants), and `work` is a valid out pointer.
        let code = unsafe {
            f(
                plan,
                n.len() as i32,
                n.as_mut_ptr(),
                ip,
                layout.input.stride as i64,
                layout.input.dist as i64,
                op,
                layout.output.stride as i64,
                layout.output.dist as i64,
                layout.fft_type.code(),
                layout.batch as i64,
                &mut work,
            )
        };
        if code == 0 { Ok(work as u64) } else { Err(code) }
    }

    /// cufftEstimateMany for `layout`, whose numbers the 32-bit call must hold
    /// (`CUFFT_INVALID_SIZE` otherwise).
    pub fn estimate(&self, layout: &Layout) -> Result<u64, i32> {
        const INVALID_SIZE: i32 = 8;
        let int = |x: u64| i32::try_from(x).map_err(|_| INVALID_SIZE);
        let ints = |v: &[u64]| v.iter().map(|&x| int(x)).collect::<Result<Vec<i32>, i32>>();
        let mut n = ints(&layout.n)?;
        let mut inembed = layout.input.embed.as_deref().map(ints).transpose()?;
        let mut onembed = layout.output.embed.as_deref().map(ints).transpose()?;
        let ptr = |e: &mut Option<Vec<i32>>| e.as_mut().map_or(std::ptr::null_mut(), |v| v.as_mut_ptr());
        let (ip, op) = (ptr(&mut inembed), ptr(&mut onembed));
        let mut work = 0usize;
        // SAFETY: `n` has rank entries, each embedding rank entries or is NULL, and `work` is a
        // valid out pointer.
        let code = unsafe {
            (self.estimate_many)(
                n.len() as i32,
                n.as_mut_ptr(),
                ip,
                int(layout.input.stride)?,
                int(layout.input.dist)?,
                op,
                int(layout.output.stride)?,
                int(layout.output.dist)?,
                layout.fft_type.code(),
                int(layout.batch)?,
                &mut work,
            )
        };
        if code == 0 { Ok(work as u64) } else { Err(code) }
    }

    /// The stream a plan's work goes on (a `CUstream`; 0 the legacy default stream).
    pub fn set_stream(&self, plan: i32, stream: u64) -> i32 {
        // SAFETY: a live plan, and a stream of the session's context (or a special one).
        unsafe { (self.set_stream)(plan, stream as *mut c_void) }
    }

    /// The work area a plan uses (the session's memory, checked for the plan's work size).
    pub fn set_work_area(&self, plan: i32, area: u64) -> i32 {
        // SAFETY: a live plan, and device memory of the session's that holds its work size.
        unsafe { (self.set_work_area)(plan, area as *mut c_void) }
    }
}
