//! The C/R engine: the traits a server implements so that its sessions can be checkpointed
//! and restored, and the protocols that run over them.
//!
//! A server gives the engine
//!
//! - [`Quiesce`]: bring the session to rest (no call runs or starts, the devices idle) within
//!   a deadline, and let it go again;
//! - [`Snapshot`]: what the session is, host side first (the manifest's head: records, handle
//!   counters, the regions of device memory), and a [`DeviceCopier`] for its memory;
//! - [`Rebuild`]: a fresh session to replay records into and copy memory back to;
//! - [`Intercept`]: a [`CallHook`] installed in the session's [`HookSlot`] sees what every
//!   call will touch before it runs, and may hold it or fail it; the session's [`DirtyLog`]
//!   says which device memory has been written since a point (noted by a [`TrackWrites`]
//!   hook).
//!
//! The protocols: [`checkpoint`] (stop-the-world: quiesce, take the host state, copy every
//! region out, write the image, let the session go) and [`restore`] (replay the records,
//! copy the memory in). Both copy in chunks, overlapping device copies with the image's
//! writing or reading on a thread of their own, and stream: an image goes to any
//! [`ImageSink`] and comes from any [`ImageSource`].
//!
//! Concurrent protocols (copy-on-write, recopy, on-demand restore) plug in through the same
//! traits: a protocol installs a [`CallHook`] ([`Intercept::install_hook`], which holds the
//! session's calls meanwhile), lets calls run, and the hook, called before each call with the
//! ranges and objects it will read and write, copies ahead of a write, notes it in the dirty
//! log ([`TrackWrites`]), or holds the call until the memory it touches is restored
//! ([`PendingMemory`]).

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use parking_lot::{Condvar, Mutex, RwLock};
use phos_protocol::CudaError;
use phos_protocol::spec::CallAccess;

use crate::report::{CheckpointSummary, Progress, RestoreSummary, Waiting};
use crate::{
    Chunk, ChunkReader, ChunkStore, Compression, Encoding, ImageError, ImageSink, ImageSource, Manifest, MemoryRegion,
    PreparedChunk, Record, prepare_chunk,
};

/// Size of the pieces memory is copied and stored in.
pub const COPY_CHUNK: usize = 8 << 20;
/// Pieces in flight between the device copies and the image.
const BUFFERS: usize = 4;

/// Why a checkpoint or a restore did not happen.
#[derive(Debug, thiserror::Error)]
pub enum CrError {
    #[error(transparent)]
    Image(#[from] ImageError),
    #[error(
        "session {session}: the checkpoint gave up after {waited:.1?} waiting for {waiting_for}; nothing was written, and the session carries on as it was"
    )]
    TimedOut { session: u64, waited: Duration, waiting_for: Waiting },
    #[error("session {session}: abandoned (its client went away) while {what}; the session is as it was")]
    Abandoned { session: u64, what: String },
    /// A device operation of the engine's own failed.
    #[error("{what}: {error:?}")]
    Device { what: String, error: CudaError },
    // What a server's own checks of an image refuse (besides an impossible session,
    // `ImageError::Impossible`).
    #[error(transparent)]
    OtherApis(#[from] phos_protocol::handshake::ApiMismatch),
    #[error("the image records `{0}`, which this server does not know")]
    UnknownFunction(String),
    #[error("device {device} does not exist here ({devices} devices)")]
    NoSuchDevice { device: i32, devices: i32 },
    #[error("replaying {function}: {reason}")]
    Replay { function: String, reason: String },
    #[error("allocation {addr:#x} was not recreated")]
    NotRecreated { addr: u64 },
    #[error("variable {name} has {size} bytes, the image {image}")]
    VariableSize { name: String, size: u64, image: u64 },
    #[error("the C/R engine's {0} thread stopped unexpectedly")]
    Thread(&'static str),
    #[error("session {session}: a C/R protocol is in progress already")]
    HookInstalled { session: u64 },
}

impl CrError {
    /// A device operation's failure, saying what it was.
    pub fn device(what: impl Into<String>) -> impl FnOnce(CudaError) -> CrError {
        let what = what.into();
        move |error| CrError::Device { what, error }
    }
}

/// How long an operation may take, and whether its client still wants it.
#[derive(Clone, Copy)]
pub struct Within<'a> {
    pub deadline: Instant,
    pub cancelled: &'a (dyn Fn() -> bool + Sync),
}

impl Within<'static> {
    /// `timeout` from now, for an operation no client can cancel.
    pub fn after(timeout: Duration) -> Self {
        fn never() -> bool {
            false
        }
        Within { deadline: Instant::now() + timeout, cancelled: &never }
    }
}

