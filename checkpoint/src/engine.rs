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

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use parking_lot::{Condvar, Mutex, RwLock};
use phos_protocol::CudaError;
use phos_protocol::spec::CallAccess;

use crate::piece_hash::HASH_BLOCK;
use crate::report::{CheckpointSummary, Progress, RestoreSummary, RoundFigures, Waiting};
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
    /// A kernel stored outside what its launch was speculated to write while a concurrent
    /// checkpoint copied: the copy may have missed the write (the server takes it again,
    /// stop-the-world).
    #[error(
        "session {session}: a kernel launched during the concurrent copy wrote {addr:#x}, outside what its launch was speculated to write"
    )]
    ValidationMissed { session: u64, addr: u64 },
    #[error("session {session}: the copy-on-write checkpoint stopped: {why}")]
    CopyOnWrite { session: u64, why: String },
    /// The session holds state checkpoints do not carry yet; nothing was written, and the
    /// session carries on.
    #[error(
        "session {session}: cannot be checkpointed: {what}; nothing was written, and the session carries on as it was"
    )]
    NotCheckpointable { session: u64, what: String },
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
    /// Recreate what `record` created, with the handles and addresses it names. `device`, when
    /// given, is the device the restore was asked to put the session on (another GPU); the
    /// API server's rebuilt session already maps the guest's device numbers there (its device
    /// map), so it replays each record on the device the record names.
    fn replay(&self, record: &Record, device: Option<i32>) -> Result<(), CrError>;
    /// Where `region`'s contents go: (address, device). An allocation comes back at its
    /// address; a module variable is wherever its reloaded module has it.
    fn region_target(&self, region: &MemoryRegion, device: Option<i32>) -> Result<(u64, i32), CrError>;
    /// Recreate what the image holds besides records and memory regions, once the records
    /// are replayed and before any memory is written: the API server's arrays (with their
    /// contents), texture and surface objects, conditional graph handles (their cells, which
    /// are memory regions). Nothing by default.
    fn after_records(&self, _manifest: &Manifest) -> Result<(), CrError> {
        Ok(())
    }
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
    /// Copy `buf[..len]` to `addr` on `device` behind the caller: wait for the copy queued
    /// before this way (if any) to complete, queue this one and return without waiting for
    /// it. The copier holds `buf` until its copy is complete. Returns the buffer that is free
    /// again: the earlier copy's, or `buf` itself where the copy was made at once (a copier
    /// that cannot queue: this default). So a restore's thread reads the next chunk while
    /// the device copies the last one. A copier with a copy behind waits for it before any
    /// other copy (one in flight a copier at most).
    fn write_behind(
        &mut self,
        device: i32,
        addr: u64,
        buf: HostBuffer,
        len: usize,
    ) -> Result<Option<HostBuffer>, CrError> {
        self.write(device, addr, &buf[..len])?;
        Ok(Some(buf))
    }
    /// Wait for the copy [`write_behind`](Self::write_behind) queued last, if one is in
    /// flight; its buffer, free again.
    fn wait_behind(&mut self) -> Result<Option<HostBuffer>, CrError> {
        Ok(None)
    }
    /// Whether this copier's copies run while the session runs from now on: it may then keep
    /// fewer copies in flight, leaving the device and its queues to the session's own work.
    fn beside_the_session(&mut self, _beside: bool) {}
    /// Make ready to hash `device`'s memory ([`hash_blocks`](Self::hash_blocks)), before the
    /// session is held (a GPU loads its hash kernel); whether this copier can. One that
    /// cannot has every written part copied again.
    fn prepare_hashing(&mut self, _device: i32) -> bool {
        false
    }
    /// The [`piece_hash`](crate::piece_hash::block_hash) of each of `blocks` (address,
    /// length) on `device`, as its memory is now, in order; computed where the memory is
    /// (a GPU's kernel), not by copying it out.
    fn hash_blocks(&mut self, device: i32, _blocks: &[(u64, u64)]) -> Result<Vec<u64>, CrError> {
        Err(CrError::Device { what: format!("hashing memory of device {device}"), error: CudaError::NotSupported })
    }
}

/// Page-locks host memory for fast copies (a backend that has no use for it does nothing).
pub trait Pinning: Send + Sync {
    fn pin(&self, buf: &mut [u8]);
    fn unpin(&self, buf: &mut [u8]);
    /// A page-locked buffer of at least `len` bytes kept from an earlier use, if there is one
    /// (page-locking is slow, and holds up the rest of the process on some drivers).
    fn reuse(&self, _len: usize) -> Option<Vec<u8>> {
        None
    }
    /// Keep `buf`, still page-locked, for a later [`reuse`](Pinning::reuse); `Err` hands it
    /// back to be unlocked and freed.
    fn keep(&self, buf: Vec<u8>) -> Result<(), Vec<u8>> {
        Err(buf)
    }
}

/// A host buffer for the engine's copies, page-locked for as long as it lives.
pub struct HostBuffer {
    bytes: Vec<u8>,
    pinning: Option<Arc<dyn Pinning>>,
}

impl HostBuffer {
    /// At least `len` bytes, page-locked by `pinning`: `len` zeros, or a buffer `pinning`
    /// kept, with what its earlier user left there (every user writes before it reads, and
    /// takes the length it needs).
    pub fn new(len: usize, pinning: Option<Arc<dyn Pinning>>) -> Self {
        if let Some(bytes) = pinning.as_ref().and_then(|p| p.reuse(len)) {
            return HostBuffer { bytes, pinning };
        }
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
        if let Some(p) = &self.pinning
            && let Err(mut bytes) = p.keep(std::mem::take(&mut self.bytes))
        {
            p.unpin(&mut bytes);
        }
    }
}

/// A point in a dirty log: what was written after it is what [`DirtyLog::written_since`]
/// answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Round(pub u64);

/// Which device memory has been written, for protocols that copy while the session runs.
/// Granularity is the log's (the server's is pieces of [`COPY_CHUNK`] bytes from the start
/// of each allocation).
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
    let mut head = crate::timing::timed(|| "taking the session's host state".into(), || target.head())?;
    head.created_ms = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0);
    progress.start(head.memory.iter().map(|r| r.size).sum());
    let pieces = InOrder::new(&head.memory);
    crate::timing::timed(
        || "copying device memory into the image".into(),
        || copy_image(target, &head, &pieces, sink, compression, progress, within),
    )?;
    let summary =
        crate::timing::timed(|| "completing the image (manifest, files cut and synced)".into(), || sink.complete())?;
    crate::timing::timed(|| "what follows the written image".into(), on_written);
    crate::timing::timed(|| "letting the session go".into(), || drop(at_rest));
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
        mode: "stop-the-world".into(),
        stall_ms: ms(start),
        ..Default::default()
    })
}

/// Begin `sink`'s image with `head` and copy every piece `pieces` hands out into it, on
/// several threads where the sink has parallel storage, else in order on this one.
fn copy_image<T: Snapshot + ?Sized>(
    target: &T,
    head: &Manifest,
    pieces: &dyn PieceSource,
    sink: &mut dyn ImageSink,
    compression: Compression,
    progress: &Progress,
    within: &Within<'_>,
) -> Result<(), CrError> {
    let session = head.session.id;
    sink.begin(head)?;
    let workers = crate::parallel::workers().min(pieces.count()).max(1);
    match sink.parallel(workers)? {
        Some(store) => copy_out_parallel(target, pieces, store, sink, compression, progress, within, session),
        None => {
            let mut copier = target.copier()?;
            copy_out(pieces, copier.as_mut(), sink, compression, progress, within, session)
        }
    }
}

/// One piece of a region to copy out: where it goes in the image and where its bytes are
/// now (the region itself, or a copy taken ahead of a write).
#[derive(Debug, Clone, Copy)]
struct Piece {
    /// Its place among the pieces handed out.
    index: usize,
    region: usize,
    offset: u64,
    len: usize,
    device: i32,
    from: u64,
}

/// Hands out the pieces of a checkpoint's copy, to one thread or several.
trait PieceSource: Sync {
    /// How many pieces there are in all.
    fn count(&self) -> usize;
    /// The next piece to copy; `None` once all are handed out. Region by region, each from
    /// its start, for a sink that takes chunks in order.
    fn next(&self, ordered: bool) -> Option<Piece>;
    /// `piece` has been read from the device.
    fn done(&self, piece: &Piece);
    /// Whether the session runs while these pieces are copied: the copy threads then give
    /// way to its threads for the CPU (application first).
    fn beside_the_session(&self) -> bool {
        false
    }
}

/// Lower the calling thread's CPU priority (nice 10): a copy that runs beside the session
/// still takes every idle core, but the session's own threads (the guest's launches, the
/// server's call loop) run first where they compete for one. Measured on the H100's host,
/// sixteen copy threads at full priority took the cores the session's launches needed.
fn give_way_to_the_session() {
    thread_local! {
        static LOWERED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }
    if LOWERED.replace(true) {
        return;
    }
    // SAFETY: gettid has no preconditions and touches no memory.
    let me = unsafe { libc::gettid() };
    // SAFETY: setpriority with PRIO_PROCESS and a thread id changes that thread's nice value
    // only, and reads nothing through pointers.
    let r = unsafe { libc::setpriority(libc::PRIO_PROCESS, me as libc::id_t, 10) };
    if r != 0 {
        tracing::debug!("lowering a copy thread's priority: {}", std::io::Error::last_os_error());
    }
}

