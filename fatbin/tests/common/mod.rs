//! Helpers shared by the integration tests: finding CUDA toolchains, building the sources in
//! `tests/data` into scratch directories, reading ELF sections, and the expected kernel layouts.

#![allow(dead_code, reason = "each test binary uses a different subset")]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

use phos_fatbin::{EntryKind, FatBinary, Wrapper, elf::Elf};

/// A CUDA toolchain to build test programs with.
#[derive(Debug, Clone)]
pub struct Toolchain {
    pub label: &'static str,
    pub nvcc: PathBuf,
    /// `cuobjdump` of the same toolkit, when there is one.
    pub cuobjdump: Option<PathBuf>,
    /// Extra arguments when linking host programs (library search paths).
    pub link_args: Vec<String>,
    /// `-gencode` arguments: cubins for three architectures, PTX for two.
    pub gencode: Vec<String>,
    /// SM architectures of the cubins and of the PTX that `gencode` asks for.
    pub cubin_archs: Vec<u32>,
    pub ptx_archs: Vec<u32>,
}

fn on_path(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|dir| dir.join(program)).find(|p| p.is_file())
}

fn gencode(list: &[&str]) -> Vec<String> {
    list.iter().flat_map(|g| ["-gencode".to_owned(), (*g).to_owned()]).collect()
}

/// The CUDA 11.8 toolchain: `nvcc` on `PATH` (Debian's nvidia-cuda-toolkit). Without it the
/// caller's test is skipped with a notice, unless `PHOS_REQUIRE_NVCC=1`, where it fails.
pub fn cuda11() -> Option<Toolchain> {
    let Some(nvcc) = on_path("nvcc") else {
        if std::env::var("PHOS_REQUIRE_NVCC").is_ok_and(|v| v == "1") {
            panic!("nvcc is not on PATH but PHOS_REQUIRE_NVCC=1: install the CUDA toolkit (nvidia-cuda-toolkit)");
        }
        eprintln!("notice: nvcc is not on PATH; skipping this test (set PHOS_REQUIRE_NVCC=1 to make it fail)");
        return None;
    };
    let cuobjdump = nvcc.parent().map(|d| d.join("cuobjdump")).filter(|p| p.is_file()).or_else(|| on_path("cuobjdump"));
    Some(Toolchain {
        label: "cuda11",
        nvcc,
        cuobjdump,
        link_args: Vec::new(),
        gencode: gencode(&[
            "arch=compute_52,code=[sm_52,compute_52]",
            "arch=compute_70,code=sm_70",
            "arch=compute_80,code=[sm_80,compute_80]",
        ]),
        cubin_archs: vec![52, 70, 80],
        ptx_archs: vec![52, 80],
    })
}

/// The optional CUDA 13.0 toolchain (pip wheels unpacked under `/tmp/wheels/cuda13`, or
/// `PHOS_CUDA13_ROOT`). Tests using it are skipped with a notice when it is absent.
pub fn cuda13() -> Option<Toolchain> {
    let root = std::env::var_os("PHOS_CUDA13_ROOT")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/tmp/wheels/cuda13/nvidia/cu13"));
    let nvcc = root.join("bin/nvcc");
    if !nvcc.is_file() {
        eprintln!("notice: no CUDA 13 toolchain at {}; skipping this test", root.display());
        return None;
    }
    let cuobjdump = Some(root.join("bin/cuobjdump")).filter(|p| p.is_file());
    Some(Toolchain {
        label: "cuda13",
        nvcc,
        cuobjdump,
        link_args: vec![format!("-L{}", root.join("lib").display())],
        gencode: gencode(&[
            "arch=compute_75,code=[sm_75,compute_75]",
            "arch=compute_80,code=sm_80",
            "arch=compute_90,code=[sm_90,compute_90]",
        ]),
        cubin_archs: vec![75, 80, 90],
        ptx_archs: vec![75, 90],
    })
}

/// A scratch directory, removed on drop.
#[derive(Debug)]
pub struct Scratch(PathBuf);