/// What made [`wait_within`] stop waiting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Interrupted {
    TimedOut,
    Cancelled,
}

/// Run `work` on a thread of its own and wait for it until `within`'s deadline or until it
/// is cancelled; the thread is then left to finish on its own (a device synchronisation
/// cannot be interrupted). `Ok(None)`: no thread could run it, or it ended without an answer.
pub fn wait_within<T: Send + 'static>(
    within: &Within<'_>,
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<Option<T>, Interrupted> {
    let (tx, rx) = mpsc::channel();
    let started = std::thread::Builder::new().name("phos-quiesce".into()).spawn(move || {
        let _ = tx.send(work());
    });
    if started.is_err() {
        return Ok(None);
    }
    loop {
        let left = within.deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left.min(Duration::from_millis(50))) {
            Ok(v) => return Ok(Some(v)),
            Err(mpsc::RecvTimeoutError::Disconnected) => return Ok(None),
            Err(mpsc::RecvTimeoutError::Timeout) if (within.cancelled)() => return Err(Interrupted::Cancelled),
            Err(mpsc::RecvTimeoutError::Timeout) if left.is_zero() => return Err(Interrupted::TimedOut),
            Err(mpsc::RecvTimeoutError::Timeout) => {}
        }
    }
}

/// Bringing a session to rest.
pub trait Quiesce {
    /// Held while the session is at rest; its calls run again when it is dropped.
    type AtRest<'a>
    where
        Self: 'a;
    /// Hold new calls, wait for the calls in flight to finish and for the devices to be idle.
    /// Give up at `within`'s deadline ([`CrError::TimedOut`]) or when it is cancelled
    /// ([`CrError::Abandoned`]), naming what was waited for; the session is then as it was.
    fn quiesce(&self, within: &Within<'_>) -> Result<Self::AtRest<'_>, CrError>;
}

/// What a checkpoint takes from a session.
pub trait Snapshot {
    /// The manifest but for its memory's chunks, host-side state all of it: what the session
    /// is, its handle counters, the records of its live objects, and every region of its
    /// device memory (address, size, device, kind; chunk tables empty), in image order.
    fn head(&self) -> Result<Manifest, CrError>;
    /// A copier of the session's device memory, for one checkpoint.
    fn copier(&self) -> Result<Box<dyn DeviceCopier + '_>, CrError>;
}

/// A fresh session that a restore rebuilds.
pub trait Rebuild {
    /// Carry on the image's handle counters.
    fn set_handle_counters(&self, counters: &[(String, u64)]);
    /// Recreate what `record` created, with the handles and addresses it names; on `device`
    /// when given (a restore onto another GPU).
    fn replay(&self, record: &Record, device: Option<i32>) -> Result<(), CrError>;
    /// Where `region`'s contents go: (address, device). An allocation comes back at its
    /// address; a module variable is wherever its reloaded module has it.
    fn region_target(&self, region: &MemoryRegion, device: Option<i32>) -> Result<(u64, i32), CrError>;
    /// A copier of the session's device memory, for one restore.
    fn copier(&self) -> Result<Box<dyn DeviceCopier + '_>, CrError>;
}

/// Moves device memory to and from host buffers for the engine (on streams of its own, so
/// that its copies never queue behind the session's work, nor hold it up).
pub trait DeviceCopier: Send {
    /// A host buffer of `len` bytes that copies are fast from and to (page-locked).
    fn buffer(&self, len: usize) -> HostBuffer;
    /// Copy `out.len()` bytes from `addr` on `device` into `out`; returns once they are there.
    fn read(&mut self, device: i32, addr: u64, out: &mut [u8]) -> Result<(), CrError>;
    /// Copy `data` to `addr` on `device`; returns once `data` may be reused.
    fn write(&mut self, device: i32, addr: u64, data: &[u8]) -> Result<(), CrError>;
    /// Set `len` bytes at `addr` on `device` to zero.
    fn zero(&mut self, device: i32, addr: u64, len: u64) -> Result<(), CrError>;
    /// Wait for everything queued.
    fn finish(&mut self) -> Result<(), CrError>;
}

/// Page-locks host memory for fast copies (a backend that has no use for it does nothing).
pub trait Pinning: Send + Sync {
    fn pin(&self, buf: &mut [u8]);
    fn unpin(&self, buf: &mut [u8]);
}

/// A host buffer for the engine's copies, page-locked for as long as it lives.
pub struct HostBuffer {
    bytes: Vec<u8>,
    pinning: Option<Arc<dyn Pinning>>,
}

impl HostBuffer {
    /// `len` zero bytes, page-locked by `pinning`.
    pub fn new(len: usize, pinning: Option<Arc<dyn Pinning>>) -> Self {
        let mut bytes = vec![0u8; len];
        if let Some(p) = &pinning {
            p.pin(&mut bytes);
        }
        HostBuffer { bytes, pinning }
    }

