//! The symbol versions of the built `libphos_guest.so` (build.rs, `symbol_versions`): the
//! library defines the version nodes of the three runtime sonames it is installed as, every
//! export resolves for each of them, nothing but the CUDA APIs (runtime and driver) is
//! exported, and programs linked against a runtime of each version start on it without glibc's
//! "no version information available". The driver API's exports answer as NVIDIA's without a
//! server where they need none, and the file is one library however many names reach it.
//!
//! The library is the one of this build, `target/<profile>/libphos_guest.so` (cargo builds it
//! before the tests). The checks read it with `readelf` and build small C programs with `cc`.
#![cfg(target_os = "linux")]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The version nodes, one per soname; the first export of each name is `@@` this one.
const VERSIONS: [&str; 23] = [
    "libcudart.so.11.0",
    "libcudart.so.12",
    "libcudart.so.13",
    "libcublas.so.11",
    "libcublas.so.12",
    "libcublas.so.13",
    "libcurand.so.10",
    "libcusolver.so.11",
    "libcusolver.so.12",
    "libcusparse.so.11",
    "libcusparse.so.12",
    "libcudnn.so.9",
    "libcudnn_graph.so.9",
    "libcudnn_ops.so.9",
    "libcudnn_cnn.so.9",
    "libcudnn_adv.so.9",
    "libcudnn_ext.so.9",
    "libcublasLt.so.11",
    "libcublasLt.so.12",
    "libcublasLt.so.13",
    "libcufft.so.10",
    "libcufft.so.11",
    "libcufft.so.12",
];
const DEFAULT_VERSION: &str = "libcudart.so.12";

/// `target/<profile>/libphos_guest.so`, next to the `deps` directory this test runs from.
fn library() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable");
    // target/<profile>/deps/symbol_versions-<hash>
    let lib = exe.parent().and_then(Path::parent).expect("target/<profile>").join("libphos_guest.so");
    assert!(lib.exists(), "{} is missing: `cargo build -p phos-guestlib` builds it", lib.display());
    lib
}

