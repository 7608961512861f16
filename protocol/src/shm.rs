//! Shared-memory rings: the transport for a peer on the same host.
//!
//! A channel that starts on a Unix socket can move to a **region** the accepting side creates
//! (a sealed `memfd`) and passes over the socket (`SCM_RIGHTS`). The region holds two
//! single-producer, single-consumer byte rings, one per direction; frames are written into
//! them exactly as onto a socket, so [`read_frame`](crate::transport::read_frame) and
//! [`write_frame`](crate::transport::write_frame) serve both.
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

use std::io::{self, IoSlice, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering, fence};
use std::time::{Duration, Instant};

use crate::frame::FrameHeader;
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

/// How soon a side that starts sleeping checks that its peer still exists; the check backs
/// off by doubling while nothing comes, up to [`LIVENESS_CHECK_IDLE`].
pub const LIVENESS_CHECK: Duration = Duration::from_millis(20);

/// How often a side asleep for long checks its peer itself. The process's peer watcher
/// (one thread, an epoll of every region's socket) marks a region closed as soon as its
/// peer goes, so this is only a fallback: an idle channel costs its readers a wake-up every
/// few seconds, and a router with thousands of idle channels stays idle.
pub const LIVENESS_CHECK_IDLE: Duration = Duration::from_secs(5);

const CLOSED_BY_PRODUCER: u32 = 1;
const CLOSED_BY_CONSUMER: u32 = 2;

#[repr(C, align(64))]
struct ProducerLine {
    tail: AtomicU64,
    data_seq: AtomicU32,
    producer_waiting: AtomicU32,
}

#[repr(C, align(64))]
struct ConsumerLine {
    head: AtomicU64,
    space_seq: AtomicU32,
    consumer_waiting: AtomicU32,
}

#[repr(C, align(64))]
struct RingControl {
    producer: ProducerLine,
    consumer: ConsumerLine,
    closed: AtomicU32,
}

/// How long to spin before sleeping: `PHOS_SPIN_US`, else 50 µs where there are CPUs to
/// spare and none where there are not (a spinning waiter on two CPUs delays the very peer
/// it waits for).
pub fn default_spin() -> Duration {
    if let Some(us) = std::env::var("PHOS_SPIN_US").ok().and_then(|s| s.trim().parse::<u64>().ok()) {
        return Duration::from_micros(us.min(10_000));
    }
    match std::thread::available_parallelism() {
        Ok(n) if n.get() >= 4 => Duration::from_micros(50),
        _ => Duration::ZERO,
    }
}

/// How long a reader that awaits the answer to a synchronous call spins before sleeping:
/// `PHOS_SYNC_SPIN_US`, else 2 ms where waiters spin at all. A call such as a 64 MiB copy
/// takes about a millisecond; a reader that slept through it would add a futex wake-up
/// (tens to hundreds of microseconds on an idle CPU) to each hop of its answer, where the
/// application's own thread, natively, spins in the driver.
pub fn default_sync_spin() -> Duration {
    if let Some(us) = std::env::var("PHOS_SYNC_SPIN_US").ok().and_then(|s| s.trim().parse::<u64>().ok()) {
        return Duration::from_micros(us.min(100_000));
    }
    if default_spin().is_zero() { Duration::ZERO } else { Duration::from_millis(2) }
}

/// A mapped region and the socket that tells whether the peer still exists.
struct Region {
    base: *mut u8,
    len: usize,
    ring_bytes: usize,
    socket: UnixStream,
    spin: Duration,
    /// Until when (nanoseconds after [`epoch`]) a reader of this region spins rather than
    /// sleeps, because an answer is awaited ([`Transport::expect_frame_within`]). Process
    /// local: the peer never sees it.
    spin_until: AtomicU64,
    /// The process that mapped it: a forked child inherits the mapping, and must not close
    /// its parent's channel when it drops its copy.
    pid: u32,
}

// The region is plain shared memory accessed through atomics and bounded copies.
unsafe impl Send for Region {}
unsafe impl Sync for Region {}

impl Drop for Region {
    fn drop(&mut self) {
        peer_watch::forget(self.socket.as_raw_fd());
        unsafe { libc::munmap(self.base as *mut libc::c_void, self.len) };
    }
}

fn region_len(ring_bytes: usize) -> usize {
    CONTROL_BYTES + 2 * ring_bytes
}

