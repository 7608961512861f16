//! A live migration's stream, from the session's server to the server it moves to, over one
//! or more `Read + Write` connections (sockets), its lanes: the recopy's rounds as they are
//! copied, spread over the lanes, then the manifest with the session held, then the target's
//! answer. Nothing lands on disk: the target keeps the memory in host memory and restores
//! from there, on demand ([`HeldImage`]).
//!
//! ```text
//! source, on each of its n lanes:
//!         magic "PHOSMIG5", key (16 bytes: the target's one-time key),
//!         lane (u16: 0 to n-1), lanes (u16: n)
//!         piece: 1 (u8), sequence number (u64), region address (u64), region size (u64),
//!                offset (u64), len (u64), CRC-32 of the bytes (u32), then the bytes
//!         ... (numbered from 0 across all lanes, each lane's in increasing order; a region
//!         is sent whole, from offset 0, the first time and whenever its size changed; then
//!         a piece replaces those bytes of it, a part written since)
//!         end:   3 (u8)                              (lanes 1 to n-1, once their pieces are sent)
//!         head:  2 (u8), pieces (u64: all lanes'), length m (u64), m bytes of bincode
//!                Manifest (empty chunk tables)    (lane 0, once every lane's pieces are sent)
//! target, on lane 0: 0 (u8): restored and serving; or 1 (u8), length (u32), why (UTF-8)
//! ```
//!
//! Little-endian throughout. The source deals pieces to its lanes in turn, each lane written
//! by a thread of its own (its checksums computed there); the target reads every lane on a
//! thread of its own and applies the pieces in their numbers' order, so that the memory it
//! ends with is what one stream would have brought. The target trusts nothing: the key must
//! match on every lane, lanes are numbered once each, a lane's numbers increase and none is
//! applied twice, every piece must continue its region within the memory limit, every
//! piece's checksum must match, every piece the head counts must have come, and the manifest
//! must check (as an image's does) and name only regions received whole at their size.

use std::collections::{BTreeMap, HashMap};
use std::io::{self, Read, Write};
use std::sync::Arc;
use std::sync::mpsc;

use parking_lot::{Condvar, Mutex};

use crate::engine::{COPY_CHUNK, CrError, RecopySink};
use crate::report::Progress;
use crate::{Chunk, ChunkReader, Encoding, ImageError, ImageSummary, MAX_MANIFEST, Manifest, MemoryRegion, config};

/// Magic at the start of each lane of a migration stream.
pub const MIGRATION_MAGIC: &[u8; 8] = b"PHOSMIG5";
/// Lanes a stream has at most.
pub const MAX_LANES: u16 = 16;
/// Lanes a migration uses unless told otherwise.
pub const DEFAULT_LANES: u16 = 4;

const TAG_PIECE: u8 = 1;
const TAG_HEAD: u8 = 2;
const TAG_END: u8 = 3;
const TAKEN: u8 = 0;
const REFUSED: u8 = 1;
/// Longest refusal a target sends.
const MAX_WHY: u32 = 4096;
/// A lane's opening: magic, key, lane, lanes.
const OPENING: usize = 8 + 16 + 2 + 2;
/// A piece's header after its tag: sequence, address, size, offset, len, CRC.
const PIECE_HEADER: usize = 5 * 8 + 4;
/// Pieces a lane's writer holds queued, beyond the one it writes.
const QUEUED_PER_LANE: usize = 2;

fn stream_error(e: io::Error) -> ImageError {
    if e.kind() == io::ErrorKind::UnexpectedEof {
        ImageError::Truncated("the migration stream ended early".into())
    } else {
        ImageError::Stream(e)
    }
}

/// A piece on its way to a lane's writer.
struct Outgoing {
    seq: u64,
    addr: u64,
    size: u64,
    offset: u64,
    bytes: Vec<u8>,
}

/// A lane of the source: the thread that writes it, fed through `queue`; it answers its
/// stream back when the queue closes, or the error that stopped it.
struct LaneWriter<S: Write> {
    queue: Option<mpsc::SyncSender<Outgoing>>,
    thread: Option<std::thread::JoinHandle<io::Result<io::BufWriter<S>>>>,
}

