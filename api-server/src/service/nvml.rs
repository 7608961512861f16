//! NVML (`spec/nvml.lapis`): what a tenant may know of its devices. The server answers two
//! questions per device, its description and its current state, in fixed-size replies; the
//! guest writes the program's structs from them. A device handle is the kind `nvml_device`'s
//! tag with the device's index plus one as its number: a pure function of the index, checked
//! here on every call, so it needs no table and a restored session keeps its handles.
//!
//! The description comes from the backend's device properties (the driver API's attributes on
//! a GPU, the emu device's own description on `emu`). Memory is the session's own: used is what
//! the session holds on the device, total the device's memory. Sensors, current clocks and
//! utilisation are known on `emu` (an idle device at its full clocks); on a GPU they come from
//! NVIDIA's NVML, asked about the session's device only (`backend::vendor_nvml`), and are not
//! supported without it.

use phos_protocol::apis::HandleKind;
use phos_protocol::handle_tag::{NUMBER_MASK, tag_of};
use phos_protocol::nvml::*;
use phos_protocol::types::{NvmlDescription, NvmlState, nvml_known};

use super::{CallCx, Session};
use crate::dispatch::cudart::CudartService;
use crate::dispatch::nvml::NvmlService;

/// `CUdevice_attribute`s the description reads.
mod attr {
    pub const CLOCK_RATE: i32 = 13;
    pub const COMPUTE_MODE: i32 = 20;
    pub const ECC_ENABLED: i32 = 32;
    pub const PCI_BUS_ID: i32 = 33;
    pub const PCI_DEVICE_ID: i32 = 34;
    pub const MEMORY_CLOCK_RATE: i32 = 36;
    pub const PCI_DOMAIN_ID: i32 = 50;
    pub const COMPUTE_CAPABILITY_MAJOR: i32 = 75;
    pub const COMPUTE_CAPABILITY_MINOR: i32 = 76;
}

/// The handle of the session's device `index`.
pub fn device_handle(index: u32) -> u64 {
    tag_of(HandleKind::NvmlDevice) | (u64::from(index) + 1)
}

impl Session {
    /// The device index a handle names, if it is one of the session's devices.
    fn nvml_device(&self, handle: u64, function: &str) -> Result<i32, NvmlReturn> {
        let index = (handle & !NUMBER_MASK == tag_of(HandleKind::NvmlDevice))
            .then(|| (handle & NUMBER_MASK).checked_sub(1))
            .flatten()
            .and_then(|i| i32::try_from(i).ok())
            .filter(|&i| i < self.backend().device_count());
        index.ok_or_else(|| {
            crate::guest_warn!(self.id, "{function}: {handle:#x} is not a device handle of the session");
            NvmlReturn::INVALID_ARGUMENT
        })
    }

    /// The session's device memory on `device`.
    fn memory_on(&self, device: i32) -> u64 {
        let allocations = self.objects.memory.allocations();
        allocations.iter().filter(|a| a.device == device).map(|a| a.size).sum()
    }
}

/// A string into a NUL-padded field (cut to leave its NUL).
fn fill(field: &mut [u8], text: &str) {
    let n = text.len().min(field.len().saturating_sub(1));
    field[..n].copy_from_slice(&text.as_bytes()[..n]);
}

/// kHz (CUDA's clock attributes) to MHz.
fn mhz(khz: i32) -> u32 {
    u32::try_from(khz).unwrap_or(0) / 1000
}

impl NvmlService for Session {
    type Cx = CallCx;

    /// NVML names no device memory; a range is checked as the runtime checks one all the same.
    fn check_device_range(&self, cx: &CallCx, addr: u64, len: u64, null_ok: bool) -> Result<(), NvmlReturn> {
        CudartService::check_device_range(self, cx, addr, len, null_ok).map_err(|_| NvmlReturn::INVALID_ARGUMENT)
    }

    fn max_reply_bytes(&self) -> u64 {
        self.max_reply
    }

    fn nvml_device_get_count_v2(
        &self,
        _: &CallCx,
        _: NvmlDeviceGetCountV2Request,
    ) -> Result<NvmlDeviceGetCountV2Reply, NvmlReturn> {
        let count = u32::try_from(self.backend().device_count()).unwrap_or(0);
        Ok(NvmlDeviceGetCountV2Reply { deviceCount: count })
    }

    fn nvml_device_get_handle_by_index_v2(
        &self,
        _: &CallCx,
        req: NvmlDeviceGetHandleByIndexV2Request,
    ) -> Result<NvmlDeviceGetHandleByIndexV2Reply, NvmlReturn> {
        if i64::from(req.index) >= i64::from(self.backend().device_count()) {
            return Err(NvmlReturn::INVALID_ARGUMENT);
        }
        Ok(NvmlDeviceGetHandleByIndexV2Reply { device: device_handle(req.index) })
    }

