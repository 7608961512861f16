//! The virtio side: the vhost-user backend whose queues QEMU hands us, and the two loops
//! that move packets between the queues and the [`Muxer`]. Guest memory is touched only
//! through `vm-memory`; a chain that does not parse is returned to the guest unused (length
//! 0) and logged, never trusted.

use std::sync::Arc;

use parking_lot::Mutex;
use vhost::vhost_user::message::{VhostUserProtocolFeatures, VhostUserVirtioFeatures};
use vhost_user_backend::{VhostUserBackend, VringRwLock, VringT};
use virtio_bindings::virtio_config::{VIRTIO_F_NOTIFY_ON_EMPTY, VIRTIO_F_VERSION_1};
use virtio_bindings::virtio_ring::VIRTIO_RING_F_INDIRECT_DESC;
use virtio_queue::{Queue, QueueOwnedT, QueueT};
use virtio_vsock::packet::{PKT_HEADER_SIZE, VsockPacket};
use vm_memory::{Bytes, GuestAddressSpace, GuestMemory, GuestMemoryAtomic, GuestMemoryMmap};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::event::{EventConsumer, EventFlag, EventNotifier, new_event_consumer_and_notifier};

use crate::muxer::{Header, MAX_PKT_DATA, Muxer};

pub const RX_QUEUE: u16 = 0;
pub const TX_QUEUE: u16 = 1;
pub const EVENT_QUEUE: u16 = 2;
const NUM_QUEUES: usize = 3;
const QUEUE_SIZE: usize = 1024;
/// The epoll token of the muxer's router sockets (above the queues and the exit event).
pub const SOCKETS_EVENT: u16 = NUM_QUEUES as u16 + 1;

type Mem = GuestMemoryAtomic<GuestMemoryMmap>;

/// Take every packet the guest queued for sending. Returns whether any chain was used.
pub fn process_tx<M: GuestMemory>(queue: &mut Queue, mem: &M, muxer: &mut Muxer) -> bool {
    let mut used = false;
    let mut data = Vec::new();
    while !muxer.tx_blocked() {
        let Some(mut chain) = queue.pop_descriptor_chain(mem) else { break };
        let head = chain.head_index();
        match VsockPacket::from_tx_virtq_chain(mem, &mut chain, MAX_PKT_DATA) {
            Ok(pkt) => {
                let hdr = Header {
                    src_cid: pkt.src_cid(),
                    dst_cid: pkt.dst_cid(),
                    src_port: pkt.src_port(),
                    dst_port: pkt.dst_port(),
                    len: pkt.len(),
                    type_: pkt.type_(),
                    op: pkt.op(),
                    flags: pkt.flags(),
                    buf_alloc: pkt.buf_alloc(),
                    fwd_cnt: pkt.fwd_cnt(),
                };
                data.clear();
                if let Some(slice) = pkt.data_slice() {
                    data.resize(slice.len(), 0);
                    if let Err(e) = slice.read_slice(&mut data, 0) {
                        tracing::warn!("unreadable packet data: {e}");
                        data.clear();
                    }
                }
                if data.len() == hdr.len as usize {
                    muxer.handle_tx(&hdr, &data);
                } else {
                    tracing::warn!(len = hdr.len, "packet whose data is not where its header says: dropped");
                }
            }
            Err(e) => tracing::warn!("bad transmit descriptor chain: {e}"),
        }
        if let Err(e) = queue.add_used(mem, head, 0) {
            tracing::warn!("transmit queue: {e}");
            break;
        }
        used = true;
    }
    used
}