/// Every region's pieces in image order: the stop-the-world copy, where nothing changes.
struct InOrder {
    pieces: Vec<Piece>,
    next: AtomicUsize,
}

impl InOrder {
    fn new(memory: &[MemoryRegion]) -> Self {
        let pieces = pieces(memory)
            .into_iter()
            .enumerate()
            .map(|(index, (region, offset, len))| {
                let r = &memory[region];
                Piece { index, region, offset, len, device: r.device, from: r.addr + offset }
            })
            .collect();
        InOrder { pieces, next: AtomicUsize::new(0) }
    }
}

impl PieceSource for InOrder {
    fn count(&self) -> usize {
        self.pieces.len()
    }

    fn next(&self, _ordered: bool) -> Option<Piece> {
        self.pieces.get(self.next.fetch_add(1, Ordering::Relaxed)).copied()
    }

    fn done(&self, _: &Piece) {}
}

/// Every region of `head` out of the device and into `sink`: this thread copies piece k + 1
/// while a writer thread writes piece k (the zero check, compression and checksum happen
/// here, beside the writing).
fn copy_out(
    pieces: &dyn PieceSource,
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
            while let Some(p) = pieces.next(true) {
                if (within.cancelled)() {
                    let what = format!("copying memory ({} of {} bytes)", progress.done(), progress.total());
                    return Err(CrError::Abandoned { session, what });
                }
                let n = p.len;
                let mut buf = free_rx.recv().map_err(|_| stopped())?;
                let read = copier.read(p.device, p.from, &mut buf[..n]);
                pieces.done(&p);
                read?;
                let prepared = prepare_chunk(&buf[..n], compression)?;
                to_writer.send((p.region, buf, n, prepared)).map_err(|_| stopped())?;
                progress.add(n as u64);
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

/// What a restore's or a load's thread works with: its copier and two buffers, one being read
/// into while the device copies out of the other.
pub(crate) type Worker<'c> = (Box<dyn DeviceCopier + 'c>, Vec<HostBuffer>);

/// `workers` threads' copiers and buffers of `largest` bytes (timed as the `what` threads').
pub(crate) fn load_workers<'t, T: Rebuild + ?Sized>(
    target: &'t T,
    workers: usize,
    largest: usize,
    what: &str,
) -> Result<Vec<Worker<'t>>, CrError> {
    crate::timing::timed(
        || format!("making {workers} {what} threads' copiers and {} buffers of {largest} bytes", 2 * workers),
        || {
            (0..workers)
                .map(|_| {
                    let copier = target.copier()?;
                    let bufs = vec![copier.buffer(largest), copier.buffer(largest)];
                    Ok((copier, bufs))
                })
                .collect()
        },
    )
}

/// A restore's copies on several threads, from a source's parallel reader: each worker has
/// its own copier and two buffers, and reads and checks chunk k + 1 into one while the device
/// copies chunk k out of the other ([`DeviceCopier::write_behind`]): the host's reading and
/// the device's copies overlap on every thread, not only across threads.
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
    let stages = LoadStages::default();
    let started = Instant::now();
    let states = load_workers(target, workers, largest, "copy")?;
    let next = AtomicUsize::new(0);
    let work = |(copier, free): &mut Worker<'_>| -> Result<bool, CrError> {
        let Some(&(region, c)) = chunks.get(next.fetch_add(1, Ordering::Relaxed)) else { return Ok(false) };
        if cancelled() {
            let what = format!("copying memory ({} of {} bytes)", progress.done(), progress.total());
            return Err(CrError::Abandoned { session, what });
        }
        let (addr, dev) = targets[region];
        let dst = addr + c.offset;
        if c.encoding == Encoding::Zero {
            let t = Instant::now();
            free.extend(copier.wait_behind()?);
            stages.waited(t);
            let t = Instant::now();
            copier.zero(dev, dst, c.len)?;
            stages.zeroed(t);
        } else {
            let mut buf = match free.pop() {
                Some(b) => b,
                None => {
                    let t = Instant::now();
                    let b = copier.wait_behind()?;
                    stages.waited(t);
                    b.unwrap_or_else(|| copier.buffer(largest))
                }
            };
            let t = Instant::now();
            reader.read_into(&c, &mut buf)?;
            stages.read(t, started);
            let t = Instant::now();
            free.extend(copier.write_behind(dev, dst, buf, c.len as usize)?);
            stages.queued(t);
        }
        progress.add(c.len);
        Ok(true)
    };
    let finish = |(copier, _): &mut Worker<'_>| {
        let t = Instant::now();
        let r = copier.finish();
        stages.waited(t);
        r
    };
    let copied = on_workers(states, work, finish, || Ok(()));
    stages.report(workers, started);
    copied
}

/// Where the threads of a restore's copy (or an on-demand restore's load) spent their time,
/// summed over the threads, for the operator's step timing
/// (`PHOS_LOG=...,phos::cr_timing=debug`): reading chunks from the image and checking their
/// checksums, queueing their device copies, waiting for copies to complete (for a buffer to
/// be free again, or at the end), zeroing all-zero chunks; and when the first chunk was read
/// (the serial setup before the first copy).
#[derive(Default)]
pub(crate) struct LoadStages {
    read_ns: AtomicU64,
    /// Of `read_ns`, the file's reads and the checksums (a directory image's reader says).
    file_ns: AtomicU64,
    check_ns: AtomicU64,
    queue_ns: AtomicU64,
    wait_ns: AtomicU64,
    zero_ns: AtomicU64,
    /// The slowest chunk's read and the longest wait for a device copy.
    most_read_ns: AtomicU64,
    most_wait_ns: AtomicU64,
    chunks: AtomicU64,
    /// Nanoseconds from the start to the end of the first chunk's read, plus one (0: none).
    first_ns: AtomicU64,
}

impl LoadStages {
    fn add(a: &AtomicU64, since: Instant) -> u64 {
        let ns = since.elapsed().as_nanos() as u64;
        a.fetch_add(ns, Ordering::Relaxed);
        ns
    }

    pub(crate) fn read(&self, since: Instant, started: Instant) {
        let ns = Self::add(&self.read_ns, since);
        self.most_read_ns.fetch_max(ns, Ordering::Relaxed);
        let (file, check) = crate::parallel::ReadSplit::take();
        self.file_ns.fetch_add(file, Ordering::Relaxed);
        self.check_ns.fetch_add(check, Ordering::Relaxed);
        self.chunks.fetch_add(1, Ordering::Relaxed);
        let at = started.elapsed().as_nanos() as u64 + 1;
        let _ = self.first_ns.compare_exchange(0, at, Ordering::Relaxed, Ordering::Relaxed);
    }

    pub(crate) fn queued(&self, since: Instant) {
        Self::add(&self.queue_ns, since);
    }

    pub(crate) fn waited(&self, since: Instant) {
        let ns = Self::add(&self.wait_ns, since);
        self.most_wait_ns.fetch_max(ns, Ordering::Relaxed);
    }

    pub(crate) fn zeroed(&self, since: Instant) {
        Self::add(&self.zero_ns, since);
    }

