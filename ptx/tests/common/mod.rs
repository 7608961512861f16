//! Helpers shared by the interpreter's kernel tests: host buffers standing in for device memory, kernel arguments,
//! loaded modules, and compiling `tests/exec_data` sources with nvcc (cached under the target directory).
//!
//! Without nvcc the tests print a notice and pass, unless `PHOS_REQUIRE_NVCC=1` (set in CI).
//! `PHOS_NVCC=/a/bin/nvcc:/b/bin/nvcc` chooses the toolchains instead of the default search.

#![allow(dead_code)] // each test crate uses a part

use std::collections::HashMap;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock};

use phos_ptx::exec::{self, ExecError, GlobalMemory, Launch, Program, Resources, Stats};

// ----- device memory for tests -----

/// A 16-byte aligned host buffer standing in for a device allocation. Kernels write it through its address, so all
/// access goes through a pointer taken once from the allocation.
pub struct Buf {
    pub _data: Vec<u128>,
    pub ptr: *mut u128,
    pub len: usize,
}

// SAFETY: the buffer is plain memory; tests synchronize through `exec::run` returning.
unsafe impl Sync for Buf {}

impl Buf {
    pub fn zeroed(len: usize) -> Buf {
        let mut data = vec![0u128; len.div_ceil(16).max(1)];
        let ptr = data.as_mut_ptr();
        Buf { _data: data, ptr, len }
    }
    pub fn from<T: Copy>(v: &[T]) -> Buf {
        let bytes = std::mem::size_of_val(v);
        let b = Buf::zeroed(bytes);
        // SAFETY: plain-old-data copy into a buffer at least as large.
        unsafe { std::ptr::copy_nonoverlapping(v.as_ptr() as *const u8, b.ptr as *mut u8, bytes) };
        b
    }
    pub fn addr(&self) -> u64 {
        self.ptr as u64
    }
    pub fn get<T: Copy + Default>(&self) -> Vec<T> {
        let n = self.len / std::mem::size_of::<T>();
        let mut out = vec![T::default(); n];
        // SAFETY: copies n * size_of::<T>() <= len bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.ptr as *const u8,
                out.as_mut_ptr() as *mut u8,
                n * std::mem::size_of::<T>(),
            )
        };
        out
    }
    /// Writes `v` at the start of the buffer, as a copy from the host would (kernels are not
    /// running: the tests launch synchronously).
    pub fn set<T: Copy>(&self, v: &[T]) {
        let bytes = std::mem::size_of_val(v);
        assert!(bytes <= self.len);
        // SAFETY: copies `bytes` <= len bytes of plain data into the allocation.
        unsafe { std::ptr::copy_nonoverlapping(v.as_ptr() as *const u8, self.ptr as *mut u8, bytes) };
    }
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: the allocation holds at least `len` bytes; kernels do not run while tests read it.
        unsafe { std::slice::from_raw_parts(self.ptr as *const u8, self.len) }
    }
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: the allocation holds at least `len` bytes.
        unsafe { std::slice::from_raw_parts_mut(self.ptr as *mut u8, self.len) }
    }
    pub fn range(&self) -> Range<u64> {
        self.addr()..self.addr() + self.len as u64
    }
}

pub struct Regions(pub Vec<Range<u64>>);

impl GlobalMemory for Regions {
    fn region(&self, addr: u64) -> Option<Range<u64>> {
        self.0.iter().find(|r| r.contains(&addr)).cloned()
    }
}

/// Kernel arguments laid out like the C ABI (which is the PTX parameter layout).
#[derive(Default)]
pub struct Args(pub Vec<u8>);

impl Args {
    pub fn p<T: Copy>(mut self, v: T) -> Self {
        let a = std::mem::align_of::<T>();
        while !self.0.len().is_multiple_of(a) {
            self.0.push(0);
        }
        // SAFETY: reads the bytes of a Copy value.
        let bytes = unsafe { std::slice::from_raw_parts(&v as *const T as *const u8, std::mem::size_of::<T>()) };
        self.0.extend_from_slice(bytes);
        self
    }
    pub fn buf(self, b: &Buf) -> Self {
        self.p(b.addr())
    }
}

