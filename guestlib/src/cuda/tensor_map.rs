//! Tensor maps (Hopper's TMA descriptors, which Triton builds on H100): the encode calls'
//! arguments read here (the arrays only once the rank is known good, so a bad rank reads
//! nothing), checked and encoded by the server (`phosTensorMapEncode`,
//! [`phos_protocol::tensor_map`]): on a GPU the driver's own encoding of the address, which is
//! the device's (a session's device pointers are the GPU's addresses), on emu Phos's.

use std::ffi::c_void;

use phos_protocol::cuda::{CuError, PhosTensorMapEncodeRequest, PhosTensorMapReplaceAddressRequest};
pub use phos_protocol::tensor_map::Kind;
use phos_protocol::tensor_map::{Params, SIZE};

use crate::runtime;

/// The arguments of an encode call as C passes them.
pub struct Raw {
    pub kind: Kind,
    pub data_type: i32,
    pub rank: u32,
    pub address: u64,
    pub dims: *const u64,
    pub strides: *const u64,
    pub box_dim: *const u32,
    pub element_strides: *const u32,
    pub interleave: i32,
    pub swizzle: i32,
    pub l2_promotion: i32,
    pub oob_fill: i32,
    pub lower: *const i32,
    pub upper: *const i32,
    pub lower_width: i32,
    pub upper_width: i32,
    pub channels_per_pixel: u32,
    pub pixels_per_column: u32,
    pub mode: i32,
}

/// # Safety
/// `p` null or `n` readable values.
unsafe fn array<T: Copy + Default, const N: usize>(p: *const T, n: usize) -> Result<[T; N], CuError> {
    let mut out = [T::default(); N];
    if n == 0 {
        return Ok(out);
    }
    if p.is_null() || n > N {
        return Err(CuError::INVALID_VALUE);
    }
    for (i, slot) in out.iter_mut().enumerate().take(n) {
        // SAFETY: `i < n`, within the caller's array (this function's contract).
        *slot = unsafe { p.wrapping_add(i).read_unaligned() };
    }
    Ok(out)
}

/// An enum argument as the wire carries it: a negative one is out of range for every check.
fn word(v: i32) -> u32 {
    u32::try_from(v).unwrap_or(u32::MAX)
}

/// `cuTensorMapEncode*`: the map written to `map`.
///
/// # Safety
/// `map` null or 128 writable bytes; the arrays of `raw` as the driver's contract says for
/// its rank (null where the call has none).
pub unsafe fn encode(map: *mut c_void, raw: &Raw) -> Result<(), CuError> {
    let min_rank = if raw.kind == Kind::Tiled { 1 } else { 3 };
    if map.is_null() || !(min_rank..=5).contains(&raw.rank) {
        return Err(CuError::INVALID_VALUE);
    }
    let rank = raw.rank as usize;
    let corners = if raw.kind == Kind::Im2col { rank - 2 } else { 0 };
    // The arrays hold what the rank says (this function's contract), now checked.
    // SAFETY: `rank` dimensions.
    let dims = unsafe { array::<u64, 5>(raw.dims, rank) }?;
    // SAFETY: `rank - 1` strides.
    let strides = unsafe { array::<u64, 4>(raw.strides, rank - 1) }?;
    // SAFETY: `rank` element strides.
    let element_strides = unsafe { array::<u32, 5>(raw.element_strides, rank) }?;
    // SAFETY: a tiled map's `rank` box dimensions; the others have none.
    let box_dim = unsafe { array::<u32, 5>(raw.box_dim, if raw.kind == Kind::Tiled { rank } else { 0 }) }?;
    // SAFETY: an im2col map's `rank - 2` corner coordinates each; the others have none.
    let mut lower = unsafe { array::<i32, 3>(raw.lower, corners) }?;
    // SAFETY: as above.
    let mut upper = unsafe { array::<i32, 3>(raw.upper, corners) }?;
    if raw.kind == Kind::Im2colWide {
        lower[0] = raw.lower_width;
        upper[0] = raw.upper_width;
    }
    let params = Params {
        kind: raw.kind,
        data_type: word(raw.data_type),
        rank: raw.rank,
        address: raw.address,
        dims,
        strides,
        box_dim,
        element_strides,
        interleave: word(raw.interleave),
        swizzle: word(raw.swizzle),
        l2_promotion: word(raw.l2_promotion),
        oob_fill: word(raw.oob_fill),
        lower,
        upper,
        channels_per_pixel: raw.channels_per_pixel,
        pixels_per_column: raw.pixels_per_column,
        mode: word(raw.mode),
    };
    // Checked here too, so that misuse costs no round trip; the server checks again.
    params.check().map_err(|_| CuError::INVALID_VALUE)?;
    let bytes = params.encode();
    let reply = runtime::call(&PhosTensorMapEncodeRequest { params: &bytes, paramsSize: bytes.len() as u64 })?;
    if reply.tensorMap.len() != SIZE {
        return Err(CuError::UNKNOWN);
    }
    // SAFETY: `map` is 128 writable bytes (this function's contract).
    unsafe { std::ptr::copy_nonoverlapping(reply.tensorMap.as_ptr(), map as *mut u8, SIZE) };
    Ok(())
}

/// `cuTensorMapReplaceAddress`.
///
/// # Safety
/// `map` null or a tensor map (128 bytes, readable and writable).
pub unsafe fn replace_address(map: *mut c_void, address: u64) -> Result<(), CuError> {
    if map.is_null() || !address.is_multiple_of(16) {
        return Err(CuError::INVALID_VALUE);
    }
    // SAFETY: a tensor map, 128 readable bytes (this function's contract).
    let current = unsafe { (map as *const [u8; SIZE]).read_unaligned() };
    let reply = runtime::call(&PhosTensorMapReplaceAddressRequest { tensorMap: &current, globalAddress: address })?;
    if reply.tensorMap.len() != SIZE {
        return Err(CuError::UNKNOWN);
    }
    // SAFETY: the same 128 bytes, writable (this function's contract).
    unsafe { std::ptr::copy_nonoverlapping(reply.tensorMap.as_ptr(), map as *mut u8, SIZE) };
    Ok(())
}
