//! Stream capture and the graphs it builds. While a stream captures, the work submitted to it
//! is recorded as [`GraphOp`]s instead of run, each a node of the capture's graph (a graph of
//! the session from the capture's beginning) after the nodes the stream's dependency set
//! names; a stream that waits on an event recorded in a capturing stream joins that capture
//! (CUDA's fork and join), taking the event's dependencies. Nodes are added in the order the
//! work was submitted and each depends on earlier ones only, so replaying them in that order
//! on one stream is one of the schedules the graph's dependencies allow.

use parking_lot::{Mutex, MutexGuard};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use phos_protocol::CudaError;
use phos_protocol::spec::DeviceAccess;
use phos_protocol::types::Dim3;

use crate::registry::handles::{HandleTable, NewHandle};

/// One recorded operation. Addresses are device addresses of the session; a kernel is named
/// by its function handle, so a graph outlives nothing it uses. Handles and addresses stay
/// the same across a restore, so a checkpoint holds operations as they are.
#[derive(Clone, Debug, PartialEq, bincode::Encode, bincode::Decode)]
pub enum GraphOp {
    Kernel {
        function: u64,
        grid: Dim3,
        block: Dim3,
        shared_mem: u32,
        params: Vec<u8>,
        cooperative: bool,
    },
    /// `height` rows of `width` bytes, `pitch` apart.
    Memset {
        dst: u64,
        pitch: u64,
        value: u8,
        width: u64,
        height: u64,
    },
    CopyOnDevice {
        dst: u64,
        dpitch: u64,
        src: u64,
        spitch: u64,
        width: u64,
        height: u64,
    },
    /// The host data as it was when captured, packed.
    CopyToDevice {
        dst: u64,
        dpitch: u64,
        data: Vec<u8>,
        width: u64,
        height: u64,
    },
    /// A copy between device memory and the guest's pinned memory, which is read or written
    /// when the graph runs.
    CopyPinned {
        device: u64,
        host: u64,
        count: u64,
        to_device: bool,
    },
    /// A math or DNN library's compute call (cuBLAS, cuSPARSE, cuFFT, ...), checked when it
    /// was captured and kept as the guest sent it: a launch runs it again through its API's
    /// dispatch (checked again: its handle may be gone), with its host scalars as they were
    /// when captured and its device memory as it is when the graph runs.
    Library {
        /// The function as a frame names it: its API's id and its id there.
        api: u16,
        function: u32,
        device: i32,
        payload: Vec<u8>,
        /// Where the call's library object was when captured, which every launch starts from:
        /// a cuRAND generator's position (CUDA's graph keeps the generator's offset).
        position: Option<u64>,
    },
    /// A host node: the guest's function and its data, addresses called in the guest (on its
    /// callback thread, while the stream waits at a gate).
    Host {
        func: u64,
        data: u64,
    },
    /// An event record node: the event's handle, looked up at each launch.
    EventRecord {
        event: u64,
    },
    /// An event wait node.
    EventWait {
        event: u64,
    },
    /// In an executable graph, before the work of one node of the graph it was instantiated
    /// from: the node's handle (what `cudaGraphExec*NodeSetParams` and
    /// `cudaGraphNodeSetEnabled` name), how many ops that follow are its work, and whether it
    /// runs (a disabled node's work is skipped). Never run itself.
    Node {
        handle: u64,
        ops: u32,
        enabled: bool,
    },
    /// A child graph node's graph: a graph of the session owned by the node (a copy of the
    /// child made when the node was added), whose work the node runs.
    Child {
        graph: u64,
    },
    /// A memory allocation node: the block of the session's memory the node reserved when it
    /// was added (or captured), at an address fixed for the graph's lifetime. A launch makes
    /// it live (allocated in CUDA's terms) until a free node, `cudaFree` or
    /// `cudaFreeAsync` frees it.
    MemAlloc {
        dptr: u64,
        size: u64,
        device: i32,
    },
    /// A memory free node: a graph allocation's block, or a block of `cudaMallocAsync`'s.
    MemFree {
        dptr: u64,
    },
    /// A conditional node of a graph: its handle (the device address of the session's 4-byte
    /// cell that kernels set through `cudaGraphSetConditional`), its
    /// `cudaGraphConditionalNodeType` and the body graphs it owns (graphs of the session).
    Conditional {
        handle: u64,
        kind: i32,
        bodies: Vec<u64>,
    },
    /// A conditional node in an executable graph: its bodies' work. The launch waits for the
    /// stream, reads the cell and runs a body as the type says (a `while` reads it again after
    /// each run).
    ConditionalRun {
        handle: u64,
        kind: i32,
        bodies: Vec<Vec<GraphOp>>,
    },
}

/// `cudaGraphConditionalNodeType` values.
pub const COND_IF: i32 = 0;
pub const COND_WHILE: i32 = 1;
pub const COND_SWITCH: i32 = 2;

/// The bytes `height` rows of `width`, `pitch` apart, span.
fn extent(pitch: u64, width: u64, height: u64) -> u64 {
    height.saturating_sub(1).saturating_mul(pitch).saturating_add(width)
}

