//! Checkpoint and restore of a session: the C/R engine's traits
//! ([`phos_checkpoint::engine`]) over the session's registries, records and quiesce lock, and
//! what this server checks of an image before it restores one.
//!
//! **Checkpoint** (stop-the-world, [`engine::checkpoint`]). The session is quiesced: calls in
//! flight finish, new ones wait. The devices are synchronised; the image then gets the
//! recorded creation calls of every live object (in creation order, which respects their
//! dependencies), the handle counters, and the contents of every allocation and module
//! variable, copied out in large chunks (all-zero chunks are not stored), and the CUDA
//! arrays with their contents, texture and surface objects and conditional graph handles
//! (read with the session at rest, which every protocol's manifest is). Afterwards calls
//! run again, or, for `stop`, stay held: the session is frozen until its server is ended,
//! and the guest's waiting calls are sent again to the restored session.
//!
//! A checkpoint waits for the session to come to rest for a bounded time only
//! ([`Bounds::quiesce_timeout`]): a kernel that never ends, or a call that waits for one,
//! makes it give up, naming what it waited for, and the session carries on as it was. Its
//! client going away ([`Bounds::cancel`]) stops it too, at the next step.
//!
//! **Restore** ([`engine::restore`]). The whole image is checked first (manifest, layout,
//! what it means: see [`check_image`]), so a bad image is refused before anything is created.
//! The session is then rebuilt in a fresh server: the same device address range is reserved,
//! each record is replayed through the generated dispatch with the handles and addresses it
//! produced before (so every allocation comes back at its address and every virtual handle
//! keeps its value), and the memory contents are written back: all of them before the
//! session is served, or behind it, each call waiting for the memory it touches
//! ([`Session::restore_on_demand`], [`crate::on_demand`]).
//!
//! Images go to and come from any sink or source: a directory, or a stream over a file,
//! pipe or socket ([`Session::checkpoint_to`], [`Session::restore_from`]).
//!
//! **Following a running session** ([`Intercept`], for the concurrent protocols): a hook
//! installed in the session is shown every call before it runs (see
//! [`phos_checkpoint::engine::HookSlot`]), and the memory registry keeps the dirty log.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::Instant;

use phos_checkpoint::engine::PendingMemory;
use phos_checkpoint::engine::{
    self, CallHook, Concurrent, DeviceCopier, DirtyLog, HostBuffer, Installed, Intercept, Interrupted, Pinning,
    Quiesce, Rebuild, RecopySink, Snapshot, Window, Within,
};
use phos_checkpoint::on_demand::{self, LoadPlan};
use phos_checkpoint::report::Waiting;
use phos_checkpoint::report::{CheckpointMode, CheckpointSummary, RestoreSummary, RoundFigures};
use phos_checkpoint::{
    Compression, ConditionalHandle, CrError, Image, ImageApi, ImageError, ImageSink, ImageSource, ImageWriter,
    Manifest, MemoryRegion, Record, RegionKind, SessionMeta,
};
use phos_control::Cancel;
use phos_protocol::apis::{Function, HandleKind};
use phos_protocol::cudart::FunctionId;
use phos_protocol::handshake::{ApiVersion, check_apis};
use phos_protocol::limits::LimitKind;

pub use phos_checkpoint::report::Progress;

use crate::backend::prelude::*;
use crate::backend::{Raw, StreamRef};
use crate::control::SessionFactory;
use crate::on_demand::{LoadStatus, OnDemandHook};
use crate::quiesce::Quiesced;
use crate::registry::handles::{NUMBER_BITS, is_handle_of};
use crate::service::{CallCx, Session};

/// How long a checkpoint may wait for the session to come to rest, and whether its client
/// still wants it.
#[derive(Clone, Debug)]
pub struct Bounds {
    pub quiesce_timeout: std::time::Duration,
    pub cancel: Cancel,
}

/// Which checkpoint: how the memory is taken, whether the session stops afterwards, and the
/// copy-on-write reserve (bytes a device; `None`: sized from each device's free memory,
/// [`crate::window::sized_reserve`]).
#[derive(Clone, Copy, Debug)]
pub struct How {
    pub mode: CheckpointMode,
    pub stop: bool,
    /// The session's process is dumped and left running (a parked checkpoint without
    /// `stop`): the session is frozen at the cut, cutting the channels of the calls that
    /// come, and stays so (its copy going on) until it is thawed.
    pub park: bool,
    pub reserve: Option<u64>,
}

impl Default for Bounds {
    fn default() -> Self {
        Bounds { quiesce_timeout: phos_control::DEFAULT_QUIESCE_TIMEOUT, cancel: Cancel::default() }
    }
}

/// The most bytes of CUDA array contents an image holds: they travel in its manifest (at
/// most 4 GiB, with the records and graphs), read and written while the session is held.
pub const MAX_ARRAY_BYTES: u64 = 1 << 30;

/// `CU_STREAM_NON_BLOCKING`: the copy streams do not wait on the legacy default stream.
const NON_BLOCKING: u32 = 1;

/// Page-locking through the backend, for the engine's buffers: the backend's kept buffers
/// first ([`crate::backend::copy_pool`]), then fresh ones.
struct BackendPinning(Arc<dyn Backend>);

impl Pinning for BackendPinning {
    fn pin(&self, buf: &mut [u8]) {
        let len = buf.len();
        crate::timing::timed(|| format!("page-locking a copy buffer of {len} bytes"), || self.0.pin_host(buf));
    }

    fn unpin(&self, buf: &mut [u8]) {
        let len = buf.len();
        crate::timing::timed(|| format!("unlocking a copy buffer of {len} bytes"), || self.0.unpin_host(buf));
    }

    fn reuse(&self, len: usize) -> Option<Vec<u8>> {
        self.0.copy_pool()?.take_buffer(len)
    }

    fn keep(&self, buf: Vec<u8>) -> Result<(), Vec<u8>> {
        match self.0.copy_pool() {
            Some(pool) => pool.give_buffer(buf),
            None => Err(buf),
        }
    }
}

/// The engine's device copies, on streams of their own (never the session's, so that they
/// never queue behind its work, nor hold it up): a lane of the backend's lent for each piece
/// ([`crate::backend::copy_pool`]), or, on a backend that keeps none, a stream per device
/// made on first use. Every copy is waited for before the call returns.
struct BackendCopier {
    backend: Arc<dyn Backend>,
    own: Vec<Option<Raw>>,
    pinning: Arc<dyn Pinning>,
    /// Lanes of a device this copier's users may have lent at once.
    lanes: usize,
    /// The copy [`write_behind`](DeviceCopier::write_behind) queued and nothing has waited
    /// for yet.
    behind: Option<Behind>,
}

