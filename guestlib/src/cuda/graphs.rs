//! Graphs and stream capture through the driver API. A `CUgraph`, `CUgraphExec` and
//! `CUgraphNode` are the runtime's handles (a graph made with either API is used with the
//! other, as CUDA documents), so most driver functions run the runtime's own code
//! (guestlib/src/cudart/graphs.rs) through [`super::bridge`]. What differs is here: kernel
//! nodes name a `CUfunction` and take the driver's parameter forms, copy nodes a
//! `CUDA_MEMCPY3D`, and the functions whose runtime twins change their parameters between
//! CUDA versions have one fixed form each in the driver (`_v2` and so on are separate exports).

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Mutex, PoisonError};

use phos_protocol::cuda::CuError;
use phos_protocol::cudart::{PhosGraphAddKernelNodeRequest, PhosGraphExecUpdateRequest};
use phos_protocol::types::Dim3;

use super::bridge::from_runtime;
use super::{arrays, modules};
use crate::cudart::graphs;
use crate::runtime;

/// `CUDA_KERNEL_NODE_PARAMS_v1`; `_v2` (CUDA 12's `CUDA_KERNEL_NODE_PARAMS`) adds `CUkernel
/// kern` and `CUcontext ctx` after it.
#[repr(C)]
#[derive(Clone, Copy)]
struct KernelNodeParams {
    func: u64,
    grid: Dim3,
    block: Dim3,
    shared_mem: u32,
    kernel_params: *mut *mut c_void,
    extra: *mut *mut c_void,
}

/// Where `_v2`'s `kern` is (`ctx` follows it).
const KERN_AT: usize = std::mem::size_of::<KernelNodeParams>();

/// Argument buffers and pointer arrays handed out by `cuGraphKernelNodeGetParams`, kept per
/// node until it is queried again (CUDA keeps them as long as the node).
type KeptParams = (Box<[u8]>, Box<[usize]>);
static KERNEL_PARAMS: Mutex<Option<HashMap<u64, KeptParams>>> = Mutex::new(None);

/// A kernel node's function (the server's handle), shape and packed arguments, from the
/// driver's parameters.
struct KernelNode {
    function: u64,
    grid: Dim3,
    block: Dim3,
    shared_mem: u32,
    params: Vec<u8>,
}

/// Read and pack a `CUDA_KERNEL_NODE_PARAMS` (`v2`: the CUDA 12 struct).
///
/// # Safety
/// `p` null or a readable struct of that form, whose `kernelParams` or `extra` are what
/// `cuLaunchKernel` takes.
unsafe fn kernel_node(p: *const c_void, v2: bool) -> Result<KernelNode, CuError> {
    if p.is_null() {
        return Err(CuError::INVALID_VALUE);
    }
    // SAFETY: not null (checked above): the struct (this function's contract), read without
    // assuming alignment; its pointers are only copied.
    let k = unsafe { (p as *const KernelNodeParams).read_unaligned() };
    if k.func == 0 {
        if v2 {
            // SAFETY: within the `_v2` struct (this function's contract): its `kern`.
            let at = unsafe { (p as *const u8).add(KERN_AT) };
            // SAFETY: a readable word there, read without assuming alignment.
            let kern = unsafe { at.cast::<u64>().read_unaligned() };
            if kern != 0 {
                // CUkernel (cuLibraryGetKernel) is not carried.
                crate::log::not_supported_once("a CUkernel in a kernel node", "CUDA_ERROR_NOT_SUPPORTED");
                return Err(CuError::NOT_SUPPORTED);
            }
        }
        return Err(CuError::INVALID_VALUE);
    }
    // `_v2`'s `ctx` is ignored when `func` is set, as in CUDA.
    if [k.grid.x, k.grid.y, k.grid.z, k.block.x, k.block.y, k.block.z].contains(&0) {
        return Err(CuError::INVALID_VALUE);
    }
    let (function, layout) = modules::known(k.func)?;
    // SAFETY: the parameter forms as this function's contract gives them.
    let params = unsafe { modules::parameters(&layout, k.kernel_params, k.extra)? };
    Ok(KernelNode { function, grid: k.grid, block: k.block, shared_mem: k.shared_mem, params })
}

