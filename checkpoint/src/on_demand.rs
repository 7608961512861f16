//! On-demand restore: the session is served as soon as its objects are recreated, and its
//! memory is loaded behind it.
//!
//! The protocol (docs/architecture.md, "On-demand restore"): the restore replays the image's
//! records ([`engine::recreate`](crate::engine::recreate)), marks every region of memory
//! pending in a [`PendingMemory`] and installs it as the session's hook, then lets the
//! session serve its calls while [`load`] copies the chunks in on several threads. The hook
//! holds each call that reads or writes memory still pending; a held call's ranges are
//! wanted ([`PendingMemory::wanted`]), and the loaders take the chunks that cover them before
//! any other, the oldest call's first. A chunk is marked loaded only once its copy is complete on the device,
//! so a call let through never sees memory half-written by the restore, and a call's own
//! writes can never be overwritten by it afterwards.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::engine::{CrError, DeviceCopier, LoadStages, PendingMemory, Rebuild};
use crate::report::Progress;
use crate::{Chunk, ChunkReader, Encoding, Manifest};

/// One chunk to load: where its bytes go, and where they come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Piece {
    addr: u64,
    device: i32,
    chunk: Chunk,
}

/// Every chunk of an image by where it goes, and which of them a loader has taken.
pub struct LoadPlan {
    /// In image order (regions in manifest order, chunks in region order).
    pieces: Vec<Piece>,
    /// Device address -> index in `pieces`.
    by_addr: BTreeMap<u64, usize>,
    taken: Vec<AtomicBool>,
    /// Where the loaders' walk through `pieces` in image order is.
    cursor: AtomicUsize,
}

impl LoadPlan {
    /// The chunks of `manifest`'s regions, each region going to `targets[i]` (address,
    /// device) as [`Rebuild::region_target`] answered.
    pub fn new(manifest: &Manifest, targets: &[(u64, i32)]) -> Self {
        let pieces: Vec<Piece> = manifest
            .memory
            .iter()
            .zip(targets)
            .flat_map(|(r, &(addr, device))| {
                r.chunks.iter().map(move |c| Piece { addr: addr + c.offset, device, chunk: *c })
            })
            .collect();
        let by_addr = pieces.iter().enumerate().map(|(i, p)| (p.addr, i)).collect();
        let taken = pieces.iter().map(|_| AtomicBool::new(false)).collect();
        LoadPlan { pieces, by_addr, taken, cursor: AtomicUsize::new(0) }
    }

    /// The ranges the plan loads, as (address, length): what is pending before it starts.
    pub fn ranges(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.pieces.iter().map(|p| (p.addr, p.chunk.len))
    }

    /// Bytes the plan loads.
    pub fn bytes(&self) -> u64 {
        self.pieces.iter().map(|p| p.chunk.len).sum()
    }

    fn take(&self, i: usize) -> bool {
        !self.taken[i].swap(true, Ordering::AcqRel)
    }

    /// A chunk no loader has taken that covers part of `[addr, addr + len)`.
    fn take_within(&self, addr: u64, len: u64) -> Option<usize> {
        let end = addr.saturating_add(len);
        // The chunk starting at or before `addr`, then those starting inside the range.
        let first = self.by_addr.range(..=addr).next_back().map_or(addr, |(&a, _)| a);
        self.by_addr.range(first..end).map(|(_, &i)| i).find(|&i| self.take(i))
    }

    /// The next chunk to load: one that a held call waits for if there is such a chunk no
    /// loader has taken, else the next in image order. `None`: every chunk is taken.
    fn next(&self, pending: &PendingMemory) -> Option<usize> {
        // The oldest call's ranges first; chunks other loaders have in flight are skipped.
        if let Some(i) = pending.wanted().into_iter().find_map(|(addr, len)| self.take_within(addr, len)) {
            return Some(i);
        }
        loop {
            let i = self.cursor.fetch_add(1, Ordering::Relaxed);
            if i >= self.pieces.len() {
                return None;
            }
            if self.take(i) {
                return Some(i);
            }
        }
    }
}

