//! The server's management service (`tarpc`, used by the router): checkpoint the session,
//! report progress, and, for a server started ahead of need (the router's pool), start a
//! fresh session or restore one from an image.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use phos_checkpoint::{Compression, CrError, SessionMeta};
use phos_control::{
    Cancel, CheckpointRequest, CheckpointSummary, ControlError, ImageRefusal, LoadReport, Operation, Progress,
    RestoreSummary, ServerControl, SessionIdentity,
};
use phos_protocol::limits::SessionLimits;
use tarpc::context::Context;

use phos_protocol::CudaError;

use crate::backend::prelude::*;
use crate::checkpoint::{Bounds, How, Progress as Counters};
use crate::on_demand::LoadStatus;
use crate::output::DeviceOutput;
use crate::server::SessionSlot;
use crate::service::Session;

/// How a server makes a session when it is told to.
#[derive(Clone)]
pub struct SessionFactory {
    pub backend: Arc<dyn Backend>,
    pub device_base: u64,
    pub device_size: u64,
    pub max_reply: u64,
    /// Device output capture of this process (the `cuda` backend's stdout pipe), if any.
    pub output: Arc<dyn Fn() -> DeviceOutput + Send + Sync>,
    /// Objects of each kind a session may hold (the router's `[limits]`).
    pub limits: SessionLimits,
    /// Bytes a device a concurrent checkpoint may copy memory into ahead of writes (`None`:
    /// sized from each device's free memory when the checkpoint starts).
    pub cow_reserve: Option<u64>,
}

/// Why a server could not make a fresh session.
#[derive(Debug, thiserror::Error)]
#[error("setting up the session's device memory: {0:?}")]
pub struct NewSessionError(pub CudaError);

impl SessionFactory {
    pub fn fresh(&self, id: u64) -> Result<Session, NewSessionError> {
        Session::new(
            id,
            self.backend.clone(),
            self.device_base,
            self.device_size,
            self.max_reply,
            (self.output)(),
            self.limits,
        )
        .map_err(NewSessionError)
    }

    pub fn restore(
        &self,
        dir: &std::path::Path,
        device: Option<i32>,
        progress: &Counters,
        cancel: &Cancel,
    ) -> Result<(Session, RestoreSummary), CrError> {
        let (session, meta, r) = Session::restore(dir, self, device, progress, cancel)?;
        tracing::info!(
            session = meta.id,
            "restored {} records and {} bytes of device memory in {:.1} ms (verify {:.1}, replay {:.1}, copy {:.1})",
            r.records,
            r.memory_bytes,
            r.total_ms,
            r.verify_ms,
            r.replay_ms,
            r.copy_ms
        );
        Ok((session, r))
    }

    /// Restore on demand ([`Session::restore_on_demand`]): the session is returned once its
    /// objects exist, and its memory loads behind it.
    pub fn restore_on_demand(
        &self,
        dir: &std::path::Path,
        device: Option<i32>,
        progress: &Arc<Counters>,
        cancel: &Cancel,
        pace: std::time::Duration,
    ) -> Result<(Arc<Session>, RestoreSummary, Arc<LoadStatus>), CrError> {
        let (session, meta, r, status) = Session::restore_on_demand(dir, self, device, progress, cancel, pace)?;
        tracing::info!(
            session = meta.id,
            "restored {} records on demand in {:.1} ms (verify {:.1}, replay {:.1}); serving while {} bytes of device memory load",
            r.records,
            r.total_ms,
            r.verify_ms,
            r.replay_ms,
            r.memory_bytes
        );
        Ok((session, r, status))
    }
}

/// What a checkpoint or restore of `session` (to or from `dir`) that stopped says to the
/// router: the one place the C/R engine's errors become the management services' classes.
fn to_wire(e: CrError, operation: Operation, session: u64, dir: &Path) -> ControlError {
    let refused =
        |why: String| ControlError::ImageRefused { dir: dir.to_path_buf(), reason: ImageRefusal::Invalid(why) };
    match e {
        CrError::TimedOut { session, waited, waiting_for } => ControlError::Busy { session, waited, waiting_for },
        CrError::Abandoned { session, what } => ControlError::Abandoned { session, operation, during: what },
        // A restore's image that does not read, does not check, or describes a session this
        // server could not have (another spec, an unknown function, a device it lacks).
        CrError::Image(_) | CrError::OtherApis(_) | CrError::UnknownFunction(_) | CrError::NoSuchDevice { .. }
            if operation == Operation::Restore =>
        {
            refused(e.to_string())
        }
        // The device, the disk, a replay the device refused, the engine's own threads.
        e => ControlError::Failed { session, operation, reason: e.to_string() },
    }
}

