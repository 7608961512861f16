//! A shared router under hostile and careless tenants: connection storms past its file
//! descriptors, a low process limit, handshakes that never finish, headers that lie about
//! their size, floods of sessions and channels, names that try to forge log lines. In each,
//! another tenant (`bob`, on a socket of its own) runs a real program alongside and gets the
//! right answer, and the router is still serving afterwards.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use phos_protocol::frame::{FrameHeader, FrameKind};
use phos_tests::{ChildRouter, RawGuest, build_program, cuda_dir, nvcc};

/// `bob`, the tenant that minds its own business, on `{dir}/bob.sock`.
const BOB: &str = "[[tenant]]\nname = \"bob\"\nsocket = \"{dir}/bob.sock\"\n";

fn expected(name: &str) -> String {
    std::fs::read_to_string(cuda_dir().join("expected").join(format!("{name}.out"))).unwrap()
}

/// vector_add through `socket` gives the right answer.
fn runs_correctly(router: &ChildRouter, socket: &Path, exe: &Path, when: &str) {
    let out = router.run(socket, exe);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{when}: the program failed: {stderr}\nrouter log:\n{}", router.log());
    assert_eq!(String::from_utf8_lossy(&out.stdout), expected("vector_add"), "{when}: {stderr}");
}

/// The end of every scenario: the router is alive and serves both tenants.
fn still_serving(router: &mut ChildRouter, exe: &Path) {
    assert!(router.alive(), "the router exited: {}", router.log());
    runs_correctly(router, &router.tenant_socket("bob"), exe, "bob afterwards");
    runs_correctly(router, &router.socket(), exe, "the noisy tenant afterwards");
}