    /// Make room for at least `len` bytes.
    pub fn reserve(&mut self, len: usize) {
        if self.bytes.len() < len {
            // The old buffer is unpinned as it is dropped, before its memory is freed.
            *self = HostBuffer::new(len, self.pinning.clone());
        }
    }
}

impl std::ops::Deref for HostBuffer {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.bytes
    }
}

impl std::ops::DerefMut for HostBuffer {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.bytes
    }
}

impl Drop for HostBuffer {
    fn drop(&mut self) {
        if let Some(p) = &self.pinning {
            p.unpin(&mut self.bytes);
        }
    }
}

/// A point in a dirty log: what was written after it is what [`DirtyLog::written_since`]
/// answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Round(pub u64);

/// Which device memory has been written, for protocols that copy while the session runs.
/// Granularity is the log's (the server's is whole allocations).
pub trait DirtyLog: Send + Sync {
    /// `[addr, addr + len)` is about to be written.
    fn note_write(&self, addr: u64, len: u64);
    /// A new round: what is noted from now on is written since it.
    fn begin_round(&self) -> Round;
    /// The ranges written since `round` began, as (address, size), in address order.
    fn written_since(&self, round: Round) -> Vec<(u64, u64)>;
}

/// Sees every call before it runs, while installed in a session's [`HookSlot`].
pub trait CallHook: Send + Sync {
    /// `access` is what the call will read and write. Returning holds the call no longer; an
    /// error fails the call before it runs (the guest gets that error).
    fn before_call(&self, access: &CallAccess<'_>) -> Result<(), CudaError>;
    /// A call shown to [`before_call`](Self::before_call) has been served (answered, or
    /// queued for an async one).
    fn after_call(&self) {}
}

/// Where a session's C/R hook is installed. The dispatch asks [`active`](Self::active)
/// before every call (one relaxed atomic load: nothing else happens on the call path while
/// no protocol runs) and calls [`before_call`](Self::before_call) only then.
///
/// Install a hook only while the session is quiesced: releasing the quiesce orders the
/// installation before every later call, so no call runs unseen.
#[derive(Default)]
pub struct HookSlot {
    active: AtomicBool,
    hook: RwLock<Option<Arc<dyn CallHook>>>,
}

/// An installed hook; uninstalled when dropped.
pub struct Installed<'a>(&'a HookSlot);

impl Drop for Installed<'_> {
    fn drop(&mut self) {
        self.0.active.store(false, Ordering::Relaxed);
        *self.0.hook.write() = None;
    }
}

impl HookSlot {
    #[inline]
    pub fn active(&self) -> bool {
        self.active.load(Ordering::Relaxed)
    }

    /// Install `hook` until the returned guard is dropped (one at a time: a protocol in
    /// progress has it).
    pub fn install(&self, hook: Arc<dyn CallHook>) -> Option<Installed<'_>> {
        let mut slot = self.hook.write();
        if slot.is_some() {
            return None;
        }
        *slot = Some(hook);
        self.active.store(true, Ordering::Relaxed);
        Some(Installed(self))
    }

    /// Tell the installed hook, if there is one, that a call has been served.
    pub fn after_call(&self) {
        let hook = self.hook.read().clone();
        if let Some(h) = hook {
            h.after_call();
        }
    }

    /// Hand `access` to the installed hook, if there is one.
    pub fn before_call(&self, access: &CallAccess<'_>) -> Result<(), CudaError> {
        let hook = self.hook.read().clone();
        match hook {
            Some(h) => h.before_call(access),
            None => Ok(()),
        }
    }
}

