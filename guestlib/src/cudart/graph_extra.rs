//! Graph calls composed over the others of graphs.rs: instantiation with a
//! `cudaGraphInstantiateParams` (CUDA 12), the copy-node setters to and from `__device__`
//! symbols, and CUDA 13's ids of graphs, executable graphs and nodes.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Mutex, PoisonError};

use phos_protocol::CudaError;
use phos_protocol::CudaError as E;
use phos_protocol::cudart::consts;

use super::graphs;

/// `cudaGraphInstantiateFlagUpload`: upload to the parameters' stream after instantiating.
const UPLOAD: u64 = 0x2;

/// `cudaGraphInstantiateResult` values.
const RESULT_SUCCESS: i32 = 0;
const RESULT_ERROR: i32 = 1;

/// `struct cudaGraphInstantiateParams` (CUDA 12 and 13): flags, upload stream, error node
/// (out), result (out).
#[repr(C)]
#[derive(Clone, Copy)]
struct InstantiateParams {
    flags: u64,
    upload_stream: u64,
    err_node_out: u64,
    result_out: i32,
}

/// `cudaGraphInstantiateWithParams`: [`graphs::instantiate`] with the parameters' flags, then
/// (`cudaGraphInstantiateFlagUpload`) an upload to their stream; the result and the error
/// node are written back as CUDA writes them (success and no node, or
/// `cudaGraphInstantiateError` with the status saying why; no failure of instantiation is a
/// single node's in Phos, so the node stays null).
///
/// # Safety
/// A non-null `exec` must be writable; a non-null `params` a writable
/// `cudaGraphInstantiateParams`. `per_thread`: the `_ptsz` entry point's (a null upload
/// stream is the thread's default stream).
pub unsafe fn instantiate_with_params(
    exec: *mut *mut c_void,
    graph: *mut c_void,
    params: *mut c_void,
    per_thread: bool,
) -> Result<(), CudaError> {
    if params.is_null() {
        return Err(E::InvalidValue);
    }
    let p = params as *mut InstantiateParams;
    // SAFETY: not null (checked above): a `cudaGraphInstantiateParams` (this function's
    // contract), read without assuming alignment.
    let mut given = unsafe { p.read_unaligned() };
    // SAFETY: `exec` as this function's contract gives it.
    // The upload is this call's, not a flag the executable graph keeps (cudaGraphExecGetFlags
    // does not answer it).
    let mut r = unsafe { graphs::instantiate(exec, graph, given.flags & !UPLOAD) };
    if r.is_ok() && given.flags & UPLOAD != 0 {
        // SAFETY: `exec` was written by the instantiation just above.
        let made = unsafe { exec.read() };
        let stream = match given.upload_stream {
            0 if per_thread => consts::cudaStreamPerThread,
            s => s,
        };
        // SAFETY: an executable graph and a stream handle, passed by value.
        let code = unsafe { super::stubs::cudaGraphUpload(made, stream as usize as *mut c_void) };
        if code != phos_protocol::cudart::SUCCESS {
            r = Err(CudaError(code));
        }
    }
    given.err_node_out = 0;
    // A failure is the call's own (its status says what it was): Phos refuses no instantiation
    // for a graph's structure or one node's operation.
    given.result_out = if r.is_ok() { RESULT_SUCCESS } else { RESULT_ERROR };
    // SAFETY: not null, writable (this function's contract).
    unsafe { p.write_unaligned(given) };
    r
}

/// `cudaGraph[Exec]MemcpyNodeSetParamsToSymbol`: the node becomes a copy of `bytes` from
/// `src` to the variable's device memory at `offset` (what the node adder of the same name
/// makes).
///
/// # Safety
/// `src` must be readable for `bytes` bytes where it is host memory.
pub unsafe fn set_memcpy_to_symbol(
    exec: u64,
    node: u64,
    symbol: *const c_void,
    src: *const c_void,
    bytes: usize,
    offset: usize,
    kind: i32,
) -> Result<(), CudaError> {
    if ![consts::cudaMemcpyHostToDevice, consts::cudaMemcpyDeviceToDevice, consts::cudaMemcpyDefault].contains(&kind) {
        return Err(E::InvalidMemcpyDirection);
    }
    let dst = graphs::symbol_range(symbol, bytes, offset)?;
    // SAFETY: `src` as this function's contract gives it; the destination is device memory.
    unsafe { graphs::set_memcpy_1d(exec, node, dst as usize as *mut c_void, src, bytes, kind) }
}

/// `cudaGraph[Exec]MemcpyNodeSetParamsFromSymbol`: a copy from the variable's device memory
/// (to device memory: a node writing to the host is not carried).
///
/// # Safety
/// `dst` must be writable for `bytes` bytes where it is host memory.
pub unsafe fn set_memcpy_from_symbol(
    exec: u64,
    node: u64,
    dst: *mut c_void,
    symbol: *const c_void,
    bytes: usize,
    offset: usize,
    kind: i32,
) -> Result<(), CudaError> {
    if ![consts::cudaMemcpyDeviceToHost, consts::cudaMemcpyDeviceToDevice, consts::cudaMemcpyDefault].contains(&kind) {
        return Err(E::InvalidMemcpyDirection);
    }
    let src = graphs::symbol_range(symbol, bytes, offset)?;
    // SAFETY: `dst` as this function's contract gives it; the source is device memory.
    unsafe { graphs::set_memcpy_1d(exec, node, dst, src as usize as *const c_void, bytes, kind) }
}

