//! Shared-memory rings: the transport for a peer on the same host.
//!
//! A channel that starts on a Unix socket can move to a **region** the accepting side creates
//! (a sealed `memfd`, a [`SharedRegion`]) and passes over the socket (`SCM_RIGHTS`). The
//! region holds two single-producer, single-consumer byte rings, one per direction; frames
//! are written into them exactly as onto a socket, so
//! [`read_frame`](crate::transport::read_frame) and
//! [`write_frame`](crate::transport::write_frame) serve both. The rings' protocol (who
//! writes which word, with which ordering, and how a side sleeps) is `ring.rs`'s.
//!
//! Layout (little-endian, offsets in bytes):
//!
//! | offset | what |
//! |---|---|
//! | 0 | magic `PHOSRING`, version (u32), ring size (u64, a power of two) |
//! | 1024 | control of ring 0 (creator -> attacher) |
//! | 2048 | control of ring 1 (attacher -> creator) |
//! | 4096 | data of ring 0, then data of ring 1 |
//!
//! A ring's control has one cache line per writer: the producer's (`tail`, `data_seq`,
//! `producer_waiting`), the consumer's (`head`, `space_seq`, `consumer_waiting`), and a
//! `closed` word. Each side keeps its own index privately and only *reads* the other's from
//! the region, checking it: a peer that scribbles on the region breaks its own channel and
//! nothing else.
//!
//! **Waiting.** A side that finds nothing to read (or no room to write) spins for a short
//! while (`PHOS_SPIN_US`, by default 50 µs on machines with four or more CPUs and none on
//! smaller ones), then sleeps on a futex in the region; the other side wakes it only if it
//! said it sleeps, so a busy channel makes no system call per frame and an idle one costs
//! no CPU. A reader awaiting the answer to a synchronous call spins longer
//! (`PHOS_SYNC_SPIN_US`, 2 ms; see [`Transport::expect_frame_within`]), as the driver
//! spins for an application's own synchronous calls: a futex wake-up on an idle CPU costs
//! tens to hundreds of microseconds, which a 64 MiB copy would feel at every hop. A sleeper
//! looks at the Unix socket after [`LIVENESS_CHECK`], then at doubling intervals up to
//! [`LIVENESS_CHECK_IDLE`] while nothing comes: the socket is kept
//! open for the channel's life and carries nothing more, so when it reads as closed the
//! peer is gone (even if it was killed before it could mark its rings closed).

use std::io::{self, IoSlice, IoSliceMut, Read, Write};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering, fence};
use std::time::{Duration, Instant};

use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags};
use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
use vm_memory::VolatileSlice;

use crate::frame::FrameHeader;
use crate::ring::{Consumer, Host, Producer, Ring, RingControl, Waited, futex_wake, since_epoch};
pub use crate::ring::{LIVENESS_CHECK, LIVENESS_CHECK_IDLE};
use crate::shared::{SharedAtomics, SharedRegion};
use crate::staging::Staging;
use crate::transport::{BufferBudget, BufferClaim, Transport, TransportError, read_frame_within, write_frame};

const MAGIC: u64 = u64::from_le_bytes(*b"PHOSRING");
const LAYOUT_VERSION: u32 = 1;
const CONTROL_BYTES: usize = 4096;
const RING_CONTROL: [usize; 2] = [1024, 2048];

/// Bytes of each direction's ring unless configured otherwise.
pub const DEFAULT_RING_BYTES: usize = 4 << 20;
/// The smallest and largest rings accepted.
pub const MIN_RING_BYTES: usize = 4096;
pub const MAX_RING_BYTES: usize = 1 << 30;

// SAFETY: a ring's control is made only of `std` atomic integers (u64 and u32 words, in
// cache-line aligned groups) and padding.
unsafe impl SharedAtomics for RingControl<Host> {}

/// How long to spin before sleeping: `PHOS_SPIN_US`, else 50 µs where there are CPUs to
/// spare and none where there are not (a spinning waiter on two CPUs delays the very peer
/// it waits for).
/// Worked out once per process: `available_parallelism` reads the cgroup's files (six
/// opens and reads), which cost a staged copy, whose sides ask this, tens of microseconds.
pub fn default_spin() -> Duration {
    static SPIN: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();
    *SPIN.get_or_init(|| {
        if let Some(us) = std::env::var("PHOS_SPIN_US").ok().and_then(|s| s.trim().parse::<u64>().ok()) {
            return Duration::from_micros(us.min(10_000));
        }
        match std::thread::available_parallelism() {
            Ok(n) if n.get() >= 4 => Duration::from_micros(50),
            _ => Duration::ZERO,
        }
    })
}

