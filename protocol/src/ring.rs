//! The protocol of a single-producer, single-consumer byte ring, apart from the memory it
//! lives in: which side writes which word, in which order and with which memory ordering,
//! and how a side that waits sleeps without missing its wake-up.
//!
//! It is generic over a [`Platform`] (the atomic words and the futex) and a [`RingData`]
//! (the ring's bytes) so that the model checker can run the very same code: in production
//! the words are `std` atomics in a [`SharedRegion`](crate::shared::SharedRegion) and the
//! bytes a `vm-memory` volatile slice of it ([`crate::shm`]); under `--cfg loom` they are
//! `loom`'s atomics and cells, and `loom` explores every interleaving and every weak-memory
//! outcome the orderings allow (see the `loom` tests below, and docs/architecture.md).
//!
//! **Indices.** The producer owns `tail`, the consumer `head`; both count bytes since the
//! start, modulo 2^64. Each side keeps its own index privately and only *reads* the other's,
//! checking it (`tail - head` must lie within the ring): a peer that writes nonsense breaks
//! its own channel and nothing else.
//!
//! **Orderings.** The producer copies bytes in, then stores `tail` with `Release`; the
//! consumer loads `tail` with `Acquire` before it copies them out. The consumer stores
//! `head` with `Release` once it has copied bytes out; the producer loads `head` with
//! `Acquire` before it writes over them.
//!
//! **Waking.** A side with nothing to do reads its futex word (`data_seq` for the consumer,
//! `space_seq` for the producer), says it sleeps (`*_waiting`), looks once more and sleeps on
//! the word. The other side changes its index, bumps the word, and after a `SeqCst` fence
//! looks at the flag: it makes the wake-up call only if the flag is set. That fence and the
//! kernel's full barrier inside `FUTEX_WAIT` (before it compares the word) make it
//! impossible for the sleeper to miss the change and the other side to miss the flag both.
//!
//! **Closing.** Either side sets its bit in `closed`. A consumer that finds the ring empty
//! and closed looks at `tail` once more before it reports the end: the producer may have
//! written its last bytes and closed in between (the `loom` tests found that race).

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How soon a side that starts sleeping checks that its peer still exists; the check backs
/// off by doubling while nothing comes, up to [`LIVENESS_CHECK_IDLE`].
pub const LIVENESS_CHECK: Duration = Duration::from_millis(20);

/// How often a side asleep for long checks its peer itself. The process's peer watcher
/// (one thread, an epoll of every region's socket) marks a region closed as soon as its
/// peer goes, so this is only a fallback: an idle channel costs its readers a wake-up every
/// few seconds, and a router with thousands of idle channels stays idle.
pub const LIVENESS_CHECK_IDLE: Duration = Duration::from_secs(5);

pub(crate) const CLOSED_BY_PRODUCER: u32 = 1;
pub(crate) const CLOSED_BY_CONSUMER: u32 = 2;

/// An atomic word as the protocol uses it.
pub(crate) trait Word<T>: Sync {
    fn load(&self, order: Ordering) -> T;
    fn store(&self, value: T, order: Ordering);
    fn fetch_add(&self, value: T, order: Ordering) -> T;
    fn fetch_or(&self, value: T, order: Ordering) -> T;
}

/// Where the protocol runs: its atomic words, fences and futex.
pub(crate) trait Platform {
    type U32: Word<u32>;
    type U64: Word<u64>;
    fn fence(order: Ordering);
    /// Sleep while `word` holds `expected`, at most `timeout`; may return early.
    fn wait(word: &Self::U32, expected: u32, timeout: Duration);
    /// Wake every sleeper on `word`.
    fn wake(word: &Self::U32);
}

