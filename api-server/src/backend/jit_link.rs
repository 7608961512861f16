//! PTX compiled to a cubin by NVIDIA's nvJitLink (`libnvJitLink.so.13`/`.12`, CUDA 12 and
//! later), for the checked twins of concurrent checkpoints.
//!
//! Why not the driver: `cuModuleLoadData` of PTX compiles it under a lock of the driver's
//! that every other call of the process waits for. Measured on the H100, the first
//! copy-on-write checkpoint of a session compiled its kernel's twin in 114 ms, and the
//! session's launches waited as long. nvJitLink compiles on the calling thread without the
//! driver, before the session is held; loading the cubin then takes the lock only briefly.
//! Where nvJitLink is not found, the driver compiles as before.

use std::ffi::{CString, c_char, c_void};
use std::path::PathBuf;

/// The file the operator names for nvJitLink, instead of looking for it.
pub const NVJITLINK_LIB_VAR: &str = "PHOS_NVJITLINK_LIB";
const SONAMES: [&str; 2] = ["libnvJitLink.so.13", "libnvJitLink.so.12"];
/// `NVJITLINK_INPUT_PTX`
const INPUT_PTX: i32 = 2;

type Handle = *mut c_void;

/// The unversioned entry points (the library also exports them by name, besides the
/// versioned ones its header's inline wrappers call).
pub struct JitLink {
    create: unsafe extern "C" fn(*mut Handle, u32, *const *const c_char) -> i32,
    add_data: unsafe extern "C" fn(Handle, i32, *const c_void, usize, *const c_char) -> i32,
    complete: unsafe extern "C" fn(Handle) -> i32,
    cubin_size: unsafe extern "C" fn(Handle, *mut usize) -> i32,
    cubin: unsafe extern "C" fn(Handle, *mut c_void) -> i32,
    error_log_size: unsafe extern "C" fn(Handle, *mut usize) -> i32,
    error_log: unsafe extern "C" fn(Handle, *mut c_char) -> i32,
    destroy: unsafe extern "C" fn(*mut Handle) -> i32,
    /// Keeps the functions above loaded.
    _library: libloading::Library,
    pub path: PathBuf,
}

impl JitLink {
    /// The first nvJitLink of [`super::vendor::find_library`]'s places that opens with every
    /// function; `None` (said once by the caller) where there is none.
    pub fn open() -> Option<JitLink> {
        for path in super::vendor::find_library(NVJITLINK_LIB_VAR, "nvjitlink", &SONAMES) {
            // SAFETY: NVIDIA's library, whose initialisers have no preconditions.
            let Ok(library) = (unsafe { libloading::Library::new(&path) }) else { continue };
            let loaded = Self::load(library, &path);
            if let Ok(j) = loaded {
                return Some(j);
            }
        }
        None
    }

    fn load(library: libloading::Library, path: &std::path::Path) -> Result<JitLink, libloading::Error> {
        /// # Safety
        /// `T` is the type of the function `name` in nvJitLink.h.
        unsafe fn symbol<T: Copy>(library: &libloading::Library, name: &[u8]) -> Result<T, libloading::Error> {
            // SAFETY: the caller's promise on `T`.
            unsafe { library.get::<T>(name) }.map(|s| *s)
        }
        Ok(JitLink {
            // SAFETY: the function's signature in nvJitLink.h (CUDA 12 and 13).
            create: unsafe { symbol(&library, b"nvJitLinkCreate\0")? },
            // SAFETY: the function's signature in nvJitLink.h (CUDA 12 and 13).
            add_data: unsafe { symbol(&library, b"nvJitLinkAddData\0")? },
            // SAFETY: the function's signature in nvJitLink.h (CUDA 12 and 13).
            complete: unsafe { symbol(&library, b"nvJitLinkComplete\0")? },
            // SAFETY: the function's signature in nvJitLink.h (CUDA 12 and 13).
            cubin_size: unsafe { symbol(&library, b"nvJitLinkGetLinkedCubinSize\0")? },
            // SAFETY: the function's signature in nvJitLink.h (CUDA 12 and 13).
            cubin: unsafe { symbol(&library, b"nvJitLinkGetLinkedCubin\0")? },
            // SAFETY: the function's signature in nvJitLink.h (CUDA 12 and 13).
            error_log_size: unsafe { symbol(&library, b"nvJitLinkGetErrorLogSize\0")? },
            // SAFETY: the function's signature in nvJitLink.h (CUDA 12 and 13).
            error_log: unsafe { symbol(&library, b"nvJitLinkGetErrorLog\0")? },
            // SAFETY: the function's signature in nvJitLink.h (CUDA 12 and 13).
            destroy: unsafe { symbol(&library, b"nvJitLinkDestroy\0")? },
            _library: library,
            path: path.to_path_buf(),
        })
    }

    /// `ptx` compiled for `sm_{arch}` (e.g. 90): the cubin, or nvJitLink's error log.
    pub fn compile(&self, ptx: &[u8], arch: i32) -> Result<Vec<u8>, String> {
        let option = CString::new(format!("-arch=sm_{arch}")).expect("no NUL");
        let options = [option.as_ptr()];
        let mut h: Handle = std::ptr::null_mut();
        // SAFETY: one option string that outlives the call; writes one handle.
        let r = unsafe { (self.create)(&mut h, 1, options.as_ptr()) };
        if r != 0 {
            return Err(format!("nvJitLinkCreate answered {r}"));
        }
        let out = self.compile_with(h, ptx);
        // SAFETY: the handle created above, destroyed once.
        unsafe { (self.destroy)(&mut h) };
        out
    }

    fn compile_with(&self, h: Handle, ptx: &[u8]) -> Result<Vec<u8>, String> {
        let name = c"twin.ptx";
        // SAFETY: `ptx` outlives the call (nvJitLink copies what it keeps).
        let r = unsafe { (self.add_data)(h, INPUT_PTX, ptx.as_ptr() as *const c_void, ptx.len(), name.as_ptr()) };
        if r != 0 {
            return Err(format!("nvJitLinkAddData answered {r}: {}", self.log(h)));
        }
        // SAFETY: a live handle with its input.
        let r = unsafe { (self.complete)(h) };
        if r != 0 {
            return Err(format!("nvJitLinkComplete answered {r}: {}", self.log(h)));
        }
        let mut size = 0usize;
        // SAFETY: writes one size.
        let r = unsafe { (self.cubin_size)(h, &mut size) };
        if r != 0 || size == 0 {
            return Err(format!("nvJitLinkGetLinkedCubinSize answered {r} (size {size})"));
        }
        let mut cubin = vec![0u8; size];
        // SAFETY: writes `size` bytes, the room given.
        let r = unsafe { (self.cubin)(h, cubin.as_mut_ptr() as *mut c_void) };
        if r != 0 {
            return Err(format!("nvJitLinkGetLinkedCubin answered {r}"));
        }
        Ok(cubin)
    }

    fn log(&self, h: Handle) -> String {
        let mut size = 0usize;
        // SAFETY: writes one size.
        if unsafe { (self.error_log_size)(h, &mut size) } != 0 || size == 0 {
            return "no log".into();
        }
        let mut log = vec![0u8; size];
        // SAFETY: writes `size` bytes (NUL included), the room given.
        if unsafe { (self.error_log)(h, log.as_mut_ptr() as *mut c_char) } != 0 {
            return "no log".into();
        }
        String::from_utf8_lossy(log.split(|&b| b == 0).next().unwrap_or_default()).trim().to_string()
    }
}
