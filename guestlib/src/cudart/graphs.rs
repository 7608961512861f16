//! The guest side of stream capture and graphs: the parameters whose meaning changed between
//! CUDA versions. The capture itself happens at the server (api-server/src/capture.rs).

use std::collections::BTreeMap;
use std::ffi::c_void;
use std::sync::{Mutex, PoisonError};

use phos_protocol::CudaError;
use phos_protocol::cudart::{
    PhosGraphAddChildNodeRequest, PhosGraphAddConditionalNodeRequest, PhosGraphAddCopyNodeRequest,
    PhosGraphAddDependenciesRequest, PhosGraphAddEmptyNodeRequest, PhosGraphAddEventNodeRequest,
    PhosGraphAddHostNodeRequest, PhosGraphAddKernelNodeRequest, PhosGraphAddMemAllocNodeRequest,
    PhosGraphAddMemFreeNodeRequest, PhosGraphAddSetNodeRequest, PhosGraphConditionalHandleCreateRequest,
    PhosGraphEditRequest, PhosGraphExecUpdateRequest, PhosGraphHostNodesRequest, PhosGraphInstantiateRequest,
    PhosGraphLaunchHostRequest, PhosGraphMemRequest, PhosGraphNodesRequest, PhosGraphQueryRequest, consts,
};
use phos_protocol::types::Dim3;
use phos_protocol::{CudaError as E, Ptr};

use super::hand::Hand;
use super::memory::Memcpy3DParms;
use super::stubs::HandWritten;
use super::{launch, memory};
use crate::{callbacks, runtime, soname};

/// `cudaGraphInstantiateFlagAutoFreeOnLaunch | Upload | UseNodePriority`: accepted (the server
/// frees on launch; launches issue everything, priorities are hints).
const INSTANTIATE_FLAGS: u64 = AUTO_FREE | 0x2 | 0x8;
/// `cudaGraphInstantiateFlagAutoFreeOnLaunch`.
const AUTO_FREE: u64 = 0x1;
/// `cudaGraphInstantiateFlagDeviceLaunch`: graphs launched from kernels.
const DEVICE_LAUNCH: u64 = 0x4;

/// `cudaStreamGetCaptureInfo` in each of its forms: the status and the capture id, and where
/// asked for (CUDA 11.3's `_v2` on), while the capture is active, the graph being captured, the
/// nodes the stream's next captured work depends on (an array the library keeps until the next
/// query on the stream or the capture's end, as CUDA keeps its own) and their count, and
/// (`_v3`) default edge data for each. Not active, those are null and 0 (CUDA documents them
/// only for an active capture).
///
/// # Safety
/// Non-null out pointers must be writable.
pub unsafe fn capture_info(
    stream: *mut c_void,
    status: *mut i32,
    id: *mut u64,
    graph: *mut u64,
    deps: *mut *const u64,
    edges: *mut *const u8,
    count: *mut usize,
) -> Result<(), CudaError> {
    if status.is_null() || (!edges.is_null() && deps.is_null()) {
        return Err(CudaError::InvalidValue);
    }
    let stream = stream as usize as u64;
    let info = if graph.is_null() && deps.is_null() && count.is_null() {
        let (status, id) = super::capture::capture_info(stream)?;
        super::capture::CaptureGraph { status, id, graph: 0, deps: std::ptr::null(), edges: std::ptr::null(), count: 0 }
    } else {
        super::capture::capture_graph(stream)?
    };
    // SAFETY: not null (checked above), so writable (this function's contract).
    unsafe { *status = info.status };
    if !id.is_null() && info.status != 0 {
        // SAFETY: not null, so writable (this function's contract).
        unsafe { id.write_unaligned(info.id) };
    }
    if !graph.is_null() {
        // SAFETY: not null, so writable (this function's contract).
        unsafe { graph.write_unaligned(info.graph) };
    }
    if !deps.is_null() {
        // SAFETY: not null, so writable (this function's contract).
        unsafe { deps.write_unaligned(info.deps) };
    }
    if !edges.is_null() {
        // SAFETY: not null, so writable (this function's contract).
        unsafe { edges.write_unaligned(info.edges) };
    }
    if !count.is_null() {
        // SAFETY: not null, so writable (this function's contract).
        unsafe { count.write_unaligned(info.count) };
    }
    Ok(())
}

/// `cudaStreamUpdateCaptureDependencies` (and `_v2`, with edge data, which must be absent or
/// default): `flags` `cudaStreamSetCaptureDependencies` (1) replaces the stream's dependency
/// set with `deps`, `cudaStreamAddCaptureDependencies` (0) adds them to it.
///
/// # Safety
/// A non-null `deps` must hold `count` handles; a non-null `edges` `count` edge data.
pub unsafe fn update_capture_dependencies(
    stream: *mut c_void,
    deps: *const u64,
    edges: *const u8,
    count: usize,
    flags: u32,
) -> Result<(), CudaError> {
    if flags > 1 {
        return Err(E::InvalidValue);
    }
    // SAFETY: `count` handles at a non-null `deps` (this function's contract).
    let list = unsafe { handles(deps, count)? };
    // SAFETY: `count` edge data at `edges` (this function's contract), `count` checked above.
    if unsafe { !default_edges(edges, count) } {
        // Edge data (ports, programmatic edges) is not carried.
        return Err(E::NotSupported);
    }
    super::capture::update_dependencies(stream as usize as u64, &list, flags)
}