/// A session that a protocol can follow while it runs: shown its calls before they run, and
/// told which of its memory they wrote.
pub trait Intercept {
    /// Install `hook` in the session's [`HookSlot`] until the guard is dropped: every call
    /// that starts after this returns is shown to it. The session's calls are held while it
    /// is installed (a call in flight finishes first), so that no call runs unseen; that wait
    /// gives up at `within`'s deadline ([`CrError::TimedOut`]) or when it is cancelled
    /// ([`CrError::Abandoned`]). One hook at a time ([`CrError::HookInstalled`]).
    fn install_hook(&self, hook: Arc<dyn CallHook>, within: &Within<'_>) -> Result<Installed<'_>, CrError>;
    /// The session's dirty log (fed by a [`TrackWrites`] hook).
    fn dirty_log(&self) -> Arc<dyn DirtyLog>;
}

/// A hook that notes in a dirty log every range a call will write.
pub struct TrackWrites<L: DirtyLog + ?Sized>(pub Arc<L>);

impl<L: DirtyLog + ?Sized> CallHook for TrackWrites<L> {
    fn before_call(&self, access: &CallAccess<'_>) -> Result<(), CudaError> {
        for d in access.device.iter().filter(|d| d.writes) {
            self.0.note_write(d.addr, d.len);
        }
        Ok(())
    }
}

/// Device memory a restore has not copied in yet, for a restore that serves its session
/// before all of its memory is in (on-demand restore). Installed as the session's hook, it
/// holds every call that reads or writes memory still pending until the restore has loaded
/// it (a write too: the restore's copy would overwrite it afterwards), and tells the restore
/// which ranges calls wait for ([`next_wanted`](Self::next_wanted)), so that it loads them
/// first.
///
/// A held call holds its session's quiesce lock (shared), so the restore must load the
/// memory or [`fail`](Self::fail), not quiesce the session, to let it go.
#[derive(Default)]
pub struct PendingMemory {
    state: Mutex<Pending>,
    /// Signalled when memory is loaded, or the restore fails.
    changed: Condvar,
}

#[derive(Default)]
struct Pending {
    /// What is not loaded yet: start -> length, no two overlapping.
    ranges: BTreeMap<u64, u64>,
    /// Ranges held calls wait for, the oldest first.
    wanted: VecDeque<(u64, u64)>,
    /// The restore gave up: calls that need memory it did not load fail with this.
    failed: Option<CudaError>,
}

impl Pending {
    /// The pending pieces that `[addr, addr + len)` overlaps, clipped to it.
    fn overlapping(&self, addr: u64, len: u64) -> Vec<(u64, u64)> {
        if len == 0 {
            return Vec::new();
        }
        let end = addr.saturating_add(len);
        // The piece starting at or before `addr` (it may reach into the range), then every
        // piece starting inside it.
        let before = self.ranges.range(..=addr).next_back();
        let inside = self.ranges.range(addr.saturating_add(1)..end);
        before
            .into_iter()
            .chain(inside)
            .filter_map(|(&start, &size)| {
                let (from, to) = (start.max(addr), start.saturating_add(size).min(end));
                (from < to).then(|| (from, to - from))
            })
            .collect()
    }

    /// `[addr, addr + len)` is no longer pending.
    fn remove(&mut self, addr: u64, len: u64) {
        for (from, size) in self.overlapping(addr, len) {
            // The piece `from` falls in: it starts at `from` unless `from` is `addr`.
            let (&start, &piece) = self.ranges.range(..=from).next_back().expect("an overlapping piece");
            self.ranges.remove(&start);
            if start < from {
                self.ranges.insert(start, from - start);
            }
            let piece_end = start.saturating_add(piece);
            if from + size < piece_end {
                self.ranges.insert(from + size, piece_end - (from + size));
            }
        }
    }
}

impl PendingMemory {
    /// Every range in `ranges` (address, length) pending; overlapping ranges merge.
    pub fn new(ranges: impl IntoIterator<Item = (u64, u64)>) -> Self {
        let mut pending = Pending::default();
        for (addr, len) in ranges {
            if len == 0 {
                continue;
            }
            // Merge with whatever it overlaps.
            let (mut from, mut to) = (addr, addr.saturating_add(len));
            for (start, size) in pending.overlapping(addr, len) {
                let (&s, &l) = pending.ranges.range(..=start).next_back().expect("an overlapping piece");
                debug_assert!(s <= start && start + size <= s + l);
                pending.ranges.remove(&s);
                from = from.min(s);
                to = to.max(s.saturating_add(l));
            }
            pending.ranges.insert(from, to - from);
        }
        PendingMemory { state: Mutex::new(pending), changed: Condvar::new() }
    }

    /// Whether any byte of `[addr, addr + len)` is still pending.
    pub fn is_pending(&self, addr: u64, len: u64) -> bool {
        !self.state.lock().overlapping(addr, len).is_empty()
    }

    /// Bytes still pending.
    pub fn remaining(&self) -> u64 {
        self.state.lock().ranges.values().sum()
    }

    /// `[addr, addr + len)` is loaded: the calls that waited only for it (or for it and
    /// memory loaded before) run.
    pub fn loaded(&self, addr: u64, len: u64) {
        self.loaded_then(addr, len, &|| {});
    }

