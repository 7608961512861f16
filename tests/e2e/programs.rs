//! Real CUDA programs, built with nvcc, run end to end through `phosctl run` on the `emu`
//! backend: guest library, router, API server.

use phos_tests::{build_program, nvcc, phos_run};

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

#[test]
fn memory_ops() {
    let out = run_passes("memory_ops");
    if !out.is_empty() {
        assert!(out.contains("1000 small allocations ok"));
    }
}

#[test]
fn device_query() {
    let out = run_passes("device_query");
    if !out.is_empty() {
        assert!(out.contains("warpSize=32"));
        assert!(out.contains("cudaSetDevice(count): cudaErrorInvalidDevice"));
        assert!(out.contains("cudaGetDeviceCount(NULL): cudaErrorInvalidValue"));
    }
}

#[test]
fn exit_code_is_the_programs() {
    let out = std::process::Command::new(phos_tests::built("phosctl"))
        .args(["run", "--backend", "emu", "--", "sh", "-c", "exit 7"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(7));
}
