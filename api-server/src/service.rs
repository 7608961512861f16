//! The semantics of every remote function, on top of a [`Backend`]: the hand-written half of
//! the spec-generated `CudartService` trait. By the time a method here runs, the generated
//! dispatch has decoded the request and checked its preconditions, buffer sizes, argument
//! shapes and device ranges; what is left is to translate virtual handles, apply CUDA's rules
//! and call the backend.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use phos_protocol::apis::{Function as ApiFunction, HandleKind, RESOURCES};
use phos_protocol::cudart::*;
use phos_protocol::handshake::UsageReport;
use phos_protocol::limits::{LimitKind, SessionLimits};
use phos_protocol::spec::ResourceKind;
use phos_protocol::types::Dim3;
use phos_protocol::{CudaError, Ptr};
use sha2::{Digest, Sha256};

use crate::backend::{Backend, Copy2D, Gate, Raw, StreamRef};
use crate::capture::{CaptureState, Captures, Graph, GraphOp, Node};
use crate::dispatch::cudart::CudartService;
use crate::handles::{HandleTable, Refused};
use crate::host_arena::PinnedArena;
use crate::memory::AddressSpace;
use crate::output::DeviceOutput;
use crate::records::Recorder;

// The driver API's service, on the same session (a child module: it reaches the session's
// state as the runtime's methods do).
#[path = "driver_api.rs"]
mod driver_api;

/// Per-call context: which device the calling thread has current, and, while a restore
/// replays a recorded call, the handles or addresses the call must produce again.
#[derive(Clone, Default)]
pub struct CallCx {
    pub device: i32,
    pub replay: Option<Vec<u64>>,
    /// The staging region of the channel the call came on (shared-memory channels).
    pub staging: Option<std::sync::Arc<phos_protocol::staging::Staging>>,
    /// The router asked for this call's device time (a policy needs it).
    pub measure: bool,
    /// The function running, for what the server logs about the call.
    pub function: Option<ApiFunction>,
}

impl CallCx {
    pub fn new(device: i32) -> Self {
        CallCx { device, replay: None, staging: None, measure: false, function: None }
    }

    /// The value the call's (first) created object must get, when replaying.
    fn forced(&self) -> Option<u64> {
        self.replay.as_ref().and_then(|v| v.first().copied())
    }
}

struct Stream {
    raw: Raw,
    device: i32,
    flags: u32,
    priority: i32,
}

struct Event {
    raw: Raw,
}

struct Module {
    raw: Raw,
    device: i32,
    digest: [u8; 32],
    /// Module variables registered as device memory the session may use: (name, address,
    /// size).
    globals: Vec<(String, u64, u64)>,
}

struct Function {
    raw: Raw,
    module: u64,
}

/// One guest process's state on the server.
/// The usage figures last reported to the router.
struct Reported {
    /// Device memory, pinned host memory, device time (ns), kernels, calls refused by a
    /// limit.
    figures: [u64; 5],
    at: Instant,
    /// A change of device time or kernels not reported yet.
    held_back: bool,
}

pub struct Session {
    pub id: u64,
    backend: Arc<dyn Backend>,
    memory: AddressSpace,
    streams: Mutex<HandleTable<Stream>>,
    events: Mutex<HandleTable<Event>>,
    modules: Mutex<HandleTable<Module>>,
    functions: Mutex<HandleTable<Function>>,
    /// Loaded modules by (device, content digest), so each is loaded once.
    module_index: Mutex<HashMap<(i32, [u8; 32]), u64>>,
    /// Once a kernel has corrupted the context, every call reports this error.
    sticky: AtomicI32,
    max_reply: u64,
    /// Device printf output waiting for a call that delivers it.
    pub output: DeviceOutput,
    /// The calls that created the session's live objects (for checkpoints).
    pub records: Recorder,
    /// Every call passes through it; a checkpoint closes it, so it sees the session between
    /// calls.
    pub(crate) gate: crate::call_gate::CallGate,
    /// What each channel is running now (`Function::policy_id` + 1; 0: nothing), by channel:
    /// what a checkpoint that cannot get the gate waits for.
    busy: Mutex<BTreeMap<u64, Arc<AtomicU64>>>,
    limits: SessionLimits,
    /// Calls refused by each limit ([`LimitKind::index`]) since the server started.
    refused: [AtomicU64; LimitKind::ALL.len()],
    /// Set by a stopping checkpoint: calls wait until the server is ended.
    frozen: AtomicBool,
    /// The usage figures last reported to the router: device memory, pinned memory, device
    /// time and kernels measured.
    reported: Mutex<Reported>,
    /// Host-function gates in the session's streams, by the guest's number, with their stream.
    gates: Mutex<HashMap<u64, (Arc<Gate>, StreamRef)>>,
    /// Stream captures in progress, and the graphs and executable graphs made of them.
    captures: CaptureState,
    graphs: Mutex<HandleTable<Graph>>,
    graph_execs: Mutex<HandleTable<Vec<GraphOp>>>,
    /// Node handles: (graph handle, index of the node in it).
    graph_nodes: Mutex<HandleTable<(u64, usize)>>,
    /// The guest's page-locked memory, shared with this process.
    pinned: PinnedArena,
    launch_limits: RwLock<HashMap<i32, LaunchLimits>>,
}

/// What a device can launch (`cudaDevAttrMaxThreadsPerBlock`, block and grid dimensions, the
/// dynamic shared memory a block may opt in to).
#[derive(Clone, Copy)]
struct LaunchLimits {
    threads: u64,
    block: [u64; 3],
    grid: [u64; 3],
    shared: u64,
}

/// Host-function gates a session may have waiting at once.
const MAX_GATES: usize = 1 << 16;

/// Stream flags CUDA defines (`cudaStreamNonBlocking`).
const STREAM_FLAGS: u32 = 0x1;
/// Event flags CUDA defines (blocking sync, disable timing, interprocess).
const EVENT_FLAGS: u32 = 0x1 | 0x2 | 0x4;

impl Session {
    /// A session whose device memory lives in `[base, base + size)`.
    pub fn new(
        id: u64,
        backend: Arc<dyn Backend>,
        base: u64,
        size: u64,
        max_reply: u64,
        output: DeviceOutput,
        limits: SessionLimits,
    ) -> Result<Self, CudaError> {
        let memory = AddressSpace::reserve(backend.as_ref(), base, size, limits.get(LimitKind::Allocations))?;
        fn table<T>(limits: &SessionLimits, kind: HandleKind, limit: LimitKind) -> Mutex<HandleTable<T>> {
            Mutex::new(HandleTable::new(kind, limits.get(limit)))
        }
        Ok(Session {
            id,
            backend,
            memory,
            streams: table(&limits, HandleKind::Stream, LimitKind::Streams),
            events: table(&limits, HandleKind::Event, LimitKind::Events),
            modules: table(&limits, HandleKind::Module, LimitKind::Modules),
            functions: table(&limits, HandleKind::Function, LimitKind::Functions),
            module_index: Mutex::new(HashMap::new()),
            sticky: AtomicI32::new(0),
            max_reply,
            output,
            records: Recorder::default(),
            gate: Default::default(),
            busy: Mutex::default(),
            limits,
            refused: Default::default(),
            frozen: AtomicBool::new(false),
            reported: Mutex::new(Reported { figures: [0; 5], at: Instant::now(), held_back: false }),
            gates: Mutex::new(HashMap::new()),
            captures: CaptureState::default(),
            graphs: table(&limits, HandleKind::Graph, LimitKind::Graphs),
            graph_execs: table(&limits, HandleKind::GraphExec, LimitKind::GraphExecs),
            graph_nodes: table(&limits, HandleKind::GraphNode, LimitKind::GraphNodes),
            pinned: PinnedArena::new(limits.get(LimitKind::HostAllocations)),
            launch_limits: RwLock::default(),
        })
    }

    /// The session's usage of the spec's continuous and measured resources, if it changed
    /// since the last time this returned it (the server sends it to the router then).
    /// The server knows how to measure `device_memory` (bytes allocated) and `device_time`
    /// (kernel nanoseconds); a resource of another name is not reported.
    ///
    /// `kernel_gap`: device time and kernel counts alone are reported at most this often (a
    /// launch storm would otherwise send a report per launch); memory is always reported at
    /// once. A figure held back makes [`usage_unreported`](Self::usage_unreported) true.
    pub fn usage_if_changed(&self, kernel_gap: Duration) -> Option<UsageReport> {
        // Asked after every call: the figures are compared first, and a report is only built
        // when one of them moved.
        let (ns, kernels) = self.backend.device_time();
        let refused: u64 = self.refused.iter().map(|r| r.load(Ordering::Relaxed)).sum();
        let figures = [self.memory.allocated(), self.pinned.allocated(), ns, kernels, refused];
        {
            let mut last = self.reported.lock().unwrap();
            if last.figures == figures {
                last.held_back = false;
                return None;
            }
            let now = Instant::now();
            if last.figures[..2] == figures[..2]
                && last.figures[4] == figures[4]
                && !kernel_gap.is_zero()
                && now.saturating_duration_since(last.at) < kernel_gap
            {
                last.held_back = true;
                return None;
            }
            *last = Reported { figures, at: now, held_back: false };
        }
        let mut now = UsageReport::default();
        for (i, r) in RESOURCES.iter().enumerate() {
            match (r.kind, r.name) {
                (ResourceKind::Continuous, "device_memory") => now.held.push((i as u32, figures[0])),
                (ResourceKind::Continuous, "pinned_host_memory") => now.held.push((i as u32, figures[1])),
                (ResourceKind::Measured, "device_time") => now.measured.push((i as u32, ns, kernels)),
                _ => {}
            }
        }
        now.refused = LimitKind::ALL
            .iter()
            .map(|k| (k.index() as u32, self.refused[k.index()].load(Ordering::Relaxed)))
            .filter(|&(_, n)| n > 0)
            .collect();
        Some(now)
    }

