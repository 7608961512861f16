//! Checkpoint and restore end to end on the emu backend, with `phosctl` against a router:
//! a long-running program is checkpointed mid-run and stopped, its API server ends, the
//! session is restored into a new server, and the program finishes printing exactly what an
//! uninterrupted run prints. Also: a corrupted image is refused cleanly, a checkpoint during
//! heavy multi-stream traffic is consistent, and restores work from the server pool.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use phos_tests::{TestRouter, build_program, built, nvcc};

fn phosctl(router: &TestRouter, args: &[&str]) -> std::process::Output {
    Command::new(built("phosctl"))
        .args(args)
        .arg("--router")
        .arg(format!("unix:{}", router.socket().display()))
        .output()
        .expect("running phosctl")
}

/// `phosctl`'s exit statuses (docs/operations.md, "Exit status"): something it needs cannot
/// be reached, no such session or policy, a refusal (an image or a session state that does
/// not allow the operation).
const UNAVAILABLE: i32 = 3;
const NOT_FOUND: i32 = 4;
const REFUSED: i32 = 5;

/// Start `exe args` as a guest of `router`, with its stdout piped.
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

/// Read lines until one contains `needle`; returns what was read.
fn read_until(out: &mut impl BufRead, needle: &str) -> String {
    let mut all = String::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let mut line = String::new();
        assert!(out.read_line(&mut line).unwrap() > 0, "the program ended before printing {needle:?}: {all}");
        all.push_str(&line);
        if line.contains(needle) {
            return all;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {needle:?}");
    }
}

fn session_id(router: &TestRouter) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(s) = router.router.sessions().first() {
            return s.id;
        }
        assert!(Instant::now() < deadline, "no session appeared");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A run of `iterative ARGS` on `router`, past its tenth iteration: the guest, its stdout,
/// its session id.
fn iterative_at_ten(router: &TestRouter, exe: &Path, args: &[&str]) -> (Child, BufReader<ChildStdout>, u64) {
    let mut guest = start_guest(router, exe, args);
    let mut out = BufReader::new(guest.stdout.take().unwrap());
    read_until(&mut out, "iteration 10 ");
    (guest, out, session_id(router))
}

/// `phosctl checkpoint ID --out DIR [extra...]`, which must succeed.
fn checkpoint(router: &TestRouter, id: u64, dir: &Path, extra: &[&str]) -> String {
    let mut args = vec!["checkpoint".to_string(), id.to_string(), "--out".into(), dir.display().to_string()];
    args.extend(extra.iter().map(|s| s.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let ck = phosctl(router, &args);
    assert!(
        ck.status.success(),
        "checkpoint: {}\nthe servers' logs:\n{}",
        String::from_utf8_lossy(&ck.stderr),
        router.server_logs()
    );
    String::from_utf8_lossy(&ck.stdout).into_owned()
}

#[test]
fn stopped_mid_run_and_restored_the_program_finishes_unchanged() {
    stop_and_restore_iterative(&[]);
}

/// The same with page-locked memory in the pinned arena: copies into it and a kernel writing
/// mapped memory go on after the restore, into the guest's own pages.
#[test]
fn a_session_with_pinned_memory_is_stopped_and_restored() {
    stop_and_restore_iterative(&["pinned"]);
}

/// The same with memory registered with cudaHostRegister: its pages are arena pages, which
/// the restored server maps and registers again, so the kernel keeps counting in the guest's
/// own (malloc'd) memory through its device pointer.
#[test]
fn a_session_with_registered_memory_is_stopped_and_restored() {
    stop_and_restore_iterative(&["registered"]);
}

/// The same after the program set a device limit and its kernel's attributes: the session's
/// settings come back with it (its launches need 64 KiB of dynamic shared memory).
#[test]
fn a_session_with_device_and_kernel_settings_is_stopped_and_restored() {
    stop_and_restore_iterative(&["settings"]);
}

fn stop_and_restore_iterative(mode: &[&str]) {
    let Some(nvcc) = nvcc() else { return };
    let exe = build_program(&nvcc, "iterative", &["-arch=sm_70"]);
    // The reference: the same run, uninterrupted.
    let router = TestRouter::start("emu");
    let reference = start_guest(&router, &exe, &[&["60", "0"], mode].concat()).wait_with_output().unwrap();
    assert!(reference.status.success(), "{}", String::from_utf8_lossy(&reference.stderr));
    let reference = String::from_utf8(reference.stdout).unwrap();
    drop(router);

    let router = TestRouter::start("emu");
    let mut guest = start_guest(&router, &exe, &[&["60", "40"], mode].concat());
    let mut out = BufReader::new(guest.stdout.take().unwrap());
    let mut printed = read_until(&mut out, "iteration 10 ");
    let id = session_id(&router);
    let image = tempfile::tempdir().unwrap();
    let dir = image.path().join("image");
    let old_server = router.router.session(id).unwrap().control_socket().unwrap();
    let ck_out = checkpoint(&router, id, &dir, &["--stop", "--compress"]);
    assert!(ck_out.contains("stopped until it is restored"), "{ck_out}");
    // The old server is gone; the session waits, suspended.
    assert!(!old_server.exists(), "the stopped session's server still runs");
    let listed = String::from_utf8(phosctl(&router, &["sessions"]).stdout).unwrap();
    assert!(listed.contains("suspended"), "{listed}");
    // Give the guest time to notice and wait for its session.
    std::thread::sleep(Duration::from_millis(300));
    let rs = phosctl(&router, &["restore", dir.to_str().unwrap()]);
    assert!(rs.status.success(), "restore: {}", String::from_utf8_lossy(&rs.stderr));
    let rest = {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut out, &mut s).unwrap();
        s
    };
    printed.push_str(&rest);
    let status = guest.wait().unwrap();
    let mut err = String::new();
    std::io::Read::read_to_string(&mut guest.stderr.take().unwrap(), &mut err).unwrap();
    assert!(status.success(), "the program failed after the restore: {err}");
    assert_eq!(printed, reference, "output differs from the uninterrupted run\nstderr:\n{err}");
    assert!(router.server_logs().contains("restored"), "{}", router.server_logs());
}

/// A thread whose last launch was not answered yet when its session was stopped, and that
/// then waits for another thread (calling CUDA no more), has that launch sent again on its
/// behalf by the other thread's new connection after the restore, so that no barrier of the
/// other thread waits for a call its idle thread would send only later (PyTorch's autograd
/// thread beside its main thread: a barrier that gave up after 30 s let the main thread run
/// ahead of a backward kernel). The restored session acknowledges it without running it
/// twice: the kernel adds, and the copy reads one addition.
#[test]
fn the_unanswered_launch_of_a_thread_idle_after_a_restore_is_sent_again_for_it() {
    let Some(nvcc) = nvcc() else { return };
    let exe = build_program(&nvcc, "restore_idle_thread", &["-arch=sm_70"]);
    let router = TestRouter::start("emu");
    let mut guest = Command::new(built("phosctl"))
        .args(["run", "--endpoint"])
        .arg(format!("unix:{}", router.socket().display()))
        .arg("--")
        .arg(&exe)
        .env("PHOS_GUEST_LIB", built("libphos_guest.so"))
        .env("PHOS_LOG", "info")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(guest.stdout.take().unwrap());
    read_until(&mut out, "ready");
    let id = session_id(&router);
    let image = tempfile::tempdir().unwrap();
    let dir = image.path().join("image");
    checkpoint(&router, id, &dir, &["--stop"]);
    let rs = phosctl(&router, &["restore", dir.to_str().unwrap()]);
    assert!(rs.status.success(), "restore: {}", String::from_utf8_lossy(&rs.stderr));
    // The main thread's copy now finds its connection gone, and reconnects.
    std::io::Write::write_all(guest.stdin.as_mut().unwrap(), b"go\n").unwrap();
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut out, &mut rest).unwrap();
    let status = guest.wait().unwrap();
    let mut err = String::new();
    std::io::Read::read_to_string(&mut guest.stderr.take().unwrap(), &mut err).unwrap();
    assert!(status.success(), "the program failed after the restore: {rest}\n{err}\n{}", router.server_logs());
    assert_eq!(rest, "value 42\nPASS\n", "{err}");
    assert!(err.contains("sending again the async calls of threads whose connections"), "{err}");
    let logs = router.server_logs();
    assert!(!logs.contains("barrier gave up"), "{logs}");
}

