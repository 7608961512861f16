//! The guest side of stream capture and graphs: the parameters whose meaning changed between
//! CUDA versions. The capture itself happens at the server (api-server/src/capture.rs).

use std::ffi::c_void;

use phos_protocol::CudaError;
use phos_protocol::cudart::{
    PhosGraphAddCopyNodeRequest, PhosGraphAddDependenciesRequest, PhosGraphAddEmptyNodeRequest,
    PhosGraphAddKernelNodeRequest, PhosGraphAddSetNodeRequest, PhosGraphExecUpdateRequest, PhosGraphInstantiateRequest,
    PhosGraphNodesRequest, PhosStreamCaptureInfoRequest, consts,
};
use phos_protocol::types::Dim3;
use phos_protocol::{CudaError as E, Ptr};

use super::hand::Hand;
use super::memory::Memcpy3DParms;
use super::stubs::HandWritten;
use super::{launch, memory};
use crate::{runtime, soname};

/// `cudaGraphInstantiateFlagAutoFreeOnLaunch | Upload | UseNodePriority`: accepted (no graph
/// allocates memory, launches issue everything, priorities are hints).
const INSTANTIATE_FLAGS: u64 = 0x1 | 0x2 | 0x8;
/// `cudaGraphInstantiateFlagDeviceLaunch`: graphs launched from kernels.
const DEVICE_LAUNCH: u64 = 0x4;

/// `cudaStreamGetCaptureInfo` (and `_v2`, `_v3`): the status and the capture id.
///
/// # Safety
/// Non-null out pointers must be writable.
pub unsafe fn capture_info(stream: *mut c_void, status: *mut i32, id: *mut u64) -> Result<(), CudaError> {
    if status.is_null() {
        return Err(CudaError::InvalidValue);
    }
    let reply = runtime::call(&PhosStreamCaptureInfoRequest { stream: stream as usize as u64 })?;
    // SAFETY: not null (checked above), so writable (this function's contract).
    unsafe { *status = reply.status };
    if !id.is_null() && reply.status != 0 {
        // SAFETY: not null, so writable (this function's contract).
        unsafe { *id = reply.id };
    }
    Ok(())
}

/// # Safety
/// A non-null `exec` must be writable.
pub unsafe fn instantiate(exec: *mut *mut c_void, graph: *mut c_void, flags: u64) -> Result<(), CudaError> {
    if exec.is_null() {
        return Err(CudaError::InvalidValue);
    }
    if flags & DEVICE_LAUNCH != 0 {
        return Err(CudaError::NotSupported);
    }
    if flags & !INSTANTIATE_FLAGS != 0 {
        return Err(CudaError::InvalidValue);
    }
    let reply = runtime::call(&PhosGraphInstantiateRequest { graph: graph as usize as u64 })?;
    // SAFETY: not null (checked above), so writable (this function's contract).
    unsafe { *exec = reply.pGraphExec as usize as *mut c_void };
    Ok(())
}

/// `cudaGraphExecUpdate`. CUDA 12 reports through a `cudaGraphExecUpdateResultInfo`
/// (result, error node, error-from node); CUDA 11 through two out parameters (error node,
/// result), the third and fourth; a CUDA 12 caller passes no fourth.
///
/// # Safety
/// The out pointers must be what the ABI's signature says, writable.
pub unsafe fn exec_update(
    exec: *mut c_void,
    graph: *mut c_void,
    out: *mut c_void,
    result_11: *mut i32,
) -> Result<(), CudaError> {
    let reply =
        runtime::call(&PhosGraphExecUpdateRequest { hGraphExec: exec as usize as u64, hGraph: graph as usize as u64 })?;
    if soname::current_abi().major() >= 12 {
        if out.is_null() {
            return Err(CudaError::InvalidValue);
        }
        let mut bytes = [0u8; 24];
        bytes[0..4].copy_from_slice(&reply.result.to_ne_bytes());
        // SAFETY: not null (checked above): CUDA 12's `cudaGraphExecUpdateResultInfo`, 24
        // writable bytes (this function's contract).
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), out as *mut u8, 24) };
    } else {
        if out.is_null() || result_11.is_null() {
            return Err(CudaError::InvalidValue);
        }
        // SAFETY: not null (checked above): CUDA 11's error node, a writable
        // `cudaGraphNode_t` (this function's contract).
        unsafe { (out as *mut u64).write_unaligned(0) };
        // SAFETY: not null (checked above): CUDA 11's writable result (this function's
        // contract).
        unsafe { result_11.write_unaligned(reply.result) };
    }
    if reply.result == 0 { Ok(()) } else { Err(CudaError::GraphExecUpdateFailure) }
}

