//! Whole-process checkpoints: a session's guest process dumped with CRIU beside its GPU state
//! (`phosctl checkpoint --process`), and brought back with it (`phosctl restore` of such an
//! image).
//!
//! With `--stop`, the cut is the GPU checkpoint's: the session is checkpointed stopped, its
//! calls held at the end and its server ended, and the router refuses its guest's channels
//! from then on (the session is *parked*) instead of holding them for a restore. The guest
//! library lets go of every connection whose router end closed, so the process holds no
//! socket to the router when CRIU freezes it, and its calls wait (without a deadline while
//! parked) for the session to come back. What the process does between the GPU cut and the
//! dump is CPU work only: no CUDA call can complete meanwhile, so the dump and the GPU image
//! are one consistent state. CRIU ends the process once dumped.
//!
//! Without `--stop` the process runs on (CRIU's `--leave-running`): the session is parked
//! from the request on (no channel opens), its server freezes it at the checkpoint's cut (a
//! call arriving then closes its channel, unrun), the router closes the channels left, CRIU
//! dumps the process, and the session is unparked: the process reconnects to its session, on
//! the same server, and its calls go on while the server copies the GPU memory of the cut
//! (copy-on-write: what a call is about to change is copied aside first). Its calls are held
//! only for the cut and the dump.
//!
//! Either way, the async calls the process had sent and not seen answered are kept by its
//! library and sent again when it reconnects (the session's ledger of calls that ran, which
//! the image keeps too, keeps them from running twice).
//!
//! CRIU restores a process at its own pid: an image's process is restored only while no
//! process has that pid (the checkpointed one has ended), and into its session, which must
//! not be running either (the router refuses to restore a running session).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// Where an image keeps its process's CRIU images.
pub const PROCESS_DIR: &str = "process";

/// Where `tests/scripts/install-criu.sh` installs CRIU by default.
const INSTALLED_CRIU: &str = "/opt/phos-criu/bin/criu";

/// How long a dump is retried: a guest thread may be between two attempts to reconnect
/// (each a few microseconds holding a socket to the router) when CRIU freezes the process.
const DUMP_RETRIES_FOR: Duration = Duration::from_secs(10);

/// The CRIU binary: `--criu`, else `PHOS_CRIU`, else the one `install-criu.sh` installs, else
/// `criu` on the PATH.
pub fn criu_binary(explicit: Option<PathBuf>) -> PathBuf {
    explicit
        .or_else(|| std::env::var_os("PHOS_CRIU").map(PathBuf::from))
        .or_else(|| Path::new(INSTALLED_CRIU).exists().then(|| PathBuf::from(INSTALLED_CRIU)))
        .unwrap_or_else(|| PathBuf::from("criu"))
}

/// Whether `dir` holds a process checkpoint (CRIU's inventory).
pub fn has_process(dir: &Path) -> bool {
    dir.join(PROCESS_DIR).join("inventory.img").exists()
}

/// Why a process could not be dumped or restored.
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    #[error("{criu}: {e} (install CRIU with tests/scripts/install-criu.sh, or name it with --criu)", criu = .criu.display())]
    NoCriu { criu: PathBuf, e: std::io::Error },
    #[error("process {pid} is not on this host (or not visible to phosctl)")]
    NotHere { pid: u32 },
    #[error(
        "process {pid}, the image's, still runs: CRIU restores a process at its own pid, so end it first (a second copy beside it is not supported)"
    )]
    StillRunning { pid: u32 },
    #[error("{0}")]
    Io(String),
    #[error("criu {action} failed ({status}); from its log {}:\n{excerpt}", log.display())]
    Failed { action: &'static str, status: String, log: PathBuf, excerpt: String },
}

/// Dump process `pid` (and its children) into `image/process`; CRIU ends it once dumped,
/// unless `leave_running`. Retried for a while: see [`DUMP_RETRIES_FOR`].
pub fn dump(criu: &Path, pid: u32, image: &Path, leave_running: bool) -> Result<(), ProcessError> {
    if !alive(pid) {
        return Err(ProcessError::NotHere { pid });
    }
    let dir = image.join(PROCESS_DIR);
    let started = Instant::now();
    loop {
        // A failed dump leaves its partial images: each try starts from an empty directory.
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(|e| ProcessError::Io(format!("creating {}: {e}", dir.display())))?;
        let tree = pid.to_string();
        let mut args = vec!["dump", "--tree", &tree, "--shell-job"];
        if leave_running {
            args.push("--leave-running");
        }
        match run(criu, "dump", &dir, &args) {
            Ok(()) => {
                let _ = std::fs::write(dir.join("phos-pid"), format!("{pid}\n"));
                return Ok(());
            }
            Err(e @ ProcessError::NoCriu { .. }) => return Err(e),
            Err(e) if started.elapsed() >= DUMP_RETRIES_FOR => return Err(e),
            Err(_) => std::thread::sleep(Duration::from_millis(250)),
        }
    }
}

