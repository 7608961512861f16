//! Checkpoint and restore of a whole session (stop-the-world).
//!
//! **Checkpoint.** The session's gate is closed: calls in flight finish, new ones wait. The
//! devices are synchronised; the image then gets the recorded creation calls of every live
//! object (in creation order, which respects their dependencies), the handle counters, and
//! the contents of every allocation and module variable, copied out in large chunks (all-zero
//! chunks are not stored). Afterwards the gate opens again, or, for `stop`, stays closed: the
//! session is frozen until its server is ended, and the guest's waiting calls are sent again
//! to the restored session.
//!
//! A checkpoint waits for the session to come to rest for a bounded time only
//! ([`Bounds::quiesce_timeout`]): a kernel that never ends, or a call that waits for one,
//! makes it give up, naming what it waited for, and the session carries on as it was. Its
//! client going away ([`Bounds::cancel`]) stops it too, at the next step.
//!
//! **Restore.** The whole image is checked first (manifest, layout, what it means: see
//! [`check_image`]), so a bad image is refused before anything is created. The session is
//! then rebuilt in a fresh server: the same device address range is reserved, each record
//! is replayed through
//! the generated dispatch with the handles and addresses it produced before (so every
//! allocation comes back at its address and every virtual handle keeps its value), and the
//! memory contents are written back.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use phos_checkpoint::{
    Compression, Image, ImageApi, ImageWriter, Manifest, MemoryRegion, PreparedChunk, Record, RegionKind, SessionMeta,
    prepare_chunk,
};
use phos_control::{Cancel, Waiting};
use phos_protocol::apis::{Function, HandleKind};
use phos_protocol::cudart::FunctionId;
use phos_protocol::handshake::{ApiVersion, check_apis};
use phos_protocol::limits::LimitKind;

use crate::backend::{Backend, Raw, StreamRef};
use crate::call_gate::NotClosed;
use crate::control::SessionFactory;
use crate::handles::{NUMBER_BITS, is_handle_of};
use crate::service::{CallCx, Session};

/// Size of the pieces memory is copied and stored in.
const COPY_CHUNK: usize = 8 << 20;
/// Pieces in flight between the device copies and the image file.
const BUFFERS: usize = 4;

/// One message from the copying thread to the image writer.
enum Piece {
    Begin(u64, u64, i32, RegionKind),
    Chunk(Staging, usize, PreparedChunk),
}

/// A copy buffer page-locked for the backend's DMA for as long as it lives.
struct Staging {
    buf: Vec<u8>,
    backend: Arc<dyn Backend>,
}

impl Staging {
    fn new(backend: Arc<dyn Backend>, len: usize) -> Self {
        let mut buf = vec![0u8; len];
        backend.pin_host(&mut buf);
        Staging { buf, backend }
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        self.backend.unpin_host(&mut self.buf);
    }
}

/// `CU_STREAM_NON_BLOCKING`: the copy streams do not wait on the legacy default stream.
const NON_BLOCKING: u32 = 1;

/// The dedicated stream checkpoint and restore copy on, one per device, made on first use.
/// The copies then never queue behind (or hold up) work on the session's own streams.
struct CopyStreams {
    backend: Arc<dyn Backend>,
    streams: Vec<Option<Raw>>,
}

impl CopyStreams {
    fn new(backend: Arc<dyn Backend>) -> Self {
        let n = backend.device_count().max(0) as usize;
        CopyStreams { backend, streams: vec![None; n] }
    }

    fn on(&mut self, device: i32) -> Result<StreamRef, String> {
        let slot = self
            .streams
            .get_mut(device as usize)
            .ok_or_else(|| format!("the image names device {device}, which this server does not have"))?;
        if slot.is_none() {
            let raw = self
                .backend
                .stream_create(device, NON_BLOCKING, 0)
                .map_err(|e| format!("creating the copy stream on device {device}: {e:?}"))?;
            *slot = Some(raw);
        }
        Ok(StreamRef::Created(slot.expect("just made")))
    }

