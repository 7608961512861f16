//! The management plane. `phosctl` talks to the router, and the router to each API server,
//! with `tarpc` over Unix sockets (the router's is its guest socket's path plus `.ctl`, a
//! server's is its channel socket's path plus `.ctl`). Calls carry small messages only; the
//! data of a checkpoint goes to disk, not through these sockets. A call that fails answers
//! with a [`ControlError`] ([`error`]), which says what failed and of which [`ErrorClass`].

mod error;
pub mod peer;

pub use error::{ControlError, ErrorClass, ImageRefusal, Operation, Waiting};

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// A session as the router sees it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SessionInfo {
    pub id: u64,
    pub tenant: String,
    /// The guest's process id: on this router's host, unless `remote`.
    pub pid: u32,
    /// The guest is on another host (a TCP channel); its `pid` is that host's.
    #[serde(default)]
    pub remote: bool,
    pub program: String,
    pub abi_major: u32,
    /// `active`, `suspended` (checkpointed and stopped, waiting for a restore) or `ended`.
    pub state: String,
    pub channels: usize,
    pub calls: u64,
    pub uptime_s: f64,
    /// (resource, total used, held now) from the spec's cost table.
    pub resources: Vec<(String, u64, i64)>,
    /// What the guest reported that does not go through Phos, in words (empty: nothing; the
    /// session is not bypassed).
    pub bypass: Vec<String>,
}

/// The sessions of one router of a fleet (`phosctl sessions --all`), or why it did not say.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FleetSessions {
    /// Its name in the configuration (else its endpoint).
    pub router: String,
    pub endpoint: String,
    pub sessions: Result<Vec<SessionInfo>, ControlError>,
}

/// What a checkpoint and a restore did: one definition, the C/R engine's, answered as is.
pub use phos_checkpoint::report::{CheckpointMode, CheckpointSummary, LoadReport, RestoreSummary};

/// How to take a checkpoint.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CheckpointRequest {
    pub dir: PathBuf,
    /// Freeze the session afterwards (the router then ends its server).
    pub stop: bool,
    /// zstd-compress the memory chunks.
    pub compress: bool,
    /// How long to wait for the session to come to rest (its calls in flight to finish, its
    /// devices to go idle) before giving up; the session is then left running as it was.
    pub quiesce_timeout: Duration,
    /// Copy-on-write while the session runs, recopy, or stop-the-world. A stopping
    /// checkpoint (`stop`) is recopy or stop-the-world: the session ends where its image is.
    #[serde(default)]
    pub mode: CheckpointMode,
    /// The session's process is about to be checkpointed too (`phosctl checkpoint
    /// --process`, CRIU): its guest's channels are refused (rather than held) from the
    /// request on, so that the process can be made to hold no connection to the router.
    /// With `stop`, until the restore. Without it (the process is dumped and left
    /// running), the server freezes the session at the checkpoint's cut and cuts the
    /// channels whose calls arrive from then on (those calls never run there: the guest
    /// sends them again), and the session stays so, its copy going on, until
    /// [`RouterControl::unpark`].
    #[serde(default)]
    pub park: bool,
}

/// The default of [`CheckpointRequest::quiesce_timeout`] (`phosctl checkpoint --timeout`):
/// ample for calls and queued kernels to finish, short enough that a session whose kernel
/// never ends is reported rather than waited on.
pub const DEFAULT_QUIESCE_TIMEOUT: Duration = Duration::from_secs(60);

/// How to restore an image.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RestoreRequest {
    pub dir: PathBuf,
    /// Put the session on this device.
    pub device: Option<i32>,
    /// The tenant the operator expects the image to belong to: refused if it names another.
    pub tenant: Option<String>,
    /// Restore the session as this tenant's, whatever the image says (the operator's
    /// decision; the image's own tenant is then only logged).
    pub as_tenant: Option<String>,
    /// The whole restore (server start, replay, copy) must end within this, or it is given
    /// up and the session stays as it was.
    pub timeout: Duration,
    /// Load all memory before the session is served (stop-the-world), rather than serve it
    /// once its objects exist and load its memory behind it (on demand, the default).
    pub full: bool,
}

/// The default of [`RestoreRequest::timeout`] (`phosctl restore --timeout`).
pub const DEFAULT_RESTORE_TIMEOUT: Duration = Duration::from_secs(600);

/// What the router knows about a session that the image records.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct SessionIdentity {
    pub token: [u8; 16],
    pub tenant: String,
    pub program: String,
    pub abi_major: u32,
    pub epoch: u64,
}

