//! Images written and read by several threads at once: what lets a checkpoint or a restore
//! move memory at the host link's rate instead of one core's.
//!
//! One thread cannot keep up with a GPU's copy engines: a checksum, a zero check and a copy
//! into the page cache each cost about as much per byte as the DMA, and a file's buffered
//! writes take its inode lock, so threads writing one file with `pwrite` take turns. A
//! directory image's memory file is therefore sized for the worst case up front and mapped;
//! each worker reserves the bytes of its chunk (a bump of one counter), copies them into the
//! mapping (page faults of a shared mapping do not serialise on the inode) and reports the
//! chunk's place. The file is cut to what was used when the image completes. Chunks land in
//! the file in the order workers finish them; the manifest's tables list them by their
//! offset in memory, as every image does.
//!
//! Reading back needs no mapping: `pread` of a file takes no exclusive lock, so workers read
//! their chunks concurrently ([`ChunkReader`]).

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::{Chunk, Encoding, ImageError};

/// Where several threads store chunks at once.
pub trait ChunkStore: Send + Sync {
    /// Reserve `len` bytes; the chunk is stored at the offset returned.
    fn reserve(&self, len: u64) -> Result<u64, ImageError>;
    /// Store `data` at `at`, reserved before by [`reserve`](Self::reserve).
    fn write_at(&self, at: u64, data: &[u8]) -> Result<(), ImageError>;
}

/// Where several threads read chunks at once.
pub trait ChunkReader: Send + Sync {
    /// The contents of `chunk`, checked against its checksum (and decompressed), into
    /// `out[..chunk.len]`.
    fn read_into(&self, chunk: &Chunk, out: &mut [u8]) -> Result<(), ImageError>;
}

fn io_error(path: &Path, what: &str, e: std::io::Error) -> ImageError {
    ImageError::Io { path: path.to_path_buf(), source: std::io::Error::new(e.kind(), format!("{what}: {e}")) }
}

/// A memory file mapped for writing by several threads.
pub struct MappedFile {
    path: PathBuf,
    base: *mut u8,
    capacity: u64,
    used: AtomicU64,
}

// SAFETY: the mapping is owned by this value and lives until it drops; threads write only
// byte ranges [`reserve`] handed to them alone (a counter bumped atomically), so no two
// threads write the same bytes, and nothing reads the mapping while it is shared.
unsafe impl Send for MappedFile {}
// SAFETY: as for `Send`: concurrent `write_at` calls touch disjoint ranges.
unsafe impl Sync for MappedFile {}

impl MappedFile {
    /// Maps `file` (at `path`, for messages) grown to `capacity` bytes, of which `start`
    /// are in use already.
    pub fn new(file: &File, path: &Path, start: u64, capacity: u64) -> Result<MappedFile, ImageError> {
        file.set_len(capacity).map_err(|e| io_error(path, "sizing the memory file", e))?;
        let len =
            usize::try_from(capacity).map_err(|_| ImageError::Corrupted("an image over the address space".into()))?;
        let base = if len == 0 {
            std::ptr::NonNull::<u8>::dangling().as_ptr()
        } else {
            // SAFETY: a new shared mapping of `len` bytes of a file we hold open for writing;
            // the kernel chooses the address, so it overlaps nothing of ours.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED,
                    file.as_raw_fd(),
                    0,
                )
            };
            if p == libc::MAP_FAILED {
                return Err(io_error(path, "mapping the memory file", std::io::Error::last_os_error()));
            }
            p.cast::<u8>()
        };
        Ok(MappedFile { path: path.to_path_buf(), base, capacity, used: AtomicU64::new(start) })
    }

    /// Bytes reserved so far: the file's length once the image is complete.
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Acquire)
    }
}

impl ChunkStore for MappedFile {
    fn reserve(&self, len: u64) -> Result<u64, ImageError> {
        let at = self.used.fetch_add(len, Ordering::AcqRel);
        if at.checked_add(len).is_none_or(|end| end > self.capacity) {
            return Err(ImageError::Corrupted(format!(
                "{}: {len} more bytes past the {} the image was sized for",
                self.path.display(),
                self.capacity
            )));
        }
        Ok(at)
    }

    fn write_at(&self, at: u64, data: &[u8]) -> Result<(), ImageError> {
        let end = at.checked_add(data.len() as u64);
        if end.is_none_or(|end| end > self.used()) {
            return Err(ImageError::Corrupted(format!("{}: a write outside what was reserved", self.path.display())));
        }
        // SAFETY: `at..at + len` lies inside the mapping (checked against `used`, which
        // `reserve` keeps within `capacity`), was reserved for this chunk alone, and `data`
        // is the caller's memory, which cannot overlap a mapping it does not know of.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.base.add(at as usize), data.len()) };
        Ok(())
    }
}

