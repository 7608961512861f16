//! The NVML queries the spec marks `implemented_by(guest)`: each asks the server for the
//! device's description or state (`phosNvmlDescribe`, `phosNvmlSample`, which also check the
//! handle) and writes the program's struct or string in NVML's layout, checking its pointers
//! and lengths as NVML does (a null output is `NVML_ERROR_INVALID_ARGUMENT`, a buffer too short
//! for the answer `NVML_ERROR_INSUFFICIENT_SIZE`). What the server does not know answers
//! `NVML_ERROR_NOT_SUPPORTED`.

use std::ffi::{CStr, CString, c_char, c_void};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};

use phos_protocol::nvml::{
    self, FunctionId as F, NvmlDeviceGetCountV2Request, NvmlDeviceGetHandleByIndexV2Request, NvmlReturn,
    PhosNvmlDescribeRequest, PhosNvmlSampleRequest,
};
use phos_protocol::types::{NvmlDescription, NvmlState, nvml_known};

use super::rt;
use super::stubs::HandWritten;

/// How many times the process initialised NVML without shutting it down.
static INIT_COUNT: AtomicU32 = AtomicU32::new(0);

/// `NVML_VALUE_NOT_AVAILABLE`: a process's GPU and compute instance outside MIG.
const VALUE_NOT_AVAILABLE: u32 = u32::MAX;
/// `NVML_NVLINK_MAX_LINKS`.
const NVLINK_MAX_LINKS: u32 = 18;
/// `nvmlMemory_v2`: `NVML_STRUCT_VERSION(Memory, 2)`, the struct's size with its version.
const MEMORY_V2: u32 = 40 | (2 << 24);

/// `nvmlClockType_t`.
const CLOCK_GRAPHICS: i32 = 0;
const CLOCK_SM: i32 = 1;
const CLOCK_MEM: i32 = 2;
const CLOCK_VIDEO: i32 = 3;
/// `nvmlClockId_t`.
const CLOCK_ID_CURRENT: i32 = 0;
const CLOCK_ID_APP_CLOCK_TARGET: i32 = 1;
const CLOCK_ID_APP_CLOCK_DEFAULT: i32 = 2;
const CLOCK_ID_CUSTOMER_BOOST_MAX: i32 = 3;
/// `NVML_P2P_STATUS_OK`, `NVML_P2P_STATUS_NOT_SUPPORTED`.
const P2P_OK: i32 = 0;
const P2P_NOT_SUPPORTED: i32 = 5;
/// `NVML_TOPOLOGY_INTERNAL`.
const TOPOLOGY_INTERNAL: i32 = 0;

type Result<T> = std::result::Result<T, NvmlReturn>;

/// `NVML_ERROR_INVALID_ARGUMENT`, `NVML_ERROR_INSUFFICIENT_SIZE`, `NVML_ERROR_NOT_FOUND`.
const INVALID: NvmlReturn = NvmlReturn::INVALID_ARGUMENT;
const TOO_SMALL: NvmlReturn = NvmlReturn::INSUFFICIENT_SIZE;
const NOT_FOUND: NvmlReturn = NvmlReturn::NOT_FOUND;

fn initialized() -> Result<()> {
    if INIT_COUNT.load(Ordering::Acquire) == 0 { Err(NvmlReturn::UNINITIALIZED) } else { Ok(()) }
}

/// The server's description of `device` (which it checks is one of the session's).
fn describe(device: *mut c_void) -> Result<NvmlDescription> {
    initialized()?;
    Ok(rt::call(&PhosNvmlDescribeRequest { device: device as u64 })?.description)
}

/// The server's current state of `device`.
fn sample(device: *mut c_void) -> Result<NvmlState> {
    initialized()?;
    Ok(rt::call(&PhosNvmlSampleRequest { device: device as u64 })?.state)
}

/// `value` if the server knows it (`bit` of `known`), else `NVML_ERROR_NOT_SUPPORTED`.
fn known<T>(known: u64, bit: u64, value: T) -> Result<T> {
    if known & bit != 0 { Ok(value) } else { Err(nvml::NOT_SUPPORTED) }
}

/// The session's devices' handles, in index order.
fn handles() -> Result<Vec<u64>> {
    initialized()?;
    let count = rt::call(&NvmlDeviceGetCountV2Request {})?.deviceCount;
    (0..count).map(|index| Ok(rt::call(&NvmlDeviceGetHandleByIndexV2Request { index })?.device)).collect()
}

/// Write `value` to the program's `p`: `NVML_ERROR_INVALID_ARGUMENT` when null.
///
/// # Safety
/// `p` must be null or valid for a write of `T`.
unsafe fn put<T>(p: *mut T, value: T) -> Result<()> {
    if p.is_null() {
        return Err(INVALID);
    }
    // SAFETY: not null, and writable (this function's contract); unaligned as the program's
    // struct fields may be.
    unsafe { p.write_unaligned(value) };
    Ok(())
}

/// Copy `text` and its NUL into the program's `dst` of `length` bytes: NULL is
/// `NVML_ERROR_INVALID_ARGUMENT`, too short `NVML_ERROR_INSUFFICIENT_SIZE`.
///
/// # Safety
/// `dst` must be null or writable for `length` bytes.
unsafe fn put_str(dst: *mut c_char, length: u32, text: &str) -> Result<()> {
    if dst.is_null() {
        return Err(INVALID);
    }
    let needed = text.len() + 1;
    if usize::try_from(length).is_ok_and(|l| l < needed) {
        return Err(TOO_SMALL);
    }
    let mut bytes = Vec::with_capacity(needed);
    bytes.extend_from_slice(text.as_bytes());
    bytes.push(0);
    // SAFETY: `dst` holds `length >= needed` bytes (checked), and `bytes` is not in it.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), dst.cast::<u8>(), needed) };
    Ok(())
}

