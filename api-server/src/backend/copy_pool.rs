//! Page-locked buffers and copy lanes (a stream and an event) for the C/R engine, made once
//! per server and reused by every checkpoint, restore and migration.
//!
//! Page-locking host memory (`cuMemHostRegister`) and creating streams take a lock of the
//! driver's that every other call of the process waits for: measured on the H100, each
//! 8 MiB buffer took 2-4 ms to lock, and a copy-on-write checkpoint that locked its sixteen
//! copy buffers held up the session's own launches for as long, at every checkpoint. Made
//! when the server starts (before it has a session) they cost the session nothing.
//!
//! A lane's event is created with blocking synchronisation: a copy thread waiting for its
//! piece sleeps instead of spinning on a core, so sixteen copy threads on a sixteen-core
//! host leave the session's thread the CPU it needs to issue its launches.
//!
//! Lanes are few ([`LANES`] a device, or `PHOS_COPY_LANES`) and lent for one piece at a time: the copy threads
//! (one per core, for the checksums and the image's writes) share them, so that no more
//! copies are queued at once than the host link needs to stay busy. With a lane per thread,
//! sixteen 8 MiB copies queued together held the driver's lock for the session's launches
//! 2-5 ms at a time (measured on the H100). A copy that runs beside the session (a
//! copy-on-write checkpoint) takes at most [`BESIDE_SESSION_LANES`] of them: on the H100,
//! eight copies in flight sped a held 1 GiB copy from 16 to 24 GB/s in one run (and were
//! within the spread between machines in another: docs/perf.md, C9-C10), but slowed the
//! session's launches during a concurrent one (34% against 13%) and sped it not at all.

use parking_lot::{Condvar, Mutex};
use phos_protocol::CudaError;

use super::prelude::*;
use super::{Raw, StreamRef};

/// `CU_STREAM_NON_BLOCKING`: lanes never wait on the legacy default stream.
const NON_BLOCKING: u32 = 1;
/// `CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING`
const SLEEPING_EVENT: u32 = 0x1 | 0x2;
/// Copies in flight on one device at most, unless `PHOS_COPY_LANES` says otherwise (1-16),
/// while the session is held or a restore loads its memory.
pub const LANES: usize = 8;

/// Copies in flight on one device at most while the session runs beside them.
pub const BESIDE_SESSION_LANES: usize = 4;

/// The lanes made for each device: [`LANES`], or `PHOS_COPY_LANES` (1 to 16) where set.
pub fn lanes_per_device() -> usize {
    lanes_from(std::env::var("PHOS_COPY_LANES").ok().as_deref())
}

fn lanes_from(setting: Option<&str>) -> usize {
    match setting.map(str::trim).map(str::parse::<usize>) {
        Some(Ok(n @ 1..=16)) => n,
        Some(_) => {
            tracing::warn!("PHOS_COPY_LANES must be a number from 1 to 16; using {LANES}");
            LANES
        }
        None => LANES,
    }
}

/// A stream of its own on one device and an event to wait for its copies with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CopyLane {
    pub device: i32,
    pub stream: Raw,
    pub event: Raw,
}

/// The buffers and lanes kept for the engine.
#[derive(Default)]
pub struct CopyPool {
    /// Buffers of `buffer_len` bytes, page-locked.
    buffers: Mutex<Vec<Vec<u8>>>,
    buffer_len: Mutex<usize>,
    /// How many buffers are kept at most (those made ready).
    keep: Mutex<usize>,
    /// Free lanes and how many of each device's are lent; how many each device has in all.
    lanes: Mutex<Lanes>,
    lane_counts: Mutex<Vec<usize>>,
    lane_freed: Condvar,
    /// Where [`prepare`](Self::prepare) is: users wait for what they need of it (the lanes,
    /// a buffer) rather than make their own buffers and streams beside it.
    preparing: Mutex<Preparation>,
    /// Signalled when the lanes are made, each buffer, and the end.
    prepared: Condvar,
}

#[derive(Default)]
struct Preparation {
    under_way: bool,
    lanes_made: bool,
}

#[derive(Default)]
struct Lanes {
    free: Vec<CopyLane>,
    lent: Vec<usize>,
}

/// How long a checkpoint, restore or migration waits for a server's buffers and lanes still
/// being made (about a second on an H100) before it goes on without them.
const PREPARED_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

impl CopyPool {
    /// Say that [`prepare`](Self::prepare) is coming (on another thread): from now on users
    /// wait for it.
    pub fn expect_preparation(&self) {
        self.preparing.lock().under_way = true;
    }

