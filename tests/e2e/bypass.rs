//! No bypass: whatever run paths a program's libraries carry, and however they load the CUDA
//! runtime, a program run through `phosctl run` gets Phos's; a CUDA runtime that is not
//! Phos's and gets mapped all the same is reported (the audit module, the guest library, the
//! router: `phosctl sessions`, `top`, the metrics); NVIDIA's runtime linked into a program
//! (`-cudart static`) is named with what to do.
//!
//! The CUDA runtime that must not be used is a stand-in (tests/bypass/stand_in_runtime.c)
//! that answers 42 devices and version 999, so each test can tell from a program's output
//! which runtime its calls reached; each also shows, without `phosctl run`, that the stand-in
//! is what the program would get (so the test can fail).

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use phos_tests::{TestRouter, build_static_program, built, cc, nvcc, phos_run, router_log};

fn sources() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("bypass")
}

fn source(name: &str) -> PathBuf {
    sources().join(name)
}

/// The stand-in runtime built as `path`, with `soname`.
fn stand_in(path: &Path, soname: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let soname = format!("-Wl,-soname,{soname}");
    cc(&[
        "-shared".as_ref(),
        "-fPIC".as_ref(),
        soname.as_ref(),
        "-o".as_ref(),
        path.as_os_str(),
        source("stand_in_runtime.c").as_os_str(),
    ]);
}

/// A directory where Phos's guest library is every runtime's name, as `LD_LIBRARY_PATH`
/// alone offered it before the audit module.
fn guest_links(dir: &Path) -> PathBuf {
    let links = dir.join("phos-links");
    std::fs::create_dir_all(&links).unwrap();
    for name in ["libcudart.so.11.0", "libcudart.so.12", "libcudart.so.13", "libcuda.so.1"] {
        std::os::unix::fs::symlink(built("libphos_guest.so"), links.join(name)).unwrap();
    }
    links
}

