//! `phos-api-server`: one process per guest process, started by the router.
//!
//! It starts in one of three ways: for a new session (`--session ID`), for a session
//! restored from an image (`--restore DIR`), or ahead of need (`--pooled`: the backend and its
//! contexts are ready, the session comes later through the management service). It binds its
//! channel socket and its management socket (the same path plus `.ctl`), prints `ready` on
//! stdout, and serves until its stdin closes (the router ended the session, or went away).

use std::io::{BufRead, Write};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use clap::Parser;
use phos_api_server::checkpoint::Progress;
use phos_api_server::control::{ServerCtl, SessionFactory};
use phos_api_server::output::{DeviceOutput, StdoutCapture};
use phos_api_server::registry::memory;
use phos_api_server::server::{ApiServer, SessionSlot};
use phos_api_server::{BackendKind, open_backend};
use phos_control::ServerControl;
use phos_protocol::limits::SessionLimits;

#[derive(Parser)]
#[command(version, about = "Phos API server for one session (started by the router)")]
struct Args {
    /// Unix socket to accept the session's channels on.
    #[arg(long)]
    listen: PathBuf,
    /// Session id of a new session.
    #[arg(long, conflicts_with_all = ["restore", "pooled"])]
    session: Option<u64>,
    /// With --session: the session's tenant (its IPC directory).
    #[arg(long, requires = "session")]
    tenant: Option<String>,
    /// Restore the session of this checkpoint image.
    #[arg(long, conflicts_with = "pooled")]
    restore: Option<PathBuf>,
    /// With --restore: put the session on this device.
    #[arg(long, requires = "restore")]
    device: Option<i32>,
    /// Start without a session; the router gives it one later.
    #[arg(long)]
    pooled: bool,
    /// Backend: cuda (a GPU through the driver API) or emu (the CPU).
    #[arg(long, default_value = "cuda")]
    backend: BackendKind,
    /// Start of the session's device address range.
    #[arg(long, default_value_t = memory::DEFAULT_BASE, value_parser = parse_u64)]
    device_base: u64,
    /// Size of the session's device address range.
    #[arg(long, default_value_t = memory::DEFAULT_SIZE, value_parser = parse_u64)]
    device_size: u64,
    /// Memory of the emulated device, in bytes.
    #[arg(long, default_value_t = phos_api_server::DEFAULT_EMU_MEMORY, value_parser = parse_u64)]
    emu_memory: u64,
    /// Devices the emulator presents (1 to 16), each with `--emu-memory` bytes of its own.
    #[arg(long, default_value_t = 1, env = phos_api_server::EMU_DEVICES_VAR,
          value_parser = clap::value_parser!(u16).range(1..=phos_api_server::MAX_EMU_DEVICES as i64))]
    emu_devices: u16,
    /// Largest frame payload accepted.
    #[arg(long, default_value_t = phos_protocol::DEFAULT_MAX_PAYLOAD, value_parser = parse_u64)]
    max_payload: u64,
    /// A per-session limit, `KIND=N` (streams, events, allocations, host_allocations,
    /// modules, functions, graphs, graph_execs, graph_nodes); repeatable. Unset kinds keep
    /// their defaults.
    #[arg(long = "limit", value_name = "KIND=N")]
    limits: Vec<String>,
    /// Device memory, in bytes on each device, that a concurrent checkpoint may copy
    /// memory into ahead of a write (default: half the device's free memory, at most the
    /// session's memory on it); with it full, a call that writes memory not yet copied waits
    /// for the copy.
    #[arg(long, value_parser = parse_u64)]
    cow_reserve: Option<u64>,
    /// Page-locked host buffers of 8 MiB that checkpoints, restores and migrations copy
    /// through, made when the server starts and kept (default: two per copy thread, one
    /// copy thread per core up to 16: a restore's thread reads into one while the device
    /// copies the other); 0 makes them at each operation instead, which holds up the
    /// session's calls while the driver page-locks them.
    #[arg(long)]
    copy_buffers: Option<usize>,
    /// Whether a channel's async kernel launches are submitted to the backend by a thread of
    /// the channel's own while the channel's thread goes on with the next call (default: on
    /// with the cuda backend where the machine has four CPUs or more, off otherwise).
    #[arg(long, env = "PHOS_LAUNCH_PIPELINE", value_parser = ["on", "off"])]
    launch_pipeline: Option<String>,
    /// Tests only: milliseconds an on-demand restore waits before loading each chunk, so
    /// that the session's calls really come before their memory.
    #[arg(long, hide = true, default_value_t = 0, env = phos_api_server::on_demand::LOAD_PACE_VAR)]
    restore_load_pace_ms: u64,
    /// Tests only: milliseconds an incoming migration waits before reading each piece, so
    /// that a test can end the transfer in its middle.
    #[arg(long, hide = true, default_value_t = 0)]
    migrate_in_pace_ms: u64,
}

