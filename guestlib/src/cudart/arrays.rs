//! CUDA arrays, texture objects and surface objects: the guest reads the runtime's C structs
//! (whose layouts differ between CUDA 11, 12 and 13), packs host rows, and calls the internal
//! `phosArrayCreate`, `phosMemcpy*Array*`, `phosTextureCreate`, ... The server checks every
//! extent, offset and pitch against the array's shape; the guest checks what it must to read
//! and write the application's memory safely.
//!
//! Array handles are virtual (`array`, `mipmapped_array` handles); texture and surface objects
//! are the server's backend's own values, which kernels take by value.

use std::ffi::c_void;

use phos_protocol::cudart::{
    PhosArrayCreateRequest, PhosArrayGetInfoRequest, PhosMemcpyArrayToArrayRequest, PhosMemcpyFromArrayRequest,
    PhosMemcpyToArrayRequest, PhosMipmappedArrayCreateRequest, PhosSurfaceCreateRequest, PhosSurfaceGetArrayRequest,
    PhosTextureCreateRequest, PhosTextureGetDescRequest, consts,
};
use phos_protocol::types::{ChannelFormatDesc, Extent, PitchedPtr, ResourceViewWire, TextureDescWire, array_bytes};
use phos_protocol::{CudaError, Ptr};

use super::hand::memcpy_kind_of;
use super::memory::{Memcpy3DParms, Side, check_carried, pack};
use crate::{runtime, soname};

/// `cudaResourceType`.
const RESOURCE_ARRAY: i32 = 0;
const RESOURCE_MIPMAPPED: i32 = 1;
const RESOURCE_LINEAR: i32 = 2;
const RESOURCE_PITCH_2D: i32 = 3;

fn handle(p: *mut c_void) -> u64 {
    p as usize as u64
}

/// `cudaMallocArray`, `cudaMalloc3DArray` (`levels` None) and `cudaMallocMipmappedArray`.
///
/// # Safety
/// `out` must be null or writable; `desc` null or a `cudaChannelFormatDesc`.
pub unsafe fn malloc_array(
    out: *mut *mut c_void,
    desc: *const ChannelFormatDesc,
    extent: [usize; 3],
    flags: u32,
    levels: Option<u32>,
) -> Result<(), CudaError> {
    if out.is_null() || desc.is_null() {
        return Err(CudaError::InvalidValue);
    }
    // SAFETY: not null: a `cudaChannelFormatDesc` (this function's contract), read without
    // assuming alignment.
    let desc = unsafe { desc.read_unaligned() };
    let esize = desc.element_size().ok_or(CudaError::InvalidChannelDescriptor)?;
    let [width, height, depth] = extent.map(|n| n as u64);
    // The server refuses a figure that is not the layout's; one that does not fit is no
    // allocation CUDA could make.
    let bytes =
        array_bytes(esize, [width, height, depth], flags, levels.unwrap_or(0)).ok_or(CudaError::MemoryAllocation)?;
    let handle = match levels {
        None => runtime::call(&PhosArrayCreateRequest { desc, width, height, depth, flags, bytes })?.array,
        Some(levels) => {
            runtime::call(&PhosMipmappedArrayCreateRequest { desc, width, height, depth, flags, levels, bytes })?.mipmap
        }
    };
    // SAFETY: not null (checked above), so writable (this function's contract).
    unsafe { *out = handle as usize as *mut c_void };
    Ok(())
}

/// An array's format, extent (as `cudaArrayGetInfo` gives it) and flags.
pub fn info(array: *mut c_void) -> Result<(ChannelFormatDesc, Extent, u32), CudaError> {
    let r = runtime::call(&PhosArrayGetInfoRequest { array: handle(array) })?;
    Ok((r.desc, r.extent, r.flags))
}

