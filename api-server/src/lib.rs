//! The Phos API server. One server process runs one guest process's calls (its *session*):
//! [`server`] serves the session's channels, the generated [`dispatch`] checks each request
//! against the spec, [`service`] gives every function its CUDA semantics on a
//! [`backend`] (`cuda` on a GPU, `emu` on the CPU), over the session's objects in the
//! [`registry`] (its device address space at fixed addresses, streams, events, modules,
//! graphs, page-locked memory). API objects reach the guest only as virtual handles.
//!
//! **Locks.** The server uses parking_lot's locks only (`clippy.toml` refuses std's), which
//! do not poison: a call that panics is answered `cudaErrorUnknown` (see [`server`]) and its
//! locks are released as it unwinds, so the session keeps serving its other calls. Each
//! registry changes its state under one lock in steps that leave it consistent, so a panic
//! half-way leaves nothing half-made behind the lock.

/// Log a warning a guest's call caused, for session `$session`, at most as often as
/// [`GUEST_LINES`](phos_protocol::log_limit::GUEST_LINES) allows: a guest that makes bad
/// calls in a loop must not fill the disk. The first line let through after some were
/// dropped says how many.
#[macro_export]
macro_rules! guest_warn {
    ($session:expr, $($arg:tt)+) => {{
        let session: u64 = $session;
        if let Some(dropped) = phos_protocol::log_limit::GUEST_LINES.admit(&session.to_string()) {
            let line = format!($($arg)+);
            if dropped == 0 {
                tracing::warn!(session, "{line}");
            } else {
                tracing::warn!(session, "{line} ({dropped} similar lines dropped before this one)");
            }
        }
    }};
}

pub mod backend;
pub mod capture;
pub mod checkpoint;
pub mod control;
pub mod cpu_blas;
pub mod cpu_dnn;
pub mod cpu_fft;
pub mod cpu_lt;
pub mod cpu_rand;
pub mod cpu_solver;
pub mod cpu_sparse;
pub mod deferred;
mod fast_hash;
pub mod ipc;
pub mod kept;
pub mod module_vars;
pub mod on_demand;
pub mod ordering;
pub mod output;
pub mod pipeline;
pub mod quiesce;
pub mod records;
pub mod registry;
pub mod server;
pub mod service;
pub mod speculation;
mod timing;
pub mod usage;
mod window;

/// Each API's spec-generated service trait (`dispatch::cudart::CudartService`, ...) and its
/// checked `dispatch`.
pub mod dispatch {
    include!(concat!(env!("OUT_DIR"), "/dispatch.rs"));
}

/// The vendor libraries' entry points and the calls made with checked requests, for the APIs
/// the server runs with the vendor's own library (`vendor::cublas::Library`, ...).
pub mod vendor {
    include!(concat!(env!("OUT_DIR"), "/vendor.rs"));
}

use std::sync::Arc;

use backend::prelude::*;

/// Which backend a server runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    Cuda,
    Emu,
}

/// A backend name that is none of [`BackendKind`]'s.
#[derive(Debug, thiserror::Error)]
#[error("unknown backend `{0}` (cuda or emu)")]
pub struct UnknownBackend(pub String);

impl std::str::FromStr for BackendKind {
    type Err = UnknownBackend;
    fn from_str(s: &str) -> Result<Self, UnknownBackend> {
        match s {
            "cuda" => Ok(BackendKind::Cuda),
            "emu" => Ok(BackendKind::Emu),
            other => Err(UnknownBackend(other.to_string())),
        }
    }
}

impl std::fmt::Display for BackendKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            BackendKind::Cuda => "cuda",
            BackendKind::Emu => "emu",
        })
    }
}

/// Default memory of the emulated device.
pub const DEFAULT_EMU_MEMORY: u64 = 16 << 30;

/// The environment variable that sets how many devices `emu` presents (default 1).
pub const EMU_DEVICES_VAR: &str = "PHOS_EMU_DEVICES";

/// Most devices `emu` presents.
pub const MAX_EMU_DEVICES: usize = 16;

/// Create a backend; `emu` presents `emu_devices` devices of `emu_memory` bytes each.
pub fn open_backend(
    kind: BackendKind,
    emu_memory: u64,
    emu_devices: usize,
) -> Result<Arc<dyn Backend>, backend::cuda::OpenError> {
    Ok(match kind {
        BackendKind::Cuda => Arc::new(backend::cuda::CudaBackend::new()?),
        BackendKind::Emu => Arc::new(backend::emu::EmuBackend::with_devices(emu_memory, emu_devices)),
    })
}

/// The backend a machine should use when none is named: `cuda` where a GPU answers.
pub fn detect_backend() -> (BackendKind, String) {
    match backend::cuda::CudaBackend::probe() {
        Ok(n) if n > 0 => (BackendKind::Cuda, format!("{n} GPU(s) found")),
        Ok(_) => (BackendKind::Emu, "the CUDA driver reports no GPU".into()),
        Err(why) => (BackendKind::Emu, why.to_string()),
    }
}
