//! Checkpoint and restore of a session on the emu backend, in process: objects come back with
//! the same handles and addresses, memory and module variables with the same contents, and a
//! bad image is refused before anything is created; images stream through sockets; the C/R
//! engine's pre-call hook sees what each call touches.

use std::sync::Arc;

use phos_api_server::backend::emu::EmuBackend;
use phos_api_server::checkpoint::{Bounds, Progress};
use phos_api_server::control::SessionFactory;
use phos_api_server::dispatch::cudart::dispatch;
use phos_api_server::output::DeviceOutput;
use phos_api_server::service::{CallCx, Session};
use phos_checkpoint::engine::{CallHook, Intercept, PendingMemory, TrackWrites, Within};
use phos_checkpoint::report::RestoreSummary;
use phos_checkpoint::{
    Compression, CrError, Image, ImageError, ImageWriter, SessionMeta, StreamReader, StreamWriter, copy_image,
};
use phos_control::{Cancel, Waiting};
use phos_protocol::cudart::*;
use phos_protocol::limits::SessionLimits;
use phos_protocol::spec::{CallAccess, DeviceAccess, ObjectAccess, ObjectEffect};
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
        cow_reserve: None,
        runtime_dir: None,
    }
}

/// What the router tells a checkpoint about the session.
fn meta() -> SessionMeta {
    SessionMeta { token: [3; 16], tenant: "uid:0".into(), abi_major: 12, ..Default::default() }
}

fn restore(dir: &std::path::Path, base: u64) -> Result<(Session, SessionMeta, RestoreSummary), CrError> {
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
    assert_restored(&r, &b);
    // A checkpoint of the restored session holds the same objects again, plus the new ones
    // (a stream and an allocation) and the event's last record (a restore records it again).
    let dir2 = tempfile::tempdir().unwrap();
    let report =
        r.checkpoint(dir2.path(), meta, Compression::None, false, &Progress::default(), &Bounds::default()).unwrap();
    assert_eq!(report.records, 10);
}

/// What `build` made, in a restored session: memory at the same addresses with the same
/// contents, handles that keep their values and work, a module variable with its changed
/// value, and new objects that reuse no old handle or address (a stream and an allocation,
/// which stay).
fn assert_restored(r: &Session, b: &Built) {
    // Memory at the same addresses, with the same contents.
    assert_eq!(read(r, b.big, 5 << 20)[..3 << 20], b.big_data[..3 << 20]);
    assert!(read(r, b.big + (3 << 20), 2 << 20).iter().all(|&x| x == 0));
    assert_eq!(read(r, b.small, 4096), vec![7u8; 4096]);
    assert_eq!(read(r, b.freed_then_live, 100), vec![1u8; 100]);
    // Handles keep their values and work.
    call(r, &CudaStreamSynchronizeRequest { stream: b.stream });
    call(r, &CudaEventRecordRequest { event: b.event, stream: b.stream });
    // The module variable kept its changed value, and the kernel sees it. Module variables
    // live where the reloaded module puts them (on a GPU the driver chooses), so their
    // address is asked again.
    let counter = call(r, &PhosModuleGetGlobalRequest { module: b.module, name: "counter" });
    assert_eq!(counter.bytes, 4);
    assert_eq!(read(r, counter.address, 4), 9u32.to_le_bytes());
    let _ = b.counter;
    write(r, b.small, &[0u8; 128]);
    launch(r, b.function, b.stream, b.small, 32);
    assert_eq!(read(r, b.small, 4), 9u32.to_le_bytes());
    // New objects do not reuse the old handles or addresses.
    let s2 = call(r, &CudaStreamCreateRequest {}).pStream;
    assert_ne!(s2, b.stream);
    let fresh = call(r, &CudaMallocRequest { size: 4096 }).devPtr;
    assert!(![b.big, b.small, b.freed_then_live].contains(&fresh));
}

/// A session checkpointed into a socket (the stream received into a directory image as it
/// arrives, on another thread) comes back whole; and the other way, a directory image sent
/// into a socket by one thread is restored straight from the socket. A stream cut short
/// leaves nothing behind.
#[test]
fn a_session_streams_through_a_socket_and_comes_back_whole() {
    use std::os::unix::net::UnixStream;
    let base = 0x4900_0000_0000;
    let dir = tempfile::tempdir().unwrap();
    let s = session(base);
    let b = build(&s);
    let (tx, rx) = UnixStream::pair().unwrap();
    let into = dir.path().to_path_buf();
    let receiver = std::thread::spawn(move || {
        let mut source = StreamReader::open(rx)?;
        let mut image = ImageWriter::create(&into, Compression::None, 1 << 20)?;
        copy_image(&mut source, &mut image, Compression::None)
    });
    let mut sink = StreamWriter::new(tx);
    let report = s
        .checkpoint_to(&mut sink, meta(), Compression::Zstd(1), false, &Progress::default(), &Bounds::default())
        .unwrap();
    drop(sink);
    let received = receiver.join().unwrap().unwrap();
    assert_eq!((report.records, report.memory_bytes), (7, received.memory_bytes));
    drop(s);
    let (r, _, _) = restore(dir.path(), base).unwrap();
    assert_restored(&r, &b);
    drop(r);

    let send = |cut_at: Option<usize>| {
        let (tx, rx) = UnixStream::pair().unwrap();
        let from = dir.path().to_path_buf();
        let sender = std::thread::spawn(move || {
            let mut bytes = Vec::new();
            let mut sink = StreamWriter::new(&mut bytes);
            copy_image(&mut Image::open(&from).unwrap(), &mut sink, Compression::None).unwrap();
            drop(sink);
            let n = cut_at.unwrap_or(bytes.len()).min(bytes.len());
            // The peer may stop reading (a refused stream): the rest is not sent.
            let _ = std::io::Write::write_all(&mut &tx, &bytes[..n]);
        });
        (rx, sender)
    };
    let (rx, sender) = send(None);
    let mut source = StreamReader::open(rx).unwrap();
    let (r, meta, summary) =
        Session::restore_from(&mut source, &factory(base), None, &Progress::default(), &Cancel::default()).unwrap();
    sender.join().unwrap();
    assert_eq!((meta.token, summary.records), ([3; 16], 7));
    assert_restored(&r, &b);
    drop(r);

    // Cut in the middle of its memory: refused, and the range is free again.
    let (rx, sender) = send(Some(2 << 20));
    let mut source = StreamReader::open(rx).unwrap();
    let err = Session::restore_from(&mut source, &factory(base), None, &Progress::default(), &Cancel::default())
        .err()
        .expect("a stream cut short");
    sender.join().unwrap();
    assert!(matches!(err, CrError::Image(ImageError::Truncated(_))), "{err}");
    drop(session(base));
}