/// `cudaArrayGetInfo`: any output may be null.
///
/// # Safety
/// Each output must be null or writable.
pub unsafe fn array_get_info(
    desc: *mut ChannelFormatDesc,
    extent: *mut Extent,
    flags: *mut u32,
    array: *mut c_void,
) -> Result<(), CudaError> {
    let (d, e, f) = info(array)?;
    if !desc.is_null() {
        // SAFETY: not null, so writable (this function's contract).
        unsafe { desc.write_unaligned(d) };
    }
    if !extent.is_null() {
        // SAFETY: not null, so writable (this function's contract); unaligned writes are allowed.
        unsafe { extent.write_unaligned(e) };
    }
    if !flags.is_null() {
        // SAFETY: not null, so writable (this function's contract); unaligned writes are allowed.
        unsafe { flags.write_unaligned(f) };
    }
    Ok(())
}

/// Bytes of one element of an array.
pub(crate) fn element_size(array: *mut c_void) -> Result<u64, CudaError> {
    info(array)?.0.element_size().ok_or(CudaError::InvalidValue)
}

/// The direction of a copy into an array from `src`.
fn to_array_direction(kind: i32, src: u64) -> Result<i32, CudaError> {
    match kind {
        consts::cudaMemcpyHostToDevice | consts::cudaMemcpyDeviceToDevice => Ok(kind),
        consts::cudaMemcpyDefault if memcpy_kind_of(src) => Ok(consts::cudaMemcpyDeviceToDevice),
        consts::cudaMemcpyDefault => Ok(consts::cudaMemcpyHostToDevice),
        _ => Err(CudaError::InvalidMemcpyDirection),
    }
}

/// The direction of a copy out of an array to `dst`.
fn from_array_direction(kind: i32, dst: u64) -> Result<i32, CudaError> {
    match kind {
        consts::cudaMemcpyDeviceToHost | consts::cudaMemcpyDeviceToDevice => Ok(kind),
        consts::cudaMemcpyDefault if memcpy_kind_of(dst) => Ok(consts::cudaMemcpyDeviceToDevice),
        consts::cudaMemcpyDefault => Ok(consts::cudaMemcpyDeviceToHost),
        _ => Err(CudaError::InvalidMemcpyDirection),
    }
}

/// A copy of `w` bytes x `h` rows x `d` slices into `array` at `(x bytes, y, z)`.
///
/// # Safety
/// A host source must be readable for every row of the extent at its pitches.
pub(crate) unsafe fn copy_to_array(
    array: u64,
    [x, y, z]: [u64; 3],
    src: Side,
    (w, h, d): (u64, u64, u64),
    kind: i32,
    stream: Option<u64>,
) -> Result<(), CudaError> {
    if w == 0 || h == 0 || d == 0 {
        return Ok(());
    }
    if src.addr == 0 {
        return Err(CudaError::InvalidValue);
    }
    if w > src.pitch {
        return Err(CudaError::InvalidPitchValue);
    }
    let direction = to_array_direction(kind, src.addr)?;
    let packed = if direction == consts::cudaMemcpyHostToDevice {
        // SAFETY: a host source as this function's contract gives it.
        Some(unsafe { pack(src.addr, src.pitch, src.slice, (w, h, d))? })
    } else {
        None
    };
    let (src_ptr, spitch, sslice) = match &packed {
        Some(bytes) => (Ptr::In(bytes), w, w * h),
        None => (Ptr::Device(src.addr), src.pitch, if d > 1 { src.slice } else { 0 }),
    };
    runtime::call(&PhosMemcpyToArrayRequest {
        dst: array,
        x,
        y,
        z,
        src: src_ptr,
        spitch,
        sslice,
        width: w,
        height: h,
        depth: d,
        direction,
        stream: stream.unwrap_or(0),
        ordered: stream.is_some() as i32,
    })
    .map(|_| ())
}

