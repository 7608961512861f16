//! An image as one stream of bytes, over any `Write` or `Read`: a file, a pipe, a socket to
//! another server (a migration). The same manifest and chunk encodings as a directory image,
//! in the order the engine produces them, so the reader can restore while the writer is
//! still copying (little-endian throughout):
//!
//! ```text
//! magic "PHOSSTM\0", format version (u32)
//! head:   length n (u64), n bytes of bincode Manifest whose regions have empty chunk
//!         tables, CRC-32 of everything before it (u32)
//! chunk:  1 (u8), region (u32), len (u64), encoding (u8: 0 zero, 1 raw, 2 zstd),
//!         stored (u64), CRC-32 of the stored bytes (u32), CRC-32 of this header (u32),
//!         then the stored bytes
//! end:    2 (u8), chunks (u64), stored bytes (u64), CRC-32 of this record (u32)
//! ```
//!
//! Chunks come region by region in manifest order, each region covered from its start to its
//! end. Nothing is trusted: the reader checks the head as [`Image::open`](crate::Image::open)
//! checks a manifest, every chunk header against the head and the chunks before it, every
//! chunk's bytes as they are read, and the end record against what came.

use std::io::{self, BufWriter, Read, Write};

use crate::sink::{ChunkHead, ImageSink, ImageSource};
use crate::{FORMAT_VERSION, ImageError, ImageSummary, MAX_MANIFEST, Manifest, PreparedChunk, bounds, config};

/// Magic at the start of an image stream.
pub const STREAM_MAGIC: &[u8; 8] = b"PHOSSTM\0";

const TAG_CHUNK: u8 = 1;
const TAG_END: u8 = 2;
const ZERO: u8 = 0;
const RAW: u8 = 1;
const ZSTD: u8 = 2;
/// Bytes of a chunk header after its tag: region, len, encoding, stored, crc.
const CHUNK_HEADER: usize = 4 + 8 + 1 + 8 + 4;

fn io(e: io::Error) -> ImageError {
    if e.kind() == io::ErrorKind::UnexpectedEof {
        ImageError::Truncated("the image stream ended early".into())
    } else {
        ImageError::Stream(e)
    }
}

/// Where the chunks are: the region being covered and how much of it is.
#[derive(Default)]
struct Coverage {
    region: usize,
    covered: u64,
    chunks: u64,
    stored: u64,
}

impl Coverage {
    /// Account for the next chunk of `region`, `len` bytes: it must continue the region being
    /// covered, or start the next one once that is whole. Its offset in the region.
    fn next(&mut self, head: &Manifest, region: usize, len: u64) -> Result<u64, ImageError> {
        let size_of = |r: usize| head.memory.get(r).map(|m| m.size);
        let Some(size) = size_of(region) else {
            return Err(ImageError::Corrupted(format!("a chunk of region {region}, which the image lacks")));
        };
        if region != self.region {
            let done = self.covered == size_of(self.region).unwrap_or(0) || (self.chunks == 0 && self.region == 0);
            if region != self.region + usize::from(self.chunks > 0) || !done {
                return Err(ImageError::Corrupted(format!("a chunk of region {region} out of order")));
            }
            self.region = region;
            self.covered = 0;
        }
        if len == 0 || len > bounds::CHUNK || self.covered.checked_add(len).is_none_or(|end| end > size) {
            return Err(ImageError::Corrupted(format!("region {region}: a chunk of {len} bytes past its end")));
        }
        let offset = self.covered;
        self.covered += len;
        self.chunks += 1;
        Ok(offset)
    }

    /// Every region covered.
    fn whole(&self, head: &Manifest) -> bool {
        match head.memory.len() {
            0 => self.chunks == 0,
            n => self.region == n - 1 && self.covered == head.memory[n - 1].size,
        }
    }
}

/// Writes an image as a stream (see the [module](self)).
pub struct StreamWriter<W: Write> {
    out: BufWriter<W>,
    head: Option<Manifest>,
    coverage: Coverage,
    manifest_bytes: u64,
}

impl<W: Write> StreamWriter<W> {
    pub fn new(out: W) -> Self {
        StreamWriter {
            out: BufWriter::with_capacity(1 << 20, out),
            head: None,
            coverage: Coverage::default(),
            manifest_bytes: 0,
        }
    }

    /// The stream, once [`complete`](ImageSink::complete) has flushed everything to it.
    pub fn into_inner(self) -> Result<W, ImageError> {
        self.out.into_inner().map_err(|e| ImageError::Stream(e.into_error()))
    }
}

impl<W: Write + Send> ImageSink for StreamWriter<W> {
    fn begin(&mut self, head: &Manifest) -> Result<(), ImageError> {
        if self.head.is_some() || head.memory.iter().any(|r| !r.chunks.is_empty()) {
            return Err(ImageError::Corrupted("a second head, or a head with chunk tables".into()));
        }
        let mut head = head.clone();
        head.format = FORMAT_VERSION;
        let body = bincode::encode_to_vec(&head, config()).expect("encoding into memory");
        let mut bytes = Vec::with_capacity(body.len() + 24);
        bytes.extend_from_slice(STREAM_MAGIC);
        bytes.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
        bytes.extend_from_slice(&(body.len() as u64).to_le_bytes());
        bytes.extend_from_slice(&body);
        let crc = crc32fast::hash(&bytes);
        bytes.extend_from_slice(&crc.to_le_bytes());
        self.out.write_all(&bytes).map_err(io)?;
        self.manifest_bytes = bytes.len() as u64;
        self.head = Some(head);
        Ok(())
    }