/// A `memfd` of `len` bytes, sealed so that its size never changes: the peer gets the same
/// file and can neither shrink it under a mapping (which would fault the mapper) nor grow it.
pub(crate) fn sealed_memfd(name: &std::ffi::CStr, len: u64) -> io::Result<OwnedFd> {
    let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    if unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
    if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

/// Map a file the peer sent, whole, once it is sealed against shrinking (so it can never be
/// cut short under the mapping) and its size is within `min..=max`.
pub(crate) fn map_sealed(fd: &OwnedFd, min: usize, max: usize) -> io::Result<(*mut u8, usize)> {
    let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
    if seals < 0 || seals & libc::F_SEAL_SHRINK == 0 {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "not sealed against shrinking"));
    }
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let len = st.st_size as usize;
    if !(min..=max).contains(&len) {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "wrong size"));
    }
    let p = unsafe {
        libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd.as_raw_fd(), 0)
    };
    if p == libc::MAP_FAILED { Err(io::Error::last_os_error()) } else { Ok((p as *mut u8, len)) }
}

/// The instant [`Region::spin_until`] counts from.
fn epoch() -> Instant {
    static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

/// Nanoseconds from [`epoch`] to `t` (the unit of [`Region::spin_until`]).
fn since_epoch(t: Instant) -> u64 {
    t.saturating_duration_since(epoch()).as_nanos() as u64
}

impl Region {
    fn control(&self, ring: usize) -> &RingControl {
        unsafe { &*(self.base.add(RING_CONTROL[ring]) as *const RingControl) }
    }

    fn data(&self, ring: usize) -> *mut u8 {
        unsafe { self.base.add(CONTROL_BYTES + ring * self.ring_bytes) }
    }

    fn map(fd: &OwnedFd, len: usize) -> io::Result<*mut u8> {
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED { Err(io::Error::last_os_error()) } else { Ok(p as *mut u8) }
    }

    /// Create a region with rings of `ring_bytes` (rounded up to a power of two).
    fn create(ring_bytes: usize, socket: UnixStream, spin: Duration) -> io::Result<(Region, OwnedFd)> {
        let ring_bytes = ring_bytes.clamp(MIN_RING_BYTES, MAX_RING_BYTES).next_power_of_two();
        let len = region_len(ring_bytes);
        let fd = sealed_memfd(c"phos-ring", len as u64)?;
        let base = Self::map(&fd, len)?;
        unsafe {
            (base as *mut u64).write(MAGIC);
            (base.add(8) as *mut u32).write(LAYOUT_VERSION);
            (base.add(16) as *mut u64).write(ring_bytes as u64);
        }
        Ok((Region { base, len, ring_bytes, socket, spin, spin_until: AtomicU64::new(0), pid: std::process::id() }, fd))
    }

    /// Map a region the peer created.
    fn attach(fd: OwnedFd, socket: UnixStream, spin: Duration) -> io::Result<Region> {
        let bad = |why: &str| io::Error::new(io::ErrorKind::InvalidData, format!("shared region: {why}"));
        let (base, len) = map_sealed(&fd, CONTROL_BYTES + 2 * MIN_RING_BYTES, region_len(MAX_RING_BYTES))
            .map_err(|e| bad(&e.to_string()))?;
        let mut region =
            Region { base, len, ring_bytes: 0, socket, spin, spin_until: AtomicU64::new(0), pid: std::process::id() };
        let (magic, version, ring_bytes) = unsafe {
            ((base as *const u64).read(), (base.add(8) as *const u32).read(), (base.add(16) as *const u64).read())
        };
        if magic != MAGIC || version != LAYOUT_VERSION {
            return Err(bad("bad magic or version"));
        }
        let ring_bytes = ring_bytes as usize;
        if !ring_bytes.is_power_of_two() || region_len(ring_bytes) != len {
            return Err(bad("ring size does not match the region"));
        }
        region.ring_bytes = ring_bytes;
        Ok(region)
    }

    /// Whether the peer has gone: its end of the socket is closed (it never writes to it
    /// once the rings are in use).
    fn peer_gone(&self) -> bool {
        let mut pfd = libc::pollfd { fd: self.socket.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        let n = unsafe { libc::poll(&mut pfd, 1, 0) };
        n > 0 && pfd.revents != 0
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

    /// Mark both rings closed and wake their sleepers, on both sides.
    fn mark_closed(&self) {
        for ring in 0..2 {
            let c = self.control(ring);
            c.closed.fetch_or(CLOSED_BY_PRODUCER | CLOSED_BY_CONSUMER, Ordering::SeqCst);
            c.producer.data_seq.fetch_add(1, Ordering::SeqCst);
            c.consumer.space_seq.fetch_add(1, Ordering::SeqCst);
            futex_wake(&c.producer.data_seq);
            futex_wake(&c.consumer.space_seq);
        }
    }
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
                }
            }
        }
    }
}