    pub(crate) fn report(&self, threads: usize, started: Instant) {
        let ms = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64 / 1e6;
        crate::timing::note(|| {
            let first = self.first_ns.load(Ordering::Relaxed);
            format!(
                "restore copy: {threads} threads, {} chunks read in {:.1} ms wall (first read done at {}): \
                 reading and checking {:.1} ms (file reads {:.1}, checksums {:.1}; slowest chunk {:.1}), \
                 queueing device copies {:.1} ms, waiting for them {:.1} ms (longest {:.1}), zeroing {:.1} ms \
                 (thread time)",
                self.chunks.load(Ordering::Relaxed),
                started.elapsed().as_secs_f64() * 1e3,
                if first == 0 { "none".to_string() } else { format!("{:.1} ms", (first - 1) as f64 / 1e6) },
                ms(&self.read_ns),
                ms(&self.file_ns),
                ms(&self.check_ns),
                ms(&self.most_read_ns),
                ms(&self.queue_ns),
                ms(&self.wait_ns),
                ms(&self.most_wait_ns),
                ms(&self.zero_ns),
            )
        });
    }
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
    pieces: &dyn PieceSource,
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
    let stages = StageTimes::default();
    // A worker: the memory file it writes, its copier and buffer, and where it reports.
    type Worker<'c> = (usize, Box<dyn DeviceCopier + 'c>, HostBuffer, mpsc::Sender<(usize, Chunk)>);
    let background = pieces.beside_the_session();
    let work = |(file, copier, buf, to_sink): &mut Worker<'_>| -> Result<bool, CrError> {
        if background {
            // Once per worker (a scoped thread of this copy only, ended with it).
            give_way_to_the_session();
            copier.beside_the_session(true);
        }
        if (within.cancelled)() {
            let what = format!("copying memory ({} of {} bytes)", progress.done(), progress.total());
            return Err(CrError::Abandoned { session, what });
        }
        let Some(piece) = pieces.next(false) else { return Ok(false) };
        let (region, offset, n) = (piece.region, piece.offset, piece.len);
        let started = Instant::now();
        let read = copier.read(piece.device, piece.from, &mut buf[..n]);
        pieces.done(&piece);
        read?;
        let copied = Instant::now();
        let f = *file;
        let chunk =
            |encoding, stored, at, crc| Chunk { offset, len: n as u64, encoding, stored, file: f as u32, at, crc };
        let data = &buf[..n];
        let entry = match compression {
            // Checked and stored in one pass over the buffer (see `store_raw`).
            Compression::None if crate::is_zero(data) => Chunk { file: 0, ..chunk(Encoding::Zero, 0, 0, 0) },
            Compression::None => {
                let (at, crc) = crate::parallel::store_raw(store.as_ref(), f, data)?;
                chunk(Encoding::Raw, n as u64, at, crc)
            }
            Compression::Zstd(_) => match prepare_chunk(data, compression)? {
                PreparedChunk::Zero => Chunk { file: 0, ..chunk(Encoding::Zero, 0, 0, 0) },
                PreparedChunk::Raw { crc } => chunk(Encoding::Raw, n as u64, store.append(f, data)?, crc),
                PreparedChunk::Zstd { crc, bytes } => {
                    chunk(Encoding::Zstd, bytes.len() as u64, store.append(f, &bytes)?, crc)
                }
            },
        };
        stages.add(copied - started, copied.elapsed());
        to_sink.send((region, entry)).map_err(|_| CrError::Thread("image"))?;
        progress.add(n as u64);
        Ok(true)
    };
    let copied = on_workers(
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
    );
    stages.report(workers);
    copied
}

/// Where the copy threads of one checkpoint spent their time, summed over the threads: a
/// piece's device copy (waiting for a copy lane included), and checking and storing it. For
/// the operator's step timing (`PHOS_LOG=...,phos::cr_timing=debug`).
#[derive(Default)]
struct StageTimes {
    copy_ns: AtomicU64,
    store_ns: AtomicU64,
    pieces: AtomicU64,
}

impl StageTimes {
    fn add(&self, copy: Duration, store: Duration) {
        self.copy_ns.fetch_add(copy.as_nanos() as u64, Ordering::Relaxed);
        self.store_ns.fetch_add(store.as_nanos() as u64, Ordering::Relaxed);
        self.pieces.fetch_add(1, Ordering::Relaxed);
    }

    fn report(&self, threads: usize) {
        let ms = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64 / 1e6;
        tracing::debug!(
            target: "phos::cr_timing",
            "{threads} copy threads, {} pieces: device copies {:.1} ms, checks and image writes {:.1} ms (thread time)",
            self.pieces.load(Ordering::Relaxed),
            ms(&self.copy_ns),
            ms(&self.store_ns),
        );
    }
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
    target.after_records(manifest)?;
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
    let manifest = crate::timing::timed(|| "taking the image's manifest".into(), || source.manifest().clone());
    let session = manifest.session.id;
    let abandoned = |what: String| CrError::Abandoned { session, what };
    let replay_ms = crate::timing::timed(
        || format!("recreating the session's objects ({} records replayed)", manifest.records.len()),
        || recreate(target, &manifest, device, cancelled),
    )?;

    let copy_start = Instant::now();
    let memory_bytes = manifest.memory.iter().map(|r| r.size).sum();
    progress.start(memory_bytes);
    let targets: Vec<(u64, i32)> = crate::timing::timed(
        || format!("finding where the {} memory regions go", manifest.memory.len()),
        || manifest.memory.iter().map(|r| target.region_target(r, device)).collect::<Result<_, _>>(),
    )?;
    let reader = crate::timing::timed(|| "opening the image's memory files for reading".into(), || source.parallel());
    if let Some(reader) = reader {
        crate::timing::timed(
            || format!("copying {memory_bytes} bytes of memory in"),
            || copy_in_parallel(target, &manifest, &targets, reader, progress, cancelled, session),
        )?;
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
    let in_order = Instant::now();
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
    crate::timing::slow(in_order, || format!("copying {memory_bytes} bytes of memory in, in order (a stream)"));
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

/// What a server gives a concurrent checkpoint besides [`Intercept`]: device memory to copy
/// regions into ahead of a write, and validation of what kernel launches were speculated to
/// write.
pub trait Concurrent: Intercept {
    /// Device memory for copies taken ahead of writes, `reserve` bytes on each device of the
    /// session (less where a device has less free; none is an answer too: writers then wait
    /// for the copy); `None`: as much as the server sees fit on each device. Validation
    /// starts at [`Window::arm`].
    fn open_window(&self, reserve: Option<u64>) -> Result<Arc<dyn Window>, CrError>;
}

/// A concurrent checkpoint's window on its session: the copy-on-write reserve, and the
/// validation of launches.
pub trait Window: Send + Sync {
    /// From now on every kernel launch runs its checked twin, which flags a store outside
    /// the ranges the launch was speculated to write (a launch whose speculation is "all of
    /// memory" needs none). Called with the session at rest, so no launch goes unchecked.
    fn arm(&self);
    /// Copy as many of `pieces` (address, length) of `device`, in order, as the reserve has
    /// room for into it, on the device, and return once the copies are done: where each
    /// piece copied is (the first pieces; none where the reserve is full).
    fn save(&self, device: i32, pieces: &[(u64, u64)]) -> Result<Vec<u64>, CrError>;
    /// The copy at `copy` is no longer needed.
    fn release(&self, device: i32, copy: u64, len: u64);
    /// Stop checking new launches, wait (until `within`'s deadline) for the checked ones to
    /// finish, and say whether any of them stored outside its speculated ranges: the first
    /// address one missed with.
    fn finish(&self, within: &Within<'_>) -> Result<Option<u64>, CrError>;
}

/// A window that a protocol armed: finished on every way out, so that launches stop running
/// checked twins (its flags are then not read).
struct Armed<'a> {
    window: &'a dyn Window,
    finished: bool,
}

impl<'a> Armed<'a> {
    fn arm(window: &'a dyn Window) -> Self {
        window.arm();
        Armed { window, finished: false }
    }

    fn finish(mut self, within: &Within<'_>) -> Result<Option<u64>, CrError> {
        self.finished = true;
        self.window.finish(within)
    }
}

impl Drop for Armed<'_> {
    fn drop(&mut self) {
        if !self.finished {
            let _ = self.window.finish(&Within::after(std::time::Duration::from_secs(60)));
        }
    }
}

/// Where a chunk of the image stands in a copy-on-write checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Taken {
    /// Its contents at the quiesce are still in place only; not handed to the copy yet.
    Pending,
    /// A write is coming: its contents at the quiesce were copied aside to this address
    /// first; not handed to the copy yet.
    Saved(u64),
    /// Being read from its place: a write waits until it is in the image.
    Reading,
    /// Being read from its copy aside.
    ReadingSaved(u64),
    /// In the image.
    Done,
}

impl Taken {
    /// Not handed to the copy yet.
    fn unhanded(self) -> bool {
        matches!(self, Taken::Pending | Taken::Saved(_))
    }
}

/// One chunk of the image's memory: the piece of `region` at `offset`, `len` bytes at `addr`
/// on `device`. Chunks are the copy's pieces ([`COPY_CHUNK`]) and the unit copied aside.
#[derive(Debug, Clone, Copy)]
struct FollowedChunk {
    region: usize,
    offset: u64,
    len: u64,
    device: i32,
    addr: u64,
}

/// A region of the image: `[start, end)`, its chunks `first..first + count`, and the module
/// whose variable it is.
#[derive(Debug, Clone, Copy)]
struct FollowedRegion {
    start: u64,
    end: u64,
    first: usize,
    count: usize,
    module: Option<u64>,
}

/// The image's memory as a copy-on-write checkpoint follows it.
struct Layout {
    chunks: Vec<FollowedChunk>,
    /// In image order.
    regions: Vec<FollowedRegion>,
    /// Region indices by start address (regions do not overlap).
    by_addr: Vec<usize>,
}

/// Chunks `lo..hi` of region `region`, which a call writes.
type Span = (usize, usize, usize);

