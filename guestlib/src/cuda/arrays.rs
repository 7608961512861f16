//! CUDA arrays, texture objects and surface objects through the driver API: the driver's
//! descriptors (`CUDA_ARRAY3D_DESCRIPTOR`, `CUDA_MEMCPY2D`/`3D`, `CUDA_RESOURCE_DESC`,
//! `CUDA_TEXTURE_DESC`...) become the runtime's internal calls (guestlib/src/cudart/arrays.rs),
//! on the same session and the same virtual handles: an array made with `cuArrayCreate` is a
//! `cudaArray_t` and the other way round. The driver's structs are the same in CUDA 11, 12 and
//! 13.

use std::ffi::c_void;

use phos_protocol::cuda::CuError;
use phos_protocol::cudart::{PhosSurfaceCreateRequest, PhosTextureGetDescRequest, consts};
use phos_protocol::types::{ChannelFormatDesc, ResourceViewWire, TextureDescWire};

use super::bridge::from_runtime;
use crate::cudart::arrays::{self as rt, ResourceDesc};
use crate::cudart::memory::{self, Side};
use crate::runtime;

/// `CUarray_format` and the channel kind and bits the runtime names it by
/// (`cudaChannelFormatKind`: signed 0, unsigned 1, float 2).
const FORMATS: &[(u32, i32, i32)] = &[
    (0x01, 1, 8),  // CU_AD_FORMAT_UNSIGNED_INT8
    (0x02, 1, 16), // CU_AD_FORMAT_UNSIGNED_INT16
    (0x03, 1, 32), // CU_AD_FORMAT_UNSIGNED_INT32
    (0x08, 0, 8),  // CU_AD_FORMAT_SIGNED_INT8
    (0x09, 0, 16), // CU_AD_FORMAT_SIGNED_INT16
    (0x0a, 0, 32), // CU_AD_FORMAT_SIGNED_INT32
    (0x10, 2, 16), // CU_AD_FORMAT_HALF
    (0x20, 2, 32), // CU_AD_FORMAT_FLOAT
];

/// The runtime's channel description of `channels` channels of `format`. Other formats (the
/// block-compressed and packed ones) are not carried; a channel count other than 1, 2 or 4 is
/// no array the driver makes.
pub(crate) fn channel_desc(format: u32, channels: u32) -> Result<ChannelFormatDesc, CuError> {
    if !matches!(channels, 1 | 2 | 4) {
        return Err(CuError::INVALID_VALUE);
    }
    let Some(&(_, kind, bits)) = FORMATS.iter().find(|f| f.0 == format) else {
        crate::log::not_supported_once(
            "a CUDA array format other than 8, 16 and 32-bit integers, half and float (cuArrayCreate, cuTexObjectCreate)",
            "CUDA_ERROR_NOT_SUPPORTED",
        );
        return Err(CuError::NOT_SUPPORTED);
    };
    let bits_of = |k: u32| if k < channels { bits } else { 0 };
    Ok(ChannelFormatDesc { x: bits_of(0), y: bits_of(1), z: bits_of(2), w: bits_of(3), f: kind })
}

/// The driver's format and channel count of a runtime channel description.
fn format_of(d: &ChannelFormatDesc) -> Result<(u32, u32), CuError> {
    let channels = [d.x, d.y, d.z, d.w].iter().take_while(|&&b| b > 0).count() as u32;
    FORMATS.iter().find(|f| f.1 == d.f && f.2 == d.x).map(|f| (f.0, channels)).ok_or(CuError::NOT_SUPPORTED)
}

/// `CUDA_ARRAY3D_DESCRIPTOR` (and, without `depth` and `flags`, `CUDA_ARRAY_DESCRIPTOR`).
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct Array3DDescriptor {
    width: usize,
    height: usize,
    depth: usize,
    format: u32,
    channels: u32,
    flags: u32,
}

/// `CUDA_ARRAY_DESCRIPTOR`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct ArrayDescriptor {
    width: usize,
    height: usize,
    format: u32,
    channels: u32,
}

/// `cuArrayCreate_v2` (`three_d` false: a `CUDA_ARRAY_DESCRIPTOR`), `cuArray3DCreate_v2`, and
/// `cuMipmappedArrayCreate` (`levels`).
///
/// # Safety
/// `out` null or writable; `desc` null or the descriptor `three_d` says.
pub unsafe fn create(
    out: *mut *mut c_void,
    desc: *const c_void,
    three_d: bool,
    levels: Option<u32>,
) -> Result<(), CuError> {
    if out.is_null() || desc.is_null() {
        return Err(CuError::INVALID_VALUE);
    }
    let d = if three_d {
        // SAFETY: a `CUDA_ARRAY3D_DESCRIPTOR` (this function's contract), read unaligned.
        unsafe { (desc as *const Array3DDescriptor).read_unaligned() }
    } else {
        // SAFETY: a `CUDA_ARRAY_DESCRIPTOR` (this function's contract), read unaligned.
        let d = unsafe { (desc as *const ArrayDescriptor).read_unaligned() };
        Array3DDescriptor {
            width: d.width,
            height: d.height,
            format: d.format,
            channels: d.channels,
            ..Default::default()
        }
    };
    if d.width == 0 {
        return Err(CuError::INVALID_VALUE);
    }
    let channels = channel_desc(d.format, d.channels)?;
    // SAFETY: `out` is writable (checked not null; this function's contract) and `channels` a
    // local description.
    from_runtime(unsafe { rt::malloc_array(out, &channels, [d.width, d.height, d.depth], d.flags, levels) })
}