pub(crate) fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let ts =
        libc::timespec { tv_sec: timeout.as_secs() as libc::time_t, tv_nsec: timeout.subsec_nanos() as libc::c_long };
    // Not FUTEX_PRIVATE: the word is shared with another process.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAIT, expected, &ts as *const libc::timespec);
    }
}

pub(crate) fn futex_wake(word: &AtomicU32) {
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, i32::MAX);
    }
}

fn corrupt() -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, "the peer corrupted the shared ring")
}

/// What a wait ended with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Waited {
    Ready,
    TimedOut,
    PeerGone,
}

/// Wait until `ready()` says so: spin for `spin` (or, while `hint` holds a later deadline,
/// until then; see [`ShmTransport::expect_frame_within`]), then sleep on the futex `word`
/// (saying so in `waiting`, so the other side knows to wake it), looking whether the peer is
/// gone after [`LIVENESS_CHECK`] and then at doubling intervals up to
/// [`LIVENESS_CHECK_IDLE`], until `deadline` if there is one. A sleeper
/// woken without its condition met spins again while the hint asks for it. The other side
/// changes `word` and then reads `waiting`; the `SeqCst` store and re-check here make a lost
/// wake-up impossible.
pub(crate) fn wait_until(
    word: &AtomicU32,
    waiting: &AtomicU32,
    spin: Duration,
    hint: Option<&AtomicU64>,
    deadline: Option<Instant>,
    mut ready: impl FnMut() -> io::Result<bool>,
    peer_gone: impl Fn() -> bool,
) -> io::Result<Waited> {
    if ready()? {
        return Ok(Waited::Ready);
    }
    let start = Instant::now();
    if deadline.is_some_and(|d| d <= start) {
        return Ok(Waited::TimedOut);
    }
    let hinted = |now: Instant| hint.is_some_and(|h| h.load(Ordering::Relaxed) > since_epoch(now));
    let mut spin_until = start + spin;
    let mut liveness = LIVENESS_CHECK;
    loop {
        let mut spins = 0u32;
        while !spin.is_zero() {
            // Looked at on every turn: a pause costs about 140 cycles on current server CPUs,
            // so looking once per 64 of them would leave each hop of a call microseconds late.
            std::hint::spin_loop();
            if ready()? {
                return Ok(Waited::Ready);
            }
            spins += 1;
            if spins.is_multiple_of(64) {
                let now = Instant::now();
                if (now >= spin_until && !hinted(now)) || deadline.is_some_and(|d| now >= d) {
                    break;
                }
            }
        }
        let seen = word.load(Ordering::Acquire);
        waiting.store(1, Ordering::SeqCst);
        if ready()? {
            waiting.store(0, Ordering::Relaxed);
            return Ok(Waited::Ready);
        }
        let now = Instant::now();
        let mut nap = liveness;
        liveness = (liveness * 2).min(LIVENESS_CHECK_IDLE);
        if let Some(d) = deadline {
            if now >= d {
                waiting.store(0, Ordering::Relaxed);
                return Ok(Waited::TimedOut);
            }
            nap = nap.min(d - now);
        }
        futex_wait(word, seen, nap);
        waiting.store(0, Ordering::Relaxed);
        if ready()? {
            return Ok(Waited::Ready);
        }
        if peer_gone() {
            return Ok(Waited::PeerGone);
        }
        // Woken with nothing to read: spin again only if an answer is awaited now.
        spin_until = Instant::now();
    }
}

/// The consuming end of one ring.
struct RingRx {
    region: Arc<Region>,
    ring: usize,
    /// Our own index: never read back from the region, which the peer can write.
    head: u64,
}

impl RingRx {
    fn ctl(&self) -> &RingControl {
        self.region.control(self.ring)
    }

    /// Bytes ready to read; an error if the peer's index makes no sense.
    fn available(&self) -> io::Result<usize> {
        let tail = self.ctl().producer.tail.load(Ordering::Acquire);
        let n = tail.wrapping_sub(self.head);
        if n > self.region.ring_bytes as u64 {
            return Err(corrupt());
        }
        Ok(n as usize)
    }

    fn closed(&self) -> bool {
        self.ctl().closed.load(Ordering::Acquire) != 0
    }