/// A copy to the device queued behind its copier's thread: the buffer it reads (held until
/// the copy is complete) and where it runs.
struct Behind {
    buf: HostBuffer,
    device: i32,
    addr: u64,
    /// The event of the pool's lane it was queued on (`None`: the copier's own stream of
    /// `device`). The lane itself is given back as soon as the copy is queued: a lane held
    /// until its copy is waited for would sit idle while its thread reads the next chunk, and
    /// sixteen threads share eight. Its next user queues behind this copy and records the
    /// event again after its own, so waiting for the event still waits for this copy (and at
    /// most one more).
    event: Option<Raw>,
    stream: StreamRef,
}

impl BackendCopier {
    fn new(backend: Arc<dyn Backend>) -> Self {
        let n = backend.device_count().max(0) as usize;
        let pinning = Arc::new(BackendPinning(backend.clone()));
        BackendCopier { backend, own: vec![None; n], pinning, lanes: usize::MAX, behind: None }
    }

    /// This copier's own stream on `device` (bound), made on first use: for a backend that
    /// keeps no lanes.
    fn own_stream(&mut self, device: i32) -> Result<Raw, CrError> {
        let b = self.backend.clone();
        let slot = self
            .own
            .get_mut(usize::try_from(device).unwrap_or(usize::MAX))
            .ok_or(CrError::NoSuchDevice { device, devices: b.device_count() })?;
        if let Some(s) = *slot {
            return Ok(s);
        }
        let s = crate::timing::timed(
            || format!("creating a copy stream on device {device}"),
            || b.stream_create(device, NON_BLOCKING, 0),
        )
        .map_err(CrError::device(format!("creating the copy stream on device {device}")))?;
        *slot = Some(s);
        Ok(s)
    }

    /// Run `copy` on a stream of `device` (bound), then wait until it is done: on a lane's
    /// event (the thread sleeps instead of spinning on a core the session's threads need),
    /// else on the stream.
    fn on(
        &mut self,
        device: i32,
        what: impl Fn() -> String,
        copy: impl FnOnce(&dyn Backend, StreamRef) -> Result<(), phos_protocol::CudaError>,
    ) -> Result<(), CrError> {
        // One copy in flight a copier: a lane is never held while another is waited for.
        drop(self.wait_behind()?);
        let b = self.backend.clone();
        if usize::try_from(device).ok().is_none_or(|d| d >= self.own.len()) {
            return Err(CrError::NoSuchDevice { device, devices: b.device_count() });
        }
        b.bind(device).map_err(CrError::device(format!("making device {device} current")))?;
        // Lanes are the backend's, on its devices: the session's device map says which.
        if let Some(pool) = b.copy_pool()
            && let Some(lane) = pool.take_lane(b.backend_device(device), self.lanes)
        {
            let stream = StreamRef::Created(lane.stream);
            let done = copy(b.as_ref(), stream).and_then(|_| {
                if b.event_record(lane.event, stream).is_ok() && b.event_synchronize(lane.event).is_ok() {
                    Ok(())
                } else {
                    b.stream_synchronize(stream)
                }
            });
            // Given back idle: a copy queued before a failure must not run into the next
            // user's buffer.
            if done.is_ok() || b.stream_synchronize(stream).is_ok() {
                pool.give_lane(lane);
            }
            return done.map_err(CrError::device(what()));
        }
        let stream = StreamRef::Created(self.own_stream(device)?);
        copy(b.as_ref(), stream).and_then(|_| b.stream_synchronize(stream)).map_err(CrError::device(what()))
    }
}

impl DeviceCopier for BackendCopier {
    fn buffer(&self, len: usize) -> HostBuffer {
        HostBuffer::new(len, Some(self.pinning.clone()))
    }

    fn read(&mut self, device: i32, addr: u64, out: &mut [u8]) -> Result<(), CrError> {
        let (host, len) = (out.as_mut_ptr() as u64, out.len() as u64);
        // Queued, then waited for before `out` is given back: only the device writes it
        // meanwhile (a copy that failed to queue writes nothing).
        self.on(device, || format!("copying {addr:#x}"), |b, s| b.memcpy_registered(addr, host, len, false, Some(s)))
    }

    fn write(&mut self, device: i32, addr: u64, data: &[u8]) -> Result<(), CrError> {
        self.on(device, || format!("writing {addr:#x}"), |b, s| b.memcpy_htod(addr, data, Some(s)))
    }

    fn zero(&mut self, device: i32, addr: u64, len: u64) -> Result<(), CrError> {
        self.on(device, || format!("writing {addr:#x}"), |b, s| b.memset(addr, 0, len, Some(s)))
    }

    fn finish(&mut self) -> Result<(), CrError> {
        // Every other copy was waited for.
        self.wait_behind().map(drop)
    }

    fn write_behind(
        &mut self,
        device: i32,
        addr: u64,
        buf: HostBuffer,
        len: usize,
    ) -> Result<Option<HostBuffer>, CrError> {
        let free = self.wait_behind()?;
        if len > buf.len() {
            return Err(CrError::Image(ImageError::Corrupted(format!(
                "a copy of {len} bytes from a buffer of {}",
                buf.len()
            ))));
        }
        let b = self.backend.clone();
        if usize::try_from(device).ok().is_none_or(|d| d >= self.own.len()) {
            return Err(CrError::NoSuchDevice { device, devices: b.device_count() });
        }
        b.bind(device).map_err(CrError::device(format!("making device {device} current")))?;
        let lane = b.copy_pool().and_then(|pool| pool.take_lane(b.backend_device(device), self.lanes));
        let stream = match lane {
            Some(l) => StreamRef::Created(l.stream),
            None => StreamRef::Created(self.own_stream(device)?),
        };
        // Queued from the page-locked buffer, which this copier holds until the copy is
        // waited for (`wait_behind`): only the device reads it meanwhile.
        let queued = b
            .memcpy_registered(addr, buf.as_ptr() as u64, len as u64, true, Some(stream))
            .and_then(|_| lane.map_or(Ok(()), |l| b.event_record(l.event, stream)));
        if let Err(e) = queued {
            // A copy may have been queued without its event: the buffer and the lane are
            // free only once the stream is idle.
            let idle = b.stream_synchronize(stream).is_ok();
            if idle && let (Some(l), Some(pool)) = (lane, b.copy_pool()) {
                pool.give_lane(l);
            }
            if !idle {
                // The device may still read it: never freed nor reused.
                std::mem::forget(buf);
            }
            return Err(CrError::device(format!("writing {addr:#x}"))(e));
        }
        if let (Some(l), Some(pool)) = (lane, b.copy_pool()) {
            pool.give_lane(l);
        }
        self.behind = Some(Behind { buf, device, addr, event: lane.map(|l| l.event), stream });
        Ok(free)
    }