fn parse_u64(s: &str) -> Result<u64, std::num::ParseIntError> {
    match s.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16),
        None => s.parse(),
    }
}

fn fail(what: impl std::fmt::Display) -> ! {
    tracing::error!("{what}");
    std::process::exit(1);
}

/// The driver's number of hardware queues per context.
const DEVICE_CONNECTIONS_VAR: &str = "CUDA_DEVICE_MAX_CONNECTIONS";

/// Descriptors the server's table holds from its start (or its soft limit, if lower).
const FD_TABLE_SLOTS: u32 = 1 << 16;

fn main() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("PHOS_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Colours only on a terminal (the router gives each server a log file).
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let args = Args::parse();
    if args.session.is_none() && args.restore.is_none() && !args.pooled {
        fail("one of --session, --restore or --pooled is needed");
    }
    phos_api_server::pipeline::configure(args.launch_pipeline.as_deref().map(|v| v == "on"));
    let mut limits = SessionLimits::default();
    for l in &args.limits {
        limits.apply(l).unwrap_or_else(|e| fail(format!("--limit {e}")));
    }
    // While the process has one thread: growing the descriptor table later waits for a
    // grace period each time (8-16 ms), which a restore opening its image's files or a
    // checkpoint creating them would pay as stall (see `phos_protocol::fd_table`).
    if let Err(e) = phos_protocol::fd_table::presize(FD_TABLE_SLOTS) {
        tracing::warn!("cannot size the descriptor table ahead: {e}");
    }
    if std::env::var_os(DEVICE_CONNECTIONS_VAR).is_none() {
        // The driver gives a context's streams this many hardware queues (8 unless told):
        // with the C/R engine's copy lanes beside the session's streams, a queue shared with
        // a lane puts the session's kernels behind a checkpoint's copies (measured on the
        // H100: launches waited 2-5 ms each during a copy-on-write checkpoint). 32 is the most
        // the driver takes; an operator's setting is kept.
        // SAFETY: the process has one thread yet (the backend, which reads it, opens below).
        unsafe { std::env::set_var(DEVICE_CONNECTIONS_VAR, "32") };
    }
    let backend = open_backend(args.backend, args.emu_memory, usize::from(args.emu_devices))
        .unwrap_or_else(|e| fail(format!("cannot open the {} backend: {e}", args.backend)));
    let buffers = args.copy_buffers.unwrap_or(2 * phos_checkpoint::parallel::workers());
    if backend.copy_pool().is_some() && buffers > 0 {
        // Page-locking holds up every other driver call, so it is done once, when the server
        // starts; beside its start rather than before it is ready (most of a second on an
        // H100, which a restore into a server started for it, or a pool being refilled,
        // would wait for). A checkpoint, restore or migration that comes meanwhile waits for
        // the lanes and takes the buffers as they are made (`CopyPool::take_buffer`).
        // A pooled server is a spare: nothing waits for it to be ready, and the restore or
        // session it is taken for should find its buffers made rather than share the driver
        // and the process's memory map with the page-locking (measured on the H100: an
        // on-demand restore's image checks took 12-36 ms beside it).
        if args.pooled {
            if let Some(pool) = backend.copy_pool() {
                pool.prepare(backend.as_ref(), buffers, phos_checkpoint::engine::COPY_CHUNK);
            }
        } else {
            if let Some(pool) = backend.copy_pool() {
                pool.expect_preparation();
            }
            let b = backend.clone();
            std::thread::spawn(move || {
                if let Some(pool) = b.copy_pool() {
                    pool.prepare(b.as_ref(), buffers, phos_checkpoint::engine::COPY_CHUNK);
                }
            });
        }
    }

    // The driver prints device printf output to our stdout: collect it from there (the
    // `ready` line goes to the original stdout, the router's pipe).
    let mut ready_to: Box<dyn Write> = Box::new(std::io::stdout());
    let capture = if args.backend == BackendKind::Cuda {
        match StdoutCapture::install() {
            Ok((capture, original)) => {
                ready_to = Box::new(original);
                Some(capture)
            }
            Err(e) => {
                tracing::warn!("device printf output will not reach the guest: {e}");
                None
            }
        }
    } else {
        None
    };
    let factory = SessionFactory {
        backend,
        device_base: args.device_base,
        device_size: args.device_size,
        max_reply: args.max_payload,
        output: Arc::new(move || match &capture {
            Some(c) => DeviceOutput::with_capture(c.clone()),
            None => DeviceOutput::default(),
        }),
        limits,
        cow_reserve: args.cow_reserve,
        runtime_dir: args.listen.parent().map(Path::to_path_buf),
    };
    let slot = Arc::new(SessionSlot::default());
    let progress = Arc::new(Progress::default());
    // What goes wrong before `ready` is also said on the router's pipe, for the operator.
    let mut fail_to_router = |why: String| -> ! {
        let _ = writeln!(ready_to, "failed {}", why.replace('\n', " "));
        let _ = ready_to.flush();
        fail(why)
    };
    // The management service comes up first, so a restore's progress can be followed.
    let _ = std::fs::remove_file(&args.listen);
    let control = {
        let (slot, factory, progress) = (slot.clone(), factory.clone(), progress.clone());
        let running = Arc::default();
        let load = Arc::default();
        let incoming = Arc::default();
        let load_pace_ms = args.restore_load_pace_ms;
        let migrate_in_pace_ms = args.migrate_in_pace_ms;
        move |gone| {
            ServerCtl {
                slot: slot.clone(),
                factory: factory.clone(),
                progress: progress.clone(),
                gone,
                running: Arc::clone(&running),
                load: Arc::clone(&load),
                load_pace: std::time::Duration::from_millis(load_pace_ms),
                incoming: Arc::clone(&incoming),
                migrate_in_pace: std::time::Duration::from_millis(migrate_in_pace_ms),
            }
            .serve()
        }
    };
    if let Err(e) = phos_control::spawn_service_thread(phos_control::control_path(&args.listen), control) {
        fail_to_router(format!("management service: {e}"));
    }
    if let Some(id) = args.session {
        match factory.fresh(id) {
            Ok(s) => {
                if let Some(tenant) = &args.tenant {
                    factory.join_tenant(&s, tenant);
                }
                drop(slot.set(Arc::new(s)))
            }
            Err(e) => fail_to_router(e.to_string()),
        }
    } else if let Some(dir) = &args.restore {
        match factory.restore(dir, args.device, &progress, &phos_control::Cancel::default()) {
            Ok((s, _)) => drop(slot.set(Arc::new(s))),
            Err(e) => fail_to_router(format!("restore from {}: {e}", dir.display())),
        }
    }

    let listener = UnixListener::bind(&args.listen)
        .unwrap_or_else(|e| fail_to_router(format!("cannot listen on {}: {e}", args.listen.display())));
    tracing::info!(
        session = slot.get().map(|s| s.id),
        backend = %args.backend,
        pooled = args.pooled,
        "API server ready on {}",
        args.listen.display()
    );
    // The router waits for this line before it connects channels.
    let _ = writeln!(ready_to, "ready");
    let _ = ready_to.flush();
    drop(ready_to);

    // The session lives as long as the router keeps our stdin open.
    let path = args.listen.clone();
    let ending = slot.clone();
    std::thread::spawn(move || {
        let stdin = std::io::stdin();
        for line in stdin.lock().lines() {
            if line.is_err() {
                break;
            }
        }
        let _ = std::fs::remove_file(&path);
        let _ = std::fs::remove_file(phos_control::control_path(&path));
        tracing::info!("session ended");
        if let Some(session) = ending.get() {
            session.print_profile();
        }
        std::process::exit(0);
    });
    ApiServer::new(slot).listen(listener);
}
