//! The copy-on-write protocol over a session whose device memory is host memory: the image
//! is the memory as it was at the quiesce whatever is written meanwhile, only the chunks a
//! call writes are copied aside, and the copy takes first the chunks writers wait for.

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;

use parking_lot::RwLockWriteGuard;
use phos_protocol::spec::{DeviceAccess, ObjectAccess, ObjectEffect};

use super::*;
use crate::{ImageApi, Record, RegionKind, SessionMeta};

const BASE: u64 = 0x6000_0000_0000;
/// Where the fake reserve's copies are.
const RESERVE_AT: u64 = 0x7000_0000_0000;
const CHUNK: u64 = COPY_CHUNK as u64;

type Regions = Arc<Vec<(u64, Mutex<Vec<u8>>)>>;

/// Bytes `[addr, addr + len)` of `regions`, which one region holds.
fn region_of(regions: &Regions, addr: u64) -> (&Mutex<Vec<u8>>, usize) {
    let (start, bytes) = regions
        .iter()
        .find(|(start, b)| (*start..*start + b.lock().len() as u64).contains(&addr))
        .expect("an address of a region");
    (bytes, (addr - start) as usize)
}

/// The reserve: copies by address, and room left.
struct FakeWindow {
    regions: Regions,
    room: Mutex<u64>,
    copies: Mutex<HashMap<u64, Vec<u8>>>,
    next: AtomicU64,
    /// Every piece asked to be copied aside: (address, length).
    asked: Mutex<Vec<(u64, u64)>>,
}

impl Window for FakeWindow {
    fn arm(&self) {}

    fn save(&self, _device: i32, pieces: &[(u64, u64)]) -> Result<Vec<u64>, CrError> {
        let mut out = Vec::new();
        for &(addr, len) in pieces {
            let mut room = self.room.lock();
            if *room < len {
                break;
            }
            *room -= len;
            let (bytes, at) = region_of(&self.regions, addr);
            let copy = RESERVE_AT + self.next.fetch_add(len, Ordering::Relaxed);
            self.copies.lock().insert(copy, bytes.lock()[at..at + len as usize].to_vec());
            self.asked.lock().push((addr, len));
            out.push(copy);
        }
        Ok(out)
    }

    fn release(&self, _device: i32, copy: u64, len: u64) {
        self.copies.lock().remove(&copy).expect("a copy of the reserve");
        *self.room.lock() += len;
    }

    fn finish(&self, _within: &Within<'_>) -> Result<Option<u64>, CrError> {
        Ok(None)
    }
}

/// A session of three regions of host memory, its calls ordered by a lock (a call holds it
/// shared, the quiesce whole).
struct Fake {
    regions: Regions,
    calls: RwLock<()>,
    hooks: HookSlot,
    /// The memory when the head was taken (at rest): what the image must hold.
    at_head: Mutex<Option<Vec<Vec<u8>>>>,
    window: Mutex<Option<Arc<FakeWindow>>>,
    /// Waited before each piece the copy reads, so that writes come first.
    pace: Duration,
}

impl Fake {
    fn new(sizes: &[u64], pace: Duration) -> Self {
        let regions = sizes
            .iter()
            .enumerate()
            .map(|(i, &size)| {
                let bytes = (0..size).map(|b| (b as u8) ^ (b >> 13) as u8 ^ (i as u8 + 1)).collect();
                (BASE + i as u64 * (1 << 32), Mutex::new(bytes))
            })
            .collect();
        Fake {
            regions: Arc::new(regions),
            calls: RwLock::new(()),
            hooks: HookSlot::default(),
            at_head: Mutex::new(None),
            window: Mutex::new(None),
            pace,
        }
    }

    fn addr(&self, region: usize) -> u64 {
        self.regions[region].0
    }

    /// A call that writes `len` bytes of `value` at `addr`, shown to the hook first.
    fn write(&self, addr: u64, len: u64, value: u8) {
        let _call = self.calls.read();
        let device = [DeviceAccess { addr, len, writes: true }];
        if self.hooks.active() {
            self.hooks.before_call(&CallAccess { function: "write", device: &device, objects: &[] }).unwrap();
        }
        let (bytes, at) = region_of(&self.regions, addr);
        bytes.lock()[at..at + len as usize].fill(value);
    }