impl Drop for MappedFile {
    fn drop(&mut self) {
        if self.capacity > 0 {
            // SAFETY: unmaps exactly the mapping `new` made; no reference into it outlives
            // `self` (`write_at` copies in and returns).
            unsafe { libc::munmap(self.base.cast(), self.capacity as usize) };
        }
    }
}

/// A directory image's memory file, read by several threads.
pub struct FileChunks {
    path: PathBuf,
    file: File,
}

impl FileChunks {
    pub fn new(path: &Path, file: File) -> FileChunks {
        FileChunks { path: path.to_path_buf(), file }
    }
}

impl ChunkReader for FileChunks {
    fn read_into(&self, chunk: &Chunk, out: &mut [u8]) -> Result<(), ImageError> {
        let len = chunk.len as usize;
        if out.len() < len {
            return Err(ImageError::Corrupted(format!("chunk of {len} bytes for a buffer of {}", out.len())));
        }
        let out = &mut out[..len];
        let read = |buf: &mut [u8]| {
            self.file.read_exact_at(buf, chunk.at).map_err(|e| io_error(&self.path, "reading a chunk", e))
        };
        let check = |stored: &[u8]| {
            if crc32fast::hash(stored) == chunk.crc {
                Ok(())
            } else {
                Err(ImageError::Corrupted(format!("memory chunk at file offset {} fails its checksum", chunk.at)))
            }
        };
        match chunk.encoding {
            Encoding::Zero => out.fill(0),
            Encoding::Raw => {
                read(out)?;
                check(out)?;
            }
            Encoding::Zstd => {
                let mut stored = vec![0u8; chunk.stored as usize];
                read(&mut stored)?;
                check(&stored)?;
                let n = zstd::bulk::decompress_to_buffer(&stored, out).map_err(|e| {
                    ImageError::Corrupted(format!("memory chunk at {} does not decompress: {e}", chunk.at))
                })?;
                if n != len {
                    return Err(ImageError::Corrupted(format!("memory chunk at {} has the wrong size", chunk.at)));
                }
            }
        }
        Ok(())
    }
}

/// How many threads copy memory for one checkpoint or restore: one per core, up to eight
/// (past that the host link, not the cores, is the limit).
pub fn workers() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get()).clamp(1, 8)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threads_store_disjoint_chunks_and_the_rest_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("memory");
        let file = File::options().read(true).write(true).create(true).truncate(true).open(&path).unwrap();
        let store = MappedFile::new(&file, &path, 0, 64 * 1024).unwrap();
        std::thread::scope(|s| {
            for t in 0..8u8 {
                let store = &store;
                s.spawn(move || {
                    for _ in 0..8 {
                        let at = store.reserve(1024).unwrap();
                        store.write_at(at, &[t + 1; 1024]).unwrap();
                    }
                });
            }
        });
        assert_eq!(store.used(), 64 * 1024);
        assert!(store.reserve(1).is_err(), "past the capacity");
        assert!(store.write_at(64 * 1024 - 10, &[0; 20]).is_err(), "past what was reserved");
        drop(store);
        let bytes = std::fs::read(&path).unwrap();
        // Every 1 KiB piece is one thread's, whole, and each thread wrote eight.
        let mut counts = [0; 8];
        for piece in bytes.chunks(1024) {
            assert!(piece.iter().all(|&b| b == piece[0]) && piece[0] >= 1, "a torn or empty piece");
            counts[piece[0] as usize - 1] += 1;
        }
        assert_eq!(counts, [8; 8]);
    }

    #[test]
    fn chunks_read_back_checked() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("memory");
        let data: Vec<u8> = (0..4096u32).map(|i| (i * 7) as u8).collect();
        let packed = zstd::bulk::compress(&data, 1).unwrap();
        let mut file_bytes = data.clone();
        file_bytes.extend_from_slice(&packed);
        std::fs::write(&path, &file_bytes).unwrap();
        let reader = FileChunks::new(&path, File::open(&path).unwrap());
        let raw =
            Chunk { offset: 0, len: 4096, encoding: Encoding::Raw, stored: 4096, at: 0, crc: crc32fast::hash(&data) };
        let zstd = Chunk {
            encoding: Encoding::Zstd,
            stored: packed.len() as u64,
            at: 4096,
            crc: crc32fast::hash(&packed),
            ..raw
        };
        for c in [raw, zstd] {
            let mut out = vec![0u8; 4096];
            reader.read_into(&c, &mut out).unwrap();
            assert_eq!(out, data);
        }
        let damaged = Chunk { crc: raw.crc ^ 1, ..raw };
        assert!(matches!(reader.read_into(&damaged, &mut [0u8; 4096]), Err(ImageError::Corrupted(_))));
    }
}
