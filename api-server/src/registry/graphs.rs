//! The session's stream captures, graphs, their nodes and executable graphs.
//!
//! Invariants: a node handle names a node of a live graph (destroying a graph drops its node
//! handles); an executable graph is a copy of its graph's work in an order its dependencies
//! allow, and outlives the graph; a capture in progress grows a graph of the table (its
//! captured work is added there as it is recorded). Locks are taken in the order `captures`,
//! `graphs`, `nodes`.

use parking_lot::Mutex;
use phos_protocol::CudaError;
use phos_protocol::apis::HandleKind;

use super::handles::{HandleTable, NewHandle};
use crate::capture::{
    COND_IF, COND_SWITCH, COND_WHILE, CaptureState, Ended, Graph, GraphOp, NODE_CONDITIONAL, NODE_GRAPH, NODE_KERNEL,
    NODE_MEM_ALLOC, NODE_MEM_FREE, NODE_MEMCPY, NODE_MEMSET, Node, UPDATE_SUCCESS, UPDATE_TOPOLOGY_CHANGED,
    effective_ops, find_marker,
};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

/// How deep child graphs may nest (a guest cannot make a cycle of them: a child is copied
/// when added, but a deep chain is refused rather than recursed without end).
const MAX_NESTING: usize = 64;

/// The most bodies a `switch` conditional node may have (CUDA names no limit; a guest's size
/// is bounded so that it cannot make the server hold any number of graphs at once).
pub const MAX_SWITCH_BODIES: u32 = 1024;

/// The most conditional handles a session may hold (each is a cell of its memory).
pub const MAX_CONDITIONALS: usize = 1 << 16;

/// A conditional node's handle (`cudaGraphConditionalHandleCreate`), by its value: the device
/// address of a 4-byte cell of the session's memory, which kernels set and launches read.
#[derive(Clone, Copy, Debug)]
struct Conditional {
    /// The graph it was made for: its conditional node is in it or in a body nested in it.
    graph: u64,
    default: u32,
    /// `cudaGraphCondAssignDefault`: every launch sets the cell to `default` first.
    assign_default: bool,
}

/// What [`GraphRegistry::query`] answers.
pub mod query {
    /// A graph's nodes without dependencies.
    pub const ROOTS: i32 = 0;
    /// A graph's edges, (from, to) pairs.
    pub const EDGES: i32 = 1;
    /// The nodes a node depends on.
    pub const DEPENDENCIES: i32 = 2;
    /// The nodes that depend on a node.
    pub const DEPENDENTS: i32 = 3;
    /// A node's parameters (see [`super::GraphRegistry::node_params`]).
    pub const PARAMS: i32 = 4;
    /// The graph a node is in.
    pub const GRAPH: i32 = 5;
}

pub struct GraphRegistry {
    /// Stream captures in progress (behind a flag: calls look at it without a lock while
    /// nothing captures).
    pub captures: CaptureState,
    graphs: Arc<Mutex<HandleTable<Graph>>>,
    /// Node handles: (graph handle, index of the node in it).
    nodes: Arc<Mutex<HandleTable<(u64, usize)>>>,
    execs: Mutex<HandleTable<Vec<GraphOp>>>,
    /// The blocks of graph allocations (taken after the other locks).
    mem: Mutex<GraphMemory>,
    /// Conditional handles by value, and the graph each conditional node's body graph belongs
    /// to (taken after the other locks).
    conditionals: Mutex<Conditionals>,
}

#[derive(Default)]
struct Conditionals {
    handles: HashMap<u64, Conditional>,
    /// A body graph -> the graph of its conditional node.
    parents: HashMap<u64, u64>,
}

/// A graph allocation: a block of the session's memory reserved by an allocation node when it
/// was added or captured, at an address fixed while a graph or executable graph names it.
#[derive(Clone, Copy, Debug)]
struct Block {
    size: u64,
    device: i32,
    /// Allocated in CUDA's terms: a launch of its allocation node ran, nothing freed it yet.
    live: bool,
    /// Made by a capture still in progress (kept reserved when the capture ends invalidated).
    in_capture: bool,
}

/// Graph allocations and what CUDA ties to them.
#[derive(Default)]
struct GraphMemory {
    blocks: BTreeMap<u64, Block>,
    /// A graph with memory nodes -> its executable graph (CUDA allows one at a time).
    instantiated: HashMap<u64, u64>,
    /// Executable graphs instantiated with `cudaGraphInstantiateFlagAutoFreeOnLaunch`.
    auto_free: HashSet<u64>,
    /// Per device: the high-water marks of used and reserved graph memory.
    high: HashMap<i32, (u64, u64)>,
}

impl GraphMemory {
    /// (used, reserved) bytes of `device`.
    fn current(&self, device: i32) -> (u64, u64) {
        self.blocks
            .values()
            .filter(|b| b.device == device)
            .fold((0, 0), |(u, r), b| (if b.live { u + b.size } else { u }, r + b.size))
    }

    fn note_high(&mut self, device: i32) {
        let (used, reserved) = self.current(device);
        let high = self.high.entry(device).or_default();
        high.0 = high.0.max(used);
        high.1 = high.1.max(reserved);
    }
}

/// `cudaGraphMemAttributeType` values.
pub mod mem_attr {
    pub const USED_CURRENT: i32 = 0;
    pub const USED_HIGH: i32 = 1;
    pub const RESERVED_CURRENT: i32 = 2;
    pub const RESERVED_HIGH: i32 = 3;
}

fn is_memory_op(op: &GraphOp) -> bool {
    matches!(op, GraphOp::MemAlloc { .. } | GraphOp::MemFree { .. })
}

fn has_memory_nodes(g: &Graph) -> bool {
    g.nodes.iter().flat_map(|n| &n.ops).any(is_memory_op)
}

/// What a checkpoint holds of the graphs (see [`GraphRegistry::snapshot`]).
#[derive(bincode::Encode, bincode::Decode)]
struct GraphsImage {
    graphs: Vec<(u64, Graph)>,
    execs: Vec<(u64, Vec<GraphOp>)>,
    /// The next handle counters of graphs, nodes and executable graphs.
    next: [u64; 3],
}

/// The objects of each kind a session may hold at once.
pub struct GraphLimits {
    pub graphs: u64,
    pub nodes: u64,
    pub execs: u64,
}

impl GraphRegistry {
    pub fn new(limits: GraphLimits) -> Self {
        let graphs = Arc::new(Mutex::new(HandleTable::new(HandleKind::Graph, limits.graphs)));
        let nodes = Arc::new(Mutex::new(HandleTable::new(HandleKind::GraphNode, limits.nodes)));
        GraphRegistry {
            captures: CaptureState::new(graphs.clone(), nodes.clone()),
            graphs,
            nodes,
            execs: Mutex::new(HandleTable::new(HandleKind::GraphExec, limits.execs)),
            mem: Mutex::new(GraphMemory::default()),
            conditionals: Mutex::new(Conditionals::default()),
        }
    }

    /// `cudaGraphConditionalHandleCreate`: the handle whose cell is at `cell` (4 bytes of the
    /// session's memory the caller allocated, and frees again when this fails), for `graph`.
    /// `cudaErrorInvalidValue` for flags other than `cudaGraphCondAssignDefault`,
    /// `cudaErrorMemoryAllocation` past the session's number of handles.
    pub fn add_conditional_handle(&self, graph: u64, cell: u64, default: u32, flags: u32) -> Result<(), CudaError> {
        if flags > 1 {
            return Err(CudaError::InvalidValue);
        }
        self.graphs.lock().get(graph)?;
        let mut c = self.conditionals.lock();
        if c.handles.len() >= MAX_CONDITIONALS {
            return Err(CudaError::MemoryAllocation);
        }
        c.handles.insert(cell, Conditional { graph, default, assign_default: flags == 1 });
        Ok(())
    }

    /// The session's conditional handles, for a checkpoint: (cell, graph, default, flags), by
    /// cell. Their cells are allocations of the session's memory, which the image holds.
    pub fn conditional_handles(&self) -> Vec<(u64, u64, u32, u32)> {
        let c = self.conditionals.lock();
        let mut out: Vec<_> =
            c.handles.iter().map(|(&cell, k)| (cell, k.graph, k.default, u32::from(k.assign_default))).collect();
        out.sort_unstable();
        out
    }

    /// Put back a conditional handle of an image (its cell allocated again at its address,
    /// its graph put back by [`load`](Self::load)). `cudaErrorInvalidValue` for flags other than
    /// `cudaGraphCondAssignDefault` and a cell named twice.
    pub fn load_conditional_handle(&self, cell: u64, graph: u64, default: u32, flags: u32) -> Result<(), CudaError> {
        let mut c = self.conditionals.lock();
        if flags > 1 || c.handles.contains_key(&cell) || c.handles.len() >= MAX_CONDITIONALS {
            return Err(CudaError::InvalidValue);
        }
        c.handles.insert(cell, Conditional { graph, default, assign_default: flags == 1 });
        Ok(())
    }

