//! What the server has learnt of the devices: facts asked of the backend once (they never
//! change) and used on every call.

use std::collections::HashMap;

use parking_lot::RwLock;
use phos_protocol::CudaError;
use phos_protocol::types::Dim3;

use crate::backend::Devices;

/// What a device can launch (`cudaDevAttrMaxThreadsPerBlock`, block and grid dimensions, the
/// dynamic shared memory a block may opt in to).
#[derive(Clone, Copy)]
struct LaunchLimits {
    threads: u64,
    block: [u64; 3],
    grid: [u64; 3],
    shared: u64,
}

#[derive(Default)]
pub struct DeviceFacts {
    launch_limits: RwLock<HashMap<i32, LaunchLimits>>,
}

impl DeviceFacts {
    /// CUDA refuses launch configurations the device cannot run before anything starts.
    pub fn check_launch(
        &self,
        backend: &dyn Devices,
        device: i32,
        grid: Dim3,
        block: Dim3,
        shared: u32,
    ) -> Result<(), CudaError> {
        let limits = self.launch_limits(backend, device)?;
        let zero = grid.x == 0 || grid.y == 0 || grid.z == 0 || block.x == 0 || block.y == 0 || block.z == 0;
        let too_big = block.volume() > limits.threads
            || [block.x, block.y, block.z].iter().zip(limits.block).any(|(&n, max)| u64::from(n) > max)
            || [grid.x, grid.y, grid.z].iter().zip(limits.grid).any(|(&n, max)| u64::from(n) > max);
        if zero || too_big {
            return Err(CudaError::InvalidConfiguration);
        }
        // Dynamic shared memory beyond what a block may opt in to.
        if u64::from(shared) > limits.shared {
            return Err(CudaError::InvalidValue);
        }
        Ok(())
    }

    /// The device's launch limits, asked of the backend once.
    fn launch_limits(&self, backend: &dyn Devices, device: i32) -> Result<LaunchLimits, CudaError> {
        if let Some(l) = self.launch_limits.read().get(&device) {
            return Ok(*l);
        }
        let a = |n| backend.device_attribute(device, n).map(|v| v.max(0) as u64);
        let limits = LaunchLimits {
            threads: a(1)?,
            block: [a(2)?, a(3)?, a(4)?],
            grid: [a(5)?, a(6)?, a(7)?],
            shared: a(97)?.max(a(8)?),
        };
        self.launch_limits.write().insert(device, limits);
        Ok(limits)
    }
}
