//! Backends run the session's work. [`cuda`] drives a real GPU through the CUDA driver API
//! (loaded at run time through `cudarc`, so the server builds and tests without CUDA);
//! [`emu`] executes on the CPU. Both see the same calls, in the driver's vocabulary: the
//! service layer has already translated virtual handles into the backend's raw objects and
//! checked every address against the session's memory map.

pub mod cuda;
pub mod emu;

use phos_protocol::CudaError;
use phos_protocol::types::{DeviceProperties, Dim3};

use crate::memory::MemoryView;

/// A backend's own object (a `CUstream`, `CUevent`, ... or an emulator index).
pub type Raw = u64;

/// The stream an operation is ordered on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamRef {
    /// The legacy default stream (stream 0 / `cudaStreamLegacy`).
    Legacy,
    /// The calling host thread's default stream (`cudaStreamPerThread`).
    PerThread,
    /// A stream the session created.
    Created(Raw),
}

/// Physical backing of one mapped range.
pub type Physical = u64;

/// A module a backend loaded.
#[derive(Debug, Default)]
pub struct LoadedModule {
    pub raw: Raw,
    /// Storage the backend made for the module's variables, as (name, address, size):
    /// memory the session's kernels and copies may use besides its allocations.
    pub variables: Vec<(String, u64, u64)>,
}

/// What every backend provides. Calls arrive from several channel threads at once.
pub trait Backend: Send + Sync {
    /// `cuda` or `emu`.
    fn name(&self) -> &'static str;
    fn device_count(&self) -> i32;
    fn device_properties(&self, device: i32) -> Result<DeviceProperties, CudaError>;
    fn device_attribute(&self, device: i32, attribute: i32) -> Result<i32, CudaError>;
    fn driver_version(&self) -> i32;
    /// (free, total) bytes of device memory.
    fn mem_info(&self, device: i32) -> Result<(u64, u64), CudaError>;
    /// Make `device` current for the calling thread.
    fn bind(&self, device: i32) -> Result<(), CudaError>;
    fn device_synchronize(&self, device: i32) -> Result<(), CudaError>;

    /// Reserve `[base, base + size)` of device address space; it must be granted at `base`
    /// exactly, so that pointers stay the same across restores.
    fn reserve(&self, base: u64, size: u64) -> Result<(), CudaError>;
    /// Give a reservation back (everything in it is unmapped already).
    fn unreserve(&self, base: u64, size: u64);
    /// Mapping granularity (a multiple of the page size).
    fn granularity(&self, device: i32) -> u64;
    /// Back `[addr, addr + size)` with fresh device memory of `device`.
    fn map(&self, device: i32, addr: u64, size: u64) -> Result<Physical, CudaError>;
    /// Undo [`map`](Backend::map).
    fn unmap(&self, addr: u64, size: u64, physical: Physical) -> Result<(), CudaError>;

    fn memcpy_htod(&self, dst: u64, src: &[u8], stream: Option<StreamRef>) -> Result<(), CudaError>;
    /// Page-lock host memory for fast copies (checkpoint buffers); a backend that has no use
    /// for it does nothing.
    fn pin_host(&self, _buf: &mut [u8]) {}
    /// Undo [`pin_host`](Backend::pin_host).
    fn unpin_host(&self, _buf: &mut [u8]) {}
    fn memcpy_dtoh(&self, dst: &mut [u8], src: u64, stream: Option<StreamRef>) -> Result<(), CudaError>;
    fn memcpy_dtod(&self, dst: u64, src: u64, len: u64, stream: Option<StreamRef>) -> Result<(), CudaError>;
    fn memset(&self, dst: u64, value: u8, len: u64, stream: Option<StreamRef>) -> Result<(), CudaError>;

    fn stream_create(&self, device: i32, flags: u32, priority: i32) -> Result<Raw, CudaError>;
    fn stream_destroy(&self, stream: Raw) -> Result<(), CudaError>;
    fn stream_synchronize(&self, stream: StreamRef) -> Result<(), CudaError>;
    /// `Ok(true)` when all work is done.
    fn stream_query(&self, stream: StreamRef) -> Result<bool, CudaError>;

    fn event_create(&self, device: i32, flags: u32) -> Result<Raw, CudaError>;
    fn event_destroy(&self, event: Raw) -> Result<(), CudaError>;
    fn event_record(&self, event: Raw, stream: StreamRef) -> Result<(), CudaError>;
    fn event_synchronize(&self, event: Raw) -> Result<(), CudaError>;
    fn event_query(&self, event: Raw) -> Result<bool, CudaError>;
    fn event_elapsed(&self, start: Raw, end: Raw) -> Result<f32, CudaError>;

    /// Load a module image (a fat binary, cubin or PTX) on `device`.
    fn module_load(&self, device: i32, image: &[u8]) -> Result<LoadedModule, CudaError>;
    fn module_unload(&self, module: Raw) -> Result<(), CudaError>;
    fn module_function(&self, module: Raw, name: &str) -> Result<Raw, CudaError>;
    /// Address and size of a module's global variable.
    fn module_global(&self, module: Raw, name: &str) -> Result<(u64, u64), CudaError>;
    /// Device time of the kernels launched so far, as far as it is known: (nanoseconds,
    /// kernels measured). Kernels still running are counted once they finish.
    fn device_time(&self) -> (u64, u64) {
        (0, 0)
    }

    /// Whether launched kernels are still to be measured (so [`device_time`] will grow
    /// without another call): the server then keeps reporting while the guest is quiet.
    ///
    /// [`device_time`]: Backend::device_time
    fn measuring(&self) -> bool {
        false
    }

    /// Launch with a packed parameter buffer. A backend that runs the kernel itself checks
    /// every access against `memory` (frozen for the launch) and appends its `printf` output
    /// to `printed`. `measure`: the router needs this launch's device time (a policy is
    /// loaded), so it is timed rather than sampled.
    #[allow(clippy::too_many_arguments)]
    fn launch(
        &self,
        function: Raw,
        grid: Dim3,
        block: Dim3,
        shared_mem: u32,
        stream: StreamRef,
        params: &[u8],
        memory: &MemoryView<'_>,
        printed: &mut Vec<u8>,
        measure: bool,
    ) -> Result<(), CudaError>;
}
