//! The connection state machine of the device, apart from virtqueues: packets from the
//! guest go in through [`Muxer::handle_tx`], packets for the guest come out of
//! [`Muxer::next_rx`], and each accepted connection is a nonblocking Unix stream to the
//! router, watched by the muxer's own epoll (whose fd the device's event loop polls).
//!
//! Flow control is virtio-vsock's credit scheme in both directions: the guest may have at
//! most [`BUF_ALLOC`] bytes in flight towards the router (what we took but have not yet
//! written to the router counts), and we send the guest no more than its advertised
//! `buf_alloc` minus what it has not yet consumed (`tx_cnt - fwd_cnt`).

use std::collections::{HashMap, VecDeque};
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;

use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};

/// The host's CID: the only destination this device serves.
pub const HOST_CID: u64 = 2;
/// `VIRTIO_VSOCK_TYPE_STREAM`.
pub const TYPE_STREAM: u16 = 1;

/// Packet operations (virtio spec, 5.10.6).
pub mod op {
    pub const REQUEST: u16 = 1;
    pub const RESPONSE: u16 = 2;
    pub const RST: u16 = 3;
    pub const SHUTDOWN: u16 = 4;
    pub const RW: u16 = 5;
    pub const CREDIT_UPDATE: u16 = 6;
    pub const CREDIT_REQUEST: u16 = 7;
}

/// `SHUTDOWN` flags: the sender will receive no more, send no more.
pub const SHUTDOWN_RCV: u32 = 1;
pub const SHUTDOWN_SEND: u32 = 2;

/// What each connection may hold of the guest's bytes not yet written to the router.
pub const BUF_ALLOC: u32 = 256 << 10;
/// The most payload one packet carries either way (Linux's `VIRTIO_VSOCK_MAX_PKT_BUF_SIZE`).
pub const MAX_PKT_DATA: u32 = 64 << 10;
/// Control packets waiting for receive buffers beyond which the transmit queue is left
/// alone: a guest that sends without taking its answers cannot make us queue without end.
const MAX_CONTROL_BACKLOG: usize = 1024;

/// The header fields of one packet (the wire layout is `virtio_vsock_hdr`, little-endian).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Header {
    pub src_cid: u64,
    pub dst_cid: u64,
    pub src_port: u32,
    pub dst_port: u32,
    pub len: u32,
    pub type_: u16,
    pub op: u16,
    pub flags: u32,
    pub buf_alloc: u32,
    pub fwd_cnt: u32,
}

/// A packet for the guest that carries no data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Control {
    guest_port: u32,
    host_port: u32,
    op: u16,
    flags: u32,
}

struct Conn {
    stream: UnixStream,
    /// Guest bytes taken from the queue, not yet written to the router.
    to_router: VecDeque<u8>,
    /// Bytes of the guest's written to the router (wrapping, as on the wire).
    fwd_cnt: u32,
    /// The `fwd_cnt` the guest last heard of.
    fwd_cnt_sent: u32,
    /// Bytes sent to the guest.
    tx_cnt: u32,
    peer_buf_alloc: u32,
    peer_fwd_cnt: u32,
    /// The router socket may have bytes (or its end) to read.
    readable: bool,
    /// The router closed its end: the guest has been told (SHUTDOWN) and its RST awaited.
    router_closed: bool,
    /// The guest will receive no more / send no more.
    guest_no_rcv: bool,
    guest_no_send: bool,
    credit_update_queued: bool,
}

impl Conn {
    /// What the guest can take now.
    fn peer_credit(&self) -> u32 {
        let in_flight = self.tx_cnt.wrapping_sub(self.peer_fwd_cnt);
        // A peer whose fwd_cnt runs ahead of what it was sent wraps to a huge in-flight
        // count: no credit.
        self.peer_buf_alloc.saturating_sub(in_flight)
    }