/// A synchronous call that ran before the session was checkpointed and stopped, its answer
/// lost with the connection the stop cut, is sent again by the guest after the restore
/// (flagged as resent, with its id): the image kept its reply, and the restored session
/// answers with it instead of running the call again (a cudaMalloc allocates once).
#[test]
fn a_synchronous_call_whose_answer_a_stop_cut_is_not_run_again_after_the_restore() {
    use phos_protocol::cudart::{CudaFreeRequest, CudaMallocRequest, CudaMemGetInfoRequest};
    use phos_protocol::frame::FLAG_RESENT;
    use phos_tests::RawGuest;
    const SIZE: u64 = 4 << 20;
    let router = TestRouter::start("emu");
    let mut a = RawGuest::connect(&router.socket(), None).expect("a session");
    let token = a.welcome.token;
    let before = a.call(&CudaMemGetInfoRequest {}).expect("cudaMemGetInfo").free;
    a.send_as(&CudaMallocRequest { size: SIZE }, 900, 0).unwrap();
    // It ran (its answer came; the guest is taken not to have read it).
    let p = a.reply_to::<CudaMallocRequest>(900).expect("allocated").devPtr;
    let id = session_id(&router);
    let image = tempfile::tempdir().unwrap();
    let dir = image.path().join("image");
    checkpoint(&router, id, &dir, &["--stop"]);
    drop(a);
    let rs = phosctl(&router, &["restore", dir.to_str().unwrap()]);
    assert!(rs.status.success(), "restore: {}", String::from_utf8_lossy(&rs.stderr));
    let mut b = RawGuest::connect(&router.socket(), Some(token)).expect("back in the restored session");
    b.send_as(&CudaMallocRequest { size: SIZE }, 900, FLAG_RESENT).unwrap();
    assert_eq!(b.reply_to::<CudaMallocRequest>(900).expect("answered").devPtr, p, "the kept reply");
    b.call(&CudaFreeRequest { devPtr: p }).expect("its one allocation");
    assert_eq!(b.call(&CudaMemGetInfoRequest {}).expect("cudaMemGetInfo").free, before, "allocated once");
    let logs = router.server_logs();
    assert!(logs.contains("answered with its kept reply"), "{logs}");
}

/// A router whose emu servers present two devices.
fn two_device_router() -> TestRouter {
    TestRouter::start_with("emu", |c| c.server_args.extend(["--emu-devices".to_string(), "2".to_string()]))
}

/// A session started on device 0 of a two-device machine is stopped and restored onto device
/// 1 (`--device 1`): the program, which checks at every step that its device is still 0
/// and its memory on it, finishes printing what an uninterrupted run prints, while the
/// restored server puts its device 0 on device 1. A restore onto a device the machine does
/// not have is refused first, naming it, and changes nothing.
#[test]
fn a_session_restored_onto_another_device_keeps_its_device_numbers() {
    stop_and_restore_onto_device(0, 1);
}

/// The same for a session that made device 1 current before it made anything, restored onto
/// device 0: the program still sees device 1 (and two devices).
#[test]
fn a_session_on_device_1_restored_onto_device_0_still_sees_device_1() {
    stop_and_restore_onto_device(1, 0);
}

fn stop_and_restore_onto_device(device: u32, to: u32) {
    let Some(nvcc) = nvcc() else { return };
    let exe = build_program(&nvcc, "device_numbers", &["-arch=sm_70"]);
    let used = device.to_string();
    let router = two_device_router();
    let reference = start_guest(&router, &exe, &[&used, "40", "0"]).wait_with_output().unwrap();
    assert!(reference.status.success(), "{}", String::from_utf8_lossy(&reference.stdout));
    let reference = String::from_utf8(reference.stdout).unwrap();
    drop(router);

    let router = two_device_router();
    let mut guest = start_guest(&router, &exe, &[&used, "40", "40"]);
    let mut out = BufReader::new(guest.stdout.take().unwrap());
    let mut printed = read_until(&mut out, "iteration 10 ");
    let id = session_id(&router);
    let image = tempfile::tempdir().unwrap();
    let dir = image.path().join("image");
    checkpoint(&router, id, &dir, &["--stop"]);
    std::thread::sleep(Duration::from_millis(300));
    // No device 2 on this machine: refused, naming it; the session keeps waiting.
    let rs = phosctl(&router, &["restore", dir.to_str().unwrap(), "--device", "2"]);
    let err = String::from_utf8_lossy(&rs.stderr);
    assert_eq!(rs.status.code(), Some(REFUSED), "{err}");
    assert!(err.contains("device 2 does not exist here (2 devices)"), "{err}");
    let listed = String::from_utf8(phosctl(&router, &["sessions"]).stdout).unwrap();
    assert!(listed.contains("suspended"), "{listed}");
    let rs = phosctl(&router, &["restore", dir.to_str().unwrap(), "--device", &to.to_string()]);
    assert!(rs.status.success(), "restore: {}\n{}", String::from_utf8_lossy(&rs.stderr), router.server_logs());
    let rest = {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut out, &mut s).unwrap();
        s
    };
    printed.push_str(&rest);
    let status = guest.wait().unwrap();
    let mut err = String::new();
    std::io::Read::read_to_string(&mut guest.stderr.take().unwrap(), &mut err).unwrap();
    assert!(status.success(), "the program failed after the restore: {err}\n{printed}\n{}", router.server_logs());
    assert_eq!(printed, reference, "output differs from the uninterrupted run\nstderr:\n{err}");
    let logs = router.server_logs();
    assert!(logs.contains(&format!("its device {device} on device {to}")), "{logs}");
}

#[test]
fn a_corrupted_image_is_refused_and_changes_nothing() {
    let Some(nvcc) = nvcc() else { return };
    let exe = build_program(&nvcc, "iterative", &["-arch=sm_70"]);
    let router = TestRouter::start("emu");
    let (mut guest, _out, id) = iterative_at_ten(&router, &exe, &["120", "40"]);
    let image = tempfile::tempdir().unwrap();
    let dir = image.path().join("image");
    checkpoint(&router, id, &dir, &[]);
    // The session is still running (the checkpoint did not stop it): restoring over it is
    // refused.
    let rs = phosctl(&router, &["restore", dir.to_str().unwrap()]);
    assert_eq!(rs.status.code(), Some(REFUSED));
    assert!(String::from_utf8_lossy(&rs.stderr).contains("is running"), "{}", String::from_utf8_lossy(&rs.stderr));
    // A truncated manifest is refused with a clear message.
    let trunc = image.path().join("truncated");
    std::fs::create_dir(&trunc).unwrap();
    let manifest = std::fs::read(dir.join(phos_checkpoint::MANIFEST_FILE)).unwrap();
    std::fs::write(trunc.join(phos_checkpoint::MANIFEST_FILE), &manifest[..manifest.len() / 2]).unwrap();
    std::fs::copy(dir.join(phos_checkpoint::MEMORY_FILE), trunc.join(phos_checkpoint::MEMORY_FILE)).unwrap();
    let rs = phosctl(&router, &["restore", trunc.to_str().unwrap()]);
    assert_eq!(rs.status.code(), Some(REFUSED));
    assert!(String::from_utf8_lossy(&rs.stderr).contains("truncated"), "{}", String::from_utf8_lossy(&rs.stderr));
    // Another format version is refused, naming both versions.
    let other = image.path().join("other-version");
    std::fs::create_dir(&other).unwrap();
    let mut m = manifest.clone();
    m[8..12].copy_from_slice(&(phos_checkpoint::FORMAT_VERSION + 1).to_le_bytes());
    std::fs::write(other.join(phos_checkpoint::MANIFEST_FILE), &m).unwrap();
    std::fs::copy(dir.join(phos_checkpoint::MEMORY_FILE), other.join(phos_checkpoint::MEMORY_FILE)).unwrap();
    let rs = phosctl(&router, &["restore", other.to_str().unwrap()]);
    assert_eq!(rs.status.code(), Some(REFUSED));
    assert!(String::from_utf8_lossy(&rs.stderr).contains("format version"), "{}", String::from_utf8_lossy(&rs.stderr));
    // The running program is unaffected and finishes.
    let status = guest.wait().unwrap();
    assert!(status.success());
}