/// A NUL-padded string of a description.
fn padded(bytes: &[u8]) -> &str {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    std::str::from_utf8(bytes.get(..end).unwrap_or(&[])).unwrap_or("")
}

/// A device's UUID as NVML writes it (`GPU-` and the 16 bytes in 8-4-4-4-12 hex digits).
fn uuid_text(uuid: &[u8; 16]) -> String {
    let hex: Vec<String> = uuid.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        hex[0..4].concat(),
        hex[4..6].concat(),
        hex[6..8].concat(),
        hex[8..10].concat(),
        hex[10..16].concat()
    )
}

/// The PCI bus id with an 8-digit domain (`NVML_DEVICE_PCI_BUS_ID_FMT`) and the legacy 4-digit one.
fn bus_ids(d: &NvmlDescription) -> (String, String) {
    let tail = format!("{:02X}:{:02X}.0", d.pci_bus, d.pci_device);
    (format!("{:08X}:{tail}", d.pci_domain), format!("{:04X}:{tail}", d.pci_domain & 0xffff))
}

/// A bus id as a program may write it (any case, 4 or 8 domain digits): (domain, bus, device).
fn parse_bus_id(text: &str) -> Option<(u32, u32, u32)> {
    let text = text.trim();
    let (domain, rest) = text.split_once(':')?;
    let (bus, rest) = rest.split_once(':')?;
    let device = rest.split('.').next()?;
    Some((
        u32::from_str_radix(domain, 16).ok()?,
        u32::from_str_radix(bus, 16).ok()?,
        u32::from_str_radix(device, 16).ok()?,
    ))
}

/// `nvmlPciInfo_t` (NVML 2 and 3): busIdLegacy[16], domain, bus, device, pciDeviceId,
/// pciSubSystemId, busId[32]: 68 bytes.
///
/// # Safety
/// `pci` must be null or writable for 68 bytes.
unsafe fn write_pci(pci: *mut c_void, d: &NvmlDescription) -> Result<()> {
    if pci.is_null() {
        return Err(INVALID);
    }
    let mut out = [0u8; 68];
    let (bus_id, legacy) = bus_ids(d);
    out[..legacy.len().min(15)].copy_from_slice(&legacy.as_bytes()[..legacy.len().min(15)]);
    for (i, v) in [d.pci_domain, d.pci_bus, d.pci_device, d.pci_device_id, d.pci_subsystem_id].iter().enumerate() {
        out[16 + 4 * i..20 + 4 * i].copy_from_slice(&v.to_ne_bytes());
    }
    out[36..36 + bus_id.len().min(31)].copy_from_slice(&bus_id.as_bytes()[..bus_id.len().min(31)]);
    // SAFETY: `pci` is writable for the struct's 68 bytes (this function's contract).
    unsafe { std::ptr::copy_nonoverlapping(out.as_ptr(), pci.cast::<u8>(), out.len()) };
    Ok(())
}

/// NVML 1's `nvmlPciInfo_t`: busId[16], domain, bus, device, pciDeviceId, pciSubSystemId and
/// four reserved words: 52 bytes.
///
/// # Safety
/// `pci` must be null or writable for 52 bytes.
unsafe fn write_pci_v1(pci: *mut c_void, d: &NvmlDescription) -> Result<()> {
    if pci.is_null() {
        return Err(INVALID);
    }
    let mut out = [0u8; 52];
    let legacy = bus_ids(d).1;
    out[..legacy.len().min(15)].copy_from_slice(&legacy.as_bytes()[..legacy.len().min(15)]);
    for (i, v) in [d.pci_domain, d.pci_bus, d.pci_device, d.pci_device_id, d.pci_subsystem_id].iter().enumerate() {
        out[16 + 4 * i..20 + 4 * i].copy_from_slice(&v.to_ne_bytes());
    }
    // SAFETY: `pci` is writable for the struct's 52 bytes (this function's contract).
    unsafe { std::ptr::copy_nonoverlapping(out.as_ptr(), pci.cast::<u8>(), out.len()) };
    Ok(())
}

/// The process list a tenant sees: this process alone, with its session's memory on the
/// device, once it holds some there. `entry` writes one entry in the caller's layout of `size`
/// bytes. The count is in/out as NVML's: with fewer places than entries it is set to the
/// number needed and the answer is `NVML_ERROR_INSUFFICIENT_SIZE`.
///
/// # Safety
/// `count` must be null or writable, `infos` null or writable for `*count` entries of `size`
/// bytes.
unsafe fn processes(
    device: *mut c_void,
    count: *mut u32,
    infos: *mut c_void,
    size: usize,
    graphics: bool,
) -> Result<()> {
    if count.is_null() {
        return Err(INVALID);
    }
    let state = sample(device)?;
    let used = known(state.known, nvml_known::MEMORY, state.memory_used)?;
    let ours = !graphics && used > 0;
    // SAFETY: `count` is not null and readable (this function's contract).
    let room = unsafe { count.read_unaligned() };
    let n = u32::from(ours);
    if room < n {
        // SAFETY: as above, writable.
        unsafe { count.write_unaligned(n) };
        return Err(TOO_SMALL);
    }
    if ours {
        if infos.is_null() {
            return Err(INVALID);
        }
        let mut entry = [0u8; 24];
        entry[0..4].copy_from_slice(&std::process::id().to_ne_bytes());
        entry[8..16].copy_from_slice(&used.to_ne_bytes());
        entry[16..20].copy_from_slice(&VALUE_NOT_AVAILABLE.to_ne_bytes());
        entry[20..24].copy_from_slice(&VALUE_NOT_AVAILABLE.to_ne_bytes());
        // SAFETY: `infos` has room for `room >= 1` entries of `size <= 24` bytes.
        unsafe { std::ptr::copy_nonoverlapping(entry.as_ptr(), infos.cast::<u8>(), size) };
    }
    // SAFETY: as above.
    unsafe { count.write_unaligned(n) };
    Ok(())
}