    /// Wait until the head has been taken: calls from then on come after the quiesce.
    fn wait_for_head(&self) {
        while self.at_head.lock().is_none() {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

struct FakeCopier<'a>(&'a Fake);

impl DeviceCopier for FakeCopier<'_> {
    fn buffer(&self, len: usize) -> HostBuffer {
        HostBuffer::new(len, None)
    }

    fn read(&mut self, _device: i32, addr: u64, out: &mut [u8]) -> Result<(), CrError> {
        std::thread::sleep(self.0.pace);
        if addr >= RESERVE_AT {
            let window = self.0.window.lock().clone().expect("a window");
            out.copy_from_slice(&window.copies.lock()[&addr][..out.len()]);
        } else {
            let (bytes, at) = region_of(&self.0.regions, addr);
            out.copy_from_slice(&bytes.lock()[at..at + out.len()]);
        }
        Ok(())
    }

    fn write(&mut self, _: i32, _: u64, _: &[u8]) -> Result<(), CrError> {
        unreachable!("a checkpoint writes no device memory")
    }

    fn zero(&mut self, _: i32, _: u64, _: u64) -> Result<(), CrError> {
        unreachable!("a checkpoint writes no device memory")
    }

    fn finish(&mut self) -> Result<(), CrError> {
        Ok(())
    }
}

impl Quiesce for Fake {
    type AtRest<'a> = RwLockWriteGuard<'a, ()>;

    fn quiesce(&self, _within: &Within<'_>) -> Result<Self::AtRest<'_>, CrError> {
        Ok(self.calls.write())
    }
}

impl Snapshot for Fake {
    fn head(&self) -> Result<Manifest, CrError> {
        let memory = self
            .regions
            .iter()
            .map(|(addr, bytes)| MemoryRegion {
                addr: *addr,
                size: bytes.lock().len() as u64,
                device: 0,
                kind: RegionKind::Allocation,
                chunks: Vec::new(),
            })
            .collect();
        *self.at_head.lock() = Some(self.regions.iter().map(|(_, b)| b.lock().clone()).collect());
        Ok(Manifest {
            apis: vec![ImageApi { id: 0, name: "cudart".into(), version: 1, hash: 1 }],
            session: SessionMeta {
                id: 7,
                tenant: "uid:0".into(),
                abi_major: 12,
                backend: "emu".into(),
                device_base: BASE,
                device_size: 1 << 40,
                ..Default::default()
            },
            records: vec![Record {
                api: 0,
                function: 3,
                name: "cudaMalloc".into(),
                device: 0,
                payload: vec![],
                creates: vec![],
            }],
            memory,
            ..Default::default()
        })
    }

