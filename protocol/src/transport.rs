//! Transports move frames between two peers. Every transport implements [`Transport`]:
//! Unix stream sockets ([`UnixTransport`]), TCP ([`TcpTransport`], a GPU server on another
//! host), AF_VSOCK ([`VsockTransport`], a guest inside a VM) and shared-memory rings
//! ([`ShmTransport`](crate::shm::ShmTransport)), which a channel that opened on a Unix
//! socket moves to when both ends agree (see [`handshake`](crate::handshake)).

use std::io::{self, IoSlice, Read, Write};
use std::net::TcpStream;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use crate::frame::{FrameHeader, HEADER_LEN, HeaderError};
use crate::handshake::TransportKind;

/// Why a frame could not be received.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// The peer closed the connection cleanly between frames.
    #[error("peer closed the connection")]
    Closed,
    #[error("i/o error: {0}")]
    Io(#[from] io::Error),
    #[error("bad frame header: {0}")]
    Header(#[from] HeaderError),
    /// The header announces a payload larger than this end accepts.
    #[error("payload of {0} bytes is over the limit of {1}")]
    TooLarge(u64, u64),
    /// Memory for the payload could not be had.
    #[error("cannot allocate {0} bytes for a payload")]
    NoMemory(u64),
    /// The payload would take the channel's group (its tenant) past the bytes it may have
    /// buffered at once.
    #[error("a payload of {0} bytes is over the buffered-bytes limit of {1}")]
    OverBudget(u64, u64),
}

/// A bidirectional, ordered, reliable frame channel.
pub trait Transport: Send {
    /// Send one frame. `payload` pieces are sent back to back without being joined, and
    /// their total length must equal `header.payload_len`.
    fn send(&mut self, header: &FrameHeader, payload: &[&[u8]]) -> io::Result<()>;

    /// Receive one frame; its payload replaces the contents of `payload`.
    fn recv(&mut self, payload: &mut Vec<u8>) -> Result<FrameHeader, TransportError>;

    /// Whether a frame has (at least partly) arrived, so [`recv`](Self::recv) will not wait
    /// for the peer to act. Never blocks. A closed connection counts as readable (its `recv`
    /// reports the close).
    fn readable(&mut self) -> bool {
        self.wait_readable(std::time::Duration::ZERO)
    }

    /// Wait up to `timeout` for [`readable`](Self::readable).
    fn wait_readable(&mut self, timeout: std::time::Duration) -> bool;

    /// A reading half and a writing half, for a peer that reads on one thread and writes
    /// on another.
    fn split(self: Box<Self>) -> io::Result<(Box<dyn Transport>, Box<dyn Transport>)>;

    /// End the connection in both directions, waking whoever waits on it (either half).
    fn shutdown(&self);

    /// Which transport this is.
    fn kind(&self) -> TransportKind;

    /// A frame is expected within `within` (the answer to a synchronous call): a reader of
    /// this channel, on either half, may spin that long rather than sleep. Only a hint.
    fn expect_frame_within(&self, within: std::time::Duration) {
        let _ = within;
    }

    /// Charge the memory that frames received here hold to `budget` (shared with other
    /// channels): a frame past it fails with [`TransportError::OverBudget`]. Only the
    /// reading half of a [`split`](Self::split) keeps the charge.
    fn charge_payloads_to(&mut self, budget: std::sync::Arc<BufferBudget>);

    /// The Unix socket underneath, for a channel that moves to shared memory after its
    /// handshake; an error (and the channel lost) on other transports.
    fn into_unix(self: Box<Self>) -> io::Result<UnixStream> {
        Err(io::Error::new(io::ErrorKind::Unsupported, format!("a {} channel has no Unix socket", self.kind().name())))
    }
}

/// A stream socket a [`SocketTransport`] can carry frames over.
pub trait FrameSocket: Read + AsFd + AsRawFd + Send + Sized + 'static {
    const KIND: TransportKind;
    fn try_clone_socket(&self) -> io::Result<Self>;
    fn shutdown_socket(&self);
    /// The socket as a Unix one, for a channel that moves to shared memory.
    fn into_unix_socket(self) -> io::Result<UnixStream> {
        Err(io::Error::new(io::ErrorKind::Unsupported, format!("a {} channel has no Unix socket", Self::KIND.name())))
    }
}

impl FrameSocket for UnixStream {
    const KIND: TransportKind = TransportKind::Unix;

    fn try_clone_socket(&self) -> io::Result<Self> {
        self.try_clone()
    }