    /// Wait for everything queued on every copy stream.
    fn synchronize(&self) -> Result<(), String> {
        for (d, s) in self.streams.iter().enumerate() {
            if let Some(raw) = s {
                self.backend.bind(d as i32).map_err(|e| format!("{e:?}"))?;
                self.backend
                    .stream_synchronize(StreamRef::Created(*raw))
                    .map_err(|e| format!("finishing the copies on device {d}: {e:?}"))?;
            }
        }
        Ok(())
    }
}

impl Drop for CopyStreams {
    fn drop(&mut self) {
        for (d, s) in self.streams.iter().enumerate() {
            if let Some(raw) = s {
                let _ = self.backend.bind(d as i32);
                let _ = self.backend.stream_destroy(*raw);
            }
        }
    }
}

/// How far a checkpoint or restore is, for progress bars.
#[derive(Default)]
pub struct Progress {
    pub done: AtomicU64,
    pub total: AtomicU64,
}

impl Progress {
    pub fn done(&self) -> u64 {
        self.done.load(Ordering::Relaxed)
    }

    pub fn total(&self) -> u64 {
        self.total.load(Ordering::Relaxed)
    }

    fn set_total(&self, total: u64) {
        self.done.store(0, Ordering::Relaxed);
        self.total.store(total, Ordering::Relaxed);
    }

    fn add(&self, n: u64) {
        self.done.fetch_add(n, Ordering::Relaxed);
    }
}

/// What a checkpoint did.
#[derive(Debug, Clone, Default)]
pub struct CheckpointReport {
    pub records: usize,
    pub regions: usize,
    /// Device memory covered and bytes stored for it.
    pub memory_bytes: u64,
    pub stored_bytes: u64,
    /// Time to stop the session's calls and synchronise the devices.
    pub quiesce_ms: f64,
    /// Time to copy memory out and write the image.
    pub copy_ms: f64,
    pub total_ms: f64,
}

/// What a restore did.
#[derive(Debug, Clone, Default)]
pub struct RestoreReport {
    pub records: usize,
    pub memory_bytes: u64,
    pub verify_ms: f64,
    pub replay_ms: f64,
    pub copy_ms: f64,
    pub total_ms: f64,
}

fn ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1e3
}

/// How long a checkpoint may wait for the session to come to rest, and whether its client
/// still wants it.
#[derive(Clone, Debug)]
pub struct Bounds {
    pub quiesce_timeout: Duration,
    pub cancel: Cancel,
}

impl Default for Bounds {
    fn default() -> Self {
        Bounds { quiesce_timeout: phos_control::DEFAULT_QUIESCE_TIMEOUT, cancel: Cancel::default() }
    }
}

/// Why a checkpoint or restore stopped before its end.
#[derive(Debug, thiserror::Error)]
pub enum Stopped {
    #[error(
        "session {session}: the checkpoint gave up after {waited:.1?} waiting for {waiting_for}; nothing was written, and the session carries on as it was"
    )]
    TimedOut { session: u64, waited: Duration, waiting_for: Waiting },
    #[error("session {session}: abandoned (its client went away) while {what}; the session is as it was")]
    Abandoned { session: u64, what: String },
    /// The image cannot be restored here: it does not read, or describes a session this
    /// server could not have.
    #[error("{0}")]
    Refused(String),
    /// Anything else (the device, the disk).
    #[error("{0}")]
    Failed(String),
}

impl From<String> for Stopped {
    fn from(why: String) -> Self {
        Stopped::Failed(why)
    }
}

impl From<&str> for Stopped {
    fn from(why: &str) -> Self {
        Stopped::Failed(why.to_string())
    }
}