impl Layout {
    fn new(memory: &[MemoryRegion]) -> Self {
        // The copy's pieces, region by region.
        let chunks: Vec<FollowedChunk> = pieces(memory)
            .into_iter()
            .map(|(region, offset, len)| {
                let r = &memory[region];
                FollowedChunk { region, offset, len: len as u64, device: r.device, addr: r.addr + offset }
            })
            .collect();
        let mut first = 0;
        let regions: Vec<FollowedRegion> = memory
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let count = chunks[first..].iter().take_while(|c| c.region == i).count();
                let module = match &r.kind {
                    crate::RegionKind::ModuleVariable { module, .. } => Some(*module),
                    crate::RegionKind::Allocation => None,
                };
                let followed =
                    FollowedRegion { start: r.addr, end: r.addr.saturating_add(r.size), first, count, module };
                first += count;
                followed
            })
            .collect();
        let mut by_addr: Vec<usize> = (0..regions.len()).collect();
        by_addr.sort_unstable_by_key(|&i| regions[i].start);
        Layout { chunks, regions, by_addr }
    }

    /// The chunks a call with `access` writes: those its announced write ranges overlap
    /// (the spec's ranges are exact; a launch's are the allocations it may write), and all
    /// of a region it frees or whose module it unloads.
    fn written(&self, access: &CallAccess<'_>) -> Vec<Span> {
        let mut out = Vec::new();
        for d in access.device.iter().filter(|d| d.writes) {
            let end = d.addr.saturating_add(d.len.max(1));
            // The regions starting before `end`, back to the first that ends at or before
            // `addr`.
            let upto = self.by_addr.partition_point(|&i| self.regions[i].start < end);
            for &i in self.by_addr[..upto].iter().rev() {
                let r = &self.regions[i];
                if r.end <= d.addr {
                    break;
                }
                if r.count == 0 {
                    continue;
                }
                let chunk = COPY_CHUNK as u64;
                let lo = (d.addr.max(r.start) - r.start) / chunk;
                let hi = (end.min(r.end) - 1 - r.start) / chunk + 1;
                out.push((i, lo as usize, hi as usize));
            }
        }
        use phos_protocol::spec::ObjectEffect;
        for o in access.objects.iter().filter(|o| o.effect == ObjectEffect::Destroys) {
            let whole = |i: usize| (i, 0, self.regions[i].count);
            match o.kind {
                "device_memory" => out.extend(
                    (0..self.regions.len())
                        .filter(|&i| self.regions[i].start == o.value && self.regions[i].count > 0)
                        .map(whole),
                ),
                "module" => out.extend(
                    (0..self.regions.len())
                        .filter(|&i| self.regions[i].module == Some(o.value) && self.regions[i].count > 0)
                        .map(whole),
                ),
                _ => {}
            }
        }
        out
    }
}

#[derive(Default)]
struct CowState {
    /// By chunk.
    taken: Vec<Taken>,
    /// Chunks of each region not safe from writes yet (pending or being read in place): a
    /// write to a region with none goes straight on.
    open: Vec<usize>,
    /// Chunks that calls wait for (the reserve had no room for them): copied first.
    wanted: VecDeque<usize>,
    /// By chunk: put in `wanted` already.
    asked: Vec<bool>,
    /// The next chunk of the copy in image order.
    cursor: usize,
    /// The checkpoint gave up (its copy failed, a copy aside failed): calls go on unheld.
    given_up: Option<String>,
}

/// What the copy-on-write hook cost the session's calls.
#[derive(Default)]
struct CowFigures {
    /// Bytes copied aside ahead of writes.
    saved: std::sync::atomic::AtomicU64,
    /// Calls that waited (for a copy aside, or for the copy), the time they waited in all,
    /// and the longest one call waited for the copy (ns).
    waited_calls: std::sync::atomic::AtomicU64,
    waited_ns: std::sync::atomic::AtomicU64,
    held_ns: std::sync::atomic::AtomicU64,
}

/// Copy-on-write over a running session: installed as its hook, it sees every call before
/// it runs; a call that will write chunks of the image not yet copied waits until their
/// contents are safe: copied on the device into the reserve, or (the reserve full) copied
/// into the image. It also hands out the copy's pieces, reading a saved chunk from its copy
/// and the chunks calls wait for first.
struct CopyOnWrite {
    window: Arc<dyn Window>,
    /// The image's memory (unset until the session is at rest and the checkpoint arms it).
    layout: std::sync::OnceLock<Layout>,
    state: Mutex<CowState>,
    changed: Condvar,
    figures: CowFigures,
}

impl CopyOnWrite {
    fn new(window: Arc<dyn Window>) -> Self {
        CopyOnWrite {
            window,
            layout: Default::default(),
            state: Mutex::new(CowState::default()),
            changed: Condvar::new(),
            figures: CowFigures::default(),
        }
    }

    /// Follow `memory` (the image's regions, taken with the session at rest).
    fn arm(&self, memory: &[MemoryRegion]) {
        let layout = Layout::new(memory);
        let mut st = self.state.lock();
        st.taken = vec![Taken::Pending; layout.chunks.len()];
        st.asked = vec![false; layout.chunks.len()];
        st.open = layout.regions.iter().map(|r| r.count).collect();
        let _ = self.layout.set(layout);
    }

    /// The copy failed: let every call go.
    fn give_up(&self, why: String) {
        let mut st = self.state.lock();
        st.given_up.get_or_insert(why);
        self.changed.notify_all();
    }

    /// Copy aside, on their devices, as many of `chunks` (pending ones) as the reserve has
    /// room for.
    fn save(&self, st: &mut CowState, layout: &Layout, chunks: &[usize]) -> Result<(), CrError> {
        let mut devices: Vec<i32> = chunks.iter().map(|&c| layout.chunks[c].device).collect();
        devices.sort_unstable();
        devices.dedup();
        for device in devices {
            let on: Vec<usize> = chunks.iter().copied().filter(|&c| layout.chunks[c].device == device).collect();
            let pieces: Vec<(u64, u64)> = on.iter().map(|&c| (layout.chunks[c].addr, layout.chunks[c].len)).collect();
            let copies = self.window.save(device, &pieces)?;
            for (&c, copy) in on.iter().zip(copies) {
                st.taken[c] = Taken::Saved(copy);
                st.open[layout.chunks[c].region] -= 1;
                self.figures.saved.fetch_add(layout.chunks[c].len, Ordering::Relaxed);
            }
        }
        Ok(())
    }
}

impl CallHook for CopyOnWrite {
    fn before_call(&self, access: &CallAccess<'_>) -> Result<(), CudaError> {
        let Some(layout) = self.layout.get() else { return Ok(()) };
        let spans = layout.written(access);
        if spans.is_empty() {
            return Ok(());
        }
        let start = Instant::now();
        let (mut acted, mut held) = (false, Duration::ZERO);
        let mut st = self.state.lock();
        loop {
            if st.given_up.is_some() {
                break;
            }
            // The chunks written that are not safe yet (once each: a call's ranges may overlap).
            let mut unsafe_chunks: Vec<usize> = spans
                .iter()
                .filter(|&&(region, _, _)| st.open[region] > 0)
                .flat_map(|&(region, lo, hi)| {
                    let first = layout.regions[region].first;
                    (first + lo..first + hi).filter(|&c| matches!(st.taken[c], Taken::Pending | Taken::Reading))
                })
                .collect();
            unsafe_chunks.sort_unstable();
            unsafe_chunks.dedup();
            if unsafe_chunks.is_empty() {
                break;
            }
            acted = true;
            // The pending ones are copied aside, as many as the reserve has room for.
            let pending: Vec<usize> =
                unsafe_chunks.iter().copied().filter(|&c| st.taken[c] == Taken::Pending).collect();
            if !pending.is_empty() {
                if let Err(e) = self.save(&mut st, layout, &pending) {
                    // The checkpoint fails with this (the server then takes it
                    // stop-the-world); the call goes on.
                    st.given_up.get_or_insert(format!("copying memory aside ahead of {}: {e}", access.function));
                    self.changed.notify_all();
                    break;
                }
                // What the reserve had no room for: the copy takes it first.
                for &c in &pending {
                    if st.taken[c] == Taken::Pending && !std::mem::replace(&mut st.asked[c], true) {
                        st.wanted.push_back(c);
                    }
                }
            }
            // The call waits for the chunks still pending, and for those on their way out of
            // their place.
            if unsafe_chunks.iter().all(|&c| !matches!(st.taken[c], Taken::Pending | Taken::Reading)) {
                break;
            }
            let waiting = Instant::now();
            self.changed.wait(&mut st);
            held += waiting.elapsed();
        }
        drop(st);
        if acted {
            let f = &self.figures;
            f.waited_calls.fetch_add(1, Ordering::Relaxed);
            f.waited_ns.fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
            f.held_ns.fetch_max(held.as_nanos() as u64, Ordering::Relaxed);
        }
        Ok(())
    }
}

impl PieceSource for CopyOnWrite {
    fn beside_the_session(&self) -> bool {
        true
    }

    fn count(&self) -> usize {
        self.layout.get().map_or(0, |l| l.chunks.len())
    }