fn failed(session: u64, operation: Operation, reason: String) -> ControlError {
    ControlError::Failed { session, operation, reason }
}

#[derive(Clone)]
pub struct ServerCtl {
    pub slot: Arc<SessionSlot>,
    pub factory: SessionFactory,
    pub progress: Arc<Counters>,
    /// Set when the client of this connection (the router) has gone.
    pub gone: Cancel,
    /// The flags of the operations in progress, for [`abandon`](ServerControl::abandon).
    pub running: Arc<parking_lot::Mutex<Vec<Cancel>>>,
    /// The load of the session's on-demand restore, once there was one.
    pub load: Arc<parking_lot::Mutex<Option<Arc<LoadStatus>>>>,
    /// Waited before each chunk an on-demand restore loads (a test's knob; zero otherwise).
    pub load_pace: std::time::Duration,
}

impl ServerCtl {
    /// The error of a call that would give this server a second session.
    fn has_session(&self) -> ControlError {
        ControlError::ServerHasSession { session: self.slot.get().map_or(0, |s| s.id) }
    }
}

/// An operation's flag, listed in [`ServerCtl::running`] while it lives. Set when the
/// request is dropped (its deadline passed, the router cancelled it), when the router's
/// connection goes, or when the router abandons it.
struct Running {
    cancel: Cancel,
    _on_drop: phos_control::CancelOnDrop,
    list: Arc<parking_lot::Mutex<Vec<Cancel>>>,
}

impl Running {
    fn new(ctl: &ServerCtl) -> Self {
        let cancel = ctl.gone.child();
        ctl.running.lock().push(cancel.clone());
        Running { _on_drop: cancel.on_drop(), cancel, list: ctl.running.clone() }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let mut list = self.list.lock();
        if let Some(i) = list.iter().position(|c| c.same_as(&self.cancel)) {
            list.swap_remove(i);
        }
    }
}

impl ServerControl for ServerCtl {
    async fn checkpoint(
        self,
        _: Context,
        request: CheckpointRequest,
        id: SessionIdentity,
    ) -> Result<CheckpointSummary, ControlError> {
        let session = self.slot.get().cloned().ok_or(ControlError::ServerHasNoSession)?;
        let session_id = session.id;
        let progress = self.progress.clone();
        let dir = request.dir.clone();
        let meta = SessionMeta {
            token: id.token,
            tenant: id.tenant,
            program: id.program,
            abi_major: id.abi_major,
            epoch: id.epoch,
            ..Default::default()
        };
        let compression = if request.compress { Compression::Zstd(1) } else { Compression::None };
        let how = How { mode: request.mode, stop: request.stop, reserve: self.factory.cow_reserve };
        let running = Running::new(&self);
        let bounds = Bounds { quiesce_timeout: request.quiesce_timeout, cancel: running.cancel.clone() };
        let load = self.load.lock().clone();
        let r = tokio::task::spawn_blocking(move || {
            // Memory an on-demand restore has not loaded yet is not the session's to copy.
            load.map_or(Ok(()), |l| l.wait_over(&bounds))
                .and_then(|()| session.checkpoint_as(&dir, meta, compression, how, &progress, &bounds))
                .inspect_err(|e| tracing::warn!("{e}"))
        })
        .await
        .map_err(|e| failed(session_id, Operation::Checkpoint, format!("checkpoint task: {e}")))?
        .map_err(|e| to_wire(e, Operation::Checkpoint, session_id, &request.dir))?;
        drop(running);
        tracing::info!(
            "checkpoint ({}) to {}: {} records, {} regions, {} bytes of memory stored in {} ({:.1} ms: quiesce {:.1}, copy {:.1}; calls held {:.1} ms)",
            r.mode,
            request.dir.display(),
            r.records,
            r.regions,
            r.memory_bytes,
            r.stored_bytes,
            r.total_ms,
            r.quiesce_ms,
            r.copy_ms,
            r.stall_ms
        );
        Ok(r)
    }

    async fn progress(self, _: Context) -> Progress {
        Progress {
            done: self.progress.done.load(Ordering::Relaxed),
            total: self.progress.total.load(Ordering::Relaxed),
        }
    }

