//! How NVML's exports go through the guest core: a call's status is its return value; the
//! runtime's last error is left alone.

use phos_protocol::apis::Function;
use phos_protocol::nvml::{self, FunctionId, NvmlReturn};

use crate::runtime;
pub use crate::runtime::call;

/// Run one NVML function; a panic becomes `NVML_ERROR_UNKNOWN`. A refusal
/// (`NVML_ERROR_NOT_SUPPORTED`, from the server or the guest) is logged once by name.
pub fn api_call(id: FunctionId, f: impl FnOnce() -> Result<(), NvmlReturn>) -> i32 {
    match runtime::catch_panic(id.name(), f) {
        Ok(()) => nvml::SUCCESS,
        Err(e) => {
            if e == nvml::NOT_SUPPORTED {
                runtime::log_refusal_once(Function::Nvml(id), nvml::NOT_SUPPORTED.name());
            }
            e.0
        }
    }
}

/// Exports that change a device, the system or MIG instances: a tenant changes nothing that
/// other tenants share, so these answer `NVML_ERROR_NO_PERMISSION`, as NVML does for a user
/// without the rights.
const SETTER_PREFIXES: &[&str] = &[
    "nvmlDeviceSet",
    "nvmlDeviceReset",
    "nvmlDeviceClear",
    "nvmlSystemSet",
    "nvmlUnitSet",
    "nvmlVgpuInstanceSet",
    "nvmlVgpuInstanceClear",
    "nvmlGpmSetStreamingEnabled",
    "nvmlSetVgpuVersion",
    "nvmlDeviceCreateGpuInstance",
    "nvmlGpuInstanceCreateComputeInstance",
    "nvmlGpuInstanceDestroy",
    "nvmlComputeInstanceDestroy",
    "nvmlDeviceModifyDrainState",
    "nvmlDeviceRemoveGpu",
    "nvmlDeviceDiscoverGpus",
];

/// Whether `name` is an export that changes what it is asked about (answered with
/// `NVML_ERROR_NO_PERMISSION`).
pub fn is_setter(name: &str) -> bool {
    SETTER_PREFIXES.iter().any(|p| name.starts_with(p))
}

/// A function Phos does not carry: logged once, answers `NVML_ERROR_NO_PERMISSION` for a
/// setter and `NVML_ERROR_NOT_SUPPORTED` for anything else.
pub fn unsupported(id: FunctionId) -> i32 {
    let answer = if is_setter(id.name()) { NvmlReturn::NO_PERMISSION } else { nvml::NOT_SUPPORTED };
    runtime::log_unsupported_once(Function::Nvml(id), answer.name());
    answer.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn setters_are_told_from_queries_by_name() {
        for setter in ["nvmlDeviceSetPersistenceMode", "nvmlDeviceResetGpuLockedClocks", "nvmlDeviceSetMigMode"] {
            assert!(is_setter(setter), "{setter}");
        }
        for query in ["nvmlDeviceGetPowerUsage", "nvmlEventSetCreate", "nvmlDeviceGetThermalSettings"] {
            assert!(!is_setter(query), "{query}");
        }
    }
}
