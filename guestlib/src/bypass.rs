//! No bypass: whether something in this process reaches the GPU without Phos, and telling the
//! user (a warning on standard error) and the router (`phosReportBypass`, which marks the
//! session bypassed in `phosctl sessions`, `top` and the metrics) when it does.
//!
//! - **A CUDA runtime or driver that is not Phos's, mapped beside this library.** `phosctl
//!   run` pins every CUDA library a program loads to Phos's (its audit module), but a program
//!   started otherwise (`LD_LIBRARY_PATH` alone, which a library's `DT_RPATH` or a load by
//!   full path escapes), or one that loads a copy under another name, may have NVIDIA's
//!   mapped too, and calls through it go to the GPU directly. The guest looks at the loaded
//!   objects' file names and `DT_SONAME`s at its first call, whenever a thread opens its
//!   channel, and every few thousand calls when objects were loaded since ([`before_call`]).
//! - **NVIDIA's own CUDA runtime built into an object**: a program linked with `-cudart
//!   static` (nvcc's default), or an NVIDIA library that carries one (cuBLASLt, cuDNN), finds
//!   this library as `libcuda.so.1` and asks it for the driver's private export tables,
//!   which only NVIDIA's driver has ([`private_runtime`], from `cuGetExportTable`): its CUDA
//!   calls fail, and the user is told why and what to do.

use std::cell::Cell;
use std::ffi::{CStr, c_int, c_void};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use phos_protocol::bypass::BypassKind;
use phos_protocol::cudart;

use crate::{runtime, soname};

/// Calls between two looks at the loaded objects (a look finds nothing new unless objects
/// were loaded since the last, which the loader counts).
const LOOK_EVERY: u64 = 4096;

/// The next call looks at the loaded objects.
static LOOK_DUE: AtomicBool = AtomicBool::new(true);

type Finding = (BypassKind, String);

/// What this process has found, said and reported.
struct Seen {
    /// The process it is about (a forked child starts afresh).
    pid: u32,
    /// The loader's count of objects added when the objects were last looked at.
    adds: Option<u64>,
    /// Foreign runtimes and drivers found then, and private runtimes found since.
    found: Vec<Finding>,
    /// Said on standard error.
    said: Vec<Finding>,
    /// Reported to the router, for session `reported_to`.
    reported_to: u64,
    reported: Vec<Finding>,
}

static SEEN: Mutex<Seen> =
    Mutex::new(Seen { pid: 0, adds: None, found: Vec::new(), said: Vec::new(), reported_to: 0, reported: Vec::new() });

thread_local! {
    /// This thread is reporting (its call must not look again).
    static REPORTING: Cell<bool> = const { Cell::new(false) };
}

fn seen() -> std::sync::MutexGuard<'static, Seen> {
    let mut seen = SEEN.lock().unwrap_or_else(|p| p.into_inner());
    let pid = std::process::id();
    if seen.pid != pid {
        *seen = Seen { pid, adds: None, found: Vec::new(), said: Vec::new(), reported_to: 0, reported: Vec::new() };
    }
    seen
}

/// The next call looks at the loaded objects again (a thread opened its channel).
pub fn look_soon() {
    LOOK_DUE.store(true, Ordering::Relaxed);
}

/// Before a call of the process (`calls`: how many it made before this one): when due, look
/// at the loaded objects and report what is new. One relaxed load when not due.
pub fn before_call(calls: u64) {
    if calls.is_multiple_of(LOOK_EVERY) {
        LOOK_DUE.store(true, Ordering::Relaxed);
    }
    if !LOOK_DUE.load(Ordering::Relaxed)
        || REPORTING.try_with(Cell::get).unwrap_or(true)
        || !LOOK_DUE.swap(false, Ordering::Relaxed)
    {
        return;
    }
    // The walks take the loader's lock: not under this module's.
    let adds = objects_added();
    let stale = adds.is_none() || adds != seen().adds;
    let libraries = stale.then(foreign_libraries);
    let found = {
        let mut seen = seen();
        if let Some(libraries) = libraries {
            seen.found.retain(|f| f.0 == BypassKind::PrivateRuntime);
            seen.found.extend(libraries.into_iter().map(|d| (BypassKind::ForeignLibrary, d)));
            seen.adds = adds;
        }
        seen.found.clone()
    };
    say_and_report(&found);
}