/// A copy of `w` bytes x `h` rows x `d` slices out of `array` at `(x bytes, y, z)`.
///
/// # Safety
/// A host destination must be writable for every row of the extent at its pitches.
pub(crate) unsafe fn copy_from_array(
    dst: Side,
    array: u64,
    [x, y, z]: [u64; 3],
    (w, h, d): (u64, u64, u64),
    kind: i32,
    stream: Option<u64>,
) -> Result<(), CudaError> {
    if w == 0 || h == 0 || d == 0 {
        return Ok(());
    }
    if dst.addr == 0 {
        return Err(CudaError::InvalidValue);
    }
    if w > dst.pitch {
        return Err(CudaError::InvalidPitchValue);
    }
    let direction = from_array_direction(kind, dst.addr)?;
    let to_host = direction == consts::cudaMemcpyDeviceToHost;
    let total = w.checked_mul(h).and_then(|n| n.checked_mul(d)).ok_or(CudaError::InvalidValue)?;
    // Host rows must not wrap the address space.
    let last = (d - 1).checked_mul(dst.slice).and_then(|n| n.checked_add((h - 1).checked_mul(dst.pitch)?));
    if to_host && last.and_then(|n| n.checked_add(dst.addr)).and_then(|n| n.checked_add(w)).is_none() {
        return Err(CudaError::InvalidValue);
    }
    if to_host {
        check_carried(total)?;
    }
    let reply = runtime::call(&PhosMemcpyFromArrayRequest {
        dst: if to_host { Ptr::Out(total) } else { Ptr::Device(dst.addr) },
        dpitch: if to_host { w } else { dst.pitch },
        dslice: if to_host {
            w * h
        } else if d > 1 {
            dst.slice
        } else {
            0
        },
        src: array,
        x,
        y,
        z,
        width: w,
        height: h,
        depth: d,
        direction,
        stream: stream.unwrap_or(0),
        ordered: stream.is_some() as i32,
    })?;
    if to_host {
        let data = reply.dst.filter(|v| v.len() as u64 == total).ok_or(CudaError::Unknown)?;
        let rows = (0..d).flat_map(|z| (0..h).map(move |y| (y, z)));
        for ((y, z), row) in rows.zip(data.chunks_exact(w as usize)) {
            let at = dst.addr + z * dst.slice + y * dst.pitch;
            // SAFETY: row `(y, z)` of the host destination, `w` writable bytes (this
            // function's contract; the addresses were checked not to wrap); `row` is the
            // reply's.
            unsafe { std::ptr::copy_nonoverlapping(row.as_ptr(), at as usize as *mut u8, w as usize) };
        }
    }
    Ok(())
}

/// A copy between arrays (`kind` must be device to device or default).
pub(crate) fn copy_array_to_array(
    dst: u64,
    [dx, dy, dz]: [u64; 3],
    src: u64,
    [sx, sy, sz]: [u64; 3],
    (w, h, d): (u64, u64, u64),
    kind: i32,
    stream: Option<u64>,
) -> Result<(), CudaError> {
    if kind != consts::cudaMemcpyDeviceToDevice && kind != consts::cudaMemcpyDefault {
        return Err(CudaError::InvalidMemcpyDirection);
    }
    if w == 0 || h == 0 || d == 0 {
        return Ok(());
    }
    runtime::call(&PhosMemcpyArrayToArrayRequest {
        dst,
        dx,
        dy,
        dz,
        src,
        sx,
        sy,
        sz,
        width: w,
        height: h,
        depth: d,
        stream: stream.unwrap_or(0),
        ordered: stream.is_some() as i32,
    })
    .map(|_| ())
}

/// The bytes per row of an array's first level.
fn row_bytes(array: *mut c_void) -> Result<u64, CudaError> {
    let (desc, extent, _) = info(array)?;
    let esize = desc.element_size().ok_or(CudaError::InvalidValue)?;
    (extent.width as u64).checked_mul(esize).ok_or(CudaError::InvalidValue)
}

