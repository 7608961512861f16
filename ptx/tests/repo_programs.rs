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
    let mut checked = 0;
    for src in &sources {
        for arch in ["compute_60", "compute_70", "compute_80"] {
            let ptx = out.path().join(format!("{}-{arch}.ptx", src.file_stem().unwrap().to_string_lossy()));
            let status = Command::new(&nvcc)
                .args(["-ptx", &format!("-arch={arch}"), "-I"])
                .arg(&dir)
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