/// `cuArrayGetDescriptor_v2` (`three_d` false) and `cuArray3DGetDescriptor_v2`.
///
/// # Safety
/// `out` null or a writable descriptor of the kind `three_d` says.
pub unsafe fn describe(out: *mut c_void, array: *mut c_void, three_d: bool) -> Result<(), CuError> {
    if out.is_null() {
        return Err(CuError::INVALID_VALUE);
    }
    let (desc, extent, flags) = from_runtime(rt::info(array))?;
    let (format, channels) = format_of(&desc)?;
    if three_d {
        let d = Array3DDescriptor {
            width: extent.width,
            height: extent.height,
            depth: extent.depth,
            format,
            channels,
            flags,
        };
        // SAFETY: a writable `CUDA_ARRAY3D_DESCRIPTOR` (this function's contract).
        unsafe { (out as *mut Array3DDescriptor).write_unaligned(d) };
    } else {
        // The 2D query of a 3D array is the driver's error.
        if extent.depth > 0 {
            return Err(CuError::INVALID_VALUE);
        }
        let d = ArrayDescriptor { width: extent.width, height: extent.height, format, channels };
        // SAFETY: a writable `CUDA_ARRAY_DESCRIPTOR` (this function's contract).
        unsafe { (out as *mut ArrayDescriptor).write_unaligned(d) };
    }
    Ok(())
}

/// `CUmemorytype`.
const MEMORY_HOST: u32 = 1;
const MEMORY_DEVICE: u32 = 2;
const MEMORY_ARRAY: u32 = 3;
const MEMORY_UNIFIED: u32 = 4;

/// `CUDA_MEMCPY3D` (the same fields serve `CUDA_MEMCPY2D`, read into it).
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct Memcpy3D {
    src_x: usize,
    src_y: usize,
    src_z: usize,
    src_lod: usize,
    src_type: u32,
    src_host: u64,
    src_device: u64,
    src_array: u64,
    reserved0: u64,
    src_pitch: usize,
    src_height: usize,
    dst_x: usize,
    dst_y: usize,
    dst_z: usize,
    dst_lod: usize,
    dst_type: u32,
    dst_host: u64,
    dst_device: u64,
    dst_array: u64,
    reserved1: u64,
    dst_pitch: usize,
    dst_height: usize,
    width: usize,
    height: usize,
    depth: usize,
}

/// `CUDA_MEMCPY2D`.
#[repr(C)]
#[derive(Clone, Copy)]
struct Memcpy2D {
    src_x: usize,
    src_y: usize,
    src_type: u32,
    src_host: u64,
    src_device: u64,
    src_array: u64,
    src_pitch: usize,
    dst_x: usize,
    dst_y: usize,
    dst_type: u32,
    dst_host: u64,
    dst_device: u64,
    dst_array: u64,
    dst_pitch: usize,
    width: usize,
    height: usize,
}

/// One side of a driver copy.
enum End {
    /// Host, device or unified memory at this address (its position applied), and the kind of
    /// memory as `cudaMemcpyKind` sees it: host, device, or either (unified).
    Linear(Side, Place),
    /// An array and the byte position in it.
    Array(u64, [u64; 3]),
}

#[derive(Clone, Copy, PartialEq)]
enum Place {
    Host,
    Device,
    Either,
}

/// A side of `CUDA_MEMCPY3D`: its memory type, pointers, position and pitches.
#[allow(clippy::too_many_arguments)]
fn end(
    kind: u32,
    host: u64,
    device: u64,
    array: u64,
    [x, y, z]: [usize; 3],
    pitch: usize,
    rows: usize,
    width: usize,
) -> Result<End, CuError> {
    let [x, y, z, pitch, rows] = [x, y, z, pitch, rows].map(|n| n as u64);
    let (addr, place) = match kind {
        MEMORY_ARRAY => {
            if array == 0 {
                return Err(CuError::INVALID_VALUE);
            }
            return Ok(End::Array(array, [x, y, z]));
        }
        MEMORY_HOST => (host, Place::Host),
        MEMORY_DEVICE => (device, Place::Device),
        MEMORY_UNIFIED => (device, Place::Either),
        _ => return Err(CuError::INVALID_VALUE),
    };
    if addr == 0 || (pitch as usize) < width {
        return Err(CuError::INVALID_VALUE);
    }
    let slice = pitch.checked_mul(rows).ok_or(CuError::INVALID_VALUE)?;
    let offset = z
        .checked_mul(slice)
        .and_then(|n| n.checked_add(y.checked_mul(pitch)?))
        .and_then(|n| n.checked_add(x))
        .and_then(|n| n.checked_add(addr))
        .ok_or(CuError::INVALID_VALUE)?;
    Ok(End::Linear(Side { addr: offset, pitch, slice }, place))
}

