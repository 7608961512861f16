//! The session's objects, one registry per kind. Each registry owns its lock (or locks, in an
//! order it documents) and its invariants; the per-API services (the runtime API's
//! [`service`](crate::service) today) share them, and the C/R engine
//! ([`checkpoint`](crate::checkpoint)) reads them, never the services.
//!
//! - [`memory`] holds the session's device address space, its allocations and the memory it
//!   may use besides (module variables, registered host memory);
//! - [`host`] page-locked host memory in the guest's pinned arena;
//! - [`streams`] streams and the host-function gates in them;
//! - [`events`] events;
//! - [`modules`] modules, their functions and variables;
//! - [`graphs`] stream captures, graphs, their nodes and executable graphs;
//! - [`arrays`] CUDA arrays, mipmapped arrays, texture and surface objects;
//! - [`blas`] cuBLAS handles and their settings;
//! - [`rand`] cuRAND generators, their settings and positions;
//! - [`solver`] cuSOLVER dense handles and their streams;
//! - [`dnn`] cuDNN handles and backend descriptors;
//! - [`sparse`] cuSPARSE handles and the generic API's descriptors;
//! - [`fft`] cuFFT plans, their layouts and settings;
//! - [`devices`] facts about the devices, asked of the backend once.
//!
//! API objects reach the guest as virtual [`handles`] of their kind. A library's objects (a
//! cuBLAS handle, ...) get a registry of their own here, built on a [`handles::HandleTable`]
//! of a new handle kind, whose counter joins [`Registries::handle_counters`] ([`blas`] is
//! the first).

pub mod arrays;
pub mod blas;
pub mod devices;
pub mod dnn;
pub mod events;
pub mod fft;
pub mod graphs;
pub mod handles;
pub mod host;
pub mod lt;
pub mod memory;
pub mod modules;
pub mod rand;
pub mod solver;
pub mod sparse;
pub mod streams;

use std::sync::Arc;

use phos_protocol::CudaError;
use phos_protocol::limits::{LimitKind, SessionLimits};

use crate::backend::Backend;
use arrays::ArrayRegistry;
use blas::BlasRegistry;
use devices::DeviceFacts;
use dnn::DnnRegistry;
use events::EventRegistry;
use fft::FftRegistry;
use graphs::{GraphLimits, GraphRegistry};
use host::PinnedArena;
use lt::LtRegistry;
use memory::AddressSpace;
use modules::ModuleRegistry;
use rand::RandRegistry;
use solver::SolverRegistry;
use sparse::SparseRegistry;
use streams::StreamRegistry;

pub struct Registries {
    pub blas: BlasRegistry,
    pub rand: RandRegistry,
    pub dnn: DnnRegistry,
    pub solver: SolverRegistry,
    pub sparse: SparseRegistry,
    pub lt: LtRegistry,
    pub fft: FftRegistry,
    /// Shared with the C/R engine's hooks, which note writes in its dirty log.
    pub memory: Arc<AddressSpace>,
    pub host: PinnedArena,
    pub streams: StreamRegistry,
    pub events: EventRegistry,
    pub modules: ModuleRegistry,
    pub graphs: GraphRegistry,
    pub arrays: ArrayRegistry,
    pub devices: DeviceFacts,
}

/// Kinds of handle whose counters a checkpoint keeps (the kinds checkpoints hold objects of).
const COUNTED: [&str; 11] = [
    "stream",
    "event",
    "module",
    "function",
    "cublas_handle",
    "curand_generator",
    "cusolver_dn_handle",
    "cudnn_handle",
    "cudnn_backend_descriptor",
    "cufft_plan",
    "cudnn_tensor_descriptor",
];
// cuSPARSE's and cuBLASLt's kinds are counted by their registries (`sparse::SPARSE_KINDS`,
// `lt::COUNTED`), after these.