/// The deprecated linear copies (`cudaMemcpyToArray`, `cudaMemcpyFromArray`): `count` bytes
/// from `(x, y)` on, running on into the next rows, as up to three 2D copies (the rest of the
/// first row, whole rows, the start of the last row).
/// One 2D piece of a linear copy: (array corner, offset into the linear side, width, height).
type Piece = ([u64; 3], u64, u64, u64);

fn linear_pieces(row: u64, x: u64, y: u64, count: u64) -> Result<Vec<Piece>, CudaError> {
    if row == 0 || (x >= row && count > 0) {
        return Err(CudaError::InvalidValue);
    }
    let mut pieces = Vec::new();
    let (mut at, mut y, mut left) = (0u64, y, count);
    if x > 0 && left > 0 {
        let n = left.min(row - x);
        pieces.push(([x, y, 0], at, n, 1));
        (at, y, left) = (at + n, y + 1, left - n);
    }
    if left >= row {
        let rows = left / row;
        pieces.push(([0, y, 0], at, row, rows));
        (at, y, left) = (at + rows * row, y + rows, left - rows * row);
    }
    if left > 0 {
        pieces.push(([0, y, 0], at, left, 1));
    }
    Ok(pieces)
}

/// `cudaMemcpyToArray[Async]`.
///
/// # Safety
/// A host source must be readable for `count` bytes.
pub unsafe fn memcpy_to_array(
    dst: *mut c_void,
    x: usize,
    y: usize,
    src: *const c_void,
    count: usize,
    kind: i32,
    stream: Option<u64>,
) -> Result<(), CudaError> {
    let row = row_bytes(dst)?;
    for ([px, py, _], at, w, h) in linear_pieces(row, x as u64, y as u64, count as u64)? {
        let side =
            Side { addr: (src as u64).checked_add(at).ok_or(CudaError::InvalidValue)?, pitch: w.max(row), slice: 0 };
        // SAFETY: rows of the source's `count` bytes (this function's contract).
        unsafe { copy_to_array(handle(dst), [px, py, 0], side, (w, h, 1), kind, stream)? };
    }
    Ok(())
}

/// `cudaMemcpyFromArray[Async]`.
///
/// # Safety
/// A host destination must be writable for `count` bytes.
pub unsafe fn memcpy_from_array(
    dst: *mut c_void,
    src: *mut c_void,
    x: usize,
    y: usize,
    count: usize,
    kind: i32,
    stream: Option<u64>,
) -> Result<(), CudaError> {
    let row = row_bytes(src)?;
    for ([px, py, _], at, w, h) in linear_pieces(row, x as u64, y as u64, count as u64)? {
        let side =
            Side { addr: (dst as u64).checked_add(at).ok_or(CudaError::InvalidValue)?, pitch: w.max(row), slice: 0 };
        // SAFETY: rows of the destination's `count` bytes (this function's contract).
        unsafe { copy_from_array(side, handle(src), [px, py, 0], (w, h, 1), kind, stream)? };
    }
    Ok(())
}

/// `cudaMemcpyArrayToArray`: `count` bytes, row by row of whichever array's row ends first.
pub fn memcpy_array_to_array(
    dst: *mut c_void,
    (dx, dy): (usize, usize),
    src: *mut c_void,
    (sx, sy): (usize, usize),
    count: usize,
    kind: i32,
) -> Result<(), CudaError> {
    let (drow, srow) = (row_bytes(dst)?, row_bytes(src)?);
    let (mut d, mut s, mut left) = ([dx as u64, dy as u64], [sx as u64, sy as u64], count as u64);
    if left > 0 && (d[0] >= drow || s[0] >= srow) {
        return Err(CudaError::InvalidValue);
    }
    while left > 0 {
        let n = left.min(drow - d[0]).min(srow - s[0]);
        copy_array_to_array(handle(dst), [d[0], d[1], 0], handle(src), [s[0], s[1], 0], (n, 1, 1), kind, None)?;
        left -= n;
        d[0] += n;
        s[0] += n;
        if d[0] == drow {
            d = [0, d[1] + 1];
        }
        if s[0] == srow {
            s = [0, s[1] + 1];
        }
    }
    Ok(())
}

