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

/// Start `exe args` as a guest of `router`, with its stdout piped.
fn start_guest(router: &TestRouter, exe: &Path, args: &[&str]) -> Child {
    Command::new(built("phosctl"))
        .args(["run", "--endpoint"])
        .arg(format!("unix:{}", router.socket().display()))
        .arg("--")
        .arg(exe)
        .args(args)
        .env("PHOS_GUEST_LIB", built("libcudart.so"))
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
    assert!(ck.status.success(), "checkpoint: {}", String::from_utf8_lossy(&ck.stderr));
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

#[test]
fn a_corrupted_image_is_refused_and_changes_nothing() {
    let Some(nvcc) = nvcc() else { return };
    let exe = build_program(&nvcc, "iterative", &["-arch=sm_70"]);
    let router = TestRouter::start("emu");
    let (mut guest, _out, id) = iterative_at_ten(&router, &exe, &["30", "40"]);
    let image = tempfile::tempdir().unwrap();
    let dir = image.path().join("image");
    checkpoint(&router, id, &dir, &[]);
    // The session is still running (the checkpoint did not stop it): restoring over it is
    // refused.
    let rs = phosctl(&router, &["restore", dir.to_str().unwrap()]);
    assert!(!rs.status.success());
    assert!(String::from_utf8_lossy(&rs.stderr).contains("is running"), "{}", String::from_utf8_lossy(&rs.stderr));
    // A truncated manifest is refused with a clear message.
    let trunc = image.path().join("truncated");
    std::fs::create_dir(&trunc).unwrap();
    let manifest = std::fs::read(dir.join(phos_checkpoint::MANIFEST_FILE)).unwrap();
    std::fs::write(trunc.join(phos_checkpoint::MANIFEST_FILE), &manifest[..manifest.len() / 2]).unwrap();
    std::fs::copy(dir.join(phos_checkpoint::MEMORY_FILE), trunc.join(phos_checkpoint::MEMORY_FILE)).unwrap();
    let rs = phosctl(&router, &["restore", trunc.to_str().unwrap()]);
    assert!(!rs.status.success());
    assert!(String::from_utf8_lossy(&rs.stderr).contains("truncated"), "{}", String::from_utf8_lossy(&rs.stderr));
    // Another format version is refused, naming both versions.
    let other = image.path().join("other-version");
    std::fs::create_dir(&other).unwrap();
    let mut m = manifest.clone();
    m[8..12].copy_from_slice(&(phos_checkpoint::FORMAT_VERSION + 1).to_le_bytes());
    std::fs::write(other.join(phos_checkpoint::MANIFEST_FILE), &m).unwrap();
    std::fs::copy(dir.join(phos_checkpoint::MEMORY_FILE), other.join(phos_checkpoint::MEMORY_FILE)).unwrap();
    let rs = phosctl(&router, &["restore", other.to_str().unwrap()]);
    assert!(!rs.status.success());
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
    let (mut guest, _out, id) = iterative_at_ten(&router, &exe, &["30", "40"]);
    let image = tempfile::tempdir().unwrap();
    let dir = image.path().join("image");
    checkpoint(&router, id, &dir, &["--stop"]);
    let mem = dir.join(phos_checkpoint::MEMORY_FILE);
    let good = std::fs::read(&mem).unwrap();
    let mut bad = good.clone();
    bad[good.len() / 3] ^= 1;
    std::fs::write(&mem, &bad).unwrap();
    let rs = phosctl(&router, &["restore", dir.to_str().unwrap()]);
    assert!(!rs.status.success());
    assert!(String::from_utf8_lossy(&rs.stderr).contains("checksum"), "{}", String::from_utf8_lossy(&rs.stderr));
    assert!(router.router.session(id).unwrap().control_socket().is_none(), "no server was left running");
    // With the image repaired, the restore works and the program completes.
    std::fs::write(&mem, &good).unwrap();
    let rs = phosctl(&router, &["restore", dir.to_str().unwrap()]);
    assert!(rs.status.success(), "{}", String::from_utf8_lossy(&rs.stderr));
    assert!(guest.wait().unwrap().success());
}

#[test]
fn a_checkpoint_during_multi_stream_traffic_is_consistent() {
    let Some(nvcc) = nvcc() else { return };
    let exe = build_program(&nvcc, "stream_traffic", &["-arch=sm_70"]);
    let router = TestRouter::start("emu");
    let guest = start_guest(&router, &exe, &["4000"]);
    let id = session_id(&router);
    std::thread::sleep(Duration::from_millis(500));
    let image = tempfile::tempdir().unwrap();
    let mut checked = 0;
    for k in 0..3 {
        let dir = image.path().join(format!("image{k}"));
        checkpoint(&router, id, &dir, &[]);
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
    let out = guest.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).ends_with("PASS\n"));
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
