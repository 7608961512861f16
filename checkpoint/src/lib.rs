//! Phos checkpoint and restore: the image that brings a session back, and the C/R engine that
//! writes and reads it.
//!
//! - The image (this module, [`format`], [`sink`], [`stream`]): a manifest and device memory
//!   chunks, in a directory (below) or streamed over any `Read`/`Write` ([`stream`]); the
//!   engine writes to an [`ImageSink`] and reads from an [`ImageSource`], of either kind.
//! - The engine ([`engine`]): the traits a server implements for it (quiesce, snapshot,
//!   device copies, rebuild, dirty log, the pre-call hook) and the protocols over them (today
//!   stop-the-world checkpoint and replaying restore), with typed errors ([`CrError`]) and
//!   the reports the management services answer ([`report`]).
//!
//! One crate, because the image and the engine that writes it change together (a streamed
//! image, a manifest's version, a protocol's chunk order are one decision), and because the
//! router and `phosctl`, which read images, need nothing the engine would add: it depends on
//! no server.
//!
//! A directory image:
//!
//! ```text
//! DIR/manifest   magic "PHOSIMG\0", format version (u32 LE), length (u64 LE),
//!                bincode Manifest, CRC-32 of everything before it (u32 LE)
//! DIR/memory     device memory chunks, back to back, as the manifest's chunk table says
//! ```
//!
//! The manifest says what the session was (id, tenant, ABI, device address range), how to
//! recreate its objects (the records of the calls that created them, in dependency order,
//! with the virtual handles they produced) and where each device memory range's contents
//! are. Memory is cut into chunks: an all-zero chunk is not stored at all, the others are
//! stored raw or compressed with zstd, each with a CRC-32 of its stored bytes.
//!
//! Nothing in an image is trusted before it is checked: [`Image::open`] refuses a manifest of
//! another format version, with a bad checksum, or whose chunks point past the end of the
//! memory file; [`Image::read_chunk`] checks each chunk's checksum and size before handing
//! the bytes over, and [`Image::verify`] checks them all. The content format of records is
//! the API server's business; this crate only carries them.

pub mod engine;
mod format;
pub mod migrate;
pub mod on_demand;
pub mod parallel;
pub mod piece_hash;
pub mod report;
pub mod sink;
pub mod stream;
pub mod timing;