/// A handle of the session whose description satisfies `wanted`.
///
/// # Safety
/// `device` must be null or writable.
unsafe fn find_device(device: *mut *mut c_void, wanted: impl Fn(&NvmlDescription) -> bool) -> Result<()> {
    if device.is_null() {
        return Err(INVALID);
    }
    for handle in handles()? {
        let d = describe(handle as *mut c_void)?;
        if wanted(&d) {
            // SAFETY: not null, writable (this function's contract).
            return unsafe { put(device, handle as *mut c_void) };
        }
    }
    Err(NOT_FOUND)
}

/// A program's C string, or `NVML_ERROR_INVALID_ARGUMENT` for NULL.
///
/// # Safety
/// `s` must be null or a NUL-terminated string.
unsafe fn text<'a>(s: *const c_char) -> Result<&'a str> {
    if s.is_null() {
        return Err(INVALID);
    }
    // SAFETY: NUL-terminated (this function's contract).
    unsafe { CStr::from_ptr(s) }.to_str().map_err(|_| INVALID)
}

/// Status texts as C strings, built once from the spec's table.
fn error_texts() -> &'static Vec<(i32, CString)> {
    static TEXTS: OnceLock<Vec<(i32, CString)>> = OnceLock::new();
    TEXTS.get_or_init(|| {
        (0..1000)
            .map(NvmlReturn)
            .filter(|r| r.name() != "unrecognized error code")
            .filter_map(|r| Some((r.0, CString::new(r.text(12)).ok()?)))
            .collect()
    })
}

/// The implementation of [`HandWritten`].
pub struct Hand;

impl HandWritten for Hand {
    fn nvml_initialized() -> Result<i128> {
        Ok(i128::from(INIT_COUNT.load(Ordering::Acquire) != 0))
    }

    // ---- Initialisation: a count in the guest; the first init reaches the session.

    unsafe fn nvmlInit_v2() -> i32 {
        rt::api_call(F::NvmlInitV2, || {
            // Opens the session (NVML_ERROR_DRIVER_NOT_LOADED without a router), as NVML's
            // init fails without a driver.
            rt::call(&NvmlDeviceGetCountV2Request {})?;
            INIT_COUNT.fetch_add(1, Ordering::AcqRel);
            Ok(())
        })
    }

    unsafe fn nvmlInit() -> i32 {
        // SAFETY: no arguments.
        unsafe { Self::nvmlInit_v2() }
    }

    unsafe fn nvmlInitWithFlags(_flags: u32) -> i32 {
        // SAFETY: no arguments; the flags (no GPUs allowed, no attach) change nothing here.
        unsafe { Self::nvmlInit_v2() }
    }

    unsafe fn nvmlShutdown() -> i32 {
        rt::api_call(F::NvmlShutdown, || {
            INIT_COUNT
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
                .map(|_| ())
                .map_err(|_| NvmlReturn::UNINITIALIZED)
        })
    }

    unsafe fn nvmlErrorString(result: i32) -> *const c_char {
        static UNKNOWN: &CStr = c"Unknown Error";
        error_texts().iter().find(|(code, _)| *code == result).map_or(UNKNOWN.as_ptr(), |(_, t)| t.as_ptr())
    }

    // ---- System

    unsafe fn nvmlSystemGetDriverVersion(version: *mut c_char, length: u32) -> i32 {
        rt::api_call(F::NvmlSystemGetDriverVersion, || {
            let first = *handles()?.first().ok_or(nvml::NOT_SUPPORTED)?;
            let d = describe(first as *mut c_void)?;
            let text = known(d.known, nvml_known::DRIVER_VERSION, padded(&d.driver_version).to_owned())?;
            // SAFETY: the program's buffer of `length` bytes.
            unsafe { put_str(version, length, &text) }
        })
    }

    unsafe fn nvmlSystemGetNVMLVersion(version: *mut c_char, length: u32) -> i32 {
        rt::api_call(F::NvmlSystemGetNVMLVersion, || {
            let first = *handles()?.first().ok_or(nvml::NOT_SUPPORTED)?;
            let d = describe(first as *mut c_void)?;
            let driver = known(d.known, nvml_known::DRIVER_VERSION, padded(&d.driver_version).to_owned())?;
            let cuda = known(d.known, nvml_known::CUDA_DRIVER_VERSION, d.cuda_driver_version)?;
            // NVML's version is the CUDA major version it ships with and the driver's.
            // SAFETY: the program's buffer of `length` bytes.
            unsafe { put_str(version, length, &format!("{}.{driver}", cuda / 1000)) }
        })
    }

    unsafe fn nvmlSystemGetCudaDriverVersion(cuda_driver_version: *mut i32) -> i32 {
        rt::api_call(F::NvmlSystemGetCudaDriverVersion, || {
            let first = *handles()?.first().ok_or(nvml::NOT_SUPPORTED)?;
            let d = describe(first as *mut c_void)?;
            // SAFETY: the program's out parameter.
            unsafe { put(cuda_driver_version, known(d.known, nvml_known::CUDA_DRIVER_VERSION, d.cuda_driver_version)?) }
        })
    }

    unsafe fn nvmlSystemGetCudaDriverVersion_v2(cuda_driver_version: *mut i32) -> i32 {
        // SAFETY: the same contract.
        unsafe { Self::nvmlSystemGetCudaDriverVersion(cuda_driver_version) }
    }

    unsafe fn nvmlSystemGetProcessName(pid: u32, name: *mut c_char, length: u32) -> i32 {
        rt::api_call(F::NvmlSystemGetProcessName, || {
            initialized()?;
            // A tenant's GPU processes are its own: any other pid is not one NVML knows.
            if pid != std::process::id() {
                return Err(NOT_FOUND);
            }
            let cmdline = std::fs::read("/proc/self/cmdline").map_err(|_| NvmlReturn::UNKNOWN)?;
            let first = cmdline.split(|&b| b == 0).next().unwrap_or(&[]);
            // SAFETY: the program's buffer of `length` bytes.
            unsafe { put_str(name, length, &String::from_utf8_lossy(first)) }
        })
    }