    /// Make `buffers` page-locked buffers of `len` bytes and the copy lanes of every device
    /// of `backend`. What fails is logged; the engine then makes its own as before.
    pub fn prepare(&self, backend: &dyn Backend, buffers: usize, len: usize) {
        let start = std::time::Instant::now();
        self.preparing.lock().under_way = true;
        *self.buffer_len.lock() = len;
        *self.keep.lock() = buffers;
        self.make_lanes(backend);
        self.preparing.lock().lanes_made = true;
        self.prepared.notify_all();
        // Each buffer is free as soon as it is made: a checkpoint or restore that comes
        // meanwhile (the first of a server started for it) starts with those made, instead
        // of waiting for all of them.
        for _ in 0..buffers {
            let mut buf = vec![0u8; len];
            backend.pin_host(&mut buf);
            // Under the preparation's lock: a user checks for a buffer and waits under it.
            let _state = self.preparing.lock();
            self.buffers.lock().push(buf);
            self.prepared.notify_all();
        }
        self.preparing.lock().under_way = false;
        self.prepared.notify_all();
        tracing::info!(
            "copy buffers for checkpoints ready: {buffers} of {len} bytes page-locked, {} copy lanes, in {:.1} ms",
            self.lane_counts.lock().iter().sum::<usize>(),
            start.elapsed().as_secs_f64() * 1e3
        );
    }

    /// Make [`lanes_per_device`] lanes on every device of `backend` (first: they take a few
    /// milliseconds, the buffers most of a second).
    fn make_lanes(&self, backend: &dyn Backend) {
        let devices = backend.device_count().max(0);
        let mut counts = vec![0; devices as usize];
        for device in 0..devices {
            for _ in 0..lanes_per_device() {
                match Self::make_lane(backend, device) {
                    Ok(lane) => {
                        self.lanes.lock().free.push(lane);
                        counts[device as usize] += 1;
                    }
                    Err(e) => {
                        tracing::warn!("making copy lanes for checkpoints on device {device}: {e:?}");
                        break;
                    }
                }
            }
        }
        self.lanes.lock().lent = vec![0; counts.len()];
        *self.lane_counts.lock() = counts;
    }

    fn make_lane(backend: &dyn Backend, device: i32) -> Result<CopyLane, CudaError> {
        let stream = backend.stream_create(device, NON_BLOCKING, 0)?;
        // The lane's first work is done here, not in the first checkpoint or restore: the
        // driver may set up a stream's queue and an event's wait on their first use.
        let made = backend.event_create(device, SLEEPING_EVENT).and_then(|event| {
            let first =
                backend.event_record(event, StreamRef::Created(stream)).and_then(|_| backend.event_synchronize(event));
            match first {
                Ok(()) => Ok(event),
                Err(e) => {
                    let _ = backend.event_destroy(event);
                    Err(e)
                }
            }
        });
        match made {
            Ok(event) => Ok(CopyLane { device, stream, event }),
            Err(e) => {
                let _ = backend.stream_destroy(stream);
                Err(e)
            }
        }
    }

    /// A kept buffer of at least `len` bytes (the pool's size; its contents are an earlier
    /// copy's), if one is free.
    pub fn take_buffer(&self, len: usize) -> Option<Vec<u8>> {
        // While the buffers are being made, the next one made is waited for (a bounded time):
        // taken under the preparation's lock, so that of several waiters each gets its own.
        let deadline = std::time::Instant::now() + PREPARED_WAIT;
        let mut preparing = self.preparing.lock();
        loop {
            let size = *self.buffer_len.lock();
            if size != 0 && len > size {
                return None;
            }
            if size != 0
                && let Some(buf) = self.buffers.lock().pop()
            {
                return Some(buf);
            }
            if !preparing.under_way {
                return None;
            }
            if self.prepared.wait_until(&mut preparing, deadline).timed_out() {
                tracing::warn!("copy buffers still being made after {PREPARED_WAIT:?}: going on without them");
                return None;
            }
        }
    }

    /// Keep `buf` (page-locked) for the next user, if it is one of the pool's size and the
    /// pool has room; otherwise hand it back.
    pub fn give_buffer(&self, buf: Vec<u8>) -> Result<(), Vec<u8>> {
        let mut kept = self.buffers.lock();
        if buf.len() != *self.buffer_len.lock() || kept.len() >= *self.keep.lock() {
            return Err(buf);
        }
        kept.push(buf);
        Ok(())
    }

    /// A lane on `device`, waiting for one to be given back while all are lent or `at_most`
    /// of the device's are; `None` where the device has none.
    pub fn take_lane(&self, device: i32, at_most: usize) -> Option<CopyLane> {
        self.wait_prepared(|p| p.lanes_made);
        let d = usize::try_from(device).ok()?;
        let has = self.lane_counts.lock().get(d).copied().unwrap_or(0);
        if has == 0 {
            return None;
        }
        let at_most = at_most.max(1);
        let mut lanes = self.lanes.lock();
        loop {
            if lanes.lent.get(d).is_some_and(|&n| n < at_most)
                && let Some(i) = lanes.free.iter().position(|l| l.device == device)
            {
                lanes.lent[d] += 1;
                return Some(lanes.free.swap_remove(i));
            }
            self.lane_freed.wait(&mut lanes);
        }
    }

