//! A restore's copy ([`restore`], [`copy_in_parallel`]): every chunk reaches its place, through
//! a copier that copies behind its thread ([`DeviceCopier::write_behind`]) as through one that
//! copies at once; and, ignored by default, a host-side measurement of the two.

use std::path::Path;
use std::sync::atomic::AtomicUsize;
use std::thread::JoinHandle;

use super::*;
use crate::{Image, ImageApi, ImageWriter, Record, RegionKind, SessionMeta};

const BASE: u64 = 0x6000_0000_0000;

/// Device memory in a vector; `behind`: its copiers queue copies on threads of their own
/// that take `pace` each, as a GPU's copy engine would.
struct Device {
    bytes: Mutex<Vec<u8>>,
    behind: bool,
    pace: Duration,
    /// Copies queued behind a thread, and how many were in flight at most at once.
    queued: AtomicUsize,
    in_flight: AtomicUsize,
    most_in_flight: AtomicUsize,
}

impl Device {
    fn new(len: usize, behind: bool, pace: Duration) -> Arc<Device> {
        Arc::new(Device {
            bytes: Mutex::new(vec![0xEE; len]),
            behind,
            pace,
            queued: AtomicUsize::new(0),
            in_flight: AtomicUsize::new(0),
            most_in_flight: AtomicUsize::new(0),
        })
    }

    fn put(&self, addr: u64, data: &[u8]) {
        let at = (addr - BASE) as usize;
        self.bytes.lock()[at..at + data.len()].copy_from_slice(data);
    }
}

struct Copier {
    dev: Arc<Device>,
    behind: Option<JoinHandle<HostBuffer>>,
}

impl DeviceCopier for Copier {
    fn buffer(&self, len: usize) -> HostBuffer {
        HostBuffer::new(len, None)
    }
    fn read(&mut self, _: i32, _: u64, _: &mut [u8]) -> Result<(), CrError> {
        unreachable!("a restore only writes")
    }
    fn write(&mut self, _: i32, addr: u64, data: &[u8]) -> Result<(), CrError> {
        std::thread::sleep(self.dev.pace);
        self.dev.put(addr, data);
        Ok(())
    }
    fn zero(&mut self, _: i32, addr: u64, len: u64) -> Result<(), CrError> {
        assert!(self.behind.is_none(), "a copy behind is waited for before any other");
        self.dev.put(addr, &vec![0; len as usize]);
        Ok(())
    }
    fn finish(&mut self) -> Result<(), CrError> {
        self.wait_behind().map(drop)
    }
    fn write_behind(
        &mut self,
        device: i32,
        addr: u64,
        buf: HostBuffer,
        len: usize,
    ) -> Result<Option<HostBuffer>, CrError> {
        if !self.dev.behind {
            self.write(device, addr, &buf[..len])?;
            return Ok(Some(buf));
        }
        let free = self.wait_behind()?;
        let dev = self.dev.clone();
        dev.queued.fetch_add(1, Ordering::Relaxed);
        let now = dev.in_flight.fetch_add(1, Ordering::Relaxed) + 1;
        dev.most_in_flight.fetch_max(now, Ordering::Relaxed);
        self.behind = Some(std::thread::spawn(move || {
            std::thread::sleep(dev.pace);
            dev.put(addr, &buf[..len]);
            dev.in_flight.fetch_sub(1, Ordering::Relaxed);
            buf
        }));
        Ok(free)
    }
    fn wait_behind(&mut self) -> Result<Option<HostBuffer>, CrError> {
        Ok(self.behind.take().map(|h| h.join().expect("copy thread")))
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
        Ok(Box::new(Copier { dev: self.clone(), behind: None }))
    }
}

/// An image in `dir` of one allocation of `len` bytes in chunks of `chunk`: a pattern, with
/// the second chunk all zeros (not stored). Returns the memory it holds.
fn image(dir: &Path, len: usize, chunk: usize) -> Vec<u8> {
    let mut memory: Vec<u8> = (0..len).map(|i| (i as u8).wrapping_mul(31) ^ (i >> 12) as u8).collect();
    memory[chunk..(2 * chunk).min(len)].fill(0);
    let mut w = ImageWriter::create(dir, Compression::None, chunk).unwrap();
    w.begin_region(BASE, len as u64, 0, RegionKind::Allocation);
    for c in memory.chunks(chunk) {
        w.add_chunk(c).unwrap();
    }
    let manifest = Manifest {
        apis: vec![ImageApi { id: 0, name: "cudart".into(), version: 1, hash: 0x1234 }],
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
            creates: vec![("device_memory".into(), BASE)],
        }],
        ..Default::default()
    };
    w.finish(manifest).unwrap();
    memory
}

fn restore_into(dir: &Path, dev: &Arc<Device>) -> RestoreSummary {
    let mut img = Image::open(dir).unwrap();
    let progress = Progress::default();
    let summary = restore(dev, &mut img, None, &progress, &|| false).unwrap();
    assert_eq!(progress.done(), progress.total(), "every byte counted");
    summary
}

#[test]
fn every_chunk_reaches_its_place_copied_behind_or_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let (len, chunk) = (40 * 4096 + 100, 4096);
    let memory = image(dir.path(), len, chunk);
    for behind in [true, false] {
        let dev = Device::new(len, behind, Duration::from_micros(200));
        let summary = restore_into(dir.path(), &dev);
        assert_eq!(summary.memory_bytes, len as u64);
        assert!(*dev.bytes.lock() == memory, "the memory is the image's (copies behind: {behind})");
        let stored = len.div_ceil(chunk) - 1;
        assert_eq!(dev.queued.load(Ordering::Relaxed), if behind { stored } else { 0 });
        assert_eq!(dev.in_flight.load(Ordering::Relaxed), 0, "every copy waited for");
        assert!(dev.most_in_flight.load(Ordering::Relaxed) <= crate::parallel::workers(), "one a thread at most");
    }
}

/// Host-side cost of a restore's copy, with the device's copies simulated (a thread sleeping
/// `PHOS_BENCH_PACE_US` a chunk, 300 µs by default: an 8 MiB chunk at 28 GB/s): the image
/// read and checked from `PHOS_BENCH_DIR` (default /dev/shm), `PHOS_BENCH_MIB` (default
/// 1024) MiB in 8 MiB chunks, copied at once (a thread waits for each copy) and behind.
/// `cargo test -p phos-checkpoint --release restore_copy_host_side -- --ignored --nocapture`
#[test]
#[ignore]
fn restore_copy_host_side() {
    let var = |name: &str, default: u64| std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default);
    let mib = var("PHOS_BENCH_MIB", 1024) as usize;
    let pace = Duration::from_micros(var("PHOS_BENCH_PACE_US", 300));
    let base = std::env::var("PHOS_BENCH_DIR").unwrap_or_else(|_| "/dev/shm".into());
    let dir = tempfile::tempdir_in(&base).unwrap();
    let len = mib << 20;
    let memory = image(dir.path(), len, COPY_CHUNK);
    for round in 0..2 {
        for behind in [false, true] {
            let dev = Device::new(len, behind, pace);
            let start = Instant::now();
            let summary = restore_into(dir.path(), &dev);
            let ms = start.elapsed().as_secs_f64() * 1e3;
            assert!(*dev.bytes.lock() == memory);
            println!(
                "round {round}: {mib} MiB, {} threads, device copies {}: {ms:.1} ms ({:.1} GB/s; copy {:.1} ms)",
                crate::parallel::workers(),
                if behind { "behind the thread" } else { "waited for" },
                len as f64 / ms / 1e6,
                summary.copy_ms
            );
        }
    }
}