/// Bytes done and total of the operation in progress; of a migration (a recopy), its pass
/// too (0 the first copy, then its rounds), whether that pass holds the session's calls
/// (the last), and the bytes a second the session wrote between the last two passes.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
pub struct Progress {
    pub done: u64,
    pub total: u64,
    pub pass: u32,
    pub held: bool,
    pub dirty_rate: u64,
    /// The session is frozen: its calls held (a checkpoint's cut with `stop` or `park`).
    #[serde(default)]
    pub frozen: bool,
}

/// Where a live migration moves a session (`phosctl migrate`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum MigrationTarget {
    /// Another router: `unix:PATH` of its management socket, or `tcp:HOST:PORT` of its peer
    /// listener (`phosctl serve --peer-listen`).
    Router(String),
    /// Another device of the session's own router (a server of its own on that device).
    Device(i32),
}

impl std::fmt::Display for MigrationTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MigrationTarget::Router(r) => write!(f, "router {r}"),
            MigrationTarget::Device(d) => write!(f, "device {d}"),
        }
    }
}

/// How to migrate a session.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MigrateRequest {
    pub to: MigrationTarget,
    /// How long each wait for the session to come to rest may take (each round begins with
    /// one, and the last holds the session): as a checkpoint's.
    pub quiesce_timeout: Duration,
    /// The whole migration must end within this, or it is given up (the session runs on
    /// where it was).
    pub timeout: Duration,
    /// TCP connections the session's memory streams over, pieces dealt to them in turn (1 to
    /// [`phos_checkpoint::migrate::MAX_LANES`]).
    pub connections: u16,
}

/// The default of [`MigrateRequest::timeout`] (`phosctl migrate --timeout`).
pub const DEFAULT_MIGRATE_TIMEOUT: Duration = Duration::from_secs(600);

pub use phos_checkpoint::report::RoundFigures;

/// What a VM's move with its GPU sessions (`phosctl vm-migrate`) did, besides the
/// sessions' own migrations.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct VmMigrationReport {
    /// QEMU's downtime: the VM stopped for its last memory and the switch-over.
    pub vm_downtime_ms: f64,
    /// From unplugging the vsock device at the source to plugging it at the destination.
    pub device_away_ms: f64,
    /// From the sessions' hand-over until every moved session had its guest back (when
    /// measured): how long the guest's CUDA calls waited.
    pub calls_held_ms: Option<f64>,
    pub total_ms: f64,
    pub sessions: u32,
}

/// What a migration did.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct MigrationSummary {
    /// The session (its id at the target: a router keeps its own ids).
    pub session: u64,
    pub to: String,
    /// The passes over its memory: the first (everything, while it runs), the rounds
    /// (what it wrote meanwhile, while it runs), the last (what it wrote since, held).
    pub passes: Vec<RoundFigures>,
    /// Device memory the session has, and bytes sent for it (all passes).
    pub memory_bytes: u64,
    pub sent_bytes: u64,
    /// Bytes a second the session wrote while the rounds ran.
    pub dirty_rate: f64,
    /// How long the session's calls were held at the end: from the last quiesce until the
    /// target served the session (what the guest saw as a pause, besides reconnecting).
    pub downtime_ms: f64,
    pub total_ms: f64,
    /// The target's restore (on demand: served before its memory was on the device).
    pub restore: RestoreSummary,
}

/// What a source's server reports of its side of a migration.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct SentFigures {
    pub passes: Vec<RoundFigures>,
    pub memory_bytes: u64,
    pub sent_bytes: u64,
    /// The calls held from the last quiesce until the target took the session.
    pub held_ms: f64,
    pub total_ms: f64,
}

/// What a router taking a session in answers the router it comes from.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Incoming {
    /// Names this migration in the calls that follow.
    pub ticket: u64,
    /// Where the source's server sends the session: this port of the host the source
    /// reached the target router on (`127.0.0.1` over its Unix socket), with this key.
    pub stream_port: u16,
    pub key: [u8; 16],
    /// Where the session's guest reconnects: the router's guest socket (a guest on its host)
    /// and its TCP address for guests, if it has one.
    pub guest_unix: PathBuf,
    pub guest_tcp: Option<String>,
    /// The target's host (its boot id): a local guest can reach `guest_unix` only from it.
    pub host: String,
}