    /// [`loaded`](Self::loaded), running `when_all_loaded` first if nothing is pending any
    /// more: before any call this lets go runs.
    pub fn loaded_then(&self, addr: u64, len: u64, when_all_loaded: &dyn Fn()) {
        let mut state = self.state.lock();
        state.remove(addr, len);
        if state.ranges.is_empty() {
            when_all_loaded();
        }
        self.changed.notify_all();
    }

    /// The oldest range a held call waits for that is still pending (a piece of it, where
    /// some is loaded already): what the restore should load next. `None`: no call waits.
    pub fn next_wanted(&self) -> Option<(u64, u64)> {
        let mut state = self.state.lock();
        while let Some(&(addr, len)) = state.wanted.front() {
            if let Some(&piece) = state.overlapping(addr, len).first() {
                return Some(piece);
            }
            state.wanted.pop_front();
        }
        None
    }

    /// Every range held calls wait for that is still pending (pieces of them, where some is
    /// loaded already), the oldest call's first: [`next_wanted`](Self::next_wanted) and what
    /// comes after it, for loaders that take several chunks at once.
    pub fn wanted(&self) -> Vec<(u64, u64)> {
        let mut state = self.state.lock();
        let mut out = Vec::new();
        let mut kept = VecDeque::new();
        while let Some((addr, len)) = state.wanted.pop_front() {
            let pieces = state.overlapping(addr, len);
            if !pieces.is_empty() {
                out.extend(pieces);
                kept.push_back((addr, len));
            }
        }
        state.wanted = kept;
        out
    }

    /// The restore cannot load the rest: the calls held, and every later call that touches
    /// memory still pending, fail with `error` (the session is then not to be served on).
    pub fn fail(&self, error: CudaError) {
        self.state.lock().failed = Some(error);
        self.changed.notify_all();
    }
}

impl CallHook for PendingMemory {
    fn before_call(&self, access: &CallAccess<'_>) -> Result<(), CudaError> {
        let mut state = self.state.lock();
        let mut asked = false;
        loop {
            let needed: Vec<(u64, u64)> = access.device.iter().flat_map(|d| state.overlapping(d.addr, d.len)).collect();
            if needed.is_empty() {
                return Ok(());
            }
            if let Some(error) = state.failed {
                return Err(error);
            }
            if !asked {
                state.wanted.extend(needed);
                asked = true;
            }
            self.changed.wait(&mut state);
        }
    }
}

fn ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1e3
}

/// Checkpoint `target` into `sink`, stop-the-world: quiesce it, take its host state (the
/// manifest's head), copy every region out in [`COPY_CHUNK`] pieces while a second thread
/// checks, compresses and writes the previous piece, complete the image, run `on_written`
/// (still at rest: a stopping checkpoint freezes the session there) and let the session go.
///
/// The session's calls are held for the whole checkpoint. A failure anywhere leaves the
/// session as it was; what the sink holds then is no image (a directory's manifest is
/// written last, a stream's end record too).
pub fn checkpoint<T: Quiesce + Snapshot>(
    target: &T,
    sink: &mut dyn ImageSink,
    compression: Compression,
    progress: &Progress,
    within: &Within<'_>,
    on_written: impl FnOnce(),
) -> Result<CheckpointSummary, CrError> {
    let start = Instant::now();
    let at_rest = target.quiesce(within)?;
    let quiesce_ms = ms(start);
    let copy_start = Instant::now();
    let mut head = target.head()?;
    head.created_ms = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0);
    let session = head.session.id;
    progress.start(head.memory.iter().map(|r| r.size).sum());
    sink.begin(&head)?;
    let pieces = pieces(&head.memory);
    let workers = crate::parallel::workers().min(pieces.len()).max(1);
    match sink.parallel(workers)? {
        Some(store) => copy_out_parallel(target, &head, &pieces, store, sink, compression, progress, within, session)?,
        None => {
            let mut copier = target.copier()?;
            copy_out(&head, copier.as_mut(), sink, compression, progress, within, session)?;
        }
    }
    let summary = sink.complete()?;
    on_written();
    drop(at_rest);
    Ok(CheckpointSummary {
        dir: Default::default(),
        records: head.records.len(),
        regions: head.memory.len(),
        memory_bytes: summary.memory_bytes,
        stored_bytes: summary.stored_bytes,
        quiesce_ms,
        copy_ms: ms(copy_start),
        total_ms: ms(start),
        stopped: false,
    })
}