    // ---- Handles

    unsafe fn nvmlDeviceGetHandleByUUID(uuid: *const c_char, device: *mut *mut c_void) -> i32 {
        rt::api_call(F::NvmlDeviceGetHandleByUUID, || {
            // SAFETY: the program's string.
            let wanted = unsafe { text(uuid) }?.to_ascii_lowercase();
            // SAFETY: the program's out parameter.
            unsafe {
                find_device(device, |d| {
                    d.known & nvml_known::UUID != 0 && uuid_text(&d.uuid).to_ascii_lowercase() == wanted
                })
            }
        })
    }

    unsafe fn nvmlDeviceGetHandleByPciBusId_v2(pci_bus_id: *const c_char, device: *mut *mut c_void) -> i32 {
        rt::api_call(F::NvmlDeviceGetHandleByPciBusIdV2, || {
            // SAFETY: the program's string.
            let wanted = parse_bus_id(unsafe { text(pci_bus_id) }?).ok_or(INVALID)?;
            // SAFETY: the program's out parameter.
            unsafe {
                find_device(device, |d| {
                    d.known & nvml_known::PCI != 0 && (d.pci_domain, d.pci_bus, d.pci_device) == wanted
                })
            }
        })
    }

    unsafe fn nvmlDeviceGetHandleBySerial(serial: *const c_char, device: *mut *mut c_void) -> i32 {
        rt::api_call(F::NvmlDeviceGetHandleBySerial, || {
            // SAFETY: the program's string.
            let wanted = unsafe { text(serial) }?.to_owned();
            // SAFETY: the program's out parameter.
            unsafe { find_device(device, |d| d.known & nvml_known::SERIAL != 0 && padded(&d.serial) == wanted) }
        })
    }

    // ---- Identity

    unsafe fn nvmlDeviceGetName(device: *mut c_void, name: *mut c_char, length: u32) -> i32 {
        rt::api_call(F::NvmlDeviceGetName, || {
            let d = describe(device)?;
            let text = known(d.known, nvml_known::NAME, padded(&d.name))?;
            // SAFETY: the program's buffer of `length` bytes.
            unsafe { put_str(name, length, text) }
        })
    }

    unsafe fn nvmlDeviceGetUUID(device: *mut c_void, uuid: *mut c_char, length: u32) -> i32 {
        rt::api_call(F::NvmlDeviceGetUUID, || {
            let d = describe(device)?;
            let text = known(d.known, nvml_known::UUID, uuid_text(&d.uuid))?;
            // SAFETY: the program's buffer of `length` bytes.
            unsafe { put_str(uuid, length, &text) }
        })
    }

    unsafe fn nvmlDeviceGetIndex(device: *mut c_void, index: *mut u32) -> i32 {
        rt::api_call(F::NvmlDeviceGetIndex, || {
            let d = describe(device)?;
            // SAFETY: the program's out parameter.
            unsafe { put(index, d.index) }
        })
    }

    unsafe fn nvmlDeviceGetMinorNumber(device: *mut c_void, minor_number: *mut u32) -> i32 {
        rt::api_call(F::NvmlDeviceGetMinorNumber, || {
            let d = describe(device)?;
            // SAFETY: the program's out parameter.
            unsafe { put(minor_number, known(d.known, nvml_known::MINOR_NUMBER, d.minor_number)?) }
        })
    }

    unsafe fn nvmlDeviceGetSerial(device: *mut c_void, serial: *mut c_char, length: u32) -> i32 {
        rt::api_call(F::NvmlDeviceGetSerial, || {
            let d = describe(device)?;
            let text = known(d.known, nvml_known::SERIAL, padded(&d.serial))?;
            // SAFETY: the program's buffer of `length` bytes.
            unsafe { put_str(serial, length, text) }
        })
    }

    unsafe fn nvmlDeviceGetPciInfo(device: *mut c_void, pci: *mut c_void) -> i32 {
        rt::api_call(F::NvmlDeviceGetPciInfo, || {
            let d = describe(device)?;
            known(d.known, nvml_known::PCI, ())?;
            // SAFETY: the program's NVML 1 struct.
            unsafe { write_pci_v1(pci, &d) }
        })
    }

    unsafe fn nvmlDeviceGetPciInfo_v2(device: *mut c_void, pci: *mut c_void) -> i32 {
        rt::api_call(F::NvmlDeviceGetPciInfoV2, || {
            let d = describe(device)?;
            known(d.known, nvml_known::PCI, ())?;
            // SAFETY: the program's nvmlPciInfo_t.
            unsafe { write_pci(pci, &d) }
        })
    }

    unsafe fn nvmlDeviceGetPciInfo_v3(device: *mut c_void, pci: *mut c_void) -> i32 {
        rt::api_call(F::NvmlDeviceGetPciInfoV3, || {
            let d = describe(device)?;
            known(d.known, nvml_known::PCI, ())?;
            // SAFETY: the program's nvmlPciInfo_t.
            unsafe { write_pci(pci, &d) }
        })
    }

    // ---- Memory: the tenant's

    unsafe fn nvmlDeviceGetMemoryInfo(device: *mut c_void, memory: *mut c_void) -> i32 {
        rt::api_call(F::NvmlDeviceGetMemoryInfo, || {
            let s = sample(device)?;
            known(s.known, nvml_known::MEMORY, ())?;
            // SAFETY: the program's nvmlMemory_t: total, free, used.
            unsafe { put(memory.cast::<[u64; 3]>(), [s.memory_total, s.memory_free, s.memory_used]) }
        })
    }

