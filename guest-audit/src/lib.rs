//! The audit module `phosctl run` puts in `LD_AUDIT`: it makes every CUDA runtime and driver
//! library a program loads Phos's, whatever run paths its libraries carry, and it reports the
//! NVIDIA CUDA libraries that get mapped anyway. (`LD_LIBRARY_PATH` alone is not enough: a
//! library's `DT_RPATH` is searched before it, and a library loaded by its full path, as
//! PyTorch preloads its wheels' `nvidia/*/lib/*.so`, is not searched for at all.)
//!
//! The dynamic loader calls three functions of it (rtld-audit(7)):
//!
//! - `la_version`, once, before anything else is loaded: the module reads its environment
//!   and answers the interface version it speaks;
//! - `la_objsearch`, whenever a library is to be found: with the name asked for
//!   (`LA_SER_ORIG`: a `DT_NEEDED` entry or the argument of `dlopen`), then, for a bare name,
//!   with each path the search tries. A path whose last component is a CUDA runtime or driver
//!   (`libcudart.so*`, `libcuda.so*`) is answered with the path of Phos's file for it, which
//!   the loader then opens; so the first place a search looks for one yields Phos's, and a
//!   `dlopen` of a full path too. Everything else is answered unchanged;
//! - `la_objopen`, whenever an object has been mapped: an object that is Phos's guest library
//!   is noted; one whose file name or `DT_SONAME` is a CUDA runtime or driver but which is not
//!   Phos's file (a renamed copy, a runtime of a version Phos does not present) is a
//!   **bypass**: reported on standard error at once; one of the NVIDIA libraries Phos does not
//!   serve yet (cuBLAS, cuDNN, ...) is noted.
//!
//! What it saw goes, one line per event, to the file `PHOS_AUDIT_REPORT` names, which
//! `phosctl` reads when the program has exited ([`Event`] has the format).
//!
//! **Environment.** `PHOS_GUEST_DIR`: the directory holding Phos's guest library under every
//! name it serves (`libcudart.so.11.0`, `.12`, `.13`, `libcuda.so.1`); without it, or if one
//! of those files is missing, nothing is redirected (and a line on standard error says so).
//! `PHOS_AUDIT_REPORT`: the report file (appended to; created if need be).
//!
//! **Where it runs.** The loader maps an audit module into a link-map namespace of its own,
//! with its own copy of the C library, and calls it with its own locks held. So the module
//! never calls into the guest library (another namespace's object) nor anything that could
//! take the loader's locks (`dlopen`, `dlsym`, `dl_iterate_phdr`, unwinding or printing a
//! backtrace). It allocates nothing: its configuration is read once, in `la_version`, into
//! static buffers, and each callback works on the stack with the C library's system-call
//! wrappers (`open`, `write`, `stat`). The crate is `no_std`, so the prelude offers no
//! allocating type; the standard library is linked only for the panic runtime the
//! workspace's unwinding profile needs, and nothing of it runs but the argument-saving
//! constructor every Rust shared library has. No code path panics (every index is checked or
//! in range by construction); were one to, the `extern "C"` boundary aborts.

#![no_std]
// The panic runtime (the workspace builds with `panic = "unwind"`, which `no_std` alone
// cannot link); nothing of std is used.
extern crate std;

mod names;

use core::cell::UnsafeCell;
use core::ffi::{CStr, c_char, c_int, c_long, c_uint};
use core::sync::atomic::{AtomicI32, Ordering};

use names::{SERVED_COUNT, SERVED_FILES, Served};

/// The longest path the module handles (Linux's `PATH_MAX`).
const PATH_MAX: usize = 4096;

/// `la_objsearch`'s flag for the name as asked for, before any search path.
const LA_SER_ORIG: c_uint = 0x01;

/// What the module learned in `la_version`.
struct Config {
    /// Phos's files, NUL-terminated, by [`Served`] index.
    targets: [[u8; PATH_MAX]; SERVED_COUNT],
    /// Every target exists: searches are redirected.
    redirect: bool,
    /// The guest library's file (device, inode), which every target names.
    guest_file: Option<(u64, u64)>,
    /// The report file, NUL-terminated (empty: none).
    report: [u8; PATH_MAX],
}