/// Add the kernel node `k` to `graph` after `deps`.
///
/// # Safety
/// As `cudart::graphs::add_node`.
unsafe fn add_kernel_node(
    out: *mut u64,
    graph: u64,
    deps: *const u64,
    count: usize,
    k: &KernelNode,
) -> Result<(), phos_protocol::CudaError> {
    // SAFETY: `out` and `deps` as this function's contract gives them.
    unsafe {
        graphs::add_node(out, deps, count, |deps| {
            let request = PhosGraphAddKernelNodeRequest {
                graph,
                deps,
                numDeps: count as u64,
                function: k.function,
                grid: k.grid,
                block: k.block,
                sharedMem: k.shared_mem,
                params: &k.params,
                paramSize: k.params.len() as u64,
            };
            Ok(runtime::call(&request)?.pGraphNode)
        })
    }
}

/// `cuGraphAddKernelNode` (`v2`: `_v2`).
///
/// # Safety
/// What `cuGraphAddKernelNode` asks of its caller.
pub unsafe fn add_kernel(
    out: *mut u64,
    graph: u64,
    deps: *const u64,
    count: usize,
    p: *const c_void,
    v2: bool,
) -> Result<(), CuError> {
    if out.is_null() {
        return Err(CuError::INVALID_VALUE);
    }
    // SAFETY: `p` as this function's contract gives it.
    let k = unsafe { kernel_node(p, v2)? };
    // SAFETY: `out` and `deps` as this function's contract gives them.
    from_runtime(unsafe { add_kernel_node(out, graph, deps, count, &k) })
}

/// `cuGraph[Exec]KernelNodeSetParams[_v2]`: `exec` 0 sets the graph's node.
///
/// # Safety
/// `p` as `cuGraphAddKernelNode` takes it.
pub unsafe fn set_kernel(exec: u64, node: u64, p: *const c_void, v2: bool) -> Result<(), CuError> {
    // SAFETY: `p` as this function's contract gives it.
    let k = unsafe { kernel_node(p, v2)? };
    // SAFETY: a writable node handle, no dependencies.
    from_runtime(graphs::set_from(exec, node, |out, g| unsafe { add_kernel_node(out, g, std::ptr::null(), 0, &k) }))
}

/// `cuGraphKernelNodeGetParams[_v2]`: the node's function as the program knows it, its shape
/// and its arguments (pointers into storage kept until the node is queried again).
///
/// # Safety
/// `out` null or a writable `CUDA_KERNEL_NODE_PARAMS` of the form `v2` says.
pub unsafe fn kernel_params(node: u64, out: *mut c_void, v2: bool) -> Result<(), CuError> {
    if out.is_null() {
        return Err(CuError::INVALID_VALUE);
    }
    let w = from_runtime(graphs::params_of(node, graphs::NODE_KERNEL))?;
    if w.len() < 10 {
        // A library call's kernel node: its kernels are the library's.
        return Err(CuError::NOT_SUPPORTED);
    }
    let (func, layout) = modules::of_server(w[1])?;
    let len = w[9] as usize;
    let buffer: Box<[u8]> = w[10..].iter().flat_map(|x| x.to_ne_bytes()).take(len).collect();
    let base = buffer.as_ptr() as usize;
    let pointers: Box<[usize]> = layout.params.iter().map(|&(offset, _)| base + offset.min(buffer.len())).collect();
    let dim = |a: u64, b: u64, c: u64| Dim3 { x: a as u32, y: b as u32, z: c as u32 };
    let k = KernelNodeParams {
        func,
        grid: dim(w[2], w[3], w[4]),
        block: dim(w[5], w[6], w[7]),
        shared_mem: w[8] as u32,
        kernel_params: pointers.as_ptr() as *mut *mut c_void,
        extra: std::ptr::null_mut(),
    };
    // The boxes' heap storage does not move when they move into the map.
    KERNEL_PARAMS
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .get_or_insert_with(HashMap::new)
        .insert(node, (buffer, pointers));
    // SAFETY: not null (checked above): a writable struct (this function's contract), written
    // without assuming alignment.
    unsafe { (out as *mut KernelNodeParams).write_unaligned(k) };
    if v2 {
        // SAFETY: within the writable `_v2` struct: `kern` and `ctx`.
        let at = unsafe { (out as *mut u8).add(KERN_AT) };
        // SAFETY: two writable words there (none: a function is set), written without assuming
        // alignment.
        unsafe { at.cast::<[u64; 2]>().write_unaligned([0, 0]) };
    }
    Ok(())
}