    /// Add a conditional node of `kind` with `size` bodies to `graph` after the nodes at `deps`:
    /// its handle and its body graphs (empty graphs of the session the node owns). The handle
    /// must be one made for `graph` or for a graph `graph` is a body of (nested at most
    /// `MAX_NESTING` deep); an `if` has 1 or 2 bodies, a `while` 1, a `switch` 1 to
    /// [`MAX_SWITCH_BODIES`]. `cudaErrorInvalidValue` otherwise.
    #[allow(clippy::too_many_arguments)]
    pub fn add_conditional_node(
        &self,
        graph: u64,
        deps: Vec<usize>,
        handle: u64,
        kind: i32,
        size: u32,
        graphs_full: &dyn Fn() -> CudaError,
        nodes_full: &dyn Fn() -> CudaError,
    ) -> Result<(u64, Vec<u64>), CudaError> {
        let sizes = match kind {
            COND_IF => 1..=2,
            COND_WHILE => 1..=1,
            COND_SWITCH => 1..=MAX_SWITCH_BODIES,
            _ => return Err(CudaError::InvalidValue),
        };
        if !sizes.contains(&size) {
            return Err(CudaError::InvalidValue);
        }
        {
            let c = self.conditionals.lock();
            let owner = c.handles.get(&handle).ok_or(CudaError::InvalidValue)?.graph;
            // `graph`, then the graphs it is a body of, outwards.
            let mut at = graph;
            let mut depth = 0;
            while at != owner {
                at = *c.parents.get(&at).ok_or(CudaError::InvalidValue)?;
                depth += 1;
                if depth > MAX_NESTING {
                    return Err(CudaError::InvalidValue);
                }
            }
            let mut depth = 0;
            let mut at = graph;
            while let Some(&up) = c.parents.get(&at) {
                at = up;
                depth += 1;
                if depth >= MAX_NESTING {
                    return Err(CudaError::InvalidValue);
                }
            }
        }
        let mut bodies = Vec::with_capacity(size as usize);
        {
            let mut graphs = self.graphs.lock();
            graphs.get(graph)?;
            for _ in 0..size {
                match graphs.add(Graph::default(), &NewHandle { forced: None, full: graphs_full }) {
                    Ok(b) => bodies.push(b),
                    Err(e) => {
                        for b in bodies {
                            graphs.remove(b).ok();
                        }
                        return Err(e);
                    }
                }
            }
        }
        let op = GraphOp::Conditional { handle, kind, bodies: bodies.clone() };
        match self.add_node(graph, NODE_CONDITIONAL, vec![op.clone()], deps, nodes_full) {
            Ok(node) => {
                let mut c = self.conditionals.lock();
                for &b in &bodies {
                    c.parents.insert(b, graph);
                }
                Ok((node, bodies))
            }
            Err(e) => {
                drop_children(&mut self.graphs.lock(), &mut self.nodes.lock(), &[op]);
                Err(e)
            }
        }
    }

    /// An empty graph.
    pub fn create(&self, new: &NewHandle<'_>) -> Result<u64, CudaError> {
        self.graphs.lock().add(Graph::default(), new)
    }

    /// `cudaStreamBeginCapture`: a capture of `stream` into a new, empty graph.
    /// `cudaErrorIllegalState` when the stream captures already.
    pub fn begin_capture(&self, stream: u64, new: &NewHandle<'_>) -> Result<(), CudaError> {
        self.captures.update(|c| {
            if c.of_stream(stream).is_some() {
                return Err(CudaError::IllegalState);
            }
            let graph = self.graphs.lock().add(Graph::default(), new)?;
            c.begin(stream, graph).inspect_err(|_| {
                self.graphs.lock().remove(graph).ok();
            })
        })
    }

    /// `cudaStreamBeginCaptureToGraph`: a capture of `stream` into the existing `graph`, its
    /// first work after the nodes `deps` (handles, 8 bytes each, of nodes of `graph`).
    /// `cudaErrorIllegalState` when the stream captures already, `cudaErrorInvalidValue` for a
    /// node of another graph.
    pub fn begin_capture_to_graph(&self, stream: u64, graph: u64, deps: &[u8]) -> Result<(), CudaError> {
        let deps = deps.chunks_exact(8).map(|h| u64::from_ne_bytes(h.try_into().expect("8 bytes"))).collect();
        self.captures.update(|c| {
            self.graphs.lock().get(graph)?;
            c.begin_into(stream, graph, deps, true)
        })
    }

    /// `cudaStreamEndCapture`: the graph the capture of `stream` grew. An invalidated capture's
    /// graph is destroyed (`cudaErrorStreamCaptureInvalidated`), and so is one with a fork not
    /// joined back (`cudaErrorStreamCaptureUnjoined`) and one that could not take a node:
    /// `cudaErrorMemoryAllocation`, which the caller reports as the session's limit of nodes.
    /// A graph that was the application's before the capture (`cudaStreamBeginCaptureToGraph`)
    /// stays, with the nodes captured into it.
    pub fn end_capture(&self, stream: u64) -> Result<u64, CudaError> {
        let (ended, existing) = self.captures.update(|c| c.end(stream))?;
        let (graph, failed) = match ended {
            Ended::Graph(g) => (g, None),
            Ended::Invalidated(g) => (g, Some(CudaError::StreamCaptureInvalidated)),
            Ended::NodesFull(g) => (g, Some(CudaError::MemoryAllocation)),
            Ended::Unjoined(g) => (g, Some(CudaError::StreamCaptureUnjoined)),
        };
        if let Some(e) = failed {
            // Its allocation nodes' blocks stay reserved (still marked as a capture's).
            if !existing {
                self.destroy(graph).ok();
            }
            return Err(e);
        }
        let graphs = self.graphs.lock();
        let mut mem = self.mem.lock();
        for op in graphs.get(graph)?.nodes.iter().flat_map(|n| &n.ops) {
            if let GraphOp::MemAlloc { dptr, .. } = op
                && let Some(b) = mem.blocks.get_mut(dptr)
            {
                b.in_capture = false;
            }
        }
        Ok(graph)
    }

    /// Append a node to `graph` after the nodes at `deps`; its handle. (Nodes are not in
    /// checkpoints, so a node's handle is always a fresh one.)
    pub fn add_node(
        &self,
        graph: u64,
        kind: i32,
        ops: Vec<GraphOp>,
        deps: Vec<usize>,
        nodes_full: &dyn Fn() -> CudaError,
    ) -> Result<u64, CudaError> {
        let mut graphs = self.graphs.lock();
        let g = graphs.get_mut(graph)?;
        let index = g.nodes.len();
        let handle = self.nodes.lock().add((graph, index), &NewHandle { forced: None, full: nodes_full })?;
        g.nodes.push(Node { kind, ops, deps, handle });
        Ok(handle)
    }

    /// Node handles of `graph` (as the guest sends them: 8 bytes each) as node indices.
    pub fn node_indices(&self, graph: u64, handles: &[u8]) -> Result<Vec<usize>, CudaError> {
        let nodes = self.nodes.lock();
        handles
            .chunks_exact(8)
            .map(|h| {
                let (g, index) = *nodes.get(u64::from_ne_bytes(h.try_into().expect("8 bytes")))?;
                if g == graph { Ok(index) } else { Err(CudaError::InvalidValue) }
            })
            .collect()
    }

    /// Each node at `to[i]` comes after the node at `from[i]`.
    pub fn add_dependencies(&self, graph: u64, from: Vec<usize>, to: Vec<usize>) -> Result<(), CudaError> {
        let mut graphs = self.graphs.lock();
        let g = graphs.get_mut(graph)?;
        for (f, t) in from.into_iter().zip(to) {
            if f == t || g.nodes[t].deps.contains(&f) {
                return Err(CudaError::InvalidValue);
            }
            g.nodes[t].deps.push(f);
        }
        Ok(())
    }

    /// Up to `max` node handles of `graph` (8 bytes each, the rest zero), and how many it has.
    pub fn nodes(&self, graph: u64, max: usize) -> Result<(Vec<u8>, u64), CudaError> {
        let graphs = self.graphs.lock();
        let g = graphs.get(graph)?;
        let mut nodes = Vec::new();
        for node in g.nodes.iter().take(max) {
            nodes.extend_from_slice(&node.handle.to_ne_bytes());
        }
        nodes.resize(max * 8, 0);
        Ok((nodes, g.nodes.len() as u64))
    }

    /// The `cudaGraphNodeType` of a node.
    pub fn node_kind(&self, node: u64) -> Result<i32, CudaError> {
        let (g, index) = *self.nodes.lock().get(node)?;
        Ok(self.graphs.lock().get(g)?.nodes[index].kind)
    }

    /// The (graph, index) of a node.
    fn locate(&self, node: u64) -> Result<(u64, usize), CudaError> {
        self.nodes.lock().get(node).copied().map_err(|_| CudaError::InvalidValue)
    }

    /// Words about a graph or a node, as `what` (see [`query`]) says.
    pub fn query(&self, what: i32, handle: u64) -> Result<Vec<u64>, CudaError> {
        let graphs = self.graphs.lock();
        match what {
            query::ROOTS | query::EDGES => {
                let g = graphs.get(handle)?;
                Ok(if what == query::ROOTS {
                    g.nodes.iter().filter(|n| n.deps.is_empty()).map(|n| n.handle).collect()
                } else {
                    g.edges().into_iter().flat_map(|(f, t)| [g.nodes[f].handle, g.nodes[t].handle]).collect()
                })
            }
            query::DEPENDENCIES | query::DEPENDENTS | query::PARAMS | query::GRAPH => {
                let (graph, index) = self.locate(handle)?;
                let g = graphs.get(graph)?;
                Ok(match what {
                    query::DEPENDENCIES => g.nodes[index].deps.iter().map(|&d| g.nodes[d].handle).collect(),
                    query::DEPENDENTS => g.nodes.iter().filter(|n| n.deps.contains(&index)).map(|n| n.handle).collect(),
                    query::GRAPH => vec![graph],
                    _ => node_params(&g.nodes[index]),
                })
            }
            _ => Err(CudaError::InvalidValue),
        }
    }