    /// A call would take the session past its `kind` limit: count it, say so in the log
    /// (throttled: a guest can do this in a loop), and answer what CUDA answers when it
    /// cannot create a resource.
    pub(crate) fn refuse(&self, cx: &CallCx, kind: LimitKind) -> CudaError {
        let n = self.refused[kind.index()].fetch_add(1, Ordering::Relaxed) + 1;
        crate::guest_warn!(
            self.id,
            "{}: refused: the session holds its limit of {} {kind} (refusals so far: {n}); raise `{kind}` in the router's [limits] to allow more",
            cx.function.map_or("a restore", |f| f.name()),
            self.limits.get(kind)
        );
        CudaError::MemoryAllocation
    }

    /// The word in which `channel` says what it runs (`Function::policy_id` + 1; 0: nothing),
    /// for [`busy_calls`](Self::busy_calls); listed until [`channel_closed`](Self::channel_closed).
    pub(crate) fn channel_activity(&self, channel: u64) -> Arc<AtomicU64> {
        let a = Arc::new(AtomicU64::new(0));
        self.busy.lock().unwrap().insert(channel, a.clone());
        a
    }

    pub(crate) fn channel_closed(&self, channel: u64) {
        self.busy.lock().unwrap().remove(&channel);
    }

    /// The calls running now, as `function (channel N)`.
    pub fn busy_calls(&self) -> Vec<String> {
        self.busy
            .lock()
            .unwrap()
            .iter()
            .filter_map(|(ch, a)| {
                let f = a.load(Ordering::Relaxed).checked_sub(1)?;
                let f = ApiFunction::from_wire((f >> 32) as u16, f as u32);
                Some(format!("{} (channel {ch})", f.map_or("?", |f| f.name())))
            })
            .collect()
    }

    /// Insert an object under a fresh handle, or under the recorded one when replaying;
    /// `kind` is the limit the table keeps.
    fn insert<T>(
        &self,
        table: &Mutex<HandleTable<T>>,
        kind: LimitKind,
        cx: &CallCx,
        object: T,
    ) -> Result<u64, CudaError> {
        let mut t = table.lock().unwrap();
        let inserted = match cx.forced() {
            Some(h) => t.insert_at(h, object),
            None => t.insert(object),
        };
        drop(t);
        inserted.map_err(|r| match r {
            Refused::Full => self.refuse(cx, kind),
            other => other.into(),
        })
    }

    /// Whether [`usage_if_changed`](Self::usage_if_changed) held a change back.
    pub fn usage_unreported(&self) -> bool {
        self.reported.lock().unwrap().held_back
    }

    pub fn backend(&self) -> &dyn Backend {
        self.backend.as_ref()
    }

    pub fn backend_arc(&self) -> Arc<dyn Backend> {
        self.backend.clone()
    }

    pub fn memory(&self) -> &AddressSpace {
        &self.memory
    }

    /// Map the pinned arena a channel brought (see [`PinnedArena::attach`]).
    pub fn attach_host_arena(&self, fd: std::os::fd::OwnedFd) -> Result<(), String> {
        self.pinned.attach(fd, self.backend.as_ref(), &self.memory)
    }

    /// Stop serving calls for good (after a stopping checkpoint): every call from now on
    /// waits until the server ends, so that the guest sends it again to the restored session.
    pub fn freeze(&self) {
        self.frozen.store(true, Ordering::SeqCst);
    }

    pub fn is_frozen(&self) -> bool {
        self.frozen.load(Ordering::SeqCst)
    }

    /// Next value of each handle kind's counter.
    pub fn handle_counters(&self) -> Vec<(String, u64)> {
        vec![
            ("stream".into(), self.streams.lock().unwrap().next_counter()),
            ("event".into(), self.events.lock().unwrap().next_counter()),
            ("module".into(), self.modules.lock().unwrap().next_counter()),
            ("function".into(), self.functions.lock().unwrap().next_counter()),
        ]
    }

    pub fn set_handle_counters(&self, counters: &[(String, u64)]) {
        for (kind, next) in counters {
            match kind.as_str() {
                "stream" => self.streams.lock().unwrap().set_next_counter(*next),
                "event" => self.events.lock().unwrap().set_next_counter(*next),
                "module" => self.modules.lock().unwrap().set_next_counter(*next),
                "function" => self.functions.lock().unwrap().set_next_counter(*next),
                _ => {}
            }
        }
    }

    /// Every module variable the session can use: (module handle, name, address, size, device).
    pub fn module_variables(&self) -> Vec<(u64, String, u64, u64, i32)> {
        let modules = self.modules.lock().unwrap();
        let mut out: Vec<_> = modules
            .iter()
            .flat_map(|(h, m)| {
                m.globals.iter().map(move |(name, addr, size)| (h, name.clone(), *addr, *size, m.device))
            })
            .collect();
        out.sort();
        out
    }

    /// Address and size of a variable of a loaded module (registering it for the session).
    pub fn module_variable(&self, module: u64, name: &str) -> Result<(u64, u64), CudaError> {
        let mut modules = self.modules.lock().unwrap();
        let m = modules.get_mut(module)?;
        if let Some((_, addr, size)) = m.globals.iter().find(|(n, _, _)| n == name) {
            return Ok((*addr, *size));
        }
        let (addr, size) = self.backend.module_global(m.raw, name)?;
        self.memory.add_external(addr, size);
        m.globals.push((name.to_string(), addr, size));
        Ok((addr, size))
    }

    /// The sticky error, if the context is corrupted.
    pub fn sticky_error(&self) -> Option<CudaError> {
        match self.sticky.load(Ordering::Relaxed) {
            0 => None,
            e => Some(CudaError(e)),
        }
    }

    /// Remember a sticky error reported by the backend.
    pub fn note_error(&self, e: CudaError) {
        if e.is_sticky() {
            self.sticky.store(e.0, Ordering::Relaxed);
        }
    }

    fn check_device(&self, device: i32) -> Result<(), CudaError> {
        if device < 0 || device >= self.backend.device_count() { Err(CudaError::InvalidDevice) } else { Ok(()) }
    }

    /// The backend stream behind a guest's stream value (0, `cudaStreamLegacy`,
    /// `cudaStreamPerThread`, or a handle).
    fn stream(&self, handle: u64) -> Result<StreamRef, CudaError> {
        match handle {
            0 | 1 => Ok(StreamRef::Legacy),
            2 => Ok(StreamRef::PerThread),
            h => Ok(StreamRef::Created(self.streams.lock().unwrap().get(h)?.raw)),
        }
    }

    fn create_stream(&self, cx: &CallCx, flags: u32, priority: i32) -> Result<u64, CudaError> {
        if flags & !STREAM_FLAGS != 0 {
            return Err(CudaError::InvalidValue);
        }
        // CUDA clamps a priority outside the device's range into it.
        let (least, greatest) = self.backend.stream_priority_range(cx.device)?;
        let priority = priority.clamp(greatest, least);
        let raw = self.backend.stream_create(cx.device, flags, priority)?;
        self.insert(&self.streams, LimitKind::Streams, cx, Stream { raw, device: cx.device, flags, priority })
            .inspect_err(|_| {
                let _ = self.backend.stream_destroy(raw);
            })
    }

    /// (flags, priority, device) of a stream value. The special streams are the calling
    /// device's, blocking, of priority 0.
    fn stream_facts(&self, cx: &CallCx, handle: u64) -> Result<(u32, i32, i32), CudaError> {
        if handle <= 2 {
            return Ok((0, 0, cx.device));
        }
        let t = self.streams.lock().unwrap();
        let s = t.get(handle)?;
        Ok((s.flags, s.priority, s.device))
    }

    /// A 1D copy in a capturing stream: recorded (device to device, host to device with the
    /// data as it is now), or refused (to host). `None` when `stream` does not capture.
    fn capture_copy(&self, stream: u64, dst: &Ptr<'_>, src: &Ptr<'_>, count: u64) -> Option<Result<(), CudaError>> {
        let mut captures = self.captures.active()?;
        captures.of_stream(stream)?;
        let op = match (dst, src) {
            (Ptr::Device(d), Ptr::Device(s)) => {
                GraphOp::CopyOnDevice { dst: *d, dpitch: count, src: *s, spitch: count, width: count, height: 1 }
            }
            (Ptr::Device(d), Ptr::In(bytes)) => {
                GraphOp::CopyToDevice { dst: *d, dpitch: count, data: bytes.to_vec(), width: count, height: 1 }
            }
            _ => return captures.refuse(stream).map(Err),
        };
        captures.record(stream, || op)
    }

    /// A staged copy in a capturing stream: a host-to-device one is drained from the slots
    /// into the capture (the guest is filling them either way); one to the host cannot be
    /// captured, and the copy is given up.
    fn capture_staged(
        &self,
        st: &phos_protocol::staging::Staging,
        req: &PhosMemcpyStagedRequest,
        h2d: bool,
        seq: u32,
    ) -> Result<PhosMemcpyStagedReply, CudaError> {
        use phos_protocol::staging::{Count, chunks};
        if !h2d {
            st.abort();
            return Err(self.captures.lock().refuse(req.stream).unwrap_or(CudaError::StreamCaptureUnsupported));
        }
        let slot = st.slot_bytes();
        let mut data = Vec::new();
        data.try_reserve_exact(req.count as usize).map_err(|_| CudaError::MemoryAllocation)?;
        for k in 0..chunks(req.count, slot) as u32 {
            let len = slot.min(req.count as usize - data.len());
            if let Err(e) = st.wait(Count::Filled, seq, seq.wrapping_add(k + 1), phos_protocol::shm::default_spin()) {
                crate::guest_warn!(self.id, "staged copy: {e}");
                st.abort();
                return Err(CudaError::Unknown);
            }
            data.extend_from_slice(unsafe { std::slice::from_raw_parts(st.slot(k), len) });
            st.set(Count::Drained, seq.wrapping_add(k + 1));
        }
        let count = req.count;
        let op = GraphOp::CopyToDevice { dst: req.device, dpitch: count, data, width: count, height: 1 };
        self.captures.lock().record(req.stream, || op).unwrap_or(Ok(()))?;
        Ok(PhosMemcpyStagedReply {})
    }