use std::fs::File;
use std::io::{self, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use engine::CrError;
pub use format::*;
use parallel::FileSet;
pub use parallel::{ChunkReader, ChunkStore};
pub use sink::{ChunkHead, ImageSink, ImageSource, copy_image};
pub use stream::{StreamReader, StreamWriter};

/// Magic at the start of a manifest file.
pub const MAGIC: &[u8; 8] = b"PHOSIMG\0";
/// The format this build writes. Version 9 is version 8 with two fields more at the
/// manifest's end: the session's CUDA arrays (their contents too), mipmapped arrays, texture
/// and surface objects ([`Manifest::arrays`]) and its conditional graph node handles
/// ([`Manifest::conditionals`]); a version 8 reader refuses it by its version. Version 8 is
/// version 7 with one field more at the
/// manifest's end: the last synchronous call each channel answered, with its reply
/// ([`Manifest::sync_replies`]); a version 7 reader refuses it by its version. Version 7 is
/// version 6 whose graphs may hold node markers
/// (each node's handle, enabled state and operation count in an executable graph) and child
/// graphs a node owns: a version 6 reader refuses it by its version. Version 6 is version 5
/// whose graphs may hold host, event,
/// child-graph and symbol-copy nodes (operations a version 5 reader does not know: it refuses
/// the image by its version instead of failing to decode its graphs). Version 5 holds the
/// session's graphs ([`Manifest::graphs`]);
/// it is version 4 with that one field more at the manifest's end. Version 4 says which of the
/// guest's async calls had run ([`AsyncCallsRun`]); it is version 3 (memory in several files, a
/// chunk naming its file) with that one field more.
pub const FORMAT_VERSION: u32 = 9;
/// The oldest format this build reads: a version 3 image reads as one of version 4 in which no
/// async call is known to have run (what the build that took it assumed: the calls a guest sends
/// again after the restore run), a version 3 or 4 image as one without graphs (the builds
/// that took them kept none), and an image before version 8 as one without kept synchronous
/// replies (a synchronous call sent again after the restore runs, as those builds did), and an
/// image before version 9 as one without arrays, texture or surface objects or conditional
/// handles (the builds that took them refused to checkpoint sessions holding any). Version 2 (one memory file) and version 1 (one spec hash, records
/// of the runtime API only) are refused.
pub const OLDEST_FORMAT_READ: u32 = 3;
/// Memory files an image may have (`memory`, `memory.1`, ... `memory.63`).
pub const MAX_MEMORY_FILES: u32 = 64;
/// File names inside an image directory.
pub const MANIFEST_FILE: &str = "manifest";
pub const MEMORY_FILE: &str = "memory";

/// The name of memory file `index` of an image directory: [`MEMORY_FILE`], then
/// `memory.1`, `memory.2`...
pub fn memory_file_name(index: u32) -> String {
    if index == 0 { MEMORY_FILE.to_string() } else { format!("{MEMORY_FILE}.{index}") }
}
/// Default chunk size: large enough for fast copies, small enough to skip zero ranges.
pub const DEFAULT_CHUNK: usize = 4 << 20;
/// A manifest larger than this is refused (it holds module images, so it can be large).
pub(crate) const MAX_MANIFEST: u64 = 4 << 30;

/// Bounds on what an image may describe: far beyond any real session (whose objects are
/// bounded by its server's limits, checked again on restore), tight enough that an image
/// cannot make a reader allocate or loop without end.
pub mod bounds {
    /// Records (live objects) in one image.
    pub const RECORDS: usize = 1 << 24;
    /// Objects one record creates.
    pub const CREATES_PER_RECORD: usize = 8;
    /// Memory regions (allocations and module variables).
    pub const REGIONS: usize = 1 << 22;
    /// One chunk's length (the API server writes 8 MiB chunks).
    pub const CHUNK: u64 = 256 << 20;
    /// Handle counters (one per kind).
    pub const COUNTERS: usize = 64;
    /// A handle counter: handles number their objects in 48 bits.
    pub const COUNTER: u64 = 1 << 48;
    /// Session ids and restore counts (epochs) the router hands out.
    pub const SESSION_ID: u64 = 1 << 48;
    pub const EPOCH: u64 = 1 << 48;
    /// Devices of one session.
    pub const DEVICES: usize = 64;
    /// APIs a session speaks.
    pub const APIS: usize = 64;
    /// Lengths of names: a tenant, a function, an object kind, a module variable, a device.
    pub const TENANT: usize = 256;
    pub const NAME: usize = 1024;
    /// The program's name, as the guest sent it.
    pub const PROGRAM: usize = 4096;
    /// The CUDA ABIs a guest can present (the router's handshake accepts the same).
    pub const ABIS: [u32; 3] = [11, 12, 13];
    pub const BACKENDS: [&str; 2] = ["cuda", "emu"];
    /// Kept synchronous replies, and their bytes (a server keeps one per channel and a
    /// bounded number of ended channels').
    pub const SYNC_REPLIES: usize = 1 << 16;
    pub const SYNC_REPLY_BYTES: u64 = 1 << 30;
    /// Conditional graph node handles (a session holds at most 65536).
    pub const CONDITIONALS: usize = 1 << 16;
}

/// Why an image cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("{0} is not a Phos checkpoint image")]
    NotAnImage(PathBuf),
    #[error("the stream is not a Phos checkpoint image")]
    NotAStream,
    #[error("the image stream: {0}")]
    Stream(io::Error),
    #[error(
        "image format version {found}, which this build cannot read (it reads versions {OLDEST_FORMAT_READ} to \
         {FORMAT_VERSION}{}): restore it with a build of the version that took it",
        match *found {
            1 => "; version 1 images come from builds before images named the versions of their APIs",
            2 => "; version 2 images come from builds that stored memory in one file",
            _ => "",
        }
    )]
    Version { found: u32 },
    #[error("the image is truncated: {0}")]
    Truncated(String),
    #[error("the image is corrupted: {0}")]
    Corrupted(String),
    /// Intact (its checksums match), but describing what no real session could be.
    #[error("the image describes an impossible session: {0}")]
    Impossible(String),
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> ImageError + '_ {
    move |source| ImageError::Io { path: path.to_path_buf(), source }
}

/// How memory chunks are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    None,
    /// zstd at this level (1 is fast and usually halves real data).
    Zstd(i32),
}

/// Writes an image directory: memory first, region by region, then the manifest last, so
/// that a directory without a complete manifest is never mistaken for an image.
pub struct ImageWriter {
    dir: PathBuf,
    memory: BufWriter<File>,
    offset: u64,
    compression: Compression,
    chunk_size: usize,
    regions: Vec<MemoryRegion>,
    stored_bytes: u64,
    /// The manifest's head, when written through [`ImageSink`].
    head: Option<Manifest>,
    /// The memory files of writers on several threads ([`ImageSink::parallel`]).
    parallel: Option<Arc<FileSet>>,
    /// Memory files made ahead of the copy by [`prepare`](ImageWriter::prepare), with the
    /// room each was given.
    prepared: Vec<(PathBuf, File)>,
}

/// Images of less device memory than this are not prepared ([`ImageWriter::prepare`]): their
/// pages take less time to allocate than the threads that would allocate them ahead.
pub const PREPARED_AT_LEAST: u64 = 64 << 20;

impl ImageWriter {
    pub fn create(dir: &Path, compression: Compression, chunk_size: usize) -> Result<Self, ImageError> {
        std::fs::create_dir_all(dir).map_err(io_err(dir))?;
        // An old manifest must not survive next to new memory, nor old memory files.
        let _ = std::fs::remove_file(dir.join(MANIFEST_FILE));
        for i in 1..MAX_MEMORY_FILES {
            let _ = std::fs::remove_file(dir.join(memory_file_name(i)));
        }
        let path = dir.join(MEMORY_FILE);
        // Readable too: a memory file written by several threads is mapped, which needs both.
        let memory =
            File::options().read(true).write(true).create(true).truncate(true).open(&path).map_err(io_err(&path))?;
        Ok(ImageWriter {
            dir: dir.to_path_buf(),
            memory: BufWriter::with_capacity(1 << 20, memory),
            offset: 0,
            compression,
            chunk_size: chunk_size.max(4096),
            regions: Vec::new(),
            stored_bytes: 0,
            head: None,
            parallel: None,
            prepared: Vec::new(),
        })
    }

