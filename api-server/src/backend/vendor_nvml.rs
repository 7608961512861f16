//! NVIDIA's NVML (the driver's `libnvidia-ml.so.1`), which a GPU backend asks what the driver
//! API's attributes do not say (sensors, power, current clocks, utilisation, PCIe links, the
//! kernel driver's version), loaded at run time. Only the session's device is asked about,
//! found by its PCI bus id; nothing of other devices or processes is read.

use std::ffi::{c_char, c_uint, c_void};
use std::path::{Path, PathBuf};

use phos_protocol::types::{NvmlDescription, NvmlState, nvml_known};

/// The environment variable naming the libnvidia-ml file to load.
pub const NVML_LIB_VAR: &str = "PHOS_NVML_LIB";

/// NVML's soname.
const NVML_SONAME: &str = "libnvidia-ml.so.1";

type Device = *mut c_void;
type InitFn = unsafe extern "C" fn() -> i32;
type ByBusIdFn = unsafe extern "C" fn(*const c_char, *mut Device) -> i32;
type StringFn = unsafe extern "C" fn(*mut c_char, c_uint) -> i32;
type DeviceStringFn = unsafe extern "C" fn(Device, *mut c_char, c_uint) -> i32;
type DeviceU32Fn = unsafe extern "C" fn(Device, *mut c_uint) -> i32;
type DeviceI32Fn = unsafe extern "C" fn(Device, *mut i32) -> i32;
type DeviceArgU32Fn = unsafe extern "C" fn(Device, i32, *mut c_uint) -> i32;
type DeviceTwoU32Fn = unsafe extern "C" fn(Device, *mut c_uint, *mut c_uint) -> i32;
type DeviceU64Fn = unsafe extern "C" fn(Device, *mut u64) -> i32;
/// `nvmlUtilization_t`: gpu, memory.
type UtilizationFn = unsafe extern "C" fn(Device, *mut [c_uint; 2]) -> i32;

/// Why NVIDIA's NVML could not be used.
#[derive(Debug, thiserror::Error)]
pub enum NvmlOpenError {
    #[error("no libnvidia-ml found ({NVML_LIB_VAR}, the loader's paths)")]
    NotFound,
    #[error("{path}: {error}")]
    Load { path: PathBuf, error: libloading::Error },
    #[error("{path}: nvmlInit_v2 answered {code}")]
    Init { path: PathBuf, code: i32 },
}

/// NVIDIA's NVML, initialised, with the queries the server makes (each optional: an older
/// driver may lack one, which then stays unknown).
pub struct Nvml {
    pub path: PathBuf,
    _library: libloading::Library,
    by_bus_id: ByBusIdFn,
    driver_version: Option<StringFn>,
    serial: Option<DeviceStringFn>,
    minor_number: Option<DeviceU32Fn>,
    max_pcie_gen: Option<DeviceU32Fn>,
    max_pcie_width: Option<DeviceU32Fn>,
    brand: Option<DeviceI32Fn>,
    persistence: Option<DeviceI32Fn>,
    power_limit: Option<DeviceU32Fn>,
    enforced_power_limit: Option<DeviceU32Fn>,
    mig_mode: Option<DeviceTwoU32Fn>,
    utilization: Option<UtilizationFn>,
    temperature: Option<DeviceArgU32Fn>,
    power_usage: Option<DeviceU32Fn>,
    fan_speed: Option<DeviceU32Fn>,
    performance_state: Option<DeviceI32Fn>,
    clock: Option<DeviceArgU32Fn>,
    applications_clock: Option<DeviceArgU32Fn>,
    pcie_gen: Option<DeviceU32Fn>,
    pcie_width: Option<DeviceU32Fn>,
    pcie_throughput: Option<DeviceArgU32Fn>,
    clock_event_reasons: Option<DeviceU64Fn>,
}

