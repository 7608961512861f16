//! The session's stream captures, graphs, their nodes and executable graphs.
//!
//! Invariants: a node handle names a node of a live graph (destroying a graph drops its node
//! handles); an executable graph is a copy of its graph's work in an order its dependencies
//! allow, and outlives the graph. Locks are taken in the order `graphs`, `nodes`.

use parking_lot::Mutex;
use phos_protocol::CudaError;
use phos_protocol::apis::HandleKind;

use super::handles::{HandleTable, NewHandle};
use crate::capture::{CaptureState, Captures, Graph, GraphOp, Node, UPDATE_SUCCESS, UPDATE_TOPOLOGY_CHANGED};

pub struct GraphRegistry {
    /// Stream captures in progress (behind a flag: calls look at it without a lock while
    /// nothing captures).
    pub captures: CaptureState,
    graphs: Mutex<HandleTable<Graph>>,
    /// Node handles: (graph handle, index of the node in it).
    nodes: Mutex<HandleTable<(u64, usize)>>,
    execs: Mutex<HandleTable<Vec<GraphOp>>>,
}

/// The objects of each kind a session may hold at once.
pub struct GraphLimits {
    pub graphs: u64,
    pub nodes: u64,
    pub execs: u64,
}

impl GraphRegistry {
    pub fn new(limits: GraphLimits) -> Self {
        GraphRegistry {
            captures: CaptureState::default(),
            graphs: Mutex::new(HandleTable::new(HandleKind::Graph, limits.graphs)),
            nodes: Mutex::new(HandleTable::new(HandleKind::GraphNode, limits.nodes)),
            execs: Mutex::new(HandleTable::new(HandleKind::GraphExec, limits.execs)),
        }
    }

    /// An empty graph.
    pub fn create(&self, new: &NewHandle<'_>) -> Result<u64, CudaError> {
        self.graphs.lock().add(Graph::default(), new)
    }

    /// A graph of captured work: each operation a node after the one before it.
    /// `nodes_full` answers for a node past the session's limit.
    pub fn create_captured(
        &self,
        ops: Vec<GraphOp>,
        new: &NewHandle<'_>,
        nodes_full: &dyn Fn() -> CudaError,
    ) -> Result<u64, CudaError> {
        let graph = self.create(new)?;
        for op in ops {
            let deps = self.graphs.lock().get(graph)?.nodes.len().checked_sub(1).into_iter().collect();
            self.add_node(graph, Graph::kind_of(&op), vec![op], deps, nodes_full)?;
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

    pub fn destroy(&self, graph: u64) -> Result<(), CudaError> {
        self.graphs.lock().remove(graph)?;
        self.nodes.lock().retain(|(g, _)| *g != graph);
        Ok(())
    }

    /// An executable graph of `graph`'s work, ordered by its dependencies.
    pub fn instantiate(&self, graph: u64, new: &NewHandle<'_>) -> Result<u64, CudaError> {
        let ops = self.graphs.lock().get(graph)?.order()?;
        self.execs.lock().add(ops, new)
    }

    /// The work of an executable graph.
    pub fn exec_ops(&self, exec: u64) -> Result<Vec<GraphOp>, CudaError> {
        Ok(self.execs.lock().get(exec)?.clone())
    }

    pub fn check_exec(&self, exec: u64) -> Result<(), CudaError> {
        self.execs.lock().get(exec).map(|_| ())
    }

    /// `cudaGraphExecUpdate`: an executable graph takes `graph`'s parameters when the work
    /// has the same shape and kernels. The `cudaGraphExecUpdateResult`.
    pub fn update_exec(&self, exec: u64, graph: u64) -> Result<i32, CudaError> {
        let new = self.graphs.lock().get(graph)?.order()?;
        let mut execs = self.execs.lock();
        let exec = execs.get_mut(exec)?;
        let verdict = if exec.len() != new.len() {
            Err(UPDATE_TOPOLOGY_CHANGED)
        } else {
            exec.iter().zip(&new).try_for_each(|(a, b)| a.update_from(b))
        };
        Ok(match verdict {
            Ok(()) => {
                *exec = new;
                UPDATE_SUCCESS
            }
            Err(result) => result,
        })
    }

    pub fn destroy_exec(&self, exec: u64) -> Result<(), CudaError> {
        self.execs.lock().remove(exec).map(|_| ())
    }

    /// Forget every capture and graph.
    pub fn release_all(&self) {
        self.captures.update(|c| *c = Captures::default());
        self.graphs.lock().drain();
        self.execs.lock().drain();
        self.nodes.lock().drain();
    }
}
