//! A guest that breaks the rules: every bad input gets an error reply and a log line, and the
//! server keeps serving the session (and nothing leaks to another session).

use std::io::Write;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use phos_protocol::cudart::*;
use phos_protocol::shared::SharedRegion;
use phos_protocol::{CudaError, Ptr};
use phos_tests::{RawGuest, TestRouter};

fn open() -> (TestRouter, RawGuest) {
    let router = TestRouter::start("emu");
    let guest = RawGuest::connect(&router.socket(), None).expect("session");
    (router, guest)
}

fn malloc<T: phos_protocol::transport::Transport>(g: &mut RawGuest<T>, size: u64) -> u64 {
    g.call(&CudaMallocRequest { size }).expect("cudaMalloc").devPtr
}

#[test]
fn welcome_describes_the_session() {
    let (_router, g) = open();
    assert_eq!(g.welcome.backend, "emu");
    assert_eq!(g.welcome.device_count, 1);
    assert!(g.welcome.device_size > 0);
    assert_ne!(g.welcome.token, [0; 16]);
}

#[test]
fn unknown_function_id() {
    let (router, mut g) = open();
    let session = g.welcome.session;
    let r = g.call_raw(9_999, session, &[]).unwrap();
    assert_eq!(r.status, CudaError::InvalidValue.0);
    // An API this server does not serve.
    let r = g.call_raw_api(77, 0, session, &[]).unwrap();
    assert_eq!(r.status, CudaError::InvalidValue.0);
    // Still serving.
    assert_ne!(malloc(&mut g, 64), 0);
    let logs = router.server_logs();
    assert!(logs.contains("unknown `cudart` function id 9999"), "{logs}");
    assert!(logs.contains("a call of API id 77, which this server does not serve"), "{logs}");
}

/// The driver API travels on the runtime's channel to the same server: its calls carry API
/// id 1, answer in its own codes, and use the runtime's handles.
#[test]
fn the_driver_api_shares_the_channel_and_the_handles() {
    use phos_protocol::cuda::{self, CuError};
    let (_router, mut g) = open();
    let count = g.call(&cuda::CuDeviceGetCountRequest {}).unwrap().count;
    assert_eq!(count, g.welcome.device_count);
    assert_eq!(g.call(&cuda::CuDeviceGetRequest { ordinal: count }).unwrap_err(), CuError::INVALID_DEVICE.0);
    let stream = g.call(&CudaStreamCreateRequest {}).unwrap().pStream;
    g.call(&cuda::CuStreamSynchronizeRequest { hStream: stream }).unwrap();
    // An event handle is no stream: the driver's code for it.
    let event = g.call(&CudaEventCreateRequest {}).unwrap().event;
    assert_eq!(g.call(&cuda::CuStreamSynchronizeRequest { hStream: event }).unwrap_err(), CuError::INVALID_HANDLE.0);
    // A name cut to the buffer the guest has.
    let name = g.call(&cuda::CuDeviceGetNameRequest { len: 4, dev: 0 }).unwrap().name;
    assert_eq!((name.len(), name[3]), (4, 0));
}

#[test]
fn malformed_payload() {
    let (router, mut g) = open();
    let session = g.welcome.session;
    let r = g.call_raw(FunctionId::CudaMemcpy as u32, session, &[0xff; 7]).unwrap();
    assert_eq!(r.status, CudaError::InvalidValue.0);
    // Trailing garbage after a valid request is malformed too.
    let mut payload = phos_protocol::encode(&CudaMallocRequest { size: 16 });
    payload.extend_from_slice(b"junk");
    let r = g.call_raw(FunctionId::CudaMalloc as u32, session, &payload).unwrap();
    assert_eq!(r.status, CudaError::InvalidValue.0);
    assert_ne!(malloc(&mut g, 64), 0);
    assert!(router.server_logs().contains("malformed request"), "{}", router.server_logs());
}

#[test]
fn out_of_range_handles() {
    let (router, mut g) = open();
    assert_eq!(
        g.call(&CudaStreamSynchronizeRequest { stream: 0xdead_beef }).unwrap_err(),
        CudaError::InvalidResourceHandle.0
    );
    assert_eq!(
        g.call(&CudaEventRecordRequest { event: 42, stream: 0 }).unwrap_err(),
        CudaError::InvalidResourceHandle.0
    );
    // A real handle of the wrong kind.
    let stream = g.call(&CudaStreamCreateRequest {}).unwrap().pStream;
    assert_eq!(g.call(&CudaEventDestroyRequest { event: stream }).unwrap_err(), CudaError::InvalidResourceHandle.0);
    assert_eq!(
        g.call(&PhosLaunchKernelRequest {
            function: stream,
            grid: Default::default(),
            block: Default::default(),
            sharedMem: 0,
            stream,
            params: &[],
            paramSize: 0
        })
        .unwrap_err(),
        CudaError::InvalidResourceHandle.0
    );
    g.call(&CudaStreamDestroyRequest { stream }).unwrap();
    // Destroyed handles are gone.
    assert_eq!(g.call(&CudaStreamDestroyRequest { stream }).unwrap_err(), CudaError::InvalidResourceHandle.0);
    // Each is logged as what it is.
    let logs = router.server_logs();
    assert!(
        logs.contains(
            "cudaStreamDestroy: a handle that is not one of the session's (or not of the kind the call takes)"
        ),
        "{logs}"
    );
}

#[test]
fn device_pointers_outside_the_session() {
    let (router, mut g) = open();
    let base = g.welcome.device_base;
    let buf = malloc(&mut g, 4096);
    // Outside any allocation: below the range, inside the range but unallocated, past the end.
    for (addr, len) in [(0x1000u64, 16u64), (base + (1 << 39), 16), (buf + 4000, 200), (buf - 256, 16)] {
        let r = g.call(&CudaMemsetRequest { devPtr: addr, value: 0, count: len });
        assert_eq!(r.unwrap_err(), CudaError::InvalidValue.0, "memset at {addr:#x}+{len}");
    }
    // A copy whose source is the server's own memory must not read it.
    let r = g.call(&CudaMemcpyRequest {
        dst: Ptr::Out(64),
        src: Ptr::Device(0x5555_0000_0000),
        count: 64,
        kind: consts::cudaMemcpyDeviceToHost,
        direction: consts::cudaMemcpyDeviceToHost,
    });
    assert_eq!(r.unwrap_err(), CudaError::InvalidValue.0);
    // Overflowing offset arithmetic.
    let r = g.call(&CudaMemsetRequest { devPtr: buf, value: 0, count: u64::MAX });
    assert_eq!(r.unwrap_err(), CudaError::InvalidValue.0);
    // Inside the allocation is fine.
    g.call(&CudaMemsetRequest { devPtr: buf, value: 7, count: 4096 }).unwrap();
    assert!(router.server_logs().contains("device pointer"), "{}", router.server_logs());
}

#[test]
fn sizes_that_disagree_with_the_attached_buffer() {
    let (router, mut g) = open();
    let buf = malloc(&mut g, 4096);
    let data = vec![1u8; 100];
    // Claims 1000 bytes, attaches 100.
    let r = g.call(&CudaMemcpyRequest {
        dst: Ptr::Device(buf),
        src: Ptr::In(&data),
        count: 1000,
        kind: consts::cudaMemcpyHostToDevice,
        direction: consts::cudaMemcpyHostToDevice,
    });
    assert_eq!(r.unwrap_err(), CudaError::InvalidValue.0);
    // Asks for more reply than the limit.
    let r = g.call(&CudaMemcpyRequest {
        dst: Ptr::Out(1 << 40),
        src: Ptr::Device(buf),
        count: 1 << 40,
        kind: consts::cudaMemcpyDeviceToHost,
        direction: consts::cudaMemcpyDeviceToHost,
    });
    assert_eq!(r.unwrap_err(), CudaError::InvalidValue.0);
    // A shape the spec does not allow for the direction (host data where a device pointer goes).
    let r = g.call(&CudaMemcpyRequest {
        dst: Ptr::In(&data),
        src: Ptr::Device(buf),
        count: 100,
        kind: consts::cudaMemcpyDeviceToHost,
        direction: consts::cudaMemcpyDeviceToHost,
    });
    assert_eq!(r.unwrap_err(), CudaError::InvalidValue.0);
    // Module digest that does not match the image.
    let r = g.call(&PhosModuleLoadRequest { image: b"not a module", size: 12, digest: &[0u8; 32] });
    assert_eq!(r.unwrap_err(), CudaError::InvalidValue.0);
    // The session still works, with the data intact.
    let ok = vec![9u8; 100];
    g.call(&CudaMemcpyRequest {
        dst: Ptr::Device(buf),
        src: Ptr::In(&ok),
        count: 100,
        kind: consts::cudaMemcpyHostToDevice,
        direction: consts::cudaMemcpyHostToDevice,
    })
    .unwrap();
    let back = g
        .call(&CudaMemcpyRequest {
            dst: Ptr::Out(100),
            src: Ptr::Device(buf),
            count: 100,
            kind: consts::cudaMemcpyDeviceToHost,
            direction: consts::cudaMemcpyDeviceToHost,
        })
        .unwrap();
    assert_eq!(back.dst.as_deref(), Some(&ok[..]));
    assert!(router.server_logs().contains("size of buffer"), "{}", router.server_logs());
}

