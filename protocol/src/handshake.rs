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
//! **APIs and their versions.** The `Hello` (frame version
//! [`HANDSHAKE_VERSION`](crate::frame::HANDSHAKE_VERSION)) names every API the guest library
//! speaks with its wire version and hash ([`ApiVersion`]); the router and then the API server
//! check each against what they serve ([`check_apis`]) and refuse the channel, naming the
//! API, when one does not match. A version-1 `Hello` ([`LegacyHello`]) comes from a guest built
//! before there were several APIs: it is served when its spec hash is one the lock file of an
//! API records as a legacy text hash. The rules are in `docs/compatibility.md`.
//!
//! **The pinned arena.** A guest that has one ([`crate::host_arena`]) says so in
//! [`Hello::host_arena`] and sends the file over the socket right after the `Hello`; the
//! router checks it and sends it to the server with the channel's shared region.

/// The CUDA major versions whose ABI the guest library presents; a `Hello` naming another is
/// refused.
pub const SUPPORTED_ABIS: [u32; 3] = [11, 12, 13];

/// One API a peer speaks: what `apis::Api` says of it in the peer's build.
#[derive(Debug, Clone, PartialEq, Eq, bincode::Encode, bincode::Decode)]
pub struct ApiVersion {
    /// The id in frame headers.
    pub id: u16,
    pub name: String,
    /// The wire version.
    pub version: u32,
    /// The hash of the API's wire facts.
    pub hash: u64,
}

impl ApiVersion {
    /// Every API of this build, as it names them in its `Hello`.
    pub fn of_this_build() -> Vec<ApiVersion> {
        crate::apis::Api::ALL
            .iter()
            .map(|a| ApiVersion { id: a.id(), name: a.name().to_string(), version: a.version(), hash: a.spec_hash() })
            .collect()
    }
}

/// Why a peer's APIs are not the ones this build serves: the refusal names the API.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApiMismatch {
    #[error("{whose} names no API")]
    NoApi { whose: &'static str },
    #[error("API id {id} is `{ours}` here, `{theirs}` in {whose}")]
    OtherName { id: u16, ours: &'static str, theirs: String, whose: &'static str },
    #[error("{whose} speaks `{api}` version {theirs}, this build version {ours}: use a build of the same version")]
    OtherVersion { api: &'static str, theirs: u32, ours: u32, whose: &'static str },
    #[error(
        "the `{api}` API of {whose} (wire hash {theirs:016x}) is not one this build serves (its own is {ours:016x}): \
         {whose} comes from a newer build, or from a spec that changed in a way this build does not accept"
    )]
    UnservedHash { api: &'static str, theirs: u64, ours: u64, whose: &'static str },
}

/// Whether this build serves the APIs a peer names (`whose`: "the guest library", "the
/// image"). An API this build does not know is left out (calls of it are refused one by one);
/// one it knows must have its name, its version, and a hash it serves (its own, or an earlier
/// compatible revision's).
pub fn check_apis(apis: &[ApiVersion], whose: &'static str) -> Result<(), ApiMismatch> {
    if apis.is_empty() {
        return Err(ApiMismatch::NoApi { whose });
    }
    for a in apis {
        let Some(ours) = crate::apis::Api::from_id(a.id) else { continue };
        if ours.name() != a.name {
            return Err(ApiMismatch::OtherName { id: a.id, ours: ours.name(), theirs: a.name.clone(), whose });
        }
        if ours.version() != a.version {
            return Err(ApiMismatch::OtherVersion { api: ours.name(), theirs: a.version, ours: ours.version(), whose });
        }
        if !ours.served_hashes().contains(&a.hash) {
            return Err(ApiMismatch::UnservedHash { api: ours.name(), theirs: a.hash, ours: ours.spec_hash(), whose });
        }
    }
    Ok(())
}

