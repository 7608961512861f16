//! The transports end to end: real programs over shared-memory rings and staging slots far
//! smaller than their data (full rings, copies in many chunks, many threads), a guest killed
//! in the middle of a staged copy, and the choice between shared memory and the socket.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use phos_tests::{RawGuest, TestRouter, build_program, build_program_from, built, cuda_dir, nvcc};

fn run_on(router: &TestRouter, transport: &str, exe: &Path, args: &[&str]) -> Output {
    Command::new(built("phosctl"))
        .args(["run", "--transport", transport, "--endpoint"])
        .arg(format!("unix:{}", router.socket().display()))
        .arg("--")
        .arg(exe)
        .args(args)
        .env("PHOS_GUEST_LIB", built("libphos_guest.so"))
        .output()
        .expect("running phosctl")
}

fn expected(name: &str) -> String {
    std::fs::read_to_string(cuda_dir().join("expected").join(format!("{name}.out"))).unwrap()
}

/// 4 KiB rings and 64 KiB staging slots: every 64 MiB copy of memory_ops takes a thousand
/// chunks through both slots, every frame of host_threads' eight threads waits for room.
#[test]
fn programs_cross_tiny_rings_and_staging_slots_unchanged() {
    let Some(nvcc) = nvcc() else { return };
    let router = TestRouter::start_with("emu", |c| {
        c.ring_bytes = 4096;
        c.staging_slot_bytes = 64 << 10;
    });
    for name in ["memory_ops", "host_threads", "vector_add", "streams_events"] {
        let exe = build_program(&nvcc, name, &["-arch=sm_70"]);
        let out = run_on(&router, "shm", &exe, &[]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{name}: {stderr}");
        assert_eq!(String::from_utf8_lossy(&out.stdout), expected(name), "{name}: {stderr}");
    }
}

/// tests/bench/copy_loop through `router` on shared memory, copying for a long while: the
/// program and the running `phosctl` (once the program has said it is copying).
fn start_copy_loop(router: &TestRouter, nvcc: &Path, stderr: Stdio) -> (std::path::PathBuf, std::process::Child) {
    let exe =
        build_program_from(nvcc, &Path::new(env!("CARGO_MANIFEST_DIR")).join("bench"), "copy_loop", &["-arch=sm_70"]);
    let mut child = Command::new(built("phosctl"))
        .args(["run", "--transport", "shm", "--endpoint"])
        .arg(format!("unix:{}", router.socket().display()))
        .arg("--")
        .arg(&exe)
        .arg("1000000")
        .env("PHOS_GUEST_LIB", built("libphos_guest.so"))
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "copying");
    (exe, child)
}

/// A guest killed while its copies stream through the staging slots: its server gives the
/// copy up, and the router serves everyone else.
#[test]
fn a_guest_killed_during_a_staged_copy_leaves_the_router_serving() {
    let Some(nvcc) = nvcc() else { return };
    let router = TestRouter::start_with("emu", |c| c.staging_slot_bytes = 64 << 10);
    let (exe, mut child) = start_copy_loop(&router, &nvcc, Stdio::null());
    std::thread::sleep(Duration::from_millis(100));
    // The program, not phosctl: phosctl waits for it.
    let program = router.router.sessions().first().expect("a session").pid;
    // SAFETY: sends a signal; touches no memory of this process.
    unsafe { libc::kill(program as i32, libc::SIGKILL) };
    let _ = child.wait();
    // Another guest gets a session and works.
    let mut other = RawGuest::connect(&router.socket(), None).expect("a new session");
    other.call(&phos_protocol::cudart::CudaMallocRequest { size: 1 << 20 }).expect("cudaMalloc");
    // And a program after it runs its copies to the end.
    let out = run_on(&router, "shm", &exe, &["3"]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "copying\ndone\n");
}

/// An API server that dies (not a checkpoint: the router ends the session) fails the
/// program's calls at once, instead of leaving them waiting for a restore that will not come.
#[test]
fn a_program_whose_server_dies_fails_promptly() {
    let Some(nvcc) = nvcc() else { return };
    let router = TestRouter::start("emu");
    let (_, mut child) = start_copy_loop(&router, &nvcc, Stdio::piped());
    // This router's API server: the one whose command line names the router's directory.
    let dir = router.socket().parent().unwrap().display().to_string();
    let server = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .find(|pid| {
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let cmd = String::from_utf8_lossy(&cmd);
            cmd.contains("phos-api-server") && cmd.contains(&dir)
        })
        .expect("the session's API server");
    let killed = std::time::Instant::now();
    // SAFETY: sends a signal; touches no memory of this process.
    unsafe { libc::kill(server, libc::SIGKILL) };
    let status = child.wait().unwrap();
    assert!(!status.success());
    assert!(killed.elapsed() < Duration::from_secs(30), "took {:?}", killed.elapsed());
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(stderr.contains("the session has ended"), "{stderr}");
}

