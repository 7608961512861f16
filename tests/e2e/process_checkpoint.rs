//! Whole-process checkpoints on the emu backend: a long-running program is checkpointed mid-run
//! with `phosctl checkpoint --process` (its GPU state by the API server, the process itself by
//! CRIU). With `--stop` that ends it, and `phosctl restore` brings back both; without, it runs
//! on and finishes, and the checkpoint is restored once it has ended. Either way the program
//! prints exactly what an uninterrupted run prints.
//!
//! CRIU runs as root, and needs a kernel it supports: `tests/scripts/install-criu.sh` installs
//! one that works on recent kernels (`scripts/setup.sh test` does, as root). Where it is missing
//! or `criu check` fails, the test says what failed and stops there.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use phos_tests::{TestRouter, build_program, built, nvcc};

/// A CRIU that can checkpoint here, or why not.
fn usable_criu() -> Result<PathBuf, String> {
    let criu = std::env::var_os("PHOS_CRIU").map(PathBuf::from).unwrap_or_else(|| "/opt/phos-criu/bin/criu".into());
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err("CRIU checkpoints as root, and this test runs as another user".into());
    }
    let check = Command::new(&criu).arg("check").output().map_err(|e| format!("{}: {e}", criu.display()))?;
    if !check.status.success() {
        return Err(format!(
            "`{} check` failed: {}{}",
            criu.display(),
            String::from_utf8_lossy(&check.stdout),
            String::from_utf8_lossy(&check.stderr)
        ));
    }
    // `criu check` passes where a dump can still fail (a container's limits): dump and
    // restore a process that has nothing of Phos.
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let mut sleeper = Command::new("sleep")
        .arg("60")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| e.to_string())?;
    let pid = sleeper.id().to_string();
    let criu_says = |action: &str, args: &[&str]| -> Result<(), String> {
        let out = Command::new(&criu)
            .args(args)
            .args(["--shell-job", "--images-dir"])
            .arg(dir.path())
            .args(["--log-file", "self-check.log"])
            .output()
            .map_err(|e| e.to_string())?;
        if out.status.success() {
            return Ok(());
        }
        let log = std::fs::read_to_string(dir.path().join("self-check.log")).unwrap_or_default();
        let errors: Vec<&str> = log.lines().filter(|l| l.contains("Error")).collect();
        Err(format!("CRIU cannot {action} a plain process here: {}", errors.join(" / ")))
    };
    let dumped = criu_says("dump", &["dump", "--tree", &pid]);
    let _ = sleeper.kill();
    let _ = sleeper.wait();
    dumped?;
    criu_says("restore", &["restore", "--restore-detached"])?;
    // The restored sleeper is nobody's child now.
    if let Ok(restored) = pid.parse::<libc::pid_t>()
        && restored > 0
    {
        // SAFETY: sends a signal to the one process this test restored, by its pid.
        unsafe { libc::kill(restored, libc::SIGKILL) };
    }
    Ok(criu)
}

/// `phosctl run --endpoint ROUTER -- exe args...`, to be given its standard files.
fn guest(router: &TestRouter, exe: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(built("phosctl"));
    c.args(["run", "--endpoint"])
        .arg(format!("unix:{}", router.socket().display()))
        .arg("--")
        .arg(exe)
        .args(args)
        .env("PHOS_GUEST_LIB", built("libphos_guest.so"));
    c
}

