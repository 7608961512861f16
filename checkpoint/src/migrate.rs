//! A live migration's stream, from the session's server to the server it moves to, over any
//! `Read + Write` (a socket): the recopy's rounds as they are copied, then the manifest with
//! the session held, then the target's answer. Nothing lands on disk: the target keeps the
//! memory in host memory and restores from there, on demand ([`HeldImage`]).
//!
//! ```text
//! source: magic "PHOSMIG\0", key (16 bytes: the target's one-time key)
//!         piece: 1 (u8), region address (u64), region size (u64), offset (u64), len (u64),
//!                CRC-32 of the bytes (u32), then the bytes
//!         ... (a region is sent whole, from offset 0, the first time and whenever its size
//!         changed; then a piece replaces those bytes of it, a part written since)
//!         head:  2 (u8), length n (u64), n bytes of bincode Manifest (empty chunk tables)
//! target: 0 (u8): restored and serving; or 1 (u8), length (u32), why (UTF-8)
//! ```
//!
//! Little-endian throughout. The target trusts nothing: the key must match, every piece must
//! continue its region within the memory limit, every piece's checksum must match, and the
//! manifest must check (as an image's does) and name only regions received whole at their
//! size.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::sync::Arc;

use crate::engine::{COPY_CHUNK, CrError, RecopySink};
use crate::report::Progress;
use crate::{Chunk, ChunkReader, Encoding, ImageError, ImageSummary, MAX_MANIFEST, Manifest, MemoryRegion, config};

/// Magic at the start of a migration stream.
pub const MIGRATION_MAGIC: &[u8; 8] = b"PHOSMIG\0";

const TAG_PIECE: u8 = 1;
const TAG_HEAD: u8 = 2;
const TAKEN: u8 = 0;
const REFUSED: u8 = 1;
/// Longest refusal a target sends.
const MAX_WHY: u32 = 4096;

fn stream_error(e: io::Error) -> ImageError {
    if e.kind() == io::ErrorKind::UnexpectedEof {
        ImageError::Truncated("the migration stream ended early".into())
    } else {
        ImageError::Stream(e)
    }
}

/// The source's end: a [`RecopySink`] that sends every copy as it is taken, and at the end
/// the manifest, then waits for the target to say it restored the session.
pub struct MigrationSender<S: Read + Write + Send> {
    stream: io::BufWriter<S>,
    /// Bytes of memory sent (pieces), and in the image at the end.
    pub sent_bytes: u64,
}

impl<S: Read + Write + Send> MigrationSender<S> {
    /// Start the stream with the target's one-time `key`.
    pub fn start(stream: S, key: &[u8; 16]) -> Result<Self, ImageError> {
        let mut stream = io::BufWriter::with_capacity(1 << 20, stream);
        stream.write_all(MIGRATION_MAGIC).and_then(|_| stream.write_all(key)).map_err(stream_error)?;
        Ok(MigrationSender { stream, sent_bytes: 0 })
    }
}

/// Why the target did not take the session.
fn refused(why: String) -> CrError {
    CrError::Image(ImageError::Stream(io::Error::other(format!("the target refused the session: {why}"))))
}

impl<S: Read + Write + Send> RecopySink for MigrationSender<S> {
    fn piece(&mut self, region: &MemoryRegion, offset: u64, bytes: &[u8]) -> Result<(), CrError> {
        let mut h = Vec::with_capacity(37);
        h.push(TAG_PIECE);
        for v in [region.addr, region.size, offset, bytes.len() as u64] {
            h.extend_from_slice(&v.to_le_bytes());
        }
        h.extend_from_slice(&crc32fast::hash(bytes).to_le_bytes());
        self.stream.write_all(&h).and_then(|_| self.stream.write_all(bytes)).map_err(stream_error)?;
        self.sent_bytes += bytes.len() as u64;
        Ok(())
    }

