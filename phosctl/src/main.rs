//! `phosctl`: the operator's command line (docs/operations.md has every option).
//!
//! - `phosctl serve`: run a router in the foreground; it starts one API server per guest
//!   process.
//! - `phosctl run [--backend cuda|emu] [--endpoint E] [--summary] -- CMD ARGS...`: run an
//!   unmodified CUDA program through Phos (a private router and server unless an endpoint is
//!   given) and exit with its exit code.
//! - `phosctl sessions`, `phosctl checkpoint <session> --out DIR [--stop] [--process]`,
//!   `phosctl restore DIR [--device N]`: manage a router's sessions.
//! - `phosctl policy load|unload|list|show|build|headers`: the router's eBPF policies.
//! - `phosctl top`: live per-tenant usage.
//! - `phosctl bench`: Phos against native CUDA, as a markdown table.
//! - `phosctl spec coverage|check`: what the spec covers.
//!
//! The other commands exit with one status per kind of failure ([`error::Exit`]).

mod audit;
mod bench;
mod error;
mod guestlib;
mod manage;
mod policy;
mod process;
mod qmp;
mod relay;
mod summary;
mod vm_migrate;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand};
use phos_api_server::BackendKind;
use phos_control::{Cancel, CheckpointMode};
use phos_router::{Router, RouterConfig};

