//! Library compute calls and stream capture, one mechanism for every library the server
//! serves (cuBLAS, cuBLASLt, cuSPARSE, cuFFT, cuRAND, cuSOLVER, cuDNN).
//!
//! In CUDA a library call on a capturing stream launches its kernels into the capture, so the
//! graph runs them. The server records a capture itself, and a library's kernels are not its
//! to record; so it records the call: a compute call on a capturing stream is checked exactly
//! as when it runs (handles, every device range, sizes), then, where it would start its work,
//! [`Session::library_work`] takes it into the capture instead; the generated dispatch asks
//! the service (`deferred`) and the service keeps the request as the guest sent it
//! ([`Session::keep_deferred`]) as a [`GraphOp::Library`]. A graph launch runs the request
//! again through its API's dispatch ([`Session::run_library_op`]): checked again, on the
//! library's own code path (NVIDIA's library on a GPU, the CPU implementation on emu), ordered
//! after the launch's earlier work and before its later work. Host scalars travel in the
//! request, so they are taken by value at capture (as cuBLAS does in host pointer mode);
//! device pointers are read when the graph runs.
//!
//! What CUDA cannot capture either is refused: a call with a result on the host (it waits for
//! the stream), and calls a library documents as synchronising; the capture is invalidated
//! and the log names the call.

use std::cell::Cell;

use phos_protocol::CudaError;
use phos_protocol::apis::Function;

use super::{CallCx, Session};
use crate::capture::GraphOp;

/// A call's part in a graph.
#[derive(Clone, Default)]
pub struct GraphCx {
    /// While a graph launch runs a captured library call: the launch's stream.
    pub(crate) launch: Option<u64>,
    /// When capturing, the stream whose capture takes the call; when launched, the stream the
    /// call ran its work on (the launch's stream waits for it afterwards).
    pub(crate) stream: Cell<Option<u64>>,
    /// The request asks for results on the host (the generated dispatch says so).
    pub(crate) host_results: Cell<bool>,
    /// Where the call's library object is to start from: set when captured (the graph keeps
    /// it), and given back at each launch (see [`GraphOp::Library`]).
    pub(crate) position: Cell<Option<u64>>,
}

/// Why a library call does not run now.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum NotNow {
    /// Taken into its stream's capture: the graph runs it.
    Captured,
    /// Refused, the capture invalidated, the reason logged with the call's name.
    Refused,
}

impl Session {
    /// Where a library compute call would start its work on `stream` (the virtual stream its
    /// handle or plan or argument names): `Ok` to run it now, or why not. `uncapturable` says
    /// why the call cannot be captured (it synchronises), `None` when it can (a call with
    /// results on the host never can); `status` is the library's status a refusal answers, for
    /// the log.
    pub(crate) fn library_work(
        &self,
        cx: &CallCx,
        stream: u64,
        uncapturable: Option<&str>,
        status: &str,
    ) -> Result<(), NotNow> {
        let name = cx.function.map_or("a library call", |f| f.name());
        if let Some(launch) = cx.graph.launch {
            // Run by a graph launch: after the launch's earlier work.
            if self.objects.graphs.captures.active().is_some_and(|c| c.of_stream(stream).is_some()) {
                crate::guest_warn!(
                    self.id,
                    "{name}, captured in a graph, launched while its stream {stream:#x} is being captured: {status}"
                );
                return Err(NotNow::Refused);
            }
            if stream != launch {
                self.order_after(cx.device, stream, launch).map_err(|e| {
                    crate::guest_warn!(self.id, "{name} in a graph launch: ordering after the launch's stream: {e}");
                    NotNow::Refused
                })?;
            }
            cx.graph.stream.set(Some(stream));
            return Ok(());
        }
        let Some(mut captures) = self.objects.graphs.captures.active() else { return Ok(()) };
        if captures.of_stream(stream).is_none() {
            return Ok(());
        }
        let host = cx.graph.host_results.get().then_some(
            "its result goes to the host, so the call waits for the stream, which CUDA cannot capture either",
        );
        if let Some(why) = uncapturable.or(host) {
            captures.refuse(stream);
            crate::guest_warn!(
                self.id,
                "{name} on a stream being captured: {why} (the capture is invalidated), {status}"
            );
            return Err(NotNow::Refused);
        }
        if captures.status(stream).0 == crate::capture::STATUS_INVALIDATED {
            crate::guest_warn!(self.id, "{name} on a stream whose capture is invalidated: {status}");
            return Err(NotNow::Refused);
        }
        cx.graph.stream.set(Some(stream));
        Err(NotNow::Captured)
    }