/// Fill the guest's receive buffers with what the muxer has for it. Returns whether any
/// chain was used.
pub fn process_rx<M: GuestMemory>(queue: &mut Queue, mem: &M, muxer: &mut Muxer) -> bool {
    let mut used = false;
    let mut data = Vec::new();
    while muxer.has_rx() {
        let Some(mut chain) = queue.pop_descriptor_chain(mem) else { break };
        let head = chain.head_index();
        let len = match VsockPacket::from_rx_virtq_chain(mem, &mut chain, MAX_PKT_DATA) {
            Ok(mut pkt) => {
                let room = pkt.data_slice().map_or(0, |s| s.len());
                match muxer.next_rx(room, &mut data) {
                    Some(h) => {
                        pkt.set_src_cid(h.src_cid)
                            .set_dst_cid(h.dst_cid)
                            .set_src_port(h.src_port)
                            .set_dst_port(h.dst_port)
                            .set_type(h.type_)
                            .set_op(h.op)
                            .set_flags(h.flags)
                            .set_buf_alloc(h.buf_alloc)
                            .set_fwd_cnt(h.fwd_cnt)
                            .set_len(h.len);
                        if let Some(slice) = pkt.data_slice()
                            && !data.is_empty()
                            && let Err(e) = slice.write_slice(&data, 0)
                        {
                            // `room` bounded the data: this cannot happen with a sound
                            // chain; the bytes are lost and so is the connection's order.
                            tracing::error!("cannot write packet data: {e}");
                        }
                        (PKT_HEADER_SIZE + data.len()) as u32
                    }
                    None => {
                        // Nothing after all (the router had no bytes yet): keep the buffer.
                        queue.go_to_previous_position();
                        break;
                    }
                }
            }
            Err(e) => {
                tracing::warn!("bad receive descriptor chain: {e}");
                0
            }
        };
        if let Err(e) = queue.add_used(mem, head, len) {
            tracing::warn!("receive queue: {e}");
            break;
        }
        used = true;
    }
    used
}

/// The vhost-user vsock device of one VM.
pub struct VsockDevice {
    guest_cid: u64,
    muxer: Mutex<Muxer>,
    mem: Mutex<Option<Mem>>,
    /// Ends the worker thread when the VM goes away (without it the daemon's worker waits
    /// forever and the process with it).
    exit: (EventConsumer, EventNotifier),
}

impl VsockDevice {
    pub fn new(guest_cid: u64, muxer: Muxer) -> std::io::Result<Arc<Self>> {
        let exit = new_event_consumer_and_notifier(EventFlag::NONBLOCK | EventFlag::CLOEXEC)?;
        Ok(Arc::new(VsockDevice { guest_cid, muxer: Mutex::new(muxer), mem: Mutex::new(None), exit }))
    }

    pub fn sockets_fd(&self) -> std::os::fd::RawFd {
        self.muxer.lock().epoll_fd()
    }

    fn run_queues(&self, vrings: &[VringRwLock]) -> std::io::Result<()> {
        let Some(mem) = self.mem.lock().clone() else { return Ok(()) };
        let mem = mem.memory();
        let mut muxer = self.muxer.lock();
        let (rx, tx) = (&vrings[RX_QUEUE as usize], &vrings[TX_QUEUE as usize]);
        let (mut rx_used, mut tx_used) = (false, false);
        // Answers free room for more sends, sends make answers: until neither moves.
        loop {
            // One lock of each ring at a time (a read guard alive under a write would hang).
            let t = {
                let mut ring = tx.get_mut();
                let q = ring.get_queue_mut();
                q.ready() && process_tx(q, &*mem, &mut muxer)
            };
            let r = {
                let mut ring = rx.get_mut();
                let q = ring.get_queue_mut();
                q.ready() && process_rx(q, &*mem, &mut muxer)
            };
            tx_used |= t;
            rx_used |= r;
            if !t && !r {
                break;
            }
        }
        if tx_used {
            tx.signal_used_queue()?;
        }
        if rx_used {
            rx.signal_used_queue()?;
        }
        Ok(())
    }
}

impl VhostUserBackend for VsockDevice {
    type Bitmap = ();
    type Vring = VringRwLock;

    fn num_queues(&self) -> usize {
        NUM_QUEUES
    }

    fn max_queue_size(&self) -> usize {
        QUEUE_SIZE
    }

    fn features(&self) -> u64 {
        (1 << VIRTIO_F_VERSION_1)
            | (1 << VIRTIO_F_NOTIFY_ON_EMPTY)
            | (1 << VIRTIO_RING_F_INDIRECT_DESC)
            | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits()
    }

    fn protocol_features(&self) -> VhostUserProtocolFeatures {
        VhostUserProtocolFeatures::CONFIG
    }

    fn set_event_idx(&self, _enabled: bool) {}

    fn exit_event(&self, _thread_index: usize) -> Option<(EventConsumer, EventNotifier)> {
        Some((self.exit.0.try_clone().ok()?, self.exit.1.try_clone().ok()?))
    }