    fn wait_behind(&mut self) -> Result<Option<HostBuffer>, CrError> {
        let Some(Behind { buf, device, addr, event, stream }) = self.behind.take() else { return Ok(None) };
        let b = self.backend.clone();
        let _ = b.bind(device);
        // On the lane's event (the thread sleeps), else on the stream.
        let done = match event {
            Some(e) => b.event_synchronize(e).or_else(|_| b.stream_synchronize(stream)),
            None => b.stream_synchronize(stream),
        };
        // The buffer is free only once nothing queued reads it.
        let idle = done.is_ok() || b.stream_synchronize(stream).is_ok();
        match done {
            Ok(()) => Ok(Some(buf)),
            Err(e) => {
                if !idle {
                    std::mem::forget(buf);
                }
                Err(CrError::device(format!("writing {addr:#x}"))(e))
            }
        }
    }

    fn beside_the_session(&mut self, beside: bool) {
        self.lanes = if beside { crate::backend::copy_pool::BESIDE_SESSION_LANES } else { usize::MAX };
    }

    fn prepare_hashing(&mut self, device: i32) -> bool {
        match self.backend.prepare_hashing(device) {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!("device {device}'s memory cannot be hashed ({e:?}): a recopy copies again all it wrote");
                false
            }
        }
    }

    fn hash_blocks(&mut self, device: i32, blocks: &[(u64, u64)]) -> Result<Vec<u64>, CrError> {
        self.backend.hash_blocks(device, blocks).map_err(CrError::device(format!("hashing memory of device {device}")))
    }
}

impl Drop for BackendCopier {
    fn drop(&mut self) {
        // A copy still in flight finishes before its buffer and stream go.
        let _ = self.wait_behind();
        for (d, s) in self.own.iter().enumerate() {
            if let Some(raw) = s {
                let _ = self.backend.bind(d as i32);
                let _ = self.backend.stream_destroy(*raw);
            }
        }
    }
}

/// What a checkpoint sees of a session: its registries, records and quiesce lock (not its
/// services), and what the router knows of it.
struct Checkpointing<'a> {
    session: &'a Session,
    meta: SessionMeta,
}

impl Quiesce for Checkpointing<'_> {
    type AtRest<'a>
        = Quiesced<'a>
    where
        Self: 'a;

    fn quiesce(&self, within: &Within<'_>) -> Result<Quiesced<'_>, CrError> {
        let s = self.session;
        let start = Instant::now();
        let quiesced = s.hold_calls(within)?;
        // Synchronised on a thread of its own: a kernel that never ends, or a host function
        // whose guest never answers, must not hold the session (and the operator) for ever.
        let syncing = Arc::new(AtomicI32::new(0));
        let (b, at) = (s.backend_arc(), syncing.clone());
        let synced = engine::wait_within(within, move || {
            for d in 0..b.device_count() {
                at.store(d, Ordering::Relaxed);
                b.device_synchronize(d).map_err(CrError::device(format!("synchronising device {d}")))?;
            }
            Ok::<(), CrError>(())
        })
        .map_err(|why| {
            let waiting_for = Waiting::Device { device: syncing.load(Ordering::Relaxed) };
            match why {
                Interrupted::TimedOut => CrError::TimedOut { session: s.id, waited: start.elapsed(), waiting_for },
                Interrupted::Cancelled => {
                    CrError::Abandoned { session: s.id, what: format!("waiting for {waiting_for}") }
                }
            }
        })?;
        synced.ok_or(CrError::Thread("device synchronisation"))??;
        Ok(quiesced)
    }
}

impl Snapshot for Checkpointing<'_> {
    fn head(&self) -> Result<Manifest, CrError> {
        let s = self.session;
        let o = &s.objects;
        let b = s.backend();
        let records = s
            .records
            .live()
            .into_iter()
            .map(|r| Record {
                api: r.function.api().id(),
                function: r.function.id(),
                name: r.function.name().to_string(),
                device: r.device,
                payload: r.payload,
                creates: r.creates.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
            })
            .collect();
        // Every range of device memory the session holds: allocations, then module variables.
        let region = |addr, size, device, kind| MemoryRegion { addr, size, device, kind, chunks: Vec::new() };
        let mut memory: Vec<MemoryRegion> = o
            .memory
            .allocations()
            .into_iter()
            .map(|a| region(a.addr, a.size, a.device, RegionKind::Allocation))
            .collect();
        memory.extend(
            o.modules.variables().into_iter().map(|v| {
                region(v.addr, v.size, v.device, RegionKind::ModuleVariable { module: v.module, name: v.name })
            }),
        );
        // Read back at rest: no copy or kernel writes an array meanwhile.
        let arrays = crate::timing::timed(
            || format!("reading back {} bytes of CUDA arrays", o.arrays.content_bytes()),
            || o.arrays.snapshot(b),
        )
        .map_err(CrError::device("reading the session's CUDA arrays".to_string()))?;
        let conditionals = o
            .graphs
            .conditional_handles()
            .into_iter()
            .map(|(cell, graph, default, flags)| ConditionalHandle {
                cell,
                device: o.memory.device_of(cell).unwrap_or(0),
                graph,
                default,
                flags,
            })
            .collect();
        let mut meta = self.meta.clone();
        meta.id = s.id;
        meta.backend = b.name().to_string();
        meta.device_base = o.memory.base();
        meta.device_size = o.memory.size();
        meta.devices =
            (0..b.device_count()).map(|d| b.device_properties(d).map(|p| p.name).unwrap_or_default()).collect();
        Ok(Manifest {
            format: 0,
            apis: ApiVersion::of_this_build()
                .into_iter()
                .map(|a| ImageApi { id: a.id, name: a.name, version: a.version, hash: a.hash })
                .collect(),
            created_ms: 0,
            session: meta,
            handle_counters: o.handle_counters(),
            records,
            memory,
            // Taken at rest: every async call that ran is noted (see `ApiServer::run`).
            async_calls: s.async_calls.snapshot(),
            graphs: o.graphs.snapshot(),
            // Kept while each call held the quiesce lock (see `ApiServer::run`).
            sync_replies: s.sync_replies.snapshot(),
            arrays,
            conditionals,
        })
    }

    fn copier(&self) -> Result<Box<dyn DeviceCopier + '_>, CrError> {
        Ok(Box::new(BackendCopier::new(self.session.backend_arc())))
    }
}

