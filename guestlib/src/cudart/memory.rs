//! Memory calls the guest composes from simpler remote ones: pitched and 3D allocations,
//! strided copies and memsets (host rows travel packed, in one `phosMemcpy3D`), peer copies,
//! host-memory registration and pointer attributes.

use std::ffi::c_void;

use phos_protocol::cudart::{
    CudaMallocRequest, PhosMemcpy3DRequest, PhosMemset3DRequest, PhosPointerDeviceRequest, consts,
};
use phos_protocol::types::{Extent, PitchedPtr};
use phos_protocol::{CudaError, Ptr};

use super::hand::Hand;
use super::stubs::HandWritten;
use crate::{hostmem, registry, runtime, soname};

/// Row pitch alignment of pitched allocations (a multiple of every GPU's texture pitch
/// alignment, and of the 128-byte transactions rows should start on).
const PITCH_ALIGNMENT: usize = 512;

fn status(code: i32) -> Result<(), CudaError> {
    if code == 0 { Ok(()) } else { Err(CudaError(code)) }
}

fn malloc(size: usize) -> Result<u64, CudaError> {
    Ok(runtime::call(&CudaMallocRequest { size: size as u64 })?.devPtr)
}

pub unsafe fn malloc_pitch(
    ptr: *mut *mut c_void,
    pitch: *mut usize,
    width: usize,
    height: usize,
) -> Result<(), CudaError> {
    if ptr.is_null() || pitch.is_null() {
        return Err(CudaError::InvalidValue);
    }
    let p = width.checked_next_multiple_of(PITCH_ALIGNMENT).ok_or(CudaError::MemoryAllocation)?.max(PITCH_ALIGNMENT);
    let size = p.checked_mul(height).ok_or(CudaError::MemoryAllocation)?;
    let addr = if width == 0 || height == 0 { 0 } else { malloc(size)? };
    // SAFETY: not null (checked above), so writable (this function's contract).
    unsafe { *ptr = addr as usize as *mut c_void };
    // SAFETY: as for `ptr`.
    unsafe { *pitch = p };
    Ok(())
}

pub unsafe fn malloc_3d(out: *mut PitchedPtr, extent: Extent) -> Result<(), CudaError> {
    if out.is_null() {
        return Err(CudaError::InvalidValue);
    }
    let mut pitch = 0usize;
    let mut ptr = std::ptr::null_mut();
    let rows = extent.height.checked_mul(extent.depth).ok_or(CudaError::MemoryAllocation)?;
    // SAFETY: two locals of this function, writable.
    unsafe { malloc_pitch(&mut ptr, &mut pitch, extent.width, rows)? };
    // SAFETY: not null (checked above), so writable (this function's contract).
    unsafe { *out = PitchedPtr { ptr: ptr as usize as u64, pitch, xsize: extent.width, ysize: extent.height } };
    Ok(())
}

/// One side of a strided copy: where it starts, its row pitch and slice pitch.
#[derive(Clone, Copy)]
pub(crate) struct Side {
    pub addr: u64,
    pub pitch: u64,
    pub slice: u64,
}

fn resolve(kind: i32, dst: u64, src: u64) -> Result<i32, CudaError> {
    <Hand as HandWritten>::resolve_memcpy_kind(i128::from(kind), i128::from(dst), i128::from(src)).map(|k| k as i32)
}

/// Where a strided region of `w` bytes x `h` rows x `d` slices ends; `None` when the
/// address arithmetic overflows (no such region exists).
fn region_end(s: Side, (w, h, d): (u64, u64, u64)) -> Option<u64> {
    let last_row = (d - 1).checked_mul(s.slice)?.checked_add((h - 1).checked_mul(s.pitch)?)?;
    s.addr.checked_add(last_row)?.checked_add(w)
}