    /// A strided copy in a capturing stream, one recorded 2D copy per slice.
    fn capture_copy_3d(&self, req: &PhosMemcpy3DRequest<'_>) -> Result<(), CudaError> {
        let mut captures = self.captures.lock();
        let slice = (req.width * req.height) as usize;
        for z in 0..req.depth {
            let op = match (&req.dst, &req.src) {
                (Ptr::Device(d), Ptr::Device(s)) => GraphOp::CopyOnDevice {
                    dst: d + z * req.dslice,
                    dpitch: req.dpitch,
                    src: s + z * req.sslice,
                    spitch: req.spitch,
                    width: req.width,
                    height: req.height,
                },
                (Ptr::Device(d), Ptr::In(bytes)) => GraphOp::CopyToDevice {
                    dst: d + z * req.dslice,
                    dpitch: req.dpitch,
                    data: bytes[z as usize * slice..(z as usize + 1) * slice].to_vec(),
                    width: req.width,
                    height: req.height,
                },
                _ => return Err(captures.refuse(req.stream).unwrap_or(CudaError::StreamCaptureUnsupported)),
            };
            captures.record(req.stream, || op).unwrap_or(Ok(()))?;
        }
        Ok(())
    }

    /// Run a graph's work on `stream`, in capture order.
    fn replay(&self, cx: &CallCx, ops: &[GraphOp], stream: u64) -> Result<(), CudaError> {
        let s = Some(self.stream(stream)?);
        let b = self.backend.as_ref();
        for op in ops {
            match op {
                GraphOp::Kernel { function, grid, block, shared_mem, params, cooperative } => {
                    self.launch(cx, *function, *grid, *block, *shared_mem, stream, params, *cooperative)?
                }
                GraphOp::Memset { dst, pitch, value, width, height } => {
                    b.memset_2d(*dst, *pitch, *value, *width, *height, s)?
                }
                GraphOp::CopyOnDevice { dst, dpitch, src, spitch, width, height } => {
                    let copy = Copy2D::DeviceToDevice { dst: *dst, dpitch: *dpitch, src: *src, spitch: *spitch };
                    b.memcpy_2d(copy, *width, *height, s)?
                }
                GraphOp::CopyToDevice { dst, dpitch, data, width, height } => {
                    b.memcpy_2d(Copy2D::HostToDevice { dst: *dst, dpitch: *dpitch, src: data }, *width, *height, s)?
                }
                GraphOp::CopyPinned { device, host, count, to_device } => {
                    // The memory may have been freed since the capture.
                    if !self.pinned.covers(*host, *count) || !self.memory.contains(*device, *count) {
                        return Err(CudaError::InvalidValue);
                    }
                    b.memcpy_registered(*device, *host, *count, *to_device, s)?
                }
            }
        }
        Ok(())
    }

    /// Append a node to `graph` after the nodes at `deps`; its handle.
    fn add_node(
        &self,
        cx: &CallCx,
        graph: u64,
        kind: i32,
        ops: Vec<GraphOp>,
        deps: Vec<usize>,
    ) -> Result<u64, CudaError> {
        let mut graphs = self.graphs.lock().unwrap();
        let g = graphs.get_mut(graph)?;
        let index = g.nodes.len();
        let handle = self
            .graph_nodes
            .lock()
            .unwrap()
            .insert((graph, index))
            .map_err(|r| if r == Refused::Full { self.refuse(cx, LimitKind::GraphNodes) } else { r.into() })?;
        g.nodes.push(Node { kind, ops, deps, handle });
        Ok(handle)
    }

    /// Node handles of `graph` (as the guest sends them: 8 bytes each) as node indices.
    fn node_indices(&self, graph: u64, handles: &[u8]) -> Result<Vec<usize>, CudaError> {
        let nodes = self.graph_nodes.lock().unwrap();
        handles
            .chunks_exact(8)
            .map(|h| {
                let (g, index) = *nodes.get(u64::from_ne_bytes(h.try_into().expect("8 bytes")))?;
                if g == graph { Ok(index) } else { Err(CudaError::InvalidValue) }
            })
            .collect()
    }

    fn function(&self, handle: u64) -> Result<Raw, CudaError> {
        Ok(self.functions.lock().unwrap().get(handle)?.raw)
    }

    /// A 2D or 3D copy, one 2D copy per slice; a host side is packed.
    fn copy_3d(&self, req: &PhosMemcpy3DRequest<'_>) -> Result<Option<Vec<u8>>, CudaError> {
        let stream = if req.ordered != 0 { Some(self.stream(req.stream)?) } else { None };
        let b = self.backend.as_ref();
        let (w, h) = (req.width, req.height);
        let slice = w.checked_mul(h).and_then(|n| usize::try_from(n).ok()).ok_or(CudaError::InvalidValue)?;
        match (&req.dst, &req.src) {
            (Ptr::Device(d), Ptr::In(bytes)) => {
                for (z, src) in bytes.chunks_exact(slice).enumerate() {
                    let copy = Copy2D::HostToDevice { dst: d + z as u64 * req.dslice, dpitch: req.dpitch, src };
                    b.memcpy_2d(copy, w, h, stream)?;
                }
                Ok(None)
            }
            (Ptr::Out(_), Ptr::Device(s)) => {
                let mut out = reply_buffer((slice as u64).checked_mul(req.depth).ok_or(CudaError::InvalidValue)?)?;
                for (z, dst) in out.chunks_exact_mut(slice).enumerate() {
                    let copy = Copy2D::DeviceToHost { dst, src: s + z as u64 * req.sslice, spitch: req.spitch };
                    b.memcpy_2d(copy, w, h, stream)?;
                }
                Ok(Some(out))
            }
            (Ptr::Device(d), Ptr::Device(s)) => {
                for z in 0..req.depth {
                    let (dst, src) = (d + z * req.dslice, s + z * req.sslice);
                    let copy = Copy2D::DeviceToDevice { dst, dpitch: req.dpitch, src, spitch: req.spitch };
                    b.memcpy_2d(copy, w, h, stream)?;
                }
                Ok(None)
            }
            _ => Err(CudaError::InvalidMemcpyDirection),
        }
    }

    fn event(&self, handle: u64) -> Result<Raw, CudaError> {
        Ok(self.events.lock().unwrap().get(handle)?.raw)
    }

    /// Copy between the kinds of memory a `cudaMemcpy` family call names.
    fn copy(
        &self,
        dst: &Ptr<'_>,
        src: &Ptr<'_>,
        count: u64,
        stream: Option<StreamRef>,
    ) -> Result<Option<Vec<u8>>, CudaError> {
        let b = self.backend.as_ref();
        match (dst, src) {
            (Ptr::Device(d), Ptr::In(bytes)) => b.memcpy_htod(*d, bytes, stream).map(|_| None),
            (Ptr::Out(_), Ptr::Device(s)) => {
                let mut out = reply_buffer(count)?;
                b.memcpy_dtoh(&mut out, *s, stream)?;
                Ok(Some(out))
            }
            (Ptr::Device(d), Ptr::Device(s)) => b.memcpy_dtod(*d, *s, count, stream).map(|_| None),
            (Ptr::Out(_), Ptr::In(bytes)) => {
                // Host to host: ordered after the stream's work, like CUDA's.
                if let Some(s) = stream {
                    b.stream_synchronize(s)?;
                }
                Ok(Some(bytes.to_vec()))
            }
            _ => Err(CudaError::InvalidValue),
        }
    }

    /// CUDA refuses launch configurations the device cannot run before anything starts.
    fn check_launch(&self, device: i32, grid: Dim3, block: Dim3, shared: u32) -> Result<(), CudaError> {
        let limits = self.launch_limits(device)?;
        let zero = grid.x == 0 || grid.y == 0 || grid.z == 0 || block.x == 0 || block.y == 0 || block.z == 0;
        let too_big = block.volume() > limits.threads
            || [block.x, block.y, block.z].iter().zip(limits.block).any(|(&n, max)| u64::from(n) > max)
            || [grid.x, grid.y, grid.z].iter().zip(limits.grid).any(|(&n, max)| u64::from(n) > max);
        if zero || too_big {
            return Err(CudaError::InvalidConfiguration);
        }
        // Dynamic shared memory beyond what a block may opt in to.
        if u64::from(shared) > limits.shared {
            return Err(CudaError::InvalidValue);
        }
        Ok(())
    }

    /// The device's launch limits, asked of the backend once (they never change, and every
    /// launch is checked against them).
    fn launch_limits(&self, device: i32) -> Result<LaunchLimits, CudaError> {
        if let Some(l) = self.launch_limits.read().unwrap().get(&device) {
            return Ok(*l);
        }
        let a = |n| self.backend.device_attribute(device, n).map(|v| v.max(0) as u64);
        let limits = LaunchLimits {
            threads: a(1)?,
            block: [a(2)?, a(3)?, a(4)?],
            grid: [a(5)?, a(6)?, a(7)?],
            shared: a(97)?.max(a(8)?),
        };
        self.launch_limits.write().unwrap().insert(device, limits);
        Ok(limits)
    }

    /// Destroy every object of the session (device reset, session end).
    pub fn release_all(&self) {
        // Streams held for host functions that will not run now.
        for (_, (gate, _)) in self.gates.lock().unwrap().drain() {
            gate.open();
        }
        let b = self.backend.as_ref();
        for (_, s) in self.streams.lock().unwrap().drain() {
            let _ = b.stream_destroy(s.raw);
        }
        for (_, e) in self.events.lock().unwrap().drain() {
            let _ = b.event_destroy(e.raw);
        }
        self.functions.lock().unwrap().drain();
        self.captures.update(|c| *c = Captures::default());
        self.graphs.lock().unwrap().drain();
        self.graph_execs.lock().unwrap().drain();
        self.graph_nodes.lock().unwrap().drain();
        for (_, m) in self.modules.lock().unwrap().drain() {
            for (_, g, _) in m.globals {
                self.memory.remove_external(g);
            }
            let _ = b.module_unload(m.raw);
        }
        self.module_index.lock().unwrap().clear();
        self.memory.free_all(b, None);
    }
}

