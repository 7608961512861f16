//! Live migration end to end on the emu backend: real nvcc-built programs run through a
//! router while `phosctl migrate` moves their sessions to another router (over TCP, the
//! routers authenticating each other with a shared secret, or over its Unix socket) or to
//! another server of the same router, and back; the programs finish printing exactly what an
//! uninterrupted run prints. A migration whose target dies in the middle of the transfer,
//! or that the target refuses, leaves the program running where it was.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Output, Stdio};
use std::time::{Duration, Instant};

use phos_tests::{TestRouter, build_program, built, nvcc};

const SECRET: &str = "migration-test-shared-secret";

/// A router that takes migrations from peers that know the secret in `secret_file`
/// (`extra_server_args` go to its API servers).
fn peer_router(secret_file: &Path, extra_server_args: &[&str]) -> TestRouter {
    let secret = phos_control::peer::Secret::from_file(secret_file).unwrap();
    let extra: Vec<String> = extra_server_args.iter().map(|s| s.to_string()).collect();
    TestRouter::start_with("emu", move |c| {
        c.peer_listen = Some("127.0.0.1:0".parse().unwrap());
        c.peer_secret = Some(secret);
        c.pool_size = 1;
        c.server_args.extend(extra);
    })
}

fn secret_file(dir: &Path, secret: &str) -> PathBuf {
    let path = dir.join(format!("secret-{}", secret.len()));
    std::fs::write(&path, format!("{secret}\n")).unwrap();
    path
}

fn phosctl(router: &TestRouter, args: &[&str]) -> Output {
    Command::new(built("phosctl"))
        .args(args)
        .arg("--router")
        .arg(format!("unix:{}", router.socket().display()))
        .output()
        .expect("running phosctl")
}

fn peer_endpoint(router: &TestRouter) -> String {
    format!("tcp:{}", router.router.peer_addr().expect("a peer listener"))
}

/// `phosctl migrate SESSION --to TO` from `from`, which must succeed; what it printed.
fn migrate(from: &TestRouter, session: u64, to: &[&str]) -> String {
    let out = phosctl(from, &[&["migrate", &session.to_string()], to].concat());
    let printed = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "migrate {to:?}: {}\n{printed}\nsource servers:\n{}",
        String::from_utf8_lossy(&out.stderr),
        from.server_logs()
    );
    check_plain_output(session, &printed, &String::from_utf8_lossy(&out.stderr));
    println!("{printed}");
    printed
}

/// What `phosctl migrate` prints when its output is not a terminal: the same lines as ever,
/// for scripts (a summary line, one line per pass, the dirty rate), and no progress bar
/// (no carriage return, no escape sequence) on either stream.
fn check_plain_output(session: u64, printed: &str, stderr: &str) {
    for (what, text) in [("stdout", printed), ("stderr", stderr)] {
        assert!(!text.contains('\r') && !text.contains('\u{1b}'), "a progress bar on {what}: {text:?}");
    }
    let lines: Vec<&str> = printed.lines().collect();
    assert!(lines.len() >= 4, "{printed}");
    let (first, rest) = lines.split_first().unwrap();
    let (last, passes) = rest.split_last().unwrap();
    assert!(first.starts_with(&format!("session {session} moved to ")), "{printed}");
    assert!(first.contains(" MiB of device memory, ") && first.ends_with(" ms (downtime)"), "{printed}");
    for (i, line) in passes.iter().enumerate() {
        let want = match i {
            0 => "first copy".to_string(),
            i if i + 1 == passes.len() => "held copy".to_string(),
            i => format!("round {i}"),
        };
        let fields = line.strip_prefix(&format!("  {want}")).unwrap_or_else(|| panic!("pass {i}: {line:?}"));
        let numbers: Vec<f64> =
            fields.split(|c: char| c == ',' || c.is_whitespace()).filter_map(|w| w.parse().ok()).collect();
        assert_eq!(numbers.len(), 4, "written, copied, ms, skipped: {line:?}");
        assert!(fields.contains("bytes written before it") && fields.ends_with(" pieces skipped by hash"), "{line:?}");
    }
    assert!(last.starts_with("dirty rate ") && last.contains("MiB/s during the rounds"), "{printed}");
}