/// `cuGraphAddMemcpyNode`: a copy to or on the device between linear memory (a host source is
/// read now and kept in the node, as for the runtime's copy nodes).
///
/// # Safety
/// What `cuGraphAddMemcpyNode` asks of its caller.
pub unsafe fn add_memcpy(
    out: *mut u64,
    graph: u64,
    deps: *const u64,
    count: usize,
    p: *const c_void,
) -> Result<(), CuError> {
    // SAFETY: `p` as this function's contract gives it.
    let c = unsafe { arrays::graph_copy(p)? };
    let (src, dst, extent, kind) = c;
    // SAFETY: `out`, `deps` and a host source readable for the copy (this function's contract).
    from_runtime(unsafe {
        graphs::copy_node(
            out,
            graph,
            deps,
            count,
            (dst.addr, dst.pitch, dst.slice),
            (src.addr, src.pitch, src.slice),
            extent,
            kind,
        )
    })?;
    // SAFETY: `out` written by the runtime (the call succeeded).
    let node = unsafe { out.read_unaligned() };
    // SAFETY: `p` read above.
    unsafe { keep_given(node, p, &c) };
    Ok(())
}

/// The `CUDA_MEMCPY3D` each copy node made or set through the driver was given, and the copy
/// it came to (source, destination, extent): `cuGraphMemcpyNodeGetParams` answers it as given
/// while the node still makes that copy (a runtime setter may have changed it since).
type GivenCopy = (arrays::Memcpy3DBytes, [u64; 5]);
static GIVEN_COPIES: Mutex<Option<HashMap<u64, GivenCopy>>> = Mutex::new(None);

fn copy_key(c: &arrays::GraphCopy) -> [u64; 5] {
    let (src, dst, (w, h, d), _) = c;
    [src.addr, dst.addr, *w, *h, *d]
}

/// Keep the `CUDA_MEMCPY3D` at `p` that made (or set) the copy `c` of `node`.
///
/// # Safety
/// `p` a readable `CUDA_MEMCPY3D`.
unsafe fn keep_given(node: u64, p: *const c_void, c: &arrays::GraphCopy) {
    // SAFETY: `p` as this function's contract gives it.
    let bytes = unsafe { arrays::copy_bytes(p) };
    let mut given = GIVEN_COPIES.lock().unwrap_or_else(PoisonError::into_inner);
    given.get_or_insert_with(HashMap::new).insert(node, (bytes, copy_key(c)));
}