/// The configuration, written once.
struct Global(UnsafeCell<Config>);

// SAFETY: the configuration is written only by `la_version`, which the loader calls once,
// before it loads anything else and before the program (hence any other thread) runs; every
// later access reads.
unsafe impl Sync for Global {}

static CONFIG: Global = Global(UnsafeCell::new(Config {
    targets: [[0; PATH_MAX]; SERVED_COUNT],
    redirect: false,
    guest_file: None,
    report: [0; PATH_MAX],
}));

/// The search candidate last answered with Phos's file, NUL-terminated: the loader records
/// the object it then opens under the candidate's name, not under the path it opened.
struct Redirected(UnsafeCell<[u8; PATH_MAX]>);

// SAFETY: written by `la_objsearch` and read by `la_objopen`, which the loader calls with its
// lock held (`dlopen`, `dlmopen`) or before the program runs: never at once.
unsafe impl Sync for Redirected {}

static REDIRECTED: Redirected = Redirected(UnsafeCell::new([0; PATH_MAX]));

fn config() -> &'static Config {
    // SAFETY: see `Global`: no writer exists once the loader calls anything but
    // `la_version`.
    unsafe { &*CONFIG.0.get() }
}

/// A bounded line built on the stack: a path, a soname and a sentence fit.
struct Line<const N: usize = { PATH_MAX + 1024 }> {
    bytes: [u8; N],
    len: usize,
}

impl<const N: usize> Line<N> {
    fn new() -> Self {
        Line { bytes: [0; N], len: 0 }
    }

    /// Append `s`, cut short if the line is full.
    fn push(&mut self, s: &[u8]) -> &mut Self {
        for &b in s {
            let Some(slot) = self.bytes.get_mut(self.len) else { break };
            *slot = b;
            self.len += 1;
        }
        self
    }

    /// Append a path or name, its tabs, line ends and other control bytes as `?` (the
    /// report is one event per line, fields separated by tabs).
    fn push_name(&mut self, s: &[u8]) -> &mut Self {
        for &b in s {
            self.push(&[if b < 0x20 || b == 0x7f { b'?' } else { b }]);
        }
        self
    }

    fn push_number(&mut self, mut n: u64) -> &mut Self {
        let mut digits = [0u8; 20];
        let mut at = digits.len();
        loop {
            at -= 1;
            digits[at] = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 || at == 0 {
                break;
            }
        }
        self.push(digits.get(at..).unwrap_or(&[]))
    }

    fn as_bytes(&self) -> &[u8] {
        self.bytes.get(..self.len).unwrap_or(&[])
    }

    /// Write the line to `fd` (one `write`: a line appended to the report by several
    /// processes at once is not interleaved with another).
    fn write_to(&self, fd: c_int) {
        let bytes = self.as_bytes();
        // SAFETY: `bytes` is valid for its length; a short or failed write loses a report
        // line, nothing else.
        unsafe { libc::write(fd, bytes.as_ptr().cast(), bytes.len()) };
    }
}

/// Copy `dir` + `/` + `file` into `out` with a terminating NUL; false if it does not fit.
fn join(out: &mut [u8; PATH_MAX], dir: &[u8], file: &[u8]) -> bool {
    let dir = dir.strip_suffix(b"/").unwrap_or(dir);
    let len = dir.len() + 1 + file.len();
    if len >= PATH_MAX {
        return false;
    }
    out[..dir.len()].copy_from_slice(dir);
    out[dir.len()] = b'/';
    out[dir.len() + 1..len].copy_from_slice(file);
    out[len] = 0;
    true
}

/// The (device, inode) of the file `path` (NUL-terminated) names, following links.
fn file_id(path: &CStr) -> Option<(u64, u64)> {
    // SAFETY: `stat` is plain data; all zeroes is a value `stat(2)` overwrites.
    let mut st: libc::stat = unsafe { core::mem::zeroed() };
    // SAFETY: `path` is NUL-terminated and `st` a valid place to write.
    if unsafe { libc::stat(path.as_ptr(), &mut st) } != 0 {
        return None;
    }
    Some((st.st_dev, st.st_ino))
}