/// Run `work` on a thread of its own and wait for it until `deadline` or until `cancel`
/// is set (the thread is then left to finish on its own: a device synchronisation cannot be
/// interrupted). `Ok(None)`: no thread could run it, or it ended without an answer.
fn within<T: Send + 'static>(
    deadline: Instant,
    cancel: &Cancel,
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<Option<T>, NotClosed> {
    let (tx, rx) = mpsc::channel();
    let started = std::thread::Builder::new().name("phos-quiesce".into()).spawn(move || {
        let _ = tx.send(work());
    });
    if started.is_err() {
        return Ok(None);
    }
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left.min(Duration::from_millis(50))) {
            Ok(v) => return Ok(Some(v)),
            Err(mpsc::RecvTimeoutError::Disconnected) => return Ok(None),
            Err(mpsc::RecvTimeoutError::Timeout) if cancel.is_cancelled() => return Err(NotClosed::Cancelled),
            Err(mpsc::RecvTimeoutError::Timeout) if left.is_zero() => return Err(NotClosed::TimedOut),
            Err(mpsc::RecvTimeoutError::Timeout) => {}
        }
    }
}

impl Session {
    /// Write the session to `dir`. `meta` carries what the router knows (token, tenant,
    /// program, ABI, epoch); the rest is filled in here.
    pub fn checkpoint(
        &self,
        dir: &Path,
        mut meta: SessionMeta,
        compression: Compression,
        stop: bool,
        progress: &Progress,
        bounds: &Bounds,
    ) -> Result<CheckpointReport, Stopped> {
        let start = Instant::now();
        let deadline = start + bounds.quiesce_timeout;
        let stopped = |why: NotClosed, waiting_for: Waiting| match why {
            NotClosed::TimedOut => Stopped::TimedOut { session: self.id, waited: start.elapsed(), waiting_for },
            NotClosed::Cancelled => Stopped::Abandoned { session: self.id, what: format!("waiting for {waiting_for}") },
        };
        let gate = self
            .gate
            .close(deadline, || bounds.cancel.is_cancelled())
            .map_err(|why| stopped(why, Waiting::Calls { functions: self.busy_calls() }))?;
        let backend = self.backend_arc();
        // Synchronised on a thread of its own: a kernel that never ends, or a host function
        // whose guest never answers, must not hold the session (and the operator) for ever.
        let syncing = Arc::new(AtomicI32::new(0));
        let (b, at) = (backend.clone(), syncing.clone());
        let synced = within(deadline, &bounds.cancel, move || {
            for d in 0..b.device_count() {
                at.store(d, Ordering::Relaxed);
                b.device_synchronize(d).map_err(|e| format!("synchronising device {d}: {e:?}"))?;
            }
            Ok::<(), String>(())
        })
        .map_err(|why| stopped(why, Waiting::Device { device: syncing.load(Ordering::Relaxed) }))?;
        synced.ok_or("the devices could not be synchronised (no thread could, or it failed)")??;
        let backend = backend.as_ref();
        let quiesce_ms = ms(start);
        let copy_start = Instant::now();

        let records: Vec<Record> = self
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
        let regions = self.memory_regions();
        progress.set_total(regions.iter().map(|r| r.1).sum());

        let mut writer = ImageWriter::create(dir, compression, COPY_CHUNK).map_err(|e| e.to_string())?;
        // Copies from the device and writes to the image overlap: this thread copies piece
        // k + 1 while a writer thread checksums, compresses and writes piece k.
        let (to_writer, from_copier) = mpsc::sync_channel::<Piece>(BUFFERS);
        let (free_tx, free_rx) = mpsc::channel::<Staging>();
        for _ in 0..BUFFERS {
            free_tx.send(Staging::new(self.backend_arc(), COPY_CHUNK)).expect("receiver alive");
        }
        let writer_thread = std::thread::spawn(move || -> Result<ImageWriter, String> {
            for piece in from_copier {
                match piece {
                    Piece::Begin(addr, size, device, kind) => writer.begin_region(addr, size, device, kind),
                    Piece::Chunk(buf, n, prepared) => {
                        writer.add_prepared(n as u64, prepared, &buf.buf[..n]).map_err(|e| e.to_string())?;
                        if free_tx.send(buf).is_err() {
                            break;
                        }
                    }
                }
            }
            Ok(writer)
        });
        let mut streams = CopyStreams::new(self.backend_arc());
        let mut copy = || -> Result<(), Stopped> {
            for (addr, size, device, kind) in &regions {
                to_writer
                    .send(Piece::Begin(*addr, *size, *device, kind.clone()))
                    .map_err(|_| "image writer stopped")?;
                backend.bind(*device).map_err(|e| format!("{e:?}"))?;
                let stream = streams.on(*device)?;
                let mut off = 0;
                while off < *size {
                    if bounds.cancel.is_cancelled() {
                        let what = format!("copying memory ({} of {} bytes)", progress.done(), progress.total());
                        return Err(Stopped::Abandoned { session: self.id, what });
                    }
                    let n = (size - off).min(COPY_CHUNK as u64) as usize;
                    let mut buf = free_rx.recv().map_err(|_| "image writer stopped")?;
                    // Returns once the piece has arrived (the backend synchronises the stream).
                    backend
                        .memcpy_dtoh(&mut buf.buf[..n], addr + off, Some(stream))
                        .map_err(|e| format!("copying {:#x}: {e:?}", addr + off))?;
                    // Zero check, compression and checksum here; the writer only writes.
                    let prepared = prepare_chunk(&buf.buf[..n], compression).map_err(|e| e.to_string())?;
                    to_writer.send(Piece::Chunk(buf, n, prepared)).map_err(|_| "image writer stopped")?;
                    progress.add(n as u64);
                    off += n as u64;
                }
            }
            Ok(())
        };
        let copied = copy();
        drop(to_writer);
        let written = writer_thread.join().map_err(|_| "image writer panicked".to_string())?;
        drop(free_rx);
        copied?;
        let writer = written?;
        meta.id = self.id;
        meta.backend = backend.name().to_string();
        meta.device_base = self.memory().base();
        meta.device_size = self.memory().size();
        meta.devices = (0..backend.device_count())
            .map(|d| backend.device_properties(d).map(|p| p.name).unwrap_or_default())
            .collect();
        let manifest = Manifest {
            format: 0,
            apis: ApiVersion::of_this_build()
                .into_iter()
                .map(|a| ImageApi { id: a.id, name: a.name, version: a.version, hash: a.hash })
                .collect(),
            created_ms: SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0),
            session: meta,
            handle_counters: self.handle_counters(),
            records,
            memory: Vec::new(),
        };
        let report_records = manifest.records.len();
        let summary = writer.finish(manifest).map_err(|e| e.to_string())?;
        if stop {
            // The image is whole: the session stops even if its client has gone meanwhile
            // (the router, which asked, suspends the session when it hears back).
            self.freeze();
        }
        drop(gate);
        Ok(CheckpointReport {
            records: report_records,
            regions: regions.len(),
            memory_bytes: summary.memory_bytes,
            stored_bytes: summary.stored_bytes,
            quiesce_ms,
            copy_ms: ms(copy_start),
            total_ms: ms(start),
        })
    }

    /// Every range of device memory the session holds: allocations, then module variables.
    fn memory_regions(&self) -> Vec<(u64, u64, i32, RegionKind)> {
        let mut out: Vec<(u64, u64, i32, RegionKind)> = self
            .memory()
            .allocations()
            .into_iter()
            .map(|a| (a.addr, a.size, a.device, RegionKind::Allocation))
            .collect();
        out.extend(self.module_variables().into_iter().map(|(module, name, addr, size, device)| {
            (addr, size, device, RegionKind::ModuleVariable { module, name })
        }));
        out
    }

    /// Rebuild a session from an image in this (fresh) server, made by `factory` (its
    /// backend, device range and limits). `device` moves every record onto that device (a
    /// restore onto another GPU). `cancel` stops the restore between steps.
    pub fn restore(
        dir: &Path,
        factory: &SessionFactory,
        device: Option<i32>,
        progress: &Progress,
        cancel: &Cancel,
    ) -> Result<(Session, SessionMeta, RestoreReport), Stopped> {
        let start = Instant::now();
        let mut image = Image::open(dir).map_err(|e| Stopped::Refused(e.to_string()))?;
        check_image(&image.manifest, factory, device).map_err(Stopped::Refused)?;
        // The manifest and the chunk table are checked (Image::open, check_image); each
        // chunk's checksum is checked as it is read below. A failure anywhere ends the
        // restore and drops the new session with everything it made: nothing half-restored
        // is ever served.
        let verify_ms = ms(start);
        let manifest = image.manifest.clone();
        let meta = manifest.session.clone();
        let session = Session::new(
            meta.id,
            factory.backend.clone(),
            meta.device_base,
            meta.device_size,
            factory.max_reply,
            (factory.output)(),
            factory.limits,
        )
        .map_err(|e| format!("reserving the device address range {:#x}: {e:?}", meta.device_base))?;
        session.set_handle_counters(&manifest.handle_counters);
        let abandoned = |what: &str| Stopped::Abandoned { session: meta.id, what: what.to_string() };
        let replay_start = Instant::now();
        for r in &manifest.records {
            if cancel.is_cancelled() {
                return Err(abandoned("replaying its records"));
            }
            let id = Function::from_wire(r.api, r.function).expect("checked");
            let dev = device.unwrap_or(r.device);
            let cx = CallCx {
                device: dev,
                replay: Some(r.creates.iter().map(|(_, v)| *v).collect()),
                staging: None,
                measure: false,
                function: Some(id),
            };
            let mut out = Vec::new();
            session.backend().bind(dev).map_err(|e| format!("{e:?}"))?;
            crate::server::replay(&session, &cx, id, &r.payload, &mut out)
                .map_err(|e| format!("replaying {}: {e}", r.name))?;
        }
        let replay_ms = ms(replay_start);

        let copy_start = Instant::now();
        progress.set_total(manifest.memory.iter().map(|r| r.size).sum());
        let targets: Vec<(u64, i32)> =
            manifest.memory.iter().map(|r| session.region_target(r, device)).collect::<Result<_, _>>()?;
        // A reader thread reads and checks chunk k + 1 while this one copies chunk k in.
        let (to_copier, from_reader) = mpsc::sync_channel::<(usize, u64, Option<Staging>, u64)>(BUFFERS);
        let (free_tx, free_rx) = mpsc::channel::<Staging>();
        for _ in 0..BUFFERS {
            free_tx.send(Staging::new(session.backend_arc(), COPY_CHUNK)).expect("receiver alive");
        }
        let regions = manifest.memory.clone();
        let reader = std::thread::spawn(move || -> Result<(), Stopped> {
            for (i, region) in regions.iter().enumerate() {
                for c in &region.chunks {
                    if c.encoding == phos_checkpoint::Encoding::Zero {
                        if to_copier.send((i, c.offset, None, c.len)).is_err() {
                            return Ok(());
                        }
                        continue;
                    }
                    let Ok(mut buf) = free_rx.recv() else { return Ok(()) };
                    if buf.buf.len() < c.len as usize {
                        buf = Staging::new(buf.backend.clone(), c.len as usize);
                    }
                    image.read_chunk_into(c, &mut buf.buf).map_err(|e| Stopped::Refused(e.to_string()))?;
                    if to_copier.send((i, c.offset, Some(buf), c.len)).is_err() {
                        return Ok(());
                    }
                }
            }
            Ok(())
        });
        let mut streams = CopyStreams::new(session.backend_arc());
        let copy = || -> Result<(), Stopped> {
            for (i, offset, buf, len) in from_reader {
                if cancel.is_cancelled() {
                    return Err(abandoned(&format!(
                        "copying memory ({} of {} bytes)",
                        progress.done(),
                        progress.total()
                    )));
                }
                let (addr, dev) = targets[i];
                let b = session.backend();
                b.bind(dev).map_err(|e| format!("{e:?}"))?;
                let stream = streams.on(dev)?;
                let dst = addr + offset;
                match buf {
                    None => b.memset(dst, 0, len, Some(stream)),
                    Some(buf) => {
                        // The staging buffer goes back to the reader only once the copy out of
                        // it is finished.
                        let r = b.memcpy_htod(dst, &buf.buf[..len as usize], Some(stream));
                        let r = r.and_then(|_| b.stream_synchronize(stream));
                        let _ = free_tx.send(buf);
                        r
                    }
                }
                .map_err(|e| format!("writing {dst:#x}: {e:?}"))?;
                progress.add(len);
            }
            Ok(streams.synchronize()?)
        };
        let copied = copy();
        // Without this the reader could wait forever for a buffer after a failed copy.
        drop(free_tx);
        let read = reader.join().map_err(|_| "image reader panicked".to_string())?;
        read?;
        copied?;
        let report = RestoreReport {
            records: manifest.records.len(),
            memory_bytes: manifest.memory.iter().map(|r| r.size).sum(),
            verify_ms,
            replay_ms,
            copy_ms: ms(copy_start),
            total_ms: ms(start),
        };
        Ok((session, meta, report))
    }

    /// Where a region of an image goes in this session: an allocation at its address (which
    /// replaying must have recreated), a module variable wherever its reloaded module has it.
    fn region_target(&self, region: &MemoryRegion, device: Option<i32>) -> Result<(u64, i32), String> {
        let dev = device.unwrap_or(region.device);
        match &region.kind {
            RegionKind::Allocation => {
                if !self.memory().contains(region.addr, region.size) {
                    return Err(format!("allocation {:#x} was not recreated", region.addr));
                }
                Ok((region.addr, dev))
            }
            RegionKind::ModuleVariable { module, name } => {
                let (addr, size) =
                    self.module_variable(*module, name).map_err(|e| format!("variable {name}: {e:?}"))?;
                if size != region.size {
                    return Err(format!("variable {name} has {size} bytes, the image {}", region.size));
                }
                Ok((addr, dev))
            }
        }
    }
}