#[test]
fn functions_that_never_travel() {
    let (_router, mut g) = open();
    let session = g.welcome.session;
    let r = g.call_raw(FunctionId::CudaGetLastError as u32, session, &[]).unwrap();
    assert_eq!(r.status, NOT_SUPPORTED.0);
}

#[test]
fn calls_for_another_session_on_this_channel() {
    let (_router, mut g) = open();
    let session = g.welcome.session;
    let payload = phos_protocol::encode(&CudaMallocRequest { size: 16 });
    let r = g.call_raw(FunctionId::CudaMalloc as u32, session + 1, &payload).unwrap();
    assert_eq!(r.status, CudaError::InvalidValue.0);
}

#[test]
fn malformed_frame_ends_only_that_channel() {
    let (router, mut g) = open();
    let token = g.welcome.token;
    let buf = malloc(&mut g, 1024);
    // A second channel of the same session.
    let mut g2 = RawGuest::connect(&router.socket(), Some(token)).expect("join with the token");
    assert_eq!(g2.welcome.session, g.welcome.session);
    // Garbage where a frame header should be.
    let mut raw = g.transport.stream().try_clone().unwrap();
    raw.write_all(&[0x42; 48]).unwrap();
    let mut reply = Vec::new();
    let got = phos_protocol::transport::Transport::recv(&mut g.transport, &mut reply);
    // Either a Refused frame or the channel closed.
    if let Ok(h) = got {
        assert_eq!(h.kind, phos_protocol::FrameKind::Refused);
    }
    // The other channel and the session's memory are untouched.
    g2.call(&CudaMemsetRequest { devPtr: buf, value: 1, count: 1024 }).unwrap();
    g2.call(&CudaFreeRequest { devPtr: buf }).unwrap();
}

#[test]
fn sessions_are_isolated() {
    let router = TestRouter::start("emu");
    let mut a = RawGuest::connect(&router.socket(), None).unwrap();
    let mut b = RawGuest::connect(&router.socket(), None).unwrap();
    assert_ne!(a.welcome.session, b.welcome.session);
    let a_buf = malloc(&mut a, 4096);
    let a_stream = a.call(&CudaStreamCreateRequest {}).unwrap().pStream;
    // Session b cannot free, write or read a's memory, nor use a's stream.
    assert_eq!(b.call(&CudaFreeRequest { devPtr: a_buf }).unwrap_err(), CudaError::InvalidValue.0);
    assert_eq!(
        b.call(&CudaMemsetRequest { devPtr: a_buf, value: 0, count: 16 }).unwrap_err(),
        CudaError::InvalidValue.0
    );
    assert_eq!(
        b.call(&CudaStreamSynchronizeRequest { stream: a_stream }).unwrap_err(),
        CudaError::InvalidResourceHandle.0
    );
    // A made-up token does not join any session.
    assert!(RawGuest::connect(&router.socket(), Some([7; 16])).is_err());
    // a is unaffected.
    a.call(&CudaMemsetRequest { devPtr: a_buf, value: 3, count: 4096 }).unwrap();
}

/// Send a Hello frame of `version` with `payload` on a fresh connection; the answer's kind
/// and text.
fn hello_answer(router: &TestRouter, version: u8, payload: &[u8]) -> (phos_protocol::FrameKind, String) {
    use phos_protocol::transport::Transport;
    let mut t = phos_protocol::transport::UnixTransport::connect(&router.socket()).unwrap();
    let mut h = phos_protocol::FrameHeader::new(phos_protocol::FrameKind::Hello);
    h.version = version;
    h.payload_len = payload.len() as u64;
    t.send(&h, &[payload]).unwrap();
    let mut buf = Vec::new();
    let r = t.recv(&mut buf).unwrap();
    (r.kind, String::from_utf8_lossy(&buf).into_owned())
}

#[test]
fn a_guest_from_another_spec_is_refused() {
    use phos_protocol::FrameKind;
    use phos_protocol::frame::HANDSHAKE_VERSION;
    use phos_protocol::handshake::{ApiVersion, Hello, LegacyHello};
    let router = TestRouter::start("emu");
    let mut apis = ApiVersion::of_this_build();
    apis[0].hash ^= 1;
    let hello = Hello {
        apis,
        pid: 1,
        abi_major: 12,
        token: None,
        program: "other".into(),
        transports: Vec::new(),
        tenant_token: None,
        host_arena: None,
    };
    let (kind, why) = hello_answer(&router, HANDSHAKE_VERSION, &phos_protocol::encode(&hello));
    assert_eq!(kind, FrameKind::Refused);
    assert!(why.contains("`cudart` API") && why.contains("wire hash"), "{why}");
    // A guest of another version of an API.
    let mut apis = ApiVersion::of_this_build();
    apis[1].version += 1;
    let (kind, why) = hello_answer(&router, HANDSHAKE_VERSION, &phos_protocol::encode(&Hello { apis, ..hello }));
    assert_eq!(kind, FrameKind::Refused);
    assert!(why.contains(&format!("speaks `cuda` version {}", phos_protocol::cuda::API_VERSION + 1)), "{why}");
    // A guest from before there were several APIs, of a spec text this build does not know.
    let legacy = LegacyHello {
        spec_hash: 1,
        pid: 1,
        abi_major: 12,
        token: None,
        program: "old".into(),
        transports: Vec::new(),
        tenant_token: None,
        host_arena: None,
    };
    let (kind, why) = hello_answer(&router, 1, &phos_protocol::encode(&legacy));
    assert_eq!(kind, FrameKind::Refused);
    assert!(why.contains("text hash 0000000000000001"), "{why}");
}

/// A guest built before the API field and per-API versions (a version-1 Hello naming the
/// text hash of the spec it was built from, frames with a zero API field) is served: the ids
/// and layouts of its calls are this build's.
#[test]
fn a_guest_from_before_api_versions_is_served() {
    use phos_protocol::handshake::{LegacyHello, Welcome};
    use phos_protocol::transport::Transport;
    use phos_protocol::{FrameHeader, FrameKind};
    let router = TestRouter::start("emu");
    let legacy = LegacyHello {
        spec_hash: phos_protocol::cudart::LEGACY_TEXT_HASHES[0],
        pid: std::process::id(),
        abi_major: 12,
        token: None,
        program: "deployed".into(),
        transports: Vec::new(),
        tenant_token: None,
        host_arena: None,
    };
    let mut t = phos_protocol::transport::UnixTransport::connect(&router.socket()).unwrap();
    let payload = phos_protocol::encode(&legacy);
    let mut h = FrameHeader::new(FrameKind::Hello);
    assert_eq!(h.version, 1);
    h.payload_len = payload.len() as u64;
    t.send(&h, &[&payload]).unwrap();
    let mut buf = Vec::new();
    let r = t.recv(&mut buf).unwrap();
    assert_eq!(r.kind, FrameKind::Welcome, "{}", String::from_utf8_lossy(&buf));
    let welcome: Welcome = phos_protocol::decode(&buf).unwrap();
    // cudaMalloc by its id of the positional days (what that guest sends), in a frame whose
    // API field is zero, and the answer is a version-1 frame it can read.
    let payload = phos_protocol::encode(&CudaMallocRequest { size: 4096 });
    let mut h = FrameHeader::new(FrameKind::Call);
    h.function = FunctionId::CudaMalloc as u32;
    h.session = welcome.session;
    h.call_id = 1;
    h.payload_len = payload.len() as u64;
    t.send(&h, &[&payload]).unwrap();
    let r = t.recv(&mut buf).unwrap();
    assert_eq!((r.kind, r.version, r.api, r.status), (FrameKind::Reply, 1, 0, 0));
    let reply: CudaMallocReply = phos_protocol::decode(&buf).unwrap();
    assert!(reply.devPtr >= welcome.device_base);
}

#[test]
fn async_calls_are_acknowledged_together_and_bad_barriers_end_only_that_channel() {
    use phos_protocol::frame::{FLAG_ASYNC, FrameHeader, FrameKind};
    use phos_protocol::transport::Transport;
    let (router, mut g) = open();
    let session = g.welcome.session;
    // Five calls sent without waiting, each failing (a handle that does not exist).
    let payload = phos_protocol::encode(&CudaStreamSynchronizeRequest { stream: 0xdead_beef });
    for id in 100..105u64 {
        let mut h = FrameHeader::new(FrameKind::Call);
        h.function = FunctionId::CudaStreamSynchronize as u32;
        h.session = session;
        h.call_id = id;
        h.flags = FLAG_ASYNC;
        h.payload_len = payload.len() as u64;
        g.transport.send(&h, &[&payload]).unwrap();
    }
    // A synchronous call: its reply comes after one acknowledgement of all five.
    let mut h = FrameHeader::new(FrameKind::Call);
    let get_count = phos_protocol::encode(&CudaGetDeviceCountRequest {});
    h.function = FunctionId::CudaGetDeviceCount as u32;
    h.session = session;
    h.call_id = 200;
    h.payload_len = get_count.len() as u64;
    g.transport.send(&h, &[&get_count]).unwrap();
    let mut buf = Vec::new();
    let ack = g.transport.recv(&mut buf).unwrap();
    assert_eq!((ack.kind, ack.flags, ack.call_id), (FrameKind::Reply, FLAG_ASYNC, 104));
    assert_eq!(ack.status, CudaError::InvalidResourceHandle.0);
    assert_eq!(buf, 5u64.to_le_bytes(), "all five failed");
    let reply = g.transport.recv(&mut buf).unwrap();
    assert_eq!((reply.kind, reply.call_id, reply.status), (FrameKind::Reply, 200, 0));

    // A barrier that is not a list of call ids ends this channel, and only it.
    let mut b = FrameHeader::new(FrameKind::Barrier);
    b.session = session;
    b.payload_len = 7;
    g.transport.send(&b, &[&[1u8; 7]]).unwrap();
    let refused = g.transport.recv(&mut buf).unwrap();
    assert_eq!(refused.kind, FrameKind::Refused);
    let mut again = RawGuest::connect(&router.socket(), Some(g.welcome.token)).expect("the session still serves");
    assert_ne!(malloc(&mut again, 64), 0);
    // A barrier naming calls that ran (or were forgotten) does not hold the channel.
    let mut b = FrameHeader::new(FrameKind::Barrier);
    b.session = session;
    let ids: Vec<u8> = [100u64, 104].iter().flat_map(|i| i.to_le_bytes()).collect();
    b.payload_len = ids.len() as u64;
    again.transport.send(&b, &[&ids]).unwrap();
    assert_ne!(malloc(&mut again, 64), 0);
}

