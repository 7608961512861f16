//! The server's management service (`tarpc`, used by the router): checkpoint the session,
//! report progress, and, for a server started ahead of need (the router's pool), start a
//! fresh session or restore one from an image.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use phos_checkpoint::{Compression, CrError, SessionMeta};
use phos_control::{
    Cancel, CheckpointRequest, CheckpointSummary, ControlError, ImageRefusal, LoadReport, MigrateOut, Operation,
    Progress, RestoreSummary, SentFigures, ServerControl, SessionIdentity,
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
    /// The router's runtime directory (where the server's channel socket is), under which
    /// each tenant's IPC directory lies; `None`: IPC is refused.
    pub runtime_dir: Option<PathBuf>,
}

/// Why a server could not make a fresh session.
#[derive(Debug, thiserror::Error)]
#[error("setting up the session's device memory: {0:?}")]
pub struct NewSessionError(pub CudaError);

impl SessionFactory {
    /// Let `session` reach the IPC directory of `tenant` (its exports and its opens).
    pub fn join_tenant(&self, session: &Session, tenant: &str) {
        if let Some(dir) = &self.runtime_dir {
            session.ipc.set_dir(crate::ipc::tenant_dir(dir, tenant));
        }
    }

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
        self.join_tenant(&session, &meta.tenant);
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
        self.join_tenant(&session, &meta.tenant);
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

/// What the router knows of a session, as its image records it (the rest is the server's).
fn meta_of(id: SessionIdentity) -> SessionMeta {
    SessionMeta {
        token: id.token,
        tenant: id.tenant,
        program: id.program,
        abi_major: id.abi_major,
        epoch: id.epoch,
        ..Default::default()
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
    /// The migration this server receives, once one began: its outcome when it is known.
    pub incoming: Arc<Incoming>,
    /// Waited before each piece of an incoming migration (a test's knob; zero otherwise).
    pub migrate_in_pace: std::time::Duration,
}

/// A migration stream a server without a session receives ([`ServerControl::receive`]).
#[derive(Default)]
pub struct Incoming {
    /// `None` until one began; then `Some(None)` until it ends.
    outcome: parking_lot::Mutex<Option<Option<Result<RestoreSummary, ControlError>>>>,
    ended: parking_lot::Condvar,
}

/// How long a server that listens for a migration waits for its source to connect, and for
/// each read once connected, before it gives up.
const MIGRATION_WAIT: std::time::Duration = std::time::Duration::from_secs(120);

/// How long a server sending a session waits for the target's server to accept.
const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

fn migration_failed(session: u64, reason: String) -> ControlError {
    failed(session, Operation::Migration, reason)
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
        Self::with(ctl, ctl.gone.child())
    }

    /// An operation that outlives the request that began it (an incoming migration, which
    /// its router asks about later on another connection): only `abandon` stops it.
    fn detached(ctl: &ServerCtl) -> Self {
        Self::with(ctl, Cancel::default())
    }

    fn with(ctl: &ServerCtl, cancel: Cancel) -> Self {
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
        let meta = meta_of(id);
        let compression = if request.compress { Compression::Zstd(1) } else { Compression::None };
        let how = How { mode: request.mode, stop: request.stop, park: request.park, reserve: self.factory.cow_reserve };
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
            pass: self.progress.pass.load(Ordering::Relaxed),
            held: self.progress.held.load(Ordering::Relaxed),
            dirty_rate: self.progress.dirty_rate.load(Ordering::Relaxed),
            frozen: self.slot.get().is_some_and(|s| s.is_frozen()),
        }
    }