impl Scratch {
    pub fn new(label: &str) -> Self {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        let dir = std::env::temp_dir().join(format!(
            "phos-fatbin-{label}-{}-{}-{nanos}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).expect("create scratch directory");
        Scratch(dir)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A source file in `tests/data`.
pub fn data(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data").join(name).display().to_string()
}

/// Runs `program args...` in `dir`, panicking with its output on failure; returns stdout.
pub fn run(program: &Path, dir: &Path, args: &[String]) -> String {
    let output = Command::new(program)
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", program.display()));
    assert!(
        output.status.success(),
        "{} {} failed with {}:\n{}{}",
        program.display(),
        args.join(" "),
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Builds `sources` with `tc`'s gencode list plus `extra` into `dir/output` and returns the
/// produced file's bytes.
pub fn build(tc: &Toolchain, dir: &Path, output: &str, extra: &[&str], sources: &[&str]) -> Vec<u8> {
    let mut args: Vec<String> = tc.gencode.clone();
    args.extend(extra.iter().map(|s| (*s).to_owned()));
    args.extend(sources.iter().map(|s| data(s)));
    args.extend(["-o".to_owned(), output.to_owned()]);
    run(&tc.nvcc, dir, &args);
    std::fs::read(dir.join(output)).expect("read nvcc output")
}

/// Builds an object file from `kernels.cu` with extra fatbinary options.
pub fn object(tc: &Toolchain, dir: &Path, name: &str, extra: &[&str]) -> Vec<u8> {
    let mut args = vec!["-c"];
    args.extend_from_slice(extra);
    build(tc, dir, name, &args, &["kernels.cu"])
}

/// A copy of the section `name` of a host ELF file.
pub fn section(file: &[u8], name: &str) -> Vec<u8> {
    let elf = Elf::parse(file).expect("host file is ELF");
    elf.section(name).unwrap_or_else(|| panic!("no section {name}")).data.to_vec()
}

/// All containers of a `.nv_fatbin` section.
pub fn containers(section: &[u8]) -> Vec<FatBinary<'_>> {
    phos_fatbin::containers(section).collect::<Result<_, _>>().expect("containers parse")
}

/// Whether `a` and `b` are equal once their trailing NUL padding (under 8 bytes, as entries
/// pad to 8) is ignored: uncompressed payloads keep their padding, decompressed ones do not.
pub fn same_modulo_padding(a: &[u8], b: &[u8]) -> bool {
    let (short, long) = if a.len() <= b.len() { (a, b) } else { (b, a) };
    long.len() - short.len() < 8 && long.starts_with(short) && long[short.len()..].iter().all(|&x| x == 0)
}

/// Kernel name -> ((offset, size) per parameter in ordinal order, parameter buffer size).
pub type Layouts<K> = BTreeMap<K, (Vec<(u16, u16)>, u32)>;

/// The layout every toolchain must produce for the kernels in `tests/data`:
/// name -> ((offset, size) per parameter in ordinal order, buffer size).
pub fn expected_kernels() -> Layouts<&'static str> {
    let axpy_small = vec![(0, 4), (8, 8), (16, 8), (24, 4)];
    BTreeMap::from([
        // (const float *, float *, int, Mixed{int; double; char}): 24-byte struct aligned to 8.
        ("mixed_kernel", (vec![(0, 8), (8, 8), (16, 4), (24, 24)], 48)),
        ("_Z4axpyIfEvT_PKS0_PS0_i", (axpy_small.clone(), 28)),
        ("_Z4axpyIiEvT_PKS0_PS0_i", (axpy_small, 28)),
        ("_Z4axpyIdEvT_PKS0_PS0_i", (vec![(0, 8), (8, 8), (16, 8), (24, 4)], 28)),
        ("no_params", (vec![], 0)),
        // (Big /* 300 bytes, align 1 */, char, int *)
        ("big_param", (vec![(0, 300), (300, 1), (304, 8)], 312)),
        ("tail_padding", (vec![(0, 8), (8, 1)], 9)),
    ])
}

/// Layouts of the kernels in `second.cu` and `main.cu`.
pub fn expected_other_tu_kernels() -> Layouts<&'static str> {
    BTreeMap::from([
        // (short, long long, float2 /* align 8 */, unsigned char *)
        ("second_tu", (vec![(0, 2), (8, 8), (16, 8), (24, 8)], 32)),
        ("main_tu_kernel", (vec![(0, 4)], 4)),
    ])
}

/// The kernels of a cubin in the shape of [`expected_kernels`].
pub fn layouts(cubin: &[u8]) -> Layouts<String> {
    let kernels = phos_fatbin::cubin::kernels(cubin).expect("cubin parses");
    kernels
        .into_iter()
        .map(|k| {
            for (i, p) in k.params.iter().enumerate() {
                assert_eq!(usize::from(p.ordinal), i, "{}: ordinals in order", k.name);
            }
            (k.name, (k.params.iter().map(|p| (p.offset, p.size)).collect(), k.buffer_size))
        })
        .collect()
}

pub fn as_owned(map: Layouts<&'static str>) -> Layouts<String> {
    map.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()
}

/// A small xorshift generator, so the fuzz tests are reproducible without extra crates.
#[derive(Debug, Clone)]
pub struct XorShift(pub u64);

impl XorShift {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }

    /// A copy of `original` with a few random edits: bit flips, random or boundary bytes,
    /// small integer fields set to extreme values, or truncation.
    pub fn mutate(&mut self, original: &[u8]) -> Vec<u8> {
        let mut bytes = original.to_vec();
        for _ in 0..1 + self.below(6) {
            if bytes.is_empty() {
                break;
            }
            let at = self.below(bytes.len());
            match self.below(6) {
                0 => bytes[at] ^= 1 << self.below(8),
                1 => bytes[at] = self.next() as u8,
                2 => bytes[at] = [0, 0xff, 0x7f, 0x80, 1][self.below(5)],
                3 => {
                    let value = [0u32, u32::MAX, 0x8000_0000, 0x7fff_ffff, 64, 1][self.below(6)].to_le_bytes();
                    let end = (at + 4).min(bytes.len());
                    bytes[at..end].copy_from_slice(&value[..end - at]);
                }
                4 => bytes.truncate(at),
                _ => {
                    let len = self.below(16).min(bytes.len() - at);
                    bytes.drain(at..at + len);
                }
            }
        }
        bytes
    }
}

/// Checks a linked executable built from `kernels.cu`, `second.cu` and `main.cu`: every
/// wrapper in `.nvFatBinSegment` points at a container start in `.nv_fatbin`, and the cubins
/// for `arch` describe all kernels of the three translation units.
pub fn check_executable(exe: &[u8], arch: u32) {
    let elf = Elf::parse(exe).unwrap();
    let fatbin_section = elf.section(".nv_fatbin").expect(".nv_fatbin");
    let segment = elf.section(".nvFatBinSegment").expect(".nvFatBinSegment");
    let found = containers(fatbin_section.data);
    let starts: Vec<u64> =
        found.iter().map(|c| (c.bytes().as_ptr() as usize - fatbin_section.data.as_ptr() as usize) as u64).collect();
    assert_eq!(segment.data.len() % Wrapper::SIZE, 0);
    let wrappers: Vec<Wrapper> = segment.data.chunks(Wrapper::SIZE).map(|w| Wrapper::parse(w).unwrap()).collect();
    assert_eq!(wrappers.len(), found.len(), "one wrapper per container");
    assert_eq!(wrappers.iter().filter(|w| w.version == 1).count(), 3, "one per translation unit");
    assert!(wrappers.iter().filter(|w| w.version == 2).count() <= 1, "at most one device-link wrapper");

    let mut kernels = BTreeMap::new();
    for w in &wrappers {
        let offset = w.data - fatbin_section.addr;
        let index = starts.iter().position(|&s| s == offset).expect("wrapper points at a container start");
        let container = &found[index];
        if w.version == 1 {
            assert_eq!(w.filename_or_fatbins, 0);
        }
        for entry in container.entries() {
            let entry = entry.unwrap();
            if entry.kind == EntryKind::Cubin && entry.sm_arch == arch {
                kernels.extend(layouts(&entry.payload().unwrap()));
            }
        }
    }
    let mut expected = as_owned(expected_kernels());
    expected.extend(as_owned(expected_other_tu_kernels()));
    assert_eq!(kernels, expected);
}

/// Runs every parser of the crate over `bytes`, as a fat binary section, a wrapper and an ELF
/// image, checking the invariants the API promises on whatever succeeds. Returns how many
/// things parsed, so that the work cannot be optimised away.
pub fn exercise(bytes: &[u8]) -> usize {
    let mut parsed = 0;
    for container in phos_fatbin::containers(bytes).flatten() {
        assert_eq!(FatBinary::parse(container.bytes()).map(|c| c.len()), Ok(container.len()));
        for entry in container.entries().flatten() {
            parsed += 1;
            if let Ok(payload) = entry.payload() {
                if entry.compressed {
                    assert_eq!(payload.len() as u64, entry.uncompressed_size);
                }
                parsed += exercise_cubin(&payload);
            }
            if let Ok(Some(text)) = entry.ptx_text() {
                assert!(!text.contains('\0'));
            }
        }
    }
    if Wrapper::parse(bytes).is_ok() {
        parsed += 1;
    }
    parsed + exercise_cubin(bytes)
}

/// The ELF reader, the attribute iterator and the kernel extraction over `bytes`.
pub fn exercise_cubin(bytes: &[u8]) -> usize {
    let mut parsed = 0;
    if let Ok(elf) = Elf::parse(bytes) {
        parsed += elf.sections().len();
        if let Ok(symbols) = elf.symbols() {
            parsed += symbols.len();
        }
        for section in elf.sections().iter().filter(|s| s.name.starts_with(".nv.info")) {
            parsed += phos_fatbin::cubin::attributes(section).take_while(Result::is_ok).count();
        }
    }
    if let Ok(kernels) = phos_fatbin::cubin::kernels(bytes) {
        for kernel in kernels {
            parsed += 1;
            let args: Vec<Vec<u8>> = kernel.params.iter().map(|p| vec![0xab; usize::from(p.size)]).collect();
            let args: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
            let buffer = kernel.pack(&args).expect("a parsed layout packs its own parameters");
            assert_eq!(buffer.len(), kernel.buffer_size as usize);
        }
    }
    parsed
}
