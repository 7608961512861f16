//! Every CUDA program of the repository (tests/cuda/*.cu), compiled to PTX for several
//! virtual architectures, parses, prints and parses back to the same module, and yields a
//! signature for each kernel.

use std::path::{Path, PathBuf};
use std::process::Command;

fn nvcc() -> Option<PathBuf> {
    let found = std::env::var_os("PATH")
        .and_then(|paths| std::env::split_paths(&paths).map(|d| d.join("nvcc")).find(|p| p.exists()));
    if found.is_none() {
        assert!(std::env::var("PHOS_REQUIRE_NVCC").as_deref() != Ok("1"), "nvcc required but not on PATH");
        eprintln!("nvcc not found: skipping");
    }
    found
}

#[test]
fn repository_programs_round_trip() {
    let Some(nvcc) = nvcc() else { return };
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/cuda");
    let out = tempfile::tempdir().unwrap();
    let mut sources: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "cu"))
        .collect();
    sources.sort();
    assert!(sources.len() >= 10, "the test programs are in {}", dir.display());
    // A program whose first line says `// Needs CUDA X.Y` (tests/e2e/programs.rs,
    // NEEDS_NEWER_CUDA) is left out where this nvcc is older.
    let release = nvcc_release(&nvcc);
    sources.retain(|src| match needs_cuda(src) {
        Some(needed) if release < needed => {
            eprintln!(
                "skipped {}: it needs CUDA {}.{} and nvcc here is {}.{}",
                src.display(),
                needed.0,
                needed.1,
                release.0,
                release.1
            );
            false
        }
        _ => true,
    });
    let mut checked = 0;
    for src in &sources {
        for arch in ["compute_60", "compute_70", "compute_80"] {
            let ptx = out.path().join(format!("{}-{arch}.ptx", src.file_stem().unwrap().to_string_lossy()));
            let status = Command::new(&nvcc)
                .args(["-ptx", &format!("-arch={arch}"), "-I"])
                .arg(&dir)
                .args(own_flags(src))
                .arg("-o")
                .arg(&ptx)
                .arg(src)
                .status()
                .unwrap();
            assert!(status.success(), "nvcc -ptx {} for {arch}", src.display());
            let text = std::fs::read_to_string(&ptx).unwrap();
            let module = phos_ptx::parse(&text).unwrap_or_else(|e| panic!("{}: {e}", ptx.display()));
            let printed = module.to_string();
            let again = phos_ptx::parse(&printed).unwrap_or_else(|e| panic!("reparse {}: {e}", ptx.display()));
            assert!(module.eq_ignoring_lines(&again), "{} does not round-trip", ptx.display());
            let entries = text.matches(".entry ").count();
            assert_eq!(phos_ptx::signatures(&module).len(), entries, "{}: a signature per kernel", ptx.display());
            checked += 1;
        }
    }
    assert_eq!(checked, sources.len() * 3);
}

/// The release of `nvcc` (major, minor).
fn nvcc_release(nvcc: &Path) -> (u32, u32) {
    let out = Command::new(nvcc).arg("--version").output().expect("running nvcc --version");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let release = text.split("release ").nth(1).and_then(|r| r.split(',').next()).expect("nvcc names its release");
    parse_version(release).expect("nvcc's release is MAJOR.MINOR")
}

/// The CUDA release a program's first line says it needs (`// Needs CUDA X.Y ...`).
fn needs_cuda(src: &Path) -> Option<(u32, u32)> {
    let text = std::fs::read_to_string(src).ok()?;
    let first = text.lines().next()?;
    let version = first.strip_prefix("// Needs CUDA ")?.split_whitespace().next()?;
    parse_version(version)
}

/// The nvcc flags a program asks for itself (a line `// nvcc flags: --extended-lambda`), as
/// tests/e2e/programs.rs and tests/scripts/cuda-link-flags.sh read them.
fn own_flags(src: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(src).unwrap_or_default();
    text.lines()
        .filter_map(|l| l.strip_prefix("// nvcc flags:"))
        .flat_map(|f| f.split_whitespace().map(str::to_string).collect::<Vec<_>>())
        .collect()
}

fn parse_version(v: &str) -> Option<(u32, u32)> {
    let (major, minor) = v.trim_end_matches(|c: char| !c.is_ascii_digit()).split_once('.')?;
    Some((major.parse().ok()?, minor.parse().ok()?))
}