    /// Remove the dependency of the node `to` on the node `from` (both of `graph`);
    /// `cudaErrorInvalidValue` when there is none.
    pub fn remove_dependency(&self, graph: u64, from: usize, to: usize) -> Result<(), CudaError> {
        let mut graphs = self.graphs.lock();
        let g = graphs.get_mut(graph)?;
        let deps = &mut g.nodes.get_mut(to).ok_or(CudaError::InvalidValue)?.deps;
        let at = deps.iter().position(|&d| d == from).ok_or(CudaError::InvalidValue)?;
        deps.remove(at);
        Ok(())
    }

    /// `cudaGraphDestroyNode`: the node and its edges leave its graph (a child graph node's
    /// graph goes with it).
    pub fn destroy_node(&self, node: u64) -> Result<(), CudaError> {
        let (graph, index) = self.locate(node)?;
        // CUDA permits everything but destruction and node removal on a capture's graph.
        if self.captures.lock().is_capture_graph(graph) {
            return Err(CudaError::InvalidValue);
        }
        let mut graphs = self.graphs.lock();
        let mut nodes = self.nodes.lock();
        let g = graphs.get_mut(graph)?;
        let removed = g.remove_node(index);
        nodes.remove(node)?;
        for (i, n) in g.nodes.iter().enumerate().skip(index) {
            if let Ok(at) = nodes.get_mut(n.handle) {
                *at = (graph, i);
            }
        }
        drop_children(&mut graphs, &mut nodes, &removed.ops);
        Ok(())
    }

    /// `cudaGraph*NodeSetParams`: the node `node` takes the work of `from` (a node of the
    /// same type, made for this by the guest), which is destroyed. `cudaErrorInvalidValue`
    /// when the types differ.
    pub fn set_node(&self, node: u64, from: u64) -> Result<(), CudaError> {
        let (graph, index) = self.locate(node)?;
        let (from_graph, from_index) = self.locate(from)?;
        if node == from {
            return Err(CudaError::InvalidValue);
        }
        {
            let mut graphs = self.graphs.lock();
            let kind = graphs.get(from_graph)?.nodes[from_index].kind;
            let target = &mut graphs.get_mut(graph)?.nodes[index];
            // Memory nodes have no setters in CUDA.
            if target.kind != kind || [NODE_GRAPH, NODE_MEM_ALLOC, NODE_MEM_FREE, NODE_CONDITIONAL].contains(&kind) {
                return Err(CudaError::InvalidValue);
            }
        }
        let mut ops = self.take_node(from)?;
        let mut graphs = self.graphs.lock();
        keep_attributes(&graphs.get(graph)?.nodes[index].ops, &mut ops);
        let old = std::mem::replace(&mut graphs.get_mut(graph)?.nodes[index].ops, ops);
        drop_children(&mut graphs, &mut self.nodes.lock(), &old);
        Ok(())
    }

    /// Destroy node `from`, answering its work.
    fn take_node(&self, from: u64) -> Result<Vec<GraphOp>, CudaError> {
        let (graph, index) = self.locate(from)?;
        let mut graphs = self.graphs.lock();
        let mut nodes = self.nodes.lock();
        let g = graphs.get_mut(graph)?;
        let removed = g.remove_node(index);
        nodes.remove(from)?;
        for (i, n) in g.nodes.iter().enumerate().skip(index) {
            if let Ok(at) = nodes.get_mut(n.handle) {
                *at = (graph, i);
            }
        }
        Ok(removed.ops)
    }

    /// `cudaGraphExec*NodeSetParams` and `cudaGraphExecChildGraphNodeSetParams`: the node
    /// `node` of executable graph `exec` takes the work of `from` (a node made for this by the
    /// guest, destroyed here), which must be of the same type and, for a kernel, function; a
    /// child graph must have the same shape. `cudaErrorInvalidValue` when not.
    pub fn set_exec_node(&self, exec: u64, node: u64, from: u64) -> Result<(), CudaError> {
        self.execs.lock().get(exec)?;
        let (from_graph, from_index) = self.locate(from)?;
        let (new, kind_new) = {
            let graphs = self.graphs.lock();
            let n = &graphs.get(from_graph)?.nodes[from_index];
            (expand(&graphs, &n.ops, 0), n.kind)
        };
        // The node's type as its graph says, when the graph is still there.
        let kind_old = self.node_kind(node).ok();
        let result = new.and_then(|mut new| {
            if kind_old.is_some_and(|k| k != kind_new)
                || [NODE_MEM_ALLOC, NODE_MEM_FREE, NODE_CONDITIONAL].contains(&kind_new)
            {
                return Err(CudaError::InvalidValue);
            }
            let mut execs = self.execs.lock();
            let ops = execs.get_mut(exec)?;
            let at = find_marker(ops, node).ok_or(CudaError::InvalidValue)?;
            let GraphOp::Node { ops: count, .. } = ops[at] else { return Err(CudaError::InvalidValue) };
            let old = ops.get(at + 1..at + 1 + count as usize).ok_or(CudaError::InvalidValue)?;
            if kind_new == NODE_GRAPH {
                // The same shape: as many ops, each of the same type.
                if old.len() != new.len() || old.iter().zip(&new).any(|(a, b)| a.update_from(b).is_err()) {
                    return Err(CudaError::InvalidValue);
                }
            } else if let (Some(a), Some(b)) = (old.first(), new.first())
                && a.update_from(b).is_err()
            {
                return Err(CudaError::InvalidValue);
            } else if old.is_empty() != new.is_empty() {
                return Err(CudaError::InvalidValue);
            }
            keep_attributes(old, &mut new);
            let count = u32::try_from(new.len()).map_err(|_| CudaError::InvalidValue)?;
            let end = at + 1 + old.len();
            ops.splice(at + 1..end, new);
            if let GraphOp::Node { ops: c, .. } = &mut ops[at] {
                *c = count;
            }
            Ok(())
        });
        // The guest's node is gone either way.
        let taken = self.take_node(from)?;
        drop_children(&mut self.graphs.lock(), &mut self.nodes.lock(), &taken);
        result
    }

    /// A kernel node's cooperative attribute (`cudaGraphKernelNodeSetAttribute`): the node's
    /// launch made cooperative or not (`set` some), answering what it is. A captured library
    /// call (its kernels are the library's) is never cooperative: making it so is
    /// `cudaErrorNotSupported`. Another type of node is `cudaErrorInvalidValue`.
    pub fn kernel_cooperative(&self, node: u64, set: Option<bool>) -> Result<bool, CudaError> {
        let (graph, index) = self.locate(node)?;
        let mut graphs = self.graphs.lock();
        let n = &mut graphs.get_mut(graph)?.nodes[index];
        if n.kind != NODE_KERNEL {
            return Err(CudaError::InvalidValue);
        }
        match n.ops.first_mut() {
            Some(GraphOp::Kernel { cooperative, .. }) => {
                if let Some(s) = set {
                    *cooperative = s;
                }
                Ok(*cooperative)
            }
            _ if set == Some(true) => Err(CudaError::NotSupported),
            _ => Ok(false),
        }
    }

    /// `cudaGraphNodeSetEnabled` (`enable` some) or `GetEnabled`: kernel, copy and memset
    /// nodes only. Answers whether the node is enabled.
    pub fn node_enabled(&self, exec: u64, node: u64, enable: Option<bool>) -> Result<bool, CudaError> {
        let kind = self.node_kind(node).map_err(|_| CudaError::InvalidValue)?;
        if ![NODE_KERNEL, NODE_MEMCPY, NODE_MEMSET].contains(&kind) {
            return Err(CudaError::InvalidValue);
        }
        let mut execs = self.execs.lock();
        let ops = execs.get_mut(exec)?;
        let at = find_marker(ops, node).ok_or(CudaError::InvalidValue)?;
        let GraphOp::Node { enabled, .. } = &mut ops[at] else { return Err(CudaError::InvalidValue) };
        if let Some(e) = enable {
            *enabled = e;
        }
        Ok(*enabled)
    }

    /// `cudaGraphClone`: a copy of `graph` with new node handles (child graphs copied too).
    pub fn clone_graph(&self, graph: u64, new: &NewHandle<'_>) -> Result<u64, CudaError> {
        let mut graphs = self.graphs.lock();
        let mut nodes = self.nodes.lock();
        let g = graphs.get(graph)?.clone();
        // CUDA does not clone graphs with memory nodes: their addresses are the graph's own.
        if has_memory_nodes(&g) {
            return Err(CudaError::NotSupported);
        }
        clone_into(&mut graphs, &mut nodes, g, new, 0)
    }

    /// `cudaGraphNodeFindInClone`: the node of `clone` at `node`'s place. A clone keeps its
    /// original's nodes in order, so the place is the index, when the graphs still have the
    /// same shape (`cudaErrorInvalidValue` when not).
    pub fn find_in_clone(&self, node: u64, clone: u64) -> Result<u64, CudaError> {
        let (graph, index) = self.locate(node)?;
        let graphs = self.graphs.lock();
        let (original, copy) = (graphs.get(graph)?, graphs.get(clone).map_err(|_| CudaError::InvalidValue)?);
        let same = graph != clone
            && original.nodes.len() == copy.nodes.len()
            && original.nodes.iter().zip(&copy.nodes).all(|(a, b)| a.kind == b.kind && a.deps == b.deps);
        if !same {
            return Err(CudaError::InvalidValue);
        }
        Ok(copy.nodes[index].handle)
    }