/// Guest -> router: open a channel (a `Hello` frame of version
/// [`HANDSHAKE_VERSION`](crate::frame::HANDSHAKE_VERSION)).
#[derive(Debug, Clone, PartialEq, Eq, bincode::Encode, bincode::Decode)]
pub struct Hello {
    /// Every API the guest library speaks; each is checked with [`check_apis`].
    pub apis: Vec<ApiVersion>,
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

/// The `Hello` of a guest built before there were several APIs (frame version 1): the layout
/// such guests send, kept to serve them.
#[derive(Debug, Clone, PartialEq, Eq, bincode::Encode, bincode::Decode)]
pub struct LegacyHello {
    /// FNV-1a of the text of the spec the guest was built from.
    pub spec_hash: u64,
    pub pid: u32,
    pub abi_major: u32,
    pub token: Option<[u8; 16]>,
    pub program: String,
    pub transports: Vec<TransportKind>,
    pub tenant_token: Option<String>,
    pub host_arena: Option<u64>,
}

/// Why the payload of a `Hello` frame is not a `Hello` this build serves.
#[derive(Debug, thiserror::Error)]
pub enum HelloError {
    #[error("{0}")]
    Decode(#[from] bincode::error::DecodeError),
    #[error(
        "the guest library was built from a spec (text hash {0:016x}) this build does not serve: use a guest \
         library of this build"
    )]
    UnknownSpecText(u64),
}

impl LegacyHello {
    /// The `Hello` it means: the one API whose lock file records its spec text as a legacy
    /// one, at the revision this build carries (its ids and layouts are that text's, plus what
    /// was added since).
    pub fn upgrade(self) -> Result<Hello, HelloError> {
        let Some(api) = crate::apis::Api::ALL.iter().find(|a| a.legacy_text_hashes().contains(&self.spec_hash)) else {
            return Err(HelloError::UnknownSpecText(self.spec_hash));
        };
        Ok(Hello {
            apis: vec![ApiVersion {
                id: api.id(),
                name: api.name().to_string(),
                version: api.version(),
                hash: api.spec_hash(),
            }],
            pid: self.pid,
            abi_major: self.abi_major,
            token: self.token,
            program: self.program,
            transports: self.transports,
            tenant_token: self.tenant_token,
            host_arena: self.host_arena,
        })
    }
}

/// Decode the payload of a `Hello` frame of `version` (the frame header's): a version-1
/// `Hello` comes from a guest built before there were several APIs.
pub fn decode_hello(version: u8, payload: &[u8]) -> Result<Hello, HelloError> {
    match version {
        crate::frame::HANDSHAKE_VERSION => Ok(crate::decode::<Hello>(payload)?),
        _ => crate::decode::<LegacyHello>(payload)?.upgrade(),
    }
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
    /// The APIs of the guest's `Hello`, which the server checks too.
    pub apis: Vec<ApiVersion>,
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
/// reordered report cannot skew the router's count). Indices are `apis::RESOURCES`'.
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_build_serves_its_own_apis_and_names_a_mismatch() {
        let ours = ApiVersion::of_this_build();
        assert!(ours.iter().any(|a| a.name == "cudart" && a.id == 0));
        let who = "the guest library";
        assert_eq!(check_apis(&ours, who), Ok(()));
        let mut other = ours.clone();
        other[0].hash ^= 1;
        let e = check_apis(&other, who).unwrap_err().to_string();
        assert!(e.contains(&format!("`{}`", ours[0].name)) && e.contains("wire hash"), "{e}");
        let mut newer = ours.clone();
        newer[0].version += 1;
        assert!(check_apis(&newer, who).unwrap_err().to_string().contains("version"));
        // An API this build does not know is not served but does not refuse the session.
        let mut more = ours.clone();
        more.push(ApiVersion { id: 999, name: "cublas".into(), version: 1, hash: 1 });
        assert_eq!(check_apis(&more, who), Ok(()));
        assert!(check_apis(&[], who).is_err());
    }

    #[test]
    fn a_legacy_hello_is_served_only_with_a_recorded_text_hash() {
        let legacy = |spec_hash| LegacyHello {
            spec_hash,
            pid: 7,
            abi_major: 12,
            token: None,
            program: "old".into(),
            transports: vec![TransportKind::Shm],
            tenant_token: None,
            host_arena: Some(4096),
        };
        let known = crate::cudart::LEGACY_TEXT_HASHES[0];
        let hello = decode_hello(1, &crate::encode(&legacy(known))).unwrap();
        assert_eq!(hello.apis.len(), 1);
        assert_eq!(hello.apis[0].hash, crate::cudart::SPEC_HASH);
        assert_eq!((hello.pid, hello.host_arena), (7, Some(4096)));
        assert!(decode_hello(1, &crate::encode(&legacy(known ^ 1))).unwrap_err().to_string().contains("text hash"));
        // A version-2 payload is not a legacy one, and the reverse.
        let hello = Hello { apis: ApiVersion::of_this_build(), ..hello };
        assert!(decode_hello(2, &crate::encode(&hello)).is_ok());
        assert!(decode_hello(2, &crate::encode(&legacy(known))).is_err());
    }
}