impl Registries {
    /// The registries of a session whose device memory lives in `[base, base + size)`, each
    /// holding at most its kind's limit of objects.
    pub fn new(backend: &dyn Backend, base: u64, size: u64, limits: &SessionLimits) -> Result<Self, CudaError> {
        Ok(Registries {
            blas: BlasRegistry::default(),
            rand: RandRegistry::default(),
            solver: SolverRegistry::default(),
            dnn: DnnRegistry::default(),
            sparse: SparseRegistry::default(),
            lt: LtRegistry::default(),
            fft: FftRegistry::default(),
            memory: Arc::new(AddressSpace::reserve(backend, base, size, limits.get(LimitKind::Allocations))?),
            host: PinnedArena::new(limits.get(LimitKind::HostAllocations)),
            streams: StreamRegistry::new(limits.get(LimitKind::Streams)),
            events: EventRegistry::new(limits.get(LimitKind::Events)),
            modules: ModuleRegistry::new(limits.get(LimitKind::Modules), limits.get(LimitKind::Functions)),
            graphs: GraphRegistry::new(GraphLimits {
                graphs: limits.get(LimitKind::Graphs),
                nodes: limits.get(LimitKind::GraphNodes),
                execs: limits.get(LimitKind::GraphExecs),
            }),
            arrays: ArrayRegistry::new(limits.get(LimitKind::Allocations)),
            devices: DeviceFacts::default(),
        })
    }

    /// Next value of each handle kind's counter.
    pub fn handle_counters(&self) -> Vec<(String, u64)> {
        let (modules, functions) = self.modules.next_counters();
        let (dnn_handles, dnn_descriptors, dnn_tensors) = self.dnn.next_counters();
        let values = [
            self.streams.next_counter(),
            self.events.next_counter(),
            modules,
            functions,
            self.blas.next_counter(),
            self.rand.next_counter(),
            self.solver.next_counter(),
            dnn_handles,
            dnn_descriptors,
            self.fft.next_counter(),
            dnn_tensors,
        ];
        let sparse = sparse::SPARSE_KINDS.iter().zip(self.sparse.next_counters());
        let lt = lt::COUNTED.iter().zip(self.lt.next_counters());
        let legacy = self.dnn.legacy_counters();
        let legacy = legacy.iter().map(|(k, v)| (k, *v));
        COUNTED.iter().zip(values).chain(sparse).chain(lt).chain(legacy).map(|(k, v)| (k.to_string(), v)).collect()
    }

    /// Carry on counters from an image (kinds this server does not count are ignored: the
    /// image was checked against the spec's kinds before).
    pub fn set_handle_counters(&self, counters: &[(String, u64)]) {
        let get = |kind: &str| counters.iter().find(|(k, _)| k == kind).map(|(_, n)| *n);
        if let Some(n) = get("stream") {
            self.streams.set_next_counter(n);
        }
        if let Some(n) = get("event") {
            self.events.set_next_counter(n);
        }
        self.modules.set_next_counters(get("module"), get("function"));
        if let Some(n) = get("cublas_handle") {
            self.blas.set_next_counter(n);
        }
        if let Some(n) = get("curand_generator") {
            self.rand.set_next_counter(n);
        }
        if let Some(n) = get("cusolver_dn_handle") {
            self.solver.set_next_counter(n);
        }
        for kind in sparse::SPARSE_KINDS {
            if let Some(n) = get(kind) {
                self.sparse.set_next_counter(kind, n);
            }
        }
        self.dnn.set_next_counters(
            get("cudnn_handle"),
            get("cudnn_backend_descriptor"),
            get("cudnn_tensor_descriptor"),
        );
        for kind in lt::COUNTED {
            if let Some(n) = get(kind) {
                self.lt.set_next_counter(kind, n);
            }
        }
        if let Some(n) = get("cufft_plan") {
            self.fft.set_next_counter(n);
        }
        for kind in dnn::LegacyKind::ALL {
            if let Some(n) = get(kind.name()) {
                self.dnn.set_legacy_counter(kind, n);
            }
        }
    }

    /// Destroy every object (a device reset, the session's end). Pinned host memory is the
    /// guest's and outlives a device reset: [`PinnedArena::release`] lets go of it.
    pub fn release_all(&self, backend: &dyn Backend) {
        self.blas.release_all(backend);
        self.rand.release_all(backend);
        self.solver.release_all(backend);
        self.dnn.release_all(backend);
        self.sparse.release_all(backend);
        self.lt.release_all(backend);
        self.fft.release_all(backend);
        self.streams.release_all(backend);
        self.events.release_all(backend);
        self.graphs.release_all();
        self.arrays.release_all(backend);
        self.modules.release_all(backend, &self.memory);
        self.memory.free_all(backend, None);
    }
}