    /// Add a child graph node: `child` is copied into a graph the node owns.
    pub fn add_child_node(
        &self,
        graph: u64,
        child: u64,
        deps: Vec<usize>,
        graphs_full: &dyn Fn() -> CudaError,
        nodes_full: &dyn Fn() -> CudaError,
    ) -> Result<u64, CudaError> {
        if child == graph {
            return Err(CudaError::InvalidValue);
        }
        let owned = {
            let mut graphs = self.graphs.lock();
            graphs.get(graph)?;
            let g = graphs.get(child)?.clone();
            // CUDA refuses a child graph with memory nodes.
            if has_memory_nodes(&g) {
                return Err(CudaError::InvalidValue);
            }
            clone_into(&mut graphs, &mut self.nodes.lock(), g, &NewHandle { forced: None, full: graphs_full }, 0)?
        };
        let added = self.add_node(graph, NODE_GRAPH, vec![GraphOp::Child { graph: owned }], deps, nodes_full);
        if added.is_err() {
            drop_children(&mut self.graphs.lock(), &mut self.nodes.lock(), &[GraphOp::Child { graph: owned }]);
        }
        added
    }

    pub fn destroy(&self, graph: u64) -> Result<(), CudaError> {
        if self.captures.lock().is_capture_graph(graph) {
            return Err(CudaError::InvalidValue);
        }
        let mut graphs = self.graphs.lock();
        let mut nodes = self.nodes.lock();
        let g = graphs.remove(graph)?;
        nodes.retain(|(g, _)| *g != graph);
        for n in &g.nodes {
            drop_children(&mut graphs, &mut nodes, &n.ops);
        }
        Ok(())
    }

    /// An executable graph of `graph`'s work, ordered by its dependencies: each node's work
    /// after a marker naming the node (child graphs' work in their node's).
    ///
    /// A graph with memory nodes has one executable graph at a time (its allocations'
    /// addresses are the graph's): a second is `cudaErrorInvalidValue` until the first is
    /// destroyed, as in CUDA. So has a graph with conditional nodes (their handles' values
    /// are the graph's): a second is `cudaErrorNotSupported`, as CUDA 13 answers on an H200;
    /// an executable graph that runs one of the graph's conditional handles is one of it
    /// (handles are made for one graph), which also holds for those a restore brought back.
    pub fn instantiate(&self, graph: u64, new: &NewHandle<'_>) -> Result<u64, CudaError> {
        let ops = self.exec_of(graph)?;
        let memory = ops.iter().any(is_memory_op);
        if memory && self.mem.lock().instantiated.contains_key(&graph) {
            return Err(CudaError::InvalidValue);
        }
        let handles: Vec<u64> = ops
            .iter()
            .filter_map(|op| match op {
                GraphOp::ConditionalRun { handle, .. } => Some(*handle),
                _ => None,
            })
            .collect();
        let mut execs = self.execs.lock();
        let runs_them = |ops: &Vec<GraphOp>| {
            ops.iter().any(|op| matches!(op, GraphOp::ConditionalRun { handle, .. } if handles.contains(handle)))
        };
        if !handles.is_empty() && execs.iter().any(|(_, ops)| runs_them(ops)) {
            return Err(CudaError::NotSupported);
        }
        let exec = execs.add(ops, new)?;
        drop(execs);
        if memory {
            self.mem.lock().instantiated.insert(graph, exec);
        }
        Ok(exec)
    }

    /// The ops of an executable graph of `graph`.
    fn exec_of(&self, graph: u64) -> Result<Vec<GraphOp>, CudaError> {
        let graphs = self.graphs.lock();
        let g = graphs.get(graph)?;
        let mut out = Vec::new();
        for i in g.order_indices()? {
            let work = expand(&graphs, &g.nodes[i].ops, 0)?;
            let ops = u32::try_from(work.len()).map_err(|_| CudaError::InvalidValue)?;
            out.push(GraphOp::Node { handle: g.nodes[i].handle, ops, enabled: true });
            out.extend(work);
        }
        Ok(self.with_defaults(out))
    }

    /// `ops` after the setting of each conditional handle they read that was made with
    /// `cudaGraphCondAssignDefault` to its default (a 4-byte copy to its cell, first thing at
    /// every launch). A handle no longer known (a device reset) is left alone: the launch
    /// refuses it.
    fn with_defaults(&self, ops: Vec<GraphOp>) -> Vec<GraphOp> {
        fn read(ops: &[GraphOp], out: &mut Vec<u64>) {
            for op in ops {
                if let GraphOp::ConditionalRun { handle, bodies, .. } = op {
                    if !out.contains(handle) {
                        out.push(*handle);
                    }
                    for b in bodies {
                        read(b, out);
                    }
                }
            }
        }
        let mut handles = Vec::new();
        read(&ops, &mut handles);
        if handles.is_empty() {
            return ops;
        }
        let c = self.conditionals.lock();
        let mut out: Vec<GraphOp> = handles
            .iter()
            .filter_map(|h| c.handles.get(h).filter(|k| k.assign_default).map(|k| (h, k.default)))
            .map(|(&dst, value)| GraphOp::CopyToDevice {
                dst,
                dpitch: 4,
                data: value.to_ne_bytes().to_vec(),
                width: 4,
                height: 1,
            })
            .collect();
        out.extend(ops);
        out
    }

    /// The work of `graph`, ordered by its dependencies.
    pub fn ordered_ops(&self, graph: u64) -> Result<Vec<GraphOp>, CudaError> {
        let ops = {
            let graphs = self.graphs.lock();
            expand(&graphs, &graphs.get(graph)?.order()?, 0)?
        };
        Ok(self.with_defaults(ops))
    }

    /// The (function, data) of an executable graph's host nodes, in launch order.
    pub fn host_calls(&self, exec: u64) -> Result<Vec<(u64, u64)>, CudaError> {
        let execs = self.execs.lock();
        let ops = effective_ops(execs.get(exec)?);
        Ok(ops
            .iter()
            .filter_map(|op| match op {
                GraphOp::Host { func, data } => Some((*func, *data)),
                _ => None,
            })
            .collect())
    }

    /// The work of an executable graph, as it runs.
    pub fn exec_ops(&self, exec: u64) -> Result<Vec<GraphOp>, CudaError> {
        Ok(effective_ops(self.execs.lock().get(exec)?))
    }

    pub fn check_exec(&self, exec: u64) -> Result<(), CudaError> {
        self.execs.lock().get(exec).map(|_| ())
    }

    /// `cudaGraphExecUpdate`: an executable graph takes `graph`'s parameters when the work
    /// has the same shape and kernels. The `cudaGraphExecUpdateResult`.
    ///
    /// The executable graph keeps its nodes' handles (those of the graph it was instantiated
    /// from) and whether each is enabled; an executable graph without node markers (from an
    /// image of an older build) takes the new work as it is.
    pub fn update_exec(&self, exec: u64, graph: u64) -> Result<i32, CudaError> {
        let mut new = self.exec_of(graph)?;
        let mut execs = self.execs.lock();
        let exec = execs.get_mut(exec)?;
        let marked = exec.iter().any(|op| matches!(op, GraphOp::Node { .. }));
        if !marked {
            new.retain(|op| !matches!(op, GraphOp::Node { .. }));
        }
        let verdict = if exec.len() != new.len() {
            Err(UPDATE_TOPOLOGY_CHANGED)
        } else {
            exec.iter().zip(&new).try_for_each(|(a, b)| match (a, b) {
                (GraphOp::Node { ops: x, .. }, GraphOp::Node { ops: y, .. }) if x != y => Err(UPDATE_TOPOLOGY_CHANGED),
                _ => a.update_from(b),
            })
        };
        Ok(match verdict {
            Ok(()) => {
                for (old, op) in exec.iter().zip(new.iter_mut()) {
                    if let (GraphOp::Node { handle, enabled, .. }, GraphOp::Node { handle: h, enabled: e, .. }) =
                        (old, op)
                    {
                        *h = *handle;
                        *e = *enabled;
                    }
                }
                *exec = new;
                UPDATE_SUCCESS
            }
            Err(result) => result,
        })
    }

    pub fn destroy_exec(&self, exec: u64) -> Result<(), CudaError> {
        self.execs.lock().remove(exec)?;
        let mut mem = self.mem.lock();
        mem.instantiated.retain(|_, e| *e != exec);
        mem.auto_free.remove(&exec);
        Ok(())
    }

    /// Add an allocation node of the block at `dptr` (`size` bytes of `device`, just
    /// allocated by the caller, which frees it again when this fails).
    pub fn add_alloc_node(
        &self,
        graph: u64,
        deps: Vec<usize>,
        (dptr, size, device): (u64, u64, i32),
        nodes_full: &dyn Fn() -> CudaError,
    ) -> Result<u64, CudaError> {
        let op = GraphOp::MemAlloc { dptr, size, device };
        let node = self.add_node(graph, NODE_MEM_ALLOC, vec![op], deps, nodes_full)?;
        let mut mem = self.mem.lock();
        mem.blocks.insert(dptr, Block { size, device, live: false, in_capture: false });
        mem.note_high(device);
        Ok(node)
    }

    /// A block a capture's allocation node reserved (`cudaMallocAsync` on a capturing stream).
    pub fn add_captured_block(&self, dptr: u64, size: u64, device: i32) {
        let mut mem = self.mem.lock();
        mem.blocks.insert(dptr, Block { size, device, live: false, in_capture: true });
        mem.note_high(device);
    }