    async fn start(self, _: Context, session: u64, tenant: String) -> Result<(), ControlError> {
        let s = self.factory.fresh(session).map_err(|e| failed(session, Operation::Start, e.to_string()))?;
        self.factory.join_tenant(&s, &tenant);
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

    async fn receive(
        self,
        _: Context,
        session: u64,
        device: Option<i32>,
        key: [u8; 16],
        bind: String,
    ) -> Result<u16, ControlError> {
        if self.slot.get().is_some() {
            return Err(self.has_session());
        }
        {
            let mut outcome = self.incoming.outcome.lock();
            if outcome.is_some() {
                return Err(migration_failed(session, "this server receives a migration already".into()));
            }
            *outcome = Some(None);
        }
        let listener = std::net::TcpListener::bind((bind.as_str(), 0))
            .and_then(|l| l.local_addr().map(|a| (l, a)))
            .map_err(|e| migration_failed(session, format!("listening on {bind} for the migration: {e}")));
        let (listener, addr) = match listener {
            Ok(l) => l,
            Err(e) => {
                *self.incoming.outcome.lock() = None;
                return Err(e);
            }
        };
        let ctl = self.clone();
        let spawned = std::thread::Builder::new().name("phos-migrate-in".into()).spawn(move || {
            let outcome = ctl.take_migration(listener, session, device, &key);
            if let Err(e) = &outcome {
                tracing::warn!(session, "incoming migration: {e}");
            }
            *ctl.incoming.outcome.lock() = Some(Some(outcome));
            ctl.incoming.ended.notify_all();
        });
        spawned.map_err(|e| migration_failed(session, format!("a thread for the migration: {e}")))?;
        Ok(addr.port())
    }

    async fn received(self, cx: Context) -> Result<RestoreSummary, ControlError> {
        let incoming = self.incoming.clone();
        let until = cx.deadline;
        tokio::task::spawn_blocking(move || {
            let mut outcome = incoming.outcome.lock();
            loop {
                match &*outcome {
                    None => return Err(ControlError::ServerHasNoSession),
                    Some(Some(r)) => return r.clone(),
                    Some(None) => {
                        if incoming.ended.wait_until(&mut outcome, until).timed_out() {
                            return Err(migration_failed(0, "the migration did not arrive in time".into()));
                        }
                    }
                }
            }
        })
        .await
        .map_err(|e| migration_failed(0, format!("waiting for the migration: {e}")))?
    }

    async fn migrate_out(self, _: Context, request: MigrateOut) -> Result<SentFigures, ControlError> {
        let session = self.slot.get().cloned().ok_or(ControlError::ServerHasNoSession)?;
        let id = session.id;
        let progress = self.progress.clone();
        let running = Running::new(&self);
        let bounds = Bounds { quiesce_timeout: request.quiesce_timeout, cancel: running.cancel.clone() };
        let load = self.load.lock().clone();
        let to = request.stream.clone();
        let sent = tokio::task::spawn_blocking(move || -> Result<SentFigures, ControlError> {
            let started = std::time::Instant::now();
            let fail = |why: String| migration_failed(id, why);
            // Memory an on-demand restore has not loaded yet is not the session's to send.
            load.map_or(Ok(()), |l| l.wait_over(&bounds))
                .map_err(|e| to_wire(e, Operation::Migration, id, Path::new("")))?;
            let addr = std::net::ToSocketAddrs::to_socket_addrs(to.as_str())
                .and_then(|mut addrs| addrs.next().ok_or_else(|| std::io::Error::other("no address")))
                .map_err(|e| fail(format!("resolving {to}: {e}")))?;
            let lanes = request.connections.clamp(1, phos_checkpoint::migrate::MAX_LANES);
            let connect = || -> std::io::Result<std::net::TcpStream> {
                let stream = std::net::TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT)?;
                // A target that stops reading or answering must not hold the session for ever.
                stream.set_write_timeout(Some(MIGRATION_WAIT))?;
                stream.set_read_timeout(Some(request.answer_timeout))?;
                stream.set_nodelay(true)?;
                Ok(stream)
            };
            let streams = (0..lanes)
                .map(|_| connect())
                .collect::<std::io::Result<Vec<_>>>()
                .map_err(|e| fail(format!("connecting to {to}: {e}")))?;
            let mut sender = phos_checkpoint::migrate::MigrationSender::start(streams, &request.key)
                .map_err(|e| fail(format!("starting the stream to {to}: {e}")))?;
            let meta = meta_of(request.identity);
            let (summary, passes) =
                session.migrate_out(&mut sender, meta, &progress, &bounds).map_err(|e| match e {
                    e @ (CrError::TimedOut { .. } | CrError::Abandoned { .. }) => {
                        to_wire(e, Operation::Migration, id, Path::new(""))
                    }
                    e => fail(e.to_string()),
                })?;
            Ok(SentFigures {
                passes,
                memory_bytes: summary.memory_bytes,
                sent_bytes: sender.sent_bytes,
                held_ms: summary.held_ms,
                total_ms: started.elapsed().as_secs_f64() * 1e3,
            })
        })
        .await
        .map_err(|e| migration_failed(id, format!("migration task: {e}")))?;
        drop(running);
        match &sent {
            Ok(f) => tracing::info!(
                session = id,
                "sent to {}: {} bytes of memory in {} passes ({} bytes sent), {:.1} ms; calls held {:.1} ms at the end",
                request.stream,
                f.memory_bytes,
                f.passes.len(),
                f.sent_bytes,
                f.total_ms,
                f.held_ms
            ),
            Err(e) => tracing::warn!(session = id, "migration to {} given up: {e}", request.stream),
        }
        sent
    }