/// How long a reader that awaits the answer to a synchronous call spins before sleeping:
/// `PHOS_SYNC_SPIN_US`, else 2 ms where waiters spin at all. A call such as a 64 MiB copy
/// takes about a millisecond; a reader that slept through it would add a futex wake-up
/// (tens to hundreds of microseconds on an idle CPU) to each hop of its answer, where the
/// application's own thread, natively, spins in the driver.
pub fn default_sync_spin() -> Duration {
    static SPIN: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();
    *SPIN.get_or_init(|| {
        if let Some(us) = std::env::var("PHOS_SYNC_SPIN_US").ok().and_then(|s| s.trim().parse::<u64>().ok()) {
            return Duration::from_micros(us.min(100_000));
        }
        if default_spin().is_zero() { Duration::ZERO } else { Duration::from_millis(2) }
    })
}

/// A mapped region and the socket that tells whether the peer still exists.
struct Region {
    mem: SharedRegion,
    ring_bytes: usize,
    socket: UnixStream,
    spin: Duration,
    /// Until when (nanoseconds after the rings' epoch) a reader of this region spins rather
    /// than sleeps, because an answer is awaited ([`Transport::expect_frame_within`]).
    /// Process local: the peer never sees it.
    spin_until: AtomicU64,
    /// The process that mapped it: a forked child inherits the mapping, and must not close
    /// its parent's channel when it drops its copy.
    pid: u32,
}

impl Drop for Region {
    fn drop(&mut self) {
        // The mapping goes with `mem`.
        peer_watch::forget(self.socket.as_raw_fd());
    }
}

fn region_len(ring_bytes: usize) -> usize {
    CONTROL_BYTES + 2 * ring_bytes
}

impl Region {
    fn control(&self, ring: usize) -> &RingControl<Host> {
        self.mem.atomics(RING_CONTROL[ring])
    }

    fn data(&self, ring: usize) -> VolatileSlice<'_> {
        self.mem.slice(CONTROL_BYTES + ring * self.ring_bytes, self.ring_bytes)
    }

    /// Ring `ring` as the protocol sees it; `hinted`: a reader, who spins while an answer
    /// is awaited.
    fn ring(&self, ring: usize, hinted: bool) -> Ring<'_, Host, VolatileSlice<'_>> {
        Ring {
            ctl: self.control(ring),
            data: self.data(ring),
            size: self.ring_bytes,
            spin: self.spin,
            hint: hinted.then_some(&self.spin_until),
        }
    }

    /// Create a region with rings of `ring_bytes` (rounded up to a power of two).
    fn create(ring_bytes: usize, socket: UnixStream, spin: Duration) -> io::Result<(Region, OwnedFd)> {
        let ring_bytes = ring_bytes.clamp(MIN_RING_BYTES, MAX_RING_BYTES).next_power_of_two();
        let (mem, fd) = SharedRegion::create(c"phos-ring", region_len(ring_bytes))?;
        mem.store::<u64>(0, MAGIC);
        mem.store::<u32>(8, LAYOUT_VERSION);
        mem.store::<u64>(16, ring_bytes as u64);
        let pid = std::process::id();
        Ok((Region { mem, ring_bytes, socket, spin, spin_until: AtomicU64::new(0), pid }, fd))
    }

    /// Map a region the peer created.
    fn attach(fd: OwnedFd, socket: UnixStream, spin: Duration) -> io::Result<Region> {
        let bad = |why: &str| io::Error::new(io::ErrorKind::InvalidData, format!("shared region: {why}"));
        let mem = SharedRegion::attach(&fd, CONTROL_BYTES + 2 * MIN_RING_BYTES, region_len(MAX_RING_BYTES))
            .map_err(|e| bad(&e.to_string()))?;
        let (magic, version, ring_bytes) = (mem.load::<u64>(0), mem.load::<u32>(8), mem.load::<u64>(16));
        if magic != MAGIC || version != LAYOUT_VERSION {
            return Err(bad("bad magic or version"));
        }
        let ring_bytes = ring_bytes as usize;
        if !ring_bytes.is_power_of_two() || region_len(ring_bytes) != mem.len() {
            return Err(bad("ring size does not match the region"));
        }
        let pid = std::process::id();
        Ok(Region { mem, ring_bytes, socket, spin, spin_until: AtomicU64::new(0), pid })
    }

    /// Whether the peer has gone: its end of the socket is closed (it never writes to it
    /// once the rings are in use).
    fn peer_gone(&self) -> bool {
        socket_closed(&self.socket)
    }

    fn ours(&self) -> bool {
        self.pid == std::process::id()
    }

    /// Mark both rings closed and wake anyone waiting on them.
    fn close_all(&self) {
        if !self.ours() {
            return;
        }
        self.mark_closed();
        let _ = self.socket.shutdown(std::net::Shutdown::Both);
    }

    /// The peer is gone: the socket's descriptor is made to name `/dev/null`, so that the
    /// process keeps no socket of a dead connection (CRIU refuses to dump a process holding a
    /// socket whose peer is outside it: `phosctl checkpoint --process`). The region's users
    /// find it closed as before: `/dev/null` polls readable, and its end of file reads as the
    /// peer's.
    fn release_socket(&self) {
        if !self.ours() {
            return;
        }
        // SAFETY: open with a constant NUL-terminated path; no memory is written.
        let null = unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
        if null < 0 {
            return;
        }
        // SAFETY: dup3 replaces the region's own open descriptor (it stays open, now naming
        // /dev/null, and is closed with the region); it touches no memory.
        unsafe { libc::dup3(null, self.socket.as_raw_fd(), libc::O_CLOEXEC) };
        // SAFETY: `null` is the spare descriptor opened above, used by nothing else.
        unsafe { libc::close(null) };
    }

    /// Mark both rings closed and wake their sleepers, on both sides.
    fn mark_closed(&self) {
        for ring in 0..2 {
            self.control(ring).mark_closed();
        }
    }
}