/// How a server sends its session to another (`ServerControl::migrate_out`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MigrateOut {
    pub stream: String,
    pub key: [u8; 16],
    pub identity: SessionIdentity,
    pub quiesce_timeout: Duration,
    /// How long the target may take to say it has the session, once it has it all.
    pub answer_timeout: Duration,
    /// Connections to stream over (the stream's lanes).
    pub connections: u16,
}

/// A policy to load (`phosctl policy load`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PolicyLoad {
    /// Its name in the chain; loading under a name in use replaces that policy.
    pub name: String,
    /// Where it came from, for `policy list` (a path, `builtin:NAME`).
    pub source: String,
    /// The ELF object.
    pub elf: Vec<u8>,
    /// `NAME=VALUE` settings of its parameters.
    pub params: Vec<String>,
    pub kernel_check: KernelCheck,
}

/// Whether the kernel's verifier checks a policy before it is accepted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum KernelCheck {
    /// Where the router may load eBPF programs (privileged), else not.
    #[default]
    Auto,
    /// Refuse the policy unless the kernel's verifier accepted it.
    Require,
    Skip,
}

/// A loaded policy.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct PolicySummary {
    pub name: String,
    pub source: String,
    /// The program's function name.
    pub program: String,
    pub instructions: usize,
    pub loaded_unix_s: u64,
    /// Whether the kernel's verifier accepted it.
    pub kernel_verified: bool,
    pub runs: u64,
    pub admitted: u64,
    pub delayed: u64,
    pub rejected: u64,
    pub mean_run_ns: u64,
}

/// A loaded policy in detail (`phosctl policy show`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct PolicyDetail {
    pub summary: PolicySummary,
    pub disassembly: Vec<String>,
    /// (name, type, key size, value size, max entries, entries in use)
    pub maps: Vec<(String, u32, u32, u32, u32, usize)>,
}

/// A tenant's usage (`phosctl top`, the metrics endpoint).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TenantUsage {
    pub name: String,
    pub index: u64,
    pub share: u64,
    pub sessions: u64,
    /// Sessions alive now whose guest reported a bypass: NVIDIA's CUDA runtime or driver
    /// mapped beside Phos's, or NVIDIA's runtime built into the program.
    pub bypassed_sessions: u64,
    pub calls: u64,
    /// Calls a policy delayed at least once, and the time they spent waiting.
    pub delayed: u64,
    pub delay_ns: u64,
    /// Calls refused by a quota or a policy.
    pub rejected: u64,
    /// Refusals for a limit, (limit, count): connections the router refused for one of its
    /// per-tenant limits (every such limit listed), and calls the tenant's API servers
    /// refused for a per-session limit on objects (those refused at least once).
    pub limit_refusals: Vec<(String, u64)>,
    /// (resource, `held` | `used` | `measured`, amount as policies see it, quota or 0).
    pub resources: Vec<(String, String, u64, u64)>,
    /// Channels open now, and bytes of their frames the router holds.
    pub channels: u64,
    pub buffered_bytes: u64,
}

/// The router's management service (used by `phosctl`).
#[tarpc::service]
pub trait RouterControl {
    async fn sessions() -> Vec<SessionInfo>;
    /// The sessions of this router and of each of its configured peers (a peer that did not
    /// answer: why).
    async fn fleet_sessions() -> Vec<FleetSessions>;
    async fn checkpoint(session: u64, request: CheckpointRequest) -> Result<CheckpointSummary, ControlError>;
    async fn restore(request: RestoreRequest) -> Result<RestoreSummary, ControlError>;
    /// Progress of a checkpoint of `session` (or of the restore that is bringing it back).
    async fn progress(session: u64) -> Option<Progress>;
    /// Of a session parked by a checkpoint that leaves its process running
    /// ([`CheckpointRequest::park`] without `stop`), frozen at the cut: close its guest's
    /// channels, and answer once it has none (within `within`) with how many were cut.
    async fn cut_channels(session: u64, within: Duration) -> Result<u64, ControlError>;
    /// Its process dumped: accept the session's channels again and serve it again.
    async fn unpark(session: u64) -> Result<(), ControlError>;
    /// How the memory of `session`'s last on-demand restore loads, or loaded (`None`: it has
    /// none, or its server does not answer).
    async fn restore_load(session: u64) -> Option<LoadReport>;
    async fn policy_load(policy: PolicyLoad) -> Result<PolicySummary, ControlError>;
    async fn policy_unload(name: String) -> Result<(), ControlError>;
    async fn policy_list() -> Vec<PolicySummary>;
    async fn policy_show(name: String) -> Result<PolicyDetail, ControlError>;
    /// Every tenant's usage.
    async fn usage() -> Vec<TenantUsage>;
    /// Move `session` to another router or device while it runs (pre-copy live migration).
    async fn migrate(session: u64, request: MigrateRequest) -> Result<MigrationSummary, ControlError>;
    /// Another router's: take in its session `session`, `identity` (its guest process
    /// `pid`, or a guest `remote` from it): a server is readied to receive it.
    async fn migrate_prepare(
        session: u64,
        identity: SessionIdentity,
        pid: u32,
        remote: bool,
    ) -> Result<Incoming, ControlError>;
    /// Another router's: the session of `ticket` was sent; answers once its server has
    /// restored it, and the session is this router's from then on.
    async fn migrate_finish(ticket: u64) -> Result<RestoreSummary, ControlError>;
    /// Another router's: the migration of `ticket` is given up (its server is ended).
    async fn migrate_abort(ticket: u64);
    /// `phosctl vm-migrate`'s word on a VM that moved with its sessions from this router
    /// (`None`: its move failed and was undone), for the metrics.
    async fn vm_migrated(report: Option<VmMigrationReport>);
}