/// A 3D copy of `w` bytes x `h` rows x `d` slices.
///
/// # Safety
/// A host side must be readable (the source) or writable (the destination) for every row of
/// the extent at its pitches.
pub(crate) unsafe fn copy_3d(
    dst: Side,
    src: Side,
    (w, h, d): (u64, u64, u64),
    kind: i32,
    stream: Option<u64>,
) -> Result<(), CudaError> {
    if w == 0 || h == 0 || d == 0 {
        return Ok(());
    }
    if w > dst.pitch || w > src.pitch {
        return Err(CudaError::InvalidPitchValue);
    }
    let direction = resolve(kind, dst.addr, src.addr)?;
    let total = w.checked_mul(h).and_then(|n| n.checked_mul(d)).ok_or(CudaError::InvalidValue)?;
    let total = usize::try_from(total).map_err(|_| CudaError::InvalidValue)?;
    // Host sides are walked here: a region whose addresses overflow is no memory at all.
    let host_side_ok = |s: Side| region_end(s, (w, h, d)).is_some();
    let host_sides_ok = match direction {
        consts::cudaMemcpyHostToHost => host_side_ok(src) && host_side_ok(dst),
        consts::cudaMemcpyHostToDevice => host_side_ok(src),
        consts::cudaMemcpyDeviceToHost => host_side_ok(dst),
        _ => true,
    };
    if !host_sides_ok {
        return Err(CudaError::InvalidValue);
    }
    // Byte offset of row y of slice z on a side (checked above not to overflow).
    let at = |s: Side, y: u64, z: u64| s.addr + z * s.slice + y * s.pitch;
    let rows = || (0..d).flat_map(move |z| (0..h).map(move |y| (y, z)));
    match direction {
        consts::cudaMemcpyHostToHost => {
            if let Some(s) = stream {
                // SAFETY: a stream handle is a value the export only passes to the server.
                status(unsafe { super::stubs::cudaStreamSynchronize(s as usize as *mut c_void) })?;
            }
            for (y, z) in rows() {
                // SAFETY: row `(y, z)` of each host side, `w` bytes readable at the source and
                // writable at the destination (this function's contract); the application's
                // regions may overlap, so `copy`.
                unsafe {
                    std::ptr::copy(at(src, y, z) as usize as *const u8, at(dst, y, z) as usize as *mut u8, w as usize)
                };
            }
            Ok(())
        }
        consts::cudaMemcpyHostToDevice => {
            // SAFETY: the host source, readable for every row (this function's contract).
            let packed = unsafe { pack(src.addr, src.pitch, src.slice, (w, h, d))? };
            send(
                dst,
                Ptr::Device(dst.addr),
                Side { addr: 0, pitch: w, slice: w * h },
                Ptr::In(&packed),
                (w, h, d),
                direction,
                stream,
            )
            .map(|_| ())
        }
        consts::cudaMemcpyDeviceToHost => {
            check_carried(total as u64)?;
            let packed_side = Side { addr: 0, pitch: w, slice: w * h };
            let data =
                send(packed_side, Ptr::Out(total as u64), src, Ptr::Device(src.addr), (w, h, d), direction, stream)?;
            let data = data.filter(|v| v.len() == total).ok_or(CudaError::Unknown)?;
            for ((y, z), row) in rows().zip(data.chunks_exact(w as usize)) {
                // SAFETY: row `(y, z)` of the host destination, `w` writable bytes (this
                // function's contract); `row` is the reply's.
                unsafe { std::ptr::copy_nonoverlapping(row.as_ptr(), at(dst, y, z) as usize as *mut u8, w as usize) };
            }
            Ok(())
        }
        _ => send(dst, Ptr::Device(dst.addr), src, Ptr::Device(src.addr), (w, h, d), direction, stream).map(|_| ()),
    }
}

/// A strided copy's host data travels packed in one frame: more than the router carries
/// (its `max_payload`) cannot be sent, and is refused before anything is allocated for it.
pub(crate) fn check_carried(bytes: u64) -> Result<(), CudaError> {
    let limit = runtime::session()?.max_payload;
    if bytes > limit {
        tracing::warn!("a strided copy of {bytes} bytes is over the router's limit of {limit} (its max_payload)");
        return Err(CudaError::InvalidValue);
    }
    Ok(())
}

