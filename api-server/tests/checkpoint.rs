//! Checkpoint and restore of a session on the emu backend, in process: objects come back with
//! the same handles and addresses, memory and module variables with the same contents, and a
//! bad image is refused before anything is created.

use std::sync::Arc;

use phos_api_server::backend::emu::EmuBackend;
use phos_api_server::checkpoint::{Bounds, Progress, Stopped};
use phos_api_server::control::SessionFactory;
use phos_api_server::dispatch::cudart::dispatch;
use phos_api_server::output::DeviceOutput;
use phos_api_server::service::{CallCx, Session};
use phos_checkpoint::{Compression, SessionMeta};
use phos_control::{Cancel, Waiting};
use phos_protocol::cudart::*;
use phos_protocol::limits::SessionLimits;
use phos_protocol::types::Dim3;
use phos_protocol::{Ptr, RemoteCall};
use sha2::{Digest, Sha256};

const PTX: &str = r#".version 7.0
.target sm_70
.address_size 64

.global .align 4 .u32 counter = 5;

.visible .entry bump(.param .u64 data, .param .u32 n)
{
	.reg .pred %p<2>;
	.reg .b32 %r<6>;
	.reg .b64 %rd<5>;
	ld.param.u64 %rd1, [data];
	ld.param.u32 %r1, [n];
	mov.u32 %r2, %tid.x;
	setp.ge.u32 %p1, %r2, %r1;
	@%p1 bra DONE;
	cvta.to.global.u64 %rd2, %rd1;
	mul.wide.u32 %rd3, %r2, 4;
	add.s64 %rd4, %rd2, %rd3;
	ld.global.u32 %r3, [%rd4];
	ld.global.u32 %r4, [counter];
	add.s32 %r5, %r3, %r4;
	st.global.u32 [%rd4], %r5;
DONE:
	ret;
}
"#;

// Tests reserve fixed ranges below 0x5555_0000_0000: position-independent executables and their
// heaps load at random addresses between 0x5555_5555_4000 and 0x5655_5555_4000.
fn session(base: u64) -> Session {
    factory(base).fresh(1).unwrap()
}

/// A server's way of making sessions in `[base, base + 16 GiB)` on a fresh emulated device.
fn factory(base: u64) -> SessionFactory {
    SessionFactory {
        backend: Arc::new(EmuBackend::new(1 << 30)),
        device_base: base,
        device_size: 1 << 34,
        max_reply: 1 << 30,
        output: Arc::new(DeviceOutput::default),
        limits: SessionLimits::default(),
    }
}

/// What the router tells a checkpoint about the session.
fn meta() -> SessionMeta {
    SessionMeta { token: [3; 16], tenant: "uid:0".into(), abi_major: 12, ..Default::default() }
}

fn restore(
    dir: &std::path::Path,
    base: u64,
) -> Result<(Session, SessionMeta, phos_api_server::checkpoint::RestoreReport), Stopped> {
    Session::restore(dir, &factory(base), None, &Progress::default(), &Cancel::default())
}

fn call<R: RemoteCall>(s: &Session, req: &R) -> R::Reply {
    let mut out = Vec::new();
    let phos_protocol::apis::Function::Cudart(id) = R::FUNCTION else { panic!("{} is no runtime call", R::FUNCTION) };
    dispatch(s, &CallCx::new(0), id, &phos_protocol::encode(req), &mut out)
        .unwrap_or_else(|e| panic!("{:?}: {e}", R::FUNCTION));
    phos_protocol::decode(&out).unwrap()
}

fn read(s: &Session, addr: u64, n: u64) -> Vec<u8> {
    call(
        s,
        &CudaMemcpyRequest {
            dst: Ptr::Out(n),
            src: Ptr::Device(addr),
            count: n,
            kind: consts::cudaMemcpyDeviceToHost,
            direction: consts::cudaMemcpyDeviceToHost,
        },
    )
    .dst
    .unwrap()
}

fn write(s: &Session, addr: u64, data: &[u8]) {
    call(
        s,
        &CudaMemcpyRequest {
            dst: Ptr::Device(addr),
            src: Ptr::In(data),
            count: data.len() as u64,
            kind: consts::cudaMemcpyHostToDevice,
            direction: consts::cudaMemcpyHostToDevice,
        },
    );
}

struct Built {
    big: u64,
    small: u64,
    freed_then_live: u64,
    stream: u64,
    event: u64,
    module: u64,
    function: u64,
    counter: u64,
    big_data: Vec<u8>,
}

