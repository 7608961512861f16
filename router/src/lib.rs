//! The Phos router: the one place all guest traffic crosses.
//!
//! A guest process opens channels (one per calling thread) to the router's socket. The router
//! identifies the tenant from the connection (Unix peer credentials), starts one API server
//! process per guest process (its *session*), and carries every frame between the guest and
//! that server. What each call costs comes from the spec's cost table ([`costs`]); the router
//! itself knows nothing about CUDA. A tenant can only ever reach its own session: a channel
//! joins a session only with that session's secret token and from the same tenant.
//!
//! The router also runs the management service ([`control`], for `phosctl`): it lists
//! sessions, checkpoints them (through their servers), and restores them from images into
//! new servers, taken from a pool of servers started ahead of need when there is one. A
//! session checkpointed with `stop` is *suspended*: its guest's channels wait for the
//! restore and then carry on with the restored server.

pub mod control;
pub mod session;
pub mod usage;

/// The spec-generated cost table: `costs::charges(function, payload, &mut out)`.
#[allow(clippy::all, unused_parens)]
pub mod costs {
    include!(concat!(env!("OUT_DIR"), "/cudart_costs.rs"));
}

use std::collections::HashMap;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use phos_protocol::cudart;
use phos_protocol::frame::{FrameHeader, FrameKind};
use phos_protocol::handshake::{Attach, Hello, Welcome};
use phos_protocol::transport::{read_frame, write_frame};

pub use session::SessionEntry;
use session::{ServerProcess, ServerStart, State};

/// How the router runs.
#[derive(Debug, Clone)]
pub struct RouterConfig {
    /// Socket guests connect to (the management service listens on this path plus `.ctl`).
    pub listen: PathBuf,
    /// Directory for the API servers' sockets (made private to the router's user).
    pub runtime_dir: PathBuf,
    /// The `phos-api-server` executable.
    pub server_bin: PathBuf,
    /// Arguments for every server (`--backend emu`, ...).
    pub server_args: Vec<String>,
    /// Largest frame payload carried.
    pub max_payload: u64,
    /// How long a session with no open channel is kept for its process to come back.
    pub linger: Duration,
    /// Where API servers write their logs: a directory gets one `session-N.log` per
    /// session; `None` leaves them on the router's standard error.
    pub server_log_dir: Option<PathBuf>,
    /// Servers kept started ahead of need (their backends and contexts ready), so that new
    /// sessions and restores do not wait for a process and a CUDA context.
    pub pool_size: usize,
    /// How long a channel of a suspended session waits for its restore.
    pub reconnect_wait: Duration,
    /// How long a suspended session is kept for a restore.
    pub suspended_for: Duration,
}

impl RouterConfig {
    /// A configuration with the defaults for everything but the paths and the server.
    pub fn new(listen: PathBuf, runtime_dir: PathBuf, server_bin: PathBuf, server_args: Vec<String>) -> Self {
        RouterConfig {
            listen,
            runtime_dir,
            server_bin,
            server_args,
            max_payload: phos_protocol::DEFAULT_MAX_PAYLOAD,
            linger: Duration::from_secs(30),
            server_log_dir: None,
            pool_size: 0,
            reconnect_wait: Duration::from_secs(120),
            suspended_for: Duration::from_secs(3600),
        }
    }
}

/// Who a connection belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Tenant {
    pub uid: u32,
}

impl std::fmt::Display for Tenant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "uid:{}", self.uid)
    }
}

impl Tenant {
    /// Parse the `uid:N` form images record.
    pub fn parse(s: &str) -> Option<Tenant> {
        s.strip_prefix("uid:")?.parse().ok().map(|uid| Tenant { uid })
    }
}

/// The peer of a Unix socket: (tenant, pid).
pub fn peer_credentials(stream: &UnixStream) -> io::Result<(Tenant, u32)> {
    use std::os::fd::AsRawFd;
    let mut cred = libc::ucred { pid: 0, uid: 0, gid: 0 };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    let r = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            &mut cred as *mut libc::ucred as *mut libc::c_void,
            &mut len,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((Tenant { uid: cred.uid }, cred.pid as u32))
}

pub struct Router {
    config: RouterConfig,
    sessions: Mutex<HashMap<u64, Arc<SessionEntry>>>,
    next_session: AtomicU64,
    stopping: AtomicBool,
    pool: Mutex<Vec<ServerProcess>>,
    next_pooled: AtomicU64,
    /// Management sockets of servers restoring a session, by session: progress is asked there
    /// until the session has its server again.
    restoring: Mutex<HashMap<u64, PathBuf>>,
}

