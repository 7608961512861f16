//! The staging region: where a channel's bulk host data moves between the guest and the API
//! server without going through frames (and so without the router copying it).
//!
//! A channel on shared memory gets one from the router, which sends the same sealed `memfd`
//! to both ends. It holds a control page and two slots. A large copy travels as one call
//! (`phosMemcpyStaged`) while both ends move the data through the slots in chunks: the
//! producer (the guest for host-to-device, the server for device-to-host) fills slot
//! `k % 2` with chunk `k` and counts it in `filled`; the consumer empties it and counts it in
//! `drained`. The guest copies chunk `k + 1` while the server's DMA moves chunk `k`; the server
//! registers the region with the driver, so that DMA reads and writes it directly.
//!
//! | offset | what |
//! |---|---|
//! | 0 | magic `PHOSSTAG`, slot size (u64) |
//! | 64 | `filled` (u32, a futex), `filled_waiting` |
//! | 128 | `drained` (u32, a futex), `drained_waiting` |
//! | 192 | `abort` (u32): either side gave up on the copy in progress |
//! | 256 | posted answer: call id (u64), then its length (u32) |
//! | 512 | posted answer: its payload, up to [`POSTED_ANSWER_MAX`] bytes |
//! | 4096 | slot 0, then slot 1 |
//!
//! Counts are chunk numbers modulo 2^32 that only grow: a copy starts where the last one
//! ended, at the `seq` its call names. Neither end trusts the other's counts beyond "this
//! chunk is ready": a guest that lies only spoils its own copy.
//!
//! The **posted answer** is a synchronous call's successful answer that the server also
//! writes here, right before it sends the answer's frame through the router: a guest thread
//! spinning for the answer returns on it, one hop (the router's) sooner, and takes the
//! frame in later. The server only writes it, never reads it (a guest that scribbles on it
//! spoils only its own answers); it writes one only when every frame it sent the channel
//! since the guest last had to read them may be read late (see the API server's
//! `PostedAnswers`). A call's id is unique in its process, so an answer left there never
//! passes for a later call's.

use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering, fence};
use std::time::{Duration, Instant};

use vm_memory::VolatileSlice;

use crate::ring::{Host, Waited, futex_wake, wait_until};
use crate::shared::SharedRegion;
use crate::shm::socket_closed;

const MAGIC: u64 = u64::from_le_bytes(*b"PHOSSTAG");
const CONTROL_BYTES: usize = 4096;
const FILLED: usize = 64;
const DRAINED: usize = 128;
const ABORT: usize = 192;
const ANSWER_ID: usize = 256;
const ANSWER_LEN: usize = 264;
const ANSWER_BYTES: usize = 512;

/// The largest answer payload the server posts in the region (most synchronous calls
/// answer a few words).
pub const POSTED_ANSWER_MAX: usize = 1024;

/// Each slot's size unless configured otherwise.
pub const DEFAULT_SLOT_BYTES: usize = 8 << 20;
pub const MIN_SLOT_BYTES: usize = 64 << 10;
pub const MAX_SLOT_BYTES: usize = 256 << 20;

/// How long a side waits for the other to move at all before it gives the copy up.
pub const STALL_LIMIT: Duration = Duration::from_secs(60);

/// Which count a side waits on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Count {
    Filled,
    Drained,
}

/// Why a wait ended without the chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum StagingError {
    #[error("the other side gave the copy up")]
    Aborted,
    #[error("the other side went away")]
    PeerGone,
    #[error("the other side did not move for {0:?}")]
    Stalled(Duration),
    /// The caller's `stop` condition held (the call was answered: it will never move).
    #[error("the copy's call was answered before its data moved")]
    Answered,
}

/// A mapped staging region.
pub struct Staging {
    mem: SharedRegion,
    slot_bytes: usize,
    /// The channel's socket: closed means the peer is gone.
    socket: UnixStream,
    pid: u32,
    /// Whether the server registered the region with its driver.
    pub registered: AtomicBool,
}

/// Create a sealed staging file with two slots of `slot_bytes` (rounded to whole pages); the
/// creator (the router) only passes it on.
pub fn create(slot_bytes: usize) -> io::Result<OwnedFd> {
    let slot_bytes = slot_bytes.clamp(MIN_SLOT_BYTES, MAX_SLOT_BYTES).next_multiple_of(4096);
    let (mem, fd) = SharedRegion::create(c"phos-staging", CONTROL_BYTES + 2 * slot_bytes)?;
    mem.store::<u64>(0, MAGIC);
    mem.store::<u64>(8, slot_bytes as u64);
    Ok(fd)
}