/// Wait until `file` holds `needle`; returns what it holds.
fn wait_for(file: &Path, needle: &str, within: Duration) -> String {
    let deadline = Instant::now() + within;
    loop {
        let text = std::fs::read_to_string(file).unwrap_or_default();
        if text.contains(needle) {
            return text;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {needle:?} in {}: {text}", file.display());
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn alive(pid: u32) -> bool {
    // SAFETY: signal 0 only asks whether the process exists.
    unsafe { libc::kill(pid as libc::pid_t, 0) == 0 }
}

#[test]
fn a_process_checkpointed_with_its_gpu_state_is_killed_restored_and_finishes_unchanged() {
    round_trip(&[]);
}

/// The same with page-locked memory in the pinned arena (a memfd the server maps): CRIU
/// brings the file back, the guest sends it again, and a kernel writing mapped memory and
/// copies into it go on into the restored process's pages.
#[test]
fn a_process_with_pinned_memory_is_checkpointed_and_restored() {
    round_trip(&["pinned"]);
}

fn round_trip(mode: &[&str]) {
    let criu = match usable_criu() {
        Ok(c) => c,
        Err(why) => {
            eprintln!("SKIPPED: whole-process checkpoints need CRIU, which cannot run here: {why}");
            return;
        }
    };
    let Some(nvcc) = nvcc() else { return };
    let exe = build_program(&nvcc, "iterative", &["-arch=sm_70"]);
    let work = tempfile::tempdir().unwrap();

    // The reference: the same run, uninterrupted.
    let router = TestRouter::start("emu");
    let reference = guest(&router, &exe, &[&["40", "0"], mode].concat()).output().unwrap();
    assert!(reference.status.success(), "{}", String::from_utf8_lossy(&reference.stderr));
    let reference = String::from_utf8(reference.stdout).unwrap();
    drop(router);

    // The program's output goes to a file, which CRIU reopens for the restored process (a pipe
    // to this test would not come back).
    let router = TestRouter::start("emu");
    let out = work.path().join("out.txt");
    let mut runner = guest(&router, &exe, &[&["40", "40"], mode].concat())
        .stdin(Stdio::null())
        .stdout(Stdio::from(std::fs::File::create(&out).unwrap()))
        .stderr(Stdio::from(std::fs::File::create(work.path().join("err.txt")).unwrap()))
        .spawn()
        .unwrap();
    wait_for(&out, "iteration 10 ", Duration::from_secs(120));
    let session = router.router.sessions().first().expect("the program's session").clone();
    let pid = session.pid;
    let image = work.path().join("image");
    let ck = router.phosctl(&[
        "checkpoint",
        &session.id.to_string(),
        "--out",
        image.to_str().unwrap(),
        "--process",
        "--stop",
        "--criu",
        criu.to_str().unwrap(),
    ]);
    let said = String::from_utf8_lossy(&ck.stdout);
    assert!(
        ck.status.success(),
        "checkpoint --process: {}{said}\nthe servers' logs:\n{}",
        String::from_utf8_lossy(&ck.stderr),
        router.server_logs()
    );
    assert!(said.contains(&format!("process {pid} dumped with CRIU")), "{said}");
    assert!(said.contains("stopped until it is restored"), "{said}");
    // The process is gone (its runner sees it killed), and the session waits for it.
    let _ = runner.wait();
    assert!(!alive(pid), "the dumped process still runs");
    let printed_before = std::fs::read_to_string(&out).unwrap();
    assert!(!printed_before.contains("PASS"), "the program ended before its checkpoint: {printed_before}");
    let listed = String::from_utf8(router.phosctl(&["sessions"]).stdout).unwrap();
    assert!(listed.contains("suspended"), "{listed}");

    let rs = router.phosctl(&["restore", image.to_str().unwrap(), "--criu", criu.to_str().unwrap()]);
    let said = String::from_utf8_lossy(&rs.stdout);
    assert!(rs.status.success(), "restore: {}{said}", String::from_utf8_lossy(&rs.stderr));
    assert!(said.contains(&format!("process {pid} restored with CRIU")), "{said}");
    // The restored process reconnects to its session and finishes by itself.
    let last = reference.lines().last().expect("the reference printed something");
    let printed = wait_for(&out, last, Duration::from_secs(120));
    let deadline = Instant::now() + Duration::from_secs(30);
    while alive(pid) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(!alive(pid), "the restored process did not end");
    assert_eq!(
        printed,
        reference,
        "output differs from the uninterrupted run\nits stderr:\n{}",
        std::fs::read_to_string(work.path().join("err.txt")).unwrap_or_default()
    );
}

/// `checkpoint --process` without `--stop`: the program is held at the cut only while CRIU
/// dumps it, runs on (its session on the same server, its memory copied meanwhile) and
/// finishes as an uninterrupted run does. Once it has ended, the checkpoint is restored: the
/// process comes back as it was at the cut, with its session, and prints the rest of the run
/// again, the same.
#[test]
fn a_process_checkpointed_while_it_runs_finishes_and_is_restored_later_unchanged() {
    let criu = match usable_criu() {
        Ok(c) => c,
        Err(why) => {
            eprintln!("SKIPPED: whole-process checkpoints need CRIU, which cannot run here: {why}");
            return;
        }
    };
    let Some(nvcc) = nvcc() else { return };
    let exe = build_program(&nvcc, "iterative", &["-arch=sm_70"]);
    let work = tempfile::tempdir().unwrap();

    let router = TestRouter::start("emu");
    let reference = guest(&router, &exe, &["40", "0"]).output().unwrap();
    assert!(reference.status.success(), "{}", String::from_utf8_lossy(&reference.stderr));
    let reference = String::from_utf8(reference.stdout).unwrap();
    drop(router);

    // Files opened to append, write-only: CRIU checks the size of the regular files it
    // reopens, but not of these (log files), which have grown since the dump here.
    let append =
        |name: &str| std::fs::OpenOptions::new().create(true).append(true).open(work.path().join(name)).unwrap();
    let router = TestRouter::start("emu");
    let out = work.path().join("out.txt");
    let mut runner = guest(&router, &exe, &["40", "40"])
        .stdin(Stdio::null())
        .stdout(Stdio::from(append("out.txt")))
        .stderr(Stdio::from(append("err.txt")))
        .spawn()
        .unwrap();
    wait_for(&out, "iteration 10 ", Duration::from_secs(120));
    let session = router.router.sessions().first().expect("the program's session").clone();
    let (pid, tenant) = (session.pid, session.tenant.to_string());
    let image = work.path().join("image");
    let ck = router.phosctl(&[
        "checkpoint",
        &session.id.to_string(),
        "--out",
        image.to_str().unwrap(),
        "--process",
        "--criu",
        criu.to_str().unwrap(),
    ]);
    let said = String::from_utf8_lossy(&ck.stdout);
    assert!(
        ck.status.success(),
        "checkpoint --process: {}{said}\nthe servers' logs:\n{}",
        String::from_utf8_lossy(&ck.stderr),
        router.server_logs()
    );
    assert!(said.contains(&format!("process {pid} dumped with CRIU")) && said.contains("left running"), "{said}");
    assert!(said.contains("CRIU dump") && said.contains("held") && said.contains("GPU memory copied"), "{said}");
    assert!(!said.contains("stopped until it is restored"), "{said}");
    // The times (the hold at the cut, the dump, the copy), for a run with --nocapture.
    eprintln!("{said}");
    // The program runs on to its end, printing what the uninterrupted run printed.
    let stderr = || std::fs::read_to_string(work.path().join("err.txt")).unwrap_or_default();
    assert!(runner.wait().unwrap().success(), "the program failed after its checkpoint: {}", stderr());
    let printed = std::fs::read_to_string(&out).unwrap();
    assert_eq!(
        printed,
        reference,
        "the program's output after a checkpoint that left it running\nits stderr:\n{}",
        stderr()
    );
    assert!(!alive(pid));

    // Its session ends with it; the image brings back both (the router no longer has the
    // session: the restore names its tenant).
    let deadline = Instant::now() + Duration::from_secs(60);
    while router.router.sessions().iter().any(|s| s.id == session.id) {
        assert!(Instant::now() < deadline, "the ended program's session is still listed");
        std::thread::sleep(Duration::from_millis(100));
    }
    std::fs::write(&out, "").unwrap();
    let rs =
        router.phosctl(&["restore", image.to_str().unwrap(), "--tenant", &tenant, "--criu", criu.to_str().unwrap()]);
    let said = String::from_utf8_lossy(&rs.stdout);
    assert!(rs.status.success(), "restore: {}{said}\n{}", String::from_utf8_lossy(&rs.stderr), router.server_logs());
    assert!(said.contains(&format!("process {pid} restored with CRIU")), "{said}");
    let last = reference.lines().last().expect("the reference printed something");
    let again = wait_for(&out, last, Duration::from_secs(120));
    let deadline = Instant::now() + Duration::from_secs(30);
    while alive(pid) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(!alive(pid), "the restored process did not end");
    let again = std::fs::read_to_string(&out).unwrap_or(again);
    // What it printed is the rest of the run from the cut: the reference's end, from a line
    // after the 10th iteration.
    let before = reference.len().checked_sub(again.len()).expect("the restored process printed more than a whole run");
    assert!(
        reference.ends_with(&again)
            && reference[..before].ends_with('\n')
            && reference[..before].contains("iteration 10 "),
        "the restored process printed:\n{again}\nthe uninterrupted run:\n{reference}\nits stderr:\n{}",
        stderr()
    );
}

#[test]
fn a_process_checkpoint_is_refused_for_a_session_of_another_host_or_not_running() {
    let Some(nvcc) = nvcc() else { return };
    let exe = build_program(&nvcc, "iterative", &["-arch=sm_70"]);
    let router = TestRouter::start("emu");
    let work = tempfile::tempdir().unwrap();
    let out = work.path().join("out.txt");
    let mut runner = guest(&router, &exe, &["40", "40"])
        .stdout(Stdio::from(std::fs::File::create(&out).unwrap()))
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_for(&out, "iteration 10 ", Duration::from_secs(120));
    let id = router.router.sessions().first().expect("the program's session").id;
    // Stopped first: a session that is not running has no process to dump, and the refusal
    // changes nothing.
    let image = work.path().join("image");
    let ck = router.phosctl(&["checkpoint", &id.to_string(), "--out", image.to_str().unwrap(), "--stop"]);
    assert!(ck.status.success(), "{}", String::from_utf8_lossy(&ck.stderr));
    let again = work.path().join("again");
    let refused = router.phosctl(&["checkpoint", &id.to_string(), "--out", again.to_str().unwrap(), "--process"]);
    assert_eq!(refused.status.code(), Some(2), "{}", String::from_utf8_lossy(&refused.stderr));
    let why = String::from_utf8_lossy(&refused.stderr);
    assert!(why.contains("suspended") && why.contains("--process"), "{why}");
    assert!(!again.exists(), "a refused checkpoint wrote an image");
    // The session comes back for its process, which finishes.
    let rs = router.phosctl(&["restore", image.to_str().unwrap()]);
    assert!(rs.status.success(), "{}", String::from_utf8_lossy(&rs.stderr));
    assert!(runner.wait().unwrap().success());
    assert!(std::fs::read_to_string(&out).unwrap().contains("PASS"));
}