#[test]
fn a_corrupted_image_creates_nothing() {
    let base = 0x4500_0000_0000;
    let dir = tempfile::tempdir().unwrap();
    let s = session(base);
    build(&s);
    s.checkpoint(dir.path(), meta(), Compression::None, false, &Progress::default(), &Bounds::default()).unwrap();
    drop(s);
    // The memory is spread over `memory` and `memory.N`, one per writer thread, as the
    // threads took the chunks: corrupt the middle of the largest, which holds chunk data.
    let mem = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with(phos_checkpoint::MEMORY_FILE))
        .max_by_key(|p| std::fs::metadata(p).unwrap().len())
        .expect("a memory file");
    let mut bytes = std::fs::read(&mem).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0xff;
    std::fs::write(&mem, &bytes).unwrap();
    let err = restore(dir.path(), base).err().expect("refused");
    assert!(matches!(&err, CrError::Image(ImageError::Corrupted(why)) if why.contains("checksum")), "{err}");
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

/// A parked checkpoint without `stop` (its process is dumped and left running) freezes the
/// session at the cut, cutting the channels of the calls that come, and the image is whole
/// while it stays so; a thaw serves it again, its channels held no longer.
#[test]
fn a_parked_checkpoint_holds_the_session_at_its_cut_until_thawed() {
    let base = 0x6a00_0000_0000;
    for mode in [
        phos_checkpoint::report::CheckpointMode::CopyOnWrite,
        phos_checkpoint::report::CheckpointMode::StopTheWorld,
        phos_checkpoint::report::CheckpointMode::Recopy,
    ] {
        let dir = tempfile::tempdir().unwrap();
        let s = session(base);
        let b = build(&s);
        let how = phos_api_server::checkpoint::How { mode, park: true, ..concurrently() };
        let summary =
            s.checkpoint_as(dir.path(), meta(), Compression::None, how, &Progress::default(), &Bounds::default());
        assert!(!summary.unwrap().stopped, "{mode:?}");
        assert!(s.is_frozen() && s.is_cutting(), "{mode:?}");
        s.thaw();
        assert!(!s.is_frozen() && !s.is_cutting(), "{mode:?}");
        drop(s);
        let (r, _, _) = restore(dir.path(), base).unwrap();
        assert_restored(&r, &b);
    }
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
    assert!(matches!(err, CrError::TimedOut { session: 1, waiting_for: Waiting::Device { device: 0 }, .. }), "{err}");
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
    assert!(matches!(err, CrError::Abandoned { session: 1, .. }) && err.to_string().contains("abandoned"), "{err}");
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
    let impossible = |e: &CrError, why: &str| matches!(e, CrError::Image(ImageError::Impossible(w)) if w.contains(why));
    assert!(impossible(&err, "is not this server's"), "{err}");
    let mut small = factory(base);
    small.limits.set(phos_protocol::limits::LimitKind::Allocations, 2);
    let err = Session::restore(dir.path(), &small, None, &Progress::default(), &cancel).err().expect("over a limit");
    assert!(impossible(&err, "3 allocations, past this server's limit of 2"), "{err}");
    let err = Session::restore(dir.path(), &factory(base), Some(7), &Progress::default(), &cancel)
        .err()
        .expect("no such device");
    assert!(matches!(err, CrError::NoSuchDevice { device: 7, devices: 1 }), "{err}");
    // Nothing was left reserved, and the image itself is good.
    restore(dir.path(), base).unwrap();
}

/// On two emulated devices: a session with memory on both is refused a target device (which
/// of them would go there?), and restores as it is without one, each allocation on the
/// device it was made on; a session on device 1 alone restored onto device 0 still names
/// device 1, and its memory is device 0's.
#[test]
fn a_session_on_several_devices_moves_only_as_it_is() {
    let base = 0x5300_0000_0000;
    let two = || SessionFactory { backend: Arc::new(EmuBackend::with_devices(1 << 30, 2)), ..factory(base) };
    let on = |device: i32| CallCx::new(device);
    let malloc = |s: &Session, device: i32, size: u64| {
        let mut out = Vec::new();
        let req = CudaMallocRequest { size };
        dispatch(s, &on(device), FunctionId::CudaMalloc, &phos_protocol::encode(&req), &mut out).unwrap();
        phos_protocol::decode::<CudaMallocReply>(&out).unwrap().devPtr
    };
    let device_of = |s: &Session, ptr: u64| {
        let mut out = Vec::new();
        let req = PhosPointerDeviceRequest { ptr };
        dispatch(s, &on(0), FunctionId::PhosPointerDevice, &phos_protocol::encode(&req), &mut out).unwrap();
        phos_protocol::decode::<PhosPointerDeviceReply>(&out).unwrap().device
    };
    let cancel = Cancel::default();
    let dir = tempfile::tempdir().unwrap();
    let s = two().fresh(1).unwrap();
    let (a, b) = (malloc(&s, 0, 4 << 20), malloc(&s, 1, 2 << 20));
    s.checkpoint(dir.path(), meta(), Compression::None, false, &Progress::default(), &Bounds::default()).unwrap();
    drop(s);
    let err = Session::restore(dir.path(), &two(), Some(1), &Progress::default(), &cancel).err().expect("two devices");
    assert!(err.to_string().contains("its objects are on devices [0, 1]"), "{err}");
    let (r, _, _) = Session::restore(dir.path(), &two(), None, &Progress::default(), &cancel).unwrap();
    assert_eq!((device_of(&r, a), device_of(&r, b)), (0, 1));
    let (free0, total) = r.backend().mem_info(0).unwrap();
    assert_eq!((total - free0, total - r.backend().mem_info(1).unwrap().0), (4 << 20, 2 << 20));
    drop(r);

    let dir = tempfile::tempdir().unwrap();
    let s = two().fresh(1).unwrap();
    let c = malloc(&s, 1, 2 << 20);
    s.checkpoint(dir.path(), meta(), Compression::None, false, &Progress::default(), &Bounds::default()).unwrap();
    drop(s);
    let machine = two();
    let (r, _, _) = Session::restore(dir.path(), &machine, Some(0), &Progress::default(), &cancel).unwrap();
    assert_eq!(device_of(&r, c), 1, "the guest's number");
    assert_eq!(r.backend().device_count(), 2);
    // Guest device 1 is the machine's device 0, which holds the memory.
    let used = |d: i32| machine.backend.mem_info(d).map(|(free, total)| total - free).unwrap();
    assert_eq!((used(0), used(1)), (2 << 20, 0));
}

