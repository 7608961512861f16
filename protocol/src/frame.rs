//! The fixed frame header. Every frame is this 48-byte header (little-endian) followed by
//! `payload_len` bytes of payload:
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 4 | magic `PHOS` |
//! | 4 | 1 | version: 1, or [`HANDSHAKE_VERSION`] on a `Hello` that names its APIs |
//! | 5 | 1 | [`FrameKind`] |
//! | 6 | 2 | flags ([`FLAG_ASYNC`], [`FLAG_REFUSED`], [`FLAG_MEASURE`], [`FLAG_RESENT`]) |
//! | 8 | 4 | function id (calls and replies) |
//! | 12 | 4 | device: the calling thread's current device (calls) |
//! | 16 | 4 | status: the CUDA error code (replies) |
//! | 20 | 2 | API id of the function (calls and replies; 0 is the runtime API, `cudart`) |
//! | 22 | 2 | reserved, zero |
//! | 24 | 8 | session id |
//! | 32 | 8 | call id, echoed by the reply |
//! | 40 | 8 | payload length |

pub const MAGIC: u32 = u32::from_le_bytes(*b"PHOS");
/// The version of every frame but a `Hello` of this build. The layout is the first one's: the
/// API id sits in what was a reserved field that every peer set to zero, and zero is the
/// runtime API, so a guest built before there were several APIs reads and writes the same
/// frames.
pub const VERSION: u8 = 1;
/// The version of a `Hello` whose payload is a [`Hello`](crate::handshake::Hello) naming the
/// APIs it speaks and their versions. A version-1 `Hello` is a
/// [`LegacyHello`](crate::handshake::LegacyHello) (one spec hash); a router from before
/// version 2 refuses this one with "protocol version 2".
pub const HANDSHAKE_VERSION: u8 = 2;
pub const HEADER_LEN: usize = 48;

/// On a call: the guest does not wait for its reply (a call the spec marks `async`, returned
/// to the application at once); the server records its call id for [`FrameKind::Barrier`]s
/// and answers it only as part of an acknowledgement. On a reply: an acknowledgement of every
/// async call of the channel up to `call_id`, with `status` the last error among them (0 if
/// none) and as payload the number that failed (u64, little-endian).
pub const FLAG_ASYNC: u16 = 1;

/// On a reply: the router refused this async call (a quota or a policy), so it never
/// reached the server; `status` is the error. The guest retires the call if it still waits
/// for it (a later acknowledgement from the server may already have covered its id).
pub const FLAG_REFUSED: u16 = 2;

/// On a call: some policy of the router needs this call's device time, so the server
/// measures it (a kernel launch) rather than sampling one launch in N. The router sets it;
/// a guest's setting is cleared.
pub const FLAG_MEASURE: u16 = 4;

/// On a call: the guest sends it again on a new channel, having had no answer on the one
/// that was cut (its session was stopped by a checkpoint, or moved; a VM's vsock device was
/// unplugged). It may have run before. An async call a server knows ran (its ledger, or its
/// image's, says so) is acknowledged without running again. A synchronous call (same call
/// id) whose reply the server kept, as the last one a channel of the session answered, is
/// answered with that reply without running again; one it has no reply for runs. Servers
/// of builds before synchronous calls were kept ignore the flag on them (the call runs), so
/// guests of either build work with servers of either.
pub const FLAG_RESENT: u16 = 8;

/// On a reply to a synchronous library call: `status` is not this call's but the failure of
/// an earlier async call of the same API on the same handle (a function with an `@async_id`,
/// which returned before it ran), kept by the server until now. The call itself did not run,
/// unless it destroys the handle (it did, and succeeded). The payload names the failed
/// function (UTF-8).
pub const FLAG_DEFERRED: u16 = 16;

/// The most call ids one [`FrameKind::Barrier`] may name.
pub const MAX_BARRIER_IDS: usize = 1024;

/// The status of a `Refused` handshake answer that says the session moved to another router
/// (a live migration): the payload is the endpoint (`unix:PATH`, `tcp:HOST:PORT`) where the
/// guest reconnects with its token. Not a CUDA error: no call ever returns it.
pub const REFUSED_MOVED: i32 = 0x4d4f_5645;

/// The status of a `Refused` handshake answer that says the session's process is being
/// checkpointed with CRIU (`phosctl checkpoint --process`): the guest keeps its calls and
/// tries again later, without a deadline, and holds no connection meanwhile. Not a CUDA
/// error: no call ever returns it.
pub const REFUSED_PARKED: i32 = 0x5041_524b;

/// What a frame is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum FrameKind {
    /// An API call (payload: the function's request).
    Call = 1,
    /// The answer to a call (payload: the function's reply when status is success).
    Reply = 2,
    /// Opens a channel (payload: [`handshake::Hello`](crate::handshake::Hello)).
    Hello = 3,
    /// Accepts a channel (payload: [`handshake::Welcome`](crate::handshake::Welcome)).
    Welcome = 4,
    /// Refuses a channel or reports a protocol error (payload: a UTF-8 reason).
    Refused = 5,
    /// Device `printf` output for the guest's standard output, sent before a reply.
    Output = 6,
    /// API server -> router: the session's resource usage (payload:
    /// [`UsageReport`](crate::handshake::UsageReport)), sent before a reply when it changed.
    /// The router keeps it; guests never see one.
    Report = 7,
    /// Guest -> API server, before a call: wait until the async calls with these call ids
    /// (payload: little-endian u64s), sent on the session's other channels before this
    /// call was made, have run. This keeps CUDA's ordering across host threads: work a
    /// thread enqueued before another thread synchronises is part of what it waits for.
    /// No reply.
    Barrier = 8,
    /// Router -> API server: the async call with this header's call id was refused by the
    /// router (a quota or a policy) and answered there; it will never reach the server, so
    /// a [`FrameKind::Barrier`] of another channel that already named it stops waiting for
    /// it. Sent on the channel the call came on, in its place. No payload, no reply. Guests
    /// never send one (the router ends a channel that does).
    Withdrawn = 9,
}