    /// Whether `dptr` starts a graph allocation.
    pub fn is_graph_block(&self, dptr: u64) -> bool {
        self.mem.lock().blocks.contains_key(&dptr)
    }

    /// Add a free node of `dptr` to `graph`: a graph allocation, or (`async_block`, which the
    /// caller checked) a block of `cudaMallocAsync`'s. A graph frees an address once.
    pub fn add_free_node(
        &self,
        graph: u64,
        deps: Vec<usize>,
        dptr: u64,
        async_block: bool,
        nodes_full: &dyn Fn() -> CudaError,
    ) -> Result<u64, CudaError> {
        if !async_block && !self.is_graph_block(dptr) {
            return Err(CudaError::InvalidValue);
        }
        {
            let graphs = self.graphs.lock();
            let g = graphs.get(graph)?;
            if g.nodes.iter().flat_map(|n| &n.ops).any(|op| matches!(op, GraphOp::MemFree { dptr: d } if *d == dptr)) {
                return Err(CudaError::InvalidValue);
            }
        }
        self.add_node(graph, NODE_MEM_FREE, vec![GraphOp::MemFree { dptr }], deps, nodes_full)
    }

    /// Whether `exec` has memory nodes; `auto_free`: it was instantiated with
    /// `cudaGraphInstantiateFlagAutoFreeOnLaunch`.
    pub fn exec_memory(&self, exec: u64, auto_free: bool) -> Result<bool, CudaError> {
        let memory = self.execs.lock().get(exec)?.iter().any(is_memory_op);
        if auto_free {
            self.mem.lock().auto_free.insert(exec);
        }
        Ok(memory)
    }

    /// Before a launch of `exec` (its work `ops`): its allocations become live and its frees
    /// free them, in order. A launch whose allocation is still live from an earlier one is
    /// `cudaErrorInvalidValue` (nothing changed), unless the executable graph frees on launch.
    pub fn launch_memory(&self, exec: u64, ops: &[GraphOp]) -> Result<(), CudaError> {
        if !ops.iter().any(is_memory_op) {
            return Ok(());
        }
        let mut mem = self.mem.lock();
        let auto_free = mem.auto_free.contains(&exec);
        let mut blocks = mem.blocks.clone();
        // The most each device uses while the launch runs.
        let mut peaks: HashMap<i32, u64> = HashMap::new();
        for op in ops {
            match op {
                GraphOp::MemAlloc { dptr, .. } => {
                    let b = blocks.get_mut(dptr).ok_or(CudaError::InvalidValue)?;
                    if b.live && !auto_free {
                        return Err(CudaError::InvalidValue);
                    }
                    b.live = true;
                    let device = b.device;
                    let used = blocks.values().filter(|b| b.device == device && b.live).map(|b| b.size).sum();
                    let peak = peaks.entry(device).or_default();
                    *peak = (*peak).max(used);
                }
                GraphOp::MemFree { dptr } => {
                    if let Some(b) = blocks.get_mut(dptr) {
                        b.live = false;
                    }
                }
                _ => {}
            }
        }
        mem.blocks = blocks;
        for (device, peak) in peaks {
            let high = mem.high.entry(device).or_default();
            high.0 = high.0.max(peak);
        }
        Ok(())
    }

    /// `cudaFree` or `cudaFreeAsync` of `dptr`: `None` when it is no graph allocation; a live
    /// one is freed (its block stays the graph's), a free one is `cudaErrorInvalidValue`.
    pub fn free_block(&self, dptr: u64) -> Option<Result<(), CudaError>> {
        let mut mem = self.mem.lock();
        let b = mem.blocks.get_mut(&dptr)?;
        Some(if std::mem::replace(&mut b.live, false) { Ok(()) } else { Err(CudaError::InvalidValue) })
    }

    /// The blocks no graph, executable graph or capture names any more and that are not live:
    /// removed here, for the caller to give back to the session's memory.
    pub fn release_unreferenced(&self) -> Vec<u64> {
        if self.mem.lock().blocks.is_empty() {
            return Vec::new();
        }
        let graphs = self.graphs.lock();
        let execs = self.execs.lock();
        let mut named = HashSet::new();
        let graph_ops = graphs.iter().flat_map(|(_, g)| g.nodes.iter().flat_map(|n| n.ops.iter()));
        for op in graph_ops.chain(execs.iter().flat_map(|(_, ops)| ops.iter())) {
            if let GraphOp::MemAlloc { dptr, .. } = op {
                named.insert(*dptr);
            }
        }
        let mut mem = self.mem.lock();
        let gone: Vec<u64> = mem
            .blocks
            .iter()
            .filter(|(a, b)| !b.live && !b.in_capture && !named.contains(*a))
            .map(|(a, _)| *a)
            .collect();
        for a in &gone {
            mem.blocks.remove(a);
        }
        gone
    }

    /// `cudaDeviceGetGraphMemAttribute` of `device`.
    pub fn mem_attribute(&self, device: i32, attr: i32) -> Result<u64, CudaError> {
        let mem = self.mem.lock();
        let (used, reserved) = mem.current(device);
        let (used_high, reserved_high) = mem.high.get(&device).copied().unwrap_or_default();
        match attr {
            mem_attr::USED_CURRENT => Ok(used),
            mem_attr::USED_HIGH => Ok(used_high.max(used)),
            mem_attr::RESERVED_CURRENT => Ok(reserved),
            mem_attr::RESERVED_HIGH => Ok(reserved_high.max(reserved)),
            _ => Err(CudaError::InvalidValue),
        }
    }

    /// `cudaDeviceSetGraphMemAttribute`: a high-water mark back to the current amount.
    pub fn reset_mem_high(&self, device: i32, attr: i32) -> Result<(), CudaError> {
        let mut mem = self.mem.lock();
        let (used, reserved) = mem.current(device);
        let high = mem.high.entry(device).or_default();
        match attr {
            mem_attr::USED_HIGH => high.0 = used,
            mem_attr::RESERVED_HIGH => high.1 = reserved,
            _ => return Err(CudaError::InvalidValue),
        }
        Ok(())
    }

    /// Whether the session holds graph memory or memory nodes, which checkpoints do not hold.
    pub fn holds_memory_nodes(&self) -> bool {
        if !self.mem.lock().blocks.is_empty() {
            return true;
        }
        let graphs = self.graphs.lock();
        let execs = self.execs.lock();
        graphs.iter().any(|(_, g)| has_memory_nodes(g)) || execs.iter().any(|(_, ops)| ops.iter().any(is_memory_op))
    }

    /// The graphs and executable graphs, for a checkpoint (captures in progress are not
    /// kept: a restored stream is not capturing). Their operations name functions, handles
    /// and addresses that a restore makes again with the same values, but for module
    /// variables' (see [`load`](Self::load)).
    pub fn snapshot(&self) -> Vec<u8> {
        let capturing = self.captures.lock().capture_graphs();
        let graphs = self.graphs.lock();
        let nodes = self.nodes.lock();
        let execs = self.execs.lock();
        let image = GraphsImage {
            graphs: graphs.iter().filter(|(h, _)| !capturing.contains(h)).map(|(h, g)| (h, g.clone())).collect(),
            execs: execs.iter().map(|(h, ops)| (h, ops.clone())).collect(),
            next: [graphs.next_counter(), nodes.next_counter(), execs.next_counter()],
        };
        phos_protocol::encode(&image)
    }

    /// Put back what [`snapshot`](Self::snapshot) took, under the same handles (an empty
    /// image, from a session without graphs, puts back nothing). `relocate` maps each device
    /// address the image's operations name to where it is now.
    pub fn load(&self, image: &[u8], relocate: &dyn Fn(u64) -> u64) -> Result<(), String> {
        if image.is_empty() {
            return Ok(());
        }
        let mut image: GraphsImage =
            phos_protocol::decode(image).map_err(|e| format!("the graphs do not decode: {e}"))?;
        let graph_ops = image.graphs.iter_mut().flat_map(|(_, g)| g.nodes.iter_mut()).flat_map(|n| n.ops.iter_mut());
        for op in graph_ops.chain(image.execs.iter_mut().flat_map(|(_, ops)| ops.iter_mut())) {
            op.relocate(relocate);
        }
        let mut graphs = self.graphs.lock();
        let mut nodes = self.nodes.lock();
        let mut execs = self.execs.lock();
        for (handle, graph) in image.graphs {
            for (index, node) in graph.nodes.iter().enumerate() {
                if node.deps.iter().any(|&d| d >= graph.nodes.len()) {
                    return Err(format!("graph {handle:#x}: a node follows one the graph does not have"));
                }
                nodes
                    .insert_at(node.handle, (handle, index))
                    .map_err(|e| format!("graph node {:#x}: {e:?}", node.handle))?;
            }
            graphs.insert_at(handle, graph).map_err(|e| format!("graph {handle:#x}: {e:?}"))?;
        }
        for (handle, ops) in image.execs {
            execs.insert_at(handle, ops).map_err(|e| format!("executable graph {handle:#x}: {e:?}"))?;
        }
        // Each conditional node's body graphs belong to the graph of the node.
        let mut c = self.conditionals.lock();
        for (graph, g) in graphs.iter() {
            for op in g.nodes.iter().flat_map(|n| &n.ops) {
                if let GraphOp::Conditional { bodies, .. } = op {
                    for &b in bodies {
                        c.parents.insert(b, graph);
                    }
                }
            }
        }
        drop(c);
        let [g, n, e] = image.next;
        graphs.set_next_counter(g);
        nodes.set_next_counter(n);
        execs.set_next_counter(e);
        Ok(())
    }