/// A guest on shared memory that scribbles on its rings' indices and tries to shrink the
/// region under the router: the router ends that channel only, and the session's other
/// channels carry on.
#[test]
fn a_guest_that_corrupts_its_shared_rings_ends_only_that_channel() {
    use std::os::fd::AsRawFd;

    use phos_protocol::handshake::{Hello, TransportKind, Welcome};
    use phos_protocol::transport::Transport;
    use phos_protocol::{FrameHeader, FrameKind};

    let (router, mut g) = open();
    let buf = malloc(&mut g, 4096);
    // A second channel of the session that asks for shared memory.
    let mut t = phos_protocol::transport::UnixTransport::connect(&router.socket()).unwrap();
    let hello = Hello {
        apis: phos_protocol::handshake::ApiVersion::of_this_build(),
        pid: std::process::id(),
        abi_major: 12,
        token: Some(g.welcome.token),
        program: "scribbler".into(),
        transports: vec![TransportKind::Shm],
        tenant_token: None,
        host_arena: None,
    };
    let payload = phos_protocol::encode(&hello);
    let mut h = FrameHeader::new(FrameKind::Hello);
    h.version = phos_protocol::frame::HANDSHAKE_VERSION;
    h.payload_len = payload.len() as u64;
    t.send(&h, &[&payload]).unwrap();
    let mut reply = Vec::new();
    assert_eq!(t.recv(&mut reply).unwrap().kind, FrameKind::Welcome);
    let welcome: Welcome = phos_protocol::decode(&reply).unwrap();
    assert_eq!(welcome.transport, TransportKind::Shm);
    let stream = t.into_stream();
    // The ring region and the staging region.
    let fds = phos_protocol::shm::recv_fds(&stream).unwrap();
    assert_eq!(fds.len(), 2);
    let fd = &fds[0];
    // Sealed: the guest cannot shrink either file under the router's or the server's mapping.
    for f in &fds {
        // SAFETY: a plain system call on an open descriptor.
        assert_ne!(unsafe { libc::ftruncate(f.as_raw_fd(), 4096) }, 0, "the regions must be sealed");
    }
    let region = SharedRegion::attach(fd, 4096, 1 << 31).expect("the ring region maps");
    // The guest -> router ring's control is at 2048, its producer index first: claim far
    // more bytes than the ring holds, and wake the router.
    region.atomics::<AtomicU64>(2048).store(1 << 40, Ordering::SeqCst);
    let seq = region.atomics::<AtomicU32>(2048 + 8);
    seq.store(77, Ordering::SeqCst);
    // SAFETY: FUTEX_WAKE only uses the word's address to find sleepers.
    unsafe { libc::syscall(libc::SYS_futex, seq.as_ptr(), libc::FUTEX_WAKE, 1) };
    // The router drops the channel: its socket closes.
    let mut byte = [0u8; 1];
    stream.set_read_timeout(Some(std::time::Duration::from_secs(10))).unwrap();
    assert_eq!(std::io::Read::read(&mut &stream, &mut byte).unwrap(), 0, "the router closes the channel");
    drop(region);
    // The session's first channel works, its memory untouched; new sessions open.
    g.call(&CudaMemsetRequest { devPtr: buf, value: 1, count: 4096 }).unwrap();
    g.call(&CudaFreeRequest { devPtr: buf }).unwrap();
    let mut other = RawGuest::connect(&router.socket(), None).expect("another session");
    malloc(&mut other, 1024);
}

/// The strided copies and memsets, host-function gates and kernel queries the runtime API
/// groups added: every size, pitch and handle is checked before anything runs.
#[test]
fn strided_copies_gates_and_kernel_queries_are_checked() {
    let (_router, mut g) = open();
    let buf = malloc(&mut g, 4096);
    let copy = |g: &mut RawGuest, dpitch: u64, width: u64, height: u64, depth: u64, dslice: u64| {
        let data = vec![3u8; (width * height * depth) as usize];
        g.call(&PhosMemcpy3DRequest {
            dst: Ptr::Device(buf),
            dpitch,
            dslice,
            src: Ptr::In(&data),
            spitch: width,
            sslice: width * height,
            width,
            height,
            depth,
            direction: consts::cudaMemcpyHostToDevice,
            stream: 0,
            ordered: 0,
        })
        .map(|_| ())
    };
    // Rows that run past the allocation, a width over the pitch, slices that overlap, a zero
    // extent, a pitch that overflows the span arithmetic.
    assert_eq!(copy(&mut g, 1024, 64, 5, 1, 0).unwrap_err(), CudaError::InvalidValue.0);
    assert_eq!(copy(&mut g, 32, 64, 2, 1, 0).unwrap_err(), CudaError::InvalidPitchValue.0);
    assert_eq!(copy(&mut g, 64, 64, 4, 2, 64).unwrap_err(), CudaError::InvalidValue.0);
    assert_eq!(copy(&mut g, 64, 0, 4, 1, 0).unwrap_err(), CudaError::InvalidValue.0);
    assert_eq!(copy(&mut g, u64::MAX / 2, 64, 4, 1, 0).unwrap_err(), CudaError::InvalidValue.0);
    copy(&mut g, 1024, 64, 4, 1, 0).unwrap();
    // A host side that disagrees with the extent.
    let r = g.call(&PhosMemcpy3DRequest {
        dst: Ptr::Device(buf),
        dpitch: 64,
        dslice: 0,
        src: Ptr::In(&[0u8; 10]),
        spitch: 64,
        sslice: 0,
        width: 64,
        height: 2,
        depth: 1,
        direction: consts::cudaMemcpyHostToDevice,
        stream: 0,
        ordered: 0,
    });
    assert_eq!(r.unwrap_err(), CudaError::InvalidValue.0);
    let set = |g: &mut RawGuest, pitch: u64, width: u64, height: u64| {
        g.call(&PhosMemset3DRequest {
            dst: buf,
            pitch,
            slice: 0,
            value: 1,
            width,
            height,
            depth: 1,
            stream: 0,
            ordered: 0,
        })
        .map(|_| ())
    };
    assert_eq!(set(&mut g, 4096, 16, 2).unwrap_err(), CudaError::InvalidValue.0);
    assert_eq!(set(&mut g, 8, 16, 2).unwrap_err(), CudaError::InvalidPitchValue.0);
    set(&mut g, 1024, 16, 4).unwrap();

    // Gates: an unknown one cannot be waited for or opened; a number cannot be used twice.
    assert_eq!(g.call(&PhosHostFuncWaitRequest { gate: 77 }).unwrap_err(), CudaError::InvalidResourceHandle.0);
    assert_eq!(g.call(&PhosHostFuncDoneRequest { gate: 77 }).unwrap_err(), CudaError::InvalidResourceHandle.0);
    assert_eq!(
        g.call(&PhosHostFuncEnqueueRequest { stream: 0xdead_beef, gate: 1 }).unwrap_err(),
        CudaError::InvalidResourceHandle.0
    );
    g.call(&PhosHostFuncEnqueueRequest { stream: 0, gate: 1 }).unwrap();
    assert_eq!(g.call(&PhosHostFuncEnqueueRequest { stream: 0, gate: 1 }).unwrap_err(), CudaError::InvalidValue.0);
    g.call(&PhosHostFuncWaitRequest { gate: 1 }).unwrap();
    g.call(&PhosHostFuncDoneRequest { gate: 1 }).unwrap();
    // The stream moves on.
    g.call(&CudaStreamSynchronizeRequest { stream: 0 }).unwrap();

    // Kernel queries with handles that name nothing, and attributes outside the set.
    assert_eq!(
        g.call(&PhosFuncGetAttributesRequest { function: 12345 }).unwrap_err(),
        CudaError::InvalidResourceHandle.0
    );
    assert_eq!(
        g.call(&PhosFuncSetAttributeRequest { function: 12345, attr: 8, value: 0 }).unwrap_err(),
        CudaError::InvalidResourceHandle.0
    );
    assert_eq!(
        g.call(&PhosFuncSetAttributeRequest { function: 12345, attr: 10, value: 1 }).unwrap_err(),
        CudaError::InvalidValue.0
    );
    let r =
        g.call(&PhosOccupancyMaxActiveBlocksRequest { function: 12345, blockSize: 64, dynamicSMemSize: 0, flags: 0 });
    assert_eq!(r.unwrap_err(), CudaError::InvalidResourceHandle.0);
    // Limits and configurations outside their enums.
    assert_eq!(g.call(&CudaDeviceSetLimitRequest { limit: 99, value: 1 }).unwrap_err(), CudaError::InvalidValue.0);
    assert_eq!(g.call(&CudaDeviceSetCacheConfigRequest { cacheConfig: -1 }).unwrap_err(), CudaError::InvalidValue.0);
    // The session still works.
    g.call(&CudaMemsetRequest { devPtr: buf, value: 0, count: 4096 }).unwrap();
}

