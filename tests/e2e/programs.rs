//! Real CUDA programs, built with nvcc, run end to end through `phosctl run` on the `emu`
//! backend: guest library, router, API server.

use phos_tests::{build_program, nvcc, phos_run};

/// What the program prints natively on a GPU (recorded by tests/scripts/gpu-suite.sh with the
/// CUDA 11.8 build, the toolkit CI has).
fn expected(name: &str) -> String {
    std::fs::read_to_string(phos_tests::cuda_dir().join("expected").join(format!("{name}.out"))).unwrap()
}

fn run_passes(name: &str) -> String {
    let Some(nvcc) = nvcc() else { return String::new() };
    let exe = build_program(&nvcc, name, &[]);
    let out = phos_run("emu", &exe, &[]);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{name} failed ({:?})\nstdout:\n{stdout}\nstderr:\n{stderr}", out.status);
    assert!(stdout.ends_with("PASS\n"), "{name}: {stdout}");
    assert!(stderr.contains("backend emu"), "phosctl names its backend first: {stderr}");
    stdout
}

/// Runs `name` on emu and compares its output with the native GPU's.
fn same_as_native(name: &str) {
    let out = run_passes(name);
    if !out.is_empty() {
        assert_eq!(out, expected(name), "{name}: output differs from the native run");
    }
}

#[test]
fn memory_ops() {
    same_as_native("memory_ops");
}

#[test]
fn device_query() {
    same_as_native("device_query");
}

#[test]
fn exit_code_is_the_programs() {
    let out = std::process::Command::new(phos_tests::built("phosctl"))
        .args(["run", "--backend", "emu", "--", "sh", "-c", "exit 7"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(7));
}