    /// Forget every capture and graph.
    pub fn release_all(&self) {
        self.captures.update(|c| c.clear());
        self.graphs.lock().drain();
        self.execs.lock().drain();
        self.nodes.lock().drain();
        *self.mem.lock() = GraphMemory::default();
        *self.conditionals.lock() = Conditionals::default();
    }
}

/// A node's parameters as words: by its type, the first op's fields (a kernel's parameter
/// bytes after its fields, in words), and for a copy of several slices, the distance between
/// slices and how many there are.
/// A kernel node given new parameters keeps its attributes: its launch stays cooperative.
fn keep_attributes(old: &[GraphOp], new: &mut [GraphOp]) {
    if let (Some(GraphOp::Kernel { cooperative: true, .. }), Some(GraphOp::Kernel { cooperative, .. })) =
        (old.first(), new.first_mut())
    {
        *cooperative = true;
    }
}

fn node_params(node: &Node) -> Vec<u64> {
    let slices = node.ops.len() as u64;
    let slice_step = |a: u64, f: &dyn Fn(&GraphOp) -> u64| node.ops.get(1).map(|o| f(o).wrapping_sub(a)).unwrap_or(0);
    match node.ops.first() {
        Some(GraphOp::Kernel { function, grid, block, shared_mem, params, .. }) => {
            let mut w = vec![
                0,
                *function,
                u64::from(grid.x),
                u64::from(grid.y),
                u64::from(grid.z),
                u64::from(block.x),
                u64::from(block.y),
                u64::from(block.z),
                u64::from(*shared_mem),
                params.len() as u64,
            ];
            w.extend(params.chunks(8).map(|c| {
                let mut b = [0u8; 8];
                b[..c.len()].copy_from_slice(c);
                u64::from_ne_bytes(b)
            }));
            w
        }
        Some(GraphOp::Memset { dst, pitch, value, width, height }) => {
            vec![2, *dst, *pitch, u64::from(*value), *width, *height]
        }
        Some(GraphOp::CopyOnDevice { dst, dpitch, src, spitch, width, height }) => {
            let dslice = slice_step(*dst, &|o| if let GraphOp::CopyOnDevice { dst, .. } = o { *dst } else { 0 });
            let sslice = slice_step(*src, &|o| if let GraphOp::CopyOnDevice { src, .. } = o { *src } else { 0 });
            vec![1, *dst, *dpitch, *src, *spitch, *width, *height, slices, dslice, sslice, 0]
        }
        Some(GraphOp::CopyToDevice { dst, dpitch, width, height, .. }) => {
            let dslice = slice_step(*dst, &|o| if let GraphOp::CopyToDevice { dst, .. } = o { *dst } else { 0 });
            vec![1, *dst, *dpitch, 0, *width, *width, *height, slices, dslice, 0, 1]
        }
        Some(GraphOp::CopyPinned { device, host, count, to_device }) => {
            let (dst, src) = if *to_device { (*device, *host) } else { (*host, *device) };
            vec![1, dst, *count, src, *count, *count, 1, 1, 0, 0, if *to_device { 1 } else { 2 }]
        }
        Some(GraphOp::Host { func, data }) => vec![3, *func, *data],
        Some(GraphOp::Child { graph }) => vec![4, *graph],
        Some(GraphOp::EventWait { event }) => vec![6, *event],
        Some(GraphOp::EventRecord { event }) => vec![7, *event],
        Some(GraphOp::MemAlloc { dptr, size, device }) => vec![10, *dptr, *size, *device as u64],
        Some(GraphOp::MemFree { dptr }) => vec![11, *dptr],
        Some(GraphOp::Conditional { handle, kind, bodies }) => {
            let mut w = vec![13, *handle, *kind as u64, bodies.len() as u64];
            w.extend(bodies);
            w
        }
        // An empty node, a library call (parameters the guest cannot read), a child graph
        // node of an older image (its work copied in).
        _ => vec![u64::MAX],
    }
}

/// `ops` with child graph nodes' graphs replaced by their work, in order.
fn expand(graphs: &HandleTable<Graph>, ops: &[GraphOp], depth: usize) -> Result<Vec<GraphOp>, CudaError> {
    if depth > MAX_NESTING {
        return Err(CudaError::InvalidValue);
    }
    let mut out = Vec::with_capacity(ops.len());
    for op in ops {
        match op {
            GraphOp::Child { graph } => out.extend(expand(graphs, &graphs.get(*graph)?.order()?, depth + 1)?),
            GraphOp::Conditional { handle, kind, bodies } => {
                let mut work = Vec::with_capacity(bodies.len());
                for b in bodies {
                    let body = expand(graphs, &graphs.get(*b)?.order()?, depth + 1)?;
                    // What CUDA allows in a body: kernel, empty, child graph, memset, copy and
                    // conditional nodes.
                    let allowed = |op: &GraphOp| {
                        !matches!(
                            op,
                            GraphOp::Host { .. }
                                | GraphOp::EventRecord { .. }
                                | GraphOp::EventWait { .. }
                                | GraphOp::MemAlloc { .. }
                                | GraphOp::MemFree { .. }
                        )
                    };
                    if !body.iter().all(allowed) {
                        return Err(CudaError::InvalidValue);
                    }
                    work.push(body);
                }
                out.push(GraphOp::ConditionalRun { handle: *handle, kind: *kind, bodies: work });
            }
            op => out.push(op.clone()),
        }
    }
    Ok(out)
}

/// Destroy the graphs child graph nodes' `ops` own.
fn drop_children(graphs: &mut HandleTable<Graph>, nodes: &mut HandleTable<(u64, usize)>, ops: &[GraphOp]) {
    for op in ops {
        let owned: &[u64] = match op {
            GraphOp::Child { graph } => std::slice::from_ref(graph),
            GraphOp::Conditional { bodies, .. } => bodies,
            _ => continue,
        };
        for graph in owned {
            if let Ok(g) = graphs.remove(*graph) {
                nodes.retain(|(owner, _)| owner != graph);
                for n in &g.nodes {
                    drop_children(graphs, nodes, &n.ops);
                }
            }
        }
    }
}