/// An API server's management service (used by the router).
#[tarpc::service]
pub trait ServerControl {
    async fn checkpoint(
        request: CheckpointRequest,
        identity: SessionIdentity,
    ) -> Result<CheckpointSummary, ControlError>;
    async fn progress() -> Progress;
    /// Give a server started ahead of need (pooled) a fresh session of `tenant`.
    async fn start(session: u64, tenant: String) -> Result<(), ControlError>;
    /// Give a server started without a session the session of an image, which must be
    /// session `session` (the router read its manifest): on demand (served once its objects
    /// exist, its memory loading behind it), or `full` (served once all is loaded).
    async fn restore(
        session: u64,
        dir: PathBuf,
        device: Option<i32>,
        full: bool,
    ) -> Result<RestoreSummary, ControlError>;
    /// The load of the session's on-demand restore, if it was restored so.
    async fn load() -> Option<LoadReport>;
    /// Give up the checkpoint or restore in progress (its client went away): it ends as
    /// soon as it can, with an error, leaving the session as it was.
    async fn abandon();
    /// A server without a session: listen on `bind` (an address, port chosen) for a
    /// migration stream bringing session `session`, which must present `key`; answers the
    /// port it listens on. The session is restored on demand (onto `device`, if given) once it has
    /// come; [`received`](ServerControl::received) answers how that went.
    async fn receive(session: u64, device: Option<i32>, key: [u8; 16], bind: String) -> Result<u16, ControlError>;
    /// Waits for the migration [`receive`](ServerControl::receive) began.
    async fn received() -> Result<RestoreSummary, ControlError>;
    /// Send the session to the server listening at `request.stream` while it runs, and
    /// answer once that server has it: the session is then frozen here (its calls held
    /// for the target). A failure leaves it running here.
    async fn migrate_out(request: MigrateOut) -> Result<SentFigures, ControlError>;
    /// Serve the frozen session again (a migration given up after the hand-over).
    async fn thaw();
}

/// Where the management service of a component listening on `socket` is.
pub fn control_path(socket: &Path) -> PathBuf {
    let mut p = socket.as_os_str().to_owned();
    p.push(".ctl");
    PathBuf::from(p)
}

/// A flag that long management operations look at between their steps, set when their
/// client gave up or went away. A child is also cancelled when its parent is.
#[derive(Clone, Debug, Default)]
pub struct Cancel(Arc<CancelInner>);

#[derive(Debug, Default)]
struct CancelInner {
    flag: AtomicBool,
    parent: Option<Cancel>,
}

impl Cancel {
    pub fn cancel(&self) {
        self.0.flag.store(true, Ordering::SeqCst);
    }

    pub fn is_cancelled(&self) -> bool {
        self.0.flag.load(Ordering::SeqCst) || self.0.parent.as_ref().is_some_and(Cancel::is_cancelled)
    }

    /// Whether `other` is this very flag (not a copy of its state).
    pub fn same_as(&self, other: &Cancel) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }

    /// A flag of its own that is also set when this one is.
    pub fn child(&self) -> Cancel {
        Cancel(Arc::new(CancelInner { flag: AtomicBool::new(false), parent: Some(self.clone()) }))
    }

    /// A guard that sets the flag when it is dropped. An async request handler holds one:
    /// tarpc drops the handler's future when the request's deadline passes or its client
    /// cancels it, and the blocking work the handler waits for then stops too.
    pub fn on_drop(&self) -> CancelOnDrop {
        CancelOnDrop(self.clone())
    }

    /// Resolves once the flag is set (looked at every 20 ms).
    pub async fn cancelled(&self) {
        while !self.is_cancelled() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// See [`Cancel::on_drop`].
pub struct CancelOnDrop(Cancel);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.cancel();
    }
}

