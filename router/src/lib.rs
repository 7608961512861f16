//! The Phos router: the one place all guest traffic crosses.
//!
//! A guest process opens channels (one per calling thread) to the router's socket, or to a
//! tenant's own socket. The router identifies the tenant ([`tenants`]: peer credentials or
//! the socket), starts one API server process per guest process (its *session*), and
//! carries every frame between the guest and that server. Before a call is forwarded it is
//! decided ([`admission`]): what it costs comes from the specs' cost tables ([`costs`]), quotas
//! are enforced, and the operator's eBPF policies are asked (`phos_policy`); the servers'
//! usage reports keep the per-tenant books. The router itself knows nothing about CUDA. A
//! tenant can only ever reach its own sessions: a channel joins a session only with that
//! session's secret token and from the same tenant.
//!
//! The router also runs the management service ([`control`], for `phosctl`): it lists
//! sessions, checkpoints them (through their servers), and restores them from images into
//! new servers, taken from a pool of servers started ahead of need when there is one. A
//! session checkpointed with `stop` is *suspended*: its guest's channels wait for the
//! restore and then carry on with the restored server.

pub mod admission;
pub mod config;
pub mod contention;
pub mod control;
pub mod fleet;
pub mod limits;
pub mod metrics;
mod migration;
pub mod session;
pub mod tenants;
pub mod usage;

/// The spec-generated cost tables, one per API: `costs::charges(function, payload, &mut out)`
/// for a function of any API.
#[allow(clippy::all, unused_parens)]
pub mod costs {
    include!(concat!(env!("OUT_DIR"), "/costs.rs"));
}

use std::collections::HashMap;
use std::collections::VecDeque;
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use phos_control::{ControlError, ImageRefusal, Operation};
use phos_policy::engine::PolicySet;
use phos_protocol::apis::Function;
use phos_protocol::frame::{FrameHeader, FrameKind};
use phos_protocol::handshake::{Attach, Hello, TransportKind, UsageReport, Welcome, check_apis, decode_hello};
use phos_protocol::shm::{SharedFiles, ShmTransport};
use phos_protocol::text::printable;
use phos_protocol::transport::{TcpTransport, Transport, UnixTransport, read_frame, write_frame};

pub use migration::MigrationFigures;
pub use session::SessionEntry;
use session::{ServerProcess, ServerStart, State};
pub use tenants::{Tenant, TenantConfig, Tenants};

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
    /// Tenants the operator configured (names, users, sockets, shares, quotas).
    pub tenants: Vec<TenantConfig>,
    /// Instructions a policy may run per call.
    pub policy_budget: u64,
    /// Where to serve Prometheus metrics (`host:port`), if anywhere.
    pub metrics: Option<std::net::SocketAddr>,
    /// Whether channels may move to shared-memory rings (guests that ask for them).
    pub shared_memory: bool,
    /// Also accept guests over TCP here (tenants identify themselves with a token).
    pub listen_tcp: Option<std::net::SocketAddr>,
    /// Each direction's ring, per channel.
    pub ring_bytes: usize,
    /// Each of the two slots of a channel's staging region (large copies).
    pub staging_slot_bytes: usize,
    /// What one tenant may hold of the router ([`limits`]).
    pub limits: limits::Limits,
    /// Objects of each kind one session may hold (passed to every API server).
    pub session_limits: phos_protocol::limits::SessionLimits,
    /// Serve the management service over TCP here too, for other routers (migrations to
    /// this one) and remote operators: only to peers that know `peer_secret`.
    pub peer_listen: Option<std::net::SocketAddr>,
    /// The secret routers authenticate each other with (over TCP; `phosctl serve
    /// --peer-secret-file`). Needed to listen for peers and to migrate to `tcp:` routers.
    pub peer_secret: Option<phos_control::peer::Secret>,
    /// What fleet listings call this router (default: `unix:` and its socket).
    pub name: Option<String>,
    /// The other routers of its fleet (`phosctl sessions --all` lists theirs too).
    pub peers: Vec<fleet::Peer>,
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
            tenants: Vec::new(),
            policy_budget: phos_policy::engine::DEFAULT_BUDGET,
            metrics: None,
            shared_memory: true,
            listen_tcp: None,
            ring_bytes: phos_protocol::shm::DEFAULT_RING_BYTES,
            staging_slot_bytes: phos_protocol::staging::DEFAULT_SLOT_BYTES,
            limits: limits::Limits::default(),
            session_limits: Default::default(),
            peer_listen: None,
            peer_secret: None,
            name: None,
            peers: Vec::new(),
        }
    }
}

/// Whether the process at the other end of a Unix connection (`peer`, a pid of the router's
/// pid namespace) is the guest process that names itself `guest` in its `Hello` (a pid of its
/// own namespace). It is not when the connection is carried for a guest elsewhere: a VM's
/// `phos-vmm-device` or `phosctl vm-relay`, whose life says nothing of the guest's.
fn peer_is_the_guest(peer: u32, guest: u32) -> bool {
    if peer == guest {
        return true;
    }
    // A guest in a container: its pid in its own namespace is the last of `NSpid`.
    std::fs::read_to_string(format!("/proc/{peer}/status")).is_ok_and(|status| {
        status
            .lines()
            .find_map(|l| l.strip_prefix("NSpid:"))
            .and_then(|ids| ids.split_whitespace().last())
            .is_some_and(|inner| inner.parse() == Ok(guest))
    })
}

/// The peer of a Unix socket: (uid, pid).
pub fn peer_credentials(stream: &UnixStream) -> io::Result<(u32, u32)> {
    use std::os::fd::AsRawFd;
    let mut cred = libc::ucred { pid: 0, uid: 0, gid: 0 };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: SO_PEERCRED writes at most `len` bytes (one ucred) into `cred`, and the length
    // into `len`, both on this stack.
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
    Ok((cred.uid, cred.pid as u32))
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
    /// The last word on the memory load of on-demand restores of sessions that have ended
    /// since (the most recent [`ENDED_LOADS_KEPT`]), for `phosctl restore` still following one.
    ended_loads: Mutex<VecDeque<phos_control::LoadReport>>,
    pub tenants: Tenants,
    pub policies: PolicySet,
    /// Where the TCP listener ended up bound (port 0 in the configuration picks one).
    tcp_bound: Mutex<Option<std::net::SocketAddr>>,
    /// Connections still in their handshake.
    pending: Arc<limits::Pending>,
    /// A file descriptor kept in reserve: when the process has none left, closing it lets
    /// an accept loop take one waiting connection and close it, rather than spin on it.
    spare_fd: Mutex<Option<std::fs::File>>,
    /// Channels one tenant may have: the configured limit, or less where the router's file
    /// descriptors could not serve that many for two tenants.
    channels_per_tenant: AtomicU64,
    /// What the checkpoints taken through this router did, for the metrics.
    pub checkpoints: Mutex<CheckpointFigures>,
    /// Sessions that moved away and sessions arriving; migrations' figures.
    migrations: migration::Migrations,
    /// Where the peer listener ended up bound.
    peer_bound: Mutex<Option<std::net::SocketAddr>>,
}

/// Checkpoints so far and the last one's figures, by mode (`stop-the-world`,
/// `copy-on-write`).
#[derive(Default)]
pub struct CheckpointFigures {
    /// Mode -> (checkpoints taken, the last one's summary).
    pub by_mode: std::collections::BTreeMap<String, (u64, phos_control::CheckpointSummary)>,
    /// Concurrent checkpoints taken again stop-the-world.
    pub fallbacks: u64,
}

/// Handshake frames are small; anything larger is refused before it is read.
const MAX_HANDSHAKE: u64 = 64 << 10;

/// Longest program name kept (the guest's to choose; it is shown in logs and listings).
const MAX_PROGRAM_NAME: usize = 256;

/// Stack of a channel's threads: they run the frame loops and the policies' interpreter,
/// nothing deep; small stacks keep thousands of channels cheap in address space.
const CHANNEL_STACK: usize = 512 << 10;

/// File descriptors a channel takes in the router, as measured (tests/e2e/router_load.rs):
/// the guest and server sockets, each with a second handle for the other thread (three in
/// all on shared memory, whose writing half needs no socket of its own).
pub const FDS_PER_CHANNEL: u64 = 4;

/// How long an API server has to answer a channel's Attach.
const SERVER_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);

