//! Device memory as the library services' CPU implementations (emu, or a GPU without the
//! vendor's library) read and write it: through the backend's copies, on the stream the
//! library handle's work is ordered on. Shared by cuBLAS and cuSOLVER, which map the runtime
//! error into their own statuses.

use phos_protocol::{CudaError, Ptr};

use super::Session;
use crate::backend::StreamRef;

/// `bytes` bytes at `addr` (the dispatch has checked the range), after the stream's earlier
/// work. A buffer the server cannot allocate is `MemoryAllocation`, never an abort.
pub(super) fn read(session: &Session, stream: StreamRef, addr: u64, bytes: usize) -> Result<Vec<u8>, CudaError> {
    let mut buf = Vec::new();
    buf.try_reserve_exact(bytes).map_err(|_| CudaError::MemoryAllocation)?;
    buf.resize(bytes, 0);
    if bytes > 0 {
        session.backend.memcpy_dtoh(&mut buf, addr, Some(stream))?;
    }
    Ok(buf)
}

/// `bytes` written at `addr` (the dispatch has checked the range), ordered on the stream.
pub(super) fn write(session: &Session, stream: StreamRef, addr: u64, bytes: &[u8]) -> Result<(), CudaError> {
    if bytes.is_empty() {
        return Ok(());
    }
    session.backend.memcpy_htod(addr, bytes, Some(stream))
}

/// The address a device-pointer argument carries (0 for another shape, which the dispatch
/// has refused already).
pub(super) fn device_address(p: &Ptr<'_>) -> u64 {
    match p {
        Ptr::Device(a) => *a,
        _ => 0,
    }
}
