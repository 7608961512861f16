//! The server's management service (`tarpc`, used by the router): checkpoint the session,
//! report progress, and, for a server started ahead of need (the router's pool), start a
//! fresh session or restore one from an image.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use phos_checkpoint::{Compression, CrError, SessionMeta};
use phos_control::{
    Cancel, CheckpointRequest, CheckpointSummary, Progress, RestoreSummary, ServerControl, SessionIdentity,
};
use phos_protocol::limits::SessionLimits;
use tarpc::context::Context;

use phos_protocol::CudaError;

use crate::backend::prelude::*;
use crate::checkpoint::{Bounds, Progress as Counters};
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
}

#[derive(Clone)]
pub struct ServerCtl {
    pub slot: Arc<SessionSlot>,
    pub factory: SessionFactory,
    pub progress: Arc<Counters>,
    pub last_restore: Arc<parking_lot::Mutex<Option<RestoreSummary>>>,
    /// Set when the client of this connection (the router) has gone.
    pub gone: Cancel,
    /// The flags of the operations in progress, for [`abandon`](ServerControl::abandon).
    pub running: Arc<parking_lot::Mutex<Vec<Cancel>>>,
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
    ) -> Result<CheckpointSummary, String> {
        let session = self.slot.get().cloned().ok_or("this server has no session yet")?;
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
        let stop = request.stop;
        let running = Running::new(&self);
        let bounds = Bounds { quiesce_timeout: request.quiesce_timeout, cancel: running.cancel.clone() };
        let r = tokio::task::spawn_blocking(move || {
            session.checkpoint(&dir, meta, compression, stop, &progress, &bounds).inspect_err(|e| tracing::warn!("{e}"))
        })
        .await
        .map_err(|e| format!("checkpoint task: {e}"))?
        .map_err(|e| e.to_string())?;
        drop(running);
        tracing::info!(
            "checkpoint to {}: {} records, {} regions, {} bytes of memory stored in {} ({:.1} ms: quiesce {:.1}, copy {:.1})",
            request.dir.display(),
            r.records,
            r.regions,
            r.memory_bytes,
            r.stored_bytes,
            r.total_ms,
            r.quiesce_ms,
            r.copy_ms
        );
        Ok(r)
    }

    async fn progress(self, _: Context) -> Progress {
        Progress {
            done: self.progress.done.load(Ordering::Relaxed),
            total: self.progress.total.load(Ordering::Relaxed),
        }
    }

    async fn start(self, _: Context, session: u64) -> Result<(), String> {
        let s = self.factory.fresh(session).map_err(|e| e.to_string())?;
        self.slot.set(Arc::new(s)).map_err(|_| "this server already has a session".to_string())
    }

    async fn restore(self, _: Context, dir: PathBuf, device: Option<i32>) -> Result<RestoreSummary, String> {
        if self.slot.get().is_some() {
            return Err("this server already has a session".into());
        }
        let factory = self.factory.clone();
        let progress = self.progress.clone();
        let running = Running::new(&self);
        let cancel = running.cancel.clone();
        let (session, summary) = tokio::task::spawn_blocking(move || factory.restore(&dir, device, &progress, &cancel))
            .await
            .map_err(|e| format!("restore task: {e}"))?
            .map_err(|e| e.to_string())?;
        drop(running);
        self.slot.set(Arc::new(session)).map_err(|_| "this server already has a session".to_string())?;
        *self.last_restore.lock() = Some(summary.clone());
        Ok(summary)
    }

    async fn last_restore(self, _: Context) -> Option<RestoreSummary> {
        self.last_restore.lock().clone()
    }

    async fn abandon(self, _: Context) {
        for c in self.running.lock().iter() {
            c.cancel();
        }
    }
}