/// Every region of `head` out of the device and into `sink`: this thread copies piece k + 1
/// while a writer thread writes piece k (the zero check, compression and checksum happen
/// here, beside the writing).
fn copy_out(
    head: &Manifest,
    copier: &mut dyn DeviceCopier,
    sink: &mut dyn ImageSink,
    compression: Compression,
    progress: &Progress,
    within: &Within<'_>,
    session: u64,
) -> Result<(), CrError> {
    let (to_writer, from_copier) = mpsc::sync_channel::<(usize, HostBuffer, usize, PreparedChunk)>(BUFFERS);
    let (free_tx, free_rx) = mpsc::channel::<HostBuffer>();
    for _ in 0..BUFFERS {
        free_tx.send(copier.buffer(COPY_CHUNK)).expect("receiver alive");
    }
    std::thread::scope(|scope| {
        let writer = scope.spawn(move || -> Result<(), ImageError> {
            for (region, buf, n, prepared) in from_copier {
                sink.chunk(region, n as u64, prepared, &buf[..n])?;
                if free_tx.send(buf).is_err() {
                    break;
                }
            }
            Ok(())
        });
        let stopped = || CrError::Thread("writer");
        let copied = (|| -> Result<(), CrError> {
            for (i, r) in head.memory.iter().enumerate() {
                let mut off = 0;
                while off < r.size {
                    if (within.cancelled)() {
                        let what = format!("copying memory ({} of {} bytes)", progress.done(), progress.total());
                        return Err(CrError::Abandoned { session, what });
                    }
                    let n = (r.size - off).min(COPY_CHUNK as u64) as usize;
                    let mut buf = free_rx.recv().map_err(|_| stopped())?;
                    copier.read(r.device, r.addr + off, &mut buf[..n])?;
                    let prepared = prepare_chunk(&buf[..n], compression)?;
                    to_writer.send((i, buf, n, prepared)).map_err(|_| stopped())?;
                    progress.add(n as u64);
                    off += n as u64;
                }
            }
            Ok(())
        })();
        drop(to_writer);
        let written = writer.join().map_err(|_| CrError::Thread("writer"))?;
        // The writer's failure is the cause of a copy that found it gone.
        written?;
        copied
    })
}

/// A restore's copies on several threads, from a source's parallel reader: each worker has
/// its own copier and buffer, and reads, checks and copies in whole chunks.
fn copy_in_parallel<T: Rebuild + ?Sized>(
    target: &T,
    manifest: &Manifest,
    targets: &[(u64, i32)],
    reader: Arc<dyn ChunkReader>,
    progress: &Progress,
    cancelled: &(dyn Fn() -> bool + Sync),
    session: u64,
) -> Result<(), CrError> {
    let chunks: Vec<(usize, Chunk)> =
        manifest.memory.iter().enumerate().flat_map(|(i, r)| r.chunks.iter().map(move |c| (i, *c))).collect();
    let workers = crate::parallel::workers().min(chunks.len()).max(1);
    let largest = chunks.iter().map(|(_, c)| c.len as usize).max().unwrap_or(0).max(1);
    let mut states = Vec::with_capacity(workers);
    for _ in 0..workers {
        let copier = target.copier()?;
        let buf = copier.buffer(largest);
        states.push((copier, buf));
    }
    let next = AtomicUsize::new(0);
    let work = |(copier, buf): &mut (Box<dyn DeviceCopier + '_>, HostBuffer)| -> Result<bool, CrError> {
        let Some(&(region, c)) = chunks.get(next.fetch_add(1, Ordering::Relaxed)) else { return Ok(false) };
        if cancelled() {
            let what = format!("copying memory ({} of {} bytes)", progress.done(), progress.total());
            return Err(CrError::Abandoned { session, what });
        }
        let (addr, dev) = targets[region];
        let dst = addr + c.offset;
        if c.encoding == Encoding::Zero {
            copier.zero(dev, dst, c.len)?;
        } else {
            reader.read_into(&c, buf)?;
            copier.write(dev, dst, &buf[..c.len as usize])?;
        }
        progress.add(c.len);
        Ok(true)
    };
    on_workers(states, work, |(copier, _)| copier.finish(), || Ok(()))
}

/// The pieces of memory a parallel copy hands out: (region, offset, length).
fn pieces(memory: &[MemoryRegion]) -> Vec<(usize, u64, usize)> {
    let mut out = Vec::new();
    for (i, r) in memory.iter().enumerate() {
        let mut off = 0;
        while off < r.size {
            let n = (r.size - off).min(COPY_CHUNK as u64);
            out.push((i, off, n as usize));
            off += n;
        }
    }
    out
}

