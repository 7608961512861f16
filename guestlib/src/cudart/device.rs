//! Device management that lives in the guest: device flags, device choice, PCI bus ids,
//! driver entry points. Per-device facts come from the server (properties, attributes).

use std::ffi::{c_char, c_void};
use std::sync::Mutex;

use phos_protocol::CudaError;
use phos_protocol::cudart::CudaDeviceGetAttributeRequest;

use crate::abi::{self, attr};
use crate::{runtime, soname};

/// `cudaDeviceScheduleMask | cudaDeviceMapHost | cudaDeviceLmemResizeToMax`, plus the
/// CUDA 12 `cudaDeviceSyncMemops`.
const DEVICE_FLAGS: u32 = 0x07 | 0x08 | 0x10 | 0x80;
/// `cudaDeviceMapHost`: always on for a context since CUDA 11, and reported so.
const MAP_HOST: u32 = 0x08;
/// Scheduling policies are exclusive: at most one of spin (1), yield (2), blocking sync (4).
const SCHEDULE_MASK: u32 = 0x07;

/// Flags per device, as set by `cudaSetDeviceFlags`/`cudaInitDevice`.
static FLAGS: Mutex<Vec<u32>> = Mutex::new(Vec::new());

fn device_count() -> Result<i32, CudaError> {
    Ok(runtime::session()?.device_count)
}

pub fn check_device(device: i32) -> Result<(), CudaError> {
    if device < 0 || device >= device_count()? { Err(CudaError::InvalidDevice) } else { Ok(()) }
}

fn set_flags(device: i32, flags: u32) -> Result<(), CudaError> {
    if flags & !DEVICE_FLAGS != 0 || (flags & SCHEDULE_MASK).count_ones() > 1 {
        return Err(CudaError::InvalidValue);
    }
    let mut all = FLAGS.lock().unwrap_or_else(|p| p.into_inner());
    let i = device as usize;
    if all.len() <= i {
        all.resize(i + 1, 0);
    }
    all[i] = flags | MAP_HOST;
    Ok(())
}

pub fn set_device_flags(flags: u32) -> Result<(), CudaError> {
    let device = runtime::current_device();
    check_device(device)?;
    set_flags(device, flags)
}

pub unsafe fn get_device_flags(out: *mut u32) -> Result<(), CudaError> {
    if out.is_null() {
        return Err(CudaError::InvalidValue);
    }
    let device = runtime::current_device();
    check_device(device)?;
    let all = FLAGS.lock().unwrap_or_else(|p| p.into_inner());
    let flags = all.get(device as usize).copied().unwrap_or(MAP_HOST);
    // SAFETY: `out` is not null (checked above) and points to a writable value of its type: this
    // function's contract, which is the export's.
    unsafe { *out = flags };
    Ok(())
}

/// `cudaInitDevice`: `flags` may only be `cudaInitDeviceFlagsAreValid` (1), which makes
/// `device_flags` apply.
pub fn init_device(device: i32, device_flags: u32, flags: u32) -> Result<(), CudaError> {
    check_device(device)?;
    match flags {
        0 => Ok(()),
        1 => set_flags(device, device_flags),
        _ => Err(CudaError::InvalidValue),
    }
}

/// `cudaSetValidDevices`: the list must name existing devices, each once.
pub unsafe fn set_valid_devices(list: *const i32, len: i32) -> Result<(), CudaError> {
    if len < 0 || (len > 0 && list.is_null()) {
        return Err(CudaError::InvalidValue);
    }
    // SAFETY: `len > 0`, so `list` is not null (checked above) and holds `len` device numbers
    // (this function's contract, `cudaSetValidDevices`'s), which the call only reads.
    let devices = if len == 0 { &[][..] } else { unsafe { std::slice::from_raw_parts(list, len as usize) } };
    for (i, &d) in devices.iter().enumerate() {
        check_device(d)?;
        if devices[..i].contains(&d) {
            return Err(CudaError::InvalidValue);
        }
    }
    Ok(())
}

fn attribute(device: i32, attr: i32) -> Result<i32, CudaError> {
    let reply = runtime::call(&CudaDeviceGetAttributeRequest { attr, device })?;
    Ok(reply.value)
}