/// `cuGraphMemcpyNodeGetParams`: the copy node's `CUDA_MEMCPY3D`, as the driver was given it,
/// or (a node made or changed through the runtime) as the runtime describes it.
///
/// # Safety
/// `out` null or a writable `CUDA_MEMCPY3D`.
pub unsafe fn memcpy_params(node: u64, out: *mut c_void) -> Result<(), CuError> {
    if out.is_null() {
        return Err(CuError::INVALID_VALUE);
    }
    // SAFETY: `cudaMemcpy3DParms` is plain integers, for which zero is a value.
    let mut p: crate::cudart::memory::Memcpy3DParms = unsafe { std::mem::zeroed() };
    // SAFETY: a writable `cudaMemcpy3DParms`, local.
    from_runtime(unsafe { graphs::memcpy_params(node, (&mut p as *mut crate::cudart::memory::Memcpy3DParms).cast()) })?;
    let now = [p.src_ptr.ptr, p.dst_ptr.ptr, p.extent.width as u64, p.extent.height as u64, p.extent.depth as u64];
    let given =
        GIVEN_COPIES.lock().unwrap_or_else(PoisonError::into_inner).as_ref().and_then(|g| g.get(&node).copied());
    match given {
        Some((bytes, key)) if key == now => {
            // SAFETY: a writable `CUDA_MEMCPY3D` at the non-null `out` (this function's
            // contract), written unaligned.
            unsafe { (out as *mut arrays::Memcpy3DBytes).write_unaligned(bytes) };
        }
        // SAFETY: as above.
        _ => unsafe { arrays::write_linear_copy(out, &p) },
    }
    Ok(())
}

/// `cuGraphMemcpyNodeSetParams` (`exec` 0) and `cuGraphExecMemcpyNodeSetParams`: the new copy
/// is checked as `cuGraphAddMemcpyNode` checks it.
///
/// # Safety
/// `p` null or a `CUDA_MEMCPY3D` as `cuGraphAddMemcpyNode` takes it.
pub unsafe fn set_memcpy(exec: u64, node: u64, p: *const c_void) -> Result<(), CuError> {
    // SAFETY: `p` as this function's contract gives it.
    let c = unsafe { arrays::graph_copy(p)? };
    let (src, dst, extent, kind) = c;
    let (s, d) = ((src.addr, src.pitch, src.slice), (dst.addr, dst.pitch, dst.slice));
    // SAFETY: a writable node handle, no dependencies; a host source readable for the copy
    // (this function's contract).
    from_runtime(graphs::set_from(exec, node, |out, g| unsafe {
        graphs::copy_node(out, g, std::ptr::null(), 0, d, s, extent, kind)
    }))?;
    if exec == 0 {
        // SAFETY: `p` read above.
        unsafe { keep_given(node, p, &c) };
    }
    Ok(())
}

/// `cuGraphExecUpdate` (CUDA 11: the error node and the result through two out parameters;
/// `info` null) and `cuGraphExecUpdate_v2` (a `CUgraphExecUpdateResultInfo`).
///
/// # Safety
/// The out pointers as the form's signature says, writable.
pub unsafe fn exec_update(
    exec: u64,
    graph: u64,
    info: *mut c_void,
    error_node: *mut u64,
    result: *mut i32,
) -> Result<(), CuError> {
    let v2 = !info.is_null();
    if !v2 && (error_node.is_null() || result.is_null()) {
        return Err(CuError::INVALID_VALUE);
    }
    let reply = from_runtime(runtime::call(&PhosGraphExecUpdateRequest { hGraphExec: exec, hGraph: graph }))?;
    if v2 {
        let mut bytes = [0u8; 24];
        bytes[0..4].copy_from_slice(&reply.result.to_ne_bytes());
        // SAFETY: not null: a writable `CUgraphExecUpdateResultInfo` of 24 bytes (result,
        // error node, error-from node; this function's contract).
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), info as *mut u8, 24) };
    } else {
        // SAFETY: not null (checked above), writable (this function's contract).
        unsafe { error_node.write_unaligned(0) };
        // SAFETY: not null (checked above), writable (this function's contract).
        unsafe { result.write_unaligned(reply.result) };
    }
    if reply.result == 0 { Ok(()) } else { Err(CuError::GRAPH_EXEC_UPDATE_FAILURE) }
}

