//! Content hashes of device memory on a GPU, for a recopy's exact passes
//! ([`phos_checkpoint::piece_hash`]): a kernel of the server's own (`hash_blocks.cu`, its PTX
//! embedded here), loaded into each device's context the first time a recopy asks, hashes
//! every block one warp each; the hashes come back in one small copy.
//!
//! Each device gets, once: the module (compiled with nvJitLink where there is one, which
//! holds no driver lock, else by the driver's JIT), a non-blocking stream of its own (its
//! work never queues behind the session's, and the session's never behind it), and a
//! small buffer of device memory for the blocks' table and their hashes. They are kept for
//! the server's life, for later recopies.

use std::collections::HashMap;
use std::ffi::c_void;

use cudarc::driver::{result, sys};
use parking_lot::Mutex;
use phos_protocol::CudaError;

use super::cuda::{CudaBackend, driver as driver_error};
use super::prelude::*;

/// The kernel's PTX (`nvcc -ptx -arch=compute_60 -O3 hash_blocks.cu`).
pub const PTX: &str = include_str!("hash_blocks.ptx");
/// The kernel's name in it.
pub const KERNEL: &str = "phos_hash_blocks";
/// Blocks hashed by one launch: the buffer holds their table (address, length) and hashes.
const PER_LAUNCH: usize = 32 << 10;
/// Threads of a block of the launch (8 warps: 8 hash blocks at a time).
const THREADS: u32 = 256;

/// One device's kernel, stream and buffer.
pub(super) struct Hasher {
    function: sys::CUfunction,
    stream: sys::CUstream,
    /// `PER_LAUNCH` pairs (address, length), then `PER_LAUNCH` hashes.
    buffer: sys::CUdeviceptr,
}

// SAFETY: driver handles, usable from any thread that binds the device's context (every use
// does, under the map's lock).
unsafe impl Send for Hasher {}

/// The devices' hashers, made on first use.
#[derive(Default)]
pub(super) struct Hashers(Mutex<HashMap<i32, Hasher>>);

impl Hashers {
    /// Make `device`'s hasher if it has none yet.
    pub(super) fn prepare(&self, backend: &CudaBackend, device: i32) -> Result<(), CudaError> {
        let mut map = self.0.lock();
        if map.contains_key(&device) {
            return Ok(());
        }
        let hasher = Self::make(backend, device)?;
        map.insert(device, hasher);
        Ok(())
    }

    fn make(backend: &CudaBackend, device: i32) -> Result<Hasher, CudaError> {
        backend.bind(device)?;
        let image = crate::timing::timed(
            || format!("compiling the hash kernel for device {device}"),
            || backend.compile_ptx(device, PTX.as_bytes()),
        );
        let module = crate::timing::timed(
            || format!("loading the hash kernel on device {device}"),
            || backend.module_load(device, image.as_deref().unwrap_or(PTX.as_bytes())),
        )?;
        let function = backend.module_function(module.raw, KERNEL)? as sys::CUfunction;
        let stream = result::stream::create(result::stream::StreamKind::NonBlocking).map_err(driver_error)?;
        let bytes = PER_LAUNCH * 3 * 8;
        // SAFETY: plain device memory of the server's own, in the bound device's context;
        // kept for the server's life.
        let buffer = unsafe { result::malloc_sync(bytes) }.map_err(driver_error)?;
        tracing::debug!("device {device}: the hash kernel is loaded");
        Ok(Hasher { function, stream, buffer })
    }