type Codec<Req, Resp> = tarpc::tokio_serde::formats::Bincode<tarpc::ClientMessage<Req>, tarpc::Response<Resp>>;
type ServerTransport<Req, Resp> = tarpc::serde_transport::Transport<
    tokio::net::UnixStream,
    tarpc::ClientMessage<Req>,
    tarpc::Response<Resp>,
    Codec<Req, Resp>,
>;
type Listener<Req, Resp> = tarpc::serde_transport::unix::Incoming<
    tarpc::ClientMessage<Req>,
    tarpc::Response<Resp>,
    Codec<Req, Resp>,
    fn() -> Codec<Req, Resp>,
>;

/// A connection's transport that sets a [`Cancel`] once the client has gone (its end of
/// the socket closed, or broke): tarpc itself lets the requests in flight of a vanished
/// client run to their end.
struct Watched<T> {
    inner: std::pin::Pin<Box<T>>,
    gone: Cancel,
}

impl<T, Item, E> futures::Stream for Watched<T>
where
    T: futures::Stream<Item = Result<Item, E>>,
{
    type Item = Result<Item, E>;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        let polled = self.inner.as_mut().poll_next(cx);
        if matches!(polled, std::task::Poll::Ready(None | Some(Err(_)))) {
            self.gone.cancel();
        }
        polled
    }
}

impl<T, SinkItem> futures::Sink<SinkItem> for Watched<T>
where
    T: futures::Sink<SinkItem>,
{
    type Error = T::Error;

    fn poll_ready(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.inner.as_mut().poll_ready(cx)
    }

    fn start_send(mut self: std::pin::Pin<&mut Self>, item: SinkItem) -> Result<(), Self::Error> {
        self.inner.as_mut().start_send(item)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.inner.as_mut().poll_flush(cx)
    }

    fn poll_close(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.inner.as_mut().poll_close(cx)
    }
}

/// Serve on `listener` until the runtime stops, one service per connection made by
/// `service(gone)`, where `gone` is set once that connection's client has gone. Each
/// connection's requests run concurrently (a progress query is answered while a
/// checkpoint runs). Must run inside a [`tokio::task::LocalSet`] (see
/// [`spawn_service_thread`]).
async fn serve<S>(mut listener: Listener<S::Req, S::Resp>, service: impl Fn(Cancel) -> S + 'static)
where
    S: tarpc::server::Serve + Clone + 'static,
    S::Req: tarpc::RequestName + for<'de> Deserialize<'de> + 'static,
    S::Resp: Serialize + 'static,
{
    use futures::StreamExt;
    while let Some(conn) = listener.next().await {
        let Ok(transport) = conn else {
            // Out of descriptors, most likely: wait for some rather than spin on the error.
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            continue;
        };
        let transport: ServerTransport<S::Req, S::Resp> = transport;
        let gone = Cancel::default();
        let service = service(gone.clone());
        tokio::task::spawn_local(run_connection(transport, service, gone));
    }
}

/// Serve one connection's requests, concurrently, until it closes; `gone` is set then.
async fn run_connection<S, T, E>(transport: T, service: S, gone: Cancel)
where
    S: tarpc::server::Serve + Clone + 'static,
    S::Req: tarpc::RequestName + 'static,
    T: futures::Stream<Item = Result<tarpc::ClientMessage<S::Req>, E>>
        + futures::Sink<tarpc::Response<S::Resp>, Error = E>
        + 'static,
    E: std::error::Error + Send + Sync + 'static,
{
    use futures::StreamExt;
    use tarpc::server::{BaseChannel, Channel};
    let watched = Watched { inner: Box::pin(transport), gone };
    BaseChannel::with_defaults(watched).execute(service).for_each_concurrent(None, |fut| fut).await;
}

/// Run a management service on a thread of its own (a single-threaded runtime), so that the
/// rest of the process needs no async runtime. The socket is listening when this returns.
/// `service(gone)` makes the service of each connection (see [`serve`]).
pub fn spawn_service_thread<S>(
    path: PathBuf,
    service: impl Fn(Cancel) -> S + Send + 'static,
) -> std::io::Result<std::thread::JoinHandle<()>>
where
    S: tarpc::server::Serve + Clone + Send + 'static,
    S::Req: tarpc::RequestName + for<'de> Deserialize<'de> + Send + 'static,
    S::Resp: Serialize + Send + 'static,
{
    use tarpc::tokio_serde::formats::Bincode;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let _ = std::fs::remove_file(&path);
    let codec: fn() -> Bincode<_, _> = Bincode::default;
    let mut listener = runtime.block_on(tarpc::serde_transport::unix::listen(&path, codec))?;
    listener.config_mut().max_frame_length(64 << 20);
    std::thread::Builder::new().name("phos-control".into()).spawn(move || {
        let local = tokio::task::LocalSet::new();
        local.block_on(&runtime, serve(listener, service));
    })
}

/// Run a future to completion on a fresh single-threaded runtime (for synchronous callers
/// such as `phosctl` and the router's threads).
pub fn block_on<F: std::future::Future>(f: F) -> std::io::Result<F::Output> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    Ok(runtime.block_on(f))
}