    fn phos_nvml_describe(
        &self,
        _: &CallCx,
        req: PhosNvmlDescribeRequest,
    ) -> Result<PhosNvmlDescribeReply, NvmlReturn> {
        let device = self.nvml_device(req.device, "phosNvmlDescribe")?;
        let backend = self.backend();
        let props = backend.device_properties(device).map_err(|e| {
            tracing::warn!(session = self.id, "NVML: the properties of device {device}: {e}");
            NvmlReturn::UNKNOWN
        })?;
        let mut d = NvmlDescription {
            known: nvml_known::NAME
                | nvml_known::UUID
                | nvml_known::PCI
                | nvml_known::COMPUTE_CAPABILITY
                | nvml_known::COMPUTE_MODE
                | nvml_known::ECC
                | nvml_known::MAX_CLOCKS
                | nvml_known::CUDA_DRIVER_VERSION,
            total_memory: props.total_global_mem,
            index: device as u32,
            cc_major: props.attr(attr::COMPUTE_CAPABILITY_MAJOR),
            cc_minor: props.attr(attr::COMPUTE_CAPABILITY_MINOR),
            pci_domain: props.attr(attr::PCI_DOMAIN_ID) as u32,
            pci_bus: props.attr(attr::PCI_BUS_ID) as u32,
            pci_device: props.attr(attr::PCI_DEVICE_ID) as u32,
            compute_mode: props.attr(attr::COMPUTE_MODE),
            ecc_enabled: i32::from(props.attr(attr::ECC_ENABLED) != 0),
            max_sm_clock_mhz: mhz(props.attr(attr::CLOCK_RATE)),
            max_mem_clock_mhz: mhz(props.attr(attr::MEMORY_CLOCK_RATE)),
            cuda_driver_version: backend.driver_version(),
            uuid: props.uuid,
            ..NvmlDescription::default()
        };
        fill(&mut d.name, &props.name);
        if let Some(nvml) = backend.nvml() {
            nvml.describe(&mut d);
        }
        if backend.name() == "emu" {
            // The emu device: no MIG, no persistence daemon, NVML's brand for "unknown".
            d.known |= nvml_known::MIG_MODE | nvml_known::PERSISTENCE | nvml_known::BRAND;
        }
        Ok(PhosNvmlDescribeReply { description: d })
    }

    fn phos_nvml_sample(&self, _: &CallCx, req: PhosNvmlSampleRequest) -> Result<PhosNvmlSampleReply, NvmlReturn> {
        let device = self.nvml_device(req.device, "phosNvmlSample")?;
        let backend = self.backend();
        let props = backend.device_properties(device).map_err(|e| {
            tracing::warn!(session = self.id, "NVML: the properties of device {device}: {e}");
            NvmlReturn::UNKNOWN
        })?;
        let total = props.total_global_mem;
        let used = self.memory_on(device);
        let mut s = NvmlState {
            known: nvml_known::MEMORY,
            memory_total: total,
            memory_used: used,
            memory_free: total.saturating_sub(used),
            ..NvmlState::default()
        };
        if let Some(nvml) = backend.nvml() {
            let at = NvmlDescription {
                pci_domain: props.attr(attr::PCI_DOMAIN_ID) as u32,
                pci_bus: props.attr(attr::PCI_BUS_ID) as u32,
                pci_device: props.attr(attr::PCI_DEVICE_ID) as u32,
                ..NvmlDescription::default()
            };
            nvml.sample(&at, &mut s);
        }
        if backend.name() == "emu" {
            // The emu device runs at its described clocks, in its highest performance state,
            // never held back, and reports no utilisation: stable values a test can compare.
            let (sm, mem) = (mhz(props.attr(attr::CLOCK_RATE)), mhz(props.attr(attr::MEMORY_CLOCK_RATE)));
            s.known |= nvml_known::UTILIZATION
                | nvml_known::PSTATE
                | nvml_known::CLOCKS
                | nvml_known::APPLICATION_CLOCKS
                | nvml_known::CLOCK_EVENT_REASONS;
            (s.clock_graphics_mhz, s.clock_sm_mhz, s.clock_mem_mhz) = (sm, sm, mem);
            (s.app_clock_graphics_mhz, s.app_clock_mem_mhz) = (sm, mem);
        }
        Ok(PhosNvmlSampleReply { state: s })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_device_handle_is_its_index_under_the_kinds_tag() {
        assert_eq!(device_handle(0) & NUMBER_MASK, 1);
        assert_eq!(device_handle(0) & !NUMBER_MASK, tag_of(HandleKind::NvmlDevice));
        assert_ne!(device_handle(0), device_handle(1));
    }

    #[test]
    fn strings_are_cut_to_leave_their_nul() {
        let mut field = [0xffu8; 4];
        fill(&mut field, "abcdef");
        assert_eq!(&field, b"abc\xff");
        let mut field = [0u8; 8];
        fill(&mut field, "ab");
        assert_eq!(&field, b"ab\0\0\0\0\0\0");
    }
}