impl GraphOp {
    /// The device memory the operation reads and writes, for the C/R hook (a kernel's is
    /// its launch's to say).
    pub fn device_access(&self) -> Vec<DeviceAccess> {
        let at = |addr, len, writes| DeviceAccess { addr, len, writes };
        match *self {
            // A library call's ranges are the spec's, shown by its dispatch when it runs.
            GraphOp::Kernel { .. } | GraphOp::Library { .. } => Vec::new(),
            GraphOp::Host { .. }
            | GraphOp::EventRecord { .. }
            | GraphOp::EventWait { .. }
            | GraphOp::Node { .. }
            | GraphOp::Child { .. }
            | GraphOp::MemAlloc { .. }
            | GraphOp::MemFree { .. }
            | GraphOp::Conditional { .. } => Vec::new(),
            // The launch reads the cell; each body's work shows its own when it runs.
            GraphOp::ConditionalRun { handle, .. } => vec![at(handle, 4, false)],
            GraphOp::Memset { dst, pitch, width, height, .. } => vec![at(dst, extent(pitch, width, height), true)],
            GraphOp::CopyOnDevice { dst, dpitch, src, spitch, width, height } => {
                vec![at(dst, extent(dpitch, width, height), true), at(src, extent(spitch, width, height), false)]
            }
            GraphOp::CopyToDevice { dst, dpitch, width, height, .. } => {
                vec![at(dst, extent(dpitch, width, height), true)]
            }
            GraphOp::CopyPinned { device, count, to_device, .. } => vec![at(device, count, to_device)],
        }
    }

    /// Rewrite the device addresses the operation names through `to`: a restore reloads the
    /// modules, whose variables (a symbol copy node's memory) may land elsewhere. A kernel's or
    /// library call's parameters are opaque bytes and stay as they are.
    pub fn relocate(&mut self, to: &dyn Fn(u64) -> u64) {
        match self {
            GraphOp::Memset { dst, .. } | GraphOp::CopyToDevice { dst, .. } => *dst = to(*dst),
            GraphOp::CopyOnDevice { dst, src, .. } => {
                *dst = to(*dst);
                *src = to(*src);
            }
            GraphOp::CopyPinned { device, .. } => *device = to(*device),
            GraphOp::Kernel { .. }
            | GraphOp::Library { .. }
            | GraphOp::Host { .. }
            | GraphOp::EventRecord { .. }
            | GraphOp::EventWait { .. }
            | GraphOp::Node { .. }
            | GraphOp::Child { .. }
            | GraphOp::MemAlloc { .. }
            | GraphOp::MemFree { .. }
            | GraphOp::Conditional { .. } => {}
            GraphOp::ConditionalRun { bodies, .. } => {
                for op in bodies.iter_mut().flatten() {
                    op.relocate(to);
                }
            }
        }
    }

    /// Whether an executable graph with `self` can take `other`'s parameters
    /// (`cudaGraphExecUpdate`): same kind of node, same kernel. Returns the
    /// `cudaGraphExecUpdateResult` when not.
    pub fn update_from(&self, other: &GraphOp) -> Result<(), i32> {
        use GraphOp::*;
        match (self, other) {
            (Kernel { function: a, .. }, Kernel { function: b, .. }) if a != b => Err(UPDATE_FUNCTION_CHANGED),
            (Library { api: a, function: f, .. }, Library { api: b, function: g, .. }) if (a, f) != (b, g) => {
                Err(UPDATE_FUNCTION_CHANGED)
            }
            (Kernel { .. }, Kernel { .. })
            | (Memset { .. }, Memset { .. })
            | (CopyOnDevice { .. }, CopyOnDevice { .. })
            | (CopyToDevice { .. }, CopyToDevice { .. })
            | (CopyPinned { .. }, CopyPinned { .. })
            | (Library { .. }, Library { .. })
            | (Host { .. }, Host { .. })
            | (EventRecord { .. }, EventRecord { .. })
            | (EventWait { .. }, EventWait { .. })
            | (Node { .. }, Node { .. })
            | (Child { .. }, Child { .. }) => Ok(()),
            // A conditional node keeps its handle, type and number of bodies, and each body its
            // shape, as CUDA requires of an update.
            (Conditional { handle: h, kind: k, bodies: b }, Conditional { handle: i, kind: l, bodies: c }) => {
                if (h, k, b.len()) == (i, l, c.len()) { Ok(()) } else { Err(UPDATE_PARAMETERS_CHANGED) }
            }
            (ConditionalRun { handle: h, kind: k, bodies: b }, ConditionalRun { handle: i, kind: l, bodies: c }) => {
                if (h, k, b.len()) != (i, l, c.len()) {
                    return Err(UPDATE_PARAMETERS_CHANGED);
                }
                for (x, y) in b.iter().zip(c) {
                    if x.len() != y.len() {
                        return Err(UPDATE_TOPOLOGY_CHANGED);
                    }
                    x.iter().zip(y).try_for_each(|(p, q)| p.update_from(q))?;
                }
                Ok(())
            }
            // A memory node's parameters cannot change in an executable graph.
            (MemAlloc { .. }, MemAlloc { .. }) | (MemFree { .. }, MemFree { .. }) => {
                if self == other {
                    Ok(())
                } else {
                    Err(UPDATE_PARAMETERS_CHANGED)
                }
            }
            _ => Err(UPDATE_NODE_TYPE_CHANGED),
        }
    }
}