/// `cudaMemcpy3D[Async]` where a side is a CUDA array: the extent and an array's position are
/// in its elements, a pointer's position in bytes.
///
/// # Safety
/// As `memory::memcpy_3d`: the parameters' host sides readable or writable for the extent.
pub(crate) unsafe fn memcpy_3d(p: &Memcpy3DParms, stream: Option<u64>) -> Result<(), CudaError> {
    let src_array = p.src_array as usize as *mut c_void;
    let dst_array = p.dst_array as usize as *mut c_void;
    let esize = if p.src_array != 0 { element_size(src_array)? } else { element_size(dst_array)? };
    let e = p.extent;
    let w = (e.width as u64).checked_mul(esize).ok_or(CudaError::InvalidValue)?;
    let extent = (w, e.height as u64, e.depth as u64);
    let array_corner = |pos: &Extent, esize: u64| -> Result<[u64; 3], CudaError> {
        let x = (pos.width as u64).checked_mul(esize).ok_or(CudaError::InvalidValue)?;
        Ok([x, pos.height as u64, pos.depth as u64])
    };
    let linear = |ptr: &PitchedPtr, pos: &Extent| -> Result<Side, CudaError> {
        let pitch = ptr.pitch as u64;
        let slice = pitch.checked_mul(ptr.ysize as u64).ok_or(CudaError::InvalidValue)?;
        let offset = (pos.depth as u64)
            .checked_mul(slice)
            .and_then(|n| n.checked_add((pos.height as u64).checked_mul(pitch)?))
            .and_then(|n| n.checked_add(pos.width as u64))
            .ok_or(CudaError::InvalidValue)?;
        let addr = ptr.ptr.checked_add(offset).ok_or(CudaError::InvalidValue)?;
        Ok(Side { addr, pitch, slice })
    };
    match (p.src_array != 0, p.dst_array != 0) {
        (true, true) => {
            let dst_esize = element_size(dst_array)?;
            copy_array_to_array(
                p.dst_array,
                array_corner(&p.dst_pos, dst_esize)?,
                p.src_array,
                array_corner(&p.src_pos, esize)?,
                extent,
                p.kind,
                stream,
            )
        }
        (false, true) => {
            let src = linear(&p.src_ptr, &p.src_pos)?;
            // SAFETY: the host source as this function's contract gives it.
            unsafe { copy_to_array(p.dst_array, array_corner(&p.dst_pos, esize)?, src, extent, p.kind, stream) }
        }
        (true, false) => {
            let dst = linear(&p.dst_ptr, &p.dst_pos)?;
            // SAFETY: the host destination as this function's contract gives it.
            unsafe { copy_from_array(dst, p.src_array, array_corner(&p.src_pos, esize)?, extent, p.kind, stream) }
        }
        (false, false) => Err(CudaError::InvalidValue),
    }
}

/// `struct cudaResourceDesc` up to its union's largest member (CUDA 11 and 12; CUDA 13 makes
/// the union 128 bytes and adds `flags` after it).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(crate) struct ResourceDesc {
    pub res_type: i32,
    /// The union: `array`/`mipmap` (a handle in `dev_ptr`), `linear` (devPtr, desc,
    /// sizeInBytes in `width`), `pitch2D` (devPtr, desc, width, height, pitchInBytes).
    pub dev_ptr: u64,
    pub desc: ChannelFormatDesc,
    pub width: u64,
    pub height: u64,
    pub pitch: u64,
}