    fn next(&self, ordered: bool) -> Option<Piece> {
        let layout = self.layout.get()?;
        let mut st = self.state.lock();
        if st.given_up.is_some() {
            return None;
        }
        let mut pick = None;
        // Chunks in any order (a sink with parallel storage): those writers wait for first.
        if !ordered {
            while let Some(c) = st.wanted.pop_front() {
                if st.taken[c].unhanded() {
                    pick = Some(c);
                    break;
                }
            }
        }
        if pick.is_none() {
            while st.cursor < st.taken.len() && !st.taken[st.cursor].unhanded() {
                st.cursor += 1;
            }
            pick = (st.cursor < st.taken.len()).then_some(st.cursor);
        }
        let c = pick?;
        let chunk = layout.chunks[c];
        let from = match st.taken[c] {
            Taken::Saved(copy) => {
                st.taken[c] = Taken::ReadingSaved(copy);
                copy
            }
            _ => {
                st.taken[c] = Taken::Reading;
                chunk.addr
            }
        };
        Some(Piece {
            index: c,
            region: chunk.region,
            offset: chunk.offset,
            len: chunk.len as usize,
            device: chunk.device,
            from,
        })
    }

    fn done(&self, piece: &Piece) {
        let Some(layout) = self.layout.get() else { return };
        let mut st = self.state.lock();
        let c = piece.index;
        match st.taken[c] {
            Taken::ReadingSaved(copy) => self.window.release(piece.device, copy, layout.chunks[c].len),
            Taken::Reading => st.open[layout.chunks[c].region] -= 1,
            _ => {}
        }
        st.taken[c] = Taken::Done;
        self.changed.notify_all();
    }
}

/// Checkpoint `target` into `sink` while it runs, copy-on-write: the image is what a
/// stop-the-world checkpoint would have taken at the quiesce.
///
/// The session is held only to take its host state (the quiesce, and the manifest's head)
/// and to arm the hook and validation; then its calls run while the memory is copied out.
/// Before a call writes (or frees) chunks of a region not yet copied, those chunks are
/// copied on the device into the reserve (`reserve` bytes a device; `None`: as the server
/// sizes it) and the image takes that copy; with the reserve full the call waits until the
/// copy, which takes such chunks first, has them. Kernel launches, whose writes are
/// speculated, run checked twins meanwhile: a store outside the speculation ends the
/// checkpoint with [`CrError::ValidationMissed`] (the caller takes it again
/// stop-the-world), since the copy may have taken memory the kernel had changed.
///
/// `within`'s deadline bounds the waits for the session (the quiesce's, and the checked
/// kernels' at the end); the window's setup before them does not count against it, and a
/// checkpoint that gives up says how long it waited in all. `at_cut` runs at the cut, the
/// session still at rest.
pub fn checkpoint_cow<T: Quiesce + Snapshot + Concurrent>(
    target: &T,
    sink: &mut dyn ImageSink,
    compression: Compression,
    progress: &Progress,
    within: &Within<'_>,
    reserve: Option<u64>,
    at_cut: &dyn Fn(),
) -> Result<CheckpointSummary, CrError> {
    let start = Instant::now();
    // The reserve is made before the session is held, so that its cost is not a stall.
    let window = target.open_window(reserve)?;
    let cow = Arc::new(CopyOnWrite::new(window.clone()));
    // Waiting for the session starts now, and may take as long as it was given.
    let waiting = Instant::now();
    let within = Within { deadline: within.deadline + (waiting - start), ..*within };
    let waited = |e: CrError| match e {
        CrError::TimedOut { session, waiting_for, .. } => {
            CrError::TimedOut { session, waited: waiting.elapsed(), waiting_for }
        }
        e => e,
    };
    // Installing the hook holds the calls too, until those in flight end.
    let installed = target.install_hook(cow.clone(), &within).map_err(waited)?;
    let install_ms = ms(waiting);
    let quiesce_start = Instant::now();
    let at_rest = target.quiesce(&within).map_err(waited)?;
    let quiesce_ms = ms(quiesce_start);
    let mut head = target.head()?;
    head.created_ms = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0);
    let session = head.session.id;
    cow.arm(&head.memory);
    let armed = Armed::arm(window.as_ref());
    // While the session is still at rest: what the caller holds from the cut on (a
    // session whose process is checkpointed too stays frozen there).
    at_cut();
    drop(at_rest);
    let stall_ms = install_ms + ms(quiesce_start);

    let copy_start = Instant::now();
    progress.start(head.memory.iter().map(|r| r.size).sum());
    let copied = copy_image(target, &head, cow.as_ref(), sink, compression, progress, &within);
    if let Err(e) = &copied {
        cow.give_up(e.to_string());
    }
    // Every chunk is in the image: calls need not wait any more, nor launches be checked;
    // those checked already must finish before their flags say anything: as long again as
    // the quiesce could take, from now.
    let settle = Within {
        deadline: Instant::now() + within.deadline.saturating_duration_since(waiting),
        cancelled: within.cancelled,
    };
    let missed = armed.finish(&settle);
    drop(installed);
    copied?;
    if let Some(why) = cow.state.lock().given_up.take() {
        return Err(CrError::CopyOnWrite { session, why });
    }
    if let Some(addr) = missed? {
        return Err(CrError::ValidationMissed { session, addr });
    }
    let summary = sink.complete()?;
    let f = &cow.figures;
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
        mode: "copy-on-write".into(),
        stall_ms,
        held_ms: f.held_ns.load(Ordering::Relaxed) as f64 / 1e6,
        extra_bytes: f.saved.load(Ordering::Relaxed),
        waited_calls: f.waited_calls.load(Ordering::Relaxed),
        waited_ms: f.waited_ns.load(Ordering::Relaxed) as f64 / 1e6,
        rounds: 0,
        fallback: None,
        ..Default::default()
    })
}

/// Recopy rounds at most before the last, stopped one.
const MAX_RECOPY_ROUNDS: u32 = 8;

/// Where a recopy's copies go, region by region, as the rounds take them: host memory until
/// the image is written (a checkpoint), or a stream to the server a session migrates to.
pub trait RecopySink: Send {
    /// A piece of `region` as it is now, `offset` bytes into it. A region is sent whole the
    /// first time (every piece, from its start), and again whole if its size changed; after
    /// that a piece replaces those bytes of what was sent (a part written since).
    fn piece(&mut self, region: &MemoryRegion, offset: u64, bytes: &[u8]) -> Result<(), CrError>;
    /// The session's manifest, taken with the session at rest (which it still is): every
    /// region it lists was sent whole since it was last written. Makes the image whole (a
    /// migration: the target has restored it), or fails and leaves the session as it was.
    fn end(&mut self, head: &Manifest) -> Result<crate::ImageSummary, CrError>;
}

/// A [`RecopySink`] that keeps the copies in host memory and writes them into an image
/// sink once the session's head is known: a recopy checkpoint.
struct HeldCopies<'a> {
    /// Host copies of the regions, by address: (size, contents).
    copies: HashMap<u64, (u64, Vec<u8>)>,
    sink: &'a mut dyn ImageSink,
    compression: Compression,
}

impl RecopySink for HeldCopies<'_> {
    fn piece(&mut self, region: &MemoryRegion, offset: u64, bytes: &[u8]) -> Result<(), CrError> {
        let whole = |size: u64, bytes: &Vec<u8>| bytes.len() as u64 == size;
        match self.copies.get_mut(&region.addr) {
            // Received whole at this size: a part written since.
            Some((size, held)) if *size == region.size && whole(*size, held) => {
                let at = offset as usize;
                held[at..at + bytes.len()].copy_from_slice(bytes);
            }
            // Being received whole: the next piece.
            Some((size, held)) if *size == region.size && offset == held.len() as u64 => held.extend_from_slice(bytes),
            // New, or at another size: sent whole from its start.
            _ => {
                let mut held = Vec::with_capacity(region.size as usize);
                held.extend_from_slice(bytes);
                self.copies.insert(region.addr, (region.size, held));
            }
        }
        Ok(())
    }

    fn end(&mut self, head: &Manifest) -> Result<crate::ImageSummary, CrError> {
        self.sink.begin(head)?;
        for (i, r) in head.memory.iter().enumerate() {
            let bytes = &self.copies.get(&r.addr).expect("every region copied").1;
            for piece in bytes.chunks(COPY_CHUNK) {
                let prepared = prepare_chunk(piece, self.compression)?;
                self.sink.chunk(i, piece.len() as u64, prepared, piece)?;
            }
        }
        Ok(self.sink.complete()?)
    }
}

/// The copiers of a recopy, each with its own copy stream and two page-locked buffers: made
/// once, before the first pass, so that no pass (the last, held one least of all) pays for
/// streams or for locking host pages.
type CopierPool<'c> = Vec<(Box<dyn DeviceCopier + 'c>, [HostBuffer; 2])>;

fn copier_pool<T: Snapshot + ?Sized>(target: &T, workers: usize) -> Result<CopierPool<'_>, CrError> {
    (0..workers.max(1))
        .map(|_| {
            let copier = target.copier()?;
            let bufs = [copier.buffer(COPY_CHUNK), copier.buffer(COPY_CHUNK)];
            Ok((copier, bufs))
        })
        .collect()
}

/// A part of a region for a recopy pass to copy: `len` bytes from `offset`.
#[derive(Debug, Clone, Copy)]
struct RecopySpan<'r> {
    region: &'r MemoryRegion,
    offset: u64,
    len: u64,
}

