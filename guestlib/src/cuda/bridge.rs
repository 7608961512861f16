//! Driver functions that are runtime functions under another name run the runtime's own code
//! (its remote calls, staged copies, page-locked memory...), on the same session and handles,
//! and answer its status in the driver's codes. The runtime's last error is left untouched:
//! the driver API has none.

use phos_protocol::CudaError;
use phos_protocol::cuda::CuError;
use phos_protocol::error::driver_status;

use crate::runtime;

/// Run a runtime export (`cudart::stubs::...`) for a driver function: its code in the
/// driver's terms.
pub fn runtime(f: impl FnOnce() -> i32) -> Result<(), CuError> {
    status(runtime::bridged(f))
}

/// A runtime status code as the driver says it.
pub fn status(code: i32) -> Result<(), CuError> {
    if code == 0 { Ok(()) } else { Err(driver_status(CudaError(code))) }
}

/// The runtime's internal calls (`phosModuleLoad`...) answer in its codes.
pub fn from_runtime<T>(r: Result<T, CudaError>) -> Result<T, CuError> {
    r.map_err(driver_status)
}

/// A device ordinal the session has: `CUDA_ERROR_INVALID_DEVICE` otherwise. The count is the
/// session's, known since its handshake: frameworks ask about the primary context of a device
/// before many of their operations (PyTorch's device guards: hundreds of times a training
/// step), and a round trip each cost more than the step's kernels.
pub fn check_device(device: i32) -> Result<(), CuError> {
    let count = runtime::session().map_err(CuError::from)?.device_count;
    if (0..count).contains(&device) { Ok(()) } else { Err(CuError::INVALID_DEVICE) }
}

/// A device address as the runtime's exports take it.
pub fn dptr(p: u64) -> *mut std::ffi::c_void {
    p as usize as *mut std::ffi::c_void
}