pub struct Loaded {
    pub prog: Program,
    pub vars: Vec<Buf>,
    pub name: String,
}

impl Loaded {
    pub fn new(ptx: &str, name: &str) -> Loaded {
        let module = phos_ptx::parse(ptx).unwrap_or_else(|e| panic!("{name}: {e}"));
        let mut prog = Program::new(&module);
        let mut vars: Vec<Buf> = prog.variables().iter().map(|v| Buf::zeroed(v.size as usize)).collect();
        let addrs: Vec<u64> = vars.iter().map(|b| b.addr()).collect();
        let init = prog.bind_variables(&addrs);
        for (b, i) in vars.iter_mut().zip(init) {
            let n = i.len().min(b.len);
            b.bytes_mut()[..n].copy_from_slice(&i[..n]);
        }
        Loaded { prog, vars, name: name.to_string() }
    }

    pub fn var(&self, name: &str) -> &Buf {
        let i = self.prog.variables().iter().position(|v| v.name == name).expect("variable");
        &self.vars[i]
    }

    pub fn run(
        &self,
        kernel: &str,
        grid: [u32; 3],
        block: [u32; 3],
        smem: u32,
        args: &Args,
        bufs: &[&Buf],
    ) -> (Result<Stats, ExecError>, String) {
        let mut regions: Vec<Range<u64>> = bufs.iter().map(|b| b.range()).collect();
        regions.extend(self.vars.iter().map(|b| b.range()));
        let mem = Regions(regions);
        let mut out = Vec::new();
        let launch = Launch { grid, block, dynamic_shared: smem, params: &args.0 };
        let r = exec::run(&self.prog, kernel, &launch, &mem, &mut out, 2);
        (r, String::from_utf8_lossy(&out).into_owned())
    }

    /// [`Loaded::run`] with texture and surface objects.
    pub fn run_with(
        &self,
        kernel: &str,
        grid: u32,
        block: u32,
        args: &Args,
        bufs: &[&Buf],
        resources: &dyn Resources,
    ) -> Result<Stats, ExecError> {
        let mut regions: Vec<Range<u64>> = bufs.iter().map(|b| b.range()).collect();
        regions.extend(self.vars.iter().map(|b| b.range()));
        let launch = Launch { grid: [grid, 1, 1], block: [block, 1, 1], dynamic_shared: 0, params: &args.0 };
        let options = exec::RunOptions { workers: 2, max_warp_instructions: Some(50_000_000) };
        exec::run_with_resources(&self.prog, kernel, &launch, &Regions(regions), resources, &mut Vec::new(), &options)
    }

    pub fn ok(&self, kernel: &str, grid: [u32; 3], block: [u32; 3], smem: u32, args: &Args, bufs: &[&Buf]) -> String {
        let (r, out) = self.run(kernel, grid, block, smem, args, bufs);
        if let Err(e) = r {
            panic!("{}: {kernel}: {e}", self.name);
        }
        out
    }
}

// ----- nvcc -----

pub struct Toolchain {
    pub nvcc: PathBuf,
    pub major: u32,
}

pub fn toolchains() -> &'static [Toolchain] {
    static T: OnceLock<Vec<Toolchain>> = OnceLock::new();
    T.get_or_init(|| {
        let candidates: Vec<PathBuf> = match std::env::var("PHOS_NVCC") {
            Ok(list) => list.split(':').filter(|s| !s.is_empty()).map(PathBuf::from).collect(),
            Err(_) => {
                let mut v = vec![PathBuf::from("nvcc"), PathBuf::from("/usr/local/cuda/bin/nvcc")];
                v.push(PathBuf::from("/tmp/wheels/cuda13/nvidia/cu13/bin/nvcc"));
                v
            }
        };
        let mut found: Vec<Toolchain> = Vec::new();
        for c in candidates {
            let Ok(out) = Command::new(&c).arg("--version").output() else { continue };
            if !out.status.success() {
                continue;
            }
            let text = String::from_utf8_lossy(&out.stdout).to_string();
            let Some(major) =
                text.split("release ").nth(1).and_then(|r| r.split('.').next()).and_then(|m| m.parse().ok())
            else {
                continue;
            };
            if !found.iter().any(|t: &Toolchain| t.major == major) {
                found.push(Toolchain { nvcc: c, major });
            }
        }
        if found.is_empty() {
            if std::env::var("PHOS_REQUIRE_NVCC").as_deref() == Ok("1") {
                panic!("PHOS_REQUIRE_NVCC=1 but no usable nvcc was found");
            }
            eprintln!(
                "NOTICE: nvcc not found; skipping interpreter kernel tests (set PHOS_REQUIRE_NVCC=1 to make this fail)"
            );
        }
        found.sort_by_key(|t| t.major);
        found
    })
}