/// `cuStreamGetCaptureInfo` and its `_v2`/`_v3` forms: the runtime's (a `CUgraph` and
/// `CUgraphNode` are the runtime's handles).
///
/// # Safety
/// Non-null out pointers must be writable.
pub unsafe fn capture_info(
    stream: u64,
    status: *mut i32,
    id: *mut u64,
    graph: *mut *mut c_void,
    deps: *mut *const *mut c_void,
    edges: *mut *const c_void,
    count: *mut usize,
) -> Result<(), CuError> {
    let stream = stream as usize as *mut c_void;
    // SAFETY: the out pointers as this function's contract gives them.
    from_runtime(unsafe { graphs::capture_info(stream, status, id, graph.cast(), deps.cast(), edges.cast(), count) })
}

/// `cuStreamBeginCaptureToGraph`: the runtime's.
///
/// # Safety
/// A non-null `deps` must hold `count` handles; a non-null `edges` `count` edge data.
pub unsafe fn begin_capture_to_graph(
    stream: *mut c_void,
    graph: *mut c_void,
    deps: *const *mut c_void,
    edges: *const c_void,
    count: usize,
    mode: i32,
) -> Result<(), CuError> {
    // SAFETY: as this function's contract gives them.
    from_runtime(unsafe { graphs::begin_capture_to_graph(stream, graph, deps.cast(), edges.cast(), count, mode) })
}

/// `cuStreamUpdateCaptureDependencies` (and `_v2`): the runtime's.
///
/// # Safety
/// A non-null `deps` must hold `count` handles; a non-null `edges` `count` edge data.
pub unsafe fn update_capture_dependencies(
    stream: u64,
    deps: *const *mut c_void,
    edges: *const c_void,
    count: usize,
    flags: u32,
) -> Result<(), CuError> {
    let stream = stream as usize as *mut c_void;
    // SAFETY: as this function's contract gives them.
    from_runtime(unsafe { graphs::update_capture_dependencies(stream, deps.cast(), edges.cast(), count, flags) })
}

/// Where the parameters start in a `CUgraphNodeParams` (after the type and reserved words),
/// and a `CUDA_MEMCPY_NODE_PARAMS`' `copyParams` (after flags, reserved and the context).
const NODE_PARAMS_AT: usize = 16;
const COPY_PARAMS_AT: usize = 16;
/// `CUgraphNodeType`s whose parameters are the driver's own.
const NODE_KERNEL: i32 = 0;
const NODE_MEMCPY: i32 = 1;

/// A `CUgraphNodeParams` read: the node types whose parameters differ from the runtime's
/// `cudaGraphNodeParams` (a kernel node's `CUfunction`, a copy node's `CUDA_MEMCPY3D`), or
/// one the runtime's `cudaGraphAddNode` takes as it is (the other structs are laid out alike).
enum NodeParams {
    Kernel(KernelNode),
    Copy(arrays::GraphCopy),
    Runtime,
}

/// # Safety
/// `p` null or a readable `CUgraphNodeParams` whose pointers are what its node type's
/// `cuGraphAdd*Node` takes.
unsafe fn node_params(p: *const c_void) -> Result<NodeParams, CuError> {
    if p.is_null() {
        return Err(CuError::INVALID_VALUE);
    }
    // SAFETY: a `CUgraphNodeParams` at the non-null `p` (this function's contract): its type
    // first, read without assuming alignment.
    let kind = unsafe { (p as *const i32).read_unaligned() };
    // SAFETY: within the `CUgraphNodeParams`: its parameters' union.
    let params = unsafe { (p as *const u8).add(NODE_PARAMS_AT) };
    match kind {
        // SAFETY: the union holds a `CUDA_KERNEL_NODE_PARAMS_v3`, laid out as `_v2`.
        NODE_KERNEL => Ok(NodeParams::Kernel(unsafe { kernel_node(params.cast(), true)? })),
        NODE_MEMCPY => {
            // SAFETY: the union holds a `CUDA_MEMCPY_NODE_PARAMS`: its `flags` first.
            if unsafe { params.cast::<i32>().read_unaligned() } != 0 {
                return Err(CuError::INVALID_VALUE);
            }
            // SAFETY: within the union: the `CUDA_MEMCPY_NODE_PARAMS`' `copyParams`.
            let copy = unsafe { params.add(COPY_PARAMS_AT) };
            // SAFETY: a readable `CUDA_MEMCPY3D` there.
            Ok(NodeParams::Copy(unsafe { arrays::graph_copy(copy.cast())? }))
        }
        _ => Ok(NodeParams::Runtime),
    }
}