/// The runtime's `cudaMemcpyKind` of a copy between two places.
fn kind_of(src: Place, dst: Place) -> i32 {
    match (src, dst) {
        (Place::Host, Place::Host) => consts::cudaMemcpyHostToHost,
        (Place::Host, Place::Device) => consts::cudaMemcpyHostToDevice,
        (Place::Device, Place::Host) => consts::cudaMemcpyDeviceToHost,
        (Place::Device, Place::Device) => consts::cudaMemcpyDeviceToDevice,
        _ => consts::cudaMemcpyDefault,
    }
}

/// A copy of `width` bytes x `height` rows x `depth` slices between two sides.
///
/// # Safety
/// Host sides readable (the source) or writable (the destination) for the extent.
unsafe fn copy(src: End, dst: End, extent: (u64, u64, u64), stream: Option<u64>) -> Result<(), CuError> {
    let r = match (src, dst) {
        // SAFETY: host sides as this function's contract gives them.
        (End::Linear(s, sp), End::Linear(d, dp)) => unsafe { memory::copy_3d(d, s, extent, kind_of(sp, dp), stream) },
        (End::Linear(s, sp), End::Array(a, at)) => {
            // SAFETY: a host source as this function's contract gives it.
            unsafe { rt::copy_to_array(a, at, s, extent, kind_of(sp, Place::Device), stream) }
        }
        (End::Array(a, at), End::Linear(d, dp)) => {
            // SAFETY: a host destination as this function's contract gives it.
            unsafe { rt::copy_from_array(d, a, at, extent, kind_of(Place::Device, dp), stream) }
        }
        (End::Array(s, sat), End::Array(d, dat)) => {
            rt::copy_array_to_array(d, dat, s, sat, extent, consts::cudaMemcpyDeviceToDevice, stream)
        }
    };
    from_runtime(r)
}

/// `cuMemcpy3D_v2[Async]`.
///
/// # Safety
/// `p` null or a `CUDA_MEMCPY3D` whose host sides are readable (the source) or writable (the
/// destination) for its extent.
pub unsafe fn memcpy_3d(p: *const c_void, stream: Option<u64>) -> Result<(), CuError> {
    if p.is_null() {
        return Err(CuError::INVALID_VALUE);
    }
    // SAFETY: a `CUDA_MEMCPY3D` (this function's contract), read unaligned.
    let c = unsafe { (p as *const Memcpy3D).read_unaligned() };
    // Mip levels are reached through `cuMipmappedArrayGetLevel`; the fields must be zero.
    if c.src_lod != 0 || c.dst_lod != 0 || c.reserved0 != 0 || c.reserved1 != 0 {
        return Err(CuError::INVALID_VALUE);
    }
    let (w, h, d) = (c.width, c.height, c.depth);
    if w == 0 || h == 0 || d == 0 {
        return Ok(());
    }
    let src = end(
        c.src_type,
        c.src_host,
        c.src_device,
        c.src_array,
        [c.src_x, c.src_y, c.src_z],
        c.src_pitch,
        c.src_height,
        w,
    )?;
    let dst = end(
        c.dst_type,
        c.dst_host,
        c.dst_device,
        c.dst_array,
        [c.dst_x, c.dst_y, c.dst_z],
        c.dst_pitch,
        c.dst_height,
        w,
    )?;
    // Slices of a linear side must hold the rows copied.
    let rows_fit = |e: &End, rows: usize| match e {
        End::Linear(..) => d == 1 || rows >= h,
        End::Array(..) => true,
    };
    if !rows_fit(&src, c.src_height) || !rows_fit(&dst, c.dst_height) {
        return Err(CuError::INVALID_VALUE);
    }
    // SAFETY: host sides as this function's contract gives them.
    unsafe { copy(src, dst, (w as u64, h as u64, d as u64), stream) }
}

/// A graph copy node's source, destination, extent and `cudaMemcpyKind`.
pub type GraphCopy = (Side, Side, (u64, u64, u64), i32);