/// How long a test waits for a session's calls to leave before installing a hook.
fn within() -> Within<'static> {
    Within::after(std::time::Duration::from_secs(60))
}

/// What a hook was shown of one call: its function, device ranges and objects.
type Shown = (String, Vec<DeviceAccess>, Vec<ObjectAccess>);

/// A C/R hook that keeps what it is shown, and refuses calls that would write `refused`.
#[derive(Default)]
struct Seen {
    calls: parking_lot::Mutex<Vec<Shown>>,
    refused: Option<u64>,
}

impl CallHook for Seen {
    fn before_call(&self, access: &CallAccess<'_>) -> Result<(), phos_protocol::CudaError> {
        if access.device.iter().any(|d| d.writes && Some(d.addr) == self.refused) {
            return Err(phos_protocol::CudaError::NotReady);
        }
        self.calls.lock().push((access.function.to_string(), access.device.to_vec(), access.objects.to_vec()));
        Ok(())
    }
}

/// While installed, the pre-call hook is shown every call before it runs, with what the spec
/// says it reads and writes (device ranges, with a pointer to const only read) and the
/// objects it names; a kernel launch is shown what its parameters point into and the module
/// variables it uses, each read or written as the kernel's PTX says. Once the hook is gone,
/// nothing is shown.
#[test]
fn the_pre_call_hook_sees_what_each_call_touches() {
    let s = session(0x4a00_0000_0000);
    let b = build(&s);
    let counter = call(&s, &PhosModuleGetGlobalRequest { module: b.module, name: "counter" }).address;
    let doomed = call(&s, &CudaMallocRequest { size: 512 }).devPtr;
    let seen = Arc::new(Seen::default());
    let installed = s.install_hook(seen.clone(), &within()).unwrap();
    assert!(s.install_hook(Arc::new(Seen::default()), &within()).is_err(), "one protocol at a time");
    write(&s, b.small, &[5; 64]);
    read(&s, b.big, 16);
    call(&s, &CudaMemsetAsyncRequest { devPtr: b.freed_then_live, value: 1, count: 100, stream: b.stream });
    launch(&s, b.function, b.stream, b.small, 32);
    call(&s, &CudaFreeRequest { devPtr: doomed });
    let range = |addr, len, writes| DeviceAccess { addr, len, writes };
    let object = |kind, value, effect| ObjectAccess { kind, value, effect };
    let calls = std::mem::take(&mut *seen.calls.lock());
    let want: Vec<(&str, Vec<DeviceAccess>, Vec<ObjectAccess>)> = vec![
        ("cudaMemcpy", vec![range(b.small, 64, true)], vec![]),
        ("cudaMemcpy", vec![range(b.big, 16, false)], vec![]),
        (
            "cudaMemsetAsync",
            vec![range(b.freed_then_live, 100, true)],
            vec![object("stream", b.stream, ObjectEffect::Uses)],
        ),
        (
            "phosLaunchKernel",
            vec![],
            vec![object("function", b.function, ObjectEffect::Uses), object("stream", b.stream, ObjectEffect::Uses)],
        ),
        // The PTX of `bump` stores through `data` and only reads `counter`.
        ("a kernel launch", vec![range(b.small, 4096, true), range(counter, 4, false)], vec![]),
        ("cudaFree", vec![], vec![object("device_memory", doomed, ObjectEffect::Destroys)]),
    ];
    let got: Vec<(&str, Vec<DeviceAccess>, Vec<ObjectAccess>)> =
        calls.iter().map(|(f, d, o)| (f.as_str(), d.clone(), o.clone())).collect();
    assert_eq!(got, want);
    drop(installed);
    write(&s, b.small, &[6; 64]);
    assert!(seen.calls.lock().is_empty(), "a call was shown to a hook that is gone");
}

/// The hook is what the dirty log of concurrent protocols hangs on: with [`TrackWrites`]
/// installed, the memory registry names the allocations and variables written since a
/// round began (copies, sets, kernels), and not those only read.
#[test]
fn the_dirty_log_follows_the_calls_that_write() {
    let s = session(0x4b00_0000_0000);
    let b = build(&s);
    let memory = s.dirty_log();
    let _installed = s.install_hook(Arc::new(TrackWrites(memory.clone())), &within()).unwrap();
    let round = memory.begin_round();
    write(&s, b.small, &[5; 64]);
    read(&s, b.big, 4096);
    let mut written = memory.written_since(round);
    written.sort();
    assert_eq!(written, vec![(b.small, 4096)]);
    let next = memory.begin_round();
    launch(&s, b.function, b.stream, b.freed_then_live, 25);
    let mut written = memory.written_since(next);
    written.sort();
    // `bump` stores through its pointer and only reads `counter` (its PTX says so).
    assert_eq!(written, vec![(b.freed_then_live, 100)], "a kernel writes what it stores through");
    assert_eq!(memory.written_since(round).len(), 2);
}