    fn chunk(&mut self, region: usize, len: u64, prepared: PreparedChunk, data: &[u8]) -> Result<(), ImageError> {
        let head = self.head.as_ref().ok_or_else(|| ImageError::Corrupted("a chunk before the head".into()))?;
        self.coverage.next(head, region, len)?;
        let (encoding, crc, bytes): (u8, u32, &[u8]) = match &prepared {
            PreparedChunk::Zero => (ZERO, 0, &[]),
            PreparedChunk::Raw { crc } => (RAW, *crc, data),
            PreparedChunk::Zstd { crc, bytes } => (ZSTD, *crc, bytes),
        };
        let mut header = Vec::with_capacity(1 + CHUNK_HEADER + 4);
        header.push(TAG_CHUNK);
        header.extend_from_slice(&(region as u32).to_le_bytes());
        header.extend_from_slice(&len.to_le_bytes());
        header.push(encoding);
        header.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
        header.extend_from_slice(&crc.to_le_bytes());
        let header_crc = crc32fast::hash(&header);
        header.extend_from_slice(&header_crc.to_le_bytes());
        self.out.write_all(&header).map_err(io)?;
        self.out.write_all(bytes).map_err(io)?;
        self.coverage.stored += bytes.len() as u64;
        Ok(())
    }

    fn complete(&mut self) -> Result<ImageSummary, ImageError> {
        let head = self.head.as_ref().ok_or_else(|| ImageError::Corrupted("no manifest head".into()))?;
        if !self.coverage.whole(head) {
            return Err(ImageError::Corrupted("the image ends before its last region is whole".into()));
        }
        let mut end = vec![TAG_END];
        end.extend_from_slice(&self.coverage.chunks.to_le_bytes());
        end.extend_from_slice(&self.coverage.stored.to_le_bytes());
        let crc = crc32fast::hash(&end);
        end.extend_from_slice(&crc.to_le_bytes());
        self.out.write_all(&end).map_err(io)?;
        self.out.flush().map_err(io)?;
        Ok(ImageSummary {
            manifest_bytes: self.manifest_bytes,
            memory_bytes: head.memory.iter().map(|r| r.size).sum(),
            stored_bytes: self.coverage.stored,
        })
    }
}

/// A chunk announced but not read yet.
struct Pending {
    len: u64,
    encoding: u8,
    stored: u64,
    crc: u32,
}

/// Reads an image stream (see the [module](self)), checking it as it goes.
pub struct StreamReader<R: Read> {
    input: R,
    manifest: Manifest,
    coverage: Coverage,
    pending: Option<Pending>,
    ended: bool,
}

fn read_array<const N: usize>(r: &mut impl Read) -> Result<[u8; N], ImageError> {
    let mut b = [0u8; N];
    r.read_exact(&mut b).map_err(io)?;
    Ok(b)
}

impl<R: Read> StreamReader<R> {
    /// Read and check the head: the magic, the format version, the manifest's checksum and
    /// what it says ([`check_meaning`](crate::check_meaning)).
    pub fn open(mut input: R) -> Result<Self, ImageError> {
        let head: [u8; 20] = read_array(&mut input)?;
        if &head[..8] != STREAM_MAGIC {
            return Err(ImageError::NotAStream);
        }
        let version = u32::from_le_bytes(head[8..12].try_into().expect("4 bytes"));
        if !crate::format_read(version) {
            return Err(ImageError::Version { found: version });
        }
        let body_len = u64::from_le_bytes(head[12..20].try_into().expect("8 bytes"));
        if body_len > MAX_MANIFEST {
            return Err(ImageError::Corrupted(format!(
                "the manifest's length field ({body_len}) is over the limit of {MAX_MANIFEST} bytes"
            )));
        }
        let mut body = Vec::new();
        (&mut input).take(body_len).read_to_end(&mut body).map_err(io)?;
        if body.len() as u64 != body_len {
            return Err(ImageError::Truncated("the image stream ended in its manifest".into()));
        }
        let stored_crc = u32::from_le_bytes(read_array(&mut input)?);
        let mut hasher = crc32fast::Hasher::new();
        hasher.update(&head);
        hasher.update(&body);
        if hasher.finalize() != stored_crc {
            return Err(ImageError::Corrupted("the manifest's checksum does not match".into()));
        }
        // Decoded as a directory's manifest is: its lengths cannot make the reader allocate.
        let (manifest, trailing) = crate::decode_manifest(&body, version)
            .map_err(|e| ImageError::Corrupted(format!("the manifest does not decode: {e}")))?;
        if trailing || manifest.format != version || manifest.memory.iter().any(|r| !r.chunks.is_empty()) {
            return Err(ImageError::Corrupted("the manifest has trailing or inconsistent data".into()));
        }
        crate::check_meaning(&manifest)?;
        Ok(StreamReader { input, manifest, coverage: Coverage::default(), pending: None, ended: false })
    }