/// Offset of CUDA 13's `cudaResourceDesc::flags`, and that struct's size.
const RESOURCE_FLAGS_13: usize = 8 + 128;
const RESOURCE_DESC_SIZE_13: usize = 144;
/// `cudaResourceDesc`'s size in CUDA 11 and 12.
const RESOURCE_DESC_SIZE: usize = 64;
/// `cudaTextureDesc` without `seamlessCubemap` (CUDA 11's plain form).
const TEXTURE_DESC_SIZE_11: usize = 68;
/// CUDA 13's `cudaResourceViewDesc` ends in 16 reserved words that must be zero.
const VIEW_RESERVED_13: usize = 16;

fn abi13() -> bool {
    soname::current_abi().major() >= 13
}

/// Reads a `cudaResourceDesc`.
///
/// # Safety
/// `p` must be null or a `cudaResourceDesc` of the process's ABI.
unsafe fn read_resource(p: *const c_void) -> Result<ResourceDesc, CudaError> {
    if p.is_null() {
        return Err(CudaError::InvalidValue);
    }
    // SAFETY: a `cudaResourceDesc` (this function's contract), at least as long as this
    // prefix, read without assuming alignment.
    let r = unsafe { (p as *const ResourceDesc).read_unaligned() };
    let flags = (p as *const u8).wrapping_add(RESOURCE_FLAGS_13).cast::<u32>();
    // SAFETY: CUDA 13's struct has `flags` at this offset.
    if abi13() && unsafe { flags.read_unaligned() } != 0 {
        return Err(CudaError::InvalidValue);
    }
    Ok(r)
}

/// Writes a `cudaResourceDesc` (zeroing the rest of the ABI's struct).
///
/// # Safety
/// `p` must be null or a writable `cudaResourceDesc` of the process's ABI.
unsafe fn write_resource(p: *mut c_void, r: &ResourceDesc) -> Result<(), CudaError> {
    if p.is_null() {
        return Err(CudaError::InvalidValue);
    }
    let size = if abi13() { RESOURCE_DESC_SIZE_13 } else { RESOURCE_DESC_SIZE };
    // SAFETY: the whole struct of the ABI, writable (this function's contract).
    unsafe { std::ptr::write_bytes(p as *mut u8, 0, size) };
    // SAFETY: its prefix, written without assuming alignment.
    unsafe { (p as *mut ResourceDesc).write_unaligned(*r) };
    Ok(())
}

/// `cudaCreateTextureObject[_v2]`. `with_seamless`: the description has CUDA 12's
/// `seamlessCubemap` (every ABI but CUDA 11's plain entry point).
///
/// # Safety
/// The pointers as CUDA asks of its caller (the view may be null).
pub unsafe fn create_texture(
    out: *mut u64,
    res: *const c_void,
    tex: *const c_void,
    view: *const c_void,
    with_seamless: bool,
) -> Result<(), CudaError> {
    if out.is_null() || tex.is_null() {
        return Err(CudaError::InvalidValue);
    }
    // SAFETY: as this function's contract gives `res`.
    let r = unsafe { read_resource(res)? };
    let mut desc = TextureDescWire::default();
    let size = if with_seamless { std::mem::size_of::<TextureDescWire>() } else { TEXTURE_DESC_SIZE_11 };
    // SAFETY: a `cudaTextureDesc` of `size` bytes (this function's contract) into a local of
    // at least that size.
    unsafe { std::ptr::copy_nonoverlapping(tex as *const u8, &mut desc as *mut TextureDescWire as *mut u8, size) };
    let (has_view, view) = if view.is_null() {
        (0, ResourceViewWire::default())
    } else {
        // SAFETY: a `cudaResourceViewDesc` (this function's contract), read unaligned.
        let v = unsafe { (view as *const ResourceViewWire).read_unaligned() };
        if abi13() {
            let reserved = (view as usize + std::mem::size_of::<ResourceViewWire>()) as *const u32;
            // SAFETY: CUDA 13's struct continues with 16 reserved words.
            if (0..VIEW_RESERVED_13).any(|i| unsafe { reserved.wrapping_add(i).read_unaligned() } != 0) {
                return Err(CudaError::InvalidValue);
            }
        }
        (1, v)
    };
    let object = texture_create(&r, desc, (has_view != 0).then_some(view))?;
    // SAFETY: not null (checked above), so writable (this function's contract).
    unsafe { out.write_unaligned(object) };
    Ok(())
}