    fn shutdown_socket(&self) {
        let _ = self.shutdown(std::net::Shutdown::Both);
    }

    fn into_unix_socket(self) -> io::Result<UnixStream> {
        Ok(self)
    }
}

impl FrameSocket for TcpStream {
    const KIND: TransportKind = TransportKind::Tcp;

    fn try_clone_socket(&self) -> io::Result<Self> {
        self.try_clone()
    }

    fn shutdown_socket(&self) {
        let _ = self.shutdown(std::net::Shutdown::Both);
    }
}

impl FrameSocket for vsock::VsockStream {
    const KIND: TransportKind = TransportKind::Vsock;

    fn try_clone_socket(&self) -> io::Result<Self> {
        self.try_clone()
    }

    fn shutdown_socket(&self) {
        let _ = self.shutdown(std::net::Shutdown::Both);
    }
}

/// Frames over a stream socket: [`UnixTransport`], [`TcpTransport`] or [`VsockTransport`].
pub struct SocketTransport<S: FrameSocket> {
    stream: S,
    max_payload: u64,
    /// What the payload buffer of frames received here is charged to, if anything.
    claim: Option<BufferClaim>,
}

/// Frames over a Unix stream socket.
pub type UnixTransport = SocketTransport<UnixStream>;

/// Frames over TCP, for a guest whose GPU server is on another host. No encryption: use it
/// on a trusted network or through a tunnel; the tenant proves itself with a token
/// ([`Hello::tenant_token`](crate::handshake::Hello::tenant_token)).
pub type TcpTransport = SocketTransport<TcpStream>;

/// The port a VM's guests reach Phos on (`vsock:2:7070`), unless the operator gives
/// `phos-vmm-device --port` another.
pub const DEFAULT_VSOCK_PORT: u32 = 7070;

/// Frames over AF_VSOCK, for a guest inside a VM: the hypervisor's `phos-vmm-device` ends
/// the connection and carries its bytes to the router's socket for the VM's tenant, so
/// the tenant is the VM's, whatever the guest claims.
pub type VsockTransport = SocketTransport<vsock::VsockStream>;

impl<S: FrameSocket> SocketTransport<S> {
    pub fn new(stream: S) -> Self {
        SocketTransport { stream, max_payload: crate::DEFAULT_MAX_PAYLOAD, claim: None }
    }

    /// Refuse frames whose payload is larger than this.
    pub fn with_max_payload(mut self, max: u64) -> Self {
        self.max_payload = max;
        self
    }

    pub fn stream(&self) -> &S {
        &self.stream
    }

    pub fn into_stream(self) -> S {
        self.stream
    }

    /// A second handle on the same socket (one thread reads while another writes).
    pub fn try_clone(&self) -> io::Result<Self> {
        Ok(SocketTransport { stream: self.stream.try_clone_socket()?, max_payload: self.max_payload, claim: None })
    }
}

impl UnixTransport {
    pub fn connect(path: &Path) -> io::Result<Self> {
        Ok(Self::new(UnixStream::connect(path)?))
    }
}

impl TcpTransport {
    pub fn connect(addr: &str) -> io::Result<Self> {
        let stream = TcpStream::connect(addr)?;
        // Calls are small and answered at once: no Nagle delay.
        stream.set_nodelay(true)?;
        Ok(Self::new(stream))
    }
}

impl VsockTransport {
    /// Connect to `port` of `cid` (2 is the host, [`vsock::VMADDR_CID_HOST`]).
    pub fn connect(cid: u32, port: u32) -> io::Result<Self> {
        Ok(Self::new(vsock::VsockStream::connect_with_cid_port(cid, port)?))
    }
}

impl<S: FrameSocket> Transport for SocketTransport<S> {
    fn send(&mut self, header: &FrameHeader, payload: &[&[u8]]) -> io::Result<()> {
        write_frame(&mut NoSigPipe(self.stream.as_fd()), header, payload)
    }

    fn recv(&mut self, payload: &mut Vec<u8>) -> Result<FrameHeader, TransportError> {
        read_frame_within(&mut self.stream, payload, self.max_payload, self.claim.as_mut())
    }

    fn charge_payloads_to(&mut self, budget: std::sync::Arc<BufferBudget>) {
        self.claim = Some(BufferClaim::new(budget));
    }

