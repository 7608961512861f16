//! Why a management call failed. One error type serves both services (the router passes on
//! what an API server answered), serialisable so that it crosses the socket whole, and each
//! error belongs to a [`ErrorClass`] that `phosctl` turns into its exit status.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// A management operation on a session, as errors name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Operation {
    Checkpoint,
    Restore,
    /// Giving a pooled server a fresh session.
    Start,
    /// Moving a running session to another server.
    Migration,
}

impl std::fmt::Display for Operation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Operation::Checkpoint => "checkpoint",
            Operation::Restore => "restore",
            Operation::Start => "start of the session",
            Operation::Migration => "migration",
        })
    }
}

/// What a checkpoint was still waiting for when it gave up (the C/R engine's own type).
pub use phos_checkpoint::report::Waiting;

/// Why an image is not restored.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum ImageRefusal {
    /// It does not read, or does not check: what the image's reader or the server's checks
    /// found (its format version, a checksum, a session no server could be).
    #[error("{0}")]
    Invalid(String),
    #[error("the image of session {session} belongs to tenant {image:?}, not {expected:?}")]
    OtherTenant { session: u64, image: String, expected: String },
    #[error("the image is not of session {session} (another session's token)")]
    OtherSession { session: u64 },
    #[error(
        "session {session} belongs to tenant {session_tenant:?}; the image {} tenant {image_tenant:?}",
        if *as_tenant { "would be restored as" } else { "was made by" }
    )]
    TenantMismatch { session: u64, session_tenant: String, image_tenant: String, as_tenant: bool },
    #[error(
        "session {session} is not in this router: restoring it makes a new session of tenant {tenant:?}; say so with --tenant {tenant:?} (or restore it as another tenant's with --as-tenant NAME)"
    )]
    TenantUnconfirmed { session: u64, tenant: String },
    #[error("no tenant {tenant:?} here (a configured tenant's name, or uid:N)")]
    UnknownTenant { tenant: String },
}

/// Why a management call failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error, Serialize, Deserialize)]
pub enum ControlError {
    #[error("no session {session}")]
    NoSuchSession { session: u64 },
    #[error("session {session} is suspended (checkpointed with --stop): it has no API server until it is restored")]
    Suspended { session: u64 },
    #[error("session {session} has ended")]
    Ended { session: u64 },
    #[error("session {session} is running; checkpoint it with --stop before restoring it")]
    Running { session: u64 },
    /// The session did not come to rest (its calls and devices idle) in the time allowed.
    #[error(
        "session {session}: the checkpoint gave up after {waited:.1?} waiting for {waiting_for}; nothing was written, and the session carries on as it was"
    )]
    Busy { session: u64, waited: Duration, waiting_for: Waiting },
    #[error("session {session}: the {operation} did not finish within {within:?} ({during}); the session is as it was")]
    DeadlinePassed { session: u64, operation: Operation, within: Duration, during: String },
    /// Its client went away, or gave up, before it ended.
    #[error(
        "session {session}: the {operation} was abandoned (its client went away) while {during}; the session is as it was"
    )]
    Abandoned { session: u64, operation: Operation, during: String },
    #[error("cannot restore {}: {reason}", dir.display())]
    ImageRefused { dir: PathBuf, reason: ImageRefusal },
    #[error("no policy named `{name}`")]
    NoSuchPolicy { name: String },
    /// The policy does not load: a bad name or setting, an object that does not check, the
    /// kernel's verifier said no.
    #[error("policy `{name}` refused: {reason}")]
    PolicyRefused { name: String, reason: String },
    #[error("policy `{name}`: the load was abandoned: its client gave up before it took effect")]
    PolicyAbandoned { name: String },
    #[error("session {session}: its API server does not answer: {reason}")]
    ServerUnreachable { session: u64, reason: String },
    #[error("session {session}: cannot start an API server: {reason}")]
    ServerNotStarted { session: u64, reason: String },
    #[error("this API server has no session yet")]
    ServerHasNoSession,
    #[error("this API server has session {session} already")]
    ServerHasSession { session: u64 },
    /// The API server failed the operation (its device, its disk).
    #[error("session {session}: the {operation} failed: {reason}")]
    Failed { session: u64, operation: Operation, reason: String },
    /// The router's own resources (a thread, a runtime, a file).
    #[error("{context}: {reason}")]
    Io { context: String, reason: String },
    /// A migration's target (another router, another device's server) refused the session,
    /// failed, or could not be reached; the session runs on where it was.
    #[error("session {session}: the migration to {to} failed: {reason}; the session runs on here, as it was")]
    MigrationFailed { session: u64, to: String, reason: String },
    /// A peer router refused to talk (no shared secret, or not the same one).
    #[error("the router at {peer} refused: {reason}")]
    PeerRefused { peer: String, reason: String },
}