/// Put a copy of `g` in `graphs` with new node handles (the graphs its child graph nodes own
/// copied too); its handle.
fn clone_into(
    graphs: &mut HandleTable<Graph>,
    nodes: &mut HandleTable<(u64, usize)>,
    mut g: Graph,
    new: &NewHandle<'_>,
    depth: usize,
) -> Result<u64, CudaError> {
    if depth > MAX_NESTING {
        return Err(CudaError::InvalidValue);
    }
    for n in &mut g.nodes {
        for op in &mut n.ops {
            let owned: &mut [u64] = match op {
                GraphOp::Child { graph } => std::slice::from_mut(graph),
                GraphOp::Conditional { bodies, .. } => bodies,
                _ => continue,
            };
            for graph in owned {
                let child = graphs.get(*graph)?.clone();
                *graph = clone_into(graphs, nodes, child, &NewHandle { forced: None, full: new.full }, depth + 1)?;
            }
        }
    }
    let handle = graphs.add(Graph::default(), new)?;
    let full = || CudaError::MemoryAllocation;
    for (i, n) in g.nodes.iter_mut().enumerate() {
        match nodes.add((handle, i), &NewHandle { forced: None, full: &full }) {
            Ok(h) => n.handle = h,
            Err(e) => {
                nodes.retain(|(owner, _)| *owner != handle);
                graphs.remove(handle).ok();
                return Err(e);
            }
        }
    }
    *graphs.get_mut(handle)? = g;
    Ok(handle)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn registry() -> GraphRegistry {
        GraphRegistry::new(GraphLimits { graphs: 8, nodes: 64, execs: 8 })
    }

    /// A graph captured on stream 10: each op a node after the one before it.
    fn captured(r: &GraphRegistry, ops: Vec<GraphOp>, new: &NewHandle<'_>) -> u64 {
        r.begin_capture(10, new).unwrap();
        for op in ops {
            r.captures.lock().record(10, || op).unwrap().unwrap();
        }
        r.end_capture(10).unwrap()
    }

    #[test]
    fn a_capture_in_progress_is_a_graph_kept_from_checkpoints_and_destruction() {
        let full = || CudaError::MemoryAllocation;
        let new = NewHandle { forced: None, full: &full };
        let r = registry();
        let memset = GraphOp::Memset { dst: 0x1000, pitch: 4, value: 7, width: 4, height: 1 };
        r.begin_capture(10, &new).unwrap();
        assert_eq!(r.begin_capture(10, &new), Err(CudaError::IllegalState));
        r.captures.lock().record(10, || memset.clone()).unwrap().unwrap();
        let (g, deps) = r.captures.lock().graph_of(10).unwrap();
        assert_eq!(r.nodes(g, 1).unwrap(), (deps[0].to_ne_bytes().to_vec(), 1));
        assert_eq!(r.destroy(g), Err(CudaError::InvalidValue));
        assert_eq!(r.destroy_node(deps[0]), Err(CudaError::InvalidValue));
        let restored = registry();
        restored.load(&r.snapshot(), &|a| a).unwrap();
        assert!(restored.nodes(g, 0).is_err(), "not in the image");
        assert_eq!(r.end_capture(10), Ok(g));
        assert_eq!(r.ordered_ops(g).unwrap(), vec![memset]);
        // An invalidated capture's graph goes.
        r.begin_capture(10, &new).unwrap();
        let (broken, _) = r.captures.lock().graph_of(10).unwrap();
        r.captures.lock().refuse(10);
        assert_eq!(r.end_capture(10), Err(CudaError::StreamCaptureInvalidated));
        assert!(r.nodes(broken, 0).is_err());
        r.destroy(g).unwrap();
    }

    fn library_op(position: Option<u64>) -> GraphOp {
        GraphOp::Library { api: 2, function: 7, device: 0, payload: vec![1, 2, 3], position }
    }

    #[test]
    fn graphs_and_executable_graphs_come_back_under_their_handles() {
        let full = || CudaError::MemoryAllocation;
        let new = NewHandle { forced: None, full: &full };
        let r = registry();
        let memset = GraphOp::Memset { dst: 0x1000, pitch: 4, value: 7, width: 4, height: 1 };
        let g = captured(&r, vec![memset.clone(), library_op(Some(9))], &new);
        let exec = r.instantiate(g, &new).unwrap();
        let (nodes, count) = r.nodes(g, 2).unwrap();
        assert_eq!(count, 2);
        let second = u64::from_ne_bytes(nodes[8..16].try_into().unwrap());
        assert_eq!(r.node_kind(second).unwrap(), crate::capture::NODE_KERNEL, "a library call is a kernel node");
        let image = r.snapshot();

        let restored = registry();
        restored.load(&image, &|a| a).unwrap();
        assert_eq!(restored.exec_ops(exec).unwrap(), vec![memset, library_op(Some(9))]);
        assert_eq!(restored.nodes(g, 2).unwrap(), (nodes, 2));
        assert_eq!(restored.node_kind(second).unwrap(), crate::capture::NODE_KERNEL);
        // New handles do not collide with the restored ones.
        let other = restored.create(&new).unwrap();
        assert_ne!(other, g);
        // An empty image (a session without graphs) puts back nothing; a bad one is refused.
        registry().load(&[], &|a| a).unwrap();
        assert!(registry().load(&image[..image.len() - 1], &|a| a).is_err());
        assert!(restored.load(&image, &|a| a).is_err(), "handles in use are refused");
    }

    #[test]
    fn a_restore_moves_the_addresses_of_copies_and_memsets() {
        let full = || CudaError::MemoryAllocation;
        let new = NewHandle { forced: None, full: &full };
        let r = registry();
        let copy = GraphOp::CopyOnDevice { dst: 0x1000, dpitch: 4, src: 0x2004, spitch: 4, width: 4, height: 1 };
        let g = captured(&r, vec![copy], &new);
        let exec = r.instantiate(g, &new).unwrap();
        let restored = registry();
        // The variable at 0x2000 moved to 0x8000.
        restored.load(&r.snapshot(), &|a| if (0x2000..0x2010).contains(&a) { a - 0x2000 + 0x8000 } else { a }).unwrap();
        let moved = GraphOp::CopyOnDevice { dst: 0x1000, dpitch: 4, src: 0x8004, spitch: 4, width: 4, height: 1 };
        assert_eq!(restored.exec_ops(exec).unwrap(), vec![moved.clone()]);
        let relaunched = restored.instantiate(g, &new).unwrap();
        assert_eq!(restored.exec_ops(relaunched).unwrap(), vec![moved]);
    }

    #[test]
    fn an_update_keeps_library_calls_of_the_same_function() {
        let a = library_op(None);
        assert_eq!(a.update_from(&library_op(Some(3))), Ok(()));
        let other = GraphOp::Library { api: 2, function: 8, device: 0, payload: vec![], position: None };
        assert_eq!(a.update_from(&other), Err(crate::capture::UPDATE_FUNCTION_CHANGED));
        let kernel = GraphOp::Kernel {
            function: 1,
            grid: Default::default(),
            block: Default::default(),
            shared_mem: 0,
            params: vec![],
            cooperative: false,
        };
        assert_eq!(a.update_from(&kernel), Err(crate::capture::UPDATE_NODE_TYPE_CHANGED));
    }

    #[test]
    fn graph_allocations_live_from_launch_to_free() {
        let full = || CudaError::MemoryAllocation;
        let new = NewHandle { forced: None, full: &full };
        let r = registry();
        let g = r.create(&new).unwrap();
        let alloc = r.add_alloc_node(g, vec![], (0x4000, 64, 0), &full).unwrap();
        assert_eq!(r.node_kind(alloc).unwrap(), NODE_MEM_ALLOC);
        assert_eq!(r.query(query::PARAMS, alloc).unwrap(), vec![10, 0x4000, 64, 0]);
        // Free nodes name a graph allocation (or a block the caller vouches for), once.
        assert_eq!(r.add_free_node(g, vec![0], 0x8000, false, &full).unwrap_err(), CudaError::InvalidValue);
        let kept = r.create(&new).unwrap();
        r.add_alloc_node(kept, vec![], (0x5000, 32, 0), &full).unwrap();
        assert_eq!(r.clone_graph(kept, &new).unwrap_err(), CudaError::NotSupported);
        let parent = r.create(&new).unwrap();
        assert_eq!(r.add_child_node(parent, kept, vec![], &full, &full).unwrap_err(), CudaError::InvalidValue);
        assert!(r.holds_memory_nodes());
        // One executable graph per graph; a live allocation fails the next launch.
        let exec = r.instantiate(kept, &new).unwrap();
        assert_eq!(r.instantiate(kept, &new).unwrap_err(), CudaError::InvalidValue);
        assert!(r.exec_memory(exec, false).unwrap());
        let ops = r.exec_ops(exec).unwrap();
        r.launch_memory(exec, &ops).unwrap();
        assert_eq!(r.mem_attribute(0, mem_attr::USED_CURRENT).unwrap(), 32);
        assert_eq!(r.launch_memory(exec, &ops).unwrap_err(), CudaError::InvalidValue);
        assert_eq!(r.free_block(0x5000), Some(Ok(())));
        assert_eq!(r.free_block(0x5000), Some(Err(CudaError::InvalidValue)));
        assert_eq!(r.free_block(0x9000), None);
        r.launch_memory(exec, &ops).unwrap();
        r.exec_memory(exec, true).unwrap();
        r.launch_memory(exec, &ops).unwrap();
        assert_eq!(r.mem_attribute(0, mem_attr::RESERVED_CURRENT).unwrap(), 96);
        // A graph that frees what it allocates can be launched again and again.
        r.add_free_node(g, vec![0], 0x4000, false, &full).unwrap();
        assert_eq!(r.add_free_node(g, vec![0], 0x4000, false, &full).unwrap_err(), CudaError::InvalidValue);
        let freeing = r.instantiate(g, &new).unwrap();
        let ops = r.exec_ops(freeing).unwrap();
        r.launch_memory(freeing, &ops).unwrap();
        r.launch_memory(freeing, &ops).unwrap();
        // Blocks go back once nothing names them and they are free.
        r.destroy(g).unwrap();
        assert!(r.release_unreferenced().is_empty(), "its executable graph names it");
        r.destroy_exec(freeing).unwrap();
        assert_eq!(r.release_unreferenced(), vec![0x4000]);
        r.destroy_exec(exec).unwrap();
        r.destroy(kept).unwrap();
        assert!(r.release_unreferenced().is_empty(), "still live");
        assert_eq!(r.free_block(0x5000), Some(Ok(())));
        assert_eq!(r.release_unreferenced(), vec![0x5000]);
        assert_eq!(r.mem_attribute(0, mem_attr::USED_HIGH).unwrap(), 96, "both live during a launch");
        r.reset_mem_high(0, mem_attr::USED_HIGH).unwrap();
        assert_eq!(r.mem_attribute(0, mem_attr::USED_HIGH).unwrap(), 0);
        assert!(!r.holds_memory_nodes());
    }

    #[test]
    fn a_graph_kernel_nodes_cooperative_attribute_is_kept_by_new_parameters_and_clones() {
        let full = || CudaError::MemoryAllocation;
        let new = NewHandle { forced: None, full: &full };
        let r = registry();
        let kernel = |shared_mem| GraphOp::Kernel {
            function: 1,
            grid: Default::default(),
            block: Default::default(),
            shared_mem,
            params: vec![],
            cooperative: false,
        };
        let memset = GraphOp::Memset { dst: 0x1000, pitch: 4, value: 1, width: 4, height: 1 };
        let g = captured(&r, vec![kernel(0), memset, library_op(None)], &new);
        let (nodes, _) = r.nodes(g, 3).unwrap();
        let h: Vec<u64> = nodes.chunks_exact(8).map(|c| u64::from_ne_bytes(c.try_into().unwrap())).collect();
        assert!(!r.kernel_cooperative(h[0], None).unwrap());
        assert!(r.kernel_cooperative(h[0], Some(true)).unwrap());
        // Not a kernel node; a library call is never cooperative.
        assert_eq!(r.kernel_cooperative(h[1], None).unwrap_err(), CudaError::InvalidValue);
        assert!(!r.kernel_cooperative(h[2], None).unwrap());
        assert_eq!(r.kernel_cooperative(h[2], Some(true)).unwrap_err(), CudaError::NotSupported);
        assert_eq!(r.kernel_cooperative(0xdead, None).unwrap_err(), CudaError::InvalidValue);
        // New parameters keep it, in the graph and in an executable graph.
        let exec = r.instantiate(g, &new).unwrap();
        let scratch = r.create(&new).unwrap();
        let from = r.add_node(scratch, NODE_KERNEL, vec![kernel(16)], vec![], &full).unwrap();
        r.set_node(h[0], from).unwrap();
        assert!(r.kernel_cooperative(h[0], None).unwrap());
        let from = r.add_node(scratch, NODE_KERNEL, vec![kernel(32)], vec![], &full).unwrap();
        r.set_exec_node(exec, h[0], from).unwrap();
        let ops = r.exec_ops(exec).unwrap();
        assert!(
            ops.iter().any(|op| matches!(op, GraphOp::Kernel { shared_mem: 32, cooperative: true, .. })),
            "{ops:?}"
        );
        // A clone and an instantiation carry it.
        let clone = r.clone_graph(g, &new).unwrap();
        let (nodes, _) = r.nodes(clone, 3).unwrap();
        assert!(r.kernel_cooperative(u64::from_ne_bytes(nodes[..8].try_into().unwrap()), None).unwrap());
        let again = r.instantiate(g, &new).unwrap();
        let ops = r.exec_ops(again).unwrap();
        assert!(
            ops.iter().any(|op| matches!(op, GraphOp::Kernel { shared_mem: 16, cooperative: true, .. })),
            "{ops:?}"
        );
    }

    #[test]
    fn conditional_nodes_own_their_bodies_and_run_as_their_work() {
        let full = || CudaError::MemoryAllocation;
        let new = NewHandle { forced: None, full: &full };
        // Room for the bodies and a clone's copies of them.
        let r = GraphRegistry::new(GraphLimits { graphs: 16, nodes: 64, execs: 8 });
        let g = r.create(&new).unwrap();
        let other = r.create(&new).unwrap();
        assert_eq!(r.add_conditional_handle(g, 0x9000, 1, 2), Err(CudaError::InvalidValue));
        r.add_conditional_handle(g, 0x9000, 1, 1).unwrap();
        r.add_conditional_handle(other, 0x9100, 0, 0).unwrap();
        assert_eq!(r.conditional_handles(), vec![(0x9000, g, 1, 1), (0x9100, other, 0, 0)]);
        // Sizes a type does not take, a handle of another graph, a type CUDA has not.
        for (handle, kind, size) in
            [(0x9000, COND_WHILE, 2), (0x9000, COND_IF, 3), (0x9100, COND_IF, 1), (0x9000, 7, 1)]
        {
            assert_eq!(
                r.add_conditional_node(g, vec![], handle, kind, size, &full, &full).unwrap_err(),
                CudaError::InvalidValue
            );
        }
        let (node, bodies) = r.add_conditional_node(g, vec![], 0x9000, COND_IF, 2, &full, &full).unwrap();
        assert_eq!(r.node_kind(node).unwrap(), NODE_CONDITIONAL);
        assert_eq!(r.query(query::PARAMS, node).unwrap(), vec![13, 0x9000, COND_IF as u64, 2, bodies[0], bodies[1]]);
        let memset = GraphOp::Memset { dst: 0x1000, pitch: 4, value: 3, width: 4, height: 1 };
        r.add_node(bodies[0], NODE_MEMSET, vec![memset.clone()], vec![], &full).unwrap();
        // A body may hold a conditional node of the outer graph's handle.
        let (inner, _) = r.add_conditional_node(bodies[0], vec![0], 0x9000, COND_WHILE, 1, &full, &full).unwrap();
        assert_eq!(r.node_kind(inner).unwrap(), NODE_CONDITIONAL);
        let exec = r.instantiate(g, &new).unwrap();
        let ops = r.exec_ops(exec).unwrap();
        let default =
            GraphOp::CopyToDevice { dst: 0x9000, dpitch: 4, data: 1u32.to_ne_bytes().to_vec(), width: 4, height: 1 };
        let nested = GraphOp::ConditionalRun { handle: 0x9000, kind: COND_WHILE, bodies: vec![vec![]] };
        let run = GraphOp::ConditionalRun { handle: 0x9000, kind: COND_IF, bodies: vec![vec![memset, nested], vec![]] };
        assert_eq!(ops, vec![default.clone(), run.clone()], "the default first, then the node's work");
        assert_eq!(r.update_exec(exec, g).unwrap(), UPDATE_SUCCESS);
        // A checkpoint's graphs and handles put back: the same work, and bodies still know
        // the graph whose handle their nodes may use.
        let back = GraphRegistry::new(GraphLimits { graphs: 16, nodes: 64, execs: 8 });
        back.load(&r.snapshot(), &|a| a).unwrap();
        for (cell, graph, default, flags) in r.conditional_handles() {
            back.load_conditional_handle(cell, graph, default, flags).unwrap();
        }
        assert_eq!(back.load_conditional_handle(0x9000, g, 1, 1), Err(CudaError::InvalidValue), "twice");
        assert_eq!(back.exec_ops(exec).unwrap(), vec![default.clone(), run.clone()]);
        assert_eq!(back.ordered_ops(g).unwrap(), vec![default, run]);
        back.add_conditional_node(bodies[0], vec![], 0x9000, COND_IF, 1, &full, &full).unwrap();
        // No setters; a clone copies the bodies; a host node is no body's.
        let scratch = r.create(&new).unwrap();
        let from = r.add_conditional_node(scratch, vec![], 0x9000, COND_IF, 1, &full, &full);
        assert_eq!(from.unwrap_err(), CudaError::InvalidValue, "a handle of another graph");
        let clone = r.clone_graph(g, &new).unwrap();
        let (first, _) = r.nodes(clone, 1).unwrap();
        let cloned = r.query(query::PARAMS, u64::from_ne_bytes(first[..8].try_into().unwrap())).unwrap();
        assert!(cloned[4] != bodies[0] && cloned[5] != bodies[1]);
        r.add_node(bodies[1], crate::capture::NODE_HOST, vec![GraphOp::Host { func: 1, data: 2 }], vec![], &full)
            .unwrap();
        assert_eq!(r.instantiate(g, &new).unwrap_err(), CudaError::InvalidValue);
        // The bodies go with their graph.
        r.destroy(g).unwrap();
        assert!(r.nodes(bodies[0], 0).is_err() && r.nodes(bodies[1], 0).is_err());
        assert_eq!(r.exec_ops(exec).unwrap().len(), 2, "the executable graph keeps its work");
    }

    #[test]
    fn nodes_are_destroyed_set_cloned_and_disabled_in_executable_graphs() {
        let full = || CudaError::MemoryAllocation;
        let new = NewHandle { forced: None, full: &full };
        let r = registry();
        let memset = |value| GraphOp::Memset { dst: 0x1000, pitch: 4, value, width: 4, height: 1 };
        let g = captured(&r, vec![memset(1), memset(2), memset(3)], &new);
        let (nodes, _) = r.nodes(g, 3).unwrap();
        let h: Vec<u64> = nodes.chunks_exact(8).map(|c| u64::from_ne_bytes(c.try_into().unwrap())).collect();
        assert_eq!(r.query(query::EDGES, g).unwrap(), vec![h[0], h[1], h[1], h[2]]);
        assert_eq!(r.query(query::ROOTS, g).unwrap(), vec![h[0]]);
        let exec = r.instantiate(g, &new).unwrap();
        // Disabled: its work is skipped; set: the executable graph's copy only.
        r.node_enabled(exec, h[1], Some(false)).unwrap();
        assert_eq!(r.exec_ops(exec).unwrap(), vec![memset(1), memset(3)]);
        let scratch = r.create(&new).unwrap();
        let from = r.add_node(scratch, NODE_MEMSET, vec![memset(9)], vec![], &full).unwrap();
        r.set_exec_node(exec, h[2], from).unwrap();
        assert_eq!(r.exec_ops(exec).unwrap(), vec![memset(1), memset(9)]);
        assert_eq!(r.query(query::PARAMS, h[2]).unwrap()[3], 3, "the graph keeps its parameters");
        assert!(r.query(query::PARAMS, from).is_err(), "the scratch node is gone");
        // A clone has the same shape; a destroyed node takes its edges along.
        let clone = r.clone_graph(g, &new).unwrap();
        let found = r.find_in_clone(h[1], clone).unwrap();
        assert_ne!(found, h[1]);
        r.destroy_node(h[1]).unwrap();
        assert_eq!(r.query(query::EDGES, g).unwrap(), Vec::<u64>::new());
        assert_eq!(r.query(query::ROOTS, g).unwrap(), vec![h[0], h[2]]);
        assert_eq!(r.node_kind(h[2]).unwrap(), NODE_MEMSET);
        assert_eq!(r.find_in_clone(h[2], clone).unwrap_err(), CudaError::InvalidValue, "no longer its shape");
        assert_eq!(r.query(query::DEPENDENCIES, found).unwrap().len(), 1);
        // The executable graph and the clone come back from an image.
        let restored = registry();
        restored.load(&r.snapshot(), &|a| a).unwrap();
        assert_eq!(restored.exec_ops(exec).unwrap(), vec![memset(1), memset(9)]);
        assert!(restored.node_enabled(exec, found, None).is_err(), "a node of another graph");
        // A child graph node owns a copy of the child, destroyed with it.
        let parent = r.create(&new).unwrap();
        let child = r.add_child_node(parent, clone, vec![], &full, &full).unwrap();
        let owned = r.query(query::PARAMS, child).unwrap()[1];
        assert_ne!(owned, clone);
        assert_eq!(r.ordered_ops(parent).unwrap(), vec![memset(1), memset(2), memset(3)]);
        r.destroy(parent).unwrap();
        assert!(r.ordered_ops(owned).is_err());
    }
}