/// Add the node `n` read from the `CUgraphNodeParams` at `p`.
///
/// # Safety
/// As `cudart::graphs::add_node`; `p` as [`node_params`] read it.
unsafe fn add_params_node(
    out: *mut u64,
    graph: u64,
    deps: *const u64,
    count: usize,
    n: &NodeParams,
    p: *mut c_void,
) -> Result<(), phos_protocol::CudaError> {
    // Each call: `out`, `deps` and the parameters as this function's contract gives them.
    match n {
        // SAFETY: as above.
        NodeParams::Kernel(k) => unsafe { add_kernel_node(out, graph, deps, count, k) },
        NodeParams::Copy((src, dst, extent, kind)) => {
            let (s, d) = ((src.addr, src.pitch, src.slice), (dst.addr, dst.pitch, dst.slice));
            // SAFETY: as above; a host source readable for the copy.
            unsafe { graphs::copy_node(out, graph, deps, count, d, s, *extent, *kind) }
        }
        // SAFETY: as above: the runtime reads its own struct, laid out as the driver's.
        NodeParams::Runtime => unsafe { graphs::add_node_with_params(out, graph, deps, std::ptr::null(), count, p) },
    }
}

/// `cuGraphAddNode` and `_v2`: a node of any type this library carries, from a
/// `CUgraphNodeParams`. Edge data must be absent or all default (zero).
///
/// # Safety
/// What `cuGraphAddNode_v2` asks of its caller (a non-null `edges` holds `count` 8-byte
/// `CUgraphEdgeData`).
pub unsafe fn add_node(
    out: *mut u64,
    graph: u64,
    deps: *const u64,
    edges: *const u8,
    count: usize,
    p: *mut c_void,
) -> Result<(), CuError> {
    if out.is_null() {
        return Err(CuError::INVALID_VALUE);
    }
    if !edges.is_null() && count > 0 {
        if count > 1 << 20 {
            return Err(CuError::INVALID_VALUE);
        }
        // SAFETY: `count` edge data of 8 bytes each at a non-null `edges` (this function's
        // contract).
        if unsafe { std::slice::from_raw_parts(edges, count * 8) }.iter().any(|&b| b != 0) {
            crate::log::not_supported_once(
                "cuGraphAddNode with edge data (ports, edge types)",
                "CUDA_ERROR_NOT_SUPPORTED",
            );
            return Err(CuError::NOT_SUPPORTED);
        }
    }
    // SAFETY: `p` as this function's contract gives it.
    let n = unsafe { node_params(p)? };
    // SAFETY: `out`, `deps` and `p` as this function's contract gives them.
    from_runtime(unsafe { add_params_node(out, graph, deps, count, &n, p) })?;
    // SAFETY: `out` written by the runtime (the call succeeded).
    let node = unsafe { out.read_unaligned() };
    // SAFETY: `p` read above.
    unsafe { keep_given_params(node, &n, p) };
    Ok(())
}

/// Keep a copy node's `CUDA_MEMCPY3D` from the `CUgraphNodeParams` at `p` that made or set it.
///
/// # Safety
/// `p` as [`node_params`] read it into `n`.
unsafe fn keep_given_params(node: u64, n: &NodeParams, p: *const c_void) {
    if let NodeParams::Copy(c) = n {
        // SAFETY: within the `CUgraphNodeParams` read into `n`: its `CUDA_MEMCPY3D`.
        let copy = unsafe { (p as *const u8).add(NODE_PARAMS_AT + COPY_PARAMS_AT) };
        // SAFETY: a readable `CUDA_MEMCPY3D` there.
        unsafe { keep_given(node, copy.cast(), c) };
    }
}