/// The rows of a strided host region, packed (`w` bytes per row, `h` rows per slice, `d`
/// slices). Extents whose addresses overflow, or more bytes than a request can carry, are
/// `cudaErrorInvalidValue`; a buffer this process cannot allocate is
/// `cudaErrorMemoryAllocation` (never an abort).
///
/// # Safety
/// Every row must be readable host memory.
pub(crate) unsafe fn pack(addr: u64, pitch: u64, slice: u64, (w, h, d): (u64, u64, u64)) -> Result<Vec<u8>, CudaError> {
    if w == 0 || h == 0 || d == 0 {
        return Ok(Vec::new());
    }
    region_end(Side { addr, pitch, slice }, (w, h, d)).ok_or(CudaError::InvalidValue)?;
    let total = w.checked_mul(h).and_then(|n| n.checked_mul(d)).ok_or(CudaError::InvalidValue)?;
    check_carried(total)?;
    let mut packed = Vec::new();
    packed.try_reserve_exact(usize::try_from(total).map_err(|_| CudaError::InvalidValue)?).map_err(|_| {
        tracing::warn!("a strided copy of {total} bytes: no memory to pack its rows");
        CudaError::MemoryAllocation
    })?;
    for z in 0..d {
        for y in 0..h {
            let row = (addr + z * slice + y * pitch) as usize as *const u8;
            // SAFETY: a row of the region, `w` readable bytes (this function's contract; the
            // addresses were checked not to overflow), left alone by the application while its
            // call runs.
            packed.extend_from_slice(unsafe { std::slice::from_raw_parts(row, w as usize) });
        }
    }
    Ok(packed)
}

#[allow(clippy::too_many_arguments)]
fn send(
    dst: Side,
    dst_ptr: Ptr<'_>,
    src: Side,
    src_ptr: Ptr<'_>,
    (w, h, d): (u64, u64, u64),
    direction: i32,
    stream: Option<u64>,
) -> Result<Option<Vec<u8>>, CudaError> {
    let reply = runtime::call(&PhosMemcpy3DRequest {
        dst: dst_ptr,
        dpitch: dst.pitch,
        dslice: if d > 1 { dst.slice } else { 0 },
        src: src_ptr,
        spitch: src.pitch,
        sslice: if d > 1 { src.slice } else { 0 },
        width: w,
        height: h,
        depth: d,
        direction,
        stream: stream.unwrap_or(0),
        ordered: stream.is_some() as i32,
    })?;
    Ok(reply.dst)
}

/// `cudaMemcpy2D[Async]`.
///
/// # Safety
/// A host side must be readable (the source) or writable (the destination) for `height` rows
/// of `width` bytes at its pitch.
#[allow(clippy::too_many_arguments)]
pub unsafe fn memcpy_2d(
    dst: *mut c_void,
    dpitch: usize,
    src: *const c_void,
    spitch: usize,
    width: usize,
    height: usize,
    kind: i32,
    stream: Option<u64>,
) -> Result<(), CudaError> {
    if width > 0 && height > 0 && (dst.is_null() || src.is_null()) {
        return Err(CudaError::InvalidValue);
    }
    let side = |p: u64, pitch: usize| Side { addr: p, pitch: pitch as u64, slice: 0 };
    // SAFETY: the host sides as this function's contract gives them.
    unsafe {
        copy_3d(side(dst as u64, dpitch), side(src as u64, spitch), (width as u64, height as u64, 1), kind, stream)
    }
}

/// `struct cudaMemcpy3DParms` (the same in CUDA 11, 12 and 13).
#[repr(C)]
pub(crate) struct Memcpy3DParms {
    pub src_array: u64,
    pub src_pos: Extent,
    pub src_ptr: PitchedPtr,
    pub dst_array: u64,
    pub dst_pos: Extent,
    pub dst_ptr: PitchedPtr,
    pub extent: Extent,
    pub kind: i32,
}