/// The session itself follows its calls and writes.
impl Intercept for Checkpointing<'_> {
    fn install_hook(&self, hook: Arc<dyn CallHook>, within: &Within<'_>) -> Result<Installed<'_>, CrError> {
        self.session.install_hook(hook, within)
    }

    fn dirty_log(&self) -> Arc<dyn DirtyLog> {
        self.session.dirty_log()
    }
}

/// The engine's memory and the validation of launches ([`crate::window`]).
impl Concurrent for Checkpointing<'_> {
    fn open_window(&self, reserve: Option<u64>) -> Result<Arc<dyn Window>, CrError> {
        let s = self.session;
        let o = &s.objects;
        // The session's memory on each device: more is never copied aside.
        let mut bytes: HashMap<i32, u64> = HashMap::new();
        for a in o.memory.allocations() {
            *bytes.entry(a.device).or_default() += a.size;
        }
        for v in o.modules.variables() {
            *bytes.entry(v.device).or_default() += v.size;
        }
        // Before the session is held: compiling a twin takes seconds for large modules.
        crate::speculation::prepare_twins(s);
        let backend = s.backend_arc();
        let sized = |device: i32| {
            reserve.unwrap_or_else(|| {
                crate::window::sized_reserve(backend.as_ref(), device, bytes.get(&device).copied().unwrap_or(0))
            })
        };
        let window =
            crate::window::ServerWindow::open(s.id, backend.clone(), o.memory.clone(), s.window.clone(), sized)?;
        Ok(window)
    }
}

/// A fresh session a restore rebuilds: its records are replayed through the generated
/// dispatch, the same that served the guest.
struct Rebuilding<'a>(&'a Session);

impl Rebuild for Rebuilding<'_> {
    fn set_handle_counters(&self, counters: &[(String, u64)]) {
        self.0.objects.set_handle_counters(counters);
    }

    /// A record is replayed on the guest device it names: the session's device map (made
    /// from `device` when the session was, [`device_map`]) puts that on the backend's.
    fn replay(&self, r: &Record, _device: Option<i32>) -> Result<(), CrError> {
        let id = Function::from_wire(r.api, r.function).ok_or_else(|| CrError::UnknownFunction(r.name.clone()))?;
        let dev = r.device;
        let cx = CallCx {
            device: dev,
            replay: Some(r.creates.iter().map(|(_, v)| *v).collect()),
            function: Some(id),
            ..CallCx::default()
        };
        self.0.backend().bind(dev).map_err(CrError::device(format!("making device {dev} current")))?;
        let mut out = Vec::new();
        crate::timing::timed(
            || format!("replaying {}", r.name),
            || crate::server::replay(self.0, &cx, id, &r.payload, &mut out),
        )
        .map_err(|reason| CrError::Replay { function: r.name.clone(), reason })
    }

    fn region_target(&self, region: &MemoryRegion, _device: Option<i32>) -> Result<(u64, i32), CrError> {
        let s = self.0;
        // The guest's device, as for records.
        let dev = region.device;
        match &region.kind {
            RegionKind::Allocation => {
                if !s.objects.memory.contains(region.addr, region.size) {
                    return Err(CrError::NotRecreated { addr: region.addr });
                }
                Ok((region.addr, dev))
            }
            RegionKind::ModuleVariable { module, name } => {
                let (addr, size) = s
                    .objects
                    .modules
                    .variable(s.backend(), &s.objects.memory, *module, name)
                    .map_err(CrError::device(format!("variable {name}")))?;
                if size != region.size {
                    return Err(CrError::VariableSize { name: name.clone(), size, image: region.size });
                }
                Ok((addr, dev))
            }
        }
    }

    /// The cells of conditional handles allocated again at their addresses (their contents
    /// are memory regions, written next) and the handles put back; then the arrays, with
    /// their contents, and the texture and surface objects under the values the program holds.
    fn after_records(&self, manifest: &Manifest) -> Result<(), CrError> {
        let s = self.0;
        let impossible = |why: String| CrError::Image(ImageError::Impossible(why));
        for c in &manifest.conditionals {
            // The cell's allocation as the image has it (the region's size: 4 bytes).
            let size = manifest
                .memory
                .iter()
                .find(|r| r.addr == c.cell && matches!(r.kind, RegionKind::Allocation))
                .map_or(4, |r| r.size);
            s.backend().bind(c.device).map_err(CrError::device(format!("making device {} current", c.device)))?;
            s.objects
                .memory
                .alloc_at(s.backend(), c.device, c.cell, size)
                .map_err(CrError::device(format!("allocating the cell of conditional handle {:#x}", c.cell)))?;
            s.objects
                .graphs
                .load_conditional_handle(c.cell, c.graph, c.default, c.flags)
                .map_err(|_| impossible(format!("conditional handle {:#x}", c.cell)))?;
        }
        let memory = s.objects.memory.clone();
        let holds = move |addr: u64, len: u64| memory.contains(addr, len);
        crate::timing::timed(
            || format!("making the image's CUDA arrays and objects again ({} bytes)", manifest.arrays.len()),
            || s.objects.arrays.load(s.backend(), &manifest.arrays, &holds),
        )
        .map_err(impossible)
    }

    fn copier(&self) -> Result<Box<dyn DeviceCopier + '_>, CrError> {
        Ok(Box::new(BackendCopier::new(self.0.backend_arc())))
    }
}

/// The hook slot and dirty log of a session, for protocols that follow it while it runs.
impl Intercept for Session {
    fn install_hook(&self, hook: Arc<dyn CallHook>, within: &Within<'_>) -> Result<Installed<'_>, CrError> {
        let held = self.hold_calls(within)?;
        let installed = self.hooks.install(hook).ok_or(CrError::HookInstalled { session: self.id })?;
        // Releasing the calls orders the installation before every call that starts later.
        drop(held);
        Ok(installed)
    }

    fn dirty_log(&self) -> Arc<dyn DirtyLog> {
        self.objects.memory.clone()
    }
}

impl Session {
    /// A new image in `dir` whose memory files have room for the session's memory as it is
    /// now, made before the checkpoint holds any call (see [`ImageWriter::prepare`]).
    fn image_writer(&self, dir: &Path, compression: Compression) -> Result<ImageWriter, CrError> {
        let mut sink = ImageWriter::create(dir, compression, engine::COPY_CHUNK)?;
        let bytes: u64 = self.objects.memory.regions().iter().map(|r| r.1).sum();
        crate::timing::timed(
            || format!("preparing the image's memory files for {bytes} bytes"),
            || sink.prepare(bytes, phos_checkpoint::parallel::workers()),
        )?;
        Ok(sink)
    }