impl<'r> RecopySpan<'r> {
    fn whole(region: &'r MemoryRegion) -> Self {
        RecopySpan { region, offset: 0, len: region.size }
    }

    /// The part `[addr, addr + len)` (a range the dirty log names) of the region of `regions`
    /// (by address) that holds it, cut at the region's end.
    fn within(regions: &'r BTreeMap<u64, MemoryRegion>, addr: u64, len: u64) -> Option<Self> {
        let (_, region) = regions.range(..=addr).next_back()?;
        let offset = addr - region.addr;
        (offset < region.size).then(|| RecopySpan { region, offset, len: len.min(region.size - offset) })
    }
}

/// What the blocks ([`HASH_BLOCK`]) of the regions sent hold, as hashed on the host from
/// the very bytes sent (never from the device again: the session may have written since),
/// by region address: the region's size when sent, and each block's hash (`None`: not sent
/// at this size yet).
#[derive(Default)]
struct SentHashes(HashMap<u64, (u64, Vec<Option<u64>>)>);

impl SentHashes {
    /// `hashes` are of the blocks of `region` from `offset` on, as sent.
    fn note(&mut self, region: &MemoryRegion, offset: u64, len: u64, hashes: &[u64]) {
        let blocks = region.size.div_ceil(HASH_BLOCK) as usize;
        let entry = self.0.entry(region.addr).or_insert_with(|| (region.size, vec![None; blocks]));
        if entry.0 != region.size {
            *entry = (region.size, vec![None; blocks]);
        }
        let first = (offset / HASH_BLOCK) as usize;
        if !offset.is_multiple_of(HASH_BLOCK) {
            // Not on a block's start: what the blocks it touches hold is no longer known.
            let last = (offset + len).div_ceil(HASH_BLOCK) as usize;
            entry.1[first..last.min(blocks)].fill(None);
            return;
        }
        let end = offset + len;
        for (b, &h) in (first..).zip(hashes) {
            let Some(slot) = entry.1.get_mut(b) else { break };
            // A block the piece ends inside of (not at the region's end) was hashed in part.
            let whole = (b as u64 + 1) * HASH_BLOCK <= end || end == region.size;
            *slot = whole.then_some(h);
        }
    }

    /// The hashes of `region`'s blocks as sent, if it was sent at its size.
    fn of(&self, region: &MemoryRegion) -> Option<&[Option<u64>]> {
        let (size, blocks) = self.0.get(&region.addr)?;
        (*size == region.size).then_some(blocks.as_slice())
    }
}

/// Hashing on the device, for a recopy: which devices' memory the pool's copiers can hash.
#[derive(Default)]
struct Hashing {
    devices: HashMap<i32, bool>,
}

impl Hashing {
    /// Make ready to hash `device`'s memory, once: before the session is held.
    fn prepare(&mut self, pool: &mut CopierPool<'_>, device: i32) {
        self.devices.entry(device).or_insert_with(|| pool.first_mut().is_some_and(|(c, _)| c.prepare_hashing(device)));
    }

    /// Whether `device`'s memory is hashed (a device first used since the recopy began is
    /// not: making it ready would hold the session).
    fn can(&self, device: i32) -> bool {
        self.devices.get(&device).copied().unwrap_or(false)
    }

    fn any(&self) -> bool {
        self.devices.values().any(|&b| b)
    }
}

/// What a pass left out because the device still held what was sent.
#[derive(Default, Clone, Copy)]
struct Skipped {
    blocks: u64,
    bytes: u64,
}

/// The parts of `spans` to copy again: each block ([`HASH_BLOCK`]) whose contents on the
/// device hash as the bytes last sent for it is left out (the target has those bytes, up
/// to a 64-bit collision: see [`crate::piece_hash`]); runs of the others are kept, cut at
/// the spans' bounds. A device whose memory cannot be hashed keeps its spans whole.
fn changed_parts<'r>(
    pool: &mut CopierPool<'_>,
    hashing: &Hashing,
    sent: &SentHashes,
    spans: Vec<RecopySpan<'r>>,
) -> (Vec<RecopySpan<'r>>, Skipped) {
    // Candidates, by device: (span, block, hash as sent), and the ranges to hash. Plain
    // vectors: a pass may ask about a million blocks with the session held.
    type Asked = (Vec<(usize, u64, u64)>, Vec<(u64, u64)>);
    let mut asked: HashMap<i32, Asked> = HashMap::new();
    for (i, s) in spans.iter().enumerate() {
        let r = s.region;
        let Some(known) = sent.of(r).filter(|_| s.len > 0 && hashing.can(r.device)) else { continue };
        let (blocks, ranges) = asked.entry(r.device).or_default();
        for b in s.offset / HASH_BLOCK..(s.offset + s.len).div_ceil(HASH_BLOCK) {
            if let Some(&Some(h)) = known.get(b as usize) {
                let at = b * HASH_BLOCK;
                blocks.push((i, b, h));
                ranges.push((r.addr + at, HASH_BLOCK.min(r.size - at)));
            }
        }
    }
    // Whether each block of each span hashes as sent, from the span's first block.
    let mut same: Vec<Vec<bool>> = vec![Vec::new(); spans.len()];
    for (device, (blocks, ranges)) in asked {
        let hashed = pool.first_mut().map(|(c, _)| c.hash_blocks(device, &ranges));
        match hashed {
            Some(Ok(now)) if now.len() == blocks.len() => {
                for (&(i, b, was), now) in blocks.iter().zip(now) {
                    if was == now {
                        let s = &spans[i];
                        let first = s.offset / HASH_BLOCK;
                        let flags = &mut same[i];
                        if flags.is_empty() {
                            flags.resize(((s.offset + s.len).div_ceil(HASH_BLOCK) - first) as usize, false);
                        }
                        flags[(b - first) as usize] = true;
                    }
                }
            }
            Some(Ok(_)) => {
                tracing::warn!("device {device}'s hashes did not come back whole: its written parts are copied")
            }
            Some(Err(e)) => {
                tracing::warn!("hashing device {device}'s memory failed ({e}): its written parts are copied")
            }
            None => {}
        }
    }
    let mut skipped = Skipped::default();
    let mut out = Vec::with_capacity(spans.len());
    for (s, same) in spans.into_iter().zip(same) {
        if same.is_empty() {
            out.push(s);
            continue;
        }
        let (start, end) = (s.offset, s.offset + s.len);
        let first = start / HASH_BLOCK;
        let mut run: Option<u64> = None;
        for (b, &same) in (first..).zip(&same) {
            let (from, to) = ((b * HASH_BLOCK).max(start), ((b + 1) * HASH_BLOCK).min(end));
            if same {
                skipped.blocks += 1;
                skipped.bytes += to - from;
                if let Some(r) = run.take() {
                    out.push(RecopySpan { region: s.region, offset: r, len: from - r });
                }
            } else if run.is_none() {
                run = Some(from);
            }
        }
        if let Some(r) = run {
            out.push(RecopySpan { region: s.region, offset: r, len: end - r });
        }
    }
    (out, skipped)
}