/// A session with some of everything.
fn build(s: &Session) -> Built {
    let big = call(s, &CudaMallocRequest { size: 5 << 20 }).devPtr;
    let doomed = call(s, &CudaMallocRequest { size: 64 }).devPtr;
    let small = call(s, &CudaMallocRequest { size: 4096 }).devPtr;
    call(s, &CudaFreeRequest { devPtr: doomed });
    let freed_then_live = call(s, &CudaMallocRequest { size: 100 }).devPtr;
    let big_data: Vec<u8> = (0..5 << 20).map(|i: u32| (i.wrapping_mul(2654435761) >> 24) as u8).collect();
    // Leave the second half of the big allocation zero: zero chunks are not stored.
    write(s, big, &big_data[..3 << 20]);
    write(s, small, &[7u8; 4096]);
    write(s, freed_then_live, &[1u8; 100]);
    let stream = call(s, &CudaStreamCreateWithFlagsRequest { flags: 1 }).pStream;
    let dead_stream = call(s, &CudaStreamCreateRequest {}).pStream;
    call(s, &CudaStreamDestroyRequest { stream: dead_stream });
    let event = call(s, &CudaEventCreateWithFlagsRequest { flags: 2 }).event;
    let mut image = PTX.as_bytes().to_vec();
    image.push(0);
    let digest = Sha256::digest(&image);
    let module = call(s, &PhosModuleLoadRequest { image: &image, size: image.len() as u64, digest: &digest }).module;
    let function = call(s, &PhosModuleGetFunctionRequest { module, name: "bump" }).function;
    let counter = call(s, &PhosModuleGetGlobalRequest { module, name: "counter" }).address;
    // The variable's value changes after load: the image must carry the new one.
    call(
        s,
        &CudaMemcpyToSymbolRequest {
            src: Ptr::In(&9u32.to_le_bytes()),
            count: 4,
            offset: 0,
            kind: consts::cudaMemcpyHostToDevice,
            symbol_base: counter,
            symbol_size: 4,
            direction: consts::cudaMemcpyHostToDevice,
        },
    );
    Built { big, small, freed_then_live, stream, event, module, function, counter, big_data }
}

fn launch(s: &Session, function: u64, stream: u64, data: u64, n: u32) {
    let mut params = data.to_le_bytes().to_vec();
    params.extend_from_slice(&n.to_le_bytes());
    call(
        s,
        &PhosLaunchKernelRequest {
            function,
            grid: Dim3::new(1, 1, 1),
            block: Dim3::new(32, 1, 1),
            sharedMem: 0,
            stream,
            params: &params,
            paramSize: params.len() as u64,
        },
    );
}

#[test]
fn a_session_comes_back_whole() {
    let base = 0x4400_0000_0000;
    let dir = tempfile::tempdir().unwrap();
    let s = session(base);
    let b = build(&s);
    let report = s
        .checkpoint(dir.path(), meta(), Compression::Zstd(1), false, &Progress::default(), &Bounds::default())
        .unwrap();
    assert_eq!(report.records, 7, "3 allocations, stream, event, module, function");
    assert!(report.stored_bytes < report.memory_bytes / 2, "{report:?}");
    drop(s);

    let (r, meta, report) = restore(dir.path(), base).unwrap();
    assert_eq!(meta.token, [3; 16]);
    assert_eq!(report.records, 7);
    // Memory at the same addresses, with the same contents.
    assert_eq!(read(&r, b.big, 5 << 20)[..3 << 20], b.big_data[..3 << 20]);
    assert!(read(&r, b.big + (3 << 20), 2 << 20).iter().all(|&x| x == 0));
    assert_eq!(read(&r, b.small, 4096), vec![7u8; 4096]);
    assert_eq!(read(&r, b.freed_then_live, 100), vec![1u8; 100]);
    // Handles keep their values and work.
    call(&r, &CudaStreamSynchronizeRequest { stream: b.stream });
    call(&r, &CudaEventRecordRequest { event: b.event, stream: b.stream });
    // The module variable kept its changed value, and the kernel sees it. Module variables
    // live where the reloaded module puts them (on a GPU the driver chooses), so their
    // address is asked again.
    let counter = call(&r, &PhosModuleGetGlobalRequest { module: b.module, name: "counter" });
    assert_eq!(counter.bytes, 4);
    assert_eq!(read(&r, counter.address, 4), 9u32.to_le_bytes());
    let _ = b.counter;
    write(&r, b.small, &[0u8; 128]);
    launch(&r, b.function, b.stream, b.small, 32);
    assert_eq!(read(&r, b.small, 4), 9u32.to_le_bytes());
    // New objects do not reuse the old handles or addresses.
    let s2 = call(&r, &CudaStreamCreateRequest {}).pStream;
    assert_ne!(s2, b.stream);
    let fresh = call(&r, &CudaMallocRequest { size: 4096 }).devPtr;
    assert!(![b.big, b.small, b.freed_then_live].contains(&fresh));
    // A checkpoint of the restored session holds the same objects again, plus the new ones.
    let dir2 = tempfile::tempdir().unwrap();
    let report =
        r.checkpoint(dir2.path(), meta, Compression::None, false, &Progress::default(), &Bounds::default()).unwrap();
    assert_eq!(report.records, 9);
}