/// The error a guest gets for a connection refused by a limit or a shortage of the router's:
/// "all CUDA-capable devices are busy or unavailable".
const BUSY: i32 = phos_protocol::CudaError::DevicesUnavailable.0;

/// The error a guest gets for a connection the router cannot serve at all.
const NO_DEVICE: i32 = phos_protocol::CudaError::NoDevice.0;

/// The guest's report that something in its process does not go through Phos: the router
/// marks the session bypassed (and forwards the call, which the server logs and answers).
const BYPASS_REPORT: Function = Function::Cudart(phos_protocol::cudart::FunctionId::PhosReportBypass);

/// Send a refusal (the error its guest returns from the call that opened the channel, and
/// why) on a connection whose handshake did not finish.
fn refuse(stream: &mut impl io::Write, code: i32, reason: &str) {
    let mut h = FrameHeader::new(FrameKind::Refused);
    h.status = code;
    h.payload_len = reason.len() as u64;
    let _ = write_frame(stream, &h, &[reason.as_bytes()]);
}

/// Log a line a guest caused, at most [`GUEST_LINES`](phos_protocol::log_limit::GUEST_LINES)
/// allows for `key` (a tenant, or a peer not known yet).
macro_rules! guest_warn {
    ($key:expr, $($arg:tt)+) => {
        if let Some(dropped) = phos_protocol::log_limit::GUEST_LINES.admit($key) {
            if dropped > 0 {
                tracing::warn!(dropped, $($arg)+);
            } else {
                tracing::warn!($($arg)+);
            }
        }
    };
}

/// [`refuse`] from an accept loop, which must never wait for a guest to read.
fn refuse_now(guest: &mut GuestStream, code: i32, reason: &str) {
    let _ = match guest {
        GuestStream::Unix(s) => s.set_nonblocking(true),
        GuestStream::Tcp(s) => s.set_nonblocking(true),
    };
    refuse(guest, code, reason);
}

/// Receive the pinned arena a guest sends after its Hello, and check that it is one (the
/// server checks it again before mapping it). The socket's handshake deadline applies.
fn receive_host_arena(socket: &UnixStream) -> io::Result<OwnedFd> {
    let mut fds = phos_protocol::shm::recv_fds(socket)?;
    if fds.len() != 1 {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "expected one file"));
    }
    let fd = fds.pop().expect("one");
    phos_protocol::host_arena::checked_len(&fd)?;
    Ok(fd)
}

/// Why a connection's first frame is not a Hello the router can read.
#[derive(Debug, thiserror::Error)]
enum BadHello {
    #[error(transparent)]
    Frame(phos_protocol::transport::TransportError),
    #[error("expected Hello, got {0:?}")]
    NotHello(FrameKind),
    #[error(transparent)]
    Decode(phos_protocol::handshake::HelloError),
}

/// Who is at the other end of a connection, as far as the router knows before the Hello.
#[derive(Debug, Clone)]
enum Peer {
    /// A Unix socket: the tenant (from the socket or the peer's uid) and the process.
    Local { tenant: Tenant, pid: u32 },
    /// TCP: only the address; the Hello's token names the tenant.
    Remote(std::net::SocketAddr),
}

impl Peer {
    /// The key its log lines and its pending handshakes are counted under.
    fn key(&self) -> String {
        match self {
            Peer::Local { tenant, .. } => tenant.0.clone(),
            Peer::Remote(a) => format!("tcp:{}", a.ip()),
        }
    }
}

/// A program name as the router keeps it: at most [`MAX_PROGRAM_NAME`] characters. It is
/// the guest's to choose: everything that prints it escapes it
/// ([`printable`](phos_protocol::text::printable), or a log field's quoting).
fn program_name(raw: &str) -> String {
    match raw.char_indices().nth(MAX_PROGRAM_NAME) {
        Some((cut, _)) => format!("{}…", &raw[..cut]),
        None => raw.to_owned(),
    }
}

/// A guest's connection before its handshake is done: a Unix socket (this host: its channels
/// may move to shared memory) or TCP (another host).
enum GuestStream {
    Unix(UnixStream),
    Tcp(std::net::TcpStream),
}

impl GuestStream {
    fn is_remote(&self) -> bool {
        matches!(self, GuestStream::Tcp(_))
    }

    fn describe(&self) -> String {
        match self {
            GuestStream::Unix(_) => "unix".into(),
            GuestStream::Tcp(s) => s.peer_addr().map_or_else(|_| "tcp".into(), |a| format!("tcp:{a}")),
        }
    }
}

impl io::Read for GuestStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            GuestStream::Unix(s) => s.read(buf),
            GuestStream::Tcp(s) => s.read(buf),
        }
    }
}

