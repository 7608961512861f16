//! `phos-api-server`: one process per guest process, started by the router.
//!
//! It binds its channel socket, prints `ready` on stdout, and serves until its stdin closes
//! (the router ended the session, or the router itself went away).

use std::io::{BufRead, Write};
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::sync::Arc;

use clap::Parser;
use phos_api_server::server::ApiServer;
use phos_api_server::service::Session;
use phos_api_server::{BackendKind, memory, open_backend};

#[derive(Parser)]
#[command(version, about = "Phos API server for one session (started by the router)")]
struct Args {
    /// Unix socket to accept the session's channels on.
    #[arg(long)]
    listen: PathBuf,
    /// Session id.
    #[arg(long)]
    session: u64,
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
    /// Largest frame payload accepted.
    #[arg(long, default_value_t = phos_protocol::DEFAULT_MAX_PAYLOAD, value_parser = parse_u64)]
    max_payload: u64,
}

fn parse_u64(s: &str) -> Result<u64, String> {
    match s.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16).map_err(|e| e.to_string()),
        None => s.parse().map_err(|e: std::num::ParseIntError| e.to_string()),
    }
}

fn main() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("PHOS_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).init();
    let args = Args::parse();
    let backend = match open_backend(args.backend, args.emu_memory) {
        Ok(b) => b,
        Err(e) => {
            tracing::error!("cannot open the {} backend: {e}", args.backend);
            std::process::exit(1);
        }
    };
    // The driver prints device printf output to our stdout: collect it from there (the
    // `ready` line goes to the original stdout, the router's pipe).
    let mut ready_to: Box<dyn Write> = Box::new(std::io::stdout());
    let output = if args.backend == BackendKind::Cuda {
        match phos_api_server::output::StdoutCapture::install() {
            Ok((capture, original)) => {
                ready_to = Box::new(original);
                phos_api_server::output::DeviceOutput::with_capture(capture)
            }
            Err(e) => {
                tracing::warn!("device printf output will not reach the guest: {e}");
                Default::default()
            }
        }
    } else {
        Default::default()
    };
    let session =
        match Session::new(args.session, backend, args.device_base, args.device_size, args.max_payload, output) {
            Ok(s) => Arc::new(s),
            Err(e) => {
                tracing::error!("cannot set up the session's device memory: {e:?}");
                std::process::exit(1);
            }
        };
    let _ = std::fs::remove_file(&args.listen);
    let listener = match UnixListener::bind(&args.listen) {
        Ok(l) => l,
        Err(e) => {
            tracing::error!("cannot listen on {}: {e}", args.listen.display());
            std::process::exit(1);
        }
    };
    tracing::info!(session = args.session, backend = %args.backend, "API server ready on {}", args.listen.display());
    // The router waits for this line before it connects channels.
    let _ = writeln!(ready_to, "ready");
    let _ = ready_to.flush();
    drop(ready_to);

    // The session lives as long as the router keeps our stdin open.
    let path = args.listen.clone();
    std::thread::spawn(move || {
        let stdin = std::io::stdin();
        for line in stdin.lock().lines() {
            if line.is_err() {
                break;
            }
        }
        let _ = std::fs::remove_file(&path);
        tracing::info!(session = args.session, "session ended");
        std::process::exit(0);
    });
    ApiServer::new(session).listen(listener);
}
