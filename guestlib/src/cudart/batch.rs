//! CUDA 12.8's batched copies (`cudaMemcpyBatchAsync`, `cudaMemcpy3DBatchAsync`): the batch
//! is checked whole first, as CUDA parses it (a bad entry's index goes to `failIdx`, nothing
//! of the batch runs), then each copy runs in order on the stream as the equivalent
//! `cudaMemcpyAsync` or `cudaMemcpy3DAsync` (copies of a batch have no order among them in
//! CUDA, so any order is one CUDA may take).

use std::ffi::c_void;

use phos_protocol::CudaError;
use phos_protocol::cudart::{SUCCESS, consts};
use phos_protocol::types::{Extent, PitchedPtr};

use super::memory::Memcpy3DParms;

/// `cudaMemcpySrcAccessOrderStream`, `DuringApiCall`, `Any`: the valid orders.
const ORDER_STREAM: i32 = 1;
const ORDER_DURING_CALL: i32 = 2;
const ORDER_ANY: i32 = 3;
/// `cudaMemcpyFlagPreferOverlapWithCompute`: a hint, the only flag.
const FLAG_OVERLAP: u32 = 0x1;
/// `cudaMemcpyOperandTypePointer`, `Array`.
const OPERAND_POINTER: i32 = 1;
const OPERAND_ARRAY: i32 = 2;

/// `struct cudaMemLocation`.
#[repr(C)]
#[derive(Clone, Copy)]
struct MemLocation {
    kind: i32,
    id: i32,
}

/// `struct cudaMemcpyAttributes` (CUDA 12.8 to 13).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Attributes {
    src_access_order: i32,
    src_loc_hint: MemLocation,
    dst_loc_hint: MemLocation,
    flags: u32,
}

/// `struct cudaMemcpy3DOperand`: the type, then the union (a pointer with its row length,
/// layer height and location hint, or an array with a 3D offset).
#[repr(C)]
#[derive(Clone, Copy)]
struct Operand {
    kind: i32,
    words: [u64; 4],
}

/// `struct cudaMemcpy3DBatchOp`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct BatchOp {
    src: Operand,
    dst: Operand,
    extent: Extent,
    src_access_order: i32,
    flags: u32,
}

/// A failure of the batch: the status, and the copy it is about (`None`: the whole batch,
/// `failIdx` `SIZE_MAX`).
type Failed = (CudaError, Option<usize>);

/// A location hint: checked (`cudaMemLocationType` invalid to host NUMA current), and
/// without effect here (hints apply to managed memory with concurrent access and pageable
/// memory the device reaches, which Phos's devices lack).
fn hint_ok(l: MemLocation) -> bool {
    (0..=4).contains(&l.kind)
}

/// The legacy default stream, which batches may not use; a `_ptsz` entry point's null stream
/// is the thread's.
fn stream_of(stream: u64, per_thread: bool) -> Result<u64, Failed> {
    match stream {
        0 if per_thread => Ok(consts::cudaStreamPerThread),
        0 | consts::cudaStreamLegacy => Err((CudaError::InvalidValue, None)),
        s => Ok(s),
    }
}

fn status(code: i32, index: usize) -> Result<(), Failed> {
    if code == SUCCESS { Ok(()) } else { Err((CudaError(code), Some(index))) }
}

/// Writes the failure's index where the caller asked for it, and answers its status.
///
/// # Safety
/// `fail_idx` must be null or writable.
unsafe fn report(r: Result<(), Failed>, fail_idx: *mut usize) -> Result<(), CudaError> {
    r.map_err(|(e, index)| {
        if !fail_idx.is_null() {
            // SAFETY: not null, writable (this function's contract).
            unsafe { fail_idx.write_unaligned(index.unwrap_or(usize::MAX)) };
        }
        e
    })
}

/// `cudaMemcpyBatchAsync`: `count` copies of `sizes[i]` bytes from `srcs[i]` to `dsts[i]`,
/// with the attributes `attrs[k]` for copies `attrsIdxs[k]` on.
///
/// # Safety
/// The arrays must hold what CUDA's contract says (`count` pointers and sizes, `num_attrs`
/// attributes and indices); each copy's host side readable or writable for its size.
#[allow(clippy::too_many_arguments)]
pub unsafe fn memcpy_batch(
    dsts: *const u64,
    srcs: *const u64,
    sizes: *const usize,
    count: usize,
    attrs: *const Attributes,
    idxs: *const usize,
    num_attrs: usize,
    fail_idx: *mut usize,
    stream: u64,
    per_thread: bool,
) -> Result<(), CudaError> {
    // SAFETY: the arrays as this function's contract gives them.
    let r = unsafe { batch(dsts, srcs, sizes, count, attrs, idxs, num_attrs, stream, per_thread) };
    // SAFETY: `fail_idx` null or writable (this function's contract).
    unsafe { report(r, fail_idx) }
}