/// An environment variable's bytes (empty: unset).
fn env(name: &CStr) -> &'static [u8] {
    // SAFETY: `getenv` reads the environment the loader initialised this namespace's C
    // library with; the string lives as long as the environment is not changed, and this
    // runs before the program could change it.
    let value = unsafe { libc::getenv(name.as_ptr()) };
    if value.is_null() {
        return &[];
    }
    // SAFETY: a non-null `getenv` result is a NUL-terminated string.
    unsafe { CStr::from_ptr(value) }.to_bytes()
}

fn say(message: &[&[u8]]) {
    let mut line: Line = Line::new();
    line.push(b"phos: ");
    for part in message {
        line.push(part);
    }
    line.push(b"\n").write_to(2);
}

/// The loader's handshake: read the environment, and speak the loader's own version of the
/// interface. The two functions used, `la_objsearch` and `la_objopen`, are the same in every
/// version so far (1, and 2 since glibc 2.35); a loader accepts its own version everywhere,
/// while some (aarch64) accept nothing else.
///
/// # Safety
/// Called once, by the loader, before any other function of the module and before the
/// program runs (it writes the configuration every other function reads).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn la_version(version: c_uint) -> c_uint {
    if version == 0 {
        return 0;
    }
    // SAFETY: see `Global`: this is the one write, before any other callback or thread.
    let config = unsafe { &mut *CONFIG.0.get() };
    let report = env(c"PHOS_AUDIT_REPORT");
    if !report.is_empty() && report.len() < PATH_MAX {
        config.report[..report.len()].copy_from_slice(report);
        config.report[report.len()] = 0;
    }
    let dir = env(c"PHOS_GUEST_DIR");
    if dir.is_empty() {
        say(&[b"the audit module has no PHOS_GUEST_DIR: CUDA libraries are not redirected to Phos's"]);
        return version;
    }
    let mut ids = [None; SERVED_COUNT];
    for (i, file) in SERVED_FILES.iter().enumerate() {
        let joined = join(&mut config.targets[i], dir, file.to_bytes());
        ids[i] = if joined { CStr::from_bytes_until_nul(&config.targets[i]).ok().and_then(file_id) } else { None };
        if ids[i].is_none() {
            say(&[
                b"PHOS_GUEST_DIR=",
                dir,
                b" has no ",
                file.to_bytes(),
                b": CUDA libraries are not redirected to Phos's",
            ]);
            return version;
        }
    }
    config.guest_file = ids[Served::Driver as usize];
    config.redirect = true;
    version
}

/// A search for a library: a CUDA runtime, driver or cuBLAS is Phos's file for it.
///
/// A bare name as asked for (`LA_SER_ORIG`, `libcudart.so.12`) is left to the search, whose
/// first candidate path (in a run path, the library path, the cache or the default
/// directories) is then answered with Phos's file: the object so found keeps the bare name
/// among its names, which the loader's checks of symbol versions look for
/// (`DT_VERNEED` names the file, `libcudart.so.11.0`). Answering the bare name itself would
/// record only Phos's path for the second name that reaches the one file, and a program
/// needing versions of both `libcuda.so.1` and `libcudart.so.N` would stop the loader. A path
/// as asked for (`dlopen` of a full path) is searched nowhere: it is answered at once.
///
/// # Safety
/// Called by the loader with `name` a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn la_objsearch(name: *const c_char, _cookie: *mut usize, flag: c_uint) -> *const c_char {
    let config = config();
    if !config.redirect || name.is_null() {
        return name;
    }
    // SAFETY: the loader passes the NUL-terminated name it searches for.
    let asked = unsafe { CStr::from_ptr(name) }.to_bytes();
    if flag == LA_SER_ORIG && !asked.contains(&b'/') {
        return name;
    }
    let Some(served) = names::served(asked) else { return name };
    if flag != LA_SER_ORIG && asked.len() < PATH_MAX {
        // SAFETY: see `Redirected`; the name and its NUL fit (checked).
        let last = unsafe { &mut *REDIRECTED.0.get() };
        last[..asked.len()].copy_from_slice(asked);
        last[asked.len()] = 0;
    }
    // A path: the loader opens it as it is.
    config.targets[served as usize].as_ptr().cast()
}