#[derive(Parser)]
#[command(
    name = "phosctl",
    version,
    about = "Phos: API remoting for CUDA",
    after_help = "Exit status (but `run`, which exits with its program's): 0 done, 1 failed, 2 usage or \
                  configuration, 3 unavailable (router, server, clang), 4 no such session or policy, \
                  5 refused, 6 timed out. See docs/operations.md."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a router in the foreground.
    Serve {
        /// Socket guests connect to (default: $XDG_RUNTIME_DIR/phos/router.sock).
        #[arg(long)]
        listen: Option<String>,
        /// Backend of the API servers (default: cuda where a GPU answers, else emu).
        #[arg(long)]
        backend: Option<BackendKind>,
        /// API servers to keep started ahead of need (contexts ready for new sessions and
        /// restores); default 0, or the configuration file's `pool`.
        #[arg(long)]
        pool: Option<usize>,
        /// Configuration file (TOML): tenants, quotas, policies to load, metrics; see
        /// docs/operations.md.
        #[arg(long)]
        config: Option<PathBuf>,
        /// Serve Prometheus metrics on this address (host:port).
        #[arg(long)]
        metrics: Option<std::net::SocketAddr>,
        /// Serve the management service on this address (host:port) too, for other routers
        /// (migrations to this one, `tcp:HOST:PORT`) and remote operators; needs
        /// --peer-secret-file.
        #[arg(long)]
        peer_listen: Option<std::net::SocketAddr>,
        /// File holding the secret routers share (at least 16 bytes): peers over TCP must
        /// know it, and migrations to `tcp:` routers present it.
        #[arg(long, env = "PHOS_PEER_SECRET_FILE")]
        peer_secret_file: Option<PathBuf>,
        /// Another router of this one's fleet, `[NAME=]ENDPOINT` (`unix:PATH` on this host,
        /// `tcp:HOST:PORT` its --peer-listen address); repeatable, added to the configuration
        /// file's `[[peer]]` tables. `phosctl sessions --all` lists their sessions too.
        #[arg(long = "peer", value_name = "[NAME=]ENDPOINT")]
        peers: Vec<phos_router::fleet::Peer>,
        /// What fleet listings call this router (default: the configuration's `name`, else
        /// `unix:` and its socket).
        #[arg(long)]
        name: Option<String>,
        #[command(flatten)]
        server: ServerOptions,
    },
    /// The router's eBPF policies.
    Policy {
        #[command(subcommand)]
        cmd: policy::PolicyCommand,
    },
    /// Live per-tenant usage: calls/s, launches/s, device time share, memory, throttled calls.
    Top {
        /// Seconds between refreshes.
        #[arg(long, default_value_t = 1.0)]
        interval: f64,
        /// Print one sample (rates over one interval) and exit.
        #[arg(long)]
        once: bool,
        #[command(flatten)]
        router: manage::RouterArg,
    },
    /// List a router's sessions.
    Sessions {
        /// Also those of every peer of the router's fleet (its `[[peer]]`s, `serve --peer`),
        /// with a column naming the router that holds each. A peer that does not answer is
        /// named on standard error, the others listed; the exit status is then 7.
        #[arg(long)]
        all: bool,
        #[command(flatten)]
        router: manage::RouterArg,
    },
    /// Checkpoint a session to an image directory. By default the session runs on while its
    /// memory is copied (copy-on-write: the image is the session as it was when the
    /// checkpoint began, and its calls are held only to take that point).
    Checkpoint {
        /// The session (see `phosctl sessions`).
        session: u64,
        /// Image directory to write.
        #[arg(long)]
        out: PathBuf,
        /// Stop the session afterwards: its guest waits until it is restored (the checkpoint
        /// is then stop-the-world).
        #[arg(long)]
        stop: bool,
        /// Hold the session's calls for the whole copy instead of copying while it runs.
        #[arg(long, conflicts_with = "recopy")]
        stop_the_world: bool,
        /// Copy while the session runs, then again what it wrote, in rounds, and the rest
        /// with its calls held: the image is the session at the end of the checkpoint (with
        /// --stop, the session stops there: a migration's short stop).
        #[arg(long)]
        recopy: bool,
        /// Compress the memory with zstd.
        #[arg(long)]
        compress: bool,
        /// Seconds to wait for the session to come to rest (calls in flight finished, devices
        /// idle) before giving up and leaving it running as it was.
        #[arg(long, default_value_t = phos_control::DEFAULT_QUIESCE_TIMEOUT.as_secs_f64())]
        timeout: f64,
        /// Also dump the session's process with CRIU (as root; the process must be on this
        /// host), at the checkpoint's cut, into the image's `process` directory; `phosctl
        /// restore` brings back both. The process runs on: its calls are held from the cut
        /// until it is dumped (CRIU's --leave-running), and the memory is copied while it
        /// runs (copy-on-write). With --stop, the process ends once dumped and the session
        /// stops.
        #[arg(long)]
        process: bool,
        /// The CRIU binary (default: $PHOS_CRIU, else /opt/phos-criu/bin/criu where
        /// tests/scripts/install-criu.sh installs it, else `criu`).
        #[arg(long)]
        criu: Option<PathBuf>,
        #[command(flatten)]
        router: manage::RouterArg,
    },
    /// Move a running session to another router or another device (pre-copy live
    /// migration): its memory is copied while it runs, in rounds while what it writes
    /// shrinks, then the rest with its calls held; its guest reconnects to the target
    /// without noticing. A migration that fails leaves the session running where it was.
    Migrate {
        /// The session (see `phosctl sessions`).
        session: u64,
        /// The router to move it to: `unix:PATH` (its socket on this host, or that socket's
        /// `.ctl`) or `tcp:HOST:PORT` (its --peer-listen address; both routers need the same
        /// --peer-secret-file).
        #[arg(long, conflicts_with = "device", required_unless_present = "device")]
        to: Option<String>,
        /// Move it to a server of its own router on this device (another GPU of the machine
        /// included: the program keeps its device numbers).
        #[arg(long)]
        device: Option<i32>,
        /// Seconds each wait for the session to come to rest may take (as a checkpoint's).
        #[arg(long, default_value_t = phos_control::DEFAULT_QUIESCE_TIMEOUT.as_secs_f64())]
        quiesce_timeout: f64,
        /// Seconds the whole migration may take before it is given up.
        #[arg(long, default_value_t = phos_control::DEFAULT_MIGRATE_TIMEOUT.as_secs_f64())]
        timeout: f64,
        /// TCP connections the session's memory streams over, from its server to the
        /// target's (pieces dealt to them in turn, put back in order at the target).
        #[arg(long, default_value_t = phos_checkpoint::migrate::DEFAULT_LANES,
              value_parser = clap::value_parser!(u16).range(1..=phos_checkpoint::migrate::MAX_LANES as i64))]
        connections: u16,
        #[command(flatten)]
        router: manage::RouterArg,
    },
    /// Move a running VM to another QEMU and its GPU sessions (its tenant's, at --router)
    /// to that QEMU's router, together: the VM's vsock device is unplugged (the guest goes
    /// on through its network relay, `vm-relay`), the VM's memory and the sessions' are
    /// copied while it runs, the sessions are handed over, then the VM stops once, briefly,
    /// and runs at the destination, where the guest reconnects to its sessions and the
    /// device is plugged in. A failure before the VM's switch-over leaves the VM and its
    /// sessions on the source (docs/operations.md, "Migrating a VM with its GPU work").
    VmMigrate {
        /// The source QEMU's QMP socket (`-qmp unix:PATH,server=on,wait=off`).
        #[arg(long)]
        qmp: PathBuf,
        /// The destination QEMU's QMP socket; that QEMU was started with `-incoming defer`
        /// and the source's command line less its vsock device.
        #[arg(long)]
        to_qmp: PathBuf,
        /// Where the destination QEMU takes the VM: `unix:PATH` or `tcp:HOST:PORT`.
        #[arg(long)]
        incoming: String,
        /// The VM's tenant at the source router (every active session of it moves).
        #[arg(long)]
        tenant: String,
        /// The destination router, as `phosctl migrate --to` names it.
        #[arg(long)]
        to: String,
        /// The destination router's own socket (`unix:PATH`), to move sessions back if the
        /// VM cannot follow them, and to see the guest reconnect. Default: --to, if it is a
        /// `unix:` path.
        #[arg(long)]
        dest_router: Option<String>,
        /// How the destination router reaches the source router, to move sessions back.
        /// Default: --router.
        #[arg(long)]
        back_to: Option<String>,
        /// The source's phos-vmm-device socket (to plug the device back in after a failure).
        #[arg(long)]
        vhost_user: PathBuf,
        /// The destination's phos-vmm-device socket (connected to the destination router).
        #[arg(long)]
        to_vhost_user: PathBuf,
        /// The id of the VM's `vhost-user-vsock-pci` device.
        #[arg(long, default_value = "vsock0")]
        device: String,
        /// QEMU's migration bandwidth, MiB/s (QEMU's own default is 32).
        #[arg(long, default_value_t = 1024)]
        max_bandwidth: u64,
        /// The VM downtime QEMU aims for, ms.
        #[arg(long, default_value_t = 300)]
        downtime_limit: u64,
        /// Seconds each session's wait to come to rest may take.
        #[arg(long, default_value_t = phos_control::DEFAULT_QUIESCE_TIMEOUT.as_secs_f64())]
        quiesce_timeout: f64,
        /// Seconds the whole move may take before it is given up (and undone).
        #[arg(long, default_value_t = 300.0)]
        timeout: f64,
        #[command(flatten)]
        router: manage::RouterArg,
    },
    /// Carry one guest connection between standard input/output and a router's socket:
    /// the command QEMU's user networking starts for each connection a VM opens to its
    /// `guestfwd` address (`guestfwd=tcp:10.0.2.100:7000-cmd:phosctl vm-relay --router
    /// PATH`), the VM's way to its router while its vsock device is away. Writes nothing to
    /// standard error (the connection's too).
    VmRelay {
        /// The router socket of the VM's tenant (`unix:PATH` or PATH), as phos-vmm-device's
        /// --router.
        #[arg(long)]
        router: String,
        /// Append the relay's own failures (the router not reachable) to this file.
        #[arg(long)]
        log: Option<PathBuf>,
    },
    /// Restore a session from an image into a new API server.
    Restore {
        /// Image directory.
        dir: PathBuf,
        /// Put the session's device on this device of the machine (its program keeps its
        /// device numbers); a session on several devices is restored only without it.
        #[arg(long)]
        device: Option<i32>,
        /// The tenant the image must belong to. Needed (or --as-tenant) to restore a session
        /// the router does not have, which the restore then creates for that tenant.
        #[arg(long, conflicts_with = "as_tenant")]
        tenant: Option<String>,
        /// Restore the session as this tenant's, whatever tenant the image names.
        #[arg(long)]
        as_tenant: Option<String>,
        /// Seconds the whole restore may take before it is given up (the session then stays
        /// as it was).
        #[arg(long, default_value_t = phos_control::DEFAULT_RESTORE_TIMEOUT.as_secs_f64())]
        timeout: f64,
        /// Load all of the session's memory before it is served. Without it the session is
        /// served once its objects are recreated and its memory loads behind it, each call
        /// waiting for the memory it touches (on demand).
        #[arg(long)]
        full: bool,
        /// Of an image with a process (`checkpoint --process`): restore the session only,
        /// not its process.
        #[arg(long)]
        without_process: bool,
        /// The CRIU binary that restores an image's process (as for `checkpoint --criu`).
        #[arg(long)]
        criu: Option<PathBuf>,
        #[command(flatten)]
        router: manage::RouterArg,
    },
    /// Run a CUDA program through Phos and exit with its exit code.
    Run {
        /// Backend (default: cuda where a GPU answers, else emu). Ignored with --endpoint.
        #[arg(long)]
        backend: Option<BackendKind>,
        /// Use a running router instead of a private one.
        #[arg(long)]
        endpoint: Option<String>,
        /// How the program's channels travel: `shm` (shared-memory rings, failing if the
        /// router does not offer them), `unix` (the socket) or `auto` (shm where offered;
        /// the default, unless PHOS_TRANSPORT says otherwise). `vsock`, inside a VM: AF_VSOCK
        /// to the hypervisor's phos-vmm-device (`--endpoint vsock:2:7070` by default). `tcp`:
        /// a router on another host (`--endpoint tcp:HOST:PORT`, PHOS_TENANT_TOKEN set).
        #[arg(long, value_parser = ["auto", "unix", "shm", "vsock", "tcp"])]
        transport: Option<String>,
        /// When the program has exited, print what it did through Phos: the backend and why,
        /// its result, and its calls, kernel launches, bytes copied and device time as the
        /// (private) router counted them.
        #[arg(long, conflicts_with = "endpoint")]
        summary: bool,
        #[command(flatten)]
        server: ServerOptions,
        /// The program and its arguments.
        #[arg(trailing_var_arg = true, required = true, allow_hyphen_values = true)]
        command: Vec<String>,
    },
    /// Benchmark Phos against native CUDA on this machine: a micro-benchmark program and
    /// whole programs, natively and through Phos, in one run; writes a markdown table.
    Bench(bench::BenchArgs),
    /// Inspect the API spec.
    Spec {
        #[command(subcommand)]
        what: SpecCommand,
    },
}