/// A graph copy node's `CUDA_MEMCPY3D` (`cuGraphAddMemcpyNode`): its two linear sides, its
/// extent and the runtime's `cudaMemcpyKind` between them. Copies with arrays are not carried
/// in graphs (as for the runtime's copy nodes).
///
/// # Safety
/// `p` null or a readable `CUDA_MEMCPY3D`.
pub unsafe fn graph_copy(p: *const c_void) -> Result<GraphCopy, CuError> {
    if p.is_null() {
        return Err(CuError::INVALID_VALUE);
    }
    // SAFETY: a `CUDA_MEMCPY3D` (this function's contract), read unaligned.
    let c = unsafe { (p as *const Memcpy3D).read_unaligned() };
    if c.src_lod != 0 || c.dst_lod != 0 || c.reserved0 != 0 || c.reserved1 != 0 {
        return Err(CuError::INVALID_VALUE);
    }
    let (w, h, d) = (c.width, c.height, c.depth);
    if w == 0 || h == 0 || d == 0 {
        return Err(CuError::INVALID_VALUE);
    }
    let src = end(
        c.src_type,
        c.src_host,
        c.src_device,
        c.src_array,
        [c.src_x, c.src_y, c.src_z],
        c.src_pitch,
        c.src_height,
        w,
    )?;
    let dst = end(
        c.dst_type,
        c.dst_host,
        c.dst_device,
        c.dst_array,
        [c.dst_x, c.dst_y, c.dst_z],
        c.dst_pitch,
        c.dst_height,
        w,
    )?;
    match (src, dst) {
        (End::Linear(s, sp), End::Linear(t, tp)) => {
            if d > 1 && (c.src_height < h || c.dst_height < h) {
                return Err(CuError::INVALID_VALUE);
            }
            Ok((s, t, (w as u64, h as u64, d as u64), kind_of(sp, tp)))
        }
        _ => {
            crate::log::not_supported_once("graph copy nodes with CUDA arrays", "CUDA_ERROR_NOT_SUPPORTED");
            Err(CuError::NOT_SUPPORTED)
        }
    }
}

/// The bytes of a `CUDA_MEMCPY3D`, kept as a caller gave them.
pub type Memcpy3DBytes = [u8; std::mem::size_of::<Memcpy3D>()];

/// The `CUDA_MEMCPY3D` at `p`, as it is.
///
/// # Safety
/// `p` a readable `CUDA_MEMCPY3D`.
pub unsafe fn copy_bytes(p: *const c_void) -> Memcpy3DBytes {
    // SAFETY: a `CUDA_MEMCPY3D` (this function's contract), read unaligned.
    unsafe { (p as *const Memcpy3DBytes).read_unaligned() }
}

/// Write the `CUDA_MEMCPY3D` of a graph's copy between linear memory, as the runtime describes
/// it (`cudaGraphMemcpyNodeGetParams`): positions zero, the sides' memory types from its
/// `cudaMemcpyKind` (the default kind's sides, which CUDA resolves from the pointers, unified).
///
/// # Safety
/// `out` a writable `CUDA_MEMCPY3D`.
pub unsafe fn write_linear_copy(out: *mut c_void, p: &crate::cudart::memory::Memcpy3DParms) {
    let (src_type, dst_type) = match p.kind {
        consts::cudaMemcpyHostToDevice => (MEMORY_HOST, MEMORY_DEVICE),
        consts::cudaMemcpyDeviceToHost => (MEMORY_DEVICE, MEMORY_HOST),
        consts::cudaMemcpyHostToHost => (MEMORY_HOST, MEMORY_HOST),
        consts::cudaMemcpyDeviceToDevice => (MEMORY_DEVICE, MEMORY_DEVICE),
        _ => (MEMORY_UNIFIED, MEMORY_UNIFIED),
    };
    let side = |t: u32, a: u64| if t == MEMORY_HOST { (a, 0) } else { (0, a) };
    let (src_host, src_device) = side(src_type, p.src_ptr.ptr);
    let (dst_host, dst_device) = side(dst_type, p.dst_ptr.ptr);
    let c = Memcpy3D {
        src_type,
        src_host,
        src_device,
        src_pitch: p.src_ptr.pitch,
        src_height: p.src_ptr.ysize,
        dst_type,
        dst_host,
        dst_device,
        dst_pitch: p.dst_ptr.pitch,
        dst_height: p.dst_ptr.ysize,
        width: p.extent.width,
        height: p.extent.height,
        depth: p.extent.depth,
        ..Default::default()
    };
    // SAFETY: a writable `CUDA_MEMCPY3D` (this function's contract), written unaligned.
    unsafe { (out as *mut Memcpy3D).write_unaligned(c) };
}