/// Whether `path`, the name the loader recorded for an object, is Phos's guest library:
/// Phos's file under that name, or the search candidate last answered with it.
fn is_phos(path: &CStr) -> bool {
    // SAFETY: see `Redirected`.
    let last = unsafe { &*REDIRECTED.0.get() };
    let redirected = CStr::from_bytes_until_nul(last).is_ok_and(|l| !l.is_empty() && l == path);
    let guest_file = config().guest_file;
    redirected || (guest_file.is_some() && file_id(path) == guest_file)
}

/// The public head of glibc's `struct link_map` (<link.h>).
#[repr(C)]
pub struct LinkMap {
    l_addr: usize,
    l_name: *const c_char,
    l_ld: *const Dyn,
    l_next: *const LinkMap,
    l_prev: *const LinkMap,
}

/// An entry of a dynamic section (`ElfW(Dyn)`).
#[repr(C)]
pub struct Dyn {
    tag: isize,
    value: usize,
}

const DT_NULL: isize = 0;
const DT_STRTAB: isize = 5;
const DT_SONAME: isize = 14;

/// The object's `DT_SONAME`, read from its mapped dynamic section.
///
/// # Safety
/// `map` is a link map the loader passed, of an object mapped with its dynamic section.
unsafe fn soname(map: &LinkMap) -> Option<&'static [u8]> {
    if map.l_ld.is_null() {
        return None;
    }
    let (mut strtab, mut offset) = (None, None);
    // A dynamic section is tens of entries; the bound only guards against a corrupt one.
    for i in 0..4096 {
        // SAFETY: the loader mapped the object's dynamic section at `l_ld`, which ends with
        // a DT_NULL entry, and the walk stops there: entry `i` is inside it.
        let at = unsafe { map.l_ld.add(i) };
        // SAFETY: as above, `at` points to one mapped entry.
        let entry = unsafe { &*at };
        match entry.tag {
            DT_NULL => break,
            DT_STRTAB => strtab = Some(entry.value),
            DT_SONAME => offset = Some(entry.value),
            _ => {}
        }
    }
    let (strtab, offset) = (strtab?, offset?);
    // glibc relocates DT_STRTAB in place, unless the dynamic section is read-only; a
    // relocated address is at or above the object's base, an offset into the file below it.
    let strtab = if strtab < map.l_addr { strtab.wrapping_add(map.l_addr) } else { strtab };
    let at = strtab.checked_add(offset)? as *const c_char;
    // SAFETY: the string table of a mapped object holds NUL-terminated names, DT_SONAME's
    // among them.
    Some(unsafe { CStr::from_ptr(at) }.to_bytes())
}

/// The process the guest library was last noted for (a forked child notes it again if it
/// loads it again; what it inherited was noted for its parent).
static NOTED_PHOS_FOR: AtomicI32 = AtomicI32::new(0);

/// One line of the report: `PID<TAB>KIND<TAB>PROGRAM<TAB>PATH<TAB>SONAME<TAB>LIBRARY<NL>`,
/// `KIND` being `phos` (Phos's guest library was mapped), `bypass` (a CUDA runtime or driver
/// that is not Phos's) or `unserved` (an NVIDIA library Phos does not serve yet, `LIBRARY`
/// its name); `PROGRAM` is the process's executable. Empty fields are `-`; control bytes in a
/// field are `?`.
struct Event<'a> {
    kind: &'a [u8],
    path: &'a [u8],
    soname: &'a [u8],
    library: &'a [u8],
}

