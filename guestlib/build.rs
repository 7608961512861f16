//! Generates the `extern "C"` exports of every API from its spec (phos-codegen's
//! `emit::guest`: `cudart_guest.rs`, `cuda_guest.rs`), and links `libphos_guest.so` with the
//! symbol versions of NVIDIA's runtimes ([`symbol_versions`]).

use std::path::PathBuf;
use std::process::Command;

/// The version node of each soname the library is installed as (phosctl's `SONAMES`).
/// Exports are `sym@@DEFAULT_VERSION` plus the aliases `sym@<other>`.
const DEFAULT_VERSION: &str = "libcudart.so.12";
/// cuBLAS's exports are in the same file, installed as `libcublas.so.11`, `.12` and `.13`,
/// whose programs ask for `cublasSgemm_v2@libcublas.so.11` and so on: every export gets those
/// versions too (a name the other library lacks is never asked for under its version). So do
/// cuRAND's (`libcurand.so.10`) and cuSOLVER's, installed as `libcusolver.so.11` (CUDA 11 and 12)
/// and `libcusolver.so.12` (CUDA 13), cuSPARSE's, installed as `libcusparse.so.11` (CUDA 11)
/// and `libcusparse.so.12` (CUDA 12 and 13), and cuDNN's, installed as `libcudnn.so.9` and as
/// each of its sub-libraries (whose programs ask for `cudnnBackendExecute@libcudnn_graph.so.9`),
/// cuBLASLt's (`libcublasLt.so.11`, `.12`, `.13`), and cuFFT's, installed as `libcufft.so.10`,
/// `.11` and `.12` (CUDA 11, 12 and 13).
const OTHER_VERSIONS: [&str; 22] = [
    "libcudart.so.11.0",
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

fn main() {
    for api in phos_codegen::build_support::load_specs(phos_spec::SPEC_PATHS) {
        phos_codegen::build_support::write_out(
            &format!("{}_guest.rs", api.name),
            &phos_codegen::emit::guest::emit(&api),
        );
    }
    symbol_versions();
}

/// Programs built by nvcc with `-cudart shared` ask for versioned symbols
/// (`cudaMalloc@libcudart.so.12`) and name the version in a verneed entry. A library without
/// version definitions still satisfies them, but glibc then prints "no version information
/// available" on every start; one that lacks a version asked for cannot be loaded at all. So
/// the library defines the nodes `libcudart.so.11.0`, `.12` and `.13`, and gives every export
/// all three versions (`cudaMalloc@@libcudart.so.12`, `cudaMalloc@libcudart.so.11.0`,
/// `cudaMalloc@libcudart.so.13`, one address): a reference of any version finds an exact
/// match, and so do `dlsym` (the `@@` default) and `dlvsym(h, "cudaMalloc", "libcudart.so.11.0")`.
/// Exporting them unversioned (version index 1) next to the nodes would satisfy the loader,
/// but not `dlvsym`, which accepts only an exact version.
///
/// The versions are the link's business, and rustc owns the version script: it passes its
/// own anonymous one (`{ global: <exports>; local: *; };`), which no other version script can
/// be combined with in GNU ld. So this one link (`rustc-cdylib-link-arg`: not the rlib, not
/// the tests, not other crates) runs through `link/ld.bfd.sh`, which turns rustc's script
/// into the named nodes and the aliases and then runs GNU ld. The C compiler that rustc
/// links with finds it by its own lookup: `-fuse-ld=bfd` (after rustc's own `-fuse-ld=lld`
/// on x86_64 Linux; the last one wins) makes it run `ld.bfd`, which it looks for in the `-B`
/// directories before `PATH`, and rustc's `-B` directory holds only `ld.lld`. GNU ld rather
/// than rustc's lld because it comes with gcc on every Linux build machine, whatever the
/// target or the linker settings of the rest of the build.
///
/// Routes not taken: `.symver` in `global_asm!` still needs the nodes in a version script,
/// and works only in the object file that defines the function; an `ld` wrapper without
/// `-fuse-ld=bfd` is never run while rustc links with lld; rust-lld happens to accept an
/// extra version script next to rustc's anonymous one, but GNU ld (other targets, or a build
/// that turns rust-lld off) fails the link.
fn symbol_versions() {
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() != Ok("linux") {
        return;
    }
    let template = include_str!("link/ld.bfd.sh");
    let real_ld = gnu_ld();
    let script = template
        .replace("@REAL_LD@", &shell_quoted(&real_ld.display().to_string()))
        .replace("@DEFAULT_VERSION@", DEFAULT_VERSION)
        .replace("@OTHER_VERSIONS@", &OTHER_VERSIONS.join(" "));
    let dir = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR is set by cargo")).join("gnu-ld");
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
    let wrapper = dir.join("ld.bfd");
    std::fs::write(&wrapper, script).unwrap_or_else(|e| panic!("writing {}: {e}", wrapper.display()));
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755))
        .unwrap_or_else(|e| panic!("making {} executable: {e}", wrapper.display()));
    println!("cargo:rustc-cdylib-link-arg=-B{}/", dir.display());
    println!("cargo:rustc-cdylib-link-arg=-fuse-ld=bfd");
}

/// GNU ld: where the C compiler that links (`RUSTC_LINKER`, else `cc`) would take `ld.bfd`
/// from, else `ld.bfd` on `PATH`.
fn gnu_ld() -> PathBuf {
    let driver = std::env::var("RUSTC_LINKER").unwrap_or_else(|_| "cc".to_string());
    let named = Command::new(&driver)
        .arg("-print-prog-name=ld.bfd")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()));
    if let Some(p) = named.filter(|p| p.is_absolute() && p.is_file()) {
        return p;
    }
    std::env::var_os("PATH")
        .and_then(|paths| std::env::split_paths(&paths).map(|d| d.join("ld.bfd")).find(|p| p.is_file()))
        .unwrap_or_else(|| {
            panic!(
                "GNU ld (ld.bfd, from binutils) is needed to link libphos_guest.so; neither `{driver}` nor PATH has it"
            )
        })
}

/// `s` as one POSIX shell word.
fn shell_quoted(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}