#[derive(clap::Args)]
struct ServerOptions {
    /// The phos-api-server executable (default: next to phosctl).
    #[arg(long)]
    server_bin: Option<PathBuf>,
    /// Memory of the emulated device, in bytes.
    #[arg(long)]
    emu_memory: Option<u64>,
    /// Device memory, in bytes a device, a concurrent checkpoint may copy memory into ahead
    /// of a write (default: half the device's free memory, at most the session's memory on
    /// it); with it full, such a write waits for the copy.
    #[arg(long)]
    cow_reserve: Option<u64>,
    /// Page-locked 8 MiB host buffers each API server makes when it starts and keeps for its
    /// checkpoints, restores and migrations (default: two per copy thread, one copy thread
    /// per core up to 16); 0: made at each operation, which holds up the session's calls
    /// while the driver page-locks them.
    #[arg(long)]
    copy_buffers: Option<usize>,
}

#[derive(Subcommand)]
enum SpecCommand {
    /// Print the API coverage tables of every API (docs/api-coverage.md).
    Coverage,
    /// Check the specs and print a summary of each.
    Check,
}

fn init_logging(default: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("PHOS_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    // Colours only on a terminal: a log file must hold the text and nothing else.
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false)
        .init();
}

/// A build without the shipped policies says so when a router starts.
fn note_absent_policies() {
    if let Some(note) = phos_policy::shipped::absent() {
        tracing::warn!("{note}");
    }
}

