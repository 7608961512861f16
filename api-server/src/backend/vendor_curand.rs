//! NVIDIA's libcurand, which a GPU backend runs cuRAND's host API with, loaded at run time from
//! where [`find_curand`] looks. The generation calls are the generated ones
//! (`crate::vendor::curand`); what is here is the generators' life and settings, which the
//! session keeps itself.

use std::ffi::c_void;
use std::path::{Path, PathBuf};

use crate::vendor::curand::Library;

/// The environment variable naming the libcurand file to load.
pub const CURAND_LIB_VAR: &str = "PHOS_CURAND_LIB";

/// cuRAND's soname (the same in CUDA 11, 12 and 13).
const CURAND_SONAME: &str = "libcurand.so.10";

type CreateFn = unsafe extern "C" fn(*mut *mut c_void, i32) -> i32;
type GeneratorFn = unsafe extern "C" fn(*mut c_void) -> i32;
type SetPtrFn = unsafe extern "C" fn(*mut c_void, *mut c_void) -> i32;
type SetU64Fn = unsafe extern "C" fn(*mut c_void, u64) -> i32;
type SetI32Fn = unsafe extern "C" fn(*mut c_void, i32) -> i32;
type SetU32Fn = unsafe extern "C" fn(*mut c_void, u32) -> i32;

/// NVIDIA's libcurand: the generation calls, and the generator functions the session uses.
pub struct Curand {
    pub library: Library,
    pub path: PathBuf,
    // The generator functions, from a second handle on the same file (the loader shares it).
    _generators: libloading::Library,
    create: CreateFn,
    create_host: CreateFn,
    destroy: GeneratorFn,
    set_stream: SetPtrFn,
    set_seed: SetU64Fn,
    set_offset: SetU64Fn,
    set_ordering: SetI32Fn,
    set_dimensions: SetU32Fn,
    generate_seeds: GeneratorFn,
}

/// Why libcurand could not be used.
#[derive(Debug, thiserror::Error)]
pub enum CurandOpenError {
    #[error("no libcurand found ({CURAND_LIB_VAR}, Python's nvidia/*/lib, the loader's paths, /usr/local/cuda)")]
    NotFound,
    #[error("{path}: {error}")]
    Load { path: PathBuf, error: libloading::Error },
}

/// Where libcurand is looked for, in order: the file `PHOS_CURAND_LIB` names; the wheels of
/// Python's site directories (`nvidia/curand/lib`, `nvidia/cu13/lib`); the loader's own search
/// by soname (its cache, `LD_LIBRARY_PATH`); `/usr/local/cuda/lib64`.
pub fn find_curand() -> Vec<PathBuf> {
    let mut candidates = Vec::new();
    if let Some(p) = std::env::var_os(CURAND_LIB_VAR) {
        candidates.push(PathBuf::from(p));
    }
    for site in super::vendor::python_site_dirs() {
        for sub in ["nvidia/cu13/lib", "nvidia/curand/lib"] {
            let p = site.join(sub).join(CURAND_SONAME);
            if p.exists() {
                candidates.push(p);
            }
        }
    }
    candidates.push(PathBuf::from(CURAND_SONAME));
    candidates.push(Path::new("/usr/local/cuda/lib64").join(CURAND_SONAME));
    candidates
}