    /// `struct virtio_vsock_config { le64 guest_cid; }`: QEMU reads the CID from here.
    fn get_config(&self, offset: u32, size: u32) -> Vec<u8> {
        let config = self.guest_cid.to_le_bytes();
        (offset as usize..(offset as usize).saturating_add(size as usize))
            .map(|i| config.get(i).copied().unwrap_or(0))
            .take(4096)
            .collect()
    }

    fn update_memory(&self, mem: Mem) -> std::io::Result<()> {
        *self.mem.lock() = Some(mem);
        Ok(())
    }

    fn reset_device(&self) {
        self.muxer.lock().reset();
    }

    fn stop_vring(&self, queue_index: u32) -> std::io::Result<()> {
        // The VM is stopping or resetting its device: its connections are gone with it.
        if queue_index == RX_QUEUE as u32 {
            self.muxer.lock().reset();
        }
        Ok(())
    }

    fn handle_event(
        &self,
        device_event: u16,
        evset: EventSet,
        vrings: &[VringRwLock],
        _thread: usize,
    ) -> std::io::Result<()> {
        if evset != EventSet::IN {
            tracing::debug!(device_event, ?evset, "unexpected event set");
        }
        match device_event {
            RX_QUEUE | TX_QUEUE => self.run_queues(vrings),
            // We post no events (no transport reset: we never migrate); the guest's event
            // buffers stay with us unused, as the spec allows.
            EVENT_QUEUE => Ok(()),
            SOCKETS_EVENT => {
                self.muxer.lock().poll_sockets();
                self.run_queues(vrings)
            }
            other => {
                tracing::warn!(device_event = other, "event for nothing we know");
                Ok(())
            }
        }
    }
}

impl VsockDevice {
    /// Close every connection (the VM went away).
    pub fn reset_all(self: Arc<Self>) {
        self.muxer.lock().reset();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::muxer::{HOST_CID, TYPE_STREAM, op};
    use std::io::{Read, Write};
    use virtio_bindings::virtio_ring::{VRING_DESC_F_INDIRECT, VRING_DESC_F_NEXT, VRING_DESC_F_WRITE};
    use virtio_queue::desc::RawDescriptor;
    use virtio_queue::desc::split::Descriptor;
    use virtio_queue::mock::MockSplitQueue;
    use vm_memory::{Address, GuestAddress, GuestMemoryMmap};

    const MEM_SIZE: u64 = 0x100_0000;

    fn header_bytes(h: &Header) -> Vec<u8> {
        let mut b = Vec::with_capacity(PKT_HEADER_SIZE);
        b.extend(h.src_cid.to_le_bytes());
        b.extend(h.dst_cid.to_le_bytes());
        b.extend(h.src_port.to_le_bytes());
        b.extend(h.dst_port.to_le_bytes());
        b.extend(h.len.to_le_bytes());
        b.extend(h.type_.to_le_bytes());
        b.extend(h.op.to_le_bytes());
        b.extend(h.flags.to_le_bytes());
        b.extend(h.buf_alloc.to_le_bytes());
        b.extend(h.fwd_cnt.to_le_bytes());
        b
    }

    fn parse(b: &[u8]) -> Header {
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap());
        Header {
            src_cid: u64::from_le_bytes(b[0..8].try_into().unwrap()),
            dst_cid: u64::from_le_bytes(b[8..16].try_into().unwrap()),
            src_port: u32_at(16),
            dst_port: u32_at(20),
            len: u32_at(24),
            type_: u16::from_le_bytes(b[28..30].try_into().unwrap()),
            op: u16::from_le_bytes(b[30..32].try_into().unwrap()),
            flags: u32_at(32),
            buf_alloc: u32_at(36),
            fwd_cnt: u32_at(40),
        }
    }

    fn guest_hdr(port: u32, op: u16, len: u32) -> Header {
        Header {
            src_cid: 3,
            dst_cid: HOST_CID,
            src_port: port,
            dst_port: 7070,
            len,
            type_: TYPE_STREAM,
            op,
            flags: 0,
            buf_alloc: 1 << 20,
            fwd_cnt: 0,
        }
    }

    fn desc(addr: u64, len: u32, flags: u32) -> RawDescriptor {
        RawDescriptor::from(Descriptor::new(addr, len, flags as u16, 0))
    }