#[test]
fn a_corrupted_image_creates_nothing() {
    let base = 0x4500_0000_0000;
    let dir = tempfile::tempdir().unwrap();
    let s = session(base);
    build(&s);
    s.checkpoint(dir.path(), meta(), Compression::None, false, &Progress::default(), &Bounds::default()).unwrap();
    drop(s);
    let mem = dir.path().join(phos_checkpoint::MEMORY_FILE);
    let mut bytes = std::fs::read(&mem).unwrap();
    bytes[100] ^= 0xff;
    std::fs::write(&mem, &bytes).unwrap();
    let err = restore(dir.path(), base).err().expect("refused");
    assert!(err.to_string().contains("checksum"), "{err}");
    // Nothing was reserved: a session can take the range.
    drop(session(base));
}

#[test]
fn a_stopping_checkpoint_freezes_the_session() {
    let base = 0x4600_0000_0000;
    let dir = tempfile::tempdir().unwrap();
    let s = session(base);
    build(&s);
    s.checkpoint(dir.path(), meta(), Compression::None, true, &Progress::default(), &Bounds::default()).unwrap();
    assert!(s.is_frozen());
}

/// A checkpoint waits for the devices only until its deadline: here a host function whose
/// program never answers keeps work queued on the device. It gives up naming the device,
/// the session carries on, and once the work is done a checkpoint succeeds.
#[test]
fn a_checkpoint_gives_up_on_a_device_that_does_not_come_to_rest() {
    let base = 0x4700_0000_0000;
    let dir = tempfile::tempdir().unwrap();
    let s = session(base);
    build(&s);
    call(&s, &PhosHostFuncEnqueueRequest { stream: 0, gate: 1 });
    let bounds = Bounds { quiesce_timeout: std::time::Duration::from_millis(300), ..Bounds::default() };
    let started = std::time::Instant::now();
    let err = s.checkpoint(dir.path(), meta(), Compression::None, false, &Progress::default(), &bounds).unwrap_err();
    assert!(started.elapsed() < std::time::Duration::from_secs(5), "{:?}", started.elapsed());
    assert!(matches!(err, Stopped::TimedOut { session: 1, waiting_for: Waiting::Device { device: 0 }, .. }), "{err}");
    let err = err.to_string();
    assert!(err.contains("session 1") && err.contains("device 0 to finish the work queued on it"), "{err}");
    assert!(!dir.path().join(phos_checkpoint::MANIFEST_FILE).exists());
    // The session serves; once the host function has run, the device comes to rest.
    call(&s, &PhosHostFuncWaitRequest { gate: 1 });
    call(&s, &PhosHostFuncDoneRequest { gate: 1 });
    s.checkpoint(dir.path(), meta(), Compression::None, false, &Progress::default(), &bounds).unwrap();
    // A checkpoint whose client has gone does not start.
    let gone = Bounds::default();
    gone.cancel.cancel();
    let err = s.checkpoint(dir.path(), meta(), Compression::None, false, &Progress::default(), &gone).unwrap_err();
    assert!(matches!(err, Stopped::Abandoned { session: 1, .. }) && err.to_string().contains("abandoned"), "{err}");
}

/// What this server checks of an image before it creates anything: its own device range,
/// and its limits.
#[test]
fn an_image_this_server_could_not_have_made_is_refused() {
    let base = 0x4800_0000_0000;
    let dir = tempfile::tempdir().unwrap();
    let s = session(base);
    build(&s);
    s.checkpoint(dir.path(), meta(), Compression::None, false, &Progress::default(), &Bounds::default()).unwrap();
    drop(s);
    let cancel = Cancel::default();
    let err = Session::restore(dir.path(), &factory(base + (1 << 36)), None, &Progress::default(), &cancel)
        .err()
        .expect("another range");
    assert!(matches!(&err, Stopped::Refused(why) if why.contains("is not this server's")), "{err}");
    let mut small = factory(base);
    small.limits.set(phos_protocol::limits::LimitKind::Allocations, 2);
    let err = Session::restore(dir.path(), &small, None, &Progress::default(), &cancel).err().expect("over a limit");
    assert!(err.to_string().contains("3 allocations, past this server's limit of 2"), "{err}");
    let err = Session::restore(dir.path(), &factory(base), Some(7), &Progress::default(), &cancel)
        .err()
        .expect("no such device");
    assert!(err.to_string().contains("device 7 does not exist"), "{err}");
    // Nothing was left reserved, and the image itself is good.
    restore(dir.path(), base).unwrap();
}