/// Node handles as they travel: 8 bytes each.
///
/// # Safety
/// A non-null `list` must hold `count` readable handles.
unsafe fn handles(list: *const u64, count: usize) -> Result<Vec<u8>, CudaError> {
    if count == 0 {
        return Ok(Vec::new());
    }
    if list.is_null() || count > 1 << 20 {
        return Err(E::InvalidValue);
    }
    let read = |i: usize| {
        // SAFETY: `i < count`: within the `count` handles of the non-null `list` (this
        // function's contract).
        let at = unsafe { list.add(i) };
        // SAFETY: a readable handle there, read without assuming alignment.
        unsafe { at.read_unaligned() }
    };
    Ok((0..count).flat_map(|i| read(i).to_ne_bytes()).collect())
}

/// `struct cudaKernelNodeParams`.
#[repr(C)]
struct KernelNodeParams {
    func: *const c_void,
    grid: Dim3,
    block: Dim3,
    shared_mem: u32,
    kernel_params: *mut *mut c_void,
    extra: *mut *mut c_void,
}

/// `struct cudaMemsetParams`.
#[repr(C)]
struct MemsetParams {
    dst: u64,
    pitch: usize,
    value: u32,
    element_size: u32,
    width: usize,
    height: usize,
}

/// Add a node: `send` makes the request, with the dependencies as they travel; the new node's
/// handle goes to `out`.
///
/// # Safety
/// A non-null `out` must be writable; a non-null `deps` must hold `count` handles.
unsafe fn add_node(
    out: *mut u64,
    deps: *const u64,
    count: usize,
    send: impl FnOnce(&[u8]) -> Result<u64, CudaError>,
) -> Result<(), CudaError> {
    if out.is_null() {
        return Err(E::InvalidValue);
    }
    // SAFETY: `count` handles at a non-null `deps` (this function's contract).
    let deps = unsafe { handles(deps, count)? };
    let node = send(&deps)?;
    // SAFETY: not null (checked above), so writable (this function's contract).
    unsafe { out.write_unaligned(node) };
    Ok(())
}

/// # Safety
/// The pointers must be what `cudaGraphAddKernelNode` takes.
pub unsafe fn add_kernel_node(
    out: *mut u64,
    graph: u64,
    deps: *const u64,
    count: usize,
    p: *const c_void,
) -> Result<(), CudaError> {
    if p.is_null() {
        return Err(E::InvalidValue);
    }
    // SAFETY: not null (checked above): a `cudaKernelNodeParams` (this function's contract),
    // read without assuming alignment; its pointers are only copied.
    let k = unsafe { (p as *const KernelNodeParams).read_unaligned() };
    if !k.extra.is_null() {
        // A packed buffer in `extra` (CU_LAUNCH_PARAM_BUFFER_POINTER) is not read.
        return Err(E::NotSupported);
    }
    // SAFETY: the node's kernel and its parameter array, as `cudaGraphAddKernelNode`'s caller
    // gives them: what `launch::packed` reads.
    let (function, params) = unsafe { launch::packed(k.func, k.kernel_params)? };
    // SAFETY: `out` and `deps` as this function's contract gives them to `add_node`.
    unsafe {
        add_node(out, deps, count, |deps| {
            let request = PhosGraphAddKernelNodeRequest {
                graph,
                deps,
                numDeps: count as u64,
                function,
                grid: k.grid,
                block: k.block,
                sharedMem: k.shared_mem,
                params: &params,
                paramSize: params.len() as u64,
            };
            Ok(runtime::call(&request)?.pGraphNode)
        })
    }
}