/// A hook can refuse a call before it runs (on-demand restore holds a call the same way,
/// until what it touches is loaded): the guest gets the hook's error, and nothing changed.
#[test]
fn a_hook_stops_a_call_before_it_runs() {
    let s = session(0x4c00_0000_0000);
    let b = build(&s);
    let hook = Arc::new(Seen { refused: Some(b.small), ..Seen::default() });
    let _installed = s.install_hook(hook, &within()).unwrap();
    let req = CudaMemcpyRequest {
        dst: Ptr::Device(b.small),
        src: Ptr::In(&[9u8; 16]),
        count: 16,
        kind: consts::cudaMemcpyHostToDevice,
        direction: consts::cudaMemcpyHostToDevice,
    };
    let mut out = Vec::new();
    let r = dispatch(&s, &CallCx::new(0), FunctionId::CudaMemcpy, &phos_protocol::encode(&req), &mut out);
    assert!(matches!(r, Err(phos_protocol::Rejection::Failed(phos_protocol::CudaError::NotReady))), "{r:?}");
    assert_eq!(read(&s, b.small, 16), vec![7u8; 16], "the refused copy ran");
    write(&s, b.big, &[1; 16]);
}

/// Wait until a held call asks `pending` for `want` first.
fn wanted(pending: &PendingMemory, want: (u64, u64)) {
    let started = std::time::Instant::now();
    while pending.next_wanted() != Some(want) {
        assert!(started.elapsed() < std::time::Duration::from_secs(10), "no call waits for {want:x?}");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// On-demand restore's hold, on a restored session whose big allocation is not loaded yet:
/// with [`PendingMemory`] installed, a copy out of it and a kernel launched on it wait until
/// the restore has loaded it, and then see what was loaded; the restore is told which range
/// each waits for; calls on loaded memory run meanwhile. A restore that gives up fails the
/// calls it held.
#[test]
fn a_call_on_memory_not_yet_restored_waits_for_it() {
    use std::sync::mpsc;
    use std::time::Duration;
    let base = 0x4d00_0000_0000;
    let dir = tempfile::tempdir().unwrap();
    let s = session(base);
    let b = build(&s);
    s.checkpoint(dir.path(), meta(), Compression::None, false, &Progress::default(), &Bounds::default()).unwrap();
    drop(s);
    let (r, _, _) = restore(dir.path(), base).unwrap();
    // What a restore that serves first and copies afterwards has before the big allocation
    // comes: the allocation, but not its contents.
    let big_len = 5u64 << 20;
    r.backend().memset(b.big, 0, big_len, None).unwrap();
    let image = Image::open(dir.path()).unwrap();
    let pending = Arc::new(PendingMemory::new(image.manifest.memory.iter().map(|m| (m.addr, m.size))));
    for m in image.manifest.memory.iter().filter(|m| m.addr != b.big) {
        pending.loaded(m.addr, m.size);
    }
    let installed = r.install_hook(pending.clone(), &within()).unwrap();
    std::thread::scope(|scope| {
        let r = &r;
        let (read_tx, read_rx) = mpsc::channel();
        scope.spawn(move || read_tx.send(read(r, b.big + (1 << 20), 4096)).unwrap());
        wanted(&pending, (b.big + (1 << 20), 4096));
        let (launch_tx, launch_rx) = mpsc::channel();
        scope.spawn(move || {
            launch(r, b.function, b.stream, b.big, 32);
            launch_tx.send(()).unwrap();
        });
        // The oldest wait first; the kernel waits for the whole allocation it is given.
        pending.loaded(b.big + (1 << 20), 4096);
        wanted(&pending, (b.big, 1 << 20));
        // Loaded memory serves meanwhile.
        assert_eq!(read(r, b.small, 16), vec![7u8; 16]);
        assert!(launch_rx.recv_timeout(Duration::from_millis(200)).is_err(), "the kernel ran on unloaded memory");
        // The copy out of the part loaded got what was there: the restore had not written it.
        assert_eq!(read_rx.recv_timeout(Duration::from_secs(10)).unwrap(), vec![0u8; 4096]);
        // The restore loads the rest: the kernel runs on the loaded contents.
        r.backend().memcpy_htod(b.big, &b.big_data[..3 << 20], None).unwrap();
        pending.loaded(b.big, big_len);
        launch_rx.recv_timeout(Duration::from_secs(10)).expect("the kernel still waits");
    });
    let first = u32::from_le_bytes(b.big_data[..4].try_into().unwrap());
    assert_eq!(read(&r, b.big, 4), (first.wrapping_add(9)).to_le_bytes(), "the kernel ran on what was loaded");
    drop(installed);

    // A restore that gives up: the call it held fails, and says so to the guest.
    let pending = Arc::new(PendingMemory::new([(b.small, 4096)]));
    let _installed = r.install_hook(pending.clone(), &within()).unwrap();
    std::thread::scope(|scope| {
        let r = &r;
        let held = scope.spawn(move || {
            let req = CudaMemsetRequest { devPtr: b.small, value: 0, count: 16 };
            dispatch(r, &CallCx::new(0), FunctionId::CudaMemset, &phos_protocol::encode(&req), &mut Vec::new())
        });
        wanted(&pending, (b.small, 16));
        pending.fail(phos_protocol::CudaError::Unknown);
        let r = held.join().unwrap();
        assert!(matches!(r, Err(phos_protocol::Rejection::Failed(phos_protocol::CudaError::Unknown))), "{r:?}");
    });
}

/// Memory of many chunks (random, zero and repetitive, regions not a multiple of the chunk)
/// goes out through the parallel copies into a directory and through the ordered copies
/// into a stream, and comes back the same from each: the directory read by several threads,
/// the stream in order. The directory's tables list every chunk in order of its place in
/// memory whatever order the threads stored them in, and its memory files (one per writer)
/// hold nothing but what the tables list.
#[test]
fn large_memory_comes_back_the_same_from_parallel_and_ordered_copies() {
    let base = 0x4c00_0000_0000;
    let s = session(base);
    let sizes = [(20 << 20) + 4096, 9 << 20, 17 << 20];
    let buffers: Vec<u64> = sizes.iter().map(|&size| call(&s, &CudaMallocRequest { size }).devPtr).collect();
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let random: Vec<u8> = (0..sizes[0])
        .map(|_| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed as u8
        })
        .collect();
    let repetitive: Vec<u8> = (0..sizes[2]).map(|i| (i % 251) as u8).collect();
    write(&s, buffers[0], &random);
    write(&s, buffers[2], &repetitive);
    let contents = [random, vec![0u8; sizes[1] as usize], repetitive];

    let compressed = tempfile::tempdir().unwrap();
    let raw = tempfile::tempdir().unwrap();
    let progress = Progress::default();
    let report =
        s.checkpoint(compressed.path(), meta(), Compression::Zstd(1), false, &progress, &Bounds::default()).unwrap();
    assert_eq!(progress.done(), progress.total());
    let raw_report = s.checkpoint(raw.path(), meta(), Compression::None, false, &progress, &Bounds::default()).unwrap();
    let (tx, rx) = std::os::unix::net::UnixStream::pair().unwrap();
    let receiver = std::thread::spawn(move || {
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(&mut &rx, &mut bytes).map(|_| bytes)
    });
    let mut sink = StreamWriter::new(&tx);
    s.checkpoint_to(&mut sink, meta(), Compression::None, false, &progress, &Bounds::default()).unwrap();
    drop(sink);
    drop(tx);
    let streamed = receiver.join().unwrap().unwrap();
    drop(s);

    for (dir, report) in [(compressed.path(), &report), (raw.path(), &raw_report)] {
        let image = Image::open(dir).unwrap();
        let mut stored = 0;
        for r in &image.manifest.memory {
            let offsets: Vec<u64> = r.chunks.iter().map(|c| c.offset).collect();
            assert!(offsets.windows(2).all(|w| w[0] < w[1]), "chunks out of order: {offsets:?}");
            stored += r.chunks.iter().map(|c| c.stored).sum::<u64>();
        }
        // A memory file per writer, each holding only its chunks.
        let files: Vec<u64> = (0..phos_checkpoint::MAX_MEMORY_FILES)
            .map_while(|i| std::fs::metadata(dir.join(phos_checkpoint::memory_file_name(i))).ok())
            .map(|m| m.len())
            .collect();
        let writers = std::thread::available_parallelism().map_or(1, |n| n.get().min(16));
        assert_eq!(files.len(), writers, "{files:?}");
        assert_eq!((files.iter().sum::<u64>(), report.stored_bytes), (stored, stored), "{files:?}");
    }
    assert!(report.stored_bytes < raw_report.stored_bytes, "{report:?} {raw_report:?}");
    assert!(raw_report.stored_bytes < raw_report.memory_bytes, "the zero buffer is not stored: {raw_report:?}");

    let check = |r: &Session| {
        for (addr, want) in buffers.iter().zip(&contents) {
            assert!(read(r, *addr, want.len() as u64) == *want, "memory at {addr:#x} differs");
        }
    };
    for dir in [compressed.path(), raw.path()] {
        let (r, _, summary) = restore(dir, base).unwrap();
        assert_eq!(summary.memory_bytes, sizes.iter().sum::<u64>(), "{summary:?}");
        check(&r);
    }
    let mut source = StreamReader::open(std::io::Cursor::new(streamed)).unwrap();
    let (r, _, _) =
        Session::restore_from(&mut source, &factory(base), None, &Progress::default(), &Cancel::default()).unwrap();
    check(&r);
}

/// Kernels for the concurrent checkpoints: `fill` stores `v` in every word of its buffer;
/// `through` stores `v` where the pointer held at `slot` (in device memory) points, a store
/// speculation cannot attribute.
const WRITERS_PTX: &str = r#".version 7.0
.target sm_70
.address_size 64

.visible .entry fill(.param .u64 data, .param .u32 n, .param .u32 v)
{
	.reg .pred %p<2>;
	.reg .b32 %r<6>;
	.reg .b64 %rd<5>;
	ld.param.u64 %rd1, [data];
	ld.param.u32 %r1, [n];
	ld.param.u32 %r2, [v];
	mov.u32 %r3, %tid.x;
	mov.u32 %r4, %ctaid.x;
	mov.u32 %r5, %ntid.x;
	mad.lo.s32 %r3, %r4, %r5, %r3;
	setp.ge.u32 %p1, %r3, %r1;
	@%p1 bra DONE;
	cvta.to.global.u64 %rd2, %rd1;
	mul.wide.u32 %rd3, %r3, 4;
	add.s64 %rd4, %rd2, %rd3;
	st.global.u32 [%rd4], %r2;
DONE:
	ret;
}

.visible .entry through(.param .u64 slot, .param .u32 v)
{
	.reg .b32 %r<2>;
	.reg .b64 %rd<3>;
	ld.param.u64 %rd1, [slot];
	ld.param.u32 %r1, [v];
	cvta.to.global.u64 %rd1, %rd1;
	ld.global.u64 %rd2, [%rd1];
	st.u32 [%rd2], %r1;
	ret;
}
"#;

/// A loaded [`WRITERS_PTX`]: (fill, through).
fn writers(s: &Session) -> (u64, u64) {
    let mut image = WRITERS_PTX.as_bytes().to_vec();
    image.push(0);
    let digest = Sha256::digest(&image);
    let module = call(s, &PhosModuleLoadRequest { image: &image, size: image.len() as u64, digest: &digest }).module;
    let fill = call(s, &PhosModuleGetFunctionRequest { module, name: "fill" }).function;
    let through = call(s, &PhosModuleGetFunctionRequest { module, name: "through" }).function;
    (fill, through)
}

fn launch_with(s: &Session, function: u64, threads: u32, params: &[u8]) {
    call(
        s,
        &PhosLaunchKernelRequest {
            function,
            grid: Dim3::new(threads.div_ceil(256), 1, 1),
            block: Dim3::new(256, 1, 1),
            sharedMem: 0,
            stream: 0,
            params,
            paramSize: params.len() as u64,
        },
    );
}

/// The value every word of the region at `addr` holds in the image at `dir` (it must hold one).
fn uniform_value(dir: &std::path::Path, addr: u64) -> u32 {
    let mut img = Image::open(dir).unwrap();
    let r = img.manifest.memory.iter().find(|r| r.addr == addr).unwrap().clone();
    let mut buf = Vec::new();
    let mut value = None;
    for c in &r.chunks {
        img.read_chunk(c, &mut buf).unwrap();
        for w in buf.chunks_exact(4) {
            let v = u32::from_le_bytes(w.try_into().unwrap());
            assert_eq!(v, *value.get_or_insert(v), "region {addr:#x} is torn in the image");
        }
    }
    value.unwrap_or(0)
}

fn concurrently() -> phos_api_server::checkpoint::How {
    phos_api_server::checkpoint::How {
        mode: phos_checkpoint::report::CheckpointMode::CopyOnWrite,
        stop: false,
        park: false,
        reserve: None,
    }
}

/// A copy-on-write checkpoint while the session keeps rewriting its memory is the session at
/// one point between its calls. The writer writes version v into its buffers in one order
/// (the last by address first, which the copy takes last), a kernel into the last one: at
/// any point between calls the buffers, in that order, hold v up to some buffer and v - 1
/// after it. A copy that let writes through would show later versions in buffers copied
/// later.
#[test]
fn a_copy_on_write_checkpoint_is_the_session_at_one_point_while_it_runs() {
    let summary = rewritten_during_copy_on_write(0x4e00_0000_0000, None);
    assert!(summary.extra_bytes > 0, "no buffer was copied ahead of a write: the test did not test ({summary:?})");
}

/// Without a copy-on-write reserve, a call that writes memory not yet copied waits until the
/// copy has taken it; the image is as right.
#[test]
fn without_a_reserve_writers_wait_for_the_copy() {
    let summary = rewritten_during_copy_on_write(0x5100_0000_0000, Some(0));
    assert_eq!(summary.extra_bytes, 0, "{summary:?}");
    assert!(summary.held_ms > 0.0, "no call waited for the copy: the test did not test ({summary:?})");
}

/// A copy-on-write checkpoint with `reserve` bytes of reserve while a writer rewrites the
/// session's memory; the image must be the session between two of the writer's calls.
fn rewritten_during_copy_on_write(base: u64, reserve: Option<u64>) -> phos_control::CheckpointSummary {
    let s = Arc::new(session(base));
    let (fill, _) = writers(&s);
    let mut order: Vec<u64> = (0..12).map(|_| call(&s, &CudaMallocRequest { size: 4 << 20 }).devPtr).collect();
    order.sort_unstable_by(|a, b| b.cmp(a));
    let small = call(&s, &CudaMallocRequest { size: 4096 }).devPtr;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let versions = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let writer = {
        let (s, order, stop, versions) = (s.clone(), order.clone(), stop.clone(), versions.clone());
        std::thread::spawn(move || {
            let mut v = 0u32;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) || v < 3 {
                v += 1;
                for &a in &order {
                    call(&s, &CudaMemsetAsyncRequest { devPtr: a, value: (v % 256) as i32, count: 4 << 20, stream: 0 });
                }
                let mut params = small.to_le_bytes().to_vec();
                params.extend_from_slice(&1024u32.to_le_bytes());
                params.extend_from_slice(&(v % 256 * 0x0101_0101).to_le_bytes());
                launch_with(&s, fill, 1024, &params);
                versions.store(v, std::sync::atomic::Ordering::Relaxed);
            }
        })
    };
    while versions.load(std::sync::atomic::Ordering::Relaxed) < 2 {
        std::thread::yield_now();
    }
    let dir = tempfile::tempdir().unwrap();
    let how = phos_api_server::checkpoint::How { reserve, ..concurrently() };
    let summary = s.checkpoint_as(dir.path(), meta(), Compression::None, how, &Progress::default(), &Bounds::default());
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    writer.join().unwrap();
    let summary = summary.unwrap();
    assert_eq!(summary.mode, "copy-on-write");
    assert_eq!(summary.fallback, None);
    let mut in_order: Vec<u32> = order.iter().map(|&a| uniform_value(dir.path(), a) & 0xff).collect();
    in_order.push(uniform_value(dir.path(), small) & 0xff);
    let first = in_order[0];
    let consistent = in_order.iter().all(|&v| v == first || v == (first + 255) % 256)
        && in_order.windows(2).all(|w| w[0] == w[1] || w[1] == (w[0] + 255) % 256);
    assert!(consistent, "the image is no state between the writer's calls: {in_order:?}");
    summary
}

