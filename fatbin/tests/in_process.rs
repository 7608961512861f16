//! The production path, in process: a shared library built by nvcc with `-cudart none` and the
//! registration stand-ins of `tests/data/register_stub.c` is loaded into this test process; its
//! constructors call `__cudaRegisterFatBinary` exactly as they would call the Phos guest
//! library, and [`phos_fatbin::container_from_wrapper`] reads the pointers they passed.

mod common;

use std::collections::BTreeSet;
use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use common::*;
use phos_fatbin::{EntryKind, FatBinary, container_from_wrapper};

unsafe extern "C" {
    fn dlopen(filename: *const c_char, flags: c_int) -> *mut c_void;
    fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void;
    fn dlerror() -> *const c_char;
}

const RTLD_NOW: c_int = 2;

/// What the library's constructors registered.
struct Registered {
    wrappers: Vec<*const c_void>,
    kernels: Vec<String>,
}

/// Loads the library (never unloaded: its data must outlive the returned pointers) and reads
/// back what the stub recorded.
fn load(path: &Path) -> Registered {
    let c_path = CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: a valid C string; loading runs the library's constructors, which only call the
    // stub's registration functions.
    let handle = unsafe { dlopen(c_path.as_ptr(), RTLD_NOW) };
    if handle.is_null() {
        // SAFETY: dlerror takes no arguments; after a failed dlopen it returns a message.
        let error = unsafe { dlerror() };
        // SAFETY: that message is a valid C string, alive until the next dl call.
        let message = unsafe { CStr::from_ptr(error) }.to_string_lossy().into_owned();
        panic!("dlopen {}: {message}", path.display());
    }
    let symbol = |name: &str| {
        let c_name = CString::new(name).unwrap();
        // SAFETY: `handle` is a live library handle and `c_name` a valid C string.
        let address = unsafe { dlsym(handle, c_name.as_ptr()) };
        assert!(!address.is_null(), "{name} not found");
        address
    };
    // SAFETY: the stub defines these with exactly these C signatures.
    let wrapper_count =
        unsafe { std::mem::transmute::<*mut c_void, extern "C" fn() -> c_int>(symbol("phos_test_wrapper_count")) };
    // SAFETY: as above.
    let wrapper = unsafe {
        std::mem::transmute::<*mut c_void, extern "C" fn(c_int) -> *const c_void>(symbol("phos_test_wrapper"))
    };
    // SAFETY: as above.
    let kernel_count =
        unsafe { std::mem::transmute::<*mut c_void, extern "C" fn() -> c_int>(symbol("phos_test_kernel_count")) };
    // SAFETY: as above.
    let kernel_name = unsafe {
        std::mem::transmute::<*mut c_void, extern "C" fn(c_int) -> *const c_char>(symbol("phos_test_kernel_name"))
    };
    let wrappers = (0..wrapper_count()).map(|i| wrapper(i)).collect();
    let kernels = (0..kernel_count())
        .map(|i| {
            // SAFETY: the registered device names are static strings of the loaded library.
            unsafe { CStr::from_ptr(kernel_name(i)) }.to_string_lossy().into_owned()
        })
        .collect();
    Registered { wrappers, kernels }
}

fn check(tc: &Toolchain, arch: u32) {
    let scratch = Scratch::new(&format!("{}-in-process", tc.label));
    let library = format!("libphos_fatbin_test_{}.so", tc.label);
    let extra = ["-cudart", "none", "-shared", "-Xcompiler", "-fPIC"];
    let file = build(tc, scratch.path(), &library, &extra, &["kernels.cu", "second.cu", "register_stub.c"]);
    let on_disk: Vec<Vec<u8>> = containers(&section(&file, ".nv_fatbin")).iter().map(|c| c.bytes().to_vec()).collect();

    let registered = load(&scratch.path().join(&library));
    assert_eq!(registered.wrappers.len(), on_disk.len(), "one registration per container");

    let mut cubin_kernels = BTreeSet::new();
    for &wrapper in &registered.wrappers {
        // SAFETY: `wrapper` is what nvcc's constructor passed to __cudaRegisterFatBinary; the
        // library stays loaded.
        let bytes = unsafe { container_from_wrapper(wrapper) }.expect("wrapper resolves");
        assert!(on_disk.iter().any(|c| c == bytes), "the container in memory is one of the file's");
        for entry in FatBinary::parse(bytes).unwrap().entries() {
            let entry = entry.unwrap();
            if entry.kind == EntryKind::Cubin && entry.sm_arch == arch {
                for kernel in phos_fatbin::cubin::kernels(&entry.payload().unwrap()).unwrap() {
                    cubin_kernels.insert(kernel.name);
                }
            }
        }
    }
    // The names the runtime is told about are exactly the kernels the cubins describe.
    let registered_kernels: BTreeSet<String> = registered.kernels.into_iter().collect();
    assert_eq!(cubin_kernels, registered_kernels);
    let mut expected: BTreeSet<String> = expected_kernels().keys().map(|k| (*k).to_owned()).collect();
    expected.insert("second_tu".to_owned());
    assert_eq!(cubin_kernels, expected);
}

#[test]
fn registered_wrappers_resolve_cuda11() {
    let Some(tc) = cuda11() else { return };
    check(&tc, 80);
}

#[test]
fn registered_wrappers_resolve_cuda13() {
    let Some(tc) = cuda13() else { return };
    check(&tc, 90);
}