/// A copy node: to or on the device (a host source is read now and kept in the node).
///
/// # Safety
/// As [`add_node`]; a host source must be readable for the copy's extent.
#[allow(clippy::too_many_arguments)]
unsafe fn copy_node(
    out: *mut u64,
    graph: u64,
    deps: *const u64,
    count: usize,
    (dst, dpitch, dslice): (u64, u64, u64),
    (src, spitch, sslice): (u64, u64, u64),
    (w, h, d): (u64, u64, u64),
    kind: i32,
) -> Result<(), CudaError> {
    let direction =
        <Hand as HandWritten>::resolve_memcpy_kind(i128::from(kind), i128::from(dst), i128::from(src))? as i32;
    let packed: Vec<u8>;
    let src_ptr = match direction {
        consts::cudaMemcpyDeviceToDevice => Ptr::Device(src),
        consts::cudaMemcpyHostToDevice => {
            if w > spitch {
                return Err(E::InvalidPitchValue);
            }
            // SAFETY: a host source, readable for the copy's extent at its pitches (this
            // function's contract): what `memory::pack` reads.
            packed = unsafe { memory::pack(src, spitch, sslice, (w, h, d))? };
            Ptr::In(&packed)
        }
        // A node writing to the host would need the guest at every launch.
        _ => return Err(E::NotSupported),
    };
    let host = direction == consts::cudaMemcpyHostToDevice;
    // SAFETY: `out` and `deps` as this function's contract gives them to `add_node`.
    unsafe {
        add_node(out, deps, count, |deps| {
            let request = PhosGraphAddCopyNodeRequest {
                graph,
                deps,
                numDeps: count as u64,
                dst,
                dpitch,
                dslice: if d > 1 { dslice } else { 0 },
                src: src_ptr,
                spitch: if host { w } else { spitch },
                sslice: if d > 1 { if host { w * h } else { sslice } } else { 0 },
                width: w,
                height: h,
                depth: d,
                direction,
            };
            Ok(runtime::call(&request)?.pGraphNode)
        })
    }
}

/// # Safety
/// The pointers must be what `cudaGraphAddMemcpyNode` takes.
pub unsafe fn add_memcpy_node(
    out: *mut u64,
    graph: u64,
    deps: *const u64,
    count: usize,
    p: *const c_void,
) -> Result<(), CudaError> {
    if p.is_null() {
        return Err(E::InvalidValue);
    }
    // SAFETY: not null (checked above): a `cudaMemcpy3DParms` (this function's contract),
    // read without assuming alignment; its pointers are only copied.
    let p = unsafe { (p as *const Memcpy3DParms).read_unaligned() };
    if p.src_array != 0 || p.dst_array != 0 {
        return Err(E::NotSupported);
    }
    let side = |ptr: &phos_protocol::types::PitchedPtr, pos: &phos_protocol::types::Extent| {
        let (pitch, slice) = (ptr.pitch as u64, ptr.pitch as u64 * ptr.ysize as u64);
        (ptr.ptr + pos.depth as u64 * slice + pos.height as u64 * pitch + pos.width as u64, pitch, slice)
    };
    let e = p.extent;
    let dims = (e.width as u64, e.height as u64, e.depth as u64);
    // SAFETY: `out`, `deps` and the parameters' host source as this function's contract gives
    // them (what `cudaGraphAddMemcpyNode` asks of its caller).
    unsafe {
        copy_node(out, graph, deps, count, side(&p.dst_ptr, &p.dst_pos), side(&p.src_ptr, &p.src_pos), dims, p.kind)
    }
}

/// # Safety
/// The pointers must be what `cudaGraphAddMemcpyNode1D` takes.
#[allow(clippy::too_many_arguments)]
pub unsafe fn add_memcpy_node_1d(
    out: *mut u64,
    graph: u64,
    deps: *const u64,
    count: usize,
    dst: *mut c_void,
    src: *const c_void,
    bytes: usize,
    kind: i32,
) -> Result<(), CudaError> {
    let n = bytes as u64;
    let (dst, src) = (dst as usize as u64, src as usize as u64);
    // SAFETY: `out`, `deps` and a host `src` of `bytes` readable bytes as this function's
    // contract gives them (what `cudaGraphAddMemcpyNode1D` asks of its caller).
    unsafe { copy_node(out, graph, deps, count, (dst, n, 0), (src, n, 0), (n, 1, 1), kind) }
}