/// A reply buffer, refusing sizes the host cannot provide instead of aborting.
fn reply_buffer(len: u64) -> Result<Vec<u8>, CudaError> {
    let len = usize::try_from(len).map_err(|_| CudaError::InvalidValue)?;
    let mut v = Vec::new();
    v.try_reserve_exact(len).map_err(|_| CudaError::MemoryAllocation)?;
    v.resize(len, 0);
    Ok(v)
}

impl Drop for Session {
    fn drop(&mut self) {
        self.release_all();
        // Pinned memory is the guest's and outlives a device reset; not the session.
        self.pinned.release(self.backend.as_ref());
        self.backend.unreserve(self.memory.base(), self.memory.size());
    }
}

impl CudartService for Session {
    type Cx = CallCx;

    fn check_device_range(&self, _cx: &CallCx, addr: u64, len: u64, null_ok: bool) -> Result<(), CudaError> {
        if addr == 0 && null_ok {
            return Ok(());
        }
        if self.memory.contains(addr, len) { Ok(()) } else { Err(CudaError::InvalidValue) }
    }

    fn max_reply_bytes(&self) -> u64 {
        self.max_reply
    }

    fn record(&self, cx: &CallCx, id: FunctionId, payload: &[u8], facts: &phos_protocol::spec::RecordFacts<'_>) {
        self.records.record(ApiFunction::Cudart(id), cx.device, payload, facts);
    }

    fn cuda_get_device_count(
        &self,
        _: &CallCx,
        _: CudaGetDeviceCountRequest,
    ) -> Result<CudaGetDeviceCountReply, CudaError> {
        match self.backend.device_count() {
            0 => Err(CudaError::NoDevice),
            n => Ok(CudaGetDeviceCountReply { count: n }),
        }
    }

    fn cuda_get_device_properties(
        &self,
        _: &CallCx,
        req: CudaGetDevicePropertiesRequest,
    ) -> Result<CudaGetDevicePropertiesReply, CudaError> {
        self.check_device(req.device)?;
        Ok(CudaGetDevicePropertiesReply { prop: self.backend.device_properties(req.device)? })
    }

    fn cuda_get_device_properties_v2(
        &self,
        _: &CallCx,
        req: CudaGetDevicePropertiesV2Request,
    ) -> Result<CudaGetDevicePropertiesV2Reply, CudaError> {
        self.check_device(req.device)?;
        Ok(CudaGetDevicePropertiesV2Reply { prop: self.backend.device_properties(req.device)? })
    }

    fn cuda_device_get_attribute(
        &self,
        _: &CallCx,
        req: CudaDeviceGetAttributeRequest,
    ) -> Result<CudaDeviceGetAttributeReply, CudaError> {
        self.check_device(req.device)?;
        Ok(CudaDeviceGetAttributeReply { value: self.backend.device_attribute(req.device, req.attr)? })
    }

    fn cuda_device_synchronize(
        &self,
        cx: &CallCx,
        _: CudaDeviceSynchronizeRequest,
    ) -> Result<CudaDeviceSynchronizeReply, CudaError> {
        if let Some(e) = self.captures.active().and_then(|mut c| c.refuse_all()) {
            return Err(e);
        }
        self.backend.device_synchronize(cx.device)?;
        Ok(CudaDeviceSynchronizeReply {})
    }

    fn cuda_device_reset(&self, cx: &CallCx, _: CudaDeviceResetRequest) -> Result<CudaDeviceResetReply, CudaError> {
        let _ = self.backend.device_synchronize(cx.device);
        self.release_all();
        self.sticky.store(0, Ordering::Relaxed);
        Ok(CudaDeviceResetReply {})
    }

    fn cuda_driver_get_version(
        &self,
        _: &CallCx,
        _: CudaDriverGetVersionRequest,
    ) -> Result<CudaDriverGetVersionReply, CudaError> {
        Ok(CudaDriverGetVersionReply { driverVersion: self.backend.driver_version() })
    }

    fn cuda_malloc(&self, cx: &CallCx, req: CudaMallocRequest) -> Result<CudaMallocReply, CudaError> {
        let addr = match cx.forced() {
            Some(at) => self.memory.alloc_at(self.backend.as_ref(), cx.device, at, req.size),
            None => self.memory.alloc(self.backend.as_ref(), cx.device, req.size),
        }
        .map_err(|e| if self.memory.at_limit() { self.refuse(cx, LimitKind::Allocations) } else { e })?;
        Ok(CudaMallocReply { devPtr: addr })
    }

    fn cuda_free(&self, cx: &CallCx, req: CudaFreeRequest) -> Result<CudaFreeReply, CudaError> {
        if req.devPtr == 0 {
            return Ok(CudaFreeReply {});
        }
        // cudaFree waits for the device: work in flight may still use the memory.
        self.backend.device_synchronize(cx.device)?;
        self.memory.free(self.backend.as_ref(), req.devPtr)?;
        Ok(CudaFreeReply {})
    }

    fn cuda_memcpy(&self, _: &CallCx, req: CudaMemcpyRequest<'_>) -> Result<CudaMemcpyReply, CudaError> {
        Ok(CudaMemcpyReply { dst: self.copy(&req.dst, &req.src, req.count, None)? })
    }

    fn cuda_memcpy_async(
        &self,
        _: &CallCx,
        req: CudaMemcpyAsyncRequest<'_>,
    ) -> Result<CudaMemcpyAsyncReply, CudaError> {
        let stream = self.stream(req.stream)?;
        if let Some(r) = self.capture_copy(req.stream, &req.dst, &req.src, req.count) {
            return r.map(|_| CudaMemcpyAsyncReply { dst: None });
        }
        Ok(CudaMemcpyAsyncReply { dst: self.copy(&req.dst, &req.src, req.count, Some(stream))? })
    }

    fn cuda_memset(&self, _: &CallCx, req: CudaMemsetRequest) -> Result<CudaMemsetReply, CudaError> {
        // CUDA sets each byte to the value's low byte.
        self.backend.memset(req.devPtr, req.value as u8, req.count, None)?;
        Ok(CudaMemsetReply {})
    }

    fn cuda_memset_async(&self, _: &CallCx, req: CudaMemsetAsyncRequest) -> Result<CudaMemsetAsyncReply, CudaError> {
        let stream = self.stream(req.stream)?;
        let op = || GraphOp::Memset {
            dst: req.devPtr,
            pitch: req.count,
            value: req.value as u8,
            width: req.count,
            height: 1,
        };
        if let Some(r) = self.captures.active().and_then(|mut c| c.record(req.stream, op)) {
            return r.map(|_| CudaMemsetAsyncReply {});
        }
        self.backend.memset(req.devPtr, req.value as u8, req.count, Some(stream))?;
        Ok(CudaMemsetAsyncReply {})
    }

    fn cuda_mem_get_info(&self, cx: &CallCx, _: CudaMemGetInfoRequest) -> Result<CudaMemGetInfoReply, CudaError> {
        let (free, total) = self.backend.mem_info(cx.device)?;
        Ok(CudaMemGetInfoReply { free, total })
    }

    fn cuda_memcpy_to_symbol(
        &self,
        _: &CallCx,
        req: CudaMemcpyToSymbolRequest<'_>,
    ) -> Result<CudaMemcpyToSymbolReply, CudaError> {
        let dst = Ptr::Device(req.symbol_base + req.offset);
        self.copy(&dst, &req.src, req.count, None)?;
        Ok(CudaMemcpyToSymbolReply {})
    }

    fn cuda_memcpy_from_symbol(
        &self,
        _: &CallCx,
        req: CudaMemcpyFromSymbolRequest<'_>,
    ) -> Result<CudaMemcpyFromSymbolReply, CudaError> {
        let src = Ptr::Device(req.symbol_base + req.offset);
        Ok(CudaMemcpyFromSymbolReply { dst: self.copy(&req.dst, &src, req.count, None)? })
    }

    fn cuda_stream_create(&self, cx: &CallCx, _: CudaStreamCreateRequest) -> Result<CudaStreamCreateReply, CudaError> {
        Ok(CudaStreamCreateReply { pStream: self.create_stream(cx, 0, 0)? })
    }

    fn cuda_stream_create_with_flags(
        &self,
        cx: &CallCx,
        req: CudaStreamCreateWithFlagsRequest,
    ) -> Result<CudaStreamCreateWithFlagsReply, CudaError> {
        Ok(CudaStreamCreateWithFlagsReply { pStream: self.create_stream(cx, req.flags, 0)? })
    }

    fn cuda_stream_destroy(
        &self,
        _: &CallCx,
        req: CudaStreamDestroyRequest,
    ) -> Result<CudaStreamDestroyReply, CudaError> {
        let s = self.streams.lock().unwrap().remove(req.stream)?;
        if let Some(mut c) = self.captures.active() {
            c.forget_stream(req.stream);
        }
        self.backend.stream_destroy(s.raw)?;
        Ok(CudaStreamDestroyReply {})
    }

    fn cuda_stream_synchronize(
        &self,
        _: &CallCx,
        req: CudaStreamSynchronizeRequest,
    ) -> Result<CudaStreamSynchronizeReply, CudaError> {
        let s = self.stream(req.stream)?;
        if let Some(e) = self.captures.active().and_then(|mut c| c.refuse(req.stream)) {
            return Err(e);
        }
        self.backend.stream_synchronize(s)?;
        Ok(CudaStreamSynchronizeReply {})
    }

