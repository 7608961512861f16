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

    /// The work of `graph`, ordered by its dependencies: what a child graph node copies.
    pub fn ordered_ops(&self, graph: u64) -> Result<Vec<GraphOp>, CudaError> {
        self.graphs.lock().get(graph)?.order()
    }

    /// The (function, data) of an executable graph's host nodes, in launch order.
    pub fn host_calls(&self, exec: u64) -> Result<Vec<(u64, u64)>, CudaError> {
        let execs = self.execs.lock();
        let ops = execs.get(exec)?;
        Ok(ops
            .iter()
            .filter_map(|op| match op {
                GraphOp::Host { func, data } => Some((*func, *data)),
                _ => None,
            })
            .collect())
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

    /// The graphs and executable graphs, for a checkpoint (captures in progress are not
    /// kept: a restored stream is not capturing). Their operations name functions, handles
    /// and addresses that a restore makes again with the same values, but for module
    /// variables' (see [`load`](Self::load)).
    pub fn snapshot(&self) -> Vec<u8> {
        let graphs = self.graphs.lock();
        let nodes = self.nodes.lock();
        let execs = self.execs.lock();
        let image = GraphsImage {
            graphs: graphs.iter().map(|(h, g)| (h, g.clone())).collect(),
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
        let [g, n, e] = image.next;
        graphs.set_next_counter(g);
        nodes.set_next_counter(n);
        execs.set_next_counter(e);
        Ok(())
    }

    /// Forget every capture and graph.
    pub fn release_all(&self) {
        self.captures.update(|c| *c = Captures::default());
        self.graphs.lock().drain();
        self.execs.lock().drain();
        self.nodes.lock().drain();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn registry() -> GraphRegistry {
        GraphRegistry::new(GraphLimits { graphs: 8, nodes: 64, execs: 8 })
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
        let g = r.create_captured(vec![memset.clone(), library_op(Some(9))], &new, &full).unwrap();
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
        let g = r.create_captured(vec![copy], &new, &full).unwrap();
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
}