fn record(event: &Event<'_>) {
    let config = config();
    if config.report[0] == 0 {
        return;
    }
    fn or_dash(s: &[u8]) -> &[u8] {
        if s.is_empty() { b"-" } else { s }
    }
    let mut program = [0u8; PATH_MAX];
    // SAFETY: readlink writes at most `program.len()` bytes into `program`.
    let n = unsafe { libc::readlink(c"/proc/self/exe".as_ptr(), program.as_mut_ptr().cast(), program.len()) };
    let program = program.get(..usize::try_from(n).unwrap_or(0)).unwrap_or(&[]);
    let mut line: Line<{ 2 * PATH_MAX + 512 }> = Line::new();
    // SAFETY: getpid has no memory effects.
    line.push_number(unsafe { libc::getpid() } as u64)
        .push(b"\t")
        .push(event.kind)
        .push(b"\t")
        .push_name(or_dash(program))
        .push(b"\t")
        .push_name(or_dash(event.path))
        .push(b"\t")
        .push_name(or_dash(event.soname))
        .push(b"\t")
        .push(or_dash(event.library))
        .push(b"\n");
    let path = config.report.as_ptr().cast::<c_char>();
    // SAFETY: `path` is the NUL-terminated report path; the descriptor is closed below.
    let fd = unsafe { libc::open(path, libc::O_WRONLY | libc::O_APPEND | libc::O_CREAT | libc::O_CLOEXEC, 0o600) };
    if fd >= 0 {
        line.write_to(fd);
        // SAFETY: `fd` is the descriptor just opened.
        unsafe { libc::close(fd) };
    }
}

/// An object was mapped: note Phos's library, report NVIDIA's runtime or driver, note the
/// NVIDIA libraries Phos does not serve.
///
/// # Safety
/// Called by the loader with a valid link map.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn la_objopen(map: *mut LinkMap, _lmid: c_long, _cookie: *mut usize) -> c_uint {
    // SAFETY: the loader passes the new object's link map.
    let Some(map) = (unsafe { map.as_ref() }) else { return 0 };
    if map.l_name.is_null() {
        return 0;
    }
    // SAFETY: `l_name` is the NUL-terminated path the object was loaded from ("" for the
    // program itself).
    let path = unsafe { CStr::from_ptr(map.l_name) };
    if path.is_empty() {
        return 0;
    }
    if is_phos(path) {
        // SAFETY: getpid has no memory effects.
        let pid = unsafe { libc::getpid() };
        if NOTED_PHOS_FOR.swap(pid, Ordering::Relaxed) != pid {
            record(&Event { kind: b"phos", path: path.to_bytes(), soname: b"", library: b"" });
        }
        return 0;
    }
    // SAFETY: the object is mapped, its dynamic section with it.
    let soname = unsafe { soname(map) }.unwrap_or(b"");
    let path = path.to_bytes();
    if names::is_runtime_or_driver(path) || names::is_runtime_or_driver(soname) {
        record(&Event { kind: b"bypass", path, soname, library: b"" });
        let mut pid: Line<20> = Line::new();
        // SAFETY: getpid has no memory effects.
        pid.push_number(unsafe { libc::getpid() } as u64);
        say(&[
            b"process ",
            pid.as_bytes(),
            b" mapped ",
            path,
            b", a CUDA runtime or driver that is not Phos's",
            if soname.is_empty() { b"" } else { b" (soname " },
            soname,
            if soname.is_empty() { b"" } else { b")" },
            b": CUDA calls through it reach the GPU directly, bypassing Phos (no isolation, accounting, policies \
              or checkpoints)",
        ]);
    } else if let Some(library) = names::unserved(path).or_else(|| names::unserved(soname)) {
        record(&Event { kind: b"unserved", path, soname, library: library.as_bytes() });
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_bounded_and_one_event_per_line() {
        let mut line: Line = Line::new();
        line.push_number(0).push(b" ").push_number(4_294_967_295).push(b" ").push_name(b"a\tb\nc");
        assert_eq!(line.as_bytes(), b"0 4294967295 a?b?c");
        let long = [b'x'; 3 * PATH_MAX];
        line.push(&long).push(b"end");
        assert_eq!(line.as_bytes().len(), line.bytes.len(), "cut short at the buffer's end");
    }

    #[test]
    fn a_path_that_does_not_fit_is_refused() {
        let mut out = [0u8; PATH_MAX];
        assert!(join(&mut out, b"/dir/", b"libcuda.so.1"));
        assert_eq!(CStr::from_bytes_until_nul(&out).unwrap().to_bytes(), b"/dir/libcuda.so.1");
        assert!(!join(&mut out, &[b'd'; PATH_MAX - 4], b"libcuda.so.1"));
    }
}