impl<S: Write> LaneWriter<S> {
    /// Close its queue and wait for its thread: its stream, or what stopped it.
    fn finish(&mut self) -> io::Result<io::BufWriter<S>> {
        self.queue = None;
        match self.thread.take().map(std::thread::JoinHandle::join) {
            Some(Ok(r)) => r,
            Some(Err(_)) => Err(io::Error::other("a migration lane's writer panicked")),
            None => Err(io::Error::other("a migration lane already ended")),
        }
    }
}

/// Write `piece` to `out`: its header (with the checksum, computed here), then its bytes.
fn write_piece(out: &mut impl Write, piece: &Outgoing) -> io::Result<()> {
    let mut h = Vec::with_capacity(1 + PIECE_HEADER);
    h.push(TAG_PIECE);
    for v in [piece.seq, piece.addr, piece.size, piece.offset, piece.bytes.len() as u64] {
        h.extend_from_slice(&v.to_le_bytes());
    }
    h.extend_from_slice(&crc32fast::hash(&piece.bytes).to_le_bytes());
    out.write_all(&h)?;
    out.write_all(&piece.bytes)
}

/// The source's end: a [`RecopySink`] that deals every copy, as it is taken, to its lanes
/// in turn, and at the end sends the manifest, then waits for the target to say it restored
/// the session.
pub struct MigrationSender<S: Read + Write + Send + 'static> {
    lanes: Vec<LaneWriter<S>>,
    /// Buffers the writers are done with, for the next pieces.
    spent: mpsc::Receiver<Vec<u8>>,
    next_seq: u64,
    /// Bytes of memory sent (pieces), and in the image at the end.
    pub sent_bytes: u64,
}

impl<S: Read + Write + Send + 'static> MigrationSender<S> {
    /// Start the stream over `streams` (its lanes, at most [`MAX_LANES`]) with the target's
    /// one-time `key`.
    pub fn start(streams: Vec<S>, key: &[u8; 16]) -> Result<Self, ImageError> {
        let n = streams.len();
        if n == 0 || n > MAX_LANES as usize {
            return Err(ImageError::Stream(io::Error::other(format!(
                "a migration stream has 1 to {MAX_LANES} lanes, not {n}"
            ))));
        }
        let (spent_tx, spent) = mpsc::channel();
        let mut lanes = Vec::with_capacity(n);
        for (i, stream) in streams.into_iter().enumerate() {
            let mut out = io::BufWriter::with_capacity(1 << 20, stream);
            out.write_all(MIGRATION_MAGIC)
                .and_then(|_| out.write_all(key))
                .and_then(|_| out.write_all(&(i as u16).to_le_bytes()))
                .and_then(|_| out.write_all(&(n as u16).to_le_bytes()))
                // Out at once: the target takes the stream once every lane has opened, and a
                // lane that gets no piece (a small session over several lanes) would
                // otherwise open only at the end, which the source may never reach while
                // the target waits.
                .and_then(|_| out.flush())
                .map_err(stream_error)?;
            let (queue, pieces) = mpsc::sync_channel::<Outgoing>(QUEUED_PER_LANE);
            let spent_tx = spent_tx.clone();
            let thread = std::thread::Builder::new()
                .name(format!("phos-migrate-{i}"))
                .spawn(move || {
                    for piece in pieces {
                        write_piece(&mut out, &piece)?;
                        let _ = spent_tx.send(piece.bytes);
                    }
                    Ok(out)
                })
                .map_err(ImageError::Stream)?;
            lanes.push(LaneWriter { queue: Some(queue), thread: Some(thread) });
        }
        Ok(MigrationSender { lanes, spent, next_seq: 0, sent_bytes: 0 })
    }

    /// The error that stopped lane `i` (its writer has ended).
    fn lane_failed(&mut self, i: usize) -> CrError {
        let e = match self.lanes[i].finish() {
            Err(e) => e,
            Ok(_) => io::Error::other("a migration lane's writer ended early"),
        };
        CrError::Image(stream_error(e))
    }
}

/// Why the target did not take the session.
fn refused(why: String) -> CrError {
    CrError::Image(ImageError::Stream(io::Error::other(format!("the target refused the session: {why}"))))
}