    /// Make the memory files of `writers` parallel writers ahead of the copy, each with room
    /// for its share of `bytes` (with a chunk to spare), allocated on one thread per file.
    ///
    /// On a memory file system (`/dev/shm`) most of a write's cost is allocating the file's
    /// pages: done before the checkpoint holds the session, it leaves the copy to fill pages
    /// that exist. Room not used is given back when the image is finished (or dropped). Where
    /// the file system cannot allocate ahead (`fallocate` unsupported), the files are made
    /// empty and grow as they are written, as without this. Images stored compressed are
    /// not prepared (their size is not known).
    pub fn prepare(&mut self, bytes: u64, writers: usize) -> Result<(), ImageError> {
        if self.compression != Compression::None
            || self.parallel.is_some()
            || !self.prepared.is_empty()
            || bytes < PREPARED_AT_LEAST
        {
            return Ok(());
        }
        // A writer's share in whole chunks, and one to spare (writers take pieces as they
        // come, not in equal parts).
        let chunk = self.chunk_size as u64;
        let chunks = bytes.div_ceil(chunk);
        let writers = writers.clamp(1, MAX_MEMORY_FILES as usize).min(chunks as usize);
        let share = (chunks.div_ceil(writers as u64) + 1).min(chunks) * chunk;
        let path = self.dir.join(MEMORY_FILE);
        self.memory.flush().map_err(io_err(&path))?;
        let mut files = vec![(path.clone(), self.memory.get_ref().try_clone().map_err(io_err(&path))?)];
        for i in 1..writers as u32 {
            let p = self.dir.join(memory_file_name(i));
            files.push((p.clone(), File::create(&p).map_err(io_err(&p))?));
        }
        std::thread::scope(|scope| {
            for (_, f) in &files {
                scope.spawn(move || parallel::allocate(f, share));
            }
        });
        self.prepared = files;
        Ok(())
    }

    pub fn chunk_size(&self) -> usize {
        self.chunk_size
    }

    pub fn compression(&self) -> Compression {
        self.compression
    }

    /// Start a memory region of `size` bytes at `addr`; its contents follow through
    /// [`add_chunk`](ImageWriter::add_chunk) in order.
    pub fn begin_region(&mut self, addr: u64, size: u64, device: i32, kind: RegionKind) {
        self.regions.push(MemoryRegion { addr, size, device, kind, chunks: Vec::new() });
    }

    /// Store the next chunk of the current region.
    pub fn add_chunk(&mut self, data: &[u8]) -> Result<(), ImageError> {
        let prepared = prepare_chunk(data, self.compression)?;
        self.add_prepared(data.len() as u64, prepared, data)
    }

    /// Store the next chunk of the current region, already prepared (by
    /// [`prepare_chunk`], possibly on another thread); `data` is the chunk itself.
    pub fn add_prepared(&mut self, len: u64, prepared: PreparedChunk, data: &[u8]) -> Result<(), ImageError> {
        let region = self.regions.last_mut().expect("begin_region first");
        let offset = region.chunks.last().map_or(0, |c| c.offset + c.len);
        if offset + len > region.size {
            return Err(ImageError::Corrupted(format!("chunk past the end of region {:#x}", region.addr)));
        }
        let (encoding, crc, bytes): (Encoding, u32, &[u8]) = match &prepared {
            PreparedChunk::Zero => {
                region.chunks.push(Chunk { offset, len, encoding: Encoding::Zero, stored: 0, file: 0, at: 0, crc: 0 });
                return Ok(());
            }
            PreparedChunk::Raw { crc } => (Encoding::Raw, *crc, data),
            PreparedChunk::Zstd { crc, bytes } => (Encoding::Zstd, *crc, bytes),
        };
        let path = self.dir.join(MEMORY_FILE);
        self.memory.write_all(bytes).map_err(io_err(&path))?;
        region.chunks.push(Chunk { offset, len, encoding, stored: bytes.len() as u64, file: 0, at: self.offset, crc });
        self.offset += bytes.len() as u64;
        self.stored_bytes += bytes.len() as u64;
        Ok(())
    }

    /// Bytes written to the memory file so far.
    pub fn stored_bytes(&self) -> u64 {
        self.stored_bytes
    }

    /// Write the manifest (with the regions added here) and make everything durable.
    pub fn finish(mut self, manifest: Manifest) -> Result<ImageSummary, ImageError> {
        self.finish_with(manifest)
    }