/// Copy `spans` out of the device into `sink` on the pool's copiers, several at once,
/// handing each span's pieces to the sink in order on this thread: the copy at the
/// ordinary checkpoint's rate, for the recopy's passes. With `sent`, each worker hashes the
/// blocks it copied (on its own thread: the hashing adds no pass over the bytes on this
/// one) and they are noted there as the sink takes them.
#[allow(clippy::too_many_arguments)] // the pass's own parameters
fn copy_regions(
    pool: &mut CopierPool<'_>,
    spans: &[RecopySpan<'_>],
    sink: &mut dyn RecopySink,
    mut sent: Option<&mut SentHashes>,
    progress: &Progress,
    within: &Within<'_>,
    session: u64,
) -> Result<(), CrError> {
    let mut pieces = Vec::new();
    for (i, s) in spans.iter().enumerate() {
        let mut off = s.offset;
        while off < s.offset + s.len {
            let n = (s.offset + s.len - off).min(COPY_CHUNK as u64);
            pieces.push((i, off, n as usize));
            off += n;
        }
    }
    if pieces.is_empty() {
        return Ok(());
    }
    let hashing = sent.is_some();
    let workers = pool.len().min(pieces.len()).max(1);
    // Pieces are handed out in order and delivered in order: worker k copies pieces k,
    // k + workers, ...; the collector takes them round-robin. A worker's two buffers go
    // back and forth between it and the collector.
    type Full<'w> = (&'w mut HostBuffer, Vec<u64>);
    let mut states = Vec::with_capacity(workers);
    let mut deliveries = Vec::with_capacity(workers);
    for (k, (copier, bufs)) in pool.iter_mut().take(workers).enumerate() {
        let (full_tx, full_rx) = mpsc::sync_channel::<Full<'_>>(1);
        let (free_tx, free_rx) = mpsc::channel::<&mut HostBuffer>();
        for buf in bufs.iter_mut() {
            free_tx.send(buf).expect("receiver alive");
        }
        states.push((k, copier, free_rx, full_tx));
        deliveries.push((full_rx, free_tx));
    }
    let stopped = || CrError::Thread("recopy copier");
    type Worker<'w, 'c> =
        (usize, &'w mut Box<dyn DeviceCopier + 'c>, mpsc::Receiver<&'w mut HostBuffer>, mpsc::SyncSender<Full<'w>>);
    let work = |(next, copier, free, full): &mut Worker<'_, '_>| -> Result<bool, CrError> {
        let Some(&(region, offset, n)) = pieces.get(*next) else { return Ok(false) };
        if (within.cancelled)() {
            let what = format!("copying memory ({} of {} bytes)", progress.done(), progress.total());
            return Err(CrError::Abandoned { session, what });
        }
        let r = spans[region].region;
        let buf = free.recv().map_err(|_| stopped())?;
        copier.read(r.device, r.addr + offset, &mut buf[..n])?;
        let hashes = if hashing { crate::piece_hash::block_hashes(&buf[..n]) } else { Vec::new() };
        full.send((buf, hashes)).map_err(|_| stopped())?;
        *next += workers;
        Ok(true)
    };
    let in_order = &pieces;
    on_workers(
        states,
        work,
        |_| Ok(()),
        // Owns the channels: a collector that stops drops them, and workers waiting on them
        // stop too.
        move || {
            for (i, &(region, offset, n)) in in_order.iter().enumerate() {
                let (full, free) = &deliveries[i % workers];
                // A worker that failed drops its sender: its error is the answer.
                let (buf, hashes) = full.recv().map_err(|_| stopped())?;
                let r = spans[region].region;
                sink.piece(r, offset, &buf[..n])?;
                if let Some(sent) = sent.as_deref_mut() {
                    sent.note(r, offset, n as u64, &hashes);
                }
                progress.add(n as u64);
                let _ = free.send(buf);
            }
            Ok(())
        },
    )
}

/// Checkpoint `target` into `sink` while it runs, by recopy: the image is the session at
/// the checkpoint's end. The copies wait in host memory until the image is written (as much
/// host memory as the session has device memory); see [`recopy`] for the protocol.
/// `on_written` runs with the session still at rest once the image is whole (a stopping
/// checkpoint freezes the session there); with `hold_to_end` the image is written before
/// the session is let go.
#[allow(clippy::too_many_arguments)] // the checkpoint's own parameters, and the stopping ones
pub fn checkpoint_recopy<T: Quiesce + Snapshot + Concurrent>(
    target: &T,
    sink: &mut dyn ImageSink,
    compression: Compression,
    progress: &Progress,
    within: &Within<'_>,
    hold_to_end: bool,
    on_written: impl FnOnce(),
) -> Result<CheckpointSummary, CrError> {
    let mut held = HeldCopies { copies: HashMap::new(), sink, compression };
    let (summary, _) = recopy(target, &mut held, progress, within, hold_to_end, on_written)?;
    Ok(summary)
}

/// The recopy protocol, into any [`RecopySink`] (a checkpoint's host copies, a migration's
/// stream). Returns its summary and each round's figures.
///
/// A [`TrackWrites`] hook notes in the dirty log every region a call will write. The memory
/// is copied while the session runs; then, in rounds, what was written since the round
/// before is copied again, for as long as that shrinks; last, the session is quiesced, its
/// host state taken, and what was written since the last round (and what was allocated)
/// copied while it is held. Each round begins with the session at rest (a brief quiesce),
/// so every write noted before the round has happened by then, and is seen by the copy that
/// follows or noted again in the next round. Launches run their checked twins meanwhile: a
/// store outside its speculation ends the checkpoint with [`CrError::ValidationMissed`] (the
/// caller takes it again stop-the-world). `on_written` runs with the session still at rest
/// once the sink's [`end`](RecopySink::end) succeeded; with `hold_to_end` that end happens
/// before the session is let go (a stopping checkpoint, a migration).
pub fn recopy<T: Quiesce + Snapshot + Concurrent>(
    target: &T,
    sink: &mut dyn RecopySink,
    progress: &Progress,
    within: &Within<'_>,
    hold_to_end: bool,
    on_written: impl FnOnce(),
) -> Result<(CheckpointSummary, Vec<RoundFigures>), CrError> {
    let start = Instant::now();
    let log = target.dirty_log();
    // No reserve: only the validation of launches.
    let window = target.open_window(Some(0))?;
    // Installing the hook holds the calls too, until those in flight end.
    let install_start = Instant::now();
    let installed = target.install_hook(Arc::new(TrackWrites(log.clone())), within)?;
    let mut stall = install_start.elapsed();
    // The first pass: everything, while the session runs.
    let held = Instant::now();
    let rest = target.quiesce(within)?;
    let mut round = log.begin_round();
    let mut round_began = Instant::now();
    let first = target.head()?;
    let armed = Armed::arm(window.as_ref());
    drop(rest);
    stall += held.elapsed();
    let session = first.session.id;
    let mut figures = Vec::new();
    let total: u64 = first.memory.iter().map(|r| r.size).sum();
    progress.start(total);
    let pass = Instant::now();
    let mut pool = copier_pool(target, crate::parallel::workers().min(pieces(&first.memory).len()))?;
    pool.iter_mut().for_each(|(c, _)| c.beside_the_session(true));
    // The device hashes of written parts, made ready now (a GPU loads its kernel): not while
    // the session is held.
    let mut hashing = Hashing::default();
    for r in &first.memory {
        hashing.prepare(&mut pool, r.device);
    }
    let mut hashes = SentHashes::default();
    let mut skipped_in_all = Skipped::default();
    let everything: Vec<RecopySpan<'_>> = first.memory.iter().map(RecopySpan::whole).collect();
    copy_regions(&mut pool, &everything, sink, hashing.any().then_some(&mut hashes), progress, within, session)?;
    figures.push(RoundFigures { dirty_bytes: total, copied_bytes: total, ms: ms(pass), ..Default::default() });
    // Sizes of the regions as last copied, by address.
    let sent: HashMap<u64, u64> = first.memory.iter().map(|r| (r.addr, r.size)).collect();

    // Rounds: copy again what was written since the round before, while that shrinks.
    let mut rounds = 0;
    let mut extra_bytes = 0u64;
    let mut last_dirty = u64::MAX;
    let known: BTreeMap<u64, MemoryRegion> = first.memory.iter().map(|r| (r.addr, r.clone())).collect();
    while rounds < MAX_RECOPY_ROUNDS {
        let round_start = Instant::now();
        let rest = target.quiesce(within)?;
        let previous = round;
        round = log.begin_round();
        let since_previous = std::mem::replace(&mut round_began, Instant::now()).elapsed();
        let dirty = log.written_since(previous);
        // The parts written of the regions of the first pass (regions made since are taken at
        // the end, with the host state).
        let again: Vec<RecopySpan<'_>> =
            dirty.iter().filter_map(|&(addr, len)| RecopySpan::within(&known, addr, len)).collect();
        // Blocks that hash as they were sent (the log names whole allocations a launch may
        // write) are not copied again: a block left out is as good as one copied now, and
        // what is written after is noted for the next pass as it would be after a copy.
        // Hashed at rest: no write changes a block meanwhile, and no free unmaps one under
        // the kernel (a fault there would end the session's context).
        let (again, skipped) = changed_parts(&mut pool, &hashing, &hashes, again);
        drop(rest);
        stall += round_start.elapsed();
        let bytes: u64 = dirty.iter().map(|d| d.1).sum();
        progress.next_pass(false, bytes as f64 / since_previous.as_secs_f64().max(1e-9));
        rounds += 1;
        let copied: u64 = again.iter().map(|s| s.len).sum();
        progress.total.fetch_add(copied, Ordering::Relaxed);
        copy_regions(&mut pool, &again, sink, hashing.any().then_some(&mut hashes), progress, within, session)?;
        extra_bytes += copied;
        skipped_in_all.blocks += skipped.blocks;
        skipped_in_all.bytes += skipped.bytes;
        figures.push(RoundFigures {
            dirty_bytes: bytes,
            copied_bytes: copied,
            ms: ms(round_start),
            skipped_pieces: skipped.blocks,
            skipped_bytes: skipped.bytes,
        });
        // Whether the rounds converge is what they copy: with the hashes, what changed.
        let measure = if hashing.any() { copied } else { bytes };
        if measure == 0 || measure >= last_dirty {
            break;
        }
        last_dirty = measure;
    }

    // The end: the session held while the rest is copied.
    let held = Instant::now();
    let rest = target.quiesce(within)?;
    let quiesce_ms = ms(held);
    let mut head = target.head()?;
    head.created_ms = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0);
    // Every launch since the first pass has finished (the session is at rest): a store
    // outside its speculation may have gone unnoted.
    let settle = Within { deadline: Instant::now() + within.deadline.saturating_duration_since(start), ..*within };
    if let Some(addr) = armed.finish(&settle)? {
        return Err(CrError::ValidationMissed { session, addr });
    }
    let written = log.written_since(round);
    let dirty_bytes: u64 = written.iter().map(|d| d.1).sum();
    progress.next_pass(true, dirty_bytes as f64 / round_began.elapsed().as_secs_f64().max(1e-9));
    // New regions (or regions made again at another size) whole, and the parts written of
    // the others.
    let unsent = |r: &&MemoryRegion| sent.get(&r.addr) != Some(&r.size);
    let mut last: Vec<RecopySpan<'_>> = head.memory.iter().filter(unsent).map(RecopySpan::whole).collect();
    let now: BTreeMap<u64, MemoryRegion> = head.memory.iter().map(|r| (r.addr, r.clone())).collect();
    // The exact pass: of the parts written, only the blocks whose device contents no
    // longer hash as sent (the session is at rest: nothing changes them meanwhile).
    let written_parts: Vec<RecopySpan<'_>> = written
        .iter()
        .filter_map(|&(addr, len)| RecopySpan::within(&now, addr, len))
        .filter(|s| !unsent(&s.region))
        .collect();
    let (written_parts, skipped) = changed_parts(&mut pool, &hashing, &hashes, written_parts);
    last.extend(written_parts);
    let copied: u64 = last.iter().map(|s| s.len).sum();
    progress.total.fetch_add(copied, Ordering::Relaxed);
    // Held: every lane is the last pass's.
    pool.iter_mut().for_each(|(c, _)| c.beside_the_session(false));
    copy_regions(&mut pool, &last, sink, None, progress, within, session)?;
    extra_bytes += copied;
    skipped_in_all.blocks += skipped.blocks;
    skipped_in_all.bytes += skipped.bytes;
    figures.push(RoundFigures {
        dirty_bytes,
        copied_bytes: copied,
        ms: ms(held),
        skipped_pieces: skipped.blocks,
        skipped_bytes: skipped.bytes,
    });
    drop(installed);
    let copy_ms = ms(start);
    let (summary, last_hold) = if hold_to_end {
        let summary = sink.end(&head)?;
        on_written();
        drop(rest);
        (summary, held.elapsed())
    } else {
        drop(rest);
        let last_hold = held.elapsed();
        let summary = sink.end(&head)?;
        on_written();
        (summary, last_hold)
    };
    stall += last_hold;
    let summary = CheckpointSummary {
        dir: Default::default(),
        records: head.records.len(),
        regions: head.memory.len(),
        memory_bytes: summary.memory_bytes,
        stored_bytes: summary.stored_bytes,
        quiesce_ms,
        copy_ms,
        total_ms: ms(start),
        stopped: false,
        mode: "recopy".into(),
        stall_ms: stall.as_secs_f64() * 1e3,
        held_ms: last_hold.as_secs_f64() * 1e3,
        extra_bytes,
        rounds,
        fallback: None,
        skipped_pieces: skipped_in_all.blocks,
        skipped_bytes: skipped_in_all.bytes,
        ..Default::default()
    };
    Ok((summary, figures))
}

