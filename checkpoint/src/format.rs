//! The manifest's types.

/// What an image holds, besides the memory contents.
#[derive(Debug, Clone, Default, PartialEq, Eq, bincode::Encode, bincode::Decode)]
pub struct Manifest {
    /// [`FORMAT_VERSION`](crate::FORMAT_VERSION) (set by the writer).
    pub format: u32,
    /// The APIs of the server that took the image, with their wire versions and hashes: a
    /// server restores it only if it serves each (the records are calls of these APIs).
    pub apis: Vec<ImageApi>,
    /// When the checkpoint was taken (milliseconds since the Unix epoch).
    pub created_ms: u64,
    pub session: SessionMeta,
    /// Next value of each handle kind's counter, so restored sessions never reuse a handle.
    pub handle_counters: Vec<(String, u64)>,
    /// Calls that created the session's live objects, in the order to replay them (every
    /// record after those it depends on).
    pub records: Vec<Record>,
    /// Device memory ranges and where their contents are.
    pub memory: Vec<MemoryRegion>,
    /// The guest's async calls that had run when the image was taken.
    pub async_calls: AsyncCallsRun,
    /// The session's graphs and executable graphs, as the API server encodes them (opaque
    /// here; empty for a session without graphs and in images before version 5).
    pub graphs: Vec<u8>,
    /// The last synchronous call each of the session's channels answered (and those of
    /// channels that ended lately), with its reply: a guest whose connection was cut before
    /// the answer reached it sends the call again, flagged as resent, and the restored session
    /// answers it with this reply instead of running it twice. Empty in images before
    /// version 8.
    pub sync_replies: Vec<KeptReply>,
    /// The session's CUDA arrays and mipmapped arrays (with their contents), the levels of
    /// mipmapped arrays it was handed, and its texture and surface objects, as the API server
    /// encodes them (opaque here; empty for a session without any and in images before
    /// version 9).
    pub arrays: Vec<u8>,
    /// The session's conditional graph node handles. Empty in images before version 9.
    pub conditionals: Vec<ConditionalHandle>,
}

/// A conditional graph node handle (`cudaGraphConditionalHandleCreate`): the device address
/// of its 4-byte cell, an allocation of the session's whose contents are among the image's
/// memory regions, and what it was made with.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, bincode::Encode, bincode::Decode)]
pub struct ConditionalHandle {
    /// The handle: its cell's address (an allocation of 4 bytes, on `device`).
    pub cell: u64,
    pub device: i32,
    /// The graph it was made for (a virtual handle).
    pub graph: u64,
    /// `defaultLaunchValue`, and the flags (`cudaGraphCondAssignDefault` is 1).
    pub default: u32,
    pub flags: u32,
}

/// A synchronous call the session answered, and its answer, as a channel keeps the last one
/// (see [`Manifest::sync_replies`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, bincode::Encode, bincode::Decode)]
pub struct KeptReply {
    /// The guest's call id (unique in the guest process).
    pub call_id: u64,
    /// The call's API id and function id: a resent call must name the same.
    pub api: u16,
    pub function: u32,
    /// The status answered (0: success) and the reply's payload.
    pub status: i32,
    pub payload: Vec<u8>,
}

/// Which of the guest's async calls (by call id; ids are unique in the guest process and
/// grow) had run in the session when its image was taken. A guest whose channels are cut
/// (the session checkpointed and stopped, or migrated) sends again every async call it had no
/// acknowledgement for; the restored session answers those that ran before the image
/// without running them a second time, and barriers naming them pass.
#[derive(Debug, Clone, Default, PartialEq, Eq, bincode::Encode, bincode::Decode)]
pub struct AsyncCallsRun {
    /// Every id below this counts as run (older than the window the server remembers).
    pub below: u64,
    /// Bit `k` of word `w`: id `below + 64 * w + k` ran. Trailing zero words are left out.
    pub ran: Vec<u64>,
}

/// One API the session's server spoke.
#[derive(Debug, Clone, Default, PartialEq, Eq, bincode::Encode, bincode::Decode)]
pub struct ImageApi {
    /// The API's id (a record's `api`).
    pub id: u16,
    pub name: String,
    /// Its wire version and the hash of its wire facts.
    pub version: u32,
    pub hash: u64,
}

/// Who the session was.
#[derive(Debug, Clone, Default, PartialEq, Eq, bincode::Encode, bincode::Decode)]
pub struct SessionMeta {
    pub id: u64,
    /// The secret that lets the guest's channels rejoin the session.
    pub token: [u8; 16],
    pub tenant: String,
    pub program: String,
    pub abi_major: u32,
    /// Backend the image was taken on (`cuda`, `emu`); it can be restored on either.
    pub backend: String,
    pub device_base: u64,
    pub device_size: u64,
    /// Devices the session used (their count and names, for the operator).
    pub devices: Vec<String>,
    /// Restores so far; the guest uses it to notice values that may have changed.
    pub epoch: u64,
}

/// One recorded call: what the spec's `obj_record` descriptors say to keep.
#[derive(Debug, Clone, PartialEq, Eq, bincode::Encode, bincode::Decode)]
pub struct Record {
    /// The API (an id of [`Manifest::apis`]), the function's id in it and its name (the name
    /// guards against a different spec).
    pub api: u16,
    pub function: u32,
    pub name: String,
    /// Device the call was made on.
    pub device: i32,
    /// The request as the guest sent it.
    pub payload: Vec<u8>,
    /// Objects the call created: (kind, virtual handle or device address).
    pub creates: Vec<(String, u64)>,
}

/// A range of device memory.
#[derive(Debug, Clone, PartialEq, Eq, bincode::Encode, bincode::Decode)]
pub struct MemoryRegion {
    pub addr: u64,
    pub size: u64,
    pub device: i32,
    pub kind: RegionKind,
    pub chunks: Vec<Chunk>,
}

#[derive(Debug, Clone, PartialEq, Eq, bincode::Encode, bincode::Decode)]
pub enum RegionKind {
    /// A `cudaMalloc` allocation: restored at the same address.
    Allocation,
    /// A module variable: restored into the variable of the reloaded module (by handle and
    /// name), wherever the backend placed it.
    ModuleVariable { module: u64, name: String },
}

/// One stored piece of a region.
#[derive(Debug, Clone, Copy, PartialEq, Eq, bincode::Encode, bincode::Decode)]
pub struct Chunk {
    /// Offset in the region and length.
    pub offset: u64,
    pub len: u64,
    pub encoding: Encoding,
    /// Bytes stored, in memory file `file` (0 is `memory`, N is `memory.N`) at `at`.
    pub stored: u64,
    pub file: u32,
    pub at: u64,
    /// CRC-32 of the stored bytes.
    pub crc: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, bincode::Encode, bincode::Decode)]
pub enum Encoding {
    /// All zeros: nothing stored.
    Zero,
    Raw,
    Zstd,
}