fn run(cmd: &mut Command) -> Output {
    let out = cmd.output().unwrap_or_else(|e| panic!("running {cmd:?}: {e}"));
    assert!(out.status.success(), "{cmd:?} failed ({}):\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    out
}

fn readelf(args: &[&str], file: &Path) -> String {
    String::from_utf8(run(Command::new("readelf").arg("-W").args(args).arg(file)).stdout).unwrap()
}

/// One entry of `.dynsym`, as `readelf --dyn-syms` shows it.
#[derive(Debug)]
struct DynSym {
    value: String,
    /// The section index: `UND`, `ABS` or a number.
    ndx: String,
    name: String,
    version: Option<String>,
    /// `name@@version` (the default) rather than `name@version` (hidden).
    default: bool,
}

fn dynamic_symbols(file: &Path) -> Vec<DynSym> {
    let text = readelf(&["--dyn-syms"], file);
    let mut syms = Vec::new();
    for line in text.lines() {
        // "    76: 000000000003f410    26 FUNC    GLOBAL DEFAULT   13 cudaMalloc@@libcudart.so.12"
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() < 8 || !fields[0].ends_with(':') || fields[0].trim_end_matches(':').parse::<u32>().is_err() {
            continue;
        }
        let full = fields[7];
        let (name, version, default) = match full.split_once('@') {
            Some((name, rest)) => match rest.strip_prefix('@') {
                Some(v) => (name, Some(v.to_string()), true),
                None => (name, Some(rest.to_string()), false),
            },
            None => (full, None, false),
        };
        syms.push(DynSym {
            value: fields[1].to_string(),
            ndx: fields[6].to_string(),
            name: name.to_string(),
            version,
            default,
        });
    }
    assert!(!syms.is_empty(), "no dynamic symbols in {}:\n{text}", file.display());
    syms
}

/// The names of the version definitions (`.gnu.version_d`), less the base one (the file's).
fn version_definitions(file: &Path) -> Vec<String> {
    readelf(&["-V"], file)
        .lines()
        // "  0x001c: Rev: 1  Flags: none  Index: 2  Cnt: 1  Name: libcudart.so.12"
        .filter(|l| l.contains("Rev:") && !l.contains("Flags: BASE"))
        .filter_map(|l| l.split("Name:").nth(1))
        .map(|n| n.trim().to_string())
        .collect()
}

/// The version needs (`.gnu.version_r`) of a program: the versions it asks its libraries for.
fn version_needs(file: &Path) -> Vec<String> {
    readelf(&["-V"], file)
        .lines()
        // "  0x0010:   Name: libcudart.so.12  Flags: none  Version: 2"
        .filter(|l| l.contains("Name:") && l.contains("Version:") && !l.contains("Rev:"))
        .filter_map(|l| l.split("Name:").nth(1)?.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

/// The library's defined symbols by name: GNU ld's absolute symbols naming the version nodes
/// left out.
fn exports() -> BTreeMap<String, Vec<DynSym>> {
    let mut by_name: BTreeMap<String, Vec<DynSym>> = BTreeMap::new();
    for s in dynamic_symbols(&library()) {
        if s.ndx == "UND" || (s.ndx == "ABS" && VERSIONS.contains(&s.name.as_str())) {
            continue;
        }
        by_name.entry(s.name.clone()).or_default().push(s);
    }
    by_name
}

/// The functions the generated stubs of `api` export (`#[unsafe(no_mangle)]` in
/// OUT_DIR/<api>_guest.rs).
fn generated_exports(api: &str) -> BTreeSet<String> {
    let path = Path::new(env!("OUT_DIR")).join(format!("{api}_guest.rs"));
    let code = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let mut names = BTreeSet::new();
    let mut exported = false;
    for line in code.lines().map(str::trim) {
        if line == "#[unsafe(no_mangle)]" {
            exported = true;
        } else if exported && let Some(rest) = line.split_once("extern \"C\" fn ").map(|(_, r)| r) {
            names.insert(rest.split('(').next().unwrap().trim().to_string());
            exported = false;
        }
    }
    assert!(!names.is_empty(), "no #[unsafe(no_mangle)] functions in {}", path.display());
    names
}

#[test]
fn defines_the_version_node_of_each_soname() {
    let defined = version_definitions(&library());
    for v in VERSIONS {
        assert!(defined.iter().any(|d| d == v), "no version node {v}; the library defines {defined:?}");
    }
}

#[test]
fn every_export_has_each_version_at_one_address() {
    let exports = exports();
    for name in ["cudaMalloc", "cudaRuntimeGetVersion", "cudaLaunchKernel", "__cudaRegisterFatBinary", "cuInit"] {
        assert!(exports.contains_key(name), "{name} is not exported");
    }
    for (name, defs) in &exports {
        let versions: BTreeSet<&str> = defs.iter().filter_map(|d| d.version.as_deref()).collect();
        assert_eq!(versions, BTreeSet::from(VERSIONS), "versions of {name}: {defs:?}");
        assert_eq!(defs.len(), VERSIONS.len(), "{name} is defined more than once a version, or unversioned: {defs:?}");
        let defaults: Vec<&str> = defs.iter().filter(|d| d.default).filter_map(|d| d.version.as_deref()).collect();
        assert_eq!(defaults, [DEFAULT_VERSION], "{name}@@ (what dlsym finds): {defs:?}");
        assert!(
            defs.iter().all(|d| d.value == defs[0].value),
            "the versions of {name} are different functions: {defs:?}"
        );
    }
}

/// The version script keeps everything else local: no Rust std or runtime symbol, nothing but
/// what the generated stubs export.
#[test]
fn exports_nothing_but_the_cuda_api() {
    let exports: BTreeSet<String> = exports().into_keys().collect();
    let rust: Vec<&String> = exports
        .iter()
        .filter(|n| ["_ZN", "_R", "rust_", "__rust", "__rdl", "__rg_"].iter().any(|p| n.starts_with(p)))
        .collect();
    assert!(rust.is_empty(), "Rust symbols are exported: {rust:?}");
    let generated: BTreeSet<String> = generated_exports("cudart")
        .into_iter()
        .chain(generated_exports("cuda"))
        .chain(generated_exports("cublas"))
        .chain(generated_exports("curand"))
        .chain(generated_exports("cusolver"))
        .chain(generated_exports("cusparse"))
        .chain(generated_exports("cudnn"))
        .chain(generated_exports("cublaslt"))
        .chain(generated_exports("cufft"))
        .chain(generated_exports("nvml"))
        .collect();
    assert_eq!(exports, generated, "the exports are not exactly the generated stubs");
}

/// A scratch directory under the system's temporary directory, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("phos-symbol-versions-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }

    fn write(&self, name: &str, text: &str) -> PathBuf {
        let p = self.0.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// What nvcc's `-cudart shared` does, with a stand-in for NVIDIA's runtime: a program linked
/// against a library whose soname and version node are `version` asks for
/// `cudaRuntimeGetVersion@version`. Run with our library under that name, it must start
/// without the loader's warning and get the runtime version of that major (which the library
/// reads off the file name, with no server).
fn program_of_version_runs(version: &str) {
    let major: u32 = version.trim_start_matches("libcudart.so.").split('.').next().unwrap().parse().unwrap();
    let dir = Scratch::new(version);
    let stub_dir = dir.0.join("stub");
    let run_dir = dir.0.join("run");
    std::fs::create_dir_all(&stub_dir).unwrap();
    std::fs::create_dir_all(&run_dir).unwrap();

    let stub_src = dir.write("stub.c", "int cudaRuntimeGetVersion(int *v) { *v = 0; return 1; }\n");
    let stub_map = dir.write("stub.map", &format!("{version} {{ global: cudaRuntimeGetVersion; local: *; }};\n"));
    let stub = stub_dir.join(version);
    run(Command::new("cc")
        .args(["-shared", "-fPIC", &format!("-Wl,-soname,{version}")])
        .arg(format!("-Wl,--version-script={}", stub_map.display()))
        .arg("-o")
        .arg(&stub)
        .arg(&stub_src));

    let app_src = dir.write(
        "app.c",
        r#"#include <stdio.h>
extern int cudaRuntimeGetVersion(int *runtime_version);
int main(void) {
    int v = -1;
    int rc = cudaRuntimeGetVersion(&v);
    printf("%d %d\n", rc, v);
    return rc;
}
"#,
    );
    let app = dir.0.join("app");
    run(Command::new("cc").arg("-o").arg(&app).arg(&app_src).arg(&stub));
    let needs = version_needs(&app);
    assert!(needs.iter().any(|n| n == version), "the program does not ask for {version}: {needs:?}");

    std::os::unix::fs::symlink(library(), run_dir.join(version)).unwrap();
    let out = Command::new(&app)
        .env("LD_LIBRARY_PATH", &run_dir)
        .env_remove("PHOS_CUDA_ABI")
        .output()
        .expect("running the program");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{version}: the program failed ({})\nstdout: {stdout}\nstderr: {stderr}", out.status);
    assert!(!stderr.contains("no version information"), "{version}: the loader warns:\n{stderr}");
    let reported: u32 = stdout.split_whitespace().nth(1).and_then(|v| v.parse().ok()).expect("a version on stdout");
    assert_eq!(reported / 1000, major, "{version}: cudaRuntimeGetVersion reported {reported}");
}

#[test]
fn cuda11_program_runs_without_loader_warning() {
    program_of_version_runs("libcudart.so.11.0");
}

#[test]
fn cuda12_program_runs_without_loader_warning() {
    program_of_version_runs("libcudart.so.12");
}

#[test]
fn cuda13_program_runs_without_loader_warning() {
    program_of_version_runs("libcudart.so.13");
}

/// What frameworks do: `dlsym` (no version) and `dlvsym` (each version) find the same function.
#[test]
fn dlsym_and_dlvsym_find_each_export() {
    let dir = Scratch::new("dl");
    let src = dir.write(
        "dl.c",
        r#"#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
int main(int argc, char **argv) {
    void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!h) { fprintf(stderr, "dlopen: %s\n", dlerror()); return 2; }
    void *plain = dlsym(h, argv[2]);
    if (!plain) { fprintf(stderr, "dlsym %s: %s\n", argv[2], dlerror()); return 3; }
    for (int i = 3; i < argc; i++) {
        void *v = dlvsym(h, argv[2], argv[i]);
        if (v != plain) { fprintf(stderr, "dlvsym %s %s: %p, dlsym: %p\n", argv[2], argv[i], v, plain); return 4; }
    }
    if (dlvsym(h, argv[2], "libcudart.so.10.0")) { fprintf(stderr, "dlvsym finds a version not defined\n"); return 5; }
    return 0;
}
"#,
    );
    let exe = dir.0.join("dl");
    run(Command::new("cc").arg("-o").arg(&exe).arg(&src).arg("-ldl"));
    for name in ["cudaMalloc", "cudaRuntimeGetVersion", "__cudaRegisterFatBinary"] {
        run(Command::new(&exe).arg(library()).arg(name).args(VERSIONS).env_remove("PHOS_CUDA_ABI"));
    }
}

/// Every function any NVIDIA libcudart of CUDA 11.8, 12.9 or 13 exports is exported here too,
/// under the version node of each soname that has it, so that every program links and
/// loads (tests/abi/libcudart-exports.txt lists them).
#[test]
fn exports_every_function_of_nvidias_runtimes() {
    let list = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/abi/libcudart-exports.txt"))
        .expect("tests/abi/libcudart-exports.txt");
    let exports = exports();
    let mut missing = Vec::new();
    let mut checked = 0;
    for line in list.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty()) {
        let mut words = line.split_whitespace();
        let name = words.next().unwrap();
        for major in words {
            let node = VERSIONS.iter().find(|v| v.trim_start_matches("libcudart.so.").starts_with(major)).unwrap();
            checked += 1;
            let found = exports.get(name).is_some_and(|syms| syms.iter().any(|s| s.version.as_deref() == Some(*node)));
            if !found {
                missing.push(format!("{name}@{node}"));
            }
        }
    }
    assert!(checked > 1000, "the list is read");
    assert!(missing.is_empty(), "not exported: {missing:?}");
}

/// Every function NVIDIA's libcuda of driver 535 exports is exported too
/// (tests/abi/libcuda-exports.txt), so every program linked with `-lcuda` loads.
#[test]
fn exports_every_function_of_nvidias_driver() {
    let list = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/abi/libcuda-exports.txt"))
        .expect("tests/abi/libcuda-exports.txt");
    let exports = exports();
    let names: Vec<&str> = list.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty()).collect();
    assert!(names.len() > 500, "the list is read");
    let missing: Vec<&&str> = names.iter().filter(|n| !exports.contains_key(**n)).collect();
    assert!(missing.is_empty(), "not exported: {missing:?}");
}

/// Every function NVIDIA's libcublas exports (tests/abi/libcublas-exports.txt) is exported
/// under the version node of each cuBLAS soname that has it, so that programs linked with
/// `-lcublas` (and PyTorch's wheels) load.
#[test]
fn exports_every_function_of_nvidias_cublas() {
    exports_every_listed_function("libcublas", 1500);
}

/// The same for libcusolver (tests/abi/libcusolver-exports.txt), for programs linked with
/// `-lcusolver`.
#[test]
fn exports_every_function_of_nvidias_cusolver() {
    exports_every_listed_function("libcusolver", 1800);
}

/// The same for libcusparse (tests/abi/libcusparse-exports.txt), for programs linked with
/// `-lcusparse`.
#[test]
fn exports_every_function_of_nvidias_cusparse() {
    exports_every_listed_function("libcusparse", 900);
}

/// Every function NVIDIA's cuDNN 9 exports (tests/abi/libcudnn-exports.txt) is exported under
/// the version node of each of its files that has it (`libcudnn.so.9`, `libcudnn_graph.so.9`,
/// ...), so that programs and PyTorch's wheels load whichever file they name.
#[test]
fn exports_every_function_of_nvidias_cudnn() {
    let list = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/abi/libcudnn-exports.txt"))
        .expect("tests/abi/libcudnn-exports.txt");
    let exports = exports();
    let mut missing = Vec::new();
    let mut checked = 0;
    for line in list.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty()) {
        let mut words = line.split_whitespace();
        let name = words.next().unwrap();
        for file in words {
            let node = format!("{file}.so.9");
            checked += 1;
            let found = exports.get(name).is_some_and(|syms| syms.iter().any(|s| s.version.as_deref() == Some(&node)));
            if !found {
                missing.push(format!("{name}@{node}"));
            }
        }
    }
    assert!(checked > 400, "the list is read");
    assert!(missing.is_empty(), "not exported: {missing:?}");
}