/// Whether the other end of `socket` is closed (or it has something to read, which a
/// channel's socket never has once its rings are in use). Never blocks.
pub(crate) fn socket_closed(socket: &UnixStream) -> bool {
    let mut pfd = libc::pollfd { fd: socket.as_raw_fd(), events: libc::POLLIN, revents: 0 };
    // SAFETY: poll reads and writes the one pollfd on this stack; a zero timeout returns at once.
    let n = unsafe { libc::poll(&mut pfd, 1, 0) };
    n > 0 && pfd.revents != 0
}

/// One thread per process watches the sockets of every shared region for the peer's end:
/// when a peer goes (killed, even, before it could mark its rings closed), its rings are
/// marked closed and their sleepers woken at once, so that sleepers need not look at their
/// socket often, and thousands of idle channels cost no wake-ups.
mod peer_watch {
    use std::collections::HashMap;
    use std::os::fd::RawFd;
    use std::sync::{Mutex, Weak};

    use super::Region;

    struct Watcher {
        /// The process that started the thread: a forked child has the epoll file but not
        /// the thread, and starts its own.
        pid: u32,
        epoll: RawFd,
        regions: HashMap<RawFd, Weak<Region>>,
    }

    static WATCHER: Mutex<Option<Watcher>> = Mutex::new(None);

    /// Watch `region`'s socket `fd` until [`forget`] (or the peer's end).
    pub(super) fn watch(fd: RawFd, region: Weak<Region>) {
        let mut w = WATCHER.lock().unwrap_or_else(|p| p.into_inner());
        if w.as_ref().is_none_or(|w| w.pid != std::process::id()) {
            // SAFETY: epoll_create1 has no memory effects.
            let epoll = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
            if epoll < 0 {
                return; // Sleepers still look at their socket now and then.
            }
            let spawned = std::thread::Builder::new()
                .name("phos-ring-peers".into())
                .stack_size(64 << 10)
                .spawn(move || run(epoll));
            if spawned.is_err() {
                // SAFETY: `epoll` is ours and used by nobody else.
                unsafe { libc::close(epoll) };
                return;
            }
            *w = Some(Watcher { pid: std::process::id(), epoll, regions: HashMap::new() });
        }
        let w = w.as_mut().expect("just made");
        let mut ev = libc::epoll_event {
            events: (libc::EPOLLIN | libc::EPOLLRDHUP | libc::EPOLLONESHOT) as u32,
            u64: fd as u64,
        };
        // SAFETY: epoll_ctl reads the one event it is given; `fd` is the region's open socket.
        if unsafe { libc::epoll_ctl(w.epoll, libc::EPOLL_CTL_ADD, fd, &mut ev) } == 0 {
            w.regions.insert(fd, region);
        }
    }

    /// Stop watching `fd` (its region is going; the socket closes after this).
    pub(super) fn forget(fd: RawFd) {
        let mut w = WATCHER.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(w) = w.as_mut().filter(|w| w.pid == std::process::id())
            && w.regions.remove(&fd).is_some()
        {
            // SAFETY: epoll_ctl with EPOLL_CTL_DEL reads no event.
            unsafe { libc::epoll_ctl(w.epoll, libc::EPOLL_CTL_DEL, fd, std::ptr::null_mut()) };
        }
    }