fn set_limit(resource: libc::__rlimit_resource_t, n: u64) -> std::io::Result<()> {
    let rl = libc::rlimit { rlim_cur: n, rlim_max: n };
    // SAFETY: setrlimit reads one rlimit struct, which `rl` is.
    if unsafe { libc::setrlimit(resource, &rl) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Wait until `f` holds, or fail with `what`.
fn eventually(what: &str, within: Duration, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !f() {
        assert!(Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether the router has closed `s` (a read sees the end, or the connection reset).
fn closed_by_router(s: &mut UnixStream) -> bool {
    s.set_read_timeout(Some(Duration::from_millis(10))).unwrap();
    let mut b = [0u8; 256];
    loop {
        match s.read(&mut b) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                return false;
            }
            Err(_) => return true,
        }
    }
}

/// 250 idle connections against a router that has 200 descriptors. With the default
/// limits the tenant's 64 handshakes in progress are all it gets; with them raised past
/// what the router has, the descriptors run out and the accept loop sheds connections
/// rather than exit or spin, and the stalled ones go at the handshake deadline.
#[test]
fn an_idle_connection_storm_past_the_descriptor_limit_costs_only_its_connections() {
    let Some(nvcc) = nvcc() else { return };
    let exe = build_program(&nvcc, "vector_add", &["-arch=sm_70"]);
    for raised in [false, true] {
        let config = if raised {
            format!("{BOB}[limits]\npending_handshakes_per_tenant = 1000\nhandshake_timeout = \"2s\"\n")
        } else {
            BOB.to_string()
        };
        let mut router = ChildRouter::start(&config, || set_limit(libc::RLIMIT_NOFILE, 200));
        let cpu_before = router.cpu_seconds();
        let mut idle: Vec<UnixStream> = (0..250).filter_map(|_| UnixStream::connect(router.socket()).ok()).collect();
        std::thread::sleep(Duration::from_millis(300));
        if !raised {
            runs_correctly(&router, &router.tenant_socket("bob"), &exe, "bob during the storm");
            let refused = idle.iter_mut().map(closed_by_router).filter(|c| *c).count();
            assert!(refused >= 250 - 64 - 1, "only 64 handshakes wait at a time ({refused} refused)");
        } else {
            // Out of descriptors: nobody gets in until the stalled handshakes time out.
            std::thread::sleep(Duration::from_secs(1));
            let cpu = router.cpu_seconds() - cpu_before;
            assert!(cpu < 0.8, "the accept loop spun: {cpu:.2} s of CPU in 1.3 s");
            eventually("stalled handshakes are closed at their deadline", Duration::from_secs(10), || {
                idle.iter_mut().all(closed_by_router)
            });
            assert!(router.log().contains("router short of resources"), "{}", router.log());
        }
        drop(idle);
        still_serving(&mut router, &exe);
        let log = router.log();
        assert!(log.lines().count() < 400, "the storm wrote {} log lines", log.lines().count());
    }
}

/// The router as `nobody` with a low process limit: the tenant's threads run out, its
/// connections are refused or closed, and the router goes on.
#[test]
fn a_low_process_limit_costs_only_the_connections_it_refuses() {
    let Some(nvcc) = nvcc() else { return };
    // SAFETY: geteuid has no memory effects.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("not root: cannot run the router as another user with its own process limit; skipped");
        return;
    }
    let exe = build_program(&nvcc, "vector_add", &["-arch=sm_70"]);
    const NOBODY: u32 = 65534;
    let limit = 60;
    let mut router = ChildRouter::start(BOB, move || {
        set_limit(libc::RLIMIT_NPROC, limit)?;
        // SAFETY: an empty list: setgroups reads nothing. In the child before exec.
        unsafe { libc::setgroups(0, std::ptr::null()) };
        // SAFETY: setgid has no memory effects.
        if unsafe { libc::setgid(NOBODY) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: setuid has no memory effects.
        if unsafe { libc::setuid(NOBODY) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    });
    // One session, then as many channels as the tenant can get: each is two router threads
    // and a server thread, until the user's processes run out.
    let first = RawGuest::connect(&router.socket(), None).expect("the first channel");
    let token = first.welcome.token;
    let mut channels = vec![first];
    let mut refused = 0;
    for _ in 0..100 {
        match RawGuest::connect(&router.socket(), Some(token)) {
            Ok(g) => channels.push(g),
            Err(_) => refused += 1,
        }
    }
    assert!(refused > 0, "{} channels opened under a limit of {limit} processes", channels.len());
    assert!(router.alive(), "the router died of its process limit: {}", router.log());
    assert!(router.log().contains("router short of resources") || router.log().contains("channel failed"));
    drop(channels);
    // The session's server ends once its channels are gone and the guest (this process) is
    // idle; until then its threads still count. Bob's program gets in once there is room.
    eventually("the tenant's threads are given back", Duration::from_secs(60), || {
        router.run(&router.tenant_socket("bob"), &exe).status.success()
    });
    still_serving(&mut router, &exe);
}

/// Headers that promise 4 GiB and send 4 KiB, on 24 channels: the router holds about what
/// was sent, not what was promised.
#[test]
fn headers_that_lie_about_their_size_cost_what_was_sent() {
    let Some(nvcc) = nvcc() else { return };
    let exe = build_program(&nvcc, "vector_add", &["-arch=sm_70"]);
    let mut router = ChildRouter::start(BOB, || Ok(()));
    let before = router.rss_bytes();
    let first = RawGuest::connect(&router.socket(), None).unwrap();
    let token = first.welcome.token;
    let mut liars = Vec::new();
    for _ in 0..24 {
        let mut g = RawGuest::connect(&router.socket(), Some(token)).unwrap();
        let mut h = FrameHeader::new(FrameKind::Call);
        h.function = 1;
        h.session = g.welcome.session;
        h.payload_len = 4 << 30;
        let mut bytes = h.encode().to_vec();
        bytes.extend([0u8; 4096]);
        use phos_protocol::transport::Transport;
        let fd = {
            use std::os::fd::AsRawFd;
            g.transport.stream().as_raw_fd()
        };
        // SAFETY: a write of our own buffer to a socket we hold open.
        let n = unsafe { libc::write(fd, bytes.as_ptr().cast(), bytes.len()) };
        assert_eq!(n as usize, bytes.len());
        let _ = g.transport.readable();
        liars.push(g);
    }
    std::thread::sleep(Duration::from_millis(500));
    let grown = router.rss_bytes().saturating_sub(before);
    assert!(grown < 64 << 20, "24 lying headers grew the router by {} MiB", grown >> 20);
    runs_correctly(&router, &router.tenant_socket("bob"), &exe, "bob beside the liars");
    drop((first, liars));
    still_serving(&mut router, &exe);
}

/// Connections that say nothing, or half a Hello, are closed at the handshake deadline.
#[test]
fn handshakes_that_stall_are_closed_at_the_deadline() {
    let Some(nvcc) = nvcc() else { return };
    let exe = build_program(&nvcc, "vector_add", &["-arch=sm_70"]);
    let mut router = ChildRouter::start(&format!("{BOB}[limits]\nhandshake_timeout = \"1s\"\n"), || Ok(()));
    let mut silent: Vec<UnixStream> = (0..20).map(|_| UnixStream::connect(router.socket()).unwrap()).collect();
    let mut half = UnixStream::connect(router.socket()).unwrap();
    let mut h = FrameHeader::new(FrameKind::Hello);
    h.version = phos_protocol::frame::HANDSHAKE_VERSION;
    h.payload_len = 200;
    half.write_all(&h.encode()).unwrap();
    half.write_all(&[0u8; 50]).unwrap();
    let started = Instant::now();
    runs_correctly(&router, &router.tenant_socket("bob"), &exe, "bob beside stalled handshakes");
    eventually("stalled handshakes are closed", Duration::from_secs(5), || {
        closed_by_router(&mut half) && silent.iter_mut().all(closed_by_router)
    });
    assert!(started.elapsed() >= Duration::from_millis(900), "closed before the deadline");
    assert!(router.log().contains("no handshake within"), "{}", router.log());
    still_serving(&mut router, &exe);
}

/// A tenant's sessions and channels stop at its limits with a CUDA error; the refusals show
/// in the metrics; another tenant is unaffected; closing gives the places back.
#[test]
fn session_and_channel_floods_stop_at_the_tenants_limits() {
    let Some(nvcc) = nvcc() else { return };
    let exe = build_program(&nvcc, "vector_add", &["-arch=sm_70"]);
    let metrics = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let config = format!(
        "metrics = \"{metrics}\"\n{BOB}[limits]\nsessions_per_tenant = 3\nchannels_per_session = 4\nchannels_per_tenant = 10\n"
    );
    let mut router = ChildRouter::start(&config, || Ok(()));
    let sessions: Vec<RawGuest> = (0..3).map(|_| RawGuest::connect(&router.socket(), None).unwrap()).collect();
    let refused = RawGuest::connect(&router.socket(), None).err().expect("a fourth session is refused");
    assert!(refused.contains("3 sessions"), "{refused}");
    let token = sessions[0].welcome.token;
    let more: Vec<RawGuest> = (0..3).map(|_| RawGuest::connect(&router.socket(), Some(token)).unwrap()).collect();
    let refused = RawGuest::connect(&router.socket(), Some(token)).err().expect("a fifth channel is refused");
    assert!(refused.contains("channels_per_session"), "{refused}");
    // The refusal's error code is what the guest library returns: devices unavailable.
    let mut s = UnixStream::connect(router.socket()).unwrap();
    let hello = phos_protocol::handshake::Hello {
        apis: phos_protocol::handshake::ApiVersion::of_this_build(),
        pid: std::process::id(),
        abi_major: 12,
        token: Some(token),
        program: "flood".into(),
        transports: vec![],
        tenant_token: None,
        host_arena: None,
    };
    let payload = phos_protocol::encode(&hello);
    let mut h = FrameHeader::new(FrameKind::Hello);
    h.version = phos_protocol::frame::HANDSHAKE_VERSION;
    h.payload_len = payload.len() as u64;
    s.write_all(&h.encode()).unwrap();
    s.write_all(&payload).unwrap();
    let mut buf = Vec::new();
    let rh = phos_protocol::transport::read_frame(&mut s, &mut buf, 1 << 16).unwrap();
    assert_eq!((rh.kind, rh.status), (FrameKind::Refused, phos_protocol::CudaError::DevicesUnavailable.0));
    runs_correctly(&router, &router.tenant_socket("bob"), &exe, "bob beside the flood");
    let page = http_get(metrics);
    assert!(
        page.lines().any(|l| l.starts_with("phos_tenant_limit_refusals_total{tenant=\"uid:0\",limit=\"sessions\"} 1")),
        "{page}"
    );
    assert!(page.contains("limit=\"channels_per_session\"} 2"), "{page}");
    assert!(page.lines().any(|l| l.starts_with("phos_tenant_channels{tenant=\"uid:0\"} 6")), "{page}");
    drop((sessions, more));
    // The sessions end once their channels are gone (the guest, this process, stays: it
    // counts as idle after the linger time), so wait for the places to come back.
    eventually("the tenant's places come back", Duration::from_secs(60), || {
        RawGuest::connect(&router.socket(), None).is_ok()
    });
    still_serving(&mut router, &exe);
}

fn http_get(addr: std::net::SocketAddr) -> String {
    let mut c = std::net::TcpStream::connect(addr).unwrap();
    c.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut page = String::new();
    c.read_to_string(&mut page).unwrap();
    page
}

/// A program name made of escape codes and newlines is printed escaped by `phosctl
/// sessions` and in the router's log: no forged row, no forged line, no terminal control.
#[test]
fn guest_chosen_names_are_printed_escaped() {
    let mut router = ChildRouter::start(BOB, || Ok(()));
    let evil = "evil\nINFO forged session row\u{1b}[2J\r";
    let mut s = UnixStream::connect(router.socket()).unwrap();
    let hello = phos_protocol::handshake::Hello {
        apis: phos_protocol::handshake::ApiVersion::of_this_build(),
        pid: std::process::id(),
        abi_major: 12,
        token: None,
        program: evil.into(),
        transports: vec![],
        tenant_token: None,
        host_arena: None,
    };
    let payload = phos_protocol::encode(&hello);
    let mut h = FrameHeader::new(FrameKind::Hello);
    h.version = phos_protocol::frame::HANDSHAKE_VERSION;
    h.payload_len = payload.len() as u64;
    s.write_all(&h.encode()).unwrap();
    s.write_all(&payload).unwrap();
    let mut buf = Vec::new();
    let rh = phos_protocol::transport::read_frame(&mut s, &mut buf, 1 << 16).unwrap();
    assert_eq!(rh.kind, FrameKind::Welcome);
    let out = router.phosctl(&["sessions"]);
    let listing = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(listing.lines().count(), 2, "a header and one row: {listing:?}");
    assert!(listing.contains("evil\\nINFO forged session row\\u{1b}[2J\\r"), "{listing:?}");
    assert!(!listing.contains('\u{1b}') && !listing.contains('\r'));
    let log = router.log();
    assert!(!log.lines().any(|l| l.starts_with("INFO forged")), "a forged log line: {log}");
    assert!(!log.contains('\u{1b}') || !log.contains("\u{1b}[2J"), "{log:?}");
    drop(s);
    assert!(router.alive());
}

/// Idle unauthenticated TCP connections past the descriptor limit: the accept loop neither
/// spins nor floods the log, and the tenants on this host go on.
#[test]
fn idle_tcp_connections_past_the_descriptor_limit_neither_spin_nor_flood_the_log() {
    let Some(nvcc) = nvcc() else { return };
    let exe = build_program(&nvcc, "vector_add", &["-arch=sm_70"]);
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let config = format!(
        "listen_tcp = \"127.0.0.1:{port}\"\n{BOB}[limits]\npending_handshakes_per_tenant = 1000\npending_handshakes = 1000\nhandshake_timeout = \"3s\"\n"
    );
    let mut router = ChildRouter::start(&config, || set_limit(libc::RLIMIT_NOFILE, 200));
    let cpu_before = router.cpu_seconds();
    let idle: Vec<std::net::TcpStream> =
        (0..300).filter_map(|_| std::net::TcpStream::connect(("127.0.0.1", port)).ok()).collect();
    assert!(idle.len() > 200, "the backlog took the connections");
    std::thread::sleep(Duration::from_secs(2));
    let cpu = router.cpu_seconds() - cpu_before;
    assert!(cpu < 1.0, "the TCP accept loop spun: {cpu:.2} s of CPU in 2 s");
    let log_bytes = router.log().len();
    assert!(log_bytes < 200_000, "{log_bytes} bytes of log in 2 s");
    drop(idle);
    std::thread::sleep(Duration::from_secs(3));
    still_serving(&mut router, &exe);
}

/// Two thousand handshakes of garbage: every one is refused, the log stays short and says
/// how many lines it dropped.
#[test]
fn a_flood_of_bad_handshakes_writes_a_bounded_log() {
    let mut router = ChildRouter::start(BOB, || Ok(()));
    let bad_handshake = |i: u32| {
        let mut s = UnixStream::connect(router.socket()).unwrap();
        let mut h = FrameHeader::new(FrameKind::Hello);
        h.version = phos_protocol::frame::HANDSHAKE_VERSION;
        h.payload_len = 8;
        s.write_all(&h.encode()).unwrap();
        s.write_all(&i.to_le_bytes()).unwrap();
        s.write_all(&[0xff; 4]).unwrap();
        let mut buf = Vec::new();
        let _ = phos_protocol::transport::read_frame(&mut s, &mut buf, 1 << 16);
    };
    for i in 0..2000u32 {
        bad_handshake(i);
    }
    // A fast machine sends all 2000 inside the burst's window, before the bucket lets another
    // line through: the count of dropped lines rides on the next line admitted, so wait for a
    // token and send one more.
    std::thread::sleep(Duration::from_millis(1100));
    bad_handshake(2000);
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut log = router.log();
    while !log.contains("dropped=") && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
        log = router.log();
    }
    let bad = log.lines().filter(|l| l.contains("bad handshake")).count();
    assert!((1..200).contains(&bad), "{bad} lines for 2001 bad handshakes");
    assert!(log.contains("dropped="), "the lines let through say how many were dropped: {log}");
    assert!(router.alive());
    let _: PathBuf = router.socket();
}