/// Runs `work` on `workers` threads, each with what `make` gives it, until `work` says there
/// is nothing left (`Ok(false)`), one fails or the operation is abandoned; the first error is
/// the answer. Meanwhile this thread runs `collect` (it ends once every worker has).
fn on_workers<W: Send>(
    states: Vec<W>,
    work: impl Fn(&mut W) -> Result<bool, CrError> + Sync,
    finish: impl Fn(&mut W) -> Result<(), CrError> + Sync,
    collect: impl FnOnce() -> Result<(), CrError>,
) -> Result<(), CrError> {
    let failed = AtomicBool::new(false);
    std::thread::scope(|scope| {
        let handles: Vec<_> = states
            .into_iter()
            .map(|mut state| {
                let (work, finish, failed) = (&work, &finish, &failed);
                scope.spawn(move || {
                    let r = (|| {
                        while !failed.load(Ordering::Relaxed) && work(&mut state)? {}
                        finish(&mut state)
                    })();
                    if r.is_err() {
                        failed.store(true, Ordering::Relaxed);
                    }
                    r
                })
            })
            .collect();
        let collected = collect();
        if collected.is_err() {
            failed.store(true, Ordering::Relaxed);
        }
        let mut result = Ok(());
        for h in handles {
            let r = h.join().unwrap_or(Err(CrError::Thread("copy")));
            if result.is_ok() {
                result = r;
            }
        }
        result.and(collected)
    })
}

/// [`copy_out`] on several threads, into a sink's parallel store: each worker has its own
/// copier (its own copy stream) and buffer, and copies, checks, compresses and stores whole
/// chunks; this thread enters them in the sink's tables.
#[allow(clippy::too_many_arguments)] // the checkpoint's own parameters, passed on
fn copy_out_parallel<T: Snapshot + ?Sized>(
    target: &T,
    head: &Manifest,
    pieces: &[(usize, u64, usize)],
    store: Arc<dyn ChunkStore>,
    sink: &mut dyn ImageSink,
    compression: Compression,
    progress: &Progress,
    within: &Within<'_>,
    session: u64,
) -> Result<(), CrError> {
    let workers = store.files();
    // Each worker has a sender: the channel closes when the last worker is done.
    let (to_sink, entered) = mpsc::channel::<(usize, Chunk)>();
    let mut states = Vec::with_capacity(workers);
    for file in 0..workers {
        let copier = target.copier()?;
        let buf = copier.buffer(COPY_CHUNK);
        states.push((file, copier, buf, to_sink.clone()));
    }
    drop(to_sink);
    let next = AtomicUsize::new(0);
    // A worker: the memory file it writes, its copier and buffer, and where it reports.
    type Worker<'c> = (usize, Box<dyn DeviceCopier + 'c>, HostBuffer, mpsc::Sender<(usize, Chunk)>);
    let work = |(file, copier, buf, to_sink): &mut Worker<'_>| -> Result<bool, CrError> {
        let Some(&(region, offset, n)) = pieces.get(next.fetch_add(1, Ordering::Relaxed)) else { return Ok(false) };
        if (within.cancelled)() {
            let what = format!("copying memory ({} of {} bytes)", progress.done(), progress.total());
            return Err(CrError::Abandoned { session, what });
        }
        let r = &head.memory[region];
        copier.read(r.device, r.addr + offset, &mut buf[..n])?;
        let f = *file;
        let chunk =
            |encoding, stored, at, crc| Chunk { offset, len: n as u64, encoding, stored, file: f as u32, at, crc };
        let entry = match prepare_chunk(&buf[..n], compression)? {
            PreparedChunk::Zero => Chunk { file: 0, ..chunk(Encoding::Zero, 0, 0, 0) },
            PreparedChunk::Raw { crc } => chunk(Encoding::Raw, n as u64, store.append(f, &buf[..n])?, crc),
            PreparedChunk::Zstd { crc, bytes } => {
                chunk(Encoding::Zstd, bytes.len() as u64, store.append(f, &bytes)?, crc)
            }
        };
        to_sink.send((region, entry)).map_err(|_| CrError::Thread("image"))?;
        progress.add(n as u64);
        Ok(true)
    };
    on_workers(
        states,
        work,
        |_| Ok(()),
        || {
            let mut result = Ok(());
            for (region, chunk) in entered {
                if result.is_ok() {
                    result = sink.stored_chunk(region, chunk).map_err(CrError::from);
                }
            }
            result
        },
    )
}

