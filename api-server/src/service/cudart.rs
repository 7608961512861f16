//! The runtime API's semantics, on top of the session's registries and backend: the
//! hand-written half of the spec-generated `CudartService` trait. By the time a method here
//! runs, the generated dispatch has decoded the request and checked its preconditions,
//! buffer sizes, argument shapes and device ranges; what is left is to translate virtual
//! handles, apply CUDA's rules and call the backend.

use std::sync::atomic::Ordering;

use phos_protocol::apis::Function as ApiFunction;
use phos_protocol::cudart::*;
use phos_protocol::limits::LimitKind;
use phos_protocol::spec::{CallAccess, DeviceAccess};
use phos_protocol::types::{Dim3, IpcHandle};
use phos_protocol::{CudaError, Ptr};

use super::{CallCx, Session};
use crate::backend::{Copy2D, StreamRef};
use crate::capture::{
    COND_IF, COND_SWITCH, COND_WHILE, GraphOp, NODE_EMPTY, NODE_EVENT_RECORD, NODE_HOST, NODE_KERNEL, NODE_MEMCPY,
    NODE_MEMSET, NODE_WAIT_EVENT,
};
use crate::dispatch::cudart::CudartService;

/// `cudaStreamNonBlocking`: a stream that does not synchronise with the legacy stream.
const STREAM_NON_BLOCKING: u32 = 0x1;

/// The work of the runtime API's calls, shared by several of them.
impl Session {
    pub(crate) fn check_device(&self, device: i32) -> Result<(), CudaError> {
        if device < 0 || device >= self.backend().device_count() { Err(CudaError::InvalidDevice) } else { Ok(()) }
    }

    fn create_stream(&self, cx: &CallCx, flags: u32, priority: i32) -> Result<u64, CudaError> {
        self.with_new_handle(cx, LimitKind::Streams, |new| {
            self.objects.streams.create(self.backend(), cx.device, flags, priority, new)
        })
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
        self.objects.graphs.add_node(graph, kind, ops, deps, &|| self.refuse(cx, LimitKind::GraphNodes))
    }

    /// Give the session's memory back for the graph allocations nothing names any more (once
    /// the device is idle: launched work may still use them).
    fn release_graph_blocks(&self, cx: &CallCx) -> Result<(), CudaError> {
        let gone = self.objects.graphs.release_unreferenced();
        if gone.is_empty() {
            return Ok(());
        }
        self.backend().device_synchronize(cx.device)?;
        for dptr in gone {
            self.objects.memory.free(self.backend(), dptr)?;
        }
        Ok(())
    }

    /// Reserve a graph allocation's block: `size` bytes of the session's memory on `device`.
    fn reserve_graph_block(&self, cx: &CallCx, device: i32, size: u64) -> Result<u64, CudaError> {
        self.check_device(device)?;
        if size == 0 {
            return Err(CudaError::InvalidValue);
        }
        self.objects
            .memory
            .alloc(self.backend(), device, size)
            .map_err(|e| if self.objects.memory.at_limit() { self.refuse(cx, LimitKind::Allocations) } else { e })
    }

    /// Whether `dptr` starts a block of the session's memory (a `cudaMallocAsync`'s, the guest
    /// says) that a free node may free.
    fn is_async_block(&self, dptr: u64, async_block: i32) -> bool {
        async_block == 1 && self.objects.memory.allocation_at(dptr).is_some_and(|a| a.addr == dptr)
    }

    /// Work on the legacy stream (`stream` 0 or 1; `None`: a synchronous call, which runs on
    /// it) while a stream of the calling device that was not created with
    /// `cudaStreamNonBlocking` captures: the legacy stream would wait on the capturing stream,
    /// so CUDA refuses it (`cudaErrorStreamCaptureImplicit`) and the capture is invalidated.
    fn legacy_use(&self, cx: &CallCx, stream: Option<u64>) -> Result<(), CudaError> {
        self.legacy_implied(cx, stream, true)
    }

    /// A capture query of the legacy stream while a blocking stream of the calling device
    /// captures: CUDA answers `cudaErrorStreamCaptureImplicit` and, a query having no effect,
    /// leaves the capture as it is (`cudaStreamIsCapturing`'s documentation).
    fn legacy_query(&self, cx: &CallCx, stream: u64) -> Result<(), CudaError> {
        self.legacy_implied(cx, Some(stream), false)
    }

    fn legacy_implied(&self, cx: &CallCx, stream: Option<u64>, invalidates: bool) -> Result<(), CudaError> {
        if stream.is_some_and(|s| s > 1) {
            return Ok(());
        }
        let Some(mut captures) = self.objects.graphs.captures.active() else { return Ok(()) };
        let mut implicit = false;
        for (member, id) in captures.members() {
            let blocking = self
                .objects
                .streams
                .facts(member, cx.device)
                .is_ok_and(|(flags, _, device)| device == cx.device && flags & STREAM_NON_BLOCKING == 0);
            if blocking {
                if invalidates {
                    captures.invalidate(id);
                }
                implicit = true;
            }
        }
        if implicit { Err(CudaError::StreamCaptureImplicit) } else { Ok(()) }
    }