/// With shared memory off at the router, `--transport shm` fails clearly and `auto` falls
/// back to the socket.
#[test]
fn shared_memory_can_be_refused_and_forced() {
    let Some(nvcc) = nvcc() else { return };
    let router = TestRouter::start_with("emu", |c| c.shared_memory = false);
    let exe = build_program(&nvcc, "vector_add", &["-arch=sm_70"]);
    let out = run_on(&router, "auto", &exe, &[]);
    assert!(out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stdout), expected("vector_add"));
    let out = run_on(&router, "shm", &exe, &[]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("does not offer shared memory"), "{stderr}");
}

/// Guests on another host reach the router over TCP and name their tenant with a token;
/// without the right token they get no session.
#[test]
fn guests_over_tcp_identify_with_a_token() {
    let Some(nvcc) = nvcc() else { return };
    let token = "0123456789abcdef-remote";
    let router = TestRouter::start_with("emu", |c| {
        c.listen_tcp = Some("127.0.0.1:0".parse().unwrap());
        // memory_ops' 64 MiB copies travel in frames over TCP.
        c.max_payload = 256 << 20;
        c.tenants = vec![phos_router::TenantConfig {
            name: "remote".into(),
            uids: vec![],
            socket: None,
            share: 1,
            quota: Default::default(),
            token: Some(token.into()),
        }];
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let addr = loop {
        if let Some(a) = router.router.tcp_addr() {
            break a;
        }
        assert!(std::time::Instant::now() < deadline, "the router did not listen on TCP");
        std::thread::sleep(Duration::from_millis(10));
    };
    let run = |name: &str, token: Option<&str>, transport: &str| {
        let exe = build_program(&nvcc, name, &["-arch=sm_70"]);
        let mut cmd = Command::new(built("phosctl"));
        cmd.args(["run", "--transport", transport, "--endpoint", &format!("tcp:{addr}"), "--"])
            .arg(exe)
            .env("PHOS_GUEST_LIB", built("libphos_guest.so"))
            .env_remove("PHOS_TENANT_TOKEN");
        if let Some(t) = token {
            cmd.env("PHOS_TENANT_TOKEN", t);
        }
        cmd.output().unwrap()
    };
    for (name, transport) in
        [("vector_add", "auto"), ("memory_ops", "auto"), ("host_threads", "auto"), ("vector_add", "tcp")]
    {
        let out = run(name, Some(token), transport);
        assert!(out.status.success(), "{name}: {}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(String::from_utf8_lossy(&out.stdout), expected(name), "{name}");
    }
    assert!(router.router.sessions().iter().any(|s| s.tenant.0 == "remote"), "the sessions are the token's tenant's");
    let out = run("vector_add", Some("0123456789abcdef-wrong"), "auto");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown tenant token"));
    let out = run("vector_add", None, "auto");
    assert!(!out.status.success());
    // Shared memory needs the router on this host's socket.
    let out = run("vector_add", Some(token), "shm");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("needs a router on this host"));
}

/// A request over the router's frame limit fails at once with an error (over the socket;
/// over shared memory large copies do not travel in frames at all).
#[test]
fn a_request_over_the_routers_limit_fails_at_once() {
    let Some(nvcc) = nvcc() else { return };
    let router = TestRouter::start_with("emu", |c| c.max_payload = 2 << 20);
    let exe = build_program(&nvcc, "vector_add", &["-arch=sm_70"]);
    let t = std::time::Instant::now();
    let out = run_on(&router, "unix", &exe, &[]);
    assert!(t.elapsed() < Duration::from_secs(60), "no retrying until the reconnect timeout");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("invalid argument"));
    assert!(String::from_utf8_lossy(&out.stderr).contains("over the router's limit"));
    // The same program over shared memory: its 4 MiB copies go through the staging slots.
    let out = run_on(&router, "shm", &exe, &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout), expected("vector_add"));
}
