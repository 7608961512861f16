//! The management plane. `phosctl` talks to the router, and the router to each API server,
//! with `tarpc` over Unix sockets (the router's is its guest socket's path plus `.ctl`, a
//! server's is its channel socket's path plus `.ctl`). Calls carry small messages only; the
//! data of a checkpoint goes to disk, not through these sockets.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// A session as the router sees it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SessionInfo {
    pub id: u64,
    pub tenant: String,
    pub pid: u32,
    pub program: String,
    pub abi_major: u32,
    /// `active`, `suspended` (checkpointed and stopped, waiting for a restore) or `ended`.
    pub state: String,
    pub channels: usize,
    pub calls: u64,
    pub uptime_s: f64,
    /// (resource, total used, held now) from the spec's cost table.
    pub resources: Vec<(String, u64, i64)>,
}

/// What a checkpoint did.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct CheckpointSummary {
    pub dir: PathBuf,
    pub records: usize,
    pub regions: usize,
    pub memory_bytes: u64,
    pub stored_bytes: u64,
    pub quiesce_ms: f64,
    pub copy_ms: f64,
    pub total_ms: f64,
    pub stopped: bool,
}

/// What a restore did.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct RestoreSummary {
    pub session: u64,
    pub records: usize,
    pub memory_bytes: u64,
    pub verify_ms: f64,
    pub replay_ms: f64,
    pub copy_ms: f64,
    /// The whole restore as the router saw it, server start (or pool hand-out) included.
    pub total_ms: f64,
    /// The server came from the pool of pre-started servers.
    pub pooled: bool,
}

/// How to take a checkpoint.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CheckpointRequest {
    pub dir: PathBuf,
    /// Freeze the session afterwards (the router then ends its server).
    pub stop: bool,
    /// zstd-compress the memory chunks.
    pub compress: bool,
}

/// What the router knows about a session that the image records.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct SessionIdentity {
    pub token: [u8; 16],
    pub tenant: String,
    pub program: String,
    pub abi_major: u32,
    pub epoch: u64,
}

/// Bytes done and total of the operation in progress.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
pub struct Progress {
    pub done: u64,
    pub total: u64,
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
    pub calls: u64,
    /// Calls a policy delayed at least once, and the time they spent waiting.
    pub delayed: u64,
    pub delay_ns: u64,
    /// Calls refused by a quota or a policy.
    pub rejected: u64,
    /// (resource, `held` | `used` | `measured`, amount as policies see it, quota or 0).
    pub resources: Vec<(String, String, u64, u64)>,
    /// Channels open now, and bytes of their frames the router holds.
    pub channels: u64,
    pub buffered_bytes: u64,
    /// Connections refused by the router's limits: (limit, count), every limit listed.
    pub limit_refusals: Vec<(String, u64)>,
}

/// The router's management service (used by `phosctl`).
#[tarpc::service]
pub trait RouterControl {
    async fn sessions() -> Vec<SessionInfo>;
    async fn checkpoint(session: u64, request: CheckpointRequest) -> Result<CheckpointSummary, String>;
    async fn restore(dir: PathBuf, device: Option<i32>) -> Result<RestoreSummary, String>;
    /// Progress of a checkpoint of `session` (or of the restore that is bringing it back).
    async fn progress(session: u64) -> Option<Progress>;
    async fn policy_load(policy: PolicyLoad) -> Result<PolicySummary, String>;
    async fn policy_unload(name: String) -> Result<(), String>;
    async fn policy_list() -> Vec<PolicySummary>;
    async fn policy_show(name: String) -> Result<PolicyDetail, String>;
    /// Every tenant's usage.
    async fn usage() -> Vec<TenantUsage>;
}

/// An API server's management service (used by the router).
#[tarpc::service]
pub trait ServerControl {
    async fn checkpoint(request: CheckpointRequest, identity: SessionIdentity) -> Result<CheckpointSummary, String>;
    async fn progress() -> Progress;
    /// Give a server started ahead of need (pooled) a fresh session.
    async fn start(session: u64) -> Result<(), String>;
    /// Give a server started ahead of need the session of an image.
    async fn restore(dir: PathBuf, device: Option<i32>) -> Result<RestoreSummary, String>;
    /// What the restore this server started with did, if it started with one.
    async fn last_restore() -> Option<RestoreSummary>;
}

/// Where the management service of a component listening on `socket` is.
pub fn control_path(socket: &Path) -> PathBuf {
    let mut p = socket.as_os_str().to_owned();
    p.push(".ctl");
    PathBuf::from(p)
}

type Listener<Req, Resp> = tarpc::serde_transport::unix::Incoming<
    tarpc::ClientMessage<Req>,
    tarpc::Response<Resp>,
    tarpc::tokio_serde::formats::Bincode<tarpc::ClientMessage<Req>, tarpc::Response<Resp>>,
    fn() -> tarpc::tokio_serde::formats::Bincode<tarpc::ClientMessage<Req>, tarpc::Response<Resp>>,
>;

/// Serve `service` on `listener` until the runtime stops. Each connection's requests run
/// concurrently (a progress query is answered while a checkpoint runs). Must run inside a
/// [`tokio::task::LocalSet`] (see [`spawn_service_thread`]).
async fn serve<S>(mut listener: Listener<S::Req, S::Resp>, service: S)
where
    S: tarpc::server::Serve + Clone + 'static,
    S::Req: tarpc::RequestName + for<'de> Deserialize<'de> + 'static,
    S::Resp: Serialize + 'static,
{
    use futures::StreamExt;
    use tarpc::server::{BaseChannel, Channel};
    while let Some(conn) = listener.next().await {
        let Ok(transport) = conn else {
            // Out of descriptors, most likely: wait for some rather than spin on the error.
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            continue;
        };
        let service = service.clone();
        tokio::task::spawn_local(async move {
            BaseChannel::with_defaults(transport).execute(service).for_each_concurrent(None, |fut| fut).await;
        });
    }
}

/// Run a management service on a thread of its own (a single-threaded runtime), so that the
/// rest of the process needs no async runtime. The socket is listening when this returns.
pub fn spawn_service_thread<S>(path: PathBuf, service: S) -> std::io::Result<std::thread::JoinHandle<()>>
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
    let mut cx = tarpc::context::current();
    cx.deadline = std::time::Instant::now() + std::time::Duration::from_secs(3600);
    cx
}
