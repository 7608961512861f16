//! What a `phosctl` command that failed says, and the exit status that tells scripts which
//! kind of failure it was (docs/operations.md, "Exit status").

use std::path::PathBuf;
use std::process::ExitCode;

use phos_control::{ControlError, ErrorClass};

/// The exit status of a command that failed, one per kind of failure. (`phosctl run` exits
/// with its program's status instead.)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Exit {
    /// It went wrong on the way: a device, a disk, a server that failed.
    Failed = 1,
    /// The command line or a configuration file cannot be used as written (clap's own
    /// usage errors exit with 2 too).
    Usage = 2,
    /// The router, or something the operation needs (an API server, clang), cannot be
    /// reached or started.
    Unavailable = 3,
    /// No such session or policy.
    NotFound = 4,
    /// Refused: an image or a policy that does not check, the tenant rules of a restore, a
    /// session in a state that does not allow it.
    Refused = 5,
    /// It did not end in time: the session did not come to rest, a deadline passed.
    TimedOut = 6,
    /// Partly done: what it could reach was done and printed, what it could not is named
    /// (`sessions --all` with a peer that did not answer).
    Partial = 7,
}

impl From<Exit> for ExitCode {
    fn from(e: Exit) -> ExitCode {
        ExitCode::from(e as u8)
    }
}

impl From<ErrorClass> for Exit {
    fn from(c: ErrorClass) -> Exit {
        match c {
            ErrorClass::Failed => Exit::Failed,
            ErrorClass::Unavailable => Exit::Unavailable,
            ErrorClass::NotFound => Exit::NotFound,
            ErrorClass::Refused => Exit::Refused,
            ErrorClass::TimedOut => Exit::TimedOut,
        }
    }
}

/// Why a command failed.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// What the router answered.
    #[error(transparent)]
    Router(#[from] ControlError),
    #[error("cannot reach the router at {}: {source}", path.display())]
    Unreachable { path: PathBuf, source: std::io::Error },
    #[error("the router did not answer in time")]
    NoAnswer,
    /// The connection to the router broke during the call.
    #[error("the call to the router failed: {0}")]
    Call(tarpc::client::RpcError),
    /// An argument (an endpoint, a policy named) that cannot be used.
    #[error("{0}")]
    Usage(String),
    #[error(transparent)]
    PolicySource(#[from] phos_policy::SourceError),
    #[error(transparent)]
    PolicyBuild(#[from] phos_policy::BuildError),
    #[error("{context}: {source}")]
    Io { context: String, source: std::io::Error },
    #[error(transparent)]
    VmMigration(#[from] crate::vm_migrate::VmMigrationError),
    /// An on-demand restore served its session, then could not load its memory.
    #[error("session {session}: loading its memory after the restore failed: {reason}; the session's calls fail")]
    LoadFailed { session: u64, reason: String },
    /// Some routers of the fleet did not answer (each named on its own line before).
    #[error("{unanswered} of {routers} routers did not answer: their sessions are not listed")]
    Partial { unanswered: usize, routers: usize },
    /// `checkpoint --process`: the GPU image is written, the process was not dumped.
    #[error("session {session}: its process {pid} was not dumped: {source}; {after}")]
    ProcessNotDumped { session: u64, pid: u32, source: crate::process::ProcessError, after: String },
    /// `restore` of an image with a process: its process did not come back (nothing changed).
    #[error("session {session}: its process was not restored (the session was left as it was): {source}")]
    ProcessNotRestored { session: u64, source: crate::process::ProcessError },
    /// `restore` of an image with a process: the process is back, its session is not.
    #[error(
        "the process ({pid}) is restored and waits for its session, which was not restored: {source}; `phosctl restore --without-process` restores the session for it"
    )]
    SessionNotRestored { pid: u32, source: Box<CliError> },
}

impl From<tarpc::client::RpcError> for CliError {
    fn from(e: tarpc::client::RpcError) -> Self {
        match e {
            tarpc::client::RpcError::DeadlineExceeded => CliError::NoAnswer,
            e => CliError::Call(e),
        }
    }
}

impl CliError {
    pub fn exit(&self) -> Exit {
        match self {
            CliError::Router(e) => e.class().into(),
            CliError::Unreachable { .. } | CliError::Call(_) => Exit::Unavailable,
            CliError::NoAnswer => Exit::TimedOut,
            CliError::Usage(_) | CliError::PolicySource(_) => Exit::Usage,
            CliError::PolicyBuild(phos_policy::BuildError::NoCompiler { .. }) => Exit::Unavailable,
            CliError::PolicyBuild(_) | CliError::Io { .. } | CliError::LoadFailed { .. } => Exit::Failed,
            CliError::Partial { .. } => Exit::Partial,
            CliError::SessionNotRestored { source, .. } => source.exit(),
            CliError::ProcessNotDumped { source, .. } | CliError::ProcessNotRestored { source, .. } => match source {
                crate::process::ProcessError::NoCriu { .. } => Exit::Unavailable,
                crate::process::ProcessError::NotHere { .. } | crate::process::ProcessError::StillRunning { .. } => {
                    Exit::Refused
                }
                _ => Exit::Failed,
            },
            CliError::VmMigration(e) => match e {
                crate::vm_migrate::VmMigrationError::Refused(_) => Exit::Refused,
                crate::vm_migrate::VmMigrationError::Qmp(crate::qmp::QmpError::Connect { .. }) => Exit::Unavailable,
                _ => Exit::Failed,
            },
        }
    }
}

/// The end of a command: its error said on standard error, and its exit status.
pub fn report(r: Result<(), CliError>) -> ExitCode {
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("phosctl: {e}");
            e.exit().into()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each class of failure has its own status, and success none of them.
    #[test]
    fn every_class_has_its_own_exit_status() {
        let all = [
            Exit::Failed,
            Exit::Usage,
            Exit::Unavailable,
            Exit::NotFound,
            Exit::Refused,
            Exit::TimedOut,
            Exit::Partial,
        ];
        let codes: std::collections::BTreeSet<u8> = all.iter().map(|e| *e as u8).collect();
        assert_eq!(codes.len(), all.len());
        assert!(!codes.contains(&0));
        let busy = ControlError::Busy {
            session: 1,
            waited: std::time::Duration::from_secs(1),
            waiting_for: phos_control::Waiting::Device { device: 0 },
        };
        assert_eq!(CliError::from(busy).exit(), Exit::TimedOut);
        assert_eq!(CliError::from(ControlError::NoSuchSession { session: 3 }).exit(), Exit::NotFound);
        assert_eq!(CliError::from(tarpc::client::RpcError::DeadlineExceeded).exit(), Exit::TimedOut);
    }
}