/// `cudaChooseDevice`: the device whose compute capability is closest to the one asked for,
/// preferring one at least as new.
pub unsafe fn choose_device(out: *mut i32, prop: *const c_void) -> Result<(), CudaError> {
    if out.is_null() || prop.is_null() {
        return Err(CudaError::InvalidValue);
    }
    // SAFETY: this function's arguments, passed on (at most retyped):
    // `abi::requested_compute_capability` asks of them what this function's contract (the export's)
    // promises.
    let wanted = unsafe { abi::requested_compute_capability(soname::current_abi(), prop) };
    let mut best: Option<(bool, i32, i32)> = None;
    for d in 0..device_count()? {
        let cc = (attribute(d, attr::COMPUTE_CAPABILITY_MAJOR)?, attribute(d, attr::COMPUTE_CAPABILITY_MINOR)?);
        let distance = ((cc.0 - wanted.0) * 10 + (cc.1 - wanted.1)).abs();
        let candidate = (cc < wanted, distance, d);
        if best.is_none_or(|b| (candidate.0, candidate.1) < (b.0, b.1)) {
            best = Some(candidate);
        }
    }
    let (_, _, device) = best.ok_or(CudaError::NoDevice)?;
    // SAFETY: `out` is not null (checked above) and points to a writable value of its type: this
    // function's contract, which is the export's.
    unsafe { *out = device };
    Ok(())
}

fn pci_id(device: i32) -> Result<String, CudaError> {
    let domain = attribute(device, attr::PCI_DOMAIN_ID)?;
    let bus = attribute(device, attr::PCI_BUS_ID)?;
    let dev = attribute(device, attr::PCI_DEVICE_ID)?;
    Ok(format!("{domain:08x}:{bus:02x}:{dev:02x}.0"))
}

/// `cudaDeviceGetPCIBusId`: `domain:bus:device.function` in hex, cut to `len` bytes with
/// its terminating NUL, as CUDA does.
pub unsafe fn get_pci_bus_id(out: *mut c_char, len: i32, device: i32) -> Result<(), CudaError> {
    if out.is_null() || len <= 0 {
        return Err(CudaError::InvalidValue);
    }
    check_device(device)?;
    let id = pci_id(device)?;
    let n = id.len().min(len as usize - 1);
    // SAFETY: `n < len`, and `out` is not null (checked above) with room for `len` chars
    // (this function's contract).
    unsafe { std::ptr::copy_nonoverlapping(id.as_ptr().cast::<c_char>(), out, n) };
    // SAFETY: as above: `n < len`.
    let end = unsafe { out.add(n) };
    // SAFETY: the terminating NUL's place, within the `len` chars.
    unsafe { *end = 0 };
    Ok(())
}

/// Parses `[domain:]bus:device[.function]` (hex) into (domain, bus, device).
fn parse_pci(s: &str) -> Option<(i32, i32, i32)> {
    let s = s.trim();
    let (rest, _function) = s.split_once('.').unwrap_or((s, "0"));
    let parts: Vec<&str> = rest.split(':').collect();
    let hex = |p: &str| i32::from_str_radix(p, 16).ok();
    match parts.as_slice() {
        [domain, bus, dev] => Some((hex(domain)?, hex(bus)?, hex(dev)?)),
        [bus, dev] => Some((0, hex(bus)?, hex(dev)?)),
        _ => None,
    }
}

pub unsafe fn get_by_pci_bus_id(out: *mut i32, id: *const c_char) -> Result<(), CudaError> {
    if out.is_null() || id.is_null() {
        return Err(CudaError::InvalidValue);
    }
    // SAFETY: not null (checked above), so a NUL-terminated string (this function's contract).
    let text = unsafe { std::ffi::CStr::from_ptr(id) }.to_str().map_err(|_| CudaError::InvalidValue)?;
    let wanted = parse_pci(text).ok_or(CudaError::InvalidValue)?;
    for d in 0..device_count()? {
        let here =
            (attribute(d, attr::PCI_DOMAIN_ID)?, attribute(d, attr::PCI_BUS_ID)?, attribute(d, attr::PCI_DEVICE_ID)?);
        if here == wanted {
            // SAFETY: `out` is not null (checked above) and points to a writable value of its type:
            // this function's contract, which is the export's.
            unsafe { *out = d };
            return Ok(());
        }
    }
    Err(CudaError::InvalidDevice)
}