/// A kernel that stores through a pointer it loads from device memory writes what no
/// speculation of its launch names: during a copy-on-write checkpoint its checked twin runs,
/// flags the store, and the checkpoint is taken again stop-the-world, whose image has the
/// kernel's store (or not) whole.
#[test]
fn a_store_speculation_missed_is_caught_and_the_checkpoint_taken_again() {
    caught_and_taken_again(0x4f00_0000_0000, concurrently());
}

/// The same during a recopy checkpoint, whose launches are validated too.
#[test]
fn a_store_speculation_missed_during_a_recopy_is_caught() {
    let recopy =
        phos_api_server::checkpoint::How { mode: phos_checkpoint::report::CheckpointMode::Recopy, ..concurrently() };
    caught_and_taken_again(0x5000_0000_0000, recopy);
}

fn caught_and_taken_again(base: u64, how: phos_api_server::checkpoint::How) {
    let s = Arc::new(session(base));
    let (_, through) = writers(&s);
    // Memory the copy takes a while over, so that the kernel runs during it.
    let bulk: Vec<u64> = (0..8).map(|_| call(&s, &CudaMallocRequest { size: 4 << 20 }).devPtr).collect();
    for &b in &bulk {
        call(&s, &CudaMemsetAsyncRequest { devPtr: b, value: 3, count: 4 << 20, stream: 0 });
    }
    let target = call(&s, &CudaMallocRequest { size: 4 }).devPtr;
    let slot = call(&s, &CudaMallocRequest { size: 8 }).devPtr;
    write(&s, slot, &target.to_le_bytes());
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let launched = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let writer = {
        let (s, stop, launched) = (s.clone(), stop.clone(), launched.clone());
        std::thread::spawn(move || {
            let mut v = 0u32;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                v += 1;
                let mut params = slot.to_le_bytes().to_vec();
                params.extend_from_slice(&v.to_le_bytes());
                launch_with(&s, through, 1, &params);
                launched.store(v, std::sync::atomic::Ordering::Relaxed);
            }
            v
        })
    };
    while launched.load(std::sync::atomic::Ordering::Relaxed) < 2 {
        std::thread::yield_now();
    }
    let dir = tempfile::tempdir().unwrap();
    let summary = s.checkpoint_as(dir.path(), meta(), Compression::None, how, &Progress::default(), &Bounds::default());
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let last = writer.join().unwrap();
    let summary = summary.unwrap();
    let why = summary.fallback.clone().unwrap_or_default();
    assert!(why.contains(&format!("wrote {target:#x}")), "the miss was not caught: {summary:?}");
    assert_eq!(summary.mode, "stop-the-world");
    let stored = uniform_value(dir.path(), target);
    assert!((1..=last).contains(&stored), "the image holds {stored}, no value the kernel stored (1..={last})");
    // After the checkpoint the original kernel runs again, and its stores land.
    let mut params = slot.to_le_bytes().to_vec();
    params.extend_from_slice(&777u32.to_le_bytes());
    launch_with(&s, through, 1, &params);
    assert_eq!(read(&s, target, 4), 777u32.to_le_bytes());
}