/// Graphs built node by node: nodes of other graphs, unknown graphs, cycles and oversized
/// node lists are refused.
#[test]
fn graph_nodes_are_checked() {
    let (_router, mut g) = open();
    let a = g.call(&CudaGraphCreateRequest { flags: 0 }).unwrap().pGraph;
    let b = g.call(&CudaGraphCreateRequest { flags: 0 }).unwrap().pGraph;
    assert_eq!(g.call(&CudaGraphCreateRequest { flags: 1 }).unwrap_err(), CudaError::InvalidValue.0);
    let empty = |g: &mut RawGuest, graph: u64, deps: &[u64]| {
        let bytes: Vec<u8> = deps.iter().flat_map(|d| d.to_ne_bytes()).collect();
        g.call(&PhosGraphAddEmptyNodeRequest { graph, deps: &bytes, numDeps: deps.len() as u64 }).map(|r| r.pGraphNode)
    };
    let n1 = empty(&mut g, a, &[]).unwrap();
    let n2 = empty(&mut g, a, &[n1]).unwrap();
    assert_eq!(empty(&mut g, 0xbad, &[]).unwrap_err(), CudaError::InvalidResourceHandle.0);
    // A dependency on another graph's node, or on something that is no node.
    assert_eq!(empty(&mut g, b, &[n1]).unwrap_err(), CudaError::InvalidValue.0);
    assert_eq!(empty(&mut g, b, &[0x1234]).unwrap_err(), CudaError::InvalidResourceHandle.0);
    // A count that disagrees with the list.
    let r = g.call(&PhosGraphAddEmptyNodeRequest { graph: a, deps: &n1.to_ne_bytes(), numDeps: 3 });
    assert_eq!(r.unwrap_err(), CudaError::InvalidValue.0);
    // A cycle is refused when the graph is instantiated.
    g.call(&PhosGraphAddDependenciesRequest {
        graph: a,
        from: &n2.to_ne_bytes(),
        to: &n1.to_ne_bytes(),
        numDependencies: 1,
    })
    .unwrap();
    assert_eq!(g.call(&PhosGraphInstantiateRequest { graph: a }).unwrap_err(), CudaError::InvalidValue.0);
    // A node list larger than any reply.
    assert_eq!(g.call(&PhosGraphNodesRequest { graph: a, max: 1 << 40 }).unwrap_err(), CudaError::InvalidValue.0);
    let listed = g.call(&PhosGraphNodesRequest { graph: a, max: 4 }).unwrap();
    assert_eq!(listed.count, 2);
    // Destroying a graph forgets its nodes.
    g.call(&CudaGraphDestroyRequest { graph: a }).unwrap();
    assert_eq!(g.call(&CudaGraphNodeGetTypeRequest { node: n1 }).unwrap_err(), CudaError::InvalidResourceHandle.0);
    g.call(&PhosGraphInstantiateRequest { graph: b }).unwrap();
}

/// Conditional handles and nodes: flags, graphs, handles, types and sizes a guest makes up are
/// refused; a handle's cell holding any value only picks a body (or none); a launch whose cell
/// was freed is refused.
#[test]
fn conditional_nodes_are_checked() {
    let (_router, mut g) = open();
    let a = g.call(&CudaGraphCreateRequest { flags: 0 }).unwrap().pGraph;
    let b = g.call(&CudaGraphCreateRequest { flags: 0 }).unwrap().pGraph;
    let handle = |g: &mut RawGuest, graph: u64, flags: u32| {
        g.call(&PhosGraphConditionalHandleCreateRequest { graph, defaultLaunchValue: 0, flags }).map(|r| r.handle)
    };
    assert_eq!(handle(&mut g, a, 2).unwrap_err(), CudaError::InvalidValue.0);
    assert!(handle(&mut g, 0xbad, 0).is_err());
    let h = handle(&mut g, a, 0).unwrap();
    let add = |g: &mut RawGuest, graph: u64, handle: u64, kind: i32, size: u32| {
        g.call(&PhosGraphAddConditionalNodeRequest { graph, deps: &[], count: 0, handle, kind, size })
            .map(|r| (r.node, r.bodies.len() / 8))
    };
    // A made-up handle, a handle of another graph, an unknown type, sizes the type does not take.
    for (graph, handle, kind, size) in [(a, 0x1234, 0, 1), (b, h, 0, 1), (a, h, 9, 1), (a, h, 1, 2), (a, h, 0, 3)] {
        assert_eq!(add(&mut g, graph, handle, kind, size).unwrap_err(), CudaError::InvalidValue.0);
    }
    for size in [0, 5000] {
        assert_eq!(add(&mut g, a, h, 2, size).unwrap_err(), CudaError::InvalidValue.0);
    }
    let (_, bodies) = add(&mut g, a, h, 2, 3).unwrap();
    assert_eq!(bodies, 3);
    // Garbage in the cell: a switch runs no body.
    let garbage = 0xdead_beefu32.to_ne_bytes();
    g.call(&CudaMemcpyRequest {
        dst: Ptr::Device(h),
        src: Ptr::In(&garbage),
        count: 4,
        kind: consts::cudaMemcpyHostToDevice,
        direction: consts::cudaMemcpyHostToDevice,
    })
    .unwrap();
    let exec = g.call(&PhosGraphInstantiateRequest { graph: a }).unwrap().pGraphExec;
    g.call(&CudaGraphLaunchRequest { graphExec: exec, stream: 0 }).unwrap();
    g.call(&CudaDeviceSynchronizeRequest {}).unwrap();
    // The cell freed: the launch is refused, the session goes on.
    g.call(&CudaFreeRequest { devPtr: h }).unwrap();
    let r = g.call(&CudaGraphLaunchRequest { graphExec: exec, stream: 0 });
    assert_eq!(r.unwrap_err(), CudaError::InvalidValue.0);
    g.call(&CudaDeviceSynchronizeRequest {}).unwrap();
}

/// Node queries and edits name nodes, graphs and executable graphs the session has: unknown
/// handles, nodes of other types or graphs, a node set from itself, an oversized reply and an
/// unknown operation are refused.
#[test]
fn graph_edits_are_checked() {
    let (_router, mut g) = open();
    let a = g.call(&CudaGraphCreateRequest { flags: 0 }).unwrap().pGraph;
    let b = g.call(&CudaGraphCreateRequest { flags: 0 }).unwrap().pGraph;
    let empty = |g: &mut RawGuest, graph: u64| {
        g.call(&PhosGraphAddEmptyNodeRequest { graph, deps: &[], numDeps: 0 }).map(|r| r.pGraphNode).unwrap()
    };
    let (n1, n2, other) = (empty(&mut g, a), empty(&mut g, a), empty(&mut g, b));
    let query = |g: &mut RawGuest, what: i32, handle: u64, max: u64| {
        g.call(&PhosGraphQueryRequest { what, handle, max }).map(|r| r.count)
    };
    let edit = |g: &mut RawGuest, what: i32, a: u64, b: u64, c: u64| {
        g.call(&PhosGraphEditRequest { what, a, b, c }).map(|r| r.value)
    };
    assert_eq!(query(&mut g, 0, a, 4).unwrap(), 2);
    assert_eq!(query(&mut g, 9, a, 4).unwrap_err(), CudaError::InvalidValue.0);
    assert_eq!(query(&mut g, 0, a, 1 << 40).unwrap_err(), CudaError::InvalidValue.0);
    assert_eq!(query(&mut g, 2, 0xbad, 4).unwrap_err(), CudaError::InvalidValue.0);
    assert_eq!(query(&mut g, 1, 0xbad, 4).unwrap_err(), CudaError::InvalidResourceHandle.0);
    assert_eq!(edit(&mut g, 8, a, 0, 0).unwrap_err(), CudaError::InvalidValue.0);
    // A node set from itself; an edge that is not there; one across graphs.
    assert_eq!(edit(&mut g, 1, n1, n1, 0).unwrap_err(), CudaError::InvalidValue.0);
    assert_eq!(edit(&mut g, 7, a, n1, n2).unwrap_err(), CudaError::InvalidValue.0);
    assert_eq!(edit(&mut g, 7, a, n1, other).unwrap_err(), CudaError::InvalidValue.0);
    // Enabling an empty node, in an unknown executable graph, with a value not 0 or 1.
    let exec = g.call(&PhosGraphInstantiateRequest { graph: a }).unwrap().pGraphExec;
    assert_eq!(edit(&mut g, 3, exec, n1, 0).unwrap_err(), CudaError::InvalidValue.0);
    assert_eq!(edit(&mut g, 3, exec, n1, 7).unwrap_err(), CudaError::InvalidValue.0);
    assert_eq!(edit(&mut g, 4, 0xbad, n1, 0).unwrap_err(), CudaError::InvalidValue.0);
    // Not a clone (another shape).
    assert_eq!(edit(&mut g, 6, n1, b, 0).unwrap_err(), CudaError::InvalidValue.0);
    // An executable graph's node set from a node of another graph, which is consumed.
    assert_eq!(edit(&mut g, 2, exec, other, n2).unwrap_err(), CudaError::InvalidValue.0);
    // A clone; a destroyed node is gone from queries.
    let clone = edit(&mut g, 5, a, 0, 0).unwrap();
    assert_ne!(edit(&mut g, 6, n1, clone, 0).unwrap(), n1);
    edit(&mut g, 0, n1, 0, 0).unwrap();
    assert_eq!(edit(&mut g, 0, n1, 0, 0).unwrap_err(), CudaError::InvalidValue.0);
    assert_eq!(query(&mut g, 0, a, 4).unwrap(), 0);
    g.call(&CudaGraphDestroyRequest { graph: a }).unwrap();
    g.call(&PhosGraphInstantiateRequest { graph: clone }).unwrap();
}