fn stdout_of(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A program's library finds a stand-in `libcudart.so.11.0` through its `DT_RPATH`, which the
/// loader searches before `LD_LIBRARY_PATH`: through `phosctl run` its calls reach Phos (the
/// emulated device, the CUDA 11 runtime's version) and the stand-in is not even mapped.
#[test]
fn a_run_path_to_another_runtime_gets_phos_s() {
    let dir = tempfile::tempdir().unwrap();
    let fake = dir.path().join("fake");
    stand_in(&fake.join("libcudart.so.11.0"), "libcudart.so.11.0");
    let lib = dir.path().join("lib");
    std::fs::create_dir_all(&lib).unwrap();
    let rpath = format!("-Wl,--disable-new-dtags,-rpath,{}", fake.display());
    let link_fake = format!("-L{}", fake.display());
    cc(&[
        "-shared".as_ref(),
        "-fPIC".as_ref(),
        "-o".as_ref(),
        lib.join("libuses.so").as_os_str(),
        source("uses_runtime.c").as_os_str(),
        link_fake.as_ref(),
        "-l:libcudart.so.11.0".as_ref(),
        rpath.as_ref(),
    ]);
    let program = dir.path().join("rpath_program");
    let link_lib = format!("-L{}", lib.display());
    let rpath_lib = format!("-Wl,-rpath,{}", lib.display());
    cc(&[
        "-o".as_ref(),
        program.as_os_str(),
        source("rpath_program.c").as_os_str(),
        link_lib.as_ref(),
        "-luses".as_ref(),
        rpath_lib.as_ref(),
    ]);
    let fake_dir = fake.display().to_string();

    // Without the audit module, Phos's library first on LD_LIBRARY_PATH loses to the run path.
    let alone = Command::new(&program).arg(&fake_dir).env("LD_LIBRARY_PATH", guest_links(dir.path())).output().unwrap();
    assert_eq!(stdout_of(&alone), "devices 42\nruntime 999\nstand-in mapped: yes\n", "the run path wins without it");

    let out = phos_run("emu", &program, &[&fake_dir]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(stdout_of(&out), "devices 1\nruntime 11080\nstand-in mapped: no\n", "Phos's runtime:\n{stderr}");
    assert!(!stderr.contains("bypass"), "nothing to report:\n{stderr}");
}

/// A program maps a CUDA runtime that is not Phos's by its full path, under a name Phos does
/// not replace (a renamed copy: its soname says what it is), then uses Phos's: the audit
/// module says so at once, the guest library when its session opens, the router marks the
/// session bypassed (`phosctl sessions`, `top`, the metrics) until it ends, and `phosctl run`
/// names it when the program has exited.
#[test]
fn a_runtime_mapped_by_its_full_path_is_reported_and_the_session_bypassed() {
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("stand-in-runtime.so");
    stand_in(&copy, "libcudart.so.11.0");
    let program = dir.path().join("dlopen_program");
    cc(&["-o".as_ref(), program.as_os_str(), source("dlopen_program.c").as_os_str(), "-ldl".as_ref()]);
    let router = TestRouter::start("emu");
    let endpoint = format!("unix:{}", router.socket().display());
    let mut child = Command::new(built("phosctl"))
        .args(["run", "--endpoint", &endpoint, "--"])
        .arg(&program)
        .arg(&copy)
        .env("PHOS_GUEST_LIB", built("libphos_guest.so"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut printed = Vec::new();
    for line in lines.by_ref() {
        let line = line.unwrap();
        let ready = line == "ready";
        printed.push(line);
        if ready {
            break;
        }
    }
    assert_eq!(printed, ["devices 1 (status 0)", "ready"], "Phos's runtime answered");

    let phosctl = |args: &[&str]| {
        let out = Command::new(built("phosctl")).args(args).args(["--router", &endpoint]).output().unwrap();
        assert!(out.status.success(), "phosctl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        stdout_of(&out)
    };
    let sessions = phosctl(&["sessions"]);
    let row = sessions.lines().find(|l| l.contains("dlopen_program")).unwrap_or_else(|| panic!("{sessions}"));
    assert!(row.contains("BYPASSED"), "{sessions}");
    let finding = format!("{} (soname libcudart.so.11.0)", copy.display());
    assert!(
        sessions.contains(&format!("bypass: a CUDA runtime or driver that is not Phos's is mapped: {finding}")),
        "{sessions}"
    );

    // SAFETY: getuid has no memory effects.
    let tenant = format!("uid:{}", unsafe { libc::getuid() });
    let top = phosctl(&["top", "--once", "--interval", "0.1"]);
    let header: Vec<&str> = top.lines().next().unwrap_or_default().split_whitespace().collect();
    let column = header.iter().position(|h| *h == "bypassed").unwrap_or_else(|| panic!("{top}"));
    let tenant_row: Vec<&str> =
        top.lines().find(|l| l.starts_with(&tenant)).unwrap_or_else(|| panic!("{top}")).split_whitespace().collect();
    assert_eq!(tenant_row[column], "1", "{top}");
    let gauge = |n: u64| format!("phos_tenant_sessions_bypassed{{tenant=\"{tenant}\"}} {n}");
    assert!(phos_router::metrics::render(&router.router).contains(&gauge(1)));

    child.stdin.take().unwrap().write_all(b"done\n").unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    for said in [
        // The audit module, as the copy was mapped.
        format!("mapped {}, a CUDA runtime or driver that is not Phos's (soname libcudart.so.11.0)", copy.display()),
        // The guest library, when its session opened.
        format!("a CUDA runtime or driver that is not Phos's is mapped in this process: {finding}"),
        // phosctl, when the program had exited.
        format!("mapped a CUDA runtime or driver that is not Phos's, {finding}, beside Phos's library"),
    ] {
        assert!(stderr.contains(&said), "`{said}` not in:\n{stderr}");
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while !phos_router::metrics::render(&router.router).contains(&gauge(0)) {
        assert!(Instant::now() < deadline, "the ended session still counts as bypassed");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A Python process with a framework wheel's layout: the wheel's `libcudart.so.12` preloaded
/// by its full path (as PyTorch does) and a library that needs it through its `$ORIGIN` run
/// path. Through `phosctl run` both are Phos's.
#[test]
fn a_python_wheel_layout_gets_phos_s() {
    let dir = tempfile::tempdir().unwrap();
    let site = dir.path().join("site-packages");
    let wheel_lib = site.join("nvidia/cuda_runtime/lib");
    stand_in(&wheel_lib.join("libcudart.so.12"), "libcudart.so.12");
    let model = site.join("model/lib");
    std::fs::create_dir_all(&model).unwrap();
    let link_wheel = format!("-L{}", wheel_lib.display());
    cc(&[
        "-shared".as_ref(),
        "-fPIC".as_ref(),
        "-o".as_ref(),
        model.join("libmodel.so").as_os_str(),
        source("uses_runtime.c").as_os_str(),
        link_wheel.as_ref(),
        "-l:libcudart.so.12".as_ref(),
        "-Wl,-rpath,$ORIGIN/../../nvidia/cuda_runtime/lib".as_ref(),
    ]);
    let script = source("wheel_layout.py");
    let site_arg = site.display().to_string();

    let alone = Command::new("python3")
        .arg(&script)
        .arg(&site_arg)
        .env("LD_LIBRARY_PATH", guest_links(dir.path()))
        .output()
        .expect("python3 (part of the test set-up)");
    assert_eq!(stdout_of(&alone), "devices 42\nruntime 999\nstand-in mapped: yes\n", "the preload wins without it");

    let out = phos_run("emu", Path::new("python3"), &[script.to_str().unwrap(), &site_arg]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(stdout_of(&out), "devices 1\nruntime 12090\nstand-in mapped: no\n", "Phos's runtime:\n{stderr}");
}

/// A process that maps a CUDA runtime Phos does not replace and never loads Phos's library,
/// and loads an NVIDIA library Phos does not serve yet: `phosctl run` says both when the
/// program has exited.
#[test]
fn a_process_without_phos_and_unserved_libraries_are_named_at_exit() {
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("stand-in-runtime.so");
    stand_in(&copy, "libcudart.so.12");
    let nccl = dir.path().join("libnccl.so.2");
    stand_in(&nccl, "libnccl.so.2");
    let load = format!("import ctypes; ctypes.CDLL({:?}); ctypes.CDLL({:?})", copy.display(), nccl.display());
    let out = phos_run("emu", Path::new("python3"), &["-c", &load]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    for said in [
        format!("{} (soname libcudart.so.12), and never loaded Phos's library", copy.display()),
        format!("loaded NVIDIA libraries that Phos does not serve yet: NCCL ({})", nccl.display()),
    ] {
        assert!(stderr.contains(&said), "`{said}` not in:\n{stderr}");
    }
}

/// A program built with nvcc's default, NVIDIA's CUDA runtime linked in (`-cudart static`),
/// finds Phos's driver library and asks it for the driver's private tables: its calls fail,
/// the user is told why and how to build it, and the router marks the session bypassed.
#[test]
fn a_program_with_the_runtime_linked_in_is_told_what_to_do() {
    let Some(nvcc) = nvcc() else { return };
    let exe = build_static_program(&nvcc, "vector_add", &["-arch=sm_70"]);
    let router = TestRouter::start("emu");
    router_log();
    let out = Command::new(built("phosctl"))
        .args(["run", "--endpoint", &format!("unix:{}", router.socket().display()), "--"])
        .arg(&exe)
        .env("PHOS_GUEST_LIB", built("libphos_guest.so"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "its CUDA calls cannot succeed:\n{stderr}");
    for said in [
        format!("NVIDIA's own CUDA runtime, built into {} (the program), asked Phos's driver library", exe.display()),
        "Build it with `nvcc -cudart shared`".to_string(),
    ] {
        assert!(stderr.contains(&said), "`{said}` not in:\n{stderr}");
    }
    let log = router_log();
    assert!(
        log.lines().any(|l| l.contains("session bypassed: NVIDIA's own CUDA runtime, built into")
            && l.contains(exe.to_str().unwrap())),
        "{log}"
    );
}

/// tests/python/check_no_bypass.py, which the GPU suite runs with PyTorch through `phosctl
/// run`, tells a process whose CUDA runtime is Phos's from one that has another mapped (here
/// without PyTorch: the check alone, after loading a runtime by name or a renamed copy).
#[test]
fn the_python_check_tells_phos_s_runtime_from_another() {
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("renamed-runtime.so");
    stand_in(&copy, "libcudart.so.13");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("python/check_no_bypass.py");
    let check = |load: &str| {
        let out = phos_run("emu", Path::new("python3"), &[script.to_str().unwrap(), "--without-torch", "--load", load]);
        (out.status.code(), stdout_of(&out), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let (code, stdout, stderr) = check("libcudart.so.13");
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    assert!(stdout.contains("no bypass: the CUDA runtime and driver mapped are Phos's"), "{stdout}");
    let (code, _, stderr) = check(copy.to_str().unwrap());
    assert_eq!(code, Some(1), "{stderr}");
    let named = format!(
        "BYPASS: a CUDA runtime or driver that is not Phos's is mapped: {} (soname libcudart.so.13)",
        copy.display()
    );
    assert!(stderr.contains(&named), "{stderr}");
}

/// PyTorch's `torch.cuda.device_count()` before CUDA starts, exactly (`_raw_device_count_nvml`:
/// ctypes loads `libnvidia-ml.so.1` by name, `nvmlInit`, `nvmlDeviceGetCount_v2`), and the same
/// by a full path: through `phosctl run` both reach Phos's NVML (one emulated device), NVIDIA's
/// (a stand-in here) is never mapped, and nothing marks the session bypassed.
#[test]
fn pytorch_s_nvml_device_count_gets_phos_s() {
    let dir = tempfile::tempdir().unwrap();
    let lib_dir = dir.path().join("driver");
    let theirs = lib_dir.join("libnvidia-ml.so.1");
    std::fs::create_dir_all(&lib_dir).unwrap();
    cc(&[
        "-shared".as_ref(),
        "-fPIC".as_ref(),
        "-Wl,-soname,libnvidia-ml.so.1".as_ref(),
        "-o".as_ref(),
        theirs.as_os_str(),
        source("stand_in_nvml.c").as_os_str(),
    ]);
    let script = |name: &str| {
        format!(
            "import ctypes\n\
             nvml = ctypes.CDLL({name:?})\n\
             count = ctypes.c_int(-1)\n\
             print(nvml.nvmlInit(), nvml.nvmlDeviceGetCount_v2(ctypes.byref(count)), count.value)\n\
             mapped = any(l.rstrip().endswith({:?}) for l in open('/proc/self/maps'))\n\
             print('stand-in mapped:', 'yes' if mapped else 'no')\n",
            theirs.display().to_string()
        )
    };
    let alone = Command::new("python3")
        .args(["-c", &script("libnvidia-ml.so.1")])
        .env("LD_LIBRARY_PATH", &lib_dir)
        .output()
        .expect("python3 (part of the test set-up)");
    assert_eq!(stdout_of(&alone), "0 0 42\nstand-in mapped: yes\n", "the stand-in is what the name finds without it");

    // The library path leads to the stand-in, as the driver's directory would.
    let path = format!("LD_LIBRARY_PATH={}", lib_dir.display());
    for name in ["libnvidia-ml.so.1".to_string(), theirs.display().to_string()] {
        let out = phos_run("emu", Path::new("env"), &[&path, "python3", "-c", &script(&name)]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{stderr}");
        assert_eq!(stdout_of(&out), "0 0 1\nstand-in mapped: no\n", "Phos's NVML for {name}:\n{stderr}");
        assert!(!stderr.contains("bypass") && !stderr.contains("NVML"), "nothing to report for {name}:\n{stderr}");
    }
}