    /// Used ring entries (id, len) from `from` on.
    fn used(mem: &GuestMemoryMmap, vq: &MockSplitQueue<GuestMemoryMmap>, from: u16) -> Vec<(u32, u32)> {
        let base = vq.used_addr();
        let idx: u16 = mem.read_obj(base.unchecked_add(2)).unwrap();
        (from..idx)
            .map(|i| {
                let at = base.unchecked_add(4 + 8 * (i as u64 % 16));
                (mem.read_obj(at).unwrap(), mem.read_obj(at.unchecked_add(4)).unwrap())
            })
            .collect()
    }

    fn setup() -> (GuestMemoryMmap, tempfile::TempDir, std::os::unix::net::UnixListener, Muxer) {
        let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), MEM_SIZE as usize)]).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.sock");
        let l = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let m = Muxer::new(3, 7070, path, 8).unwrap();
        (mem, dir, l, m)
    }

    #[test]
    fn packets_cross_the_queues() {
        let (mem, _d, l, mut m) = setup();
        let txq = MockSplitQueue::create(&mem, GuestAddress(0), 16);
        let rxq = MockSplitQueue::create(&mem, GuestAddress(0x10000), 16);
        let mut tx: Queue = txq.create_queue().unwrap();
        let mut rx: Queue = rxq.create_queue().unwrap();

        // REQUEST (header only), then RW with its data in a second descriptor, then RW with
        // header and data in one descriptor (Linux 6.2 and later).
        mem.write_slice(&header_bytes(&guest_hdr(900, op::REQUEST, 0)), GuestAddress(0x10_0000)).unwrap();
        mem.write_slice(&header_bytes(&guest_hdr(900, op::RW, 4)), GuestAddress(0x10_1000)).unwrap();
        mem.write_slice(b"ping", GuestAddress(0x10_2000)).unwrap();
        mem.write_slice(&header_bytes(&guest_hdr(900, op::RW, 3)), GuestAddress(0x10_3000)).unwrap();
        mem.write_slice(b"!!!", GuestAddress(0x10_3000 + PKT_HEADER_SIZE as u64)).unwrap();
        txq.add_desc_chains(
            &[
                desc(0x10_0000, PKT_HEADER_SIZE as u32, 0),
                RawDescriptor::from(Descriptor::new(0x10_1000, PKT_HEADER_SIZE as u32, VRING_DESC_F_NEXT as u16, 2)),
                desc(0x10_2000, 4, 0),
                desc(0x10_3000, PKT_HEADER_SIZE as u32 + 3, 0),
            ],
            0,
        )
        .unwrap();
        assert!(process_tx(&mut tx, &mem, &mut m));
        assert_eq!(used(&mem, &txq, 0).len(), 3);
        let (mut r, _) = l.accept().unwrap();
        let mut got = [0u8; 7];
        r.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"ping!!!");

        // Receive buffers: the RESPONSE, then the router's bytes.
        r.write_all(b"pong").unwrap();
        let mut chains = Vec::new();
        for i in 0..3u64 {
            chains.push(RawDescriptor::from(Descriptor::new(
                0x20_0000 + i * 0x2000,
                PKT_HEADER_SIZE as u32,
                (VRING_DESC_F_WRITE | VRING_DESC_F_NEXT) as u16,
                (2 * i + 1) as u16,
            )));
            chains.push(desc(0x20_1000 + i * 0x2000, 4096, VRING_DESC_F_WRITE));
        }
        rxq.add_desc_chains(&chains, 0).unwrap();
        m.poll_sockets();
        assert!(process_rx(&mut rx, &mem, &mut m));
        let u = used(&mem, &rxq, 0);
        assert_eq!(u.len(), 2, "{u:?}");
        let mut hb = [0u8; PKT_HEADER_SIZE];
        mem.read_slice(&mut hb, GuestAddress(0x20_0000)).unwrap();
        let h = parse(&hb);
        assert_eq!((h.op, h.src_cid, h.dst_cid, h.src_port, h.dst_port), (op::RESPONSE, 2, 3, 7070, 900));
        mem.read_slice(&mut hb, GuestAddress(0x20_2000)).unwrap();
        let h = parse(&hb);
        assert_eq!((h.op, h.len, h.fwd_cnt), (op::RW, 4, 7));
        assert_eq!(u[1].1, PKT_HEADER_SIZE as u32 + 4);
        let mut data = [0u8; 4];
        mem.read_slice(&mut data, GuestAddress(0x20_3000)).unwrap();
        assert_eq!(&data, b"pong");
        // Nothing more: the third buffer stays the guest's.
        assert!(!process_rx(&mut rx, &mem, &mut m));
        assert_eq!(used(&mem, &rxq, 0).len(), 2);
    }

    #[test]
    fn bad_chains_are_returned_unused() {
        let (mem, _d, _l, mut m) = setup();
        let txq = MockSplitQueue::create(&mem, GuestAddress(0), 16);
        let mut tx: Queue = txq.create_queue().unwrap();
        mem.write_slice(&header_bytes(&guest_hdr(1, op::RW, 100)), GuestAddress(0x10_0000)).unwrap();
        txq.add_desc_chains(
            &[
                // Header beyond guest memory.
                desc(MEM_SIZE - 8, PKT_HEADER_SIZE as u32, 0),
                // Too short for a header.
                desc(0x10_0000, 10, 0),
                // Write-only on the transmit queue.
                desc(0x10_0000, PKT_HEADER_SIZE as u32, VRING_DESC_F_WRITE),
                // len says 100 bytes, no data descriptor.
                desc(0x10_0000, PKT_HEADER_SIZE as u32, 0),
            ],
            0,
        )
        .unwrap();
        assert!(process_tx(&mut tx, &mem, &mut m));
        assert_eq!(used(&mem, &txq, 0), [(0, 0), (1, 0), (2, 0), (3, 0)]);
        assert_eq!(m.connections(), 0);
    }

    /// xorshift: reproducible without a dependency.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    /// Random descriptors, chains, avail indexes and headers (some valid, most not): the
    /// backend never panics and never holds more than its connections.
    #[test]
    fn random_descriptors_never_crash_the_device() {
        let (mem, _d, l, mut m) = setup();
        l.set_nonblocking(true).unwrap();
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let mut accepted = 0;
        for round in 0..2000 {
            let txq = MockSplitQueue::create(&mem, GuestAddress(0), 16);
            let rxq = MockSplitQueue::create(&mem, GuestAddress(0x10000), 16);
            let mut tx: Queue = txq.create_queue().unwrap();
            let mut rx: Queue = rxq.create_queue().unwrap();
            for q in [&txq, &rxq] {
                for i in 0..16u16 {
                    let addr = match rng.below(4) {
                        0 => rng.next(),
                        1 => MEM_SIZE - rng.below(128),
                        _ => 0x10_0000 + rng.below(0x8000) * 8,
                    };
                    let len = match rng.below(4) {
                        0 => rng.next() as u32,
                        1 => PKT_HEADER_SIZE as u32,
                        _ => rng.below(8192) as u32,
                    };
                    let mut flags = rng.below(8) as u16 & (VRING_DESC_F_NEXT | VRING_DESC_F_WRITE) as u16;
                    if rng.below(20) == 0 {
                        flags |= VRING_DESC_F_INDIRECT as u16;
                    }
                    let next = rng.below(20) as u16;
                    q.desc_table().store(i, RawDescriptor::from(Descriptor::new(addr, len, flags, next))).unwrap();
                    q.avail().ring().ref_at(i as usize).unwrap().store(u16::to_le(rng.below(20) as u16));
                }
                let idx = if rng.below(10) == 0 { rng.next() as u16 } else { rng.below(17) as u16 };
                q.avail().idx().store(u16::to_le(idx));
            }
            // Headers, some of them plausible, where the descriptors point.
            for _ in 0..64 {
                let mut h = guest_hdr(rng.below(12) as u32, 1 + rng.below(8) as u16, rng.below(3) as u32 * 700);
                if rng.below(4) == 0 {
                    h.dst_port = rng.next() as u32;
                }
                if rng.below(4) == 0 {
                    h.fwd_cnt = rng.next() as u32;
                    h.buf_alloc = rng.next() as u32;
                }
                h.flags = rng.below(4) as u32;
                let at = 0x10_0000 + rng.below(0x8000) * 8;
                mem.write_slice(&header_bytes(&h), GuestAddress(at)).unwrap();
            }
            process_tx(&mut tx, &mem, &mut m);
            while let Ok((mut s, _)) = l.accept() {
                accepted += 1;
                if round % 3 == 0 {
                    let _ = s.write_all(&[round as u8; 300]);
                }
            }
            m.poll_sockets();
            process_rx(&mut rx, &mem, &mut m);
            assert!(m.connections() <= 8);
        }
        // Some of the noise was well-formed enough to connect.
        assert!(accepted > 0);
    }
}