/// A texture object of resource `r`, sampled as `desc` says, through `view` if any.
pub(crate) fn texture_create(
    r: &ResourceDesc,
    desc: TextureDescWire,
    view: Option<ResourceViewWire>,
) -> Result<u64, CudaError> {
    let (array, mipmap, size_in_bytes) = match r.res_type {
        RESOURCE_ARRAY => (r.dev_ptr, 0, 0),
        RESOURCE_MIPMAPPED => (0, r.dev_ptr, 0),
        RESOURCE_LINEAR => (0, 0, r.width),
        RESOURCE_PITCH_2D => (0, 0, 0),
        _ => return Err(CudaError::InvalidValue),
    };
    let linear_memory = matches!(r.res_type, RESOURCE_LINEAR | RESOURCE_PITCH_2D);
    let reply = runtime::call(&PhosTextureCreateRequest {
        resType: r.res_type,
        array,
        mipmap,
        devPtr: if linear_memory { r.dev_ptr } else { 0 },
        desc: if linear_memory { r.desc } else { ChannelFormatDesc::default() },
        width: if r.res_type == RESOURCE_PITCH_2D { r.width } else { 0 },
        height: if r.res_type == RESOURCE_PITCH_2D { r.height } else { 0 },
        pitch: if r.res_type == RESOURCE_PITCH_2D { r.pitch } else { 0 },
        sizeInBytes: size_in_bytes,
        texDesc: desc,
        hasView: view.is_some() as i32,
        view: view.unwrap_or_default(),
    })?;
    Ok(reply.texObject)
}

/// Which part of a texture object a query writes.
pub enum TextureQuery {
    Resource,
    /// `cudaTextureDesc`, with `seamlessCubemap` or not.
    Texture {
        with_seamless: bool,
    },
    View,
}

/// `cudaGetTextureObjectResourceDesc`, `...TextureDesc[_v2]`, `...ResourceViewDesc`.
///
/// # Safety
/// `out` must be null or a writable struct of the query's type.
pub unsafe fn texture_query(out: *mut c_void, object: u64, query: TextureQuery) -> Result<(), CudaError> {
    if out.is_null() {
        return Err(CudaError::InvalidValue);
    }
    match query {
        TextureQuery::Resource => {
            let r = texture_resource(object)?;
            // SAFETY: a writable `cudaResourceDesc` (this function's contract).
            unsafe { write_resource(out, &r) }
        }
        TextureQuery::Texture { with_seamless } => {
            let t = runtime::call(&PhosTextureGetDescRequest { texObject: object })?;
            let size = if with_seamless { std::mem::size_of::<TextureDescWire>() } else { TEXTURE_DESC_SIZE_11 };
            // SAFETY: a writable `cudaTextureDesc` of `size` bytes (this function's contract).
            unsafe {
                std::ptr::copy_nonoverlapping(&t.texDesc as *const TextureDescWire as *const u8, out as *mut u8, size)
            };
            Ok(())
        }
        TextureQuery::View => {
            let view = texture_view(object)?;
            let size = std::mem::size_of::<ResourceViewWire>() + if abi13() { 4 * VIEW_RESERVED_13 } else { 0 };
            // SAFETY: a writable `cudaResourceViewDesc` of the ABI (this function's contract).
            unsafe { std::ptr::write_bytes(out as *mut u8, 0, size) };
            // SAFETY: its prefix, written without assuming alignment.
            unsafe { (out as *mut ResourceViewWire).write_unaligned(view) };
            Ok(())
        }
    }
}