#[test]
fn a_corrupted_image_of_a_stopped_session_is_refused_before_anything_runs() {
    let Some(nvcc) = nvcc() else { return };
    let exe = build_program(&nvcc, "iterative", &["-arch=sm_70"]);
    let router = TestRouter::start("emu");
    let (mut guest, _out, id) = iterative_at_ten(&router, &exe, &["120", "40"]);
    let image = tempfile::tempdir().unwrap();
    let dir = image.path().join("image");
    checkpoint(&router, id, &dir, &["--stop"]);
    // A byte of the largest memory file (there is one per writer of the checkpoint).
    let mem = memory_files(&dir).into_iter().max_by_key(|p| std::fs::metadata(p).unwrap().len()).unwrap();
    let good = std::fs::read(&mem).unwrap();
    let mut bad = good.clone();
    bad[good.len() / 3] ^= 1;
    std::fs::write(&mem, &bad).unwrap();
    // A full restore checks every chunk before the session is served.
    let rs = phosctl(&router, &["restore", dir.to_str().unwrap(), "--full"]);
    assert_eq!(rs.status.code(), Some(REFUSED));
    assert!(String::from_utf8_lossy(&rs.stderr).contains("checksum"), "{}", String::from_utf8_lossy(&rs.stderr));
    assert!(router.router.session(id).unwrap().control_socket().is_none(), "no server was left running");
    // With the image repaired, the restore works and the program completes.
    std::fs::write(&mem, &good).unwrap();
    let rs = phosctl(&router, &["restore", dir.to_str().unwrap()]);
    assert!(rs.status.success(), "{}", String::from_utf8_lossy(&rs.stderr));
    assert!(guest.wait().unwrap().success());
}

/// Four host threads, each launching on its own stream, stopped (stop-the-world) and
/// restored three times: the calls each thread had sent and not yet seen answered go to the
/// restored session again, and those that had run before the image (answered in a batch the
/// cut channel never delivered) must not run twice: every thread's checks of its buffer hold.
#[test]
fn a_multi_threaded_program_stopped_and_restored_again_and_again_passes() {
    stopped_and_restored_again_and_again(TestRouter::start("emu"));
}

/// The same with each channel's launches submitted by a thread of their own (the default on
/// a GPU machine): a stop waits for the launches queued before it.
#[test]
fn stopped_and_restored_again_and_again_with_queued_launches() {
    stopped_and_restored_again_and_again(queued_launches_router());
}

/// A router whose API servers queue each channel's async launches for a submitter thread.
fn queued_launches_router() -> TestRouter {
    TestRouter::start_with("emu", |c| c.server_args.extend(["--launch-pipeline".into(), "on".into()]))
}

fn stopped_and_restored_again_and_again(router: TestRouter) {
    let Some(nvcc) = nvcc() else { return };
    let exe = build_program(&nvcc, "stream_traffic", &["-arch=sm_70"]);
    let guest = start_guest(&router, &exe, &["3000"]);
    let id = session_id(&router);
    let image = tempfile::tempdir().unwrap();
    for k in 0..3 {
        std::thread::sleep(Duration::from_millis(400));
        let dir = image.path().join(format!("image{k}"));
        let printed = checkpoint(&router, id, &dir, &["--stop"]);
        assert!(printed.contains("stopped until it is restored"), "{printed}");
        let rs = phosctl(&router, &["restore", dir.to_str().unwrap()]);
        assert!(rs.status.success(), "restore {k}: {}", String::from_utf8_lossy(&rs.stderr));
    }
    let out = guest.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{:?}\nstdout: {}\nstderr: {}\nservers: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        router.server_logs()
    );
    let want: String = (0..4).map(|t| format!("thread {t}: 3000 rounds\n")).collect::<String>() + "PASS\n";
    assert_eq!(String::from_utf8_lossy(&out.stdout), want);
}

/// Repeated concurrent (copy-on-write) checkpoints of four host threads on four streams: each
/// image is the session between calls, and the program's output is unchanged.
#[test]
fn a_checkpoint_during_multi_stream_traffic_is_consistent() {
    checkpoints_during_multi_stream_traffic(TestRouter::start("emu"));
}

/// The same with each channel's launches submitted by a thread of their own: the checkpoint's
/// quiesce waits for the launches queued before it, so no image holds a kernel half-applied.
#[test]
fn a_checkpoint_during_multi_stream_traffic_with_queued_launches_is_consistent() {
    checkpoints_during_multi_stream_traffic(queued_launches_router());
}