impl Curand {
    /// Load the first libcurand of [`find_curand`] that opens and has the generator functions.
    pub fn open() -> Result<Curand, CurandOpenError> {
        let mut last = CurandOpenError::NotFound;
        for path in find_curand() {
            match Curand::open_at(&path) {
                Ok(c) => return Ok(c),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    fn open_at(path: &Path) -> Result<Curand, CurandOpenError> {
        let err = |error| CurandOpenError::Load { path: path.to_path_buf(), error };
        // SAFETY: a file named as NVIDIA's libcurand; loading it runs its initialisers,
        // which is what using it means.
        let library = unsafe { Library::open(path) }.map_err(err)?;
        // SAFETY: the same file as the line before: the loader hands out the object already
        // loaded, whose initialisers have run.
        let generators = unsafe { libloading::Library::new(path) }.map_err(err)?;
        /// An entry point of the generators' library, with its prototype from curand.h.
        fn get<T: Copy>(lib: &libloading::Library, name: &[u8]) -> Result<T, libloading::Error> {
            // SAFETY: the callers name each function with its prototype in curand.h.
            unsafe { lib.get::<T>(name) }.map(|s| *s)
        }
        Ok(Curand {
            create: get(&generators, b"curandCreateGenerator\0").map_err(err)?,
            create_host: get(&generators, b"curandCreateGeneratorHost\0").map_err(err)?,
            destroy: get(&generators, b"curandDestroyGenerator\0").map_err(err)?,
            set_stream: get(&generators, b"curandSetStream\0").map_err(err)?,
            set_seed: get(&generators, b"curandSetPseudoRandomGeneratorSeed\0").map_err(err)?,
            set_offset: get(&generators, b"curandSetGeneratorOffset\0").map_err(err)?,
            set_ordering: get(&generators, b"curandSetGeneratorOrdering\0").map_err(err)?,
            set_dimensions: get(&generators, b"curandSetQuasiRandomGeneratorDimensions\0").map_err(err)?,
            generate_seeds: get(&generators, b"curandGenerateSeeds\0").map_err(err)?,
            _generators: generators,
            library,
            path: path.to_path_buf(),
        })
    }

    /// A new generator of `rng_type` (a host generator when `host`), on the context current on
    /// the calling thread; cuRAND's status when it refuses.
    pub fn create(&self, rng_type: i32, host: bool) -> Result<u64, i32> {
        let mut g: *mut c_void = std::ptr::null_mut();
        let f = if host { self.create_host } else { self.create };
        // SAFETY: curandCreateGenerator(Host) writes the generator to a valid out pointer and
        // checks the type itself.
        let code = unsafe { f(&mut g, rng_type) };
        if code == 0 { Ok(g as u64) } else { Err(code) }
    }

    pub fn destroy(&self, generator: u64) -> i32 {
        // SAFETY: a generator `create` made and the session has not destroyed.
        unsafe { (self.destroy)(generator as *mut c_void) }
    }

    /// The stream a generator's work goes on (a `CUstream`; 0 the legacy default stream).
    pub fn set_stream(&self, generator: u64, stream: u64) -> i32 {
        // SAFETY: a live generator, and a stream of the session's context (or a special one).
        unsafe { (self.set_stream)(generator as *mut c_void, stream as *mut c_void) }
    }

    pub fn set_seed(&self, generator: u64, seed: u64) -> i32 {
        // SAFETY: a live generator of this library (the registry's); any seed is valid.
        unsafe { (self.set_seed)(generator as *mut c_void, seed) }
    }

    pub fn set_offset(&self, generator: u64, offset: u64) -> i32 {
        // SAFETY: a live generator of this library (the registry's); any offset is valid.
        unsafe { (self.set_offset)(generator as *mut c_void, offset) }
    }

    pub fn set_ordering(&self, generator: u64, ordering: i32) -> i32 {
        // SAFETY: a live generator of this library (the registry's); cuRAND checks the value.
        unsafe { (self.set_ordering)(generator as *mut c_void, ordering) }
    }

    pub fn set_dimensions(&self, generator: u64, dimensions: u32) -> i32 {
        // SAFETY: a live generator of this library (the registry's); cuRAND checks the value.
        unsafe { (self.set_dimensions)(generator as *mut c_void, dimensions) }
    }

    pub fn generate_seeds(&self, generator: u64) -> i32 {
        // SAFETY: a live generator of this library (the registry's).
        unsafe { (self.generate_seeds)(generator as *mut c_void) }
    }
}