/// `cuMemcpy2D_v2`, `cuMemcpy2DUnaligned_v2`, `cuMemcpy2DAsync_v2`.
///
/// # Safety
/// `p` null or a `CUDA_MEMCPY2D` whose host sides are readable (the source) or writable (the
/// destination) for its rows.
pub unsafe fn memcpy_2d(p: *const c_void, stream: Option<u64>) -> Result<(), CuError> {
    if p.is_null() {
        return Err(CuError::INVALID_VALUE);
    }
    // SAFETY: a `CUDA_MEMCPY2D` (this function's contract), read unaligned.
    let c = unsafe { (p as *const Memcpy2D).read_unaligned() };
    if c.width == 0 || c.height == 0 {
        return Ok(());
    }
    let src = end(c.src_type, c.src_host, c.src_device, c.src_array, [c.src_x, c.src_y, 0], c.src_pitch, 0, c.width)?;
    let dst = end(c.dst_type, c.dst_host, c.dst_device, c.dst_array, [c.dst_x, c.dst_y, 0], c.dst_pitch, 0, c.width)?;
    // SAFETY: host sides as this function's contract gives them.
    unsafe { copy(src, dst, (c.width as u64, c.height as u64, 1), stream) }
}

/// The 1D copies to and from arrays (`cuMemcpyHtoA`, `AtoH`, `DtoA`, `AtoD` and their async
/// forms): `count` bytes at byte `offset` of the array, running on into its next rows like the
/// runtime's `cudaMemcpyToArray`.
///
/// # Safety
/// A host side readable (to the array) or writable (from it) for `count` bytes.
pub unsafe fn to_array(
    array: *mut c_void,
    offset: usize,
    src: *const c_void,
    count: usize,
    from_device: bool,
    stream: Option<u64>,
) -> Result<(), CuError> {
    let kind = if from_device { consts::cudaMemcpyDeviceToDevice } else { consts::cudaMemcpyHostToDevice };
    if src.is_null() && count > 0 {
        return Err(CuError::INVALID_VALUE);
    }
    // SAFETY: as this function's contract gives the host side.
    from_runtime(unsafe { rt::memcpy_to_array(array, offset, 0, src, count, kind, stream) })
}

/// See [`to_array`].
///
/// # Safety
/// As [`to_array`].
pub unsafe fn from_array(
    dst: *mut c_void,
    array: *mut c_void,
    offset: usize,
    count: usize,
    to_device: bool,
    stream: Option<u64>,
) -> Result<(), CuError> {
    let kind = if to_device { consts::cudaMemcpyDeviceToDevice } else { consts::cudaMemcpyDeviceToHost };
    if dst.is_null() && count > 0 {
        return Err(CuError::INVALID_VALUE);
    }
    // SAFETY: as this function's contract gives the host side.
    from_runtime(unsafe { rt::memcpy_from_array(dst, array, offset, 0, count, kind, stream) })
}

/// `cuMemcpyAtoA_v2`: `count` bytes between two arrays.
pub fn array_to_array(
    dst: *mut c_void,
    dst_offset: usize,
    src: *mut c_void,
    src_offset: usize,
    count: usize,
) -> Result<(), CuError> {
    from_runtime(rt::memcpy_array_to_array(
        dst,
        (dst_offset, 0),
        src,
        (src_offset, 0),
        count,
        consts::cudaMemcpyDeviceToDevice,
    ))
}

/// `CUDA_RESOURCE_DESC`: the type, then a 128-byte union, then flags (which must be zero).
#[repr(C)]
#[derive(Clone, Copy)]
struct DriverResource {
    res_type: i32,
    /// `array.hArray`, `mipmap.hMipmappedArray`, or `linear`/`pitch2D.devPtr`.
    handle: u64,
    format: u32,
    channels: u32,
    /// `linear.sizeInBytes` or `pitch2D.width`.
    width: u64,
    height: u64,
    pitch: u64,
    rest: [u8; 128 - 40],
    flags: u32,
    tail: u32,
}

impl Default for DriverResource {
    fn default() -> Self {
        DriverResource {
            res_type: 0,
            handle: 0,
            format: 0,
            channels: 0,
            width: 0,
            height: 0,
            pitch: 0,
            rest: [0; 88],
            flags: 0,
            tail: 0,
        }
    }
}

/// `CUresourcetype`, the same values as `cudaResourceType`.
const RESOURCE_ARRAY: i32 = 0;
const RESOURCE_MIPMAPPED: i32 = 1;
const RESOURCE_LINEAR: i32 = 2;
const RESOURCE_PITCH_2D: i32 = 3;

/// The runtime's resource description of a driver one.
///
/// # Safety
/// `p` null or a `CUDA_RESOURCE_DESC`.
unsafe fn read_resource(p: *const c_void) -> Result<ResourceDesc, CuError> {
    if p.is_null() {
        return Err(CuError::INVALID_VALUE);
    }
    // SAFETY: a `CUDA_RESOURCE_DESC` (this function's contract), read unaligned.
    let r = unsafe { (p as *const DriverResource).read_unaligned() };
    if r.flags != 0 {
        return Err(CuError::INVALID_VALUE);
    }
    let mut out = ResourceDesc { res_type: r.res_type, dev_ptr: r.handle, ..Default::default() };
    match r.res_type {
        RESOURCE_ARRAY | RESOURCE_MIPMAPPED => {}
        RESOURCE_LINEAR => {
            out.desc = channel_desc(r.format, r.channels)?;
            out.width = r.width;
        }
        RESOURCE_PITCH_2D => {
            out.desc = channel_desc(r.format, r.channels)?;
            (out.width, out.height, out.pitch) = (r.width, r.height, r.pitch);
        }
        _ => return Err(CuError::INVALID_VALUE),
    }
    Ok(out)
}