    fn cuda_stream_query(&self, _: &CallCx, req: CudaStreamQueryRequest) -> Result<CudaStreamQueryReply, CudaError> {
        let s = self.stream(req.stream)?;
        if let Some(e) = self.captures.active().and_then(|mut c| c.refuse(req.stream)) {
            return Err(e);
        }
        if self.backend.stream_query(s)? { Ok(CudaStreamQueryReply {}) } else { Err(CudaError::NotReady) }
    }

    fn cuda_event_create(&self, cx: &CallCx, _: CudaEventCreateRequest) -> Result<CudaEventCreateReply, CudaError> {
        let raw = self.backend.event_create(cx.device, 0)?;
        let event = self.insert(&self.events, LimitKind::Events, cx, Event { raw }).inspect_err(|_| {
            let _ = self.backend.event_destroy(raw);
        })?;
        Ok(CudaEventCreateReply { event })
    }

    fn cuda_event_create_with_flags(
        &self,
        cx: &CallCx,
        req: CudaEventCreateWithFlagsRequest,
    ) -> Result<CudaEventCreateWithFlagsReply, CudaError> {
        if req.flags & !EVENT_FLAGS != 0 {
            return Err(CudaError::InvalidValue);
        }
        let raw = self.backend.event_create(cx.device, req.flags)?;
        let event = self.insert(&self.events, LimitKind::Events, cx, Event { raw }).inspect_err(|_| {
            let _ = self.backend.event_destroy(raw);
        })?;
        Ok(CudaEventCreateWithFlagsReply { event })
    }

    fn cuda_event_record(&self, _: &CallCx, req: CudaEventRecordRequest) -> Result<CudaEventRecordReply, CudaError> {
        let e = self.event(req.event)?;
        let s = self.stream(req.stream)?;
        if self.captures.active().is_some_and(|mut c| c.record_event(req.event, req.stream)) {
            return Ok(CudaEventRecordReply {});
        }
        self.backend.event_record(e, s)?;
        Ok(CudaEventRecordReply {})
    }

    fn cuda_event_synchronize(
        &self,
        _: &CallCx,
        req: CudaEventSynchronizeRequest,
    ) -> Result<CudaEventSynchronizeReply, CudaError> {
        self.backend.event_synchronize(self.event(req.event)?)?;
        Ok(CudaEventSynchronizeReply {})
    }

    fn cuda_event_query(&self, _: &CallCx, req: CudaEventQueryRequest) -> Result<CudaEventQueryReply, CudaError> {
        if self.backend.event_query(self.event(req.event)?)? {
            Ok(CudaEventQueryReply {})
        } else {
            Err(CudaError::NotReady)
        }
    }

    fn cuda_event_elapsed_time(
        &self,
        _: &CallCx,
        req: CudaEventElapsedTimeRequest,
    ) -> Result<CudaEventElapsedTimeReply, CudaError> {
        let (a, b) = (self.event(req.start)?, self.event(req.end)?);
        Ok(CudaEventElapsedTimeReply { ms: self.backend.event_elapsed(a, b)? })
    }

    fn cuda_event_destroy(&self, _: &CallCx, req: CudaEventDestroyRequest) -> Result<CudaEventDestroyReply, CudaError> {
        let e = self.events.lock().unwrap().remove(req.event)?;
        self.backend.event_destroy(e.raw)?;
        Ok(CudaEventDestroyReply {})
    }

    fn phos_module_load(&self, cx: &CallCx, req: PhosModuleLoadRequest<'_>) -> Result<PhosModuleLoadReply, CudaError> {
        // The digest names the module for sharing; never trust the guest's word for it.
        let digest: [u8; 32] = Sha256::digest(req.image).into();
        if digest.as_slice() != req.digest {
            return Err(CudaError::InvalidValue);
        }
        let mut index = self.module_index.lock().unwrap();
        if let Some(&h) = index.get(&(cx.device, digest)) {
            return Ok(PhosModuleLoadReply { module: h });
        }
        let loaded = self.backend.module_load(cx.device, req.image)?;
        for &(_, addr, size) in &loaded.variables {
            self.memory.add_external(addr, size);
        }
        let globals = loaded.variables.clone();
        let module = Module { raw: loaded.raw, device: cx.device, digest, globals };
        let h = self.insert(&self.modules, LimitKind::Modules, cx, module).inspect_err(|_| {
            for &(_, addr, _) in &loaded.variables {
                self.memory.remove_external(addr);
            }
            let _ = self.backend.module_unload(loaded.raw);
        })?;
        index.insert((cx.device, digest), h);
        Ok(PhosModuleLoadReply { module: h })
    }

    fn phos_module_unload(&self, _: &CallCx, req: PhosModuleUnloadRequest) -> Result<PhosModuleUnloadReply, CudaError> {
        let m = self.modules.lock().unwrap().remove(req.module)?;
        self.module_index.lock().unwrap().remove(&(m.device, m.digest));
        self.functions.lock().unwrap().retain(|f| f.module != req.module);
        for (_, g, _) in &m.globals {
            self.memory.remove_external(*g);
        }
        self.backend.module_unload(m.raw)?;
        Ok(PhosModuleUnloadReply {})
    }

    fn phos_module_get_function(
        &self,
        cx: &CallCx,
        req: PhosModuleGetFunctionRequest<'_>,
    ) -> Result<PhosModuleGetFunctionReply, CudaError> {
        let module_raw = self.modules.lock().unwrap().get(req.module)?.raw;
        let raw = self.backend.module_function(module_raw, req.name)?;
        let h = self.insert(&self.functions, LimitKind::Functions, cx, Function { raw, module: req.module })?;
        Ok(PhosModuleGetFunctionReply { function: h })
    }

    fn phos_module_get_global(
        &self,
        _: &CallCx,
        req: PhosModuleGetGlobalRequest<'_>,
    ) -> Result<PhosModuleGetGlobalReply, CudaError> {
        let mut modules = self.modules.lock().unwrap();
        let m = modules.get_mut(req.module)?;
        let (addr, bytes) = self.backend.module_global(m.raw, req.name)?;
        self.memory.add_external(addr, bytes);
        if !m.globals.iter().any(|(_, a, _)| *a == addr) {
            m.globals.push((req.name.to_string(), addr, bytes));
        }
        Ok(PhosModuleGetGlobalReply { address: addr, bytes })
    }

    fn phos_memcpy_staged(
        &self,
        cx: &CallCx,
        req: PhosMemcpyStagedRequest,
    ) -> Result<PhosMemcpyStagedReply, CudaError> {
        use phos_protocol::staging::{Count, chunks};
        let Some(st) = cx.staging.as_deref() else {
            crate::guest_warn!(self.id, "a staged copy on a channel without a staging region");
            return Err(CudaError::InvalidValue);
        };
        let h2d = match req.direction {
            consts::cudaMemcpyHostToDevice => true,
            consts::cudaMemcpyDeviceToHost => false,
            _ => return Err(CudaError::InvalidMemcpyDirection),
        };
        let stream = self.stream(req.stream)?;
        let seq = req.seq as u32;
        // The guest may already be filling (host to device); nothing can have been drained.
        let ours = if h2d { Count::Drained } else { Count::Filled };
        if u64::from(seq) != req.seq || st.count(ours) != seq || (!h2d && st.count(Count::Drained) != seq) {
            crate::guest_warn!(self.id, "a staged copy that does not start where the region stands");
            return Err(CudaError::InvalidValue);
        }
        if self.captures.active().is_some_and(|c| c.of_stream(req.stream).is_some()) {
            return self.capture_staged(st, &req, h2d, seq);
        }
        let b = self.backend.as_ref();
        if !st.registered.swap(true, Ordering::Relaxed) {
            // Registered with the driver, the slots are DMA'd directly.
            let (p, n) = st.slots_ptr();
            b.pin_host(unsafe { std::slice::from_raw_parts_mut(p, n) });
        }
        let slot = st.slot_bytes() as u64;
        let spin = phos_protocol::shm::default_spin();
        let gave_up = |e: phos_protocol::staging::StagingError| {
            crate::guest_warn!(self.id, "staged copy: {e}");
            st.abort();
            CudaError::Unknown
        };
        for k in 0..chunks(req.count, slot as usize) as u32 {
            let at = u64::from(k) * slot;
            let len = slot.min(req.count - at) as usize;
            let failed = if h2d {
                st.wait(Count::Filled, seq, seq.wrapping_add(k + 1), spin).map_err(gave_up)?;
                let data = unsafe { std::slice::from_raw_parts(st.slot(k), len) };
                // The slot is reused two chunks on: this chunk must be on the device first.
                b.memcpy_htod(req.device + at, data, Some(stream)).and_then(|_| b.stream_synchronize(stream)).err()
            } else {
                if k >= 2 {
                    st.wait(Count::Drained, seq, seq.wrapping_add(k - 1), spin).map_err(gave_up)?;
                }
                let data = unsafe { std::slice::from_raw_parts_mut(st.slot(k), len) };
                b.memcpy_dtoh(data, req.device + at, Some(stream)).err()
            };
            if let Some(e) = failed {
                st.abort();
                return Err(e);
            }
            st.set(if h2d { Count::Drained } else { Count::Filled }, seq.wrapping_add(k + 1));
        }
        Ok(PhosMemcpyStagedReply {})
    }

    fn phos_host_alloc(&self, cx: &CallCx, req: PhosHostAllocRequest) -> Result<PhosHostAllocReply, CudaError> {
        const HOST_ALLOC_FLAGS: u32 = 0x1 | 0x2 | 0x4; // portable, mapped, write-combined
        if req.flags & !HOST_ALLOC_FLAGS != 0 {
            return Err(CudaError::InvalidValue);
        }
        let (host, device) =
            self.pinned
                .alloc(self.backend.as_ref(), &self.memory, req.size, req.flags, cx.forced())
                .map_err(|e| if self.pinned.at_limit() { self.refuse(cx, LimitKind::HostAllocations) } else { e })?;
        Ok(PhosHostAllocReply { host, device })
    }