/// The graph and dependency set of a capture in progress: queries name a stream of the session
/// and fit a reply; updates name nodes of the capture's graph, with a count that matches the
/// list and flags CUDA has, on a capturing stream; the graph and its nodes are not destroyed
/// while it grows.
#[test]
fn capture_dependencies_are_checked() {
    let (_router, mut g) = open();
    let buf = malloc(&mut g, 4096);
    let stream = g.call(&CudaStreamCreateRequest {}).unwrap().pStream;
    let other = g.call(&CudaGraphCreateRequest { flags: 0 }).unwrap().pGraph;
    let foreign = g.call(&PhosGraphAddEmptyNodeRequest { graph: other, deps: &[], numDeps: 0 }).unwrap().pGraphNode;
    let update = |g: &mut RawGuest, deps: &[u64], count: u64, flags: u32| {
        let bytes: Vec<u8> = deps.iter().flat_map(|d| d.to_ne_bytes()).collect();
        g.call(&PhosStreamUpdateCaptureDependenciesRequest { stream, deps: &bytes, count, flags }).map(|_| ())
    };
    assert_eq!(update(&mut g, &[], 0, 0).unwrap_err(), CudaError::IllegalState.0, "not capturing");
    g.call(&CudaStreamBeginCaptureRequest { stream, mode: 0 }).unwrap();
    g.call(&CudaMemsetAsyncRequest { devPtr: buf, value: 0, count: 4096, stream }).unwrap();
    let info = g.call(&PhosStreamCaptureGraphRequest { stream, max: 4 }).unwrap();
    assert_eq!((info.status, info.count), (1, 1));
    let node = u64::from_ne_bytes(info.deps[..8].try_into().unwrap());
    assert!(g.call(&PhosStreamCaptureGraphRequest { stream: 0xbad, max: 4 }).is_err());
    let huge = g.call(&PhosStreamCaptureGraphRequest { stream, max: 1 << 40 });
    assert_eq!(huge.unwrap_err(), CudaError::InvalidValue.0);
    // Nodes of another graph or none, a count that disagrees with the list, other flags.
    assert_eq!(update(&mut g, &[foreign], 1, 0).unwrap_err(), CudaError::InvalidValue.0);
    assert_eq!(update(&mut g, &[0x1234], 1, 1).unwrap_err(), CudaError::InvalidValue.0);
    assert_eq!(update(&mut g, &[node], 3, 0).unwrap_err(), CudaError::InvalidValue.0);
    assert_eq!(update(&mut g, &[node], 1, 5).unwrap_err(), CudaError::InvalidValue.0);
    // Neither the graph nor its nodes are destroyed mid-capture.
    assert_eq!(g.call(&CudaGraphDestroyRequest { graph: info.graph }).unwrap_err(), CudaError::InvalidValue.0);
    let destroy_node = PhosGraphEditRequest { what: 0, a: node, b: 0, c: 0 };
    assert_eq!(g.call(&destroy_node).unwrap_err(), CudaError::InvalidValue.0);
    update(&mut g, &[node, node], 2, 1).unwrap();
    g.call(&CudaMemsetAsyncRequest { devPtr: buf, value: 1, count: 4096, stream }).unwrap();
    let ended = g.call(&CudaStreamEndCaptureRequest { stream }).unwrap().pGraph;
    assert_eq!(ended, info.graph);
    assert_eq!(g.call(&PhosGraphNodesRequest { graph: ended, max: 4 }).unwrap().count, 2);
    assert_eq!(g.call(&PhosStreamCaptureGraphRequest { stream, max: 4 }).unwrap().status, 0);
    assert_eq!(update(&mut g, &[node], 1, 0).unwrap_err(), CudaError::IllegalState.0);
    g.call(&CudaGraphDestroyRequest { graph: ended }).unwrap();
}

/// A graph launch checks its copies and memsets against the memory the session has then: a
/// node whose memory was freed after it was added fails the launch before any node runs.
#[test]
fn a_graph_launch_checks_memory_freed_since_its_nodes_were_added() {
    let (router, mut g) = open();
    let kept = malloc(&mut g, 64);
    let freed = malloc(&mut g, 64);
    let source = malloc(&mut g, 64);
    g.call(&CudaMemsetRequest { devPtr: kept, value: 1, count: 64 }).unwrap();
    let read = |g: &mut RawGuest, addr: u64| {
        let dst = g
            .call(&CudaMemcpyRequest {
                dst: Ptr::Out(64),
                src: Ptr::Device(addr),
                count: 64,
                kind: consts::cudaMemcpyDeviceToHost,
                direction: consts::cudaMemcpyDeviceToHost,
            })
            .unwrap()
            .dst;
        dst.expect("copied bytes")
    };
    let graph = |g: &mut RawGuest, target: u64, copy_from: Option<u64>| {
        let graph = g.call(&CudaGraphCreateRequest { flags: 0 }).unwrap().pGraph;
        // The kept allocation's node comes first: it must not run either.
        let set = |g: &mut RawGuest, dst: u64| {
            g.call(&PhosGraphAddSetNodeRequest {
                graph,
                deps: &[],
                numDeps: 0,
                dst,
                pitch: 64,
                value: 9,
                width: 64,
                height: 1,
            })
            .unwrap()
        };
        set(g, kept);
        match copy_from {
            None => {
                set(g, target);
            }
            Some(src) => {
                g.call(&PhosGraphAddCopyNodeRequest {
                    graph,
                    deps: &[],
                    numDeps: 0,
                    dst: target,
                    dpitch: 64,
                    dslice: 64,
                    src: Ptr::Device(src),
                    spitch: 64,
                    sslice: 64,
                    width: 64,
                    height: 1,
                    depth: 1,
                    direction: consts::cudaMemcpyDeviceToDevice,
                })
                .unwrap();
            }
        }
        g.call(&PhosGraphInstantiateRequest { graph }).unwrap().pGraphExec
    };
    let memset_freed = graph(&mut g, freed, None);
    let copy_into_freed = graph(&mut g, freed, Some(source));
    let copy_from_freed = graph(&mut g, source, Some(freed));
    g.call(&CudaFreeRequest { devPtr: freed }).unwrap();
    for exec in [memset_freed, copy_into_freed, copy_from_freed] {
        let r = g.call(&CudaGraphLaunchRequest { graphExec: exec, stream: 0 });
        assert_eq!(r.unwrap_err(), CudaError::InvalidValue.0);
    }
    // Nothing ran, not even the nodes whose memory is still there.
    g.call(&CudaDeviceSynchronizeRequest {}).unwrap();
    assert_eq!(read(&mut g, kept), vec![1; 64]);
    let logs = router.server_logs();
    assert!(logs.contains("cudaGraphLaunch: refused: a node's device memory"), "{logs}");
    // A graph whose memory is all there still runs.
    let fine = graph(&mut g, source, None);
    g.call(&CudaGraphLaunchRequest { graphExec: fine, stream: 0 }).unwrap();
    g.call(&CudaDeviceSynchronizeRequest {}).unwrap();
    assert_eq!(read(&mut g, kept), vec![9; 64]);
    assert_eq!(read(&mut g, source), vec![9; 64]);
}