/// `cuGraphNodeSetParams` (`exec` 0) and `cuGraphExecNodeSetParams`.
///
/// # Safety
/// `p` as `cuGraphAddNode` takes it.
pub unsafe fn set_with_params(exec: u64, node: u64, p: *mut c_void) -> Result<(), CuError> {
    // SAFETY: `p` as this function's contract gives it.
    let n = unsafe { node_params(p)? };
    // SAFETY: a writable node handle, no dependencies, `p` as this function's contract gives it.
    from_runtime(graphs::set_from(exec, node, |out, g| unsafe {
        add_params_node(out, g, std::ptr::null(), 0, &n, p)
    }))?;
    if exec == 0 {
        // SAFETY: `p` read above.
        unsafe { keep_given_params(node, &n, p) };
    }
    Ok(())
}

/// The size of a `CUgraphNodeParams`: the type and three reserved words, the parameters'
/// union of 29 words and a reserved word.
const NODE_PARAMS_SIZE: usize = 256;

/// `cuGraphNodeGetParams`: the node's type and parameters in the `CUgraphNodeParams` at `out`.
/// A kernel node answers its `CUDA_KERNEL_NODE_PARAMS_v3` as `cuGraphKernelNodeGetParams_v2`
/// does, a copy node its `CUDA_MEMCPY3D` as `cuGraphMemcpyNodeGetParams` does; the other types'
/// structs are the runtime's (`cudaGraphNodeGetParams`).
///
/// # Safety
/// `out` null or a writable `CUgraphNodeParams`.
pub unsafe fn get_node_params(node: u64, out: *mut c_void) -> Result<(), CuError> {
    if out.is_null() {
        return Err(CuError::INVALID_VALUE);
    }
    match from_runtime(graphs::node_type(node))? {
        NODE_KERNEL => {
            let base = out as *mut u8;
            // SAFETY: a writable `CUgraphNodeParams` at the non-null `out` (this function's
            // contract): its 256 bytes.
            unsafe { std::ptr::write_bytes(base, 0, NODE_PARAMS_SIZE) };
            // SAFETY: its type first, written without assuming alignment.
            unsafe { (base as *mut i32).write_unaligned(NODE_KERNEL) };
            // SAFETY: within the struct: its union.
            let params = unsafe { base.add(NODE_PARAMS_AT) };
            // SAFETY: the union holds a `CUDA_KERNEL_NODE_PARAMS_v3`, laid out as `_v2`.
            unsafe { kernel_params(node, params.cast(), true) }
        }
        NODE_MEMCPY => {
            let base = out as *mut u8;
            // SAFETY: a writable `CUgraphNodeParams` at the non-null `out` (this function's
            // contract): its 256 bytes.
            unsafe { std::ptr::write_bytes(base, 0, NODE_PARAMS_SIZE) };
            // SAFETY: its type first, written without assuming alignment.
            unsafe { (base as *mut i32).write_unaligned(NODE_MEMCPY) };
            // SAFETY: within the struct: the union's `CUDA_MEMCPY_NODE_PARAMS`, whose flags stay 0
            // and whose context is the current one (the device's: contexts share it).
            let params = unsafe { base.add(NODE_PARAMS_AT) };
            let ctx = super::context::current().unwrap_or(0);
            // SAFETY: within the union: its `copyCtx`, after two ints.
            let at_ctx = unsafe { params.add(8) };
            // SAFETY: a word's room there, written unaligned.
            unsafe { at_ctx.cast::<u64>().write_unaligned(ctx) };
            // SAFETY: within the union: its `copyParams`.
            let copy = unsafe { params.add(COPY_PARAMS_AT) };
            // SAFETY: a writable `CUDA_MEMCPY3D` there.
            unsafe { memcpy_params(node, copy.cast()) }
        }
        // SAFETY: `out` as this function's contract gives it: the runtime's struct, laid out
        // as the driver's for these types.
        _ => from_runtime(unsafe { graphs::node_params(node, out) }),
    }
}