/// Writes the driver's form of a runtime resource description.
///
/// # Safety
/// `p` null or a writable `CUDA_RESOURCE_DESC`.
unsafe fn write_resource(p: *mut c_void, r: &ResourceDesc) -> Result<(), CuError> {
    if p.is_null() {
        return Err(CuError::INVALID_VALUE);
    }
    let mut d = DriverResource { res_type: r.res_type, handle: r.dev_ptr, ..Default::default() };
    if matches!(r.res_type, RESOURCE_LINEAR | RESOURCE_PITCH_2D) {
        (d.format, d.channels) = format_of(&r.desc)?;
        (d.width, d.height, d.pitch) = (r.width, r.height, r.pitch);
    }
    // SAFETY: a writable `CUDA_RESOURCE_DESC` (this function's contract).
    unsafe { (p as *mut DriverResource).write_unaligned(d) };
    Ok(())
}

/// `CUDA_TEXTURE_DESC`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct DriverTextureDesc {
    address_mode: [i32; 3],
    filter_mode: i32,
    flags: u32,
    max_anisotropy: u32,
    mipmap_filter_mode: i32,
    mipmap_level_bias: f32,
    min_mipmap_level_clamp: f32,
    max_mipmap_level_clamp: f32,
    border_color: [f32; 4],
    reserved: [i32; 12],
}

/// `CU_TRSF_*`.
const READ_AS_INTEGER: u32 = 0x01;
const NORMALIZED_COORDINATES: u32 = 0x02;
const SRGB: u32 = 0x10;
const DISABLE_TRILINEAR_OPTIMIZATION: u32 = 0x20;
const SEAMLESS_CUBEMAP: u32 = 0x40;
const KNOWN_FLAGS: u32 =
    READ_AS_INTEGER | NORMALIZED_COORDINATES | SRGB | DISABLE_TRILINEAR_OPTIMIZATION | SEAMLESS_CUBEMAP;

/// `cudaReadModeElementType`, `cudaReadModeNormalizedFloat`.
const READ_ELEMENT: i32 = 0;
const READ_NORMALIZED: i32 = 1;

/// The runtime's texture description. The driver promotes 8- and 16-bit integers to floats in
/// [0, 1] (or [-1, 1]) unless told to read integers; 32-bit integers and floats are read as
/// they are.
fn texture_desc(t: &DriverTextureDesc, texel: &ChannelFormatDesc) -> Result<TextureDescWire, CuError> {
    if t.flags & !KNOWN_FLAGS != 0 {
        return Err(CuError::INVALID_VALUE);
    }
    let integer = matches!(texel.f, 0 | 1) && matches!(texel.x, 8 | 16);
    let read_mode = if integer && t.flags & READ_AS_INTEGER == 0 { READ_NORMALIZED } else { READ_ELEMENT };
    let flag = |f: u32| i32::from(t.flags & f != 0);
    Ok(TextureDescWire {
        address_mode: t.address_mode,
        filter_mode: t.filter_mode,
        read_mode,
        srgb: flag(SRGB),
        border_color: t.border_color,
        normalized_coords: flag(NORMALIZED_COORDINATES),
        max_anisotropy: t.max_anisotropy,
        mipmap_filter_mode: t.mipmap_filter_mode,
        mipmap_level_bias: t.mipmap_level_bias,
        min_mipmap_level_clamp: t.min_mipmap_level_clamp,
        max_mipmap_level_clamp: t.max_mipmap_level_clamp,
        disable_trilinear_optimization: flag(DISABLE_TRILINEAR_OPTIMIZATION),
        seamless_cubemap: flag(SEAMLESS_CUBEMAP),
    })
}

/// The format of the texels a resource holds (an array's is asked of the server).
fn texel_format(r: &ResourceDesc) -> Result<ChannelFormatDesc, CuError> {
    match r.res_type {
        RESOURCE_ARRAY => Ok(from_runtime(rt::info(r.dev_ptr as usize as *mut c_void))?.0),
        RESOURCE_MIPMAPPED => {
            let mut level: *mut c_void = std::ptr::null_mut();
            // SAFETY: `level` is a local the runtime writes; the handle is checked by the server.
            super::bridge::runtime(|| unsafe {
                crate::cudart::stubs::cudaGetMipmappedArrayLevel(&mut level, r.dev_ptr as usize as *mut c_void, 0)
            })?;
            Ok(from_runtime(rt::info(level))?.0)
        }
        _ => Ok(r.desc),
    }
}