/// The pinned arena: the router refuses a file that is not one, and the server copies only
/// within the allocations it made, frees only those, and keeps the first arena it mapped.
#[test]
fn the_pinned_arena_is_checked() {
    use std::os::fd::{FromRawFd, OwnedFd};

    use phos_protocol::host_arena::{self, BASE};

    let router = TestRouter::start("emu");
    // A file that is not sealed is refused before a session starts.
    // SAFETY: a plain system call with a NUL-terminated name.
    let raw = unsafe { libc::memfd_create(c"x".as_ptr(), libc::MFD_CLOEXEC) };
    // SAFETY: just created, owned by nobody else.
    let unsealed = unsafe { OwnedFd::from_raw_fd(raw) };
    std::fs::File::from(unsealed.try_clone().unwrap()).set_len(4 << 20).unwrap();
    let refused = RawGuest::connect_shm(&router.socket(), None, Some(&unsealed)).err().expect("refused");
    assert!(refused.contains("bad pinned arena"), "{refused}");

    let arena = host_arena::create(8 << 20).unwrap();
    let mut g = RawGuest::connect_shm(&router.socket(), None, Some(&arena)).expect("session");
    let a = g.call(&PhosHostAllocRequest { size: 5000, flags: 0 }).expect("phosHostAlloc");
    assert!(a.host >= BASE && a.host + 5000 <= BASE + (8 << 20) && a.host % 4096 == 0, "{:#x}", a.host);
    assert_eq!(a.device, a.host, "emu reaches pinned memory at its own address");
    // What the guest writes into its file, the server copies to the device, and back.
    let pattern: Vec<u8> = (0..5000u32).map(|i| (i * 7 % 251) as u8).collect();
    std::os::unix::fs::FileExt::write_all_at(&std::fs::File::from(arena.try_clone().unwrap()), &pattern, a.host - BASE)
        .unwrap();
    let dev = malloc(&mut g, 8192);
    let pinned = |device, host, count, direction| PhosMemcpyPinnedRequest {
        device,
        host,
        count,
        direction,
        stream: 0,
        ordered: 0,
    };
    g.call(&pinned(dev, a.host, 5000, consts::cudaMemcpyHostToDevice)).expect("pinned copy");
    let back = g
        .call(&CudaMemcpyRequest {
            dst: Ptr::Out(5000),
            src: Ptr::Device(dev),
            count: 5000,
            kind: consts::cudaMemcpyDeviceToHost,
            direction: consts::cudaMemcpyDeviceToHost,
        })
        .unwrap();
    assert_eq!(back.dst.as_deref(), Some(&pattern[..]));

    // Copies reach only the allocation: past its end, beside it, below the arena, into the
    // server's device memory, with a direction that is not host<->device.
    let bad = [
        pinned(dev, a.host, 5001, consts::cudaMemcpyHostToDevice),
        pinned(dev, a.host + 8192, 16, consts::cudaMemcpyHostToDevice),
        pinned(dev, BASE - 4096, 16, consts::cudaMemcpyDeviceToHost),
        pinned(dev, dev, 16, consts::cudaMemcpyDeviceToHost),
        pinned(dev, a.host, 16, consts::cudaMemcpyDeviceToDevice),
    ];
    for req in &bad {
        assert!(g.call(req).is_err(), "{:#x}+{}", req.host, req.count);
    }
    // Device side checked as for any copy.
    assert_eq!(
        g.call(&pinned(dev + 8192, a.host, 16, consts::cudaMemcpyDeviceToHost)).unwrap_err(),
        CudaError::InvalidValue.0
    );
    // Sizes, flags and frees.
    assert!(g.call(&PhosHostAllocRequest { size: 1 << 40, flags: 0 }).is_err());
    assert_eq!(g.call(&PhosHostAllocRequest { size: 4096, flags: 0x80 }).unwrap_err(), CudaError::InvalidValue.0);
    assert_eq!(g.call(&PhosHostAllocRequest { size: 0, flags: 0 }).unwrap_err(), CudaError::InvalidValue.0);
    assert_eq!(g.call(&PhosHostFreeRequest { host: a.host + 8 }).unwrap_err(), CudaError::InvalidValue.0);

    // A second channel bringing another file changes nothing: the first arena stays.
    let other = host_arena::create(4 << 20).unwrap();
    let mut g2 = RawGuest::connect_shm(&router.socket(), Some(g.welcome.token), Some(&other)).expect("channel");
    let b = g2.call(&PhosHostAllocRequest { size: 4096, flags: 0 }).expect("still the first arena");
    assert!(b.host >= BASE && b.host + 4096 <= BASE + (8 << 20));
    assert!(router.server_logs().contains("a different pinned arena"), "{}", router.server_logs());

    g.call(&PhosHostFreeRequest { host: a.host }).expect("free");
    assert_eq!(g.call(&PhosHostFreeRequest { host: a.host }).unwrap_err(), CudaError::InvalidValue.0);
    assert!(g.call(&pinned(dev, a.host, 16, consts::cudaMemcpyHostToDevice)).is_err(), "a freed range");
    // Still serving; other sessions unaffected.
    g.call(&CudaFreeRequest { devPtr: dev }).unwrap();
    let mut third = RawGuest::connect(&router.socket(), None).expect("another session");
    malloc(&mut third, 1024);
    // A session on the socket has no arena: pinned memory stays the guest's.
    assert_eq!(third.call(&PhosHostAllocRequest { size: 4096, flags: 0 }).unwrap_err(), CudaError::NotSupported.0);
}

/// CUDA arrays and texture objects from a guest that lies: extents, corners and pitches that
/// do not fit, accounted sizes that are not the layout's, handles and object values that are
/// not the session's. Each gets its error; the session's array is untouched, and another
/// session cannot reach its texture object.
#[test]
fn arrays_and_textures_that_do_not_fit() {
    use phos_protocol::types::{ChannelFormatDesc, ResourceViewWire, TextureDescWire};
    let (router, mut g) = open();
    let float = ChannelFormatDesc { x: 32, y: 0, z: 0, w: 0, f: 2 };
    let create = |g: &mut RawGuest, desc, width, height, depth, bytes| {
        g.call(&PhosArrayCreateRequest { desc, width, height, depth, flags: 0, bytes }).map(|r| r.array)
    };
    // The layout of 8x4 floats is 128 bytes: another figure would cheat the router's accounting.
    assert_eq!(create(&mut g, float, 8, 4, 0, 16), Err(CudaError::InvalidValue.0));
    assert!(router.server_logs().contains("not the 16 its request accounted"), "{}", router.server_logs());
    assert_eq!(create(&mut g, float, 1 << 40, 4, 0, u64::MAX), Err(CudaError::InvalidValue.0));
    let odd = ChannelFormatDesc { x: 8, y: 16, z: 0, w: 0, f: 1 };
    assert_eq!(create(&mut g, odd, 8, 4, 0, 96), Err(CudaError::InvalidChannelDescriptor.0));
    let array = create(&mut g, float, 8, 4, 0, 128).expect("a valid array");
    let rows: Vec<u8> = (0..128u8).collect();
    let to_array = |g: &mut RawGuest, array, [x, y, z]: [u64; 3], [w, h, d]: [u64; 3], src: &[u8]| {
        g.call(&PhosMemcpyToArrayRequest {
            dst: array,
            x,
            y,
            z,
            src: Ptr::In(src),
            spitch: w,
            sslice: w * h,
            width: w,
            height: h,
            depth: d,
            direction: consts::cudaMemcpyHostToDevice,
            stream: 0,
            ordered: 0,
        })
        .map(|_| ())
    };
    to_array(&mut g, array, [0, 0, 0], [32, 4, 1], &rows).expect("the whole array");
    for (corner, extent) in [
        ([4u64, 0, 0], [32u64, 1, 1]),     // past the row
        ([2, 0, 0], [4, 1, 1]),            // half an element
        ([0, 3, 0], [32, 2, 1]),           // past the rows
        ([0, 0, 1], [32, 1, 1]),           // past the slices
        ([u64::MAX - 3, 0, 0], [4, 1, 1]), // wrapping
    ] {
        let n = (extent[0] * extent[1] * extent[2]) as usize;
        assert_eq!(to_array(&mut g, array, corner, extent, &rows[..n]), Err(CudaError::InvalidValue.0), "{corner:?}");
    }
    let stream = g.call(&CudaStreamCreateRequest {}).expect("a stream").pStream;
    assert_eq!(to_array(&mut g, stream, [0, 0, 0], [4, 1, 1], &rows[..4]), Err(CudaError::InvalidResourceHandle.0));
    // A texture of linear memory outside the session, a resource type and an address mode CUDA
    // does not have, a value that is no texture of the session's.
    let texture = |g: &mut RawGuest, res_type, dev_ptr, address| {
        let desc = TextureDescWire { address_mode: [address; 3], ..Default::default() };
        g.call(&PhosTextureCreateRequest {
            resType: res_type,
            array,
            mipmap: 0,
            devPtr: dev_ptr,
            desc: float,
            width: 0,
            height: 0,
            pitch: 0,
            sizeInBytes: 4096,
            texDesc: desc,
            hasView: 0,
            view: ResourceViewWire::default(),
        })
        .map(|r| r.texObject)
    };
    assert_eq!(texture(&mut g, 2, 0x5555_0000_0000, 0), Err(CudaError::InvalidValue.0));
    assert_eq!(texture(&mut g, 9, 0, 0), Err(CudaError::InvalidValue.0));
    assert_eq!(texture(&mut g, 0, 0, 17), Err(CudaError::InvalidValue.0));
    let t = texture(&mut g, 0, 0, 1).expect("a texture of the array");
    assert_eq!(
        g.call(&CudaDestroyTextureObjectRequest { texObject: t + 1000 }).unwrap_err(),
        CudaError::InvalidValue.0
    );
    // Another session cannot destroy this one's object, nor name its array.
    let mut other = RawGuest::connect(&router.socket(), None).expect("another session");
    assert_eq!(other.call(&CudaDestroyTextureObjectRequest { texObject: t }).unwrap_err(), CudaError::InvalidValue.0);
    assert_eq!(other.call(&PhosArrayGetInfoRequest { array }).unwrap_err(), CudaError::InvalidResourceHandle.0);
    // The array is as it was written.
    let back = g
        .call(&PhosMemcpyFromArrayRequest {
            dst: Ptr::Out(128),
            dpitch: 32,
            dslice: 128,
            src: array,
            x: 0,
            y: 0,
            z: 0,
            width: 32,
            height: 4,
            depth: 1,
            direction: consts::cudaMemcpyDeviceToHost,
            stream: 0,
            ordered: 0,
        })
        .expect("a copy back")
        .dst;
    assert_eq!(back.as_deref(), Some(&rows[..]));
    let logs = router.server_logs();
    for line in ["does not fit a CUDA array", "cudaCreateTextureObject: refused", "is no object of the session's"] {
        assert!(logs.contains(line), "the refusal is logged ({line}): {logs}");
    }
    g.call(&CudaDestroyTextureObjectRequest { texObject: t }).expect("its own texture");
    g.call(&CudaFreeArrayRequest { array }).expect("its own array");
}