macro_rules! word {
    ($atomic:ty, $int:ty) => {
        impl Word<$int> for $atomic {
            fn load(&self, order: Ordering) -> $int {
                <$atomic>::load(self, order)
            }
            fn store(&self, value: $int, order: Ordering) {
                <$atomic>::store(self, value, order)
            }
            fn fetch_add(&self, value: $int, order: Ordering) -> $int {
                <$atomic>::fetch_add(self, value, order)
            }
            fn fetch_or(&self, value: $int, order: Ordering) -> $int {
                <$atomic>::fetch_or(self, value, order)
            }
        }
    };
}

word!(std::sync::atomic::AtomicU32, u32);
word!(std::sync::atomic::AtomicU64, u64);

/// This machine: `std`'s atomics, in memory shared with the peer, and Linux's futex.
pub(crate) struct Host;

impl Platform for Host {
    type U32 = std::sync::atomic::AtomicU32;
    type U64 = std::sync::atomic::AtomicU64;

    fn fence(order: Ordering) {
        std::sync::atomic::fence(order)
    }

    fn wait(word: &Self::U32, expected: u32, timeout: Duration) {
        futex_wait(word, expected, timeout)
    }

    fn wake(word: &Self::U32) {
        futex_wake(word)
    }
}

pub(crate) fn futex_wait(word: &std::sync::atomic::AtomicU32, expected: u32, timeout: Duration) {
    let ts =
        libc::timespec { tv_sec: timeout.as_secs() as libc::time_t, tv_nsec: timeout.subsec_nanos() as libc::c_long };
    // Not FUTEX_PRIVATE: the word is shared with another process.
    // SAFETY: FUTEX_WAIT reads the aligned 32-bit word (an atomic, alive while borrowed) and
    // the timespec on this stack; it writes nothing.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAIT, expected, &ts as *const libc::timespec);
    }
}

pub(crate) fn futex_wake(word: &std::sync::atomic::AtomicU32) {
    // SAFETY: FUTEX_WAKE only uses the word's address to find sleepers; it reads and writes
    // no memory.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, i32::MAX);
    }
}

/// The producer's cache line of a ring's control.
#[repr(C, align(64))]
pub(crate) struct ProducerLine<P: Platform> {
    pub tail: P::U64,
    pub data_seq: P::U32,
    pub producer_waiting: P::U32,
}

/// The consumer's cache line of a ring's control.
#[repr(C, align(64))]
pub(crate) struct ConsumerLine<P: Platform> {
    pub head: P::U64,
    pub space_seq: P::U32,
    pub consumer_waiting: P::U32,
}

/// One ring's control words: a line per writer, and a `closed` word either side sets.
#[repr(C, align(64))]
pub(crate) struct RingControl<P: Platform> {
    pub producer: ProducerLine<P>,
    pub consumer: ConsumerLine<P>,
    pub closed: P::U32,
}

impl<P: Platform> RingControl<P> {
    /// Mark the ring closed by both sides and wake whoever sleeps on it.
    pub fn mark_closed(&self) {
        self.closed.fetch_or(CLOSED_BY_PRODUCER | CLOSED_BY_CONSUMER, Ordering::SeqCst);
        self.producer.data_seq.fetch_add(1, Ordering::SeqCst);
        self.consumer.space_seq.fetch_add(1, Ordering::SeqCst);
        P::wake(&self.producer.data_seq);
        P::wake(&self.consumer.space_seq);
    }
}

/// The bytes of a ring.
pub(crate) trait RingData {
    /// Copy `src` in at `at` (`at + src.len()` is at most the ring's size).
    fn put(&self, at: usize, src: &[u8]);
    /// Copy out into `dst` from `at` (`at + dst.len()` is at most the ring's size).
    fn get(&self, at: usize, dst: &mut [u8]);
}

impl RingData for vm_memory::VolatileSlice<'_> {
    fn put(&self, at: usize, src: &[u8]) {
        self.subslice(at, src.len()).expect("within the ring").copy_from(src);
    }

    fn get(&self, at: usize, dst: &mut [u8]) {
        self.subslice(at, dst.len()).expect("within the ring").copy_to(dst);
    }
}