#[cfg(test)]
mod cow_tests;
#[cfg(test)]
mod restore_tests;

#[cfg(test)]
mod hash_tests {
    use super::*;
    use crate::RegionKind;
    use crate::piece_hash::block_hashes;

    /// Device memory as a host vector at address `base`, hashed by the host's function.
    struct Memory {
        base: u64,
        bytes: Arc<Mutex<Vec<u8>>>,
    }

    impl DeviceCopier for Memory {
        fn buffer(&self, len: usize) -> HostBuffer {
            HostBuffer::new(len, None)
        }
        fn read(&mut self, _: i32, addr: u64, out: &mut [u8]) -> Result<(), CrError> {
            let at = (addr - self.base) as usize;
            out.copy_from_slice(&self.bytes.lock()[at..at + out.len()]);
            Ok(())
        }
        fn write(&mut self, _: i32, _: u64, _: &[u8]) -> Result<(), CrError> {
            unreachable!()
        }
        fn zero(&mut self, _: i32, _: u64, _: u64) -> Result<(), CrError> {
            unreachable!()
        }
        fn finish(&mut self) -> Result<(), CrError> {
            Ok(())
        }
        fn prepare_hashing(&mut self, device: i32) -> bool {
            device == 0
        }
        fn hash_blocks(&mut self, _: i32, blocks: &[(u64, u64)]) -> Result<Vec<u64>, CrError> {
            let bytes = self.bytes.lock();
            Ok(blocks
                .iter()
                .map(|&(addr, len)| {
                    let at = (addr - self.base) as usize;
                    crate::piece_hash::block_hash(&bytes[at..at + len as usize])
                })
                .collect())
        }
    }

    /// Only the blocks that differ from what was sent are copied again, in runs cut at the
    /// spans' bounds; blocks sent in part, or at another size, are copied whatever they hold.
    #[test]
    fn only_blocks_that_differ_from_what_was_sent_are_copied_again() {
        let base = 0x1000_0000u64;
        let size = 10 * HASH_BLOCK + 100;
        let bytes = Arc::new(Mutex::new((0..size).map(|i| (i % 253) as u8).collect::<Vec<u8>>()));
        let mut pool: CopierPool<'_> = vec![(
            Box::new(Memory { base, bytes: bytes.clone() }),
            [HostBuffer::new(0, None), HostBuffer::new(0, None)],
        )];
        let mut hashing = Hashing::default();
        hashing.prepare(&mut pool, 0);
        let region = MemoryRegion { addr: base, size, device: 0, kind: RegionKind::Allocation, chunks: Vec::new() };
        let mut sent = SentHashes::default();
        sent.note(&region, 0, size, &block_hashes(&bytes.lock()));
        // Blocks 2 and 3 and the short last one change; block 7 is written back as it was.
        {
            let mut b = bytes.lock();
            b[2 * HASH_BLOCK as usize + 5] ^= 1;
            b[3 * HASH_BLOCK as usize] ^= 1;
            b[size as usize - 1] ^= 1;
            let at = 7 * HASH_BLOCK as usize;
            b[at..at + 8].copy_from_slice(&(0..8).map(|i| ((at as u64 + i) % 253) as u8).collect::<Vec<u8>>());
        }
        let whole = vec![RecopySpan::whole(&region)];
        let (parts, skipped) = changed_parts(&mut pool, &hashing, &sent, whole);
        let got: Vec<(u64, u64)> = parts.iter().map(|s| (s.offset, s.len)).collect();
        assert_eq!(got, vec![(2 * HASH_BLOCK, 2 * HASH_BLOCK), (10 * HASH_BLOCK, 100)]);
        assert_eq!((skipped.blocks, skipped.bytes), (8, 8 * HASH_BLOCK));
        // A span starting inside a block: cut at its bounds.
        let span = vec![RecopySpan { region: &region, offset: 2 * HASH_BLOCK + 10, len: 3 * HASH_BLOCK }];
        let (parts, _) = changed_parts(&mut pool, &hashing, &sent, span);
        let got: Vec<(u64, u64)> = parts.iter().map(|s| (s.offset, s.len)).collect();
        assert_eq!(got, vec![(2 * HASH_BLOCK + 10, 2 * HASH_BLOCK - 10)]);
        // A piece sent from inside a block leaves its blocks unknown: copied again.
        sent.note(&region, HASH_BLOCK + 8, HASH_BLOCK, &[0, 0]);
        let (parts, _) = changed_parts(
            &mut pool,
            &hashing,
            &sent,
            vec![RecopySpan { region: &region, offset: 0, len: 4 * HASH_BLOCK }],
        );
        let got: Vec<(u64, u64)> = parts.iter().map(|s| (s.offset, s.len)).collect();
        assert_eq!(got, vec![(HASH_BLOCK, 3 * HASH_BLOCK)]);
        // A piece ending inside a block (not the region's end) leaves that block unknown.
        sent.note(&region, 0, HASH_BLOCK + 1, &block_hashes(&bytes.lock()[..HASH_BLOCK as usize + 1]));
        let (parts, _) = changed_parts(
            &mut pool,
            &hashing,
            &sent,
            vec![RecopySpan { region: &region, offset: 0, len: 2 * HASH_BLOCK }],
        );
        let got: Vec<(u64, u64)> = parts.iter().map(|s| (s.offset, s.len)).collect();
        assert_eq!(got, vec![(HASH_BLOCK, HASH_BLOCK)]);
        // The region at another size: nothing is known of it.
        let bigger = MemoryRegion { size: size + 8, ..region.clone() };
        let (parts, skipped) = changed_parts(&mut pool, &hashing, &sent, vec![RecopySpan::whole(&bigger)]);
        assert_eq!((parts.len(), skipped.blocks), (1, 0));
        // A device whose memory cannot be hashed keeps its spans.
        let elsewhere = MemoryRegion { device: 1, ..region.clone() };
        let (parts, skipped) = changed_parts(&mut pool, &hashing, &sent, vec![RecopySpan::whole(&elsewhere)]);
        assert_eq!((parts.len(), skipped.blocks), (1, 0));
    }
}