/// An async call sent again flagged as resent (what the guest library does after a cut
/// channel) that has already run in the session is acknowledged without running again; one
/// that never ran runs; an id sent again without the flag is an ordinary call.
#[test]
fn a_resent_async_call_that_ran_is_acknowledged_without_running_again() {
    use phos_protocol::frame::{FLAG_ASYNC, FLAG_RESENT, FrameHeader, FrameKind};
    use phos_protocol::transport::Transport;
    let (_router, mut g) = open();
    let session = g.welcome.session;
    // A call that fails each time it runs (a stream that does not exist): the failures the
    // acknowledgement counts say how many times it ran.
    let failing = phos_protocol::encode(&CudaStreamSynchronizeRequest { stream: 0xdead_beef });
    let get_count = phos_protocol::encode(&CudaGetDeviceCountRequest {});
    // Sends `ids` async with `flags`, then a synchronous call `sync`: the acknowledgement
    // before its reply, as (last id, status, calls that failed).
    let mut round = |ids: &[u64], flags: u16, sync: u64| {
        for &id in ids {
            let mut h = FrameHeader::new(FrameKind::Call);
            h.function = FunctionId::CudaStreamSynchronize as u32;
            h.session = session;
            h.call_id = id;
            h.flags = FLAG_ASYNC | flags;
            h.payload_len = failing.len() as u64;
            g.transport.send(&h, &[&failing]).unwrap();
        }
        let mut h = FrameHeader::new(FrameKind::Call);
        h.function = FunctionId::CudaGetDeviceCount as u32;
        h.session = session;
        h.call_id = sync;
        h.payload_len = get_count.len() as u64;
        g.transport.send(&h, &[&get_count]).unwrap();
        let mut buf = Vec::new();
        let ack = g.transport.recv(&mut buf).unwrap();
        assert_eq!((ack.kind, ack.flags), (FrameKind::Reply, FLAG_ASYNC), "an acknowledgement");
        let failed = u64::from_le_bytes(buf[..8].try_into().unwrap());
        let reply = g.transport.recv(&mut buf).unwrap();
        assert_eq!((reply.kind, reply.call_id, reply.status), (FrameKind::Reply, sync, 0));
        (ack.call_id, ack.status, failed)
    };
    let bad = CudaError::InvalidResourceHandle.0;
    assert_eq!(round(&[100], 0, 200), (100, bad, 1), "the call runs");
    assert_eq!(round(&[100, 150], FLAG_RESENT, 201), (150, bad, 1), "only the resent call that never ran runs");
    assert_eq!(round(&[100, 150], FLAG_RESENT, 202), (150, 0, 0), "both ran already");
    assert_eq!(round(&[100], 0, 203), (100, bad, 1), "not flagged as resent: an ordinary call");
}