/// # Safety
/// The pointers must be what `cudaGraphAddMemsetNode` takes.
pub unsafe fn add_memset_node(
    out: *mut u64,
    graph: u64,
    deps: *const u64,
    count: usize,
    p: *const c_void,
) -> Result<(), CudaError> {
    if p.is_null() {
        return Err(E::InvalidValue);
    }
    // SAFETY: not null (checked above): a `cudaMemsetParams` (this function's contract), read
    // without assuming alignment.
    let m = unsafe { (p as *const MemsetParams).read_unaligned() };
    let size = m.element_size as usize;
    if ![1, 2, 4].contains(&size) {
        return Err(E::InvalidValue);
    }
    // The value's element repeated must be one byte repeated (zero, all ones...): other
    // patterns would need a 16- or 32-bit memset.
    let bytes = m.value.to_le_bytes();
    if bytes[..size].iter().any(|&b| b != bytes[0]) {
        return Err(E::NotSupported);
    }
    let width = m.width.checked_mul(size).ok_or(E::InvalidValue)?;
    // SAFETY: `out` and `deps` as this function's contract gives them to `add_node`.
    unsafe {
        add_node(out, deps, count, |deps| {
            let request = PhosGraphAddSetNodeRequest {
                graph,
                deps,
                numDeps: count as u64,
                dst: m.dst,
                pitch: if m.height > 1 { m.pitch as u64 } else { width as u64 },
                value: i32::from(bytes[0]),
                width: width as u64,
                height: m.height as u64,
            };
            Ok(runtime::call(&request)?.pGraphNode)
        })
    }
}

/// # Safety
/// The pointers must be what `cudaGraphAddEmptyNode` takes.
pub unsafe fn add_empty_node(out: *mut u64, graph: u64, deps: *const u64, count: usize) -> Result<(), CudaError> {
    // SAFETY: `out` and `deps` as this function's contract gives them to `add_node`.
    unsafe {
        add_node(out, deps, count, |deps| {
            Ok(runtime::call(&PhosGraphAddEmptyNodeRequest { graph, deps, numDeps: count as u64 })?.pGraphNode)
        })
    }
}

/// `cudaGraphAddDependencies`: CUDA 13 put edge data before the count.
///
/// # Safety
/// The pointers must be what the ABI's `cudaGraphAddDependencies` takes.
pub unsafe fn add_dependencies(
    graph: u64,
    from: *const u64,
    to: *const u64,
    edge_data_or_count: usize,
    count_13: usize,
) -> Result<(), CudaError> {
    let count = if soname::current_abi().major() >= 13 {
        if edge_data_or_count != 0 {
            // Edge data (ports, programmatic edges) is not carried.
            return Err(E::NotSupported);
        }
        count_13
    } else {
        edge_data_or_count
    };
    // SAFETY: `from` holds `count` handles (this function's contract).
    let from = unsafe { handles(from, count)? };
    // SAFETY: and so does `to`.
    let to = unsafe { handles(to, count)? };
    runtime::call(&PhosGraphAddDependenciesRequest { graph, from: &from, to: &to, numDependencies: count as u64 })
        .map(|_| ())
}

/// `cudaGraphGetNodes`: with `nodes` null, the count only; else up to `*count` handles, and
/// the count of handles written.
///
/// # Safety
/// `count` must be writable; a non-null `nodes` must have room for `*count` handles.
pub unsafe fn get_nodes(graph: u64, nodes: *mut u64, count: *mut usize) -> Result<(), CudaError> {
    if count.is_null() {
        return Err(E::InvalidValue);
    }
    // SAFETY: `count` is not null (checked above) and readable (this function's contract).
    let max = if nodes.is_null() { 0 } else { unsafe { *count } };
    let reply = runtime::call(&PhosGraphNodesRequest { graph, max: max as u64 })?;
    let total = reply.count as usize;
    if nodes.is_null() {
        // SAFETY: not null (checked above), so writable (this function's contract).
        unsafe { *count = total };
        return Ok(());
    }
    let written = total.min(max);
    for (i, h) in reply.nodes.chunks_exact(8).take(written).enumerate() {
        // SAFETY: `i < written <= *count`: within the room for `*count` handles of the non-null
        // `nodes` (this function's contract).
        let at = unsafe { nodes.add(i) };
        // SAFETY: a handle's room there, written without assuming alignment.
        unsafe { at.write_unaligned(u64::from_ne_bytes(h.try_into().expect("8 bytes"))) };
    }
    // SAFETY: not null (checked above), so writable (this function's contract).
    unsafe { *count = written };
    Ok(())
}