    /// The hashes of `blocks` (address, length) of `device`'s memory, in order. The ranges
    /// are the engine's (regions of the session's memory, taken at rest), never a guest's.
    pub(super) fn hash(
        &self,
        backend: &CudaBackend,
        device: i32,
        blocks: &[(u64, u64)],
    ) -> Result<Vec<u64>, CudaError> {
        self.prepare(backend, device)?;
        let map = self.0.lock();
        let h = map.get(&device).ok_or(CudaError::NotSupported)?;
        backend.bind(device)?;
        let mut out = Vec::with_capacity(blocks.len());
        for batch in blocks.chunks(PER_LAUNCH) {
            let n = batch.len();
            let table: Vec<u64> = batch.iter().flat_map(|&(addr, len)| [addr, len]).collect();
            let mut hashes = vec![0u64; n];
            let (mut table_at, mut count, mut hashes_at) = (h.buffer, n as u64, h.buffer + (PER_LAUNCH * 16) as u64);
            // SAFETY: the buffer has room for `PER_LAUNCH` pairs; `table` outlives the copy
            // (the stream is synchronised below before it is dropped).
            unsafe { result::memcpy_htod_async(h.buffer, &table, h.stream) }.map_err(driver_error)?;
            let mut params: [*mut c_void; 3] = [
                &mut table_at as *mut u64 as *mut c_void,
                &mut count as *mut u64 as *mut c_void,
                &mut hashes_at as *mut u64 as *mut c_void,
            ];
            let warps_a_block = (THREADS / 32) as usize;
            let grid = n.div_ceil(warps_a_block) as u32;
            // SAFETY: the kernel of this module, with its three parameters (pointers to
            // them, alive for the call: the driver copies them at launch); it reads the
            // table and the blocks (mapped memory of the session's, at rest) and writes `n`
            // hashes into the buffer.
            unsafe { result::launch_kernel(h.function, (grid, 1, 1), (THREADS, 1, 1), 0, h.stream, &mut params) }
                .map_err(driver_error)?;
            // SAFETY: `n` hashes from the buffer; `hashes` stays borrowed until the stream is
            // synchronised below.
            unsafe { result::memcpy_dtoh_async(&mut hashes, hashes_at, h.stream) }.map_err(driver_error)?;
            // SAFETY: the hasher's live stream.
            unsafe { result::stream::synchronize(h.stream) }.map_err(driver_error)?;
            out.extend_from_slice(&hashes);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use std::process::Command;

    /// The PTX is generated, not written: it must be what nvcc makes of `hash_blocks.cu` (when
    /// the nvcc here is the release that made it; the header names it). CI has that nvcc.
    #[test]
    fn the_committed_ptx_is_what_nvcc_makes_of_its_source() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/src/backend");
        let required = std::env::var("PHOS_REQUIRE_NVCC").as_deref() == Ok("1");
        let nvcc = std::env::var("NVCC").unwrap_or_else(|_| "nvcc".into());
        let Ok(version) = Command::new(&nvcc).arg("--version").output() else {
            assert!(!required, "PHOS_REQUIRE_NVCC=1 but no nvcc was found");
            eprintln!("NOTICE: nvcc not found; the hash kernel's PTX is not compared with its source");
            return;
        };
        let version = String::from_utf8_lossy(&version.stdout).into_owned();
        let release = |text: &str| {
            text.lines().find_map(|l| l.split("release ").nth(1).map(|r| r.split(',').next().unwrap_or("").to_string()))
        };
        let made_by = release(super::PTX).expect("the PTX names the nvcc release that made it");
        if release(&version).as_deref() != Some(made_by.as_str()) {
            eprintln!("NOTICE: the PTX was made by nvcc {made_by}, this nvcc is another release: not compared");
            return;
        }
        let out = std::env::temp_dir().join(format!("phos-hash-blocks-{}.ptx", std::process::id()));
        let status = Command::new(&nvcc)
            .args(["-ptx", "-arch=compute_60", "-O3", &format!("{dir}/hash_blocks.cu"), "-o"])
            .arg(&out)
            .status()
            .expect("running nvcc");
        assert!(status.success(), "nvcc failed on hash_blocks.cu");
        let made = std::fs::read_to_string(&out).expect("nvcc's PTX");
        let _ = std::fs::remove_file(&out);
        let code = |text: &str| {
            text.lines().filter(|l| !l.trim_start().starts_with("//")).map(str::to_string).collect::<Vec<_>>()
        };
        assert!(
            code(&made) == code(super::PTX),
            "hash_blocks.ptx is not what nvcc makes of hash_blocks.cu: regenerate it with \
             `nvcc -ptx -arch=compute_60 -O3 hash_blocks.cu -o hash_blocks.ptx` in {dir}"
        );
    }
}