    /// The generated dispatch's `deferred`: when [`library_work`](Self::library_work) took the
    /// call into a capture, keep the request there. `false` otherwise (and when the capture
    /// ended meanwhile: the call then answers the refusal it returned).
    pub(crate) fn keep_deferred(&self, cx: &CallCx, function: Function, payload: &[u8]) -> bool {
        if cx.graph.launch.is_some() {
            return false;
        }
        let Some(stream) = cx.graph.stream.take() else { return false };
        let op = || GraphOp::Library {
            api: function.api().id(),
            function: function.id(),
            device: cx.device,
            payload: payload.to_vec(),
            position: cx.graph.position.get(),
        };
        matches!(self.objects.graphs.captures.lock().record(stream, op), Some(Ok(())))
    }

    /// Run a captured library call as part of a graph launch on `stream`: through its API's
    /// dispatch, checked again, its work ordered between the launch's earlier and later work.
    /// A failure (a handle destroyed since the capture, memory freed) stops the launch with
    /// `cudaErrorInvalidValue`, the call and its status in the log.
    pub(crate) fn run_library_op(
        &self,
        cx: &CallCx,
        (api, id): (u16, u32),
        device: i32,
        payload: &[u8],
        position: Option<u64>,
        stream: u64,
    ) -> Result<(), CudaError> {
        // An image of another build may name a function this one lacks.
        let function = Function::from_wire(api, id).ok_or_else(|| {
            crate::guest_warn!(self.id, "cudaGraphLaunch: a captured call of unknown function {api}/{id}");
            CudaError::InvalidValue
        })?;
        let call = CallCx {
            device,
            measure: cx.measure,
            function: Some(function),
            graph: GraphCx { launch: Some(stream), position: Cell::new(position), ..GraphCx::default() },
            ..CallCx::default()
        };
        self.backend.bind(device)?;
        let mut reply = Vec::new();
        let ran = crate::server::replay(self, &call, function, payload, &mut reply);
        // Bound again: the library may have bound its handle's device.
        self.backend.bind(cx.device)?;
        let joined = match call.graph.stream.get() {
            Some(on) if on != stream => self.order_after(cx.device, stream, on),
            _ => Ok(()),
        };
        if let Err(why) = ran {
            crate::guest_warn!(
                self.id,
                "cudaGraphLaunch: the captured {} failed: {why}: cudaErrorInvalidValue",
                function.name()
            );
            return Err(CudaError::InvalidValue);
        }
        joined
    }

    /// Order `waiter`'s later work after `waited`'s work so far (an event between them).
    fn order_after(&self, device: i32, waiter: u64, waited: u64) -> Result<(), CudaError> {
        const DISABLE_TIMING: u32 = 2;
        let b = self.backend();
        let (waiter, waited) = (self.objects.streams.resolve(waiter)?, self.objects.streams.resolve(waited)?);
        let event = b.event_create(device, DISABLE_TIMING)?;
        let r = b.event_record(event, waited).and_then(|()| b.stream_wait_event(waiter, event));
        // The wait is queued: the event may go now.
        let destroyed = b.event_destroy(event);
        r.and(destroyed)
    }
}

/// The two dispatch hooks of a library's service (`note_host_results`, `deferred`), the same
/// for every library: `capture_hooks!(Cublas)` in `impl CublasService for Session`.
macro_rules! capture_hooks {
    ($api:ident) => {
        fn note_host_results(&self, cx: &CallCx) {
            cx.graph.host_results.set(true);
        }

        fn deferred(&self, cx: &CallCx, id: FunctionId, payload: &[u8]) -> bool {
            self.keep_deferred(cx, phos_protocol::apis::Function::$api(id), payload)
        }
    };
}
pub(crate) use capture_hooks;