/// Recreate the objects of `manifest`'s session in `target` (a fresh session, whose server
/// has checked the manifest already): carry on its handle counters and replay its records in
/// order, stopping between records once `cancelled`. Returns the time it took, in ms.
pub fn recreate<T: Rebuild + ?Sized>(
    target: &T,
    manifest: &Manifest,
    device: Option<i32>,
    cancelled: &(dyn Fn() -> bool + Sync),
) -> Result<f64, CrError> {
    target.set_handle_counters(&manifest.handle_counters);
    let start = Instant::now();
    for r in &manifest.records {
        if cancelled() {
            let what = "replaying its records".into();
            return Err(CrError::Abandoned { session: manifest.session.id, what });
        }
        target.replay(r, device)?;
    }
    Ok(ms(start))
}

/// Rebuild a session from `source` into `target` (a fresh session, whose server has checked
/// the manifest already): carry on its handle counters, replay its records in order, then
/// copy its memory in, a reader thread reading and checking chunk k + 1 while this one
/// copies chunk k. `cancelled` stops it between steps. Any failure ends the restore: the
/// caller drops the half-built session, which is never served.
///
/// The summary's `session`, `verify_ms` and `total_ms` are the caller's to fill in.
pub fn restore<T: Rebuild>(
    target: &T,
    source: &mut dyn ImageSource,
    device: Option<i32>,
    progress: &Progress,
    cancelled: &(dyn Fn() -> bool + Sync),
) -> Result<RestoreSummary, CrError> {
    let manifest = source.manifest().clone();
    let session = manifest.session.id;
    let abandoned = |what: String| CrError::Abandoned { session, what };
    let replay_ms = recreate(target, &manifest, device, cancelled)?;

    let copy_start = Instant::now();
    let memory_bytes = manifest.memory.iter().map(|r| r.size).sum();
    progress.start(memory_bytes);
    let targets: Vec<(u64, i32)> =
        manifest.memory.iter().map(|r| target.region_target(r, device)).collect::<Result<_, _>>()?;
    if let Some(reader) = source.parallel() {
        copy_in_parallel(target, &manifest, &targets, reader, progress, cancelled, session)?;
        return Ok(RestoreSummary {
            session,
            records: manifest.records.len(),
            memory_bytes,
            verify_ms: 0.0,
            replay_ms,
            copy_ms: ms(copy_start),
            total_ms: 0.0,
            pooled: false,
            on_demand: false,
        });
    }
    let mut copier = target.copier()?;
    let (to_copier, from_reader) = mpsc::sync_channel::<(crate::ChunkHead, Option<HostBuffer>)>(BUFFERS);
    let (free_tx, free_rx) = mpsc::channel::<HostBuffer>();
    for _ in 0..BUFFERS {
        free_tx.send(copier.buffer(COPY_CHUNK)).expect("receiver alive");
    }
    std::thread::scope(|scope| {
        let reader = scope.spawn(move || -> Result<(), ImageError> {
            while let Some(c) = source.next_chunk()? {
                if c.zero {
                    if to_copier.send((c, None)).is_err() {
                        return Ok(());
                    }
                    continue;
                }
                let Ok(mut buf) = free_rx.recv() else { return Ok(()) };
                buf.reserve(c.len as usize);
                source.read_chunk(&mut buf)?;
                if to_copier.send((c, Some(buf))).is_err() {
                    return Ok(());
                }
            }
            Ok(())
        });
        let copied = (|| -> Result<(), CrError> {
            for (c, buf) in from_reader {
                if cancelled() {
                    return Err(abandoned(format!(
                        "copying memory ({} of {} bytes)",
                        progress.done(),
                        progress.total()
                    )));
                }
                let (addr, dev) = targets[c.region];
                let dst = addr + c.offset;
                match buf {
                    None => copier.zero(dev, dst, c.len)?,
                    Some(buf) => {
                        // The buffer goes back to the reader only once the copy out of it is
                        // finished.
                        let r = copier.write(dev, dst, &buf[..c.len as usize]);
                        let _ = free_tx.send(buf);
                        r?
                    }
                }
                progress.add(c.len);
            }
            copier.finish()
        })();
        // Without this the reader could wait forever for a buffer after a failed copy.
        drop(free_tx);
        let read = reader.join().map_err(|_| CrError::Thread("reader"))?;
        read?;
        copied
    })?;
    Ok(RestoreSummary {
        session,
        records: manifest.records.len(),
        memory_bytes,
        verify_ms: 0.0,
        replay_ms,
        copy_ms: ms(copy_start),
        total_ms: 0.0,
        pooled: false,
        on_demand: false,
    })
}