    fn wants_to_send(&self) -> bool {
        self.readable && !self.router_closed && !self.guest_no_rcv && self.peer_credit() > 0
    }
}

/// Why a muxer could not be made.
#[derive(Debug, thiserror::Error)]
pub enum MuxError {
    #[error("cannot create an epoll instance: {0}")]
    Epoll(io::Error),
}

/// The guest's connections to the router.
pub struct Muxer {
    guest_cid: u64,
    port: u32,
    router: PathBuf,
    max_connections: usize,
    conns: HashMap<u32, Conn>,
    control: VecDeque<Control>,
    epoll: Epoll,
    /// Round-robin position among connections with data for the guest.
    rr: usize,
}

impl Muxer {
    pub fn new(guest_cid: u64, port: u32, router: PathBuf, max_connections: usize) -> Result<Self, MuxError> {
        Ok(Muxer {
            guest_cid,
            port,
            router,
            max_connections,
            conns: HashMap::new(),
            control: VecDeque::new(),
            epoll: Epoll::new().map_err(MuxError::Epoll)?,
            rr: 0,
        })
    }

    /// The fd that is readable when a router socket has news ([`Self::poll_sockets`]).
    pub fn epoll_fd(&self) -> RawFd {
        self.epoll.as_raw_fd()
    }

    pub fn connections(&self) -> usize {
        self.conns.len()
    }

    /// The guest's sends wait while this many answers wait for receive buffers.
    pub fn tx_blocked(&self) -> bool {
        self.control.len() >= MAX_CONTROL_BACKLOG
    }

    /// Forget every connection (device reset, VM gone): the router sees each one close.
    pub fn reset(&mut self) {
        if !self.conns.is_empty() {
            tracing::info!(connections = self.conns.len(), "device reset: closing the guest's connections");
        }
        for (_, c) in self.conns.drain() {
            let _ = self.epoll.ctl(ControlOperation::Delete, c.stream.as_raw_fd(), EpollEvent::default());
        }
        self.control.clear();
    }

    fn rst(&mut self, guest_port: u32, host_port: u32) {
        self.control.push_back(Control { guest_port, host_port, op: op::RST, flags: 0 });
    }

    fn remove(&mut self, port: u32) {
        if let Some(c) = self.conns.remove(&port) {
            let _ = self.epoll.ctl(ControlOperation::Delete, c.stream.as_raw_fd(), EpollEvent::default());
        }
        self.control.retain(|c| c.guest_port != port || c.op == op::RST);
    }

    /// End a connection with a reset both ways.
    fn abort(&mut self, port: u32, why: &str) {
        tracing::debug!(guest_port = port, "connection reset: {why}");
        self.remove(port);
        let host_port = self.port;
        self.rst(port, host_port);
    }