/// CUDA 13's `cudaMemcpyWithAttributesAsync`: one copy with its attributes, checked and run as
/// a batch of one.
///
/// # Safety
/// `attr` null or a readable `cudaMemcpyAttributes`; the copy's host side readable or
/// writable for its size.
pub unsafe fn memcpy_with_attributes(
    dst: u64,
    src: u64,
    size: usize,
    attr: *const Attributes,
    stream: u64,
    per_thread: bool,
) -> Result<(), CudaError> {
    let first = 0usize;
    // SAFETY: one destination, source, size and index, local; `attr` and the copy as this
    // function's contract gives them.
    let r = unsafe { batch(&dst, &src, &size, 1, attr, &first, 1, stream, per_thread) };
    r.map_err(|(e, _)| e)
}

/// CUDA 13's `cudaMemcpy3DWithAttributesAsync`: one operation, checked and run as a batch of
/// one.
///
/// # Safety
/// `op` null or a `cudaMemcpy3DBatchOp` whose host sides are readable or writable for its
/// extent.
pub unsafe fn memcpy_3d_with_attributes(
    op: *const BatchOp,
    flags: u64,
    stream: u64,
    per_thread: bool,
) -> Result<(), CudaError> {
    // SAFETY: as this function's contract gives it.
    let r = unsafe { batch_3d(1, op, flags, stream, per_thread) };
    r.map_err(|(e, _)| e)
}

/// [`memcpy_batch`] without the report.
///
/// # Safety
/// As [`memcpy_batch`].
#[allow(clippy::too_many_arguments)]
unsafe fn batch(
    dsts: *const u64,
    srcs: *const u64,
    sizes: *const usize,
    count: usize,
    attrs: *const Attributes,
    idxs: *const usize,
    num_attrs: usize,
    stream: u64,
    per_thread: bool,
) -> Result<(), Failed> {
    let whole = |e| Err((e, None));
    if count == 0 || dsts.is_null() || srcs.is_null() || sizes.is_null() {
        return whole(CudaError::InvalidValue);
    }
    if num_attrs == 0 || num_attrs > count || attrs.is_null() || idxs.is_null() {
        return whole(CudaError::InvalidValue);
    }
    let stream = stream_of(stream, per_thread)?;
    // The attributes: the first applies from copy 0, each later one from a later copy.
    let mut during_call = false;
    let mut previous = None;
    for k in 0..num_attrs {
        // SAFETY: `k < num_attrs`, within the indices (this function's contract).
        let first = unsafe { idxs.wrapping_add(k).read_unaligned() };
        // SAFETY: `k < num_attrs`, within the attributes (this function's contract).
        let a = unsafe { attrs.wrapping_add(k).read_unaligned() };
        let ordered = match previous {
            None => first == 0,
            Some(p) => first > p,
        };
        if !ordered || first >= count {
            return whole(CudaError::InvalidValue);
        }
        previous = Some(first);
        if !(ORDER_STREAM..=ORDER_ANY).contains(&a.src_access_order)
            || a.flags & !FLAG_OVERLAP != 0
            || !hint_ok(a.src_loc_hint)
            || !hint_ok(a.dst_loc_hint)
        {
            return Err((CudaError::InvalidValue, Some(first)));
        }
        during_call |= a.src_access_order == ORDER_DURING_CALL;
    }
    let mut copies = Vec::with_capacity(count.min(1 << 16));
    for i in 0..count {
        // SAFETY: `i < count`, within the destinations (this function's contract).
        let dst = unsafe { dsts.wrapping_add(i).read_unaligned() };
        // SAFETY: `i < count`, within the sources (this function's contract).
        let src = unsafe { srcs.wrapping_add(i).read_unaligned() };
        // SAFETY: `i < count`, within the sizes (this function's contract).
        let size = unsafe { sizes.wrapping_add(i).read_unaligned() };
        if dst == 0 || src == 0 {
            return Err((CudaError::InvalidValue, Some(i)));
        }
        copies.push((dst, src, size));
    }
    for (i, (dst, src, size)) in copies.into_iter().enumerate() {
        // SAFETY: a copy of the caller's, its host side as this function's contract gives it.
        let code = unsafe {
            super::stubs::cudaMemcpyAsync(
                dst as usize as *mut c_void,
                src as usize as *const c_void,
                size,
                consts::cudaMemcpyDefault,
                stream as usize as *mut c_void,
            )
        };
        status(code, i)?;
    }
    finish(during_call, stream)
}