    /// Wait until there is something to read, the ring is closed, or `deadline` passes.
    fn wait(&self, deadline: Option<Instant>) -> io::Result<Waited> {
        let ctl = self.ctl();
        let waited = wait_until(
            &ctl.producer.data_seq,
            &ctl.consumer.consumer_waiting,
            self.region.spin,
            Some(&self.region.spin_until),
            deadline,
            || Ok(self.available()? > 0 || self.closed()),
            || self.region.peer_gone(),
        )?;
        if waited == Waited::PeerGone {
            // Killed before it could close its ring: what it wrote is all there will be.
            ctl.closed.fetch_or(CLOSED_BY_PRODUCER, Ordering::SeqCst);
            return Ok(Waited::Ready);
        }
        Ok(waited)
    }
}

impl Read for RingRx {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let n = loop {
            let n = self.available()?;
            if n > 0 {
                break n;
            }
            if self.closed() {
                return Ok(0);
            }
            self.wait(None)?;
        };
        let cap = self.region.ring_bytes;
        let k = n.min(buf.len());
        let off = (self.head as usize) & (cap - 1);
        let first = k.min(cap - off);
        let data = self.region.data(self.ring);
        unsafe {
            std::ptr::copy_nonoverlapping(data.add(off), buf.as_mut_ptr(), first);
            std::ptr::copy_nonoverlapping(data, buf.as_mut_ptr().add(first), k - first);
        }
        self.head = self.head.wrapping_add(k as u64);
        let ctl = self.ctl();
        ctl.consumer.head.store(self.head, Ordering::Release);
        ctl.consumer.space_seq.fetch_add(1, Ordering::Release);
        fence(Ordering::SeqCst);
        if ctl.producer.producer_waiting.load(Ordering::Relaxed) != 0 {
            futex_wake(&ctl.consumer.space_seq);
        }
        Ok(k)
    }
}

impl Drop for RingRx {
    fn drop(&mut self) {
        if !self.region.ours() {
            return;
        }
        let ctl = self.ctl();
        ctl.closed.fetch_or(CLOSED_BY_CONSUMER, Ordering::SeqCst);
        ctl.consumer.space_seq.fetch_add(1, Ordering::SeqCst);
        futex_wake(&ctl.consumer.space_seq);
    }
}

/// The producing end of one ring.
struct RingTx {
    region: Arc<Region>,
    ring: usize,
    tail: u64,
}

impl RingTx {
    fn ctl(&self) -> &RingControl {
        self.region.control(self.ring)
    }

    /// Room to write; an error if the peer's index makes no sense.
    fn room(&self) -> io::Result<usize> {
        let head = self.ctl().consumer.head.load(Ordering::Acquire);
        let used = self.tail.wrapping_sub(head);
        if used > self.region.ring_bytes as u64 {
            return Err(corrupt());
        }
        Ok(self.region.ring_bytes - used as usize)
    }

    fn consumer_closed(&self) -> bool {
        self.ctl().closed.load(Ordering::Acquire) & CLOSED_BY_CONSUMER != 0
    }

    /// Wait until there is room or the consumer has gone.
    fn wait(&self) -> io::Result<()> {
        let ctl = self.ctl();
        let waited = wait_until(
            &ctl.consumer.space_seq,
            &ctl.producer.producer_waiting,
            self.region.spin,
            None,
            None,
            || Ok(self.room()? > 0 || self.consumer_closed()),
            || self.region.peer_gone(),
        )?;
        if waited == Waited::PeerGone {
            ctl.closed.fetch_or(CLOSED_BY_CONSUMER, Ordering::SeqCst);
        }
        Ok(())
    }

    fn publish(&self) {
        let ctl = self.ctl();
        ctl.producer.tail.store(self.tail, Ordering::Release);
        ctl.producer.data_seq.fetch_add(1, Ordering::Release);
        fence(Ordering::SeqCst);
        if ctl.consumer.consumer_waiting.load(Ordering::Relaxed) != 0 {
            futex_wake(&ctl.producer.data_seq);
        }
    }
}