fn sibling(name: &str) -> PathBuf {
    std::env::current_exe().ok().and_then(|p| p.parent().map(|d| d.join(name))).unwrap_or_else(|| PathBuf::from(name))
}

/// The backend to use and why, said on the first log line.
fn choose_backend(asked: Option<BackendKind>) -> (BackendKind, String) {
    let (backend, why) = match asked {
        Some(b) => (b, format!("--backend {b}")),
        None => phos_api_server::detect_backend(),
    };
    tracing::info!("backend {backend} ({why})");
    (backend, why)
}

fn router_config(listen: PathBuf, runtime_dir: PathBuf, backend: BackendKind, server: &ServerOptions) -> RouterConfig {
    let mut server_args = vec!["--backend".to_string(), backend.to_string()];
    if let Some(m) = server.emu_memory {
        server_args.push("--emu-memory".into());
        server_args.push(m.to_string());
    }
    if let Some(r) = server.cow_reserve {
        server_args.push("--cow-reserve".into());
        server_args.push(r.to_string());
    }
    if let Some(n) = server.copy_buffers {
        server_args.push("--copy-buffers".into());
        server_args.push(n.to_string());
    }
    let mut config = RouterConfig::new(
        listen,
        runtime_dir,
        server.server_bin.clone().unwrap_or_else(|| sibling("phos-api-server")),
        server_args,
    );
    config.server_log_dir = std::env::var_os("PHOS_SERVER_LOG_DIR").map(PathBuf::from);
    config
}