impl Staging {
    /// Map a staging file the router sent; `socket` is the channel's, for liveness.
    pub fn attach(fd: OwnedFd, socket: UnixStream) -> io::Result<Staging> {
        let bad = |why: &str| io::Error::new(io::ErrorKind::InvalidData, format!("staging region: {why}"));
        let mem = SharedRegion::attach(&fd, CONTROL_BYTES + 2 * MIN_SLOT_BYTES, CONTROL_BYTES + 2 * MAX_SLOT_BYTES)
            .map_err(|e| bad(&e.to_string()))?;
        let (magic, slot) = (mem.load::<u64>(0), mem.load::<u64>(8));
        if magic != MAGIC || CONTROL_BYTES as u64 + 2 * slot != mem.len() as u64 {
            return Err(bad("bad magic or slot size"));
        }
        let pid = std::process::id();
        Ok(Staging { mem, slot_bytes: slot as usize, socket, pid, registered: AtomicBool::new(false) })
    }

    pub fn slot_bytes(&self) -> usize {
        self.slot_bytes
    }

    /// Both slots, as one range of host memory: their address and length, for registering
    /// them with a driver (whose DMA then reads and writes them).
    pub fn slots_range(&self) -> (u64, u64) {
        (self.mem.as_ptr() as u64 + CONTROL_BYTES as u64, 2 * self.slot_bytes as u64)
    }