    fn finish_with(&mut self, mut manifest: Manifest) -> Result<ImageSummary, ImageError> {
        let mpath = self.dir.join(MEMORY_FILE);
        if let Some(files) = &self.parallel {
            // Every writer is done (the engine joined them). Chunks came in the order they
            // finished; tables list them in the order of their place in memory. The room made
            // ahead and not used is given back when the writer is dropped, not here: cutting a
            // memory file frees its pages (16-35 ms for the 120-250 MiB left over at 1-4 GiB on
            // the GPU machine), and a checkpoint holds its session until the image is complete;
            // its caller drops the writer once the session goes on. Room past what a chunk
            // table names is never read.
            timing::timed(|| "syncing the memory files".into(), || files.sync())?;
            self.offset = files.lengths()[0];
            for r in &mut self.regions {
                r.chunks.sort_by_key(|c| c.offset);
            }
        }
        self.memory.flush().map_err(io_err(&mpath))?;
        // Files prepared for parallel writers that were written in order instead: `memory`
        // holds what was written, the others nothing.
        for (i, (path, f)) in std::mem::take(&mut self.prepared).into_iter().enumerate() {
            f.set_len(if i == 0 { self.offset } else { 0 }).map_err(io_err(&path))?;
        }
        self.memory.get_ref().sync_all().map_err(io_err(&mpath))?;
        for r in &self.regions {
            let covered: u64 = r.chunks.iter().map(|c| c.len).sum();
            if covered != r.size {
                return Err(ImageError::Corrupted(format!(
                    "region {:#x} has {covered} of its {} bytes",
                    r.addr, r.size
                )));
            }
        }
        manifest.format = FORMAT_VERSION;
        manifest.memory = std::mem::take(&mut self.regions);
        let manifest_bytes = timing::timed(|| "writing the manifest".into(), || write_manifest(&self.dir, &manifest))?;
        let memory_bytes = manifest.memory.iter().map(|r| r.size).sum();
        Ok(ImageSummary { manifest_bytes, memory_bytes, stored_bytes: self.stored_bytes })
    }
}

impl Drop for ImageWriter {
    fn drop(&mut self) {
        // The room made ahead and not used is given back: all of it for an image not finished
        // (its memory files keep what was written; the directory is not an image without a
        // manifest), what is past the written end of each file for a finished one (see
        // `finish_with`).
        for (_, f) in &self.prepared {
            let _ = f.set_len(0);
        }
        if let Some(files) = &self.parallel
            && let Err(e) = timing::timed(|| "cutting the memory files to what was written".into(), || files.trim())
        {
            tracing::warn!("giving back an image's unused room: {e}");
        }
    }
}

/// Write `manifest` as `dir`'s manifest (header, body, checksum), durably: to a temporary
/// name, synced, then renamed, so that a crash leaves no half manifest. Returns its size.
/// (Tools that edit an image's manifest use it too; the checksum guards against damage,
/// not against edits, which is why [`Image::open`] also checks what a manifest means.)
pub fn write_manifest(dir: &Path, manifest: &Manifest) -> Result<u64, ImageError> {
    let body = bincode::encode_to_vec(manifest, config()).expect("encoding into memory");
    let mut bytes = Vec::with_capacity(body.len() + 24);
    bytes.extend_from_slice(MAGIC);
    bytes.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    bytes.extend_from_slice(&(body.len() as u64).to_le_bytes());
    bytes.extend_from_slice(&body);
    let crc = crc32fast::hash(&bytes);
    bytes.extend_from_slice(&crc.to_le_bytes());
    let tmp = dir.join(format!("{MANIFEST_FILE}.tmp"));
    let path = dir.join(MANIFEST_FILE);
    {
        let mut f = File::create(&tmp).map_err(io_err(&tmp))?;
        f.write_all(&bytes).map_err(io_err(&tmp))?;
        f.sync_all().map_err(io_err(&tmp))?;
    }
    std::fs::rename(&tmp, &path).map_err(io_err(&path))?;
    Ok(bytes.len() as u64)
}

/// A chunk checked for zeros, compressed and checksummed: the work of storing it that does
/// not touch the file, so that it can run beside the writing.
#[derive(Debug)]
pub enum PreparedChunk {
    Zero,
    Raw { crc: u32 },
    Zstd { crc: u32, bytes: Vec<u8> },
}

/// Prepare a chunk for [`ImageWriter::add_prepared`].
impl ImageWriter {
    /// Starts the parallel writing of [`ImageSink::parallel`]: the memory file mapped with
    /// room for `capacity` bytes, every region of the head begun.
    pub(crate) fn start_parallel(&mut self, writers: usize) -> Result<Arc<FileSet>, ImageError> {
        let head = self.head.as_ref().ok_or_else(|| ImageError::Corrupted("no manifest head".into()))?;
        if self.offset != 0 || !self.regions.is_empty() || self.parallel.is_some() {
            return Err(ImageError::Corrupted("parallel writing of an image already started".into()));
        }
        let path = self.dir.join(MEMORY_FILE);
        self.memory.flush().map_err(io_err(&path))?;
        // The first writer's file is `memory`, opened already; the others' are new, or those
        // `prepare` made (as many as it made: fewer writers leave the rest empty).
        let writers = writers.clamp(1, MAX_MEMORY_FILES as usize);
        let mut files = std::mem::take(&mut self.prepared);
        for (p, unused) in files.split_off(writers.min(files.len())) {
            unused.set_len(0).map_err(io_err(&p))?;
        }
        if files.is_empty() {
            files.push((path.clone(), self.memory.get_ref().try_clone().map_err(io_err(&path))?));
        }
        for i in files.len() as u32..writers as u32 {
            let p = self.dir.join(memory_file_name(i));
            files.push((p.clone(), File::create(&p).map_err(io_err(&p))?));
        }
        for r in head.memory.clone() {
            self.begin_region(r.addr, r.size, r.device, r.kind);
        }
        let set = Arc::new(FileSet::new(files));
        self.parallel = Some(set.clone());
        Ok(set)
    }

