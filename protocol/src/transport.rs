//! Transports move frames between two peers. Every transport implements [`Transport`]; this
//! version has Unix stream sockets ([`UnixTransport`]). Shared-memory rings, TCP and vsock
//! plug in behind the same trait.

use std::io::{self, IoSlice, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use crate::frame::{FrameHeader, HEADER_LEN, HeaderError};

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
}

/// Frames over a Unix stream socket.
pub struct UnixTransport {
    stream: UnixStream,
    max_payload: u64,
}

impl UnixTransport {
    pub fn new(stream: UnixStream) -> Self {
        UnixTransport { stream, max_payload: crate::DEFAULT_MAX_PAYLOAD }
    }

    pub fn connect(path: &Path) -> io::Result<Self> {
        Ok(Self::new(UnixStream::connect(path)?))
    }

    /// Refuse frames whose payload is larger than this.
    pub fn with_max_payload(mut self, max: u64) -> Self {
        self.max_payload = max;
        self
    }

    pub fn stream(&self) -> &UnixStream {
        &self.stream
    }

    /// A second handle on the same socket (one thread reads while another writes).
    pub fn try_clone(&self) -> io::Result<Self> {
        Ok(UnixTransport { stream: self.stream.try_clone()?, max_payload: self.max_payload })
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
    payload.clear();
    let total = header.payload_len as usize;
    const STEP: usize = 64 << 20;
    while payload.len() < total {
        let want = (total - payload.len()).min(STEP);
        let start = payload.len();
        payload.try_reserve_exact(want).map_err(|_| TransportError::NoMemory(header.payload_len))?;
        payload.resize(start + want, 0);
        if let Err(e) = r.read_exact(&mut payload[start..]) {
            return Err(e.into());
        }
    }
    Ok(header)
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
struct NoSigPipe<'a>(&'a UnixStream);

impl Write for NoSigPipe<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write_vectored(&[IoSlice::new(buf)])
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        use std::os::fd::AsRawFd;
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = bufs.as_ptr() as *mut libc::iovec;
        msg.msg_iovlen = bufs.len().min(1024) as _;
        let n = unsafe { libc::sendmsg(self.0.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
        if n < 0 { Err(io::Error::last_os_error()) } else { Ok(n as usize) }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Transport for UnixTransport {
    fn send(&mut self, header: &FrameHeader, payload: &[&[u8]]) -> io::Result<()> {
        write_frame(&mut NoSigPipe(&self.stream), header, payload)
    }

    fn recv(&mut self, payload: &mut Vec<u8>) -> Result<FrameHeader, TransportError> {
        read_frame(&mut self.stream, payload, self.max_payload)
    }

    fn wait_readable(&mut self, timeout: std::time::Duration) -> bool {
        use std::os::fd::AsRawFd;
        let mut pfd = libc::pollfd { fd: self.stream.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // ppoll: sub-millisecond timeouts.
        let ts = libc::timespec {
            tv_sec: timeout.as_secs().min(i32::MAX as u64) as libc::time_t,
            tv_nsec: timeout.subsec_nanos() as libc::c_long,
        };
        let n = unsafe { libc::ppoll(&mut pfd, 1, &ts, std::ptr::null()) };
        n > 0 && pfd.revents != 0
    }
}

/// Where a router listens: `unix:/path/to/socket` (or a bare path).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    Unix(PathBuf),
}

impl Endpoint {
    pub fn parse(s: &str) -> Result<Endpoint, String> {
        if let Some(p) = s.strip_prefix("unix:") {
            return Ok(Endpoint::Unix(PathBuf::from(p)));
        }
        if s.starts_with('/') || s.starts_with('.') {
            return Ok(Endpoint::Unix(PathBuf::from(s)));
        }
        Err(format!("unsupported endpoint `{s}` (expected unix:/path)"))
    }

    pub fn connect(&self) -> io::Result<Box<dyn Transport>> {
        match self {
            Endpoint::Unix(p) => Ok(Box::new(UnixTransport::connect(p)?)),
        }
    }
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Endpoint::Unix(p) => write!(f, "unix:{}", p.display()),
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
        assert!(Endpoint::parse("tcp:1.2.3.4:5").is_err());
    }
}