    /// A 1D copy in a capturing stream: recorded (device to device, host to device with the
    /// data as it is now), or refused (to host). `None` when `stream` does not capture.
    fn capture_copy(&self, stream: u64, dst: &Ptr<'_>, src: &Ptr<'_>, count: u64) -> Option<Result<(), CudaError>> {
        let mut captures = self.objects.graphs.captures.active()?;
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
            return Err(self
                .objects
                .graphs
                .captures
                .lock()
                .refuse(req.stream)
                .unwrap_or(CudaError::StreamCaptureUnsupported));
        }
        let slot = st.slot_bytes();
        let mut data = Vec::new();
        data.try_reserve_exact(req.count as usize).map_err(|_| CudaError::MemoryAllocation)?;
        for k in 0..chunks(req.count, slot) as u32 {
            let at = data.len();
            let len = slot.min(req.count as usize - at);
            if let Err(e) = st.wait(Count::Filled, seq, seq.wrapping_add(k + 1), phos_protocol::shm::default_spin()) {
                crate::guest_warn!(self.id, "staged copy: {e}");
                st.abort();
                return Err(CudaError::Unknown);
            }
            // A volatile copy: the guest can write the slot at any time (by the protocol it
            // leaves it alone until the chunk is counted drained, just below).
            data.resize(at + len, 0);
            st.slot(k).copy_to(&mut data[at..]);
            st.set(Count::Drained, seq.wrapping_add(k + 1));
        }
        let count = req.count;
        let op = GraphOp::CopyToDevice { dst: req.device, dpitch: count, data, width: count, height: 1 };
        self.objects.graphs.captures.lock().record(req.stream, || op).unwrap_or(Ok(()))?;
        Ok(PhosMemcpyStagedReply {})
    }

    /// A strided copy in a capturing stream, one recorded 2D copy per slice.
    fn capture_copy_3d(&self, req: &PhosMemcpy3DRequest<'_>) -> Result<(), CudaError> {
        let mut captures = self.objects.graphs.captures.lock();
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

    /// Run a graph's work on `stream`, in capture order. Host nodes wait at the gates from
    /// `gates` on (announced by `phosGraphHostNodes`); a graph with host nodes launched without
    /// them is refused.
    fn replay(&self, cx: &CallCx, ops: &[GraphOp], stream: u64, gates: Option<u64>) -> Result<(), CudaError> {
        let on = self.objects.streams.resolve(stream)?;
        self.check_replay(ops)?;
        let s = Some(on);
        let b = self.backend();
        let mut next_gate = gates;
        for op in ops {
            if self.hooks.active() {
                self.before_work("cudaGraphLaunch", &op.device_access())?;
            }
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
                    b.memcpy_registered(*device, *host, *count, *to_device, s)?
                }
                GraphOp::Library { api, function, device, payload, position } => {
                    self.run_library_op(cx, (*api, *function), *device, payload, *position, stream)?
                }
                GraphOp::Host { .. } => {
                    let Some(gate) = next_gate else {
                        crate::guest_warn!(self.id, "cudaGraphLaunch: a graph with host nodes launched without gates");
                        return Err(CudaError::InvalidValue);
                    };
                    self.objects.streams.place_gate(b, on, gate)?;
                    next_gate = Some(gate + 1);
                }
                GraphOp::EventRecord { event } => b.event_record(self.objects.events.resolve(*event)?, on)?,
                GraphOp::EventWait { event } => b.stream_wait_event(on, self.objects.events.resolve(*event)?)?,
                // Markers and child graphs are resolved when the executable graph is made; an
                // allocation's block is reserved when its node is made, made live at launch.
                GraphOp::Node { .. }
                | GraphOp::Child { .. }
                | GraphOp::MemAlloc { .. }
                | GraphOp::Conditional { .. } => {}
                GraphOp::ConditionalRun { handle, kind, bodies } => {
                    self.run_conditional(cx, (*handle, *kind), bodies, stream)?
                }
                GraphOp::MemFree { dptr } => {
                    // A graph allocation was freed at launch; a block of cudaMallocAsync's is
                    // freed once the stream's earlier work is done.
                    if !self.objects.graphs.is_graph_block(*dptr) {
                        b.stream_synchronize(on)?;
                        let freed = self.objects.memory.free(b, *dptr)?;
                        self.ipc.forget_allocation(freed.addr);
                    }
                }
            }
        }
        Ok(())
    }

    /// Check a graph's copies and memsets against the session's memory as it is now, before
    /// any of them runs: memory the graph names may have been freed (and reused) since the
    /// node was added or captured. A kernel or library op is checked as its direct call is,
    /// when it runs. One range lookup per range; `cudaErrorInvalidValue` and nothing run when
    /// one is no longer the session's.
    fn check_replay(&self, ops: &[GraphOp]) -> Result<(), CudaError> {
        for op in ops {
            if let GraphOp::CopyPinned { host, count, .. } = op
                && !self.objects.host.covers(*host, *count)
            {
                crate::guest_warn!(
                    self.id,
                    "cudaGraphLaunch: refused: the page-locked memory at {host:#x} (+{count}) of a copy node is no longer registered"
                );
                return Err(CudaError::InvalidValue);
            }
            for range in op.device_access() {
                if range.len != 0 && !self.objects.memory.contains(range.addr, range.len) {
                    crate::guest_warn!(
                        self.id,
                        "cudaGraphLaunch: refused: a node's device memory at {:#x} (+{}) is no longer allocated",
                        range.addr,
                        range.len
                    );
                    return Err(CudaError::InvalidValue);
                }
            }
        }
        Ok(())
    }

    /// A conditional node of a launch: once the stream's earlier work is done, its cell says
    /// which body runs (`if`: the first for non-zero, else the second if there is one;
    /// `switch`: the body of that index, none past the last), or whether the body runs again
    /// (`while`: read again after each run). Its bodies run on the launch's stream.
    fn run_conditional(
        &self,
        cx: &CallCx,
        (handle, kind): (u64, i32),
        bodies: &[Vec<GraphOp>],
        stream: u64,
    ) -> Result<(), CudaError> {
        let on = self.objects.streams.resolve(stream)?;
        let b = self.backend();
        let read = || -> Result<u32, CudaError> {
            b.stream_synchronize(on)?;
            // The cell is checked again: a device reset frees the session's memory.
            if !self.objects.memory.contains(handle, 4) {
                crate::guest_warn!(self.id, "cudaGraphLaunch: a conditional node's handle is no longer allocated");
                return Err(CudaError::InvalidValue);
            }
            let mut cell = [0u8; 4];
            b.memcpy_dtoh(&mut cell, handle, Some(on))?;
            Ok(u32::from_ne_bytes(cell))
        };
        match kind {
            COND_IF => {
                let body = if read()? != 0 { bodies.first() } else { bodies.get(1) };
                if let Some(body) = body {
                    self.replay(cx, body, stream, None)?;
                }
            }
            COND_WHILE => {
                let body = bodies.first().ok_or(CudaError::InvalidValue)?;
                while read()? != 0 {
                    self.replay(cx, body, stream, None)?;
                }
            }
            COND_SWITCH => {
                if let Some(body) = bodies.get(read()? as usize) {
                    self.replay(cx, body, stream, None)?;
                }
            }
            _ => return Err(CudaError::InvalidValue),
        }
        Ok(())
    }

    /// A 2D or 3D copy, one 2D copy per slice; a host side is packed.
    fn copy_3d(&self, req: &PhosMemcpy3DRequest<'_>) -> Result<Option<Vec<u8>>, CudaError> {
        let stream = if req.ordered != 0 { Some(self.objects.streams.resolve(req.stream)?) } else { None };
        let b = self.backend();
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

    /// Copy between the kinds of memory a `cudaMemcpy` family call names.
    fn copy(
        &self,
        dst: &Ptr<'_>,
        src: &Ptr<'_>,
        count: u64,
        stream: Option<StreamRef>,
    ) -> Result<Option<Vec<u8>>, CudaError> {
        let b = self.backend();
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

    /// Show the C/R hook what a launch will read and write (speculated from the kernel's
    /// PTX: [`crate::speculation`]); while a concurrent checkpoint's window is armed, the
    /// checked twin to launch instead.
    fn speculate_launch(
        &self,
        cx: &CallCx,
        function: u64,
        params: &[u8],
    ) -> Result<Option<crate::speculation::CheckedLaunch>, CudaError> {
        let window = self.window.read().clone();
        let (access, checked) = crate::timing::timed(
            || "speculating a launch's accesses".into(),
            || crate::speculation::plan_launch(self, function, params, window.as_ref()),
        );
        let name = cx.function.map_or("a kernel launch", |f| f.name());
        crate::timing::timed(|| format!("the C/R hooks before {name}"), || self.before_work(name, &access))?;
        Ok(checked)
    }

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
        let raw = self.objects.modules.resolve_function(function)?;
        if self.objects.graphs.captures.active().is_some_and(|c| c.of_stream(stream).is_some()) {
            self.objects.devices.check_launch(self.backend(), cx.device, grid, block, shared_mem)?;
            let op = || GraphOp::Kernel { function, grid, block, shared_mem, params: params.to_vec(), cooperative };
            return self.objects.graphs.captures.lock().record(stream, op).unwrap_or(Ok(()));
        }
        self.legacy_use(cx, Some(stream))?;
        let stream = self.objects.streams.resolve(stream)?;
        self.objects.devices.check_launch(self.backend(), cx.device, grid, block, shared_mem)?;
        let timed = self.hooks.active() && crate::timing::on();
        // Clock reads only while timed (they cost the launch path where the clock is slow).
        let planning = timed.then(std::time::Instant::now);
        let checked = if self.hooks.active() { self.speculate_launch(cx, function, params)? } else { None };
        let planned = planning.map(|p| p.elapsed());
        let (raw, params) = match &checked {
            Some(c) => (c.function, &c.params[..]),
            None => (raw, params),
        };
        if let Some((queue, call_id)) = &cx.launches {
            // Checked: the channel's submitter launches it while this thread goes on (see
            // crate::pipeline for what may be queued), or, where it may not, the launches
            // queued before it go first.
            if checked.is_none()
                && !cooperative
                && !cx.measure
                && stream != StreamRef::PerThread
                && !self.hooks.active()
            {
                queue.push(crate::pipeline::QueuedLaunch {
                    call_id: *call_id,
                    device: cx.device,
                    function: raw,
                    grid,
                    block,
                    shared_mem,
                    stream,
                    params: crate::pipeline::Params::new(params),
                });
                cx.queued.set(true);
                return Ok(());
            }
            queue.drain();
        }
        let mut printed = Vec::new();
        let view = self.objects.memory.view();
        let r = self.backend().launch(
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
        if let (Some(planning), Some(planned)) = (planning, planned) {
            let twin = if checked.is_some() { "a checked twin" } else { "the kernel" };
            crate::timing::slow(planning, || {
                format!(
                    "a launch of {twin} while a C/R hook is on: {:.3} ms to plan and show the hook",
                    planned.as_secs_f64() * 1e3
                )
            });
        }
        drop(checked);
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

/// A reply buffer, refusing sizes the host cannot provide instead of aborting.
pub(super) fn reply_buffer(len: u64) -> Result<Vec<u8>, CudaError> {
    let len = usize::try_from(len).map_err(|_| CudaError::InvalidValue)?;
    let mut v = Vec::new();
    v.try_reserve_exact(len).map_err(|_| CudaError::MemoryAllocation)?;
    v.resize(len, 0);
    Ok(v)
}

impl CudartService for Session {
    type Cx = CallCx;

    fn check_device_range(&self, _cx: &CallCx, addr: u64, len: u64, null_ok: bool) -> Result<(), CudaError> {
        if addr == 0 && null_ok {
            return Ok(());
        }
        if self.objects.memory.contains(addr, len) { Ok(()) } else { Err(CudaError::InvalidValue) }
    }

    fn max_reply_bytes(&self) -> u64 {
        self.max_reply()
    }

    fn record(&self, cx: &CallCx, id: FunctionId, payload: &[u8], facts: &phos_protocol::spec::RecordFacts<'_>) {
        // A kernel keeps its last setting of each attribute (a maximum of dynamic shared
        // memory and a carveout are both needed again after a restore).
        let key = match id {
            FunctionId::PhosFuncSetAttribute => phos_protocol::decode_request::<PhosFuncSetAttributeRequest>(payload)
                .map_or(0, |r| u64::from(r.attr as u32)),
            _ => 0,
        };
        self.records.record_keyed(ApiFunction::Cudart(id), key, cx.device, payload, facts);
    }

    fn intercepting(&self) -> bool {
        self.hooks.active()
    }

    fn before_call(&self, _: &CallCx, _: FunctionId, access: &CallAccess<'_>) -> Result<(), CudaError> {
        self.hooks.before_call(access)
    }

    fn cuda_get_device_count(
        &self,
        _: &CallCx,
        _: CudaGetDeviceCountRequest,
    ) -> Result<CudaGetDeviceCountReply, CudaError> {
        match self.backend().device_count() {
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
        Ok(CudaGetDevicePropertiesReply { prop: self.backend().device_properties(req.device)? })
    }

    fn cuda_get_device_properties_v2(
        &self,
        _: &CallCx,
        req: CudaGetDevicePropertiesV2Request,
    ) -> Result<CudaGetDevicePropertiesV2Reply, CudaError> {
        self.check_device(req.device)?;
        Ok(CudaGetDevicePropertiesV2Reply { prop: self.backend().device_properties(req.device)? })
    }

    fn cuda_device_get_attribute(
        &self,
        _: &CallCx,
        req: CudaDeviceGetAttributeRequest,
    ) -> Result<CudaDeviceGetAttributeReply, CudaError> {
        self.check_device(req.device)?;
        Ok(CudaDeviceGetAttributeReply { value: self.backend().device_attribute(req.device, req.attr)? })
    }

    fn cuda_device_synchronize(
        &self,
        cx: &CallCx,
        _: CudaDeviceSynchronizeRequest,
    ) -> Result<CudaDeviceSynchronizeReply, CudaError> {
        if let Some(e) = self.objects.graphs.captures.active().and_then(|mut c| c.refuse_all()) {
            return Err(e);
        }
        self.backend().device_synchronize(cx.device)?;
        Ok(CudaDeviceSynchronizeReply {})
    }

    fn cuda_device_reset(&self, cx: &CallCx, _: CudaDeviceResetRequest) -> Result<CudaDeviceResetReply, CudaError> {
        if self.hooks.active() {
            // It frees every allocation and module variable: to the C/R hook, a write of all.
            let all: Vec<DeviceAccess> = (self.objects.memory.regions().into_iter())
                .map(|(addr, len)| DeviceAccess { addr, len, writes: true })
                .collect();
            self.before_work("cudaDeviceReset", &all)?;
        }
        let _ = self.backend().device_synchronize(cx.device);
        self.objects.release_all(self.backend());
        self.ipc.forget_all_memory();
        self.ipc.forget_opened();
        self.clear_error();
        Ok(CudaDeviceResetReply {})
    }

    fn cuda_driver_get_version(
        &self,
        _: &CallCx,
        _: CudaDriverGetVersionRequest,
    ) -> Result<CudaDriverGetVersionReply, CudaError> {
        Ok(CudaDriverGetVersionReply { driverVersion: self.backend().driver_version() })
    }

    fn cuda_malloc(&self, cx: &CallCx, req: CudaMallocRequest) -> Result<CudaMallocReply, CudaError> {
        let addr = match cx.forced() {
            Some(at) => self.objects.memory.alloc_at(self.backend(), cx.device, at, req.size),
            None => self.objects.memory.alloc(self.backend(), cx.device, req.size),
        }
        .map_err(|e| if self.objects.memory.at_limit() { self.refuse(cx, LimitKind::Allocations) } else { e })?;
        Ok(CudaMallocReply { devPtr: addr })
    }

    fn cuda_free(&self, cx: &CallCx, req: CudaFreeRequest) -> Result<CudaFreeReply, CudaError> {
        if req.devPtr == 0 {
            return Ok(CudaFreeReply {});
        }
        // A graph allocation's block stays reserved for its graph.
        if let Some(freed) = self.objects.graphs.free_block(req.devPtr) {
            self.backend().device_synchronize(cx.device)?;
            freed?;
            return self.release_graph_blocks(cx).map(|_| CudaFreeReply {});
        }
        // cudaFree waits for the device: work in flight may still use the memory.
        self.backend().device_synchronize(cx.device)?;
        let freed = self.objects.memory.free(self.backend(), req.devPtr)?;
        // Its IPC handle names nothing from now on (a session that opened it keeps it).
        self.ipc.forget_allocation(freed.addr);
        Ok(CudaFreeReply {})
    }

    fn cuda_ipc_get_mem_handle(
        &self,
        _: &CallCx,
        req: CudaIpcGetMemHandleRequest,
    ) -> Result<CudaIpcGetMemHandleReply, CudaError> {
        let reserved = self.ipc_get_mem_handle(req.devPtr)?;
        Ok(CudaIpcGetMemHandleReply { handle: IpcHandle { reserved } })
    }

    fn cuda_ipc_open_mem_handle(
        &self,
        cx: &CallCx,
        req: CudaIpcOpenMemHandleRequest,
    ) -> Result<CudaIpcOpenMemHandleReply, CudaError> {
        Ok(CudaIpcOpenMemHandleReply { devPtr: self.ipc_open_mem_handle(cx, &req.handle.reserved, req.flags)? })
    }

    fn cuda_ipc_close_mem_handle(
        &self,
        cx: &CallCx,
        req: CudaIpcCloseMemHandleRequest,
    ) -> Result<CudaIpcCloseMemHandleReply, CudaError> {
        self.ipc_close_mem_handle(cx, req.devPtr)?;
        Ok(CudaIpcCloseMemHandleReply {})
    }

    fn cuda_ipc_get_event_handle(
        &self,
        _: &CallCx,
        req: CudaIpcGetEventHandleRequest,
    ) -> Result<CudaIpcGetEventHandleReply, CudaError> {
        let reserved = self.ipc_get_event_handle(req.event)?;
        Ok(CudaIpcGetEventHandleReply { handle: IpcHandle { reserved } })
    }

    fn cuda_ipc_open_event_handle(
        &self,
        cx: &CallCx,
        req: CudaIpcOpenEventHandleRequest,
    ) -> Result<CudaIpcOpenEventHandleReply, CudaError> {
        Ok(CudaIpcOpenEventHandleReply { event: self.ipc_open_event_handle(cx, &req.handle.reserved)? })
    }

    fn cuda_memcpy(&self, cx: &CallCx, req: CudaMemcpyRequest<'_>) -> Result<CudaMemcpyReply, CudaError> {
        self.legacy_use(cx, None)?;
        Ok(CudaMemcpyReply { dst: self.copy(&req.dst, &req.src, req.count, None)? })
    }

    fn cuda_memcpy_async(
        &self,
        cx: &CallCx,
        req: CudaMemcpyAsyncRequest<'_>,
    ) -> Result<CudaMemcpyAsyncReply, CudaError> {
        self.legacy_use(cx, Some(req.stream))?;
        let stream = self.objects.streams.resolve(req.stream)?;
        if let Some(r) = self.capture_copy(req.stream, &req.dst, &req.src, req.count) {
            return r.map(|_| CudaMemcpyAsyncReply { dst: None });
        }
        Ok(CudaMemcpyAsyncReply { dst: self.copy(&req.dst, &req.src, req.count, Some(stream))? })
    }

    fn cuda_memset(&self, cx: &CallCx, req: CudaMemsetRequest) -> Result<CudaMemsetReply, CudaError> {
        self.legacy_use(cx, None)?;
        // CUDA sets each byte to the value's low byte.
        self.backend().memset(req.devPtr, req.value as u8, req.count, None)?;
        Ok(CudaMemsetReply {})
    }

    fn cuda_memset_async(&self, cx: &CallCx, req: CudaMemsetAsyncRequest) -> Result<CudaMemsetAsyncReply, CudaError> {
        self.legacy_use(cx, Some(req.stream))?;
        let stream = self.objects.streams.resolve(req.stream)?;
        let op = || GraphOp::Memset {
            dst: req.devPtr,
            pitch: req.count,
            value: req.value as u8,
            width: req.count,
            height: 1,
        };
        if let Some(r) = self.objects.graphs.captures.active().and_then(|mut c| c.record(req.stream, op)) {
            return r.map(|_| CudaMemsetAsyncReply {});
        }
        self.backend().memset(req.devPtr, req.value as u8, req.count, Some(stream))?;
        Ok(CudaMemsetAsyncReply {})
    }

    fn cuda_mem_get_info(&self, cx: &CallCx, _: CudaMemGetInfoRequest) -> Result<CudaMemGetInfoReply, CudaError> {
        let (free, total) = self.backend().mem_info(cx.device)?;
        Ok(CudaMemGetInfoReply { free, total })
    }

    fn cuda_memcpy_to_symbol(
        &self,
        cx: &CallCx,
        req: CudaMemcpyToSymbolRequest<'_>,
    ) -> Result<CudaMemcpyToSymbolReply, CudaError> {
        self.legacy_use(cx, None)?;
        let dst = Ptr::Device(req.symbol_base + req.offset);
        self.copy(&dst, &req.src, req.count, None)?;
        Ok(CudaMemcpyToSymbolReply {})
    }

    fn cuda_memcpy_from_symbol(
        &self,
        cx: &CallCx,
        req: CudaMemcpyFromSymbolRequest<'_>,
    ) -> Result<CudaMemcpyFromSymbolReply, CudaError> {
        self.legacy_use(cx, None)?;
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
        self.objects.streams.destroy(self.backend(), req.stream)?;
        if let Some(mut c) = self.objects.graphs.captures.active() {
            c.forget_stream(req.stream);
        }
        Ok(CudaStreamDestroyReply {})
    }

    fn cuda_stream_synchronize(
        &self,
        cx: &CallCx,
        req: CudaStreamSynchronizeRequest,
    ) -> Result<CudaStreamSynchronizeReply, CudaError> {
        self.legacy_use(cx, Some(req.stream))?;
        let s = self.objects.streams.resolve(req.stream)?;
        if let Some(e) = self.objects.graphs.captures.active().and_then(|mut c| c.refuse(req.stream)) {
            return Err(e);
        }
        self.backend().stream_synchronize(s)?;
        Ok(CudaStreamSynchronizeReply {})
    }

    fn cuda_stream_query(&self, cx: &CallCx, req: CudaStreamQueryRequest) -> Result<CudaStreamQueryReply, CudaError> {
        self.legacy_use(cx, Some(req.stream))?;
        let s = self.objects.streams.resolve(req.stream)?;
        if let Some(e) = self.objects.graphs.captures.active().and_then(|mut c| c.refuse(req.stream)) {
            return Err(e);
        }
        if self.backend().stream_query(s)? { Ok(CudaStreamQueryReply {}) } else { Err(CudaError::NotReady) }
    }

    fn cuda_event_create(&self, cx: &CallCx, _: CudaEventCreateRequest) -> Result<CudaEventCreateReply, CudaError> {
        let event = self.with_new_handle(cx, LimitKind::Events, |new| {
            self.objects.events.create(self.backend(), cx.device, 0, new)
        })?;
        Ok(CudaEventCreateReply { event })
    }

    fn cuda_event_create_with_flags(
        &self,
        cx: &CallCx,
        req: CudaEventCreateWithFlagsRequest,
    ) -> Result<CudaEventCreateWithFlagsReply, CudaError> {
        let event = self.with_new_handle(cx, LimitKind::Events, |new| {
            self.objects.events.create(self.backend(), cx.device, req.flags, new)
        })?;
        Ok(CudaEventCreateWithFlagsReply { event })
    }

    fn cuda_event_record(&self, cx: &CallCx, req: CudaEventRecordRequest) -> Result<CudaEventRecordReply, CudaError> {
        self.legacy_use(cx, Some(req.stream))?;
        let e = self.objects.events.resolve(req.event)?;
        let s = self.objects.streams.resolve(req.stream)?;
        if self.objects.graphs.captures.active().is_some_and(|mut c| c.record_event(req.event, req.stream)) {
            return Ok(CudaEventRecordReply {});
        }
        self.backend().event_record(e, s)?;
        Ok(CudaEventRecordReply {})
    }

    fn cuda_event_synchronize(
        &self,
        _: &CallCx,
        req: CudaEventSynchronizeRequest,
    ) -> Result<CudaEventSynchronizeReply, CudaError> {
        self.backend().event_synchronize(self.objects.events.resolve(req.event)?)?;
        Ok(CudaEventSynchronizeReply {})
    }

    fn cuda_event_query(&self, _: &CallCx, req: CudaEventQueryRequest) -> Result<CudaEventQueryReply, CudaError> {
        if self.backend().event_query(self.objects.events.resolve(req.event)?)? {
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
        let (a, b) = (self.objects.events.resolve(req.start)?, self.objects.events.resolve(req.end)?);
        Ok(CudaEventElapsedTimeReply { ms: self.backend().event_elapsed(a, b)? })
    }

    fn cuda_event_destroy(&self, _: &CallCx, req: CudaEventDestroyRequest) -> Result<CudaEventDestroyReply, CudaError> {
        self.objects.events.destroy(self.backend(), req.event)?;
        self.ipc.forget_event(req.event);
        Ok(CudaEventDestroyReply {})
    }

    fn phos_module_load(&self, cx: &CallCx, req: PhosModuleLoadRequest<'_>) -> Result<PhosModuleLoadReply, CudaError> {
        let o = &self.objects;
        let module = self.with_new_handle(cx, LimitKind::Modules, |new| {
            o.modules.load(self.backend(), &o.memory, cx.device, req.image, req.digest, new)
        })?;
        Ok(PhosModuleLoadReply { module })
    }

    fn phos_module_unload(&self, _: &CallCx, req: PhosModuleUnloadRequest) -> Result<PhosModuleUnloadReply, CudaError> {
        self.objects.modules.unload(self.backend(), &self.objects.memory, req.module)?;
        Ok(PhosModuleUnloadReply {})
    }

    fn phos_module_get_function(
        &self,
        cx: &CallCx,
        req: PhosModuleGetFunctionRequest<'_>,
    ) -> Result<PhosModuleGetFunctionReply, CudaError> {
        let function = self.with_new_handle(cx, LimitKind::Functions, |new| {
            self.objects.modules.function(self.backend(), req.module, req.name, new)
        })?;
        Ok(PhosModuleGetFunctionReply { function })
    }

    fn phos_module_get_global(
        &self,
        _: &CallCx,
        req: PhosModuleGetGlobalRequest<'_>,
    ) -> Result<PhosModuleGetGlobalReply, CudaError> {
        let (address, bytes) =
            self.objects.modules.variable(self.backend(), &self.objects.memory, req.module, req.name)?;
        Ok(PhosModuleGetGlobalReply { address, bytes })
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
        let stream = self.objects.streams.resolve(req.stream)?;
        let seq = req.seq as u32;
        // The guest may already be filling (host to device); nothing can have been drained.
        let ours = if h2d { Count::Drained } else { Count::Filled };
        if u64::from(seq) != req.seq || st.count(ours) != seq || (!h2d && st.count(Count::Drained) != seq) {
            crate::guest_warn!(self.id, "a staged copy that does not start where the region stands");
            return Err(CudaError::InvalidValue);
        }
        if let Err(e) = self.legacy_use(cx, Some(req.stream)) {
            st.abort();
            return Err(e);
        }
        if self.objects.graphs.captures.active().is_some_and(|c| c.of_stream(req.stream).is_some()) {
            return self.capture_staged(st, &req, h2d, seq);
        }
        let b = self.backend();
        if !st.registered.swap(true, Ordering::Relaxed) {
            // Registered with the driver, the slots are DMA'd directly.
            let (addr, len) = st.slots_range();
            b.pin_shared(addr, len);
        }
        let slot = st.slot_bytes() as u64;
        // The guest's thread waits for this call's answer, spinning (PHOS_SYNC_SPIN_US): so
        // does this one for the guest's counts, rather than sleep after PHOS_SPIN_US while the
        // guest copies a chunk and be woken (a futex wake-up) for each.
        let spin = phos_protocol::shm::default_sync_spin();
        // `cudaMemcpy`'s copies (the legacy stream): one synchronous driver copy a chunk, as
        // the runtime makes, where an async copy and a stream synchronisation are two calls
        // into the driver and two of its locks. A copy on another stream waits for that
        // stream's work before it, so it is queued there and the stream synchronised.
        let on_stream = (!matches!(stream, StreamRef::Legacy)).then_some(stream);
        let copy = |device: u64, host: u64, len: u64| match on_stream {
            Some(s) => b.memcpy_registered(device, host, len, h2d, Some(s)).and_then(|_| b.stream_synchronize(s)),
            None => b.memcpy_registered(device, host, len, h2d, None),
        };
        let gave_up = |e: phos_protocol::staging::StagingError| {
            crate::guest_warn!(self.id, "staged copy: {e}");
            st.abort();
            CudaError::Unknown
        };
        for k in 0..chunks(req.count, slot as usize) as u32 {
            let at = u64::from(k) * slot;
            let len = slot.min(req.count - at) as usize;
            let chunk = st.slot(k).subslice(0, len).map_err(|_| CudaError::Unknown)?;
            // The device copies to or from the slot's address: no Rust reference is made to
            // memory the guest can write (by the protocol it leaves slot k alone between the
            // counts that bracket chunk k; a guest that does not spoils only its own copy).
            let host = chunk.ptr_guard().as_ptr() as u64;
            let failed = if h2d {
                st.wait(Count::Filled, seq, seq.wrapping_add(k + 1), spin).map_err(gave_up)?;
                // The slot is reused two chunks on: this chunk must be on the device first.
                copy(req.device + at, host, len as u64).err()
            } else {
                if k >= 2 {
                    st.wait(Count::Drained, seq, seq.wrapping_add(k - 1), spin).map_err(gave_up)?;
                }
                // Done before the chunk is counted filled: the guest reads it then.
                copy(req.device + at, host, len as u64).err()
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
            self.objects.host.alloc(self.backend(), &self.objects.memory, req.size, req.flags, cx.forced()).map_err(
                |e| if self.objects.host.at_limit() { self.refuse(cx, LimitKind::HostAllocations) } else { e },
            )?;
        Ok(PhosHostAllocReply { host, device })
    }

    fn phos_host_free(&self, cx: &CallCx, req: PhosHostFreeRequest) -> Result<PhosHostFreeReply, CudaError> {
        // Work in flight may still read or write the memory.
        self.backend().device_synchronize(cx.device)?;
        self.objects.host.free(self.backend(), &self.objects.memory, req.host)?;
        Ok(PhosHostFreeReply {})
    }

    fn phos_memcpy_pinned(
        &self,
        cx: &CallCx,
        req: PhosMemcpyPinnedRequest,
    ) -> Result<PhosMemcpyPinnedReply, CudaError> {
        self.legacy_use(cx, (req.ordered != 0).then_some(req.stream))?;
        let to_device = match req.direction {
            consts::cudaMemcpyHostToDevice => true,
            consts::cudaMemcpyDeviceToHost => false,
            _ => return Err(CudaError::InvalidMemcpyDirection),
        };
        if !self.objects.host.covers(req.host, req.count) {
            crate::guest_warn!(self.id, "a pinned copy outside the session's pinned allocations");
            return Err(CudaError::InvalidValue);
        }
        if req.count == 0 {
            return Ok(PhosMemcpyPinnedReply {});
        }
        let stream = if req.ordered != 0 { Some(self.objects.streams.resolve(req.stream)?) } else { None };
        if req.ordered != 0
            && let Some(mut captures) = self.objects.graphs.captures.active()
            && captures.of_stream(req.stream).is_some()
        {
            // Captured copies of pinned memory read or write it when the graph runs, as in CUDA.
            let op = GraphOp::CopyPinned { device: req.device, host: req.host, count: req.count, to_device };
            return captures.record(req.stream, || op).unwrap_or(Ok(())).map(|_| PhosMemcpyPinnedReply {});
        }
        self.backend().memcpy_registered(req.device, req.host, req.count, to_device, stream)?;
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
        Ok(CudaDeviceGetLimitReply { pValue: self.backend().limit(cx.device, req.limit)? })
    }

    fn cuda_device_set_limit(
        &self,
        cx: &CallCx,
        req: CudaDeviceSetLimitRequest,
    ) -> Result<CudaDeviceSetLimitReply, CudaError> {
        self.backend().set_limit(cx.device, req.limit, req.value)?;
        Ok(CudaDeviceSetLimitReply {})
    }

    fn cuda_device_get_cache_config(
        &self,
        cx: &CallCx,
        _: CudaDeviceGetCacheConfigRequest,
    ) -> Result<CudaDeviceGetCacheConfigReply, CudaError> {
        Ok(CudaDeviceGetCacheConfigReply { pCacheConfig: self.backend().cache_config(cx.device)? })
    }

    fn cuda_device_set_cache_config(
        &self,
        cx: &CallCx,
        req: CudaDeviceSetCacheConfigRequest,
    ) -> Result<CudaDeviceSetCacheConfigReply, CudaError> {
        self.backend().set_cache_config(cx.device, req.cacheConfig)?;
        Ok(CudaDeviceSetCacheConfigReply {})
    }

    fn cuda_device_get_shared_mem_config(
        &self,
        cx: &CallCx,
        _: CudaDeviceGetSharedMemConfigRequest,
    ) -> Result<CudaDeviceGetSharedMemConfigReply, CudaError> {
        Ok(CudaDeviceGetSharedMemConfigReply { pConfig: self.backend().shared_mem_config(cx.device)? })
    }

    fn cuda_device_set_shared_mem_config(
        &self,
        cx: &CallCx,
        req: CudaDeviceSetSharedMemConfigRequest,
    ) -> Result<CudaDeviceSetSharedMemConfigReply, CudaError> {
        self.backend().set_shared_mem_config(cx.device, req.config)?;
        Ok(CudaDeviceSetSharedMemConfigReply {})
    }

    fn cuda_device_get_stream_priority_range(
        &self,
        cx: &CallCx,
        _: CudaDeviceGetStreamPriorityRangeRequest,
    ) -> Result<CudaDeviceGetStreamPriorityRangeReply, CudaError> {
        let (least, greatest) = self.backend().stream_priority_range(cx.device)?;
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
        let can = req.device != req.peerDevice && self.backend().can_access_peer(req.device, req.peerDevice)?;
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
        self.backend().enable_peer_access(cx.device, req.peerDevice)?;
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
        self.backend().disable_peer_access(cx.device, req.peerDevice)?;
        Ok(CudaDeviceDisablePeerAccessReply {})
    }

    fn cuda_ctx_reset_persisting_l2_cache(
        &self,
        cx: &CallCx,
        _: CudaCtxResetPersistingL2CacheRequest,
    ) -> Result<CudaCtxResetPersistingL2CacheReply, CudaError> {
        self.backend().reset_persisting_l2_cache(cx.device)?;
        Ok(CudaCtxResetPersistingL2CacheReply {})
    }

    fn phos_memcpy_3d(&self, cx: &CallCx, req: PhosMemcpy3DRequest<'_>) -> Result<PhosMemcpy3DReply, CudaError> {
        self.legacy_use(cx, (req.ordered != 0).then_some(req.stream))?;
        if req.ordered != 0 && self.objects.graphs.captures.active().is_some_and(|c| c.of_stream(req.stream).is_some())
        {
            return self.capture_copy_3d(&req).map(|_| PhosMemcpy3DReply { dst: None });
        }
        Ok(PhosMemcpy3DReply { dst: self.copy_3d(&req)? })
    }

    fn phos_memset_3d(&self, cx: &CallCx, req: PhosMemset3DRequest) -> Result<PhosMemset3DReply, CudaError> {
        self.legacy_use(cx, (req.ordered != 0).then_some(req.stream))?;
        let stream = if req.ordered != 0 { Some(self.objects.streams.resolve(req.stream)?) } else { None };
        if req.ordered != 0
            && let Some(mut captures) = self.objects.graphs.captures.active()
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
            self.backend().memset_2d(dst, req.pitch, req.value as u8, req.width, req.height, stream)?;
        }
        Ok(PhosMemset3DReply {})
    }

    fn phos_pointer_device(
        &self,
        cx: &CallCx,
        req: PhosPointerDeviceRequest,
    ) -> Result<PhosPointerDeviceReply, CudaError> {
        // Module variables are the calling device's.
        let device = match self.objects.memory.device_of(req.ptr) {
            Some(d) => d,
            None if self.objects.memory.contains(req.ptr, 1) => cx.device,
            None => return Err(CudaError::InvalidValue),
        };
        Ok(PhosPointerDeviceReply { device })
    }

    fn cuda_memcpy_to_symbol_async(
        &self,
        cx: &CallCx,
        req: CudaMemcpyToSymbolAsyncRequest<'_>,
    ) -> Result<CudaMemcpyToSymbolAsyncReply, CudaError> {
        self.legacy_use(cx, Some(req.stream))?;
        let stream = self.objects.streams.resolve(req.stream)?;
        let dst = Ptr::Device(req.symbol_base + req.offset);
        if let Some(r) = self.capture_copy(req.stream, &dst, &req.src, req.count) {
            return r.map(|_| CudaMemcpyToSymbolAsyncReply {});
        }
        self.copy(&dst, &req.src, req.count, Some(stream))?;
        Ok(CudaMemcpyToSymbolAsyncReply {})
    }

    fn cuda_memcpy_from_symbol_async(
        &self,
        cx: &CallCx,
        req: CudaMemcpyFromSymbolAsyncRequest<'_>,
    ) -> Result<CudaMemcpyFromSymbolAsyncReply, CudaError> {
        self.legacy_use(cx, Some(req.stream))?;
        let stream = self.objects.streams.resolve(req.stream)?;
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
        Ok(CudaStreamGetPriorityReply { priority: self.objects.streams.facts(req.hStream, cx.device)?.1 })
    }

    fn cuda_stream_get_flags(
        &self,
        cx: &CallCx,
        req: CudaStreamGetFlagsRequest,
    ) -> Result<CudaStreamGetFlagsReply, CudaError> {
        Ok(CudaStreamGetFlagsReply { flags: self.objects.streams.facts(req.hStream, cx.device)?.0 })
    }

    fn cuda_stream_get_device(
        &self,
        cx: &CallCx,
        req: CudaStreamGetDeviceRequest,
    ) -> Result<CudaStreamGetDeviceReply, CudaError> {
        Ok(CudaStreamGetDeviceReply { device: self.objects.streams.facts(req.hStream, cx.device)?.2 })
    }

    fn cuda_stream_get_id(&self, cx: &CallCx, req: CudaStreamGetIdRequest) -> Result<CudaStreamGetIdReply, CudaError> {
        // The handle is unique in the session for as long as the stream lives; the special
        // streams keep their own values.
        self.objects.streams.facts(req.hStream, cx.device)?;
        Ok(CudaStreamGetIdReply { streamId: req.hStream })
    }

    fn cuda_stream_wait_event(
        &self,
        cx: &CallCx,
        req: CudaStreamWaitEventRequest,
    ) -> Result<CudaStreamWaitEventReply, CudaError> {
        self.legacy_use(cx, Some(req.stream))?;
        let s = self.objects.streams.resolve(req.stream)?;
        let e = self.objects.events.resolve(req.event)?;
        if let Some(r) = self.objects.graphs.captures.active().and_then(|mut c| c.wait_event(req.stream, req.event)) {
            return r.map(|_| CudaStreamWaitEventReply {});
        }
        self.backend().stream_wait_event(s, e)?;
        Ok(CudaStreamWaitEventReply {})
    }

    fn cuda_event_record_with_flags(
        &self,
        cx: &CallCx,
        req: CudaEventRecordWithFlagsRequest,
    ) -> Result<CudaEventRecordWithFlagsReply, CudaError> {
        self.legacy_use(cx, Some(req.stream))?;
        let e = self.objects.events.resolve(req.event)?;
        let s = self.objects.streams.resolve(req.stream)?;
        if self.objects.graphs.captures.active().is_some_and(|mut c| c.record_event(req.event, req.stream)) {
            return Ok(CudaEventRecordWithFlagsReply {});
        }
        self.backend().event_record(e, s)?;
        Ok(CudaEventRecordWithFlagsReply {})
    }

    fn phos_host_func_enqueue(
        &self,
        _: &CallCx,
        req: PhosHostFuncEnqueueRequest,
    ) -> Result<PhosHostFuncEnqueueReply, CudaError> {
        let stream = self.objects.streams.resolve(req.stream)?;
        self.objects.streams.add_gate(self.backend(), stream, req.gate)?;
        Ok(PhosHostFuncEnqueueReply {})
    }

    fn phos_host_func_wait(
        &self,
        _: &CallCx,
        req: PhosHostFuncWaitRequest,
    ) -> Result<PhosHostFuncWaitReply, CudaError> {
        let (gate, stream) = self.objects.streams.gate(req.gate)?;
        // Work that faults never reaches the gate: the stream's error ends the wait.
        while !gate.wait_reached(std::time::Duration::from_millis(50)) {
            if let Some(e) = self.sticky_error() {
                return Err(e);
            }
            if let Err(e) = self.backend().stream_query(stream) {
                self.note_error(e);
                return Err(e);
            }
        }
        if gate.is_abandoned() {
            // A graph launch that failed or was captured: its host functions do not run.
            return Err(CudaError::InvalidValue);
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
        self.objects.streams.take_gate(req.gate)?.open();
        Ok(PhosHostFuncDoneReply {})
    }

    /// The router marks the session bypassed; the server's log says so too.
    fn phos_report_bypass(&self, _: &CallCx, req: PhosReportBypassRequest) -> Result<PhosReportBypassReply, CudaError> {
        crate::guest_warn!(
            self.id,
            "the guest reports a bypass: {}",
            phos_protocol::bypass::describe(req.kind, req.detail)
        );
        Ok(PhosReportBypassReply {})
    }

    fn cuda_stream_begin_capture(
        &self,
        cx: &CallCx,
        req: CudaStreamBeginCaptureRequest,
    ) -> Result<CudaStreamBeginCaptureReply, CudaError> {
        // The legacy stream cannot be captured.
        if req.stream <= 1 {
            return Err(CudaError::StreamCaptureUnsupported);
        }
        self.objects.streams.resolve(req.stream)?;
        // The capture's graph exists from here on (`cudaStreamGetCaptureInfo` answers it).
        self.with_new_handle(cx, LimitKind::Graphs, |new| self.objects.graphs.begin_capture(req.stream, new))?;
        Ok(CudaStreamBeginCaptureReply {})
    }

    fn phos_stream_begin_capture_to_graph(
        &self,
        _: &CallCx,
        req: PhosStreamBeginCaptureToGraphRequest<'_>,
    ) -> Result<PhosStreamBeginCaptureToGraphReply, CudaError> {
        // The legacy stream cannot be captured.
        if req.stream <= 1 {
            return Err(CudaError::StreamCaptureUnsupported);
        }
        self.objects.streams.resolve(req.stream)?;
        self.objects.graphs.begin_capture_to_graph(req.stream, req.graph, req.deps)?;
        Ok(PhosStreamBeginCaptureToGraphReply {})
    }

    fn cuda_stream_end_capture(
        &self,
        cx: &CallCx,
        req: CudaStreamEndCaptureRequest,
    ) -> Result<CudaStreamEndCaptureReply, CudaError> {
        self.objects.streams.resolve(req.stream)?;
        let graph = self.objects.graphs.end_capture(req.stream).map_err(|e| match e {
            // A captured call could not add its node: the session's limit of nodes.
            CudaError::MemoryAllocation => self.refuse(cx, LimitKind::GraphNodes),
            e => e,
        })?;
        Ok(CudaStreamEndCaptureReply { pGraph: graph })
    }

    fn cuda_stream_is_capturing(
        &self,
        cx: &CallCx,
        req: CudaStreamIsCapturingRequest,
    ) -> Result<CudaStreamIsCapturingReply, CudaError> {
        self.objects.streams.resolve(req.stream)?;
        self.legacy_query(cx, req.stream)?;
        Ok(CudaStreamIsCapturingReply { pCaptureStatus: self.objects.graphs.captures.lock().status(req.stream).0 })
    }

    fn phos_stream_capture_info(
        &self,
        cx: &CallCx,
        req: PhosStreamCaptureInfoRequest,
    ) -> Result<PhosStreamCaptureInfoReply, CudaError> {
        self.objects.streams.resolve(req.stream)?;
        self.legacy_query(cx, req.stream)?;
        let (status, id) = self.objects.graphs.captures.lock().status(req.stream);
        Ok(PhosStreamCaptureInfoReply { status, id })
    }

    fn phos_stream_capture_graph(
        &self,
        cx: &CallCx,
        req: PhosStreamCaptureGraphRequest,
    ) -> Result<PhosStreamCaptureGraphReply, CudaError> {
        self.objects.streams.resolve(req.stream)?;
        self.legacy_query(cx, req.stream)?;
        let captures = self.objects.graphs.captures.lock();
        let (status, id) = captures.status(req.stream);
        let (graph, deps) = captures.graph_of(req.stream).unwrap_or_default();
        let max = req.max as usize;
        let mut out: Vec<u8> = deps.iter().take(max).flat_map(|h| h.to_ne_bytes()).collect();
        out.resize(max * 8, 0);
        Ok(PhosStreamCaptureGraphReply { status, id, graph, deps: out, count: deps.len() as u64 })
    }

    fn phos_stream_update_capture_dependencies(
        &self,
        _: &CallCx,
        req: PhosStreamUpdateCaptureDependenciesRequest<'_>,
    ) -> Result<PhosStreamUpdateCaptureDependenciesReply, CudaError> {
        self.objects.streams.resolve(req.stream)?;
        let deps: Vec<u64> =
            req.deps.chunks_exact(8).map(|h| u64::from_ne_bytes(h.try_into().expect("8 bytes"))).collect();
        self.objects.graphs.captures.lock().update_dependencies(req.stream, &deps, req.flags)?;
        Ok(PhosStreamUpdateCaptureDependenciesReply {})
    }

    fn phos_graph_instantiate(
        &self,
        cx: &CallCx,
        req: PhosGraphInstantiateRequest,
    ) -> Result<PhosGraphInstantiateReply, CudaError> {
        let exec =
            self.with_new_handle(cx, LimitKind::GraphExecs, |new| self.objects.graphs.instantiate(req.graph, new))?;
        Ok(PhosGraphInstantiateReply { pGraphExec: exec })
    }

    fn cuda_graph_launch(&self, cx: &CallCx, req: CudaGraphLaunchRequest) -> Result<CudaGraphLaunchReply, CudaError> {
        self.legacy_use(cx, Some(req.stream))?;
        let ops = self.objects.graphs.exec_ops(req.graphExec)?;
        // Launching into a capture records the graph's work there (not memory nodes: their
        // blocks are the executable graph's).
        if let Some(mut captures) = self.objects.graphs.captures.active()
            && captures.of_stream(req.stream).is_some()
        {
            if ops.iter().any(|op| matches!(op, GraphOp::MemAlloc { .. } | GraphOp::MemFree { .. })) {
                return Err(captures.refuse(req.stream).unwrap_or(CudaError::StreamCaptureUnsupported));
            }
            for op in ops {
                captures.record(req.stream, || op).unwrap_or(Ok(()))?;
            }
            return Ok(CudaGraphLaunchReply {});
        }
        self.objects.streams.resolve(req.stream)?;
        self.objects.graphs.launch_memory(req.graphExec, &ops)?;
        self.replay(cx, &ops, req.stream, None)?;
        Ok(CudaGraphLaunchReply {})
    }

    fn cuda_graph_upload(&self, _: &CallCx, req: CudaGraphUploadRequest) -> Result<CudaGraphUploadReply, CudaError> {
        self.objects.graphs.check_exec(req.graphExec)?;
        self.objects.streams.resolve(req.stream)?;
        Ok(CudaGraphUploadReply {})
    }

    fn phos_graph_exec_update(
        &self,
        _: &CallCx,
        req: PhosGraphExecUpdateRequest,
    ) -> Result<PhosGraphExecUpdateReply, CudaError> {
        // The guest reports a result other than success with cudaErrorGraphExecUpdateFailure.
        Ok(PhosGraphExecUpdateReply { result: self.objects.graphs.update_exec(req.hGraphExec, req.hGraph)? })
    }

    fn cuda_graph_create(&self, cx: &CallCx, _: CudaGraphCreateRequest) -> Result<CudaGraphCreateReply, CudaError> {
        let graph = self.with_new_handle(cx, LimitKind::Graphs, |new| self.objects.graphs.create(new))?;
        Ok(CudaGraphCreateReply { pGraph: graph })
    }

    fn phos_graph_add_kernel_node(
        &self,
        cx: &CallCx,
        req: PhosGraphAddKernelNodeRequest<'_>,
    ) -> Result<PhosGraphAddKernelNodeReply, CudaError> {
        let deps = self.objects.graphs.node_indices(req.graph, req.deps)?;
        self.objects.modules.resolve_function(req.function)?;
        self.objects.devices.check_launch(self.backend(), cx.device, req.grid, req.block, req.sharedMem)?;
        let op = GraphOp::Kernel {
            function: req.function,
            grid: req.grid,
            block: req.block,
            shared_mem: req.sharedMem,
            params: req.params.to_vec(),
            cooperative: false,
        };
        let node = self.add_node(cx, req.graph, NODE_KERNEL, vec![op], deps)?;
        Ok(PhosGraphAddKernelNodeReply { pGraphNode: node })
    }

    fn phos_graph_add_copy_node(
        &self,
        cx: &CallCx,
        req: PhosGraphAddCopyNodeRequest<'_>,
    ) -> Result<PhosGraphAddCopyNodeReply, CudaError> {
        let deps = self.objects.graphs.node_indices(req.graph, req.deps)?;
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
        let node = self.add_node(cx, req.graph, NODE_MEMCPY, ops, deps)?;
        Ok(PhosGraphAddCopyNodeReply { pGraphNode: node })
    }

    fn phos_graph_add_set_node(
        &self,
        cx: &CallCx,
        req: PhosGraphAddSetNodeRequest,
    ) -> Result<PhosGraphAddSetNodeReply, CudaError> {
        let deps = self.objects.graphs.node_indices(req.graph, req.deps)?;
        let op = GraphOp::Memset {
            dst: req.dst,
            pitch: req.pitch,
            value: req.value as u8,
            width: req.width,
            height: req.height,
        };
        let node = self.add_node(cx, req.graph, NODE_MEMSET, vec![op], deps)?;
        Ok(PhosGraphAddSetNodeReply { pGraphNode: node })
    }

    fn phos_graph_add_empty_node(
        &self,
        cx: &CallCx,
        req: PhosGraphAddEmptyNodeRequest<'_>,
    ) -> Result<PhosGraphAddEmptyNodeReply, CudaError> {
        let deps = self.objects.graphs.node_indices(req.graph, req.deps)?;
        let node = self.add_node(cx, req.graph, NODE_EMPTY, Vec::new(), deps)?;
        Ok(PhosGraphAddEmptyNodeReply { pGraphNode: node })
    }

    fn phos_graph_add_host_node(
        &self,
        cx: &CallCx,
        req: PhosGraphAddHostNodeRequest<'_>,
    ) -> Result<PhosGraphAddHostNodeReply, CudaError> {
        let deps = self.objects.graphs.node_indices(req.graph, req.deps)?;
        let op = GraphOp::Host { func: req.hostFn, data: req.userData };
        let node = self.add_node(cx, req.graph, NODE_HOST, vec![op], deps)?;
        Ok(PhosGraphAddHostNodeReply { pGraphNode: node })
    }

    fn phos_graph_add_event_node(
        &self,
        cx: &CallCx,
        req: PhosGraphAddEventNodeRequest<'_>,
    ) -> Result<PhosGraphAddEventNodeReply, CudaError> {
        self.objects.events.resolve(req.event)?;
        let deps = self.objects.graphs.node_indices(req.graph, req.deps)?;
        let (kind, op) = if req.wait == 1 {
            (NODE_WAIT_EVENT, GraphOp::EventWait { event: req.event })
        } else {
            (NODE_EVENT_RECORD, GraphOp::EventRecord { event: req.event })
        };
        let node = self.add_node(cx, req.graph, kind, vec![op], deps)?;
        Ok(PhosGraphAddEventNodeReply { pGraphNode: node })
    }

    fn phos_graph_add_child_node(
        &self,
        cx: &CallCx,
        req: PhosGraphAddChildNodeRequest<'_>,
    ) -> Result<PhosGraphAddChildNodeReply, CudaError> {
        // The node owns a copy of the child as it is now: later changes to the child do not
        // reach the node (cudaGraphChildGraphNodeGetGraph answers the copy).
        let deps = self.objects.graphs.node_indices(req.graph, req.deps)?;
        let node = self.objects.graphs.add_child_node(
            req.graph,
            req.child,
            deps,
            &|| self.refuse(cx, LimitKind::Graphs),
            &|| self.refuse(cx, LimitKind::GraphNodes),
        )?;
        Ok(PhosGraphAddChildNodeReply { pGraphNode: node })
    }

    fn phos_graph_query(&self, _: &CallCx, req: PhosGraphQueryRequest) -> Result<PhosGraphQueryReply, CudaError> {
        let words = self.objects.graphs.query(req.what, req.handle)?;
        let count = words.len() as u64;
        let max = req.max as usize;
        let mut out: Vec<u8> = words.iter().take(max).flat_map(|w| w.to_ne_bytes()).collect();
        out.resize(max * 8, 0);
        Ok(PhosGraphQueryReply { words: out, count })
    }

    fn phos_graph_edit(&self, cx: &CallCx, req: PhosGraphEditRequest) -> Result<PhosGraphEditReply, CudaError> {
        let g = &self.objects.graphs;
        let (a, b, c) = (req.a, req.b, req.c);
        let value = match req.what {
            0 => {
                g.destroy_node(a)?;
                self.release_graph_blocks(cx).map(|_| 0)?
            }
            1 => g.set_node(a, b).map(|_| 0)?,
            2 => g.set_exec_node(a, b, c).map(|_| 0)?,
            3 => {
                if c > 1 {
                    return Err(CudaError::InvalidValue);
                }
                g.node_enabled(a, b, Some(c == 1)).map(|_| 0)?
            }
            4 => u64::from(g.node_enabled(a, b, None)?),
            5 => self.with_new_handle(cx, LimitKind::Graphs, |new| g.clone_graph(a, new))?,
            6 => g.find_in_clone(a, b)?,
            _ => {
                let from = g.node_indices(a, &b.to_ne_bytes())?;
                let to = g.node_indices(a, &c.to_ne_bytes())?;
                g.remove_dependency(a, from[0], to[0]).map(|_| 0)?
            }
        };
        Ok(PhosGraphEditReply { value })
    }

    fn phos_graph_kernel_node_cooperative(
        &self,
        _: &CallCx,
        req: PhosGraphKernelNodeCooperativeRequest,
    ) -> Result<PhosGraphKernelNodeCooperativeReply, CudaError> {
        let set = (req.set >= 0).then_some(req.set == 1);
        let cooperative = self.objects.graphs.kernel_cooperative(req.node, set)?;
        Ok(PhosGraphKernelNodeCooperativeReply { cooperative: i32::from(cooperative) })
    }

    fn phos_graph_host_nodes(
        &self,
        _: &CallCx,
        req: PhosGraphHostNodesRequest,
    ) -> Result<PhosGraphHostNodesReply, CudaError> {
        let calls = self.objects.graphs.host_calls(req.graphExec)?;
        let count = calls.len() as u64;
        if req.max == 0 {
            return Ok(PhosGraphHostNodesReply { calls: Vec::new(), count });
        }
        if req.max != count {
            return Err(CudaError::InvalidValue);
        }
        let stream = self.objects.streams.resolve(req.stream)?;
        self.objects.streams.announce_gates(stream, req.firstGate, count)?;
        let calls = calls.iter().flat_map(|&(f, d)| [f, d]).flat_map(u64::to_ne_bytes).collect();
        Ok(PhosGraphHostNodesReply { calls, count })
    }

    fn phos_graph_launch_host(
        &self,
        cx: &CallCx,
        req: PhosGraphLaunchHostRequest,
    ) -> Result<PhosGraphLaunchHostReply, CudaError> {
        let count = self.objects.graphs.host_calls(req.graphExec).map(|c| c.len() as u64).unwrap_or(0);
        let launched = self.objects.graphs.exec_ops(req.graphExec).and_then(|ops| {
            // Launching into a capture records the graph's work there; its host functions run
            // when the captured graph runs, not now.
            if let Some(mut captures) = self.objects.graphs.captures.active()
                && captures.of_stream(req.stream).is_some()
            {
                if ops.iter().any(|op| matches!(op, GraphOp::MemAlloc { .. } | GraphOp::MemFree { .. })) {
                    return Err(captures.refuse(req.stream).unwrap_or(CudaError::StreamCaptureUnsupported));
                }
                for op in ops {
                    captures.record(req.stream, || op).unwrap_or(Ok(()))?;
                }
                return Ok(());
            }
            self.legacy_use(cx, Some(req.stream))?;
            self.objects.streams.resolve(req.stream)?;
            self.objects.graphs.launch_memory(req.graphExec, &ops)?;
            self.replay(cx, &ops, req.stream, Some(req.firstGate))
        });
        // Gates the launch did not reach will not be reached: their functions are not run.
        self.objects.streams.abandon_gates(req.firstGate, count);
        launched.map(|_| PhosGraphLaunchHostReply {})
    }

    fn phos_graph_add_dependencies(
        &self,
        _: &CallCx,
        req: PhosGraphAddDependenciesRequest<'_>,
    ) -> Result<PhosGraphAddDependenciesReply, CudaError> {
        let from = self.objects.graphs.node_indices(req.graph, req.from)?;
        let to = self.objects.graphs.node_indices(req.graph, req.to)?;
        self.objects.graphs.add_dependencies(req.graph, from, to)?;
        Ok(PhosGraphAddDependenciesReply {})
    }

    fn phos_graph_nodes(&self, _: &CallCx, req: PhosGraphNodesRequest) -> Result<PhosGraphNodesReply, CudaError> {
        let (nodes, count) = self.objects.graphs.nodes(req.graph, req.max as usize)?;
        Ok(PhosGraphNodesReply { nodes, count })
    }

    fn cuda_graph_node_get_type(
        &self,
        _: &CallCx,
        req: CudaGraphNodeGetTypeRequest,
    ) -> Result<CudaGraphNodeGetTypeReply, CudaError> {
        Ok(CudaGraphNodeGetTypeReply { pType: self.objects.graphs.node_kind(req.node)? })
    }

    fn cuda_graph_exec_destroy(
        &self,
        cx: &CallCx,
        req: CudaGraphExecDestroyRequest,
    ) -> Result<CudaGraphExecDestroyReply, CudaError> {
        self.objects.graphs.destroy_exec(req.graphExec)?;
        self.release_graph_blocks(cx)?;
        Ok(CudaGraphExecDestroyReply {})
    }

    fn cuda_graph_destroy(
        &self,
        cx: &CallCx,
        req: CudaGraphDestroyRequest,
    ) -> Result<CudaGraphDestroyReply, CudaError> {
        self.objects.graphs.destroy(req.graph)?;
        self.release_graph_blocks(cx)?;
        Ok(CudaGraphDestroyReply {})
    }

    fn phos_graph_conditional_handle_create(
        &self,
        cx: &CallCx,
        req: PhosGraphConditionalHandleCreateRequest,
    ) -> Result<PhosGraphConditionalHandleCreateReply, CudaError> {
        // The handle is its cell's address: 4 bytes of the session's memory, holding the
        // default until a kernel or a launch sets it.
        let cell =
            self.objects.memory.alloc(self.backend(), cx.device, 4).map_err(|e| {
                if self.objects.memory.at_limit() { self.refuse(cx, LimitKind::Allocations) } else { e }
            })?;
        let made = self.backend().memcpy_htod(cell, &req.defaultLaunchValue.to_ne_bytes(), None).and_then(|_| {
            self.objects.graphs.add_conditional_handle(req.graph, cell, req.defaultLaunchValue, req.flags)
        });
        if let Err(e) = made {
            self.objects.memory.free(self.backend(), cell)?;
            return Err(e);
        }
        Ok(PhosGraphConditionalHandleCreateReply { handle: cell })
    }

    fn phos_graph_add_conditional_node(
        &self,
        cx: &CallCx,
        req: PhosGraphAddConditionalNodeRequest<'_>,
    ) -> Result<PhosGraphAddConditionalNodeReply, CudaError> {
        let deps = self.objects.graphs.node_indices(req.graph, req.deps)?;
        let (node, bodies) = self.objects.graphs.add_conditional_node(
            req.graph,
            deps,
            req.handle,
            req.kind,
            req.size,
            &|| self.refuse(cx, LimitKind::Graphs),
            &|| self.refuse(cx, LimitKind::GraphNodes),
        )?;
        Ok(PhosGraphAddConditionalNodeReply { node, bodies: bodies.iter().flat_map(|b| b.to_ne_bytes()).collect() })
    }

    fn phos_graph_add_mem_alloc_node(
        &self,
        cx: &CallCx,
        req: PhosGraphAddMemAllocNodeRequest<'_>,
    ) -> Result<PhosGraphAddMemAllocNodeReply, CudaError> {
        let deps = self.objects.graphs.node_indices(req.graph, req.deps)?;
        let dptr = self.reserve_graph_block(cx, req.device, req.bytesize)?;
        let added = self.objects.graphs.add_alloc_node(req.graph, deps, (dptr, req.bytesize, req.device), &|| {
            self.refuse(cx, LimitKind::GraphNodes)
        });
        match added {
            Ok(node) => Ok(PhosGraphAddMemAllocNodeReply { pGraphNode: node, dptr }),
            Err(e) => {
                self.objects.memory.free(self.backend(), dptr)?;
                Err(e)
            }
        }
    }

    fn phos_graph_add_mem_free_node(
        &self,
        cx: &CallCx,
        req: PhosGraphAddMemFreeNodeRequest<'_>,
    ) -> Result<PhosGraphAddMemFreeNodeReply, CudaError> {
        let deps = self.objects.graphs.node_indices(req.graph, req.deps)?;
        let async_block = self.is_async_block(req.dptr, req.asyncBlock);
        let node = self
            .objects
            .graphs
            .add_free_node(req.graph, deps, req.dptr, async_block, &|| self.refuse(cx, LimitKind::GraphNodes))?;
        Ok(PhosGraphAddMemFreeNodeReply { pGraphNode: node })
    }

    fn phos_graph_mem(&self, cx: &CallCx, req: PhosGraphMemRequest) -> Result<PhosGraphMemReply, CudaError> {
        let g = &self.objects.graphs;
        if req.what != 3 {
            self.check_device(req.a)?;
        }
        let value = match req.what {
            0 => g.mem_attribute(req.a, i32::try_from(req.b).map_err(|_| CudaError::InvalidValue)?)?,
            1 => g.reset_mem_high(req.a, i32::try_from(req.b).map_err(|_| CudaError::InvalidValue)?).map(|_| 0)?,
            // Blocks are given back as soon as nothing names them: trimming has nothing left.
            2 => self.release_graph_blocks(cx).map(|_| 0)?,
            _ => {
                if req.a != 0 && req.a != 1 {
                    return Err(CudaError::InvalidValue);
                }
                u64::from(g.exec_memory(req.b, req.a == 1)?)
            }
        };
        Ok(PhosGraphMemReply { value })
    }

    fn phos_stream_mem_node(
        &self,
        cx: &CallCx,
        req: PhosStreamMemNodeRequest,
    ) -> Result<PhosStreamMemNodeReply, CudaError> {
        let on = self.objects.streams.resolve(req.stream)?;
        let capturing = self.objects.graphs.captures.active().is_some_and(|c| c.of_stream(req.stream).is_some());
        if !capturing {
            if req.free == 1 {
                // What cudaFreeAsync waits for before the block is freed.
                self.backend().stream_synchronize(on)?;
            }
            return Ok(PhosStreamMemNodeReply { allocated: 0, captured: 0 });
        }
        let op = if req.free == 0 {
            let dptr = self.reserve_graph_block(cx, req.device, req.size)?;
            self.objects.graphs.add_captured_block(dptr, req.size, req.device);
            GraphOp::MemAlloc { dptr, size: req.size, device: req.device }
        } else {
            if !self.objects.graphs.is_graph_block(req.dptr) && !self.is_async_block(req.dptr, req.asyncBlock) {
                return Err(CudaError::InvalidValue);
            }
            GraphOp::MemFree { dptr: req.dptr }
        };
        let allocated = if let GraphOp::MemAlloc { dptr, .. } = op { dptr } else { 0 };
        self.objects.graphs.captures.lock().record(req.stream, || op).unwrap_or(Ok(()))?;
        Ok(PhosStreamMemNodeReply { allocated, captured: 1 })
    }

    fn phos_func_get_attributes(
        &self,
        _: &CallCx,
        req: PhosFuncGetAttributesRequest,
    ) -> Result<PhosFuncGetAttributesReply, CudaError> {
        Ok(PhosFuncGetAttributesReply {
            attr: self.backend().function_attributes(self.objects.modules.resolve_function(req.function)?)?,
        })
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
        self.backend().function_set_attribute(
            self.objects.modules.resolve_function(req.function)?,
            req.attr,
            req.value,
        )?;
        Ok(PhosFuncSetAttributeReply {})
    }

    fn phos_func_set_cache_config(
        &self,
        _: &CallCx,
        req: PhosFuncSetCacheConfigRequest,
    ) -> Result<PhosFuncSetCacheConfigReply, CudaError> {
        self.backend().function_set_cache_config(self.objects.modules.resolve_function(req.function)?, req.config)?;
        Ok(PhosFuncSetCacheConfigReply {})
    }

    fn phos_occupancy_max_active_blocks(
        &self,
        _: &CallCx,
        req: PhosOccupancyMaxActiveBlocksRequest,
    ) -> Result<PhosOccupancyMaxActiveBlocksReply, CudaError> {
        let f = self.objects.modules.resolve_function(req.function)?;
        if req.blockSize <= 0 {
            return Err(CudaError::InvalidValue);
        }
        let n = self.backend().occupancy(f, req.blockSize, req.dynamicSMemSize, req.flags)?;
        Ok(PhosOccupancyMaxActiveBlocksReply { numBlocks: n })
    }

    fn phos_occupancy_available_dynamic_s_mem(
        &self,
        _: &CallCx,
        req: PhosOccupancyAvailableDynamicSMemRequest,
    ) -> Result<PhosOccupancyAvailableDynamicSMemReply, CudaError> {
        let f = self.objects.modules.resolve_function(req.function)?;
        let n = self.backend().available_dynamic_smem(f, req.numBlocks, req.blockSize)?;
        Ok(PhosOccupancyAvailableDynamicSMemReply { dynamicSmemSize: n })
    }

    fn phos_array_create(&self, cx: &CallCx, req: PhosArrayCreateRequest) -> Result<PhosArrayCreateReply, CudaError> {
        let extent = [req.width, req.height, req.depth];
        Ok(PhosArrayCreateReply { array: self.create_array(cx, req.desc, extent, req.flags, None, req.bytes)? })
    }

    fn phos_mipmapped_array_create(
        &self,
        cx: &CallCx,
        req: PhosMipmappedArrayCreateRequest,
    ) -> Result<PhosMipmappedArrayCreateReply, CudaError> {
        let extent = [req.width, req.height, req.depth];
        let levels = Some(req.levels);
        Ok(PhosMipmappedArrayCreateReply {
            mipmap: self.create_array(cx, req.desc, extent, req.flags, levels, req.bytes)?,
        })
    }

    fn cuda_free_array(&self, cx: &CallCx, req: CudaFreeArrayRequest) -> Result<CudaFreeArrayReply, CudaError> {
        if req.array == 0 {
            return Ok(CudaFreeArrayReply {});
        }
        // As cudaFree: work in flight may still read the array.
        self.backend().device_synchronize(cx.device)?;
        self.objects.arrays.destroy(self.backend(), req.array)?;
        Ok(CudaFreeArrayReply {})
    }

    fn cuda_free_mipmapped_array(
        &self,
        cx: &CallCx,
        req: CudaFreeMipmappedArrayRequest,
    ) -> Result<CudaFreeMipmappedArrayReply, CudaError> {
        if req.mipmappedArray == 0 {
            return Ok(CudaFreeMipmappedArrayReply {});
        }
        self.backend().device_synchronize(cx.device)?;
        self.objects.arrays.destroy_mipmapped(self.backend(), req.mipmappedArray)?;
        Ok(CudaFreeMipmappedArrayReply {})
    }

    fn cuda_get_mipmapped_array_level(
        &self,
        _: &CallCx,
        req: CudaGetMipmappedArrayLevelRequest,
    ) -> Result<CudaGetMipmappedArrayLevelReply, CudaError> {
        let level = self.objects.arrays.level(self.backend(), req.mipmappedArray, req.level)?;
        Ok(CudaGetMipmappedArrayLevelReply { levelArray: level })
    }

    fn phos_array_get_info(
        &self,
        _: &CallCx,
        req: PhosArrayGetInfoRequest,
    ) -> Result<PhosArrayGetInfoReply, CudaError> {
        let shape = self.objects.arrays.array(req.array)?.shape;
        let [width, height, depth] = shape.extent.map(|n| n as usize);
        Ok(PhosArrayGetInfoReply {
            desc: shape.desc,
            extent: phos_protocol::types::Extent { width, height, depth },
            flags: shape.flags,
        })
    }

    fn phos_memcpy_to_array(
        &self,
        _: &CallCx,
        req: PhosMemcpyToArrayRequest<'_>,
    ) -> Result<PhosMemcpyToArrayReply, CudaError> {
        let (corner, extent) = ([req.x, req.y, req.z], [req.width, req.height, req.depth]);
        let ordered = req.ordered != 0;
        self.copy_to_array(req.dst, corner, &req.src, req.spitch, req.sslice, extent, req.stream, ordered)?;
        Ok(PhosMemcpyToArrayReply {})
    }

    fn phos_memcpy_from_array(
        &self,
        _: &CallCx,
        req: PhosMemcpyFromArrayRequest<'_>,
    ) -> Result<PhosMemcpyFromArrayReply, CudaError> {
        let (corner, extent) = ([req.x, req.y, req.z], [req.width, req.height, req.depth]);
        let ordered = req.ordered != 0;
        let dst =
            self.copy_from_array(&req.dst, req.dpitch, req.dslice, req.src, corner, extent, req.stream, ordered)?;
        Ok(PhosMemcpyFromArrayReply { dst })
    }

    fn phos_memcpy_array_to_array(
        &self,
        _: &CallCx,
        req: PhosMemcpyArrayToArrayRequest,
    ) -> Result<PhosMemcpyArrayToArrayReply, CudaError> {
        let (d, s) = ([req.dx, req.dy, req.dz], [req.sx, req.sy, req.sz]);
        let extent = [req.width, req.height, req.depth];
        self.copy_array_to_array(req.dst, d, req.src, s, extent, req.stream, req.ordered != 0)?;
        Ok(PhosMemcpyArrayToArrayReply {})
    }

    fn phos_texture_create(
        &self,
        cx: &CallCx,
        req: PhosTextureCreateRequest,
    ) -> Result<PhosTextureCreateReply, CudaError> {
        let record = crate::registry::arrays::TextureRecord {
            res_type: req.resType,
            array: req.array,
            mipmap: req.mipmap,
            dev_ptr: req.devPtr,
            desc: req.desc,
            width: req.width,
            height: req.height,
            pitch: req.pitch,
            size: req.sizeInBytes,
            tex_desc: req.texDesc,
            view: (req.hasView != 0).then_some(req.view),
        };
        Ok(PhosTextureCreateReply { texObject: self.create_texture(cx, record)? })
    }

    fn phos_texture_get_desc(
        &self,
        _: &CallCx,
        req: PhosTextureGetDescRequest,
    ) -> Result<PhosTextureGetDescReply, CudaError> {
        let r = (self.objects.arrays.texture(req.texObject))
            .map_err(|e| self.unless_object(e, "a texture object query", req.texObject))?;
        Ok(PhosTextureGetDescReply {
            resType: r.res_type,
            array: r.array,
            mipmap: r.mipmap,
            devPtr: r.dev_ptr,
            desc: r.desc,
            width: r.width,
            height: r.height,
            pitch: r.pitch,
            sizeInBytes: r.size,
            texDesc: r.tex_desc,
            hasView: r.view.is_some() as i32,
            view: r.view.unwrap_or_default(),
        })
    }

    fn cuda_destroy_texture_object(
        &self,
        cx: &CallCx,
        req: CudaDestroyTextureObjectRequest,
    ) -> Result<CudaDestroyTextureObjectReply, CudaError> {
        // Kernels in flight may still sample it.
        self.backend().device_synchronize(cx.device)?;
        (self.objects.arrays.destroy_texture(self.backend(), req.texObject))
            .map_err(|e| self.unless_object(e, "cudaDestroyTextureObject", req.texObject))?;
        Ok(CudaDestroyTextureObjectReply {})
    }

    fn phos_surface_create(
        &self,
        cx: &CallCx,
        req: PhosSurfaceCreateRequest,
    ) -> Result<PhosSurfaceCreateReply, CudaError> {
        let full = || self.refuse(cx, LimitKind::Allocations);
        Ok(PhosSurfaceCreateReply { surfObject: self.objects.arrays.add_surface(self.backend(), req.array, &full)? })
    }

    fn phos_surface_get_array(
        &self,
        _: &CallCx,
        req: PhosSurfaceGetArrayRequest,
    ) -> Result<PhosSurfaceGetArrayReply, CudaError> {
        let array = (self.objects.arrays.surface(req.surfObject))
            .map_err(|e| self.unless_object(e, "cudaGetSurfaceObjectResourceDesc", req.surfObject))?;
        Ok(PhosSurfaceGetArrayReply { array })
    }

    fn cuda_destroy_surface_object(
        &self,
        cx: &CallCx,
        req: CudaDestroySurfaceObjectRequest,
    ) -> Result<CudaDestroySurfaceObjectReply, CudaError> {
        self.backend().device_synchronize(cx.device)?;
        (self.objects.arrays.destroy_surface(self.backend(), req.surfObject))
            .map_err(|e| self.unless_object(e, "cudaDestroySurfaceObject", req.surfObject))?;
        Ok(CudaDestroySurfaceObjectReply {})
    }
}