/// On-demand restore, in process: the session is served before its memory is loaded (the
/// load slowed down); a call reading memory not yet loaded waits for it and sees the image's
/// bytes; a kernel runs on what it reaches; freeing an allocation or unloading a module waits
/// for the memory that goes with it (the loader would otherwise write into memory that is
/// gone: on emu, a fault of the server itself), and the load ends without an error.
#[test]
fn an_on_demand_restore_holds_calls_until_their_memory_is_in() {
    let base = 0x5200_0000_0000;
    let dir = tempfile::tempdir().unwrap();
    let s = session(base);
    let b = build(&s);
    s.checkpoint(dir.path(), meta(), Compression::None, false, &Progress::default(), &Bounds::default()).unwrap();
    drop(s);
    let progress = Arc::new(Progress::default());
    let pace = std::time::Duration::from_millis(150);
    let (r, _, summary, status) =
        Session::restore_on_demand(dir.path(), &factory(base), None, &progress, &Cancel::default(), pace).unwrap();
    assert!(summary.on_demand && summary.copy_ms == 0.0, "{summary:?}");
    assert!(status.report().loaded_ms.is_none(), "served before its memory was loaded");
    // First thing, the allocation that is first in the image goes (it has blocks of its
    // own, which the free unmaps).
    call(&r, &CudaFreeRequest { devPtr: b.big });
    assert!(status.report().held_calls >= 1, "{:?}", status.report());
    assert_eq!(read(&r, b.freed_then_live, 100), [1u8; 100]);
    launch(&r, b.function, b.stream, b.small, 32);
    let counter = u32::from_le_bytes(read(&r, b.small, 4).try_into().unwrap());
    assert_eq!(counter, u32::from_le_bytes([7; 4]) + 9, "the kernel ran on the image's memory and variable");
    call(&r, &PhosModuleUnloadRequest { module: b.module });
    let report = status.report();
    assert!(report.loaded_ms.is_some() && report.failed.is_none(), "{report:?}");
    assert_eq!((report.done, report.total), (summary.memory_bytes, summary.memory_bytes));
}

