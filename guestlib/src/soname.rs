//! Which CUDA ABI the application loaded. The library is one file installed under several
//! sonames, so the name the program asked for (`libcudart.so.12`) says which layouts and
//! version numbers to present.
//!
//! The dynamic loader records one path per loaded file: the name it was first reached by. A
//! program that uses only the runtime reaches the library as `libcudart.so.N`, and that name
//! says it. One that also links the driver API may reach it first as `libcuda.so.1`; then the
//! `libcudart.so.N` that a loaded object (the program, or a library of it) lists among the
//! libraries it needs says it.

use std::ffi::{CStr, c_int, c_void};
use std::sync::OnceLock;

use crate::abi::Abi;

/// The ABI of this process: `PHOS_CUDA_ABI` (11, 12, 13) if set, else the runtime's soname the
/// library was loaded as, else the one a loaded object needs, else CUDA 12.
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
        loaded_file_name()
            .filter(|n| is_runtime_name(n))
            .and_then(|n| Abi::from_library_name(&n))
            .or_else(needed_runtime)
            .unwrap_or(Abi::V12)
    })
}

fn is_runtime_name(name: &str) -> bool {
    name.starts_with("libcudart.so.")
}

/// The file name this library was loaded from, as the dynamic loader recorded it.
fn loaded_file_name() -> Option<String> {
    // SAFETY: `Dl_info` is plain data; all-zero is a valid value that dladdr overwrites.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    let anchor = current_abi as *const () as *const libc::c_void;
    // SAFETY: `anchor` is an address in this library and `info` a valid place to write.
    if unsafe { libc::dladdr(anchor, &mut info) } == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dladdr set `dli_fname` to the loader's NUL-terminated path of the object, which
    // lives as long as the object is loaded (this library, while this code runs).
    let path = unsafe { CStr::from_ptr(info.dli_fname) }.to_string_lossy().into_owned();
    Some(path.rsplit('/').next().unwrap_or(&path).to_string())
}

/// An entry of a `PT_DYNAMIC` segment (`Elf64_Dyn`).
#[repr(C)]
struct Dyn {
    tag: i64,
    value: u64,
}

const DT_NULL: i64 = 0;
const DT_NEEDED: i64 = 1;
const DT_STRTAB: i64 = 5;
const DT_STRSZ: i64 = 10;

/// The ABI of the first `libcudart.so.N` that a loaded object needs (`DT_NEEDED`), in load
/// order: the program before its libraries.
fn needed_runtime() -> Option<Abi> {
    let mut found: Option<Abi> = None;
    // SAFETY: the callback only reads what the loader hands it (see `visit`), and `found`
    // outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(visit), &mut found as *mut Option<Abi> as *mut c_void) };
    found
}

/// `dl_iterate_phdr`'s callback: look at one loaded object's needed libraries; a non-zero
/// return stops the walk.
unsafe extern "C" fn visit(info: *mut libc::dl_phdr_info, _size: usize, data: *mut c_void) -> c_int {
    // SAFETY: the loader passes a valid `dl_phdr_info` for the duration of the call.
    let info = unsafe { &*info };
    // SAFETY: `data` is the `Option<Abi>` `needed_runtime` passed to `dl_iterate_phdr`, which
    // it does not touch while the walk runs.
    let found = unsafe { &mut *(data as *mut Option<Abi>) };
    // SAFETY: `info` is the loader's, during its callback.
    for name in unsafe { dynamic_names(info, DT_NEEDED) } {
        if is_runtime_name(&name)
            && let Some(abi) = Abi::from_library_name(&name)
        {
            *found = Some(abi);
            return 1;
        }
    }
    0
}