/// `cudaGetDriverEntryPoint[ByVersion]`: this library's own driver entry point for `symbol`
/// (never NVIDIA's), as `cuGetProcAddress` answers it for CUDA `version` (the runtime's own
/// version for `cudaGetDriverEntryPoint`). CUDA 12 and later report a symbol not found (or
/// too new) through `driverStatus` and succeed; without a status pointer (and in CUDA 11,
/// which has none) the call fails with `cudaErrorSymbolNotFound`.
pub unsafe fn driver_entry_point(
    symbol: *const c_char,
    func: *mut *mut c_void,
    version: u32,
    flags: u64,
    status: *mut i32,
    has_status: bool,
) -> Result<(), CudaError> {
    if symbol.is_null() || func.is_null() || flags > 2 {
        return Err(CudaError::InvalidValue);
    }
    // SAFETY: `symbol` is not null and NUL-terminated (this function's contract, the export's).
    let name = unsafe { std::ffi::CStr::from_ptr(symbol) }.to_str().unwrap_or("");
    let found = crate::cuda::entry_points::resolve(name, version, flags);
    let (address, answer) = match found {
        Ok(p) => (p, 0),
        Err(s) => (std::ptr::null_mut(), s as i32),
    };
    // SAFETY: `func` is not null (checked above) and points to a writable value of its type: this
    // function's contract, which is the export's.
    unsafe { *func = address };
    if has_status && !status.is_null() {
        // SAFETY: `status` is not null (checked above) and points to a writable value of its type:
        // this function's contract, which is the export's.
        unsafe { *status = answer };
        return Ok(());
    }
    if answer == 0 { Ok(()) } else { Err(CudaError::SymbolNotFound) }
}

/// `cudaDeviceGetP2PAttribute`: performance rank (1), access (2), native atomics (3), CUDA
/// array access (4) between two different devices.
///
/// # Safety
/// A non-null `value` must be writable.
pub unsafe fn p2p_attribute(value: *mut i32, attr: i32, src: i32, dst: i32) -> Result<(), CudaError> {
    if value.is_null() {
        return Err(CudaError::InvalidValue);
    }
    check_device(src)?;
    check_device(dst)?;
    if src == dst {
        return Err(CudaError::InvalidDevice);
    }
    let can = runtime::call(&phos_protocol::cudart::CudaDeviceCanAccessPeerRequest { device: src, peerDevice: dst })?
        .canAccessPeer;
    let v = match attr {
        1 => 0,
        2 | 3 => can,
        4 => 0,
        _ => return Err(CudaError::InvalidValue),
    };
    // SAFETY: `value` is not null (checked above) and points to a writable value of its type: this
    // function's contract, which is the export's.
    unsafe { *value = v };
    Ok(())
}

/// `cudaDevAttrMaxTexture1DLinearWidth`.
const MAX_TEXTURE_1D_LINEAR_WIDTH: i32 = 69;

/// `cudaDeviceGetTexture1DLinearMaxWidth`: the elements of a 1D texture over linear memory
/// the device takes for the format, which is the device's 1D linear texture width (counted in
/// elements whatever their size) for every format a texture can have: signed, unsigned or
/// float channels of 8, 16 or 32 bits, one to four of them, packed from the first.
///
/// # Safety
/// `out` must be null or writable; `desc` null or a readable `cudaChannelFormatDesc`.
pub unsafe fn texture_1d_linear_max_width(
    out: *mut usize,
    desc: *const phos_protocol::types::ChannelFormatDesc,
    device: i32,
) -> Result<(), CudaError> {
    if out.is_null() || desc.is_null() {
        return Err(CudaError::InvalidValue);
    }
    // SAFETY: not null (checked above), readable (this function's contract).
    let d = unsafe { desc.read_unaligned() };
    let bits = [d.x, d.y, d.z, d.w];
    let channels = bits.iter().take_while(|&&b| b != 0).count();
    let valid = (0..=2).contains(&d.f)
        && channels > 0
        && bits[..channels].iter().all(|&b| b == bits[0] && [8, 16, 32].contains(&b))
        && bits[channels..].iter().all(|&b| b == 0)
        && channels != 3;
    if !valid {
        return Err(CudaError::InvalidValue);
    }
    check_device(device)?;
    let width = attribute(device, MAX_TEXTURE_1D_LINEAR_WIDTH)?;
    // SAFETY: not null (checked above), writable (this function's contract).
    unsafe { out.write_unaligned(usize::try_from(width).unwrap_or(0)) };
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::parse_pci;

    #[test]
    fn pci_ids_parse_with_or_without_domain() {
        assert_eq!(parse_pci("0000:1b:00.0"), Some((0, 0x1b, 0)));
        assert_eq!(parse_pci("00000000:c2:00.0"), Some((0, 0xc2, 0)));
        assert_eq!(parse_pci("1b:00"), Some((0, 0x1b, 0)));
        assert_eq!(parse_pci("garbage"), None);
        assert_eq!(parse_pci("zz:yy:xx.0"), None);
    }
}