pub(crate) fn endpoint_path(s: &str) -> Result<PathBuf, error::CliError> {
    match phos_protocol::transport::Endpoint::parse(s).map_err(error::CliError::Usage)? {
        phos_protocol::transport::Endpoint::Unix(p) => Ok(p),
        phos_protocol::transport::Endpoint::Tcp(_) | phos_protocol::transport::Endpoint::Vsock { .. } => {
            Err(error::CliError::Usage(format!(
                "`{s}`: a router's own socket is a unix: path (listen_tcp in its configuration adds TCP)"
            )))
        }
    }
}

struct ServeArgs {
    listen: Option<String>,
    backend: Option<BackendKind>,
    pool: Option<usize>,
    config: Option<PathBuf>,
    metrics: Option<std::net::SocketAddr>,
    peer_listen: Option<std::net::SocketAddr>,
    peer_secret_file: Option<PathBuf>,
    peers: Vec<phos_router::fleet::Peer>,
    name: Option<String>,
    server: ServerOptions,
}

fn serve(args: ServeArgs) -> ExitCode {
    init_logging("info");
    raise_fd_limit();
    // A router of many channels opens descriptors all its life: grow its table now, while it
    // has one thread, rather than with a grace period's wait at each doubling later.
    if let Err(e) = phos_protocol::fd_table::presize(1 << 16) {
        tracing::warn!("cannot size the descriptor table ahead: {e}");
    }
    note_absent_policies();
    let file = match &args.config {
        Some(path) => match phos_router::config::ConfigFile::load(path) {
            Ok(f) => f,
            Err(e) => {
                tracing::error!("{e}");
                return error::Exit::Usage.into();
            }
        },
        None => Default::default(),
    };
    let (server, pool) = (args.server, args.pool);
    let (backend, _) = choose_backend(args.backend);
    let listen = args.listen.or(file.listen.clone()).unwrap_or_else(default_endpoint);
    let path = match endpoint_path(&listen) {
        Ok(p) => p,
        Err(e) => {
            tracing::error!("{e}");
            return error::Exit::Usage.into();
        }
    };
    // The servers' sockets go beside the router's, in a directory named after it: two routers
    // whose sockets share a directory must not share their servers' socket names.
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "router".into());
    let runtime_dir = path
        .parent()
        .map(|d| d.join(format!("{name}.servers")))
        .unwrap_or_else(|| PathBuf::from(format!("/tmp/phos-{name}.servers")));
    let mut config = router_config(path.clone(), runtime_dir, backend, &server);
    config.pool_size = pool.or(file.pool).unwrap_or(0);
    config.metrics = args.metrics.or(file.metrics);
    config.tenants = file.tenants.clone();
    if let Some(b) = file.policy_budget {
        config.policy_budget = b;
    }
    config.listen_tcp = file.listen_tcp;
    config.peer_listen = args.peer_listen.or(file.peer_listen);
    config.name = args.name.or(file.name.clone());
    config.peers = file.peers.iter().cloned().chain(args.peers).collect();
    if let Some(path) = args.peer_secret_file.as_ref().or(file.peer_secret_file.as_ref()) {
        match phos_control::peer::Secret::from_file(path) {
            Ok(s) => config.peer_secret = Some(s),
            Err(e) => {
                tracing::error!("--peer-secret-file: {e}");
                return error::Exit::Usage.into();
            }
        }
    }
    match file.limits.resolve() {
        Ok(l) => config.limits = l,
        Err(e) => {
            tracing::error!("{e}");
            return error::Exit::Usage.into();
        }
    }
    if let Some(on) = file.shared_memory {
        config.shared_memory = on;
    }
    if let Some(size) = file.staging_slot {
        config.staging_slot_bytes =
            size.0.clamp(phos_protocol::staging::MIN_SLOT_BYTES as u64, phos_protocol::staging::MAX_SLOT_BYTES as u64)
                as usize;
    }
    config.session_limits = match file.session_limits() {
        Ok(l) => l,
        Err(e) => {
            tracing::error!("{e}");
            return error::Exit::Usage.into();
        }
    };
    if let Some(size) = file.ring_size {
        config.ring_bytes =
            size.0.clamp(phos_protocol::shm::MIN_RING_BYTES as u64, phos_protocol::shm::MAX_RING_BYTES as u64) as usize;
    }
    let router = match Router::new(config) {
        Ok(r) => r,
        Err(e) => {
            tracing::error!("{e}");
            return error::Exit::Usage.into();
        }
    };
    for p in &file.policies {
        let loaded: Result<_, Box<dyn std::error::Error>> =
            p.to_load().map_err(Into::into).and_then(|load| Ok(router.load_policy(load, &Cancel::default())?));
        match loaded {
            Ok(s) => tracing::info!("policy `{}` loaded from {}", s.name, s.source),
            Err(e) => {
                tracing::error!("policy from the configuration: {e}");
                return error::Exit::Usage.into();
            }
        }
    }
    let listener = match router.bind() {
        Ok(l) => l,
        Err(e) => {
            tracing::error!("cannot listen on {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
    };
    tracing::info!("router listening on unix:{}", path.display());
    match router.serve(listener) {
        Ok(()) => ExitCode::SUCCESS,
        Err(_) => ExitCode::FAILURE,
    }
}

/// A router serves many connections, each of a few descriptors: take the hard limit the
/// system allows this process (the soft default, 1024, is a few hundred channels).
fn raise_fd_limit() {
    let mut rl = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes one rlimit struct, which `rl` is.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) } == 0 && rl.rlim_cur < rl.rlim_max {
        rl.rlim_cur = rl.rlim_max;
        // SAFETY: setrlimit reads one rlimit struct, which `rl` is.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &rl) } != 0 {
            tracing::warn!("cannot raise the open-file limit: {}", std::io::Error::last_os_error());
        }
    }
}