    async fn thaw(self, _: Context) {
        if let Some(s) = self.slot.get() {
            tracing::info!(session = s.id, "the migration was given up: serving the session again");
            s.thaw();
        }
    }
}

impl ServerCtl {
    /// Accept the migration stream of session `session` on `listener` (its source presents
    /// `key`), restore it on demand, and answer the source: the session is this server's.
    fn take_migration(
        &self,
        listener: std::net::TcpListener,
        session: u64,
        device: Option<i32>,
        key: &[u8; 16],
    ) -> Result<RestoreSummary, ControlError> {
        let fail = |why: String| migration_failed(session, why);
        let running = Running::detached(self);
        let deadline = std::time::Instant::now() + MIGRATION_WAIT;
        listener.set_nonblocking(true).map_err(|e| fail(format!("the migration listener: {e}")))?;
        // The stream's lanes, each a connection that opens with its number: in their order.
        let mut lanes: Vec<Option<std::net::TcpStream>> = Vec::new();
        while lanes.is_empty() || lanes.iter().any(Option::is_none) {
            match listener.accept() {
                Ok((mut s, from)) => {
                    s.set_nonblocking(false)
                        .and_then(|_| s.set_read_timeout(Some(MIGRATION_WAIT)))
                        .map_err(|e| fail(format!("the migration connection from {from}: {e}")))?;
                    let (lane, of) = phos_checkpoint::migrate::open_lane(&mut s, key)
                        .map_err(|e| fail(format!("the migration connection from {from}: {e}")))?;
                    if lanes.is_empty() {
                        tracing::info!(session, "receiving a migration from {from} over {of} connection(s)");
                        lanes.resize_with(of as usize, || None);
                    }
                    let count = lanes.len();
                    match lanes.get_mut(lane as usize) {
                        Some(slot @ None) if of as usize == count => *slot = Some(s),
                        _ => {
                            return Err(fail(format!(
                                "connection {lane} of {of} from {from} does not fit the migration's {} connections",
                                count
                            )));
                        }
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if std::time::Instant::now() >= deadline || running.cancel.is_cancelled() {
                        let came = lanes.iter().flatten().count();
                        return Err(fail(format!("its source never connected ({came} of its connections came)")));
                    }
                    std::thread::sleep(std::time::Duration::from_millis(5));
                }
                Err(e) => return Err(fail(format!("accepting the migration stream: {e}"))),
            }
        }
        drop(listener);
        let lanes: Vec<std::net::TcpStream> = lanes.into_iter().flatten().collect();
        // No more than the session's device range can hold (its module variables aside, which
        // are small): a source cannot make this server hold more host memory than that.
        let limits =
            phos_checkpoint::migrate::ReceiveLimits { max_bytes: self.factory.device_size.saturating_add(1 << 30) };
        // A lane that fails ends the reads of the others (they may wait on a source that
        // stopped sending to them); lane 0 still answers the source.
        let stop_reading = || {
            for lane in &lanes {
                let _ = lane.shutdown(std::net::Shutdown::Read);
            }
        };
        let image = {
            let mut readers: Vec<_> = lanes.iter().map(|l| std::io::BufReader::with_capacity(1 << 20, l)).collect();
            phos_checkpoint::migrate::receive(&mut readers, limits, &self.progress, self.migrate_in_pace, &stop_reading)
        };
        let mut stream = &lanes[0];
        // The restore proper: from the manifest's arrival, with the source holding the session.
        let start = std::time::Instant::now();
        let restored = image.map_err(|e| fail(format!("receiving: {e}"))).and_then(|image| {
            if image.manifest.session.id != session {
                return Err(fail(format!("the stream brings session {}, not {session}", image.manifest.session.id)));
            }
            Session::restore_on_demand_from(
                &image.manifest,
                image.memory.clone(),
                start,
                &self.factory,
                device,
                &self.progress,
                &running.cancel,
                self.load_pace,
            )
            .map_err(|e| fail(format!("restoring: {e}")))
        });
        let (restored, summary, load) = match restored {
            Ok((s, _, summary, load)) => (s, summary, load),
            Err(e) => {
                let _ = phos_checkpoint::migrate::answer(&mut stream, Err(e.to_string()));
                return Err(e);
            }
        };
        *self.load.lock() = Some(load);
        self.slot.set(restored).map_err(|_| self.has_session())?;
        phos_checkpoint::migrate::answer(&mut stream, Ok(()))
            .map_err(|e| fail(format!("telling the source the session is here: {e}")))?;
        tracing::info!(
            session,
            "migrated in: {} records, {} bytes of memory, served after {:.1} ms",
            summary.records,
            summary.memory_bytes,
            summary.total_ms
        );
        Ok(summary)
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