    fn run(epoll: RawFd) {
        let mut events = [libc::epoll_event { events: 0, u64: 0 }; 64];
        loop {
            // SAFETY: epoll_wait writes at most `events.len()` events into `events`.
            let n = unsafe { libc::epoll_wait(epoll, events.as_mut_ptr(), events.len() as i32, -1) };
            if n < 0 {
                if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return;
            }
            for ev in &events[..n as usize] {
                let fd = ev.u64 as RawFd;
                // Taken out under the lock, so a region being dropped meanwhile is either
                // still found (and alive while we hold it) or already forgotten.
                let region = WATCHER
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .as_mut()
                    .and_then(|w| w.regions.remove(&fd))
                    .and_then(|r| r.upgrade());
                if let Some(r) = region
                    && r.peer_gone()
                {
                    r.mark_closed();
                    r.release_socket();
                }
            }
        }
    }
}

/// The consuming end of one ring.
struct RingRx {
    region: Arc<Region>,
    ring: usize,
    consumer: Consumer,
}

impl RingRx {
    fn wait(&self, deadline: Option<Instant>) -> io::Result<Waited> {
        let region = &*self.region;
        self.consumer.wait(&region.ring(self.ring, true), deadline, || region.peer_gone())
    }
}

impl Read for RingRx {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let region = &*self.region;
        self.consumer.read(&region.ring(self.ring, true), buf, || region.peer_gone())
    }
}

impl Drop for RingRx {
    fn drop(&mut self) {
        if self.region.ours() {
            Consumer::close(self.region.control(self.ring));
        }
    }
}

/// The producing end of one ring.
struct RingTx {
    region: Arc<Region>,
    ring: usize,
    producer: Producer,
}

impl Write for RingTx {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write_vectored(&[IoSlice::new(buf)])
    }

    /// Writes as much of `bufs` as fits, waiting only until at least one byte does.
    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        let region = &*self.region;
        self.producer.write(&region.ring(self.ring, false), bufs, || region.peer_gone())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Drop for RingTx {
    fn drop(&mut self) {
        if self.region.ours() {
            Producer::close(self.region.control(self.ring));
        }
    }
}

/// Which end of a region this is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Made the region and sent it (the router).
    Creator,
    /// Received it (a guest, or an API server from the router).
    Attacher,
}

/// Frames over a pair of shared-memory rings. [`split`](Transport::split) gives a reading
/// and a writing half for two threads.
pub struct ShmTransport {
    region: Arc<Region>,
    rx: Option<RingRx>,
    tx: Option<RingTx>,
    max_payload: u64,
    /// The ring this side reads (also known to the writing half, for
    /// [`Transport::expect_frame_within`]).
    recv_ring: usize,
    /// What the reading side's payload buffer is charged to, if anything.
    claim: Option<BufferClaim>,
}

impl ShmTransport {
    fn from_region(region: Region, role: Role, max_payload: u64) -> Self {
        let region = Arc::new(region);
        peer_watch::watch(region.socket.as_raw_fd(), Arc::downgrade(&region));
        let (send_ring, recv_ring) = match role {
            Role::Creator => (0, 1),
            Role::Attacher => (1, 0),
        };
        // A region we attached may already carry data (never, in the protocol); start
        // from what the peer says, checked like everything it writes.
        let head = region.control(recv_ring).consumer.head.load(Ordering::Acquire);
        let tail = region.control(send_ring).producer.tail.load(Ordering::Acquire);
        ShmTransport {
            rx: Some(RingRx { region: region.clone(), ring: recv_ring, consumer: Consumer::new(head) }),
            tx: Some(RingTx { region: region.clone(), ring: send_ring, producer: Producer::new(tail) }),
            region,
            max_payload,
            recv_ring,
            claim: None,
        }
    }

    /// Create a region, send it to the peer over `socket` with the channel's other shared
    /// files, and carry frames through it.
    pub fn create(socket: UnixStream, ring_bytes: usize, max_payload: u64, extra: SharedFiles<'_>) -> io::Result<Self> {
        let (region, fd) = Region::create(ring_bytes, socket, default_spin())?;
        let mut fds = vec![&fd];
        // Positional: a pinned arena only ever follows a staging region.
        if let Some(st) = extra.staging {
            fds.push(st);
            fds.extend(extra.host_arena);
        }
        send_fds(&region.socket, &fds)?;
        Ok(Self::from_region(region, Role::Creator, max_payload))
    }

