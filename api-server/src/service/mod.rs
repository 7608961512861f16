//! A session: one guest process's state on the server, and the services that give each API's
//! functions their semantics on it. The state is in the [`Registries`] (one per kind of
//! object, each with its own lock); [`cudart`] implements the runtime API's spec-generated
//! service over them. A library's service (cuBLAS, ...) is another implementation over the
//! same registries, so its calls take the runtime's streams and memory.

mod arrays;
pub(crate) use arrays::texture_desc;
pub mod cublas;
pub mod cublaslt;
pub mod cuda;
pub mod cudart;
pub mod cudnn;
mod cudnn_graph;
mod cudnn_layers;
mod cudnn_legacy;
mod cudnn_ops;
pub mod cufft;
pub mod curand;
pub mod cusolver;
pub mod cusparse;
mod device_io;
mod ipc;
mod library_capture;
pub mod nvml;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::time::Duration;

use phos_checkpoint::CrError;
use phos_checkpoint::engine::{HookSlot, Within};
use phos_checkpoint::report::Waiting;
use phos_protocol::CudaError;
use phos_protocol::apis::Function as ApiFunction;
use phos_protocol::handshake::UsageReport;
use phos_protocol::limits::{LimitKind, SessionLimits};
use phos_protocol::spec::{CallAccess, DeviceAccess};

use crate::backend::prelude::*;
use crate::output::DeviceOutput;
use crate::quiesce::{Activity, NotQuiesced, QuiesceLock, Quiesced};
use crate::records::Recorder;
use crate::registry::Registries;
use crate::registry::handles::NewHandle;
use crate::registry::host::AttachError;
use crate::usage::Usage;

/// Per-call context: which device the calling thread has current, and, while a restore
/// replays a recorded call, the handles or addresses the call must produce again.
#[derive(Clone, Default)]
pub struct CallCx {
    pub device: i32,
    pub replay: Option<Vec<u64>>,
    /// The staging region of the channel the call came on (shared-memory channels).
    pub staging: Option<Arc<phos_protocol::staging::Staging>>,
    /// The router asked for this call's device time (a policy needs it).
    pub measure: bool,
    /// The function running, for what the server logs about the call.
    pub function: Option<ApiFunction>,
    /// A library call's part in a stream capture or a graph launch.
    pub(crate) graph: library_capture::GraphCx,
    /// An async launch's channel queue and call id: the launch, once checked, may be handed
    /// to the channel's submitter ([`crate::pipeline`]) rather than launched here.
    pub(crate) launches: Option<(Arc<crate::pipeline::LaunchQueue>, u64)>,
    /// Set when the launch was queued: its submitter notes it in the async ledger.
    pub(crate) queued: std::cell::Cell<bool>,
}

impl CallCx {
    pub fn new(device: i32) -> Self {
        CallCx { device, function: None, ..CallCx::default() }
    }

    /// The value the call's (first) created object must get, when replaying.
    pub(crate) fn forced(&self) -> Option<u64> {
        self.replay.as_ref().and_then(|v| v.first().copied())
    }
}

