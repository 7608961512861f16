//! The session's cuFFT plans. A plan is a virtual handle of kind `cufft_plan` whose number is
//! the `int` the program holds (so numbers stay below 2^31); what it stands for is its device,
//! its layout once made, its settings (auto-allocation, stream, work area) and, on a GPU, the
//! vendor's plan. A restore makes it again by replaying its creation, the call that made it
//! and its last setting of each kind.

use parking_lot::Mutex;
use phos_protocol::CudaError;
use phos_protocol::apis::HandleKind;

use super::handles::{HandleTable, NewHandle};
use crate::backend::Backend;
use crate::cpu_fft::Layout;

/// cuFFT plans a session may hold at once.
pub const MAX_PLANS: u64 = 4096;

/// One plan's state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The device current when it was created.
    pub device: i32,
    /// Its transform, once a plan call or cufftMakePlan* made it.
    pub layout: Option<Layout>,
    /// The work area the plan needs (the vendor's answer, or the CPU transform's).
    pub work_size: u64,
    /// Whether cuFFT allocates the work area itself (cufftSetAutoAllocation; the default).
    pub auto_allocation: bool,
    /// The work area cufftSetWorkArea gave (0: none).
    pub work_area: u64,
    /// The stream its work goes on (a stream handle; 0 is the legacy default stream).
    pub stream: u64,
    /// The vendor library's plan (NVIDIA's `cufftHandle`), `None` where the server computes
    /// the transforms itself.
    pub raw: Option<i32>,
}

impl Plan {
    pub fn new(device: i32, raw: Option<i32>) -> Plan {
        Plan { device, layout: None, work_size: 0, auto_allocation: true, work_area: 0, stream: 0, raw }
    }
}

pub struct FftRegistry {
    table: Mutex<HandleTable<Plan>>,
}

impl Default for FftRegistry {
    fn default() -> Self {
        FftRegistry { table: Mutex::new(HandleTable::new(HandleKind::CufftPlan, MAX_PLANS)) }
    }
}

impl FftRegistry {
    /// A new plan's handle. A fresh number past `i32::MAX` cannot be the program's `int`: the
    /// session has made two billion plans, and gets `MemoryAllocation` (cuFFT's
    /// `CUFFT_ALLOC_FAILED`) from then on.
    pub fn create(&self, plan: Plan, new: &NewHandle<'_>) -> Result<u64, CudaError> {
        let mut table = self.table.lock();
        if new.forced.is_none() && table.next_counter() > i32::MAX as u64 {
            return Err(CudaError::MemoryAllocation);
        }
        table.add(plan, new)
    }

    pub fn destroy(&self, handle: u64) -> Result<Plan, CudaError> {
        self.table.lock().remove(handle)
    }

    pub fn get(&self, handle: u64) -> Result<Plan, CudaError> {
        self.table.lock().get(handle).cloned()
    }

    /// Change a plan in one step; its new state.
    pub fn update(&self, handle: u64, change: impl FnOnce(&mut Plan)) -> Result<Plan, CudaError> {
        let mut table = self.table.lock();
        let plan = table.get_mut(handle)?;
        change(plan);
        Ok(plan.clone())
    }

    pub fn next_counter(&self) -> u64 {
        self.table.lock().next_counter()
    }

    pub fn set_next_counter(&self, next: u64) {
        self.table.lock().set_next_counter(next);
    }

    /// Destroy every plan (a device reset, the session's end).
    pub fn release_all(&self, backend: &dyn Backend) {
        let plans = self.table.lock().drain();
        if let Some(cufft) = backend.cufft() {
            for raw in plans.into_iter().filter_map(|(_, p)| p.raw) {
                cufft.destroy(raw);
            }
        }
    }
}