/// `cudaMemcpy3D[Async]`.
///
/// # Safety
/// A non-null `p` must point to a `cudaMemcpy3DParms` whose host sides are readable (the
/// source) or writable (the destination) for its extent.
pub unsafe fn memcpy_3d(p: *const c_void, stream: Option<u64>) -> Result<(), CudaError> {
    if p.is_null() {
        return Err(CudaError::InvalidValue);
    }
    // SAFETY: not null: a `cudaMemcpy3DParms` (this function's contract), read without
    // assuming alignment.
    let p = unsafe { (p as *const Memcpy3DParms).read_unaligned() };
    if p.src_array != 0 || p.dst_array != 0 {
        // SAFETY: the parameters' host sides as this function's contract gives them.
        return unsafe { super::arrays::memcpy_3d(&p, stream) };
    }
    if p.src_ptr.ptr == 0 || p.dst_ptr.ptr == 0 {
        return Err(CudaError::InvalidValue);
    }
    // Positions and pitches come from the application: arithmetic that overflows names no
    // memory, and fails the call.
    let side = |ptr: &PitchedPtr, pos: &Extent| -> Option<Side> {
        let pitch = ptr.pitch as u64;
        let slice = pitch.checked_mul(ptr.ysize as u64)?;
        let offset = (pos.depth as u64).checked_mul(slice)?.checked_add((pos.height as u64).checked_mul(pitch)?)?;
        Some(Side { addr: ptr.ptr.checked_add(offset)?.checked_add(pos.width as u64)?, pitch, slice })
    };
    let (Some(src), Some(dst)) = (side(&p.src_ptr, &p.src_pos), side(&p.dst_ptr, &p.dst_pos)) else {
        return Err(CudaError::InvalidValue);
    };
    let e = p.extent;
    let rows_fit = |s: Side| s.pitch.checked_mul(e.height as u64).is_some_and(|n| s.slice >= n);
    if e.depth > 1 && !(rows_fit(src) && rows_fit(dst)) {
        return Err(CudaError::InvalidValue);
    }
    // SAFETY: the parameters' host sides as this function's contract gives them.
    unsafe { copy_3d(dst, src, (e.width as u64, e.height as u64, e.depth as u64), p.kind, stream) }
}

/// `struct cudaMemcpy3DPeerParms`: the 3D parameters with a device per side and no kind.
#[repr(C)]
struct Memcpy3DPeerParms {
    src_array: u64,
    src_pos: Extent,
    src_ptr: PitchedPtr,
    src_device: i32,
    dst_array: u64,
    dst_pos: Extent,
    dst_ptr: PitchedPtr,
    dst_device: i32,
    extent: Extent,
}

/// `cudaMemcpy3DPeer[Async]`: both ordinals checked, then a device-to-device 3D copy (the
/// session's devices share one address space).
///
/// # Safety
/// A non-null `p` must point to a `cudaMemcpy3DPeerParms`.
pub unsafe fn memcpy_3d_peer(p: *const c_void, stream: Option<u64>) -> Result<(), CudaError> {
    if p.is_null() {
        return Err(CudaError::InvalidValue);
    }
    // SAFETY: not null: a `cudaMemcpy3DPeerParms` (this function's contract), read without
    // assuming alignment.
    let q = unsafe { (p as *const Memcpy3DPeerParms).read_unaligned() };
    let devices = runtime::session()?.device_count;
    if !(0..devices).contains(&q.src_device) || !(0..devices).contains(&q.dst_device) {
        return Err(CudaError::InvalidDevice);
    }
    let plain = Memcpy3DParms {
        src_array: q.src_array,
        src_pos: q.src_pos,
        src_ptr: q.src_ptr,
        dst_array: q.dst_array,
        dst_pos: q.dst_pos,
        dst_ptr: q.dst_ptr,
        extent: q.extent,
        kind: consts::cudaMemcpyDeviceToDevice,
    };
    // SAFETY: a local `cudaMemcpy3DParms` of a device-to-device copy: neither side is host
    // memory this process touches.
    unsafe { memcpy_3d(&plain as *const Memcpy3DParms as *const c_void, stream) }
}