/// The same for libcublasLt (tests/abi/libcublasLt-exports.txt), for programs linked with
/// `-lcublasLt` and PyTorch's wheels.
#[test]
fn exports_every_function_of_nvidias_cublaslt() {
    exports_every_listed_function("libcublasLt", 600);
}

/// The same for libcufft (tests/abi/libcufft-exports.txt), for programs linked with `-lcufft`.
#[test]
fn exports_every_function_of_nvidias_cufft() {
    exports_every_listed_function("libcufft", 150);
}

/// Every name of `tests/abi/<library>-exports.txt` is exported under `<library>.so.<major>`
/// for each major listed with it (at least `at_least` pairs are read).
fn exports_every_listed_function(library: &str, at_least: usize) {
    let file = format!("tests/abi/{library}-exports.txt");
    let list = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(&file)).expect(&file);
    let exports = exports();
    let mut missing = Vec::new();
    let mut checked = 0;
    for line in list.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty()) {
        let mut words = line.split_whitespace();
        let name = words.next().unwrap();
        for major in words {
            let node = format!("{library}.so.{major}");
            checked += 1;
            let found = exports.get(name).is_some_and(|syms| syms.iter().any(|s| s.version.as_deref() == Some(&node)));
            if !found {
                missing.push(format!("{name}@{node}"));
            }
        }
    }
    assert!(checked > at_least, "the list is read");
    assert!(missing.is_empty(), "not exported: {missing:?}");
}