    fn end(&mut self, head: &Manifest) -> Result<ImageSummary, CrError> {
        let body = bincode::encode_to_vec(head, config())
            .map_err(|e| ImageError::Corrupted(format!("encoding the manifest: {e}")))?;
        let mut h = vec![TAG_HEAD];
        h.extend_from_slice(&(body.len() as u64).to_le_bytes());
        self.stream
            .write_all(&h)
            .and_then(|_| self.stream.write_all(&body))
            .and_then(|_| self.stream.flush())
            .map_err(stream_error)?;
        let s = self.stream.get_mut();
        let mut tag = [0u8; 1];
        s.read_exact(&mut tag).map_err(stream_error)?;
        match tag[0] {
            TAKEN => Ok(ImageSummary {
                manifest_bytes: body.len() as u64,
                memory_bytes: head.memory.iter().map(|r| r.size).sum(),
                stored_bytes: self.sent_bytes,
            }),
            REFUSED => {
                let mut len = [0u8; 4];
                s.read_exact(&mut len).map_err(stream_error)?;
                let len = u32::from_le_bytes(len).min(MAX_WHY);
                let mut why = vec![0u8; len as usize];
                s.read_exact(&mut why).map_err(stream_error)?;
                Err(refused(phos_protocol::text::printable(&String::from_utf8_lossy(&why))))
            }
            other => Err(refused(format!("an answer the stream does not have ({other})"))),
        }
    }
}

/// A region as received: its size, its contents so far.
struct Received {
    size: u64,
    bytes: Vec<u8>,
}

/// What a target received: the manifest (its chunk tables filled in) and the memory it
/// describes, in host memory.
pub struct HeldImage {
    pub manifest: Manifest,
    pub memory: Arc<HeldMemory>,
}

/// The memory of a [`HeldImage`], one buffer per region of the manifest (a chunk's `file`
/// is its region's index, `at` its offset there), read by an on-demand load's workers.
pub struct HeldMemory {
    regions: Vec<Vec<u8>>,
}

impl ChunkReader for HeldMemory {
    fn read_into(&self, chunk: &Chunk, out: &mut [u8]) -> Result<(), ImageError> {
        let len = chunk.len as usize;
        let bytes = self
            .regions
            .get(chunk.file as usize)
            .and_then(|r| r.get(chunk.at as usize..(chunk.at as usize).checked_add(len)?))
            .ok_or_else(|| ImageError::Corrupted(format!("a chunk of {len} bytes outside the memory received")))?;
        out.get_mut(..len)
            .ok_or_else(|| ImageError::Corrupted("a chunk larger than its buffer".into()))?
            .copy_from_slice(bytes);
        Ok(())
    }
}

/// Limits of what a target takes.
#[derive(Debug, Clone, Copy)]
pub struct ReceiveLimits {
    /// Bytes of memory the target holds at most (all regions received, at their sizes).
    pub max_bytes: u64,
}