/// A client of the router's management service.
pub async fn router_client(path: &Path) -> std::io::Result<RouterControlClient> {
    use tarpc::tokio_serde::formats::Bincode;
    let mut transport = tarpc::serde_transport::unix::connect(path, Bincode::default);
    transport.config_mut().max_frame_length(64 << 20);
    Ok(RouterControlClient::new(tarpc::client::Config::default(), transport.await?).spawn())
}

/// A client of an API server's management service.
pub async fn server_client(path: &Path) -> std::io::Result<ServerControlClient> {
    use tarpc::tokio_serde::formats::Bincode;
    let mut transport = tarpc::serde_transport::unix::connect(path, Bincode::default);
    transport.config_mut().max_frame_length(64 << 20);
    Ok(ServerControlClient::new(tarpc::client::Config::default(), transport.await?).spawn())
}

/// A context whose deadline suits long operations (a checkpoint of many GiB).
pub fn long_context() -> tarpc::context::Context {
    context_within(Duration::from_secs(3600))
}

/// A context whose deadline is `within` from now.
pub fn context_within(within: Duration) -> tarpc::context::Context {
    let mut cx = tarpc::context::current();
    cx.deadline = std::time::Instant::now() + within;
    cx
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn children_follow_their_parents_and_guards_cancel() {
        let parent = Cancel::default();
        let child = parent.child();
        let other = parent.child();
        assert!(!child.is_cancelled());
        drop(other.on_drop());
        assert!(other.is_cancelled() && !child.is_cancelled() && !parent.is_cancelled());
        parent.cancel();
        assert!(child.is_cancelled());
    }

    /// A client that goes away while its request runs: the connection's flag is set, so the
    /// work it asked for can stop (tarpc alone would let it run to its end).
    #[test]
    fn a_vanished_client_sets_its_connections_flag() {
        #[tarpc::service]
        trait Slow {
            async fn wait() -> bool;
        }
        #[derive(Clone)]
        struct Server(Cancel);
        impl Slow for Server {
            async fn wait(self, _: tarpc::context::Context) -> bool {
                self.0.cancelled().await;
                true
            }
        }
        let dir = tempfile_dir();
        let path = dir.join("slow.ctl");
        let seen: Arc<std::sync::Mutex<Vec<Cancel>>> = Arc::default();
        let record = seen.clone();
        spawn_service_thread(path.clone(), move |gone: Cancel| {
            record.lock().unwrap().push(gone.clone());
            Server(gone).serve()
        })
        .unwrap();
        let client_thread = std::thread::spawn(move || {
            block_on(async move {
                use tarpc::tokio_serde::formats::Bincode;
                let transport = tarpc::serde_transport::unix::connect(&path, Bincode::default).await.unwrap();
                let client = SlowClient::new(tarpc::client::Config::default(), transport).spawn();
                // Gives up (drops the call and the connection) after 200 ms.
                tokio::time::timeout(Duration::from_millis(200), client.wait(long_context())).await.is_err()
            })
            .unwrap()
        });
        assert!(client_thread.join().unwrap(), "the call did not end by itself");
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !seen.lock().unwrap().first().is_some_and(Cancel::is_cancelled) {
            assert!(std::time::Instant::now() < deadline, "the connection's flag was never set");
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = std::fs::remove_dir_all(dir);
    }

    fn tempfile_dir() -> PathBuf {
        let d = std::env::temp_dir().join(format!("phos-control-test-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }
}