/// Where this machine has NVIDIA's libcublas (a CUDA 11 toolkit's, as CI's), every function it
/// exports is in the list above, so the list stays what the library is.
#[test]
fn the_cublas_list_holds_the_installed_librarys_exports() {
    the_list_holds_the_installed_librarys_exports("libcublas", "cublas", "11");
}

/// The same for libcusolver.
#[test]
fn the_cusolver_list_holds_the_installed_librarys_exports() {
    the_list_holds_the_installed_librarys_exports("libcusolver", "cusolver", "11");
}

/// The same for libcusparse.
#[test]
fn the_cusparse_list_holds_the_installed_librarys_exports() {
    the_list_holds_the_installed_librarys_exports("libcusparse", "cusparse", "11");
}

/// The same for libcublasLt.
#[test]
fn the_cublaslt_list_holds_the_installed_librarys_exports() {
    the_list_holds_the_installed_librarys_exports("libcublasLt", "cublasLt", "11");
}

/// The same for libcufft (CUDA 11's is `libcufft.so.10`).
#[test]
fn the_cufft_list_holds_the_installed_librarys_exports() {
    the_list_holds_the_installed_librarys_exports("libcufft", "cufft", "10");
}

/// Every `prefix*` function of CUDA 11's `<library>.so.<major>` on this machine is listed with
/// that major.
fn the_list_holds_the_installed_librarys_exports(library: &str, prefix: &str, major: &str) {
    let installed = [
        format!("/usr/lib/x86_64-linux-gnu/{library}.so.{major}"),
        format!("/usr/local/cuda/lib64/{library}.so.{major}"),
    ]
    .into_iter()
    .map(PathBuf::from)
    .find(|p| p.exists());
    let Some(installed) = installed else { return };
    let file = format!("tests/abi/{library}-exports.txt");
    let list = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(&file)).expect(&file);
    let listed: BTreeSet<&str> = list
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.split_whitespace().skip(1).any(|m| m == major))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    let theirs: BTreeSet<String> = dynamic_symbols(&installed)
        .into_iter()
        .filter(|s| s.ndx != "UND" && s.name.starts_with(prefix))
        .map(|s| s.name)
        .collect();
    let unlisted: Vec<&String> = theirs.iter().filter(|n| !listed.contains(n.as_str())).collect();
    assert!(unlisted.is_empty(), "{} exports what the list lacks: {unlisted:?}", installed.display());
}