/// `cudaGraphNodeType` values of the nodes Phos makes.
pub const NODE_KERNEL: i32 = 0;
pub const NODE_MEMCPY: i32 = 1;
pub const NODE_MEMSET: i32 = 2;
pub const NODE_HOST: i32 = 3;
pub const NODE_GRAPH: i32 = 4;
pub const NODE_EMPTY: i32 = 5;
pub const NODE_WAIT_EVENT: i32 = 6;
pub const NODE_EVENT_RECORD: i32 = 7;
pub const NODE_MEM_ALLOC: i32 = 10;
pub const NODE_MEM_FREE: i32 = 11;
pub const NODE_CONDITIONAL: i32 = 13;

/// One node: its work (a 3D copy or memset is one op per slice), the nodes it follows
/// (indices in the graph), its handle.
#[derive(Clone, Debug, bincode::Encode, bincode::Decode)]
pub struct Node {
    pub kind: i32,
    pub ops: Vec<GraphOp>,
    pub deps: Vec<usize>,
    pub handle: u64,
}

/// A graph: nodes in the order they were added.
#[derive(Clone, Debug, Default, bincode::Encode, bincode::Decode)]
pub struct Graph {
    pub nodes: Vec<Node>,
}

impl Graph {
    /// The kind of node a captured op makes.
    pub fn kind_of(op: &GraphOp) -> i32 {
        match op {
            // CUDA's graph holds the library's kernels: a captured library call is one
            // kernel node.
            GraphOp::Kernel { .. } | GraphOp::Library { .. } => NODE_KERNEL,
            GraphOp::Memset { .. } => NODE_MEMSET,
            GraphOp::CopyOnDevice { .. } | GraphOp::CopyToDevice { .. } | GraphOp::CopyPinned { .. } => NODE_MEMCPY,
            GraphOp::Host { .. } => NODE_HOST,
            GraphOp::EventRecord { .. } => NODE_EVENT_RECORD,
            GraphOp::EventWait { .. } => NODE_WAIT_EVENT,
            GraphOp::Child { .. } => NODE_GRAPH,
            GraphOp::Node { .. } => NODE_EMPTY,
            GraphOp::MemAlloc { .. } => NODE_MEM_ALLOC,
            GraphOp::MemFree { .. } => NODE_MEM_FREE,
            GraphOp::Conditional { .. } | GraphOp::ConditionalRun { .. } => NODE_CONDITIONAL,
        }
    }

    /// The indices of the nodes, each after the nodes it depends on (ties in the order the
    /// nodes were added); `cudaErrorInvalidValue` for a cycle.
    pub fn order_indices(&self) -> Result<Vec<usize>, CudaError> {
        let n = self.nodes.len();
        let mut waiting: Vec<usize> = self.nodes.iter().map(|node| node.deps.len()).collect();
        let mut followers: Vec<Vec<usize>> = vec![Vec::new(); n];
        for (i, node) in self.nodes.iter().enumerate() {
            for &d in &node.deps {
                followers[d].push(i);
            }
        }
        let mut ready: std::collections::BTreeSet<usize> = (0..n).filter(|&i| waiting[i] == 0).collect();
        let mut out = Vec::new();
        while let Some(i) = ready.pop_first() {
            out.push(i);
            for &f in &followers[i] {
                waiting[f] -= 1;
                if waiting[f] == 0 {
                    ready.insert(f);
                }
            }
        }
        if out.len() == n { Ok(out) } else { Err(CudaError::InvalidValue) }
    }

    /// The work of every node in [`order_indices`](Self::order_indices)' order.
    pub fn order(&self) -> Result<Vec<GraphOp>, CudaError> {
        Ok(self.order_indices()?.into_iter().flat_map(|i| self.nodes[i].ops.iter().cloned()).collect())
    }

    /// The (from, to) node indices of every edge, by node then by dependency.
    pub fn edges(&self) -> Vec<(usize, usize)> {
        self.nodes.iter().enumerate().flat_map(|(i, n)| n.deps.iter().map(move |&d| (d, i))).collect()
    }

    /// Remove the node at `index`, its edges with it; later nodes move down one.
    pub fn remove_node(&mut self, index: usize) -> Node {
        let node = self.nodes.remove(index);
        for n in &mut self.nodes {
            n.deps.retain(|&d| d != index);
            for d in &mut n.deps {
                if *d > index {
                    *d -= 1;
                }
            }
        }
        node
    }
}

/// An executable graph's work as it runs: the node markers left out, disabled nodes' work
/// skipped.
pub fn effective_ops(ops: &[GraphOp]) -> Vec<GraphOp> {
    let mut out = Vec::with_capacity(ops.len());
    let mut skip = 0usize;
    for op in ops {
        if skip > 0 {
            skip -= 1;
            continue;
        }
        match op {
            GraphOp::Node { enabled: false, ops, .. } => skip = *ops as usize,
            GraphOp::Node { .. } => {}
            op => out.push(op.clone()),
        }
    }
    out
}

