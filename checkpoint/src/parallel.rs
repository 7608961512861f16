//! Images written and read by several threads at once: what lets a checkpoint or a restore
//! move memory at the host link's rate instead of one core's.
//!
//! One thread cannot keep up with a GPU's copy engines: a checksum, a zero check and a copy
//! into the page cache each cost about as much per byte as the DMA. Several threads cannot
//! share one memory file either: buffered writes to a file take its inode lock, so threads
//! writing one file take turns, and a shared mapping of it is no better (its page faults
//! allocate one page at a time). Measured on the GPU machine's 16 cores, 8 GiB into
//! `/dev/shm` in 8 MiB pieces (`tests/bench/image_write.c`): one file written by 8 threads
//! 3.0 GB/s with `pwrite`, 5.9 GB/s through a mapping; a file per thread 25.9 GB/s (8
//! threads), 39.4 GB/s (16). So a directory image written in parallel has one memory file
//! per writer (`memory`, `memory.1`, ...), and each chunk's entry names its file; each writer
//! appends to its own. Reading back needs nothing of the kind: `pread` takes no exclusive
//! lock (32.4 GB/s from one file with 8 threads), so restore workers read any file at once
//! ([`ChunkReader`]).

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use parking_lot::Mutex;

use crate::{Chunk, Encoding, ImageError};

/// Where several threads store chunks at once: one file per writer.
pub trait ChunkStore: Send + Sync {
    /// How many writers may write at once (each its own file).
    fn files(&self) -> usize;
    /// Append `data` to file `file` (one writer's alone); returns where it went.
    fn append(&self, file: usize, data: &[u8]) -> Result<u64, ImageError>;
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

/// The memory files of an image being written by several threads.
pub struct FileSet {
    /// Each file, where it is, and how much of it is written.
    files: Vec<(PathBuf, File, Mutex<u64>)>,
}

impl FileSet {
    /// Writes to `files`, each from its start.
    pub fn new(files: Vec<(PathBuf, File)>) -> FileSet {
        FileSet { files: files.into_iter().map(|(p, f)| (p, f, Mutex::new(0))).collect() }
    }

    /// Cut each file to what was written to it (room made ahead by [`allocate`] and not
    /// used is given back).
    pub fn trim(&self) -> Result<(), ImageError> {
        for (path, f, len) in &self.files {
            let len = *len.lock();
            if f.metadata().map_err(|e| io_error(path, "reading its length", e))?.len() > len {
                f.set_len(len).map_err(|e| io_error(path, "cutting it to its contents", e))?;
            }
        }
        Ok(())
    }

    /// Bytes written to each file.
    pub fn lengths(&self) -> Vec<u64> {
        self.files.iter().map(|(_, _, len)| *len.lock()).collect()
    }

    /// Makes every file durable.
    pub fn sync(&self) -> Result<(), ImageError> {
        for (path, file, _) in &self.files {
            file.sync_all().map_err(|e| io_error(path, "syncing", e))?;
        }
        Ok(())
    }
}

impl ChunkStore for FileSet {
    fn files(&self) -> usize {
        self.files.len()
    }

    fn append(&self, file: usize, data: &[u8]) -> Result<u64, ImageError> {
        let (path, f, len) =
            self.files.get(file).ok_or_else(|| ImageError::Corrupted(format!("no memory file {file}")))?;
        // One writer per file: the lock is never contended; it keeps the length right if a
        // caller breaks that rule.
        let mut len = len.lock();
        let at = *len;
        f.write_all_at(data, at).map_err(|e| io_error(path, "writing a chunk", e))?;
        *len += data.len() as u64;
        Ok(at)
    }
}

/// Allocate the first `bytes` of `file` ahead of writing (its length grows to `bytes`; a
/// [`FileSet`] still appends from 0 and [`FileSet::trim`] cuts the rest). A file system that
/// cannot is left to allocate as it is written.
pub fn allocate(file: &File, bytes: u64) {
    use std::os::fd::AsRawFd;
    let Ok(len) = libc::off_t::try_from(bytes) else { return };
    // SAFETY: `file` is an open descriptor for the call's duration; fallocate only reads its
    // integer arguments.
    let r = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, len) };
    if r != 0 {
        tracing::debug!("allocating an image's memory file ahead: {}", std::io::Error::last_os_error());
    }
}