/// Build a C program from `src` (extra `cc` arguments after it) in `dir`.
fn build_c(dir: &Scratch, name: &str, src: &str, args: &[&Path]) -> PathBuf {
    let source = dir.write(&format!("{name}.c"), src);
    let exe = dir.0.join(name);
    run(Command::new("cc").arg("-o").arg(&exe).arg(&source).args(args).arg("-ldl"));
    exe
}

/// The driver API without a server: error names and texts, what a call before `cuInit`
/// answers, `cuInit` with no router, and an export Phos does not carry (answered
/// `CUDA_ERROR_NOT_SUPPORTED` and logged once, by name).
#[test]
fn the_driver_api_answers_as_nvidias_without_a_server() {
    let dir = Scratch::new("driver");
    let exe = build_c(
        &dir,
        "driver",
        r#"#include <dlfcn.h>
#include <stdio.h>
typedef int (*name_fn)(int, const char **);
int main(int argc, char **argv) {
    void *h = dlopen(argv[1], RTLD_NOW);
    if (!h) { fprintf(stderr, "dlopen: %s\n", dlerror()); return 2; }
    name_fn name = (name_fn)dlsym(h, "cuGetErrorName"), text = (name_fn)dlsym(h, "cuGetErrorString");
    int (*get)(int *, int) = (int (*)(int *, int))dlsym(h, "cuDeviceGet");
    int (*init)(unsigned) = (int (*)(unsigned))dlsym(h, "cuInit");
    int (*map)(unsigned, void **, void *) = (int (*)(unsigned, void **, void *))dlsym(h, "cuGraphicsMapResources");
    const char *s = 0;
    int r = name(1, &s);
    printf("%d %s\n", r, s);
    r = text(1, &s);
    printf("%d %s\n", r, s);
    r = name(999, &s);
    printf("%d %s\n", r, s);
    s = "unchanged";
    r = name(12345, &s);
    printf("%d %s\n", r, s ? s : "NULL");
    int d = -1;
    printf("%d\n", get(&d, 0));
    printf("%d\n", init(1));
    printf("%d\n", init(0));
    printf("%d\n", get(&d, 0));
    void *resource = 0;
    int first = map(1, &resource, 0);
    printf("%d %d\n", first, map(1, &resource, 0));
    return 0;
}
"#,
        &[],
    );
    let run_dir = dir.0.join("run");
    std::fs::create_dir_all(&run_dir).unwrap();
    std::os::unix::fs::symlink(library(), run_dir.join("libcuda.so.1")).unwrap();
    let out = Command::new(&exe)
        .arg("libcuda.so.1")
        .env("LD_LIBRARY_PATH", &run_dir)
        .env("PHOS_ENDPOINT", format!("unix:{}", dir.0.join("no-router.sock").display()))
        .env("PHOS_LOG", "warn")
        .output()
        .expect("running the program");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let expected = [
        "0 CUDA_ERROR_INVALID_VALUE",
        "0 invalid argument",
        "0 CUDA_ERROR_UNKNOWN",
        "1 NULL",
        // Not initialised; cuInit(1) is an invalid value; no router: no device; still not
        // initialised, as NVIDIA's driver answers after a cuInit that failed.
        "3",
        "1",
        "100",
        "3",
        "801 801",
    ];
    assert_eq!(stdout.lines().collect::<Vec<_>>(), expected, "stderr:\n{stderr}");
    let unsupported = "cuGraphicsMapResources is not supported by Phos; returning CUDA_ERROR_NOT_SUPPORTED";
    assert_eq!(stderr.matches(unsupported).count(), 1, "logged once, by name:\n{stderr}");
}