    /// Receive a region from the peer over `socket` and carry frames through it; also the
    /// channel's other shared files, if the peer sent them.
    pub fn attach(socket: UnixStream, max_payload: u64) -> io::Result<(Self, Attached)> {
        let mut fds = recv_fds(&socket)?.into_iter();
        let ring = fds.next().expect("at least one");
        let staging = match fds.next() {
            Some(fd) => Some(Staging::attach(fd, socket.try_clone()?)?),
            None => None,
        };
        let host_arena = fds.next();
        let region = Region::attach(ring, socket, default_spin())?;
        Ok((Self::from_region(region, Role::Attacher, max_payload), Attached { staging, host_arena }))
    }

    /// Both ends of one region in this process (tests, benchmarks): a creator and an
    /// attacher, with the given spin.
    pub fn pair(ring_bytes: usize, spin: Duration) -> io::Result<(Self, Self)> {
        let (a, b) = UnixStream::pair()?;
        let (region, fd) = Region::create(ring_bytes, a, spin)?;
        let other = Region::attach(fd, b, spin)?;
        let max = crate::DEFAULT_MAX_PAYLOAD;
        Ok((Self::from_region(region, Role::Creator, max), Self::from_region(other, Role::Attacher, max)))
    }

    /// Each direction's ring size.
    pub fn ring_bytes(&self) -> usize {
        self.region.ring_bytes
    }
}

impl Transport for ShmTransport {
    fn send(&mut self, header: &FrameHeader, payload: &[&[u8]]) -> io::Result<()> {
        match self.tx.as_mut() {
            Some(tx) => write_frame(tx, header, payload),
            None => Err(io::Error::new(io::ErrorKind::Unsupported, "the reading half cannot send")),
        }
    }

    fn recv(&mut self, payload: &mut Vec<u8>) -> Result<FrameHeader, TransportError> {
        match self.rx.as_mut() {
            Some(rx) => read_frame_within(rx, payload, self.max_payload, self.claim.as_mut()),
            None => Err(io::Error::new(io::ErrorKind::Unsupported, "the writing half cannot receive").into()),
        }
    }

    fn wait_readable(&mut self, timeout: Duration) -> bool {
        match self.rx.as_ref() {
            Some(rx) => matches!(rx.wait(Some(Instant::now() + timeout)), Ok(Waited::Ready) | Err(_)),
            None => false,
        }
    }

    fn split(self: Box<Self>) -> io::Result<(Box<dyn Transport>, Box<dyn Transport>)> {
        let me = *self;
        let reading = ShmTransport {
            region: me.region.clone(),
            rx: me.rx,
            tx: None,
            max_payload: me.max_payload,
            recv_ring: me.recv_ring,
            claim: me.claim,
        };
        let writing = ShmTransport {
            region: me.region,
            rx: None,
            tx: me.tx,
            max_payload: me.max_payload,
            recv_ring: me.recv_ring,
            claim: None,
        };
        Ok((Box::new(reading), Box::new(writing)))
    }

    fn shutdown(&self) {
        self.region.close_all();
    }

    fn charge_payloads_to(&mut self, budget: Arc<BufferBudget>) {
        self.claim = Some(BufferClaim::new(budget));
    }

    fn kind(&self) -> crate::handshake::TransportKind {
        crate::handshake::TransportKind::Shm
    }

    fn expect_frame_within(&self, within: Duration) {
        if within.is_zero() || self.region.spin.is_zero() {
            return;
        }
        self.region.spin_until.fetch_max(since_epoch(Instant::now() + within), Ordering::Relaxed);
        // A reader already asleep (idle for longer than its spin) is woken to spin instead.
        let ctl = self.region.control(self.recv_ring);
        fence(Ordering::SeqCst);
        if ctl.consumer.consumer_waiting.load(Ordering::Relaxed) != 0 {
            futex_wake(&ctl.producer.data_seq);
        }
    }
}