/// Bytes [`store_raw`] checksums and then writes at a time: small enough to be still in the
/// core's cache when written, so that a chunk is read from memory once (checksumming all of
/// an 8 MiB chunk first and writing it after reads it from memory twice: with the copy
/// engine's writes, that traffic is what bounds a checkpoint on a busy host).
const STORE_BLOCK: usize = 256 << 10;

/// Append `data` to `store`'s file `file` as one raw chunk, checksumming each block just
/// before it is written. Returns where the chunk starts and its CRC-32.
pub fn store_raw(store: &dyn ChunkStore, file: usize, data: &[u8]) -> Result<(u64, u32), ImageError> {
    let mut crc = crc32fast::Hasher::new();
    let mut blocks = data.chunks(STORE_BLOCK);
    let Some(first) = blocks.next() else { return Ok((store.append(file, data)?, crc.finalize())) };
    crc.update(first);
    let at = store.append(file, first)?;
    for block in blocks {
        crc.update(block);
        store.append(file, block)?;
    }
    Ok((at, crc.finalize()))
}

/// A directory image's memory files, read by several threads.
pub struct FileChunks {
    files: Vec<(PathBuf, File)>,
}

impl FileChunks {
    /// Reads chunks from `files`, by a chunk's file index.
    pub fn new(files: Vec<(PathBuf, File)>) -> FileChunks {
        FileChunks { files }
    }
}