    /// A chunk stored through the mapping, entered in region `region`'s table.
    pub(crate) fn enter_stored(&mut self, region: usize, chunk: Chunk) -> Result<(), ImageError> {
        let r = self.regions.get_mut(region).ok_or_else(|| ImageError::Corrupted(format!("no region {region}")))?;
        if chunk.offset.checked_add(chunk.len).is_none_or(|end| end > r.size) {
            return Err(ImageError::Corrupted(format!("chunk past the end of region {:#x}", r.addr)));
        }
        self.stored_bytes += chunk.stored;
        r.chunks.push(chunk);
        Ok(())
    }
}

pub fn prepare_chunk(data: &[u8], compression: Compression) -> Result<PreparedChunk, ImageError> {
    if is_zero(data) {
        return Ok(PreparedChunk::Zero);
    }
    if let Compression::Zstd(level) = compression {
        let compressed = zstd::bulk::compress(data, level)
            .map_err(|e| ImageError::Corrupted(format!("compressing a chunk: {e}")))?;
        if compressed.len() < data.len() {
            return Ok(PreparedChunk::Zstd { crc: crc32fast::hash(&compressed), bytes: compressed });
        }
    }
    Ok(PreparedChunk::Raw { crc: crc32fast::hash(data) })
}

/// Sizes of a written image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageSummary {
    pub manifest_bytes: u64,
    /// Device memory the image covers.
    pub memory_bytes: u64,
    /// Bytes actually stored for it (zeros skipped, compression).
    pub stored_bytes: u64,
}

pub(crate) fn is_zero(data: &[u8]) -> bool {
    // SAFETY: every bit pattern is a u64, and align_to puts only aligned whole words in the
    // middle part.
    let (head, words, tail) = unsafe { data.align_to::<u64>() };
    head.iter().all(|&b| b == 0) && words.iter().all(|&w| w == 0) && tail.iter().all(|&b| b == 0)
}

pub(crate) fn config() -> bincode::config::Configuration<
    bincode::config::LittleEndian,
    bincode::config::Fixint,
    bincode::config::Limit<{ MAX_MANIFEST as usize }>,
> {
    bincode::config::standard().with_little_endian().with_fixed_int_encoding().with_limit::<{ MAX_MANIFEST as usize }>()
}

/// Decoding a manifest may allocate at most this many times its size: bincode charges a
/// container's `length × size_of::<T>()` against the decode limit before allocating it, and
/// lengths are the image's word; a manifest's largest expansion (a list of empty strings)
/// is 3 times. The rest of the limit is claimed before decoding starts.
const MANIFEST_MEMORY_FACTOR: usize = 4;

/// Decode a manifest body; whether bytes were left after it.
/// Whether this build reads images of format `version`.
fn format_read(version: u32) -> bool {
    (OLDEST_FORMAT_READ..=FORMAT_VERSION).contains(&version)
}

/// The manifest of an image of format `version` (one [`format_read`] accepts), and whether
/// bytes follow it. A version 8 manifest is a version 9 one without its last two fields, a
/// version 5 to 7 one without its last three, a version 4 one without its last four, a
/// version 3 one without its last five: they are read with those fields empty.
fn decode_manifest(body: &[u8], version: u32) -> Result<(Manifest, bool), bincode::error::DecodeError> {
    use bincode::de::read::Reader;
    use bincode::de::{Decode, Decoder, DecoderImpl};
    let completed;
    // Versions 5 to 7 have the same fields.
    let body = if version < 9 {
        let mut b = body.to_vec();
        let fail = |e: bincode::error::EncodeError| bincode::error::DecodeError::OtherString(e.to_string());
        if version == 3 {
            bincode::encode_into_std_write(AsyncCallsRun::default(), &mut b, config()).map_err(fail)?;
        }
        if version < 5 {
            bincode::encode_into_std_write(Vec::<u8>::new(), &mut b, config()).map_err(fail)?;
        }
        if version < 8 {
            bincode::encode_into_std_write(Vec::<KeptReply>::new(), &mut b, config()).map_err(fail)?;
        }
        bincode::encode_into_std_write(Vec::<u8>::new(), &mut b, config()).map_err(fail)?;
        bincode::encode_into_std_write(Vec::<ConditionalHandle>::new(), &mut b, config()).map_err(fail)?;
        completed = b;
        &completed[..]
    } else {
        body
    };
    let mut decoder = DecoderImpl::new(bincode::de::read::SliceReader::new(body), config(), ());
    let budget = body.len().saturating_mul(MANIFEST_MEMORY_FACTOR).saturating_add(4096);
    decoder.claim_bytes_read((MAX_MANIFEST as usize).saturating_sub(budget))?;
    let manifest = Manifest::decode(&mut decoder)?;
    let trailing = decoder.reader().peek_read(1).is_some();
    Ok((manifest, trailing))
}