/// glibc loads a file once however it is reached: the runtime's and the driver's sonames as
/// symbolic links to the library, as hard links to it, and `dlopen` by another name all give
/// one loaded object, hence one guest core and one session per process.
#[test]
fn one_file_under_every_name_is_one_loaded_library() {
    let dir = Scratch::new("one");
    let exe = build_c(
        &dir,
        "one",
        r#"#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <stdio.h>
#include <string.h>
static int count(struct dl_phdr_info *info, size_t size, void *data) {
    (void)size;
    if (strstr(info->dlpi_name, "libcuda") || strstr(info->dlpi_name, "libphos_guest")) ++*(int *)data;
    return 0;
}
int main(int argc, char **argv) {
    void *a = dlopen(argv[1], RTLD_NOW);
    void *b = dlopen(argv[2], RTLD_NOW);
    if (!a || !b) { fprintf(stderr, "dlopen: %s\n", dlerror()); return 2; }
    int loaded = 0;
    dl_iterate_phdr(count, &loaded);
    Dl_info x, y;
    dladdr(dlsym(a, "cudaMalloc"), &x);
    dladdr(dlsym(b, "cuInit"), &y);
    printf("%s %d %s\n", a == b ? "same" : "different", loaded, x.dli_fbase == y.dli_fbase ? "one" : "two");
    return 0;
}
"#,
        &[],
    );
    let check = |how: &str, link: &dyn Fn(&Path, &Path) -> std::io::Result<()>, names: [&str; 2]| {
        let run_dir = dir.0.join(how);
        std::fs::create_dir_all(&run_dir).unwrap();
        for n in ["libcudart.so.12", "libcuda.so.1", "libcudart.so.11.0"] {
            link(&library(), &run_dir.join(n)).unwrap();
        }
        let out = Command::new(&exe).args(names).env("LD_LIBRARY_PATH", &run_dir).output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{how}: {stdout}{}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(stdout.trim(), "same 1 one", "{how} {names:?}");
    };
    check("symlinks", &|t, l| std::os::unix::fs::symlink(t, l), ["libcudart.so.12", "libcuda.so.1"]);
    check("symlinks-other-order", &|t, l| std::os::unix::fs::symlink(t, l), ["libcuda.so.1", "libcudart.so.11.0"]);
    // A hard link needs the same file system: the copy of the library in the scratch
    // directory is the target.
    let own = dir.0.join("libphos_guest.so");
    std::fs::copy(library(), &own).unwrap();
    check("hardlinks", &|_, l| std::fs::hard_link(&own, l), ["libcudart.so.12", "libcuda.so.1"]);
}