    /// Slot `k % 2`, for volatile copies: the other side writes it too (by the protocol only
    /// while it holds the chunk; a hostile one at any time).
    pub fn slot(&self, k: u32) -> VolatileSlice<'_> {
        self.mem.slice(CONTROL_BYTES + (k as usize % 2) * self.slot_bytes, self.slot_bytes)
    }

    fn word(&self, offset: usize) -> &AtomicU32 {
        self.mem.atomics(offset)
    }

    fn count_word(&self, c: Count) -> (&AtomicU32, &AtomicU32) {
        let at = match c {
            Count::Filled => FILLED,
            Count::Drained => DRAINED,
        };
        (self.word(at), self.word(at + 4))
    }

    pub fn count(&self, c: Count) -> u32 {
        self.count_word(c).0.load(Ordering::Acquire)
    }

    /// Publish a new count and wake a waiter.
    pub fn set(&self, c: Count, value: u32) {
        let (word, waiting) = self.count_word(c);
        word.store(value, Ordering::Release);
        fence(Ordering::SeqCst);
        if waiting.load(Ordering::Relaxed) != 0 {
            futex_wake(word);
        }
    }

    /// Give the copy in progress up (the other side's waits end with
    /// [`StagingError::Aborted`]).
    pub fn abort(&self) {
        self.word(ABORT).store(1, Ordering::SeqCst);
        for c in [Count::Filled, Count::Drained] {
            futex_wake(self.count_word(c).0);
        }
    }

    /// Post call `call_id`'s successful answer (the server, before it sends the answer's
    /// frame). False, posting nothing, when the payload is over [`POSTED_ANSWER_MAX`].
    pub fn post_answer(&self, call_id: u64, payload: &[u8]) -> bool {
        if payload.len() > POSTED_ANSWER_MAX {
            return false;
        }
        if !payload.is_empty() {
            self.mem.slice(ANSWER_BYTES, payload.len()).copy_from(payload);
        }
        self.word(ANSWER_LEN).store(payload.len() as u32, Ordering::Relaxed);
        // The id last, released: a guest that sees it sees the payload and its length.
        self.mem.atomics::<AtomicU64>(ANSWER_ID).store(call_id, Ordering::Release);
        true
    }

    /// Whether the answer posted is call `call_id`'s; if so its payload replaces `out`'s
    /// contents (the guest, while it waits for that answer: the server posts nothing more
    /// before the guest's next call). A length past the limit (a guest scribbling on its own
    /// region) is taken for no answer.
    pub fn take_answer(&self, call_id: u64, out: &mut Vec<u8>) -> bool {
        if self.mem.atomics::<AtomicU64>(ANSWER_ID).load(Ordering::Acquire) != call_id {
            return false;
        }
        let len = self.word(ANSWER_LEN).load(Ordering::Relaxed) as usize;
        if len > POSTED_ANSWER_MAX {
            return false;
        }
        out.clear();
        out.resize(len, 0);
        if len > 0 {
            self.mem.slice(ANSWER_BYTES, len).copy_to(out.as_mut_slice());
        }
        true
    }

    pub fn clear_abort(&self) {
        self.word(ABORT).store(0, Ordering::SeqCst);
    }

    fn aborted(&self) -> bool {
        self.word(ABORT).load(Ordering::Acquire) != 0
    }

    fn peer_gone(&self) -> bool {
        // Only the region's own process may judge: a forked child's copy is not its channel.
        self.pid == std::process::id() && socket_closed(&self.socket)
    }

    /// Wait until count `c` has reached `target` (counting from `seq`, modulo 2^32).
    pub fn wait(&self, c: Count, seq: u32, target: u32, spin: Duration) -> Result<(), StagingError> {
        self.wait_or(c, seq, target, spin, || false)
    }

    /// [`wait`](Self::wait), also giving up ([`StagingError::Answered`]) as soon as `stop`
    /// says so: a guest watches for its call's answer, so a copy the other side refused
    /// without aborting the region (an answer from the router, say) ends at once instead of
    /// after [`STALL_LIMIT`]. `stop` is asked while spinning and after each sleep (at least
    /// every 20 ms), never before the count itself, and the count is looked at again after
    /// `stop` says yes: the other side sets its count before it answers.
    pub fn wait_or(
        &self,
        c: Count,
        seq: u32,
        target: u32,
        spin: Duration,
        mut stop: impl FnMut() -> bool,
    ) -> Result<(), StagingError> {
        let (word, waiting) = self.count_word(c);
        let mut stopped = false;
        let waited = wait_until::<Host>(
            word,
            waiting,
            spin,
            None,
            Some(Instant::now() + STALL_LIMIT),
            || {
                let reached = || word.load(Ordering::Acquire).wrapping_sub(seq) >= target.wrapping_sub(seq);
                if reached() {
                    Ok(true)
                } else if self.aborted() {
                    Err(io::Error::other("aborted"))
                } else if stop() {
                    // The other side publishes its count before it answers: an answer seen
                    // now may have come just after the count was looked at, so look again
                    // (without this, a copy that went through was taken for a refused one).
                    if reached() {
                        return Ok(true);
                    }
                    stopped = true;
                    Err(io::Error::other("stopped"))
                } else {
                    Ok(false)
                }
            },
            || self.peer_gone(),
        );
        match waited {
            Ok(Waited::Ready) => Ok(()),
            Ok(Waited::TimedOut) => Err(StagingError::Stalled(STALL_LIMIT)),
            Ok(Waited::PeerGone) => Err(StagingError::PeerGone),
            Err(_) if stopped => Err(StagingError::Answered),
            Err(_) => Err(StagingError::Aborted),
        }
    }
}

/// The chunks a copy of `count` bytes takes with slots of `slot` bytes.
pub fn chunks(count: u64, slot: usize) -> u64 {
    count.div_ceil(slot as u64)
}

#[cfg(test)]
mod tests {
    use std::os::fd::FromRawFd;

    use super::*;

    fn pair() -> (Staging, Staging) {
        let fd = create(MIN_SLOT_BYTES).unwrap();
        let dup = fd.try_clone().unwrap();
        let (a, b) = UnixStream::pair().unwrap();
        (Staging::attach(fd, a).unwrap(), Staging::attach(dup, b).unwrap())
    }

    /// A producer and a consumer move 40 chunks through the two slots, each waiting for
    /// the other, as a host-to-device copy does.
    #[test]
    fn chunks_flow_through_two_slots() {
        let (producer, consumer) = pair();
        let slot = producer.slot_bytes();
        let seq = producer.count(Count::Filled);
        let n = 40u32;
        let t = std::thread::spawn(move || {
            let mut sum = 0u64;
            for k in 0..n {
                consumer.wait(Count::Filled, seq, seq + k + 1, Duration::ZERO).unwrap();
                let mut chunk = vec![0u8; slot];
                consumer.slot(k).copy_to(&mut chunk);
                assert!(chunk.iter().all(|&b| b == k as u8), "chunk {k}");
                sum += chunk[0] as u64;
                consumer.set(Count::Drained, seq + k + 1);
            }
            sum
        });
        for k in 0..n {
            if k >= 2 {
                producer.wait(Count::Drained, seq, seq + k - 1, Duration::ZERO).unwrap();
            }
            producer.slot(k).copy_from(&vec![k as u8; slot]);
            producer.set(Count::Filled, seq + k + 1);
        }
        assert_eq!(t.join().unwrap(), (0..n as u64).sum::<u64>());
    }