/// Where node `handle`'s marker is in an executable graph's ops.
pub fn find_marker(ops: &[GraphOp], handle: u64) -> Option<usize> {
    ops.iter().position(|op| matches!(op, GraphOp::Node { handle: h, .. } if *h == handle))
}

/// `cudaGraphExecUpdateResult` values.
pub const UPDATE_SUCCESS: i32 = 0;
pub const UPDATE_TOPOLOGY_CHANGED: i32 = 2;
pub const UPDATE_NODE_TYPE_CHANGED: i32 = 3;
pub const UPDATE_FUNCTION_CHANGED: i32 = 4;
pub const UPDATE_PARAMETERS_CHANGED: i32 = 5;

/// `cudaStreamCaptureStatus` values.
pub const STATUS_NONE: i32 = 0;
pub const STATUS_ACTIVE: i32 = 1;
pub const STATUS_INVALIDATED: i32 = 2;

/// The registry's graphs and node handles, which a capture adds its nodes to as it records
/// (shared with [`GraphRegistry`](crate::registry::graphs::GraphRegistry)).
pub type GraphTable = Arc<Mutex<HandleTable<Graph>>>;
pub type NodeTable = Arc<Mutex<HandleTable<(u64, usize)>>>;

/// A session's captures behind a flag: the calls made while nothing captures (nearly all of
/// them) check the flag and take no lock. Locks are taken in the order captures, graphs, nodes.
pub struct CaptureState {
    inner: Mutex<Captures>,
    active: AtomicBool,
}

impl CaptureState {
    pub fn new(graphs: GraphTable, nodes: NodeTable) -> Self {
        CaptureState { inner: Mutex::new(Captures::new(graphs, nodes)), active: AtomicBool::new(false) }
    }

    /// The captures, when one is in progress.
    pub fn active(&self) -> Option<MutexGuard<'_, Captures>> {
        if !self.active.load(Ordering::Acquire) {
            return None;
        }
        Some(self.lock())
    }

    /// The captures, to record into or query.
    pub fn lock(&self) -> MutexGuard<'_, Captures> {
        self.inner.lock()
    }

    /// Begin, end or drop captures (the flag follows).
    pub fn update<T>(&self, f: impl FnOnce(&mut Captures) -> T) -> T {
        let mut c = self.lock();
        let r = f(&mut c);
        self.active.store(c.any_active(), Ordering::Release);
        r
    }
}

/// A capture in progress. Its graph is a graph of the session from the start, so the
/// application can see it (`cudaStreamGetCaptureInfo`) and add nodes to it while it grows.
struct Capture {
    origin: u64,
    graph: u64,
    /// Why the capture can no longer make a graph (a synchronisation, a device-to-host copy).
    invalidated: bool,
    /// A node could not be added: the session holds its limit of graph nodes.
    nodes_full: bool,
    /// The graph was the application's before the capture (`cudaStreamBeginCaptureToGraph`):
    /// it stays the application's whatever the end.
    existing: bool,
}

/// A stream's part in a capture: the capture's id and the nodes the next work captured in the
/// stream depends on (CUDA's dependency set), by handle.
struct Joined {
    id: u64,
    deps: Vec<u64>,
}

/// How a capture ended (see [`Captures::end`]).
#[derive(Debug, PartialEq)]
pub enum Ended {
    /// The graph of the recorded work.
    Graph(u64),
    /// The capture was invalidated; its graph, to destroy.
    Invalidated(u64),
    /// A node could not be added (the session's limit of nodes); its graph, to destroy.
    NodesFull(u64),
    /// A stream forked from the capture has work not joined back into the origin stream
    /// (`cudaErrorStreamCaptureUnjoined`); its graph, to destroy.
    Unjoined(u64),
}

/// Every capture of a session, by id; which stream and event belongs to which.
pub struct Captures {
    active: HashMap<u64, Capture>,
    streams: HashMap<u64, Joined>,
    /// Events recorded in a capturing stream: the capture and the stream's dependencies then.
    events: HashMap<u64, Joined>,
    next: u64,
    graphs: GraphTable,
    nodes: NodeTable,
}

/// `cudaStreamSetCaptureDependencies`: the nodes given replace the stream's set (else, 0,
/// `cudaStreamAddCaptureDependencies`, they are added to it).
pub const SET_DEPENDENCIES: u32 = 1;

/// `to` with the handles of `more` it does not hold yet, in order (in linear time: a guest's
/// set may hold many nodes).
fn union(to: &mut Vec<u64>, more: &[u64]) {
    if more.is_empty() {
        return;
    }
    let mut held: HashSet<u64> = to.iter().copied().collect();
    for &h in more {
        if held.insert(h) {
            to.push(h);
        }
    }
}

impl Captures {
    pub fn new(graphs: GraphTable, nodes: NodeTable) -> Self {
        Captures { active: HashMap::new(), streams: HashMap::new(), events: HashMap::new(), next: 0, graphs, nodes }
    }

    /// Forget every capture (their graphs are the registry's to drop).
    pub fn clear(&mut self) {
        self.active.clear();
        self.streams.clear();
        self.events.clear();
    }