impl FrameKind {
    pub fn from_u8(v: u8) -> Option<FrameKind> {
        Some(match v {
            1 => FrameKind::Call,
            2 => FrameKind::Reply,
            3 => FrameKind::Hello,
            4 => FrameKind::Welcome,
            5 => FrameKind::Refused,
            6 => FrameKind::Output,
            7 => FrameKind::Report,
            8 => FrameKind::Barrier,
            9 => FrameKind::Withdrawn,
            _ => return None,
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    /// [`VERSION`], or [`HANDSHAKE_VERSION`] on a `Hello` of this build.
    pub version: u8,
    pub kind: FrameKind,
    pub flags: u16,
    /// The API of `function` (calls and replies).
    pub api: u16,
    pub function: u32,
    pub device: i32,
    pub status: i32,
    pub session: u64,
    pub call_id: u64,
    pub payload_len: u64,
}

/// Why 48 bytes are not a valid header.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeaderError {
    #[error("bad magic {0:#010x}")]
    BadMagic(u32),
    #[error("protocol version {0} (this build speaks {VERSION} and {HANDSHAKE_VERSION})")]
    BadVersion(u8),
    #[error("unknown frame kind {0}")]
    BadKind(u8),
    #[error("reserved field is not zero")]
    Reserved,
}

impl FrameHeader {
    pub fn new(kind: FrameKind) -> Self {
        FrameHeader {
            version: VERSION,
            kind,
            flags: 0,
            api: 0,
            function: 0,
            device: 0,
            status: 0,
            session: 0,
            call_id: 0,
            payload_len: 0,
        }
    }

    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        b[4] = self.version;
        b[5] = self.kind as u8;
        b[6..8].copy_from_slice(&self.flags.to_le_bytes());
        b[8..12].copy_from_slice(&self.function.to_le_bytes());
        b[12..16].copy_from_slice(&self.device.to_le_bytes());
        b[16..20].copy_from_slice(&self.status.to_le_bytes());
        b[20..22].copy_from_slice(&self.api.to_le_bytes());
        b[24..32].copy_from_slice(&self.session.to_le_bytes());
        b[32..40].copy_from_slice(&self.call_id.to_le_bytes());
        b[40..48].copy_from_slice(&self.payload_len.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8; HEADER_LEN]) -> Result<Self, HeaderError> {
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap());
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
        let magic = u32_at(0);
        if magic != MAGIC {
            return Err(HeaderError::BadMagic(magic));
        }
        if b[4] != VERSION && b[4] != HANDSHAKE_VERSION {
            return Err(HeaderError::BadVersion(b[4]));
        }
        let kind = FrameKind::from_u8(b[5]).ok_or(HeaderError::BadKind(b[5]))?;
        if b[22] != 0 || b[23] != 0 {
            return Err(HeaderError::Reserved);
        }
        Ok(FrameHeader {
            version: b[4],
            kind,
            flags: u16::from_le_bytes([b[6], b[7]]),
            api: u16::from_le_bytes([b[20], b[21]]),
            function: u32_at(8),
            device: u32_at(12) as i32,
            status: u32_at(16) as i32,
            session: u64_at(24),
            call_id: u64_at(32),
            payload_len: u64_at(40),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let h = FrameHeader {
            version: VERSION,
            kind: FrameKind::Reply,
            flags: 3,
            api: 0x1234,
            function: 17,
            device: -1,
            status: 700,
            session: 0xdead_beef,
            call_id: u64::MAX,
            payload_len: 1 << 40,
        };
        assert_eq!(FrameHeader::decode(&h.encode()), Ok(h));
    }

    #[test]
    fn rejects_garbage() {
        let mut b = FrameHeader::new(FrameKind::Call).encode();
        b[0] = b'X';
        assert!(matches!(FrameHeader::decode(&b), Err(HeaderError::BadMagic(_))));
        let mut b = FrameHeader::new(FrameKind::Call).encode();
        b[4] = 99;
        assert_eq!(FrameHeader::decode(&b), Err(HeaderError::BadVersion(99)));
        let mut b = FrameHeader::new(FrameKind::Call).encode();
        b[5] = 77;
        assert_eq!(FrameHeader::decode(&b), Err(HeaderError::BadKind(77)));
        let mut b = FrameHeader::new(FrameKind::Call).encode();
        b[22] = 1;
        assert_eq!(FrameHeader::decode(&b), Err(HeaderError::Reserved));
    }

    /// A frame of a build from before the API field (reserved bytes all zero) is a runtime API
    /// frame of version 1; a handshake of this build is version 2.
    #[test]
    fn the_api_field_was_reserved_and_zero() {
        let mut old = [0u8; HEADER_LEN];
        old[0..4].copy_from_slice(b"PHOS");
        old[4] = 1;
        old[5] = FrameKind::Call as u8;
        old[8..12].copy_from_slice(&46u32.to_le_bytes());
        let h = FrameHeader::decode(&old).unwrap();
        assert_eq!((h.version, h.api, h.function), (1, 0, 46));
        assert_eq!(h.encode(), old, "this build writes the same bytes");
        let mut hello = FrameHeader::new(FrameKind::Hello);
        hello.version = HANDSHAKE_VERSION;
        assert_eq!(FrameHeader::decode(&hello.encode()).unwrap().version, 2);
        let mut b = hello.encode();
        b[4] = 3;
        assert_eq!(FrameHeader::decode(&b), Err(HeaderError::BadVersion(3)));
    }
}