/// One ring as a side sees it: its control, its bytes, its size (a power of two), and how
/// its waits go.
pub(crate) struct Ring<'a, P: Platform, D: RingData> {
    pub ctl: &'a RingControl<P>,
    pub data: D,
    pub size: usize,
    /// How long a side spins before it sleeps.
    pub spin: Duration,
    /// Until when (nanoseconds after [`epoch`]) a reader spins rather than sleeps, because
    /// an answer is awaited; process local.
    pub hint: Option<&'a AtomicU64>,
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

/// The instant spin hints count from.
pub(crate) fn epoch() -> Instant {
    static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

/// Nanoseconds from [`epoch`] to `t` (the unit of spin hints).
pub(crate) fn since_epoch(t: Instant) -> u64 {
    t.saturating_duration_since(epoch()).as_nanos() as u64
}

/// Wait until `ready()` says so: spin for `spin` (or, while `hint` holds a later deadline,
/// until then), then sleep on the futex `word` (saying so in `waiting`, so the other side
/// knows to wake it), looking whether the peer is gone after [`LIVENESS_CHECK`] and then at
/// doubling intervals up to [`LIVENESS_CHECK_IDLE`], until `deadline` if there is one. A
/// sleeper woken without its condition met spins again while the hint asks for it.
///
/// The other side changes what `ready` looks at, bumps `word`, and after a `SeqCst` fence
/// reads `waiting`. Here the flag is stored before `ready` looks again, and `FUTEX_WAIT`
/// compares `word` after a full barrier of its own: either the other side sees the flag and
/// wakes the sleeper, or the sleeper sees the change (in `ready`, or as a changed `word`
/// that ends its wait at once). The `loom` tests check it: without the other side's fence
/// they find the lost wake-up.
pub(crate) fn wait_until<P: Platform>(
    word: &P::U32,
    waiting: &P::U32,
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
        P::wait(word, seen, nap);
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

/// Publish a change the other side may sleep on: bump `word` and wake the sleeper if it
/// said it sleeps. What the change made visible was stored before, with `Release` or
/// stronger.
pub(crate) fn publish<P: Platform>(word: &P::U32, waiting: &P::U32) {
    word.fetch_add(1, Ordering::Release);
    P::fence(Ordering::SeqCst);
    if waiting.load(Ordering::Relaxed) != 0 {
        P::wake(word);
    }
}

/// The consuming side of a ring.
pub(crate) struct Consumer {
    /// Our own index: never read back from the ring, which the peer can write.
    head: u64,
}

impl Consumer {
    pub fn new(head: u64) -> Self {
        Consumer { head }
    }

    /// Bytes ready to read; an error if the peer's index makes no sense.
    pub fn available<P: Platform, D: RingData>(&self, ring: &Ring<'_, P, D>) -> io::Result<usize> {
        let tail = ring.ctl.producer.tail.load(Ordering::Acquire);
        let n = tail.wrapping_sub(self.head);
        if n > ring.size as u64 {
            return Err(corrupt());
        }
        Ok(n as usize)
    }

    fn closed<P: Platform, D: RingData>(ring: &Ring<'_, P, D>) -> bool {
        ring.ctl.closed.load(Ordering::Acquire) != 0
    }

    /// Wait until there is something to read, the ring is closed, or `deadline` passes.
    pub fn wait<P: Platform, D: RingData>(
        &self,
        ring: &Ring<'_, P, D>,
        deadline: Option<Instant>,
        peer_gone: impl Fn() -> bool,
    ) -> io::Result<Waited> {
        let ctl = ring.ctl;
        let waited = wait_until::<P>(
            &ctl.producer.data_seq,
            &ctl.consumer.consumer_waiting,
            ring.spin,
            ring.hint,
            deadline,
            || Ok(self.available(ring)? > 0 || Self::closed(ring)),
            peer_gone,
        )?;
        if waited == Waited::PeerGone {
            // Killed before it could close its ring: what it wrote is all there will be.
            ctl.closed.fetch_or(CLOSED_BY_PRODUCER, Ordering::SeqCst);
            return Ok(Waited::Ready);
        }
        Ok(waited)
    }

    /// Read what is there into `buf`, waiting until there is something; 0 once the ring is
    /// closed and empty.
    pub fn read<P: Platform, D: RingData>(
        &mut self,
        ring: &Ring<'_, P, D>,
        buf: &mut [u8],
        peer_gone: impl Fn() -> bool,
    ) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let n = loop {
            let n = self.available(ring)?;
            if n > 0 {
                break n;
            }
            if Self::closed(ring) {
                // The producer may have written its last bytes and closed since `available`
                // looked: the close was seen with `Acquire`, so those bytes are visible now.
                match self.available(ring)? {
                    0 => return Ok(0),
                    n => break n,
                }
            }
            self.wait(ring, None, &peer_gone)?;
        };
        let k = n.min(buf.len());
        let off = (self.head as usize) & (ring.size - 1);
        let first = k.min(ring.size - off);
        ring.data.get(off, &mut buf[..first]);
        ring.data.get(0, &mut buf[first..k]);
        self.head = self.head.wrapping_add(k as u64);
        let ctl = ring.ctl;
        ctl.consumer.head.store(self.head, Ordering::Release);
        publish::<P>(&ctl.consumer.space_seq, &ctl.producer.producer_waiting);
        Ok(k)
    }

    /// This side is done: the producer's writes fail from now on.
    pub fn close<P: Platform>(ctl: &RingControl<P>) {
        ctl.closed.fetch_or(CLOSED_BY_CONSUMER, Ordering::SeqCst);
        ctl.consumer.space_seq.fetch_add(1, Ordering::SeqCst);
        P::wake(&ctl.consumer.space_seq);
    }
}

/// The producing side of a ring.
pub(crate) struct Producer {
    /// Our own index: never read back from the ring.
    tail: u64,
}

impl Producer {
    pub fn new(tail: u64) -> Self {
        Producer { tail }
    }

    /// Room to write; an error if the peer's index makes no sense.
    fn room<P: Platform, D: RingData>(&self, ring: &Ring<'_, P, D>) -> io::Result<usize> {
        let head = ring.ctl.consumer.head.load(Ordering::Acquire);
        let used = self.tail.wrapping_sub(head);
        if used > ring.size as u64 {
            return Err(corrupt());
        }
        Ok(ring.size - used as usize)
    }

    fn consumer_closed<P: Platform, D: RingData>(ring: &Ring<'_, P, D>) -> bool {
        ring.ctl.closed.load(Ordering::Acquire) & CLOSED_BY_CONSUMER != 0
    }

    /// Wait until there is room or the consumer has gone.
    fn wait<P: Platform, D: RingData>(&self, ring: &Ring<'_, P, D>, peer_gone: impl Fn() -> bool) -> io::Result<()> {
        let ctl = ring.ctl;
        let waited = wait_until::<P>(
            &ctl.consumer.space_seq,
            &ctl.producer.producer_waiting,
            ring.spin,
            None,
            None,
            || Ok(self.room(ring)? > 0 || Self::consumer_closed(ring)),
            peer_gone,
        )?;
        if waited == Waited::PeerGone {
            ctl.closed.fetch_or(CLOSED_BY_CONSUMER, Ordering::SeqCst);
        }
        Ok(())
    }

    /// Write as much of `bufs` as fits, waiting only until at least one byte does.
    pub fn write<P: Platform, D: RingData, B: std::ops::Deref<Target = [u8]>>(
        &mut self,
        ring: &Ring<'_, P, D>,
        bufs: &[B],
        peer_gone: impl Fn() -> bool,
    ) -> io::Result<usize> {
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        if total == 0 {
            return Ok(0);
        }
        let room = loop {
            if Self::consumer_closed(ring) {
                return Err(io::Error::new(io::ErrorKind::BrokenPipe, "the peer closed the channel"));
            }
            let room = self.room(ring)?;
            if room > 0 {
                break room;
            }
            self.wait(ring, &peer_gone)?;
        };
        let mut left = room.min(total);
        let mut written = 0;
        for b in bufs {
            if left == 0 {
                break;
            }
            let k = b.len().min(left);
            let off = (self.tail as usize) & (ring.size - 1);
            let first = k.min(ring.size - off);
            ring.data.put(off, &b[..first]);
            ring.data.put(0, &b[first..k]);
            self.tail = self.tail.wrapping_add(k as u64);
            left -= k;
            written += k;
        }
        let ctl = ring.ctl;
        ctl.producer.tail.store(self.tail, Ordering::Release);
        publish::<P>(&ctl.producer.data_seq, &ctl.consumer.consumer_waiting);
        Ok(written)
    }

    /// This side is done: the consumer reads what is left, then the end.
    pub fn close<P: Platform>(ctl: &RingControl<P>) {
        ctl.closed.fetch_or(CLOSED_BY_PRODUCER, Ordering::SeqCst);
        ctl.producer.data_seq.fetch_add(1, Ordering::SeqCst);
        P::wake(&ctl.producer.data_seq);
    }
}

/// The ring protocol under the `loom` model checker: every interleaving of a producer and a
/// consumer, and every value the memory orderings let each load see, on a ring smaller than
/// what crosses it (so both sides wrap around and both wait for the other).
///
/// `RUSTFLAGS="--cfg loom" cargo test -p phos-protocol --release --lib ring::loom_tests`, or
/// `make loom`.
#[cfg(all(test, loom))]
mod loom_tests {
    use std::sync::atomic::Ordering;
    use std::time::Duration;

    use ::loom::cell::UnsafeCell;
    use ::loom::sync::atomic::{AtomicU32, AtomicU64};
    use ::loom::sync::{Arc, Condvar, Mutex};

    use super::*;

    word!(AtomicU64, u64);

    /// A futex word: the value, and the kernel's wait queue for it. A sleeper nobody wakes
    /// blocks for ever, which `loom` reports as a deadlock: a lost wake-up fails the test.
    struct Futex {
        value: AtomicU32,
        queue: Mutex<()>,
        woken: Condvar,
    }

    impl Word<u32> for Futex {
        fn load(&self, order: Ordering) -> u32 {
            self.value.load(order)
        }
        fn store(&self, value: u32, order: Ordering) {
            self.value.store(value, order)
        }
        fn fetch_add(&self, value: u32, order: Ordering) -> u32 {
            self.value.fetch_add(value, order)
        }
        fn fetch_or(&self, value: u32, order: Ordering) -> u32 {
            self.value.fetch_or(value, order)
        }
    }

    struct Model;

    impl Platform for Model {
        type U32 = Futex;
        type U64 = AtomicU64;

        fn fence(order: Ordering) {
            ::loom::sync::atomic::fence(order)
        }

        /// As the kernel does: take the queue's lock, a full barrier, compare, and sleep
        /// (without a time limit: the liveness nap would hide a lost wake-up).
        fn wait(word: &Futex, expected: u32, _: Duration) {
            let queued = word.queue.lock().unwrap();
            ::loom::sync::atomic::fence(Ordering::SeqCst);
            if word.value.load(Ordering::Relaxed) == expected {
                drop(word.woken.wait(queued).unwrap());
            }
        }

        fn wake(word: &Futex) {
            let _queued = word.queue.lock().unwrap();
            word.woken.notify_all();
        }
    }

    fn futex() -> Futex {
        Futex { value: AtomicU32::new(0), queue: Mutex::new(()), woken: Condvar::new() }
    }

    /// The ring's bytes, one cell each: `loom` fails the test when a byte is read while it
    /// may still be being written, or written while it may still be being read.
    struct Cells(Vec<UnsafeCell<u8>>);

    impl RingData for &Cells {
        fn put(&self, at: usize, src: &[u8]) {
            for (cell, &b) in self.0[at..at + src.len()].iter().zip(src) {
                // SAFETY: loom checks that no access to this cell races with this one.
                cell.with_mut(|p| unsafe { *p = b });
            }
        }

        fn get(&self, at: usize, dst: &mut [u8]) {
            for (cell, d) in self.0[at..at + dst.len()].iter().zip(dst) {
                // SAFETY: as in `put`.
                *d = cell.with(|p| unsafe { *p });
            }
        }
    }

    struct Shared {
        ctl: RingControl<Model>,
        cells: Cells,
    }

    const SIZE: usize = 2;

    /// Every execution with up to three preemptions (what finds the bugs the orderings can
    /// have, in seconds instead of hours); every weak-memory outcome of each.
    fn model(f: impl Fn() + Sync + Send + 'static) {
        let mut builder = ::loom::model::Builder::new();
        builder.preemption_bound = Some(3);
        builder.check(f);
    }

    fn ring(shared: &Shared) -> Ring<'_, Model, &Cells> {
        Ring { ctl: &shared.ctl, data: &shared.cells, size: SIZE, spin: Duration::ZERO, hint: None }
    }

    fn shared() -> Arc<Shared> {
        let line = || ProducerLine::<Model> { tail: AtomicU64::new(0), data_seq: futex(), producer_waiting: futex() };
        let consumer = ConsumerLine::<Model> { head: AtomicU64::new(0), space_seq: futex(), consumer_waiting: futex() };
        Arc::new(Shared {
            ctl: RingControl { producer: line(), consumer, closed: futex() },
            cells: Cells((0..SIZE).map(|_| UnsafeCell::new(0)).collect()),
        })
    }

    /// Three bytes through a ring of two, written one by one: the producer fills the ring and
    /// waits for room, the consumer drains it and waits for data; the bytes arrive whole and
    /// in order, and neither side misses the other's wake-up.
    #[test]
    fn bytes_cross_a_ring_smaller_than_them() {
        model(|| {
            let s = shared();
            let theirs = s.clone();
            let producer = ::loom::thread::spawn(move || {
                let mut p = Producer::new(0);
                for b in [1u8, 2, 3] {
                    assert_eq!(p.write(&ring(&theirs), &[&[b][..]], || false).unwrap(), 1);
                }
            });
            let mut c = Consumer::new(0);
            let mut got = Vec::new();
            while got.len() < 3 {
                let mut buf = [0u8; 3];
                let n = c.read(&ring(&s), &mut buf[..3 - got.len()], || false).unwrap();
                got.extend_from_slice(&buf[..n]);
            }
            assert_eq!(got, [1, 2, 3]);
            producer.join().unwrap();
        });
    }

    /// A producer that closes its ring after writing: the consumer reads everything, then
    /// the end, however the close and the data interleave with its waits.
    #[test]
    fn a_close_after_data_is_seen_after_the_data() {
        model(|| {
            let s = shared();
            let theirs = s.clone();
            let producer = ::loom::thread::spawn(move || {
                let mut p = Producer::new(0);
                assert_eq!(p.write(&ring(&theirs), &[&[7u8, 8][..]], || false).unwrap(), 2);
                Producer::close(&theirs.ctl);
            });
            let mut c = Consumer::new(0);
            let mut got = Vec::new();
            loop {
                let mut buf = [0u8; 2];
                match c.read(&ring(&s), &mut buf, || false).unwrap() {
                    0 => break,
                    n => got.extend_from_slice(&buf[..n]),
                }
            }
            assert_eq!(got, [7, 8]);
            producer.join().unwrap();
        });
    }
}
