//! A tenant's session cannot make its server hold unbounded objects or write an unbounded
//! log, and what no device could honour fails the call instead of the program: per-session
//! limits (refused with cudaErrorMemoryAllocation, logged, counted in the router's metrics),
//! a flood of bad calls (a bounded log saying how much it dropped), huge strided copies and
//! device limits, a handshake with an ABI no guest has, and an API server that crashes (the
//! router says how it died). Another session runs alongside each to its correct end, and the
//! router serves afterwards.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use phos_protocol::cudart::*;
use phos_protocol::limits::LimitKind;
use phos_protocol::transport::Transport;
use phos_protocol::{CudaError, FrameHeader, FrameKind};
use phos_tests::{
    RawGuest, TestRouter, build_program, build_program_from, built, cuda_dir, hostile_dir, nvcc, router_log,
};

/// vector_add on `router`, to run beside a test's session.
fn neighbour(router: &TestRouter, nvcc: &Path) -> Child {
    Command::new(built("phosctl"))
        .args(["run", "--endpoint"])
        .arg(format!("unix:{}", router.socket().display()))
        .arg("--")
        .arg(build_program(nvcc, "vector_add", &["-arch=sm_70"]))
        .env("PHOS_GUEST_LIB", built("libphos_guest.so"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn neighbour_done(child: Child) {
    let out = child.wait_with_output().unwrap();
    let expected = std::fs::read_to_string(cuda_dir().join("expected").join("vector_add.out")).unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout), expected);
}

fn refused(code: Result<impl Sized, i32>) -> bool {
    code.err() == Some(CudaError::MemoryAllocation.0)
}

/// Streams, events and allocations past the session's limit are refused as CUDA refuses a
/// resource it cannot create; freeing one makes room again; another session has its own
/// count; the refusals are logged and reach the router's metrics.
#[test]
fn a_session_holds_no_more_objects_than_its_limits() {
    let nvcc = nvcc();
    let router = TestRouter::start_with("emu", |c| {
        for kind in [LimitKind::Streams, LimitKind::Events, LimitKind::Allocations] {
            c.session_limits.set(kind, 32);
        }
    });
    let other = nvcc.as_deref().map(|n| neighbour(&router, n));
    let mut g = RawGuest::connect(&router.socket(), None).unwrap();
    let events: Vec<u64> = (0..32).map(|_| g.call(&CudaEventCreateRequest {}).unwrap().event).collect();
    assert!(refused(g.call(&CudaEventCreateWithFlagsRequest { flags: 2 })));
    let buffers: Vec<u64> = (0..32).map(|_| g.call(&CudaMallocRequest { size: 256 }).unwrap().devPtr).collect();
    assert!(refused(g.call(&CudaMallocRequest { size: 256 })));
    assert!(refused(g.call(&CudaMallocRequest { size: 64 << 20 })), "large or small, the count is the limit");
    let streams: Vec<u64> = (0..32).map(|_| g.call(&CudaStreamCreateRequest {}).unwrap().pStream).collect();
    for _ in 0..100 {
        assert!(refused(g.call(&CudaStreamCreateRequest {})), "a stream past the limit");
    }
    assert!(refused(g.call(&CudaStreamCreateWithFlagsRequest { flags: 1 })));
    // Freeing one of each makes room for one.
    g.call(&CudaStreamDestroyRequest { stream: streams[5] }).unwrap();
    g.call(&CudaEventDestroyRequest { event: events[5] }).unwrap();
    g.call(&CudaFreeRequest { devPtr: buffers[5] }).unwrap();
    let s = g.call(&CudaStreamCreateRequest {}).unwrap().pStream;
    g.call(&CudaEventCreateRequest {}).unwrap();
    let b = g.call(&CudaMallocRequest { size: 256 }).unwrap().devPtr;
    assert!(refused(g.call(&CudaStreamCreateRequest {})));
    // The objects work.
    g.call(&CudaMemsetRequest { devPtr: b, value: 1, count: 256 }).unwrap();
    g.call(&CudaStreamSynchronizeRequest { stream: s }).unwrap();
    // Another session counts its own.
    let mut h = RawGuest::connect(&router.socket(), None).unwrap();
    for _ in 0..32 {
        h.call(&CudaStreamCreateRequest {}).unwrap();
    }
    let logs = router.server_logs();
    assert!(logs.contains("refused: the session holds its limit of 32 streams"), "{logs}");
    assert!(logs.contains("refused: the session holds its limit of 32 allocations"), "{logs}");
    assert!(logs.lines().filter(|l| l.contains("its limit of 32 streams")).count() < 30, "throttled: {logs}");
    // The router's books and metrics.
    let usage = router.router.tenants.usage().into_iter().find(|t| t.name == "uid:0").unwrap();
    let count = |kind: &str| usage.limit_refusals.iter().find(|(k, _)| k == kind).map_or(0, |(_, n)| *n);
    assert_eq!((count("streams"), count("events"), count("allocations")), (102, 1, 2), "{usage:?}");
    let page = phos_router::metrics::render(&router.router);
    assert!(page.contains("phos_tenant_limit_refusals_total{tenant=\"uid:0\",limit=\"streams\"} 102"), "{page}");
    if let Some(other) = other {
        neighbour_done(other);
    }
    RawGuest::connect(&router.socket(), None).unwrap().call(&CudaMallocRequest { size: 16 }).unwrap();
}

/// 100 000 bad frees write a bounded log, whose lines say how many like them were dropped;
/// the session and another one carry on.
#[test]
fn a_flood_of_bad_calls_writes_a_bounded_log() {
    let nvcc = nvcc();
    let router = TestRouter::start("emu");
    let other = nvcc.as_deref().map(|n| neighbour(&router, n));
    let mut g = RawGuest::connect_shm(&router.socket(), None, None).unwrap();
    let buf = g.call(&CudaMallocRequest { size: 4096 }).unwrap().devPtr;
    let started = Instant::now();
    for i in 0..100_000u64 {
        let r = g.call(&CudaFreeRequest { devPtr: 0x1000 + 256 * i });
        assert_eq!(r.unwrap_err(), CudaError::InvalidValue.0);
    }
    let flood = started.elapsed();
    // One more once the limit has let a line through again: it says what was dropped.
    std::thread::sleep(Duration::from_millis(400));
    assert!(g.call(&CudaFreeRequest { devPtr: 0x42 }).is_err());
    let logs = router.server_logs();
    let lines = logs.lines().filter(|l| l.contains("cudaFree: invalid device pointer")).count();
    // A burst of 20, then 5 a second.
    let bound = 20 + 5 * (flood.as_secs() as usize + 2);
    assert!(lines >= 20 && lines <= bound, "{lines} lines in {flood:?} (at most {bound})");
    assert!(logs.len() < 256 << 10, "{} bytes of log", logs.len());
    assert!(logs.contains("similar lines dropped before this one"), "{logs}");
    g.call(&CudaFreeRequest { devPtr: buf }).unwrap();
    if let Some(other) = other {
        neighbour_done(other);
    }
}

/// A guest claiming an ABI no CUDA has is refused at the handshake, and said so.
#[test]
fn a_handshake_with_an_unknown_abi_is_refused() {
    let router = TestRouter::start("emu");
    let _ = router_log();
    let mut t = phos_protocol::transport::UnixTransport::connect(&router.socket()).unwrap();
    let hello = phos_protocol::handshake::Hello {
        apis: phos_protocol::handshake::ApiVersion::of_this_build(),
        pid: std::process::id(),
        abi_major: 9999,
        token: None,
        program: "future".into(),
        transports: Vec::new(),
        tenant_token: None,
        host_arena: None,
    };
    let payload = phos_protocol::encode(&hello);
    let mut h = FrameHeader::new(FrameKind::Hello);
    h.version = phos_protocol::frame::HANDSHAKE_VERSION;
    h.payload_len = payload.len() as u64;
    t.send(&h, &[&payload]).unwrap();
    let mut buf = Vec::new();
    assert_eq!(t.recv(&mut buf).unwrap().kind, FrameKind::Refused);
    assert!(String::from_utf8_lossy(&buf).contains("unsupported CUDA ABI"), "{}", String::from_utf8_lossy(&buf));
    assert!(router.router.sessions().is_empty(), "no session, no server");
    assert!(router_log().contains("guest presents CUDA ABI 9999"), "{}", router_log());
    RawGuest::connect(&router.socket(), None).unwrap().call(&CudaMallocRequest { size: 16 }).unwrap();
}

/// An API server that crashes is logged as such by the router: which session, which
/// process, which signal.
#[test]
fn a_crashed_server_is_logged_with_its_signal() {
    let router = TestRouter::start("emu");
    let _ = router_log();
    let mut g = RawGuest::connect(&router.socket(), None).unwrap();
    g.call(&CudaMallocRequest { size: 16 }).unwrap();
    let id = g.welcome.session;
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
    // SAFETY: a signal to a process this test's router started. (SIGABRT: Rust's SIGSEGV
    // handler lets a SIGSEGV sent by another process go.)
    unsafe { libc::kill(server, libc::SIGABRT) };
    let wanted = format!("the session's API server (pid {server}) was killed by signal 6 (SIGABRT");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let log = router_log();
        if let Some(line) = log.lines().find(|l| l.contains(&wanted)) {
            assert!(line.contains(&format!("session={id}")), "{line}");
            break;
        }
        assert!(Instant::now() < deadline, "no line about the crash:\n{log}");
        std::thread::sleep(Duration::from_millis(50));
    }
    RawGuest::connect(&router.socket(), None).unwrap().call(&CudaMallocRequest { size: 16 }).unwrap();
}

/// Strided copies whose extents no device could hold, and device limits past what CUDA
/// accepts, fail the call (not the program), which goes on working.
#[test]
fn impossible_extents_and_limits_fail_the_call_only() {
    let Some(nvcc) = nvcc() else { return };
    let exe = build_program_from(&nvcc, &hostile_dir(), "hostile_api", &["-arch=sm_70"]);
    let out = phos_tests::phos_run("emu", &exe, &[]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(
        stdout,
        "2d h2d 8 GiB rows: cudaErrorInvalidValue\n\
         2d d2h 8 GiB rows: cudaErrorInvalidValue\n\
         2d h2d rows x height overflow: cudaErrorInvalidValue\n\
         3d h2d huge extent: cudaErrorInvalidValue\n\
         3d h2d position overflow: cudaErrorInvalidValue\n\
         stack 2^40: cudaErrorInvalidValue\n\
         printf fifo 2^40: cudaErrorMemoryAllocation\n\
         malloc heap 2^40: cudaErrorMemoryAllocation\n\
         l2 fetch 4096: cudaErrorInvalidValue\n\
         stack now: 1024\n\
         stack then: 8192\n\
         PASS\n"
    );
}