    unsafe fn nvmlDeviceGetMemoryInfo_v2(device: *mut c_void, memory: *mut c_void) -> i32 {
        rt::api_call(F::NvmlDeviceGetMemoryInfoV2, || {
            if memory.is_null() {
                return Err(INVALID);
            }
            // SAFETY: the program's nvmlMemory_v2_t starts with its version.
            if unsafe { memory.cast::<u32>().read_unaligned() } != MEMORY_V2 {
                return Err(NvmlReturn::ARGUMENT_VERSION_MISMATCH);
            }
            let s = sample(device)?;
            known(s.known, nvml_known::MEMORY, ())?;
            // The program's nvmlMemory_v2_t: its version, then total, reserved, free and used
            // from byte 8.
            let fields = memory.cast::<u8>().wrapping_add(8).cast::<[u64; 4]>();
            // SAFETY: inside the program's struct (40 bytes, not null: checked above).
            unsafe { put(fields, [s.memory_total, 0, s.memory_free, s.memory_used]) }
        })
    }

    unsafe fn nvmlDeviceGetBAR1MemoryInfo(device: *mut c_void, bar1_memory: *mut c_void) -> i32 {
        rt::api_call(F::NvmlDeviceGetBAR1MemoryInfo, || {
            let s = sample(device)?;
            known(s.known, nvml_known::BAR1, ())?;
            // SAFETY: the program's nvmlBAR1Memory_t: total, free, used.
            unsafe { put(bar1_memory.cast::<[u64; 3]>(), [s.bar1_total, s.bar1_free, s.bar1_used]) }
        })
    }

    // ---- Sensors and clocks

    unsafe fn nvmlDeviceGetUtilizationRates(device: *mut c_void, utilization: *mut c_void) -> i32 {
        rt::api_call(F::NvmlDeviceGetUtilizationRates, || {
            let s = sample(device)?;
            known(s.known, nvml_known::UTILIZATION, ())?;
            // SAFETY: the program's nvmlUtilization_t: gpu, memory.
            unsafe { put(utilization.cast::<[u32; 2]>(), [s.util_gpu, s.util_memory]) }
        })
    }

    unsafe fn nvmlDeviceGetTemperature(device: *mut c_void, sensor_type: i32, temp: *mut u32) -> i32 {
        rt::api_call(F::NvmlDeviceGetTemperature, || {
            // NVML_TEMPERATURE_GPU is the only sensor.
            if sensor_type != 0 {
                return Err(INVALID);
            }
            let s = sample(device)?;
            // SAFETY: the program's out parameter.
            unsafe { put(temp, known(s.known, nvml_known::TEMPERATURE, s.temperature_c)?) }
        })
    }

    unsafe fn nvmlDeviceGetPowerUsage(device: *mut c_void, power: *mut u32) -> i32 {
        rt::api_call(F::NvmlDeviceGetPowerUsage, || {
            let s = sample(device)?;
            // SAFETY: the program's out parameter.
            unsafe { put(power, known(s.known, nvml_known::POWER_USAGE, s.power_mw)?) }
        })
    }

    unsafe fn nvmlDeviceGetPowerManagementLimit(device: *mut c_void, limit: *mut u32) -> i32 {
        rt::api_call(F::NvmlDeviceGetPowerManagementLimit, || {
            let d = describe(device)?;
            // SAFETY: the program's out parameter.
            unsafe { put(limit, known(d.known, nvml_known::POWER_LIMIT, d.power_limit_mw)?) }
        })
    }

    unsafe fn nvmlDeviceGetEnforcedPowerLimit(device: *mut c_void, limit: *mut u32) -> i32 {
        rt::api_call(F::NvmlDeviceGetEnforcedPowerLimit, || {
            let d = describe(device)?;
            // SAFETY: the program's out parameter.
            unsafe { put(limit, known(d.known, nvml_known::POWER_LIMIT, d.enforced_power_limit_mw)?) }
        })
    }

    unsafe fn nvmlDeviceGetClockInfo(device: *mut c_void, clock_type: i32, clock: *mut u32) -> i32 {
        rt::api_call(F::NvmlDeviceGetClockInfo, || {
            let s = sample(device)?;
            let mhz = match clock_type {
                CLOCK_GRAPHICS => s.clock_graphics_mhz,
                CLOCK_SM => s.clock_sm_mhz,
                CLOCK_MEM => s.clock_mem_mhz,
                CLOCK_VIDEO => s.clock_video_mhz,
                _ => return Err(INVALID),
            };
            // SAFETY: the program's out parameter.
            unsafe { put(clock, known(s.known, nvml_known::CLOCKS, mhz)?) }
        })
    }

    unsafe fn nvmlDeviceGetMaxClockInfo(device: *mut c_void, clock_type: i32, clock: *mut u32) -> i32 {
        rt::api_call(F::NvmlDeviceGetMaxClockInfo, || {
            let d = describe(device)?;
            let mhz = match clock_type {
                CLOCK_GRAPHICS | CLOCK_SM => d.max_sm_clock_mhz,
                CLOCK_MEM => d.max_mem_clock_mhz,
                CLOCK_VIDEO => return Err(nvml::NOT_SUPPORTED),
                _ => return Err(INVALID),
            };
            // SAFETY: the program's out parameter.
            unsafe { put(clock, known(d.known, nvml_known::MAX_CLOCKS, mhz)?) }
        })
    }

    unsafe fn nvmlDeviceGetApplicationsClock(device: *mut c_void, clock_type: i32, clock_mhz: *mut u32) -> i32 {
        rt::api_call(F::NvmlDeviceGetApplicationsClock, || {
            let s = sample(device)?;
            let mhz = match clock_type {
                CLOCK_GRAPHICS | CLOCK_SM => s.app_clock_graphics_mhz,
                CLOCK_MEM => s.app_clock_mem_mhz,
                CLOCK_VIDEO => return Err(nvml::NOT_SUPPORTED),
                _ => return Err(INVALID),
            };
            // SAFETY: the program's out parameter.
            unsafe { put(clock_mhz, known(s.known, nvml_known::APPLICATION_CLOCKS, mhz)?) }
        })
    }