/// Send file descriptors over a Unix socket (with one byte of data).
pub fn send_fds(socket: &UnixStream, fds: &[&OwnedFd]) -> io::Result<()> {
    let fds: Vec<_> = fds.iter().map(|fd| fd.as_fd()).collect();
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !control.push(SendAncillaryMessage::ScmRights(&fds)) {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("more than {MAX_FDS} files to send")));
    }
    loop {
        // No SIGPIPE: a guest library must not end its application when the peer is gone.
        match rustix::net::sendmsg(socket, &[IoSlice::new(&[0x52])], &mut control, SendFlags::NOSIGNAL) {
            Ok(1) => return Ok(()),
            Ok(_) => return Err(io::Error::new(io::ErrorKind::WriteZero, "the socket took no byte")),
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
}

/// Send one file descriptor over a Unix socket.
pub fn send_fd(socket: &UnixStream, fd: &OwnedFd) -> io::Result<()> {
    send_fds(socket, &[fd])
}

/// Receive between one and [`MAX_FDS`] file descriptors sent with [`send_fds`]. Anything
/// else is refused, and descriptors that came along anyway are closed. They arrive
/// close-on-exec (`MSG_CMSG_CLOEXEC`): a process another thread starts meanwhile (the
/// router starts API servers for other sessions) must not inherit another session's memory.
pub fn recv_fds(socket: &UnixStream) -> io::Result<Vec<OwnedFd>> {
    let mut byte = [0u8; 1];
    // Room for one more than accepted, so that too many is seen as too many.
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS + 1))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let got = loop {
        let mut iov = [IoSliceMut::new(&mut byte)];
        match rustix::net::recvmsg(socket, &mut iov, &mut control, RecvFlags::CMSG_CLOEXEC) {
            Ok(got) => break got,
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    };
    let mut fds = Vec::new();
    for message in control.drain() {
        if let RecvAncillaryMessage::ScmRights(received) = message {
            fds.extend(received);
        }
    }
    if got.bytes == 0 {
        return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the peer closed before sending the region"));
    }
    if got.flags.contains(ReturnFlags::CTRUNC) || fds.is_empty() || fds.len() > MAX_FDS {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "expected a shared region"));
    }
    Ok(fds)
}

/// Receive exactly one file descriptor.
pub fn recv_fd(socket: &UnixStream) -> io::Result<OwnedFd> {
    let mut fds = recv_fds(socket)?;
    if fds.len() != 1 {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "expected exactly one shared region"));
    }
    Ok(fds.pop().expect("one"))
}

/// The most descriptors one message carries (a ring region, a staging region and a pinned
/// arena).
pub const MAX_FDS: usize = 3;

/// The files that travel with a channel's ring region.
#[derive(Clone, Copy, Default)]
pub struct SharedFiles<'a> {
    /// The staging region for large copies ([`crate::staging`]).
    pub staging: Option<&'a OwnedFd>,
    /// The guest's pinned arena ([`crate::host_arena`]); only sent with a staging region.
    pub host_arena: Option<&'a OwnedFd>,
}

/// What [`ShmTransport::attach`] received besides the rings.
#[derive(Default)]
pub struct Attached {
    pub staging: Option<Staging>,
    /// Unchecked: [`crate::host_arena::checked_len`] says whether it is one.
    pub host_arena: Option<OwnedFd>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::FrameKind;

    fn frame(id: u64, len: usize) -> FrameHeader {
        let mut h = FrameHeader::new(FrameKind::Call);
        h.call_id = id;
        h.payload_len = len as u64;
        h
    }

    fn exchange(spin: Duration) {
        let (a, b) = ShmTransport::pair(8192, spin).unwrap();
        let (mut a, mut b): (Box<dyn Transport>, Box<dyn Transport>) = (Box::new(a), Box::new(b));
        // Frames far larger than the ring: the writer waits for the reader, chunk by chunk.
        let sender = std::thread::spawn(move || {
            for i in 0..40u64 {
                let len = (i as usize * 7919) % (300 << 10);
                let data: Vec<u8> = (0..len).map(|k| (k as u64 ^ i) as u8).collect();
                a.send(&frame(i, len + 2), &[b"ok", &data]).unwrap();
                let mut reply = Vec::new();
                let h = a.recv(&mut reply).unwrap();
                assert_eq!((h.call_id, reply.len()), (i, 8));
                assert_eq!(u64::from_le_bytes(reply[..8].try_into().unwrap()), len as u64);
            }
        });
        let mut buf = Vec::new();
        for i in 0..40u64 {
            let h = b.recv(&mut buf).unwrap();
            assert_eq!(h.call_id, i);
            assert_eq!(&buf[..2], b"ok");
            assert!(buf[2..].iter().enumerate().all(|(k, &x)| x == (k as u64 ^ i) as u8), "frame {i} intact");
            let n = (buf.len() as u64 - 2).to_le_bytes();
            b.send(&frame(i, 8), &[&n]).unwrap();
        }
        sender.join().unwrap();
        // The other end is gone: a clean close between frames.
        assert!(matches!(b.recv(&mut buf), Err(TransportError::Closed)));
    }

    #[test]
    fn frames_larger_than_the_ring_cross_it_sleeping() {
        exchange(Duration::ZERO);
    }