    /// Write the session to the image directory `dir`; see [`checkpoint_to`](Self::checkpoint_to).
    pub fn checkpoint(
        &self,
        dir: &Path,
        meta: SessionMeta,
        compression: Compression,
        stop: bool,
        progress: &Progress,
        bounds: &Bounds,
    ) -> Result<CheckpointSummary, CrError> {
        let mut sink = self.image_writer(dir, compression)?;
        let mut summary = self.checkpoint_to(&mut sink, meta, compression, stop, progress, bounds)?;
        summary.dir = dir.to_path_buf();
        Ok(summary)
    }

    /// Write the session to the image directory `dir`, `how` says: copy-on-write while the
    /// session runs (taken again stop-the-world, with a log line, if validation finds a
    /// kernel wrote memory its launch was not speculated to write, or the copy-on-write
    /// could not go on), recopy (the session at the end), or stop-the-world. A stopping
    /// checkpoint is recopy or stop-the-world: the session must end where its image is.
    pub fn checkpoint_as(
        &self,
        dir: &Path,
        meta: SessionMeta,
        compression: Compression,
        how: How,
        progress: &Progress,
        bounds: &Bounds,
    ) -> Result<CheckpointSummary, CrError> {
        let hold = how.park && !how.stop;
        if hold {
            self.cut_when_frozen();
        }
        let taken = self.checkpoint_held_or_not(dir, meta, compression, &how, hold, progress, bounds);
        if hold && taken.is_err() {
            // Given up (before the cut or after it): the session is served again.
            self.thaw();
        }
        taken
    }

    /// [`checkpoint_as`](Self::checkpoint_as); `hold`: the session is frozen at the cut (or,
    /// stop-the-world, at the end) and stays so.
    #[allow(clippy::too_many_arguments)]
    fn checkpoint_held_or_not(
        &self,
        dir: &Path,
        meta: SessionMeta,
        compression: Compression,
        how: &How,
        hold: bool,
        progress: &Progress,
        bounds: &Bounds,
    ) -> Result<CheckpointSummary, CrError> {
        let freezes = how.stop || hold;
        if how.mode == CheckpointMode::StopTheWorld || (how.stop && how.mode != CheckpointMode::Recopy) {
            let mut summary = self.checkpoint(dir, meta, compression, freezes, progress, bounds)?;
            summary.stopped = how.stop;
            return Ok(summary);
        }
        self.refuse_what_images_do_not_hold()?;
        let target = Checkpointing { session: self, meta: meta.clone() };
        let mut sink = self.image_writer(dir, compression)?;
        // The waits for the session may take the whole timeout, from when they begin.
        let cancelled = || bounds.cancel.is_cancelled();
        let within = Within { deadline: Instant::now() + bounds.quiesce_timeout, cancelled: &cancelled };
        let stop = how.stop;
        let freeze = || {
            if freezes {
                self.freeze();
            }
        };
        let taken = match how.mode {
            CheckpointMode::Recopy => {
                engine::checkpoint_recopy(&target, &mut sink, compression, progress, &within, freezes, freeze)
            }
            _ => engine::checkpoint_cow(&target, &mut sink, compression, progress, &within, how.reserve, &freeze),
        };
        drop(sink);
        match taken {
            Ok(mut summary) => {
                summary.dir = dir.to_path_buf();
                summary.stopped = stop;
                Ok(summary)
            }
            // What the concurrent protocol could not vouch for, stop-the-world can.
            // Not where the session's process runs on since its dump (thawed): a checkpoint
            // taken now would not be the process's.
            Err(e @ (CrError::ValidationMissed { .. } | CrError::CopyOnWrite { .. })) if hold && !self.is_frozen() => {
                Err(e)
            }
            Err(e @ (CrError::ValidationMissed { .. } | CrError::CopyOnWrite { .. })) => {
                tracing::warn!("{e}: the checkpoint is taken again, stop-the-world");
                let mut summary = self.checkpoint(dir, meta, compression, freezes, progress, bounds)?;
                summary.fallback = Some(e.to_string());
                summary.stopped = stop;
                Ok(summary)
            }
            Err(e) => Err(e),
        }
    }

    /// Refuse, before anything is held or written, a session holding state images do not
    /// carry yet (every kind of checkpoint asks).
    fn refuse_what_images_do_not_hold(&self) -> Result<(), CrError> {
        if self.objects.memory.has_program_mappings() {
            return Err(CrError::NotCheckpointable {
                session: self.id,
                what: "it uses the driver API's virtual memory management (cuMemAddressReserve, cuMemCreate, cuMemMap), which checkpoints do not hold yet".into(),
            });
        }
        if self.objects.memory.has_imported() || self.objects.events.has_opened() {
            return Err(CrError::NotCheckpointable {
                session: self.id,
                what: "it holds IPC memory or events opened from another session (cudaIpcOpenMemHandle, cudaIpcOpenEventHandle), which checkpoints do not hold".into(),
            });
        }
        if self.objects.graphs.holds_memory_nodes() {
            return Err(CrError::NotCheckpointable {
                session: self.id,
                what: "it holds graphs with memory allocation or free nodes, or their allocations (cudaGraphAddMemAllocNode, cudaGraphAddMemFreeNode, cudaMallocAsync or cudaFreeAsync captured), which checkpoints do not hold yet".into(),
            });
        }
        let array_bytes = self.objects.arrays.content_bytes();
        if array_bytes > MAX_ARRAY_BYTES {
            return Err(CrError::NotCheckpointable {
                session: self.id,
                what: format!(
                    "its CUDA arrays hold {array_bytes} bytes, more than an image's manifest carries ({MAX_ARRAY_BYTES})"
                ),
            });
        }
        Ok(())
    }

    /// Write the session to `sink` (a directory, a stream). `meta` carries what the router
    /// knows (token, tenant, program, ABI, epoch); the rest is filled in here. `stop`: the
    /// session is frozen once the image is whole.
    pub fn checkpoint_to(
        &self,
        sink: &mut dyn ImageSink,
        meta: SessionMeta,
        compression: Compression,
        stop: bool,
        progress: &Progress,
        bounds: &Bounds,
    ) -> Result<CheckpointSummary, CrError> {
        self.refuse_what_images_do_not_hold()?;
        let cancelled = || bounds.cancel.is_cancelled();
        let within = Within { deadline: Instant::now() + bounds.quiesce_timeout, cancelled: &cancelled };
        let target = Checkpointing { session: self, meta };
        let mut summary = engine::checkpoint(&target, sink, compression, progress, &within, || {
            if stop {
                // The image is whole: the session stops even if its client has gone
                // meanwhile (the router, which asked, suspends the session when it hears
                // back).
                self.freeze();
            }
        })?;
        summary.stopped = stop;
        Ok(summary)
    }