    /// Wait (a bounded time) while a [`prepare`](Self::prepare) is under way, until `ready`
    /// says what the caller needs of it is made (checked under the preparation's lock, which
    /// `prepare` holds as it makes each thing and signals).
    fn wait_prepared(&self, ready: impl Fn(&Preparation) -> bool) {
        let deadline = std::time::Instant::now() + PREPARED_WAIT;
        let mut preparing = self.preparing.lock();
        while preparing.under_way && !ready(&preparing) {
            if self.prepared.wait_until(&mut preparing, deadline).timed_out() {
                tracing::warn!("copy buffers still being made after {PREPARED_WAIT:?}: going on without them");
                return;
            }
        }
    }

    /// Give back a lane [`take_lane`](Self::take_lane) gave, idle.
    pub fn give_lane(&self, lane: CopyLane) {
        let mut lanes = self.lanes.lock();
        if let Some(n) = usize::try_from(lane.device).ok().and_then(|d| lanes.lent.get_mut(d)) {
            *n = n.saturating_sub(1);
        }
        lanes.free.push(lane);
        drop(lanes);
        // Every waiter: one held back by its own limit must not take the only wake-up.
        self.lane_freed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::emu::EmuBackend;

    #[test]
    fn the_lane_count_is_read_from_the_environment_within_bounds() {
        assert_eq!(lanes_from(None), LANES);
        assert_eq!(lanes_from(Some("8")), 8);
        assert_eq!(lanes_from(Some(" 1 ")), 1);
        assert_eq!(lanes_from(Some("0")), LANES);
        assert_eq!(lanes_from(Some("17")), LANES);
        assert_eq!(lanes_from(Some("many")), LANES);
    }

    #[test]
    fn users_wait_for_a_preparation_under_way() {
        let emu = std::sync::Arc::new(EmuBackend::new(64 << 20));
        let pool = std::sync::Arc::new(CopyPool::default());
        pool.expect_preparation();
        let (p, b) = (pool.clone(), emu.clone());
        let maker = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(100));
            p.prepare(b.as_ref(), 1, 4096);
        });
        // Without the wait, this finds the pool empty and the caller makes its own.
        assert!(pool.take_buffer(4096).is_some(), "the buffer being made was waited for");
        maker.join().unwrap();
    }

    #[test]
    fn buffers_and_lanes_are_reused_and_only_those_of_the_pools_size_kept() {
        let emu = EmuBackend::new(64 << 20);
        let pool = CopyPool::default();
        pool.prepare(&emu, 2, 4096);
        let a = pool.take_buffer(4096).expect("a kept buffer");
        let b = pool.take_buffer(4096).expect("a second one");
        assert!(pool.take_buffer(100).is_none(), "two were made");
        assert!(pool.give_buffer(vec![0; 100]).is_err(), "only the pool's size is kept");
        pool.give_buffer(a).unwrap();
        let a = pool.take_buffer(100).expect("a smaller request gets a kept buffer");
        assert_eq!(a.len(), 4096);
        assert!(pool.take_buffer(8192).is_none(), "a larger one does not");
        pool.give_buffer(a).unwrap();
        pool.give_buffer(b).unwrap();
        assert!(pool.give_buffer(vec![0; 4096]).is_err(), "no more than were made");
        let lanes: Vec<CopyLane> = (0..LANES).map(|_| pool.take_lane(0, LANES).expect("a lane")).collect();
        assert_ne!(lanes[0].stream, lanes[1].stream);
        assert!(pool.take_lane(1, LANES).is_none(), "emu has one device");
        // All lent: the next taker waits until one comes back.
        std::thread::scope(|s| {
            let waiter = s.spawn(|| pool.take_lane(0, LANES));
            std::thread::sleep(std::time::Duration::from_millis(50));
            assert!(!waiter.is_finished(), "no lane was free");
            pool.give_lane(lanes[2]);
            assert_eq!(waiter.join().unwrap(), Some(lanes[2]));
        });
    }

    #[test]
    fn a_copy_beside_the_session_takes_no_more_than_its_share_of_lanes() {
        let emu = EmuBackend::new(64 << 20);
        let pool = CopyPool::default();
        pool.prepare(&emu, 0, 4096);
        let beside: Vec<CopyLane> =
            (0..BESIDE_SESSION_LANES).map(|_| pool.take_lane(0, BESIDE_SESSION_LANES).expect("a lane")).collect();
        std::thread::scope(|s| {
            let capped = s.spawn(|| pool.take_lane(0, BESIDE_SESSION_LANES));
            std::thread::sleep(std::time::Duration::from_millis(50));
            assert!(!capped.is_finished(), "free lanes, but this copy's share is lent");
            // A held copy may still take the rest.
            let held = pool.take_lane(0, LANES).expect("a lane past the share");
            assert!(!capped.is_finished());
            pool.give_lane(held);
            assert!(!capped.is_finished(), "the share is still lent");
            pool.give_lane(beside[0]);
            assert!(capped.join().unwrap().is_some(), "one of the share came back");
        });
    }
}