    fn phos_host_free(&self, cx: &CallCx, req: PhosHostFreeRequest) -> Result<PhosHostFreeReply, CudaError> {
        // Work in flight may still read or write the memory.
        self.backend.device_synchronize(cx.device)?;
        self.pinned.free(self.backend.as_ref(), &self.memory, req.host)?;
        Ok(PhosHostFreeReply {})
    }

    fn phos_memcpy_pinned(&self, _: &CallCx, req: PhosMemcpyPinnedRequest) -> Result<PhosMemcpyPinnedReply, CudaError> {
        let to_device = match req.direction {
            consts::cudaMemcpyHostToDevice => true,
            consts::cudaMemcpyDeviceToHost => false,
            _ => return Err(CudaError::InvalidMemcpyDirection),
        };
        if !self.pinned.covers(req.host, req.count) {
            crate::guest_warn!(self.id, "a pinned copy outside the session's pinned allocations");
            return Err(CudaError::InvalidValue);
        }
        if req.count == 0 {
            return Ok(PhosMemcpyPinnedReply {});
        }
        let stream = if req.ordered != 0 { Some(self.stream(req.stream)?) } else { None };
        if req.ordered != 0
            && let Some(mut captures) = self.captures.active()
            && captures.of_stream(req.stream).is_some()
        {
            // Captured copies of pinned memory read or write it when the graph runs, as in CUDA.
            let op = GraphOp::CopyPinned { device: req.device, host: req.host, count: req.count, to_device };
            return captures.record(req.stream, || op).unwrap_or(Ok(())).map(|_| PhosMemcpyPinnedReply {});
        }
        self.backend.memcpy_registered(req.device, req.host, req.count, to_device, stream)?;
        Ok(PhosMemcpyPinnedReply {})
    }

    fn phos_launch_kernel(
        &self,
        cx: &CallCx,
        req: PhosLaunchKernelRequest<'_>,
    ) -> Result<PhosLaunchKernelReply, CudaError> {
        self.launch(cx, req.function, req.grid, req.block, req.sharedMem, req.stream, req.params, false)?;
        Ok(PhosLaunchKernelReply {})
    }

    fn phos_launch_cooperative_kernel(
        &self,
        cx: &CallCx,
        req: PhosLaunchCooperativeKernelRequest<'_>,
    ) -> Result<PhosLaunchCooperativeKernelReply, CudaError> {
        self.launch(cx, req.function, req.grid, req.block, req.sharedMem, req.stream, req.params, true)?;
        Ok(PhosLaunchCooperativeKernelReply {})
    }

    fn cuda_device_get_limit(
        &self,
        cx: &CallCx,
        req: CudaDeviceGetLimitRequest,
    ) -> Result<CudaDeviceGetLimitReply, CudaError> {
        Ok(CudaDeviceGetLimitReply { pValue: self.backend.limit(cx.device, req.limit)? })
    }

    fn cuda_device_set_limit(
        &self,
        cx: &CallCx,
        req: CudaDeviceSetLimitRequest,
    ) -> Result<CudaDeviceSetLimitReply, CudaError> {
        self.backend.set_limit(cx.device, req.limit, req.value)?;
        Ok(CudaDeviceSetLimitReply {})
    }

    fn cuda_device_get_cache_config(
        &self,
        cx: &CallCx,
        _: CudaDeviceGetCacheConfigRequest,
    ) -> Result<CudaDeviceGetCacheConfigReply, CudaError> {
        Ok(CudaDeviceGetCacheConfigReply { pCacheConfig: self.backend.cache_config(cx.device)? })
    }

    fn cuda_device_set_cache_config(
        &self,
        cx: &CallCx,
        req: CudaDeviceSetCacheConfigRequest,
    ) -> Result<CudaDeviceSetCacheConfigReply, CudaError> {
        self.backend.set_cache_config(cx.device, req.cacheConfig)?;
        Ok(CudaDeviceSetCacheConfigReply {})
    }

    fn cuda_device_get_shared_mem_config(
        &self,
        cx: &CallCx,
        _: CudaDeviceGetSharedMemConfigRequest,
    ) -> Result<CudaDeviceGetSharedMemConfigReply, CudaError> {
        Ok(CudaDeviceGetSharedMemConfigReply { pConfig: self.backend.shared_mem_config(cx.device)? })
    }

    fn cuda_device_set_shared_mem_config(
        &self,
        cx: &CallCx,
        req: CudaDeviceSetSharedMemConfigRequest,
    ) -> Result<CudaDeviceSetSharedMemConfigReply, CudaError> {
        self.backend.set_shared_mem_config(cx.device, req.config)?;
        Ok(CudaDeviceSetSharedMemConfigReply {})
    }

    fn cuda_device_get_stream_priority_range(
        &self,
        cx: &CallCx,
        _: CudaDeviceGetStreamPriorityRangeRequest,
    ) -> Result<CudaDeviceGetStreamPriorityRangeReply, CudaError> {
        let (least, greatest) = self.backend.stream_priority_range(cx.device)?;
        Ok(CudaDeviceGetStreamPriorityRangeReply { leastPriority: least, greatestPriority: greatest })
    }

    fn cuda_device_can_access_peer(
        &self,
        _: &CallCx,
        req: CudaDeviceCanAccessPeerRequest,
    ) -> Result<CudaDeviceCanAccessPeerReply, CudaError> {
        self.check_device(req.device)?;
        self.check_device(req.peerDevice)?;
        // A device is not its own peer.
        let can = req.device != req.peerDevice && self.backend.can_access_peer(req.device, req.peerDevice)?;
        Ok(CudaDeviceCanAccessPeerReply { canAccessPeer: can as i32 })
    }

    fn cuda_device_enable_peer_access(
        &self,
        cx: &CallCx,
        req: CudaDeviceEnablePeerAccessRequest,
    ) -> Result<CudaDeviceEnablePeerAccessReply, CudaError> {
        self.check_device(req.peerDevice)?;
        if req.peerDevice == cx.device {
            // What CUDA answers for a device and itself (measured on an H100).
            return Err(CudaError::PeerAccessUnsupported);
        }
        self.backend.enable_peer_access(cx.device, req.peerDevice)?;
        Ok(CudaDeviceEnablePeerAccessReply {})
    }

    fn cuda_device_disable_peer_access(
        &self,
        cx: &CallCx,
        req: CudaDeviceDisablePeerAccessRequest,
    ) -> Result<CudaDeviceDisablePeerAccessReply, CudaError> {
        self.check_device(req.peerDevice)?;
        if req.peerDevice == cx.device {
            return Err(CudaError::InvalidDevice);
        }
        self.backend.disable_peer_access(cx.device, req.peerDevice)?;
        Ok(CudaDeviceDisablePeerAccessReply {})
    }

    fn cuda_ctx_reset_persisting_l2_cache(
        &self,
        cx: &CallCx,
        _: CudaCtxResetPersistingL2CacheRequest,
    ) -> Result<CudaCtxResetPersistingL2CacheReply, CudaError> {
        self.backend.reset_persisting_l2_cache(cx.device)?;
        Ok(CudaCtxResetPersistingL2CacheReply {})
    }

    fn phos_memcpy_3d(&self, _: &CallCx, req: PhosMemcpy3DRequest<'_>) -> Result<PhosMemcpy3DReply, CudaError> {
        if req.ordered != 0 && self.captures.active().is_some_and(|c| c.of_stream(req.stream).is_some()) {
            return self.capture_copy_3d(&req).map(|_| PhosMemcpy3DReply { dst: None });
        }
        Ok(PhosMemcpy3DReply { dst: self.copy_3d(&req)? })
    }

    fn phos_memset_3d(&self, _: &CallCx, req: PhosMemset3DRequest) -> Result<PhosMemset3DReply, CudaError> {
        let stream = if req.ordered != 0 { Some(self.stream(req.stream)?) } else { None };
        if req.ordered != 0
            && let Some(mut captures) = self.captures.active()
            && captures.of_stream(req.stream).is_some()
        {
            for z in 0..req.depth {
                let op = || GraphOp::Memset {
                    dst: req.dst + z * req.slice,
                    pitch: req.pitch,
                    value: req.value as u8,
                    width: req.width,
                    height: req.height,
                };
                captures.record(req.stream, op).unwrap_or(Ok(()))?;
            }
            return Ok(PhosMemset3DReply {});
        }
        for z in 0..req.depth {
            let dst = req.dst + z * req.slice;
            self.backend.memset_2d(dst, req.pitch, req.value as u8, req.width, req.height, stream)?;
        }
        Ok(PhosMemset3DReply {})
    }

    fn phos_pointer_device(
        &self,
        cx: &CallCx,
        req: PhosPointerDeviceRequest,
    ) -> Result<PhosPointerDeviceReply, CudaError> {
        // Module variables are the calling device's.
        let device = match self.memory.device_of(req.ptr) {
            Some(d) => d,
            None if self.memory.contains(req.ptr, 1) => cx.device,
            None => return Err(CudaError::InvalidValue),
        };
        Ok(PhosPointerDeviceReply { device })
    }

    fn cuda_memcpy_to_symbol_async(
        &self,
        _: &CallCx,
        req: CudaMemcpyToSymbolAsyncRequest<'_>,
    ) -> Result<CudaMemcpyToSymbolAsyncReply, CudaError> {
        let stream = self.stream(req.stream)?;
        let dst = Ptr::Device(req.symbol_base + req.offset);
        if let Some(r) = self.capture_copy(req.stream, &dst, &req.src, req.count) {
            return r.map(|_| CudaMemcpyToSymbolAsyncReply {});
        }
        self.copy(&dst, &req.src, req.count, Some(stream))?;
        Ok(CudaMemcpyToSymbolAsyncReply {})
    }

