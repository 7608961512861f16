//! Where images go and come from. A checkpoint writes to an [`ImageSink`], a restore reads
//! from an [`ImageSource`]; either is a directory ([`ImageWriter`], [`Image`]) or a stream over
//! any `Write` or `Read` ([`StreamWriter`](crate::stream::StreamWriter),
//! [`StreamReader`](crate::stream::StreamReader)): a file, a pipe, a socket to another server.
//!
//! Both are sequential: the engine gives the sink the manifest's head (everything but the
//! memory's chunk tables) first, then every chunk of every region in order; a source gives
//! the manifest first, then the chunks in the same order. So an image can be restored while
//! it is still being written by the peer at the other end of a socket. A directory can also
//! be written and read by several threads at once ([`ImageSink::parallel`],
//! [`ImageSource::parallel`], module [`crate::parallel`]), which is how the engine uses it.

use std::sync::Arc;

use crate::parallel::FileChunks;
use crate::{
    Chunk, ChunkReader, ChunkStore, Encoding, Image, ImageError, ImageSummary, ImageWriter, Manifest, PreparedChunk,
};

/// Where a checkpoint writes its image.
pub trait ImageSink: Send {
    /// The image's manifest but for its memory's chunks: `head.memory` lists every region
    /// (address, size, device, kind) with an empty chunk table. Called once, first.
    fn begin(&mut self, head: &Manifest) -> Result<(), ImageError>;
    /// The next chunk of region `region` (an index into `head.memory`, regions in order,
    /// each from its start to its end): `len` bytes of memory, prepared by
    /// [`prepare_chunk`](crate::prepare_chunk); `data` is the chunk itself.
    fn chunk(&mut self, region: usize, len: u64, prepared: PreparedChunk, data: &[u8]) -> Result<(), ImageError>;
    /// Make the image whole (and durable, where that means something).
    fn complete(&mut self) -> Result<ImageSummary, ImageError>;
    /// Storage that `writers` threads may write chunks to at once, if this sink has such
    /// storage (a directory has: a memory file per writer; a stream, written in order, has
    /// not). Called after [`begin`](Self::begin), instead of [`chunk`](Self::chunk): chunks
    /// stored there are entered with [`stored_chunk`](Self::stored_chunk), in any order.
    fn parallel(&mut self, writers: usize) -> Result<Option<Arc<dyn ChunkStore>>, ImageError> {
        let _ = writers;
        Ok(None)
    }
    /// A chunk of region `region` whose bytes are in the [`parallel`](Self::parallel) store
    /// already.
    fn stored_chunk(&mut self, region: usize, chunk: Chunk) -> Result<(), ImageError> {
        let _ = (region, chunk);
        Err(ImageError::Corrupted("this image sink takes chunks in order only".into()))
    }
}

/// Where a restore reads an image from. The manifest is checked (checksum, layout as far as
/// it is known, meaning) before the source is handed out; each chunk is checked as it is
/// read.
pub trait ImageSource: Send {
    /// The manifest. Its regions are all listed; their chunk tables may be empty (a stream
    /// says where its chunks are as they come).
    fn manifest(&self) -> &Manifest;
    /// The next chunk, or `None` once every region has been covered.
    fn next_chunk(&mut self) -> Result<Option<ChunkHead>, ImageError>;
    /// The contents of the chunk [`next_chunk`](Self::next_chunk) gave last, checked, into
    /// `out[..len]`. A chunk not read is skipped.
    fn read_chunk(&mut self, out: &mut [u8]) -> Result<(), ImageError>;
    /// A reader several threads may read chunks with at once, if the source has one and the
    /// manifest's chunk tables are complete (a directory's; a stream's chunks come in
    /// order). Instead of [`next_chunk`](Self::next_chunk) and [`read_chunk`](Self::read_chunk).
    fn parallel(&self) -> Option<Arc<dyn ChunkReader>> {
        None
    }
}

/// Where a chunk belongs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkHead {
    /// Index of its region in the manifest.
    pub region: usize,
    /// Offset in the region and length.
    pub offset: u64,
    pub len: u64,
    /// All zeros: nothing to read.
    pub zero: bool,
}