    /// A packet from the guest. `data` is its payload (`hdr.len` bytes).
    pub fn handle_tx(&mut self, hdr: &Header, data: &[u8]) {
        if hdr.src_cid != self.guest_cid {
            tracing::warn!(src_cid = hdr.src_cid, "packet from another CID than the guest's: dropped");
            return;
        }
        if hdr.op == op::RST {
            // Never answer a reset; end the connection if it was ours.
            if hdr.dst_cid == HOST_CID && hdr.dst_port == self.port {
                self.remove(hdr.src_port);
            }
            return;
        }
        if hdr.dst_cid != HOST_CID || hdr.dst_port != self.port || hdr.type_ != TYPE_STREAM {
            tracing::debug!(
                dst_cid = hdr.dst_cid,
                dst_port = hdr.dst_port,
                type_ = hdr.type_,
                "no such service: reset"
            );
            self.rst(hdr.src_port, hdr.dst_port);
            return;
        }
        let port = hdr.src_port;
        if hdr.op == op::REQUEST {
            self.connect(hdr);
            return;
        }
        let Some(c) = self.conns.get_mut(&port) else {
            tracing::debug!(guest_port = port, op = hdr.op, "packet for no connection: reset");
            let host_port = self.port;
            self.rst(port, host_port);
            return;
        };
        c.peer_buf_alloc = hdr.buf_alloc;
        c.peer_fwd_cnt = hdr.fwd_cnt;
        match hdr.op {
            op::RW => {
                if c.guest_no_send {
                    return self.abort(port, "data after the guest's shutdown");
                }
                if c.to_router.len() + data.len() > BUF_ALLOC as usize {
                    tracing::warn!(guest_port = port, "the guest sent past its credit");
                    return self.abort(port, "credit exceeded");
                }
                c.to_router.extend(data);
                self.flush(port);
            }
            op::CREDIT_UPDATE => {}
            op::CREDIT_REQUEST => self.queue_credit_update(port),
            op::SHUTDOWN => {
                if hdr.flags & SHUTDOWN_RCV != 0 {
                    c.guest_no_rcv = true;
                }
                if hdr.flags & SHUTDOWN_SEND != 0 {
                    c.guest_no_send = true;
                }
                self.flush(port);
            }
            other => {
                // RESPONSE (we never connect to the guest) or an unknown operation.
                tracing::warn!(guest_port = port, op = other, "unexpected operation: reset");
                self.abort(port, "unexpected operation");
            }
        }
    }