/// An image opened for reading, its manifest checked.
pub struct Image {
    dir: PathBuf,
    pub manifest: Manifest,
    /// The memory files the chunks name, with their lengths, by index.
    memory: Vec<(PathBuf, File, u64)>,
    /// Where [`ImageSource::next_chunk`] is: (region, chunk) next, and the chunk it gave.
    cursor: (usize, usize),
    current: Option<Chunk>,
}

impl Image {
    pub fn open(dir: &Path) -> Result<Image, ImageError> {
        let path = dir.join(MANIFEST_FILE);
        let mut f = File::open(&path).map_err(|e| {
            if e.kind() == io::ErrorKind::NotFound {
                ImageError::NotAnImage(dir.to_path_buf())
            } else {
                io_err(&path)(e)
            }
        })?;
        let len = f.metadata().map_err(io_err(&path))?.len();
        let mut head = [0u8; 20];
        if len < 24 {
            return Err(ImageError::Truncated(format!("the manifest has {len} bytes")));
        }
        f.read_exact(&mut head).map_err(io_err(&path))?;
        if &head[..8] != MAGIC {
            return Err(ImageError::NotAnImage(dir.to_path_buf()));
        }
        let version = u32::from_le_bytes(head[8..12].try_into().unwrap());
        if !format_read(version) {
            return Err(ImageError::Version { found: version });
        }
        let body_len = u64::from_le_bytes(head[12..20].try_into().unwrap());
        if body_len > MAX_MANIFEST {
            return Err(ImageError::Corrupted(format!(
                "the manifest's length field ({body_len}) is over the limit of {MAX_MANIFEST} bytes"
            )));
        }
        if 20 + body_len + 4 != len {
            return Err(if 20 + body_len + 4 > len {
                ImageError::Truncated(format!("the manifest should have {} bytes, it has {len}", 20 + body_len + 4))
            } else {
                ImageError::Corrupted(format!("the manifest's length field ({body_len}) does not match its file"))
            });
        }
        let mut rest = vec![0u8; body_len as usize + 4];
        f.read_exact(&mut rest).map_err(io_err(&path))?;
        let mut hasher = crc32fast::Hasher::new();
        hasher.update(&head);
        hasher.update(&rest[..body_len as usize]);
        let stored_crc = u32::from_le_bytes(rest[body_len as usize..].try_into().unwrap());
        if hasher.finalize() != stored_crc {
            return Err(ImageError::Corrupted("the manifest's checksum does not match".into()));
        }
        let (manifest, trailing) = decode_manifest(&rest[..body_len as usize], version)
            .map_err(|e| ImageError::Corrupted(format!("the manifest does not decode: {e}")))?;
        if trailing || manifest.format != version {
            return Err(ImageError::Corrupted("the manifest has trailing or inconsistent data".into()));
        }
        // The memory files the chunks name: `memory` always, the others as far as named.
        let files = manifest
            .memory
            .iter()
            .flat_map(|r| r.chunks.iter())
            .filter(|c| c.encoding != Encoding::Zero)
            .map(|c| c.file)
            .max()
            .unwrap_or(0);
        if files >= MAX_MEMORY_FILES {
            return Err(ImageError::Corrupted(format!(
                "a chunk in memory file {files}; an image has at most {MAX_MEMORY_FILES}"
            )));
        }
        let mut memory = Vec::new();
        for i in 0..=files {
            let mpath = dir.join(memory_file_name(i));
            let f = File::open(&mpath).map_err(io_err(&mpath))?;
            let len = f.metadata().map_err(io_err(&mpath))?.len();
            memory.push((mpath, f, len));
        }
        let image = Image { dir: dir.to_path_buf(), manifest, memory, cursor: (0, 0), current: None };
        image.check_layout()?;
        check_meaning(&image.manifest)?;
        Ok(image)
    }