fn start_guest(router: &TestRouter, exe: &Path, args: &[&str]) -> Child {
    Command::new(built("phosctl"))
        .args(["run", "--endpoint"])
        .arg(format!("unix:{}", router.socket().display()))
        .arg("--")
        .arg(exe)
        .args(args)
        .env("PHOS_GUEST_LIB", built("libphos_guest.so"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Read lines until one contains `needle`, adding them to `printed`.
fn read_until(out: &mut BufReader<ChildStdout>, printed: &mut String, needle: &str) {
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let mut line = String::new();
        assert!(out.read_line(&mut line).unwrap() > 0, "the program ended before printing {needle:?}: {printed}");
        printed.push_str(&line);
        if line.contains(needle) {
            return;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {needle:?}");
    }
}

fn only_session(router: &TestRouter) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(s) = router.router.sessions().first() {
            return s.id;
        }
        assert!(Instant::now() < deadline, "no session appeared");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The rest of the program's output and its end, which must be a success.
fn finish(mut guest: Child, mut out: BufReader<ChildStdout>, mut printed: String) -> String {
    out.read_to_string(&mut printed).unwrap();
    let status = guest.wait().unwrap();
    let mut err = String::new();
    guest.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    assert!(status.success(), "the program failed: {err}\n{printed}");
    printed
}

/// An iterative program is moved mid-run from router A to router B over TCP, back, and to B
/// again, computing between the moves, and prints exactly what an uninterrupted run prints.
/// Each move is counted in the source's metrics, with its downtime.
#[test]
fn migrated_back_and_forth_over_tcp_the_program_finishes_unchanged() {
    migrated_back_and_forth(&[]);
}

/// The same with memory registered with cudaHostRegister (arena pages the target maps and
/// registers again): the kernel keeps counting in the guest's malloc'd memory.
#[test]
fn a_session_with_registered_memory_migrates_back_and_forth() {
    migrated_back_and_forth(&["registered"]);
}

fn migrated_back_and_forth(mode: &[&str]) {
    let Some(nvcc) = nvcc() else { return };
    let exe = build_program(&nvcc, "iterative", &["-arch=sm_70"]);
    let dir = tempfile::tempdir().unwrap();
    let secret = secret_file(dir.path(), SECRET);
    let a = peer_router(&secret, &[]);
    let b = peer_router(&secret, &[]);
    let reference = start_guest(&a, &exe, &[&["70", "0"], mode].concat()).wait_with_output().unwrap();
    assert!(reference.status.success(), "{}", String::from_utf8_lossy(&reference.stderr));
    let reference = String::from_utf8(reference.stdout).unwrap();
    // The reference's session ends at A before the migrated one starts (A moves one session).
    let deadline = Instant::now() + Duration::from_secs(30);
    while !a.router.sessions().is_empty() {
        assert!(Instant::now() < deadline, "the reference's session did not end");
        std::thread::sleep(Duration::from_millis(50));
    }

    let mut guest = start_guest(&a, &exe, &[&["70", "30"], mode].concat());
    let mut out = BufReader::new(guest.stdout.take().unwrap());
    let mut printed = String::new();
    read_until(&mut out, &mut printed, "iteration 10 ");
    let id = only_session(&a);
    let printed_move = migrate(&a, id, &["--to", &peer_endpoint(&b)]);
    assert!(printed_move.contains("first copy") && printed_move.contains("held copy"), "{printed_move}");
    assert!(a.router.session(id).is_none(), "the session stayed at A");
    read_until(&mut out, &mut printed, "iteration 30 ");
    assert_eq!(b.router.sessions().len(), 1, "the session is not at B");
    migrate(&b, id, &["--to", &peer_endpoint(&a)]);
    read_until(&mut out, &mut printed, "iteration 50 ");
    assert!(a.router.session(id).is_some(), "the session did not come back to A");
    migrate(&a, id, &["--to", &peer_endpoint(&b)]);
    let printed = finish(guest, out, printed);
    assert_eq!(printed, reference, "output differs from the uninterrupted run");
    let metrics = phos_router::metrics::render(&a.router);
    assert!(metrics.contains("phos_migrations_total{} 2"), "{metrics}");
    assert!(metrics.contains("phos_migrations_arrived_total{} 1"), "{metrics}");
    assert!(metrics.contains("phos_migration_last_downtime_seconds{}"), "{metrics}");
}

/// A program holding CUDA arrays (with level handles handed out), texture objects of arrays
/// and of linear memory, a surface object and a conditional graph is moved to another router
/// over TCP once all are made: the target, restoring on demand from the stream, makes every
/// one of them again under the handles and values the program holds, and the program prints
/// what an uninterrupted run prints.
#[test]
fn a_program_with_arrays_textures_and_a_conditional_graph_is_migrated() {
    let Some(nvcc) = nvcc() else { return };
    // PTX only: CI's nvcc (11.8) cannot link a kernel calling cudaGraphSetConditional into
    // machine code; emu runs the PTX.
    let exe = build_program(&nvcc, "restore_arrays", &["-gencode", "arch=compute_70,code=compute_70"]);
    let expected = std::fs::read_to_string(phos_tests::cuda_dir().join("expected/restore_arrays.out")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let secret = secret_file(dir.path(), SECRET);
    let (a, b) = (peer_router(&secret, &[]), peer_router(&secret, &[]));
    let mut guest = start_guest(&a, &exe, &["pause"]);
    let mut out = BufReader::new(guest.stdout.take().unwrap());
    let mut printed = String::new();
    read_until(&mut out, &mut printed, "arrays ready");
    let id = only_session(&a);
    migrate(&a, id, &["--to", &peer_endpoint(&b)]);
    assert!(a.router.session(id).is_none(), "the session stayed at A");
    let printed = finish(guest, out, printed);
    assert_eq!(printed, expected, "output differs from the native run\ntarget servers:\n{}", b.server_logs());
}

/// On a machine of two devices, a running program is moved to device 1 (`--device 1`), then
/// back to device 0, computing between the moves: it checks at every step that its device is
/// still 0 and its memory on it, and prints exactly what an uninterrupted run prints; the
/// servers it moved to put its device 0 on device 1, then on device 0 again. A move to a
/// device the machine does not have is refused, naming it, and the program runs on.
/// A synchronous call that ran at the source, whose answer the hand-over cut, is sent again
/// by the guest to the target (flagged as resent, with its id): the migration's manifest
/// carried the reply, and the target answers with it instead of running the call again.
#[test]
fn a_synchronous_call_whose_answer_the_hand_over_cut_is_not_run_again_at_the_target() {
    use phos_protocol::cudart::{CudaFreeRequest, CudaMallocRequest, CudaMemGetInfoRequest};
    use phos_protocol::frame::FLAG_RESENT;
    use phos_tests::RawGuest;
    const SIZE: u64 = 4 << 20;
    let dir = tempfile::tempdir().unwrap();
    let secret = secret_file(dir.path(), SECRET);
    let (a, b) = (peer_router(&secret, &[]), peer_router(&secret, &[]));
    let mut g = RawGuest::connect(&a.socket(), None).expect("a session");
    let token = g.welcome.token;
    let before = g.call(&CudaMemGetInfoRequest {}).expect("cudaMemGetInfo").free;
    g.send_as(&CudaMallocRequest { size: SIZE }, 700, 0).unwrap();
    let p = g.reply_to::<CudaMallocRequest>(700).expect("allocated").devPtr;
    let id = only_session(&a);
    // Over the default four connections: three of them carry no piece of this small session
    // (their openings once waited in the source's buffers until the target's lane timed out).
    let started = std::time::Instant::now();
    migrate(&a, id, &["--to", &peer_endpoint(&b)]);
    assert!(started.elapsed() < std::time::Duration::from_secs(30), "the move took {:?}", started.elapsed());
    drop(g);
    let mut h = RawGuest::connect(&b.socket(), Some(token)).expect("the session at the target");
    h.send_as(&CudaMallocRequest { size: SIZE }, 700, FLAG_RESENT).unwrap();
    assert_eq!(h.reply_to::<CudaMallocRequest>(700).expect("answered").devPtr, p, "the kept reply");
    h.call(&CudaFreeRequest { devPtr: p }).expect("its one allocation");
    assert_eq!(h.call(&CudaMemGetInfoRequest {}).expect("cudaMemGetInfo").free, before, "allocated once");
}

#[test]
fn a_program_moved_to_another_device_and_back_keeps_its_device_numbers() {
    let Some(nvcc) = nvcc() else { return };
    let exe = build_program(&nvcc, "device_numbers", &["-arch=sm_70"]);
    let dir = tempfile::tempdir().unwrap();
    let secret = secret_file(dir.path(), SECRET);
    let a = peer_router(&secret, &["--emu-devices", "2"]);
    let reference = start_guest(&a, &exe, &["0", "60", "0"]).wait_with_output().unwrap();
    assert!(reference.status.success(), "{}", String::from_utf8_lossy(&reference.stdout));
    let reference = String::from_utf8(reference.stdout).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !a.router.sessions().is_empty() {
        assert!(Instant::now() < deadline, "the reference's session did not end");
        std::thread::sleep(Duration::from_millis(50));
    }

    let mut guest = start_guest(&a, &exe, &["0", "60", "30"]);
    let mut out = BufReader::new(guest.stdout.take().unwrap());
    let mut printed = String::new();
    read_until(&mut out, &mut printed, "iteration 10 ");
    let id = only_session(&a);
    let refused = phosctl(&a, &["migrate", &id.to_string(), "--device", "2"]);
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "a move to device 2 of two went through");
    assert!(err.contains("device 2 does not exist here (2 devices)"), "{err}");
    migrate(&a, id, &["--device", "1"]);
    assert!(a.server_logs().contains("its device 0 on device 1"), "{}", a.server_logs());
    read_until(&mut out, &mut printed, "iteration 30 ");
    migrate(&a, id, &["--device", "0"]);
    let printed = finish(guest, out, printed);
    assert_eq!(printed, reference, "output differs from the uninterrupted run");
}

/// The processes whose command line contains `needle`, by pid.
fn processes_with(needle: &str) -> Vec<i32> {
    let mut pids = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else { continue };
        if let Ok(cmd) = std::fs::read(e.path().join("cmdline"))
            && String::from_utf8_lossy(&cmd).contains(needle)
        {
            pids.push(pid);
        }
    }
    pids
}

/// A target that refuses (another secret) and a target whose server dies in the middle of
/// the transfer: each migration fails, saying why, and the program runs on at its source and
/// finishes unchanged.
#[test]
fn a_migration_whose_target_dies_leaves_the_program_on_the_source() {
    let Some(nvcc) = nvcc() else { return };
    let exe = build_program(&nvcc, "iterative", &["-arch=sm_70"]);
    let dir = tempfile::tempdir().unwrap();
    let secret = secret_file(dir.path(), SECRET);
    let a = peer_router(&secret, &[]);
    // B reads the transfer slowly: its server is ended in the middle of it.
    let b = peer_router(&secret, &["--migrate-in-pace-ms", "1500"]);
    let reference = start_guest(&a, &exe, &["50", "0"]).wait_with_output().unwrap();
    assert!(reference.status.success(), "{}", String::from_utf8_lossy(&reference.stderr));
    let reference = String::from_utf8(reference.stdout).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !a.router.sessions().is_empty() {
        assert!(Instant::now() < deadline, "the reference's session did not end");
        std::thread::sleep(Duration::from_millis(50));
    }

    let mut guest = start_guest(&a, &exe, &["50", "40"]);
    let mut out = BufReader::new(guest.stdout.take().unwrap());
    let mut printed = String::new();
    read_until(&mut out, &mut printed, "iteration 10 ");
    let id = only_session(&a);

    // A router with another secret is refused before anything moves.
    let other = peer_router(&secret_file(dir.path(), "another-secret-altogether"), &[]);
    let refused = phosctl(&a, &["migrate", &id.to_string(), "--to", &peer_endpoint(&other)]);
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "a migration to a router with another secret went through");
    assert!(err.contains("runs on here") && err.contains("secret"), "{err}");
    assert!(other.router.sessions().is_empty());

    // B's server dies in the middle of the transfer.
    let b_servers = b.dir.path().display().to_string();
    let before: Vec<i32> = processes_with(&b_servers);
    let migration = {
        let a_sock = a.socket();
        let to = peer_endpoint(&b);
        std::thread::spawn(move || {
            Command::new(built("phosctl"))
                .args(["migrate", &id.to_string(), "--to", &to, "--router"])
                .arg(format!("unix:{}", a_sock.display()))
                .output()
                .unwrap()
        })
    };
    // The pool's server takes the session; once it has started receiving, it is killed.
    let deadline = Instant::now() + Duration::from_secs(60);
    let receiving = loop {
        let logs = b.server_logs();
        if logs.contains("receiving a migration") {
            break processes_with(&b_servers);
        }
        assert!(Instant::now() < deadline, "B's server never began to receive: {logs}");
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut killed = 0;
    for pid in receiving.into_iter().filter(|p| before.contains(p)) {
        // SAFETY: kill takes any pid; these are the API servers of B, this test's router.
        if unsafe { libc::kill(pid, libc::SIGKILL) } == 0 {
            killed += 1;
        }
    }
    assert!(killed > 0, "no server of B to end");
    let failed = migration.join().unwrap();
    let err = String::from_utf8_lossy(&failed.stderr);
    assert!(!failed.status.success(), "the migration to a dead target succeeded");
    assert!(err.contains("runs on here"), "{err}");
    assert!(a.router.session(id).is_some(), "the session left A");
    // The program goes on at A, undisturbed.
    let printed = finish(guest, out, printed);
    assert_eq!(printed, reference, "output differs from the uninterrupted run");
    let metrics = phos_router::metrics::render(&a.router);
    assert!(metrics.contains("phos_migrations_failed_total{} 2"), "{metrics}");
}

/// Four host threads, each with its own stream and kernels in flight, move to another router
/// through its Unix socket, then to another server of that router (`--device 0`): every
/// thread's checks of its buffer hold (a launch run twice, or lost, would show) and the
/// program passes.
#[test]
fn a_program_with_threads_and_streams_in_flight_is_migrated() {
    let Some(nvcc) = nvcc() else { return };
    let exe = build_program(&nvcc, "stream_traffic", &["-arch=sm_70"]);
    phos_tests::router_log();
    let dir = tempfile::tempdir().unwrap();
    let secret = secret_file(dir.path(), SECRET);
    let a = peer_router(&secret, &[]);
    let b = peer_router(&secret, &[]);
    let guest = start_guest(&a, &exe, &["3000"]);
    let id = only_session(&a);
    std::thread::sleep(Duration::from_millis(800));
    migrate(&a, id, &["--to", &format!("unix:{}", b.socket().display())]);
    std::thread::sleep(Duration::from_millis(500));
    let at_b = b.router.session(id);
    assert!(at_b.is_some(), "the session is not at B:\n{}\n{}", b.server_logs(), phos_tests::router_log());
    let old_server = at_b.unwrap().control_socket().unwrap();
    migrate(&b, id, &["--device", "0"]);
    let new_server = b.router.session(id).unwrap().control_socket().unwrap();
    assert_ne!(old_server, new_server, "the session kept its server");
    let out = guest.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{:?}\nstdout: {}\nstderr: {}\nA: {}\nB: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        a.server_logs(),
        b.server_logs()
    );
    let want: String = (0..4).map(|t| format!("thread {t}: 3000 rounds\n")).collect::<String>() + "PASS\n";
    assert_eq!(String::from_utf8_lossy(&out.stdout), want);
}

/// A program that rewrites 4 KiB of a 64 MiB buffer again and again is moved to another
/// server: after the first copy, every pass copies again only the 8 MiB piece it writes (not
/// the buffer), the router's metrics say so pass by pass, and the program reads its whole
/// buffer back as it left it.
#[test]
fn a_program_writing_a_small_region_is_recopied_by_the_piece() {
    let Some(nvcc) = nvcc() else { return };
    let exe = build_program(&nvcc, "small_writes", &["-arch=sm_70"]);
    let dir = tempfile::tempdir().unwrap();
    let secret = secret_file(dir.path(), SECRET);
    let a = peer_router(&secret, &[]);
    let mut guest = start_guest(&a, &exe, &["3000"]);
    let mut out = BufReader::new(guest.stdout.take().unwrap());
    let mut printed = String::new();
    read_until(&mut out, &mut printed, "running");
    let id = only_session(&a);
    migrate(&a, id, &["--device", "0"]);
    let metrics = phos_router::metrics::render(&a.router);
    let copied: Vec<u64> = metrics
        .lines()
        .filter(|l| l.starts_with("phos_migration_last_pass_copied_bytes{"))
        .map(|l| l.rsplit(' ').next().unwrap().parse().unwrap())
        .collect();
    assert!(copied.len() >= 2, "a first copy and a held one: {metrics}");
    assert!(copied[0] >= 64 << 20, "the first copy takes the whole buffer: {copied:?}");
    assert!(copied[1..].iter().all(|&c| c <= 8 << 20), "a pass copied more than the piece written: {copied:?}");
    assert!(copied[1..].iter().any(|&c| c > 0), "the program wrote while it moved: {copied:?}");
    let printed = finish(guest, out, printed);
    assert!(printed.ends_with("PASS\n"), "{printed}");
}

/// On a terminal, `phosctl migrate` draws a progress bar while the memory moves: the pass
/// under way, bytes copied, the rate, bytes left and how fast the session writes. The
/// target reads the stream slowly, so that the bar has time to be drawn; `script` gives
/// phosctl a terminal.
#[test]
fn a_migration_on_a_terminal_shows_its_progress() {
    let Some(nvcc) = nvcc() else { return };
    if Command::new("script").arg("--version").output().is_err() {
        eprintln!("skipped: no `script` to give phosctl a terminal");
        return;
    }
    let exe = build_program(&nvcc, "iterative", &["-arch=sm_70"]);
    let dir = tempfile::tempdir().unwrap();
    let secret = secret_file(dir.path(), SECRET);
    let a = peer_router(&secret, &[]);
    let b = peer_router(&secret, &["--migrate-in-pace-ms", "300"]);
    let mut guest = start_guest(&a, &exe, &["300", "30"]);
    let mut out = BufReader::new(guest.stdout.take().unwrap());
    let mut printed = String::new();
    read_until(&mut out, &mut printed, "iteration 10 ");
    let id = only_session(&a);
    let command = format!(
        "{} migrate {id} --to {} --router unix:{}",
        built("phosctl").display(),
        peer_endpoint(&b),
        a.socket().display()
    );
    let term = Command::new("script").args(["-qfec", &command, "/dev/null"]).output().unwrap();
    let shown = String::from_utf8_lossy(&term.stdout).into_owned();
    assert!(term.status.success(), "{shown}\n{}", String::from_utf8_lossy(&term.stderr));
    assert!(shown.contains(&format!("session {id} moved to")), "{shown}");
    assert!(shown.contains("first copy ["), "no bar for the first copy: {shown:?}");
    assert!(shown.contains(" left, session writes "), "no bytes left and dirty rate: {shown:?}");
    let printed = finish(guest, out, printed);
    assert!(printed.contains("iteration 300 "), "{printed}");
}