/// A synchronous call the server ran whose reply was lost with its connection (a VM's vsock
/// device unplugged, a relay cut) is sent again by the guest on a new channel, with its id
/// and flagged as resent: it is answered with the reply the server kept, without running
/// again, however many times it comes (a cudaMalloc sent three times allocates once). One
/// that never ran runs; one of another function under a kept id is not that call, and runs.
#[test]
fn a_resent_synchronous_call_that_ran_is_answered_without_running_again() {
    use phos_protocol::frame::FLAG_RESENT;
    const SIZE: u64 = 4 << 20;
    let (router, mut a) = open();
    let token = a.welcome.token;
    let join = || RawGuest::connect(&router.socket(), Some(token)).expect("join with the token");
    let mut watch = join();
    let free = |g: &mut RawGuest| g.call(&CudaMemGetInfoRequest {}).expect("cudaMemGetInfo").free;
    let before = free(&mut watch);
    // The first sending runs; its connection is cut before the reply is read.
    a.send_as(&CudaMallocRequest { size: SIZE }, 500, 0).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while free(&mut watch) == before {
        assert!(std::time::Instant::now() < deadline, "the first sending never ran");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    drop(a);
    let mut b = join();
    b.send_as(&CudaMallocRequest { size: SIZE }, 500, FLAG_RESENT).unwrap();
    let p = b.reply_to::<CudaMallocRequest>(500).expect("answered").devPtr;
    assert_ne!(p, 0);
    // Cut again after its answer was sent: a third sending gets the same answer.
    drop(b);
    let mut c = join();
    c.send_as(&CudaMallocRequest { size: SIZE }, 500, FLAG_RESENT).unwrap();
    assert_eq!(c.reply_to::<CudaMallocRequest>(500).expect("answered").devPtr, p);
    c.call(&CudaFreeRequest { devPtr: p }).expect("its one allocation");
    assert_eq!(free(&mut c), before, "allocated once");
    // Never ran: it runs (and only once, sent again on its own channel).
    c.send_as(&CudaMallocRequest { size: SIZE }, 600, FLAG_RESENT).unwrap();
    let q = c.reply_to::<CudaMallocRequest>(600).expect("runs").devPtr;
    c.send_as(&CudaMallocRequest { size: SIZE }, 600, FLAG_RESENT).unwrap();
    assert_eq!(c.reply_to::<CudaMallocRequest>(600).expect("answered").devPtr, q);
    // Another function under that id: runs (a double free fails as it should).
    c.send_as(&CudaFreeRequest { devPtr: q }, 600, FLAG_RESENT).unwrap();
    c.reply_to::<CudaFreeRequest>(600).expect("freed");
    c.send_as(&CudaFreeRequest { devPtr: q }, 600, FLAG_RESENT).unwrap();
    c.reply_to::<CudaFreeRequest>(600).expect("a free sent again is answered as the first was");
    assert_eq!(free(&mut c), before);
    let logs = router.server_logs();
    assert!(logs.contains("a resent cudaMalloc had run before: answered with its kept reply"), "{logs}");
}

/// IPC handles are the guest's bytes: random ones, Phos-shaped ones with guessed keys or
/// session ids (the exporting session's among them), and closes of what was never opened
/// are refused; the exporter's memory and its later opens are untouched.
#[test]
fn forged_ipc_handles_open_nothing() {
    use phos_protocol::types::IpcHandle;
    let (router, mut exporter) = open();
    let mem = malloc(&mut exporter, 1 << 20);
    exporter.call(&CudaMemsetRequest { devPtr: mem, value: 0x42, count: 1 << 20 }).unwrap();
    let real = exporter.call(&CudaIpcGetMemHandleRequest { devPtr: mem }).unwrap().handle;
    let mut g = RawGuest::connect(&router.socket(), None).expect("session");
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let refused = [CudaError::InvalidValue.0, CudaError::MapBufferObjectFailed.0];
    for round in 0..200 {
        let mut h = IpcHandle::default();
        match round % 4 {
            // Any bytes.
            0 => h.reserved.iter_mut().for_each(|b| *b = next() as u8),
            // The real handle with one bit flipped.
            1 => {
                h = real;
                let bit = next() as usize % 512;
                h.reserved[bit / 8] ^= 1 << (bit % 8);
            }
            // Phos's shape, the exporter's session, a guessed key.
            2 => {
                h = real;
                h.reserved[24..40].iter_mut().for_each(|b| *b = next() as u8);
            }
            // Phos's shape, the right key, sessions that are not the exporter.
            _ => {
                h = real;
                let session = [0, u64::MAX, next(), g.welcome.session][(round / 4) % 4];
                if session == exporter.welcome.session {
                    continue;
                }
                h.reserved[16..24].copy_from_slice(&session.to_le_bytes());
            }
        }
        if h == real {
            continue;
        }
        let r = g.call(&CudaIpcOpenMemHandleRequest { handle: h, flags: 0 });
        let e = r.expect_err("a forged handle opened memory");
        let own = CudaError::DeviceUninitialized.0;
        assert!(refused.contains(&e) || e == own, "round {round}: {e}");
        assert!(g.call(&CudaIpcOpenEventHandleRequest { handle: h }).is_err(), "round {round}");
    }
    for addr in [0, mem, 0x1000, u64::MAX - 8] {
        assert!(g.call(&CudaIpcCloseMemHandleRequest { devPtr: addr }).is_err());
    }
    // The real handle still opens the exporter's bytes, untouched.
    let p = g.call(&CudaIpcOpenMemHandleRequest { handle: real, flags: 1 }).unwrap().devPtr;
    let back = g
        .call(&CudaMemcpyRequest {
            dst: Ptr::Out(1 << 20),
            src: Ptr::Device(p),
            count: 1 << 20,
            kind: consts::cudaMemcpyDeviceToHost,
            direction: consts::cudaMemcpyDeviceToHost,
        })
        .unwrap();
    assert!(back.dst.unwrap().iter().all(|&b| b == 0x42));
    g.call(&CudaIpcCloseMemHandleRequest { devPtr: p }).unwrap();
}

/// A guest built before cudnnSetTensor's value was sized by the tensor's type sends the
/// retired id 315 (a float always): the server serves it with id 366's handler, so it still
/// fills a float tensor; a double tensor (whose value must be a double) is refused as 366
/// refuses a float for it.
#[test]
fn a_retired_cudnn_set_tensor_is_served_by_its_successor() {
    use phos_protocol::cudnn as dnn;
    let (_router, mut g) = open();
    let session = g.welcome.session;
    let handle = g.call(&dnn::CudnnCreateRequest {}).expect("cudnnCreate").handle;
    let desc = g.call(&dnn::CudnnCreateTensorDescriptorRequest {}).expect("create").tensorDesc;
    let set = |g: &mut RawGuest, data_type: i32| {
        let req = dnn::CudnnSetTensor4dDescriptorRequest {
            tensorDesc: desc,
            format: 0,
            dataType: data_type,
            n: 1,
            c: 1,
            h: 2,
            w: 2,
        };
        g.call(&req).expect("set")
    };
    set(&mut g, 0);
    let y = malloc(&mut g, 32);
    // The old request: handle, yDesc, y and the value's bytes, no size (a struct's fields
    // encode as the tuple of them).
    let old = |g: &mut RawGuest, value: &[u8]| {
        let payload = phos_protocol::encode(&(handle, desc, y, value));
        g.call_raw_api(phos_protocol::apis::Api::Cudnn.id(), 315, session, &payload).unwrap().status
    };
    assert_eq!(old(&mut g, &1.5f32.to_le_bytes()), 0, "served");
    let r = g
        .call(&CudaMemcpyRequest {
            dst: Ptr::Out(16),
            src: Ptr::Device(y),
            count: 16,
            kind: consts::cudaMemcpyDeviceToHost,
            direction: consts::cudaMemcpyDeviceToHost,
        })
        .expect("read back");
    let values: Vec<f32> =
        r.dst.unwrap_or_default().chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
    assert_eq!(values, [1.5; 4]);
    // A double tensor takes a double: 4 bytes are refused, as by id 366.
    set(&mut g, 1);
    assert_eq!(old(&mut g, &1.5f32.to_le_bytes()), dnn::CudnnStatus::BAD_PARAM.0);
    // Malformed: refused, and the session serves on.
    assert_ne!(g.call_raw_api(phos_protocol::apis::Api::Cudnn.id(), 315, session, &[1, 2, 3]).unwrap().status, 0);
    g.call(&dnn::CudnnDestroyRequest { handle }).expect("cudnnDestroy");
}

/// The guest's pool of tensor descriptors: a parked descriptor is refused by every call until
/// it is made again, fresh (no shape), under the same handle; a park or reinit of what is not
/// a live tensor descriptor fails the next synchronous cuDNN call.
#[test]
fn a_parked_cudnn_tensor_descriptor_is_refused_until_made_again() {
    use phos_protocol::cudnn as dnn;
    let (router, mut g) = open();
    let desc = g.call(&dnn::CudnnCreateTensorDescriptorRequest {}).expect("create").tensorDesc;
    let set =
        dnn::CudnnSetTensor4dDescriptorRequest { tensorDesc: desc, format: 0, dataType: 0, n: 1, c: 2, h: 3, w: 4 };
    g.call(&set).expect("set");
    let size = |g: &mut RawGuest| g.call(&dnn::CudnnGetTensorSizeInBytesRequest { tensorDesc: desc }).map(|r| r.size);
    assert_eq!(size(&mut g), Ok(96));
    g.call(&dnn::PhosCudnnTensorDescriptorParkRequest { tensorDesc: desc }).expect("park");
    assert_eq!(size(&mut g), Err(dnn::CudnnStatus::BAD_PARAM.0), "parked: as destroyed");
    assert_eq!(g.call(&set).unwrap_err(), dnn::CudnnStatus::BAD_PARAM.0);
    g.call(&dnn::PhosCudnnTensorDescriptorReinitRequest { tensorDesc: desc }).expect("reinit");
    assert_eq!(size(&mut g), Err(dnn::CudnnStatus::BAD_PARAM.0), "fresh: no shape");
    g.call(&set).expect("set again");
    assert_eq!(size(&mut g), Ok(96));
    // A reinit of a made-up handle: answered (it goes without waiting), logged, and returned
    // by the next synchronous call.
    g.call(&dnn::PhosCudnnTensorDescriptorReinitRequest { tensorDesc: desc + 0x100 }).expect("answered");
    assert_eq!(size(&mut g), Err(dnn::CudnnStatus::BAD_PARAM.0), "the kept failure");
    assert_eq!(size(&mut g), Ok(96));
    assert!(router.server_logs().contains("phosCudnnTensorDescriptorReinit"), "{}", router.server_logs());
    g.call(&dnn::CudnnDestroyTensorDescriptorRequest { tensorDesc: desc }).expect("destroy");
}

/// The guest's pool of variant packs: a parked pack is refused by every call until it is made
/// again, fresh (no attributes, not finalized), under the same handle; a park or reinit of what
/// is not a variant pack of the session (another type, a made-up handle, one not parked, one
/// another descriptor refers to) changes nothing and fails the next synchronous cuDNN call.
#[test]
fn a_parked_cudnn_variant_pack_is_refused_until_made_again() {
    use phos_protocol::cudnn as dnn;
    enum ParkOrReinit {
        Park(u64),
        Reinit(u64),
    }
    let (router, mut g) = open();
    let create = |g: &mut RawGuest, ty: i32| {
        g.call(&dnn::CudnnBackendCreateDescriptorRequest { descriptorType: ty }).expect("create").descriptor
    };
    let (pack, tensor) = (create(&mut g, 16), create(&mut g, 17));
    let uids = 7i64.to_le_bytes();
    let set = dnn::CudnnBackendSetAttributeRequest {
        descriptor: pack,
        attributeName: 1000,
        attributeType: dnn::consts::CUDNN_TYPE_INT64,
        elementCount: 1,
        arrayOfElements: phos_protocol::Ptr::In(&uids),
    };
    let get = |g: &mut RawGuest| {
        let req = dnn::CudnnBackendGetAttributeRequest {
            descriptor: pack,
            attributeName: 1000,
            attributeType: dnn::consts::CUDNN_TYPE_INT64,
            requestedElementCount: 1,
            wanted: 1,
            arrayOfElements: phos_protocol::Ptr::InOut(&[0; 8]),
        };
        g.call(&req).map(|r| r.elementCount)
    };
    g.call(&set).expect("set");
    assert_eq!(get(&mut g), Ok(1));
    g.call(&dnn::PhosCudnnVariantPackParkRequest { variantPack: pack }).expect("park");
    assert_eq!(get(&mut g), Err(dnn::CudnnStatus::BAD_PARAM.0), "parked: as destroyed");
    assert_eq!(g.call(&set).unwrap_err(), dnn::CudnnStatus::BAD_PARAM.0);
    let destroy = dnn::CudnnBackendDestroyDescriptorRequest { descriptor: pack };
    assert_eq!(g.call(&destroy).unwrap_err(), dnn::CudnnStatus::BAD_PARAM.0, "parked: not destroyed");
    g.call(&dnn::PhosCudnnVariantPackReinitRequest { variantPack: pack }).expect("reinit");
    assert_eq!(get(&mut g), Err(dnn::CudnnStatus::NOT_SUPPORTED.0), "fresh: not set (emu has no cuDNN to ask)");
    g.call(&set).expect("set again");
    assert_eq!(get(&mut g), Ok(1));
    // What is not a parked (for a reinit) or live, unreferred (for a park) variant pack of the
    // session: answered (it goes without waiting), logged, the failure returned by the next
    // synchronous call, and nothing changed.
    for bad in [
        ParkOrReinit::Reinit(pack),
        ParkOrReinit::Reinit(tensor),
        ParkOrReinit::Park(tensor),
        ParkOrReinit::Park(pack + 0x100),
    ] {
        let answered = match bad {
            ParkOrReinit::Park(d) => g.call(&dnn::PhosCudnnVariantPackParkRequest { variantPack: d }).map(|_| ()),
            ParkOrReinit::Reinit(d) => g.call(&dnn::PhosCudnnVariantPackReinitRequest { variantPack: d }).map(|_| ()),
        };
        answered.expect("answered");
        assert_eq!(get(&mut g), Err(dnn::CudnnStatus::BAD_PARAM.0), "the kept failure");
        assert_eq!(get(&mut g), Ok(1), "the pack as it was");
    }
    // A pack another descriptor names is kept for it: not parked.
    let named = pack.to_le_bytes();
    let refer = dnn::CudnnBackendSetAttributeRequest {
        descriptor: tensor,
        attributeName: 801,
        attributeType: dnn::consts::CUDNN_TYPE_BACKEND_DESCRIPTOR,
        elementCount: 1,
        arrayOfElements: phos_protocol::Ptr::In(&named),
    };
    g.call(&refer).expect("a tensor naming the pack (emu keeps what it is given)");
    g.call(&dnn::PhosCudnnVariantPackParkRequest { variantPack: pack }).expect("answered");
    assert_eq!(get(&mut g), Err(dnn::CudnnStatus::BAD_PARAM.0), "the kept failure");
    assert_eq!(get(&mut g), Ok(1), "referred to: not parked");
    assert!(router.server_logs().contains("phosCudnnVariantPackPark"), "{}", router.server_logs());
    assert!(router.server_logs().contains("phosCudnnVariantPackReinit"), "{}", router.server_logs());
}