/// Warn once per process, and report to the session once, each finding not yet so.
fn say_and_report(found: &[Finding]) {
    let session = runtime::session_if_open().map_or(0, |s| s.id);
    let (to_say, to_report) = {
        let mut seen = seen();
        if session != seen.reported_to {
            seen.reported.clear();
        }
        let to_say: Vec<Finding> = found.iter().filter(|f| !seen.said.contains(f)).cloned().collect();
        seen.said.extend(to_say.iter().cloned());
        (to_say, found.iter().filter(|f| !seen.reported.contains(f)).cloned().collect::<Vec<_>>())
    };
    for (kind, detail) in &to_say {
        crate::log::init();
        match kind {
            BypassKind::ForeignLibrary => tracing::warn!(
                "a CUDA runtime or driver that is not Phos's is mapped in this process: {detail}. CUDA calls through \
                 it reach the GPU directly, bypassing Phos (no isolation, accounting, policies or checkpoints), and \
                 the session is marked bypassed. Run the program with `phosctl run`, which makes every CUDA runtime \
                 and driver it loads Phos's (docs/operations.md, \"No bypass\")"
            ),
            BypassKind::PrivateRuntime => tracing::warn!("{}", private_runtime_advice(detail)),
        }
    }
    for finding in to_report {
        let request = cudart::PhosReportBypassRequest { kind: finding.0 as i32, detail: &finding.1 };
        let _ = REPORTING.try_with(|r| r.set(true));
        let answered = runtime::call(&request);
        let _ = REPORTING.try_with(|r| r.set(false));
        if let Err(e) = answered {
            // A server of an earlier build does not know the call; the warning stands.
            tracing::debug!("phosReportBypass: {e:?}");
        }
        let session = runtime::session_if_open().map_or(0, |s| s.id);
        let mut seen = seen();
        if session != seen.reported_to {
            seen.reported.clear();
            seen.reported_to = session;
        }
        seen.reported.push(finding);
    }
}

/// The loader's count of objects it has added to the process, if it keeps one.
fn objects_added() -> Option<u64> {
    unsafe extern "C" fn first(info: *mut libc::dl_phdr_info, size: usize, data: *mut c_void) -> c_int {
        if size >= std::mem::offset_of!(libc::dl_phdr_info, dlpi_subs) {
            // SAFETY: the loader passes a valid `dl_phdr_info` of `size` bytes for the
            // duration of the call, which holds `dlpi_adds`.
            let adds = unsafe { (*info).dlpi_adds };
            // SAFETY: `data` is `objects_added`'s `Option<u64>`, untouched during the walk.
            unsafe { *(data as *mut Option<u64>) = Some(adds) };
        }
        1
    }
    let mut adds: Option<u64> = None;
    // SAFETY: the callback writes only `adds`, which outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(first), &mut adds as *mut Option<u64> as *mut c_void) };
    adds
}

/// A CUDA runtime or driver by its file name or soname, of any version.
fn is_runtime_or_driver(name: &str) -> bool {
    let base = name.rsplit('/').next().unwrap_or(name);
    ["libcuda.so", "libcudart.so"]
        .iter()
        .any(|stem| base.strip_prefix(stem).is_some_and(|rest| rest.is_empty() || rest.starts_with('.')))
}

/// An address in this library.
fn anchor() -> u64 {
    foreign_libraries as *const () as u64
}