/// A migration's sink that keeps what it is sent (as the target does), notes which pieces
/// came in which pass, and, once each pass before the held one has read all it copies,
/// launches `bump` on a few words of a block of `buffer` (a launch names its whole
/// allocation as written, since which words a kernel writes is not known before it runs).
struct Rewriting<'a> {
    session: &'a Session,
    progress: &'a Progress,
    function: u64,
    buffer: u64,
    /// The buffer as the session has it: each launch adds the counter (5) to its words.
    expected: Vec<u8>,
    /// What the target would hold of the buffer.
    received: Vec<u8>,
    /// Pieces of the buffer received: (pass, offset, length).
    pieces: Vec<(u32, u64, u64)>,
    launches: u32,
}

impl phos_checkpoint::engine::RecopySink for Rewriting<'_> {
    fn piece(&mut self, region: &phos_checkpoint::MemoryRegion, offset: u64, bytes: &[u8]) -> Result<(), CrError> {
        let pass = self.progress.pass.load(std::sync::atomic::Ordering::Relaxed);
        if region.addr == self.buffer {
            let at = offset as usize;
            self.received[at..at + bytes.len()].copy_from_slice(bytes);
            self.pieces.push((pass, offset, bytes.len() as u64));
        }
        // The pass's last piece: every copy of the pass has been read from the device.
        let last = self.progress.done() + bytes.len() as u64 == self.progress.total();
        if last && !self.progress.held.load(std::sync::atomic::Ordering::Relaxed) && self.launches < 6 {
            // A block in another 8 MiB piece each time, at an offset inside the block.
            let block = phos_checkpoint::piece_hash::HASH_BLOCK;
            let at = (self.launches as u64 % 3) * (8 << 20) + (5 + self.launches as u64) * block + 40;
            launch(self.session, self.function, 0, self.buffer + at, 8);
            for w in self.expected[at as usize..at as usize + 32].chunks_exact_mut(4) {
                let v = u32::from_le_bytes(w.try_into().unwrap()) + 5;
                w.copy_from_slice(&v.to_le_bytes());
            }
            self.launches += 1;
        }
        Ok(())
    }

    fn end(&mut self, _head: &phos_checkpoint::Manifest) -> Result<phos_checkpoint::ImageSummary, CrError> {
        Ok(phos_checkpoint::ImageSummary { manifest_bytes: 0, memory_bytes: 0, stored_bytes: 0 })
    }
}