impl Write for RingTx {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write_vectored(&[IoSlice::new(buf)])
    }

    /// Writes as much of `bufs` as fits, waiting only until at least one byte does.
    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        if total == 0 {
            return Ok(0);
        }
        let room = loop {
            if self.consumer_closed() {
                return Err(io::Error::new(io::ErrorKind::BrokenPipe, "the peer closed the channel"));
            }
            let room = self.room()?;
            if room > 0 {
                break room;
            }
            self.wait()?;
        };
        let cap = self.region.ring_bytes;
        let data = self.region.data(self.ring);
        let mut left = room.min(total);
        let mut written = 0;
        for b in bufs {
            if left == 0 {
                break;
            }
            let k = b.len().min(left);
            let off = (self.tail as usize) & (cap - 1);
            let first = k.min(cap - off);
            unsafe {
                std::ptr::copy_nonoverlapping(b.as_ptr(), data.add(off), first);
                std::ptr::copy_nonoverlapping(b.as_ptr().add(first), data, k - first);
            }
            self.tail = self.tail.wrapping_add(k as u64);
            left -= k;
            written += k;
        }
        self.publish();
        Ok(written)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Drop for RingTx {
    fn drop(&mut self) {
        if !self.region.ours() {
            return;
        }
        let ctl = self.ctl();
        ctl.closed.fetch_or(CLOSED_BY_PRODUCER, Ordering::SeqCst);
        ctl.producer.data_seq.fetch_add(1, Ordering::SeqCst);
        futex_wake(&ctl.producer.data_seq);
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
            rx: Some(RingRx { region: region.clone(), ring: recv_ring, head }),
            tx: Some(RingTx { region: region.clone(), ring: send_ring, tail }),
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
    let byte = [0x52u8];
    let mut iov = libc::iovec { iov_base: byte.as_ptr() as *mut libc::c_void, iov_len: 1 };
    let data_len = std::mem::size_of_val(&[0 as libc::c_int][..]) * fds.len();
    let space = unsafe { libc::CMSG_SPACE(data_len as u32) } as usize;
    let mut control = vec![0u8; space];
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr() as *mut libc::c_void;
    msg.msg_controllen = space as _;
    unsafe {
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = libc::CMSG_LEN(data_len as u32) as _;
        let data = libc::CMSG_DATA(cmsg) as *mut libc::c_int;
        for (i, fd) in fds.iter().enumerate() {
            data.add(i).write_unaligned(fd.as_raw_fd());
        }
    }
    loop {
        let n = unsafe { libc::sendmsg(socket.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
        if n == 1 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Send one file descriptor over a Unix socket.
pub fn send_fd(socket: &UnixStream, fd: &OwnedFd) -> io::Result<()> {
    send_fds(socket, &[fd])
}

/// Receive between one and [`MAX_FDS`] file descriptors sent with [`send_fds`]. Anything
/// else is refused, and descriptors that came along anyway are closed.
pub fn recv_fds(socket: &UnixStream) -> io::Result<Vec<OwnedFd>> {
    let mut byte = [0u8; 1];
    let mut iov = libc::iovec { iov_base: byte.as_mut_ptr() as *mut libc::c_void, iov_len: 1 };
    let space = unsafe { libc::CMSG_SPACE((MAX_FDS * std::mem::size_of::<libc::c_int>()) as u32) } as usize;
    let mut control = vec![0u8; space];
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr() as *mut libc::c_void;
    msg.msg_controllen = space as _;
    let n = loop {
        let n = unsafe { libc::recvmsg(socket.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if n >= 0 {
            break n;
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    };
    let mut fds = Vec::new();
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(cmsg) as *const libc::c_int;
                let count =
                    ((*cmsg).cmsg_len as usize - libc::CMSG_LEN(0) as usize) / std::mem::size_of::<libc::c_int>();
                for i in 0..count {
                    fds.push(OwnedFd::from_raw_fd(data.add(i).read_unaligned()));
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
    }
    if n == 0 {
        return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the peer closed before sending the region"));
    }
    if msg.msg_flags & libc::MSG_CTRUNC != 0 || fds.is_empty() || fds.len() > MAX_FDS {
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
            for i in 0..4096 / 8 {
                unsafe { (data as *mut u64).add(i).write(next()) };
            }
            if next() % 2 == 0 {
                // A plausible header at the start, with a random length.
                let mut h = frame(1, (next() % (1 << 20)) as usize);
                h.payload_len = next() % (1 << 40);
                unsafe { std::ptr::copy_nonoverlapping(h.encode().as_ptr(), data, 48) };
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
        let fd = unsafe { libc::memfd_create(c"x".as_ptr(), libc::MFD_CLOEXEC) };
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        assert_eq!(unsafe { libc::ftruncate(fd.as_raw_fd(), region_len(4096) as libc::off_t) }, 0);
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