/// Handshake frames are small; anything larger is refused before it is read.
const MAX_HANDSHAKE: u64 = 64 << 10;

fn refuse(stream: &mut UnixStream, reason: &str) {
    let mut h = FrameHeader::new(FrameKind::Refused);
    h.payload_len = reason.len() as u64;
    let _ = write_frame(stream, &h, &[reason.as_bytes()]);
}

impl Router {
    pub fn new(config: RouterConfig) -> Arc<Self> {
        Arc::new(Router {
            config,
            sessions: Mutex::new(HashMap::new()),
            next_session: AtomicU64::new(1),
            stopping: AtomicBool::new(false),
            pool: Mutex::new(Vec::new()),
            next_pooled: AtomicU64::new(1),
            restoring: Mutex::new(HashMap::new()),
        })
    }

    pub fn config(&self) -> &RouterConfig {
        &self.config
    }

    /// Bind the guest socket (replacing a stale one) and prepare the runtime directory.
    pub fn bind(&self) -> io::Result<UnixListener> {
        std::fs::create_dir_all(&self.config.runtime_dir)?;
        std::fs::set_permissions(&self.config.runtime_dir, std::fs::Permissions::from_mode(0o700))?;
        if let Some(dir) = self.config.listen.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let _ = std::fs::remove_file(&self.config.listen);
        UnixListener::bind(&self.config.listen)
    }

    /// Serve guests (and the management service) until [`stop`](Router::stop).
    pub fn serve(self: &Arc<Self>, listener: UnixListener) {
        let me = self.clone();
        std::thread::Builder::new()
            .name("phos-reaper".into())
            .spawn(move || me.housekeeping_loop())
            .expect("spawning the session reaper");
        let ctl = control::RouterCtl { router: self.clone() };
        if let Err(e) =
            phos_control::spawn_service_thread(phos_control::control_path(&self.config.listen), ctl.into_service())
        {
            tracing::error!("management service: {e}");
        }
        for conn in listener.incoming() {
            if self.stopping.load(Ordering::Relaxed) {
                break;
            }
            match conn {
                Ok(stream) => {
                    let me = self.clone();
                    std::thread::Builder::new()
                        .name("phos-route".into())
                        .spawn(move || me.handle_guest(stream))
                        .expect("spawning a channel thread");
                }
                Err(e) => {
                    tracing::error!("accept: {e}");
                    break;
                }
            }
        }
    }

    /// End every session and stop accepting.
    pub fn stop(&self) {
        self.stopping.store(true, Ordering::Relaxed);
        // Wake the accept loop.
        let _ = UnixStream::connect(&self.config.listen);
        let sessions: Vec<_> = self.sessions.lock().unwrap().drain().map(|(_, s)| s).collect();
        for s in sessions {
            s.end();
        }
        for p in self.pool.lock().unwrap().drain(..) {
            p.end();
        }
        let _ = std::fs::remove_file(phos_control::control_path(&self.config.listen));
    }

    /// Sessions alive now.
    pub fn sessions(&self) -> Vec<Arc<SessionEntry>> {
        let mut v: Vec<_> = self.sessions.lock().unwrap().values().cloned().collect();
        v.sort_by_key(|s| s.id);
        v
    }

    pub fn session(&self, id: u64) -> Option<Arc<SessionEntry>> {
        self.sessions.lock().unwrap().get(&id).cloned()
    }