    fn wait_readable(&mut self, timeout: std::time::Duration) -> bool {
        let mut pfd = libc::pollfd { fd: self.stream.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // ppoll: sub-millisecond timeouts.
        let ts = libc::timespec {
            tv_sec: timeout.as_secs().min(i32::MAX as u64) as libc::time_t,
            tv_nsec: timeout.subsec_nanos() as libc::c_long,
        };
        // SAFETY: ppoll reads and writes the one pollfd and reads the timespec, both on this
        // stack; no signal mask is passed.
        let n = unsafe { libc::ppoll(&mut pfd, 1, &ts, std::ptr::null()) };
        n > 0 && pfd.revents != 0
    }

    fn split(self: Box<Self>) -> io::Result<(Box<dyn Transport>, Box<dyn Transport>)> {
        let other = self.try_clone()?;
        Ok((self, Box::new(other)))
    }

    fn shutdown(&self) {
        self.stream.shutdown_socket();
    }

    fn kind(&self) -> TransportKind {
        S::KIND
    }

    fn into_unix(self: Box<Self>) -> io::Result<UnixStream> {
        self.stream.into_unix_socket()
    }
}

/// Write all of `bufs`, however the kernel splits the writes.
fn write_all_vectored(w: &mut impl Write, mut bufs: &mut [IoSlice<'_>]) -> io::Result<()> {
    IoSlice::advance_slices(&mut bufs, 0);
    while !bufs.is_empty() {
        match w.write_vectored(bufs) {
            Ok(0) => {
                return Err(io::Error::new(io::ErrorKind::WriteZero, "peer stopped reading"));
            }
            Ok(n) => IoSlice::advance_slices(&mut bufs, n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Read a frame from any byte stream, growing `payload` only as bytes arrive (a header that
/// lies about its length cannot make us allocate what was never sent).
pub fn read_frame(r: &mut impl Read, payload: &mut Vec<u8>, max_payload: u64) -> Result<FrameHeader, TransportError> {
    read_frame_within(r, payload, max_payload, None)
}

/// A payload buffer may keep this much without a claim on a [`BufferBudget`].
pub const FREE_BUFFER: usize = 1 << 20;

/// The first piece of a payload read before the buffer grows with what has arrived.
pub const FIRST_PIECE: usize = 64 << 10;

/// [`read_frame`], with the payload buffer's memory beyond [`FREE_BUFFER`] charged to a
/// [`BufferClaim`] (a tenant's budget shared by its channels): a frame that would take the
/// budget past its limit fails with [`TransportError::OverBudget`]. A buffer that a large
/// frame grew is kept for the next one (so a channel that moves large frames does not fault
/// in fresh pages for each) until the budget is half used; then it is given back before the
/// channel waits for its next frame.
pub fn read_frame_within(
    r: &mut impl Read,
    payload: &mut Vec<u8>,
    max_payload: u64,
    mut claim: Option<&mut BufferClaim>,
) -> Result<FrameHeader, TransportError> {
    payload.clear();
    if let Some(c) = claim.as_deref_mut()
        && payload.capacity() > FREE_BUFFER
        && c.budget.used() > c.budget.limit / 2
    {
        payload.shrink_to(FREE_BUFFER);
        c.hold(payload.capacity().saturating_sub(FREE_BUFFER) as u64);
    }
    let mut hdr = [0u8; HEADER_LEN];
    // Distinguish a clean close (no byte of a new frame) from a truncated header.
    let mut got = 0;
    while got < HEADER_LEN {
        match r.read(&mut hdr[got..]) {
            Ok(0) if got == 0 => return Err(TransportError::Closed),
            Ok(0) => return Err(TransportError::Io(io::ErrorKind::UnexpectedEof.into())),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    let header = FrameHeader::decode(&hdr)?;
    if header.payload_len > max_payload {
        return Err(TransportError::TooLarge(header.payload_len, max_payload));
    }
    let total = usize::try_from(header.payload_len).map_err(|_| TransportError::NoMemory(header.payload_len))?;
    // The buffer at most doubles before the bytes that fill it have arrived: a peer has to
    // send about half of what it makes us hold.
    while payload.len() < total {
        let start = payload.len();
        let want = (total - start).min(start.max(FIRST_PIECE));
        if let Some(c) = claim.as_deref_mut() {
            let needed = (start + want).max(payload.capacity()).saturating_sub(FREE_BUFFER) as u64;
            if !c.hold(needed) {
                return Err(TransportError::OverBudget(header.payload_len, c.budget.limit));
            }
        }
        payload.try_reserve_exact(want).map_err(|_| TransportError::NoMemory(header.payload_len))?;
        payload.resize(start + want, 0);
        if let Err(e) = r.read_exact(&mut payload[start..]) {
            return Err(e.into());
        }
    }
    Ok(header)
}

/// Bytes of frame payloads that a group of channels (one tenant's) may hold at once, beyond
/// [`FREE_BUFFER`] each.
#[derive(Debug)]
pub struct BufferBudget {
    limit: u64,
    used: std::sync::atomic::AtomicU64,
}

impl BufferBudget {
    pub fn new(limit: u64) -> std::sync::Arc<Self> {
        std::sync::Arc::new(BufferBudget { limit, used: std::sync::atomic::AtomicU64::new(0) })
    }

    /// Bytes held now by the group's channels.
    pub fn used(&self) -> u64 {
        self.used.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub fn limit(&self) -> u64 {
        self.limit
    }
}

/// One channel's share of a [`BufferBudget`]; given back when dropped.
#[derive(Debug)]
pub struct BufferClaim {
    budget: std::sync::Arc<BufferBudget>,
    held: u64,
}

impl BufferClaim {
    pub fn new(budget: std::sync::Arc<BufferBudget>) -> Self {
        BufferClaim { budget, held: 0 }
    }

    /// Hold `bytes` in all (more or less than now); `false`, holding what it held before,
    /// when more would take the budget past its limit.
    pub fn hold(&mut self, bytes: u64) -> bool {
        use std::sync::atomic::Ordering;
        if bytes <= self.held {
            self.budget.used.fetch_sub(self.held - bytes, Ordering::Relaxed);
            self.held = bytes;
            return true;
        }
        let more = bytes - self.held;
        let limit = self.budget.limit;
        let ok = self
            .budget
            .used
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |u| u.checked_add(more).filter(|n| *n <= limit))
            .is_ok();
        if ok {
            self.held = bytes;
        }
        ok
    }
}

impl Drop for BufferClaim {
    fn drop(&mut self) {
        self.hold(0);
    }
}

/// Write a frame to any byte stream.
pub fn write_frame(w: &mut impl Write, header: &FrameHeader, payload: &[&[u8]]) -> io::Result<()> {
    let total: usize = payload.iter().map(|p| p.len()).sum();
    if total as u64 != header.payload_len {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "payload length does not match the header"));
    }
    let hdr = header.encode();
    let mut slices: Vec<IoSlice<'_>> = Vec::with_capacity(payload.len() + 1);
    slices.push(IoSlice::new(&hdr));
    slices.extend(payload.iter().filter(|p| !p.is_empty()).map(|p| IoSlice::new(p)));
    write_all_vectored(w, &mut slices)
}

/// A socket writer that never raises SIGPIPE: the guest library lives in applications
/// whose signal handling is theirs, and a peer that went away must be an error, not the end
/// of the program.
struct NoSigPipe<'a>(BorrowedFd<'a>);

impl Write for NoSigPipe<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write_vectored(&[IoSlice::new(buf)])
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        let bufs = &bufs[..bufs.len().min(1024)];
        let mut no_files = rustix::net::SendAncillaryBuffer::default();
        Ok(rustix::net::sendmsg(self.0, bufs, &mut no_files, rustix::net::SendFlags::NOSIGNAL)?)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Where a router listens: `unix:/path/to/socket` (or a bare path), `tcp:HOST:PORT`, or,
/// inside a VM, `vsock:CID:PORT` (the hypervisor's `phos-vmm-device`, CID 2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    Unix(PathBuf),
    Tcp(String),
    Vsock { cid: u32, port: u32 },
}

impl Endpoint {
    pub fn parse(s: &str) -> Result<Endpoint, String> {
        if let Some(p) = s.strip_prefix("unix:") {
            return Ok(Endpoint::Unix(PathBuf::from(p)));
        }
        if let Some(a) = s.strip_prefix("tcp:") {
            // HOST:PORT, the host a name, an IPv4 address or a bracketed IPv6 one.
            return match a.rsplit_once(':') {
                Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => {
                    Ok(Endpoint::Tcp(a.to_string()))
                }
                _ => Err(format!("`{s}`: expected tcp:HOST:PORT")),
            };
        }
        if let Some(a) = s.strip_prefix("vsock:") {
            return match a.split_once(':') {
                Some((cid, port)) => match (cid.parse::<u32>(), port.parse::<u32>()) {
                    (Ok(cid), Ok(port)) => Ok(Endpoint::Vsock { cid, port }),
                    _ => Err(format!("`{s}`: expected vsock:CID:PORT (decimal numbers)")),
                },
                None => Err(format!("`{s}`: expected vsock:CID:PORT")),
            };
        }
        if s.starts_with('/') || s.starts_with('.') {
            return Ok(Endpoint::Unix(PathBuf::from(s)));
        }
        Err(format!("unsupported endpoint `{s}` (expected unix:/path, tcp:HOST:PORT or vsock:CID:PORT)"))
    }

    pub fn connect(&self) -> io::Result<Box<dyn Transport>> {
        match self {
            Endpoint::Unix(p) => Ok(Box::new(UnixTransport::connect(p)?)),
            Endpoint::Tcp(a) => Ok(Box::new(TcpTransport::connect(a)?)),
            Endpoint::Vsock { cid, port } => Ok(Box::new(VsockTransport::connect(*cid, *port)?)),
        }
    }
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Endpoint::Unix(p) => write!(f, "unix:{}", p.display()),
            Endpoint::Tcp(a) => write!(f, "tcp:{a}"),
            Endpoint::Vsock { cid, port } => write!(f, "vsock:{cid}:{port}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::FrameKind;

    #[test]
    fn frames_cross_a_socket_pair() {
        let (a, b) = UnixStream::pair().unwrap();
        let (mut a, mut b) = (UnixTransport::new(a), UnixTransport::new(b));
        let big = vec![0x5au8; 3 << 20];
        let sender = std::thread::spawn(move || {
            for i in 0..50u64 {
                let mut h = FrameHeader::new(FrameKind::Call);
                h.call_id = i;
                h.payload_len = (big.len() as u64) + 3;
                a.send(&h, &[b"abc", &big]).unwrap();
            }
        });
        let mut buf = Vec::new();
        for i in 0..50u64 {
            let h = b.recv(&mut buf).unwrap();
            assert_eq!(h.call_id, i);
            assert_eq!(&buf[..3], b"abc");
            assert_eq!(buf.len(), (3 << 20) + 3);
            assert!(buf[3..].iter().all(|&x| x == 0x5a));
        }
        sender.join().unwrap();
        assert!(matches!(b.recv(&mut buf), Err(TransportError::Closed)));
    }

    #[test]
    fn oversized_and_lying_headers() {
        let (a, b) = UnixStream::pair().unwrap();
        let mut b = UnixTransport::new(b).with_max_payload(1024);
        let mut raw = a;
        let mut h = FrameHeader::new(FrameKind::Call);
        h.payload_len = 4096;
        raw.write_all(&h.encode()).unwrap();
        assert!(matches!(b.recv(&mut Vec::new()), Err(TransportError::TooLarge(4096, 1024))));

        // A header that promises 1000 bytes and then the peer goes away.
        let (a, b) = UnixStream::pair().unwrap();
        let mut b = UnixTransport::new(b);
        let mut raw = a;
        h.payload_len = 1000;
        raw.write_all(&h.encode()).unwrap();
        raw.write_all(&[1, 2, 3]).unwrap();
        drop(raw);
        assert!(matches!(b.recv(&mut Vec::new()), Err(TransportError::Io(_))));
    }

    #[test]
    fn a_lying_header_costs_about_what_was_sent() {
        let (a, b) = UnixStream::pair().unwrap();
        let mut b = UnixTransport::new(b).with_max_payload(8 << 30);
        let mut raw = a;
        let mut h = FrameHeader::new(FrameKind::Call);
        h.payload_len = 4 << 30;
        raw.write_all(&h.encode()).unwrap();
        raw.write_all(&[7u8; 4096]).unwrap();
        drop(raw);
        let mut buf = Vec::new();
        assert!(matches!(b.recv(&mut buf), Err(TransportError::Io(_))));
        assert!(buf.capacity() <= 2 * FIRST_PIECE, "held {} bytes for 4 KiB sent", buf.capacity());
    }

    #[test]
    fn payloads_are_charged_to_a_shared_budget() {
        let budget = BufferBudget::new(8 << 20);
        let frame = |len: usize| {
            let mut h = FrameHeader::new(FrameKind::Call);
            h.payload_len = len as u64;
            let mut v = h.encode().to_vec();
            v.extend(std::iter::repeat_n(1u8, len));
            v
        };
        let (a1, b1) = UnixStream::pair().unwrap();
        let (a2, b2) = UnixStream::pair().unwrap();
        let mut c1 = UnixTransport::new(b1);
        let mut c2 = UnixTransport::new(b2);
        c1.charge_payloads_to(budget.clone());
        c2.charge_payloads_to(budget.clone());
        let (mut w1, mut w2) = (a1, a2);
        let writer1 = std::thread::spawn(move || {
            w1.write_all(&frame(6 << 20)).unwrap();
            w1.write_all(&frame(10)).unwrap();
            w1
        });
        // Refused part-way: the rest of it is never read.
        let writer2 = std::thread::spawn(move || {
            let _ = w2.write_all(&frame(6 << 20));
        });
        let (mut p1, mut p2) = (Vec::new(), Vec::new());
        c1.recv(&mut p1).unwrap();
        assert!(budget.used() >= 5 << 20, "the first channel holds its large frame ({})", budget.used());
        assert!(
            matches!(c2.recv(&mut p2), Err(TransportError::OverBudget(n, 8388608)) if n == 6 << 20),
            "a second large frame does not fit"
        );
        // The first channel's next frame gives its large buffer back (the budget is over half
        // used); the refused channel holds what it grew to until it goes.
        let before = budget.used();
        c1.recv(&mut p1).unwrap();
        assert_eq!(p1.len(), 10);
        assert!(before - budget.used() >= 5 << 20, "{before} -> {}", budget.used());
        let _ = writer1.join().unwrap();
        drop((c1, c2));
        writer2.join().unwrap();
        assert_eq!(budget.used(), 0, "a channel's claim ends with it");
    }

    #[test]
    fn frames_cross_tcp_and_halves_work_from_two_threads() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let echo = std::thread::spawn(move || {
            let mut t = TcpTransport::new(listener.accept().unwrap().0);
            let mut buf = Vec::new();
            while let Ok(h) = t.recv(&mut buf) {
                t.send(&h, &[&buf]).unwrap();
            }
        });
        let t: Box<dyn Transport> = Box::new(TcpTransport::connect(&addr).unwrap());
        assert_eq!(t.kind(), TransportKind::Tcp);
        let (mut rx, mut tx) = t.split().unwrap();
        let sender = std::thread::spawn(move || {
            for i in 0..20u64 {
                let data = vec![i as u8; (i as usize) << 16];
                let mut h = FrameHeader::new(FrameKind::Call);
                h.call_id = i;
                h.payload_len = data.len() as u64;
                tx.send(&h, &[&data]).unwrap();
            }
        });
        let mut buf = Vec::new();
        for i in 0..20u64 {
            let h = rx.recv(&mut buf).unwrap();
            assert_eq!((h.call_id, buf.len()), (i, (i as usize) << 16));
            assert!(buf.iter().all(|&b| b == i as u8));
        }
        sender.join().unwrap();
        // Our last handle closes the connection: the peer sees a clean close.
        drop(rx);
        echo.join().unwrap();
    }

    #[test]
    fn length_mismatch_is_refused_before_sending() {
        let (a, _b) = UnixStream::pair().unwrap();
        let mut a = UnixTransport::new(a);
        let mut h = FrameHeader::new(FrameKind::Call);
        h.payload_len = 10;
        assert!(a.send(&h, &[b"short"]).is_err());
    }

    #[test]
    fn endpoints() {
        assert_eq!(Endpoint::parse("unix:/tmp/x").unwrap(), Endpoint::Unix("/tmp/x".into()));
        assert_eq!(Endpoint::parse("/tmp/y").unwrap(), Endpoint::Unix("/tmp/y".into()));
        assert_eq!(Endpoint::parse("tcp:1.2.3.4:5").unwrap(), Endpoint::Tcp("1.2.3.4:5".into()));
        assert_eq!(Endpoint::parse("tcp:[::1]:7070").unwrap(), Endpoint::Tcp("[::1]:7070".into()));
        assert!(Endpoint::parse("tcp:nohost").is_err());
        assert!(Endpoint::parse("tcp:h:99999").is_err());
        assert_eq!(Endpoint::parse("vsock:3:5").unwrap(), Endpoint::Vsock { cid: 3, port: 5 });
        assert_eq!(Endpoint::parse("vsock:2:7070").unwrap().to_string(), "vsock:2:7070");
        assert!(Endpoint::parse("vsock:2").is_err());
        assert!(Endpoint::parse("vsock:x:5").is_err());
        assert!(Endpoint::parse("vsock:2:-1").is_err());
        assert!(Endpoint::parse("vsock:2:99999999999").is_err());
        assert!(Endpoint::parse("vsok:2:5").is_err());
    }
}