#[allow(clippy::too_many_arguments)]
pub fn memset_3d(
    ptr: u64,
    pitch: usize,
    slice: usize,
    value: i32,
    (w, h, d): (usize, usize, usize),
    stream: Option<u64>,
) -> Result<(), CudaError> {
    if w == 0 || h == 0 || d == 0 {
        return Ok(());
    }
    if w > pitch {
        return Err(CudaError::InvalidPitchValue);
    }
    let r = runtime::call(&PhosMemset3DRequest {
        dst: ptr,
        pitch: pitch as u64,
        slice: if d > 1 { slice as u64 } else { 0 },
        value,
        width: w as u64,
        height: h as u64,
        depth: d as u64,
        stream: stream.unwrap_or(0),
        ordered: stream.is_some() as i32,
    })
    .map(|_| ());
    if stream.is_some() && super::memsets::writes_page_locked(ptr) {
        // Queued: it writes memory the host reads without a call, later.
        runtime::note_work(None);
    }
    r
}

/// `cudaMemcpyPeer[Async]`: both ordinals must name devices; the session's devices share one
/// address space, so the copy is device to device.
pub fn memcpy_peer(
    dst: *mut c_void,
    dst_device: i32,
    src: *const c_void,
    src_device: i32,
    count: usize,
    stream: Option<*mut c_void>,
) -> Result<(), CudaError> {
    let devices = runtime::session()?.device_count;
    if !(0..devices).contains(&dst_device) || !(0..devices).contains(&src_device) {
        return Err(CudaError::InvalidDevice);
    }
    let kind = consts::cudaMemcpyDeviceToDevice;
    status(match stream {
        // SAFETY: a device-to-device copy: `cudaMemcpy` dereferences neither pointer in this
        // process (both travel as device addresses).
        None => unsafe { super::stubs::cudaMemcpy(dst, src, count, kind) },
        // SAFETY: as above.
        Some(s) => unsafe { super::stubs::cudaMemcpyAsync(dst, src, count, kind, s) },
    })
}

/// `cudaMemoryType` values.
const MEMORY_UNREGISTERED: i32 = 0;
const MEMORY_HOST: i32 = 1;
const MEMORY_DEVICE: i32 = 2;
const MEMORY_MANAGED: i32 = 3;

/// `cudaPointerGetAttributes`. Host memory is the guest's (page-locked by `cudaHostAlloc` or
/// registered); device memory is asked about at the server.
pub unsafe fn pointer_attributes(out: *mut c_void, ptr: *const c_void) -> Result<(), CudaError> {
    if out.is_null() {
        return Err(CudaError::InvalidValue);
    }
    let addr = ptr as usize as u64;
    let (kind, device, device_ptr, host_ptr) = if hostmem::managed(addr as usize).is_some() {
        // One address for the host and every device; CUDA names the device current at the call.
        (MEMORY_MANAGED, runtime::current_device(), addr, addr)
    } else if let Some((_, _, _, device)) = hostmem::lookup_any(addr as usize) {
        // Arena memory (allocated, or registered and moved there) where the server maps it;
        // other page-locked memory at its own address, as under unified addressing.
        (MEMORY_HOST, device, hostmem::mapped_device_pointer(addr as usize).unwrap_or(addr), addr)
    } else if addr != 0 && (runtime::session()?.contains(addr) || registry::is_module_global(addr)) {
        let device = runtime::call(&PhosPointerDeviceRequest { ptr: addr })?.device;
        (MEMORY_DEVICE, device, addr, 0)
    } else {
        // cudaInvalidDeviceId
        (MEMORY_UNREGISTERED, -2, 0, 0)
    };
    // CUDA 11 and 12: { type, device, devicePointer, hostPointer }; CUDA 13 appends 64 bytes.
    let size = if soname::current_abi().major() >= 13 { 88 } else { 24 };
    let mut bytes = [0u8; 88];
    bytes[0..4].copy_from_slice(&kind.to_ne_bytes());
    bytes[4..8].copy_from_slice(&device.to_ne_bytes());
    bytes[8..16].copy_from_slice(&device_ptr.to_ne_bytes());
    bytes[16..24].copy_from_slice(&host_ptr.to_ne_bytes());
    // SAFETY: not null (checked above): a `cudaPointerAttributes` of this process's ABI,
    // `size` writable bytes (this function's contract).
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), out as *mut u8, size) };
    Ok(())
}