impl ChunkReader for FileChunks {
    fn read_into(&self, chunk: &Chunk, out: &mut [u8]) -> Result<(), ImageError> {
        let len = chunk.len as usize;
        if out.len() < len {
            return Err(ImageError::Corrupted(format!("chunk of {len} bytes for a buffer of {}", out.len())));
        }
        let out = &mut out[..len];
        let (path, file) = self.files.get(chunk.file as usize).ok_or_else(|| {
            ImageError::Corrupted(format!("a chunk in memory file {}, which is not there", chunk.file))
        })?;
        let read = |buf: &mut [u8]| file.read_exact_at(buf, chunk.at).map_err(|e| io_error(path, "reading a chunk", e));
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
                // Read and checksummed a block at a time, while the block is in the cache.
                let mut crc = crc32fast::Hasher::new();
                let mut at = chunk.at;
                let timed = crate::timing::on();
                for block in out.chunks_mut(STORE_BLOCK) {
                    let t = timed.then(std::time::Instant::now);
                    file.read_exact_at(block, at).map_err(|e| io_error(path, "reading a chunk", e))?;
                    let read = t.map(|t| (t.elapsed(), std::time::Instant::now()));
                    crc.update(block);
                    if let Some((read, t)) = read {
                        ReadSplit::add(read, t.elapsed());
                    }
                    at += block.len() as u64;
                }
                if crc.finalize() != chunk.crc {
                    return Err(ImageError::Corrupted(format!(
                        "memory chunk at file offset {} fails its checksum",
                        chunk.at
                    )));
                }
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

/// Where this thread's chunk reads ([`FileChunks::read_into`]) spent their time since it last
/// asked: reading the image's file and checking the checksum, in nanoseconds. Kept only while
/// the step timing is on (`phos::cr_timing`).
pub struct ReadSplit;

thread_local! {
    static READ_SPLIT: std::cell::Cell<(u64, u64)> = const { std::cell::Cell::new((0, 0)) };
}

impl ReadSplit {
    fn add(read: std::time::Duration, check: std::time::Duration) {
        READ_SPLIT.with(|c| {
            let (r, k) = c.get();
            c.set((r + read.as_nanos() as u64, k + check.as_nanos() as u64));
        });
    }

    /// (reading, checking) nanoseconds of this thread's reads since the last call.
    pub fn take() -> (u64, u64) {
        READ_SPLIT.with(|c| c.replace((0, 0)))
    }
}

/// How many threads copy memory for one checkpoint or restore: one per core, up to sixteen
/// (writing `/dev/shm` from 16 threads measured 39 GB/s on the GPU machine, 26 GB/s from 8;
/// past that the host link, not the cores, is the limit).
pub fn workers() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get()).clamp(1, 16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_writer_appends_to_its_own_file() {
        let dir = tempfile::tempdir().unwrap();
        let files: Vec<(PathBuf, File)> = (0..4)
            .map(|i| {
                let p = dir.path().join(format!("m{i}"));
                let f = File::create(&p).unwrap();
                (p, f)
            })
            .collect();
        let set = FileSet::new(files);
        std::thread::scope(|s| {
            for t in 0..4usize {
                let set = &set;
                s.spawn(move || {
                    for k in 0..8u64 {
                        assert_eq!(set.append(t, &[t as u8 + 1; 1024]).unwrap(), k * 1024);
                    }
                });
            }
        });
        assert_eq!(set.lengths(), vec![8 * 1024; 4]);
        assert!(set.append(4, b"x").is_err(), "no fifth file");
        set.sync().unwrap();
        for t in 0..4 {
            let bytes = std::fs::read(dir.path().join(format!("m{t}"))).unwrap();
            assert!(bytes.len() == 8 * 1024 && bytes.iter().all(|&b| b == t as u8 + 1));
        }
    }

    #[test]
    fn a_chunk_stored_in_blocks_is_whole_and_its_checksum_that_of_all_of_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("memory");
        let file = File::options().create(true).truncate(true).read(true).write(true).open(&path).unwrap();
        let set = FileSet::new(vec![(path.clone(), file)]);
        set.append(0, b"before").unwrap();
        let data: Vec<u8> = (0..STORE_BLOCK * 2 + 1234).map(|i| (i * 7 % 251) as u8).collect();
        let (at, crc) = store_raw(&set, 0, &data).unwrap();
        assert_eq!(at, 6);
        assert_eq!(crc, crc32fast::hash(&data));
        let (next, _) = store_raw(&set, 0, b"after").unwrap();
        assert_eq!(next, 6 + data.len() as u64, "the next chunk follows the whole of this one");
        let written = std::fs::read(&path).unwrap();
        assert_eq!(&written[6..6 + data.len()], &data[..]);
    }

    #[test]
    fn chunks_read_back_checked_from_their_file() {
        let dir = tempfile::tempdir().unwrap();
        let data: Vec<u8> = (0..4096u32).map(|i| (i * 7) as u8).collect();
        let packed = zstd::bulk::compress(&data, 1).unwrap();
        let (first, second) = (dir.path().join("memory"), dir.path().join("memory.1"));
        std::fs::write(&first, &data).unwrap();
        let mut second_bytes = vec![9u8; 100];
        second_bytes.extend_from_slice(&packed);
        std::fs::write(&second, &second_bytes).unwrap();
        let open = |p: &Path| (p.to_path_buf(), File::open(p).unwrap());
        let reader = FileChunks::new(vec![open(&first), open(&second)]);
        let raw = Chunk {
            offset: 0,
            len: 4096,
            encoding: Encoding::Raw,
            stored: 4096,
            file: 0,
            at: 0,
            crc: crc32fast::hash(&data),
        };
        let zstd = Chunk {
            encoding: Encoding::Zstd,
            stored: packed.len() as u64,
            file: 1,
            at: 100,
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
        let elsewhere = Chunk { file: 2, ..raw };
        assert!(matches!(reader.read_into(&elsewhere, &mut [0u8; 4096]), Err(ImageError::Corrupted(_))));
    }
}