/// `cuTexObjectCreate`.
///
/// # Safety
/// `out` null or writable; `res`, `tex` null or their structs; `view` null or a
/// `CUDA_RESOURCE_VIEW_DESC`.
pub unsafe fn create_texture(
    out: *mut u64,
    res: *const c_void,
    tex: *const c_void,
    view: *const c_void,
) -> Result<(), CuError> {
    if out.is_null() || tex.is_null() {
        return Err(CuError::INVALID_VALUE);
    }
    // SAFETY: as this function's contract gives `res`.
    let r = unsafe { read_resource(res)? };
    // SAFETY: a `CUDA_TEXTURE_DESC` (this function's contract), read unaligned.
    let t = unsafe { (tex as *const DriverTextureDesc).read_unaligned() };
    let desc = texture_desc(&t, &texel_format(&r)?)?;
    let view = if view.is_null() {
        None
    } else {
        // SAFETY: a `CUDA_RESOURCE_VIEW_DESC` (this function's contract): the runtime's fields,
        // then 16 reserved words, which must be zero.
        let v = unsafe { (view as *const ResourceViewWire).read_unaligned() };
        let reserved = (view as usize + std::mem::size_of::<ResourceViewWire>()) as *const u32;
        // SAFETY: the struct's 16 reserved words follow its fields.
        if (0..16).any(|i| unsafe { reserved.wrapping_add(i).read_unaligned() } != 0) {
            return Err(CuError::INVALID_VALUE);
        }
        Some(v)
    };
    let object = from_runtime(rt::texture_create(&r, desc, view))?;
    // SAFETY: not null (checked above), so writable (this function's contract).
    unsafe { out.write_unaligned(object) };
    Ok(())
}

/// `cuTexObjectGetResourceDesc`.
///
/// # Safety
/// `out` null or a writable `CUDA_RESOURCE_DESC`.
pub unsafe fn texture_resource(out: *mut c_void, object: u64) -> Result<(), CuError> {
    let r = from_runtime(rt::texture_resource(object))?;
    // SAFETY: as this function's contract gives `out`.
    unsafe { write_resource(out, &r) }
}

/// `cuTexObjectGetTextureDesc`.
///
/// # Safety
/// `out` null or a writable `CUDA_TEXTURE_DESC`.
pub unsafe fn texture_desc_of(out: *mut c_void, object: u64) -> Result<(), CuError> {
    if out.is_null() {
        return Err(CuError::INVALID_VALUE);
    }
    let t = from_runtime(runtime::call(&PhosTextureGetDescRequest { texObject: object }))?;
    let d = t.texDesc;
    // Integers read as they are, unless the texture promotes them.
    let read_as_integer = if d.read_mode == READ_ELEMENT { READ_AS_INTEGER } else { 0 };
    let flag = |set: i32, f: u32| if set != 0 { f } else { 0 };
    let desc = DriverTextureDesc {
        address_mode: d.address_mode,
        filter_mode: d.filter_mode,
        flags: read_as_integer
            | flag(d.normalized_coords, NORMALIZED_COORDINATES)
            | flag(d.srgb, SRGB)
            | flag(d.disable_trilinear_optimization, DISABLE_TRILINEAR_OPTIMIZATION)
            | flag(d.seamless_cubemap, SEAMLESS_CUBEMAP),
        max_anisotropy: d.max_anisotropy,
        mipmap_filter_mode: d.mipmap_filter_mode,
        mipmap_level_bias: d.mipmap_level_bias,
        min_mipmap_level_clamp: d.min_mipmap_level_clamp,
        max_mipmap_level_clamp: d.max_mipmap_level_clamp,
        border_color: d.border_color,
        reserved: [0; 12],
    };
    // SAFETY: not null, a writable `CUDA_TEXTURE_DESC` (this function's contract).
    unsafe { (out as *mut DriverTextureDesc).write_unaligned(desc) };
    Ok(())
}

/// `cuTexObjectGetResourceViewDesc`.
///
/// # Safety
/// `out` null or a writable `CUDA_RESOURCE_VIEW_DESC`.
pub unsafe fn texture_view(out: *mut c_void, object: u64) -> Result<(), CuError> {
    if out.is_null() {
        return Err(CuError::INVALID_VALUE);
    }
    let view = from_runtime(rt::texture_view(object))?;
    // SAFETY: a writable `CUDA_RESOURCE_VIEW_DESC` (this function's contract): the runtime's
    // fields, then 16 reserved words, zeroed.
    unsafe { std::ptr::write_bytes(out as *mut u8, 0, std::mem::size_of::<ResourceViewWire>() + 64) };
    // SAFETY: its prefix, written without assuming alignment.
    unsafe { (out as *mut ResourceViewWire).write_unaligned(view) };
    Ok(())
}