impl io::Write for GuestStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            GuestStream::Unix(s) => s.write(buf),
            GuestStream::Tcp(s) => s.write(buf),
        }
    }

    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        match self {
            GuestStream::Unix(s) => s.write_vectored(bufs),
            GuestStream::Tcp(s) => s.write_vectored(bufs),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// [`refuse`] on a channel past its handshake.
fn refuse_on(t: &mut dyn Transport, reason: &str) {
    let mut h = FrameHeader::new(FrameKind::Refused);
    h.payload_len = reason.len() as u64;
    let _ = t.send(&h, &[reason.as_bytes()]);
}

impl Router {
    /// A router for `config`; refused when its tenant configuration is inconsistent.
    pub fn new(config: RouterConfig) -> Result<Arc<Self>, tenants::TenantConfigError> {
        let config_channels_per_tenant = config.limits.channels_per_tenant;
        let tenants = Tenants::new(config.tenants.clone())?.with_buffer_limit(config.limits.buffered_per_tenant);
        if config.limits.buffered_per_tenant < config.max_payload.min(u64::MAX / 2) {
            tracing::warn!(
                "[limits] buffered_per_tenant ({}) is below max_payload ({}): larger frames over sockets will fail",
                config.limits.buffered_per_tenant,
                config.max_payload
            );
        }
        let policies = PolicySet::new(config.policy_budget);
        Ok(Arc::new(Router {
            tenants,
            policies,
            config,
            sessions: Mutex::new(HashMap::new()),
            next_session: AtomicU64::new(1),
            stopping: AtomicBool::new(false),
            pool: Mutex::new(Vec::new()),
            next_pooled: AtomicU64::new(1),
            restoring: Mutex::new(HashMap::new()),
            ended_loads: Mutex::new(VecDeque::new()),
            tcp_bound: Mutex::new(None),
            pending: Arc::default(),
            spare_fd: Mutex::new(None),
            channels_per_tenant: AtomicU64::new(config_channels_per_tenant),
            checkpoints: Mutex::default(),
            migrations: Default::default(),
            peer_bound: Mutex::new(None),
        }))
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

    /// Serve guests (and the management service) until [`stop`](Router::stop). An error is
    /// the router's own (a listener that no longer works, no thread for its housekeeping):
    /// nothing a guest does ends it.
    pub fn serve(self: &Arc<Self>, listener: UnixListener) -> io::Result<()> {
        self.fit_channels_to_fds();
        *self.spare_fd.lock() = std::fs::File::open("/dev/null").ok();
        let me = self.clone();
        std::thread::Builder::new().name("phos-reaper".into()).spawn(move || me.housekeeping_loop())?;
        // The peer listener is bound before the management service answers: whoever finds
        // the router managed (an operator, a test) also finds it reachable by its peers.
        if let Some(addr) = self.config.peer_listen {
            let Some(secret) = self.config.peer_secret.clone() else {
                return Err(io::Error::other("a peer listener needs a shared secret (--peer-secret-file)"));
            };
            let me = self.clone();
            let ctl = move |gone| control::RouterCtl { router: me.clone(), gone }.into_service();
            let bound = phos_control::peer::spawn_tcp_service_thread(addr, secret, ctl)?;
            tracing::info!("peer routers and operators on tcp:{bound}");
            *self.peer_bound.lock() = Some(bound);
        }
        let me = self.clone();
        let ctl = move |gone| control::RouterCtl { router: me.clone(), gone }.into_service();
        if let Err(e) = phos_control::spawn_service_thread(phos_control::control_path(&self.config.listen), ctl) {
            tracing::error!("management service: {e}");
        }
        if let Some(addr) = self.config.metrics {
            match metrics::serve(self.clone(), addr) {
                Ok(bound) => tracing::info!("metrics on http://{bound}/metrics"),
                Err(e) => tracing::error!("metrics endpoint {addr}: {e}"),
            }
        }
        // Accept loops beside the main one; the first to fail for good ends `serve`.
        let (failed_tx, failed_rx) = std::sync::mpsc::channel::<io::Error>();
        // Each tenant with a socket of its own: every connection there is that tenant.
        for c in self.tenants.configs() {
            let Some(path) = &c.socket else { continue };
            let _ = std::fs::remove_file(path);
            match UnixListener::bind(path) {
                Ok(l) => {
                    let me = self.clone();
                    let tenant = Tenant(c.name.clone());
                    tracing::info!(%tenant, "tenant socket {}", path.display());
                    let failed = failed_tx.clone();
                    std::thread::Builder::new().name("phos-accept".into()).spawn(move || {
                        if let Err(e) = me.accept_unix(l, Some(tenant)) {
                            let _ = failed.send(e);
                            me.wake_accept_loops();
                        }
                    })?;
                }
                Err(e) => tracing::error!(tenant = %c.name, "cannot listen on {}: {e}", path.display()),
            }
        }
        if let Some(addr) = self.config.listen_tcp {
            match std::net::TcpListener::bind(addr) {
                Ok(l) => {
                    let bound = l.local_addr().ok();
                    tracing::info!("guests over TCP on {}", bound.map_or(addr.to_string(), |a| a.to_string()));
                    *self.tcp_bound.lock() = bound;
                    let me = self.clone();
                    let failed = failed_tx.clone();
                    std::thread::Builder::new().name("phos-accept-tcp".into()).spawn(move || {
                        if let Err(e) = me.accept_tcp(l) {
                            let _ = failed.send(e);
                            me.wake_accept_loops();
                        }
                    })?;
                }
                Err(e) => tracing::error!("cannot listen on tcp:{addr}: {e}"),
            }
        }
        let main = self.accept_unix(listener, None);
        match (main, failed_rx.try_recv()) {
            (Err(e), _) | (Ok(()), Ok(e)) => {
                tracing::error!("the router cannot accept guests any more: {e}");
                self.stop();
                Err(e)
            }
            (Ok(()), Err(_)) => Ok(()),
        }
    }

    /// Lower the channels one tenant may have to what the process's file descriptors allow
    /// for two such tenants, so that one tenant alone can never take them all.
    fn fit_channels_to_fds(&self) {
        let mut rl = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: getrlimit writes one rlimit struct, which `rl` is.
        if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) } != 0 {
            return;
        }
        let capacity = rl.rlim_cur.saturating_sub(64) / FDS_PER_CHANNEL;
        let configured = self.config.limits.channels_per_tenant;
        if capacity / 2 < configured {
            let fit = (capacity / 2).max(1);
            tracing::warn!(
                "{} file descriptors allow about {capacity} channels: each tenant may have {fit} (not {configured}); raise `ulimit -n` for more",
                rl.rlim_cur
            );
            self.channels_per_tenant.store(fit, Ordering::Relaxed);
        }
    }

    /// Where guests reach the router over TCP, once it listens there.
    pub fn tcp_addr(&self) -> Option<std::net::SocketAddr> {
        *self.tcp_bound.lock()
    }

    /// Where the peer listener is bound, if there is one.
    pub fn peer_addr(&self) -> Option<std::net::SocketAddr> {
        *self.peer_bound.lock()
    }

    /// What the migrations through this router did.
    pub fn migration_figures(&self) -> parking_lot::MutexGuard<'_, MigrationFigures> {
        self.migrations.figures.lock()
    }

    /// Connections in their handshake now.
    pub fn pending_handshakes(&self) -> u64 {
        self.pending.total()
    }

    fn stopping(&self) -> bool {
        self.stopping.load(Ordering::Relaxed)
    }

    /// Accept guests on a Unix `listener`; `tenant`: the tenant every connection there is.
    fn accept_unix(self: &Arc<Self>, listener: UnixListener, tenant: Option<Tenant>) -> io::Result<()> {
        use std::os::fd::AsRawFd;
        loop {
            let conn = listener.accept();
            if self.stopping() {
                return Ok(());
            }
            match conn {
                Ok((stream, _)) => self.admit_unix(stream, tenant.clone()),
                Err(e) => self.accept_failed(listener.as_raw_fd(), e)?,
            }
        }
    }

    fn accept_tcp(self: &Arc<Self>, listener: std::net::TcpListener) -> io::Result<()> {
        use std::os::fd::AsRawFd;
        loop {
            let conn = listener.accept();
            if self.stopping() {
                return Ok(());
            }
            match conn {
                Ok((stream, addr)) => {
                    let _ = stream.set_nodelay(true);
                    self.admit(GuestStream::Tcp(stream), Peer::Remote(addr));
                }
                Err(e) => self.accept_failed(listener.as_raw_fd(), e)?,
            }
        }
    }

    /// A Unix connection: who it is, then [`admit`](Self::admit).
    fn admit_unix(self: &Arc<Self>, stream: UnixStream, socket_tenant: Option<Tenant>) {
        let mut guest = GuestStream::Unix(stream);
        let GuestStream::Unix(s) = &guest else { unreachable!() };
        let peer = match peer_credentials(s) {
            Ok((uid, pid)) => Peer::Local { tenant: socket_tenant.unwrap_or_else(|| self.tenants.for_uid(uid)), pid },
            Err(e) => {
                guest_warn!("unidentified", "cannot identify a guest connection: {e}");
                return refuse_now(&mut guest, NO_DEVICE, "cannot identify the connection's owner");
            }
        };
        self.admit(guest, peer);
    }

    /// Give a new connection a thread for its handshake, if its tenant (or address) and the
    /// router have room for one more connection in its handshake.
    fn admit(self: &Arc<Self>, mut guest: GuestStream, peer: Peer) {
        let key = peer.key();
        let l = &self.config.limits;
        let Some(slot) = self.pending.enter(&key, l.pending_per_tenant, l.pending_total) else {
            self.limit_hit(&peer, limits::LimitKind::PendingHandshakes);
            guest_warn!(&key, peer = %key, "too many connections in their handshake: refused");
            return refuse_now(&mut guest, BUSY, "too many connections in their handshake; try again");
        };
        // The deadline for the whole handshake; lifted once the channel is carrying calls.
        let deadline = Some(l.handshake_timeout);
        let set = match &guest {
            GuestStream::Unix(s) => s.set_read_timeout(deadline).and_then(|_| s.set_write_timeout(deadline)),
            GuestStream::Tcp(s) => s.set_read_timeout(deadline).and_then(|_| s.set_write_timeout(deadline)),
        };
        if let Err(e) = set {
            guest_warn!(&key, "cannot set a handshake deadline: {e}");
            return;
        }
        let me = self.clone();
        let spawned = std::thread::Builder::new()
            .name("phos-route".into())
            .stack_size(CHANNEL_STACK)
            .spawn(move || me.handle_guest(guest, peer, slot));
        if let Err(e) = spawned {
            // The connection went with the closure: its guest sees it closed.
            self.resource_shortage(&key, &format!("no thread for a new connection: {e}"));
        }
    }

    /// A limit refused a connection of `peer`: counted for its tenant (when known).
    fn limit_hit(&self, peer: &Peer, kind: limits::LimitKind) {
        if let Peer::Local { tenant, .. } = peer {
            self.tenants.state(tenant).limit_hits.hit(kind);
        }
    }

    /// The router ran short of something a connection needed (threads, descriptors,
    /// memory, processes): logged, at most at the guest-line rate for the key.
    fn resource_shortage(&self, key: &str, what: &str) {
        if let Some(dropped) = phos_protocol::log_limit::GUEST_LINES.admit("router-resources") {
            tracing::error!(dropped, peer = %key, "router short of resources: {what}");
        }
    }

    /// An accept that failed: a shortage the loop waits out (a waiting connection is closed
    /// when the process has no descriptor left, so the loop does not spin on it), or an
    /// error of the listener itself, which ends the loop.
    fn accept_failed(&self, listener: std::os::fd::RawFd, e: io::Error) -> io::Result<()> {
        match e.raw_os_error() {
            Some(libc::EMFILE | libc::ENFILE) => {
                self.resource_shortage("accept", &format!("{e}: refusing connections until descriptors are free"));
                let mut spare = self.spare_fd.lock();
                // Only a connection that is waiting: an accept on an empty queue would block
                // and take the next guest that comes, once there is room for it.
                let mut pfd = libc::pollfd { fd: listener, events: libc::POLLIN, revents: 0 };
                // SAFETY: poll reads and writes the one pollfd it is given.
                let waiting = unsafe { libc::poll(&mut pfd, 1, 0) } == 1;
                if waiting && spare.take().is_some() {
                    // SAFETY: accept4 on a listening socket we own (only this thread accepts
                    // on it, and poll said a connection waits), without an address buffer;
                    // the descriptor it returns is ours and closed at once.
                    let fd = unsafe { libc::accept4(listener, std::ptr::null_mut(), std::ptr::null_mut(), 0) };
                    if fd >= 0 {
                        // SAFETY: `fd` was just returned by accept4 and is owned by nobody else.
                        unsafe { libc::close(fd) };
                    }
                }
                if spare.is_none() {
                    *spare = std::fs::File::open("/dev/null").ok();
                }
                drop(spare);
                std::thread::sleep(Duration::from_millis(10));
                Ok(())
            }
            Some(libc::ENOBUFS | libc::ENOMEM) => {
                self.resource_shortage("accept", &e.to_string());
                std::thread::sleep(Duration::from_millis(10));
                Ok(())
            }
            // The connection went away before it was accepted, or a signal: carry on.
            Some(libc::ECONNABORTED | libc::EINTR | libc::EPROTO | libc::EPERM | libc::EAGAIN) => Ok(()),
            // Network errors a TCP accept reports for the new connection, per accept(2).
            Some(
                libc::ENETDOWN
                | libc::ENOPROTOOPT
                | libc::EHOSTDOWN
                | libc::ENONET
                | libc::EHOSTUNREACH
                | libc::EOPNOTSUPP
                | libc::ENETUNREACH
                | libc::ETIMEDOUT,
            ) => Ok(()),
            _ => Err(e),
        }
    }

    /// Make every accept loop look at `stopping`.
    fn wake_accept_loops(&self) {
        let _ = UnixStream::connect(&self.config.listen);
        if let Some(a) = self.tcp_addr() {
            let _ = std::net::TcpStream::connect(a);
        }
        for c in self.tenants.configs() {
            if let Some(path) = &c.socket {
                let _ = UnixStream::connect(path);
            }
        }
    }

    /// End every session and stop accepting.
    pub fn stop(&self) {
        self.stopping.store(true, Ordering::Relaxed);
        self.wake_accept_loops();
        for c in self.tenants.configs() {
            if let Some(path) = &c.socket {
                let _ = std::fs::remove_file(path);
            }
        }
        let sessions: Vec<_> = self.sessions.lock().drain().map(|(_, s)| s).collect();
        for s in sessions {
            s.end();
        }
        for p in self.pool.lock().drain(..) {
            p.end();
        }
        let _ = std::fs::remove_file(phos_control::control_path(&self.config.listen));
    }

    /// Sessions alive now.
    pub fn sessions(&self) -> Vec<Arc<SessionEntry>> {
        let mut v: Vec<_> = self.sessions.lock().values().cloned().collect();
        v.sort_by_key(|s| s.id);
        v
    }

    pub fn session(&self, id: u64) -> Option<Arc<SessionEntry>> {
        self.sessions.lock().get(&id).cloned()
    }

    /// End finished sessions and keep the pool full.
    fn housekeeping_loop(self: Arc<Self>) {
        while !self.stopping.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(200));
            let ended: Vec<Arc<SessionEntry>> = {
                let mut sessions = self.sessions.lock();
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
                self.keep_ended_load(&s);
            }
            self.expire_arrivals();
            self.fill_pool();
        }
    }

    fn fill_pool(&self) {
        self.pool.lock().retain_mut(|p| match p.exit_status() {
            None => true,
            Some(status) => {
                tracing::warn!("a pooled API server (pid {}) {}", p.pid(), session::describe_exit(status));
                false
            }
        });
        while self.pool.lock().len() < self.config.pool_size && !self.stopping.load(Ordering::Relaxed) {
            let n = self.next_pooled.fetch_add(1, Ordering::Relaxed);
            let socket = self.config.runtime_dir.join(format!("pool-{n}.sock"));
            match ServerProcess::spawn(&self.config, socket, &format!("pool-{n}"), ServerStart::Pooled) {
                Ok(p) => self.pool.lock().push(p),
                Err(e) => {
                    tracing::warn!("cannot start a pooled API server: {e}");
                    break;
                }
            }
        }
    }

    fn take_pooled(&self) -> Option<ServerProcess> {
        let mut pool = self.pool.lock();
        while let Some(mut p) = pool.pop() {
            if !p.has_exited() {
                return Some(p);
            }
        }
        None
    }

    /// A connection's handshake: its Hello, its tenant, its session (new, or joined with the
    /// token), a place under the limits, then the channel (see [`connect_channel`]).
    ///
    /// [`connect_channel`]: Router::connect_channel
    fn handle_guest(self: Arc<Self>, mut guest: GuestStream, peer: Peer, pending: limits::PendingSlot) {
        let key = peer.key();
        let mut payload = Vec::new();
        let hello = match read_frame(&mut guest, &mut payload, MAX_HANDSHAKE) {
            Ok(h) if h.kind == FrameKind::Hello => decode_hello(h.version, &payload).map_err(BadHello::Decode),
            Ok(h) => Err(BadHello::NotHello(h.kind)),
            Err(phos_protocol::transport::TransportError::Io(e))
                if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) =>
            {
                self.limit_hit(&peer, limits::LimitKind::HandshakeTimeout);
                guest_warn!(&key, peer = %key, "no handshake within {:?}: closed", self.config.limits.handshake_timeout);
                return;
            }
            Err(e) => Err(BadHello::Frame(e)),
        };
        let hello = match hello {
            Ok(h) => h,
            Err(e) => {
                guest_warn!(&key, peer = %guest.describe(), "bad handshake: {e}");
                return refuse(&mut guest, NO_DEVICE, &format!("bad handshake: {e}"));
            }
        };
        // A guest with a pinned arena sends it right after the Hello; the server gets it with
        // the channel's shared region (the router itself never maps it).
        let host_arena = match (&guest, hello.host_arena) {
            (GuestStream::Unix(s), Some(_)) => match receive_host_arena(s) {
                Ok(fd) => Some(fd),
                Err(e) => {
                    guest_warn!(&key, peer = %guest.describe(), "bad pinned arena: {e}");
                    return refuse(&mut guest, NO_DEVICE, &format!("bad pinned arena: {e}"));
                }
            },
            _ => None,
        };
        let (tenant, pid) = match &peer {
            Peer::Local { tenant, pid } => (tenant.clone(), *pid),
            Peer::Remote(_) => match hello.tenant_token.as_deref().and_then(|t| self.tenants.for_token(t)) {
                Some(t) => (t, hello.pid),
                None => {
                    guest_warn!(&key, peer = %guest.describe(), "a TCP guest without a valid tenant token");
                    return refuse(&mut guest, NO_DEVICE, "unknown tenant token (set PHOS_TENANT_TOKEN)");
                }
            },
        };
        let key = tenant.0.as_str();
        if let Err(why) = check_apis(&hello.apis, "the guest library") {
            guest_warn!(key, %tenant, pid, "guest refused: {why}");
            return refuse(&mut guest, NO_DEVICE, &why.to_string());
        }
        if !phos_protocol::handshake::SUPPORTED_ABIS.contains(&hello.abi_major) {
            guest_warn!(key, %tenant, pid, "guest presents CUDA ABI {} (not 11, 12 or 13)", hello.abi_major);
            return refuse(&mut guest, NO_DEVICE, "unsupported CUDA ABI (Phos presents 11, 12 and 13)");
        }
        let state = self.tenants.state(&tenant);
        let session = match hello.token {
            None => {
                if !limits::take_place(&state.sessions, self.config.limits.sessions_per_tenant) {
                    state.limit_hits.hit(limits::LimitKind::Sessions);
                    guest_warn!(key, %tenant, pid, "session refused: the tenant has {} sessions", self.config.limits.sessions_per_tenant);
                    return refuse(
                        &mut guest,
                        BUSY,
                        &format!("the tenant has its {} sessions already", self.config.limits.sessions_per_tenant),
                    );
                }
                match self.start_session(&tenant, pid, &program_name(&hello.program), hello.abi_major) {
                    Ok(s) => {
                        // The peer of a VM's channel is the VM's device or, while the device
                        // is away, a `phosctl vm-relay` that lives as long as its connection:
                        // neither is the guest, which comes back on other connections.
                        if guest.is_remote() {
                            s.set_remote();
                        } else if !peer_is_the_guest(pid, hello.pid) {
                            s.set_carried();
                        }
                        s
                    }
                    Err(e) => {
                        state.sessions.fetch_sub(1, Ordering::Relaxed);
                        tracing::error!(%tenant, pid, "cannot start an API server: {e}");
                        return refuse(&mut guest, BUSY, &format!("cannot start an API server: {e}"));
                    }
                }
            }
            Some(token) => {
                let found = self.sessions.lock().values().find(|s| s.token_matches(&token)).cloned();
                match found {
                    Some(s) if s.tenant == tenant => s,
                    Some(s) => {
                        guest_warn!(key, %tenant, pid, session = s.id, "tenant presented another tenant's session token");
                        return refuse(&mut guest, NO_DEVICE, "unknown session");
                    }
                    None => {
                        if let Some(to) = self.moved_to(&token, &tenant) {
                            tracing::info!(%tenant, pid, "a guest of a session that moved is sent to {to}");
                            return refuse(&mut guest, phos_protocol::frame::REFUSED_MOVED, &to);
                        }
                        guest_warn!(key, %tenant, pid, "unknown session token");
                        return refuse(&mut guest, NO_DEVICE, "unknown session");
                    }
                }
            }
        };
        let limits = &self.config.limits;
        let channel =
            match session.open_channel(limits.channels_per_session, self.channels_per_tenant.load(Ordering::Relaxed)) {
                Ok(c) => c,
                Err(kind) => {
                    state.limit_hits.hit(kind);
                    guest_warn!(key, %tenant, session = session.id, "channel refused: limit {} reached", kind.name());
                    return refuse(&mut guest, BUSY, &format!("too many channels ({} reached)", kind.name()));
                }
            };
        // Identified and counted: the channel no longer takes a place among the handshakes.
        drop(pending);
        if session.is_parked() {
            tracing::debug!(session = session.id, "a channel of a session whose process is being checkpointed waits");
            return refuse(
                &mut guest,
                phos_protocol::frame::REFUSED_PARKED,
                "the session's process is being checkpointed",
            );
        }
        // A suspended session's channels wait here for its restore.
        let Some(socket) = session.server_socket(self.config.reconnect_wait) else {
            tracing::warn!(session = session.id, "session has no server (not restored in time)");
            return refuse(&mut guest, NO_DEVICE, "the session is suspended and was not restored in time");
        };
        if let Err(e) = self.connect_channel(&session, &socket, guest, &hello, host_arena.as_ref(), channel) {
            tracing::warn!(session = session.id, "channel failed: {e}");
        }
    }

    fn start_session(&self, tenant: &Tenant, pid: u32, program: &str, abi_major: u32) -> io::Result<Arc<SessionEntry>> {
        let id = self.next_session.fetch_add(1, Ordering::Relaxed);
        let server = match self.take_pooled() {
            Some(p) => {
                let ctl = phos_control::control_path(&p.socket);
                let started = phos_control::block_on(async move {
                    let client = phos_control::server_client(&ctl).await?;
                    client
                        .start(tarpc::context::current(), id, tenant.to_string())
                        .await
                        .map_err(io::Error::other)?
                        .map_err(io::Error::other)
                });
                match started.and_then(|r| r) {
                    Ok(()) => p,
                    Err(e) => {
                        tracing::warn!("a pooled server refused the session ({e}); starting one");
                        p.end();
                        self.spawn_server(id, ServerStart::Fresh(id, tenant))?
                    }
                }
            }
            None => self.spawn_server(id, ServerStart::Fresh(id, tenant))?,
        };
        let entry = Arc::new(SessionEntry::new(
            id,
            tenant.clone(),
            self.tenants.state(tenant),
            pid,
            program.to_owned(),
            abi_major,
            session::random_token()?,
            0,
            Some(server),
        ));
        self.sessions.lock().insert(id, entry.clone());
        tracing::info!(session = id, %tenant, pid, program, abi = abi_major, "session started");
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

    /// What is known of the memory load of `session`'s last on-demand restore: from the
    /// session, or, once it has ended, from the last word kept.
    pub fn restore_load(&self, session: u64) -> Option<phos_control::LoadReport> {
        if let Some(s) = self.session(session) {
            return s.restore_load.lock().clone();
        }
        self.ended_loads.lock().iter().rev().find(|r| r.session == session).cloned()
    }

    /// Keep the last word on an ended session's on-demand restore a while (see
    /// [`restore_load`](Self::restore_load)).
    fn keep_ended_load(&self, session: &SessionEntry) {
        let Some(mut last) = session.restore_load.lock().clone() else { return };
        if !last.finished() {
            last.session_ended = true;
        }
        let mut kept = self.ended_loads.lock();
        if kept.len() == ENDED_LOADS_KEPT {
            kept.pop_front();
        }
        kept.push_back(last);
    }

    /// The management socket of the server restoring `session`, while it does.
    pub fn restoring(&self, session: u64) -> Option<PathBuf> {
        self.restoring.lock().get(&session).cloned()
    }

    /// Restore a session from an image into a server started without a session (from the
    /// pool when there is one, else started for it). Returns the session and what the
    /// restore did. The whole restore must end within `request.timeout`, and stops if
    /// `cancel` is set (its client went away); either way the session stays as it was.
    pub fn restore(
        &self,
        request: &phos_control::RestoreRequest,
        cancel: &phos_control::Cancel,
    ) -> Result<(Arc<SessionEntry>, phos_control::RestoreSummary), ControlError> {
        let (dir, device) = (request.dir.as_path(), request.device);
        let deadline = Instant::now() + request.timeout;
        let refused = |reason| ControlError::ImageRefused { dir: dir.to_path_buf(), reason };
        let image = phos_checkpoint::Image::open(dir).map_err(|e| refused(ImageRefusal::Invalid(e.to_string())))?;
        let meta = image.manifest.session.clone();
        drop(image);
        let existing = self.session(meta.id).filter(|s| s.state() != State::Ended);
        if let Some(s) = &existing
            && s.state() == State::Active
        {
            return Err(ControlError::Running { session: meta.id });
        }
        let tenant = self.restore_tenant(&meta, existing.as_deref(), request).map_err(refused)?;
        // Whatever way the restore ends, its progress stops being asked for.
        struct Restoring<'a>(&'a Router, u64);
        impl Drop for Restoring<'_> {
            fn drop(&mut self) {
                self.0.restoring.lock().remove(&self.1);
            }
        }
        let _restoring = Restoring(self, meta.id);
        let late = |during: &str| ControlError::DeadlinePassed {
            session: meta.id,
            operation: Operation::Restore,
            within: request.timeout,
            during: during.to_string(),
        };
        let asked = Instant::now();
        let (server, pooled) = match self.take_pooled() {
            Some(p) => {
                self.restoring.lock().insert(meta.id, phos_control::control_path(&p.socket));
                (p, true)
            }
            None => {
                // Its management service answers progress queries from its start.
                let socket = self.server_socket(meta.id);
                self.restoring.lock().insert(meta.id, phos_control::control_path(&socket));
                let p = self.spawn_server_at(socket, meta.id, ServerStart::ForRestore { deadline, cancel }).map_err(
                    |e| match e.kind() {
                        io::ErrorKind::TimedOut => late("starting a server that restores it"),
                        io::ErrorKind::Interrupted => ControlError::Abandoned {
                            session: meta.id,
                            operation: Operation::Restore,
                            during: "starting a server that restores it".into(),
                        },
                        _ => ControlError::ServerNotStarted { session: meta.id, reason: e.to_string() },
                    },
                )?;
                (p, false)
            }
        };
        let had_server = asked.elapsed();
        let ctl = phos_control::control_path(&server.socket);
        let d = dir.to_path_buf();
        let cancel = cancel.clone();
        let within = deadline.saturating_duration_since(Instant::now());
        let during = if pooled { "replaying and copying into a pooled server" } else { "replaying and copying" };
        let id = meta.id;
        let full = request.full;
        let restored = phos_control::block_on(async move {
            let client = phos_control::server_client(&ctl)
                .await
                .map_err(|e| ControlError::ServerUnreachable { session: id, reason: e.to_string() })?;
            let call = client.restore(phos_control::context_within(within), id, d, device, full);
            tokio::pin!(call);
            let answer = tokio::select! {
                biased;
                r = &mut call => r,
                _ = cancel.cancelled() => {
                    // The server stops at its next step, and says so.
                    let _ = client.abandon(tarpc::context::current()).await;
                    call.await
                }
            };
            answer.map_err(|e| match e {
                tarpc::client::RpcError::DeadlineExceeded => late(during),
                e => ControlError::ServerUnreachable { session: id, reason: e.to_string() },
            })?
        })
        .map_err(|e| ControlError::io("a runtime for the restore", e))
        .and_then(|r| r);
        let summary = match restored {
            Ok(summary) => phos_control::RestoreSummary { pooled, ..summary },
            Err(e) => {
                server.end();
                return Err(e);
            }
        };
        let entry = match existing {
            Some(e) => {
                e.resume(server);
                e
            }
            None => {
                // An operator's restore is not held to the tenant's session limit.
                self.tenants.state(&tenant).sessions.fetch_add(1, Ordering::Relaxed);
                let e = Arc::new(SessionEntry::new(
                    meta.id,
                    tenant.clone(),
                    self.tenants.state(&tenant),
                    0,
                    meta.program.clone(),
                    meta.abi_major,
                    meta.token,
                    meta.epoch + 1,
                    Some(server),
                ));
                self.sessions.lock().insert(meta.id, e.clone());
                self.next_session.fetch_max(meta.id + 1, Ordering::Relaxed);
                e
            }
        };
        tracing::info!(
            session = meta.id,
            %tenant,
            pooled,
            server_ms = had_server.as_secs_f64() * 1e3,
            restore_ms = summary.total_ms,
            checked_ms = summary.verify_ms,
            replayed_ms = summary.replay_ms,
            "session restored from {} ({:.1} ms in all)",
            dir.display(),
            asked.elapsed().as_secs_f64() * 1e3
        );
        *entry.restore_load.lock() = None;
        if summary.on_demand {
            follow_load(entry.clone());
        }
        Ok((entry, summary))
    }

    /// Whose session an image becomes. Into a suspended session: the image must be that
    /// session's (its token) and of its tenant. A session the router does not have is only
    /// created when the operator names its tenant: `tenant` (which must be the image's) or
    /// `as_tenant` (which overrides it); an image naming a tenant is only its word.
    fn restore_tenant(
        &self,
        meta: &phos_checkpoint::SessionMeta,
        existing: Option<&SessionEntry>,
        request: &phos_control::RestoreRequest,
    ) -> Result<Tenant, ImageRefusal> {
        let session = meta.id;
        if let Some(t) = &request.tenant
            && *t != meta.tenant
        {
            return Err(ImageRefusal::OtherTenant { session, image: meta.tenant.clone(), expected: t.clone() });
        }
        let tenant = Tenant(request.as_tenant.clone().unwrap_or_else(|| meta.tenant.clone()));
        match existing {
            Some(s) => {
                if !s.token_matches(&meta.token) {
                    return Err(ImageRefusal::OtherSession { session });
                }
                if s.tenant != tenant {
                    return Err(ImageRefusal::TenantMismatch {
                        session,
                        session_tenant: s.tenant.0.clone(),
                        image_tenant: tenant.0,
                        as_tenant: request.as_tenant.is_some(),
                    });
                }
            }
            None => {
                if request.tenant.is_none() && request.as_tenant.is_none() {
                    return Err(ImageRefusal::TenantUnconfirmed { session, tenant: meta.tenant.clone() });
                }
                if !self.tenants.is_known(&tenant) {
                    return Err(ImageRefusal::UnknownTenant { tenant: tenant.0 });
                }
            }
        }
        if tenant.0 != meta.tenant {
            tracing::info!(session, "restoring the image of tenant {:?} as tenant {tenant}", meta.tenant);
        }
        Ok(tenant)
    }

    /// Attach a guest channel to its session's server and carry frames both ways.
    fn connect_channel(
        &self,
        session: &Arc<SessionEntry>,
        socket: &Path,
        mut guest: GuestStream,
        hello: &Hello,
        host_arena: Option<&OwnedFd>,
        _channel: session::ChannelGuard,
    ) -> io::Result<()> {
        // Shared-memory rings when the guest is on this host, can use them and the operator
        // allows them. The hop to the server (always on this host) uses them too, unless the
        // guest chose the socket (so that `--transport unix` is the socket all the way).
        let guest_kind = if guest.is_remote() {
            TransportKind::Tcp
        } else if self.config.shared_memory && hello.transports.contains(&TransportKind::Shm) {
            TransportKind::Shm
        } else {
            TransportKind::Unix
        };
        let server_kind = if guest_kind == TransportKind::Unix || !self.config.shared_memory {
            TransportKind::Unix
        } else {
            TransportKind::Shm
        };
        let mut server = UnixStream::connect(socket)?;
        let attach = Attach {
            apis: hello.apis.clone(),
            session: session.id,
            tenant: session.tenant.to_string(),
            abi_major: hello.abi_major,
            transport: server_kind,
        };
        let a = phos_protocol::encode(&attach);
        let mut h = FrameHeader::new(FrameKind::Hello);
        h.session = session.id;
        h.payload_len = a.len() as u64;
        write_frame(&mut server, &h, &[&a])?;
        let mut payload = Vec::new();
        // A server that does not answer holds this channel only, and not for ever.
        server.set_read_timeout(Some(SERVER_HANDSHAKE_TIMEOUT))?;
        let reply = read_frame(&mut server, &mut payload, MAX_HANDSHAKE).map_err(io::Error::other)?;
        server.set_read_timeout(None)?;
        if reply.kind != FrameKind::Welcome {
            refuse(&mut guest, reply.status, &printable(&String::from_utf8_lossy(&payload)));
            return Err(io::Error::other(format!("server answered {:?}", reply.kind)));
        }
        let mut welcome: Welcome = phos_protocol::decode(&payload).map_err(io::Error::other)?;
        welcome.token = session.token();
        welcome.epoch = session.epoch.load(Ordering::Relaxed);
        welcome.transport = guest_kind;
        welcome.max_payload = self.config.max_payload;
        let max = self.config.max_payload;
        // Bulk host data of large copies moves through a staging region the guest and the
        // server both map; the router passes it on and never touches it.
        let staging = match guest_kind {
            TransportKind::Shm => Some(phos_protocol::staging::create(self.config.staging_slot_bytes)?),
            _ => None,
        };
        let server: Box<dyn Transport> = match server_kind {
            TransportKind::Shm => Box::new(ShmTransport::create(
                server,
                self.config.ring_bytes,
                phos_protocol::DEFAULT_MAX_PAYLOAD.max(max),
                // The arena is only of use with the guest on shared memory too.
                SharedFiles { staging: staging.as_ref(), host_arena: staging.as_ref().and(host_arena) },
            )?),
            _ => Box::new(UnixTransport::new(server).with_max_payload(u64::MAX)),
        };
        let w = phos_protocol::encode(&welcome);
        let mut h = FrameHeader::new(FrameKind::Welcome);
        h.session = session.id;
        h.payload_len = w.len() as u64;
        write_frame(&mut guest, &h, &[&w])?;
        // The handshake is done: an idle guest may be quiet for as long as it likes.
        match &guest {
            GuestStream::Unix(g) => g.set_read_timeout(None).and_then(|_| g.set_write_timeout(None))?,
            GuestStream::Tcp(g) => g.set_read_timeout(None).and_then(|_| g.set_write_timeout(None))?,
        }
        let mut guest: Box<dyn Transport> = match (guest_kind, guest) {
            (TransportKind::Shm, GuestStream::Unix(g)) => {
                let files = SharedFiles { staging: staging.as_ref(), host_arena: None };
                Box::new(ShmTransport::create(g, self.config.ring_bytes, max, files)?)
            }
            (_, GuestStream::Unix(g)) => Box::new(UnixTransport::new(g).with_max_payload(max)),
            (_, GuestStream::Tcp(g)) => Box::new(TcpTransport::new(g).with_max_payload(max)),
        };
        // What the guest's frames hold here is charged to its tenant, whose channels share a
        // budget: no tenant can make the router hold more than that.
        guest.charge_payloads_to(session.tenant_state.buffered.clone());
        // What the calls in flight on this channel still have open, oldest first (async
        // calls the guest did not wait for, and synchronous ones: the guest goes on after a
        // call whose answer the server posted in the staging region, before its frame passes
        // here, so there may be several).
        let inflight: Arc<Mutex<VecDeque<admission::InFlight>>> = Arc::default();
        // A barrier forwarded on this channel that the server has not reported passed.
        let barrier_open = Arc::new(AtomicBool::new(false));
        // Server -> guest on a thread of its own; guest -> server here. Writes to the guest
        // (replies from the server, refusals from here) go through one lock.
        let (mut guest_r, guest_w) = guest.split()?;
        let guest_w = Arc::new(Mutex::new(guest_w));
        session.add_relay(&guest_w);
        let (mut server_r, mut server_w) = server.split()?;
        let back = {
            let (session, inflight, guest_w) = (session.clone(), inflight.clone(), guest_w.clone());
            let barrier_open = barrier_open.clone();
            std::thread::Builder::new().name("phos-route-back".into()).stack_size(CHANNEL_STACK).spawn(move || {
                let mut buf = Vec::new();
                while let Ok(h) = server_r.recv(&mut buf) {
                    match h.kind {
                        // The server's usage report is the router's: it never reaches the guest.
                        FrameKind::Report => {
                            match phos_protocol::decode::<UsageReport>(&buf) {
                                Ok(r) if r.barrier => {
                                    if barrier_open.swap(false, Ordering::Relaxed) {
                                        session.barrier_waiting(false);
                                    }
                                }
                                Ok(r) => admission::report(&session, &session.tenant_state, &r),
                                Err(e) => tracing::warn!(session = session.id, "bad usage report: {e}"),
                            }
                            continue;
                        }
                        FrameKind::Reply if h.flags & phos_protocol::frame::FLAG_ASYNC != 0 => {
                            // An acknowledgement of the async calls up to `call_id`, some of
                            // which (the payload says how many) failed.
                            let mut failed = buf.get(..8).map_or(0, |b| u64::from_le_bytes(b.try_into().unwrap()));
                            let mut q = inflight.lock();
                            while q.front().is_some_and(|f| f.call_id <= h.call_id) {
                                let f = q.pop_front().expect("checked");
                                let status = if failed > 0 && f.is_measured() {
                                    failed -= 1;
                                    h.status
                                } else {
                                    0
                                };
                                admission::answered(&session, &session.tenant_state, f, status);
                            }
                        }
                        FrameKind::Reply => {
                            let open = {
                                let mut q = inflight.lock();
                                q.iter().position(|f| f.call_id == h.call_id).and_then(|i| q.remove(i))
                            };
                            if let Some(f) = open {
                                admission::answered(&session, &session.tenant_state, f, h.status);
                            }
                        }
                        _ => {}
                    }
                    if guest_w.lock().send(&h, &[&buf]).is_err() {
                        break;
                    }
                }
                server_r.shutdown();
                guest_w.lock().shutdown();
            })?
        };
        let mut buf = Vec::new();
        let mut charges = Vec::new();
        let sync_spin = phos_protocol::shm::default_sync_spin();
        loop {
            let h = match guest_r.recv(&mut buf) {
                Ok(h) => h,
                Err(phos_protocol::transport::TransportError::Closed) => break,
                Err(e @ phos_protocol::transport::TransportError::OverBudget(..)) => {
                    session.tenant_state.limit_hits.hit(limits::LimitKind::BufferedBytes);
                    guest_warn!(&session.tenant.0, session = session.id, "channel closed: {e}");
                    refuse_on(guest_w.lock().as_mut(), &format!("{e}"));
                    break;
                }
                Err(e) => {
                    guest_warn!(&session.tenant.0, session = session.id, "malformed frame from the guest: {e}");
                    refuse_on(guest_w.lock().as_mut(), &format!("malformed frame: {e}"));
                    break;
                }
            };
            if h.kind == FrameKind::Call
                && let Some(f) = Function::from_wire(h.api, h.function)
            {
                if f == BYPASS_REPORT
                    && let Some(said) = session.note_bypass(&buf)
                {
                    guest_warn!(
                        &session.tenant.0,
                        session = session.id,
                        pid = session.pid,
                        program = %printable(&session.program),
                        "session bypassed: {said}"
                    );
                }
                charges.clear();
                let _ = costs::charges(f, &buf, &mut charges);
                let tenant = &session.tenant_state;
                let (decision, open) =
                    admission::admit(&self.tenants, &self.policies, session, tenant, f, &charges, h.call_id);
                match decision {
                    admission::Decision::Forward => inflight.lock().extend(open),
                    admission::Decision::Refuse(code) => {
                        let is_async = h.flags & phos_protocol::frame::FLAG_ASYNC != 0;
                        if is_async {
                            session.refused_async(h.call_id);
                            // A barrier of another channel may have named this call before
                            // it was refused (and gone to the server unfiltered): tell the
                            // server it will not come, in its place on this channel.
                            let mut w = FrameHeader::new(FrameKind::Withdrawn);
                            w.session = h.session;
                            w.call_id = h.call_id;
                            if server_w.send(&w, &[]).is_err() {
                                break;
                            }
                        }
                        let mut r = FrameHeader::new(FrameKind::Reply);
                        r.function = h.function;
                        r.session = h.session;
                        r.call_id = h.call_id;
                        r.status = code;
                        if is_async {
                            r.flags = phos_protocol::frame::FLAG_REFUSED;
                        }
                        if guest_w.lock().send(&r, &[]).is_err() {
                            break;
                        }
                        continue;
                    }
                }
            }
            if h.kind == FrameKind::Withdrawn {
                guest_warn!(
                    &session.tenant.0,
                    session = session.id,
                    "a withdrawal frame from the guest (only the router sends one)"
                );
                refuse_on(guest_w.lock().as_mut(), "malformed frame: a guest does not withdraw calls");
                break;
            }
            if h.kind == FrameKind::Barrier {
                let Some(ids) = session.filter_barrier(&buf) else {
                    guest_warn!(
                        &session.tenant.0,
                        session = session.id,
                        "malformed barrier from the guest ({} bytes)",
                        buf.len()
                    );
                    refuse_on(guest_w.lock().as_mut(), "malformed barrier");
                    break;
                };
                if ids.is_empty() {
                    continue;
                }
                // Until the server reports it passed, a thread of the guest waits there for
                // the others' calls: a policy holding one back for its tenant's queue to
                // drain must know (admission asks), as that queue may be waiting behind it.
                if !barrier_open.swap(true, Ordering::Relaxed) {
                    session.barrier_waiting(true);
                }
                let mut b = h;
                b.payload_len = ids.len() as u64;
                if server_w.send(&b, &[&ids]).is_err() {
                    break;
                }
                continue;
            }
            // Device time is measured launch by launch only when a policy may need it.
            let mut h = h;
            h.flags &= !phos_protocol::frame::FLAG_MEASURE;
            if h.kind == FrameKind::Call && !self.policies.is_empty() {
                h.flags |= phos_protocol::frame::FLAG_MEASURE;
            }
            if h.kind == FrameKind::Call && h.flags & phos_protocol::frame::FLAG_ASYNC == 0 {
                // The guest waits for this answer: the thread that carries it back spins.
                server_w.expect_frame_within(sync_spin);
            }
            if server_w.send(&h, &[&buf]).is_err() {
                break;
            }
        }
        server_w.shutdown();
        let _ = back.join();
        guest_r.shutdown();
        if barrier_open.swap(false, Ordering::Relaxed) {
            session.barrier_waiting(false);
        }
        Ok(())
    }

    /// Load (or replace) a policy: its parameters set, checked, and, where the router is
    /// privileged (or `Require` asks), passed through the kernel's verifier.
    /// `cancel` set (the client gave up) stops the load before it takes effect.
    pub fn load_policy(
        &self,
        p: phos_control::PolicyLoad,
        cancel: &phos_control::Cancel,
    ) -> Result<phos_control::PolicySummary, ControlError> {
        use phos_policy::engine::{KernelCheck, parse_param};
        let refused = |reason: String| ControlError::PolicyRefused { name: p.name.clone(), reason };
        if p.name.is_empty()
            || p.name.len() > 64
            || !p.name.chars().all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c))
        {
            return Err(refused("not a policy name (letters, digits, `_-.`, at most 64)".into()));
        }
        let params = p
            .params
            .iter()
            .map(|s| parse_param(s))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| refused(e.to_string()))?;
        let kernel = match p.kernel_check {
            phos_control::KernelCheck::Auto => KernelCheck::Auto,
            phos_control::KernelCheck::Require => KernelCheck::Require,
            phos_control::KernelCheck::Skip => KernelCheck::Skip,
        };
        let info = self
            .policies
            .load(&p.name, &p.source, &p.elf, &params, kernel, &|| cancel.is_cancelled())
            .map_err(|e| control::policy_error(&p.name, e))?;
        Ok(control::summary(info))
    }

    /// Checkpoint a session through its server; with `stop`, the session is suspended and its
    /// server ended afterwards. The server gives up waiting for the session to come to rest
    /// after `request.quiesce_timeout`; `cancel` set (the client went away) makes it stop at
    /// its next step. Either way the session carries on as it was.
    pub fn checkpoint(
        &self,
        id: u64,
        request: phos_control::CheckpointRequest,
        cancel: &phos_control::Cancel,
    ) -> Result<phos_control::CheckpointSummary, ControlError> {
        let session = self.session(id).ok_or(ControlError::NoSuchSession { session: id })?;
        let ctl = session.control_socket().ok_or(match session.state() {
            State::Ended => ControlError::Ended { session: id },
            State::Active | State::Suspended => ControlError::Suspended { session: id },
        })?;
        let identity = phos_control::SessionIdentity {
            token: session.token(),
            tenant: session.tenant.to_string(),
            program: session.program.clone(),
            abi_major: session.abi_major,
            epoch: session.epoch.load(Ordering::Relaxed),
        };
        let (stop, park) = (request.stop, request.stop && request.park);
        // Its process is dumped and left running: no channel opens from now on, and the
        // server freezes the session at the cut (the process then has its channels cut, is
        // dumped, and the session unparked).
        let hold = request.park && !request.stop;
        if hold {
            session.park();
        }
        let started = Instant::now();
        // The session's program may end while the checkpoint runs (a concurrent one lets it
        // go on): its server must stay until it has answered.
        let _running = session.operation();
        let cancel = cancel.clone();
        let context = phos_control::long_context();
        let within = context.deadline.saturating_duration_since(Instant::now());
        let summary = phos_control::block_on(async move {
            let unreachable =
                |e: &dyn std::fmt::Display| ControlError::ServerUnreachable { session: id, reason: e.to_string() };
            let client = phos_control::server_client(&ctl).await.map_err(|e| unreachable(&e))?;
            let call = client.checkpoint(context, request, identity);
            tokio::pin!(call);
            let answer = tokio::select! {
                biased;
                r = &mut call => r,
                _ = cancel.cancelled() => {
                    // The server stops at its next step and answers; a checkpoint it had
                    // finished stands (and, with `stop`, the session is stopped).
                    let _ = client.abandon(tarpc::context::current()).await;
                    call.await
                }
            };
            answer.map_err(|e| match e {
                tarpc::client::RpcError::DeadlineExceeded => ControlError::DeadlinePassed {
                    session: id,
                    operation: Operation::Checkpoint,
                    within,
                    during: "waiting for its API server's answer".into(),
                },
                e => unreachable(&e),
            })?
        })
        .map_err(|e| ControlError::io("a runtime for the checkpoint", e))
        .and_then(|r| r);
        let summary = match summary {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(session = id, "checkpoint failed: {e}");
                if hold {
                    // The server serves it again (it thaws a session it gives up on).
                    session.unpark();
                }
                return Err(e);
            }
        };
        if park {
            // Before the server ends: its guest's channels, closed with it, are refused from
            // then on.
            session.park();
        }
        if stop {
            session.suspend();
        }
        {
            let mut figures = self.checkpoints.lock();
            figures.fallbacks += u64::from(summary.fallback.is_some());
            let entry = figures.by_mode.entry(summary.mode.clone()).or_default();
            entry.0 += 1;
            entry.1 = summary.clone();
        }
        tracing::info!(session = id, stop, "checkpoint written in {:.1} ms", started.elapsed().as_secs_f64() * 1e3);
        Ok(summary)
    }
}