    async fn start(self, _: Context, session: u64) -> Result<(), ControlError> {
        let s = self.factory.fresh(session).map_err(|e| failed(session, Operation::Start, e.to_string()))?;
        self.slot.set(Arc::new(s)).map_err(|_| self.has_session())
    }

    async fn restore(
        self,
        _: Context,
        session: u64,
        dir: PathBuf,
        device: Option<i32>,
        full: bool,
    ) -> Result<RestoreSummary, ControlError> {
        if self.slot.get().is_some() {
            return Err(self.has_session());
        }
        let factory = self.factory.clone();
        let progress = self.progress.clone();
        let running = Running::new(&self);
        let cancel = running.cancel.clone();
        let image = dir.clone();
        let pace = self.load_pace;
        let (restored, summary, load) = tokio::task::spawn_blocking(move || {
            if full {
                factory.restore(&image, device, &progress, &cancel).map(|(s, r)| (Arc::new(s), r, None))
            } else {
                factory.restore_on_demand(&image, device, &progress, &cancel, pace).map(|(s, r, l)| (s, r, Some(l)))
            }
        })
        .await
        .map_err(|e| failed(session, Operation::Restore, format!("restore task: {e}")))?
        .map_err(|e| to_wire(e, Operation::Restore, session, &dir))?;
        drop(running);
        if restored.id != session {
            // The router read another manifest there: the image changed under it.
            let reason = ImageRefusal::Invalid(format!("the image is of session {}, not {session}", restored.id));
            return Err(ControlError::ImageRefused { dir, reason });
        }
        *self.load.lock() = load;
        self.slot.set(restored).map_err(|_| self.has_session())?;
        Ok(summary)
    }

    async fn load(self, _: Context) -> Option<LoadReport> {
        self.load.lock().as_ref().map(|l| l.report())
    }

    async fn abandon(self, _: Context) {
        for c in self.running.lock().iter() {
            c.cancel();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use phos_checkpoint::ImageError;
    use phos_checkpoint::report::Waiting;
    use phos_control::ErrorClass;

    use super::*;

    /// The engine's errors reach the router in their classes: a session that did not come to
    /// rest is busy (timed out), a restore's unusable image is refused, an abandoned operation
    /// says so, and the rest failed, naming what did.
    #[test]
    fn c_r_errors_reach_the_router_in_their_classes() {
        let dir = Path::new("/images/a");
        let wire = |e, op| to_wire(e, op, 7, dir);
        let waiting_for = Waiting::Device { device: 1 };
        let busy = CrError::TimedOut { session: 7, waited: Duration::from_secs(2), waiting_for: waiting_for.clone() };
        let want = ControlError::Busy { session: 7, waited: Duration::from_secs(2), waiting_for };
        assert_eq!(wire(busy, Operation::Checkpoint), want);
        assert_eq!(want.class(), ErrorClass::TimedOut);
        let gone = wire(CrError::Abandoned { session: 7, what: "copying memory".into() }, Operation::Restore);
        assert_eq!(
            gone,
            ControlError::Abandoned { session: 7, operation: Operation::Restore, during: "copying memory".into() }
        );
        let corrupted = || CrError::Image(ImageError::Corrupted("a memory chunk fails its checksum".into()));
        for refused in [
            corrupted(),
            CrError::OtherApis(phos_protocol::handshake::ApiMismatch::NoApi { whose: "the image" }),
            CrError::UnknownFunction("cudaNothing".into()),
            CrError::NoSuchDevice { device: 7, devices: 1 },
        ] {
            let why = refused.to_string();
            let e = wire(refused, Operation::Restore);
            assert_eq!(e, ControlError::ImageRefused { dir: dir.into(), reason: ImageRefusal::Invalid(why) });
            assert_eq!(e.class(), ErrorClass::Refused);
        }
        // Writing an image that fails is the checkpoint's failure, not a refused image.
        let e = wire(corrupted(), Operation::Checkpoint);
        assert!(
            matches!(&e, ControlError::Failed { session: 7, operation: Operation::Checkpoint, reason } if reason.contains("checksum")),
            "{e}"
        );
        let replay = CrError::Replay {
            function: "cudaMalloc".into(),
            reason: phos_protocol::Rejection::Failed(CudaError::MemoryAllocation).to_string(),
        };
        let e = wire(replay, Operation::Restore);
        assert!(matches!(&e, ControlError::Failed { reason, .. } if reason.contains("replaying cudaMalloc")), "{e}");
        assert_eq!(e.class(), ErrorClass::Failed);
    }
}