    #[test]
    fn an_abort_or_a_vanished_peer_ends_a_wait() {
        let (a, b) = pair();
        let t = std::thread::spawn(move || a.wait(Count::Filled, 0, 1, Duration::ZERO));
        std::thread::sleep(Duration::from_millis(30));
        b.abort();
        assert_eq!(t.join().unwrap(), Err(StagingError::Aborted));
        b.clear_abort();

        let (a, b) = pair();
        let t = std::thread::spawn(move || a.wait(Count::Drained, 0, 1, Duration::ZERO));
        b.socket.shutdown(std::net::Shutdown::Both).unwrap();
        assert_eq!(t.join().unwrap(), Err(StagingError::PeerGone));
    }

    /// A waiter whose stop condition comes true while it sleeps gives up within a liveness
    /// interval, not after the stall limit; a count that is already there wins over it.
    #[test]
    fn a_stop_condition_ends_a_wait_quickly() {
        let (a, _b) = pair();
        let answered = std::sync::Arc::new(AtomicBool::new(false));
        let flag = answered.clone();
        let t = std::thread::spawn(move || {
            let start = Instant::now();
            let r = a.wait_or(Count::Filled, 0, 1, Duration::ZERO, || flag.load(Ordering::Relaxed));
            (r, start.elapsed())
        });
        std::thread::sleep(Duration::from_millis(50));
        answered.store(true, Ordering::Relaxed);
        let (r, took) = t.join().unwrap();
        assert_eq!(r, Err(StagingError::Answered));
        assert!(took < Duration::from_secs(2), "gave up after {took:?}");

        let (a, b) = pair();
        b.set(Count::Filled, 1);
        assert_eq!(a.wait_or(Count::Filled, 0, 1, Duration::ZERO, || true), Ok(()));
    }

    /// The other side sets its last count and then answers: a waiter that sees the answer
    /// right after it looked at the count (the two arriving between its two looks) still
    /// finds the count, and the copy is not taken for a refused one.
    #[test]
    fn a_count_published_just_before_the_answer_wins() {
        let (a, b) = pair();
        let r = a.wait_or(Count::Filled, 0, 1, Duration::ZERO, || {
            b.set(Count::Filled, 1);
            true
        });
        assert_eq!(r, Ok(()));
    }

    /// A posted answer is taken by its call only, whole; one too long is not posted, and a
    /// length scribbled past the limit is no answer.
    #[test]
    fn a_posted_answer_is_its_calls_only() {
        let (server, guest) = pair();
        let mut out = vec![9u8; 3];
        assert!(!guest.take_answer(1, &mut out), "nothing posted yet");
        assert!(server.post_answer(7, &[1, 2, 3, 4]));
        assert!(!guest.take_answer(6, &mut out));
        assert!(guest.take_answer(7, &mut out));
        assert_eq!(out, [1, 2, 3, 4]);
        assert!(server.post_answer(8, &[]));
        assert!(guest.take_answer(8, &mut out));
        assert!(out.is_empty());
        assert!(!server.post_answer(9, &vec![0; POSTED_ANSWER_MAX + 1]));
        assert!(!guest.take_answer(9, &mut out));
        assert!(server.post_answer(10, &[5; POSTED_ANSWER_MAX]));
        guest.word(ANSWER_LEN).store(u32::MAX, Ordering::Relaxed);
        assert!(!guest.take_answer(10, &mut out));
    }

    #[test]
    fn an_unsealed_file_is_refused() {
        // SAFETY: a plain system call with a NUL-terminated name.
        let raw = unsafe { libc::memfd_create(c"x".as_ptr(), libc::MFD_CLOEXEC) };
        // SAFETY: just created, owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        std::fs::File::from(fd.try_clone().unwrap()).set_len((CONTROL_BYTES + 2 * MIN_SLOT_BYTES) as u64).unwrap();
        let (a, _b) = UnixStream::pair().unwrap();
        assert!(Staging::attach(fd, a).is_err());
    }
}