    fn copier(&self) -> Result<Box<dyn DeviceCopier + '_>, CrError> {
        Ok(Box::new(FakeCopier(self)))
    }
}

struct NoLog;

impl DirtyLog for NoLog {
    fn note_write(&self, _: u64, _: u64) {}
    fn begin_round(&self) -> Round {
        Round(0)
    }
    fn written_since(&self, _: Round) -> Vec<(u64, u64)> {
        Vec::new()
    }
}

impl Intercept for Fake {
    fn install_hook(&self, hook: Arc<dyn CallHook>, _within: &Within<'_>) -> Result<Installed<'_>, CrError> {
        let _held = self.calls.write();
        self.hooks.install(hook).ok_or(CrError::HookInstalled { session: 7 })
    }

    fn dirty_log(&self) -> Arc<dyn DirtyLog> {
        Arc::new(NoLog)
    }
}

impl Concurrent for Fake {
    fn open_window(&self, reserve: Option<u64>) -> Result<Arc<dyn Window>, CrError> {
        let window = Arc::new(FakeWindow {
            regions: self.regions.clone(),
            room: Mutex::new(reserve.unwrap_or(u64::MAX)),
            copies: Mutex::default(),
            next: AtomicU64::new(0),
            asked: Mutex::default(),
        });
        *self.window.lock() = Some(window.clone());
        Ok(window)
    }
}

/// Take a copy-on-write checkpoint of `fake` into a directory while `writer` runs from the
/// head on; the image must be the memory at the head.
fn checkpoint_while(
    fake: &Fake,
    reserve: Option<u64>,
    writer: impl FnOnce(&Fake, &AtomicBool) + Send,
) -> CheckpointSummary {
    let dir = tempfile::tempdir().unwrap();
    let done = AtomicBool::new(false);
    let summary = std::thread::scope(|scope| {
        let w = scope.spawn(|| {
            fake.wait_for_head();
            writer(fake, &done)
        });
        let mut sink = crate::ImageWriter::create(dir.path(), Compression::None, COPY_CHUNK).unwrap();
        let summary = checkpoint_cow(
            fake,
            &mut sink,
            Compression::None,
            &Progress::default(),
            &Within::after(Duration::from_secs(60)),
            reserve,
            &|| {},
        )
        .unwrap();
        done.store(true, Ordering::Relaxed);
        w.join().unwrap();
        summary
    });
    let at_head = fake.at_head.lock().clone().unwrap();
    let mut image = crate::Image::open(dir.path()).unwrap();
    let mut buf = Vec::new();
    for (i, r) in image.manifest.memory.clone().iter().enumerate() {
        let mut got = vec![0u8; r.size as usize];
        for c in &r.chunks {
            image.read_chunk(c, &mut buf).unwrap();
            got[c.offset as usize..][..c.len as usize].copy_from_slice(&buf[..c.len as usize]);
        }
        // Compared chunk by chunk, to say which one is wrong.
        for (k, (a, b)) in got.chunks(COPY_CHUNK).zip(at_head[i].chunks(COPY_CHUNK)).enumerate() {
            assert!(
                a == b,
                "region {i}, chunk {k}: the image holds bytes written after the checkpoint's start (reserve {reserve:?}, {summary:?})"
            );
        }
    }
    summary
}

/// Whatever a writer writes while the copy runs, and whatever the reserve holds, the image
/// is the memory at the quiesce: a chunk taken after a write to it would show the write.
/// Writes straddle chunks and regions' ends; the copy is slowed so that they come first.
#[test]
fn the_image_is_the_memory_at_the_start_whatever_is_written_meanwhile() {
    for reserve in [Some(0), Some(CHUNK), None] {
        let fake = Fake::new(&[2 * CHUNK + 4096, 2 * CHUNK, 65536], Duration::from_millis(15));
        let writes = AtomicU64::new(0);
        let summary = checkpoint_while(&fake, reserve, |fake, done| {
            let mut v = 0u64;
            while !done.load(Ordering::Relaxed) {
                v += 1;
                // Spread over every region and offset, across chunk boundaries.
                let region = (v % 3) as usize;
                let size = fake.regions[region].1.lock().len() as u64;
                let at = (v * 0x9e37_79b9) % size;
                let len = ((v * 0x7f4a_7c15) % (CHUNK + CHUNK / 2)).clamp(1, size - at);
                fake.write(fake.addr(region) + at, len, v as u8);
                writes.fetch_add(1, Ordering::Relaxed);
            }
        });
        assert!(writes.load(Ordering::Relaxed) > 3, "the writer did not write during the copy: the test did not test");
        assert!(summary.waited_calls > 0, "no write had to wait or copy aside: the test did not test ({summary:?})");
        match reserve {
            Some(0) => assert_eq!(summary.extra_bytes, 0, "{summary:?}"),
            _ => assert!(summary.extra_bytes > 0, "nothing was copied aside ({summary:?})"),
        }
        assert!(summary.waited_ms > 0.0, "{summary:?}");
    }
}

/// A write to part of a large allocation copies aside only the chunks it writes (here one
/// of five), not the allocation; a free copies aside the rest of it.
#[test]
fn only_the_chunks_written_are_copied_aside() {
    let window = Arc::new(FakeWindow {
        regions: Arc::new(vec![(BASE, Mutex::new(vec![1u8; 5 * CHUNK as usize - 100]))]),
        room: Mutex::new(u64::MAX),
        copies: Mutex::default(),
        next: AtomicU64::new(0),
        asked: Mutex::default(),
    });
    let cow = CopyOnWrite::new(window.clone());
    let region =
        MemoryRegion { addr: BASE, size: 5 * CHUNK - 100, device: 0, kind: RegionKind::Allocation, chunks: Vec::new() };
    cow.arm(std::slice::from_ref(&region));
    let write = |addr: u64, len: u64| {
        let device = [DeviceAccess { addr, len, writes: true }];
        cow.before_call(&CallAccess { function: "cudaMemset", device: &device, objects: &[] }).unwrap();
    };
    // Inside chunk 2; then across chunks 2 and 3; then the last byte (the short last chunk).
    write(BASE + 2 * CHUNK + 10, 4096);
    assert_eq!(*window.asked.lock(), [(BASE + 2 * CHUNK, CHUNK)]);
    write(BASE + 3 * CHUNK - 5, 10);
    assert_eq!(window.asked.lock()[1..], [(BASE + 3 * CHUNK, CHUNK)]);
    write(BASE + 5 * CHUNK - 101, 1);
    assert_eq!(window.asked.lock()[2..], [(BASE + 4 * CHUNK, CHUNK - 100)]);
    assert_eq!(cow.figures.saved.load(Ordering::Relaxed), 3 * CHUNK - 100);
    // The copy reads a saved chunk from its copy, the others in place.
    let first = cow.next(true).unwrap();
    assert_eq!((first.offset, first.from), (0, BASE));
    cow.done(&first);
    let second = cow.next(true).unwrap();
    let third = cow.next(true).unwrap();
    assert_eq!(third.offset, 2 * CHUNK);
    assert!(third.from >= RESERVE_AT, "a saved chunk is read from its copy");
    // Freeing the allocation copies aside what is neither copied nor saved nor being read
    // (chunk 1 is being read: the free waits for it).
    let freeing = std::thread::scope(|scope| {
        let free = scope.spawn(|| {
            let objects = [ObjectAccess { kind: "device_memory", value: BASE, effect: ObjectEffect::Destroys }];
            cow.before_call(&CallAccess { function: "cudaFree", device: &[], objects: &objects }).unwrap();
        });
        std::thread::sleep(Duration::from_millis(50));
        let waited = !free.is_finished();
        cow.done(&second);
        free.join().unwrap();
        waited
    });
    assert!(freeing, "the free did not wait for the chunk being read in place");
    assert_eq!(
        window.asked.lock().len(),
        3,
        "every chunk was copied, saved or read already: {:?}",
        window.asked.lock()
    );
}

/// With no room to copy aside, a writer waits for the copy, which takes the chunk it waits
/// for before those in image order (into a sink that takes chunks in any order).
#[test]
fn the_copy_takes_first_the_chunks_writers_wait_for() {
    let window = Arc::new(FakeWindow {
        regions: Arc::new(vec![(BASE, Mutex::new(vec![0u8; 6 * CHUNK as usize]))]),
        room: Mutex::new(0),
        copies: Mutex::default(),
        next: AtomicU64::new(0),
        asked: Mutex::default(),
    });
    let cow = CopyOnWrite::new(window.clone());
    let region =
        MemoryRegion { addr: BASE, size: 6 * CHUNK, device: 0, kind: RegionKind::Allocation, chunks: Vec::new() };
    cow.arm(std::slice::from_ref(&region));
    let first = cow.next(false).unwrap();
    assert_eq!(first.offset, 0);
    std::thread::scope(|scope| {
        let writer = scope.spawn(|| {
            let device = [DeviceAccess { addr: BASE + 5 * CHUNK + 1, len: 8, writes: true }];
            cow.before_call(&CallAccess { function: "cudaMemset", device: &device, objects: &[] }).unwrap();
        });
        while cow.state.lock().wanted.is_empty() {
            assert!(!writer.is_finished(), "the write went on before its chunk was copied");
            std::thread::sleep(Duration::from_millis(1));
        }
        let wanted = cow.next(false).unwrap();
        assert_eq!(wanted.offset, 5 * CHUNK, "the copy did not take the chunk a writer waits for first");
        std::thread::sleep(Duration::from_millis(20));
        assert!(!writer.is_finished(), "the write went on while its chunk was being read");
        cow.done(&wanted);
        writer.join().unwrap();
    });
    // The rest in image order.
    assert_eq!(cow.next(false).unwrap().offset, CHUNK);
    assert!(cow.figures.held_ns.load(Ordering::Relaxed) > 0);
    assert!(window.asked.lock().is_empty());
}

/// A call whose write ranges overlap (a graph's memsets into one buffer) copies each chunk
/// aside once.
#[test]
fn overlapping_ranges_copy_each_chunk_aside_once() {
    let window = Arc::new(FakeWindow {
        regions: Arc::new(vec![(BASE, Mutex::new(vec![0u8; 2 * CHUNK as usize]))]),
        room: Mutex::new(u64::MAX),
        copies: Mutex::default(),
        next: AtomicU64::new(0),
        asked: Mutex::default(),
    });
    let cow = CopyOnWrite::new(window.clone());
    let region =
        MemoryRegion { addr: BASE, size: 2 * CHUNK, device: 0, kind: RegionKind::Allocation, chunks: Vec::new() };
    cow.arm(std::slice::from_ref(&region));
    let twice = [
        DeviceAccess { addr: BASE + 10, len: 100, writes: true },
        DeviceAccess { addr: BASE + 50, len: CHUNK, writes: true },
        DeviceAccess { addr: BASE, len: 8, writes: true },
    ];
    cow.before_call(&CallAccess { function: "cudaGraphLaunch", device: &twice, objects: &[] }).unwrap();
    assert_eq!(*window.asked.lock(), [(BASE, CHUNK), (BASE + CHUNK, CHUNK)]);
    assert_eq!(cow.figures.saved.load(Ordering::Relaxed), 2 * CHUNK);
    assert_eq!(cow.state.lock().open, [0]);
}