impl Router {
    /// Of a session parked by a checkpoint that leaves its process running, its server frozen
    /// at the cut: close its guest's channels, and wait (until `within`) for it to have none.
    /// Returns how many were cut.
    pub fn cut_channels(&self, id: u64, within: Duration) -> Result<u64, ControlError> {
        let session = self.session(id).ok_or(ControlError::NoSuchSession { session: id })?;
        if !session.is_parked() {
            return Err(ControlError::Failed {
                session: id,
                operation: Operation::Checkpoint,
                reason: "the session is not parked for a checkpoint of its process".into(),
            });
        }
        let deadline = Instant::now() + within;
        let mut cut = 0;
        // A channel whose handshake was under way when the session was parked joins late.
        loop {
            cut += session.cut_relays();
            if session.channels() == 0 {
                tracing::info!(session = id, "parked: {cut} channel(s) of its process cut");
                return Ok(cut);
            }
            if Instant::now() >= deadline {
                return Err(ControlError::DeadlinePassed {
                    session: id,
                    operation: Operation::Checkpoint,
                    within,
                    during: format!("closing its process's channels ({} still open)", session.channels()),
                });
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Accept the parked session's channels again, and have its server serve it again. A
    /// session not parked (a failed checkpoint unparked it) is left as it is; one stopped
    /// for its process's restore stays parked.
    pub fn unpark(&self, id: u64) -> Result<(), ControlError> {
        let session = self.session(id).ok_or(ControlError::NoSuchSession { session: id })?;
        if !session.is_parked() {
            return Ok(());
        }
        if session.state() != State::Active {
            return Err(ControlError::Suspended { session: id });
        }
        session.unpark();
        let Some(ctl) = session.control_socket() else {
            return Ok(());
        };
        phos_control::block_on(async move {
            let client = phos_control::server_client(&ctl).await?;
            client.thaw(tarpc::context::current()).await.map_err(io::Error::other)
        })
        .and_then(|r| r)
        .map_err(|e| ControlError::ServerUnreachable { session: id, reason: e.to_string() })?;
        tracing::info!(session = id, "unparked: its process was dumped and runs on");
        Ok(())
    }
}

/// Ended sessions whose last on-demand restore's figures the router keeps.
const ENDED_LOADS_KEPT: usize = 64;

/// Follow the memory load of `session`'s on-demand restore on a thread of its own, keeping
/// its server's figures in the session (for `phosctl restore` and the metrics) until the load
/// is over, or until the server goes or stops answering (the figures then say so).
fn follow_load(session: Arc<SessionEntry>) {
    *session.restore_load.lock() = Some(phos_control::LoadReport { session: session.id, ..Default::default() });
    let followed = session.clone();
    let spawned = std::thread::Builder::new().name(format!("phos-load-{}", session.id)).spawn(move || {
        let session = followed;
        loop {
            let report = session.control_socket().and_then(|ctl| {
                phos_control::block_on(async {
                    let client = phos_control::server_client(&ctl).await.ok()?;
                    client.load(tarpc::context::current()).await.ok().flatten()
                })
                .ok()
                .flatten()
            });
            let Some(report) = report else {
                // The session's end may have asked the server last (`SessionEntry::end`).
                let mut kept = session.restore_load.lock();
                if let Some(r) = kept.as_mut().filter(|r| !r.finished()) {
                    if session.state() == State::Ended {
                        r.session_ended = true;
                    } else {
                        r.failed =
                            Some("the session's server ended or stopped answering before its memory was loaded".into());
                    }
                }
                return;
            };
            let mut kept = session.restore_load.lock();
            // The session's end may have stored the last word meanwhile.
            if kept.as_ref().is_some_and(phos_control::LoadReport::finished) {
                return;
            }
            let over = report.finished();
            *kept = Some(report);
            drop(kept);
            if over {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    });
    if let Err(e) = spawned {
        let why = format!("cannot follow the memory load of the restored session: {e}");
        tracing::warn!(session = session.id, "{why}");
        if let Some(r) = session.restore_load.lock().as_mut() {
            r.failed = Some(why);
        }
    }
}

#[cfg(test)]
mod peer_tests {
    /// A guest is its own peer (also by its pid inside a namespace); a process that carries
    /// another's connection, or one that is gone, is not.
    #[test]
    fn the_peer_is_the_guest_only_when_it_is_that_process() {
        let me = std::process::id();
        assert!(super::peer_is_the_guest(me, me));
        assert!(!super::peer_is_the_guest(me, me + 1));
        assert!(!super::peer_is_the_guest(1 << 30, 7));
    }
}