/// Where one loaded object is mapped: its `PT_LOAD` segments, `[start, end)`.
///
/// # Safety
/// `info` is what `dl_iterate_phdr` passed its callback for the object, used during the call.
pub(crate) unsafe fn object_segments(info: &libc::dl_phdr_info) -> Vec<(u64, u64)> {
    if info.dlpi_phdr.is_null() {
        return Vec::new();
    }
    // SAFETY: `dlpi_phdr` points to the object's `dlpi_phnum` program headers.
    let headers = unsafe { std::slice::from_raw_parts(info.dlpi_phdr, usize::from(info.dlpi_phnum)) };
    let base = info.dlpi_addr;
    headers
        .iter()
        .filter(|h| h.p_type == libc::PT_LOAD)
        .map(|h| (base.wrapping_add(h.p_vaddr), base.wrapping_add(h.p_vaddr).wrapping_add(h.p_memsz)))
        .collect()
}

/// Whether `addr` lies in one loaded object (its code or data).
///
/// # Safety
/// As [`object_segments`].
pub(crate) unsafe fn object_contains(info: &libc::dl_phdr_info, addr: u64) -> bool {
    // SAFETY: the caller's.
    unsafe { object_segments(info) }.iter().any(|&(lo, hi)| addr >= lo && addr < hi)
}

pub(crate) const DT_SONAME: i64 = 14;

/// The names a loaded object's dynamic section gives under `tag` (`DT_NEEDED`, `DT_SONAME`),
/// read only where the object is mapped.
///
/// # Safety
/// As [`object_segments`].
pub(crate) unsafe fn dynamic_names(info: &libc::dl_phdr_info, tag: i64) -> Vec<String> {
    let mut names = Vec::new();
    if info.dlpi_phdr.is_null() {
        return names;
    }
    // SAFETY: `dlpi_phdr` points to the object's `dlpi_phnum` program headers.
    let headers = unsafe { std::slice::from_raw_parts(info.dlpi_phdr, usize::from(info.dlpi_phnum)) };
    let base = info.dlpi_addr;
    // An address read from the dynamic section is used only if it falls where the object is
    // mapped.
    // SAFETY: the caller's.
    let loaded = unsafe { object_segments(info) };
    let mapped =
        |at: u64, len: u64| loaded.iter().any(|&(lo, hi)| at >= lo && at.checked_add(len).is_some_and(|e| e <= hi));
    for h in headers.iter().filter(|h| h.p_type == libc::PT_DYNAMIC) {
        let at = base.wrapping_add(h.p_vaddr);
        let count = h.p_memsz / size_of::<Dyn>() as u64;
        if !mapped(at, count * size_of::<Dyn>() as u64) {
            continue;
        }
        // SAFETY: the dynamic segment lies in the object's loaded memory (checked above), as
        // `count` entries.
        let entries = unsafe { std::slice::from_raw_parts(at as *const Dyn, count as usize) };
        let entries = &entries[..entries.iter().position(|d| d.tag == DT_NULL).unwrap_or(entries.len())];
        let value_of = |tag| entries.iter().find(|d| d.tag == tag).map(|d| d.value);
        let (Some(strtab), Some(strsz)) = (value_of(DT_STRTAB), value_of(DT_STRSZ)) else { continue };
        // The loader relocates DT_STRTAB in place on most targets; where it cannot (a read-only
        // dynamic section) it is still relative to the base.
        let Some(strtab) = [strtab, base.wrapping_add(strtab)].into_iter().find(|&s| mapped(s, strsz)) else {
            continue;
        };
        // SAFETY: the string table lies in loaded memory (checked above), `strsz` bytes.
        let strings = unsafe { std::slice::from_raw_parts(strtab as *const u8, strsz as usize) };
        for entry in entries.iter().filter(|d| d.tag == tag) {
            let Some(rest) = strings.get(entry.value as usize..) else { continue };
            let Ok(name) = CStr::from_bytes_until_nul(rest) else { continue };
            names.push(name.to_string_lossy().into_owned());
        }
    }
    names
}

#[cfg(test)]
mod tests {
    /// The test binary needs no CUDA runtime: the walk finds nothing and reads only mapped
    /// memory on the way (the C library and the loader are walked too).
    #[test]
    fn a_process_without_the_runtime_needs_none() {
        assert_eq!(super::needed_runtime(), None);
    }
}