/// Whether process `pid` exists (as this host's PID namespace sees it).
fn alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// The pid of the process dumped in `image/process`, as the dump noted it.
pub fn dumped_pid(image: &Path) -> Option<u32> {
    std::fs::read_to_string(image.join(PROCESS_DIR).join("phos-pid")).ok().and_then(|p| p.trim().parse().ok())
}

/// Refuse to restore the process of `image` while its pid is taken (the checkpointed
/// process runs on, or another has its pid): CRIU would fail at it.
pub fn check_restorable(image: &Path) -> Result<(), ProcessError> {
    match dumped_pid(image) {
        Some(pid) if alive(pid) => Err(ProcessError::StillRunning { pid }),
        _ => Ok(()),
    }
}

/// Restore the process dumped in `image/process`, detached from phosctl (it carries on by
/// itself, reconnecting to its session). Returns its pid.
pub fn restore(criu: &Path, image: &Path) -> Result<u32, ProcessError> {
    check_restorable(image)?;
    let dir = image.join(PROCESS_DIR);
    run(criu, "restore", &dir, &["restore", "--shell-job", "--restore-detached"])?;
    Ok(dumped_pid(image).unwrap_or(0))
}

fn run(criu: &Path, action: &'static str, dir: &Path, args: &[&str]) -> Result<(), ProcessError> {
    let log_name = format!("{action}.log");
    let status = Command::new(criu)
        .args(args)
        .arg("--images-dir")
        .arg(dir)
        .args(["--log-file", &log_name, "-v4"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .status()
        .map_err(|e| ProcessError::NoCriu { criu: criu.to_path_buf(), e })?;
    if status.success() {
        return Ok(());
    }
    let log = dir.join(log_name);
    Err(ProcessError::Failed { action, status: status.to_string(), log: log.clone(), excerpt: errors_in(&log) })
}

/// The error lines of a CRIU log (the last few), or its last lines.
fn errors_in(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    let errors: Vec<&str> = lines.iter().copied().filter(|l| l.contains("Error") || l.contains("error")).collect();
    let shown = if errors.is_empty() {
        &lines[lines.len().saturating_sub(5)..]
    } else {
        &errors[errors.len().saturating_sub(5)..]
    };
    shown.iter().map(|l| format!("  {l}")).collect::<Vec<_>>().join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_criu_binary_is_the_one_named_first() {
        assert_eq!(criu_binary(Some("/x/criu".into())), PathBuf::from("/x/criu"));
    }

    #[test]
    fn a_log_is_summed_up_by_its_errors() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("dump.log");
        std::fs::write(&log, "(00.1) one\n(00.2) Error (sk-unix.c:1): unix: external socket\n(00.3) two\n").unwrap();
        assert_eq!(errors_in(&log), "  (00.2) Error (sk-unix.c:1): unix: external socket");
        std::fs::write(&log, "a\nb\nc\nd\ne\nf\ng\n").unwrap();
        assert_eq!(errors_in(&log), "  c\n  d\n  e\n  f\n  g");
    }

    #[test]
    fn a_process_elsewhere_is_not_dumped() {
        let dir = tempfile::tempdir().unwrap();
        let e = dump(Path::new("/nonexistent/criu"), u32::MAX - 1, dir.path(), true).unwrap_err();
        assert!(matches!(e, ProcessError::NotHere { .. }), "{e}");
    }

    #[test]
    fn a_process_is_not_restored_over_a_running_one() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join(PROCESS_DIR)).unwrap();
        std::fs::write(dir.path().join(PROCESS_DIR).join("phos-pid"), format!("{}\n", std::process::id())).unwrap();
        let e = restore(Path::new("/nonexistent/criu"), dir.path()).unwrap_err();
        assert!(matches!(e, ProcessError::StillRunning { pid } if pid == std::process::id()), "{e}");
        std::fs::write(dir.path().join(PROCESS_DIR).join("phos-pid"), format!("{}\n", u32::MAX - 1)).unwrap();
        assert!(check_restorable(dir.path()).is_ok());
    }
}