/// A program that needs `libcuda.so.1` before `libcudart.so.11.0` (what nvcc writes for
/// `-lcuda`) reaches the library first by the driver's name; it still presents the runtime
/// ABI the program was built for, found among the libraries the program needs.
#[test]
fn the_runtime_abi_is_found_when_the_driver_loads_first() {
    let dir = Scratch::new("driver-first");
    let stub_dir = dir.0.join("stub");
    let run_dir = dir.0.join("run");
    std::fs::create_dir_all(&stub_dir).unwrap();
    std::fs::create_dir_all(&run_dir).unwrap();
    let cuda_stub = dir.write("cuda.c", "int cuDriverGetVersion(int *v) { *v = 0; return 1; }\n");
    run(Command::new("cc")
        .args(["-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o"])
        .arg(stub_dir.join("libcuda.so.1"))
        .arg(&cuda_stub));
    let rt_stub = dir.write("rt.c", "int cudaRuntimeGetVersion(int *v) { *v = 0; return 1; }\n");
    let rt_map = dir.write("rt.map", "libcudart.so.11.0 { global: cudaRuntimeGetVersion; local: *; };\n");
    run(Command::new("cc")
        .args(["-shared", "-fPIC", "-Wl,-soname,libcudart.so.11.0"])
        .arg(format!("-Wl,--version-script={}", rt_map.display()))
        .arg("-o")
        .arg(stub_dir.join("libcudart.so.11.0"))
        .arg(&rt_stub));
    let app = dir.write(
        "app.c",
        r#"#include <stdio.h>
extern int cuDriverGetVersion(int *);
extern int cudaRuntimeGetVersion(int *);
int main(void) {
    int v = -1;
    int rc = cudaRuntimeGetVersion(&v);
    printf("%d %d %p\n", rc, v, (void *)cuDriverGetVersion);
    return rc;
}
"#,
    );
    let exe = dir.0.join("app");
    run(Command::new("cc")
        .arg("-o")
        .arg(&exe)
        .arg(&app)
        .arg(stub_dir.join("libcuda.so.1"))
        .arg(stub_dir.join("libcudart.so.11.0")));
    let needed = readelf(&["-d"], &exe);
    let order: Vec<&str> = needed.lines().filter(|l| l.contains("NEEDED") && l.contains("libcud")).collect();
    assert!(order.len() == 2 && order[0].contains("libcuda.so.1"), "the driver first: {order:?}");
    for n in ["libcuda.so.1", "libcudart.so.11.0"] {
        std::os::unix::fs::symlink(library(), run_dir.join(n)).unwrap();
    }
    let out = Command::new(&exe).env("LD_LIBRARY_PATH", &run_dir).env_remove("PHOS_CUDA_ABI").output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.starts_with("0 11080 "), "cudaRuntimeGetVersion of the CUDA 11 ABI: {stdout}");
}