/// A source read "during the API call" must have been read when the call returns: the
/// stream's work so far is waited for (a pageable source already travelled with its copy;
/// page-locked memory is read when the stream reaches the copy).
fn finish(during_call: bool, stream: u64) -> Result<(), Failed> {
    if !during_call {
        return Ok(());
    }
    // SAFETY: a stream handle, passed by value.
    let code = unsafe { super::stubs::cudaStreamSynchronize(stream as usize as *mut c_void) };
    if code == SUCCESS { Ok(()) } else { Err((CudaError(code), None)) }
}

/// One side of a 3D copy as `cudaMemcpy3DParms` has it: the array and position, or the
/// pitched pointer; and the element size it gives the copy (an array's; 1 for a pointer).
struct Side {
    array: u64,
    pos: Extent,
    ptr: PitchedPtr,
    element: Option<u64>,
}

/// An operand of op `index`, checked against the copy's extent.
fn side(op: &Operand, extent: &Extent, index: usize) -> Result<Side, Failed> {
    let bad = Err((CudaError::InvalidValue, Some(index)));
    match op.kind {
        OPERAND_POINTER => {
            let [ptr, row, layer, hint] = op.words;
            let (row, layer) = (row as usize, layer as usize);
            let hint = MemLocation { kind: hint as u32 as i32, id: (hint >> 32) as u32 as i32 };
            if ptr == 0 || (row != 0 && row < extent.width) || (layer != 0 && layer < extent.height) || !hint_ok(hint) {
                return bad;
            }
            let row = if row == 0 { extent.width } else { row };
            let layer = if layer == 0 { extent.height } else { layer };
            let pos = Extent { width: 0, height: 0, depth: 0 };
            Ok(Side { array: 0, pos, ptr: PitchedPtr { ptr, pitch: row, xsize: row, ysize: layer }, element: None })
        }
        OPERAND_ARRAY => {
            let [array, x, y, z] = op.words;
            if array == 0 {
                return bad;
            }
            let element = super::arrays::element_size(array as usize as *mut c_void).map_err(|e| (e, Some(index)))?;
            let pos = Extent { width: x as usize, height: y as usize, depth: z as usize };
            let ptr = PitchedPtr { ptr: 0, pitch: 0, xsize: 0, ysize: 0 };
            Ok(Side { array, pos, ptr, element: Some(element) })
        }
        _ => bad,
    }
}

/// `cudaMemcpy3DBatchAsync`: `num_ops` copies, each between a pointer or an array and a
/// pointer or an array, of an extent in elements (an array's element size, else bytes).
///
/// # Safety
/// `ops` must hold `num_ops` `cudaMemcpy3DBatchOp`s whose host sides are readable or
/// writable for their extents; `fail_idx` null or writable.
pub unsafe fn memcpy_3d_batch(
    num_ops: usize,
    ops: *const BatchOp,
    fail_idx: *mut usize,
    flags: u64,
    stream: u64,
    per_thread: bool,
) -> Result<(), CudaError> {
    // SAFETY: `ops` as this function's contract gives it.
    let r = unsafe { batch_3d(num_ops, ops, flags, stream, per_thread) };
    // SAFETY: `fail_idx` null or writable (this function's contract).
    unsafe { report(r, fail_idx) }
}