    /// End finished sessions and keep the pool full.
    fn housekeeping_loop(self: Arc<Self>) {
        while !self.stopping.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(200));
            let ended: Vec<Arc<SessionEntry>> = {
                let mut sessions = self.sessions.lock().unwrap();
                let done: Vec<u64> = sessions
                    .values()
                    .filter(|s| s.is_finished(self.config.linger, self.config.suspended_for))
                    .map(|s| s.id)
                    .collect();
                done.into_iter().filter_map(|id| sessions.remove(&id)).collect()
            };
            for s in ended {
                tracing::info!(session = s.id, tenant = %s.tenant, "session ended ({} calls)", s.usage.calls());
                s.end();
            }
            self.fill_pool();
        }
    }

    fn fill_pool(&self) {
        self.pool.lock().unwrap().retain_mut(|p| !p.has_exited());
        while self.pool.lock().unwrap().len() < self.config.pool_size && !self.stopping.load(Ordering::Relaxed) {
            let n = self.next_pooled.fetch_add(1, Ordering::Relaxed);
            let socket = self.config.runtime_dir.join(format!("pool-{n}.sock"));
            match ServerProcess::spawn(&self.config, socket, &format!("pool-{n}"), ServerStart::Pooled) {
                Ok(p) => self.pool.lock().unwrap().push(p),
                Err(e) => {
                    tracing::warn!("cannot start a pooled API server: {e}");
                    break;
                }
            }
        }
    }

    fn take_pooled(&self) -> Option<ServerProcess> {
        let mut pool = self.pool.lock().unwrap();
        while let Some(mut p) = pool.pop() {
            if !p.has_exited() {
                return Some(p);
            }
        }
        None
    }

    fn handle_guest(self: Arc<Self>, mut guest: UnixStream) {
        let (tenant, pid) = match peer_credentials(&guest) {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!("cannot identify a guest connection: {e}");
                return refuse(&mut guest, "cannot identify the connection's owner");
            }
        };
        let mut payload = Vec::new();
        let hello = match read_frame(&mut guest, &mut payload, MAX_HANDSHAKE) {
            Ok(h) if h.kind == FrameKind::Hello => phos_protocol::decode::<Hello>(&payload).map_err(|e| e.to_string()),
            Ok(h) => Err(format!("expected Hello, got {:?}", h.kind)),
            Err(e) => Err(e.to_string()),
        };
        let hello = match hello {
            Ok(h) => h,
            Err(e) => {
                tracing::warn!(%tenant, pid, "bad handshake: {e}");
                return refuse(&mut guest, &format!("bad handshake: {e}"));
            }
        };
        if hello.spec_hash != cudart::SPEC_HASH {
            tracing::warn!(%tenant, pid, "guest built from another spec ({:016x})", hello.spec_hash);
            return refuse(&mut guest, "the guest library was built from another version of the API spec");
        }
        let session = match hello.token {
            None => match self.start_session(&tenant, pid, &hello) {
                Ok(s) => s,
                Err(e) => {
                    tracing::error!(%tenant, pid, "cannot start an API server: {e}");
                    return refuse(&mut guest, &format!("cannot start an API server: {e}"));
                }
            },
            Some(token) => {
                let found = self.sessions.lock().unwrap().values().find(|s| s.token_matches(&token)).cloned();
                match found {
                    Some(s) if s.tenant == tenant => s,
                    Some(s) => {
                        tracing::warn!(%tenant, pid, session = s.id, "tenant presented another tenant's session token");
                        return refuse(&mut guest, "unknown session");
                    }
                    None => {
                        tracing::warn!(%tenant, pid, "unknown session token");
                        return refuse(&mut guest, "unknown session");
                    }
                }
            }
        };
        // A suspended session's channels wait here for its restore.
        let Some(socket) = session.server_socket(self.config.reconnect_wait) else {
            tracing::warn!(session = session.id, "session has no server (not restored in time)");
            return refuse(&mut guest, "the session is suspended and was not restored in time");
        };
        if let Err(e) = self.connect_channel(&session, &socket, guest, &hello) {
            tracing::warn!(session = session.id, "channel failed: {e}");
        }
    }

    fn start_session(&self, tenant: &Tenant, pid: u32, hello: &Hello) -> io::Result<Arc<SessionEntry>> {
        let id = self.next_session.fetch_add(1, Ordering::Relaxed);
        let server = match self.take_pooled() {
            Some(p) => {
                let ctl = phos_control::control_path(&p.socket);
                let started = phos_control::block_on(async move {
                    let client = phos_control::server_client(&ctl).await?;
                    client
                        .start(tarpc::context::current(), id)
                        .await
                        .map_err(io::Error::other)?
                        .map_err(io::Error::other)
                });
                match started.and_then(|r| r) {
                    Ok(()) => p,
                    Err(e) => {
                        tracing::warn!("a pooled server refused the session ({e}); starting one");
                        p.end();
                        self.spawn_server(id, ServerStart::Fresh(id))?
                    }
                }
            }
            None => self.spawn_server(id, ServerStart::Fresh(id))?,
        };
        let entry = Arc::new(SessionEntry::new(
            id,
            tenant.clone(),
            pid,
            hello.program.clone(),
            hello.abi_major,
            session::random_token()?,
            0,
            Some(server),
        ));
        self.sessions.lock().unwrap().insert(id, entry.clone());
        tracing::info!(session = id, %tenant, pid, program = %hello.program, abi = hello.abi_major, "session started");
        Ok(entry)
    }

    fn spawn_server(&self, id: u64, start: ServerStart<'_>) -> io::Result<ServerProcess> {
        self.spawn_server_at(self.server_socket(id), id, start)
    }

    /// A fresh channel socket path for a server of session `id`.
    fn server_socket(&self, id: u64) -> PathBuf {
        self.config.runtime_dir.join(format!("session-{id}-{}.sock", self.next_pooled.fetch_add(1, Ordering::Relaxed)))
    }

    fn spawn_server_at(&self, socket: PathBuf, id: u64, start: ServerStart<'_>) -> io::Result<ServerProcess> {
        ServerProcess::spawn(&self.config, socket, &format!("session-{id}"), start)
    }

    /// The management socket of the server restoring `session`, while it does.
    pub fn restoring(&self, session: u64) -> Option<PathBuf> {
        self.restoring.lock().unwrap().get(&session).cloned()
    }

    /// Restore a session from an image into a new server (from the pool when there is one).
    /// Returns the session, whether the server was pooled, and what the server reported.
    pub fn restore(
        &self,
        dir: &Path,
        device: Option<i32>,
    ) -> Result<(Arc<SessionEntry>, bool, Option<phos_control::RestoreSummary>), String> {
        let image = phos_checkpoint::Image::open(dir).map_err(|e| e.to_string())?;
        let meta = image.manifest.session.clone();
        drop(image);
        let existing = self.session(meta.id);
        if let Some(s) = &existing
            && s.state() == State::Active
        {
            return Err(format!("session {} is running; checkpoint it with --stop before restoring it", meta.id));
        }
        let tenant =
            Tenant::parse(&meta.tenant).ok_or_else(|| format!("the image names no tenant ({:?})", meta.tenant))?;
        // Whatever way the restore ends, its progress stops being asked for.
        struct Restoring<'a>(&'a Router, u64);
        impl Drop for Restoring<'_> {
            fn drop(&mut self) {
                self.0.restoring.lock().unwrap().remove(&self.1);
            }
        }
        let _restoring = Restoring(self, meta.id);
        let (server, pooled, report) = match self.take_pooled() {
            Some(p) => {
                let ctl = phos_control::control_path(&p.socket);
                self.restoring.lock().unwrap().insert(meta.id, ctl.clone());
                let d = dir.to_path_buf();
                let r = phos_control::block_on(async move {
                    let client = phos_control::server_client(&ctl).await.map_err(|e| e.to_string())?;
                    client.restore(phos_control::long_context(), d, device).await.map_err(|e| e.to_string())?
                })
                .map_err(|e| e.to_string())?;
                match r {
                    Ok(report) => (p, true, Some(report)),
                    Err(e) => {
                        p.end();
                        return Err(e);
                    }
                }
            }
            None => {
                let socket = self.server_socket(meta.id);
                self.restoring.lock().unwrap().insert(meta.id, phos_control::control_path(&socket));
                let p = self
                    .spawn_server_at(socket, meta.id, ServerStart::Restore { dir, device })
                    .map_err(|e| e.to_string())?;
                let ctl = phos_control::control_path(&p.socket);
                let report = phos_control::block_on(async move {
                    let client = phos_control::server_client(&ctl).await.ok()?;
                    client.last_restore(tarpc::context::current()).await.ok().flatten()
                })
                .ok()
                .flatten();
                (p, false, report)
            }
        };
        let entry = match existing {
            Some(e) if e.state() != State::Ended => {
                e.resume(server);
                e
            }
            _ => {
                let e = Arc::new(SessionEntry::new(
                    meta.id,
                    tenant,
                    0,
                    meta.program.clone(),
                    meta.abi_major,
                    meta.token,
                    meta.epoch + 1,
                    Some(server),
                ));
                self.sessions.lock().unwrap().insert(meta.id, e.clone());
                self.next_session.fetch_max(meta.id + 1, Ordering::Relaxed);
                e
            }
        };
        tracing::info!(session = meta.id, pooled, "session restored from {}", dir.display());
        Ok((entry, pooled, report))
    }

    /// Attach a guest channel to its session's server and carry frames both ways.
    fn connect_channel(
        &self,
        session: &Arc<SessionEntry>,
        socket: &Path,
        mut guest: UnixStream,
        hello: &Hello,
    ) -> io::Result<()> {
        let mut server = UnixStream::connect(socket)?;
        let attach = Attach {
            spec_hash: hello.spec_hash,
            session: session.id,
            tenant: session.tenant.to_string(),
            abi_major: hello.abi_major,
        };
        let a = phos_protocol::encode(&attach);
        let mut h = FrameHeader::new(FrameKind::Hello);
        h.session = session.id;
        h.payload_len = a.len() as u64;
        write_frame(&mut server, &h, &[&a])?;
        let mut payload = Vec::new();
        let reply = read_frame(&mut server, &mut payload, MAX_HANDSHAKE).map_err(io::Error::other)?;
        if reply.kind != FrameKind::Welcome {
            refuse(&mut guest, &String::from_utf8_lossy(&payload));
            return Err(io::Error::other(format!("server answered {:?}", reply.kind)));
        }
        let mut welcome: Welcome = phos_protocol::decode(&payload).map_err(io::Error::other)?;
        welcome.token = session.token();
        welcome.epoch = session.epoch.load(Ordering::Relaxed);
        let w = phos_protocol::encode(&welcome);
        let mut h = FrameHeader::new(FrameKind::Welcome);
        h.session = session.id;
        h.payload_len = w.len() as u64;
        write_frame(&mut guest, &h, &[&w])?;

        session.channel_opened();
        let _close = session::ChannelGuard(session.clone());
        let max = self.config.max_payload;
        // Server -> guest on a thread of its own; guest -> server here.
        let (mut server_r, mut guest_w) = (server.try_clone()?, guest.try_clone()?);
        let back = std::thread::Builder::new().name("phos-route-back".into()).spawn(move || {
            let mut buf = Vec::new();
            while let Ok(h) = read_frame(&mut server_r, &mut buf, u64::MAX) {
                if write_frame(&mut guest_w, &h, &[&buf]).is_err() {
                    break;
                }
            }
            let _ = guest_w.shutdown(std::net::Shutdown::Both);
        })?;
        let mut buf = Vec::new();
        let mut charges = Vec::new();
        loop {
            let h = match read_frame(&mut guest, &mut buf, max) {
                Ok(h) => h,
                Err(phos_protocol::transport::TransportError::Closed) => break,
                Err(e) => {
                    tracing::warn!(session = session.id, "malformed frame from the guest: {e}");
                    refuse(&mut guest, &format!("malformed frame: {e}"));
                    break;
                }
            };
            if h.kind == FrameKind::Call
                && let Some(f) = cudart::FunctionId::from_u32(h.function)
            {
                charges.clear();
                let _ = costs::charges(f, &buf, &mut charges);
                session.usage.record(f, &charges);
            }
            if write_frame(&mut server, &h, &[&buf]).is_err() {
                break;
            }
        }
        let _ = server.shutdown(std::net::Shutdown::Both);
        let _ = back.join();
        Ok(())
    }

    /// Checkpoint a session through its server; with `stop`, the session is suspended and its
    /// server ended afterwards.
    pub fn checkpoint(
        &self,
        id: u64,
        request: phos_control::CheckpointRequest,
    ) -> Result<phos_control::CheckpointSummary, String> {
        let session = self.session(id).ok_or_else(|| format!("no session {id}"))?;
        let ctl = session.control_socket().ok_or_else(|| format!("session {id} has no server (suspended?)"))?;
        let identity = phos_control::SessionIdentity {
            token: session.token(),
            tenant: session.tenant.to_string(),
            program: session.program.clone(),
            abi_major: session.abi_major,
            epoch: session.epoch.load(Ordering::Relaxed),
        };
        let stop = request.stop;
        let started = Instant::now();
        let summary = phos_control::block_on(async move {
            let client = phos_control::server_client(&ctl).await.map_err(|e| e.to_string())?;
            client.checkpoint(phos_control::long_context(), request, identity).await.map_err(|e| e.to_string())?
        })
        .map_err(|e| e.to_string())??;
        if stop {
            session.suspend();
        }
        tracing::info!(session = id, stop, "checkpoint written in {:.1} ms", started.elapsed().as_secs_f64() * 1e3);
        Ok(summary)
    }
}