/// Where this machine has NVIDIA's libcurand (a CUDA 11 toolkit's, as CI's), every function it
/// exports is exported under `libcurand.so.10` (cuRAND's soname in CUDA 11, 12 and 13), so
/// that programs linked with `-lcurand` load.
#[test]
fn exports_every_function_of_the_installed_curand() {
    let installed = ["/usr/lib/x86_64-linux-gnu/libcurand.so.10", "/usr/local/cuda/lib64/libcurand.so.10"]
        .into_iter()
        .map(Path::new)
        .find(|p| p.exists());
    let Some(installed) = installed else { return };
    let exports = exports();
    let theirs: BTreeSet<String> = dynamic_symbols(installed)
        .into_iter()
        .filter(|s| s.ndx != "UND" && s.name.starts_with("curand"))
        .map(|s| s.name)
        .collect();
    assert!(theirs.len() > 20, "{} is read", installed.display());
    let missing: Vec<&String> = theirs
        .iter()
        .filter(|n| {
            !exports
                .get(n.as_str())
                .is_some_and(|syms| syms.iter().any(|s| s.version.as_deref() == Some("libcurand.so.10")))
        })
        .collect();
    assert!(missing.is_empty(), "not exported @libcurand.so.10: {missing:?}");
}

/// Where this machine has NVIDIA's NVML (the driver's `libnvidia-ml.so.1`), every function it
/// exports is exported, so that programs linked with `-lnvidia-ml` load. NVIDIA's exports carry
/// no symbol versions, so a program's references are unversioned and bind to the default one.
#[test]
fn exports_every_function_of_the_installed_nvml() {
    let installed = ["/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1", "/usr/lib64/libnvidia-ml.so.1"]
        .into_iter()
        .map(Path::new)
        .find(|p| p.exists());
    let Some(installed) = installed else { return };
    let exports = exports();
    let theirs: BTreeSet<String> = dynamic_symbols(installed)
        .into_iter()
        .filter(|s| s.ndx != "UND" && s.name.starts_with("nvml"))
        .map(|s| s.name)
        .collect();
    assert!(theirs.len() > 100, "{} is read", installed.display());
    let missing: Vec<&String> = theirs.iter().filter(|n| !exports.contains_key(n.as_str())).collect();
    assert!(missing.is_empty(), "not exported: {missing:?}");
}