/// Read a migration stream up to its manifest: the key first (it must be `key`), then the
/// pieces, then the manifest. `progress` counts the memory received. Returns the image, for
/// the caller to restore and then [`answer`]. `pace` is waited before each piece (a test's
/// way to make the transfer slow; zero otherwise).
pub fn receive(
    stream: &mut impl Read,
    key: &[u8; 16],
    limits: ReceiveLimits,
    progress: &Progress,
    pace: std::time::Duration,
) -> Result<HeldImage, ImageError> {
    let corrupted = |why: String| ImageError::Corrupted(format!("the migration stream: {why}"));
    let mut start = [0u8; 24];
    stream.read_exact(&mut start).map_err(stream_error)?;
    if &start[..8] != MIGRATION_MAGIC {
        return Err(ImageError::NotAStream);
    }
    // Compared without leaking how much of it matched.
    if start[8..].iter().zip(key).fold(0u8, |acc, (a, b)| acc | (a ^ b)) != 0 {
        return Err(corrupted("the wrong key".into()));
    }
    let mut regions: HashMap<u64, Received> = HashMap::new();
    let mut held = 0u64;
    loop {
        let mut tag = [0u8; 1];
        stream.read_exact(&mut tag).map_err(stream_error)?;
        match tag[0] {
            TAG_PIECE => {
                if !pace.is_zero() {
                    std::thread::sleep(pace);
                }
                let mut h = [0u8; 36];
                stream.read_exact(&mut h).map_err(stream_error)?;
                let field = |i: usize| u64::from_le_bytes(h[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
                let (addr, size, offset, len) = (field(0), field(1), field(2), field(3));
                let crc = u32::from_le_bytes(h[32..36].try_into().expect("4 bytes"));
                // Module variables lie outside the session's range, wherever the source's
                // driver put them: where each region goes is the manifest's to say (and the
                // restore checks it); here a region is only its address as a name.
                if size == 0 || addr.checked_add(size).is_none() {
                    return Err(corrupted(format!("a region {addr:#x}+{size:#x}")));
                }
                if len == 0 || len > COPY_CHUNK as u64 {
                    return Err(corrupted(format!("a piece of {len} bytes")));
                }
                if offset.checked_add(len).is_none_or(|end| end > size) {
                    return Err(corrupted(format!("a piece past the end of region {addr:#x}")));
                }
                let whole = regions.get(&addr).is_some_and(|r| r.size == size && r.bytes.len() as u64 == size);
                let next = regions.get(&addr).is_some_and(|r| r.size == size && r.bytes.len() as u64 == offset);
                if !whole && !next {
                    if offset != 0 {
                        return Err(corrupted(format!("a piece of region {addr:#x} out of order")));
                    }
                    // New, or at another size: it is sent whole from its start.
                    if let Some(old) = regions.remove(&addr) {
                        held -= old.size;
                    }
                    held += size;
                    if held > limits.max_bytes {
                        return Err(corrupted(format!("more than {} bytes of memory", limits.max_bytes)));
                    }
                    regions.insert(addr, Received { size, bytes: Vec::with_capacity(size as usize) });
                }
                let r = regions.get_mut(&addr).expect("a region received or begun above");
                // Received whole: a part written since replaces those bytes; else the next piece.
                let at = offset as usize;
                if !whole {
                    r.bytes.resize(at + len as usize, 0);
                }
                let piece = &mut r.bytes[at..at + len as usize];
                stream.read_exact(piece).map_err(stream_error)?;
                if crc32fast::hash(piece) != crc {
                    return Err(corrupted(format!("a piece of region {addr:#x} fails its checksum")));
                }
                progress.add(len);
            }
            TAG_HEAD => {
                let mut n = [0u8; 8];
                stream.read_exact(&mut n).map_err(stream_error)?;
                let n = u64::from_le_bytes(n);
                if n > MAX_MANIFEST {
                    return Err(corrupted(format!("a manifest of {n} bytes")));
                }
                let mut body = vec![0u8; n as usize];
                stream.read_exact(&mut body).map_err(stream_error)?;
                let (manifest, _): (Manifest, usize) = bincode::decode_from_slice(&body, config())
                    .map_err(|e| corrupted(format!("the manifest does not decode: {e}")))?;
                return held_image(manifest, regions);
            }
            other => return Err(corrupted(format!("an unknown record ({other})"))),
        }
    }
}

/// The manifest with chunk tables over the regions received: each must have come whole.
fn held_image(mut manifest: Manifest, mut received: HashMap<u64, Received>) -> Result<HeldImage, ImageError> {
    let mut memory = Vec::with_capacity(manifest.memory.len());
    for (i, region) in manifest.memory.iter_mut().enumerate() {
        let whole = received.remove(&region.addr).filter(|r| r.size == region.size && r.bytes.len() as u64 == r.size);
        let Some(r) = whole else {
            return Err(ImageError::Corrupted(format!(
                "the migration stream: region {:#x} ({} bytes) was not received whole",
                region.addr, region.size
            )));
        };
        region.chunks = (0..region.size)
            .step_by(COPY_CHUNK)
            .map(|offset| {
                let len = (region.size - offset).min(COPY_CHUNK as u64);
                Chunk { offset, len, encoding: Encoding::Raw, stored: len, file: i as u32, at: offset, crc: 0 }
            })
            .collect();
        memory.push(r.bytes);
    }
    crate::check_meaning(&manifest)?;
    Ok(HeldImage { manifest, memory: Arc::new(HeldMemory { regions: memory }) })
}

/// The target's answer, once it has restored the session (`Ok`) or could not.
pub fn answer(stream: &mut impl Write, outcome: Result<(), String>) -> io::Result<()> {
    match outcome {
        Ok(()) => stream.write_all(&[TAKEN])?,
        Err(why) => {
            let why = &why.as_bytes()[..why.len().min(MAX_WHY as usize)];
            stream.write_all(&[REFUSED])?;
            stream.write_all(&(why.len() as u32).to_le_bytes())?;
            stream.write_all(why)?;
        }
    }
    stream.flush()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{RegionKind, SessionMeta};
    use std::time::Duration;

    /// A two-way pipe: what the sender writes, the receiver reads, and the answer back.
    struct Duplex {
        out: Vec<u8>,
        back: io::Cursor<Vec<u8>>,
    }

    impl Read for Duplex {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            self.back.read(buf)
        }
    }

    impl Write for Duplex {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.out.write(buf)
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    fn region(addr: u64, size: u64) -> MemoryRegion {
        MemoryRegion { addr, size, device: 0, kind: RegionKind::Allocation, chunks: Vec::new() }
    }

    fn head(regions: Vec<MemoryRegion>) -> Manifest {
        Manifest {
            format: crate::FORMAT_VERSION,
            apis: vec![crate::ImageApi { id: 0, name: "cudart".into(), version: 1, hash: 1 }],
            session: SessionMeta {
                id: 3,
                tenant: "t".into(),
                abi_major: 12,
                backend: "emu".into(),
                device_base: 0x1000,
                device_size: 1 << 30,
                ..Default::default()
            },
            memory: regions,
            ..Default::default()
        }
    }

    const LIMITS: ReceiveLimits = ReceiveLimits { max_bytes: 1 << 20 };
    const KEY: [u8; 16] = [7; 16];

    /// What the sender wrote for `pieces` then `head`, with the target's answer `back`.
    fn sent(pieces: &[(MemoryRegion, u64, Vec<u8>)], head: &Manifest, back: Vec<u8>) -> (Vec<u8>, Result<(), CrError>) {
        let pipe = Duplex { out: Vec::new(), back: io::Cursor::new(back) };
        let mut s = MigrationSender::start(pipe, &KEY).unwrap();
        for (r, off, bytes) in pieces {
            s.piece(r, *off, bytes).unwrap();
        }
        let ended = s.end(head).map(|_| ());
        (s.stream.into_inner().map_err(|_| ()).unwrap().out, ended)
    }

    /// A region sent twice (copied again in a later round) arrives as last sent; the target
    /// reads it back through the chunk reader an on-demand load uses.
    #[test]
    fn the_last_copy_of_a_region_wins() {
        let r = region(0x2000, 5);
        let head = head(vec![r.clone()]);
        let pieces = [(r.clone(), 0, b"hello".to_vec()), (r.clone(), 0, b"HE".to_vec()), (r, 2, b"LLO".to_vec())];
        let (bytes, ended) = sent(&pieces, &head, vec![TAKEN]);
        assert!(ended.is_ok());
        let got = receive(&mut bytes.as_slice(), &KEY, LIMITS, &Progress::default(), Duration::ZERO).unwrap();
        let chunk = got.manifest.memory[0].chunks[0];
        let mut out = [0u8; 5];
        got.memory.read_into(&chunk, &mut out).unwrap();
        assert_eq!(&out, b"HELLO");
    }

    /// A region received whole takes the parts written since (a recopy round sends only
    /// those); sent at another size it starts over; a piece that neither continues a region
    /// nor falls in one received whole is refused.
    #[test]
    fn a_part_written_since_replaces_those_bytes() {
        let r = region(0x2000, 8);
        let pieces =
            [(r.clone(), 0, b"abcdefgh".to_vec()), (r.clone(), 3, b"XY".to_vec()), (r.clone(), 7, b"Z".to_vec())];
        let (bytes, _) = sent(&pieces, &head(vec![r.clone()]), vec![TAKEN]);
        let got = receive(&mut bytes.as_slice(), &KEY, LIMITS, &Progress::default(), Duration::ZERO).unwrap();
        let mut out = [0u8; 8];
        got.memory.read_into(&got.manifest.memory[0].chunks[0], &mut out).unwrap();
        assert_eq!(&out, b"abcXYfgZ");
        let smaller = region(0x2000, 4);
        let pieces = [(r.clone(), 0, b"abcdefgh".to_vec()), (smaller.clone(), 0, b"wxyz".to_vec())];
        let (bytes, _) = sent(&pieces, &head(vec![smaller]), vec![TAKEN]);
        let got = receive(&mut bytes.as_slice(), &KEY, LIMITS, &Progress::default(), Duration::ZERO).unwrap();
        let mut out = [0u8; 4];
        got.memory.read_into(&got.manifest.memory[0].chunks[0], &mut out).unwrap();
        assert_eq!(&out, b"wxyz");
        let pieces = [(r.clone(), 0, b"abc".to_vec()), (r.clone(), 5, b"fgh".to_vec())];
        let (bytes, _) = sent(&pieces, &head(vec![r]), vec![TAKEN]);
        let e = receive(&mut bytes.as_slice(), &KEY, LIMITS, &Progress::default(), Duration::ZERO).err().unwrap();
        assert!(e.to_string().contains("out of order"), "{e}");
    }

    /// A wrong key, more memory than the target holds, a region the manifest names but that
    /// never came whole, a corrupted piece: each refused, naming why.
    #[test]
    fn the_target_refuses_what_does_not_check() {
        let r = region(0x2000, 4);
        let (bytes, _) = sent(&[(r.clone(), 0, b"abcd".to_vec())], &head(vec![r.clone()]), vec![TAKEN]);
        let other = [1u8; 16];
        let e = receive(&mut bytes.as_slice(), &other, LIMITS, &Progress::default(), Duration::ZERO).err().unwrap();
        assert!(e.to_string().contains("wrong key"), "{e}");
        let mut bad = bytes.clone();
        // The first byte of the piece's data: after the magic, the key and the piece's header.
        bad[8 + 16 + 1 + 36] ^= 1;
        let e = receive(&mut bad.as_slice(), &KEY, LIMITS, &Progress::default(), Duration::ZERO).err().unwrap();
        assert!(e.to_string().contains("checksum"), "{e}");
        let huge = region(0x2000, 2 << 20);
        let (bytes, _) = sent(&[(huge.clone(), 0, b"abcd".to_vec())], &head(vec![huge]), vec![TAKEN]);
        let e = receive(&mut bytes.as_slice(), &KEY, LIMITS, &Progress::default(), Duration::ZERO).err().unwrap();
        assert!(e.to_string().contains("more than 1048576 bytes"), "{e}");
        let (bytes, _) = sent(&[(r.clone(), 0, b"ab".to_vec())], &head(vec![r]), vec![TAKEN]);
        let e = receive(&mut bytes.as_slice(), &KEY, LIMITS, &Progress::default(), Duration::ZERO).err().unwrap();
        assert!(e.to_string().contains("not received whole"), "{e}");
    }

    /// The target's refusal reaches the source as its error, with its reason.
    #[test]
    fn a_refusal_says_why() {
        let mut back = Vec::new();
        answer(&mut back, Err("no such tenant".into())).unwrap();
        let (_, ended) = sent(&[], &head(Vec::new()), back);
        let e = ended.err().unwrap().to_string();
        assert!(e.contains("refused the session: no such tenant"), "{e}");
    }
}