    unsafe fn nvmlDeviceGetClock(device: *mut c_void, clock_type: i32, clock_id: i32, clock_mhz: *mut u32) -> i32 {
        match clock_id {
            // SAFETY: the program's out parameter, passed on.
            CLOCK_ID_CURRENT => unsafe { Self::nvmlDeviceGetClockInfo(device, clock_type, clock_mhz) },
            // SAFETY: as above.
            CLOCK_ID_APP_CLOCK_TARGET | CLOCK_ID_APP_CLOCK_DEFAULT => unsafe {
                Self::nvmlDeviceGetApplicationsClock(device, clock_type, clock_mhz)
            },
            // SAFETY: as above.
            CLOCK_ID_CUSTOMER_BOOST_MAX => unsafe { Self::nvmlDeviceGetMaxClockInfo(device, clock_type, clock_mhz) },
            _ => rt::api_call(F::NvmlDeviceGetClock, || Err(INVALID)),
        }
    }

    unsafe fn nvmlDeviceGetCudaComputeCapability(device: *mut c_void, major: *mut i32, minor: *mut i32) -> i32 {
        rt::api_call(F::NvmlDeviceGetCudaComputeCapability, || {
            if major.is_null() || minor.is_null() {
                return Err(INVALID);
            }
            let d = describe(device)?;
            known(d.known, nvml_known::COMPUTE_CAPABILITY, ())?;
            // SAFETY: the program's out parameter, not null.
            unsafe { put(major, d.cc_major) }?;
            // SAFETY: the program's out parameter, not null.
            unsafe { put(minor, d.cc_minor) }
        })
    }

    unsafe fn nvmlDeviceGetComputeMode(device: *mut c_void, mode: *mut i32) -> i32 {
        rt::api_call(F::NvmlDeviceGetComputeMode, || {
            let d = describe(device)?;
            // SAFETY: the program's out parameter (NVML's modes are CUDA's numbers).
            unsafe { put(mode, known(d.known, nvml_known::COMPUTE_MODE, d.compute_mode)?) }
        })
    }

    unsafe fn nvmlDeviceGetPersistenceMode(device: *mut c_void, mode: *mut i32) -> i32 {
        rt::api_call(F::NvmlDeviceGetPersistenceMode, || {
            let d = describe(device)?;
            // SAFETY: the program's out parameter.
            unsafe { put(mode, known(d.known, nvml_known::PERSISTENCE, d.persistence)?) }
        })
    }

    unsafe fn nvmlDeviceGetPerformanceState(device: *mut c_void, p_state: *mut i32) -> i32 {
        rt::api_call(F::NvmlDeviceGetPerformanceState, || {
            let s = sample(device)?;
            // SAFETY: the program's out parameter.
            unsafe { put(p_state, known(s.known, nvml_known::PSTATE, s.pstate)?) }
        })
    }

    unsafe fn nvmlDeviceGetPowerState(device: *mut c_void, p_state: *mut i32) -> i32 {
        // SAFETY: the same contract (NVML's deprecated name for the performance state).
        unsafe { Self::nvmlDeviceGetPerformanceState(device, p_state) }
    }

    unsafe fn nvmlDeviceGetFanSpeed(device: *mut c_void, speed: *mut u32) -> i32 {
        rt::api_call(F::NvmlDeviceGetFanSpeed, || {
            let s = sample(device)?;
            // SAFETY: the program's out parameter.
            unsafe { put(speed, known(s.known, nvml_known::FAN, s.fan_percent)?) }
        })
    }

    unsafe fn nvmlDeviceGetEccMode(device: *mut c_void, current: *mut i32, pending: *mut i32) -> i32 {
        rt::api_call(F::NvmlDeviceGetEccMode, || {
            if current.is_null() || pending.is_null() {
                return Err(INVALID);
            }
            let d = describe(device)?;
            let enabled = known(d.known, nvml_known::ECC, d.ecc_enabled)?;
            // SAFETY: the program's out parameter, not null.
            unsafe { put(current, enabled) }?;
            // SAFETY: the program's out parameter, not null.
            unsafe { put(pending, enabled) }
        })
    }

    unsafe fn nvmlDeviceGetCurrPcieLinkGeneration(device: *mut c_void, curr_link_gen: *mut u32) -> i32 {
        rt::api_call(F::NvmlDeviceGetCurrPcieLinkGeneration, || {
            let s = sample(device)?;
            // SAFETY: the program's out parameter.
            unsafe { put(curr_link_gen, known(s.known, nvml_known::PCIE_LINK, s.pcie_gen)?) }
        })
    }

    unsafe fn nvmlDeviceGetCurrPcieLinkWidth(device: *mut c_void, curr_link_width: *mut u32) -> i32 {
        rt::api_call(F::NvmlDeviceGetCurrPcieLinkWidth, || {
            let s = sample(device)?;
            // SAFETY: the program's out parameter.
            unsafe { put(curr_link_width, known(s.known, nvml_known::PCIE_LINK, s.pcie_width)?) }
        })
    }

    unsafe fn nvmlDeviceGetMaxPcieLinkGeneration(device: *mut c_void, max_link_gen: *mut u32) -> i32 {
        rt::api_call(F::NvmlDeviceGetMaxPcieLinkGeneration, || {
            let d = describe(device)?;
            // SAFETY: the program's out parameter.
            unsafe { put(max_link_gen, known(d.known, nvml_known::MAX_PCIE_LINK, d.max_pcie_gen)?) }
        })
    }

    unsafe fn nvmlDeviceGetMaxPcieLinkWidth(device: *mut c_void, max_link_width: *mut u32) -> i32 {
        rt::api_call(F::NvmlDeviceGetMaxPcieLinkWidth, || {
            let d = describe(device)?;
            // SAFETY: the program's out parameter.
            unsafe { put(max_link_width, known(d.known, nvml_known::MAX_PCIE_LINK, d.max_pcie_width)?) }
        })
    }

