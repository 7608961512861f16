//! Phos on the hypervisor side of a VM: a vhost-user vsock device. QEMU's
//! `vhost-user-vsock-pci` hands it the VM's vsock queues; it ends the guest's AF_VSOCK
//! connections to the host (CID 2) on the Phos port and carries each one, as a byte stream,
//! to the router's Unix socket for the VM's tenant. The hypervisor side thus sees every
//! call, and the guest cannot choose its tenant.
//!
//! [`muxer`] is the connection state machine (virtio-vsock operations, credit flow control),
//! [`device`] the vhost-user backend and its queue loops, [`serve`] one VM's lifetime.

pub mod device;
pub mod muxer;

use std::path::PathBuf;
use std::sync::Arc;

use vhost_user_backend::VhostUserDaemon;
use vm_memory::{GuestMemoryAtomic, GuestMemoryMmap};
use vmm_sys_util::epoll::EventSet;

pub use device::VsockDevice;
pub use muxer::Muxer;

/// What the device needs to know.
#[derive(Debug, Clone)]
pub struct Config {
    /// The vhost-user socket QEMU connects to.
    pub socket: PathBuf,
    /// The VM's CID (3 or more).
    pub guest_cid: u64,
    /// The router socket of the VM's tenant.
    pub router: PathBuf,
    /// The vsock port guests reach Phos on.
    pub port: u32,
    pub max_connections: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("guest CID {0}: must be at least 3 (0-2 are reserved)")]
    BadCid(u64),
    #[error(transparent)]
    Muxer(#[from] muxer::MuxError),
    #[error("cannot create the device's exit event: {0}")]
    ExitEvent(#[source] std::io::Error),
    #[error("vhost-user: {0}")]
    Daemon(vhost_user_backend::Error),
    #[error("cannot watch the router sockets: {0}")]
    Watch(#[source] std::io::Error),
}

/// Serve one VM: wait for QEMU on the socket, run the device until the VM goes away.
pub fn serve(config: &Config) -> Result<(), Error> {
    if config.guest_cid < 3 || config.guest_cid > u32::MAX as u64 {
        return Err(Error::BadCid(config.guest_cid));
    }
    let muxer = Muxer::new(config.guest_cid, config.port, config.router.clone(), config.max_connections)?;
    let device = VsockDevice::new(config.guest_cid, muxer).map_err(Error::ExitEvent)?;
    let mut daemon = VhostUserDaemon::new(
        "phos-vmm-device".to_string(),
        device.clone(),
        GuestMemoryAtomic::new(GuestMemoryMmap::new()),
    )
    .map_err(Error::Daemon)?;
    for handler in daemon.get_epoll_handlers() {
        handler
            .register_listener(device.sockets_fd(), EventSet::IN, device::SOCKETS_EVENT as u64)
            .map_err(Error::Watch)?;
    }
    tracing::info!(socket = %config.socket.display(), cid = config.guest_cid, port = config.port,
        router = %config.router.display(), "waiting for the VM");
    let result = daemon.serve(&config.socket).map_err(Error::Daemon);
    // Whatever ended the VM, its connections end with it.
    Arc::clone(&device).reset_all();
    result
}