/// Every loaded object other than this library whose file name or `DT_SONAME` is a CUDA
/// runtime or driver: its path, with its soname.
fn foreign_libraries() -> Vec<String> {
    unsafe extern "C" fn visit(info: *mut libc::dl_phdr_info, _size: usize, data: *mut c_void) -> c_int {
        // SAFETY: the loader passes a valid `dl_phdr_info` for the duration of the call.
        let info = unsafe { &*info };
        // SAFETY: `data` is `foreign_libraries`' `Vec<String>`, untouched during the walk.
        let found = unsafe { &mut *(data as *mut Vec<String>) };
        // SAFETY: `info` is the loader's, during its callback.
        if unsafe { soname::object_contains(info, anchor()) } {
            return 0;
        }
        let path = if info.dlpi_name.is_null() {
            String::new()
        } else {
            // SAFETY: a non-null `dlpi_name` is the object's NUL-terminated path.
            unsafe { CStr::from_ptr(info.dlpi_name) }.to_string_lossy().into_owned()
        };
        // SAFETY: as above.
        let soname = unsafe { soname::dynamic_names(info, soname::DT_SONAME) }.into_iter().next();
        if is_runtime_or_driver(&path) || soname.as_deref().is_some_and(is_runtime_or_driver) {
            found.push(match soname {
                Some(s) => format!("{path} (soname {s})"),
                None => path,
            });
        }
        0
    }
    let mut found: Vec<String> = Vec::new();
    // SAFETY: the callback only reads what the loader hands it and pushes to `found`, which
    // outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(visit), &mut found as *mut Vec<String> as *mut c_void) };
    found
}

/// NVIDIA's own CUDA runtime asked this library for the driver's private export tables
/// (`cuGetExportTable`): say where it is built in and what to do, once, and report it.
pub fn private_runtime() {
    let (object, is_program) =
        calling_object().unwrap_or_else(|| ("the program or one of its libraries".into(), false));
    let detail = if is_program { format!("{object} (the program)") } else { object };
    let found = {
        let mut seen = seen();
        let finding = (BypassKind::PrivateRuntime, detail);
        if !seen.found.contains(&finding) {
            seen.found.push(finding);
        }
        seen.found.clone()
    };
    say_and_report(&found);
}

/// What the user reads when NVIDIA's runtime, built into `detail`, asked for the driver's
/// private tables.
fn private_runtime_advice(detail: &str) -> String {
    let what = if detail.ends_with(" (the program)") {
        "NVIDIA's CUDA runtime is linked into the program itself (nvcc does so by default, `-cudart static`). \
         Build it with `nvcc -cudart shared` (or link `-lcudart`) so that it loads the CUDA runtime by name and \
         gets Phos's"
    } else if detail.split(' ').next().is_some_and(is_runtime_or_driver) {
        if std::env::var_os("PHOS_GUEST_DIR").is_some() {
            "NVIDIA's own CUDA runtime is loaded instead of Phos's, escaping `phosctl run` (a copy under another \
             name, or a runtime of a version Phos does not present)"
        } else {
            "NVIDIA's own CUDA runtime is loaded instead of Phos's: run the program with `phosctl run`, which makes \
             every CUDA runtime it loads Phos's"
        }
    } else {
        "this library carries NVIDIA's CUDA runtime inside it (NVIDIA's libraries such as cuBLASLt and cuDNN do), \
         and Phos does not serve it yet"
    };
    format!(
        "NVIDIA's own CUDA runtime, built into {detail}, asked Phos's driver library for the driver's private \
         interfaces (cuGetExportTable), which only NVIDIA's driver has: its CUDA calls fail (the session is marked \
         bypassed). {what} (docs/operations.md, \"No bypass\")"
    )
}

unsafe extern "C" {
    /// glibc's `backtrace(3)`: the return addresses on the calling thread's stack.
    fn backtrace(buffer: *mut *mut c_void, size: c_int) -> c_int;
}