/// Load every chunk of `plan` into `target` on `workers` threads, each with its own copier
/// (its own copy stream) and buffer, reading from `reader` (which checks each chunk's
/// checksum): the chunks held calls want first ([`LoadPlan::next`]), then the rest in image
/// order. Each chunk is marked loaded in `pending` once its copy is complete on the device.
/// `pace` is waited before each chunk (a test's way to make the load slow; zero otherwise).
/// `all_loaded` is called as soon as nothing is pending any more, before the calls that
/// waited for the last chunk run.
///
/// The first failure stops the load and is returned; the caller then fails `pending`, so
/// that the calls held (and later calls that need memory not loaded) fail rather than wait.
#[allow(clippy::too_many_arguments)] // what a load needs, none of it shared with another
pub fn load<T: Rebuild + ?Sized>(
    target: &T,
    plan: &LoadPlan,
    reader: &dyn ChunkReader,
    pending: &PendingMemory,
    progress: &Progress,
    workers: usize,
    pace: Duration,
    all_loaded: &(dyn Fn() + Sync),
) -> Result<(), CrError> {
    let largest = plan.pieces.iter().map(|p| p.chunk.len as usize).max().unwrap_or(0).max(1);
    let workers = workers.clamp(1, plan.pieces.len().max(1));
    let stages = LoadStages::default();
    let started = Instant::now();
    let states = crate::engine::load_workers(target, workers, largest, "load")?;
    let failed = AtomicBool::new(false);
    let loaded = std::thread::scope(|scope| {
        let handles: Vec<_> = states
            .into_iter()
            .map(|(mut copier, mut free)| {
                let (failed, stages) = (&failed, &stages);
                scope.spawn(move || {
                    // The piece whose copy is behind this thread, not yet marked loaded.
                    let mut behind: Option<Piece> = None;
                    // A piece is marked loaded only once its copy is complete on the device.
                    let mark = |p: Piece| {
                        progress.add(p.chunk.len);
                        pending.loaded_then(p.addr, p.chunk.len, all_loaded);
                    };
                    let done = |copier: &mut dyn DeviceCopier, behind: &mut Option<Piece>| {
                        let t = Instant::now();
                        let waited = copier.wait_behind();
                        stages.waited(t);
                        if let Some(p) = behind.take()
                            && waited.is_ok()
                        {
                            mark(p);
                        }
                        waited
                    };
                    let r = (|| {
                        while !failed.load(Ordering::Relaxed)
                            && let Some(i) = plan.next(pending)
                        {
                            if !pace.is_zero() {
                                std::thread::sleep(pace);
                            }
                            let piece = plan.pieces[i];
                            if piece.chunk.encoding == Encoding::Zero {
                                free.extend(done(copier.as_mut(), &mut behind)?);
                                let t = Instant::now();
                                copier.zero(piece.device, piece.addr, piece.chunk.len)?;
                                // `zero` only queues.
                                copier.finish()?;
                                stages.zeroed(t);
                                mark(piece);
                                continue;
                            }
                            let mut buf = match free.pop() {
                                Some(b) => b,
                                None => done(copier.as_mut(), &mut behind)?.unwrap_or_else(|| copier.buffer(largest)),
                            };
                            let t = Instant::now();
                            reader.read_into(&piece.chunk, &mut buf)?;
                            stages.read(t, started);
                            // The copy queued before this one is complete once `write_behind`
                            // returns: that piece is loaded.
                            let t = Instant::now();
                            let freed = copier.write_behind(piece.device, piece.addr, buf, piece.chunk.len as usize);
                            stages.queued(t);
                            if let Some(p) = behind.take()
                                && freed.is_ok()
                            {
                                mark(p);
                            }
                            free.extend(freed?);
                            behind = Some(piece);
                            // A call waits for memory: what is copied is let go at once rather
                            // than after the next chunk's read.
                            if pending.next_wanted().is_some() {
                                free.extend(done(copier.as_mut(), &mut behind)?);
                            }
                        }
                        free.extend(done(copier.as_mut(), &mut behind)?);
                        copier.finish()
                    })();
                    if r.is_err() {
                        failed.store(true, Ordering::Relaxed);
                    }
                    r
                })
            })
            .collect();
        let mut result = Ok(());
        for h in handles {
            let r = h.join().unwrap_or(Err(CrError::Thread("load")));
            if result.is_ok() {
                result = r;
            }
        }
        result
    });
    stages.report(workers, started);
    loaded
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::AtomicU64;
    use std::time::Instant;

    use parking_lot::Mutex;
    use phos_protocol::spec::{CallAccess, DeviceAccess};

    use super::*;
    use crate::engine::{CallHook, HostBuffer};
    use crate::{ImageError, MemoryRegion, Record, RegionKind};

    const BASE: u64 = 0x10_0000;
    const CHUNK: u64 = 4096;

    /// Device memory in a vector, written by copiers that count their chunks.
    #[derive(Default)]
    struct Device {
        bytes: Mutex<Vec<u8>>,
        chunks: AtomicU64,
    }

    struct Copier(Arc<Device>);

    impl DeviceCopier for Copier {
        fn buffer(&self, len: usize) -> HostBuffer {
            HostBuffer::new(len, None)
        }
        fn read(&mut self, _: i32, _: u64, _: &mut [u8]) -> Result<(), CrError> {
            unreachable!("a restore only writes")
        }
        fn write(&mut self, _: i32, addr: u64, data: &[u8]) -> Result<(), CrError> {
            let at = (addr - BASE) as usize;
            self.0.bytes.lock()[at..at + data.len()].copy_from_slice(data);
            self.0.chunks.fetch_add(1, Ordering::Relaxed);
            Ok(())
        }
        fn zero(&mut self, _: i32, addr: u64, len: u64) -> Result<(), CrError> {
            let at = (addr - BASE) as usize;
            self.0.bytes.lock()[at..at + len as usize].fill(0);
            self.0.chunks.fetch_add(1, Ordering::Relaxed);
            Ok(())
        }
        fn finish(&mut self) -> Result<(), CrError> {
            Ok(())
        }
    }

    impl Rebuild for Arc<Device> {
        fn set_handle_counters(&self, _: &[(String, u64)]) {}
        fn replay(&self, _: &Record, _: Option<i32>) -> Result<(), CrError> {
            Ok(())
        }
        fn region_target(&self, r: &MemoryRegion, _: Option<i32>) -> Result<(u64, i32), CrError> {
            Ok((r.addr, 0))
        }
        fn copier(&self) -> Result<Box<dyn DeviceCopier + '_>, CrError> {
            Ok(Box::new(Copier(self.clone())))
        }
    }

    /// An image's stored bytes: chunk `at` is where its bytes start; `bad` fails that chunk.
    struct Stored {
        bytes: Vec<u8>,
        bad: Option<u64>,
    }

    impl ChunkReader for Stored {
        fn read_into(&self, c: &Chunk, out: &mut [u8]) -> Result<(), ImageError> {
            if self.bad == Some(c.at) {
                return Err(ImageError::Corrupted("a memory chunk fails its checksum".into()));
            }
            out[..c.len as usize].copy_from_slice(&self.bytes[c.at as usize..(c.at + c.len) as usize]);
            Ok(())
        }
    }

    /// Two regions of `chunks` chunks each: contents `i as u8` per byte of chunk `i` (every
    /// fourth chunk zero).
    fn image(chunks: u64) -> (Manifest, Vec<u8>) {
        let mut stored = Vec::new();
        let mut memory = Vec::new();
        for region in 0..2u64 {
            let addr = BASE + region * chunks * CHUNK;
            let mut list = Vec::new();
            for k in 0..chunks {
                let i = region * chunks + k;
                let zero = i % 4 == 3;
                let (encoding, at) = if zero { (Encoding::Zero, 0) } else { (Encoding::Raw, stored.len() as u64) };
                if !zero {
                    stored.extend(std::iter::repeat_n(i as u8, CHUNK as usize));
                }
                let stored_len = if zero { 0 } else { CHUNK };
                list.push(Chunk { offset: k * CHUNK, len: CHUNK, encoding, stored: stored_len, file: 0, at, crc: 0 });
            }
            let kind = RegionKind::Allocation;
            memory.push(MemoryRegion { addr, size: chunks * CHUNK, device: 0, kind, chunks: list });
        }
        (Manifest { memory, ..Default::default() }, stored)
    }

    fn expected(chunks: u64) -> Vec<u8> {
        (0..2 * chunks)
            .flat_map(|i| std::iter::repeat_n(if i % 4 == 3 { 0 } else { i as u8 }, CHUNK as usize))
            .collect()
    }

    fn reads(addr: u64, len: u64) -> Vec<DeviceAccess> {
        vec![DeviceAccess { addr, len, writes: false }]
    }

    /// Calls that come while memory loads wait for theirs, and their memory is loaded before
    /// the chunks in front of it: a call on the image's last chunk runs long before the whole
    /// image is in, and finds its contents right. Everything is loaded in the end.
    #[test]
    fn held_calls_get_their_memory_first() {
        let chunks = 40;
        let (manifest, stored) = image(chunks);
        let device =
            Arc::new(Device { bytes: Mutex::new(vec![0xee; (2 * chunks * CHUNK) as usize]), ..Default::default() });
        let targets: Vec<(u64, i32)> = manifest.memory.iter().map(|r| (r.addr, 0)).collect();
        let plan = LoadPlan::new(&manifest, &targets);
        let pending = PendingMemory::new(plan.ranges());
        assert_eq!(pending.remaining(), 2 * chunks * CHUNK);
        let reader = Stored { bytes: stored, bad: None };
        let progress = Progress::default();
        let last = BASE + (2 * chunks - 2) * CHUNK;
        std::thread::scope(|scope| {
            let loader =
                scope.spawn(|| load(&device, &plan, &reader, &pending, &progress, 2, Duration::from_millis(5), &|| {}));
            // Let the loader start in image order.
            std::thread::sleep(Duration::from_millis(20));
            let started = Instant::now();
            pending.before_call(&CallAccess { function: "k", device: &reads(last, 2 * CHUNK), objects: &[] }).unwrap();
            let waited = started.elapsed();
            let loaded_then = device.chunks.load(Ordering::Relaxed);
            let bytes = device.bytes.lock()[(last - BASE) as usize..].to_vec();
            assert_eq!(bytes, expected(chunks)[(last - BASE) as usize..], "ran before its memory was in");
            assert!(loaded_then < chunks, "its chunks came after {loaded_then} of {} (waited {waited:?})", 2 * chunks);
            loader.join().unwrap().unwrap();
        });
        assert_eq!(*device.bytes.lock(), expected(chunks));
        assert_eq!(pending.remaining(), 0);
        assert_eq!(progress.done(), 2 * chunks * CHUNK);
    }

    /// Every range held calls wait for is wanted, the oldest call's first, until it is loaded.
    #[test]
    fn the_ranges_of_every_held_call_are_wanted_oldest_first() {
        let p = PendingMemory::new([(0x1000, 0x1000), (0x4000, 0x1000)]);
        let wait_for = |n: usize| {
            let started = Instant::now();
            while p.wanted().len() < n {
                assert!(started.elapsed() < Duration::from_secs(10), "the held calls never asked");
                std::thread::sleep(Duration::from_millis(1));
            }
        };
        std::thread::scope(|scope| {
            let first = scope
                .spawn(|| p.before_call(&CallAccess { function: "a", device: &reads(0x4800, 0x10), objects: &[] }));
            wait_for(1);
            // Spans the first range and the gap after it.
            let second = scope
                .spawn(|| p.before_call(&CallAccess { function: "b", device: &reads(0x1000, 0x2000), objects: &[] }));
            wait_for(2);
            assert_eq!(p.wanted(), [(0x4800, 0x10), (0x1000, 0x1000)]);
            p.loaded(0x4000, 0x1000);
            assert_eq!(first.join().unwrap(), Ok(()));
            assert_eq!(p.wanted(), [(0x1000, 0x1000)]);
            p.loaded(0x1000, 0x800);
            assert_eq!(p.wanted(), [(0x1800, 0x800)], "what is still pending of it");
            p.loaded(0x1800, 0x800);
            assert_eq!(second.join().unwrap(), Ok(()));
            assert!(p.wanted().is_empty());
        });
    }

    /// A load that fails returns the error; the calls held until then fail with the error
    /// the loader's caller gives, rather than wait for ever.
    #[test]
    fn a_failed_load_fails_the_calls_it_held() {
        let chunks = 8;
        let (manifest, stored) = image(chunks);
        let device =
            Arc::new(Device { bytes: Mutex::new(vec![0; (2 * chunks * CHUNK) as usize]), ..Default::default() });
        let targets: Vec<(u64, i32)> = manifest.memory.iter().map(|r| (r.addr, 0)).collect();
        let plan = LoadPlan::new(&manifest, &targets);
        let bad_chunk = &manifest.memory[1].chunks[1];
        let pending = PendingMemory::new(plan.ranges());
        let reader = Stored { bytes: stored, bad: Some(bad_chunk.at) };
        let bad_addr = BASE + (chunks + 1) * CHUNK;
        std::thread::scope(|scope| {
            let held = scope.spawn(|| {
                pending.before_call(&CallAccess { function: "k", device: &reads(bad_addr, 8), objects: &[] })
            });
            while pending.next_wanted().is_none() {
                std::thread::sleep(Duration::from_millis(1));
            }
            let progress = Progress::default();
            let err = load(&device, &plan, &reader, &pending, &progress, 2, Duration::ZERO, &|| {}).unwrap_err();
            assert!(err.to_string().contains("checksum"), "{err}");
            pending.fail(phos_protocol::CudaError::Unknown);
            assert_eq!(held.join().unwrap(), Err(phos_protocol::CudaError::Unknown));
        });
    }
}
