//! Nothing stalls on a refusal, and nothing outlives the client that asked for it: large
//! copies the server refuses end at once with CUDA's error (a bad pointer, a faulted
//! kernel's sticky error); a checkpoint of a session whose kernel does not end comes back at
//! its deadline naming the session and what it waited for, and leaves the session running;
//! a checkpoint whose client is killed stops; a restore past its deadline is given up and the
//! session waits as it was. Each with another session running alongside to its correct end,
//! and the router serving afterwards.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Output, Stdio};
use std::time::{Duration, Instant};

use phos_tests::{TestRouter, build_program, build_program_from, built, cuda_dir, hostile_dir, nvcc};

const ARCH: &[&str] = &["-arch=sm_70"];

/// `phosctl`'s exit status for an operation that did not end in time (docs/operations.md,
/// "Exit status").
const TIMED_OUT: i32 = 6;

fn phosctl(router: &TestRouter, args: &[&str]) -> Output {
    Command::new(built("phosctl"))
        .args(args)
        .arg("--router")
        .arg(format!("unix:{}", router.socket().display()))
        .output()
        .expect("running phosctl")
}

/// `exe args` as a guest of `router` over shared memory, its output piped.
fn start_guest(router: &TestRouter, exe: &Path, args: &[&str]) -> Child {
    Command::new(built("phosctl"))
        .args(["run", "--transport", "shm", "--endpoint"])
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

fn finish(child: Child) -> (bool, String, String) {
    let out = child.wait_with_output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn expected(name: &str) -> String {
    std::fs::read_to_string(cuda_dir().join("expected").join(format!("{name}.out"))).unwrap()
}

/// vector_add, started on `router` to run beside a test's session; check it with [`neighbour_done`].
/// The neighbour's program, built before a test's guest starts: a build may wait for other
/// tests' builds, and a guest that runs for a few seconds must still be running after it.
fn neighbour_program(nvcc: &Path) -> PathBuf {
    build_program(nvcc, "vector_add", ARCH)
}

fn neighbour(router: &TestRouter, program: &Path) -> Child {
    start_guest(router, program, &[])
}

fn neighbour_done(child: Child) {
    let (ok, stdout, stderr) = finish(child);
    assert!(ok, "the other session failed: {stderr}");
    assert_eq!(stdout, expected("vector_add"), "the other session's results\n{stderr}");
}

/// Read `out` until a line contains `needle`.
fn read_until(out: &mut BufReader<ChildStdout>, needle: &str) {
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut all = String::new();
    loop {
        let mut line = String::new();
        assert!(out.read_line(&mut line).unwrap() > 0, "the program ended before printing {needle:?}: {all}");
        all.push_str(&line);
        if line.contains(needle) {
            return;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {needle:?}");
    }
}

/// The id of the newest session running `program` (an ended one may still be listed).
fn session_of(router: &TestRouter, program: &str) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let sessions = router.router.sessions();
        if let Some(s) = sessions.iter().filter(|s| s.program.contains(program)).max_by_key(|s| s.id) {
            return s.id;
        }
        assert!(Instant::now() < deadline, "no session of {program}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The time a line `<what>: <error> <ms> ms` reports, after checking its error.
fn timed_line(stdout: &str, what: &str, error: &str) -> f64 {
    let line = stdout
        .lines()
        .find(|l| l.starts_with(&format!("{what}:")))
        .unwrap_or_else(|| panic!("no line for {what}:\n{stdout}"));
    let words: Vec<&str> = line[what.len() + 1..].split_whitespace().collect();
    assert_eq!(words.first(), Some(&error), "{line}");
    words[1].parse().unwrap()
}

/// A staged copy the server refuses (a bad device pointer; a sticky error after a kernel
/// faulted) ends at once with CUDA's error, where it used to wait 60 s for a stalled copy.
#[test]
fn refused_staged_copies_end_at_once() {
    let Some(nvcc) = nvcc() else { return };
    let vector_add = neighbour_program(&nvcc);
    let exe = build_program_from(&nvcc, &hostile_dir(), "staged_refusals", ARCH);
    let router = TestRouter::start("emu");
    let other = neighbour(&router, &vector_add);
    let started = Instant::now();
    let (ok, stdout, stderr) = finish(start_guest(&router, &exe, &[]));
    assert!(ok, "{stdout}\n{stderr}");
    for (what, error) in [
        ("d2h outside", "cudaErrorInvalidValue"),
        ("h2d outside", "cudaErrorInvalidValue"),
        ("d2h past the end", "cudaErrorInvalidValue"),
        ("d2h after a fault", "cudaErrorIllegalAddress"),
        ("h2d after a fault", "cudaErrorIllegalAddress"),
    ] {
        let ms = timed_line(&stdout, what, error);
        assert!(ms < 5_000.0, "{what} took {ms} ms\n{stdout}");
    }
    assert!(stdout.contains("round trip: same"), "{stdout}");
    assert!(started.elapsed() < Duration::from_secs(50), "the program took {:?}", started.elapsed());
    assert!(router.server_logs().contains("phosMemcpyStaged: invalid device pointer"), "{}", router.server_logs());
    neighbour_done(other);
    neighbour_done(neighbour(&router, &vector_add));
}

/// A checkpoint of a session whose kernel runs far past the checkpoint's deadline gives up
/// at the deadline, naming the session and the call it waited for; the session carries on
/// and its program finishes with the right results, and so does another session.
#[test]
fn a_checkpoint_gives_up_on_a_kernel_that_does_not_end() {
    let Some(nvcc) = nvcc() else { return };
    let vector_add = neighbour_program(&nvcc);
    let spin = build_program_from(&nvcc, &hostile_dir(), "spin", ARCH);
    let router = TestRouter::start("emu");
    let mut guest = start_guest(&router, &spin, &["4000"]);
    let mut out = BufReader::new(guest.stdout.take().unwrap());
    read_until(&mut out, "launched");
    let id = session_of(&router, "spin");
    let other = neighbour(&router, &vector_add);
    std::thread::sleep(Duration::from_millis(300));
    let image = tempfile::tempdir().unwrap();
    let dir = image.path().join("image");
    // Stop-the-world: its quiesce is what waits for the call in flight.
    gives_up_at_its_deadline(&router, id, &dir, &["--stop-the-world"]);
    // The session was left running: its program ends with the kernel's results.
    let mut rest = String::new();
    out.read_to_string(&mut rest).unwrap();
    assert!(guest.wait().unwrap().success() && rest.contains("PASS"), "{rest}");
    neighbour_done(other);
    // The router still serves, and checkpoints a session at rest.
    let mut again = start_guest(&router, &spin, &["3000"]);
    let mut out = BufReader::new(again.stdout.take().unwrap());
    read_until(&mut out, "launched");
    let id = session_of(&router, "spin");
    std::thread::sleep(Duration::from_millis(300));
    let ck = phosctl(&router, &["checkpoint", &id.to_string(), "--out", dir.to_str().unwrap(), "--timeout", "60"]);
    assert!(ck.status.success(), "{}", String::from_utf8_lossy(&ck.stderr));
    assert!(again.wait().unwrap().success());
}

/// The same, copy-on-write (the default): installing its hook and its quiesce wait for the
/// call in flight, one deadline for both, and it gives up once that has passed, saying how
/// long it waited in all.
#[test]
fn a_copy_on_write_checkpoint_gives_up_on_a_kernel_that_does_not_end() {
    let Some(nvcc) = nvcc() else { return };
    let spin = build_program_from(&nvcc, &hostile_dir(), "spin", ARCH);
    let router = TestRouter::start("emu");
    let mut guest = start_guest(&router, &spin, &["4000"]);
    let mut out = BufReader::new(guest.stdout.take().unwrap());
    read_until(&mut out, "launched");
    let id = session_of(&router, "spin");
    std::thread::sleep(Duration::from_millis(300));
    let image = tempfile::tempdir().unwrap();
    let dir = image.path().join("image");
    gives_up_at_its_deadline(&router, id, &dir, &[]);
    let mut rest = String::new();
    out.read_to_string(&mut rest).unwrap();
    assert!(guest.wait().unwrap().success() && rest.contains("PASS"), "{rest}");
}

/// Checkpoint session `id` (whose kernel runs for seconds) into `dir` with a 1 s timeout:
/// it must give up, after waiting at least that long (and said so), naming the launch, and
/// write nothing.
fn gives_up_at_its_deadline(router: &TestRouter, id: u64, dir: &Path, extra: &[&str]) {
    let asked = Instant::now();
    let session = id.to_string();
    let mut args = vec!["checkpoint", &session, "--out", dir.to_str().unwrap()];
    args.extend(["--timeout", "1"]);
    args.extend(extra);
    let ck = phosctl(router, &args);
    let took = asked.elapsed();
    let err = String::from_utf8_lossy(&ck.stderr);
    let said = String::from_utf8_lossy(&ck.stdout);
    assert_eq!(ck.status.code(), Some(TIMED_OUT), "the checkpoint waited the kernel out ({took:?}): {said}{err}");
    assert!(took >= Duration::from_secs(1), "gave up after {took:?}, before its deadline: {err}");
    assert!(took < Duration::from_secs(6), "gave up after {took:?}: {err}");
    let waited = said_waited(&err);
    assert!(waited >= Duration::from_millis(950), "says it waited {waited:?}, less than its timeout: {err}");
    assert!(err.contains(&format!("session {id}")), "{err}");
    assert!(err.contains("phosLaunchKernel"), "names the call it waited for: {err}");
    assert!(!dir.join(phos_checkpoint::MANIFEST_FILE).exists(), "no image was written");
}

/// The wait a "gave up after D waiting for" message says (`D` as Rust prints a duration).
fn said_waited(err: &str) -> Duration {
    let after = err.split("gave up after ").nth(1).unwrap_or_else(|| panic!("no wait said: {err}"));
    let figure = after.split_whitespace().next().unwrap_or("");
    let unit_at = figure.find(|c: char| c.is_alphabetic() || c == 'µ').unwrap_or(figure.len());
    let value: f64 = figure[..unit_at].parse().unwrap_or_else(|_| panic!("no duration in {figure:?}: {err}"));
    let seconds = match &figure[unit_at..] {
        "s" => value,
        "ms" => value / 1e3,
        "µs" => value / 1e6,
        "ns" => value / 1e9,
        unit => panic!("unit {unit:?} in {figure:?}: {err}"),
    };
    Duration::from_secs_f64(seconds)
}

/// A checkpoint whose client is killed while it waits stops there: the server says it was
/// abandoned, no image appears, and the session is as it was.
#[test]
fn a_checkpoint_whose_client_is_killed_stops() {
    let Some(nvcc) = nvcc() else { return };
    let vector_add = neighbour_program(&nvcc);
    let spin = build_program_from(&nvcc, &hostile_dir(), "spin", ARCH);
    let router = TestRouter::start("emu");
    let mut guest = start_guest(&router, &spin, &["4000"]);
    let mut out = BufReader::new(guest.stdout.take().unwrap());
    read_until(&mut out, "launched");
    let id = session_of(&router, "spin");
    std::thread::sleep(Duration::from_millis(300));
    let image = tempfile::tempdir().unwrap();
    let dir: PathBuf = image.path().join("image");
    let mut client = Command::new(built("phosctl"))
        .args(["checkpoint", &id.to_string(), "--out", dir.to_str().unwrap(), "--timeout", "600"])
        .arg("--router")
        .arg(format!("unix:{}", router.socket().display()))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(1));
    client.kill().unwrap();
    client.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !router.server_logs().contains("abandoned (its client went away)") {
        assert!(Instant::now() < deadline, "the checkpoint went on without its client:\n{}", router.server_logs());
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut rest = String::new();
    out.read_to_string(&mut rest).unwrap();
    assert!(guest.wait().unwrap().success() && rest.contains("PASS"), "{rest}");
    assert!(!dir.join(phos_checkpoint::MANIFEST_FILE).exists());
    neighbour_done(neighbour(&router, &vector_add));
}

/// A restore that cannot finish within its deadline is given up, naming the session; the
/// session stays suspended, and a restore given the time it needs brings it back.
#[test]
fn a_restore_past_its_deadline_is_given_up() {
    let Some(nvcc) = nvcc() else { return };
    let vector_add = neighbour_program(&nvcc);
    let exe = build_program(&nvcc, "iterative", ARCH);
    let router = TestRouter::start("emu");
    let mut guest = start_guest(&router, &exe, &["120", "40"]);
    let mut out = BufReader::new(guest.stdout.take().unwrap());
    read_until(&mut out, "iteration 10 ");
    let id = session_of(&router, "iterative");
    let image = tempfile::tempdir().unwrap();
    let dir = image.path().join("image");
    let ck = phosctl(&router, &["checkpoint", &id.to_string(), "--out", dir.to_str().unwrap(), "--stop"]);
    assert!(ck.status.success(), "{}", String::from_utf8_lossy(&ck.stderr));
    let rs = phosctl(&router, &["restore", dir.to_str().unwrap(), "--timeout", "0"]);
    let err = String::from_utf8_lossy(&rs.stderr);
    assert_eq!(rs.status.code(), Some(TIMED_OUT), "{err}");
    assert!(err.contains(&format!("session {id}")) && err.contains("did not finish within"), "{err}");
    let listed = String::from_utf8_lossy(&phosctl(&router, &["sessions"]).stdout).into_owned();
    assert!(listed.contains("suspended"), "{listed}");
    let other = neighbour(&router, &vector_add);
    let rs = phosctl(&router, &["restore", dir.to_str().unwrap()]);
    assert!(rs.status.success(), "{}", String::from_utf8_lossy(&rs.stderr));
    let mut rest = String::new();
    out.read_to_string(&mut rest).unwrap();
    assert!(guest.wait().unwrap().success(), "{rest}");
    assert!(rest.contains("iteration 30 "), "{rest}");
    neighbour_done(other);
}

/// A large copy the router refuses (a policy's verdict; the server never sees the call, so
/// nothing aborts the staging region) ends at once too: the guest watches for its answer
/// while it waits on the slots.
#[test]
fn staged_copies_a_policy_refuses_end_at_once() {
    let Some(nvcc) = nvcc() else { return };
    let vector_add = neighbour_program(&nvcc);
    let Some(policy) = phos_tests::build_policy("copy_quota") else { return };
    let exe = build_program_from(&nvcc, &hostile_dir(), "staged_refusals", ARCH);
    let router = TestRouter::start("emu");
    let load = phos_control::PolicyLoad {
        name: "copy_quota".into(),
        source: "test:copy_quota".into(),
        elf: policy,
        params: Vec::new(),
        kernel_check: phos_control::KernelCheck::Skip,
    };
    router.router.load_policy(load, &phos_control::Cancel::default()).unwrap();
    let other = neighbour(&router, &vector_add);
    let (ok, stdout, stderr) = finish(start_guest(&router, &exe, &["big"]));
    assert!(ok, "{stdout}\n{stderr}");
    for what in ["h2d 24 MiB", "d2h 32 MiB"] {
        let ms = timed_line(&stdout, what, "cudaErrorNotPermitted");
        assert!(ms < 5_000.0, "{what} took {ms} ms\n{stdout}");
    }
    assert!(stdout.contains("round trip: same"), "{stdout}");
    neighbour_done(other);
}