/// A `--timeout` in seconds (fractions allowed; negative or not a number: none at all).
fn seconds(s: f64) -> std::time::Duration {
    std::time::Duration::try_from_secs_f64(s).unwrap_or_default()
}

pub(crate) fn default_endpoint() -> String {
    match std::env::var("XDG_RUNTIME_DIR") {
        Ok(dir) => format!("unix:{dir}/phos/router.sock"),
        Err(_) => "unix:/run/phos/router.sock".to_string(),
    }
}

struct RunArgs {
    backend: Option<BackendKind>,
    endpoint: Option<String>,
    transport: Option<String>,
    summary: bool,
    server: ServerOptions,
    command: Vec<String>,
}

fn run(args: RunArgs) -> ExitCode {
    let RunArgs { backend, endpoint, transport, summary, server, command } = args;
    init_logging("info");
    note_absent_policies();
    let offer = match guestlib::prepare() {
        Ok(o) => o,
        Err(e) => {
            tracing::error!("cannot offer the guest library: {e}");
            return error::Exit::Usage.into();
        }
    };
    // Where the audit module says what it saw (read when the program has exited).
    let audit_dir = match tempfile::Builder::new().prefix("phos-audit-").tempdir() {
        Ok(d) => d,
        Err(e) => {
            tracing::error!("cannot create a directory for the audit report: {e}");
            return ExitCode::FAILURE;
        }
    };
    let audit_report = audit_dir.path().join("report");
    // Inside a VM the router is the hypervisor's: its device answers on the host's CID.
    let (endpoint, transport) = match transport.as_deref() {
        Some("vsock") => {
            let e = endpoint.unwrap_or_else(|| {
                format!("vsock:{}:{}", libc::VMADDR_CID_HOST, phos_protocol::transport::DEFAULT_VSOCK_PORT)
            });
            // A list (`vsock:2:7070,tcp:10.0.2.100:7000`, the guest library tries them in
            // order) starts with the vsock endpoint.
            if !matches!(
                phos_protocol::transport::Endpoint::parse(e.split(',').next().unwrap_or_default()),
                Ok(phos_protocol::transport::Endpoint::Vsock { .. })
            ) {
                tracing::error!("--transport vsock needs a vsock:CID:PORT endpoint, not `{e}`");
                return error::Exit::Usage.into();
            }
            (Some(e), None)
        }
        Some("tcp") => match endpoint.as_deref().map(phos_protocol::transport::Endpoint::parse) {
            Some(Ok(phos_protocol::transport::Endpoint::Tcp(_))) => (endpoint, None),
            _ => {
                tracing::error!("--transport tcp needs --endpoint tcp:HOST:PORT (a router listening on TCP)");
                return error::Exit::Usage.into();
            }
        },
        _ => (endpoint, transport),
    };
    // A private router unless the operator named one.
    let mut private: Option<PrivateRouter> = None;
    let endpoint = match endpoint {
        Some(e) => e,
        None => {
            let (backend, why) = choose_backend(backend);
            let dir = match tempfile::Builder::new().prefix("phos-run-").tempdir() {
                Ok(d) => d,
                Err(e) => {
                    tracing::error!("cannot create a runtime directory: {e}");
                    return ExitCode::FAILURE;
                }
            };
            let sock = dir.path().join("router.sock");
            let router = match Router::new(router_config(sock.clone(), dir.path().join("servers"), backend, &server)) {
                Ok(r) => r,
                Err(e) => {
                    tracing::error!("{e}");
                    return ExitCode::FAILURE;
                }
            };
            let listener = match router.bind() {
                Ok(l) => l,
                Err(e) => {
                    tracing::error!("cannot start a router: {e}");
                    return ExitCode::FAILURE;
                }
            };
            let r = router.clone();
            let handle = std::thread::spawn(move || {
                let _ = r.serve(listener);
            });
            private = Some(PrivateRouter { router, handle, _dir: dir, backend, why });
            format!("unix:{}", sock.display())
        }
    };
    // The program's CUDA libraries are Phos's: found first on the library path, and pinned
    // by the audit module whatever run paths or full paths its libraries use.
    let prepend = |var: &str, first: String| match std::env::var(var) {
        Ok(old) if !old.is_empty() => format!("{first}:{old}"),
        _ => first,
    };
    let mut child = std::process::Command::new(&command[0]);
    child
        .args(&command[1..])
        .env("LD_LIBRARY_PATH", prepend("LD_LIBRARY_PATH", offer.dir.display().to_string()))
        .env("LD_AUDIT", prepend("LD_AUDIT", offer.audit.display().to_string()))
        .env("PHOS_GUEST_DIR", &offer.dir)
        .env("PHOS_AUDIT_REPORT", &audit_report)
        .env("PHOS_ENDPOINT", &endpoint);
    if let Some(t) = transport {
        child.env("PHOS_TRANSPORT", t);
    }
    let started = std::time::Instant::now();
    let status = child.status();
    for finding in audit::findings(&audit::parse(&std::fs::read_to_string(&audit_report).unwrap_or_default())) {
        tracing::warn!("{finding}");
    }
    if let Some(p) = private {
        if summary && let Ok(status) = &status {
            summary::wait_for_sessions_to_end(&p.router, std::time::Duration::from_secs(5));
            let books = p.router.tenants.usage();
            eprint!("{}", summary::render(&command[0], status, started.elapsed(), p.backend, &p.why, &books));
        }
        p.router.stop();
        let _ = p.handle.join();
    }
    match status {
        Ok(s) => {
            use std::os::unix::process::ExitStatusExt;
            let code = s.code().unwrap_or_else(|| 128 + s.signal().unwrap_or(0));
            ExitCode::from(code.clamp(0, 255) as u8)
        }
        Err(e) => {
            tracing::error!("cannot run {}: {e}", command[0]);
            ExitCode::from(127)
        }
    }
}