    /// The capture `stream` is part of.
    pub fn of_stream(&self, stream: u64) -> Option<u64> {
        self.streams.get(&stream).map(|j| j.id)
    }

    pub fn any_active(&self) -> bool {
        !self.active.is_empty()
    }

    /// Whether `graph` is the graph of a capture in progress.
    pub fn is_capture_graph(&self, graph: u64) -> bool {
        self.active.values().any(|c| c.graph == graph)
    }

    /// The graphs of the captures in progress.
    pub fn capture_graphs(&self) -> Vec<u64> {
        self.active.values().map(|c| c.graph).collect()
    }

    /// Begin a capture on `stream` into `graph` (an empty graph of the session the caller
    /// made). `cudaErrorIllegalState` when the stream captures already.
    pub fn begin(&mut self, stream: u64, graph: u64) -> Result<(), CudaError> {
        self.begin_into(stream, graph, Vec::new(), false)
    }

    /// Begin a capture on `stream` into `graph`, its first work after the nodes `deps` (handles
    /// of nodes of `graph`, checked: `cudaErrorInvalidValue` for others); `existing`: the graph
    /// is the application's (`cudaStreamBeginCaptureToGraph`), never destroyed by the end.
    pub fn begin_into(&mut self, stream: u64, graph: u64, deps: Vec<u64>, existing: bool) -> Result<(), CudaError> {
        if self.streams.contains_key(&stream) {
            return Err(CudaError::IllegalState);
        }
        {
            let nodes = self.nodes.lock();
            if deps.iter().any(|h| !nodes.get(*h).is_ok_and(|(g, _)| *g == graph)) {
                return Err(CudaError::InvalidValue);
            }
        }
        let mut set = Vec::new();
        union(&mut set, &deps);
        self.next += 1;
        let id = self.next;
        self.active.insert(id, Capture { origin: stream, graph, invalidated: false, nodes_full: false, existing });
        self.streams.insert(stream, Joined { id, deps: set });
        Ok(())
    }

    /// The streams taking part in captures, with their capture's id.
    pub fn members(&self) -> Vec<(u64, u64)> {
        self.streams.iter().map(|(s, j)| (*s, j.id)).collect()
    }

    /// Invalidate capture `id` (work the capture cannot take was asked of one of its streams,
    /// or of the legacy stream while it captures).
    pub fn invalidate(&mut self, id: u64) {
        if let Some(c) = self.active.get_mut(&id) {
            c.invalidated = true;
        }
    }

    /// Record `op` if `stream` captures: `None` when it does not (the caller runs the work),
    /// else whether the capture took it. The op becomes a node of the capture's graph after
    /// the stream's dependencies, and the stream's dependencies become that node.
    pub fn record(&mut self, stream: u64, op: impl FnOnce() -> GraphOp) -> Option<Result<(), CudaError>> {
        let joined = self.streams.get_mut(&stream)?;
        let c = self.active.get_mut(&joined.id)?;
        if c.invalidated {
            return Some(Err(CudaError::StreamCaptureInvalidated));
        }
        let op = op();
        let mut graphs = self.graphs.lock();
        let Ok(g) = graphs.get_mut(c.graph) else {
            c.invalidated = true;
            return Some(Err(CudaError::StreamCaptureInvalidated));
        };
        let mut nodes = self.nodes.lock();
        // Handles of nodes no longer in the graph (a hostile guest's edits) are left out.
        let deps = joined
            .deps
            .iter()
            .filter_map(|h| nodes.get(*h).ok().filter(|(graph, _)| *graph == c.graph).map(|&(_, i)| i))
            .collect();
        let index = g.nodes.len();
        let full = || CudaError::MemoryAllocation;
        let handle = match nodes.add((c.graph, index), &NewHandle { forced: None, full: &full }) {
            Ok(h) => h,
            Err(e) => {
                c.invalidated = true;
                c.nodes_full = true;
                return Some(Err(e));
            }
        };
        g.nodes.push(Node { kind: Graph::kind_of(&op), ops: vec![op], deps, handle });
        joined.deps = vec![handle];
        Some(Ok(()))
    }

    /// Work a capture cannot take (`cudaErrorStreamCaptureUnsupported`): the capture of
    /// `stream` ends up invalidated, as in CUDA.
    pub fn refuse(&mut self, stream: u64) -> Option<CudaError> {
        let id = self.of_stream(stream)?;
        if let Some(c) = self.active.get_mut(&id) {
            c.invalidated = true;
        }
        Some(CudaError::StreamCaptureUnsupported)
    }

    /// A synchronisation of the whole device invalidates every capture.
    pub fn refuse_all(&mut self) -> Option<CudaError> {
        if self.active.is_empty() {
            return None;
        }
        for c in self.active.values_mut() {
            c.invalidated = true;
        }
        Some(CudaError::StreamCaptureUnsupported)
    }

    /// `cudaEventRecord` in a capturing stream: the event now stands for that point of the
    /// capture (the stream's dependencies then). Returns whether it was captured.
    pub fn record_event(&mut self, event: u64, stream: u64) -> bool {
        match self.streams.get(&stream) {
            Some(j) => {
                self.events.insert(event, Joined { id: j.id, deps: j.deps.clone() });
                true
            }
            None => {
                self.events.remove(&event);
                false
            }
        }
    }