    fn connect(&mut self, hdr: &Header) {
        let port = hdr.src_port;
        if self.conns.contains_key(&port) {
            // The guest forgot it (a reboot): the old one is stale.
            tracing::debug!(guest_port = port, "a new connection replaces a stale one");
            self.remove(port);
        }
        if self.conns.len() >= self.max_connections {
            tracing::warn!(guest_port = port, max = self.max_connections, "too many connections: reset");
            let host_port = self.port;
            return self.rst(port, host_port);
        }
        let stream = match connect_nonblocking(&self.router) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(router = %self.router.display(), "cannot reach the router: {e}");
                let host_port = self.port;
                return self.rst(port, host_port);
            }
        };
        let events = EventSet::IN | EventSet::OUT | EventSet::READ_HANG_UP | EventSet::EDGE_TRIGGERED;
        if let Err(e) = self.epoll.ctl(ControlOperation::Add, stream.as_raw_fd(), EpollEvent::new(events, port as u64))
        {
            tracing::warn!("cannot watch a router socket: {e}");
            let host_port = self.port;
            return self.rst(port, host_port);
        }
        tracing::debug!(guest_port = port, "guest connected");
        self.conns.insert(
            port,
            Conn {
                stream,
                to_router: VecDeque::new(),
                fwd_cnt: 0,
                fwd_cnt_sent: 0,
                tx_cnt: 0,
                peer_buf_alloc: hdr.buf_alloc,
                peer_fwd_cnt: hdr.fwd_cnt,
                readable: true,
                router_closed: false,
                guest_no_rcv: false,
                guest_no_send: false,
                credit_update_queued: false,
            },
        );
        self.control.push_back(Control { guest_port: port, host_port: self.port, op: op::RESPONSE, flags: 0 });
    }

    fn queue_credit_update(&mut self, port: u32) {
        if let Some(c) = self.conns.get_mut(&port)
            && !c.credit_update_queued
        {
            c.credit_update_queued = true;
            self.control.push_back(Control { guest_port: port, host_port: self.port, op: op::CREDIT_UPDATE, flags: 0 });
        }
    }

    /// Write what the guest sent to the router, as far as the router takes it.
    fn flush(&mut self, port: u32) {
        let Some(c) = self.conns.get_mut(&port) else { return };
        while !c.to_router.is_empty() {
            let (a, _) = c.to_router.as_slices();
            match (&c.stream).write(a) {
                Ok(0) => return self.abort(port, "the router stopped reading"),
                Ok(n) => {
                    c.to_router.drain(..n);
                    c.fwd_cnt = c.fwd_cnt.wrapping_add(n as u32);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => {
                    tracing::debug!(guest_port = port, "writing to the router: {e}");
                    return self.abort(port, "the router went away");
                }
            }
        }
        let flushed = c.to_router.is_empty();
        if flushed && c.guest_no_send && c.guest_no_rcv {
            // The guest closed: done once its bytes are with the router.
            tracing::debug!(guest_port = port, "guest closed the connection");
            return self.abort(port, "closed by the guest");
        }
        if flushed && c.guest_no_send {
            let _ = c.stream.shutdown(std::net::Shutdown::Write);
        }
        // Tell the guest about freed space before it could stall on it.
        if c.fwd_cnt.wrapping_sub(c.fwd_cnt_sent) >= BUF_ALLOC / 4 {
            self.queue_credit_update(port);
        }
    }

    /// Take the router sockets' news (call when [`Self::epoll_fd`] is readable).
    pub fn poll_sockets(&mut self) {
        let mut events = [EpollEvent::default(); 64];
        loop {
            let n = match self.epoll.wait(0, &mut events) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    tracing::warn!("epoll: {e}");
                    return;
                }
            };
            for ev in &events[..n] {
                let port = ev.data() as u32;
                let set = EventSet::from_bits_truncate(ev.events);
                if let Some(c) = self.conns.get_mut(&port) {
                    if set.intersects(EventSet::IN | EventSet::READ_HANG_UP | EventSet::HANG_UP | EventSet::ERROR) {
                        c.readable = true;
                    }
                    if set.intersects(EventSet::OUT | EventSet::HANG_UP | EventSet::ERROR) {
                        self.flush(port);
                    }
                }
            }
            if n < events.len() {
                return;
            }
        }
    }

    /// Whether [`Self::next_rx`] may have a packet.
    pub fn has_rx(&self) -> bool {
        !self.control.is_empty() || self.conns.values().any(Conn::wants_to_send)
    }

    fn header(&self, guest_port: u32, host_port: u32, op: u16, flags: u32, len: u32) -> Header {
        let (buf_alloc, fwd_cnt) = match self.conns.get(&guest_port) {
            Some(c) if host_port == self.port => (BUF_ALLOC, c.fwd_cnt),
            _ => (0, 0),
        };
        Header {
            src_cid: HOST_CID,
            dst_cid: self.guest_cid,
            src_port: host_port,
            dst_port: guest_port,
            len,
            type_: TYPE_STREAM,
            op,
            flags,
            buf_alloc,
            fwd_cnt,
        }
    }

    /// The next packet for the guest, its payload in `data`, at most `room` bytes of it (the
    /// receive buffer's size). `None`: nothing to send now.
    pub fn next_rx(&mut self, room: usize, data: &mut Vec<u8>) -> Option<Header> {
        data.clear();
        if let Some(ctl) = self.control.pop_front() {
            let hdr = self.header(ctl.guest_port, ctl.host_port, ctl.op, ctl.flags, 0);
            if let Some(c) = self.conns.get_mut(&ctl.guest_port)
                && ctl.host_port == self.port
            {
                c.fwd_cnt_sent = c.fwd_cnt;
                if ctl.op == op::CREDIT_UPDATE {
                    c.credit_update_queued = false;
                }
            }
            return Some(hdr);
        }
        let room = room.min(MAX_PKT_DATA as usize);
        if room == 0 {
            return None;
        }
        let mut ports: Vec<u32> = self.conns.iter().filter(|(_, c)| c.wants_to_send()).map(|(p, _)| *p).collect();
        ports.sort_unstable();
        let start = self.rr;
        for i in 0..ports.len() {
            let port = ports[(start + i) % ports.len()];
            let Some(c) = self.conns.get_mut(&port) else { continue };
            let want = room.min(c.peer_credit() as usize);
            data.resize(want, 0);
            match (&c.stream).read(&mut data[..]) {
                Ok(0) => {
                    // The router ended the channel: tell the guest, await its reset.
                    data.clear();
                    c.router_closed = true;
                    c.readable = false;
                    tracing::debug!(guest_port = port, "router closed the connection");
                    return Some(self.header(port, self.port, op::SHUTDOWN, SHUTDOWN_RCV | SHUTDOWN_SEND, 0));
                }
                Ok(n) => {
                    data.truncate(n);
                    c.tx_cnt = c.tx_cnt.wrapping_add(n as u32);
                    c.fwd_cnt_sent = c.fwd_cnt;
                    self.rr = (start + i + 1) % ports.len().max(1);
                    return Some(self.header(port, self.port, op::RW, 0, n as u32));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::Interrupted => {
                    c.readable = e.kind() == io::ErrorKind::Interrupted;
                    data.clear();
                }
                Err(e) => {
                    data.clear();
                    tracing::debug!(guest_port = port, "reading from the router: {e}");
                    self.remove(port);
                    return Some(self.header(port, self.port, op::RST, 0, 0));
                }
            }
        }
        None
    }
}