// SAFETY: NVML's functions are thread-safe (NVIDIA documents NVML as thread-safe); the struct
// holds only the library and its entry points.
unsafe impl Send for Nvml {}
// SAFETY: as above.
unsafe impl Sync for Nvml {}

/// Where libnvidia-ml is looked for, in order: the file `PHOS_NVML_LIB` names; the loader's
/// own search by soname (its cache, where the driver installs it).
pub fn find_nvml() -> Vec<PathBuf> {
    let mut candidates = Vec::new();
    if let Some(p) = std::env::var_os(NVML_LIB_VAR) {
        candidates.push(PathBuf::from(p));
    }
    candidates.push(PathBuf::from(NVML_SONAME));
    candidates
}

/// `value` read by `f` when NVML answers success.
fn read<T: Default>(f: impl FnOnce(*mut T) -> i32) -> Option<T> {
    let mut value = T::default();
    (f(&mut value) == 0).then_some(value)
}

impl Nvml {
    /// Load and initialise the first libnvidia-ml of [`find_nvml`] that opens and initialises.
    pub fn open() -> Result<Nvml, NvmlOpenError> {
        let mut last = NvmlOpenError::NotFound;
        for path in find_nvml() {
            match Nvml::open_at(&path) {
                Ok(n) => return Ok(n),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    fn open_at(path: &Path) -> Result<Nvml, NvmlOpenError> {
        let err = |error| NvmlOpenError::Load { path: path.to_path_buf(), error };
        // SAFETY: a file named as NVIDIA's NVML; loading it runs its initialisers, which is
        // what using it means.
        let library = unsafe { libloading::Library::new(path) }.map_err(err)?;
        /// An entry point, with its prototype from nvml.h.
        fn get<T: Copy>(lib: &libloading::Library, name: &[u8]) -> Option<T> {
            // SAFETY: the callers name each function with its prototype in nvml.h.
            unsafe { lib.get::<T>(name) }.ok().map(|s| *s)
        }
        let init: InitFn = get(&library, b"nvmlInit_v2\0").ok_or(NvmlOpenError::NotFound)?;
        let by_bus_id: ByBusIdFn =
            get(&library, b"nvmlDeviceGetHandleByPciBusId_v2\0").ok_or(NvmlOpenError::NotFound)?;
        // SAFETY: nvmlInit_v2 takes nothing; NVML counts its initialisations.
        let code = unsafe { init() };
        if code != 0 {
            return Err(NvmlOpenError::Init { path: path.to_path_buf(), code });
        }
        Ok(Nvml {
            path: path.to_path_buf(),
            by_bus_id,
            driver_version: get(&library, b"nvmlSystemGetDriverVersion\0"),
            serial: get(&library, b"nvmlDeviceGetSerial\0"),
            minor_number: get(&library, b"nvmlDeviceGetMinorNumber\0"),
            max_pcie_gen: get(&library, b"nvmlDeviceGetMaxPcieLinkGeneration\0"),
            max_pcie_width: get(&library, b"nvmlDeviceGetMaxPcieLinkWidth\0"),
            brand: get(&library, b"nvmlDeviceGetBrand\0"),
            persistence: get(&library, b"nvmlDeviceGetPersistenceMode\0"),
            power_limit: get(&library, b"nvmlDeviceGetPowerManagementLimit\0"),
            enforced_power_limit: get(&library, b"nvmlDeviceGetEnforcedPowerLimit\0"),
            mig_mode: get(&library, b"nvmlDeviceGetMigMode\0"),
            utilization: get(&library, b"nvmlDeviceGetUtilizationRates\0"),
            temperature: get(&library, b"nvmlDeviceGetTemperature\0"),
            power_usage: get(&library, b"nvmlDeviceGetPowerUsage\0"),
            fan_speed: get(&library, b"nvmlDeviceGetFanSpeed\0"),
            performance_state: get(&library, b"nvmlDeviceGetPerformanceState\0"),
            clock: get(&library, b"nvmlDeviceGetClockInfo\0"),
            applications_clock: get(&library, b"nvmlDeviceGetApplicationsClock\0"),
            pcie_gen: get(&library, b"nvmlDeviceGetCurrPcieLinkGeneration\0"),
            pcie_width: get(&library, b"nvmlDeviceGetCurrPcieLinkWidth\0"),
            pcie_throughput: get(&library, b"nvmlDeviceGetPcieThroughput\0"),
            clock_event_reasons: get(&library, b"nvmlDeviceGetCurrentClocksEventReasons\0")
                .or_else(|| get(&library, b"nvmlDeviceGetCurrentClocksThrottleReasons\0")),
            _library: library,
        })
    }

    /// NVML's handle of the device at this PCI address.
    fn device(&self, domain: u32, bus: u32, device: u32) -> Option<Device> {
        let id = format!("{domain:08X}:{bus:02X}:{device:02X}.0\0");
        let mut handle: Device = std::ptr::null_mut();
        // SAFETY: a NUL-terminated bus id and a place for the handle.
        (unsafe { (self.by_bus_id)(id.as_ptr().cast(), &mut handle) } == 0).then_some(handle)
    }

    /// What NVML adds to the description of the device at `d`'s PCI address.
    pub fn describe(&self, d: &mut NvmlDescription) {
        let Some(dev) = self.device(d.pci_domain, d.pci_bus, d.pci_device) else { return };
        let mut known = 0;
        if let Some(f) = self.driver_version {
            let mut buf = [0u8; 80];
            // SAFETY: an 80-byte buffer, its length given.
            if unsafe { f(buf.as_mut_ptr().cast(), 80) } == 0 {
                d.driver_version[..79].copy_from_slice(&buf[..79]);
                known |= nvml_known::DRIVER_VERSION;
            }
        }
        if let Some(f) = self.serial {
            let mut buf = [0u8; 32];
            // SAFETY: a 32-byte buffer, its length given.
            if unsafe { f(dev, buf.as_mut_ptr().cast(), 32) } == 0 {
                d.serial[..31].copy_from_slice(&buf[..31]);
                known |= nvml_known::SERIAL;
            }
        }
        let u32_of = |f: Option<DeviceU32Fn>| {
            // SAFETY: a device handle of NVML's and a place for the value.
            f.and_then(|f| read(|p| unsafe { f(dev, p) }))
        };
        let i32_of = |f: Option<DeviceI32Fn>| {
            // SAFETY: as above.
            f.and_then(|f| read(|p| unsafe { f(dev, p) }))
        };
        if let Some(v) = u32_of(self.minor_number) {
            (d.minor_number, known) = (v, known | nvml_known::MINOR_NUMBER);
        }
        if let (Some(g), Some(w)) = (u32_of(self.max_pcie_gen), u32_of(self.max_pcie_width)) {
            (d.max_pcie_gen, d.max_pcie_width, known) = (g, w, known | nvml_known::MAX_PCIE_LINK);
        }
        if let Some(v) = i32_of(self.brand) {
            (d.brand, known) = (v, known | nvml_known::BRAND);
        }
        if let Some(v) = i32_of(self.persistence) {
            (d.persistence, known) = (v, known | nvml_known::PERSISTENCE);
        }
        if let (Some(l), Some(e)) = (u32_of(self.power_limit), u32_of(self.enforced_power_limit)) {
            (d.power_limit_mw, d.enforced_power_limit_mw, known) = (l, e, known | nvml_known::POWER_LIMIT);
        }
        if let Some(f) = self.mig_mode {
            let (mut current, mut pending) = (0, 0);
            // SAFETY: a device handle of NVML's and two places for the modes.
            if unsafe { f(dev, &mut current, &mut pending) } == 0 {
                (d.mig_current, d.mig_pending, known) = (current, pending, known | nvml_known::MIG_MODE);
            }
        }
        d.known |= known;
    }

    /// What NVML says of the device at `d`'s PCI address now (its memory is the session's,
    /// set by the caller; BAR1 use is the whole device's, other tenants' included, and is not
    /// read).
    pub fn sample(&self, d: &NvmlDescription, s: &mut NvmlState) {
        let Some(dev) = self.device(d.pci_domain, d.pci_bus, d.pci_device) else { return };
        let mut known = 0;
        let u32_of = |f: Option<DeviceU32Fn>| {
            // SAFETY: a device handle of NVML's and a place for the value.
            f.and_then(|f| read(|p| unsafe { f(dev, p) }))
        };
        let arg_of = |f: Option<DeviceArgU32Fn>, arg: i32| {
            // SAFETY: as above, with the query's enum argument.
            f.and_then(|f| read(|p| unsafe { f(dev, arg, p) }))
        };
        if let Some(f) = self.utilization {
            // SAFETY: a device handle of NVML's and a place for the struct.
            if let Some([gpu, memory]) = read(|p| unsafe { f(dev, p) }) {
                (s.util_gpu, s.util_memory, known) = (gpu, memory, known | nvml_known::UTILIZATION);
            }
        }
        if let Some(v) = arg_of(self.temperature, 0) {
            (s.temperature_c, known) = (v, known | nvml_known::TEMPERATURE);
        }
        if let Some(v) = u32_of(self.power_usage) {
            (s.power_mw, known) = (v, known | nvml_known::POWER_USAGE);
        }
        if let Some(v) = u32_of(self.fan_speed) {
            (s.fan_percent, known) = (v, known | nvml_known::FAN);
        }
        if let Some(f) = self.performance_state {
            // SAFETY: a device handle of NVML's and a place for the state.
            if let Some(v) = read(|p| unsafe { f(dev, p) }) {
                (s.pstate, known) = (v, known | nvml_known::PSTATE);
            }
        }
        if let (Some(g), Some(sm), Some(m)) = (arg_of(self.clock, 0), arg_of(self.clock, 1), arg_of(self.clock, 2)) {
            (s.clock_graphics_mhz, s.clock_sm_mhz, s.clock_mem_mhz) = (g, sm, m);
            s.clock_video_mhz = arg_of(self.clock, 3).unwrap_or(0);
            known |= nvml_known::CLOCKS;
        }
        if let (Some(g), Some(m)) = (arg_of(self.applications_clock, 0), arg_of(self.applications_clock, 2)) {
            (s.app_clock_graphics_mhz, s.app_clock_mem_mhz, known) = (g, m, known | nvml_known::APPLICATION_CLOCKS);
        }
        if let (Some(g), Some(w)) = (u32_of(self.pcie_gen), u32_of(self.pcie_width)) {
            (s.pcie_gen, s.pcie_width, known) = (g, w, known | nvml_known::PCIE_LINK);
        }
        if let (Some(tx), Some(rx)) = (arg_of(self.pcie_throughput, 0), arg_of(self.pcie_throughput, 1)) {
            (s.pcie_tx_kbs, s.pcie_rx_kbs, known) = (tx, rx, known | nvml_known::PCIE_THROUGHPUT);
        }
        if let Some(f) = self.clock_event_reasons {
            // SAFETY: a device handle of NVML's and a place for the mask.
            if let Some(v) = read(|p| unsafe { f(dev, p) }) {
                (s.clock_event_reasons, known) = (v, known | nvml_known::CLOCK_EVENT_REASONS);
            }
        }
        s.known |= known;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_that_is_no_library_is_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("libnvidia-ml.so.1");
        std::fs::write(&path, b"not a library").unwrap();
        let Err(e) = Nvml::open_at(&path) else { panic!("a text file opened as NVML") };
        assert!(e.to_string().starts_with(&path.display().to_string()), "{e}");
    }
}