/// `cudaStreamBeginCaptureToGraph`: a capture of `stream` into `graph` after the nodes
/// `deps`, with default edge data only (`cudaErrorNotSupported` for other edge data).
///
/// # Safety
/// A non-null `deps` must hold `count` handles; a non-null `edges` `count` edge data.
pub unsafe fn begin_capture_to_graph(
    stream: *mut c_void,
    graph: *mut c_void,
    deps: *const u64,
    edges: *const u8,
    count: usize,
    mode: i32,
) -> Result<(), CudaError> {
    if graph.is_null() {
        return Err(E::InvalidValue);
    }
    // SAFETY: `count` handles at a non-null `deps` (this function's contract).
    let list = unsafe { handles(deps, count)? };
    // SAFETY: `count` edge data at `edges` (this function's contract), `count` checked above.
    if unsafe { !default_edges(edges, count) } {
        // Edge data (ports, programmatic edges) is not carried.
        crate::log::not_supported_once("cudaStreamBeginCaptureToGraph with edge data", "cudaErrorNotSupported");
        return Err(E::NotSupported);
    }
    super::capture::begin_to_graph(stream as usize as u64, graph as usize as u64, &list, mode)
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
    note_host_nodes(reply.pGraphExec)?;
    // Whether it has memory nodes (and it frees on launch, when asked).
    let request = PhosGraphMemRequest { what: MEM_EXEC, a: i32::from(flags & AUTO_FREE != 0), b: reply.pGraphExec };
    if runtime::call(&request)?.value == 1 {
        MEM_EXECS.lock().unwrap_or_else(PoisonError::into_inner).insert(reply.pGraphExec);
    }
    super::user_objects::copy_references(graph as usize as u64, reply.pGraphExec);
    EXEC_FLAGS.lock().unwrap_or_else(PoisonError::into_inner).insert(reply.pGraphExec, flags);
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

/// Whether `count` edge data at `edges` (NULL: none) are all the default (zeros): other edge
/// data (ports, programmatic edges) is not carried.
///
/// # Safety
/// A non-null `edges` holds `count` 8-byte `cudaGraphEdgeData` (CUDA's contract); `count` is
/// at most 2^20 (the callers checked the dependency list first).
unsafe fn default_edges(edges: *const u8, count: usize) -> bool {
    if edges.is_null() || count == 0 {
        return true;
    }
    // SAFETY: `count * 8` bytes at the non-null `edges` (the contract above), only read.
    unsafe { std::slice::from_raw_parts(edges, count * 8) }.iter().all(|&b| b == 0)
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
pub(crate) unsafe fn add_node(
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
pub(crate) unsafe fn copy_node(
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
            let node = runtime::call(&request)?.pGraphNode;
            if host {
                // What `cudaGraphMemcpyNodeGetParams` answers as the source.
                HOST_SOURCES.lock().unwrap_or_else(PoisonError::into_inner).insert(node, (src, spitch, sslice));
            }
            Ok(node)
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

/// `cudaGraphAddDependencies_v2`: edge data must be absent or default.
///
/// # Safety
/// `from` and `to` hold `count` handles; a non-null `edges` holds `count` edge data.
pub unsafe fn add_dependencies_with_edges(
    graph: u64,
    from: *const u64,
    to: *const u64,
    edges: *const u8,
    count: usize,
) -> Result<(), CudaError> {
    // SAFETY: `count` handles at `from` (this function's contract).
    let from = unsafe { handles(from, count)? };
    // SAFETY: and at `to`.
    let to = unsafe { handles(to, count)? };
    // SAFETY: `count` edge data at `edges` (this function's contract), `count` checked above.
    if unsafe { !default_edges(edges, count) } {
        return Err(E::NotSupported);
    }
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

/// Executable graphs with host nodes, and how many: their launches go through
/// [`launch_with_host_nodes`] (the others are sent without waiting). Kept for the process's
/// life: a handle is never given twice, and a destroyed one fails at the server.
static HOST_EXECS: Mutex<BTreeMap<u64, u64>> = Mutex::new(BTreeMap::new());
/// Executable graphs with memory nodes (launched synchronously), kept as [`HOST_EXECS`].
static MEM_EXECS: Mutex<std::collections::BTreeSet<u64>> = Mutex::new(std::collections::BTreeSet::new());

/// Note whether `exec`, just instantiated, has host nodes.
fn note_host_nodes(exec: u64) -> Result<(), CudaError> {
    let request = PhosGraphHostNodesRequest { graphExec: exec, stream: 0, firstGate: 0, max: 0 };
    let count = runtime::call(&request)?.count;
    if count > 0 {
        HOST_EXECS.lock().unwrap_or_else(PoisonError::into_inner).insert(exec, count);
    }
    Ok(())
}

/// `cudaGraphLaunch`'s fast path: a graph with host nodes. The server announces a gate for
/// each host node, the callback thread is given the functions, and the launch puts the gates
/// in the stream where the nodes are (`None`: no host nodes, the ordinary launch).
pub fn launch_with_host_nodes(exec: u64, stream: u64) -> Option<Result<(), CudaError>> {
    let Some(count) = HOST_EXECS.lock().unwrap_or_else(PoisonError::into_inner).get(&exec).copied() else {
        // A graph with memory nodes launches synchronously: a launch whose allocation is still
        // live fails at the call, as in CUDA.
        if !MEM_EXECS.lock().unwrap_or_else(PoisonError::into_inner).contains(&exec) {
            return None;
        }
        return Some(runtime::call(&PhosGraphLaunchHostRequest { graphExec: exec, stream, firstGate: 0 }).map(|_| ()));
    };
    Some((|| {
        let first = callbacks::reserve_gates(count);
        let request = PhosGraphHostNodesRequest { graphExec: exec, stream, firstGate: first, max: count };
        let reply = runtime::call(&request)?;
        let words: Vec<u64> =
            reply.calls.chunks_exact(8).map(|w| u64::from_ne_bytes(w.try_into().expect("8 bytes"))).collect();
        for (i, call) in words.chunks_exact(2).enumerate() {
            // SAFETY: a host node's function and data as the application gave them to
            // `cudaGraphAddHostNode` (or a setter), whose contract is this one's.
            unsafe { callbacks::graph_host_node(first + i as u64, call[0], call[1])? };
        }
        runtime::call(&PhosGraphLaunchHostRequest { graphExec: exec, stream, firstGate: first }).map(|_| ())
    })())
}

/// `struct cudaHostNodeParams` (and CUDA 12's `V2`).
#[repr(C)]
#[derive(Clone, Copy)]
struct HostNodeParams {
    func: u64,
    data: u64,
}

/// # Safety
/// The pointers must be what `cudaGraphAddHostNode` takes.
pub unsafe fn add_host_node(
    out: *mut u64,
    graph: u64,
    deps: *const u64,
    count: usize,
    p: *const c_void,
) -> Result<(), CudaError> {
    if p.is_null() {
        return Err(E::InvalidValue);
    }
    // SAFETY: not null (checked above): a `cudaHostNodeParams` (this function's contract), read
    // without assuming alignment; its pointers are only kept.
    let h = unsafe { (p as *const HostNodeParams).read_unaligned() };
    if h.func == 0 {
        return Err(E::InvalidValue);
    }
    // SAFETY: `out` and `deps` as this function's contract gives them to `add_node`.
    unsafe {
        add_node(out, deps, count, |deps| {
            let request =
                PhosGraphAddHostNodeRequest { graph, deps, numDeps: count as u64, hostFn: h.func, userData: h.data };
            Ok(runtime::call(&request)?.pGraphNode)
        })
    }
}

/// An event record (`wait` false) or wait node.
///
/// # Safety
/// As [`add_node`].
pub unsafe fn add_event_node(
    out: *mut u64,
    graph: u64,
    deps: *const u64,
    count: usize,
    event: u64,
    wait: bool,
) -> Result<(), CudaError> {
    // SAFETY: `out` and `deps` as this function's contract gives them to `add_node`.
    unsafe {
        add_node(out, deps, count, |deps| {
            let request =
                PhosGraphAddEventNodeRequest { graph, deps, numDeps: count as u64, event, wait: i32::from(wait) };
            Ok(runtime::call(&request)?.pGraphNode)
        })
    }
}

/// A child graph node: the server copies the child's work now.
///
/// # Safety
/// As [`add_node`].
pub unsafe fn add_child_node(
    out: *mut u64,
    graph: u64,
    deps: *const u64,
    count: usize,
    child: u64,
) -> Result<(), CudaError> {
    // SAFETY: `out` and `deps` as this function's contract gives them to `add_node`.
    unsafe {
        add_node(out, deps, count, |deps| {
            let request = PhosGraphAddChildNodeRequest { graph, deps, numDeps: count as u64, child };
            Ok(runtime::call(&request)?.pGraphNode)
        })
    }
}

/// The device address of `count` bytes at `offset` in a `__device__` variable.
pub(crate) fn symbol_range(symbol: *const c_void, count: usize, offset: usize) -> Result<u64, CudaError> {
    let var = crate::registry::variable(symbol).ok_or(E::InvalidSymbol)?;
    let (addr, size) = var.remote()?;
    let end = (offset as u64).checked_add(count as u64).ok_or(E::InvalidValue)?;
    if end > size {
        return Err(E::InvalidValue);
    }
    Ok(addr + offset as u64)
}

/// `cudaGraphAddMemcpyNodeToSymbol`: a copy to the variable's device memory.
///
/// # Safety
/// The pointers must be what `cudaGraphAddMemcpyNodeToSymbol` takes.
#[allow(clippy::too_many_arguments)]
pub unsafe fn add_memcpy_node_to_symbol(
    out: *mut u64,
    graph: u64,
    deps: *const u64,
    count: usize,
    symbol: *const c_void,
    src: *const c_void,
    bytes: usize,
    offset: usize,
    kind: i32,
) -> Result<(), CudaError> {
    if ![consts::cudaMemcpyHostToDevice, consts::cudaMemcpyDeviceToDevice, consts::cudaMemcpyDefault].contains(&kind) {
        return Err(E::InvalidMemcpyDirection);
    }
    let dst = symbol_range(symbol, bytes, offset)?;
    // SAFETY: `out`, `deps` and a host `src` of `bytes` readable bytes as this function's
    // contract gives them.
    unsafe { add_memcpy_node_1d(out, graph, deps, count, dst as usize as *mut c_void, src, bytes, kind) }
}

/// `cudaGraphAddMemcpyNodeFromSymbol`: a copy from the variable's device memory (to device
/// memory: a node writing to the host is not carried).
///
/// # Safety
/// The pointers must be what `cudaGraphAddMemcpyNodeFromSymbol` takes.
#[allow(clippy::too_many_arguments)]
pub unsafe fn add_memcpy_node_from_symbol(
    out: *mut u64,
    graph: u64,
    deps: *const u64,
    count: usize,
    dst: *mut c_void,
    symbol: *const c_void,
    bytes: usize,
    offset: usize,
    kind: i32,
) -> Result<(), CudaError> {
    if ![consts::cudaMemcpyDeviceToHost, consts::cudaMemcpyDeviceToDevice, consts::cudaMemcpyDefault].contains(&kind) {
        return Err(E::InvalidMemcpyDirection);
    }
    let src = symbol_range(symbol, bytes, offset)?;
    // SAFETY: `out`, `deps` and `dst` as this function's contract gives them; the source is
    // device memory.
    unsafe { add_memcpy_node_1d(out, graph, deps, count, dst, src as usize as *const c_void, bytes, kind) }
}

/// `cudaGraphNodeType` values `cudaGraphAddNode` takes.
pub(crate) const NODE_KERNEL: i32 = 0;
const NODE_MEMCPY: i32 = 1;
const NODE_MEMSET: i32 = 2;
const NODE_HOST: i32 = 3;
const NODE_GRAPH: i32 = 4;
const NODE_EMPTY: i32 = 5;
const NODE_WAIT_EVENT: i32 = 6;
const NODE_EVENT_RECORD: i32 = 7;

/// Where the parameters start in a `cudaGraphNodeParams` (after the type and reserved words).
const NODE_PARAMS_AT: usize = 16;
/// Where a `cudaMemcpyNodeParams`' `copyParams` start (after flags and reserved words).
const COPY_PARAMS_AT: usize = 16;

/// `cudaGraphAddNode` and `_v2`: a node of any type this library carries, from a
/// `cudaGraphNodeParams`. Edge data must be absent or all default (zero): ports and
/// programmatic edges are not carried.
///
/// # Safety
/// The pointers must be what `cudaGraphAddNode_v2` takes (a non-null `edges` holds `count`
/// 8-byte `cudaGraphEdgeData`).
pub unsafe fn add_node_with_params(
    out: *mut u64,
    graph: u64,
    deps: *const u64,
    edges: *const u8,
    count: usize,
    p: *mut c_void,
) -> Result<(), CudaError> {
    if p.is_null() {
        return Err(E::InvalidValue);
    }
    if !edges.is_null() && count > 0 {
        if count > 1 << 20 {
            return Err(E::InvalidValue);
        }
        // SAFETY: `count` edge data of 8 bytes each at a non-null `edges` (this function's
        // contract).
        let data = unsafe { std::slice::from_raw_parts(edges, count * 8) };
        if data.iter().any(|&b| b != 0) {
            crate::log::not_supported_once(
                "cudaGraphAddNode with edge data (ports, edge types)",
                "cudaErrorNotSupported",
            );
            return Err(E::NotSupported);
        }
    }
    let base = p as *const u8;
    // SAFETY: a `cudaGraphNodeParams` at the non-null `p` (this function's contract): its type
    // first, read without assuming alignment.
    let kind = unsafe { (base as *const i32).read_unaligned() };
    // SAFETY: within the `cudaGraphNodeParams`: its parameters' union.
    let params = unsafe { base.add(NODE_PARAMS_AT) } as *const c_void;
    let word = |i: usize| {
        // SAFETY: within the union (29 words long) of the `cudaGraphNodeParams`.
        let at = unsafe { (params as *const u64).add(i) };
        // SAFETY: a word of the union there, read without assuming alignment.
        unsafe { at.read_unaligned() }
    };
    // Each call below: `out`, `deps` and the parameters of each type as this function's
    // contract gives them, what the type's own `cudaGraphAdd*Node` asks of its caller.
    match kind {
        // SAFETY: as above.
        NODE_KERNEL => unsafe { add_kernel_node(out, graph, deps, count, params) },
        NODE_MEMCPY => {
            if (word(0) as u32) != 0 {
                // `flags` must be zero.
                return Err(E::InvalidValue);
            }
            // SAFETY: within the union: the `cudaMemcpyNodeParams`' `copyParams`.
            let copy = unsafe { (params as *const u8).add(COPY_PARAMS_AT) } as *const c_void;
            // SAFETY: as above.
            unsafe { add_memcpy_node(out, graph, deps, count, copy) }
        }
        // SAFETY: as above.
        NODE_MEMSET => unsafe { add_memset_node(out, graph, deps, count, params) },
        // SAFETY: as above.
        NODE_HOST => unsafe { add_host_node(out, graph, deps, count, params) },
        NODE_GRAPH => {
            // CUDA 13's ownership: 0 clones the child (the only form before it).
            if word(1) as u32 != 0 {
                crate::log::not_supported_once(
                    "cudaGraphAddNode: a child graph moved into its node",
                    "cudaErrorNotSupported",
                );
                return Err(E::NotSupported);
            }
            // SAFETY: as above.
            unsafe { add_child_node(out, graph, deps, count, word(0)) }
        }
        // SAFETY: as above.
        NODE_EMPTY => unsafe { add_empty_node(out, graph, deps, count) },
        // SAFETY: as above.
        NODE_WAIT_EVENT => unsafe { add_event_node(out, graph, deps, count, word(0), true) },
        // SAFETY: as above.
        NODE_EVENT_RECORD => unsafe { add_event_node(out, graph, deps, count, word(0), false) },
        // SAFETY: as above: the union holds a `cudaMemAllocNodeParamsV2`, laid out as
        // `cudaMemAllocNodeParams`.
        NODE_MEM_ALLOC => unsafe { add_mem_alloc_node(out, graph, deps, count, params as *mut c_void) },
        // SAFETY: as above.
        NODE_MEM_FREE => unsafe { add_mem_free_node(out, graph, deps, count, word(0)) },
        // SAFETY: as above: the union holds a `cudaConditionalNodeParams`, whose body array
        // pointer this writes.
        NODE_CONDITIONAL => unsafe { add_conditional_node(out, graph, deps, count, params as *mut u8) },
        8..=12 => {
            let name = match kind {
                8 => "an external semaphore signal node",
                9 => "an external semaphore wait node",
                _ => "a batch memory operation node",
            };
            crate::log::not_supported_once(&format!("cudaGraphAddNode of {name}"), "cudaErrorNotSupported");
            Err(E::NotSupported)
        }
        _ => Err(E::InvalidValue),
    }
}

// ---- Conditional nodes

/// `cudaGraphNodeTypeConditional`.
const NODE_CONDITIONAL: i32 = 13;

/// The body graph arrays of conditional nodes, by node: CUDA's `phGraph_out` is an array the
/// library owns, valid while the node lives (kept here until the process ends: a node's
/// destruction does not pass through here).
static BODIES: Mutex<BTreeMap<u64, Box<[u64]>>> = Mutex::new(BTreeMap::new());

/// The array of `node`'s bodies, kept (the same one for the same bodies).
fn kept_bodies(node: u64, bodies: &[u64]) -> *mut u64 {
    let mut all = BODIES.lock().unwrap_or_else(PoisonError::into_inner);
    let kept = all.entry(node).or_insert_with(|| bodies.into());
    if **kept != *bodies {
        *kept = bodies.into();
    }
    // A box's contents stay where they are while the box is in the map.
    kept.as_mut_ptr()
}

/// `cudaGraphConditionalHandleCreate` (and `_v2`, whose execution context is the calling
/// device's): a handle for `graph`, the address of a cell of the session's memory.
///
/// # Safety
/// A non-null `out` must be writable.
pub unsafe fn conditional_handle_create(out: *mut u64, graph: u64, default: u32, flags: u32) -> Result<(), CudaError> {
    if out.is_null() || graph == 0 {
        return Err(E::InvalidValue);
    }
    let request = PhosGraphConditionalHandleCreateRequest { graph, defaultLaunchValue: default, flags };
    let handle = runtime::call(&request)?.handle;
    // SAFETY: not null (checked above), so writable (this function's contract).
    unsafe { out.write_unaligned(handle) };
    Ok(())
}

/// `cudaGraphAddNode` of a conditional node: the `cudaConditionalNodeParams` at `p` (handle,
/// type, size, then the body array pointer this writes: CUDA 12.4 to 13 lay it out alike; the
/// driver's adds a context after it, which is the calling device's).
///
/// # Safety
/// `out` and `deps` as `cudaGraphAddNode` takes them; `p` a writable `cudaConditionalNodeParams`.
unsafe fn add_conditional_node(
    out: *mut u64,
    graph: u64,
    deps: *const u64,
    count: usize,
    p: *mut u8,
) -> Result<(), CudaError> {
    // SAFETY: the struct's fields (this function's contract), read without assuming alignment.
    let handle = unsafe { (p as *const u64).read_unaligned() };
    // SAFETY: as above.
    let kind = unsafe { (p.wrapping_add(8) as *const i32).read_unaligned() };
    // SAFETY: as above.
    let size = unsafe { (p.wrapping_add(12) as *const u32).read_unaligned() };
    if size == 0 || size > 1024 {
        return Err(E::InvalidValue);
    }
    let mut bodies = Vec::new();
    // SAFETY: `out` and `deps` as this function's contract gives them to `add_node`.
    unsafe {
        add_node(out, deps, count, |deps| {
            let request = PhosGraphAddConditionalNodeRequest { graph, deps, count: count as u64, handle, kind, size };
            let reply = runtime::call(&request)?;
            bodies = reply.bodies.chunks_exact(8).map(|b| u64::from_ne_bytes(b.try_into().expect("8 bytes"))).collect();
            Ok(reply.node)
        })?
    };
    // SAFETY: written just above.
    let node = unsafe { out.read_unaligned() };
    let array = kept_bodies(node, &bodies);
    // SAFETY: the `phGraph_out` field (this function's contract), written without assuming
    // alignment.
    unsafe { (p.wrapping_add(16) as *mut *mut u64).write_unaligned(array) };
    Ok(())
}

/// A conditional node's `cudaConditionalNodeParams`: its handle, type, size and body array.
///
/// # Safety
/// `out` must be a writable `cudaConditionalNodeParams`.
unsafe fn conditional_params(node: u64, out: *mut u8) -> Result<(), CudaError> {
    let w = params_of(node, NODE_CONDITIONAL)?;
    let (handle, kind, size) = (w[1], w[2] as i32, w[3] as u32);
    let array = kept_bodies(node, w.get(4..).unwrap_or(&[]));
    // SAFETY: the struct's fields (this function's contract), written without assuming
    // alignment.
    unsafe { (out as *mut u64).write_unaligned(handle) };
    // SAFETY: as above.
    unsafe { (out.wrapping_add(8) as *mut i32).write_unaligned(kind) };
    // SAFETY: as above.
    unsafe { (out.wrapping_add(12) as *mut u32).write_unaligned(size) };
    // SAFETY: as above.
    unsafe { (out.wrapping_add(16) as *mut *mut u64).write_unaligned(array) };
    Ok(())
}

// ---- Memory nodes

/// `cudaGraphNodeType` of memory nodes.
const NODE_MEM_ALLOC: i32 = 10;
const NODE_MEM_FREE: i32 = 11;
/// What `phosGraphMem` does.
const MEM_ATTRIBUTE: i32 = 0;
const MEM_RESET_HIGH: i32 = 1;
const MEM_TRIM: i32 = 2;
const MEM_EXEC: i32 = 3;
/// Where `cudaMemAllocNodeParams`' fields are (CUDA 11 to 13: `cudaMemPoolProps` is 88
/// bytes), and its size.
const ALLOC_ACCESS_COUNT_AT: usize = 96;
const ALLOC_BYTESIZE_AT: usize = 104;
const ALLOC_DPTR_AT: usize = 112;
const ALLOC_PARAMS_SIZE: usize = 120;

/// `cudaGraphAddMemAllocNode`: pinned device memory of no handle types; the address goes to
/// the parameters' `dptr`. Access descriptors other than the allocation's own device's
/// read-write access are not carried.
///
/// # Safety
/// As [`add_node`]; a non-null `p` must be a writable `cudaMemAllocNodeParams`.
pub unsafe fn add_mem_alloc_node(
    out: *mut u64,
    graph: u64,
    deps: *const u64,
    count: usize,
    p: *mut c_void,
) -> Result<(), CudaError> {
    if p.is_null() {
        return Err(E::InvalidValue);
    }
    let mut bytes = [0u8; ALLOC_PARAMS_SIZE];
    // SAFETY: not null (checked above): a `cudaMemAllocNodeParams` of this size (this function's
    // contract), copied bytewise.
    unsafe { std::ptr::copy_nonoverlapping(p as *const u8, bytes.as_mut_ptr(), ALLOC_PARAMS_SIZE) };
    let i32_at = |o: usize| i32::from_ne_bytes(bytes[o..o + 4].try_into().expect("4 bytes"));
    let u64_at = |o: usize| u64::from_ne_bytes(bytes[o..o + 8].try_into().expect("8 bytes"));
    // allocType pinned, handleTypes none, a device location.
    let (alloc_type, handle_types, location_type, device) = (i32_at(0), i32_at(4), i32_at(8), i32_at(12));
    if alloc_type != 1 || handle_types != 0 || location_type != 1 {
        return Err(E::InvalidValue);
    }
    let (accesses, access_count, size) = (u64_at(88), u64_at(ALLOC_ACCESS_COUNT_AT), u64_at(ALLOC_BYTESIZE_AT));
    if access_count > 0 {
        let n = runtime::session()?.device_count;
        if accesses == 0 || access_count > n as u64 {
            return Err(E::InvalidValue);
        }
        for i in 0..access_count as usize {
            // SAFETY: `i < access_count`: within the `cudaMemAccessDesc`s (12 bytes: location
            // type, id, flags) at the non-null `accessDescs` (CUDA's contract for the parameters).
            let at = unsafe { (accesses as usize as *const [i32; 3]).add(i) };
            // SAFETY: one of them, read without assuming alignment.
            let [t, id, flags] = unsafe { at.read_unaligned() };
            // Only the allocation's own device, read-write (cudaMemAccessFlagsProtReadWrite).
            if t != 1 || id != device || flags != 3 {
                crate::log::not_supported_once(
                    "cudaGraphAddMemAllocNode with peer access descriptors",
                    "cudaErrorNotSupported",
                );
                return Err(E::NotSupported);
            }
        }
    }
    let mut dptr = 0;
    // SAFETY: `out` and `deps` as this function's contract gives them to `add_node`.
    unsafe {
        add_node(out, deps, count, |deps| {
            let request =
                PhosGraphAddMemAllocNodeRequest { graph, deps, numDeps: count as u64, device, bytesize: size };
            let reply = runtime::call(&request)?;
            dptr = reply.dptr;
            Ok(reply.pGraphNode)
        })?
    };
    // SAFETY: within the writable `cudaMemAllocNodeParams` at `p` (this function's contract): its
    // `dptr`.
    let at = unsafe { (p as *mut u8).add(ALLOC_DPTR_AT) } as *mut u64;
    // SAFETY: there, written without assuming alignment.
    unsafe { at.write_unaligned(dptr) };
    Ok(())
}

/// `cudaGraphAddMemFreeNode`: of a graph allocation (the server checks) or a block of
/// `cudaMallocAsync`'s.
///
/// # Safety
/// As [`add_node`].
pub unsafe fn add_mem_free_node(
    out: *mut u64,
    graph: u64,
    deps: *const u64,
    count: usize,
    dptr: u64,
) -> Result<(), CudaError> {
    if dptr == 0 {
        return Err(E::InvalidValue);
    }
    let async_block = i32::from(super::pools::is_async_block(dptr));
    // SAFETY: `out` and `deps` as this function's contract gives them to `add_node`.
    unsafe {
        add_node(out, deps, count, |deps| {
            let request =
                PhosGraphAddMemFreeNodeRequest { graph, deps, numDeps: count as u64, dptr, asyncBlock: async_block };
            Ok(runtime::call(&request)?.pGraphNode)
        })
    }
}

/// `cudaGraphMemAllocNodeGetParams`: the parameters as CUDA answers them for a node added
/// with no access descriptors.
///
/// # Safety
/// A non-null `out` must be a writable `cudaMemAllocNodeParams`.
pub unsafe fn mem_alloc_params(node: u64, out: *mut c_void) -> Result<(), CudaError> {
    if out.is_null() {
        return Err(E::InvalidValue);
    }
    let w = params_of(node, NODE_MEM_ALLOC)?;
    let mut bytes = [0u8; ALLOC_PARAMS_SIZE];
    bytes[0..4].copy_from_slice(&1i32.to_ne_bytes());
    bytes[8..12].copy_from_slice(&1i32.to_ne_bytes());
    bytes[12..16].copy_from_slice(&(w[3] as i32).to_ne_bytes());
    bytes[ALLOC_BYTESIZE_AT..ALLOC_BYTESIZE_AT + 8].copy_from_slice(&w[2].to_ne_bytes());
    bytes[ALLOC_DPTR_AT..ALLOC_DPTR_AT + 8].copy_from_slice(&w[1].to_ne_bytes());
    // SAFETY: not null (checked above): a writable `cudaMemAllocNodeParams` of this size (this
    // function's contract), written bytewise.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), out as *mut u8, ALLOC_PARAMS_SIZE) };
    Ok(())
}

/// `cudaGraphMemFreeNodeGetParams`: the address the node frees.
///
/// # Safety
/// A non-null `out` must be a writable `void *`.
pub unsafe fn mem_free_params(node: u64, out: *mut c_void) -> Result<(), CudaError> {
    if out.is_null() {
        return Err(E::InvalidValue);
    }
    let w = params_of(node, NODE_MEM_FREE)?;
    // SAFETY: not null (checked above): a writable pointer (this function's contract), written
    // without assuming alignment.
    unsafe { (out as *mut u64).write_unaligned(w[1]) };
    Ok(())
}

/// `cudaDeviceGetGraphMemAttribute`: the `uint64_t` value of `attr` (0 to 3).
///
/// # Safety
/// A non-null `value` must be a writable `uint64_t`.
pub unsafe fn get_mem_attribute(device: i32, attr: i32, value: *mut c_void) -> Result<(), CudaError> {
    if value.is_null() || !(0..=3).contains(&attr) {
        return Err(E::InvalidValue);
    }
    let v = runtime::call(&PhosGraphMemRequest { what: MEM_ATTRIBUTE, a: device, b: attr as u64 })?.value;
    // SAFETY: not null (checked above), a writable `uint64_t` (this function's contract).
    unsafe { (value as *mut u64).write_unaligned(v) };
    Ok(())
}

/// `cudaDeviceSetGraphMemAttribute`: only the high-water marks (`UsedMemHigh`,
/// `ReservedMemHigh`) may be set, to 0, which resets them to the current amount.
///
/// # Safety
/// A non-null `value` must be a readable `uint64_t`.
pub unsafe fn set_mem_attribute(device: i32, attr: i32, value: *const c_void) -> Result<(), CudaError> {
    // SAFETY: read only when not null: a `uint64_t` (this function's contract).
    if value.is_null() || !(attr == 1 || attr == 3) || unsafe { (value as *const u64).read_unaligned() } != 0 {
        return Err(E::InvalidValue);
    }
    runtime::call(&PhosGraphMemRequest { what: MEM_RESET_HIGH, a: device, b: attr as u64 })?;
    Ok(())
}

/// `cudaDeviceGraphMemTrim`.
pub fn mem_trim(device: i32) -> Result<(), CudaError> {
    runtime::call(&PhosGraphMemRequest { what: MEM_TRIM, a: device, b: 0 })?;
    Ok(())
}

// ---- Node queries, edits, clones and executable graph updates

/// The flags each executable graph was instantiated with (`cudaGraphExecGetFlags`).
static EXEC_FLAGS: Mutex<BTreeMap<u64, u64>> = Mutex::new(BTreeMap::new());
/// The host source (address, pitch, slice) of each copy node this process added from the host:
/// the node keeps the data, CUDA's parameters name the source.
static HOST_SOURCES: Mutex<BTreeMap<u64, (u64, u64, u64)>> = Mutex::new(BTreeMap::new());
/// The parameter storage `cudaGraphKernelNodeGetParams` points into, per node: the buffer and
/// the pointer array (valid until the next query of the node).
#[allow(clippy::type_complexity)]
static KERNEL_PARAMS: Mutex<BTreeMap<u64, (Box<[u8]>, Box<[usize]>)>> = Mutex::new(BTreeMap::new());
/// A graph of the session's that no application sees: setters add a node of the new
/// parameters there, and the server moves them into the node being set.
static SCRATCH: Mutex<u64> = Mutex::new(0);

/// What `phosGraphQuery` answers.
const Q_ROOTS: i32 = 0;
const Q_EDGES: i32 = 1;
const Q_DEPENDENCIES: i32 = 2;
const Q_DEPENDENTS: i32 = 3;
const Q_PARAMS: i32 = 4;
const Q_GRAPH: i32 = 5;

/// What `phosGraphEdit` does.
const EDIT_DESTROY: i32 = 0;
const EDIT_SET: i32 = 1;
const EDIT_EXEC_SET: i32 = 2;
const EDIT_ENABLE: i32 = 3;
const EDIT_ENABLED: i32 = 4;
const EDIT_CLONE: i32 = 5;
const EDIT_FIND: i32 = 6;
const EDIT_REMOVE_EDGE: i32 = 7;

fn query(what: i32, handle: u64) -> Result<Vec<u64>, CudaError> {
    let count = runtime::call(&PhosGraphQueryRequest { what, handle, max: 0 })?.count;
    if count == 0 {
        return Ok(Vec::new());
    }
    let reply = runtime::call(&PhosGraphQueryRequest { what, handle, max: count })?;
    Ok(reply.words.chunks_exact(8).map(|w| u64::from_ne_bytes(w.try_into().expect("8 bytes"))).collect())
}

fn edit(what: i32, a: u64, b: u64, c: u64) -> Result<u64, CudaError> {
    Ok(runtime::call(&PhosGraphEditRequest { what, a, b, c })?.value)
}

/// A node's type and parameters as the server keeps them: the words of `phosGraphQuery`'s
/// parameters, checked to be of `kind`.
pub(crate) fn params_of(node: u64, kind: i32) -> Result<Vec<u64>, CudaError> {
    let words = query(Q_PARAMS, node).map_err(|_| E::InvalidValue)?;
    if words.first().copied() != Some(kind as u64) {
        return Err(E::InvalidValue);
    }
    Ok(words)
}

/// Write `list` to an application's array of `*count` entries (null entries after it), and
/// the count written; with `out` null, how many there are.
///
/// # Safety
/// `count` must be null or writable; a non-null `out` must have room for `*count` words.
unsafe fn write_list(list: &[u64], out: *mut u64, count: *mut usize) -> Result<(), CudaError> {
    if count.is_null() {
        return Err(E::InvalidValue);
    }
    if out.is_null() {
        // SAFETY: not null (checked above), so writable (this function's contract).
        unsafe { *count = list.len() };
        return Ok(());
    }
    // SAFETY: not null (checked above), readable.
    let room = unsafe { *count };
    for i in 0..room {
        // SAFETY: `i < room`: within the room of the non-null `out` (this function's contract).
        let at = unsafe { out.add(i) };
        // SAFETY: a word's room there, written without assuming alignment.
        unsafe { at.write_unaligned(list.get(i).copied().unwrap_or(0)) };
    }
    // SAFETY: not null (checked above), so writable.
    unsafe { *count = room.min(list.len()) };
    Ok(())
}

/// Zero `cudaGraphEdgeData` (8 bytes each) for `n` edges: the default edges Phos carries.
///
/// # Safety
/// A non-null `edges` must have room for `n` edge data.
unsafe fn zero_edges(edges: *mut u8, n: usize) {
    if !edges.is_null() && n > 0 {
        // SAFETY: room for `n` edge data of 8 bytes at the non-null `edges` (this function's
        // contract).
        unsafe { std::ptr::write_bytes(edges, 0, n * 8) };
    }
}

/// `cudaGraphGetRootNodes`.
///
/// # Safety
/// As [`write_list`].
pub unsafe fn get_root_nodes(graph: u64, out: *mut u64, count: *mut usize) -> Result<(), CudaError> {
    let list = query(Q_ROOTS, graph)?;
    // SAFETY: this function's contract.
    unsafe { write_list(&list, out, count) }
}

/// `cudaGraphGetEdges` (with `edges`, CUDA 13's and `_v2`'s edge data).
///
/// # Safety
/// `count` writable; non-null `from`, `to` and `edges` with room for `*count` entries.
pub unsafe fn get_edges(
    graph: u64,
    from: *mut u64,
    to: *mut u64,
    edges: *mut u8,
    count: *mut usize,
) -> Result<(), CudaError> {
    if count.is_null() || from.is_null() != to.is_null() {
        return Err(E::InvalidValue);
    }
    let words = query(Q_EDGES, graph)?;
    let froms: Vec<u64> = words.chunks_exact(2).map(|p| p[0]).collect();
    let tos: Vec<u64> = words.chunks_exact(2).map(|p| p[1]).collect();
    if from.is_null() {
        if !edges.is_null() {
            return Err(E::InvalidValue);
        }
        // SAFETY: this function's contract.
        return unsafe { write_list(&froms, std::ptr::null_mut(), count) };
    }
    // SAFETY: readable (this function's contract).
    let room = unsafe { *count };
    // SAFETY: `to` has room for `room` entries, `count` is writable (this function's contract).
    unsafe { write_list(&tos, to, count)? };
    // SAFETY: `count` is writable (this function's contract).
    unsafe { *count = room };
    // SAFETY: `from` has room for `room` entries (this function's contract).
    unsafe { write_list(&froms, from, count)? };
    // SAFETY: a non-null `edges` has room for `room` edge data (this function's contract).
    unsafe { zero_edges(edges, room) };
    Ok(())
}

/// `cudaGraphNodeGetDependencies` (`dependents` false) and `GetDependentNodes`.
///
/// # Safety
/// As [`write_list`]; a non-null `edges` with room for `*count` edge data.
pub unsafe fn node_edges(
    node: u64,
    dependents: bool,
    out: *mut u64,
    edges: *mut u8,
    count: *mut usize,
) -> Result<(), CudaError> {
    let list = query(if dependents { Q_DEPENDENTS } else { Q_DEPENDENCIES }, node).map_err(|_| E::InvalidValue)?;
    if out.is_null() && !edges.is_null() {
        return Err(E::InvalidValue);
    }
    // SAFETY: this function's contract.
    unsafe { write_list(&list, out, count)? };
    if !out.is_null() {
        // SAFETY: `count` is readable (it was just written).
        let written = unsafe { *count };
        // SAFETY: a non-null `edges` has room for `*count` edge data (this function's
        // contract), and `written` is at most that.
        unsafe { zero_edges(edges, written) };
    }
    Ok(())
}

/// `cudaGraphRemoveDependencies` (edge data, where the ABI has it, must be default).
///
/// # Safety
/// `from` and `to` hold `count` handles; a non-null `edges` holds `count` edge data.
pub unsafe fn remove_dependencies(
    graph: u64,
    from: *const u64,
    to: *const u64,
    edges: *const u8,
    count: usize,
) -> Result<(), CudaError> {
    // SAFETY: `count` handles at `from` (this function's contract).
    let from = unsafe { handles(from, count)? };
    // SAFETY: and at `to`.
    let to = unsafe { handles(to, count)? };
    // SAFETY: `count` edge data at `edges` (this function's contract), `count` checked above.
    if unsafe { !default_edges(edges, count) } {
        return Err(E::NotSupported);
    }
    let word = |b: &[u8]| u64::from_ne_bytes(b.try_into().expect("8 bytes"));
    for (f, t) in from.chunks_exact(8).zip(to.chunks_exact(8)) {
        edit(EDIT_REMOVE_EDGE, graph, word(f), word(t))?;
    }
    Ok(())
}

pub fn destroy_node(node: u64) -> Result<(), CudaError> {
    edit(EDIT_DESTROY, node, 0, 0)?;
    super::attributes::forget_node(node);
    Ok(())
}

/// `cudaGraphClone`.
///
/// # Safety
/// A non-null `out` must be writable.
pub unsafe fn clone_graph(out: *mut u64, graph: u64) -> Result<(), CudaError> {
    if out.is_null() {
        return Err(E::InvalidValue);
    }
    let clone = edit(EDIT_CLONE, graph, 0, 0)?;
    super::user_objects::copy_references(graph, clone);
    if super::attributes::nodes_have_attributes() {
        // Kernel node attributes kept here go to the clone's nodes, at the same places.
        let nodes = |g: u64| -> Result<Vec<u64>, CudaError> {
            let mut count = 0usize;
            // SAFETY: a writable count, no array.
            unsafe { get_nodes(g, std::ptr::null_mut(), &mut count)? };
            let mut list = vec![0u64; count];
            // SAFETY: room for `count` handles.
            unsafe { get_nodes(g, list.as_mut_ptr(), &mut count)? };
            list.truncate(count);
            Ok(list)
        };
        super::attributes::clone_nodes(&nodes(graph)?, &nodes(clone)?);
    }
    // SAFETY: not null (checked above), so writable.
    unsafe { out.write_unaligned(clone) };
    Ok(())
}

/// `cudaGraphNodeFindInClone`.
///
/// # Safety
/// A non-null `out` must be writable.
pub unsafe fn find_in_clone(out: *mut u64, node: u64, clone: u64) -> Result<(), CudaError> {
    if out.is_null() {
        return Err(E::InvalidValue);
    }
    let found = edit(EDIT_FIND, node, clone, 0).map_err(|_| E::InvalidValue)?;
    // SAFETY: not null (checked above), so writable.
    unsafe { out.write_unaligned(found) };
    Ok(())
}

/// One word of a node's, written to `out`.
///
/// # Safety
/// A non-null `out` must be writable.
unsafe fn node_word(node: u64, kind: i32, out: *mut u64) -> Result<(), CudaError> {
    if out.is_null() {
        return Err(E::InvalidValue);
    }
    let words = params_of(node, kind)?;
    // SAFETY: not null (checked above), so writable.
    unsafe { out.write_unaligned(words.get(1).copied().unwrap_or(0)) };
    Ok(())
}

/// `cudaGraphChildGraphNodeGetGraph`: the graph the node owns.
///
/// # Safety
/// A non-null `out` must be writable.
pub unsafe fn child_graph(node: u64, out: *mut u64) -> Result<(), CudaError> {
    // SAFETY: this function's contract.
    unsafe { node_word(node, NODE_GRAPH, out) }
}

/// `cudaGraphEventRecordNodeGetEvent` (`wait` false) and `cudaGraphEventWaitNodeGetEvent`.
///
/// # Safety
/// A non-null `out` must be writable.
pub unsafe fn node_event(node: u64, wait: bool, out: *mut u64) -> Result<(), CudaError> {
    // SAFETY: this function's contract.
    unsafe { node_word(node, if wait { NODE_WAIT_EVENT } else { NODE_EVENT_RECORD }, out) }
}

/// `cudaGraphNodeGetContainingGraph`.
///
/// # Safety
/// A non-null `out` must be writable.
pub unsafe fn containing_graph(node: u64, out: *mut u64) -> Result<(), CudaError> {
    if out.is_null() {
        return Err(E::InvalidValue);
    }
    let graph = *query(Q_GRAPH, node).map_err(|_| E::InvalidValue)?.first().ok_or(E::InvalidValue)?;
    // SAFETY: not null (checked above), so writable.
    unsafe { out.write_unaligned(graph) };
    Ok(())
}

/// The scratch graph, made when first needed.
fn scratch() -> Result<u64, CudaError> {
    let mut g = SCRATCH.lock().unwrap_or_else(PoisonError::into_inner);
    if *g == 0 {
        *g = runtime::call(&phos_protocol::cudart::CudaGraphCreateRequest { flags: 0 })?.pGraph;
    }
    Ok(*g)
}

/// A setter: `add` makes a node of the new parameters in the scratch graph (checked as an
/// added node is), whose work the server moves into `node` (of executable graph `exec`, when
/// not 0). A node of another type is `cudaErrorInvalidValue`.
pub(crate) fn set_from(
    exec: u64,
    node: u64,
    add: impl FnOnce(*mut u64, u64) -> Result<(), CudaError>,
) -> Result<(), CudaError> {
    let kind = query(Q_PARAMS, node).ok().and_then(|w| w.first().copied());
    if exec == 0 && kind.is_none() {
        return Err(E::InvalidValue);
    }
    let graph = scratch()?;
    let mut from = 0u64;
    add(&mut from, graph)?;
    if exec == 0 { edit(EDIT_SET, node, from, 0) } else { edit(EDIT_EXEC_SET, exec, node, from) }?;
    if exec == 0 {
        // A host source the node now names.
        let mut sources = HOST_SOURCES.lock().unwrap_or_else(PoisonError::into_inner);
        match sources.remove(&from) {
            Some(s) => sources.insert(node, s),
            None => sources.remove(&node),
        };
    }
    Ok(())
}

/// `cudaGraphEventRecordNodeSetEvent` and the wait, executable graph (`exec` not 0) forms.
pub fn set_event(exec: u64, node: u64, wait: bool, event: u64) -> Result<(), CudaError> {
    // SAFETY: a writable node handle, no dependencies.
    set_from(exec, node, |out, g| unsafe { add_event_node(out, g, std::ptr::null(), 0, event, wait) })
}

/// `cudaGraph[Exec]KernelNodeSetParams`.
///
/// # Safety
/// `p` as `cudaGraphAddKernelNode` takes it.
pub unsafe fn set_kernel(exec: u64, node: u64, p: *const c_void) -> Result<(), CudaError> {
    // SAFETY: a writable node handle, no dependencies, `p` as this function's contract gives it.
    set_from(exec, node, |out, g| unsafe { add_kernel_node(out, g, std::ptr::null(), 0, p) })
}

/// `cudaGraph[Exec]MemcpyNodeSetParams`.
///
/// # Safety
/// `p` as `cudaGraphAddMemcpyNode` takes it.
pub unsafe fn set_memcpy(exec: u64, node: u64, p: *const c_void) -> Result<(), CudaError> {
    // SAFETY: as `set_kernel`'s.
    set_from(exec, node, |out, g| unsafe { add_memcpy_node(out, g, std::ptr::null(), 0, p) })
}

/// `cudaGraph[Exec]MemcpyNodeSetParams1D`.
///
/// # Safety
/// As `cudaGraphAddMemcpyNode1D`'s.
pub unsafe fn set_memcpy_1d(
    exec: u64,
    node: u64,
    dst: *mut c_void,
    src: *const c_void,
    bytes: usize,
    kind: i32,
) -> Result<(), CudaError> {
    // SAFETY: as `set_kernel`'s.
    set_from(exec, node, |out, g| unsafe { add_memcpy_node_1d(out, g, std::ptr::null(), 0, dst, src, bytes, kind) })
}

/// `cudaGraph[Exec]MemsetNodeSetParams`.
///
/// # Safety
/// `p` as `cudaGraphAddMemsetNode` takes it.
pub unsafe fn set_memset(exec: u64, node: u64, p: *const c_void) -> Result<(), CudaError> {
    // SAFETY: as `set_kernel`'s.
    set_from(exec, node, |out, g| unsafe { add_memset_node(out, g, std::ptr::null(), 0, p) })
}

/// `cudaGraph[Exec]HostNodeSetParams`.
///
/// # Safety
/// `p` as `cudaGraphAddHostNode` takes it.
pub unsafe fn set_host(exec: u64, node: u64, p: *const c_void) -> Result<(), CudaError> {
    // SAFETY: as `set_kernel`'s.
    set_from(exec, node, |out, g| unsafe { add_host_node(out, g, std::ptr::null(), 0, p) })
}

/// `cudaGraphExecChildGraphNodeSetParams`: the child must have the node's shape.
pub fn set_exec_child(exec: u64, node: u64, child: u64) -> Result<(), CudaError> {
    // SAFETY: a writable node handle, no dependencies.
    set_from(exec, node, |out, g| unsafe { add_child_node(out, g, std::ptr::null(), 0, child) })
}

/// `cudaGraphNodeSetParams` and `cudaGraphExecNodeSetParams`.
///
/// # Safety
/// `p` as `cudaGraphAddNode` takes it.
pub unsafe fn set_with_params(exec: u64, node: u64, p: *mut c_void) -> Result<(), CudaError> {
    // SAFETY: as `set_kernel`'s.
    set_from(exec, node, |out, g| unsafe { add_node_with_params(out, g, std::ptr::null(), std::ptr::null(), 0, p) })
}

/// `cudaGraphNodeSetEnabled`.
pub fn set_enabled(exec: u64, node: u64, enabled: u32) -> Result<(), CudaError> {
    edit(EDIT_ENABLE, exec, node, u64::from(enabled != 0)).map(|_| ())
}

/// `cudaGraphNodeGetEnabled`.
///
/// # Safety
/// A non-null `out` must be writable.
pub unsafe fn get_enabled(exec: u64, node: u64, out: *mut u32) -> Result<(), CudaError> {
    if out.is_null() {
        return Err(E::InvalidValue);
    }
    let enabled = edit(EDIT_ENABLED, exec, node, 0)?;
    // SAFETY: not null (checked above), so writable.
    unsafe { out.write_unaligned(enabled as u32) };
    Ok(())
}

/// `cudaGraphExecGetFlags`.
///
/// # Safety
/// A non-null `out` must be writable.
pub unsafe fn exec_flags(exec: u64, out: *mut u64) -> Result<(), CudaError> {
    if out.is_null() {
        return Err(E::InvalidValue);
    }
    let flags = EXEC_FLAGS.lock().unwrap_or_else(PoisonError::into_inner).get(&exec).copied();
    let flags = match flags {
        Some(f) => f,
        // Made before this process's library noted it (a restored image): its handle is
        // checked, its flags are not known, as none were given.
        None => runtime::call(&PhosGraphHostNodesRequest { graphExec: exec, stream: 0, firstGate: 0, max: 0 })
            .map(|_| 0)
            .map_err(|_| E::InvalidValue)?,
    };
    // SAFETY: not null (checked above), so writable.
    unsafe { out.write_unaligned(flags) };
    Ok(())
}

/// `cudaGraphKernelNodeGetParams`: the kernel's host function, its shape and its arguments
/// (pointers into storage kept until the node is queried again).
///
/// # Safety
/// A non-null `out` must be a writable `cudaKernelNodeParams`.
pub unsafe fn kernel_params(node: u64, out: *mut c_void) -> Result<(), CudaError> {
    if out.is_null() {
        return Err(E::InvalidValue);
    }
    let w = params_of(node, NODE_KERNEL)?;
    if w.len() < 10 {
        // A library call's kernel node: its kernels are the library's.
        return Err(E::NotSupported);
    }
    let (host_fun, kernel) = crate::registry::kernel_of_remote(w[1]).ok_or(E::InvalidDeviceFunction)?;
    let layout = kernel.layout()?;
    let len = w[9] as usize;
    let bytes: Vec<u8> = w[10..].iter().flat_map(|x| x.to_ne_bytes()).take(len).collect();
    let buffer: Box<[u8]> = bytes.into_boxed_slice();
    let base = buffer.as_ptr() as usize;
    let pointers: Box<[usize]> =
        layout.params.iter().map(|&(offset, _)| base + offset.min(buffer.len())).collect::<Vec<_>>().into_boxed_slice();
    let dim = |a: u64, b: u64, c: u64| Dim3 { x: a as u32, y: b as u32, z: c as u32 };
    let k = KernelNodeParams {
        func: host_fun as *const c_void,
        grid: dim(w[2], w[3], w[4]),
        block: dim(w[5], w[6], w[7]),
        shared_mem: w[8] as u32,
        kernel_params: pointers.as_ptr() as *mut *mut c_void,
        extra: std::ptr::null_mut(),
    };
    // The boxes' heap storage does not move when they move into the map.
    KERNEL_PARAMS.lock().unwrap_or_else(PoisonError::into_inner).insert(node, (buffer, pointers));
    // SAFETY: not null (checked above): a writable `cudaKernelNodeParams` (this function's
    // contract), written without assuming alignment.
    unsafe { (out as *mut KernelNodeParams).write_unaligned(k) };
    Ok(())
}

/// `cudaGraphMemsetNodeGetParams`: in bytes (a memset node keeps a repeated byte).
///
/// # Safety
/// A non-null `out` must be a writable `cudaMemsetParams`.
pub unsafe fn memset_params(node: u64, out: *mut c_void) -> Result<(), CudaError> {
    if out.is_null() {
        return Err(E::InvalidValue);
    }
    let w = params_of(node, NODE_MEMSET)?;
    let m = MemsetParams {
        dst: w[1],
        pitch: w[2] as usize,
        value: w[3] as u32,
        element_size: 1,
        width: w[4] as usize,
        height: w[5] as usize,
    };
    // SAFETY: not null (checked above): a writable `cudaMemsetParams` (this function's
    // contract), written without assuming alignment.
    unsafe { (out as *mut MemsetParams).write_unaligned(m) };
    Ok(())
}

/// `cudaGraphHostNodeGetParams`.
///
/// # Safety
/// A non-null `out` must be a writable `cudaHostNodeParams`.
pub unsafe fn host_params(node: u64, out: *mut c_void) -> Result<(), CudaError> {
    if out.is_null() {
        return Err(E::InvalidValue);
    }
    let w = params_of(node, NODE_HOST)?;
    // SAFETY: not null (checked above): a writable `cudaHostNodeParams` (this function's
    // contract), written without assuming alignment.
    unsafe { (out as *mut HostNodeParams).write_unaligned(HostNodeParams { func: w[1], data: w[2] }) };
    Ok(())
}

/// `cudaGraphMemcpyNodeGetParams`: a copy of pitched memory, no arrays.
///
/// # Safety
/// A non-null `out` must be a writable `cudaMemcpy3DParms`.
pub unsafe fn memcpy_params(node: u64, out: *mut c_void) -> Result<(), CudaError> {
    use phos_protocol::types::{Extent, PitchedPtr};
    if out.is_null() {
        return Err(E::InvalidValue);
    }
    let w = params_of(node, NODE_MEMCPY)?;
    let [_, dst, dpitch, mut src, mut spitch, width, height, depth, dslice, mut sslice, from_host] = w[..] else {
        return Err(E::InvalidValue);
    };
    let kind = match from_host {
        0 => consts::cudaMemcpyDeviceToDevice,
        2 => consts::cudaMemcpyDeviceToHost,
        _ => consts::cudaMemcpyHostToDevice,
    };
    if from_host == 1
        && let Some(&(s, p, sl)) = HOST_SOURCES.lock().unwrap_or_else(PoisonError::into_inner).get(&node)
    {
        (src, spitch, sslice) = (s, p, sl);
    }
    let rows = |pitch: u64, slice: u64| if depth > 1 && pitch > 0 { (slice / pitch) as usize } else { height as usize };
    let p = Memcpy3DParms {
        src_array: 0,
        src_pos: Extent::default(),
        src_ptr: PitchedPtr { ptr: src, pitch: spitch as usize, xsize: width as usize, ysize: rows(spitch, sslice) },
        dst_array: 0,
        dst_pos: Extent::default(),
        dst_ptr: PitchedPtr { ptr: dst, pitch: dpitch as usize, xsize: width as usize, ysize: rows(dpitch, dslice) },
        extent: Extent { width: width as usize, height: height as usize, depth: depth as usize },
        kind,
    };
    // SAFETY: not null (checked above): a writable `cudaMemcpy3DParms` (this function's
    // contract), written without assuming alignment.
    unsafe { (out as *mut Memcpy3DParms).write_unaligned(p) };
    Ok(())
}

/// `cudaGraphDebugDotPrint`: the graph's nodes (by type) and edges as a DOT file at `path`.
///
/// # Safety
/// A non-null `path` must be a NUL-terminated string.
pub unsafe fn debug_dot_print(graph: u64, path: *const std::ffi::c_char) -> Result<(), CudaError> {
    use std::fmt::Write as _;
    if path.is_null() {
        return Err(E::InvalidValue);
    }
    // SAFETY: not null (checked above), a NUL-terminated string (this function's contract).
    let path = unsafe { std::ffi::CStr::from_ptr(path) }.to_string_lossy().into_owned();
    let mut count = 0usize;
    // SAFETY: a writable count, no array.
    unsafe { get_nodes(graph, std::ptr::null_mut(), &mut count)? };
    let mut nodes = vec![0u64; count];
    // SAFETY: room for `count` handles.
    unsafe { get_nodes(graph, nodes.as_mut_ptr(), &mut count)? };
    let names = ["kernel", "memcpy", "memset", "host", "graph", "empty", "wait_event", "event_record"];
    let mut dot = format!("digraph dot_graph_{graph:x} {{\n");
    for (i, &n) in nodes.iter().enumerate() {
        let kind = query(Q_PARAMS, n)?.first().copied().unwrap_or(u64::MAX);
        let name = names.get(kind as usize).copied().unwrap_or("node");
        let _ = writeln!(dot, "  node_{n:x} [label=\"{i}: {name}\"];");
    }
    let edges = query(Q_EDGES, graph)?;
    for pair in edges.chunks_exact(2) {
        let _ = writeln!(dot, "  node_{:x} -> node_{:x};", pair[0], pair[1]);
    }
    dot.push_str("}\n");
    std::fs::write(&path, dot).map_err(|_| E::OperatingSystem)
}

/// The size of a `cudaGraphNodeParams` (CUDA 12.2 to 13): the type and three reserved words,
/// the parameters' union of 29 words and a reserved word.
const NODE_PARAMS_SIZE: usize = 256;

/// `cudaGraphNodeGetParams`: the node's type and its parameters as each type's own getter
/// answers them, in the `cudaGraphNodeParams` at `out` (zeroed first: its reserved words and
/// the fields Phos does not keep, such as CUDA 13's execution contexts, are 0). A captured
/// library call's kernel node is `cudaErrorNotSupported` (its kernels are the library's).
///
/// # Safety
/// A non-null `out` must be a writable `cudaGraphNodeParams`.
pub unsafe fn node_params(node: u64, out: *mut c_void) -> Result<(), CudaError> {
    if out.is_null() {
        return Err(E::InvalidValue);
    }
    let kind = node_type(node)?;
    let base = out as *mut u8;
    // SAFETY: a writable `cudaGraphNodeParams` at the non-null `out` (this function's
    // contract): its 256 bytes.
    unsafe { std::ptr::write_bytes(base, 0, NODE_PARAMS_SIZE) };
    // SAFETY: its type first, written without assuming alignment.
    unsafe { (base as *mut i32).write_unaligned(kind) };
    // SAFETY: within the `cudaGraphNodeParams`: its parameters' union.
    let params = unsafe { base.add(NODE_PARAMS_AT) } as *mut c_void;
    // Each call below writes the union's member of the node's type, which lies within it (at
    // most 29 words): a writable struct of what the type's own getter takes.
    match kind {
        NODE_KERNEL => {
            if query(Q_PARAMS, node).map_err(|_| E::InvalidValue)?.len() < 10 {
                crate::log::not_supported_once(
                    "cudaGraphNodeGetParams of a library call's kernel node",
                    "cudaErrorNotSupported",
                );
                return Err(E::NotSupported);
            }
            // SAFETY: as above (`cudaKernelNodeParamsV2` begins as `cudaKernelNodeParams`).
            unsafe { kernel_params(node, params) }
        }
        NODE_MEMCPY => {
            // SAFETY: within the union: the `cudaMemcpyNodeParams`' `copyParams`.
            let copy = unsafe { (params as *mut u8).add(COPY_PARAMS_AT) };
            // SAFETY: as above.
            unsafe { memcpy_params(node, copy as *mut c_void) }
        }
        // SAFETY: as above (`cudaMemsetParamsV2` begins as `cudaMemsetParams`).
        NODE_MEMSET => unsafe { memset_params(node, params) },
        // SAFETY: as above (`cudaHostNodeParamsV2` begins as `cudaHostNodeParams`).
        NODE_HOST => unsafe { host_params(node, params) },
        // SAFETY: as above: `cudaChildGraphNodeParams`' graph (ownership 0: a clone).
        NODE_GRAPH => unsafe { child_graph(node, params as *mut u64) },
        NODE_EMPTY => Ok(()),
        // SAFETY: as above: `cudaEventWaitNodeParams`' event.
        NODE_WAIT_EVENT => unsafe { node_event(node, true, params as *mut u64) },
        // SAFETY: as above: `cudaEventRecordNodeParams`' event.
        NODE_EVENT_RECORD => unsafe { node_event(node, false, params as *mut u64) },
        // SAFETY: as above: `cudaMemAllocNodeParamsV2`, laid out as `cudaMemAllocNodeParams`.
        NODE_MEM_ALLOC => unsafe { mem_alloc_params(node, params) },
        // SAFETY: as above: `cudaMemFreeNodeParams`' address.
        NODE_MEM_FREE => unsafe { mem_free_params(node, params) },
        // SAFETY: as above: a `cudaConditionalNodeParams`.
        NODE_CONDITIONAL => unsafe { conditional_params(node, params as *mut u8) },
        _ => {
            crate::log::not_supported_once(
                &format!("cudaGraphNodeGetParams of node type {kind}"),
                "cudaErrorNotSupported",
            );
            Err(E::NotSupported)
        }
    }
}

/// A node's `cudaGraphNodeType` (`cudaErrorInvalidValue` for a handle that is not a node).
pub(crate) fn node_type(node: u64) -> Result<i32, CudaError> {
    let request = phos_protocol::cudart::CudaGraphNodeGetTypeRequest { node };
    runtime::call(&request).map(|r| r.pType).map_err(|_| E::InvalidValue)
}