/// What this server can say of an image before it creates anything, beyond what
/// [`Image::open`] checked: that its records are calls this server's spec knows, creating
/// objects of the kinds the spec says, with handles of their kind and addresses inside the
/// session's ranges, no more of each kind than the session's limits allow, counters past
/// every handle the records use, memory regions that match what the records allocate, on
/// devices this server has; and that its device range is this server's.
pub fn check_image(m: &Manifest, factory: &SessionFactory, device: Option<i32>) -> Result<(), String> {
    let bad = |why: String| Err(format!("the image describes an impossible session: {why}"));
    let apis: Vec<ApiVersion> = m
        .apis
        .iter()
        .map(|a| ApiVersion { id: a.id, name: a.name.clone(), version: a.version, hash: a.hash })
        .collect();
    check_apis(&apis, "the image").map_err(|e| e.to_string())?;
    let s = &m.session;
    if (s.device_base, s.device_size) != (factory.device_base, factory.device_size) {
        return bad(format!(
            "its device range {:#x}+{:#x} is not this server's ({:#x}+{:#x})",
            s.device_base, s.device_size, factory.device_base, factory.device_size
        ));
    }
    let devices = factory.backend.device_count();
    let on_a_device = |d: i32| (0..devices).contains(&device.unwrap_or(d));
    if let Some(d) = device.filter(|&d| !(0..devices).contains(&d)) {
        return Err(format!("device {d} does not exist here ({devices} devices)"));
    }
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
    let mut allocations: HashSet<u64> = HashSet::new();
    let mut modules: HashSet<u64> = HashSet::new();
    for r in &m.records {
        let f = match Function::from_wire(r.api, r.function) {
            Some(f) if f.name() == r.name => f,
            _ => return Err(format!("the image records `{}`, which this server does not know", r.name)),
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