    /// A reader asleep on its ring is woken to spin when its own side expects an answer
    /// (the router's thread carrying a reply back, after it forwarded a synchronous call).
    #[test]
    fn an_expected_answer_wakes_a_sleeping_reader_to_spin() {
        let (a, mut b) = ShmTransport::pair(8192, Duration::from_micros(50)).unwrap();
        let (region, recv_ring) = (a.region.clone(), a.recv_ring);
        let waiting = || region.control(recv_ring).consumer.consumer_waiting.load(Ordering::SeqCst);
        let (mut a_r, a_w) = Box::new(a).split().unwrap();
        let reader = std::thread::spawn(move || {
            let mut buf = Vec::new();
            a_r.recv(&mut buf).map(|h| h.call_id)
        });
        let until = |want: u32| {
            let end = Instant::now() + Duration::from_secs(5);
            while waiting() != want {
                assert!(Instant::now() < end, "the reader's waiting flag never became {want}");
                std::thread::sleep(Duration::from_millis(1));
            }
        };
        until(1);
        a_w.expect_frame_within(Duration::from_secs(2));
        until(0);
        // Still spinning a while later (no sleep in between), then the answer comes.
        std::thread::sleep(Duration::from_millis(30));
        assert_eq!(waiting(), 0);
        let mut h = FrameHeader::new(crate::frame::FrameKind::Reply);
        h.call_id = 7;
        b.send(&h, &[]).unwrap();
        assert_eq!(reader.join().unwrap().unwrap(), 7);
    }

    #[test]
    fn frames_larger_than_the_ring_cross_it_spinning() {
        exchange(Duration::from_micros(200));
    }

    #[test]
    fn a_full_ring_blocks_the_writer_until_the_reader_drains_it() {
        let (a, b) = ShmTransport::pair(4096, Duration::ZERO).unwrap();
        let (mut a, mut b) = (Box::new(a) as Box<dyn Transport>, Box::new(b) as Box<dyn Transport>);
        let writer = std::thread::spawn(move || {
            for i in 0..8u64 {
                a.send(&frame(i, 3000), &[&[i as u8; 3000]]).unwrap();
            }
            a
        });
        std::thread::sleep(Duration::from_millis(50));
        assert!(!writer.is_finished(), "8 frames of 3 KB cannot fit a 4 KiB ring");
        let mut buf = Vec::new();
        for i in 0..8u64 {
            assert_eq!(b.recv(&mut buf).unwrap().call_id, i);
            assert!(buf.iter().all(|&x| x == i as u8));
        }
        drop(writer.join().unwrap());
    }

    #[test]
    fn a_peer_that_vanishes_mid_frame_is_noticed() {
        let (a, b) = ShmTransport::pair(8192, Duration::ZERO).unwrap();
        let mut b = Box::new(b) as Box<dyn Transport>;
        // Half a frame, then the peer dies without closing its rings (as if killed): only
        // its socket closes.
        let mut a = a;
        let tx = a.tx.as_mut().unwrap();
        tx.write_all(&frame(1, 100).encode()).unwrap();
        tx.write_all(&[0u8; 10]).unwrap();
        std::mem::forget(a.rx.take());
        std::mem::forget(a.tx.take());
        a.region.socket.shutdown(std::net::Shutdown::Both).unwrap();
        let t = Instant::now();
        assert!(matches!(b.recv(&mut Vec::new()), Err(TransportError::Io(_))));
        assert!(t.elapsed() < Duration::from_secs(2));
        // And a writer towards it stops too.
        let big = vec![0u8; 64 << 10];
        assert!(b.send(&frame(2, big.len()), &[&big]).is_err());
    }

    #[test]
    fn a_long_asleep_reader_learns_at_once_that_its_peer_vanished() {
        let (a, b) = ShmTransport::pair(8192, Duration::ZERO).unwrap();
        let reader = std::thread::spawn(move || {
            let mut b = Box::new(b) as Box<dyn Transport>;
            let r = b.recv(&mut Vec::new());
            (r.is_err(), Instant::now())
        });
        // Long enough for the reader's own look at its socket to have backed off past a second.
        std::thread::sleep(Duration::from_millis(1500));
        let mut a = a;
        std::mem::forget(a.rx.take());
        std::mem::forget(a.tx.take());
        let gone = Instant::now();
        a.region.socket.shutdown(std::net::Shutdown::Both).unwrap();
        let (failed, noticed) = reader.join().unwrap();
        assert!(failed);
        let late = noticed.duration_since(gone);
        assert!(late < Duration::from_millis(300), "noticed {late:?} after the peer went");
    }