/// A compiled variant of a source file.
pub struct Variant {
    pub ptx: String,
    pub label: String,
    /// The virtual architecture number, e.g. 70.
    pub arch: u32,
}

static CACHE: OnceLock<Mutex<HashMap<String, Option<String>>>> = OnceLock::new();

pub fn compile(tc: &Toolchain, file: &str, arch: u32, debug: bool) -> Option<String> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/exec_data").join(file);
    compile_path(tc, &src, arch, debug, true)
}

/// Compiles `src` to PTX (cached under the target directory). With `must`, a compiler error fails the test.
pub fn compile_path(tc: &Toolchain, src: &Path, arch: u32, debug: bool, must: bool) -> Option<String> {
    let file = src.file_name()?.to_string_lossy().into_owned();
    let text = std::fs::read_to_string(src).expect("source");
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in text.bytes().chain(tc.nvcc.to_string_lossy().bytes()) {
        h = (h ^ b as u64).wrapping_mul(0x100_0000_01b3);
    }
    let key = format!("{file}-{}-{arch}-{}-{h:016x}", tc.major, if debug { "G" } else { "O" });
    let cache = CACHE.get_or_init(|| Mutex::new(HashMap::new()));
    if let Some(v) = cache.lock().unwrap().get(&key) {
        return v.clone();
    }
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("exec_ptx");
    std::fs::create_dir_all(&dir).ok();
    let out = dir.join(format!("{key}.ptx"));
    let ptx = if let Ok(p) = std::fs::read_to_string(&out) {
        Some(p)
    } else {
        // Unique per compilation: tests on other threads may compile the same key at once.
        static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tmp = dir.join(format!("{key}.{}.{seq}.tmp", std::process::id()));
        let mut cmd = Command::new(&tc.nvcc);
        cmd.args(["-ptx", &format!("-arch=compute_{arch}"), "-std=c++17", "-o"]).arg(&tmp).arg(src);
        if debug {
            cmd.arg("-G");
        }
        let res = cmd.output().expect("run nvcc");
        if !res.status.success() {
            if !must {
                return None;
            }
            panic!("nvcc failed on {file} (compute_{arch}): {}", String::from_utf8_lossy(&res.stderr));
        }
        std::fs::rename(&tmp, &out).ok();
        std::fs::read_to_string(&out).ok()
    };
    cache.lock().unwrap().insert(key, ptx.clone());
    ptx
}

/// The variants a source file is tested in: each toolchain's archs, plus one debug build.
pub fn variants(file: &str, archs11: &[u32], debug: bool) -> Vec<Variant> {
    let mut v = Vec::new();
    for tc in toolchains() {
        let archs: Vec<u32> = if tc.major >= 13 { vec![90] } else { archs11.to_vec() };
        for &arch in &archs {
            if let Some(ptx) = compile(tc, file, arch, false) {
                v.push(Variant { ptx, label: format!("{file} (CUDA {}, compute_{arch})", tc.major), arch });
            }
        }
        if debug
            && tc.major < 13
            && let Some(ptx) = compile(tc, file, archs[0], true)
        {
            {
                v.push(Variant {
                    ptx,
                    label: format!("{file} (CUDA {}, compute_{} -G)", tc.major, archs[0]),
                    arch: archs[0],
                });
            }
        }
    }
    v
}

pub fn xorshift(s: &mut u64) -> u64 {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    *s
}