/// The resource a texture object samples.
pub(crate) fn texture_resource(object: u64) -> Result<ResourceDesc, CudaError> {
    let t = runtime::call(&PhosTextureGetDescRequest { texObject: object })?;
    Ok(match t.resType {
        RESOURCE_ARRAY => ResourceDesc { res_type: t.resType, dev_ptr: t.array, ..Default::default() },
        RESOURCE_MIPMAPPED => ResourceDesc { res_type: t.resType, dev_ptr: t.mipmap, ..Default::default() },
        RESOURCE_LINEAR => ResourceDesc {
            res_type: t.resType,
            dev_ptr: t.devPtr,
            desc: t.desc,
            width: t.sizeInBytes,
            ..Default::default()
        },
        _ => ResourceDesc {
            res_type: t.resType,
            dev_ptr: t.devPtr,
            desc: t.desc,
            width: t.width,
            height: t.height,
            pitch: t.pitch,
        },
    })
}

/// The view a texture object was made with (zeroed when none).
pub(crate) fn texture_view(object: u64) -> Result<ResourceViewWire, CudaError> {
    Ok(runtime::call(&PhosTextureGetDescRequest { texObject: object })?.view)
}

/// `cudaCreateSurfaceObject`: CUDA's only resource type for surfaces is an array.
///
/// # Safety
/// `out` must be null or writable; `res` null or a `cudaResourceDesc`.
pub unsafe fn create_surface(out: *mut u64, res: *const c_void) -> Result<(), CudaError> {
    if out.is_null() {
        return Err(CudaError::InvalidValue);
    }
    // SAFETY: as this function's contract gives `res`.
    let r = unsafe { read_resource(res)? };
    if r.res_type != RESOURCE_ARRAY {
        return Err(CudaError::InvalidValue);
    }
    let object = runtime::call(&PhosSurfaceCreateRequest { array: r.dev_ptr })?.surfObject;
    // SAFETY: not null (checked above), so writable (this function's contract).
    unsafe { out.write_unaligned(object) };
    Ok(())
}

/// `cudaGetSurfaceObjectResourceDesc`.
///
/// # Safety
/// `out` must be null or a writable `cudaResourceDesc`.
pub unsafe fn surface_resource(out: *mut c_void, object: u64) -> Result<(), CudaError> {
    if out.is_null() {
        return Err(CudaError::InvalidValue);
    }
    let r = surface_resource_of(object)?;
    // SAFETY: a writable `cudaResourceDesc` (this function's contract).
    unsafe { write_resource(out, &r) }
}

/// The resource (always an array) a surface object writes.
pub(crate) fn surface_resource_of(object: u64) -> Result<ResourceDesc, CudaError> {
    let array = runtime::call(&PhosSurfaceGetArrayRequest { surfObject: object })?.array;
    Ok(ResourceDesc { res_type: RESOURCE_ARRAY, dev_ptr: array, ..Default::default() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn c_layouts() {
        assert_eq!(std::mem::size_of::<ResourceDesc>(), RESOURCE_DESC_SIZE);
        assert_eq!(std::mem::size_of::<TextureDescWire>(), 72);
        assert_eq!(std::mem::size_of::<ResourceViewWire>(), 48);
    }

    #[test]
    fn linear_copies_split_at_rows() {
        assert_eq!(linear_pieces(16, 0, 0, 64).unwrap(), vec![([0, 0, 0], 0, 16, 4)]);
        assert_eq!(
            linear_pieces(16, 4, 1, 40).unwrap(),
            vec![([4, 1, 0], 0, 12, 1), ([0, 2, 0], 12, 16, 1), ([0, 3, 0], 28, 12, 1)]
        );
        assert_eq!(linear_pieces(16, 2, 0, 5).unwrap(), vec![([2, 0, 0], 0, 5, 1)]);
        assert!(linear_pieces(16, 16, 0, 1).is_err());
    }
}