fn checkpoints_during_multi_stream_traffic(router: TestRouter) {
    let Some(nvcc) = nvcc() else { return };
    let exe = build_program(&nvcc, "stream_traffic", &["-arch=sm_70"]);
    let guest = start_guest(&router, &exe, &["4000"]);
    let id = session_id(&router);
    std::thread::sleep(Duration::from_millis(500));
    let image = tempfile::tempdir().unwrap();
    let mut checked = 0;
    for k in 0..3 {
        let dir = image.path().join(format!("image{k}"));
        let printed = checkpoint(&router, id, &dir, &[]);
        assert!(printed.contains("copy-on-write") && !printed.contains("taken again"), "{printed}");
        // Every buffer the threads update must hold a single value: the image was taken
        // between calls, with no kernel half-applied.
        let mut img = phos_checkpoint::Image::open(&dir).unwrap();
        let regions = img.manifest.memory.clone();
        let mut buf = Vec::new();
        for r in regions.iter().filter(|r| r.size == 4 << 16) {
            let mut first = None;
            for c in &r.chunks {
                img.read_chunk(c, &mut buf).unwrap();
                for w in buf.chunks_exact(4) {
                    let v = u32::from_le_bytes(w.try_into().unwrap());
                    let f = *first.get_or_insert(v);
                    assert_eq!(v, f, "buffer {:#x} is torn in checkpoint {k}", r.addr);
                }
            }
            checked += 1;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(checked > 0, "the checkpoints saw the traffic's buffers");
    // The router's metrics count them, with the last one's figures.
    let metrics = phos_router::metrics::render(&router.router);
    assert!(metrics.contains("phos_checkpoints_total{mode=\"copy-on-write\"} 3"), "{metrics}");
    assert!(metrics.contains("phos_checkpoint_last_stall_seconds{mode=\"copy-on-write\"}"), "{metrics}");
    let out = guest.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // Concurrent checkpoints change nothing the program sees.
    let want: String = (0..4).map(|t| format!("thread {t}: 4000 rounds\n")).collect::<String>() + "PASS\n";
    assert_eq!(String::from_utf8_lossy(&out.stdout), want);
}

/// An on-demand restore serves the session before it has read every chunk: a chunk that
/// fails its checksum during the load fails the session (its calls report a sticky error, so
/// its program stops rather than compute with memory that is not its own), and `phosctl
/// restore` says so and exits with status 1.
#[test]
fn a_bad_chunk_found_during_an_on_demand_load_fails_the_session() {
    let Some(nvcc) = nvcc() else { return };
    let exe = build_program(&nvcc, "iterative", &["-arch=sm_70"]);
    let router = TestRouter::start("emu");
    let (mut guest, _out, id) = iterative_at_ten(&router, &exe, &["120", "40"]);
    let image = tempfile::tempdir().unwrap();
    let dir = image.path().join("image");
    checkpoint(&router, id, &dir, &["--stop"]);
    // A byte inside a stored chunk (a memory file also holds padding no checksum covers).
    let chunk = phos_checkpoint::Image::open(&dir)
        .unwrap()
        .manifest
        .memory
        .iter()
        .flat_map(|r| r.chunks.clone())
        .find(|c| c.stored > 0)
        .expect("a stored chunk");
    let mem = dir.join(phos_checkpoint::memory_file_name(chunk.file));
    let mut bad = std::fs::read(&mem).unwrap();
    bad[(chunk.at + chunk.stored / 2) as usize] ^= 1;
    std::fs::write(&mem, &bad).unwrap();
    let rs = phosctl(&router, &["restore", dir.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&rs.stderr);
    assert_eq!(rs.status.code(), Some(1), "{err}");
    assert!(err.contains("loading its memory after the restore failed") && err.contains("checksum"), "{err}");
    assert!(!guest.wait().unwrap().success(), "the program went on with memory that failed its checksum");
    assert!(router.server_logs().contains("loading the restored memory failed"), "{}", router.server_logs());
}

#[test]
fn restore_from_the_server_pool() {
    let Some(nvcc) = nvcc() else { return };
    let exe = build_program(&nvcc, "iterative", &["-arch=sm_70"]);
    let router = TestRouter::start_with("emu", |c| c.pool_size = 2);
    let (mut guest, _out, id) = iterative_at_ten(&router, &exe, &["40", "30"]);
    let image = tempfile::tempdir().unwrap();
    let dir = image.path().join("image");
    checkpoint(&router, id, &dir, &["--stop"]);
    // Let the pool refill.
    std::thread::sleep(Duration::from_millis(500));
    let rs = phosctl(&router, &["restore", dir.to_str().unwrap()]);
    assert!(rs.status.success(), "{}", String::from_utf8_lossy(&rs.stderr));
    assert!(String::from_utf8_lossy(&rs.stdout).contains("pooled server"), "{}", String::from_utf8_lossy(&rs.stdout));
    assert!(guest.wait().unwrap().success());
}

/// The memory files of the image at `dir` (`memory`, `memory.1`, ...).
fn memory_files(dir: &Path) -> Vec<std::path::PathBuf> {
    (0..phos_checkpoint::MAX_MEMORY_FILES)
        .map(|i| dir.join(phos_checkpoint::memory_file_name(i)))
        .take_while(|p| p.exists())
        .collect()
}

/// A copy of the image at `dir`, named `name` beside it, whose manifest `edit` changed and
/// whose checksum is recomputed: a forged image that no checksum catches.
fn forged(dir: &Path, name: &str, edit: impl FnOnce(&mut phos_checkpoint::Manifest)) -> std::path::PathBuf {
    let out = dir.parent().unwrap().join(name);
    std::fs::create_dir_all(&out).unwrap();
    for file in memory_files(dir) {
        std::fs::copy(&file, out.join(file.file_name().unwrap())).unwrap();
    }
    let mut m = phos_checkpoint::Image::open(dir).unwrap().manifest;
    edit(&mut m);
    phos_checkpoint::write_manifest(&out, &m).unwrap();
    out
}

/// The `kind` handle a record of the image created.
fn created(m: &phos_checkpoint::Manifest, kind: &str) -> u64 {
    m.records.iter().flat_map(|r| &r.creates).find(|(k, _)| k == kind).map(|(_, v)| *v).expect(kind)
}

/// Images whose checksums are right but whose content no real session could have are
/// refused with what is wrong, before anything is created: counters near 2^64 or below the
/// handles in use (new objects would collide with live ones), handles of the wrong kind,
/// memory outside the session's range, duplicated objects, another tenant's or another
/// session's identity. The stopped session then comes back from its real image, and a
/// session beside it is unaffected throughout.
#[test]
fn forged_images_are_refused_for_what_they_say() {
    let Some(nvcc) = nvcc() else { return };
    let exe = build_program(&nvcc, "iterative", &["-arch=sm_70"]);
    // Built before the guest starts: a build waits for other tests' builds, and the guest
    // must still be running when the checkpoint comes.
    let neighbour_exe = build_program(&nvcc, "vector_add", &["-arch=sm_70"]);
    let router = TestRouter::start("emu");
    let (mut guest, _out, id) = iterative_at_ten(&router, &exe, &["120", "40"]);
    let neighbour = start_guest(&router, &neighbour_exe, &[]);
    let image = tempfile::tempdir().unwrap();
    let dir = image.path().join("image");
    checkpoint(&router, id, &dir, &["--stop"]);
    // A suspended session has nothing to checkpoint.
    let again = phosctl(&router, &["checkpoint", &id.to_string(), "--out", dir.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&again.stderr);
    assert_eq!(again.status.code(), Some(REFUSED), "{err}");
    assert!(err.contains(&format!("session {id} is suspended")), "{err}");
    let m = phos_checkpoint::Image::open(&dir).unwrap().manifest;
    let (stream, function) = (created(&m, "stream"), created(&m, "function"));
    let module_number = created(&m, "module") & ((1 << 48) - 1);
    type Edit = Box<dyn FnOnce(&mut phos_checkpoint::Manifest)>;
    let cases: Vec<(&str, Edit, &str)> = vec![
        (
            "counter-near-2-64",
            Box::new(|m| m.handle_counters.iter_mut().for_each(|c| c.1 = u64::MAX - 3)),
            "handles number their objects from 1 to 2^48",
        ),
        (
            "counter-below-handles",
            Box::new(move |m| {
                m.handle_counters.iter_mut().filter(|c| c.0 == "module").for_each(|c| c.1 = module_number)
            }),
            "would collide with live ones",
        ),
        (
            "function-with-a-stream-handle",
            Box::new(move |m| {
                for r in &mut m.records {
                    for c in r.creates.iter_mut().filter(|c| c.1 == function) {
                        c.1 = stream + 77;
                    }
                }
            }),
            "which is no function handle",
        ),
        (
            "memory-outside-the-range",
            Box::new(|m| {
                let r = m.memory.iter_mut().find(|r| r.kind == phos_checkpoint::RegionKind::Allocation).unwrap();
                r.addr = 0x1000;
            }),
            "outside the session's device range",
        ),
        (
            "a-stream-twice",
            Box::new(|m| {
                let twice = m.records.iter().find(|r| r.name == "cudaStreamCreate").unwrap().clone();
                m.records.push(twice);
            }),
            "two records create stream",
        ),
        ("arrays-that-do-not-decode", Box::new(|m| m.arrays = vec![7; 40]), "the arrays do not decode"),
        (
            "a-conditional-handle-of-no-cell",
            Box::new(|m| {
                let cell = m.session.device_base + 8;
                m.conditionals.push(phos_checkpoint::ConditionalHandle {
                    cell,
                    device: 0,
                    graph: 1,
                    default: 0,
                    flags: 0,
                })
            }),
            "no cell of the session's memory",
        ),
        ("another-tenant", Box::new(|m| m.session.tenant = "uid:4242".into()), "belongs to tenant \"uid:0\""),
        ("another-session", Box::new(|m| m.session.token[0] ^= 1), "another session's token"),
        ("abi-9999", Box::new(|m| m.session.abi_major = 9999), "CUDA ABI 9999"),
    ];
    for (name, edit, why) in cases {
        let bad = forged(&dir, name, edit);
        let rs = phosctl(&router, &["restore", bad.to_str().unwrap()]);
        let err = String::from_utf8_lossy(&rs.stderr);
        assert_eq!(rs.status.code(), Some(REFUSED), "{name}: {err}");
        assert!(err.contains(why), "{name}: {err}");
        assert!(router.router.session(id).unwrap().control_socket().is_none(), "{name}: a server was left running");
    }
    let out = neighbour.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // The real image brings the session back, and its program finishes.
    let rs = phosctl(&router, &["restore", dir.to_str().unwrap()]);
    assert!(rs.status.success(), "{}", String::from_utf8_lossy(&rs.stderr));
    assert!(guest.wait().unwrap().success());
}

/// A session the router does not have (another router's, say) is only created from an image
/// when the operator names its tenant: `--tenant` must be the image's, `--as-tenant` makes it
/// another (known) tenant's. The router the image came from restores its own session as
/// before.
#[test]
fn a_new_session_from_an_image_needs_the_operators_word_on_its_tenant() {
    let Some(nvcc) = nvcc() else { return };
    let exe = build_program(&nvcc, "iterative", &["-arch=sm_70"]);
    let router = TestRouter::start("emu");
    let (mut guest, _out, id) = iterative_at_ten(&router, &exe, &["120", "40"]);
    let image = tempfile::tempdir().unwrap();
    let dir = image.path().join("image");
    checkpoint(&router, id, &dir, &["--stop"]);
    let d = dir.to_str().unwrap();
    let elsewhere = TestRouter::start("emu");
    let refused = |args: &[&str], why: &str| {
        let rs = phosctl(&elsewhere, &[&["restore", d][..], args].concat());
        let err = String::from_utf8_lossy(&rs.stderr);
        assert!(rs.status.code() == Some(REFUSED) && err.contains(why), "{args:?}: {err}");
    };
    refused(&[], "is not in this router");
    refused(&["--tenant", "uid:9"], "belongs to tenant \"uid:0\", not \"uid:9\"");
    refused(&["--as-tenant", "nobody"], "no tenant \"nobody\"");
    assert!(elsewhere.router.sessions().is_empty(), "nothing was created");
    let rs = phosctl(&elsewhere, &["restore", d, "--tenant", "uid:0"]);
    assert!(rs.status.success(), "{}", String::from_utf8_lossy(&rs.stderr));
    assert_eq!(elsewhere.router.session(id).unwrap().tenant.0, "uid:0");
    refused(&["--tenant", "uid:0"], "is running");
    let third = TestRouter::start("emu");
    let rs = phosctl(&third, &["restore", d, "--as-tenant", "uid:1234"]);
    assert!(rs.status.success(), "{}", String::from_utf8_lossy(&rs.stderr));
    assert_eq!(third.router.session(id).unwrap().tenant.0, "uid:1234");
    // The session's own router needs no word: the session is there, suspended.
    let rs = phosctl(&router, &["restore", d]);
    assert!(rs.status.success(), "{}", String::from_utf8_lossy(&rs.stderr));
    assert!(guest.wait().unwrap().success());
}

/// What `phosctl` says when there is nothing to manage, and its exit status for each kind of
/// failure: no such session or policy, no router there.
#[test]
fn phosctl_names_what_is_missing_and_exits_with_its_class() {
    let router = TestRouter::start("emu");
    let out = tempfile::tempdir().unwrap();
    let image = out.path().join("image");
    let ck = phosctl(&router, &["checkpoint", "999", "--out", image.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&ck.stderr);
    assert_eq!(ck.status.code(), Some(NOT_FOUND), "{err}");
    assert!(err.contains("no session 999"), "{err}");
    let show = phosctl(&router, &["policy", "show", "nothing"]);
    let err = String::from_utf8_lossy(&show.stderr);
    assert_eq!(show.status.code(), Some(NOT_FOUND), "{err}");
    assert!(err.contains("no policy named `nothing`"), "{err}");
    let nowhere = out.path().join("no-router.sock");
    let listed = Command::new(built("phosctl"))
        .args(["sessions", "--router"])
        .arg(format!("unix:{}", nowhere.display()))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&listed.stderr);
    assert_eq!(listed.status.code(), Some(UNAVAILABLE), "{err}");
    assert!(err.contains("cannot reach the router at") && err.contains("no-router.sock.ctl"), "{err}");
}

/// `rewriter MODE...` on `router`, with its stdin and stdout piped.
fn start_rewriter(router: &TestRouter, exe: &Path, args: &[&str]) -> (Child, BufReader<ChildStdout>) {
    let mut guest = Command::new(built("phosctl"))
        .args(["run", "--endpoint"])
        .arg(format!("unix:{}", router.socket().display()))
        .arg("--")
        .arg(exe)
        .args(args)
        .env("PHOS_GUEST_LIB", built("libphos_guest.so"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = BufReader::new(guest.stdout.take().unwrap());
    (guest, out)
}

/// Tell a waiting `rewriter` to finish; it must end with PASS.
fn finish_rewriter(mut guest: Child, mut out: BufReader<ChildStdout>) {
    use std::io::Write;
    guest.stdin.take().unwrap().write_all(b"go on\n").unwrap();
    let rest = read_until(&mut out, "PASS");
    let status = guest.wait().unwrap();
    let mut err = String::new();
    std::io::Read::read_to_string(&mut guest.stderr.take().unwrap(), &mut err).unwrap();
    assert!(status.success(), "rewriter failed: {rest}{err}");
}

/// Every region of the image at `dir`: (address, size, contents).
fn image_memory(dir: &Path) -> Vec<(u64, u64, Vec<u8>)> {
    let mut img = phos_checkpoint::Image::open(dir).unwrap();
    let regions = img.manifest.memory.clone();
    let mut buf = Vec::new();
    regions
        .iter()
        .map(|r| {
            let mut bytes = vec![0u8; r.size as usize];
            for c in &r.chunks {
                img.read_chunk(c, &mut buf).unwrap();
                bytes[c.offset as usize..][..c.len as usize].copy_from_slice(&buf[..c.len as usize]);
            }
            (r.addr, r.size, bytes)
        })
        .collect()
}

/// `rewriter`'s step counter in an image: its first 8-byte allocation.
fn rewriter_step(memory: &[(u64, u64, Vec<u8>)]) -> u64 {
    let (_, _, bytes) = memory.iter().filter(|r| r.1 == 8).min_by_key(|r| r.0).expect("the step counter");
    u64::from_le_bytes(bytes[..8].try_into().unwrap())
}

/// A copy-on-write checkpoint of a program that rewrites its memory as fast as it can is
/// the program at one point: the same bytes, region by region, as a stop-the-world
/// checkpoint of the same program stopped at that point (its step counter says which;
/// `rewriter`'s memory after step c depends on c alone).
#[test]
fn a_concurrent_checkpoint_equals_a_stop_the_world_one_from_the_same_point() {
    let Some(printed) = same_as_stop_the_world_at_its_step(&[]) else { return };
    assert!(printed.contains("copy-on-write") && !printed.contains("taken again"), "{printed}");
    // The writer wrote buffers the copy had not reached: they were copied ahead of it.
    assert!(
        printed.contains("MiB copied aside ahead of writes") && !printed.contains("(0.0 MiB copied aside"),
        "{printed}"
    );
}

/// The same for a recopy checkpoint (the program at the checkpoint's end).
#[test]
fn a_recopy_checkpoint_equals_a_stop_the_world_one_from_the_same_point() {
    let Some(printed) = same_as_stop_the_world_at_its_step(&["--recopy"]) else { return };
    assert!(printed.contains("recopy:") && !printed.contains("(0 recopy rounds"), "{printed}");
}

/// Checkpoint `rewriter run` with `phosctl checkpoint ARGS`, then `rewriter pause STEP`
/// stop-the-world at the step the first image holds: both images must hold the same
/// memory. What the first checkpoint printed (`None` without nvcc).
fn same_as_stop_the_world_at_its_step(args: &[&str]) -> Option<String> {
    let nvcc = nvcc()?;
    let exe = build_program(&nvcc, "rewriter", &["-arch=sm_70"]);
    let image = tempfile::tempdir().unwrap();
    let concurrent = image.path().join("concurrent");
    let printed = {
        let router = TestRouter::start("emu");
        let (guest, mut out) = start_rewriter(&router, &exe, &["run"]);
        read_until(&mut out, "running");
        let printed = checkpoint(&router, session_id(&router), &concurrent, args);
        finish_rewriter(guest, out);
        printed
    };
    let taken = image_memory(&concurrent);
    let step = rewriter_step(&taken);
    assert!(step >= 8, "the image is from before the program ran ({step})");

    let stopped = image.path().join("stopped");
    let router = TestRouter::start("emu");
    let (guest, mut out) = start_rewriter(&router, &exe, &["pause", &step.to_string()]);
    read_until(&mut out, "paused at");
    let reference_printed = checkpoint(&router, session_id(&router), &stopped, &["--stop-the-world"]);
    assert!(reference_printed.contains("stop-the-world"), "{reference_printed}");
    finish_rewriter(guest, out);
    let reference = image_memory(&stopped);
    assert_eq!(taken.len(), reference.len(), "the images have different regions");
    for ((addr, size, bytes), (raddr, rsize, rbytes)) in taken.iter().zip(&reference) {
        assert_eq!((addr, size), (raddr, rsize), "the images have different regions");
        assert!(
            bytes == rbytes,
            "region {addr:#x} ({size} bytes) differs from the stop-the-world image at step {step}"
        );
    }
    Some(printed)
}

/// A kernel that stores through a pointer it loads from device memory (nothing speculation
/// can see) during a concurrent checkpoint: its checked twin flags the store, the checkpoint
/// is taken again stop-the-world, and the image holds the program at one point (the word
/// the pointer names holds the step counter's value, as after every step).
#[test]
fn a_store_through_a_pointer_in_memory_is_caught_during_a_concurrent_checkpoint() {
    let Some(nvcc) = nvcc() else { return };
    let exe = build_program(&nvcc, "rewriter", &["-arch=sm_70"]);
    let router = TestRouter::start("emu");
    let (guest, mut out) = start_rewriter(&router, &exe, &["indirect"]);
    read_until(&mut out, "running");
    let image = tempfile::tempdir().unwrap();
    let dir = image.path().join("image");
    let printed = checkpoint(&router, session_id(&router), &dir, &[]);
    finish_rewriter(guest, out);
    assert!(
        printed.contains("taken again stop-the-world") && printed.contains("outside what its launch was speculated"),
        "{printed}"
    );
    let memory = image_memory(&dir);
    let step = rewriter_step(&memory);
    let (_, _, target) = memory.iter().find(|r| r.1 == 4096).expect("the word written through the pointer");
    assert_eq!(u32::from_le_bytes(target[..4].try_into().unwrap()) as u64, step, "the image is torn");
}

/// A session that maps memory of its own through the driver API's virtual memory management
/// is refused a checkpoint, with a message that names it, and carries on.
#[test]
fn a_session_with_program_mappings_is_refused_a_checkpoint() {
    let Some(nvcc) = nvcc() else { return };
    let exe = build_program(&nvcc, "driver_api", &["-arch=sm_70", "-lcuda"]);
    let router = TestRouter::start("emu");
    let mut guest = start_guest(&router, &exe, &["hold"]);
    let mut out = BufReader::new(guest.stdout.take().unwrap());
    read_until(&mut out, "holding mappings");
    let id = session_id(&router);
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("image");
    let ck = phosctl(&router, &["checkpoint", &id.to_string(), "--out", &image.display().to_string()]);
    let stderr = String::from_utf8_lossy(&ck.stderr);
    assert!(!ck.status.success(), "the checkpoint must be refused: {stderr}");
    assert!(stderr.contains("virtual memory management"), "names why: {stderr}");
    assert!(router.router.sessions().iter().any(|s| s.id == id), "the session carries on");
    let _ = guest.kill();
    let _ = guest.wait();
}

/// A session holding CUDA arrays (2D, layered, mipmapped with level handles handed out),
/// texture objects (of arrays and of linear memory), a surface object and a conditional
/// graph handle with an instantiated graph is stopped and restored (`how`: the checkpoint's
/// and the restore's options) once all are made: after the restore the program uses every
/// one of them by the handles and values it holds, and prints what an uninterrupted run
/// prints (the arrays' contents, the level handles, the conditional loop launched again and
/// instantiated again).
fn arrays_stopped_and_restored(checkpoint_options: &[&str], restore_options: &[&str]) {
    let Some(nvcc) = nvcc() else { return };
    // PTX only: CI's nvcc (11.8) cannot link a kernel calling cudaGraphSetConditional into
    // machine code; emu runs the PTX.
    let exe = build_program(&nvcc, "restore_arrays", &["-gencode", "arch=compute_70,code=compute_70"]);
    let expected = std::fs::read_to_string(phos_tests::cuda_dir().join("expected/restore_arrays.out")).unwrap();
    let router = TestRouter::start("emu");
    let mut guest = start_guest(&router, &exe, &["pause"]);
    let mut out = BufReader::new(guest.stdout.take().unwrap());
    let mut printed = read_until(&mut out, "arrays ready");
    let id = session_id(&router);
    let image = tempfile::tempdir().unwrap();
    let dir = image.path().join("image");
    let options: Vec<&str> = ["--stop"].into_iter().chain(checkpoint_options.iter().copied()).collect();
    checkpoint(&router, id, &dir, &options);
    let mut args = vec!["restore", dir.to_str().unwrap()];
    args.extend(restore_options);
    let rs = phosctl(&router, &args);
    assert!(rs.status.success(), "restore: {}\n{}", String::from_utf8_lossy(&rs.stderr), router.server_logs());
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut out, &mut rest).unwrap();
    printed.push_str(&rest);
    let status = guest.wait().unwrap();
    let mut err = String::new();
    std::io::Read::read_to_string(&mut guest.stderr.take().unwrap(), &mut err).unwrap();
    assert!(status.success(), "the program failed after the restore: {printed}\n{err}\n{}", router.server_logs());
    assert_eq!(printed, expected, "output differs from the native run\nstderr:\n{err}\n{}", router.server_logs());
    assert!(router.server_logs().contains("restored"), "{}", router.server_logs());
}

/// Stop-the-world, restored on demand (the default): the arrays come back before the
/// session is served, the linear memory a texture reads before any call runs.
#[test]
fn a_session_with_arrays_textures_surfaces_and_conditional_handles_is_stopped_and_restored() {
    arrays_stopped_and_restored(&["--compress"], &[]);
}

/// The recopy protocol, whose image is taken at its end with the session held, restored in
/// full.
#[test]
fn a_session_with_arrays_and_conditional_handles_survives_a_recopy_checkpoint() {
    arrays_stopped_and_restored(&["--recopy"], &["--full"]);
}

/// A copy-on-write checkpoint (the default) of a running session holding arrays, texture and
/// surface objects and a conditional handle: taken while the program pauses, the program then
/// carries on and finishes unchanged (it writes its arrays again), and the image, holding
/// them, restores as a new session on another router: every array, level handle, object
/// value and conditional cell made again.
#[test]
fn a_copy_on_write_checkpoint_of_a_session_with_arrays_restores_elsewhere() {
    let Some(nvcc) = nvcc() else { return };
    let exe = build_program(&nvcc, "restore_arrays", &["-gencode", "arch=compute_70,code=compute_70"]);
    let expected = std::fs::read_to_string(phos_tests::cuda_dir().join("expected/restore_arrays.out")).unwrap();
    let router = TestRouter::start("emu");
    let mut guest = start_guest(&router, &exe, &["pause"]);
    let mut out = BufReader::new(guest.stdout.take().unwrap());
    let mut printed = read_until(&mut out, "arrays ready");
    let id = session_id(&router);
    let image = tempfile::tempdir().unwrap();
    let dir = image.path().join("image");
    let said = checkpoint(&router, id, &dir, &[]);
    assert!(said.contains("copy-on-write"), "{said}");
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut out, &mut rest).unwrap();
    printed.push_str(&rest);
    assert!(guest.wait().unwrap().success(), "{printed}");
    assert_eq!(printed, expected, "the session carried on unchanged");
    let m = phos_checkpoint::Image::open(&dir).unwrap().manifest;
    assert!(!m.arrays.is_empty() && m.conditionals.len() == 1, "the image holds the arrays and the handle");
    let elsewhere = TestRouter::start("emu");
    let rs = phosctl(&elsewhere, &["restore", dir.to_str().unwrap(), "--tenant", &m.session.tenant]);
    assert!(rs.status.success(), "{}\n{}", String::from_utf8_lossy(&rs.stderr), elsewhere.server_logs());
    assert!(elsewhere.router.session(id).is_some());
}

/// A number printed after `before` in `text` (up to the next space).
fn figure(text: &str, before: &str) -> f64 {
    let at = text.find(before).unwrap_or_else(|| panic!("no {before:?} in {text}")) + before.len();
    text[at..].split(' ').next().unwrap().parse().unwrap_or_else(|e| panic!("{before:?} in {text}: {e}"))
}

/// On-demand restore: the restored session serves its guest's calls before its memory is
/// loaded (each chunk's load is slowed down, so that the race is real), and its first call
/// is a kernel reading a buffer whose memory is not loaded yet: it must wait for it, and
/// computes the right result. The next kernel reads every buffer through pointers stored in
/// device memory, which no analysis of its parameters sees: it must wait for the whole load,
/// and computes the right result too.
#[test]
fn an_on_demand_restore_serves_calls_before_their_memory_is_loaded() {
    let Some(nvcc) = nvcc() else { return };
    let exe = build_program(&nvcc, "restore_on_demand", &["-arch=sm_70"]);
    let router = TestRouter::start_with("emu", |c| {
        c.server_args.extend(["--restore-load-pace-ms".to_string(), "300".to_string()]);
    });
    let mut guest = Command::new(built("phosctl"))
        .args(["run", "--endpoint"])
        .arg(format!("unix:{}", router.socket().display()))
        .arg("--")
        .arg(&exe)
        .env("PHOS_GUEST_LIB", built("libphos_guest.so"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(guest.stdout.take().unwrap());
    read_until(&mut out, "ready");
    let id = session_id(&router);
    let image = tempfile::tempdir().unwrap();
    let dir = image.path().join("image");
    checkpoint(&router, id, &dir, &["--stop"]);
    // The guest's next call (the first kernel) waits in the router for the restore.
    std::io::Write::write_all(guest.stdin.as_mut().unwrap(), b"go\n").unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let restoring = Command::new(built("phosctl"))
        .args(["restore", dir.to_str().unwrap(), "--router"])
        .arg(format!("unix:{}", router.socket().display()))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // While the memory loads, the router's metrics follow it.
    let gauge = format!("phos_restore_memory_bytes{{session=\"{id}\",tenant=\"uid:0\"}} ");
    let deadline = Instant::now() + Duration::from_secs(30);
    let page = loop {
        let page = phos_router::metrics::render(&router.router);
        if page.contains(&gauge) || Instant::now() > deadline {
            break page;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(page.contains(&gauge) && page.contains("phos_restore_serving_seconds{"), "{page}");
    // A checkpoint meanwhile (copy-on-write) waits for the load: its image holds the
    // buffers' contents, not memory the restore had not loaded yet. The program goes on
    // and may end while it copies: its session ends only once the checkpoint is done.
    let again = image.path().join("again");
    let said = checkpoint(&router, id, &again, &[]);
    assert!(said.contains("copy-on-write: calls held") && !said.contains("taken again"), "{said}");
    let buffers = |dir: &Path| {
        let mut img = phos_checkpoint::Image::open(dir).unwrap();
        let mut all = Vec::new();
        let mut buf = Vec::new();
        for r in img.manifest.memory.clone().iter().filter(|r| r.size == 8 << 20) {
            for c in &r.chunks {
                img.read_chunk(c, &mut buf).unwrap();
                all.extend_from_slice(&buf[..c.len as usize]);
            }
        }
        all
    };
    let before = buffers(&dir);
    assert_eq!(before.len(), 6 * (8 << 20));
    assert!(before == buffers(&again), "a checkpoint during the load copied memory not loaded yet");
    let rs = restoring.wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&rs.stdout).into_owned();
    assert!(rs.status.success(), "restore: {said}{}", String::from_utf8_lossy(&rs.stderr));
    println!("{said}");
    assert!(said.contains("on demand: serving after"), "{said}");
    let first_call = figure(&said, "first call served ");
    let loaded = figure(&said, "all in ");
    assert!(first_call < loaded, "the first call came after the whole load: {said}");
    assert!(figure(&said, "calls held for memory: ") >= 1.0, "no call waited for memory: {said}");
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut out, &mut rest).unwrap();
    let status = guest.wait().unwrap();
    let mut err = String::new();
    std::io::Read::read_to_string(&mut guest.stderr.take().unwrap(), &mut err).unwrap();
    assert!(status.success(), "the program failed after the restore: {rest}{err}");
    assert_eq!(rest, "direct: ok\nthrough the table: ok\nevents: timed across the pause\nPASS\n", "{err}");
    let logs = router.server_logs();
    assert!(
        logs.contains("sum_through_table") && logs.contains("loads all memory before it runs"),
        "the kernel reading through the table was not found untracked: {logs}"
    );
}

/// A library program (`program`, linked with `link`) run with `checkpoint` as its argument,
/// stopped once it prints `ready` and restored into a new server: it finishes and prints
/// `after`.
fn library_program_survives_a_restore(program: &str, link: &str, ready: &str, after: &str) {
    library_program_with_flags_survives_a_restore(program, &[link], ready, after);
}

/// [`library_program_survives_a_restore`] with the program's link flags.
fn library_program_with_flags_survives_a_restore(program: &str, link: &[&str], ready: &str, after: &str) {
    library_program_mode_survives_a_restore(program, link, "checkpoint", ready, after);
}

/// [`library_program_with_flags_survives_a_restore`] in the program's `mode`.
fn library_program_mode_survives_a_restore(program: &str, link: &[&str], mode: &str, ready: &str, after: &str) {
    let Some(nvcc) = nvcc() else { return };
    let flags: Vec<&str> = ["-arch=sm_70"].into_iter().chain(link.iter().copied()).collect();
    let exe = build_program(&nvcc, program, &flags);
    let router = TestRouter::start("emu");
    let mut guest = start_guest(&router, &exe, &[mode]);
    let mut out = BufReader::new(guest.stdout.take().unwrap());
    read_until(&mut out, ready);
    let id = session_id(&router);
    let image = tempfile::tempdir().unwrap();
    let dir = image.path().join("image");
    checkpoint(&router, id, &dir, &["--stop"]);
    let rs = phosctl(&router, &["restore", dir.to_str().unwrap()]);
    assert!(rs.status.success(), "restore: {}", String::from_utf8_lossy(&rs.stderr));
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut out, &mut rest).unwrap();
    let status = guest.wait().unwrap();
    let mut err = String::new();
    std::io::Read::read_to_string(&mut guest.stderr.take().unwrap(), &mut err).unwrap();
    assert!(status.success(), "the program failed after the restore: {rest}\n{err}\n{}", router.server_logs());
    assert!(rest.contains(after), "{rest}\n{err}");
    assert!(router.server_logs().contains("restored"), "{}", router.server_logs());
}

/// A cuBLAS handle with its settings (stream, device pointer mode, math mode, workspace) is
/// recorded and made again on restore: after a stop and a restore into a new server, the
/// program finds the handle as it left it and its GEMM runs.
#[test]
fn a_cublas_handle_and_its_settings_survive_a_restore() {
    library_program_survives_a_restore("cublas_blas", "-lcublas", "cublas ready", "after the restore: the handle kept");
}

/// cuRAND generators, a device one on a stream and a host one, seeded and drawn from, are
/// recorded with their settings and their positions: after a stop and a restore into a new
/// server, each draws the numbers that follow the ones it drew before (emu's CPU generator
/// reaches any position directly).
#[test]
fn curand_generators_continue_after_a_restore() {
    library_program_survives_a_restore(
        "curand_montecarlo",
        "-lcurand",
        "curand ready",
        "after the restore: both generators draw on from where they were",
    );
}

/// A cuSOLVER handle with its stream is recorded and made again on restore: after a stop and a
/// restore into a new server, the program finds the handle on its stream and solves with the
/// LU factors and pivots it left in device memory before the checkpoint.
#[test]
fn a_cusolver_handle_and_its_stream_survive_a_restore() {
    library_program_survives_a_restore(
        "cusolver_dense",
        "-lcusolver",
        "cusolver ready",
        "after the restore: the handle kept its stream and the factors solve",
    );
}

/// A cuSPARSE handle with its stream, and descriptors among which a product whose size SpGEMM
/// chose, are recorded and made again on restore, in dependency order: after a stop and a
/// restore into a new server, the program finds the handle on its stream and the product with
/// its size and arrays, and computes with them.
#[test]
fn cusparse_handles_and_descriptors_survive_a_restore() {
    library_program_survives_a_restore(
        "cusparse_cg",
        // nvcc's list form: the program uses cuBLAS too.
        "-lcusparse,cublas",
        "cusparse ready",
        "after the restore: the handle kept its stream and the product its size and arrays",
    );
}

/// cuDNN's handle and backend descriptors (tensors the program destroyed but an operation
/// refers to, a graph naming the handle, heuristics, the engine configs they filled, a plan and
/// a variant pack, all finalized) are recorded with their attributes and fills and replayed in
/// order on restore: after a stop and a restore into a new server, the program reads the
/// variant pack's attributes back as it set them and the plan runs its convolution, as the host
/// computes it. By then the program had destroyed every descriptor but the plan and the pack:
/// the heuristics, its configs (one filled, one not), the graph, the operation, its tensors.
#[test]
fn cudnn_descriptors_survive_a_restore() {
    let link = phos_tests::cudnn_link_flags();
    library_program_with_flags_survives_a_restore(
        "cudnn_conv",
        &[&link[0], &link[1]],
        "cudnn ready",
        "after the restore: the descriptors kept their attributes\n\
         execute: 75 outputs, as the host convolution\ndone",
    );
}

/// A cuDNN plan's making, stopped and restored at each of its stages (as a framework's
/// training process may be): with the heuristics' configs just filled (before any plan), and
/// with the plan made and the configs and heuristics destroyed (the fill replayed with the
/// configs the program still has, the destroyed ones stood in for, the heuristics hidden again
/// once its config is filled). The program goes on to make its plan (or use it) and runs the
/// convolution, as the host computes it.
#[test]
fn a_cudnn_plan_survives_a_restore_at_each_stage() {
    let link = phos_tests::cudnn_link_flags();
    for (mode, after) in [
        ("checkpoint-configs", "plan: finalized\nexecute: 75 outputs, as the host convolution\ndone"),
        ("checkpoint-plan", "execute: 75 outputs, as the host convolution\ndone"),
    ] {
        library_program_mode_survives_a_restore("cudnn_conv", &[&link[0], &link[1]], mode, "cudnn ready", after);
    }
}

/// Variant packs in the guest's pool (parked in the server, one of them last set to memory
/// freed since) are recorded as parked packs, not with their pointers: after a stop and a
/// restore into a new server, the program's next executions take them from the pool again
/// (made fresh by the server) and every output is the host's.
#[test]
fn pooled_variant_packs_survive_a_restore() {
    let link = phos_tests::cudnn_link_flags();
    library_program_mode_survives_a_restore(
        "cudnn_variant_packs",
        &[&link[0], &link[1]],
        "checkpoint",
        "cudnn ready",
        "executions, each with a fresh variant pack: as the host convolution",
    );
}

/// cuDNN's legacy tensor descriptors (set with strides, derived for batch normalization, and
/// one the program destroyed) are recorded as their shapes and made again on restore: after a
/// stop and a restore into a new server, the program reads them back as it set them and runs a
/// batch normalization checked against its host reference.
#[test]
fn cudnn_tensor_descriptors_survive_a_restore() {
    let link = phos_tests::cudnn_link_flags();
    library_program_with_flags_survives_a_restore(
        "cudnn_batchnorm",
        &[&link[0], &link[1]],
        "cudnn ready",
        "descriptor: type 0, 4 dims 2 3 4 5, strides 60 1 15 3, 480 bytes\n\
         descriptor: type 0, 4 dims 1 3 1 1, strides 3 1 1 1, 12 bytes\n\
         after the restore: nhwc float: forward training ok\n\
         after the restore: nhwc float: inference ok\n\
         after the restore: nhwc float: backward ok\n\
         done",
    );
}

/// cuDNN's legacy filter, convolution and activation descriptors are recorded with each
/// setter's last call: after a stop and a restore into a new server, the program reads its
/// filter and group count back and runs a grouped, strided convolution and a tanh with them,
/// checked against its host reference.
#[test]
fn cudnn_convolution_descriptors_survive_a_restore() {
    let link = phos_tests::cudnn_link_flags();
    library_program_with_flags_survives_a_restore(
        "cudnn_mnist_layers",
        &[&link[0], &link[1], "-lcublas"],
        "cudnn ready",
        "after the restore: filter 4x4x3x3, 2 groups\n\
         after the restore: convolution and tanh: pass",
    );
}

/// cuDNN's legacy pooling, LRN, op-tensor and reduce-tensor descriptors are recorded with each
/// setter's last call: after a stop and a restore into a new server, the program reads them back
/// and pools, normalizes, multiplies and reduces with them, checked against its host reference.
#[test]
fn cudnn_pooling_lrn_op_and_reduce_descriptors_survive_a_restore() {
    let link = phos_tests::cudnn_link_flags();
    library_program_with_flags_survives_a_restore(
        "cudnn_mnist_full",
        &[&link[0], &link[1]],
        "cudnn ready",
        "after the restore: pooling 0 window 2x2 stride 2,2; lrn n 3 k 2.00; op 1; reduce 0\n\
         after the restore: pooling, lrn, op tensor and reduce: pass",
    );
}

/// cuBLASLt's handle and descriptors are recorded with every attribute set on them: after a
/// stop and a restore into a new server, the program reads its matmul descriptor's epilogue
/// back and runs the matmul with the bias it set before the checkpoint.
#[test]
fn cublaslt_descriptors_and_their_attributes_survive_a_restore() {
    library_program_survives_a_restore(
        "cublaslt_matmul",
        // nvcc's list form: the program uses cuBLAS too.
        "-lcublasLt,cublas",
        "cublaslt ready",
        "after the restore: the descriptors kept their epilogue and bias",
    );
}

/// cuBLASLt descriptors the program destroys go to the guest's pool, and the next ones it
/// creates are the same handles made again on the server, fresh: after a stop and a restore
/// into a new server, descriptors made again before the checkpoint (after ones with a bias
/// epilogue, a transposed A and row-major batches were used and destroyed) read back
/// cuBLASLt's defaults and compute a plain GEMM (each was recorded as a fresh creation).
#[test]
fn cublaslt_descriptors_made_again_are_restored_fresh() {
    library_program_survives_a_restore(
        "cublaslt_descriptor_reuse",
        "-lcublasLt",
        "lt-reuse ready",
        "after the restore: the new descriptors have the defaults, a plain GEMM matches the host",
    );
}

/// A graph holding captured library calls (a cuBLAS GEMM and device-mode dot and axpy, a
/// cuSPARSE SpMV, a cuFFT transform) is kept in the image with its executable graph: after a
/// stop and a restore into a new server, the program launches it with new inputs and every
/// result matches the host's (the calls run on the restored handles, plan and descriptors).
#[test]
fn a_graph_of_library_calls_survives_a_restore() {
    library_program_survives_a_restore(
        "graph_libraries",
        // nvcc's list form.
        "-lcublas,cusparse,cufft,curand",
        "graph-libs ready",
        "after the restore: the graph's library calls ran",
    );
}

/// cuFFT plans are recorded with what made them and their settings, and made again on
/// restore under the same ints: after a stop and a restore into a new server, the program's
/// batched plan on a stream and its made plan on a work area of its own transform the spectrum
/// it left in device memory back to the signal.
#[test]
fn cufft_plans_and_their_settings_survive_a_restore() {
    library_program_survives_a_restore(
        "cufft_convolution",
        "-lcufft",
        "cufft ready",
        "after the restore: the plans kept their layout, stream and work area",
    );
}

/// A graph built node by node with event record and child graph nodes, and a second graph
/// waiting on the first's event, are kept in the image with their executable graphs: after a
/// stop and a restore into a new server, the program runs its first host function, launches
/// the graphs and checks every result: the host node runs on a callback thread started after
/// the restore, and the copies to and from a `__device__` symbol (graph nodes, then plain
/// calls) reach the variable where the restored module has it.
#[test]
fn a_graph_of_event_and_child_nodes_survives_a_restore() {
    library_program_with_flags_survives_a_restore(
        "graph_nodes",
        &[],
        "graph-nodes ready",
        "after the restore: the graph's nodes ran",
    );
}

/// An executable graph whose nodes were set and disabled, and a graph with a destroyed node
/// and set parameters, are kept in the image: after a stop and a restore into a new server,
/// the program finds the node disabled, launches, enables and sets it by the handle of the
/// graph's node, and clones the graph.
#[test]
fn an_updated_executable_graph_survives_a_restore() {
    library_program_with_flags_survives_a_restore(
        "graph_updates",
        &[],
        "graph-updates ready",
        "after the restore: the executable graph kept its updates",
    );
}

/// A program whose session ends under it (its API server killed) fails its next call and
/// exits with its own status: the runtime's exit handler does not reach for the ended
/// session, and does not abort.
#[test]
fn a_program_whose_session_ended_exits_with_its_own_status() {
    let Some(nvcc) = nvcc() else { return };
    let exe = build_program(&nvcc, "graph_nodes", &["-arch=sm_70"]);
    let router = TestRouter::start("emu");
    let mut guest = start_guest(&router, &exe, &["checkpoint"]);
    let mut out = BufReader::new(guest.stdout.take().unwrap());
    read_until(&mut out, "graph-nodes ready");
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
    // SAFETY: a signal to a process this test's router started.
    unsafe { libc::kill(server, libc::SIGKILL) };
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut out, &mut rest).unwrap();
    let status = guest.wait().unwrap();
    let mut err = String::new();
    std::io::Read::read_to_string(&mut guest.stderr.take().unwrap(), &mut err).unwrap();
    assert_eq!(status.code(), Some(1), "{status:?}: {rest}\n{err}");
    assert!(rest.contains("FAILED: cudaLaunchHostFunc"), "{rest}\n{err}");
    assert!(!err.contains("panicked"), "{err}");
}