    /// Move the session to another server while it runs: the recopy protocol
    /// ([`engine::recopy`]) into `sink` (a [`MigrationSender`](phos_checkpoint::migrate::MigrationSender)
    /// streaming to the target), whose end returns once the target has restored the session.
    /// The session is frozen then, held from the last round on: its calls go to the target
    /// (or, should the move be given up after all, run here again on a [`thaw`](Self::thaw)).
    /// Any failure before leaves the session running here as it was.
    pub fn migrate_out(
        &self,
        sink: &mut dyn RecopySink,
        meta: SessionMeta,
        progress: &Progress,
        bounds: &Bounds,
    ) -> Result<(CheckpointSummary, Vec<RoundFigures>), CrError> {
        self.refuse_what_images_do_not_hold()?;
        let cancelled = || bounds.cancel.is_cancelled();
        let within = Within { deadline: Instant::now() + bounds.quiesce_timeout, cancelled: &cancelled };
        let target = Checkpointing { session: self, meta };
        let (mut summary, rounds) = engine::recopy(&target, sink, progress, &within, true, || self.freeze())?;
        summary.stopped = true;
        Ok((summary, rounds))
    }

    /// Rebuild a session from the image directory `dir`; see [`restore_from`](Self::restore_from).
    pub fn restore(
        dir: &Path,
        factory: &SessionFactory,
        device: Option<i32>,
        progress: &Progress,
        cancel: &Cancel,
    ) -> Result<(Session, SessionMeta, RestoreSummary), CrError> {
        let start = Instant::now();
        let mut image = crate::timing::timed(|| format!("opening the image {}", dir.display()), || Image::open(dir))?;
        let opened_ms = start.elapsed().as_secs_f64() * 1e3;
        let (session, meta, mut summary) = Self::restore_from(&mut image, factory, device, progress, cancel)?;
        summary.verify_ms += opened_ms;
        summary.total_ms += opened_ms;
        Ok((session, meta, summary))
    }

    /// Rebuild a session from `source` in this (fresh) server, made by `factory` (its backend,
    /// device range and limits). `device` moves every record onto that device (a restore onto
    /// another GPU). `cancel` stops the restore between steps.
    pub fn restore_from(
        source: &mut dyn ImageSource,
        factory: &SessionFactory,
        device: Option<i32>,
        progress: &Progress,
        cancel: &Cancel,
    ) -> Result<(Session, SessionMeta, RestoreSummary), CrError> {
        let start = Instant::now();
        // The manifest and what is known of the chunks are checked; each chunk's checksum is
        // checked as it is read. A failure anywhere ends the restore and drops the new
        // session with everything it made: nothing half-restored is ever served.
        let (session, meta) = Self::for_image(source.manifest(), factory, device)?;
        let verify_ms = start.elapsed().as_secs_f64() * 1e3;
        let cancelled = || cancel.is_cancelled();
        let mut summary = engine::restore(&Rebuilding(&session), source, device, progress, &cancelled)?;
        crate::timing::timed(
            || "making the image's graphs again".into(),
            || session.load_graphs(source.manifest(), device),
        )?;
        summary.verify_ms = verify_ms;
        summary.total_ms = start.elapsed().as_secs_f64() * 1e3;
        Ok((session, meta, summary))
    }
}

impl Session {
    /// Put the image's graphs back, once the records have made again what their operations
    /// name (functions, library handles).
    /// Module variables come back where the reloaded modules put them, which need not be where
    /// they were: an operation's address in a variable moves with it.
    fn load_graphs(&self, manifest: &Manifest, device: Option<i32>) -> Result<(), CrError> {
        if manifest.graphs.is_empty() {
            return Ok(());
        }
        let rebuilt = Rebuilding(self);
        // (old start, length, new start) of each variable, by old start.
        let mut moves = Vec::new();
        for region in &manifest.memory {
            if matches!(region.kind, RegionKind::ModuleVariable { .. }) {
                let (to, _) = rebuilt.region_target(region, device)?;
                moves.push((region.addr, region.size, to));
            }
        }
        moves.sort_unstable();
        let relocate = |addr: u64| {
            let i = moves.partition_point(|&(start, _, _)| start <= addr);
            match i.checked_sub(1).map(|i| moves[i]) {
                Some((start, len, to)) if addr - start < len => to + (addr - start),
                _ => addr,
            }
        };
        self.objects.graphs.load(&manifest.graphs, &relocate).map_err(|e| CrError::Image(ImageError::Impossible(e)))
    }

    /// A fresh session for the image of `manifest`, once its manifest checks
    /// ([`check_image`]): its device address range reserved, nothing in it yet.
    fn for_image(
        manifest: &Manifest,
        factory: &SessionFactory,
        device: Option<i32>,
    ) -> Result<(Session, SessionMeta), CrError> {
        crate::timing::timed(
            || "checking the image against this server".into(),
            || check_image(manifest, factory, device),
        )?;
        let meta = manifest.session.clone();
        let map = device_map(manifest, factory, device)?;
        if !map.is_identity() {
            tracing::info!(session = meta.id, "the session moves to another device: {map}");
        }
        let backend = crate::backend::mapped::Mapped::wrap(factory.backend.clone(), map);
        let session = crate::timing::timed(
            || format!("making the session and reserving its {} device addresses", meta.device_size),
            || {
                Session::new(
                    meta.id,
                    backend,
                    meta.device_base,
                    meta.device_size,
                    factory.max_reply,
                    (factory.output)(),
                    factory.limits,
                )
            },
        )
        .map_err(CrError::device(format!("reserving the device address range {:#x}", meta.device_base)))?;
        session
            .async_calls
            .load(&manifest.async_calls)
            .map_err(|e| CrError::Image(ImageError::Impossible(e.to_string())))?;
        session.sync_replies.load(&manifest.sync_replies);
        Ok((session, meta))
    }

    /// Restore the image directory `dir` on demand: check it, recreate the session's objects,
    /// and return the session to be served at once, its memory loading on threads of its own
    /// behind it (`pace` waited before each chunk: a test's knob). Until a byte is loaded,
    /// every call that reads or writes it waits ([`OnDemandHook`]); the returned status
    /// follows the load. `cancel` stops the restore until the session is returned; the load
    /// then has no client to stop it. A load that fails leaves the session with a sticky
    /// error: its calls fail from then on, as after a device fault.
    pub fn restore_on_demand(
        dir: &Path,
        factory: &SessionFactory,
        device: Option<i32>,
        progress: &Arc<Progress>,
        cancel: &Cancel,
        pace: std::time::Duration,
    ) -> Result<(Arc<Session>, SessionMeta, RestoreSummary, Arc<LoadStatus>), CrError> {
        let start = Instant::now();
        let image = crate::timing::timed(|| format!("opening the image {}", dir.display()), || Image::open(dir))?;
        // A directory image always has one.
        let reader = image.parallel().ok_or(CrError::Thread("image reader"))?;
        Self::restore_on_demand_from(&image.manifest, reader, start, factory, device, progress, cancel, pace)
    }