    /// `cudaStreamWaitEvent`: a stream waiting on a captured event joins its capture, or in
    /// it, adds the event's dependencies to its own. `None` when the event is not captured and
    /// the stream does not capture (the caller waits).
    pub fn wait_event(&mut self, stream: u64, event: u64) -> Option<Result<(), CudaError>> {
        match (self.events.get(&event), self.of_stream(stream)) {
            (Some(e), Some(own)) if e.id == own => {
                let more = e.deps.clone();
                if let Some(j) = self.streams.get_mut(&stream) {
                    union(&mut j.deps, &more);
                }
                Some(Ok(()))
            }
            (Some(_), Some(_)) => Some(Err(CudaError::StreamCaptureMerge)),
            (Some(e), None) => {
                let joined = Joined { id: e.id, deps: e.deps.clone() };
                self.streams.insert(stream, joined);
                Some(Ok(()))
            }
            // A capturing stream cannot depend on work outside the capture.
            (None, Some(_)) => Some(Err(self.refuse(stream).unwrap_or(CudaError::StreamCaptureIsolation))),
            (None, None) => None,
        }
    }

    /// (`cudaStreamCaptureStatus`, capture id) of `stream`.
    pub fn status(&self, stream: u64) -> (i32, u64) {
        match self.of_stream(stream).and_then(|id| Some((id, self.active.get(&id)?))) {
            Some((id, c)) if c.invalidated => (STATUS_INVALIDATED, id),
            Some((id, _)) => (STATUS_ACTIVE, id),
            None => (STATUS_NONE, 0),
        }
    }

    /// The graph an active capture of `stream` grows and the nodes the stream's next
    /// captured work depends on (`cudaStreamGetCaptureInfo`); `None` unless it is active.
    pub fn graph_of(&self, stream: u64) -> Option<(u64, Vec<u64>)> {
        let j = self.streams.get(&stream)?;
        let c = self.active.get(&j.id).filter(|c| !c.invalidated)?;
        let nodes = self.nodes.lock();
        let live = j.deps.iter().copied().filter(|h| nodes.get(*h).is_ok_and(|(g, _)| *g == c.graph)).collect();
        Some((c.graph, live))
    }

    /// `cudaStreamUpdateCaptureDependencies`: `deps` (nodes of the capture's graph) replace
    /// the stream's dependencies (`flags` [`SET_DEPENDENCIES`]) or join them (0).
    /// `cudaErrorIllegalState` when the stream does not capture, `cudaErrorInvalidValue` for
    /// other flags or a node of another graph.
    pub fn update_dependencies(&mut self, stream: u64, deps: &[u64], flags: u32) -> Result<(), CudaError> {
        if flags > SET_DEPENDENCIES {
            return Err(CudaError::InvalidValue);
        }
        let j = self.streams.get_mut(&stream).ok_or(CudaError::IllegalState)?;
        let c = self.active.get(&j.id).ok_or(CudaError::IllegalState)?;
        if c.invalidated {
            return Err(CudaError::StreamCaptureInvalidated);
        }
        {
            let nodes = self.nodes.lock();
            if deps.iter().any(|h| !nodes.get(*h).is_ok_and(|(g, _)| *g == c.graph)) {
                return Err(CudaError::InvalidValue);
            }
        }
        if flags == SET_DEPENDENCIES {
            j.deps.clear();
        }
        union(&mut j.deps, deps);
        Ok(())
    }

    /// `cudaStreamEndCapture` on `stream`: its graph, or why there is none, and whether the
    /// graph was the application's before the capture (`cudaStreamBeginCaptureToGraph`). Every
    /// stream and event of the capture leaves it.
    pub fn end(&mut self, stream: u64) -> Result<(Ended, bool), CudaError> {
        let id = self.of_stream(stream).ok_or(CudaError::IllegalState)?;
        if self.active.get(&id).is_some_and(|c| c.origin != stream) {
            return Err(CudaError::StreamCaptureUnmatched);
        }
        let unjoined = self.active.get(&id).is_some_and(|c| !c.invalidated && self.unjoined(id, c));
        let c = self.active.remove(&id).ok_or(CudaError::IllegalState)?;
        self.streams.retain(|_, j| j.id != id);
        self.events.retain(|_, j| j.id != id);
        let ended = if c.nodes_full {
            Ended::NodesFull(c.graph)
        } else if c.invalidated {
            Ended::Invalidated(c.graph)
        } else if unjoined {
            Ended::Unjoined(c.graph)
        } else {
            Ended::Graph(c.graph)
        };
        Ok((ended, c.existing))
    }