/// Connect to a Unix socket without waiting: a router whose backlog is full answers
/// `EAGAIN` (the guest gets a reset) instead of stopping the device for every guest.
fn connect_nonblocking(path: &std::path::Path) -> io::Result<UnixStream> {
    use std::os::fd::FromRawFd;
    use std::os::unix::ffi::OsStrExt;
    let bytes = path.as_os_str().as_bytes();
    // SAFETY: all zeros is a valid sockaddr_un (an empty path).
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    if bytes.len() >= addr.sun_path.len() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "socket path too long"));
    }
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (d, s) in addr.sun_path.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    // SAFETY: a plain system call that touches no memory of ours.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // Owned at once: closed on every error path.
    // SAFETY: the socket just made, owned by nothing else.
    let stream = unsafe { UnixStream::from_raw_fd(fd) };
    let len = (std::mem::size_of::<libc::sa_family_t>() + bytes.len() + 1) as libc::socklen_t;
    // SAFETY: connect reads `len` bytes of `addr` (the family, the path and its terminating
    // zero, which the length check above left room for).
    if unsafe { libc::connect(fd, &addr as *const libc::sockaddr_un as *const libc::sockaddr, len) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(stream)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hdr(src_port: u32, op: u16, len: u32) -> Header {
        Header {
            src_cid: 3,
            dst_cid: HOST_CID,
            src_port,
            dst_port: 7070,
            len,
            type_: TYPE_STREAM,
            op,
            flags: 0,
            buf_alloc: 64 << 10,
            fwd_cnt: 0,
        }
    }

    fn router() -> (tempfile::TempDir, std::os::unix::net::UnixListener, Muxer) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("router.sock");
        let l = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let m = Muxer::new(3, 7070, path, 4).unwrap();
        (dir, l, m)
    }

    fn drain(m: &mut Muxer) -> Vec<(Header, Vec<u8>)> {
        let mut out = Vec::new();
        let mut data = Vec::new();
        m.poll_sockets();
        while let Some(h) = m.next_rx(4096, &mut data) {
            out.push((h, data.clone()));
        }
        out
    }

    #[test]
    fn connect_exchange_and_close() {
        let (_d, l, mut m) = router();
        m.handle_tx(&hdr(1000, op::REQUEST, 0), &[]);
        let (mut r, _) = l.accept().unwrap();
        let out = drain(&mut m);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].0.op, op::RESPONSE);
        assert_eq!((out[0].0.dst_port, out[0].0.src_port, out[0].0.dst_cid), (1000, 7070, 3));
        assert_eq!(out[0].0.buf_alloc, BUF_ALLOC);

        m.handle_tx(&hdr(1000, op::RW, 5), b"hello");
        let mut buf = [0u8; 5];
        r.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"hello");

        r.write_all(b"world!").unwrap();
        let out = drain(&mut m);
        assert_eq!(out.len(), 1);
        assert_eq!((out[0].0.op, out[0].0.len, out[0].0.fwd_cnt), (op::RW, 6, 5));
        assert_eq!(out[0].1, b"world!");

        // The router closes: SHUTDOWN to the guest, whose RST ends it.
        drop(r);
        let out = drain(&mut m);
        assert_eq!(out.len(), 1);
        assert_eq!((out[0].0.op, out[0].0.flags), (op::SHUTDOWN, SHUTDOWN_RCV | SHUTDOWN_SEND));
        m.handle_tx(&hdr(1000, op::RST, 0), &[]);
        assert_eq!(m.connections(), 0);
        assert!(drain(&mut m).is_empty());
    }

    #[test]
    fn guest_shutdown_closes_the_router_side() {
        let (_d, l, mut m) = router();
        m.handle_tx(&hdr(5, op::REQUEST, 0), &[]);
        let (mut r, _) = l.accept().unwrap();
        drain(&mut m);
        m.handle_tx(&hdr(5, op::RW, 3), b"abc");
        let mut h = hdr(5, op::SHUTDOWN, 0);
        h.flags = SHUTDOWN_RCV | SHUTDOWN_SEND;
        m.handle_tx(&h, &[]);
        let out = drain(&mut m);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].0.op, op::RST);
        assert_eq!(m.connections(), 0);
        let mut got = Vec::new();
        r.read_to_end(&mut got).unwrap();
        assert_eq!(got, b"abc");
    }

    #[test]
    fn other_ports_cids_and_strays_get_rst() {
        let (_d, _l, mut m) = router();
        let mut h = hdr(9, op::REQUEST, 0);
        h.dst_port = 22;
        m.handle_tx(&h, &[]);
        h = hdr(9, op::RW, 1);
        m.handle_tx(&h, b"x");
        h = hdr(9, op::REQUEST, 0);
        h.dst_cid = 7;
        m.handle_tx(&h, &[]);
        h = hdr(9, op::REQUEST, 0);
        h.type_ = 2;
        m.handle_tx(&h, &[]);
        // Resets and packets from elsewhere get no answer.
        m.handle_tx(&hdr(9, op::RST, 0), &[]);
        h = hdr(9, op::REQUEST, 0);
        h.src_cid = 4;
        m.handle_tx(&h, &[]);
        let out = drain(&mut m);
        assert_eq!(out.len(), 4);
        assert!(out.iter().all(|(h, _)| h.op == op::RST && h.dst_port == 9));
        assert_eq!(out[0].0.src_port, 22);
        assert_eq!(m.connections(), 0);
    }

    #[test]
    fn credit_is_respected_both_ways() {
        let (_d, l, mut m) = router();
        let mut h = hdr(1, op::REQUEST, 0);
        h.buf_alloc = 10;
        m.handle_tx(&h, &[]);
        let (mut r, _) = l.accept().unwrap();
        drain(&mut m);
        r.write_all(&[7u8; 25]).unwrap();
        let out = drain(&mut m);
        // 10 bytes of credit: one packet, then nothing until the guest consumes.
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].1.len(), 10);
        let mut up = hdr(1, op::CREDIT_UPDATE, 0);
        up.buf_alloc = 10;
        up.fwd_cnt = 10;
        m.handle_tx(&up, &[]);
        let out = drain(&mut m);
        assert_eq!(out.iter().map(|o| o.1.len()).sum::<usize>(), 10);
        // A lying fwd_cnt (ahead of what was sent) gives no credit.
        up.fwd_cnt = 1000;
        m.handle_tx(&up, &[]);
        assert!(drain(&mut m).is_empty());

        // The guest sending past our buf_alloc is reset.
        let big = vec![0u8; BUF_ALLOC as usize + 1];
        m.handle_tx(&hdr(1, op::RW, big.len() as u32), &big);
        let out = drain(&mut m);
        assert_eq!(out.last().unwrap().0.op, op::RST);
        assert_eq!(m.connections(), 0);
    }

    #[test]
    fn credit_request_and_limits() {
        let (_d, l, mut m) = router();
        for p in 0..6 {
            m.handle_tx(&hdr(p, op::REQUEST, 0), &[]);
        }
        let _conns: Vec<_> = (0..4).map(|_| l.accept().unwrap()).collect();
        let out = drain(&mut m);
        let ops: Vec<u16> = out.iter().map(|o| o.0.op).collect();
        assert_eq!(ops, [op::RESPONSE, op::RESPONSE, op::RESPONSE, op::RESPONSE, op::RST, op::RST]);
        m.handle_tx(&hdr(2, op::CREDIT_REQUEST, 0), &[]);
        m.handle_tx(&hdr(2, op::CREDIT_REQUEST, 0), &[]);
        let out = drain(&mut m);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].0.op, op::CREDIT_UPDATE);
        // An unknown operation resets the connection.
        m.handle_tx(&hdr(2, 99, 0), &[]);
        m.handle_tx(&hdr(3, op::RESPONSE, 0), &[]);
        let out = drain(&mut m);
        assert_eq!(out.len(), 2);
        assert!(out.iter().all(|o| o.0.op == op::RST));
        assert_eq!(m.connections(), 2);
        m.reset();
        assert_eq!(m.connections(), 0);
    }

    #[test]
    fn a_slow_router_holds_the_guest_to_its_credit() {
        let (_d, l, mut m) = router();
        m.handle_tx(&hdr(1, op::REQUEST, 0), &[]);
        let (mut r, _) = l.accept().unwrap();
        drain(&mut m);
        // The router reads nothing: what its socket does not take waits in the device, within
        // the credit it gave.
        let chunk = vec![1u8; 64 << 10];
        let mut sent = 0;
        while sent + chunk.len() <= BUF_ALLOC as usize {
            m.handle_tx(&hdr(1, op::RW, chunk.len() as u32), &chunk);
            sent += chunk.len();
        }
        assert_eq!(m.connections(), 1);
        let reader = std::thread::spawn(move || {
            let mut buf = vec![0u8; sent];
            r.read_exact(&mut buf).unwrap();
            assert!(buf.iter().all(|&b| b == 1));
            r
        });
        // The router reads: the rest goes out as its socket becomes writable.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !m.conns[&1].to_router.is_empty() {
            assert!(std::time::Instant::now() < deadline, "the device never flushed");
            m.poll_sockets();
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let _r = reader.join().unwrap();
        let out = drain(&mut m);
        assert!(out.iter().any(|(h, _)| h.op == op::CREDIT_UPDATE && h.fwd_cnt == sent as u32), "{out:?}");
    }

    #[test]
    fn a_new_request_replaces_a_stale_connection() {
        let (_d, l, mut m) = router();
        m.handle_tx(&hdr(8, op::REQUEST, 0), &[]);
        let (mut old, _) = l.accept().unwrap();
        drain(&mut m);
        // The guest rebooted and reuses the port.
        m.handle_tx(&hdr(8, op::REQUEST, 0), &[]);
        let (_new, _) = l.accept().unwrap();
        assert_eq!(m.connections(), 1);
        let mut rest = Vec::new();
        old.read_to_end(&mut rest).unwrap();
        assert!(rest.is_empty());
        assert_eq!(drain(&mut m).iter().map(|o| o.0.op).collect::<Vec<_>>(), [op::RESPONSE]);
    }

    #[test]
    fn router_missing_is_rst() {
        let mut m = Muxer::new(3, 7070, "/nonexistent/phos.sock".into(), 4).unwrap();
        m.handle_tx(&hdr(1, op::REQUEST, 0), &[]);
        let out = drain(&mut m);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].0.op, op::RST);
    }
}