/// The object whose code called into this library (the first frame on the stack outside
/// it): its path, and whether it is the program itself.
fn calling_object() -> Option<(String, bool)> {
    let mut frames = [std::ptr::null_mut::<c_void>(); 32];
    // SAFETY: `frames` holds the 32 entries `backtrace` may write.
    let n = unsafe { backtrace(frames.as_mut_ptr(), frames.len() as c_int) };
    let ours = object_base(anchor() as *const c_void)?.0;
    let program = program_base();
    frames.get(..usize::try_from(n).unwrap_or(0))?.iter().find_map(|&pc| {
        let (base, name) = object_base(pc)?;
        if base == ours {
            return None;
        }
        let is_program = Some(base) == program;
        let name = if is_program || name.is_empty() {
            std::env::current_exe().map_or(name, |p| p.display().to_string())
        } else {
            name
        };
        Some((name, is_program))
    })
}

/// The base address and path of the object `addr` lies in.
fn object_base(addr: *const c_void) -> Option<(usize, String)> {
    // SAFETY: `Dl_info` is plain data; all-zero is a valid value that dladdr overwrites.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: `info` is a valid place to write; dladdr only looks `addr` up.
    if unsafe { libc::dladdr(addr, &mut info) } == 0 || info.dli_fbase.is_null() {
        return None;
    }
    let name = if info.dli_fname.is_null() {
        String::new()
    } else {
        // SAFETY: dladdr set `dli_fname` to the object's NUL-terminated path, which lives as
        // long as the object is loaded.
        unsafe { CStr::from_ptr(info.dli_fname) }.to_string_lossy().into_owned()
    };
    Some((info.dli_fbase as usize, name))
}

/// The base address of the program (the first object the loader lists).
fn program_base() -> Option<usize> {
    unsafe extern "C" fn first(info: *mut libc::dl_phdr_info, _size: usize, data: *mut c_void) -> c_int {
        // SAFETY: the loader passes a valid `dl_phdr_info` for the duration of the call.
        let info = unsafe { &*info };
        // SAFETY: `data` is `program_base`'s `Option<usize>`, untouched during the walk.
        let base = unsafe { &mut *(data as *mut Option<usize>) };
        // SAFETY: `info` is the loader's, during its callback.
        let lowest = unsafe { soname::object_segments(info) }.iter().map(|&(lo, _)| lo).min();
        *base = lowest.map(|lo| lo as usize & !0xfff);
        1
    }
    let mut base: Option<usize> = None;
    // SAFETY: the callback writes only `base`, which outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(first), &mut base as *mut Option<usize> as *mut c_void) };
    base
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runtime_and_driver_names_of_any_version() {
        for name in ["libcuda.so.1", "/x/libcudart.so.12", "libcudart.so.10.2", "libcuda.so", "libcudart.so"] {
            assert!(is_runtime_or_driver(name), "{name}");
        }
        for name in ["libcudart_static.a", "libcublas.so.12", "/libcuda.so.1/libm.so.6", "libcudadebugger.so.1", ""] {
            assert!(!is_runtime_or_driver(name), "{name}");
        }
    }

    /// The test process has no CUDA library but this crate's code: nothing is foreign, and
    /// the loader counts the objects it added.
    #[test]
    fn a_process_without_cuda_libraries_has_nothing_foreign() {
        assert_eq!(foreign_libraries(), Vec::<String>::new());
        assert!(objects_added().is_some_and(|n| n > 0));
    }

    /// The program is the first object the loader lists: in a unit test this crate is
    /// linked into it, so its base is the one `dladdr` gives for this crate's code.
    #[test]
    fn the_program_is_the_first_object_the_loader_lists() {
        let (ours, _) = object_base(anchor() as *const c_void).unwrap();
        assert_eq!(Some(ours), program_base(), "this crate is linked into the test program");
    }

    #[test]
    fn the_advice_says_what_to_do_for_each_kind_of_object() {
        assert!(private_runtime_advice("/bin/app (the program)").contains("nvcc -cudart shared"));
        assert!(private_runtime_advice("/w/libcudart.so.12").contains("phosctl run"));
        assert!(private_runtime_advice("/w/libcublasLt.so.12").contains("does not serve it yet"));
    }
}
