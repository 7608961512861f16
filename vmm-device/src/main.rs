//! `phos-vmm-device`: the vhost-user vsock device of one VM (see the library's docs).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

/// Carry a VM's AF_VSOCK connections to the Phos router (a vhost-user vsock backend for
/// QEMU's `-device vhost-user-vsock-pci,chardev=...`).
#[derive(Parser)]
#[command(name = "phos-vmm-device", version)]
struct Args {
    /// The vhost-user socket to listen on (QEMU's `-chardev socket,path=...`).
    #[arg(long)]
    socket: PathBuf,
    /// The VM's CID, as its guests see it (3 or more).
    #[arg(long)]
    guest_cid: u64,
    /// The router socket of the VM's tenant (`[[tenant]] socket=` in the router's
    /// configuration).
    #[arg(long)]
    router: PathBuf,
    /// The port guests reach Phos on (`PHOS_ENDPOINT=vsock:2:PORT`).
    #[arg(long, default_value_t = phos_protocol::transport::DEFAULT_VSOCK_PORT)]
    port: u32,
    /// Connections a guest may hold open at once (one per CUDA-calling thread).
    #[arg(long, default_value_t = 1024)]
    max_connections: usize,
    /// Exit when the VM goes away instead of waiting for it to come back.
    #[arg(long)]
    once: bool,
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_env("PHOS_LOG").unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let args = Args::parse();
    let config = phos_vmm_device::Config {
        socket: args.socket,
        guest_cid: args.guest_cid,
        router: args.router,
        port: args.port,
        max_connections: args.max_connections,
    };
    loop {
        match phos_vmm_device::serve(&config) {
            Ok(()) => tracing::info!("the VM disconnected"),
            Err(e @ phos_vmm_device::Error::BadCid(_)) => {
                tracing::error!("{e}");
                return ExitCode::from(2);
            }
            Err(e) => {
                tracing::error!("{e}");
                if args.once {
                    return ExitCode::FAILURE;
                }
                std::thread::sleep(std::time::Duration::from_secs(1));
            }
        }
        if args.once {
            return ExitCode::SUCCESS;
        }
    }
}