/// `cuSurfObjectCreate`: an array only, as for the runtime.
///
/// # Safety
/// `out` null or writable; `res` null or a `CUDA_RESOURCE_DESC`.
pub unsafe fn create_surface(out: *mut u64, res: *const c_void) -> Result<(), CuError> {
    if out.is_null() {
        return Err(CuError::INVALID_VALUE);
    }
    // SAFETY: as this function's contract gives `res`.
    let r = unsafe { read_resource(res)? };
    if r.res_type != RESOURCE_ARRAY {
        return Err(CuError::INVALID_VALUE);
    }
    let object = from_runtime(runtime::call(&PhosSurfaceCreateRequest { array: r.dev_ptr }))?.surfObject;
    // SAFETY: not null (checked above), so writable (this function's contract).
    unsafe { out.write_unaligned(object) };
    Ok(())
}

/// `cuSurfObjectGetResourceDesc`.
///
/// # Safety
/// `out` null or a writable `CUDA_RESOURCE_DESC`.
pub unsafe fn surface_resource(out: *mut c_void, object: u64) -> Result<(), CuError> {
    let r = from_runtime(rt::surface_resource_of(object))?;
    // SAFETY: as this function's contract gives `out`.
    unsafe { write_resource(out, &r) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn c_layouts() {
        assert_eq!(std::mem::size_of::<ArrayDescriptor>(), 24);
        assert_eq!(std::mem::size_of::<Array3DDescriptor>(), 40);
        assert_eq!(std::mem::size_of::<Memcpy2D>(), 128);
        assert_eq!(std::mem::size_of::<Memcpy3D>(), 200);
        assert_eq!(std::mem::size_of::<DriverResource>(), 144);
        assert_eq!(std::mem::size_of::<DriverTextureDesc>(), 104);
    }

    #[test]
    fn a_runtime_copy_described_for_the_driver_reads_back_as_the_same_copy() {
        use crate::cudart::memory::Memcpy3DParms;
        use phos_protocol::types::{Extent, PitchedPtr};
        let side = |ptr: u64, pitch: usize, ysize: usize| PitchedPtr { ptr, pitch, xsize: 48, ysize };
        let p = Memcpy3DParms {
            src_array: 0,
            src_pos: Extent::default(),
            src_ptr: side(0x7000_0000, 64, 4),
            dst_array: 0,
            dst_pos: Extent::default(),
            dst_ptr: side(0x1_0000_0000, 128, 8),
            extent: Extent { width: 48, height: 4, depth: 2 },
            kind: consts::cudaMemcpyHostToDevice,
        };
        let mut out = [0u8; 200];
        // SAFETY: 200 writable bytes, a `CUDA_MEMCPY3D`'s size.
        unsafe { write_linear_copy(out.as_mut_ptr().cast(), &p) };
        // SAFETY: the `CUDA_MEMCPY3D` just written.
        let c = unsafe { (out.as_ptr() as *const Memcpy3D).read_unaligned() };
        assert_eq!((c.src_type, c.src_host, c.src_device), (MEMORY_HOST, 0x7000_0000, 0));
        assert_eq!((c.dst_type, c.dst_host, c.dst_device), (MEMORY_DEVICE, 0, 0x1_0000_0000));
        // SAFETY: as above.
        let (src, dst, extent, kind) = unsafe { graph_copy(out.as_ptr().cast()) }.unwrap();
        assert_eq!((src.addr, src.pitch, src.slice), (0x7000_0000, 64, 256));
        assert_eq!((dst.addr, dst.pitch, dst.slice), (0x1_0000_0000, 128, 1024));
        assert_eq!((extent, kind), ((48, 4, 2), consts::cudaMemcpyHostToDevice));
        // SAFETY: the bytes are kept as they are.
        assert_eq!(unsafe { copy_bytes(out.as_ptr().cast()) }, out);
    }

    #[test]
    fn formats_go_both_ways() {
        for &(format, _, _) in FORMATS {
            for channels in [1, 2, 4] {
                let d = channel_desc(format, channels).unwrap();
                assert_eq!(format_of(&d).unwrap(), (format, channels));
            }
        }
        assert_eq!(channel_desc(0x20, 3).err(), Some(CuError::INVALID_VALUE));
    }

    #[test]
    fn small_integers_are_promoted_unless_read_as_integers() {
        let u8x1 = channel_desc(0x01, 1).unwrap();
        let i32x1 = channel_desc(0x0a, 1).unwrap();
        let mut t = DriverTextureDesc::default();
        assert_eq!(texture_desc(&t, &u8x1).unwrap().read_mode, READ_NORMALIZED);
        assert_eq!(texture_desc(&t, &i32x1).unwrap().read_mode, READ_ELEMENT);
        t.flags = READ_AS_INTEGER | NORMALIZED_COORDINATES;
        let d = texture_desc(&t, &u8x1).unwrap();
        assert_eq!((d.read_mode, d.normalized_coords), (READ_ELEMENT, 1));
        t.flags = 0x100;
        assert!(texture_desc(&t, &u8x1).is_err());
    }
}