/// What kind of failure an error is: `phosctl` exits with one status per class
/// (docs/operations.md lists them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// It went wrong on the way: a device, a disk, a server that failed.
    Failed,
    /// Something it needs cannot be reached or started (the router, an API server).
    Unavailable,
    /// No such session or policy.
    NotFound,
    /// Refused as asked: an image or a policy that does not check, the tenant rules of a
    /// restore, a session in a state that does not allow it.
    Refused,
    /// It did not end in the time allowed (the session did not come to rest, a deadline).
    TimedOut,
}

impl ControlError {
    pub fn class(&self) -> ErrorClass {
        use ControlError::*;
        match self {
            NoSuchSession { .. } | NoSuchPolicy { .. } => ErrorClass::NotFound,
            Suspended { .. } | Ended { .. } | Running { .. } | ImageRefused { .. } | PolicyRefused { .. } => {
                ErrorClass::Refused
            }
            Busy { .. } | DeadlinePassed { .. } => ErrorClass::TimedOut,
            ServerUnreachable { .. } | ServerNotStarted { .. } => ErrorClass::Unavailable,
            PeerRefused { .. } => ErrorClass::Refused,
            MigrationFailed { .. } => ErrorClass::Failed,
            Abandoned { .. }
            | PolicyAbandoned { .. }
            | ServerHasNoSession
            | ServerHasSession { .. }
            | Failed { .. }
            | Io { .. } => ErrorClass::Failed,
        }
    }

    /// The router's own I/O failed while doing `context`.
    pub fn io(context: impl Into<String>, e: impl std::fmt::Display) -> Self {
        ControlError::Io { context: context.into(), reason: e.to_string() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Errors cross a management socket (tarpc's codec, as the services use it) and come out
    /// the same, messages included.
    #[test]
    fn errors_cross_the_socket_whole() {
        #[tarpc::service]
        trait Echo {
            async fn fail(e: ControlError) -> Result<(), ControlError>;
        }
        #[derive(Clone)]
        struct Server;
        impl Echo for Server {
            async fn fail(self, _: tarpc::context::Context, e: ControlError) -> Result<(), ControlError> {
                Err(e)
            }
        }
        let dir = std::env::temp_dir().join(format!("phos-control-errors-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("echo.ctl");
        crate::spawn_service_thread(path.clone(), |_| Server.serve()).unwrap();
        let errors = vec![
            ControlError::Busy {
                session: 4,
                waited: Duration::from_millis(1500),
                waiting_for: Waiting::Calls { functions: vec!["phosLaunchKernel".into()] },
            },
            ControlError::ImageRefused {
                dir: "/images/a".into(),
                reason: ImageRefusal::OtherTenant { session: 4, image: "uid:0".into(), expected: "uid:9".into() },
            },
            ControlError::DeadlinePassed {
                session: 4,
                operation: Operation::Restore,
                within: Duration::ZERO,
                during: "starting a server that restores it".into(),
            },
        ];
        let back = crate::block_on(async {
            use tarpc::tokio_serde::formats::Bincode;
            let transport = tarpc::serde_transport::unix::connect(&path, Bincode::default).await.unwrap();
            let client = EchoClient::new(tarpc::client::Config::default(), transport).spawn();
            let mut back = Vec::new();
            for e in &errors {
                back.push(client.fail(tarpc::context::current(), e.clone()).await.unwrap().unwrap_err());
            }
            back
        })
        .unwrap();
        for (sent, got) in errors.iter().zip(&back) {
            assert_eq!(sent, got);
            assert_eq!(sent.to_string(), got.to_string());
        }
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn messages_name_what_failed() {
        let busy = ControlError::Busy {
            session: 7,
            waited: Duration::from_secs(1),
            waiting_for: Waiting::Calls { functions: vec!["phosLaunchKernel".into(), "cudaMemcpy".into()] },
        };
        assert!(busy.to_string().contains("session 7"), "{busy}");
        assert!(busy.to_string().contains("its calls in flight to finish: phosLaunchKernel, cudaMemcpy"), "{busy}");
        assert_eq!(busy.class(), ErrorClass::TimedOut);
        let device = Waiting::Device { device: 2 }.to_string();
        assert!(device.starts_with("device 2 to finish"), "{device}");
        let mismatch = ImageRefusal::TenantMismatch {
            session: 3,
            session_tenant: "a".into(),
            image_tenant: "b".into(),
            as_tenant: true,
        };
        assert_eq!(
            mismatch.to_string(),
            "session 3 belongs to tenant \"a\"; the image would be restored as tenant \"b\""
        );
        assert_eq!(ControlError::NoSuchSession { session: 9 }.class(), ErrorClass::NotFound);
    }
}