    /// Every chunk inside the memory file, every region covered exactly once by its chunks.
    fn check_layout(&self) -> Result<(), ImageError> {
        for r in &self.manifest.memory {
            let mut next = 0u64;
            for c in &r.chunks {
                if c.offset != next || c.len == 0 {
                    return Err(ImageError::Corrupted(format!("region {:#x}: chunks out of order", r.addr)));
                }
                next = c
                    .offset
                    .checked_add(c.len)
                    .ok_or_else(|| ImageError::Corrupted("chunk length overflows".into()))?;
                if c.encoding != Encoding::Zero {
                    let end =
                        c.at.checked_add(c.stored)
                            .ok_or_else(|| ImageError::Corrupted("chunk offset overflows".into()))?;
                    let (path, _, len) = &self.memory[c.file as usize];
                    if end > *len {
                        return Err(ImageError::Truncated(format!(
                            "region {:#x} needs {end} bytes of {}, which has {len}",
                            r.addr,
                            path.display()
                        )));
                    }
                    if c.encoding == Encoding::Raw && c.stored != c.len {
                        return Err(ImageError::Corrupted(format!(
                            "region {:#x}: raw chunk of the wrong size",
                            r.addr
                        )));
                    }
                }
            }
            if next != r.size {
                return Err(ImageError::Corrupted(format!("region {:#x} is not fully described", r.addr)));
            }
        }
        Ok(())
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The memory files, by index: a second handle of each (the image cannot be swapped
    /// underneath the reader that gets them).
    pub(crate) fn memory_files(&self) -> std::io::Result<Vec<(PathBuf, File)>> {
        self.memory.iter().map(|(p, f, _)| Ok((p.clone(), f.try_clone()?))).collect()
    }

    /// Reads `out.len()` stored bytes of `chunk` from its file.
    fn read_stored(&self, chunk: &Chunk, out: &mut [u8]) -> Result<(), ImageError> {
        use std::os::unix::fs::FileExt;
        let (path, file, _) = self.memory.get(chunk.file as usize).ok_or_else(|| {
            ImageError::Corrupted(format!("a chunk in memory file {}, which is not there", chunk.file))
        })?;
        file.read_exact_at(out, chunk.at).map_err(io_err(path))
    }

    /// The contents of one chunk, checked, into `out` (resized to the chunk's length).
    pub fn read_chunk(&mut self, chunk: &Chunk, out: &mut Vec<u8>) -> Result<(), ImageError> {
        out.clear();
        match chunk.encoding {
            Encoding::Zero => {
                out.resize(chunk.len as usize, 0);
                return Ok(());
            }
            Encoding::Raw | Encoding::Zstd => {}
        }
        let mut stored = vec![0u8; chunk.stored as usize];
        self.read_stored(chunk, &mut stored)?;
        if crc32fast::hash(&stored) != chunk.crc {
            return Err(ImageError::Corrupted(format!("memory chunk at file offset {} fails its checksum", chunk.at)));
        }
        match chunk.encoding {
            Encoding::Raw => *out = stored,
            Encoding::Zstd => {
                *out = zstd::bulk::decompress(&stored, chunk.len as usize).map_err(|e| {
                    ImageError::Corrupted(format!("memory chunk at {} does not decompress: {e}", chunk.at))
                })?;
                if out.len() as u64 != chunk.len {
                    return Err(ImageError::Corrupted(format!("memory chunk at {} has the wrong size", chunk.at)));
                }
            }
            Encoding::Zero => unreachable!(),
        }
        Ok(())
    }

    /// The contents of one chunk, checked, into `out[..chunk.len]` (raw chunks are read
    /// straight into it).
    pub fn read_chunk_into(&mut self, chunk: &Chunk, out: &mut [u8]) -> Result<(), ImageError> {
        let len = chunk.len as usize;
        if out.len() < len {
            return Err(ImageError::Corrupted(format!("chunk of {len} bytes for a buffer of {}", out.len())));
        }
        let out = &mut out[..len];
        match chunk.encoding {
            Encoding::Zero => out.fill(0),
            Encoding::Raw => {
                self.read_stored(chunk, out)?;
                if crc32fast::hash(out) != chunk.crc {
                    return Err(ImageError::Corrupted(format!(
                        "memory chunk at file offset {} fails its checksum",
                        chunk.at
                    )));
                }
            }
            Encoding::Zstd => {
                let mut v = Vec::new();
                self.read_chunk(chunk, &mut v)?;
                out.copy_from_slice(&v);
            }
        }
        Ok(())
    }

    /// Read and check every chunk (a restore can call this first, to touch nothing unless
    /// the whole image is sound).
    pub fn verify(&mut self) -> Result<(), ImageError> {
        // A zero chunk has nothing stored to check.
        let chunks: Vec<Chunk> = self
            .manifest
            .memory
            .iter()
            .flat_map(|r| r.chunks.iter().copied())
            .filter(|c| c.encoding != Encoding::Zero)
            .collect();
        let mut buf = Vec::new();
        for c in &chunks {
            self.read_chunk(c, &mut buf)?;
        }
        Ok(())
    }
}

/// What a manifest says must be something a real session could have been: a checksum only
/// says that the bytes are the ones written, and a manifest can be edited and its checksum
/// recomputed. The API server checks the records against its spec and limits on restore;
/// this checks what needs no server.
pub fn check_meaning(m: &Manifest) -> Result<(), ImageError> {
    use bounds::*;
    let bad = |why: String| Err(ImageError::Impossible(why));
    let s = &m.session;
    if s.id == 0 || s.id >= SESSION_ID {
        return bad(format!("session id {} is not one a router hands out", s.id));
    }
    if s.epoch >= EPOCH {
        return bad(format!("restore count {} is out of range", s.epoch));
    }
    if !ABIS.contains(&s.abi_major) {
        return bad(format!("CUDA ABI {} (a guest presents 11, 12 or 13)", s.abi_major));
    }
    if s.tenant.is_empty() || s.tenant.len() > TENANT || s.tenant.chars().any(char::is_control) {
        return bad(format!("the tenant name {:?} is not a tenant's", s.tenant));
    }
    if s.program.len() > PROGRAM {
        return bad(format!("a program name of {} bytes", s.program.len()));
    }
    if !BACKENDS.contains(&s.backend.as_str()) {
        return bad(format!("backend {:?}", s.backend));
    }
    if s.devices.len() > DEVICES || s.devices.iter().any(|d| d.len() > NAME) {
        return bad(format!("{} devices", s.devices.len()));
    }
    let Some(range_end) = s.device_base.checked_add(s.device_size).filter(|_| s.device_size > 0) else {
        return bad(format!("device range {:#x}+{:#x}", s.device_base, s.device_size));
    };
    if m.handle_counters.len() > COUNTERS {
        return bad(format!("{} handle counters", m.handle_counters.len()));
    }
    for (i, (kind, next)) in m.handle_counters.iter().enumerate() {
        if kind.len() > NAME || m.handle_counters[..i].iter().any(|(k, _)| k == kind) {
            return bad(format!("handle counter {kind:?} is named twice or too long"));
        }
        if *next == 0 || *next > COUNTER {
            return bad(format!("the {kind} counter is {next}: handles number their objects from 1 to 2^48"));
        }
    }
    if m.apis.is_empty() || m.apis.len() > APIS {
        return bad(format!("{} APIs", m.apis.len()));
    }
    for (i, a) in m.apis.iter().enumerate() {
        if a.name.is_empty() || a.name.len() > NAME || m.apis[..i].iter().any(|b| b.id == a.id) {
            return bad(format!("API {:?} (id {}) is named twice or badly", a.name, a.id));
        }
    }
    if m.records.len() > RECORDS {
        return bad(format!("{} records", m.records.len()));
    }
    for r in &m.records {
        if !m.apis.iter().any(|a| a.id == r.api) {
            return bad(format!("a record of {:?} of API id {}, which the image does not name", r.name, r.api));
        }
        if r.name.len() > NAME || r.creates.len() > CREATES_PER_RECORD || r.creates.iter().any(|(k, _)| k.len() > NAME)
        {
            return bad(format!("a record of {:?} with {} created objects", r.name, r.creates.len()));
        }
        if r.device < 0 || r.device as usize >= DEVICES {
            return bad(format!("a record of {} on device {}", r.name, r.device));
        }
    }
    if m.memory.len() > REGIONS {
        return bad(format!("{} memory regions", m.memory.len()));
    }
    let mut allocations = Vec::new();
    for r in &m.memory {
        if r.size == 0 || r.size > s.device_size || r.device < 0 || r.device as usize >= DEVICES {
            return bad(format!("a memory region of {} bytes at {:#x} on device {}", r.size, r.addr, r.device));
        }
        if let Some(c) = r.chunks.iter().find(|c| c.len > CHUNK) {
            return bad(format!("region {:#x} has a chunk of {} bytes", r.addr, c.len));
        }
        match &r.kind {
            RegionKind::Allocation => {
                if r.addr < s.device_base || r.addr.checked_add(r.size).is_none_or(|end| end > range_end) {
                    return bad(format!(
                        "allocation {:#x}+{:#x} lies outside the session's device range {:#x}..{range_end:#x}",
                        r.addr, r.size, s.device_base
                    ));
                }
                allocations.push((r.addr, r.size));
            }
            RegionKind::ModuleVariable { name, .. } => {
                if name.len() > NAME {
                    return bad(format!("a module variable name of {} bytes", name.len()));
                }
            }
        }
    }
    allocations.sort_unstable();
    if let Some(w) = allocations.windows(2).find(|w| w[0].0 + w[0].1 > w[1].0) {
        return bad(format!("allocations {:#x} and {:#x} overlap", w[0].0, w[1].0));
    }
    if m.sync_replies.len() > SYNC_REPLIES {
        return bad(format!("{} kept synchronous replies", m.sync_replies.len()));
    }
    for (i, r) in m.sync_replies.iter().enumerate() {
        if r.call_id == 0 || m.sync_replies[..i].iter().any(|o| o.call_id == r.call_id) {
            return bad(format!("a kept reply to call id {} (none, or twice)", r.call_id));
        }
        if !m.apis.iter().any(|a| a.id == r.api) {
            return bad(format!("a kept reply of API id {}, which the image does not name", r.api));
        }
    }
    let kept: u64 = m.sync_replies.iter().map(|r| r.payload.len() as u64).sum();
    if kept > SYNC_REPLY_BYTES {
        return bad(format!("kept synchronous replies of {kept} bytes"));
    }
    if m.conditionals.len() > CONDITIONALS {
        return bad(format!("{} conditional handles", m.conditionals.len()));
    }
    for (i, c) in m.conditionals.iter().enumerate() {
        // Each is the 4-byte cell of an allocation of the session's, named once.
        let cell = allocations.binary_search_by_key(&c.cell, |a| a.0).ok().map(|j| allocations[j]);
        if cell.is_none_or(|(_, size)| size < 4) || m.conditionals[..i].iter().any(|o| o.cell == c.cell) {
            return bad(format!(
                "a conditional handle {:#x} that is no cell of the session's memory, or named twice",
                c.cell
            ));
        }
        if c.flags > 1 || c.device < 0 || c.device as usize >= DEVICES {
            return bad(format!("a conditional handle {:#x} of flags {} on device {}", c.cell, c.flags, c.device));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
