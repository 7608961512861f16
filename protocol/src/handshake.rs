//! Messages that open a channel. A guest process opens one channel per host thread that
//! makes CUDA calls; the first one creates the session, later ones join it with its token.
//!
//! ```text
//! guest                     router                         API server (one per session)
//!   Hello{token: none} --->   authenticate tenant,
//!                             spawn server, connect ---->   Attach{session, tenant}
//!                                                   <----   Welcome{device range, ...}
//!   <--- Welcome{session, token, ...}
//!   Call/Reply frames  <--->  forwarded (accounted)  <---->  dispatched
//! ```
//!
//! **Moving to shared memory.** A guest on the router's host lists
//! [`TransportKind::Shm`] in [`Hello::transports`]; if the router agrees, its
//! [`Welcome::transport`] says so and the router sends a shared region over the socket right
//! after it ([`ShmTransport::create`](crate::shm::ShmTransport::create)); from then on
//! frames travel through the region's rings and the socket only tells each side that the
//! other still exists. The router does the same towards the API server ([`Attach::transport`],
//! the region following the server's `Welcome`).
//!
//! **The pinned arena.** A guest that has one ([`crate::host_arena`]) says so in
//! [`Hello::host_arena`] and sends the file over the socket right after the `Hello`; the
//! router checks it and sends it to the server with the channel's shared region.

/// The CUDA major versions whose ABI the guest library presents; a `Hello` naming another is
/// refused.
pub const SUPPORTED_ABIS: [u32; 3] = [11, 12, 13];

/// Guest -> router: open a channel.
#[derive(Debug, Clone, PartialEq, Eq, bincode::Encode, bincode::Decode)]
pub struct Hello {
    /// `cudart::SPEC_HASH` of the guest's build; a mismatch is refused.
    pub spec_hash: u64,
    /// The guest process.
    pub pid: u32,
    /// CUDA major version of the ABI the application loaded (11, 12, 13).
    pub abi_major: u32,
    /// `None` for the first channel of a process; the session token for later ones.
    pub token: Option<[u8; 16]>,
    /// The program's name, for logs and `phosctl sessions`.
    pub program: String,
    /// Transports the guest can move the channel to after the handshake, best first
    /// (empty: stay on the socket).
    pub transports: Vec<TransportKind>,
    /// Over TCP, where the router cannot ask the kernel who connected: the tenant's secret
    /// from the router's configuration (`PHOS_TENANT_TOKEN`). Ignored on Unix sockets.
    pub tenant_token: Option<String>,
    /// A guest asking for shared memory that has a pinned host arena
    /// ([`crate::host_arena`]) sends its file right after this frame (`SCM_RIGHTS`); this is
    /// the file's size.
    pub host_arena: Option<u64>,
}

/// The transports a channel can use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, bincode::Encode, bincode::Decode)]
pub enum TransportKind {
    /// The Unix socket the channel opened on.
    Unix,
    /// Shared-memory rings (same host).
    Shm,
    /// A TCP connection (a router on another host).
    Tcp,
    /// An AF_VSOCK stream from inside a VM, carried by the hypervisor's `phos-vmm-device`
    /// to the router's socket. Added last: the variant index is on the wire.
    Vsock,
}

impl TransportKind {
    pub fn name(self) -> &'static str {
        match self {
            TransportKind::Unix => "unix",
            TransportKind::Shm => "shm",
            TransportKind::Tcp => "tcp",
            TransportKind::Vsock => "vsock",
        }
    }
}

/// Router -> API server: a channel of this session is being connected.
#[derive(Debug, Clone, PartialEq, Eq, bincode::Encode, bincode::Decode)]
pub struct Attach {
    pub spec_hash: u64,
    pub session: u64,
    pub tenant: String,
    pub abi_major: u32,
    /// What the channel moves to after the server's `Welcome`.
    pub transport: TransportKind,
}

/// Accepts a channel.
#[derive(Debug, Clone, PartialEq, Eq, bincode::Encode, bincode::Decode)]
pub struct Welcome {
    pub session: u64,
    /// Secret that lets more channels join this session.
    pub token: [u8; 16],
    /// `cuda` or `emu`.
    pub backend: String,
    /// The session's device address range: every device pointer lies in it.
    pub device_base: u64,
    pub device_size: u64,
    pub device_count: i32,
    /// How many times the session was restored: values the guest cached from the server that
    /// a restore may change (module variable addresses) are fetched again when it moves.
    pub epoch: u64,
    /// The transport the channel continues on.
    pub transport: TransportKind,
    /// The largest frame payload the router carries from the guest: a call whose request is
    /// larger fails at once instead of costing the channel.
    pub max_payload: u64,
}

/// API server -> router: what the session uses, in totals since it started (so a lost or
/// reordered report cannot skew the router's count). Indices are `cudart::RESOURCES`'.
#[derive(Debug, Clone, Default, PartialEq, Eq, bincode::Encode, bincode::Decode)]
pub struct UsageReport {
    /// Continuous resources: (resource, amount held now).
    pub held: Vec<(u32, u64)>,
    /// Measured resources: (resource, total measured, calls measured).
    pub measured: Vec<(u32, u64, u64)>,
    /// Sent once the channel's barrier has been passed (the calls of other channels it
    /// named have run), with nothing else in it: until then a thread of the guest waits
    /// for those calls, so the router must not hold them back for work queued behind it.
    pub barrier: bool,
    /// Per [`LimitKind`](crate::limits::LimitKind) (by index): calls refused since the server
    /// started because the session held as many objects of that kind as its limit allows.
    pub refused: Vec<(u32, u64)>,
}