    /// [`restore_on_demand`](Self::restore_on_demand) of an image whose manifest (with its
    /// chunk tables) is `manifest` and whose chunks `reader` reads: a directory's, or what a
    /// migration brought in host memory. `start` is when the restore began.
    #[allow(clippy::too_many_arguments)] // the restore's own parameters, and where the image is
    pub fn restore_on_demand_from(
        manifest: &Manifest,
        reader: Arc<dyn phos_checkpoint::ChunkReader>,
        start: Instant,
        factory: &SessionFactory,
        device: Option<i32>,
        progress: &Arc<Progress>,
        cancel: &Cancel,
        pace: std::time::Duration,
    ) -> Result<(Arc<Session>, SessionMeta, RestoreSummary, Arc<LoadStatus>), CrError> {
        let (session, meta) = Self::for_image(manifest, factory, device)?;
        let verify_ms = start.elapsed().as_secs_f64() * 1e3;
        let cancelled = || cancel.is_cancelled();
        let replay_ms = crate::timing::timed(
            || format!("recreating the session's objects ({} records replayed)", manifest.records.len()),
            || engine::recreate(&Rebuilding(&session), manifest, device, &cancelled),
        )?;
        crate::timing::timed(|| "making the image's graphs again".into(), || session.load_graphs(manifest, device))?;
        let rebuilt = Rebuilding(&session);
        let (plan, pending) = crate::timing::timed(
            || format!("planning the load of {} memory regions", manifest.memory.len()),
            || -> Result<_, CrError> {
                let targets: Vec<(u64, i32)> =
                    manifest.memory.iter().map(|r| rebuilt.region_target(r, device)).collect::<Result<_, _>>()?;
                let plan = LoadPlan::new(manifest, &targets);
                let pending = Arc::new(PendingMemory::new(plan.ranges()));
                Ok((plan, pending))
            },
        )?;
        let status = Arc::new(LoadStatus::new(meta.id, start, progress.clone()));
        let memory_bytes = plan.bytes();
        progress.done.store(0, Ordering::Relaxed);
        progress.total.store(memory_bytes, Ordering::Relaxed);
        let session = Arc::new(session);
        let weak = Arc::downgrade(&session);
        let hook = Arc::new(OnDemandHook {
            pending: pending.clone(),
            memory: session.objects.memory.clone(),
            status: status.clone(),
            // Kernels read what these objects name through them, not through their
            // parameters: every call waits for it.
            texture_memory: Box::new(move || {
                weak.upgrade().map(|s| s.objects.arrays.linear_ranges()).unwrap_or_default()
            }),
        });
        // The loader installs the hook (its guard lives on the loader's stack, beside its own
        // handle on the session) and says so before the session may be served.
        let (installed_tx, installed_rx) = std::sync::mpsc::channel();
        let (s, st, progress) = (session.clone(), status.clone(), progress.clone());
        std::thread::Builder::new()
            .name("phos-restore-load".into())
            .spawn(move || {
                let Some(installed) = s.hooks.install(hook) else {
                    let _ = installed_tx.send(false);
                    return;
                };
                let _ = installed_tx.send(true);
                let workers = phos_checkpoint::parallel::workers();
                let all_loaded = || st.loaded();
                let loaded = on_demand::load(
                    &Rebuilding(&s),
                    &plan,
                    reader.as_ref(),
                    &pending,
                    &progress,
                    workers,
                    pace,
                    &all_loaded,
                );
                match loaded {
                    Ok(()) => {
                        let r = st.report();
                        tracing::info!(
                            session = s.id,
                            "memory loaded: {} bytes in {:.1} ms (first call {}, {} calls waited {:.1} ms in all)",
                            r.total,
                            r.loaded_ms.unwrap_or_default(),
                            r.first_call_ms.map_or("none during the load".into(), |ms| format!("at {ms:.1} ms")),
                            r.held_calls,
                            r.held_ms
                        );
                    }
                    Err(e) => {
                        // The memory is lost, as after an uncorrectable memory error
                        // (cudaErrorECCUncorrectable, sticky): calls held and to come fail.
                        let lost = phos_protocol::CudaError(214);
                        tracing::error!(
                            session = s.id,
                            "loading the restored memory failed: {e}; the session's calls fail from now on"
                        );
                        s.note_error(lost);
                        pending.fail(lost);
                        st.failed(e.to_string());
                    }
                }
                drop(installed);
                st.hook_released();
            })
            .map_err(|_| CrError::Thread("restore load"))?;
        let hooked = Instant::now();
        if installed_rx.recv() != Ok(true) {
            return Err(CrError::HookInstalled { session: meta.id });
        }
        crate::timing::slow(hooked, || "starting the load and installing its hook".into());
        status.serving();
        let summary = RestoreSummary {
            session: meta.id,
            records: manifest.records.len(),
            memory_bytes,
            verify_ms,
            replay_ms,
            copy_ms: 0.0,
            total_ms: start.elapsed().as_secs_f64() * 1e3,
            pooled: false,
            on_demand: true,
        };
        Ok((session, meta, summary, status))
    }
}

/// The device map of the session of `m` restored by `factory`'s server: the guest keeps the
/// numbers of its devices, each on this server's device of the same number, unless `device`
/// moves the session, whose objects must then all be on one of its devices
/// ([`DeviceMap::moving`]).
///
/// [`DeviceMap::moving`]: crate::backend::mapped::DeviceMap::moving
pub fn device_map(
    m: &Manifest,
    factory: &SessionFactory,
    device: Option<i32>,
) -> Result<crate::backend::mapped::DeviceMap, CrError> {
    use crate::backend::mapped::{DeviceMap, MapError};
    let devices = factory.backend.device_count();
    let Some(to) = device else { return Ok(DeviceMap::identity(devices)) };
    // Page-locked host memory is every device's: where it was allocated says nothing.
    let host_alloc = Function::Cudart(FunctionId::PhosHostAlloc);
    let on_a_device = |r: &&Record| Function::from_wire(r.api, r.function) != Some(host_alloc);
    let used = m.records.iter().filter(on_a_device).map(|r| r.device).chain(m.memory.iter().map(|r| r.device));
    DeviceMap::moving(devices, used, to).map_err(|e| match e {
        MapError::NoSuchDevice { device, devices } => CrError::NoSuchDevice { device, devices },
        several @ MapError::SeveralDevices { .. } => CrError::Image(ImageError::Impossible(several.to_string())),
    })
}

/// What this server can say of an image before it creates anything, beyond what
/// [`Image::open`] checked: that its records are calls this server's spec knows, creating
/// objects of the kinds the spec says, with handles of their kind and addresses inside the
/// session's ranges, no more of each kind than the session's limits allow, counters past
/// every handle the records use, memory regions that match what the records allocate, on
/// devices this server has; and that its device range is this server's.
pub fn check_image(m: &Manifest, factory: &SessionFactory, device: Option<i32>) -> Result<(), CrError> {
    let bad = |why: String| Err(CrError::Image(ImageError::Impossible(why)));
    let apis: Vec<ApiVersion> = m
        .apis
        .iter()
        .map(|a| ApiVersion { id: a.id, name: a.name.clone(), version: a.version, hash: a.hash })
        .collect();
    check_apis(&apis, "the image")?;
    let s = &m.session;
    if (s.device_base, s.device_size) != (factory.device_base, factory.device_size) {
        return bad(format!(
            "its device range {:#x}+{:#x} is not this server's ({:#x}+{:#x})",
            s.device_base, s.device_size, factory.device_base, factory.device_size
        ));
    }
    // Records and regions name the guest's devices, which the session's device map puts on
    // this server's (the same numbers unless `device` moves the session).
    let devices = factory.backend.device_count();
    let on_a_device = |d: i32| (0..devices).contains(&d);
    device_map(m, factory, device)?;
    // Kinds of handle the records create, and what each limit counts.
    let handle_kind = |kind: &str| HandleKind::ALL.iter().copied().find(|k| k.name() == kind);
    let host_alloc = Function::Cudart(FunctionId::PhosHostAlloc);
    let limit_of = |f: Function, kind: &str| match (f, kind) {
        (f, _) if f == host_alloc => Some(LimitKind::HostAllocations),
        (_, "device_memory") => Some(LimitKind::Allocations),
        (_, "stream") => Some(LimitKind::Streams),
        (_, "event") => Some(LimitKind::Events),
        (_, "module") => Some(LimitKind::Modules),
        (_, "function") => Some(LimitKind::Functions),
        (_, "graph") => Some(LimitKind::Graphs),
        (_, "graph_exec") => Some(LimitKind::GraphExecs),
        (_, "graph_node") => Some(LimitKind::GraphNodes),
        _ => None,
    };
    let arena = phos_protocol::host_arena::BASE..phos_protocol::host_arena::BASE + phos_protocol::host_arena::MAX_BYTES;
    let range = s.device_base..s.device_base + s.device_size;
    let mut seen: HashSet<(&str, u64)> = HashSet::new();
    let mut counts: HashMap<LimitKind, u64> = HashMap::new();
    // The highest number each handle kind's records use.
    let mut highest: HashMap<&str, u64> = HashMap::new();
    // Conditional handles' cells are allocations no record makes (check_meaning found each
    // in the image's memory).
    let mut allocations: HashSet<u64> = m.conditionals.iter().map(|c| c.cell).collect();
    let mut modules: HashSet<u64> = HashSet::new();
    for r in &m.records {
        let f = match Function::from_wire(r.api, r.function) {
            Some(f) if f.name() == r.name => f,
            _ => return Err(CrError::UnknownFunction(r.name.clone())),
        };
        if !on_a_device(r.device) {
            return bad(format!("a record of {} on device {}, which this server does not have", r.name, r.device));
        }
        let spec_creates = f.info().objects.creates;
        if r.creates.len() > spec_creates.len() {
            return bad(format!(
                "{} creates at most {} objects, the image says {}",
                r.name,
                spec_creates.len(),
                r.creates.len()
            ));
        }
        for (kind, value) in &r.creates {
            let Some((_, kind)) = spec_creates.iter().find(|(_, k)| k == kind) else {
                return bad(format!("{} creates no {kind}", r.name));
            };
            if !seen.insert((kind, *value)) {
                return bad(format!("two records create {kind} {value:#x}"));
            }
            match handle_kind(kind) {
                Some(hk) => {
                    if !is_handle_of(hk, *value) {
                        return bad(format!("{} created {value:#x}, which is no {kind} handle", r.name));
                    }
                    let number = value & ((1 << NUMBER_BITS) - 1);
                    let top = highest.entry(kind).or_default();
                    *top = (*top).max(number);
                    if hk == HandleKind::Module {
                        modules.insert(*value);
                    }
                }
                None if *kind == "device_memory" => {
                    let inside = if f == host_alloc { arena.contains(value) } else { range.contains(value) };
                    if !inside {
                        return bad(format!("{} placed memory at {value:#x}, outside the session's ranges", r.name));
                    }
                    if f != host_alloc {
                        allocations.insert(*value);
                    }
                }
                None => return bad(format!("{} creates objects of an unknown kind {kind}", r.name)),
            }
            if let Some(limit) = limit_of(f, kind) {
                *counts.entry(limit).or_default() += 1;
            }
        }
    }
    for (limit, n) in &counts {
        if *n > factory.limits.get(*limit) {
            return bad(format!(
                "{n} {limit}, past this server's limit of {} (the router's [limits] set it)",
                factory.limits.get(*limit)
            ));
        }
    }
    for (kind, next) in &m.handle_counters {
        if handle_kind(kind).is_none() {
            return bad(format!("a handle counter for {kind:?}, which is no kind of handle"));
        }
        if let Some(&top) = highest.get(kind.as_str())
            && *next <= top
        {
            return bad(format!(
                "the {kind} counter ({next}) is not past the {kind} handles its records use (up to {top}): new {kind}s would collide with live ones"
            ));
        }
    }
    if let Err(why) =
        crate::registry::arrays::ArrayRegistry::check_image(&m.arrays, factory.limits.get(LimitKind::Allocations))
    {
        return bad(why);
    }
    if let Some(c) = m.conditionals.iter().find(|c| !on_a_device(c.device)) {
        return bad(format!(
            "conditional handle {:#x} on device {}, which this server does not have",
            c.cell, c.device
        ));
    }
    for r in &m.memory {
        if !on_a_device(r.device) {
            return bad(format!("memory at {:#x} on device {}, which this server does not have", r.addr, r.device));
        }
        match &r.kind {
            RegionKind::Allocation if !allocations.contains(&r.addr) => {
                return bad(format!("memory at {:#x} that no record allocates", r.addr));
            }
            RegionKind::ModuleVariable { module, name } if !modules.contains(module) => {
                return bad(format!("variable {name} of module {module:#x}, which no record loads"));
            }
            _ => {}
        }
    }
    Ok(())
}