    fn cuda_memcpy_from_symbol_async(
        &self,
        _: &CallCx,
        req: CudaMemcpyFromSymbolAsyncRequest<'_>,
    ) -> Result<CudaMemcpyFromSymbolAsyncReply, CudaError> {
        let stream = self.stream(req.stream)?;
        let src = Ptr::Device(req.symbol_base + req.offset);
        if let Some(r) = self.capture_copy(req.stream, &req.dst, &src, req.count) {
            return r.map(|_| CudaMemcpyFromSymbolAsyncReply { dst: None });
        }
        Ok(CudaMemcpyFromSymbolAsyncReply { dst: self.copy(&req.dst, &src, req.count, Some(stream))? })
    }

    fn cuda_stream_create_with_priority(
        &self,
        cx: &CallCx,
        req: CudaStreamCreateWithPriorityRequest,
    ) -> Result<CudaStreamCreateWithPriorityReply, CudaError> {
        Ok(CudaStreamCreateWithPriorityReply { pStream: self.create_stream(cx, req.flags, req.priority)? })
    }

    fn cuda_stream_get_priority(
        &self,
        cx: &CallCx,
        req: CudaStreamGetPriorityRequest,
    ) -> Result<CudaStreamGetPriorityReply, CudaError> {
        Ok(CudaStreamGetPriorityReply { priority: self.stream_facts(cx, req.hStream)?.1 })
    }

    fn cuda_stream_get_flags(
        &self,
        cx: &CallCx,
        req: CudaStreamGetFlagsRequest,
    ) -> Result<CudaStreamGetFlagsReply, CudaError> {
        Ok(CudaStreamGetFlagsReply { flags: self.stream_facts(cx, req.hStream)?.0 })
    }

    fn cuda_stream_get_device(
        &self,
        cx: &CallCx,
        req: CudaStreamGetDeviceRequest,
    ) -> Result<CudaStreamGetDeviceReply, CudaError> {
        Ok(CudaStreamGetDeviceReply { device: self.stream_facts(cx, req.hStream)?.2 })
    }

    fn cuda_stream_get_id(&self, cx: &CallCx, req: CudaStreamGetIdRequest) -> Result<CudaStreamGetIdReply, CudaError> {
        // The handle is unique in the session for as long as the stream lives; the special
        // streams keep their own values.
        self.stream_facts(cx, req.hStream)?;
        Ok(CudaStreamGetIdReply { streamId: req.hStream })
    }

    fn cuda_stream_wait_event(
        &self,
        _: &CallCx,
        req: CudaStreamWaitEventRequest,
    ) -> Result<CudaStreamWaitEventReply, CudaError> {
        let s = self.stream(req.stream)?;
        let e = self.event(req.event)?;
        if let Some(r) = self.captures.active().and_then(|mut c| c.wait_event(req.stream, req.event)) {
            return r.map(|_| CudaStreamWaitEventReply {});
        }
        self.backend.stream_wait_event(s, e)?;
        Ok(CudaStreamWaitEventReply {})
    }

    fn cuda_event_record_with_flags(
        &self,
        _: &CallCx,
        req: CudaEventRecordWithFlagsRequest,
    ) -> Result<CudaEventRecordWithFlagsReply, CudaError> {
        let e = self.event(req.event)?;
        let s = self.stream(req.stream)?;
        if self.captures.active().is_some_and(|mut c| c.record_event(req.event, req.stream)) {
            return Ok(CudaEventRecordWithFlagsReply {});
        }
        self.backend.event_record(e, s)?;
        Ok(CudaEventRecordWithFlagsReply {})
    }

    fn phos_host_func_enqueue(
        &self,
        _: &CallCx,
        req: PhosHostFuncEnqueueRequest,
    ) -> Result<PhosHostFuncEnqueueReply, CudaError> {
        let stream = self.stream(req.stream)?;
        {
            let gates = self.gates.lock().unwrap();
            if gates.len() >= MAX_GATES || gates.contains_key(&req.gate) {
                return Err(CudaError::InvalidValue);
            }
        }
        // Not under the table's lock: a backend may wait here for earlier gates to open.
        let gate = Gate::new();
        self.backend.host_func(stream, gate.clone())?;
        self.gates.lock().unwrap().insert(req.gate, (gate, stream));
        Ok(PhosHostFuncEnqueueReply {})
    }

    fn phos_host_func_wait(
        &self,
        _: &CallCx,
        req: PhosHostFuncWaitRequest,
    ) -> Result<PhosHostFuncWaitReply, CudaError> {
        let (gate, stream) =
            self.gates.lock().unwrap().get(&req.gate).cloned().ok_or(CudaError::InvalidResourceHandle)?;
        // Work that faults never reaches the gate: the stream's error ends the wait.
        while !gate.wait_reached(std::time::Duration::from_millis(50)) {
            if let Some(e) = self.sticky_error() {
                return Err(e);
            }
            if let Err(e) = self.backend.stream_query(stream) {
                self.note_error(e);
                return Err(e);
            }
        }
        match self.sticky_error() {
            Some(e) => Err(e),
            None => Ok(PhosHostFuncWaitReply {}),
        }
    }

    fn phos_host_func_done(
        &self,
        _: &CallCx,
        req: PhosHostFuncDoneRequest,
    ) -> Result<PhosHostFuncDoneReply, CudaError> {
        let (gate, _) = self.gates.lock().unwrap().remove(&req.gate).ok_or(CudaError::InvalidResourceHandle)?;
        gate.open();
        Ok(PhosHostFuncDoneReply {})
    }

    fn cuda_stream_begin_capture(
        &self,
        _: &CallCx,
        req: CudaStreamBeginCaptureRequest,
    ) -> Result<CudaStreamBeginCaptureReply, CudaError> {
        // The legacy stream cannot be captured.
        if req.stream <= 1 {
            return Err(CudaError::StreamCaptureUnsupported);
        }
        self.stream(req.stream)?;
        self.captures.update(|c| c.begin(req.stream))?;
        Ok(CudaStreamBeginCaptureReply {})
    }

    fn cuda_stream_end_capture(
        &self,
        cx: &CallCx,
        req: CudaStreamEndCaptureRequest,
    ) -> Result<CudaStreamEndCaptureReply, CudaError> {
        self.stream(req.stream)?;
        let ops = self.captures.update(|c| c.end(req.stream))?;
        // Each captured operation is a node after the one before it.
        let graph = self.insert(&self.graphs, LimitKind::Graphs, cx, Graph::default())?;
        for op in ops {
            let deps = self.graphs.lock().unwrap().get(graph)?.nodes.len().checked_sub(1).into_iter().collect();
            self.add_node(cx, graph, Graph::kind_of(&op), vec![op], deps)?;
        }
        Ok(CudaStreamEndCaptureReply { pGraph: graph })
    }

    fn cuda_stream_is_capturing(
        &self,
        _: &CallCx,
        req: CudaStreamIsCapturingRequest,
    ) -> Result<CudaStreamIsCapturingReply, CudaError> {
        self.stream(req.stream)?;
        Ok(CudaStreamIsCapturingReply { pCaptureStatus: self.captures.lock().status(req.stream).0 })
    }

    fn phos_stream_capture_info(
        &self,
        _: &CallCx,
        req: PhosStreamCaptureInfoRequest,
    ) -> Result<PhosStreamCaptureInfoReply, CudaError> {
        self.stream(req.stream)?;
        let (status, id) = self.captures.lock().status(req.stream);
        Ok(PhosStreamCaptureInfoReply { status, id })
    }

    fn phos_graph_instantiate(
        &self,
        cx: &CallCx,
        req: PhosGraphInstantiateRequest,
    ) -> Result<PhosGraphInstantiateReply, CudaError> {
        let ops = self.graphs.lock().unwrap().get(req.graph)?.order()?;
        Ok(PhosGraphInstantiateReply { pGraphExec: self.insert(&self.graph_execs, LimitKind::GraphExecs, cx, ops)? })
    }

    fn cuda_graph_launch(&self, cx: &CallCx, req: CudaGraphLaunchRequest) -> Result<CudaGraphLaunchReply, CudaError> {
        let ops = self.graph_execs.lock().unwrap().get(req.graphExec)?.clone();
        // Launching into a capture records the graph's work there.
        if let Some(mut captures) = self.captures.active()
            && captures.of_stream(req.stream).is_some()
        {
            for op in ops {
                captures.record(req.stream, || op).unwrap_or(Ok(()))?;
            }
            return Ok(CudaGraphLaunchReply {});
        }
        self.replay(cx, &ops, req.stream)?;
        Ok(CudaGraphLaunchReply {})
    }

    fn cuda_graph_upload(&self, _: &CallCx, req: CudaGraphUploadRequest) -> Result<CudaGraphUploadReply, CudaError> {
        self.graph_execs.lock().unwrap().get(req.graphExec)?;
        self.stream(req.stream)?;
        Ok(CudaGraphUploadReply {})
    }

    fn phos_graph_exec_update(
        &self,
        _: &CallCx,
        req: PhosGraphExecUpdateRequest,
    ) -> Result<PhosGraphExecUpdateReply, CudaError> {
        let new = self.graphs.lock().unwrap().get(req.hGraph)?.order()?;
        let mut execs = self.graph_execs.lock().unwrap();
        let exec = execs.get_mut(req.hGraphExec)?;
        let verdict = if exec.len() != new.len() {
            Err(crate::capture::UPDATE_TOPOLOGY_CHANGED)
        } else {
            exec.iter().zip(&new).try_for_each(|(a, b)| a.update_from(b))
        };
        match verdict {
            Ok(()) => {
                *exec = new;
                Ok(PhosGraphExecUpdateReply { result: crate::capture::UPDATE_SUCCESS })
            }
            // The guest reports the result with cudaErrorGraphExecUpdateFailure.
            Err(result) => Ok(PhosGraphExecUpdateReply { result }),
        }
    }