/// The exact held pass: a kernel rewriting a few words of a 24 MiB allocation has the dirty
/// log name all of it, but each pass after the first sends only the block whose contents
/// hash differently on the device from what was sent, and the target ends with the
/// session's bytes.
#[test]
fn the_held_pass_sends_only_the_blocks_that_changed() {
    let s = session(0x5400_0000_0000);
    let mut image = PTX.as_bytes().to_vec();
    image.push(0);
    let digest = Sha256::digest(&image);
    let module = call(&s, &PhosModuleLoadRequest { image: &image, size: image.len() as u64, digest: &digest }).module;
    let function = call(&s, &PhosModuleGetFunctionRequest { module, name: "bump" }).function;
    let size = 24u64 << 20;
    let buffer = call(&s, &CudaMallocRequest { size }).devPtr;
    let data: Vec<u8> = (0..size as u32).map(|i| (i.wrapping_mul(2654435761) >> 24) as u8).collect();
    write(&s, buffer, &data);
    let progress = Progress::default();
    let mut sink = Rewriting {
        session: &s,
        progress: &progress,
        function,
        buffer,
        expected: data.clone(),
        received: vec![0; size as usize],
        pieces: Vec::new(),
        launches: 0,
    };
    let (summary, passes) = s.migrate_out(&mut sink, meta(), &progress, &Bounds::default()).unwrap();
    assert!(sink.launches >= 2, "the rounds did not run ({passes:?})");
    assert!(sink.received == sink.expected, "the target's copy is not the session's memory");
    let block = phos_checkpoint::piece_hash::HASH_BLOCK;
    let held = passes.last().unwrap();
    let held_pass = progress.pass.load(std::sync::atomic::Ordering::Relaxed);
    let sent_held: Vec<_> = sink.pieces.iter().filter(|p| p.0 == held_pass).collect();
    // The last launch (in the last round) wrote one block: only it goes again.
    let last = sink.launches as u64 - 1;
    let at = (last % 3) * (8 << 20) + (5 + last) * block;
    assert_eq!(sent_held, vec![&(held_pass, at, block)], "{passes:?}");
    assert_eq!(held.dirty_bytes, size, "the launch did not name its whole allocation ({passes:?})");
    assert_eq!(held.copied_bytes, block, "{passes:?}");
    assert_eq!(held.skipped_pieces, size / block - 1, "{passes:?}");
    assert_eq!(held.skipped_bytes, size - block, "{passes:?}");
    // The rounds too sent one block each.
    for (i, p) in passes.iter().enumerate().skip(1) {
        assert_eq!(p.copied_bytes, block, "pass {i}: {passes:?}");
    }
    assert!(summary.skipped_pieces >= 2 * (size / block - 1), "{summary:?}");
}

/// The GPU's hash kernel (its PTX, run here by the emulator's interpreter) computes the
/// host's function: blocks of any length, at any alignment, one warp each, more blocks than
/// the grid has warps at once.
#[test]
fn the_hash_kernel_computes_the_hosts_function() {
    use phos_checkpoint::piece_hash::block_hash;
    let s = session(0x5480_0000_0000);
    let mut image = phos_api_server::backend::cuda_hash::PTX.as_bytes().to_vec();
    image.push(0);
    let digest = Sha256::digest(&image);
    let module = call(&s, &PhosModuleLoadRequest { image: &image, size: image.len() as u64, digest: &digest }).module;
    let kernel = phos_api_server::backend::cuda_hash::KERNEL;
    let function = call(&s, &PhosModuleGetFunctionRequest { module, name: kernel }).function;
    let size = 1u64 << 20;
    let data: Vec<u8> = (0..size as u32).map(|i| (i.wrapping_mul(2654435761) >> 21) as u8).collect();
    let buf = call(&s, &CudaMallocRequest { size }).devPtr;
    write(&s, buf, &data);
    let mut blocks: Vec<(u64, u64)> = vec![(0, 16 << 10), (3, 100), (8, 5), (16, 0), (1, 7), (65536, 65536 + 13)];
    blocks.extend((0..40).map(|i| (4096 * i + (i % 8), 1000 + 37 * i)));
    let table: Vec<u8> = blocks.iter().flat_map(|&(at, len)| [buf + at, len]).flat_map(u64::to_le_bytes).collect();
    let table_at = call(&s, &CudaMallocRequest { size: table.len() as u64 }).devPtr;
    write(&s, table_at, &table);
    let out = call(&s, &CudaMallocRequest { size: 8 * blocks.len() as u64 }).devPtr;
    let mut params = Vec::new();
    for v in [table_at, blocks.len() as u64, out] {
        params.extend_from_slice(&v.to_le_bytes());
    }
    // Two blocks of 64 threads: four warps for 46 hash blocks.
    call(
        &s,
        &PhosLaunchKernelRequest {
            function,
            grid: Dim3::new(2, 1, 1),
            block: Dim3::new(64, 1, 1),
            sharedMem: 0,
            stream: 0,
            params: &params,
            paramSize: params.len() as u64,
        },
    );
    let got: Vec<u64> = read(&s, out, 8 * blocks.len() as u64)
        .chunks_exact(8)
        .map(|w| u64::from_le_bytes(w.try_into().unwrap()))
        .collect();
    let want: Vec<u64> = blocks.iter().map(|&(at, len)| block_hash(&data[at as usize..(at + len) as usize])).collect();
    assert_eq!(got, want);
    // The backend's own hashes (on emu, the host's function) agree.
    let ranges: Vec<(u64, u64)> = blocks.iter().map(|&(at, len)| (buf + at, len)).collect();
    assert_eq!(s.backend().hash_blocks(0, &ranges).unwrap(), want);
}