    unsafe fn nvmlDeviceGetPcieThroughput(device: *mut c_void, counter: i32, value: *mut u32) -> i32 {
        rt::api_call(F::NvmlDeviceGetPcieThroughput, || {
            let s = sample(device)?;
            let kbs = match counter {
                0 => s.pcie_tx_kbs,
                1 => s.pcie_rx_kbs,
                _ => return Err(INVALID),
            };
            // SAFETY: the program's out parameter.
            unsafe { put(value, known(s.known, nvml_known::PCIE_THROUGHPUT, kbs)?) }
        })
    }

    unsafe fn nvmlDeviceGetCurrentClocksEventReasons(device: *mut c_void, reasons: *mut u64) -> i32 {
        rt::api_call(F::NvmlDeviceGetCurrentClocksEventReasons, || {
            let s = sample(device)?;
            // SAFETY: the program's out parameter.
            unsafe { put(reasons, known(s.known, nvml_known::CLOCK_EVENT_REASONS, s.clock_event_reasons)?) }
        })
    }

    // ---- Processes: this process alone

    unsafe fn nvmlDeviceGetComputeRunningProcesses(
        device: *mut c_void,
        info_count: *mut u32,
        infos: *mut c_void,
    ) -> i32 {
        // SAFETY: the program's count and array of 16-byte entries.
        rt::api_call(F::NvmlDeviceGetComputeRunningProcesses, || unsafe {
            processes(device, info_count, infos, 16, false)
        })
    }

    unsafe fn nvmlDeviceGetComputeRunningProcesses_v2(
        device: *mut c_void,
        info_count: *mut u32,
        infos: *mut c_void,
    ) -> i32 {
        // SAFETY: the program's count and array of 24-byte entries.
        rt::api_call(F::NvmlDeviceGetComputeRunningProcessesV2, || unsafe {
            processes(device, info_count, infos, 24, false)
        })
    }

    unsafe fn nvmlDeviceGetComputeRunningProcesses_v3(
        device: *mut c_void,
        info_count: *mut u32,
        infos: *mut c_void,
    ) -> i32 {
        // SAFETY: the program's count and array of 24-byte entries.
        rt::api_call(F::NvmlDeviceGetComputeRunningProcessesV3, || unsafe {
            processes(device, info_count, infos, 24, false)
        })
    }

    unsafe fn nvmlDeviceGetGraphicsRunningProcesses(
        device: *mut c_void,
        info_count: *mut u32,
        infos: *mut c_void,
    ) -> i32 {
        // SAFETY: the program's count and array of 16-byte entries.
        rt::api_call(F::NvmlDeviceGetGraphicsRunningProcesses, || unsafe {
            processes(device, info_count, infos, 16, true)
        })
    }

    unsafe fn nvmlDeviceGetGraphicsRunningProcesses_v2(
        device: *mut c_void,
        info_count: *mut u32,
        infos: *mut c_void,
    ) -> i32 {
        // SAFETY: the program's count and array of 24-byte entries.
        rt::api_call(F::NvmlDeviceGetGraphicsRunningProcessesV2, || unsafe {
            processes(device, info_count, infos, 24, true)
        })
    }

    unsafe fn nvmlDeviceGetGraphicsRunningProcesses_v3(
        device: *mut c_void,
        info_count: *mut u32,
        infos: *mut c_void,
    ) -> i32 {
        // SAFETY: the program's count and array of 24-byte entries.
        rt::api_call(F::NvmlDeviceGetGraphicsRunningProcessesV3, || unsafe {
            processes(device, info_count, infos, 24, true)
        })
    }

    // ---- Links and topology: a tenant sees no NVLink, no peers, no host topology

    unsafe fn nvmlDeviceGetNvLinkState(device: *mut c_void, link: u32, is_active: *mut i32) -> i32 {
        rt::api_call(F::NvmlDeviceGetNvLinkState, || {
            describe(device)?;
            if link >= NVLINK_MAX_LINKS || is_active.is_null() {
                return Err(INVALID);
            }
            Err(nvml::NOT_SUPPORTED)
        })
    }

    unsafe fn nvmlDeviceGetNvLinkRemotePciInfo(device: *mut c_void, link: u32, pci: *mut c_void) -> i32 {
        rt::api_call(F::NvmlDeviceGetNvLinkRemotePciInfo, || {
            describe(device)?;
            if link >= NVLINK_MAX_LINKS || pci.is_null() {
                return Err(INVALID);
            }
            Err(nvml::NOT_SUPPORTED)
        })
    }

    unsafe fn nvmlDeviceGetNvLinkRemotePciInfo_v2(device: *mut c_void, link: u32, pci: *mut c_void) -> i32 {
        rt::api_call(F::NvmlDeviceGetNvLinkRemotePciInfoV2, || {
            describe(device)?;
            if link >= NVLINK_MAX_LINKS || pci.is_null() {
                return Err(INVALID);
            }
            Err(nvml::NOT_SUPPORTED)
        })
    }

    unsafe fn nvmlDeviceGetNvLinkRemoteDeviceType(device: *mut c_void, link: u32, device_type: *mut i32) -> i32 {
        rt::api_call(F::NvmlDeviceGetNvLinkRemoteDeviceType, || {
            describe(device)?;
            if link >= NVLINK_MAX_LINKS || device_type.is_null() {
                return Err(INVALID);
            }
            Err(nvml::NOT_SUPPORTED)
        })
    }

    unsafe fn nvmlDeviceGetP2PStatus(
        device1: *mut c_void,
        device2: *mut c_void,
        _p2p_index: i32,
        p2p_status: *mut i32,
    ) -> i32 {
        rt::api_call(F::NvmlDeviceGetP2PStatus, || {
            let (a, b) = (describe(device1)?, describe(device2)?);
            // Peer access between a session's devices is not given: only a device with itself.
            // SAFETY: the program's out parameter.
            unsafe { put(p2p_status, if a.index == b.index { P2P_OK } else { P2P_NOT_SUPPORTED }) }
        })
    }