    /// Skip the bytes of a chunk that was not read.
    fn skip_pending(&mut self) -> Result<(), ImageError> {
        if let Some(p) = self.pending.take() {
            let skipped = io::copy(&mut (&mut self.input).take(p.stored), &mut io::sink()).map_err(io)?;
            if skipped != p.stored {
                return Err(ImageError::Truncated("the image stream ended in a chunk".into()));
            }
        }
        Ok(())
    }

    fn end(&mut self) -> Result<(), ImageError> {
        let rest: [u8; 20] = read_array(&mut self.input)?;
        let chunks = u64::from_le_bytes(rest[..8].try_into().expect("8 bytes"));
        let stored = u64::from_le_bytes(rest[8..16].try_into().expect("8 bytes"));
        let mut hasher = crc32fast::Hasher::new();
        hasher.update(&[TAG_END]);
        hasher.update(&rest[..16]);
        if hasher.finalize() != u32::from_le_bytes(rest[16..].try_into().expect("4 bytes")) {
            return Err(ImageError::Corrupted("the end of the image stream fails its checksum".into()));
        }
        if (chunks, stored) != (self.coverage.chunks, self.coverage.stored) || !self.coverage.whole(&self.manifest) {
            return Err(ImageError::Corrupted(format!(
                "the image stream ends after {} chunks of {} bytes, and says {chunks} of {stored}, or leaves a region short",
                self.coverage.chunks, self.coverage.stored
            )));
        }
        self.ended = true;
        Ok(())
    }
}

impl<R: Read + Send> ImageSource for StreamReader<R> {
    fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    fn next_chunk(&mut self) -> Result<Option<ChunkHead>, ImageError> {
        if self.ended {
            return Ok(None);
        }
        self.skip_pending()?;
        let [tag] = read_array::<1>(&mut self.input)?;
        match tag {
            TAG_END => {
                self.end()?;
                return Ok(None);
            }
            TAG_CHUNK => {}
            other => return Err(ImageError::Corrupted(format!("an unknown record {other} in the image stream"))),
        }
        let header: [u8; CHUNK_HEADER] = read_array(&mut self.input)?;
        let header_crc = u32::from_le_bytes(read_array(&mut self.input)?);
        let mut hasher = crc32fast::Hasher::new();
        hasher.update(&[TAG_CHUNK]);
        hasher.update(&header);
        if hasher.finalize() != header_crc {
            return Err(ImageError::Corrupted("a chunk header fails its checksum".into()));
        }
        let region = u32::from_le_bytes(header[0..4].try_into().expect("4 bytes")) as usize;
        let len = u64::from_le_bytes(header[4..12].try_into().expect("8 bytes"));
        let encoding = header[12];
        let stored = u64::from_le_bytes(header[13..21].try_into().expect("8 bytes"));
        let crc = u32::from_le_bytes(header[21..25].try_into().expect("4 bytes"));
        let offset = self.coverage.next(&self.manifest, region, len)?;
        let fits = match encoding {
            ZERO => stored == 0,
            RAW => stored == len,
            // Stored compressed only when smaller.
            ZSTD => stored < len,
            _ => false,
        };
        if !fits {
            return Err(ImageError::Corrupted(format!(
                "region {region}: a chunk of encoding {encoding} storing {stored} of {len} bytes"
            )));
        }
        self.coverage.stored += stored;
        if encoding != ZERO {
            self.pending = Some(Pending { len, encoding, stored, crc });
        }
        Ok(Some(ChunkHead { region, offset, len, zero: encoding == ZERO }))
    }

    fn read_chunk(&mut self, out: &mut [u8]) -> Result<(), ImageError> {
        let Some(p) = self.pending.take() else {
            // A zero chunk (nothing stored), or nothing announced.
            return Err(ImageError::Corrupted("no stored chunk to read".into()));
        };
        let len = p.len as usize;
        if out.len() < len {
            return Err(ImageError::Corrupted(format!("chunk of {len} bytes for a buffer of {}", out.len())));
        }
        let out = &mut out[..len];
        match p.encoding {
            RAW => {
                self.input.read_exact(out).map_err(io)?;
                if crc32fast::hash(out) != p.crc {
                    return Err(ImageError::Corrupted("a memory chunk of the stream fails its checksum".into()));
                }
            }
            _ => {
                let mut stored = vec![0u8; p.stored as usize];
                self.input.read_exact(&mut stored).map_err(io)?;
                if crc32fast::hash(&stored) != p.crc {
                    return Err(ImageError::Corrupted("a memory chunk of the stream fails its checksum".into()));
                }
                let data = zstd::bulk::decompress(&stored, len)
                    .map_err(|e| ImageError::Corrupted(format!("a memory chunk does not decompress: {e}")))?;
                if data.len() != len {
                    return Err(ImageError::Corrupted("a memory chunk decompresses to the wrong size".into()));
                }
                out.copy_from_slice(&data);
            }
        }
        Ok(())
    }
}