/// [`memcpy_3d_batch`] without the report.
///
/// # Safety
/// As [`memcpy_3d_batch`].
unsafe fn batch_3d(
    num_ops: usize,
    ops: *const BatchOp,
    flags: u64,
    stream: u64,
    per_thread: bool,
) -> Result<(), Failed> {
    if num_ops == 0 || ops.is_null() || flags != 0 {
        return Err((CudaError::InvalidValue, None));
    }
    let stream = stream_of(stream, per_thread)?;
    let mut during_call = false;
    let mut copies = Vec::with_capacity(num_ops.min(1 << 16));
    for i in 0..num_ops {
        // SAFETY: `i < num_ops`, within the array (this function's contract).
        let op = unsafe { ops.wrapping_add(i).read_unaligned() };
        let e = op.extent;
        if e.width == 0
            || e.height == 0
            || e.depth == 0
            || !(ORDER_STREAM..=ORDER_ANY).contains(&op.src_access_order)
            || op.flags & !FLAG_OVERLAP != 0
        {
            return Err((CudaError::InvalidValue, Some(i)));
        }
        let (mut src, mut dst) = (side(&op.src, &e, i)?, side(&op.dst, &e, i)?);
        let element = match (src.element, dst.element) {
            (Some(a), Some(b)) if a != b => return Err((CudaError::InvalidValue, Some(i))),
            (Some(a), _) | (None, Some(a)) => a,
            (None, None) => 1,
        };
        // Rows of pointers in bytes; the extent in bytes when no array is involved, else in
        // elements (what `cudaMemcpy3DParms` takes).
        for s in [&mut src, &mut dst] {
            s.ptr.pitch *= element as usize;
            s.ptr.xsize *= element as usize;
        }
        let extent =
            if src.array == 0 && dst.array == 0 { Extent { width: e.width * element as usize, ..e } } else { e };
        during_call |= op.src_access_order == ORDER_DURING_CALL;
        copies.push(Memcpy3DParms {
            src_array: src.array,
            src_pos: src.pos,
            src_ptr: src.ptr,
            dst_array: dst.array,
            dst_pos: dst.pos,
            dst_ptr: dst.ptr,
            extent,
            kind: consts::cudaMemcpyDefault,
        });
    }
    for (i, p) in copies.iter().enumerate() {
        // SAFETY: a `cudaMemcpy3DParms` of the caller's copy, its host sides as this
        // function's contract gives them.
        let code = unsafe {
            super::stubs::cudaMemcpy3DAsync((p as *const Memcpy3DParms).cast(), stream as usize as *mut c_void)
        };
        status(code, i)?;
    }
    finish(during_call, stream)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attrs(order: i32) -> Attributes {
        let hint = MemLocation { kind: 0, id: 0 };
        Attributes { src_access_order: order, src_loc_hint: hint, dst_loc_hint: hint, flags: 0 }
    }

    /// A 1D batch of three copies whose destinations are `dsts`, checked (none runs: each
    /// case fails before the first copy); the status and `failIdx`.
    fn batch_1d(dsts: [u64; 3], attributes: &[Attributes], idxs: &[usize], stream: u64) -> (CudaError, usize) {
        let srcs = [0x1000u64, 0x2000, 0x3000];
        let sizes = [4usize, 4, 4];
        let mut fail = 7usize;
        // SAFETY: three destinations, sources and sizes; the attributes and their indices of
        // one length; `fail` writable.
        let r = unsafe {
            memcpy_batch(
                dsts.as_ptr(),
                srcs.as_ptr(),
                sizes.as_ptr(),
                3,
                attributes.as_ptr(),
                idxs.as_ptr(),
                attributes.len(),
                &mut fail,
                stream,
                false,
            )
        };
        (r.expect_err("the batch is refused"), fail)
    }

    #[test]
    fn a_batch_is_checked_whole_and_its_bad_entry_named() {
        let one = [attrs(ORDER_STREAM)];
        let any = usize::MAX;
        // A null pointer names its copy.
        assert_eq!(batch_1d([0x10, 0x20, 0], &one, &[0], 5), (CudaError::InvalidValue, 2));
        // The legacy stream, attribute ranges not starting at 0 or not rising, more attributes
        // than copies: the batch's own faults.
        assert_eq!(batch_1d([0x10, 0x20, 0x30], &one, &[0], 0), (CudaError::InvalidValue, any));
        assert_eq!(batch_1d([0x10, 0x20, 0x30], &one, &[0], consts::cudaStreamLegacy), (CudaError::InvalidValue, any));
        assert_eq!(batch_1d([0x10, 0x20, 0x30], &one, &[1], 5), (CudaError::InvalidValue, any));
        let two = [attrs(ORDER_STREAM), attrs(ORDER_ANY)];
        assert_eq!(batch_1d([0x10, 0x20, 0x30], &two, &[0, 0], 5), (CudaError::InvalidValue, any));
        assert_eq!(batch_1d([0x10, 0x20, 0x30], &two, &[0, 3], 5), (CudaError::InvalidValue, any));
        let four = [attrs(ORDER_STREAM); 4];
        assert_eq!(batch_1d([0x10, 0x20, 0x30], &four, &[0, 1, 2, 3], 5), (CudaError::InvalidValue, any));
        // An attribute CUDA does not know names the first copy it applies to.
        let bad = [attrs(ORDER_STREAM), attrs(0)];
        assert_eq!(batch_1d([0x10, 0x20, 0x30], &bad, &[0, 1], 5), (CudaError::InvalidValue, 1));
        let mut flagged = attrs(ORDER_DURING_CALL);
        flagged.flags = 2;
        assert_eq!(batch_1d([0x10, 0x20, 0x30], &[flagged], &[0], 5), (CudaError::InvalidValue, 0));
    }

    #[test]
    fn a_copy_with_attributes_is_checked_as_a_batch_of_one() {
        let copy = |dst: u64, attr: *const Attributes, stream: u64| {
            // SAFETY: `attr` null or one attribute; each case fails before the copy.
            unsafe { memcpy_with_attributes(dst, 0x1000, 4, attr, stream, false) }
        };
        let good = attrs(ORDER_STREAM);
        assert_eq!(copy(0x10, std::ptr::null(), 5), Err(CudaError::InvalidValue));
        assert_eq!(copy(0, &good, 5), Err(CudaError::InvalidValue));
        assert_eq!(copy(0x10, &good, 0), Err(CudaError::InvalidValue));
        assert_eq!(copy(0x10, &attrs(0), 5), Err(CudaError::InvalidValue));
        let op3 = |o: &BatchOp, flags: u64| {
            // SAFETY: one operation; each case fails before the copy.
            unsafe { memcpy_3d_with_attributes(o, flags, 5, false) }
        };
        let good = op(pointer(0x1000, 0, 0), pointer(0x2000, 64, 0), 16, 4, 1);
        assert_eq!(op3(&good, 1), Err(CudaError::InvalidValue));
        assert_eq!(op3(&op(pointer(0x1000, 8, 0), pointer(0x2000, 0, 0), 16, 4, 1), 0), Err(CudaError::InvalidValue));
        // SAFETY: a null operation is refused before it is read.
        assert_eq!(unsafe { memcpy_3d_with_attributes(std::ptr::null(), 0, 5, false) }, Err(CudaError::InvalidValue));
    }

    fn pointer(ptr: u64, row: u64, layer: u64) -> Operand {
        Operand { kind: OPERAND_POINTER, words: [ptr, row, layer, 0] }
    }

    fn op(src: Operand, dst: Operand, w: usize, h: usize, d: usize) -> BatchOp {
        BatchOp { src, dst, extent: Extent { width: w, height: h, depth: d }, src_access_order: ORDER_STREAM, flags: 0 }
    }

    fn batch_3d_of(ops: &[BatchOp], flags: u64) -> (CudaError, usize) {
        let mut fail = 7usize;
        // SAFETY: `ops.len()` operations; `fail` writable.
        let r = unsafe { memcpy_3d_batch(ops.len(), ops.as_ptr(), &mut fail, flags, 5, false) };
        (r.expect_err("the batch is refused"), fail)
    }

    #[test]
    fn a_3d_batch_names_the_operation_at_fault() {
        let good = op(pointer(0x1000, 0, 0), pointer(0x2000, 64, 0), 16, 4, 1);
        assert_eq!(batch_3d_of(&[good, op(pointer(0x1000, 0, 0), pointer(0x2000, 0, 0), 0, 4, 1)], 0).1, 1);
        assert_eq!(batch_3d_of(&[op(pointer(0x1000, 8, 0), pointer(0x2000, 0, 0), 16, 4, 1), good], 0).1, 0);
        assert_eq!(batch_3d_of(&[good, op(pointer(0x1000, 0, 2), pointer(0x2000, 0, 0), 16, 4, 1)], 0).1, 1);
        assert_eq!(batch_3d_of(&[good, op(pointer(0, 0, 0), pointer(0x2000, 0, 0), 16, 4, 1)], 0).1, 1);
        let odd = Operand { kind: 7, words: [0x1000, 0, 0, 0] };
        assert_eq!(batch_3d_of(&[op(odd, pointer(0x2000, 0, 0), 16, 4, 1)], 0).1, 0);
        assert_eq!(batch_3d_of(&[good], 1), (CudaError::InvalidValue, usize::MAX));
        assert_eq!(batch_3d_of(&[], 0), (CudaError::InvalidValue, usize::MAX));
    }

    #[test]
    fn the_structs_have_cudas_layout() {
        assert_eq!(std::mem::size_of::<Attributes>(), 24);
        assert_eq!(std::mem::size_of::<Operand>(), 40);
        assert_eq!(std::mem::size_of::<BatchOp>(), 112);
        assert_eq!(std::mem::offset_of!(BatchOp, extent), 80);
        assert_eq!(std::mem::offset_of!(BatchOp, src_access_order), 104);
    }
}