    unsafe fn nvmlDeviceGetTopologyCommonAncestor(
        device1: *mut c_void,
        device2: *mut c_void,
        path_info: *mut i32,
    ) -> i32 {
        rt::api_call(F::NvmlDeviceGetTopologyCommonAncestor, || {
            let (a, b) = (describe(device1)?, describe(device2)?);
            if a.index != b.index {
                return Err(nvml::NOT_SUPPORTED);
            }
            // SAFETY: the program's out parameter.
            unsafe { put(path_info, TOPOLOGY_INTERNAL) }
        })
    }

    unsafe fn nvmlDeviceGetCpuAffinity(device: *mut c_void, cpu_set_size: u32, cpu_set: *mut u64) -> i32 {
        rt::api_call(F::NvmlDeviceGetCpuAffinity, || {
            describe(device)?;
            if cpu_set_size == 0 || cpu_set.is_null() {
                return Err(INVALID);
            }
            // The server's host is not the program's (a VM, another machine).
            Err(nvml::NOT_SUPPORTED)
        })
    }

    unsafe fn nvmlDeviceGetCpuAffinityWithinScope(
        device: *mut c_void,
        cpu_set_size: u32,
        cpu_set: *mut u64,
        _scope: u32,
    ) -> i32 {
        rt::api_call(F::NvmlDeviceGetCpuAffinityWithinScope, || {
            describe(device)?;
            if cpu_set_size == 0 || cpu_set.is_null() {
                return Err(INVALID);
            }
            Err(nvml::NOT_SUPPORTED)
        })
    }

    unsafe fn nvmlDeviceGetMemoryAffinity(
        device: *mut c_void,
        node_set_size: u32,
        node_set: *mut u64,
        _scope: u32,
    ) -> i32 {
        rt::api_call(F::NvmlDeviceGetMemoryAffinity, || {
            describe(device)?;
            if node_set_size == 0 || node_set.is_null() {
                return Err(INVALID);
            }
            Err(nvml::NOT_SUPPORTED)
        })
    }

    unsafe fn nvmlDeviceGetMigMode(device: *mut c_void, current_mode: *mut u32, pending_mode: *mut u32) -> i32 {
        rt::api_call(F::NvmlDeviceGetMigMode, || {
            if current_mode.is_null() || pending_mode.is_null() {
                return Err(INVALID);
            }
            let d = describe(device)?;
            known(d.known, nvml_known::MIG_MODE, ())?;
            // SAFETY: the program's out parameter, not null.
            unsafe { put(current_mode, d.mig_current) }?;
            // SAFETY: the program's out parameter, not null.
            unsafe { put(pending_mode, d.mig_pending) }
        })
    }

    unsafe fn nvmlDeviceGetArchitecture(device: *mut c_void, arch: *mut u32) -> i32 {
        rt::api_call(F::NvmlDeviceGetArchitecture, || {
            let d = describe(device)?;
            known(d.known, nvml_known::COMPUTE_CAPABILITY, ())?;
            // nvmlDeviceArchitecture_t from the compute capability.
            let value = match (d.cc_major, d.cc_minor) {
                (3, _) => 2,
                (5, _) => 3,
                (6, _) => 4,
                (7, 0 | 2) => 5,
                (7, _) => 6,
                (8, 9) => 8,
                (8, _) => 7,
                (9, _) => 9,
                (10 | 12, _) => 10,
                _ => u32::MAX,
            };
            // SAFETY: the program's out parameter.
            unsafe { put(arch, value) }
        })
    }

    unsafe fn nvmlDeviceGetBrand(device: *mut c_void, brand: *mut i32) -> i32 {
        rt::api_call(F::NvmlDeviceGetBrand, || {
            let d = describe(device)?;
            // SAFETY: the program's out parameter.
            unsafe { put(brand, known(d.known, nvml_known::BRAND, d.brand)?) }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_uuid_is_written_as_nvml_writes_it() {
        let uuid: [u8; 16] = [0x12, 0x34, 0x56, 0x78, 0x9a, 0xbc, 0xde, 0xf0, 1, 2, 3, 4, 5, 6, 7, 8];
        assert_eq!(uuid_text(&uuid), "GPU-12345678-9abc-def0-0102-030405060708");
    }

    #[test]
    fn bus_ids_are_written_and_read_back() {
        let d = NvmlDescription { pci_domain: 0, pci_bus: 0x1b, pci_device: 0, ..Default::default() };
        let (full, legacy) = bus_ids(&d);
        assert_eq!(full, "00000000:1B:00.0");
        assert_eq!(legacy, "0000:1B:00.0");
        assert_eq!(parse_bus_id(&full), Some((0, 0x1b, 0)));
        assert_eq!(parse_bus_id("0000:1b:00.0"), Some((0, 0x1b, 0)));
        assert_eq!(parse_bus_id("nonsense"), None);
    }

    #[test]
    fn a_string_is_refused_by_a_buffer_without_room_for_its_nul() {
        let mut buf = [0x55 as c_char; 4];
        // SAFETY: `buf` holds 4 bytes.
        assert_eq!(unsafe { put_str(buf.as_mut_ptr(), 3, "abc") }, Err(TOO_SMALL));
        assert_eq!(buf, [0x55; 4], "nothing written");
        // SAFETY: as above.
        assert_eq!(unsafe { put_str(buf.as_mut_ptr(), 4, "abc") }, Ok(()));
        assert_eq!(&buf, &[b'a' as c_char, b'b' as c_char, b'c' as c_char, 0]);
        // SAFETY: null is refused before any write.
        assert_eq!(unsafe { put_str(std::ptr::null_mut(), 4, "abc") }, Err(INVALID));
    }
}