    fn cuda_graph_create(&self, cx: &CallCx, _: CudaGraphCreateRequest) -> Result<CudaGraphCreateReply, CudaError> {
        Ok(CudaGraphCreateReply { pGraph: self.insert(&self.graphs, LimitKind::Graphs, cx, Graph::default())? })
    }

    fn phos_graph_add_kernel_node(
        &self,
        cx: &CallCx,
        req: PhosGraphAddKernelNodeRequest<'_>,
    ) -> Result<PhosGraphAddKernelNodeReply, CudaError> {
        let deps = self.node_indices(req.graph, req.deps)?;
        self.function(req.function)?;
        self.check_launch(cx.device, req.grid, req.block, req.sharedMem)?;
        let op = GraphOp::Kernel {
            function: req.function,
            grid: req.grid,
            block: req.block,
            shared_mem: req.sharedMem,
            params: req.params.to_vec(),
            cooperative: false,
        };
        let node = self.add_node(cx, req.graph, crate::capture::NODE_KERNEL, vec![op], deps)?;
        Ok(PhosGraphAddKernelNodeReply { pGraphNode: node })
    }

    fn phos_graph_add_copy_node(
        &self,
        cx: &CallCx,
        req: PhosGraphAddCopyNodeRequest<'_>,
    ) -> Result<PhosGraphAddCopyNodeReply, CudaError> {
        let deps = self.node_indices(req.graph, req.deps)?;
        let (w, h) = (req.width, req.height);
        let slice = w.checked_mul(h).and_then(|n| usize::try_from(n).ok()).ok_or(CudaError::InvalidValue)?;
        let mut ops = Vec::new();
        for z in 0..req.depth {
            let dst = req.dst + z * req.dslice;
            ops.push(match &req.src {
                Ptr::Device(s) => GraphOp::CopyOnDevice {
                    dst,
                    dpitch: req.dpitch,
                    src: s + z * req.sslice,
                    spitch: req.spitch,
                    width: w,
                    height: h,
                },
                Ptr::In(bytes) => GraphOp::CopyToDevice {
                    dst,
                    dpitch: req.dpitch,
                    data: bytes[z as usize * slice..(z as usize + 1) * slice].to_vec(),
                    width: w,
                    height: h,
                },
                _ => return Err(CudaError::InvalidValue),
            });
        }
        let node = self.add_node(cx, req.graph, crate::capture::NODE_MEMCPY, ops, deps)?;
        Ok(PhosGraphAddCopyNodeReply { pGraphNode: node })
    }

    fn phos_graph_add_set_node(
        &self,
        cx: &CallCx,
        req: PhosGraphAddSetNodeRequest,
    ) -> Result<PhosGraphAddSetNodeReply, CudaError> {
        let deps = self.node_indices(req.graph, req.deps)?;
        let op = GraphOp::Memset {
            dst: req.dst,
            pitch: req.pitch,
            value: req.value as u8,
            width: req.width,
            height: req.height,
        };
        let node = self.add_node(cx, req.graph, crate::capture::NODE_MEMSET, vec![op], deps)?;
        Ok(PhosGraphAddSetNodeReply { pGraphNode: node })
    }

    fn phos_graph_add_empty_node(
        &self,
        cx: &CallCx,
        req: PhosGraphAddEmptyNodeRequest<'_>,
    ) -> Result<PhosGraphAddEmptyNodeReply, CudaError> {
        let deps = self.node_indices(req.graph, req.deps)?;
        let node = self.add_node(cx, req.graph, crate::capture::NODE_EMPTY, Vec::new(), deps)?;
        Ok(PhosGraphAddEmptyNodeReply { pGraphNode: node })
    }

    fn phos_graph_add_dependencies(
        &self,
        _: &CallCx,
        req: PhosGraphAddDependenciesRequest<'_>,
    ) -> Result<PhosGraphAddDependenciesReply, CudaError> {
        let from = self.node_indices(req.graph, req.from)?;
        let to = self.node_indices(req.graph, req.to)?;
        let mut graphs = self.graphs.lock().unwrap();
        let g = graphs.get_mut(req.graph)?;
        for (f, t) in from.into_iter().zip(to) {
            if f == t || g.nodes[t].deps.contains(&f) {
                return Err(CudaError::InvalidValue);
            }
            g.nodes[t].deps.push(f);
        }
        Ok(PhosGraphAddDependenciesReply {})
    }

    fn phos_graph_nodes(&self, _: &CallCx, req: PhosGraphNodesRequest) -> Result<PhosGraphNodesReply, CudaError> {
        let graphs = self.graphs.lock().unwrap();
        let g = graphs.get(req.graph)?;
        let mut nodes = Vec::new();
        for node in g.nodes.iter().take(req.max as usize) {
            nodes.extend_from_slice(&node.handle.to_ne_bytes());
        }
        nodes.resize(req.max as usize * 8, 0);
        Ok(PhosGraphNodesReply { nodes, count: g.nodes.len() as u64 })
    }

    fn cuda_graph_node_get_type(
        &self,
        _: &CallCx,
        req: CudaGraphNodeGetTypeRequest,
    ) -> Result<CudaGraphNodeGetTypeReply, CudaError> {
        let (g, index) = *self.graph_nodes.lock().unwrap().get(req.node)?;
        let kind = self.graphs.lock().unwrap().get(g)?.nodes[index].kind;
        Ok(CudaGraphNodeGetTypeReply { pType: kind })
    }

    fn cuda_graph_exec_destroy(
        &self,
        _: &CallCx,
        req: CudaGraphExecDestroyRequest,
    ) -> Result<CudaGraphExecDestroyReply, CudaError> {
        self.graph_execs.lock().unwrap().remove(req.graphExec)?;
        Ok(CudaGraphExecDestroyReply {})
    }

    fn cuda_graph_destroy(&self, _: &CallCx, req: CudaGraphDestroyRequest) -> Result<CudaGraphDestroyReply, CudaError> {
        self.graphs.lock().unwrap().remove(req.graph)?;
        self.graph_nodes.lock().unwrap().retain(|(g, _)| *g != req.graph);
        Ok(CudaGraphDestroyReply {})
    }

    fn phos_func_get_attributes(
        &self,
        _: &CallCx,
        req: PhosFuncGetAttributesRequest,
    ) -> Result<PhosFuncGetAttributesReply, CudaError> {
        Ok(PhosFuncGetAttributesReply { attr: self.backend.function_attributes(self.function(req.function)?)? })
    }

    fn phos_func_set_attribute(
        &self,
        _: &CallCx,
        req: PhosFuncSetAttributeRequest,
    ) -> Result<PhosFuncSetAttributeReply, CudaError> {
        // cudaFuncAttributeMaxDynamicSharedMemorySize and PreferredSharedMemoryCarveout;
        // the cluster attributes need cluster launches, which Phos does not carry.
        if !(8..=9).contains(&req.attr) {
            return Err(CudaError::InvalidValue);
        }
        self.backend.function_set_attribute(self.function(req.function)?, req.attr, req.value)?;
        Ok(PhosFuncSetAttributeReply {})
    }

    fn phos_func_set_cache_config(
        &self,
        _: &CallCx,
        req: PhosFuncSetCacheConfigRequest,
    ) -> Result<PhosFuncSetCacheConfigReply, CudaError> {
        self.backend.function_set_cache_config(self.function(req.function)?, req.config)?;
        Ok(PhosFuncSetCacheConfigReply {})
    }

    fn phos_occupancy_max_active_blocks(
        &self,
        _: &CallCx,
        req: PhosOccupancyMaxActiveBlocksRequest,
    ) -> Result<PhosOccupancyMaxActiveBlocksReply, CudaError> {
        let f = self.function(req.function)?;
        if req.blockSize <= 0 {
            return Err(CudaError::InvalidValue);
        }
        let n = self.backend.occupancy(f, req.blockSize, req.dynamicSMemSize, req.flags)?;
        Ok(PhosOccupancyMaxActiveBlocksReply { numBlocks: n })
    }

    fn phos_occupancy_available_dynamic_s_mem(
        &self,
        _: &CallCx,
        req: PhosOccupancyAvailableDynamicSMemRequest,
    ) -> Result<PhosOccupancyAvailableDynamicSMemReply, CudaError> {
        let f = self.function(req.function)?;
        let n = self.backend.available_dynamic_smem(f, req.numBlocks, req.blockSize)?;
        Ok(PhosOccupancyAvailableDynamicSMemReply { dynamicSmemSize: n })
    }
}

impl Session {
    /// One kernel launch (plain or cooperative).
    #[allow(clippy::too_many_arguments)]
    fn launch(
        &self,
        cx: &CallCx,
        function: u64,
        grid: Dim3,
        block: Dim3,
        shared_mem: u32,
        stream: u64,
        params: &[u8],
        cooperative: bool,
    ) -> Result<(), CudaError> {
        let raw = self.functions.lock().unwrap().get(function)?.raw;
        if self.captures.active().is_some_and(|c| c.of_stream(stream).is_some()) {
            self.check_launch(cx.device, grid, block, shared_mem)?;
            let op = || GraphOp::Kernel { function, grid, block, shared_mem, params: params.to_vec(), cooperative };
            return self.captures.lock().record(stream, op).unwrap_or(Ok(()));
        }
        let stream = self.stream(stream)?;
        self.check_launch(cx.device, grid, block, shared_mem)?;
        let mut printed = Vec::new();
        let view = self.memory.view();
        let r = self.backend.launch(
            raw,
            grid,
            block,
            shared_mem,
            stream,
            params,
            &view,
            &mut printed,
            cx.measure,
            cooperative,
        );
        drop(view);
        self.output.push(&printed);
        match r {
            // A fault while the kernel ran (a backend that runs kernels before the launch
            // returns) is not the launch's error: like a GPU's, it corrupts the context and
            // surfaces at the next call.
            Err(e) if e.is_sticky() => {
                self.note_error(e);
                Ok(())
            }
            Err(e) => Err(e),
            Ok(()) => Ok(()),
        }
    }
}