    /// Whether a stream of capture `id` other than its origin has captured work the origin's
    /// dependency set does not reach (a fork not joined back): every node a forked stream's
    /// next work would follow must be one of the origin's set or an ancestor of one.
    fn unjoined(&self, id: u64, c: &Capture) -> bool {
        let graphs = self.graphs.lock();
        let Ok(g) = graphs.get(c.graph) else { return false };
        let nodes = self.nodes.lock();
        let index = |h: &u64| nodes.get(*h).ok().filter(|(graph, _)| *graph == c.graph).map(|&(_, i)| i);
        let mut reached = vec![false; g.nodes.len()];
        let mut stack: Vec<usize> =
            self.streams.get(&c.origin).map(|j| j.deps.iter().filter_map(index).collect()).unwrap_or_default();
        while let Some(i) = stack.pop() {
            if i < reached.len() && !std::mem::replace(&mut reached[i], true) {
                stack.extend(g.nodes[i].deps.iter().copied());
            }
        }
        self.streams
            .iter()
            .filter(|(s, j)| j.id == id && **s != c.origin)
            .flat_map(|(_, j)| j.deps.iter().filter_map(index))
            .any(|i| !reached.get(i).copied().unwrap_or(true))
    }

    /// Forget a destroyed stream's part in any capture.
    pub fn forget_stream(&mut self, stream: u64) {
        self.streams.remove(&stream);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use phos_protocol::apis::HandleKind;

    fn memset(value: u8) -> GraphOp {
        GraphOp::Memset { dst: 0x1000, pitch: 16, value, width: 16, height: 1 }
    }

    fn tables() -> (GraphTable, NodeTable) {
        (
            Arc::new(Mutex::new(HandleTable::new(HandleKind::Graph, 8))),
            Arc::new(Mutex::new(HandleTable::new(HandleKind::GraphNode, 8))),
        )
    }

    /// A capture on `stream` into a new graph of `graphs`.
    fn begin(c: &mut Captures, graphs: &GraphTable, stream: u64) -> u64 {
        let g = graphs.lock().insert(Graph::default()).unwrap();
        c.begin(stream, g).unwrap();
        g
    }

    /// Each node's (memset value, values of the nodes it depends on).
    fn shape(graphs: &GraphTable, g: u64) -> Vec<(u8, Vec<u8>)> {
        let graphs = graphs.lock();
        let g = graphs.get(g).unwrap();
        let value = |n: &Node| match n.ops[0] {
            GraphOp::Memset { value, .. } => value,
            _ => 0,
        };
        g.nodes.iter().map(|n| (value(n), n.deps.iter().map(|&d| value(&g.nodes[d])).collect())).collect()
    }

    #[test]
    fn forked_streams_join_and_end_with_the_origin() {
        let (graphs, nodes) = tables();
        let mut c = Captures::new(graphs.clone(), nodes);
        let g = begin(&mut c, &graphs, 10);
        assert!(c.record(10, || memset(1)).unwrap().is_ok());
        assert!(c.record(11, || memset(2)).is_none(), "not capturing");
        assert!(c.record_event(5, 10));
        c.wait_event(11, 5).unwrap().unwrap();
        assert!(c.record(11, || memset(3)).unwrap().is_ok());
        assert!(c.record(10, || memset(4)).unwrap().is_ok());
        assert!(c.record_event(6, 11));
        c.wait_event(10, 6).unwrap().unwrap();
        assert!(c.record(10, || memset(5)).unwrap().is_ok());
        assert_eq!(c.status(11).0, STATUS_ACTIVE);
        assert_eq!(c.end(11).unwrap_err(), CudaError::StreamCaptureUnmatched);
        assert_eq!(c.end(10).unwrap().0, Ended::Graph(g));
        // The fork's branches depend on the node before it; the join on both.
        assert_eq!(shape(&graphs, g), vec![(1, vec![]), (3, vec![1]), (4, vec![1]), (5, vec![4, 3])]);
        assert_eq!(graphs.lock().get(g).unwrap().order().unwrap(), [1, 3, 4, 5].map(memset).to_vec());
        assert_eq!(c.status(11), (STATUS_NONE, 0));
        assert!(c.record(11, || memset(6)).is_none());
    }

    #[test]
    fn dependencies_are_queried_and_replaced() {
        let (graphs, nodes) = tables();
        let mut c = Captures::new(graphs.clone(), nodes.clone());
        let g = begin(&mut c, &graphs, 10);
        assert_eq!(c.graph_of(10), Some((g, vec![])));
        c.record(10, || memset(1)).unwrap().unwrap();
        let (_, deps) = c.graph_of(10).unwrap();
        assert_eq!(deps.len(), 1);
        // A node added by hand after the captured one, made the stream's only dependency.
        let index = graphs.lock().get(g).unwrap().nodes.len();
        let by_hand = nodes.lock().insert((g, index)).unwrap();
        graphs.lock().get_mut(g).unwrap().nodes.push(Node {
            kind: NODE_MEMSET,
            ops: vec![memset(2)],
            deps: vec![0],
            handle: by_hand,
        });
        c.update_dependencies(10, &[by_hand], SET_DEPENDENCIES).unwrap();
        assert_eq!(c.graph_of(10), Some((g, vec![by_hand])));
        c.record(10, || memset(3)).unwrap().unwrap();
        // Added: the next node depends on both.
        c.update_dependencies(10, &deps, 0).unwrap();
        c.record(10, || memset(4)).unwrap().unwrap();
        assert_eq!(shape(&graphs, g), vec![(1, vec![]), (2, vec![1]), (3, vec![2]), (4, vec![3, 1])]);
        // Misuse: bad flags, a node of another graph, a stream that does not capture.
        assert_eq!(c.update_dependencies(10, &deps, 2), Err(CudaError::InvalidValue));
        let other = nodes.lock().insert((g + 1, 0)).unwrap();
        assert_eq!(c.update_dependencies(10, &[other], 0), Err(CudaError::InvalidValue));
        assert_eq!(c.update_dependencies(11, &[], 0), Err(CudaError::IllegalState));
        assert_eq!(c.end(10).unwrap().0, Ended::Graph(g));
        assert_eq!(c.graph_of(10), None);
    }

    #[test]
    fn nodes_run_after_their_dependencies_and_cycles_are_refused() {
        let node = |value: u8, deps: Vec<usize>| Node { kind: NODE_MEMSET, ops: vec![memset(value)], deps, handle: 0 };
        let mut g = Graph { nodes: vec![node(0, vec![2]), node(1, vec![]), node(2, vec![1]), node(3, vec![])] };
        assert_eq!(g.order().unwrap(), vec![memset(1), memset(2), memset(0), memset(3)]);
        g.nodes[1].deps.push(0);
        assert_eq!(g.order().unwrap_err(), CudaError::InvalidValue);
    }

    #[test]
    fn unsupported_work_invalidates_the_capture() {
        let (graphs, nodes) = tables();
        let mut c = Captures::new(graphs.clone(), nodes);
        let g = begin(&mut c, &graphs, 10);
        assert_eq!(c.begin(10, g).unwrap_err(), CudaError::IllegalState);
        assert_eq!(c.refuse(10), Some(CudaError::StreamCaptureUnsupported));
        assert_eq!(c.status(10).0, STATUS_INVALIDATED);
        assert_eq!(c.graph_of(10), None);
        assert_eq!(c.record(10, || memset(1)).unwrap().unwrap_err(), CudaError::StreamCaptureInvalidated);
        assert_eq!(c.end(10).unwrap().0, Ended::Invalidated(g));
        assert_eq!(c.end(10).unwrap_err(), CudaError::IllegalState);
        // A capturing stream may not wait on work outside its capture.
        begin(&mut c, &graphs, 20);
        assert!(c.wait_event(20, 99).unwrap().is_err());
    }

    #[test]
    fn a_fork_not_joined_back_fails_the_end() {
        let (graphs, nodes) = tables();
        let mut c = Captures::new(graphs.clone(), nodes);
        let g = begin(&mut c, &graphs, 10);
        c.record(10, || memset(1)).unwrap().unwrap();
        assert!(c.record_event(5, 10));
        c.wait_event(11, 5).unwrap().unwrap();
        c.record(11, || memset(2)).unwrap().unwrap();
        assert_eq!(c.end(10).unwrap(), (Ended::Unjoined(g), false));
        assert_eq!(c.status(11), (STATUS_NONE, 0), "every stream leaves the capture");
        // A forked stream that did nothing after the fork is joined: its set is the origin's.
        let g = begin(&mut c, &graphs, 10);
        c.record(10, || memset(1)).unwrap().unwrap();
        assert!(c.record_event(5, 10));
        c.wait_event(11, 5).unwrap().unwrap();
        c.record(10, || memset(3)).unwrap().unwrap();
        assert_eq!(c.end(10).unwrap(), (Ended::Graph(g), false));
    }

    #[test]
    fn a_capture_into_an_existing_graph_follows_the_given_nodes() {
        let (graphs, nodes) = tables();
        let mut c = Captures::new(graphs.clone(), nodes.clone());
        let g = graphs.lock().insert(Graph::default()).unwrap();
        let first = nodes.lock().insert((g, 0)).unwrap();
        graphs.lock().get_mut(g).unwrap().nodes.push(Node {
            kind: NODE_MEMSET,
            ops: vec![memset(1)],
            deps: vec![],
            handle: first,
        });
        let other = nodes.lock().insert((g + 1, 0)).unwrap();
        assert_eq!(c.begin_into(10, g, vec![other], true), Err(CudaError::InvalidValue));
        c.begin_into(10, g, vec![first], true).unwrap();
        assert_eq!(c.begin_into(10, g, vec![], true), Err(CudaError::IllegalState));
        c.record(10, || memset(2)).unwrap().unwrap();
        assert_eq!(c.end(10).unwrap(), (Ended::Graph(g), true));
        assert_eq!(shape(&graphs, g), vec![(1, vec![]), (2, vec![1])]);
    }

    #[test]
    fn a_full_node_table_invalidates_the_capture() {
        let graphs: GraphTable = Arc::new(Mutex::new(HandleTable::new(HandleKind::Graph, 8)));
        let nodes: NodeTable = Arc::new(Mutex::new(HandleTable::new(HandleKind::GraphNode, 1)));
        let mut c = Captures::new(graphs.clone(), nodes);
        let g = begin(&mut c, &graphs, 10);
        c.record(10, || memset(1)).unwrap().unwrap();
        assert_eq!(c.record(10, || memset(2)).unwrap(), Err(CudaError::MemoryAllocation));
        assert_eq!(c.end(10).unwrap().0, Ended::NodesFull(g));
    }
}