/// The ids handed out: graphs and executable graphs draw from one counter (a graph's id and
/// an executable graph's never meet), nodes from their graph's. Handles are never given
/// twice in a process, so an id keyed by its handle is the object's for its life.
#[derive(Default)]
struct Ids {
    next: u32,
    objects: HashMap<u64, u32>,
    /// Per graph: the next local id and each node's.
    nodes: HashMap<u64, (u32, HashMap<u64, u32>)>,
}

static IDS: Mutex<Option<Ids>> = Mutex::new(None);

fn with_ids<T>(f: impl FnOnce(&mut Ids) -> T) -> T {
    let mut g = IDS.lock().unwrap_or_else(PoisonError::into_inner);
    f(g.get_or_insert_with(Ids::default))
}

fn object_id(handle: u64) -> u32 {
    with_ids(|ids| {
        *ids.objects.entry(handle).or_insert_with(|| {
            ids.next += 1;
            ids.next
        })
    })
}

/// The nodes of `graph` in the order they were added (what `cudaGraphGetNodes` answers).
fn nodes_of(graph: u64) -> Result<Vec<u64>, CudaError> {
    let mut count = 0usize;
    // SAFETY: a writable count, no array.
    unsafe { graphs::get_nodes(graph, std::ptr::null_mut(), &mut count)? };
    let mut nodes = vec![0u64; count];
    // SAFETY: room for `count` handles.
    unsafe { graphs::get_nodes(graph, nodes.as_mut_ptr(), &mut count)? };
    nodes.truncate(count);
    Ok(nodes)
}

/// Write `value` to a caller's out parameter.
///
/// # Safety
/// `out` must be null or writable.
unsafe fn put<T>(out: *mut T, value: T) -> Result<(), CudaError> {
    if out.is_null() {
        return Err(E::InvalidValue);
    }
    // SAFETY: not null, writable (this function's contract).
    unsafe { out.write_unaligned(value) };
    Ok(())
}

/// `cudaGraphGetId`.
///
/// # Safety
/// `out` must be null or writable.
pub unsafe fn graph_id(graph: u64, out: *mut u32) -> Result<(), CudaError> {
    if out.is_null() || graph == 0 {
        return Err(E::InvalidValue);
    }
    // The graph exists (the server checks its handle).
    let mut count = 0usize;
    // SAFETY: a writable count, no array.
    unsafe { graphs::get_nodes(graph, std::ptr::null_mut(), &mut count)? };
    // SAFETY: not null, writable (this function's contract).
    unsafe { put(out, object_id(graph)) }
}

/// `cudaGraphExecGetId`.
///
/// # Safety
/// `out` must be null or writable.
pub unsafe fn exec_id(exec: u64, out: *mut u32) -> Result<(), CudaError> {
    if out.is_null() || exec == 0 {
        return Err(E::InvalidValue);
    }
    let mut flags = 0u64;
    // SAFETY: a writable `unsigned long long`. It checks the handle.
    unsafe { graphs::exec_flags(exec, &mut flags)? };
    // SAFETY: not null, writable (this function's contract).
    unsafe { put(out, object_id(exec)) }
}

/// The graph holding `node` and the node's local id there: nodes get ids in the order their
/// graph holds them, the first time any node of the graph is asked about (a node added later
/// gets the next id then).
fn local_id(node: u64) -> Result<(u64, u32), CudaError> {
    let mut graph = 0u64;
    // SAFETY: a writable graph handle.
    unsafe { graphs::containing_graph(node, &mut graph)? };
    if let Some(id) = with_ids(|ids| ids.nodes.get(&graph).and_then(|(_, n)| n.get(&node).copied())) {
        return Ok((graph, id));
    }
    let nodes = nodes_of(graph)?;
    with_ids(|ids| {
        let (next, known) = ids.nodes.entry(graph).or_default();
        for n in nodes {
            known.entry(n).or_insert_with(|| {
                *next += 1;
                *next - 1
            });
        }
        known.get(&node).copied().map(|id| (graph, id)).ok_or(E::InvalidValue)
    })
}

/// `cudaGraphNodeGetLocalId`: unique among its graph's nodes.
///
/// # Safety
/// `out` must be null or writable.
pub unsafe fn node_local_id(node: u64, out: *mut u32) -> Result<(), CudaError> {
    if out.is_null() || node == 0 {
        return Err(E::InvalidValue);
    }
    let (_, id) = local_id(node)?;
    // SAFETY: not null, writable (this function's contract).
    unsafe { put(out, id) }
}

/// `cudaGraphNodeGetToolsId`: unique in the process: its graph's id above its local id.
///
/// # Safety
/// `out` must be null or writable.
pub unsafe fn node_tools_id(node: u64, out: *mut u64) -> Result<(), CudaError> {
    if out.is_null() || node == 0 {
        return Err(E::InvalidValue);
    }
    let (graph, id) = local_id(node)?;
    // SAFETY: not null, writable (this function's contract).
    unsafe { put(out, (u64::from(object_id(graph)) << 32) | u64::from(id)) }
}