pub struct Session {
    pub id: u64,
    backend: Arc<dyn Backend>,
    /// The session's objects.
    pub objects: Registries,
    /// Once a kernel has corrupted the context, every call reports this error.
    sticky: AtomicI32,
    max_reply: u64,
    /// Device printf output waiting for a call that delivers it.
    pub output: DeviceOutput,
    /// The calls that created the session's live objects (for checkpoints).
    pub records: Recorder,
    /// Every call holds it while it runs; a checkpoint quiesces the session with it, so it
    /// sees the session between calls.
    pub(crate) quiesce: QuiesceLock,
    /// What each channel runs now: what a quiesce that cannot complete waits for.
    pub(crate) activity: Activity,
    /// The C/R engine's hook into every call: inactive (one relaxed load per call) unless a
    /// protocol runs.
    pub(crate) hooks: HookSlot,
    /// A concurrent checkpoint's window, while one is armed: launches run checked twins.
    pub(crate) window: Arc<crate::window::WindowSlot>,
    usage: Usage,
    /// Set by a stopping checkpoint: calls wait until the server is ended.
    frozen: AtomicBool,
    /// The freeze to come, or the one in force, is a parked one (a checkpoint whose process
    /// is dumped and left running): a call that finds the session frozen closes its channel
    /// instead of waiting, and never runs there (the guest sends it again).
    cutting: AtomicBool,
    /// The guest's async calls that have run (for barriers, and kept in images so that a
    /// restored session does not run a resent one twice).
    pub(crate) async_calls: crate::ordering::AsyncLedger,
    /// The last synchronous call each channel answered, with its reply (kept in images), so
    /// that one the guest sends again after a cut connection does not run twice.
    pub(crate) sync_replies: crate::kept::SyncReplies,
    /// IPC with the tenant's other sessions: what this one exports and has opened.
    pub ipc: crate::ipc::Ipc,
    /// `PHOS_PROFILE=1` in the server's environment: the time each function's calls took
    /// here, printed when the session ends.
    pub(crate) profile: Option<phos_protocol::call_profile::CallProfile>,
    /// Failures of async library calls, waiting for the next synchronous call on the handle.
    pub(crate) deferred: crate::deferred::Deferred,
}

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
        Ok(Session {
            id,
            objects: Registries::new(backend.as_ref(), base, size, &limits)?,
            backend,
            sticky: AtomicI32::new(0),
            max_reply,
            output,
            records: Recorder::default(),
            quiesce: QuiesceLock::default(),
            activity: Activity::default(),
            hooks: HookSlot::default(),
            window: Arc::default(),
            usage: Usage::new(limits),
            frozen: AtomicBool::new(false),
            cutting: AtomicBool::new(false),
            async_calls: Default::default(),
            sync_replies: Default::default(),
            ipc: Default::default(),
            profile: phos_protocol::call_profile::enabled().then(Default::default),
            deferred: Default::default(),
        })
    }

    /// The session's usage of the spec's continuous and measured resources, if it changed
    /// since the last time this returned it (the server sends it to the router then); see
    /// [`Usage::report_if_changed`].
    pub fn usage_if_changed(&self, kernel_gap: Duration) -> Option<UsageReport> {
        // Asked after every call: the figures are compared first, and a report is only built
        // when one of them moved.
        let (ns, kernels) = self.backend.device_time();
        let device_memory = self.objects.memory.allocated() + self.objects.arrays.bytes();
        let figures = [device_memory, self.objects.host.allocated(), ns, kernels, self.usage.refusals()];
        self.usage.report_if_changed(figures, kernel_gap)
    }

    /// Whether [`usage_if_changed`](Self::usage_if_changed) held a change back.
    pub fn usage_unreported(&self) -> bool {
        self.usage.unreported()
    }

    /// A call would take the session past its `kind` limit: count it, say so in the log
    /// (throttled: a guest can do this in a loop), and answer what CUDA answers when it
    /// cannot create a resource.
    pub(crate) fn refuse(&self, cx: &CallCx, kind: LimitKind) -> CudaError {
        let n = self.usage.count_refusal(kind);
        crate::guest_warn!(
            self.id,
            "{}: refused: the session holds its limit of {} {kind} (refusals so far: {n}); raise `{kind}` in the router's [limits] to allow more",
            cx.function.map_or("a restore", |f| f.name()),
            self.usage.limit(kind)
        );
        CudaError::MemoryAllocation
    }

    /// Run `f` with how a call's new object of `kind` gets its handle.
    pub(crate) fn with_new_handle<T>(&self, cx: &CallCx, kind: LimitKind, f: impl FnOnce(&NewHandle<'_>) -> T) -> T {
        f(&NewHandle { forced: cx.forced(), full: &|| self.refuse(cx, kind) })
    }

    pub fn backend(&self) -> &dyn Backend {
        self.backend.as_ref()
    }

    pub fn backend_arc(&self) -> Arc<dyn Backend> {
        self.backend.clone()
    }

    /// Map the pinned arena a channel brought (see [`PinnedArena::attach`]).
    ///
    /// [`PinnedArena::attach`]: crate::registry::host::PinnedArena::attach
    pub fn attach_host_arena(&self, fd: std::os::fd::OwnedFd) -> Result<(), AttachError> {
        self.objects.host.attach(fd, self.backend.as_ref(), &self.objects.memory)
    }

    /// Stop serving calls for good (after a stopping checkpoint): every call from now on
    /// waits until the server ends, so that the guest sends it again to the restored session.
    pub fn freeze(&self) {
        self.frozen.store(true, Ordering::SeqCst);
    }

    pub fn is_frozen(&self) -> bool {
        self.frozen.load(Ordering::SeqCst)
    }

    /// Make the next [`freeze`](Self::freeze) (until the [`thaw`](Self::thaw)) one that cuts
    /// the channels of the calls it meets, rather than holding them.
    pub fn cut_when_frozen(&self) {
        self.cutting.store(true, Ordering::SeqCst);
    }

    /// Frozen, and cutting the channels of the calls that come (see the `cutting` field).
    pub fn is_cutting(&self) -> bool {
        self.cutting.load(Ordering::SeqCst)
    }

    /// Serve calls again after a [`freeze`](Self::freeze) whose server is not ended after all
    /// (a migration that failed after the session was handed over, a parked checkpoint whose
    /// process was dumped): the calls held resume.
    pub fn thaw(&self) {
        self.frozen.store(false, Ordering::SeqCst);
        self.cutting.store(false, Ordering::SeqCst);
    }

    /// Wait while the session is frozen: for ever if its server ends, until a
    /// [`thaw`](Self::thaw) otherwise.
    pub fn wait_thawed(&self) {
        while self.is_frozen() {
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
    }

    /// Print the `PHOS_PROFILE` table of the calls served so far on standard error (the
    /// server's log) and start a new one.
    pub fn print_profile(&self) {
        if let Some(p) = self.profile.as_ref().filter(|p| !p.is_empty()) {
            eprint!("{}", p.take().table(&format!("phos server profile of session {}", self.id), "in the server"));
        }
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

    /// Forget the sticky error (a device reset).
    fn clear_error(&self) {
        self.sticky.store(0, Ordering::Relaxed);
    }

    /// The largest reply a call may ask for.
    pub fn max_reply(&self) -> u64 {
        self.max_reply
    }

    /// Hold new calls and wait for the calls in flight to finish, until `within`'s deadline
    /// or until it is cancelled; the error names the calls still running. Calls run again
    /// when the guard is dropped.
    pub(crate) fn hold_calls(&self, within: &Within<'_>) -> Result<Quiesced<'_>, CrError> {
        let start = std::time::Instant::now();
        self.quiesce.quiesce(within.deadline, || (within.cancelled)()).map_err(|why| {
            let waiting_for = Waiting::Calls { functions: self.activity.calls() };
            match why {
                NotQuiesced::TimedOut => CrError::TimedOut { session: self.id, waited: start.elapsed(), waiting_for },
                NotQuiesced::Cancelled => {
                    CrError::Abandoned { session: self.id, what: format!("waiting for {waiting_for}") }
                }
            }
        })
    }

    /// Show the C/R hook work whose accesses only the service knows (a kernel launch's, a
    /// graph's operations), as the dispatch shows it each call's.
    pub(crate) fn before_work(&self, function: &'static str, device: &[DeviceAccess]) -> Result<(), CudaError> {
        if !self.hooks.active() {
            return Ok(());
        }
        self.hooks.before_call(&CallAccess { function, device, objects: &[] })
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.print_profile();
        let b = self.backend.as_ref();
        self.objects.release_all(b);
        // Pinned memory is the guest's and outlives a device reset; not the session.
        self.objects.host.release(b);
        b.unreserve(self.objects.memory.base(), self.objects.memory.size());
    }
}