    #[test]
    fn a_scribbling_peer_breaks_only_its_channel() {
        let (a, b) = ShmTransport::pair(4096, Duration::ZERO).unwrap();
        // The peer claims it wrote more than the ring holds.
        a.region.control(0).producer.tail.store(1 << 40, Ordering::SeqCst);
        let mut b = Box::new(b) as Box<dyn Transport>;
        assert!(
            matches!(b.recv(&mut Vec::new()), Err(TransportError::Io(e)) if e.kind() == io::ErrorKind::InvalidData)
        );
        // And that it read what was never written.
        a.region.control(1).consumer.head.store(5, Ordering::SeqCst);
        assert!(b.send(&frame(1, 0), &[]).is_err());
    }

    /// Random indices and random bytes from a hostile writer: the reader answers with frames
    /// or errors, never a panic, a hang or an allocation beyond its limit.
    #[test]
    fn random_scribbles_never_crash_the_reader() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for _ in 0..300 {
            let (a, b) = ShmTransport::pair(4096, Duration::ZERO).unwrap();
            let mut b = Box::new(b) as Box<dyn Transport>;
            let data = a.region.data(0);
            let noise: Vec<u8> = (0..4096 / 8).flat_map(|_| next().to_le_bytes()).collect();
            data.copy_from(&noise);
            if next() % 2 == 0 {
                // A plausible header at the start, with a random length.
                let mut h = frame(1, (next() % (1 << 20)) as usize);
                h.payload_len = next() % (1 << 40);
                data.copy_from(&h.encode());
            }
            let tail = match next() % 3 {
                0 => next() % 4097,
                1 => next(),
                _ => 48 + next() % 64,
            };
            a.region.control(0).producer.tail.store(tail, Ordering::SeqCst);
            // The writer goes away, so a reader that wants more bytes sees the end.
            drop(a);
            let mut buf = Vec::new();
            while b.recv(&mut buf).is_ok() {}
            // A lying length costs at most one read step of memory.
            assert!(buf.capacity() <= 64 << 20);
        }
    }

    #[test]
    fn an_unsealed_or_odd_region_is_refused() {
        let (s1, s2) = UnixStream::pair().unwrap();
        // SAFETY: a plain system call with a NUL-terminated name.
        let raw = unsafe { libc::memfd_create(c"x".as_ptr(), libc::MFD_CLOEXEC) };
        // SAFETY: just created, owned by nobody else.
        let fd = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(raw) };
        std::fs::File::from(fd.try_clone().unwrap()).set_len(region_len(4096) as u64).unwrap();
        send_fd(&s1, &fd).unwrap();
        let err = ShmTransport::attach(s2, 1 << 20).err().unwrap();
        assert!(err.to_string().contains("sealed"), "{err}");
        // No descriptor at all.
        let (s1, s2) = UnixStream::pair().unwrap();
        (&s1).write_all(b"x").unwrap();
        assert!(ShmTransport::attach(s2, 1 << 20).is_err());
    }

    #[test]
    fn wait_readable_times_out_and_wakes() {
        let (a, b) = ShmTransport::pair(8192, Duration::ZERO).unwrap();
        let (mut a, mut b) = (Box::new(a) as Box<dyn Transport>, Box::new(b) as Box<dyn Transport>);
        let t = Instant::now();
        assert!(!b.wait_readable(Duration::from_millis(30)));
        assert!(t.elapsed() >= Duration::from_millis(30));
        a.send(&frame(1, 0), &[]).unwrap();
        assert!(b.wait_readable(Duration::from_secs(5)));
        assert_eq!(b.recv(&mut Vec::new()).unwrap().call_id, 1);
    }

    #[test]
    fn halves_work_from_two_threads_and_shutdown_ends_both() {
        let (a, b) = ShmTransport::pair(8192, Duration::ZERO).unwrap();
        let (mut rx, mut tx) = (Box::new(a) as Box<dyn Transport>).split().unwrap();
        let mut b = Box::new(b) as Box<dyn Transport>;
        let reader = std::thread::spawn(move || {
            let mut buf = Vec::new();
            let mut n = 0;
            while rx.recv(&mut buf).is_ok() {
                n += 1;
            }
            n
        });
        tx.send(&frame(1, 0), &[]).unwrap();
        assert_eq!(b.recv(&mut Vec::new()).unwrap().call_id, 1);
        b.send(&frame(2, 0), &[]).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        tx.shutdown();
        assert_eq!(reader.join().unwrap(), 1);
        assert!(b.recv(&mut Vec::new()).is_err());
    }
}