/// The router `phosctl run` starts for its program when no endpoint is given.
struct PrivateRouter {
    router: Arc<Router>,
    handle: std::thread::JoinHandle<()>,
    /// Its sockets' directory, removed when it goes.
    _dir: tempfile::TempDir,
    backend: BackendKind,
    why: String,
}

/// The specs built into this program, checked, by API id.
fn built_in_specs() -> Result<Vec<phos_codegen::Api>, String> {
    let mut apis = phos_spec::SPECS
        .iter()
        .map(|s| phos_codegen::load(s.path, s.text).map_err(|e| e.to_string()))
        .collect::<Result<Vec<_>, String>>()?;
    apis.sort_by_key(|a| a.id);
    Ok(apis)
}

fn spec(what: SpecCommand) -> ExitCode {
    let apis = match built_in_specs() {
        Ok(a) => a,
        Err(e) => {
            eprint!("{e}");
            return ExitCode::FAILURE;
        }
    };
    match what {
        SpecCommand::Coverage => print!("{}", phos_codegen::emit::docs::emit(&apis)),
        SpecCommand::Check => {
            for api in &apis {
                println!(
                    "spec `{}`: API id {}, version {}, {} functions, hash {:016x}",
                    api.name,
                    api.id,
                    api.version,
                    api.functions.len(),
                    api.spec_hash
                )
            }
        }
    }
    ExitCode::SUCCESS
}

