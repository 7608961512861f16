//! Which CUDA ABI the application loaded: the library is one build installed under several
//! sonames, so the file name it was loaded from (`libcudart.so.12`) says which layouts and
//! version numbers to present.

use std::ffi::CStr;
use std::sync::OnceLock;

use crate::abi::Abi;

/// The ABI of this process: `PHOS_CUDA_ABI` (11, 12, 13) if set, else from the loaded file
/// name, else CUDA 12.
pub fn current_abi() -> Abi {
    static ABI: OnceLock<Abi> = OnceLock::new();
    *ABI.get_or_init(|| {
        if let Ok(v) = std::env::var("PHOS_CUDA_ABI") {
            match v.trim() {
                "11" => return Abi::V11,
                "12" => return Abi::V12,
                "13" => return Abi::V13,
                _ => {}
            }
        }
        loaded_file_name().and_then(|n| Abi::from_library_name(&n)).unwrap_or(Abi::V12)
    })
}

/// The path this library was loaded from, as the dynamic loader recorded it.
fn loaded_file_name() -> Option<String> {
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    let anchor = current_abi as *const () as *const libc::c_void;
    if unsafe { libc::dladdr(anchor, &mut info) } == 0 || info.dli_fname.is_null() {
        return None;
    }
    let path = unsafe { CStr::from_ptr(info.dli_fname) }.to_string_lossy().into_owned();
    Some(path.rsplit('/').next().unwrap_or(&path).to_string())
}