impl ImageSink for ImageWriter {
    fn begin(&mut self, head: &Manifest) -> Result<(), ImageError> {
        if head.memory.iter().any(|r| !r.chunks.is_empty()) {
            return Err(ImageError::Corrupted("a manifest head with chunk tables".into()));
        }
        self.head = Some(head.clone());
        Ok(())
    }

    fn chunk(&mut self, region: usize, len: u64, prepared: PreparedChunk, data: &[u8]) -> Result<(), ImageError> {
        if self.head.is_none() {
            return Err(ImageError::Corrupted("a chunk before the head".into()));
        }
        // Regions are begun as their first chunk comes, in order.
        while self.regions.len() <= region {
            let r =
                self.head.as_ref().expect("checked").memory.get(self.regions.len()).ok_or_else(|| {
                    ImageError::Corrupted(format!("a chunk of region {region}, which the head lacks"))
                })?;
            let (addr, size, device, kind) = (r.addr, r.size, r.device, r.kind.clone());
            self.begin_region(addr, size, device, kind);
        }
        if region + 1 != self.regions.len() {
            return Err(ImageError::Corrupted(format!("a chunk of region {region} after a later region's")));
        }
        self.add_prepared(len, prepared, data)
    }

    fn complete(&mut self) -> Result<ImageSummary, ImageError> {
        let head = self.head.take().ok_or_else(|| ImageError::Corrupted("no manifest head".into()))?;
        // Regions without a chunk (an empty session's) still count: the check of coverage
        // in `finish_with` refuses a region left out.
        for r in head.memory.iter().skip(self.regions.len()) {
            self.begin_region(r.addr, r.size, r.device, r.kind.clone());
        }
        self.finish_with(head)
    }

    fn parallel(&mut self, writers: usize) -> Result<Option<Arc<dyn ChunkStore>>, ImageError> {
        Ok(Some(self.start_parallel(writers)?))
    }

    fn stored_chunk(&mut self, region: usize, chunk: Chunk) -> Result<(), ImageError> {
        self.enter_stored(region, chunk)
    }
}

impl ImageSource for Image {
    fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    fn next_chunk(&mut self) -> Result<Option<ChunkHead>, ImageError> {
        let (mut region, mut index) = self.cursor;
        loop {
            let Some(r) = self.manifest.memory.get(region) else { return Ok(None) };
            if let Some(c) = r.chunks.get(index) {
                self.cursor = (region, index + 1);
                self.current = Some(*c);
                return Ok(Some(ChunkHead {
                    region,
                    offset: c.offset,
                    len: c.len,
                    zero: c.encoding == Encoding::Zero,
                }));
            }
            (region, index) = (region + 1, 0);
        }
    }

    fn read_chunk(&mut self, out: &mut [u8]) -> Result<(), ImageError> {
        let c: Chunk = self.current.ok_or_else(|| ImageError::Corrupted("no chunk to read".into()))?;
        self.read_chunk_into(&c, out)
    }

    fn parallel(&self) -> Option<Arc<dyn ChunkReader>> {
        Some(Arc::new(FileChunks::new(self.memory_files().ok()?)))
    }
}

/// Copy an image from `source` to `sink`, checking every chunk on the way and storing it
/// again with `compression`: a stream received into a directory, a directory sent as a
/// stream.
pub fn copy_image(
    source: &mut dyn ImageSource,
    sink: &mut dyn ImageSink,
    compression: crate::Compression,
) -> Result<ImageSummary, ImageError> {
    let mut head = source.manifest().clone();
    for r in &mut head.memory {
        r.chunks.clear();
    }
    sink.begin(&head)?;
    let mut buf = Vec::new();
    while let Some(c) = source.next_chunk()? {
        buf.clear();
        buf.resize(c.len as usize, 0);
        if !c.zero {
            source.read_chunk(&mut buf)?;
        }
        let prepared = crate::prepare_chunk(&buf, compression)?;
        sink.chunk(c.region, c.len, prepared, &buf)?;
    }
    sink.complete()
}