fn main() -> ExitCode {
    match Cli::parse().command {
        Command::Serve {
            listen,
            backend,
            pool,
            config,
            metrics,
            peer_listen,
            peer_secret_file,
            peers,
            name,
            server,
        } => serve(ServeArgs {
            listen,
            backend,
            pool,
            config,
            metrics,
            peer_listen,
            peer_secret_file,
            peers,
            name,
            server,
        }),
        Command::Migrate { session, to, device, quiesce_timeout, timeout, connections, router } => {
            let to = match (to, device) {
                (_, Some(d)) => phos_control::MigrationTarget::Device(d),
                (Some(r), None) => phos_control::MigrationTarget::Router(r),
                (None, None) => unreachable!("clap requires --to or --device"),
            };
            manage::migrate(&router, session, to, seconds(quiesce_timeout), seconds(timeout), connections)
        }
        Command::VmMigrate {
            qmp,
            to_qmp,
            incoming,
            tenant,
            to,
            dest_router,
            back_to,
            vhost_user,
            to_vhost_user,
            device,
            max_bandwidth,
            downtime_limit,
            quiesce_timeout,
            timeout,
            router,
        } => {
            let dest_router = dest_router.or_else(|| to.starts_with("unix:").then(|| to.clone()));
            error::report(vm_migrate::vm_migrate(vm_migrate::VmMigration {
                router,
                source_qmp: qmp,
                dest_qmp: to_qmp,
                incoming,
                tenant,
                to,
                dest_router,
                back_to,
                device,
                source_vhost_user: vhost_user,
                dest_vhost_user: to_vhost_user,
                max_bandwidth_mib: max_bandwidth,
                downtime_limit_ms: downtime_limit,
                timeout: seconds(timeout),
                quiesce_timeout: seconds(quiesce_timeout),
            }))
        }
        Command::VmRelay { router, log } => {
            relay::relay(Path::new(router.strip_prefix("unix:").unwrap_or(&router)), log.as_deref())
        }
        Command::Policy { cmd } => policy::command(cmd),
        Command::Top { interval, once, router } => {
            policy::top(&router, std::time::Duration::from_secs_f64(interval.max(0.1)), once)
        }
        Command::Sessions { all, router } => manage::sessions(&router, all),
        Command::Checkpoint {
            session,
            out,
            stop,
            stop_the_world,
            recopy,
            compress,
            timeout,
            process,
            criu,
            router,
        } => {
            let mode = match (stop_the_world, recopy) {
                (true, _) => CheckpointMode::StopTheWorld,
                (_, true) => CheckpointMode::Recopy,
                _ => CheckpointMode::CopyOnWrite,
            };
            let process = process.then(|| process::criu_binary(criu));
            manage::checkpoint(&router, session, out, stop, mode, compress, seconds(timeout), process)
        }
        Command::Restore { dir, device, tenant, as_tenant, timeout, full, without_process, criu, router } => {
            let process = (!without_process && process::has_process(&dir)).then(|| process::criu_binary(criu));
            let target = manage::RestoreTarget { device, tenant, as_tenant };
            manage::restore(&router, dir, target, seconds(timeout), full, process)
        }
        Command::Run { backend, endpoint, transport, summary, server, command } => {
            run(RunArgs { backend, endpoint, transport, summary, server, command })
        }
        Command::Spec { what } => spec(what),
        Command::Bench(args) => bench::bench(args),
    }
}

#[cfg(test)]
mod tests {
    /// docs/api-coverage.md is what `phosctl spec coverage` prints for the spec of this tree.
    #[test]
    fn coverage_document_is_current() {
        let apis = super::built_in_specs().expect("the specs check");
        let generated = phos_codegen::emit::docs::emit(&apis);
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/api-coverage.md");
        let on_disk = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            on_disk == generated,
            "docs/api-coverage.md is stale: run `cargo run -p phosctl -- spec coverage > docs/api-coverage.md`"
        );
    }
}