impl<S: Read + Write + Send + 'static> RecopySink for MigrationSender<S> {
    fn piece(&mut self, region: &MemoryRegion, offset: u64, bytes: &[u8]) -> Result<(), CrError> {
        // Buffers go round between this and the writers: at most those queued and being
        // written, and one more.
        let mut buf = self.spent.try_recv().unwrap_or_default();
        buf.clear();
        buf.extend_from_slice(bytes);
        let seq = self.next_seq;
        let lane = (seq % self.lanes.len() as u64) as usize;
        let piece = Outgoing { seq, addr: region.addr, size: region.size, offset, bytes: buf };
        let sent = self.lanes[lane].queue.as_ref().is_some_and(|q| q.send(piece).is_ok());
        if !sent {
            return Err(self.lane_failed(lane));
        }
        self.next_seq += 1;
        self.sent_bytes += bytes.len() as u64;
        Ok(())
    }

    fn end(&mut self, head: &Manifest) -> Result<ImageSummary, CrError> {
        let body = bincode::encode_to_vec(head, config())
            .map_err(|e| ImageError::Corrupted(format!("encoding the manifest: {e}")))?;
        // Every lane's pieces out before the head: lanes 1.. end, lane 0 carries the head.
        let mut control = None;
        for i in 0..self.lanes.len() {
            let mut out = self.lanes[i].finish().map_err(stream_error)?;
            if i == 0 {
                control = Some(out);
            } else {
                out.write_all(&[TAG_END]).and_then(|_| out.flush()).map_err(stream_error)?;
            }
        }
        let mut out = control.ok_or_else(|| ImageError::Stream(io::Error::other("no lane 0")))?;
        let mut h = vec![TAG_HEAD];
        h.extend_from_slice(&self.next_seq.to_le_bytes());
        h.extend_from_slice(&(body.len() as u64).to_le_bytes());
        out.write_all(&h).and_then(|_| out.write_all(&body)).and_then(|_| out.flush()).map_err(stream_error)?;
        let s = out.get_mut();
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

impl<S: Read + Write + Send + 'static> Drop for MigrationSender<S> {
    /// A migration given up: its writers stop (their queues close) and are waited for.
    fn drop(&mut self) {
        for lane in &mut self.lanes {
            let _ = lane.finish();
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

fn corrupted(why: String) -> ImageError {
    ImageError::Corrupted(format!("the migration stream: {why}"))
}

/// Read the opening of a lane of a migration stream: its key must be `key`. Answers
/// (lane, lanes).
pub fn open_lane(stream: &mut impl Read, key: &[u8; 16]) -> Result<(u16, u16), ImageError> {
    let mut start = [0u8; OPENING];
    stream.read_exact(&mut start).map_err(stream_error)?;
    if &start[..8] != MIGRATION_MAGIC {
        // Another version of the stream (a source server of another build): say so.
        if start[..7] == MIGRATION_MAGIC[..7] {
            return Err(corrupted(format!(
                "a migration stream of version {} from the source, where this server reads version {}: source and target servers must be of the same build",
                char::from(start[7]),
                char::from(MIGRATION_MAGIC[7])
            )));
        }
        return Err(ImageError::NotAStream);
    }
    // Compared without leaking how much of it matched.
    if start[8..24].iter().zip(key).fold(0u8, |acc, (a, b)| acc | (a ^ b)) != 0 {
        return Err(corrupted("the wrong key".into()));
    }
    let lane = u16::from_le_bytes([start[24], start[25]]);
    let lanes = u16::from_le_bytes([start[26], start[27]]);
    if lanes == 0 || lanes > MAX_LANES || lane >= lanes {
        return Err(corrupted(format!("lane {lane} of {lanes} (at most {MAX_LANES} lanes)")));
    }
    Ok((lane, lanes))
}

/// A piece read, waiting for its turn.
struct Incoming {
    addr: u64,
    size: u64,
    offset: u64,
    bytes: Vec<u8>,
}

/// The target's memory as the pieces are applied, in their numbers' order.
struct Assembly {
    regions: HashMap<u64, Received>,
    held: u64,
    /// The number of the next piece to apply.
    next: u64,
    /// Pieces read ahead of their turn, by number.
    waiting: BTreeMap<u64, Incoming>,
    /// Lanes still being read.
    open: usize,
    /// A lane failed: the others stop.
    failed: bool,
}

impl Assembly {
    /// Apply the pieces whose turn has come.
    fn apply_ready(&mut self, limits: &ReceiveLimits) -> Result<(), ImageError> {
        while let Some(piece) = self.waiting.remove(&self.next) {
            self.apply(piece, limits)?;
            self.next += 1;
        }
        Ok(())
    }

    /// One piece, in its turn: it continues its region, or replaces bytes of a region
    /// received whole, or begins a region (new, or at another size) from its start.
    fn apply(&mut self, piece: Incoming, limits: &ReceiveLimits) -> Result<(), ImageError> {
        let Incoming { addr, size, offset, bytes } = piece;
        let len = bytes.len() as u64;
        let whole = self.regions.get(&addr).is_some_and(|r| r.size == size && r.bytes.len() as u64 == size);
        let next = self.regions.get(&addr).is_some_and(|r| r.size == size && r.bytes.len() as u64 == offset);
        if !whole && !next {
            if offset != 0 {
                return Err(corrupted(format!("a piece of region {addr:#x} out of order")));
            }
            // New, or at another size: it is sent whole from its start.
            if let Some(old) = self.regions.remove(&addr) {
                self.held -= old.size;
            }
            self.held += size;
            if self.held > limits.max_bytes {
                return Err(corrupted(format!("more than {} bytes of memory", limits.max_bytes)));
            }
            if offset == 0 && len == size {
                // All of it in one piece: taken as it is.
                self.regions.insert(addr, Received { size, bytes });
                return Ok(());
            }
            self.regions.insert(addr, Received { size, bytes: Vec::with_capacity(size as usize) });
        }
        let r = self.regions.get_mut(&addr).expect("a region received or begun above");
        let at = offset as usize;
        if whole {
            // Received whole: a part written since replaces those bytes.
            r.bytes[at..at + bytes.len()].copy_from_slice(&bytes);
        } else {
            r.bytes.extend_from_slice(&bytes);
        }
        Ok(())
    }
}

/// Why a lane's reader stopped: its own error, or another lane's.
enum LaneError {
    Own(ImageError),
    Stopped,
}

impl From<ImageError> for LaneError {
    fn from(e: ImageError) -> Self {
        LaneError::Own(e)
    }
}

/// How long a lane waits for the pieces before the window (on other lanes) to come.
const LANE_WAIT: std::time::Duration = std::time::Duration::from_secs(120);

/// What a lane's reader ended with.
enum LaneEnd {
    /// Its end record (lanes 1..).
    Ended,
    /// The head (lane 0): the pieces all lanes sent, and the manifest.
    Head(u64, Box<Manifest>),
}

/// The pieces of the stream read ahead of their turn at most, on all lanes together.
fn window(lanes: usize) -> u64 {
    2 * lanes as u64 + 2
}

/// Read one lane (its opening read already) until its end, applying its pieces in turn
/// with the other lanes'.
#[allow(clippy::too_many_arguments)] // one lane's reading and the state the lanes share
fn read_lane(
    stream: &mut impl Read,
    lane: usize,
    lanes: usize,
    shared: &(Mutex<Assembly>, Condvar),
    limits: &ReceiveLimits,
    progress: &Progress,
    pace: std::time::Duration,
) -> Result<LaneEnd, LaneError> {
    let (state, turn) = shared;
    let mut last_seq = None;
    loop {
        let mut tag = [0u8; 1];
        stream.read_exact(&mut tag).map_err(stream_error)?;
        match tag[0] {
            TAG_PIECE => {
                if !pace.is_zero() {
                    std::thread::sleep(pace);
                }
                let mut h = [0u8; PIECE_HEADER];
                stream.read_exact(&mut h).map_err(stream_error)?;
                let field = |i: usize| u64::from_le_bytes(h[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
                let (seq, addr, size, offset, len) = (field(0), field(1), field(2), field(3), field(4));
                let crc = u32::from_le_bytes(h[40..44].try_into().expect("4 bytes"));
                // Module variables lie outside the session's range, wherever the source's
                // driver put them: where each region goes is the manifest's to say (and the
                // restore checks it); here a region is only its address as a name.
                if size == 0 || addr.checked_add(size).is_none() {
                    return Err(corrupted(format!("a region {addr:#x}+{size:#x}")).into());
                }
                if len == 0 || len > COPY_CHUNK as u64 {
                    return Err(corrupted(format!("a piece of {len} bytes")).into());
                }
                if offset.checked_add(len).is_none_or(|end| end > size) {
                    return Err(corrupted(format!("a piece past the end of region {addr:#x}")).into());
                }
                if last_seq.is_some_and(|l| seq <= l) {
                    let last = last_seq.unwrap_or(0);
                    return Err(corrupted(format!("piece {seq} after piece {last} on lane {lane}")).into());
                }
                last_seq = Some(seq);
                // Read no further ahead than the window: the pieces before it are on other
                // lanes, which read on meanwhile.
                {
                    let mut s = state.lock();
                    loop {
                        if s.failed {
                            return Err(LaneError::Stopped);
                        }
                        if seq < s.next {
                            return Err(corrupted(format!("piece {seq} twice")).into());
                        }
                        if seq < s.next + window(lanes) {
                            break;
                        }
                        // Only this lane is left: the pieces before this one never came.
                        if s.open == 1 || turn.wait_for(&mut s, LANE_WAIT).timed_out() {
                            return Err(corrupted(format!("piece {} never came", s.next)).into());
                        }
                    }
                }
                let mut bytes = vec![0u8; len as usize];
                stream.read_exact(&mut bytes).map_err(stream_error)?;
                if crc32fast::hash(&bytes) != crc {
                    return Err(corrupted(format!("a piece of region {addr:#x} fails its checksum")).into());
                }
                let mut s = state.lock();
                if seq < s.next || s.waiting.contains_key(&seq) {
                    return Err(corrupted(format!("piece {seq} twice")).into());
                }
                s.waiting.insert(seq, Incoming { addr, size, offset, bytes });
                s.apply_ready(limits)?;
                progress.add(len);
                turn.notify_all();
            }
            TAG_END if lane != 0 => return Ok(LaneEnd::Ended),
            TAG_HEAD if lane == 0 => {
                let mut n = [0u8; 16];
                stream.read_exact(&mut n).map_err(stream_error)?;
                let pieces = u64::from_le_bytes(n[..8].try_into().expect("8 bytes"));
                let n = u64::from_le_bytes(n[8..].try_into().expect("8 bytes"));
                if n > MAX_MANIFEST {
                    return Err(corrupted(format!("a manifest of {n} bytes")).into());
                }
                let mut body = vec![0u8; n as usize];
                stream.read_exact(&mut body).map_err(stream_error)?;
                let (manifest, _): (Manifest, usize) = bincode::decode_from_slice(&body, config())
                    .map_err(|e| corrupted(format!("the manifest does not decode: {e}")))?;
                return Ok(LaneEnd::Head(pieces, Box::new(manifest)));
            }
            other => return Err(corrupted(format!("an unknown record ({other}) on lane {lane}")).into()),
        }
    }
}

/// Read a migration stream up to its manifest from its lanes, in lane order (their openings
/// read with [`open_lane`]), each on a thread of its own: the pieces, applied in their
/// numbers' order, then the manifest. `progress` counts the memory received. Returns the
/// image, for the caller to restore and then [`answer`] on lane 0. `pace` is waited before
/// each piece (a test's way to make the transfer slow; zero otherwise). `on_failure` runs
/// once when a lane fails: it should end the reads of the others (shut their sockets down
/// for reading), which may wait for a source that no longer sends to them.
pub fn receive<R: Read + Send>(
    lanes: &mut [R],
    limits: ReceiveLimits,
    progress: &Progress,
    pace: std::time::Duration,
    on_failure: &(dyn Fn() + Sync),
) -> Result<HeldImage, ImageError> {
    let n = lanes.len();
    if n == 0 {
        return Err(corrupted("no lanes".into()));
    }
    let shared = (
        Mutex::new(Assembly {
            regions: HashMap::new(),
            held: 0,
            next: 0,
            waiting: BTreeMap::new(),
            open: n,
            failed: false,
        }),
        Condvar::new(),
    );
    let ends: Vec<Result<LaneEnd, LaneError>> = std::thread::scope(|scope| {
        let shared = &shared;
        let read = move |i: usize, stream: &mut R| {
            let end = read_lane(stream, i, n, shared, &limits, progress, pace);
            let mut s = shared.0.lock();
            s.open -= 1;
            let end = match end {
                // Once one lane failed, the others' errors are only its consequences.
                Err(_) if s.failed => Err(LaneError::Stopped),
                Err(e) => {
                    s.failed = true;
                    on_failure();
                    Err(e)
                }
                ok => ok,
            };
            shared.1.notify_all();
            end
        };
        let (first, rest) = lanes.split_first_mut().expect("at least one lane");
        let others: Vec<_> =
            rest.iter_mut().enumerate().map(|(i, stream)| scope.spawn(move || read(i + 1, stream))).collect();
        let mut ends = vec![read(0, first)];
        ends.extend(others.into_iter().map(|t| {
            t.join().unwrap_or_else(|_| {
                Err(ImageError::Stream(io::Error::other("a migration lane's reader panicked")).into())
            })
        }));
        ends
    });
    // A lane's own error says what went wrong (the others only stopped for it).
    let mut head = None;
    for end in ends {
        match end {
            Ok(LaneEnd::Head(pieces, manifest)) => head = Some((pieces, manifest)),
            Ok(LaneEnd::Ended) | Err(LaneError::Stopped) => {}
            Err(LaneError::Own(e)) => return Err(e),
        }
    }
    let (pieces, manifest) = head.ok_or_else(|| corrupted("no head".into()))?;
    let assembly = shared.0.into_inner();
    if assembly.next != pieces || !assembly.waiting.is_empty() {
        return Err(corrupted(format!("{} pieces applied, the head counts {pieces}", assembly.next)));
    }
    held_image(*manifest, assembly.regions)
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

    /// A two-way pipe: what the sender writes (kept after it is gone), and the answer back.
    struct Duplex {
        out: Arc<Mutex<Vec<u8>>>,
        back: io::Cursor<Vec<u8>>,
    }

    impl Read for Duplex {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            self.back.read(buf)
        }
    }

    impl Write for Duplex {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.out.lock().extend_from_slice(buf);
            Ok(buf.len())
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

    /// What the sender wrote on one lane for `pieces` then `head`, with the target's answer
    /// `back`.
    fn sent(pieces: &[(MemoryRegion, u64, Vec<u8>)], head: &Manifest, back: Vec<u8>) -> (Vec<u8>, Result<(), CrError>) {
        let out = Arc::new(Mutex::new(Vec::new()));
        let pipe = Duplex { out: out.clone(), back: io::Cursor::new(back) };
        let mut s = MigrationSender::start(vec![pipe], &KEY).unwrap();
        for (r, off, bytes) in pieces {
            s.piece(r, *off, bytes).unwrap();
        }
        let ended = s.end(head).map(|_| ());
        drop(s);
        let bytes = std::mem::take(&mut *out.lock());
        (bytes, ended)
    }

    /// Receive lanes given as their bytes.
    fn receive_lanes<R: Read + Send>(mut lanes: Vec<R>) -> Result<HeldImage, ImageError> {
        for (i, lane) in lanes.iter_mut().enumerate() {
            let (at, of) = open_lane(lane, &KEY)?;
            assert_eq!(at as usize, i);
            assert!(of as usize >= 1);
        }
        receive(&mut lanes, LIMITS, &Progress::default(), Duration::ZERO, &|| {})
    }

    fn receive_one(bytes: &[u8]) -> Result<HeldImage, ImageError> {
        receive_lanes(vec![bytes])
    }

    fn region_bytes(got: &HeldImage, i: usize) -> Vec<u8> {
        let r = &got.manifest.memory[i];
        let mut out = vec![0u8; r.size as usize];
        for c in &r.chunks {
            got.memory.read_into(c, &mut out[c.offset as usize..(c.offset + c.len) as usize]).unwrap();
        }
        out
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
        let got = receive_one(&bytes).unwrap();
        assert_eq!(region_bytes(&got, 0), b"HELLO");
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
        assert_eq!(region_bytes(&receive_one(&bytes).unwrap(), 0), b"abcXYfgZ");
        let smaller = region(0x2000, 4);
        let pieces = [(r.clone(), 0, b"abcdefgh".to_vec()), (smaller.clone(), 0, b"wxyz".to_vec())];
        let (bytes, _) = sent(&pieces, &head(vec![smaller]), vec![TAKEN]);
        assert_eq!(region_bytes(&receive_one(&bytes).unwrap(), 0), b"wxyz");
        let pieces = [(r.clone(), 0, b"abc".to_vec()), (r.clone(), 5, b"fgh".to_vec())];
        let (bytes, _) = sent(&pieces, &head(vec![r]), vec![TAKEN]);
        let e = receive_one(&bytes).err().unwrap();
        assert!(e.to_string().contains("out of order"), "{e}");
    }

    /// A wrong key, more memory than the target holds, a region the manifest names but that
    /// never came whole, a corrupted piece: each refused, naming why.
    #[test]
    fn the_target_refuses_what_does_not_check() {
        let r = region(0x2000, 4);
        let (bytes, _) = sent(&[(r.clone(), 0, b"abcd".to_vec())], &head(vec![r.clone()]), vec![TAKEN]);
        let e = open_lane(&mut bytes.as_slice(), &[1u8; 16]).err().unwrap();
        assert!(e.to_string().contains("wrong key"), "{e}");
        let mut bad = bytes.clone();
        // The first byte of the piece's data: after the opening, the tag and the header.
        bad[OPENING + 1 + PIECE_HEADER] ^= 1;
        let e = receive_one(&bad).err().unwrap();
        assert!(e.to_string().contains("checksum"), "{e}");
        let huge = region(0x2000, 2 << 20);
        let (bytes, _) = sent(&[(huge.clone(), 0, b"abcd".to_vec())], &head(vec![huge]), vec![TAKEN]);
        let e = receive_one(&bytes).err().unwrap();
        assert!(e.to_string().contains("more than 1048576 bytes"), "{e}");
        let (bytes, _) = sent(&[(r.clone(), 0, b"ab".to_vec())], &head(vec![r]), vec![TAKEN]);
        let e = receive_one(&bytes).err().unwrap();
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

    /// Pieces dealt over several lanes (socket pairs) arrive as one stream would have
    /// brought them: regions begun, continued and partly rewritten in later rounds, in the
    /// order they were sent; the source learns the target took the session.
    #[test]
    fn pieces_over_several_lanes_arrive_in_order() {
        use std::os::unix::net::UnixStream;
        let (sources, mut targets): (Vec<UnixStream>, Vec<UnixStream>) =
            (0..3).map(|_| UnixStream::pair().unwrap()).unzip();
        let a = region(0x10_0000, 64);
        let b = region(0x20_0000, 40);
        let mut pieces = Vec::new();
        let mut want_a: Vec<u8> = (0..64u8).collect();
        let mut want_b: Vec<u8> = (100..140u8).collect();
        for at in (0..64).step_by(8) {
            pieces.push((a.clone(), at as u64, want_a[at..at + 8].to_vec()));
        }
        for at in (0..40).step_by(10) {
            pieces.push((b.clone(), at as u64, want_b[at..at + 10].to_vec()));
        }
        // Later rounds: the same bytes rewritten again and again.
        for round in 1..=5u8 {
            for at in [3usize, 17, 40] {
                let part = vec![round * 10; 5];
                want_a[at..at + 5].copy_from_slice(&part);
                pieces.push((a.clone(), at as u64, part));
            }
            let part = vec![round; 7];
            want_b[30..37].copy_from_slice(&part);
            pieces.push((b.clone(), 30, part));
        }
        let manifest = head(vec![a, b]);
        let source = std::thread::spawn(move || {
            let mut s = MigrationSender::start(sources, &KEY).unwrap();
            for (r, off, bytes) in &pieces {
                s.piece(r, *off, bytes).unwrap();
            }
            s.end(&manifest).map(|_| s.sent_bytes)
        });
        for lane in targets.iter_mut() {
            let (i, n) = open_lane(lane, &KEY).unwrap();
            assert_eq!(n, 3);
            assert!(i < 3);
        }
        // Accepted in any order: put in lane order (here they are already).
        let progress = Progress::default();
        let got = receive(&mut targets, LIMITS, &progress, Duration::ZERO, &|| {}).unwrap();
        answer(&mut targets[0], Ok(())).unwrap();
        let sent = source.join().unwrap().unwrap();
        assert_eq!(progress.done(), sent);
        assert_eq!(region_bytes(&got, 0), want_a);
        assert_eq!(region_bytes(&got, 1), want_b);
    }

    /// A lane whose first bytes come late.
    struct Late<'a>(&'a [u8], bool);

    impl Read for Late<'_> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            if !self.1 {
                std::thread::sleep(Duration::from_millis(200));
                self.1 = true;
            }
            self.0.read(buf)
        }
    }

    #[test]
    fn a_stream_of_another_version_is_named_as_such() {
        let mut old = opening(0, 1);
        old[7] = b'1';
        let err = open_lane(&mut &old[..], &KEY).unwrap_err().to_string();
        assert!(err.contains("version 1") && err.contains("same build"), "{err}");
        let mut other = opening(0, 1);
        other[..8].copy_from_slice(b"NOTPHOS!");
        assert!(matches!(open_lane(&mut &other[..], &KEY), Err(ImageError::NotAStream)));
    }

    fn opening(lane: u16, lanes: u16) -> Vec<u8> {
        let mut v = MIGRATION_MAGIC.to_vec();
        v.extend_from_slice(&KEY);
        v.extend_from_slice(&lane.to_le_bytes());
        v.extend_from_slice(&lanes.to_le_bytes());
        v
    }

    fn raw_piece(out: &mut Vec<u8>, seq: u64, r: &MemoryRegion, offset: u64, bytes: &[u8]) {
        let piece = Outgoing { seq, addr: r.addr, size: r.size, offset, bytes: bytes.to_vec() };
        write_piece(out, &piece).unwrap();
    }

    fn raw_head(out: &mut Vec<u8>, pieces: u64, manifest: &Manifest) {
        let body = bincode::encode_to_vec(manifest, config()).unwrap();
        out.push(TAG_HEAD);
        out.extend_from_slice(&pieces.to_le_bytes());
        out.extend_from_slice(&(body.len() as u64).to_le_bytes());
        out.extend_from_slice(&body);
    }

    /// A piece on a lane read ahead of an earlier one on a late lane waits for its turn
    /// (applied as it came, the rewrite would come before its region began, and be refused).
    #[test]
    fn a_piece_read_before_its_turn_waits_for_it() {
        let r = region(0x2000, 8);
        let mut lane0 = opening(0, 2);
        raw_piece(&mut lane0, 0, &r, 0, b"abcdefgh");
        raw_head(&mut lane0, 2, &head(vec![r.clone()]));
        let mut lane1 = opening(1, 2);
        raw_piece(&mut lane1, 1, &r, 2, b"XY");
        lane1.push(TAG_END);
        let lanes = vec![Late(&lane0, false), Late(&lane1, true)];
        let got = receive_lanes(lanes).unwrap();
        assert_eq!(region_bytes(&got, 0), b"abXYefgh");
    }

    /// A piece the head counts that never came, a piece sent twice, a lane whose numbers go
    /// back, a lane numbered past the lanes there are: each refused, naming why.
    #[test]
    fn lanes_that_do_not_add_up_are_refused() {
        let r = region(0x2000, 8);
        let manifest = head(vec![r.clone()]);
        let stream = |lane0: &[(u64, u64, &[u8])], lane1: &[(u64, u64, &[u8])], count: u64| {
            let mut l0 = opening(0, 2);
            for (seq, off, b) in lane0 {
                raw_piece(&mut l0, *seq, &r, *off, b);
            }
            raw_head(&mut l0, count, &manifest);
            let mut l1 = opening(1, 2);
            for (seq, off, b) in lane1 {
                raw_piece(&mut l1, *seq, &r, *off, b);
            }
            l1.push(TAG_END);
            receive_lanes(vec![l0.as_slice(), l1.as_slice()]).err().unwrap().to_string()
        };
        let whole: &[u8] = b"abcdefgh";
        let e = stream(&[(0, 0, whole)], &[(2, 0, b"zz")], 3);
        assert!(e.contains("never came") || e.contains("the head counts 3"), "{e}");
        let e = stream(&[(0, 0, whole)], &[], 2);
        assert!(e.contains("1 pieces applied, the head counts 2"), "{e}");
        let e = stream(&[(0, 0, whole), (1, 0, b"zz")], &[(1, 0, b"zz")], 2);
        assert!(e.contains("piece 1 twice"), "{e}");
        let e = stream(&[(0, 0, whole), (2, 0, b"zz"), (1, 0, b"zz")], &[], 3);
        assert!(e.contains("piece 1 after piece 2 on lane 0"), "{e}");
        let e = open_lane(&mut opening(2, 2).as_slice(), &KEY).err().unwrap().to_string();
        assert!(e.contains("lane 2 of 2"), "{e}");
        let e = open_lane(&mut opening(0, MAX_LANES + 1).as_slice(), &KEY).err().unwrap().to_string();
        assert!(e.contains("at most 16 lanes"), "{e}");
    }
}
